/* w4_dense: the dense NVFP4 GEMM y[T, N] = x[T, K] W^T (+ bias) on W4P weights (w4_matmul_cuda,
 * matmul.cu calls it) and the mma.sync tiles that run it (W4_FAM_MMA: a block of 4 warps, each a
 * row tile of 16 weight rows x 8 n8 tokens, K split over blocks where the row tiles alone cannot
 * fill the GPU, the splits added by w4_reduce_kernel). Which family runs a call: from
 * w4_lt_rows(N) rows the BF16 + cuBLASLt route (prefill: W decoded to BF16 once, gemm_lt.cu);
 * else the tile w4_pick chooses: stream-K (w4_streamk.cu) or split-K wgmma (w4_dense_wg.cu)
 * where the call suits them, else the mma.sync tile w4_sk_fallback gives. Activations enter as
 * BF16 (two halves by default, MOESERVE_W4_ACT), accumulation is float32. */
#include "w4_launch.cuh"
#include "w4_wgmma.cuh" /* w4_wg_perm */

/* ---- activations to BF16 ---- */

/* perm: each row stored permuted for the wgmma tiles (w4_wg_perm; K % 64 == 0) */
static __global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, int ldx, int T, int K, int split, int perm)
{
    pdl_trigger(); /* the GEMM launched after it (w4_dense_wg) may fetch its first weights meanwhile */
    int64_t n = (int64_t)T * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / K;
        int k = (int)(i - r * K);
        w4_split_store(y, perm ? r * K + w4_wg_perm(k) : i, n, x[r * ldx + k], split);
    }
}

void w4_to_bf16(Backend *be, __nv_bfloat16 *y, const float *x, int ldx, int T, int K, int split, int perm)
{
    int64_t n = (int64_t)T * K;
    to_bf16_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(y, x, ldx, T, K, split, perm);
    LAUNCH_CHECK("to_bf16_kernel");
}

/* ---- the mma.sync tiles ---- */

/* block: W4_WARPS row tiles x 8 NT tokens x one K split. splits == 1: out = acc * gscale + bias;
 * else part[split][T][N] = acc * gscale (w4_reduce_kernel adds the splits and the bias). */
template <int NT, int ST, int KS, bool XF, bool SP, int WRD = 0>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_dense_kernel(float *out, int ldo, float *part,
                                                                         const void *x, int ldx, size_t lo, int T,
                                                                         QTensor w, const float *bias, int splits)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG;
    __shared__ float red[KS > 1 ? (KS - 1) * NT * 4 * 32 : 1];
    int i = blockIdx.x * (W4_WARPS / KS) + (threadIdx.x >> 5) / KS, active = i < N / 16;
    if (ST == 0 && !active) return; /* KS > 1: the whole block */
    int m0 = blockIdx.y * 8 * NT, m = min(8 * NT, T - m0), split = blockIdx.z;
    int g0 = (int)((int64_t)split * ng / splits), g1 = (int)((int64_t)(split + 1) * ng / splits);
    w4_krange<KS>(g0, g1);
    if (threadIdx.x < 8 * NT) {
        size_t r = (size_t)(m0 + min((int)threadIdx.x, m - 1)) * ldx;
        rowp[threadIdx.x] = XF ? (const void *)((const float *)x + r) : (const void *)((const __nv_bfloat16 *)x + r);
    }
    __syncthreads();
    const uint8_t *rec[1] = {w.data + (size_t)(active ? i : 0) * ng * W4_REC};
    float acc[1][NT][4];
    w4_tile<NT, 1, ST, XF, SP, WRD>(acc, rec, active, rowp, lo, (m + 7) / 8, g0, g1, w4_sx);
    if (!w4_kreduce<1, NT, KS>(acc, red) || !active) return;
    float sc = w.gscale * 512.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int slot = nt * 8 + 2 * t + (e & 1), row = 16 * i + g + 8 * (e >> 1);
            if (slot >= m) continue;
            float v = acc[0][nt][e] * sc;
            if (splits == 1) out[(size_t)(m0 + slot) * ldo + row] = v + (bias ? bias[row] : 0.f);
            else part[((size_t)split * T + m0 + slot) * N + row] = v;
        }
}

