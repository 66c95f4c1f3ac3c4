/* backend.h: the op table. The model (src/model/) is written once in terms of these ops; a
 * backend (cpu/, cuda/) implements them. Every op also records the FLOPs it did and the bytes
 * it had to move, computed from its shapes in backend.c, one place for every backend: the
 * diagnosis (#9) is built on these counts.
 *
 * All activations are float32 in the backend's memory (host for cpu, device for cuda), row
 * major, with an explicit leading dimension (ld, in elements) where rows may be strided.
 * Shape letters are those of model/model.h. Ops that read a Batch get it twice: hb on the host (for
 * the counts) and db, the same batch with its arrays in the backend's memory (for the work);
 * on the cpu backend they are the same. */
#ifndef MOESERVE_BACKEND_H
#define MOESERVE_BACKEND_H

#include <stddef.h>

#include "../base/opt.h"
#include "../format/config.h"
#include "../format/quant.h"
#include "sample.h"

/* Ops, grouped by the category diagnosis reports them under (op_category). */
typedef enum {
    OP_EMBED,        /* norm/elementwise */
    OP_RMSNORM,
    OP_LAYERNORM,
    OP_ROPE,
    OP_ADD,
    OP_GET_ROWS,
    OP_SWIGLU,
    OP_KV_WRITE,
    OP_GEMM_ATTN,    /* dense GEMM: attention projections */
    OP_GEMM_MLP,     /* dense GEMM: dense MLP and shared expert */
    OP_GEMM_LM_HEAD, /* dense GEMM: lm_head */
    OP_GEMM_INDEXER, /* indexer projections */
    OP_GEMM_ROUTER,  /* router logits */
    OP_ROUTER,       /* sigmoid, correction bias, grouped top-k, normalisation */
    OP_MOE,          /* dispatch + expert GEMMs + combine */
    OP_ATTENTION,    /* GQA / MLA attention over the paged cache */
    OP_INDEXER,      /* DSA scores + top-k */
    OP_SAMPLE,       /* sampling on the device */
    /* communication (src/dist): counted and timed like the other ops, bytes = bytes a rank sends */
    OP_ALL_REDUCE,   /* tensor-parallel sums (attention output, FFN output) */
    OP_ALL_GATHER,   /* vocabulary-split lm_head logits */
    OP_ALL_TO_ALL,   /* expert-parallel exchange */
    OP_PP_SEND,      /* pipeline: hidden state to the next stage */
    OP_PP_RECV,      /* pipeline: from the previous stage (includes waiting for it: the bubble) */
    OP_COUNT
} OpId;

typedef enum { CAT_GEMM, CAT_MOE, CAT_ATTENTION, CAT_INDEXER, CAT_ELEMENTWISE, CAT_ROUTER,
               CAT_SAMPLE, CAT_ALL_REDUCE, CAT_ALL_TO_ALL, CAT_PP, CAT_COUNT } OpCategory;

typedef struct {
    double flops;    /* floating-point operations (a multiply-add counts 2) */
    double bytes;    /* bytes that had to move: weights read + activations read and written */
    long calls;
} OpStat;

const char *op_name(OpId op);
OpCategory op_category(OpId op);
const char *op_category_name(OpCategory c);

/* The paged KV cache of one layer, as the attention ops see it. Elements are of type dtype
 * (kv_elem.h: kv_write rounds to it, the ops read it back as float32). */
typedef struct {
    void *kv;            /* [n_blocks * block_size, kv_width] dtype: GQA [k Hkv*Dh | v Hkv*Dh];
                            MLA [latent C | roped k_pe Dr] */
    void *idx;           /* [n_blocks * block_size, Di] dtype indexer keys (roped, normed), or NULL */
    int block_size;
    int kv_width, idx_width;
    KVDtype dtype;       /* of kv and idx; never KV_DTYPE_AUTO */
    float k_scale;       /* FP8: GQA k, MLA the whole row (x = code * scale); 1 otherwise */
    float v_scale;       /* FP8: GQA v; 1 otherwise. The indexer keys use scale 1 */
} KVLayer;

/* The routed experts of one MoE layer as the moe op reads them (model/moe.c makes the view from
 * LayerWeights). */
typedef struct {
    const QTensor *gate, *up;  /* [E] of [F, D] */
    const QTensor *down;       /* [E] of [D, F] */
    const QTensor *table;      /* [3, E] gate, up, down QTensors in backend memory (device backends'
                                  kernels read them there), or NULL on the host */
} MoeExperts;

