/* attention_gqa: causal grouped-query attention over the paged KV cache on the GPU (GLM-4.5/4.6/
 * 4.7), the twin of attention_gqa_cpu (cpu/attention.c). Two kernels, decode and prefill alike:
 *
 * gqa_kernel, for head dims 64 and 128 (up to 16 query heads a KV head) and 256 (8): a block per
 * (token t, KV head kh, split sp), DH threads: the G = H / Hkv query heads of kh against the keys
 * [jb, je) of t's context (split sp of S: S > 1 where a step has too few tokens to fill the GPU,
 * then gqa_combine_kernel adds the splits). Keys go DH at a time:
 *   scores   thread j reads key j0 + j's K row once (16-byte loads) and scores it against the G
 *            queries (in shared memory, pre-scaled);
 *   softmax  warp w owns heads w, w + W, ...: the chunk's max, the running max and sum, and the
 *            factor that rescales what was accumulated before;
 *   values   warp w takes keys w, w + W, ... of the chunk and lane l the dims of every head that
 *            l owns (DH / 32 of them), each V row read once; the warps' sums are added at the end.
 * Bytes: every key's K and V row of its KV head once per query token (per split); prefill reads
 * a sequence's rows once per query token, from L2 while they fit it.
 *
 * attention_gqa_kernel, every other head shape: one block per (token, head), thread d owns output
 * dim d, keys a chunk at a time with an online softmax (each head re-reads its KV head's rows).
 *
 * The cache is read in its dtype (float32, BF16, FP8 E4M3 times its scale: k_scale for K,
 * v_scale for V) and everything is float32, as on the CPU; the tests hold the two within float32
 * rounding. */
#include <cuda_fp8.h>

#include "attention.cuh"

#define GQA_MAX_S 32 /* splits of one token's keys */

template <int DT> struct KvVec; /* 16 bytes of cache as floats */
template <> struct KvVec<KV_DTYPE_F32> { enum { N = 4 }; };
template <> struct KvVec<KV_DTYPE_BF16> { enum { N = 8 }; };
template <> struct KvVec<KV_DTYPE_FP8> { enum { N = 16 }; };

/* BYTES (2, 4, 8 or a multiple of 16) bytes at p, aligned to their size, as 32-bit words (the
 * last one's high half zero when BYTES is 2) */
template <int BYTES> __device__ __forceinline__ void raw_load(uint32_t *w, const uint8_t *p)
{
    if (BYTES >= 16) {
#pragma unroll
        for (int k = 0; k < BYTES / 16; k++) {
            uint4 v = ((const uint4 *)p)[k];
            w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
        }
    } else if (BYTES == 8) {
        uint2 v = *(const uint2 *)p;
        w[0] = v.x, w[1] = v.y;
    } else if (BYTES == 4) {
        w[0] = *(const uint32_t *)p;
    } else {
        w[0] = *(const uint16_t *)p;
    }
}

/* N consecutive cache elements at p (aligned to their bytes) as floats, unscaled; E4M3 -> half
 * is exact, so the hardware conversion gives the codec's values */
template <int DT, int N> __device__ __forceinline__ void kv_load(float *f, const uint8_t *p)
{
    constexpr int BYTES = N * (DT == KV_DTYPE_F32 ? 4 : DT == KV_DTYPE_BF16 ? 2 : 1);
    uint32_t w[(BYTES + 3) / 4];
    raw_load<BYTES>(w, p);
    if (DT == KV_DTYPE_F32) {
#pragma unroll
        for (int i = 0; i < N; i++) f[i] = __uint_as_float(w[i]);
    } else if (DT == KV_DTYPE_BF16) {
#pragma unroll
        for (int i = 0; i < N; i++) f[i] = __uint_as_float(i & 1 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16);
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 4] >> (i % 4 * 8)), __NV_E4M3);
            float2 a = __half22float2(*(__half2 *)&h);
            f[i] = a.x, f[i + 1] = a.y;
        }
    }
}

