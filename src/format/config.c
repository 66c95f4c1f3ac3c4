/* config: config.json -> ModelConfig, and the quantization description of a checkpoint.
 * Reads both key layouts (release configs written before transformers 5, and those it writes:
 * RoPE settings at the top level or nested in rope_parameters; num_local_experts or
 * n_routed_experts; mlp_layer_types or first_k_dense_replace) and fills absent keys with the
 * defaults of the transformers 5.17 config classes (Glm4MoeConfig, GlmMoeDsaConfig,
 * DeepseekV3Config, DeepseekV32Config).
 * Every bad value is a clean error naming the file and the key. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "../base/util.h"

/* ---- types ---- */

/* One supported architecture and the defaults of its transformers 5.17 config class. */
typedef struct {
    const char *architecture, *model_type;
    Arch arch;
    int mla, dsa;                       /* MLA attention; DSA indexer */
    int vocab, hidden, intermediate, moe_intermediate, n_layers, n_heads, n_kv_heads;
    int n_experts, n_shared, top_k, n_group, topk_group, first_k_dense;
    double routed_scaling, rms_eps, partial_rotary;
    int max_position;
    int q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int index_n_heads, index_head_dim, index_topk;
    int rope_interleave, indexer_rope_interleave;
    int bos, eos, n_mtp;                /* -1: None */
} ArchInfo;

static const ArchInfo arch_table[] = {
    /* Glm4MoeConfig: GLM-4.5-Air shaped defaults; partial_rotary_factor 0.5 set in __post_init__;
       head_dim falls back to hidden // heads in the modeling code. */
    {"Glm4MoeForCausalLM", "glm4_moe", ARCH_GLM4_MOE, 0, 0,
     151552, 4096, 10944, 1408, 46, 96, 8, 128, 1, 8, 1, 1, 1, 1.0, 1e-5, 0.5, 131072,
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, 1},
    /* GlmMoeDsaConfig: GLM-5 shaped (zai-org/GLM-5's config.json); rope_interleave and
       indexer_rope_interleave are not class fields, both default to true (interleaved RoPE, as GLM-5's
       config.json says and transformers applies since its PRs #46372 and #46842). */
    {"GlmMoeDsaForCausalLM", "glm_moe_dsa", ARCH_GLM5, 1, 1,
     154880, 6144, 12288, 2048, 78, 64, 64, 256, 1, 8, 1, 1, 3, 2.5, 1e-5, 1.0, 202752,
     2048, 512, 192, 64, 256, 32, 128, 2048, 1, 1, 0, 1, 0},
    /* DeepseekV3Config */
    {"DeepseekV3ForCausalLM", "deepseek_v3", ARCH_DEEPSEEK_V3, 1, 0,
     129280, 7168, 18432, 2048, 61, 128, 128, 256, 1, 8, 8, 4, 3, 2.5, 1e-6, 1.0, 4096,
     1536, 512, 128, 64, 128, 0, 0, 0, 1, 0, 0, 1, 1},
    /* DeepseekV32Config: indexer RoPE is NeoX unless indexer_rope_interleave (vLLM default false) */
    {"DeepseekV32ForCausalLM", "deepseek_v32", ARCH_DEEPSEEK_V32, 1, 1,
     129280, 7168, 18432, 2048, 61, 128, 128, 256, 1, 8, 8, 4, 3, 2.5, 1e-6, 1.0, 163840,
     1536, 512, 128, 64, 128, 64, 128, 2048, 1, 0, 0, 1, 0},
};
#define N_ARCH ((int)(sizeof arch_table / sizeof arch_table[0]))

/* Parse state: the file name for messages and the caller's error buffer. */
typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} Ctx;

/* Sanity bounds on dimensions: far above any real model, low enough that products of two of
   them (vocab x hidden, experts x F x D) stay well inside int64. */
#define MAX_DIM (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_HEADS 4096
#define MAX_EXPERTS 65536
#define MAX_MTP 16
/* Routed and shared expert parameters of all layers: a thousand times GLM-5's 7.7e11. Each size
   alone is bounded above, but E x F x D x layers can pass 2^63 (model_count_params sums it in
   int64); with this bound every other term stays below 2^58, so the sums cannot overflow. */
#define MAX_EXPERT_PARAMS 1e15

/* ---- helpers: typed access to JSON values ---- */

static int bad(Ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(Ctx *x, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errbuf_set(x->err, x->errlen, "%s: %s", x->path, msg);
    return -1;
}

const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* An integer (an integral real such as 1e6 is accepted) in [lo, hi]. Absent or null: def. */
static int get_int(Ctx *x, const json_t *obj, const char *key, const char *shown, long lo, long hi,
                   int def, int *out)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) { *out = def; return 0; }
    double d;
    if (json_is_integer(v)) d = (double)json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) d = json_real_value(v);
    else return bad(x, "'%s' must be an integer, not %s", shown ? shown : key, json_kind(v));
    if (d < lo || d > hi)
        return bad(x, "'%s' = %.0f is out of range [%ld, %ld]", shown ? shown : key, d, lo, hi);
    *out = (int)d;
    return 0;
}

/* A number in [lo, hi] (gt_lo: strictly above lo). Absent or null: def. */
static int get_num(Ctx *x, const json_t *obj, const char *key, const char *shown, double lo, int gt_lo,
                   double hi, double def, double *out)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_number(v)) return bad(x, "'%s' must be a number, not %s", shown ? shown : key, json_kind(v));
    double d = json_number_value(v);
    if (!(gt_lo ? d > lo : d >= lo) || !(d <= hi))
        return bad(x, "'%s' = %g is out of range %s%g, %g]", shown ? shown : key, d, gt_lo ? "(" : "[", lo, hi);
    *out = d;
    return 0;
}

/* true/false (0/1 accepted). Absent or null: def. */
static int get_bool(Ctx *x, const json_t *obj, const char *key, int def, int *out)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (json_is_boolean(v)) { *out = json_is_true(v); return 0; }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    return bad(x, "'%s' must be true or false, not %s", key, json_kind(v));
}

/* A string, or NULL when absent or null. */
static int get_str(Ctx *x, const json_t *obj, const char *key, const char **out)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad(x, "'%s' must be a string, not %s", key, json_kind(v));
    *out = json_string_value(v);
    return 0;
}

