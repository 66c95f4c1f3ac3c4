/* cmd_generate: `moeserve generate --model DIR (--prompt S | --chat S) [sampling options]`
 * streams the continuation to stdout as it is sampled and prints prefill and decode speed to
 * stderr at the end. --chat renders the message through the model's chat template (with an
 * optional --system message); --prompt encodes the text as is, with the tokenizer's special
 * tokens. Sampling defaults come from the model's generation_config.json, as in vLLM. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../engine/runner.h"
#include "../engine/sampler.h"
#include "../format/model_text.h"
#include "../dist/dist.h"
#include "cli.h"

#define GEN_USAGE "moeserve generate --model DIR|ORG/NAME [--revision R] (--prompt S | --chat S [--system S]) " \
                  "[--max-tokens N] " \
                  "[--temperature T] [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R] " \
                  "[--frequency-penalty F] [--presence-penalty P] [--seed N] [--stop S]... [--stop-token-ids ID,...] [--ignore-eos] " \
                  "[--device cpu|cuda] [--threads N] [--chunk N] [--no-graphs] " KV_DTYPE_USAGE " " PAR_OPTS_USAGE
#define GEN_MAX_STOPS 8

/* First index where one of the stop strings occurs in text[0..n), or -1. */
static long find_stop(const char *text, size_t n, const char *const *stops, int n_stops)
{
    long best = -1;
    for (int i = 0; i < n_stops; i++) {
        const char *p = memmem(text, n, stops[i], strlen(stops[i]));
        if (p && (best < 0 || p - text < best)) best = p - text;
    }
    return best;
}

