/* forward: the top-level forward pass (transformers' GlmMoeDsaModel / Glm4MoeModel): embedding,
 * L decoder layers of pre-norm residual blocks, the final norm on the rows that produce logits, lm_head.
 *
 * Under several ranks (src/dist) each rank runs its shard: a pipeline stage runs its layers
 * over each micro-batch in turn, receiving the hidden state from the previous stage and
 * sending it on (the stages overlap on different micro-batches); tensor-parallel blocks end in
 * an all-reduce (glm4_moe.c, glm5.c, moe.c); the last stage's logits, gathered over the
 * vocabulary slices, go to rank 0. Rank 0 broadcasts each step's batch first, and the workers
 * (forward_worker) run the same forward_run. */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#include "../base/test_hooks.h"
#include "../base/util.h"
#include "mtp.h"

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* backend memory for the host array h: h itself on the cpu */
static void *twin(Backend *be, void *h, size_t bytes) { return be->host_memory ? h : be_alloc(be, bytes); }
static void twin_free(Backend *be, void *h, void *d)
{
    if (d != h) be_free(be, d);
    free(h);
}

/* --dp: the buffers of DpState (forward.h) */
static void dp_init(Forward *f)
{
    const ModelConfig *c = &f->m->cfg;
    Backend *be = f->be;
    DpState *x = &f->dp;
    int tp = f->dist->tp, dp = f->dist->dp;
    size_t P = (size_t)f->max_tokens * (c->n_experts_per_tok > 0 ? c->n_experts_per_tok : 1), D = c->hidden;
    x->on = 1;
    x->n_out = xcalloc(dp, sizeof(int));
    x->perm = xcalloc(f->max_out, sizeof(int));
    x->perm_d = twin(be, x->perm, (size_t)f->max_out * sizeof(int));
    int *id = xmalloc((size_t)f->max_out * sizeof(int));
    for (int i = 0; i < f->max_out; i++) id[i] = i;
    x->ident_d = be_alloc(be, (size_t)f->max_out * sizeof(int));
    be_to_device(be, x->ident_d, id, (size_t)f->max_out * sizeof(int));
    free(id);
    if (f->dist->rank == 0) x->stage = be_alloc(be, (size_t)f->max_out * c->vocab * sizeof(float));
    x->idx = xmalloc(P * sizeof(int));
    x->wts = xmalloc(P * sizeof(float));
    x->pos = xmalloc(P * sizeof(int));
    x->rows = xmalloc(P * sizeof(int));
    x->rows_d = twin(be, x->rows, P * sizeof(int));
    x->meta = xmalloc(2 * P * sizeof(float));
    x->meta_d = twin(be, x->meta, 2 * P * sizeof(float));
    x->rmeta = xmalloc(2 * P * sizeof(float));
    x->rmeta_d = twin(be, x->rmeta, 2 * P * sizeof(float));
    x->eidx = xmalloc(P * sizeof(int));
    x->eidx_d = twin(be, x->eidx, P * sizeof(int));
    x->ew = xmalloc(P * sizeof(float));
    x->ew_d = twin(be, x->ew, P * sizeof(float));
    x->cnt = xcalloc(tp, sizeof(int));
    x->cnt_d = twin(be, x->cnt, tp * sizeof(int));
    x->rcnt = xcalloc(tp, sizeof(int));
    x->rcnt_d = twin(be, x->rcnt, tp * sizeof(int));
    x->fill = xcalloc(tp, sizeof(int));
    x->sbytes = xcalloc(tp, sizeof(size_t));
    x->rbytes = xcalloc(tp, sizeof(size_t));
    if (c->n_experts > 0) {
        x->xs = be_alloc(be, P * D * sizeof(float));
        x->xr = be_alloc(be, P * D * sizeof(float));
        x->y = be_alloc(be, P * D * sizeof(float));
    }
}

static void dp_free(Forward *f)
{
    DpState *x = &f->dp;
    Backend *be = f->be;
    if (!x->on) return;
    free(x->sb_buf);
    free(x->n_out);
    twin_free(be, x->perm, x->perm_d);
    be_free(be, x->ident_d);
    be_free(be, x->stage);
    free(x->idx);
    free(x->wts);
    free(x->pos);
    twin_free(be, x->rows, x->rows_d);
    twin_free(be, x->meta, x->meta_d);
    twin_free(be, x->rmeta, x->rmeta_d);
    twin_free(be, x->eidx, x->eidx_d);
    twin_free(be, x->ew, x->ew_d);
    twin_free(be, x->cnt, x->cnt_d);
    twin_free(be, x->rcnt, x->rcnt_d);
    free(x->fill);
    free(x->sbytes);
    free(x->rbytes);
    be_free(be, x->xs);
    be_free(be, x->xr);
    be_free(be, x->y);
    *x = (DpState){0};
}

