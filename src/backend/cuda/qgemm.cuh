/* qgemm.cuh: the dequantising GEMM tile shared by the dense matmul (matmul.cu) and the grouped
 * expert GEMMs (moe.cu): out[orow[i], n] = sum_k x[xrow[i], k] * W[n, k] (+ bias[n]) for the
 * block's QM rows and QN columns, W decoded from its stored format into shared memory a K
 * chunk at a time. A correct first version (issue #4); the fast NVFP4 kernels are issue #5. */
#ifndef MOESERVE_QGEMM_CUH
#define MOESERVE_QGEMM_CUH

#include "common.cuh"

#define QN 64      /* output columns (W rows) per block */
#define QM 16      /* input rows per block */
#define QK 64      /* K chunk decoded per step */
#define QTHREADS 256

/* 256 threads: thread owns column n = tid % 64 and rows 4 * (tid / 64) .. +3 of the tile.
 * xrow/orow: the tile's QM input / output row indices (in shared memory), m valid rows. */
__device__ __forceinline__ void qgemm_tile(float *out, int ldo, const int *orow, const float *x, int ldx,
                                           const int *xrow, int m, int n0, const QTensor &w, const float *bias)
{
    __shared__ float ws[QN][QK + 1];
    __shared__ float xs[QM][QK + 1];
    int tid = threadIdx.x, n = tid % QN, rg = tid / QN;
    int64_t N = w.rows, K = w.cols;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t k0 = 0; k0 < K; k0 += QK) {
        for (int i = tid; i < QN * QK; i += QTHREADS) {
            int r = i / QK, kk = i % QK;
            ws[r][kk] = (n0 + r < N && k0 + kk < K) ? qt_elem(w, n0 + r, k0 + kk) : 0.f;
        }
        for (int i = tid; i < QM * QK; i += QTHREADS) {
            int r = i / QK, kk = i % QK;
            xs[r][kk] = (r < m && k0 + kk < K) ? x[(int64_t)xrow[r] * ldx + k0 + kk] : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < QK; kk++) {
            float wv = ws[n][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) acc[j] += wv * xs[rg * 4 + j][kk];
        }
        __syncthreads();
    }
    if (n0 + n < N)
        for (int j = 0; j < 4; j++) {
            int r = rg * 4 + j;
            if (r < m) out[(int64_t)orow[r] * ldo + n0 + n] = acc[j] + (bias ? bias[n0 + n] : 0.f);
        }
}

#endif
