/* test_glm_parse: src/format/glm_parse.c on scripted GLM outputs (GLM-4.5/4.6 and GLM-4.7
 * markup): reasoning, content and tool calls against hand-written answers; the streaming parser
 * fed one byte at a time, split at every position, and in seeded random chunkings, whose merged
 * deltas must equal the whole-text parse; malformed markup falling back to content; random
 * markup-free text passing through; and a round trip through the real chat templates (GLM-4.6's
 * and GLM-4.7-Flash's, committed in tests/data/chat/, and the built-in one): render a
 * conversation, parse the assistant turn back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "format/chat_template.h"
#include "format/glm_parse.h"

/* ---- helpers ---- */

typedef struct { char *p; size_t n, cap; } Sb;

static void sb_put(Sb *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static const char *sb_str(const Sb *b) { return b->p ? b->p : ""; }

/* A string for a failure message: control characters escaped, cut at 300 bytes. */
static const char *show(const char *s)
{
    static char bufs[8][1400];
    static int k;
    char *o = bufs[k++ & 7];
    size_t j = 0;
    for (size_t i = 0; s && s[i] && j < 1300; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 300) { j += (size_t)snprintf(o + j, 16, "..."); break; }
        if (c == '\n') o[j++] = '\\', o[j++] = 'n';
        else if (c == '\t') o[j++] = '\\', o[j++] = 't';
        else if (c < 0x20) j += (size_t)snprintf(o + j, 8, "\\x%02x", c);
        else o[j++] = (char)c;
    }
    o[j] = 0;
    return o;
}

/* The merged result of a stream of deltas, in the non-streaming shape. */
typedef struct {
    Sb reasoning, content;
    json_t *calls;
    int n_warnings, n_calls;
} Merged;

static void merged_free(Merged *m)
{
    free(m->reasoning.p);
    free(m->content.p);
    json_decref(m->calls);
    memset(m, 0, sizeof *m);
}

/* Merge one delta; checks each tool call delta has the OpenAI streaming shape. 0 on a bad shape. */
static int merge_delta(Merged *m, const GlmParseDelta *d, char *why, size_t whylen)
{
    if (strlen(d->reasoning) != d->reasoning_len || strlen(d->content) != d->content_len) {
        snprintf(why, whylen, "delta length disagrees with its text");
        return 0;
    }
    sb_put(&m->reasoning, d->reasoning, d->reasoning_len);
    sb_put(&m->content, d->content, d->content_len);
    if (!d->tool_calls) return 1;
    size_t i;
    json_t *tc;
    json_array_foreach(d->tool_calls, i, tc) {
        json_t *ix = json_object_get(tc, "index"), *f = json_object_get(tc, "function");
        json_t *args = json_object_get(f, "arguments");
        if (!json_is_integer(ix) || !json_is_string(args)) {
            snprintf(why, whylen, "tool call delta without index or function.arguments");
            return 0;
        }
        size_t idx = (size_t)json_integer_value(ix);
        if (idx == json_array_size(m->calls)) { /* the first delta of a call: id, type and name */
            json_t *id = json_object_get(tc, "id"), *type = json_object_get(tc, "type"), *name = json_object_get(f, "name");
            if (!json_is_string(id) || strncmp(json_string_value(id), "call_", 5) != 0 || !json_is_string(type) ||
                strcmp(json_string_value(type), "function") != 0 || !json_is_string(name) || !json_string_length(name)) {
                snprintf(why, whylen, "first delta of call %zu lacks id, type or name", idx);
                return 0;
            }
            json_array_append_new(m->calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                                      "function", "name", name, "arguments", args));
        } else if (idx + 1 == json_array_size(m->calls)) { /* a later delta appends to arguments */
            json_t *prev = json_object_get(json_object_get(json_array_get(m->calls, idx), "function"), "arguments");
            Sb s = { 0 };
            sb_put(&s, json_string_value(prev), json_string_length(prev));
            sb_put(&s, json_string_value(args), json_string_length(args));
            json_string_setn(prev, s.p, s.n);
            free(s.p);
        } else {
            snprintf(why, whylen, "tool call index %zu out of order", idx);
            return 0;
        }
    }
    return 1;
}

/* Stream text in chunks of the given sizes (cycled; 0 = the rest), then finish. */
static int stream_parse(const char *text, size_t len, const GlmParseOptions *o, const size_t *chunks, size_t n_chunks,
                        Merged *m, char *why, size_t whylen)
{
    GlmParser p;
    GlmParseDelta d;
    memset(m, 0, sizeof *m);
    m->calls = json_array();
    glm_parse_init(&p, o);
    int ok = 1;
    for (size_t at = 0, c = 0; at < len && ok; c++) {
        size_t k = chunks[c % n_chunks];
        if (k == 0 || k > len - at) k = len - at;
        glm_parse_feed(&p, text + at, k, &d);
        ok = merge_delta(m, &d, why, whylen);
        at += k;
    }
    if (ok) {
        glm_parse_finish(&p, &d);
        ok = merge_delta(m, &d, why, whylen);
    }
    m->n_warnings = p.n_warnings;
    m->n_calls = glm_parse_n_calls(&p);
    glm_parse_free(&p);
    return ok;
}

/* The streamed result under this chunking equals the whole-text result. */
static int same_as_whole(const char *label, const char *text, size_t len, const GlmParseOptions *o,
                         const GlmParseResult *w, const size_t *chunks, size_t n_chunks)
{
    Merged m;
    char why[200] = "";
    int ok = stream_parse(text, len, o, chunks, n_chunks, &m, why, sizeof why);
    if (ok && (strcmp(sb_str(&m.reasoning), w->reasoning) || strcmp(sb_str(&m.content), w->content) ||
               !json_equal(m.calls, w->tool_calls) || m.n_calls != (int)json_array_size(w->tool_calls) ||
               m.n_warnings != w->n_warnings)) {
        char *a = json_dumps(m.calls, JSON_COMPACT), *b = json_dumps(w->tool_calls, JSON_COMPACT);
        snprintf(why, sizeof why, "differs from the whole-text parse");
        fprintf(stderr, "    %s: streamed reasoning \"%s\" content \"%s\" calls %s warnings %d\n", label,
                show(sb_str(&m.reasoning)), show(sb_str(&m.content)), show(a), m.n_warnings);
        fprintf(stderr, "    %s: whole    reasoning \"%s\" content \"%s\" calls %s warnings %d\n", label,
                show(w->reasoning), show(w->content), show(b), w->n_warnings);
        free(a);
        free(b);
        ok = 0;
    }
    if (!ok) {
        fprintf(stderr, "    %s: %s; chunks:", label, why);
        for (size_t i = 0; i < n_chunks && i < 40; i++) fprintf(stderr, " %zu", chunks[i]);
        fprintf(stderr, "%s\n", n_chunks > 40 ? " ..." : "");
    }
    merged_free(&m);
    return ok;
}

/* Byte by byte, split in two at every position, and `n_random` seeded random chunkings. */
static int streams_agree(const char *label, const char *text, const GlmParseOptions *o, const GlmParseResult *w,
                         uint64_t seed, int n_random)
{
    size_t len = strlen(text);
    size_t one = 1, two[2];
    if (!same_as_whole(label, text, len, o, w, &one, 1)) return 0;
    for (size_t cut = 1; cut < len; cut++) {
        two[0] = cut, two[1] = 0;
        if (!same_as_whole(label, text, len, o, w, two, 2)) return 0;
    }
    Rng r;
    rng_seed(&r, seed);
    size_t chunks[64];
    for (int t = 0; t < n_random; t++) {
        size_t maxc = 1 + rng_u64(&r) % (t % 3 == 0 ? 4 : 24);
        for (int i = 0; i < 64; i++) chunks[i] = 1 + rng_u64(&r) % maxc;
        if (!same_as_whole(label, text, len, o, w, chunks, 64)) {
            fprintf(stderr, "    %s: random chunking %d of seed %llu\n", label, t, (unsigned long long)seed);
            return 0;
        }
    }
    return 1;
}

