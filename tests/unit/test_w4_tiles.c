/* test_w4_tiles: the tile configurations of the NVFP4 kernels and their choice
 * (src/backend/cuda/w4_select.c, plain C: no GPU needed). The budgets are the ones other engines'
 * tiles fail on: 99 KB and 101 KB per block (sm_120 parts), 48 KB without opt-in, and the H200's
 * 227 KB. The built-in choice must never pick a tile over the budget, its table must choose as the
 * code it replaced did, and the tuned table's cache file must round-trip and refuse malformed or
 * stale content. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/w4.h"
#include "base/util.h"
#include "test.h"

/* a mma.sync tile of these fields (unnamed: only its shared memory is asked) */
static W4Tile mma(int n8, int stages, int kwarps, int gu)
{
    return (W4Tile){.name = "test", .fam = W4_FAM_MMA, .n8 = n8, .stages = stages, .kwarps = kwarps, .gu_warps = gu};
}

TEST(w4_tile_smem_and_budgets)
{
    /* 3 stages x 64 tokens x 2 halves x 528-byte rows, plus 64 row pointers */
    EXPECT(w4_tile_smem(mma(8, 3, 1, 0)) == 3 * 64 * 2 * 528 + 64 * 8, "smem %zu", w4_tile_smem(mma(8, 3, 1, 0)));
    EXPECT(w4_tile_smem(mma(1, 0, 1, 0)) == 8 * 8, "no staging: only the row pointers");
    char why[256] = "";
    size_t kb99 = 99 * 1024, kb101 = 101 * 1024;
    EXPECT(!w4_tile_fits(mma(4, 3, 1, 0), kb99, why, sizeof why), "32 tokens, 3 stages (101632 B) must not fit 99 KB");
    EXPECT(strstr(why, "256 B over the 101376 B budget") != NULL, "reason: %s", why);
    EXPECT(w4_tile_fits(mma(4, 3, 1, 0), kb101, NULL, 0), "32 tokens, 3 stages fits 101 KB");
    EXPECT(!w4_tile_fits(mma(8, 2, 1, 0), kb101, NULL, 0), "64 tokens, 2 stages (135 KB) must not fit 101 KB");
    EXPECT(w4_tile_fits(mma(8, 3, 1, 0), 227 * 1024, NULL, 0), "64 tokens, 3 stages (199 KB) fits the H200's 227 KB");
    EXPECT(!w4_tile_fits(mma(8, 4, 1, 0), 227 * 1024, NULL, 0), "64 tokens, 4 stages (265 KB) fits no GPU we know");
    int rejected99 = 0, rejected101 = 0;
    for (int i = 0; i < W4_N_TILES; i++) {
        rejected99 += !w4_tile_fits(w4_tiles[i], kb99, NULL, 0);
        rejected101 += !w4_tile_fits(w4_tiles[i], kb101, NULL, 0);
    }
    /* gate and up on two warps add the up sums' exchange: 32 tokens, 3 stages (105728 B) is over 101 KB too */
    EXPECT(w4_tile_smem(mma(4, 3, 1, 1)) == w4_tile_smem(mma(4, 3, 1, 0)) + 2 * 4 * 4 * 32 * 4, "gate/up exchange");
    /* the block tiles: moe_block_64_s3 is over both, _64_s2 and _32_s3 fit 99 KB; the wgmma tiles:
     * moe_wgmma_128_s4 (130 KB) and _128_s6 (194 KB) are over both, _128_s3 (98 KB), _64_s5 and
     * _32_s4 fit 99 KB; the ring tiles _32_s4_r4 (108032 B), _64_s3_r3 (106176 B) and _128_s4_r3
     * (188608 B) fit neither, nor _32_s6_r3_c2 and dense_wg_splitk (105920 B) */
    EXPECT(rejected99 == 15 && rejected101 == 14, "rejected: %d at 99 KB, %d at 101 KB", rejected99, rejected101);
}

/* every tile has a name of its own that finds it, and the names say the family and the size */
TEST(w4_tile_names)
{
    for (int i = 0; i < W4_N_TILES; i++) {
        const W4Tile t = w4_tiles[i];
        ASSERT(t.name && *t.name, "tile %d has no name", i);
        EXPECT(w4_tile_by_name(t.name) == i, "%s finds tile %d", t.name, w4_tile_by_name(t.name));
        char tokens[16];
        snprintf(tokens, sizeof tokens, "_%d", 8 * t.n8);
        EXPECT(strstr(t.name, tokens) != NULL, "%s: %d tokens a block", t.name, 8 * t.n8);
        static const char *const fam[W4_FAMILIES] = {"mma", "block", "wgmma", "streamk", "wg_splitk"};
        EXPECT(strstr(t.name, fam[t.fam]) != NULL, "%s: family %s", t.name, fam[t.fam]);
        if (t.stages && t.fam != W4_FAM_STREAMK && t.fam != W4_FAM_DENSE_WG) {
            char st[16];
            snprintf(st, sizeof st, "_s%d", t.stages);
            EXPECT(strstr(t.name, st) != NULL, "%s: %d stages", t.name, t.stages);
        }
        if (t.ring && t.fam != W4_FAM_DENSE_WG) {
            char r[16];
            snprintf(r, sizeof r, "_r%d", t.ring);
            EXPECT(strstr(t.name, r) != NULL, "%s: a ring of %d", t.name, t.ring);
        }
        EXPECT(!t.gu_warps || (strstr(t.name, "_gu") && !strncmp(t.name, "moe_", 4)), "%s: gate and up on two warps, MoE", t.name);
    }
    EXPECT(w4_tile_by_name("no_such_tile") == -1 && w4_tile_by_name("") == -1, "unknown names");
}

