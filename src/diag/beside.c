/* beside: measured against predicted, category by category (beside.h). */
#include "beside.h"

#include <math.h>
#include <string.h>

static double larger(double a, double b) { return a > b ? a : b; }

void beside_compare(const Diagnosis *g, Beside *b)
{
    double diff[SC_COUNT];
    b->n_off = 0;
    for (int c = 0; c < SC_COUNT; c++) {
        double m = g->ms[c], p = b->ms[c], big = larger(m, p);
        double step = larger(g->step_ms, b->step_ms);
        diff[c] = fabs(m - p);
        if (big <= 0 || step <= 0 || big < BESIDE_MIN_SHARE * step) continue;
        if (diff[c] > BESIDE_DISAGREE * big) b->off[b->n_off++] = c;
    }
    for (int i = 1; i < b->n_off; i++) /* largest difference first (insertion: at most SC_COUNT) */
        for (int j = i; j > 0 && diff[b->off[j]] > diff[b->off[j - 1]]; j--) {
            int t = b->off[j];
            b->off[j] = b->off[j - 1];
            b->off[j - 1] = t;
        }
}

int beside_spec_best(const Beside *b)
{
    if (b->n_spec <= 0) return -1;
    int best = b->spec_now;
    for (int k = 0; k < b->n_spec; k++)
        if (b->spec_tpot[k] < b->spec_tpot[best] && b->spec_tpot[k] < 0.98 * b->spec_tpot[b->spec_now]) best = k;
    return best;
}

json_t *beside_json(const Diagnosis *g, const Beside *b)
{
    json_t *o = json_object(), *br = json_object(), *off = json_array();
    json_object_set_new(o, "profile", json_string(b->profile));
    json_object_set_new(o, "layout", json_string(b->layout));
    json_object_set_new(o, "step_ms", json_pack("{s:f, s:f}", "measured", g->step_ms, "predicted", b->step_ms));
    for (int c = 0; c < SC_COUNT; c++)
        json_object_set_new(br, step_cat_name(c), json_pack("{s:f, s:f}", "measured_ms", g->ms[c], "predicted_ms", b->ms[c]));
    json_object_set_new(o, "breakdown", br);
    for (int i = 0; i < b->n_off; i++) json_array_append_new(off, json_string(step_cat_name(b->off[i])));
    json_object_set_new(o, "disagree", off);
    if (b->n_spec > 0) {
        json_t *t = json_array();
        for (int k = 0; k < b->n_spec; k++) json_array_append_new(t, json_real(b->spec_tpot[k]));
        json_object_set_new(o, "speculative", json_pack("{s:f, s:i, s:i, s:o}", "accept_rate", b->spec_accept,
                                                        "num_speculative_tokens", b->spec_now, "best",
                                                        beside_spec_best(b), "tpot_ms", t));
    }
    return o;
}

void beside_print(FILE *f, const Diagnosis *g, const Beside *b)
{
    fprintf(f, "\nplan beside the measurement (profile %s, %s): a step %.3f ms measured, %.3f ms predicted\n", b->profile,
            b->layout, g->step_ms, b->step_ms);
    fprintf(f, "  %-18s %12s %12s\n", "category", "measured ms", "predicted ms");
    for (int c = 0; c < SC_COUNT; c++)
        if (g->ms[c] > 0 || b->ms[c] > 0) fprintf(f, "  %-18s %12.3f %12.3f\n", step_cat_name(c), g->ms[c], b->ms[c]);
    if (b->n_spec > 0) {
        fprintf(f, "  TPOT predicted at the measured acceptance (%.2f a draft), by drafts a step:", b->spec_accept);
        for (int k = 0; k < b->n_spec; k++) fprintf(f, "%s %d: %.3f ms%s", k ? "," : "", k, b->spec_tpot[k], k == b->spec_now ? " (this run)" : "");
        fprintf(f, "\n");
    }
    if (b->n_off == 0) {
        fprintf(f, "  every category within %.0f%% of the prediction\n", 100 * BESIDE_DISAGREE);
        return;
    }
    fprintf(f, "  the place to look (more than %.0f%% apart):", 100 * BESIDE_DISAGREE);
    for (int i = 0; i < b->n_off; i++) {
        int c = b->off[i];
        fprintf(f, "%s %s (%.3f ms measured, %.3f predicted)", i ? "," : "", step_cat_name(c), g->ms[c], b->ms[c]);
    }
    fprintf(f, "\n");
}
