/* w4_moe_wgmma: the MoE GEMM on wgmma (W4_FAM_WGMMA tiles; w4_wgmma.cuh, sm_90a): many tokens per
 * expert, and from a few pairs an expert with the weights through a ring of records in shared
 * memory. w4_moe.cu routes the call and runs it here where the choice says (w4_moe_wgmma), and
 * the hot class of experts on W4_HOT_TILE. */
#include "w4_moe.cuh"
#include "w4_wgmma.cuh"

/* tests: the ring kernels' persistent grids capped (w4_test_cap_wg_blocks); 0: one wave */
static int w4_wg_blocks_cap;
extern "C" void w4_test_cap_wg_blocks(int max_blocks) { w4_wg_blocks_cap = max_blocks > 0 ? max_blocks : 0; }

/* ---- the kernels ----
 * A block's work items are (token tile, row block) pairs, w = tile x RB + row block, in order (the
 * row blocks of a token tile side by side: they share its activations in L2); a block runs item
 * blockIdx.x, then those wg_first_next and wg_ask_next give it. gate/up: warpgroup 0 computes gate, warpgroup 1 up, of the same 64
 * rows of F (row tiles 4 rb + warp % 4); each warpgroup hands the other the sums of half the
 * tokens through shared memory and computes SwiGLU for its own half; h is written permuted
 * (w4_wg_perm) for the down kernel. down: 128 rows of D a block.
 * Without a weight ring (WR == 0) the launch gives a block an item. With the ring the blocks stay
 * (one wave: the blocks the SMs hold), and each warp asks for the next item's first weight records
 * while it finishes one (w4_wg_gemm_r's nrec): a block starts an item with its weights in flight
 * instead of waiting an HBM latency with its SM idle (one block an SM at 128 tokens). */
/* The ring kernels' items after the first come from a counter (ctr, zeroed by the routing kernel),
 * one item ahead: a block knows its next item when it starts one (for nrec) and asks for the one
 * after at the same time, storing the answer only once its GEMM is done, so that the atomic's
 * latency hides behind the item (a block that waited for it was slower, and so was a static
 * stride, to blocks that drew slower items).
 * Without the ring a block strides by the grid (the launch gives it one item). */
template <int WR>
__device__ __forceinline__ int wg_first_next(int *ctr)
{
    if constexpr (WR > 0) return (int)gridDim.x + atomicAdd(ctr, 1);
    else return (int)(blockIdx.x + gridDim.x);
}
template <int WR>
__device__ __forceinline__ int wg_ask_next(int *ctr, int wn, int W)
{
    if constexpr (WR > 0) return threadIdx.x == 0 && wn < W ? atomicAdd(ctr, 1) : 0;
    else return 0;
}
template <int WR>
__device__ __forceinline__ int wg_next_of(int after, int wn)
{
    if constexpr (WR > 0) return (int)gridDim.x + after;
    else return wn + (int)gridDim.x;
}

__device__ __forceinline__ void cp_async4_s(void *smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}

/* AF: the activation form the kernel is built for (w4_wg_gemm): 0 plain BF16, 1 split, 2 either */
template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, NT == 4 || (WR > 0 && NT == 8) ? 2 : 1) w4_moe_gateup_wg_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int F, int K,
    size_t xlo, size_t hlo)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ int wnext;
    constexpr int HT = 4 * NT, XS = HT + 1; /* the tokens a warpgroup hands over (half the tile); their row stride (floats) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wgp = warp >> 2;
    const int ng = K / W4_KG, nrt = F / 16, RB = F / 64, W = *n_tiles * RB;
    float *ex = (float *)sm; /* [2][64 rows][XS]: the up sums of tokens 0..HT (from warpgroup 1), the gate sums of the rest (0) */
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (threadIdx.x == 0) wnext = wg_first_next<WR>(ctr);
    int wn = 0;
    for (int w = blockIdx.x; w < W; w = wn) {
        int tile = w / RB, i = 4 * (w - tile * RB) + (warp & 3);
        int e, m, base;
        w4_tile_facts(tile_e, tile_base, tile, e, m, base);
        __syncthreads(); /* the previous item's readers of rowp and ex are done */
        if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(rows[base + min((int)threadIdx.x, m - 1)] / topk) * K;
        __syncthreads();
        wn = wnext;
        int after = wg_ask_next<WR>(ctr, wn, W);
        const QTensor &wq = table[wgp * E + e]; /* gate, or up */
        const uint8_t *nrec = nullptr;
        if (WR > 0 && wn < W) {
            int tn = wn / RB, in = 4 * (wn - tn * RB) + (warp & 3);
            nrec = table[wgp * E + w4_tile_expert(tile_e, tn)].data + (size_t)(in < nrt ? in : 0) * ng * W4_REC;
        }
        float acc[4 * NT];
        w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, wq.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC, rowp, xlo, ng, m, sm, ring, nrec);
        if (threadIdx.x == 0) wnext = wg_next_of<WR>(after, wn); /* every thread read wnext before the GEMM's barriers */
        float sc = wq.gscale * 512.f;
        __syncthreads(); /* every warp is done with the stages: ex reuses them */
        /* accumulator b holds tokens 8 b ..: warpgroup 1 hands over b < NT / 2, warpgroup 0 the rest */
        float *mine = ex + wgp * 64 * XS;
