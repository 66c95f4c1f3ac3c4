/* forward: one forward pass of a model over a Batch, on any backend, through the paged KV
 * cache. Written once per architecture (glm4_moe.c, glm5.c) in terms of backend ops; the FFN
 * (dense or MoE, moe.c) is shared. Activations live in buffers allocated once at init for up
 * to max_tokens tokens. */
#ifndef MOESERVE_FORWARD_H
#define MOESERVE_FORWARD_H

#include "../backend/backend.h"
#include "../dist/dist.h"
#include "kv_cache.h"
#include "model.h"

/* A pipeline micro-batch: sequences [s0, s1), their tokens [t0, t1), logits rows [o0, o1). */
typedef struct { int s0, s1, t0, t1, o0, o1; } MicroBatch;
#define FORWARD_MAX_MB 64

/* The expanded MLA form's buffers (mla.c; backend memory), for pieces of KC cached positions. */
typedef struct {
    int piece;                 /* KC: positions expanded at once (be_mla_piece) */
    float *lat;                /* [KC, C + Dr] a piece of the cache as float32: latent | roped k_pe */
    float *kv;                 /* [KC, H * (Dn + Dv)] the latents through kv_b_proj: per head [k_nope | v] */
    float *st;                 /* [T, H, 2] each query and head's running softmax max and sum */
} MlaExpand;

/* Attention data parallel (--dp): this rank's group's part of each step, rank 0's gathering of
 * every group's logits rows, and the MoE layers' exchange (moe.c). Host arrays with their
 * backend twins (*_d; the same memory on the cpu). P = max_tokens x experts per token. */
typedef struct {
    int on;                    /* dist->dp > 1 */
    Batch sb;                  /* the group's sequences, tokens and logits rows of the step */
    int *sb_buf;               /* sb's arrays (grow-only, sb_cap ints) */
    size_t sb_cap;
    int *n_out;                /* [dp] logits rows of each group in the step */
    int *perm, *perm_d;        /* rank 0: [max_out] the staged row of each logits row; then 0, 1, ... */
    int *ident_d;              /* [max_out] 0, 1, ... */
    float *stage;              /* rank 0: [max_out, V] the groups' logits rows, group after group */
    int *idx;                  /* [P] the router's experts (global ids) of this rank's rows */
    float *wts;                /* [P] their weights */
    int *pos;                  /* [P] where each (token, k) pair's row goes in the sent rows */
    int *rows, *rows_d;        /* [P] gather rows: dispatch, the token of each sent row; combine, the
                                  returned row of each (k, token), k-major */
    float *meta, *meta_d;      /* [P, 2] each sent row's expert (on its rank, as a float) and weight */
    float *rmeta, *rmeta_d;    /* [P, 2] the received rows' */
    int *eidx, *eidx_d;        /* [P] the received rows' experts */
    float *ew, *ew_d;          /* [P] and weights */
    int *cnt, *cnt_d;          /* [tp] rows to each rank of the stage */
    int *rcnt, *rcnt_d;        /* [tp] rows from each */
    int *fill;                 /* [tp] */
    size_t *sbytes, *rbytes;   /* [tp] */
    float *xs, *xr, *y;        /* [P, D] sent rows (then the returned ones), received rows (then the
                                  returned ones in combine order), the experts' weighted outputs */
} DpState;

/* The passes replayed as graphs (forward_enable_graphs): the model's forward (decode steps, and
 * verification steps of speculative decoding), and the MTP layer's two passes (mtp.c: the one
 * after a forward, reading its hidden state, and a chain's later ones). */
enum { GRAPH_FORWARD, GRAPH_MTP_MAIN, GRAPH_MTP_CHAIN, GRAPH_KINDS };
#define FORWARD_MAX_GRAPHS 64
typedef struct {
    int kind, T, O;            /* the key: the pass, its padded tokens and logits rows */
    void *graph;
    OpStat stats[OP_COUNT];    /* the counts of one replay, recorded at capture */
} ForwardGraph;

