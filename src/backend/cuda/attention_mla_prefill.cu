/* attention_mla_prefill: MLA attention in the expanded form on the GPU (GLM-5 prefill, model/mla.c;
 * the twins of kv_gather_cpu and attention_mla_piece_cpu): kv_gather_kernel decodes a piece of a
 * sequence's cache rows to float32, kv_b_proj expands them (matmul_cuda), and a piece kernel folds
 * the piece into each (query, head)'s online softmax, kept across pieces in st and out. The piece
 * kernels, chosen by attention_mla_piece_cuda (mla_prefill_kind): mla_prefill_tc128_staged_kernel
 * (the keys and values as BF16 halves staged by cp.async, 128 queries a block; where its 198 KB of
 * shared memory fit), mla_prefill_tc_kernel (the same maths staging float rows, 64 queries a block,
 * or 48 for the GPUs of 99-101 KB) and mla_prefill_f32_kernel (a thread per key, float32; head
 * shapes without a tensor-core instance). */
#include "attention.cuh"

/* block i: row j0 + i of the sequence; thread k owns columns k, k + blockDim, ... */
static __global__ void kv_gather_kernel(float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                                        const int *bt, int bs, int j0)
{
    int p = j0 + blockIdx.x;
    int64_t r0 = ((int64_t)bt[p / bs] * bs + p % bs) * width;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        out[(int64_t)blockIdx.x * n + k] = kv_elem_load(cache, dt, r0 + k, scale);
}

void kv_gather_cuda(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                    const int *bt, int block_size, int j0, int rows)
{
    if (rows <= 0 || n <= 0) return;
    kv_gather_kernel<<<rows, ATT_THREADS, 0, cuda_stream(be)>>>(out, cache, dt, scale, width, n, bt, block_size, j0);
    LAUNCH_CHECK("kv_gather_kernel");
}

/* block (i, h): query t = t0 + i, head h. The piece's keys a chunk of blockDim at a time: thread
 * j scores key j of the chunk (its position from the causal range or from topk[t]); thread owns
 * output dims v = tid + i * blockDim of the accumulator. State (m, l) and accumulator come from
 * st and out (or start empty on the first piece) and go back there (normalised on the last). */
static __global__ void mla_prefill_f32_kernel(float *out, float *st, const float *q, const float *kv,
                                                  const float *kpe, int ldk, int j0, int n, int t0, const int *topk,
                                                  int ktop, int first, int last, const int *pos, int H, int Dn, int Dr,
                                                  int Dv, float scale)
{
    __shared__ float qs[MLA_MAX_DQ], sc[ATT_THREADS], red[32];
    __shared__ int rw[ATT_THREADS];
    int t = t0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int Dq = Dn + Dr, Dkv = Dn + Dv;
    int64_t N = (int64_t)H * Dkv;
    for (int i = tid; i < Dq; i += nt) qs[i] = q[((int64_t)t * H + h) * Dq + i];
    float *o = out + ((int64_t)t * H + h) * Dv, *mls = st + ((int64_t)t * H + h) * 2;
    float m = first ? -INFINITY : mls[0], l = first ? 0.f : mls[1], acc[MLA_MAX_DV / ATT_THREADS];
#pragma unroll
    for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++) acc[i] = !first && tid + i * nt < Dv ? o[tid + i * nt] : 0.f;
    /* candidates: the causal positions j0 .. min(j0 + n, pos + 1) - 1, or the ktop selected */
    int ncand = topk ? ktop : min(n, pos[t] + 1 - j0);
    __syncthreads();
    for (int c0 = 0; c0 < ncand; c0 += nt) {
        int c = c0 + tid, r = -1; /* the piece row this thread scores, -1 none */
        if (c < ncand) {
            if (!topk) r = c;
            else {
                int j = topk[(int64_t)t * ktop + c];
                r = j >= j0 && j < j0 + n ? j - j0 : -1;
            }
        }
        float z = -INFINITY;
        if (r >= 0) {
            const float *k = kv + r * N + (int64_t)h * Dkv, *kp = kpe + (int64_t)r * ldk;
            float d1 = 0.f, d2 = 0.f;
            for (int i = 0; i < Dn; i++) d1 += qs[i] * k[i];
            for (int i = 0; i < Dr; i++) d2 += qs[Dn + i] * kp[i];
            z = (d1 + d2) * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = r >= 0 ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        rw[tid] = r;
        float psum = block_sum(p, red);
        float corr = m == -INFINITY ? 0.f : expf(m - mnew);
        l = l * corr + psum;
#pragma unroll
        for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++) acc[i] *= corr;
        if (mnew != -INFINITY) m = mnew;
        __syncthreads();
        int cnt = min(nt, ncand - c0);
        for (int jj = 0; jj < cnt; jj++) {
            if (rw[jj] < 0) continue;
            const float *v = kv + rw[jj] * N + (int64_t)h * Dkv + Dn;
#pragma unroll
            for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++)
                if (tid + i * nt < Dv) acc[i] += sc[jj] * v[tid + i * nt];
        }
        __syncthreads();
    }
    float inv = last ? (l > 0.f ? 1.f / l : 0.f) : 1.f;
