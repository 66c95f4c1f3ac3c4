/* w4.h: the NVFP4 W4A16 kernels (w4.cu), seen from C: which tensors they take, their tile
 * configurations and the shared memory each needs, the tuned table (`moeserve tune`), and
 * `moeserve bench kernels`. The tile logic (w4_tiles.c) is plain C, built and tested without a
 * GPU. */
#ifndef MOESERVE_W4_H
#define MOESERVE_W4_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tile configuration: nt n8 token tiles per block (8 nt tokens), st activation groups
 * staged in shared memory (cp.async ring; 0: each lane reads its activations from global
 * memory), ks warps splitting one row tile's K inside the block (1, or 4 with st 0: more warps
 * streaming at small batches, their sums added in shared memory), ss 1: the MoE gate and up
 * projections of a row tile on two warps instead of one (half the registers a warp holds, so
 * twice the warps resident; the up half crosses to the gate warp through shared memory for
 * SwiGLU; dense GEMMs have one stream and run such a tile as its ss 0 twin). Every block is 4
 * warps, except pf tiles.
 * pf 1: the MoE prefill block GEMM (many tokens per expert): nt / 4 x 4 warps, each warp 32
 * tokens x 4 W4P row tiles (gate and up of 2, or 4 of down), weights and activations both
 * staged by cp.async, st stages of half a record group (128 columns) each; ks 1, ss 0. Dense
 * GEMMs run such a tile as W4_PF_DENSE_TWIN.
 * pf 2: the MoE GEMM on wgmma (w4_wg.cuh; sm_90a only): 256 threads, 8 nt = 32, 64 or 128
 * tokens a block, st stages of 64 columns; activations stored permuted (w4_wg_perm). Elsewhere
 * the choice falls back to the pf tiles. wr (wg tiles): 0, each warp's next record group is
 * loaded into registers; else a ring of wr records per warp in shared memory, filled by bulk
 * copies wr - 1 groups ahead (memory-bound sizes: more bytes in flight without registers).
 * sc (ring tiles): chunks of 64 columns a stage waits for together, 0 or 1, or 2 (one barrier,
 * fence and commit group per 128 columns; st counts chunk slots either way). wr (pf 0, st 0
 * tiles 31 on: dense only, the MoE runs tile 10): each warp's records through wr slots of
 * shared memory by cp.async, wr - 1 groups ahead, instead of one group ahead in registers. */
typedef struct {
    int nt, st, ks, ss, pf, wr, sc;
} W4Tile;

/* The bits of a W4P code word that one A register of a k16 step takes (w4.cuh w4_decode): two
 * codes' 3 magnitude bits at 6..8 of each BF16 half (W4_MAG) and their signs at bit 15 (W4_SIGN).
 * Register 0 takes w & (MAG | SIGN), register 1 (w << 3) & (MAG | SIGN), register 3
 * (rotl(w, 13) & MAG) | ((w << 1) & SIGN); register 2, ((w << 6) & MAG) | ((w << 2) & SIGN),
 * takes them by one integer multiply of its masked source bits instead of two shifts (session 15:
 * 14 instructions a word instead of 15, on the pipe the shifts ran on: ptxas issues them as
 * IMAD.SHL): x * 68 = (x << 6) + (x << 2), whose cross terms (magnitudes << 2, signs << 6) land on
 * bits 2-4 and 18-20 (a carry reaches bit 21 at most), none of them MAG or SIGN. Register 3 has
 * a multiply form too, x * 0x2002 as a 64-bit product whose two words OR into the rotation, exact
 * for every word, but the 64-bit multiply (IMAD.WIDE) made the latency-bound tiles 3-6% slower.
 * w4_bits2 depends only on the bits it masks, so tests/unit/test_w4_tiles.c checks all 256 values
 * of them against the shift form. */
#define W4_MAG 0x01C001C0u
#define W4_SIGN 0x80008000u
#define W4_SRC2 ((W4_MAG >> 6) | (W4_SIGN >> 2))
#ifdef __CUDACC__
#define W4_HD __host__ __device__ __forceinline__
#else
#define W4_HD static inline
#endif
W4_HD uint32_t w4_bits2(uint32_t w) { return ((w & W4_SRC2) * 68u) & (W4_MAG | W4_SIGN); }

#define W4_N_TILES 37