/* For long texts: byte by byte and `n_random` seeded random chunkings (1 to 4096 bytes). */
static int streams_agree_long(const char *label, const char *text, size_t len, const GlmParseOptions *o,
                              const GlmParseResult *w, uint64_t seed, int n_random)
{
    size_t one = 1;
    if (!same_as_whole(label, text, len, o, w, &one, 1)) return 0;
    Rng r;
    rng_seed(&r, seed);
    size_t chunks[64];
    for (int t = 0; t < n_random; t++) {
        size_t maxc = (size_t)1 << (rng_u64(&r) % 13);
        for (int i = 0; i < 64; i++) chunks[i] = 1 + rng_u64(&r) % maxc;
        if (!same_as_whole(label, text, len, o, w, chunks, 64)) {
            fprintf(stderr, "    %s: random chunking %d of seed %llu\n", label, t, (unsigned long long)seed);
            return 0;
        }
    }
    return 1;
}

/* ---- scripted outputs ---- */

typedef struct {
    const char *name;
    GlmParseStart start;
    int no_tools;           /* parse_tools = 0 */
    const char *tools;      /* JSON of the request's tools, or NULL */
    const char *text;
    const char *reasoning, *content;
    const char *calls;      /* JSON [[name, {arguments}], ...] */
    const char *args_text;  /* when set: the first call's arguments, byte for byte */
    int warnings;           /* malformed tool calls expected */
} Case;

#define C46 GLM_PARSE_START_CONTENT
#define C47 GLM_PARSE_START_REASONING
#define COFF GLM_PARSE_START_AFTER_THINK

static const char WEATHER_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"},"
    " \"zip\": {\"type\": \"string\"}}}}}]";

static const char TYPED_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"code\": {\"type\": \"string\"}, \"zip\": {\"type\": [\"string\", \"null\"]},"
    " \"opt\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}, \"color\": {\"enum\": [\"red\", \"1\"]},"
    " \"n\": {\"type\": \"integer\"}, \"mixed\": {\"type\": [\"string\", \"integer\"]}}}}},"
    " {\"name\": \"bare\", \"parameters\": {\"properties\": {\"id\": {\"type\": \"string\"}}}}]";

