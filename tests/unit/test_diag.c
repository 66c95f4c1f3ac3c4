/* diag (issue #9): the verdict as a function of the breakdown, the JSON shape, and end to end
 * on the CPU: each injected fault gets its verdict (`moeserve diagnose --model`, under mpirun
 * where the layout has several ranks), the sweep writes its report and charts, a server answers
 * GET /v1/diagnosis and exports the gauges, `calibrate --json` gives the ceilings. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/svg.h"
#include "base/util.h"
#include "diag/beside.h"
#include "diag/placement.h"
#include "diag/report.h"
#include "diag/verdict.h"
#include "server_harness.h"
#include "test.h"

static Ceilings roofs(void)
{
    Ceilings c = {.gpu = 1, .copy_gbps = 4000, .read_gbps = 4400, .bf16_tflops = 800, .allreduce_gbps = 300, .p2p_gbps = 300};
    return c;
}

/* one profiled step of total ms split as given; flops and bytes set for the dominant op */
static void make(ProfSum *s, Deployment *d, const double *ms, double flops, double bytes, int dom)
{
    memset(s, 0, sizeof *s);
    memset(d, 0, sizeof *d);
    s->steps = 1;
    double total = 0;
    for (int k = 0; k < SC_COUNT; k++) {
        s->ms[k] = ms[k];
        total += ms[k];
    }
    s->flops[dom] = flops;
    s->bytes[dom] = bytes;
    *d = (Deployment){.tp = 1, .pp = 1, .ep = 1, .microbatches = 1, .gpu = 1, .graphs = 1, .max_running = 64, .steps = 1,
                      .steps_wall_ms = total, .tokens = 64, .kv_blocks_total = 100, .kv_blocks_used = 10};
}

/* The measured breakdown beside the predicted one: a category is named when the two differ by more
 * than 25% of the larger and the larger is at least 5% of its step; largest difference first. */
TEST(diag_beside_names_the_categories_apart)
{
    Diagnosis g = {.step_ms = 10};
    Beside b = {.step_ms = 9};
    g.ms[SC_DENSE_GEMM] = 4.0, b.ms[SC_DENSE_GEMM] = 3.5;   /* 12.5% apart: agree */
    g.ms[SC_MOE_GEMM] = 3.0, b.ms[SC_MOE_GEMM] = 1.5;       /* 50%: named */
    g.ms[SC_ATTENTION] = 1.0, b.ms[SC_ATTENTION] = 3.0;     /* 67%, the larger difference: named first */
    g.ms[SC_SAMPLE] = 0.2, b.ms[SC_SAMPLE] = 0.01;      /* 95% apart but 2% of a step: noise */
    g.ms[SC_HOST_GAP] = 0, b.ms[SC_HOST_GAP] = 0.9;         /* predicted only, 9% of a step: named */
    beside_compare(&g, &b);
    ASSERT(b.n_off == 3, "%d categories named", b.n_off);
    EXPECT_EQ_INT(b.off[0], SC_ATTENTION);
    EXPECT_EQ_INT(b.off[1], SC_MOE_GEMM);
    EXPECT_EQ_INT(b.off[2], SC_HOST_GAP);
    json_t *o = beside_json(&g, &b);
    json_t *off = json_object_get(o, "disagree");
    EXPECT(json_array_size(off) == 3 && !strcmp(json_string_value(json_array_get(off, 0)), "attention"), "disagree");
    EXPECT(fabs(json_number_value(json_object_get(json_object_get(json_object_get(o, "breakdown"), "moe_gemm"),
                                                  "predicted_ms")) - 1.5) < 1e-9, "breakdown.moe_gemm.predicted_ms");
    json_decref(o);
    for (int c = 0; c < SC_COUNT; c++) b.ms[c] = g.ms[c];
    beside_compare(&g, &b);
    EXPECT_EQ_INT(b.n_off, 0);
}

TEST(diag_verdict_rules)
{
    Ceilings c = roofs();
    ProfSum s;
    Deployment d;
    Diagnosis g;
    double ms[SC_COUNT];
    /* MoE GEMM dominant, 10 ms, at 90% of the BF16 roof: 7.2 PFLOP in 10 ms; few bytes */
    memset(ms, 0, sizeof ms);
    ms[SC_MOE_GEMM] = 10, ms[SC_NORM] = 1;
    make(&s, &d, ms, 0.9 * 800e12 * 0.010, 1e9, SC_MOE_GEMM);
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_COMPUTE, "%s", verdict_name(g.verdict));
    EXPECT(fabs(g.tflops_pct[SC_MOE_GEMM] - 90) < 0.1, "%g", g.tflops_pct[SC_MOE_GEMM]);
    EXPECT(fabs(g.share[SC_MOE_GEMM] - 10.0 / 11) < 1e-9);
    /* the same time at 80% of the bandwidth and 1 FLOP per byte: memory-bound */
    make(&s, &d, ms, 0.8 * 4000e9 * 0.010, 0.8 * 4000e9 * 0.010, SC_MOE_GEMM);
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_MEMORY, "%s", verdict_name(g.verdict));
    /* at 10% of the bandwidth, below the ridge: under-tuned */
    make(&s, &d, ms, 0.1 * 4000e9 * 0.010, 0.1 * 4000e9 * 0.010, SC_MOE_GEMM);
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_UNDER_TUNED, "%s", verdict_name(g.verdict));
    EXPECT(g.n_advice > 0 && strstr(g.advice[0], "moeserve tune"), "%s", g.advice[0]);
    /* half the step in all-reduces */
    memset(ms, 0, sizeof ms);
    ms[SC_MOE_GEMM] = 4, ms[SC_ALL_REDUCE] = 6;
    make(&s, &d, ms, 1e12, 1e9, SC_MOE_GEMM);
    d.tp = 8;
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_COMMUNICATION, "%s", verdict_name(g.verdict));
    EXPECT(strstr(g.advice[0], "--tp 4"), "%s", g.advice[0]);
    /* stages waiting */
    memset(ms, 0, sizeof ms);
    ms[SC_DENSE_GEMM] = 4, ms[SC_PP_WAIT] = 6;
    make(&s, &d, ms, 1e12, 1e9, SC_DENSE_GEMM);
    d.pp = 2;
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_BUBBLE, "%s", verdict_name(g.verdict));
    EXPECT(strstr(g.advice[0], "--pp-microbatches"), "%s", g.advice[0]);
    /* the host: every step's wall time far above the ops' (graphs off) */
    memset(ms, 0, sizeof ms);
    ms[SC_MOE_GEMM] = 2;
    make(&s, &d, ms, 1e12, 1e9, SC_MOE_GEMM);
    d.steps_wall_ms = 10; /* graphs: every step's wall time against the profiled ops */
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_HOST, "%s", verdict_name(g.verdict));
    EXPECT(fabs(g.ms[SC_HOST_GAP] - 8) < 1e-9, "%g", g.ms[SC_HOST_GAP]);
    s.ms[SC_HOST_GAP] = 8; /* no graphs: the profiled steps' own gaps */
    d.graphs = 0;
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_HOST, "%s", verdict_name(g.verdict));
    EXPECT(fabs(g.ms[SC_HOST_GAP] - 8) < 1e-9, "%g", g.ms[SC_HOST_GAP]);
    EXPECT(strstr(g.advice[0], "CUDA graphs"), "%s", g.advice[0]);
    /* requests wait while the KV cache is full and batch slots are free */
    make(&s, &d, ms, 1e12, 1e9, SC_MOE_GEMM);
    d.waiting = 5, d.running = 10, d.kv_blocks_used = 98;
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_KV_CAPACITY, "%s", verdict_name(g.verdict));
    /* nothing profiled */
    memset(&s, 0, sizeof s);
    diagnose(&s, &c, &d, &g);
    EXPECT(g.verdict == V_NONE);
}