static __global__ void w4_reduce_kernel(float *out, int ldo, const float *part, const float *bias, int T, int N, int splits)
{
    pdl_wait(); /* launched dependent after the split-K wgmma GEMM (w4_dense_wg): its sums */
    int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = bias ? bias[i % N] : 0.f;
        for (int s = 0; s < splits; s++) v += part[s * n + i];
        out[(i / N) * ldo + i % N] = v;
    }
}

void w4_reduce(cudaStream_t st, int dependent, float *out, int ldo, const float *part, const float *bias, int T, int N,
               int splits)
{
    int64_t n = (int64_t)T * N;
    const int nb = cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535;
    if (dependent) w4_launch_dependent(w4_reduce_kernel, dim3(nb), 256, 0, st, out, ldo, part, bias, T, N, splits);
    else w4_reduce_kernel<<<nb, 256, 0, st>>>(out, ldo, part, bias, T, N, splits);
    LAUNCH_CHECK("w4_reduce_kernel");
}

/* the ring tiles of the decode GEMM (no stages, a ring): each warp's weights through `ring` slots
 * of shared memory (w4_tile's WRD) */
template <int NT, int KS, int WRD>
static void w4_dense_ring(cudaStream_t st, dim3 grid, int xf, int split, float *out, int ldo, float *part, const void *xa,
                          int lda, size_t lo, int T, const QTensor *w, const float *bias, int splits)
{
    size_t smem = (size_t)W4_WARPS * WRD * W4_REC; /* at most 46 KB: no opt-in */
    static_assert(W4_WARPS * WRD * W4_REC <= 48 * 1024, "a dense ring tile over 48 KB");
    if (xf && split) w4_dense_kernel<NT, 0, KS, true, true, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else if (xf) w4_dense_kernel<NT, 0, KS, true, false, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else if (split) w4_dense_kernel<NT, 0, KS, false, true, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else w4_dense_kernel<NT, 0, KS, false, false, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
}

/* ---- many rows (prefill): decode W to BF16 once, then cuBLASLt's tensor-core GEMM ---- */

/* one warp per record (16 rows x 256 columns): its mma.sync A fragments, decoded exactly as the
 * W4A16 tile decodes them (value * scale * 2^-9, exact in BF16), stored row-major; the GEMM's
 * alpha applies gscale * 2^9, as the tile's epilogue does */
static __global__ void w4_to_bf16_kernel(__nv_bfloat16 *out, const uint8_t *data, int64_t N, int64_t K)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t ng = K / W4_KG, recs = (N / 16) * ng;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < recs; r += (int64_t)gridDim.x * blockDim.x / 32) {
        int64_t i = r / ng, G = r % ng;
        W4Frag f;
        w4_load(f, data + r * W4_REC, lane);
        __nv_bfloat16 *r0 = out + (16 * i + g) * K + G * W4_KG, *r1 = r0 + 8 * K;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t sw = (c < 2) ? f.s.x : f.s.y;
            uint32_t sg = w4_scale2(sw, (2 * c) & 3), sh = w4_scale2(sw, (2 * c + 1) & 3);
            uint32_t words[4] = {f.c[c].x, f.c[c].y, f.c[c].z, f.c[c].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t a[4];
                w4_decode(words[j], sg, sh, a);
                /* logical k (2t, 2t+1, 2t+8, 2t+9) of step j is physical column 64c + 16t + 4j + q */
                int col = 64 * c + 16 * t + 4 * j;
                *(uint2 *)(r0 + col) = make_uint2(a[0], a[2]);
                *(uint2 *)(r1 + col) = make_uint2(a[1], a[3]);
            }
        }
    }
}


