/* w4_tiles: the tile configurations of the W4A16 kernels (w4.h), what shared memory each
 * needs, which fit a budget, the built-in choice, and the tuned table's file. Plain C: the
 * budget logic is tested without a GPU (tests/unit/test_w4_tiles.c). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../base/util.h"
#include "w4.h"

/* kept in step with w4.cuh: W4_XS = 264 elements per staged row, 2 bytes each, and each token
 * staged twice (the high and low BF16 halves of the activation) */
#define XS_BYTES (264 * 2)

const W4Tile w4_tiles[W4_N_TILES] = {
    {1, 0, 1, 0, 0, 0, 0}, {2, 0, 1, 0, 0, 0, 0}, {4, 0, 1, 0, 0, 0, 0},               /* activations from global memory (L1): small batches */
    {2, 2, 1, 0, 0, 0, 0}, {4, 2, 1, 0, 0, 0, 0}, {4, 3, 1, 0, 0, 0, 0}, {4, 4, 1, 0, 0, 0, 0}, /* staged through shared memory */
    {8, 2, 1, 0, 0, 0, 0}, {8, 3, 1, 0, 0, 0, 0}, {8, 4, 1, 0, 0, 0, 0},               /* 64 tokens a block: prefill */
    {1, 0, 4, 0, 0, 0, 0}, {2, 0, 4, 0, 0, 0, 0},                             /* K split over the block's 4 warps: decode */
    {1, 0, 1, 1, 0, 0, 0}, {2, 0, 1, 1, 0, 0, 0}, {4, 0, 1, 1, 0, 0, 0},               /* MoE gate and up on separate warps */
    {2, 2, 1, 1, 0, 0, 0}, {4, 2, 1, 1, 0, 0, 0}, {4, 3, 1, 1, 0, 0, 0}, {8, 2, 1, 1, 0, 0, 0},
    {8, 3, 1, 0, 1, 0, 0}, {8, 2, 1, 0, 1, 0, 0}, {4, 3, 1, 0, 1, 0, 0},      /* MoE prefill block GEMM: 64 or 32 tokens a block */
    {16, 4, 1, 0, 2, 0, 0}, {16, 3, 1, 0, 2, 0, 0}, {16, 6, 1, 0, 2, 0, 0}, {8, 5, 1, 0, 2, 0, 0}, /* the same on wgmma (sm_90a): 128, 64 */
    {4, 4, 1, 0, 2, 0, 0},                                                        /* or 32 tokens a block */
    {4, 4, 1, 0, 2, 4, 0}, {8, 3, 1, 0, 2, 3, 0}, {16, 4, 1, 0, 2, 3, 0}, /* wg, the weights through a ring of records in shared memory */
    {4, 6, 1, 0, 2, 3, 2}, /* 32 tokens, the ring, stages of 2 chunks (one barrier per 128 columns) */
    {1, 0, 4, 0, 0, 3, 0}, {1, 0, 4, 0, 0, 4, 0}, {2, 0, 4, 0, 0, 3, 0}, /* dense decode (10, 11) with the weights through a ring */
    {1, 0, 1, 0, 3, 0, 0}, {2, 0, 1, 0, 3, 0, 0}, /* dense decode, stream-K: one wave, activations staged whole */
    {4, 6, 1, 0, 4, 3, 2}, /* dense decode to 32 rows on tile 30's wgmma GEMM (33-64 on tile 28's), K split to fill a wave */
};

