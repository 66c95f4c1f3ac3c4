/* test_w4_tiles: the tile configurations of the NVFP4 kernels against shared memory budgets
 * (src/backend/cuda/w4_tiles.c, plain C: no GPU needed). The budgets are the ones other
 * engines' tiles fail on: 99 KB and 101 KB per block (sm_120 parts), 48 KB without opt-in, and
 * the H200's 227 KB. The built-in choice must never pick a tile over the budget, and the tuned
 * table's cache file must round-trip and refuse malformed content. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/w4.h"
#include "base/util.h"
#include "test.h"

TEST(w4_tile_smem_and_budgets)
{
    /* 3 stages x 64 tokens x 2 halves x 528-byte rows, plus 64 row pointers */
    EXPECT(w4_tile_smem((W4Tile){8, 3, 1, 0, 0, 0, 0}) == 3 * 64 * 2 * 528 + 64 * 8, "smem %zu", w4_tile_smem((W4Tile){8, 3, 1, 0, 0, 0, 0}));
    EXPECT(w4_tile_smem((W4Tile){1, 0, 1, 0, 0, 0, 0}) == 8 * 8, "no staging: only the row pointers");
    char why[256] = "";
    size_t kb99 = 99 * 1024, kb101 = 101 * 1024;
    EXPECT(!w4_tile_fits((W4Tile){4, 3, 1, 0, 0, 0, 0}, kb99, why, sizeof why), "nt 4 st 3 (101632 B) must not fit 99 KB");
    EXPECT(strstr(why, "256 B over the 101376 B budget") != NULL, "reason: %s", why);
    EXPECT(w4_tile_fits((W4Tile){4, 3, 1, 0, 0, 0, 0}, kb101, NULL, 0), "nt 4 st 3 fits 101 KB");
    EXPECT(!w4_tile_fits((W4Tile){8, 2, 1, 0, 0, 0, 0}, kb101, NULL, 0), "nt 8 st 2 (135 KB) must not fit 101 KB");
    EXPECT(w4_tile_fits((W4Tile){8, 3, 1, 0, 0, 0, 0}, 227 * 1024, NULL, 0), "nt 8 st 3 (199 KB) fits the H200's 227 KB");
    EXPECT(!w4_tile_fits((W4Tile){8, 4, 1, 0, 0, 0, 0}, 227 * 1024, NULL, 0), "nt 8 st 4 (265 KB) fits no GPU we know");
    int rejected99 = 0, rejected101 = 0;
    for (int i = 0; i < W4_N_TILES; i++) {
        rejected99 += !w4_tile_fits(w4_tiles[i], kb99, NULL, 0);
        rejected101 += !w4_tile_fits(w4_tiles[i], kb101, NULL, 0);
    }
    /* the stream-split tiles add the up sums' exchange: nt 4 st 3 ss (105728 B) is over 101 KB too */
    EXPECT(w4_tile_smem((W4Tile){4, 3, 1, 1, 0, 0, 0}) == w4_tile_smem((W4Tile){4, 3, 1, 0, 0, 0, 0}) + 2 * 4 * 4 * 32 * 4, "ss exchange");
    /* the pf tiles: 19 (64 tokens, 3 stages) is over both, 20 (2 stages) and 21 (32 tokens) fit 99 KB;
     * the wg tiles: 22 (128 tokens, 4 stages, 130 KB) and 24 (6 stages, 194 KB) are over both,
     * 23 (3 stages, 98 KB), 25 and 26 fit 99 KB; the ring tiles 27 (108032 B), 28 (106176 B) and 29
     * (188608 B) fit neither, nor 30 and 36 (105920 B) */
    EXPECT(rejected99 == 15 && rejected101 == 14, "rejected: %d at 99 KB, %d at 101 KB", rejected99, rejected101);
}

