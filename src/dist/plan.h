/* plan: which slice of the model each rank holds under tensor, pipeline and expert
 * parallelism. The world is tp x pp ranks, rank = pp_rank * tp + tp_rank:
 * a pipeline stage is a tensor-parallel group of tp consecutive ranks.
 *
 *   TP  attention heads split (GQA: KV heads split, or replicated when tp exceeds them; MLA:
 *       heads split, the latent KV cache and the DSA indexer replicated on every rank); the
 *       dense MLP and the shared expert by column (gate/up rows) then row (down columns); the
 *       routed experts by width, or whole experts per rank under EP; lm_head by vocabulary
 *       (replicated when tp does not divide it). Each block ends in an all-reduce.
 *   PP  contiguous layer ranges (uneven with --pp-layers 39,39); embeddings on the first
 *       stage, final norm and lm_head on the last.
 *   EP  (ep == tp) routed experts [r * E/ep, (r+1) * E/ep) on tensor rank r, each whole.
 *   DP  (--dp D, D divides tp) attention data parallel: the tp ranks of a stage form D attention
 *       groups of tp/D consecutive ranks; a group runs attention, the dense layers, the shared
 *       expert and lm_head for its own sequences only, split over its tp/D ranks as TP splits
 *       them over tp (so the config's tp and tp_rank are the group's), and holds only their KV.
 *       The routed experts spread over all tp ranks of the stage (ep == tp), each token sent to
 *       the ranks of its experts and back (model/moe.c: dispatch and combine, an all-to-all). */
#ifndef MOESERVE_PLAN_H
#define MOESERVE_PLAN_H

#include <stddef.h>

#include "../base/opt.h"
#include "../format/config.h"

#define PLAN_MAX_STAGES 64

typedef struct {
    int tp, pp, ep;                     /* 1 1 1: one rank */
    int pp_layers[PLAN_MAX_STAGES];     /* --pp-layers: layers per stage; n_pp_layers 0: even split */
    int n_pp_layers;
    int microbatches;                   /* --pp-microbatches: in flight per step (0: pp) */
    int ep_is_tp;                       /* --enable-expert-parallel (vLLM): ep = tp */
    int dp;                             /* --dp: attention groups per stage (SGLang's count: divides tp) */
    int dp_vllm;                        /* --data-parallel-size (vLLM's count: tp = dp_vllm x --tp) */
    int dp_is_tp;                       /* --enable-dp-attention: dp = tp */
} ParOpts;

/* The layout options, --tp N (also vLLM's --tensor-parallel-size, SGLang's --tp-size), --pp N,
 * --ep N, --enable-expert-parallel, --pp-layers A,B,..., --pp-microbatches N, --dp N (SGLang's
 * --dp-size), --data-parallel-size N (vLLM's), --enable-dp-attention, into p. */
OptGroup par_opt_group(ParOpts *p);
#define PAR_TP_NAMES "--tp|--tensor-parallel-size|-tp|--tp-size"
#define PAR_PP_NAMES "--pp|--pipeline-parallel-size|-pp|--pp-size"
#define PAR_EP_NAMES "--ep|--expert-parallel-size|-ep|--ep-size"
/* Normalise (--ep E alone implies --tp E; --enable-expert-parallel sets ep to tp; vLLM's
 * --data-parallel-size D multiplies tp by D and sets dp; --enable-dp-attention sets dp to tp; dp > 1
 * sets ep to tp and one micro-batch) and check the layout against itself; 0 ok, -1 err. */
int par_resolve(ParOpts *p, char *err, size_t errlen);
int par_world(const ParOpts *p);

/* The layers of stage s: [*begin, *end). */
void plan_stage_layers(const ModelConfig *c, const ParOpts *p, int stage, int *begin, int *end);
/* Check that c can be laid out as p (divisibility of heads, widths, experts; NVFP4 and block
 * FP8 column slices on their block boundaries); 0 ok, -1 with err naming the size. */
int plan_check(const ModelConfig *c, const ParOpts *p, char *err, size_t errlen);
/* Turn the whole-model config c into rank's shard (model.h: the shard fields, local sizes). */
void plan_apply(ModelConfig *c, const ParOpts *p, int rank);

#endif
