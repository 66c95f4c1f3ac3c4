/* cmd_info: `moeserve info --model DIR [--json]` describes a model directory: architecture,
 * layer mix, attention, experts, parameter counts (model_count_params, src/model/model.c),
 * KV-cache bytes per token and the precision of every kind of linear module. With safetensors
 * present the precision is read from the tensors themselves (load_qtensor); with only
 * config.json it is predicted from the quantization config on the module names a release
 * stores. --json prints one JSON object (the fields the tests assert). */
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../format/config.h"
#include "../format/safetensors.h"
#include "../backend/backend.h"
#include "../cost/memory.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "../engine/engine.h"
#include "cli.h"
#include <math.h>

/* ---- types ---- */

typedef enum {
    KIND_ATTN, KIND_INDEXER, KIND_ROUTER, KIND_DENSE, KIND_EXPERTS, KIND_SHARED,
    KIND_EMBED, KIND_LM_HEAD, KIND_MTP, KIND_OTHER, KIND_COUNT
} Kind;

static const char *const kind_names[KIND_COUNT] = {
    "attention", "indexer", "router", "dense_mlp", "experts", "shared_experts",
    "embedding", "lm_head", "mtp", "other",
};

/* Precision labels: the QFormats, plus one for a quantization the engine does not read. */
#define LABEL_OTHER QF_COUNT
#define N_LABELS (QF_COUNT + 1)

typedef struct {
    int64_t modules, params;
    double bytes;
} Tally;

typedef struct {
    Tally t[KIND_COUNT][N_LABELS];   /* linear modules by kind and precision */
    Tally plain;                     /* checkpoint tensors that are not linears: norms, biases */
    char other_name[32];             /* label of LABEL_OTHER ("compressed-tensors", ...) */
    const char *source;              /* "checkpoint", "hf_quant_config.json", "config.json", "none" */
} Precision;

/* ---- helpers ---- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The kind of a linear module from its checkpoint name (the names of the zai-org releases). */
static Kind kind_of(const ModelConfig *c, const char *name)
{
    int layer;
    int off = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &off) == 1 && off > 0) {
        const char *rest = name + off;
        if (layer >= c->n_layers) return KIND_MTP;
        if (!strncmp(rest, "self_attn.indexer.", 18)) return KIND_INDEXER;
        if (!strncmp(rest, "self_attn.", 10)) return KIND_ATTN;
        if (!strncmp(rest, "mlp.experts.", 12)) return KIND_EXPERTS;
        if (!strncmp(rest, "mlp.shared_experts.", 19)) return KIND_SHARED;
        if (!strcmp(rest, "mlp.gate")) return KIND_ROUTER;
        if (!strncmp(rest, "mlp.", 4)) return KIND_DENSE;
        return KIND_OTHER;
    }
    if (ends_with(name, "embed_tokens")) return KIND_EMBED;
    if (!strcmp(name, "lm_head")) return KIND_LM_HEAD;
    return KIND_OTHER;
}

static const char *label_name(const Precision *p, int label)
{
    return label == LABEL_OTHER ? p->other_name : qformat_name((QFormat)label);
}

static int has_safetensors(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)))
        found = ends_with(e->d_name, ".safetensors") || !strcmp(e->d_name, "model.safetensors.index.json");
    closedir(d);
    return found;
}

/* ---- precision predicted from the quantization config ---- */

static int algo_label(QuantAlgo a)
{
    switch (a) {
    case QALGO_NONE: return QF_BF16;
    case QALGO_NVFP4: case QALGO_W4A16_NVFP4: return QF_NVFP4;
    case QALGO_FP8: return QF_FP8;
    case QALGO_FP8_BLOCK: return QF_FP8_BLOCK;
    default: return LABEL_OTHER;
    }
}

/* The precision a module would have under q: excluded modules and embeddings (ModelOpt and
   block-FP8 quantize nn.Linear only) stay BF16; MIXED_PRECISION names its quantized layers. */
static int predicted_label(const QuantConfig *q, const char *name, Kind kind)
{
    if (q->algo == QALGO_MIXED) {
        for (int i = 0; i < q->n_mixed; i++)
            if (!strcmp(q->mixed_names[i], name)) return algo_label(q->mixed_algo[i]);
        return QF_BF16;
    }
    if (q->algo == QALGO_NONE || kind == KIND_EMBED || quant_config_excluded(q, name)) return QF_BF16;
    return algo_label(q->algo);
}

