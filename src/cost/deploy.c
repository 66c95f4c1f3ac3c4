/* deploy: a deployment's memory and steady state, op by op (deploy.h). The ops of a step and
 * their FLOP and byte counts follow the model's code (model/glm5.c, glm4_moe.c, moe.c, mla.c,
 * forward.c) and the op table's formulas (backend/backend.c, dist/dist.c) for the shard of each
 * stage (a 6-layer GLM-5 decode step at batch 1 counts 3.466 GB, `bench model`'s op-table count on
 * the H200 3.47: docs/log/2026-12-06-plan.md). */
#include "deploy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/kv_elem.h"
#include "../base/knobs.h"
#include "../base/util.h"
#include "../dist/plan.h"
#include "../model/model.h"
#include "memory.h"

static const char *const part_names[CP_COUNT] = {
    "dense_gemm", "moe_gemm", "attention", "indexer", "norms_elementwise", "router_dispatch", "sampling",
    "all_reduce", "all_to_all", "pp_send_recv", "pp_bubble", "host_gap", "scheduling",
};
static const char *const bound_names[CB_COUNT] = {
    "compute-bound", "memory-bound", "communication-bound", "pipeline-bubble-bound", "host-bound", "kv-capacity-bound",
};

const char *cost_part_name(CostPart p) { return (unsigned)p < CP_COUNT ? part_names[p] : "?"; }
const char *cost_bound_name(CostBound b) { return (unsigned)b < CB_COUNT ? bound_names[b] : "?"; }

/* ---- layouts ---- */

int cost_layout_parse(const char *s, CostLayout *l, char *err, size_t errlen)
{
    *l = (CostLayout){0};
    const char *p = s;
    while (*p) {
        int *dst = !strncmp(p, "tp", 2) ? &l->tp : !strncmp(p, "pp", 2) ? &l->pp : !strncmp(p, "ep", 2) ? &l->ep
                   : !strncmp(p, "dp", 2) ? &l->dp : NULL;
        char *end;
        long v = dst ? strtol(p + 2, &end, 10) : 0;
        if (!dst || end == p + 2 || v < 1 || v > 1024 || *dst)
            return errbuf_set(err, errlen, "layout '%s': expected tpT, ppP, epE and dpD concatenated (tp4pp2, tp8dp8ep8), "
                              "each at most once", s), -1;
        *dst = (int)v;
        p = end;
    }
    if (!*s) return errbuf_set(err, errlen, "an empty layout"), -1;
    if (!l->pp) l->pp = 1;
    if (!l->ep) l->ep = 1;
    if (!l->dp) l->dp = 1;
    if (!l->tp) l->tp = l->ep > 1 ? l->ep : l->dp; /* --ep E alone implies --tp E, as serve reads it */
    if (l->ep > 1 && l->ep != l->tp)
        return errbuf_set(err, errlen, "layout '%s': ep %d with tp %d: expert parallelism spans the tensor-parallel ranks "
                          "(ep = tp)", s, l->ep, l->tp), -1;
    if (l->dp > 1 && l->tp % l->dp)
        return errbuf_set(err, errlen, "layout '%s': dp %d does not divide tp %d (the tp ranks form dp attention groups)", s,
                          l->dp, l->tp), -1;
    if (l->dp > 1 && l->ep == 1) l->ep = l->tp; /* attention data parallelism moves tokens to experts spread over tp */
    return 0;
}

void cost_layout_name(const CostLayout *l, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    if (l->tp > 1 || (l->pp == 1 && l->dp == 1 && l->ep == 1)) o += snprintf(buf + o, n - o, "tp%d", l->tp);
    if (l->pp > 1 && o < n) o += snprintf(buf + o, n - o, "pp%d", l->pp);
    if (l->dp > 1 && o < n) o += snprintf(buf + o, n - o, "dp%d", l->dp);
    if (l->ep > 1 && o < n) snprintf(buf + o, n - o, "ep%d", l->ep);
}

/* the ParOpts of the shard a stage's first rank loads: under dp the attention group's tensor
 * parallelism, experts width-split over it (deploy_stage turns them into whole experts over tp) */
static ParOpts shard_opts(const CostLayout *l)
{
    ParOpts p = {.tp = l->tp / l->dp, .pp = l->pp, .ep = l->dp > 1 ? 1 : l->ep};
    p.microbatches = p.pp;
    return p;
}

int cost_layout_check(const ModelConfig *c, const CostLayout *l, int world, char *why, size_t n)
{
    if (l->tp * l->pp != world)
        return errbuf_set(why, n, "tp %d x pp %d = %d ranks, not the %d GPUs", l->tp, l->pp, l->tp * l->pp, world), -1;
    if (l->dp > 1 && c->n_experts > 0 && c->n_experts % l->tp)
        return errbuf_set(why, n, "%d routed experts do not spread evenly over %d ranks", c->n_experts, l->tp), -1;
    if (l->dp > 1 && c->n_experts == 0)
        return errbuf_set(why, n, "attention data parallelism moves tokens to experts: the model has none"), -1;
    if (l->ep > 1 && c->n_experts == 0) return errbuf_set(why, n, "the model has no routed experts to spread"), -1;
    ParOpts p = shard_opts(l);
    char err[300];
    if (plan_check(c, &p, err, sizeof err) < 0) {
        /* the check names serve's options; say it in the layout's terms */
        const char *msg = !strncmp(err, "--", 2) && strchr(err, ':') ? strchr(err, ':') + 2 : err;
        errbuf_set(why, n, "%s%s", l->dp > 1 ? "in each attention group, " : "", msg);
        return -1;
    }
    return 0;
}

int cost_layouts_auto(const ModelConfig *c, int world, CostLayout *out, int max)
{
    int k = 0;
    for (int tp = 1; tp <= world; tp++) {
        if (world % tp) continue;
        int pp = world / tp;
        if (pp > c->n_layers) continue;
        for (int ep = 1; ep <= tp; ep = ep == 1 && tp > 1 ? tp : tp + 1) {
            if (ep > 1 && c->n_experts == 0) break;
            for (int dp = 1; dp <= (ep > 1 ? tp : 1); dp++) {
                if (tp % dp || (dp > 1 && ep != tp)) continue;
                if (k < max) out[k++] = (CostLayout){tp, pp, ep, dp};
            }
        }
    }
    return k;
}

