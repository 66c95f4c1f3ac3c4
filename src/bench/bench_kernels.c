/* bench_kernels: `moeserve bench kernels`, the options (the measuring is the CUDA backend's,
 * src/backend/cuda/bench_kernels.cu). Needs a CUDA GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../backend/backend.h"
#include "../base/opt.h"
#include "../engine/engine.h"
#include "../model/model_opts.h"
#ifdef MOESERVE_CUDA
#include "../backend/cuda/cuda.h"
#include "../backend/cuda/w4.h"
#endif

#define BK_MAX_LIST 64
#define BK_MAX_TILE 36 /* the last W4A16 tile (w4.h's W4_N_TILES - 1) */

#ifdef MOESERVE_CUDA
_Static_assert(W4_N_TILES == BK_MAX_TILE + 1, "--tile's range is the tile table's");
#endif

/* "1,8,64" -> values in [1, 1<<20]; the count, or -1 */
static int parse_list(const char *s, int *out)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1 << 20) || n == BK_MAX_LIST || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

int bench_kernels_main(int argc, char **argv)
{
    int device = 0, iters = 20, no_moe = 0, no_dense = 0, v0 = 0, tile = -1, splits = 0, warmup_ms = 0;
    const char *tokens_s = "1,8,64,256,512,2048,8192", *rows_s = "1,2,4,8,16,64,256,4096", *routing_s = "random,skewed";
    const char *torch_path = NULL, *json_path = NULL;
    const OptSpec specs[] = {
        {.names = "--device", .type = OPT_INT, .dst = &device, .metavar = "N", .help = "the GPU", .def = "0", .lo = 0,
         .hi = 64},
        {.names = "--tokens", .type = OPT_STR, .dst = &tokens_s, .metavar = "N,N,..",
         .help = "token counts of the MoE GEMMs",
         .def = tokens_s},
        {.names = "--rows", .type = OPT_STR, .dst = &rows_s, .metavar = "N,N,..", .help = "rows of the dense GEMMs",
         .def = rows_s},
        {.names = "--routing", .type = OPT_STR, .dst = &routing_s, .metavar = "random,skewed",
         .help = "how tokens are routed to experts", .def = routing_s},
        {.names = "--iters", .type = OPT_INT, .dst = &iters, .metavar = "N", .help = "timed runs of each shape",
         .def = "20",
         .lo = 1, .hi = 10000},
        {.names = "--no-moe", .type = OPT_FLAG, .dst = &no_moe, .help = "skip the MoE GEMMs", .def = "off"},
        {.names = "--no-dense", .type = OPT_FLAG, .dst = &no_dense, .help = "skip the dense GEMMs", .def = "off"},
        {.names = "--v0", .type = OPT_FLAG, .dst = &v0, .help = "the first kernels too, for comparison", .def = "off"},
        {.names = "--torch", .type = OPT_STR, .dst = &torch_path, .metavar = "FILE",
         .help = "a PyTorch reference's timings to set beside"},
        {.names = "--json", .type = OPT_STR, .dst = &json_path, .metavar = "FILE", .help = "the results as JSON"},
        {.names = "--tile", .type = OPT_INT, .dst = &tile, .metavar = "0..36",
         .help = "one tile instead of the chosen ones",
         .def = "the selection table's", .lo = 0, .hi = BK_MAX_TILE},
        {.names = "--splits", .type = OPT_INT, .dst = &splits, .metavar = "N", .help = "split-K factor with --tile",
         .def = "the tile's", .lo = 0, .hi = 64},
        {.names = "--warmup-ms", .type = OPT_INT, .dst = &warmup_ms, .metavar = "MS",
         .help = "keep the GPU busy this long first (clocks up)", .def = "0", .lo = 0, .hi = 60000},
    };
    const OptGroup groups[] = {OPT_GROUP("bench kernels", specs)};
    const OptCommand cmd = {.cmd = "bench kernels", .synopsis = "[options]",
                            .about = "The NVFP4 kernels against the GPU's measured roofs (needs a CUDA GPU).",
                            .groups = groups, .n_groups = 1};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    int tokens[BK_MAX_LIST], rows[BK_MAX_LIST];
    int n_tokens = parse_list(tokens_s, tokens), n_rows = parse_list(rows_s, rows);
    if (n_tokens < 0) fatal("bench kernels: --tokens '%s': expected a list like 1,8,64 (values 1..1048576)", tokens_s);
    if (n_rows < 0) fatal("bench kernels: --rows '%s': expected a list like 1,16,4096 (values 1..1048576)", rows_s);
    int random = strstr(routing_s, "random") != NULL, skewed = strstr(routing_s, "skewed") != NULL;
    if (!random && !skewed) fatal("bench kernels: --routing '%s': expected random, skewed or both", routing_s);
#ifdef MOESERVE_CUDA
    if (cuda_device_count() == 0) fatal("bench kernels: no CUDA device is available (the kernels it times are the GPU's)");
    BenchKernelsOpts o = {.device = device, .iters = iters, .tokens = tokens, .n_tokens = n_tokens, .rows = rows,
                          .n_rows = n_rows, .random = random, .skewed = skewed, .no_moe = no_moe, .no_dense = no_dense,
                          .v0 = v0, .torch_path = torch_path, .json_path = json_path, .tile = tile, .splits = splits,
                          .warmup_ms = warmup_ms};
    return cuda_bench_kernels(&o);
#else
    (void)device; (void)iters; (void)no_moe; (void)no_dense; (void)v0; (void)torch_path; (void)json_path; (void)splits; (void)tile; (void)warmup_ms;
    fatal("bench kernels: this build has no CUDA backend (nvcc was not found at build time)");
#endif
}
