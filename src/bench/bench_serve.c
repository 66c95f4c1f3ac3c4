/* bench_serve: `moeserve bench serve`, the serving benchmark (report.c names the peers it follows): requests
 * from dataset.c are sent to an OpenAI-compatible server (/v1/completions or
 * /v1/chat/completions, streamed, usage requested) at --request-rate (Poisson, or all at once)
 * under --max-concurrency, and each streamed chunk is timed. One thread drives every stream
 * through libcurl's multi interface on epoll (curl_multi_socket_action), so thousands of streams
 * cost one wake-up per readable socket; the client measures its own overhead (the delay from
 * epoll reporting a socket to the chunk being timed, and CPU time per chunk) and reports it.
 * report.c turns the records into the metrics. A list --max-concurrency 1,64,256 runs each
 * level in turn and prints one table at the end.
 *   moeserve bench serve --base-url http://127.0.0.1:8000 --dataset-name random-ids \
 *       --random-input-len 1024 --random-output-len 128 --num-prompts 512 --max-concurrency 1,64 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"
#include "../backend/backend.h"
#include "../base/opt.h"
#include "../engine/engine.h"
#include "../model/model_opts.h"
#include "../format/tokenizer.h"
#include "bench_serve.h"

#define MAX_LEVELS 64
#define MAX_LINE (16 << 20)   /* one SSE line; a server sending more is broken */
#define MAX_ERRBODY 2048      /* bytes of a non-200 body kept for the failure reason */

/* ---- types ---- */

typedef struct Loop Loop;

typedef struct {
    CURL *easy;
    Loop *loop;                /* borrowed */
    RequestResult *res;        /* borrowed: the request this slot carries now */
    long status;               /* HTTP status, 0 until headers came */
    char *line;                /* SSE bytes not yet ending in '\n' (or a non-200 body) */
    size_t len, cap;
    int error_event;           /* the stream carried {"error": ...} */
    int retries;               /* sends of this request again on a fresh connection (slot_retry) */
    char curl_err[CURL_ERROR_SIZE];
} Slot;

struct Loop {
    CURLM *multi;
    int ep;                    /* epoll fd */
    double timer;              /* libcurl's next timeout, monotonic s (< 0: none) */
    double wake;               /* when epoll_wait last returned */
    int keep_text;             /* keep generated text: retokenized counts (--tokenizer), --output-details */
    float *lag;                /* [n_lag] s: wake -> chunk timed, one per write callback */
    long n_lag, cap_lag;
    long chunks;               /* token chunks received in this run */
};

/* ---- a minimal JSON reader for stream chunks ----
 * Each SSE chunk is scanned once for the few fields the metrics need (choices[0].text,
 * choices[0].delta.content / reasoning_content, usage.*_tokens, error) without building a tree:
 * a chunk costs a pass over its bytes and no allocation. */

typedef struct { const char *p, *end; } Js;
typedef struct { const char *s, *e; } Span;

typedef struct {
    Span text[2];              /* token text found (text or content, reasoning_content) */
    int usage_prompt, usage_completion; /* -1: absent */
    int error;                 /* an "error" member */
    Span error_msg;
} Chunk;

