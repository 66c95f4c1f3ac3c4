/* test_config: config.json -> ModelConfig (src/format/config.c), the quantization config, the
 * parameter count (src/model/model.c) and `moeserve info`.
 * Fixtures: tests/data/configs/ (README there says where each comes from). Variants are made by
 * patching a fixture's JSON in memory: parse_patched(fixture, {keys to set}, "keys,to,delete"). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/util.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "model/model.h"

/* ---- helpers ---- */

static int load_fixture(const char *name, ModelConfig *c, char *err, size_t n)
{
    char dir[64];
    snprintf(dir, sizeof dir, "configs/%s", name);
    return config_load(c, test_data(dir), err, n);
}

/* The fixture's config.json with the keys of patch (a JSON object) set and the comma-separated
   keys of del removed, parsed. -2 if the test itself is broken. */
static int parse_patched(const char *fixture, const char *patch, const char *del, ModelConfig *c, char *err,
                         size_t n)
{
    char rel[128], path[4400];
    snprintf(rel, sizeof rel, "configs/%s/config.json", fixture);
    snprintf(path, sizeof path, "%s", test_data(rel));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) { fprintf(stderr, "    cannot load %s: %s\n", path, je.text); return -2; }
    if (patch) {
        json_t *p = json_loads(patch, 0, &je);
        if (!p) { fprintf(stderr, "    bad patch %s: %s\n", patch, je.text); json_decref(root); return -2; }
        json_object_update(root, p);
        json_decref(p);
    }
    if (del) {
        char keys[512];
        snprintf(keys, sizeof keys, "%s", del);
        for (char *save, *k = strtok_r(keys, ",", &save); k; k = strtok_r(NULL, ",", &save))
            json_object_del(root, k);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = config_parse(c, text, "patched/config.json", err, n);
    free(text);
    return rc;
}

/* The patched fixture must fail with one message that starts with the file and contains needle. */
static void expect_config_error(int line, const char *fixture, const char *patch, const char *del,
                                const char *needle)
{
    ModelConfig c;
    char e[1024] = "";
    int rc = parse_patched(fixture, patch, del, &c, e, sizeof e);
    if (rc != -1)
        test_fail(__FILE__, line, "rc %d for patch %s (del %s)", rc, patch ? patch : "-", del ? del : "-");
    else if (!strstr(e, needle))
        test_fail(__FILE__, line, "error '%s' should mention '%s'", e, needle);
    else if (strstr(e, "patched/config.json: ") != e)
        test_fail(__FILE__, line, "error '%s' should start with the file", e);
}
#define EXPECT_CONFIG_ERROR(fixture, patch, del, needle) expect_config_error(__LINE__, fixture, patch, del, needle)

static int count_moe(const ModelConfig *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_moe[l];
    return n;
}

/* Run `moeserve info --json` on a directory and parse its output. NULL (after a failure) if the
   command fails or prints something else. */
static json_t *info_json(const char *dir)
{
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s' --json", test_bin(), dir);
    int rc = test_run(cmd, &out);
    json_error_t je;
    json_t *j = rc == 0 ? json_loads(out, 0, &je) : NULL;
    if (!j) test_fail(__FILE__, __LINE__, "%s: rc %d, output: %.400s", cmd, rc, out ? out : "");
    free(out);
    return j;
}