/* The tokens of one forward step over the paged KV cache (engine builds it, model/forward.c runs it). */
typedef struct {
    int n_tokens;              /* T */
    int *tokens;               /* [T] token ids */
    int *pos;                  /* [T] absolute position of each token in its sequence */
    int *seq;                  /* [T] sequence (0..S-1) each token belongs to */
    int *slot;                 /* [T] KV slot written: block * block_size + offset */
    int n_seqs;                /* S */
    int *seq_start;            /* [S] first token of the sequence in this batch; a sequence's
                                  tokens are contiguous and at consecutive positions */
    int *seq_ntok;             /* [S] tokens of the sequence in this batch */
    int *ctx_len;              /* [S] tokens in the KV cache after this step (last pos + 1) */
    int *block_table;          /* [S, bt_stride] block ids; row s covers ctx_len[s] positions */
    int bt_stride;             /* block-table row length (max blocks per sequence) */
    int max_ctx;               /* max of ctx_len (set by forward_run) */
    int n_out;                 /* rows that produce logits */
    int *out_idx;              /* [n_out] token index of each logits row */
    int *seq_group;            /* [S] attention data parallel (--dp): the group that holds each sequence's KV
                                  (its block-table ids are that group's pool's); NULL: group 0 */
    int verify_len;            /* speculative decoding: 1 + drafts a step at most. A sequence with at
                                  most this many tokens (at least 1) decodes: a token and its drafts,
                                  not a prompt chunk (MLA's form, graphs). 0: 1 */
} Batch;

typedef struct Backend Backend;

/* Random fills for dummy weights: element i is a function of (seed, i) alone, computed with
 * integer hashing and exact float arithmetic, so every backend writes the same values. */
typedef enum {
    FILL_F32_NORMAL,   /* float: a + b * z, z ~ Irwin-Hall(4), mean 0 variance 1 */
    FILL_BF16_NORMAL,  /* bf16: the same */
    FILL_U8_RANDOM,    /* bytes: uniform */
    FILL_U8_CONST,     /* bytes: a */
    FILL_E4M3_UNIT,    /* e4m3 bytes: random sign, magnitude in [0.5, 2) */
} FillKind;