void forward_init(Forward *f, const Model *m, Backend *be, int max_tokens, int max_out, int max_seqs,
                  int max_blocks)
{
    const ModelConfig *c = &m->cfg;
    *f = (Forward){.m = m, .be = be, .max_tokens = max_tokens, .max_out = max_out, .max_seqs = max_seqs,
                   .max_blocks = max_blocks};
    f->seq_cap = imax(max_seqs, max_out);
    if (!be->host_memory) { /* the batch's arrays in one block, uploaded in one copy (forward_upload) */
        f->up_cap = 7 * (size_t)imax(max_tokens, f->seq_cap) + max_out + (size_t)f->seq_cap * max_blocks;
        f->up_dev = be_alloc(be, f->up_cap * sizeof(int));
        f->up_host = xmalloc(f->up_cap * sizeof(int));
    }
    size_t T = max_tokens, F4 = sizeof(float);
    int D = c->hidden, H = c->n_heads;
    int qdim = H * imax(c->head_dim, c->qk_nope_dim + c->qk_rope_dim);
    int kdim = imax(c->n_kv_heads * c->head_dim, c->kv_lora_rank + c->qk_rope_dim);
    int odim = H * imax(c->head_dim, c->v_head_dim);
    int fdim = imax(c->intermediate, c->moe_intermediate * imax(c->n_shared_experts, 1));
    int half = c->rotary_dim / 2;
    float *inv = xmalloc(half * sizeof(float));
    rope_init(c, inv, &f->rope_scale);
    f->inv_freq = be_alloc(be, half * F4);
    be_to_device(be, f->inv_freq, inv, half * F4);
    free(inv);
    f->h = be_alloc(be, T * D * F4);
    f->a = be_alloc(be, T * D * F4);
    f->qa = be_alloc(be, T * imax(c->q_lora_rank, 1) * F4);
    f->q = be_alloc(be, T * qdim * F4);
    f->k = be_alloc(be, T * kdim * F4);
    f->v = be_alloc(be, T * imax(c->n_kv_heads * c->head_dim, 1) * F4);
    f->attn = be_alloc(be, T * odim * F4);
    if (c->index_n_heads > 0) {
        f->iq = be_alloc(be, T * c->index_n_heads * c->index_head_dim * F4);
        f->ik = be_alloc(be, T * c->index_head_dim * F4);
        f->iw = be_alloc(be, T * c->index_n_heads * F4);
        f->topk = be_alloc(be, T * c->index_topk * sizeof(int));
    }
    int fused_qkv = 0, fused_gu = 0; /* load.c fuse: buffers for the fused GEMMs' outputs where a layer has one */
    for (int l = c->layer_begin; l < c->layer_end + c->mtp_loaded; l++) { /* the MTP layer's too (mtp.c) */
        const LayerWeights *w = &m->layers[l];
        fused_qkv |= w->wqkv_a.rows > 0;
        fused_gu |= w->w_gate_up.rows > 0 || w->sh_gate_up.rows > 0;
    }
    if (fused_qkv) f->qkva = be_alloc(be, T * (c->q_lora_rank + kdim) * F4);
    f->g = be_alloc(be, T * (fused_gu ? 2 : 1) * fdim * F4); /* fused: gate and up both */
    f->u = be_alloc(be, T * fdim * F4);
    f->ffn = be_alloc(be, T * D * F4);
    f->ffn2 = be_alloc(be, T * D * F4);
    if (c->n_experts > 0) {
        f->rlogits = be_alloc(be, T * c->n_experts * F4);
        f->ridx = be_alloc(be, T * c->n_experts_per_tok * sizeof(int));
        f->rwts = be_alloc(be, T * c->n_experts_per_tok * F4);
    }
    if (config_is_mla(c)) mla_expand_init(&f->mla, be, c, max_tokens, be_mla_piece(c));
    f->out_h = be_alloc(be, (size_t)max_out * D * F4);
    f->logits = be_alloc(be, (size_t)max_out * c->vocab * F4);
    f->dist = dist_get();
    if (f->dist) {
        f->rb_seq = xmalloc(T * sizeof(int));
        f->rb_start = xmalloc((size_t)f->seq_cap * sizeof(int));
        f->rb_out = xmalloc((size_t)max_out * sizeof(int));
        if (c->vocab_local != c->vocab) {
            size_t tp = c->tp;
            f->gidx = xmalloc((size_t)max_out * tp * sizeof(int));
            f->gidx_d = be->host_memory ? f->gidx : be_alloc(be, (size_t)max_out * tp * sizeof(int));
            f->lm_part = be_alloc(be, (size_t)max_out * c->vocab_local * F4);
            f->lm_gather = be_alloc(be, tp * max_out * c->vocab_local * F4);
        }
        if (f->dist->dp > 1) dp_init(f);
    }
}

void forward_free(Forward *f)
{
    if (!f->be) return;
    for (int g = 0; g < f->n_graphs; g++) f->be->ops->graph_free(f->be, f->graph[g].graph);
    Batch *p = &f->pad;
    void *pads[] = {p->tokens, p->pos, p->seq, p->slot, p->seq_start, p->seq_ntok, p->ctx_len, p->out_idx, f->pad_table};
    for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) free(pads[i]);
    be_free(f->be, f->up_dev);
    free(f->up_host);
    void *bufs[] = {f->inv_freq, f->h, f->a, f->qa, f->qkva, f->q, f->k, f->v, f->attn, f->iq, f->ik, f->iw, f->topk,
                    f->g, f->u, f->ffn, f->ffn2, f->rlogits, f->ridx, f->rwts, f->out_h, f->logits, f->lm_part,
                    f->lm_gather, f->gidx_d != f->gidx ? f->gidx_d : NULL};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(f->be, bufs[i]);
    mla_expand_free(&f->mla, f->be);
    dp_free(f);
    free(f->rb_seq);
    free(f->rb_start);
    free(f->rb_out);
    free(f->gidx);
    if (f->shared) {
        DistMsg msg = {.op = DIST_MSG_FREE};
        dist_bcast_host(f->dist, &msg, sizeof msg);
    }
    *f = (Forward){0};
}