/* 1 if path exists and is not a regular file: reading a FIFO would block, a device (a link to
   /dev/zero) never end, so neither is read as a configuration file. */
static int not_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
}

/* Two JSON values that mean the same setting (1e6 and 1000000 agree). */
static int json_same(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

static void json_show(const json_t *v, char *buf, size_t n)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, n, "%s", s ? s : "?");
    free(s);
}

/* ---- architecture ---- */

static int find_arch(Ctx *x, const json_t *root, const ArchInfo **out)
{
    const json_t *archs = json_object_get(root, "architectures");
    const char *name = NULL, *mtype = NULL;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) == 0 || !json_is_string(json_array_get(archs, 0)))
            return bad(x, "'architectures' must be a non-empty list of strings");
        name = json_string_value(json_array_get(archs, 0));
    }
    if (get_str(x, root, "model_type", &mtype)) return -1;
    const ArchInfo *by_name = NULL, *by_type = NULL;
    for (int i = 0; i < N_ARCH; i++) {
        if (name && !strcmp(name, arch_table[i].architecture)) by_name = &arch_table[i];
        if (mtype && !strcmp(mtype, arch_table[i].model_type)) by_type = &arch_table[i];
    }
    if (by_name && by_type && by_name != by_type)
        return bad(x, "architecture '%.80s' does not match model_type '%.40s'", name, mtype);
    *out = by_name ? by_name : by_type;
    if (*out) return 0;
    char list[512] = "";
    for (int i = 0; i < N_ARCH; i++) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", arch_table[i].architecture);
    }
    if (!name && !mtype) return bad(x, "no 'architectures' or 'model_type' (supported: %s)", list);
    return bad(x, "unknown architecture '%.80s' (supported: %s)", name ? name : mtype, list);
}

/* ---- RoPE: merge the top-level keys (rope_theta, partial_rotary_factor, rope_scaling) into the
   nested rope_parameters. A key given in both places must agree. ---- */

static int rope_merge_key(Ctx *x, json_t *merged, const char *key, const json_t *top, const char *top_name)
{
    const json_t *cur = json_object_get(merged, key);
    if (!cur || json_is_null(cur)) return json_object_set(merged, key, (json_t *)top) ? -1 : 0;
    if (json_is_null(top) || json_same(cur, top)) return 0;
    char a[128], b[128];
    json_show(cur, a, sizeof a);
    json_show(top, b, sizeof b);
    return bad(x, "'rope_parameters.%s' = %s disagrees with '%s' = %s", key, a, top_name, b);
}

static json_t *rope_merged(Ctx *x, const json_t *root)
{
    const json_t *nested = json_object_get(root, "rope_parameters");
    const json_t *scaling = json_object_get(root, "rope_scaling");
    if (nested && !json_is_null(nested) && !json_is_object(nested)) {
        bad(x, "'rope_parameters' must be an object, not %s", json_kind(nested));
        return NULL;
    }
    if (scaling && !json_is_null(scaling) && !json_is_object(scaling)) {
        bad(x, "'rope_scaling' must be an object or null, not %s", json_kind(scaling));
        return NULL;
    }
    json_t *m = json_is_object(nested) ? json_deep_copy(nested) : json_object();
    /* "type" is the pre-transformers-5 spelling of "rope_type" */
    json_t *t = json_object_get(m, "type");
    if (t && !json_object_get(m, "rope_type")) json_object_set(m, "rope_type", t);
    json_object_del(m, "type");
    if (json_is_object(scaling)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)scaling, k, v) {
            const char *key = strcmp(k, "type") ? k : "rope_type";
            char shown[96];
            snprintf(shown, sizeof shown, "rope_scaling.%s", k);
            if (rope_merge_key(x, m, key, v, shown)) { json_decref(m); return NULL; }
        }
    }
    static const char *const top_keys[] = {"rope_theta", "partial_rotary_factor"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, top_keys[i]);
        if (v && rope_merge_key(x, m, top_keys[i], v, top_keys[i])) { json_decref(m); return NULL; }
    }
    return m;
}

static int parse_rope(Ctx *x, const json_t *root, const ArchInfo *ai, ModelConfig *c)
{
    json_t *r = rope_merged(x, root);
    if (!r) return -1;
    int rc = -1;
    const char *type = NULL;
    double theta, partial, factor, fast, slow, ms, msall;
    int orig;
    if (get_num(x, r, "rope_theta", "rope_theta", 0, 1, 1e12, 10000.0, &theta)) goto out;
    if (get_num(x, r, "partial_rotary_factor", "partial_rotary_factor", 0, 1, 1, ai->partial_rotary, &partial))
        goto out;
    if (get_str(x, r, "rope_type", &type)) goto out;
    if (!type || !strcmp(type, "default")) snprintf(c->rope_type, sizeof c->rope_type, "default");
    else if (!strcmp(type, "yarn") || !strcmp(type, "deepseek_yarn"))
        snprintf(c->rope_type, sizeof c->rope_type, "yarn");
    else { bad(x, "unsupported rope_type '%.40s' (supported: default, yarn)", type); goto out; }
    int yarn = !strcmp(c->rope_type, "yarn");
    if (yarn && !json_object_get(r, "factor")) { bad(x, "rope_type 'yarn' needs 'factor'"); goto out; }
    if (get_num(x, r, "factor", "rope_parameters.factor", 0, 1, 1e6, 1.0, &factor)) goto out;
    if (get_num(x, r, "beta_fast", "rope_parameters.beta_fast", 0, 0, 1e6, 32.0, &fast)) goto out;
    if (get_num(x, r, "beta_slow", "rope_parameters.beta_slow", 0, 0, 1e6, 1.0, &slow)) goto out;
    if (get_num(x, r, "mscale", "rope_parameters.mscale", 0, 0, 1e6, 1.0, &ms)) goto out;
    if (get_num(x, r, "mscale_all_dim", "rope_parameters.mscale_all_dim", 0, 0, 1e6, 0.0, &msall)) goto out;
    if (get_int(x, r, "original_max_position_embeddings", "rope_parameters.original_max_position_embeddings",
                1, 1L << 30, c->max_position, &orig)) goto out;
    c->rope_theta = theta;
    c->partial_rotary = (float)partial;
    c->yarn_factor = yarn ? (float)factor : 1.0f;
    c->yarn_beta_fast = (float)fast;
    c->yarn_beta_slow = (float)slow;
    c->yarn_mscale = (float)ms;
    c->yarn_mscale_all_dim = (float)msall;
    c->yarn_original_max_pos = orig;
    rc = 0;
out:
    json_decref(r);
    return rc;
}

