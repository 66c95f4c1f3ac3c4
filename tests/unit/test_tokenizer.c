/* test_tokenizer: src/format/tokenizer.c against Hugging Face `tokenizers`, id for id.
 * Fixtures: tests/data/tokenizer/<vocab>.jsonl from tools/make_tokenizer_fixtures.py (the README
 * there lists the cases). The real GLM-4 and Qwen3 tokenizer.json come from the test assets
 * ($MOESERVE_ASSETS, else ../shared/assets; skipped, saying so, when absent); the real
 * DeepSeek-V3, Llama-3 and GLM-4.7 ones from $MOESERVE_TOKENIZERS/<name>/tokenizer.json or
 * <assets>/tokenizers/<name>/ (skipped when absent); the synthetic Llama-3 / DeepSeek-V3 ones are
 * committed. Also: the llama.cpp vocabulary test vectors, decoding, streaming detokenization,
 * load errors and the `tokenize` / `detokenize` commands. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "format/tokenizer.h"

/* ---- helpers ---- */

/* Where the tokenizer.json of a fixture vocabulary is, or NULL (with the places looked at). */
static const char *vocab_path(const char *name, char *where, size_t wn)
{
    static char p[4400];
    if (!strncmp(name, "synth-", 6)) {
        snprintf(p, sizeof p, "%s/%s/tokenizer.json", test_data("tokenizer"), name);
        return file_exists(p) ? p : NULL;
    }
    const char *env = getenv("MOESERVE_TOKENIZERS");
    if (env && *env) {
        snprintf(p, sizeof p, "%s/%s/tokenizer.json", env, name);
        if (file_exists(p)) return p;
    }
    snprintf(p, sizeof p, "%s/tokenizers/%s/tokenizer.json", test_assets(), name);
    if (file_exists(p)) return p;
    if (env && *env) snprintf(where, wn, "%s nor %s/%s/tokenizer.json", p, env, name);
    else snprintf(where, wn, "%s, and $MOESERVE_TOKENIZERS is unset", p);
    return NULL;
}

static Tokenizer *load(const char *path)
{
    char err[1024];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) fprintf(stderr, "    cannot load %s: %s\n", path, err);
    return t;
}

/* Printable form of a text for failure messages (first 120 bytes). */
static const char *show(const char *s, size_t n)
{
    static char buf[600];
    size_t o = 0;
    for (size_t i = 0; i < n && i < 120 && o + 8 < sizeof buf; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x%02x", c);
    }
    if (n > 120) o += (size_t)snprintf(buf + o, sizeof buf - o, "...(%zu bytes)", n);
    buf[o] = 0;
    return buf;
}