static void js_ws(Js *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int js_string(Js *j, Span *out)
{
    js_ws(j);
    if (j->p >= j->end || *j->p != '"') return -1;
    out->s = ++j->p;
    while (j->p < j->end) {
        if (*j->p == '\\') { j->p += 2; continue; }
        if (*j->p == '"') { out->e = j->p++; return 0; }
        j->p++;
    }
    return -1;
}

static int js_skip(Js *j, int depth);

static int isalnum_ascii(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Enter an object or array: returns 1 when it is empty (and consumed), 0 when members follow,
 * -1 when the value is not of that kind. */
static int js_open(Js *j, char open)
{
    js_ws(j);
    if (j->p >= j->end || *j->p != open) return -1;
    j->p++;
    js_ws(j);
    if (j->p < j->end && *j->p == (open == '{' ? '}' : ']')) { j->p++; return 1; }
    return 0;
}

/* After a member: 1 when another follows (',' consumed), 0 at the close (consumed), -1 bad. */
static int js_next(Js *j, char close)
{
    js_ws(j);
    if (j->p >= j->end) return -1;
    if (*j->p == ',') { j->p++; return 1; }
    if (*j->p == close) { j->p++; return 0; }
    return -1;
}

static int js_key(Js *j, Span *k)
{
    if (js_string(j, k)) return -1;
    js_ws(j);
    if (j->p >= j->end || *j->p != ':') return -1;
    j->p++;
    js_ws(j);
    return 0;
}

static int span_is(Span s, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(s.e - s.s) == n && !memcmp(s.s, lit, n);
}

static int js_skip(Js *j, int depth)
{
    js_ws(j);
    if (j->p >= j->end || depth > 64) return -1;
    char c = *j->p;
    if (c == '"') { Span s; return js_string(j, &s); }
    if (c == '{' || c == '[') {
        int r = js_open(j, c);
        if (r) return r < 0 ? -1 : 0;
        char close = c == '{' ? '}' : ']';
        do {
            Span k;
            if (c == '{' && js_key(j, &k)) return -1;
            if (js_skip(j, depth + 1)) return -1;
        } while ((r = js_next(j, close)) == 1);
        return r;
    }
    const char *st = j->p;
    while (j->p < j->end && (isalnum_ascii(*j->p) || *j->p == '-' || *j->p == '+' || *j->p == '.')) j->p++;
    return j->p > st ? 0 : -1;
}

/* A string value, or null (an empty span); anything else is skipped. */
static int js_opt_string(Js *j, Span *out)
{
    js_ws(j);
    out->s = out->e = NULL;
    if (j->p < j->end && *j->p == '"') return js_string(j, out);
    return js_skip(j, 1);
}

static int js_int(Js *j, int *out)
{
    js_ws(j);
    if (j->p < j->end && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) {
        long v = strtol(j->p, NULL, 10);
        *out = v < 0 ? 0 : v > 1 << 30 ? 1 << 30 : (int)v;
    }
    return js_skip(j, 1);
}

static int parse_choice(Js *j, Chunk *c)
{
    int r = js_open(j, '{');
    if (r) return r < 0 ? js_skip(j, 1) : 0;
    do {
        Span k;
        if (js_key(j, &k)) return -1;
        if (span_is(k, "text")) {
            if (js_opt_string(j, &c->text[0])) return -1;
        } else if (span_is(k, "delta") || span_is(k, "message")) {
            int d = js_open(j, '{');
            if (d < 0) { if (js_skip(j, 1)) return -1; continue; }
            if (d == 0) {
                do {
                    Span dk;
                    if (js_key(j, &dk)) return -1;
                    if (span_is(dk, "content")) { if (js_opt_string(j, &c->text[0])) return -1; }
                    else if (span_is(dk, "reasoning_content") || span_is(dk, "reasoning")) { if (js_opt_string(j, &c->text[1])) return -1; }
                    else if (js_skip(j, 2)) return -1;
                } while ((d = js_next(j, '}')) == 1);
                if (d < 0) return -1;
            }
        } else if (js_skip(j, 1)) return -1;
    } while ((r = js_next(j, '}')) == 1);
    return r;
}

/* Parses one "data:" payload. Returns -1 when it is not a JSON object. */
static int chunk_parse(const char *p, size_t n, Chunk *c)
{
    memset(c, 0, sizeof *c);
    c->usage_prompt = c->usage_completion = -1;
    Js j = {p, p + n};
    int r = js_open(&j, '{');
    if (r) return r < 0 ? -1 : 0;
    do {
        Span k;
        if (js_key(&j, &k)) return -1;
        if (span_is(k, "choices")) {
            int a = js_open(&j, '[');
            if (a < 0) { if (js_skip(&j, 1)) return -1; continue; }
            if (a == 0) {
                if (parse_choice(&j, c)) return -1;
                while ((a = js_next(&j, ']')) == 1)
                    if (js_skip(&j, 1)) return -1;
                if (a < 0) return -1;
            }
        } else if (span_is(k, "usage")) {
            int u = js_open(&j, '{');
            if (u < 0) { if (js_skip(&j, 1)) return -1; continue; }
            if (u == 0) {
                do {
                    Span uk;
                    if (js_key(&j, &uk)) return -1;
                    if (span_is(uk, "prompt_tokens")) { if (js_int(&j, &c->usage_prompt)) return -1; }
                    else if (span_is(uk, "completion_tokens")) { if (js_int(&j, &c->usage_completion)) return -1; }
                    else if (js_skip(&j, 2)) return -1;
                } while ((u = js_next(&j, '}')) == 1);
                if (u < 0) return -1;
            }
        } else if (span_is(k, "error")) {
            js_ws(&j);
            if (j.p < j.end && *j.p == 'n') { if (js_skip(&j, 1)) return -1; continue; } /* "error": null */
            c->error = 1;
            if (j.p < j.end && *j.p == '"') { if (js_string(&j, &c->error_msg)) return -1; continue; }
            int e = js_open(&j, '{');
            if (e < 0) { if (js_skip(&j, 1)) return -1; continue; }
            if (e == 0) {
                do {
                    Span ek;
                    if (js_key(&j, &ek)) return -1;
                    if (span_is(ek, "message")) { if (js_opt_string(&j, &c->error_msg)) return -1; }
                    else if (js_skip(&j, 2)) return -1;
                } while ((e = js_next(&j, '}')) == 1);
                if (e < 0) return -1;
            }
        } else if (js_skip(&j, 1)) return -1;
    } while ((r = js_next(&j, '}')) == 1);
    return r < 0 ? -1 : 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) { o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63)); return 3; }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63)); o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static unsigned hex4(const char *p, const char *e)
{
    if (e - p < 4) return 0xFFFD;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return 0xFFFD;
        v = v << 4 | (unsigned)h;
    }
    return v;
}

/* Appends the unescaped JSON string s to r->text. */
static void text_append(RequestResult *r, Span s)
{
    size_t need = r->text_len + (size_t)(s.e - s.s) + 8;
    if (need > r->text_cap) {
        r->text_cap = need * 2;
        r->text = xrealloc(r->text, r->text_cap);
    }
    char *o = r->text + r->text_len;
    for (const char *p = s.s; p < s.e; p++) {
        if (*p != '\\' || p + 1 >= s.e) { *o++ = *p; continue; }
        char c = *++p;
        switch (c) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'u': {
            unsigned cp = hex4(p + 1, s.e);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p + 6 < s.e && p[1] == '\\' && p[2] == 'u') {
                unsigned lo = hex4(p + 3, s.e);
                if (lo >= 0xDC00 && lo < 0xE000) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); p += 6; }
            }
            o += utf8_put(o, cp);
            break;
        }
        default: *o++ = c;
        }
    }
    r->text_len = (size_t)(o - r->text);
    r->text[r->text_len] = 0;
}

/* ---- the stream ---- */

static void itl_push(RequestResult *r, float v)
{
    if (r->n_itl == r->cap_itl) {
        r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 64;
        r->itl = xrealloc(r->itl, (size_t)r->cap_itl * sizeof *r->itl);
    }
    r->itl[r->n_itl++] = v;
}

static void span_copy(char *dst, size_t cap, Span s)
{
    size_t n = (size_t)(s.e - s.s);
    if (n >= cap) n = cap - 1;
    memcpy(dst, s.s, n);
    dst[n] = 0;
}

/* One SSE line, timed at now. */
static void slot_line(Slot *sl, const char *p, size_t n, double now)
{
    RequestResult *r = sl->res;
    if (n && p[n - 1] == '\r') n--;
    if (n < 5 || memcmp(p, "data:", 5)) return;   /* blank line, comment, event:, id: */
    p += 5, n -= 5;
    if (n && *p == ' ') p++, n--;
    r->t_last_chunk = now;
    if (n == 6 && !memcmp(p, "[DONE]", 6)) return;
    Chunk c;
    if (chunk_parse(p, n, &c)) {
        if (!sl->error_event) snprintf(r->error, sizeof r->error, "malformed stream chunk: %.80s", p);
        sl->error_event = 1;
        return;
    }
    if (c.error) {
        sl->error_event = 1;
        char msg[200] = "";
        span_copy(msg, sizeof msg, c.error_msg);
        snprintf(r->error, sizeof r->error, "error in stream: %s", msg);
        return;
    }
    if (c.usage_prompt >= 0) r->usage_prompt = c.usage_prompt;
    if (c.usage_completion >= 0) r->usage_completion = c.usage_completion;
    if (c.text[0].e == c.text[0].s && c.text[1].e == c.text[1].s) return; /* no token: role or usage chunk */
    if (r->n_chunks == 0) r->ttft = now - r->t_start;
    else itl_push(r, (float)(now - r->t_last_token));
    r->t_last_token = now;
    r->n_chunks++;
    sl->loop->chunks++;
    if (sl->loop->keep_text)
        for (int i = 0; i < 2; i++)
            if (c.text[i].e > c.text[i].s) text_append(r, c.text[i]);
}