/* The batch with its arrays in backend memory: the host batch itself on the cpu backend, else
 * copies in the fixed device block, made on the host and sent in one copy (one wait rather than
 * one an array). The arrays lie one after another, each given room for the batch's tokens
 * (logits rows for out_idx), the block table last: a padded batch of a graph's sizes puts them
 * at the addresses its capture read. The lm_head gather rows go with it. */
static const Batch *forward_upload(Forward *f, const Batch *b)
{
    Backend *be = f->be;
    if (f->gidx && b->n_out && f->gidx_d != f->gidx)
        be_to_device(be, f->gidx_d, f->gidx, (size_t)b->n_out * f->m->cfg.tp * sizeof(int));
    if (be->host_memory) return b;
    CHECK(b->n_seqs <= f->seq_cap && b->bt_stride <= f->max_blocks, "forward: %d sequences x %d blocks, limit %d x %d",
          b->n_seqs, b->bt_stride, f->seq_cap, f->max_blocks);
    Batch *d = &f->dbuf;
    int T = b->n_tokens, S = b->n_seqs, O = b->n_out, room = imax(T, S);
    size_t n = 0;
    int *h = f->up_host, *dv = f->up_dev;
#define PUT(field, count, space)                                                                                       \
    do {                                                                                                               \
        memcpy(h + n, b->field, (size_t)(count) * sizeof(int));                                                        \
        d->field = dv + n;                                                                                             \
        n += (size_t)(space);                                                                                          \
    } while (0)
    PUT(tokens, T, room);
    PUT(pos, T, room);
    PUT(seq, T, room);
    PUT(slot, T, room);
    PUT(seq_start, S, room);
    PUT(seq_ntok, S, room);
    PUT(ctx_len, S, room);
    PUT(out_idx, O, O);
    PUT(block_table, (size_t)S * b->bt_stride, (size_t)S * b->bt_stride);
#undef PUT
    CHECK(n <= f->up_cap, "forward: a batch of %zu ints, room for %zu", n, f->up_cap);
    be_to_device(be, dv, h, n * sizeof(int));
    d->n_tokens = T;
    d->n_seqs = S;
    d->n_out = O;
    d->bt_stride = b->bt_stride;
    d->max_ctx = 0;
    for (int s = 0; s < S; s++) d->max_ctx = b->ctx_len[s] > d->max_ctx ? b->ctx_len[s] : d->max_ctx;
    return d;
}

/* vocabulary slices: the gather rows of logits rows o0 .. o0 + n (one micro-batch): row i*tp + r
 * of its logits is row r*n + i of the all-gathered slices */
static void gather_order(Forward *f, int o0, int n)
{
    int tp = f->m->cfg.tp;
    for (int k = 0; k < n; k++)
        for (int r = 0; r < tp; r++) f->gidx[(size_t)o0 * tp + k * tp + r] = r * n + k;
}

/* sequences in order, each's tokens contiguous, logits rows in token order: splittable */
static int splittable(const Batch *b)
{
    int t = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->seq_start[s] != t) return 0;
        t += b->seq_ntok[s];
    }
    for (int o = 1; o < b->n_out; o++)
        if (b->out_idx[o] <= b->out_idx[o - 1]) return 0;
    return t == b->n_tokens;
}

/* The micro-batches of b (pipeline stages: up to --pp-microbatches, about equal in tokens,
 * whole sequences) in f->mb, and the batch to run: b, or its copy f->rb whose seq, seq_start and
 * out_idx count from their micro-batch's first sequence, token and row. Every rank splits the
 * same batch the same way. Also fills the lm_head gather rows of each micro-batch. */
static const Batch *forward_split(Forward *f, const Batch *b)
{
    Dist *d = f->dist;
    f->n_mb = 1;
    f->mb[0] = (MicroBatch){0, b->n_seqs, 0, b->n_tokens, 0, b->n_out};
    int want = d && d->pp > 1 ? d->microbatches : 1;
    if (want > b->n_seqs) want = b->n_seqs;
    if (want > FORWARD_MAX_MB) want = FORWARD_MAX_MB;
    const Batch *run = b;
    if (want > 1 && splittable(b)) {
        int n = 0, s = 0, o = 0;
        while (s < b->n_seqs) {
            MicroBatch *m = &f->mb[n];
            m->s0 = s;
            m->t0 = b->seq_start[s];
            /* tokens still to place, shared by the micro-batches still to make */
            int left = b->n_tokens - m->t0, target = (left + (want - n) - 1) / (want - n);
            int tok = 0;
            while (s < b->n_seqs && (tok == 0 || tok + b->seq_ntok[s] <= target) &&
                   (b->n_seqs - s > want - n - 1 || tok == 0)) {
                tok += b->seq_ntok[s];
                s++;
            }
            m->s1 = s;
            m->t1 = m->t0 + tok;
            m->o0 = o;
            while (o < b->n_out && b->out_idx[o] < m->t1) o++;
            m->o1 = o;
            n++;
        }
        f->n_mb = n;
        Batch *r = &f->rb;
        *r = *b;
        for (int i = 0; i < n; i++) {
            const MicroBatch *m = &f->mb[i];
            for (int t = m->t0; t < m->t1; t++) f->rb_seq[t] = b->seq[t] - m->s0;
            for (int q = m->s0; q < m->s1; q++) f->rb_start[q] = b->seq_start[q] - m->t0;
            for (int q = m->o0; q < m->o1; q++) f->rb_out[q] = b->out_idx[q] - m->t0;
        }
        r->seq = f->rb_seq;
        r->seq_start = f->rb_start;
        r->out_idx = f->rb_out;
        run = r;
    }
    if (f->gidx)
        for (int i = 0; i < f->n_mb; i++) gather_order(f, f->mb[i].o0, f->mb[i].o1 - f->mb[i].o0);
    return run;
}

