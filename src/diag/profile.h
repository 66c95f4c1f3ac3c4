/* profile: timing one engine step op by op. While be->hook is a Prof's hook, every
 * op (the be_* wrappers of backend.h, and the collectives of src/dist through be_op_begin /
 * be_count) is bracketed: on the CPU by the wall clock, on a GPU by events on the stream, read
 * once the step is done. The engine profiles one step in N (always on, the cost measured in
 * docs/PERFORMANCE.md) and keeps the sums; diag/verdict.h turns them into a diagnosis. */
#ifndef MOESERVE_PROFILE_H
#define MOESERVE_PROFILE_H

#include "../backend/backend.h"

/* The categories a step is split into (issue #9), in report order. */
typedef enum {
    SC_DENSE_GEMM, SC_MOE_GEMM, SC_ATTENTION, SC_INDEXER, SC_NORM, SC_ROUTER, SC_SAMPLE,
    SC_ALL_REDUCE, SC_ALL_TO_ALL, SC_PP_SEND, SC_PP_WAIT, SC_HOST_GAP, SC_SCHEDULING, SC_COUNT
} StepCat;
const char *step_cat_name(StepCat c);   /* "dense_gemm", ... (JSON keys, Prometheus labels) */
const char *step_cat_title(StepCat c);  /* "dense GEMM", ... */
/* the category of an op's time (OP_PP_RECV: its transfer goes under SC_PP_SEND, the rest, waiting
 * for the previous stage, under SC_PP_WAIT: profile_end_step splits it) */
StepCat step_cat_of(OpId op);

typedef struct {
    int n, cap;
    int *op;
    double *t0, *t1;           /* cpu: seconds (clock_now) */
    void **e0, **e1;           /* gpu: events */
    double *bytes, *flops;
    int gpu;
    double wall0, wall1;
    Backend *be;               /* the backend being timed (borrowed) */
    OpHook hook;               /* installed in be->hook for a step */
} Prof;

/* Sums over the profiled steps. */
typedef struct {
    long steps;                /* profiled steps */
    long tokens;               /* tokens they computed */
    double wall_ms;            /* their wall time */
    double ms[SC_COUNT];
    double flops[SC_COUNT], bytes[SC_COUNT];
    double op_ms[OP_COUNT];
} ProfSum;

void prof_init(Prof *p, Backend *be);
void prof_free(Prof *p, Backend *be);
/* start a step (be->hook = p's), and end it: the op times of the step added to s with the step's
 * wall time, its scheduling time (host work before the forward) and tokens; p2p_gbps (> 0)
 * splits pipeline receives into transfer and wait. */
void profile_begin_step(Prof *p, Backend *be);
void profile_end_step(Prof *p, Backend *be, ProfSum *s, double sched_ms, int tokens, double p2p_gbps);
/* the step's work is done (its wall time ends here; profile_end_step may come later, e.g.
 * after waiting for a lock) */
void profile_stop(Prof *p, Backend *be);
/* dst += src (the buckets of a window of steps) */
void prof_sum_add(ProfSum *dst, const ProfSum *src);

#endif
