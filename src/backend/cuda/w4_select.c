/* w4_select: the W4A16 kernels' tile configurations by name, what shared memory each needs, the
 * built-in choice as one table (w4_rules, each row with the measurement that put it there), the
 * MoE's expert classes (w4_class_rules), the thresholds the launches follow, and the tuned table's
 * file. Plain C: tested without a GPU (tests/unit/test_w4_tiles.c). Each reason gives the card and
 * the figure; how and when it was measured is in docs/log/2026-12-02-w4a16-kernels-sessions-1-26.md. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../base/knobs.h"
#include "../../base/util.h"
#include "w4_select.h"

/* kept in step with w4_common.cuh: W4_XS = 264 elements per staged row, 2 bytes each, and each
 * token staged twice (the high and low BF16 halves of the activation) */
#define XS_BYTES (264 * 2)

#define MMA W4_FAM_MMA
#define BLOCK W4_FAM_MMA_BLOCK
#define WGMMA W4_FAM_WGMMA
/*                                        name                   family       n8 st kw gu ring chunks */
const W4Tile w4_tiles[W4_N_TILES] = {
    [W4T_MMA_8_L1] =               {"mma_8_l1",               MMA,             1, 0, 1, 0, 0, 0},
    [W4T_MMA_16_L1] =              {"mma_16_l1",              MMA,             2, 0, 1, 0, 0, 0},
    [W4T_MMA_32_L1] =              {"mma_32_l1",              MMA,             4, 0, 1, 0, 0, 0},
    [W4T_MMA_16_S2] =              {"mma_16_s2",              MMA,             2, 2, 1, 0, 0, 0},
    [W4T_MMA_32_S2] =              {"mma_32_s2",              MMA,             4, 2, 1, 0, 0, 0},
    [W4T_MMA_32_S3] =              {"mma_32_s3",              MMA,             4, 3, 1, 0, 0, 0},
    [W4T_MMA_32_S4] =              {"mma_32_s4",              MMA,             4, 4, 1, 0, 0, 0},
    [W4T_MMA_64_S2] =              {"mma_64_s2",              MMA,             8, 2, 1, 0, 0, 0},
    [W4T_MMA_64_S3] =              {"mma_64_s3",              MMA,             8, 3, 1, 0, 0, 0},
    [W4T_MMA_64_S4] =              {"mma_64_s4",              MMA,             8, 4, 1, 0, 0, 0},
    [W4T_MMA_8_K4] =               {"mma_8_k4",               MMA,             1, 0, 4, 0, 0, 0},
    [W4T_MMA_16_K4] =              {"mma_16_k4",              MMA,             2, 0, 4, 0, 0, 0},
    [W4T_MOE_MMA_8_GU] =           {"moe_mma_8_gu",           MMA,             1, 0, 1, 1, 0, 0},
    [W4T_MOE_MMA_16_GU] =          {"moe_mma_16_gu",          MMA,             2, 0, 1, 1, 0, 0},
    [W4T_MOE_MMA_32_GU] =          {"moe_mma_32_gu",          MMA,             4, 0, 1, 1, 0, 0},
    [W4T_MOE_MMA_16_S2_GU] =       {"moe_mma_16_s2_gu",       MMA,             2, 2, 1, 1, 0, 0},
    [W4T_MOE_MMA_32_S2_GU] =       {"moe_mma_32_s2_gu",       MMA,             4, 2, 1, 1, 0, 0},
    [W4T_MOE_MMA_32_S3_GU] =       {"moe_mma_32_s3_gu",       MMA,             4, 3, 1, 1, 0, 0},
    [W4T_MOE_MMA_64_S2_GU] =       {"moe_mma_64_s2_gu",       MMA,             8, 2, 1, 1, 0, 0},
    [W4T_MOE_BLOCK_64_S3] =        {"moe_block_64_s3",        BLOCK,           8, 3, 1, 0, 0, 0},
    [W4T_MOE_BLOCK_64_S2] =        {"moe_block_64_s2",        BLOCK,           8, 2, 1, 0, 0, 0},
    [W4T_MOE_BLOCK_32_S3] =        {"moe_block_32_s3",        BLOCK,           4, 3, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_128_S4] =       {"moe_wgmma_128_s4",       WGMMA,          16, 4, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_128_S3] =       {"moe_wgmma_128_s3",       WGMMA,          16, 3, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_128_S6] =       {"moe_wgmma_128_s6",       WGMMA,          16, 6, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_64_S5] =        {"moe_wgmma_64_s5",        WGMMA,           8, 5, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_32_S4] =        {"moe_wgmma_32_s4",        WGMMA,           4, 4, 1, 0, 0, 0},
    [W4T_MOE_WGMMA_32_S4_R4] =     {"moe_wgmma_32_s4_r4",     WGMMA,           4, 4, 1, 0, 4, 0},
    [W4T_MOE_WGMMA_64_S3_R3] =     {"moe_wgmma_64_s3_r3",     WGMMA,           8, 3, 1, 0, 3, 0},
    [W4T_MOE_WGMMA_128_S4_R3] =    {"moe_wgmma_128_s4_r3",    WGMMA,          16, 4, 1, 0, 3, 0},
    [W4T_MOE_WGMMA_32_S6_R3_C2] =  {"moe_wgmma_32_s6_r3_c2",  WGMMA,           4, 6, 1, 0, 3, 2},
    [W4T_DENSE_MMA_8_K4_R3] =      {"dense_mma_8_k4_r3",      MMA,             1, 0, 4, 0, 3, 0},
    [W4T_DENSE_MMA_8_K4_R4] =      {"dense_mma_8_k4_r4",      MMA,             1, 0, 4, 0, 4, 0},
    [W4T_DENSE_MMA_16_K4_R3] =     {"dense_mma_16_k4_r3",     MMA,             2, 0, 4, 0, 3, 0},
    [W4T_DENSE_STREAMK_8] =        {"dense_streamk_8",        W4_FAM_STREAMK,  1, 0, 1, 0, 0, 0},
    [W4T_DENSE_STREAMK_16] =       {"dense_streamk_16",       W4_FAM_STREAMK,  2, 0, 1, 0, 0, 0},
    /* the 32-token wgmma ring tile's GEMM (the 64-token one's above 32 rows), its shared memory */
    [W4T_DENSE_WG_SPLITK] =        {"dense_wg_splitk_32",      W4_FAM_DENSE_WG, 4, 6, 1, 0, 3, 2},
};
#undef MMA
#undef BLOCK
#undef WGMMA