size_t w4_tile_smem(W4Tile t)
{
    if (t.pf == 3) /* the static part; the staged rows depend on the call (w4.cu checks them) */
        return 0;
    if (t.pf == 2 || t.pf == 4) /* stages of 2 halves x 8 nt rows x 128 B, 1024-aligned; 8 warps' record rings and
                    * their 8-byte barriers (W4_REC: 2304 B a record); the row pointers */
        return (size_t)t.st * 2 * 8 * t.nt * 128 + 1024 + (size_t)8 * t.wr * (2304 + 8) + (size_t)8 * t.nt * sizeof(void *);
    if (t.pf) /* the stages, plus the row pointers, the block's record pointers and the tile's facts (an int4) */
        return (size_t)t.st * W4_PF_STAGE(t.nt) + (size_t)8 * t.nt * sizeof(void *) + W4_PF_RECS * sizeof(void *) + 16;
    size_t dyn = (size_t)t.st * 2 * 8 * t.nt * XS_BYTES, rowp = (size_t)8 * t.nt * sizeof(void *);
    size_t red = t.ks > 1 ? (size_t)(t.ks - 1) * 2 * t.nt * 4 * 32 * sizeof(float) : 0; /* 2: gate and up */
    if (t.ss) red = (size_t)(4 / 2) * t.nt * 4 * 32 * sizeof(float); /* the up sums of the block's 2 row tiles */
    size_t ring = (size_t)4 * t.wr * 2304; /* dense ring tiles: 4 warps x wr records */
    return dyn + rowp + red + ring;
}

int w4_tile_fits(W4Tile t, size_t budget, char *why, size_t n)
{
    size_t need = w4_tile_smem(t);
    if (need <= budget) return 1;
    if (why && (t.pf == 2 || t.pf == 4))
        snprintf(why, n, "needs %zu B of shared memory (%d stages x 2 halves x %d tokens x 128 B, 1 KB alignment, "
                 "8 warps x %d ring records, row pointers), %zu B over the %zu B budget", need, t.st, 8 * t.nt, t.wr,
                 need - budget, budget);
    else if (why && t.pf)
        snprintf(why, n, "needs %zu B of shared memory (%d stages x (%d records x %d B + %d tokens x %d B), row and record "
                 "pointers, 16 B), %zu B over the %zu B budget", need, t.st, W4_PF_RECS, W4_PF_REC_BYTES, 8 * t.nt, W4_PF_ROW_BYTES,
                 need - budget, budget);
    else if (why)
        snprintf(why, n, "needs %zu B of shared memory (%d stages x %d tokens x 2 halves x %d B, row pointers, K-split sums), "
                 "%zu B over the %zu B budget", need, t.st, 8 * t.nt, XS_BYTES, need - budget, budget);
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
    if ((t.pf != 2 && t.pf != 4) || wg) return 1;
    if (why) snprintf(why, n, "runs on wgmma, which needs an sm_90a GPU (H100, H200) and a build for it (CUDA_ARCH with sm_90a)");
    return 0;
}

static int first_fit(const int *prefs, int n, size_t budget, int wg)
{
    for (int i = 0; i < n; i++)
        if (w4_tile_fits(w4_tiles[prefs[i]], budget, NULL, 0) && w4_tile_runs(w4_tiles[prefs[i]], wg, NULL, 0)) return prefs[i];
    return 0; /* {1, 0} needs 64 bytes */
}