static const Case CASES[] = {
    { "glm46_thinking_one_call", C46, 0, WEATHER_TOOLS,
      "\n<think>The user wants the weather in Paris.</think>\nLet me check.\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
      "</tool_call>",
      "The user wants the weather in Paris.", "Let me check.",
      "[[\"get_weather\", {\"city\": \"Paris\", \"days\": 3}]]", "{\"city\":\"Paris\",\"days\":3}", 0 },
    { "glm46_two_calls_only", C46, 0, WEATHER_TOOLS,
      "\n<think>Two cities: two calls.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>北京</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>100000</arg_value>\n</tool_call>",
      "Two cities: two calls.", "",
      "[[\"get_weather\", {\"city\": \"Paris\"}], [\"get_weather\", {\"city\": \"北京\", \"zip\": \"100000\"}]]", NULL, 0 },
    { "glm46_content_after_calls", C46, 0, NULL,
      "\n<think>x</think>\nLet me check.\n<tool_call>get_time\n</tool_call>\nThe call is on its way.\n",
      "x", "Let me check.\nThe call is on its way.\n", "[[\"get_time\", {}]]", "{}", 0 },
    { "glm47_reasoning_start", C47, 0, WEATHER_TOOLS,
      "I should call the tool.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
      "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
      "I should call the tool.", "Checking.", "[[\"get_weather\", {\"city\": \"Paris\", \"days\": 3}]]", NULL, 0 },
    { "glm47_two_calls_then_text", C47, 0, NULL,
      "\nPlan: a then b.\n</think>First.<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
      "<tool_call>b</tool_call>Done.",
      "Plan: a then b.", "First.Done.", "[[\"a\", {\"x\": 1}], [\"b\", {}]]", NULL, 0 },
    { "text_only_after_call", COFF, 0, NULL, "<tool_call>a</tool_call>\n\nAfter.\n", "", "After.\n", "[[\"a\", {}]]",
      NULL, 0 },
    { "thinking_off_content", COFF, 0, NULL, "\nHello! How can I help?", "", "Hello! How can I help?", "[]", NULL, 0 },
    { "thinking_off_call", COFF, 0, NULL, "\n<tool_call>ping\n</tool_call>", "", "", "[[\"ping\", {}]]", NULL, 0 },
    { "reasoning_unterminated", C47, 0, NULL, "still thinking about it \n", "still thinking about it \n", "", "[]", NULL, 0 },
    { "reasoning_partial_close_at_end", C47, 0, NULL, "x < y, so </thi", "x < y, so </thi", "", "[]", NULL, 0 },
    { "no_think_in_content_mode", C46, 0, NULL, "Hi <think>x</think> there", "", "Hi <think>x</think> there", "[]", NULL, 0 },
    { "close_think_is_text_in_content", C46, 0, NULL, "a </think> b", "", "a </think> b", "[]", NULL, 0 },
    { "angle_brackets_in_text", C46, 0, NULL, "\n<think>if a<b and <t>, </th is not </thinking></think>\nUse <b>x</b>, "
      "a < b, <tool, <tool_call, </tool_call> here.", "if a<b and <t>, </th is not </thinking>",
      "Use <b>x</b>, a < b, <tool, <tool_call, </tool_call> here.", "[]", NULL, 0 },
    { "tools_off", C46, 1, NULL, "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "",
      "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "[]", NULL, 0 },
    { "argument_types", COFF, 0, NULL,
      "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>hello world</arg_value>\n<arg_key>i</arg_key>\n"
      "<arg_value>-42</arg_value>\n<arg_key>r</arg_key>\n<arg_value>2.50</arg_value>\n<arg_key>e</arg_key>\n"
      "<arg_value>1e-3</arg_value>\n<arg_key>t</arg_key>\n<arg_value>true</arg_value>\n<arg_key>fl</arg_key>\n"
      "<arg_value>false</arg_value>\n<arg_key>n</arg_key>\n<arg_value>null</arg_value>\n<arg_key>o</arg_key>\n"
      "<arg_value>{\"a\": [1, {\"b\": null}]}</arg_value>\n<arg_key>a</arg_key>\n<arg_value>[1, \"x\"]</arg_value>\n"
      "<arg_key>q</arg_key>\n<arg_value>\"quoted\"</arg_value>\n<arg_key>empty</arg_key>\n<arg_value></arg_value>\n"
      "<arg_key>big</arg_key>\n<arg_value>123456789012345678901234567890</arg_value>\n<arg_key>esc</arg_key>\n"
      "<arg_value>a\"b\\c\td\nline2\x01</arg_value>\n<arg_key>spaced</arg_key>\n<arg_value>  keep me \n</arg_value>\n"
      "<arg_key>num_ws</arg_key>\n<arg_value> 7 </arg_value>\n<arg_key>notjson</arg_key>\n<arg_value>{a: 1}</arg_value>\n"
      "<arg_key>lead0</arg_key>\n<arg_value>007</arg_value>\n</tool_call>",
      "", "", NULL,
      "{\"s\":\"hello world\",\"i\":-42,\"r\":2.50,\"e\":1e-3,\"t\":true,\"fl\":false,\"n\":null,"
      "\"o\":{\"a\": [1, {\"b\": null}]},\"a\":[1, \"x\"],\"q\":\"\\\"quoted\\\"\",\"empty\":\"\","
      "\"big\":123456789012345678901234567890,\"esc\":\"a\\\"b\\\\c\\td\\nline2\\u0001\","
      "\"spaced\":\"keep me\",\"num_ws\":7,\"notjson\":\"{a: 1}\",\"lead0\":\"007\"}", 0 },
    { "string_typed_params", COFF, 0, TYPED_TOOLS,
      "<tool_call>f<arg_key>code</arg_key><arg_value> 12345 </arg_value><arg_key>zip</arg_key><arg_value>true</arg_value>"
      "<arg_key>opt</arg_key><arg_value>null</arg_value><arg_key>color</arg_key><arg_value>1</arg_value>"
      "<arg_key>n</arg_key><arg_value>5</arg_value><arg_key>mixed</arg_key><arg_value>6</arg_value>"
      "<arg_key>other</arg_key><arg_value>[1]</arg_value></tool_call>"
      "<tool_call>bare<arg_key>id</arg_key><arg_value>42</arg_value></tool_call>"
      "<tool_call>unknown<arg_key>id</arg_key><arg_value>42</arg_value></tool_call>",
      "", "",
      "[[\"f\", {\"code\": \" 12345 \", \"zip\": \"true\", \"opt\": \"null\", \"color\": \"1\", \"n\": 5, \"mixed\": 6,"
      " \"other\": [1]}], [\"bare\", {\"id\": \"42\"}], [\"unknown\", {\"id\": 42}]]", NULL, 0 },
    { "unicode", C46, 0, NULL,
      "\n<think>思考：天气如何 🌤</think>\n好的，我来查一下。\n<tool_call>查询天气\n<arg_key>城市</arg_key>\n"
      "<arg_value>上海 🌆</arg_value>\n<arg_key>emoji</arg_key>\n<arg_value>[\"😀\", \"é\"]</arg_value>\n</tool_call>",
      "思考：天气如何 🌤", "好的，我来查一下。", "[[\"查询天气\", {\"城市\": \"上海 🌆\", \"emoji\": [\"😀\", \"é\"]}]]",
      "{\"城市\":\"上海 🌆\",\"emoji\":[\"😀\", \"é\"]}", 0 },
    { "literal_backslash_n", COFF, 0, NULL,
      "<tool_call>f\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>", "", "",
      "[[\"f\", {\"k\": \"v\"}]]", NULL, 0 },
    { "duplicate_key_last_wins", COFF, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>2</arg_value>"
      "<arg_key> a </arg_key><arg_value>3</arg_value></tool_call>", "", "", NULL, "{\"a\":3,\"b\":2}", 0 },
    { "value_holds_markup_text", COFF, 0, NULL,
      "<tool_call>write<arg_key>text</arg_key><arg_value>use <tool_call> and <arg_key> tags</arg_value></tool_call>",
      "", "", "[[\"write\", {\"text\": \"use <tool_call> and <arg_key> tags\"}]]", NULL, 0 },
    { "trailing_whitespace_kept_without_markup", C46, 0, NULL, "Hello \n", "", "Hello \n", "[]", NULL, 0 },
    { "invalid_utf8_in_value", COFF, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value>x\xff" "y</arg_value></tool_call>", "", "",
      "[[\"f\", {\"a\": \"x\xef\xbf\xbd" "y\"}]]", NULL, 0 },

    /* malformed: the markup comes back as content */
    { "malformed_unterminated", C46, 0, NULL,
      "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", "",
      "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", "[]", NULL, 1 },
    { "malformed_missing_name", C46, 0, NULL,
      "<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", "",
      "<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", "[]", NULL, 1 },
    { "malformed_junk_between_args", C46, 0, NULL,
      "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\nblah\n</tool_call> ok", "",
      "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\nblah\n</tool_call> ok", "[]", NULL, 1 },
    { "malformed_key_without_value", C46, 0, NULL, "<tool_call>f<arg_key>a</arg_key></tool_call>", "",
      "<tool_call>f<arg_key>a</arg_key></tool_call>", "[]", NULL, 1 },
    { "malformed_unterminated_value", C46, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>", "",
      "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>", "[]", NULL, 1 },
    { "malformed_empty_key", C46, 0, NULL, "<tool_call>f<arg_key> </arg_key><arg_value>1</arg_value></tool_call>", "",
      "<tool_call>f<arg_key> </arg_key><arg_value>1</arg_value></tool_call>", "[]", NULL, 1 },
    { "malformed_name_with_space", C46, 0, NULL, "<tool_call>get weather\n</tool_call>", "",
      "<tool_call>get weather\n</tool_call>", "[]", NULL, 1 },
    { "malformed_nested_junk_then_call", C46, 0, NULL,
      "<tool_call>junk <tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "",
      "<tool_call>junk", "[[\"f\", {\"a\": 1}]]", NULL, 1 },
    { "malformed_second_call_unterminated", C46, 0, NULL,
      "<tool_call>a</tool_call>\n<tool_call>b<arg_key>", "", "<tool_call>b<arg_key>", "[[\"a\", {}]]", NULL, 1 },
    { "malformed_partial_tag_at_end", C46, 0, NULL, "Hello <tool_ca", "", "Hello <tool_ca", "[]", NULL, 0 },
    { "malformed_only_open_tag", COFF, 0, NULL, "\n<tool_call>", "", "<tool_call>", "[]", NULL, 1 },

    /* blocks nested in arguments, whose walks share their closing tags (glm_parse_nested_arguments) */
    { "nested_in_value_both_malformed", COFF, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value><tool_call>g<arg_key>b</arg_key><arg_value>2</arg_value>x</tool_call>",
      "", "<tool_call>f<arg_key>a</arg_key><arg_value><tool_call>g<arg_key>b</arg_key><arg_value>2</arg_value>x</tool_call>",
      "[]", NULL, 2 },
    { "nested_in_value_outer_call", COFF, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value><tool_call>g<arg_key>b</arg_key><arg_value>2</arg_value></tool_call>",
      "", "", "[[\"f\", {\"a\": \"<tool_call>g<arg_key>b</arg_key><arg_value>2\"}]]", NULL, 0 },
    { "nested_in_key_inner_call", COFF, 0, NULL,
      "<tool_call>f<arg_key>x <tool_call>g<arg_key> k </arg_key><arg_value>1</arg_value></tool_call>",
      "", "<tool_call>f<arg_key>x", "[[\"g\", {\"k\": 1}]]", NULL, 1 },
    { "nested_keys_unterminated", COFF, 0, NULL, "<tool_call>f<arg_key>a<tool_call>g<arg_key>b</tool_call>", "",
      "<tool_call>f<arg_key>a<tool_call>g<arg_key>b</tool_call>", "[]", NULL, 2 },
    { "nested_keys_blank", COFF, 0, NULL, "<tool_call>f<arg_key><tool_call>g<arg_key>  </arg_key></tool_call>", "",
      "<tool_call>f<arg_key><tool_call>g<arg_key>  </arg_key></tool_call>", "[]", NULL, 2 },
    { "nested_after_value_call", COFF, 0, NULL,
      "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>x<tool_call>g<arg_key>a</arg_key><arg_value>2</arg_value>"
      "</tool_call>", "", "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>x", "[[\"g\", {\"a\": 2}]]", NULL, 1 },
    { "duplicate_keys_interleaved", COFF, 0, NULL,
      "<tool_call>f<arg_key>b</arg_key><arg_value>1</arg_value><arg_key>ab</arg_key><arg_value>2</arg_value>"
      "<arg_key>a</arg_key><arg_value>3</arg_value><arg_key>b</arg_key><arg_value>\"s\"</arg_value>"
      "<arg_key>a</arg_key><arg_value>[4]</arg_value><arg_key>b</arg_key><arg_value> x </arg_value></tool_call>",
      "", "", NULL, "{\"b\":\"x\",\"ab\":2,\"a\":[4]}", 0 },
};

static int check_calls(const Case *c, json_t *got)
{
    int ok = 1;
    if (c->calls) {
        json_error_t je;
        json_t *want = json_loads(c->calls, 0, &je);
        if (!want) { fprintf(stderr, "    %s: bad expected JSON: %s\n", c->name, je.text); return 0; }
        if (json_array_size(got) != json_array_size(want)) {
            fprintf(stderr, "    %s: %zu tool calls, expected %zu\n", c->name, json_array_size(got), json_array_size(want));
            ok = 0;
        }
        for (size_t i = 0; ok && i < json_array_size(want); i++) {
            json_t *w = json_array_get(want, i), *g = json_object_get(json_array_get(got, i), "function");
            const char *args = json_string_value(json_object_get(g, "arguments"));
            json_t *ga = args ? json_loads(args, JSON_DECODE_INT_AS_REAL, &je) : NULL;
            json_t *wa = json_array_get(w, 1);
            /* compare numbers as reals on both sides (the big integer case) */
            char *wtext = json_dumps(wa, JSON_COMPACT);
            json_t *wr = json_loads(wtext, JSON_DECODE_INT_AS_REAL, &je);
            if (strcmp(json_string_value(json_object_get(g, "name")), json_string_value(json_array_get(w, 0))) ||
                !ga || !json_equal(ga, wr)) {
                fprintf(stderr, "    %s: call %zu is %s %s, expected %s %s\n", c->name, i,
                        show(json_string_value(json_object_get(g, "name"))), show(args),
                        json_string_value(json_array_get(w, 0)), show(wtext));
                ok = 0;
            }
            free(wtext);
            json_decref(wr);
            json_decref(ga);
        }
        json_decref(want);
    }
    if (ok && c->args_text) {
        const char *args = json_string_value(json_object_get(json_object_get(json_array_get(got, 0), "function"), "arguments"));
        if (!args || strcmp(args, c->args_text)) {
            fprintf(stderr, "    %s: arguments\n      got  %s\n      want %s\n", c->name, show(args), show(c->args_text));
            ok = 0;
        }
    }
    return ok;
}

static void opts_for(const Case *c, GlmParseOptions *o, json_t **tools)
{
    json_error_t je;
    *tools = c->tools ? json_loads(c->tools, 0, &je) : NULL;
    memset(o, 0, sizeof *o);
    o->start = c->start;
    o->parse_tools = !c->no_tools;
    o->tools = *tools;
    o->id_seed = 1234;
}

/* ---- tests ---- */

TEST(glm_parse_scripted)
{
    int quiet = log_level;
    log_level = LOG_ERROR;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const Case *c = &CASES[i];
        GlmParseOptions o;
        json_t *tools;
        opts_for(c, &o, &tools);
        GlmParseResult r;
        glm_parse_text(c->text, strlen(c->text), &o, &r);
        int ok = 1;
        if (strcmp(r.reasoning, c->reasoning)) {
            fprintf(stderr, "    %s: reasoning \"%s\", expected \"%s\"\n", c->name, show(r.reasoning), show(c->reasoning));
            ok = 0;
        }
        if (strcmp(r.content, c->content)) {
            fprintf(stderr, "    %s: content \"%s\", expected \"%s\"\n", c->name, show(r.content), show(c->content));
            ok = 0;
        }
        if (!check_calls(c, r.tool_calls)) ok = 0;
        size_t k;
        json_t *tc;
        json_array_foreach(r.tool_calls, k, tc) { /* arguments are always a JSON object's text */
            json_error_t je;
            json_t *a = json_loads(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")),
                                   JSON_DECODE_INT_AS_REAL, &je);
            if (!json_is_object(a)) { fprintf(stderr, "    %s: call %zu arguments are not a JSON object\n", c->name, k); ok = 0; }
            json_decref(a);
        }
        if ((r.n_warnings > 0) != (c->warnings > 0)) {
            fprintf(stderr, "    %s: %d warnings, expected %s\n", c->name, r.n_warnings, c->warnings ? "some" : "none");
            ok = 0;
        }
        EXPECT(ok, "case %s", c->name);
        glm_parse_result_free(&r);
        json_decref(tools);
    }
    log_level = quiet;
}