/* The implementation of each op: the backend-specific part. Arguments as the be_* wrappers. */
typedef struct {
    void *(*alloc)(Backend *be, size_t bytes);     /* activation / cache memory, zeroed */
    void (*free)(Backend *be, void *p);
    void (*destroy)(Backend *be);                  /* releases impl; may be NULL */
    void (*fill)(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed);
    void (*embed)(Backend *be, float *out, const int *tokens, int T, const QTensor *emb);
    void (*rmsnorm)(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                    int rows, int dim, float eps);
    void (*layernorm)(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                      const float *b, int rows, int dim, float eps);
    void (*rope)(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off,
                 int rot_dim, const int *pos, const float *inv_freq, float scale, int interleave);
    void (*add)(Backend *be, float *out, const float *a, const float *b, size_t n);
    void (*get_rows)(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim);
    void (*to_host)(Backend *be, void *dst, const void *src, size_t bytes);
    void (*to_device)(Backend *be, void *dst, const void *src, size_t bytes);
    void (*swiglu)(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F);
    void (*kv_write)(Backend *be, void *cache, KVDtype dt, float scale, int width, int off,
                     const float *src, int ld, int n, const int *slot, int T);
    void (*matmul)(Backend *be, float *out, int ldo, const float *x, int ldx, int T,
                   const QTensor *w, const float *bias);
    void (*router)(Backend *be, int *idx, float *wts, const float *logits, const float *bias,
                   int T, const ModelConfig *c);
    /* returns the number of distinct experts it touched (for the byte count), -1 unknown */
    int (*moe)(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
               const MoeExperts *ex, const ModelConfig *c);
    void (*attention_gqa)(Backend *be, float *out, const float *q, const KVLayer *kv,
                          const Batch *b, const ModelConfig *c);
    void (*attention_mla)(Backend *be, float *out, const float *q, const KVLayer *kv,
                          const QTensor *wkv_b, const int *topk, int ktop, const Batch *b,
                          const ModelConfig *c);
    void (*kv_gather)(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                      const int *bt, int block_size, int j0, int rows);
    void (*attention_mla_piece)(Backend *be, float *out, float *st, const float *q, const float *kv,
                                const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                                int ktop, int first, int last, const Batch *b, const ModelConfig *c);
    void (*indexer)(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv,
                    const Batch *b, const ModelConfig *c);
    void (*argmax)(Backend *be, int *out, const float *x, int rows, int n);
    void (*sample)(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params);
    /* optional (NULL on the cpu): size the scratch of every op for these limits now, so that
     * no allocation happens later (inside a captured graph above all) */
    void (*reserve)(Backend *be, const ModelConfig *c, int max_tokens, int max_out, int max_ctx);
    /* optional: capture the ops issued between graph_begin and graph_end into a graph that
     * graph_launch replays with the same buffers; graph_launch returns -1 (and runs nothing)
     * when a buffer the graph captured has been replaced since (a scratch buffer grew): the
     * caller captures again */
    void (*graph_begin)(Backend *be);
    void *(*graph_end)(Backend *be);
    int (*graph_launch)(Backend *be, void *graph);
    void (*graph_free)(Backend *be, void *graph);
    size_t (*mem_free)(Backend *be);               /* bytes free for the KV pool and the rest */
    /* optional: NVFP4 codes [N, K/2] and scales [N, K/16] (backend memory) rearranged into the
     * backend's kernel layout at dst (the same N*K/2 + N*K/16 bytes); see model_upload */
    void (*pack_nvfp4)(Backend *be, uint8_t *dst, const uint8_t *codes, const uint8_t *scales,
                       int64_t N, int64_t K);
    /* optional: make the calling thread use this backend's device (the engine thread) */
    void (*bind_thread)(Backend *be);
    /* optional (GPU backends; the cpu times ops with the wall clock): events on the stream for
     * diag/profile; event_elapsed waits for the later one and returns milliseconds */
    void *(*event_create)(Backend *be);
    void (*event_record)(Backend *be, void *e);
    double (*event_elapsed)(Backend *be, void *from, void *to);
    void (*event_destroy)(Backend *be, void *e);
    /* optional (GPU backends): work beside the stream. side_begin(T, kind): 1 if the ops that
     * follow (a T-row piece of the step, of that SideKind) run on a side stream that starts where
     * the stream is now, with their own scratch, else 0 (nothing changes); side_end: the ops that
     * follow go back to the stream, the side's work still running; side_join: the stream waits */
    int (*side_begin)(Backend *be, int T, int kind);
    void (*side_end)(Backend *be);
    void (*side_join)(Backend *be);
    /* optional (the sim backend, sim/sim.h): told of every op as it is counted, with its counts,
     * before the profiler's hook is */
    void (*op_done)(Backend *be, OpId op, double flops, double bytes);
} BackendOps;

/* Who listens to every op (diag/profile times a sampled step's ops this way): begin before an
 * op's work, end after it with the op and its counts. */
typedef struct {
    void (*begin)(void *ctx);
    void (*end)(void *ctx, OpId op, double flops, double bytes);
    void *ctx;
} OpHook;

struct Backend {
    const char *name;          /* "cpu", "cuda", "sim" */
    int host_memory;           /* 1: backend memory is host memory (cpu) */
    const BackendOps *ops;
    OpStat stats[OP_COUNT];    /* accumulated since the last backend_reset_stats */
    const OpHook *hook;        /* non-NULL while a step is timed op by op (diag/profile) */
    int n_threads;             /* cpu: OpenMP threads */
    void *impl;                /* backend-private state */
};

void backend_cpu_init(Backend *be, int n_threads);
/* --device cpu|cuda|cuda:N: the default (NULL) is cuda when this build has the CUDA backend and
 * a GPU is present, else cpu; threads <= 0: the cpu's OpenMP threads (shared by the ranks of a
 * node). A device this build or machine lacks is a fatal error saying why. */
const char *backend_default(void);
void backend_open(Backend *be, const char *device, int threads);  /* cpu, threads <= 0: backend_cpu_count() */
/* The CPUs this process may run on (its affinity mask), at least 1. */
int backend_cpu_count(void);
/* OpenMP threads that sleep when idle instead of spinning (a spinning pool starves itself and its
 * neighbours on a busy machine): unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, sets
 * OMP_WAIT_POLICY=passive and re-executes the program with argv (call first thing in main). */