/* ---- per-layer patterns ---- */

/* Dense/MoE per layer: mlp_layer_types (transformers 5) or first_k_dense_replace + moe_layer_freq
   (release configs; DeepSeek rule). When both are written they must describe the same pattern. */
static int parse_mlp_layers(Ctx *x, const json_t *root, ModelConfig *c, int fk_given, int freq_given)
{
    const json_t *list = json_object_get(root, "mlp_layer_types");
    uint8_t derived[MODEL_MAX_LAYERS];
    for (int i = 0; i < c->n_layers; i++)
        derived[i] = c->n_experts > 0 && i >= c->first_k_dense && i % c->moe_layer_freq == 0;
    if (!list || json_is_null(list)) {
        memcpy(c->layer_moe, derived, (size_t)c->n_layers);
        return 0;
    }
    if (!json_is_array(list) || (int)json_array_size(list) != c->n_layers)
        return bad(x, "'mlp_layer_types' must be a list of num_hidden_layers (%d) strings", c->n_layers);
    int lead = 0, in_lead = 1;
    for (int i = 0; i < c->n_layers; i++) {
        const char *s = json_string_value(json_array_get(list, (size_t)i));
        if (!s || (strcmp(s, "dense") && strcmp(s, "sparse")))
            return bad(x, "'mlp_layer_types[%d]' must be \"dense\" or \"sparse\"", i);
        c->layer_moe[i] = !strcmp(s, "sparse");
        if (c->layer_moe[i] && c->n_experts == 0)
            return bad(x, "'mlp_layer_types[%d]' is \"sparse\" but the model has no routed experts", i);
        if (in_lead && !c->layer_moe[i]) lead++;
        else in_lead = 0;
        if ((fk_given || freq_given) && c->layer_moe[i] != derived[i])
            return bad(x, "'mlp_layer_types[%d]' = \"%s\" disagrees with first_k_dense_replace = %d, "
                          "moe_layer_freq = %d", i, s, c->first_k_dense, c->moe_layer_freq);
    }
    if (!fk_given) c->first_k_dense = lead;
    return 0;
}

static int indexer_word(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "full") || !strcmp(s, "F")) return INDEXER_FULL;
    if (!strcmp(s, "shared") || !strcmp(s, "S")) return INDEXER_SHARED;
    return -1;
}

/* DSA indexer per layer, as GlmMoeDsaConfig.__post_init__ (transformers 5.17): indexer_types, else
   index_topk_pattern ("FSS..." or a list), else full iff max(i - offset + 1, 0) % freq == 0 with
   freq = max(index_topk_freq, 1) (default 1) and offset = index_skip_topk_offset (default 2). */
static int parse_indexer_layers(Ctx *x, const json_t *root, ModelConfig *c)
{
    const json_t *types = json_object_get(root, "indexer_types");
    const json_t *pat = json_object_get(root, "index_topk_pattern");
    const int L = c->n_layers;
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int)json_array_size(types) != L)
            return bad(x, "'indexer_types' must be a list of num_hidden_layers (%d) strings", L);
        for (int i = 0; i < L; i++) {
            int t = indexer_word(json_string_value(json_array_get(types, (size_t)i)));
            if (t < 0) return bad(x, "'indexer_types[%d]' must be \"full\" or \"shared\"", i);
            c->layer_indexer[i] = (uint8_t)t;
        }
    } else if (pat && !json_is_null(pat)) {
        if (json_is_string(pat)) {
            const char *s = json_string_value(pat);
            if ((int)strlen(s) != L)
                return bad(x, "'index_topk_pattern' has %zu letters, expected num_hidden_layers (%d)", strlen(s), L);
            for (int i = 0; i < L; i++) {
                if (s[i] != 'F' && s[i] != 'S')
                    return bad(x, "'index_topk_pattern' letter %d is '%c', expected 'F' or 'S'", i, s[i]);
                c->layer_indexer[i] = s[i] == 'F' ? INDEXER_FULL : INDEXER_SHARED;
            }
        } else if (json_is_array(pat) && (int)json_array_size(pat) == L) {
            for (int i = 0; i < L; i++) {
                int t = indexer_word(json_string_value(json_array_get(pat, (size_t)i)));
                if (t < 0) return bad(x, "'index_topk_pattern[%d]' must be \"full\" or \"shared\"", i);
                c->layer_indexer[i] = (uint8_t)t;
            }
        } else {
            return bad(x, "'index_topk_pattern' must be a string or a list of num_hidden_layers (%d) entries", L);
        }
    } else {
        int freq, offset;
        if (get_int(x, root, "index_topk_freq", NULL, -MODEL_MAX_LAYERS, 1L << 20, 1, &freq)) return -1;
        if (get_int(x, root, "index_skip_topk_offset", NULL, -MODEL_MAX_LAYERS, MODEL_MAX_LAYERS, 2, &offset))
            return -1;
        if (freq < 1) freq = 1;
        for (int i = 0; i < L; i++) {
            int k = i - offset + 1;
            c->layer_indexer[i] = (k > 0 ? k : 0) % freq == 0 ? INDEXER_FULL : INDEXER_SHARED;
        }
    }
    if (c->layer_indexer[0] != INDEXER_FULL)
        return bad(x, "layer 0 must run its own indexer (\"full\"): a \"shared\" layer reuses the top-k "
                      "of an earlier full layer");
    return 0;
}

