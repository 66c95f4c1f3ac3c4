/* batch_fixture: random paged batches for the attention op tests (batch_fixture.h). */
#include "batch_fixture.h"

#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"

Batch test_batch_make(Rng *r, int S, const int *ctx, const int *ntok, int bs, int *n_slots)
{
    int T = 0, maxb = 0, nblk = 0;
    for (int s = 0; s < S; s++) {
        T += ntok[s];
        int nb = (ctx[s] + bs - 1) / bs;
        maxb = nb > maxb ? nb : maxb;
        nblk += nb;
    }
    int *perm = xmalloc(nblk * sizeof(int));
    test_shuffle(r, perm, nblk);
    Batch b = {.n_tokens = T, .n_seqs = S, .bt_stride = maxb};
    b.tokens = xcalloc(T, 4); b.pos = xcalloc(T, 4); b.seq = xcalloc(T, 4); b.slot = xcalloc(T, 4);
    b.seq_start = xcalloc(S, 4); b.seq_ntok = xcalloc(S, 4); b.ctx_len = xcalloc(S, 4);
    b.block_table = xcalloc((size_t)S * maxb, 4);
    int t = 0, used = 0;
    for (int s = 0; s < S; s++) {
        int nb = (ctx[s] + bs - 1) / bs;
        for (int i = 0; i < nb; i++) b.block_table[s * maxb + i] = perm[used++];
        b.seq_start[s] = t;
        b.seq_ntok[s] = ntok[s];
        b.ctx_len[s] = ctx[s];
        b.max_ctx = ctx[s] > b.max_ctx ? ctx[s] : b.max_ctx;
        for (int i = 0; i < ntok[s]; i++, t++) {
            b.seq[t] = s;
            b.pos[t] = ctx[s] - ntok[s] + i;
            b.slot[t] = cpu_slot(&b, s, b.pos[t], bs);
        }
    }
    *n_slots = nblk * bs;
    free(perm);
    return b;
}

void test_batch_free(Batch *b)
{
    free(b->tokens); free(b->pos); free(b->seq); free(b->slot); free(b->seq_start); free(b->seq_ntok);
    free(b->ctx_len); free(b->block_table);
}

ModelConfig test_mla_cfg(int H, int C, int Dn, int Dr, int Dv, int Ki)
{
    ModelConfig c = {0};
    c.n_heads = H, c.kv_lora_rank = C, c.qk_nope_dim = Dn, c.qk_rope_dim = Dr, c.v_head_dim = Dv;
    c.index_topk = Ki;
    c.attn_scale = 1.0f / sqrtf((float)(Dn + Dr));
    return c;
}

void test_shuffle(Rng *r, int *perm, int n)
{
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_u64(r) % (i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
}
