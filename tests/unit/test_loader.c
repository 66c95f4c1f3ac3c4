/* test_loader: a malformed checkpoint stops `moeserve logits` / `info` with one line naming the
 * file and the tensor and a non-zero exit, never a crash. Each case copies the tiny golden
 * fixture glm5-bf16 with one defect: a missing tensor, a shape or dtype that disagrees with
 * config.json, a config that disagrees with the tensors, an unknown architecture, a truncated
 * file, a header length past the end, malformed header JSON. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "test.h"

typedef enum { MUT_NONE, MUT_DROP, MUT_HALVE_1D, MUT_AS_I32, MUT_POKE, MUT_REPLACE } Mutation;

/* MUT_POKE: poke_n bytes of poke written at byte poke_off of the target tensor's data;
 * MUT_REPLACE: the target becomes a rep_dtype tensor of shape rep_shape[0, rep_ndim) whose
 * poke_n bytes are poke */
static size_t poke_off, poke_n;
static const void *poke;
static DType rep_dtype;
static int rep_ndim;
static int64_t rep_shape[2];

/* Copy src checkpoint (single model.safetensors) to dst with one tensor mutated. */
static int copy_mutated(const char *src, const char *dst, const char *target, Mutation mut)
{
    char err[1024], path[4400];
    SafeTensors st = {0};
    if (safetensors_open_dir(&st, src, err, sizeof err) < 0) { test_fail(__FILE__, __LINE__, "%s", err); return -1; }
    mkdir(dst, 0755);
    StSpec *specs = calloc(st.n_tensors, sizeof *specs);
    const void **data = calloc(st.n_tensors, sizeof *data);
    size_t *nbytes = calloc(st.n_tensors, sizeof *nbytes);
    int n = 0, hit = 0;
    unsigned char *poked = NULL;
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        StSpec s = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(s.shape, t->shape, sizeof s.shape);
        size_t nb = t->nbytes;
        if (!strcmp(t->name, target)) {
            hit = 1;
            if (mut == MUT_DROP) continue;
            if (mut == MUT_HALVE_1D) { s.shape[0] /= 2; nb /= 2; }
            if (mut == MUT_AS_I32) { s.dtype = DT_I32; s.shape[s.ndim - 1] /= 2; }
            if (mut == MUT_REPLACE) {
                s.dtype = rep_dtype, s.ndim = rep_ndim;
                memcpy(s.shape, rep_shape, sizeof rep_shape);
                nb = poke_n;
            }
            if (mut == MUT_POKE && poke_off + poke_n <= nb) {
                poked = malloc(nb);
                memcpy(poked, t->data, nb);
                memcpy(poked + poke_off, poke, poke_n);
            } else if (mut == MUT_POKE) {
                test_fail(__FILE__, __LINE__, "poke at %zu + %zu past %s's %zu bytes", poke_off, poke_n, target, nb);
            }
        }
        specs[n] = s;
        data[n] = poked && !strcmp(t->name, target) ? poked : t->data;
        if (mut == MUT_REPLACE && !strcmp(t->name, target)) data[n] = poke;
        nbytes[n++] = nb;
    }
    if (!hit && mut != MUT_NONE) test_fail(__FILE__, __LINE__, "fixture has no tensor %s", target);
    StWriter w = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    int rc = stw_open(&w, path, specs, n, "pt", err, sizeof err);
    for (int i = 0; rc == 0 && i < n; i++) rc = stw_write(&w, data[i], nbytes[i], err, sizeof err);
    if (rc == 0) rc = stw_close(&w, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "writing %s: %s", path, err);
    free(specs);
    free(data);
    free(nbytes);
    free(poked);
    safetensors_free(&st);
    /* config.json (and the NVFP4 fixtures' hf_quant_config.json) unchanged */
    static const char *const cfgs[] = {"config.json", "hf_quant_config.json"};
    for (int c = 0; c < 2; c++) {
        snprintf(path, sizeof path, "%s/%s", src, cfgs[c]);
        if (c && access(path, R_OK) != 0) continue;
        json_error_t jerr;
        json_t *cfg = json_load_file(path, 0, &jerr);
        snprintf(path, sizeof path, "%s/%s", dst, cfgs[c]);
        if (!cfg || json_dump_file(cfg, path, JSON_INDENT(2)) != 0) test_fail(__FILE__, __LINE__, "%s copy failed", cfgs[c]);
        json_decref(cfg);
    }
    return rc;
}