TEST(w4_block_and_wgmma_tiles)
{
    /* a stage: 16 records x (1024 B of codes + 256 B of scales), then 8 n8 rows of 272 B; plus 8 n8
     * row pointers, 16 record pointers and the tile's int4 (the kernels' static shared memory) */
    size_t s64s3 = 3 * (16 * 1280 + 64 * 272) + 64 * 8 + 16 * 8 + 16, s64s2 = 2 * (16 * 1280 + 64 * 272) + 64 * 8 + 16 * 8 + 16,
           s32s3 = 3 * (16 * 1280 + 32 * 272) + 32 * 8 + 16 * 8 + 16;
    const W4Tile b64s3 = w4_tiles[W4T_MOE_BLOCK_64_S3], b64s2 = w4_tiles[W4T_MOE_BLOCK_64_S2], b32s3 = w4_tiles[W4T_MOE_BLOCK_32_S3];
    EXPECT(b64s3.fam == W4_FAM_MMA_BLOCK && b64s2.fam == W4_FAM_MMA_BLOCK && b32s3.fam == W4_FAM_MMA_BLOCK, "the block tiles");
    EXPECT(w4_tile_smem(b64s3) == s64s3, "moe_block_64_s3: %zu B", w4_tile_smem(b64s3));
    EXPECT(w4_tile_smem(b64s2) == s64s2, "moe_block_64_s2: %zu B", w4_tile_smem(b64s2));
    EXPECT(w4_tile_smem(b32s3) == s32s3, "moe_block_32_s3: %zu B", w4_tile_smem(b32s3));
    /* two blocks of moe_block_64_s3 on an H200 SM (228 KB, 1 KB reserved a block) */
    EXPECT(2 * (s64s3 + 1024) <= 228 * 1024, "moe_block_64_s3: %zu B", s64s3);
    char why[256] = "";
    EXPECT(!w4_tile_fits(b64s3, 99 * 1024, why, sizeof why) && strstr(why, "12944 B over the 101376 B budget"), "%s", why);
    EXPECT(w4_tile_fits(b64s2, 99 * 1024, NULL, 0) && w4_tile_fits(b32s3, 99 * 1024, NULL, 0), "99 KB block tiles");
    /* dense runs a MoE-only tile as its twin, which must fit wherever the tile fits */
    W4Tile twin = w4_tiles[W4_BLOCK_DENSE_TWIN], wtwin = w4_tiles[W4_WGMMA_DENSE_TWIN];
    EXPECT(twin.fam == W4_FAM_MMA && !twin.gu_warps && !twin.ring, "the block twin is a dense mma.sync tile");
    EXPECT(wtwin.fam == W4_FAM_MMA && !wtwin.gu_warps && !wtwin.ring, "the wgmma twin is a dense mma.sync tile");
    for (int i = 0; i < W4_N_TILES; i++) {
        if (w4_tiles[i].fam == W4_FAM_MMA_BLOCK)
            EXPECT(w4_tile_smem(twin) <= w4_tile_smem(w4_tiles[i]), "%s: its twin needs more", w4_tiles[i].name);
        if (w4_tiles[i].fam == W4_FAM_WGMMA)
            EXPECT(w4_tile_smem(wtwin) <= w4_tile_smem(w4_tiles[i]), "%s: its twin needs more", w4_tiles[i].name);
    }
    /* and the MoE a dense-only tile as a MoE tile (the same GEMM, or the decode tile) */
    EXPECT(w4_tiles[W4_STREAMK_MOE_TWIN].fam == W4_FAM_MMA && w4_tiles[W4_DENSE_RING_MOE_TWIN].fam == W4_FAM_MMA &&
               !w4_tiles[W4_DENSE_RING_MOE_TWIN].ring && w4_tiles[W4_DENSE_WG_MOE_TWIN].fam == W4_FAM_WGMMA,
           "the MoE twins");
    /* wgmma tiles: stages of 2 halves x 8 n8 rows x 128 B, 1 KB of alignment slack, the row pointers */
    for (int i = W4T_MOE_WGMMA_128_S4; i <= W4T_MOE_WGMMA_32_S6_R3_C2; i++)
        EXPECT(w4_tiles[i].fam == W4_FAM_WGMMA, "%s is a wgmma tile", w4_tiles[i].name);
    for (int i = 0; i < W4T_MOE_WGMMA_32_S4_R4; i++) EXPECT(w4_tiles[i].ring == 0, "%s has no weight ring", w4_tiles[i].name);
    /* the ring tiles add 8 warps x ring records (2304 B) and their barriers (8 B); two blocks of each
     * still fit an H200 SM (228 KB, 1 KB reserved a block) */
    const W4Tile r32 = w4_tiles[W4T_MOE_WGMMA_32_S4_R4], r64 = w4_tiles[W4T_MOE_WGMMA_64_S3_R3],
                 r128 = w4_tiles[W4T_MOE_WGMMA_128_S4_R3], r32c2 = w4_tiles[W4T_MOE_WGMMA_32_S6_R3_C2];
    EXPECT(w4_tile_smem(r32) == 4 * 2 * 32 * 128 + 1024 + 8 * 4 * 2312 + 32 * 8, "%s: %zu B", r32.name, w4_tile_smem(r32));
    EXPECT(w4_tile_smem(r64) == 3 * 2 * 64 * 128 + 1024 + 8 * 3 * 2312 + 64 * 8, "%s: %zu B", r64.name, w4_tile_smem(r64));
    EXPECT(2 * (w4_tile_smem(r32) + 1024) <= 228 * 1024 && 2 * (w4_tile_smem(r64) + 1024) <= 228 * 1024, "two blocks an SM");
    EXPECT(w4_tile_smem(r128) == 4 * 2 * 128 * 128 + 1024 + 8 * 3 * 2312 + 128 * 8, "%s: %zu B", r128.name, w4_tile_smem(r128));
    EXPECT(w4_tile_fits(r128, 227 * 1024, NULL, 0), "%s fits the H200", r128.name);
    EXPECT(w4_tile_smem(r32c2) == 6 * 2 * 32 * 128 + 1024 + 8 * 3 * 2312 + 32 * 8 && w4_tile_smem(r32c2) == 105920, "%s: %zu B",
           r32c2.name, w4_tile_smem(r32c2));
    for (int i = 0; i < W4_N_TILES; i++)
        EXPECT(w4_tiles[i].chunks == (i == W4T_MOE_WGMMA_32_S6_R3_C2 || i == W4T_DENSE_WG_SPLITK ? 2 : 0), "%s: %d chunks a stage",
               w4_tiles[i].name, w4_tiles[i].chunks);
    /* the dense ring tiles: the K-split tiles' shared memory plus 4 warps x ring records */
    EXPECT(w4_tile_smem(w4_tiles[W4T_DENSE_MMA_8_K4_R3]) == w4_tile_smem(w4_tiles[W4T_MMA_8_K4]) + 4 * 3 * 2304, "8-token ring");
    EXPECT(w4_tile_smem(w4_tiles[W4T_DENSE_MMA_16_K4_R3]) == w4_tile_smem(w4_tiles[W4T_MMA_16_K4]) + 4 * 3 * 2304, "16-token ring");
    for (int i = W4T_DENSE_MMA_8_K4_R3; i <= W4T_DENSE_MMA_16_K4_R3; i++)
        EXPECT(w4_tiles[i].fam == W4_FAM_MMA && w4_tiles[i].stages == 0 && w4_tiles[i].ring >= 3 && w4_tiles[i].kwarps == 4, "%s",
               w4_tiles[i].name);
    /* the stream-K tiles (dense only): 8 or 16 rows, no static shared memory (the staged rows are
     * the call's, checked at launch), so they fit any budget */
    for (int i = W4T_DENSE_STREAMK_8; i <= W4T_DENSE_STREAMK_16; i++)
        EXPECT(w4_tiles[i].fam == W4_FAM_STREAMK && w4_tiles[i].n8 == i - W4T_DENSE_STREAMK_8 + 1 && w4_tile_smem(w4_tiles[i]) == 0 &&
                   w4_tile_fits(w4_tiles[i], 99 * 1024, NULL, 0) && w4_tile_runs(w4_tiles[i], 0, NULL, 0),
               "%s", w4_tiles[i].name);
    EXPECT(2 * (w4_tile_smem(r32c2) + 1024) <= 228 * 1024, "%s: two blocks an SM", r32c2.name);
    /* dense_wg_splitk: the 32-token ring tile's GEMM, its shared memory, wgmma */
    const W4Tile dwg = w4_tiles[W4T_DENSE_WG_SPLITK];
    EXPECT(dwg.fam == W4_FAM_DENSE_WG && w4_tile_smem(dwg) == w4_tile_smem(r32c2) && dwg.n8 == r32c2.n8 && dwg.stages == r32c2.stages &&
               dwg.ring == r32c2.ring,
           "dense_wg_splitk");
    EXPECT(!w4_tile_runs(dwg, 0, why, sizeof why) && strstr(why, "sm_90a") && w4_tile_runs(dwg, 1, NULL, 0), "%s", why);
    EXPECT(w4_tile_smem(w4_tiles[W4T_MOE_WGMMA_128_S4]) == 4 * 2 * 128 * 128 + 1024 + 128 * 8, "128 tokens, 4 stages");
    EXPECT(w4_tile_smem(w4_tiles[W4T_MOE_WGMMA_64_S5]) == 5 * 2 * 64 * 128 + 1024 + 64 * 8, "64 tokens, 5 stages");
    EXPECT(!w4_tile_fits(w4_tiles[W4T_MOE_WGMMA_128_S4], 227 * 1024 / 2, why, sizeof why) && strstr(why, "4 stages x 2 halves x 128 tokens"),
           "%s", why);
    /* a wgmma tile says why it does not run without wgmma */
    EXPECT(w4_tile_runs(w4_tiles[W4T_MOE_WGMMA_128_S4], 1, NULL, 0) && w4_tile_runs(b64s3, 0, NULL, 0), "runs");
    EXPECT(!w4_tile_runs(w4_tiles[W4T_MOE_WGMMA_128_S6], 0, why, sizeof why) && strstr(why, "sm_90a"), "%s", why);
}