#pragma unroll
    for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++)
        if (tid + i * nt < Dv) o[tid + i * nt] = acc[i] * inv;
    if (tid == 0) {
        mls[0] = m;
        mls[1] = l;
    }
}

/* ---- the expanded form on the tensor cores (mla_prefill_tc_kernel: where the staged kernel's
 * shared memory does not fit) ----
 * Block (query tile, head h): 64 queries of the chunk (4 warps of 16 rows), the piece's keys 16
 * at a time. The queries, keys, probabilities and values enter the MMAs (m16n8k16, float32
 * accumulation) as two BF16 halves each, hi = bf16(x) and lo = bf16(x - hi), and each product as
 * hi x hi + hi x lo + lo x hi: each operand carries ~2^-16 of its value's error (lo's rounding),
 * as the W4A16 GEMMs' split activations do (test_cuda_ops: TOL_SPLIT; the f32 kernel keeps float32).
 * A tile's maths is MlaTcRows's (below, shared with the staged kernel): S = Q K^T, masked (causal, or top-k by
 * the piece's mask from mla_prefill_mask_kernel), the rows' online softmax, P V with V's fragments
 * by ldmatrix.trans. This kernel stages the rows as float4s, several in flight a thread.
 * The rows' state and unnormalised outputs carry across pieces in st and out as in
 * mla_prefill_f32_kernel. */
#define MLA_TC_ROWS 64
#define MLA_TC_KT 16

template <int DQ, int DV, int ROWS = MLA_TC_ROWS>
struct MlaTcSmem {
    static constexpr int QS = DQ + 8;        /* BF16 a query or key row: 16 bytes apart mod 128 */
    static constexpr int VS = DV + 8; /* a key's values (ldmatrix.trans: 8 rows in 8 bank groups) */
    /* the block's whole shared memory, its last 16 bytes the rows' end (s_rend): a static
     * __shared__ beside it would be over a 99 KB GPU's limit at GLM-5's heads (101376 + 4 bytes) */
    static constexpr size_t bytes = 2 * sizeof(__nv_bfloat16) * ((size_t)ROWS * QS + (size_t)MLA_TC_KT * QS + (size_t)MLA_TC_KT * VS) + 16;
};

__device__ __forceinline__ uint32_t pack_bf16(float a, float b, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - __low2float(h), b - __high2float(h));
    lo = *(uint32_t *)&l;
    return *(uint32_t *)&h;
}

/* four floats as BF16 halves: hi and lo, four each, into shared memory (8-byte stores) */
__device__ __forceinline__ void split_store4(float4 f, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    uint32_t l0, l1;
    uint32_t h0 = pack_bf16(f.x, f.y, l0), h1 = pack_bf16(f.z, f.w, l1);
    *(uint2 *)hi = make_uint2(h0, h1);
    *(uint2 *)lo = make_uint2(l0, l1);
}

/* rows x cols floats (cols % 4 == 0) of a source row by row (src(r, c): the float4 at row r,
 * column c) into shared memory as halves, hi[r * ld + c] and lo[...]: U float4 loads in flight
 * a thread before any is converted (one at a time waited a trip to L2 or DRAM per 4 values) */
template <int ROWS, int COLS, int U, typename Src>
__device__ __forceinline__ void stage_halves(__nv_bfloat16 *hi, __nv_bfloat16 *lo, int ld, Src src)
{
    constexpr int C4 = COLS / 4, NQ = ROWS * C4;
    for (int e0 = threadIdx.x; e0 < NQ; e0 += U * blockDim.x) {
        float4 f[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * blockDim.x;
            if (e < NQ) f[u] = src(e / C4, 4 * (e % C4));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * blockDim.x, r = e / C4, c = 4 * (e % C4);
            if (e < NQ) split_store4(f[u], hi + r * ld + c, lo + r * ld + c);
        }
    }
}

__device__ __forceinline__ float4 ldg4(const float *p) { return __ldg((const float4 *)p); }

/* One thread's share of a block's queries in the tensor-core piece kernels, and the maths
 * of a tile of 16 keys on it. The thread holds rows ra (C fragment elements 0, 1) and rb = ra + 8
 * (2, 3) of its warp's 16: their maxima m, sums l (a row's on one lane of its quad until finish
 * adds them up) and unnormalised outputs acc (DV / 8 n8 tiles). q, k, v in shared memory as BF16
 * halves, rows QS = DQ + 8 and VS = DV + 8 apart. */
