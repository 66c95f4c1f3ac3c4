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

/* --dp N: one engine a process; several of them are several servers */
static int take_dp(const char *s, void *dst, char *err, size_t errlen)
{
    (void)dst;
    if (!strcmp(s, "1")) return 0;
    errbuf_set(err, errlen, "'%s': moeserve runs one data-parallel replica a process; start one server per replica "
               "(behind a load balancer)", s);
    return -1;
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
        {.names = "--dp|--data-parallel-size|-dp|--dp-size", .type = OPT_FN, .metavar = "1",
         .help = "data-parallel replicas: 1 (one server a replica)", .def = "1", .fn = take_dp});
}

int par_resolve(ParOpts *p, char *err, size_t errlen)
{
    if (p->tp <= 0) p->tp = 1;
    if (p->pp <= 0) p->pp = 1;
    if (p->ep <= 0) p->ep = 1;
    if (p->ep_is_tp && p->ep == 1) p->ep = p->tp;
    if (p->ep > 1 && p->tp == 1) p->tp = p->ep; /* --ep E alone implies --tp E (SGLang) */
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
    int tp = p->tp, pp = p->pp, H = c->g_heads;
#define BAD(...) do { errbuf_set(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (pp > c->n_layers) BAD("--pp %d: the model has only %d layers", pp, c->n_layers);
    if (p->n_pp_layers) {
        int sum = 0;
        for (int s = 0; s < p->n_pp_layers; s++) sum += p->pp_layers[s];
        if (sum != c->n_layers) BAD("--pp-layers adds up to %d layers, the model has %d", sum, c->n_layers);
    }
    if (tp == 1) return 0;
    if (H % tp) BAD("--tp %d: %d attention heads do not split evenly", tp, H);
    if (!config_is_mla(c)) {
        int Hkv = c->g_kv_heads;
        if (Hkv % tp && (tp % Hkv || (H / Hkv) % (H / tp)))
            BAD("--tp %d: %d KV heads (of %d query heads) neither split evenly nor replicate evenly", tp, Hkv, H);
    }
    if (c->g_intermediate && c->first_k_dense > 0 && c->g_intermediate % tp)
        BAD("--tp %d: the dense MLP width %d does not split evenly", tp, c->g_intermediate);
    if (c->n_experts > 0) {
        if (p->ep > 1 && c->n_experts % p->ep) BAD("--ep %d: %d routed experts do not split evenly", p->ep, c->n_experts);
        if (p->ep == 1 && c->g_moe_intermediate % tp)
            BAD("--tp %d: the expert width %d does not split evenly (--ep %d keeps experts whole)", tp,
                c->g_moe_intermediate, tp);
        if ((c->g_moe_intermediate * c->n_shared_experts) % tp)
            BAD("--tp %d: the shared expert width %d does not split evenly", tp, c->g_moe_intermediate * c->n_shared_experts);
    }
    return 0;
#undef BAD
}

void plan_apply(ModelConfig *c, const ParOpts *p, int rank)
{
    int tp = p->tp, tr = rank % tp, pr = rank / tp;
    c->tp = tp;
    c->pp = p->pp;
    c->ep = p->ep;
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
        c->expert0 = tr * c->n_local_experts;
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