/* Rows from which a dense GEMM of a weight with n rows takes the BF16 route (n <= 0: the fewest of
 * any weight): MOESERVE_W4_LT_ROWS for every weight (0: never), else w4_lt_rows_default by whether
 * the split-K wgmma tile can run the call (n % 128 == 0, wgmma, its shared memory within the
 * budget). */
extern "C" int w4_lt_rows(int n, int device)
{
    const long v = knob_get(KNOB_W4_LT_ROWS);
    if (v >= 0) return (int)v;
    const int wg = n > 0 && n % 128 == 0 && w4_wg_supported(device) &&
                   w4_tile_fits(w4_tiles[W4T_DENSE_WG_SPLITK], w4_smem_budget(device), NULL, 0);
    return w4_lt_rows_default(wg);
}

/* Prefill: compute-bound, where cuBLASLt's wgmma kernels reach the tensor roof and our mma.sync
 * tile does not; decoding W (0.56 bytes read and 2 written per weight, once per call) is
 * small next to 2 T FLOPs per weight once T is in the hundreds. The activations as the W4A16
 * kernels take them: two BF16 halves (2 T GEMM rows) by default, one with MOESERVE_W4_ACT=bf16. */
static void w4_matmul_lt(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                         const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols, split = w4_split_act();
    cudaStream_t st = cuda_stream(be);
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_WB, (size_t)N * K * sizeof(__nv_bfloat16));
    int64_t recs = (int64_t)(N / 16) * (K / W4_KG);
    int nb = (int)(recs / 8 + 1 < 65535 ? recs / 8 + 1 : 65535);
    w4_to_bf16_kernel<<<nb, 256, 0, st>>>(wb, w->data, N, K);
    LAUNCH_CHECK("w4_to_bf16_kernel");
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
    w4_to_bf16(be, xb, x, ldx, T, K, split, 0);
    float alpha = w->gscale * 512.f;
    if (split) { /* [x_hi; x_lo] as 2T rows, then their sum */
        float *y = (float *)cuda_scratch(be, SCR_MM_Y, (size_t)2 * T * N * sizeof(float)); /* as matmul.cu's BF16 route */
        lt_matmul_scaled(be, y, N, xb, CUDA_R_16BF, K, wb, CUDA_R_16BF, 2 * T, N, K, alpha);
        join_halves_cuda(be, out, ldo, y, bias, T, N);
        return;
    }
    lt_matmul_scaled(be, out, ldo, xb, CUDA_R_16BF, K, wb, CUDA_R_16BF, T, N, K, alpha);
    if (bias) add_bias_cuda(be, out, ldo, bias, T, N);
}

/* ---- the entry ---- */

void w4_matmul_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols;
    cudaStream_t st = cuda_stream(be);
    const int lt = w4_lt_rows(N, cuda_state(be)->device);
    if (lt > 0 && T >= lt) {
        w4_matmul_lt(be, out, ldo, x, ldx, T, w, bias);
        return;
    }
    int tile = w4_pick(be, W4_DENSE, T, T);
    const W4Family fam = w4_tiles[tile].fam;
    if (fam == W4_FAM_STREAMK || fam == W4_FAM_DENSE_WG) {
        /* stream-K or split-K wgmma, where the call suits it (stream-K, then split-K); else the choice without them */
        size_t budget = w4_smem_budget(cuda_state(be)->device);
        if (fam == W4_FAM_STREAMK && w4_dense_sk(be, tile, out, ldo, x, ldx, T, w, bias, w4_split_act(), budget)) return;
        /* split-K where stream-K does not suit the call, but not at up to 8 rows of a weight with
         * fewer than W4_DENSE_WG_MIN_N rows: the mma.sync K-split tile is faster there */
        if ((fam == W4_FAM_DENSE_WG || T > 8 || N >= W4_DENSE_WG_MIN_N) && w4_dense_wg(be, out, ldo, x, ldx, T, w, bias)) return;
        tile = w4_sk_fallback(T, budget, w4_split_act());
    }
    /* the MoE-only families run as a mma.sync twin that fits wherever they fit (test_w4_tiles) */
    if (w4_tiles[tile].fam == W4_FAM_MMA_BLOCK) tile = W4_BLOCK_DENSE_TWIN;
    if (w4_tiles[tile].fam == W4_FAM_WGMMA) tile = W4_WGMMA_DENSE_TWIN;
    const W4Tile tl = w4_tiles[tile];
    int nt = tl.n8;
    int splits = w4_mma_splits(T, N, K, nt, tl.kwarps, w4_sm_count(be), w4_forced_splits());
    /* tiles reading activations from global memory round the float32 rows themselves */
    int xf = tl.stages == 0 && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0, split = w4_split_act();
    const void *xa = x;
    int lda = ldx;
    size_t lo = split; /* XF: a flag */
    if (!xf) {
        __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
        w4_to_bf16(be, xb, x, ldx, T, K, split, 0);
        xa = xb;
        lda = K;
        lo = split ? (size_t)T * K : 0;
    }
    float *part = splits > 1 ? (float *)cuda_scratch(be, SCR_W4_PART, (size_t)splits * T * N * sizeof(float)) : NULL;
    dim3 grid(cdiv(N / 16, W4_WARPS / tl.kwarps), cdiv(T, 8 * nt), splits);
