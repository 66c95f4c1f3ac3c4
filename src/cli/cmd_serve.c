/* cmd_serve: `moeserve serve --model DIR [options]` runs the OpenAI-compatible server
 * (src/server/) over the engine (src/engine/): it loads the model, its tokenizer and chat
 * template, starts the engine thread and the HTTP threads, prints "listening on
 * http://HOST:PORT" once requests are accepted, and on SIGINT or SIGTERM stops accepting,
 * lets every accepted request finish (drain), and exits 0. --port 0 picks a free port.
 * --script-output FILE is a test hook, not for serving: every request's output is forced to be
 * the tokenization of FILE's text (read at each request) then eos, whatever the model samples
 * (tests/unit/test_server_tools.c scripts GLM tool calls with it). */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../base/util.h"
#include "../engine/engine.h"
#include "../format/model_text.h"
#include "../server/http.h"
#include "../server/metrics.h"
#include "../server/openai.h"
#include "../diag/calibrate.h"
#include "../dist/dist.h"
#include "cli.h"

#define SERVE_USAGE "moeserve serve " MODEL_OPTS_USAGE " [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] " \
                    "[--api-key KEY] [--device cpu|cuda] [--threads N] [--max-running-requests N] [--max-batch-tokens N] " \
                    "[--chunked-prefill-size N] [--max-model-len N] [--kv-fraction F | --num-kv-blocks N] " \
                    "[--num-continuous-decode-steps N] [--no-prefix-caching] [--max-queue N] [--max-body MB] " \
                    "[--max-connections N] [--max-connections-per-client N] [--header-timeout S] [--body-min-rate KB] " \
                    "[--http-threads N] [--drain-timeout S] [--disable-cuda-graph] [--script-output FILE] " \
                    DIAG_OPTS_USAGE

/* Open files: a connection is a descriptor; raise the soft limit to the hard one. */
static void raise_fd_limit(int want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < (rlim_t)want + 64) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)want + 64 ? rl.rlim_max : (rlim_t)want + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* GET /get_server_info (SGLang's path; bench serve records it with each run): what runs where,
 * as the run was configured. */
static char *server_info(const ModelOpts *mo, const Model *m, const Model *dm, const Backend *be, const char *device,
                         const EngineOptions *eo, Engine *e, int max_len)
{
    char dev[256];
    backend_describe(be, device, dev, sizeof dev);
    EngineStats st;
    engine_stats(e, &st);
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:i, s:s, s:{s:i, s:i, s:i}, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:i, s:b, s:b}",
                          "device", dev, "model_path", mo->dir, "architecture", m->cfg.architecture,
                          "dummy_weights", mo->dummy, "num_layers", m->cfg.n_layers,
                          "kv_cache_dtype", model_kv_dtype_name(dm->cfg.kv_dtype),
                          "layout", "tp", mo->par.tp > 0 ? mo->par.tp : 1, "pp", mo->par.pp > 0 ? mo->par.pp : 1,
                          "ep", mo->par.ep > 0 ? mo->par.ep : 1,
                          "max_running_requests", eo->max_running, "max_batch_tokens", eo->max_batch_tokens,
                          "chunked_prefill_size", eo->chunked_prefill, "max_model_len", max_len,
                          "num_continuous_decode_steps", eo->decode_steps, "kv_block_size", eo->block_size,
                          "kv_tokens", (json_int_t)st.kv_blocks_total * eo->block_size, "profile_every", eo->profile_every,
                          "cuda_graph", !eo->no_graphs && strcmp(be->name, "cpu") != 0, "prefix_caching", eo->prefix_caching);
    if (mo->dummy) json_object_set_new(o, "dummy_quant", json_string(mo->dummy_quant ? mo->dummy_quant : "nvfp4"));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