/* The built-in choice at the points that were measured (w4_rules' reasons) */
TEST(w4_default_tile_choices)
{
    /* the MoE from 48 pairs per expert without wgmma: the block GEMM, by budget */
    EXPECT(w4_default_tile(W4_MOE, 64, 227 * 1024, 0, 1) == W4T_MOE_BLOCK_64_S3, "MoE 64 pairs per expert on 227 KB");
    EXPECT(w4_default_tile(W4_MOE, 256, 99 * 1024, 0, 1) == W4T_MOE_BLOCK_64_S2, "MoE 256 pairs per expert on 99 KB");
    EXPECT(w4_default_tile(W4_MOE, 40, 227 * 1024, 0, 1) == W4T_MMA_64_S2, "MoE 40 pairs per expert: the 64-token tile");
    EXPECT(w4_default_tile(W4_MOE, 64, 48 * 1024, 0, 1) == W4T_MMA_16_S2, "48 KB: no block tile fits");
    EXPECT(w4_default_tile(W4_MOE, 128, 227 * 1024, 0, 0) == W4T_MOE_BLOCK_64_S3, "no wgmma: the block GEMM");
    /* where wgmma runs: from 7 pairs per expert the 16-token decode tile with BF16 activations, then
     * the ring tiles: 32 tokens to 24 pairs (36 split), 64 to 128, then 128; on 101 KB (the ring
     * tiles do not fit) moe_wgmma_128_s3 */
    struct { double rows; size_t kb; int split, want; } moe[] = {
        {8, 227, 0, W4T_MOE_MMA_16_GU},       {6, 227, 0, W4T_MOE_MMA_8_GU},           {11, 227, 0, W4T_MOE_MMA_16_GU},
        {12, 227, 0, W4T_MOE_WGMMA_32_S6_R3_C2}, {8, 227, 1, W4T_MOE_WGMMA_32_S6_R3_C2}, {16, 227, 0, W4T_MOE_WGMMA_32_S6_R3_C2},
        {24, 227, 0, W4T_MOE_WGMMA_32_S6_R3_C2}, {25, 227, 0, W4T_MOE_WGMMA_64_S3_R3},   {36, 227, 1, W4T_MOE_WGMMA_32_S6_R3_C2},
        {37, 227, 1, W4T_MOE_WGMMA_64_S3_R3},  {16, 104, 0, W4T_MOE_WGMMA_32_S6_R3_C2}, {16, 103, 0, W4T_MMA_32_S2},
        {48, 227, 0, W4T_MOE_WGMMA_64_S3_R3},  {64, 227, 0, W4T_MOE_WGMMA_64_S3_R3},    {128, 227, 0, W4T_MOE_WGMMA_64_S3_R3},
        {129, 227, 0, W4T_MOE_WGMMA_128_S4_R3}, {128, 227, 1, W4T_MOE_WGMMA_64_S3_R3},  {129, 227, 1, W4T_MOE_WGMMA_128_S4_R3},
        {56, 227, 1, W4T_MOE_WGMMA_64_S3_R3},  {256, 227, 0, W4T_MOE_WGMMA_128_S4_R3},  {256, 150, 0, W4T_MOE_WGMMA_128_S3},
        {256, 101, 0, W4T_MOE_WGMMA_128_S3},   {64, 101, 0, W4T_MOE_WGMMA_128_S3},      {16, 101, 0, W4T_MMA_32_S2},
        {4, 227, 1, W4T_MOE_MMA_8_GU},
    };
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        int t = w4_default_tile(W4_MOE, moe[i].rows, moe[i].kb * 1024, 1, moe[i].split);
        EXPECT(t == moe[i].want, "sm_90a MoE %.0f pairs on %zu KB, split %d: %s, want %s", moe[i].rows, moe[i].kb, moe[i].split,
               w4_tiles[t].name, w4_tiles[moe[i].want].name);
    }
    EXPECT(w4_default_tile(W4_MOE, 8, 227 * 1024, 0, 0) == W4T_MOE_MMA_8_GU, "no wgmma, 8 pairs: the decode tile");
    /* dense decode: stream-K up to 8 rows whatever the budget (it checks each call's rows against
     * it), its 16-token tile from 9 to 16 rows, then split-K wgmma; where a call does not suit them,
     * the 8-token ring with split activations, the K-split tile with BF16 ones, 16 tokens from 9 rows */
    for (int split = 0; split < 2; split++)
        for (int rows = 1; rows <= 8; rows++)
            EXPECT(w4_default_tile(W4_DENSE, rows, 99 * 1024, split, split) == W4T_DENSE_STREAMK_8, "dense %d rows, split %d", rows,
                   split);
    EXPECT(w4_default_tile(W4_DENSE, 9, 227 * 1024, 1, 1) == W4T_DENSE_STREAMK_16 &&
               w4_default_tile(W4_DENSE, 16, 227 * 1024, 1, 0) == W4T_DENSE_STREAMK_16,
           "9-16 rows: 16-token stream-K");
    EXPECT(w4_default_tile(W4_DENSE, 17, 227 * 1024, 1, 0) == W4T_DENSE_WG_SPLITK &&
               w4_default_tile(W4_DENSE, 64, 227 * 1024, 1, 1) == W4T_DENSE_WG_SPLITK &&
               w4_default_tile(W4_DENSE, 255, 227 * 1024, 1, 0) == W4T_DENSE_WG_SPLITK &&
               w4_default_tile(W4_DENSE, 4096, 227 * 1024, 1, 0) == W4T_DENSE_WG_SPLITK,
           "17 rows on with wgmma: split-K wgmma (where the cuBLASLt route is off)");
    EXPECT(w4_default_tile(W4_DENSE, 17, 227 * 1024, 0, 0) == W4T_MMA_32_S2 && w4_default_tile(W4_DENSE, 64, 227 * 1024, 0, 0) == W4T_MMA_32_S2 &&
               w4_default_tile(W4_DENSE, 24, 101 * 1024, 1, 0) == W4T_MMA_32_S2,
           "17-64 rows without wgmma or on 101 KB: 32 tokens");
    EXPECT(w4_default_tile(W4_DENSE, 256, 227 * 1024, 0, 1) == W4T_MMA_64_S2 && w4_default_tile(W4_DENSE, 256, 99 * 1024, 1, 1) == W4T_MMA_32_S2 &&
               w4_sk_fallback(100, 227 * 1024, 1) == W4T_MMA_64_S2 && w4_sk_fallback(64, 227 * 1024, 1) == W4T_MMA_32_S2,
           "prefill without split-K wgmma: 64 tokens, 32 on 99 KB");
    EXPECT(w4_sk_fallback(1, 227 * 1024, 1) == W4T_DENSE_MMA_8_K4_R3, "dense 1 row, split activations: the ring");
    EXPECT(w4_sk_fallback(8, 99 * 1024, 1) == W4T_DENSE_MMA_8_K4_R3, "dense 8 rows, split, 99 KB: the ring");
    EXPECT(w4_sk_fallback(1, 227 * 1024, 0) == W4T_MMA_8_K4, "dense 1 row, BF16 activations: the K-split tile");
    EXPECT(w4_sk_fallback(1, 16 * 1024, 1) == W4T_MMA_8_K4, "dense 1 row on 16 KB: the K-split tile (the ring needs %zu B)",
           w4_tile_smem(w4_tiles[W4T_DENSE_MMA_8_K4_R3]));
    EXPECT(w4_sk_fallback(16, 227 * 1024, 1) == W4T_MMA_16_S2 && w4_sk_fallback(32, 227 * 1024, 1) == W4T_MMA_32_S2, "16 and 32 rows");
    for (double rows = 1; rows <= 65536; rows *= 1.5)
        for (size_t b = 48 * 1024; b <= 227 * 1024; b += 1024)
            for (int wg = 0; wg < 2; wg++) {
                int t = w4_default_tile(W4_DENSE, rows, b, wg, 1);
                W4Family f = w4_tiles[t].fam;
                EXPECT(f == W4_FAM_MMA || (f == W4_FAM_STREAMK && rows <= 16) || (f == W4_FAM_DENSE_WG && wg),
                       "dense %.0f rows: %s", rows, w4_tiles[t].name);
                t = w4_sk_fallback(rows, b, 1);
                EXPECT(w4_tiles[t].fam == W4_FAM_MMA && w4_tile_fits(w4_tiles[t], b, NULL, 0), "dense %.0f rows: fallback %s", rows,
                       w4_tiles[t].name);
                t = w4_default_tile(W4_MOE, rows, b, wg, rows > 1000);
                EXPECT(wg || w4_tiles[t].fam != W4_FAM_WGMMA, "MoE %.0f rows on %zu B without wgmma: %s", rows, b, w4_tiles[t].name);
            }
}