TEST(w4_pf_tiles)
{
    /* a stage: 16 records x (1024 B of codes + 256 B of scales), then 8 nt rows of 272 B; plus 8 nt
     * row pointers, 16 record pointers and the tile's int4 (the kernels' static shared memory) */
    size_t s19 = 3 * (16 * 1280 + 64 * 272) + 64 * 8 + 16 * 8 + 16, s20 = 2 * (16 * 1280 + 64 * 272) + 64 * 8 + 16 * 8 + 16,
           s21 = 3 * (16 * 1280 + 32 * 272) + 32 * 8 + 16 * 8 + 16;
    EXPECT(w4_tiles[19].pf && w4_tiles[20].pf && w4_tiles[21].pf, "tiles 19-21 are the pf tiles");
    EXPECT(w4_tile_smem(w4_tiles[19]) == s19, "tile 19: %zu B", w4_tile_smem(w4_tiles[19]));
    EXPECT(w4_tile_smem(w4_tiles[20]) == s20, "tile 20: %zu B", w4_tile_smem(w4_tiles[20]));
    EXPECT(w4_tile_smem(w4_tiles[21]) == s21, "tile 21: %zu B", w4_tile_smem(w4_tiles[21]));
    /* two blocks of tile 19 on an H200 SM (228 KB, 1 KB reserved a block) */
    EXPECT(2 * (s19 + 1024) <= 228 * 1024, "tile 19: %zu B", s19);
    char why[256] = "";
    EXPECT(!w4_tile_fits(w4_tiles[19], 99 * 1024, why, sizeof why) && strstr(why, "12944 B over the 101376 B budget"), "%s", why);
    EXPECT(w4_tile_fits(w4_tiles[20], 99 * 1024, NULL, 0) && w4_tile_fits(w4_tiles[21], 99 * 1024, NULL, 0), "99 KB pf tiles");
    /* dense runs a pf tile as its twin, which must fit wherever any pf tile fits */
    W4Tile twin = w4_tiles[W4_PF_DENSE_TWIN];
    EXPECT(!twin.pf && !twin.ss, "the twin is a dense tile");
    W4Tile wtwin = w4_tiles[W4_WG_DENSE_TWIN];
    EXPECT(!wtwin.pf && !wtwin.ss, "the wg twin is a dense tile");
    for (int i = 0; i < W4_N_TILES; i++)
        if (w4_tiles[i].pf && w4_tiles[i].pf < 3) EXPECT(w4_tile_smem(w4_tiles[i].pf == 2 ? wtwin : twin) <= w4_tile_smem(w4_tiles[i]), "tile %d: twin needs more", i);
    /* wg tiles: stages of 2 halves x 8 nt rows x 128 B, 1 KB of alignment slack, the row pointers */
    for (int i = 22; i < 31; i++) EXPECT(w4_tiles[i].pf == 2, "tile %d is a wg tile", i);
    for (int i = 0; i < 27; i++) EXPECT(w4_tiles[i].wr == 0, "tile %d has no weight ring", i);
    /* the ring tiles add 8 warps x wr records (2304 B) and their barriers (8 B); two blocks of each
     * still fit an H200 SM (228 KB, 1 KB reserved a block) */
    EXPECT(w4_tile_smem(w4_tiles[27]) == 4 * 2 * 32 * 128 + 1024 + 8 * 4 * 2312 + 32 * 8, "tile 27: %zu B", w4_tile_smem(w4_tiles[27]));
    EXPECT(w4_tile_smem(w4_tiles[28]) == 3 * 2 * 64 * 128 + 1024 + 8 * 3 * 2312 + 64 * 8, "tile 28: %zu B", w4_tile_smem(w4_tiles[28]));
    for (int i = 27; i < 29; i++) EXPECT(2 * (w4_tile_smem(w4_tiles[i]) + 1024) <= 228 * 1024, "tile %d: two blocks an SM", i);
    EXPECT(w4_tile_smem(w4_tiles[29]) == 4 * 2 * 128 * 128 + 1024 + 8 * 3 * 2312 + 128 * 8, "tile 29: %zu B", w4_tile_smem(w4_tiles[29]));
    EXPECT(w4_tile_fits(w4_tiles[29], 227 * 1024, NULL, 0), "tile 29 fits the H200");
    EXPECT(w4_tile_smem(w4_tiles[30]) == 6 * 2 * 32 * 128 + 1024 + 8 * 3 * 2312 + 32 * 8 && w4_tile_smem(w4_tiles[30]) == 105920,
           "tile 30: %zu B", w4_tile_smem(w4_tiles[30]));
    for (int i = 0; i < W4_N_TILES; i++) EXPECT(w4_tiles[i].sc == (i == 30 || i == 36 ? 2 : 0), "tile %d: %d chunks a stage", i, w4_tiles[i].sc);
    /* the dense ring tiles: tile 10's (3 K-split warps' sums, the row pointers) plus 4 warps x wr records */
    EXPECT(w4_tile_smem(w4_tiles[31]) == w4_tile_smem(w4_tiles[10]) + 4 * 3 * 2304, "tile 31: %zu B", w4_tile_smem(w4_tiles[31]));
    EXPECT(w4_tile_smem(w4_tiles[33]) == w4_tile_smem(w4_tiles[11]) + 4 * 3 * 2304, "tile 33: %zu B", w4_tile_smem(w4_tiles[33]));
    for (int i = 31; i < 34; i++) EXPECT(w4_tiles[i].pf == 0 && w4_tiles[i].st == 0 && w4_tiles[i].wr >= 3, "tile %d", i);
    /* the stream-K tiles (dense only): 8 or 16 rows, no static shared memory (the staged rows
     * are the call's, checked at launch), so they fit any budget */
    for (int i = 34; i < 36; i++)
        EXPECT(w4_tiles[i].pf == 3 && w4_tiles[i].nt == i - 33 && w4_tile_smem(w4_tiles[i]) == 0 &&
                   w4_tile_fits(w4_tiles[i], 99 * 1024, NULL, 0) && w4_tile_runs(w4_tiles[i], 0, NULL, 0), "tile %d", i);
    EXPECT(2 * (w4_tile_smem(w4_tiles[30]) + 1024) <= 228 * 1024, "tile 30: two blocks an SM");
    /* tile 36 (dense only): tile 30's GEMM, its shared memory, wgmma */
    EXPECT(W4_DENSE_WG_TILE == 36 && w4_tiles[36].pf == 4 && w4_tile_smem(w4_tiles[36]) == w4_tile_smem(w4_tiles[30]), "tile 36");
    EXPECT(!w4_tile_runs(w4_tiles[36], 0, why, sizeof why) && strstr(why, "sm_90a") && w4_tile_runs(w4_tiles[36], 1, NULL, 0), "%s", why);
    EXPECT(w4_tile_smem(w4_tiles[22]) == 4 * 2 * 128 * 128 + 1024 + 128 * 8, "tile 22: %zu B", w4_tile_smem(w4_tiles[22]));
    EXPECT(w4_tile_smem(w4_tiles[25]) == 5 * 2 * 64 * 128 + 1024 + 64 * 8, "tile 25: %zu B", w4_tile_smem(w4_tiles[25]));
    EXPECT(!w4_tile_fits(w4_tiles[22], 227 * 1024 / 2, why, sizeof why) && strstr(why, "4 stages x 2 halves x 128 tokens"), "%s", why);
    /* the built-in MoE choice from 48 pairs per expert, by budget; dense never */
    EXPECT(w4_default_tile(W4_MOE, 64, 227 * 1024, 0, 1) == 19, "MoE 64 pairs per expert on 227 KB");
    EXPECT(w4_default_tile(W4_MOE, 256, 99 * 1024, 0, 1) == 20, "MoE 256 pairs per expert on 99 KB");
    EXPECT(w4_default_tile(W4_MOE, 40, 227 * 1024, 0, 1) == 7, "MoE 40 pairs per expert: the 64-token tile");
    EXPECT(w4_default_tile(W4_MOE, 64, 48 * 1024, 0, 1) == 3, "48 KB: no pf tile fits");
    /* where wgmma runs: the ring tiles from 9 pairs per expert (7 with split activations), 30 to 40
     * pairs, 28 to 56 (80 split), then tile 29; on 101 KB (the ring tiles do not fit) tile 23 */
    EXPECT(w4_default_tile(W4_MOE, 8, 227 * 1024, 1, 0) == 13, "sm_90a, 8 pairs, BF16 activations: tile 13");
    EXPECT(w4_default_tile(W4_MOE, 6, 227 * 1024, 1, 0) == 12, "sm_90a, 6 pairs, BF16 activations: tile 12");
    EXPECT(w4_default_tile(W4_MOE, 11, 227 * 1024, 1, 0) == 13, "sm_90a, 11 pairs, BF16 activations: tile 13");
    EXPECT(w4_default_tile(W4_MOE, 12, 227 * 1024, 1, 0) == 30, "sm_90a, 12 pairs, BF16 activations: tile 30");
    EXPECT(w4_default_tile(W4_MOE, 8, 227 * 1024, 0, 0) == 12, "no wgmma, 8 pairs, BF16 activations: tile 12");
    EXPECT(w4_default_tile(W4_MOE, 8, 227 * 1024, 1, 1) == 30, "sm_90a, 8 pairs, split activations: tile 30");
    EXPECT(w4_default_tile(W4_MOE, 16, 227 * 1024, 1, 0) == 30, "sm_90a, 16 pairs: tile 30");
    EXPECT(w4_default_tile(W4_MOE, 24, 227 * 1024, 1, 0) == 30, "sm_90a, 24 pairs: tile 30");
    EXPECT(w4_default_tile(W4_MOE, 25, 227 * 1024, 1, 0) == 28, "sm_90a, 25 pairs: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 36, 227 * 1024, 1, 1) == 30, "sm_90a, 36 pairs, split activations: tile 30");
    EXPECT(w4_default_tile(W4_MOE, 37, 227 * 1024, 1, 1) == 28, "sm_90a, 37 pairs, split activations: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 16, 104 * 1024, 1, 0) == 30, "sm_90a, 16 pairs on 104 KB: tile 30 (105920 B)");
    EXPECT(w4_default_tile(W4_MOE, 16, 103 * 1024, 1, 0) == 4, "sm_90a, 16 pairs on 103 KB: tile 4 (27 needs more than 30)");
    EXPECT(w4_default_tile(W4_MOE, 48, 227 * 1024, 1, 0) == 28, "sm_90a, 48 pairs: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 64, 227 * 1024, 1, 0) == 28, "sm_90a, 64 pairs: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 128, 227 * 1024, 1, 0) == 28, "sm_90a, 128 pairs: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 129, 227 * 1024, 1, 0) == 29, "sm_90a, 129 pairs: tile 29");
    EXPECT(w4_default_tile(W4_MOE, 128, 227 * 1024, 1, 1) == 28, "sm_90a, 128 pairs, split activations: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 129, 227 * 1024, 1, 1) == 29, "sm_90a, 129 pairs, split activations: tile 29");
    EXPECT(w4_default_tile(W4_MOE, 56, 227 * 1024, 1, 1) == 28, "sm_90a, 56 pairs, split activations: tile 28");
    EXPECT(w4_default_tile(W4_MOE, 256, 227 * 1024, 1, 0) == 29, "sm_90a, 256 pairs: tile 29");
    EXPECT(w4_default_tile(W4_MOE, 256, 150 * 1024, 1, 0) == 23, "sm_90a on 150 KB: tile 23 (tiles 29 and 24 need 184 and 194 KB)");
    EXPECT(w4_default_tile(W4_MOE, 256, 101 * 1024, 1, 0) == 23, "sm_90a on 101 KB: tile 23 (3 stages, 98 KB)");
    EXPECT(w4_default_tile(W4_MOE, 64, 101 * 1024, 1, 0) == 23, "sm_90a, 64 pairs on 101 KB: tile 23");
    EXPECT(w4_default_tile(W4_MOE, 16, 101 * 1024, 1, 0) == 4, "sm_90a, 16 pairs on 101 KB: tile 4");
    EXPECT(w4_default_tile(W4_MOE, 128, 227 * 1024, 0, 0) == 19, "no wgmma: tile 19");
    EXPECT(w4_default_tile(W4_MOE, 4, 227 * 1024, 1, 1) == 12, "decode is not a wg tile's");
    /* dense decode: the stream-K tile 34 up to 8 rows, whatever the budget (it checks each call's
     * rows against it), its 16-token twin 35 from 9 to 16 rows; where a call does not suit them,
     * the ring tile 31 with split activations, tile 10 with BF16 ones, tile 3 from 9 rows */
    for (int split = 0; split < 2; split++)
        for (int rows = 1; rows <= 8; rows++)
            EXPECT(w4_default_tile(W4_DENSE, rows, 99 * 1024, split, split) == 34, "dense %d rows, split %d: tile 34", rows, split);
    EXPECT(w4_default_tile(W4_DENSE, 9, 227 * 1024, 1, 1) == 35 && w4_default_tile(W4_DENSE, 16, 227 * 1024, 1, 0) == 35,
           "9-16 rows: tile 35");
    EXPECT(w4_default_tile(W4_DENSE, 17, 227 * 1024, 1, 0) == 36 && w4_default_tile(W4_DENSE, 32, 227 * 1024, 1, 1) == 36,
           "17-32 rows with wgmma: tile 36");
    EXPECT(w4_default_tile(W4_DENSE, 33, 227 * 1024, 1, 0) == 36 && w4_default_tile(W4_DENSE, 64, 227 * 1024, 1, 1) == 36,
           "33-64 rows with wgmma: tile 36 (on tile 28's GEMM)");
    EXPECT(w4_default_tile(W4_DENSE, 17, 227 * 1024, 0, 0) == 4 && w4_default_tile(W4_DENSE, 64, 227 * 1024, 0, 0) == 4 &&
               w4_default_tile(W4_DENSE, 24, 101 * 1024, 1, 0) == 4 && w4_default_tile(W4_DENSE, 255, 227 * 1024, 1, 0) == 36,
           "17-64 rows without wgmma, 101 KB: tile 4; 255 rows: tile 36");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024, 1, 0) == 36 && w4_default_tile(W4_DENSE, 256, 227 * 1024, 0, 1) == 7 &&
               w4_default_tile(W4_DENSE, 256, 99 * 1024, 1, 1) == 4 && w4_sk_fallback(100, 227 * 1024, 1) == 7 &&
               w4_sk_fallback(64, 227 * 1024, 1) == 4,
           "4096 rows with wgmma: tile 36 (where the cuBLASLt route is off); 256 rows without wgmma: tile 7, on 99 KB "
           "(tile 36 does not fit): tile 4; "
           "tile 36 declined at 100 rows: tile 7, at 64: tile 4");
    EXPECT(w4_sk_fallback(1, 227 * 1024, 1) == 31, "dense 1 row, split activations: tile 31");
    EXPECT(w4_sk_fallback(8, 99 * 1024, 1) == 31, "dense 8 rows, split, 99 KB: tile 31");
    EXPECT(w4_sk_fallback(1, 227 * 1024, 0) == 10, "dense 1 row, BF16 activations: tile 10");
    EXPECT(w4_sk_fallback(1, 16 * 1024, 1) == 10, "dense 1 row on 16 KB: tile 10 (31 needs %zu B)", w4_tile_smem(w4_tiles[31]));
    EXPECT(w4_sk_fallback(16, 227 * 1024, 1) == 3 && w4_sk_fallback(32, 227 * 1024, 1) == 4, "16 and 32 rows: tiles 3, 4");
    for (double rows = 1; rows <= 65536; rows *= 1.5)
        for (size_t b = 48 * 1024; b <= 227 * 1024; b += 1024)
            for (int wg = 0; wg < 2; wg++) {
                int t = w4_default_tile(W4_DENSE, rows, b, wg, 1);
                EXPECT(!w4_tiles[t].pf || (w4_tiles[t].pf == 3 && rows <= 16) || (w4_tiles[t].pf == 4 && wg),
                       "dense %.0f rows: a pf tile", rows);
                t = w4_sk_fallback(rows, b, 1);
                EXPECT(!w4_tiles[t].pf && w4_tile_fits(w4_tiles[t], b, NULL, 0), "dense %.0f rows: fallback tile %d", rows, t);
                t = w4_default_tile(W4_MOE, rows, b, wg, rows > 1000);
                EXPECT(wg || w4_tiles[t].pf != 2, "MoE %.0f rows on %zu B without wgmma: wg tile %d", rows, b, t);
            }
    /* a wg tile says why it does not run without wgmma */
    EXPECT(w4_tile_runs(w4_tiles[22], 1, NULL, 0) && w4_tile_runs(w4_tiles[19], 0, NULL, 0), "runs");
    EXPECT(!w4_tile_runs(w4_tiles[24], 0, why, sizeof why) && strstr(why, "sm_90a"), "%s", why);
}

TEST(w4_default_never_over_budget)
{
    size_t budgets[] = {48 * 1024, 99 * 1024, 101 * 1024, 227 * 1024, 1024};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
        for (int kind = 0; kind < W4_KINDS; kind++)
            for (double rows = 1; rows <= 65536; rows *= 1.5) {
                int t = w4_default_tile((W4Kind)kind, rows, budgets[b], (int)b & 1, rows > 100);
                ASSERT(t >= 0 && t < W4_N_TILES, "tile %d", t);
                EXPECT(w4_tile_fits(w4_tiles[t], budgets[b], NULL, 0), "kind %d rows %.0f budget %zu: tile %d does not fit", kind,
                       rows, budgets[b], t);
            }
    /* with room, prefill takes tile 36 (wgmma) or else the 64-token staged tile; on smaller GPUs the largest that fits */
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024, 1, 1) == 36, "dense 4096 rows on 227 KB with wgmma");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024, 0, 1) == 7, "dense 4096 rows on 227 KB without wgmma");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 99 * 1024, 1, 1) == 4, "99 KB: 32 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 48 * 1024, 0, 1) == 3, "48 KB: 16 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 1, 227 * 1024, 1, 0) == 34 && w4_default_tile(W4_DENSE, 1, 1024, 0, 1) == 34,
           "one row: stream-K (its static shared memory is none)");
    EXPECT(w4_default_tile(W4_MOE, 1, 227 * 1024, 1, 1) == 12, "MoE decode: gate and up on separate warps");
    EXPECT(w4_default_tile(W4_MOE, 1, 1024, 1, 1) == 0, "1 KB: the 8-token tile without the exchange");
}

