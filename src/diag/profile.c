/* profile: op-by-op timing of sampled steps (profile.h). */
#include "profile.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

static const char *const cat_names[SC_COUNT] = {
    "dense_gemm", "moe_gemm", "attention", "indexer", "norms_elementwise", "router_dispatch", "sampling",
    "all_reduce", "all_to_all", "pp_send_recv", "pp_bubble", "host_gap", "scheduling",
};
static const char *const cat_titles[SC_COUNT] = {
    "dense GEMM", "MoE GEMM", "attention", "indexer", "norms and elementwise", "router and dispatch", "sampling",
    "all-reduce", "all-to-all", "pipeline send/receive", "pipeline wait (bubble)", "host gap", "scheduling",
};

const char *step_cat_name(StepCat c) { return (unsigned)c < SC_COUNT ? cat_names[c] : "?"; }
const char *step_cat_title(StepCat c) { return (unsigned)c < SC_COUNT ? cat_titles[c] : "?"; }

StepCat step_cat_of(OpId op)
{
    switch (op_category(op)) {
    case CAT_GEMM: return SC_DENSE_GEMM;
    case CAT_MOE: return SC_MOE_GEMM;
    case CAT_ATTENTION: return SC_ATTENTION;
    case CAT_INDEXER: return SC_INDEXER;
    case CAT_ELEMENTWISE: return SC_NORM;
    case CAT_ROUTER: return SC_ROUTER;
    case CAT_SAMPLE: return SC_SAMPLE;
    case CAT_ALL_REDUCE: return SC_ALL_REDUCE;
    case CAT_ALL_TO_ALL: return SC_ALL_TO_ALL;
    case CAT_PP: return op == OP_PP_RECV ? SC_PP_WAIT : SC_PP_SEND;
    default: return SC_NORM;
    }
}

static void prof_op_begin(void *ctx);
static void prof_op_end(void *ctx, OpId op, double flops, double bytes);

void prof_init(Prof *p, Backend *be)
{
    *p = (Prof){.gpu = be->ops->event_create != NULL, .be = be};
    p->hook = (OpHook){.begin = prof_op_begin, .end = prof_op_end, .ctx = p};
}

void prof_free(Prof *p, Backend *be)
{
    if (p->gpu)
        for (int i = 0; i < p->cap; i++) {
            be->ops->event_destroy(be, p->e0[i]);
            be->ops->event_destroy(be, p->e1[i]);
        }
    free(p->op); free(p->t0); free(p->t1); free(p->e0); free(p->e1); free(p->bytes); free(p->flops);
    *p = (Prof){0};
}

static void grow(Prof *p, Backend *be)
{
    int cap = p->cap ? 2 * p->cap : 1024;
    p->op = xrealloc(p->op, cap * sizeof(int));
    p->t0 = xrealloc(p->t0, cap * sizeof(double));
    p->t1 = xrealloc(p->t1, cap * sizeof(double));
    p->bytes = xrealloc(p->bytes, cap * sizeof(double));
    p->flops = xrealloc(p->flops, cap * sizeof(double));
    if (p->gpu) {
        p->e0 = xrealloc(p->e0, cap * sizeof(void *));
        p->e1 = xrealloc(p->e1, cap * sizeof(void *));
        for (int i = p->cap; i < cap; i++) {
            p->e0[i] = be->ops->event_create(be);
            p->e1[i] = be->ops->event_create(be);
        }
    }
    p->cap = cap;
}

/* the hook's ends: an op's start and end on the stream (or the clock) */
static void prof_op_begin(void *ctx)
{
    Prof *p = ctx;
    Backend *be = p->be;
    if (p->n == p->cap) grow(p, be);
    if (p->gpu) be->ops->event_record(be, p->e0[p->n]);
    else p->t0[p->n] = clock_now();
}

static void prof_op_end(void *ctx, OpId op, double flops, double bytes)
{
    Prof *p = ctx;
    Backend *be = p->be;
    if (p->n == p->cap) return; /* an end without its begin */
    p->flops[p->n] = flops;
    if (p->gpu) be->ops->event_record(be, p->e1[p->n]);
    else p->t1[p->n] = clock_now();
    p->op[p->n] = op;
    p->bytes[p->n] = bytes;
    p->n++;
}

void profile_begin_step(Prof *p, Backend *be)
{
    p->n = 0;
    p->wall0 = clock_now();
    p->be = be;
    p->hook.ctx = p;
    be->hook = &p->hook;
}

void profile_stop(Prof *p, Backend *be)
{
    be->hook = NULL;
    p->wall1 = clock_now();
}

void profile_end_step(Prof *p, Backend *be, ProfSum *s, double sched_ms, int tokens, double p2p_gbps)
{
    if (be->hook) profile_stop(p, be);
    double busy = 0, wall = (p->wall1 - p->wall0) * 1e3;
    for (int i = 0; i < p->n; i++) {
        double ms;
        if (p->gpu) ms = be->ops->event_elapsed(be, p->e0[i], p->e1[i]); /* waits for the step */
        else ms = (p->t1[i] - p->t0[i]) * 1e3;
        if (ms < 0) ms = 0;
        OpId op = (OpId)p->op[i];
        StepCat c = step_cat_of(op);
        if (op == OP_PP_RECV) { /* moving the bytes is transfer; the rest was waiting (the bubble) */
            double xfer = p2p_gbps > 0 ? p->bytes[i] / (p2p_gbps * 1e9) * 1e3 : 0;
            if (xfer > ms) xfer = ms;
            s->ms[SC_PP_SEND] += xfer;
            s->ms[SC_PP_WAIT] += ms - xfer;
        } else {
            s->ms[c] += ms;
        }
        s->flops[c] += p->flops[i];
        s->bytes[c] += p->bytes[i];
        s->op_ms[op] += ms;
        busy += ms;
    }
    if (p->gpu && p->n) { /* the stream's span: its idle gaps are the host's */
        double span = be->ops->event_elapsed(be, p->e0[0], p->e1[p->n - 1]);
        wall = wall > span ? wall : span;
    }
    double gap = wall - busy;
    s->ms[SC_HOST_GAP] += gap > 0 ? gap : 0;
    s->ms[SC_SCHEDULING] += sched_ms;
    s->wall_ms += wall + sched_ms;
    s->steps++;
    s->tokens += tokens;
}

void prof_sum_add(ProfSum *dst, const ProfSum *src)
{
    dst->steps += src->steps;
    dst->tokens += src->tokens;
    dst->wall_ms += src->wall_ms;
    for (int k = 0; k < SC_COUNT; k++) {
        dst->ms[k] += src->ms[k];
        dst->flops[k] += src->flops[k];
        dst->bytes[k] += src->bytes[k];
    }
    for (int k = 0; k < OP_COUNT; k++) dst->op_ms[k] += src->op_ms[k];
}