TEST(w4_default_never_over_budget)
{
    size_t budgets[] = {48 * 1024, 99 * 1024, 101 * 1024, 227 * 1024, 1024};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
        for (int kind = 0; kind < W4_KINDS; kind++)
            for (double rows = 1; rows <= 65536; rows *= 1.5) {
                int t = w4_default_tile((W4Kind)kind, rows, budgets[b], (int)b & 1, rows > 100);
                ASSERT(t >= 0 && t < W4_N_TILES, "tile %d", t);
                EXPECT(w4_tile_fits(w4_tiles[t], budgets[b], NULL, 0), "kind %d rows %.0f budget %zu: %s does not fit", kind, rows,
                       budgets[b], w4_tiles[t].name);
            }
    /* with room, prefill takes split-K wgmma or else the 64-token staged tile; on smaller GPUs the largest that fits */
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024, 1, 1) == W4T_DENSE_WG_SPLITK, "dense 4096 rows on 227 KB with wgmma");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024, 0, 1) == W4T_MMA_64_S2, "dense 4096 rows on 227 KB without wgmma");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 99 * 1024, 1, 1) == W4T_MMA_32_S2, "99 KB: 32 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 48 * 1024, 0, 1) == W4T_MMA_16_S2, "48 KB: 16 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 1, 227 * 1024, 1, 0) == W4T_DENSE_STREAMK_8 && w4_default_tile(W4_DENSE, 1, 1024, 0, 1) == W4T_DENSE_STREAMK_8,
           "one row: stream-K (its static shared memory is none)");
    EXPECT(w4_default_tile(W4_MOE, 1, 227 * 1024, 1, 1) == W4T_MOE_MMA_8_GU, "MoE decode: gate and up on separate warps");
    EXPECT(w4_default_tile(W4_MOE, 1, 1024, 1, 1) == W4T_MMA_8_L1, "1 KB: the 8-token tile without the exchange");
}

