/* bench_moe: `moeserve bench moe MODEL --layer L --batch B,B,..` times one FFN layer of the model
 * (model/moe.c moe_ffn) over batches of B tokens of the whole deployment, on every rank at once
 * (under mpirun, each rank runs this loop itself: no scheduler, no attention), and counts what the
 * layer's collectives move. Under --tp N --ep N every rank holds all B tokens and the block ends
 * in an all-reduce of B rows; under --tp N --dp N --ep N each attention group holds its share of
 * the B tokens and the routed experts are reached by the all-to-all dispatch and combine. The
 * same layer under both layouts is the comparison of docs/PERFORMANCE.md. Rank 0 prints, per B:
 * the layer's time (the mean over --reps, after one untimed run; the slowest rank's), the time
 * spent in collectives (all-reduce and all-to-all, timed op by op; the slowest rank's), and the
 * bytes a rank sent per layer (the mean over the ranks of the stage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/opt.h"
#include "../base/util.h"
#include "../backend/backend.h"
#include "../model/forward.h"
#include "../model/model_opts.h"

/* the time of the collectives (OpHook: every op of the layer is bracketed) */
typedef struct {
    double t0, comm_s;
} CommClock;

static void hook_begin(void *ctx) { ((CommClock *)ctx)->t0 = clock_now(); }

static void hook_end(void *ctx, OpId op, double flops, double bytes)
{
    (void)flops;
    (void)bytes;
    CommClock *c = ctx;
    OpCategory k = op_category(op);
    if (k == CAT_ALL_REDUCE || k == CAT_ALL_TO_ALL) c->comm_s += clock_now() - c->t0;
}

static int parse_batches(const char *s, int *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 16) fatal("bench moe: --batch: '%s' is not a list of sizes in [1, 65536]", s);
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') fatal("bench moe: --batch: unexpected '%c'", *end);
    }
    return n;
}

/* v of every tensor rank of the stage (all[r], r < tp), through the all-to-all (no rank-0 path of its own) */
static void stage_values(Dist *d, Backend *be, double v, double *all)
{
    if (!d || d->tp == 1) {
        all[0] = v;
        return;
    }
    int P = d->tp;
    double *h = xmalloc(P * sizeof(double));
    size_t *n = xmalloc(P * sizeof(size_t));
    for (int r = 0; r < P; r++) h[r] = v, n[r] = sizeof(double);
    double *s = be_alloc(be, P * sizeof(double)), *rv = be_alloc(be, P * sizeof(double));
    be_to_device(be, s, h, P * sizeof(double));
    dist_all_to_all(d, be, s, n, rv, n);
    be_to_host(be, all, rv, P * sizeof(double));
    be_free(be, s);
    be_free(be, rv);
    free(h);
    free(n);
}

