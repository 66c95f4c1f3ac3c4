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

int cmd_tune(int argc, char **argv)
{
    int device = 0, iters = 10, no_save = 0, budget_kb = 0, quick = 0;
    const char *cache = NULL;
    const OptSpec specs[] = {
        {.names = "--device", .type = OPT_INT, .dst = &device, .metavar = "N", .help = "the GPU", .def = "0", .lo = 0,
         .hi = 64},
        {.names = "--iters", .type = OPT_INT, .dst = &iters, .metavar = "N", .help = "timed runs of each configuration",
         .def = "10", .lo = 1, .hi = 1000},
        {.names = "--cache", .type = OPT_STR, .dst = &cache, .metavar = "FILE", .help = "where the winners go",
         .def = "the per-device table the CUDA backend reads"},
        {.names = "--no-save", .type = OPT_FLAG, .dst = &no_save, .help = "print the table, cache nothing",
         .def = "off"},
        {.names = "--smem-budget", .type = OPT_INT, .dst = &budget_kb, .metavar = "KB",
         .help = "shared memory per block of a smaller GPU (simulated; nothing cached)", .def = "this GPU's", .lo = 1,
         .hi = 1 << 20},
        {.names = "--quick", .type = OPT_FLAG, .dst = &quick, .help = "fewer shapes", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("tune", specs)};
    const OptCommand cmd = {.cmd = "tune", .synopsis = "[options]",
                            .about = "Time the NVFP4 kernels' tiles on this GPU and cache the winners.",
                            .groups = groups,
                            .n_groups = 1};
    opt_parse(&cmd, argc, argv, NULL, NULL);
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
