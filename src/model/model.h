/* model.h: the data structures of a model: its configuration (config.json), its weights (one
 * rank's shard, in the stored formats) and a Batch (the tokens of one forward step).
 *
 * Shape letters, used everywhere in moeserve:
 *   T tokens in a batch   S sequences      D hidden        V vocab
 *   H attention heads     Hkv KV heads     Dh head dim     L layers
 *   E routed experts      K experts/token  F expert hidden (dense MLP: Fd)
 *   R q_lora_rank         C kv_lora_rank   Dn qk_nope dim  Dr qk_rope dim  Dv v head dim
 *   Hi indexer heads      Di indexer head dim              Ki indexer top-k
 * The maths follow Hugging Face transformers (src/transformers/models/glm_moe_dsa/modeling_glm_moe_dsa.py
 * for GLM-5, models/glm4_moe/modeling_glm4_moe.py for GLM-4.5/4.6/4.7); the checkpoint names are those
 * of the releases on the Hub (zai-org/GLM-5, zai-org/GLM-4.5). */
#ifndef MOESERVE_MODEL_H
#define MOESERVE_MODEL_H

#include <stdint.h>

#include "../format/config.h"
#include "../format/quant.h"
#include "../format/safetensors.h"

struct Backend; /* backend.h */

/* A token's KV entry width (floats per token per layer) and the indexer key width. */
int model_kv_width(const ModelConfig *c);
int model_index_width(const ModelConfig *c);
/* The KV cache dtype of c on a backend: c->kv_dtype when chosen; KV_DTYPE_AUTO: FP8 when the
 * checkpoint asks for it, else float32 on the cpu (host_memory: the reference) and BF16 on a
 * GPU. model_upload stores the answer in the uploaded config, so that the config of a model in
 * backend memory names its cache dtype; a host model left at AUTO gets the cpu's. */
KVDtype model_kv_dtype(const ModelConfig *c, int host_memory);
/* --kv-cache-dtype spellings (vLLM's): auto, float32, bf16 (bfloat16), fp8 (fp8_e4m3); 0 ok, -1 not one */
int model_kv_dtype_parse(const char *s, KVDtype *out);
const char *model_kv_dtype_name(KVDtype t); /* "float32", "bf16", "fp8_e4m3", "auto" */
#define MODEL_KV_DTYPES "auto, float32, bf16 (bfloat16) or fp8 (fp8_e4m3)"

/* Parameters counted from the config alone (model.c says what is counted). */
typedef struct {
    double total;          /* without MTP layers, with embedding and lm_head */
    double total_with_mtp;
    double active;         /* per token, excluding embedding and lm_head */
    double active_with_head; /* plus lm_head */
    double embedding, lm_head;
} ParamCount;
void model_count_params(const ModelConfig *c, ParamCount *out);

/* ---- Weights: one rank's shard, pointing into the mmapped checkpoint. ---- */

typedef struct {
    float *attn_norm;          /* [D] input_layernorm */
    float *ffn_norm;           /* [D] post_attention_layernorm */
    /* GQA (glm4_moe) */
    QTensor wq, wk, wv;        /* [H*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D] */
    float *bq, *bk, *bv;       /* [H*Dh], [Hkv*Dh], [Hkv*Dh] or NULL */
    float *q_norm, *k_norm;    /* [Dh] or NULL */
    QTensor wo;                /* [D, H*Dh] (MLA: [D, H*Dv]) */
    /* MLA (glm5, deepseek) */
    QTensor wq_a;              /* [R, D] */
    float *q_a_norm;           /* [R] */
    QTensor wq_b;              /* [H*(Dn+Dr), R] (or q_proj [H*(Dn+Dr), D] when R == 0) */
    QTensor wkv_a;             /* [C+Dr, D] */
    float *kv_a_norm;          /* [C] */
    QTensor wkv_b;             /* [H*(Dn+Dv), C] */
    QTensor wqkv_a;            /* [R+C+Dr, D]: wq_a and wkv_a as one GEMM (load.c fuse; they are then
                                  empty), or empty */
    /* DSA indexer (absent on "shared" layers) */
    QTensor idx_wq_b;          /* [Hi*Di, R] */
    QTensor idx_wk;            /* [Di, D] */
    QTensor idx_wproj;         /* [Hi, D] weights_proj */
    float *idx_norm_w, *idx_norm_b; /* [Di] LayerNorm */
    /* dense MLP */
    QTensor w_gate, w_up;      /* [Fd, D] */
    QTensor w_gate_up;         /* [2 Fd, D]: w_gate and w_up as one GEMM (fuse), or empty */
    QTensor w_down;            /* [D, Fd] */
    /* MoE */
    QTensor router;            /* [E, D] */
    float *router_bias;        /* [E] e_score_correction_bias, or NULL */
    QTensor *exp_gate, *exp_up; /* [E] of [F, D] */
    QTensor *exp_down;         /* [E] of [D, F] */
    const QTensor *exp_table;  /* [3, E] gate, up, down QTensors in backend memory (device
                                  backends; the kernels read it), NULL on the cpu */
    QTensor sh_gate, sh_up;    /* [F*n_shared, D] */
    QTensor sh_gate_up;        /* [2 F*n_shared, D]: sh_gate and sh_up fused, or empty */
    QTensor sh_down;           /* [D, F*n_shared] */
} LayerWeights;

/* A layer's linears but the routed experts', in one order: what load.c counts, upload.c copies
 * and the tests compare (one list, so that a linear added to LayerWeights is not missed by one) */
