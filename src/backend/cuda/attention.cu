/* attention: causal attention over the paged KV cache on the GPU, one block per (token, head),
 * keys taken a chunk at a time with an online softmax (running max and sum, the accumulator
 * rescaled), so any context length works. Twins of attention_gqa_cpu and attention_mla_cpu.
 * GQA (GLM-4.5): thread d owns output dim d. MLA (GLM-5), absorbed form (§1.5.3): q_nope is
 * absorbed through W_UK into the latent space, scores against the cached latent and roped
 * k_pe, the output latent expanded through W_UV; the keys are the indexer's selection when
 * given. The cache is read in its dtype and converted per element (kv_elem_load: FP8 GQA k with
 * k_scale, v with v_scale, the MLA row with k_scale), as the CPU twins do. A correct first
 * version: the expanded prefill form and the fast kernels come later. */
#include "common.cuh"

#define ATT_THREADS 256
#define MLA_MAX_C 1024

/* block (t, h): thread d < Dh owns out[t, h, d]; thread j scores key j0 + j of the chunk */
static __global__ void attention_gqa_kernel(float *out, const float *q, const void *cache, KVDtype dt, float ks,
                                            float vs, int W, int bs, const int *seq, const int *pos,
                                            const int *block_table, int bt_stride, int H, int Hkv, int Dh, float scale)
{
    __shared__ float qs[ATT_THREADS], sc[ATT_THREADS], red[32];
    __shared__ int sl[ATT_THREADS];
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, kh = h / (H / Hkv);
    int s = seq[t], n = pos[t] + 1;
    if (tid < Dh) qs[tid] = q[((int64_t)t * H + h) * Dh + tid];
    float m = -INFINITY, l = 0.f, acc = 0.f;
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        int j = j0 + tid;
        float z = -INFINITY;
        if (j < n) {
            int slot = batch_slot(block_table, bt_stride, s, j, bs);
            sl[tid] = slot;
            int64_t k0 = (int64_t)slot * W + kh * Dh;
            float d = 0.f;
            for (int i = 0; i < Dh; i++) d += qs[i] * kv_elem_load(cache, dt, k0 + i, ks);
            z = d * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = j < n ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        float psum = block_sum(p, red);
        float corr = expf(m - mnew);
        l = l * corr + psum;
        acc *= corr;
        m = mnew;
        __syncthreads();
        int cnt = min((int)blockDim.x, n - j0);
        if (tid < Dh)
            for (int jj = 0; jj < cnt; jj++)
                acc += sc[jj] * kv_elem_load(cache, dt, (int64_t)sl[jj] * W + (Hkv + kh) * Dh + tid, vs);
        __syncthreads();
    }
    if (tid < Dh) out[((int64_t)t * H + h) * Dh + tid] = acc / l;
}

void attention_gqa_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    if (c->head_dim > ATT_THREADS) die("attention_gqa_cuda: head_dim %d > %d", c->head_dim, ATT_THREADS);
    dim3 grid(b->n_tokens, c->n_heads);
    attention_gqa_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->v_scale, kv->kv_width, kv->block_size, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->n_kv_heads, c->head_dim, c->attn_scale);
    LAUNCH_CHECK("attention_gqa_kernel");
}

/* block (t, h). Phase 1: thread c computes q_abs[c] = sum_d q_nope[d] W_UK[d][c]. Phase 2: keys
 * a chunk at a time, thread j scores one key; thread owns latent dims c = tid + i * blockDim
 * of the output accumulator. Phase 3: thread v computes out[v] = sum_c W_UV[v][c] o_lat[c]. */
static __global__ void attention_mla_kernel(float *out, const float *q, const void *cache, KVDtype dt, float ks, int W,
                                            int bs, QTensor wkv_b,
                                            const int *topk, int ktop, const int *seq, const int *pos,
                                            const int *block_table, int bt_stride, int H, int C, int Dn, int Dr, int Dv,
                                            float scale)
{
    __shared__ float qa[MLA_MAX_C], ol[MLA_MAX_C], qp[64 * 4], sc[ATT_THREADS], red[32];
    __shared__ int sl[ATT_THREADS];
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int s = seq[t];
    const float *qn = q + ((int64_t)t * H + h) * (Dn + Dr);
    int64_t wrow = (int64_t)h * (Dn + Dv);
    for (int c = tid; c < C; c += nt) {
        float a = 0.f;
        for (int d = 0; d < Dn; d++) a += qn[d] * qt_elem(wkv_b, wrow + d, c);
        qa[c] = a;
    }
    for (int i = tid; i < Dr; i += nt) qp[i] = qn[Dn + i];
    int n = topk ? ktop : pos[t] + 1;
    float m = -INFINITY, l = 0.f, acc[MLA_MAX_C / ATT_THREADS];
    for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++) acc[i] = 0.f;
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += nt) {
        int j = j0 + tid;
        float z = -INFINITY;
        int key = -1;
        if (j < n) key = topk ? topk[(int64_t)t * ktop + j] : j;
        if (key >= 0) {
            int slot = batch_slot(block_table, bt_stride, s, key, bs);
            sl[tid] = slot;
            int64_t r0 = (int64_t)slot * W;
            float d1 = 0.f, d2 = 0.f;
            for (int i = 0; i < C; i++) d1 += qa[i] * kv_elem_load(cache, dt, r0 + i, ks);
            for (int i = 0; i < Dr; i++) d2 += qp[i] * kv_elem_load(cache, dt, r0 + C + i, ks);
            z = (d1 + d2) * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = key >= 0 ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        if (key < 0) sl[tid] = -1;
        float psum = block_sum(p, red);
        float corr = m == -INFINITY ? 0.f : expf(m - mnew);
        l = l * corr + psum;
        for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++) acc[i] *= corr;
        if (mnew != -INFINITY) m = mnew;
        __syncthreads();
        int cnt = min(nt, n - j0);
        for (int jj = 0; jj < cnt; jj++) {
            if (sl[jj] < 0) continue;
            int64_t r0 = (int64_t)sl[jj] * W;
#pragma unroll
            for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++)
                if (tid + i * nt < C) acc[i] += sc[jj] * kv_elem_load(cache, dt, r0 + tid + i * nt, ks);
        }
        __syncthreads();
    }
    for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++)
        if (tid + i * nt < C) ol[tid + i * nt] = acc[i] / l;
    __syncthreads();
    for (int v = tid; v < Dv; v += nt) {
        float a = 0.f;
        for (int c = 0; c < C; c++) a += qt_elem(wkv_b, wrow + Dn + v, c) * ol[c];
        out[((int64_t)t * H + h) * Dv + v] = a;
    }
}

void attention_mla_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    if (c->kv_lora_rank > MLA_MAX_C || c->qk_rope_dim > 256)
        die("attention_mla_cuda: kv_lora_rank %d / rope dim %d exceed the kernel's limits", c->kv_lora_rank, c->qk_rope_dim);
    dim3 grid(b->n_tokens, c->n_heads);
    attention_mla_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, *wkv_b, topk, ktop, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim,
        c->attn_scale);
    LAUNCH_CHECK("attention_mla_kernel");
}