static void tally_add(Precision *p, Kind kind, int label, int64_t rows, int64_t cols, double bytes)
{
    Tally *t = &p->t[kind][label];
    t->modules++;
    t->params += rows * cols;
    t->bytes += bytes;
}

/* One module of the release layout: classify it and add it with its predicted storage size. */
static void predict_one(Precision *p, const ModelConfig *c, const QuantConfig *q, const char *name,
                        int64_t rows, int64_t cols)
{
    Kind kind = kind_of(c, name);
    int label = predicted_label(q, name, kind);
    double bytes = rows * cols * 2.0;
    if (label != LABEL_OTHER) {
        QTensor w = {.fmt = (QFormat)label, .rows = rows, .cols = cols, .scale_dtype = DT_F32, .gscale = 1.0f,
                     .name = name};
        bytes = qtensor_bytes(&w);
    }
    tally_add(p, kind, label, rows, cols, bytes);
}

/* Walk every linear module a release checkpoint stores through predict_one. */
static void predict_precision(Precision *p, const ModelConfig *c, const QuantConfig *q)
{
    const int64_t D = c->hidden, H = c->n_heads, F = c->moe_intermediate, Fs = F * c->n_shared_experts;
    char name[256];
#define MOD(rows, cols, ...) do { snprintf(name, sizeof name, __VA_ARGS__); \
        predict_one(p, c, q, name, (rows), (cols)); } while (0)
    for (int l = 0; l < c->n_layers + c->n_mtp_layers; l++) {
        if (!config_is_mla(c)) {
            const int64_t Dh = c->head_dim, Hkv = c->n_kv_heads;
            MOD(H * Dh, D, "model.layers.%d.self_attn.q_proj", l);
            MOD(Hkv * Dh, D, "model.layers.%d.self_attn.k_proj", l);
            MOD(Hkv * Dh, D, "model.layers.%d.self_attn.v_proj", l);
            MOD(D, H * Dh, "model.layers.%d.self_attn.o_proj", l);
        } else {
            const int64_t R = c->q_lora_rank, C = c->kv_lora_rank, Dq = c->qk_nope_dim + c->qk_rope_dim;
            if (R > 0) {
                MOD(R, D, "model.layers.%d.self_attn.q_a_proj", l);
                MOD(H * Dq, R, "model.layers.%d.self_attn.q_b_proj", l);
            } else {
                MOD(H * Dq, D, "model.layers.%d.self_attn.q_proj", l);
            }
            MOD(C + c->qk_rope_dim, D, "model.layers.%d.self_attn.kv_a_proj_with_mqa", l);
            MOD(H * (c->qk_nope_dim + c->v_head_dim), C, "model.layers.%d.self_attn.kv_b_proj", l);
            MOD(D, H * c->v_head_dim, "model.layers.%d.self_attn.o_proj", l);
        }
        if (c->layer_indexer[l] == INDEXER_FULL) {
            const int64_t Hi = c->index_n_heads, Di = c->index_head_dim;
            MOD(Hi * Di, c->q_lora_rank, "model.layers.%d.self_attn.indexer.wq_b", l);
            MOD(Di, D, "model.layers.%d.self_attn.indexer.wk", l);
            MOD(Hi, D, "model.layers.%d.self_attn.indexer.weights_proj", l);
        }
        if (c->layer_moe[l]) {
            MOD(c->n_experts, D, "model.layers.%d.mlp.gate", l);
            for (int e = 0; e < c->n_experts; e++) {
                MOD(F, D, "model.layers.%d.mlp.experts.%d.gate_proj", l, e);
                MOD(F, D, "model.layers.%d.mlp.experts.%d.up_proj", l, e);
                MOD(D, F, "model.layers.%d.mlp.experts.%d.down_proj", l, e);
            }
            if (Fs > 0) {
                MOD(Fs, D, "model.layers.%d.mlp.shared_experts.gate_proj", l);
                MOD(Fs, D, "model.layers.%d.mlp.shared_experts.up_proj", l);
                MOD(D, Fs, "model.layers.%d.mlp.shared_experts.down_proj", l);
            }
        } else {
            MOD(c->intermediate, D, "model.layers.%d.mlp.gate_proj", l);
            MOD(c->intermediate, D, "model.layers.%d.mlp.up_proj", l);
            MOD(D, c->intermediate, "model.layers.%d.mlp.down_proj", l);
        }
        if (l >= c->n_layers) MOD(D, 2 * D, "model.layers.%d.eh_proj", l);
    }
    MOD(c->vocab, D, "model.embed_tokens");
    if (!c->tie_embeddings) MOD(c->vocab, D, "lm_head");
