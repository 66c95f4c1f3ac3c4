/* cmd_synth: `moeserve synth --arch glm5|glm4_moe --preset NAME --quant bf16|nvfp4 --out DIR
 * [--layers N] [--mtp N] [--seed N] [--shard-mb N] [--threads N] [--dry-run]` writes a
 * random-weight checkpoint in the layout of a real Hugging Face release: config.json and
 * generation_config.json as transformers 5.17 writes them (plus the release fields vLLM reads),
 * safetensors shards with the release's tensor names (those of zai-org/GLM-5 and
 * zai-org/GLM-4.5 on the Hub), a byte-level BPE tokenizer with GLM's special tokens, and with
 * --quant nvfp4 the ModelOpt NVFP4 format (src/format/ckpt.h) exactly as `moeserve quantize`
 * makes it from the BF16 checkpoint of the same seed. Weights are generated one tensor at a
 * time, each row from its own seed (global seed, tensor name, row), so the files depend on the
 * seed only, never on the threads. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"
#include "../format/ckpt.h"
#include "../format/config.h"
#include "cli.h"

#define SYNTH_TF_VERSION "5.17.0"  /* the transformers whose save_pretrained output is mirrored */

/* ---- types ---- */

/* A model shape: the config.json numbers of one preset (the real ones from the releases' config.json on the
   Hugging Face Hub: zai-org/GLM-5, zai-org/GLM-4.5, zai-org/GLM-4.5-Air). */
typedef struct {
    const char *name;
    Arch arch;
    int vocab, hidden, layers, heads, kv_heads;
    int head_dim;                                  /* GQA head size */
    int q_lora, kv_lora, qk_nope, qk_rope, v_head; /* MLA */
    int index_heads, index_head_dim, index_topk;   /* DSA indexer */
    int intermediate, moe_intermediate, experts, top_k, shared, n_group, topk_group, first_k_dense;
    double routed_scaling, rope_theta, partial_rotary;
    int attention_bias, qk_norm;
    int max_position, mtp;
} Preset;