TEST(glm_parse_streaming_matches_whole)
{
    int quiet = log_level;
    log_level = LOG_ERROR;
    const uint64_t seed = 20261202;
    fprintf(stderr, "    seed %llu\n", (unsigned long long)seed);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const Case *c = &CASES[i];
        GlmParseOptions o;
        json_t *tools;
        opts_for(c, &o, &tools);
        GlmParseResult r;
        glm_parse_text(c->text, strlen(c->text), &o, &r);
        EXPECT(streams_agree(c->name, c->text, &o, &r, seed + i, 40), "case %s", c->name);
        glm_parse_result_free(&r);
        json_decref(tools);
    }
    log_level = quiet;
}

/* known_only (as the server parses): a call of a function that is not among the tools is
 * malformed, whole and streamed; without it, string_typed_params returns one as vLLM does. */
TEST(glm_parse_known_only)
{
    int quiet = log_level;
    log_level = LOG_ERROR;
    json_error_t je;
    json_t *tools = json_loads(WEATHER_TOOLS, 0, &je);
    const char *text = "Sure.\n<tool_call>launch_rocket\n<arg_key>target</arg_key>\n<arg_value>moon</arg_value>\n</tool_call>\n"
                       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>";
    for (int known = 0; known < 2; known++) {
        GlmParseOptions o = { .start = GLM_PARSE_START_CONTENT, .parse_tools = 1, .tools = tools, .known_only = known, .id_seed = 5 };
        GlmParseResult r;
        glm_parse_text(text, strlen(text), &o, &r);
        const char *names[2] = { "launch_rocket", "get_weather" };
        size_t want_calls = known ? 1 : 2;
        const char *want_content = known ? "Sure.\n<tool_call>launch_rocket\n<arg_key>target</arg_key>\n<arg_value>moon</arg_value>\n"
                                           "</tool_call>" : "Sure.";
        EXPECT(strcmp(r.content, want_content) == 0, "known_only %d: content \"%s\"", known, show(r.content));
        EXPECT(json_array_size(r.tool_calls) == want_calls, "known_only %d: %zu calls", known, json_array_size(r.tool_calls));
        for (size_t i = 0; i < json_array_size(r.tool_calls) && i < want_calls; i++) {
            const char *name = json_string_value(json_object_get(json_object_get(json_array_get(r.tool_calls, i), "function"), "name"));
            EXPECT(name && strcmp(name, names[i + known]) == 0, "known_only %d: call %zu is %s", known, i, name ? name : "?");
        }
        EXPECT_EQ_INT(r.n_warnings, known);
        EXPECT(streams_agree(known ? "known_only" : "any function", text, &o, &r, 77, 20));
        glm_parse_result_free(&r);
    }
    /* with known_only and no tools, every call is unknown */
    GlmParseOptions o = { .start = GLM_PARSE_START_AFTER_THINK, .parse_tools = 1, .known_only = 1 };
    GlmParseResult r;
    const char *one = "<tool_call>f\n</tool_call>";
    glm_parse_text(one, strlen(one), &o, &r);
    EXPECT(strcmp(r.content, one) == 0 && json_array_size(r.tool_calls) == 0, "content \"%s\"", show(r.content));
    glm_parse_result_free(&r);
    json_decref(tools);
    log_level = quiet;
}

/* Markup split across pieces is held back, never leaked into content, and released as soon as
 * it is decided. */
TEST(glm_parse_holds_back_partial_markup)
{
    GlmParseOptions o = { .start = GLM_PARSE_START_CONTENT, .parse_tools = 1 };
    GlmParser p;
    GlmParseDelta d;
    glm_parse_init(&p, &o);
    glm_parse_feed(&p, "\n<thi", 5, &d);
    EXPECT(d.content_len == 0 && d.reasoning_len == 0, "content \"%s\"", show(d.content));
    glm_parse_feed(&p, "nk>Hmm", 6, &d);
    EXPECT(strcmp(d.reasoning, "Hmm") == 0 && d.content_len == 0, "reasoning \"%s\"", show(d.reasoning));
    glm_parse_feed(&p, ". </", 4, &d);
    EXPECT(strcmp(d.reasoning, ".") == 0, "reasoning \"%s\"", show(d.reasoning));
    glm_parse_feed(&p, "think>\nHello <tool", 18, &d);
    EXPECT(d.reasoning_len == 0 && strcmp(d.content, "Hello") == 0, "content \"%s\"", show(d.content));
    glm_parse_feed(&p, "s are < tools", 13, &d);
    EXPECT(strcmp(d.content, " <tools are < tools") == 0, "content \"%s\"", show(d.content));
    glm_parse_feed(&p, " \n<tool_", 8, &d);
    EXPECT(d.content_len == 0, "content \"%s\"", show(d.content));
    glm_parse_feed(&p, "call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n", 52, &d);
    EXPECT(d.content_len == 0 && !d.tool_calls, "content \"%s\"", show(d.content));
    glm_parse_feed(&p, "</tool_call>\n", 13, &d);
    ASSERT(d.tool_calls && json_array_size(d.tool_calls) == 1);
    EXPECT(d.content_len == 0);
    json_t *dj = glm_parse_delta_json(&d);
    json_t *tc = json_array_get(json_object_get(dj, "tool_calls"), 0), *f = json_object_get(tc, "function");
    EXPECT(json_integer_value(json_object_get(tc, "index")) == 0);
    EXPECT(strcmp(json_string_value(json_object_get(tc, "type")), "function") == 0);
    EXPECT(strncmp(json_string_value(json_object_get(tc, "id")), "call_", 5) == 0);
    EXPECT(strcmp(json_string_value(json_object_get(f, "name")), "f") == 0);
    EXPECT(strcmp(json_string_value(json_object_get(f, "arguments")), "{\"a\":1}") == 0);
    EXPECT(!json_object_get(dj, "content") && !json_object_get(dj, "reasoning_content"));
    json_decref(dj);
    glm_parse_finish(&p, &d);
    EXPECT(d.content_len == 0 && !d.tool_calls, "content \"%s\"", show(d.content));
    EXPECT(glm_parse_delta_json(&d) == NULL);
    EXPECT_EQ_INT(glm_parse_n_calls(&p), 1);
    glm_parse_free(&p);
}