/* The choice as the code before the table made it (by tile index, the order of w4_select.h), for
 * the table to be held to over every condition, budget and size */
static int old_first_fit(const int *prefs, int n, size_t budget, int wg)
{
    for (int i = 0; i < n; i++)
        if (w4_tile_fits(w4_tiles[prefs[i]], budget, NULL, 0) && w4_tile_runs(w4_tiles[prefs[i]], wg, NULL, 0)) return prefs[i];
    return 0;
}

static int old_sk_fallback(double rows, size_t budget, int split)
{
    static const int mid[] = {4, 3, 0}, d16[] = {3, 0}, big[] = {7, 4, 3, 0};
    if (rows > 64) return old_first_fit(big, 4, budget, 0);
    if (rows <= 8) return split ? old_first_fit((const int[]){31, 10, 0}, 3, budget, 0) : old_first_fit((const int[]){10, 0}, 2, budget, 0);
    if (rows <= 16) return old_first_fit(d16, 2, budget, 0);
    return old_first_fit(mid, 3, budget, 0);
}

static int old_default_tile(W4Kind kind, double rows, size_t budget, int wg, int split)
{
    static const int big[] = {7, 4, 3, 0}, mid[] = {4, 3, 0}, pf[] = {19, 20, 21, 7, 4, 3, 0};
    static const int wgp[] = {24, 23, 19, 20, 21, 7, 4, 3, 0}, ring28[] = {28, 24, 23, 19, 20, 21, 7, 4, 3, 0};
    static const int ring29[] = {29, 24, 23, 19, 20, 21, 7, 4, 3, 0}, ring30[] = {30, 27, 4, 3, 0};
    if (kind == W4_MOE) {
        if (wg && !split && rows > 6 && rows <= 11) return old_first_fit((const int[]){13, 12, 0}, 3, budget, wg);
        if (wg && rows > (split ? 6 : 8)) {
            if (rows <= (split ? 36 : 24)) return old_first_fit(ring30, 5, budget, wg);
            if (rows <= 128) return old_first_fit(ring28, 10, budget, wg);
            return old_first_fit(ring29, 10, budget, wg);
        }
        if (rows <= 8) return old_first_fit((const int[]){12, 0}, 2, budget, wg);
        if (rows <= 24) return old_first_fit(mid, 3, budget, wg);
        if (wg && rows >= (split ? 48 : 96)) return old_first_fit(wgp, 9, budget, wg);
        if (rows >= 48) return old_first_fit(pf, 7, budget, wg);
        return old_first_fit(big, 4, budget, wg);
    }
    if (rows <= 8) return 34;
    if (rows <= 16) return 35;
    if (w4_tile_fits(w4_tiles[36], budget, NULL, 0) && w4_tile_runs(w4_tiles[36], wg, NULL, 0)) return 36;
    return old_sk_fallback(rows, budget, split);
}

