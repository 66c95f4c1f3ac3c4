/* cmd_serve: `moeserve serve MODEL [options]` runs the OpenAI-compatible server
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
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:i, s:s, s:{s:i, s:i, s:i}, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:i, s:f, s:b, s:b}",
                          "device", dev, "model_path", mo->dir, "architecture", m->cfg.architecture,
                          "dummy_weights", mo->dummy, "num_layers", m->cfg.n_layers,
                          "kv_cache_dtype", model_kv_dtype_name(dm->cfg.kv_dtype),
                          "layout", "tp", mo->par.tp > 0 ? mo->par.tp : 1, "pp", mo->par.pp > 0 ? mo->par.pp : 1,
                          "ep", mo->par.ep > 0 ? mo->par.ep : 1,
                          "max_running_requests", eo->max_running, "max_batch_tokens", eo->max_batch_tokens,
                          "chunked_prefill_size", eo->chunked_prefill, "max_model_len", max_len,
                          "num_continuous_decode_steps", eo->decode_steps, "kv_block_size", eo->block_size,
                          "kv_tokens", (json_int_t)st.kv_blocks_total * eo->block_size, "profile_every", eo->profile_every,
                          "diagnosis_window_s", eo->diag_window_s,
                          "cuda_graph", !eo->no_graphs && be->ops->graph_begin && !be->host_memory, "prefix_caching", eo->prefix_caching);
    if (eo->spec_k > 0) /* SGLang's names for the drafter's settings */
        json_object_set_new(o, "speculative", json_pack("{s:s, s:i, s:i}", "algorithm", "NEXTN", "num_steps", eo->spec_k,
                                                        "draft_vocab", eo->spec_vocab));
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
    DeviceOpts dev = {0};
    HttpOptions ho;
    http_options_default(&ho);
    EngineOptions eo;
    engine_options_default(&eo);
    ApiOptions ao;
    api_options_default(&ao);
    const OptGroup groups[] = {model_opt_group(&mo, MODEL_OPT_ALL), par_opt_group(&mo.par), device_opt_group(&dev),
                               engine_opt_group(&eo), spec_opt_group(&mo.spec), http_opt_group(&ho), api_opt_group(&ao),
                               engine_diag_group(&eo)};
    const OptCommand cmd = {.cmd = "serve", .synopsis = "MODEL [options]",
                            .about = "The OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, "
                                     "/health, /metrics.\nMODEL is a directory or a Hugging Face Hub id (ORG/NAME).",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    eo.spec_k = mo.spec.k;
    eo.spec_vocab = mo.spec.draft_vocab;
    if (opt_given(&cmd, &eo.kv_fraction) && opt_given(&cmd, &eo.n_blocks))
        fatal("serve: --kv-fraction and --num-kv-blocks exclude each other");
    const char *device = dev.device, *api_key = ao.api_key, *script = ao.script_path;
    const char *name = ao.names.n ? ao.names.v[0] : NULL;
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
    model_opt_device(&mo, device);
    mo.dir = model_dir_resolve("serve", mo.dir, mo.revision, !mo.dummy);
    device = model_dist_start(&mo, device);
    /* the port first: a taken one fails now, not after minutes of loading; until the model is
     * ready /health answers 503 "loading" (rank 0 alone serves) */
    Metrics metrics;
    metrics_init(&metrics);
    Api api = {.model_name = name, .model_alias = alias[0] ? alias : NULL, .api_key = api_key, .created = (int64_t)time(NULL),
               .metrics = &metrics, .script_path = script, .loading = 1,
               .more_names = ao.names.n > 1 ? ao.names.v + 1 : NULL, .n_more_names = ao.names.n > 1 ? ao.names.n - 1 : 0,
               .seeded = ao.seed >= 0, .default_seed = ao.seed, .tool_parser = ao.tool_parser};
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
    if (ao.chat_template && model_text_use_template(&mt, ao.chat_template, err, sizeof err) < 0)
        fatal("serve: %s", err);
    if (!mt.chat) log_warn("serve: %s; /v1/chat/completions will answer 400", mt.chat_err);
    if (tokenizer_vocab_size(mt.tok) > m.cfg.vocab) { /* an added token too many: the model has no row for it */
        const char *first = tokenizer_token(mt.tok, m.cfg.vocab);
        log_warn("serve: the tokenizer has %d token ids, the model's vocabulary %d: a prompt holding one from id %d ('%s') on "
                 "will be refused (400)", tokenizer_vocab_size(mt.tok), m.cfg.vocab, m.cfg.vocab, first ? first : "?");
    }
    Backend be;
    backend_open(&be, device, dev.threads);
    cli_sim_tokens(&be, &mt, m.cfg.vocab);
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
    api.layout = (Deployment){.tp = mo.par.tp, .pp = mo.par.pp, .ep = mo.par.ep, .dp = mo.par.dp, .microbatches = mo.par.microbatches};
    const char *markup = openai_template_tool_parser(&api);
    if (ao.tool_parser && !markup)
        log_info("serve: --tool-call-parser %s: the chat template writes no GLM tool call; calls in the output are "
                 "parsed in either markup", ao.tool_parser);
    else if (ao.tool_parser && strcmp(markup, ao.tool_parser))
        log_info("serve: --tool-call-parser %s overrides the chat template's markup (%s) where tool_choice forces a "
                 "call", ao.tool_parser, markup);
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
    int left = http_wait_idle(h, ho.drain_timeout_s);
    if (left) log_warn("serve: %d connections still open after %d s (slow readers): closing them", left,
    ho.drain_timeout_s);
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
