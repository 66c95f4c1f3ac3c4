/* test_builtin: the built-in model (models/builtin, BF16, and models/builtin-nvfp4, made by
 * `moeserve quantize`): `moeserve perplexity` on the held-out text agrees with Hugging Face
 * transformers on the same weights (float32; NVFP4 dequantized exactly) within 0.1%, the
 * acceptance of issue #3. The reference figures come from tools/perplexity_ref.py (transformers
 * 5.17, torch 2.15, CPU) with the same windows: --ctx 1025, 23 windows, 22544 predicted tokens. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
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

static char *gen(const char *args)
{
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s generate --model %s/models/builtin --device cpu %s", test_bin(), test_root(), args);
    if (test_run(cmd, &out) != 0) { test_fail(__FILE__, __LINE__, "%s: %s", cmd, out); free(out); return NULL; }
    return out;
}

/* the generated text without the timing line (stderr is merged into the output) */
static void strip_stats(char *out, char *finish, size_t n)
{
    char *st = strstr(out, "prefill: ");
    if (!st) return;
    char *f = strstr(st, "finish: ");
    snprintf(finish, n, "%.*s", f ? (int)strcspn(f + 8, ";") : 0, f ? f + 8 : "");
    *st = 0;
}

/* a seed reproduces the text; another seed does not; --stop cuts before the stop string;
   --stop-token-ids and --max-tokens end generation with the right finish reason */
TEST(builtin_generate_controls)
{
    const char *p = "--prompt 'The package' --max-tokens 30";
    char a1[512], a2[512];
    snprintf(a1, sizeof a1, "%s --seed 7", p);
    snprintf(a2, sizeof a2, "%s --seed 8", p);
    char *x = gen(a1), *y = gen(a1), *z = gen(a2), fx[32] = "", fy[32] = "", fz[32] = "";
    if (x && y && z) {
        strip_stats(x, fx, sizeof fx);
        strip_stats(y, fy, sizeof fy);
        strip_stats(z, fz, sizeof fz);
        EXPECT(!strcmp(x, y), "seed 7 twice:\n%s\n%s", x, y);
        EXPECT(strcmp(x, z) != 0, "seeds 7 and 8 gave the same text");
        EXPECT(!strcmp(fx, "length") || !strcmp(fx, "eos"), "finish '%s'", fx);
    }
    free(y);
    free(z);
    /* --stop: the greedy continuation contains " the"; stop there */
    char *g = gen("--prompt 'The package' --max-tokens 40 --temperature 0");
    char *s = gen("--prompt 'The package' --max-tokens 40 --temperature 0 --stop ' the'");
    if (g && s) {
        char *cut = strstr(g + 11, " the");
        ASSERT(cut != NULL, "greedy text has no ' the': %s", g);
        EXPECT(!strncmp(s, g, cut - g) && strstr(s, "finish: stop") && !strstr(s + 11, " the"),
               "stop ' the':\n%s\nfull:\n%s", s, g);
    }
    free(g);
    free(s);
    /* a stop token id: the greedy run's first token stops it at once, with nothing printed */
    char first[64] = "";
    char *g1 = gen("--prompt 'The package' --max-tokens 1 --temperature 0");
    int id = -1;
    if (g1) {
        char fin[32];
        strip_stats(g1, fin, sizeof fin);
        char cmd[9000], *ids = NULL;
        /* the id of the first generated piece: tokenize the text after the prompt */
        snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer %s/models/builtin --text '%s'", test_bin(), test_root(),
                 g1 + strlen("The package"));
        if (test_run(cmd, &ids) == 0) id = atoi(ids);
        free(ids);
        snprintf(first, sizeof first, "%s", g1 + strlen("The package"));
    }
    free(g1);
    ASSERT(id > 0, "no first token");
    char args[256];
    snprintf(args, sizeof args, "--prompt 'The package' --max-tokens 5 --temperature 0 --stop-token-ids %d", id);
    char *u = gen(args), fu[32] = "";
    if (u) {
        strip_stats(u, fu, sizeof fu);
        EXPECT(!strcmp(fu, "stop") && !strcmp(u, "The package\n"), "stop id %d (%s): '%s' finish %s", id, first, u, fu);
    }
    free(u);
    free(x);
}

/* generation_config.json's sampling defaults (format/model_text.c): a value the sampler refuses
 * is named in a warning and left out, the valid ones beside it still apply, and a file that is
 * not JSON is named too; before, a refused default made every request that relies on the
 * defaults fail (`serve`: a 400 blaming the request). Here temperature 0 from the file, with
 * top_p 5 and top_k -7 refused, must give the greedy text of `--temperature 0`. */
