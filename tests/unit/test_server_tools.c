/* test_server_tools: GLM reasoning and tool calls through POST /v1/chat/completions over real
 * loopback HTTP (src/server/openai.c with the parser src/format/glm_parse.c). The server runs
 * with the test hook `--script-output FILE`: every request generates the tokenization of FILE's
 * text (read per request) and then eos, so a test writes the GLM output it wants and checks what
 * the API makes of it, non-streamed and streamed (the deltas reassembled as the OpenAI client
 * does: reasoning_content and content concatenated, tool_calls by index): reasoning_content,
 * content, tool_calls (unique ids, names, arguments a JSON string of the right object),
 * finish_reason, usage, and no markup in any content or reasoning piece.
 * Covered: one and two calls with string and non-string arguments; plain text; thinking only;
 * tool_choice none, auto, required and a named function (the prefilled call opening counted in
 * prompt_tokens); malformed markup (unterminated, JSON-style arguments, an unknown function, cut
 * by max_tokens) coming back as content with finish "stop" and a warning in the server log; a
 * second turn with an assistant's tool_calls and tool results; chat_template_kwargs; the 400s of
 * bad tools, tool_choice and tool_calls; servers on model directories with GLM-4.6's and
 * GLM-4.7-Flash's own templates (tests/data/chat/glm46.jinja, glm47.jinja) in their markup; the
 * official OpenAI Python client (tests/openai_client_tools.py); a clean exit of every server.
 * Model, server process and HTTP client: tests/server_harness.c. Run: make test FILTER=server_tools. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <jansson.h>
#include <stdlib.h>

#include "base/util.h"
#include "format/model_text.h"
#include "server_harness.h"

/* ---- servers that say what they are told ---- */

typedef struct {
    const char *name;          /* builtin, glm46, glm47: the chat template */
    Srv srv;
    char dir[600];             /* the model directory */
    char script[700];          /* its --script-output file */
    int n_script;              /* the script's tokens and the eos: completion_tokens */
    ModelText own;             /* the copies' tokenizer and template */
    ModelText *mt;             /* the directory's */
    int tried;
} ToolSrv;

enum { SRV_BUILTIN, SRV_GLM46, SRV_GLM47, N_SRV };
static ToolSrv servers[N_SRV] = {{.name = "builtin"}, {.name = "glm46"}, {.name = "glm47"}};

static void servers_atexit(void)
{
    for (int i = 0; i < N_SRV; i++)
        if (servers[i].srv.pid) srv_stop(&servers[i].srv, 60);
}

static int tokens_of(ModelText *mt, const char *text)
{
    int *ids = NULL;
    char err[256];
    int n = tokenizer_encode(mt->tok, text, strlen(text), 0, &ids, err, sizeof err);
    free(ids);
    return n;
}

/* What the server generates from now on. */
static void script_set(ToolSrv *t, const char *text)
{
    FILE *f = fopen(t->script, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text)) test_fail(__FILE__, __LINE__, "cannot write %s", t->script);
    if (f) fclose(f);
    t->n_script = tokens_of(t->mt, text) + 1;
}

/* The server on the synth model (builtin) or on a copy of it whose chat_template.jinja (which
 * model_text prefers to tokenizer_config.json's) is tests/data/chat/<name>.jinja; started on
 * first use. */
static ToolSrv *tool_srv(int which)
{
    ToolSrv *t = &servers[which];
    if (t->tried) return t->srv.pid ? t : NULL;
    t->tried = 1;
    if (which == SRV_BUILTIN) {
        snprintf(t->dir, sizeof t->dir, "%s", model_dir());
        t->mt = model_text();
    } else {
        char rel[64], cmd[2000], *out = NULL;
        snprintf(rel, sizeof rel, "chat/%s.jinja", t->name);
        snprintf(t->dir, sizeof t->dir, "%s/tools-%s", test_tmpdir(), t->name);
        snprintf(cmd, sizeof cmd, "cp -R '%s' '%s' && cp '%s' '%s/chat_template.jinja'", model_dir(), t->dir, test_data(rel), t->dir);
        int rc = test_run(cmd, &out);
        if (rc != 0) test_fail(__FILE__, __LINE__, "%s -> %d: %s", cmd, rc, out ? out : "");
        free(out);
        if (rc != 0) return NULL;
        model_text_open(&t->own, t->dir, NULL, 0);
        if (!t->own.chat) { test_fail(__FILE__, __LINE__, "%s: no chat template: %s", t->dir, t->own.chat_err); return NULL; }
        t->mt = &t->own;
    }
    snprintf(t->script, sizeof t->script, "%s/script-%s.txt", test_tmpdir(), t->name);
    script_set(t, "");
    char extra[900];
    snprintf(extra, sizeof extra, "--num-kv-blocks 512 --script-output '%s'", t->script);
    if (srv_start_model(&t->srv, t->name, t->dir, extra) != 0) return NULL;
    static int registered;
    if (!registered++) atexit(servers_atexit);
    return t;
}

/* Lines of the server's log that contain needle. */
static int log_count(const ToolSrv *t, const char *needle)
{
    size_t len;
    char *s = file_read_all(t->srv.log, &len);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p++) n++;
    free(s);
    return n;
}

/* ---- JSON written with ' for " (no text here has an apostrophe) ---- */

static char *jq_text(const char *s)
{
    char *t = xstrdup(s);
    for (char *p = t; *p; p++)
        if (*p == '\'') *p = '"';
    return t;
}

static json_t *jq(const char *s)
{
    char *t = jq_text(s);
    json_error_t je;
    json_t *j = json_loads(t, 0, &je);
    if (!j) test_fail(__FILE__, __LINE__, "bad test JSON (%s): %s", je.text, t);
    free(t);
    return j;
}

/* {"messages": messages, "tools": tools (unless NULL), extra...}, all in jq notation. */
static char *body_of(const char *messages, const char *tools, const char *extra)
{
    char *s = NULL, *t;
    if (asprintf(&s, "{'messages': %s%s%s%s}", messages, tools ? ", 'tools': " : "", tools ? tools : "", extra ? extra : "") < 0) return NULL;
    t = jq_text(s);
    free(s);
    return t;
}