#pragma unroll
        for (int b = 0; b < NT; b++)
            if ((b < NT / 2) == (wgp == 1))
#pragma unroll
                for (int d = 0; d < 4; d++)
                    mine[(16 * (warp & 3) + g + 8 * (d >> 1)) * XS + 8 * (b % (NT / 2)) + 2 * t + (d & 1)] = acc[4 * b + d] * sc;
        __syncthreads();
        if (i >= nrt) continue;
        const float *other = ex + (1 - wgp) * 64 * XS;
#pragma unroll
        for (int b = 0; b < NT; b++)
            if ((b < NT / 2) == (wgp == 0))
#pragma unroll
                for (int d = 0; d < 4; d++) {
                    int slot = 8 * b + 2 * t + (d & 1), r = g + 8 * (d >> 1);
                    if (slot >= m) continue;
                    float mv = acc[4 * b + d] * sc, ov = other[(16 * (warp & 3) + r) * XS + 8 * (b % (NT / 2)) + 2 * t + (d & 1)];
                    float gv = wgp == 0 ? mv : ov, uv = wgp == 0 ? ov : mv;
                    size_t at = (size_t)(base + slot) * F + w4_wg_perm(16 * i + r);
                    float hv = gv / (1.f + __expf(-gv)) * uv;
                    __nv_bfloat16 hh = __float2bfloat16(hv);
                    h[at] = hh;
                    if (hlo) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
                }
    }
#endif
}

template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, NT == 4 || (WR > 0 && NT == 8) ? 2 : 1) w4_moe_down_wg_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int D, int F, size_t hlo)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ int yrow[8 * NT]; /* the output row of each token slot */
    __shared__ int wnext;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int ng = F / W4_KG, nrt = D / 16, RB = D / 128, W = *n_tiles * RB;
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (threadIdx.x == 0) wnext = wg_first_next<WR>(ctr);
    int wn = 0;
    for (int w = blockIdx.x; w < W; w = wn) {
        int tile = w / RB, i = 8 * (w - tile * RB) + warp;
        int e, m, base;
        w4_tile_facts(tile_e, tile_base, tile, e, m, base);
        __syncthreads(); /* the previous item's readers of rowp and yrow are done */
        if (threadIdx.x < 8 * NT) {
            rowp[threadIdx.x] = h + (size_t)(base + min((int)threadIdx.x, m - 1)) * F;
            /* asynchronously: it lands with the GEMM's first stage (the next commit group), and the
             * GEMM's barriers publish it; the epilogue reads it from shared memory instead of
             * waiting on a global load per token slot (a fifth of the kernel at 8192 tokens) */
            cp_async4_s(&yrow[threadIdx.x], rows + base + min((int)threadIdx.x, m - 1));
        }
        __syncthreads();
        wn = wnext;
        int after = wg_ask_next<WR>(ctr, wn, W);
        const QTensor &wd = table[2 * E + e];
        const uint8_t *nrec = nullptr;
        if (WR > 0 && wn < W) {
            int tn = wn / RB, in = 8 * (wn - tn * RB) + warp;
            nrec = table[2 * E + w4_tile_expert(tile_e, tn)].data + (size_t)(in < nrt ? in : 0) * ng * W4_REC;
        }
        float acc[4 * NT];
        w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, wd.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC, rowp, hlo, ng, m, sm, ring, nrec);
        if (threadIdx.x == 0) wnext = wg_next_of<WR>(after, wn); /* every thread read wnext before the GEMM's barriers */
        if (i >= nrt) continue;
        float sd = wd.gscale * 512.f;
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int p = 0; p < 2; p++) {
                int slot = 8 * b + 2 * t + p;
                if (slot >= m) continue;
                float *yr = y + (size_t)yrow[slot] * D + 16 * i + g;
                yr[0] = acc[4 * b + p] * sd;
                yr[8] = acc[4 * b + p + 2] * sd;
            }
    }
