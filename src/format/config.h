/* config: a model's configuration, ModelConfig (the numbers of config.json, in the shape letters
 * of model/model.h, and the shard of one rank), read from config.json with each model family's
 * key variants; and the quantization description: hf_quant_config.json with exclude_modules, or
 * config.json's quantization_config with ignore. */
#ifndef MOESERVE_CONFIG_H
#define MOESERVE_CONFIG_H

#include <stddef.h>

#include <stdint.h>

#define MODEL_MAX_LAYERS 256

#define MODEL_MAX_EOS 8

typedef enum {
    ARCH_GLM4_MOE,    /* Glm4MoeForCausalLM: GQA, partial NeoX RoPE, qk-norm, MoE */
    ARCH_GLM5,        /* GlmMoeDsaForCausalLM: MLA + DSA indexer, interleaved RoPE, MoE */
    ARCH_DEEPSEEK_V3, /* DeepseekV3ForCausalLM: MLA without indexer */
    ARCH_DEEPSEEK_V32,/* DeepseekV32ForCausalLM: MLA + DSA, NeoX indexer RoPE */
} Arch;

typedef enum { SCORE_SIGMOID, SCORE_SOFTMAX } ScoringFunc;

/* Element type of the paged KV cache (model/kv_cache.h; backend/kv_elem.h is the codec). */
typedef enum {
    KV_DTYPE_AUTO,    /* not chosen: see model_kv_dtype */
    KV_DTYPE_F32,
    KV_DTYPE_BF16,    /* rounded to nearest even */
    KV_DTYPE_FP8,     /* float8_e4m3fn of x / scale, saturating at +-448; read back as code * scale */
} KVDtype;
typedef enum { INDEXER_NONE, INDEXER_FULL, INDEXER_SHARED } IndexerType;

typedef struct {
    Arch arch;
    char architecture[64];     /* config "architectures"[0] */
    char model_type[32];       /* config "model_type" */
    int vocab;                 /* V */
    int hidden;                /* D */
    int n_layers;              /* L, without MTP layers */
    int n_heads;               /* H */
    int n_kv_heads;            /* Hkv (GQA; MLA ignores it) */
    int head_dim;              /* Dh (GQA). For MLA this is qk_nope + qk_rope (the q/k head size) */
    int intermediate;          /* Fd, dense MLP */
    int moe_intermediate;      /* F, per routed expert */
    int n_experts;             /* E */
    int n_experts_per_tok;     /* K */
    int n_shared_experts;      /* shared expert width = n_shared_experts * F */
    int first_k_dense;         /* first_k_dense_replace */
    int moe_layer_freq;
    int n_group, topk_group;
    int norm_topk_prob;
    float routed_scaling;
    ScoringFunc scoring;
    float rms_eps;
    /* RoPE */
    double rope_theta;
    float partial_rotary;      /* GQA: fraction of Dh rotated (0.5 for GLM-4.5) */
    int rotary_dim;            /* dims rotated per head: GQA Dh*partial, MLA Dr */
    int rope_interleave;       /* 1: GPT-J pairs (2i, 2i+1) (GLM-5); 0: NeoX halves (GLM-4.5) */
    char rope_type[16];        /* "default" or "yarn" */
    float yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int yarn_original_max_pos;
    int max_position;
    /* GQA attention */
    int attention_bias;        /* q, k, v biases */
    int use_qk_norm;
    /* MLA */
    int q_lora_rank;           /* R (0: no low-rank q path) */
    int kv_lora_rank;          /* C */
    int qk_nope_dim;           /* Dn */
    int qk_rope_dim;           /* Dr */
    int v_head_dim;            /* Dv */
    /* DSA indexer */
    int index_n_heads;         /* Hi */
    int index_head_dim;        /* Di */
    int index_topk;            /* Ki */
    int indexer_rope_interleave;
    /* per layer */
    uint8_t layer_moe[MODEL_MAX_LAYERS];      /* 1: MoE FFN, 0: dense */
    uint8_t layer_indexer[MODEL_MAX_LAYERS];  /* IndexerType */
    int n_mtp_layers;          /* num_nextn_predict_layers (recognised; loaded only for speculation) */
    int mtp_loaded;            /* 1: model_load_mtp loaded the first MTP layer (layers[n_layers], and a KV
                                  cache layer of its own); 0: skipped */
    int tie_embeddings;
    int bos_id, pad_id;        /* -1 when absent */
    int eos_ids[MODEL_MAX_EOS], n_eos;
    float attn_scale;          /* softmax scale: head size^-0.5 (x mscale^2 under YaRN) */
    /* KV cache: what the checkpoint asks for (model_load) and what the command chose */
    int kv_cache_fp8;          /* 1: the quantization config's kv_cache_quant_algo is "FP8" */
    KVDtype kv_dtype;          /* --kv-cache-dtype; KV_DTYPE_AUTO: see model_kv_dtype */
    float kv_scale[MODEL_MAX_LAYERS][2]; /* FP8 cache: per layer the checkpoint's k_scale and
                                            v_scale (ModelOpt, x = code * scale); 0: absent, 1 used */
    /* The shard of one rank (src/dist/plan.h plan_apply). Under tensor parallelism the sizes
     * above are this rank's: n_heads, n_kv_heads, intermediate and moe_intermediate are the
     * slices it holds (the global values are g_*). One rank (config_parse): everything. */
    int tp, tp_rank, pp, pp_rank, ep;
    int dp, dp_rank;             /* attention data parallel (--dp): groups per stage, this rank's group;
                                    tp and tp_rank are then the group's (tp / dp ranks) */
    int layer_begin, layer_end;  /* layers held: [begin, end) (pipeline stage) */
    int expert0, n_local_experts;/* routed experts held (EP): [expert0, expert0 + n_local_experts) */
    int vocab0, vocab_local;     /* lm_head rows held: [vocab0, vocab0 + vocab_local) */
    int head0, kv_head0;         /* first global attention head / KV head held */
    int g_heads, g_kv_heads, g_intermediate, g_moe_intermediate;
} ModelConfig;

