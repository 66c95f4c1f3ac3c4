/* w4_streamk: the dense decode GEMM in stream-K form (W4_FAM_STREAMK tiles, dense only; w4_dense.cu
 * runs them where the call suits them, w4_dense_sk). */
#include "w4_launch.cuh"

/* ---- one wave of blocks, contiguous runs of records ----
 * One wave of P blocks of W4_SK_WARPS warps: block b takes the row tiles [b n / P, (b + 1) n / P)
 * of W's n = N / 16 (blocks differ by one row tile at most: ~3% of imbalance on the GLM shapes), and its
 * warps cut the block's records (row tile major, the memory order) into equal contiguous runs, so
 * that no warp waits for a second wave and none idles at the tail. The block first stages its
 * token tile's activation rows whole (up to 8 NT rows x K, BF16 halves) in shared memory, once for
 * all its warps, instead of every warp reading and converting them through L1 (dev/cuda/probe_dense.cu
 * measured the difference: 69-80% of the copy bandwidth at 1 row against mma_8_k4's ~50%). The weights stream
 * through registers one record ahead (w4_load; L1 bypassed; two register sets taking turns). A
 * row tile a warp covers whole is
 * stored at once; one shared by several warps of the block (at most a run's first and last)
 * leaves each warp's sums in shared memory, and after one barrier the warp whose run holds the
 * tile's first record adds the shares in warp order (deterministic) and stores it.
 * KS (w4_sk_ksplit): clusters of S blocks, each cluster the row tiles a block would take, each
 * block of it K part rank (its records, its columns of the rows staged); a block's row tile sums
 * go to its shared memory, and after a cluster barrier each block adds the S parts of its share of
 * the cluster's row tiles in rank order and stores them. */
#define W4_SK_WARPS 16

/* a row tile's sums (acc, a warp's mma layout) for the m valid token slots: slot s, row r (of its
 * 16) to dst[s ld + r], scaled, plus bias[r] (bias: the tile's first, or null) */
template <int NT>
__device__ __forceinline__ void w4_sk_store(float *dst, int ld, const float (&acc)[NT][4], float sc, const float *bias, int m)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int slot = nt * 8 + 2 * t + (e & 1), row = g + 8 * (e >> 1);
            if (slot < m) dst[(size_t)slot * ld + row] = acc[nt][e] * sc + (bias ? bias[row] : 0.f);
        }
}

/* shared memory of a launch: the shares (2 a warp of NT x 4 floats x 32 lanes), then the staged rows */
#define W4_SK_SHARES(NT) ((size_t)W4_SK_WARPS * 2 * (NT) * 4 * 32 * sizeof(float))

/* this block's place in its cluster (x; 0 outside a cluster launch) and the cluster's size (y; 1) */
__device__ __forceinline__ uint2 cl_place()
{
    uint2 p = make_uint2(0, 1);
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(p.x), "=r"(p.y));
#endif
    return p;
}
/* shared address a of this block -> the same place in block `rank` of the cluster (shared::cluster) */
__device__ __forceinline__ uint32_t cl_map(uint32_t a, unsigned rank)
{
    uint32_t r = a;
#if __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}
__device__ __forceinline__ void cl_st(uint32_t a, uint2 v)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(a), "r"(v.x), "r"(v.y) : "memory");
#endif
}
__device__ __forceinline__ float cl_ldf(uint32_t a)
{
    float v = 0.f;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ void cl_arrive_relaxed()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_arrive()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive;" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;" ::: "memory");
#endif
}

/* The block's m activation rows x[m0 ..] into shared memory xs (row stride XS): BF16 hi halves, then
 * (SP) the lo halves m rows further; 8 float4 loads in flight a thread before any is converted
 * (a loop of one load at a time waited an L2 round trip per 4 values: 24 of them at 8 rows). In a
 * cluster of ncl blocks (the same token tile), block `rank` reads and converts only columns
 * [rank K / ncl, (rank + 1) K / ncl) and stores them into every block's xs (distributed shared
 * memory; xsp[p]: block p's xs as a shared::cluster address): each block reads 1 / ncl of the
 * rows from L2 (every block of the wave needs all of them: 8 rows of K = 6144 floats are 26 MB
 * of L2 reads for 132 blocks, that no weight load overlaps but the first record). */
