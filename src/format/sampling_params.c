/* sampling_params: defaults and valid ranges (sampling_params.h). */
#include "sampling_params.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

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

int sampling_take_seed(const char *v, void *dst, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 0) {
        snprintf(err, errlen, "'%s' is not a seed (an integer >= 0)", v);
        return -1;
    }
    *(int64_t *)dst = x;
    return 0;
}

OptGroup sampling_opt_group(SamplingParams *p)
{
    OPT_GROUP_RETURN("sampling",
        {.names = "--temperature", .type = OPT_FLOAT, .dst = &p->temperature, .metavar = "T", .help = "0: greedy",
         .def = "the model's generation_config.json, else 1", .lo = 0, .hi = 100},
        {.names = "--top-k", .type = OPT_INT, .dst = &p->top_k, .metavar = "K",
         .help = "the K most likely tokens (-1, 0: all)",
         .def = "the model's, else all", .lo = -1, .hi = 1 << 30},
        {.names = "--top-p", .type = OPT_FLOAT, .dst = &p->top_p, .metavar = "P", .help = "nucleus sampling",
         .def = "the model's, else 1", .lo = 1e-9, .hi = 1},
        {.names = "--min-p", .type = OPT_FLOAT, .dst = &p->min_p, .metavar = "P",
         .help = "tokens at least P times the most likely one's probability", .def = "0", .lo = 0, .hi = 1},
        {.names = "--repetition-penalty", .type = OPT_FLOAT, .dst = &p->repetition_penalty, .metavar = "R",
         .help = "divides the logits of tokens seen so far", .def = "the model's, else 1", .lo = 1e-3, .hi = 100},
        {.names = "--frequency-penalty", .type = OPT_FLOAT, .dst = &p->frequency_penalty, .metavar = "F",
         .help = "subtracted once per earlier occurrence", .def = "0", .lo = -2, .hi = 2},
        {.names = "--presence-penalty", .type = OPT_FLOAT, .dst = &p->presence_penalty, .metavar = "P",
         .help = "subtracted once from every token seen", .def = "0", .lo = -2, .hi = 2},
        {.names = "--seed", .type = OPT_FN, .dst = &p->seed, .metavar = "N", .help = "the sampler's seed",
         .def = "from the clock", .fn = sampling_take_seed});
}
