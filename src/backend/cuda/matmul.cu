/* matmul: y[T, N] = x[T, K] W^T (+ bias) on the GPU, the twin of matmul_cpu. BF16 and F32
 * weights go through cuBLASLt (gemm_lt.cu); packed NVFP4 weights through the W4A16 kernels
 * (w4_dense.cu); FP8, FP8 128x128-block, unpacked NVFP4 and F16 weights through the dequantising
 * tile of qgemm.cuh.
 * BF16 weights keep float32 accuracy on the activations: x is split into x_hi = bf16(x) and
 * x_lo = bf16(x - x_hi) and one GEMM runs on the 2T rows [x_hi; x_lo] (W is read once), whose
 * two halves are added: the error is that of a 16-bit mantissa, 2^-17 relative, instead of
 * bf16's 2^-9, which would flip near-tied router and indexer top-k choices. */
#include "qgemm.cuh"
#include "w4.h"

static __global__ void qgemm_dense_kernel(float *out, int ldo, const float *x, int ldx, int T, QTensor w, const float *bias)
{
    __shared__ int rows[QM];
    int m0 = blockIdx.y * QM, m = T - m0 < QM ? T - m0 : QM;
    if (threadIdx.x < QM) rows[threadIdx.x] = m0 + threadIdx.x;
    __syncthreads();
    qgemm_tile(out, ldo, rows, x, ldx, rows, m, blockIdx.x * QN, w, bias);
}

/* thread (t, k): y[t, k] = bf16(x), y[T + t, k] = bf16(x - bf16(x)) */
static __global__ void split_bf16_kernel(__nv_bfloat16 *y, const float *x, int ldx, int T, int K)
{
    int64_t n = (int64_t)T * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[(i / K) * ldx + i % K];
        __nv_bfloat16 hi = __float2bfloat16(v);
        y[i] = hi;
        y[n + i] = __float2bfloat16(v - __bfloat162float(hi));
    }
}

void matmul_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols;
    if (!T || !N) return;
    cudaStream_t st = cuda_stream(be);
    if (w->fmt == QF_BF16) {
        __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_MM_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
        float *y = (float *)cuda_scratch(be, SCR_MM_Y, (size_t)2 * T * N * sizeof(float));
        int64_t n = (int64_t)T * K;
        split_bf16_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, st>>>(xb, x, ldx, T, K);
        LAUNCH_CHECK("split_bf16_kernel");
        lt_matmul(be, y, N, xb, CUDA_R_16BF, K, w->data, CUDA_R_16BF, 2 * T, N, K);
        join_halves_cuda(be, out, ldo, y, bias, T, N);
        return;
    } else if (w->fmt == QF_NVFP4 && w->packed) {
        w4_matmul_cuda(be, out, ldo, x, ldx, T, w, bias);
        return;
    } else if (w->fmt == QF_F32) {
        lt_matmul(be, out, ldo, x, CUDA_R_32F, ldx, w->data, CUDA_R_32F, T, N, K);
    } else {
        dim3 grid(cdiv(N, QN), cdiv(T, QM));
        qgemm_dense_kernel<<<grid, QTHREADS, 0, st>>>(out, ldo, x, ldx, T, *w, bias);
        LAUNCH_CHECK("qgemm_dense_kernel");
        return;
    }
    if (bias) add_bias_cuda(be, out, ldo, bias, T, N);
}