TEST(diag_json_shape)
{
    Ceilings c = roofs();
    ProfSum s;
    Deployment d;
    Diagnosis g;
    double ms[SC_COUNT] = {0};
    ms[SC_MOE_GEMM] = 3, ms[SC_ATTENTION] = 1;
    make(&s, &d, ms, 1e12, 1e9, SC_MOE_GEMM);
    diagnose(&s, &c, &d, &g);
    json_t *o = diagnosis_json(&g, &d, &c);
    EXPECT(json_is_string(json_object_get(o, "verdict")));
    EXPECT(json_array_size(json_object_get(o, "evidence")) > 0);
    EXPECT(json_array_size(json_object_get(o, "advice")) > 0);
    json_t *br = json_object_get(o, "breakdown");
    EXPECT(json_object_size(br) == SC_COUNT);
    const char *keys[] = {"ms", "share", "tflops_pct", "gbps_pct"};
    for (int k = 0; k < SC_COUNT; k++) {
        json_t *e = json_object_get(br, step_cat_name(k));
        for (int j = 0; j < 4; j++) EXPECT(json_is_number(json_object_get(e, keys[j])), "%s.%s", step_cat_name(k), keys[j]);
    }
    EXPECT(fabs(json_number_value(json_object_get(json_object_get(br, "moe_gemm"), "share")) - 0.75) < 1e-9);
    char prom[16384] = "";
    diagnosis_prometheus(&g, prom, sizeof prom);
    EXPECT(strstr(prom, "moeserve_step_share{category=\"moe_gemm\"} 0.75"), "%s", prom);
    EXPECT(strstr(prom, "moeserve_verdict{verdict=\"") != NULL);
    EXPECT(strstr(prom, "moeserve_diagnosis_window_seconds ") && strstr(prom, "moeserve_diagnosis_idle_seconds "), "%s", prom);
    EXPECT(json_is_object(json_object_get(o, "window")) && json_is_integer(jget(o, "deployment.steps_total")));
    json_decref(o);
    int tp, pp, ep;
    EXPECT(report_parse_layout("tp2pp4", &tp, &pp, &ep) == 0 && tp == 2 && pp == 4 && ep == 1);
    EXPECT(report_parse_layout("ep8", &tp, &pp, &ep) == 0 && tp == 8 && ep == 8);
    EXPECT(report_parse_layout("tp", &tp, &pp, &ep) < 0 && report_parse_layout("xx2", &tp, &pp, &ep) < 0);
}

/* On a CPU run the advice speaks of what the CPU backend has: no `moeserve tune` (the GPU's NVFP4
 * tiles), no NVLink, no CUDA graphs, no GPUs to add, whichever verdict it reaches. */
TEST(diag_advice_fits_cpu)
{
    Ceilings c = {.gpu = 0, .copy_gbps = 20, .read_gbps = 25, .bf16_tflops = 0.05, .allreduce_gbps = 5, .p2p_gbps = 5};
    ProfSum s;
    Deployment d;
    Diagnosis g;
    struct {
        const char *what;
        int dom;
        double ms[SC_COUNT], flops, bytes;
        Verdict want;
    } cases[] = {
        /* dense GEMM at 90% of 50 GFLOP/s in 10 ms, few bytes */
        {"compute", SC_DENSE_GEMM, {[SC_DENSE_GEMM] = 10, [SC_NORM] = 1}, 0.9 * 0.05e12 * 0.010, 1e6, V_COMPUTE},
        {"memory", SC_MOE_GEMM, {[SC_MOE_GEMM] = 10, [SC_NORM] = 1}, 0.8 * 20e9 * 0.010, 0.8 * 20e9 * 0.010, V_MEMORY},
        {"slow MoE GEMM", SC_MOE_GEMM, {[SC_MOE_GEMM] = 10}, 0.05 * 20e9 * 0.010, 0.05 * 20e9 * 0.010, V_UNDER_TUNED},
        {"slow dense GEMM", SC_DENSE_GEMM, {[SC_DENSE_GEMM] = 10}, 0.05 * 0.05e12 * 0.010, 1e6, V_UNDER_TUNED},
        {"all-reduces", SC_MOE_GEMM, {[SC_MOE_GEMM] = 4, [SC_ALL_REDUCE] = 6}, 1e9, 1e8, V_COMMUNICATION},
        {"bubble", SC_DENSE_GEMM, {[SC_DENSE_GEMM] = 4, [SC_PP_WAIT] = 6}, 1e9, 1e8, V_BUBBLE},
        {"host", SC_MOE_GEMM, {[SC_MOE_GEMM] = 2, [SC_HOST_GAP] = 8}, 1e9, 1e8, V_HOST},
        {"KV cache", SC_MOE_GEMM, {[SC_MOE_GEMM] = 2}, 1e9, 1e8, V_KV_CAPACITY},
    };
    const char *gpu_only[] = {"tune", "NVLink", "CUDA", "GPU"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        make(&s, &d, cases[i].ms, cases[i].flops, cases[i].bytes, cases[i].dom);
        d.gpu = d.graphs = 0;
        d.tp = 2, d.pp = 2;
        if (cases[i].want == V_KV_CAPACITY) d.waiting = 5, d.running = 10, d.kv_blocks_used = 98;
        diagnose(&s, &c, &d, &g);
        EXPECT(g.verdict == cases[i].want, "%s: %s", cases[i].what, verdict_name(g.verdict));
        EXPECT(g.n_advice > 0, "%s: no advice", cases[i].what);
        json_t *o = diagnosis_json(&g, &d, &c);
        char *text = json_dumps(json_object_get(o, "advice"), 0);
        for (size_t w = 0; w < sizeof gpu_only / sizeof gpu_only[0]; w++)
            EXPECT(!strstr(text, gpu_only[w]), "%s on the CPU: \"%s\" in the advice %s", cases[i].what, gpu_only[w],
                   text);
        free(text);
        json_decref(o);
        /* the same breakdown on a GPU still points at the GPU's knobs */
        if (i == 2 || i == 4) {
            d.gpu = d.graphs = 1;
            c.gpu = 1;
            diagnose(&s, &c, &d, &g);
            EXPECT(strstr(g.advice[0], i == 2 ? "moeserve tune" : "NVLink"), "%s on a GPU: %s", cases[i].what,
                   g.advice[0]);
            c.gpu = 0;
        }
    }
    /* roofs measured on a busy machine: said, with what showed it */
    make(&s, &d, cases[0].ms, cases[0].flops, cases[0].bytes, cases[0].dom);
    d.gpu = 0;
    snprintf(c.busy, sizeof c.busy, "its 2 threads ran 50%% of the time measured");
    diagnose(&s, &c, &d, &g);
    int said = 0;
    for (int k = 0; k < g.n_evidence; k++) said |= strstr(g.evidence[k], "busy (its 2 threads ran 50%") != NULL;
    EXPECT(said, "no evidence line says the roofs were measured on a busy machine");
}