#endif
}

/* the blocks the SMs hold at once: the grid of the ring kernels' persistent blocks */
template <typename Kern>
static int wg_wave(Kern k, int smem)
{
    int blocks = 0, dev = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, 256, smem));
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return (blocks > 0 ? blocks : 1) * sms;
}

template <int NT, int ST, int WR, int CPS>
static void w4_moe_wg(cudaStream_t st, int max_tiles, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                      const QTensor *tb, int E, int topk, const int *rows,
                      const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int D, int F, size_t xlo, size_t hlo)
{
    const int smem = W4_WG_SMEM(NT, ST, WR);
    constexpr int AFS = NT == 4 ? 1 : 2, AFB = NT == 4 ? 0 : 2; /* the kernels' activation forms (w4_wg_gemm): split, plain BF16 */
    static int ready = 0, gfp = 0, gdp = 0;
    if (!ready) { /* the kernels of both activation forms hold the same blocks an SM (the same launch bounds and shared memory) */
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int a = wg_wave(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS>, smem), b = wg_wave(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB>, smem);
        int c = wg_wave(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS>, smem), d = wg_wave(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB>, smem);
        gfp = a < b ? a : b;
        gdp = c < d ? c : d;
        ready = 1;
    }
    /* the grids: an item a block, or (the ring kernels) one wave of persistent blocks */
    long fi = (long)max_tiles * (F / 64), di = (long)max_tiles * (D / 128);
    CHECK(fi < INT_MAX && di < INT_MAX, "w4: %d token tiles x %d row blocks: too many items", max_tiles, F / 64);
    int persist = WR > 0 && knob_get(KNOB_W4_WG_PERSIST);
    long wf = w4_wg_blocks_cap ? w4_wg_blocks_cap : gfp, wd = w4_wg_blocks_cap ? w4_wg_blocks_cap : gdp;
    int gf = (int)(persist && wf < fi ? wf : fi), gd = (int)(persist && wd < di ? wd : di);
    if (xlo) /* split activations (xlo and hlo both set) */
        w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS><<<gf, 256, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base, n_tiles, ctr,
                                                                            F, D, xlo, hlo);
    else
        w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB><<<gf, 256, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base, n_tiles, ctr,
                                                                             F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_wg_kernel");
    if (hlo)
        w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS><<<gd, 256, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles, ctr + 1, D, F,
                                                                          hlo);
    else
        w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB><<<gd, 256, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles, ctr + 1, D, F,
                                                                           hlo);
    LAUNCH_CHECK("w4_moe_down_wg_kernel");
}

void w4_moe_wgmma(cudaStream_t st, int tile, const W4MoeCall &c)
{
#define W4_MOE_WG(ID, NTV, STV, WRV, CPSV)                                                                             \
    case ID:                                                                                                           \
        CHECK(w4_tiles[ID].fam == W4_FAM_WGMMA && w4_tiles[ID].n8 == NTV && w4_tiles[ID].stages == STV &&             \
                  w4_tiles[ID].ring == WRV && (w4_tiles[ID].chunks > 1 ? w4_tiles[ID].chunks : 1) == CPSV,             \
              "w4: wgmma tile %s is not <%d, %d, %d, %d>", w4_tiles[ID].name, NTV, STV, WRV, CPSV);                  \
        w4_moe_wg<NTV, STV, WRV, CPSV>(st, c.max_tiles, c.h, c.xb, c.y, c.tb, c.E, c.topk, c.rows, c.tile_e, c.tile_base, \
                                       c.n_tiles, c.ctr, c.D, c.F, c.xlo, c.hlo);                                     \
        break;
    switch (tile) {
        W4_MOE_WG(W4T_MOE_WGMMA_128_S4, 16, 4, 0, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_128_S3, 16, 3, 0, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_128_S6, 16, 6, 0, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_64_S5, 8, 5, 0, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_32_S4, 4, 4, 0, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_32_S4_R4, 4, 4, 4, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_64_S3_R3, 8, 3, 3, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_128_S4_R3, 16, 4, 3, 1)
        W4_MOE_WG(W4T_MOE_WGMMA_32_S6_R3_C2, 4, 6, 3, 2)
    default: die("w4: tile %s is no wgmma MoE tile", w4_tiles[tile].name);
    }
#undef W4_MOE_WG
}