/* From `moeserve tune` on the H200 (docs/PERFORMANCE.md): dense, up to 8 rows the K split over
 * the block (tile 10), 16 rows 2 staged groups of 16 tokens (3), 64 rows 32 tokens (4), more 64
 * tokens (7); MoE by pairs per expert: up to 8 the 8-token tile with gate and up on separate
 * warps (12; session 4: 1-7% faster than tile 0 from 1 to 256 tokens), up to 24 tile 4, more 7.
 * Each falls back to smaller tiles when the budget is short. MoE from 48 pairs per expert: the
 * prefill block GEMM (19: 64 tokens, 3 stages; 20: 2 stages, fits 99 KB; 21: 32 tokens); on
 * sm_90a from 96 pairs (48 with split activations) the wgmma tiles (24: 128 tokens, 6 stages;
 * 23: 3 stages, fits 99 KB): session 6, tile 24 against 19 at 128 pairs 9.3 against 12.0 ms
 * (BF16 activations), at 64 pairs 6.7 against 6.6 ms, and with split activations 8.7 against
 * 13.0 ms at 64 pairs. Session 7 (H200, docs/PERFORMANCE.md): on sm_90a the wg tiles with the
 * weight ring take over from 9 pairs per expert (7 with split activations: tile 12 at 8 pairs
 * 1.88 ms BF16 against tile 27's 2.04, split 2.79 against 2.51): tile 27 (32 tokens) to 40
 * pairs (16 pairs 2.15 ms against tile 19's 2.99; 32 pairs 3.06 against tile 28's 3.66; 48
 * pairs 4.26 against 4.02), tile 28 (64 tokens) to 56 pairs (80 with split activations: 48 pairs
 * 4.00 ms against tile 29's 4.60, 64 pairs 5.16 against 4.76; split 6.42 against 6.62 at 64, 9.03
 * against 8.71 at 96), then tile 29 (128 tokens, 1 block an SM: 256 pairs 12.56 ms against tile
 * 24's 14.99, split 19.77 against 21.38). Session 8: tile 30 (tile 27 with stages of 2 chunks)
 * in 27's place, 3% faster at 8-16 pairs with BF16 activations, 6-8% split (512 tokens 2.10
 * against 2.16 ms, split 2.57 against 2.78), even at 32 (3.07 against 3.11, split 4.10 against 4.04).
 * Dense up to 8 rows with split activations: tile 31 (tile 10 with a 3-slot weight ring in shared
 * memory), 13-28% faster on the large GLM shapes (GLM-5 o_proj at 1 row 39.3 against 47.1 us, gate/up
 * at 8 rows 37.9 against 52.6); with BF16 activations it is no faster than tile 10, which stays.
 * Session 9: dense up to 8 rows, tile 34 (stream-K: one wave, rows staged once a block, PDL) for
 * both activation forms, where the call suits it (w4_sk_fallback otherwise): GLM-5 gate/up at 1 row
 * in a chain 14.2 us BF16 against tile 10's 20.7, 16.8-17.8 split against tile 31's 26.6-27.2.
 * Session 10: with split activations too, tile 29 from 57 pairs (2048 tokens, 64 pairs: 6.37 ms
 * random and 7.13 skewed against tile 28's 6.65 and 7.56; ptxas now serializes tile 28's wgmma
 * for want of registers at 2 blocks an SM). Session 12 (persistent ring blocks, one-half BF16
 * stages; docs/PERFORMANCE.md): tile 28 from 25 pairs with BF16 activations (32 pairs: tile 28
 * 2.70 ms, tile 30 3.00; 28 pairs even; 24 pairs: tile 30 2.34, tile 28 2.52) and from 37 with
 * split (40 pairs: tile 28 4.69, tile 30 4.97; 32 pairs: tile 30 3.79, tile 28 4.03), and with
 * split up to 72 pairs (64 pairs random: tile 28 6.32 ms, tile 29 6.68; skewed 6.78 and 6.70;
 * 96 pairs: tile 29 8.39, tile 28 9.08). Session 13: with BF16 activations on sm_90a, 7 to 11
 * pairs an expert take tile 13 (16 tokens a tile, gate and up on separate warps; one call, the
 * same token list for each tile, two runs: 256 tokens 1.73-1.75 ms against tile 12's 1.98-2.04
 * and tile 30's 2.00-2.02, skewed 1.88-1.89 against 2.05-2.09 and 1.93-1.95; 320 tokens 1.86-1.90
 * against tile 30's 2.07-2.09, skewed even; 384 tokens random 2% faster than tile 30, skewed 6%
 * slower; 192 tokens even with tile 12, 128 tokens 14% slower). With split activations tile 13
 * is the slowest at 256 tokens (2.98 ms against tile 30's 1.91). Session 14 (the MMAs' N follows
 * an expert's last token tile; tile 28's hot class from 64 pairs, w4.cu): tile 28 up to 128 pairs
 * in both forms (2048 tokens BF16 random 3.52-3.61 ms against tile 29's 3.78-3.85, skewed 3.88-3.97
 * against 4.33-4.35; 4096 even random, 6% faster skewed; split 2048 random 5% faster, skewed even,
 * 4096 even random, 3% faster skewed); from 129 pairs tile 29 as before. */
