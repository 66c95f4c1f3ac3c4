/* runner: a single sequence (or several alike) through Forward and the paged KV cache (runner.h). */
#include "runner.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

void runner_init_seqs(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size, int n_seqs)
{
    CHECK(n_seqs >= 1, "runner: %d sequences", n_seqs);
    *r = (Runner){.m = m, .be = be, .chunk = chunk, .max_ctx = max_ctx, .n_seqs = n_seqs};
    int nb = (max_ctx + block_size - 1) / block_size;
    kv_cache_init(&r->kv, &m->cfg, be, block_size, nb * n_seqs);
    r->bts = xcalloc(n_seqs, sizeof(BlockTable));
    for (int s = 0; s < n_seqs; s++)
        if (block_table_reserve(&r->bts[s], &r->kv, max_ctx) < 0)
            die("runner: a cache of %d blocks holds no %d tokens", nb * n_seqs, max_ctx);
    r->bt = r->bts[0];
    Dist *d = dist_get();
    int dp = d ? d->dp : 1, n = n_seqs * chunk;
    r->group = xmalloc(n_seqs * sizeof(int));
    for (int s = 0; s < n_seqs; s++) r->group[s] = s % dp;
    forward_init(&r->f, m, be, n, n, n_seqs, nb);
    forward_share(&r->f, &r->kv);
    r->pos = xmalloc(n * sizeof(int));
    r->seq = xcalloc(n, sizeof(int));
    r->slot = xmalloc(n * sizeof(int));
    r->out_idx = xmalloc(n * sizeof(int));
    r->tok = xmalloc(n * sizeof(int));
    r->start = xmalloc(n_seqs * sizeof(int));
    r->ntok = xmalloc(n_seqs * sizeof(int));
    r->ctx = xmalloc(n_seqs * sizeof(int));
    r->table = xmalloc((size_t)n_seqs * nb * sizeof(int));
    for (int s = 0; s < n_seqs; s++) memcpy(r->table + (size_t)s * nb, r->bts[s].blocks, nb * sizeof(int));
    if (n_seqs > 1) r->rows = xmalloc((size_t)n * m->cfg.vocab * sizeof(float));
}

void runner_init(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size)
{
    runner_init_seqs(r, m, be, max_ctx, chunk, block_size, 1);
}

void runner_free(Runner *r)
{
    if (!r->be) return;
    forward_free(&r->f);
    for (int s = 0; s < r->n_seqs; s++) block_table_release(&r->bts[s], &r->kv);
    kv_cache_free(&r->kv);
    void *arrs[] = {r->bts, r->group, r->pos, r->seq, r->slot, r->out_idx,
                    r->tok, r->start, r->ntok, r->ctx, r->table, r->rows};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) free(arrs[i]);
    *r = (Runner){0};
}

void runner_reset(Runner *r) { r->n_ctx = 0; }

void runner_enable_graphs(Runner *r) { forward_enable_graphs(&r->f, r->bt.n_blocks * r->kv.block_size); }

void runner_feed(Runner *r, const int *ids, int n, int all, float *logits)
{
    CHECK(r->n_ctx + n <= r->max_ctx, "runner: %d + %d tokens exceed the cache's %d", r->n_ctx, n, r->max_ctx);
    CHECK(r->n_seqs == 1 || all || !logits, "runner: %d sequences give every position's logits", r->n_seqs);
    int V = r->m->cfg.vocab, bs = r->kv.block_size, S = r->n_seqs, nb = r->bt.n_blocks;
    for (int s0 = 0; s0 < n; s0 += r->chunk) {
        int k = n - s0 < r->chunk ? n - s0 : r->chunk, base = r->n_ctx;
        int last = s0 + k == n;
        int n_out = all ? k : (last && logits ? 1 : 0);
        for (int s = 0; s < S; s++) { /* sequence s: tokens [s k, (s + 1) k) */
            for (int i = 0; i < k; i++) {
                int t = s * k + i;
                r->tok[t] = ids[s0 + i];
                r->pos[t] = base + i;
                r->seq[t] = s;
                r->slot[t] = block_table_slot(&r->bts[s], bs, base + i);
            }
            for (int i = 0; i < n_out; i++) r->out_idx[s * n_out + i] = s * k + (all ? i : k - 1);
            r->start[s] = s * k;
            r->ntok[s] = k;
            r->ctx[s] = base + k;
        }
        Batch b = {.n_tokens = S * k, .tokens = r->tok, .pos = r->pos, .seq = r->seq, .slot = r->slot,
                   .n_seqs = S, .seq_start = r->start, .seq_ntok = r->ntok, .ctx_len = r->ctx,
                   .block_table = r->table, .bt_stride = nb, .max_ctx = base + k,
                   .n_out = S * n_out, .out_idx = r->out_idx, .seq_group = r->group};
        if (S == 1) {
            forward_run(&r->f, &b, &r->kv, !logits ? NULL : all ? logits + (size_t)s0 * V : logits);
        } else {
            forward_run(&r->f, &b, &r->kv, logits ? r->rows : NULL);
            for (int s = 0; logits && s < S; s++) /* [S, n, V]: this chunk's rows of each sequence */
                memcpy(logits + ((size_t)s * n + s0) * V, r->rows + (size_t)s * k * V, (size_t)k * V * sizeof(float));
        }
        r->n_ctx += k;
    }
}
