/* verdict: where a deployment's step time goes and what to change (issue #9). diagnose() is a
 * pure function of the profile sums, the ceilings and the deployment's facts, so that tests can
 * feed it any breakdown. */
#ifndef MOESERVE_VERDICT_H
#define MOESERVE_VERDICT_H

#include <jansson.h>
#include <stdio.h>

#include "calibrate.h"
#include "profile.h"

typedef enum {
    V_COMPUTE, V_MEMORY, V_UNDER_TUNED, V_COMMUNICATION, V_BUBBLE, V_HOST, V_KV_CAPACITY, V_NONE, V_COUNT
} Verdict;
const char *verdict_name(Verdict v); /* "compute-bound", ..., "no-load" */

typedef struct {
    int tp, pp, ep, microbatches;
    int dp;                        /* attention data-parallel groups (0 or 1: none) */
    int gpu, graphs;               /* a GPU backend; decode steps as CUDA graphs */
    int running, waiting, max_running;
    int kv_blocks_total, kv_blocks_used;
    long preemptions;
    int spec_k;                    /* speculative decoding: drafts a step (0: off) */
    long spec_chains, spec_drafts, spec_accepted; /* since the start: chains verified, drafts in them, accepted */
    long steps;                    /* the steps of the window diagnosed (profiled or not) */
    double steps_wall_ms;          /* their wall time */
    long tokens;                   /* tokens they computed */
    long steps_total;              /* every step since the start */
    double window_s;               /* the span of the window's steps (0: not known) */
    double idle_s;                 /* no request in the engine: seconds since its last step (the window then
                                      holds the last load's steps); 0 while busy */
    double power_w, power_limit_w; /* GPU (NVML), 0: unknown */
    int sm_clock_mhz, sm_clock_max_mhz;
} Deployment;

#define DIAG_MAX_LINES 10
typedef struct {
    Verdict verdict;
    double step_ms;                /* mean wall time of a step */
    double tok_per_s;
    long profiled_steps;           /* the profiled steps behind ms[] */
    double window_s, idle_s;       /* Deployment's */
    double ms[SC_COUNT], share[SC_COUNT], tflops_pct[SC_COUNT], gbps_pct[SC_COUNT];
    int n_evidence, n_advice;
    char evidence[DIAG_MAX_LINES][320];
    char advice[DIAG_MAX_LINES][320];
} Diagnosis;

void diagnose(const ProfSum *s, const Ceilings *c, const Deployment *d, Diagnosis *out);
/* A fact about the run that qualifies the diagnosis (the ranks share cores): evidence put first,
 * advice last (either may be NULL). */
void diagnosis_note(Diagnosis *g, const char *evidence, const char *advice);
/* {"verdict", "evidence", "breakdown": {category: {ms, share, tflops_pct, gbps_pct}}, "advice",
 *  "step_ms", "tokens_per_s", "window": {seconds, steps, profiled_steps, tokens, wall_ms, idle_s},
 *  "deployment", "ceilings"} */
json_t *diagnosis_json(const Diagnosis *g, const Deployment *d, const Ceilings *c);
void diagnosis_print(FILE *f, const Diagnosis *g, const Deployment *d, const Ceilings *c);
/* Prometheus gauges (text format) appended to buf */
void diagnosis_prometheus(const Diagnosis *g, char *buf, size_t n);

#endif
