/* sampling_params: the knobs of drawing tokens as a request (OpenAI's and vLLM's fields) or a
 * model's generation_config.json states them, their defaults and their valid ranges. The sampler
 * that applies them is engine/sampler.h. */
#ifndef MOESERVE_SAMPLING_PARAMS_H
#define MOESERVE_SAMPLING_PARAMS_H

#include <stdint.h>

#include "../base/opt.h"

#define SAMPLER_MAX_LOGPROBS 20
#define SAMPLER_MAX_BIAS 1024   /* logit_bias entries a request may give */

typedef struct {
    float temperature;         /* 0: greedy */
    int top_k;                 /* <= 0: off */
    float top_p;               /* 1: off */
    float min_p;               /* 0: off */
    float repetition_penalty;  /* 1: off */
    float frequency_penalty;   /* 0: off */
    float presence_penalty;    /* 0: off */
    int64_t seed;              /* < 0: drawn from the clock */
    int logprobs;              /* top alternatives to report (0..20); < 0: none */
    int n_bias;                /* logit_bias: bias_val[i] added to token bias_id[i]'s logit before
                                * the penalties' result is sampled (OpenAI's; -100 bans, +100 forces) */
    int bias_id[SAMPLER_MAX_BIAS];
    float bias_val[SAMPLER_MAX_BIAS];
} SamplingParams;

void sampling_params_default(SamplingParams *p);
/* NULL if valid, else a message naming the out-of-range field (for a 400 or a CLI error). */
const char *sampling_params_check(const SamplingParams *p);

/* The sampling options of a command line (generate's) into p: --temperature, --top-k, --top-p,
 * --min-p, the penalties, --seed. A caller that starts from a model's defaults overrides only
 * the fields opt_given says were given. */
OptGroup sampling_opt_group(SamplingParams *p);
/* An OPT_FN for a seed (an int64_t, >= 0). */
int sampling_take_seed(const char *v, void *dst, char *err, size_t errlen);

#endif
