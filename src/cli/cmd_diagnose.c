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
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"
#include "../engine/engine.h"
#include "../diag/beside.h"
#include "../diag/placement.h"
#include "../diag/report.h"
#include "../dist/dist.h"
#include "../backend/sim/sim.h"
#include "../cost/cost.h"
#include "../cost/deploy.h"
#include "cli.h"

/* The ceilings as a device profile `plan --gpu FILE` reads (src/cost/cost.h), links included when
 * several ranks measured them: the roofs measured here, the efficiencies of the nearest built-in
 * profile (marked estimated: calibrate measures roofs, not the engine's kernels), the ceilings'
 * own fields beside them. */
static json_t *calibrate_profile_json(const Ceilings *c, Backend *be)
{
    const char *base = cost_device_for(c->device, c->gpu); /* an unknown card: the nearest measured one's */
    if (!base) base = "h200";
    CostDevice d;
    char err[512];
    if (cost_device_load(&d, base, err, sizeof err)) die("built-in profile %s: %s", base, err);
    snprintf(d.name, sizeof d.name, "local");
    snprintf(d.description, sizeof d.description, "%.250s", c->device);
    snprintf(d.source, sizeof d.source, "moeserve calibrate, %s: read bandwidth and tensor rate measured; efficiencies, "
             "host overhead carried over from the built-in profile %s", c->when, base);
    d.estimated = 1;
    d.read_gbps = c->read_gbps;
    d.bf16_tflops = c->bf16_tflops;
    d.fp8_tflops = c->fp8_tflops;
    d.fp4_tflops = c->fp4_tflops;
    d.memory_bytes = (double)be_mem_free(be);
    json_t *o = ceilings_json(c), *dj = cost_device_json(&d);
    json_object_update(o, dj);
    json_decref(dj);
    if (c->ranks > 1 && c->allreduce_gbps > 0) { /* `plan --link FILE` reads this object */
        int hops = 0;
        while ((1 << hops) < c->tp) hops++;
        CostLink l = {.bus_gbps = c->allreduce_gbps, .p2p_gbps = c->p2p_gbps > 0 ? c->p2p_gbps : c->allreduce_gbps,
                      .latency_us = c->allreduce_us / (2.0 * (hops > 0 ? hops : 1))};
        snprintf(l.name, sizeof l.name, "local");
        snprintf(l.description, sizeof l.description, "%.250s", c->link);
        snprintf(l.source, sizeof l.source, "moeserve calibrate, %s, %d ranks (tp %d, pp %d)", c->when, c->ranks, c->tp, c->pp);
        json_object_set_new(o, "link_profile", cost_link_json(&l));
    }
    return o;
}