TEST(builtin_generation_config_bad_values)
{
    char dir[4200], cmd[9000], *out = NULL, *ref = NULL;
    snprintf(dir, sizeof dir, "%s/gencfg", test_tmpdir());
    snprintf(cmd, sizeof cmd, "cp -r %s/models/builtin-nvfp4 %s", test_root(), dir);
    ASSERT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
    free(out);
    const char *prompt = "--device cpu --max-tokens 12 --prompt 'The Debian package'";
    snprintf(cmd, sizeof cmd, "%s generate --model %s %s --temperature 0 --repetition-penalty 1 2>/dev/null", test_bin(), dir,
             prompt);
    ASSERT(test_run(cmd, &ref) == 0, "%s: %s", cmd, ref);
    char path[4300];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"temperature\": 0, \"top_p\": 5, \"top_k\": -7, \"eos_token_id\": [8168]}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate --model %s %s 2>&1", test_bin(), dir, prompt);
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s: exit %d: %s", cmd, rc, out);
    EXPECT(out && strstr(out, "generation_config.json: top_p = 5 ignored") && strstr(out, "top_k = -7 ignored"),
           "no warning naming the refused defaults: %s", out);
    ref[strcspn(ref, "\n")] = 0; /* the text; then the timing line */
    EXPECT(out && ref[0] && strstr(out, ref), "temperature 0 from the file did not apply: %s against %s", out, ref);
    free(out);
    f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"temperature\": 0.5,\n oops", f);
    fclose(f);
    rc = test_run(cmd, &out);
    EXPECT(rc == 0 && out && strstr(out, "generation_config.json: not read"), "%s: exit %d: %s", cmd, rc, out);
    free(out);
    free(ref);
}

/* Hugging Face files hold integers past int64, which jansson refuses ("too big integer"): the
 * Llama-3 family's tokenizer_config.json has "model_max_length": 1000000000000000019884624838656,
 * and that refused the whole tokenizer. A copy of the built-in model with such a number in each
 * of its JSON files (and a real past double's range, and a safetensors index whose total_size is
 * one) must load and generate what the original does. */
TEST(builtin_huge_numbers_in_json)
{
    char dir[4200], cmd[9000], *out = NULL, *ref = NULL;
    snprintf(dir, sizeof dir, "%s/hugenum", test_tmpdir());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r %s/models/builtin-nvfp4 '%s'", dir, test_root(), dir);
    ASSERT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
    free(out);
    const char *gen = "generate --device cpu --max-tokens 8 --temperature 0 --prompt 'The Debian package'";
    snprintf(cmd, sizeof cmd, "%s %s --model '%s' 2>/dev/null", test_bin(), gen, dir);
    ASSERT(test_run(cmd, &ref) == 0, "%s: %s", cmd, ref);
    ref[strcspn(ref, "\n")] = 0; /* the text; then the timing line */

    const char *big = "1000000000000000019884624838656", *files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                                                     "hf_quant_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(cmd, sizeof cmd, "sed -i '0,/{/s//{\"moeserve_big\": %s, \"moeserve_small\": -%s, \"moeserve_inf\": 1e999, /' '%s/%s'",
                 big, big, dir, files[i]);
        ASSERT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "sed -i 's/\"model_max_length\": 4096/\"model_max_length\": %s/' '%s/tokenizer_config.json' && "
             "grep -c %s '%s/tokenizer_config.json'", big, dir, big, dir);
    ASSERT(test_run(cmd, &out) == 0 && atoi(out) == 1, "%s: %s", cmd, out);
    free(out);

    /* an index of the one shard, total_size past int64 */
    char path[4400], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    SafeTensors st = {0};
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    json_t *wm = json_object();
    for (int i = 0; i < st.n_tensors; i++) json_object_set_new(wm, st.tensors[i].name, json_string("model.safetensors"));
    safetensors_free(&st);
    char *wms = json_dumps(wm, JSON_COMPACT);
    json_decref(wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f, "{\"metadata\": {\"total_size\": %s}, \"weight_map\": %s}\n", big, wms);
    fclose(f);
    free(wms);

    snprintf(cmd, sizeof cmd, "%s %s --model '%s' 2>&1", test_bin(), gen, dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0 && out && ref[0] && strstr(out, ref), "%s: exit %d: %s (expected %s)", cmd, rc, out, ref);
    free(out);
    free(ref);
}