static void config_set(const char *dir, const char *key, json_t *value)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (!cfg) { test_fail(__FILE__, __LINE__, "%s: %s", path, jerr.text); return; }
    json_object_set_new(cfg, key, value);
    json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
}

/* Overwrite n bytes at off of dir/model.safetensors, or truncate it to off when bytes is NULL. */
static void patch_file(const char *dir, long off, const void *bytes, size_t n)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!bytes) { if (truncate(path, off) != 0) test_fail(__FILE__, __LINE__, "truncate %s", path); return; }
    FILE *f = fopen(path, "r+b");
    if (!f) { test_fail(__FILE__, __LINE__, "open %s", path); return; }
    fseek(f, off, SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

/* Run logits and info on dir: both must exit 1 with a single "error: " line containing every
 * string of want (NULL-terminated). */
static void expect_one_line_error(const char *dir, const char *const *want)
{
    static const char *cmds[] = {"logits --tokens 1,2,3 --out /dev/null --model", "info --model"};
    for (int c = 0; c < 2; c++) {
        char cmd[8192], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s %s", test_bin(), cmds[c], dir);
        int rc = test_run(cmd, &out);
        int lines = 0;
        for (char *p = out; *p; p++) lines += *p == '\n';
        EXPECT(rc == 1, "%s: exit %d (a crash is >= 128): %s", cmd, rc, out);
        EXPECT(!strncmp(out, "error: ", 7) && lines == 1, "%s: want one 'error:' line, got: %s", cmd, out);
        for (int i = 0; want[i]; i++) EXPECT(strstr(out, want[i]) != NULL, "%s: message lacks '%s': %s", cmd, want[i], out);
        free(out);
    }
}

static const char *fixture(void) { return test_data("golden/glm5-bf16"); }

static int have_fixture(void)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors", fixture());
    FILE *f = fopen(p, "rb");
    if (!f) { test_fail(__FILE__, __LINE__, "fixture %s is missing", p); return 0; }
    fclose(f);
    return 1;
}

static const char *case_dir(const char *name)
{
    static char d[8][512];
    static int k;
    char *p = d[k++ & 7];
    snprintf(p, 512, "%s/loader-%s", test_tmpdir(), name);
    return p;
}

TEST(loader_intact_copy_loads)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("intact");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens 1,2,3 --out %s/x.f32", test_bin(), dir, test_tmpdir());
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s: %s", cmd, out);
    free(out);
}

TEST(loader_missing_tensor)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("missing");
    const char *t = "model.layers.1.mlp.experts.3.up_proj.weight";
    ASSERT(copy_mutated(fixture(), dir, t, MUT_DROP) == 0);
    expect_one_line_error(dir, (const char *[]){"missing tensor", t, dir, NULL});
}

TEST(loader_shape_disagrees_with_config)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("shape");
    const char *t = "model.layers.0.self_attn.kv_a_layernorm.weight";
    ASSERT(copy_mutated(fixture(), dir, t, MUT_HALVE_1D) == 0);
    expect_one_line_error(dir, (const char *[]){t, "model.safetensors", "config.json", NULL});
}

TEST(loader_dtype_not_a_weight)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("dtype");
    const char *t = "model.layers.2.self_attn.o_proj.weight";
    ASSERT(copy_mutated(fixture(), dir, t, MUT_AS_I32) == 0);
    expect_one_line_error(dir, (const char *[]){t, "model.safetensors", "I32", NULL});
}

TEST(loader_config_disagrees_with_tensors)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("config");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    config_set(dir, "hidden_size", json_integer(96));
    expect_one_line_error(dir, (const char *[]){"model.embed_tokens.weight", "config.json", NULL});
}

TEST(loader_unknown_architecture)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("arch");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    json_t *a = json_array();
    json_array_append_new(a, json_string("LlamaForCausalLM"));
    config_set(dir, "architectures", a);
    config_set(dir, "model_type", json_string("llama"));
    expect_one_line_error(dir, (const char *[]){"unknown architecture", "LlamaForCausalLM", "config.json", NULL});
}