/* ---- the ops of a step ---- */

/* one step's shape, per data-parallel group (fractional sequences: an average over steps) */
typedef struct {
    double n_dec, dec_ctx;          /* decoding sequences and their context after the step */
    double dec_rows;                /* rows a decoding sequence carries: 1, or 1 + K drafts to verify (0: 1) */
    double n_pre, pre_len, pre_ctx; /* prefill sequences in the step, tokens each, context after the chunk */
} Shape;

typedef struct {
    double t[CP_COUNT];
    double flops[CC_COUNT], bytes[CC_COUNT];
} Acc;

typedef struct {
    const CostSetup *s;
    const CostLayout *lo;
    Model m;
    int stage, first, last;
    int tp_a;                  /* ranks of a tensor-parallel group: attention, dense MLP, shared expert, lm_head */
    double expert_bytes;       /* one expert's gate + up + down as the MoE op reads it */
    double weight_bytes;       /* per rank */
    CostRankMem mem;
    const CostLink *tp_link, *ep_link, *pp_link;
    KVDtype kv_dtype;
} Stage;

static double acc_compute(const Acc *a)
{
    double s = 0;
    for (int c = 0; c < CC_COUNT; c++) s += a->t[c];
    return s;
}

static void acc_add(Acc *dst, const Acc *src, double k)
{
    for (int p = 0; p < CP_COUNT; p++) dst->t[p] += k * src->t[p];
    for (int c = 0; c < CC_COUNT; c++) {
        dst->flops[c] += k * src->flops[c];
        dst->bytes[c] += k * src->bytes[c];
    }
}

static int rows_of(double T) { return T < 1 ? 1 : (int)ceil(T); }

static void op(Acc *a, const Stage *st, OpId id, double flops, double bytes, double T, QFormat f)
{
    CostCat c = cost_cat_of(id);
    a->t[c] += cost_op_seconds(st->s->dev, id, flops, bytes, rows_of(T), f);
    a->flops[c] += flops;
    a->bytes[c] += bytes;
}

static void comm(Acc *a, const CostLink *link, OpId id, double bytes, int ranks)
{
    double t = cost_comm_seconds(link, id, bytes, ranks);
    a->t[id == OP_ALL_TO_ALL ? CP_ALL_TO_ALL : id == OP_PP_SEND || id == OP_PP_RECV ? CP_PP_SEND : CP_ALL_REDUCE] += t;
}

static void mm(Acc *a, const Stage *st, OpId id, double T, const QTensor *w, int bias)
{
    if (!w->rows) return;
    op(a, st, id, 2.0 * T * w->rows * w->cols, qtensor_bytes(w) + 4.0 * T * (w->cols + w->rows) + (bias ? 4.0 * w->rows : 0), T,
       w->fmt);
}

static void rms(Acc *a, const Stage *st, double rows, double dim, double T)
{
    op(a, st, OP_RMSNORM, 4.0 * rows * dim, 8.0 * rows * dim + 4.0 * dim, T, QF_COUNT);
}

static void rope(Acc *a, const Stage *st, double T, double heads, double rot)
{
    double n = T * heads * rot;
    op(a, st, OP_ROPE, 3.0 * n, 8.0 * n, T, QF_COUNT);
}

static void add(Acc *a, const Stage *st, double n, double T) { op(a, st, OP_ADD, n, 12.0 * n, T, QF_COUNT); }

static void kvw(Acc *a, const Stage *st, double T, double n)
{
    op(a, st, OP_KV_WRITE, 0, (4.0 + kv_elem_size(st->kv_dtype)) * T * n, T, QF_COUNT);
}

static void allreduce(Acc *a, const Stage *st, double n)
{
    int r = st->tp_a;
    if (r > 1) comm(a, st->tp_link, OP_ALL_REDUCE, 8.0 * n * (r - 1) / r, r);
}

/* sum over positions p in [c0, c1) of min(p + 1, cap) (cap 0: none): a chunk's keys */
static double keys_range(double c0, double c1, double cap)
{
    if (c1 <= c0) return 0;
    if (cap <= 0 || c1 <= cap) return (c1 * (c1 + 1) - c0 * (c0 + 1)) / 2;
    if (c0 >= cap) return (c1 - c0) * cap;
    return (cap * (cap + 1) - c0 * (c0 + 1)) / 2 + (c1 - cap) * cap;
}

static double dec_rows(const Shape *sh) { return sh->dec_rows > 1 ? sh->dec_rows : 1; }

static double shape_keys(const Shape *sh, double cap)
{
    double dk = cap > 0 && sh->dec_ctx > cap ? cap : sh->dec_ctx;
    return sh->n_dec * dec_rows(sh) * dk + sh->n_pre * keys_range(sh->pre_ctx - sh->pre_len, sh->pre_ctx, cap);
}

static double shape_ctx(const Shape *sh) { return sh->n_dec * sh->dec_ctx + sh->n_pre * sh->pre_ctx; }

static void swiglu_mlp(Acc *a, const Stage *st, double T, const QTensor *gu, const QTensor *g, const QTensor *u,
                       const QTensor *dn)
{
    double Fw = gu->rows ? gu->rows / 2.0 : g->rows;
    if (gu->rows) mm(a, st, OP_GEMM_MLP, T, gu, 0);
    else {
        mm(a, st, OP_GEMM_MLP, T, g, 0);
        mm(a, st, OP_GEMM_MLP, T, u, 0);
    }
    op(a, st, OP_SWIGLU, 6.0 * T * Fw, 12.0 * T * Fw, T, QF_COUNT);
    mm(a, st, OP_GEMM_MLP, T, dn, 0);
}

/* work beside the main path (be_side_begin): where the device takes T rows, the side's time hides
 * behind the main path's from where the side began up to the join */