static const Preset presets[] = {
    /* tiny: CI-sized, the shapes of tools/make_fixtures.py's golden fixtures; every in-feature
       dim a multiple of 16 (NVFP4 blocks) */
    {.name = "tiny", .arch = ARCH_GLM5, .vocab = 8192, .hidden = 128, .layers = 4, .heads = 4, .kv_heads = 4,
     .q_lora = 64, .kv_lora = 64, .qk_nope = 32, .qk_rope = 16, .v_head = 32,
     .index_heads = 8, .index_head_dim = 32, .index_topk = 8,
     .intermediate = 96, .moe_intermediate = 32, .experts = 16, .top_k = 4, .shared = 1, .n_group = 1,
     .topk_group = 1, .first_k_dense = 1, .routed_scaling = 2.5, .rope_theta = 10000.0, .partial_rotary = 1.0,
     .max_position = 4096},
    {.name = "tiny", .arch = ARCH_GLM4_MOE, .vocab = 8192, .hidden = 128, .layers = 4, .heads = 8, .kv_heads = 2,
     .head_dim = 32, .intermediate = 96, .moe_intermediate = 32, .experts = 16, .top_k = 4, .shared = 1,
     .n_group = 4, .topk_group = 2, .first_k_dense = 1, .routed_scaling = 2.5, .rope_theta = 10000.0,
     .partial_rotary = 0.5, .attention_bias = 1, .qk_norm = 1, .max_position = 4096},
    /* tiny-air: small, with GLM-4.5-Air's FFN widths that are no multiple of 256 (the packed
       NVFP4 kernels' records; the GPU pads them) and 128-wide heads of 8 query heads a KV head */
    {.name = "tiny-air", .arch = ARCH_GLM4_MOE, .vocab = 8192, .hidden = 256, .layers = 3, .heads = 16, .kv_heads = 2,
     .head_dim = 128, .intermediate = 160, .moe_intermediate = 96, .experts = 8, .top_k = 2, .shared = 1,
     .n_group = 1, .topk_group = 1, .first_k_dense = 1, .routed_scaling = 1.0, .rope_theta = 10000.0,
     .partial_rotary = 0.5, .attention_bias = 1, .qk_norm = 0, .max_position = 4096},
    /* GLM-5 with its MTP layer; glm5-layer is one full-size MoE layer */
    {.name = "glm5", .arch = ARCH_GLM5, .vocab = 154880, .hidden = 6144, .layers = 78, .heads = 64,
     .kv_heads = 64, .q_lora = 2048, .kv_lora = 512, .qk_nope = 192, .qk_rope = 64, .v_head = 256,
     .index_heads = 32, .index_head_dim = 128, .index_topk = 2048, .intermediate = 12288,
     .moe_intermediate = 2048, .experts = 256, .top_k = 8, .shared = 1, .n_group = 1, .topk_group = 1,
     .first_k_dense = 3, .routed_scaling = 2.5, .rope_theta = 1e6, .partial_rotary = 1.0,
     .max_position = 202752, .mtp = 1},
    {.name = "glm5-layer", .arch = ARCH_GLM5, .vocab = 154880, .hidden = 6144, .layers = 1, .heads = 64,
     .kv_heads = 64, .q_lora = 2048, .kv_lora = 512, .qk_nope = 192, .qk_rope = 64, .v_head = 256,
     .index_heads = 32, .index_head_dim = 128, .index_topk = 2048, .intermediate = 12288,
     .moe_intermediate = 2048, .experts = 256, .top_k = 8, .shared = 1, .n_group = 1, .topk_group = 1,
     .first_k_dense = 0, .routed_scaling = 2.5, .rope_theta = 1e6, .partial_rotary = 1.0,
     .max_position = 202752, .mtp = 0},
    /* GLM-4.5 and GLM-4.5-Air */
    {.name = "glm4.5", .arch = ARCH_GLM4_MOE, .vocab = 151552, .hidden = 5120, .layers = 92, .heads = 96,
     .kv_heads = 8, .head_dim = 128, .intermediate = 12288, .moe_intermediate = 1536, .experts = 160,
     .top_k = 8, .shared = 1, .n_group = 1, .topk_group = 1, .first_k_dense = 3, .routed_scaling = 2.5,
     .rope_theta = 1e6, .partial_rotary = 0.5, .attention_bias = 1, .qk_norm = 1, .max_position = 131072,
     .mtp = 1},
    {.name = "glm4.5-air", .arch = ARCH_GLM4_MOE, .vocab = 151552, .hidden = 4096, .layers = 46, .heads = 96,
     .kv_heads = 8, .head_dim = 128, .intermediate = 10944, .moe_intermediate = 1408, .experts = 128,
     .top_k = 8, .shared = 1, .n_group = 1, .topk_group = 1, .first_k_dense = 1, .routed_scaling = 1.0,
     .rope_theta = 1e6, .partial_rotary = 0.5, .attention_bias = 1, .qk_norm = 0, .max_position = 131072,
     .mtp = 1},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

/* eos = <|endoftext|>, <|user|>, <|observation|>: offsets 0, 7, 9 from <|endoftext|> in GLM's
   special-token order, which the built-in tokenizer keeps; pad = <|endoftext|>. */
static const int eos_offsets[3] = {0, 7, 9};

/* Weight generator: the CkptFetch behind ckpt_write. Two slots hold the last two fetches (the
   writer needs a gate_proj and its up_proj at once). */
typedef struct {
    int entry;
    int64_t r0, r1;
    void *buf;
    size_t cap;
    uint64_t stamp;
} GenSlot;

typedef struct {
    const CkptPlan *plan;   /* borrowed */
    uint64_t seed;
    GenSlot slot[2];
    uint64_t clock;
} Gen;

/* ---- helpers: config.json ---- */

static json_t *json_repeat(const char *s, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(s));
    return a;
}

static void set(json_t *o, const char *k, json_t *v) { json_object_set_new(o, k, v); }

/* config.json of preset p with `layers` layers, keys as transformers 5.17 writes them for
   GlmMoeDsaForCausalLM / Glm4MoeForCausalLM plus the release fields vLLM reads. */
