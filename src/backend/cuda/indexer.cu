/* indexer: the DSA lightning indexer on the GPU (§1.5.4), the twin of indexer_cpu.
 * Scores: block per query token, thread per cached key: I(s,t) = sum_h w[s,h] Hi^-0.5 *
 * relu(q[s,h] . k[t] Di^-0.5). Top-k: block per query, an exact radix select over the scores
 * as order-preserving 32-bit keys finds the k-th largest value; every larger score is kept and,
 * of those equal to it, the lowest positions; the selection is written in increasing position
 * order, -1 padded. Queries with no more than Ki causal keys take them all. The keys are read
 * in the cache dtype (FP8 with scale 1) and converted to float32, as indexer_cpu does. */
#include "common.cuh"

#define IDX_THREADS 256

static __global__ void indexer_scores_kernel(float *scores, int ld, const float *q, const float *w, const void *kcache,
                                             KVDtype dt, int Wd, int bs, const int *seq, const int *pos,
                                             const int *block_table, int bt_stride, int Hi, int Di, int Ki, float kscale,
                                             float hscale)
{
    extern __shared__ float qs[]; /* [Hi * Di] then [Hi] */
    int t = blockIdx.x, n = pos[t] + 1, s = seq[t];
    if (n <= Ki) return;
    float *ws = qs + Hi * Di;
    for (int i = threadIdx.x; i < Hi * Di; i += blockDim.x) qs[i] = q[(int64_t)t * Hi * Di + i];
    for (int i = threadIdx.x; i < Hi; i += blockDim.x) ws[i] = w[(int64_t)t * Hi + i] * hscale;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int64_t k0 = (int64_t)batch_slot(block_table, bt_stride, s, j, bs) * Wd;
        float acc = 0.f;
        for (int h = 0; h < Hi; h++) {
            float d = 0.f;
            for (int i = 0; i < Di; i++) d += qs[h * Di + i] * kv_elem_load(kcache, dt, k0 + i, 1.0f);
            d *= kscale;
            acc += ws[h] * (d > 0.f ? d : 0.f);
        }
        scores[(int64_t)t * ld + j] = acc;
    }
}

__device__ __forceinline__ unsigned int order_key(float f)
{
    unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* inclusive scan of v over the block (blockDim.x == IDX_THREADS) */
__device__ int block_scan(int v, int *buf)
{
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int o = 1; o < blockDim.x; o <<= 1) {
        int add = threadIdx.x >= o ? buf[threadIdx.x - o] : 0;
        __syncthreads();
        buf[threadIdx.x] += add;
        __syncthreads();
    }
    int r = buf[threadIdx.x];
    __syncthreads();
    return r;
}

static __global__ void indexer_topk_kernel(int *topk, const float *scores, int ld, const int *pos, int Ki)
{
    __shared__ int hist[256], scan[IDX_THREADS];
    __shared__ unsigned int s_prefix;
    __shared__ int s_need, s_base;
    int t = blockIdx.x, n = pos[t] + 1, tid = threadIdx.x;
    int *out = topk + (int64_t)t * Ki;
    if (n <= Ki) {
        for (int k = tid; k < Ki; k += blockDim.x) out[k] = k < n ? k : -1;
        return;
    }
    const float *sc = scores + (int64_t)t * ld;
    unsigned int prefix = 0, mask = 0;
    int need = Ki; /* how many of the keys matching prefix under mask we still take */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int j = tid; j < n; j += blockDim.x) {
            unsigned int k = order_key(sc[j]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int acc = 0, d = 255;
            for (; d > 0; d--) {
                if (acc + hist[d] >= need) break;
                acc += hist[d];
            }
            s_prefix = prefix | ((unsigned int)d << shift);
            s_need = need - acc;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
    }
    /* prefix is the k-th largest key; take every larger key and the first `need` equal ones */
    if (tid == 0) s_base = 0;
    int eq_seen = 0; /* equal keys before this chunk (uniform across the block) */
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        int j = j0 + tid;
        unsigned int k = j < n ? order_key(sc[j]) : 0;
        int eq = j < n && k == prefix;
        int eq_rank = eq_seen + block_scan(eq, scan) - eq; /* equal keys before j */
        int sel = j < n && (k > prefix || (eq && eq_rank < need));
        int eq_total = __syncthreads_count(eq);
        int rank = block_scan(sel, scan) - sel;
        if (sel) out[s_base + rank] = j;
        int nsel = __syncthreads_count(sel);
        if (tid == 0) s_base += nsel;
        eq_seen += eq_total;
        __syncthreads();
    }
    for (int k = s_base + tid; k < Ki; k += blockDim.x) out[k] = -1;
}

void indexer_cuda(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv, const Batch *b,
                  const ModelConfig *c)
{
    int T = b->n_tokens, Hi = c->index_n_heads, Di = c->index_head_dim, Ki = c->index_topk;
    if (!T) return;
    int ld = b->max_ctx > 0 ? b->max_ctx : 1;
    float *scores = (float *)cuda_scratch(be, SCR_IDX_SCORES, (size_t)T * ld * sizeof(float));
    size_t smem = (size_t)(Hi * Di + Hi) * sizeof(float);
    if (smem > 48 * 1024) die("indexer_cuda: %d heads x %d exceed the kernel's shared memory", Hi, Di);
    cudaStream_t st = cuda_stream(be);
    indexer_scores_kernel<<<T, IDX_THREADS, smem, st>>>(scores, ld, q, w, kv->idx, kv->dtype, kv->idx_width,
                                                      kv->block_size, b->seq, b->pos, b->block_table, b->bt_stride,
                                                      Hi, Di, Ki, 1.0f / sqrtf((float)Di), 1.0f / sqrtf((float)Hi));
    LAUNCH_CHECK("indexer_scores_kernel");
    indexer_topk_kernel<<<T, IDX_THREADS, 0, st>>>(topk, scores, ld, b->pos, Ki);
    LAUNCH_CHECK("indexer_topk_kernel");
}