template <bool SP, bool CL>
__device__ __forceinline__ void w4_sk_stage(__nv_bfloat16 *xs, const uint32_t *xsp, int XS, const float *x, int ldx, int m0, int m,
                                            int K, unsigned rank, unsigned ncl, int kx = 0)
{
    const bool v4 = (ldx & 3) == 0 && ((uintptr_t)x & 15) == 0;
    if (!CL) rank = 0, ncl = 1;
    const int Kq = CL ? K / (4 * (int)ncl) : K / 4, kc0 = (int)rank * 4 * Kq; /* this block's columns, in groups of 4 */
    x += kx; /* (K split) the block's columns start at kx of x; xs holds K from its column 0 */
    const int n = m * Kq;
    for (int q0 = threadIdx.x; q0 < n; q0 += 8 * blockDim.x) {
        float4 f[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = q0 + u * blockDim.x;
            if (q >= n) break;
            const float *src = x + (size_t)(m0 + q / Kq) * ldx + kc0 + 4 * (q % Kq);
            if (v4) f[u] = __ldg((const float4 *)src);
            else f[u] = make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = q0 + u * blockDim.x;
            if (q >= n) break;
            int rr = q / Kq, k = kc0 + 4 * (q % Kq);
            __nv_bfloat162 h0 = __floats2bfloat162_rn(f[u].x, f[u].y), h1 = __floats2bfloat162_rn(f[u].z, f[u].w);
            uint2 hv = make_uint2(*(uint32_t *)&h0, *(uint32_t *)&h1), lv = hv;
            if (SP) {
                __nv_bfloat162 l0 = __floats2bfloat162_rn(f[u].x - __low2float(h0), f[u].y - __high2float(h0));
                __nv_bfloat162 l1 = __floats2bfloat162_rn(f[u].z - __low2float(h1), f[u].w - __high2float(h1));
                lv = make_uint2(*(uint32_t *)&l0, *(uint32_t *)&l1);
            }
            if (!CL) {
                *(uint2 *)(xs + (size_t)rr * XS + k) = hv;
                if (SP) *(uint2 *)(xs + (size_t)(m + rr) * XS + k) = lv;
            } else {
#pragma unroll
                for (int p = 0; p < 4; p++) /* constant indices: xsp stays in registers */
                    if (p < (int)ncl) {
                        cl_st(xsp[p] + 2u * (uint32_t)(rr * XS + k), hv);
                        if (SP) cl_st(xsp[p] + 2u * (uint32_t)((m + rr) * XS + k), lv);
                    }
            }
        }
    }
}

/* PDL: launched with programmatic stream serialization (w4_sk_pdl), the kernel may start while
 * the one before it in the stream finishes: the first records are loaded before waiting for
 * it (griddepcontrol.wait; the weights are constant), the activations and the outputs after. */