/* pf 3 (dense only; the MoE runs tile 12): the stream-K decode GEMM (w4.cu w4_dense_sk_kernel),
 * one wave of 16-warp blocks, each block whole row tiles, each warp a contiguous run of records,
 * the activation rows of the block's token tile (up to 8 nt rows x K, BF16 halves) staged whole
 * in shared memory: the budget it needs depends on the call, which runs w4_sk_fallback's tile
 * where it is over (or the rows are more than 16, or the row tiles fewer than the wave's blocks).
 * pf 4 (dense only; the MoE runs it as tile 30): tile 30's GEMM on wgmma (sm_90a) for up to 32
 * rows, tile 28's from 33 (the same shared memory), above 64 rows in token tiles of 64 (a grid
 * dimension), the K split over as many blocks as one wave of two an SM holds (w4.cu
 * w4_dense_wg_kernel); its shared memory is tile 30's. A call it does not suit (N % 128) runs
 * w4_sk_fallback's tile; the stream-K tiles run it where they do not suit the call. */
#define W4_DENSE_WG_TILE 36

/* pf tiles' shared memory (w4.cu's w4_pf_gemm): a stage holds W4_PF_RECS records' halves, each
 * 1024 bytes of codes (2 chunks) and the record's 256 bytes of scales, then 8 nt activation rows
 * of 128 BF16 padded to 272 bytes (rows 16 bytes apart mod 128: 16-byte loads without bank
 * conflicts). Split activations run as a second pass over K, so a stage never holds two halves. */
#define W4_PF_RECS 16
#define W4_PF_REC_BYTES 1280
#define W4_PF_ROW_BYTES 272
#define W4_PF_STAGE(nt) (W4_PF_RECS * W4_PF_REC_BYTES + 8 * (nt) * W4_PF_ROW_BYTES)
/* the dense tile a pf tile runs as (nt 4, st 2: less shared memory than any pf tile) */
#define W4_PF_DENSE_TWIN 4
/* the dense tile a wg tile runs as (nt 2, st 2: fits wherever a wg tile fits) */
#define W4_WG_DENSE_TWIN 3
extern const W4Tile w4_tiles[W4_N_TILES];     /* the parameter space, by index */

/* Shared memory a block of this tile needs: the dynamic staging ring plus the static row
 * pointers (bytes). */
size_t w4_tile_smem(W4Tile t);
/* 1 if the tile fits budget bytes of shared memory per block; else 0 and why says by how much. */
int w4_tile_fits(W4Tile t, size_t budget, char *why, size_t n);

/* What an op runs: a tile index (-1: the built-in choice) and, for dense GEMMs, the K splits
 * (0: enough warps to fill the GPU). */
typedef struct {
    int tile;
    int splits;
} W4Config;

typedef enum { W4_DENSE, W4_MOE, W4_KINDS } W4Kind;
#define W4_BUCKETS 15   /* token count buckets: 1, 2, 3-4, 5-8, ..., 8193+ (w4_bucket) */
int w4_bucket(int tokens);
int w4_bucket_tokens(int b);                /* the bucket's upper end (its representative) */

/* 1 if the tile runs here: wg (pf 2) tiles need wgmma, which only sm_90a code has (wg: this
 * device and binary have it, w4_wg_supported); else 0 with why. */
int w4_tile_runs(W4Tile t, int wg, char *why, size_t n);

/* The built-in choice for tokens (the rows of a dense GEMM; for MoE, pairs per expert on
 * average is tokens * top-k / experts) among the tiles that fit budget and run here (wg: the wg
 * tiles do; split: activations enter as two BF16 halves, which doubles a tile's MMAs). */
int w4_default_tile(W4Kind kind, double rows_per_weight, size_t budget, int wg, int split);
/* What a dense GEMM of `rows` rows runs where a stream-K tile (pf 3) does not suit the call: the
 * built-in choice among the other tiles. */
int w4_sk_fallback(double rows, size_t budget, int split);
/* The MoE's expert classes beside the call's tile (w4_tiles.c): experts of more than *hot pairs
 * run on tile 29, of at most *small on tile 12 (0: no such class), for a call of T tokens on
 * `tile`; hot_ok: tile 29 runs and fits; hot_set, small_set: thresholds asked for, or -1 */
void w4_moe_classes(int tile, int T, int split, int hot_ok, int hot_set, int small_set, int *hot, int *small);
/* Stream-K launches so far (tests: that a call took tile 34's path, not its fallback). */
long w4_sk_calls(void);

/* The tuned table: a tile per (kind, bucket), -1 where untuned. */
typedef struct {
    char device[256];          /* the device key it was measured on (w4_device_key) */
    int tile[W4_KINDS][W4_BUCKETS];
} W4Table;

