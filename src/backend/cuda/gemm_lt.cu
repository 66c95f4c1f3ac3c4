/* gemm_lt: the GEMMs cuBLASLt runs for the other op files (matmul.cu's BF16 and F32 weights, the
 * W4A16 kernels' prefill route in w4_dense.cu, the bench's BF16 ceiling), and the two epilogues
 * that follow them: the two BF16 halves' rows joined, a bias added. It calls nothing of the
 * other op files. */
#include "common.cuh"

/* thread (t, n): out[t, n] = y[t, n] + y[T + t, n] (+ bias[n]) */
static __global__ void join_halves_kernel(float *out, int ldo, const float *y, const float *bias, int T, int N)
{
    int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[(i / N) * ldo + i % N] = y[i] + y[n + i] + (bias ? bias[i % N] : 0.f);
}

static __global__ void add_bias_kernel(float *out, int ldo, const float *bias, int T, int N)
{
    int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[(i / N) * ldo + i % N] += bias[i % N];
}

void join_halves_cuda(Backend *be, float *out, int ldo, const float *y, const float *bias, int T, int N)
{
    int64_t m = (int64_t)T * N;
    join_halves_kernel<<<cdiv(m, 256) < 65535 ? cdiv(m, 256) : 65535, 256, 0, cuda_stream(be)>>>(out, ldo, y, bias, T, N);
    LAUNCH_CHECK("join_halves_kernel");
}

void add_bias_cuda(Backend *be, float *out, int ldo, const float *bias, int T, int N)
{
    int64_t n = (int64_t)T * N;
    add_bias_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(out, ldo, bias, T, N);
    LAUNCH_CHECK("add_bias_kernel");
}

/* Row-major out[T, N] (ld ldo) = X[T, K] (ld ldx) W[N, K]^T: in cuBLAS's column-major view,
 * C (N x T) = op(A) B with A = W as a K x N matrix (transposed) and B = X as K x T. */
void lt_matmul(Backend *be, float *out, int ldo, const void *x, cudaDataType xt, int ldx, const void *w,
                      cudaDataType wt, int T, int N, int K)
{
    lt_matmul_scaled(be, out, ldo, x, xt, ldx, w, wt, T, N, K, 1.f);
}

void lt_matmul_scaled(Backend *be, float *out, int ldo, const void *x, cudaDataType xt, int ldx, const void *w,
                      cudaDataType wt, int T, int N, int K, float alpha)
{
    CudaState *s = cuda_state(be);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, wt, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, xt, K, T, ldx));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, T, ldo));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->lt_ws_size,
                                                      sizeof s->lt_ws_size));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, lc, lc, pref, 1, &heur, &found));
    if (!found) die("cuBLASLt: no algorithm for %d x %d x %d", T, N, K);
    float beta = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(s->lt, op, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &heur.algo, cuda_lt_ws(be),
                                s->lt_ws_size, cuda_stream(be)));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
}
