/* w4.h: the NVFP4 W4A16 kernels seen from C: which tensors they take, what the choice of their
 * tile configuration reads (w4_select.h: the tiles, the built-in choice and the tuned table),
 * `moeserve tune` and `moeserve bench kernels`. The kernels, a family a file (w4_select.h
 * W4Family): w4_dense.cu (the dense entry and the mma.sync tiles), w4_streamk.cu, w4_dense_wg.cu,
 * w4_moe.cu (the MoE entry, its routing and the mma.sync tiles), w4_moe_block.cu,
 * w4_moe_wgmma.cu; w4_pack.cu repacks weights at upload, w4_device.cu holds what they ask of the
 * device. Their switches are knobs (src/base/knobs.h, MOESERVE_W4_*), read once. */
#ifndef MOESERVE_W4_H
#define MOESERVE_W4_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "w4_select.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An NVFP4 tensor the W4P layout can hold: N % 16 == 0, K % 256 == 0. */
int w4_packable(const QTensor *w);
/* Every expert of the layer is packed and the shapes fit the grouped kernels. */
int w4_moe_ready(const MoeExperts *ex, const ModelConfig *c);

/* What an op runs: a tile (-1: the tuned or built-in choice) and, for the dense mma.sync tiles,
 * the K splits (0: enough warps to fill the GPU). Set for the next ops by the bench, the tuner and
 * tests; {-1, 0} returns to the choice. */
typedef struct {
    int tile;
    int splits;
} W4Config;
void w4_set_config(W4Config c);

/* Dense GEMMs of at least this many rows of a weight with n rows (n <= 0: the fewest of any weight)
 * decode W to BF16 and run cuBLASLt (prefill); 0: never. MOESERVE_W4_LT_ROWS, else
 * w4_lt_rows_default: whether the split-K wgmma tile runs the weight on this device. */
int w4_lt_rows(int n, int device);
/* Stream-K launches and split-K wgmma launches so far (tests: that a call took the tile's path,
 * not its fallback). */
long w4_sk_calls(void);
long w4_dense_wg_calls(void);
/* The shared memory budget per block: the device's opt-in limit, or a simulated one (the tuner's
 * --smem-budget; tests: the 99 KB and 101 KB of sm_120 parts); 0 restores the device's. */
void w4_set_smem_budget(size_t bytes);
size_t w4_smem_budget(int device);
/* 1 if the wgmma tiles (w4_tile_runs) run on this device with this build (a probe kernel, once) */
int w4_wg_supported(int device);
int w4_code_arch(int device); /* what the device's loaded code was built for: 80, 90, ... */
/* 1 where the W4A16 kernels launch with programmatic dependent launch (the current device's loaded
 * code is sm_90's or later and MOESERVE_W4_PDL is not 0); bench kernels' read floor launches so too */
int w4_sk_pdl(void);
/* the compute capability as 10 major + minor (90: H100, H200) */
int w4_device_cc(int device);
/* Use this tuned table (copied), or none (NULL). */
void w4_use_table(const W4Table *t);
/* "NVIDIA H200|132 SMs|232448 B smem|driver 13000": what a tuned table is valid for */
void w4_device_key(int device, char *buf, size_t n);
/* Load the cached table at start-up if it was tuned on this device; 1 if one was taken. */
int w4_load_cached(int device);
/* Tests: at most max_blocks persistent blocks in the wgmma ring tiles' grids (a few blocks that
 * each run many items); 0: one wave, as the launch sizes it. */
void w4_test_cap_wg_blocks(int max_blocks);

/* `moeserve tune`: time every tile that fits on the GLM-5 shapes per bucket, print the table
 * (rejected tiles with their reason), save the winners to path (NULL: don't). */
typedef struct {
    int device, iters;
    const char *path;
    size_t budget;             /* 0: the device's */
    int quick;                 /* fewer buckets and smaller shapes (tests) */
    W4Table *out;              /* the result, if wanted */
} W4TuneOpts;
int cuda_w4_tune(const W4TuneOpts *o);

/* `moeserve bench kernels` (bench_kernels.cu; the options are parsed in src/bench/). */
typedef struct {
    int device, iters;
    const int *tokens; int n_tokens;   /* MoE token counts */
    const int *rows; int n_rows;       /* dense GEMM rows */
    int random, skewed;                /* routings */
    int no_moe, no_dense, v0;          /* v0: also the weights unpacked, on the dequantising GEMM (qgemm.cuh) */
    const char *torch_path;            /* tools/bench_torch_moe.py JSON lines, or NULL */
    const char *json_path;             /* results appended as JSON lines, or NULL */
    int tile, splits;                  /* W4Config override (-1, 0: the choice) */
    int warmup_ms;                     /* replays before the first timing (a tenth, <= 100 ms, before each other); 0: none */
} BenchKernelsOpts;
int cuda_bench_kernels(const BenchKernelsOpts *o);

#ifdef __cplusplus
}
#endif

#endif