static json_t *config_json(const Preset *p, int layers, int mtp, int special_base)
{
    json_t *o = json_object();
    int glm5 = p->arch == ARCH_GLM5;
    json_t *eos = json_array();
    for (int i = 0; i < 3; i++) json_array_append_new(eos, json_integer(special_base + eos_offsets[i]));
    set(o, "architectures", json_pack("[s]", glm5 ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"));
    set(o, "model_type", json_string(glm5 ? "glm_moe_dsa" : "glm4_moe"));
    set(o, "attention_bias", json_boolean(p->attention_bias));
    set(o, "attention_dropout", json_real(0.0));
    set(o, "bos_token_id", json_null());
    set(o, "dtype", json_string("bfloat16"));
    set(o, "eos_token_id", eos);
    set(o, "pad_token_id", json_integer(special_base));
    set(o, "first_k_dense_replace", json_integer(p->first_k_dense));
    set(o, "hidden_act", json_string("silu"));
    set(o, "hidden_size", json_integer(p->hidden));
    set(o, "initializer_range", json_real(0.02));
    set(o, "intermediate_size", json_integer(p->intermediate));
    set(o, "max_position_embeddings", json_integer(p->max_position));
    set(o, "moe_intermediate_size", json_integer(p->moe_intermediate));
    set(o, "n_group", json_integer(p->n_group));
    set(o, "n_routed_experts", json_integer(p->experts));
    set(o, "n_shared_experts", json_integer(p->shared));
    set(o, "norm_topk_prob", json_true());
    set(o, "num_attention_heads", json_integer(p->heads));
    set(o, "num_experts_per_tok", json_integer(p->top_k));
    set(o, "num_hidden_layers", json_integer(layers));
    set(o, "num_key_value_heads", json_integer(p->kv_heads));
    set(o, "num_nextn_predict_layers", json_integer(mtp));
    set(o, "rms_norm_eps", json_real(1e-5));
    set(o, "routed_scaling_factor", json_real(p->routed_scaling));
    set(o, "scoring_func", json_string("sigmoid"));
    set(o, "tie_word_embeddings", json_false());
    set(o, "topk_group", json_integer(p->topk_group));
    set(o, "topk_method", json_string("noaux_tc"));
    set(o, "transformers_version", json_string(SYNTH_TF_VERSION));
    set(o, "use_cache", json_true());
    set(o, "vocab_size", json_integer(p->vocab));
    if (glm5) {
        json_t *mlp = json_array();
        for (int l = 0; l < layers; l++) json_array_append_new(mlp, json_string(l < p->first_k_dense ? "dense" : "sparse"));
        set(o, "head_dim", json_integer(p->qk_rope)); /* GlmMoeDsaConfig: head_dim = qk_rope_head_dim */
        set(o, "index_head_dim", json_integer(p->index_head_dim));
        set(o, "index_n_heads", json_integer(p->index_heads));
        set(o, "index_topk", json_integer(p->index_topk));
        set(o, "indexer_rope_interleave", json_true());
        set(o, "indexer_types", json_repeat("full", layers));
        set(o, "kv_lora_rank", json_integer(p->kv_lora));
        set(o, "layer_types", json_repeat("deepseek_sparse_attention", layers));
        set(o, "mlp_bias", json_false());
        set(o, "mlp_layer_types", mlp);
        set(o, "moe_layer_freq", json_integer(1));
        set(o, "q_lora_rank", json_integer(p->q_lora));
        set(o, "qk_head_dim", json_integer(p->qk_nope + p->qk_rope));
        set(o, "qk_nope_head_dim", json_integer(p->qk_nope));
        set(o, "qk_rope_head_dim", json_integer(p->qk_rope));
        set(o, "rope_interleave", json_true());
        set(o, "rope_parameters", json_pack("{s:f, s:s}", "rope_theta", p->rope_theta, "rope_type", "default"));
        set(o, "v_head_dim", json_integer(p->v_head));
    } else {
        set(o, "head_dim", json_integer(p->head_dim));
        set(o, "partial_rotary_factor", json_real(p->partial_rotary));
        set(o, "rope_parameters", json_pack("{s:f, s:f, s:s}", "partial_rotary_factor", p->partial_rotary,
                                            "rope_theta", p->rope_theta, "rope_type", "default"));
        set(o, "use_qk_norm", json_boolean(p->qk_norm));
    }
    return o;
}

static json_t *generation_config_json(int special_base)
{
    json_t *eos = json_array();
    for (int i = 0; i < 3; i++) json_array_append_new(eos, json_integer(special_base + eos_offsets[i]));
    return json_pack("{s:b, s:o, s:b, s:b, s:i, s:s, s:b}", "_from_model_config", 1, "eos_token_id", eos,
                     "output_attentions", 0, "output_hidden_states", 0, "pad_token_id", special_base,
                     "transformers_version", SYNTH_TF_VERSION, "use_cache", 1);
}

/* ---- helpers: tokenizer ---- */

/* The built-in model's tokenizer (models/builtin, embedded at build time by scripts/embed.sh):
 * every synthetic checkpoint can be served and chatted with. Its <|endoftext|> is id
 * BUILTIN_ENDOFTEXT, followed by GLM-4.5's special tokens in GLM's order. */
extern const unsigned char builtin_tokenizer_json[], builtin_tokenizer_config_json[];
extern const unsigned long builtin_tokenizer_json_len, builtin_tokenizer_config_json_len;
#define BUILTIN_ENDOFTEXT 8168
#define BUILTIN_VOCAB 8192

static int write_tokenizer(const char *dir, char *err, size_t errlen)
{
    return ckpt_write_text(dir, "tokenizer.json", (const char *)builtin_tokenizer_json, err, errlen) ||
                   ckpt_write_text(dir, "tokenizer_config.json", (const char *)builtin_tokenizer_config_json, err, errlen)
               ? -1
               : 0;
}

/* ---- helpers: tensor inventory ---- */

static void add(CkptPlan *p, DType t, const char *prefix, const char *name, int64_t d0, int64_t d1)
{
    char full[512];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    int64_t shape[2] = {d0, d1};
    ckpt_plan_add(p, full, t, d1 > 0 ? 2 : 1, shape);
}

/* The tensors of layer l (l >= n_layers: an MTP layer) with the release's names. */
static void plan_layer(CkptPlan *p, const ModelConfig *c, int l)
{
    const int64_t D = c->hidden, H = c->n_heads, V = c->vocab;
    char pf[64];
    snprintf(pf, sizeof pf, "model.layers.%d.", l);
    if (l >= c->n_layers) { /* MTP extras: the GLM-4.5 family ships its own embedding and head */
        if (c->arch == ARCH_GLM4_MOE) add(p, DT_BF16, pf, "embed_tokens.weight", V, D);
        add(p, DT_BF16, pf, "enorm.weight", D, 0);
        add(p, DT_BF16, pf, "hnorm.weight", D, 0);
        add(p, DT_BF16, pf, "eh_proj.weight", D, 2 * D);
    }
    add(p, DT_BF16, pf, "input_layernorm.weight", D, 0);
    if (config_is_mla(c)) {
        int64_t R = c->q_lora_rank, C = c->kv_lora_rank, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim, Dv = c->v_head_dim;
        add(p, DT_BF16, pf, "self_attn.q_a_proj.weight", R, D);
        add(p, DT_BF16, pf, "self_attn.q_a_layernorm.weight", R, 0);
        add(p, DT_BF16, pf, "self_attn.q_b_proj.weight", H * (Dn + Dr), R);
        add(p, DT_BF16, pf, "self_attn.kv_a_proj_with_mqa.weight", C + Dr, D);
        add(p, DT_BF16, pf, "self_attn.kv_a_layernorm.weight", C, 0);
        add(p, DT_BF16, pf, "self_attn.kv_b_proj.weight", H * (Dn + Dv), C);
        add(p, DT_BF16, pf, "self_attn.o_proj.weight", D, H * Dv);
        if (c->layer_indexer[l] == INDEXER_FULL) {
            int64_t Hi = c->index_n_heads, Di = c->index_head_dim;
            add(p, DT_BF16, pf, "self_attn.indexer.wq_b.weight", Hi * Di, R);
            add(p, DT_BF16, pf, "self_attn.indexer.wk.weight", Di, D);
            add(p, DT_BF16, pf, "self_attn.indexer.k_norm.weight", Di, 0);
            add(p, DT_BF16, pf, "self_attn.indexer.k_norm.bias", Di, 0);
            add(p, DT_BF16, pf, "self_attn.indexer.weights_proj.weight", Hi, D);
        }
    } else {
        int64_t Dh = c->head_dim, Hkv = c->n_kv_heads;
        add(p, DT_BF16, pf, "self_attn.q_proj.weight", H * Dh, D);
        if (c->attention_bias) add(p, DT_BF16, pf, "self_attn.q_proj.bias", H * Dh, 0);
        add(p, DT_BF16, pf, "self_attn.k_proj.weight", Hkv * Dh, D);
        if (c->attention_bias) add(p, DT_BF16, pf, "self_attn.k_proj.bias", Hkv * Dh, 0);
        add(p, DT_BF16, pf, "self_attn.v_proj.weight", Hkv * Dh, D);
        if (c->attention_bias) add(p, DT_BF16, pf, "self_attn.v_proj.bias", Hkv * Dh, 0);
        add(p, DT_BF16, pf, "self_attn.o_proj.weight", D, H * Dh);
        if (c->use_qk_norm) {
            add(p, DT_BF16, pf, "self_attn.q_norm.weight", Dh, 0);
            add(p, DT_BF16, pf, "self_attn.k_norm.weight", Dh, 0);
        }
    }
    add(p, DT_BF16, pf, "post_attention_layernorm.weight", D, 0);
    if (!c->layer_moe[l]) {
        int64_t Fd = c->intermediate;
        add(p, DT_BF16, pf, "mlp.gate_proj.weight", Fd, D);
        add(p, DT_BF16, pf, "mlp.up_proj.weight", Fd, D);
        add(p, DT_BF16, pf, "mlp.down_proj.weight", D, Fd);
    } else {
        int64_t E = c->n_experts, F = c->moe_intermediate, Fs = F * c->n_shared_experts;
        add(p, DT_BF16, pf, "mlp.gate.weight", E, D);
        add(p, DT_F32, pf, "mlp.gate.e_score_correction_bias", E, 0); /* F32 in the release */
        for (int64_t e = 0; e < E; e++) {
            char n[96];
            snprintf(n, sizeof n, "mlp.experts.%lld.gate_proj.weight", (long long)e);
            add(p, DT_BF16, pf, n, F, D);
            snprintf(n, sizeof n, "mlp.experts.%lld.up_proj.weight", (long long)e);
            add(p, DT_BF16, pf, n, F, D);
            snprintf(n, sizeof n, "mlp.experts.%lld.down_proj.weight", (long long)e);
            add(p, DT_BF16, pf, n, D, F);
        }
        if (Fs > 0) {
            add(p, DT_BF16, pf, "mlp.shared_experts.gate_proj.weight", Fs, D);
            add(p, DT_BF16, pf, "mlp.shared_experts.up_proj.weight", Fs, D);
            add(p, DT_BF16, pf, "mlp.shared_experts.down_proj.weight", D, Fs);
        }
    }
    if (l >= c->n_layers) {
        add(p, DT_BF16, pf, "shared_head.norm.weight", D, 0);
        if (c->arch == ARCH_GLM4_MOE) add(p, DT_BF16, pf, "shared_head.head.weight", V, D);
    }
}

static void plan_model(CkptPlan *p, const ModelConfig *c)
{
    add(p, DT_BF16, "", "model.embed_tokens.weight", c->vocab, c->hidden);
    for (int l = 0; l < c->n_layers + c->n_mtp_layers; l++) plan_layer(p, c, l);
    add(p, DT_BF16, "", "model.norm.weight", c->hidden, 0);
    add(p, DT_BF16, "", "lm_head.weight", c->vocab, c->hidden);
}

/* ---- core: the weight generator ---- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* splitmix64's finalizer: a bijective mix of 64 bits */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* How tensor e is drawn: mean + std * z. Linears N(0, 1/fan_in) (lm_head 2x and routers 1.5x
   wider so logits and router scores are far from flat), embeddings N(0, 1), norm weights
   1 + 0.1 z, biases and the router's correction bias 0.1 z. */
static void draw_rule(const CkptEntry *e, float *mean, float *std)
{
    *mean = 0.0f;
    if (e->ndim == 2) {
        float fan = 1.0f / sqrtf((float)e->shape[1]);
        if (ends_with(e->name, "embed_tokens.weight")) *std = 1.0f;
        else if (!strcmp(e->name, "lm_head.weight") || ends_with(e->name, "shared_head.head.weight")) *std = 2.0f * fan;
        else if (ends_with(e->name, ".mlp.gate.weight")) *std = 1.5f * fan;
        else *std = fan;
    } else if (ends_with(e->name, ".bias") || ends_with(e->name, "e_score_correction_bias")) {
        *std = 0.1f;
    } else {
        *mean = 1.0f;
        *std = 0.1f;
    }
}

/* Rows [r0, r1) of entry e into out. Row r draws from Rng (util.h) seeded with
   mix64(base + r * gamma); draw k of that stream, splitmix64's mix64(seed + (k + 1) * gamma), is
   computed in place so the loop has no call and no carried state. z is approximately N(0, 1):
   the Irwin-Hall sum of the four 16-bit quarters of one draw, centred and scaled to unit
   variance (tails cut at 3.46 sigma): random weights need a bell shape, not exact normality, and
   one 64-bit draw per weight keeps the generator cheap. */
static void gen_rows(const CkptEntry *e, uint64_t seed, int64_t r0, int64_t r1, void *out)
{
    const uint64_t gamma = 0x9E3779B97F4A7C15ull;
    const int64_t rows = ckpt_entry_rows(e);
    int64_t K = 1;
    for (int d = 0; d < e->ndim; d++) K *= e->shape[d];
    K /= rows > 0 ? rows : 1;
    float mean, std;
    draw_rule(e, &mean, &std);
    const float scale = std * 1.7320508075688772f / 65536.0f; /* sqrt(3) / 2^16 */
    const uint64_t base = mix64(seed ^ mix64(fnv1a(e->name)));
    const int f32 = e->dtype == DT_F32;
    CHECK(f32 || e->dtype == DT_BF16, "synth: %s: cannot draw dtype %s", e->name, dtype_name(e->dtype));
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = r0; r < r1; r++) {
        const uint64_t rs = mix64(base + (uint64_t)r * gamma);
        uint16_t *o16 = (uint16_t *)out + (r - r0) * K;
        float *o32 = (float *)out + (r - r0) * K;
        for (int64_t k = 0; k < K; k++) {
            const uint64_t u = mix64(rs + (uint64_t)(k + 1) * gamma);
            const int32_t s = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) +
                              (int32_t)((u >> 32) & 0xffff) + (int32_t)(u >> 48) - 131070;
            const float v = mean + (float)s * scale;
            if (f32) {
                o32[k] = v;
            } else { /* round to nearest even BF16 (v is finite) */
                uint32_t b;
                memcpy(&b, &v, 4);
                o16[k] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
            }
        }
    }
}

