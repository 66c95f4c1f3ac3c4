/* sampler: choosing the next token from logits, as vLLM and the OpenAI API define the knobs:
 * repetition penalty (prompt and output tokens: positive logits divided, negative multiplied),
 * frequency and presence penalties (output tokens), temperature (0 = greedy, ties to the
 * lowest id), top-k, top-p, min-p, and a per-request seeded generator so that a seed
 * reproduces the same tokens. Log-probabilities are those of the model's distribution (the
 * raw logits' log-softmax), with the top alternatives on request. */
#ifndef MOESERVE_SAMPLER_H
#define MOESERVE_SAMPLER_H

#include <stdint.h>

#include "../backend/sample.h"
#include "../base/util.h"
#include "../format/sampling_params.h"


typedef struct {
    int token;
    float logprob;                        /* of the chosen token, when logprobs >= 0 */
    int n_top;
    int top_ids[SAMPLER_MAX_LOGPROBS];
    float top_logprobs[SAMPLER_MAX_LOGPROBS];
} SampleResult;

/* One sequence's sampling state: its parameters, generator and token counts. */
typedef struct {
    SamplingParams p;
    Rng rng;
    int vocab;
    /* open-addressing map token -> (count in output, seen in prompt) */
    int *keys;                 /* [cap], -1 empty */
    int *out_count;            /* [cap] */
    unsigned char *in_prompt;  /* [cap] */
    int cap, used;
    void *work;                /* grow-only scratch: candidates and a copy of the logits */
    size_t work_cap;
} Sampler;

void sampler_init(Sampler *s, const SamplingParams *p, int vocab, const int *prompt, int n_prompt);
void sampler_free(Sampler *s);
/* Sample from logits [vocab] (modified in place: penalties, temperature, filters). */
int sampler_sample(Sampler *s, float *logits, SampleResult *res);
/* A token chosen by the caller instead of sampled (serve --script-output): its log-probability
 * and the top alternatives of the model's distribution, as sampler_sample reports them. */
void sampler_score(const Sampler *s, const float *logits, int token, SampleResult *res);
/* 1 if the next token is plain argmax of the logits (temperature 0, no penalties, no logprobs):
 * the engine then takes it from the backend's argmax and copies no logits. */
int sampler_is_argmax(const Sampler *s);
/* 1 if the next token depends on the logits alone (no penalties, no logit bias, no log-probabilities): the
 * engine then draws it with the backend's sample op, from sampler_row's parameters. */
int sampler_logits_only(const Sampler *s);
/* The parameters of the next draw after the penalties (SampleRow, backend.h). Takes the draw's
 * uniform from the generator when the temperature is > 0, exactly as sampler_sample would: call
 * it once per token, and only instead of sampler_sample. */
void sampler_row(Sampler *s, SampleRow *row);
/* Record a generated token (for the penalties). */
void sampler_accept(Sampler *s, int token);

#endif
