/* cmd_logits: `moeserve logits --model DIR --tokens 5,17,42 [--chunk N] [--seqs N] [--device cpu|cuda]
 * [--threads N] --out FILE` writes little-endian float32 logits, row-major [tokens, vocab], one
 * row per input position. --chunk N feeds the prompt through the paged KV cache
 * N tokens at a time (1 = the pure decode path); every chunk size gives the same logits.
 * --seqs N runs the prompt as N sequences of one batch (under --dp on groups 0, 1, ...) and
 * writes [N, tokens, vocab]: every copy must equal the one sequence's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../dist/dist.h"
#include "../engine/runner.h"
#include "cli.h"

/* Parse "5,17,42" into ids, each in [0, vocab). Returns the count. */
static int parse_tokens(const char *s, int vocab, int **out)
{
    int cap = 64, n = 0;
    int *ids = xmalloc(cap * sizeof(int));
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno) fatal("logits: --tokens: '%s' is not a comma-separated list of integers", s);
        if (v < 0 || v >= vocab) fatal("logits: --tokens: id %ld is outside the vocabulary [0, %d)", v, vocab);
        if (n == cap) ids = xrealloc(ids, (cap *= 2) * sizeof(int));
        ids[n++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) fatal("logits: --tokens: unexpected '%c' in '%s'", *p, s);
    }
    if (n == 0) fatal("logits: --tokens is empty");
    *out = ids;
    return n;
}

int cmd_logits(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    const char *tokens_s = NULL, *out_path = NULL;
    int chunk = 0, block_size = 16, n_seqs = 1;
    const OptSpec specs[] = {
        {.names = "--tokens", .type = OPT_STR, .dst = &tokens_s, .metavar = "ID,ID,...",
         .help = "the input token ids (required)"},
        {.names = "--out", .type = OPT_STR, .dst = &out_path, .metavar = "FILE",
         .help = "where the float32 logits go, [tokens, vocab] row-major (required)"},
        {.names = "--chunk", .type = OPT_INT, .dst = &chunk, .metavar = "N",
         .help = "tokens fed per forward step (1: the decode path)", .def = "all at once", .lo = 1, .hi = 1 << 20},
        {.names = "--seqs", .type = OPT_INT, .dst = &n_seqs, .metavar = "N",
         .help = "the prompt as N sequences of one batch (under --dp spread over the groups); FILE holds N copies",
         .def = "1", .lo = 1, .hi = 256},
        {.names = "--block-size", .type = OPT_INT, .dst = &block_size, .metavar = "N",
         .help = "KV cache block size in tokens",
         .def = "16", .lo = 1, .hi = 4096},
    };
    const OptGroup groups[] = {OPT_GROUP("logits", specs), model_opt_group(&mo, MODEL_OPT_ALL), par_opt_group(&mo.par),
                               device_opt_group(&dev)};
    const OptCommand cmd = {.cmd = "logits", .synopsis = "MODEL --tokens ID,ID,... --out FILE [options]",
                            .about = "One forward pass over the tokens; the logits of every position into FILE.",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    if (!tokens_s || !out_path) {
        fprintf(stderr, "error: logits: --tokens and --out are required\n");
        return 2;
    }
    mo.dir = model_dir_resolve("logits", mo.dir, mo.revision, !mo.dummy);
    const char *device = model_dist_start(&mo, dev.device);

    Model m;
    model_open(&m, &mo);
    int *ids;
    int T = parse_tokens(tokens_s, m.cfg.vocab, &ids);
    if (T > m.cfg.max_position)
        fatal("logits: %d tokens exceed the model's context length %d", T, m.cfg.max_position);
    if (chunk <= 0 || chunk > T) chunk = T;

    Backend be;
    backend_open(&be, device, dev.threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    if (model_worker(&dm, &be)) { /* rank 0 writes --out */
        free(ids);
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        model_free(&m);
        dist_shutdown();
        return 0;
    }
    Runner run;
    runner_init_seqs(&run, &dm, &be, T, chunk, block_size, n_seqs);
    FILE *out = fopen(out_path, "wb");
    if (!out) fatal("logits: cannot write %s: %s", out_path, strerror(errno));
    int V = m.cfg.vocab;
    float *logits = xmalloc((size_t)(n_seqs > 1 ? n_seqs * T : chunk) * V * sizeof(float));
    double t0 = clock_now();
    if (n_seqs > 1) { /* [N, T, V] at once */
        runner_feed(&run, ids, T, 1, logits);
        if (fwrite(logits, sizeof(float), (size_t)n_seqs * T * V, out) != (size_t)n_seqs * T * V)
            fatal("logits: writing %s: %s", out_path, strerror(errno));
    }
    for (int s0 = 0; n_seqs == 1 && s0 < T; s0 += chunk) {
        int n = T - s0 < chunk ? T - s0 : chunk;
        runner_feed(&run, ids + s0, n, 1, logits);
        if (fwrite(logits, sizeof(float), (size_t)n * V, out) != (size_t)n * V)
            fatal("logits: writing %s: %s", out_path, strerror(errno));
    }
    if (fclose(out) != 0) fatal("logits: writing %s: %s", out_path, strerror(errno));
    log_info("logits: %d tokens (chunk %d) in %.3f s on %s, %d threads, KV cache %s -> %s", T, chunk, clock_now() - t0,
             be.name, be.n_threads, model_kv_dtype_name(run.kv.dtype), out_path);

    free(logits);
    free(ids);
    runner_free(&run);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    dist_shutdown();
    return 0;
}
