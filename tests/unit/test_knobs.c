/* test_knobs: the MOESERVE_* table (src/base/knobs.h): values from the environment, bad values
 * falling back to the default with a warning, overrides, and docs/USAGE.md listing exactly what
 * `moeserve help env` prints from the table. The test hooks (src/base/test_hooks.h) beside them:
 * listed in docs/USAGE.md, read from the environment only, the GEMM repeat a swapped op table.
 * Only knobs.c and test_hooks.c read MOESERVE_* variables. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "base/knobs.h"
#include "base/test_hooks.h"
#include "base/util.h"
#include "test.h"

TEST(knobs_documented_from_the_table)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s help env 2>/dev/null", test_bin());
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    char *doc = file_read_all("docs/USAGE.md", NULL);
    ASSERT(doc, "docs/USAGE.md (the tests run from the repository root)");
    const char *open = "<!-- knobs: the output of `moeserve help env` (a test holds them equal) -->\n";
    char *a = strstr(doc, open), *b = a ? strstr(a, "<!-- knobs end -->") : NULL;
    ASSERT(a && b, "docs/USAGE.md holds the knobs block");
    a += strlen(open);
    EXPECT((size_t)(b - a) == strlen(out) && !memcmp(a, out, strlen(out)),
           "docs/USAGE.md's list is `moeserve help env` (paste its output between the markers):\n%s", out);
    /* every knob is in the list */
    for (int k = 0; k < KNOB_COUNT; k++) EXPECT(strstr(out, knob_info(k)->var), "%s listed", knob_info(k)->var);
    free(doc);
    free(out);
}

TEST(knobs_from_the_environment)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "MOESERVE_W4_ACT=bf16 MOESERVE_SHARED_SIDE=64 MOESERVE_INDEXER_SIDE=5000 "
             "MOESERVE_MLA_KERNEL=v9 MOESERVE_COMM_TIMEOUT=12x MOESERVE_TUNE_CACHE=/tmp/t.json %s help env --values 2>&1",
             test_bin());
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    EXPECT(strstr(out, "MOESERVE_W4_ACT=bf16 (set)"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_SHARED_SIDE=64 (set)"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_TUNE_CACHE=/tmp/t.json (set)"), "%s", out);
    /* bad values: one warning each, naming the variable and what is allowed, and the default holds */
    EXPECT(strstr(out, "warning: MOESERVE_INDEXER_SIDE=5000: out of range [0, 1024]; using 16"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_INDEXER_SIDE=16 (default)"), "%s", out);
    EXPECT(strstr(out, "warning: MOESERVE_MLA_KERNEL=v9: not one of the choices (auto|grouped|per-head); using auto"), "%s", out);
    EXPECT(strstr(out, "warning: MOESERVE_COMM_TIMEOUT=12x: not an integer"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_LOG=2 (default)"), "%s", out);
    free(out);
}

TEST(knobs_override_and_restore)
{
    long was = knob_get(KNOB_SHARED_SIDE);
    int set = knob_is_set(KNOB_SHARED_SIDE);
    knob_override(KNOB_SHARED_SIDE, 7);
    EXPECT_EQ_INT(knob_get(KNOB_SHARED_SIDE), 7);
    EXPECT_EQ_INT(knob_is_set(KNOB_SHARED_SIDE), 1);
    knob_override(KNOB_SHARED_SIDE, -1);
    EXPECT_EQ_INT(knob_get(KNOB_SHARED_SIDE), was);
    EXPECT_EQ_INT(knob_is_set(KNOB_SHARED_SIDE), set);
    /* a choice's value is its index in the list */
    knob_override(KNOB_W4_ACT, 1);
    EXPECT(!strcmp(knob_info(KNOB_W4_ACT)->choices, "split|bf16"));
    EXPECT_EQ_INT(knob_get(KNOB_W4_ACT), 1);
    knob_override(KNOB_W4_ACT, -1);
}

/* Every file under dir (recursively) whose text holds needle: their paths, one a line, into out. */
static void files_holding(const char *dir, const char *needle, char *out, size_t n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            files_holding(p, needle, out, n);
            continue;
        }
        char *text = file_read_all(p, NULL);
        if (text && strstr(text, needle)) {
            size_t o = strlen(out);
            snprintf(out + o, n - o, "%s\n", p);
        }
        free(text);
    }
    if (d) closedir(d);
}

/* The table is the one reader of the knobs, and test_hooks.c of the hooks: no other file of src/
 * (the CUDA backend's included) asks the environment for a MOESERVE_* variable. */
TEST(knobs_read_in_two_files)
{
    char found[8192] = "";
    files_holding("src", "getenv(\"MOESERVE", found, sizeof found);
    EXPECT(!strcmp(found, "src/base/knobs.c\n") || !strcmp(found, "src/base/test_hooks.c\n") ||
               !strcmp(found, "src/base/knobs.c\nsrc/base/test_hooks.c\n") ||
               !strcmp(found, "src/base/test_hooks.c\nsrc/base/knobs.c\n"),
           "getenv(\"MOESERVE_...\") outside src/base/knobs.c and src/base/test_hooks.c:\n%s", found);
}

TEST(knobs_test_hooks_documented)
{
    char *list = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&list, &len);
    ASSERT(f);
    test_hooks_print(f);
    fclose(f);
    char *doc = file_read_all("docs/USAGE.md", NULL);
    ASSERT(doc, "docs/USAGE.md (the tests run from the repository root)");
    const char *open = "<!-- test hooks: test_hooks_print's list (a test holds them equal) -->\n";
    char *a = strstr(doc, open), *b = a ? strstr(a, "<!-- test hooks end -->") : NULL;
    ASSERT(a && b, "docs/USAGE.md holds the test hooks block");
    a += strlen(open);
    EXPECT((size_t)(b - a) == len && !memcmp(a, list, len),
           "docs/USAGE.md's test hooks are test_hooks_print's list (paste it between the markers):\n%s", list);
    EXPECT(!strstr(doc, "--inject-"), "docs/USAGE.md still names an --inject- option");
    free(doc);
    free(list);
}