template <int DQ, int DV>
struct MlaTcRows {
    static constexpr int QS = DQ + 8, VS = DV + 8, NV = DV / 8;
    static_assert(DQ % 16 == 0 && DV % 16 == 0, "MMA shapes, pairs of n8 tiles");
    int ra, rb, pa, pb;
    bool va, vb;
    int64_t ha, hb; /* the rows' (token, head) in q, out, st */
    float m[2], l[2], acc[NV][4];

    /* the rows of block i0 (queries i0.. of a chunk of nt from token t0), head h of H; the state
     * from st and out, or a fresh one when first */
    __device__ __forceinline__ void start(int warp, int g, int t4, int i0, int nt, int t0, int h, int H, const int *pos,
                                          int first, const float *st, const float *out)
    {
        ra = warp * 16 + g, rb = ra + 8;
        va = i0 + ra < nt, vb = i0 + rb < nt;
        pa = va ? pos[t0 + i0 + ra] : -1, pb = vb ? pos[t0 + i0 + rb] : -1;
        ha = (int64_t)(t0 + i0 + (va ? ra : 0)) * H + h, hb = (int64_t)(t0 + i0 + (vb ? rb : 0)) * H + h;
        if (first) {
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.f;
#pragma unroll
            for (int j = 0; j < NV; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            return;
        }
        m[0] = va ? st[ha * 2] : -INFINITY;
        m[1] = vb ? st[hb * 2] : -INFINITY;
        l[0] = va && t4 == 0 ? st[ha * 2 + 1] : 0.f;
        l[1] = vb && t4 == 0 ? st[hb * 2 + 1] : 0.f;
        const float *oa = out + ha * DV, *ob = out + hb * DV;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            float2 x = va ? *(const float2 *)(oa + j * 8 + 2 * t4) : make_float2(0.f, 0.f);
            float2 y = vb ? *(const float2 *)(ob + j * 8 + 2 * t4) : make_float2(0.f, 0.f);
            acc[j][0] = x.x, acc[j][1] = x.y, acc[j][2] = y.x, acc[j][3] = y.y;
        }
    }