int w4_default_tile(W4Kind kind, double rows, size_t budget, int wg, int split)
{
    static const int big[] = {7, 4, 3, 0}, mid[] = {4, 3, 0}, pf[] = {19, 20, 21, 7, 4, 3, 0};
    static const int wgp[] = {24, 23, 19, 20, 21, 7, 4, 3, 0}, ring28[] = {28, 24, 23, 19, 20, 21, 7, 4, 3, 0};
    static const int ring29[] = {29, 24, 23, 19, 20, 21, 7, 4, 3, 0}, ring30[] = {30, 27, 4, 3, 0};
    if (kind == W4_MOE) {
        if (wg && !split && rows > 6 && rows <= 11) return first_fit((const int[]){13, 12, 0}, 3, budget, wg);
        if (wg && rows > (split ? 6 : 8)) {
            if (rows <= (split ? 36 : 24)) return first_fit(ring30, 5, budget, wg);
            if (rows <= 128) return first_fit(ring28, 10, budget, wg);
            return first_fit(ring29, 10, budget, wg);
        }
        if (rows <= 8) return first_fit((const int[]){12, 0}, 2, budget, wg);
        if (rows <= 24) return first_fit(mid, 3, budget, wg);
        if (wg && rows >= (split ? 48 : 96)) return first_fit(wgp, 9, budget, wg);
        if (rows >= 48) return first_fit(pf, 7, budget, wg);
        return first_fit(big, 4, budget, wg);
    }
    if (rows <= 8) return 34;
    if (rows <= 16) return 35; /* session 11: 16 rows staged whole where they fit (tile 36, else w4_sk_fallback, where not) */
    /* session 15: 17-32 rows on tile 36 (GLM-5 o_proj at 24 rows 67 -> 30 us BF16, 98 -> 38 split);
     * session 19: 33-64 rows too, on tile 28's GEMM (o_proj at 64 rows 114 -> 45 us BF16, 189 -> 63 split);
     * session 22: above 64 rows too, in token tiles of 64 (o_proj at 128 rows 304 -> 87 us BF16, 679 ->
     * 130 split against tile 7; the BF16 + cuBLASLt route takes the calls from w4_lt_rows) */
    if (w4_tile_fits(w4_tiles[W4_DENSE_WG_TILE], budget, NULL, 0) && w4_tile_runs(w4_tiles[W4_DENSE_WG_TILE], wg, NULL, 0))
        return W4_DENSE_WG_TILE;
    return w4_sk_fallback(rows, budget, split);
}

int w4_sk_fallback(double rows, size_t budget, int split)
{
    static const int mid[] = {4, 3, 0}, d16[] = {3, 0}, big[] = {7, 4, 3, 0};
    if (rows > 64) return first_fit(big, 4, budget, 0); /* the mma.sync tiles of the time before tile 36 */
    if (rows <= 8) return split ? first_fit((const int[]){31, 10, 0}, 3, budget, 0) : first_fit((const int[]){10, 0}, 2, budget, 0);
    if (rows <= 16) return first_fit(d16, 2, budget, 0);
    return first_fit(mid, 3, budget, 0);
}