#undef MOD
    if (q->algo == QALGO_OTHER) /* label it as written, lower case ("nvfp4-pack-quantized") */
        for (size_t i = 0; i < sizeof p->other_name; i++)
            p->other_name[i] = (char)tolower((unsigned char)q->algo_name[i]);
}

/* ---- precision read from the checkpoint ---- */

/* Tensors that belong to a linear's quantization (counted in its bytes by qtensor_bytes). */
static int is_aux_tensor(const char *name)
{
    static const char *const aux[] = {".weight_scale", ".weight_scale_2", ".weight_scale_inv",
                                      ".input_scale", ".k_scale", ".v_scale", ".output_scale"};
    for (size_t i = 0; i < sizeof aux / sizeof aux[0]; i++)
        if (ends_with(name, aux[i])) return 1;
    return 0;
}

static void read_precision(Precision *p, const ModelConfig *c, const char *dir)
{
    SafeTensors st = {0};
    char err[1024];
    if (safetensors_open_dir(&st, dir, err, sizeof err)) fatal("%s", err);
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        if (is_aux_tensor(t->name)) continue;
        if (t->ndim == 3 && (t->dtype == DT_BF16 || t->dtype == DT_F16 || t->dtype == DT_F32)) {
            /* fused experts as transformers 5 saves them: gate_up_proj [E, 2F, D], down_proj [E, D, F] */
            int label = t->dtype == DT_BF16 ? QF_BF16 : t->dtype == DT_F16 ? QF_F16 : QF_F32;
            Tally *y = &p->t[kind_of(c, t->name)][label];
            y->modules += t->shape[0];
            y->params += t->numel;
            y->bytes += (double)t->nbytes;
            continue;
        }
        if (!(t->ndim == 2 && ends_with(t->name, ".weight"))) {
            p->plain.modules++;
            p->plain.params += t->numel;
            p->plain.bytes += (double)t->nbytes;
            continue;
        }
        char prefix[512];
        size_t n = strlen(t->name) - strlen(".weight");
        if (n >= sizeof prefix) fatal("%s: tensor name too long: %.80s...", safetensors_file_of(&st, t), t->name);
        memcpy(prefix, t->name, n);
        prefix[n] = 0;
        QTensor w;
        int rc = load_qtensor(&st, prefix, &w, err, sizeof err);
        if (rc < 0) fatal("%s", err);
        if (rc == 0) continue;
        tally_add(p, kind_of(c, prefix), w.fmt, w.rows, w.cols, qtensor_bytes(&w));
    }
    safetensors_free(&st);
    p->source = "checkpoint";
}

/* ---- output ---- */

static int count_layers(const ModelConfig *c, int moe)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_moe[l] == moe;
    return n;
}

static int count_indexer(const ModelConfig *c, int type)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_indexer[l] == type;
    return n;
}

static const char *attention_kind(const ModelConfig *c)
{
    if (!config_is_mla(c)) return "GQA";
    return model_index_width(c) ? "MLA+DSA" : "MLA";
}

/* KV cache bytes per token in BF16: the attention entry of every layer, and the indexer keys of
   every layer that runs its own indexer (shared layers reuse an earlier top-k). */
static int64_t kv_bytes(const ModelConfig *c) { return 2LL * model_kv_width(c) * c->n_layers; }
static int64_t index_bytes(const ModelConfig *c)
{
    return 2LL * model_index_width(c) * count_indexer(c, INDEXER_FULL);
}