/* the micro-batch m of b as a batch of its own (pointers into b's arrays) */
static void mb_view(const Batch *b, const MicroBatch *m, Batch *v)
{
    *v = *b;
    v->n_tokens = m->t1 - m->t0;
    v->tokens = b->tokens + m->t0;
    v->pos = b->pos + m->t0;
    v->seq = b->seq + m->t0;
    v->slot = b->slot + m->t0;
    v->n_seqs = m->s1 - m->s0;
    v->seq_start = b->seq_start + m->s0;
    v->seq_ntok = b->seq_ntok + m->s0;
    v->ctx_len = b->ctx_len + m->s0;
    v->block_table = b->block_table + (size_t)m->s0 * b->bt_stride;
    v->n_out = m->o1 - m->o0;
    v->out_idx = b->out_idx + m->o0;
}

/* final norm and lm_head on the logits rows of the micro-batch, into logits rows o0.. */
static void forward_head(Forward *f, const Batch *hb, const Batch *db, int o0)
{
    const Model *m = f->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = f->be;
    int n = hb->n_out, D = c->hidden, V = c->vocab;
    be_get_rows(be, f->out_h, f->h, D, db->out_idx, n, D);
    be_rmsnorm(be, f->out_h, D, f->out_h, D, m->final_norm, n, D, c->rms_eps);
    float *dst = f->logits + (size_t)o0 * V;
    if (c->vocab_local == V) {
        be_matmul(be, OP_GEMM_LM_HEAD, dst, V, f->out_h, D, n, &m->lm_head, NULL);
        return;
    }
    /* vocabulary slices: each rank's [n, V/tp], gathered [tp, n, V/tp], put in row order */
    int Vl = c->vocab_local;
    be_matmul(be, OP_GEMM_LM_HEAD, f->lm_part, Vl, f->out_h, D, n, &m->lm_head, NULL);
    dist_all_gather(f->dist, be, f->lm_gather, f->lm_part, (size_t)n * Vl);
    be_get_rows(be, dst, f->lm_gather, Vl, f->gidx_d + (size_t)o0 * c->tp, n * c->tp, Vl);
}

/* embedding (or the previous stage's hidden state), this stage's layers, then the next stage
 * or the final norm and lm_head, over each micro-batch of f->hb / f->db */
static void forward_body(Forward *f, KVCache *kv)
{
    const Model *m = f->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = f->be;
    Dist *d = f->dist;
    const Batch *hb = f->hb, *db = f->db;
    float *h0 = f->h;
    int *topk0 = f->topk;
    int D = c->hidden, Ki = c->index_topk;
    int first = c->layer_begin == 0, last = c->layer_end == c->n_layers;
    int prev = first ? -1 : dist_rank_of(d, c->pp_rank - 1, d->tp_rank);
    int next = last ? -1 : dist_rank_of(d, c->pp_rank + 1, d->tp_rank);
    /* a stage that starts on a "shared" indexer layer needs the previous stage's selection */
    int topk_in = !first && topk0 && c->layer_indexer[c->layer_begin] == INDEXER_SHARED;
    int topk_out = !last && topk0 && c->layer_indexer[c->layer_end] == INDEXER_SHARED;
    for (int i = 0; i < f->n_mb; i++) {
        const MicroBatch *mb = &f->mb[i];
        Batch hv, dv;
        mb_view(hb, mb, &hv);
        mb_view(db, mb, &dv);
        f->hb = &hv;
        f->db = &dv;
        /* each micro-batch keeps its own rows of h and topk: what is sent stays intact */
        f->h = h0 + (size_t)mb->t0 * D;
        if (topk0) f->topk = topk0 + (size_t)mb->t0 * Ki;
        int T = hv.n_tokens;
        /* --dp: a group without sequences this step still joins every MoE layer's exchange */
        if (!T) {
        } else if (first) {
            be_embed(be, f->h, dv.tokens, T, &m->embed);
        } else {
            dist_recv(d, be, f->h, (size_t)T * D * sizeof(float), prev);
            if (topk_in) dist_recv(d, be, f->topk, (size_t)T * Ki * sizeof(int), prev);
        }
        for (int l = c->layer_begin; l < c->layer_end; l++) {
            if (!T) {
            } else if (config_is_mla(c)) {
                glm5_attention(f, l, kv);
            } else {
                glm4_moe_attention(f, l, kv);
            }
            moe_ffn(f, l);
        }
        if (!T) {
        } else if (!last) {
            dist_send(d, be, f->h, (size_t)T * D * sizeof(float), next);
            if (topk_out) dist_send(d, be, f->topk, (size_t)T * Ki * sizeof(int), next);
        } else if (hv.n_out) {
            forward_head(f, &hv, &dv, mb->o0);
        }
    }
    f->h = h0;
    f->topk = topk0;
    f->hb = hb;
    f->db = db;
    /* the logits to rank 0 (the first stage) */
    if (d && d->pp > 1 && d->dp == 1 && hb->n_out) {
        size_t bytes = (size_t)hb->n_out * c->vocab * sizeof(float);
        if (last && c->tp_rank == 0) dist_send(d, be, f->logits, bytes, 0);
        else if (d->rank == 0) dist_recv(d, be, f->logits, bytes, dist_rank_of(d, d->pp - 1, 0));
    }
}

