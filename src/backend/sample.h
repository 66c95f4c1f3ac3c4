/* sample: what drawing a token from one row of logits means, for every backend: SampleRow, the
 * row's knobs after the penalties, and sample_row, the reference definition (sample.c). */
#ifndef MOESERVE_SAMPLE_H
#define MOESERVE_SAMPLE_H

#include <stddef.h>

/* One row's sampling knobs after the penalties (the sampler's, engine/sampler.h), as the sample
 * op reads them: the row's token is a function of its logits and these alone. */
typedef struct {
    float temperature;   /* 0: greedy (argmax, ties to the lowest id) */
    int top_k;           /* <= 0 or >= V: off */
    float top_p;         /* >= 1: off */
    float min_p;         /* <= 0: off */
    float u;             /* uniform in [0, 1) from the request's generator; unused when greedy */
} SampleRow;

/* The definition of sampling, shared by the host sampler (engine/sampler.c) and the cpu's sample
 * op (cpu/sample.c); the CUDA op (cuda/sample.cu) must agree with it. Greedy: the largest logit, ties to the lowest id, NaN never wins.
 * No filter: a draw over the softmax at the temperature in id order. With filters: candidates
 * sorted by (logit desc, id asc), the top_k first, their softmax at the temperature; top-p keeps
 * the smallest prefix whose probability reaches top_p, min-p those with probability >= min_p
 * times the largest (at least one is kept); the draw is u times the kept mass, walked in sorted
 * order. work: sample_row_work(V) bytes. */
size_t sample_row_work(int V);
int sample_row(const float *logits, int V, const SampleRow *p, void *work);
/* The n largest logits in that order (value desc, id asc, NaN never) by a bounded selection
 * over the vocabulary: c [n]; returns how many (fewer than n when the rest are NaN). */
typedef struct { float v; int id; } SampleCand;
int sample_top_n(const float *logits, int V, int n, SampleCand *c);

#endif