static int buf_append(Slot *sl, const char *p, size_t n)
{
    if (sl->len + n + 1 > sl->cap) {
        if (sl->len + n + 1 > MAX_LINE) return -1;
        sl->cap = (sl->len + n + 1) * 2;
        sl->line = xrealloc(sl->line, sl->cap);
    }
    memcpy(sl->line + sl->len, p, n);
    sl->len += n;
    sl->line[sl->len] = 0;
    return 0;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    Slot *sl = ud;
    Loop *L = sl->loop;
    size_t n = size * nmemb;
    double now = clock_now();
    if (L->n_lag < L->cap_lag) L->lag[L->n_lag++] = (float)(now - L->wake);
    if (!sl->status) curl_easy_getinfo(sl->easy, CURLINFO_RESPONSE_CODE, &sl->status);
    if (sl->status != 200) {  /* keep the start of the body for the failure reason */
        size_t room = sl->len < MAX_ERRBODY ? MAX_ERRBODY - sl->len : 0;
        buf_append(sl, ptr, n < room ? n : room);
        return n;
    }
    /* whole lines straight from libcurl's buffer; only a partial line is copied */
    const char *p = ptr, *end = ptr + n;
    if (sl->len) {
        const char *nl = memchr(p, '\n', n);
        if (!nl) {
            if (buf_append(sl, p, n)) { snprintf(sl->res->error, sizeof sl->res->error, "an SSE line over %d bytes", MAX_LINE); return 0; }
            return n;
        }
        if (buf_append(sl, p, (size_t)(nl - p))) { snprintf(sl->res->error, sizeof sl->res->error, "an SSE line over %d bytes", MAX_LINE); return 0; }
        slot_line(sl, sl->line, sl->len, now);
        sl->len = 0;
        p = nl + 1;
    }
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) {
            if (buf_append(sl, p, (size_t)(end - p))) { snprintf(sl->res->error, sizeof sl->res->error, "an SSE line over %d bytes", MAX_LINE); return 0; }
            break;
        }
        slot_line(sl, p, (size_t)(nl - p), now);
        p = nl + 1;
    }
    return n;
}

/* ---- libcurl on epoll ---- */

static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)e;
    Loop *L = userp;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(L->ep, EPOLL_CTL_DEL, fd, NULL);
        return 0;
    }
    struct epoll_event ev = {0};
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    ev.data.fd = fd;
    if (epoll_ctl(L->ep, socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) {
        if (errno == EEXIST) epoll_ctl(L->ep, EPOLL_CTL_MOD, fd, &ev);
        else if (errno == ENOENT) epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev);
        else die("epoll_ctl: %s", strerror(errno));
    }
    if (!socketp) curl_multi_assign(L->multi, fd, L);
    return 0;
}

static int on_timer(CURLM *m, long timeout_ms, void *userp)
{
    (void)m;
    Loop *L = userp;
    L->timer = timeout_ms < 0 ? -1 : clock_now() + timeout_ms * 1e-3;
    return 0;
}

/* ---- one run: n requests at a rate under a concurrency limit ---- */

typedef struct {
    const char *url;
    struct curl_slist *headers;
    long timeout_ms;
    int quiet;
    int level;                 /* the concurrency level, for the progress line */
} RunConfig;

static void slot_start(Slot *sl, const RunConfig *rc, const char *body, size_t body_len, RequestResult *r)
{
    CURL *e = sl->easy;
    curl_easy_setopt(e, CURLOPT_URL, rc->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, rc->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, rc->timeout_ms);
    curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 0L);
    sl->res = r;
    sl->status = 0;
    sl->len = 0;
    sl->error_event = 0;
    sl->retries = 0;
    sl->curl_err[0] = 0;
    r->usage_prompt = r->usage_completion = -1;
    r->t_start = clock_now();
    CURLMcode mc = curl_multi_add_handle(sl->loop->multi, e);
    if (mc != CURLM_OK) die("curl_multi_add_handle: %s", curl_multi_strerror(mc));
}

/* The failure reason of a non-200 response: the OpenAI error message when there is one. */
static void http_reason(Slot *sl)
{
    RequestResult *r = sl->res;
    char msg[200] = "";
    json_t *j = sl->len ? json_loadb(sl->line, sl->len, 0, NULL) : NULL;
    const char *m = NULL;
    if (j) {
        json_t *e = json_object_get(j, "error");
        m = json_is_string(e) ? json_string_value(e) : json_string_value(json_object_get(e, "message"));
        if (!m) m = json_string_value(json_object_get(j, "message"));
        if (!m) m = json_string_value(json_object_get(j, "detail"));
    }
    if (m) snprintf(msg, sizeof msg, "%s", m);
    else if (sl->len) {
        snprintf(msg, sizeof msg, "%.*s", (int)(sl->len < 120 ? sl->len : 120), sl->line);
        for (char *c = msg; *c; c++) if (*c == '\n' || *c == '\r') *c = ' ';
    }
    snprintf(r->error, sizeof r->error, "HTTP %ld%s%s", sl->status, *msg ? ": " : "", msg);
    json_decref(j);
}

/* A kept-alive connection the server had already closed (llama-server closes idle ones after a
 * few seconds; libcurl's own retries can pick another dead one from its pool, "Connection died,
 * tried 5 times before giving up"): when nothing of a response came back, the server never saw
 * the request, so it is sent again on a new connection instead of being counted failed. Its
 * start time stays: the client waited that long. Returns 1 when the request was sent again. */