static void side_join(Acc *a, Acc *side, double main_from, int beside)
{
    if (beside) {
        double s = acc_compute(side), main = acc_compute(a) - main_from, hidden = s < main ? s : main;
        acc_add(a, side, s > 0 ? 1.0 - hidden / s : 1.0);
        /* the counts stay whole: the work is done, only its time is hidden */
        for (int c = 0; c < CC_COUNT; c++) {
            a->flops[c] += side->flops[c] * (s > 0 ? hidden / s : 0);
            a->bytes[c] += side->bytes[c] * (s > 0 ? hidden / s : 0);
        }
    } else {
        acc_add(a, side, 1.0);
    }
}

static void mla_layer(Acc *a, const Stage *st, const LayerWeights *w, int l, const Shape *sh, double T)
{
    const ModelConfig *c = &st->m.cfg;
    double D = c->hidden, H = c->n_heads, R = c->q_lora_rank, C = c->kv_lora_rank, Dr = c->qk_rope_dim,
           Dn = c->qk_nope_dim, Dv = c->v_head_dim, kvd = C + Dr;
    double es = kv_elem_size(st->kv_dtype), kvw_width = model_kv_width(c);
    rms(a, st, T, D, T);
    if (w->wqkv_a.rows) {
        mm(a, st, OP_GEMM_ATTN, T, &w->wqkv_a, 0);
        rms(a, st, T, R, T);
    } else {
        if (R > 0) {
            mm(a, st, OP_GEMM_ATTN, T, &w->wq_a, 0);
            rms(a, st, T, R, T);
        }
        mm(a, st, OP_GEMM_ATTN, T, &w->wkv_a, 0);
    }
    int full = c->layer_indexer[l] == INDEXER_FULL, topk = c->layer_indexer[l] != INDEXER_NONE;
    int beside = full && st->s->dev->gpu && T <= st->s->dev->side_rows;
    Acc side = {0};
    double from = acc_compute(a);
    if (full) {
        double Hi = c->index_n_heads, Di = c->index_head_dim, keys = shape_keys(sh, 0);
        mm(&side, st, OP_GEMM_INDEXER, T, &w->idx_wq_b, 0);
        rope(&side, st, T, Hi, Dr);
        mm(&side, st, OP_GEMM_INDEXER, T, &w->idx_wk, 0);
        op(&side, st, OP_LAYERNORM, 7.0 * T * Di, 8.0 * T * Di + 8.0 * Di, T, QF_COUNT);
        rope(&side, st, T, 1, Dr);
        kvw(&side, st, T, Di);
        mm(&side, st, OP_GEMM_INDEXER, T, &w->idx_wproj, 0);
        op(&side, st, OP_INDEXER, 2.0 * Hi * Di * keys + 3.0 * Hi * keys,
           es * shape_ctx(sh) * Di + 4.0 * T * (Hi * Di + Hi) + 4.0 * T * c->index_topk, T, QF_COUNT);
    }
    mm(a, st, OP_GEMM_ATTN, T, &w->wq_b, 0);
    rope(a, st, T, H, Dr);
    rms(a, st, T, C, T);
    rope(a, st, T, 1, Dr);
    kvw(a, st, T, kvd);
    side_join(a, &side, from, beside);
    double cap = topk ? c->index_topk : 0, keys = shape_keys(sh, cap);
    double prompt = sh->pre_len > 1 ? sh->n_pre * sh->pre_len : 0;
    int expand = prompt > 0 && prompt >= knob_get(KNOB_MLA_EXPAND_MIN) && 2 * prompt >= T;
    /* the absorbed form over Ta tokens with ka keys in all, reading ctx cached positions */
#define ABSORBED(Ta, ka, ctx)                                                                                          \
    op(a, st, OP_ATTENTION, 2.0 * (Ta) * H * (Dn + Dv) * C + 2.0 * H * (ka) * (C + Dr) + 2.0 * H * (ka) * C + 5.0 * H * (ka), \
       qtensor_bytes(&w->wkv_b) + es * (ctx) * kvw_width + 4.0 * (Ta) * H * (Dn + Dr + Dv), (Ta), QF_COUNT)
    if (!expand) {
        ABSORBED(T, keys, shape_ctx(sh));
    } else { /* the prompt chunks a piece of KC cached positions at a time, the decoding sequences
                beside them in the absorbed form (mla.c mla_attention_split) */
        double KC = be_mla_piece(c), N = H * (Dn + Dv), W = C + Dr;
        double Td = sh->n_dec * dec_rows(sh), dk = cap > 0 && sh->dec_ctx > cap ? cap : sh->dec_ctx;
        if (sh->n_dec > 0) ABSORBED(Td, Td * dk, sh->n_dec * sh->dec_ctx);
        double ns = sh->n_pre, ctx = sh->pre_ctx, nt = sh->pre_len, pieces = ceil(ctx / KC);
        double kq = keys_range(ctx - nt, ctx, cap);
        op(a, st, OP_ATTENTION, 0, ns * (4.0 + es) * ctx * W, ctx, QF_COUNT); /* kv_gather */
        op(a, st, OP_GEMM_ATTN, ns * 2.0 * ctx * N * C, ns * (pieces * qtensor_bytes(&w->wkv_b) + 4.0 * ctx * (C + N)),
           ctx < KC ? ctx : KC, w->wkv_b.fmt);
        op(a, st, OP_ATTENTION, ns * (2.0 * H * kq * (Dn + Dr + Dv) + 5.0 * H * kq),
           ns * (4.0 * ctx * (N + Dr) + pieces * 4.0 * nt * H * (Dn + Dr + 2.0 * Dv + 4.0)), T, QF_COUNT);
    }
#undef ABSORBED
    mm(a, st, OP_GEMM_ATTN, T, &w->wo, 0);
    allreduce(a, st, T * D);
    add(a, st, T * D, T);
}