/* Parameters as quoted ("743.91 B" = billions; tiny models in M, K) and bytes in GB, MB, ... */
static const char *human(double v, int bytes, char *buf, size_t n)
{
    if (!bytes) {
        if (v >= 1e9) snprintf(buf, n, "%.2f B", v / 1e9);
        else if (v >= 1e6) snprintf(buf, n, "%.2f M", v / 1e6);
        else if (v >= 1e3) snprintf(buf, n, "%.2f K", v / 1e3);
        else snprintf(buf, n, "%.0f", v);
        return buf;
    }
    static const char *const unit[] = {"B", "KB", "MB", "GB", "TB"};
    int k = 0;
    while (k < 4 && v >= 1e3) { v /= 1e3; k++; }
    snprintf(buf, n, k ? "%.2f %s" : "%.0f %s", v, unit[k]);
    return buf;
}

/* "bf16" or "nvfp4 (57600), bf16 (390)": the precisions of one kind, by module count. */
static void kind_summary(const Precision *p, int k, char *buf, size_t n)
{
    int used = 0;
    buf[0] = 0;
    for (int l = 0; l < N_LABELS; l++) used += p->t[k][l].modules > 0;
    for (int l = 0; l < N_LABELS; l++) {
        if (!p->t[k][l].modules) continue;
        size_t len = strlen(buf);
        if (used == 1) snprintf(buf + len, n - len, "%s", label_name(p, l));
        else snprintf(buf + len, n - len, "%s%s (%lld)", len ? ", " : "", label_name(p, l),
                      (long long)p->t[k][l].modules);
    }
}

/* Parameters held by the tallied tensors (linears and the rest). */
static double stored_params(const Precision *p)
{
    double n = (double)p->plain.params;
    for (int k = 0; k < KIND_COUNT; k++)
        for (int l = 0; l < N_LABELS; l++) n += (double)p->t[k][l].params;
    return n;
}

static void print_text(const char *dir, const ModelConfig *c, const ParamCount *pc, const QuantConfig *q,
                       const Precision *p)
{
    printf("model         %s\n", dir);
    printf("architecture  %s (%s)\n", c->architecture, c->model_type);
    printf("layers        %d: %d dense + %d MoE", c->n_layers, count_layers(c, 0), count_layers(c, 1));
    if (c->n_mtp_layers) printf(", + %d MTP", c->n_mtp_layers);
    printf("\nhidden        %d\n", c->hidden);
    if (config_is_mla(c)) {
        printf("attention     %s, %d heads, q_lora %d, kv_lora %d, qk %d+%d, v %d", attention_kind(c), c->n_heads,
               c->q_lora_rank, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim);
    } else {
        printf("attention     GQA, %d heads / %d KV heads x %d%s%s", c->n_heads, c->n_kv_heads, c->head_dim,
               c->attention_bias ? ", qkv bias" : "", c->use_qk_norm ? ", qk-norm" : "");
    }
    printf(", %s RoPE on %d dims, theta %g%s\n", c->rope_interleave ? "interleaved" : "NeoX", c->rotary_dim,
           c->rope_theta, strcmp(c->rope_type, "yarn") ? "" : " (YaRN)");
    if (model_index_width(c))
        printf("indexer       %d heads x %d, top-%d, %s RoPE, %d full + %d shared layers\n", c->index_n_heads,
               c->index_head_dim, c->index_topk, c->indexer_rope_interleave ? "interleaved" : "NeoX",
               count_indexer(c, INDEXER_FULL), count_indexer(c, INDEXER_SHARED));
    if (c->n_experts)
        printf("experts       %d routed + %d shared, top-%d, F %d, %s router, groups %d/%d, scale %g\n",
               c->n_experts, c->n_shared_experts, c->n_experts_per_tok, c->moe_intermediate,
               c->scoring == SCORE_SIGMOID ? "sigmoid" : "softmax", c->topk_group, c->n_group,
               (double)c->routed_scaling);
    printf("dense MLP     %d\n", c->intermediate);
    printf("vocab         %d%s\n", c->vocab, c->tie_embeddings ? " (tied embeddings)" : "");
    printf("context       %d\n", c->max_position);
    char h1[32], h2[32], h3[32], h4[32];
    printf("parameters    %s total, %s with MTP; active %s (%s with lm_head)\n", human(pc->total, 0, h1, 32),
           human(pc->total_with_mtp, 0, h2, 32), human(pc->active, 0, h3, 32), human(pc->active_with_head, 0, h4, 32));
    if (!strcmp(p->source, "checkpoint"))
        printf("stored        %s parameters in the checkpoint's tensors\n", human(stored_params(p), 0, h1, 32));
    printf("KV cache      %lld B/token in BF16 (%d values x %d layers)", (long long)kv_bytes(c), model_kv_width(c),
           c->n_layers);
    if (model_index_width(c)) printf(", indexer keys %lld B/token", (long long)index_bytes(c));
    printf("\n");
    if (!strcmp(p->source, "checkpoint")) {
        printf("precision     read from the checkpoint tensors");
        if (q->algo != QALGO_NONE) printf(" (%s says %s)", q->source, q->algo_name);
    } else if (q->algo == QALGO_NONE) {
        printf("precision     no quantization config: BF16 release layout");
    } else {
        printf("precision     predicted from %s: %s", q->source, q->algo_name);
        if (q->group_size) printf(", group %d", q->group_size);
        printf(", %d exclude patterns", q->n_exclude);
    }
    if (q->kv_cache_algo[0]) printf(", KV cache %s", q->kv_cache_algo);
    printf("\n");
    for (int k = 0; k < KIND_COUNT; k++) {
        char buf[256];
        kind_summary(p, k, buf, sizeof buf);
        if (buf[0]) printf("  %-14s %s\n", kind_names[k], buf);
    }
    for (int l = 0; l < N_LABELS; l++) {
        Tally sum = {0};
        char kinds[256] = "";
        for (int k = 0; k < KIND_COUNT; k++) {
            const Tally *t = &p->t[k][l];
            if (!t->modules) continue;
            sum.modules += t->modules;
            sum.params += t->params;
            sum.bytes += t->bytes;
            size_t len = strlen(kinds);
            snprintf(kinds + len, sizeof kinds - len, "%s%s", len ? ", " : "", kind_names[k]);
        }
        if (sum.modules)
            printf("  %-10s %7lld linears %10s params %10s  %s\n", label_name(p, l), (long long)sum.modules,
                   human((double)sum.params, 0, h1, 32), human(sum.bytes, 1, h2, 32), kinds);
    }
    if (p->plain.modules)
        printf("  %-10s %7lld tensors %10s params %10s  norms, biases, router bias\n", "non-linear",
               (long long)p->plain.modules, human((double)p->plain.params, 0, h1, 32),
               human(p->plain.bytes, 1, h2, 32));
}

