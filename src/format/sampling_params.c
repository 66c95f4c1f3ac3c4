/* sampling_params: defaults and valid ranges (sampling_params.h). */
#include "sampling_params.h"

#include <stddef.h>

void sampling_params_default(SamplingParams *p)
{
    *p = (SamplingParams){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                          .repetition_penalty = 1.0f, .seed = -1, .logprobs = -1};
}

const char *sampling_params_check(const SamplingParams *p)
{
    if (!(p->temperature >= 0 && p->temperature <= 100)) return "temperature must be in [0, 100]";
    if (!(p->top_p > 0 && p->top_p <= 1)) return "top_p must be in (0, 1]";
    if (!(p->min_p >= 0 && p->min_p <= 1)) return "min_p must be in [0, 1]";
    if (p->top_k < -1) return "top_k must be -1, 0 (off) or positive";
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100)) return "repetition_penalty must be in (0, 100]";
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2)) return "frequency_penalty must be in [-2, 2]";
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2)) return "presence_penalty must be in [-2, 2]";
    if (p->logprobs > SAMPLER_MAX_LOGPROBS) return "top_logprobs must be at most 20";
    if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS) return "logit_bias may hold at most 1024 tokens";
    for (int i = 0; i < p->n_bias; i++)
        if (!(p->bias_val[i] >= -100 && p->bias_val[i] <= 100)) return "logit_bias values must be in [-100, 100]";
    return NULL;
}
