/* indexer: the DSA lightning indexer on the GPU, the twin of indexer_cpu.
 * Scores: I(s,t) = sum_h w[s,h] Hi^-0.5 * relu(q[s,h] . k[t] Di^-0.5), blocks over chunks of
 * keys (indexer_scores_kernel). Top-k: block per query, an exact radix select over the scores
 * as order-preserving 32-bit keys finds the k-th largest value; every larger score is kept and,
 * of those equal to it, the lowest positions; the selection is written in increasing position
 * order, -1 padded. Queries with no more than Ki causal keys take them all. The keys are read
 * in the cache dtype (FP8 with scale 1) and converted to float32, as indexer_cpu does. */
#include "common.cuh"

#define IDX_THREADS 256

#define IDX_KB 32      /* keys a chunk of the scores kernel */
#define IDX_HG (IDX_THREADS / IDX_KB) /* head groups: thread (key kk, heads hg, hg + IDX_HG, ...) */

/* Scores: block (x, token t) takes the chunks x, x + gridDim.x, ... of IDX_KB keys: the chunk's
 * keys are read once, coalesced, into shared memory (stride Di + 1: the 32 keys of a warp in 32
 * banks) and scored against every head's q held there; the head groups' sums added in order. */
static __global__ void indexer_scores_kernel(float *scores, int ld, const float *q, const float *w, const void *kcache,
                                             KVDtype dt, int Wd, int bs, const int *seq, const int *pos,
                                             const int *block_table, int bt_stride, int Hi, int Di, int Ki, float kscale,
                                             float hscale)
{
    extern __shared__ float qs[]; /* q [Hi * Di], w [Hi], keys [IDX_KB][Di + 1], sums [IDX_HG][IDX_KB] */
    __shared__ int sl[IDX_KB];
    int t = blockIdx.y, n = pos[t] + 1, s = seq[t];
    if (n <= Ki || (int)blockIdx.x * IDX_KB >= n) return;
    float *ws = qs + Hi * Di, *kb = ws + Hi, *part = kb + IDX_KB * (Di + 1);
    for (int i = threadIdx.x; i < Hi * Di; i += blockDim.x) qs[i] = q[(int64_t)t * Hi * Di + i];
    for (int i = threadIdx.x; i < Hi; i += blockDim.x) ws[i] = w[(int64_t)t * Hi + i] * hscale;
    const int kk = threadIdx.x % IDX_KB, hg = threadIdx.x / IDX_KB;
    for (int j0 = blockIdx.x * IDX_KB; j0 < n; j0 += gridDim.x * IDX_KB) {
        __syncthreads(); /* the previous chunk is read (and q is in) */
        if (threadIdx.x < IDX_KB)
            sl[threadIdx.x] = j0 + threadIdx.x < n ? batch_slot(block_table, bt_stride, s, j0 + threadIdx.x, bs) : -1;
        __syncthreads();
        for (int i = threadIdx.x; i < IDX_KB * Di; i += blockDim.x) {
            int r = i / Di, e = i - r * Di;
            kb[r * (Di + 1) + e] = sl[r] >= 0 ? kv_elem_load(kcache, dt, (int64_t)sl[r] * Wd + e, 1.0f) : 0.f;
        }
        __syncthreads();
        const float *kr = kb + kk * (Di + 1);
        float acc = 0.f;
        for (int h = hg; h < Hi; h += IDX_HG) {
            const float *qh = qs + h * Di;
            float d = 0.f;
            for (int e = 0; e < Di; e++) d += qh[e] * kr[e];
            d *= kscale;
            acc += ws[h] * (d > 0.f ? d : 0.f);
        }
        part[hg * IDX_KB + kk] = acc;
        __syncthreads();
        if (threadIdx.x < IDX_KB && sl[threadIdx.x] >= 0) {
            float a = 0.f;
            for (int g = 0; g < IDX_HG; g++) a += part[g * IDX_KB + threadIdx.x];
            scores[(int64_t)t * ld + j0 + threadIdx.x] = a;
        }
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
    size_t smem = (size_t)(Hi * Di + Hi + IDX_KB * (Di + 1) + IDX_HG * IDX_KB) * sizeof(float);
    if (smem > 48 * 1024) die("indexer_cuda: %d heads x %d exceed the kernel's shared memory", Hi, Di);
    cudaStream_t st = cuda_stream(be);
    /* chunks a token: enough blocks in all to fill the GPU, from the row length alone (graphs) */
    int chunks = (ld + IDX_KB - 1) / IDX_KB, per = 1024 / T > 1 ? 1024 / T : 1;
    dim3 grid(chunks < per ? chunks : per, T);
    indexer_scores_kernel<<<grid, IDX_THREADS, smem, st>>>(scores, ld, q, w, kv->idx, kv->dtype, kv->idx_width,
                                                      kv->block_size, b->seq, b->pos, b->block_table, b->bt_stride,
                                                      Hi, Di, Ki, 1.0f / sqrtf((float)Di), 1.0f / sqrtf((float)Hi));
    LAUNCH_CHECK("indexer_scores_kernel");
    indexer_topk_kernel<<<T, IDX_THREADS, 0, st>>>(topk, scores, ld, b->pos, Ki);
    LAUNCH_CHECK("indexer_topk_kernel");
}