static json_t *tally_json(const Tally *t)
{
    return json_pack("{s:I, s:I, s:f}", "modules", (json_int_t)t->modules, "params", (json_int_t)t->params,
                     "bytes", t->bytes);
}

typedef struct Layout_ Layout;
static void print_layout(const char *dir, const ModelConfig *whole, const QuantConfig *q, Layout *lo, int as_json, json_t *jo);

static void print_json(const char *dir, const ModelConfig *c, const ParamCount *pc, const QuantConfig *q,
                       const Precision *p, Layout *lo)
{
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(dir));
    json_object_set_new(o, "architecture", json_string(c->architecture));
    json_object_set_new(o, "model_type", json_string(c->model_type));
    json_object_set_new(o, "layers", json_integer(c->n_layers));
    json_object_set_new(o, "dense_layers", json_integer(count_layers(c, 0)));
    json_object_set_new(o, "moe_layers", json_integer(count_layers(c, 1)));
    json_object_set_new(o, "mtp_layers", json_integer(c->n_mtp_layers));
    json_object_set_new(o, "hidden", json_integer(c->hidden));
    json_object_set_new(o, "heads", json_integer(c->n_heads));
    json_object_set_new(o, "kv_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "attention", json_string(attention_kind(c)));
    json_object_set_new(o, "rotary_dim", json_integer(c->rotary_dim));
    json_object_set_new(o, "rope_interleave", json_boolean(c->rope_interleave));
    if (model_index_width(c))
        json_object_set_new(o, "indexer", json_pack("{s:i, s:i, s:i, s:i, s:i}", "heads", c->index_n_heads,
                            "head_dim", c->index_head_dim, "topk", c->index_topk,
                            "full_layers", count_indexer(c, INDEXER_FULL),
                            "shared_layers", count_indexer(c, INDEXER_SHARED)));
    json_object_set_new(o, "experts", json_pack("{s:i, s:i, s:i, s:i}", "routed", c->n_experts, "shared",
                        c->n_shared_experts, "top_k", c->n_experts_per_tok, "intermediate", c->moe_intermediate));
    json_object_set_new(o, "intermediate", json_integer(c->intermediate));
    json_object_set_new(o, "vocab", json_integer(c->vocab));
    json_object_set_new(o, "context_length", json_integer(c->max_position));
    json_object_set_new(o, "params", json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}",
                        "total", (json_int_t)pc->total, "total_with_mtp", (json_int_t)pc->total_with_mtp,
                        "active", (json_int_t)pc->active, "active_with_head", (json_int_t)pc->active_with_head,
                        "embedding", (json_int_t)pc->embedding, "lm_head", (json_int_t)pc->lm_head));
    json_object_set_new(o, "kv_bytes_per_token", json_integer(kv_bytes(c)));
    json_object_set_new(o, "index_bytes_per_token", json_integer(index_bytes(c)));

    json_t *prec = json_object();
    json_object_set_new(prec, "source", json_string(p->source));
    json_object_set_new(prec, "quant_config", json_string(q->source));
    json_object_set_new(prec, "quant_algo", json_string(q->algo_name));
    json_object_set_new(prec, "group_size", json_integer(q->group_size));
    json_object_set_new(prec, "kv_cache_quant_algo", json_string(q->kv_cache_algo));
    json_object_set_new(prec, "exclude_patterns", json_integer(q->n_exclude));
    json_t *kinds = json_object(), *formats = json_object();
    for (int k = 0; k < KIND_COUNT; k++) {
        json_t *byfmt = json_object();
        for (int l = 0; l < N_LABELS; l++)
            if (p->t[k][l].modules) json_object_set_new(byfmt, label_name(p, l), tally_json(&p->t[k][l]));
        if (json_object_size(byfmt)) json_object_set_new(kinds, kind_names[k], byfmt);
        else json_decref(byfmt);
    }
    for (int l = 0; l < N_LABELS; l++) {
        Tally sum = {0};
        json_t *names = json_array();
        for (int k = 0; k < KIND_COUNT; k++) {
            const Tally *t = &p->t[k][l];
            if (!t->modules) continue;
            sum.modules += t->modules;
            sum.params += t->params;
            sum.bytes += t->bytes;
            json_array_append_new(names, json_string(kind_names[k]));
        }
        if (!sum.modules) { json_decref(names); continue; }
        json_t *f = tally_json(&sum);
        json_object_set_new(f, "kinds", names);
        json_object_set_new(formats, label_name(p, l), f);
    }
    json_object_set_new(prec, "kinds", kinds);
    json_object_set_new(prec, "formats", formats);
    if (p->plain.modules) json_object_set_new(prec, "other_tensors", tally_json(&p->plain));
    if (!strcmp(p->source, "checkpoint"))
        json_object_set_new(prec, "stored_params", json_integer((json_int_t)stored_params(p)));
    json_object_set_new(o, "precision", prec);

    if (lo) print_layout(dir, c, q, lo, 1, o);
    out_json(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
}