/* eos_token_id: an integer, a list of integers, or null. */
static int parse_eos(Ctx *x, const json_t *root, int def, ModelConfig *c)
{
    const json_t *v = json_object_get(root, "eos_token_id");
    c->n_eos = 0;
    if (!v) {
        if (def >= 0) c->eos_ids[c->n_eos++] = def;
        return 0;
    }
    if (json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab)
            return bad(x, "'eos_token_id' = %lld is outside the vocabulary", (long long)json_integer_value(v));
        c->eos_ids[c->n_eos++] = (int)json_integer_value(v);
        return 0;
    }
    if (!json_is_array(v)) return bad(x, "'eos_token_id' must be an integer or a list, not %s", json_kind(v));
    if (json_array_size(v) > MODEL_MAX_EOS)
        return bad(x, "'eos_token_id' lists %zu ids, at most %d are supported", json_array_size(v), MODEL_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->vocab)
            return bad(x, "'eos_token_id[%zu]' must be a token id below vocab_size %d", i, c->vocab);
        c->eos_ids[c->n_eos++] = (int)json_integer_value(e);
    }
    return 0;
}

static int parse_token_id(Ctx *x, const json_t *root, const char *key, int def, int vocab, int *out)
{
    const json_t *v = json_object_get(root, key);
    if (!v) { *out = def; return 0; }
    if (json_is_null(v) || (json_is_integer(v) && json_integer_value(v) < 0)) { *out = -1; return 0; }
    if (!json_is_integer(v) || json_integer_value(v) >= vocab)
        return bad(x, "'%s' must be a token id below vocab_size %d or null", key, vocab);
    *out = (int)json_integer_value(v);
    return 0;
}

/* ---- core ---- */