int cmd_calibrate(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    int quick = 0, as_json = 0, force = 0;
    const OptSpec specs[] = {
        {.names = "--quick", .type = OPT_FLAG, .dst = &quick, .help = "shorter measurements", .def = "off"},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON object", .def = "off"},
        {.names = "--force", .type = OPT_FLAG, .dst = &force,
         .help = "cache the figures even when the machine is busy (else a quiet machine's cached ones stay)",
         .def = "off"},
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
    CalResult res = calibrate_get(&c, &be, dist_get(), quick, force ? CAL_FORCE : CAL_MEASURE);
    Dist *d = dist_get();
    if (!d || d->rank == 0) {
        if (as_json) {
            json_t *o = calibrate_profile_json(&c, &be);
            json_object_set_new(o, "cached", json_boolean(res == CAL_SAVED));
            out_json(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
            json_decref(o);
        } else {
            ceilings_print(&c);
            if (res == CAL_KEPT_CACHE)
                printf("not cached: the machine was busy; the profile of a quiet machine stays "
                       "(--force replaces it)\n");
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

/* The device profile a prediction of this run uses: the modelled device's own (sim:NAME), the
 * built-in profile of the GPU by its name, the CPU's; NULL when no profile describes the device
 * (then diagnose shows no prediction). */
static const char *beside_profile(const char *device, const Ceilings *ceil, char *buf, size_t n)
{
    if (device && !strncmp(device, "sim:", 4)) {
        snprintf(buf, n, "%s", device + 4);
        buf[strcspn(buf, ",")] = 0;
        return buf;
    }
    return cost_device_for(ceil->device, ceil->gpu);
}

/* What the cost model predicts for this deployment and load (`plan` of one wave of the load's batch
 * of requests, serve's scheduler as the engine runs it): 0 and b filled, or -1 (said why at info level). */
static int beside_predict(const ModelOpts *mo, const EngineOptions *eo, const Load *ld, const char *profile, int ranks,
                          const Deployment *d, Beside *b)
{
    char err[512];
    CostDevice dev, host;
    CostLink link;
    ModelConfig *whole = xcalloc(1, sizeof *whole);
    int rc = -1;
    if (cost_device_load(&dev, profile, err, sizeof err) || cost_device_load(&host, "cpu", err, sizeof err) ||
        cost_link_load(&link, !dev.gpu && ranks > 1 ? "cpu-shm" : dev.default_link[0] ? dev.default_link : "nvlink4", err,
                       sizeof err) ||
        config_load(whole, mo->dir, err, sizeof err)) {
        log_info("diagnose: no prediction beside the measurement: %s", err);
        free(whole);
        return -1;
    }
    const char *q = mo->dummy_quant ? mo->dummy_quant : "nvfp4";
    CostSetup s = {.dir = mo->dir, .dummy_fmt = !strcmp(q, "fp8") ? QF_FP8 : !strcmp(q, "bf16") ? QF_BF16 : QF_NVFP4,
                   .num_layers = mo->num_layers, .dev = &dev, .host = &host, .link = &link, .node_link = &link,
                   .gpus_per_node = ranks, .nodes = 1, .input_len = ld->in_len, .output_len = ld->out_len,
                   .max_running = eo->max_running, .max_batch_tokens = eo->max_batch_tokens,
                   .chunked_prefill = eo->chunked_prefill, .decode_steps = eo->decode_steps,
                   .microbatches = mo->par.microbatches, .kv_dtype = mo->kv_dtype, .wave = 1,
                   .wave_every = eo->profile_every, .spec_k = eo->spec_k, .spec_vocab = eo->spec_vocab,
                   .spec_accept = cost_spec_accept(d->spec_chains, d->spec_accepted, eo->spec_k)};
    CostLayout lo = {.tp = mo->par.tp, .pp = mo->par.pp, .ep = mo->par.ep, .dp = mo->par.dp > 1 ? mo->par.dp : 1};
    CostPlan *plan = xcalloc(1, sizeof *plan);
    cost_plan(&s, whole, &lo, &ld->batch, 1, plan);
    if (!plan->allowed || !plan->fits || plan->n_points < 1) {
        log_info("diagnose: no prediction beside the measurement: %s", plan->why[0] ? plan->why : "the layout does not fit");
    } else {
        const CostPoint *pt = &plan->points[0];
        memset(b, 0, sizeof *b);
        snprintf(b->profile, sizeof b->profile, "%s", dev.name);
        snprintf(b->layout, sizeof b->layout, "%s", plan->name);
        b->step_ms = pt->step_ms;
        for (int c = 0; c < SC_COUNT && c < CP_COUNT; c++) b->ms[c] = pt->share[c] * pt->step_ms;
        rc = 0;
        /* with drafts and chains to measure them by: the same load with 0, 1, ... drafts a step at
           the acceptance measured (one more than this run's, three at least) */
        if (eo->spec_k > 0 && d->spec_chains > 0) {
            int n = eo->spec_k + 2 > 4 ? eo->spec_k + 2 : 4;
            b->n_spec = n < BESIDE_MAX_SPEC ? n : BESIDE_MAX_SPEC;
            b->spec_now = eo->spec_k < b->n_spec ? eo->spec_k : b->n_spec - 1;
            b->spec_accept = s.spec_accept;
            for (int k = 0; k < b->n_spec; k++) {
                s.spec_k = k;
                cost_plan(&s, whole, &lo, &ld->batch, 1, plan);
                b->spec_tpot[k] = plan->n_points > 0 ? plan->points[0].tpot_ms : 0;
                if (b->spec_tpot[k] <= 0) b->n_spec = 0; /* no figure: no comparison */
            }
        }
    }
    free(plan);
    free(whole);
    return rc;
}

/* one load on a fresh engine (after a warm-up engine's capture and first touches); its diagnosis */
static json_t *diagnose_load(const Model *dm, const Model *m, Backend *be, EngineOptions eo, const Load *ld,
                             const Ceilings *ceil, const Placement *pl, const ModelOpts *mo, const char *profile, int as_json)
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
    Deployment layout = {.tp = mo->par.tp, .pp = mo->par.pp, .ep = mo->par.ep, .dp = mo->par.dp, .microbatches = mo->par.microbatches};
    Diagnosis g;
    Deployment d;
    engine_diagnose(e, ceil, &layout, &g, &d);
    if (pl->shares_cores) {
        char ev[320];
        snprintf(ev, sizeof ev,
                 "the ranks share cores, so every figure here includes their taking turns on them: %.200s", pl->why);
        diagnosis_note(&g, ev,
                       "give each rank cores of its own (mpirun binds a rank to a core when there are cores "
                       "enough; --threads times the ranks of a host at most its cores)");
    }
    log_info("diagnose: %d requests of %d + %d tokens, %d at a time, in %.1f s", ld->requests, ld->in_len, ld->out_len,
             ld->batch, clock_now() - t0);
    Beside bs;
    int have_plan = profile && beside_predict(mo, &eo, ld, profile, mo->par.tp * mo->par.pp, &d, &bs) == 0;
    int best = have_plan ? beside_spec_best(&bs) : -1;
    /* the model's comparison of draft counts is advice only where it holds for this run's own step */
    double big = bs.step_ms > g.step_ms ? bs.step_ms : g.step_ms;
    int trusted = have_plan && big > 0 && fabs(bs.step_ms - g.step_ms) <= BESIDE_DISAGREE * big;
    if (best >= 0 && best != bs.spec_now && !trusted) {
        char ev[320];
        snprintf(ev, sizeof ev, "the cost model's step (%.3f ms) is more than %.0f%% from the measured one (%.3f ms): "
                 "no advice on the drafts a step from it (its TPOT by drafts a step is in the plan beside)",
                 bs.step_ms, 100 * BESIDE_DISAGREE, g.step_ms);
        diagnosis_note(&g, ev, NULL);
    } else if (best >= 0 && best != bs.spec_now) { /* what the drafts a step should be, at the acceptance measured */
        char ev[320], adv[320];
        snprintf(ev, sizeof ev, "at the measured acceptance (%.2f a draft), the cost model gives a TPOT of %.3f ms with %d "
                 "drafts a step (this run) and %.3f ms with %d", bs.spec_accept, bs.spec_tpot[bs.spec_now], bs.spec_now,
                 bs.spec_tpot[best], best);
        if (best == 0)
            snprintf(adv, sizeof adv, "leave out speculative decoding: at this acceptance its drafts cost more than they "
                     "give (or train the MTP layer further, or draft from fewer ids: draft_vocab_size)");
        else
            snprintf(adv, sizeof adv, "draft %d tokens a step (\"num_speculative_tokens\": %d, --speculative-num-steps %d)",
                     best, best, best);
        diagnosis_note(&g, ev, adv);
    }
    json_t *o = diagnosis_json(&g, &d, ceil);
    json_object_set_new(o, "placement", placement_json(pl));
    json_object_set_new(o, "load", json_pack("{s:i, s:i, s:i, s:i}", "batch", ld->batch, "input_len", ld->in_len,
                                             "output_len", ld->out_len, "requests", ld->requests));
    if (have_plan) {
        beside_compare(&g, &bs);
        json_object_set_new(o, "plan", beside_json(&g, &bs));
    }
    if (as_json) {
        out_json(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    } else {
        printf("== %d requests at a time, %d + %d tokens each\n", ld->batch, ld->in_len, ld->out_len);
        diagnosis_print(stdout, &g, &d, ceil);
        if (have_plan) beside_print(stdout, &g, &bs);
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
    calibrate_get(&ceil, &be, dist_get(), 1, CAL_CACHED);
    Placement pl; /* every rank takes part */
    placement_get(&pl, &be, dist_get());
    char pbuf[256];
    const char *profile = beside_profile(device, &ceil, pbuf, sizeof pbuf);
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
        r->diag = diagnose_load(&dm, &m, &be, *eo, &ld, &ceil, &pl, mo, profile, as_json);
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
    model_opt_device(&mo, device);
    mo.dir = model_dir_resolve("diagnose", mo.dir, mo.revision, !mo.dummy);
    return diagnose_model(&mo, device, threads, &eo, batches, n_batches, &ld, report_dir, as_json);
}
