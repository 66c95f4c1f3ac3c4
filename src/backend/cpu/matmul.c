/* matmul: y[T, N] = x[T, K] W^T (+ bias) with W in its stored format (BF16, FP8, NVFP4, ...).
 * Each W row is decoded once per tile of tokens into a per-thread buffer and dotted with the
 * tile's rows of x: the weights are never dequantized as a whole. OpenMP over W rows. */
#include "cpu.h"

#define MM_TILE_T 64 /* tokens per pass over W: the tile of x stays in cache */

void matmul_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, int T,
                const QTensor *w, const float *bias)
{
    int64_t N = w->rows, K = w->cols;
    for (int t0 = 0; t0 < T; t0 += MM_TILE_T) {
        int nt = T - t0 < MM_TILE_T ? T - t0 : MM_TILE_T;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (N * K * nt > 32768)
        for (int64_t n = 0; n < N; n++) {
            float *row = cpu_scratch(0, K * sizeof(float));
            qtensor_decode(w, n, 0, K, row);
            float b = bias ? bias[n] : 0.0f;
            for (int t = t0; t < t0 + nt; t++)
                out[(int64_t)t * ldo + n] = cpu_dot(x + (int64_t)t * ldx, row, K) + b;
        }
    }
}