static int parse_root(Ctx *x, const json_t *root, ModelConfig *c)
{
    const ArchInfo *ai;
    if (find_arch(x, root, &ai)) return -1;
    memset(c, 0, sizeof *c);
    c->arch = ai->arch;
    snprintf(c->architecture, sizeof c->architecture, "%s", ai->architecture);
    snprintf(c->model_type, sizeof c->model_type, "%s", ai->model_type);

    const char *act;
    if (get_str(x, root, "hidden_act", &act)) return -1;
    if (act && strcmp(act, "silu")) return bad(x, "unsupported hidden_act '%.40s' (supported: silu)", act);

    /* sizes */
    if (get_int(x, root, "vocab_size", NULL, 1, MAX_VOCAB, ai->vocab, &c->vocab)) return -1;
    if (get_int(x, root, "hidden_size", NULL, 1, MAX_DIM, ai->hidden, &c->hidden)) return -1;
    if (get_int(x, root, "num_hidden_layers", NULL, 1, MODEL_MAX_LAYERS, ai->n_layers, &c->n_layers)) return -1;
    if (get_int(x, root, "num_attention_heads", NULL, 1, MAX_HEADS, ai->n_heads, &c->n_heads)) return -1;
    if (get_int(x, root, "num_key_value_heads", NULL, 1, MAX_HEADS,
                ai->mla ? c->n_heads : ai->n_kv_heads, &c->n_kv_heads)) return -1;
    if (get_int(x, root, "intermediate_size", NULL, 1, MAX_DIM, ai->intermediate, &c->intermediate)) return -1;
    if (get_int(x, root, "moe_intermediate_size", NULL, 1, MAX_DIM, ai->moe_intermediate, &c->moe_intermediate))
        return -1;
    if (get_int(x, root, "max_position_embeddings", NULL, 1, 1L << 30, ai->max_position, &c->max_position))
        return -1;

    /* MoE: n_routed_experts, alias num_local_experts (transformers attribute_map) or num_experts */
    static const char *const expert_keys[] = {"n_routed_experts", "num_local_experts", "num_experts"};
    int have_e = 0;
    c->n_experts = ai->n_experts;
    for (int i = 0; i < 3; i++) {
        int e;
        if (!json_object_get(root, expert_keys[i]) || json_is_null(json_object_get(root, expert_keys[i]))) continue;
        if (get_int(x, root, expert_keys[i], NULL, 0, MAX_EXPERTS, 0, &e)) return -1;
        if (have_e && e != c->n_experts)
            return bad(x, "'%s' = %d disagrees with the routed expert count %d given by another key",
                       expert_keys[i], e, c->n_experts);
        c->n_experts = e;
        have_e = 1;
    }
    if (get_int(x, root, "num_experts_per_tok", NULL, 0, MAX_EXPERTS, ai->top_k, &c->n_experts_per_tok)) return -1;
    if (get_int(x, root, "n_shared_experts", NULL, 0, 64, ai->n_shared, &c->n_shared_experts)) return -1;
    if (get_int(x, root, "n_group", NULL, 1, MAX_EXPERTS, ai->n_group, &c->n_group)) return -1;
    if (get_int(x, root, "topk_group", NULL, 1, MAX_EXPERTS, ai->topk_group, &c->topk_group)) return -1;
    if (get_bool(x, root, "norm_topk_prob", 1, &c->norm_topk_prob)) return -1;
    double rs;
    if (get_num(x, root, "routed_scaling_factor", NULL, 0, 1, 1e6, ai->routed_scaling, &rs)) return -1;
    c->routed_scaling = (float)rs;
    const char *sf;
    if (get_str(x, root, "scoring_func", &sf)) return -1;
    if (!sf || !strcmp(sf, "sigmoid")) c->scoring = SCORE_SIGMOID;
    else if (!strcmp(sf, "softmax")) c->scoring = SCORE_SOFTMAX;
    else return bad(x, "unsupported scoring_func '%.40s' (supported: sigmoid, softmax)", sf);
    int fk_given = json_object_get(root, "first_k_dense_replace") != NULL;
    int freq_given = json_object_get(root, "moe_layer_freq") != NULL;
    if (get_int(x, root, "first_k_dense_replace", NULL, 0, MODEL_MAX_LAYERS, ai->first_k_dense, &c->first_k_dense))
        return -1;
    if (get_int(x, root, "moe_layer_freq", NULL, 1, MODEL_MAX_LAYERS, 1, &c->moe_layer_freq)) return -1;
    if (c->n_experts > 0) {
        if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts)
            return bad(x, "'num_experts_per_tok' = %d must be in [1, n_routed_experts = %d]",
                       c->n_experts_per_tok, c->n_experts);
        if (c->n_experts % c->n_group)
            return bad(x, "'n_routed_experts' = %d is not a multiple of 'n_group' = %d", c->n_experts, c->n_group);
        if (c->topk_group > c->n_group)
            return bad(x, "'topk_group' = %d exceeds 'n_group' = %d", c->topk_group, c->n_group);
        if ((long)c->topk_group * (c->n_experts / c->n_group) < c->n_experts_per_tok)
            return bad(x, "'topk_group' = %d groups of %d experts hold fewer than num_experts_per_tok = %d",
                       c->topk_group, c->n_experts / c->n_group, c->n_experts_per_tok);
    }

    /* MTP layers: num_nextn_predict_layers, alias num_mtp_layers */
    int mtp_a, mtp_b;
    if (get_int(x, root, "num_nextn_predict_layers", NULL, 0, MAX_MTP, -1, &mtp_a)) return -1;
    if (get_int(x, root, "num_mtp_layers", NULL, 0, MAX_MTP, -1, &mtp_b)) return -1;
    if (mtp_a >= 0 && mtp_b >= 0 && mtp_a != mtp_b)
        return bad(x, "'num_nextn_predict_layers' = %d disagrees with 'num_mtp_layers' = %d", mtp_a, mtp_b);
    c->n_mtp_layers = mtp_a >= 0 ? mtp_a : mtp_b >= 0 ? mtp_b : ai->n_mtp;
    if (c->n_layers + c->n_mtp_layers > MODEL_MAX_LAYERS)
        return bad(x, "num_hidden_layers + MTP layers = %d exceeds %d", c->n_layers + c->n_mtp_layers,
                   MODEL_MAX_LAYERS);
    double expert_params = (double)(c->n_experts + c->n_shared_experts) * 3.0 * c->hidden * c->moe_intermediate *
                           (c->n_layers + c->n_mtp_layers);
    if (expert_params > MAX_EXPERT_PARAMS)
        return bad(x, "(n_routed_experts + n_shared_experts) x 3 x hidden_size x moe_intermediate_size x %d layers = "
                      "%.3g expert parameters, over the limit of %g", c->n_layers + c->n_mtp_layers, expert_params,
                   MAX_EXPERT_PARAMS);

    double eps;
    if (get_num(x, root, "rms_norm_eps", NULL, 0, 1, 1, ai->rms_eps, &eps)) return -1;
    c->rms_eps = (float)eps;
    if (get_bool(x, root, "tie_word_embeddings", 0, &c->tie_embeddings)) return -1;
    if (get_bool(x, root, "attention_bias", 0, &c->attention_bias)) return -1;
    if (get_bool(x, root, "use_qk_norm", 0, &c->use_qk_norm)) return -1;

    if (parse_rope(x, root, ai, c)) return -1;

    /* attention */
    int qk_size;
    if (ai->mla) {
        /* q_lora_rank null means "no low-rank q path" (q_proj), not the class default */
        const json_t *ql = json_object_get(root, "q_lora_rank");
        if (ql && json_is_null(ql)) c->q_lora_rank = 0;
        else if (get_int(x, root, "q_lora_rank", NULL, 0, MAX_DIM, ai->q_lora, &c->q_lora_rank)) return -1;
        if (get_int(x, root, "kv_lora_rank", NULL, 1, MAX_DIM, ai->kv_lora, &c->kv_lora_rank)) return -1;
        if (get_int(x, root, "qk_nope_head_dim", NULL, 0, 4096, ai->qk_nope, &c->qk_nope_dim)) return -1;
        if (get_int(x, root, "qk_rope_head_dim", NULL, 2, 4096, ai->qk_rope, &c->qk_rope_dim)) return -1;
        if (get_int(x, root, "v_head_dim", NULL, 1, 4096, ai->v_head, &c->v_head_dim)) return -1;
        if (c->qk_rope_dim % 2) return bad(x, "'qk_rope_head_dim' = %d must be even", c->qk_rope_dim);
        /* the file's head_dim (= qk_rope_head_dim for glm_moe_dsa) is not the attention head size */
        c->head_dim = c->qk_nope_dim + c->qk_rope_dim;
        c->rotary_dim = c->qk_rope_dim;
        qk_size = c->head_dim;
    } else {
        if (get_int(x, root, "head_dim", NULL, 1, 4096, c->hidden / c->n_heads, &c->head_dim)) return -1;
        if (c->head_dim < 1) return bad(x, "no 'head_dim' and hidden_size / num_attention_heads is 0");
        if (c->n_heads % c->n_kv_heads)
            return bad(x, "'num_attention_heads' = %d is not a multiple of 'num_key_value_heads' = %d",
                       c->n_heads, c->n_kv_heads);
        c->rotary_dim = (int)(c->head_dim * (double)c->partial_rotary); /* int() as transformers */
        if (c->rotary_dim < 2 || c->rotary_dim % 2)
            return bad(x, "head_dim %d x partial_rotary_factor %g = %d rotated dims: must be even and >= 2",
                       c->head_dim, (double)c->partial_rotary, c->rotary_dim);
        qk_size = c->head_dim;
    }
    if (get_bool(x, root, "rope_interleave", ai->rope_interleave, &c->rope_interleave)) return -1;

    /* softmax scale (transformers' scaling = qk_head_dim^-0.5): q/k head size^-0.5; MLA under YaRN multiplies by
       mscale^2 with mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (transformers yarn_apply_mscale) */
    c->attn_scale = (float)(1.0 / sqrt((double)qk_size));
    if (ai->mla && !strcmp(c->rope_type, "yarn") && c->yarn_mscale_all_dim != 0 && c->yarn_factor > 1) {
        double m = 0.1 * c->yarn_mscale_all_dim * log((double)c->yarn_factor) + 1.0;
        c->attn_scale = (float)(1.0 / sqrt((double)qk_size) * m * m);
    }

    /* DSA indexer */
    if (ai->dsa) {
        if (get_int(x, root, "index_n_heads", NULL, 1, MAX_HEADS, ai->index_n_heads, &c->index_n_heads)) return -1;
        if (get_int(x, root, "index_head_dim", NULL, 1, 4096, ai->index_head_dim, &c->index_head_dim)) return -1;
        if (get_int(x, root, "index_topk", NULL, 1, 1L << 30, ai->index_topk, &c->index_topk)) return -1;
        if (get_bool(x, root, "indexer_rope_interleave", ai->indexer_rope_interleave, &c->indexer_rope_interleave))
            return -1;
        if (c->q_lora_rank == 0) return bad(x, "the DSA indexer needs 'q_lora_rank' > 0");
        if (c->index_head_dim < c->qk_rope_dim)
            return bad(x, "'index_head_dim' = %d is smaller than qk_rope_head_dim = %d", c->index_head_dim,
                       c->qk_rope_dim);
        if (parse_indexer_layers(x, root, c)) return -1;
    }

    if (parse_mlp_layers(x, root, c, fk_given, freq_given)) return -1;
    /* MTP layers (indices n_layers..) are full MoE layers with their own indexer (vLLM's deepseek_mtp.py) */
    for (int j = 0; j < c->n_mtp_layers; j++) {
        c->layer_moe[c->n_layers + j] = c->n_experts > 0;
        c->layer_indexer[c->n_layers + j] = ai->dsa ? INDEXER_FULL : INDEXER_NONE;
    }

    /* special tokens */
    if (parse_token_id(x, root, "bos_token_id", ai->bos, c->vocab, &c->bos_id)) return -1;
    if (parse_token_id(x, root, "pad_token_id", -1, c->vocab, &c->pad_id)) return -1;
    if (parse_eos(x, root, ai->eos, c)) return -1;
    return 0;
}

