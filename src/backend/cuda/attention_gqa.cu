/* attention_gqa: causal grouped-query attention over the paged KV cache on the GPU (GLM-4.5), the
 * twin of attention_gqa_cpu: one block per (token, head), thread d owns output dim d, keys taken a
 * chunk at a time with an online softmax (running max and sum, the accumulator rescaled), so any
 * context length works. The cache is read in its dtype and converted per element (kv_elem_load:
 * FP8 k with k_scale, v with v_scale), as the CPU twin does. */
#include "attention.cuh"

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
