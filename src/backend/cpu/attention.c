/* attention: causal attention over the paged KV cache on the CPU.
 * GQA (GLM-4.5, §2.2): head h reads KV head h / (H / Hkv); cache row [k | v].
 * MLA (GLM-5, §1.5.3), absorbed form: the cache holds the normed latent c [C] and the roped
 * k_pe [Dr]; per head, q_nope is absorbed through W_UK (rows 0..Dn of the head's block of
 * kv_b_proj), scores are (q_abs . c + q_pe . k_pe) * scale, the output latent is expanded
 * through W_UV (rows Dn..Dn+Dv). Softmax in float32 with the maximum subtracted. The cache is
 * read in its dtype and converted to float32 a row at a time (cpu_kv_row; FP8: GQA k with
 * k_scale, v with v_scale, the MLA row with k_scale). */
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