void forward_enable_graphs(Forward *f, int max_ctx)
{
    Backend *be = f->be;
    int pad_only = !be->ops->graph_begin && test_hook_graph_pad();
    if ((!be->ops->graph_begin || be->host_memory) && !pad_only) return;
    if (f->dp.on) { /* the MoE exchange sizes its messages on the host each layer: not capturable (yet) */
        log_info("forward: --dp runs decode steps without graphs");
        return;
    }
    if (f->shared) {
        DistMsg msg = {.op = DIST_MSG_GRAPHS, .v = {max_ctx}};
        dist_bcast_host(f->dist, &msg, sizeof msg);
    }
    f->graph_ctx = max_ctx;
    f->graph_pad_only = pad_only;
    if (be->ops->reserve) be->ops->reserve(be, &f->m->cfg, f->max_tokens, f->max_out, max_ctx);
    int n = imax(f->max_tokens, f->seq_cap);
    Batch *p = &f->pad;
    int **arr[] = {&p->tokens, &p->pos, &p->seq, &p->slot, &p->seq_start, &p->seq_ntok, &p->ctx_len, &p->out_idx};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) *arr[i] = xcalloc(n, sizeof(int));
    f->pad_table = xcalloc((size_t)f->seq_cap * f->max_blocks, sizeof(int));
}

/* the graph size for n: the next power of two, at most lim (>= n) */
static int graph_size(int n, int lim)
{
    int p = 1;
    while (p < n) p *= 2;
    return p < lim ? p : lim;
}

int forward_graph_fits(const Forward *f, const Batch *b)
{
    if (!f->graph_ctx || f->be->hook || f->eager_once) return 0;
    int T = b->n_tokens, q = b->verify_len > 1 ? b->verify_len : 1;
    if (T <= 0 || T > f->max_tokens || T > f->seq_cap || b->n_out > f->max_out || b->n_seqs > T) return 0;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seq_ntok[s] < 1 || b->seq_ntok[s] > q || b->ctx_len[s] > f->graph_ctx) return 0;
    return 1;
}

const Batch *forward_graph_pad(Forward *f, const Batch *b)
{
    int T = b->n_tokens, S = b->n_seqs, O = b->n_out, nb = f->max_blocks;
    int Tp = graph_size(T, imin(f->max_tokens, f->seq_cap)), Op = graph_size(O, f->max_out), Sp = S + Tp - T;
    Batch *p = &f->pad;
    memcpy(p->tokens, b->tokens, T * sizeof(int));
    memcpy(p->pos, b->pos, T * sizeof(int));
    memcpy(p->seq, b->seq, T * sizeof(int));
    memcpy(p->slot, b->slot, T * sizeof(int));
    memcpy(p->seq_start, b->seq_start, S * sizeof(int));
    memcpy(p->seq_ntok, b->seq_ntok, S * sizeof(int));
    memcpy(p->ctx_len, b->ctx_len, S * sizeof(int));
    memcpy(p->out_idx, b->out_idx, O * sizeof(int));
    for (int t = T; t < Tp; t++) { /* padding token t: sequence S + t - T */
        int s = S + t - T;
        p->tokens[t] = p->pos[t] = 0;
        p->seq[t] = s;
        p->slot[t] = -1;
        p->seq_start[s] = t;
        p->seq_ntok[s] = 1;
        p->ctx_len[s] = 1;
    }
    for (int o = O; o < Op; o++) p->out_idx[o] = T + o - O < Tp ? T + o - O : Tp - 1;
    /* block-table rows at the graphs' width: the real ones; padding rows copy row 0 */
    int w = b->bt_stride < nb ? b->bt_stride : nb;
    for (int s = 0; s < Sp; s++)
        memcpy(f->pad_table + (size_t)s * nb, b->block_table + (size_t)(s < S ? s : 0) * b->bt_stride, w * sizeof(int));
    p->block_table = f->pad_table;
    p->bt_stride = nb;
    p->n_tokens = Tp;
    p->n_seqs = Sp;
    p->n_out = Op;
    p->max_ctx = f->graph_ctx; /* baked into the graph: the indexer's score rows */
    p->verify_len = b->verify_len;
    p->seq_group = NULL;
    return p;
}

void forward_graph_run(Forward *f, int kind, KVCache *kv, void (*body)(Forward *f, KVCache *kv, void *ctx), void *ctx)
{
    Backend *be = f->be;
    int T = f->hb->n_tokens, O = f->hb->n_out;
    f->dbuf.max_ctx = f->graph_ctx; /* the launches are sized for the graphs' context */
    if (f->graph_pad_only) { /* the padded batch op by op (a test of the padding) */
        body(f, kv, ctx);
        f->graph_replays[kind]++;
        return;
    }
    int g = 0;
    while (g < f->n_graphs && (f->graph[g].kind != kind || f->graph[g].T != T || f->graph[g].O != O)) g++;
    if (g == f->n_graphs && g == FORWARD_MAX_GRAPHS) { /* every slot taken: this size runs op by op */
        static int said;
        if (!said++) log_info("forward: %d graphs captured; further sizes run without one", FORWARD_MAX_GRAPHS);
        body(f, kv, ctx);
        return;
    }
    for (;;) {
        ForwardGraph *G = &f->graph[g];
        if (g == f->n_graphs) {
            OpStat before[OP_COUNT];
            memcpy(before, be->stats, sizeof before);
            be->ops->graph_begin(be);
            body(f, kv, ctx);
            *G = (ForwardGraph){.kind = kind, .T = T, .O = O, .graph = be->ops->graph_end(be)};
            for (int i = 0; i < OP_COUNT; i++) {
                G->stats[i].flops = be->stats[i].flops - before[i].flops;
                G->stats[i].bytes = be->stats[i].bytes - before[i].bytes;
                G->stats[i].calls = be->stats[i].calls - before[i].calls;
            }
            memcpy(be->stats, before, sizeof before);
            f->n_graphs++;
        }
        if (be->ops->graph_launch(be, G->graph) == 0) break;
        /* a scratch buffer was replaced since the capture (an eager step needed more): every
         * graph holds the old address; capture again */
        log_info("forward: scratch grew; recapturing the graphs");
        for (int k = 0; k < f->n_graphs; k++) be->ops->graph_free(be, f->graph[k].graph);
        f->n_graphs = g = 0;
    }
    for (int i = 0; i < OP_COUNT; i++) {
        be->stats[i].flops += f->graph[g].stats[i].flops;
        be->stats[i].bytes += f->graph[g].stats[i].bytes;
        be->stats[i].calls += f->graph[g].stats[i].calls;
    }
    f->graph_replays[kind]++;
}