/* Tokens of messages (and tools, kwargs: NULL) through the template with the generation prompt,
 * then suffix (the call opening the server prefills). jq notation, or JSON without apostrophes. */
static int render_tokens(ModelText *mt, const char *messages, const char *tools, const char *kwargs, const char *suffix)
{
    json_t *m = jq(messages), *tl = tools ? jq(tools) : NULL, *kw = kwargs ? jq(kwargs) : NULL;
    char *text = NULL, err[512];
    int n = -1;
    if (m && model_text_render(mt, m, tl, kw, 1, &text, err, sizeof err) == 0) {
        char *full = NULL;
        if (asprintf(&full, "%s%s", text, suffix ? suffix : "") >= 0) n = tokens_of(mt, full);
        free(full);
    } else {
        test_fail(__FILE__, __LINE__, "render: %s", err);
    }
    free(text);
    json_decref(m);
    json_decref(tl);
    json_decref(kw);
    return n;
}

/* ---- a reply, non-streamed or streamed, and what it should be ---- */

typedef struct {
    int status;
    int has_reasoning;         /* non-streamed: reasoning_content is there; streamed: a delta had some */
    int content_null;          /* non-streamed: content is null */
    char reasoning[16384], content[16384];
    json_t *calls;             /* [{"id", "type", "function": {"name", "arguments"}}], reassembled */
    char finish[16];
    int prompt_tokens, completion_tokens;
    char markup[32];           /* a tag found in a content or reasoning piece, or "" */
    char *raw;                 /* the body (for failure messages) */
} Reply;

static void reply_free(Reply *r)
{
    json_decref(r->calls);
    free(r->raw);
    r->calls = NULL;
    r->raw = NULL;
}

static const char *const MARKUP[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                     "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};

static const char *markup_in(const char *s)
{
    for (size_t i = 0; s && i < sizeof MARKUP / sizeof MARKUP[0]; i++)
        if (strstr(s, MARKUP[i])) return MARKUP[i];
    return NULL;
}

static void piece_add(Reply *r, char *dst, const char *piece)
{
    const char *m = markup_in(piece);
    if (m && !r->markup[0]) snprintf(r->markup, sizeof r->markup, "%s", m);
    strncat(dst, piece, sizeof r->content - strlen(dst) - 1);
}

static void reply_full(const char *file, int line, const Resp *resp, Reply *r)
{
    json_t *j = body_json(resp);
    json_t *msg = jget(j, "choices.0.message"), *c = jget(msg, "content"), *rc = jget(msg, "reasoning_content");
    json_t *tc = jget(msg, "tool_calls");
    if (!json_is_object(msg) || !jstr(msg, "role") || strcmp(jstr(msg, "role"), "assistant"))
        test_fail(file, line, "no assistant message");
    if (json_is_string(c)) piece_add(r, r->content, json_string_value(c));
    else if (json_is_null(c)) r->content_null = 1;
    else test_fail(file, line, "content is neither a string nor null");
    if (json_is_string(rc)) {
        r->has_reasoning = 1;
        piece_add(r, r->reasoning, json_string_value(rc));
    } else if (rc) test_fail(file, line, "reasoning_content is not a string");
    if (tc && (!json_is_array(tc) || json_array_size(tc) == 0)) test_fail(file, line, "tool_calls is there but not a non-empty array");
    r->calls = json_is_array(tc) ? json_deep_copy(tc) : json_array();
    const char *fin = jstr(j, "choices.0.finish_reason");
    snprintf(r->finish, sizeof r->finish, "%s", fin ? fin : "");
    r->prompt_tokens = (int)jint(j, "usage.prompt_tokens");
    r->completion_tokens = (int)jint(j, "usage.completion_tokens");
    json_decref(j);
}

/* The deltas as the OpenAI client accumulates them: text concatenated, a tool call opened by
 * the first delta of its index (id, type, name) and its arguments appended by later ones. */
static void reply_stream(const char *file, int line, const Resp *resp, Reply *r)
{
    Stream st;
    stream_check(file, line, resp, 1, &st); /* the shape: role first, one finish, [DONE], usage */
    snprintf(r->finish, sizeof r->finish, "%s", st.finish);
    r->prompt_tokens = st.prompt_tokens;
    r->completion_tokens = st.completion_tokens;
    if (!st.has_usage) test_fail(file, line, "no usage chunk");
    r->calls = json_array();
    Sse s;
    sse_parse(resp->body ? resp->body : "", &s);
    size_t i;
    json_t *chunk;
    json_array_foreach(s.chunks, i, chunk) {
        json_t *d = jget(chunk, "choices.0.delta");
        if (!d) continue;
        json_t *c = json_object_get(d, "content"), *rc = json_object_get(d, "reasoning_content"), *tc = json_object_get(d, "tool_calls");
        if (c && !json_is_null(c)) {
            if (!json_is_string(c)) test_fail(file, line, "chunk %zu: content is not a string", i);
            else piece_add(r, r->content, json_string_value(c));
        }
        if (rc && !json_is_null(rc)) {
            if (!json_is_string(rc)) test_fail(file, line, "chunk %zu: reasoning_content is not a string", i);
            else if (json_string_length(rc)) {
                r->has_reasoning = 1;
                piece_add(r, r->reasoning, json_string_value(rc));
            }
        }
        if (!tc || json_is_null(tc)) continue;
        if (!json_is_array(tc)) { test_fail(file, line, "chunk %zu: tool_calls is not an array", i); continue; }
        size_t k;
        json_t *e;
        json_array_foreach(tc, k, e) {
            json_t *idx = json_object_get(e, "index"), *f = json_object_get(e, "function");
            const char *args = json_string_value(json_object_get(f, "arguments"));
            size_t n = json_array_size(r->calls);
            if (!json_is_integer(idx) || json_integer_value(idx) < 0 || (size_t)json_integer_value(idx) > n) {
                test_fail(file, line, "chunk %zu: tool call index missing or out of order", i);
                continue;
            }
            if ((size_t)json_integer_value(idx) == n) {
                const char *id = jstr(e, "id"), *type = jstr(e, "type"), *name = json_string_value(json_object_get(f, "name"));
                if (!id || !type || !name) test_fail(file, line, "chunk %zu: a new tool call without id, type or name", i);
                json_array_append_new(r->calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id ? id : "", "type", type ? type : "",
                                                          "function", "name", name ? name : "", "arguments", args ? args : ""));
            } else if (args) {
                json_t *fa = jget(json_array_get(r->calls, (size_t)json_integer_value(idx)), "function");
                char *cat = NULL;
                if (asprintf(&cat, "%s%s", json_string_value(json_object_get(fa, "arguments")), args) >= 0)
                    json_object_set_new(fa, "arguments", json_string(cat));
                free(cat);
            }
        }
    }
    json_decref(s.chunks);
}