static RankPlace rank_on(const char *host, int threads, int first_core, int n_cores)
{
    RankPlace r;
    memset(&r, 0, sizeof r);
    snprintf(r.host, sizeof r.host, "%s", host);
    r.threads = threads;
    r.n_cpus = r.n_cores = n_cores;
    for (int i = 0; i < n_cores; i++) r.core[i] = first_core + i;
    snprintf(r.cpus, sizeof r.cpus, "%d-%d", first_core, first_core + n_cores - 1);
    return r;
}

/* Ranks share cores when two of one host may run on a common core (hyperthreads of one core
 * count as that core), or when a host's ranks run more threads than their CPUs. */
TEST(diag_placement_judged)
{
    Placement p;
    RankPlace r[4];
    r[0] = rank_on("a", 2, 0, 2), r[1] = rank_on("a", 2, 2, 2);
    placement_judge(r, 2, 1, &p);
    EXPECT(!p.shares_cores && p.hosts == 1, "disjoint cores: %s", p.why);
    r[1] = rank_on("a", 2, 1, 2); /* cores 1-2: core 1 in both */
    placement_judge(r, 2, 1, &p);
    EXPECT(p.shares_cores && strstr(p.why, "ranks 0 and 1"), "overlapping sets: %s", p.why);
    r[1] = rank_on("b", 2, 0, 2); /* the same core numbers on another host */
    placement_judge(r, 2, 1, &p);
    EXPECT(!p.shares_cores && p.hosts == 2, "two hosts: %s", p.why);
    r[1] = rank_on("a", 3, 2, 2); /* own cores, but 2 + 3 threads on 4 CPUs */
    placement_judge(r, 2, 1, &p);
    EXPECT(p.shares_cores && strstr(p.why, "4 CPUs"), "threads past the CPUs: %s", p.why);
    r[0] = rank_on("a", 4, 0, 2); /* one rank alone with more threads than its CPUs */
    placement_judge(r, 1, 1, &p);
    EXPECT(p.shares_cores, "one rank, 4 threads on 2 CPUs: %s", p.why);
    /* hyperthreads: logical CPUs 0 and 8 of one physical core, a rank on each */
    r[0] = rank_on("a", 1, 7, 1), r[1] = rank_on("a", 1, 7, 1);
    r[0].n_cpus = r[1].n_cpus = 1;
    snprintf(r[1].cpus, sizeof r[1].cpus, "8");
    placement_judge(r, 2, 1, &p);
    EXPECT(p.shares_cores, "sibling hyperthreads: %s", p.why);
    /* GPU ranks are not judged by their host threads */
    placement_judge(r, 2, 0, &p);
    EXPECT(!p.shares_cores && !p.cpu);
    /* this process's own record: at least one CPU and core, a host name */
    placement_self(&r[0], 1);
    EXPECT(r[0].n_cpus >= 1 && r[0].n_cores >= 1 && r[0].n_cores <= r[0].n_cpus && r[0].host[0], "%d CPUs, %d cores",
           r[0].n_cpus, r[0].n_cores);
}

/* a diagnosis as a sweep run holds it: the breakdown (ms by category; achieved fractions of the
 * roofs for the compute ones), the ceilings, the throughput and the placement */
static json_t *fake_diag(const double *ms, double peak_tflops, double copy_gbps, double tok_s, int shares)
{
    json_t *br = json_object();
    double total = 0;
    for (int k = 0; k < SC_COUNT; k++) total += ms[k];
    for (int k = 0; k < SC_COUNT; k++) /* compute categories: 10% of the FLOP roof, 40% of the bytes one */
        json_object_set_new(br, step_cat_name(k),
                            json_pack("{s:f, s:f, s:f, s:f}", "ms", ms[k], "share", total > 0 ? ms[k] / total : 0,
                                      "tflops_pct", ms[k] > 0 && k <= SC_SAMPLE ? 10.0 + k : 0.0, "gbps_pct",
                                      ms[k] > 0 && k <= SC_SAMPLE ? 40.0 - k : 0.0));
    return json_pack("{s:s, s:o, s:f, s:f, s:{s:f, s:f}, s:{s:b, s:s}}", "verdict", "compute-bound", "breakdown", br,
                     "step_ms", total, "tokens_per_s", tok_s, "ceilings", "bf16_tflops", peak_tflops, "copy_gbps",
                     copy_gbps, "placement", "shares_cores", shares, "why",
                     shares ? "ranks 0 and 1 on host h may run on the same cores" : "own cores");
}

/* When a run's ranks share cores, the sweep reads no scaling from it and says why. */
TEST(diag_scaling_not_meaningful_when_cores_shared)
{
    double ms[SC_COUNT] = {[SC_DENSE_GEMM] = 2, [SC_MOE_GEMM] = 3, [SC_ALL_REDUCE] = 1};
    SweepRun r[3] = {{.name = "tp1", .tp = 1, .pp = 1, .ep = 1, .world = 1},
                     {.name = "tp2", .tp = 2, .pp = 1, .ep = 1, .world = 2},
                     {.name = "pp2", .tp = 1, .pp = 2, .ep = 1, .world = 2}};
    for (int i = 0; i < 3; i++) r[i].diag = fake_diag(ms, 0.05, 20, 100 + 10 * i, 0);
    char buf[4096];
    EXPECT(report_scaling(r, 3, buf, sizeof buf) == 1 && strstr(buf, "tp2 (more tensor parallelism) gives"), "%s", buf);
    json_t *pl = json_object_get(r[1].diag, "placement");
    json_object_set_new(pl, "shares_cores", json_true());
    json_object_set_new(pl, "why", json_string("ranks 0 and 1 on host h may run on the same cores"));
    EXPECT(report_scaling(r, 3, buf, sizeof buf) == 0, "%s", buf);
    EXPECT(strstr(buf, "not meaningful") && strstr(buf, "tp2 (ranks 0 and 1 on host h"), "%s", buf);
    EXPECT(!strstr(buf, "gives") && !strstr(buf, "Fastest") && !strstr(buf, "x throughput"), "a scaling verdict: %s",
           buf);
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/shared-sweep", test_tmpdir());
    ASSERT(report_write(r, 3, dir, "shared") == 0);
    snprintf(path, sizeof path, "%s/report.md", dir);
    char *md = file_read_all(path, NULL);
    EXPECT(md && strstr(md, "## Scaling\n\nThe sweep is not meaningful here"), "%s", md ? md : path);
    free(md);
    for (int i = 0; i < 3; i++) json_decref(r[i].diag);
}

/* ---- the charts, read back ---- */

typedef struct {
    char text[256];
    SvgBox box;
} SvgLabel;

/* an attribute's value in the tag [p, end), or NULL */
static const char *svg_attr(const char *p, const char *end, const char *name, char *out, size_t n)
{
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *a = strstr(p, key);
    if (!a || a >= end) return NULL;
    a += strlen(key);
    const char *q = strchr(a, '"');
    if (!q || q > end) return NULL;
    snprintf(out, n, "%.*s", (int)(q - a), a);
    return out;
}