template <int NT, bool SP, bool PK, bool CL, bool KS = false>
static __global__ void __launch_bounds__(W4_SK_WARPS * 32, 1) w4_dense_sk_kernel(float *out, int ldo, const float *x, int ldx,
                                                                                int T, QTensor w, const float *bias)
{
    extern __shared__ __align__(16) float w4_sks[];
    static_assert(!PK || (NT == 1 && SP), "packed halves: one n8 tile of split activations");
    static_assert(!(CL && KS), "a cluster stages the rows together (CL) or splits K (KS)");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const uint2 place = CL || KS ? cl_place() : make_uint2(0, 1); /* CL, KS: launched in clusters */
    const unsigned ncl = place.y, rank = place.x;
    /* KS: the ncl blocks of a cluster take the same row tiles, block `rank` the K part rank of ncl
     * (gk of each row tile's ng record groups); record j of the block's own numbering (row tile
     * major over its gk) is W's record (j / gk) ng + rank gk + j % gk */
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG, S = KS ? (int)ncl : 1, gk = ng / S, kr = KS ? (int)rank : 0;
    const int XS = K / S + 8; /* rows 16 bytes apart mod 128 */
    const int nb = (int)gridDim.x / S, bi = (int)blockIdx.x / S; /* the block (KS: the cluster) among them */
    const int tb0 = (int)((int64_t)bi * (N / 16) / nb), tb1 = (int)((int64_t)(bi + 1) * (N / 16) / nb);
    const int rb0 = tb0 * gk, Rb = (tb1 - tb0) * gk; /* the block's records */
    const int r0 = rb0 + warp * Rb / W4_SK_WARPS, r1 = rb0 + (warp + 1) * Rb / W4_SK_WARPS;
    const int m0 = blockIdx.y * 8 * NT, m = min(8 * NT, T - m0);
    auto recp = [&](int j) {
        if constexpr (!KS) {
            return w.data + (size_t)j * W4_REC;
        } else {
            int i = j / gk;
            return w.data + ((size_t)i * ng + kr * gk + (j - i * gk)) * W4_REC;
        }
    };
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(w4_sks + W4_SK_SHARES(NT) / sizeof(float));
    /* KS: the block's sums of each of its row tiles, [row tile - tb0][8 NT token slots][16 rows], after the rows */
    float *part = (float *)(xs + (((size_t)m * XS * (SP ? 2 : 1) + 7) & ~(size_t)7));
    if (CL && ncl > 1) cl_arrive_relaxed(); /* this block has started (its peers write into its xs) */
    W4Frag nxt;
    if (r0 < r1) w4_load(nxt, recp(r0), lane); /* in flight while the rows are staged */
    pdl_wait();    /* the kernel before: done, visible */
    pdl_trigger(); /* the next may take SMs as they free (it waits for this grid's end itself) */
    uint32_t xsp[4] = {0, 0, 0, 0}; /* xs in each block of the cluster */
    if (CL && ncl > 1) {
        const uint32_t xa = (uint32_t)__cvta_generic_to_shared(xs);
#pragma unroll
        for (unsigned p = 0; p < 4; p++)
            if (p < ncl) xsp[p] = cl_map(xa, p);
        cl_wait(); /* every block of the cluster has started */
    }
    if (CL && ncl > 1) { /* every block's share of the rows has landed in every xs */
        w4_sk_stage<SP, true>(xs, xsp, XS, x, ldx, m0, m, K, rank, ncl);
        cl_arrive();
        cl_wait();
    } else {
        w4_sk_stage<SP, false>(xs, xsp, XS, x, ldx, m0, m, K / S, 0, 1, kr * gk * W4_KG);
        __syncthreads();
    }
    const int ntv = (m + 7) / 8;
    const __nv_bfloat16 *xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) /* PK: lanes of g 4..7 read the low halves (w4_packs) */
        xr[nt] = xs + (size_t)(PK ? (g < 4 ? min(g, m - 1) : m + min(g - 4, m - 1)) : min(nt * 8 + g, m - 1)) * XS + t * 16;
    const size_t lo = (size_t)m * XS;
    const float sc = w.gscale * 512.f;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    int i = r0 / gk, G = r0 - i * gk;
    /* row tile it's sums: to out (scaled, the bias added), or (KS) to part, as they are */
    auto put = [&](const float (&a)[NT][4], int it) {
        if constexpr (KS) w4_sk_store<NT>(part + (size_t)(it - tb0) * 8 * NT * 16, 16, a, 1.f, nullptr, m);
        else w4_sk_store<NT>(out + (size_t)m0 * ldo + 16 * it, ldo, a, sc, bias ? bias + 16 * it : nullptr, m);
    };
    /* record r from registers cur: its MMAs, and at the end of row tile i its store or share */
    auto step = [&](const W4Frag &cur, int r) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[4][4];
            w4_decode_chunk(cur, c, a);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (nt < ntv)
#pragma unroll
                    for (int h = 0; h < (SP && !PK ? 2 : 1); h++) {
                        const uint4 *p = (const uint4 *)(xr[nt] + h * lo + G * W4_KG + c * 64);
                        w4_mma_chunk(acc[nt], a, p[0], p[1]);
                    }
        }
        if (++G < gk && r + 1 < r1) return;
        if constexpr (PK) w4_fold4(acc[0]);
        /* the end of row tile i in this run: stored if whole, else the warp's share kept */
        if (i * gk >= r0 && (i + 1) * gk <= r1) put(acc, i);
        else {
            float *p = w4_sks + (size_t)(warp * 2 + (i == r0 / gk ? 0 : 1)) * NT * 4 * 32;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) p[(nt * 4 + e) * 32 + lane] = acc[nt][e];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        i++;
        G = 0;
    };
    /* two register sets taking turns (unrolled by 2: no copy of a record between them) */
    W4Frag alt;
    for (int r = r0; r < r1; r += 2) {
        if (r + 1 < r1) w4_load(alt, recp(r + 1), lane);
        step(nxt, r);
        if (r + 1 >= r1) break;
        if (r + 2 < r1) w4_load(nxt, recp(r + 2), lane);
        step(alt, r + 1);
    }
    __syncthreads();
    /* the shared row tile that starts in this run (its last, if shared): the shares of warps
     * warp .. wb in warp order; warp u holds record r of the block iff u = ((r - rb0 + 1) 16 - 1) / Rb.
     * None where the run is empty, or its last row tile starts in an earlier run or ends in this one. */
    const int il = (r1 - 1) / gk;
    if (r0 < r1 && il * gk >= r0 && (il + 1) * gk > r1) {
        const int wb = (int)(((int64_t)((il + 1) * gk - rb0) * W4_SK_WARPS - 1) / Rb);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        for (int u = warp; u <= wb; u++) {
            const int ur0 = rb0 + u * Rb / W4_SK_WARPS;
            if (ur0 == rb0 + (u + 1) * Rb / W4_SK_WARPS) continue; /* a warp with no record (Rb < 16) */
            const float *p = w4_sks + (size_t)(u * 2 + (il == ur0 / gk ? 0 : 1)) * NT * 4 * 32;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[nt][e] += p[(nt * 4 + e) * 32 + lane];
        }
        put(acc, il);
    }
    if constexpr (KS) {
        /* every block's sums of the cluster's row tiles are in its part; block `rank` adds the K
         * parts of its share of the row tiles in rank order (the same result every call), scales,
         * adds the bias and stores; the second barrier keeps each part alive until its readers are done */
        cl_arrive();
        cl_wait();
        const int nr = tb1 - tb0, la = (int)rank * nr / S, lb = ((int)rank + 1) * nr / S, per = m * 16;
        const uint32_t pa = (uint32_t)__cvta_generic_to_shared(part);
        for (int q = threadIdx.x; q < (lb - la) * per; q += blockDim.x) {
            const int li = la + q / per, slot = (q % per) >> 4, row = q & 15;
            const uint32_t off = 4u * (uint32_t)(((size_t)li * 8 * NT + slot) * 16 + row);
            float v = 0.f;
            for (int p = 0; p < S; p++) v += cl_ldf(cl_map(pa + off, (unsigned)p));
            const int n = 16 * (tb0 + li) + row;
            out[(size_t)(m0 + slot) * ldo + n] = v * sc + (bias ? bias[n] : 0.f);
        }
        cl_arrive();
        cl_wait();
    }
}

