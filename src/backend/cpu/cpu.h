/* cpu.h: the CPU backend, the readable reference. Every op here is the twin of the CUDA op of
 * the same name (rmsnorm_cpu / rmsnorm_cuda) with the same arguments; float32 maths, OpenMP
 * over rows, weights decoded from their stored format one row at a time. */
#ifndef MOESERVE_CPU_H
#define MOESERVE_CPU_H

#include "../backend.h"
#include "../kv_elem.h"

/* A growable per-thread scratch buffer (slot 0..CPU_SCRATCH_SLOTS-1): grows, never shrinks,
 * so steady-state steps do not allocate. */
#define CPU_SCRATCH_SLOTS 8
void *cpu_scratch(int slot, size_t bytes);
float cpu_dot(const float *a, const float *b, int64_t n);

void fill_cpu(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed);
void argmax_cpu(Backend *be, int *out, const float *x, int rows, int n);
void sample_cpu(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params);
void embed_cpu(Backend *be, float *out, const int *tokens, int T, const QTensor *emb);
void rmsnorm_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                 int rows, int dim, float eps);
void layernorm_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                   const float *b, int rows, int dim, float eps);
void rope_cpu(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off,
              int rot_dim, const int *pos, const float *inv_freq, float scale, int interleave);
void add_cpu(Backend *be, float *out, const float *a, const float *b, size_t n);
void get_rows_cpu(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim);
void swiglu_cpu(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F);
void kv_write_cpu(Backend *be, void *cache, KVDtype dt, float scale, int width, int off,
                  const float *src, int ld, int n, const int *slot, int T);
void matmul_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, int T,
                const QTensor *w, const float *bias);
void router_cpu(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T,
                const ModelConfig *c);
int moe_cpu(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
            const MoeExperts *ex, const ModelConfig *c);
void attention_gqa_cpu(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                       const ModelConfig *c);
void attention_mla_cpu(Backend *be, float *out, const float *q, const KVLayer *kv,
                       const QTensor *wkv_b, const int *topk, int ktop, const Batch *b,
                       const ModelConfig *c);
void kv_gather_cpu(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                   const int *bt, int block_size, int j0, int rows);
void attention_mla_piece_cpu(Backend *be, float *out, float *st, const float *q, const float *kv,
                             const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                             int ktop, int first, int last, const Batch *b, const ModelConfig *c);
void indexer_cpu(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv,
                 const Batch *b, const ModelConfig *c);

/* codec_e4m3_to_f32 of every code, as a table (backend_cpu_init fills it) */
extern float cpu_e4m3[256];

/* Elements [off, off + n) of row `row` of a KV cache (rows of width elements of dt) as float32:
 * a pointer into the cache itself when it is float32, else the row decoded into buf [n]. */
static inline const float *cpu_kv_row(const void *cache, KVDtype dt, float scale, int64_t row, int width,
                                      int off, int n, float *buf)
{
    int64_t i0 = row * width + off;
    if (dt == KV_DTYPE_F32) return (const float *)cache + i0;
    /* one loop per dtype (kv_elem_load's cases) so that each vectorises */
    if (dt == KV_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)cache + i0;
        for (int i = 0; i < n; i++) buf[i] = codec_bf16_to_f32(p[i]);
    } else {
        const uint8_t *p = (const uint8_t *)cache + i0;
        for (int i = 0; i < n; i++) buf[i] = cpu_e4m3[p[i]] * scale;
    }
    return buf;
}

/* Slot of position p of sequence s in the batch's paged cache. */
static inline int cpu_slot(const Batch *b, int s, int p, int block_size)
{
    return b->block_table[(int64_t)s * b->bt_stride + p / block_size] * block_size + p % block_size;
}

#endif