/* Every <text> of an SVG with the box it covers (base/svg.h's estimate; a title turned a
 * quarter anticlockwise covers the box turned with it), and the picture's size (the viewBox's,
 * else the width and height). The font size and anchor a <text> lacks are the root's, or 16 px
 * and start as SVG says. Returns how many, or -1 when a <text> lacks its position. */
static int svg_labels(const char *svg, SvgLabel *out, int max, double *vw, double *vh)
{
    *vw = *vh = -1;
    char v[128], root_px[32] = "16";
    const char *root = strstr(svg, "<svg");
    const char *root_end = root ? strchr(root, '>') : NULL;
    if (root_end && svg_attr(root, root_end, "viewBox", v, sizeof v))
        sscanf(v, "0 0 %lf %lf", vw, vh);
    else if (root_end && svg_attr(root, root_end, "width", v, sizeof v) && (*vw = atof(v)) > 0 &&
             svg_attr(root, root_end, "height", v, sizeof v))
        *vh = atof(v);
    if (root_end) svg_attr(root, root_end, "font-size", root_px, sizeof root_px);
    int n = 0;
    for (const char *p = strstr(svg, "<text"); p && n < max; p = strstr(p + 1, "<text")) {
        const char *end = strchr(p, '>'), *close = end ? strstr(end, "</text>") : NULL;
        if (!close) return -1;
        char xs[32], ys[32], fs[32], an[32], tr[96];
        if (!svg_attr(p, end, "x", xs, sizeof xs) || !svg_attr(p, end, "y", ys, sizeof ys)) return -1;
        if (!svg_attr(p, end, "font-size", fs, sizeof fs)) snprintf(fs, sizeof fs, "%s", root_px);
        if (!svg_attr(p, end, "text-anchor", an, sizeof an)) snprintf(an, sizeof an, "start");
        SvgLabel *l = &out[n++];
        snprintf(l->text, sizeof l->text, "%.*s", (int)(close - end - 1), end + 1);
        double x = atof(xs), y = atof(ys), px = atof(fs);
        SvgAnchor a = !strcmp(an, "middle") ? SVG_MIDDLE : !strcmp(an, "end") ? SVG_END : SVG_START;
        l->box = svg_text_box(l->text, x, y, px, a);
        if (svg_attr(p, end, "transform", tr, sizeof tr)) {
            double cx, cy;
            if (sscanf(tr, "rotate(-90 %lf %lf)", &cx, &cy) != 2) return -1;
            /* about (cx, cy): x' = cx + (y - cy), y' = cy - (x - cx) */
            SvgBox b = l->box;
            l->box = (SvgBox){cx + (b.y0 - cy), cy - (b.x1 - cx), cx + (b.y1 - cy), cy - (b.x0 - cx)};
        }
    }
    return n;
}

static int has_label(const SvgLabel *l, int n, const char *text)
{
    int k = 0;
    for (int i = 0; i < n; i++) k += !strcmp(l[i].text, text);
    return k;
}

/* The labels of one chart: titles present, none past the picture, no two overlapping; the
 * legend holds a category if and only if present[k]. */
static void check_chart(const char *path, const char *const *titles, int n_titles, const int *present, int n_cats)
{
    char *svg = file_read_all(path, NULL);
    ASSERT(svg, "%s", path);
    static SvgLabel l[1024];
    double vw, vh;
    int n = svg_labels(svg, l, 1024, &vw, &vh);
    ASSERT(n > 0 && vw > 0 && vh > 0, "%s: %d labels, viewBox %g x %g", path, n, vw, vh);
    for (int t = 0; t < n_titles; t++) EXPECT(has_label(l, n, titles[t]) == 1, "%s: the title \"%s\"", path, titles[t]);
    for (int k = 0; k < n_cats; k++)
        EXPECT(has_label(l, n, step_cat_title(k)) == present[k], "%s: legend entry \"%s\" %s", path, step_cat_title(k),
               present[k] ? "missing" : "for an absent category");
    for (int i = 0; i < n; i++) {
        const SvgBox *b = &l[i].box;
        EXPECT(b->x0 >= 0 && b->y0 >= 0 && b->x1 <= vw && b->y1 <= vh,
               "%s: \"%s\" [%.0f,%.0f]-[%.0f,%.0f] leaves the %g x %g picture", path, l[i].text, b->x0, b->y0, b->x1,
               b->y1, vw, vh);
        for (int j = 0; j < i; j++)
            EXPECT(!svg_overlap(&l[i].box, &l[j].box), "%s: \"%s\" overlaps \"%s\"", path, l[i].text, l[j].text);
    }
    free(svg);
}

/* diagnose's charts: axis titles with units, a legend of the categories present only, one roof a
 * layout (those of equal ceilings share one), labels that neither collide nor clip: a sweep of
 * three layouts, and one of sixteen with long names and every category. */
TEST(diag_charts_readable)
{
    double ms[3][SC_COUNT] = {{[SC_DENSE_GEMM] = 2, [SC_MOE_GEMM] = 3.5, [SC_ATTENTION] = 0.5, [SC_HOST_GAP] = 0.2},
                              {[SC_DENSE_GEMM] = 1, [SC_MOE_GEMM] = 2, [SC_ALL_REDUCE] = 1.5},
                              {[SC_DENSE_GEMM] = 1.1, [SC_MOE_GEMM] = 1.9, [SC_PP_WAIT] = 2.5, [SC_ATTENTION] = 0.3}};
    SweepRun r[16];
    memset(r, 0, sizeof r);
    const char *names[3] = {"tp1", "tp2", "pp2"};
    double peaks[3] = {800, 790, 800}, copies[3] = {4000, 3900, 4000}; /* pp2's roof is tp1's */
    for (int i = 0; i < 3; i++) {
        snprintf(r[i].name, sizeof r[i].name, "%s", names[i]);
        r[i].diag = fake_diag(ms[i], peaks[i], copies[i], 1000 * (i + 1), 0);
    }
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/charts", test_tmpdir());
    ASSERT(report_write(r, 3, dir, "charts") == 0);
    int bd[SC_COUNT] = {0}, rl[SC_COUNT] = {0};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < SC_COUNT; k++) {
            bd[k] |= ms[i][k] > 0;
            rl[k] |= ms[i][k] > 0 && k <= SC_SAMPLE;
        }
    const char *bt[] = {"Step time by category", "time per step (ms)", "layout"};
    snprintf(path, sizeof path, "%s/breakdown.svg", dir);
    check_chart(path, bt, 3, bd, SC_COUNT);
    const char *rt[] = {"arithmetic intensity (FLOP per byte)",
                        "achieved TFLOP/s",
                        "tp1",
                        "tp2",
                        "pp2",
                        "roof of tp1, pp2: 800 TFLOP/s, 4000 GB/s",
                        "roof of tp2: 790 TFLOP/s, 3900 GB/s"};
    snprintf(path, sizeof path, "%s/roofline.svg", dir);
    check_chart(path, rt, 7, rl, SC_COUNT);
    char *svg = file_read_all(path, NULL);
    int roofs = 0;
    for (const char *p = svg; (p = strstr(p, "<polyline")); p++) roofs++;
    EXPECT(roofs == 2, "%d roof lines, 2 expected (tp1 and pp2 share one)", roofs);
    free(svg);
    for (int i = 0; i < 3; i++) json_decref(r[i].diag);

    /* sixteen runs, long names, every category, each its own roof; a CPU's rates */
    double all[SC_COUNT];
    for (int k = 0; k < SC_COUNT; k++) all[k] = 0.05 + 0.01 * k;
    for (int i = 0; i < 16; i++) {
        snprintf(r[i].name, sizeof r[i].name, "tp%dpp%dep%d", 1 << (i % 4), 1 + i, 1 << (i / 4));
        all[SC_MOE_GEMM] = 0.1 * (i + 1) * (i + 1); /* step times over two orders of magnitude */
        r[i].diag = fake_diag(all, 0.05 + 0.001 * i, 20 + i, 50.0 * (i + 1), 0);
    }
    snprintf(dir, sizeof dir, "%s/charts16", test_tmpdir());
    ASSERT(report_write(r, 16, dir, "charts") == 0);
    int every[SC_COUNT], compute[SC_COUNT];
    for (int k = 0; k < SC_COUNT; k++) every[k] = 1, compute[k] = k <= SC_SAMPLE;
    snprintf(path, sizeof path, "%s/breakdown.svg", dir);
    check_chart(path, bt, 3, every, SC_COUNT);
    const char *rt16[] = {"arithmetic intensity (FLOP per byte)", "achieved GFLOP/s"};
    snprintf(path, sizeof path, "%s/roofline.svg", dir);
    check_chart(path, rt16, 2, compute, SC_COUNT);
    svg = file_read_all(path, NULL);
    roofs = 0;
    for (const char *p = svg; (p = strstr(p, "<polyline")); p++) roofs++;
    EXPECT(roofs == 16, "%d roof lines, one a layout expected", roofs);
    free(svg);
    for (int i = 0; i < 16; i++) json_decref(r[i].diag);
}