static const void *gen_fetch(void *ctx, int i, int64_t r0, int64_t r1)
{
    Gen *g = ctx;
    g->clock++;
    for (int s = 0; s < 2; s++) {
        GenSlot *sl = &g->slot[s];
        if (sl->buf && sl->entry == i && sl->r0 == r0 && sl->r1 == r1) {
            sl->stamp = g->clock;
            return sl->buf;
        }
    }
    GenSlot *sl = &g->slot[g->slot[0].stamp <= g->slot[1].stamp ? 0 : 1];
    const CkptEntry *e = &g->plan->e[i];
    int64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) numel *= e->shape[d];
    size_t need = (size_t)(numel / ckpt_entry_rows(e) * (r1 - r0)) * (size_t)(dtype_bits(e->dtype) / 8);
    if (need > sl->cap) {
        free(sl->buf);
        sl->buf = xmalloc(need);
        sl->cap = need;
    }
    gen_rows(e, g->seed, r0, r1, sl->buf);
    *sl = (GenSlot){.entry = i, .r0 = r0, .r1 = r1, .buf = sl->buf, .cap = sl->cap, .stamp = g->clock};
    return sl->buf;
}

/* ---- helpers: options ---- */

static const Preset *find_preset(const char *name, const char *arch_s)
{
    int want = -1;
    if (arch_s) {
        if (!strcmp(arch_s, "glm5")) want = ARCH_GLM5;
        else if (!strcmp(arch_s, "glm4_moe")) want = ARCH_GLM4_MOE;
        else fatal("synth: --arch '%s': expected glm5 or glm4_moe", arch_s);
    }
    const Preset *hit = NULL;
    int known = 0;
    for (int i = 0; i < N_PRESETS; i++) {
        if (strcmp(presets[i].name, name)) continue;
        known++;
        if (want < 0 || (int)presets[i].arch == want) {
            if (hit) fatal("synth: --preset %s exists for glm5 and glm4_moe: give --arch", name);
            hit = &presets[i];
        }
    }
    if (!known) fatal("synth: unknown --preset '%s' (known: tiny, tiny-air, glm5, glm5-layer, glm4.5, glm4.5-air)", name);
    if (!hit)
        fatal("synth: --preset %s is not a %s model (glm5 and glm5-layer are glm5; glm4.5 and glm4.5-air are glm4_moe)",
              name, arch_s);
    return hit;
}