int w4_tile_by_name(const char *name)
{
    for (int i = 0; i < W4_N_TILES; i++)
        if (!strcmp(w4_tiles[i].name, name)) return i;
    return -1;
}

static int wgmma_family(W4Family f) { return f == W4_FAM_WGMMA || f == W4_FAM_DENSE_WG; }

size_t w4_tile_smem(W4Tile t)
{
    if (t.fam == W4_FAM_STREAMK) /* the static part; the staged rows depend on the call (w4_streamk.cu checks them) */
        return 0;
    if (wgmma_family(t.fam)) /* stages of 2 halves x 8 n8 rows x 128 B, 1024-aligned; 8 warps' record rings and
                              * their 8-byte barriers (W4_REC: 2304 B a record); the row pointers */
        return (size_t)t.stages * 2 * 8 * t.n8 * 128 + 1024 + (size_t)8 * t.ring * (2304 + 8) + (size_t)8 * t.n8 * sizeof(void *);
    if (t.fam == W4_FAM_MMA_BLOCK) /* the stages, plus the row pointers, the block's record pointers and the tile's facts (an int4) */
        return (size_t)t.stages * W4_BLOCK_STAGE(t.n8) + (size_t)8 * t.n8 * sizeof(void *) + W4_BLOCK_RECS * sizeof(void *) + 16;
    size_t dyn = (size_t)t.stages * 2 * 8 * t.n8 * XS_BYTES, rowp = (size_t)8 * t.n8 * sizeof(void *);
    size_t red = t.kwarps > 1 ? (size_t)(t.kwarps - 1) * 2 * t.n8 * 4 * 32 * sizeof(float) : 0; /* 2: gate and up */
    if (t.gu_warps) red = (size_t)(4 / 2) * t.n8 * 4 * 32 * sizeof(float); /* the up sums of the block's 2 row tiles */
    size_t ring = (size_t)4 * t.ring * 2304; /* dense ring tiles: 4 warps x ring records */
    return dyn + rowp + red + ring;
}