/* The verdict of a `diagnose --json` command (its logs sent to /dev/null): its stdout must be the
 * one JSON object and nothing else (a log line there, or inside the JSON, is a bug). The verdict
 * (static) or NULL (said on stderr unless quiet). */
static const char *verdict_of(const char *cmd, double *step_ms, int quiet)
{
    static char verdict[64];
    char *out = NULL;
    int rc = test_run(cmd, &out);
    json_error_t je;
    json_t *o = rc == 0 && out ? json_loads(out, 0, &je) : NULL;
    if (!o || !json_is_string(json_object_get(o, "verdict"))) {
        if (!quiet)
            fprintf(stderr, "    %s: exit %d: %s%s%s\n", cmd, rc, out ? out : "", o ? "" : "not one JSON object: ", o ? "" : je.text);
        json_decref(o);
        free(out);
        return NULL;
    }
    snprintf(verdict, sizeof verdict, "%s", json_string_value(json_object_get(o, "verdict")));
    if (step_ms) *step_ms = json_number_value(json_object_get(o, "step_ms"));
    json_decref(o);
    free(out);
    return verdict;
}

/* `moeserve diagnose --json` on the glm4moe fixture, started by launch ("" or mpirun ...) with
 * the test hook hook ("MOESERVE_TEST_...=VALUE", NULL for none) in its environment (and, under
 * mpirun, passed on to the ranks); returns the verdict (static) or NULL */
static const char *run_verdict(const char *hook, const char *launch, const char *extra, double *step_ms)
{
    char cmd[2048], dir[600], pass[128] = "";
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    if (hook && *launch) snprintf(pass, sizeof pass, " -x %.*s", (int)strcspn(hook, "="), hook);
    snprintf(cmd, sizeof cmd,
             "%s%s%s%s '%s' diagnose --model '%s' --device cpu --threads 1 --batch 8 --input-len 16 --output-len 16 "
             "--json %s </dev/null 2>/dev/null",
             hook ? hook : "", hook ? " " : "", launch, pass, test_bin(), dir, extra);
    return verdict_of(cmd, step_ms, 0);
}

/* What a busy machine once did to diag_faults_get_their_verdict: under mpirun a rank's stdout is a
 * pseudo-terminal whose output mpirun forwards in pieces, so rank 0's JSON line reached mpirun's
 * stdout in two writes with another rank's log line (mpirun's stderr) between them, and the test
 * read both because its "2>/dev/null" was undone by the harness's "2>&1" after it. The same
 * pieces, every time: */
