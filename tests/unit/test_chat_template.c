/* test_chat_template: src/format/chat_template.c against the text transformers' apply_chat_template
 * renders (fixtures from tools/make_chat_fixtures.py in tests/data/chat/): every case byte for
 * byte, or an error where transformers raised. The templates are in tests/data/chat/ and always
 * run: GLM-4.6's and GLM-4.7-Flash's own, the built-in one and those written for these tests;
 * Qwen3's comes from the shared assets (../shared/assets or $MOESERVE_ASSETS; skipped when
 * absent). Also: load errors for unsupported constructs, runtime errors, loading from a model
 * directory, speed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "format/chat_template.h"

/* ---- helpers ---- */

static ChatTemplate *parse_file(const char *path, char *err, size_t n)
{
    size_t len;
    char *text = file_read_all(path, &len);
    if (!text) { snprintf(err, n, "cannot read %.300s", path); return NULL; }
    ChatTemplate *t = chat_template_parse(text, err, n);
    free(text);
    return t;
}

/* The first difference between got and want, printed with some context. */
static void show_diff(const char *id, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    %s: differs at byte %zu\n      got:  \"", id, i);
    for (size_t k = from; got[k] && k < i + 40; k++) fputs(got[k] == '\n' ? "\\n" : (char[2]){ got[k], 0 }, stderr);
    fprintf(stderr, "\"\n      want: \"");
    for (size_t k = from; want[k] && k < i + 40; k++) fputs(want[k] == '\n' ? "\\n" : (char[2]){ want[k], 0 }, stderr);
    fprintf(stderr, "\"\n");
}