int cmd_serve(int argc, char **argv)
{
    /* SIGINT and SIGTERM are taken by sigwait below: block them before any thread exists (the
     * model loader's OpenMP threads included) so that every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ModelOpts mo = {0};
    HttpOptions ho;
    http_options_default(&ho);
    EngineOptions eo;
    engine_options_default(&eo);
    const char *name = NULL, *api_key = NULL, *device = NULL, *script = NULL;
    int threads = 0, help = 0, no_prefix = 0, max_body_mb = (int)(ho.max_body >> 20), drain_s = 60;
    int body_rate_kb = (int)(ho.body_min_rate >> 10);
    double kv_fraction = -1;
    for (int i = 1; i < argc; i++) {
        if (opt_model(argc, argv, &i, &mo) || opt_str(argc, argv, &i, "--host", &ho.host) ||
            opt_int(argc, argv, &i, "--port", 0, 65535, &ho.port) ||
            opt_str(argc, argv, &i, "--served-model-name", &name) || opt_str(argc, argv, &i, "--api-key", &api_key) ||
            opt_str(argc, argv, &i, "--device", &device) || opt_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            opt_int(argc, argv, &i, "--max-running-requests", 1, 1 << 16, &eo.max_running) ||
            opt_int(argc, argv, &i, "--max-batch-tokens", 1, 1 << 24, &eo.max_batch_tokens) ||
            opt_int(argc, argv, &i, "--chunked-prefill-size", 1, 1 << 24, &eo.chunked_prefill) ||
            opt_int(argc, argv, &i, "--max-model-len", 2, 1 << 24, &eo.max_model_len) ||
            opt_double(argc, argv, &i, "--kv-fraction", 0.01, 1.0, &kv_fraction) ||
            opt_int(argc, argv, &i, "--num-kv-blocks", 1, 1 << 30, &eo.n_blocks) ||
            opt_int(argc, argv, &i, "--num-continuous-decode-steps", 1, 1024, &eo.decode_steps) ||
            opt_flag(argv, &i, "--no-prefix-caching", &no_prefix) ||
            opt_int(argc, argv, &i, "--max-queue", 0, 1 << 24, &eo.max_queue) ||
            opt_int(argc, argv, &i, "--max-body", 1, 1 << 12, &max_body_mb) ||
            opt_int(argc, argv, &i, "--max-connections", 1, 1 << 16, &ho.max_connections) ||
            opt_int(argc, argv, &i, "--max-connections-per-client", 0, 1 << 16, &ho.max_per_client) ||
            opt_int(argc, argv, &i, "--header-timeout", 0, 86400, &ho.header_timeout_s) ||
            opt_int(argc, argv, &i, "--body-min-rate", 0, 1 << 20, &body_rate_kb) ||
            opt_int(argc, argv, &i, "--http-threads", 1, 256, &ho.threads) ||
            opt_int(argc, argv, &i, "--drain-timeout", 0, 86400, &drain_s) ||
            opt_str(argc, argv, &i, "--script-output", &script) ||
            opt_flag(argv, &i, "--disable-cuda-graph", &eo.no_graphs) || engine_opt_diag(argc, argv, &i, &eo) ||
            opt_flag(argv, &i, "--help", &help))
            continue;
        opt_unknown("serve", argv[i], SERVE_USAGE);
    }
    if (help) { printf("usage: %s\n", SERVE_USAGE); return 0; }
    if (!mo.dir) {
        fprintf(stderr, "error: serve: --model is required\nusage: %s\n", SERVE_USAGE);
        return 2;
    }
    if (kv_fraction > 0 && eo.n_blocks > 0) fatal("serve: --kv-fraction and --num-kv-blocks exclude each other");
    if (kv_fraction > 0) eo.kv_fraction = kv_fraction;
    if (no_prefix) eo.prefix_caching = 0;
    ho.max_body = (size_t)max_body_mb << 20;
    ho.body_min_rate = (size_t)body_rate_kb << 10;
    raise_fd_limit(ho.max_connections);
    /* the model's name: --served-model-name, else --model as given (as vLLM); then its last
     * path component is accepted too */
    char alias[256] = "";
    if (!name) {
        name = mo.dir;
        size_t n = strlen(mo.dir);
        while (n > 1 && mo.dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && mo.dir[b - 1] != '/') b--;
        if (n - b < sizeof alias && b > 0) snprintf(alias, sizeof alias, "%.*s", (int)(n - b), mo.dir + b);
    }
    mo.dir = model_dir_resolve("serve", mo.dir, mo.revision, !mo.dummy);
    device = model_dist_start(&mo, device);
    /* the port first: a taken one fails now, not after minutes of loading; until the model is
     * ready /health answers 503 "loading" (rank 0 alone serves) */
    Metrics metrics;
    metrics_init(&metrics);
    Api api = {.model_name = name, .model_alias = alias[0] ? alias : NULL, .api_key = api_key, .created = (int64_t)time(NULL),
               .metrics = &metrics, .script_path = script, .loading = 1};
    char err[512];
    HttpServer *h = NULL;
    if (!dist_get() || dist_get()->rank == 0) {
        h = http_start(&ho, &api, err, sizeof err);
        if (!h) fatal("serve: %s", err);
        log_info("serve: bound %s:%d; loading the model (/health answers 503 until it is ready)", ho.host, http_port(h));
    }
    Model m;
    model_open(&m, &mo);
    ModelText mt;
    model_text_open(&mt, mo.dir, m.cfg.eos_ids, m.cfg.n_eos);
    if (!mt.chat) log_warn("serve: %s; /v1/chat/completions will answer 400", mt.chat_err);
    if (tokenizer_vocab_size(mt.tok) > m.cfg.vocab) { /* an added token too many: the model has no row for it */
        const char *first = tokenizer_token(mt.tok, m.cfg.vocab);
        log_warn("serve: the tokenizer has %d token ids, the model's vocabulary %d: a prompt holding one from id %d ('%s') on "
                 "will be refused (400)", tokenizer_vocab_size(mt.tok), m.cfg.vocab, m.cfg.vocab, first ? first : "?");
    }
    Backend be;
    backend_open(&be, device, threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    /* the roofs the diagnosis compares against (cached per machine; every rank takes part) */
    Ceilings ceil;
    if (eo.profile_every > 0) calibrate_get(&ceil, &be, dist_get(), 1, 0);
    if (model_worker(&dm, &be)) { /* rank 0 serves; this rank repeats its steps */
        metrics_free(&metrics);
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        model_text_free(&mt);
        model_free(&m);
        dist_shutdown();
        return 0;
    }
    Engine *e = engine_create(&dm, &be, &eo, mt.eos_ids, mt.n_eos);
    engine_start(e);

    int max_len = engine_max_model_len(e);
    char *info = server_info(&mo, &m, &dm, &be, device, &eo, e, max_len);
    api.engine = e;
    api.text = &mt;
    api.max_model_len = max_len;
    api.vocab = m.cfg.vocab;
    api.ceilings = eo.profile_every > 0 ? &ceil : NULL;
    api.server_info = info;
    api.layout = (Deployment){.tp = mo.par.tp, .pp = mo.par.pp, .ep = mo.par.ep, .microbatches = mo.par.microbatches};
    if (script) log_warn("serve: --script-output %s: every output is scripted (a test hook), not the model's", script);
    __atomic_store_n(&api.loading, 0, __ATOMIC_RELEASE); /* every field above is visible to the HTTP threads first */
    log_info("serve: model %s (%s) as '%s' on %s, context %d tokens%s", mo.dir, m.cfg.architecture, name, be.name, max_len,
             api_key ? ", API key required" : "");
    printf("listening on http://%s:%d\n", ho.host, http_port(h));
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    log_info("serve: %s: no new requests; draining the accepted ones", sig == SIGINT ? "SIGINT" : "SIGTERM");
    api.draining = 1;
    http_quiesce(h);
    engine_stop(e, 1);
    int left = http_wait_idle(h, drain_s);
    if (left) log_warn("serve: %d connections still open after %d s (slow readers): closing them", left, drain_s);
    http_stop(h);
    engine_free(e);
    free(info);
    metrics_free(&metrics);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_text_free(&mt);
    model_free(&m);
    dist_shutdown();
    log_info("serve: stopped");
    return 0;
}