/* POST the chat request (jq-free JSON), streamed (with usage) or not. */
static void ask(const char *file, int line, ToolSrv *t, const char *body, int stream, Reply *r)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *b = json_loads(body, 0, &je);
    if (!b) { test_fail(file, line, "bad request JSON (%s): %s", je.text, body); return; }
    if (stream) {
        json_object_set_new(b, "stream", json_true());
        json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    char *text = json_dumps(b, 0);
    json_decref(b);
    Resp resp;
    post(t->srv.port, "/v1/chat/completions", text, &resp);
    free(text);
    r->status = resp.status;
    r->raw = strdup(resp.body ? resp.body : "");
    if (resp.status != 200) test_fail(file, line, "status %d: %.300s", resp.status, r->raw);
    else if (stream) reply_stream(file, line, &resp, r);
    else reply_full(file, line, &resp, r);
    resp_free(&resp);
}

typedef struct {
    const char *reasoning;     /* NULL: no reasoning_content */
    const char *content;       /* "" when none: then null (non-streamed) if there is reasoning or a call */
    const char *calls;         /* jq [[name, {arguments}], ...]; NULL: no tool_calls */
    const char *finish;
    int prompt_tokens;         /* 0: not checked */
    int completion_tokens;     /* 0: the script's tokens and the eos */
} Want;

static void expect_reply(const char *file, int line, const char *what, const ToolSrv *t, const Reply *r, int stream, const Want *w)
{
    int fails = test_failed_now();
    if (r->status != 200) return; /* ask said so */
    if (strcmp(r->finish, w->finish)) test_fail(file, line, "finish_reason '%s', expected '%s'", r->finish, w->finish);
    if (!w->reasoning && r->has_reasoning) test_fail(file, line, "reasoning_content '%s', expected none", r->reasoning);
    if (w->reasoning && (!r->has_reasoning || strcmp(r->reasoning, w->reasoning)))
        test_fail(file, line, "reasoning_content '%s', expected '%s'", r->has_reasoning ? r->reasoning : "(none)", w->reasoning);
    if (strcmp(r->content, w->content)) test_fail(file, line, "content '%s', expected '%s'", r->content, w->content);
    int want_null = !w->content[0] && (w->reasoning || w->calls);
    if (!stream && r->content_null != want_null) test_fail(file, line, "content is %snull", r->content_null ? "" : "not ");
    if (r->markup[0] && !markup_in(w->content) && !markup_in(w->reasoning))
        test_fail(file, line, "markup %s in a content or reasoning piece", r->markup);
    json_t *want = w->calls ? jq(w->calls) : json_array();
    size_t n = json_array_size(r->calls);
    if (n != json_array_size(want)) test_fail(file, line, "%zu tool calls, expected %zu", n, json_array_size(want));
    for (size_t i = 0; i < n && i < json_array_size(want); i++) {
        json_t *c = json_array_get(r->calls, i), *wc = json_array_get(want, i);
        const char *id = jstr(c, "id"), *type = jstr(c, "type"), *name = jstr(c, "function.name"), *args = jstr(c, "function.arguments");
        if (!id || strncmp(id, "call_", 5) || strlen(id) < 13) test_fail(file, line, "call %zu: id '%s'", i, id ? id : "(none)");
        for (size_t k = 0; id && k < i; k++)
            if (jstr(json_array_get(r->calls, k), "id") && !strcmp(jstr(json_array_get(r->calls, k), "id"), id))
                test_fail(file, line, "calls %zu and %zu share the id %s", k, i, id);
        if (!type || strcmp(type, "function")) test_fail(file, line, "call %zu: type '%s'", i, type ? type : "(none)");
        if (!name || strcmp(name, json_string_value(json_array_get(wc, 0))))
            test_fail(file, line, "call %zu: name '%s', expected '%s'", i, name ? name : "(none)", json_string_value(json_array_get(wc, 0)));
        json_error_t je;
        json_t *a = args ? json_loads(args, 0, &je) : NULL;
        if (!json_is_object(a) || !json_equal(a, json_array_get(wc, 1))) {
            char *ws = json_dumps(json_array_get(wc, 1), JSON_SORT_KEYS);
            test_fail(file, line, "call %zu: arguments '%s', expected %s", i, args ? args : "(none)", ws);
            free(ws);
        }
        json_decref(a);
    }
    json_decref(want);
    if (w->prompt_tokens && r->prompt_tokens != w->prompt_tokens)
        test_fail(file, line, "prompt_tokens %d, expected %d", r->prompt_tokens, w->prompt_tokens);
    int ct = w->completion_tokens ? w->completion_tokens : t->n_script;
    if (r->completion_tokens != ct) test_fail(file, line, "completion_tokens %d, expected %d", r->completion_tokens, ct);
    if (!fails && test_failed_now()) fprintf(stderr, "    (%s, %s; body '%.600s')\n", what, stream ? "streamed" : "not streamed", r->raw);
}

/* The request non-streamed and streamed, both as w says. */
static void check_both(const char *file, int line, const char *what, ToolSrv *t, const char *body, const Want *w)
{
    for (int stream = 0; stream < 2; stream++) {
        Reply r;
        ask(file, line, t, body, stream, &r);
        expect_reply(file, line, what, t, &r, stream, w);
        reply_free(&r);
    }
}

#define CHECK_BOTH(what, t, body, ...) check_both(__FILE__, __LINE__, what, t, body, &(Want){__VA_ARGS__})

/* ---- the conversations ---- */

