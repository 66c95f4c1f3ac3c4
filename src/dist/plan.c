/* plan: the shard of each rank (plan.h). */
#include "plan.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../base/opt.h"

/* --pp-layers "39,39": the layers of each stage */
static int take_layers(const char *s, void *dst, char *err, size_t errlen)
{
    ParOpts *p = (ParOpts *)((char *)dst - offsetof(ParOpts, pp_layers));
    p->n_pp_layers = 0;
    const char *q = s;
    while (*q) {
        char *end;
        errno = 0;
        long v = strtol(q, &end, 10);
        if (end == q || errno || v < 1 || v > MODEL_MAX_LAYERS)
            return errbuf_set(err, errlen, "'%s' is not a comma-separated list of layer counts (each >= 1)", s), -1;
        if (p->n_pp_layers == PLAN_MAX_STAGES) return errbuf_set(err, errlen, "more than %d stages", PLAN_MAX_STAGES),
        -1;
        p->pp_layers[p->n_pp_layers++] = (int)v;
        q = end;
        if (*q == ',') q++;
        else if (*q) return errbuf_set(err, errlen, "unexpected '%c' in '%s'", *q, s), -1;
    }
    if (!p->n_pp_layers) return errbuf_set(err, errlen, "the list is empty"), -1;
    return 0;
}

OptGroup par_opt_group(ParOpts *p)
{
    OPT_GROUP_RETURN("parallel layout",
        {.names = PAR_TP_NAMES, .type = OPT_INT, .dst = &p->tp, .metavar = "N", .help = "tensor-parallel ranks",
         .def = "1", .lo = 1, .hi = 1024},
        {.names = PAR_PP_NAMES, .type = OPT_INT, .dst = &p->pp, .metavar = "N", .help = "pipeline stages", .def = "1",
         .lo = 1, .hi = PLAN_MAX_STAGES},
        {.names = PAR_EP_NAMES, .type = OPT_INT, .dst = &p->ep, .metavar = "N",
         .help = "expert-parallel ranks: whole experts per tensor rank (equal to --tp, or alone it sets --tp)",
         .def = "1",
         .lo = 1, .hi = 1024},
        {.names = "--enable-expert-parallel|--enable-ep-moe", .type = OPT_FLAG, .dst = &p->ep_is_tp,
         .help = "expert parallelism over the tensor-parallel ranks (--ep equal to --tp)", .def = "off"},
        {.names = "--pp-layers", .type = OPT_FN, .dst = p->pp_layers, .metavar = "A,B,..",
         .help = "layers of each pipeline stage",
         .def = "an even split", .fn = take_layers},
        {.names = "--pp-microbatches", .type = OPT_INT, .dst = &p->microbatches, .metavar = "N",
         .help = "micro-batches in flight per step under --pp", .def = "--pp", .lo = 1, .hi = 1024},
        {.names = "--dp|-dp|--dp-size", .type = OPT_INT, .dst = &p->dp, .metavar = "N",
         .help = "attention data-parallel groups: each of N groups of --tp/N ranks runs attention for its own "
                 "requests and holds only their KV; the routed experts spread over all --tp ranks",
         .def = "1", .lo = 1, .hi = 1024},
        {.names = "--data-parallel-size", .type = OPT_INT, .dst = &p->dp_vllm, .metavar = "N",
         .help = "vLLM's count: N groups of --tp ranks each (--tp N x tp --dp N here)", .def = "1", .lo = 1,
         .hi = 1024},
        {.names = "--enable-dp-attention", .type = OPT_FLAG, .dst = &p->dp_is_tp,
         .help = "attention data parallel over every tensor rank (--dp equal to --tp)", .def = "off"});
}

int par_resolve(ParOpts *p, char *err, size_t errlen)
{
    if (p->tp <= 0) p->tp = 1;
    if (p->pp <= 0) p->pp = 1;
    if (p->ep <= 0) p->ep = 1;
    if (p->dp <= 0) p->dp = 1;
    if (p->dp_vllm > 1) { /* vLLM: D replicas of --tp ranks each */
        if (p->dp > 1 && p->dp != p->dp_vllm) {
            errbuf_set(err, errlen, "--dp %d with --data-parallel-size %d: give one of them (--data-parallel-size "
                       "counts vLLM's way, groups of --tp ranks each)", p->dp, p->dp_vllm);
            return -1;
        }
        p->tp *= p->dp_vllm;
        p->dp = p->dp_vllm;
        p->dp_vllm = 1;
        if (p->ep > 1 && p->ep != p->tp && !p->ep_is_tp) {
            errbuf_set(err, errlen, "--ep %d with --data-parallel-size %d: the experts spread over all %d ranks (--ep "
                       "%d or --enable-expert-parallel)", p->ep, p->dp, p->tp, p->tp);
            return -1;
        }
        if (p->ep_is_tp) p->ep = p->tp;
    }
    if (p->ep_is_tp && p->ep == 1) p->ep = p->tp;
    if (p->ep > 1 && p->tp == 1) p->tp = p->ep; /* --ep E alone implies --tp E (SGLang) */
    if (p->dp_is_tp && p->dp == 1) p->dp = p->tp;
    if (p->dp > 1) {
        if (p->tp % p->dp) {
            errbuf_set(err, errlen, "--dp %d with --tp %d: the %d tensor ranks of a stage form the attention groups, "
                       "so --dp must divide --tp", p->dp, p->tp, p->tp);
            return -1;
        }
        if (p->ep == 1) p->ep = p->tp; /* attention data parallel moves tokens to experts spread over every rank */
        if (p->microbatches > 1) {
            errbuf_set(err, errlen, "--pp-microbatches %d with --dp %d: a stage runs one micro-batch under attention "
                       "data parallelism", p->microbatches, p->dp);
            return -1;
        }
        p->microbatches = 1;
    }
    if (p->ep > 1 && p->ep != p->tp) {
        errbuf_set(err, errlen, "--ep %d with --tp %d: expert parallelism spans the tensor-parallel group, so --ep must "
                   "equal --tp (or be given alone)", p->ep, p->tp);
        return -1;
    }
    if (p->n_pp_layers && p->n_pp_layers != p->pp) {
        if (p->pp == 1) p->pp = p->n_pp_layers;
        else {
            errbuf_set(err, errlen, "--pp-layers lists %d stages but --pp is %d", p->n_pp_layers, p->pp);
            return -1;
        }
    }
    if (p->microbatches <= 0) p->microbatches = p->pp;
    return 0;
}