int w4_tile_fits(W4Tile t, size_t budget, char *why, size_t n)
{
    size_t need = w4_tile_smem(t);
    if (need <= budget) return 1;
    if (why && wgmma_family(t.fam))
        snprintf(why, n, "needs %zu B of shared memory (%d stages x 2 halves x %d tokens x 128 B, 1 KB alignment, "
                 "8 warps x %d ring records, row pointers), %zu B over the %zu B budget", need, t.stages, 8 * t.n8, t.ring,
                 need - budget, budget);
    else if (why && t.fam == W4_FAM_MMA_BLOCK)
        snprintf(why, n, "needs %zu B of shared memory (%d stages x (%d records x %d B + %d tokens x %d B), row and record "
                 "pointers, 16 B), %zu B over the %zu B budget", need, t.stages, W4_BLOCK_RECS, W4_BLOCK_REC_BYTES, 8 * t.n8,
                 W4_BLOCK_ROW_BYTES, need - budget, budget);
    else if (why)
        snprintf(why, n, "needs %zu B of shared memory (%d stages x %d tokens x 2 halves x %d B, row pointers, K-split sums), "
                 "%zu B over the %zu B budget", need, t.stages, 8 * t.n8, XS_BYTES, need - budget, budget);
    return 0;
}

int w4_bucket(int tokens)
{
    int b = 0;
    while (b < W4_BUCKETS - 1 && (1 << b) < tokens) b++;
    return b;
}

int w4_bucket_tokens(int b) { return 1 << b; }

int w4_tile_runs(W4Tile t, int wg, char *why, size_t n)
{
    if (!wgmma_family(t.fam) || wg) return 1;
    if (why) snprintf(why, n, "runs on wgmma, which needs an sm_90a GPU (H100, H200) and a build for it (CUDA_ARCH with sm_90a)");
    return 0;
}

/* ---- the built-in choice ----
 * A row: which choice, the conditions (wgmma here, split activations, rows per weight from min to
 * max), the tiles in order of preference (each falls back to smaller ones where the budget is
 * short), and why. The first row whose conditions hold and one of whose tiles fits and runs wins;
 * where none does, mma_8_l1 (64 bytes of shared memory). */
#define INF HUGE_VAL
#define END -1
#define RING_32 W4T_MOE_WGMMA_32_S6_R3_C2, W4T_MOE_WGMMA_32_S4_R4, W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1
#define WGMMA_FALLBACK W4T_MOE_WGMMA_128_S6, W4T_MOE_WGMMA_128_S3, W4T_MOE_BLOCK_64_S3, W4T_MOE_BLOCK_64_S2, \
                       W4T_MOE_BLOCK_32_S3, W4T_MMA_64_S2, W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1
