/* model: facts derived from a ModelConfig alone: KV entry widths, the KV cache dtype and the
 * parameter count. The count is exact integer arithmetic (held in double, exact
 * below 2^53) over the tensors a release checkpoint stores:
 *
 *   attention (GQA)  q H*Dh*D + k,v 2*Hkv*Dh*D + o D*H*Dh
 *                    [+ biases H*Dh + 2*Hkv*Dh if attention_bias] [+ q_norm, k_norm 2*Dh if use_qk_norm]
 *   attention (MLA)  q_a R*D + q_a_layernorm R + q_b H*(Dn+Dr)*R      (R = 0: q_proj H*(Dn+Dr)*D)
 *                    + kv_a (C+Dr)*D + kv_a_layernorm C + kv_b H*(Dn+Dv)*C + o D*H*Dv
 *                    [+ biases of q_a, kv_a, o if attention_bias]
 *   indexer (DSA, "full" layers only; "shared" layers carry none and reuse a full layer's top-k)
 *                    wq_b Hi*Di*R + wk Di*D + k_norm weight+bias 2*Di + weights_proj Hi*D
 *   norms            input_layernorm + post_attention_layernorm 2*D
 *   dense MLP        3*D*Fd
 *   MoE block        (E + n_shared) * 3*D*F + router E*D + e_score_correction_bias E (sigmoid routers)
 *   global           embedding V*D + lm_head V*D (0 when tied) + final norm D
 *   MTP layer        a full MoE decoder layer (with its own indexer) + enorm D + hnorm D
 *                    + eh_proj D*2D + shared_head.norm D; its embedding / head copies, shipped
 *                    by GLM-4.5, are not counted (they would add about 1.55 B)
 *   active           per token: every layer with the MoE block reduced to (K + n_shared) experts
 *                    + router + bias, plus the final norm; embedding and lm_head excluded
 *
 * GLM-5: MLA 165,022,208; indexer 9,371,904; norms 12,288; MoE 9,702,998,272; dense 226,492,416;
 * total 743,911,218,432 (743.91 B; published: 744B), with MTP 753,864,139,008 (the Hub's "754B"),
 * active 39,881,563,392 (published: 40B). GLM-4.5: 352.80 B, with MTP 356.79 B (published: 355B). */
#include "model.h"

#include <string.h>

/* ---- helpers: parameters of one piece, int64 ---- */

static int64_t attn_params(const ModelConfig *c)
{
    const int64_t D = c->hidden, H = c->n_heads;
    if (!config_is_mla(c)) {
        const int64_t Dh = c->head_dim, Hkv = c->n_kv_heads;
        int64_t n = H * Dh * D + 2 * Hkv * Dh * D + D * H * Dh;
        if (c->attention_bias) n += H * Dh + 2 * Hkv * Dh;
        if (c->use_qk_norm) n += 2 * Dh;
        return n;
    }
    const int64_t R = c->q_lora_rank, C = c->kv_lora_rank, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim,
                  Dv = c->v_head_dim;
    int64_t n = R > 0 ? R * D + R + H * (Dn + Dr) * R : H * (Dn + Dr) * D;
    n += (C + Dr) * D + C + H * (Dn + Dv) * C + D * H * Dv;
    if (c->attention_bias) n += (R > 0 ? R : 0) + (C + Dr) + D;
    return n;
}

static int64_t indexer_params(const ModelConfig *c)
{
    const int64_t D = c->hidden, Hi = c->index_n_heads, Di = c->index_head_dim, R = c->q_lora_rank;
    return Hi * Di * R + Di * D + 2 * Di + Hi * D;
}

static int64_t expert_params(const ModelConfig *c) { return 3 * (int64_t)c->hidden * c->moe_intermediate; }

/* Router weight [E, D] plus the selection bias of sigmoid (noaux_tc) routers. */
static int64_t router_params(const ModelConfig *c)
{
    const int64_t E = c->n_experts;
    return E * c->hidden + (c->scoring == SCORE_SIGMOID ? E : 0);
}

/* One decoder layer: all = every expert, otherwise the K routed + shared experts a token uses. */
static int64_t layer_params(const ModelConfig *c, int layer, int all)
{
    int64_t n = attn_params(c) + 2 * (int64_t)c->hidden;
    if (c->layer_indexer[layer] == INDEXER_FULL) n += indexer_params(c);
    if (c->layer_moe[layer]) {
        int64_t experts = (all ? c->n_experts : c->n_experts_per_tok) + c->n_shared_experts;
        n += experts * expert_params(c) + router_params(c);
    } else {
        n += 3 * (int64_t)c->hidden * c->intermediate;
    }
    return n;
}

/* ---- public API ---- */


int model_kv_width(const ModelConfig *c)
{
    return config_is_mla(c) ? c->kv_lora_rank + c->qk_rope_dim : 2 * c->n_kv_heads * c->head_dim;
}

int model_index_width(const ModelConfig *c)
{
    return c->arch == ARCH_GLM5 || c->arch == ARCH_DEEPSEEK_V32 ? c->index_head_dim : 0;
}

KVDtype model_kv_dtype(const ModelConfig *c, int host_memory)
{
    if (c->kv_dtype != KV_DTYPE_AUTO) return c->kv_dtype;
    if (c->kv_cache_fp8) return KV_DTYPE_FP8;
    return host_memory ? KV_DTYPE_F32 : KV_DTYPE_BF16;
}

static const struct { const char *name; KVDtype t; } kv_dtype_names[] = {
    {"auto", KV_DTYPE_AUTO}, {"float32", KV_DTYPE_F32}, {"bf16", KV_DTYPE_BF16}, {"bfloat16", KV_DTYPE_BF16},
    {"fp8", KV_DTYPE_FP8}, {"fp8_e4m3", KV_DTYPE_FP8},
};

int model_kv_dtype_parse(const char *s, KVDtype *out)
{
    for (size_t i = 0; i < sizeof kv_dtype_names / sizeof kv_dtype_names[0]; i++)
        if (!strcmp(s, kv_dtype_names[i].name)) { *out = kv_dtype_names[i].t; return 0; }
    return -1;
}

const char *model_kv_dtype_name(KVDtype t)
{
    return t == KV_DTYPE_F32 ? "float32" : t == KV_DTYPE_BF16 ? "bf16" : t == KV_DTYPE_FP8 ? "fp8_e4m3" : "auto";
}

void model_count_params(const ModelConfig *c, ParamCount *out)
{
    const int64_t D = c->hidden, VD = (int64_t)c->vocab * D;
    int64_t total = 0, active = 0, mtp = 0;
    for (int l = 0; l < c->n_layers; l++) {
        total += layer_params(c, l, 1);
        active += layer_params(c, l, 0);
    }
    for (int j = 0; j < c->n_mtp_layers; j++) /* enorm, hnorm, eh_proj [D, 2D], shared_head.norm */
        mtp += layer_params(c, c->n_layers + j, 1) + 2 * D + 2 * D * D + D;
    out->embedding = (double)VD;
    out->lm_head = c->tie_embeddings ? 0 : (double)VD;
    out->total = (double)(total + D) + out->embedding + out->lm_head;
    out->total_with_mtp = out->total + (double)mtp;
    out->active = (double)(active + D);
    out->active_with_head = out->active + (double)VD;
}