static const char TOOLS[] =
    "[{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Weather for a city', 'parameters': {"
    "'type': 'object', 'properties': {'city': {'type': 'string'}, 'days': {'type': 'integer'}, 'zip': {'type': 'string'}},"
    " 'required': ['city']}}},"
    " {'type': 'function', 'function': {'name': 'search', 'description': 'Search the web', 'parameters': {"
    "'type': 'object', 'properties': {'query': {'type': 'string'}, 'filters': {'type': 'object'}}}}}]";

static const char USER[] = "[{'role': 'user', 'content': 'Weather in Paris, and find a cafe there.'}]";
static const char USER_TEXT[] = "Weather in Paris, and find a cafe there.";

/* GLM-4.5/4.6 markup, as the built-in and GLM-4.6 templates prompt it (output starts in content) */
#define THINK46 "\n<think>The user wants the weather and a search.</think>\n"
#define CALLS46 "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n" \
                "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n" \
                "</tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>café near the \"Louvre\"</arg_value>\n" \
                "<arg_key>filters</arg_key>\n<arg_value>{\"open\": true, \"price\": [1, 2.5], \"near\": null}</arg_value>\n" \
                "</tool_call>"
#define TWO_CALLS_WANT "[['get_weather', {'city': 'Paris', 'days': 3, 'zip': '75001'}]," \
                       " ['search', {'query': 'café near the \\\"Louvre\\\"', 'filters': {'open': true, 'price': [1, 2.5], 'near': null}}]]"
#define REASONING "The user wants the weather and a search."

/* ---- tests ---- */

TEST(server_tools_01_calls)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    char *body = body_of(USER, TOOLS, NULL);
    int np = render_tokens(t->mt, USER, TOOLS, NULL, NULL);
    ASSERT(np > chat_tokens(USER_TEXT), "the tools are not in the prompt");

    /* thinking, text, two calls with string, number and object arguments ("75001" stays a
     * string: the schema says so) */
    script_set(t, THINK46 "Let me check.\n" CALLS46);
    CHECK_BOTH("two calls", t, body, .reasoning = REASONING, .content = "Let me check.", .calls = TWO_CALLS_WANT,
               .finish = "tool_calls", .prompt_tokens = np);

    /* one call, no text: content null */
    script_set(t, THINK46 "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>42</arg_value>\n</tool_call>");
    CHECK_BOTH("one call, no content", t, body, .reasoning = REASONING, .content = "", .calls = "[['search', {'query': '42'}]]",
               .finish = "tool_calls", .prompt_tokens = np);

    /* no thinking: a call straight away, an argument of no declared type read as JSON */
    script_set(t, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>when</arg_key>\n"
                  "<arg_value>[2026, \"May\"]</arg_value>\n</tool_call>");
    CHECK_BOTH("no thinking", t, body, .content = "", .calls = "[['get_weather', {'city': 'Oslo', 'when': [2026, 'May']}]]",
               .finish = "tool_calls", .prompt_tokens = np);
    free(body);
}

TEST(server_tools_02_text_and_thinking)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    char *plain = body_of(USER, NULL, NULL), *with_tools = body_of(USER, TOOLS, NULL);
    int np = chat_tokens(USER_TEXT), npt = render_tokens(t->mt, USER, TOOLS, NULL, NULL);

    /* markup-free text passes through, '<' and all */
    const char *text = "Plain answer: a < b, 3 > 2, <b>bold</b>, <tool and </thin are text.\n\nBye.";
    script_set(t, text);
    CHECK_BOTH("plain, no tools", t, plain, .content = text, .finish = "stop", .prompt_tokens = np);
    CHECK_BOTH("plain, tools offered", t, with_tools, .content = text, .finish = "stop", .prompt_tokens = npt);

    /* thinking only: content null */
    script_set(t, "\n<think>Only thinking here.</think>\n");
    CHECK_BOTH("thinking only", t, plain, .reasoning = "Only thinking here.", .content = "", .finish = "stop", .prompt_tokens = np);
    /* thinking that never ends is all reasoning */
    script_set(t, "<think>Still thinking when the output ended");
    CHECK_BOTH("unterminated thinking", t, with_tools, .reasoning = "Still thinking when the output ended", .content = "",
               .finish = "stop", .prompt_tokens = npt);
    /* thinking and an answer, no tools */
    script_set(t, THINK46 "It is sunny.");
    CHECK_BOTH("thinking and text", t, plain, .reasoning = REASONING, .content = "It is sunny.", .finish = "stop", .prompt_tokens = np);

    /* "tools": [] is no tools */
    char *empty = body_of(USER, "[]", NULL);
    CHECK_BOTH("empty tools", t, empty, .reasoning = REASONING, .content = "It is sunny.", .finish = "stop", .prompt_tokens = np);
    free(empty);
    free(plain);
    free(with_tools);
}

/* tool_choice "none": the tools stay out of the prompt and the calls are not parsed (vLLM does
 * not parse them either): the markup is content, reasoning is still split off. */
TEST(server_tools_03_tool_choice_none)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    char *body = body_of(USER, TOOLS, ", 'tool_choice': 'none'");
    script_set(t, THINK46 "Let me check.\n" CALLS46);
    CHECK_BOTH("tool_choice none", t, body, .reasoning = REASONING, .content = "Let me check.\n" CALLS46, .finish = "stop",
               .prompt_tokens = chat_tokens(USER_TEXT));
    free(body);
    /* "none" needs no tools */
    body = body_of(USER, NULL, ", 'tool_choice': 'none'");
    script_set(t, "Fine.");
    CHECK_BOTH("tool_choice none without tools", t, body, .content = "Fine.", .finish = "stop", .prompt_tokens = chat_tokens(USER_TEXT));
    free(body);
}

/* "required" and a named function: thinking off and the opening of a call prefilled after the
 * prompt (which ends with "\n" here: the built-in template then writes "<tool_call>NAME\n");
 * the output goes on from there. */
