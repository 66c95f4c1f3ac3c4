/* common.cuh: what every CUDA op file shares: error checks, the backend's private state, the
 * device decode of a QTensor element (the twin of qtensor_decode), the KV cache's element codec
 * (kv_elem.h), block reductions. */
#ifndef MOESERVE_CUDA_COMMON_CUH
#define MOESERVE_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../base/knobs.h"
#include "../../base/util.h"
#include "../backend.h"
#include "cuda.h"
}
#include "../kv_elem.h" /* the KV cache's element codec, shared with the cpu (inline, host and device) */

#define CUDA_CHECK(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) die("CUDA: %s: %s", #call, cudaGetErrorString(e_)); } while (0)
#define CUBLAS_CHECK(call) do { cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) die("cuBLASLt: %s: status %d", #call, (int)s_); } while (0)

/* After every launch: the launch error, and with MOESERVE_SYNC=1 the kernel's own fault. */
void cuda_launch_check(const char *kernel, const char *file, int line);
#define LAUNCH_CHECK(name) cuda_launch_check(name, __FILE__, __LINE__)

#define CUDA_SCRATCH_SLOTS 24

typedef struct {
    int device;
    cudaStream_t stream;
    cudaStream_t side, side2;             /* work that runs beside the stream's (w4_moe.cu: the MoE's small and hot classes) */
    cudaEvent_t fork, join, join2;        /* the sides wait for stream at fork; stream for them at join, join2 */
    /* the model's side (be_side_begin): while on_side the ops go to stream3, with set 1 of the
     * scratch and of the cuBLASLt workspace, so that nothing they write is the stream's */
    cudaStream_t stream3;
    cudaEvent_t fork3, join3;
    int on_side;
    long side_calls;                      /* be_side_begin calls that went beside (tests) */
    cublasLtHandle_t lt;
    void *lt_ws[2];                       /* cuBLASLt workspace: the stream's, the side's */
    size_t lt_ws_size;
    void *scratch[2][CUDA_SCRATCH_SLOTS]; /* grow-only scratch buffers: the stream's, the side's */
    size_t scratch_cap[2][CUDA_SCRATCH_SLOTS];
    int sync;                             /* MOESERVE_SYNC=1 */
    unsigned scratch_epoch;               /* +1 whenever a scratch buffer is replaced */
} CudaState;

static inline CudaState *cuda_state(Backend *be) { return (CudaState *)be->impl; }
/* where the ops go now: the stream, or stream3 between side_begin and side_end */
static inline cudaStream_t cuda_stream(Backend *be) { return cuda_state(be)->on_side ? cuda_state(be)->stream3 : cuda_state(be)->stream; }
/* the cuBLASLt workspace of the ops' stream */
static inline void *cuda_lt_ws(Backend *be) { return cuda_state(be)->lt_ws[cuda_state(be)->on_side]; }
/* A grow-only device buffer for one op's temporaries (slots are per op file, see cuda.cu), of
 * the ops' stream (the side has its own set). */
void *cuda_scratch(Backend *be, int slot, size_t bytes);
/* the bytes a scratch slot of the ops' stream holds now */
static inline size_t cuda_scratch_cap(Backend *be, int slot) { return cuda_state(be)->scratch_cap[cuda_state(be)->on_side][slot]; }
enum { SCR_MM_X = 0, SCR_MM_Y, SCR_MOE_COUNT, SCR_MOE_ROWS, SCR_MOE_H, SCR_MOE_U, SCR_MOE_Y, SCR_MOE_TILES,
       SCR_IDX_SCORES, SCR_MOE_TABLE, SCR_W4_X, SCR_W4_PART, SCR_W4_WB, SCR_MLA_QA, SCR_MLA_OL, SCR_MLA_PART,
       SCR_W4_XP, SCR_MLA_MASK, SCR_MLA_HALVES, SCR_GQA_PART };

static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }

/* ---- device decode of stored weights (the twin of qtensor_decode, same operation order) ---- */

__device__ __forceinline__ float e4m3_dec(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 0) v = ldexpf((float)m, -9);                 /* subnormal: m/8 * 2^-6 */
    else if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
    else v = ldexpf((float)(8 + m), e - 10);              /* (1 + m/8) * 2^(e-7) */
    return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ float e2m1_dec(int code)
{
    /* magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (E2M1, quant.c): from 2 up, 2^(e - 1) (1 + m / 2) of
     * exponent e = code / 2 and mantissa bit m = code & 1, built as float bits (a table indexed
     * by a variable would sit in local memory) */
    int m = code & 7;
    float v = m < 2 ? 0.5f * (float)m : __int_as_float(((m >> 1) + 126) << 23 | (m & 1) << 22);
    return (code & 8) ? -v : v;
}