/* ---- quantization config helpers ---- */

static QuantAlgo quant_algo_parse(const char *upper)
{
    if (!upper || !*upper) return QALGO_NONE;
    if (!strcmp(upper, "NVFP4")) return QALGO_NVFP4;
    if (!strcmp(upper, "W4A16_NVFP4")) return QALGO_W4A16_NVFP4;
    if (!strcmp(upper, "FP8")) return QALGO_FP8;
    if (!strcmp(upper, "FP8_BLOCK") || !strcmp(upper, "FP8_PB_WO")) return QALGO_FP8_BLOCK;
    if (!strcmp(upper, "MIXED_PRECISION")) return QALGO_MIXED;
    return QALGO_OTHER;
}

static void upper_copy(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < n; i++) dst[i] = (char)toupper((unsigned char)src[i]);
    dst[i] = 0;
}

/* Append the strings of list (must be a list of strings) to q->exclude. */
static int add_excludes(Ctx *x, QuantConfig *q, const json_t *list, const char *key)
{
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return bad(x, "'%s' must be a list of module patterns, not %s", key, json_kind(list));
    size_t n = json_array_size(list);
    if (n > (1u << 22)) return bad(x, "'%s' has %zu entries", key, n);
    q->exclude = xrealloc(q->exclude, (q->n_exclude + n) * sizeof *q->exclude);
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(list, i));
        if (!s) return bad(x, "'%s[%zu]' must be a string", key, i);
        q->exclude[q->n_exclude++] = xstrdup(s);
    }
    return 0;
}

static int kv_algo(Ctx *x, QuantConfig *q, const json_t *obj)
{
    const char *s;
    if (get_str(x, obj, "kv_cache_quant_algo", &s)) return -1;
    if (s) { upper_copy(q->kv_cache_algo, sizeof q->kv_cache_algo, s); return 0; }
    const json_t *sch = json_object_get(obj, "kv_cache_scheme");
    if (json_is_object(sch)) {
        const char *type = json_string_value(json_object_get(sch, "type"));
        json_int_t bits = json_integer_value(json_object_get(sch, "num_bits"));
        if (type && !strcmp(type, "float") && bits == 8) snprintf(q->kv_cache_algo, sizeof q->kv_cache_algo, "FP8");
        else snprintf(q->kv_cache_algo, sizeof q->kv_cache_algo, "%s%lld", type ? type : "?", (long long)bits);
    }
    return 0;
}

static int group_size_of(Ctx *x, const json_t *obj, int def, int *out)
{
    if (json_object_get(obj, "group_size")) return get_int(x, obj, "group_size", NULL, 1, 1 << 20, def, out);
    /* compressed-tensors style: config_groups.<first>.weights.group_size */
    const json_t *groups = json_object_get(obj, "config_groups");
    if (json_is_object(groups)) {
        const char *k;
        json_t *g;
        json_object_foreach((json_t *)groups, k, g) {
            const json_t *w = json_object_get(g, "weights");
            if (json_is_object(w) && json_object_get(w, "group_size"))
                return get_int(x, w, "group_size", "config_groups.weights.group_size", 1, 1 << 20, def, out);
        }
    }
    *out = def;
    return 0;
}

/* hf_quant_config.json: {"producer": {...}, "quantization": {"quant_algo", "group_size",
   "kv_cache_quant_algo", "exclude_modules"[, "quantized_layers"]}}, as ModelOpt's get_quant_config writes it */
static int quant_parse_modelopt(Ctx *x, QuantConfig *q, const json_t *qz, const char *exclude_key)
{
    const char *algo;
    if (get_str(x, qz, "quant_algo", &algo)) return -1;
    upper_copy(q->algo_name, sizeof q->algo_name, algo);
    q->algo = quant_algo_parse(q->algo_name);
    int def_group = q->algo == QALGO_NVFP4 || q->algo == QALGO_W4A16_NVFP4 ? 16
                  : q->algo == QALGO_FP8_BLOCK ? 128 : 0;
    if (group_size_of(x, qz, def_group, &q->group_size)) return -1;
    if (kv_algo(x, q, qz)) return -1;
    if (add_excludes(x, q, json_object_get(qz, exclude_key), exclude_key)) return -1;
    const json_t *ql = json_object_get(qz, "quantized_layers");
    if (json_is_object(ql)) {
        size_t n = json_object_size(ql);
        q->mixed_names = xcalloc(n, sizeof *q->mixed_names);
        q->mixed_algo = xcalloc(n, sizeof *q->mixed_algo);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)ql, k, v) {
            char up[32];
            upper_copy(up, sizeof up, json_string_value(json_object_get(v, "quant_algo")));
            if (!json_is_object(v) || !up[0])
                return bad(x, "'quantized_layers.%.80s' must be an object with a quant_algo", k);
            q->mixed_names[q->n_mixed] = xstrdup(k);
            q->mixed_algo[q->n_mixed++] = quant_algo_parse(up);
        }
    } else if (ql && !json_is_null(ql)) {
        return bad(x, "'quantized_layers' must be an object");
    }
    return 0;
}

/* config.json quantization_config: ModelOpt ("quant_method": "modelopt", "ignore"), Z.ai / DeepSeek
   block FP8 ("quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert"),
   or anything else (compressed-tensors: algorithm OTHER, its "ignore" list kept). */