    /* keys k0..k0+15 of the piece (n keys from position j0): S = Q K^T on the C fragments (three
     * MMAs a product of halves), masked (top-k: the key's bit in the query's row of mask; causal:
     * position <= the query's), folded into the online softmax; P (C fragments, the A fragments of
     * P V) times V, its B fragments by ldmatrix.trans: lanes 0-15 give the 16 keys' rows at n8 tile
     * j's columns, lanes 16-31 at tile j + 1's */
    __device__ __forceinline__ void tile(const __nv_bfloat16 *qh, const __nv_bfloat16 *ql, const __nv_bfloat16 *kh,
                                         const __nv_bfloat16 *kl, const __nv_bfloat16 *vh, const __nv_bfloat16 *vl,
                                         int warp, int lane, int k0, int n, int j0, const uint32_t *mask, int mw, int i0,
                                         float scale)
    {
        const int g = lane >> 2, t4 = lane & 3;
        float s[2][4] = {};
#pragma unroll 4
        for (int kk = 0; kk < DQ; kk += 16) {
            const __nv_bfloat16 *qa = qh + (warp * 16 + g) * QS + kk + 2 * t4, *qb = ql + (warp * 16 + g) * QS + kk + 2 * t4;
            uint32_t ah[4] = {*(const uint32_t *)qa, *(const uint32_t *)(qa + 8 * QS), *(const uint32_t *)(qa + 8),
                              *(const uint32_t *)(qa + 8 * QS + 8)};
            uint32_t al[4] = {*(const uint32_t *)qb, *(const uint32_t *)(qb + 8 * QS), *(const uint32_t *)(qb + 8),
                              *(const uint32_t *)(qb + 8 * QS + 8)};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const __nv_bfloat16 *ka = kh + (j * 8 + g) * QS + kk + 2 * t4, *kb = kl + (j * 8 + g) * QS + kk + 2 * t4;
                uint32_t bh0 = *(const uint32_t *)ka, bh1 = *(const uint32_t *)(ka + 8);
                uint32_t bl0 = *(const uint32_t *)kb, bl1 = *(const uint32_t *)(kb + 8);
                mma_bf16(s[j], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
                mma_bf16(s[j], ah[0], ah[1], ah[2], ah[3], bl0, bl1);
                mma_bf16(s[j], al[0], al[1], al[2], al[3], bh0, bh1);
            }
        }
        /* masked scores; the rows' new maxima over the quad */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + j * 8 + 2 * t4 + (e & 1), row = e < 2 ? ra : rb;
                bool ok = (e < 2 ? va : vb) && key < n;
                if (ok) ok = mask ? (mask[(int64_t)(i0 + row) * mw + (key >> 5)] >> (key & 31)) & 1u : j0 + key <= (e < 2 ? pa : pb);
                s[j][e] = ok ? s[j][e] * scale : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            corr[r] = m[r] == -INFINITY ? 0.f : expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = s[j][e] == -INFINITY ? 0.f : expf(s[j][e] - m[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < NV; j++) acc[j][0] *= corr[0], acc[j][1] *= corr[0], acc[j][2] *= corr[1], acc[j][3] *= corr[1];
        uint32_t pl[4], ph[4] = {pack_bf16(s[0][0], s[0][1], pl[0]), pack_bf16(s[0][2], s[0][3], pl[1]),
                                 pack_bf16(s[1][0], s[1][1], pl[2]), pack_bf16(s[1][2], s[1][3], pl[3])};
        const uint32_t vah = (uint32_t)__cvta_generic_to_shared(vh + (lane & 15) * VS + (lane >> 4) * 8);
        const uint32_t val = (uint32_t)__cvta_generic_to_shared(vl + (lane & 15) * VS + (lane >> 4) * 8);
#pragma unroll
        for (int j = 0; j < NV; j += 2) {
            uint32_t bh[4], bl[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bh[0]), "=r"(bh[1]), "=r"(bh[2]), "=r"(bh[3]) : "r"(vah + j * 16));
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bl[0]), "=r"(bl[1]), "=r"(bl[2]), "=r"(bl[3]) : "r"(val + j * 16));
#pragma unroll
            for (int u = 0; u < 2; u++) {
                mma_bf16(acc[j + u], ph[0], ph[1], ph[2], ph[3], bh[2 * u], bh[2 * u + 1]);
                mma_bf16(acc[j + u], ph[0], ph[1], ph[2], ph[3], bl[2 * u], bl[2 * u + 1]);
                mma_bf16(acc[j + u], pl[0], pl[1], pl[2], pl[3], bh[2 * u], bh[2 * u + 1]);
            }
        }
    }

    /* the rows' sums over the quad; out (normalised when last) and st */
    __device__ __forceinline__ void finish(int t4, int last, float *out, float *st)
    {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const float ia = last ? (l[0] > 0.f ? 1.f / l[0] : 0.f) : 1.f, ib = last ? (l[1] > 0.f ? 1.f / l[1] : 0.f) : 1.f;
        float *oa = out + ha * DV, *ob = out + hb * DV;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            if (va) *(float2 *)(oa + j * 8 + 2 * t4) = make_float2(acc[j][0] * ia, acc[j][1] * ia);
            if (vb) *(float2 *)(ob + j * 8 + 2 * t4) = make_float2(acc[j][2] * ib, acc[j][3] * ib);
        }
        if (t4 == 0) {
            if (va) st[ha * 2] = m[0], st[ha * 2 + 1] = l[0];
            if (vb) st[hb * 2] = m[1], st[hb * 2 + 1] = l[1];
        }
    }
};