/* ---- the memory of each rank under a layout (--tp/--pp/--ep, --gpu-mem) ---- */

struct Layout_ {
    ParOpts par;
    double gpu_gb;             /* 0: not given */
    int max_batch_tokens, max_running, max_model_len;
    KVDtype kv_dtype;
};

typedef struct { ParOpts *par; int rank; } ShardCtx;

static void shard_rank(ModelConfig *c, void *user)
{
    ShardCtx *s = user;
    char err[512];
    if (plan_check(c, s->par, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    plan_apply(c, s->par, s->rank);
}

static void print_layout(const char *dir, const ModelConfig *whole, const QuantConfig *q, Layout *lo, int as_json, json_t *jo)
{
    char err[512];
    if (par_resolve(&lo->par, err, sizeof err) < 0) { fprintf(stderr, "error: %s\n", err); exit(1); }
    ParOpts *p = &lo->par;
    if (plan_check(whole, p, err, sizeof err) < 0) { fprintf(stderr, "error: %s\n", err); exit(1); }
    int world = par_world(p), real = has_safetensors(dir);
    QFormat fmt = q->algo == QALGO_NVFP4 ? QF_NVFP4 : q->algo == QALGO_FP8 || q->algo == QALGO_FP8_BLOCK ? QF_FP8 : QF_BF16;
    double gpu = lo->gpu_gb * 1e9, reserve = COST_RESERVE_BYTES;
    json_t *ranks = json_array();
    if (!as_json)
        printf("\nlayout: tp %d, pp %d, ep %d, dp %d = %d ranks%s%s\n%-6s %-8s %10s %10s %10s %12s %14s %12s\n",
               p->tp, p->pp, p->ep, p->dp, world, lo->gpu_gb > 0 ? ", GPU memory " : "", lo->gpu_gb > 0 ? "given" : "",
               "stage", "layers", "weights", "(NVFP4)", "activ.", "KV B/token", "KV tokens", "requests");
    int fits = 1;
    double kv_min = -1; /* the KV tokens of the stage that holds the fewest (a rank's; its group's) */
    char worst[256] = "";
    for (int s = 0; s < p->pp; s++) {
        ShardCtx ctx = {p, s * p->tp}; /* tensor rank 0 of the stage: every rank of a stage holds as much */
        Model m;
        if (real) model_load_shard(&m, dir, shard_rank, &ctx);
        else model_load_dummy_shard(&m, dir, fmt, 0, shard_rank, &ctx);
        ModelConfig *c = &m.cfg;
        c->kv_dtype = lo->kv_dtype != KV_DTYPE_AUTO ? lo->kv_dtype : model_kv_dtype(c, 0);
        CostRankMem rm; /* the rule plan shares (src/cost/memory.h) */
        cost_rank_memory(&m, lo->max_batch_tokens, lo->max_running, gpu, reserve, &rm);
        double w = rm.weight_bytes, kv_tok = rm.kv_bytes_per_token, act = rm.activation_bytes;
        double left = rm.left_bytes, kv_tokens = rm.kv_tokens;
        double reqs = kv_tokens / lo->max_model_len;
        if (kv_min < 0 || kv_tokens < kv_min) kv_min = kv_tokens;
        if (lo->gpu_gb > 0 && (left <= 0 || kv_tokens < lo->max_model_len)) {
            if (fits) snprintf(worst, sizeof worst, "stage %d: weights %.1f GB + activations %.1f GB leave %s", s, w / 1e9,
                               act / 1e9, left <= 0 ? "nothing for the KV cache" : "less KV cache than one --max-model-len request");
            fits = 0;
        }
        if (!as_json) {
            printf("%-6d %3d..%-3d %8.2f GB %7.2f GB %7.2f GB %12.0f", s, c->layer_begin, c->layer_end - 1, w / 1e9,
                   m.bytes_by_format[QF_NVFP4] / 1e9, act / 1e9, kv_tok);
            if (lo->gpu_gb > 0) printf(" %14.0f %12.1f\n", kv_tokens, reqs);
            else printf(" %14s %12s\n", "-", "-");
        }
        json_array_append_new(ranks, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "stage", s, "layer_begin",
                                               c->layer_begin, "layer_end", c->layer_end, "weight_bytes", w, "nvfp4_bytes",
                                               m.bytes_by_format[QF_NVFP4], "bf16_bytes", m.bytes_by_format[QF_BF16],
                                               "activation_bytes", act, "kv_bytes_per_token", kv_tok, "kv_tokens", kv_tokens,
                                               "requests_at_max_len", reqs));
        model_free(&m);
    }
    /* distinct positions the deployment holds: a group's ranks hold the same tokens (MLA whole,
     * GQA a slice of the heads each), the stages each their layers of them, the groups different ones */
    double kv_total = (kv_min > 0 ? kv_min : 0) * p->dp;
    if (!as_json) {
        printf("(per rank; the %d tensor ranks of a stage hold the same; MLA keeps its latent KV cache whole on each)\n", p->tp);
        if (lo->gpu_gb > 0)
            printf("KV tokens, the whole deployment: %.0f (%d attention group%s x the fewest of a stage)\n", kv_total,
                   p->dp, p->dp > 1 ? "s" : "");
        if (lo->gpu_gb > 0)
            printf("%s: %s%s\n", fits ? "fits" : "does not fit", fits ? "every rank has room for its weights, activations and at least one request of --max-model-len " : "",
                   fits ? "" : worst);
    }
    if (jo) {
        json_object_set_new(jo, "layout",
                            json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:i, s:i, s:b, s:f, s:o}", "tp", p->tp, "pp",
                                      p->pp, "ep", p->ep, "dp", p->dp, "ranks", world, "gpu_mem_gb", lo->gpu_gb,
                                      "max_batch_tokens", lo->max_batch_tokens, "max_running", lo->max_running,
                                      "max_model_len", lo->max_model_len, "fits", fits, "kv_tokens_total", kv_total,
                                      "stages", ranks));
    } else {
        json_decref(ranks);
    }
}