TEST(diag_json_stdout_alone)
{
    char script[700], cmd[1024];
    snprintf(script, sizeof script, "%s/spliced.sh", test_tmpdir());
    FILE *f = fopen(script, "w");
    ASSERT(f);
    fputs("printf '{\"verdict\": \"communication-bound\", '\n"
          "echo '[rank 1] engine: a log line' >&2\n"
          "printf '\"step_ms\": 210.5}\\n'\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "sh '%s' </dev/null 2>/dev/null", script);
    double step_ms = 0;
    const char *v = verdict_of(cmd, &step_ms, 0);
    EXPECT(v && !strcmp(v, "communication-bound") && step_ms == 210.5, "%s", v ? v : "(none)");
    /* and a log line on stdout is caught, not skipped */
    snprintf(cmd, sizeof cmd, "sh -c 'echo engine: a log line; echo \"{\\\"verdict\\\": \\\"host-bound\\\"}\"' "
                              "2>/dev/null");
    EXPECT(verdict_of(cmd, NULL, 1) == NULL);
}

/* argv run with stdout a SOCK_SEQPACKET socket, where each write(2) stays one record, and stderr
 * /dev/null; env "NAME=VALUE" or NULL. The records (malloc'ed, NUL-terminated) into rec[max],
 * their lengths into len; returns how many, or -1 when the command failed. */
static int run_records(char *const argv[], const char *env, char **rec, size_t *len, int max)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0), dup2(sv[1], 1), dup2(null, 2);
        if (env) putenv((char *)env);
        execv(argv[0], argv);
        _exit(127);
    }
    close(sv[1]);
    int n = 0;
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = recv(sv[0], buf, cap, MSG_TRUNC)) > 0 && n < max) {
        if ((size_t)got > cap) got = (ssize_t)cap; /* cannot happen below 1 MiB */
        rec[n] = malloc((size_t)got + 1);
        memcpy(rec[n], buf, (size_t)got);
        rec[n][got] = 0;
        len[n++] = (size_t)got;
    }
    free(buf);
    close(sv[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? n : -1;
}

/* Every --json result leaves in one write: stdio would cut a line longer than its buffer (4096
 * bytes on a pipe, 1024 on the pseudo-terminal mpirun gives a rank) into pieces that a log line
 * could come between when stdout and stderr share a pipe. Each record on a SEQPACKET stdout is
 * one write: each must be whole JSON ending in a newline. */
TEST(diag_json_output_in_one_write)
{
    char bin[600], glm5[600], golden[600], builtin[600], text[600], cache[700];
    snprintf(bin, sizeof bin, "%s", test_bin());
    snprintf(glm5, sizeof glm5, "%s/glm5", test_data("configs"));
    snprintf(golden, sizeof golden, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(builtin, sizeof builtin, "%s/models/builtin-nvfp4", test_root());
    snprintf(text, sizeof text, "%s", test_data("heldout.txt"));
    snprintf(cache, sizeof cache, "MOESERVE_CALIBRATE_CACHE=%s/cal-one-write.json", test_tmpdir());
    struct { char *argv[24]; const char *env; int lines; } cmds[] = {
        /* 26 pipeline stages: a line of 7.5 kB */
        {{bin, "info", "--json", "--model", glm5, "--tp", "8", "--pp", "26", NULL}, NULL, 1},
        {{bin, "calibrate", "--device", "cpu", "--threads", "1", "--quick", "--json", NULL}, cache, 1},
        {{bin, "diagnose", "--model", golden, "--device", "cpu", "--threads", "1", "--batch", "2,4", "--input-len", "8",
          "--output-len", "4", "--json", NULL}, NULL, 2},
        {{bin, "perplexity", "--model", builtin, "--text-file", text, "--ctx", "32", "--max-windows", "1", "--threads", "1",
          "--json", NULL}, NULL, 1},
        {{bin, "bench", "model", "--model", golden, "--device", "cpu", "--threads", "1", "--batch", "1,2", "--input-len", "8",
          "--output-len", "4", "--json", NULL}, NULL, 2},
    };
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        char *rec[64];
        size_t len[64];
        int n = run_records(cmds[c].argv, cmds[c].env, rec, len, 64);
        EXPECT(n == cmds[c].lines, "%s %s: %d writes, %d results expected", cmds[c].argv[1], cmds[c].argv[2], n,
               cmds[c].lines);
        size_t biggest = 0;
        for (int i = 0; i < n; i++) {
            json_error_t je;
            json_t *o = json_loadb(rec[i], len[i], 0, &je);
            EXPECT(o && len[i] > 0 && rec[i][len[i] - 1] == '\n',
                   "%s %s: write %d of %d is not one whole JSON result (%s): %.200s", cmds[c].argv[1], cmds[c].argv[2], i + 1,
                   n, je.text, rec[i]);
            json_decref(o);
            if (len[i] > biggest) biggest = len[i];
            free(rec[i]);
        }
        if (c == 0) EXPECT(biggest > 4096, "info --json: %zu bytes, more than a pipe's 4096 expected", biggest);
    }
}

/* Open MPI keeps some allocations to the end of the process: no leak report for its ranks */
#define MPI2 "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS=detect_leaks=0 -np 2"

/* The test hooks (base/test_hooks.h) make each verdict true; they are environment variables, not
 * options of the command line. */
TEST(diag_faults_get_their_verdict)
{
    /* 50 ms: more than a step, even under ASan */
    const char *v = run_verdict("MOESERVE_TEST_HOST_DELAY_US=50000", "", "", NULL);
    EXPECT(v && !strcmp(v, "host-bound"), "host delay: %s", v ? v : "(none)");
    v = run_verdict("MOESERVE_TEST_GEMM_REPEAT=20", "", "", NULL);
    EXPECT(v && (!strcmp(v, "under-tuned-kernels") || !strcmp(v, "compute-bound")), "repeated GEMMs: %s", v ? v : "(none)");
    if (test_run("command -v mpirun >/dev/null 2>&1", NULL) != 0) {
        test_skip("mpirun is not installed: the multi-rank faults are not run");
        return;
    }
    v = run_verdict("MOESERVE_TEST_COMM_DELAY_US=5000", MPI2, "--tp 2", NULL);
    EXPECT(v && !strcmp(v, "communication-bound"), "comm delay: %s", v ? v : "(none)");
    /* one micro-batch, and the second stage holds three of the four layers with every GEMM run 10
     * times: the first stage waits about 90% of a step. (Two balanced stages of this tiny model
     * wait 1.5 ms a step, less than a loaded machine takes from a rank now and then: their
     * verdict was "host-bound" once both cores were busy.) */
    v = run_verdict("MOESERVE_TEST_GEMM_REPEAT=10", MPI2, "--pp 2 --pp-microbatches 1 --pp-layers 1,3", NULL);
    EXPECT(v && !strcmp(v, "pipeline-bubble-bound"), "one micro-batch: %s", v ? v : "(none)");
}

/* Two ranks that mpirun leaves unbound may run on the same cores: the diagnosis says so first,
 * with the CPU sets it saw, and its placement says they share cores. */
TEST(diag_shared_cores_said)
{
    if (test_run("command -v mpirun >/dev/null 2>&1", NULL) != 0) {
        test_skip("mpirun is not installed");
        return;
    }
    char cmd[2048], dir[600], *out = NULL;
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(
        cmd, sizeof cmd,
        "mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS=detect_leaks=0 "
        "-np 2 '%s' diagnose --model '%s' --device cpu --batch 4 --input-len 8 --output-len 8 --tp 2 --json "
        "</dev/null 2>/dev/null",
        test_bin(), dir);
    int rc = test_run(cmd, &out);
    json_t *o = rc == 0 && out ? json_loads(out, 0, NULL) : NULL;
    ASSERT(o, "exit %d: %s", rc, out ? out : "");
    EXPECT(json_is_true(jget(o, "placement.shares_cores")) && jint(o, "placement.ranks") == 2, "%s", out);
    const char *ev = jstr(o, "evidence.0");
    EXPECT(ev && strstr(ev, "the ranks share cores") && strstr(ev, "ranks 0 and 1"), "%s", ev ? ev : "");
    json_decref(o);
    free(out);
}

TEST(diag_sweep_report)
{
    if (test_run("command -v mpirun >/dev/null 2>&1", NULL) != 0) {
        test_skip("mpirun is not installed");
        return;
    }
    char cmd[2048], dir[600], out_dir[700];
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(out_dir, sizeof out_dir, "%s/sweep", test_tmpdir());
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 '%s' diagnose --sweep --layouts tp1,tp2,pp2 --model '%s' --device cpu --batch 8 --input-len 16 "
             "--output-len 8 --out '%s' --json </dev/null 2>/dev/null",
             test_bin(), dir, out_dir);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    ASSERT(rc == 0, "%s", out ? out : "");
    const char *at = strstr(out, "{\"runs\""); /* after the logs */
    json_t *o = at ? json_loads(at, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    ASSERT(o, "%s", out);
    json_t *runs = json_object_get(o, "runs");
    EXPECT(json_array_size(runs) == 3);
    for (size_t i = 0; i < json_array_size(runs); i++)
        EXPECT(json_is_string(json_object_get(json_object_get(json_array_get(runs, i), "diagnosis"), "verdict")), "run %zu", i);
    /* mpirun binds a rank to a core when there are cores enough (two here, on most machines): the
     * scaling is read then, and said not to be meaningful where the ranks share cores */
    int shared = 0;
    for (size_t i = 0; i < json_array_size(runs); i++)
        shared |= json_is_true(jget(json_array_get(runs, i), "diagnosis.placement.shares_cores"));
    const char *scaling = json_string_value(json_object_get(o, "scaling"));
    if (shared)
        EXPECT(strstr(scaling, "not meaningful") && json_is_false(json_object_get(o, "scaling_meaningful")), "%s",
               scaling);
    else
        EXPECT(strstr(scaling, "tp2 (more tensor parallelism) gives") &&
                   json_is_true(json_object_get(o, "scaling_meaningful")),
               "%s", scaling);
    const char *files[] = {"report.md", "breakdown.svg", "roofline.svg"};
    for (int i = 0; i < 3; i++) {
        char path[800];
        snprintf(path, sizeof path, "%s/%s", out_dir, files[i]);
        size_t n = 0;
        char *text = file_read_all(path, &n);
        EXPECT(text && n > 200, "%s", path);
        if (text && i > 0) EXPECT(strstr(text, "<svg") && strstr(text, "</svg>"), "%s", path);
        if (text && i == 0) EXPECT(strstr(text, "| tp2 | 2 |") && strstr(text, "## Scaling"), "%s", text);
        free(text);
    }
    json_decref(o);
    free(out);
}

TEST(diag_server_endpoint)
{
    Srv s;
    ASSERT(srv_start(&s, "diag", "--profile-every 2") == 0);
    for (int i = 0; i < 3; i++) {
        Resp r;
        post(s.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":8}", &r);
        EXPECT(r.status == 200);
        resp_free(&r);
    }
    Resp r;
    EXPECT(http(s.port, "GET", "/v1/diagnosis", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *j = body_json(&r);
    EXPECT(j && json_is_string(json_object_get(j, "verdict")) && json_object_get(j, "breakdown"), "%s", r.body ? r.body : "");
    const char *v = j ? json_string_value(json_object_get(j, "verdict")) : NULL;
    EXPECT(v && strcmp(v, "no-load"), "profiled steps: %s", v ? v : "");
    if (j) json_decref(j);
    resp_free(&r);
    EXPECT(http(s.port, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200);
    EXPECT(r.body && strstr(r.body, "moeserve_step_share{category=\"moe_gemm\"}") && strstr(r.body, "moeserve_verdict{"));
    resp_free(&r);
    /* diagnose --url: the same, printed */
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' diagnose --url http://127.0.0.1:%d", test_bin(), s.port);
    EXPECT(test_run(cmd, &out) == 0 && out && strstr(out, "verdict: ") && strstr(out, "advice:"), "%s", out ? out : "");
    free(out);
    srv_stop(&s, 30);
}

/* GET /v1/diagnosis as JSON (NULL if it does not answer 200 with one) */
static json_t *get_diagnosis(int port)
{
    Resp r;
    json_t *j = NULL;
    if (http(port, "GET", "/v1/diagnosis", NULL, NULL, &r) == 0 && r.status == 200) j = json_loads(r.body, 0, NULL);
    resp_free(&r);
    return j;
}

/* the first step (counted from the server's start, 0-based) that the diagnosis window holds */
static long long window_first(json_t *j)
{
    return jint(j, "deployment.steps_total") - jint(j, "window.steps");
}

#define WIN_B 8 /* load B: requests at once */

/* A server's diagnosis describes its recent steps (--diagnosis-window), not its whole life:
 * after load A (one request at a time) then load B (WIN_B at once) kept up past the window, the
 * window holds B's steps only (every one WIN_B decode tokens, the tokens/s theirs); once idle
 * the last load's figures stay, said to be idle; a new load after that starts a new window. */
TEST(diag_server_window)
{
    Srv s;
    char extra[128];
    snprintf(extra, sizeof extra, "--profile-every 2 --diagnosis-window 0.3 --max-running-requests %d", WIN_B);
    ASSERT(srv_start(&s, "diagwin", extra) == 0);
    for (int i = 0; i < 4; i++) { /* A */
        Resp r;
        post(s.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":24,\"ignore_eos\":true}", &r);
        EXPECT_EQ_INT(r.status, 200);
        resp_free(&r);
    }
    json_t *j = get_diagnosis(s.port);
    ASSERT(j && json_is_integer(jget(j, "deployment.steps_total")) && json_is_object(jget(j, "window")),
           "no window in the diagnosis");
    long long a_steps = jint(j, "deployment.steps_total");
    json_decref(j);
    EXPECT(a_steps >= 4 * 24, "load A ran %lld steps", a_steps);
    /* B: long requests (the whole context), dropped once seen */
    const char *body = "{\"prompt\":\"Tell me everything.\",\"max_tokens\":4000,\"ignore_eos\":true}";
    int fds[WIN_B];
    for (int i = 0; i < WIN_B; i++) {
        fds[i] = hc_connect(s.port, 0);
        ASSERT(fds[i] >= 0);
        ASSERT(hc_send_request(fds[i], "POST", "/v1/completions", NULL, body, strlen(body)) == 0);
    }
    /* all of B running: the steps after the one in flight decode WIN_B tokens each */
    long long b0 = -1;
    double t0 = clock_now();
    while (b0 < 0 && clock_now() - t0 < 120) {
        j = get_diagnosis(s.port);
        if (j && jint(j, "deployment.running") == WIN_B && jint(j, "deployment.waiting") == 0)
            b0 = jint(j, "deployment.steps_total") + 1;
        json_decref(j);
        if (b0 < 0) usleep(20000);
    }
    ASSERT(b0 > a_steps, "load B never ran %d at once", WIN_B);
    /* wait (no deadline a busy machine can miss: B lasts thousands of steps) for a window of B's
     * decode steps alone, B still running */
    json_t *w = NULL;
    t0 = clock_now();
    while (!w && clock_now() - t0 < 300) {
        j = get_diagnosis(s.port);
        ASSERT(j);
        if (jint(j, "deployment.running") != WIN_B || jint(j, "deployment.waiting") != 0) {
            char *d = json_dumps(j, 0);
            fprintf(stderr, "    load B ended before the window left its start: %s\n", d ? d : "");
            free(d);
            json_decref(j);
            break;
        }
        if (jint(j, "window.profiled_steps") > 0 && window_first(j) > b0) w = j;
        else json_decref(j), usleep(20000);
    }
    ASSERT(w, "the diagnosis window never held load B's steps alone");
    long long steps = jint(w, "window.steps"), tokens = jint(w, "window.tokens"), total = jint(w, "deployment.steps_total");
    double wall_ms = json_number_value(jget(w, "window.wall_ms")), tps = json_number_value(jget(w, "tokens_per_s"));
    EXPECT(steps > 0 && steps < total - a_steps, "window %lld of %lld steps (A %lld)", steps, total, a_steps);
    EXPECT(jint(w, "deployment.steps") == steps);
    EXPECT(tokens == WIN_B * steps, "window: %lld tokens in %lld steps", tokens, steps);
    /* the same figures (the server writes 6 significant digits) */
    EXPECT(wall_ms > 0 && fabs(tps - tokens / (wall_ms / 1e3)) <= 1e-4 * tps, "%g tokens/s, %lld tokens in %g ms", tps,
           tokens, wall_ms);
    EXPECT(jint(w, "window.profiled_steps") <= steps);
    EXPECT(jint(w, "deployment.preemptions") == 0, "preemptions change B's steps");
    EXPECT(json_number_value(jget(w, "window.seconds")) > 0);
    EXPECT(json_number_value(jget(w, "window.idle_s")) == 0);
    const char *v = jstr(w, "verdict");
    EXPECT(v && strcmp(v, "no-load"), "%s", v ? v : "");
    const char *ev = jstr(w, "evidence.0");
    EXPECT(ev && strstr(ev, "a step takes") && !strstr(ev, "idle"), "%s", ev ? ev : "");
    json_decref(w);
    /* B gone: idle, the figures still its own */
    for (int i = 0; i < WIN_B; i++) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fds[i]);
    }
    j = NULL;
    t0 = clock_now();
    while (clock_now() - t0 < 60) {
        j = get_diagnosis(s.port);
        ASSERT(j);
        if (jint(j, "deployment.running") == 0 && jint(j, "deployment.waiting") == 0) break;
        json_decref(j);
        j = NULL;
        usleep(50000);
    }
    ASSERT(j, "load B was not dropped");
    long long b_end = jint(j, "deployment.steps_total");
    json_decref(j);
    usleep(1200000); /* past two windows (an empty window would say nothing), and long enough to be called idle */
    j = get_diagnosis(s.port);
    ASSERT(j);
    EXPECT(jint(j, "deployment.steps_total") == b_end);
    EXPECT(jint(j, "window.steps") > 0 && window_first(j) > b0, "window %lld steps from %lld", jint(j, "window.steps"),
           window_first(j));
    EXPECT(json_number_value(jget(j, "window.idle_s")) > 1.0, "idle %g s", json_number_value(jget(j, "window.idle_s")));
    ev = jstr(j, "evidence.0");
    EXPECT(ev && strstr(ev, "idle for"), "%s", ev ? ev : "");
    json_decref(j);
    /* and a new load (one request) is a new window, without B's steps */
    Resp r;
    post(s.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":8,\"ignore_eos\":true}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    j = get_diagnosis(s.port);
    ASSERT(j);
    EXPECT(jint(j, "window.steps") > 0 && window_first(j) >= b_end, "window %lld steps from %lld, B ended at %lld",
           jint(j, "window.steps"), window_first(j), b_end);
    json_decref(j);
    srv_stop(&s, 30);
}

/* `calibrate` --json on the CPU with the cache file and environment given; the JSON (NULL when
 * the command failed) */
static json_t *calibrate_json(const char *env, const char *cache, const char *extra)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s MOESERVE_CALIBRATE_CACHE='%s' %s '%s' calibrate --device cpu --quick --json %s 2>/dev/null", env,
             cache, strstr(extra, "--threads 2") ? "taskset -c 0" : "", test_bin(), extra);
    json_t *o = test_run(cmd, &out) == 0 && out ? json_loads(out, 0, NULL) : NULL;
    if (!o) fprintf(stderr, "    %s: %s\n", cmd, out ? out : "");
    free(out);
    return o;
}

/* A busy machine's calibration says so and keeps the cached profile of a quiet one; --force
 * replaces it; a busy profile is replaced by the next quiet one. "Busy" comes from the test
 * hook, then from a real measurement that cannot have the cores to itself: two threads on
 * one CPU. */
TEST(diag_calibrate_busy_keeps_cache)
{
    char cache[700];
    snprintf(cache, sizeof cache, "%s/cal-busy.json", test_tmpdir());
    json_t *o = calibrate_json("MOESERVE_TEST_CALIBRATE_BUSY=1", cache, "--threads 1");
    ASSERT(o);
    EXPECT(json_is_null(json_object_get(o, "busy")) && json_is_true(json_object_get(o, "cached")));
    json_decref(o);
    char *quiet = file_read_all(cache, NULL);
    ASSERT(quiet && strstr(quiet, "\"busy\": null"), "%s", quiet ? quiet : cache);
    /* busy: measured, said, not cached */
    o = calibrate_json("MOESERVE_TEST_CALIBRATE_BUSY=2", cache, "--threads 1");
    ASSERT(o);
    const char *why = json_string_value(json_object_get(o, "busy"));
    EXPECT(why && strstr(why, "MOESERVE_TEST_CALIBRATE_BUSY") && json_is_false(json_object_get(o, "cached")),
           "busy: %s", why ? why : "(none)");
    json_decref(o);
    char *now = file_read_all(cache, NULL);
    EXPECT(now && !strcmp(now, quiet), "the quiet profile was replaced:\n%s", now ? now : "(gone)");
    free(now);
    /* the text says it too */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "MOESERVE_TEST_CALIBRATE_BUSY=2 MOESERVE_CALIBRATE_CACHE='%s' '%s' calibrate --device cpu "
             "--threads 1 --quick 2>&1",
             cache, test_bin());
    EXPECT(test_run(cmd, &out) == 0 && out && strstr(out, "on a busy machine") && strstr(out, "not cached"), "%s",
           out ? out : "");
    free(out);
    /* --force: cached, marked busy; then a quiet run replaces it */
    o = calibrate_json("MOESERVE_TEST_CALIBRATE_BUSY=2", cache, "--threads 1 --force");
    EXPECT(o && json_is_true(json_object_get(o, "cached")));
    json_decref(o);
    now = file_read_all(cache, NULL);
    EXPECT(now && strstr(now, "\"busy\": \"MOESERVE_TEST_CALIBRATE_BUSY=2\""), "%s", now ? now : "(gone)");
    free(now);
    o = calibrate_json("MOESERVE_TEST_CALIBRATE_BUSY=1", cache, "--threads 1");
    EXPECT(o && json_is_true(json_object_get(o, "cached")));
    json_decref(o);
    now = file_read_all(cache, NULL);
    EXPECT(now && strstr(now, "\"busy\": null"), "%s", now ? now : "(gone)");
    free(now);
    free(quiet);
    /* measured: two threads on one CPU run at most half the time each, however quiet the machine */
    if (test_run("command -v taskset >/dev/null 2>&1", NULL) != 0) {
        test_skip("taskset is not installed: the measured busy machine is not tried");
        return;
    }
    snprintf(cache, sizeof cache, "%s/cal-busy2.json", test_tmpdir());
    o = calibrate_json("MOESERVE_TEST_CALIBRATE_BUSY=1", cache, "--threads 2");
    ASSERT(o && json_is_true(json_object_get(o, "cached")));
    json_decref(o);
    quiet = file_read_all(cache, NULL);
    o = calibrate_json("", cache, "--threads 2");
    ASSERT(o);
    why = json_string_value(json_object_get(o, "busy"));
    EXPECT(why && strstr(why, "its 2 threads ran") && strstr(why, "more threads than the CPUs"), "%s",
           why ? why : "(quiet)");
    EXPECT(json_is_false(json_object_get(o, "cached")));
    json_decref(o);
    now = file_read_all(cache, NULL);
    EXPECT(quiet && now && !strcmp(now, quiet), "the quiet profile was replaced:\n%s", now ? now : "(gone)");
    free(now);
    free(quiet);
}

TEST(diag_calibrate_json)
{
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "MOESERVE_CALIBRATE_CACHE='%s/cal.json' '%s' calibrate --device cpu --threads 1 --quick --json 2>/dev/null",
             test_tmpdir(), test_bin());
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    const char *at = strstr(out, "\n{"); /* logs may come first (stderr joins stdout here) */
    json_t *o = json_loads(out[0] == '{' ? out : at ? at + 1 : "", JSON_DISABLE_EOF_CHECK, NULL);
    ASSERT(o, "%s", out);
    EXPECT(json_number_value(json_object_get(o, "copy_gbps")) > 0.1);
    EXPECT(json_number_value(json_object_get(o, "read_gbps")) > 0.1);
    EXPECT(json_number_value(json_object_get(o, "bf16_tflops")) > 0);
    EXPECT(json_integer_value(json_object_get(o, "ranks")) == 1);
    json_decref(o);
    free(out);
    char path[700];
    snprintf(path, sizeof path, "%s/cal.json", test_tmpdir());
    size_t n;
    char *cached = file_read_all(path, &n);
    EXPECT(cached && strstr(cached, "copy_gbps"), "the cache %s", path);
    free(cached);
}