/* The W4P layout of NVFP4 weights: see w4_common.cuh. */
#define W4_REC 2304     /* bytes of a 16 x 256 record */
#define W4_KG 256       /* columns per record */
/* Where the pack puts the code of register r (0..3), BF16 half h (0 low, 1 high) of a word: the
 * lowest of its 3 magnitude bits, then its sign bit. w4_decode (w4_common.cuh) takes them back: register
 * 0 as is, 1 shifted left by 3, 2 its magnitudes by 6 and signs by 2, 3 its magnitudes rotated by
 * 13 and signs shifted by 1 (the 32 bits: 0-2 r2, 3-5 r1, 6-8 r0, 9-11 r3, 12 r1, 13 r2, 14 r3,
 * 15 r0, then the same + 16 with the halves swapped for r3). */
#define W4_BITS                                                                                                        \
    {                                                                                                                  \
        {{6, 15}, {22, 31}}, {{3, 12}, {19, 28}}, {{0, 13}, {16, 29}}, { {25, 14}, {9, 30} }                           \
    }

/* W4_BITS flattened (entry 2 r + h), 5 bits an entry: {6, 22, 3, 19, 0, 16, 25, 9} and
 * {15, 31, 12, 28, 13, 29, 14, 30} */
#define W4_BITS_MAG                                                                                                    \
    (6ull | 22ull << 5 | 3ull << 10 | 19ull << 15 | 0ull << 20 | 16ull << 25 | 25ull << 30 | 9ull << 35)
#define W4_BITS_SIGN                                                                                                   \
    (15ull | 31ull << 5 | 12ull << 10 | 28ull << 15 | 13ull << 20 | 29ull << 25 | 14ull << 30 | 30ull << 35)

__device__ __forceinline__ float w4_scale_dec(uint8_t b)
{
    /* (1 + m / 8) 2^(e - 10) of e = b >> 3 (0..31), m = b & 7; 0 is zero */
    return b ? __int_as_float(((b >> 3) + 117) << 23 | (b & 7) << 20) : 0.f;
}

/* W[r, k] of a packed NVFP4 tensor, the W4P layout of w4_common.cuh (the twin of qtensor_decode). */
__device__ __forceinline__ float w4_elem(const QTensor &w, int64_t r, int64_t k)
{
    int64_t i = r >> 4;
    int rr = (int)(r & 15), g = rr & 7, hi = rr >> 3;
    int64_t G = k >> 8;
    int c = (int)(k >> 6) & 3, t = (int)(k >> 4) & 3, j = (int)(k >> 2) & 3, q = (int)k & 3;
    const uint8_t *rec = w.data + (i * (w.cols >> 8) + G) * W4_REC;
    int lane = g * 4 + t;
    uint32_t word = *(const uint32_t *)(rec + c * 512 + lane * 16 + j * 4);
    /* W4_BITS[2 (q >> 1) + hi][q & 1] as 5-bit fields of two constants (a table indexed by a
     * variable would sit in local memory): the magnitude's and the sign's bit positions */
    int f = 5 * (2 * (2 * (q >> 1) + hi) + (q & 1));
    int bm = (int)((W4_BITS_MAG >> f) & 31), bs = (int)((W4_BITS_SIGN >> f) & 31);
    int code = (int)((word >> bm) & 7) | (int)((word >> bs) & 1) << 3;
    return e2m1_dec(code) * (w4_scale_dec(rec[2048 + lane * 8 + 2 * c + hi]) * w.gscale);
}

/* W[r, k] of a QTensor whose pointers are device pointers. */
__device__ __forceinline__ float qt_elem(const QTensor &w, int64_t r, int64_t k)
{
    int64_t K = w.cols;
    switch (w.fmt) {
    case QF_F32: return ((const float *)w.data)[r * K + k];
    case QF_BF16: return __bfloat162float(((const __nv_bfloat16 *)w.data)[r * K + k]);
    case QF_F16: return __half2float(((const __half *)w.data)[r * K + k]);
    case QF_FP8: return e4m3_dec(w.data[r * K + k]) * w.gscale;
    case QF_FP8_BLOCK: {
        int64_t gk = (K + 127) / 128, idx = ((w.scale_row_off + r) / 128) * gk + k / 128;
        float s = w.scale_dtype == DT_BF16 ? __bfloat162float(((const __nv_bfloat16 *)w.scale)[idx])
                                           : ((const float *)w.scale)[idx];
        return e4m3_dec(w.data[r * K + k]) * s;
    }
    case QF_NVFP4: {
        if (w.packed) return w4_elem(w, r, k);
        uint8_t byte = w.data[r * (K / 2) + k / 2];
        float bs = e4m3_dec(w.scale[r * (K / 16) + k / 16]);
        return e2m1_dec((k & 1) ? byte >> 4 : byte & 15) * (bs * w.gscale);
    }
    default: return 0.f;
    }
}

/* Let a kernel launched after this one with programmatic dependent launch (the W4A16 stream-K
 * GEMMs, the MoE down projection: w4_*.cu) start on the SMs this one leaves free and fetch its
 * weights while this one runs; it still waits for this kernel's end before reading its output
 * (griddepcontrol.wait). Called first by the kernels a decode step runs before its GEMMs. A
 * no-op before sm_90 and for dependents launched the ordinary way. */