#define MAX_RETRIES 3
static int slot_retry(Slot *sl, CURLcode rc)
{
    int dead = rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING;
    if (!dead || sl->status != 0 || sl->res->n_chunks || sl->len || sl->retries >= MAX_RETRIES) return 0;
    CURLM *m = sl->loop->multi;
    curl_multi_remove_handle(m, sl->easy);
    curl_easy_setopt(sl->easy, CURLOPT_FRESH_CONNECT, 1L);
    sl->retries++;
    sl->res->retries++;
    sl->curl_err[0] = 0;
    CURLMcode mc = curl_multi_add_handle(m, sl->easy);
    if (mc != CURLM_OK) die("curl_multi_add_handle: %s", curl_multi_strerror(mc));
    return 1;
}

static void slot_finish(Slot *sl, CURLcode rc)
{
    RequestResult *r = sl->res;
    if (rc == CURLE_OK && sl->status == 200 && sl->len) {  /* a last line without '\n' */
        slot_line(sl, sl->line, sl->len, clock_now());
        sl->len = 0;
    }
    r->ok = 0;
    if (rc != CURLE_OK) {
        if (!r->error[0])
            snprintf(r->error, sizeof r->error, "curl: %.80s%s%.160s", curl_easy_strerror(rc), sl->curl_err[0] ? ": " : "", sl->curl_err);
    } else if (sl->status != 200) {
        http_reason(sl);
    } else if (sl->error_event) {
        /* r->error says it */
    } else if (r->n_chunks == 0) {
        snprintf(r->error, sizeof r->error, "no token in the stream");
    } else {
        r->ok = 1;
        r->error[0] = 0;
    }
    curl_multi_remove_handle(sl->loop->multi, sl->easy);
    sl->res = NULL;
}

static void progress(const RunConfig *rc, int done, int failed, int n, int running, long chunks, double elapsed, double rate, int final)
{
    if (rc->quiet) return;
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    fprintf(stderr, "%s[concurrency %d] %d/%d done, %d failed, %d running, %.1f s, %ld tokens, %.0f tok/s now%s",
            tty ? "\r\033[K" : "", rc->level, done, n, failed, running, elapsed, chunks, rate, final || !tty ? "\n" : "");
    fflush(stderr);
}

/* Sends bodies[0..n) with arrivals (s from the start, non-decreasing), at most conc at once;
 * fills res[0..n). Returns the wall time from the first send to the last completion. */
static double run_requests(Loop *L, Slot *slots, int conc, const RunConfig *rc, char *const *bodies,
                           const size_t *body_lens, const double *arrival, RequestResult *res, int n)
{
    int *free_slots = xmalloc((size_t)conc * sizeof *free_slots), n_free = conc;
    for (int i = 0; i < conc; i++) free_slots[i] = conc - 1 - i;
    int next = 0, done = 0, failed = 0, running = 0;
    L->chunks = 0;
    long last_chunks = 0;
    double t0 = clock_now(), last_prog = t0, t_end = t0;
    double prog_every = isatty(2) ? 0.25 : 5.0;
    struct epoll_event evs[256];
    while (done < n) {
        double now = clock_now();
        while (next < n && n_free > 0 && arrival[next] <= now - t0) {
            Slot *sl = &slots[free_slots[--n_free]];
            slot_start(sl, rc, bodies[next], body_lens[next], &res[next]);
            next++, running++;
        }
        double deadline = last_prog + prog_every;
        if (L->timer >= 0 && L->timer < deadline) deadline = L->timer;
        if (next < n && n_free > 0 && t0 + arrival[next] < deadline) deadline = t0 + arrival[next];
        now = clock_now();
        int ms = deadline <= now ? 0 : (int)ceil((deadline - now) * 1e3);
        int k = epoll_wait(L->ep, evs, 256, ms);
        if (k < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        L->wake = clock_now();
        int still;
        for (int i = 0; i < k; i++) {
            int f = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) | (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                    (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            curl_multi_socket_action(L->multi, evs[i].data.fd, f, &still);
        }
        if (L->timer >= 0 && clock_now() >= L->timer) {
            L->timer = -1;
            curl_multi_socket_action(L->multi, CURL_SOCKET_TIMEOUT, 0, &still);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(L->multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            Slot *sl = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&sl);
            if (slot_retry(sl, msg->data.result)) continue;
            RequestResult *r = sl->res;
            slot_finish(sl, msg->data.result);
            failed += !r->ok;
            free_slots[n_free++] = (int)(sl - slots);
            done++, running--;
            t_end = clock_now();
        }
        now = clock_now();
        if (now >= last_prog + prog_every || done == n) {
            double rate = (L->chunks - last_chunks) / (now - last_prog > 0 ? now - last_prog : 1);
            progress(rc, done, failed, n, running, L->chunks, now - t0, rate, done == n);
            last_prog = now;
            last_chunks = L->chunks;
        }
    }
    free(free_slots);
    return t_end - t0;
}

/* ---- set-up ---- */

static void loop_init(Loop *L, int max_conns)
{
    memset(L, 0, sizeof *L);
    L->timer = -1;
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    if (L->ep < 0) die("epoll_create1: %s", strerror(errno));
    L->multi = curl_multi_init();
    if (!L->multi) die("curl_multi_init failed");
    curl_multi_setopt(L->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(L->multi, CURLMOPT_SOCKETDATA, L);
    curl_multi_setopt(L->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(L->multi, CURLMOPT_TIMERDATA, L);
    /* keep every connection of the run open for reuse by the next request */
    curl_multi_setopt(L->multi, CURLMOPT_MAXCONNECTS, (long)max_conns + 16);
}

static void slots_init(Slot *slots, int n, Loop *L)
{
    for (int i = 0; i < n; i++) {
        Slot *sl = &slots[i];
        memset(sl, 0, sizeof *sl);
        sl->loop = L;
        sl->easy = curl_easy_init();
        if (!sl->easy) die("curl_easy_init failed");
        sl->cap = 64 << 10;
        sl->line = xmalloc(sl->cap);
        CURL *e = sl->easy;
        curl_easy_setopt(e, CURLOPT_PRIVATE, sl);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, sl);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, sl->curl_err);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
    }
}

static void slots_free(Slot *slots, int n)
{
    for (int i = 0; i < n; i++) {
        curl_easy_cleanup(slots[i].easy);
        free(slots[i].line);
    }
}

static size_t collect(char *p, size_t size, size_t nmemb, void *ud)
{
    char **buf = ud;
    size_t n = size * nmemb, have = *buf ? strlen(*buf) : 0;
    if (have + n > (1 << 20)) return 0;
    *buf = xrealloc(*buf, have + n + 1);
    memcpy(*buf + have, p, n);
    (*buf)[have + n] = 0;
    return n;
}

/* GET base+path as JSON (NULL: no 200 JSON object within 30 s). */
static json_t *get_json(const char *base, const char *path, struct curl_slist *headers, char *err, size_t errlen, long *status)
{
    char url[2048];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *e = curl_easy_init();
    char *body = NULL, cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 30000L);
    CURLcode rc = curl_easy_perform(e);
    *status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(e);
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "GET %s: %s%s%s", url, curl_easy_strerror(rc), *cerr ? ": " : "", cerr);
        free(body);
        return NULL;
    }
    json_t *j = body && *status == 200 ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (j && !json_is_object(j)) { json_decref(j); j = NULL; }
    return j;
}