int cmd_generate(int argc, char **argv)
{
    const char *dir = NULL, *revision = NULL, *prompt = NULL, *chat = NULL, *system_msg = NULL, *device = NULL;
    const char *stops[GEN_MAX_STOPS], *stop_ids_s = NULL;
    int n_stops = 0, max_tokens = 128, threads = 0, chunk = 256, ignore_eos = 0, help = 0, no_graphs = 0;
    ParOpts par = {0};
    double temperature = -1, top_p = -1, min_p = -1, rep = -1, freq = 0, pres = 0;
    int top_k = -2, seed = -1;
    KVDtype kv_dtype = KV_DTYPE_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *stop;
        if (opt_str(argc, argv, &i, "--stop", &stop)) {
            if (n_stops == GEN_MAX_STOPS) fatal("generate: at most %d --stop strings", GEN_MAX_STOPS);
            if (!*stop) fatal("generate: --stop needs a non-empty string");
            stops[n_stops++] = stop;
            continue;
        }
        if (opt_str(argc, argv, &i, "--model", &dir) || opt_str(argc, argv, &i, "--revision", &revision) ||
            opt_str(argc, argv, &i, "--prompt", &prompt) ||
            opt_str(argc, argv, &i, "--stop-token-ids", &stop_ids_s) ||
            opt_str(argc, argv, &i, "--chat", &chat) || opt_str(argc, argv, &i, "--system", &system_msg) ||
            opt_str(argc, argv, &i, "--device", &device) ||
            opt_int(argc, argv, &i, "--max-tokens", 1, 1 << 20, &max_tokens) ||
            opt_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            opt_int(argc, argv, &i, "--chunk", 1, 1 << 16, &chunk) ||
            opt_double(argc, argv, &i, "--temperature", 0, 100, &temperature) ||
            opt_int(argc, argv, &i, "--top-k", -1, 1 << 30, &top_k) ||
            opt_double(argc, argv, &i, "--top-p", 1e-9, 1, &top_p) ||
            opt_double(argc, argv, &i, "--min-p", 0, 1, &min_p) ||
            opt_double(argc, argv, &i, "--repetition-penalty", 1e-3, 100, &rep) ||
            opt_double(argc, argv, &i, "--frequency-penalty", -2, 2, &freq) ||
            opt_double(argc, argv, &i, "--presence-penalty", -2, 2, &pres) ||
            opt_int(argc, argv, &i, "--seed", 0, 2147483647, &seed) || opt_flag(argv, &i, "--ignore-eos", &ignore_eos) ||
            opt_flag(argv, &i, "--no-graphs", &no_graphs) || opt_kv_cache_dtype(argc, argv, &i, &kv_dtype) ||
            opt_flag(argv, &i, "--help", &help) || par_opt(argc, argv, &i, &par))
            continue;
        opt_unknown("generate", argv[i], GEN_USAGE);
    }
    if (help) { printf("usage: %s\n", GEN_USAGE); return 0; }
    if (!dir || (!prompt == !chat)) {
        fprintf(stderr, "error: generate: --model and exactly one of --prompt or --chat are required\nusage: %s\n", GEN_USAGE);
        return 2;
    }
    if (system_msg && !chat) fatal("generate: --system goes with --chat");
    dir = model_dir_resolve("generate", dir, revision, 1);

    char err[1024];
    device = dist_setup(&par, device);
    Model m;
    model_load_shard(&m, dir, dist_get() ? dist_shard : NULL, &par);
    m.cfg.kv_dtype = kv_dtype;
    ModelText mt;
    model_text_open(&mt, dir, m.cfg.eos_ids, m.cfg.n_eos);
    const Tokenizer *tok = mt.tok;
    SamplingParams sp = mt.defaults;
    /* stop token ids end the output like an eos, and are not printed (vLLM's stop_token_ids) */
    int stop_ids[64], n_stop_ids = 0;
    for (const char *q = stop_ids_s; q && *q;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 0 || v >= m.cfg.vocab || n_stop_ids == 64)
            fatal("generate: --stop-token-ids: '%s' is not a list of ids in [0, %d)", stop_ids_s, m.cfg.vocab);
        stop_ids[n_stop_ids++] = (int)v;
        q = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') fatal("generate: --stop-token-ids: unexpected '%c'", *end);
    }
    if (temperature >= 0) sp.temperature = (float)temperature;
    if (top_p > 0) sp.top_p = (float)top_p;
    if (top_k >= -1) sp.top_k = top_k;
    if (min_p >= 0) sp.min_p = (float)min_p;
    if (rep > 0) sp.repetition_penalty = (float)rep;
    sp.frequency_penalty = (float)freq;
    sp.presence_penalty = (float)pres;
    sp.seed = seed;
    const char *bad = sampling_params_check(&sp);
    if (bad) fatal("generate: %s", bad);

    /* the prompt's ids */
    int *ids = NULL, n_ids;
    if (chat) {
        json_t *msgs = json_array();
        if (system_msg) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system_msg));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", chat));
        char *text;
        if (model_text_render(&mt, msgs, NULL, NULL, 1, &text, err, sizeof err) < 0) fatal("generate: chat template: %s", err);
        json_decref(msgs);
        n_ids = tokenizer_encode(tok, text, strlen(text), 0, &ids, err, sizeof err);
        free(text);
    } else {
        n_ids = tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, err, sizeof err);
    }
    if (n_ids < 0) fatal("generate: %s", err);
    if (n_ids == 0) fatal("generate: the prompt encodes to no tokens");
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= m.cfg.vocab) fatal("generate: token %d of the prompt is outside the model's vocabulary (%d)", ids[i], m.cfg.vocab);
    int max_ctx = n_ids + max_tokens;
    if (max_ctx > m.cfg.max_position) fatal("generate: %d prompt + %d new tokens exceed the context length %d", n_ids, max_tokens, m.cfg.max_position);

    Backend be;
    backend_open(&be, device, threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    if (model_worker(&dm, &be)) { /* rank 0 prints; this rank repeats its steps */
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        dist_shutdown();
        return 0;
    }
    Runner run;
    runner_init(&run, &dm, &be, max_ctx, chunk, 16);
    if (!no_graphs) runner_enable_graphs(&run);
    Sampler smp;
    sampler_init(&smp, &sp, m.cfg.vocab, ids, n_ids);
    Detokenizer dt;
    detok_init(&dt, tok, 1);

    int V = m.cfg.vocab;
    float *logits = xmalloc((size_t)V * sizeof(float));
    if (prompt) { /* the prompt first, so that the continuation reads on from it */
        fputs(prompt, stdout);
        fflush(stdout);
    }
    double t0 = clock_now();
    runner_feed(&run, ids, n_ids, 0, logits);
    double t_prefill = clock_now() - t0;

    /* decode: text is kept until no stop string can still begin in it */
    size_t tcap = 4096, tlen = 0, printed = 0, max_stop = 0;
    char *text = xmalloc(tcap);
    for (int i = 0; i < n_stops; i++) max_stop = strlen(stops[i]) > max_stop ? strlen(stops[i]) : max_stop;
    int n_gen = 0;
    const char *why = "length";
    double t1 = clock_now();
    while (n_gen < max_tokens) {
        SampleResult res;
        int t = sampler_sample(&smp, logits, &res);
        sampler_accept(&smp, t);
        n_gen++;
        if (model_text_is_eos(&mt, t) && !ignore_eos) { why = "eos"; break; }
        int is_stop = 0;
        for (int i = 0; i < n_stop_ids; i++) is_stop |= t == stop_ids[i];
        if (is_stop) { why = "stop"; break; }
        char piece[512];
        int n = detok_push(&dt, t, piece, sizeof piece);
        if (n > 0) {
            if (tlen + n + 1 > tcap) text = xrealloc(text, tcap = 2 * (tlen + n + 1));
            memcpy(text + tlen, piece, n);
            tlen += n;
        }
        long at = find_stop(text, tlen, stops, n_stops);
        if (at >= 0) {
            fwrite(text + printed, 1, at - printed > 0 ? at - printed : 0, stdout);
            printed = tlen;
            why = "stop";
            break;
        }
        size_t safe = tlen >= max_stop ? tlen - (max_stop ? max_stop - 1 : 0) : 0;
        if (safe > printed) {
            fwrite(text + printed, 1, safe - printed, stdout);
            fflush(stdout);
            printed = safe;
        }
        if (n_gen == max_tokens) break;
        runner_feed(&run, &t, 1, 0, logits);
    }
    if (printed < tlen && strcmp(why, "stop") != 0) fwrite(text + printed, 1, tlen - printed, stdout);
    char tail[32];
    int nt = detok_flush(&dt, tail, sizeof tail);
    if (nt > 0 && strcmp(why, "stop") != 0) fwrite(tail, 1, nt, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t_decode = clock_now() - t1;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s); finish: %s; %s\n",
            n_ids, t_prefill, n_ids / t_prefill, n_gen, t_decode, n_gen / (t_decode > 0 ? t_decode : 1e-9), why,
            be.name);

    free(text);
    free(logits);
    free(ids);
    sampler_free(&smp);
    runner_free(&run);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_text_free(&mt);
    model_free(&m);
    dist_shutdown();
    return 0;
}
