/* glm_parse: GLM output text -> reasoning_content, content, tool_calls (glm_parse.h). One
 * streaming state machine serves both entry points: glm_parse_text feeds the whole output
 * once, so streamed deltas concatenate to the whole-text result by construction, whatever the
 * chunking. Text that could still turn out to be markup (a tag prefix at the end of a piece,
 * the whitespace before a possible tag, an open <tool_call> block) is held back until decided;
 * a tool call is emitted whole when its </tool_call> arrives, as vLLM's GLM parser does.
 * Tests: tests/unit/test_glm_parse.c (make test FILTER=glm_parse). */
#include "glm_parse.h"

#include <stdio.h>
#include <string.h>

#include "../base/util.h"

/* ---- types ---- */

enum { GLM_ST_CONTENT, GLM_ST_REASONING, GLM_ST_CALL };

/* The tags. Whitespace next to a tag belongs to the markup, not to the text: it is dropped
 * after <think>, </think> and the START_REASONING / START_AFTER_THINK states, before <think>,
 * </think> and <tool_call>, and after </tool_call> unless it separates content before the call
 * from content after it. Markup-free output passes through unchanged. */
#define S_LEN(s) (sizeof(s) - 1)
static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>";
static const char CALL_CLOSE[] = "</tool_call>";
static const char KEY_OPEN[] = "<arg_key>";
static const char KEY_CLOSE[] = "</arg_key>";
static const char VALUE_OPEN[] = "<arg_value>";
static const char VALUE_CLOSE[] = "</arg_value>";

enum { TAG_NONE, TAG_THINK_OPEN, TAG_THINK_CLOSE, TAG_CALL_OPEN };

/* One argument of a call being parsed: pointers into the block. */
typedef struct {
    const char *key; size_t key_len;
    const char *val; size_t val_len;
    int is_json;     /* val is a JSON number/bool/null/object/array text, not a string */
} GlmArg;

/* ---- helpers ---- */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void buf_put(GlmParseBuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void buf_putc(GlmParseBuf *b, char c) { buf_put(b, &c, 1); }

static void buf_clear(GlmParseBuf *b)
{
    b->n = 0;
    if (b->cap) b->p[0] = 0;
}

static void buf_free(GlmParseBuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Length of the well-formed UTF-8 character at s (RFC 3629: no overlongs, no surrogates,
 * nothing past U+10FFFF), or 0 when the bytes there are not one. */
static size_t utf8_char_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

/* Append s as UTF-8, each byte that does not start a well-formed character replaced by U+FFFD;
 * json_escape also escapes it for the inside of a JSON string. */
static void put_text(GlmParseBuf *b, const char *s, size_t n, int json_escape)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len(u + i, n - i);
        if (k == 0) { buf_put(b, "\xef\xbf\xbd", 3); i++; continue; }
        unsigned char c = u[i];
        if (json_escape && (c < 0x20 || c == '"' || c == '\\')) {
            char e[8];
            switch (c) {
            case '"': buf_put(b, "\\\"", 2); break;
            case '\\': buf_put(b, "\\\\", 2); break;
            case '\n': buf_put(b, "\\n", 2); break;
            case '\r': buf_put(b, "\\r", 2); break;
            case '\t': buf_put(b, "\\t", 2); break;
            case '\b': buf_put(b, "\\b", 2); break;
            case '\f': buf_put(b, "\\f", 2); break;
            default: snprintf(e, sizeof e, "\\u%04x", c); buf_put(b, e, 6); break;
            }
        } else {
            buf_put(b, s + i, k);
        }
        i += k;
    }
}

/* A JSON string of s, invalid UTF-8 replaced rather than refused. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    GlmParseBuf b = { 0 };
    put_text(&b, s, n, 0);
    j = json_stringn(b.p ? b.p : "", b.n);
    buf_free(&b);
    return j;
}

static int starts_with(const char *s, const char *end, const char *tag, size_t len)
{
    return (size_t)(end - s) >= len && memcmp(s, tag, len) == 0;
}

/* Whitespace between tags, including the two-character "\n" some GLM outputs write (vLLM and
 * SGLang accept it there too). */
static const char *skip_sep(const char *s, const char *end)
{
    for (;;) {
        if (s < end && is_ws(*s)) s++;
        else if (end - s >= 2 && s[0] == '\\' && s[1] == 'n') s += 2;
        else return s;
    }
}