const W4Rule w4_rules[] = {
    /* dense: decode on stream-K where the call suits it (w4_streamk.cu says when), then split-K wgmma */
    {W4_RULE_DENSE, W4_ANY, W4_ANY, 0, 8, {W4T_DENSE_STREAMK_8, END},
     "H200: GLM-5 gate/up at 1 row in a chain 14.2 us BF16 against mma_8_k4's 20.7, split 16.8-17.8 against "
     "dense_mma_8_k4_r3's 26.6-27.2"},
    {W4_RULE_DENSE, W4_ANY, W4_ANY, 0, 16, {W4T_DENSE_STREAMK_16, END},
     "H200: 16 rows GLM-4.5 q_proj 25.1 -> 19.1 us, GLM-5 q_b 17.1 -> 10.9 BF16 against mma_16_s2"},
    {W4_RULE_DENSE, W4_ANY, W4_ANY, 0, INF, {W4T_DENSE_WG_SPLITK, END},
     "H200: GLM-5 o_proj at 24 rows 67 -> 30 us BF16 (98 -> 38 split), 64 rows 114 -> 45 (189 -> "
     "63), 128 rows 304 -> 87 (679 -> 130) against the mma.sync tiles"},
    /* dense on mma.sync, where the tiles above do not suit the call or do not run */
    {W4_RULE_DENSE_MMA, W4_ANY, W4_YES, 0, 8, {W4T_DENSE_MMA_8_K4_R3, W4T_MMA_8_K4, W4T_MMA_8_L1, END},
     "H200: split activations 13-28% faster than mma_8_k4 on the large GLM shapes (o_proj 1 row 39.3 "
     "against 47.1 us, gate/up 8 rows 37.9 against 52.6)"},
    {W4_RULE_DENSE_MMA, W4_ANY, W4_NO, 0, 8, {W4T_MMA_8_K4, W4T_MMA_8_L1, END},
     "H200: with BF16 activations the weight ring is no faster than mma_8_k4"},
    {W4_RULE_DENSE_MMA, W4_ANY, W4_ANY, 0, 16, {W4T_MMA_16_S2, W4T_MMA_8_L1, END},
     "H200, `moeserve tune`: 16 rows, two staged groups of 16 tokens"},
    {W4_RULE_DENSE_MMA, W4_ANY, W4_ANY, 0, 64, {W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1, END},
     "H200, `moeserve tune`: up to 64 rows, 32 tokens a block"},
    {W4_RULE_DENSE_MMA, W4_ANY, W4_ANY, 0, INF, {W4T_MMA_64_S2, W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1, END},
     "H200, `moeserve tune`: prefill, 64 tokens a block"},
    /* MoE, by pairs an expert: decode on mma.sync (gate and up on two warps), then the wgmma ring
     * tiles of 32, 64 and 128 tokens; without wgmma the mma.sync and block GEMM tiles */
    {W4_RULE_MOE, W4_ANY, W4_ANY, 0, 6, {W4T_MOE_MMA_8_GU, W4T_MMA_8_L1, END},
     "H200: 1-7% faster than mma_8_l1 from 1 to 256 tokens"},
    {W4_RULE_MOE, W4_YES, W4_NO, 0, 11, {W4T_MOE_MMA_16_GU, W4T_MOE_MMA_8_GU, W4T_MMA_8_L1, END},
     "H200: 256 tokens 1.73-1.75 ms against moe_mma_8_gu's 1.98-2.04 and the 32-token ring's 2.00-2.02 "
     "(with split activations the slowest: not there)"},
    {W4_RULE_MOE, W4_YES, W4_NO, 0, 24, {RING_32, END},
     "H200: 24 pairs 2.34 ms against the 64-token ring's 2.52; also 3% faster than "
     "moe_wgmma_32_s4_r4 at 8-16 pairs"},
    {W4_RULE_MOE, W4_YES, W4_YES, 0, 36, {RING_32, END},
     "H200: split activations, 32 pairs 3.79 ms against the 64-token ring's 4.03"},
    {W4_RULE_MOE, W4_YES, W4_ANY, 0, 128, {W4T_MOE_WGMMA_64_S3_R3, WGMMA_FALLBACK, END},
     "H200: 2048 tokens (64 pairs) BF16 random 3.52-3.61 ms against the 128-token ring's 3.78-3.85, "
     "skewed 3.88-3.97 against 4.33-4.35; split random 5% faster"},
    {W4_RULE_MOE, W4_YES, W4_ANY, 0, INF, {W4T_MOE_WGMMA_128_S4_R3, WGMMA_FALLBACK, END},
     "H200: 256 pairs 12.56 ms against moe_wgmma_128_s6's 14.99, split 19.77 against 21.38"},
    {W4_RULE_MOE, W4_NO, W4_ANY, 0, 8, {W4T_MOE_MMA_8_GU, W4T_MMA_8_L1, END},
     "H200: 1-7% faster than mma_8_l1 from 1 to 256 tokens"},
    {W4_RULE_MOE, W4_NO, W4_ANY, 0, 24, {W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1, END},
     "H200, `moeserve tune`: up to 24 pairs, 32 tokens a block"},
    {W4_RULE_MOE, W4_NO, W4_ANY, 48, INF,
     {W4T_MOE_BLOCK_64_S3, W4T_MOE_BLOCK_64_S2, W4T_MOE_BLOCK_32_S3, W4T_MMA_64_S2, W4T_MMA_32_S2, W4T_MMA_16_S2,
      W4T_MMA_8_L1, END},
     "H200: from 48 pairs the block GEMM (moe_block_64_s2 fits 99 KB, moe_block_32_s3 101 KB)"},
    {W4_RULE_MOE, W4_NO, W4_ANY, 0, INF, {W4T_MMA_64_S2, W4T_MMA_32_S2, W4T_MMA_16_S2, W4T_MMA_8_L1, END},
     "H200, `moeserve tune`: 25-47 pairs, 64 tokens a block"},
};
const int w4_n_rules = (int)(sizeof w4_rules / sizeof w4_rules[0]);
#undef RING_32
#undef WGMMA_FALLBACK

