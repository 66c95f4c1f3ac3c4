/* attention_mla_decode: MLA attention in the absorbed form on the GPU (GLM-5 decode; the twin of
 * attention_mla_cpu): q_nope is absorbed through W_UK into the latent space, scored against the
 * cached latent and roped k_pe, the output latent expanded through W_UV; the keys are the
 * indexer's selection when given. The cache is read in its dtype (kv_elem_load, the row with
 * k_scale), as the CPU twin does. Three kernels, chosen by attention_mla_cuda from the shapes and
 * the cache (MOESERVE_MLA_KERNEL starts the list lower): mla_decode_mma_kernel (the keys' products
 * on the tensor cores, 32 heads a block), mla_decode_grouped_kernel (CUDA cores, 16 heads a block
 * sharing each key chunk: a float32 cache, or shapes the tensor-core kernel does not cover) and
 * mla_decode_per_head_kernel (a block per token and head, any shape). */
#include "attention.cuh"

/* block (t, h). Phase 1: thread c computes q_abs[c] = sum_d q_nope[d] W_UK[d][c]. Phase 2: keys
 * a chunk at a time, thread j scores one key; thread owns latent dims c = tid + i * blockDim
 * of the output accumulator. Phase 3: thread v computes out[v] = sum_c W_UV[v][c] o_lat[c]. */
static __global__ void mla_decode_per_head_kernel(float *out, const float *q, const void *cache, KVDtype dt, float ks, int W,
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

static void mla_decode_per_head(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    if (c->kv_lora_rank > MLA_MAX_C || c->qk_rope_dim > 256)
        die("attention_mla_cuda: kv_lora_rank %d / rope dim %d exceed the kernel's limits", c->kv_lora_rank, c->qk_rope_dim);
    dim3 grid(b->n_tokens, c->n_heads);
    mla_decode_per_head_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, *wkv_b, topk, ktop, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim,
        c->attn_scale);
    LAUNCH_CHECK("mla_decode_per_head_kernel");
}

/* ---- every key read once for a group of heads (mla_decode_grouped_kernel) ----
 * In the absorbed form all heads of a token attend to the same cached rows [latent C | k_pe Dr]
 * (multi-query attention with 576-wide keys and 512-wide values for GLM-5), so a block takes
 * one token, MLA_HG heads and one split of the keys: each chunk of MLA_KC rows is read once,
 * coalesced, into shared memory and serves every head of the group. Three steps around it:
 * mla_qabs_kernel (q_nope through W_UK for 16 tokens a block, each weight read once per
 * block), the split-K partials combined by mla_combine_kernel (flash-decoding), and
 * mla_out_kernel (W_UV, 16 tokens a block). Tokens go MLA_TC at a time so that the scratch is
 * bounded; the number of splits depends only on the token count, never on the contexts, so a
 * captured graph replays with any context. */
#define MLA_HG 16     /* heads a block */
#define MLA_KC 16     /* keys a chunk (MLA_HG x MLA_KC = ATT_THREADS score threads) */
#define MLA_TC 512    /* tokens a pass */
#define MLA_TT 16     /* tokens a block of the W_UK and W_UV products */
#define MLA_GROUPED_MAX_C 512
#define MLA_GROUPED_MAX_DN 256
/* mla_decode_mma_kernel (below) */
#define MLA_MMA_HB 32      /* heads a block: two m16 tiles */
#define MLA_MMA_KC 32      /* keys a chunk: four n8 tiles, two k16 steps of P V */
#define MLA_MMA_THREADS 256
#define MLA_MMA_MAX_C 512  /* C % 64 == 0: eight warps of n8 tiles */
#define MLA_MMA_MAX_QW 768 /* C + Dr, a multiple of 16 */
#define MLA_MMA_MAX_S 64
#define MLA_MMA_PS (MLA_MMA_KC + 8) /* bf16 stride of a P row (80 bytes: ldmatrix without conflicts) */
#define MLA_MMA_SS (MLA_MMA_KC + 1) /* float stride of a score row */

static size_t mla_grouped_smem(int C, int Dr) { return (size_t)(MLA_HG * (C + Dr) + MLA_KC * (C + Dr + 4)) * sizeof(float); }

/* The kernels, each the fallback of the one after it: where a kernel does not cover the shape or
 * the cache, the one before runs. MOESERVE_MLA_KERNEL starts the list lower (auto: the last). */
enum { MLA_DECODE_PER_HEAD, MLA_DECODE_GROUPED, MLA_DECODE_MMA };
static int mla_decode_first(void)
{
    static const int by_choice[] = {MLA_DECODE_MMA, MLA_DECODE_GROUPED, MLA_DECODE_PER_HEAD}; /* auto|grouped|per-head */
    return by_choice[knob_get(KNOB_MLA_KERNEL) % 3];
}

/* a kernel's dynamic shared memory smem beside its static __shared__ arrays within the GPU's
 * opt-in limit (the launch fails past it) */
static int mla_smem_fits(Backend *be, size_t smem, const void *fn)
{
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda_state(be)->device));
    cudaFuncAttributes a;
    CUDA_CHECK(cudaFuncGetAttributes(&a, fn));
    return smem + a.sharedSizeBytes <= (size_t)optin;
}

/* splits of the keys for a pass of T tokens. The grouped kernel (two blocks an SM fit): about two
 * blocks per SM in all, at most 32. The tensor-core one (mma, one block an SM): at most one wave,
 * at least one split, at most MLA_MMA_MAX_S (2048 keys: chunks of 32 keys each). */