typedef struct {
    const Model *m;            /* borrowed */
    Backend *be;               /* borrowed */
    int max_tokens;            /* T limit per forward */
    int max_out;               /* logits rows limit per forward */
    int max_seqs;              /* S limit per forward */
    int max_blocks;            /* block-table row length limit */
    const Batch *hb;           /* the batch being run, on the host (borrowed, during forward_run) */
    const Batch *db;           /* the same batch with its arrays in backend memory */
    Batch dbuf;                /* the batch with its arrays in up_dev (non-host backends) */
    int *up_dev, *up_host;     /* [up_cap] the batch's arrays in backend memory, and where the host
                                  lays them out before the one copy (forward_upload) */
    size_t up_cap;
    /* steps as graphs (forward_enable_graphs): one per kind of pass and padded size */
    int graph_ctx;             /* 0: graphs off; else the context every graph is sized for */
    int graph_pad_only;        /* MOESERVE_TEST_GRAPH_PAD on a backend without graphs: the padded
                                  batch runs op by op (tests of the padding) */
    int n_graphs;
    ForwardGraph graph[FORWARD_MAX_GRAPHS];
    long graph_replays[GRAPH_KINDS]; /* passes run from a graph, by kind */
    int seq_cap;               /* sequences the device batch holds: max(max_seqs, max_out), room
                                  for the padding sequences */
    Batch pad;                 /* host arrays of the padded batch */
    int *pad_table;            /* [seq_cap, max_blocks] its block table */
    float *inv_freq;           /* [rotary_dim / 2] RoPE frequencies (backend memory) */
    float rope_scale;          /* cos/sin factor (YaRN attention factor; 1 otherwise) */
    /* activations (backend memory) */
    float *h;                  /* [T, D] residual stream */
    float *a;                  /* [T, D] normed input of a block */
    float *qa;                 /* [T, max(R, D)] MLA low-rank query (normed) */
    float *q;                  /* [T, H * max(Dh, Dn + Dr)] queries */
    float *k;                  /* [T, max(Hkv * Dh, C + Dr)] GQA keys / MLA latent + k_pe */
    float *v;                  /* [T, Hkv * Dh] GQA values */
    float *attn;               /* [T, H * max(Dh, Dv)] attention output before o_proj */
    float *iq;                 /* [T, Hi * Di] indexer queries */
    float *ik;                 /* [T, Di] indexer keys */
    float *iw;                 /* [T, Hi] indexer head weights */
    int *topk;                 /* [T, Ki] indexer selection (positions, -1 padded) */
    float *qkva;               /* [T, R + C + Dr] MLA q_a and kv_a fused (wqkv_a), or NULL */
    float *g, *u;              /* [T, max(Fd, F * n_shared)] MLP gate / up; where a layer fuses them,
                                  g is twice that (both) and u takes the product */
    float *ffn, *ffn2;         /* [T, D] FFN output (routed, shared expert) */
    float *rlogits;            /* [T, E] router logits */
    int *ridx;                 /* [T, K] routed experts */
    float *rwts;               /* [T, K] their weights */
    float *out_h;              /* [max_out, D] final hidden of the logits rows */
    float *logits;             /* [max_out, V] */
    MlaExpand mla;             /* MLA models: the expanded form's buffers */
    /* several ranks (src/dist): NULL alone */
    Dist *dist;
    int shared;                /* rank 0: forward_share told the workers */
    int eager_once;            /* a worker: rank 0 profiles this step, so no graph */
    int n_mb;                  /* micro-batches of the step being run (pipeline stages) */
    MicroBatch mb[FORWARD_MAX_MB];
    Batch rb;                  /* the step's batch with seq, seq_start and out_idx rebased to
                                  their micro-batch (host arrays rb_*) */
    int *rb_seq, *rb_start, *rb_out;
    int *gidx, *gidx_d;        /* [max_out * tp] rows that put the all-gathered vocabulary slices
                                  of lm_head in order (host, backend memory) */
    float *lm_part;            /* [max_out, V / tp] this rank's logits slice */
    float *lm_gather;          /* [tp, max_out, V / tp] every rank's */
    DpState dp;                /* --dp */
} Forward;

void forward_init(Forward *f, const Model *m, Backend *be, int max_tokens, int max_out, int max_seqs,
                  int max_blocks);
/* Several ranks: rank 0 tells the workers (dist_worker) to make the same Forward and a KV cache
 * like kv; from then on each forward_run of rank 0 is repeated by every rank, and forward_free
 * ends it. Alone: nothing. Call right after forward_init. */
void forward_share(Forward *f, const KVCache *kv);
/* The KV pool every rank can hold (rank 0, before sizing it): the blocks of block_size tokens
 * that `fraction` of each rank's free memory holds, each rank counting its own layers' bytes;
 * the smallest, and in *rank the rank it came from. Alone: this process's. */
double forward_kv_fit(const ModelConfig *c, Backend *be, int block_size, double fraction, int *rank);
/* A worker rank: repeat rank 0's Forwards until dist_shutdown (dist_worker). */
void forward_worker(const Model *m, Backend *be);
void forward_free(Forward *f);
/* Steps run as graphs, for contexts up to max_ctx: a batch whose every sequence brings at most
 * max(1, verify_len) tokens (decode, and speculative decoding's verification) is padded to
 * the next power of two of tokens and of logits rows (forward_graph_fits, forward_graph_pad) and
 * replayed from the graph captured at that size's first use. Backends without graphs ignore this. */