TEST(server_tools_04_tool_choice_forced)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    const char *off = "{'enable_thinking': false}";
    char *req = body_of(USER, TOOLS, ", 'tool_choice': 'required'");
    script_set(t, "get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>");
    CHECK_BOTH("required", t, req, .content = "", .calls = "[['get_weather', {'city': 'Oslo'}]]", .finish = "tool_calls",
               .prompt_tokens = render_tokens(t->mt, USER, TOOLS, off, "<tool_call>"));

    char *named = body_of(USER, TOOLS, ", 'tool_choice': {'type': 'function', 'function': {'name': 'search'}}");
    int np_named = render_tokens(t->mt, USER, TOOLS, off, "<tool_call>search\n");
    script_set(t, "<arg_key>query</arg_key>\n<arg_value>moeserve</arg_value>\n<arg_key>filters</arg_key>\n"
                  "<arg_value>{\"year\": 2026}</arg_value>\n</tool_call>");
    CHECK_BOTH("named", t, named, .content = "", .calls = "[['search', {'query': 'moeserve', 'filters': {'year': 2026}}]]",
               .finish = "tool_calls", .prompt_tokens = np_named);

    /* a second call, of another function than the named one, is dropped (and logged) */
    int warned = log_count(t, "tool_choice names search but the model called get_weather");
    script_set(t, "<arg_key>query</arg_key>\n<arg_value>moeserve</arg_value>\n</tool_call>\n"
                  "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>");
    CHECK_BOTH("named, another function called too", t, named, .content = "", .calls = "[['search', {'query': 'moeserve'}]]",
               .finish = "tool_calls", .prompt_tokens = np_named);
    EXPECT_EQ_INT(log_count(t, "tool_choice names search but the model called get_weather"), warned + 2);

    /* required, but the model does not go on with a call: the prefilled tag is content */
    int malformed = log_count(t, "malformed tool call"), none = log_count(t, "asks for a tool call but the reply has none");
    script_set(t, " no call after all");
    CHECK_BOTH("required, no call", t, req, .content = "<tool_call> no call after all", .finish = "stop");
    EXPECT_EQ_INT(log_count(t, "malformed tool call"), malformed + 2);
    EXPECT_EQ_INT(log_count(t, "asks for a tool call but the reply has none"), none + 2);

    /* with enable_thinking set by the request, nothing is prefilled: the model thinks first */
    char *think = body_of(USER, TOOLS, ", 'tool_choice': 'required', 'chat_template_kwargs': {'enable_thinking': true}");
    script_set(t, THINK46 "Let me check.\n" CALLS46);
    CHECK_BOTH("required, thinking on", t, think, .reasoning = REASONING, .content = "Let me check.", .calls = TWO_CALLS_WANT,
               .finish = "tool_calls", .prompt_tokens = render_tokens(t->mt, USER, TOOLS, "{'enable_thinking': true}", NULL));
    free(think);
    free(req);
    free(named);
}

/* Markup that is not a well-formed call is content, finish "stop", status 200, and the server
 * logs a warning per request. */
TEST(server_tools_05_malformed)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    char *body = body_of(USER, TOOLS, NULL);
    int np = render_tokens(t->mt, USER, TOOLS, NULL, NULL);
    static const struct { const char *what, *script, *content; } cases[] = {
        {"unterminated call", "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
         "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"},
        {"JSON arguments instead of the markup", "<tool_call>get_weather {\"city\": \"Paris\"}</tool_call>",
         "<tool_call>get_weather {\"city\": \"Paris\"}</tool_call>"},
        {"an unknown function", "Sure.\n<tool_call>launch_rocket\n<arg_key>target</arg_key>\n<arg_value>moon</arg_value>\n</tool_call>",
         "Sure.\n<tool_call>launch_rocket\n<arg_key>target</arg_key>\n<arg_value>moon</arg_value>\n</tool_call>"},
        {"a value without its key", "<tool_call>get_weather\n<arg_value>Paris</arg_value>\n</tool_call>",
         "<tool_call>get_weather\n<arg_value>Paris</arg_value>\n</tool_call>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int warned = log_count(t, "malformed tool call");
        script_set(t, cases[i].script);
        CHECK_BOTH(cases[i].what, t, body, .content = cases[i].content, .finish = "stop", .prompt_tokens = np);
        EXPECT(log_count(t, "malformed tool call") == warned + 2, "%s: %d warnings in the log, expected %d", cases[i].what,
               log_count(t, "malformed tool call"), warned + 2);
    }

    /* max_tokens ends the output inside a call: the text so far is content, finish "length" */
    const char *script = THINK46 "Let me check.\n" CALLS46;
    script_set(t, script);
    int *ids = NULL, cut = -1;
    char err[256], *text = NULL;
    size_t len;
    int n = tokenizer_encode(t->mt->tok, script, strlen(script), 0, &ids, err, sizeof err);
    for (int i = 0; i < n && cut < 0; i++)
        if (tokenizer_token(t->mt->tok, ids[i]) && !strcmp(tokenizer_token(t->mt->tok, ids[i]), "<arg_value>")) cut = i + 1;
    ASSERT(cut > 0, "no <arg_value> token in the script");
    tokenizer_decode(t->mt->tok, ids, cut, 0, &text, &len); /* the first cut tokens, markup kept */
    const char *after = strstr(text, "</think>\n");
    ASSERT(after, "the cut text lacks </think>: %s", text);
    char extra[64];
    snprintf(extra, sizeof extra, ", 'max_tokens': %d", cut);
    char *cut_body = body_of(USER, TOOLS, extra);
    int warned = log_count(t, "malformed tool call");
    CHECK_BOTH("cut by max_tokens", t, cut_body, .reasoning = REASONING, .content = after + strlen("</think>\n"), .finish = "length",
               .prompt_tokens = np, .completion_tokens = cut);
    EXPECT_EQ_INT(log_count(t, "malformed tool call"), warned + 2);
    free(cut_body);
    free(text);
    free(ids);
    free(body);
}

/* The next turn of an agent loop: the assistant's tool_calls (arguments a JSON string, content
 * null) and the tool results go back; the template sees arguments as objects and content "". */
