/* norm: RMSNorm and LayerNorm on the GPU, one block per row (twins of rmsnorm_cpu and
 * layernorm_cpu; the sum of squares in float32 across the block). */
#include "common.cuh"

static __global__ void rmsnorm_kernel(float *out, int ldo, const float *x, int ldx, const float *w, int dim, float eps)
{
    __shared__ float red[32];
    pdl_trigger();
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *o = out + (int64_t)blockIdx.x * ldo;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

void rmsnorm_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, int rows, int dim, float eps)
{
    if (!rows) return;
    int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    rmsnorm_kernel<<<rows, threads, 0, cuda_stream(be)>>>(out, ldo, x, ldx, w, dim, eps);
    LAUNCH_CHECK("rmsnorm_kernel");
}

static __global__ void layernorm_kernel(float *out, int ldo, const float *x, int ldx, const float *w, const float *b,
                                        int dim, float eps)
{
    __shared__ float red[32];
    pdl_trigger();
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *o = out + (int64_t)blockIdx.x * ldo;
    float s = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    float mean = block_sum(s, red) / dim;
    float v = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    float inv = 1.0f / sqrtf(block_sum(v, red) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

void layernorm_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, const float *b,
                    int rows, int dim, float eps)
{
    if (!rows) return;
    int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    layernorm_kernel<<<rows, threads, 0, cuda_stream(be)>>>(out, ldo, x, ldx, w, b, dim, eps);
    LAUNCH_CHECK("layernorm_kernel");
}
