/* bench_model: `moeserve bench model` measures offline prefill and decode throughput without
 * the server: for each batch size B, B sequences of --input-len random tokens are prefilled
 * (packed into steps of up to --max-batch-tokens tokens, chunked), then decoded together for
 * --output-len steps, greedy on the device so only the ids come back, after --warmup (default 1)
 * untimed passes of each batch size. Reports tokens/s, the
 * time per output token, and the bytes the decode steps had to move against the time
 * (the op counts of backend.c), next to the memory roof when --roof-gbs is given. With
 * speculative decoding on, each batch size runs through the engine instead (bench_spec). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/util.h"
#include "../dist/dist.h"
#include "../backend/backend.h"
#include "../base/opt.h"
#include "../base/progress.h"
#include "../engine/engine.h"
#include "../model/model_opts.h"
#include "../model/kv_cache.h"
#include "../model/forward.h"

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 16) fatal("bench model: --batch: '%s' is not a list of sizes in [1, 65536]", s);
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') fatal("bench model: --batch: unexpected '%c'", *end);
    }
    return n;
}

/* The forward steps of the whole run: for each batch size, warmup untimed passes and a timed one,
 * each its prefill (B prompts packed into steps of max_bt tokens) then its decode steps (up to 4
 * in an untimed pass). */
static uint64_t run_steps(const int *batches, int nb, int warmup, int in_len, int out_len, int max_bt)
{
    uint64_t n = 0;
    for (int bi = 0; bi < nb; bi++) {
        uint64_t prefill = ((uint64_t)batches[bi] * in_len + max_bt - 1) / max_bt;
        n += (uint64_t)warmup * (prefill + (out_len < 4 ? out_len : 4)) + prefill + out_len;
    }
    return n;
}

typedef struct {
    int *tokens, *pos, *seq, *slot, *seq_start, *seq_ntok, *ctx, *out_idx;
} BatchBuf;

/* With speculative decoding (--speculative-config): each batch size through an Engine with the
 * MTP layer's drafts (greedy, random prompts, eos ignored): prefill until every sequence has its
 * first token, then decode; decode tokens/s and the drafts' acceptance. A warm-up run first. */