/* Hot experts (beside the ring tiles 28 and 30 and the mma.sync tiles 13 and 12, where tile 29
 * runs and fits: hot_ok): an expert with more than `hot` pairs of a call runs on tile 29 (128
 * tokens a tile), the others on the call's tile: the routing kernel lists the classes' token
 * tiles apart and each class runs its own gate/up and down (w4.cu w4_moe_cuda). With skewed
 * routing a few experts hold many pairs, and on the small tiles each of their token tiles decoded
 * the expert's weights again. The threshold: two of the call's token tiles on tiles 13 and 30 (32
 * and 64 pairs), one on tile 28 (64; session 13 measured 128 better there, before the MMAs' N
 * followed an expert's last token tile; session 14: 64 is 5-10% faster at 2048 tokens, where tile
 * 28 now runs up to 128 pairs an expert); beside tile 12 (whose 8-token tiles decode an expert's
 * weights again every 8 pairs) 16 pairs, from 128 tokens a call with BF16 activations and 64 split
 * (session 16: skewed 128-192 tokens 8-14% faster with BF16 activations, 13-20% split; at 64
 * tokens BF16 3% slower; from 8 pairs split random 128 tokens was 4% slower: a few experts of 9-12
 * pairs make a latency-bound tile 29 launch). None where the call has no more tokens than the
 * threshold (no expert can pass it).
 * Small experts (beside the wg call tiles 28, 29 and 30 and the mma.sync tile 13): an expert with
 * at most `small` pairs runs on tile 12 (8 tokens a tile, mma.sync, gate and up on separate
 * warps), as the hot class does at the other end: with skewed routing most experts get a few pairs
 * while a few get hundreds, and the call's tile, chosen by the average, streamed each cold
 * expert's weights through a tile built for 16-128 tokens. The default (session 16, H200): with
 * BF16 activations 8 pairs beside tiles 28-30 (skewed 512 tokens -12%), 6 beside tile 13 (256
 * tokens -3% random, -7% skewed); with split activations 4 (tile 12 packs the two halves of up to
 * 4 tokens into one MMA: random 256 -2%, skewed 256 -13%; at 8 random 256 was 6% slower); none at
 * or above the hot threshold. hot_set, small_set: the thresholds asked for (0: off), or -1. */
void w4_moe_classes(int tile, int T, int split, int hot_ok, int hot_set, int small_set, int *hot, int *small)
{
    int h = 0, s = 0, mt = 8 * w4_tiles[tile].nt;
    if (hot_ok && (tile == 28 || tile == 30 || tile == 13 || (tile == 12 && T >= (split ? 64 : 128))))
        h = hot_set >= 0 ? hot_set : tile == 28 ? mt : 2 * mt;
    if (h >= T) h = 0;
    if (tile == 13 || (tile >= 28 && tile <= 30)) s = small_set >= 0 ? small_set : split ? 4 : tile == 13 ? 6 : 8;
    if (h > 0 && s >= h) s = 0; /* an expert in one class only */
    *hot = h;
    *small = s;
}

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
        const int f[7] = {t.nt, t.st, t.ks, t.ss, t.pf, t.wr, t.sc};
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
            if (t->tile[k][b] >= 0) {
                char key[16];
                snprintf(key, sizeof key, "%d", w4_bucket_tokens(b));
                W4Tile w = w4_tiles[t->tile[k][b]];
                json_object_set_new(m, key, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "tile", t->tile[k][b], "nt", w.nt, "st", w.st,
                                                     "ks", w.ks, "ss", w.ss, "pf", w.pf, "wr", w.wr, "sc", w.sc));
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
            json_t *ti = json_object_get(v, "tile");
            long tile = json_is_integer(ti) ? (long)json_integer_value(ti) : -1;
            if (*end || end == key || tok < 1 || tok > (1 << 30) || tile < 0 || tile >= W4_N_TILES) {
                json_decref(root);
                errbuf_set(err, n, "%s: %s bucket \"%s\": expected {\"tile\": 0..%d}", path, kind_key[k], key, W4_N_TILES - 1);
                return -1;
            }
            t->tile[k][w4_bucket((int)tok)] = (int)tile;
        }
    }
    json_decref(root);
    return 0;
}

void w4_table_path(char *buf, size_t n)
{
    const char *e = getenv("MOESERVE_TUNE_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e && *e) snprintf(buf, n, "%s", e);
    else if (x && *x) snprintf(buf, n, "%s/moeserve/w4-tune.json", x);
    else snprintf(buf, n, "%s/.cache/moeserve/w4-tune.json", h && *h ? h : "/tmp");
}