static void trim(const char **s, size_t *n)
{
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* splitmix64's finaliser: the tool call ids. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A short printable excerpt of s for a log line. */
static void excerpt(char *out, size_t cap, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) out[k++] = (unsigned char)s[i] < 0x20 ? ' ' : s[i];
    if (n > 0 && k + 4 >= cap) { out[k++] = '.'; out[k++] = '.'; out[k++] = '.'; }
    out[k] = 0;
}

/* ---- tool schemas ---- */

/* The JSON schema says the value is a string: "type": "string", a type list of "string" and
 * "null", anyOf/oneOf of such, or an enum of strings. vLLM checks "type" == "string" only. */
static int schema_is_string(json_t *sch)
{
    if (!json_is_object(sch)) return 0;
    json_t *t = json_object_get(sch, "type");
    if (json_is_string(t)) return strcmp(json_string_value(t), "string") == 0;
    if (json_is_array(t)) {
        size_t i;
        json_t *x;
        int str = 0;
        json_array_foreach(t, i, x) {
            if (!json_is_string(x)) return 0;
            if (strcmp(json_string_value(x), "string") == 0) str = 1;
            else if (strcmp(json_string_value(x), "null") != 0) return 0;
        }
        return str;
    }
    static const char *const alts[] = { "anyOf", "oneOf" };
    for (int a = 0; a < 2; a++) {
        json_t *arr = json_object_get(sch, alts[a]);
        if (!json_is_array(arr) || json_array_size(arr) == 0) continue;
        size_t i;
        json_t *x;
        int str = 0;
        json_array_foreach(arr, i, x) {
            json_t *xt = json_object_get(x, "type");
            if (schema_is_string(x)) str = 1;
            else if (!(json_is_string(xt) && strcmp(json_string_value(xt), "null") == 0)) return 0;
        }
        return str;
    }
    json_t *en = json_object_get(sch, "enum");
    if (json_is_array(en) && json_array_size(en) > 0) {
        size_t i;
        json_t *x;
        json_array_foreach(en, i, x) if (!json_is_string(x)) return 0;
        return 1;
    }
    return 0;
}

/* The named function among the request's tools (entries either {"type": "function",
 * "function": {...}} or the bare function), or NULL. */
static json_t *tool_function(json_t *tools, const char *name, size_t name_len)
{
    if (!json_is_array(tools)) return NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) f = t;
        json_t *nm = json_object_get(f, "name");
        if (json_is_string(nm) && json_string_length(nm) == name_len && memcmp(json_string_value(nm), name, name_len) == 0)
            return f;
    }
    return NULL;
}

/* The "properties" of the named function's parameters, or NULL. */
static json_t *tool_properties(json_t *tools, const char *name, size_t name_len)
{
    json_t *props = json_object_get(json_object_get(tool_function(tools, name, name_len), "parameters"), "properties");
    return json_is_object(props) ? props : NULL;
}

static int param_is_string(json_t *props, const char *key, size_t key_len)
{
    if (!props) return 0;
    char k[256];
    if (key_len >= sizeof k) return 0;
    memcpy(k, key, key_len);
    k[key_len] = 0;
    return schema_is_string(json_object_get(props, k));
}

/* ---- the arguments of a block ----
 * The <tool_call>s nested in a malformed block all end at its </tool_call> and walk the same
 * bytes: the tag indexes find each closing tag once per block end, and the arguments after an
 * </arg_value> (whose reason to fail depends on nothing before it) are walked once. */

static void tag_index_reset(GlmTagIndex *x)
{
    x->lo = x->hi = SIZE_MAX;
    x->n = 0;
}

static void tag_index_free(GlmTagIndex *x)
{
    free(x->at);
    free(x->why);
    memset(x, 0, sizeof *x);
}

static void tag_index_add(GlmTagIndex *x, size_t at)
{
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 64;
        x->at = xrealloc(x->at, x->cap * sizeof *x->at);
        x->why = xrealloc(x->why, x->cap * sizeof *x->why);
    }
    x->at[x->n] = at;
    x->why[x->n++] = NULL;
}

/* The first tag (len bytes) at or after pend offset q that ends by offset end, as memmem would
 * find it, with its index in x in *idx; SIZE_MAX when none. */