static void forward_body_cb(Forward *f, KVCache *kv, void *ctx)
{
    (void)ctx;
    forward_body(f, kv);
}

/* rank 0: the pass's batch to every worker (block-table rows cut to the blocks in use): kind
 * GRAPH_FORWARD, a step of the model; else a pass of the MTP layer (mtp_run) and its hidden rows */
void forward_send_pass(Forward *f, const Batch *b, const KVCache *kv, int kind, const int *rows)
{
    int T = b->n_tokens, S = b->n_seqs, O = b->n_out, bs = kv->block_size, dp = f->dp.on;
    int nr = kind == GRAPH_FORWARD ? 0 : T;
    size_t n = 4 * (size_t)T + (3 + dp) * (size_t)S + O + nr;
    for (int s = 0; s < S; s++) {
        int nb = (b->ctx_len[s] + bs - 1) / bs;
        n += nb < b->bt_stride ? nb : b->bt_stride;
    }
    int *buf = xmalloc(n * sizeof(int)), *p = buf;
    const int *arr[] = {b->tokens, b->pos, b->seq, b->slot};
    for (int i = 0; i < 4; i++, p += T) memcpy(p, arr[i], T * sizeof(int));
    const int *sarr[] = {b->seq_start, b->seq_ntok, b->ctx_len};
    for (int i = 0; i < 3; i++, p += S) memcpy(p, sarr[i], S * sizeof(int));
    memcpy(p, b->out_idx, O * sizeof(int));
    p += O;
    if (dp) {
        for (int s = 0; s < S; s++) p[s] = b->seq_group ? b->seq_group[s] : 0;
        p += S;
    }
    memcpy(p, rows, nr * sizeof(int));
    p += nr;
    for (int s = 0; s < S; s++) {
        int nb = (b->ctx_len[s] + bs - 1) / bs;
        if (nb > b->bt_stride) nb = b->bt_stride;
        memcpy(p, b->block_table + (size_t)s * b->bt_stride, nb * sizeof(int));
        p += nb;
    }
    DistMsg msg = {.op = DIST_MSG_RUN,
                   .v = {T, S, O, b->bt_stride, (int)n, f->be->hook != NULL, b->verify_len, kind}};
    dist_bcast_host(f->dist, &msg, sizeof msg);
    dist_bcast_host(f->dist, buf, n * sizeof(int));
    free(buf);
}

/* --dp: the sequences of b on this rank's group, their tokens and logits rows, renumbered, in
 * f->dp.sb (an empty batch when the group has none); and each group's logits rows in f->dp.n_out */
static const Batch *dp_part(Forward *f, const Batch *b)
{
    DpState *x = &f->dp;
    Dist *d = f->dist;
    int T = b->n_tokens, S = b->n_seqs, O = b->n_out, st = b->bt_stride, g = d->dp_rank;
    size_t need = 6 * (size_t)T + 1 + 5 * (size_t)S + (size_t)S * st + O;
    if (need > x->sb_cap) x->sb_buf = xrealloc(x->sb_buf, (x->sb_cap = need) * sizeof(int));
    int *p = x->sb_buf, *lseq = p, *pre = lseq + S; /* pre[t]: the group's tokens before token t */
    p = pre + T + 1;
    Batch *r = &x->sb;
    *r = (Batch){.bt_stride = st, .verify_len = b->verify_len};
    r->tokens = p, p += T;
    r->pos = p, p += T;
    r->seq = p, p += T;
    r->slot = p, p += T;
    r->seq_start = p, p += S;
    r->seq_ntok = p, p += S;
    r->ctx_len = p, p += S;
    r->block_table = p, p += (size_t)S * st;
    r->out_idx = p;
#define GROUP(s) (b->seq_group ? b->seq_group[s] : 0)
    for (int s = 0; s < S; s++) {
        int gs = GROUP(s);
        CHECK(gs >= 0 && gs < d->dp, "forward: sequence %d on group %d of %d", s, gs, d->dp);
        lseq[s] = gs == g ? r->n_seqs++ : -1;
    }
    for (int t = 0; t < T; t++) {
        pre[t] = r->n_tokens;
        int ls = lseq[b->seq[t]];
        if (ls < 0) continue;
        int k = r->n_tokens++;
        r->tokens[k] = b->tokens[t];
        r->pos[k] = b->pos[t];
        r->seq[k] = ls;
        r->slot[k] = b->slot[t];
    }
    pre[T] = r->n_tokens;
    for (int s = 0; s < S; s++) {
        int ls = lseq[s];
        if (ls < 0) continue;
        r->seq_start[ls] = pre[b->seq_start[s]];
        r->seq_ntok[ls] = b->seq_ntok[s];
        r->ctx_len[ls] = b->ctx_len[s];
        if (b->ctx_len[s] > r->max_ctx) r->max_ctx = b->ctx_len[s];
        memcpy(r->block_table + (size_t)ls * st, b->block_table + (size_t)s * st, st * sizeof(int));
    }
    memset(x->n_out, 0, d->dp * sizeof(int));
    for (int o = 0; o < O; o++) {
        int s = b->seq[b->out_idx[o]];
        x->n_out[GROUP(s)]++;
        if (lseq[s] >= 0) r->out_idx[r->n_out++] = pre[b->out_idx[o]];
    }
#undef GROUP
    return r;
}