static int mla_splits(Backend *be, int T, int H, int mma)
{
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    if (mma) {
        int blocks = T * ((H + MLA_MMA_HB - 1) / MLA_MMA_HB), S = sms / blocks;
        return S < 1 ? 1 : S > MLA_MMA_MAX_S ? MLA_MMA_MAX_S : S;
    }
    int blocks = T * ((H + MLA_HG - 1) / MLA_HG), S = (2 * sms + blocks - 1) / blocks;
    return S < 1 ? 1 : S > 32 ? 32 : S;
}

/* qa[t, h] = [q_nope . W_UK[h] (C) | q_pe (Dr)]. Block (h, 64 latent columns, MLA_TT tokens):
 * thread owns column c for 4 of the tokens; W_UK[h][d][c] read once per block */
static __global__ void mla_qabs_kernel(float *qa, const float *q, QTensor w, int t0, int T, int H, int C, int Dn, int Dr,
                                       int Dv)
{
    __shared__ float qs[MLA_TT][MLA_GROUPED_MAX_DN];
    int h = blockIdx.x, c = blockIdx.y * 64 + (threadIdx.x & 63), tg = threadIdx.x >> 6;
    int tb = blockIdx.z * MLA_TT, nt = min(MLA_TT, T - tb), Dq = Dn + Dr;
    for (int i = threadIdx.x; i < MLA_TT * Dn; i += blockDim.x) {
        int tt = i / Dn, d = i % Dn;
        qs[tt][d] = tt < nt ? q[((int64_t)(t0 + tb + tt) * H + h) * Dq + d] : 0.f;
    }
    __syncthreads();
    if (c < C) {
        float a[MLA_TT / 4] = {};
        int64_t row = (int64_t)h * (Dn + Dv);
        for (int d = 0; d < Dn; d++) {
            float wv = qt_elem(w, row + d, c);
#pragma unroll
            for (int k = 0; k < MLA_TT / 4; k++) a[k] += qs[tg * (MLA_TT / 4) + k][d] * wv;
        }
#pragma unroll
        for (int k = 0; k < MLA_TT / 4; k++) {
            int tt = tg * (MLA_TT / 4) + k;
            if (tt < nt) qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + c] = a[k];
        }
    }
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < nt * Dr; i += blockDim.x) {
            int tt = i / Dr, e = i % Dr;
            qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + C + e] = q[((int64_t)(t0 + tb + tt) * H + h) * Dq + Dn + e];
        }
}

/* block (token t0 + x, split y, head group z). Score thread (sh, sj) = (tid / MLA_KC, tid %
 * MLA_KC) scores key sj of the chunk for head sh; then thread owns latent dims c = tid + 256 i of
 * every head of the group. One split: ol = the normalised output; several: unnormalised partials
 * and (max, sum) per head into part / ml. */