static size_t tag_index_find(GlmTagIndex *x, const char *pend, size_t end, const char *tag, size_t len, size_t q,
                             size_t *idx)
{
    if (q < x->lo) x->lo = x->hi = q, x->n = 0; /* not covered: start over from q */
    size_t a = 0, b = x->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (x->at[m] < q) a = m + 1;
        else b = m;
    }
    if (a < x->n) return *idx = a, x->at[a];
    while (x->hi < end) {
        const char *f = end - x->hi >= len ? memmem(pend + x->hi, end - x->hi, tag, len) : NULL;
        if (!f) { x->hi = end; break; }
        tag_index_add(x, (size_t)(f - pend));
        x->hi = (size_t)(f - pend) + 1;
        if (x->at[x->n - 1] >= q) return *idx = x->n - 1, x->at[x->n - 1];
    }
    return SIZE_MAX;
}

/* One <arg_key>K</arg_key> sep <arg_value>V</arg_value> at b (its <arg_key> checked): *a gets
 * its key (trimmed) and raw value, *vi the index of its </arg_value>; or the reason it is
 * malformed. */
static const char *parse_arg(GlmParser *p, const char *b, const char *end, GlmArg *a, size_t *vi)
{
    const char *pend = p->pend.p;
    size_t e = (size_t)(end - pend), i;
    b += S_LEN(KEY_OPEN);
    size_t k = tag_index_find(&p->key_close, pend, e, KEY_CLOSE, S_LEN(KEY_CLOSE), (size_t)(b - pend), &i);
    if (k == SIZE_MAX) return "unterminated <arg_key>";
    const char *ke = pend + k;
    /* '<' looked for before trimming: keys nested in one another share their </arg_key> (and
     * the whitespace before it), and all but the last hold a '<' */
    if (memchr(b, '<', (size_t)(ke - b))) return "bad argument name";
    *a = (GlmArg){ .key = b, .key_len = (size_t)(ke - b) };
    trim(&a->key, &a->key_len);
    if (a->key_len == 0) return "bad argument name";
    b = skip_sep(ke + S_LEN(KEY_CLOSE), end);
    if (!starts_with(b, end, VALUE_OPEN, S_LEN(VALUE_OPEN))) return "<arg_key> without <arg_value>";
    b += S_LEN(VALUE_OPEN);
    size_t v = tag_index_find(&p->value_close, pend, e, VALUE_CLOSE, S_LEN(VALUE_CLOSE), (size_t)(b - pend), vi);
    if (v == SIZE_MAX) return "unterminated <arg_value>";
    a->val = b;
    a->val_len = (size_t)(pend + v - b);
    return NULL;
}

/* Walk the arguments from b to end into *args (every occurrence, in order), or return the
 * reason they are malformed. */
static const char *parse_args(GlmParser *p, const char *b, const char *end, GlmArg **args, size_t *n_args)
{
    size_t e = (size_t)(end - p->pend.p), cap = 0, n = 0;
    if (e != p->memo_end) {
        tag_index_reset(&p->key_close);
        tag_index_reset(&p->value_close);
        p->memo_end = e;
    }
    size_t *closes = NULL; /* [n] each argument's </arg_value> in value_close */
    const char *why = NULL;
    while (b < end) {
        if (!starts_with(b, end, KEY_OPEN, S_LEN(KEY_OPEN))) {
            why = n ? "text between arguments" : "text after the function name";
            break;
        }
        GlmArg a;
        size_t vi;
        if ((why = parse_arg(p, b, end, &a, &vi))) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            *args = xrealloc(*args, cap * sizeof **args);
            closes = xrealloc(closes, cap * sizeof *closes);
        }
        (*args)[n] = a;
        closes[n++] = vi;
        if ((why = p->value_close.why[vi])) break; /* walked before, from an outer <tool_call> */
        b = skip_sep(a.val + a.val_len + S_LEN(VALUE_CLOSE), end);
    }
    for (size_t i = 0; why && i < n; i++) p->value_close.why[closes[i]] = why;
    free(closes);
    *n_args = n;
    return why;
}

