/* attention: causal attention over the paged KV cache on the CPU.
 * GQA (GLM-4.5): head h reads KV head h / (H / Hkv); cache row [k | v].
 * MLA (GLM-5), absorbed form (decode): the cache holds the normed latent c [C] and the
 * roped k_pe [Dr]; per head, q_nope is absorbed through W_UK (rows 0..Dn of the head's block of
 * kv_b_proj), scores are (q_abs . c + q_pe . k_pe) * scale, the output latent is expanded
 * through W_UV (rows Dn..Dn+Dv). Softmax in float32 with the maximum subtracted. The cache is
 * read in its dtype and converted to float32 a row at a time (cpu_kv_row; FP8: GQA k with
 * k_scale, v with v_scale, the MLA row with k_scale).
 * MLA expanded form (prefill, model/mla.c): kv_gather_cpu decodes a piece of a sequence's cache
 * rows, kv_b_proj expands them (a GEMM), attention_mla_piece_cpu folds the piece into each
 * query's online softmax (running max and sum, accumulator rescaled). */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* p[0..n) = softmax(z[0..n)) in place */
static void softmax_inplace(float *z, int n)
{
    float mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < n; j++) sum += (z[j] = expf(z[j] - mx));
    float inv = 1.0f / sum;
    for (int j = 0; j < n; j++) z[j] *= inv;
}

void attention_gqa_cpu(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                       const ModelConfig *c)
{
    int H = c->n_heads, Hkv = c->n_kv_heads, Dh = c->head_dim, T = b->n_tokens;
    int group = H / Hkv, W = kv->kv_width, bs = kv->block_size;
    float scale = c->attn_scale;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(be->n_threads)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int s = b->seq[t], n = b->pos[t] + 1, kh = h / group;
            float *z = cpu_scratch(7, (size_t)n * sizeof(float));
            float *buf = cpu_scratch(6, (size_t)Dh * sizeof(float)); /* a decoded k or v row */
            const float *qh = q + ((int64_t)t * H + h) * Dh;
            for (int j = 0; j < n; j++) {
                const float *k = cpu_kv_row(kv->kv, kv->dtype, kv->k_scale, cpu_slot(b, s, j, bs), W, kh * Dh, Dh, buf);
                z[j] = cpu_dot(qh, k, Dh) * scale;
            }
            softmax_inplace(z, n);
            float *o = out + ((int64_t)t * H + h) * Dh;
            memset(o, 0, Dh * sizeof(float));
            for (int j = 0; j < n; j++) {
                const float *v = cpu_kv_row(kv->kv, kv->dtype, kv->v_scale, cpu_slot(b, s, j, bs), W, (Hkv + kh) * Dh,
                                            Dh, buf);
                for (int d = 0; d < Dh; d++) o[d] += z[j] * v[d];
            }
        }
}

void attention_mla_cpu(Backend *be, float *out, const float *q, const KVLayer *kv,
                       const QTensor *wkv_b, const int *topk, int ktop, const Batch *b,
                       const ModelConfig *c)
{
    int H = c->n_heads, C = c->kv_lora_rank, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim;
    int Dv = c->v_head_dim, T = b->n_tokens, W = kv->kv_width, bs = kv->block_size;
    int Dq = Dn + Dr, max_ctx = 0;
    for (int t = 0; t < T; t++) max_ctx = b->pos[t] + 1 > max_ctx ? b->pos[t] + 1 : max_ctx;
    float scale = c->attn_scale;
    /* one head per thread: its rows of kv_b_proj are decoded once for the whole batch */
#pragma omp parallel for schedule(dynamic) num_threads(be->n_threads)
    for (int h = 0; h < H; h++) {
        size_t need = ((size_t)(Dn + Dv) * C + 2 * C + max_ctx) * sizeof(float) + max_ctx * sizeof(int);
        float *wh = cpu_scratch(7, need);          /* [Dn + Dv, C] this head's kv_b rows */
        float *qa = wh + (size_t)(Dn + Dv) * C;    /* [C] absorbed query */
        float *ol = qa + C;                        /* [C] output latent */
        float *z = ol + C;                         /* [n] scores */
        int *keys = (int *)(z + max_ctx);          /* [n] positions attended */
        float *buf = cpu_scratch(6, (size_t)W * sizeof(float)); /* a decoded cache row */
        for (int r = 0; r < Dn + Dv; r++) qtensor_decode(wkv_b, (int64_t)h * (Dn + Dv) + r, 0, C, wh + (size_t)r * C);
        for (int t = 0; t < T; t++) {
            int s = b->seq[t], n = 0;
            if (topk) {
                for (int k = 0; k < ktop; k++)
                    if (topk[(int64_t)t * ktop + k] >= 0) keys[n++] = topk[(int64_t)t * ktop + k];
            } else {
                for (int j = 0; j <= b->pos[t]; j++) keys[n++] = j;
            }
            const float *qn = q + ((int64_t)t * H + h) * Dq, *qp = qn + Dn;
            /* q_abs[c] = sum_d q_nope[d] W_UK[d][c] */
            memset(qa, 0, C * sizeof(float));
            for (int d = 0; d < Dn; d++) {
                const float *wr = wh + (size_t)d * C;
                float qd = qn[d];
                for (int i = 0; i < C; i++) qa[i] += qd * wr[i];
            }
            for (int j = 0; j < n; j++) {
                int64_t slot = cpu_slot(b, s, keys[j], bs);
                const float *row = cpu_kv_row(kv->kv, kv->dtype, kv->k_scale, slot, W, 0, W, buf);
                z[j] = (cpu_dot(qa, row, C) + cpu_dot(qp, row + C, Dr)) * scale;
            }
            softmax_inplace(z, n);
            memset(ol, 0, C * sizeof(float));
            for (int j = 0; j < n; j++) {
                int64_t slot = cpu_slot(b, s, keys[j], bs);
                const float *row = cpu_kv_row(kv->kv, kv->dtype, kv->k_scale, slot, W, 0, C, buf); /* the latent */
                for (int i = 0; i < C; i++) ol[i] += z[j] * row[i];
            }
            /* out_h[v] = sum_c W_UV[v][c] o_lat[c] */
            float *o = out + ((int64_t)t * H + h) * Dv;
            for (int v = 0; v < Dv; v++) o[v] = cpu_dot(wh + (size_t)(Dn + v) * C, ol, C);
        }
    }
}