/* The shard fields of c for one rank holding everything (config_parse calls it; dist/plan.h
 * plan_apply sets them for one rank of a layout). */
void config_shard_whole(ModelConfig *c);
/* MLA attention (GLM-5, DeepSeek-V3), else GQA (GLM-4.5) */
static inline int config_is_mla(const ModelConfig *c) { return c->arch != ARCH_GLM4_MOE; }

/* "an object", "a list", "a string", ... for messages that name a JSON value's kind */
struct json_t;
const char *json_kind(const struct json_t *v);
/* Parse a config.json text (path is for messages). 0 ok, -1 with err set. */
int config_parse(ModelConfig *c, const char *json_text, const char *path, char *err, size_t errlen);
/* Read dir/config.json. */
int config_load(ModelConfig *c, const char *dir, char *err, size_t errlen);

typedef enum { QALGO_NONE, QALGO_NVFP4, QALGO_W4A16_NVFP4, QALGO_FP8, QALGO_FP8_BLOCK,
               QALGO_MIXED, QALGO_OTHER } QuantAlgo;

typedef struct QuantIndex QuantIndex; /* the exclude patterns compiled (config.c) */

typedef struct {
    QuantAlgo algo;
    char algo_name[32];        /* as written, upper-cased */
    int group_size;            /* 16 for NVFP4 */
    char **exclude;  int n_exclude;   /* exclude_modules / ignore patterns */
    QuantIndex *index;         /* owned, or NULL: exclude compiled by quant_config_load; unused once
                                  n_exclude has changed (then each pattern is tried in turn) */
    char **mixed_names; QuantAlgo *mixed_algo; int n_mixed; /* MIXED_PRECISION quantized_layers */
    char kv_cache_algo[16];    /* "" or "FP8" */
    char source[32];           /* "hf_quant_config.json", "config.json", or "" */
} QuantConfig;

/* Read dir/hf_quant_config.json, else config.json quantization_config. Absent: algo NONE. */
int quant_config_load(QuantConfig *q, const char *dir, char *err, size_t errlen);
/* 1 if module (e.g. "model.layers.3.mlp.gate") matches an exclude pattern: exact, substring,
 * or fnmatch wildcard; "path*" also matches "path" and "path.*" (vLLM is_layer_excluded). */
int quant_config_excluded(const QuantConfig *q, const char *module);
void quant_config_free(QuantConfig *q);

#endif