static int cond_holds(W4Cond c, int v) { return c == W4_ANY || (c == W4_YES) == (v != 0); }

/* the first row of `kind` that holds and has a tile that fits and runs; -1 if none */
static int choose(W4RuleKind kind, double rows, size_t budget, int wg, int split)
{
    for (int r = 0; r < w4_n_rules; r++) {
        const W4Rule *u = &w4_rules[r];
        if (u->kind != kind || !cond_holds(u->wg, wg) || !cond_holds(u->split, split) || rows < u->min || rows > u->max) continue;
        for (int i = 0; i < W4_RULE_TILES && u->tiles[i] != END; i++) {
            W4Tile t = w4_tiles[u->tiles[i]];
            if (w4_tile_fits(t, budget, NULL, 0) && w4_tile_runs(t, wg, NULL, 0)) return u->tiles[i];
        }
    }
    return -1;
}
#undef END

int w4_sk_fallback(double rows, size_t budget, int split)
{
    int t = choose(W4_RULE_DENSE_MMA, rows, budget, 0, split);
    return t >= 0 ? t : W4T_MMA_8_L1;
}

int w4_default_tile(W4Kind kind, double rows, size_t budget, int wg, int split)
{
    int t = choose(kind == W4_MOE ? W4_RULE_MOE : W4_RULE_DENSE, rows, budget, wg, split);
    if (t >= 0) return t;
    return kind == W4_MOE ? W4T_MMA_8_L1 : w4_sk_fallback(rows, budget, split);
}

/* ---- the MoE's expert classes ----
 * Hot experts: with skewed routing a few experts hold many pairs, and on the small tiles each of
 * their token tiles decoded the expert's weights again; above the threshold an expert runs on the
 * 128-token ring tile, the routing kernel listing the classes' token tiles apart (w4_moe.cu). The
 * threshold: two of the call's token tiles, one on the 64-token ring. Small experts: with skewed
 * routing most experts get a few pairs while a few get hundreds, and the call's tile, chosen by the
 * average, streamed each cold expert's weights through a tile built for 16-128 tokens; at most the
 * threshold an expert runs on the 8-token decode tile (it packs the two halves of up to 4 tokens
 * into one MMA: 4 pairs with split activations). */
const W4ClassRule w4_class_rules[] = {
    {W4T_MOE_WGMMA_64_S3_R3, 64, {0, 0}, {8, 4}, 0,
     "H200: hot above 64 pairs 5-10% faster than above 128 at 2048 tokens; also small BF16 skewed 512 "
     "tokens -12%, split skewed 256 -13% (at 8 pairs split random 256 was 6% slower)"},
    {W4T_MOE_WGMMA_32_S6_R3_C2, 64, {0, 0}, {8, 4}, 0,
     "H200: as the 64-token ring; also the hot class beside it mixed (384 tokens random BF16 +3%)"},
    {W4T_MOE_MMA_16_GU, 32, {0, 0}, {6, 4}, 0, "H200: small up to 6 pairs, 256 tokens -3% random, -7% skewed"},
    {W4T_MOE_MMA_8_GU, 16, {128, 64}, {0, 0}, 1,
     "H200: skewed 128-192 tokens 8-14% faster BF16, 13-20% split; at 64 tokens BF16 3% slower, from 8 pairs "
     "split random 128 4% slower (a few experts of 9-12 pairs make a latency-bound launch); also beside it on a "
     "stream of its own, 192 tokens random -2 to -8%, skewed 128-192 -2 to -6%"},
    {W4T_MOE_WGMMA_128_S4_R3, 0, {0, 0}, {8, 4}, 0, "H200: as the 64-token ring"},
};
const int w4_n_class_rules = (int)(sizeof w4_class_rules / sizeof w4_class_rules[0]);