/* Shared memory of a stream-K launch: the shares, then its token tile's rows (K whole, or its part
 * of ks), as BF16 halves; with K in parts, then the sums of prt row tiles */
static size_t w4_sk_smem(int T, int K, int nt, int split, int ks = 1, int prt = 0)
{
    size_t rows = (size_t)(T < 8 * nt ? T : 8 * nt) * (K / ks + 8) * (split ? 2 : 1); /* BF16 values */
    if (ks == 1) return W4_SK_SHARES(nt) + rows * 2;
    return W4_SK_SHARES(nt) + ((rows + 7) & ~(size_t)7) * 2 + (size_t)prt * 8 * nt * 16 * sizeof(float);
}

/* The blocks of one wave of kernel <NT, SP, PK, cl > 1> with smem bytes of dynamic shared memory, in
 * clusters of cl blocks (its limit raised the first time a call needs it): asked of the runtime
 * once a (size, cluster), not on every eager call (the calls of a model alternate between a few
 * sizes, one per shape). Clusters of 4 need 4 free SMs of one GPC: a wave may leave a few SMs out. */
template <int NT, bool SP, bool PK, bool CL, bool KS = false>
static int w4_sk_blocks(size_t smem, int cl, int sms)
{
    static size_t raised, key[8];
    static int kcl[8], val[8], n;
    for (int k = 0; k < n && k < 8; k++)
        if (key[k] == smem && kcl[k] == cl) return val[k];
    if (smem > raised) {
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_sk_kernel<NT, SP, PK, CL, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        raised = smem;
    }
    int blocks = 0;
    if (cl <= 1) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, w4_dense_sk_kernel<NT, SP, PK, CL, KS>, W4_SK_WARPS * 32, smem));
        blocks *= sms;
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1] = {w4_cluster_attr(cl)};
        cfg.gridDim = dim3(sms / cl * cl, 1, 1);
        cfg.blockDim = dim3(W4_SK_WARPS * 32, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, w4_dense_sk_kernel<NT, SP, PK, CL, KS>, &cfg));
        blocks = clusters * cl;
    }
    key[n % 8] = smem;
    kcl[n % 8] = cl;
    val[n % 8] = blocks;
    n++;
    return blocks;
}

/* Blocks a cluster of the stream-K launch staging T rows of K (twice with split activations):
 * MOESERVE_W4_SK_CLUSTER (1, 2 or 4), else w4_sk_cluster_default (a pair of blocks, a TPC's two
 * SMs, where the staging is large enough to pay for the cluster barrier). */
static int w4_sk_cluster(int T, int K, int split)
{
    static const int by_choice[] = {0, 1, 2, 4}; /* auto|1|2|4 */
    const int v = by_choice[knob_get(KNOB_W4_SK_CLUSTER) & 3];
    return v ? v : w4_sk_cluster_default((long)T * K * (split ? 2 : 1));
}