static void gqa_layer(Acc *a, const Stage *st, const LayerWeights *w, const Shape *sh, double T)
{
    const ModelConfig *c = &st->m.cfg;
    double D = c->hidden, H = c->n_heads, Hkv = c->n_kv_heads, Dh = c->head_dim, kd = Hkv * Dh;
    double es = kv_elem_size(st->kv_dtype);
    rms(a, st, T, D, T);
    mm(a, st, OP_GEMM_ATTN, T, &w->wq, w->bq != NULL);
    mm(a, st, OP_GEMM_ATTN, T, &w->wk, w->bk != NULL);
    mm(a, st, OP_GEMM_ATTN, T, &w->wv, w->bv != NULL);
    if (c->use_qk_norm) {
        rms(a, st, T * H, Dh, T);
        rms(a, st, T * Hkv, Dh, T);
    }
    rope(a, st, T, H, c->rotary_dim);
    rope(a, st, T, Hkv, c->rotary_dim);
    kvw(a, st, T, kd);
    kvw(a, st, T, kd);
    double keys = shape_keys(sh, 0);
    op(a, st, OP_ATTENTION, 4.0 * H * Dh * keys + 5.0 * H * keys, es * shape_ctx(sh) * model_kv_width(c) + 8.0 * T * H * Dh,
       T, QF_COUNT);
    mm(a, st, OP_GEMM_ATTN, T, &w->wo, 0);
    allreduce(a, st, T * D);
    add(a, st, T * D, T);
}

static void ffn(Acc *a, const Stage *st, const LayerWeights *w, int l, double T)
{
    const ModelConfig *c = &st->m.cfg;
    const CostLayout *lo = st->lo;
    double D = c->hidden, n = T * D;
    rms(a, st, T, D, T);
    if (!c->layer_moe[l]) {
        swiglu_mlp(a, st, T, &w->w_gate_up, &w->w_gate, &w->w_up, &w->w_down);
        allreduce(a, st, n);
        add(a, st, n, T);
        return;
    }
    int shared = c->n_shared_experts > 0, beside = shared && st->s->dev->gpu && T <= st->s->dev->side_rows;
    Acc side = {0};
    double from = acc_compute(a);
    if (shared) swiglu_mlp(beside ? &side : a, st, T, &w->sh_gate_up, &w->sh_gate, &w->sh_up, &w->sh_down);
    if (!beside) from = acc_compute(a);
    mm(a, st, OP_GEMM_ROUTER, T, &w->router, 0);
    double E = c->n_experts, K = c->n_experts_per_tok;
    op(a, st, OP_ROUTER, 8.0 * T * E, 4.0 * T * E + 8.0 * T * K, T, QF_COUNT);
    /* the routed experts: under ep (and dp) a rank's E / ep whole experts see K / ep of every token's
     * pairs, of all dp groups' tokens under dp (be_moe's count) */
    int ep = lo->ep > 1 ? lo->ep : 1;
    double Tm = T * lo->dp, share = 1.0 / ep, Kl = K * share;
    double n_exp = share * E * (1.0 - pow(1.0 - K / E, Tm));
    double F = lo->ep > 1 ? c->g_moe_intermediate : c->moe_intermediate;
    op(a, st, OP_MOE, 2.0 * Tm * Kl * 3.0 * F * D + 3.0 * Tm * Kl * F, n_exp * st->expert_bytes + 4.0 * Tm * D * 2 + 8.0 * Tm * Kl,
       Tm, QF_COUNT);
    if (lo->dp > 1) { /* dispatch and combine: each group rank sends its share of the group's tokens' pairs */
        double tok = T / st->tp_a, bytes = tok * K * (lo->tp - 1.0) / lo->tp * D * 4.0;
        comm(a, st->ep_link, OP_ALL_TO_ALL, bytes, lo->tp);
        comm(a, st->ep_link, OP_ALL_TO_ALL, bytes, lo->tp);
    }
    if (shared) {
        side_join(a, &side, from, beside);
        add(a, st, n, T);
    }
    allreduce(a, st, n); /* without dp the experts' sum too; under dp the group's shared expert */
    add(a, st, n, T);
}

/* one micro-batch (shape sh) through stage st: its compute and collectives, and its send on */
/* The drafts of speculative decoding (engine spec_draft, model/mtp.c): K passes of the MTP layer over
 * the decoding sequences, each eh_proj ([D, 2D] over the embedding and the hidden state), one decoder
 * layer of the model's last layer's shape, the final norm and a head row over the draft vocabulary
 * (the first catches up on the tokens the verify settled: 1 + the accepted a sequence; the chain's
 * others one row each). */
static void spec_drafts(Acc *a, const Stage *st, const Shape *sh)
{
    const CostSetup *s = st->s;
    const ModelConfig *c = &st->m.cfg;
    double D = c->hidden, S = sh->n_dec, V = c->vocab_local > 0 ? c->vocab_local : c->vocab;
    double Vd = s->spec_vocab > 0 && s->spec_vocab < V ? s->spec_vocab : V;
    int l = c->layer_end - 1;
    const LayerWeights *w = &st->m.layers[l];
    for (int k = 0; k < s->spec_k; k++) {
        double T = k == 0 ? S * cost_spec_tokens(s) : S;
        Shape one = {S, sh->dec_ctx, T / S, 0, 0, 0};
        op(a, st, OP_EMBED, 0, T * 4.0 * D * 2, T, QF_COUNT);
        rms(a, st, 2 * T, D, T);
        op(a, st, OP_GEMM_MLP, 2.0 * T * 2 * D * D, 2.0 * 2 * D * D + 4.0 * T * 3 * D, T, QF_BF16);
        if (config_is_mla(c)) mla_layer(a, st, w, l, &one, T);
        else gqa_layer(a, st, w, &one, T);
        ffn(a, st, w, l, T);
        rms(a, st, S, D, S);
        double hb = qtensor_bytes(&st->m.lm_head) * Vd / V;
        op(a, st, OP_GEMM_LM_HEAD, 2.0 * S * D * Vd, hb + 4.0 * S * (D + Vd), S, st->m.lm_head.fmt);
        op(a, st, OP_SAMPLE, S * Vd, 4.0 * S * Vd, S, QF_COUNT);
    }
}

double cost_spec_tokens(const CostSetup *s)
{
    double t = 1, p = 1;
    for (int j = 0; j < s->spec_k; j++) t += (p *= s->spec_accept);
    return t;
}

double cost_spec_accept(long chains, long accepted, int K)
{
    if (chains <= 0 || K <= 0) return 0;
    double m = (double)accepted / chains, lo = 0, hi = 1;
    for (int i = 0; i < 60; i++) { /* the sum rises with a: bisection */
        double a = (lo + hi) / 2;
        CostSetup s = {.spec_k = K, .spec_accept = a};
        if (cost_spec_tokens(&s) - 1 < m) lo = a;
        else hi = a;
    }
    return (lo + hi) / 2;
}

