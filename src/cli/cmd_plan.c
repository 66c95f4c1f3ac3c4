/* cmd_plan: `moeserve plan --model DIR --gpu NAME|FILE --gpus N [...]` predicts a deployment
 * before it exists: for every layout the model's shapes allow on those GPUs (or those named), the
 * memory of a rank, whether it fits, the KV tokens it holds, and at every concurrency the steady
 * state of serve's continuous batching (src/cost/deploy.h), as a table, JSON (--json) or a chart
 * of tok/s per GPU against tok/s per user (--svg). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../cost/cost.h"
#include "../cost/deploy.h"
#include "../diag/profile.h"
#include "../diag/verdict.h"
#include "cli.h"

#define PLAN_MAX_LAYOUTS 64

typedef struct {
    const char *gpu, *link, *node_link, *host, *layouts, *conc, *svg;
    int gpus, nodes, input_len, output_len, as_json;
} PlanOpts;

/* the names plan writes are diagnose's: the cost floor keeps its own copy below diag, checked here */
static void check_names(void)
{
    for (int p = 0; p < CP_COUNT; p++)
        CHECK(!strcmp(cost_part_name(p), step_cat_name((StepCat)p)), "plan category %s is diagnose's %s", cost_part_name(p),
              step_cat_name((StepCat)p));
    static const Verdict v[CB_COUNT] = {V_COMPUTE, V_MEMORY, V_COMMUNICATION, V_BUBBLE, V_HOST, V_KV_CAPACITY};
    for (int b = 0; b < CB_COUNT; b++)
        CHECK(!strcmp(cost_bound_name(b), verdict_name(v[b])), "plan bound %s is diagnose's %s", cost_bound_name(b),
              verdict_name(v[b]));
}

static int parse_conc(const char *s, int *out, int max, char *err, size_t n)
{
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || (*end && *end != ','))
            return errbuf_set(err, n, "--concurrency '%s': expected a comma-separated list of numbers >= 1", s), -1;
        if (k == max) return errbuf_set(err, n, "--concurrency: at most %d values", max), -1;
        out[k++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!k) return errbuf_set(err, n, "--concurrency: an empty list"), -1;
    return k;
}

static const char *fmt_bytes(double b, char *buf, size_t n)
{
    if (b >= 1e9) snprintf(buf, n, "%.1f GB", b / 1e9);
    else snprintf(buf, n, "%.1f MB", b / 1e6);
    return buf;
}

/* "moe_gemm 41%, all_reduce 22%": the two largest parts */
static void top_parts(const CostPoint *q, char *buf, size_t n)
{
    int a = -1, b = -1;
    for (int k = 0; k < CP_COUNT; k++) {
        if (a < 0 || q->share[k] > q->share[a]) b = a, a = k;
        else if (b < 0 || q->share[k] > q->share[b]) b = k;
    }
    snprintf(buf, n, "%s %.0f%%, %s %.0f%%", cost_part_name(a), 100 * q->share[a], cost_part_name(b), 100 * q->share[b]);
}

static void print_table(const CostPlan *p, int n, const CostSetup *s, const char *model)
{
    printf("plan: %s, %d layers, %d x %s (%s%s%s), %d in / %d out; host: %s\n", model, s->num_layers, s->gpus_per_node * s->nodes,
           s->dev->name, s->link->name, s->nodes > 1 ? "; between nodes " : "", s->nodes > 1 ? s->node_link->name : "",
           s->input_len, s->output_len, s->host ? s->host->name : s->dev->name);
    if (s->dev->estimated) printf("(the %s profile's efficiencies are estimated, carried over from a measured card)\n", s->dev->name);
    printf("\n%-12s %-4s %10s %12s %6s %9s %10s %11s %9s %9s  %-22s %s\n", "layout", "fits", "weights/GPU", "KV tokens", "conc",
           "TPOT ms", "TTFT ms", "out tok/s", "tok/s/GPU", "tok/s/usr", "bound", "largest parts of a step");
    int bt = -1, bti = 0, bl = -1;
    for (int i = 0; i < n; i++) {
        const CostPlan *x = &p[i];
        char wb[32];
        if (!x->allowed) {
            printf("%-12s %-4s  not possible: %s\n", x->name, "-", x->why);
            continue;
        }
        if (!x->fits) {
            printf("%-12s %-4s %10s %12.0f  does not fit: %s\n", x->name, "no", fmt_bytes(x->weight_bytes_per_gpu, wb, sizeof wb),
                   x->kv_tokens_total, x->why);
            continue;
        }
        for (int j = 0; j < x->n_points; j++) {
            const CostPoint *q = &x->points[j];
            char parts[96];
            top_parts(q, parts, sizeof parts);
            if (j == 0)
                printf("%-12s %-4s %10s %12.0f", x->name, "yes", fmt_bytes(x->weight_bytes_per_gpu, wb, sizeof wb), x->kv_tokens_total);
            else
                printf("%-12s %-4s %10s %12s", "", "", "", "");
            printf(" %6d %9.2f %10.1f %11.1f %9.1f %9.1f  %-22s %s%s\n", q->concurrency, q->tpot_ms, q->ttft_ms, q->output_tok_s,
                   q->tok_s_gpu, q->tok_s_user, cost_bound_name(q->bound), parts, q->kv_limited ? " (KV full: fewer run)" : "");
            if (bt < 0 || q->tok_s_gpu > p[bt].points[bti].tok_s_gpu) bt = i, bti = j;
        }
        if (bl < 0 || x->points[0].tpot_ms < p[bl].points[0].tpot_ms) bl = i;
    }
    if (bt >= 0) {
        printf("\nbest for throughput: %s at concurrency %d, %.1f tok/s per GPU (%.1f tok/s per user)\n", p[bt].name,
               p[bt].points[bti].concurrency, p[bt].points[bti].tok_s_gpu, p[bt].points[bti].tok_s_user);
        printf("best for latency:    %s, TPOT %.2f ms at concurrency %d\n", p[bl].name, p[bl].points[0].tpot_ms,
               p[bl].points[0].concurrency);
    } else {
        printf("\nno layout fits\n");
    }
}