template <int DH, int GM, int DT>
static __global__ void __launch_bounds__(DH) gqa_kernel(float *out, float *part, float *ml, const float *q,
                                                         const uint8_t *cache, float ks, float vs, int W, int bs,
                                                         const int *seq, const int *pos, const int *block_table,
                                                         int bt_stride, int H, int Hkv, float scale, int S)
{
    constexpr int NW = DH / 32, DPL = DH / 32, VEC = KvVec<DT>::N, ESZ = DT == KV_DTYPE_F32 ? 4 : DT == KV_DTYPE_BF16 ? 2 : 1;
    __shared__ __align__(16) float qs[GM][DH]; /* the queries, times scale; at the end the warps' sums */
    __shared__ float ps[GM][DH];               /* a chunk's scores, then their exponentials */
    __shared__ int sl[DH];                     /* the chunk's cache slots (-1: past the split) */
    __shared__ float mh[GM], lh[GM], cr[GM];
    const int t = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = H / Hkv, s = seq[t], n = pos[t] + 1;
    if (DT != KV_DTYPE_FP8) ks = vs = 1.f; /* the scales are FP8's (kv_elem_load) */
    const int jb = (int)((int64_t)n * sp / S), je = (int)((int64_t)n * (sp + 1) / S);
    for (int i = tid; i < G * DH; i += DH) qs[i / DH][i % DH] = q[((int64_t)t * H + kh * G) * DH + i] * scale;
    if (tid < G) mh[tid] = -INFINITY, lh[tid] = 0.f;
    float acc[GM][DPL];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[g][e] = 0.f;
    const int64_t koff = (int64_t)kh * DH * ESZ, voff = (int64_t)(Hkv + kh) * DH * ESZ, row = (int64_t)W * ESZ;
    __syncthreads();
    for (int j0 = jb; j0 < je; j0 += DH) {
        /* scores: thread tid, key j0 + tid */
        int j = j0 + tid, slot = j < je ? batch_slot(block_table, bt_stride, s, j, bs) : -1;
        sl[tid] = slot;
        float z[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) z[g] = 0.f;
        if (slot >= 0) {
            const uint8_t *kp = cache + slot * row + koff;
#pragma unroll 2
            for (int i = 0; i < DH; i += VEC) {
                float kf[VEC];
                kv_load<DT, VEC>(kf, kp + (int64_t)i * ESZ);
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    if (g < G) {
                        float a = z[g];
#pragma unroll
                        for (int e = 0; e < VEC; e += 4) {
                            float4 qv = *(const float4 *)&qs[g][i + e];
                            a += qv.x * kf[e] + qv.y * kf[e + 1] + qv.z * kf[e + 2] + qv.w * kf[e + 3];
                        }
                        z[g] = a;
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < GM; g++)
            if (g < G) ps[g][tid] = slot >= 0 ? z[g] * ks : -INFINITY;
        __syncthreads();
        /* softmax: warp owns heads warp, warp + NW, ... */
        for (int g = warp; g < G; g += NW) {
            float v[DH / 32], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < DH / 32; i++) v[i] = ps[g][lane + 32 * i], mx = fmaxf(mx, v[i]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mold = mh[g], mnew = fmaxf(mold, mx), sum = 0.f;
#pragma unroll
            for (int i = 0; i < DH / 32; i++) {
                float p = v[i] == -INFINITY ? 0.f : expf(v[i] - mnew);
                ps[g][lane + 32 * i] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                float c = mold == -INFINITY ? 0.f : expf(mold - mnew);
                cr[g] = c;
                lh[g] = lh[g] * c + sum;
                mh[g] = mnew;
            }
        }
        __syncthreads();
        /* values: warp takes keys warp, warp + NW, ...; lane the dims lane * DPL .. + DPL */
#pragma unroll
        for (int g = 0; g < GM; g++)
            if (g < G) {
                float c = cr[g];
#pragma unroll
                for (int e = 0; e < DPL; e++) acc[g][e] *= c;
            }
        int cnt = je - j0 < DH ? je - j0 : DH;
        for (int jj = warp; jj < cnt; jj += NW) {
            float vf[DPL];
            kv_load<DT, DPL>(vf, cache + sl[jj] * row + voff + (int64_t)lane * DPL * ESZ);
#pragma unroll
            for (int g = 0; g < GM; g++)
                if (g < G) {
                    float p = ps[g][jj];
#pragma unroll
                    for (int e = 0; e < DPL; e++) acc[g][e] += p * vf[e];
                }
        }
        __syncthreads();
    }
    /* the warps' sums into qs (no longer needed), one warp after the other */
    for (int w = 0; w < NW; w++) {
        if (warp == w)
#pragma unroll
            for (int g = 0; g < GM; g++)
                if (g < G)
#pragma unroll
                    for (int e = 0; e < DPL; e++) {
                        float *d = &qs[g][lane * DPL + e];
                        *d = (w ? *d : 0.f) + acc[g][e];
                    }
        __syncthreads();
    }
    for (int i = tid; i < G * DH; i += DH) {
        int g = i / DH, d = i % DH, h = kh * G + g;
        float a = qs[g][d] * vs;
        if (S == 1) out[((int64_t)t * H + h) * DH + d] = lh[g] > 0.f ? a / lh[g] : 0.f;
        else part[(((int64_t)t * S + sp) * H + h) * DH + d] = a;
    }
    if (S > 1 && tid < G) {
        float *o = ml + (((int64_t)t * S + sp) * H + kh * G + tid) * 2;
        o[0] = mh[tid];
        o[1] = lh[tid];
    }
}

/* block (token, head): the splits' partials rescaled to their common max, added, normalised */
static __global__ void gqa_combine_kernel(float *out, const float *part, const float *ml, int H, int Dh, int S)
{
    int t = blockIdx.x, h = blockIdx.y;
    float M = -INFINITY, L = 0.f;
    for (int sp = 0; sp < S; sp++) {
        const float *o = ml + (((int64_t)t * S + sp) * H + h) * 2;
        if (o[1] > 0.f) M = fmaxf(M, o[0]);
    }
    for (int sp = 0; sp < S; sp++) {
        const float *o = ml + (((int64_t)t * S + sp) * H + h) * 2;
        if (o[1] > 0.f) L += o[1] * expf(o[0] - M);
    }
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float a = 0.f;
        for (int sp = 0; sp < S; sp++) {
            const float *o = ml + (((int64_t)t * S + sp) * H + h) * 2;
            if (o[1] > 0.f) a += part[(((int64_t)t * S + sp) * H + h) * Dh + d] * expf(o[0] - M);
        }
        out[((int64_t)t * H + h) * Dh + d] = L > 0.f ? a / L : 0.f;
    }
}

/* The head shapes with an instance: head dim 64 (up to 16 query heads a KV head), 128 (16) or
 * 256 (8): GM x DH / 32 accumulators a thread. */
static int gqa_gm(int Dh) { return Dh == 64 || Dh == 128 ? 16 : Dh == 256 ? 8 : 0; }

extern "C" int gqa_supported(const ModelConfig *c, const KVLayer *kv)
{
    int Dh = c->head_dim, Hkv = c->n_kv_heads, G = Hkv > 0 ? c->n_heads / Hkv : 0, gm = gqa_gm(Dh);
    if (!gm || G < 1 || G > gm || c->n_heads % Hkv) return 0;
    if (!kv) return 1;
    size_t esz = kv_elem_size(kv->dtype);
    /* 16-byte loads of K rows, and of a lane's V dims */
    return (uintptr_t)kv->kv % 16 == 0 && ((size_t)kv->kv_width * esz) % 16 == 0 && ((size_t)Dh * esz) % 16 == 0;
}

/* splits of a step of T tokens: two waves of blocks over the GPU's SMs */
static int gqa_splits(Backend *be, int T, int Hkv)
{
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    int blocks = T * Hkv, S = (2 * sms + blocks - 1) / blocks;
    return S < 1 ? 1 : S > GQA_MAX_S ? GQA_MAX_S : S;
}

/* the split partials of steps of up to T tokens (cuda_reserve) */
extern "C" void gqa_reserve(Backend *be, const ModelConfig *c, int T)
{
    if (!gqa_supported(c, NULL)) return;
    int64_t rows = 0;
    for (int n = 1; n <= T; n++) {
        int S = gqa_splits(be, n, c->n_kv_heads);
        if (S > 1 && (int64_t)S * n > rows) rows = (int64_t)S * n;
        if (S == 1) break; /* more tokens split no more */
    }
    if (rows) cuda_scratch(be, SCR_GQA_PART, (size_t)rows * c->n_heads * (c->head_dim + 2) * 4);
}

template <int DH, int GM>
static void gqa_launch(Backend *be, dim3 grid, float *out, float *part, float *ml, const float *q, const KVLayer *kv,
                       const Batch *b, const ModelConfig *c, int S)
{
    cudaStream_t st = cuda_stream(be);
    const uint8_t *cache = (const uint8_t *)kv->kv;
#define GQA_ARGS                                                                                                       \
    out, part, ml, q, cache, kv->k_scale, kv->v_scale, kv->kv_width, kv->block_size, b->seq, b->pos, b->block_table,   \
        b->bt_stride, c->n_heads, c->n_kv_heads, c->attn_scale, S
    switch (kv->dtype) {
    case KV_DTYPE_FP8: gqa_kernel<DH, GM, KV_DTYPE_FP8><<<grid, DH, 0, st>>>(GQA_ARGS); break;
    case KV_DTYPE_BF16: gqa_kernel<DH, GM, KV_DTYPE_BF16><<<grid, DH, 0, st>>>(GQA_ARGS); break;
    default: gqa_kernel<DH, GM, KV_DTYPE_F32><<<grid, DH, 0, st>>>(GQA_ARGS); break;
    }
#undef GQA_ARGS
    LAUNCH_CHECK("gqa_kernel");
}

/* Returns 0 (nothing launched) where the shapes have no instance: the caller's general kernel. */
extern "C" int gqa_attention_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                                  const ModelConfig *c)
{
    if (!gqa_supported(c, kv)) return 0;
    int T = b->n_tokens, H = c->n_heads, Hkv = c->n_kv_heads, Dh = c->head_dim;
    if (!T) return 1;
    int S = gqa_splits(be, T, Hkv);
    float *part = NULL, *ml = NULL;
    if (S > 1) {
        part = (float *)cuda_scratch(be, SCR_GQA_PART, (size_t)S * T * H * (Dh + 2) * 4);
        ml = part + (size_t)S * T * H * Dh;
    }
    dim3 grid(T, Hkv, S);
    if (Dh == 64) gqa_launch<64, 16>(be, grid, out, part, ml, q, kv, b, c, S);
    else if (Dh == 128) gqa_launch<128, 16>(be, grid, out, part, ml, q, kv, b, c, S);
    else gqa_launch<256, 8>(be, grid, out, part, ml, q, kv, b, c, S);
    if (S > 1) {
        gqa_combine_kernel<<<dim3(T, H), Dh, 0, cuda_stream(be)>>>(out, part, ml, H, Dh, S);
        LAUNCH_CHECK("gqa_combine_kernel");
    }
    return 1;
}

/* ---- the general kernel ---- */

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
    if (!b->n_tokens || gqa_attention_cuda(be, out, q, kv, b, c)) return;
    if (c->head_dim > ATT_THREADS) die("attention_gqa_cuda: head_dim %d > %d", c->head_dim, ATT_THREADS);
    dim3 grid(b->n_tokens, c->n_heads);
    attention_gqa_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->v_scale, kv->kv_width, kv->block_size, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->n_kv_heads, c->head_dim, c->attn_scale);
    LAUNCH_CHECK("attention_gqa_kernel");
}