TEST(server_tools_06_second_turn)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    const char *sent =
        "[{'role': 'user', 'content': 'Weather in Paris and Oslo?'},"
        " {'role': 'assistant', 'content': null, 'reasoning_content': 'Two cities, two calls.', 'tool_calls': ["
        "{'id': 'call_a', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': '{\\'city\\': \\'Paris\\', \\'days\\': 3}'}},"
        " {'id': 'call_b', 'type': 'function', 'function': {'name': 'search', 'arguments': '{\\'query\\': \\'Oslo\\', \\'filters\\': {\\'n\\': [1, 2]}}'}}]},"
        " {'role': 'tool', 'tool_call_id': 'call_a', 'content': '{\\'temp\\': 21}'},"
        " {'role': 'tool', 'tool_call_id': 'call_b', 'content': 'Oslo: 12 C, rain'}]";
    const char *seen =
        "[{'role': 'user', 'content': 'Weather in Paris and Oslo?'},"
        " {'role': 'assistant', 'content': '', 'reasoning_content': 'Two cities, two calls.', 'tool_calls': ["
        "{'id': 'call_a', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': 3}}},"
        " {'id': 'call_b', 'type': 'function', 'function': {'name': 'search', 'arguments': {'query': 'Oslo', 'filters': {'n': [1, 2]}}}}]},"
        " {'role': 'tool', 'tool_call_id': 'call_a', 'content': '{\\'temp\\': 21}'},"
        " {'role': 'tool', 'tool_call_id': 'call_b', 'content': 'Oslo: 12 C, rain'}]";
    /* the jq notation turns \' into \" inside the arguments string: JSON text in a string */
    char *body = body_of(sent, TOOLS, NULL);
    int np = render_tokens(t->mt, seen, TOOLS, NULL, NULL);
    /* the template renders the call: with arguments left unparsed it would write none */
    int np_no_args = render_tokens(t->mt, "[{'role': 'user', 'content': 'Weather in Paris and Oslo?'},"
                                   " {'role': 'assistant', 'content': '', 'reasoning_content': 'Two cities, two calls.', 'tool_calls': ["
                                   "{'id': 'call_a', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {}}},"
                                   " {'id': 'call_b', 'type': 'function', 'function': {'name': 'search', 'arguments': {}}}]},"
                                   " {'role': 'tool', 'tool_call_id': 'call_a', 'content': '{\\'temp\\': 21}'},"
                                   " {'role': 'tool', 'tool_call_id': 'call_b', 'content': 'Oslo: 12 C, rain'}]", TOOLS, NULL, NULL);
    EXPECT(np > np_no_args, "the arguments are not in the rendered history (%d vs %d tokens)", np, np_no_args);
    script_set(t, THINK46 "Paris: 21 C. Oslo: 12 C and rain.");
    CHECK_BOTH("second turn", t, body, .reasoning = REASONING, .content = "Paris: 21 C. Oslo: 12 C and rain.", .finish = "stop",
               .prompt_tokens = np);
    free(body);

    /* arguments already an object, and missing, are accepted too */
    const char *obj = "[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'tool_calls': ["
                      "{'id': 'c1', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Rome'}}},"
                      " {'id': 'c2', 'type': 'function', 'function': {'name': 'search'}}]},"
                      " {'role': 'tool', 'tool_call_id': 'c1', 'content': 'warm'}, {'role': 'tool', 'tool_call_id': 'c2', 'content': 'x'}]";
    const char *obj_seen = "[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': '', 'tool_calls': ["
                           "{'id': 'c1', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Rome'}}},"
                           " {'id': 'c2', 'type': 'function', 'function': {'name': 'search', 'arguments': {}}}]},"
                           " {'role': 'tool', 'tool_call_id': 'c1', 'content': 'warm'}, {'role': 'tool', 'tool_call_id': 'c2', 'content': 'x'}]";
    body = body_of(obj, TOOLS, NULL);
    script_set(t, "Warm.");
    CHECK_BOTH("arguments as an object", t, body, .content = "Warm.", .finish = "stop",
               .prompt_tokens = render_tokens(t->mt, obj_seen, TOOLS, NULL, NULL));
    free(body);
}

TEST(server_tools_07_template_kwargs)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    /* enable_thinking false: the prompt closes an empty thinking block; the output is content */
    char *body = body_of(USER, NULL, ", 'chat_template_kwargs': {'enable_thinking': false}");
    int np = render_tokens(t->mt, USER, NULL, "{'enable_thinking': false}", NULL);
    EXPECT(np > chat_tokens(USER_TEXT), "enable_thinking false changes nothing in the prompt");
    script_set(t, "Direct answer.");
    CHECK_BOTH("enable_thinking false", t, body, .content = "Direct answer.", .finish = "stop", .prompt_tokens = np);
    free(body);
    /* and a call right away, with tools */
    body = body_of(USER, TOOLS, ", 'chat_template_kwargs': {'enable_thinking': false}");
    script_set(t, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>");
    CHECK_BOTH("enable_thinking false, a call", t, body, .content = "", .calls = "[['get_weather', {'city': 'Paris'}]]",
               .finish = "tool_calls", .prompt_tokens = render_tokens(t->mt, USER, TOOLS, "{'enable_thinking': false}", NULL));
    free(body);
    /* a variable the template does not know changes nothing */
    body = body_of(USER, NULL, ", 'chat_template_kwargs': {'no_such_variable': 1}");
    script_set(t, "Same.");
    CHECK_BOTH("unknown kwarg", t, body, .content = "Same.", .finish = "stop", .prompt_tokens = chat_tokens(USER_TEXT));
    free(body);
}

