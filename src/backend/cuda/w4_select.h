/* w4_select.h: the tile configurations of the NVFP4 W4A16 kernels, by name, and which one an op
 * runs: the built-in choice (one table, w4_select.c, each row with the measurement behind it),
 * the MoE's expert classes, the thresholds the kernels' launches follow, and the tuned table
 * that `moeserve tune` writes and the backend reads at start. Plain C: tested without a GPU
 * (tests/unit/test_w4_tiles.c). */
#ifndef MOESERVE_W4_SELECT_H
#define MOESERVE_W4_SELECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel families a tile belongs to; each is its own file of src/backend/cuda. */
typedef enum {
    /* w4_dense.cu, w4_moe.cu: blocks of 4 warps on mma.sync, each warp one row tile of 16 weight
     * rows x 8 n8 tokens, the weights decoded in registers (w4_common.cuh w4_tile); dense GEMMs
     * and the MoE's decode-sized calls */
    W4_FAM_MMA,
    /* w4_moe_block.cu: the MoE's prefill block GEMM on mma.sync: n8 / 4 x 4 warps, each 32 tokens x
     * 4 row tiles, weights and activations both staged in shared memory by cp.async. MoE only
     * (dense runs it as W4_BLOCK_DENSE_TWIN). */
    W4_FAM_MMA_BLOCK,
    /* w4_moe_wgmma.cu: the MoE GEMM on wgmma (w4_wgmma.cuh; sm_90a): 2 warpgroups, 64 weight rows
     * each, up to 8 n8 tokens a block as wgmma's B from shared memory. MoE only (dense runs it as
     * W4_WGMMA_DENSE_TWIN). */
    W4_FAM_WGMMA,
    /* w4_streamk.cu: the dense decode GEMM in one wave of 16-warp blocks, each warp a contiguous
     * run of records, the block's activation rows staged once. Dense only (the MoE runs
     * W4_STREAMK_MOE_TWIN). */
    W4_FAM_STREAMK,
    /* w4_dense_wg.cu: a dense GEMM on the wgmma ring GEMM of the MoE's 32-token tile (64-token
     * above 32 rows), K split over one wave of blocks. Dense only (the MoE runs
     * W4_DENSE_WG_MOE_TWIN). */
    W4_FAM_DENSE_WG,
    W4_FAMILIES
} W4Family;

/* A tile configuration. Every field is a template parameter of its family's kernels, so a tile is
 * one set of kernel instances (w4_*.cu check their switch against this table at launch). */
typedef struct {
    const char *name; /* what it is: {dense_|moe_|}family_tokens_stages_...; the tuned table stores it */
    W4Family fam;
    int n8;           /* token tiles of 8 a block: 8 n8 tokens (the kernels' NT) */
    int stages;       /* activation stages in shared memory (mma: record groups of 256 columns; block: half
                       * groups; wgmma: chunk slots of 64 columns); 0: each lane reads its activations from
                       * global memory (L1) */
    int kwarps;       /* warps that split one row tile's K inside the block, their sums added in shared
                       * memory (1, or 4 with no stages: more warps streaming at small batches) */
    int gu_warps;     /* 1: the MoE's gate and up of a row tile on two warps instead of one (half the
                       * registers a warp holds, twice the warps resident; the up sums cross to the gate warp
                       * through shared memory for SwiGLU); a dense GEMM runs the tile without */
    int ring;         /* 0: each warp's next record group in registers; else a ring of this many records a
                       * warp in shared memory, filled ring - 1 groups ahead (bulk copies on wgmma, cp.async
                       * on mma.sync): more bytes in flight without registers */
    int chunks;       /* wgmma ring tiles: 64-column chunks a stage waits for together (0 or 1: one; 2: one
                       * barrier, fence and commit group per 128 columns) */
} W4Tile;