template <int DQ, int DV, int ROWS>
static __global__ void __launch_bounds__(ROWS * 2, 1) mla_prefill_tc_kernel(
    float *out, float *st, const float *q, const float *kv, const float *kpe, int ldk, int j0, int n, int t0, int nt,
    const uint32_t *mask, int mw, int first, int last, const int *pos, int H, int Dn, float scale)
{
    using L = MlaTcSmem<DQ, DV, ROWS>;
    constexpr int QS = L::QS, VS = L::VS, KT = MLA_TC_KT;
    static_assert(ROWS % 16 == 0, "16 queries a warp");
    static_assert(QS == MlaTcRows<DQ, DV>::QS && VS == MlaTcRows<DQ, DV>::VS, "one layout");
    extern __shared__ __align__(16) uint8_t mla_tc_raw[];
    __nv_bfloat16 *qh = (__nv_bfloat16 *)mla_tc_raw, *ql = qh + ROWS * QS, *kh = ql + ROWS * QS,
                  *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
    int &s_rend = *(int *)(mla_tc_raw + L::bytes - 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int i0 = blockIdx.x * ROWS, h = blockIdx.y, Dkv = Dn + DV;
    const int64_t N = (int64_t)H * Dkv;
    /* the block's queries, as halves (rows past the chunk repeat its last); the keys and values
     * below with 4 loads in flight, not 8, beside the 128 registers of the accumulators */
    stage_halves<ROWS, DQ, 8>(qh, ql, QS, [&](int r, int k) { return ldg4(q + ((int64_t)(t0 + min(i0 + r, nt - 1)) * H + h) * DQ + k); });
    if (tid == 0) s_rend = 0;
    __syncthreads();
    /* the piece's rows any query of the block may take: causal, up to the latest position */
    if (tid < ROWS && i0 + tid < nt) atomicMax(&s_rend, mask ? n : max(0, min(n, pos[t0 + i0 + tid] + 1 - j0)));
    MlaTcRows<DQ, DV> rw;
    rw.start(warp, g, t4, i0, nt, t0, h, H, pos, first, st, out);
    __syncthreads();
    const int rend = s_rend;
    for (int k0 = 0; k0 < rend; k0 += KT) {
        if (mask) { /* a tile none of the block's queries selected: skipped */
            int any = 0;
            if (tid < ROWS && i0 + tid < nt) any = (mask[(int64_t)(i0 + tid) * mw + (k0 >> 5)] >> (k0 & 31)) & 0xffffu;
            if (!__syncthreads_or(any)) continue;
        }
        __syncthreads(); /* the last tile's keys and values are read */
        stage_halves<KT, DQ, 4>(kh, kl, QS, [&](int r, int k) { /* keys [k_nope | k_pe] (Dn % 4 == 0) */
            const int j = k0 + r;
            return j >= n ? make_float4(0.f, 0.f, 0.f, 0.f)
                   : k < Dn ? ldg4(kv + j * N + (int64_t)h * Dkv + k) : ldg4(kpe + (int64_t)j * ldk + (k - Dn));
        });
        stage_halves<KT, DV, 4>(vh, vl, VS, [&](int r, int d) { /* values */
            const int j = k0 + r;
            return j >= n ? make_float4(0.f, 0.f, 0.f, 0.f) : ldg4(kv + j * N + (int64_t)h * Dkv + Dn + d);
        });
        __syncthreads();
        rw.tile(qh, ql, kh, kl, vh, vl, warp, lane, k0, n, j0, mask, mw, i0, scale);
    }
    rw.finish(t4, last, out, st);
}

/* ---- mla_prefill_tc128_staged_kernel: the keys and values as BF16 halves in global memory,
 * staged by cp.async ----
 * mla_prefill_halves_kernel writes the piece's keys [k_nope | k_pe] and values of every head once as
 * BF16 halves (hi row, then lo row; the rows 16-byte aligned), so that the attention kernel stages a
 * tile of keys by 16-byte cp.async copies that need no registers: the next tile's copies are in
 * flight while the MMAs of this one run (two stages, one barrier a tile), where mla_prefill_tc_kernel
 * waits for its loads and conversions before every tile. A block takes 128 queries (8 warps) of one
 * head, so each staged tile feeds twice its MMAs. The tiles the block runs are listed first: every
 * tile up to the block's latest position (causal), or (top-k) the tiles whose 16 keys hold a bit of
 * any of the block's queries, from the piece's mask. The maths of a tile is MlaTcRows's. */
#define MLA_STAGED_ROWS 128

template <int DQ, int DV>
struct MlaStagedSmem {
    static constexpr int QS = DQ + 8, VS = DV + 8; /* rows 16 bytes apart mod 128 */
    static constexpr size_t stage = 2 * sizeof(__nv_bfloat16) * (size_t)MLA_TC_KT * (QS + VS);
    /* the queries, two stages, the tile bitmap (64 words) and the rows' end (16 bytes): the whole
     * block's shared memory, nothing static beside it */
    static constexpr size_t bytes = 2 * sizeof(__nv_bfloat16) * (size_t)MLA_STAGED_ROWS * QS + 2 * stage + 64 * 4 + 16;
};

/* kh2[(j H + h) 2 DQ ..] = the hi then lo halves of key j of head h ([k_nope | k_pe]), vh2 its
 * values' (2 DV); a warp a (key, head) row */
template <int DQ, int DV>
static __global__ void mla_prefill_halves_kernel(__nv_bfloat16 *kh2, __nv_bfloat16 *vh2, const float *kv, const float *kpe,
                                               int ldk, int n, int H, int Dn)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (int64_t)n * H) return;
    const int j = (int)(row / H), Dkv = Dn + DV;
    const float *src = kv + row * Dkv;
    __nv_bfloat16 *kd = kh2 + row * 2 * DQ, *vd = vh2 + row * 2 * DV;
    for (int c = 4 * lane; c < DQ; c += 128) {
        float4 f = c < Dn ? ldg4(src + c) : ldg4(kpe + (int64_t)j * ldk + (c - Dn));
        split_store4(f, kd + c, kd + DQ + c);
    }
    for (int c = 4 * lane; c < DV; c += 128) split_store4(ldg4(src + Dn + c), vd + c, vd + DV + c);
}

/* 16 bytes by cp.async, or zeros where !ok (src-size 0) */
__device__ __forceinline__ void cp_async16_z(void *smem, const void *gmem, bool ok)
{
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0));
}

