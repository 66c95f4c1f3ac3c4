/* test_synth: `moeserve synth` and `moeserve quantize` (src/cli/cmd_synth.c, cmd_quantize.c,
 * src/format/ckpt.c) end to end through the binary: the tiny presets load (`info --json`) and run
 * (`logits`, finite and far from flat) in BF16 and NVFP4; synth is byte-for-byte deterministic for
 * a seed whatever the thread count; quantize of a synth BF16 checkpoint is byte-identical to synth
 * NVFP4 of the same seed; quantize of the golden BF16 fixtures reproduces the NVFP4 bytes of
 * tools/make_fixtures.py (ModelOpt's formulas in torch) tensor for tensor; sharding, --layers,
 * MTP layers and --exclude; bad options fail with one error line. Also the fast NVFP4 quantizer
 * of ckpt.c against quant.c's reference on adversarial blocks. Run: make test FILTER=synth. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/util.h"
#include "format/chat_template.h"
#include "format/ckpt.h"
#include "format/quant.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"

#define SYNTH_SEED 20260501
/* A prompt over byte tokens, merges and GLM's special tokens of the tiny tokenizer (ids < 316). */
#define SYNTH_TOKENS "282,284,287,104,101,108,108,111,257,263,300,10,288,1,2,3,250,260,270,280"
#define SYNTH_NTOK 20
#define SYNTH_VOCAB 8192 /* the tiny presets hold the built-in tokenizer */

/* ---- helpers ---- */

/* test_tmpdir()/synth/<name> (rotating static buffers). */
static const char *tdir(const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/synth", test_tmpdir());
    mkdir(p, 0755);
    snprintf(p, 512, "%s/synth/%s", test_tmpdir(), name);
    return p;
}

/* Run "<env> moeserve <args>"; on a non-zero exit print the output and return it. */
static int moeserve(const char *env, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s '%s' %s", env ? env : "", test_bin(), args);
    char *o = NULL;
    int rc = test_run(cmd, &o);
    if (rc != 0) fprintf(stderr, "    $ %s\n    -> exit %d:\n%s", cmd, rc, o ? o : "");
    if (out) *out = o;
    else free(o);
    return rc;
}

static int synth(const char *arch, const char *quant, const char *dir, const char *extra)
{
    char args[2048];
    snprintf(args, sizeof args, "synth --arch %s --preset tiny --quant %s --seed %d --out '%s' %s", arch, quant,
             SYNTH_SEED, dir, extra ? extra : "");
    return moeserve(NULL, args, NULL);
}

/* diff -r: 0 when the two directories hold byte-identical files. */
static int same_dirs(const char *a, const char *b)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "diff -r -q '%s' '%s'", a, b);
    char *o = NULL;
    int rc = test_run(cmd, &o);
    if (rc) fprintf(stderr, "    %s", o ? o : "");
    free(o);
    return rc == 0;
}

/* `moeserve info --model dir --json` parsed (NULL on failure). */
static json_t *info_json(const char *dir)
{
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "info --model '%s' --json", dir);
    if (moeserve(NULL, args, &out)) { free(out); return NULL; }
    const char *brace = strchr(out, '{');
    json_t *j = brace ? json_loads(brace, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    if (!j) fprintf(stderr, "    info --json output is not JSON:\n%s", out);
    free(out);
    return j;
}

/* Run logits over SYNTH_TOKENS into path; returns the floats [SYNTH_NTOK, SYNTH_VOCAB] or NULL. */
static float *run_logits(const char *dir, const char *path)
{
    char args[2048];
    snprintf(args, sizeof args, "logits --model '%s' --tokens %s --out '%s'", dir, SYNTH_TOKENS, path);
    if (moeserve(NULL, args, NULL)) return NULL;
    size_t n;
    char *buf = file_read_all(path, &n);
    if (!buf || n != (size_t)SYNTH_NTOK * SYNTH_VOCAB * 4) {
        fprintf(stderr, "    %s: %zu bytes, expected %d\n", path, n, SYNTH_NTOK * SYNTH_VOCAB * 4);
        free(buf);
        return NULL;
    }
    return (float *)buf;
}

/* Every tensor of a is in b with the same dtype, shape and bytes (skip: names ending in it are
   only checked for presence). Returns the number compared, -1 on a difference. */