static void stage_step(const Stage *st, const Shape *sh, Acc *a)
{
    const ModelConfig *c = &st->m.cfg;
    double R = dec_rows(sh), T = sh->n_dec * R + sh->n_pre * sh->pre_len, D = c->hidden, n_out = sh->n_dec * R + sh->n_pre;
    memset(a, 0, sizeof *a);
    if (T <= 0) return;
    if (st->first) {
        double row = qtensor_bytes(&st->m.embed) / (double)st->m.embed.rows;
        op(a, st, OP_EMBED, 0, T * (row + 4.0 * st->m.embed.cols), T, QF_COUNT);
    }
    for (int l = c->layer_begin; l < c->layer_end; l++) {
        const LayerWeights *w = &st->m.layers[l];
        if (config_is_mla(c)) mla_layer(a, st, w, l, sh, T);
        else gqa_layer(a, st, w, sh, T);
        ffn(a, st, w, l, T);
    }
    if (!st->last) {
        double bytes = T * D * 4.0;
        if (c->index_topk && c->layer_indexer[c->layer_end] == INDEXER_SHARED) bytes += T * c->index_topk * 4.0;
        comm(a, st->pp_link, OP_PP_SEND, bytes, 2);
        return;
    }
    op(a, st, OP_GET_ROWS, 0, 8.0 * n_out * D, n_out, QF_COUNT);
    rms(a, st, n_out, D, n_out);
    mm(a, st, OP_GEMM_LM_HEAD, n_out, &st->m.lm_head, 0);
    if (st->tp_a > 1 && c->vocab_local < c->vocab) {
        double Vl = c->vocab_local;
        comm(a, st->tp_link, OP_ALL_GATHER, 4.0 * n_out * Vl * (st->tp_a - 1), st->tp_a);
        op(a, st, OP_GET_ROWS, 0, 8.0 * n_out * st->tp_a * Vl, n_out, QF_COUNT);
    }
    op(a, st, OP_SAMPLE, n_out * (double)c->vocab, 4.0 * n_out * c->vocab + 4.0 * n_out, n_out, QF_COUNT);
    if (st->s->spec_k > 0 && sh->n_dec > 0) spec_drafts(a, st, sh);
}

typedef struct {
    double step;               /* seconds, host included */
    double device;
    Acc parts;                 /* the slowest stage's, over the step, with pp_wait and host */
} Step;

static void deploy_step(Stage *stages, int pp, const CostSetup *s, const Shape *sh, Step *out)
{
    double seqs = sh->n_dec + sh->n_pre;
    int mb = pp > 1 ? (s->microbatches > 0 ? s->microbatches : pp) : 1;
    if (mb > seqs) mb = seqs < 1 ? 1 : (int)floor(seqs);
    Shape m = *sh;
    m.n_dec /= mb;
    m.n_pre /= mb;
    Acc acc[PLAN_MAX_STAGES];
    double ts[PLAN_MAX_STAGES], bubble;
    int k;
    for (int i = 0; i < pp; i++) {
        stage_step(&stages[i], &m, &acc[i]);
        ts[i] = 0;
        for (int p = 0; p < CP_COUNT; p++) ts[i] += acc[i].t[p];
    }
    double device = cost_pipeline_seconds(ts, pp, mb, &k, &bubble);
    memset(&out->parts, 0, sizeof out->parts);
    acc_add(&out->parts, &acc[k], mb);
    out->parts.t[CP_PP_WAIT] += bubble;
    if (pp > 1) { /* the logits to rank 0, after the step */
        const ModelConfig *c = &stages[pp - 1].m.cfg;
        double t = cost_comm_seconds(stages[pp - 1].pp_link, OP_PP_SEND, seqs * (double)c->vocab * 4.0, 2);
        device += t;
        out->parts.t[CP_PP_SEND] += t;
    }
    const CostDevice *h = s->host ? s->host : s->dev;
    double host = h->host_step_us * 1e-6 / (s->decode_steps > 0 ? s->decode_steps : 1) + h->host_token_us * 1e-6 * seqs;
    device += s->dev->step_us * 1e-6;
    out->parts.t[CP_HOST_GAP] += host + s->dev->step_us * 1e-6;
    out->device = device;
    out->step = device + host;
}

/* ---- stages ---- */

typedef struct { ParOpts par; int rank; } ShardCtx;

static void shard_fn(ModelConfig *c, void *user)
{
    ShardCtx *x = user;
    plan_apply(c, &x->par, x->rank);
}

static double expert_total(const Model *m)
{
    const ModelConfig *c = &m->cfg;
    double b = 0;
    for (int l = c->layer_begin; l < c->layer_end; l++) {
        if (!c->layer_moe[l] || !m->layers[l].exp_gate) continue;
        for (int e = 0; e < c->n_local_experts; e++)
            b += qtensor_bytes(&m->layers[l].exp_gate[e]) + qtensor_bytes(&m->layers[l].exp_up[e]) +
                 qtensor_bytes(&m->layers[l].exp_down[e]);
    }
    return b;
}

static int has_checkpoint(const char *dir)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "r");
    if (!f) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        f = fopen(p, "r");
    }
    if (f) fclose(f);
    return f != NULL;
}

/* link between ranks r0 .. r0 + n - 1 (consecutive): the node's when they share one */
static const CostLink *link_of(const CostSetup *s, int r0, int n)
{
    int g = s->gpus_per_node > 0 ? s->gpus_per_node : 1 << 30;
    return r0 / g == (r0 + n - 1) / g ? s->link : s->node_link ? s->node_link : s->link;
}

