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

#define CAL_USAGE "moeserve calibrate [--device cpu|cuda] [--threads N] [--quick] [--json] [--tp N --pp N] (several ranks: under mpirun on the CPU)"
#define DIAG_USAGE "moeserve diagnose (--url URL | " MODEL_OPTS_USAGE " [--device cpu|cuda] [--threads N] [--batch N,N,..] " \
                   "[--input-len N] [--output-len N] [--requests N] [--report DIR] " DIAG_OPTS_USAGE " [--disable-cuda-graph] | --sweep " \
                   "--layouts tp1,tp2,pp2,ep2,tp2pp2 --model DIR [--out DIR] [--launcher CMD] [load options]) [--json]"

int cmd_calibrate(int argc, char **argv)
{
    ModelOpts mo = {0};
    const char *device = NULL;
    int threads = 0, quick = 0, as_json = 0, help = 0;
    for (int i = 1; i < argc; i++) {
        if (opt_str(argc, argv, &i, "--device", &device) || opt_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            opt_flag(argv, &i, "--quick", &quick) || opt_flag(argv, &i, "--json", &as_json) ||
            par_opt(argc, argv, &i, &mo.par) || opt_flag(argv, &i, "--help", &help))
            continue;
        opt_unknown("calibrate", argv[i], CAL_USAGE);
    }
    if (help) { printf("usage: %s\n", CAL_USAGE); return 0; }
    device = model_dist_start(&mo, device);
    Backend be;
    backend_open(&be, device, threads);
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
    EngineOptions eo;
    engine_options_default(&eo);
    eo.profile_every = 4;
    const char *url = NULL, *device = NULL, *layouts = NULL, *out_dir = "diagnose-sweep", *launcher = NULL;
    int threads = 0, as_json = 0, help = 0, sweep = 0;
    Load ld = {.batch = 16, .in_len = 64, .out_len = 32, .requests = 0};
    const char *batch_s = NULL, *report_dir = NULL;
    /* the options a sweep passes on to each layout's run */
    char pass[4096] = "";
    for (int i = 1; i < argc; i++) {
        int at = i;
        if (opt_str(argc, argv, &i, "--url", &url) || opt_str(argc, argv, &i, "--layouts", &layouts) ||
            opt_str(argc, argv, &i, "--out", &out_dir) || opt_str(argc, argv, &i, "--launcher", &launcher) ||
            opt_flag(argv, &i, "--sweep", &sweep) || opt_flag(argv, &i, "--json", &as_json) ||
            opt_flag(argv, &i, "--help", &help))
            continue;
        if (opt_model(argc, argv, &i, &mo) || opt_str(argc, argv, &i, "--device", &device) ||
            opt_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            opt_str(argc, argv, &i, "--batch", &batch_s) || opt_str(argc, argv, &i, "--report", &report_dir) ||
            opt_int(argc, argv, &i, "--input-len", 1, 1 << 20, &ld.in_len) ||
            opt_int(argc, argv, &i, "--output-len", 1, 1 << 20, &ld.out_len) ||
            opt_int(argc, argv, &i, "--requests", 1, 1 << 20, &ld.requests) ||
            opt_int(argc, argv, &i, "--max-batch-tokens", 1, 1 << 24, &eo.max_batch_tokens) ||
            opt_flag(argv, &i, "--disable-cuda-graph", &eo.no_graphs) || engine_opt_diag(argc, argv, &i, &eo)) {
            for (int k = at; k <= i; k++) {
                if (!strcmp(argv[k], "--tp") || !strcmp(argv[k], "--pp") || !strcmp(argv[k], "--ep")) {
                    k++; /* a sweep's layouts set these */
                    continue;
                }
                size_t o = strlen(pass);
                snprintf(pass + o, sizeof pass - o, " '%s'", argv[k]);
            }
            continue;
        }
        opt_unknown("diagnose", argv[i], DIAG_USAGE);
    }
    if (help) { printf("usage: %s\n", DIAG_USAGE); return 0; }
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
        fprintf(stderr, "error: diagnose: --url or --model is required\nusage: %s\n", DIAG_USAGE);
        return 2;
    }
    if (sweep) {
        if (!layouts) fatal("diagnose --sweep: --layouts tp1,tp2,... is required");
        return report_sweep(layouts, pass, device, launcher, out_dir, as_json);
    }
    mo.dir = model_dir_resolve("diagnose", mo.dir, mo.revision, !mo.dummy);
    return diagnose_model(&mo, device, threads, &eo, batches, n_batches, &ld, report_dir, as_json);
}