static const char *str_or_null(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Render one fixture case with t (or with the case's own "template"); 1 if it matches. */
static int run_case(ChatTemplate *t, json_t *c)
{
    const char *id = str_or_null(c, "id");
    const char *want = str_or_null(c, "expected");
    char err[512] = "", *out = NULL;
    ChatTemplate *own = NULL;
    if (!t) {
        own = chat_template_parse(str_or_null(c, "template"), err, sizeof err);
        if (!own) {
            if (want) fprintf(stderr, "    %s: load error: %s\n", id, err);
            return !want;
        }
        t = own;
    }
    json_t *tools = json_object_get(c, "tools");
    if (json_is_null(tools)) tools = NULL;
    json_t *kw = json_object_get(c, "kwargs");
    int rc = chat_template_render(t, json_object_get(c, "messages"), tools,
                                  json_is_true(json_object_get(c, "add_generation_prompt")), kw,
                                  str_or_null(c, "bos_token"), str_or_null(c, "eos_token"), &out, err, sizeof err);
    int ok;
    if (!want) { /* transformers raised */
        ok = rc != 0;
        if (!ok) fprintf(stderr, "    %s: rendered, but transformers raised %s\n", id, str_or_null(c, "error"));
    } else if (rc) {
        ok = 0;
        fprintf(stderr, "    %s: render error: %s\n", id, err);
    } else {
        ok = !strcmp(out, want);
        if (!ok) show_diff(id, out, want);
    }
    free(out);
    chat_template_free(own);
    return ok;
}

/* All cases of tests/data/chat/<name>.jsonl; t NULL: each case carries its template. */
static void run_fixtures(const char *name, ChatTemplate *t)
{
    char rel[128];
    snprintf(rel, sizeof rel, "chat/%s.jsonl", name);
    FILE *f = fopen(test_data(rel), "r");
    ASSERT(f, "cannot open %s", test_data(rel));
    char *line = NULL;
    size_t cap = 0;
    int n = 0, pass = 0, errors = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        if (!c) { test_fail(__FILE__, __LINE__, "%s: bad fixture line: %s", name, je.text); continue; }
        n++;
        errors += json_object_get(c, "error") != NULL;
        pass += run_case(t, c);
        json_decref(c);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "    %s: %d/%d cases match (%d of them errors in transformers too)\n", name, pass, n, errors);
    EXPECT(n > 0, "no cases in %s", rel);
    EXPECT_EQ_INT(pass, n);
}

/* The cases of tests/data/chat/<fixtures>.jsonl with the template tests/data/chat/<name>.jinja. */
static void run_local_as(const char *name, const char *fixtures)
{
    char rel[128], err[512];
    snprintf(rel, sizeof rel, "chat/%s.jinja", name);
    ChatTemplate *t = parse_file(test_data(rel), err, sizeof err);
    ASSERT(t, "%s: %s", rel, err);
    run_fixtures(fixtures, t);
    chat_template_free(t);
}

static void run_local(const char *name) { run_local_as(name, name); }

/* ---- fixtures: templates written for moeserve (always run) ---- */

TEST(chat_builtin) { run_local("builtin"); }
TEST(chat_llama3_style) { run_local("llama3_style"); }
TEST(chat_deepseek_style) { run_local("deepseek_style"); }
TEST(chat_features) { run_local("features"); }
TEST(chat_snippets) { run_fixtures("snippets", NULL); }

/* ---- fixtures: real model templates ---- */

/* GLM-4.6's and GLM-4.7-Flash's own templates, committed in tests/data/chat/ (README.md there). */
TEST(chat_glm45) { run_local_as("glm46", "glm45"); }
TEST(chat_glm47) { run_local_as("glm47", "glm47"); }

/* Qwen3's comes from the shared assets (skipped when absent). */
TEST(chat_qwen3)
{
    char dir[4400], err[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", test_assets());
    if (!file_exists(dir)) { test_skip("no %s (set MOESERVE_ASSETS)", dir); return; }
    ChatTemplate *t = chat_template_load(dir, err, sizeof err); /* tokenizer_config.json, string form */
    ASSERT(t, "%s", err);
    run_fixtures("qwen3", t);
    chat_template_free(t);
}

/* ---- what is outside the subset fails at load, with a message that says what ---- */

TEST(chat_load_errors)
{
    static const struct { const char *tmpl, *msg; } cases[] = {
        { "{{ x | indent }}", "filter 'indent' is not supported" },
        { "{{ x | nosuch }}", "no filter named 'nosuch'" },
        { "{% if x is nosuch %}{% endif %}", "no test named 'nosuch'" },
        { "{% include 'other.jinja' %}", "'include' tag is not supported" },
        { "{% extends 'base' %}", "'extends' tag is not supported" },
        { "{% filter upper %}x{% endfilter %}", "'filter' tag is not supported" },
        { "{% frobnicate %}", "unknown tag 'frobnicate'" },
        { "{% do x.append(1) %}", "unknown tag 'do'" },
        { "{{ x.splitlines() }}", "method 'splitlines()' is not supported" },
        { "{{ '%s'.format(1) }}", "method 'format()' is not supported" },
        { "{{ lipsum() }}", "'lipsum' is not supported" },
        { "{{ foo(1) }}", "neither a macro" },
        { "{% for x in y recursive %}{% endfor %}", "recursive" },
        { "{% macro m() %}{{ caller() }}{% endmacro %}", "'caller' is not supported" },
        { "{% macro m() %}{{ varargs }}{% endmacro %}", "'varargs' is not supported" },
        { "{{ f(*args) }}", "*args" },
        { "{% if x %}never closed", "expected 'endif'" },
        { "{{ 'abc }}", "unterminated string" },
        { "{% break %}", "outside of a loop" },
        { "{{ x | map('nosuch') }}", "filter 'nosuch' is not supported" },
        { "{{ x | selectattr('a', 'nosuch') }}", "test 'nosuch' is not supported" },
        { "{# never closed", "comment" },
        { "{{ x ]}}", "unexpected ']'" },
        { "{{ 99999999999999999999 }}", "too large" },
        { "{{ x }", "unexpected '}'" },
        { "{{ x ", "unexpected end of template" },
        { "{{ a b }}", "expected '}}'" },
        { "line 1\nline 2 {{ x | nosuch }}", "line 2" },
        { "{{ '\\N{DASH}' }}", "\\N{...}" },
        { "{% set ns.a, b = 1, 2 %}", "not supported" },
        { "{{ x[1:2, 3] }}", "multi-dimensional" },
        { "\xff{{ x }}", "UTF-8" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        ChatTemplate *t = chat_template_parse(cases[i].tmpl, err, sizeof err);
        EXPECT(!t, "template %zu (%s) loaded", i, cases[i].tmpl);
        EXPECT(strstr(err, cases[i].msg), "template %zu (%s): error \"%s\" lacks \"%s\"", i, cases[i].tmpl, err, cases[i].msg);
        EXPECT(!strncmp(err, "chat template", 13), "template %zu: \"%s\"", i, err);
        chat_template_free(t);
    }
}

/* ---- render-time errors: raise_exception, type errors, Undefined misuse, deliberate limits ---- */

static int render_str(const char *tmpl, const char *messages_json, const char *kwargs_json, char **out, char *err, size_t n)
{
    ChatTemplate *t = chat_template_parse(tmpl, err, n);
    if (!t) return -2;
    json_t *m = json_loads(messages_json ? messages_json : "[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *kw = kwargs_json ? json_loads(kwargs_json, 0, NULL) : NULL;
    int rc = chat_template_render(t, m, NULL, 1, kw, "<s>", "</s>", out, err, n);
    json_decref(m);
    json_decref(kw);
    chat_template_free(t);
    return rc;
}

TEST(chat_render_errors)
{
    static const struct { const char *tmpl, *msg; } cases[] = {
        { "{% if messages[0].role != 'system' %}{{ raise_exception('Only system roles: ' ~ messages[0].role) }}{% endif %}",
          "raise_exception: Only system roles: user" },
        { "{{ 'a' + 1 }}", "can only concatenate str" },
        { "{{ nope.attr }}", "'nope' is undefined" },
        { "{{ messages[0].content + none }}", "can only concatenate str" },
        { "{{ 1 // 0 }}", "division or modulo by zero" },
        { "{{ messages | selectattr('role') }}", "generator" },        /* Python would print an address */
        { "{{ (-8) ** 0.5 }}", "complex" },                                /* Python would give a complex */
        { "{{ messages[0].content.startswith('h', 1) }}", "start/end" },
        { "{{ range(100001) | length }}", "range too big" },
        { "{{ 9223372036854775807 + 1 }}", "integer overflow" },
        { "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper" },
        { "{{ '%d' % 3 }}", "formatting" },
        { "{% set x = namespace() %}{% set y.a = 1 %}", "non-namespace" },
        { "{{ undefined_fn }}{{ messages[0].role.zfill(3) }}", "method 'zfill()' is not supported" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "", *out = NULL;
        int rc = render_str(cases[i].tmpl, NULL, NULL, &out, err, sizeof err);
        EXPECT(rc != 0, "template %zu (%s) rendered \"%s\"", i, cases[i].tmpl, out ? out : "");
        EXPECT(strstr(err, cases[i].msg), "template %zu (%s): error \"%s\" lacks \"%s\"", i, cases[i].tmpl, err, cases[i].msg);
        free(out);
    }
    /* the error names the template line */
    char err[512] = "", *out = NULL;
    EXPECT(render_str("a\nb\n{{ raise_exception('x') }}", NULL, NULL, &out, err, sizeof err) == -1);
    EXPECT(strstr(err, "line 3"), "%s", err);
    /* kwargs may not replace the named render arguments (Python: multiple values for a keyword) */
    EXPECT(render_str("{{ 1 }}", NULL, "{\"messages\": []}", &out, err, sizeof err) == -1);
    EXPECT(render_str("{{ 1 }}", "{\"role\": \"user\"}", NULL, &out, err, sizeof err) == -1, "messages must be an array");
}

TEST(chat_render_variables)
{
    char err[512] = "", *out = NULL;
    /* transformers passes tools=None and documents=None; bos/eos and kwargs are variables */
    int rc = render_str("{{ tools is none }}|{{ documents is none }}|{{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}|"
                        "{{ enable_thinking }}|{{ x.y[1] }}|{{ nope is defined }}",
                        NULL, "{\"enable_thinking\": false, \"x\": {\"y\": [1, 2.5]}}", &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(!strcmp(out, "True|True|<s></s>|True|False|2.5|False"), "got %s", out);
    free(out);
}

/* ---- hostile templates: each ends quickly, with the right text or a clear error ---- */

TEST(chat_hostile_repeat)
{
    /* repeating nothing a huge number of times is nothing, at once (it used to loop 10**18 times) */
    char err[512] = "", *out = NULL;
    int rc = render_str("{{ ([] * 10**18) | length }}{{ ('' * 10**18) | length }}{{ (() * 10**18) | length }}",
                        NULL, NULL, &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(!strcmp(out, "000"), "got %s", out);
    free(out);
}

TEST(chat_hostile_range)
{
    /* bounds and steps near the int64 limits: Python's items, no signed overflow */
    static const struct { const char *tmpl, *want; } cases[] = {
        { "{{ range(-9223372036854775807 - 1, 9223372036854775807, 4611686018427387904) | list }}",
          "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]" },
        { "{{ range(9223372036854775807, -9223372036854775807 - 1, -9223372036854775807 - 1) | list }}",
          "[9223372036854775807, -1]" },
        { "{{ range(0, 4611686018427387905, 4611686018427387904) | list }}", "[0, 4611686018427387904]" },
        { "{{ range(5, 0, -2) | list }}{{ range(0, 5, 2) | list }}{{ range(3, 3) | list }}", "[5, 3, 1][0, 2, 4][]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "", *out = NULL;
        int rc = render_str(cases[i].tmpl, NULL, NULL, &out, err, sizeof err);
        EXPECT(rc == 0, "case %zu: %s", i, err);
        EXPECT(rc || !strcmp(out, cases[i].want), "case %zu: got %s, want %s", i, out, cases[i].want);
        free(out);
    }
}

TEST(chat_hostile_nesting)
{
    /* lists and tuples nested 100000 deep by a loop: comparing or hashing them is an error, not a
       stack overflow (Python stops at its recursion limit) */
    static const char *const ops[] = { "ns.x == ns.y", "ns.x < ns.y", "ns.x in [ns.y]", "{ns.t: 1}", "[ns.t] | unique | list" };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        char tmpl[512], err[512] = "", *out = NULL;
        snprintf(tmpl, sizeof tmpl, "{%% set ns = namespace(x=[], y=[], t=()) %%}{%% for i in range(100000) %%}"
                 "{%% set ns.x = [ns.x] %%}{%% set ns.y = [ns.y] %%}{%% set ns.t = (ns.t,) %%}{%% endfor %%}{{ %s }}", ops[i]);
        int rc = render_str(tmpl, NULL, NULL, &out, err, sizeof err);
        EXPECT(rc == -1, "%s rendered", ops[i]);
        EXPECT(strstr(err, "nested deeper"), "%s: %s", ops[i], err);
        free(out);
    }
    /* shallow nesting still compares */
    char err[512] = "", *out = NULL;
    int rc = render_str("{{ [[[1]]] == [[[1]]] }}{{ [[1], [2]] < [[1], [3]] }}{{ {(1, (2, 3)): 4}[(1, (2, 3))] }}",
                        NULL, NULL, &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(!strcmp(out, "TrueTrue4"), "got %s", out);
    free(out);
}

TEST(chat_hostile_scans)
{
    /* work that allocates nothing (comparing, searching, measuring strings) counts against the
       step limit: each of these ran for minutes to hours inside the memory and step limits */
    static const char *const cases[] = {
        "{% set s = 'a' * 10000000 %}{% for i in range(100000) %}{{ s | length }}{% endfor %}",
        "{% set s = 'a' * 10000000 %}{% for i in range(100000) %}{{ 'b' in s }}{% endfor %}",
        "{% set s = 'a' * 10000000 %}{% for i in range(100000) %}{{ s[i] }}{% endfor %}",
        "{% set s = 'a' * 10000000 %}{{ ([s] * 100000) | select('equalto', s ~ '') | list | length }}",
        "{{ range(100000) | unique | length }}",                          /* 5e9 comparisons */
        "{{ ('a' * 1000000).rfind('a' * 500000 ~ 'b') }}",               /* quadratic search */
        "{{ ('a' * 1000000).rsplit('a' * 500000 ~ 'b') | length }}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "", *out = NULL;
        double t0 = clock_now();
        int rc = render_str(cases[i], NULL, NULL, &out, err, sizeof err);
        EXPECT(rc == -1, "case %zu rendered", i);
        EXPECT(strstr(err, "steps"), "case %zu: %s", i, err);
        EXPECT(clock_now() - t0 < 20, "case %zu took %.1f s", i, clock_now() - t0);
        free(out);
    }
    /* the searches still give Python's answers */
    char err[512] = "", *out = NULL;
    int rc = render_str("{{ ('a' * 100000).rfind('ab') }}|{{ ('xab' * 100000).rfind('ab') }}|{{ 'abcabc'.rfind('bc') }}"
                        "{{ 'abc'.rfind('') }}{{ 'abc'.rfind('abcd') }}{{ 'a,b,,c'.rsplit(',') }}{{ 'a,b,,c'.rsplit(',', 1) }}"
                        "{{ ',a'.rsplit(',') }}{{ 'xxaxx'.strip('x') }}{{ '  a  ' | trim }}",
                        NULL, NULL, &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(!strcmp(out, "-1|299998|43-1['a', 'b', '', 'c']['a,b,', 'c']['', 'a']aa"), "got %s", out);
    free(out);
}

TEST(chat_hostile_recursion)
{
    /* a macro recursing 199 deep through an expression nested 60 deep overflowed the C stack
       (SIGSEGV in release builds): the render bounds the nesting as a whole */
    char tmpl[1024], err[512] = "", *out = NULL;
    int n = snprintf(tmpl, sizeof tmpl, "{%% macro f(n) %%}{%% if n < 199 %%}{{ ");
    for (int i = 0; i < 60; i++) tmpl[n++] = '[';
    n += snprintf(tmpl + n, sizeof tmpl - (size_t)n, "f(n + 1)");
    for (int i = 0; i < 60; i++) tmpl[n++] = ']';
    snprintf(tmpl + n, sizeof tmpl - (size_t)n, " }}{%% endif %%}{%% endmacro %%}{{ f(0) | length }}");
    EXPECT(render_str(tmpl, NULL, NULL, &out, err, sizeof err) == -1);
    EXPECT(strstr(err, "nested deeper"), "%s", err);
    /* a plain recursive macro 150 deep still renders */
    int rc = render_str("{% macro f(n) %}{% if n < 150 %}{{ f(n + 1) }}{% endif %}{% endmacro %}[{{ f(0) }}]",
                        NULL, NULL, &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(!strcmp(out, "[]"), "got %s", out);
    free(out);
}

/* A template text of n_sets distinct assignments, then n_ifs if blocks, then {{ a5 }}. */
static char *sets_then_ifs(int n_sets, int n_ifs)
{
    size_t cap = (size_t)n_sets * 32 + (size_t)n_ifs * 22 + 16, n = 0;
    char *t = malloc(cap);
    for (int i = 0; i < n_sets; i++) n += (size_t)snprintf(t + n, cap - n, "{%% set a%d = %d %%}", i, i);
    for (int i = 0; i < n_ifs; i++) n += (size_t)snprintf(t + n, cap - n, "{%% if 1 %%}x{%% endif %%}");
    snprintf(t + n, cap - n, "{{ a5 }}");
    return t;
}

TEST(chat_hostile_load)
{
    /* 1000 names and 1000 if blocks (60 kB) took seconds to load, 4000 and 4000 ten minutes and
       1.6 GB: each if compared every copied name with every name */
    char err[512] = "", *out = NULL;
    char *text = sets_then_ifs(1000, 1000);
    double t0 = clock_now();
    int rc = render_str(text, NULL, NULL, &out, err, sizeof err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(strlen(out) == 1001 && !strcmp(out + 1000, "5"), "got %zu bytes", strlen(out));
    EXPECT(clock_now() - t0 < 10, "loading took %.1f s", clock_now() - t0);
    free(out);
    free(text);
    /* too many names in one scope, or too much memory to load: a clear error */
    text = sets_then_ifs(5000, 1);
    EXPECT(render_str(text, NULL, NULL, &out, err, sizeof err) == -2);
    EXPECT(strstr(err, "names in one scope"), "%s", err);
    free(text);
    text = sets_then_ifs(1000, 100000);
    EXPECT(render_str(text, NULL, NULL, &out, err, sizeof err) == -2);
    EXPECT(strstr(err, "loading the template needs more than"), "%s", err);
    free(text);
}

/* ---- loading from a model directory ---- */

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[4500];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *render_dir(const char *dir, int with_tools, char *err, size_t n)
{
    ChatTemplate *t = chat_template_load(dir, err, n);
    if (!t) return NULL;
    json_t *m = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *tools = with_tools ? json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, NULL) : NULL;
    char *out = NULL;
    chat_template_render(t, m, tools, 0, NULL, NULL, NULL, &out, err, n);
    json_decref(m);
    json_decref(tools);
    chat_template_free(t);
    return out;
}

TEST(chat_load_dir)
{
    char base[4200], d[4400], err[512] = "";
    snprintf(base, sizeof base, "%s/chat_load", test_tmpdir());
    mkdir(base, 0755);

    snprintf(d, sizeof d, "%s/jinja", base); /* chat_template.jinja, trailing newline dropped */
    mkdir(d, 0755);
    write_file(d, "chat_template.jinja", "J:{{ messages[0].content }}\n");
    write_file(d, "tokenizer_config.json", "{\"chat_template\": \"C:{{ messages[0].content }}\"}");
    char *out = render_dir(d, 0, err, sizeof err);
    EXPECT(out && !strcmp(out, "J:hi"), "jinja file first: %s %s", out ? out : "(null)", err);
    free(out);

    snprintf(d, sizeof d, "%s/string", base); /* tokenizer_config.json, string form */
    mkdir(d, 0755);
    write_file(d, "tokenizer_config.json", "{\"eos_token\": \"x\", \"chat_template\": \"S:{{ messages[0].content }}\"}");
    out = render_dir(d, 0, err, sizeof err);
    EXPECT(out && !strcmp(out, "S:hi"), "string form: %s %s", out ? out : "(null)", err);
    free(out);

    snprintf(d, sizeof d, "%s/named", base); /* list of named templates: default, and tool_use with tools */
    mkdir(d, 0755);
    write_file(d, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T:{{ tools[0].function.name }}\"},"
               " {\"name\": \"default\", \"template\": \"D:{{ messages[0].content }}\"}]}");
    out = render_dir(d, 0, err, sizeof err);
    EXPECT(out && !strcmp(out, "D:hi"), "named default: %s %s", out ? out : "(null)", err);
    free(out);
    out = render_dir(d, 1, err, sizeof err);
    EXPECT(out && !strcmp(out, "T:f"), "named tool_use: %s %s", out ? out : "(null)", err);
    free(out);

    snprintf(d, sizeof d, "%s/tooluse_only", base); /* transformers: fine with tools, an error without */
    mkdir(d, 0755);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
    out = render_dir(d, 1, err, sizeof err);
    EXPECT(out && !strcmp(out, "T"), "tool_use only, with tools: %s %s", out ? out : "(null)", err);
    free(out);
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "default"), "%s", err);

    snprintf(d, sizeof d, "%s/nodefault", base);
    mkdir(d, 0755);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"}]}");
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "default"), "%s", err);

    snprintf(d, sizeof d, "%s/none", base);
    mkdir(d, 0755);
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "chat_template"), "%s", err);
    write_file(d, "tokenizer_config.json", "{\"eos_token\": \"x\"}");
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "no chat_template"), "%s", err);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": null}"); /* null: as absent */
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "no chat_template"), "%s", err);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": 5}"); /* not a template: named so */
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "chat_template is an integer, not a string or a list of named templates"), "%s", err);

    snprintf(d, sizeof d, "%s/bad", base); /* an unsupported construct names the file */
    mkdir(d, 0755);
    write_file(d, "chat_template.jinja", "{{ x | wordwrap }}");
    EXPECT(!render_dir(d, 0, err, sizeof err));
    EXPECT(strstr(err, "chat_template.jinja") && strstr(err, "wordwrap"), "%s", err);
}