/* The MoE's expert classes beside the call's tile: which tiles have them, the defaults by
 * activation form, the overrides, and that no expert can be in two classes */
TEST(w4_moe_classes)
{
    int h, s;
    struct { int tile, T, split, hot, small; } want[] = {
        {30, 512, 0, 64, 8}, {30, 256, 1, 64, 4}, {28, 2048, 0, 64, 8}, {29, 8192, 0, 0, 8}, {13, 256, 0, 32, 6},
        {12, 128, 0, 16, 0}, {12, 64, 0, 0, 0},  /* beside the decode tile from 128 tokens with BF16 activations */
        {12, 64, 1, 16, 0},  {12, 32, 1, 0, 0},  /* and from 64 with split ones */
        {30, 64, 0, 0, 8},   /* no hot class where the call has no more tokens than its threshold */
        {0, 512, 0, 0, 0},   {19, 4096, 0, 0, 0}, {24, 4096, 1, 0, 0}, /* none beside the other tiles */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        w4_moe_classes(want[i].tile, want[i].T, want[i].split, 1, -1, -1, &h, &s);
        EXPECT(h == want[i].hot && s == want[i].small, "tile %d, %d tokens, split %d: hot %d small %d, want %d %d", want[i].tile,
               want[i].T, want[i].split, h, s, want[i].hot, want[i].small);
    }
    w4_moe_classes(30, 512, 0, 0, -1, -1, &h, &s);
    EXPECT(h == 0 && s == 8, "tile 29 not runnable: no hot class (%d), the small one stays (%d)", h, s);
    w4_moe_classes(30, 512, 0, 1, 0, 0, &h, &s);
    EXPECT(h == 0 && s == 0, "both asked off: %d %d", h, s);
    w4_moe_classes(13, 300, 0, 1, 20, 24, &h, &s);
    EXPECT(h == 20 && s == 0, "a small threshold at or above the hot one: no small class (%d %d)", h, s);
    w4_moe_classes(28, 300, 1, 1, 100, 20, &h, &s);
    EXPECT(h == 100 && s == 20, "overrides: %d %d", h, s);
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
    t.tile[W4_MOE][w4_bucket(64)] = 1;
    t.tile[W4_DENSE][w4_bucket(4096)] = 8;
    ASSERT(w4_table_save(&t, path, err, sizeof err) == 0, "%s", err);
    ASSERT(w4_table_load(&u, path, err, sizeof err) == 0, "%s", err);
    EXPECT(memcmp(&t, &u, sizeof t) == 0, "the table does not round-trip");
    /* hand-written caches of this tile set: each bad entry refused with what was expected */
    char fp[64];
    w4_tiles_fingerprint(fp, sizeof fp);
    const char *bad[] = {"{\"64\": {\"tile\": 37}}", "{\"64\": {\"tile\": -1}}", "{\"64\": 5}", "{\"x64\": {\"tile\": 1}}",
                         "{\"0\": {\"tile\": 1}}", "{\"99999999999\": {\"tile\": 1}}", "{\"\": {\"tile\": 1}}", "[1]"};
    _Static_assert(W4_N_TILES == 37, "the first bad entry is the tile one past the table");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"device\": \"x\", \"tiles\": \"%s\", \"moe\": %s}", fp, bad[i]);
        fclose(f);
        err[0] = 0;
        EXPECT(w4_table_load(&u, path, err, sizeof err) < 0 && strstr(err, "moe"), "bad moe entry %s accepted: %s", bad[i], err);
    }
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"device\": \"x\", \"tiles\": \"%s\", \"moe\": {\"64\": {\"tile\": 30}}}", fp);
    fclose(f);
    EXPECT(w4_table_load(&u, path, err, sizeof err) == 0 && u.tile[W4_MOE][w4_bucket(64)] == 30, "a good hand-written entry: %s", err);
    /* a cache from a build with another tile set (or from before the key existed) is stale */
    const char *stale[] = {"\"36 tiles, fnv 0123456789abcdef\"", "1", NULL};
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

/* the fingerprint names the tile count and moves with any tile's field */
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
        for (int f = 0; f < 7; f++) { /* each field of every fifth tile, one at a time */
            memcpy(t, w4_tiles, sizeof t);
            int *fld[7] = {&t[i].nt, &t[i].st, &t[i].ks, &t[i].ss, &t[i].pf, &t[i].wr, &t[i].sc};
            *fld[f] += 1;
            w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
            EXPECT(strcmp(a, b) != 0, "tile %d field %d changed, fingerprint the same", i, f);
        }
    memcpy(t, w4_tiles, sizeof t);
    W4Tile x = t[28];
    t[28] = t[29];
    t[29] = x;
    w4_fingerprint_of(t, W4_N_TILES, b, sizeof b);
    EXPECT(strcmp(a, b) != 0, "tiles 28 and 29 swapped, fingerprint the same");
}

/* w4.h's multiply form of decode register 2 against the two-shift form it replaces: it depends
 * only on its 8 source bits, so their 256 values (under random other bits, which must not matter)
 * cover every word */
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
