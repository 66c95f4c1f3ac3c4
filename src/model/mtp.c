/* mtp: the multi-token-prediction layer of GLM-4.5/4.6/4.7 and GLM-5 (DeepSeek-V3's MTP module,
 * one of them: num_nextn_predict_layers, the first used), as the drafter of speculative decoding.
 *
 * For the pair (h_p, x_{p+1}) of the main model's hidden state at position p and the token after
 * it, the layer predicts x_{p+2}:
 *   e = enorm(embed(x_{p+1}))      the layer's own embed_tokens where the checkpoint has one (GLM-4.5),
 *                                  else the model's (GLM-5, DeepSeek-V3)
 *   g = hnorm(h_p)
 *   u = eh_proj([e | g])           the embedding first, the hidden state second: eh_proj's columns
 *                                  0..D read e, D..2D read g (DeepSeek-V3's order; vLLM's deepseek_mtp.py
 *                                  and SGLang's deepseek_nextn.py concatenate so)
 *   u = decoder layer L at position p, residual included: the architecture's attention over a KV
 *       cache layer of its own (index L = num_hidden_layers) and its MoE
 *   logits = shared_head.head(shared_head.norm(u))   (the model's lm_head where it has no head)
 * h_p is the main model's output after its final norm: the peers hand the drafter the hidden
 * states their model classes return, and those end in the final norm (vLLM's and SGLang's
 * DeepseekV2Model.forward); hnorm then normalises it again. A chain of k drafts applies the one
 * layer k times: step j pairs the previous step's u (before shared_head.norm) with the previous
 * draft, at the next position, as the peers' MTP proposers do.
 *
 * Its KV cache must hold, for every position p of a context, the entry of (h_p, x_{p+1}): one token
 * behind the main model's, since x_{p+1} is known only once sampled. So after each main forward
 * the layer runs over the positions that forward settled ("catch-up": a prefill chunk, or a
 * verified token and its accepted drafts), the last with the token just sampled, and the last
 * row's logits give the first draft. The chain's entries at later positions are provisional: the
 * next catch-up writes those positions again with the true pairs before anything reads them.
 * vLLM also zeroes the embedding at position 0; SGLang does not and neither does moeserve: one
 * entry's draft quality, never an output (verification keeps the output exact). */
#include "mtp.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

void mtp_init(Mtp *x, Forward *f, int draft_vocab)
{
    const ModelConfig *c = &f->m->cfg;
    CHECK(c->mtp_loaded, "mtp: the model has no MTP layer loaded");
    size_t T = f->max_tokens, D = c->hidden;
    *x = (Mtp){.f = f, .vocab = draft_vocab > 0 && draft_vocab < c->vocab ? draft_vocab : c->vocab};
    if (x->vocab < c->vocab && f->m->mtp.head.packed) { /* a repacked layout's rows are no plain slice */
        log_warn("mtp: the draft vocabulary is the whole one: the head is repacked for the GPU kernels");
        x->vocab = c->vocab;
    }
    if (x->vocab < c->vocab && c->vocab_local < c->vocab) { /* each rank holds a slice of the head */
        log_warn("mtp: the draft vocabulary is the whole one under --tp (the head is in vocabulary slices)");
        x->vocab = c->vocab;
    }
    x->hin = be_alloc(f->be, T * D * sizeof(float));
    x->cat = be_alloc(f->be, T * 2 * D * sizeof(float));
    x->rows = be_alloc(f->be, T * sizeof(int));
    x->ids = be_alloc(f->be, (size_t)f->max_out * sizeof(int));
    x->hrows = xmalloc(T * sizeof(int));
}

void mtp_free(Mtp *x)
{
    if (!x->f) return;
    Backend *be = x->f->be;
    be_free(be, x->hin);
    be_free(be, x->cat);
    be_free(be, x->rows);
    be_free(be, x->ids);
    free(x->hrows);
    *x = (Mtp){0};
}

/* a pass's arguments, for its body (run op by op or captured) */
typedef struct {
    Mtp *x;
    int from_main;             /* the hidden rows come from the main model's f->h (and its final norm) */
} MtpPass;

