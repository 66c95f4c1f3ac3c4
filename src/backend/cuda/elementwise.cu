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

/* block (x, y): columns of rows y, y + gridDim.y, ...; gate and up rows ld apart (be_swiglu) */
static __global__ void swiglu_kernel(float *out, const float *gate, const float *up, int ld, int T, int F)
{
    pdl_trigger(); /* the down projection after it */
    for (int t = blockIdx.y; t < T; t += gridDim.y)
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < F; j += gridDim.x * blockDim.x) {
            float g = gate[(int64_t)t * ld + j];
            out[(int64_t)t * F + j] = g / (1.0f + expf(-g)) * up[(int64_t)t * ld + j];
        }
}

void swiglu_cuda(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F)
{
    if (!T || !F) return;
    dim3 grid(cdiv(F, 256) < 65535 ? cdiv(F, 256) : 65535, T < 65535 ? T : 65535);
    swiglu_kernel<<<grid, 256, 0, cuda_stream(be)>>>(out, gate, up, ld, T, F);
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

/* block r: the largest x[r, :] and its lowest index, as argmax_cpu: NaN never wins, and a NaN
 * at index 0 (where argmax_cpu starts) gives 0. 1024 threads, each reading 4 float4 (16 values)
 * per round with the loads in flight together where the row is 16-byte aligned: a 155k vocabulary
 * is ~10 rounds (one thread block of 256 walking it a float at a time took 250 us a step). */
#define ARGMAX_THREADS 1024
__device__ __forceinline__ void argmax_take(float v, int i, float &best, int &bi)
{
    if (v == v && (bi < 0 || v > best)) { /* a thread's indices rise: > keeps the lowest of a tie */
        best = v;
        bi = i;
    }
}

/* the warp's (best, bi): the larger value, or the lower index of a tie; bi < 0 holds nothing */
__device__ __forceinline__ void argmax_warp(float &best, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
            best = ov;
            bi = oi;
        }
    }
}

static __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(int *out, const float *x, int n)
{
    __shared__ float rv[32];
    __shared__ int ri[32];
    const float *v = x + (int64_t)blockIdx.x * n;
    float best = -INFINITY;
    int bi = -1, i0 = 0;
    if (((uintptr_t)v & 15) == 0) {
        const float4 *v4 = (const float4 *)v;
        int n4 = n / 4, step = 4 * ARGMAX_THREADS;
        for (int b = 0; b < n4; b += step) {
            float4 f[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int k = b + u * ARGMAX_THREADS + threadIdx.x;
                f[u] = k < n4 ? __ldg(v4 + k) : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int k = 4 * (b + u * ARGMAX_THREADS + threadIdx.x);
                argmax_take(f[u].x, k, best, bi);
                argmax_take(f[u].y, k + 1, best, bi);
                argmax_take(f[u].z, k + 2, best, bi);
                argmax_take(f[u].w, k + 3, best, bi);
            }
        }
        i0 = 4 * n4;
    }
    for (int i = i0 + threadIdx.x; i < n; i += ARGMAX_THREADS) argmax_take(v[i], i, best, bi);
    argmax_warp(best, bi); /* the warp's, then the block's */
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        rv[w] = best;
        ri[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        best = rv[lane];
        bi = ri[lane];
        argmax_warp(best, bi);
        if (lane == 0) out[blockIdx.x] = bi < 0 || v[0] != v[0] ? 0 : bi;
    }
}

void argmax_cuda(Backend *be, int *out, const float *x, int rows, int n)
{
    if (!rows) return;
    argmax_kernel<<<rows, ARGMAX_THREADS, 0, cuda_stream(be)>>>(out, x, n);
    LAUNCH_CHECK("argmax_kernel");
}