/* Without tools, once past the place of a <think>, no tag can follow content: its whitespace is
 * sent at once, as a server without the parser sends it (plain chat streams keep their chunks). */
TEST(glm_parse_no_tools_sends_whitespace)
{
    for (int tools = 0; tools < 2; tools++) {
        GlmParseOptions o = { .start = GLM_PARSE_START_CONTENT, .parse_tools = tools };
        GlmParser p;
        GlmParseDelta d;
        glm_parse_init(&p, &o);
        glm_parse_feed(&p, "\n", 1, &d);
        EXPECT(d.content_len == 0, "tools %d: leading whitespace before a possible <think>: \"%s\"", tools, show(d.content));
        glm_parse_feed(&p, "Hi", 2, &d);
        EXPECT(strcmp(d.content, "\nHi") == 0, "tools %d: content \"%s\"", tools, show(d.content));
        glm_parse_feed(&p, " \n", 2, &d);
        EXPECT(strcmp(d.content, tools ? "" : " \n") == 0, "tools %d: content \"%s\"", tools, show(d.content));
        glm_parse_feed(&p, "there <tool_call>x", 18, &d);
        EXPECT(strcmp(d.content, tools ? " \nthere" : "there <tool_call>x") == 0, "tools %d: content \"%s\"", tools, show(d.content));
        glm_parse_finish(&p, &d);
        glm_parse_free(&p);
    }
}

/* A run of whitespace (WS_CHARS cycled, n bytes) for glm_parse_long_runs. */
static void put_ws(Sb *b, size_t n)
{
    static const char WS_CHARS[] = " \n\t \r\n";
    for (size_t i = 0; i < n; i++) sb_put(b, &WS_CHARS[i % (sizeof WS_CHARS - 1)], 1);
}

/* Long outputs that once made streaming quadratic keep their result: long whitespace runs next
 * to <think>, </think> and <tool_call> tags, next to partial tags and between words (held while
 * a tag may follow, and once scanned again on every feed), well-formed and malformed calls, and
 * many <tool_call>s nested in junk before one </tool_call> or none (each once searched the rest
 * of the output for its close). The whole-text parse must equal an answer built beside the
 * text, and streaming byte by byte and in seeded random chunkings must equal the whole. */
TEST(glm_parse_long_runs)
{
    int quiet = log_level;
    log_level = LOG_ERROR;
    const uint64_t seed = 20260611;
    fprintf(stderr, "    seed %llu\n", (unsigned long long)seed);
    Sb text = { 0 }, reasoning = { 0 }, content = { 0 };
    char num[32];
    /* leading and closing whitespace of the reasoning goes with its tags; inner runs stay */
    put_ws(&text, 5000);
    sb_put(&text, "<think>", 7);
    put_ws(&text, 3000);
    sb_put(&text, "r a", 3), sb_put(&reasoning, "r a", 3);
    put_ws(&text, 65536), put_ws(&reasoning, 65536);
    sb_put(&text, "b </thi ng <", 12), sb_put(&reasoning, "b </thi ng <", 12);
    put_ws(&text, 4000);
    sb_put(&text, "</think>", 8);
    put_ws(&text, 7000);
    json_t *want_calls = json_array();
    const int n_seg = 48;
    int n_warn = 0;
    for (int i = 0; i < n_seg; i++) {
        size_t w = 1 + (size_t)i * 977 % 4096, w2 = 1 + (size_t)i * 331 % 2048;
        int m = snprintf(num, sizeof num, "c%d", i);
        sb_put(&text, num, (size_t)m), sb_put(&content, num, (size_t)m);
        put_ws(&text, w), put_ws(&content, w);
        sb_put(&text, "d", 1), sb_put(&content, "d", 1);
        put_ws(&text, w); /* before a tag: dropped (A), restored with a malformed call (B), text (C) */
        if (i % 3 == 0) { /* A: a call; the whitespace after it separates content and stays */
            m = snprintf(num, sizeof num, "%d", i);
            sb_put(&text, "<tool_call>f", 12);
            put_ws(&text, w2);
            sb_put(&text, "<arg_key>k</arg_key>", 20);
            put_ws(&text, w2);
            sb_put(&text, "<arg_value>", 11), sb_put(&text, num, (size_t)m), sb_put(&text, "</arg_value>", 12);
            put_ws(&text, w2);
            sb_put(&text, "</tool_call>", 12);
            json_array_append_new(want_calls, json_pack("[s, {s:i}]", "f", "k", i));
        } else if (i % 3 == 1) { /* B: junk, then a call nested in it */
            put_ws(&content, w);
            sb_put(&text, "<tool_call>bad name", 19), sb_put(&content, "<tool_call>bad name", 19);
            put_ws(&text, w2);
            sb_put(&text, "<tool_call>g</tool_call>", 24);
            json_array_append_new(want_calls, json_pack("[s, {}]", "g"));
            n_warn++;
        } else { /* C: partial tags that turn out to be text */
            put_ws(&content, w);
            sb_put(&text, "x <tool_ca", 10), sb_put(&content, "x <tool_ca", 10);
            put_ws(&text, w2), put_ws(&content, w2);
            sb_put(&text, "</tool y", 8), sb_put(&content, "</tool y", 8);
        }
        put_ws(&text, w2), put_ws(&content, w2);
    }
    sb_put(&text, "end", 3), sb_put(&content, "end", 3);
    put_ws(&text, 9000), put_ws(&content, 9000); /* the end: trailing whitespace stays */

    GlmParseOptions o = { .start = GLM_PARSE_START_CONTENT, .parse_tools = 1, .id_seed = 1 };
    GlmParseResult r;
    glm_parse_text(text.p, text.n, &o, &r);
    EXPECT(strcmp(r.reasoning, sb_str(&reasoning)) == 0, "reasoning (%zu bytes, want %zu): \"%s\"", strlen(r.reasoning),
           reasoning.n, show(r.reasoning));
    EXPECT(strcmp(r.content, sb_str(&content)) == 0, "content (%zu bytes, want %zu): \"%s\"", strlen(r.content),
           content.n, show(r.content));
    EXPECT_EQ_INT(r.n_warnings, n_warn);
    EXPECT_EQ_INT(json_array_size(r.tool_calls), json_array_size(want_calls));
    size_t k;
    json_t *tc;
    json_array_foreach(r.tool_calls, k, tc) {
        json_t *f = json_object_get(tc, "function"), *want = json_array_get(want_calls, k);
        json_error_t je;
        json_t *args = json_loads(json_string_value(json_object_get(f, "arguments")), 0, &je);
        EXPECT(json_equal(json_object_get(f, "name"), json_array_get(want, 0)) && json_equal(args, json_array_get(want, 1)),
               "call %zu: %s %s", k, json_string_value(json_object_get(f, "name")),
               json_string_value(json_object_get(f, "arguments")));
        json_decref(args);
    }
    EXPECT(streams_agree_long("long_runs", text.p, text.n, &o, &r, seed, 4), "long whitespace runs");
    glm_parse_result_free(&r);
    json_decref(want_calls);

    /* <tool_call> nested in junk, with one </tool_call> at the end or none: all of it is content */
    for (int t = 0; t < 2; t++) {
        Sb junk = { 0 };
        for (int i = 0; i < 20000; i++) sb_put(&junk, "<tool_call>f x", 14);
        if (t == 0) sb_put(&junk, "</tool_call>", 12);
        o.start = GLM_PARSE_START_AFTER_THINK;
        glm_parse_text(junk.p, junk.n, &o, &r);
        EXPECT(strcmp(r.content, junk.p) == 0, "nested junk %d: content of %zu bytes, want %zu", t, strlen(r.content),
               junk.n);
        EXPECT_EQ_INT(r.n_warnings, 20000);
        EXPECT_EQ_INT(json_array_size(r.tool_calls), 0);
        EXPECT(streams_agree_long("nested_junk", junk.p, junk.n, &o, &r, seed + 1 + (uint64_t)t, 2), "nested junk %d", t);
        glm_parse_result_free(&r);
        free(junk.p);
    }
    free(text.p);
    free(reasoning.p);
    free(content.p);
    log_level = quiet;
}