template <int DQ, int DV>
static __global__ void __launch_bounds__(256, 1) mla_prefill_tc128_staged_kernel(
    float *out, float *st, const float *q, const __nv_bfloat16 *kh2, const __nv_bfloat16 *vh2, int j0, int n, int t0,
    int nt, const uint32_t *mask, int mw, int first, int last, const int *pos, int H, float scale)
{
    using L = MlaStagedSmem<DQ, DV>;
    constexpr int QS = L::QS, VS = L::VS, KT = MLA_TC_KT, ROWS = MLA_STAGED_ROWS;
    static_assert(QS == MlaTcRows<DQ, DV>::QS && VS == MlaTcRows<DQ, DV>::VS, "one layout");
    extern __shared__ __align__(16) uint8_t mla_staged_raw[];
    __nv_bfloat16 *qh = (__nv_bfloat16 *)mla_staged_raw, *ql = qh + ROWS * QS, *stg = ql + ROWS * QS;
    /* the tiles the block runs: a bit a tile of 16 keys (n <= 4096: 256 tiles, 8 words) */
    uint32_t *tiles = (uint32_t *)(mla_staged_raw + L::bytes - 16 - 64 * 4);
    int &s_rend = *(int *)(mla_staged_raw + L::bytes - 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int i0 = blockIdx.x * ROWS, h = blockIdx.y;
    const int ntile = (n + KT - 1) / KT;
    if (tid < 64) tiles[tid] = 0;
    if (tid == 0) s_rend = 0;
    stage_halves<ROWS, DQ, 4>(qh, ql, QS, [&](int r, int k) { return ldg4(q + ((int64_t)(t0 + min(i0 + r, nt - 1)) * H + h) * DQ + k); });
    __syncthreads();
    if (mask) { /* each (query, word of 32 keys) of the block: its two tiles' bits */
        const int nq = min(ROWS, nt - i0);
        for (int e = tid; e < nq * mw; e += blockDim.x) {
            const int r = e / mw, w = e - r * mw;
            const uint32_t b = mask[(int64_t)(i0 + r) * mw + w];
            if (b & 0xffffu) atomicOr(&tiles[(2 * w) >> 5], 1u << ((2 * w) & 31));
            if (b >> 16) atomicOr(&tiles[(2 * w + 1) >> 5], 1u << ((2 * w + 1) & 31));
        }
    } else if (tid < ROWS && i0 + tid < nt) {
        atomicMax(&s_rend, max(0, min(n, pos[t0 + i0 + tid] + 1 - j0)));
    }
    __syncthreads();
    const int tend = mask ? ntile : (s_rend + KT - 1) / KT;
    /* the first tile at or after k (of the block's list), tend if none */
    auto next = [&](int k) {
        if (!mask) return k < tend ? k : tend;
        for (; k < tend; k++) {
            const uint32_t w = tiles[k >> 5] >> (k & 31);
            if (w) return k + __ffs(w) - 1 < tend ? k + __ffs(w) - 1 : tend;
            k |= 31;
        }
        return tend;
    };
    /* tile kt's keys and values into stage s: 16 rows of 2 DQ + 2 DV halves, 16 bytes a copy */
    auto issue = [&](int kt, int s) {
        __nv_bfloat16 *kh = stg + (size_t)s * (L::stage / 2), *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
        constexpr int CK = 2 * DQ / 8, CV = 2 * DV / 8; /* copies a key row, a value row */
        for (int c = tid; c < KT * (CK + CV); c += blockDim.x) {
            const int r = c / (CK + CV), w = c - r * (CK + CV), j = kt * KT + r;
            const bool ok = j < n;
            const int64_t jr = (int64_t)(ok ? j : 0) * H + h;
            if (w < CK) {
                const int hf = w / (DQ / 8), col = (w - hf * (DQ / 8)) * 8;
                cp_async16_z((hf ? kl : kh) + r * QS + col, kh2 + jr * 2 * DQ + w * 8, ok);
            } else {
                const int u = w - CK, hf = u / (DV / 8), col = (u - hf * (DV / 8)) * 8;
                cp_async16_z((hf ? vl : vh) + r * VS + col, vh2 + jr * 2 * DV + u * 8, ok);
            }
        }
    };
    MlaTcRows<DQ, DV> rw;
    rw.start(warp, g, t4, i0, nt, t0, h, H, pos, first, st, out);
    int kt = next(0), s = 0;
    if (kt < tend) issue(kt, 0);
    cp_async_commit();
    while (kt < tend) {
        cp_async_wait<0>();
        __syncthreads(); /* tile kt has landed in stage s, and every warp is done with stage s ^ 1 */
        const int kn = next(kt + 1);
        if (kn < tend) issue(kn, s ^ 1);
        cp_async_commit();
        const __nv_bfloat16 *kh = stg + (size_t)s * (L::stage / 2), *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
        rw.tile(qh, ql, kh, kl, vh, vl, warp, lane, kt * KT, n, j0, mask, mw, i0, scale);
        kt = kn;
        s ^= 1;
    }
    cp_async_wait<0>();
    rw.finish(t4, last, out, st);
}

/* the piece's top-k mask: bit j - j0 of row i (words of 32 keys) for each selected j of query
 * t0 + i inside the piece; block i, the row's selections over the threads */
static __global__ void mla_prefill_mask_kernel(uint32_t *mask, int mw, const int *topk, int ktop, int t0, int j0, int n)
{
    const int i = blockIdx.x;
    for (int c = threadIdx.x; c < ktop; c += blockDim.x) {
        int j = topk[(int64_t)(t0 + i) * ktop + c] - j0;
        if (j >= 0 && j < n) atomicOr(&mask[(int64_t)i * mw + (j >> 5)], 1u << (j & 31));
    }
}

/* the expanded form's kernel (cuda.h MlaPrefillKernel): the staged kernel where the head shapes
 * have an instance and its shared memory fits (GLM-5's heads: 198 KB), else mla_prefill_tc_kernel
 * with 64 queries a block (101 KB), or 48 (84 KB: the GPUs of 99-101 KB), else the f32 kernel;
 * MOESERVE_MLA_PIECE_KERNEL=tc or f32 starts the list there. The budget is w4_smem_budget's (a
 * test may lower it). */
static int mla_prefill_kind(Backend *be, int Dq, int Dv)
{
    const long start = knob_get(KNOB_MLA_PIECE_KERNEL); /* auto|tc|f32 */
    if (start == 2) return MLA_PREFILL_F32;
    /* GLM-5's heads (192 + 64, 256), DeepSeek-V3's (128 + 64, 128), the fixtures' (32 + 16, 32) */
    const int known = (Dq == 256 && Dv == 256) || (Dq == 192 && Dv == 128) || (Dq == 48 && Dv == 32);
    if (!known) return MLA_PREFILL_F32;
    const size_t budget = w4_smem_budget(cuda_state(be)->device);
    if (start == 0) {
        size_t smem = Dq == 256 ? MlaStagedSmem<256, 256>::bytes : Dq == 192 ? MlaStagedSmem<192, 128>::bytes : MlaStagedSmem<48, 32>::bytes;
        if (smem <= budget) return MLA_PREFILL_TC128_STAGED;
    }
    size_t s64 = Dq == 256 ? MlaTcSmem<256, 256>::bytes : Dq == 192 ? MlaTcSmem<192, 128>::bytes : MlaTcSmem<48, 32>::bytes;
    size_t s48 = Dq == 256 ? MlaTcSmem<256, 256, 48>::bytes : Dq == 192 ? MlaTcSmem<192, 128, 48>::bytes : MlaTcSmem<48, 32, 48>::bytes;
    return s64 <= budget ? MLA_PREFILL_TC64 : s48 <= budget ? MLA_PREFILL_TC48 : MLA_PREFILL_F32;
}

extern "C" int cuda_mla_piece_kernel(Backend *be, const ModelConfig *c)
{
    return mla_prefill_kind(be, c->qk_nope_dim + c->qk_rope_dim, c->v_head_dim);
}

/* the staged kernel's halves of a piece of up to `rows` positions (cuda_reserve) */
void mla_prefill_reserve(Backend *be, const ModelConfig *c, int rows)
{
    const int Dq = c->qk_nope_dim + c->qk_rope_dim, Dv = c->v_head_dim;
    if (rows > 0 && mla_prefill_kind(be, Dq, Dv) == MLA_PREFILL_TC128_STAGED)
        cuda_scratch(be, SCR_MLA_HALVES, (size_t)rows * c->n_heads * (Dq + Dv) * 4);
}

template <int DQ, int DV, int ROWS>
static void mla_prefill_tc_launch(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                                int ldk, int j0, int n, int t0, int nt, const uint32_t *mask, int mw, int first, int last,
                                const Batch *b, const ModelConfig *c)
{
    const size_t smem = MlaTcSmem<DQ, DV, ROWS>::bytes;
    static int ready;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_tc_kernel<DQ, DV, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        ready = 1;
    }
    dim3 grid(cdiv(nt, ROWS), c->n_heads);
    mla_prefill_tc_kernel<DQ, DV, ROWS><<<grid, ROWS * 2, smem, cuda_stream(be)>>>(
        out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b->pos, c->n_heads, c->qk_nope_dim, c->attn_scale);
    LAUNCH_CHECK("mla_prefill_tc_kernel");
}