void backend_omp_passive(char **argv);
/* Where a command runs, as its command line says: --device cpu|cuda|cuda:N|sim:GPU (NULL: a GPU
 * when one is present; sim/sim.h the modelled one), --threads N of the CPU backend (0: every core
 * this rank may use). */
typedef struct {
    const char *device;
    int threads;
} DeviceOpts;
OptGroup device_opt_group(DeviceOpts *o);
/* The device in words for logs and GET /get_server_info: the GPU's name, or "cpu (N threads)". */
void backend_describe(const Backend *be, const char *device, char *buf, size_t n);
/* Every GEMM and MoE op of be runs n times from now on, counted once, by a copy of its op table
 * (backend_open does this for the test hook MOESERVE_TEST_GEMM_REPEAT; backend_free releases it).
 * n <= 1: the backend's own table again, whose ops no repeat count slows. */
void backend_repeat_gemms(Backend *be, int n);
/* For ops implemented outside the backend (the collectives of src/dist): be_op_begin before
 * the work, be_count after it, exactly as the be_* wrappers below do around theirs (the
 * profiler times what lies between). */
void be_op_begin(Backend *be);
void be_count(Backend *be, OpId op, double flops, double bytes);
void backend_free(Backend *be);
void backend_reset_stats(Backend *be);

/* Work beside the stream (BackendOps side_begin): 1 if the ops up to be_side_end run beside the
 * ones after it until be_side_join, 0 if they run in order as usual (a backend without a side,
 * while a step is profiled op by op, or where the backend declines T rows of this kind: the MoE
 * layers' shared expert, GLM-5's indexer); the results are the same either way. be_side_end and
 * be_side_join only after a be_side_begin that returned 1. */
typedef enum { SIDE_SHARED_EXPERT, SIDE_INDEXER, SIDE_KINDS } SideKind;
int be_side_begin(Backend *be, int T, SideKind kind);
void be_side_end(Backend *be);
void be_side_join(Backend *be);

/* ---- The ops, as the model calls them. Each dispatches to be->ops and counts. ---- */

void *be_alloc(Backend *be, size_t bytes);
/* Memory still free on the backend (device memory; on the cpu, available RAM). */
size_t be_mem_free(Backend *be);
/* n elements of kind at p (backend memory), see FillKind */
void be_fill(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed);
void be_free(Backend *be, void *p);
/* out[T, D] = emb[tokens[t]] */
void be_embed(Backend *be, float *out, const int *tokens, int T, const QTensor *emb);
/* out[r, :dim] = w * x[r] / sqrt(mean(x[r]^2) + eps), rows r < rows; out may be x. */
void be_rmsnorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                int rows, int dim, float eps);
/* LayerNorm with weight and bias (biased variance), the DSA indexer's k_norm. */
void be_layernorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                  const float *b, int rows, int dim, float eps);
/* RoPE in place on x[t, h*head_stride + rot_off + 0..rot_dim) for each token t and head h:
 * pair i turns by the angle pos[t] * inv_freq[i] (inv_freq [rot_dim/2] in backend memory, see
 * rope_init), cos and sin multiplied by scale (YaRN's attention factor, else 1).
 * interleave: pairs (2i, 2i+1) (GPT-J, GLM-5); else NeoX halves (i, i + rot_dim/2) (GLM-4.5). */
void be_rope(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off,
             int rot_dim, const int *pos, const float *inv_freq, float scale, int interleave);
void be_add(Backend *be, float *out, const float *a, const float *b, size_t n);
/* out[i, :dim] = x[rows[i], :dim] (x rows ld apart), i < n */
void be_get_rows(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim);
/* Copy backend memory to the host (a plain memcpy on the cpu backend). */
void be_to_host(Backend *be, void *dst, const void *src, size_t bytes);
void be_to_device(Backend *be, void *dst, const void *src, size_t bytes);
/* out[T, F] = silu(gate) * up; gate and up rows ld apart (the halves of a fused gate/up GEMM's
 * rows: ld 2F), out's F */
void be_swiglu(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F);
/* cache[slot[t], off + 0..n) = src[t, 0..n) rounded to dt (kv_elem_store with scale) for t < T;
 * cache rows are width elements of dt; a negative slot is padding and writes nothing. */
void be_kv_write(Backend *be, void *cache, KVDtype dt, float scale, int width, int off,
                 const float *src, int ld, int n, const int *slot, int T);