/* tok/s per GPU (y) against tok/s per user (x), a line a layout through its concurrencies */
static int write_svg(const char *path, const CostPlan *p, int n, const CostSetup *s, char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f) return errbuf_set(err, errlen, "--svg %s: %s", path, strerror(errno)), -1;
    double xm = 0, ym = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < p[i].n_points; j++) {
            if (p[i].points[j].tok_s_user > xm) xm = p[i].points[j].tok_s_user;
            if (p[i].points[j].tok_s_gpu > ym) ym = p[i].points[j].tok_s_gpu;
        }
    xm = xm > 0 ? xm * 1.1 : 1;
    ym = ym > 0 ? ym * 1.1 : 1;
    const int W = 820, H = 520, L = 80, R = 200, T = 50, B = 60, pw = W - L - R, ph = H - T - B;
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">moeserve plan: %d x %s, %d in / %d out</text>\n", L,
            s->gpus_per_node * s->nodes, s->dev->name, s->input_len, s->output_len);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T + ph, L + pw, T + ph);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, T + ph);
    for (int k = 0; k <= 4; k++) {
        double fx = xm * k / 4, fy = ym * k / 4;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", L + pw * k / 4, T + ph + 16, fx);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f</text>\n", L - 6, T + ph - ph * k / 4 + 4, fy);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">output tokens/s per user (1 / TPOT)</text>\n", L + pw / 2, H - 16);
    fprintf(f, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">output tokens/s per GPU</text>\n",
            T + ph / 2, T + ph / 2);
    int li = 0;
    for (int i = 0; i < n; i++) {
        if (!p[i].n_points) continue;
        const char *col = colors[li % 10];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int j = 0; j < p[i].n_points; j++)
            fprintf(f, "%.1f,%.1f ", L + pw * p[i].points[j].tok_s_user / xm, T + ph - ph * p[i].points[j].tok_s_gpu / ym);
        fprintf(f, "\"/>\n");
        for (int j = 0; j < p[i].n_points; j++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%s, concurrency %d</title></circle>\n",
                    L + pw * p[i].points[j].tok_s_user / xm, T + ph - ph * p[i].points[j].tok_s_gpu / ym, col, p[i].name,
                    p[i].points[j].concurrency);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>\n", L + pw + 16,
                T + 10 + 18 * li, L + pw + 36, T + 10 + 18 * li, col);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", L + pw + 42, T + 14 + 18 * li, p[i].name);
        li++;
    }
    fprintf(f, "</svg>\n");
    if (fclose(f)) return errbuf_set(err, errlen, "--svg %s: %s", path, strerror(errno)), -1;
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    check_names();
    ModelOpts mo = {0};
    EngineOptions eo;
    engine_options_default(&eo);
    PlanOpts po = {.host = "cpu", .node_link = "infiniband", .layouts = "auto", .conc = "1,64,256,512", .nodes = 1,
                   .input_len = 1024, .output_len = 1024};
    const OptSpec specs[] = {
        {.names = "--gpu", .type = OPT_STR, .dst = &po.gpu, .metavar = "NAME|FILE",
         .help = "the device: a built-in profile (h100, h200, b200, rtx-pro-6000, cpu) or a JSON file (calibrate --json)"},
        {.names = "--gpus", .type = OPT_INT, .dst = &po.gpus, .metavar = "N", .help = "GPUs of a node", .lo = 1, .hi = 1024},
        {.names = "--nodes", .type = OPT_INT, .dst = &po.nodes, .metavar = "M", .help = "nodes", .def = "1", .lo = 1, .hi = 1024},
        {.names = "--link", .type = OPT_STR, .dst = &po.link, .metavar = "NAME|FILE",
         .help = "the link between a node's GPUs (nvlink4, nvlink5, pcie5-p2p, pcie-host, infiniband, cpu-shm, or a JSON file)",
         .def = "the device profile's default_link"},
        {.names = "--node-link", .type = OPT_STR, .dst = &po.node_link, .metavar = "NAME|FILE",
         .help = "the link between nodes", .def = "infiniband"},
        {.names = "--host", .type = OPT_STR, .dst = &po.host, .metavar = "NAME|FILE",
         .help = "the machine that runs the engine: its per-step host overhead", .def = "cpu (this repository's machine)"},
        {.names = "--input-len", .type = OPT_INT, .dst = &po.input_len, .metavar = "I", .help = "prompt tokens a request",
         .def = "1024", .lo = 1, .hi = 1 << 22},
        {.names = "--output-len", .type = OPT_INT, .dst = &po.output_len, .metavar = "O", .help = "output tokens a request",
         .def = "1024", .lo = 1, .hi = 1 << 22},
        {.names = "--concurrency", .type = OPT_STR, .dst = &po.conc, .metavar = "LIST", .help = "clients at once",
         .def = "1,64,256,512"},
        {.names = "--layouts", .type = OPT_STR, .dst = &po.layouts, .metavar = "auto|LIST",
         .help = "layouts to plan (tp8,tp4pp2,ep8,tp8dp8ep8); auto: every one the GPU count allows", .def = "auto"},
        {.names = "--json", .type = OPT_FLAG, .dst = &po.as_json, .help = "one JSON object", .def = "off"},
        {.names = "--svg", .type = OPT_STR, .dst = &po.svg, .metavar = "FILE",
         .help = "a chart: tok/s per GPU against tok/s per user, a line a layout"},
    };
    const OptSpec sched[] = {
        {.names = ENGINE_MAX_RUNNING_NAMES, .type = OPT_INT, .dst = &eo.max_running, .metavar = "N",
         .help = "sequences running at once", .def = opt_def("%d", eo.max_running), .lo = 1, .hi = 1 << 16},
        {.names = ENGINE_MAX_BATCH_TOKENS_NAMES, .type = OPT_INT, .dst = &eo.max_batch_tokens, .metavar = "N",
         .help = "tokens of one forward step", .def = opt_def("%d", eo.max_batch_tokens), .lo = 1, .hi = 1 << 24},
        {.names = "--chunked-prefill-size", .type = OPT_INT, .dst = &eo.chunked_prefill, .metavar = "N",
         .help = "prompt tokens of one sequence per step (-1: up to --max-batch-tokens)",
         .def = opt_def("%d", eo.chunked_prefill), .lo = -1, .hi = 1 << 24},
        {.names = "--num-continuous-decode-steps", .type = OPT_INT, .dst = &eo.decode_steps, .metavar = "N",
         .help = "decode steps per scheduling round", .def = opt_def("%d", eo.decode_steps), .lo = 1, .hi = 1024},
    };
    int microbatches = 0;
    const OptSpec pipe[] = {
        {.names = "--pp-microbatches", .type = OPT_INT, .dst = &microbatches, .metavar = "N",
         .help = "micro-batches in flight per step under pp", .def = "pp", .lo = 1, .hi = 1024},
    };
    double accept = 0.7;
    const OptSpec spec_more[] = {
        {.names = "--spec-accept-rate", .type = OPT_DOUBLE, .dst = &accept, .metavar = "P",
         .help = "with drafts: the chance one is accepted when the ones before it were (diagnose and bench serve "
                 "measure it)", .def = "0.7", .lo = 0, .hi = 1},
    };
    const OptGroup groups[] = {OPT_GROUP("plan", specs), model_opt_group(&mo, MODEL_OPT_ALL),
                               OPT_GROUP("serve's scheduler", sched), OPT_GROUP("pipeline", pipe),
                               spec_opt_group(&mo.spec), OPT_GROUP("drafts in the plan", spec_more)};
    const OptCommand cmd = {.cmd = "plan", .synopsis = "MODEL --gpu NAME|FILE --gpus N [options]",
                            .about = "Predict a deployment before it exists: every layout's memory, whether it fits, and "
                                     "TPOT, TTFT and throughput at each concurrency, from the cost model.",
                            .groups = groups, .n_groups = 6, .max_pos = 1, .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    char err[1024];
#define BAD(...) do { fprintf(stderr, "error: plan: " __VA_ARGS__); fputc('\n', stderr); return 2; } while (0)
    if (!po.gpu) BAD("--gpu NAME|FILE is required");
    if (!po.gpus) BAD("--gpus N is required");
    const char *dir = model_dir_resolve("plan", mo.dir, mo.revision, 0);
    ModelConfig *whole = xcalloc(1, sizeof *whole);
    if (config_load(whole, dir, err, sizeof err)) BAD("%s", err);
    if (mo.num_layers > whole->n_layers) BAD("--num-layers %d: the config has %d layers", mo.num_layers, whole->n_layers);
    const char *q = mo.dummy_quant ? mo.dummy_quant : "nvfp4";
    QFormat fmt = !strcmp(q, "nvfp4") ? QF_NVFP4 : !strcmp(q, "fp8") ? QF_FP8 : !strcmp(q, "bf16") ? QF_BF16 : QF_COUNT;
    if (fmt == QF_COUNT) BAD("--dummy-quant '%s': expected nvfp4, fp8 or bf16", q);
    CostDevice dev, host;
    CostLink link, node_link;
    if (cost_device_load(&dev, po.gpu, err, sizeof err)) BAD("--gpu: %s", err);
    if (cost_device_load(&host, po.host, err, sizeof err)) BAD("--host: %s", err);
    if (!po.link) po.link = dev.default_link[0] ? dev.default_link : "pcie5-p2p";
    if (cost_link_load(&link, po.link, err, sizeof err)) BAD("--link: %s", err);
    if (cost_link_load(&node_link, po.node_link, err, sizeof err)) BAD("--node-link: %s", err);
    int conc[COST_MAX_POINTS];
    int n_conc = parse_conc(po.conc, conc, COST_MAX_POINTS, err, sizeof err);
    if (n_conc < 0) BAD("%s", err);
    int world = po.gpus * po.nodes;
    ModelConfig shaped = *whole;
    if (mo.num_layers > 0) shaped.n_layers = mo.num_layers;
    CostLayout los[PLAN_MAX_LAYOUTS];
    int n_lo = 0;
    if (!strcmp(po.layouts, "auto")) {
        n_lo = cost_layouts_auto(&shaped, world, los, PLAN_MAX_LAYOUTS);
    } else {
        char *list = xstrdup(po.layouts), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n_lo == PLAN_MAX_LAYOUTS) BAD("--layouts: at most %d", PLAN_MAX_LAYOUTS);
            if (cost_layout_parse(t, &los[n_lo], err, sizeof err)) BAD("--layouts: %s", err);
            n_lo++;
        }
        free(list);
    }
    CostSetup s = {.dir = dir, .dummy_fmt = fmt, .num_layers = mo.num_layers > 0 ? mo.num_layers : whole->n_layers,
                   .dev = &dev, .host = &host, .link = &link, .node_link = &node_link, .gpus_per_node = po.gpus,
                   .nodes = po.nodes, .input_len = po.input_len, .output_len = po.output_len,
                   .max_running = eo.max_running, .max_batch_tokens = eo.max_batch_tokens,
                   .chunked_prefill = eo.chunked_prefill, .decode_steps = eo.decode_steps, .microbatches = microbatches,
                   .kv_dtype = mo.kv_dtype, .spec_k = mo.spec.k, .spec_vocab = mo.spec.draft_vocab, .spec_accept = accept};
    if (mo.num_layers <= 0) s.num_layers = 0;
    CostPlan *plans = xcalloc(n_lo > 0 ? n_lo : 1, sizeof *plans);
    for (int i = 0; i < n_lo; i++) cost_plan(&s, whole, &los[i], conc, n_conc, &plans[i]);
    if (!s.num_layers) s.num_layers = whole->n_layers;
    int rc = 0;
    if (po.svg && write_svg(po.svg, plans, n_lo, &s, err, sizeof err)) {
        fprintf(stderr, "error: plan: %s\n", err);
        rc = 1;
    }
    if (po.as_json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "model", json_string(dir));
        json_object_set_new(o, "gpu", cost_device_json(&dev));
        json_object_set_new(o, "link", cost_link_json(&link));
        json_object_set_new(o, "gpus", json_integer(world));
        json_object_set_new(o, "input_len", json_integer(po.input_len));
        json_object_set_new(o, "output_len", json_integer(po.output_len));
        for (int i = 0; i < n_lo; i++) json_array_append_new(arr, cost_plan_json(&plans[i]));
        json_object_set_new(o, "layouts", arr);
        out_json(o, JSON_COMPACT | JSON_REAL_PRECISION(8));
        json_decref(o);
    } else {
        char model[160];
        snprintf(model, sizeof model, "%s (%s)", whole->architecture, qformat_name(fmt));
        print_table(plans, n_lo, &s, model);
    }
    free(plans);
    free(whole);
    return rc;
#undef BAD
}