int par_world(const ParOpts *p) { return (p->tp > 0 ? p->tp : 1) * (p->pp > 0 ? p->pp : 1); }

void plan_stage_layers(const ModelConfig *c, const ParOpts *p, int stage, int *begin, int *end)
{
    int L = c->n_layers, b = 0;
    if (p->n_pp_layers) {
        for (int s = 0; s < stage; s++) b += p->pp_layers[s];
        *begin = b;
        *end = b + p->pp_layers[stage];
        return;
    }
    /* even split, the first L % pp stages one layer more */
    int base = L / p->pp, extra = L % p->pp;
    for (int s = 0; s < stage; s++) b += base + (s < extra);
    *begin = b;
    *end = b + base + (stage < extra);
}

int plan_check(const ModelConfig *c, const ParOpts *p, char *err, size_t errlen)
{
    int dp = p->dp > 1 ? p->dp : 1, tp = p->tp / dp, pp = p->pp, H = c->g_heads;
    /* the options a message names: under --dp the split is over an attention group's tp / dp ranks */
    char who[96];
    if (dp > 1) snprintf(who, sizeof who, "--tp %d --dp %d (attention groups of %d)", p->tp, dp, tp);
    else snprintf(who, sizeof who, "--tp %d", tp);
#define BAD(...) do { errbuf_set(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (pp > c->n_layers) BAD("--pp %d: the model has only %d layers", pp, c->n_layers);
    if (p->n_pp_layers) {
        int sum = 0;
        for (int s = 0; s < p->n_pp_layers; s++) sum += p->pp_layers[s];
        if (sum != c->n_layers) BAD("--pp-layers adds up to %d layers, the model has %d", sum, c->n_layers);
    }
    if (dp > 1 && c->n_experts <= 0) BAD("--dp %d: attention data parallelism needs a model with routed experts", dp);
    if (c->n_experts > 0 && p->ep > 1 && c->n_experts % p->ep)
        BAD("--ep %d: %d routed experts do not split evenly", p->ep, c->n_experts);
    if (tp == 1) return 0;
    if (H % tp) BAD("%s: %d attention heads do not split evenly", who, H);
    if (!config_is_mla(c)) {
        int Hkv = c->g_kv_heads;
        if (Hkv % tp && (tp % Hkv || (H / Hkv) % (H / tp)))
            BAD("%s: %d KV heads (of %d query heads) neither split evenly nor replicate evenly", who, Hkv, H);
    }
    if (c->g_intermediate && c->first_k_dense > 0 && c->g_intermediate % tp)
        BAD("%s: the dense MLP width %d does not split evenly", who, c->g_intermediate);
    if (c->n_experts > 0) {
        if (p->ep == 1 && c->g_moe_intermediate % tp)
            BAD("--tp %d: the expert width %d does not split evenly (--ep %d keeps experts whole)", tp,
                c->g_moe_intermediate, tp);
        if ((c->g_moe_intermediate * c->n_shared_experts) % tp)
            BAD("%s: the shared expert width %d does not split evenly", who,
                c->g_moe_intermediate * c->n_shared_experts);
    }
    return 0;
#undef BAD
}

void plan_apply(ModelConfig *c, const ParOpts *p, int rank)
{
    /* under --dp the sliced weights split over the attention group's ranks; experts over the stage's */
    int dp = p->dp > 1 ? p->dp : 1, st = rank % p->tp, tp = p->tp / dp, tr = st % tp, pr = rank / p->tp;
    c->tp = tp;
    c->pp = p->pp;
    c->ep = p->ep;
    c->dp = dp;
    c->dp_rank = st / tp;
    c->tp_rank = tr;
    c->pp_rank = pr;
    plan_stage_layers(c, p, pr, &c->layer_begin, &c->layer_end);
    int H = c->g_heads, Hl = H / tp;
    c->n_heads = Hl;
    c->head0 = tr * Hl;
    if (!config_is_mla(c)) {
        int Hkv = c->g_kv_heads;
        if (Hkv % tp == 0) {
            c->n_kv_heads = Hkv / tp;
            c->kv_head0 = tr * c->n_kv_heads;
        } else { /* replicated: this rank's heads all belong to one KV head */
            c->n_kv_heads = 1;
            c->kv_head0 = c->head0 / (H / Hkv);
        }
    }
    if (c->g_intermediate % tp == 0) c->intermediate = c->g_intermediate / tp;
    if (p->ep > 1) {
        c->n_local_experts = c->n_experts / p->ep;
        c->expert0 = st * c->n_local_experts;
        c->moe_intermediate = c->g_moe_intermediate;
    } else {
        c->n_local_experts = c->n_experts;
        c->expert0 = 0;
        c->moe_intermediate = c->g_moe_intermediate / tp;
    }
    if (c->vocab % tp == 0) {
        c->vocab_local = c->vocab / tp;
        c->vocab0 = tr * c->vocab_local;
    } else {
        c->vocab_local = c->vocab;
        c->vocab0 = 0;
    }
}