static __global__ void __launch_bounds__(ATT_THREADS) mla_decode_grouped_kernel(
    float *ol, float *part, float *ml, const float *qa, const void *cache, KVDtype dt, float ks, int W, int bs,
    const int *topk, int ktop, const int *seq, const int *pos, const int *block_table, int bt_stride, int t0, int H, int C,
    int Dr, float scale, int S)
{
    extern __shared__ float mla_sm[];
    /* rows of QW floats (QW % 4 == 0: 16-byte loads); the keys' stride QW + 4 puts the 8 keys of a
     * quarter warp's 16-byte loads in different banks */
    const int QW = C + Dr, KW = C + Dr + 4;
    float *qs = mla_sm, *kc = qs + MLA_HG * QW;
    __shared__ float ps[MLA_HG][MLA_KC], mh[MLA_HG], lh[MLA_HG], cr[MLA_HG];
    __shared__ int sl[MLA_KC];
    int i0 = blockIdx.x, t = t0 + i0, sp = blockIdx.y, h0 = blockIdx.z * MLA_HG, nh = min(MLA_HG, H - h0);
    int tid = threadIdx.x, s = seq[t], n = topk ? ktop : pos[t] + 1;
    int jb = (int)((int64_t)n * sp / S), je = (int)((int64_t)n * (sp + 1) / S);
    const float *qsrc = qa + ((int64_t)i0 * H + h0) * QW;
    for (int i = tid; i < nh * QW; i += blockDim.x) qs[i] = qsrc[i];
    if (tid < MLA_HG) {
        mh[tid] = -INFINITY;
        lh[tid] = 0.f;
    }
    float acc[MLA_HG][MLA_GROUPED_MAX_C / ATT_THREADS];
#pragma unroll
    for (int h = 0; h < MLA_HG; h++)
#pragma unroll
        for (int i = 0; i < MLA_GROUPED_MAX_C / ATT_THREADS; i++) acc[h][i] = 0.f;
    const int sh = tid / MLA_KC, sj = tid % MLA_KC;
    __syncthreads();
    for (int j0 = jb; j0 < je; j0 += MLA_KC) {
        if (tid < MLA_KC) {
            int j = j0 + tid, key = -1;
            if (j < je) key = topk ? topk[(int64_t)t * ktop + j] : j;
            sl[tid] = key >= 0 ? batch_slot(block_table, bt_stride, s, key, bs) : -1;
        }
        __syncthreads();
        for (int i = tid; i < MLA_KC * QW; i += blockDim.x) {
            int jj = i / QW, e = i - jj * QW;
            kc[jj * KW + e] = sl[jj] >= 0 ? kv_elem_load(cache, dt, (int64_t)sl[jj] * W + e, ks) : 0.f;
        }
        __syncthreads();
        float z = -INFINITY;
        if (sh < nh && sl[sj] >= 0) {
            const float4 *qh = (const float4 *)(qs + sh * QW), *kj = (const float4 *)(kc + sj * KW);
            float d0 = 0.f, d1 = 0.f;
            for (int e = 0; e < QW / 4; e++) {
                float4 a = qh[e], k = kj[e];
                d0 += a.x * k.x + a.z * k.z;
                d1 += a.y * k.y + a.w * k.w;
            }
            z = (d0 + d1) * scale;
        }
        /* the head's 16 scores sit in 16 neighbouring lanes of one warp */
        float mx = z;
#pragma unroll
        for (int o = MLA_KC / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mold = mh[sh], mnew = fmaxf(mold, mx);
        float p = z == -INFINITY ? 0.f : expf(z - mnew), psum = p;
#pragma unroll
        for (int o = MLA_KC / 2; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        ps[sh][sj] = p;
        __syncthreads(); /* every thread has read mh */
        if (sj == 0) {
            float corr = mold == -INFINITY ? 0.f : expf(mold - mnew);
            cr[sh] = corr;
            lh[sh] = lh[sh] * corr + psum;
            mh[sh] = mnew;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MLA_GROUPED_MAX_C / ATT_THREADS; i++) {
            int c = tid + ATT_THREADS * i;
            if (c < C) {
                float kv[MLA_KC];
#pragma unroll
                for (int jj = 0; jj < MLA_KC; jj++) kv[jj] = kc[jj * KW + c];
#pragma unroll
                for (int h = 0; h < MLA_HG; h++)
                    if (h < nh) {
                        float a = acc[h][i] * cr[h];
#pragma unroll
                        for (int jj = 0; jj < MLA_KC; jj++) a += ps[h][jj] * kv[jj];
                        acc[h][i] = a;
                    }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MLA_GROUPED_MAX_C / ATT_THREADS; i++) {
        int c = tid + ATT_THREADS * i;
        if (c >= C) continue;
#pragma unroll
        for (int h = 0; h < MLA_HG; h++)
            if (h < nh) {
                if (S == 1) ol[((int64_t)i0 * H + h0 + h) * C + c] = lh[h] > 0.f ? acc[h][i] / lh[h] : 0.f;
                else part[(((int64_t)i0 * S + sp) * H + h0 + h) * C + c] = acc[h][i];
            }
    }
    if (S > 1 && tid < nh) {
        float *o = ml + (((int64_t)i0 * S + sp) * H + h0 + tid) * 2;
        o[0] = mh[tid];
        o[1] = lh[tid];
    }
}

/* block (token, head): the splits' partials rescaled to their common max and normalised */
static __global__ void mla_combine_kernel(float *ol, const float *part, const float *ml, int H, int C, int S)
{
    int i0 = blockIdx.x, h = blockIdx.y;
    float M = -INFINITY, L = 0.f;
    for (int sp = 0; sp < S; sp++) M = fmaxf(M, ml[(((int64_t)i0 * S + sp) * H + h) * 2]);
    for (int sp = 0; sp < S; sp++) {
        const float *o = ml + (((int64_t)i0 * S + sp) * H + h) * 2;
        if (o[1] > 0.f) L += o[1] * expf(o[0] - M);
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.f;
        for (int sp = 0; sp < S; sp++) {
            const float *o = ml + (((int64_t)i0 * S + sp) * H + h) * 2;
            if (o[1] > 0.f) a += part[(((int64_t)i0 * S + sp) * H + h) * C + c] * expf(o[0] - M);
        }
        ol[((int64_t)i0 * H + h) * C + c] = L > 0.f ? a / L : 0.f;
    }
}

/* out[t, h, v] = W_UV[h][v] . ol[t, h]. Block (h, 32 values, MLA_TT tokens): warp w takes
 * values 4w..4w+3, its lanes the latent dims; each W_UV row read once per block */
static __global__ void mla_out_kernel(float *out, const float *ol, QTensor w, int t0, int T, int H, int C, int Dn, int Dv)
{
    extern __shared__ float mla_os[]; /* [MLA_TT][C] */
    pdl_trigger();                    /* o_proj after it */
    int h = blockIdx.x, v0 = blockIdx.y * 32, tb = blockIdx.z * MLA_TT, nt = min(MLA_TT, T - tb);
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < MLA_TT * C; i += blockDim.x) {
        int tt = i / C, c = i - tt * C;
        mla_os[i] = tt < nt ? ol[((int64_t)(tb + tt) * H + h) * C + c] : 0.f;
    }
    __syncthreads();
    for (int k = 0; k < 4; k++) {
        int v = v0 + wp * 4 + k;
        if (v >= Dv) break;
        int64_t row = (int64_t)h * (Dn + Dv) + Dn + v;
        float a[MLA_TT] = {};
        for (int c = lane; c < C; c += 32) {
            float wv = qt_elem(w, row, c);
#pragma unroll
            for (int tt = 0; tt < MLA_TT; tt++) a[tt] += wv * mla_os[tt * C + c];
        }
#pragma unroll
        for (int tt = 0; tt < MLA_TT; tt++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a[tt] += __shfl_xor_sync(0xffffffffu, a[tt], o);
            if (lane == 0 && tt < nt) out[((int64_t)(t0 + tb + tt) * H + h) * Dv + v] = a[tt];
        }
    }
}

/* ---- W_UK and W_UV from a packed NVFP4 kv_b_proj (W4P, w4_common.cuh) on the tensor cores ----
 * The generic products above read the weight one element at a time (qt_elem), which costs a
 * W4P weight ~100x its bytes (issue #5; at batch 1 they were 2.2 of a 6-layer GLM-5 step's 3.8
 * ms). Here a warp streams whole W4P records, decodes them in registers (w4_decode_chunk) and
 * multiplies on mma.sync m16n8k16 with 8 tokens an n8 tile. The activations enter as three BF16
 * parts (x = p0 + p1 + p2, 24 significant bits) and the weights are exact in BF16, so the float32
 * results of the generic kernels hold (TOL_F32). Needs C % 256 == 0 (a record is 256 columns)
 * and Dn, Dv multiples of 16 (a head's W_UK and W_UV rows start on a record row). */
#define MLA_W4_TOK 64   /* tokens a block of mla_out_w4_kernel (8 n8 tiles) */
#define MLA_W4_KS 4     /* warps of mla_qabs_w4_kernel, the head's Dn rows split between them */

static int mla_w4_ok(const QTensor *w, const ModelConfig *c)
{
    return w->fmt == QF_NVFP4 && w->packed && c->kv_lora_rank % W4_KG == 0 && c->qk_nope_dim % 16 == 0 &&
           c->v_head_dim % 16 == 0;
}

/* x (two consecutive floats) as three BF16 pairs whose sum is x to 24 bits */
__device__ __forceinline__ void mla_split3(float x0, float x1, uint32_t (&p)[3])
{
#pragma unroll
    for (int i = 0; i < 3; i++) {
        __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
        p[i] = *(uint32_t *)&v;
        x0 -= __low2float(v);
        x1 -= __high2float(v);
    }
}

/* the 8 x 8 b16 sub-matrix of a fragment register, transposed */
__device__ __forceinline__ uint32_t movtrans(uint32_t a)
{
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

/* out[t0 + tb + n, h, v] = sum_c ol[tb + n, h, c] W[h (Dn + Dv) + Dn + v, c]: block (head h,
 * MLA_W4_TOK tokens from tb); warp w takes the head's row tiles (16 v) w, w + warps, ..; each
 * lane's 16 activations of a chunk are the natural columns 64 c + 16 t.. (w4_common.cuh), read from
 * float32 and split in registers. */
static __global__ void __launch_bounds__(512) mla_out_w4_kernel(float *out, const float *ol, QTensor w, int t0, int T,
                                                                 int H, int C, int Dn, int Dv)
{
    pdl_trigger(); /* o_proj after it */
    const int h = blockIdx.x, tb = blockIdx.y * MLA_W4_TOK, nt = min(MLA_W4_TOK, T - tb);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = blockDim.x >> 5, KG = C / W4_KG;
    const float sc = w.gscale * 512.f; /* the decode's 2^-9 (w4_common.cuh) */
    for (int rt = threadIdx.x >> 5; rt < Dv / 16; rt += nw) {
        const uint8_t *rec0 = w.data + (((int64_t)h * (Dn + Dv) + Dn) / 16 + rt) * KG * W4_REC;
        for (int n0 = 0; n0 < nt; n0 += 8) {
            const float *x = ol + ((int64_t)(tb + min(n0 + g, nt - 1)) * H + h) * C + t * 16;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            W4Frag cur, nxt;
            w4_load(cur, rec0, lane);
            for (int G = 0; G < KG; G++) {
                if (G + 1 < KG) w4_load(nxt, rec0 + (size_t)(G + 1) * W4_REC, lane);
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    uint32_t a[4][4];
                    w4_decode_chunk(cur, c, a);
                    const float4 *p = (const float4 *)(x + G * W4_KG + c * 64);
                    float f[16];
                    *(float4 *)&f[0] = p[0];
                    *(float4 *)&f[4] = p[1];
                    *(float4 *)&f[8] = p[2];
                    *(float4 *)&f[12] = p[3];
                    uint32_t b[8][3];
#pragma unroll
                    for (int i = 0; i < 8; i++) mla_split3(f[2 * i], f[2 * i + 1], b[i]);
#pragma unroll
                    for (int s = 0; s < 3; s++)
                        w4_mma_chunk(acc, a, make_uint4(b[0][s], b[1][s], b[2][s], b[3][s]),
                                     make_uint4(b[4][s], b[5][s], b[6][s], b[7][s]));
                }
                cur = nxt;
            }
            /* acc: rows g, g + 8 of the tile (v) x tokens n0 + 2t, + 1 */
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int n = n0 + 2 * t + (r & 1), v = rt * 16 + g + 8 * (r >> 1);
                if (n < nt) out[((int64_t)(t0 + tb + n) * H + h) * Dv + v] = acc[r] * sc;
            }
        }
    }
}

/* qa[tb + n, h, c] = sum_d q[t0 + tb + n, h, d] W[h (Dn + Dv) + d, c] (d < Dn), and the roped part
 * copied: block (head h, record column G: 256 latent columns, 8 tokens from tb). The sum runs over
 * the weight's rows, so each decoded 16 x 16 step is transposed in registers (movmatrix: the
 * fragment's four 8 x 8 parts, the off-diagonal two swapped) to be the A operand with the 16
 * rows as k; B is then the query's 16 values of those rows in natural order, and the output row
 * m of step j of chunk c is the latent column 256 G + 64 c + 16 (m % 8 / 2) + 4 j + (m % 2) + 2 (m
 * / 8) (W4P's order of a step's columns). The MLA_W4_KS warps take the Dn / 16 row tiles in turn;
 * their sums meet in shared memory, added in warp order. */
static __global__ void __launch_bounds__(MLA_W4_KS * 32) mla_qabs_w4_kernel(float *qa, const float *q, QTensor w, int t0,
                                                                            int T, int H, int C, int Dn, int Dr, int Dv)
{
    __shared__ float red[MLA_W4_KS - 1][64][32];
    const int h = blockIdx.x, G = blockIdx.y, tb = blockIdx.z * 8, nt = min(8, T - tb), Dq = Dn + Dr;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, KG = C / W4_KG;
    const float *x = q + ((int64_t)(t0 + tb + min(g, nt - 1)) * H + h) * Dq + 2 * t;
    float acc[4][4][4] = {};
    for (int i = wp; i < Dn / 16; i += MLA_W4_KS) {
        W4Frag f;
        w4_load(f, w.data + (((int64_t)h * (Dn + Dv)) / 16 + i) * KG * W4_REC + (size_t)G * W4_REC, lane);
        uint32_t b0[3], b1[3]; /* rows 16 i + 2t, + 1 and 16 i + 2t + 8, + 9 of token g */
        mla_split3(x[16 * i], x[16 * i + 1], b0);
        mla_split3(x[16 * i + 8], x[16 * i + 9], b1);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[4][4];
            w4_decode_chunk(f, c, a);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t t0r = movtrans(a[j][0]), t1r = movtrans(a[j][2]), t2r = movtrans(a[j][1]), t3r = movtrans(a[j][3]);
#pragma unroll
                for (int s = 0; s < 3; s++) mma_bf16(acc[c][j], t0r, t1r, t2r, t3r, b0[s], b1[s]);
            }
        }
    }
    if (wp > 0) {
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) red[wp - 1][c * 16 + j * 4 + r][lane] = acc[c][j][r];
    }
    __syncthreads();
    if (wp == 0) {
        const float sc = w.gscale * 512.f;
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    float s = acc[c][j][r];
                    for (int k = 0; k < MLA_W4_KS - 1; k++) s += red[k][c * 16 + j * 4 + r][lane];
                    int m = g + 8 * (r >> 1), n = 2 * t + (r & 1);
                    int col = G * W4_KG + c * 64 + 16 * ((m & 7) >> 1) + 4 * j + (m & 1) + 2 * (m >> 3);
                    if (n < nt) qa[((int64_t)(tb + n) * H + h) * (C + Dr) + col] = s * sc;
                }
    }
    if (G == 0)
        for (int i = threadIdx.x; i < nt * Dr; i += blockDim.x) {
            int tt = i / Dr, e = i % Dr;
            qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + C + e] = q[((int64_t)(t0 + tb + tt) * H + h) * Dq + Dn + e];
        }
}