/* Run fn in a child process killed by SIGALRM after secs seconds (a guard against a parse
 * that takes hours, not a timing): 1 when it ran to the end and its checks passed. */
static int run_guarded(void (*fn)(void), unsigned secs)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        alarm(secs);
        fn();
        _exit(test_failed_now() ? 1 : 0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return 0;
    if (WIFSIGNALED(st))
        fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (the guard)" : "");
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* text = unit repeated n times between head and tail */
static void put_repeated(Sb *b, const char *head, const char *unit, size_t n, const char *tail)
{
    sb_put(b, head, strlen(head));
    for (size_t i = 0; i < n; i++) sb_put(b, unit, strlen(unit));
    sb_put(b, tail, strlen(tail));
}

/* Blocks nested in malformed ones all end at one </tool_call>: the whole output is content, one
 * warning for each <tool_call>. */
static void nested_malformed(void)
{
    struct { const char *head, *unit; size_t n; size_t ws; const char *tail; } cases[] = {
        { "", "<tool_call>f<arg_key>", 100000, 0, "</tool_call>" },                 /* keys never closed */
        { "", "<tool_call>f<arg_key>", 20000, 1 << 20, "</arg_key></tool_call>" }, /* one blank key */
        { "", "<tool_call>f<arg_key>a</arg_key><arg_value>", 100000, 0, "</arg_value>x</tool_call>" },
        { "", "<tool_call>f<arg_key>a</arg_key>", 100000, 0, "<arg_value>1</tool_call>" }, /* keys without values */
        { "<tool_call>f", "<arg_key>", 1 << 20, 0, "</tool_call>" },
    };
    GlmParseOptions o = { .start = GLM_PARSE_START_AFTER_THINK, .parse_tools = 1, .id_seed = 1 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Sb text = { 0 };
        put_repeated(&text, cases[c].head, cases[c].unit, cases[c].n, "");
        put_ws(&text, cases[c].ws);
        sb_put(&text, cases[c].tail, strlen(cases[c].tail));
        GlmParseResult r;
        glm_parse_text(text.p, text.n, &o, &r);
        EXPECT(strcmp(r.content, text.p) == 0, "case %zu: content of %zu bytes, want %zu", c, strlen(r.content), text.n);
        EXPECT_EQ_INT(r.n_warnings, cases[c].head[0] ? 1 : (long long)cases[c].n);
        EXPECT_EQ_INT(json_array_size(r.tool_calls), 0);
        if (c == 0) EXPECT(streams_agree_long("nested_keys", text.p, text.n, &o, &r, 20260612, 2), "case 0 streamed");
        glm_parse_result_free(&r);
        free(text.p);
    }
}

/* One call with many arguments, each key given twice: first places, last values. */
static void many_arguments(void)
{
    const int n = 200000;
    Sb text = { 0 };
    char arg[96];
    sb_put(&text, "<tool_call>f", 12);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) sb_put(&text, arg, (size_t)snprintf(arg, sizeof arg,
                                           "<arg_key>k%d</arg_key><arg_value>%d</arg_value>", i, pass * n + i));
    sb_put(&text, "</tool_call>", 12);
    GlmParseOptions o = { .start = GLM_PARSE_START_AFTER_THINK, .parse_tools = 1, .id_seed = 1 };
    GlmParseResult r;
    glm_parse_text(text.p, text.n, &o, &r);
    EXPECT_EQ_INT(r.n_warnings, 0);
    ASSERT(json_array_size(r.tool_calls) == 1, "%zu calls", json_array_size(r.tool_calls));
    json_error_t je;
    const char *a = json_string_value(json_object_get(json_object_get(json_array_get(r.tool_calls, 0), "function"), "arguments"));
    json_t *args = json_loads(a ? a : "", JSON_PRESERVE_ORDER, &je);
    ASSERT(json_object_size(args) == (size_t)n, "%zu arguments", json_object_size(args));
    int i = 0, ok = 1;
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        snprintf(arg, sizeof arg, "k%d", i);
        if (strcmp(key, arg) || json_integer_value(v) != n + i) { ok = 0; break; }
        i++;
    }
    EXPECT(ok, "argument %d: %s = %lld", i, key, (long long)json_integer_value(v));
    json_decref(args);
    glm_parse_result_free(&r);
    free(text.p);
}

/* Hostile tool-call blocks that were quadratic (a second or more for each 100 KB; these take
 * minutes without the fix): <tool_call>s nested in keys or values of a malformed block, each
 * walking the rest of it again, and a call with many (repeated) arguments. */
TEST(glm_parse_nested_arguments)
{
    int quiet = log_level;
    log_level = LOG_ERROR;
    EXPECT(run_guarded(nested_malformed, 60), "nested malformed blocks");
    EXPECT(run_guarded(many_arguments, 60), "many arguments");
    log_level = quiet;
}

TEST(glm_parse_start_of_prompt)
{
    EXPECT(glm_parse_start_of("[gMASK]<sop><|user|>\nhi<|assistant|>") == GLM_PARSE_START_CONTENT);
    EXPECT(glm_parse_start_of("<|user|>hi<|assistant|><think>") == GLM_PARSE_START_REASONING);
    EXPECT(glm_parse_start_of("<|user|>hi<|assistant|></think>") == GLM_PARSE_START_AFTER_THINK);
    EXPECT(glm_parse_start_of("<|user|>\nhi/nothink<|assistant|>\n<think></think>") == GLM_PARSE_START_AFTER_THINK);
    EXPECT(glm_parse_start_of("<|assistant|>\n<think></think>\n") == GLM_PARSE_START_AFTER_THINK);
    EXPECT(glm_parse_start_of("<|assistant|>\n") == GLM_PARSE_START_CONTENT);
    EXPECT(glm_parse_start_of("") == GLM_PARSE_START_CONTENT);
}

TEST(glm_parse_ids)
{
    const char *text = "<tool_call>a</tool_call><tool_call>b</tool_call><tool_call>c</tool_call>";
    GlmParseOptions o = { .start = GLM_PARSE_START_AFTER_THINK, .parse_tools = 1, .id_seed = 7 };
    GlmParseResult r1, r2, r3;
    glm_parse_text(text, strlen(text), &o, &r1);
    glm_parse_text(text, strlen(text), &o, &r2);
    o.id_seed = 8;
    glm_parse_text(text, strlen(text), &o, &r3);
    ASSERT(json_array_size(r1.tool_calls) == 3);
    for (size_t i = 0; i < 3; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(r1.tool_calls, i), "id"));
        EXPECT(id && strlen(id) == 29 && strncmp(id, "call_", 5) == 0 && strspn(id + 5, "0123456789abcdef") == 24, "id %s", id);
        EXPECT(strcmp(id, json_string_value(json_object_get(json_array_get(r2.tool_calls, i), "id"))) == 0);
        EXPECT(strcmp(id, json_string_value(json_object_get(json_array_get(r3.tool_calls, i), "id"))) != 0);
        for (size_t j = 0; j < i; j++)
            EXPECT(strcmp(id, json_string_value(json_object_get(json_array_get(r1.tool_calls, j), "id"))) != 0);
    }
    json_t *m = glm_parse_message_json(&r1);
    EXPECT(json_is_null(json_object_get(m, "content")));
    EXPECT(json_array_size(json_object_get(m, "tool_calls")) == 3);
    EXPECT(!json_object_get(m, "reasoning_content"));
    json_decref(m);
    glm_parse_result_free(&r1);
    glm_parse_result_free(&r2);
    glm_parse_result_free(&r3);
}

/* Random text without markup passes through as content unchanged (and, begun inside the
 * reasoning, as reasoning less its leading whitespace), streamed or whole. */