/* ---- public API ---- */

int cmd_synth(int argc, char **argv)
{
    const char *arch_s = NULL, *preset_s = NULL, *quant_s = "bf16", *out = NULL;
    int layers = 0, mtp = -1, seed = 1, shard_mb = 4096, threads = 0, dry = 0;
    const OptSpec specs[] = {
        {.names = "--preset", .type = OPT_STR, .dst = &preset_s, .metavar = "NAME",
         .help = "the shape: tiny, tiny-air, glm5, glm5-layer, glm4.5 or glm4.5-air (required)"},
        {.names = "--arch", .type = OPT_STR, .dst = &arch_s, .metavar = "glm5|glm4_moe",
         .help = "the architecture, where a preset has both", .def = "the preset's"},
        {.names = "--quant", .type = OPT_STR, .dst = &quant_s, .metavar = "bf16|nvfp4", .help = "the weights' format",
         .def = "bf16"},
        {.names = "--out", .type = OPT_STR, .dst = &out, .metavar = "DIR",
         .help = "where the checkpoint goes (required)"},
        {.names = "--layers", .type = OPT_INT, .dst = &layers, .metavar = "N", .help = "layers instead of the preset's",
         .def = "the preset's", .lo = 1, .hi = MODEL_MAX_LAYERS - 16},
        {.names = "--mtp", .type = OPT_INT, .dst = &mtp, .metavar = "N", .help = "multi-token-prediction layers",
         .def = "the preset's", .lo = 0, .hi = 16},
        {.names = "--seed", .type = OPT_INT, .dst = &seed, .metavar = "N", .help = "of the random weights", .def = "1",
         .lo = 0,
         .hi = 2147483647},
        {.names = "--shard-mb", .type = OPT_INT, .dst = &shard_mb, .metavar = "N", .help = "MB per safetensors shard",
         .def = "4096", .lo = 1, .hi = 1 << 24},
        {.names = "--threads", .type = OPT_INT, .dst = &threads, .metavar = "N", .help = "CPU threads",
         .def = "every core",
         .lo = 1, .hi = 4096},
        {.names = "--dry-run", .type = OPT_FLAG, .dst = &dry, .help = "print the plan, write nothing", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("synth", specs)};
    const OptCommand cmd = {.cmd = "synth", .synopsis = "--preset NAME --out DIR [options]",
                            .about = "Write a random-weight checkpoint in the real Hugging Face layout.",
                            .groups = groups, .n_groups = 1};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    if (!preset_s || (!out && !dry)) {
        fprintf(stderr, "error: synth: %s is required\n", !preset_s ? "--preset" : "--out (or --dry-run)");
        return 2;
    }
    int nvfp4 = !strcmp(quant_s, "nvfp4");
    if (!nvfp4 && strcmp(quant_s, "bf16")) fatal("synth: --quant '%s': expected bf16 or nvfp4", quant_s);
    if (threads > 0) omp_set_num_threads(threads);

    Preset p = *find_preset(preset_s, arch_s);
    if (layers > 0) {
        p.layers = layers;
        if (p.first_k_dense > layers - 1) p.first_k_dense = layers - 1; /* keep at least one MoE layer */
    }
    if (mtp >= 0) p.mtp = mtp;
    int special_base = BUILTIN_ENDOFTEXT;
    CHECK(BUILTIN_VOCAB <= p.vocab, "synth: preset %s: vocab %d cannot hold the built-in tokenizer", p.name, p.vocab);

    /* config.json first, parsed back: the plan is made from what a reader will see */
    json_t *cj = config_json(&p, p.layers, p.mtp, special_base);
    char *config_text = ckpt_json_text(cj);
    json_decref(cj);
    ModelConfig c;
    char err[1024];
    if (config_parse(&c, config_text, "synth config.json", err, sizeof err)) die("synth: own config.json: %s", err);
    CkptPlan plan = {0};
    plan_model(&plan, &c);
    QuantConfig q = {0};
    int n_q = 0;
    if (nvfp4) {
        ckpt_default_excludes(&q, &c, &plan);
        n_q = ckpt_plan_nvfp4(&plan, &q);
    }
    uint64_t bytes = ckpt_plan_bytes(&plan);
    double params = ckpt_plan_params(&plan);
    uint64_t shard_bytes = (uint64_t)shard_mb << 20;
    char b1[32];
    printf("synth: %s %s (%s), layers %d + %d MTP, %s: %.3f B parameters, %s (%llu bytes) of tensors in "
           "shards of <= %d MB%s%s\n",
           c.model_type, p.name, c.architecture, c.n_layers, c.n_mtp_layers, nvfp4 ? "nvfp4" : "bf16", params / 1e9,
           ckpt_fmt_bytes((double)bytes, b1, sizeof b1), (unsigned long long)bytes, shard_mb, out ? " -> " : "",
           out ? out : "");
    if (nvfp4) {
        printf("synth: %d linears in NVFP4; excluded:", n_q);
        for (int i = 0; i < q.n_exclude; i++) printf(" %s", q.exclude[i]);
        printf("\n");
    }
    fflush(stdout);
    if (dry) goto done;

    int64_t avail = ckpt_free_bytes(out);
    uint64_t need = bytes + bytes / 100 + (16u << 20); /* headers, small files, slack */
    if (avail >= 0 && (uint64_t)avail < need) {
        char b2[32];
        fatal("synth: %s: the checkpoint needs %s but the filesystem has only %s free", out,
              ckpt_fmt_bytes((double)need, b1, sizeof b1), ckpt_fmt_bytes((double)avail, b2, sizeof b2));
    }
    if (ckpt_mkdir(out, err, sizeof err)) fatal("synth: %s", err);

    double t0 = clock_now();
    Gen g = {.plan = &plan, .seed = (uint64_t)seed};
    char label[64];
    snprintf(label, sizeof label, "synth %s", p.name);
    if (ckpt_write(&plan, out, shard_bytes, gen_fetch, &g, label, err, sizeof err)) fatal("synth: %s", err);
    for (int s = 0; s < 2; s++) free(g.slot[s].buf);
    double dt = clock_now() - t0;

    char path[4096];
    json_t *gc = generation_config_json(special_base);
    char *gen_text = ckpt_json_text(gc);
    json_decref(gc);
    int rc = nvfp4 ? ckpt_write_nvfp4_configs(out, config_text, &q, err, sizeof err)
                   : ckpt_write_text(out, "config.json", config_text, err, sizeof err);
    if (!rc && !nvfp4) unlink(path_join(path, sizeof path, out, "hf_quant_config.json")); /* from an earlier run */
    if (!rc) rc = ckpt_write_text(out, "generation_config.json", gen_text, err, sizeof err);
    if (!rc) rc = write_tokenizer(out, err, sizeof err);
    if (rc) fatal("synth: %s", err);
    free(gen_text);
    printf("synth: wrote %s in %.1f s (%.1f M parameters/s, %d threads)\n", out, dt, params / 1e6 / (dt > 0 ? dt : 1e-9),
           omp_get_max_threads());

done:
    free(config_text);
    quant_config_free(&q);
    ckpt_plan_free(&plan);
    return 0;
}
