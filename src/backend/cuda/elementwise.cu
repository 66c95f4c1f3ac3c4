/* elementwise: embedding, RoPE, residual add, row gather, SwiGLU and the KV-cache write on the
 * GPU. Twins of src/backend/cpu/elementwise.c (same arguments, same operation order); all are
 * memory-bound, one thread per element (or per rotated pair). */
#include "../fill.h"
#include "common.cuh"

/* element i: the same function of (seed, i) as fill_cpu */
static __global__ void fill_kernel(void *p, size_t n, FillKind kind, float a, float b, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        switch (kind) {
        case FILL_F32_NORMAL: ((float *)p)[i] = a + b * fill_normal(seed, i); break;
        case FILL_BF16_NORMAL: ((__nv_bfloat16 *)p)[i] = __float2bfloat16(a + b * fill_normal(seed, i)); break;
        case FILL_U8_RANDOM: ((uint8_t *)p)[i] = (uint8_t)fill_hash(seed, i); break;
        case FILL_U8_CONST: ((uint8_t *)p)[i] = (uint8_t)a; break;
        case FILL_E4M3_UNIT: ((uint8_t *)p)[i] = fill_e4m3_unit(seed, i); break;
        }
    }
}

void fill_cuda(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed)
{
    if (!n) return;
    fill_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(p, n, kind, a, b, seed);
    LAUNCH_CHECK("fill_kernel");
}

/* thread (t, i): out[t, i] = emb[tokens[t], i] */
static __global__ void embed_kernel(float *out, const int *tokens, int T, QTensor emb)
{
    int64_t D = emb.cols, n = (int64_t)T * D;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = qt_elem(emb, tokens[i / D], i % D);
}

void embed_cuda(Backend *be, float *out, const int *tokens, int T, const QTensor *emb)
{
    int64_t n = (int64_t)T * emb->cols;
    embed_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(out, tokens, T, *emb);
    LAUNCH_CHECK("embed_kernel");
}

/* thread (t, h, i): rotates pair i of head h of token t */
static __global__ void rope_kernel(float *x, int ld, int T, int n_heads, int head_stride, int rot_off, int half,
                                   const int *pos, const float *inv_freq, float scale, int interleave)
{
    int64_t n = (int64_t)T * n_heads * half;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < n; g += (int64_t)gridDim.x * blockDim.x) {
        int i = g % half, h = (g / half) % n_heads;
        int64_t t = g / ((int64_t)half * n_heads);
        float a = (float)pos[t] * inv_freq[i];
        float cs = cosf(a) * scale, sn = sinf(a) * scale;
        float *v = x + t * ld + (int64_t)h * head_stride + rot_off;
        int i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs - x1 * sn;
        v[i1] = x1 * cs + x0 * sn;
    }
}

void rope_cuda(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off, int rot_dim,
               const int *pos, const float *inv_freq, float scale, int interleave)
{
    int64_t n = (int64_t)T * n_heads * (rot_dim / 2);
    if (n == 0) return;
    rope_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(
        x, ld, T, n_heads, head_stride, rot_off, rot_dim / 2, pos, inv_freq, scale, interleave);
    LAUNCH_CHECK("rope_kernel");
}

static __global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

void add_cuda(Backend *be, float *out, const float *a, const float *b, size_t n)
{
    if (!n) return;
    add_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(out, a, b, n);
    LAUNCH_CHECK("add_kernel");
}

/* block i copies row rows[i] (rows may alias out only when rows[i] == i or later rows) */
static __global__ void get_rows_kernel(float *out, const float *x, int ld, const int *rows, int dim)
{
    int i = blockIdx.x;
    const float *src = x + (int64_t)rows[i] * ld;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) out[(int64_t)i * dim + d] = src[d];
}

void get_rows_cuda(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim)
{
    if (!n) return;
    get_rows_kernel<<<n, 256, 0, cuda_stream(be)>>>(out, x, ld, rows, dim);
    LAUNCH_CHECK("get_rows_kernel");
}

static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void swiglu_cuda(Backend *be, float *out, const float *gate, const float *up, int T, int F)
{
    int64_t n = (int64_t)T * F;
    if (!n) return;
    swiglu_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(out, gate, up, n);
    LAUNCH_CHECK("swiglu_kernel");
}

/* block t writes token t's row into its cache slot, rounded to the cache dtype (kv_elem.h, the
 * codec kv_write_cpu uses); thread i owns elements i, i + blockDim, ... (a negative slot is
 * padding: skipped) */
static __global__ void kv_write_kernel(void *cache, KVDtype dt, float scale, int width, int off, const float *src,
                                       int ld, int n, const int *slot)
{
    int t = blockIdx.x, s = slot[t];
    if (s < 0) return;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        kv_elem_store(cache, dt, (int64_t)s * width + off + i, src[(int64_t)t * ld + i], scale);
}

void kv_write_cuda(Backend *be, void *cache, KVDtype dt, float scale, int width, int off, const float *src, int ld,
                   int n, const int *slot, int T)
{
    if (!T) return;
    kv_write_kernel<<<T, 256, 0, cuda_stream(be)>>>(cache, dt, scale, width, off, src, ld, n, slot);
    LAUNCH_CHECK("kv_write_kernel");
}

/* block r: the largest x[r, :] and its lowest index */
static __global__ void argmax_kernel(int *out, const float *x, int n)
{
    __shared__ float rv[256];
    __shared__ int ri[256];
    int i = block_argmax(x + (int64_t)blockIdx.x * n, NULL, n, rv, ri);
    if (threadIdx.x == 0) out[blockIdx.x] = i < 0 ? 0 : i;
}

void argmax_cuda(Backend *be, int *out, const float *x, int rows, int n)
{
    if (!rows) return;
    argmax_kernel<<<rows, 256, 0, cuda_stream(be)>>>(out, x, n);
    LAUNCH_CHECK("argmax_kernel");
}
