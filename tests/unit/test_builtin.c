/* test_builtin: the built-in model (models/builtin, BF16, and models/builtin-nvfp4, made by
 * `moeserve quantize`): `moeserve perplexity` on the held-out text agrees with Hugging Face
 * transformers on the same weights (float32; NVFP4 dequantized exactly) within 0.1%, the
 * acceptance of issue #3. The reference figures come from tools/perplexity_ref.py (transformers
 * 5.17, torch 2.15, CPU) with the same windows: --ctx 1025, 23 windows, 22544 predicted tokens. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define PPL_REL_TOL 1e-3

static void check_ppl(const char *model, double want)
{
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s perplexity --model %s/%s --text-file %s --ctx 1025 --json 2>/dev/null", test_bin(),
             test_root(), model, test_data("heldout.txt"));
    int rc = test_run(cmd, &out);
    ASSERT(rc == 0, "%s: %s", cmd, out);
    json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
    ASSERT(j, "not JSON: %s", out);
    double got = json_number_value(json_object_get(j, "perplexity"));
    EXPECT_EQ_INT(json_integer_value(json_object_get(j, "tokens")), 22544);
    EXPECT(fabs(got / want - 1) <= PPL_REL_TOL, "%s: perplexity %.6f, transformers %.6f", model, got, want);
    fprintf(stderr, "    %s: perplexity %.6f, transformers %.6f (rel %.1e)\n", model, got, want, fabs(got / want - 1));
    json_decref(j);
    free(out);
}

TEST(builtin_perplexity_bf16) { check_ppl("models/builtin", 32.902594798994286); }

TEST(builtin_perplexity_nvfp4) { check_ppl("models/builtin-nvfp4", 35.953801507046265); }

/* the README's main command: a readable continuation (the prompt, then text of its own) */
TEST(builtin_generate)
{
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s generate --model %s/models/builtin-nvfp4 --device cpu --max-tokens 40 --seed 1 "
             "--prompt 'The Debian package management system' 2>/dev/null", test_bin(), test_root());
    int rc = test_run(cmd, &out);
    ASSERT(rc == 0, "%s: %s", cmd, out);
    EXPECT(!strncmp(out, "The Debian package management system", 36), "%s", out);
    int words = 0;
    for (char *p = out; *p; p++) words += *p == ' ';
    EXPECT(strlen(out) > 36 + 80 && words > 20, "a short or wordless continuation: %s", out);
    free(out);
}