TEST(w4_rules_choose_as_before)
{
    _Static_assert(W4T_MOE_MMA_8_GU == 12 && W4T_MOE_BLOCK_64_S3 == 19 && W4T_MOE_WGMMA_64_S3_R3 == 28 && W4T_DENSE_WG_SPLITK == 36,
                   "the old choice's indices");
    int checked = 0;
    for (int kind = 0; kind < W4_KINDS; kind++)
        for (double rows = 0.25; rows <= 20000; rows = rows < 140 ? rows + 0.25 : rows * 1.1)
            for (size_t b = 16 * 1024; b <= 232 * 1024; b += 3 * 1024)
                for (int f = 0; f < 4; f++) {
                    const int wg = f & 1, split = f >> 1;
                    const int want = old_default_tile((W4Kind)kind, rows, b, wg, split), got = w4_default_tile((W4Kind)kind, rows, b, wg, split);
                    if (got != want) {
                        EXPECT(0, "kind %d, %.2f rows, %zu B, wg %d, split %d: %s, before %s", kind, rows, b, wg, split, w4_tiles[got].name,
                               w4_tiles[want].name);
                        return;
                    }
                    if (kind == W4_DENSE && w4_sk_fallback(rows, b, split) != old_sk_fallback(rows, b, split)) {
                        EXPECT(0, "fallback at %.2f rows, %zu B, split %d", rows, b, split);
                        return;
                    }
                    checked++;
                }
    EXPECT(checked > 100000, "%d cases", checked);
    /* every rule names tiles of its kind's families, each row a reason */
    for (int r = 0; r < w4_n_rules; r++) {
        const W4Rule *u = &w4_rules[r];
        EXPECT(u->why && strlen(u->why) > 20 && u->min <= u->max && u->tiles[0] >= 0, "rule %d", r);
        for (int i = 0; i < W4_RULE_TILES && u->tiles[i] >= 0; i++) {
            W4Family f = w4_tiles[u->tiles[i]].fam;
            EXPECT(u->kind == W4_RULE_MOE ? f != W4_FAM_STREAMK && f != W4_FAM_DENSE_WG
                                          : u->kind == W4_RULE_DENSE || f == W4_FAM_MMA,
                   "rule %d: %s", r, w4_tiles[u->tiles[i]].name);
        }
    }
}

/* The MoE's expert classes beside the call's tile: which tiles have them, the defaults by
 * activation form, the overrides, and that no expert can be in two classes */
TEST(w4_moe_classes)
{
    int h, s;
    struct { int tile, T, split, hot, small; } want[] = {
        {W4T_MOE_WGMMA_32_S6_R3_C2, 512, 0, 64, 8}, {W4T_MOE_WGMMA_32_S6_R3_C2, 256, 1, 64, 4},
        {W4T_MOE_WGMMA_64_S3_R3, 2048, 0, 64, 8},   {W4T_MOE_WGMMA_128_S4_R3, 8192, 0, 0, 8},
        {W4T_MOE_MMA_16_GU, 256, 0, 32, 6},
        {W4T_MOE_MMA_8_GU, 128, 0, 16, 0}, {W4T_MOE_MMA_8_GU, 64, 0, 0, 0}, /* beside the decode tile from 128 tokens with BF16 activations */
        {W4T_MOE_MMA_8_GU, 64, 1, 16, 0},  {W4T_MOE_MMA_8_GU, 32, 1, 0, 0}, /* and from 64 with split ones */
        {W4T_MOE_WGMMA_32_S6_R3_C2, 64, 0, 0, 8}, /* no hot class where the call has no more tokens than its threshold */
        {W4T_MMA_8_L1, 512, 0, 0, 0}, {W4T_MOE_BLOCK_64_S3, 4096, 0, 0, 0}, {W4T_MOE_WGMMA_128_S6, 4096, 1, 0, 0}, /* none beside the others */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        w4_moe_classes(want[i].tile, want[i].T, want[i].split, 1, -1, -1, &h, &s);
        EXPECT(h == want[i].hot && s == want[i].small, "%s, %d tokens, split %d: hot %d small %d, want %d %d", w4_tiles[want[i].tile].name,
               want[i].T, want[i].split, h, s, want[i].hot, want[i].small);
    }
    w4_moe_classes(W4T_MOE_WGMMA_32_S6_R3_C2, 512, 0, 0, -1, -1, &h, &s);
    EXPECT(h == 0 && s == 8, "the hot tile not runnable: no hot class (%d), the small one stays (%d)", h, s);
    w4_moe_classes(W4T_MOE_WGMMA_32_S6_R3_C2, 512, 0, 1, 0, 0, &h, &s);
    EXPECT(h == 0 && s == 0, "both asked off: %d %d", h, s);
    w4_moe_classes(W4T_MOE_MMA_16_GU, 300, 0, 1, 20, 24, &h, &s);
    EXPECT(h == 20 && s == 0, "a small threshold at or above the hot one: no small class (%d %d)", h, s);
    w4_moe_classes(W4T_MOE_WGMMA_64_S3_R3, 300, 1, 1, 100, 20, &h, &s);
    EXPECT(h == 100 && s == 20, "overrides: %d %d", h, s);
    /* the hot class beside the decode tile on a stream of its own, after the others */
    EXPECT(w4_moe_hot_beside(W4T_MOE_MMA_8_GU) && !w4_moe_hot_beside(W4T_MOE_WGMMA_32_S6_R3_C2) && !w4_moe_hot_beside(W4T_MMA_8_L1),
           "hot beside");
    for (int r = 0; r < w4_n_class_rules; r++)
        EXPECT(w4_class_rules[r].why && w4_tiles[w4_class_rules[r].tile].fam != W4_FAM_STREAMK, "class rule %d", r);
}