template <int DQ, int DV>
static void mla_prefill_staged_launch(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                                int ldk, int j0, int n, int t0, int nt, const uint32_t *mask, int mw, int first, int last,
                                const Batch *b, const ModelConfig *c)
{
    const size_t smem = MlaStagedSmem<DQ, DV>::bytes;
    const int H = c->n_heads;
    static int ready;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_tc128_staged_kernel<DQ, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = 1;
    }
    __nv_bfloat16 *kh2 = (__nv_bfloat16 *)cuda_scratch(be, SCR_MLA_HALVES, (size_t)n * H * (DQ + DV) * 4);
    __nv_bfloat16 *vh2 = kh2 + (size_t)n * H * 2 * DQ;
    const int64_t rows = (int64_t)n * H;
    mla_prefill_halves_kernel<DQ, DV><<<cdiv(rows, 8), 256, 0, cuda_stream(be)>>>(kh2, vh2, kv, kpe, ldk, n, H, c->qk_nope_dim);
    LAUNCH_CHECK("mla_prefill_halves_kernel");
    dim3 grid(cdiv(nt, MLA_STAGED_ROWS), H);
    mla_prefill_tc128_staged_kernel<DQ, DV><<<grid, 256, smem, cuda_stream(be)>>>(out, st, q, kh2, vh2, j0, n, t0, nt, mask, mw,
                                                                              first, last, b->pos, H, c->attn_scale);
    LAUNCH_CHECK("mla_prefill_tc128_staged_kernel");
}