TEST(loader_truncated_file)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("truncated");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    patch_file(dir, 4096, NULL, 0);
    expect_one_line_error(dir, (const char *[]){"model.safetensors", NULL});
}

TEST(loader_header_length_past_end)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("hdrlen");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    unsigned char len[8] = {0, 0, 0, 0x40, 0, 0, 0, 0}; /* 1 GiB */
    patch_file(dir, 0, len, 8);
    expect_one_line_error(dir, (const char *[]){"model.safetensors", "header length", NULL});
}

TEST(loader_malformed_header_json)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("json");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    patch_file(dir, 8 + 20, "\"\"::", 4);
    expect_one_line_error(dir, (const char *[]){"model.safetensors", NULL});
}

TEST(loader_offsets_out_of_range)
{
    if (!have_fixture()) return;
    const char *dir = case_dir("offsets");
    ASSERT(copy_mutated(fixture(), dir, "", MUT_NONE) == 0);
    /* cut the data buffer short by one byte: the last tensor's end offset is past it */
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    ASSERT(stat(path, &sb) == 0);
    patch_file(dir, sb.st_size - 1, NULL, 0);
    expect_one_line_error(dir, (const char *[]){"model.safetensors", "tensor '", NULL});
}

/* NVFP4 scales that decode to NaN, infinity or a negative global scale: refused at load, naming
 * the tensor (and, for a block scale, its row and columns), instead of NaN logits later. A zero
 * global scale (an all-zero weight) and the sign bit of a block scale decode consistently: not
 * errors. */
TEST(loader_nvfp4_bad_scales)
{
    const char *src = test_data("golden/glm5-nvfp4");
    const char *s2 = "model.layers.1.mlp.experts.2.gate_proj.weight_scale_2", *bs = "model.layers.0.self_attn.o_proj.weight_scale";
    const float nanv = NAN, infv = -INFINITY, negv = -0.5f, zero = 0.0f;
    const struct { const char *t; size_t off; const void *p; size_t n; const char *want; } cases[] = {
        {s2, 0, &nanv, 4, "finite scale >= 0, got nan"}, {s2, 0, &infv, 4, "got -inf"}, {s2, 0, &negv, 4, "got -0.5"},
        {bs, 8 * 5 + 3, "\x7f", 1, "row 5, columns 48..63 is an E4M3 NaN (0x7f)"},
        {bs, 127 * 8 + 7, "\xff", 1, "row 127, columns 112..127 is an E4M3 NaN (0xff)"}, /* the tensor's last byte */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = case_dir("nvfp4-scale");
        poke_off = cases[i].off, poke = cases[i].p, poke_n = cases[i].n;
        ASSERT(copy_mutated(src, dir, cases[i].t, MUT_POKE) == 0);
        expect_one_line_error(dir, (const char *[]){cases[i].t, cases[i].want, NULL});
    }
    /* what still loads: a zero global scale, a block scale with its sign bit (0x80 | 0x38: -1.0) */
    const struct { const char *t; size_t off; const void *p; size_t n; } good[] = {{s2, 0, &zero, 4}, {bs, 17, "\xb8", 1}};
    for (size_t i = 0; i < 2; i++) {
        const char *dir = case_dir("nvfp4-scale-ok");
        poke_off = good[i].off, poke = good[i].p, poke_n = good[i].n;
        ASSERT(copy_mutated(src, dir, good[i].t, MUT_POKE) == 0);
        char cmd[8192], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens 1,2,3 --out %s/x.f32", test_bin(), dir, test_tmpdir());
        EXPECT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
        free(out);
    }
}

/* ---- the same weights in other storage layouts load to the same logits ---- */

typedef struct {
    StSpec spec[4096];
    const void *data[4096];
    size_t nbytes[4096];
    void *owned[4096];
    char *names[4096];
    int n;
} OutList;

static void out_add(OutList *o, const char *name, DType dt, int ndim, const int64_t *shape, const void *data,
                    size_t nb, void *owned)
{
    int i = o->n++;
    o->names[i] = strdup(name);
    o->spec[i] = (StSpec){.name = o->names[i], .dtype = dt, .ndim = ndim};
    if (ndim) memcpy(o->spec[i].shape, shape, ndim * sizeof(int64_t));
    o->data[i] = data;
    o->nbytes[i] = nb;
    o->owned[i] = owned;
}

