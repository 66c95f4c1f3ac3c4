/* cmd_tune: `moeserve tune`: time every tile configuration of the NVFP4 kernels that fits the
 * GPU's shared memory on the GLM-5 shapes, per token bucket; print the table with the rejected
 * configurations and their reason; cache the winners per device (the CUDA backend takes them at
 * start-up when the device key matches). --smem-budget simulates a smaller GPU (the 99 KB or
 * 101 KB per block of sm_120 parts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "cli.h"
#ifdef MOESERVE_CUDA
#include "../backend/cuda/cuda.h"
#include "../backend/cuda/w4.h"
#endif

#define TUNE_USAGE "moeserve tune [--device N] [--iters N] [--cache FILE | --no-save] [--smem-budget KB] [--quick]"

int cmd_tune(int argc, char **argv)
{
    int device = 0, iters = 10, no_save = 0, budget_kb = 0, quick = 0, help = 0;
    const char *cache = NULL;
    for (int i = 1; i < argc; i++) {
        if (opt_int(argc, argv, &i, "--device", 0, 64, &device) || opt_int(argc, argv, &i, "--iters", 1, 1000, &iters) ||
            opt_str(argc, argv, &i, "--cache", &cache) || opt_int(argc, argv, &i, "--smem-budget", 1, 1 << 20, &budget_kb) ||
            opt_flag(argv, &i, "--no-save", &no_save) || opt_flag(argv, &i, "--quick", &quick) || opt_flag(argv, &i, "--help", &help))
            continue;
        opt_unknown("tune", argv[i], TUNE_USAGE);
    }
    if (help) {
        printf("usage: %s\n", TUNE_USAGE);
        return 0;
    }
#ifdef MOESERVE_CUDA
    if (cuda_device_count() == 0) fatal("tune: no CUDA device is available (the kernels it tunes are the GPU's)");
    char path[4096];
    if (cache) snprintf(path, sizeof path, "%s", cache);
    else w4_table_path(path, sizeof path);
    /* a simulated budget describes another GPU: its table is not this device's to cache */
    W4TuneOpts o = {.device = device, .iters = iters, .path = no_save || budget_kb ? NULL : path,
                    .budget = (size_t)budget_kb * 1024, .quick = quick};
    return cuda_w4_tune(&o);
#else
    (void)device; (void)iters; (void)no_save; (void)budget_kb; (void)quick; (void)cache;
    fatal("tune: this build has no CUDA backend (nvcc was not found at build time)");
#endif
}