TEST(server_tools_08_errors)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    static const char GW[] = "{'type': 'function', 'function': {'name': 'get_weather'}}";
    char many[8192] = "[";
    for (int i = 0; i < 129; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%s{'type': 'function', 'function': {'name': 'f%d'}}", i ? "," : "", i);
    strcat(many, "]");
    char dup[256], two[256];
    snprintf(dup, sizeof dup, "[%s, %s]", GW, GW);
    snprintf(two, sizeof two, "[%s]", GW);
    const char *hist = "[{'role': 'user', 'content': 'x'}, {'role': 'assistant', 'content': null, 'tool_calls': %s}]";
    static const struct { const char *tools, *extra, *calls; const char *msg, *param; } cases[] = {
        {"{'type': 'function'}", NULL, NULL, "must be an array", "tools"},
        {"'get_weather'", NULL, NULL, "must be an array", "tools"},
        {"[{'type': 'function', 'function': {}}]", NULL, NULL, "name is required", "tools"},
        {"[{'type': 'function', 'function': {'name': 5}}]", NULL, NULL, "name is required", "tools"},
        {"[{'type': 'function', 'function': {'name': 'get weather'}}]", NULL, NULL, "not a valid function name", "tools"},
        {"[{'type': 'function', 'function': {'name': ''}}]", NULL, NULL, "not a valid function name", "tools"},
        {"[{'type': 'function', 'function': {'name': 'a<b'}}]", NULL, NULL, "not a valid function name", "tools"},
        {"[{'type': 'retrieval', 'function': {'name': 'f'}}]", NULL, NULL, "type must be", "tools"},
        {"[{'type': 'function'}]", NULL, NULL, "function must be an object", "tools"},
        {"[5]", NULL, NULL, "must be an object", "tools"},
        {"[{'type': 'function', 'function': {'name': 'f', 'parameters': 'x'}}]", NULL, NULL, "parameters", "tools"},
        {"[{'type': 'function', 'function': {'name': 'f', 'description': 3}}]", NULL, NULL, "description", "tools"},
        {"[{'type': 'function', 'function': {'name': 'f', 'strict': 'yes'}}]", NULL, NULL, "strict", "tools"},
        {"DUP", NULL, NULL, "both named", "tools"},
        {"MANY", NULL, NULL, "at most 128", "tools"},
        {"TWO", ", 'tool_choice': {'type': 'function', 'function': {'name': 'search'}}", NULL, "not among the tools", "tool_choice"},
        {NULL, ", 'tool_choice': 'required'", NULL, "needs 'tools'", "tool_choice"},
        {NULL, ", 'tool_choice': 'auto'", NULL, "needs 'tools'", "tool_choice"},
        {NULL, ", 'tool_choice': {'type': 'function', 'function': {'name': 'get_weather'}}", NULL, "needs 'tools'", "tool_choice"},
        {"[]", ", 'tool_choice': 'required'", NULL, "needs 'tools'", "tool_choice"},
        {"TWO", ", 'tool_choice': 'sometimes'", NULL, "tool_choice", "tool_choice"},
        {"TWO", ", 'tool_choice': {'type': 'function'}", NULL, "tool_choice", "tool_choice"},
        {"TWO", ", 'tool_choice': {'type': 'tool', 'function': {'name': 'get_weather'}}", NULL, "tool_choice", "tool_choice"},
        {"TWO", ", 'tool_choice': 5", NULL, "tool_choice", "tool_choice"},
        {NULL, ", 'chat_template_kwargs': 'enable_thinking'", NULL, "must be an object", "chat_template_kwargs"},
        {NULL, NULL, "[{'id': 'c', 'type': 'function', 'function': {'name': 'f', 'arguments': '{city: Paris'}}]", "not a JSON object", "messages"},
        {NULL, NULL, "[{'id': 'c', 'type': 'function', 'function': {'name': 'f', 'arguments': '[1, 2]'}}]", "not a JSON object", "messages"},
        {NULL, NULL, "[{'id': 'c', 'type': 'function', 'function': {'name': 'f', 'arguments': 5}}]", "JSON object as a string", "messages"},
        {NULL, NULL, "[{'id': 'c', 'type': 'function', 'function': {'arguments': '{}'}}]", "tool_calls[0]", "messages"},
        {NULL, NULL, "[{'id': 'c', 'type': 'function'}]", "tool_calls[0]", "messages"},
        {NULL, NULL, "{'id': 'c'}", "must be an array", "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *tools = cases[i].tools;
        if (tools && !strcmp(tools, "DUP")) tools = dup;
        else if (tools && !strcmp(tools, "MANY")) tools = many;
        else if (tools && !strcmp(tools, "TWO")) tools = two;
        char msgs[1024];
        if (cases[i].calls) snprintf(msgs, sizeof msgs, hist, cases[i].calls);
        else snprintf(msgs, sizeof msgs, "%s", USER);
        char *body = body_of(msgs, tools, cases[i].extra);
        Resp r;
        post(t->srv.port, "/v1/chat/completions", body, &r);
        expect_error(__FILE__, __LINE__, body, &r, 400, "invalid_request_error", cases[i].msg, cases[i].param);
        resp_free(&r);
        free(body);
    }
    /* a tool message needs its content, tool_call_id is a string */
    static const char *const bad_msgs[] = {
        "[{'role': 'user', 'content': 'x'}, {'role': 'tool', 'tool_call_id': 'c'}]",
        "[{'role': 'user', 'content': 'x'}, {'role': 'tool', 'tool_call_id': 7, 'content': 'y'}]",
    };
    for (size_t i = 0; i < 2; i++) {
        char *body = body_of(bad_msgs[i], NULL, NULL);
        Resp r;
        post(t->srv.port, "/v1/chat/completions", body, &r);
        expect_error(__FILE__, __LINE__, body, &r, 400, "invalid_request_error", i ? "tool_call_id" : "content is required", "messages");
        resp_free(&r);
        free(body);
    }
    /* still serving */
    char *body = body_of(USER, NULL, NULL);
    script_set(t, "OK.");
    CHECK_BOTH("after the errors", t, body, .content = "OK.", .finish = "stop", .prompt_tokens = chat_tokens(USER_TEXT));
    free(body);
}

/* A reply's message as the client sends it back (content, reasoning_content, tool_calls with
 * their arguments strings), and as the template should see it (arguments objects, content ""). */
static void message_back(json_t *reply_body, json_t **sent, json_t **seen)
{
    json_t *m = json_deep_copy(jget(reply_body, "choices.0.message"));
    json_object_del(m, "refusal");
    *sent = m;
    *seen = json_deep_copy(m);
    if (json_is_null(json_object_get(*seen, "content"))) json_object_set_new(*seen, "content", json_string(""));
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(*seen, "tool_calls"), i, c) {
        json_t *f = json_object_get(c, "function");
        json_object_set_new(f, "arguments", json_loads(json_string_value(json_object_get(f, "arguments")), 0, NULL));
    }
}

/* A server on GLM-4.6's or GLM-4.7-Flash's template: two calls in the template's own markup,
 * streamed and not; the reply sent back with tool results; a prefilled named call. */
