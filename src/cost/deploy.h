/* deploy: a deployment's prediction (`moeserve plan`): for a model, a device, a link and a
 * layout, the memory of every rank and the steady state of serve's continuous batching at a
 * concurrency, built op by op out of cost.h.
 *
 * A layout is tp x pp ranks (dist/plan.h), and under attention data parallelism (dp D, issue
 * #39's semantics, modelled before it lands) the tp ranks of a stage form D groups of tp/D:
 * attention, the dense MLP layers, the shared expert and lm_head run tensor-parallel inside a group
 * (whole in each group when tp = D), every group owns its requests and holds only their KV; the
 * routed experts spread over all tp ranks (ep = tp), each token sent to its experts' ranks and
 * back by two all-to-alls. Without dp, ep = tp keeps moeserve's expert parallelism of today:
 * every rank runs its whole experts on every token and the tensor-parallel all-reduce combines. */
#ifndef MOESERVE_COST_DEPLOY_H
#define MOESERVE_COST_DEPLOY_H

#include <jansson.h>

#include "../format/config.h"
#include "cost.h"

typedef struct {
    int tp, pp, ep, dp;
} CostLayout;

/* "tp4pp2", "ep8" (tp 8), "tp8dp8ep8": 0, or -1 with err */
int cost_layout_parse(const char *s, CostLayout *l, char *err, size_t errlen);
void cost_layout_name(const CostLayout *l, char *buf, size_t n);

/* The parts of a step, in diagnose's categories and order (step_cat_name's names). */
typedef enum {
    CP_DENSE_GEMM, CP_MOE_GEMM, CP_ATTENTION, CP_INDEXER, CP_NORM, CP_ROUTER, CP_SAMPLE, CP_ALL_REDUCE, CP_ALL_TO_ALL,
    CP_PP_SEND, CP_PP_WAIT, CP_HOST_GAP, CP_SCHEDULING, CP_COUNT
} CostPart;
const char *cost_part_name(CostPart p);
/* What bounds a point, in diagnose's verdict names (verdict_name). */
typedef enum { CB_COMPUTE, CB_MEMORY, CB_COMMUNICATION, CB_BUBBLE, CB_HOST, CB_KV_CAPACITY, CB_COUNT } CostBound;
const char *cost_bound_name(CostBound b);

/* What runs: the model (a directory's config.json, with its checkpoint's formats when it has one,
 * else dummy_fmt through its quantization config), the devices, and serve's scheduler. */
typedef struct {
    const char *dir;
    QFormat dummy_fmt;
    int num_layers;                 /* 0: the config's */
    const CostDevice *dev;
    const CostDevice *host;         /* the engine's host overhead (host_step_us, host_token_us): the
                                       machine that runs the engine; NULL: dev's */
    const CostLink *link;           /* between the GPUs of a node */
    const CostLink *node_link;      /* between nodes */
    int gpus_per_node, nodes;
    int input_len, output_len;
    int max_running, max_batch_tokens, chunked_prefill, decode_steps;
    int microbatches;               /* under pp (0: pp, serve's default) */
    KVDtype kv_dtype;               /* KV_DTYPE_AUTO: the model's (BF16 on a GPU) */
    int wave;                       /* 0: the steady state of continuous batching at a concurrency (clients
                                       sending request after request); 1: one wave of that many requests
                                       started together, its prefill then its decode (diagnose's and bench
                                       model's load), a point's step the mean over the wave's steps */
    int spec_k;                     /* speculative decoding: drafts a step from the MTP layer (0: off) */
    int spec_vocab;                 /* their head's rows (draft_vocab_size; 0: the whole vocabulary) */
    double spec_accept;             /* the chance a draft is accepted when the ones before it were */
    int wave_every;                 /* > 1: that mean over the steps a profiler timing one step in this many
                                       times (diagnose's --profile-every) */
} CostSetup;

typedef struct {
    int concurrency;
    double tpot_ms, ttft_ms, output_tok_s, tok_s_gpu, tok_s_user;
    double step_ms;                 /* a mean step (decode with the prefill it carries) */
    double decode_ms;               /* a decode-only step at the point's decode batch, mean context */
    double decode_batch;            /* sequences decoding in a step, per data-parallel group */
    double prefill_per_step;        /* prompt tokens a step carries on average, per group */
    int running;                    /* requests admitted at once, per group */
    int kv_limited;                 /* the KV cache, not --max-running-requests or the clients, limits them */
    double queue_ms;                /* waiting for a slot, in TTFT */
    CostBound bound;
    double share[CP_COUNT];         /* of the mean step, on the slowest stage */
} CostPoint;

#define COST_MAX_POINTS 32
typedef struct {
    CostLayout lo;
    char name[48];
    int allowed;                    /* the model's shapes divide */
    char why[320];                  /* why not, or why it does not fit */
    int fits;
    double weight_bytes_per_gpu;    /* the largest stage's */
    double activation_bytes_per_gpu;
    double kv_bytes_per_token;      /* per GPU, the largest stage's */
    double kv_tokens_total;         /* distinct positions the deployment holds: summed over dp groups, the
                                       minimum over stages, never multiplied by tensor ranks */
    double read_bytes_per_token;    /* batch-1 decode: the bytes a token's step moves on the slowest stage */
    int n_points;
    CostPoint points[COST_MAX_POINTS];
} CostPlan;

/* Tokens a decoding sequence gains a step: 1 without speculation, else 1 + a + a^2 + ... + a^K
 * (a = spec_accept: the verify keeps drafts while they match). */
double cost_spec_tokens(const CostSetup *s);
/* Its inverse from a run's counts: the a with a + a^2 + ... + a^K = accepted / chains (0 without
 * chains). */
double cost_spec_accept(long chains, long accepted, int K);

/* Check layout l against the model (c: the whole model's config) for n GPUs: 0, or -1 with why. */
int cost_layout_check(const ModelConfig *c, const CostLayout *l, int world, char *why, size_t n);
/* The layouts worth planning on world GPUs (tp x pp = world; ep 1 or tp; dp dividing tp, with ep
 * = tp), up to max; their count. */
int cost_layouts_auto(const ModelConfig *c, int world, CostLayout *out, int max);
/* Plan one layout at the concurrencies given. The plan of a layout the model does not allow has
 * allowed 0 and why; one that does not fit, fits 0 and no points. */
void cost_plan(const CostSetup *s, const ModelConfig *whole, const CostLayout *l, const int *conc, int n_conc,
               CostPlan *out);
/* the JSON shape: {"layout", "tp", "pp", "ep", "dp", "fits", "weight_bytes_per_gpu",
 * "kv_tokens_total", "points": [{"concurrency", "tpot_ms", "ttft_ms", "output_tok_s", "bound",
 * "breakdown": {category: share}}, ...]} and a few more fields */
json_t *cost_plan_json(const CostPlan *p);

#endif