/* The first model id of GET /v1/models (both peers do this when --model is not given). */
static char *first_model(const char *base, struct curl_slist *headers)
{
    char err[2400] = "";
    long status;
    json_t *j = get_json(base, "/v1/models", headers, err, sizeof err, &status);
    if (!j && *err) fatal("bench serve: %s\nhint: is the server up? or give --model", err);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (!id) fatal("bench serve: GET %s/v1/models gave HTTP %ld without a model id; give --model", base, status);
    char *m = xstrdup(id);
    json_decref(j);
    return m;
}

/* What the server says of itself, kept in the JSON line as "server_info" (as SGLang's
 * bench_serving keeps /get_server_info): moeserve's and SGLang's /get_server_info, else
 * llama-server's /props, else vLLM's /version; NULL when none answers. */
static json_t *server_info(const char *base, struct curl_slist *headers)
{
    static const char *const paths[] = {"/get_server_info", "/props", "/version"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char err[2400];
        long status;
        json_t *j = get_json(base, paths[i], headers, err, sizeof err, &status);
        if (j) {
            json_object_del(j, "chat_template");   /* llama-server's /props: kilobytes of template */
            return j;
        }
    }
    return NULL;
}

/* The server's speculative-decoding counters in its /get_server_info (moeserve's engine object):
 * chains verified and drafts accepted; 0 when it has none */
static int spec_counters(const json_t *info, double *chains, double *accepted)
{
    const json_t *eng = json_object_get(info, "engine");
    const json_t *c = json_object_get(eng, "spec_num_drafts"), *a = json_object_get(eng, "spec_accepted_tokens");
    if (!json_is_integer(c) || !json_is_integer(a)) return 0;
    *chains = (double)json_integer_value(c);
    *accepted = (double)json_integer_value(a);
    return 1;
}

static int parse_levels(const char *s, int *out)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20) fatal("bench serve: --max-concurrency: '%s' is not a list of positive integers", s);
        if (n == MAX_LEVELS) fatal("bench serve: --max-concurrency: more than %d levels", MAX_LEVELS);
        out[n++] = (int)v;
        if (*end && *end != ',') fatal("bench serve: --max-concurrency: unexpected '%c' in '%s'", *end, s);
        p = *end ? end + 1 : end;
    }
    return n;
}

static int parse_percentiles(const char *s, double *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v > 0 && v < 100)) fatal("bench serve: --metric-percentiles: '%s' is not a list of numbers in (0, 100)", s);
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') fatal("bench serve: --metric-percentiles: unexpected '%c'", *end);
    }
    return n;
}

static void raise_nofile(int want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)want) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)want ? rl.rlim_max : (rlim_t)want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void results_free(RequestResult *res, int n)
{
    for (int i = 0; i < n; i++) {
        free(res[i].itl);
        free(res[i].text);
    }
    free(res);
}

/* ---- arrivals ---- */