/* --dp: every group's logits rows to rank 0's f->logits, in b's order: each group's first rank
 * on the last stage sends its rows; rank 0 stages them group after group, then puts them in order */
static void dp_logits(Forward *f, const Batch *b)
{
    DpState *x = &f->dp;
    Dist *d = f->dist;
    Backend *be = f->be;
    const ModelConfig *c = &f->m->cfg;
    int O = b->n_out, V = c->vocab, last = c->layer_end == c->n_layers;
    size_t row = (size_t)V * sizeof(float);
    if (!O) return;
    if (last && d->atp_rank == 0 && d->rank != 0 && x->n_out[d->dp_rank])
        dist_send(d, be, f->logits, x->n_out[d->dp_rank] * row, 0);
    if (d->rank != 0) return;
    int off[1024], o0 = 0;
    CHECK(d->dp <= 1024, "more than 1024 groups");
    for (int g = 0; g < d->dp; g++) {
        int n = x->n_out[g], src = dist_rank_of(d, d->pp - 1, g * d->atp);
        off[g] = o0;
        if (!n) continue;
        if (src == 0) be_get_rows(be, x->stage + (size_t)o0 * V, f->logits, V, x->ident_d, n, V);
        else dist_recv(d, be, x->stage + (size_t)o0 * V, n * row, src);
        o0 += n;
    }
    for (int o = 0; o < O; o++) {
        int s = b->seq[b->out_idx[o]], g = b->seq_group ? b->seq_group[s] : 0;
        x->perm[o] = off[g]++;
    }
    if (x->perm_d != x->perm) be_to_device(be, x->perm_d, x->perm, (size_t)O * sizeof(int));
    be_get_rows(be, f->logits, x->stage, V, x->perm_d, O, V);
}

void forward_run(Forward *f, const Batch *b, KVCache *kv, float *logits_out)
{
    const ModelConfig *c = &f->m->cfg;
    Backend *be = f->be;
    CHECK(b->n_tokens > 0 && b->n_tokens <= f->max_tokens, "forward: %d tokens, limit %d", b->n_tokens, f->max_tokens);
    CHECK(b->n_out >= 0 && b->n_out <= f->max_out, "forward: %d logits rows, limit %d", b->n_out, f->max_out);
    if (f->shared) forward_send_pass(f, b, kv, GRAPH_FORWARD, NULL);
    dist_fault_point(f->dist);
    /* a profiled step runs op by op, on every rank (the collectives must match) */
    if (forward_graph_fits(f, b)) {
        f->hb = forward_split(f, forward_graph_pad(f, b));
        f->db = forward_upload(f, f->hb);
        forward_graph_run(f, GRAPH_FORWARD, kv, forward_body_cb, NULL);
    } else {
        f->hb = forward_split(f, f->dp.on ? dp_part(f, b) : b);
        f->db = forward_upload(f, f->hb);
        forward_body(f, kv);
        if (f->dp.on) dp_logits(f, b);
    }
    f->eager_once = 0;
    dist_flush(f->dist, be);
    if (logits_out && b->n_out)
        be_to_host(be, logits_out, f->logits, (size_t)b->n_out * c->vocab * sizeof(float));
}

void forward_share(Forward *f, const KVCache *kv)
{
    Dist *d = f->dist;
    if (!d || d->world == 1 || d->rank != 0) return;
    DistMsg msg = {.op = DIST_MSG_INIT,
                   .v = {f->max_tokens, f->max_out, f->max_seqs, f->max_blocks, kv->block_size, kv->n_blocks}};
    dist_bcast_host(d, &msg, sizeof msg);
    f->shared = 1;
}

/* a rank's answer to DIST_MSG_KV_FIT: blocks, capped to what an int holds */
static int64_t kv_fit_here(const ModelConfig *c, Backend *be, int block_size, double fraction)
{
    double fit = (double)be_mem_free(be) * fraction / (double)kv_cache_block_bytes(c, block_size);
    return fit > 2147483647.0 ? 2147483647 : (int64_t)fit;
}

double forward_kv_fit(const ModelConfig *c, Backend *be, int block_size, double fraction, int *rank)
{
    double best = (double)kv_fit_here(c, be, block_size, fraction);
    *rank = 0;
    Dist *d = dist_get();
    if (!d || d->world == 1 || dist_simulated(d)) return best; /* simulated ranks: rank 0's shard stands for all */
    CHECK(d->rank == 0, "forward_kv_fit on rank %d", d->rank);
    DistMsg msg = {.op = DIST_MSG_KV_FIT, .v = {block_size, (int)(fraction * 1e6 + 0.5)}};
    dist_bcast_host(d, &msg, sizeof msg);
    int64_t *dv = be_alloc(be, sizeof(int64_t)); /* backend memory: NCCL moves device buffers */
    for (int r = 1; r < d->world; r++) {
        int64_t v = 0;
        dist_recv(d, be, dv, sizeof v, r);
        dist_flush(d, be);
        be_to_host(be, &v, dv, sizeof v);
        if ((double)v < best) best = (double)v, *rank = r;
    }
    be_free(be, dv);
    return best;
}