void w4_moe_classes(int tile, int T, int split, int hot_ok, int hot_set, int small_set, int *hot, int *small)
{
    int h = 0, s = 0;
    for (int r = 0; r < w4_n_class_rules; r++) {
        const W4ClassRule *u = &w4_class_rules[r];
        if (u->tile != tile) continue;
        if (hot_ok && u->hot && T >= u->hot_from[split != 0]) h = hot_set >= 0 ? hot_set : u->hot;
        if (u->small[split != 0]) s = small_set >= 0 ? small_set : u->small[split != 0];
    }
    if (h >= T) h = 0;
    if (h > 0 && s >= h) s = 0; /* an expert in one class only */
    *hot = h;
    *small = s;
}

int w4_moe_hot_beside(int tile)
{
    for (int r = 0; r < w4_n_class_rules; r++)
        if (w4_class_rules[r].tile == tile) return w4_class_rules[r].hot_beside;
    return 0;
}

/* ---- the thresholds of the launches ---- */

/* H200: the split-K wgmma tile in token tiles of 64 costs ~0.36 us a row on GLM-5
 * gate/up (BF16; 0.55 split), the BF16 + cuBLASLt route ~200 us (decoding W and cuBLASLt's start)
 * plus 0.23 a row (0.40 split): even at 1536 rows (517 against 522 us BF16), the route ahead from
 * 2048. The mma.sync tiles (N % 128 != 0: kv_a, q_a+kv_a) lose to the route 2-4x from 256 rows. */
int w4_lt_rows_default(int dense_wg) { return dense_wg ? 1536 : 256; }

/* H200: clusters of 2 blocks (a TPC's two SMs) stage the rows together: GLM-5 o_proj
 * 4 rows 23.0 -> 21.5 us BF16, GLM-4.5 o_proj 8 rows 22.4 -> 19.7; small stagings lose the
 * cluster barrier's 0.1-0.3 us, and clusters of 4 leave SMs of the wave idle. */
int w4_sk_cluster_default(long staged) { return staged >= 24576 ? 2 : 1; }

/* H200: where the launch with K whole cannot run up to 8 rows, 4 parts: GLM-5 shared
 * gate/up 2048 x 6144 at 1-8 rows 9.0-10.4 -> 7.3-8.1 us BF16, o_proj 8 rows 28.0 -> 23.1; where K
 * whole runs, the cluster's start and two barriers cost 1-3 us at 1 row. */
int w4_sk_ksplit_default(int n8, int fits) { return fits || n8 > 1 ? 1 : 4; }

int w4_mma_splits(int T, int N, int K, int n8, int kwarps, int sms, int forced)
{
    int ng = K / 256;
    if (forced > 0) return forced < ng ? forced : ng;
    int64_t warps = (int64_t)(N / 16) * ((T + 8 * n8 - 1) / (8 * n8)) * kwarps;
    int s = (int)((16L * sms + warps - 1) / warps);
    return s < 1 ? 1 : s > ng ? ng : s > 16 ? 16 : s;
}

/* ---- the tuned table ---- */

void w4_table_clear(W4Table *t)
{
    memset(t, 0, sizeof *t);
    for (int k = 0; k < W4_KINDS; k++)
        for (int b = 0; b < W4_BUCKETS; b++) t->tile[k][b] = -1;
}

static const char *const kind_key[W4_KINDS] = {"dense", "moe"};

/* FNV-1a (64 bits) of the 4 bytes of v, little end first */
static uint64_t fnv_int(uint64_t h, int v)
{
    for (int b = 0; b < 4; b++) h = (h ^ ((unsigned)v >> (8 * b) & 0xff)) * 1099511628211ull;
    return h;
}

