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
    EXPECT(w4_tile_smem((W4Tile){8, 3, 1, 0}) == 3 * 64 * 2 * 528 + 64 * 8, "smem %zu", w4_tile_smem((W4Tile){8, 3, 1, 0}));
    EXPECT(w4_tile_smem((W4Tile){1, 0, 1, 0}) == 8 * 8, "no staging: only the row pointers");
    char why[256] = "";
    size_t kb99 = 99 * 1024, kb101 = 101 * 1024;
    EXPECT(!w4_tile_fits((W4Tile){4, 3, 1, 0}, kb99, why, sizeof why), "nt 4 st 3 (101632 B) must not fit 99 KB");
    EXPECT(strstr(why, "256 B over the 101376 B budget") != NULL, "reason: %s", why);
    EXPECT(w4_tile_fits((W4Tile){4, 3, 1, 0}, kb101, NULL, 0), "nt 4 st 3 fits 101 KB");
    EXPECT(!w4_tile_fits((W4Tile){8, 2, 1, 0}, kb101, NULL, 0), "nt 8 st 2 (135 KB) must not fit 101 KB");
    EXPECT(w4_tile_fits((W4Tile){8, 3, 1, 0}, 227 * 1024, NULL, 0), "nt 8 st 3 (199 KB) fits the H200's 227 KB");
    EXPECT(!w4_tile_fits((W4Tile){8, 4, 1, 0}, 227 * 1024, NULL, 0), "nt 8 st 4 (265 KB) fits no GPU we know");
    int rejected99 = 0, rejected101 = 0;
    for (int i = 0; i < W4_N_TILES; i++) {
        rejected99 += !w4_tile_fits(w4_tiles[i], kb99, NULL, 0);
        rejected101 += !w4_tile_fits(w4_tiles[i], kb101, NULL, 0);
    }
    /* the stream-split tiles add the up sums' exchange: nt 4 st 3 ss (105728 B) is over 101 KB too */
    EXPECT(w4_tile_smem((W4Tile){4, 3, 1, 1}) == w4_tile_smem((W4Tile){4, 3, 1, 0}) + 2 * 4 * 4 * 32 * 4, "ss exchange");
    EXPECT(rejected99 == 7 && rejected101 == 6, "rejected: %d at 99 KB, %d at 101 KB", rejected99, rejected101);
}

TEST(w4_default_never_over_budget)
{
    size_t budgets[] = {48 * 1024, 99 * 1024, 101 * 1024, 227 * 1024, 1024};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
        for (int kind = 0; kind < W4_KINDS; kind++)
            for (double rows = 1; rows <= 65536; rows *= 1.5) {
                int t = w4_default_tile((W4Kind)kind, rows, budgets[b]);
                ASSERT(t >= 0 && t < W4_N_TILES, "tile %d", t);
                EXPECT(w4_tile_fits(w4_tiles[t], budgets[b], NULL, 0), "kind %d rows %.0f budget %zu: tile %d does not fit", kind,
                       rows, budgets[b], t);
            }
    /* with room, prefill takes the 64-token staged tile; on smaller GPUs the largest that fits */
    EXPECT(w4_default_tile(W4_DENSE, 4096, 227 * 1024) == 7, "dense 4096 rows on 227 KB");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 99 * 1024) == 4, "99 KB: 32 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 4096, 48 * 1024) == 3, "48 KB: 16 tokens, 2 stages");
    EXPECT(w4_default_tile(W4_DENSE, 1, 227 * 1024) == 10, "one row: K split over the block");
    EXPECT(w4_default_tile(W4_MOE, 1, 227 * 1024) == 12, "MoE decode: gate and up on separate warps");
    EXPECT(w4_default_tile(W4_MOE, 1, 1024) == 0, "1 KB: the 8-token tile without the exchange");
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
    FILE *f = fopen(path, "w");
    fputs("{\"device\": \"x\", \"moe\": {\"64\": {\"tile\": 19}}}", f);
    fclose(f);
    EXPECT(w4_table_load(&u, path, err, sizeof err) < 0 && strstr(err, "tile"), "out-of-range tile accepted: %s", err);
    f = fopen(path, "w");
    fputs("{\"moe\": {}", f);
    fclose(f);
    EXPECT(w4_table_load(&u, path, err, sizeof err) < 0, "malformed JSON accepted");
}