/* out[T, N] = x[T, K] W^T (+ bias[N]); W in its stored format. op picks the counter. */
void be_matmul(Backend *be, OpId op, float *out, int ldo, const float *x, int ldx, int T,
               const QTensor *w, const float *bias);
/* Router: s = score(logits); choice = s + bias; group-limited top-K (ties to the
 * lowest index); wts = s[idx] (normalised if norm_topk_prob) * routed_scaling. */
void be_router(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T,
               const ModelConfig *c);
/* out[T, D] = sum_k wts[t,k] * Expert_{idx[t,k]}(x[t]) over the routed experts */
void be_moe(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
            const MoeExperts *ex, const ModelConfig *c);
/* GQA causal attention over the paged cache: out[T, H*Dh] from q[T, H*Dh] (roped). */
void be_attention_gqa(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *hb,
                      const Batch *db, const ModelConfig *c);
/* MLA attention, absorbed form, for decode: q[T, H*(Dn+Dr)] (q_pe roped); the cache
 * holds the normed latent and the roped k_pe; out[T, H*Dv]. topk[T, ktop] (positions, -1 padded) limits
 * each query to the indexer's selection; NULL means every causal key. */
void be_attention_mla(Backend *be, float *out, const float *q, const KVLayer *kv,
                      const QTensor *wkv_b, const int *topk, int ktop, const Batch *hb,
                      const Batch *db, const ModelConfig *c);
/* MLA attention, expanded form, for prefill: model/mla.c composes it from the next two
 * ops and be_matmul with kv_b_proj, a piece of at most be_mla_piece(c) cached positions at a time.
 * be_mla_piece: that piece size KC, sized so that the piece's expanded keys and values
 * [KC, H * (Dn + Dv)] float32 stay near 128 MiB (a multiple of 256 in [256, 4096]);
 * MOESERVE_MLA_PIECE=n (tests) sets it to n. The CUDA scratch of the expansion GEMM is reserved
 * for it (cuda_reserve). */
int be_mla_piece(const ModelConfig *c);
/* out[i, 0..n) = elements [0, n) of the cache row of position j0 + i of one sequence, as float32
 * (kv_elem_load with scale), i < rows; bt is the sequence's block-table row (backend memory),
 * cache rows are width elements of dt. */
void be_kv_gather(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                  const int *bt, int block_size, int j0, int rows);
/* One piece of the expanded form: the cached positions [j0, j0 + n) of the sequence whose tokens
 * are t0 .. t0 + nt - 1. kv[n, H * (Dn + Dv)] is the piece's latents through kv_b_proj, per head
 * [k_nope Dn | v Dv]; kpe[n] (rows ldk apart) its roped k_pe, shared by the heads. Query t, head
 * h: the key of position j is [k_nope_h(j) | k_pe(j)], z = (q_h . key) * attn_scale; the keys of
 * the piece it may attend to (j <= pos[t], or those of topk[t, 0..ktop) in the piece when topk
 * is not NULL) update its online softmax: st[t, h] = {running max, running sum}, out[t, h*Dv..]
 * the accumulator sum exp(z - max) v_h(j). first: the state starts empty (this is the
 * sequence's first piece); last: out = accumulator / sum (0 if no key) afterwards. */
void be_attention_mla_piece(Backend *be, float *out, float *st, const float *q, const float *kv,
                            const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                            int ktop, int first, int last, const Batch *hb, const Batch *db,
                            const ModelConfig *c);
/* DSA indexer: I(s,t) = sum_h w[s,h] * relu(q[s,h] . k[t]) * Di^-0.5 over the cached
 * keys t <= pos(s); topk[s, 0..Ki) = positions of the min(Ki, pos+1) best, ties to the lowest
 * position, -1 padded. w[T, Hi] is weights_proj(x); the op applies Hi^-0.5 and Di^-0.5. */
void be_indexer(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv,
                const Batch *hb, const Batch *db, const ModelConfig *c);

/* out[r] = the index of the largest x[r, :n] (ties to the lowest index): greedy sampling on the
 * device, so that only the ids cross to the host. */
void be_argmax(Backend *be, int *out, const float *x, int rows, int n);
/* out[r] = the token sample_row draws from logits[r, :V] with params[r] (out, logits and params
 * in backend memory): sampling on the device, so that only the ids cross to the host. */
void be_sample(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params);


#endif
