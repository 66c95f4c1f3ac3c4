/* cmd_logits: `moeserve logits --model DIR --tokens 5,17,42 [--chunk N] [--device cpu|cuda]
 * [--threads N] --out FILE` writes little-endian float32 logits, row-major [tokens, vocab], one
 * row per input position (DESIGN.md §3). --chunk N feeds the prompt through the paged KV cache
 * N tokens at a time (1 = the pure decode path); every chunk size gives the same logits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../engine/kv_cache.h"
#include "../model/forward.h"
#include "cli.h"

#define LOGITS_USAGE "moeserve logits --model DIR --tokens ID,ID,... [--chunk N] [--device cpu|cuda] " \
                     "[--threads N] [--block-size N] [--tp N --pp N --ep N] --out FILE"

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
    const char *model_dir = NULL, *tokens_s = NULL, *out_path = NULL, *device = NULL;
    int chunk = 0, threads = 0, block_size = 16, tp = 1, pp = 1, ep = 1, help = 0;
    for (int i = 1; i < argc; i++) {
        if (opt_str(argc, argv, &i, "--model", &model_dir) || opt_str(argc, argv, &i, "--tokens", &tokens_s) ||
            opt_str(argc, argv, &i, "--out", &out_path) || opt_str(argc, argv, &i, "--device", &device) ||
            opt_int(argc, argv, &i, "--chunk", 1, 1 << 20, &chunk) ||
            opt_int(argc, argv, &i, "--threads", 1, 4096, &threads) ||
            opt_int(argc, argv, &i, "--block-size", 1, 4096, &block_size) ||
            opt_int(argc, argv, &i, "--tp", 1, 1024, &tp) || opt_int(argc, argv, &i, "--pp", 1, 1024, &pp) ||
            opt_int(argc, argv, &i, "--ep", 1, 1024, &ep) || opt_flag(argv, &i, "--help", &help))
            continue;
        opt_unknown("logits", argv[i], LOGITS_USAGE);
    }
    if (help) { printf("usage: %s\n", LOGITS_USAGE); return 0; }
    if (!model_dir || !tokens_s || !out_path) {
        fprintf(stderr, "error: logits: --model, --tokens and --out are required\nusage: %s\n", LOGITS_USAGE);
        return 2;
    }
    if (tp != 1 || pp != 1 || ep != 1) fatal("logits: --tp/--pp/--ep: parallel layouts are not available yet (issue #8)");

    Model m;
    model_load(&m, model_dir);
    int *ids;
    int T = parse_tokens(tokens_s, m.cfg.vocab, &ids);
    if (T > m.cfg.max_position)
        fatal("logits: %d tokens exceed the model's context length %d", T, m.cfg.max_position);
    if (chunk <= 0 || chunk > T) chunk = T;

    Backend be;
    device_open(&be, device, threads);
    Model dm;
    device_model(&dm, &m, &be);
    KVCache kv;
    kv_cache_init(&kv, &m.cfg, &be, block_size, (T + block_size - 1) / block_size);
    BlockTable bt = {0};
    if (block_table_reserve(&bt, &kv, T) < 0) die("kv cache sized for %d tokens ran out", T);
    Forward f;
    forward_init(&f, &dm, &be, chunk, chunk, 1, bt.n_blocks);

    FILE *out = fopen(out_path, "wb");
    if (!out) fatal("logits: cannot write %s: %s", out_path, strerror(errno));
    int V = m.cfg.vocab;
    float *logits = xmalloc((size_t)chunk * V * sizeof(float));
    int *pos = xmalloc(chunk * sizeof(int)), *seq = xcalloc(chunk, sizeof(int)), *slot = xmalloc(chunk * sizeof(int));
    int *out_idx = xmalloc(chunk * sizeof(int));
    double t0 = clock_now();
    for (int s0 = 0; s0 < T; s0 += chunk) {
        int n = T - s0 < chunk ? T - s0 : chunk;
        for (int i = 0; i < n; i++) {
            pos[i] = s0 + i;
            slot[i] = block_table_slot(&bt, block_size, s0 + i);
            out_idx[i] = i;
        }
        int seq_start = 0, seq_ntok = n, ctx = s0 + n;
        Batch b = {.n_tokens = n, .tokens = ids + s0, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1,
                   .seq_start = &seq_start, .seq_ntok = &seq_ntok, .ctx_len = &ctx, .block_table = bt.blocks, .bt_stride = bt.n_blocks,
                   .n_out = n, .out_idx = out_idx};
        forward_run(&f, &b, &kv, logits);
        if (fwrite(logits, sizeof(float), (size_t)n * V, out) != (size_t)n * V)
            fatal("logits: writing %s: %s", out_path, strerror(errno));
    }
    if (fclose(out) != 0) fatal("logits: writing %s: %s", out_path, strerror(errno));
    log_info("logits: %d tokens (chunk %d) in %.3f s on %s, %d threads -> %s", T, chunk, clock_now() - t0,
             be.name, be.n_threads, out_path);

    free(logits); free(pos); free(seq); free(slot); free(out_idx); free(ids);
    forward_free(&f);
    block_table_release(&bt, &kv);
    kv_cache_free(&kv);
    device_model_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    return 0;
}