/* ---- the keys' products on the tensor cores (mla_decode_mma_kernel) ----
 * Same steps as the grouped kernel (mla_qabs_kernel, split-K partials, mla_combine_kernel,
 * mla_out_kernel); the
 * block (token, split, 32 heads) runs the scores S = Q K^T [32 heads x 32 keys, K = C + Dr]
 * and the latent P V [32 heads x C, K = 32 keys] as mma.sync m16n8k16 BF16 with float32
 * accumulators. The keys enter exact: BF16 rows as stored, FP8 codes converted to BF16 (3
 * significant bits) with k_scale applied to the scores and the output in float32. q_abs and p
 * are split into three BF16 parts (x = hi + mid + lo, the residual below 2^-24 |x|, as float32
 * rounding) and every product runs three times, so the op keeps the float32 tolerance of its
 * CPU twin (two parts would leave 2^-16 |x|, about TOL_F32 itself). A float32 cache (a test
 * setting) takes the grouped kernel. Warps: scores, warp w owns head tile w & 1 and key tile w >> 1; softmax,
 * 8 threads a head; latent output, warp w owns columns w C/8 .. (w + 1) C/8 - 1 of both head
 * tiles (C/64 n-tiles of 8). */
/* bf16 stride of a q / key row: 16-byte rows whose stride is an odd multiple of 16 bytes mod 128,
 * so the 8 rows of an ldmatrix fall in different banks */