/* A FIFO no one writes in place of chat_template.jinja or tokenizer_config.json is refused at once
 * as not a regular file: its open used to wait forever for a writer (the alarm turns such a wait
 * into a wrong error). A tokenizer_config.json over file_read_all's bound is refused by its size
 * (jansson's json_load_file read any length). */
TEST(chat_load_refused_files)
{
    static const char *const names[] = {"chat_template.jinja", "tokenizer_config.json", "tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        char d[4400], p[4500], err[512] = "";
        snprintf(d, sizeof d, "%s/chat_refused%d", test_tmpdir(), i);
        if (i < 2) {
            ASSERT(test_fifo(d, names[i]), "mkfifo %s/%s", d, names[i]);
        } else {
            mkdir(d, 0755);
            snprintf(p, sizeof p, "%s/%s", d, names[i]);
            FILE *f = fopen(p, "w");
            ASSERT(f && fclose(f) == 0 && truncate(p, (off_t)FILE_READ_MAX + 1) == 0, "%s", p); /* sparse */
        }
        const char *why = i < 2 ? ": cannot read: not a regular file" : ": cannot read: more than 64 MiB";
        test_alarm(2);
        ChatTemplate *t = chat_template_load(d, err, sizeof err);
        test_alarm(0);
        EXPECT(!t && strstr(err, names[i]) && strstr(err, why), "%s: %s", names[i], err);
        if (t) chat_template_free(t);
    }
}