static int quant_parse_hf(Ctx *x, QuantConfig *q, const json_t *qc)
{
    const char *method;
    if (get_str(x, qc, "quant_method", &method)) return -1;
    if (!method) return bad(x, "'quantization_config' has no 'quant_method'");
    if (!strcasecmp(method, "modelopt")) return quant_parse_modelopt(x, q, qc, "ignore");
    if (!strcasecmp(method, "fp8")) {
        const json_t *wbs = json_object_get(qc, "weight_block_size");
        if (wbs && !json_is_null(wbs)) {
            if (!json_is_array(wbs) || json_array_size(wbs) != 2 || !json_is_integer(json_array_get(wbs, 0))
                || !json_is_integer(json_array_get(wbs, 1)) || json_integer_value(json_array_get(wbs, 0)) < 1
                || json_integer_value(json_array_get(wbs, 0)) != json_integer_value(json_array_get(wbs, 1)))
                return bad(x, "'quantization_config.weight_block_size' must be [B, B] (square blocks)");
            q->algo = QALGO_FP8_BLOCK;
            q->group_size = (int)json_integer_value(json_array_get(wbs, 0));
            snprintf(q->algo_name, sizeof q->algo_name, "FP8_BLOCK");
        } else {
            q->algo = QALGO_FP8;
            snprintf(q->algo_name, sizeof q->algo_name, "FP8");
        }
    } else {
        q->algo = QALGO_OTHER;
        const char *fmt = json_string_value(json_object_get(qc, "format"));
        upper_copy(q->algo_name, sizeof q->algo_name, fmt ? fmt : method);
    }
    static const char *const keys[] = {"modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules"};
    for (int i = 0; i < 4; i++)
        if (add_excludes(x, q, json_object_get(qc, keys[i]), keys[i])) return -1;
    return kv_algo(x, q, qc);
}

/* Segment-aware substring: pattern occurs in module starting and ending at a '.' boundary
   ("mlp.gate" is in "model.layers.3.mlp.gate" but not in "model.layers.0.mlp.gate_proj"). */
static int segment_substring(const char *module, const char *pat)
{
    size_t n = strlen(pat);
    if (!n) return 0;
    for (const char *p = strstr(module, pat); p; p = strstr(p + 1, pat)) {
        int start_ok = p == module || p[-1] == '.' || pat[0] == '.';
        int end_ok = p[n] == 0 || p[n] == '.' || pat[n - 1] == '.';
        if (start_ok && end_ok) return 1;
    }
    return 0;
}

/* One exclude pattern against one module name, as vLLM's is_layer_excluded: exact name;
   substring (here only at '.' boundaries); fnmatch wildcard, where "path*" (no '.' before the
   '*') stands for "path" and "path.*", i.e. the module tree rooted at path. */
static int pattern_matches(const char *p, const char *module)
{
    size_t n = strlen(p);
    if (!strcmp(p, module)) return 1;
    if (!strpbrk(p, "*?[")) return segment_substring(module, p);
    if (n >= 2 && p[n - 1] == '*' && p[n - 2] != '.') {
        char tree[1024];
        if (n >= sizeof tree - 2) return 0;
        memcpy(tree, p, n - 1);
        tree[n - 1] = 0;
        if (!fnmatch(tree, module, 0)) return 1;
        memcpy(tree + n - 1, ".*", 3);
        return !fnmatch(tree, module, 0);
    }
    return !fnmatch(p, module, 0);
}

/* ---- the exclude patterns compiled ---- */

/* A module is checked against every pattern: GLM-5 has 61k linears and a ModelOpt list can name
   thousands of modules, a strstr or an fnmatch each. Compiled once, the literal patterns (the
   bulk) become sorted sets that a module looks up by its own pieces: its whole name, every run
   of whole '.'-separated segments, every '.'-ended head for the "path*" trees. Only the other
   wildcards are still tried one by one, and only when the module starts with their literal head.
   pattern_matches stays the reference: quant_config_excluded without an index (tests compare). */
typedef struct { const char *s; size_t n; } Span; /* borrowed: n bytes at s */

struct QuantIndex {
    int n_patterns;        /* q->n_exclude when built: a list grown since is scanned instead */
    Span *exact;           /* [n_patterns] every pattern, sorted: an exact name */
    Span *seg; int n_seg;  /* literal patterns without a '.' at either end, sorted: they match a
                              run of whole segments (segment_substring) */
    size_t seg_max;        /* the longest of them */
    Span *tree; int n_tree;/* "path*" with a literal path shorter than pattern_matches takes:
                              path, sorted; module is path or starts with "path." */
    int *rest; int n_rest; /* the other patterns, indices into q->exclude: pattern_matches */
    size_t *rest_head;     /* [n_rest] bytes a module must start with (the literal head of a
                              wildcard, 0 for a literal) */
};