static void bench_spec(const Model *dm, Backend *be, const ModelOpts *mo, const int *batches, int nb, int in_len,
                       int out_len, int max_bt, int no_graphs, int as_json)
{
    int V = dm->cfg.vocab;
    Rng rng;
    rng_seed(&rng, 7);
    int maxB = 0;
    for (int i = 0; i < nb; i++) maxB = batches[i] > maxB ? batches[i] : maxB;
    int *prompts = xmalloc((size_t)maxB * in_len * sizeof(int));
    for (long i = 0; i < (long)maxB * in_len; i++) prompts[i] = (int)(rng_u64(&rng) % V);
    uint64_t *ids = xcalloc(maxB, sizeof(uint64_t));
    int *got = xcalloc(maxB, sizeof(int));
    if (!as_json)
        printf("%-6s %12s %12s %10s %10s %12s\n", "batch", "prefill t/s", "decode t/s", "TPOT ms", "accepted", "tokens/chain");
    for (int bi = 0; bi < nb; bi++)
        for (int rep = 0; rep < 2; rep++) { /* rep 0: warm-up */
            int B = batches[bi], outl = rep ? out_len : (out_len < 4 ? out_len : 4);
            EngineOptions o;
            engine_options_default(&o);
            o.max_running = B;
            o.max_batch_tokens = max_bt > B * (1 + mo->spec.k) ? max_bt : B * (1 + mo->spec.k);
            o.max_model_len = in_len + out_len + 1;
            o.n_blocks = B * ((in_len + out_len + 16) / 16 + 1);
            o.no_graphs = no_graphs;
            o.prefix_caching = 0;
            o.profile_every = 0;
            o.spec_k = mo->spec.k;
            o.spec_vocab = mo->spec.draft_vocab;
            Engine *e = engine_create(dm, be, &o, NULL, 0);
            engine_start(e);
            double t0 = clock_now(), t1 = 0;
            for (int k = 0; k < B; k++) {
                RequestParams r = {.prompt = prompts + (size_t)k * in_len, .n_prompt = in_len, .max_tokens = outl,
                                   .ignore_eos = 1};
                sampling_params_default(&r.sampling);
                r.sampling.temperature = 0;
                char err[256];
                ids[k] = engine_submit(e, &r, NULL, NULL, err, sizeof err);
                if (!ids[k]) fatal("bench model: %s", err);
                got[k] = 0;
            }
            for (int left = B; left > 0;) {
                int first = 1;
                for (int k = 0; k < B; k++) {
                    EngineEvent ev[64];
                    int n;
                    while (ids[k] && (n = engine_poll(e, ids[k], ev, 64)) > 0)
                        for (int j = 0; j < n; j++) {
                            got[k] += ev[j].token >= 0;
                            if (ev[j].finish) { ids[k] = 0; left--; }
                        }
                    first &= got[k] > 0 || !ids[k];
                }
                if (first && !t1) t1 = clock_now();
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
            double t2 = clock_now();
            EngineStats st;
            engine_stats(e, &st);
            engine_stop(e, 1);
            engine_free(e);
            if (!rep) continue;
            double pre = (double)B * in_len / (t1 - t0), dec = (double)B * (out_len - 1) / (t2 - t1);
            double accp = st.spec_draft_tokens ? 100.0 * st.spec_accepted_tokens / st.spec_draft_tokens : 0;
            double len = st.spec_chains ? 1.0 + (double)st.spec_accepted_tokens / st.spec_chains : 0;
            if (as_json)
                out_printf("{\"batch\": %d, \"input_len\": %d, \"output_len\": %d, \"prefill_tok_s\": %.1f, "
                           "\"decode_tok_s\": %.1f, \"tpot_ms\": %.3f, \"num_speculative_tokens\": %d, "
                           "\"accepted_pct\": %.1f, \"accept_length\": %.3f, \"device\": \"%s\"}\n", B, in_len, out_len,
                           pre, dec, (t2 - t1) / (out_len - 1 > 0 ? out_len - 1 : 1) * 1e3, mo->spec.k, accp, len, be->name);
            else
                printf("%-6d %12.1f %12.1f %10.3f %9.1f%% %12.2f\n", B, pre, dec,
                       (t2 - t1) / (out_len - 1 > 0 ? out_len - 1 : 1) * 1e3, accp, len);
            fflush(stdout);
        }
    free(prompts);
    free(ids);
    free(got);
}

static double stats_bytes(const Backend *be)
{
    double b = 0;
    for (int i = 0; i < OP_COUNT; i++) b += be->stats[i].bytes;
    return b;
}

int bench_model_main(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    const char *batch_s = "1,64,256";
    int in_len = 1024, out_len = 128, max_bt = 2048, as_json = 0, bs = 16, no_graphs = 0, warmup = 1;
    double roof = 0;
    const OptSpec specs[] = {
        {.names = "--batch", .type = OPT_STR, .dst = &batch_s, .metavar = "B,B,..", .help = "batch sizes, each in turn",
         .def = "1,64,256"},
        {.names = "--input-len", .type = OPT_INT, .dst = &in_len, .metavar = "N", .help = "prompt tokens of a sequence",
         .def = "1024", .lo = 1, .hi = 1 << 20},
        {.names = "--output-len", .type = OPT_INT, .dst = &out_len, .metavar = "N", .help = "decode steps",
         .def = "128",
         .lo = 1, .hi = 1 << 20},
        {.names = ENGINE_MAX_BATCH_TOKENS_NAMES, .type = OPT_INT, .dst = &max_bt, .metavar = "N",
         .help = "tokens of one prefill step", .def = "2048", .lo = 1, .hi = 1 << 20},
        {.names = "--warmup", .type = OPT_INT, .dst = &warmup, .metavar = "N",
         .help = "untimed passes of each batch size",
         .def = "1", .lo = 0, .hi = 100},
        {.names = "--roof-gbs", .type = OPT_DOUBLE, .dst = &roof, .metavar = "GB/s",
         .help = "the memory roof the decode bytes are set against", .lo = 0, .hi = 1e7},
        {.names = "--disable-cuda-graph|--enforce-eager|--no-graphs", .type = OPT_FLAG, .dst = &no_graphs,
         .help = "run decode steps eagerly, without CUDA graphs", .def = "graphs on a GPU"},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON line per batch size", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("bench model", specs), model_opt_group(&mo, MODEL_OPT_ALL),
                               par_opt_group(&mo.par), device_opt_group(&dev), spec_opt_group(&mo.spec)};
    const OptCommand cmd = {.cmd = "bench model", .synopsis = "MODEL [options]",
                            .about = "Offline prefill and decode throughput of batches of random prompts, without "
                                     "the server.",
                            .groups = groups, .n_groups = 5, .max_pos = 1, .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    model_opt_device(&mo, dev.device);
    mo.dir = model_dir_resolve("bench model", mo.dir, mo.revision, !mo.dummy);
    /* a layout (--tp/--pp/--ep, or mpirun on the CPU): rank 0 runs the batches, the others its steps */
    const char *device = model_dist_start(&mo, dev.device);
    int threads = dev.threads;
    int batches[64], nb = parse_list(batch_s, batches, 64), maxB = 0;
    for (int i = 0; i < nb; i++) maxB = batches[i] > maxB ? batches[i] : maxB;

    Model m;
    model_open(&m, &mo);
    const ModelConfig *c = &m.cfg;
    if (in_len + out_len > c->max_position) fatal("bench model: %d + %d tokens exceed the context length %d", in_len, out_len, c->max_position);
    Backend be;
    backend_open(&be, device, threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    if (model_worker(&dm, &be)) {
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        model_free(&m);
        dist_shutdown();
        return 0;
    }
    if (mo.spec.k > 0) { /* drafts need the engine's verification: a run of its own */
        bench_spec(&dm, &be, &mo, batches, nb, in_len, out_len, max_bt, no_graphs, as_json);
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        model_free(&m);
        return 0;
    }
    int per_seq = (in_len + out_len + bs - 1) / bs;
    KVCache kv;
    kv_cache_init(&kv, &dm.cfg, &be, bs, maxB * per_seq);
    int max_tok = max_bt > maxB ? max_bt : maxB;
    Forward f;
    forward_init(&f, &dm, &be, max_tok, maxB, maxB, per_seq);
    forward_share(&f, &kv);
    if (!no_graphs) forward_enable_graphs(&f, per_seq * bs);
    int V = c->vocab;
    BatchBuf bb;
    int **fields[] = {&bb.tokens, &bb.pos, &bb.seq, &bb.slot, &bb.seq_start, &bb.seq_ntok, &bb.ctx, &bb.out_idx};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) *fields[i] = xcalloc(max_tok, sizeof(int));
    int *table = xcalloc((size_t)maxB * per_seq, sizeof(int)), *next = xcalloc(maxB, sizeof(int));
    int *d_next = be_alloc(&be, maxB * sizeof(int));
    int *prompts = xmalloc((size_t)maxB * in_len * sizeof(int));
    Rng rng;
    rng_seed(&rng, 7);
    for (long i = 0; i < (long)maxB * in_len; i++) prompts[i] = (int)(rng_u64(&rng) % V);
    BlockTable *bt = xcalloc(maxB, sizeof(BlockTable));

    if (!as_json) printf("KV cache %s\n", model_kv_dtype_name(kv.dtype));
    if (!as_json)
        printf("%-6s %12s %12s %10s %12s %10s\n", "batch", "prefill t/s", "decode t/s", "TPOT ms", "decode GB/s",
               roof > 0 ? "% of roof" : "");
    /* each batch size runs `warmup` times untimed first (its prefill whole, up to 4 decode steps):
     * the first calls of a shape pay one-time costs (kernels loaded, scratch grown, the decode
     * graphs captured) that are not the engine's throughput */
    Progress pg;
    progress_start(&pg, "bench model", run_steps(batches, nb, warmup, in_len, out_len, max_bt), "steps");
    for (int bi = 0, rep = 0; bi < nb; rep < warmup ? rep++ : (rep = 0, bi++)) {
        int B = batches[bi], timed = rep == warmup, steps = timed || out_len < 4 ? out_len : 4;
        for (int s = 0; s < B; s++) {
            if (block_table_reserve(&bt[s], &kv, in_len + out_len) < 0) die("bench model: KV pool exhausted");
            memcpy(table + (size_t)s * per_seq, bt[s].blocks, per_seq * sizeof(int));
        }
        /* prefill: sequences packed into steps of up to max_bt tokens */
        double t0 = clock_now();
        int s = 0, off = 0;
        while (s < B) {
            int T = 0, S = 0, n_out = 0;
            while (s < B && T < max_bt) {
                int take = in_len - off < max_bt - T ? in_len - off : max_bt - T;
                bb.seq_start[S] = T;
                bb.seq_ntok[S] = take;
                bb.ctx[S] = off + take;
                for (int i = 0; i < take; i++) {
                    bb.tokens[T + i] = prompts[(size_t)s * in_len + off + i];
                    bb.pos[T + i] = off + i;
                    bb.seq[T + i] = S;
                    bb.slot[T + i] = block_table_slot(&bt[s], bs, off + i);
                }
                T += take;
                off += take;
                if (off == in_len) { bb.out_idx[n_out++] = T - 1; s++; off = 0; }
                /* the block table of packed sequence S is row S */
                memcpy(table + (size_t)S * per_seq, bt[s - (off == 0)].blocks, per_seq * sizeof(int));
                S++;
            }
            Batch b = {.n_tokens = T, .tokens = bb.tokens, .pos = bb.pos, .seq = bb.seq, .slot = bb.slot, .n_seqs = S,
                       .seq_start = bb.seq_start, .seq_ntok = bb.seq_ntok, .ctx_len = bb.ctx, .block_table = table,
                       .bt_stride = per_seq, .n_out = n_out, .out_idx = bb.out_idx};
            for (int k = 0; k < S; k++) b.max_ctx = bb.ctx[k] > b.max_ctx ? bb.ctx[k] : b.max_ctx;
            forward_run(&f, &b, &kv, NULL);
            progress_add(&pg, 1);
        }
        be_to_host(&be, next, f.logits, sizeof(int)); /* synchronise */
        double t_pre = clock_now() - t0;
        /* decode: B tokens a step */
        for (int k = 0; k < B; k++) {
            memcpy(table + (size_t)k * per_seq, bt[k].blocks, per_seq * sizeof(int));
            next[k] = prompts[(size_t)k * in_len + in_len - 1];
        }
        backend_reset_stats(&be);
        double t1 = clock_now();
        for (int step = 0; step < steps; step++) {
            for (int k = 0; k < B; k++) {
                bb.tokens[k] = next[k];
                bb.pos[k] = in_len + step;
                bb.seq[k] = k;
                bb.slot[k] = block_table_slot(&bt[k], bs, in_len + step);
                bb.seq_start[k] = k;
                bb.seq_ntok[k] = 1;
                bb.ctx[k] = in_len + step + 1;
                bb.out_idx[k] = k;
            }
            Batch b = {.n_tokens = B, .tokens = bb.tokens, .pos = bb.pos, .seq = bb.seq, .slot = bb.slot, .n_seqs = B,
                       .seq_start = bb.seq_start, .seq_ntok = bb.seq_ntok, .ctx_len = bb.ctx, .block_table = table,
                       .bt_stride = per_seq, .max_ctx = in_len + step + 1, .n_out = B, .out_idx = bb.out_idx};
            forward_run(&f, &b, &kv, NULL);
            be_argmax(&be, d_next, f.logits, B, V);
            be_to_host(&be, next, d_next, B * sizeof(int));
            progress_add(&pg, 1);
        }
        double t_dec = clock_now() - t1, gbs = stats_bytes(&be) / t_dec / 1e9;
        if (!timed) {
            for (int k = 0; k < B; k++) block_table_release(&bt[k], &kv);
            continue;
        }
        double pre_tps = (double)B * in_len / t_pre, dec_tps = (double)B * out_len / t_dec;
        if (as_json)
            out_printf("{\"batch\": %d, \"input_len\": %d, \"output_len\": %d, \"prefill_tok_s\": %.1f, "
                       "\"decode_tok_s\": %.1f, \"tpot_ms\": %.3f, \"decode_gbs\": %.1f, \"device\": \"%s\", "
                       "\"kv_cache_dtype\": \"%s\"}\n",
                       B, in_len, out_len, pre_tps, dec_tps, t_dec / out_len * 1e3, gbs, be.name,
                       model_kv_dtype_name(kv.dtype));
        else if (roof > 0)
            printf("%-6d %12.1f %12.1f %10.3f %12.1f %9.1f%%\n", B, pre_tps, dec_tps, t_dec / out_len * 1e3, gbs, 100 * gbs / roof);
        else
            printf("%-6d %12.1f %12.1f %10.3f %12.1f\n", B, pre_tps, dec_tps, t_dec / out_len * 1e3, gbs);
        fflush(stdout);
        for (int k = 0; k < B; k++) block_table_release(&bt[k], &kv);
    }
    progress_end(&pg);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) free(*fields[i]);
    free(table); free(next); free(prompts); free(bt);
    be_free(&be, d_next);
    forward_free(&f);
    kv_cache_free(&kv);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    dist_shutdown();
    return 0;
}