#define LAUNCH_DENSE_SP(NTV, STV, KSV, SPV)                                                                           \
    if (STV == 0 && xf)                                                                                                \
        w4_dense_kernel<NTV, STV, KSV, true, SPV><<<grid, W4_WARPS * 32, 0, st>>>(out, ldo, part, xa, lda, lo, T, *w,   \
                                                                                  bias, splits);                       \
    else {                                                                                                             \
        W4_SET_SMEM2(w4_dense_kernel, NTV, STV, KSV, false, SPV);                                                      \
        w4_dense_kernel<NTV, STV, KSV, false, SPV><<<grid, W4_WARPS * 32, W4_SMEM(NTV, STV), st>>>(                    \
            out, ldo, part, xa, lda, lo, T, *w, bias, splits);                                                         \
    }
/* one weight stream: a tile with gate and up on two warps runs as its twin without */
#define LAUNCH_DENSE_T(NTV, STV, KSV, SSV) LAUNCH_DENSE_SP(NTV, STV, KSV, true)
#define LAUNCH_DENSE_F(NTV, STV, KSV, SSV) LAUNCH_DENSE_SP(NTV, STV, KSV, false)
    if (tl.ring) {
#define W4_DENSE_RING(ID, NTV, KSV, WRV)                                                                               \
    case ID:                                                                                                           \
        CHECK(tl.n8 == NTV && tl.stages == 0 && tl.kwarps == KSV && tl.ring == WRV, "w4: dense ring tile %s is not <%d, 0, %d, %d>", \
              tl.name, NTV, KSV, WRV);                                                                                 \
        w4_dense_ring<NTV, KSV, WRV>(st, grid, xf, split, out, ldo, part, xa, lda, lo, T, w, bias, splits);            \
        break;
        switch (tile) {
            W4_DENSE_RING(W4T_DENSE_MMA_8_K4_R3, 1, 4, 3)
            W4_DENSE_RING(W4T_DENSE_MMA_8_K4_R4, 1, 4, 4)
            W4_DENSE_RING(W4T_DENSE_MMA_16_K4_R3, 2, 4, 3)
        default: die("w4: tile %s has no dense ring kernel", tl.name);
        }
#undef W4_DENSE_RING
    } else if (split) {
        W4_MMA_DISPATCH(tile, LAUNCH_DENSE_T)
    } else {
        W4_MMA_DISPATCH(tile, LAUNCH_DENSE_F)
    }
#undef LAUNCH_DENSE_T
#undef LAUNCH_DENSE_F
#undef LAUNCH_DENSE_SP
    LAUNCH_CHECK("w4_dense_kernel");
    if (splits > 1) w4_reduce(st, 0, out, ldo, part, bias, T, N, splits);
}