static int span_cmp(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    int r = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

static int span_in(const Span *set, int n, const char *s, size_t len)
{
    Span key = {s, len};
    return n > 0 && bsearch(&key, set, (size_t)n, sizeof *set, span_cmp) != NULL;
}

static QuantIndex *quant_index_build(const QuantConfig *q)
{
    size_t n = (size_t)q->n_exclude + 1;
    QuantIndex *x = xcalloc(1, sizeof *x);
    x->n_patterns = q->n_exclude;
    x->exact = xmalloc(n * sizeof *x->exact);
    x->seg = xmalloc(n * sizeof *x->seg);
    x->tree = xmalloc(n * sizeof *x->tree);
    x->rest = xmalloc(n * sizeof *x->rest);
    x->rest_head = xmalloc(n * sizeof *x->rest_head);
    for (int i = 0; i < q->n_exclude; i++) {
        const char *p = q->exclude[i];
        size_t len = strlen(p);
        x->exact[i] = (Span){p, len};
        if (!strpbrk(p, "*?[")) {
            if (len && p[0] != '.' && p[len - 1] != '.') {
                x->seg[x->n_seg++] = (Span){p, len};
                if (len > x->seg_max) x->seg_max = len;
                continue;
            }
            x->rest_head[x->n_rest] = 0;
        } else if (len >= 2 && len < 1022 && p[len - 1] == '*' && p[len - 2] != '.' && strcspn(p, "*?[\\") == len - 1) {
            x->tree[x->n_tree++] = (Span){p, len - 1};
            continue;
        } else {
            x->rest_head[x->n_rest] = strcspn(p, "*?[\\");
        }
        x->rest[x->n_rest++] = i;
    }
    qsort(x->exact, (size_t)q->n_exclude, sizeof *x->exact, span_cmp);
    qsort(x->seg, (size_t)x->n_seg, sizeof *x->seg, span_cmp);
    qsort(x->tree, (size_t)x->n_tree, sizeof *x->tree, span_cmp);
    return x;
}

static void quant_index_free(QuantIndex *x)
{
    if (!x) return;
    free(x->exact);
    free(x->seg);
    free(x->tree);
    free(x->rest);
    free(x->rest_head);
    free(x);
}

/* quant_config_excluded through the index: the same answer as every pattern_matches. */
static int quant_index_excluded(const QuantIndex *x, const QuantConfig *q, const char *m)
{
    size_t len = strlen(m);
    if (span_in(x->exact, x->n_patterns, m, len)) return 1;
    for (size_t j = 0; j <= len && x->n_tree; j++)  /* trees: m[0, j) with j at a '.' or the end */
        if ((j == len || m[j] == '.') && span_in(x->tree, x->n_tree, m, j)) return 1;
    for (size_t i = 0; x->n_seg;) {                 /* runs m[i, j) of whole segments */
        for (size_t j = i + 1; j <= len && j - i <= x->seg_max; j++)
            if ((j == len || m[j] == '.') && span_in(x->seg, x->n_seg, m + i, j - i)) return 1;
        const char *dot = memchr(m + i, '.', len - i);
        if (!dot) break;
        i = (size_t)(dot - m) + 1;
    }
    for (int r = 0; r < x->n_rest; r++) {
        const char *p = q->exclude[x->rest[r]];
        if (!strncmp(m, p, x->rest_head[r]) && pattern_matches(p, m)) return 1;
    }
    return 0;
}

/* ---- public API ---- */

int config_parse(ModelConfig *c, const char *json_text, const char *path, char *err, size_t errlen)
{
    Ctx x = {path ? path : "config.json", err, errlen};
    json_error_t je;
    json_t *root = json_loadb_clamped(json_text, strlen(json_text), 0, &je);
    if (!root) return bad(&x, "invalid JSON at line %d: %s", je.line, je.text);
    int rc = json_is_object(root) ? parse_root(&x, root, c) : bad(&x, "the top level must be an object");
    json_decref(root);
    if (rc == 0) config_shard_whole(c);
    return rc;
}

int config_load(ModelConfig *c, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    if (not_regular(path)) {
        errbuf_set(err, errlen, "%s: not a regular file", path);
        return -1;
    }
    size_t n;
    char *text = file_read_all(path, &n);
    if (!text) {
        errbuf_set(err, errlen, "%s: cannot read the model config: %s (is %s a Hugging Face checkpoint directory?)",
                   path, file_read_error(errno), dir);
        return -1;
    }
    int rc = config_parse(c, text, path, err, errlen);
    free(text);
    return rc;
}

int quant_config_load(QuantConfig *q, const char *dir, char *err, size_t errlen)
{
    memset(q, 0, sizeof *q);
    char path[4096];
    int hf = file_exists(path_join(path, sizeof path, dir, "hf_quant_config.json"));
    if (!hf && !file_exists(path_join(path, sizeof path, dir, "config.json"))) return 0;
    Ctx x = {path, err, errlen};
    if (not_regular(path)) return bad(&x, "not a regular file");
    char *text = file_read_all(path, NULL);
    if (!text) return bad(&x, "cannot read: %s", file_read_error(errno));
    json_error_t je;
    json_t *root = json_loadb_clamped(text, strlen(text), 0, &je);
    free(text);
    if (!root) return bad(&x, "invalid JSON at line %d: %s", je.line, je.text);
    int rc = 0;
    if (hf) {
        const json_t *qz = json_object_get(root, "quantization");
        snprintf(q->source, sizeof q->source, "hf_quant_config.json");
        rc = json_is_object(qz) ? quant_parse_modelopt(&x, q, qz, "exclude_modules")
                                : bad(&x, "no 'quantization' object");
    } else {
        const json_t *qc = json_object_get(root, "quantization_config");
        if (qc && !json_is_null(qc)) {
            snprintf(q->source, sizeof q->source, "config.json");
            rc = json_is_object(qc) ? quant_parse_hf(&x, q, qc) : bad(&x, "'quantization_config' must be an object");
        }
    }
    json_decref(root);
    if (rc) quant_config_free(q);
    else q->index = quant_index_build(q);
    return rc;
}

/* vLLM is_layer_excluded + apply_vllm_mapper (vllm/model_executor/layers/quantization/modelopt.py),
   pattern_matches for each pattern; through the index when quant_config_load built one and the
   list has not grown since. */
int quant_config_excluded(const QuantConfig *q, const char *module)
{
    if (q->index && q->index->n_patterns == q->n_exclude) return quant_index_excluded(q->index, q, module);
    for (int i = 0; i < q->n_exclude; i++)
        if (pattern_matches(q->exclude[i], module)) return 1;
    return 0;
}

void quant_config_free(QuantConfig *q)
{
    quant_index_free(q->index);
    for (int i = 0; i < q->n_exclude; i++) free(q->exclude[i]);
    for (int i = 0; i < q->n_mixed; i++) free(q->mixed_names[i]);
    free(q->exclude);
    free(q->mixed_names);
    free(q->mixed_algo);
    memset(q, 0, sizeof *q);
}

void config_shard_whole(ModelConfig *c)
{
    c->tp = c->pp = c->ep = c->dp = 1;
    c->tp_rank = c->pp_rank = c->dp_rank = 0;
    c->layer_begin = 0;
    c->layer_end = c->n_layers;
    c->expert0 = 0;
    c->n_local_experts = c->n_experts;
    c->vocab0 = 0;
    c->vocab_local = c->vocab;
    c->head0 = c->kv_head0 = 0;
    c->g_heads = c->n_heads;
    c->g_kv_heads = c->n_kv_heads;
    c->g_intermediate = c->intermediate;
    c->g_moe_intermediate = c->moe_intermediate;
}