static int key_eq(const GlmArg *a, const GlmArg *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/* By key, then by place. */
static int arg_cmp(const void *x, const void *y)
{
    const GlmArg *a = *(GlmArg *const *)x, *b = *(GlmArg *const *)y;
    int c = memcmp(a->key, b->key, a->key_len < b->key_len ? a->key_len : b->key_len);
    if (c) return c;
    if (a->key_len != b->key_len) return a->key_len < b->key_len ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* A repeated key keeps its first place and takes its last value (as a dict does); sorted by key
 * so that many arguments stay n log n. Returns how many are left in args. */
static size_t args_dedup(GlmArg *args, size_t n)
{
    GlmArg **by_key = xmalloc((n ? n : 1) * sizeof *by_key);
    for (size_t i = 0; i < n; i++) by_key[i] = &args[i];
    qsort(by_key, n, sizeof *by_key, arg_cmp);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && key_eq(by_key[i], by_key[j]); j++) by_key[j]->key = NULL; /* dropped */
        by_key[i]->val = by_key[j - 1]->val;
        by_key[i]->val_len = by_key[j - 1]->val_len;
    }
    free(by_key);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (args[i].key) args[m++] = args[i];
    return m;
}

/* ---- core ---- */

/* Parse one whole <tool_call>...</tool_call> block into *call_out (non-streaming shape), or
 * return the reason it is malformed. */
static const char *parse_block(GlmParser *p, const char *s, size_t n, json_t **call_out)
{
    const char *b = s + S_LEN(CALL_OPEN), *end = s + n - S_LEN(CALL_CLOSE);
    b = skip_sep(b, end);
    const char *name = b;
    while (b < end && !is_ws(*b) && *b != '<' && *b != '>' && !(end - b >= 2 && b[0] == '\\' && b[1] == 'n')) b++;
    size_t name_len = (size_t)(b - name);
    if (name_len == 0) return "no function name";
    if (p->opt.known_only && !tool_function(p->opt.tools, name, name_len)) return "a function that is not among the tools";
    json_t *jname = json_stringn(name, name_len);
    if (!jname) return "function name is not UTF-8";

    GlmArg *args = NULL;
    size_t n_args = 0;
    const char *why = parse_args(p, skip_sep(b, end), end, &args, &n_args);
    if (why) {
        free(args);
        json_decref(jname);
        return why;
    }
    n_args = args_dedup(args, n_args);
    /* The template writes strings raw and every other value as JSON. A parameter the tool's
     * schema types as a string keeps its text exactly; any other value that parses as JSON
     * other than a string is that value (its text kept as the model wrote it), and what is left
     * is a string with its surrounding whitespace trimmed (as vLLM does). */
    json_t *props = tool_properties(p->opt.tools, name, name_len);
    for (size_t i = 0; i < n_args; i++) {
        GlmArg *a = &args[i];
        if (param_is_string(props, a->key, a->key_len)) continue;
        trim(&a->val, &a->val_len);
        json_error_t je;
        json_t *j = a->val_len ? json_loadb(a->val, a->val_len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je) : NULL;
        a->is_json = j && !json_is_string(j);
        json_decref(j);
    }

    GlmParseBuf t = { 0 };
    buf_putc(&t, '{');
    for (size_t i = 0; i < n_args; i++) {
        if (i) buf_putc(&t, ',');
        buf_putc(&t, '"');
        put_text(&t, args[i].key, args[i].key_len, 1);
        buf_put(&t, "\":", 2);
        if (args[i].is_json) {
            buf_put(&t, args[i].val, args[i].val_len);
        } else {
            buf_putc(&t, '"');
            put_text(&t, args[i].val, args[i].val_len, 1);
            buf_putc(&t, '"');
        }
    }
    buf_putc(&t, '}');
    free(args);

    size_t index = json_array_size(p->calls);
    uint64_t h1 = mix64(p->opt.id_seed ^ mix64(index + 1)), h2 = mix64(h1);
    char id[48];
    snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)h1, (unsigned long long)(h2 >> 32));
    *call_out = json_pack("{s:s, s:s, s:{s:o, s:s%}}", "id", id, "type", "function", "function", "name", jname,
                          "arguments", t.p, t.n);
    buf_free(&t);
    return *call_out ? NULL : "arguments are not UTF-8";
}

static GlmParseBuf *channel(GlmParser *p)
{
    return p->state == GLM_ST_REASONING ? &p->out_reasoning : &p->out_content;
}