static int same_tensors(const char *a, const char *b, const char *skip)
{
    SafeTensors sa = {0}, sb = {0};
    char err[1024];
    if (safetensors_open_dir(&sa, a, err, sizeof err) || safetensors_open_dir(&sb, b, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        safetensors_free(&sa);
        safetensors_free(&sb);
        return -1;
    }
    int n = 0, bad = 0;
    if (sa.n_tensors != sb.n_tensors) {
        test_fail(__FILE__, __LINE__, "%s has %d tensors, %s has %d", a, sa.n_tensors, b, sb.n_tensors);
        bad++;
    }
    for (int i = 0; i < sa.n_tensors && bad < 5; i++) {
        const StTensor *x = &sa.tensors[i], *y = safetensors_find(&sb, x->name);
        if (!y) { test_fail(__FILE__, __LINE__, "'%s' of %s is missing in %s", x->name, a, b); bad++; continue; }
        size_t ln = strlen(x->name), ls = skip ? strlen(skip) : 0;
        if (skip && ln >= ls && !strcmp(x->name + ln - ls, skip)) continue;
        int same = x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes &&
                   !memcmp(x->shape, y->shape, sizeof x->shape) && !memcmp(x->data, y->data, x->nbytes);
        if (!same) {
            size_t k = 0;
            while (k < x->nbytes && k < y->nbytes && x->data[k] == y->data[k]) k++;
            test_fail(__FILE__, __LINE__, "'%s': %s %s vs %s %s differ (first at byte %zu of %zu)", x->name, a,
                      dtype_name(x->dtype), b, dtype_name(y->dtype), k, x->nbytes);
            bad++;
        }
        n++;
    }
    safetensors_free(&sa);
    safetensors_free(&sb);
    return bad ? -1 : n;
}

/* Lines of out that start with "error:". */
static int error_lines(const char *out)
{
    int n = 0;
    for (const char *p = out; p; p = strchr(p, '\n')) {
        if (*p == '\n') p++;
        if (!strncmp(p, "error:", 6)) n++;
    }
    return n;
}

static const char *arch_name(const char *arch)
{
    return !strcmp(arch, "glm5") ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM";
}

/* synth tiny arch/quant -> info --json loads with the expected formats -> logits finite, not flat. */
static void check_tiny(const char *arch, const char *quant)
{
    char name[64], lpath[600];
    snprintf(name, sizeof name, "tiny-%s-%s", arch, quant);
    const char *dir = tdir(name);
    ASSERT(synth(arch, quant, dir, NULL) == 0, "synth %s %s", arch, quant);
    json_t *j = info_json(dir);
    ASSERT(j, "info --json on %s", dir);
    EXPECT(!strcmp(json_string_value(json_object_get(j, "architecture")), arch_name(arch)), "architecture");
    EXPECT_EQ_INT(json_integer_value(json_object_get(j, "layers")), 4);
    EXPECT_EQ_INT(json_integer_value(json_object_get(j, "moe_layers")), 3);
    json_t *formats = json_object_get(json_object_get(j, "precision"), "formats");
    json_int_t nv = json_integer_value(json_object_get(json_object_get(formats, "nvfp4"), "modules"));
    json_int_t bf = json_integer_value(json_object_get(json_object_get(formats, "bf16"), "modules"));
    if (!strcmp(quant, "nvfp4")) {
        /* everything but embedding, lm_head and the 3 routers */
        EXPECT(nv > 100, "nvfp4 linears %lld", (long long)nv);
        EXPECT_EQ_INT(bf, 5);
    } else {
        EXPECT_EQ_INT(nv, 0);
        EXPECT(bf > 100, "bf16 linears %lld", (long long)bf);
    }
    json_decref(j);

    snprintf(lpath, sizeof lpath, "%s.logits", dir);
    float *lg = run_logits(dir, lpath);
    ASSERT(lg, "logits on %s", dir);
    double s = 0, s2 = 0;
    int finite = 1;
    for (int i = 0; i < SYNTH_NTOK * SYNTH_VOCAB; i++) {
        finite &= isfinite(lg[i]) != 0;
        s += lg[i];
        s2 += (double)lg[i] * lg[i];
    }
    double n = SYNTH_NTOK * SYNTH_VOCAB, std = sqrt(s2 / n - (s / n) * (s / n));
    EXPECT(finite, "%s: non-finite logits", name);
    EXPECT(std > 0.5, "%s: logits std %.4f: flat", name, std);
    /* rows differ from each other: the model reads its input */
    EXPECT(memcmp(lg, lg + SYNTH_VOCAB, SYNTH_VOCAB * sizeof(float)) != 0, "%s: rows 0 and 1 equal", name);
    fprintf(stderr, "    %s: logits std %.3f (seed %d)\n", name, std, SYNTH_SEED);
    free(lg);
}

/* ---- tests ---- */

TEST(synth_tiny_glm5_bf16) { check_tiny("glm5", "bf16"); }
TEST(synth_tiny_glm5_nvfp4) { check_tiny("glm5", "nvfp4"); }
TEST(synth_tiny_glm4_moe_bf16) { check_tiny("glm4_moe", "bf16"); }
TEST(synth_tiny_glm4_moe_nvfp4) { check_tiny("glm4_moe", "nvfp4"); }

/* Byte-identical output for a seed: twice, and with 1 vs 2 OpenMP threads; another seed differs. */
TEST(synth_deterministic)
{
    const char *args = "synth --arch glm4_moe --preset tiny --quant nvfp4 --mtp 1 --seed 11 --out";
    const char *a = tdir("det-a"), *b = tdir("det-b"), *c = tdir("det-c"), *d = tdir("det-d");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s '%s'", args, a);
    ASSERT(moeserve("OMP_NUM_THREADS=1", cmd, NULL) == 0, "synth 1 thread");
    snprintf(cmd, sizeof cmd, "%s '%s'", args, b);
    ASSERT(moeserve("OMP_NUM_THREADS=2", cmd, NULL) == 0, "synth 2 threads");
    snprintf(cmd, sizeof cmd, "%s '%s' --threads 3", args, c);
    ASSERT(moeserve(NULL, cmd, NULL) == 0, "synth 3 threads");
    EXPECT(same_dirs(a, b), "1 vs 2 threads");
    EXPECT(same_dirs(a, c), "1 vs 3 threads");
    snprintf(cmd, sizeof cmd, "synth --arch glm4_moe --preset tiny --quant nvfp4 --mtp 1 --seed 12 --out '%s'", d);
    ASSERT(moeserve(NULL, cmd, NULL) == 0, "synth seed 12");
    snprintf(cmd, sizeof cmd, "cmp -s '%s/model.safetensors' '%s/model.safetensors'", a, d);
    EXPECT(test_run(cmd, NULL) != 0, "seeds 11 and 12 gave the same weights");
}

/* quantize(synth bf16) == synth nvfp4 of the same seed: every file, byte for byte (synth NVFP4 is
   quantize-after-generate by design). The BF16 input is sharded, so the file order across
   shards is exercised too. */
TEST(synth_quantize_equals_synth_nvfp4)
{
    static const char *const arch[] = {"glm5", "glm4_moe"};
    for (int i = 0; i < 2; i++) {
        char n1[64], n2[64], n3[64], args[2048];
        snprintf(n1, sizeof n1, "qe-%s-bf16", arch[i]);
        snprintf(n2, sizeof n2, "qe-%s-nvfp4", arch[i]);
        snprintf(n3, sizeof n3, "qe-%s-quantized", arch[i]);
        const char *bf = tdir(n1), *nv = tdir(n2), *qd = tdir(n3);
        ASSERT(synth(arch[i], "bf16", bf, "--mtp 1 --shard-mb 1") == 0, "synth bf16");
        ASSERT(synth(arch[i], "nvfp4", nv, "--mtp 1") == 0, "synth nvfp4");
        snprintf(args, sizeof args, "quantize --model '%s' --out '%s'", bf, qd);
        ASSERT(moeserve(NULL, args, NULL) == 0, "quantize");
        EXPECT(same_tensors(nv, qd, NULL) > 0, "%s: tensors", arch[i]);
        EXPECT(same_dirs(nv, qd), "%s: files", arch[i]);
    }
}

/* quantize of the golden BF16 fixtures == the fixtures' NVFP4 (tools/make_fixtures.py, torch),
   for every tensor; input_scale differs by design (calibrated there, 1.0 here). */
TEST(synth_quantize_golden)
{
    static const char *const fam[] = {"glm5", "glm4moe"};
    int ran = 0;
    for (int i = 0; i < 2; i++) {
        char bfn[64], nvn[64], out[64], args[2048];
        snprintf(bfn, sizeof bfn, "golden/%s-bf16", fam[i]);
        snprintf(nvn, sizeof nvn, "golden/%s-nvfp4", fam[i]);
        snprintf(out, sizeof out, "golden-%s", fam[i]);
        char bf[600], nv[600];
        snprintf(bf, sizeof bf, "%s", test_data(bfn));
        snprintf(nv, sizeof nv, "%s", test_data(nvn));
        char p1[700], p2[700];
        snprintf(p1, sizeof p1, "%s/model.safetensors", bf);
        snprintf(p2, sizeof p2, "%s/model.safetensors", nv);
        if (!file_exists(p1) || !file_exists(p2)) continue;
        const char *qd = tdir(out);
        snprintf(args, sizeof args, "quantize --model '%s' --out '%s'", bf, qd);
        ASSERT(moeserve(NULL, args, NULL) == 0, "quantize %s", bf);
        int n = same_tensors(qd, nv, ".input_scale");
        EXPECT(n > 0, "%s: quantize differs from the fixture", fam[i]);
        fprintf(stderr, "    %s: %d tensors identical to %s\n", fam[i], n, nv);
        ran++;
    }
    if (!ran) test_skip("tests/data/golden/{glm5,glm4moe}-{bf16,nvfp4} absent (tools/make_fixtures.py makes them)");
}

/* --shard-mb 1: several shards and an index that loads, the same tensors and logits as one file;
   writing one file into the same directory afterwards removes the old shards. */
TEST(synth_shards)
{
    const char *one = tdir("shard-one"), *many = tdir("shard-many");
    ASSERT(synth("glm5", "bf16", one, NULL) == 0, "synth one file");
    ASSERT(synth("glm5", "bf16", many, "--shard-mb 1") == 0, "synth shards");
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", many);
    EXPECT(file_exists(p), "no index");
    json_t *idx = json_load_file(p, 0, NULL);
    ASSERT(idx, "index is not JSON");
    json_t *wm = json_object_get(idx, "weight_map"), *v;
    const char *k, *names[64];
    int shards = 0;
    json_object_foreach(wm, k, v) { /* distinct shard names */
        int seen = 0;
        for (int i = 0; i < shards; i++) seen |= !strcmp(names[i], json_string_value(v));
        if (!seen && shards < 64) names[shards++] = json_string_value(v);
    }
    EXPECT(shards >= 2, "only %d shard names in the index", shards);
    json_decref(idx);
    snprintf(p, sizeof p, "%s/model-00001-of-", many);
    char cmd[900], *lsout = NULL;
    snprintf(cmd, sizeof cmd, "ls '%s'*.safetensors | wc -l", p);
    EXPECT(test_run(cmd, &lsout) == 0 && atoi(lsout) == 1, "no model-00001-of-N shard: %s", lsout ? lsout : "");
    free(lsout);
    snprintf(p, sizeof p, "%s/model.safetensors", many);
    EXPECT(!file_exists(p), "model.safetensors beside shards");
    EXPECT(same_tensors(one, many, NULL) > 0, "shards differ from one file");
    char l1[700], l2[700];
    snprintf(l1, sizeof l1, "%s.logits", one);
    snprintf(l2, sizeof l2, "%s.logits", many);
    float *a = run_logits(one, l1), *b = run_logits(many, l2);
    EXPECT(a && b && !memcmp(a, b, SYNTH_NTOK * SYNTH_VOCAB * sizeof(float)), "logits differ");
    free(a);
    free(b);
    /* back to one file: the index and the shards go */
    ASSERT(synth("glm5", "bf16", many, NULL) == 0, "synth one file over shards");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", many);
    EXPECT(!file_exists(p), "stale index left");
    EXPECT(same_dirs(one, many), "rewritten directory differs");
}

/* --layers N keeps a MoE layer: first_k_dense_replace = min(preset, N - 1). */
TEST(synth_layers)
{
    const char *d1 = tdir("layers-1"), *d2 = tdir("layers-6");
    ASSERT(synth("glm4_moe", "bf16", d1, "--layers 1") == 0, "--layers 1");
    ASSERT(synth("glm5", "nvfp4", d2, "--layers 6") == 0, "--layers 6");
    json_t *j1 = info_json(d1), *j2 = info_json(d2);
    ASSERT(j1 && j2, "info");
    EXPECT_EQ_INT(json_integer_value(json_object_get(j1, "layers")), 1);
    EXPECT_EQ_INT(json_integer_value(json_object_get(j1, "moe_layers")), 1);
    EXPECT_EQ_INT(json_integer_value(json_object_get(j2, "layers")), 6);
    EXPECT_EQ_INT(json_integer_value(json_object_get(j2, "dense_layers")), 1);
    json_decref(j1);
    json_decref(j2);
    char l[700];
    snprintf(l, sizeof l, "%s.logits", d1);
    float *lg = run_logits(d1, l);
    EXPECT(lg != NULL, "logits with one layer");
    free(lg);
}

/* An MTP layer is written with the release's extra tensors and stays BF16 under NVFP4, recorded
   in the exclude list; the engine skips it. --exclude adds patterns to what quantize leaves. */
TEST(synth_mtp_and_exclude)
{
    const char *nv = tdir("mtp-nvfp4"), *bf = tdir("mtp-bf16"), *qd = tdir("mtp-excl");
    ASSERT(synth("glm5", "nvfp4", nv, "--mtp 1") == 0, "synth");
    SafeTensors st = {0};
    char err[1024];
    ASSERT(safetensors_open_dir(&st, nv, err, sizeof err) == 0, "%s", err);
    const char *bf16_names[] = {"model.layers.4.mlp.experts.0.gate_proj.weight", "model.layers.4.eh_proj.weight",
                                "model.layers.4.self_attn.q_a_proj.weight", "model.layers.3.mlp.gate.weight",
                                "lm_head.weight", "model.embed_tokens.weight"};
    for (size_t i = 0; i < sizeof bf16_names / sizeof bf16_names[0]; i++) {
        const StTensor *t = safetensors_find(&st, bf16_names[i]);
        EXPECT(t && t->dtype == DT_BF16, "%s should be BF16", bf16_names[i]);
    }
    const StTensor *t = safetensors_find(&st, "model.layers.3.mlp.experts.0.gate_proj.weight");
    EXPECT(t && t->dtype == DT_U8, "layer 3 experts should be NVFP4");
    t = safetensors_find(&st, "model.layers.3.mlp.gate.e_score_correction_bias");
    EXPECT(t && t->dtype == DT_F32, "e_score_correction_bias should be F32");
    safetensors_free(&st);
    QuantConfig q;
    ASSERT(quant_config_load(&q, nv, err, sizeof err) == 0, "%s", err);
    EXPECT(q.algo == QALGO_NVFP4 && !strcmp(q.source, "hf_quant_config.json"), "quant config");
    EXPECT(quant_config_excluded(&q, "model.layers.4.mlp.experts.0.gate_proj"), "MTP not excluded");
    EXPECT(!quant_config_excluded(&q, "model.layers.3.mlp.experts.0.gate_proj"), "layer 3 excluded");
    EXPECT(quant_config_excluded(&q, "model.layers.3.mlp.gate"), "router not excluded");
    quant_config_free(&q);
    char l[700];
    snprintf(l, sizeof l, "%s.logits", nv);
    float *lg = run_logits(nv, l);
    EXPECT(lg != NULL, "logits with an MTP layer");
    free(lg);

    ASSERT(synth("glm5", "bf16", bf, "--mtp 1") == 0, "synth bf16");
    char args[2048];
    snprintf(args, sizeof args, "quantize --model '%s' --out '%s' --exclude '*self_attn*,model.layers.0.mlp*'", bf, qd);
    ASSERT(moeserve(NULL, args, NULL) == 0, "quantize --exclude");
    ASSERT(safetensors_open_dir(&st, qd, err, sizeof err) == 0, "%s", err);
    t = safetensors_find(&st, "model.layers.2.self_attn.indexer.wk.weight");
    EXPECT(t && t->dtype == DT_BF16, "indexer should be BF16");
    t = safetensors_find(&st, "model.layers.0.mlp.down_proj.weight");
    EXPECT(t && t->dtype == DT_BF16, "dense MLP of layer 0 should be BF16");
    t = safetensors_find(&st, "model.layers.1.mlp.shared_experts.down_proj.weight");
    EXPECT(t && t->dtype == DT_U8, "shared experts should be NVFP4");
    safetensors_free(&st);
    ASSERT(quant_config_load(&q, qd, err, sizeof err) == 0, "%s", err);
    EXPECT(quant_config_excluded(&q, "model.layers.1.self_attn.o_proj"), "--exclude not recorded");
    quant_config_free(&q);
    snprintf(l, sizeof l, "%s.logits", qd);
    lg = run_logits(qd, l);
    EXPECT(lg != NULL, "logits of the partly quantized model");
    free(lg);
}

/* The real shapes: sizes are printed before anything is written (--dry-run), and a disk without
   room is refused up front with one error line. */
TEST(synth_big_presets)
{
    static const struct { const char *preset, *quant, *params; } c[] = {
        {"glm5", "bf16", "753.864 B parameters"},      /* 753.86 B with MTP (model.c) */
        {"glm5-layer", "nvfp4", "11.781 B parameters"}, /* one MoE layer + embedding + lm_head */
        {"glm4.5", "bf16", "358.338 B parameters"},     /* 356.79 B + the MTP layer's embedding/head */
        {"glm4.5-air", "nvfp4", "110.469 B parameters"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char args[512], *out = NULL;
        snprintf(args, sizeof args, "synth --preset %s --quant %s --dry-run", c[i].preset, c[i].quant);
        EXPECT(moeserve(NULL, args, &out) == 0, "%s", args);
        EXPECT(out && strstr(out, c[i].params), "%s: expected '%s' in: %s", args, c[i].params, out ? out : "");
        free(out);
    }
    struct statvfs s;
    const char *dir = tdir("glm5-full");
    if (statvfs(test_tmpdir(), &s) == 0 && (double)s.f_bavail * s.f_frsize > 1.6e12) {
        test_skip("%s has room for the 1.5 TB GLM-5 checkpoint; not writing it", test_tmpdir());
        return;
    }
    char cmd[4800], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' synth --preset glm5 --out '%s'", test_bin(), dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc != 0, "glm5 on a small disk should be refused");
    EXPECT(out && strstr(out, "1507728316928 bytes") && strstr(out, "free"), "%s", out ? out : "");
    EXPECT(out && error_lines(out) == 1, "%s", out ? out : "");
    EXPECT(!file_exists(dir), "refused synth created %s", dir);
    free(out);
}

/* n bytes written at the start of tensor `name`'s data in dir/model.safetensors (its header's data_offsets) */
static int poke_tensor(const char *dir, const char *name, const unsigned char *bytes, size_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    uint64_t hl = 0;
    unsigned char l8[8];
    int rc = -1;
    if (fread(l8, 1, 8, f) == 8) {
        for (int i = 7; i >= 0; i--) hl = hl << 8 | l8[i];
        char *h = malloc(hl + 1);
        json_t *j = h && fread(h, 1, hl, f) == hl ? json_loadb(h, hl, 0, NULL) : NULL;
        json_t *off = json_object_get(json_object_get(j, name), "data_offsets");
        if (json_is_array(off) && fseek(f, (long)(8 + hl + json_integer_value(json_array_get(off, 0))), SEEK_SET) == 0 &&
            fwrite(bytes, 1, n, f) == n)
            rc = 0;
        json_decref(j);
        free(h);
    }
    fclose(f);
    return rc;
}

/* A BF16 weight with a NaN or an infinity: quantize refuses it with one error line naming the
 * tensor, and leaves neither a half-written checkpoint nor the directory it would have made
 * (its weight_scale_2 would not be finite: a checkpoint the loader refuses, or NaN logits). */
TEST(quantize_refuses_non_finite)
{
    const char *bf = tdir("nonfinite-bf16"), *t = "model.layers.1.mlp.experts.0.up_proj.weight";
    ASSERT(synth("glm5", "bf16", bf, NULL) == 0, "synth bf16");
    const unsigned char vals[2][2] = {{0xc0, 0x7f}, {0x80, 0xff}}; /* BF16 NaN, -inf (little-endian) */
    for (int v = 0; v < 2; v++) {
        ASSERT(poke_tensor(bf, t, vals[v], 2) == 0, "poke %s", t);
        const char *qd = tdir(v ? "nonfinite-q-inf" : "nonfinite-q-nan");
        char cmd[4800], *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' quantize --model '%s' --out '%s'", test_bin(), bf, qd);
        int rc = test_run(cmd, &out);
        EXPECT(rc == 1, "%s: exit %d", cmd, rc);
        /* named whether it or its gate_proj (which shares weight_scale_2 with it) is written first */
        EXPECT(out && error_lines(out) == 1 && strstr(out, t) && strstr(out, "NaN or infinite"), "%s", out ? out : "");
        EXPECT(!file_exists(qd), "a failed quantize left %s", qd);
        free(out);
    }
}

/* Bad options: one "error:" line (not a file:line internal error), exit status != 0. */
TEST(synth_bad_options)
{
    const char *d = tdir("bad"), *nv = tdir("bad-nvfp4");
    ASSERT(synth("glm5", "nvfp4", nv, NULL) == 0, "synth nvfp4");
    /* NVFP4 tensors under a BF16 config.json: found by looking at the tensors */
    const char *mixed = tdir("bad-mixed"), *bf = tdir("bad-bf16");
    ASSERT(synth("glm5", "bf16", bf, NULL) == 0, "synth bf16");
    char sh[2048];
    snprintf(sh, sizeof sh, "mkdir -p '%s' && cp '%s/config.json' '%s/' && cp '%s/model.safetensors' '%s/'", mixed, bf,
             mixed, nv, mixed);
    ASSERT(test_run(sh, NULL) == 0, "%s", sh);
    char cases[13][6000];
    const char *bin = test_bin();
    int n = 0;
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset nope --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm4_moe --preset glm5 --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset glm4.5-air --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset tiny --layers 0 --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset tiny", bin);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset tiny --quant fp8 --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --preset tiny --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm6 --preset tiny --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' synth --arch glm5 --preset tiny --shard-mb 0 --out '%s'", bin, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' quantize --model '%s'", bin, nv);
    snprintf(cases[n++], sizeof cases[0], "'%s' quantize --model '%s' --out '%s'", bin, nv, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' quantize --model '%s/none' --out '%s'", bin, d, d);
    snprintf(cases[n++], sizeof cases[0], "'%s' quantize --model '%s' --out '%s'", bin, mixed, d);
    for (int i = 0; i < n; i++) {
        char *out = NULL;
        int rc = test_run(cases[i], &out);
        EXPECT(rc != 0 && rc < 128, "%s: exit %d", cases[i], rc);
        EXPECT(error_lines(out) == 1, "%s: %d error lines:\n%s", cases[i], error_lines(out), out);
        EXPECT(!strstr(out, ".c:"), "%s: internal error:\n%s", cases[i], out);
        free(out);
    }
    EXPECT(!file_exists(d), "a failed command created %s", d);
}

/* quantize does not write over an existing output: a non-empty --out is refused (one error line,
   its files untouched) unless --force is given; an empty directory is fine. */
TEST(quantize_refuses_existing_out)
{
    const char *bf = tdir("force-bf16"), *qd = tdir("force-out"), *empty = tdir("force-empty");
    ASSERT(synth("glm4_moe", "bf16", bf, NULL) == 0, "synth bf16");
    char path[600], args[2048], *out = NULL;
    mkdir(qd, 0755);
    snprintf(path, sizeof path, "%s/keep.txt", qd);
    FILE *f = fopen(path, "w");
    ASSERT(f, "%s", path);
    fputs("an earlier file\n", f);
    fclose(f);
    snprintf(args, sizeof args, "'%s' quantize --model '%s' --out '%s'", test_bin(), bf, qd);
    int rc = test_run(args, &out);
    EXPECT(rc != 0 && rc < 128, "quantize over a non-empty --out: exit %d", rc);
    EXPECT(out && strstr(out, "--force"), "the error names --force:\n%s", out ? out : "");
    EXPECT(error_lines(out) == 1, "%d error lines:\n%s", error_lines(out), out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/config.json", qd);
    EXPECT(!file_exists(path), "the refused quantize wrote %s", path);
    snprintf(path, sizeof path, "%s/keep.txt", qd);
    EXPECT(file_exists(path), "the refused quantize removed %s", path);
    snprintf(args, sizeof args, "quantize --model '%s' --out '%s' --force", bf, qd);
    EXPECT(moeserve(NULL, args, NULL) == 0, "quantize --force over a non-empty --out");
    snprintf(path, sizeof path, "%s/config.json", qd);
    EXPECT(file_exists(path), "quantize --force wrote no %s", path);
    mkdir(empty, 0755);
    snprintf(args, sizeof args, "quantize --model '%s' --out '%s'", bf, empty);
    EXPECT(moeserve(NULL, args, NULL) == 0, "quantize into an empty directory");
}

/* tokenizer.json and tokenizer_config.json are the built-in model's (embedded at build time), and
   config.json's eos and pad are its <|endoftext|>, <|user|>, <|observation|>. */
TEST(synth_tokenizer)
{
    const char *dir = tdir("tok");
    ASSERT(synth("glm5", "bf16", dir, NULL) == 0, "synth");
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char a[700], b[4300];
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/models/builtin/%s", test_root(), files[i]);
        size_t na, nb;
        char *x = file_read_all(a, &na), *y = file_read_all(b, &nb);
        EXPECT(x && y && na == nb && !memcmp(x, y, na), "%s differs from models/builtin's", files[i]);
        free(x);
        free(y);
    }
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    ASSERT(cfg, "config.json");
    EXPECT_EQ_INT(json_integer_value(json_array_get(json_object_get(cfg, "eos_token_id"), 0)), 8168);
    EXPECT_EQ_INT(json_integer_value(json_array_get(json_object_get(cfg, "eos_token_id"), 1)), 8175);
    EXPECT_EQ_INT(json_integer_value(json_array_get(json_object_get(cfg, "eos_token_id"), 2)), 8177);
    EXPECT_EQ_INT(json_integer_value(json_object_get(cfg, "pad_token_id")), 8168);
    json_decref(cfg);
}

/* The synth tokenizer and chat template through moeserve's own tokenizer and Jinja renderer:
   the ids and the prompt transformers gives (checked in synth_tokenizer). */
TEST(synth_tokenizer_in_moeserve)
{
    const char *dir = tdir("tok-c");
    ASSERT(synth("glm4_moe", "bf16", dir, NULL) == 0, "synth");
    char err[512];
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    ASSERT(t, "tokenizer_load: %s", err);
    int eot = tokenizer_token_id(t, "<|endoftext|>"), user = tokenizer_token_id(t, "<|user|>");
    EXPECT(eot == 8168 && user == eot + 7, "<|endoftext|> %d <|user|> %d", eot, user);
    EXPECT_EQ_INT(tokenizer_eos_id(t), eot);
    EXPECT(tokenizer_is_special(t, eot + 2), "[gMASK] should be special");
    const char *text = "[gMASK]<sop><|user|>\nhello the world";
    int *ids = NULL;
    int n = tokenizer_encode(t, text, strlen(text), 0, &ids, err, sizeof err);
    ASSERT(n > 3, "encode: %s", err);
    EXPECT(ids[0] == eot + 2 && ids[1] == eot + 4 && ids[2] == user, "ids %d %d %d", ids[0], ids[1], ids[2]);
    EXPECT(n < (int)strlen(text) - 20, "%d ids: the merges are not used", n);
    char *back = NULL;
    size_t blen = 0;
    EXPECT(tokenizer_decode(t, ids, n, 0, &back, &blen) >= 0 && back && !strcmp(back, text), "decode: '%s'",
           back ? back : "");
    free(back);
    free(ids);
    tokenizer_free(t);

    ChatTemplate *ct = chat_template_load(dir, err, sizeof err);
    ASSERT(ct, "chat_template_load: %s", err);
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi there");
    char *prompt = NULL;
    EXPECT(chat_template_render(ct, msgs, NULL, 1, NULL, NULL, "<|endoftext|>", &prompt, err, sizeof err) == 0,
           "render: %s", err);
    const char *want = "[gMASK]<sop><|user|>\nhi there<|assistant|>";
    EXPECT(prompt && !strncmp(prompt, want, strlen(want)), "prompt '%s'", prompt ? prompt : "");
    free(prompt);
    json_decref(msgs);
    chat_template_free(ct);
}

/* ckpt_nvfp4_quantize (fast) == nvfp4_quantize (quant.c reference), bit for bit: random rows over
   12 decades, and blocks built to sit on every E2M1 rounding boundary, zeros, -0, NaN, inf,
   subnormal-scale and saturating blocks. */
TEST(synth_nvfp4_fast_equals_reference)
{
    enum { N = 64, K = 256 };
    static float w[N * K];
    static uint8_t c1[N * K / 2], s1[N * K / 16], c2[N * K / 2], s2[N * K / 16];
    Rng r;
    rng_seed(&r, SYNTH_SEED);
    for (int i = 0; i < N * K; i++) w[i] = rng_normal(&r) * powf(10.0f, (float)(i / K % 12) - 6.0f);
    /* row 0 with g = 1: a block holding 6 gets scale 1, so its values are their own E2M1 inputs */
    static const float edge[16] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                                   -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, -0.0f};
    for (int b = 0; b < K / 16; b++)
        for (int j = 0; j < 16; j++) {
            float v = edge[j] * (b % 4 == 1 ? 1.0f + 0x1p-23f : b % 4 == 2 ? 1.0f - 0x1p-24f : 1.0f);
            w[b * 16 + j] = b % 4 == 3 ? edge[j] * 0.5f : v;
        }
    for (int j = 0; j < 16; j++) w[K + j] = 0.0f;           /* all-zero block */
    for (int j = 0; j < 16; j++) w[K + 16 + j] = 1e-30f * j; /* scale clamps to 2^-9 */
    for (int j = 0; j < 16; j++) w[K + 32 + j] = 1e30f * (j - 8); /* scale clamps to 448 */
    w[K + 48] = NAN;
    w[K + 49] = -INFINITY;
    w[K + 64] = INFINITY;
    w[K + 65] = -NAN;
    const float gs[] = {1.0f, 0.001f, 3.7e-5f};
    for (int gi = 0; gi < 3; gi++) {
        nvfp4_quantize(w, N, K, gs[gi], c1, s1);
        ckpt_nvfp4_quantize(w, N, K, gs[gi], c2, s2);
        int dc = 0, ds = 0;
        for (int i = 0; i < N * K / 2; i++) dc += c1[i] != c2[i];
        for (int i = 0; i < N * K / 16; i++) ds += s1[i] != s2[i];
        EXPECT(dc == 0 && ds == 0, "g = %g: %d code bytes and %d scales differ", (double)gs[gi], dc, ds);
    }
}