/* The tiles, in the order of their indices (the bench's --tile takes an index). */
typedef enum {
    W4T_MMA_8_L1,            /* 0: 8 tokens, activations through L1 */
    W4T_MMA_16_L1,
    W4T_MMA_32_L1,
    W4T_MMA_16_S2,           /* 3: 16 tokens, 2 staged record groups */
    W4T_MMA_32_S2,
    W4T_MMA_32_S3,
    W4T_MMA_32_S4,
    W4T_MMA_64_S2,           /* 7: 64 tokens: prefill */
    W4T_MMA_64_S3,
    W4T_MMA_64_S4,
    W4T_MMA_8_K4,            /* 10: K split over the block's 4 warps: decode */
    W4T_MMA_16_K4,
    W4T_MOE_MMA_8_GU,        /* 12: the MoE's gate and up on separate warps */
    W4T_MOE_MMA_16_GU,
    W4T_MOE_MMA_32_GU,
    W4T_MOE_MMA_16_S2_GU,
    W4T_MOE_MMA_32_S2_GU,
    W4T_MOE_MMA_32_S3_GU,
    W4T_MOE_MMA_64_S2_GU,
    W4T_MOE_BLOCK_64_S3,     /* 19: the MoE prefill block GEMM */
    W4T_MOE_BLOCK_64_S2,
    W4T_MOE_BLOCK_32_S3,
    W4T_MOE_WGMMA_128_S4,    /* 22: wgmma, weights through registers */
    W4T_MOE_WGMMA_128_S3,
    W4T_MOE_WGMMA_128_S6,
    W4T_MOE_WGMMA_64_S5,
    W4T_MOE_WGMMA_32_S4,
    W4T_MOE_WGMMA_32_S4_R4,  /* 27: wgmma, weights through a ring of records in shared memory */
    W4T_MOE_WGMMA_64_S3_R3,
    W4T_MOE_WGMMA_128_S4_R3,
    W4T_MOE_WGMMA_32_S6_R3_C2,
    W4T_DENSE_MMA_8_K4_R3,   /* 31: W4T_MMA_8_K4 with the weights through a ring */
    W4T_DENSE_MMA_8_K4_R4,
    W4T_DENSE_MMA_16_K4_R3,
    W4T_DENSE_STREAMK_8,     /* 34: stream-K dense decode */
    W4T_DENSE_STREAMK_16,
    W4T_DENSE_WG_SPLITK,     /* 36: dense split-K on the 32-token wgmma ring GEMM */
    W4_N_TILES
} W4TileId;

extern const W4Tile w4_tiles[W4_N_TILES];

/* What a tile of a MoE-only family runs as in a dense GEMM, and a dense-only one in the MoE: */
#define W4_BLOCK_DENSE_TWIN W4T_MMA_32_S2    /* less shared memory than any block tile */
#define W4_WGMMA_DENSE_TWIN W4T_MMA_16_S2    /* fits wherever a wgmma tile fits */
#define W4_STREAMK_MOE_TWIN W4T_MOE_MMA_8_GU /* the MoE's decode tile */
#define W4_DENSE_WG_MOE_TWIN W4T_MOE_WGMMA_32_S6_R3_C2 /* the MoE tile whose GEMM it runs */
#define W4_DENSE_RING_MOE_TWIN W4T_MMA_8_K4   /* the dense ring tiles' register twin */
/* The MoE's expert classes beside the call's tile (w4_moe_classes): their tiles */
#define W4_HOT_TILE W4T_MOE_WGMMA_128_S4_R3
#define W4_SMALL_TILE W4T_MOE_MMA_8_GU

/* The tile of that name, or -1. */
int w4_tile_by_name(const char *name);

/* block tiles' shared memory (w4_moe_block.cu): a stage holds W4_BLOCK_RECS records' halves, each
 * 1024 bytes of codes (2 chunks) and the record's 256 bytes of scales, then 8 n8 activation rows
 * of 128 BF16 padded to 272 bytes (rows 16 bytes apart mod 128: 16-byte loads without bank
 * conflicts). Split activations run as a second pass over K, so a stage never holds two halves. */
#define W4_BLOCK_RECS 16
#define W4_BLOCK_REC_BYTES 1280
#define W4_BLOCK_ROW_BYTES 272
#define W4_BLOCK_STAGE(nt) (W4_BLOCK_RECS * W4_BLOCK_REC_BYTES + 8 * (nt) * W4_BLOCK_ROW_BYTES)

/* Shared memory a block of this tile needs: the dynamic staging ring plus the static row pointers
 * (bytes; 0 for stream-K, whose staged rows are the call's: w4_streamk.cu checks them). */