#define LAYER_LINEARS 21
static inline void layer_linears(const LayerWeights *w, const QTensor *out[LAYER_LINEARS])
{
    const QTensor *t[LAYER_LINEARS] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wq_a, &w->wq_b, &w->wkv_a, &w->wkv_b,
                                       &w->idx_wq_b, &w->idx_wk, &w->idx_wproj, &w->w_gate, &w->w_up, &w->w_down,
                                       &w->router, &w->sh_gate, &w->sh_up, &w->sh_down, &w->wqkv_a, &w->w_gate_up,
                                       &w->sh_gate_up};
    for (int i = 0; i < LAYER_LINEARS; i++) out[i] = t[i];
}

/* The multi-token-prediction (nextn) layer's own weights beside its decoder layer (mtp.c says what
 * it computes): model.layers.L.{enorm, hnorm, eh_proj, shared_head.norm, shared_head.head,
 * embed_tokens}, L = num_hidden_layers. A checkpoint without the layer's own embed_tokens or
 * shared_head.head shares the model's (views, no bytes of their own). */
typedef struct {
    float *enorm, *hnorm;      /* [D] */
    QTensor eh_proj;           /* [D, 2D]: columns 0..D read the normed embedding, D..2D the normed hidden */
    float *head_norm;          /* [D] shared_head.norm */
    QTensor head;              /* [V, D] shared_head.head, or the model's lm_head */
    QTensor embed;             /* [V, D] the layer's embed_tokens, or the model's */
    int own_head, own_embed;   /* 1: the layer's own tensors (bytes of their own) */
} MtpWeights;

typedef struct {
    ModelConfig cfg;
    SafeTensors st;            /* the mmapped checkpoint the QTensors point into */
    QTensor embed;             /* [V, D] */
    QTensor lm_head;           /* [V, D] */
    float *final_norm;         /* [D] */
    LayerWeights *layers;      /* [L + 1]: the last the MTP layer's (cfg.mtp_loaded), else empty */
    MtpWeights mtp;            /* cfg.mtp_loaded: the MTP layer's own weights */
    QFormat dummy_fmt;         /* dummy: the format its quantised linears were made in */
    void *dev_buffer;          /* uploaded models: the one backend allocation holding every weight */
    int dummy;                 /* weights are skeletons (data NULL) that model_upload fills randomly */
    void **owned;              /* host copies this Model frees (column slices of a TP shard) */
    int n_owned;
    int n_fused;               /* pairs of linears fused into one GEMM (load.c fuse) */
    double bytes_by_format[QF_COUNT]; /* weight bytes loaded per storage format */
    int64_t params_by_format[QF_COUNT];
} Model;

/* Load config.json and the checkpoint of dir. Malformed input stops with one line naming
 * the file and the tensor (a start-up error: die, src/base/util.h). */
void model_load(Model *m, const char *dir);
/* The same for one rank of a parallel layout: config.json, then shard(cfg, user) turns the
 * config into the rank's shard (src/dist/plan.h plan_apply), then only the tensors (and for
 * a column slice, only the bytes) of that shard are read from the mapped files. */
void model_load_shard(Model *m, const char *dir, void (*shard)(ModelConfig *c, void *user), void *user);
void model_load_dummy_shard(Model *m, const char *dir, QFormat fmt, int n_layers,
                            void (*shard)(ModelConfig *c, void *user), void *user);
/* The linear weight stored under prefix (e.g. "model.layers.3.mlp.experts.7.up_proj"), its
 * precision decided per tensor, from what is stored: NVFP4 if <p>.weight is U8 with <p>.weight_scale
 * (F8_E4M3) and <p>.weight_scale_2; FP8 per tensor if <p>.weight is F8_E4M3 with a scalar
 * <p>.weight_scale; 128x128 block FP8 if <p>.weight_scale_inv exists; else BF16/F16/F32.
 * Returns 1 found, 0 absent (no <p>.weight), -1 malformed (err names file and tensor). */
int load_qtensor(const SafeTensors *st, const char *prefix, QTensor *w, char *err, size_t errlen);
void model_free(Model *m);
/* Speculative decoding: load the checkpoint's first MTP layer (model.layers.L, L = num_hidden_layers:
 * a full decoder layer and MtpWeights) into m->layers[L] and m->mtp, and set cfg.mtp_loaded; dummy
 * weights get skeletons of it. One rank only (a sharded model stops with an error), and a model
 * without MTP layers (num_nextn_predict_layers 0) stops with one that says so. */
void model_load_mtp(Model *m, const char *dir);

/* The weights of src copied into backend memory in one allocation (repacked per format as the
 * backend's kernels want them), for backends whose memory is not the host's. dst shares
 * nothing with src; free it with model_upload_free. */
void model_upload(Model *dst, const Model *src, struct Backend *be);
/* --dummy-weights: a Model of skeleton weights from config.json alone (dir needs no checkpoint
 * files), in the formats a release would use: the directory's quantization config if it has one,
 * else fmt (QF_NVFP4, QF_FP8 or QF_BF16) for every linear but lm_head, embeddings and routers.
 * n_layers > 0 keeps only the first n_layers. model_upload then fills it with random weights on
 * the backend (seeded, the same values on every backend). */
void model_load_dummy(Model *m, const char *dir, QFormat fmt, int n_layers);
void model_upload_free(Model *m, struct Backend *be);


#endif