static void stage_open(Stage *st, const CostSetup *s, const CostLayout *lo, int stage)
{
    memset(st, 0, sizeof *st);
    st->s = s;
    st->lo = lo;
    st->stage = stage;
    ShardCtx x = {shard_opts(lo), 0};
    x.rank = stage * x.par.tp; /* tensor rank 0 of the stage, in the shard's own world */
    int was = log_level;
    log_level = LOG_WARN; /* a load a layout and stage: not worth a line each */
    if (has_checkpoint(s->dir)) model_load_shard(&st->m, s->dir, shard_fn, &x);
    else model_load_dummy_shard(&st->m, s->dir, s->dummy_fmt, s->num_layers, shard_fn, &x);
    log_level = was;
    ModelConfig *c = &st->m.cfg;
    st->kv_dtype = s->kv_dtype != KV_DTYPE_AUTO ? s->kv_dtype : model_kv_dtype(c, !s->dev->gpu);
    c->kv_dtype = st->kv_dtype;
    st->first = c->layer_begin == 0;
    st->last = c->layer_end == c->n_layers;
    st->tp_a = lo->tp / lo->dp;
    int r0 = stage * lo->tp;
    st->tp_link = link_of(s, r0, st->tp_a);
    st->ep_link = link_of(s, r0, lo->tp);
    st->pp_link = stage + 1 < lo->pp ? link_of(s, r0, lo->tp + 1) : link_of(s, 0, lo->tp * lo->pp);
    cost_rank_memory(&st->m, s->max_batch_tokens, s->max_running, s->dev->memory_bytes,
                     s->dev->reserve_bytes > 0 ? s->dev->reserve_bytes : COST_RESERVE_BYTES, &st->mem);
    /* one expert as the MoE op reads it; under dp the shard holds every expert width-split over the
     * group, the rank E / tp of them whole */
    double ex = 0;
    for (int l = c->layer_begin; l < c->layer_end && !ex; l++)
        if (c->layer_moe[l] && st->m.layers[l].exp_gate)
            ex = qtensor_bytes(&st->m.layers[l].exp_gate[0]) + qtensor_bytes(&st->m.layers[l].exp_up[0]) +
                 qtensor_bytes(&st->m.layers[l].exp_down[0]);
    st->expert_bytes = ex * (lo->dp > 1 ? st->tp_a : 1);
    if (lo->dp > 1) {
        double all = expert_total(&st->m);
        double w = st->mem.weight_bytes - all + all * st->tp_a / lo->tp;
        double d = w - st->mem.weight_bytes, x = cost_dp_exchange_bytes(c, s->max_batch_tokens);
        st->mem.weight_bytes = w;
        st->mem.activation_bytes += x; /* (the shard's config is the group's: no dp in it) */
        st->mem.nvfp4_bytes += st->m.bytes_by_format[QF_NVFP4] > 0 ? d : 0;
        if (s->dev->memory_bytes > 0) {
            st->mem.left_bytes -= d + x;
            st->mem.kv_tokens = st->mem.left_bytes > 0 ? st->mem.left_bytes * COST_KV_FRACTION / st->mem.kv_bytes_per_token : 0;
        }
    }
}

/* The dummy loader's weights cannot be cut inside a scale block (a checkpoint's would be decoded
 * to float32 there, load.c shard_cols): the input columns a tensor rank keeps of o_proj, the dense
 * and shared down projections and (without ep) the experts' must be whole blocks of the format the
 * directory's quantization config (or --dummy-quant) gives them. 0, or -1 with why. */
