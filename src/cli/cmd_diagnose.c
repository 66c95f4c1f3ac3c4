/* cmd_diagnose: `moeserve calibrate` (measure and cache this machine's ceilings) and
 * `moeserve diagnose` (issue #9): where a deployment's step time goes and what to change.
 *   diagnose --url URL [--json]          a running server's GET /v1/diagnosis
 *   diagnose --model DIR [layout] [--json] [--batch N --input-len N --output-len N]
 *                                        a built-in load on an in-process engine (every rank
 *                                        of the layout takes part; rank 0 prints)
 *   diagnose --sweep --layouts tp1,tp2pp2,ep2 --model DIR [--out DIR] [--launcher CMD]
 *                                        each layout as its own run (mpirun for the CPU backend),
 *                                        the scaling read across them, a markdown report and
 *                                        SVG charts (diag/report.c). */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"
#include "../engine/engine.h"
#include "../diag/report.h"
#include "../dist/dist.h"
#include "cli.h"

int cmd_calibrate(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    int quick = 0, as_json = 0;
    const OptSpec specs[] = {
        {.names = "--quick", .type = OPT_FLAG, .dst = &quick, .help = "shorter measurements", .def = "off"},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON object", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("calibrate", specs), device_opt_group(&dev), par_opt_group(&mo.par)};
    const OptCommand cmd = {.cmd = "calibrate", .synopsis = "[options]",
                            .about = "Measure and cache this machine's ceilings: memory bandwidth, tensor rate, "
                                     "collectives "
                                     "(several ranks: --tp/--pp, or under mpirun on the CPU).",
                            .groups = groups, .n_groups = 3};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    const char *device = model_dist_start(&mo, dev.device);
    Backend be;
    backend_open(&be, device, dev.threads);
    Ceilings c;
    calibrate_get(&c, &be, dist_get(), quick, 1);
    Dist *d = dist_get();
    if (!d || d->rank == 0) {
        if (as_json) {
            json_t *o = ceilings_json(&c);
            out_json(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
            json_decref(o);
        } else {
            ceilings_print(&c);
        }
    }
    backend_free(&be);
    dist_shutdown();
    return 0;
}

/* ---- --url ---- */

typedef struct { char *p; size_t n; } Body;

static size_t on_body(char *p, size_t sz, size_t nm, void *user)
{
    Body *b = user;
    size_t k = sz * nm;
    if (b->n + k > (64u << 20)) return 0;
    b->p = xrealloc(b->p, b->n + k + 1);
    memcpy(b->p + b->n, p, k);
    b->n += k;
    b->p[b->n] = 0;
    return k;
}

static int diagnose_url(const char *url, int as_json)
{
    char full[2048];
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') n--;
    snprintf(full, sizeof full, "%.*s/v1/diagnosis", (int)n, url);
    CURL *c = curl_easy_init();
    Body b = {0};
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) fatal("diagnose: %s: %s", full, curl_easy_strerror(rc));
    if (status != 200) fatal("diagnose: %s answered %ld: %s", full, status, b.p ? b.p : "");
    json_error_t je;
    json_t *o = json_loads(b.p ? b.p : "", 0, &je);
    if (!o || !json_is_string(json_object_get(o, "verdict"))) fatal("diagnose: %s: not a diagnosis: %.200s", full, b.p ? b.p : "");
    if (as_json) out_printf("%s\n", b.p);
    else report_print_json(stdout, o);
    json_decref(o);
    free(b.p);
    return 0;
}

/* ---- --model: a built-in load ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int events;
} Waiter;

static void on_event(void *user, uint64_t id)
{
    (void)id;
    Waiter *w = user;
    pthread_mutex_lock(&w->mu);
    w->events++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* n_req requests of in_len pseudo-random prompt tokens and out_len generated ones each, batch
 * of them in flight at once (the engine's max running) */
static void run_load(Engine *e, int vocab, int n_req, int in_len, int out_len)
{
    Waiter w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    uint64_t *ids = xcalloc(n_req, sizeof(uint64_t));
    int *prompt = xmalloc(in_len * sizeof(int)), left = n_req;
    Rng r;
    rng_seed(&r, 7);
    for (int q = 0; q < n_req; q++) {
        for (int i = 0; i < in_len; i++) prompt[i] = 1 + (int)(rng_u64(&r) % (uint64_t)(vocab - 1));
        RequestParams p = {.prompt = prompt, .n_prompt = in_len, .max_tokens = out_len, .ignore_eos = 1};
        sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        char err[256];
        ids[q] = engine_submit(e, &p, on_event, &w, err, sizeof err);
        if (!ids[q]) fatal("diagnose: a load request was refused: %s", err);
    }
    while (left > 0) {
        pthread_mutex_lock(&w.mu);
        while (w.events == 0) pthread_cond_wait(&w.cv, &w.mu);
        w.events = 0;
        pthread_mutex_unlock(&w.mu);
        for (int q = 0; q < n_req; q++) {
            if (!ids[q]) continue;
            EngineEvent ev[64];
            int k;
            while ((k = engine_poll(e, ids[q], ev, 64)) > 0)
                if (ev[k - 1].finish != FINISH_NONE) {
                    ids[q] = 0;
                    left--;
                    break;
                }
        }
    }
    free(ids);
    free(prompt);
}

typedef struct {
    int batch, in_len, out_len, requests;
} Load;

/* one load on a fresh engine (after a warm-up engine's capture and first touches); its diagnosis */
static json_t *diagnose_load(const Model *dm, const Model *m, Backend *be, EngineOptions eo, const Load *ld, const Ceilings *ceil,
                             const ModelOpts *mo, int as_json)
{
    eo.max_running = ld->batch;
    if (eo.max_batch_tokens < ld->batch) eo.max_batch_tokens = ld->batch;
    if (eo.max_model_len <= 0 || eo.max_model_len < ld->in_len + ld->out_len + 1) eo.max_model_len = ld->in_len + ld->out_len + 16;
    double t0 = clock_now();
    Engine *e = engine_create(dm, be, &eo, m->cfg.eos_ids, m->cfg.n_eos);
    engine_start(e);
    run_load(e, m->cfg.vocab, ld->batch, ld->in_len, 4);
    engine_stop(e, 1);
    engine_free(e);
    e = engine_create(dm, be, &eo, m->cfg.eos_ids, m->cfg.n_eos);
    engine_start(e);
    run_load(e, m->cfg.vocab, ld->requests, ld->in_len, ld->out_len);
    Deployment layout = {.tp = mo->par.tp, .pp = mo->par.pp, .ep = mo->par.ep, .microbatches = mo->par.microbatches};
    Diagnosis g;
    Deployment d;
    engine_diagnose(e, ceil, &layout, &g, &d);
    log_info("diagnose: %d requests of %d + %d tokens, %d at a time, in %.1f s", ld->requests, ld->in_len, ld->out_len,
             ld->batch, clock_now() - t0);
    json_t *o = diagnosis_json(&g, &d, ceil);
    json_object_set_new(o, "load", json_pack("{s:i, s:i, s:i, s:i}", "batch", ld->batch, "input_len", ld->in_len,
                                             "output_len", ld->out_len, "requests", ld->requests));
    if (as_json) {
        out_json(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    } else {
        printf("== %d requests at a time, %d + %d tokens each\n", ld->batch, ld->in_len, ld->out_len);
        diagnosis_print(stdout, &g, &d, ceil);
        printf("\n");
    }
    fflush(stdout);
    engine_stop(e, 1);
    engine_free(e);
    return o;
}

static int diagnose_model(ModelOpts *mo, const char *device, int threads, EngineOptions *eo, const int *batches, int n_batches,
                          const Load *ld0, const char *out_dir, int as_json)
{
    device = model_dist_start(mo, device);
    Model m;
    model_open(&m, mo);
    Backend be;
    backend_open(&be, device, threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    Ceilings ceil;
    calibrate_get(&ceil, &be, dist_get(), 1, 0);
    if (model_worker(&dm, &be)) {
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        model_free(&m);
        dist_shutdown();
        return 0;
    }
    SweepRun runs[16];
    int n = 0;
    for (int k = 0; k < n_batches && n < 16; k++) {
        Load ld = *ld0;
        ld.batch = batches[k];
        if (ld.requests <= 0) ld.requests = ld.batch > 1 ? ld.batch : 2; /* one wave */
        SweepRun *r = &runs[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "batch%d", ld.batch);
        r->tp = mo->par.tp, r->pp = mo->par.pp, r->ep = mo->par.ep, r->world = r->tp * r->pp;
        r->diag = diagnose_load(&dm, &m, &be, *eo, &ld, &ceil, mo, as_json);
    }
    if (out_dir && n > 0) {
        if (report_write(runs, n, out_dir, "moeserve diagnose") != 0) log_error("diagnose: cannot write the report to %s", out_dir);
        else log_info("diagnose: report in %s/report.md (breakdown.svg, roofline.svg)", out_dir);
    }
    for (int k = 0; k < n; k++) json_decref(runs[k].diag);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    dist_shutdown();
    return 0;
}

int cmd_diagnose(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    EngineOptions eo;
    engine_options_default(&eo);
    eo.profile_every = 4;
    const char *url = NULL, *layouts = NULL, *out_dir = "diagnose-sweep", *launcher = NULL;
    int as_json = 0, sweep = 0;
    Load ld = {.batch = 16, .in_len = 64, .out_len = 32, .requests = 0};
    const char *batch_s = NULL, *report_dir = NULL;
    const OptSpec what_specs[] = {
        {.names = "--url", .type = OPT_STR, .dst = &url, .metavar = "URL",
         .help = "a running server's diagnosis (GET /v1/diagnosis)"},
        {.names = "--sweep", .type = OPT_FLAG, .dst = &sweep,
         .help = "run each of --layouts and read the scaling across them",
         .def = "off"},
        {.names = "--layouts", .type = OPT_STR, .dst = &layouts, .metavar = "tp1,tp2,pp2,ep2,tp2pp2",
         .help = "the layouts of --sweep"},
        {.names = "--out", .type = OPT_STR, .dst = &out_dir, .metavar = "DIR", .help = "the sweep's report and charts",
         .def = "diagnose-sweep"},
        {.names = "--launcher", .type = OPT_STR, .dst = &launcher, .metavar = "CMD",
         .help = "what starts a layout's ranks in a sweep", .def = "mpirun on the CPU"},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "JSON instead of text", .def = "off"},
    };
    const OptSpec load_specs[] = {
        {.names = "--batch", .type = OPT_STR, .dst = &batch_s, .metavar = "N,N,..",
         .help = "requests running at once, each in turn",
         .def = "16"},
        {.names = "--input-len", .type = OPT_INT, .dst = &ld.in_len, .metavar = "N",
         .help = "prompt tokens of a request",
         .def = "64", .lo = 1, .hi = 1 << 20},
        {.names = "--output-len", .type = OPT_INT, .dst = &ld.out_len, .metavar = "N",
         .help = "generated tokens of a request",
         .def = "32", .lo = 1, .hi = 1 << 20},
        {.names = "--requests", .type = OPT_INT, .dst = &ld.requests, .metavar = "N", .help = "requests in all",
         .def = "the batch", .lo = 1, .hi = 1 << 20},
        {.names = "--report", .type = OPT_STR, .dst = &report_dir, .metavar = "DIR",
         .help = "a markdown report and SVG charts"},
    };
    const OptGroup groups[] = {OPT_GROUP("diagnose", what_specs), OPT_GROUP("load", load_specs),
                               model_opt_group(&mo, MODEL_OPT_ALL), par_opt_group(&mo.par), device_opt_group(&dev),
                               engine_opt_group(&eo), spec_opt_group(&mo.spec), engine_diag_group(&eo)};
    const OptCommand cmd = {.cmd = "diagnose",
    .synopsis = "(--url URL | MODEL [options] | --sweep --layouts L MODEL [options])",
                            .about = "Where a deployment's step time goes and what to change: a running server's, or a "
                                     "built-in load's on an in-process engine.",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    const char *pos = NULL;
    int n_pos = 0;
    opt_parse(&cmd, argc, argv, &pos, &n_pos);
    model_opt_positional(&mo, "diagnose", n_pos ? pos : NULL, 0);
    char serr[512];
    if (spec_opts_resolve(&mo.spec, serr, sizeof serr) < 0) {
        fprintf(stderr, "error: diagnose: %s\n", serr);
        return 2;
    }
    eo.spec_k = mo.spec.k;
    eo.spec_vocab = mo.spec.draft_vocab;
    if (opt_given(&cmd, &eo.max_running)) fatal("diagnose: --batch sets the requests running at once");
    /* the options a sweep passes on to each layout's run: all but the sweep's own and the layout */
    char pass[4096] = "";
    for (int i = 1; i < argc;) {
        const OptSpec *o;
        int n = opt_span(&cmd, argc, argv, i, &o);
        int skip = !o || o->dst == &mo.par.tp || o->dst == &mo.par.pp || o->dst == &mo.par.ep ||
                   o->dst == &mo.par.ep_is_tp;
        for (size_t k = 0; k < sizeof what_specs / sizeof what_specs[0]; k++) skip |= o == &groups[0].specs[k];
        for (int k = i; k < i + n && !skip; k++) {
            size_t off = strlen(pass);
            snprintf(pass + off, sizeof pass - off, " '%s'", argv[k]);
        }
        i += n;
    }
    if (n_pos) { /* the model as an option, after the positional is gone */
        size_t off = strlen(pass);
        snprintf(pass + off, sizeof pass - off, " --model '%s'", mo.dir);
    }
    const char *device = dev.device;
    int threads = dev.threads;
    int batches[16], n_batches = 0;
    for (const char *q = batch_s ? batch_s : "16"; *q && n_batches < 16;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > (1 << 16)) fatal("diagnose: --batch '%s': a comma-separated list of batch sizes", batch_s);
        batches[n_batches++] = (int)v;
        q = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') fatal("diagnose: --batch '%s': a comma-separated list of batch sizes", batch_s);
    }
    if (url) return diagnose_url(url, as_json);
    if (!mo.dir) {
        fprintf(stderr, "error: diagnose: --url or a model is required\n");
        return 2;
    }
    if (sweep) {
        if (!layouts) fatal("diagnose --sweep: --layouts tp1,tp2,... is required");
        return report_sweep(layouts, pass, device, launcher, out_dir, as_json);
    }
    mo.dir = model_dir_resolve("diagnose", mo.dir, mo.revision, !mo.dummy);
    return diagnose_model(&mo, device, threads, &eo, batches, n_batches, &ld, report_dir, as_json);
}