/* the layer over f->hb / f->db (mtp_run says what), the hidden rows in x->rows */
static void mtp_body(Forward *f, KVCache *kv, void *ctx)
{
    const MtpPass *ps = ctx;
    Mtp *x = ps->x;
    const Model *m = f->m;
    const ModelConfig *c = &m->cfg;
    const MtpWeights *w = &m->mtp;
    Backend *be = f->be;
    int T = f->hb->n_tokens, n = f->hb->n_out, D = c->hidden, L = c->n_layers, V = x->vocab;
    float *hid = ps->from_main ? x->hin : f->ffn;
    if (ps->from_main) { /* the model's output after its final norm (mtp.c's header) */
        be_get_rows(be, x->hin, f->h, D, x->rows, T, D);
        be_rmsnorm(be, x->hin, D, x->hin, D, m->final_norm, T, D, c->rms_eps);
    } else { /* a chain's: the previous pass's output rows */
        be_get_rows(be, f->ffn, x->hin, D, x->rows, T, D);
    }
    be_embed(be, f->a, f->db->tokens, T, &w->embed);
    be_rmsnorm(be, x->cat, 2 * D, f->a, D, w->enorm, T, D, c->rms_eps);
    be_rmsnorm(be, x->cat + D, 2 * D, hid, D, w->hnorm, T, D, c->rms_eps);
    be_matmul(be, OP_GEMM_ATTN, f->h, D, x->cat, 2 * D, T, &w->eh_proj, NULL);
    if (config_is_mla(c)) glm5_attention(f, L, kv);
    else glm4_moe_attention(f, L, kv);
    moe_ffn(f, L);
    if (n > 0) {
        be_get_rows(be, x->hin, f->h, D, f->db->out_idx, n, D);
        be_rmsnorm(be, f->out_h, D, x->hin, D, w->head_norm, n, D, c->rms_eps);
        if (c->vocab_local < c->vocab) { /* vocabulary slices, gathered in order (forward_head's way) */
            int Vl = c->vocab_local;
            be_matmul(be, OP_GEMM_LM_HEAD, f->lm_part, Vl, f->out_h, D, n, &w->head, NULL);
            dist_all_gather(f->dist, be, f->lm_gather, f->lm_part, (size_t)n * Vl);
            be_get_rows(be, f->logits, f->lm_gather, Vl, f->gidx_d, n * c->tp, Vl);
        } else {
            QTensor head = V < c->vocab ? qtensor_rows(&w->head, 0, V) : w->head;
            be_matmul(be, OP_GEMM_LM_HEAD, f->logits, V, f->out_h, D, n, &head, NULL);
        }
        be_argmax(be, x->ids, f->logits, n, V);
    }
}

void mtp_run(Mtp *x, const Batch *b, KVCache *kv, const int *rows, int from_main, int *ids)
{
    Forward *f = x->f;
    Backend *be = f->be;
    int T = b->n_tokens;
    CHECK(T > 0 && T <= f->max_tokens && b->n_out <= f->max_out, "mtp: %d tokens, %d rows", T, b->n_out);
    MtpPass ps = {.x = x, .from_main = from_main};
    if (f->shared) forward_send_pass(f, b, kv, from_main ? GRAPH_MTP_MAIN : GRAPH_MTP_CHAIN, rows);
    /* graphs where the batch allows (forward.h): the catch-up after a decoding or verification
     * step, and every pass of a chain; a prompt chunk's catch-up runs op by op */
    int graph = forward_graph_fits(f, b);
    f->hb = graph ? forward_graph_pad(f, b) : b;
    f->db = forward_batch_to_device(f, f->hb);
    int Tp = f->hb->n_tokens;
    if (Tp > T) { /* padding tokens read row 0 */
        CHECK(f->hb == &f->pad, "mtp: a padded batch outside the pad");
        memcpy(x->hrows, rows, T * sizeof(int));
        memset(x->hrows + T, 0, (size_t)(Tp - T) * sizeof(int));
        rows = x->hrows;
    }
    be_to_device(be, x->rows, rows, (size_t)Tp * sizeof(int));
    if (graph) forward_graph_run(f, from_main ? GRAPH_MTP_MAIN : GRAPH_MTP_CHAIN, kv, mtp_body, &ps);
    else mtp_body(f, kv, &ps);
    if (b->n_out > 0) be_to_host(be, ids, x->ids, (size_t)b->n_out * sizeof(int));
    f->hb = f->db = NULL;
}