static int blocks_check(const CostSetup *s, const ModelConfig *c, const CostLayout *l, char *why, size_t n)
{
    if (has_checkpoint(s->dir)) return 0;
    QuantConfig q;
    char err[300];
    if (quant_config_load(&q, s->dir, err, sizeof err) < 0) return errbuf_set(why, n, "%s", err), -1;
    int block = q.algo == QALGO_NVFP4 || q.algo == QALGO_W4A16_NVFP4 ? 16 : q.algo == QALGO_FP8_BLOCK ? 128
                : q.algo == QALGO_NONE && s->dummy_fmt == QF_NVFP4 ? 16 : 1;
    const char *fmt = block == 16 ? "NVFP4's 16" : "block FP8's 128";
    quant_config_free(&q);
    int tp = l->tp / l->dp;
    if (block == 1 || tp == 1) return 0;
    struct { const char *what; long cols; int ways; } w[] = {
        {"o_proj's input", (long)c->g_heads * (config_is_mla(c) ? c->v_head_dim : c->head_dim), tp},
        {"the dense MLP width", c->first_k_dense > 0 ? c->g_intermediate : 0, tp},
        {"the shared expert width", (long)c->g_moe_intermediate * c->n_shared_experts, tp},
        {"the expert width", l->ep > 1 ? 0 : c->g_moe_intermediate, tp},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (w[i].cols > 0 && (w[i].cols / w[i].ways) % block)
            return errbuf_set(why, n, "%s %ld split %d ways is %ld columns a rank, off %s-column scale blocks", w[i].what,
                              w[i].cols, w[i].ways, w[i].cols / w[i].ways, fmt), -1;
    return 0;
}

/* ---- the steady state of continuous batching ---- */

static CostBound bound_of(const CostPoint *p, const Acc *a, const CostDevice *dev)
{
    if (p->kv_limited) return CB_KV_CAPACITY;
    double comm = p->share[CP_ALL_REDUCE] + p->share[CP_ALL_TO_ALL] + p->share[CP_PP_SEND];
    double bubble = p->share[CP_PP_WAIT], host = p->share[CP_HOST_GAP] + p->share[CP_SCHEDULING];
    int dom = 0;
    for (int c = 1; c < CC_COUNT; c++)
        if (p->share[c] > p->share[dom]) dom = c;
    double top = bubble;
    CostBound b = CB_BUBBLE;
    if (comm > top) top = comm, b = CB_COMMUNICATION;
    if (host > top) top = host, b = CB_HOST;
    /* as diagnose decides: a quarter of the step that outweighs every compute category alone */
    if (top >= 0.25 && top >= p->share[dom]) return b;
    double ai = a->bytes[dom] > 0 ? a->flops[dom] / a->bytes[dom] : 1e9;
    double ridge = dev->bf16_tflops * 1e12 / (dev->read_gbps * 1e9);
    return ai >= ridge ? CB_COMPUTE : CB_MEMORY;
}

/* A point's rates per GPU and user, its step's shares and bound, from its output rate, TPOT and the
 * step's parts. */
static void point_finish(CostPoint *pt, const Acc *parts, const CostLayout *lo, const CostDevice *dev)
{
    pt->tok_s_gpu = pt->output_tok_s / (lo->tp * lo->pp);
    pt->tok_s_user = 1e3 / pt->tpot_ms;
    double total = 0;
    for (int p = 0; p < CP_COUNT; p++) total += parts->t[p];
    for (int p = 0; p < CP_COUNT; p++) pt->share[p] = total > 0 ? parts->t[p] / total : 0;
    pt->bound = bound_of(pt, parts, dev);
}

static void plan_point(Stage *stages, const CostSetup *s, const CostLayout *lo, double kv_tokens_group, int conc,
                       CostPoint *pt)
{
    memset(pt, 0, sizeof *pt);
    pt->concurrency = conc;
    double I = s->input_len, O = s->output_len;
    double cg = (double)conc / lo->dp; /* the clients a group serves */
    /* requests admitted at once: the clients, --max-running-requests, and what the KV pool holds
     * (a running request holds its prompt and, on average, half its output) */
    double by_kv = floor(kv_tokens_group / (I + O / 2));
    double run = cg < s->max_running ? cg : s->max_running;
    if (by_kv < run) {
        run = by_kv < 1 ? 1 : by_kv;
        pt->kv_limited = 1;
    }
    /* a request's prompt in chunks of --chunked-prefill-size, within --max-batch-tokens */
    double chunk = s->chunked_prefill > 0 ? s->chunked_prefill : s->max_batch_tokens;
    if (chunk > s->max_batch_tokens) chunk = s->max_batch_tokens;
    if (chunk > I) chunk = I;
    double k_pref = ceil(I / chunk);
    /* with speculation a decoding step gives tps tokens a sequence: O / tps steps of decoding */
    double tps = cost_spec_tokens(s), R = s->spec_k > 0 ? 1 + s->spec_k : 1, Od = O / tps;
    double dec = run * Od / (Od + k_pref), npre = run - dec; /* sequences decoding, and prefilling, in a step */
    double ctx = I + (O + 1) / 2.0;
    Shape d0 = {dec, ctx, R, 0, 0, 0};
    Step sd, sm, sm2;
    deploy_step(stages, lo->pp, s, &d0, &sd);
    /* the prefill a step carries: npre chunks on average; steps with floor(npre) and ceil(npre) */
    double lo_n = floor(npre), frac = npre - lo_n;
    Shape a = {dec, ctx, R, lo_n, chunk, I / 2.0 + chunk / 2.0}, b = a;
    b.n_pre = lo_n + 1;
    if (lo_n > 0) deploy_step(stages, lo->pp, s, &a, &sm);
    else sm = sd;
    deploy_step(stages, lo->pp, s, &b, &sm2);
    double step = (1 - frac) * sm.step + frac * sm2.step;
    Acc parts = {0};
    acc_add(&parts, &sm.parts, 1 - frac);
    acc_add(&parts, &sm2.parts, frac);
    pt->decode_ms = sd.step * 1e3;
    pt->step_ms = step * 1e3;
    pt->tpot_ms = step * 1e3 / tps;
    pt->decode_batch = dec;
    pt->prefill_per_step = npre * chunk;
    pt->running = (int)run;
    /* TTFT: half a step to the next one, the prompt's chunks, and a slot's wait when clients outnumber slots */
    double req_s = (Od + k_pref) * step, rate = run / req_s;
    pt->queue_ms = cg > run ? (cg - run) / rate * 1e3 : 0;
    pt->ttft_ms = step * 1e3 / 2 + k_pref * sm2.step * 1e3 + pt->queue_ms;
    pt->output_tok_s = lo->dp * dec * tps / step;
    point_finish(pt, &parts, lo, s->dev);
}

/* One wave of conc requests started together (CostSetup.wave: diagnose's and bench model's load):
 * the prompts' prefill steps (chunks of --chunked-prefill-size, as many a step as
 * --max-batch-tokens holds), then output_len - 1 decode steps of the whole wave (the last prefill
 * step draws the first token); a point's step and parts are the mean over all of them. */
static void plan_wave(Stage *stages, const CostSetup *s, const CostLayout *lo, int conc, CostPoint *pt)
{
    memset(pt, 0, sizeof *pt);
    pt->concurrency = conc;
    double I = s->input_len, O = s->output_len, B = ceil((double)conc / lo->dp);
    double chunk = s->chunked_prefill > 0 ? s->chunked_prefill : s->max_batch_tokens;
    if (chunk > s->max_batch_tokens) chunk = s->max_batch_tokens;
    if (chunk > I) chunk = I;
    double chunks = B * ceil(I / chunk), per_step = floor(s->max_batch_tokens / chunk);
    if (per_step < 1) per_step = 1;
    double tps = cost_spec_tokens(s), R = s->spec_k > 0 ? 1 + s->spec_k : 1;
    double n_pre_steps = ceil(chunks / per_step), n_dec_steps = O > 1 ? ceil((O - 1) / tps) : 0;
    Shape pre = {0, 0, 1, chunks < per_step ? chunks : per_step, chunk, I / 2.0 + chunk / 2.0};
    Shape dec = {B, I + O / 2.0, R, 0, 0, 0};
    Step sp, sd;
    deploy_step(stages, lo->pp, s, &pre, &sp);
    if (n_dec_steps > 0) deploy_step(stages, lo->pp, s, &dec, &sd);
    else sd = sp;
    double total_s = n_pre_steps * sp.step + n_dec_steps * sd.step;
    /* the steps a point's mean is over: all, or those a profiler timing one step in N times (the
     * engine's steps N, 2N, ... counted from 1) */
    double w_pre = n_pre_steps, w_dec = n_dec_steps;
    if (s->wave_every > 1) {
        w_pre = floor(n_pre_steps / s->wave_every);
        w_dec = floor((n_pre_steps + n_dec_steps) / s->wave_every) - w_pre;
        if (w_pre + w_dec <= 0) w_pre = n_pre_steps, w_dec = n_dec_steps;
    }
    double steps = w_pre + w_dec;
    Acc parts = {0};
    acc_add(&parts, &sp.parts, w_pre / steps);
    acc_add(&parts, &sd.parts, w_dec / steps);
    pt->decode_ms = sd.step * 1e3;
    pt->step_ms = (w_pre * sp.step + w_dec * sd.step) / steps * 1e3;
    pt->tpot_ms = sd.step * 1e3 / tps;
    pt->ttft_ms = n_pre_steps * sp.step * 1e3;
    pt->decode_batch = B;
    pt->prefill_per_step = pre.n_pre * chunk;
    pt->running = (int)B;
    pt->output_tok_s = lo->dp * B * O / total_s;
    point_finish(pt, &parts, lo, s->dev);
}

void cost_plan(const CostSetup *s, const ModelConfig *whole, const CostLayout *l, const int *conc, int n_conc,
               CostPlan *out)
{
    memset(out, 0, sizeof *out);
    out->lo = *l;
    cost_layout_name(l, out->name, sizeof out->name);
    int world = s->gpus_per_node * (s->nodes > 0 ? s->nodes : 1);
    ModelConfig c = *whole;
    if (s->num_layers > 0 && s->num_layers < c.n_layers) c.n_layers = c.layer_end = s->num_layers;
    if (cost_layout_check(&c, l, world, out->why, sizeof out->why) < 0 || blocks_check(s, &c, l, out->why, sizeof out->why) < 0)
        return;
    if (s->spec_k > 0 && (l->pp > 1 || l->dp > 1)) { /* model/load.c model_load_mtp: tensor and expert parallel only */
        errbuf_set(out->why, sizeof out->why, "speculative decoding runs without %s for now", l->pp > 1 ? "pp" : "dp");
        return;
    }
    out->allowed = 1;
    Stage *st = xcalloc(l->pp, sizeof *st);
    double kv_min = -1;
    for (int i = 0; i < l->pp; i++) {
        stage_open(&st[i], s, l, i);
        const CostRankMem *m = &st[i].mem;
        if (m->weight_bytes > out->weight_bytes_per_gpu) out->weight_bytes_per_gpu = m->weight_bytes;
        if (m->activation_bytes > out->activation_bytes_per_gpu) out->activation_bytes_per_gpu = m->activation_bytes;
        if (m->kv_bytes_per_token > out->kv_bytes_per_token) out->kv_bytes_per_token = m->kv_bytes_per_token;
        if (kv_min < 0 || m->kv_tokens < kv_min) kv_min = m->kv_tokens;
    }
    out->kv_tokens_total = kv_min * l->dp;
    double need = s->input_len + s->output_len;
    out->fits = kv_min >= need;
    if (!out->fits) {
        int k = 0;
        for (int i = 1; i < l->pp; i++)
            if (st[i].mem.kv_tokens < st[k].mem.kv_tokens) k = i;
        const CostRankMem *m = &st[k].mem;
        errbuf_set(out->why, sizeof out->why, "stage %d: weights %.1f GB + activations %.1f GB of %.1f GB leave %s", k,
                   m->weight_bytes / 1e9, m->activation_bytes / 1e9, s->dev->memory_bytes / 1e9,
                   m->left_bytes <= 0 ? "nothing for the KV cache" : "less KV cache than one request of input + output");
    }
    /* batch 1 decode at the prompt's length: the bytes the slowest stage's ops move for one token */
    {
        Shape one = {1, s->input_len + 1, 1, 0, 0, 0};
        double worst = 0;
        for (int i = 0; i < l->pp; i++) {
            Acc a;
            stage_step(&st[i], &one, &a);
            double b = 0;
            for (int cc = 0; cc < CC_COUNT; cc++) b += a.bytes[cc];
            if (b > worst) worst = b;
        }
        out->read_bytes_per_token = worst;
    }
    if (out->fits)
        for (int i = 0; i < n_conc && i < COST_MAX_POINTS; i++) {
            CostPoint *pt = &out->points[out->n_points++];
            if (s->wave) plan_wave(st, s, l, conc[i], pt);
            else plan_point(st, s, l, kv_min, conc[i], pt);
        }
    for (int i = 0; i < l->pp; i++) model_free(&st[i].m);
    free(st);
}

json_t *cost_plan_json(const CostPlan *p)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:b, s:b}", "layout", p->name, "tp", p->lo.tp, "pp", p->lo.pp, "ep",
                          p->lo.ep, "dp", p->lo.dp, "allowed", p->allowed, "fits", p->fits);
    if (p->why[0]) json_object_set_new(o, "reason", json_string(p->why));
    if (!p->allowed) return o;
    json_object_set_new(o, "weight_bytes_per_gpu", json_real(p->weight_bytes_per_gpu));
    json_object_set_new(o, "activation_bytes_per_gpu", json_real(p->activation_bytes_per_gpu));
    json_object_set_new(o, "kv_bytes_per_token_per_gpu", json_real(p->kv_bytes_per_token));
    json_object_set_new(o, "kv_tokens_total", json_real(p->kv_tokens_total));
    json_object_set_new(o, "decode_bytes_per_token", json_real(p->read_bytes_per_token));
    json_t *pts = json_array();
    for (int i = 0; i < p->n_points; i++) {
        const CostPoint *q = &p->points[i];
        json_t *br = json_object();
        for (int k = 0; k < CP_COUNT; k++)
            if (q->share[k] > 0) json_object_set_new(br, part_names[k], json_real(q->share[k]));
        json_array_append_new(pts, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:b, s:s, s:o}",
                                             "concurrency", q->concurrency, "tpot_ms", q->tpot_ms, "ttft_ms", q->ttft_ms,
                                             "output_tok_s", q->output_tok_s, "tok_s_per_gpu", q->tok_s_gpu,
                                             "tok_s_per_user", q->tok_s_user, "decode_step_ms", q->decode_ms,
                                             "decode_batch", q->decode_batch, "prefill_tokens_per_step",
                                             q->prefill_per_step, "queue_ms", q->queue_ms, "running", q->running,
                                             "kv_limited", q->kv_limited, "bound", cost_bound_name(q->bound),
                                             "breakdown", br));
    }
    json_object_set_new(o, "points", pts);
    return o;
}