void w4_fingerprint_of(const W4Tile *tiles, int count, char *buf, size_t n)
{
    uint64_t h = fnv_int(1469598103934665603ull, count);
    for (int i = 0; i < count; i++) {
        const W4Tile t = tiles[i];
        for (const char *c = t.name ? t.name : ""; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        const int f[7] = {(int)t.fam, t.n8, t.stages, t.kwarps, t.gu_warps, t.ring, t.chunks};
        for (int j = 0; j < 7; j++) h = fnv_int(h, f[j]);
    }
    snprintf(buf, n, "%d tiles, fnv %016llx", count, (unsigned long long)h);
}

void w4_tiles_fingerprint(char *buf, size_t n) { w4_fingerprint_of(w4_tiles, W4_N_TILES, buf, n); }

int w4_table_save(const W4Table *t, const char *path, char *err, size_t n)
{
    json_t *root = json_object();
    char fp[64];
    w4_tiles_fingerprint(fp, sizeof fp);
    json_object_set_new(root, "device", json_string(t->device));
    json_object_set_new(root, "tiles", json_string(fp));
    for (int k = 0; k < W4_KINDS; k++) {
        json_t *m = json_object();
        for (int b = 0; b < W4_BUCKETS; b++)
            if (t->tile[k][b] >= 0 && t->tile[k][b] < W4_N_TILES) {
                char key[16];
                snprintf(key, sizeof key, "%d", w4_bucket_tokens(b));
                json_object_set_new(m, key, json_pack("{s:s}", "tile", w4_tiles[t->tile[k][b]].name));
            }
        json_object_set_new(root, kind_key[k], m);
    }
    /* the directory, then a temporary file renamed over the old one */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0 || rename(tmp, path) != 0) {
        errbuf_set(err, n, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

int w4_table_load(W4Table *t, const char *path, char *err, size_t n)
{
    w4_table_clear(t);
    char why[400];
    json_t *root = file_read_json(path, 0, why, sizeof why); /* bounded; a FIFO refused, not waited on */
    if (!root) {
        errbuf_set(err, n, "%s: %s", path, why);
        return -1;
    }
    const char *dev = json_string_value(json_object_get(root, "device"));
    if (!dev) {
        json_decref(root);
        errbuf_set(err, n, "%s: no \"device\"", path);
        return -1;
    }
    char fp[64];
    w4_tiles_fingerprint(fp, sizeof fp);
    const char *tiles = json_string_value(json_object_get(root, "tiles"));
    if (!tiles || strcmp(tiles, fp) != 0) {
        errbuf_set(err, n, "%s: tuned with another tile set (%s; this build has %s)", path, tiles ? tiles : "no \"tiles\" key", fp);
        json_decref(root);
        return -1;
    }
    snprintf(t->device, sizeof t->device, "%s", dev);
    for (int k = 0; k < W4_KINDS; k++) {
        json_t *m = json_object_get(root, kind_key[k]);
        if (m && !json_is_object(m)) {
            json_decref(root);
            errbuf_set(err, n, "%s: \"%s\": expected an object of buckets", path, kind_key[k]);
            return -1;
        }
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            char *end;
            long tok = strtol(key, &end, 10);
            const char *name = json_string_value(json_object_get(v, "tile"));
            int tile = name ? w4_tile_by_name(name) : -1;
            if (*end || end == key || tok < 1 || tok > (1 << 30) || tile < 0) {
                json_decref(root);
                errbuf_set(err, n, "%s: %s bucket \"%s\": expected {\"tile\": a tile's name (`moeserve tune` prints them)}", path,
                           kind_key[k], key);
                return -1;
            }
            t->tile[k][w4_bucket((int)tok)] = tile;
        }
    }
    json_decref(root);
    return 0;
}

void w4_table_path(char *buf, size_t n)
{
    const char *e = knob_str(KNOB_TUNE_CACHE), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e && *e) snprintf(buf, n, "%s", e);
    else if (x && *x) snprintf(buf, n, "%s/moeserve/w4-tune.json", x);
    else snprintf(buf, n, "%s/.cache/moeserve/w4-tune.json", h && *h ? h : "/tmp");
}
