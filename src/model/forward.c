/* forward: the top-level forward pass (SPEC §1.4): embedding, L decoder layers of pre-norm
 * residual blocks, the final norm on the rows that produce logits, lm_head. */
#include "forward.h"

#include <stdlib.h>

#include "../base/util.h"

static int imax(int a, int b) { return a > b ? a : b; }

void forward_init(Forward *f, const Model *m, Backend *be, int max_tokens, int max_out)
{
    const ModelConfig *c = &m->cfg;
    *f = (Forward){.m = m, .be = be, .max_tokens = max_tokens, .max_out = max_out};
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
    f->g = be_alloc(be, T * fdim * F4);
    f->u = be_alloc(be, T * fdim * F4);
    f->ffn = be_alloc(be, T * D * F4);
    f->ffn2 = be_alloc(be, T * D * F4);
    if (c->n_experts > 0) {
        f->rlogits = be_alloc(be, T * c->n_experts * F4);
        f->ridx = be_alloc(be, T * c->n_experts_per_tok * sizeof(int));
        f->rwts = be_alloc(be, T * c->n_experts_per_tok * F4);
    }
    f->out_h = be_alloc(be, (size_t)max_out * D * F4);
    f->logits = be_alloc(be, (size_t)max_out * c->vocab * F4);
}

void forward_free(Forward *f)
{
    if (!f->be) return;
    void *bufs[] = {f->inv_freq, f->h, f->a, f->qa, f->q, f->k, f->v, f->attn, f->iq, f->ik, f->iw, f->topk,
                    f->g, f->u, f->ffn, f->ffn2, f->rlogits, f->ridx, f->rwts, f->out_h, f->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(f->be, bufs[i]);
    *f = (Forward){0};
}

void forward_run(Forward *f, const Batch *b, KVCache *kv, float *logits_out)
{
    const Model *m = f->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = f->be;
    CHECK(b->n_tokens > 0 && b->n_tokens <= f->max_tokens, "forward: %d tokens, limit %d", b->n_tokens, f->max_tokens);
    CHECK(b->n_out >= 0 && b->n_out <= f->max_out, "forward: %d logits rows, limit %d", b->n_out, f->max_out);
    be_embed(be, f->h, b->tokens, b->n_tokens, &m->embed);
    for (int l = 0; l < c->n_layers; l++) {
        if (model_is_mla(c))
            glm5_attention(f, l, b, kv);
        else
            glm4_moe_attention(f, l, b, kv);
        moe_ffn(f, l, b);
    }
    if (b->n_out == 0) return;
    be_get_rows(be, f->out_h, f->h, c->hidden, b->out_idx, b->n_out, c->hidden);
    be_rmsnorm(be, f->out_h, c->hidden, f->out_h, c->hidden, m->final_norm, b->n_out, c->hidden, c->rms_eps);
    be_matmul(be, OP_GEMM_LM_HEAD, f->logits, c->vocab, f->out_h, c->hidden, b->n_out, &m->lm_head, NULL);
    if (logits_out) be_to_host(be, logits_out, f->logits, (size_t)b->n_out * c->vocab * sizeof(float));
}