static void glm_template_server(int which, const char *script, const char *named_script, const char *named_prefill)
{
    ToolSrv *t = tool_srv(which);
    ASSERT(t);
    char *body = body_of(USER, TOOLS, NULL);
    script_set(t, script);
    CHECK_BOTH(t->name, t, body, .reasoning = REASONING, .content = "Let me check.", .calls = TWO_CALLS_WANT, .finish = "tool_calls",
               .prompt_tokens = render_tokens(t->mt, USER, TOOLS, NULL, NULL));
    free(body);

    /* the next turn: the reply as the API returned it, then one result per call */
    Reply r;
    body = body_of(USER, TOOLS, NULL);
    ask(__FILE__, __LINE__, t, body, 0, &r);
    free(body);
    json_t *j = json_loads(r.raw ? r.raw : "", 0, NULL), *sent = NULL, *seen = NULL;
    reply_free(&r);
    ASSERT(j && jget(j, "choices.0.message.tool_calls"));
    message_back(j, &sent, &seen);
    json_decref(j);
    json_t *msgs_sent = jq(USER), *msgs_seen = jq(USER);
    json_array_append_new(msgs_sent, sent);
    json_array_append_new(msgs_seen, seen);
    for (int i = 0; i < 2; i++) {
        const char *id = jstr(sent, i ? "tool_calls.1.id" : "tool_calls.0.id");
        json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id ? id : "", "content", i ? "3 cafes" : "21 C");
        json_array_append(msgs_sent, tm);
        json_array_append_new(msgs_seen, tm);
    }
    char *ms = json_dumps(msgs_sent, 0), *mseen = json_dumps(msgs_seen, 0), *tools = jq_text(TOOLS);
    char *next = NULL;
    if (asprintf(&next, "{\"messages\": %s, \"tools\": %s}", ms, tools) < 0) next = NULL;
    const char *answer = which == SRV_GLM47 ? "Sunny, 21 C.</think>It is 21 C; 3 cafes." : "\n<think>Sunny, 21 C.</think>\nIt is 21 C; 3 cafes.";
    script_set(t, answer);
    CHECK_BOTH("next turn", t, next, .reasoning = "Sunny, 21 C.", .content = "It is 21 C; 3 cafes.", .finish = "stop",
               .prompt_tokens = render_tokens(t->mt, mseen, TOOLS, NULL, NULL));
    free(next);
    if (which == SRV_GLM47) {
        /* clear_thinking false keeps the reasoning of earlier turns in the prompt (GLM-4.7) */
        json_array_append_new(msgs_sent, json_pack("{s:s, s:s}", "role", "user", "content", "And tomorrow?"));
        json_array_append_new(msgs_seen, json_pack("{s:s, s:s}", "role", "user", "content", "And tomorrow?"));
        free(ms);
        free(mseen);
        ms = json_dumps(msgs_sent, 0);
        mseen = json_dumps(msgs_seen, 0);
        int kept = render_tokens(t->mt, mseen, TOOLS, "{'clear_thinking': false}", NULL);
        EXPECT(kept > render_tokens(t->mt, mseen, TOOLS, NULL, NULL), "clear_thinking false keeps nothing more");
        next = NULL;
        if (asprintf(&next, "{\"messages\": %s, \"tools\": %s, \"chat_template_kwargs\": {\"clear_thinking\": false}}", ms, tools) < 0) next = NULL;
        CHECK_BOTH("clear_thinking false", t, next, .reasoning = "Sunny, 21 C.", .content = "It is 21 C; 3 cafes.", .finish = "stop",
                   .prompt_tokens = kept);
        free(next);
    }
    free(ms);
    free(mseen);
    free(tools);
    json_decref(msgs_sent);
    json_decref(msgs_seen);

    /* a named function: the opening of the call is prefilled in this template's markup */
    body = body_of(USER, TOOLS, ", 'tool_choice': {'type': 'function', 'function': {'name': 'get_weather'}}");
    script_set(t, named_script);
    CHECK_BOTH("named", t, body, .content = "", .calls = "[['get_weather', {'city': 'Rome', 'days': 2}]]", .finish = "tool_calls",
               .prompt_tokens = render_tokens(t->mt, USER, TOOLS, "{'enable_thinking': false}", named_prefill));
    free(body);
}

TEST(server_tools_09_glm46_template)
{
    glm_template_server(SRV_GLM46, THINK46 "Let me check.\n" CALLS46,
                        "<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
                        "\n<tool_call>get_weather\n");
}

/* GLM-4.7: the prompt opens <think>, so the output starts in the reasoning; calls without
 * newlines. */
TEST(server_tools_10_glm47_template)
{
    glm_template_server(SRV_GLM47,
                        REASONING "</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                        "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>zip</arg_key><arg_value>75001</arg_value></tool_call>"
                        "<tool_call>search<arg_key>query</arg_key><arg_value>café near the \"Louvre\"</arg_value><arg_key>filters</arg_key>"
                        "<arg_value>{\"open\": true, \"price\": [1, 2.5], \"near\": null}</arg_value></tool_call>",
                        "<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
                        "<tool_call>get_weather");
}

TEST(server_tools_11_openai_python)
{
    ToolSrv *t = tool_srv(SRV_BUILTIN);
    ASSERT(t);
    if (!openai_python_ok()) {
        test_skip("the official OpenAI Python client is not available (python3 -m pip install openai failed)");
        return;
    }
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "python3 '%s/tests/openai_client_tools.py' http://127.0.0.1:%d/v1 '%s' '%s'", test_root(), t->srv.port,
             t->dir, t->script);
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s -> %d:\n%s", cmd, rc, out ? out : "");
    if (rc == 0) fprintf(stderr, "    %s", out);
    free(out);
}

/* Last: every server drains and exits 0 (under ASan: no leak either). */
TEST(server_tools_99_stop)
{
    for (int i = 0; i < N_SRV; i++) {
        ToolSrv *t = &servers[i];
        if (!t->srv.pid) continue;
        EXPECT(srv_stop(&t->srv, 60) == 0, "the %s server did not exit 0", t->name);
        if (t->mt == &t->own) model_text_free(&t->own);
    }
}