void w4_table_clear(W4Table *t);
/* The tile set's fingerprint (FNV-1a over W4_N_TILES and every tile's fields), as the cache
 * stores it: a table tuned by a build whose tiles differ (renumbered, reshaped, or fewer: the
 * tuner never timed the new ones) is stale, and w4_table_load refuses it. */
void w4_tiles_fingerprint(char *buf, size_t n);
void w4_fingerprint_of(const W4Tile *tiles, int count, char *buf, size_t n); /* of any table (tests) */
/* JSON: {"device": KEY, "tiles": FINGERPRINT, "dense": {"1": {"tile": t, ...}, ...}, "moe": {...}};
 * 0 ok, -1 with err (malformed, another tile set, a tile or bucket out of range) */
int w4_table_save(const W4Table *t, const char *path, char *err, size_t n);
int w4_table_load(W4Table *t, const char *path, char *err, size_t n);
/* $MOESERVE_TUNE_CACHE, else $XDG_CACHE_HOME/moeserve/w4-tune.json, else ~/.cache/... */
void w4_table_path(char *buf, size_t n);

/* ---- the CUDA side (w4.cu) ---- */

/* An NVFP4 tensor the W4P layout can hold: N % 16 == 0, K % 256 == 0. */
int w4_packable(const QTensor *w);
/* Every expert of the layer is packed and the shapes fit the grouped kernels. */
int w4_moe_ready(const LayerWeights *lw, const ModelConfig *c);
/* Force a configuration for the next ops (bench, tune, tests); {-1, 0} returns to the choice. */
/* Dense GEMMs of at least rows rows decode W to BF16 and run cuBLASLt (prefill); 0: never,
 * -1: MOESERVE_W4_LT_ROWS or the default, which w4_lt_rows gives for a weight of n rows (n <= 0:
 * the fewest of any weight): 1536 where tile 36 runs the call, 256 where it does not. */
void w4_set_lt_rows(int rows);
int w4_lt_rows(int n, int device);
/* Blocks a cluster of the stream-K launches (1, 2 or 4; they stage the rows together); 0:
 * MOESERVE_W4_SK_CLUSTER or the default (2 where rows x K x halves >= 24576, else 1). */
void w4_set_sk_cluster(int cl);
/* K parts of the stream-K launches (1, 2 or 4: a cluster of that many blocks takes the same row
 * tiles, each block a part of K, and adds the parts in its shared memory); 0: MOESERVE_W4_SK_KSPLIT
 * or the default. */
void w4_set_sk_ksplit(int s);
void w4_set_config(W4Config c);
/* Activations into the tensor cores as two BF16 halves (1, the default: float32-like accuracy)
 * or one (0: MOESERVE_W4_ACT=bf16, as other engines' W4A16 kernels); -1: the environment's. */
void w4_set_act_split(int on);
/* The MoE wg ring tiles (27-30) as persistent blocks that ask for their next item's weights
 * while they finish one (1, the default) or a block an item (0: MOESERVE_W4_WG_PERSIST=0); -1:
 * the environment's. max_blocks > 0 caps the persistent grid (tests: a few blocks that each run
 * many items). */
void w4_set_wg_persist(int on, int max_blocks);
/* The MoE's hot class on sm_90a: with tile 12, 13, 28 or 30, the experts of more than `pairs`
 * pairs of a call run on tile 29 (0: off; -1: MOESERVE_W4_MOE_HOT or the default, w4_moe_classes) */
void w4_set_moe_hot(int pairs);
/* tests: experts of at most `pairs` pairs of a call run on tile 12, beside the wg call tiles and
 * tile 13 (0: off; -1: MOESERVE_W4_MOE_SMALL or the default, w4_moe_classes) */
void w4_set_moe_small(int pairs);
/* tests: the small class beside the call's tile on a second stream, and the hot class beside the
 * call's tile 12 on a third (1); the hot class beside every call's tile too (2); both classes after
 * it on the one stream (0); -1: MOESERVE_W4_MOE_SIDE or the default (1) */
void w4_set_moe_side(int on);
/* the dense GEMMs launched on tile 36 (W4_DENSE_WG_TILE) so far (tests) */
long w4_dense_wg_calls(void);
/* The shared memory budget per block: the device's opt-in limit, or a simulated one (tests:
 * the 99 KB and 101 KB of sm_120 parts); 0 restores the device's. */
void w4_set_smem_budget(size_t bytes);
size_t w4_smem_budget(int device);
/* 1 if the wg tiles (w4_tile_runs) run on this device with this build (a probe kernel, once) */
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
    int no_moe, no_dense, v0;          /* v0: also the first (correctness) kernels */
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
