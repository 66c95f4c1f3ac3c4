/* w4_dense_wg: a dense GEMM on the MoE's 32-token wgmma ring GEMM (W4_FAM_DENSE_WG, dense_wg_splitk;
 * sm_90a; w4_dense.cu runs it where the call suits it, w4_dense_wg).
 * w4_wg_gemm (2 warpgroups of 64 weight rows, wgmma with the decoded weights as A and up to 32
 * token rows as B, the weights through each warp's ring of records) for a dense W [N, K] and T <=
 * 32 rows: block (rb, s) takes rows [128 rb, 128 rb + 128) over the record groups of K split s of
 * `splits` (as many splits as fill two blocks an SM); with splits > 1 the partial sums go to
 * part[s][T][N] and w4_reduce_kernel adds them in split order (the same result every call). The
 * activations enter as BF16 rows permuted inside each 64-column chunk (w4_to_bf16 perm), their low
 * halves lo elements further. Launched with PDL after w4_to_bf16, it asks for its first ring
 * records before waiting for the activations, and the reduction after it is launched so too
 * (adding the splits in the kernel, by each row block's last split, was slower: a serial tail).
 * Above 32 rows it runs the 64-token ring tile's GEMM (the same shared memory), above 64 rows in
 * token tiles of 64 (a grid dimension; each token tile's blocks decode the weights again). */
#include "w4_launch.cuh"
#include "w4_wgmma.cuh"

template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, 2) w4_dense_wg_kernel(float *out, int ldo, float *part, const __nv_bfloat16 *xb,
                                                                   size_t lo, int T, QTensor w, const float *bias, int splits)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG, split = blockIdx.y, i = 8 * blockIdx.x + warp;
    const int g0 = (int)((int64_t)split * ng / splits), g1 = (int)((int64_t)(split + 1) * ng / splits);
    const uint8_t *rec = w.data + ((size_t)i * ng + g0) * W4_REC;
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (g1 - g0 >= WR - 1) { /* the first records, before the activations are ready (to_bf16 before, PDL) */
        if (lane == 0)
            for (int G = 0; G < WR - 1; G++) wg_ring_fill(ring.slots + G * W4_REC, rec + (size_t)G * W4_REC, ring.bars + 8 * G);
        ring.pre = 1;
    }
    pdl_wait(); /* to_bf16: done, its rows visible */
    pdl_trigger();
    const int m0 = 8 * NT * blockIdx.z, m = min(8 * NT, T - m0); /* this block's token tile */
    if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(m0 + min((int)threadIdx.x, m - 1)) * K + (size_t)g0 * W4_KG;
    __syncthreads();
    float acc[4 * NT];
    w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, rec, rowp, lo, g1 - g0, m, sm, ring, nullptr);
    const float sc = w.gscale * 512.f;
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
        for (int p = 0; p < 2; p++) {
            int slot = 8 * b + 2 * t + p, row = 16 * i + g;
            if (slot >= m) continue;
            slot += m0;
            float v0 = acc[4 * b + p] * sc, v1 = acc[4 * b + p + 2] * sc;
            if (splits == 1) {
                out[(size_t)slot * ldo + row] = v0 + (bias ? bias[row] : 0.f);
                out[(size_t)slot * ldo + row + 8] = v1 + (bias ? bias[row + 8] : 0.f);
            } else {
                float *pr = part + ((size_t)split * T + slot) * N + row;
                pr[0] = v0;
                pr[8] = v1;
            }
        }
#endif
}

static long w4_dense_wg_count;
extern "C" long w4_dense_wg_calls(void) { return w4_dense_wg_count; }

/* the launch on the GEMM of a ring tile <NT, ST, WR, CPS>: the 32-token one's (up to 32 rows) or the
 * 64-token one's */
template <int NT, int ST, int WR, int CPS>
static void w4_dense_wg_launch(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols;
    const int smem = W4_WG_SMEM(NT, ST, WR);
    static int ready = 0;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_wg_kernel<NT, ST, WR, CPS, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_wg_kernel<NT, ST, WR, CPS, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        ready = 1;
    }
    /* splits of K: as many as one wave of two blocks an SM holds (a second, partial wave would
     * cost a whole item's time), each split 2 record groups or more */
    int rb = N / 128, ng = K / W4_KG, ntt = cdiv(T, 8 * NT), splits = 2 * w4_sm_count(be) / (rb * ntt);
    if (splits > ng / 2) splits = ng / 2;
    if (splits < 1) splits = 1;
    int split = w4_split_act();
    cudaStream_t st = cuda_stream(be);
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
    w4_to_bf16(be, xb, x, ldx, T, K, split, 1);
    float *part = splits > 1 ? (float *)cuda_scratch(be, SCR_W4_PART, (size_t)splits * T * N * sizeof(float)) : NULL;
    if (split)
        w4_launch_dependent(w4_dense_wg_kernel<NT, ST, WR, CPS, 1>, dim3(rb, splits, ntt), 256, smem, st, out, ldo, part,
                            (const __nv_bfloat16 *)xb, (size_t)T * K, T, *w, bias, splits);
    else
        w4_launch_dependent(w4_dense_wg_kernel<NT, ST, WR, CPS, 0>, dim3(rb, splits, ntt), 256, smem, st, out, ldo, part,
                            (const __nv_bfloat16 *)xb, (size_t)0, T, *w, bias, splits);
    LAUNCH_CHECK("w4_dense_wg_kernel");
    if (splits > 1) w4_reduce(st, 1, out, ldo, part, bias, T, N, splits);
    w4_dense_wg_count++;
}


/* 1 with the GEMM launched on the split-K wgmma tile, 0 where the call does not suit it (N % 128,
 * no wgmma, its shared memory over the budget) */
int w4_dense_wg(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, dev = cuda_state(be)->device;
    const W4Tile tw = w4_tiles[W4T_DENSE_WG_SPLITK];
    if (N % 128 || cdiv(T, 64) > 65535 || !w4_wg_supported(dev) || !w4_tile_fits(tw, w4_smem_budget(dev), NULL, 0)) return 0;
    constexpr int NT = 4, ST = 6, WR = 3, CPS = 2; /* the 32-token ring tile's GEMM */
    CHECK(tw.n8 == NT && tw.stages == ST && tw.ring == WR && tw.chunks == CPS, "w4: tile %s is not <%d, %d, %d, %d>", tw.name, NT,
          ST, WR, CPS);
    static_assert(W4_WG_SMEM(8, 3, 3) == W4_WG_SMEM(NT, ST, WR), "the 64-token ring tile's GEMM fits where the 32-token one does");
    if (T > 8 * NT) w4_dense_wg_launch<8, 3, 3, 1>(be, out, ldo, x, ldx, T, w, bias); /* the 64-token ring tile's GEMM */
    else w4_dense_wg_launch<NT, ST, WR, CPS>(be, out, ldo, x, ldx, T, w, bias);
    return 1;
}