/* K parts of a stream-K launch (KS: a cluster of that many blocks takes the same row tiles, each
 * block its part of K, staging only its part of the rows; the parts' sums are added through the
 * cluster's shared memory): MOESERVE_W4_SK_KSPLIT (1, 2 or 4), else w4_sk_ksplit_default (fit: the
 * launch with K whole runs). Returns the parts (1: K whole), as many as K's record groups divide
 * into. */
static int w4_sk_ksplit(int nt, int K, int fit)
{
    static const int by_choice[] = {0, 1, 2, 4}; /* auto|1|2|4 */
    int ng = K / W4_KG, s = by_choice[knob_get(KNOB_W4_SK_KSPLIT) & 3];
    if (!s) s = w4_sk_ksplit_default(nt, fit);
    while (s > 1 && ng % s) s /= 2;
    return s;
}

static long w4_sk_count;
extern "C" long w4_sk_calls(void) { return w4_sk_count; }

/* Run stream-K tile `tile` if this call suits it: 1 with the GEMM launched, 0 if not (more rows
 * than two token tiles, rows over the shared memory budget, or fewer row tiles than a wave has
 * blocks: a row tile is never split across blocks). */
int w4_dense_sk(Backend *be, int tile, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                       const float *bias, int split, size_t budget)
{
    int nt = w4_tiles[tile].n8, N = (int)w->rows, K = (int)w->cols, sms = w4_sm_count(be);
    int gy = cdiv(T, 8 * nt);
    /* KS (w4_sk_ksplit): the K parts of a cluster's blocks; each stages its part of the rows and
     * keeps its sums of the cluster's row tiles (room for clusters down to half the SMs' worth) */
    size_t smem = w4_sk_smem(T, K, nt, split);
    const int clus = w4_code_arch(cuda_state(be)->device) >= 90; /* clusters: sm_90 code (cl_place, DSMEM) */
    const int ks = clus ? w4_sk_ksplit(nt, K, smem <= budget && N / 16 >= sms) : 1;
    const int prt = ks > 1 ? cdiv(N / 16, sms / ks / 2 > 0 ? sms / ks / 2 : 1) : 0;
    if (ks > 1) smem = w4_sk_smem(T, K, nt, split, ks, prt);
    if (gy > 2 || nt * gy > 2 || smem > budget) return 0;
    /* the kernel for (nt, split), its shared memory limit raised as the calls need, and the blocks
     * of its wave (1 an SM: 16 warps at up to 128 registers), in clusters of cl that stage the
     * rows together (w4_sk_stage) */
    int blocks = 0, cl = ks > 1 ? ks : clus ? w4_sk_cluster(T, K, split) : 1;
    cudaStream_t st = cuda_stream(be);
#define W4_SK_LAUNCH_CL(NTV, SPV, PKV, CLV, KSV)                                                                       \
    do {                                                                                                               \
        blocks = w4_sk_blocks<NTV, SPV, PKV, CLV, KSV>(smem, cl, sms);                                                 \
        if (blocks < cl || N / 16 < (KSV ? blocks / cl : blocks) || (KSV && cdiv(N / 16, blocks / cl) > prt)) return 0; \
        w4_launch_cluster(w4_dense_sk_kernel<NTV, SPV, PKV, CLV, KSV>, dim3(blocks, gy), W4_SK_WARPS * 32, smem, st, cl, \
                          out, ldo, x, ldx, T, *w, bias);                                                              \
    } while (0)
#define W4_SK_LAUNCH(NTV, SPV, PKV)                                                                                    \
    do {                                                                                                               \
        if (ks > 1) W4_SK_LAUNCH_CL(NTV, SPV, PKV, false, true);                                                       \
        else if (cl > 1) W4_SK_LAUNCH_CL(NTV, SPV, PKV, true, false);                                                  \
        else W4_SK_LAUNCH_CL(NTV, SPV, PKV, false, false);                                                             \
    } while (0)
    if (nt == 1 && split && T <= 4) W4_SK_LAUNCH(1, true, true); /* the halves in one n8 tile (w4_packs) */
    else if (nt == 1 && split) W4_SK_LAUNCH(1, true, false);
    else if (nt == 1) W4_SK_LAUNCH(1, false, false);
    else if (nt == 2 && split) W4_SK_LAUNCH(2, true, false);
    else if (nt == 2) W4_SK_LAUNCH(2, false, false);
    else die("w4: tile %s is no stream-K kernel (n8 %d)", w4_tiles[tile].name, nt);
#undef W4_SK_LAUNCH
#undef W4_SK_LAUNCH_CL
    LAUNCH_CHECK("w4_dense_sk_kernel");
    w4_sk_count++;
    return 1;
}