void forward_enable_graphs(Forward *f, int max_ctx);
/* Run the batch; writes logits [b->n_out, V] to the host buffer logits_out (may be NULL);
 * they stay in f->logits (backend memory) either way. */
void forward_run(Forward *f, const Batch *b, KVCache *kv, float *logits_out);

/* For a pass over f's buffers run as a graph (forward_run's own, and mtp.c's). fits: graphs are
 * on, the profiler is off, and b is a graph's kind of batch (above). pad: b padded to the graph's
 * sizes in f->pad (its real tokens, sequences and rows first and unchanged; each padding token a
 * sequence of its own at position 0 of sequence 0's blocks, writing no cache slot; padding rows
 * read padding tokens where there are some); upload it as any batch (f->db, max_ctx the graphs').
 * run: replay the graph of (kind, f->hb's tokens and rows), capturing body(f, kv, ctx) first where
 * there is none yet (and again when the backend's scratch has moved); the replay's op counts are
 * added to the backend's. */
int forward_graph_fits(const Forward *f, const Batch *b);
const Batch *forward_graph_pad(Forward *f, const Batch *b);
void forward_graph_run(Forward *f, int kind, KVCache *kv, void (*body)(Forward *f, KVCache *kv, void *ctx), void *ctx);

/* Several ranks, rank 0 (f shared): the workers run the same pass over batch b — kind
 * GRAPH_FORWARD: forward_run (forward_run sends its own); else mtp_run of the MTP layer with hidden
 * rows rows[0..n_tokens) (mtp.c sends its passes). */
void forward_send_pass(Forward *f, const Batch *b, const KVCache *kv, int kind, const int *rows);

/* The batch b with its arrays where the backend reads them (b itself on the host; else copies in
 * f's device buffers), for a pass that runs its own layers over f's buffers (mtp.c). One rank. */
const Batch *forward_batch_to_device(Forward *f, const Batch *b);

/* RoPE frequencies of the config: inv_freq[i] for i < rotary_dim/2 (default: theta^(-2i/d) in
 * float32 as transformers computes it; YaRN: the ramp between interpolation and
 * extrapolation), and the factor cos/sin are multiplied by. */
void rope_init(const ModelConfig *c, float *inv_freq, float *scale);

/* The per-architecture blocks (h += Attn(norm(h))), and the shared FFN (h += FFN(norm(h))). */
void glm4_moe_attention(Forward *f, int layer, KVCache *kv);
void glm5_attention(Forward *f, int layer, KVCache *kv);
void moe_ffn(Forward *f, int layer);

/* MLA attention (mla.c). The absorbed form (be_attention_mla) runs decode; the expanded
 * form runs prefill chunks, where the latents of a sequence's whole context are expanded through
 * kv_b_proj once and shared by all its chunk's queries: mla_expand_use says which (the rule is
 * beside it). Both give the same result within float32 rounding. */
void mla_expand_init(MlaExpand *x, Backend *be, const ModelConfig *c, int max_tokens, int piece);
void mla_expand_free(MlaExpand *x, Backend *be);
/* MOESERVE_MLA_EXPAND_MIN (knobs.h: default 32, at least 1) */
int mla_expand_min(void);
/* 1: run the batch's MLA attention in the expanded form (see mla.c for the rule) */
int mla_expand_use(const Batch *hb, int min_tokens);
/* The leading sequences of hb that decode (at most max(1, verify_len) tokens each, contiguous from
 * token 0: the engine puts them first) and, in *n_tokens, their tokens. */
int mla_decode_prefix(const Batch *hb, int *n_tokens);
/* A batch the rule expands: its leading decoding sequences (mla_decode_prefix) in the absorbed
 * form, the rest in the expanded form; arguments as mla_attention_expanded's. */
void mla_attention_split(Backend *be, const MlaExpand *x, float *out, const float *q, const KVLayer *kv,
                         const QTensor *wkv_b, const int *topk, int ktop, const Batch *hb, const Batch *db,
                         const ModelConfig *c);
/* out[T, H*Dv] from q[T, H*(Dn+Dr)] in the expanded form: per sequence, per piece of x->piece
 * cached positions: be_kv_gather, be_matmul with wkv_b, be_attention_mla_piece. Arguments as
 * be_attention_mla's. */
void mla_attention_expanded(Backend *be, const MlaExpand *x, float *out, const float *q, const KVLayer *kv,
                            const QTensor *wkv_b, const int *topk, int ktop, const Batch *hb, const Batch *db,
                            const ModelConfig *c);

#endif