/* The hooks come from the environment: a bad value is named in a warning and changes nothing;
 * the command line has no options for them. */
TEST(knobs_test_hooks_from_the_environment)
{
    char cmd[2048], dir[600], *out = NULL;
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(cmd, sizeof cmd,
             "MOESERVE_TEST_GEMM_REPEAT=0 MOESERVE_TEST_HOST_DELAY_US=5ms MOESERVE_TEST_COMM_DELAY_US=-1 "
             "%s logits --model '%s' --tokens 1,2,3 --device cpu --threads 1 --out /dev/null 2>&1 </dev/null",
             test_bin(), dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "exit %d: %s", rc, out ? out : "");
    EXPECT(out && strstr(out, "warning: MOESERVE_TEST_GEMM_REPEAT=0: expected an integer in [1, 10000]; no hook"),
           "%s", out ? out : "");
    EXPECT(out && strstr(out, "warning: MOESERVE_TEST_HOST_DELAY_US=5ms: expected an integer in [0, 10000000]"),
           "%s", out ? out : "");
    EXPECT(out && strstr(out, "warning: MOESERVE_TEST_COMM_DELAY_US=-1: expected an integer in [0, 10000000]"),
           "%s", out ? out : "");
    free(out);
    const char *gone[] = {"--inject-host-delay-us", "--inject-gemm-repeat", "--inject-comm-delay-us"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
        out = NULL;
        snprintf(cmd, sizeof cmd, "%s diagnose --model '%s' %s 2 --json 2>&1 </dev/null", test_bin(), dir, gone[i]);
        rc = test_run(cmd, &out);
        EXPECT(rc != 0 && out && strstr(out, "unknown option") && strstr(out, gone[i]), "%s: exit %d: %s", gone[i],
               rc, out ? out : "");
        free(out);
    }
}

/* MOESERVE_TEST_GEMM_REPEAT's repetition is a copy of the op table whose GEMM and MoE entries
 * repeat: the ops are counted once, and without the hook the backend's own table stays, its
 * ops called straight. */
static int matmuls, moes;
static void count_matmul(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                         const float *bias)
{
    (void)be, (void)out, (void)ldo, (void)x, (void)ldx, (void)T, (void)w, (void)bias;
    matmuls++;
}
static int count_moe(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
                     const MoeExperts *ex, const ModelConfig *c)
{
    (void)be, (void)out, (void)x, (void)idx, (void)wts, (void)T, (void)ex, (void)c;
    moes++;
    return 1;
}
static void count_rmsnorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, int rows,
                          int dim, float eps)
{
    (void)be, (void)out, (void)ldo, (void)x, (void)ldx, (void)w, (void)rows, (void)dim, (void)eps;
    matmuls += 100; /* not repeated: a norm is no GEMM */
}

TEST(knobs_gemm_repeat_swaps_the_op_table)
{
    static const BackendOps ops = {.matmul = count_matmul, .moe = count_moe, .rmsnorm = count_rmsnorm};
    Backend be = {.name = "counting", .host_memory = 1, .ops = &ops};
    QTensor w = {.fmt = QF_F32, .rows = 4, .cols = 4};
    MoeExperts ex = {.gate = &w, .up = &w, .down = &w};
    ModelConfig c = {.n_experts = 2, .n_experts_per_tok = 1, .moe_intermediate = 4, .hidden = 4};
    backend_repeat_gemms(&be, 1);
    EXPECT(be.ops == &ops, "a repeat of 1 keeps the backend's table");
    backend_repeat_gemms(&be, 3);
    ASSERT(be.ops != &ops && be.ops->matmul != count_matmul && be.ops->moe != count_moe);
    EXPECT(be.ops->rmsnorm == count_rmsnorm, "the other ops are the backend's own");
    matmuls = moes = 0;
    be_matmul(&be, OP_GEMM_MLP, NULL, 4, NULL, 4, 1, &w, NULL);
    be_moe(&be, NULL, NULL, NULL, NULL, 1, &ex, &c);
    be_rmsnorm(&be, NULL, 4, NULL, 4, NULL, 1, 4, 1e-6f);
    EXPECT_EQ_INT(matmuls, 3 + 100);
    EXPECT_EQ_INT(moes, 3);
    EXPECT_EQ_INT(be.stats[OP_GEMM_MLP].calls, 1);
    EXPECT_EQ_INT(be.stats[OP_MOE].calls, 1);
    backend_repeat_gemms(&be, 5); /* a new count, not a wrapper around the wrapper */
    matmuls = 0;
    be_matmul(&be, OP_GEMM_MLP, NULL, 4, NULL, 4, 1, &w, NULL);
    EXPECT_EQ_INT(matmuls, 5);
    backend_repeat_gemms(&be, 1); /* back to the backend's own table (the copy freed) */
    EXPECT(be.ops == &ops);
    backend_repeat_gemms(&be, 2);
    backend_free(&be); /* frees the copy (ASan would see a leak) */
    EXPECT(be.ops == NULL);
}