static int out_write(OutList *o, const char *dir)
{
    char err[1024], path[4400];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StWriter w = {0};
    int rc = stw_open(&w, path, o->spec, o->n, "pt", err, sizeof err);
    for (int i = 0; rc == 0 && i < o->n; i++) rc = stw_write(&w, o->data[i], o->nbytes[i], err, sizeof err);
    if (rc == 0) rc = stw_close(&w, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "%s: %s", path, err);
    for (int i = 0; i < o->n; i++) { free(o->owned[i]); free(o->names[i]); }
    o->n = 0;
    return rc;
}

static void copy_config(const char *src, const char *dst)
{
    char a[4400], b[4400], cmd[9000];
    snprintf(a, sizeof a, "%s/config.json", src);
    snprintf(b, sizeof b, "%s/config.json", dst);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", a, b);
    if (system(cmd) != 0) test_fail(__FILE__, __LINE__, "%s", cmd);
}

/* logits of dir for a fixed prompt, or NULL */
static float *run_logits(const char *dir, size_t *n)
{
    char cmd[8192], outf[600], *out = NULL;
    snprintf(outf, sizeof outf, "%s/run-logits.f32", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3 --chunk 5 --out %s",
             test_bin(), dir, outf);
    int rc = test_run(cmd, &out);
    if (rc) { test_fail(__FILE__, __LINE__, "%s: %s", cmd, out); free(out); return NULL; }
    free(out);
    FILE *f = fopen(outf, "rb");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *v = malloc(sz);
    *n = fread(v, 1, sz, f) / sizeof(float);
    fclose(f);
    return v;
}

/* Both directories must give bit-identical logits (the same float weights, stored differently). */
static void expect_same_logits(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    float *la = run_logits(a, &na), *lb = run_logits(b, &nb);
    if (la && lb) {
        EXPECT(na == nb && na > 0, "%s: %zu logits, %s: %zu", a, na, b, nb);
        size_t diff = 0;
        for (size_t i = 0; i < na && i < nb; i++) diff += la[i] != lb[i];
        EXPECT(diff == 0, "%zu of %zu logits differ between %s and %s", diff, na, a, b);
    }
    free(la);
    free(lb);
}

static int expert_name(const char *name, int *layer, int *e, char *proj)
{
    return sscanf(name, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj.weight", layer, e, proj) == 3;
}

TEST(loader_fused_experts)
{
    const char *src = test_data("golden/glm4moe-bf16");
    char err[1024];
    SafeTensors st = {0};
    ASSERT(safetensors_open_dir(&st, src, err, sizeof err) == 0, "%s", err);
    static OutList o;
    int fused_layers = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        int L, e;
        char proj[16];
        if (!expert_name(t->name, &L, &e, proj)) {
            out_add(&o, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, NULL);
            continue;
        }
        if (e != 0 || strcmp(proj, "gate") != 0) continue;
        /* first expert of a layer: gather every expert of the layer into [E, 2F, D] and [E, D, F] */
        int E = 0;
        char nm[256];
        for (;; E++) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight", L, E);
            if (!safetensors_find(&st, nm)) break;
        }
        int64_t F = t->shape[0], D = t->shape[1];
        size_t el = t->nbytes / (F * D), mat = F * D * el;
        unsigned char *gu = malloc(E * 2 * mat), *dn = malloc(E * mat);
        for (int x = 0; x < E; x++) {
            static const char *parts[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3; k++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s_proj.weight", L, x, parts[k]);
                const StTensor *s = safetensors_find(&st, nm);
                ASSERT(s && s->nbytes == mat, "%s", nm);
                memcpy(k == 2 ? dn + x * mat : gu + (2 * x + k) * mat, s->data, mat);
            }
        }
        int64_t sg[3] = {E, 2 * F, D}, sd[3] = {E, D, F};
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", L);
        out_add(&o, nm, t->dtype, 3, sg, gu, E * 2 * mat, gu);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", L);
        out_add(&o, nm, t->dtype, 3, sd, dn, E * mat, dn);
        fused_layers++;
    }
    const char *dst = case_dir("fused");
    EXPECT(fused_layers > 0, "no expert tensors in %s", src);
    EXPECT(out_write(&o, dst) == 0);
    safetensors_free(&st);
    copy_config(src, dst);
    expect_same_logits(src, dst);
}