static double unif(Rng *r) { return ((rng_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); } /* (0, 1) */

/* Gamma(k, 1) (Marsaglia and Tsang; k < 1 through Gamma(k + 1) U^(1/k)) */
static double gamma_draw(Rng *r, double k)
{
    if (k < 1) return gamma_draw(r, k + 1) * pow(unif(r), 1.0 / k);
    double d = k - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x = sqrt(-2 * log(unif(r))) * cos(2 * M_PI * unif(r)), v = 1 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        if (log(unif(r)) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}

/* ---- the command ---- */

int bench_serve_main(int argc, char **argv)
{
    const char *base_url = "http://127.0.0.1:8000", *backend = "openai-completions", *endpoint = NULL;
    const char *model = NULL, *tok_path = NULL, *conc_s = NULL, *format = "sglang", *out_file = NULL;
    const char *rate_s = "inf", *pct_s = "99", *pct_metrics = "ttft,tpot,itl,e2el", *label = NULL, *extra_body = NULL;
    DatasetOptions dopt = {.name = "random-ids", .num_prompts = 1000, .input_len = 1024, .output_len = 1024,
                           .range_ratio = 0.0, .vocab = 8000, .seed = 1, .temperature = 0};
    int warmup = 1, no_ignore_eos = 0, quiet = 0, seed = 1, gpus = 1, timeout_s = 6 * 3600, details = 0;
    int force_eos = 0;
    double burstiness = 1.0, slo[3] = {-1, -1, -1};
    OptStrs goodput = {0};
    const OptSpec server_specs[] = {
        {.names = "--base-url", .type = OPT_STR, .dst = &base_url, .metavar = "URL", .help = "the server",
         .def = base_url},
        {.names = "--backend", .type = OPT_STR, .dst = &backend, .metavar = "openai-completions|openai-chat",
         .help = "the API (vllm, sglang-oai, ... map onto these)", .def = backend},
        {.names = "--endpoint", .type = OPT_STR, .dst = &endpoint, .metavar = "PATH", .help = "the API's path",
         .def = "the backend's"},
        {.names = "--model", .type = OPT_STR, .dst = &model, .metavar = "NAME",
         .help = "the model field of the requests",
         .def = "the server's first model"},
        {.names = "--tokenizer", .type = OPT_STR, .dst = &tok_path, .metavar = "PATH",
         .help = "to count prompt and output tokens", .def = "the model's directory, when it is one"},
        {.names = "--request-timeout", .type = OPT_INT, .dst = &timeout_s, .metavar = "S",
         .help = "seconds a request may take",
         .def = "21600", .lo = 1, .hi = 1 << 30},
    };
    const OptSpec data_specs[] = {
        {.names = "--dataset-name", .type = OPT_STR, .dst = &dopt.name, .metavar = "random|random-ids|sharegpt|jsonl",
         .help = "where the prompts come from", .def = dopt.name},
        {.names = "--dataset-path", .type = OPT_STR, .dst = &dopt.path, .metavar = "FILE",
         .help = "the dataset's file"},
        {.names = "--num-prompts", .type = OPT_INT, .dst = &dopt.num_prompts, .metavar = "N",
         .help = "requests of a run",
         .def = opt_def("%d", dopt.num_prompts), .lo = 1, .hi = 1 << 24},
        {.names = "--random-input-len", .type = OPT_INT, .dst = &dopt.input_len, .metavar = "N",
         .help = "prompt tokens of the random datasets", .def = opt_def("%d", dopt.input_len), .lo = 1, .hi = 1 << 22},
        {.names = "--random-output-len", .type = OPT_INT, .dst = &dopt.output_len, .metavar = "N",
         .help = "output tokens of the random datasets", .def = opt_def("%d", dopt.output_len), .lo = 1, .hi = 1 << 22},
        {.names = "--random-range-ratio", .type = OPT_DOUBLE, .dst = &dopt.range_ratio, .metavar = "R",
         .help = "lengths drawn from [len R, len] (SGLang's)", .def = "0", .lo = 0, .hi = 1},
        {.names = "--random-range-vllm", .type = OPT_FLAG, .dst = &dopt.range_vllm,
         .help = "lengths drawn from [len (1-R), len (1+R)] (vLLM's)", .def = "off"},
        {.names = "--random-vocab-size", .type = OPT_INT, .dst = &dopt.vocab, .metavar = "N",
         .help = "token ids of random-ids without a tokenizer", .def = opt_def("%d", dopt.vocab), .lo = 1,
         .hi = 1 << 24},
        {.names = "--output-len|--sharegpt-output-len", .type = OPT_INT, .dst = &dopt.fixed_output_len, .metavar = "N",
         .help = "output tokens of every request", .def = "the dataset's", .lo = 1, .hi = 1 << 22},
        {.names = "--temperature", .type = OPT_DOUBLE, .dst = &dopt.temperature, .metavar = "T",
         .help = "the requests' temperature (sglang.bench_serving's 0)", .def = "0", .lo = 0, .hi = 100},
        {.names = "--extra-body|--extra-request-body", .type = OPT_STR, .dst = &extra_body, .metavar = "JSON",
         .help = "an object merged into every request"},
        {.names = "--ignore-eos", .type = OPT_FLAG, .dst = &force_eos,
         .help = "ask for ignore_eos (the random datasets' default)"},
        {.names = "--disable-ignore-eos", .type = OPT_FLAG, .dst = &no_ignore_eos, .help = "let requests end at eos"},
        {.names = "--seed", .type = OPT_INT, .dst = &seed, .metavar = "N", .help = "of the datasets' draws", .def = "1",
         .lo = 0, .hi = 1 << 30},
    };
    const OptSpec load_specs[] = {
        {.names = "--request-rate", .type = OPT_STR, .dst = &rate_s, .metavar = "R|inf",
         .help = "requests per second (Poisson), or all at once", .def = "inf"},
        {.names = "--burstiness", .type = OPT_DOUBLE, .dst = &burstiness, .metavar = "B",
         .help = "gamma shape of the arrival gaps (1: Poisson)", .def = "1", .lo = 1e-3, .hi = 1e3},
        {.names = "--max-concurrency", .type = OPT_STR, .dst = &conc_s, .metavar = "N[,N...]",
         .help = "requests in flight at most; a list runs each level", .def = "no limit"},
        {.names = "--warmup-requests|--num-warmups", .type = OPT_INT, .dst = &warmup, .metavar = "N",
         .help = "untimed requests first", .def = "1", .lo = 0, .hi = 1 << 16},
    };
    const OptSpec report_specs[] = {
        {.names = "--format", .type = OPT_STR, .dst = &format, .metavar = "sglang|vllm", .help = "the report's layout",
         .def = format},
        {.names = "--output-file", .type = OPT_STR, .dst = &out_file, .metavar = "FILE",
         .help = "append one JSON line per run"},
        {.names = "--percentile-metrics", .type = OPT_STR, .dst = &pct_metrics, .metavar = "ttft,tpot,itl,e2el",
         .help = "metrics with percentiles", .def = pct_metrics},
        {.names = "--metric-percentiles", .type = OPT_STR, .dst = &pct_s, .metavar = "P,P,..",
         .help = "which percentiles",
         .def = pct_s},
        {.names = "--goodput", .type = OPT_STRS, .dst = &goodput, .metavar = "KEY:MS...",
         .help = "SLOs of a good request: ttft:MS tpot:MS e2el:MS"},
        {.names = "--label", .type = OPT_STR, .dst = &label, .metavar = "TEXT",
         .help = "the run's name in the results"},
        {.names = "--gpus", .type = OPT_INT, .dst = &gpus, .metavar = "N",
         .help = "GPUs of the server, for per-GPU figures",
         .def = "1", .lo = 1, .hi = 1 << 16},
        {.names = "--output-details|--save-detailed", .type = OPT_FLAG, .dst = &details,
         .help = "per-request lists in the JSON line (lengths, TTFTs, ITLs, texts, errors)", .def = "off"},
        {.names = "--quiet|--disable-tqdm", .type = OPT_FLAG, .dst = &quiet, .help = "no progress line", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("target", server_specs), OPT_GROUP("dataset", data_specs),
                               OPT_GROUP("load", load_specs), OPT_GROUP("report", report_specs)};
    const OptCommand cmd = {.cmd = "bench serve", .synopsis = "[options]",
                            .about = "The serving benchmark against an OpenAI-compatible server, comparable with "
                                     "sglang.bench_serving and vllm bench serve.",
                            .groups = groups, .n_groups = 4};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    /* --goodput KEY:MS [KEY:MS...] (vLLM's form), or KEY:MS,KEY:MS */
    for (int g = 0; g < goodput.n; g++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", goodput.v[g]);
        for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *colon = strchr(kv, ':'), *end = NULL;
            if (!colon) fatal("bench serve: --goodput: '%s' is not KEY:MS", kv);
            *colon = 0;
            double v = strtod(colon + 1, &end);
            int q = !strcmp(kv, "ttft") ? 0 : !strcmp(kv, "tpot") ? 1 : !strcmp(kv, "e2el") ? 2 : -1;
            if (q < 0) fatal("bench serve: --goodput: '%s' is not one of ttft, tpot, e2el", kv);
            if (end == colon + 1 || *end || !(v >= 0)) fatal("bench serve: --goodput %s: '%s' is not milliseconds "
                                                             ">= 0", kv, colon + 1);
            slo[q] = v;
        }
    }
    int has_goodput = goodput.n > 0;

    RunInfo base = {0};
    if (!strcmp(format, "sglang")) base.format = FORMAT_SGLANG;
    else if (!strcmp(format, "vllm")) base.format = FORMAT_VLLM;
    else fatal("bench serve: --format must be sglang or vllm, not '%s'", format);
    /* the peers' backend names map onto the two APIs (SGLang's native "sglang" goes to
     * /v1/completions here); the report and the JSON line name the one given */
    if (!strcmp(backend, "openai-completions") || !strcmp(backend, "openai") || !strcmp(backend, "vllm") ||
        !strcmp(backend, "sglang") || !strcmp(backend, "sglang-oai") || !strcmp(backend, "lmdeploy") ||
        !strcmp(backend, "completions"))
        dopt.api = API_COMPLETIONS;
    else if (!strcmp(backend, "openai-chat") || !strcmp(backend, "vllm-chat") || !strcmp(backend, "sglang-oai-chat") ||
             !strcmp(backend, "lmdeploy-chat") || !strcmp(backend, "chat"))
        dopt.api = API_CHAT;
    else fatal("bench serve: --backend must be openai-completions (or openai, vllm, sglang, sglang-oai, lmdeploy) or "
               "openai-chat (or vllm-chat, sglang-oai-chat, lmdeploy-chat), not '%s'", backend);
    double rate = INFINITY;
    if (strcmp(rate_s, "inf") != 0) {
        char *end;
        rate = strtod(rate_s, &end);
        if (end == rate_s || *end || !(rate > 0)) fatal("bench serve: --request-rate: '%s' is not a positive number or inf", rate_s);
    }
    int levels[MAX_LEVELS], n_levels = conc_s ? parse_levels(conc_s, levels) : 1;
    if (!conc_s) levels[0] = 0;
    double pcts[8];
    int n_pcts = parse_percentiles(pct_s, pcts, 8);
    size_t blen = strlen(base_url);
    char *baseu = xstrdup(base_url);
    while (blen && baseu[blen - 1] == '/') baseu[--blen] = 0;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) die("curl_global_init failed");
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");   /* no 100-continue wait on large bodies */
    const char *key = getenv("OPENAI_API_KEY");
    if (key && *key) {
        char h[1024];
        snprintf(h, sizeof h, "Authorization: Bearer %s", key);
        headers = curl_slist_append(headers, h);
    }
    char *model_owned = NULL;
    if (!model) model = model_owned = first_model(baseu, headers);

    Tokenizer *tok = NULL;
    char err[512];
    if (tok_path) {
        tok = tokenizer_load(tok_path, err, sizeof err);
        if (!tok) fatal("bench serve: --tokenizer %s: %s", tok_path, err);
    } else {
        /* both peers default the tokenizer to the model; a local model directory has one */
        struct stat st;
        char p[4200];
        if (stat(model, &st) == 0 && S_ISDIR(st.st_mode) && file_exists(path_join(p, sizeof p, model, "tokenizer.json"))) {
            tok = tokenizer_load(model, err, sizeof err);
            if (tok) tok_path = model;
        }
    }

    int ignore = !strcmp(dopt.name, "random") || !strcmp(dopt.name, "random-ids"); /* vLLM's default */
    if (force_eos) ignore = 1;
    if (no_ignore_eos) ignore = 0;
    dopt.ignore_eos = ignore;
    dopt.seed = (uint64_t)seed;
    dopt.model = model;
    dopt.extra_body = extra_body;
    dopt.tok = tok;
    Dataset ds;
    dataset_build(&ds, &dopt);
    int n = ds.n;

    char url[2300];
    snprintf(url, sizeof url, "%s%s", baseu,
             endpoint ? endpoint : dopt.api == API_CHAT ? "/v1/chat/completions" : "/v1/completions");
    int max_conc = 0;
    for (int l = 0; l < n_levels; l++) {
        int c = levels[l] ? levels[l] : n;
        if (c > n) c = n;
        if (c > max_conc) max_conc = c;
    }
    if (warmup > max_conc) max_conc = warmup;
    raise_nofile(2 * max_conc + 256);

    Loop L;
    loop_init(&L, max_conc);
    L.keep_text = tok != NULL || details;
    Slot *slots = xcalloc((size_t)max_conc, sizeof *slots);
    slots_init(slots, max_conc, &L);
    RunConfig rc = {.url = url, .headers = headers, .timeout_ms = (long)timeout_s * 1000, .quiet = quiet};

    char **bodies = xmalloc((size_t)n * sizeof *bodies);
    size_t *lens = xmalloc((size_t)n * sizeof *lens);
    double *arrival = xcalloc((size_t)n, sizeof *arrival);
    long total_out = 0;
    for (int i = 0; i < n; i++) {
        bodies[i] = ds.reqs[i].body;
        lens[i] = ds.reqs[i].body_len;
        total_out += ds.reqs[i].output_len;
    }

    /* warm-up: the first request with at most 32 output tokens, as SGLang does; all failing
     * means a wrong URL, model or backend, which no benchmark should be run against */
    if (warmup > 0) {
        if (!quiet) fprintf(stderr, "bench serve: warm-up with %d request%s to %s\n", warmup, warmup > 1 ? "s" : "", url);
        size_t wl;
        char *wb = dataset_body_set_max_tokens(ds.reqs[0].body, ds.reqs[0].output_len < 32 ? ds.reqs[0].output_len : 32, &wl);
        char **wbs = xmalloc((size_t)warmup * sizeof *wbs);
        size_t *wls = xmalloc((size_t)warmup * sizeof *wls);
        double *warr = xcalloc((size_t)warmup, sizeof *warr);
        for (int i = 0; i < warmup; i++) wbs[i] = wb, wls[i] = wl;
        RequestResult *wr = xcalloc((size_t)warmup, sizeof *wr);
        L.cap_lag = 0;
        RunConfig wrc = rc;
        wrc.quiet = 1;
        run_requests(&L, slots, warmup, &wrc, wbs, wls, warr, wr, warmup);
        int ok = 0;
        for (int i = 0; i < warmup; i++) ok += wr[i].ok;
        if (!ok) fatal("bench serve: the warm-up failed (%s): check --base-url, --backend and --model", wr[0].error);
        results_free(wr, warmup);
        free(wb);
        free(wbs);
        free(wls);
        free(warr);
    }

    Metrics *ms = xcalloc((size_t)n_levels, sizeof *ms);
    RunInfo *runs = xcalloc((size_t)n_levels, sizeof *runs);
    L.cap_lag = total_out + 4L * n + 1024;
    L.lag = xmalloc((size_t)L.cap_lag * sizeof *L.lag);
    int any_ok = 0;
    for (int l = 0; l < n_levels; l++) {
        int conc = levels[l] ? (levels[l] < n ? levels[l] : n) : n;
        /* Poisson arrivals: exponential gaps of mean 1/rate, drawn from --seed; with
         * --burstiness B != 1, gamma gaps of shape B and the same mean (vLLM's) */
        Rng r;
        rng_seed(&r, (uint64_t)seed * 0xD1B54A32D192ED03ull + 7);
        double t = 0;
        for (int i = 0; i < n; i++) {
            arrival[i] = t;
            if (isfinite(rate)) t += burstiness == 1.0 ? -log(unif(&r)) / rate : gamma_draw(&r, burstiness) / (rate * burstiness);
        }
        RequestResult *res = xcalloc((size_t)n, sizeof *res);
        for (int i = 0; i < n; i++) {
            res[i].cap_itl = ds.reqs[i].output_len > 1 ? ds.reqs[i].output_len : 1;
            res[i].itl = xmalloc((size_t)res[i].cap_itl * sizeof *res[i].itl);
        }
        rc.level = levels[l] ? levels[l] : n;
        L.n_lag = 0;
        json_t *info0 = server_info(baseu, headers); /* the counters before, for the acceptance length */
        double cpu0 = cpu_seconds();
        double dur = run_requests(&L, slots, conc, &rc, bodies, lens, arrival, res, n);
        double cpu = cpu_seconds() - cpu0;

        RunInfo *ri = &runs[l];
        *ri = base;
        ri->backend = backend;
        ri->output_details = details;
        ri->model = model;
        ri->tokenizer = tok_path;
        ri->dataset_name = dopt.name;
        ri->dataset_path = dopt.path;
        ri->num_prompts = n;
        ri->request_rate = rate;
        ri->burstiness = burstiness;
        ri->has_goodput = has_goodput;
        memcpy(ri->slo_ms, slo, sizeof slo);
        ri->max_concurrency = levels[l];
        ri->random_input_len = dopt.input_len;
        ri->random_output_len = dopt.output_len;
        ri->random_range_ratio = dopt.range_ratio;
        ri->fixed_output_len = dopt.fixed_output_len;
        ri->percentiles = pcts;
        ri->n_percentiles = n_pcts;
        ri->percentile_metrics = pct_metrics;
        ri->label = label;
        ri->gpus = gpus;
        Metrics *m = &ms[l];
        report_compute(m, ri, &ds, res, n, dur, tok);
        ClientOverhead *co = &m->client;
        co->chunks = L.chunks;
        co->cpu_s = cpu;
        co->cpu_us_per_chunk = L.chunks ? cpu / L.chunks * 1e6 : 0;
        co->cpu_util = dur > 0 ? cpu / dur : 0;
        if (L.n_lag) {
            qsort(L.lag, (size_t)L.n_lag, sizeof *L.lag, cmp_float);
            double s = 0;
            for (long i = 0; i < L.n_lag; i++) s += L.lag[i];
            co->lag_mean_us = s / L.n_lag * 1e6;
            co->lag_p99_us = L.lag[(long)((L.n_lag - 1) * 0.99)] * 1e6;
            co->lag_max_us = L.lag[L.n_lag - 1] * 1e6;
        }
        any_ok |= m->completed > 0;
        ri->server_info = server_info(baseu, headers);   /* after the run: the server's counters include it */
        double c0, a0, c1, a1;
        m->accept_length = -1;
        if (spec_counters(info0, &c0, &a0) && spec_counters(ri->server_info, &c1, &a1) && c1 > c0)
            m->accept_length = 1.0 + (a1 - a0) / (c1 - c0);
        json_decref(info0);
        report_print(m, ri);
        if (out_file && report_append_json(out_file, m, ri)) fatal("bench serve: cannot write %s", out_file);
        results_free(res, n);
    }
    if (n_levels > 1) report_print_sweep(ms, runs, n_levels);
    fflush(stdout);

    for (int l = 0; l < n_levels; l++) report_free(&ms[l]);
    free(ms);
    for (int l = 0; l < n_levels; l++) json_decref(runs[l].server_info);
    free(runs);
    free(L.lag);
    slots_free(slots, max_conc);
    free(slots);
    curl_multi_cleanup(L.multi);
    close(L.ep);
    curl_slist_free_all(headers);
    curl_global_cleanup();
    free(bodies);
    free(lens);
    free(arrival);
    dataset_free(&ds);
    tokenizer_free(tok);
    free(model_owned);
    free(baseu);
    return any_ok ? 0 : 1;
}
