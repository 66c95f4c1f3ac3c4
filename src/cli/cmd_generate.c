/* cmd_generate: `moeserve generate MODEL (--prompt S | --chat S) [sampling options]`
 * streams the continuation to stdout as it is sampled and prints prefill and decode speed to
 * stderr at the end. --chat renders the message through the model's chat template (with an
 * optional --system message); --prompt encodes the text as is, with the tokenizer's special
 * tokens. Sampling defaults come from the model's generation_config.json, as in vLLM. With
 * speculative decoding (--speculative-config) the MTP layer drafts after each token and one
 * forward verifies them (engine.c spec_accept says why the output is the same); the statistics
 * line then adds the drafts accepted. */
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
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    SamplingParams cli;
    sampling_params_default(&cli);
    const char *prompt = NULL, *chat = NULL, *system_msg = NULL, *stop_ids_s = NULL, *chat_template = NULL;
    OptStrs stops = {0};
    int max_tokens = 128, chunk = 256, ignore_eos = 0, no_graphs = 0;
    const OptSpec gen_specs[] = {
        {.names = "--prompt", .type = OPT_STR, .dst = &prompt, .metavar = "TEXT",
         .help = "continue this text (encoded as is, with the tokenizer's special tokens)"},
        {.names = "--chat", .type = OPT_STR, .dst = &chat, .metavar = "TEXT",
         .help = "answer this user message, through the chat template"},
        {.names = "--system", .type = OPT_STR, .dst = &system_msg, .metavar = "TEXT",
         .help = "with --chat: a system message"},
        {.names = "--chat-template", .type = OPT_STR, .dst = &chat_template, .metavar = "FILE",
         .help = "a Jinja chat template (a file, or the template itself) instead of the model's", .def = "the model's"},
        {.names = "--max-tokens", .type = OPT_INT, .dst = &max_tokens, .metavar = "N", .help = "new tokens at most",
         .def = "128", .lo = 1, .hi = 1 << 20},
        {.names = "--stop", .type = OPT_STRS, .dst = &stops, .metavar = "TEXT...",
         .help = "end the output where one of these strings begins (repeatable)"},
        {.names = "--stop-token-ids", .type = OPT_STR, .dst = &stop_ids_s, .metavar = "ID,...",
         .help = "end the output at one of these token ids"},
        {.names = "--ignore-eos", .type = OPT_FLAG, .dst = &ignore_eos, .help = "go on past the end-of-sequence token",
         .def = "off"},
        {.names = "--chunk", .type = OPT_INT, .dst = &chunk, .metavar = "N", .help = "prompt tokens per forward step",
         .def = "256", .lo = 1, .hi = 1 << 16},
        {.names = "--disable-cuda-graph|--enforce-eager|--no-graphs", .type = OPT_FLAG, .dst = &no_graphs,
         .help = "run decode steps eagerly, without CUDA graphs", .def = "graphs on a GPU"},
    };
    const OptGroup groups[] = {OPT_GROUP("generate", gen_specs), sampling_opt_group(&cli), model_opt_group(&mo,
    MODEL_OPT_ALL),
                               spec_opt_group(&mo.spec), par_opt_group(&mo.par), device_opt_group(&dev)};
    const OptCommand cmd = {.cmd = "generate", .synopsis = "MODEL (--prompt TEXT | --chat TEXT) [options]",
                            .about = "Stream a continuation of a prompt, or the answer to a chat message, to stdout.\n"
                                     "Sampling defaults come from the model's generation_config.json.",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    if (!prompt == !chat) {
        fprintf(stderr, "error: generate: exactly one of --prompt or --chat is required\n");
        return 2;
    }
    if (system_msg && !chat) fatal("generate: --system goes with --chat");
    for (int i = 0; i < stops.n; i++)
        if (!*stops.v[i]) fatal("generate: --stop needs a non-empty string");
    const char *const *stop_strs = stops.v;
    int n_stops = stops.n;
    model_opt_device(&mo, dev.device);
    mo.dir = model_dir_resolve("generate", mo.dir, mo.revision, !mo.dummy);

    char err[1024];
    const char *device = model_dist_start(&mo, dev.device);
    Model m;
    model_open(&m, &mo);
    ModelText mt;
    model_text_open(&mt, mo.dir, m.cfg.eos_ids, m.cfg.n_eos);
    if (chat_template && model_text_use_template(&mt, chat_template, err, sizeof err) < 0) fatal("generate: %s", err);
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
    /* the command line over the model's defaults, field by field */
    if (opt_given(&cmd, &cli.temperature)) sp.temperature = cli.temperature;
    if (opt_given(&cmd, &cli.top_p)) sp.top_p = cli.top_p;
    if (opt_given(&cmd, &cli.top_k)) sp.top_k = cli.top_k;
    if (opt_given(&cmd, &cli.min_p)) sp.min_p = cli.min_p;
    if (opt_given(&cmd, &cli.repetition_penalty)) sp.repetition_penalty = cli.repetition_penalty;
    sp.frequency_penalty = cli.frequency_penalty;
    sp.presence_penalty = cli.presence_penalty;
    sp.seed = cli.seed;
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
    backend_open(&be, device, dev.threads);
    cli_sim_tokens(&be, &mt, m.cfg.vocab);
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
    int K = mo.spec.k; /* speculative decoding: drafts a step from the MTP layer (0: off) */
    if (K > chunk - 1) {
        log_warn("generate: %d drafts a step do not fit --chunk %d: %d", K, chunk, chunk - 1);
        K = chunk - 1;
    }
    if (K > 0) runner_enable_mtp(&run, mo.spec.draft_vocab, K);
    Sampler smp;
    sampler_init(&smp, &sp, m.cfg.vocab, ids, n_ids);
    Detokenizer dt;
    detok_init(&dt, tok, 1);

    int V = m.cfg.vocab;
    float *logits = xmalloc((size_t)V * (K + 1) * sizeof(float));
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
    for (int i = 0; i < n_stops; i++) max_stop = strlen(stop_strs[i]) > max_stop ? strlen(stop_strs[i]) : max_stop;
    int n_gen = 0;
    const char *why = "length";
    /* speculation: the tokens of a verified chain wait in q (sampled and accepted already); keep is
       how many positions of the last feed stand (the MTP layer's catch-up pairs them) */
    int q[MTP_MAX_DRAFTS + 1], nq = 0, qi = 0, keep = run.n_last, drafts[MTP_MAX_DRAFTS];
    long chains = 0, n_drafted = 0, n_accepted = 0;
    double t1 = clock_now();
    while (n_gen < max_tokens) {
        SampleResult res;
        int t;
        if (qi < nq) {
            t = q[qi++];
        } else {
            t = sampler_sample(&smp, logits, &res);
            sampler_accept(&smp, t);
        }
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
        long at = find_stop(text, tlen, stop_strs, n_stops);
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
        if (qi < nq) continue;
        if (!K) {
            runner_feed(&run, &t, 1, 0, logits);
            continue;
        }
        /* draft after t, then feed t and the drafts in one forward and take each row's token while it
           equals the draft before it: the same tokens as without drafts (engine.c spec_accept) */
        int nd = K < max_tokens - n_gen - 1 ? K : max_tokens - n_gen - 1;
        runner_draft(&run, keep, t, nd, drafts);
        int seq[MTP_MAX_DRAFTS + 1], base = run.n_ctx;
        seq[0] = t;
        memcpy(seq + 1, drafts, nd * sizeof(int));
        runner_feed(&run, seq, 1 + nd, nd > 0, logits);
        nq = qi = 0;
        if (nd == 0) { keep = 1; continue; } /* the one row, sampled at the top */
        for (int j = 0; j <= nd; j++) {
            int u = sampler_sample(&smp, logits + (size_t)j * V, &res);
            sampler_accept(&smp, u);
            q[nq++] = u;
            if (j == nd || u != drafts[j]) break;
        }
        chains++;
        n_drafted += nd;
        n_accepted += nq - 1;
        keep = nq;
        runner_rewind(&run, base + nq);
    }
    if (printed < tlen && strcmp(why, "stop") != 0) fwrite(text + printed, 1, tlen - printed, stdout);
    char tail[32];
    int nt = detok_flush(&dt, tail, sizeof tail);
    if (nt > 0 && strcmp(why, "stop") != 0) fwrite(tail, 1, nt, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t_decode = clock_now() - t1;
    char specs[160] = "";
    if (K > 0) /* acceptance: drafts accepted of those verified; tokens a verified chain gave */
        snprintf(specs, sizeof specs, "; speculative: %ld of %ld drafts accepted (%.1f%%), %.2f tokens a step", n_accepted,
                 n_drafted, n_drafted ? 100.0 * n_accepted / n_drafted : 0.0, chains ? 1.0 + (double)n_accepted / chains : 0.0);
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s); finish: %s; %s%s\n",
            n_ids, t_prefill, n_ids / t_prefill, n_gen, t_decode, n_gen / (t_decode > 0 ? t_decode : 1e-9), why,
            be.name, specs);

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
