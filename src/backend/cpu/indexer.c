/* indexer: the DSA lightning indexer's scores and top-k on the CPU (transformers' GlmMoeDsaIndexer,
 * DeepSeek-V3.2-Exp's inference/model.py Indexer without its Hadamard and FP8 steps):
 * I(s,t) = sum_h w[s,h] Hi^-0.5 * relu(q[s,h] . k[t] * Di^-0.5) over cached keys t <= pos(s),
 * then the positions of the min(Ki, pos+1) best scores, ties to the lowest position, listed in
 * increasing position order and padded with -1. The keys are read in the cache dtype (FP8 with
 * scale 1) and converted to float32. */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"

typedef struct { float score; int pos; } Scored;

/* higher score first; equal scores: lower position first */
static int scored_cmp(const void *a, const void *b)
{
    const Scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->pos - y->pos;
}

static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

void indexer_cpu(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv,
                 const Batch *b, const ModelConfig *c)
{
    int Hi = c->index_n_heads, Di = c->index_head_dim, Ki = c->index_topk, T = b->n_tokens;
    int bs = kv->block_size, Wd = kv->idx_width;
    float kscale = 1.0f / sqrtf((float)Di), hscale = 1.0f / sqrtf((float)Hi);
#pragma omp parallel for schedule(dynamic) num_threads(be->n_threads)
    for (int t = 0; t < T; t++) {
        int s = b->seq[t], n = b->pos[t] + 1;
        int *out = topk + (int64_t)t * Ki;
        if (n <= Ki) { /* every causal key is selected: no scoring needed */
            for (int k = 0; k < Ki; k++) out[k] = k < n ? k : -1;
            continue;
        }
        Scored *sc = cpu_scratch(7, (size_t)n * sizeof(Scored));
        float *buf = cpu_scratch(6, (size_t)Di * sizeof(float)); /* a decoded key */
        const float *qt = q + (int64_t)t * Hi * Di, *wt = w + (int64_t)t * Hi;
        for (int j = 0; j < n; j++) {
            const float *k = cpu_kv_row(kv->idx, kv->dtype, 1.0f, cpu_slot(b, s, j, bs), Wd, 0, Di, buf);
            float acc = 0;
            for (int h = 0; h < Hi; h++) {
                float d = cpu_dot(qt + (int64_t)h * Di, k, Di) * kscale;
                acc += (wt[h] * hscale) * (d > 0 ? d : 0);
            }
            sc[j].score = acc;
            sc[j].pos = j;
        }
        qsort(sc, n, sizeof *sc, scored_cmp);
        for (int k = 0; k < Ki; k++) out[k] = sc[k].pos;
        qsort(out, Ki, sizeof(int), int_cmp);
    }
}