/* The golden fixture with its layers' linears re-stored as FP8 in d8 (ModelOpt per tensor, with
 * an F32 weight_scale and input_scale, on even layers; 128x128 blocks with an F32
 * weight_scale_inv on odd ones), and in d32 an F32 twin holding exactly the decoded values. */
static void write_fp8_pair(const char *d8, const char *d32)
{
    const char *src = test_data("golden/glm5-bf16");
    char err[1024];
    SafeTensors st = {0};
    ASSERT(safetensors_open_dir(&st, src, err, sizeof err) == 0, "%s", err);
    static OutList o8, o32;
    int n8 = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        int L = -1;
        size_t len = strlen(t->name);
        int linear = t->ndim == 2 && len > 7 && !strcmp(t->name + len - 7, ".weight") &&
                     sscanf(t->name, "model.layers.%d.", &L) == 1 && !strstr(t->name, "mlp.gate.weight");
        if (!linear) {
            out_add(&o8, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, NULL);
            out_add(&o32, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, NULL);
            continue;
        }
        int64_t N = t->shape[0], K = t->shape[1];
        float *w = malloc(N * K * sizeof(float)), *dec = malloc(N * K * sizeof(float));
        for (int64_t j = 0; j < N * K; j++) w[j] = dtype_load(t->dtype, t->data, j);
        unsigned char *q = malloc(N * K);
        char nm[300];
        QTensor qt = {.rows = N, .cols = K, .data = q, .gscale = 1};
        if (L % 2 == 0) {
            float *sc = malloc(sizeof(float));
            *sc = fp8_quantize(w, N * K, q);
            qt.fmt = QF_FP8;
            qt.gscale = *sc;
            snprintf(nm, sizeof nm, "%.*s.weight_scale", (int)(len - 7), t->name);
            out_add(&o8, nm, DT_F32, 0, NULL, sc, 4, sc);
            float *in = malloc(sizeof(float));
            *in = 0.25f; /* a static activation scale: read by no one (weight-only) */
            snprintf(nm, sizeof nm, "%.*s.input_scale", (int)(len - 7), t->name);
            out_add(&o8, nm, DT_F32, 0, NULL, in, 4, in);
        } else {
            int64_t gb[2] = {(N + 127) / 128, (K + 127) / 128};
            float *si = malloc(gb[0] * gb[1] * sizeof(float));
            fp8_block_quantize(w, N, K, q, si);
            qt.fmt = QF_FP8_BLOCK;
            qt.scale = (const uint8_t *)si;
            qt.scale_dtype = DT_F32;
            snprintf(nm, sizeof nm, "%.*s.weight_scale_inv", (int)(len - 7), t->name);
            out_add(&o8, nm, DT_F32, 2, gb, si, gb[0] * gb[1] * sizeof(float), si);
        }
        for (int64_t r = 0; r < N; r++) qtensor_decode(&qt, r, 0, K, dec + r * K);
        out_add(&o8, t->name, DT_F8_E4M3, 2, t->shape, q, N * K, q);
        out_add(&o32, t->name, DT_F32, 2, t->shape, dec, N * K * sizeof(float), dec);
        free(w);
        n8++;
    }
    EXPECT(n8 > 10, "only %d linears converted", n8);
    EXPECT(out_write(&o8, d8) == 0);
    EXPECT(out_write(&o32, d32) == 0);
    safetensors_free(&st);
    copy_config(src, d8);
    copy_config(src, d32);
}

/* FP8 next to its F32 twin (write_fp8_pair): the two checkpoints must give bit-identical
 * logits, which checks FP8 detection and decoding. */
TEST(loader_fp8_formats)
{
    const char *d8 = case_dir("fp8"), *d32 = case_dir("fp8-twin");
    write_fp8_pair(d8, d32);
    expect_same_logits(d8, d32);
}

/* An FP8 checkpoint whose scales have the wrong dtype or shape is refused, naming the tensor and
 * what it must be; it was read as whatever number its bytes made (an I8 1 as a scale of 1.0).
 * The dtypes that hold a scale exactly still load. */