int bench_moe_main(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    const char *batch_s = "1,4,16,64,256";
    int layer = -1, reps = 5, as_json = 0;
    const OptSpec specs[] = {
        {.names = "--batch", .type = OPT_STR, .dst = &batch_s, .metavar = "B,B,..",
         .help = "tokens of the whole deployment per step, each in turn", .def = "1,4,16,64,256"},
        {.names = "--layer", .type = OPT_INT, .dst = &layer, .metavar = "L", .help = "the layer whose FFN runs",
         .def = "the first MoE layer", .lo = 0, .hi = MODEL_MAX_LAYERS - 1},
        {.names = "--reps", .type = OPT_INT, .dst = &reps, .metavar = "N", .help = "timed runs of each batch size",
         .def = "5", .lo = 1, .hi = 10000},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON line per batch size", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("bench moe", specs), model_opt_group(&mo, MODEL_OPT_ALL),
                               par_opt_group(&mo.par), device_opt_group(&dev)};
    const OptCommand cmd = {.cmd = "bench moe", .synopsis = "MODEL [options]",
                            .about = "One FFN layer's time and collective bytes at several batch sizes, on every rank "
                                     "(mpirun): the all-reduce form (--tp N --ep N) against dispatch and combine "
                                     "(--tp N --dp N --ep N).",
                            .groups = groups, .n_groups = 4, .max_pos = 1, .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    mo.dir = model_dir_resolve("bench moe", mo.dir, mo.revision, !mo.dummy);
    int batches[64], nb = parse_batches(batch_s, batches, 64), maxB = 1;
    for (int i = 0; i < nb; i++) maxB = batches[i] > maxB ? batches[i] : maxB;
    const char *device = model_dist_start(&mo, dev.device);
    Model m;
    model_open(&m, &mo);
    const ModelConfig *c = &m.cfg;
    if (layer < 0)
        for (int l = c->layer_begin; l < c->layer_end && layer < 0; l++)
            if (c->layer_moe[l]) layer = l;
    if (layer < c->layer_begin || layer >= c->layer_end)
        fatal("bench moe: layer %d is not held here (layers %d..%d; this command runs one stage: leave out --pp)",
              layer, c->layer_begin, c->layer_end - 1);
    Backend be;
    backend_open(&be, device, dev.threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    Dist *d = dist_get();
    int dp = d ? d->dp : 1, g = d ? d->dp_rank : 0, rank = d ? d->rank : 0, D = c->hidden;
    Forward f;
    forward_init(&f, &dm, &be, maxB, 1, 1, 1);
    CommClock clk = {0};
    const OpHook hook = {.begin = hook_begin, .end = hook_end, .ctx = &clk};
    if (rank == 0 && !as_json)
        printf("layer %d (%s), %d rank%s, tp %d, dp %d, ep %d\n%-6s %12s %12s %14s %14s %14s\n", layer,
               c->layer_moe[layer] ? "MoE" : "dense", d ? d->world : 1, d && d->world > 1 ? "s" : "", d ? d->tp : 1, dp,
               d ? d->ep : 1, "batch", "layer ms", "collect. ms", "all-reduce B", "all-to-all B", "sent B/rank");
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi], T = B / dp + (g < B % dp); /* this group's share of the deployment's tokens */
        Batch hb = {.n_tokens = T};
        f.hb = f.db = &hb;
        double total = 0;
        clk.comm_s = 0;
        for (int r = 0; r <= reps; r++) {
            /* the group's rows alike on its ranks (one seed a group and batch) */
            if (T) be_fill(&be, f.h, (size_t)T * D, FILL_F32_NORMAL, 0, 1, 1000u * (uint64_t)B + g);
            if (r == 1) { /* the first run is untimed */
                backend_reset_stats(&be);
                clk.comm_s = 0;
            }
            be.hook = r ? &hook : NULL;
            double t0 = clock_now();
            moe_ffn(&f, layer);
            if (T) be_to_host(&be, &hb.max_ctx, f.h, sizeof(int)); /* synchronise (the value is not used) */
            if (r) total += clock_now() - t0;
            be.hook = NULL;
        }
        /* the slowest rank's times, every rank's bytes on average (the groups hold different tokens) */
        double ar = be.stats[OP_ALL_REDUCE].bytes / reps, a2a = be.stats[OP_ALL_TO_ALL].bytes / reps, v[4][1024];
        int P = d ? d->tp : 1;
        CHECK(P <= 1024, "more than 1024 ranks a stage");
        double mine[4] = {total, clk.comm_s, ar, a2a};
        for (int k = 0; k < 4; k++) stage_values(d, &be, mine[k], v[k]);
        total = clk.comm_s = ar = a2a = 0;
        for (int r = 0; r < P; r++) {
            total = v[0][r] > total ? v[0][r] : total;
            clk.comm_s = v[1][r] > clk.comm_s ? v[1][r] : clk.comm_s;
            ar += v[2][r] / P;
            a2a += v[3][r] / P;
        }
        if (rank != 0) continue;
        if (as_json)
            out_printf("{\"batch\": %d, \"layer\": %d, \"tp\": %d, \"dp\": %d, \"ep\": %d, \"layer_ms\": %.4f, "
                       "\"collective_ms\": %.4f, \"all_reduce_bytes\": %.0f, \"all_to_all_bytes\": %.0f}\n",
                       B, layer, d ? d->tp : 1, dp, d ? d->ep : 1, total / reps * 1e3, clk.comm_s / reps * 1e3, ar,
                       a2a);
        else
            printf("%-6d %12.3f %12.3f %14.0f %14.0f %14.0f\n", B, total / reps * 1e3, clk.comm_s / reps * 1e3, ar, a2a,
                   ar + a2a);
        fflush(stdout);
    }
    forward_free(&f);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    if (d && d->rank > 0) { /* rank 0's stop message (dist_shutdown), which the workers' loop would have read */
        DistMsg msg;
        dist_bcast_host(d, &msg, sizeof msg);
    }
    dist_shutdown();
    return 0;
}
