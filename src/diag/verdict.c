/* verdict: from a step's breakdown to the bottleneck and the advice (verdict.h). */
#include "verdict.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

static const char *const vnames[V_COUNT] = {
    "compute-bound", "memory-bound", "under-tuned-kernels", "communication-bound", "pipeline-bubble-bound",
    "host-bound", "kv-capacity-bound", "no-load",
};

#define DIAG_IDLE_NOTE_S 1.0 /* idle this long: the evidence says the figures are the last load's */

const char *verdict_name(Verdict v) { return (unsigned)v < V_COUNT ? vnames[v] : "?"; }

static void line(char (*arr)[320], int *n, const char *fmt, ...)
{
    if (*n >= DIAG_MAX_LINES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(arr[(*n)++], 320, fmt, ap);
    va_end(ap);
}
#define EVID(...) line(g->evidence, &g->n_evidence, __VA_ARGS__)
#define ADV(...) line(g->advice, &g->n_advice, __VA_ARGS__)

static int is_compute(int c) { return c <= SC_SAMPLE; }

/* the dominant op is far below its roof: what can be done about that op. `moeserve tune` times the
 * GPU's NVFP4 tiles; the CPU backend is the float32 reference, with no tiles to tune. */
static void advise_kernel(Diagnosis *g, const Deployment *d, int dom, double pct, const char *roof)
{
    if (!d->gpu)
        ADV("%s reaches %.1f%% of the %s roof on the CPU backend, the float32 reference, which has no tuning knob: "
            "more --threads (up to the cores this rank may use) is what speeds it up",
            step_cat_title(dom), pct, roof);
    else if (dom == SC_MOE_GEMM || dom == SC_DENSE_GEMM)
        ADV("%s reaches %.1f%% of the %s roof: run `moeserve tune` for this GPU (the NVFP4 tiles) and compare with "
            "`moeserve bench kernels`", step_cat_title(dom), pct, roof);
    else
        ADV("%s reaches %.1f%% of the %s roof and has no tuning knob: its kernel is what to speed up (a larger "
            "batch will not hide it, since it grows with the batch)", step_cat_title(dom), pct, roof);
}

void diagnose(const ProfSum *s, const Ceilings *c, const Deployment *d, Diagnosis *g)
{
    memset(g, 0, sizeof *g);
    g->tok_per_s = d->steps_wall_ms > 0 ? d->tokens / (d->steps_wall_ms / 1e3) : 0;
    g->profiled_steps = s->steps;
    g->window_s = d->window_s;
    g->idle_s = d->idle_s;
    /* an idle server's figures are its last load's: say so first, so that nobody reads them as now
     * (not for a pause between two requests, nor right after a load of `diagnose --model`) */
    if (d->idle_s >= DIAG_IDLE_NOTE_S && d->steps > 0)
        EVID("idle for %.1f s (no request in the engine): these figures are the last %.1f s of load before that",
             d->idle_s, d->window_s);
    if (s->steps == 0 || d->steps == 0) {
        g->verdict = V_NONE;
        if (d->steps > 0) EVID("none of the last %ld steps has been profiled yet (one in --profile-every is)", d->steps);
        else EVID("no step has been profiled yet (no load)");
        ADV("send requests (or run `moeserve diagnose --model DIR`, which brings its own load)");
        return;
    }
    /* per step: the ops' time from the profiled steps; the host's share from every step's wall
     * time (most decode steps replay graphs; a profiled step runs op by op) */
    double ps = (double)s->steps, busy = 0;
    for (int k = 0; k < SC_COUNT; k++) g->ms[k] = s->ms[k] / ps;
    for (int k = 0; k <= SC_PP_WAIT; k++) busy += g->ms[k];
    if (d->graphs) {
        /* decode steps replay graphs, and a profiled step runs op by op: the host's share from
           every step's wall time against the ops' time */
        double wall = d->steps_wall_ms / d->steps;
        g->ms[SC_HOST_GAP] = wall - busy - g->ms[SC_SCHEDULING] > 0 ? wall - busy - g->ms[SC_SCHEDULING] : 0;
    } /* else the profiled steps' own gaps (profile_end_step) */
    double total = 0;
    for (int k = 0; k < SC_COUNT; k++) total += g->ms[k];
    g->step_ms = total;
    for (int k = 0; k < SC_COUNT; k++) {
        g->share[k] = total > 0 ? g->ms[k] / total : 0;
        double sec = s->ms[k] / 1e3;
        if (sec > 0 && is_compute(k)) {
            g->tflops_pct[k] = 100.0 * s->flops[k] / sec / 1e12 / c->bf16_tflops;
            g->gbps_pct[k] = 100.0 * s->bytes[k] / sec / 1e9 / c->copy_gbps;
        } else if (sec > 0 && (k == SC_ALL_REDUCE || k == SC_PP_SEND) && (c->allreduce_gbps > 0 || c->p2p_gbps > 0)) {
            double roof = k == SC_ALL_REDUCE ? c->allreduce_gbps : c->p2p_gbps;
            if (roof > 0) g->gbps_pct[k] = 100.0 * s->bytes[k] / sec / 1e9 / roof;
        }
    }
    double host = g->share[SC_HOST_GAP] + g->share[SC_SCHEDULING];
    double comm = g->share[SC_ALL_REDUCE] + g->share[SC_ALL_TO_ALL] + g->share[SC_PP_SEND];
    double bubble = g->share[SC_PP_WAIT];
    int dom = SC_DENSE_GEMM;
    for (int k = 0; k <= SC_SAMPLE; k++)
        if (g->ms[k] > g->ms[dom]) dom = k;
    double compute = 0;
    for (int k = 0; k <= SC_SAMPLE; k++) compute += g->share[k];

    char over[64] = "";
    if (d->window_s > 0) snprintf(over, sizeof over, " in %.1f s", d->window_s);
    EVID("a step takes %.2f ms (%ld steps%s, %.1f tokens/s): compute %.0f%%, communication %.0f%%, pipeline wait "
         "%.0f%%, host %.0f%%", g->step_ms, d->steps, over, g->tok_per_s, 100 * compute, 100 * comm, 100 * bubble,
         100 * host);
    EVID("%s takes %.0f%% of the step at %.1f%% of the %s roof (%.4g TFLOP/s) and %.1f%% of copy bandwidth (%.0f GB/s)",
         step_cat_title(dom), 100 * g->share[dom], g->tflops_pct[dom], c->gpu ? "BF16 tensor" : "float32 FMA",
         c->bf16_tflops, g->gbps_pct[dom], c->copy_gbps);
    if (c->busy[0])
        EVID("the roofs were measured while the machine was busy (%s)%s%s: they may be low and the percentages of them "
             "high; `moeserve calibrate` on a quiet machine measures them again",
             c->busy, c->when[0] ? ", at " : "", c->when);
    if (d->gpu && d->power_limit_w > 0)
        EVID("the GPU draws %.0f W of %.0f W, SM clock %d of %d MHz", d->power_w, d->power_limit_w, d->sm_clock_mhz,
             d->sm_clock_max_mhz);
    if (d->kv_blocks_total > 0)
        EVID("KV cache %.0f%% used (%d of %d blocks), %d running, %d waiting, %ld preemptions", 100.0 * d->kv_blocks_used /
             d->kv_blocks_total, d->kv_blocks_used, d->kv_blocks_total, d->running, d->waiting, d->preemptions);
    if (d->spec_k > 0 && d->spec_chains > 0) /* a step's tokens per sequence: the acceptance length */
        EVID("speculative decoding: %d drafts a step, %.1f%% of %ld drafts accepted, acceptance length %.2f tokens a "
             "verified chain", d->spec_k, 100.0 * d->spec_accepted / (d->spec_drafts > 0 ? d->spec_drafts : 1),
             d->spec_drafts, 1.0 + (double)d->spec_accepted / d->spec_chains);

    /* 1. the batch is held down by the KV cache */
    double kv_used = d->kv_blocks_total ? (double)d->kv_blocks_used / d->kv_blocks_total : 0;
    if (d->waiting > 0 && d->running < d->max_running && (kv_used >= 0.9 || d->preemptions > 0)) {
        g->verdict = V_KV_CAPACITY;
        EVID("%d requests wait while %d of %d batch slots run: the KV cache is full (%.0f%%)", d->waiting, d->running,
             d->max_running, 100 * kv_used);
        ADV("give the KV cache more room: --kv-cache-dtype fp8, a higher --kv-fraction, a lower --max-model-len");
        ADV("or more %s for the cache: raise --tp (MLA keeps the latent cache on every TP rank: prefer --pp for MLA "
            "models)",
            d->gpu ? "GPUs" : "ranks");
        return;
    }
    /* 2. what is not compute: pipeline wait, communication, the host */
    double top = bubble;
    Verdict v = V_BUBBLE;
    if (comm > top) top = comm, v = V_COMMUNICATION;
    if (host > top) top = host, v = V_HOST;
    /* it decides when it is a quarter of the step and outweighs every compute category alone */
    if (top >= 0.25 && top >= g->share[dom]) {
        g->verdict = v;
        if (v == V_BUBBLE) {
            EVID("stages wait for each other %.0f%% of the step (%d stages, %d micro-batches in flight)", 100 * bubble, d->pp,
                 d->microbatches);
            if (d->microbatches < 2 * d->pp) ADV("raise --pp-microbatches (now %d) so that every stage has work", d->microbatches);
            ADV("or trade pipeline stages for tensor parallelism (e.g. --tp %d --pp %d)", d->tp * 2, d->pp > 1 ? d->pp / 2 : 1);
        } else if (v == V_COMMUNICATION) {
            EVID("collectives take %.0f%% of the step (all-reduce %.0f%%, all-to-all %.0f%%, pipeline transfers %.0f%%)%s",
                 100 * comm, 100 * g->share[SC_ALL_REDUCE], 100 * g->share[SC_ALL_TO_ALL], 100 * g->share[SC_PP_SEND],
                 c->allreduce_gbps > 0 ? "" : " (no calibrated link bandwidth)");
            if (c->allreduce_gbps > 0) EVID("the all-reduce reaches %.0f%% of the calibrated %.1f GB/s", g->gbps_pct[SC_ALL_REDUCE], c->allreduce_gbps);
            if (d->gpu)
                ADV("fewer ranks per collective: lower --tp (e.g. --tp %d --pp %d keeps the GPU count), or keep tensor "
                    "parallelism inside one NVLink domain",
                    d->tp > 1 ? d->tp / 2 : 1, d->pp * 2);
            else /* CPU ranks talk through MPI: shared memory on one host, the network between hosts */
                ADV("fewer ranks per collective: lower --tp (e.g. --tp %d --pp %d keeps the rank count), or keep the "
                    "tensor-parallel ranks on one host",
                    d->tp > 1 ? d->tp / 2 : 1, d->pp * 2);
            ADV("larger batches amortise each collective's latency: raise --max-running-requests");
        } else {
            EVID("the device waits on the host %.0f%% of the step (host gap %.2f ms, scheduling %.2f ms)", 100 * host,
                 g->ms[SC_HOST_GAP], g->ms[SC_SCHEDULING]);
            if (d->gpu && !d->graphs) ADV("enable CUDA graphs (drop --disable-cuda-graph): decode steps replay without launches");
            ADV("give each step more work: raise --max-running-requests and --max-batch-tokens");
            ADV("run several decode steps per scheduling round: --num-continuous-decode-steps 4");
        }
        return;
    }
    /* 3. compute: which roof is the dominant op near? */
    double fl = s->flops[dom], by = s->bytes[dom];
    double ai = by > 0 ? fl / by : 1e9, ridge = c->bf16_tflops * 1e12 / (c->copy_gbps * 1e9);
    if (ai >= ridge) {
        EVID("%s does %.1f FLOP per byte, above the ridge point %.1f: compute side", step_cat_title(dom), ai, ridge);
        if (g->tflops_pct[dom] >= 50) {
            g->verdict = V_COMPUTE;
            if (d->gpu)
                ADV("the tensor roof is near: more GPUs (raise --tp or --ep) or a lower-precision path; trading "
                    "--pp for --tp will not help");
            else
                ADV("the FMA roof is near: more cores (--threads, or --tp / --ep ranks on cores of their own); trading "
                    "--pp for --tp will not help");
        } else {
            g->verdict = V_UNDER_TUNED;
            advise_kernel(g, d, dom, g->tflops_pct[dom], "compute");
        }
    } else {
        EVID("%s does %.1f FLOP per byte, below the ridge point %.1f: memory side", step_cat_title(dom), ai, ridge);
        if (g->gbps_pct[dom] >= 50) {
            g->verdict = V_MEMORY;
            ADV("weights stream near the bandwidth roof: raise the batch (--max-running-requests) so each read serves "
                "more tokens, or split the bytes over more %s",
                d->gpu ? "GPUs" : "ranks (on hosts or sockets of their own)");
        } else {
            g->verdict = V_UNDER_TUNED;
            advise_kernel(g, d, dom, g->gbps_pct[dom], "bandwidth");
        }
    }
    if (d->gpu && !d->graphs) ADV("enable CUDA graphs (drop --disable-cuda-graph)");
}

void diagnosis_note(Diagnosis *g, const char *evidence, const char *advice)
{
    if (evidence && *evidence) { /* first: it qualifies every line after it */
        int n = g->n_evidence < DIAG_MAX_LINES ? g->n_evidence : DIAG_MAX_LINES - 1;
        memmove(g->evidence[1], g->evidence[0], (size_t)n * sizeof g->evidence[0]);
        snprintf(g->evidence[0], sizeof g->evidence[0], "%s", evidence);
        g->n_evidence = n + 1;
    }
    if (advice && *advice) ADV("%s", advice);
}

json_t *diagnosis_json(const Diagnosis *g, const Deployment *d, const Ceilings *c)
{
    json_t *o = json_object(), *ev = json_array(), *ad = json_array(), *br = json_object();
    json_object_set_new(o, "verdict", json_string(verdict_name(g->verdict)));
    for (int i = 0; i < g->n_evidence; i++) json_array_append_new(ev, json_string(g->evidence[i]));
    for (int i = 0; i < g->n_advice; i++) json_array_append_new(ad, json_string(g->advice[i]));
    for (int k = 0; k < SC_COUNT; k++)
        json_object_set_new(br, step_cat_name(k), json_pack("{s:f, s:f, s:f, s:f}", "ms", g->ms[k], "share", g->share[k],
                                                            "tflops_pct", g->tflops_pct[k], "gbps_pct", g->gbps_pct[k]));
    json_object_set_new(o, "evidence", ev);
    json_object_set_new(o, "breakdown", br);
    json_object_set_new(o, "advice", ad);
    json_object_set_new(o, "step_ms", json_real(g->step_ms));
    json_object_set_new(o, "tokens_per_s", json_real(g->tok_per_s));
    json_object_set_new(o, "window", json_pack("{s:f, s:I, s:I, s:I, s:f, s:f}", "seconds", d->window_s, "steps",
                                               (json_int_t)d->steps, "profiled_steps", (json_int_t)g->profiled_steps,
                                               "tokens", (json_int_t)d->tokens, "wall_ms", d->steps_wall_ms, "idle_s",
                                               d->idle_s));
    json_object_set_new(o, "deployment",
                        json_pack("{s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:f, s:f}", "tp", d->tp,
                                  "pp", d->pp, "ep", d->ep, "dp", d->dp > 1 ? d->dp : 1, "microbatches", d->microbatches, "gpu", d->gpu, "cuda_graphs",
                                  d->graphs, "running", d->running, "waiting", d->waiting, "max_running", d->max_running,
                                  "kv_blocks_total", d->kv_blocks_total, "kv_blocks_used", d->kv_blocks_used, "preemptions",
                                  (json_int_t)d->preemptions, "steps", (json_int_t)d->steps, "steps_total",
                                  (json_int_t)d->steps_total, "power_w", d->power_w,
                                  "power_limit_w", d->power_limit_w));
    if (d->spec_k > 0)
        json_object_set_new(json_object_get(o, "deployment"), "speculative",
                            json_pack("{s:i, s:I, s:I, s:I, s:f}", "num_steps", d->spec_k, "chains", (json_int_t)d->spec_chains,
                                      "draft_tokens", (json_int_t)d->spec_drafts, "accepted_tokens",
                                      (json_int_t)d->spec_accepted, "accept_length",
                                      d->spec_chains ? 1.0 + (double)d->spec_accepted / d->spec_chains : 0.0));
    if (c) json_object_set_new(o, "ceilings", ceilings_json(c));
    return o;
}

void diagnosis_print(FILE *f, const Diagnosis *g, const Deployment *d, const Ceilings *c)
{
    fprintf(f, "layout: tp %d, pp %d, ep %d (%d micro-batches), %s%s\n", d->tp, d->pp, d->ep, d->microbatches,
            d->gpu ? "GPU" : "CPU", d->gpu ? (d->graphs ? ", CUDA graphs" : ", no CUDA graphs") : "");
    if (c->gpu) fprintf(f, "roofs: %.1f TFLOP/s BF16, copy %.0f GB/s\n\n", c->bf16_tflops, c->copy_gbps);
    else fprintf(f, "roofs: %.1f GFLOP/s float32, copy %.1f GB/s\n\n", c->bf16_tflops * 1e3, c->copy_gbps);
    fprintf(f, "%-24s %10s %7s %10s %10s\n", "category", "ms/step", "share", "% FLOP", "% bytes");
    for (int k = 0; k < SC_COUNT; k++) {
        if (g->ms[k] <= 0) continue;
        fprintf(f, "%-24s %10.3f %6.1f%% %9.1f%% %9.1f%%\n", step_cat_title(k), g->ms[k], 100 * g->share[k], g->tflops_pct[k],
                g->gbps_pct[k]);
    }
    fprintf(f, "\nverdict: %s\n", verdict_name(g->verdict));
    for (int i = 0; i < g->n_evidence; i++) fprintf(f, "  - %s\n", g->evidence[i]);
    fprintf(f, "advice:\n");
    for (int i = 0; i < g->n_advice; i++) fprintf(f, "  - %s\n", g->advice[i]);
}

void diagnosis_prometheus(const Diagnosis *g, char *buf, size_t n)
{
    size_t o = strlen(buf);
#define P(...) do { if (o < n) o += snprintf(buf + o, n - o, __VA_ARGS__); } while (0)
    P("# HELP moeserve_step_share Share of a step's time by category (diagnosis).\n# TYPE moeserve_step_share gauge\n");
    for (int k = 0; k < SC_COUNT; k++) P("moeserve_step_share{category=\"%s\"} %.6f\n", step_cat_name(k), g->share[k]);
    P("# HELP moeserve_step_ms Mean milliseconds of a step by category.\n# TYPE moeserve_step_ms gauge\n");
    for (int k = 0; k < SC_COUNT; k++) P("moeserve_step_ms{category=\"%s\"} %.6f\n", step_cat_name(k), g->ms[k]);
    P("# HELP moeserve_verdict The diagnosis (1 for the current verdict).\n# TYPE moeserve_verdict gauge\n");
    for (int v = 0; v < V_COUNT; v++) P("moeserve_verdict{verdict=\"%s\"} %d\n", verdict_name(v), g->verdict == (Verdict)v);
    P("# HELP moeserve_diagnosis_window_seconds Seconds of recent steps the diagnosis gauges cover.\n"
      "# TYPE moeserve_diagnosis_window_seconds gauge\nmoeserve_diagnosis_window_seconds %.3f\n", g->window_s);
    P("# HELP moeserve_diagnosis_idle_seconds Seconds since the last step while no request is in the engine (the "
      "diagnosis gauges then hold the last load's figures); 0 while busy.\n"
      "# TYPE moeserve_diagnosis_idle_seconds gauge\nmoeserve_diagnosis_idle_seconds %.3f\n", g->idle_s);
#undef P
}