static __host__ __device__ int mla_mma_qs(int QW) { return QW + 8; }

static size_t mla_mma_smem(int C, int Dr)
{
    int QS = mla_mma_qs(C + Dr);
    return (size_t)(3 * MLA_MMA_HB + MLA_MMA_KC) * QS * 2 + (size_t)3 * MLA_MMA_HB * MLA_MMA_PS * 2 +
           (size_t)MLA_MMA_HB * MLA_MMA_SS * 4;
}

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x2(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x2_trans(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

/* x = hi + mid + lo, each BF16 (round to nearest; the differences are exact in float32) */
__device__ __forceinline__ void bf16_split3(float x, __nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo)
{
    *hi = __float2bfloat16_rn(x);
    float r = x - __bfloat162float(*hi);
    *mid = __float2bfloat16_rn(r);
    *lo = __float2bfloat16_rn(r - __bfloat162float(*mid));
}

/* Block (token t0 + x, split y, head group z of MLA_MMA_HB). Split y takes the chunks
 * [y cps, (y + 1) cps) of the token's n keys (cps = ceil(ceil(n / KC) / S)); a split past the
 * end writes an empty partial (max -inf, sum 0), so the grid depends on the token count only.
 * Output as the grouped kernel's: S == 1 the normalised latent into ol, else partials into part / ml. */
static __global__ void __launch_bounds__(MLA_MMA_THREADS, 1) mla_decode_mma_kernel(
    float *ol, float *part, float *ml, const float *qa, const void *cache, KVDtype dt, float ks, int W, int bs,
    const int *topk, int ktop, const int *seq, const int *pos, const int *block_table, int bt_stride, int t0, int H, int C,
    int Dr, float scale, int S)
{
    extern __shared__ __align__(16) unsigned char mla_mma_sm[];
    const int QW = C + Dr, QS = mla_mma_qs(QW);
    __nv_bfloat16 *qs = (__nv_bfloat16 *)mla_mma_sm;          /* [3][HB][QS] q_abs | q_pe parts */
    __nv_bfloat16 *kc = qs + 3 * MLA_MMA_HB * QS;              /* [KC][QS] the chunk's rows */
    __nv_bfloat16 *ps = kc + MLA_MMA_KC * QS;                  /* [3][HB][PS] p parts */
    float *sc = (float *)(ps + 3 * MLA_MMA_HB * MLA_MMA_PS);   /* [HB][SS] scores */
    __shared__ float mh[MLA_MMA_HB], lh[MLA_MMA_HB], cr[MLA_MMA_HB];
    __shared__ int sl[MLA_MMA_KC];
    int i0 = blockIdx.x, t = t0 + i0, sp = blockIdx.y, h0 = blockIdx.z * MLA_MMA_HB, nh = min(MLA_MMA_HB, H - h0);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    int s = seq[t], n = topk ? ktop : pos[t] + 1;
    int cps = ((n + MLA_MMA_KC - 1) / MLA_MMA_KC + S - 1) / S;
    int jb = sp * cps * MLA_MMA_KC, je = min(n, jb + cps * MLA_MMA_KC);
    float zs = scale * (dt == KV_DTYPE_FP8 ? ks : 1.f), vsc = dt == KV_DTYPE_FP8 ? ks : 1.f;

    /* q rows of the group (rows past nh zero), split into parts: thread owns 4 columns a step */
    const float *qsrc = qa + ((int64_t)i0 * H + h0) * QW;
    for (int i = tid; i < MLA_MMA_HB * QW / 4; i += MLA_MMA_THREADS) {
        int h = i / (QW / 4), e = (i - h * (QW / 4)) * 4;
        float4 v = h < nh ? *(const float4 *)(qsrc + (int64_t)h * QW + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        float x[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; k++)
            bf16_split3(x[k], &qs[h * QS + e + k], &qs[(MLA_MMA_HB + h) * QS + e + k], &qs[(2 * MLA_MMA_HB + h) * QS + e + k]);
    }
    if (tid < MLA_MMA_HB) {
        mh[tid] = -INFINITY;
        lh[tid] = 0.f;
    }
    const int NTW = C / 64; /* n8 tiles of the latent a warp owns */
    float acc[2][MLA_MMA_MAX_C / 64][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[m][j][k] = 0.f;
    const int smt = w & 1, snt = w >> 1; /* the warp's score tile: heads 16 smt.., keys 8 snt.. */
    const int sh = tid >> 3, sq = tid & 7; /* softmax: head sh, keys 4 sq .. 4 sq + 3 */
    const int U = QW / 8;                  /* 8-element units of a row */
    __syncthreads(); /* q parts, mh and lh set (the epilogue reads them when no chunk ran) */
    for (int j0 = jb; j0 < je; j0 += MLA_MMA_KC) {
        if (tid < MLA_MMA_KC) {
            int j = j0 + tid, key = -1;
            if (j < je) key = topk ? topk[(int64_t)t * ktop + j] : j;
            sl[tid] = key >= 0 ? batch_slot(block_table, bt_stride, s, key, bs) : -1;
        }
        __syncthreads();
        /* the chunk's rows, 8 elements (16 bytes of BF16) a unit; missing keys are zero rows */
        for (int u = tid; u < MLA_MMA_KC * U; u += MLA_MMA_THREADS) {
            int jj = u / U, e = (u - jj * U) * 8, slot = sl[jj];
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (slot >= 0) {
                if (dt == KV_DTYPE_BF16) v = *(const uint4 *)((const uint16_t *)cache + (int64_t)slot * W + e);
                else {
                    uint2 b = *(const uint2 *)((const uint8_t *)cache + (int64_t)slot * W + e);
                    uint32_t wd[2] = {b.x, b.y}, o[4];
                    for (int k = 0; k < 4; k++) {
                        uint32_t by = wd[k >> 1] >> (16 * (k & 1));
                        __nv_bfloat162 p2 = __floats2bfloat162_rn(codec_e4m3_to_f32((uint8_t)(by & 255)),
                                                                  codec_e4m3_to_f32((uint8_t)((by >> 8) & 255)));
                        o[k] = *(uint32_t *)&p2;
                    }
                    v = make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
            *(uint4 *)(kc + jj * QS + e) = v;
        }
        __syncthreads();
        /* scores: 16 heads x 8 keys a warp, three mma (q parts) per k16 step */
        {
            float z[4] = {0.f, 0.f, 0.f, 0.f};
            /* A: lane supplies row (lane & 15), columns + 8 (lane >> 4); B: key row (lane & 7), dims + 8 ((lane >> 3) & 1) */
            const __nv_bfloat16 *qa0 = qs + (smt * 16 + (lane & 15)) * QS + (lane >> 4) * 8;
            const __nv_bfloat16 *kb0 = kc + (snt * 8 + (lane & 7)) * QS + ((lane >> 3) & 1) * 8;
            for (int k0 = 0; k0 < QW; k0 += 16) {
                uint32_t b[2], a[4];
                ldsm_x2(b, kb0 + k0);
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    ldsm_x4(a, qa0 + p * MLA_MMA_HB * QS + k0);
                    mma_bf16(z, a[0], a[1], a[2], a[3], b[0], b[1]);
                }
            }
            /* C fragment: z[0..1] head g, keys 2 tq, 2 tq + 1; z[2..3] head g + 8 */
            int hr = smt * 16 + g, kj = snt * 8 + 2 * tq;
            sc[hr * MLA_MMA_SS + kj] = sl[kj] >= 0 ? z[0] * zs : -INFINITY;
            sc[hr * MLA_MMA_SS + kj + 1] = sl[kj + 1] >= 0 ? z[1] * zs : -INFINITY;
            sc[(hr + 8) * MLA_MMA_SS + kj] = sl[kj] >= 0 ? z[2] * zs : -INFINITY;
            sc[(hr + 8) * MLA_MMA_SS + kj + 1] = sl[kj + 1] >= 0 ? z[3] * zs : -INFINITY;
        }
        __syncthreads();
        /* online softmax: head sh's 32 scores over 8 neighbouring lanes */
        {
            float zz[4], mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                zz[k] = sc[sh * MLA_MMA_SS + 4 * sq + k];
                mx = fmaxf(mx, zz[k]);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mold = mh[sh], mnew = fmaxf(mold, mx), psum = 0.f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float p = zz[k] == -INFINITY ? 0.f : expf(zz[k] - mnew);
                psum += p;
                int e = sh * MLA_MMA_PS + 4 * sq + k;
                bf16_split3(p, &ps[e], &ps[MLA_MMA_HB * MLA_MMA_PS + e], &ps[2 * MLA_MMA_HB * MLA_MMA_PS + e]);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
            __syncwarp(); /* every lane of the head has read mh before lane sq == 0 writes it */
            if (sq == 0) {
                float corr = mold == -INFINITY ? 0.f : expf(mold - mnew);
                cr[sh] = corr;
                lh[sh] = lh[sh] * corr + psum;
                mh[sh] = mnew;
            }
        }
        __syncthreads();
        /* latent: acc = acc * corr + P V over the chunk's two k16 steps, three mma (p parts) each */
        {
            float c0[2] = {cr[g], cr[16 + g]}, c1[2] = {cr[8 + g], cr[24 + g]};
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < MLA_MMA_MAX_C / 64; j++) {
                    acc[m][j][0] *= c0[m];
                    acc[m][j][1] *= c0[m];
                    acc[m][j][2] *= c1[m];
                    acc[m][j][3] *= c1[m];
                }
#pragma unroll
            for (int kk = 0; kk < MLA_MMA_KC; kk += 16) {
                uint32_t a[3][2][4];
#pragma unroll
                for (int p = 0; p < 3; p++)
#pragma unroll
                    for (int m = 0; m < 2; m++)
                        ldsm_x4(a[p][m], ps + (p * MLA_MMA_HB + m * 16 + (lane & 15)) * MLA_MMA_PS + kk + (lane >> 4) * 8);
                /* B = V [16 keys x 8 columns] stored key-major: transposed ldmatrix, lane supplies
                 * key row kk + (lane & 15) */
                const __nv_bfloat16 *vb = kc + (kk + (lane & 15)) * QS + w * (C / 8);
#pragma unroll
                for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
                    if (j < NTW) {
                        uint32_t b[2];
                        ldsm_x2_trans(b, vb + 8 * j);
#pragma unroll
                        for (int m = 0; m < 2; m++)
#pragma unroll
                            for (int p = 0; p < 3; p++)
                                mma_bf16(acc[m][j], a[p][m][0], a[p][m][1], a[p][m][2], a[p][m][3], b[0], b[1]);
                    }
            }
        }
        __syncthreads();
    }
    /* acc[m][j]: heads 16 m + g (0..1) and 16 m + g + 8 (2..3), columns w C/8 + 8 j + 2 tq, + 1 */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int h = m * 16 + g + 8 * r;
            if (h >= nh) continue;
            float l = lh[h], f = S == 1 ? (l > 0.f ? vsc / l : 0.f) : vsc;
            float *dst = S == 1 ? ol + ((int64_t)i0 * H + h0 + h) * C : part + (((int64_t)i0 * S + sp) * H + h0 + h) * C;
#pragma unroll
            for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
                if (j < NTW) {
                    int c = w * (C / 8) + 8 * j + 2 * tq;
                    *(float2 *)(dst + c) = make_float2(acc[m][j][2 * r] * f, acc[m][j][2 * r + 1] * f);
                }
        }
    if (S > 1 && tid < nh) {
        float *o = ml + (((int64_t)i0 * S + sp) * H + h0 + tid) * 2;
        o[0] = mh[tid];
        o[1] = lh[tid];
    }
}

/* the grouped kernel covers the shape (C up to 512, Dn up to 256, C + Dr % 4) where its shared
 * memory fits, any cache */
static int mla_grouped_ok(Backend *be, const ModelConfig *c)
{
    if (c->kv_lora_rank > MLA_GROUPED_MAX_C || c->qk_nope_dim > MLA_GROUPED_MAX_DN || (c->kv_lora_rank + c->qk_rope_dim) % 4)
        return 0;
    return mla_smem_fits(be, mla_grouped_smem(c->kv_lora_rank, c->qk_rope_dim), (const void *)mla_decode_grouped_kernel);
}

/* the tensor-core kernel covers the shape (C % 64, C + Dr % 16, row stride % 8: 16-byte rows) and a
 * BF16 or FP8 cache (kv NULL: any cache, for the reservation) */
static int mla_mma_ok(Backend *be, const ModelConfig *c, const KVLayer *kv)
{
    int C = c->kv_lora_rank, QW = C + c->qk_rope_dim;
    if (C <= 0 || C > MLA_MMA_MAX_C || C % 64 || QW > MLA_MMA_MAX_QW || QW % 16 || c->qk_nope_dim > MLA_GROUPED_MAX_DN)
        return 0;
    if (kv && (kv->dtype == KV_DTYPE_F32 || kv->kv_width % 8 || kv->kv_width < QW || (uintptr_t)kv->kv % 16))
        return 0;
    return mla_smem_fits(be, mla_mma_smem(C, c->qk_rope_dim), (const void *)mla_decode_mma_kernel);
}

/* scratch of the grouped and tensor-core kernels for a step of T tokens (cuda_reserve): the largest of either */
void mla_decode_reserve(Backend *be, const ModelConfig *c, int T)
{
    const int first = mla_decode_first();
    if (c->kv_lora_rank <= 0 || first == MLA_DECODE_PER_HEAD) return;
    int ok1 = mla_grouped_ok(be, c), ok2 = first == MLA_DECODE_MMA && mla_mma_ok(be, c, NULL);
    if (!ok1 && !ok2) return;
    int H = c->n_heads, C = c->kv_lora_rank, Tc = T < MLA_TC ? T : MLA_TC;
    int64_t rows = 0; /* the largest splits x tokens of any pass */
    for (int n = 1; n <= Tc; n++)
        for (int v = 0; v < 2; v++) {
            if (!(v ? ok2 : ok1)) continue;
            int S = mla_splits(be, n, H, v);
            if (S > 1 && (int64_t)S * n > rows) rows = (int64_t)S * n;
        }
    cuda_scratch(be, SCR_MLA_QA, (size_t)Tc * H * (C + c->qk_rope_dim) * 4);
    cuda_scratch(be, SCR_MLA_OL, (size_t)Tc * H * C * 4);
    if (rows) cuda_scratch(be, SCR_MLA_PART, (size_t)rows * H * (C + 2) * 4);
}

void attention_mla_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    const int first = mla_decode_first();
    const int mma = first == MLA_DECODE_MMA && mla_mma_ok(be, c, kv);
    if (first == MLA_DECODE_PER_HEAD || (!mma && !mla_grouped_ok(be, c))) {
        mla_decode_per_head(be, out, q, kv, wkv_b, topk, ktop, b, c);
        return;
    }
    cudaStream_t st = cuda_stream(be);
    int H = c->n_heads, C = c->kv_lora_rank, Dr = c->qk_rope_dim, Dn = c->qk_nope_dim, Dv = c->v_head_dim;
    int HG = mma ? (H + MLA_MMA_HB - 1) / MLA_MMA_HB : (H + MLA_HG - 1) / MLA_HG, w4 = mla_w4_ok(wkv_b, c);
    size_t smem = mma ? mla_mma_smem(C, Dr) : mla_grouped_smem(C, Dr);
    static size_t smem_set[2][64]; /* per kernel and device: the attribute is a device's */
    int dev = cuda_state(be)->device & 63;
    if (smem > 48 * 1024 && smem > smem_set[mma][dev]) {
        if (mma)
            CUDA_CHECK(cudaFuncSetAttribute(mla_decode_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        else
            CUDA_CHECK(cudaFuncSetAttribute(mla_decode_grouped_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set[mma][dev] = smem;
    }
    for (int t0 = 0; t0 < b->n_tokens; t0 += MLA_TC) {
        int T = b->n_tokens - t0 < MLA_TC ? b->n_tokens - t0 : MLA_TC, S = mla_splits(be, T, H, mma);
        float *qa = (float *)cuda_scratch(be, SCR_MLA_QA, (size_t)T * H * (C + Dr) * 4);
        float *ol = (float *)cuda_scratch(be, SCR_MLA_OL, (size_t)T * H * C * 4);
        float *part = S > 1 ? (float *)cuda_scratch(be, SCR_MLA_PART, (size_t)S * T * H * (C + 2) * 4) : NULL;
        float *ml = part ? part + (size_t)S * T * H * C : NULL;
        int tz = (T + MLA_TT - 1) / MLA_TT;
        if (w4) {
            mla_qabs_w4_kernel<<<dim3(H, C / W4_KG, (T + 7) / 8), MLA_W4_KS * 32, 0, st>>>(qa, q, *wkv_b, t0, T, H, C, Dn,
                                                                                         Dr, Dv);
            LAUNCH_CHECK("mla_qabs_w4_kernel");
        } else {
            mla_qabs_kernel<<<dim3(H, (C + 63) / 64, tz), ATT_THREADS, 0, st>>>(qa, q, *wkv_b, t0, T, H, C, Dn, Dr, Dv);
            LAUNCH_CHECK("mla_qabs_kernel");
        }
        if (mma) {
            mla_decode_mma_kernel<<<dim3(T, S, HG), MLA_MMA_THREADS, smem, st>>>(
                ol, part, ml, qa, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, topk, ktop, b->seq,
                b->pos, b->block_table, b->bt_stride, t0, H, C, Dr, c->attn_scale, S);
            LAUNCH_CHECK("mla_decode_mma_kernel");
        } else {
            mla_decode_grouped_kernel<<<dim3(T, S, HG), ATT_THREADS, smem, st>>>(
                ol, part, ml, qa, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, topk, ktop, b->seq,
                b->pos, b->block_table, b->bt_stride, t0, H, C, Dr, c->attn_scale, S);
            LAUNCH_CHECK("mla_decode_grouped_kernel");
        }
        if (S > 1) {
            mla_combine_kernel<<<dim3(T, H), ATT_THREADS, 0, st>>>(ol, part, ml, H, C, S);
            LAUNCH_CHECK("mla_combine_kernel");
        }
        if (w4) {
            int warps = Dv / 16 < 16 ? Dv / 16 : 16;
            mla_out_w4_kernel<<<dim3(H, (T + MLA_W4_TOK - 1) / MLA_W4_TOK), warps * 32, 0, st>>>(out, ol, *wkv_b, t0, T, H, C,
                                                                                                Dn, Dv);
            LAUNCH_CHECK("mla_out_w4_kernel");
        } else {
            mla_out_kernel<<<dim3(H, (Dv + 31) / 32, tz), ATT_THREADS, (size_t)MLA_TT * C * 4, st>>>(out, ol, *wkv_b, t0, T,
                                                                                                  H, C, Dn, Dv);
            LAUNCH_CHECK("mla_out_kernel");
        }
    }
}