TEST(loader_fp8_bad_scales)
{
    char d8[512]; /* case_dir's buffers rotate */
    snprintf(d8, sizeof d8, "%s", case_dir("fp8-src"));
    write_fp8_pair(d8, case_dir("fp8-src-twin"));
    const char *ws = "model.layers.0.self_attn.o_proj.weight_scale", *is = "model.layers.0.self_attn.o_proj.input_scale",
               *si = "model.layers.1.self_attn.o_proj.weight_scale_inv"; /* o_proj: [128, 128], one block */
    const int32_t one_i32 = 1;
    const float two_f32[2] = {1, 1}, four_f32[4] = {0};
    const struct { const char *t; DType dt; int ndim; int64_t shape[2]; const void *p; size_t n; const char *want; } bad[] = {
        {ws, DT_I8, 0, {0}, "\x01", 1, "FP8 weight_scale must hold one F32, BF16 or F16 value, got I8 []"},
        {ws, DT_I32, 0, {0}, &one_i32, 4, "got I32 []"},
        {ws, DT_F8_E4M3, 0, {0}, "\x38", 1, "got F8_E4M3 []"},
        {ws, DT_U8, 1, {1}, "\x01", 1, "got U8 [1]"},
        {ws, DT_F32, 1, {2}, two_f32, 8, "FP8 weight_scale must hold one F32, BF16 or F16 value, got F32 [2]"},
        {is, DT_I8, 0, {0}, "\x01", 1, "input_scale must hold one F32, BF16 or F16 value, got I8 []"},
        {is, DT_F32, 2, {2, 2}, four_f32, 16, "got F32 [2, 2]"},
        {si, DT_I32, 2, {1, 1}, &one_i32, 4, "block scales must be F32/BF16 [1, 1], got I32 [1, 1]"},
        {si, DT_F32, 2, {2, 1}, two_f32, 8, "got F32 [2, 1]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *dir = case_dir("fp8-bad-scale");
        rep_dtype = bad[i].dt, rep_ndim = bad[i].ndim, poke = bad[i].p, poke_n = bad[i].n;
        memcpy(rep_shape, bad[i].shape, sizeof rep_shape);
        ASSERT(copy_mutated(d8, dir, bad[i].t, MUT_REPLACE) == 0);
        expect_one_line_error(dir, (const char *[]){bad[i].t, "model.safetensors", bad[i].want, NULL});
    }
    /* the same scale as BF16 (its value rounded) or F32 [1]; the block scales as BF16 */
    char err[1024];
    SafeTensors st = {0};
    ASSERT(safetensors_open_dir(&st, d8, err, sizeof err) == 0, "%s", err);
    float v = dtype_load(DT_F32, safetensors_find(&st, ws)->data, 0), vi = dtype_load(DT_F32, safetensors_find(&st, si)->data, 0);
    safetensors_free(&st);
    uint32_t u, ui;
    memcpy(&u, &v, 4);
    memcpy(&ui, &vi, 4);
    const uint16_t b = (uint16_t)((u + 0x8000) >> 16), bi = (uint16_t)((ui + 0x8000) >> 16);
    const struct { const char *t; DType dt; int ndim; int64_t shape[2]; const void *p; size_t n; } good[] = {
        {ws, DT_BF16, 0, {0}, &b, 2}, {ws, DT_F32, 1, {1}, &v, 4}, {si, DT_BF16, 2, {1, 1}, &bi, 2},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const char *dir = case_dir("fp8-scale-ok");
        rep_dtype = good[i].dt, rep_ndim = good[i].ndim, poke = good[i].p, poke_n = good[i].n;
        memcpy(rep_shape, good[i].shape, sizeof rep_shape);
        ASSERT(copy_mutated(d8, dir, good[i].t, MUT_REPLACE) == 0);
        char cmd[8192], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s logits --model %s --tokens 1,2,3 --out %s/x.f32", test_bin(), dir, test_tmpdir());
        EXPECT(test_run(cmd, &out) == 0, "%s %s: %s: %s", good[i].t, good[i].dt == DT_BF16 ? "BF16" : "F32 [1]", cmd, out);
        free(out);
    }
}
