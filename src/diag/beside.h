/* beside: a measured step breakdown next to the one the cost model predicts for the same
 * deployment and load (`diagnose`), and the categories where they part: there either the model
 * misses something (a profile's efficiency, an op it does not count) or the engine does (a kernel
 * slower than it should be, a wait nobody planned). */
#ifndef MOESERVE_DIAG_BESIDE_H
#define MOESERVE_DIAG_BESIDE_H

#include <jansson.h>
#include <stdio.h>

#include "verdict.h"

/* A category is named when measured and predicted differ by more than this share of the larger
 * of the two, and that larger one is at least BESIDE_MIN_SHARE of its step (smaller parts are
 * noise in a sampled profile). */
#define BESIDE_DISAGREE 0.25
#define BESIDE_MIN_SHARE 0.05
#define BESIDE_MAX_SPEC 8          /* draft counts compared: 0 .. BESIDE_MAX_SPEC - 1 at most */

typedef struct {
    char profile[64];              /* the device profile the prediction used */
    char layout[48];
    double step_ms;                /* predicted mean step */
    double ms[SC_COUNT];           /* predicted, per category */
    int n_off;
    int off[SC_COUNT];             /* the categories that disagree, largest difference first */
    /* speculative decoding (a run with drafts): the predicted TPOT with 0..n_spec-1 drafts a step
       at the acceptance the run measured, the run's own count among them */
    int n_spec, spec_now;
    double spec_accept;            /* the chance a draft is accepted when the ones before it were */
    double spec_tpot[BESIDE_MAX_SPEC];
} Beside;

/* The draft count with the lowest predicted TPOT (0: none); one within 2% of the run's own does
 * not replace it. -1 without a speculative prediction. */
int beside_spec_best(const Beside *b);

/* Fill b's n_off/off from g (measured) and b's prediction (step_ms, ms). */
void beside_compare(const Diagnosis *g, Beside *b);
/* {"profile", "layout", "step_ms": {measured, predicted}, "breakdown": {category: {measured_ms,
 * predicted_ms}}, "disagree": [category, ...]}, and with drafts "speculative": {"accept_rate",
 * "num_speculative_tokens", "best", "tpot_ms": [K = 0, 1, ...]} */
json_t *beside_json(const Diagnosis *g, const Beside *b);
void beside_print(FILE *f, const Diagnosis *g, const Beside *b);

#endif
