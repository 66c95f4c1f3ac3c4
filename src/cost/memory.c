/* memory: a rank's memory under a layout (memory.h). */
#include "memory.h"

#include <math.h>

#include "../backend/backend.h"
#include "../model/kv_cache.h"

/* The step's activations for T rows, the logits of S rows, the routed pairs (T x K) of the MoE
 * kernels, the split-BF16 GEMM halves, prefill's BF16 copy of the largest dense weight, and MLA's
 * expanded form (model/mla.c: a piece of KC cached positions as float32 and through kv_b_proj,
 * whose GEMM halves have KC rows, and its keys and values as BF16 halves). */
double cost_activation_bytes(const ModelConfig *c, int T, int S)
{
    double D = c->hidden, H = c->n_heads, E = c->n_experts, K = c->n_experts_per_tok, F = c->moe_intermediate;
    double qdim = H * (c->head_dim > c->qk_nope_dim + c->qk_rope_dim ? c->head_dim : c->qk_nope_dim + c->qk_rope_dim);
    double kdim = fmax(c->n_kv_heads * (double)c->head_dim, c->kv_lora_rank + c->qk_rope_dim);
    double odim = H * fmax(c->head_dim, c->v_head_dim);
    double fdim = fmax(c->intermediate, F * fmax(c->n_shared_experts, 1));
    double per_tok = 6 * D + c->q_lora_rank + qdim + kdim + odim + 2 * fdim + E + 2 * K +
                     (c->index_n_heads ? c->index_n_heads * (c->index_head_dim + 1.0) + c->index_head_dim + c->index_topk : 0);
    double fwd = 4.0 * T * per_tok + 4.0 * S * (c->vocab + D);
    double moe = E > 0 ? T * K * (F * 4.0 + D * 4.0 + 4) : 0;                 /* h (two BF16 halves), y */
    double nkv = H * (c->qk_nope_dim + c->v_head_dim), kc = c->kv_lora_rank > 0 ? be_mla_piece(c) : 0;
    /* (the GPU's piece kernel v3 also keeps the piece's keys and values as BF16 halves: 4 bytes an
     * element of H (Dn + Dr + Dv) a position) */
    double mla = kc > 0 ? 4.0 * kc * (c->kv_lora_rank + c->qk_rope_dim + nkv + H * (c->qk_nope_dim + c->qk_rope_dim + c->v_head_dim)) +
                              8.0 * T * H
                        : 0;
    double gemm = 2.0 * fmax(T, kc) * fmax(qdim, fmax(fdim, fmax(D, nkv))) * 4 /* split halves */
                  + 2.0 * fmax(T, kc) * fmax(D, fdim) * 2 * 2;                 /* BF16 activations */
    double wcopy = T >= 256 ? 2.0 * fmax(c->intermediate * D, fmax(H * c->v_head_dim * D, qdim * fmax(c->q_lora_rank, 1))) : 0;
    double idx = c->index_n_heads > 0 ? 4.0 * T * c->max_position / 8 : 0; /* indexer scores, a share of the context */
    return fwd + moe + gemm + wcopy + idx + mla;
}

double cost_dp_exchange_bytes(const ModelConfig *c, int T)
{
    return 3.0 * T * c->n_experts_per_tok * c->hidden * sizeof(float);
}

void cost_rank_memory(const Model *m, int max_batch_tokens, int max_running, double memory_bytes, double reserve_bytes,
                      CostRankMem *out)
{
    const ModelConfig *c = &m->cfg;
    *out = (CostRankMem){0};
    for (int f = 0; f < QF_COUNT; f++) out->weight_bytes += m->bytes_by_format[f];
    out->nvfp4_bytes = m->bytes_by_format[QF_NVFP4];
    out->bf16_bytes = m->bytes_by_format[QF_BF16];
    out->kv_bytes_per_token = (double)kv_cache_block_bytes(c, 1);
    out->activation_bytes = cost_activation_bytes(c, max_batch_tokens, max_running);
    if (c->dp > 1) out->activation_bytes += cost_dp_exchange_bytes(c, max_batch_tokens);
    if (memory_bytes > 0) {
        out->left_bytes = memory_bytes - reserve_bytes - out->weight_bytes - out->activation_bytes;
        out->kv_tokens = out->left_bytes > 0 && out->kv_bytes_per_token > 0
                             ? out->left_bytes * COST_KV_FRACTION / out->kv_bytes_per_token : 0;
    }
}