void attention_mla_piece_cuda(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                              int ldk, int j0, int n, int t0, int nt, const int *topk, int ktop, int first, int last,
                              const Batch *b, const ModelConfig *c)
{
    if (nt <= 0) return;
    const int Dq = c->qk_nope_dim + c->qk_rope_dim, Dv = c->v_head_dim;
    /* the tensor-core kernels stage float4s: the rows' starts 16 bytes apart (Dn, the cached row and
     * the expanded row multiples of 4 floats) and the buffers 16-byte aligned */
    const int v4 = c->qk_nope_dim % 4 == 0 && ldk % 4 == 0 && (c->qk_nope_dim + Dv) % 4 == 0 &&
                   (((uintptr_t)q | (uintptr_t)kv | (uintptr_t)kpe) & 15) == 0;
    /* the staged kernel lists the block's tiles in 64 words of 32 (n <= 32768; be_mla_piece: at most 4096) */
    const int kind = v4 ? mla_prefill_kind(be, Dq, Dv) : MLA_PREFILL_F32;
    const int staged = kind == MLA_PREFILL_TC128_STAGED && n <= 64 * 32 * MLA_TC_KT;
    if (kind != MLA_PREFILL_F32) {
        uint32_t *mask = NULL;
        const int mw = cdiv(n, 32);
        if (topk) {
            mask = (uint32_t *)cuda_scratch(be, SCR_MLA_MASK, (size_t)nt * mw * 4);
            CUDA_CHECK(cudaMemsetAsync(mask, 0, (size_t)nt * mw * 4, cuda_stream(be)));
            mla_prefill_mask_kernel<<<nt, ATT_THREADS, 0, cuda_stream(be)>>>(mask, mw, topk, ktop, t0, j0, n);
            LAUNCH_CHECK("mla_prefill_mask_kernel");
        }
        if (staged && Dq == 256) mla_prefill_staged_launch<256, 256>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (staged && Dq == 192) mla_prefill_staged_launch<192, 128>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (staged) mla_prefill_staged_launch<48, 32>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != MLA_PREFILL_TC48 && Dq == 256) mla_prefill_tc_launch<256, 256, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != MLA_PREFILL_TC48 && Dq == 192) mla_prefill_tc_launch<192, 128, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != MLA_PREFILL_TC48) mla_prefill_tc_launch<48, 32, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (Dq == 256) mla_prefill_tc_launch<256, 256, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (Dq == 192) mla_prefill_tc_launch<192, 128, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else mla_prefill_tc_launch<48, 32, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        return;
    }
    if (Dq > MLA_MAX_DQ || Dv > MLA_MAX_DV)
        die("attention_mla_piece_cuda: q head %d / v head %d exceed the kernel's limits %d / %d", Dq, Dv, MLA_MAX_DQ, MLA_MAX_DV);
    dim3 grid(nt, c->n_heads);
    mla_prefill_f32_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, st, q, kv, kpe, ldk, j0, n, t0, topk, ktop, first, last, b->pos, c->n_heads, c->qk_nope_dim,
        c->qk_rope_dim, c->v_head_dim, c->attn_scale);
    LAUNCH_CHECK("mla_prefill_f32_kernel");
}