static void emit(GlmParser *p, const char *s, size_t n)
{
    if (!n) return;
    buf_put(channel(p), s, n);
    if (p->state == GLM_ST_CONTENT) p->content_seen = 1;
    p->eat_ws = 0;
    p->after_call = 0;
    p->think_allowed = 0;
}

/* s[0..k) is text that ends where a tag or the held part starts: emit it without its leading
 * whitespace (when a tag just closed) and without its trailing whitespace; returns where that
 * trailing whitespace starts (everything before it is consumed). s[0..ws) is known whitespace. */
static size_t emit_run(GlmParser *p, const char *s, size_t k, size_t ws)
{
    if (ws > k) ws = k;
    size_t a = 0, t = k;
    if (p->eat_ws) for (a = ws; a < k && is_ws(s[a]);) a++;
    while (t > a && t > ws && is_ws(s[t - 1])) t--;
    if (t == ws && a < ws) t = a;      /* all of s[a..k) is whitespace */
    emit(p, s + a, t - a);
    return t;
}

/* Is there a tag of the current state at s (n bytes left)? 1 with *tag when a whole one, -1
 * when s is a proper prefix of one (wait for more), 0 when not. */
static int tag_at(const GlmParser *p, int think_ok, const char *s, size_t n, int *tag, size_t *tag_len)
{
    struct { const char *s; size_t len; int id; int on; } tags[] = {
        { THINK_CLOSE, S_LEN(THINK_CLOSE), TAG_THINK_CLOSE, p->state == GLM_ST_REASONING },
        { CALL_OPEN, S_LEN(CALL_OPEN), TAG_CALL_OPEN, p->state == GLM_ST_CONTENT && p->opt.parse_tools },
        { THINK_OPEN, S_LEN(THINK_OPEN), TAG_THINK_OPEN, p->state == GLM_ST_CONTENT && think_ok },
    };
    int partial = 0;
    for (int i = 0; i < 3; i++) {
        if (!tags[i].on) continue;
        if (n >= tags[i].len && memcmp(s, tags[i].s, tags[i].len) == 0) {
            *tag = tags[i].id;
            *tag_len = tags[i].len;
            return 1;
        }
        if (n < tags[i].len && memcmp(s, tags[i].s, n) == 0) partial = 1;
    }
    return partial ? -1 : 0;
}

/* Text states: emit what is decided, act on a tag. Returns 1 when the state changed (scan
 * again), 0 when the rest must wait for more input (or, when final, all is consumed). */
static int scan_text(GlmParser *p, size_t *off, int final)
{
    const char *s = p->pend.p + *off;
    size_t n = p->pend.n - *off;
    size_t ws = p->held_ws < n ? p->held_ws : n;   /* whitespace the last feed held: no tag in it */
    p->held_ws = 0;
    int nonws = 0;
    for (size_t k = ws; k < n; k++) {
        if (s[k] == '<') {
            int tag = TAG_NONE;
            size_t tag_len = 0;
            int m = tag_at(p, p->think_allowed && !nonws, s + k, n - k, &tag, &tag_len);
            if (m > 0) {
                size_t t = emit_run(p, s, k, ws);
                if (tag == TAG_CALL_OPEN) {
                    buf_clear(&p->call_ws);
                    buf_put(&p->call_ws, s + t, k - t);
                    *off += k;
                    p->state = GLM_ST_CALL;
                    p->close_from = S_LEN(CALL_OPEN);
                    p->think_allowed = 0;
                    return 1;
                }
                *off += k + tag_len;
                p->state = tag == TAG_THINK_OPEN ? GLM_ST_REASONING : GLM_ST_CONTENT;
                p->think_allowed = 0;
                p->eat_ws = 1;
                return 1;
            }
            if (m < 0 && !final) {
                size_t t = emit_run(p, s, k, ws);
                p->held_ws = k - t;
                *off += t;
                return 0;
            }
        }
        if (!is_ws(s[k])) nonws = 1;
    }
    if (!final) {
        size_t t = emit_run(p, s, n, ws);
        /* no tag can follow (content, no tools, past the place of a <think>): the whitespace
         * is content for sure, and is sent now as a parser-less server would */
        if (p->state == GLM_ST_CONTENT && !p->opt.parse_tools && !p->think_allowed && !p->after_call) {
            emit(p, s + t, n - t);
            t = n;
        }
        p->held_ws = n - t;
        *off += t;
        return 0;
    }
    /* the end: trailing whitespace stays (unless it only follows a tool call) */
    size_t a = 0, b = 0;
    if (p->eat_ws) while (a < n && is_ws(s[a])) a++;
    while (b < n && is_ws(s[b])) b++;
    if (!(p->after_call && b == n)) emit(p, s + a, n - a);
    *off += n;
    return 0;
}