/* ---- speed: GLM-4.6's template on 20 messages ---- */

TEST(chat_speed)
{
    char err[512];
    ChatTemplate *t = parse_file(test_data("chat/glm46.jinja"), err, sizeof err);
    ASSERT(t, "%s", err);
    json_t *m = json_array();
    json_array_append_new(m, json_pack("{s:s, s:s}", "role", "system", "content", "You are a helpful assistant."));
    for (int i = 0; i < 19; i++) {
        char q[128];
        snprintf(q, sizeof q, "Question %d: what is %d squared? Please explain the steps in some detail.", i, i);
        if (i % 2 == 0) json_array_append_new(m, json_pack("{s:s, s:s}", "role", "user", "content", q));
        else json_array_append_new(m, json_pack("{s:s, s:s, s:s}", "role", "assistant", "content", q, "reasoning_content", "Think."));
    }
    int iters = 200;
    double t0 = clock_now();
    size_t total = 0;
    for (int i = 0; i < iters; i++) {
        char *out = NULL;
        int rc = chat_template_render(t, m, NULL, 1, NULL, NULL, NULL, &out, err, sizeof err);
        if (rc) { test_fail(__FILE__, __LINE__, "%s", err); break; }
        total += strlen(out);
        free(out);
    }
    double us = (clock_now() - t0) / iters * 1e6;
    fprintf(stderr, "    glm46 template, 20 messages: %.1f us per render (%zu bytes)\n", us, total / (size_t)iters);
    EXPECT(us < 2000, "%.1f us per render", us); /* bound loose enough for sanitizer builds */
    json_decref(m);
    chat_template_free(t);
}

/* Inputs the fuzzer (tests/fuzz/, `make fuzz`) found, kept as they were found
 * (tests/fuzz/regressions/chat_template/): an empty dict's items, and select without a test name,
 * made a pointer from NULL plus an offset (undefined in C even when the offset is 0; clang's
 * UBSan stops there, GCC's does not check it). Their output is Jinja's. */
TEST(chat_fuzz_findings)
{
    static const struct { const char *tmpl, *want; } cases[] = {
        {"{{ {}|items|list }}{{ {'a': 1}|items|list }}", "[][('a', 1)]"},
        {"{% if [1]|select %}truthy{% endif %}{% if []|select %} also{% endif %}", "truthy also"},
        {"{{ [0, 1, '', 'x']|select|list }}{{ []|reject|list }}{{ [{'a': 0}, {'a': 2}]|selectattr('a')|list }}",
         "[1, 'x'][][{'a': 2}]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "", *out = NULL;
        int rc = render_str(cases[i].tmpl, NULL, NULL, &out, err, sizeof err);
        EXPECT(rc == 0 && out && !strcmp(out, cases[i].want), "case %zu: %s", i, rc ? err : out);
        free(out);
    }
}