static long long jint(const json_t *root, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = root;
    for (char *save, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = json_object_get(v, k);
    if (!json_is_integer(v)) { test_fail(__FILE__, __LINE__, "JSON field %s missing or not an integer", path); return -1; }
    return (long long)json_integer_value(v);
}

static const char *jstr(const json_t *root, const char *key)
{
    const char *s = json_string_value(json_object_get(root, key));
    return s ? s : "(missing)";
}

/* ---- GLM-5 (tests/data/configs/glm5: the release's config.json) ---- */

TEST(config_glm5_fields)
{
    ModelConfig c;
    char err[1024] = "";
    ASSERT(load_fixture("glm5", &c, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_GLM5);
    EXPECT(!strcmp(c.architecture, "GlmMoeDsaForCausalLM"), "%s", c.architecture);
    EXPECT(!strcmp(c.model_type, "glm_moe_dsa"), "%s", c.model_type);
    EXPECT_EQ_INT(c.vocab, 154880);
    EXPECT_EQ_INT(c.hidden, 6144);
    EXPECT_EQ_INT(c.n_layers, 78);
    EXPECT_EQ_INT(c.n_heads, 64);
    EXPECT_EQ_INT(c.n_kv_heads, 64);
    EXPECT_EQ_INT(c.head_dim, 256); /* qk_nope + qk_rope, not the file's head_dim 64 */
    EXPECT_EQ_INT(c.intermediate, 12288);
    EXPECT_EQ_INT(c.moe_intermediate, 2048);
    EXPECT_EQ_INT(c.n_experts, 256);
    EXPECT_EQ_INT(c.n_experts_per_tok, 8);
    EXPECT_EQ_INT(c.n_shared_experts, 1);
    EXPECT_EQ_INT(c.first_k_dense, 3);
    EXPECT_EQ_INT(c.moe_layer_freq, 1);
    EXPECT_EQ_INT(c.n_group, 1);
    EXPECT_EQ_INT(c.topk_group, 1);
    EXPECT_EQ_INT(c.norm_topk_prob, 1);
    EXPECT_NEAR(c.routed_scaling, 2.5, 0, 0);
    EXPECT_EQ_INT(c.scoring, SCORE_SIGMOID);
    EXPECT_NEAR(c.rms_eps, 1e-5f, 0, 0);
    EXPECT_NEAR(c.rope_theta, 1e6, 0, 0);
    EXPECT_EQ_INT(c.rotary_dim, 64);
    EXPECT_EQ_INT(c.rope_interleave, 1);
    EXPECT(!strcmp(c.rope_type, "default"), "%s", c.rope_type);
    EXPECT_EQ_INT(c.max_position, 202752);
    EXPECT_EQ_INT(c.attention_bias, 0);
    EXPECT_EQ_INT(c.use_qk_norm, 0);
    EXPECT_EQ_INT(c.q_lora_rank, 2048);
    EXPECT_EQ_INT(c.kv_lora_rank, 512);
    EXPECT_EQ_INT(c.qk_nope_dim, 192);
    EXPECT_EQ_INT(c.qk_rope_dim, 64);
    EXPECT_EQ_INT(c.v_head_dim, 256);
    EXPECT_EQ_INT(c.index_n_heads, 32);
    EXPECT_EQ_INT(c.index_head_dim, 128);
    EXPECT_EQ_INT(c.index_topk, 2048);
    EXPECT_EQ_INT(c.indexer_rope_interleave, 1);
    EXPECT_EQ_INT(c.n_mtp_layers, 1);
    EXPECT_EQ_INT(c.tie_embeddings, 0);
    EXPECT_EQ_INT(c.bos_id, 0); /* absent: GlmMoeDsaConfig default */
    EXPECT_EQ_INT(c.pad_id, 154820);
    EXPECT_EQ_INT(c.n_eos, 3);
    EXPECT_EQ_INT(c.eos_ids[0], 154820);
    EXPECT_EQ_INT(c.eos_ids[1], 154827);
    EXPECT_EQ_INT(c.eos_ids[2], 154829);
    EXPECT_NEAR(c.attn_scale, 0.0625, 0, 0); /* (192 + 64)^-0.5 */
    for (int l = 0; l < 78; l++) {
        EXPECT(c.layer_moe[l] == (l >= 3), "layer %d moe %d", l, c.layer_moe[l]);
        EXPECT(c.layer_indexer[l] == INDEXER_FULL, "layer %d indexer %d", l, c.layer_indexer[l]);
    }
    /* the MTP layer (index 78) is a MoE layer with its own indexer */
    EXPECT_EQ_INT(c.layer_moe[78], 1);
    EXPECT_EQ_INT(c.layer_indexer[78], INDEXER_FULL);
    EXPECT_EQ_INT(config_is_mla(&c), 1);
    EXPECT_EQ_INT(model_kv_width(&c), 576);
    EXPECT_EQ_INT(model_index_width(&c), 128);
}

/* Every piece as an exact integer (model.c lists them). ParamCount gives totals only, so pieces are taken as
   differences between configs that differ in one layer's piece. */
TEST(config_params_glm5)
{
    ModelConfig c;
    char err[1024] = "";
    ASSERT(load_fixture("glm5", &c, err, sizeof err) == 0, "%s", err);
    ParamCount p, q;
    model_count_params(&c, &p);
    EXPECT_EQ_INT((long long)p.embedding, 951582720LL);
    EXPECT_EQ_INT((long long)p.lm_head, 951582720LL);
    EXPECT_EQ_INT((long long)p.total, 743911218432LL);
    EXPECT_EQ_INT((long long)p.total_with_mtp, 753864139008LL);
    EXPECT_EQ_INT((long long)p.active, 39881563392LL);
    EXPECT_EQ_INT((long long)p.active_with_head, 40833146112LL);
    /* to two decimals, the totals beside the published ones (744B; the Hub's 754B with MTP) */
    EXPECT_NEAR(p.total / 1e9, 743.91, 0.005, 0);
    EXPECT_NEAR(p.total_with_mtp / 1e9, 753.86, 0.005, 0);
    EXPECT_NEAR((p.total_with_mtp - p.total) / 1e9, 9.95, 0.005, 0);
    EXPECT_NEAR(p.active / 1e9, 39.88, 0.005, 0);
    EXPECT_NEAR(p.active_with_head / 1e9, 40.83, 0.005, 0);

    const long long indexer = 9371904, moe = 9702998272LL, dense = 226492416, norms = 12288, mla = 165022208;
    ModelConfig d = c;
    d.layer_indexer[5] = INDEXER_SHARED; /* a shared layer stores no indexer */
    model_count_params(&d, &q);
    EXPECT_EQ_INT((long long)(p.total - q.total), indexer);
    d = c;
    d.layer_moe[5] = 0;
    d.intermediate = 0; /* layer 5 now holds neither a MoE block nor a dense MLP */
    model_count_params(&d, &q);
    EXPECT_EQ_INT((long long)(p.total - q.total), moe + 3 * dense);
    EXPECT_EQ_INT((long long)(p.active - q.active),
                  9 * 37748736LL + 1572864 + 256 + 3 * dense); /* top-8 + shared, router, bias */
    /* per layer attention + norms from the total identity (norms = 2 x hidden = 12,288) */
    long long rest = (long long)p.total - 2 * 951582720LL - 6144 - 78 * indexer - 3 * dense - 75 * moe;
    EXPECT_EQ_INT(rest % 78, 0);
    EXPECT_EQ_INT(rest / 78, mla + norms);
    /* MTP: a full layer + enorm, hnorm, eh_proj [6144, 12288], shared_head.norm */
    EXPECT_EQ_INT((long long)(p.total_with_mtp - p.total), mla + norms + indexer + moe + 3 * 6144 + 6144LL * 12288);
}

/* ---- GLM-4.5 family ---- */

TEST(config_glm4_family_fields)
{
    static const struct {
        const char *dir;
        int hidden, layers, inter, moe_inter, experts, first_dense, qk_norm, max_pos;
        double scale;
    } want[] = {
        {"glm4.5", 5120, 92, 12288, 1536, 160, 3, 1, 131072, 2.5},
        {"glm4.6", 5120, 92, 12288, 1536, 160, 3, 1, 202752, 2.5},
        {"glm4.7", 5120, 92, 12288, 1536, 160, 3, 1, 202752, 2.5},
        {"glm4.5-air", 4096, 46, 10944, 1408, 128, 1, 0, 131072, 1.0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ModelConfig c;
        char err[1024] = "";
        fprintf(stderr, "    %s\n", want[i].dir);
        ASSERT(load_fixture(want[i].dir, &c, err, sizeof err) == 0, "%s", err);
        EXPECT_EQ_INT(c.arch, ARCH_GLM4_MOE);
        EXPECT_EQ_INT(c.hidden, want[i].hidden);
        EXPECT_EQ_INT(c.n_layers, want[i].layers);
        EXPECT_EQ_INT(c.n_heads, 96);
        EXPECT_EQ_INT(c.n_kv_heads, 8);
        EXPECT_EQ_INT(c.head_dim, 128);
        EXPECT_NEAR(c.partial_rotary, 0.5, 0, 0);
        EXPECT_EQ_INT(c.rotary_dim, 64);
        EXPECT_EQ_INT(c.rope_interleave, 0);
        EXPECT_NEAR(c.rope_theta, 1e6, 0, 0);
        EXPECT(!strcmp(c.rope_type, "default"), "%s", c.rope_type);
        EXPECT_EQ_INT(c.attention_bias, 1);
        EXPECT_EQ_INT(c.use_qk_norm, want[i].qk_norm);
        EXPECT_EQ_INT(c.intermediate, want[i].inter);
        EXPECT_EQ_INT(c.moe_intermediate, want[i].moe_inter);
        EXPECT_EQ_INT(c.n_experts, want[i].experts);
        EXPECT_EQ_INT(c.n_experts_per_tok, 8);
        EXPECT_EQ_INT(c.n_shared_experts, 1);
        EXPECT_EQ_INT(c.first_k_dense, want[i].first_dense);
        EXPECT_EQ_INT(count_moe(&c), want[i].layers - want[i].first_dense);
        EXPECT_EQ_INT(c.layer_moe[want[i].first_dense - 1], 0);
        EXPECT_EQ_INT(c.layer_moe[want[i].first_dense], 1);
        EXPECT_NEAR(c.routed_scaling, want[i].scale, 0, 0);
        EXPECT_EQ_INT(c.max_position, want[i].max_pos);
        EXPECT_EQ_INT(c.vocab, 151552);
        EXPECT_EQ_INT(c.n_mtp_layers, 1);
        EXPECT_EQ_INT(c.tie_embeddings, 0);
        EXPECT_EQ_INT(c.n_eos, 3);
        EXPECT_EQ_INT(c.eos_ids[0], 151329);
        EXPECT_EQ_INT(c.pad_id, 151329);
        EXPECT_EQ_INT(c.bos_id, -1);
        EXPECT_NEAR(c.attn_scale, 1.0 / sqrt(128.0), 0, 1e-7); /* float */
        EXPECT_EQ_INT(c.layer_indexer[0], INDEXER_NONE);
        EXPECT_EQ_INT(config_is_mla(&c), 0);
        EXPECT_EQ_INT(model_kv_width(&c), 2048); /* k and v: 2 x 8 KV heads x 128 */
        EXPECT_EQ_INT(model_index_width(&c), 0);
    }
}

TEST(config_params_glm4_family)
{
    static const struct {
        const char *dir;
        double total, mtp, active;
        long long total_exact, mtp_exact, active_exact;
    } want[] = {
        {"glm4.5", 352.80, 356.79, 32.08, 352797829024LL, 356785898816LL, 32080373664LL},
        {"glm4.6", 352.80, 356.79, 32.08, 352797829024LL, 356785898816LL, 32080373664LL},
        {"glm4.7", 352.80, 356.79, 32.08, 352797829024LL, 356785898816LL, 32080373664LL},
        {"glm4.5-air", 106.85, 109.23, 12.18, 106852251264LL, 109227310848LL, 12182615680LL},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ModelConfig c;
        char err[1024] = "";
        ASSERT(load_fixture(want[i].dir, &c, err, sizeof err) == 0, "%s", err);
        ParamCount p;
        model_count_params(&c, &p);
        fprintf(stderr, "    %s: %.0f %.0f %.0f\n", want[i].dir, p.total, p.total_with_mtp, p.active);
        EXPECT_NEAR(p.total / 1e9, want[i].total, 0.005, 0);
        EXPECT_NEAR(p.total_with_mtp / 1e9, want[i].mtp, 0.005, 0);
        EXPECT_NEAR(p.active / 1e9, want[i].active, 0.005, 0);
        EXPECT_EQ_INT((long long)p.total, want[i].total_exact);
        EXPECT_EQ_INT((long long)p.total_with_mtp, want[i].mtp_exact);
        EXPECT_EQ_INT((long long)p.active, want[i].active_exact);
        EXPECT_EQ_INT((long long)p.embedding, 151552LL * c.hidden);
    }
}

/* ---- both key layouts (release configs before transformers 5, and transformers 5's) ---- */

static void expect_same_config(const ModelConfig *a, const ModelConfig *b, const char *what)
{
    /* config_parse zeroes the struct first, so equal configs are equal bytes */
    if (memcmp(a, b, sizeof *a) == 0) return;
    test_fail(__FILE__, __LINE__, "%s: configs differ (theta %g/%g partial %g/%g experts %d/%d moe %d/%d mtp %d/%d "
              "first_k %d/%d head_dim %d/%d rotary %d/%d)", what, a->rope_theta, b->rope_theta,
              (double)a->partial_rotary, (double)b->partial_rotary, a->n_experts, b->n_experts, count_moe(a),
              count_moe(b), a->n_mtp_layers, b->n_mtp_layers, a->first_k_dense, b->first_k_dense, a->head_dim,
              b->head_dim, a->rotary_dim, b->rotary_dim);
}

TEST(config_key_layouts_identical)
{
    ModelConfig a, b;
    char err[1024] = "";
    ASSERT(load_fixture("glm4.5", &a, err, sizeof err) == 0, "%s", err);
    ASSERT(load_fixture("glm4.5-tf5", &b, err, sizeof err) == 0, "%s", err);
    expect_same_config(&a, &b, "glm4.5 vs glm4.5-tf5");
    /* transformers 5 without the repeated top-level partial_rotary_factor */
    ASSERT(parse_patched("glm4.5-tf5", NULL, "partial_rotary_factor", &b, err, sizeof err) == 0, "%s", err);
    expect_same_config(&a, &b, "glm4.5 vs nested partial_rotary_factor only");
    /* release layout with partial_rotary_factor absent: Glm4MoeConfig default 0.5 */
    ASSERT(parse_patched("glm4.5", NULL, "partial_rotary_factor", &b, err, sizeof err) == 0, "%s", err);
    expect_same_config(&a, &b, "glm4.5 without partial_rotary_factor");

    /* GLM-5 in the pre-transformers-5 layout, and with every per-layer list written out */
    ModelConfig g, h;
    ASSERT(load_fixture("glm5", &g, err, sizeof err) == 0, "%s", err);
    ASSERT(parse_patched("glm5", "{\"rope_theta\": 1e6, \"rope_scaling\": null}", "rope_parameters", &h, err,
                         sizeof err) == 0, "%s", err);
    expect_same_config(&g, &h, "glm5 top-level rope_theta");
    char patch[4096], *o = patch;
    o += sprintf(o, "{\"rope_theta\": 1000000, \"partial_rotary_factor\": 1.0, \"num_local_experts\": 256, "
                    "\"mlp_layer_types\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l < 3 ? "dense" : "sparse");
    o += sprintf(o, "], \"indexer_types\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"full\"", l ? "," : "");
    sprintf(o, "]}");
    ASSERT(parse_patched("glm5", patch, NULL, &h, err, sizeof err) == 0, "%s", err);
    expect_same_config(&g, &h, "glm5 with explicit lists and agreeing top-level keys");
    ASSERT(parse_patched("glm5", patch, "first_k_dense_replace,moe_layer_freq", &h, err, sizeof err) == 0, "%s", err);
    expect_same_config(&g, &h, "glm5 with mlp_layer_types only");
}

TEST(config_conflicts_are_errors)
{
    ModelConfig c;
    char err[1024] = "";
    EXPECT(load_fixture("glm4.5-conflict", &c, err, sizeof err) == -1, "conflicting rope_theta accepted");
    EXPECT(strstr(err, "rope_theta") && strstr(err, "disagrees") && strstr(err, "glm4.5-conflict/config.json"),
           "%s", err);
    EXPECT_CONFIG_ERROR("glm4.5-tf5", "{\"partial_rotary_factor\": 0.25}", NULL, "partial_rotary_factor");
    EXPECT_CONFIG_ERROR("glm5", "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40}}", NULL,
                        "rope_scaling.type");
    EXPECT_CONFIG_ERROR("glm4.5-tf5", "{\"n_routed_experts\": 128}", NULL, "num_local_experts");
    EXPECT_CONFIG_ERROR("glm4.5-tf5", "{\"first_k_dense_replace\": 1}", NULL, "mlp_layer_types[1]");
    EXPECT_CONFIG_ERROR("glm4.5", "{\"num_mtp_layers\": 2}", NULL, "num_mtp_layers");
    EXPECT_CONFIG_ERROR("glm5", "{\"architectures\": [\"Glm4MoeForCausalLM\"]}", NULL, "does not match");
}

/* ---- DSA indexer per layer (GlmMoeDsaConfig.__post_init__) ---- */

TEST(config_indexer_types)
{
    ModelConfig c;
    char err[1024] = "", patch[4096];
    /* explicit list: every 4th layer full */
    char *o = patch + sprintf(patch, "{\"indexer_types\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l % 4 ? "shared" : "full");
    sprintf(o, "]}");
    ASSERT(parse_patched("glm5", patch, NULL, &c, err, sizeof err) == 0, "%s", err);
    for (int l = 0; l < 78; l++) {
        int want = l % 4 ? INDEXER_SHARED : INDEXER_FULL;
        EXPECT(c.layer_indexer[l] == want, "layer %d: %d", l, c.layer_indexer[l]);
    }
    ParamCount full, part;
    ModelConfig g;
    ASSERT(load_fixture("glm5", &g, err, sizeof err) == 0, "%s", err);
    model_count_params(&g, &full);
    model_count_params(&c, &part);
    EXPECT_EQ_INT((long long)(full.total - part.total), 58LL * 9371904); /* 58 shared layers */

    /* freq / offset: full iff max(i - offset + 1, 0) % freq == 0 */
    ASSERT(parse_patched("glm5", "{\"index_topk_freq\": 4}", NULL, &c, err, sizeof err) == 0, "%s", err);
    static const int want_f4_o2[10] = {1, 1, 0, 0, 0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 10; l++)
        EXPECT((c.layer_indexer[l] == INDEXER_FULL) == want_f4_o2[l], "freq 4 offset 2 layer %d: %d", l,
               c.layer_indexer[l]);
    ASSERT(parse_patched("glm5", "{\"index_topk_freq\": 3, \"index_skip_topk_offset\": 5}", NULL, &c, err,
                         sizeof err) == 0, "%s", err);
    static const int want_f3_o5[10] = {1, 1, 1, 1, 1, 0, 0, 1, 0, 0};
    for (int l = 0; l < 10; l++)
        EXPECT((c.layer_indexer[l] == INDEXER_FULL) == want_f3_o5[l], "freq 3 offset 5 layer %d: %d", l,
               c.layer_indexer[l]);
    /* freq 0 and 1: every layer full (max(freq, 1)) */
    ASSERT(parse_patched("glm5", "{\"index_topk_freq\": 0}", NULL, &c, err, sizeof err) == 0, "%s", err);
    for (int l = 0; l < 78; l++) EXPECT(c.layer_indexer[l] == INDEXER_FULL, "freq 0 layer %d", l);

    /* pattern string and list; the pattern wins over freq */
    o = patch + sprintf(patch, "{\"index_topk_freq\": 2, \"index_topk_pattern\": \"");
    for (int l = 0; l < 78; l++) *o++ = l % 3 == 0 ? 'F' : 'S';
    sprintf(o, "\"}");
    ASSERT(parse_patched("glm5", patch, NULL, &c, err, sizeof err) == 0, "%s", err);
    for (int l = 0; l < 78; l++) {
        int want = l % 3 == 0 ? INDEXER_FULL : INDEXER_SHARED;
        EXPECT(c.layer_indexer[l] == want, "pattern layer %d", l);
    }
    o = patch + sprintf(patch, "{\"index_topk_pattern\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l == 7 ? "shared" : "full");
    sprintf(o, "]}");
    ASSERT(parse_patched("glm5", patch, NULL, &c, err, sizeof err) == 0, "%s", err);
    for (int l = 0; l < 78; l++) EXPECT(c.layer_indexer[l] == (l == 7 ? INDEXER_SHARED : INDEXER_FULL), "list %d", l);

    /* errors: layer 0 shared, wrong length, bad word, bad letter */
    o = patch + sprintf(patch, "{\"indexer_types\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l == 0 ? "shared" : "full");
    sprintf(o, "]}");
    EXPECT_CONFIG_ERROR("glm5", patch, NULL, "layer 0");
    EXPECT_CONFIG_ERROR("glm5", "{\"index_skip_topk_offset\": 0, \"index_topk_freq\": 2}", NULL, "layer 0");
    EXPECT_CONFIG_ERROR("glm5", "{\"indexer_types\": [\"full\", \"shared\"]}", NULL, "indexer_types");
    EXPECT_CONFIG_ERROR("glm5", "{\"index_topk_pattern\": \"FS\"}", NULL, "index_topk_pattern");
    o = patch + sprintf(patch, "{\"indexer_types\": [");
    for (int l = 0; l < 78; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l == 9 ? "half" : "full");
    sprintf(o, "]}");
    EXPECT_CONFIG_ERROR("glm5", patch, NULL, "indexer_types[9]");

    /* GLM-4.x has no indexer whatever the keys say */
    ASSERT(parse_patched("glm4.5", "{\"index_topk_freq\": 2}", NULL, &c, err, sizeof err) == 0, "%s", err);
    for (int l = 0; l < c.n_layers; l++) EXPECT(c.layer_indexer[l] == INDEXER_NONE, "layer %d", l);
}

TEST(config_mlp_layer_pattern)
{
    ModelConfig c;
    char err[1024] = "";
    /* DeepSeek rule: MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0 */
    ASSERT(parse_patched("glm5", "{\"first_k_dense_replace\": 1, \"moe_layer_freq\": 2}", NULL, &c, err,
                         sizeof err) == 0, "%s", err);
    for (int l = 0; l < 78; l++) {
        int want = l >= 1 && l % 2 == 0;
        EXPECT(c.layer_moe[l] == want, "layer %d", l);
    }
    /* no routed experts: every layer dense */
    ASSERT(parse_patched("glm4.5", "{\"n_routed_experts\": 0}", NULL, &c, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(count_moe(&c), 0);
    /* mlp_layer_types alone sets first_k_dense to its leading dense run */
    char patch[2048], *o = patch + sprintf(patch, "{\"mlp_layer_types\": [");
    for (int l = 0; l < 92; l++) o += sprintf(o, "%s\"%s\"", l ? "," : "", l < 5 ? "dense" : "sparse");
    sprintf(o, "]}");
    ASSERT(parse_patched("glm4.5", patch, "first_k_dense_replace", &c, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.first_k_dense, 5);
    EXPECT_EQ_INT(count_moe(&c), 87);
    EXPECT_CONFIG_ERROR("glm4.5", "{\"mlp_layer_types\": [\"dense\"]}", NULL, "mlp_layer_types");
}

/* ---- defaults, other architectures, YaRN ---- */

TEST(config_deepseek_defaults_and_yarn)
{
    ModelConfig c;
    char err[1024] = "";
    /* DeepSeek-V3 release-style rope_scaling (top level, "type") */
    const char *v3 = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
                     "\"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, "
                     "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, "
                     "\"type\": \"yarn\"}, \"max_position_embeddings\": 163840, \"q_lora_rank\": 1536}";
    ASSERT(config_parse(&c, v3, "v3/config.json", err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_DEEPSEEK_V3);
    EXPECT_EQ_INT(c.n_layers, 61);
    EXPECT_EQ_INT(c.hidden, 7168);
    EXPECT_EQ_INT(c.n_group, 8);
    EXPECT_EQ_INT(c.topk_group, 4);
    EXPECT_EQ_INT(c.first_k_dense, 3);
    EXPECT_EQ_INT(c.head_dim, 192);
    EXPECT_EQ_INT(c.rope_interleave, 1);
    EXPECT_EQ_INT(model_index_width(&c), 0);
    EXPECT_EQ_INT(c.layer_indexer[0], INDEXER_NONE);
    EXPECT(!strcmp(c.rope_type, "yarn"), "%s", c.rope_type);
    EXPECT_NEAR(c.yarn_factor, 40, 0, 0);
    EXPECT_EQ_INT(c.yarn_original_max_pos, 4096);
    double m = 0.1 * 1.0 * log(40.0) + 1.0;
    EXPECT_NEAR(c.attn_scale, m * m / sqrt(192.0), 1e-7, 1e-6);
    EXPECT_NEAR(c.rms_eps, 1e-6f, 0, 0);
    /* the same in the nested layout */
    const char *v3n = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"rope_parameters\": {\"rope_theta\": 10000, "
                      "\"rope_type\": \"yarn\", \"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, "
                      "\"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096}, "
                      "\"max_position_embeddings\": 163840}";
    ModelConfig n;
    ASSERT(config_parse(&n, v3n, "v3n/config.json", err, sizeof err) == 0, "%s", err);
    expect_same_config(&c, &n, "deepseek_v3 top-level vs nested yarn");
    /* q_lora_rank null: no low-rank q path */
    ASSERT(config_parse(&c, "{\"model_type\": \"deepseek_v3\", \"q_lora_rank\": null}", "x/config.json", err,
                        sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.q_lora_rank, 0);
    /* DeepSeek-V3.2: indexer RoPE NeoX by default, 64 indexer heads, all layers full */
    ASSERT(config_parse(&c, "{\"architectures\": [\"DeepseekV32ForCausalLM\"]}", "v32/config.json", err,
                        sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_DEEPSEEK_V32);
    EXPECT_EQ_INT(c.indexer_rope_interleave, 0);
    EXPECT_EQ_INT(c.index_n_heads, 64);
    EXPECT_EQ_INT(c.layer_indexer[60], INDEXER_FULL);
    EXPECT_EQ_INT(c.max_position, 163840);
    /* glm4_moe class defaults (GLM-4.5-Air shape), head_dim = hidden // heads when absent */
    ASSERT(config_parse(&c, "{\"model_type\": \"glm4_moe\", \"head_dim\": 128}", "g/config.json", err,
                        sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_GLM4_MOE);
    EXPECT_EQ_INT(c.n_layers, 46);
    EXPECT_NEAR(c.rope_theta, 10000, 0, 0);
    EXPECT_EQ_INT(c.rotary_dim, 64);
    EXPECT_EQ_INT(c.n_eos, 0);
    ASSERT(config_parse(&c, "{\"model_type\": \"glm4_moe\", \"hidden_size\": 4096, \"num_attention_heads\": 32}",
                        "g/config.json", err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.head_dim, 128);
    /* special tokens: int eos, null bos/pad */
    ModelConfig t;
    ASSERT(parse_patched("glm5", "{\"eos_token_id\": 154820, \"bos_token_id\": null, \"pad_token_id\": null}", NULL,
                         &t, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(t.n_eos, 1);
    EXPECT_EQ_INT(t.eos_ids[0], 154820);
    EXPECT_EQ_INT(t.bos_id, -1);
    EXPECT_EQ_INT(t.pad_id, -1);
    ASSERT(parse_patched("glm5", "{\"eos_token_id\": null}", NULL, &t, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(t.n_eos, 0);
}

TEST(config_unknown_architecture)
{
    ModelConfig c;
    char err[1024] = "";
    EXPECT_CONFIG_ERROR("glm5", "{\"architectures\": [\"FooForCausalLM\"], \"model_type\": \"foo\"}", NULL,
                        "unknown architecture 'FooForCausalLM' (supported: Glm4MoeForCausalLM, "
                        "GlmMoeDsaForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM)");
    EXPECT_CONFIG_ERROR("glm5", "{\"model_type\": \"llama\"}", "architectures", "unknown architecture 'llama'");
    EXPECT_CONFIG_ERROR("glm5", NULL, "architectures,model_type", "no 'architectures' or 'model_type'");
    /* an unknown class name with a known model_type falls back to the model_type */
    ASSERT(parse_patched("glm5", "{\"architectures\": [\"GlmMoeDsaForCausalLMCustom\"]}", NULL, &c, err,
                         sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_GLM5);
    /* model_type alone */
    ASSERT(parse_patched("glm4.5", NULL, "architectures", &c, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(c.arch, ARCH_GLM4_MOE);
}

TEST(config_invalid_values)
{
    EXPECT_CONFIG_ERROR("glm5", "{\"num_hidden_layers\": 0}", NULL, "'num_hidden_layers' = 0 is out of range");
    EXPECT_CONFIG_ERROR("glm5", "{\"num_hidden_layers\": 257}", NULL, "num_hidden_layers");
    EXPECT_CONFIG_ERROR("glm5", "{\"num_hidden_layers\": 256}", NULL, "MTP"); /* 256 + 1 MTP layer */
    EXPECT_CONFIG_ERROR("glm5", "{\"vocab_size\": 0}", NULL, "vocab_size");
    EXPECT_CONFIG_ERROR("glm5", "{\"hidden_size\": -6144}", NULL, "hidden_size");
    EXPECT_CONFIG_ERROR("glm5", "{\"hidden_size\": \"6144\"}", NULL, "'hidden_size' must be an integer");
    EXPECT_CONFIG_ERROR("glm5", "{\"hidden_size\": 6144.5}", NULL, "hidden_size");
    EXPECT_CONFIG_ERROR("glm5", "{\"num_experts_per_tok\": 300}", NULL, "num_experts_per_tok");
    EXPECT_CONFIG_ERROR("glm5", "{\"num_experts_per_tok\": 0}", NULL, "num_experts_per_tok");
    EXPECT_CONFIG_ERROR("glm5", "{\"topk_group\": 2}", NULL, "topk_group");
    EXPECT_CONFIG_ERROR("glm5", "{\"n_group\": 3}", NULL, "n_group");
    EXPECT_CONFIG_ERROR("glm5", "{\"n_group\": 8, \"topk_group\": 1, \"num_experts_per_tok\": 64}", NULL,
                        "fewer than num_experts_per_tok");
    EXPECT_CONFIG_ERROR("glm5", "{\"qk_rope_head_dim\": 63}", NULL, "qk_rope_head_dim");
    EXPECT_CONFIG_ERROR("glm5", "{\"q_lora_rank\": null}", NULL, "q_lora_rank");
    EXPECT_CONFIG_ERROR("glm5", "{\"rms_norm_eps\": 0}", NULL, "rms_norm_eps");
    EXPECT_CONFIG_ERROR("glm5", "{\"rope_parameters\": {\"rope_type\": \"llama3\"}}", NULL, "rope_type");
    EXPECT_CONFIG_ERROR("glm5", "{\"rope_parameters\": {\"rope_type\": \"yarn\"}}", NULL, "factor");
    EXPECT_CONFIG_ERROR("glm5", "{\"rope_parameters\": [1]}", NULL, "rope_parameters");
    EXPECT_CONFIG_ERROR("glm5", "{\"hidden_act\": \"gelu\"}", NULL, "hidden_act");
    EXPECT_CONFIG_ERROR("glm5", "{\"scoring_func\": \"tanh\"}", NULL, "scoring_func");
    EXPECT_CONFIG_ERROR("glm5", "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", NULL, "eos_token_id");
    EXPECT_CONFIG_ERROR("glm5", "{\"eos_token_id\": 154880}", NULL, "eos_token_id");
    EXPECT_CONFIG_ERROR("glm5", "{\"pad_token_id\": \"x\"}", NULL, "pad_token_id");
    EXPECT_CONFIG_ERROR("glm5", "{\"tie_word_embeddings\": \"no\"}", NULL, "tie_word_embeddings");
    EXPECT_CONFIG_ERROR("glm4.5", "{\"num_key_value_heads\": 7}", NULL, "num_key_value_heads");
    EXPECT_CONFIG_ERROR("glm4.5", "{\"partial_rotary_factor\": 0}", NULL, "partial_rotary_factor");
    EXPECT_CONFIG_ERROR("glm4.5", "{\"head_dim\": 2, \"partial_rotary_factor\": 0.5}", NULL, "rotated dims");
    EXPECT_CONFIG_ERROR("glm4.5", "{\"architectures\": \"Glm4MoeForCausalLM\"}", NULL, "architectures");
    /* each size in range, but E x F x D x layers would overflow the int64 parameter count */
    EXPECT_CONFIG_ERROR("glm5", "{\"n_routed_experts\": 65536, \"moe_intermediate_size\": 1048576, "
                        "\"hidden_size\": 1048576, \"num_hidden_layers\": 200}", NULL, "expert parameters");

    ModelConfig c;
    char err[512] = "";
    EXPECT(config_parse(&c, "{\"model_type\": ", "bad/config.json", err, sizeof err) == -1, "bad JSON accepted");
    EXPECT(strstr(err, "bad/config.json: invalid JSON") == err, "%s", err);
    EXPECT(config_parse(&c, "[1, 2]", "arr/config.json", err, sizeof err) == -1, "a list accepted");
    EXPECT(config_load(&c, "/nonexistent-moeserve-dir", err, sizeof err) == -1, "missing dir accepted");
    EXPECT(strstr(err, "/nonexistent-moeserve-dir/config.json") != NULL, "%s", err);
    /* a short error buffer truncates, never overflows */
    char tiny[8];
    EXPECT(parse_patched("glm5", "{\"vocab_size\": 0}", NULL, &c, tiny, sizeof tiny) == -1, "accepted");
    EXPECT_EQ_INT(strlen(tiny), 7);
}

/* Integers past int64 and reals past a double's range, which jansson refuses: in a field nobody
 * reads they load; in a field read as an integer they read as INT64_MAX (still an integer), so
 * the field's own check names it rather than the whole file being refused as not JSON. */
TEST(config_huge_numbers)
{
    char rel[128], path[4400], err[512] = "";
    snprintf(rel, sizeof rel, "configs/glm5/config.json");
    snprintf(path, sizeof path, "%s", test_data(rel));
    size_t n;
    char *text = file_read_all(path, &n);
    ASSERT(text, "%s", path);
    const char *ins[] = {"\"x_big\": 1000000000000000019884624838656, \"x_neg\": -99999999999999999999, \"x_list\": [1e999, -1e999, "
                         "9223372036854775807, -9223372036854775808, \"123456789012345678901234567890\"], ",
                         NULL};
    ModelConfig want, got;
    ASSERT(config_parse(&want, text, "glm5/config.json", err, sizeof err) == 0, "%s", err);
    size_t cap = n + 4096;
    char *patched = malloc(cap);
    ASSERT(patched);
    const char *brace = strchr(text, '{');
    ASSERT(brace);
    snprintf(patched, cap, "%.*s{%s%s", (int)(brace - text), text, ins[0], brace + 1);
    EXPECT(config_parse(&got, patched, "big/config.json", err, sizeof err) == 0, "%s", err);
    EXPECT(got.vocab == want.vocab && got.n_layers == want.n_layers && got.hidden == want.hidden);
    /* read as an integer: the field's own range check, naming it */
    const char *end = strrchr(text, '}');
    snprintf(patched, cap, "%.*s, \"vocab_size\": 1000000000000000019884624838656}", (int)(end - text), text);
    EXPECT(config_parse(&got, patched, "big/config.json", err, sizeof err) == -1, "a vocabulary of 1e30 accepted");
    EXPECT(strstr(err, "vocab_size") != NULL, "%s", err);
    /* what is not JSON stays refused */
    snprintf(patched, cap, "{\"x\": 1000000000000000019884624838656, \"y\": 01}");
    EXPECT(config_parse(&got, patched, "bad/config.json", err, sizeof err) == -1, "01 accepted");
    EXPECT(strstr(err, "invalid JSON") != NULL, "%s", err);
    free(patched);
    free(text);
}

/* ---- quantization config (ModelOpt's hf_quant_config.json, config.json quantization_config) ---- */

TEST(config_quant_excluded)
{
    char *pats[] = {"lm_head", "self_attn", "mlp.gate", "*.shared_experts.down_proj", "model.layers.78*",
                    "*mlp.router*", "model.layers.5.mlp.experts.[0-3].up_proj"};
    QuantConfig q = {.algo = QALGO_NVFP4, .exclude = pats, .n_exclude = 7};
    static const struct { const char *module; int excluded; } cases[] = {
        {"lm_head", 1},                                           /* exact */
        {"model.layers.3.self_attn.q_a_proj", 1},                 /* substring at '.' boundaries */
        {"model.layers.3.self_attn.indexer.wq_b", 1},
        {"model.layers.3.mlp.gate", 1},
        {"model.layers.0.mlp.gate_proj", 0},                      /* "mlp.gate" is not "mlp.gate_proj" */
        {"model.layers.3.mlp.experts.0.gate_proj", 0},
        {"model.layers.3.mlp.shared_experts.down_proj", 1},       /* fnmatch */
        {"model.layers.3.mlp.shared_experts.up_proj", 0},
        {"model.layers.78", 1},                                   /* "path*" = path and path.* */
        {"model.layers.78.mlp.experts.255.down_proj", 1},
        {"model.layers.780.mlp.gate", 1},                         /* (excluded as mlp.gate anyway) */
        {"model.layers.780.self_attn_x", 0},
        {"model.layers.7", 0},
        {"model.layers.3.mlp.router", 1},                         /* "*x*" = "*x" and "*x.*" */
        {"model.layers.3.mlp.router.proj", 1},
        {"model.layers.3.mlp.router_proj", 0},
        {"model.layers.5.mlp.experts.2.up_proj", 1},              /* character class */
        {"model.layers.5.mlp.experts.4.up_proj", 0},
        {"model.embed_tokens", 0},
        {"lm_head_extra", 0},
        {"model.lm_head", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        EXPECT(quant_config_excluded(&q, cases[i].module) == cases[i].excluded, "%s should%s be excluded",
               cases[i].module, cases[i].excluded ? "" : " not");
    /* "model.layers.1*" is the tree of layer 1, not layers 10..19 */
    char *tree[] = {"model.layers.1*"};
    QuantConfig t = {.algo = QALGO_NVFP4, .exclude = tree, .n_exclude = 1};
    EXPECT(quant_config_excluded(&t, "model.layers.1.mlp.experts.0.up_proj"), "layer 1");
    EXPECT(quant_config_excluded(&t, "model.layers.1"), "layer 1 itself");
    EXPECT(!quant_config_excluded(&t, "model.layers.12.mlp.experts.0.up_proj"), "layer 12");
    /* a "*" after a '.' is a plain wildcard */
    char *dot[] = {"model.layers.2.*"};
    QuantConfig d = {.algo = QALGO_NVFP4, .exclude = dot, .n_exclude = 1};
    EXPECT(quant_config_excluded(&d, "model.layers.2.mlp.gate"), "layer 2 tree");
    EXPECT(!quant_config_excluded(&d, "model.layers.2"), "layer 2 itself is not under 'model.layers.2.*'");
    QuantConfig none = {0};
    EXPECT(!quant_config_excluded(&none, "lm_head"), "empty list");
    quant_config_free(&none);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) { test_fail(__FILE__, __LINE__, "cannot write %s", path); return; }
    fputs(text, f);
    fclose(f);
}

/* A fresh directory test_tmpdir()/cfg-<name>. */
static const char *tmp_model_dir(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 512, "%s/cfg-%s", test_tmpdir(), name);
    mkdir(p, 0755);
    return p;
}

TEST(config_quant_load)
{
    QuantConfig q;
    char err[1024] = "";
    ASSERT(quant_config_load(&q, test_data("configs/glm5-nvfp4"), err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.algo, QALGO_NVFP4);
    EXPECT(!strcmp(q.algo_name, "NVFP4"), "%s", q.algo_name);
    EXPECT(!strcmp(q.source, "hf_quant_config.json"), "%s", q.source);
    EXPECT_EQ_INT(q.group_size, 16);
    EXPECT(!strcmp(q.kv_cache_algo, "FP8"), "%s", q.kv_cache_algo);
    EXPECT_EQ_INT(q.n_exclude, 7);
    EXPECT(quant_config_excluded(&q, "model.layers.78.mlp.experts.3.up_proj"), "MTP excluded");
    EXPECT(quant_config_excluded(&q, "model.layers.3.self_attn.kv_b_proj"), "attention excluded");
    EXPECT(quant_config_excluded(&q, "model.layers.2.mlp.down_proj"), "dense layer 2 excluded");
    EXPECT(!quant_config_excluded(&q, "model.layers.3.mlp.experts.3.up_proj"), "experts quantized");
    EXPECT(!quant_config_excluded(&q, "model.layers.3.mlp.shared_experts.up_proj"), "shared quantized");
    quant_config_free(&q);

    ASSERT(quant_config_load(&q, test_data("configs/glm5-fp8"), err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.algo, QALGO_FP8_BLOCK);
    EXPECT_EQ_INT(q.group_size, 128);
    EXPECT(!strcmp(q.source, "config.json"), "%s", q.source);
    EXPECT_EQ_INT(q.n_exclude, 4);
    EXPECT(quant_config_excluded(&q, "model.layers.40.self_attn.indexer.weights_proj"), "weights_proj");
    EXPECT(!quant_config_excluded(&q, "model.layers.40.self_attn.indexer.wq_b"), "wq_b");
    quant_config_free(&q);

    ASSERT(quant_config_load(&q, test_data("configs/glm5"), err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.algo, QALGO_NONE);
    EXPECT_EQ_INT(q.n_exclude, 0);
    EXPECT(!q.source[0], "%s", q.source);
    quant_config_free(&q);
    quant_config_free(&q); /* safe twice */

    /* ModelOpt config.json form: "ignore", kv_cache_scheme, group size inside config_groups */
    const char *d = tmp_model_dir("modelopt");
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", d);
    write_text(path, "{\"model_type\": \"glm_moe_dsa\", \"quantization_config\": {\"quant_method\": \"modelopt\", "
                     "\"quant_algo\": \"w4a16_nvfp4\", \"config_groups\": {\"group_0\": {\"weights\": {\"num_bits\": 4, "
                     "\"type\": \"float\", \"group_size\": 16}}}, \"ignore\": [\"lm_head\", \"*.mlp.gate\"], "
                     "\"kv_cache_scheme\": {\"num_bits\": 8, \"type\": \"float\", \"dynamic\": false}}}");
    ASSERT(quant_config_load(&q, d, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.algo, QALGO_W4A16_NVFP4);
    EXPECT(!strcmp(q.algo_name, "W4A16_NVFP4"), "%s", q.algo_name);
    EXPECT_EQ_INT(q.group_size, 16);
    EXPECT(!strcmp(q.kv_cache_algo, "FP8"), "%s", q.kv_cache_algo);
    EXPECT_EQ_INT(q.n_exclude, 2);
    EXPECT(quant_config_excluded(&q, "model.layers.9.mlp.gate"), "router");
    quant_config_free(&q);

    /* MIXED_PRECISION with quantized_layers */
    d = tmp_model_dir("mixed");
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    write_text(path, "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", "
                     "\"kv_cache_quant_algo\": null, \"exclude_modules\": [\"lm_head\"], \"quantized_layers\": {"
                     "\"model.layers.3.mlp.experts.0.up_proj\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16}, "
                     "\"model.layers.3.self_attn.o_proj\": {\"quant_algo\": \"FP8\"}}}}");
    ASSERT(quant_config_load(&q, d, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.algo, QALGO_MIXED);
    EXPECT_EQ_INT(q.n_mixed, 2);
    EXPECT(!q.kv_cache_algo[0], "%s", q.kv_cache_algo);
    for (int i = 0; i < q.n_mixed; i++)
        EXPECT_EQ_INT(q.mixed_algo[i], strstr(q.mixed_names[i], "o_proj") ? QALGO_FP8 : QALGO_NVFP4);
    quant_config_free(&q);

    /* malformed: a clean error naming the file */
    d = tmp_model_dir("badquant");
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    write_text(path, "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"exclude_modules\": \"lm_head\"}}");
    EXPECT(quant_config_load(&q, d, err, sizeof err) == -1, "string exclude_modules accepted");
    EXPECT(strstr(err, "hf_quant_config.json: 'exclude_modules' must be a list") != NULL, "%s", err);
    EXPECT_EQ_INT(q.n_exclude, 0);
    write_text(path, "{\"quantization\": ");
    EXPECT(quant_config_load(&q, d, err, sizeof err) == -1, "bad JSON accepted");
    EXPECT(strstr(err, "hf_quant_config.json: invalid JSON") != NULL, "%s", err);
}

/* Which routed-expert linears of GLM-5's MoE layers (3..77) the list of config_quant_excluded_many
   excludes, from what each pattern means (proj 0 gate, 1 up, 2 down). */
static int many_oracle(int l, int e, int proj)
{
    return (e % 16 == 0 && proj == 2)                          /* exact names */
        || e == 7                                             /* "experts.7": whole segments */
        || (e == 250 && proj == 1)                            /* "experts.250.up_proj" */
        || (l == 5 && e == 3) || l == 6 || (l == 7 && e == 2) /* trees "...experts.3*", "...experts*" */
        || (l == 9 && e == 100 && proj == 0)                  /* tree of one module */
        || (l == 8 && (e == 4 || e == 5))                     /* tree "...experts.[45]*" */
        || ((l == 10 || l == 20) && e >= 10 && e <= 19 && proj == 0) /* "model.layers.[12]0...1?..." */
        || (l >= 40 && l <= 49 && e == 200 && proj == 0)      /* "model.layers.4?..." */
        || (e == 9 && proj == 1)                              /* ".experts.9.up_proj" */
        || e == 11                                            /* "experts.11." */
        || (e == 255 && proj == 2)                            /* "*.experts.255.down_proj" */
        || (l == 3 && e == 1);                                /* "layers.3.mlp.experts.1" */
}

/* Thousands of exclude patterns of every kind (exact names, runs of segments, "path*" trees,
 * wildcards, a '.' at either end, names that match nothing) against GLM-5's 61k linears: the
 * compiled patterns quant_config_load builds answer as each pattern tried in turn does (the
 * reference: the same config without its index) for every module and some odd names, and
 * `moeserve info` counts the excluded experts the patterns' meaning gives. */
TEST(config_quant_excluded_many)
{
    static const char *const projs[] = {"gate_proj", "up_proj", "down_proj"};
    json_t *pats = json_array();
    char name[256];
    for (int l = 0; l < 79; l++) {
        for (int e = 0; e < 256; e += 16) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj", l, e);
            json_array_append_new(pats, json_string(name));
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.x", l, e); /* matches nothing */
            json_array_append_new(pats, json_string(name));
        }
        snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_b_proj", l);
        json_array_append_new(pats, json_string(name));
    }
    static const char *const more[] = {
        "lm_head", "*mlp.gate", "model.layers.78*", "experts.7", "experts.250.up_proj",
        "model.layers.5.mlp.experts.3*", "model.layers.6.mlp.experts*", "model.layers.7.mlp.experts.2*",
        "model.layers.9.mlp.experts.100.gate_proj*", "model.layers.8.mlp.experts.[45]*",
        "model.layers.[12]0.mlp.experts.1?.gate_proj", "model.layers.4?.mlp.experts.200.gate_proj",
        ".experts.9.up_proj", "experts.11.", "*.experts.255.down_proj", "experts\\.12", "", "a*b.*",
        "model.layers.1", "layers.3.mlp.experts.1", "x.y*", "model.layers.2.",
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) json_array_append_new(pats, json_string(more[i]));
    int n_pats = (int)json_array_size(pats);
    const char *d = tmp_model_dir("many-excludes");
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", d);
    char *cfg = file_read_all(test_data("configs/glm5-nvfp4/config.json"), NULL);
    ASSERT(cfg, "no glm5-nvfp4 fixture");
    write_text(path, cfg);
    free(cfg);
    json_t *hq = json_pack("{s:{s:s}, s:{s:s, s:i, s:s, s:o}}", "producer", "name", "modelopt", "quantization",
                           "quant_algo", "NVFP4", "group_size", 16, "kv_cache_quant_algo", "FP8", "exclude_modules", pats);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    ASSERT(json_dump_file(hq, path, 0) == 0, "cannot write %s", path);
    json_decref(hq);

    QuantConfig q;
    char err[1024] = "";
    ASSERT(quant_config_load(&q, d, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(q.n_exclude, n_pats);
    EXPECT(q.index != NULL, "quant_config_load built no index");
    QuantConfig ref = q;
    ref.index = NULL;
    long long n_names = 0, n_excluded = 0, n_experts_excluded = 0, n_mismatch = 0;
    static const char *const layer_mods[] = {"self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
        "self_attn.kv_b_proj", "self_attn.o_proj", "self_attn.indexer.wq_b", "self_attn.indexer.wk",
        "self_attn.indexer.weights_proj", "mlp.gate", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj", "eh_proj", ""};
    static const char *const odd[] = {"", ".", "..", "lm_head", "model.lm_head", "model.embed_tokens", "a*b.", "a*b.c",
        "model.layers.1", "model.layers.12", "model.layers.2.", "model.layers.78", "model.layers.780",
        "x.y", "x.yz", "x.y*", "q.x.y.r", "experts.7", ".experts.7.", "mlp.experts.11", "experts\\.12"};
    for (int l = 0; l < 80; l++) {
        for (size_t k = 0; k < sizeof layer_mods / sizeof layer_mods[0] + 3 * 257; k++) {
            size_t nl = sizeof layer_mods / sizeof layer_mods[0];
            if (k < nl) snprintf(name, sizeof name, "model.layers.%d.%s", l, layer_mods[k]);
            else snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%zu.%s", l, (k - nl) / 3, projs[(k - nl) % 3]);
            int a = quant_config_excluded(&q, name), b = quant_config_excluded(&ref, name);
            if (a != b && n_mismatch++ < 10) fprintf(stderr, "    %s: indexed %d, each pattern %d\n", name, a, b);
            n_names++;
            n_excluded += a;
            if (k >= nl && l >= 3 && l < 78 && (k - nl) / 3 < 256) {
                n_experts_excluded += a;
                int want = many_oracle(l, (int)(k - nl) / 3, (int)(k - nl) % 3);
                if (a != want && n_mismatch++ < 10) fprintf(stderr, "    %s: excluded %d, want %d\n", name, a, want);
            }
        }
    }
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        int a = quant_config_excluded(&q, odd[i]), b = quant_config_excluded(&ref, odd[i]);
        if (a != b && n_mismatch++ < 10) fprintf(stderr, "    '%s': indexed %d, each pattern %d\n", odd[i], a, b);
    }
    EXPECT_EQ_INT(n_mismatch, 0);
    long long want_experts = 0;
    for (int l = 3; l < 78; l++)
        for (int e = 0; e < 256; e++)
            for (int k = 0; k < 3; k++) want_experts += many_oracle(l, e, k);
    EXPECT_EQ_INT(n_experts_excluded, want_experts);
    fprintf(stderr, "    %lld names, %lld excluded (%lld routed-expert linears), %d patterns\n", n_names, n_excluded,
            n_experts_excluded, n_pats);
    /* a pattern added after the load: the index is stale, every pattern is tried */
    char **grown = xmalloc((size_t)(q.n_exclude + 1) * sizeof *grown);
    memcpy(grown, q.exclude, (size_t)q.n_exclude * sizeof *grown);
    grown[q.n_exclude] = "model.layers.3.mlp.experts.1.up_proj";
    QuantConfig g = q;
    g.exclude = grown;
    g.n_exclude++;
    EXPECT(quant_config_excluded(&g, "model.layers.3.mlp.experts.1.up_proj"), "pattern added after the index");
    free(grown);
    quant_config_free(&q);

    json_t *j = info_json(d);
    if (!j) return;
    EXPECT_EQ_INT(jint(j, "precision.exclude_patterns"), n_pats);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.bf16.modules"), want_experts);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.bf16.params"), want_experts * 2048 * 6144);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.nvfp4.modules"), 75LL * 256 * 3 - want_experts);
    EXPECT_EQ_INT(jint(j, "precision.kinds.mtp.bf16.modules"), 8 + 1 + 3 * 256 + 3 + 1); /* "model.layers.78*" */
    EXPECT_EQ_INT(jint(j, "precision.kinds.router.bf16.modules"), 75);
    /* kv_b_proj, and the rest of layers 1 and 2 ("model.layers.1", "model.layers.2.") */
    EXPECT_EQ_INT(jint(j, "precision.kinds.attention.bf16.modules"), 78 + 2 * 4);
    EXPECT_EQ_INT(jint(j, "precision.kinds.attention.nvfp4.modules"), 78 * 5 - 78 - 2 * 4);
    json_decref(j);
}

/* ---- moeserve info ---- */

TEST(config_cli_info_glm5_json)
{
    json_t *j = info_json(test_data("configs/glm5"));
    if (!j) return;
    EXPECT(!strcmp(jstr(j, "architecture"), "GlmMoeDsaForCausalLM"), "%s", jstr(j, "architecture"));
    EXPECT(!strcmp(jstr(j, "model_type"), "glm_moe_dsa"), "%s", jstr(j, "model_type"));
    EXPECT(!strcmp(jstr(j, "attention"), "MLA+DSA"), "%s", jstr(j, "attention"));
    EXPECT_EQ_INT(jint(j, "layers"), 78);
    EXPECT_EQ_INT(jint(j, "dense_layers"), 3);
    EXPECT_EQ_INT(jint(j, "moe_layers"), 75);
    EXPECT_EQ_INT(jint(j, "mtp_layers"), 1);
    EXPECT_EQ_INT(jint(j, "hidden"), 6144);
    EXPECT_EQ_INT(jint(j, "heads"), 64);
    EXPECT_EQ_INT(jint(j, "vocab"), 154880);
    EXPECT_EQ_INT(jint(j, "context_length"), 202752);
    EXPECT_EQ_INT(jint(j, "experts.routed"), 256);
    EXPECT_EQ_INT(jint(j, "experts.shared"), 1);
    EXPECT_EQ_INT(jint(j, "experts.top_k"), 8);
    EXPECT_EQ_INT(jint(j, "indexer.full_layers"), 78);
    EXPECT_EQ_INT(jint(j, "params.total"), 743911218432LL);
    EXPECT_EQ_INT(jint(j, "params.total_with_mtp"), 753864139008LL);
    EXPECT_EQ_INT(jint(j, "params.active"), 39881563392LL);
    EXPECT_EQ_INT(jint(j, "params.active_with_head"), 40833146112LL);
    EXPECT_EQ_INT(jint(j, "kv_bytes_per_token"), 89856);     /* (512 latent + 64 k_pe) x 2 B x 78 layers */
    EXPECT_EQ_INT(jint(j, "index_bytes_per_token"), 19968);  /* 128 x 2 B x 78 */
    const json_t *prec = json_object_get(j, "precision");
    EXPECT(!strcmp(jstr(prec, "source"), "none"), "%s", jstr(prec, "source"));
    /* every linear of the release, BF16: the linear params are the total with MTP minus norms,
       biases, the router bias and the final norm */
    long long bf16 = jint(j, "precision.formats.bf16.params");
    long long plain = 79LL * (12288 + 2048 + 512 + 256) + 76LL * 256 + 6144 + 3 * 6144;
    EXPECT_EQ_INT(bf16 + plain, 753864139008LL);
    json_decref(j);

    /* text form prints the same totals */
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s'", test_bin(), test_data("configs/glm5"));
    EXPECT_EQ_INT(test_run(cmd, &out), 0);
    EXPECT(out && strstr(out, "743.91 B total, 753.86 B with MTP; active 39.88 B (40.83 B with lm_head)"), "%s",
           out ? out : "");
    free(out);
}

TEST(config_cli_info_glm4_json)
{
    static const struct { const char *dir; long long total, mtp, active, kv; int moe; } want[] = {
        {"configs/glm4.5", 352797829024LL, 356785898816LL, 32080373664LL, 2048LL * 2 * 92, 89},
        {"configs/glm4.5-tf5", 352797829024LL, 356785898816LL, 32080373664LL, 2048LL * 2 * 92, 89},
        {"configs/glm4.5-air", 106852251264LL, 109227310848LL, 12182615680LL, 2048LL * 2 * 46, 45},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        json_t *j = info_json(test_data(want[i].dir));
        if (!j) return;
        EXPECT(!strcmp(jstr(j, "attention"), "GQA"), "%s", jstr(j, "attention"));
        EXPECT_EQ_INT(jint(j, "params.total"), want[i].total);
        EXPECT_EQ_INT(jint(j, "params.total_with_mtp"), want[i].mtp);
        EXPECT_EQ_INT(jint(j, "params.active"), want[i].active);
        EXPECT_EQ_INT(jint(j, "kv_bytes_per_token"), want[i].kv);
        EXPECT_EQ_INT(jint(j, "index_bytes_per_token"), 0);
        EXPECT_EQ_INT(jint(j, "moe_layers"), want[i].moe);
        EXPECT(json_object_get(j, "indexer") == NULL, "GQA model lists an indexer");
        json_decref(j);
    }
}

TEST(config_cli_info_predicted_precision)
{
    json_t *j = info_json(test_data("configs/glm5-nvfp4"));
    if (!j) return;
    const json_t *prec = json_object_get(j, "precision"), *kinds = json_object_get(prec, "kinds");
    EXPECT(!strcmp(jstr(prec, "source"), "hf_quant_config.json"), "%s", jstr(prec, "source"));
    EXPECT(!strcmp(jstr(prec, "quant_algo"), "NVFP4"), "%s", jstr(prec, "quant_algo"));
    EXPECT(!strcmp(jstr(prec, "kv_cache_quant_algo"), "FP8"), "%s", jstr(prec, "kv_cache_quant_algo"));
    static const struct { const char *kind, *fmt; } want[] = {
        {"attention", "bf16"}, {"indexer", "bf16"}, {"router", "bf16"}, {"dense_mlp", "bf16"},
        {"experts", "nvfp4"}, {"shared_experts", "nvfp4"}, {"embedding", "bf16"}, {"lm_head", "bf16"},
        {"mtp", "bf16"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const json_t *k = json_object_get(kinds, want[i].kind);
        EXPECT(k && json_object_size(k) == 1 && json_object_get(k, want[i].fmt), "%s should be only %s",
               want[i].kind, want[i].fmt);
    }
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.nvfp4.modules"), 75LL * 256 * 3);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.nvfp4.params"), 75LL * 256 * 37748736);
    json_decref(j);

    j = info_json(test_data("configs/glm5-fp8"));
    if (!j) return;
    EXPECT(!strcmp(jstr(json_object_get(j, "precision"), "quant_algo"), "FP8_BLOCK"), "FP8 block");
    EXPECT_EQ_INT(jint(j, "precision.kinds.router.bf16.modules"), 75);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.fp8-block.modules"), 75LL * 256 * 3);
    EXPECT_EQ_INT(jint(j, "precision.kinds.indexer.bf16.modules"), 78); /* weights_proj */
    EXPECT_EQ_INT(jint(j, "precision.kinds.indexer.fp8-block.modules"), 156);
    json_decref(j);
}

/* A tiny GLM-5-shaped checkpoint with BF16, NVFP4 and FP8 linears: precision read from tensors. */
/* info on a real (tiny) checkpoint: the golden glm5-nvfp4 fixture quantises every linear but
 * lm_head, the routers and the embedding (tests/data/golden/README.md). 4 layers: layer 0 dense,
 * 1-3 MoE with 16 experts and a shared expert; every layer has attention (5 linears) and an
 * indexer (3 linears). */
TEST(config_cli_info_checkpoint)
{
    json_t *j = info_json(test_data("golden/glm5-nvfp4"));
    if (!j) return;
    int nvfp4 = 4 * (5 + 3) + 3 + 3 * (16 * 3 + 3);
    EXPECT(!strcmp(jstr(json_object_get(j, "precision"), "source"), "checkpoint"), "source");
    EXPECT_EQ_INT(jint(j, "precision.formats.nvfp4.modules"), nvfp4);
    EXPECT_EQ_INT(jint(j, "precision.formats.bf16.modules"), 2 + 3);
    EXPECT_EQ_INT(jint(j, "precision.formats.bf16.params"), 2 * 512 * 128 + 3 * 16 * 128);
    EXPECT_EQ_INT(jint(j, "precision.kinds.experts.nvfp4.modules"), 3 * 16 * 3);
    EXPECT_EQ_INT(jint(j, "precision.kinds.shared_experts.nvfp4.modules"), 3 * 3);
    EXPECT_EQ_INT(jint(j, "precision.kinds.router.bf16.modules"), 3);
    EXPECT_EQ_INT(jint(j, "precision.kinds.embedding.bf16.modules"), 1);
    EXPECT_EQ_INT(jint(j, "precision.kinds.lm_head.bf16.modules"), 1);
    EXPECT_EQ_INT(jint(j, "precision.kinds.attention.nvfp4.modules"), 4 * 5);
    EXPECT_EQ_INT(jint(j, "precision.kinds.indexer.nvfp4.modules"), 4 * 3);
    json_decref(j);
}

/* A FIFO in place of config.json, hf_quant_config.json or model.safetensors: info refuses it at
 * once as not a regular file (a read would wait forever for a writer; `timeout` turns a hang into
 * exit 124). */
TEST(config_cli_info_fifo)
{
    static const char *const files[] = {"config.json", "hf_quant_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char name[32], cmd[9000], *out = NULL;
        snprintf(name, sizeof name, "fifo%d", i);
        const char *d = tmp_model_dir(name);
        snprintf(cmd, sizeof cmd, "cp '%s'/config.json '%s'/hf_quant_config.json '%s'/ && rm -f '%s/%s' && mkfifo '%s/%s'",
                 test_data("golden/glm5-nvfp4"), test_data("golden/glm5-nvfp4"), d, d, files[i], d, files[i]);
        ASSERT(test_run(cmd, NULL) == 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "timeout 20 '%s' info --model '%s'", test_bin(), d);
        EXPECT_EQ_INT(test_run(cmd, &out), 1);
        EXPECT(out && strstr(out, files[i]) && strstr(out, "not a regular file"), "%s: %s", files[i], out ? out : "");
        free(out);
    }
}

TEST(config_cli_info_errors)
{
    char cmd[9000], *out = NULL;
    /* missing directory */
    snprintf(cmd, sizeof cmd, "'%s' info --model /nonexistent-moeserve-model", test_bin());
    EXPECT_EQ_INT(test_run(cmd, &out), 1);
    EXPECT(out && !strncmp(out, "error: ", 7) && strchr(out, '\n') == out + strlen(out) - 1, "%s", out ? out : "");
    free(out);
    /* a directory without config.json */
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s'", test_bin(), tmp_model_dir("empty"));
    EXPECT_EQ_INT(test_run(cmd, &out), 1);
    EXPECT(out && !strncmp(out, "error: ", 7) && strstr(out, "config.json") &&
           strchr(out, '\n') == out + strlen(out) - 1, "%s", out ? out : "");
    free(out);
    /* a conflicting config */
    snprintf(cmd, sizeof cmd, "'%s' info --json --model '%s'", test_bin(), test_data("configs/glm4.5-conflict"));
    EXPECT_EQ_INT(test_run(cmd, &out), 1);
    EXPECT(out && strstr(out, "disagrees") && strchr(out, '\n') == out + strlen(out) - 1, "%s", out ? out : "");
    free(out);
    /* usage errors */
    snprintf(cmd, sizeof cmd, "'%s' info", test_bin());
    EXPECT_EQ_INT(test_run(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' info --model x --bogus", test_bin());
    EXPECT_EQ_INT(test_run(cmd, &out), 2);
    EXPECT(out && strstr(out, "unknown option '--bogus'"), "%s", out ? out : "");
    free(out);
}