void kv_gather_cpu(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                   const int *bt, int block_size, int j0, int rows)
{
    /* bt is one sequence's block-table row: a batch of that one sequence for cpu_slot */
    Batch one = {.block_table = (int *)bt, .bt_stride = 0};
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if ((int64_t)rows * n > 32768)
    for (int i = 0; i < rows; i++) {
        float *o = out + (int64_t)i * n;
        const float *row = cpu_kv_row(cache, dt, scale, cpu_slot(&one, 0, j0 + i, block_size), width, 0, n, o);
        if (row != o) memcpy(o, row, n * sizeof(float));
    }
}

void attention_mla_piece_cpu(Backend *be, float *out, float *st, const float *q, const float *kv,
                             const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                             int ktop, int first, int last, const Batch *b, const ModelConfig *c)
{
    int H = c->n_heads, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim, Dv = c->v_head_dim;
    int Dq = Dn + Dr, Dkv = Dn + Dv, N = H * Dkv;
    float scale = c->attn_scale;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(be->n_threads)
    for (int t = t0; t < t0 + nt; t++)
        for (int h = 0; h < H; h++) {
            float *z = cpu_scratch(7, (size_t)n * (sizeof(float) + sizeof(int)));
            int *keys = (int *)(z + n), nk = 0; /* piece rows (j - j0) this query attends to */
            if (topk) {
                for (int k = 0; k < ktop; k++) {
                    int j = topk[(int64_t)t * ktop + k];
                    if (j >= j0 && j < j0 + n) keys[nk++] = j - j0;
                }
            } else {
                for (int j = j0; j < j0 + n && j <= b->pos[t]; j++) keys[nk++] = j - j0;
            }
            const float *qn = q + ((int64_t)t * H + h) * Dq, *qp = qn + Dn;
            float *o = out + ((int64_t)t * H + h) * Dv, *mls = st + ((int64_t)t * H + h) * 2;
            if (first) {
                mls[0] = -INFINITY;
                mls[1] = 0;
                memset(o, 0, Dv * sizeof(float));
            }
            float mx = mls[0];
            for (int i = 0; i < nk; i++) {
                const float *k = kv + (int64_t)keys[i] * N + (int64_t)h * Dkv;
                z[i] = (cpu_dot(qn, k, Dn) + cpu_dot(qp, kpe + (int64_t)keys[i] * ldk, Dr)) * scale;
                mx = z[i] > mx ? z[i] : mx;
            }
            if (nk > 0) {
                /* rescale what the earlier pieces accumulated to the new maximum */
                float corr = mls[0] == -INFINITY ? 0.0f : expf(mls[0] - mx), sum = 0;
                for (int d = 0; d < Dv; d++) o[d] *= corr;
                for (int i = 0; i < nk; i++) {
                    float p = expf(z[i] - mx);
                    const float *v = kv + (int64_t)keys[i] * N + (int64_t)h * Dkv + Dn;
                    sum += p;
                    for (int d = 0; d < Dv; d++) o[d] += p * v[d];
                }
                mls[0] = mx;
                mls[1] = mls[1] * corr + sum;
            }
            if (last) {
                float inv = mls[1] > 0 ? 1.0f / mls[1] : 0.0f;
                for (int d = 0; d < Dv; d++) o[d] *= inv;
            }
        }
}
