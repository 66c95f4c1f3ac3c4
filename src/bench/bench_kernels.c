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

#define BK_USAGE "moeserve bench kernels [--device N] [--tokens 1,8,64,256,512,2048,8192] [--rows 1,2,4,8,16,64,256,4096] " \
                 "[--routing random,skewed] [--iters N] [--no-moe] [--no-dense] [--v0] [--torch FILE] [--json FILE] " \
                 "[--tile 0..36] [--splits N] [--warmup-ms N]"

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
    int device = 0, iters = 20, no_moe = 0, no_dense = 0, v0 = 0, help = 0, tile = -1, splits = 0, warmup_ms = 0;
    const char *tokens_s = "1,8,64,256,512,2048,8192", *rows_s = "1,2,4,8,16,64,256,4096", *routing_s = "random,skewed";
    const char *torch_path = NULL, *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (opt_int(argc, argv, &i, "--device", 0, 64, &device) || opt_int(argc, argv, &i, "--iters", 1, 10000, &iters) ||
            opt_str(argc, argv, &i, "--tokens", &tokens_s) || opt_str(argc, argv, &i, "--rows", &rows_s) ||
            opt_str(argc, argv, &i, "--routing", &routing_s) || opt_str(argc, argv, &i, "--torch", &torch_path) ||
            opt_str(argc, argv, &i, "--json", &json_path) || opt_int(argc, argv, &i, "--tile", 0, BK_MAX_TILE, &tile) ||
            opt_int(argc, argv, &i, "--splits", 0, 64, &splits) || opt_int(argc, argv, &i, "--warmup-ms", 0, 60000, &warmup_ms) ||
            opt_flag(argv, &i, "--no-moe", &no_moe) ||
            opt_flag(argv, &i, "--no-dense", &no_dense) || opt_flag(argv, &i, "--v0", &v0) || opt_flag(argv, &i, "--help", &help))
            continue;
        opt_unknown("bench kernels", argv[i], BK_USAGE);
    }
    if (help) {
        printf("usage: %s\n", BK_USAGE);
        return 0;
    }
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