void forward_worker(const Model *m, Backend *be)
{
    Dist *d = dist_get();
    CHECK(d && d->rank > 0, "forward_worker on rank 0");
    if (be->ops->bind_thread) be->ops->bind_thread(be);
    Forward f = {0};
    KVCache kv = {0};
    Mtp mtp = {0};             /* speculative decoding: the MTP layer's passes, made at the first */
    int live = 0, *buf = NULL, *table = NULL, *ids = NULL, ids_cap = 0;
    size_t cap = 0;
    for (;;) {
        DistMsg msg;
        dist_bcast_host(d, &msg, sizeof msg);
        switch (msg.op) {
        case DIST_MSG_INIT: {
            CHECK(!live, "worker: a second Forward while one is live");
            /* rank 0 sized the pool to fit every rank (DIST_MSG_KV_FIT), unless --num-kv-blocks
             * gave it: a rank that cannot hold it says so here rather than failing inside an
             * allocation */
            size_t per = kv_cache_block_bytes(&m->cfg, msg.v[4]), avail = be_mem_free(be);
            if ((double)msg.v[5] * per > (double)avail)
                fatal("rank %d (layers %d..%d): the KV cache of %lld blocks needs %.2f GiB, %.2f GiB is free here; "
                      "give --num-kv-blocks %lld or fewer, or a lower --kv-fraction", d->rank, m->cfg.layer_begin,
                      m->cfg.layer_end - 1, (long long)msg.v[5], (double)msg.v[5] * per / 1073741824.0,
                      avail / 1073741824.0, (long long)(0.9 * avail / per));
            kv_cache_init(&kv, &m->cfg, be, msg.v[4], msg.v[5]);
            forward_init(&f, m, be, msg.v[0], msg.v[1], msg.v[2], msg.v[3]);
            table = xcalloc((size_t)msg.v[2] * msg.v[3], sizeof(int));
            live = 1;
            break;
        }
        case DIST_MSG_KV_FIT: { /* rank 0 sizes the pool to the rank that holds the fewest blocks */
            int64_t v = kv_fit_here(&m->cfg, be, msg.v[0], msg.v[1] / 1e6), *dv = be_alloc(be, sizeof v);
            be_to_device(be, dv, &v, sizeof v);
            dist_send(d, be, dv, sizeof v, 0);
            dist_flush(d, be);
            be_free(be, dv);
            break;
        }
        case DIST_MSG_GRAPHS:
            CHECK(live, "worker: graphs without a Forward");
            forward_enable_graphs(&f, msg.v[0]);
            break;
        case DIST_MSG_RUN: {
            CHECK(live, "worker: a step without a Forward");
            int T = msg.v[0], S = msg.v[1], O = msg.v[2], stride = msg.v[3];
            size_t n = (size_t)msg.v[4];
            if (n > cap) buf = xrealloc(buf, (cap = n) * sizeof(int));
            dist_bcast_host(d, buf, n * sizeof(int));
            Batch b = {.n_tokens = T, .tokens = buf, .pos = buf + T, .seq = buf + 2 * T, .slot = buf + 3 * T,
                       .n_seqs = S, .seq_start = buf + 4 * T, .seq_ntok = buf + 4 * T + S, .ctx_len = buf + 4 * T + 2 * S,
                       .n_out = O, .out_idx = buf + 4 * T + 3 * S, .block_table = table, .bt_stride = stride,
                       .verify_len = msg.v[6]};
            const int *p = b.out_idx + O, *rows = NULL;
            if (f.dp.on) {
                b.seq_group = (int *)p;
                p += S;
            }
            int kind = msg.v[7];
            if (kind != GRAPH_FORWARD) {
                rows = p;
                p += T;
            }
            for (int s = 0; s < S; s++) {
                int nb = (b.ctx_len[s] + kv.block_size - 1) / kv.block_size;
                if (nb > stride) nb = stride;
                memcpy(table + (size_t)s * stride, p, nb * sizeof(int));
                p += nb;
                if (b.ctx_len[s] > b.max_ctx) b.max_ctx = b.ctx_len[s];
            }
            f.eager_once = msg.v[5];
            if (kind == GRAPH_FORWARD) {
                forward_run(&f, &b, &kv, NULL);
            } else { /* the MTP layer's pass (rank 0's engine drafts; the drafts stay there) */
                if (!mtp.f) mtp_init(&mtp, &f, 0);
                if (O > ids_cap) ids = xrealloc(ids, (size_t)(ids_cap = O) * sizeof(int));
                mtp_run(&mtp, &b, &kv, rows, kind == GRAPH_MTP_MAIN, ids);
                f.eager_once = 0;
            }
            break;
        }
        case DIST_MSG_FREE:
            if (live) {
                mtp_free(&mtp);
                forward_free(&f);
                kv_cache_free(&kv);
                free(table);
                table = NULL;
                live = 0;
            }
            break;
        case DIST_MSG_STOP:
            if (live) {
                mtp_free(&mtp);
                forward_free(&f);
                kv_cache_free(&kv);
            }
            free(table);
            free(buf);
            free(ids);
            return;
        default:
            fatal("worker: unknown message %d from rank 0", msg.op);
        }
    }
}

const Batch *forward_batch_to_device(Forward *f, const Batch *b)
{
    if (f->gidx) gather_order(f, 0, b->n_out); /* one micro-batch's rows */
    return forward_upload(f, b);
}