static void show_ids(const char *label, const int *ids, int n, int at)
{
    fprintf(stderr, "      %s (%d):", label, n);
    int lo = at > 5 ? at - 5 : 0;
    for (int i = lo; i < n && i < at + 10; i++) fprintf(stderr, i == at ? " [%d]" : " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Encode text and compare with the expected ids; prints the first difference. 1 if equal. */
static int check_ids(const Tokenizer *t, const char *what, const char *text, size_t len, int special,
                     const int *want, int nwant)
{
    char err[512];
    int *got;
    int n = tokenizer_encode(t, text, len, special, &got, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "    %s: encode failed: %s\n      text: %s\n", what, err, show(text, len));
        return 0;
    }
    int at = 0;
    while (at < n && at < nwant && got[at] == want[at]) at++;
    int ok = n == nwant && at == n;
    if (!ok) {
        fprintf(stderr, "    %s%s: ids differ at %d\n      text: %s\n", what, special ? " (add_special)" : "", at,
                show(text, len));
        show_ids("want", want, nwant, at);
        show_ids("got ", got, n, at);
    }
    free(got);
    return ok;
}

static int *json_ids(json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int *v = xmalloc(((size_t)*n + 1) * sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* decode(ids) must equal want; so must the streaming detokenizer's pushes plus flush. */
static int check_decode(const Tokenizer *t, const char *what, const int *ids, int n, int skip, const char *want,
                        size_t wlen)
{
    char *text;
    size_t len;
    tokenizer_decode(t, ids, n, skip, &text, &len);
    int ok = len == wlen && !memcmp(text, want, len);
    if (!ok) fprintf(stderr, "    %s: decode%s gives %s\n", what, skip ? " (skip_special)" : "", show(text, len));
    free(text);
    Detokenizer d;
    detok_init(&d, t, skip);
    char *acc = xmalloc(wlen + 64), chunk[4096];
    size_t an = 0;
    int sok = 1;
    for (int i = 0; i < n && sok; i++) {
        int k = detok_push(&d, ids[i], chunk, sizeof chunk);
        if (k < 0 || an + (size_t)k > wlen + 16) { sok = 0; break; }
        memcpy(acc + an, chunk, (size_t)k);
        an += (size_t)k;
    }
    int k = detok_flush(&d, chunk, sizeof chunk);
    if (sok && k >= 0 && an + (size_t)k <= wlen + 16) { memcpy(acc + an, chunk, (size_t)k); an += (size_t)k; }
    else sok = 0;
    if (!sok || an != wlen || memcmp(acc, want, an)) {
        fprintf(stderr, "    %s: streaming detokenization%s gives %s\n", what, skip ? " (skip_special)" : "",
                show(acc, an));
        ok = 0;
    }
    free(acc);
    return ok;
}

/* ---- the assets datasets (prompt texts the fixtures refer to) ---- */

typedef struct { json_t *arena, *mtbench, *sharegpt; int tried; } Datasets;
static Datasets ds;

static void datasets_load(void)
{
    if (ds.tried) return;
    ds.tried = 1;
    char p[4400];
    json_error_t je;
    snprintf(p, sizeof p, "%s/datasets/ShareGPT_V3_filtered_1000.json", test_assets());
    ds.sharegpt = json_load_file(p, 0, &je);
    const char *names[2] = {"arena-hard-v0.1-question.jsonl", "mt_bench_question.jsonl"};
    json_t **dst[2] = {&ds.arena, &ds.mtbench};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/datasets/%s", test_assets(), names[k]);
        size_t n;
        char *s = file_read_all(p, &n);
        if (!s) continue;
        *dst[k] = json_array();
        for (char *save, *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
            json_array_append_new(*dst[k], json_loads(line, 0, &je));
        free(s);
    }
}

static const char *dataset_text(const char *src, int i, int turn)
{
    datasets_load();
    json_t *v = NULL;
    if (!strcmp(src, "arena")) v = json_object_get(json_array_get(ds.arena, (size_t)i), "prompt");
    else if (!strcmp(src, "mtbench")) v = json_array_get(json_object_get(json_array_get(ds.mtbench, (size_t)i), "turns"), (size_t)turn);
    else if (!strcmp(src, "sharegpt"))
        v = json_object_get(json_array_get(json_object_get(json_array_get(ds.sharegpt, (size_t)i), "conversations"),
                                           (size_t)turn), "value");
    return json_string_value(v);
}

/* ---- the fixture runner ---- */

typedef struct { int pass, fail, skip; } Tally;

static uint64_t fnv_ids(const int *ids, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    char num[16];
    for (int i = 0; i < n; i++) {
        int k = snprintf(num, sizeof num, "%d ", ids[i]);
        for (int j = 0; j < k; j++) h = (h ^ (unsigned char)num[j]) * 0x100000001b3ull;
    }
    return h;
}

typedef struct {
    char *st; size_t st_n, st_cap;    /* the static texts joined by '\n' (for the long case) */
    int count;
} LongText;

static void st_add(LongText *lt, const char *s, size_t n)
{
    if (lt->st_n + n + 2 > lt->st_cap) {
        lt->st_cap = (lt->st_n + n + 2) * 2;
        lt->st = xrealloc(lt->st, lt->st_cap);
    }
    if (lt->count++) lt->st[lt->st_n++] = '\n';
    memcpy(lt->st + lt->st_n, s, n);
    lt->st_n += n;
}

/* One case of a fixture: 1 pass, 0 fail, -1 skipped (its dataset text is absent). */
static int run_case(const Tokenizer *t, json_t *c, const char *what, LongText *lt)
{
    int n, ok = 1;
    json_t *jt = json_object_get(c, "text"), *ids_j = json_object_get(c, "ids");
    int special = json_is_integer(json_object_get(c, "special"));
    if (json_is_string(jt)) {
        const char *text = json_string_value(jt);
        size_t len = json_string_length(jt);
        if (json_object_get(c, "st")) st_add(lt, text, len);
        int *want = json_ids(ids_j, &n);
        ok = check_ids(t, what, text, len, special, want, n);
        if (!special) {
            json_t *dec = json_object_get(c, "dec");
            const char *w = dec ? json_string_value(dec) : text;
            ok &= check_decode(t, what, want, n, 0, w, dec ? json_string_length(dec) : len);
        }
        free(want);
        return ok;
    }
    json_t *hex = json_object_get(c, "hex");
    if (json_is_string(hex)) {
        const char *h = json_string_value(hex);
        size_t len = strlen(h) / 2;
        char *b = xmalloc(len + 1);
        for (size_t i = 0; i < len; i++) b[i] = (char)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
        int *want = json_ids(ids_j, &n);
        ok = check_ids(t, what, b, len, 0, want, n);
        free(want);
        free(b);
        return ok;
    }
    json_t *src = json_object_get(c, "src");
    if (json_is_string(src)) {
        const char *text = dataset_text(json_string_value(src), (int)json_integer_value(json_object_get(c, "i")),
                                        (int)json_integer_value(json_object_get(c, "turn")));
        if (!text) return -1;
        int *want = json_ids(ids_j, &n);
        ok = check_ids(t, what, text, strlen(text), 0, want, n);
        free(want);
        return ok;
    }
    json_t *lg = json_object_get(c, "long");
    if (json_is_integer(lg)) {
        size_t need = (size_t)json_integer_value(lg), reps = (need + lt->st_n - 1) / lt->st_n;
        char *text = xmalloc(reps * lt->st_n + 1);
        for (size_t r = 0; r < reps; r++) memcpy(text + r * lt->st_n, lt->st, lt->st_n);
        char err[512];
        int *got;
        double t0 = clock_now();
        int k = tokenizer_encode(t, text, reps * lt->st_n, 0, &got, err, sizeof err);
        double dt = clock_now() - t0;
        char want_h[32];
        snprintf(want_h, sizeof want_h, "%016llx", k >= 0 ? (unsigned long long)fnv_ids(got, k) : 0ull);
        ok = k == (int)json_integer_value(json_object_get(c, "n")) &&
             !strcmp(want_h, json_string_value(json_object_get(c, "fnv")));
        if (!ok) fprintf(stderr, "    %s: long text (%zu bytes): %d ids hash %s, expected %lld ids hash %s\n", what,
                         reps * lt->st_n, k, want_h, json_integer_value(json_object_get(c, "n")),
                         json_string_value(json_object_get(c, "fnv")));
        else fprintf(stderr, "    %s: long text %zu bytes -> %d ids in %.1f ms\n", what, reps * lt->st_n, k, dt * 1e3);
        if (k >= 0) free(got);
        free(text);
        return ok;
    }
    json_t *dids = json_object_get(c, "decode");
    if (json_is_array(dids)) {
        int *ids = json_ids(dids, &n);
        json_t *d0 = json_object_get(c, "dec"), *d1 = json_object_get(c, "dec_skip");
        ok = check_decode(t, what, ids, n, 0, json_string_value(d0), json_string_length(d0)) &
             check_decode(t, what, ids, n, 1, json_string_value(d1), json_string_length(d1));
        free(ids);
        return ok;
    }
    fprintf(stderr, "    %s: unknown fixture case\n", what);
    return 0;
}

/* All cases of tests/data/tokenizer/<fixture>.jsonl against the tokenizer at path. */
static Tally run_fixture(const Tokenizer *t, const char *fixture)
{
    Tally r = {0};
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/%s.jsonl", fixture);
    size_t n;
    char *all = file_read_all(test_data(rel), &n);
    if (!all) { fprintf(stderr, "    cannot read %s\n", test_data(rel)); r.fail = 1; return r; }
    LongText lt = {0};
    int line = 0, shown = 0;
    for (char *save, *l = strtok_r(all, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        json_error_t je;
        json_t *c = json_loads(l, JSON_ALLOW_NUL, &je);
        char what[160];
        snprintf(what, sizeof what, "%s.jsonl:%d", fixture, line);
        int rc = c ? (shown < 20 ? run_case(t, c, what, &lt) : run_case(t, c, what, &lt)) : 0;
        if (!c) fprintf(stderr, "    %s: bad JSON: %s\n", what, je.text);
        if (rc > 0) r.pass++;
        else if (rc < 0) r.skip++;
        else { r.fail++; shown++; }
        json_decref(c);
    }
    free(lt.st);
    free(all);
    fprintf(stderr, "    %s: %d/%d cases match HF%s\n", fixture, r.pass, r.pass + r.fail,
            r.skip ? " (dataset cases skipped: no assets)" : "");
    return r;
}

static void vocab_test(const char *name)
{
    char where[9000];
    const char *p = vocab_path(name, where, sizeof where);
    if (!p) { test_skip("no %s tokenizer.json: not at %s", name, where); return; }
    Tokenizer *t = load(p);
    ASSERT(t, "load %s", p);
    Tally r = run_fixture(t, name);
    EXPECT(r.fail == 0, "%s: %d of %d cases differ from HF", name, r.fail, r.pass + r.fail);
    EXPECT(r.pass > 100, "%s: only %d cases ran", name, r.pass);
    tokenizer_free(t);
}

/* ---- real and synthetic vocabularies ---- */

TEST(tokenizer_glm4) { vocab_test("glm4"); }
TEST(tokenizer_qwen3) { vocab_test("qwen3"); }
TEST(tokenizer_synth_llama3) { vocab_test("synth-llama3"); }
TEST(tokenizer_synth_deepseek_v3) { vocab_test("synth-deepseek-v3"); }
TEST(tokenizer_real_deepseek_v3) { vocab_test("deepseek-v3"); }
TEST(tokenizer_real_llama3) { vocab_test("llama3"); }
TEST(tokenizer_real_glm47) { vocab_test("glm47"); }

/* Every component variant (tests/data/tokenizer/variants.jsonl): the synthetic Llama-3
   tokenizer.json with the patch applied, then its cases. */
TEST(tokenizer_variants)
{
    size_t n;
    char *all = file_read_all(test_data("tokenizer/variants.jsonl"), &n);
    ASSERT(all, "read variants.jsonl");
    json_error_t je;
    json_t *base = json_load_file(test_data("tokenizer/synth-llama3/tokenizer.json"), 0, &je);
    ASSERT(base, "load synth-llama3: %s", je.text);
    char path[4400];
    snprintf(path, sizeof path, "%s/variant.json", test_tmpdir());
    int line = 0, pass = 0, fail = 0;
    for (char *save, *l = strtok_r(all, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        json_t *v = json_loads(l, JSON_ALLOW_NUL, &je), *j = json_deep_copy(base);
        ASSERT(v && j, "variants.jsonl:%d: bad JSON", line);
        const char *key;
        json_t *val;
        json_object_foreach(json_object_get(v, "patch"), key, val) {
            char k[128];
            snprintf(k, sizeof k, "%s", key);
            json_t *o = j;
            char *dot = strchr(k, '.');
            if (dot) { *dot = 0; o = json_object_get(j, k); }
            json_object_set(o, dot ? dot + 1 : k, val);
        }
        char what[256];
        char *pj = json_dumps(json_object_get(v, "patch"), JSON_COMPACT);
        snprintf(what, sizeof what, "variants.jsonl:%d %.200s", line, pj);
        free(pj);
        EXPECT(json_dump_file(j, path, 0) == 0);
        Tokenizer *t = load(path);
        EXPECT(t != NULL, "%s", what);
        LongText lt = {0};
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(v, "cases"), i, c) {
            if (t && run_case(t, c, what, &lt) > 0) pass++;
            else fail++;
        }
        free(lt.st);
        tokenizer_free(t);
        json_decref(v);
        json_decref(j);
    }
    fprintf(stderr, "    variants: %d/%d cases match HF\n", pass, pass + fail);
    EXPECT(fail == 0, "%d variant cases differ", fail);
    EXPECT(pass > 500);
    json_decref(base);
    free(all);
}

/* llama.cpp's vocabulary test vectors: texts separated by "\n__ggml_vocab_test__\n" in .inp,
   one line of ids per text in .out. */
static void llamacpp_vectors(const char *gguf, const char *vocab)
{
    char inp[4400], outp[4400], where[9000];
    snprintf(inp, sizeof inp, "%s/tokenizers/llama.cpp-vectors/ggml-vocab-%s.gguf.inp", test_assets(), gguf);
    snprintf(outp, sizeof outp, "%s/tokenizers/llama.cpp-vectors/ggml-vocab-%s.gguf.out", test_assets(), gguf);
    const char *p = vocab_path(vocab, where, sizeof where);
    if (!p || !file_exists(inp)) { test_skip("no llama.cpp vectors or %s tokenizer in %s", vocab, test_assets()); return; }
    size_t ni, no;
    char *in = file_read_all(inp, &ni), *out = file_read_all(outp, &no);
    Tokenizer *t = load(p);
    ASSERT(in && out && t);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = in, *o = out;
    int cases = 0, fails = 0;
    for (;;) {
        char *e = strstr(s, sep);
        if (!e) break;
        char *oe = strchr(o, '\n');
        ASSERT(oe, "%s: fewer output lines than texts", outp);
        *oe = 0;
        int want[4096], n = 0;
        for (char *q = o, *end; n < 4096; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[n++] = (int)v;
        }
        char what[64];
        snprintf(what, sizeof what, "%s vector %d", gguf, cases);
        if (!check_ids(t, what, s, (size_t)(e - s), 0, want, n)) fails++;
        cases++;
        s = e + strlen(sep);
        o = oe + 1;
    }
    fprintf(stderr, "    llama.cpp %s: %d/%d vectors match\n", gguf, cases - fails, cases);
    EXPECT(cases > 20, "only %d vectors", cases);
    EXPECT(fails == 0, "%d of %d llama.cpp %s vectors differ", fails, cases, gguf);
    tokenizer_free(t);
    free(in);
    free(out);
}

TEST(tokenizer_llamacpp_glm4) { llamacpp_vectors("glm4", "glm4"); }
TEST(tokenizer_llamacpp_qwen2) { llamacpp_vectors("qwen2", "qwen3"); }

/* ---- decoding ---- */

static Tokenizer *synth(const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/tokenizer.json", test_data(name));
    return load(p);
}

/* The id of the byte-level token standing for byte b (GPT-2 table). */
static int byte_token(const Tokenizer *t, unsigned b)
{
    unsigned cp = b;
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (!printable) {
        int n = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae)) n++;
        cp = 256 + (unsigned)n;
    }
    char s[4];
    if (cp < 0x80) { s[0] = (char)cp; s[1] = 0; }
    else { s[0] = (char)(0xc0 | cp >> 6); s[1] = (char)(0x80 | (cp & 0x3f)); s[2] = 0; }
    return tokenizer_token_id(t, s);
}

TEST(tokenizer_detok_incremental)
{
    Tokenizer *t = synth("tokenizer/synth-llama3");
    ASSERT(t);
    /* U+1F600 and U+4F60 as single-byte tokens: nothing comes out until the last byte */
    const unsigned char emoji[] = {0xf0, 0x9f, 0x98, 0x80, 0xe4, 0xbd, 0xa0, 'x'};
    int ids[8];
    for (int i = 0; i < 8; i++) { ids[i] = byte_token(t, emoji[i]); ASSERT(ids[i] >= 0, "byte %02x", emoji[i]); }
    Detokenizer d;
    detok_init(&d, t, 0);
    char out[64];
    int expect_len[8] = {0, 0, 0, 4, 0, 0, 3, 1};
    for (int i = 0; i < 8; i++) {
        int k = detok_push(&d, ids[i], out, sizeof out);
        EXPECT_EQ_INT(k, expect_len[i]);
        if (i == 3) EXPECT(!memcmp(out, "\xf0\x9f\x98\x80", 4));
        if (i == 6) EXPECT(!strcmp(out, "\xe4\xbd\xa0"));
    }
    EXPECT_EQ_INT(detok_flush(&d, out, sizeof out), 0);
    /* a dangling partial character: held back, then U+FFFD at the flush */
    detok_init(&d, t, 0);
    EXPECT_EQ_INT(detok_push(&d, ids[0], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, ids[1], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_flush(&d, out, sizeof out), 3);
    EXPECT(!strcmp(out, "\xef\xbf\xbd"));
    EXPECT_EQ_INT(d.n_pending, 0);
    /* an invalid continuation: U+FFFD for the broken prefix, the new byte starts afresh */
    detok_init(&d, t, 0);
    EXPECT_EQ_INT(detok_push(&d, ids[0], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, ids[7], out, sizeof out), 4);
    EXPECT(!strcmp(out, "\xef\xbf\xbdx"));
    /* a lone continuation byte and 0xff: U+FFFD at once */
    EXPECT_EQ_INT(detok_push(&d, byte_token(t, 0x80), out, sizeof out), 3);
    EXPECT_EQ_INT(detok_push(&d, byte_token(t, 0xff), out, sizeof out), 3);
    /* cap too small: -1 and nothing consumed */
    EXPECT_EQ_INT(detok_push(&d, ids[0], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, ids[1], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, ids[2], out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, ids[3], out, 3), -1);
    EXPECT_EQ_INT(detok_push(&d, ids[3], out, 5), 4);
    /* special tokens: text, or nothing with skip_special */
    int bot = tokenizer_token_id(t, "<|begin_of_text|>");
    ASSERT(bot >= 0);
    EXPECT(tokenizer_is_special(t, bot));
    EXPECT_EQ_INT(detok_push(&d, bot, out, sizeof out), 17);
    EXPECT(!strcmp(out, "<|begin_of_text|>"));
    detok_init(&d, t, 1);
    EXPECT_EQ_INT(detok_push(&d, bot, out, sizeof out), 0);
    EXPECT_EQ_INT(detok_push(&d, -5, out, sizeof out), 0);       /* unknown ids are dropped, as HF */
    EXPECT_EQ_INT(detok_push(&d, 1 << 30, out, sizeof out), 0);
    tokenizer_free(t);
}

TEST(tokenizer_decode_roundtrip)
{
    Tokenizer *t = synth("tokenizer/synth-deepseek-v3");
    ASSERT(t);
    const char *texts[] = {"Hello, world! 你好世界 12345 🦙 e\u0301 \t\r\n  x", "<｜begin▁of▁sentence｜><｜User｜>hi",
                           "", "\xe2\x82\xac\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd"};
    for (int k = 0; k < 4; k++) {
        char err[256];
        int *ids;
        int n = tokenizer_encode(t, texts[k], strlen(texts[k]), 0, &ids, err, sizeof err);
        ASSERT(n >= 0, "%s", err);
        char *back;
        size_t len;
        tokenizer_decode(t, ids, n, 0, &back, &len);
        EXPECT(len == strlen(texts[k]) && !memcmp(back, texts[k], len), "round trip of %s: %s", show(texts[k], strlen(texts[k])),
               show(back, len));
        free(back);
        free(ids);
    }
    /* skip_special drops <｜begin▁of▁sentence｜> but keeps the non-special <｜User｜> */
    int ids[3] = {tokenizer_token_id(t, "<｜begin▁of▁sentence｜>"), tokenizer_token_id(t, "<｜User｜>"),
                  tokenizer_token_id(t, "hi")};
    EXPECT(ids[0] >= 0 && ids[1] >= 0 && ids[2] >= 0);
    EXPECT(tokenizer_is_special(t, ids[0]) && !tokenizer_is_special(t, ids[1]));
    char *s;
    size_t len;
    tokenizer_decode(t, ids, 3, 1, &s, &len);
    EXPECT(!strcmp(s, "<｜User｜>hi"), "%s", s);
    free(s);
    tokenizer_decode(t, ids, 0, 1, &s, &len);
    EXPECT(len == 0 && s[0] == 0);
    free(s);
    tokenizer_free(t);
}

TEST(tokenizer_api)
{
    Tokenizer *t = synth("tokenizer/synth-llama3");
    ASSERT(t);
    int bot = tokenizer_token_id(t, "<|begin_of_text|>");
    EXPECT_EQ_INT(tokenizer_bos_id(t), bot);                /* from the TemplateProcessing */
    EXPECT_EQ_INT(tokenizer_eos_id(t), tokenizer_token_id(t, "<|end_of_text|>"));
    EXPECT_EQ_INT(tokenizer_vocab_size(t), 3004);
    EXPECT(!strcmp(tokenizer_token(t, bot), "<|begin_of_text|>"));
    EXPECT(tokenizer_token(t, -1) == NULL && tokenizer_token(t, 3004) == NULL);
    EXPECT_EQ_INT(tokenizer_token_id(t, "no such token"), -1);
    int hello = tokenizer_token_id(t, "Ġantidisestablishment");
    EXPECT(hello >= 0 && !tokenizer_is_special(t, hello));
    char err[256];
    int *ids;
    EXPECT_EQ_INT(tokenizer_encode(t, " antidisestablishment", 21, 1, &ids, err, sizeof err), 2);
    EXPECT(ids[0] == bot && ids[1] == hello);               /* BOS, and ignore_merges: one token */
    free(ids);
    EXPECT_EQ_INT(tokenizer_encode(t, "", 0, 0, &ids, err, sizeof err), 0);
    free(ids);
    tokenizer_free(t);

    char where[9000];
    const char *p = vocab_path("qwen3", where, sizeof where);
    if (!p) { test_skip("no qwen3 tokenizer (%s)", where); return; }
    char dir[4400];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = 0;
    t = load(dir);                                           /* a directory: tokenizer_config.json too */
    ASSERT(t);
    EXPECT_EQ_INT(tokenizer_eos_id(t), 151645);               /* <|im_end|> */
    EXPECT_EQ_INT(tokenizer_bos_id(t), -1);
    EXPECT_EQ_INT(tokenizer_vocab_size(t), 151669);
    EXPECT(tokenizer_is_special(t, 151644) && !tokenizer_is_special(t, 151667));   /* <|im_start|>, <think> */
    tokenizer_free(t);
}

/* ---- load errors ---- */

/* The synthetic Llama-3 tokenizer.json with key (a.b) set to value: load must fail naming needle. */
static void expect_load_error(const char *key, const char *value, const char *needle)
{
    json_error_t je;
    json_t *j = json_load_file(test_data("tokenizer/synth-llama3/tokenizer.json"), 0, &je);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
    ASSERT(j && v, "bad test: %s", je.text);
    char k[128], path[4400], err[512];
    snprintf(k, sizeof k, "%s", key);
    char *dot = strchr(k, '.');
    if (dot) *dot = 0;
    json_object_set_new(dot ? json_object_get(j, k) : j, dot ? dot + 1 : k, v);
    snprintf(path, sizeof path, "%s/bad.json", test_tmpdir());
    json_dump_file(j, path, 0);
    json_decref(j);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    EXPECT(t == NULL, "%s = %s loaded", key, value);
    EXPECT(strstr(err, needle) != NULL, "%s = %s: error '%s' does not name '%s'", key, value, err, needle);
    EXPECT(strchr(err, '\n') == NULL);
    tokenizer_free(t);
}

TEST(tokenizer_load_errors)
{
    expect_load_error("model.type", "\"Unigram\"", "Unigram");
    expect_load_error("pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}", "Metaspace");
    expect_load_error("normalizer", "{\"type\": \"Precompiled\"}", "Precompiled");
    expect_load_error("normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"BertNormalizer\"}]}",
                      "BertNormalizer");
    expect_load_error("decoder", "{\"type\": \"WordPiece\"}", "WordPiece");
    expect_load_error("post_processor", "{\"type\": \"Fancy\"}", "Fancy");
    expect_load_error("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, "
                      "\"behavior\": \"Isolated\", \"invert\": false}", "regex");
    expect_load_error("model.merges", "[\"a b c\"]", "merges[0]");
    expect_load_error("model.merges", "[[\"a\", \"zzzz-not-there\"]]", "zzzz-not-there");
    expect_load_error("truncation", "{\"max_length\": 8}", "truncation");
    /* the post-processor's ids go to the model as they are: each must name a token (3004 is
       past this vocabulary; encode used to return such ids, and -5 or 0 for "x") */
    const char *tpl = "{\"type\": \"TemplateProcessing\", \"single\": [\"<s>\", \"$A\"], "
                      "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [%s]}}}";
    const char *bad_ids[][2] = {{"3004", "3004"}, {"16777216", "16777216"}, {"-5", "-5"}, {"\"x\"", "\"x\""},
                                {"2999, 1e3", "1000.0"}};
    for (size_t k = 0; k < sizeof bad_ids / sizeof bad_ids[0]; k++) {
        char pp[512];
        snprintf(pp, sizeof pp, tpl, bad_ids[k][0]);
        expect_load_error("post_processor", pp, bad_ids[k][1]);
    }
    expect_load_error("post_processor", "{\"type\": \"RobertaProcessing\", \"cls\": [\"<s>\", 2999], "
                      "\"sep\": [\"</s>\", 70000]}", "70000");
    char err[512];
    EXPECT(tokenizer_load("/nonexistent-moeserve/tokenizer.json", err, sizeof err) == NULL);
    EXPECT(strstr(err, "/nonexistent-moeserve") != NULL, "%s", err);
    char path[4400];
    snprintf(path, sizeof path, "%s/no-tokenizer-dir", test_tmpdir());   /* a directory without one */
    mkdir(path, 0755);
    EXPECT(tokenizer_load(path, err, sizeof err) == NULL);
    EXPECT(strstr(err, "no-tokenizer-dir: no tokenizer.json") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/notjson.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"model\": [1, 2", f);
    fclose(f);
    EXPECT(tokenizer_load(path, err, sizeof err) == NULL);
    EXPECT(strstr(err, "notjson.json") != NULL, "%s", err);
}

/* A field of the wrong JSON type is refused, naming it: "model": {"type": 5} used to load as BPE
 * (a type that is not a string read as no type), "decoders": 5 as an empty decoder chain (the
 * output left byte-level encoded), a boolean given as a string or number as false, an unknown
 * Punctuation behavior as Isolated. */
TEST(tokenizer_load_wrong_types)
{
    expect_load_error("model.type", "5", "model.type must be a string, not a number");
    expect_load_error("model.byte_fallback", "\"yes\"", "model.byte_fallback must be a boolean, not a string");
    expect_load_error("model.ignore_merges", "1", "model.ignore_merges must be a boolean");
    expect_load_error("model.unk_token", "0", "model.unk_token must be a string");
    expect_load_error("model.dropout", "\"0.1\"", "model.dropout must be a number");
    expect_load_error("model.vocab", "[]", "model.vocab must be an object, not an array");
    expect_load_error("model.merges", "{}", "model.merges must be a list, not an object");
    expect_load_error("model", "\"BPE\"", "model must be an object, not a string");
    expect_load_error("decoder", "{\"type\": \"Sequence\", \"decoders\": 5}", "decoder Sequence.decoders must be a list, not a number");
    expect_load_error("decoder", "{\"type\": \"Sequence\"}", "decoder Sequence: no decoders list");
    expect_load_error("decoder", "{\"type\": 7}", "decoder.type must be a string");
    expect_load_error("decoder", "[{\"type\": \"ByteLevel\"}]", "decoder must be an object, not an array");
    expect_load_error("post_processor", "{\"type\": \"Sequence\", \"processors\": {}}", "post_processor Sequence.processors must be a list");
    expect_load_error("post_processor", "{\"type\": \"ByteLevel\", \"trim_offsets\": \"no\"}", "post_processor.trim_offsets must be a boolean");
    expect_load_error("pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": \"false\"}",
                      "pre_tokenizer ByteLevel.add_prefix_space must be a boolean, not a string");
    expect_load_error("pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": 5}", "pre_tokenizer Sequence.pretokenizers must be a list");
    expect_load_error("pre_tokenizer", "{\"type\": \"Punctuation\", \"behavior\": \"Bogus\"}", "Punctuation: unknown behavior 'Bogus'");
    expect_load_error("pre_tokenizer", "{\"type\": \"Digits\", \"individual_digits\": 1}", "pre_tokenizer Digits.individual_digits must be a boolean");
    expect_load_error("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", \"invert\": 0}",
                      "pre_tokenizer Split.invert must be a boolean");
    expect_load_error("normalizer", "{\"type\": \"Strip\", \"strip_left\": 1, \"strip_right\": true}", "normalizer Strip.strip_left must be a boolean");
    expect_load_error("normalizer", "{\"type\": \"Sequence\", \"normalizers\": \"NFC\"}", "normalizer Sequence.normalizers must be a list");
    expect_load_error("normalizer", "5", "normalizer must be an object, not a number");
    expect_load_error("added_tokens", "[{\"id\": 3000, \"content\": \"<x>\", \"special\": \"yes\"}]", "added_tokens[0].special must be a boolean");
    expect_load_error("added_tokens", "[{\"id\": 3000, \"content\": \"<x>\"}, {\"id\": 3001, \"content\": 5}]",
                      "added_tokens[1].content must be a string, not a number");
    expect_load_error("added_tokens", "[\"<x>\"]", "added_tokens[0] must be an object, not a string");
    expect_load_error("padding", "5", "padding must be an object or null");

    /* tokenizer_config.json beside it: added_tokens_decoder and the named tokens */
    const char *cfgs[][2] = {
        {"{\"added_tokens_decoder\": [1]}", "added_tokens_decoder must be an object, not an array"},
        {"{\"added_tokens_decoder\": {\"3000\": {\"content\": \"<y>\", \"lstrip\": \"no\"}}}",
         "added_tokens_decoder[\"3000\"].lstrip must be a boolean"},
        {"{\"added_tokens_decoder\": {\"3000\": 5}}", "added_tokens_decoder[\"3000\"] must be an object"},
        {"{\"eos_token\": 5}", "eos_token must be a string or {\"content\": a string}, not a number"},
        {"{\"bos_token\": {\"content\": 1}}", "bos_token must be a string"},
    };
    char dir[4200], path[4400], cmd[9000], *out = NULL;
    snprintf(dir, sizeof dir, "%s/wrong-types-cfg", test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/tokenizer.json'", dir, test_data("tokenizer/synth-llama3/tokenizer.json"), dir);
    ASSERT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
    free(out);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        FILE *f = fopen(path, "w");
        ASSERT(f);
        fputs(cfgs[k][0], f);
        fclose(f);
        char err[512] = "";
        Tokenizer *t = tokenizer_load(dir, err, sizeof err);
        EXPECT(t == NULL, "tokenizer_config.json %s loaded", cfgs[k][0]);
        EXPECT(strstr(err, cfgs[k][1]) && strstr(err, "tokenizer_config.json"), "%s: error '%s' does not name '%s'", cfgs[k][0], err,
               cfgs[k][1]);
        tokenizer_free(t);
    }
    /* null is absent, as in the files HF writes */
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"bos_token\": null, \"eos_token\": {\"content\": \"<|end_of_text|>\"}, \"added_tokens_decoder\": null}", f);
    fclose(f);
    char err[512] = "";
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    EXPECT(t != NULL, "%s", err);
    tokenizer_free(t);
}

/* Regex errors name the pattern as written and the offset in it (the offset used to count in the
 * translated pattern, where each \s is a 60-byte class). \C matches one byte: a Split on it cut
 * "é" in two and handed invalid UTF-8 pieces to BPE, so a regex holding it is refused wherever it
 * is; as a literal String pattern it is two plain characters. */
TEST(tokenizer_regex_errors)
{
    const char *split = "{\"type\": \"Split\", \"pattern\": {\"%s\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}";
    char v[1024], seq[1200];
    snprintf(v, sizeof v, split, "Regex", "\\\\C");
    expect_load_error("pre_tokenizer", v, "pre_tokenizer Split: regex \"\\C\" does not compile at offset 2: "
                      "using \\C is disabled by the application (\\C matches one byte and can split a UTF-8 character)");
    snprintf(v, sizeof v, split, "Regex", "\\\\s+\\\\C|\\\\p{L}+");
    snprintf(seq, sizeof seq, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, {\"type\": \"ByteLevel\"}]}", v);
    expect_load_error("pre_tokenizer", seq, "regex \"\\s+\\C|\\p{L}+\" does not compile at offset 5: using \\C");
    expect_load_error("normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a\\\\C\"}, \"content\": \"b\"}",
                      "normalizer Replace: regex \"a\\C\" does not compile at offset 3: using \\C");
    /* other errors: offsets in the pattern as written, control characters shown escaped */
    snprintf(v, sizeof v, split, "Regex", "\\\\s\\\\s(unclosed");
    expect_load_error("pre_tokenizer", v, "regex \"\\s\\s(unclosed\" does not compile at offset 13: missing closing parenthesis");
    snprintf(v, sizeof v, split, "Regex", "\\\\u00e9\\\\s)x");
    expect_load_error("pre_tokenizer", v, "regex \"\\u00e9\\s)x\" does not compile at offset 8: unmatched closing parenthesis");
    snprintf(v, sizeof v, split, "Regex", "a\\nb(");
    expect_load_error("pre_tokenizer", v, "regex \"a\\x0ab(\" does not compile at offset 4: missing closing parenthesis");

    /* a literal \C: loads, and splits on the two characters */
    json_error_t je;
    json_t *j = json_load_file(test_data("tokenizer/synth-llama3/tokenizer.json"), 0, &je);
    ASSERT(j, "%s", je.text);
    snprintf(v, sizeof v, split, "String", "\\\\C");
    snprintf(seq, sizeof seq, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, {\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false, \"use_regex\": false}]}", v);
    json_object_set_new(j, "pre_tokenizer", json_loads(seq, 0, &je));
    char path[4400];
    snprintf(path, sizeof path, "%s/literal-c.json", test_tmpdir());
    ASSERT(json_dump_file(j, path, 0) == 0);
    json_decref(j);
    Tokenizer *t = load(path);
    ASSERT(t);
    char err[256];
    int *ids;
    int n = tokenizer_encode(t, "\xc3\xa9\\C\xc3\xa9", 6, 0, &ids, err, sizeof err);
    EXPECT(n >= 3, "%s", err);
    char *text;
    size_t len;
    tokenizer_decode(t, ids, n > 0 ? n : 0, 0, &text, &len);
    EXPECT(len == 6 && !memcmp(text, "\xc3\xa9\\C\xc3\xa9", 6), "decodes to %s", show(text, len));
    free(text);
    free(ids);
    tokenizer_free(t);
}

/* Many added tokens (the list used to be searched once per token: quadratic, 200k tokens took
 * 7-12 s to load, now 0.8 s): ids, special flags and duplicates as before. Token i is <|x_i|>, special
 * for even i; <|x_10|> and <|x_11|> come again with the flag flipped (the later entry wins, the id
 * stays); a vocabulary token added keeps its vocabulary id; the file's ids are not used. */
TEST(tokenizer_many_added_tokens)
{
    enum { N = 4000, FIRST = 3004 };          /* synth-llama3: 2999 vocabulary tokens, 5 added */
    json_error_t je;
    json_t *j = json_load_file(test_data("tokenizer/synth-llama3/tokenizer.json"), 0, &je);
    ASSERT(j, "%s", je.text);
    json_t *at = json_object_get(j, "added_tokens");
    char c[64];
    for (int i = 0; i < N + 3; i++) {
        int k = i < N ? i : i == N ? 10 : 11;
        int special = i < N ? k % 2 == 0 : k == 11;
        if (i < N + 2) snprintf(c, sizeof c, "<|x_%d|>", k);
        else snprintf(c, sizeof c, "\xc4\xa0" "antidisestablishment");   /* Ġantidisestablishment, id 2995 */
        json_array_append_new(at, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 7, "content", c,
                                            "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                            "special", i == N + 2 ? 1 : special));
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/many-added.json", test_tmpdir());
    ASSERT(json_dump_file(j, path, 0) == 0);
    json_decref(j);
    Tokenizer *t = load(path);
    ASSERT(t);
    EXPECT_EQ_INT(tokenizer_vocab_size(t), FIRST + N);
    int bad = 0;
    for (int i = 0; i < N && bad < 5; i++) {
        snprintf(c, sizeof c, "<|x_%d|>", i);
        int id = tokenizer_token_id(t, c), want_special = i == 10 ? 0 : i == 11 ? 1 : i % 2 == 0;
        const char *s = tokenizer_token(t, FIRST + i);
        if (id != FIRST + i || !s || strcmp(s, c) || tokenizer_is_special(t, id) != want_special) {
            fprintf(stderr, "    %s: id %d (want %d), token %s, special %d (want %d)\n", c, id, FIRST + i,
                    s ? s : "(none)", tokenizer_is_special(t, id), want_special);
            bad++;
        }
    }
    EXPECT(bad == 0, "%d added tokens wrong", bad);
    EXPECT_EQ_INT(tokenizer_token_id(t, "\xc4\xa0" "antidisestablishment"), 2995);
    EXPECT(tokenizer_is_special(t, 2995));
    EXPECT(tokenizer_is_special(t, 2999) && tokenizer_token_id(t, "<|eot_id|>") == 3003);
    /* encode: leftmost-longest among them (<|x_12|>, not <|x_1|>), in text and side by side */
    const char *text = "a<|x_3999|>b<|x_12|><|x_1|> antidisestablishment";
    int want[] = {-1, FIRST + 3999, -1, FIRST + 12, FIRST + 1, 2995};    /* -1: the id of "a", "b" */
    char err[256];
    int *ids;
    int n = tokenizer_encode(t, text, strlen(text), 0, &ids, err, sizeof err);
    EXPECT_EQ_INT(n, 6);
    for (int i = 0; i < n && i < 6; i++)
        if (want[i] >= 0) EXPECT(ids[i] == want[i], "ids[%d] = %d, want %d", i, ids[i], want[i]);
    /* decode, skipping the special ones: <|x_12|> and the added vocabulary token go */
    char *out;
    size_t len;
    tokenizer_decode(t, ids, n, 1, &out, &len);
    EXPECT(len == 19 && !memcmp(out, "a<|x_3999|>b<|x_1|>", 19), "decodes to %s", show(out, len));
    free(out);
    free(ids);
    tokenizer_free(t);
}

/* ---- the commands ---- */

static int run_cmd(const char *args, char **out)
{
    char *cmd;
    if (asprintf(&cmd, "'%s' %s", test_bin(), args) < 0) return -1;
    int rc = test_run(cmd, out);
    free(cmd);
    return rc;
}

TEST(tokenizer_cli)
{
    char tok[4400], args[9000], file[4400], *out;
    snprintf(tok, sizeof tok, "%s", test_data("tokenizer/synth-llama3"));
    Tokenizer *t = synth("tokenizer/synth-llama3");
    ASSERT(t);
    const char *text = "Hello world, 你好 🦙\r\n<|eot_id|> x";
    char err[256];
    int *ids;
    int n = tokenizer_encode(t, text, strlen(text), 0, &ids, err, sizeof err);
    ASSERT(n > 0);
    char want[4096] = "";
    for (int i = 0; i < n; i++) snprintf(want + strlen(want), sizeof want - strlen(want), i ? " %d" : "%d", ids[i]);
    strcat(want, "\n");

    /* --text-file, byte for byte (CRLF kept) */
    snprintf(file, sizeof file, "%s/text.txt", test_tmpdir());
    FILE *f = fopen(file, "wb");
    ASSERT(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text-file '%s'", tok, file);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    EXPECT(!strcmp(out, want), "got '%s' want '%s'", out, want);
    free(out);

    /* --text, and the file form of --tokenizer */
    snprintf(args, sizeof args, "tokenize --tokenizer '%s/tokenizer.json' --text 'Hello world'", tok);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    int *hw;
    int nh = tokenizer_encode(t, "Hello world", 11, 1, &hw, err, sizeof err);
    ASSERT(nh == 3);
    char w2[128];
    snprintf(w2, sizeof w2, "%d %d\n", hw[1], hw[2]);
    EXPECT(!strcmp(out, w2), "got '%s' want '%s'", out, w2);
    free(out);
    /* --add-special: the TemplateProcessing BOS */
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text 'Hello world' --add-special", tok);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    snprintf(w2, sizeof w2, "%d %d %d\n", hw[0], hw[1], hw[2]);
    EXPECT(!strcmp(out, w2), "got '%s' want '%s'", out, w2);
    free(out);
    free(hw);

    /* an empty file: no ids, an empty line */
    snprintf(file, sizeof file, "%s/empty.txt", test_tmpdir());
    f = fopen(file, "wb");
    ASSERT(f);
    fclose(f);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text-file '%s'", tok, file);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    EXPECT(!strcmp(out, "\n"), "got '%s'", out);
    free(out);

    /* invalid UTF-8 in a file: as HF on the U+FFFD-replaced text (fixture case "ff", "f09f98") */
    snprintf(file, sizeof file, "%s/bad.txt", test_tmpdir());
    f = fopen(file, "wb");
    ASSERT(f);
    fwrite("a\xff\xf0\x9f\x98", 1, 5, f);
    fclose(f);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text-file '%s'", tok, file);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    int *rep;
    int nr = tokenizer_encode(t, "a\xef\xbf\xbd\xef\xbf\xbd", 7, 0, &rep, err, sizeof err);
    char w3[256] = "";
    for (int i = 0; i < nr; i++) snprintf(w3 + strlen(w3), sizeof w3 - strlen(w3), i ? " %d" : "%d", rep[i]);
    strcat(w3, "\n");
    EXPECT(!strcmp(out, w3), "got '%s' want '%s'", out, w3);
    free(rep);
    free(out);

    /* detokenize: the round trip, and --skip-special */
    char idlist[4096] = "";
    for (int i = 0; i < n; i++) snprintf(idlist + strlen(idlist), sizeof idlist - strlen(idlist), i ? ",%d" : "%d", ids[i]);
    snprintf(args, sizeof args, "detokenize --tokenizer '%s' --ids %s", tok, idlist);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    EXPECT(!strncmp(out, text, strlen(text)) && !strcmp(out + strlen(text), "\n"), "got '%s'", out);
    free(out);
    snprintf(args, sizeof args, "detokenize --tokenizer '%s' --ids %s --skip-special", tok, idlist);
    EXPECT_EQ_INT(run_cmd(args, &out), 0);
    EXPECT(!strcmp(out, "Hello world, 你好 🦙\r\n x\n"), "got '%s'", out);
    free(out);
    free(ids);

    /* errors: one line, exit 1 */
    const char *bad[] = {
        "tokenize --tokenizer /nonexistent-moeserve --text hi",
        "tokenize --tokenizer TOK --text-file /nonexistent-moeserve.txt",
        "tokenize --tokenizer TOK",
        "detokenize --tokenizer TOK --ids 1,x,3",
        "detokenize --tokenizer TOK --ids 99999999",
        "detokenize --tokenizer TOK --ids -1",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char a[9000];
        const char *at = strstr(bad[k], "TOK");
        if (at) snprintf(a, sizeof a, "%.*s'%s'%s", (int)(at - bad[k]), bad[k], tok, at + 3);
        else snprintf(a, sizeof a, "%s", bad[k]);
        EXPECT_EQ_INT(run_cmd(a, &out), 1);
        EXPECT(!strncmp(out, "error: ", 7), "%s: '%s'", a, out);
        char *nl = strchr(out, '\n');
        EXPECT(nl && (!nl[1] || !strncmp(nl + 1, "usage:", 6)), "%s: more than one line: '%s'", a, out);
        free(out);
    }
    tokenizer_free(t);
}

/* --text-file reads a regular file of at most FILE_READ_MAX bytes: a longer one is refused with
 * one line naming the limit, known from its size without reading it; a pipe or /dev/zero is
 * refused before any read as not a regular file (/dev/zero was read until memory ran out). */
TEST(tokenizer_cli_text_file_limit)
{
    char file[4400], args[9000], *out;
    snprintf(file, sizeof file, "%s/max.txt", test_tmpdir());          /* sparse: no disk used */
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0 && ftruncate(fd, (off_t)FILE_READ_MAX) == 0);
    close(fd);
    size_t n;
    char *buf = file_read_all(file, &n);
    EXPECT(buf && n == FILE_READ_MAX, "a file of exactly the limit: %zu bytes read", n);
    free(buf);
    snprintf(file, sizeof file, "%s/over.txt", test_tmpdir());
    fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0 && ftruncate(fd, (off_t)FILE_READ_MAX + 1) == 0);
    close(fd);
    errno = 0;
    buf = file_read_all(file, &n);
    ASSERT(!buf && errno == EFBIG && n == 0, "a file one byte over the limit: %zu bytes read", n);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text-file '%s'", test_data("tokenizer/synth-llama3"), file);
    EXPECT_EQ_INT(run_cmd(args, &out), 1);
    EXPECT(strstr(out, "over.txt: more than 64 MiB, the limit for reading a whole file\n"), "got '%s'", out);
    free(out);
    /* a pipe (its size unknown until read) one byte over, then one without end */
    char head[64];
    snprintf(head, sizeof head, "head -c %zu /dev/zero", FILE_READ_MAX + 1);
    const char *writers[] = {head, "yes"};
    for (int k = 0; k < 2; k++) {
        FILE *p = popen(writers[k], "r");
        ASSERT(p);
        snprintf(file, sizeof file, "/dev/fd/%d", fileno(p));
        errno = 0;
        buf = file_read_all(file, &n);
        int e = errno;
        pclose(p);
        ASSERT(!buf && e == FILE_NOT_REGULAR && n == 0, "%s: %zu bytes read, %s", writers[k], n, file_read_error(e));
    }
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text-file /dev/zero", test_data("tokenizer/synth-llama3"));
    EXPECT_EQ_INT(run_cmd(args, &out), 1);
    EXPECT(!strcmp(out, "error: tokenize: cannot read /dev/zero: not a regular file\n"), "got '%s'", out);
    free(out);
}

/* A FIFO no one writes where tokenizer.json, tokenizer_config.json or the --text-file should be
 * is refused at once as not a regular file: its open used to wait forever for a writer (the
 * alarm turns such a wait into a wrong error, `timeout` into exit 124). */
TEST(tokenizer_fifo_refused)
{
    char dir[4400], err[1024], args[9000], *out = NULL;
    snprintf(dir, sizeof dir, "%s/fifo_tokenizer", test_tmpdir());
    const char *fifo = test_fifo(dir, "tokenizer.json");
    ASSERT(fifo, "mkfifo in %s", dir);
    test_alarm(2);
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    test_alarm(0);
    EXPECT(!t && strstr(err, "fifo_tokenizer/tokenizer.json: cannot read: not a regular file"), "%s", err);
    tokenizer_free(t);
    errno = 0;
    size_t n = 1;
    test_alarm(2);
    char *buf = file_read_all(fifo, &n);
    test_alarm(0);
    EXPECT(!buf && errno == FILE_NOT_REGULAR && n == 0, "file_read_all: %s", file_read_error(errno));
    free(buf);

    snprintf(dir, sizeof dir, "%s/fifo_tokenizer_config", test_tmpdir());
    ASSERT(test_fifo(dir, "tokenizer_config.json"), "mkfifo in %s", dir);
    snprintf(args, sizeof args, "cp '%s/tokenizer.json' '%s'/", test_data("tokenizer/synth-llama3"), dir);
    ASSERT(test_run(args, NULL) == 0, "%s", args);
    test_alarm(2);
    t = tokenizer_load(dir, err, sizeof err);
    test_alarm(0);
    EXPECT(!t && strstr(err, "tokenizer_config.json: cannot read: not a regular file"), "%s", err);
    tokenizer_free(t);

    snprintf(args, sizeof args, "timeout 20 '%s' tokenize --tokenizer '%s' --text-file '%s'", test_bin(),
             test_data("tokenizer/synth-llama3"), fifo);
    EXPECT_EQ_INT(test_run(args, &out), 1);
    EXPECT(out && strstr(out, "error: tokenize: cannot read ") && strstr(out, "tokenizer.json: not a regular file\n"),
           "got '%s'", out ? out : "");
    free(out);
}

/* dir/name: a sparse file of size bytes (no disk used), dir made if absent; 0 on success. */
static int sparse_file(const char *dir, const char *name, size_t size)
{
    char p[4500];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = fd >= 0 && ftruncate(fd, (off_t)size) == 0 ? 0 : -1;
    if (fd >= 0) close(fd);
    return rc;
}

/* tokenizer.json and tokenizer_config.json are read within file_read_all's bound: one over it is
 * refused by its size, named with the limit, before any byte is read (jansson's json_load_file
 * read any length, and a file that never ends, into memory). */
TEST(tokenizer_json_limit)
{
    char dir[4400], err[1024], cmd[9000];
    snprintf(dir, sizeof dir, "%s/big_tokenizer", test_tmpdir());
    ASSERT(sparse_file(dir, "tokenizer.json", FILE_READ_MAX + 1) == 0, "%s", dir);
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    EXPECT(!t && strstr(err, "big_tokenizer/tokenizer.json: cannot read: more than 64 MiB, the limit"), "%s", err);
    tokenizer_free(t);

    snprintf(dir, sizeof dir, "%s/big_tokenizer_config", test_tmpdir());
    ASSERT(sparse_file(dir, "tokenizer_config.json", FILE_READ_MAX + 1) == 0, "%s", dir);
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s'/", test_data("tokenizer/synth-llama3"), dir);
    ASSERT(test_run(cmd, NULL) == 0, "%s", cmd);
    t = tokenizer_load(dir, err, sizeof err);
    EXPECT(!t && strstr(err, "big_tokenizer_config/tokenizer_config.json: cannot read: more than 64 MiB"), "%s", err);
    tokenizer_free(t);
}

/* Encoding speed on the ShareGPT prompts joined by newlines (the figure in docs/PERFORMANCE.md):
   best of 3 single calls. Must stay comfortably above 1 MB/s even under the sanitizers. */
TEST(tokenizer_speed)
{
    datasets_load();
    if (!ds.sharegpt) { test_skip("no ShareGPT dataset in %s/datasets", test_assets()); return; }
    size_t cap = 1 << 20, n = 0;
    char *text = xmalloc(cap);
    size_t i;
    json_t *conv;
    json_array_foreach(ds.sharegpt, i, conv) {
        size_t k;
        json_t *turn;
        json_array_foreach(json_object_get(conv, "conversations"), k, turn) {
            const char *s = json_string_value(json_object_get(turn, "value"));
            size_t l = s ? strlen(s) : 0;
            if (n + l + 1 > cap) text = xrealloc(text, cap = 2 * (n + l + 1));
            if (n) text[n++] = '\n';
            memcpy(text + n, s, l);
            n += l;
        }
    }
    const char *names[] = {"glm4", "qwen3", "deepseek-v3", "llama3"};
    int ran = 0;
    for (int v = 0; v < 4; v++) {
        char where[9000];
        const char *p = vocab_path(names[v], where, sizeof where);
        if (!p) continue;
        Tokenizer *t = load(p);
        ASSERT(t);
        double best = 1e9;
        int k = 0;
        for (int r = 0; r < 3; r++) {
            char err[256];
            int *ids;
            double t0 = clock_now();
            k = tokenizer_encode(t, text, n, 0, &ids, err, sizeof err);
            double dt = clock_now() - t0;
            ASSERT(k > 0, "%s", err);
            if (dt < best) best = dt;
            free(ids);
        }
        fprintf(stderr, "    %-12s %zu bytes -> %d tokens in %.1f ms: %.1f MB/s, %.2f M tokens/s\n", names[v], n, k,
                best * 1e3, n / best / 1e6, k / best / 1e6);
        EXPECT(n / best > 1e6, "%s: %.2f MB/s", names[v], n / best / 1e6);
        ran++;
        tokenizer_free(t);
    }
    free(text);
    if (!ran) test_skip("no tokenizer.json found");
}