TEST(glm_parse_plain_text_property)
{
    static const char *const frags[] = { "a", "b", " ", "\n", "\t", "<", "/", ">", "think", "tool_call", "<t", "</",
                                         "<th", "arg_key", "é", "中", "😀", "</tool_call>", "<arg_value>", "\\n", "x y" };
    const int nf = (int)(sizeof frags / sizeof frags[0]);
    const uint64_t seed = 777;
    fprintf(stderr, "    seed %llu\n", (unsigned long long)seed);
    Rng r;
    rng_seed(&r, seed);
    int done = 0;
    for (int iter = 0; iter < 400; iter++) {
        char text[512];
        size_t n = 0;
        int len = (int)(rng_u64(&r) % 40);
        for (int i = 0; i < len; i++) {
            const char *f = frags[rng_u64(&r) % nf];
            size_t k = strlen(f);
            if (n + k >= sizeof text) break;
            memcpy(text + n, f, k);
            n += k;
        }
        text[n] = 0;
        int reasoning = iter & 1, tools = !((iter >> 1) & 1);
        if (strstr(text, reasoning ? "</think>" : "<think>") || (!reasoning && tools && strstr(text, "<tool_call>"))) continue;
        GlmParseOptions o = { .start = reasoning ? GLM_PARSE_START_REASONING : GLM_PARSE_START_CONTENT,
                              .parse_tools = tools, .id_seed = 1 };
        GlmParseResult w;
        glm_parse_text(text, n, &o, &w);
        const char *want = text;
        if (reasoning) while (*want == ' ' || *want == '\n' || *want == '\t') want++;
        const char *got = reasoning ? w.reasoning : w.content, *other = reasoning ? w.content : w.reasoning;
        if (strcmp(got, want) || *other || json_array_size(w.tool_calls) || w.n_warnings) {
            fprintf(stderr, "    iteration %d (%s): \"%s\" came back as \"%s\" / \"%s\"\n", iter,
                    reasoning ? "reasoning" : "content", show(text), show(got), show(other));
            EXPECT(0, "plain text changed");
            glm_parse_result_free(&w);
            break;
        }
        char label[64];
        snprintf(label, sizeof label, "plain text iteration %d", iter);
        int ok = streams_agree(label, text, &o, &w, seed + (uint64_t)iter, 8);
        glm_parse_result_free(&w);
        if (!ok) { EXPECT(0, "iteration %d", iter); break; }
        done++;
    }
    EXPECT(done > 100, "only %d texts tried", done);
}

/* Random calls (random names, argument values of every type, strings with whitespace, '<',
 * quotes and unicode; string parameters declared in the tools) written in GLM-4.6 and GLM-4.7
 * markup with random text around them parse back to the same calls, whole and streamed. */
TEST(glm_parse_random_calls_property)
{
    static const char *const strs[] = { "Paris", " two  words ", "line\nbreak", "<b>", "a < b", "\"q\"", "back\\slash",
                                        "北京", "😀 emoji", "", "123", "true", "null", "[1]", "{\"x\": 1}", "\\n" };
    static const char *const jsons[] = { "0", "-17", "3.25", "1e10", "true", "false", "null", "[]", "{}",
                                         "[1, \"two\", null]", "{\"k\": {\"n\": [true]}}" };
    const uint64_t seed = 4242;
    fprintf(stderr, "    seed %llu\n", (unsigned long long)seed);
    Rng r;
    rng_seed(&r, seed);
    for (int iter = 0; iter < 150; iter++) {
        int v47 = iter & 1, n_calls = (int)(rng_u64(&r) % 3);
        Sb text = { 0 };
        json_t *tools = json_array(), *want = json_array();
        const char *reasoning = (rng_u64(&r) & 1) ? "Reasoning about < it." : "";
        const char *before = (rng_u64(&r) & 1) ? "Let me look." : "", *after = (rng_u64(&r) % 4 == 0) ? "Then done." : "";
        if (v47) { sb_put(&text, reasoning, strlen(reasoning)); sb_put(&text, "</think>", 8); }
        else { sb_put(&text, "\n<think>", 8); sb_put(&text, reasoning, strlen(reasoning)); sb_put(&text, "</think>\n", 9); }
        sb_put(&text, before, strlen(before));
        for (int c = 0; c < n_calls; c++) {
            char name[32];
            snprintf(name, sizeof name, "tool_%d_%d", c, (int)(rng_u64(&r) % 5)); /* one schema per name */
            json_t *props = json_object(), *args = json_object();
            sb_put(&text, v47 || (c == 0 && !*before) ? "<tool_call>" : "\n<tool_call>", v47 || (c == 0 && !*before) ? 11 : 12);
            sb_put(&text, name, strlen(name));
            if (!v47) sb_put(&text, "\n", 1);
            int n_args = (int)(rng_u64(&r) % 4);
            for (int a = 0; a < n_args; a++) {
                char key[16];
                snprintf(key, sizeof key, "k%d", a);
                const char *val;
                if (rng_u64(&r) & 1) {
                    val = strs[rng_u64(&r) % (sizeof strs / sizeof strs[0])];
                    json_object_set_new(props, key, json_pack("{s:s}", "type", "string"));
                    json_object_set_new(args, key, json_string(val));
                } else {
                    val = jsons[rng_u64(&r) % (sizeof jsons / sizeof jsons[0])];
                    json_error_t je;
                    json_object_set_new(args, key, json_loads(val, JSON_DECODE_ANY, &je));
                }
                sb_put(&text, "<arg_key>", 9);
                sb_put(&text, key, strlen(key));
                sb_put(&text, v47 ? "</arg_key><arg_value>" : "</arg_key>\n<arg_value>", v47 ? 21 : 22);
                sb_put(&text, val, strlen(val));
                sb_put(&text, v47 ? "</arg_value>" : "</arg_value>\n", v47 ? 12 : 13);
            }
            sb_put(&text, "</tool_call>", 12);
            json_array_append_new(tools, json_pack("{s:s, s:{s:s, s:{s:o}}}", "type", "function", "function", "name", name,
                                                   "parameters", "properties", props));
            json_array_append_new(want, json_pack("{s:s, s:o}", "name", name, "arguments", args));
        }
        if (*after) { sb_put(&text, "\n", 1); sb_put(&text, after, strlen(after)); }

        GlmParseOptions o = { .start = v47 ? GLM_PARSE_START_REASONING : GLM_PARSE_START_CONTENT, .parse_tools = 1,
                              .tools = tools, .id_seed = (uint64_t)iter };
        GlmParseResult w;
        glm_parse_text(sb_str(&text), text.n, &o, &w);
        Sb content = { 0 };
        sb_put(&content, before, strlen(before));
        if (*after) {
            if (*before) sb_put(&content, "\n", 1);
            sb_put(&content, after, strlen(after));
        }
        int ok = strcmp(w.reasoning, reasoning) == 0 && strcmp(w.content, sb_str(&content)) == 0 &&
                 json_array_size(w.tool_calls) == json_array_size(want) && !w.n_warnings;
        for (size_t c = 0; ok && c < json_array_size(want); c++) {
            json_t *f = json_object_get(json_array_get(w.tool_calls, c), "function"), *wc = json_array_get(want, c);
            json_error_t je;
            json_t *ga = json_loads(json_string_value(json_object_get(f, "arguments")), 0, &je);
            ok = ga && json_equal(ga, json_object_get(wc, "arguments")) &&
                 strcmp(json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(wc, "name"))) == 0;
            json_decref(ga);
        }
        if (!ok) {
            char *g = json_dumps(w.tool_calls, JSON_COMPACT), *x = json_dumps(want, JSON_COMPACT);
            fprintf(stderr, "    iteration %d: text \"%s\"\n      got reasoning \"%s\" content \"%s\" calls %s\n"
                    "      want content \"%s\" calls %s\n", iter, show(sb_str(&text)), show(w.reasoning),
                    show(w.content), show(g), show(sb_str(&content)), show(x));
            free(g);
            free(x);
        } else {
            char label[64];
            snprintf(label, sizeof label, "random calls iteration %d", iter);
            ok = streams_agree(label, sb_str(&text), &o, &w, seed + (uint64_t)iter, 6);
        }
        glm_parse_result_free(&w);
        json_decref(tools);
        json_decref(want);
        free(text.p);
        free(content.p);
        if (!ok) { EXPECT(0, "iteration %d of seed %llu", iter, (unsigned long long)seed); break; }
    }
}

/* ---- round trip through the real chat templates ---- */

static const char RT_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather for a city\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\"}, \"units\": {\"type\": \"string\", \"enum\": [\"metric\", \"imperial\"]},"
    " \"detailed\": {\"type\": \"boolean\"}, \"zip\": {\"type\": \"string\"}, \"note\": {\"type\": \"string\"},"
    " \"coords\": {\"type\": \"object\"}, \"tags\": {\"type\": \"array\"}, \"extra\": {}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {}}}}]";