/* ---- command ---- */

int cmd_info(int argc, char **argv)
{
    ModelOpts mo = {0};
    int as_json = 0;
    Layout lo = {.max_batch_tokens = 2048, .max_running = 64, .max_model_len = 0};
    const OptSpec specs[] = {
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON object", .def = "off"},
    };
    const OptSpec layout_specs[] = {
        {.names = "--gpu-mem", .type = OPT_DOUBLE, .dst = &lo.gpu_gb, .metavar = "GB",
         .help = "memory of each GPU: does the layout fit, and how many KV tokens", .lo = 0.1, .hi = 1e6},
        {.names = ENGINE_MAX_BATCH_TOKENS_NAMES, .type = OPT_INT, .dst = &lo.max_batch_tokens, .metavar = "N",
         .help = "tokens of one forward step (activations)", .def = "2048", .lo = 1, .hi = 1 << 24},
        {.names = ENGINE_MAX_RUNNING_NAMES, .type = OPT_INT, .dst = &lo.max_running, .metavar = "N",
         .help = "sequences running at once", .def = "64", .lo = 1, .hi = 1 << 16},
        {.names = ENGINE_MAX_MODEL_LEN_NAMES, .type = OPT_INT, .dst = &lo.max_model_len, .metavar = "N",
         .help = "prompt + output tokens of a request", .def = "the context length, at most 4096", .lo = 2,
         .hi = 1 << 24},
    };
    const OptGroup groups[] = {OPT_GROUP("info", specs), model_opt_group(&mo, MODEL_OPT_DIR | MODEL_OPT_KV),
                               par_opt_group(&lo.par), OPT_GROUP("memory of a layout", layout_specs)};
    const OptCommand cmd = {.cmd = "info", .synopsis = "MODEL [options]",
                            .about = "A model's architecture, parameters and precisions; with a layout option, the "
                                     "memory "
                                     "of each rank.",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    lo.kv_dtype = mo.kv_dtype;
    /* any layout option asks for the layout's memory */
    int want_layout = opt_given(&cmd, &mo.kv_dtype);
    for (int g = 2; g < 4; g++)
        for (int i = 0; i < groups[g].n; i++) want_layout |= opt_given(&cmd, groups[g].specs[i].dst);
    const char *dir = mo.dir;
    dir = model_dir_resolve("info", dir, mo.revision, 1);
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "error: info: %s: not a readable directory\n", dir); return 1; }
    closedir(d);

    char err[1024];
    ModelConfig *c = xcalloc(1, sizeof *c);
    QuantConfig q;
    if (config_load(c, dir, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); free(c); return 1; }
    if (quant_config_load(&q, dir, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); free(c); return 1; }
    ParamCount pc;
    model_count_params(c, &pc);

    Precision *p = xcalloc(1, sizeof *p);
    snprintf(p->other_name, sizeof p->other_name, "other");
    if (has_safetensors(dir)) {
        /* check the whole checkpoint against config.json first: a malformed one stops here
           with one line naming the file and the tensor, as every other command does */
        Model m;
        model_load(&m, dir);
        model_free(&m);
        read_precision(p, c, dir);
    } else {
        predict_precision(p, c, &q);
        p->source = q.algo == QALGO_NONE ? "none" : q.source;
    }
    if (want_layout && lo.max_model_len <= 0) lo.max_model_len = c->max_position < 4096 ? c->max_position : 4096;
    if (as_json) print_json(dir, c, &pc, &q, p, want_layout ? &lo : NULL);
    else {
        print_text(dir, c, &pc, &q, p);
        if (want_layout) print_layout(dir, c, &q, &lo, 0, NULL);
    }
    quant_config_free(&q);
    free(p);
    free(c);
    return 0;
}