size_t w4_tile_smem(W4Tile t);
/* 1 if the tile fits budget bytes of shared memory per block; else 0 and why says by how much. */
int w4_tile_fits(W4Tile t, size_t budget, char *why, size_t n);
/* 1 if the tile runs here: the wgmma families need sm_90a code (wg: this device and binary have
 * it, w4_wg_supported); else 0 with why. */
int w4_tile_runs(W4Tile t, int wg, char *why, size_t n);

typedef enum { W4_DENSE, W4_MOE, W4_KINDS } W4Kind;
#define W4_BUCKETS 15   /* token count buckets: 1, 2, 3-4, 5-8, ..., 8193+ (w4_bucket) */
int w4_bucket(int tokens);
int w4_bucket_tokens(int b);                /* the bucket's upper end (its representative) */

/* ---- the built-in choice (w4_select.c w4_rules: the table, a row a choice, its reason) ---- */

typedef enum { W4_ANY, W4_YES, W4_NO } W4Cond;
/* The choices the table makes: a dense GEMM's tile; the dense choice among the mma.sync tiles
 * where the stream-K and split-K wgmma tiles do not suit the call; the MoE's call tile. */
typedef enum { W4_RULE_DENSE, W4_RULE_DENSE_MMA, W4_RULE_MOE } W4RuleKind;
#define W4_RULE_TILES 12
typedef struct {
    W4RuleKind kind;
    W4Cond wg;                 /* wgmma runs here (sm_90a code) */
    W4Cond split;              /* activations as two BF16 halves (MOESERVE_W4_ACT=split) */
    double min, max;           /* rows per weight, both ends included (dense: rows; MoE: pairs an expert) */
    int tiles[W4_RULE_TILES];  /* the first that fits the budget and runs here; -1 ends the list */
    const char *why;           /* the measurement behind it: card, what was timed, the gain */
} W4Rule;
extern const W4Rule w4_rules[];
extern const int w4_n_rules;

/* The built-in choice for a dense GEMM of `rows` rows or a MoE call of rows = tokens * top-k /
 * experts pairs per expert on average: the first row of w4_rules of the kind whose conditions hold
 * and one of whose tiles fits budget and runs here (wg; split: activations as two BF16 halves,
 * which doubles a tile's MMAs). For dense, the W4_RULE_DENSE_MMA rows follow the dense ones. */
int w4_default_tile(W4Kind kind, double rows, size_t budget, int wg, int split);
/* What a dense GEMM of `rows` rows runs where the stream-K or split-K wgmma tile does not suit the
 * call: the W4_RULE_DENSE_MMA rows. */
int w4_sk_fallback(double rows, size_t budget, int split);

/* ---- the MoE's expert classes (w4_select.c w4_class_rules) ----
 * Beside some call tiles the experts of more than `hot` pairs of a call run on W4_HOT_TILE and
 * those of at most `small` on W4_SMALL_TILE, each class its own launches (w4_moe.cu). */
typedef struct {
    int tile;                  /* the call's tile */
    int hot;                   /* pairs above which an expert is hot (0: no hot class) */
    int hot_from[2];           /* ... in calls of at least this many tokens (BF16, split activations) */
    int small[2];              /* pairs up to which an expert is small (BF16, split; 0: none) */
    int hot_beside;            /* the hot class on a stream of its own beside the call's tile (else after
                                * it on the call's stream; MOESERVE_W4_MOE_SIDE 1, the default) */
    const char *why;
} W4ClassRule;
extern const W4ClassRule w4_class_rules[];
extern const int w4_n_class_rules;
/* The classes for a call of T tokens on `tile`: *hot, *small pairs (0: no such class); hot_ok:
 * W4_HOT_TILE runs and fits; hot_set, small_set: thresholds asked for (MOESERVE_W4_MOE_HOT and
 * _SMALL), or -1. None hot where no expert can pass the threshold (T at most it), and an expert in
 * one class only (no small class at or above the hot threshold). */
void w4_moe_classes(int tile, int T, int split, int hot_ok, int hot_set, int small_set, int *hot, int *small);
/* 1 where the hot class runs beside `tile` on a stream of its own by default (hot_beside) */
int w4_moe_hot_beside(int tile);

/* ---- the thresholds the launches follow (w4_select.c, with their reasons) ---- */

/* Rows from which a dense GEMM of a weight with n rows decodes W to BF16 and runs cuBLASLt
 * (prefill): where the split-K wgmma tile runs the call (dense_wg: N % 128 == 0, wgmma, its shared
 * memory fits), else from fewer rows. */