/* The assistant turn; reasoning NULL for none. */
static json_t *rt_assistant(const char *reasoning)
{
    json_error_t je;
    json_t *m = json_loads(
        "{\"role\": \"assistant\", \"content\": \"Let me check both cities.\", \"tool_calls\": ["
        "{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\", \"days\": 3, \"units\": \"metric\", \"detailed\": true, \"zip\": \"75001\","
        " \"note\": \"say \\\"hi\\\"\\nthen <b>bye</b>\", \"coords\": {\"lat\": 48.85, \"lon\": 2.35},"
        " \"tags\": [\"a\", 1, null], \"extra\": null}}},"
        "{\"id\": \"call_2\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"北京 🌆\", \"days\": -1}}},"
        "{\"id\": \"call_3\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", \"arguments\": {}}}]}",
        JSON_PRESERVE_ORDER, &je);
    if (reasoning) json_object_set_new(m, "reasoning_content", json_string(reasoning));
    return m;
}

/* Render the conversation up to the assistant turn (with the generation prompt) and with it;
 * the difference is what the model would have written. Parse it and compare; then render the
 * parsed message back (arguments turned into objects, as the server must) followed by a tool
 * result and check the next prompt is the same as from the original message. */
static void round_trip(const char *label, ChatTemplate *t, int thinking)
{
    json_error_t je;
    json_t *tools = json_loads(RT_TOOLS, JSON_PRESERVE_ORDER, &je);
    json_t *kw = thinking ? NULL : json_pack("{s:b}", "enable_thinking", 0);
    json_t *head = json_loads("[{\"role\": \"system\", \"content\": \"You are helpful.\"},"
                              " {\"role\": \"user\", \"content\": \"Weather in Paris and 北京?\"}]", 0, &je);
    const char *reasoning = thinking ? "Two cities, so two calls; then the time." : NULL;
    json_t *full_msgs = json_copy(head);
    json_array_append_new(full_msgs, rt_assistant(reasoning));
    char err[512] = "", *prompt = NULL, *full = NULL;
    int rc = chat_template_render(t, head, tools, 1, kw, NULL, NULL, &prompt, err, sizeof err);
    EXPECT(rc == 0, "%s: %s", label, err);
    rc |= chat_template_render(t, full_msgs, tools, 0, kw, NULL, NULL, &full, err, sizeof err);
    EXPECT(rc == 0, "%s: %s", label, err);
    if (rc == 0 && strncmp(full, prompt, strlen(prompt)) != 0) {
        fprintf(stderr, "    %s: the prompt is not a prefix of the rendered turn:\n      %s\n      %s\n", label,
                show(prompt + (strlen(prompt) > 200 ? strlen(prompt) - 200 : 0)), show(full + (strlen(prompt) > 200 ? strlen(prompt) - 200 : 0)));
        EXPECT(0, "%s", label);
        rc = -1;
    }
    if (rc == 0) {
        const char *out = full + strlen(prompt);
        GlmParseOptions o = { .start = glm_parse_start_of(prompt), .parse_tools = 1, .tools = tools, .id_seed = 99 };
        GlmParseResult w;
        glm_parse_text(out, strlen(out), &o, &w);
        json_t *orig = json_array_get(full_msgs, 2), *oc = json_object_get(orig, "tool_calls");
        EXPECT(strcmp(w.reasoning, thinking ? reasoning : "") == 0, "%s: reasoning \"%s\"", label, show(w.reasoning));
        EXPECT(strcmp(w.content, "Let me check both cities.") == 0, "%s: content \"%s\"", label, show(w.content));
        EXPECT(w.n_warnings == 0, "%s", label);
        EXPECT(json_array_size(w.tool_calls) == json_array_size(oc), "%s: %zu calls", label, json_array_size(w.tool_calls));
        for (size_t i = 0; i < json_array_size(oc) && i < json_array_size(w.tool_calls); i++) {
            json_t *gf = json_object_get(json_array_get(w.tool_calls, i), "function");
            json_t *of = json_object_get(json_array_get(oc, i), "function");
            json_t *ga = json_loads(json_string_value(json_object_get(gf, "arguments")), JSON_PRESERVE_ORDER, &je);
            EXPECT(json_equal(json_object_get(gf, "name"), json_object_get(of, "name")), "%s: call %zu name", label, i);
            EXPECT(ga && json_equal(ga, json_object_get(of, "arguments")), "%s: call %zu arguments %s", label, i,
                   show(json_string_value(json_object_get(gf, "arguments"))));
            json_decref(ga);
        }
        EXPECT(streams_agree(label, out, &o, &w, 5, 20), "%s", label);

        /* next turn: the parsed message (as the server returns it and the client sends it back) */
        json_t *msg = glm_parse_message_json(&w), *tc;
        size_t i;
        json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
            json_t *f = json_object_get(tc, "function");
            json_object_set_new(f, "arguments", json_loads(json_string_value(json_object_get(f, "arguments")), JSON_PRESERVE_ORDER, &je));
        }
        json_t *next_a = json_copy(full_msgs), *next_b = json_copy(head);
        json_array_append_new(next_b, msg);
        json_t *tool_msgs = json_loads("[{\"role\": \"tool\", \"tool_call_id\": \"x\", \"content\": \"{\\\"temp\\\": 21}\"},"
                                       " {\"role\": \"tool\", \"tool_call_id\": \"y\", \"content\": \"sunny\"},"
                                       " {\"role\": \"tool\", \"tool_call_id\": \"z\", \"content\": \"12:00\"}]", 0, &je);
        json_array_extend(next_a, tool_msgs);
        json_array_extend(next_b, tool_msgs);
        char *pa = NULL, *pb = NULL;
        int ra = chat_template_render(t, next_a, tools, 1, kw, NULL, NULL, &pa, err, sizeof err);
        int rb = chat_template_render(t, next_b, tools, 1, kw, NULL, NULL, &pb, err, sizeof err);
        EXPECT(ra == 0 && rb == 0, "%s: %s", label, err);
        if (ra == 0 && rb == 0 && strcmp(pa, pb)) {
            size_t k = 0;
            while (pa[k] == pb[k]) k++;
            fprintf(stderr, "    %s: next prompt differs at %zu: \"%s\" vs \"%s\"\n", label, k, show(pa + k), show(pb + k));
            EXPECT(0, "%s: next turn", label);
        }
        EXPECT(!pa || strstr(pa, "12:00"), "%s: the tool result is in the next prompt", label);
        free(pa);
        free(pb);
        json_decref(tool_msgs);
        json_decref(next_a);
        json_decref(next_b);
        glm_parse_result_free(&w);
    }
    free(prompt);
    free(full);
    json_decref(full_msgs);
    json_decref(head);
    json_decref(kw);
    json_decref(tools);
}

/* The template tests/data/chat/<name>.jinja (GLM-4.6's, GLM-4.7-Flash's, the built-in one). */
static ChatTemplate *rt_template(const char *name)
{
    char rel[64], err[512] = "";
    snprintf(rel, sizeof rel, "chat/%s.jinja", name);
    size_t len;
    char *text = file_read_all(test_data(rel), &len);
    if (!text) snprintf(err, sizeof err, "cannot read it");
    ChatTemplate *t = text ? chat_template_parse(text, err, sizeof err) : NULL;
    free(text);
    if (!t) test_fail(__FILE__, __LINE__, "%s: %s", test_data(rel), err);
    return t;
}

TEST(glm_parse_roundtrip_glm46)
{
    ChatTemplate *t = rt_template("glm46");
    ASSERT(t);
    round_trip("glm46 thinking", t, 1);
    round_trip("glm46 no thinking", t, 0);
    chat_template_free(t);
}

TEST(glm_parse_roundtrip_glm47)
{
    ChatTemplate *t = rt_template("glm47");
    ASSERT(t);
    round_trip("glm47 thinking", t, 1);
    round_trip("glm47 no thinking", t, 0);
    chat_template_free(t);
}

TEST(glm_parse_roundtrip_builtin)
{
    ChatTemplate *t = rt_template("builtin");
    ASSERT(t);
    round_trip("builtin thinking", t, 1);
    chat_template_free(t);
}