/* A <tool_call> that is not a well-formed call: its opening tag (and the whitespace before it)
 * become content and scanning goes on after the tag, so a well-formed call nested after junk
 * is still found. */
static void degrade(GlmParser *p, size_t *off, const char *why)
{
    char ex[96];
    const char *s = p->pend.p + *off;
    excerpt(ex, sizeof ex, s, p->pend.n - *off);
    log_warn("glm_parse: malformed tool call (%s), returned as content: %s", why, ex);
    p->n_warnings++;
    p->state = GLM_ST_CONTENT;
    p->eat_ws = 0;
    emit(p, p->call_ws.p ? p->call_ws.p : "", p->call_ws.n);
    emit(p, CALL_OPEN, S_LEN(CALL_OPEN));
    buf_clear(&p->call_ws);
    *off += S_LEN(CALL_OPEN);
}

static int scan_call(GlmParser *p, size_t *off, int final)
{
    const char *s = p->pend.p + *off;
    size_t n = p->pend.n - *off;
    const char *e;
    /* The first </tool_call> from an earlier block's start is the first from this one's too when
     * it lies past this tag (each <tool_call> nested in junk would search the rest again). */
    if (p->close_at == SIZE_MAX) e = NULL;
    else if (p->close_at && p->close_at - 1 >= *off + S_LEN(CALL_OPEN)) e = p->pend.p + p->close_at - 1;
    else {
        e = n > p->close_from ? memmem(s + p->close_from, n - p->close_from, CALL_CLOSE, S_LEN(CALL_CLOSE)) : NULL;
        if (e) p->close_at = (size_t)(e - p->pend.p) + 1;
    }
    if (!e) {
        if (!final) {
            if (n >= S_LEN(CALL_CLOSE) && n - S_LEN(CALL_CLOSE) + 1 > p->close_from) p->close_from = n - S_LEN(CALL_CLOSE) + 1;
            return 0;
        }
        p->close_at = SIZE_MAX;
        degrade(p, off, "no </tool_call>");
        return 1;
    }
    size_t len = (size_t)(e - s) + S_LEN(CALL_CLOSE);
    json_t *call = NULL;
    const char *why = parse_block(p, s, len, &call);
    if (why) {
        degrade(p, off, why);
        return 1;
    }
    json_t *d = json_pack("{s:I, s:O, s:s, s:o}", "index", (json_int_t)json_array_size(p->calls),
                          "id", json_object_get(call, "id"), "type", "function",
                          "function", json_deep_copy(json_object_get(call, "function")));
    if (!p->out_calls) p->out_calls = json_array();
    json_array_append_new(p->out_calls, d);
    json_array_append_new(p->calls, call);
    buf_clear(&p->call_ws);
    *off += len;
    p->state = GLM_ST_CONTENT;
    p->eat_ws = !p->content_seen; /* text after a call is separated from earlier text only */
    p->after_call = 1;
    return 1;
}

static void run(GlmParser *p, int final, GlmParseDelta *d)
{
    buf_clear(&p->out_reasoning);
    buf_clear(&p->out_content);
    json_decref(p->out_calls);
    p->out_calls = NULL;
    size_t off = 0;
    while (p->state == GLM_ST_CALL ? scan_call(p, &off, final) : scan_text(p, &off, final)) {}
    if (off) {
        if (p->close_at != SIZE_MAX) p->close_at = p->close_at > off ? p->close_at - off : 0;
        memmove(p->pend.p, p->pend.p + off, p->pend.n - off);
        p->pend.n -= off;
        p->pend.p[p->pend.n] = 0;
    }
    p->memo_end = SIZE_MAX; /* pend moved; every block sharing an end closed in this feed */
    d->reasoning = p->out_reasoning.n ? p->out_reasoning.p : "";
    d->reasoning_len = p->out_reasoning.n;
    d->content = p->out_content.n ? p->out_content.p : "";
    d->content_len = p->out_content.n;
    d->tool_calls = p->out_calls;
}