int w4_lt_rows_default(int dense_wg);
/* Stream-K: blocks of a cluster that stage the activation rows together, for `staged` values
 * (rows x K, twice with split activations): 1 or 2. */
int w4_sk_cluster_default(long staged);
/* Stream-K: parts of K a cluster's blocks take (1: K whole, 4: a cluster of 4 blocks each a
 * quarter), for a launch of n8 token tiles; fits: the launch with K whole runs (its rows within
 * the shared memory budget, as many row tiles as SMs). */
int w4_sk_ksplit_default(int n8, int fits);
/* Dense at up to 8 rows where stream-K does not suit the call: the split-K wgmma tile for weights
 * of at least this many rows, the mma.sync K-split tile below (its K split into items of 2 record
 * groups over fewer than 32 row blocks; H200: GLM-5 q_a at 1 row 8.7 us against 10.1) */
#define W4_DENSE_WG_MIN_N (32 * 128)
/* K splits of a dense mma.sync launch of T rows of an N x K weight on tile (n8, kwarps): about 16
 * warps an SM stream weights, at most 16 splits and at most the record groups; forced > 0: that. */
int w4_mma_splits(int T, int N, int K, int n8, int kwarps, int sms, int forced);

/* ---- the tuned table (`moeserve tune`): a tile per (kind, bucket), -1 where untuned ---- */

typedef struct {
    char device[256];          /* the device key it was measured on (w4_device_key) */
    int tile[W4_KINDS][W4_BUCKETS];
} W4Table;

void w4_table_clear(W4Table *t);
/* The tile set's fingerprint (FNV-1a over the count and every tile's name and fields), as the
 * cache stores it: a table tuned by a build whose tiles differ (renamed, reshaped, or more: the
 * tuner never timed the new ones) is stale, and w4_table_load refuses it. */
void w4_tiles_fingerprint(char *buf, size_t n);
void w4_fingerprint_of(const W4Tile *tiles, int count, char *buf, size_t n); /* of any table (tests) */
/* JSON: {"device": KEY, "tiles": FINGERPRINT, "dense": {"1": {"tile": NAME}, ...}, "moe": {...}};
 * 0 ok, -1 with err (malformed, another tile set, an unknown tile or a bucket out of range) */
int w4_table_save(const W4Table *t, const char *path, char *err, size_t n);
int w4_table_load(W4Table *t, const char *path, char *err, size_t n);
/* $MOESERVE_TUNE_CACHE, else $XDG_CACHE_HOME/moeserve/w4-tune.json, else ~/.cache/... */
void w4_table_path(char *buf, size_t n);

/* The bits of a W4P code word that one A register of a k16 step takes (w4_common.cuh w4_decode):
 * two codes' 3 magnitude bits at 6..8 of each BF16 half (W4_MAG) and their signs at bit 15
 * (W4_SIGN). Register 0 takes w & (MAG | SIGN), register 1 (w << 3) & (MAG | SIGN), register 3
 * (rotl(w, 13) & MAG) | ((w << 1) & SIGN); register 2, ((w << 6) & MAG) | ((w << 2) & SIGN), takes
 * them by one integer multiply of its masked source bits instead of two shifts (14 instructions a
 * word instead of 15, on the pipe the shifts ran on: ptxas issues them as IMAD.SHL): x * 68 =
 * (x << 6) + (x << 2), whose cross terms (magnitudes << 2, signs << 6) land on bits 2-4 and 18-20
 * (a carry reaches bit 21 at most), none of them MAG or SIGN. w4_bits2 depends only on the bits it
 * masks, so tests/unit/test_w4_tiles.c checks all 256 values of them against the shift form. */
#define W4_MAG 0x01C001C0u
#define W4_SIGN 0x80008000u
#define W4_SRC2 ((W4_MAG >> 6) | (W4_SIGN >> 2))
#ifdef __CUDACC__
#define W4_HD __host__ __device__ __forceinline__
#else
#define W4_HD static inline
#endif
W4_HD uint32_t w4_bits2(uint32_t w) { return ((w & W4_SRC2) * 68u) & (W4_MAG | W4_SIGN); }

#ifdef __cplusplus
}
#endif

#endif