__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The other side: a kernel launched with programmatic dependent launch waits here until the kernel
 * before it has ended and its memory is visible (a no-op before sm_90 and after an ordinary launch). */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); every thread gets the result. */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float block_sum(float v, float *red /* [32] shared */)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}

/* Block-wide argmax of v[0..n) over entries with mask[i] == 0 (mask may be NULL), ties to the
 * lowest index; -1 if none. rv, ri: shared arrays of blockDim.x (a power of two). Every thread
 * gets the result. */
__device__ __forceinline__ int block_argmax(const float *v, const unsigned char *mask, int n, float *rv, int *ri)
{
    float best = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if ((!mask || !mask[i]) && (bi < 0 || v[i] > best)) { best = v[i]; bi = i; }
    rv[threadIdx.x] = best;
    ri[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = rv[threadIdx.x + s];
            int oi = ri[threadIdx.x + s], mi = ri[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > rv[threadIdx.x] || (ov == rv[threadIdx.x] && oi < mi))) {
                rv[threadIdx.x] = ov;
                ri[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    int r = ri[0];
    __syncthreads();
    return r;
}

/* Slot of position p of sequence s in a device batch. */
__device__ __forceinline__ int batch_slot(const int *block_table, int bt_stride, int s, int p, int bs)
{
    return block_table[(int64_t)s * bt_stride + p / bs] * bs + p % bs;
}

/* The ops (cuda twins of the *_cpu functions, same arguments). */
void fill_cuda(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed);
void argmax_cuda(Backend *be, int *out, const float *x, int rows, int n);
void sample_cuda(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params);
void embed_cuda(Backend *be, float *out, const int *tokens, int T, const QTensor *emb);
void rmsnorm_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, int rows, int dim, float eps);
void layernorm_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, const float *b,
                    int rows, int dim, float eps);
void rope_cuda(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off, int rot_dim,
               const int *pos, const float *inv_freq, float scale, int interleave);
void add_cuda(Backend *be, float *out, const float *a, const float *b, size_t n);
void get_rows_cuda(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim);
void swiglu_cuda(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F);
void kv_write_cuda(Backend *be, void *cache, KVDtype dt, float scale, int width, int off, const float *src, int ld,
                   int n, const int *slot, int T);
void matmul_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias);
/* attention_gqa.cu: grouped-query attention for the head shapes gqa_kernel has instances of (else
 * attention_gqa_cuda's general kernel); returns 0 when it launched nothing */
extern "C" int gqa_supported(const ModelConfig *c, const KVLayer *kv);
extern "C" int gqa_attention_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                                  const ModelConfig *c);
extern "C" void gqa_reserve(Backend *be, const ModelConfig *c, int T);
void router_cuda(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T, const ModelConfig *c);
int moe_cuda(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
             const MoeExperts *ex, const ModelConfig *c);
void attention_gqa_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b, const ModelConfig *c);
void attention_mla_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c);
/* the MLA kernels' scratch for a step of T tokens and a piece of rows positions (cuda_reserve) */
void mla_decode_reserve(Backend *be, const ModelConfig *c, int T);
void mla_prefill_reserve(Backend *be, const ModelConfig *c, int rows);
void kv_gather_cuda(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                    const int *bt, int block_size, int j0, int rows);
void attention_mla_piece_cuda(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                              int ldk, int j0, int n, int t0, int nt, const int *topk, int ktop, int first, int last,
                              const Batch *b, const ModelConfig *c);
void indexer_cuda(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv, const Batch *b,
                  const ModelConfig *c);
/* Row-major out[T, N] (float32, ld ldo) = X[T, K] W[N, K]^T through cuBLASLt, X and W of types
 * xt and wt (gemm_lt.cu). */
void lt_matmul(Backend *be, float *out, int ldo, const void *x, cudaDataType xt, int ldx, const void *w, cudaDataType wt,
               int T, int N, int K);
/* out[t, n] = y[t, n] + y[T + t, n] (+ bias[n]): the two BF16 halves' GEMM rows joined */
void join_halves_cuda(Backend *be, float *out, int ldo, const float *y, const float *bias, int T, int N);
/* out[t, n] += bias[n] */
void add_bias_cuda(Backend *be, float *out, int ldo, const float *bias, int T, int N);
/* the same times alpha */
void lt_matmul_scaled(Backend *be, float *out, int ldo, const void *x, cudaDataType xt, int ldx, const void *w,
                      cudaDataType wt, int T, int N, int K, float alpha);
/* out[t, :] = sum_k wts[t, k] * y[t*K + k, :] in k order: the MoE combine (moe.cu). */
void moe_combine_cuda(Backend *be, float *out, const float *y, const float *wts, const int *idx, int T, int K, int D);
/* The W4A16 kernels for packed NVFP4 weights (w4_pack.cu, w4_dense.cu, w4_moe.cu). */
void w4_pack_cuda(Backend *be, uint8_t *dst, const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K);
void w4_matmul_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias);
int w4_moe_cuda(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T, const MoeExperts *ex,
                const ModelConfig *c);

#endif