/* ---- public API ---- */

GlmParseStart glm_parse_start_of(const char *prompt)
{
    size_t n = prompt ? strlen(prompt) : 0;
    while (n && is_ws(prompt[n - 1])) n--;
    if (n >= S_LEN(THINK_OPEN) && memcmp(prompt + n - S_LEN(THINK_OPEN), THINK_OPEN, S_LEN(THINK_OPEN)) == 0)
        return GLM_PARSE_START_REASONING;
    if (n >= S_LEN(THINK_CLOSE) && memcmp(prompt + n - S_LEN(THINK_CLOSE), THINK_CLOSE, S_LEN(THINK_CLOSE)) == 0)
        return GLM_PARSE_START_AFTER_THINK;
    return GLM_PARSE_START_CONTENT;
}

void glm_parse_init(GlmParser *p, const GlmParseOptions *opt)
{
    memset(p, 0, sizeof *p);
    p->opt = *opt;
    p->state = opt->start == GLM_PARSE_START_REASONING ? GLM_ST_REASONING : GLM_ST_CONTENT;
    p->eat_ws = opt->start != GLM_PARSE_START_CONTENT;
    p->think_allowed = opt->start == GLM_PARSE_START_CONTENT;
    p->calls = json_array();
    p->memo_end = SIZE_MAX;
}

void glm_parse_free(GlmParser *p)
{
    buf_free(&p->pend);
    buf_free(&p->call_ws);
    tag_index_free(&p->key_close);
    tag_index_free(&p->value_close);
    buf_free(&p->out_reasoning);
    buf_free(&p->out_content);
    json_decref(p->out_calls);
    json_decref(p->calls);
    memset(p, 0, sizeof *p);
}

void glm_parse_feed(GlmParser *p, const char *text, size_t len, GlmParseDelta *d)
{
    buf_put(&p->pend, text, len);
    run(p, 0, d);
}

void glm_parse_finish(GlmParser *p, GlmParseDelta *d)
{
    run(p, 1, d);
}

int glm_parse_n_calls(const GlmParser *p)
{
    return (int)json_array_size(p->calls);
}

void glm_parse_text(const char *text, size_t len, const GlmParseOptions *opt, GlmParseResult *r)
{
    GlmParser p;
    GlmParseDelta d;
    GlmParseBuf reasoning = { 0 }, content = { 0 };
    glm_parse_init(&p, opt);
    glm_parse_feed(&p, text, len, &d);
    buf_put(&reasoning, d.reasoning, d.reasoning_len);
    buf_put(&content, d.content, d.content_len);
    glm_parse_finish(&p, &d);
    buf_put(&reasoning, d.reasoning, d.reasoning_len);
    buf_put(&content, d.content, d.content_len);
    r->reasoning = reasoning.p;
    r->content = content.p;
    r->tool_calls = json_incref(p.calls);
    r->n_warnings = p.n_warnings;
    glm_parse_free(&p);
}

void glm_parse_result_free(GlmParseResult *r)
{
    free(r->reasoning);
    free(r->content);
    json_decref(r->tool_calls);
    memset(r, 0, sizeof *r);
}

json_t *glm_parse_delta_json(const GlmParseDelta *d)
{
    json_t *o = json_object();
    if (d->reasoning_len) json_object_set_new(o, "reasoning_content", json_text(d->reasoning, d->reasoning_len));
    if (d->content_len) json_object_set_new(o, "content", json_text(d->content, d->content_len));
    if (d->tool_calls && json_array_size(d->tool_calls)) json_object_set_new(o, "tool_calls", json_deep_copy(d->tool_calls));
    if (json_object_size(o) == 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *glm_parse_message_json(const GlmParseResult *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "role", json_string("assistant"));
    size_t nc = r->content ? strlen(r->content) : 0, nr = r->reasoning ? strlen(r->reasoning) : 0;
    json_object_set_new(o, "content", nc ? json_text(r->content, nc) : json_null());
    if (nr) json_object_set_new(o, "reasoning_content", json_text(r->reasoning, nr));
    if (r->tool_calls && json_array_size(r->tool_calls)) json_object_set_new(o, "tool_calls", json_deep_copy(r->tool_calls));
    return o;
}