/* the thresholds the launches follow */
TEST(w4_launch_thresholds)
{
    EXPECT(w4_lt_rows_default(1) == 1536 && w4_lt_rows_default(0) == 256, "the cuBLASLt route's rows");
    EXPECT(w4_sk_cluster_default(24575) == 1 && w4_sk_cluster_default(24576) == 2, "stream-K clusters from 24576 staged values");
    EXPECT(w4_sk_ksplit_default(1, 0) == 4 && w4_sk_ksplit_default(1, 1) == 1 && w4_sk_ksplit_default(2, 0) == 1, "K parts");
    /* about 16 warps an SM: GLM-5 o_proj (6144 x 16384) at 1 row, 8-token K-split tile, 132 SMs */
    EXPECT(w4_mma_splits(1, 6144, 16384, 1, 4, 132, 0) == 2, "splits %d", w4_mma_splits(1, 6144, 16384, 1, 4, 132, 0));
    EXPECT(w4_mma_splits(1, 16 * 66, 256 * 40, 1, 1, 132, 0) == 16 && w4_mma_splits(1, 16 * 132, 256 * 8, 1, 1, 132, 0) == 8,
           "at most 16, at most the record groups");
    EXPECT(w4_mma_splits(64, 6144, 6144, 8, 1, 132, 5) == 5 && w4_mma_splits(64, 6144, 512, 8, 1, 132, 5) == 2, "forced, within the groups");
}

TEST(w4_buckets)
{
    EXPECT(w4_bucket(1) == 0 && w4_bucket(2) == 1 && w4_bucket(3) == 2 && w4_bucket(4) == 2 && w4_bucket(5) == 3);
    EXPECT(w4_bucket(8192) == 13 && w4_bucket(8193) == 14 && w4_bucket(1 << 30) == W4_BUCKETS - 1);
    for (int b = 0; b < W4_BUCKETS; b++) EXPECT(w4_bucket(w4_bucket_tokens(b)) == b, "bucket %d", b);
}

TEST(w4_table_cache_file)
{
    char path[4200], err[512] = "";
    snprintf(path, sizeof path, "%s/tune/sub/w4.json", test_tmpdir());
    W4Table t, u;
    w4_table_clear(&t);
    snprintf(t.device, sizeof t.device, "NVIDIA H200|132 SMs|232448 B smem|driver 13000");
    t.tile[W4_MOE][w4_bucket(64)] = W4T_MMA_16_L1;
    t.tile[W4_DENSE][w4_bucket(4096)] = W4T_MMA_64_S3;
    ASSERT(w4_table_save(&t, path, err, sizeof err) == 0, "%s", err);
    ASSERT(w4_table_load(&u, path, err, sizeof err) == 0, "%s", err);
    EXPECT(memcmp(&t, &u, sizeof t) == 0, "the table does not round-trip");
    /* the file names the tiles */
    char *text = file_read_all(path, NULL);
    ASSERT(text, "read %s", path);
    EXPECT(strstr(text, "\"mma_64_s3\"") && strstr(text, "\"mma_16_l1\""), "%s", text);
    free(text);
    /* hand-written caches of this tile set: each bad entry refused with what was expected, a tile
     * number (the cache of a build before the names) among them */
    char fp[64];
    w4_tiles_fingerprint(fp, sizeof fp);
    const char *bad[] = {"{\"64\": {\"tile\": \"no_such_tile\"}}", "{\"64\": {\"tile\": 1}}", "{\"64\": {\"tile\": -1}}", "{\"64\": 5}",
                         "{\"x64\": {\"tile\": \"mma_8_l1\"}}", "{\"0\": {\"tile\": \"mma_8_l1\"}}",
                         "{\"99999999999\": {\"tile\": \"mma_8_l1\"}}", "{\"\": {\"tile\": \"mma_8_l1\"}}", "[1]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"device\": \"x\", \"tiles\": \"%s\", \"moe\": %s}", fp, bad[i]);
        fclose(f);
        err[0] = 0;
        EXPECT(w4_table_load(&u, path, err, sizeof err) < 0 && strstr(err, "moe"), "bad moe entry %s accepted: %s", bad[i], err);
    }
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"device\": \"x\", \"tiles\": \"%s\", \"moe\": {\"64\": {\"tile\": \"moe_wgmma_32_s6_r3_c2\"}}}", fp);
    fclose(f);
    EXPECT(w4_table_load(&u, path, err, sizeof err) == 0 && u.tile[W4_MOE][w4_bucket(64)] == W4T_MOE_WGMMA_32_S6_R3_C2,
           "a good hand-written entry: %s", err);
    /* a cache from a build with another tile set (the numbered tiles' "37 tiles, fnv ...", or from
     * before the key existed) is stale */
    const char *stale[] = {"\"37 tiles, fnv 0123456789abcdef\"", "1", NULL};
    for (int i = 0; i < 3; i++) {
        f = fopen(path, "w");
        if (stale[i]) fprintf(f, "{\"device\": \"x\", \"tiles\": %s, \"moe\": {\"64\": {\"tile\": 1}}}", stale[i]);
        else fputs("{\"device\": \"x\", \"moe\": {\"64\": {\"tile\": 1}}}", f);
        fclose(f);
        err[0] = 0;
        EXPECT(w4_table_load(&u, path, err, sizeof err) < 0 && strstr(err, "another tile set") && strstr(err, fp),
               "stale cache %d accepted: %s", i, err);
    }
    f = fopen(path, "w");
    fputs("{\"moe\": {}", f);
    fclose(f);
    EXPECT(w4_table_load(&u, path, err, sizeof err) < 0, "malformed JSON accepted");
    /* a FIFO in the cache's place (no writer): refused at once, not waited on at every start */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tune/fifo", test_tmpdir());
    const char *fifo = test_fifo(dir, "w4.json");
    ASSERT(fifo, "mkfifo");
    test_alarm(20);
    err[0] = 0;
    EXPECT(w4_table_load(&u, fifo, err, sizeof err) < 0 && strstr(err, "not a regular file"), "FIFO cache: %s", err);
    test_alarm(0);
}

/* the fingerprint names the tile count and moves with any tile's name or field */
TEST(w4_tiles_fingerprint)
{
    char a[64], b[64];
    w4_tiles_fingerprint(a, sizeof a);
    w4_tiles_fingerprint(b, sizeof b);
    EXPECT(strcmp(a, b) == 0 && strncmp(a, "37 tiles, fnv ", 14) == 0 && strlen(a) == 14 + 16, "fingerprint %s / %s", a, b);
    W4Tile t[W4_N_TILES];
    memcpy(t, w4_tiles, sizeof t);
    w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
    EXPECT(strcmp(a, b) == 0, "the same table: %s / %s", a, b);
    w4_fingerprint_of(t, W4_N_TILES - 1, b, sizeof b);
    EXPECT(strcmp(a, b) != 0 && strncmp(b, "36 tiles", 8) == 0, "one tile fewer: %s", b);
    for (int i = 0; i < W4_N_TILES; i += 5)
        for (int f = 0; f < 6; f++) { /* each field of every fifth tile, one at a time */
            memcpy(t, w4_tiles, sizeof t);
            int *fld[6] = {&t[i].n8, &t[i].stages, &t[i].kwarps, &t[i].gu_warps, &t[i].ring, &t[i].chunks};
            *fld[f] += 1;
            w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
            EXPECT(strcmp(a, b) != 0, "%s field %d changed, fingerprint the same", t[i].name, f);
        }
    memcpy(t, w4_tiles, sizeof t);
    t[3].fam = W4_FAM_MMA_BLOCK;
    w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
    EXPECT(strcmp(a, b) != 0, "a family changed, fingerprint the same");
    memcpy(t, w4_tiles, sizeof t);
    t[7].name = "mma_64_s2x";
    w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
    EXPECT(strcmp(a, b) != 0, "a name changed, fingerprint the same");
    memcpy(t, w4_tiles, sizeof t);
    W4Tile x = t[W4T_MOE_WGMMA_64_S3_R3];
    t[W4T_MOE_WGMMA_64_S3_R3] = t[W4T_MOE_WGMMA_128_S4_R3];
    t[W4T_MOE_WGMMA_128_S4_R3] = x;
    w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
    EXPECT(strcmp(a, b) != 0, "two tiles swapped, fingerprint the same");
}

/* w4_select.h's multiply form of decode register 2 against the two-shift form it replaces: it
 * depends only on its 8 source bits, so their 256 values (under random other bits, which must not
 * matter) cover every word */
TEST(w4_decode_bits)
{
    int pos[8], n = 0;
    for (int b = 0; b < 32; b++)
        if (W4_SRC2 >> b & 1) pos[n++] = b;
    ASSERT(n == 8, "%d source bits", n);
    uint32_t rng = 12345;
    for (int v = 0; v < 256; v++)
        for (int rep = 0; rep < 64; rep++) {
            rng = rng * 1664525u + 1013904223u;
            uint32_t w = rep ? rng & ~W4_SRC2 : 0;
            for (int i = 0; i < 8; i++) w |= (uint32_t)(v >> i & 1) << pos[i];
            uint32_t want = ((w << 6) & W4_MAG) | ((w << 2) & W4_SIGN), got = w4_bits2(w);
            if (got != want) {
                EXPECT(0, "word %08x: %08x, want %08x", w, got, want);
                return;
            }
        }
    /* the eight bits the register's two codes take, and nothing else */
    EXPECT(w4_bits2(0xFFFFFFFFu) == (W4_MAG | W4_SIGN));
    EXPECT((W4_SRC2 & ((W4_MAG | W4_SIGN) | ((W4_MAG | W4_SIGN) >> 3))) == 0, "register 2 reads bits of its own");
}
