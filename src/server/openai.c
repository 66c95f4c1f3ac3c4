/* openai: routes, request validation and the response shapes of the OpenAI API (openai.h).
 * Sections (JSON writing is apibuf.c, the command line openai_opts.c): field readers -> routing, auth and GET routes ->
 * request parsing and submission -> events to text, stop strings and chunks -> errors. */
#include "openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/util.h"
#include "apibuf.h"

#define API_POLL_EVENTS 16         /* events moved per engine_poll */

/* ---- field readers: 1 present, 0 absent or null, API_EINVAL wrong type (err set) ---- */

static int bad_field(ApiErr *err, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad_field(ApiErr *err, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->param = key;
    return API_EINVAL;
}

static int field_bool(json_t *o, const char *key, int *out, ApiErr *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_field(err, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

static int field_int(json_t *o, const char *key, long long lo, long long hi, long long *out, ApiErr *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e18)
        x = (long long)json_real_value(v);
    else return bad_field(err, key, "'%s' must be an integer", key);
    if (x < lo || x > hi) {
        if (x < lo && hi == (long long)INT32_MAX) return bad_field(err, key, "'%s' must be at least %lld, got %lld", key, lo, x);
        return bad_field(err, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    }
    *out = x;
    return 1;
}

static int field_num(json_t *o, const char *key, float *out, ApiErr *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad_field(err, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(fabs(x) <= 3.0e38)) return bad_field(err, key, "'%s' is out of range", key);
    *out = (float)x;
    return 1;
}

/* Whether v is a string equal to s over its whole length: the request body may hold NULs, and
 * "user\u0000x" is not "user" (a comparison of the C string stopped at the NUL). */
static int jstr_is(json_t *v, const char *s)
{
    return json_is_string(v) && json_string_length(v) == strlen(s) && !memcmp(json_string_value(v), s, json_string_length(v));
}

/* A string of the request for an error message: at most 64 bytes, control characters (a NUL
 * included) written as \uXXXX; the message stays one C string. */
static const char *shown(json_t *v, char *buf, size_t cap)
{
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), w = 0;
    for (size_t i = 0; i < n && i < 64 && w + 7 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20) w += (size_t)snprintf(buf + w, cap - w, "\\u%04x", c);
        else buf[w++] = (char)c;
    }
    if (n > 64 && w + 4 < cap) w += (size_t)snprintf(buf + w, cap - w, "...");
    buf[w < cap ? w : cap - 1] = 0;
    return buf;
}

/* ---- routing, authentication, GET routes ---- */

const char *openai_finish_name(FinishReason f)
{
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : f == FINISH_ABORT ? "abort" : "null";
}

const char *openai_req_finish_name(const ApiReq *r)
{
    return json_array_size(r->calls) > 0 ? "tool_calls" : openai_finish_name(r->finish);
}

int openai_route(const char *method, const char *url, ApiRoute *route, const char **allow, ApiErr *err)
{
    static const struct { const char *path; ApiRoute route; int post; } routes[] = {
        {"/v1/completions", ROUTE_COMPLETIONS, 1}, {"/v1/chat/completions", ROUTE_CHAT, 1},
        {"/v1/models", ROUTE_MODELS, 0},           {"/health", ROUTE_HEALTH, 0},
        {"/metrics", ROUTE_METRICS, 0},            {"/v1/diagnosis", ROUTE_DIAGNOSIS, 0},
        {"/get_server_info", ROUTE_SERVER_INFO, 0},
    };
    *route = ROUTE_NONE;
    int post = -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) { *route = routes[i].route; post = routes[i].post; }
    if (*route == ROUTE_NONE && !strncmp(url, "/v1/models/", 11) && url[11]) { *route = ROUTE_MODEL; post = 0; }
    if (*route == ROUTE_NONE) {
        errbuf_set(err->msg, sizeof err->msg, "Invalid URL (%s %.200s)", method, url);
        return API_ENOROUTE;
    }
    int ok = post ? !strcmp(method, "POST") : (!strcmp(method, "GET") || !strcmp(method, "HEAD"));
    *allow = post ? "POST" : "GET, HEAD";
    if (!ok) {
        errbuf_set(err->msg, sizeof err->msg, "Method %s is not allowed for %.200s (allowed: %s)", method, url, *allow);
        return API_EMETHOD;
    }
    return API_OK;
}

int openai_auth(const Api *a, ApiRoute route, const char *authorization, ApiErr *err)
{
    if (!a->api_key || route == ROUTE_HEALTH || route == ROUTE_METRICS || route == ROUTE_DIAGNOSIS) return API_OK;
    const char *key = NULL;
    if (authorization && !strncasecmp(authorization, "Bearer ", 7)) {
        key = authorization + 7;
        while (*key == ' ') key++;
    }
    /* compare in time independent of where the first difference is */
    size_t n = strlen(a->api_key), m = key ? strlen(key) : 0;
    unsigned diff = key ? (unsigned)(n != m) : 1;
    for (size_t i = 0; key && i < n; i++) diff |= (unsigned char)a->api_key[i] ^ (unsigned char)(i < m ? key[i] : 0);
    if (!diff) return API_OK;
    errbuf_set(err->msg, sizeof err->msg, key ? "Incorrect API key provided." :
               "You didn't provide an API key. Pass it as 'Authorization: Bearer KEY'.");
    err->code = "invalid_api_key";
    return API_EAUTH;
}

/* the model as /v1/models lists it under one of its names (root: the first) */
static void model_object(const Api *a, const char *name, ApiBuf *o)
{
    apibuf_puts(o, "{\"id\":");
    apibuf_jstr(o, name, strlen(name));
    apibuf_printf(o, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"moeserve\",\"root\":", (long long)a->created);
    apibuf_jstr(o, a->model_name, strlen(a->model_name));
    apibuf_printf(o, ",\"parent\":null,\"max_model_len\":%d}", a->max_model_len);
}

static int same(const char *name, size_t n, const char *s) { return s && n == strlen(s) && !memcmp(name, s, n); }

/* the served name that name[0..n) is, or NULL */
static const char *model_known(const Api *a, const char *name, size_t n)
{
    if (same(name, n, a->model_name)) return a->model_name;
    for (int i = 0; i < a->n_more_names; i++)
        if (same(name, n, a->more_names[i])) return a->more_names[i];
    return same(name, n, a->model_alias) ? a->model_alias : NULL;
}

static int no_model(const char *name, ApiErr *err)
{
    errbuf_set(err->msg, sizeof err->msg, "The model `%.200s` does not exist.", name);
    err->param = "model";
    err->code = "model_not_found";
    return API_ENOMODEL;
}

int openai_get(Api *a, ApiReq *r, const char *url, const char **content_type, ApiErr *err)
{
    apibuf_clear(&r->out);
    r->out_off = 0;
    *content_type = "application/json";
    if (__atomic_load_n(&a->loading, __ATOMIC_ACQUIRE)) { /* the listener is up before the model */
        if (r->route == ROUTE_HEALTH) {
            apibuf_puts(&r->out, "{\"status\":\"loading\"}");
            return 503;
        }
        errbuf_set(err->msg, sizeof err->msg, "the model is still loading; try again later");
        return API_EBUSY;
    }
    switch (r->route) {
    case ROUTE_HEALTH:
        apibuf_puts(&r->out, a->draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}");
        return a->draining ? 503 : 200;
    case ROUTE_MODELS:
        apibuf_puts(&r->out, "{\"object\":\"list\",\"data\":[");
        model_object(a, a->model_name, &r->out);
        for (int i = 0; i < a->n_more_names; i++) {
            apibuf_puts(&r->out, ",");
            model_object(a, a->more_names[i], &r->out);
        }
        apibuf_puts(&r->out, "]}");
        return 200;
    case ROUTE_MODEL: {
        const char *name = model_known(a, url + strlen("/v1/models/"), strlen(url + strlen("/v1/models/")));
        if (!name) return no_model(url + strlen("/v1/models/"), err);
        model_object(a, name, &r->out);
        return 200;
    }
    case ROUTE_METRICS: {
        size_t n;
        char *text = metrics_render(a->metrics, a->engine, &n);
        openai_buf_add(&r->out, text, n);
        free(text);
        if (a->ceilings) { /* the diagnosis as gauges */
            Diagnosis g;
            Deployment d;
            engine_diagnose(a->engine, a->ceilings, &a->layout, &g, &d);
            char *gauges = xcalloc(1, 16384);
            diagnosis_prometheus(&g, gauges, 16384);
            openai_buf_add(&r->out, gauges, strlen(gauges));
            free(gauges);
        }
        *content_type = "text/plain; version=0.0.4; charset=utf-8";
        return 200;
    }
    case ROUTE_SERVER_INFO: { /* the configuration, and the engine's counters now */
        EngineStats st;
        engine_stats(a->engine, &st);
        size_t n = a->server_info ? strlen(a->server_info) : 0;
        if (n > 2 && a->server_info[n - 1] == '}') {
            openai_buf_add(&r->out, a->server_info, n - 1);
            apibuf_puts(&r->out, ",");
        } else {
            apibuf_puts(&r->out, "{");
        }
        apibuf_printf(&r->out, "\"engine\":{\"running\":%d,\"waiting\":%d,\"peak_running\":%d,\"kv_blocks_total\":%d,"
                   "\"kv_blocks_used\":%d,\"preemptions\":%llu,\"steps\":%llu,\"prompt_tokens\":%llu,"
                   "\"generation_tokens\":%llu,\"spec_num_drafts\":%llu,\"spec_draft_tokens\":%llu,"
                   "\"spec_accepted_tokens\":%llu}}", st.running, st.waiting, st.peak_running, st.kv_blocks_total,
                   st.kv_blocks_used, (unsigned long long)st.preemptions, (unsigned long long)st.steps,
                   (unsigned long long)st.prompt_tokens, (unsigned long long)st.generation_tokens,
                   (unsigned long long)st.spec_chains, (unsigned long long)st.spec_draft_tokens,
                   (unsigned long long)st.spec_accepted_tokens);
        return 200;
    }
    case ROUTE_DIAGNOSIS: {
        if (!a->ceilings) {
            errbuf_set(err->msg, sizeof err->msg, "this server was started without diagnosis (--profile-every 0)");
            return API_ENOROUTE;
        }
        Diagnosis g;
        Deployment d;
        engine_diagnose(a->engine, a->ceilings, &a->layout, &g, &d);
        json_t *o = diagnosis_json(&g, &d, a->ceilings);
        EngineStats st;
        engine_stats(a->engine, &st);
        if (st.dp > 1) { /* attention data parallel: each group's requests and KV */
            json_t *arr = json_array();
            for (int k = 0; k < st.dp; k++) {
                const EngineGroupStats *gs = &st.group[k];
                json_array_append_new(arr, json_pack("{s:i, s:I, s:i, s:i, s:i, s:i}", "group", k, "requests_total",
                                                     (json_int_t)gs->placed, "running", gs->running, "waiting",
                                                     gs->waiting, "kv_blocks_total", gs->kv_blocks_total,
                                                     "kv_blocks_used", gs->kv_blocks_used));
            }
            json_object_set_new(o, "dp_groups", arr);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
        if (!s) return API_EINTERNAL;
        apibuf_puts(&r->out, s);
        free(s);
        return 200;
    }
    default:
        errbuf_set(err->msg, sizeof err->msg, "not a GET route");
        return API_EINTERNAL;
    }
}

/* ---- request parsing and submission ---- */

/* the choices after the first (n > 1) go with their request */
static void free_more(ApiReq *r)
{
    for (int i = 0; i + 1 < r->n_choices && r->more; i++) openai_req_free(&r->more[i]);
    free(r->more);
    r->more = NULL;
    free(r->prefill);
    r->prefill = NULL;
}

void openai_req_reset(ApiReq *r)
{
    enum { N_KEEP = 8 };
    free_more(r);
    ApiBuf keep[N_KEEP] = {r->text, r->out, r->lp, r->lp_off, r->head, r->stop_buf, r->reasoning, r->content};
    /* a request that needed a lot should not pin its memory for the slot's lifetime */
    for (int i = 0; i < N_KEEP; i++) {
        if (keep[i].cap > (1u << 20)) openai_buf_free(&keep[i]);
        apibuf_clear(&keep[i]);
    }
    glm_parse_free(&r->parser);
    json_decref(r->tools);
    json_decref(r->calls);
    memset(r, 0, sizeof *r);
    r->text = keep[0];
    r->out = keep[1];
    r->lp = keep[2];
    r->lp_off = keep[3];
    r->head = keep[4];
    r->stop_buf = keep[5];
    r->reasoning = keep[6];
    r->content = keep[7];
    r->logprobs = -1;
    r->skip_special = 1;
    r->n_choices = 1;
}

void openai_req_free(ApiReq *r)
{
    openai_buf_free(&r->text);
    openai_buf_free(&r->out);
    openai_buf_free(&r->lp);
    openai_buf_free(&r->lp_off);
    openai_buf_free(&r->head);
    openai_buf_free(&r->stop_buf);
    openai_buf_free(&r->reasoning);
    openai_buf_free(&r->content);
    glm_parse_free(&r->parser);
    json_decref(r->tools);
    json_decref(r->calls);
    r->tools = r->calls = NULL;
    free_more(r);
}

static const char *stop_str(const ApiReq *r, int i) { return r->stop_buf.p + r->stop_off[i]; }

static int add_stop(ApiReq *r, json_t *v, ApiErr *err)
{
    if (!json_is_string(v)) return bad_field(err, "stop", "'stop' must be a string or a list of strings");
    size_t n = json_string_length(v);
    if (n == 0) return 0; /* an empty stop string could never be meant: ignored */
    if (n > API_MAX_STOP_LEN) return bad_field(err, "stop", "a stop string is longer than %d bytes", API_MAX_STOP_LEN);
    if (r->n_stops == API_MAX_STOPS) return bad_field(err, "stop", "at most %d stop strings", API_MAX_STOPS);
    r->stop_off[r->n_stops] = (int)r->stop_buf.len;
    r->stop_len[r->n_stops++] = (int)n;
    openai_buf_add(&r->stop_buf, json_string_value(v), n + 1); /* with its NUL */
    return 0;
}

/* Every id of an encoded prompt is a row of the model's embedding: a tokenizer.json with more
 * tokens than the model has (one added token too many) encodes ids past it, which the engine
 * refuses; that is the request's prompt, named, not a full server (a 503 that clients retry). */
static int check_prompt_ids(Api *a, const int *ids, int n, const char *what, ApiErr *err)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= a->vocab) {
            const char *tok = tokenizer_token(a->text->tok, ids[i]);
            return bad_field(err, what, "the %s holds the token '%.64s' (id %d), outside the model's vocabulary [0, %d): "
                             "the tokenizer has more tokens than the model", what, tok ? tok : "?", ids[i], a->vocab);
        }
    return 0;
}

/* The prompt of /v1/completions: a string, token ids, or a list of one of those. */
static int parse_prompt(Api *a, ApiReq *r, json_t *p, int **ids, int *n, ApiErr *err)
{
    if (!p || json_is_null(p)) return bad_field(err, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        char e[256];
        *n = tokenizer_encode(a->text->tok, json_string_value(p), json_string_length(p), 1, ids, e, sizeof e);
        if (*n < 0) return bad_field(err, "prompt", "the prompt could not be tokenized: %s", e);
        if (r->echo) openai_buf_add(&r->text, json_string_value(p), json_string_length(p));
        return 0;
    }
    if (!json_is_array(p)) return bad_field(err, "prompt", "'prompt' must be a string or an array of token ids");
    size_t len = json_array_size(p);
    if (len == 0) return bad_field(err, "prompt", "the prompt is empty");
    if (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))
        return bad_field(err, "prompt", "a list of %zu prompts was sent; batched prompts are not supported: send one per request", len);
    if (len > (size_t)a->max_model_len) {
        *n = (int)len; /* the context check names it */
        return 0;
    }
    *ids = xmalloc(len * sizeof(int));
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v)) return bad_field(err, "prompt", "'prompt' must be a string or an array of token ids (integers)");
        long long t = json_integer_value(v);
        if (t < 0 || t >= a->vocab) return bad_field(err, "prompt", "token id %lld is outside the vocabulary [0, %d)", t, a->vocab);
        (*ids)[i] = (int)t;
    }
    *n = (int)len;
    if (r->echo) {
        char *text;
        size_t tl;
        tokenizer_decode(a->text->tok, *ids, *n, 0, &text, &tl);
        openai_buf_add(&r->text, text, tl);
        free(text);
    }
    return 0;
}

/* An assistant message's tool_calls, as the API returned them, into what the GLM templates
 * render: each call's "arguments" JSON text parsed into an object (the templates iterate over
 * its items). A copy in *out. */
static int parse_tool_calls(json_t *calls, size_t i, json_t **out, ApiErr *err)
{
    if (!json_is_array(calls)) return bad_field(err, "messages", "messages[%zu].tool_calls must be an array", i);
    *out = json_array();
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
        json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments"), *obj = NULL;
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(name))
            return bad_field(err, "messages", "messages[%zu].tool_calls[%zu] must be {\"id\", \"type\": \"function\", "
                             "\"function\": {\"name\", \"arguments\"}}", i, k);
        if (json_is_string(args)) {
            json_error_t je;
            obj = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
            if (!json_is_object(obj)) {
                json_decref(obj);
                return bad_field(err, "messages", "messages[%zu].tool_calls[%zu].function.arguments is not a JSON object: '%.80s'", i, k,
                                 json_string_value(args));
            }
        } else if (json_is_object(args)) {
            obj = json_incref(args);
        } else if (!args || json_is_null(args)) {
            obj = json_object();
        } else {
            return bad_field(err, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object as a string", i, k);
        }
        json_t *fc = json_copy(f), *cc = json_copy(c);
        json_object_set_new(fc, "arguments", obj);
        json_object_set_new(cc, "function", fc);
        json_array_append_new(*out, cc);
    }
    return 0;
}

/* messages -> a normalized copy the template can render: content as one string (text parts
 * joined by newlines, as vLLM does), "developer" as "system", an assistant's null content as ""
 * (the GLM templates would print "None"), its tool calls' arguments as objects. */
static int parse_messages(json_t *m, json_t **out, ApiErr *err)
{
    if (!m || json_is_null(m)) return bad_field(err, "messages", "'messages' is required");
    if (!json_is_array(m)) return bad_field(err, "messages", "'messages' must be an array");
    if (json_array_size(m) == 0) return bad_field(err, "messages", "'messages' must not be empty");
    json_t *msgs = json_array();
    *out = msgs;
    for (size_t i = 0; i < json_array_size(m); i++) {
        json_t *msg = json_array_get(m, i);
        if (!json_is_object(msg)) return bad_field(err, "messages", "messages[%zu] must be an object", i);
        json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role)) return bad_field(err, "messages", "messages[%zu].role must be a string", i);
        const char *rs = json_string_value(role);
        static const char *roles[] = {"system", "user", "assistant", "tool", "developer", "function"};
        int known = 0;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= jstr_is(role, roles[k]);
        char sb[480];
        if (!known)
            return bad_field(err, "messages", "messages[%zu].role '%s' is not one of system, user, assistant, tool, developer", i,
                             shown(role, sb, sizeof sb));
        json_t *copy = json_object();
        json_array_append_new(msgs, copy);
        json_object_update(copy, msg);
        if (!strcmp(rs, "developer")) json_object_set_new(copy, "role", json_string("system"));
        json_t *calls = json_object_get(msg, "tool_calls");
        if (!strcmp(rs, "assistant") && calls && !json_is_null(calls)) {
            json_t *norm = NULL;
            int rc = parse_tool_calls(calls, i, &norm, err);
            if (norm) json_object_set_new(copy, "tool_calls", norm);
            if (rc < 0) return rc;
        }
        json_t *id = json_object_get(msg, "tool_call_id");
        if (id && !json_is_null(id) && !json_is_string(id)) return bad_field(err, "messages", "messages[%zu].tool_call_id must be a string", i);
        json_t *c = json_object_get(msg, "content");
        if (!c || json_is_null(c)) {
            if (strcmp(rs, "assistant") != 0) return bad_field(err, "messages", "messages[%zu].content is required", i);
            json_object_set_new(copy, "content", json_string(""));
            continue;
        }
        if (json_is_string(c)) continue;
        if (!json_is_array(c)) return bad_field(err, "messages", "messages[%zu].content must be a string or an array of parts", i);
        ApiBuf joined = {0};
        apibuf_puts(&joined, "");
        for (size_t k = 0; k < json_array_size(c); k++) {
            json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
            if (!json_is_object(part) || !json_is_string(type)) {
                openai_buf_free(&joined);
                return bad_field(err, "messages", "messages[%zu].content[%zu] must be an object with a 'type'", i, k);
            }
            int is_text = jstr_is(type, "text");
            if (!is_text || !json_is_string(text)) {
                openai_buf_free(&joined);
                if (is_text) return bad_field(err, "messages", "messages[%zu].content[%zu].text must be a string", i, k);
                return bad_field(err, "messages", "messages[%zu].content[%zu]: content of type '%s' is not supported (text only)",
                                 i, k, shown(type, sb, sizeof sb));
            }
            if (k) openai_buf_add(&joined, "\n", 1);
            openai_buf_add(&joined, json_string_value(text), json_string_length(text));
        }
        json_object_set_new(copy, "content", json_stringn(joined.p, joined.len));
        openai_buf_free(&joined);
    }
    return 0;
}

/* The first word of sampling_params_check's message names the field. */
static const char *sampling_param_name(const char *msg)
{
    static const char *names[] = {"temperature", "top_p", "min_p", "top_k", "repetition_penalty",
                                  "frequency_penalty", "presence_penalty", "top_logprobs", "logprobs", "logit_bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strncmp(msg, names[i], strlen(names[i])) && msg[strlen(names[i])] == ' ') return names[i];
    return NULL;
}

static uint64_t request_serial(void)
{
    static atomic_uint_fast64_t counter;
    static uint64_t base;
    uint64_t c = atomic_fetch_add(&counter, 1);
    if (c == 0) base = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32;
    uint64_t z = base + c * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
    return z ^ (z >> 29);
}

/* id, created, and the common start of every streamed chunk */
static void begin_response(Api *a, ApiReq *r)
{
    snprintf(r->rid, sizeof r->rid, "%s-%016llx%08x", r->chat ? "chatcmpl" : "cmpl", (unsigned long long)request_serial(),
             (unsigned)(request_serial() & 0xffffffffu));
    r->created = (int64_t)time(NULL);
    apibuf_clear(&r->head);
    apibuf_printf(&r->head, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->rid,
               r->chat ? "chat.completion.chunk" : "text_completion", (long long)r->created);
    apibuf_jstr(&r->head, a->model_name, strlen(a->model_name));
    apibuf_puts(&r->head, ",\"choices\":[");
}

/* ---- chat: tools, tool_choice, reasoning ---- */

typedef enum { TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_NAMED } ToolChoice;

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A function name the GLM markup can carry: 1 to API_MAX_TOOL_NAME bytes, none of them a
 * space, a control character, '<' or '>' (the markup's delimiters) or '\' (the parser reads
 * "\n" as a separator there). */
static int tool_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > API_MAX_TOOL_NAME) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f || c == '<' || c == '>' || c == '\\') return 0;
    }
    return 1;
}

/* "tools": absent, null or [] (0), or an array of {"type": "function", "function": {"name",
 * "description"?, "parameters"?, "strict"?}} with distinct names (1). */
static int parse_tools(json_t *tools, ApiErr *err)
{
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return bad_field(err, "tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
    size_t n = json_array_size(tools);
    if (n > API_MAX_TOOLS) return bad_field(err, "tools", "at most %d tools per request, got %zu", API_MAX_TOOLS, n);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tools, i), *type = json_object_get(t, "type"), *f = json_object_get(t, "function");
        if (!json_is_object(t)) return bad_field(err, "tools", "tools[%zu] must be an object", i);
        if (!jstr_is(type, "function")) return bad_field(err, "tools", "tools[%zu].type must be \"function\"", i);
        if (!json_is_object(f)) return bad_field(err, "tools", "tools[%zu].function must be an object", i);
        json_t *name = json_object_get(f, "name"), *desc = json_object_get(f, "description");
        json_t *params = json_object_get(f, "parameters"), *strict = json_object_get(f, "strict");
        if (!json_is_string(name)) return bad_field(err, "tools", "tools[%zu].function.name is required (a string)", i);
        char sb[480];
        if (!tool_name_ok(json_string_value(name), json_string_length(name)))
            return bad_field(err, "tools", "tools[%zu].function.name '%s' is not a valid function name: 1 to %d characters, "
                             "without spaces, control characters, '<', '>' or '\\'", i, shown(name, sb, sizeof sb), API_MAX_TOOL_NAME);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return bad_field(err, "tools", "tools[%zu].function.description must be a string", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return bad_field(err, "tools", "tools[%zu].function.parameters must be a JSON schema (an object)", i);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return bad_field(err, "tools", "tools[%zu].function.strict must be a boolean", i);
        for (size_t k = 0; k < i; k++)
            if (json_equal(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name"), name))
                return bad_field(err, "tools", "tools[%zu] and tools[%zu] are both named '%s'", k, i, json_string_value(name));
    }
    return n > 0;
}

/* "tool_choice": "none", "auto" (the default with tools), "required", or {"type": "function",
 * "function": {"name"}} naming one of the tools (copied into name). */
static int parse_tool_choice(json_t *tc, json_t *tools, ToolChoice *out, char *name, ApiErr *err)
{
    static const char usage[] = "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}";
    *out = tools ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
    name[0] = 0;
    if (!tc || json_is_null(tc)) return 0;
    const char *what = "a named function";
    char sb[480];
    json_t *nm = NULL;
    if (json_is_string(tc)) {
        what = json_string_value(tc);
        if (jstr_is(tc, "none")) { *out = TOOL_CHOICE_NONE; return 0; }
        if (jstr_is(tc, "auto")) *out = TOOL_CHOICE_AUTO;
        else if (jstr_is(tc, "required")) *out = TOOL_CHOICE_REQUIRED;
        else return bad_field(err, "tool_choice", "%s; got \"%s\"", usage, shown(tc, sb, sizeof sb));
    } else {
        json_t *type = json_object_get(tc, "type"), *f = json_object_get(tc, "function");
        nm = json_object_get(f, "name");
        if (!json_is_object(tc) || !jstr_is(type, "function") || !json_is_string(nm))
            return bad_field(err, "tool_choice", "%s", usage);
        *out = TOOL_CHOICE_NAMED;
    }
    if (!tools) return bad_field(err, "tool_choice", "'tool_choice' %s%s%s needs 'tools'", nm ? "" : "\"", what, nm ? "" : "\"");
    if (!nm) return 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) if (json_equal(json_object_get(json_object_get(t, "function"), "name"), nm)) {
        snprintf(name, API_MAX_TOOL_NAME + 1, "%s", json_string_value(nm));
        return 0;
    }
    return bad_field(err, "tool_choice", "'tool_choice' names the function '%s', which is not among the tools", shown(nm, sb, sizeof sb));
}

/* A conversation whose assistant turn calls the function moeserve_probe: rendered by the chat
 * template, it shows the template's tool-call markup. */
static json_t *probe_messages(void)
{
    return json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s, s:{s:s, s:{s:s}}}]}]", "role", "user", "content", "?",
                     "role", "assistant", "content", "", "tool_calls", "id", "call_0", "type", "function", "function",
                     "name", "moeserve_probe", "arguments", "moeserve_key", "v");
}

/* The opening of a tool call (of function name, or of any function when name is NULL) to append
 * to prompt, as this template writes calls: read off a probe conversation with one call, the
 * whitespace before <tool_call> (GLM-4.5/4.6: "\n", unless the prompt ends with it; GLM-4.7:
 * none) and between the name and the first argument (GLM-4.5/4.6: "\n"; GLM-4.7: none). Nothing
 * when the template writes no <tool_call>. */
static void call_prefill(Api *a, json_t *tools, json_t *kwargs, const char *prompt, size_t np, const char *name, ApiBuf *out)
{
    static const char probe[] = "<tool_call>moeserve_probe";
    json_t *msgs = probe_messages();
    char *text = NULL, e[256];
    const char *at = NULL;
    if (model_text_render(a->text, msgs, tools, kwargs, 0, &text, e, sizeof e) == 0) at = strstr(text, probe);
    if (at) {
        const char *lead = at, *sep = at + strlen(probe), *sep_end = sep;
        while (lead > text && is_space(lead[-1])) lead--;
        while (is_space(*sep_end)) sep_end++;
        /* --tool-call-parser over the template's own markup: GLM-4.5's newline after the name, or 4.7's none */
        if (a->tool_parser) {
            sep = !strcmp(a->tool_parser, "glm45") ? "\n" : "";
            sep_end = sep + strlen(sep);
        }
        size_t nl = (size_t)(at - lead);
        if (np < nl || memcmp(prompt + np - nl, lead, nl) != 0) openai_buf_add(out, lead, nl);
        apibuf_puts(out, "<tool_call>");
        if (name) {
            apibuf_puts(out, name);
            openai_buf_add(out, sep, (size_t)(sep_end - sep));
        }
    }
    free(text);
    json_decref(msgs);
}

/* Feed the parser the next piece of generated text (and end it when final): the reasoning and
 * content it completes go to r->reasoning and r->content, its tool calls to r->calls, except
 * calls of another function than tool_choice names (logged and dropped). */
static void parse_text(ApiReq *r, const char *s, size_t n, int final)
{
    for (int pass = 0; pass < 1 + final; pass++) {
        GlmParseDelta d;
        if (pass == 0) glm_parse_feed(&r->parser, s, n, &d);
        else glm_parse_finish(&r->parser, &d);
        openai_buf_add(&r->reasoning, d.reasoning, d.reasoning_len);
        openai_buf_add(&r->content, d.content, d.content_len);
        size_t i;
        json_t *c;
        json_array_foreach(d.tool_calls, i, c) {
            const char *name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
            if (r->tool_name[0] && strcmp(name, r->tool_name) != 0) {
                log_warn("%s: tool_choice names %s but the model called %s: call dropped", r->rid, r->tool_name, name);
                continue;
            }
            if (!r->calls) r->calls = json_array();
            json_array_append(r->calls, c);
        }
    }
    if (final && r->call_required && json_array_size(r->calls) == 0)
        log_warn("%s: tool_choice asks for a tool call but the reply has none", r->rid);
}

/* The chat prompt: the messages (and the tools, unless tool_choice is "none") through the chat
 * template with chat_template_kwargs; for tool_choice "required" or a named function the
 * opening of a call after it (thinking off, unless the request sets enable_thinking: a call
 * cannot be prefilled before the thinking ends). Sets up r's parser for the output, the
 * prefilled opening fed first. *text malloc'ed, *len its length (a message may hold a NUL). */
static int chat_prompt(Api *a, ApiReq *r, json_t *root, char **text, size_t *len, ApiErr *err)
{
    json_t *kwargs = json_object_get(root, "chat_template_kwargs"), *tools = json_object_get(root, "tools");
    int add_gen = 1, rc;
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
        return bad_field(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if ((rc = field_bool(root, "add_generation_prompt", &add_gen, err)) < 0) return rc;
    int has_tools = parse_tools(tools, err);
    if (has_tools < 0) return has_tools;
    ToolChoice choice;
    if ((rc = parse_tool_choice(json_object_get(root, "tool_choice"), has_tools ? tools : NULL, &choice, r->tool_name, err)) < 0)
        return rc;
    json_t *msgs = NULL;
    if ((rc = parse_messages(json_object_get(root, "messages"), &msgs, err)) < 0) {
        json_decref(msgs);
        return rc;
    }
    int force = r->call_required = choice == TOOL_CHOICE_REQUIRED || choice == TOOL_CHOICE_NAMED;
    json_t *kw = json_is_object(kwargs) ? json_copy(kwargs) : json_object();
    if (force && !json_object_get(kw, "enable_thinking")) json_object_set_new(kw, "enable_thinking", json_false());
    if (json_object_size(kw) == 0) {
        json_decref(kw);
        kw = NULL;
    }
    if (choice != TOOL_CHOICE_NONE) r->tools = json_incref(tools);
    char e[512];
    rc = model_text_render_n(a->text, msgs, r->tools, kw, add_gen, text, len, e, sizeof e);
    json_decref(msgs);
    if (rc < 0) {
        json_decref(kw);
        return bad_field(err, "messages", "the chat template refused the messages: %s", e);
    }
    GlmParseOptions po = {.start = glm_parse_start_of(*text), .parse_tools = choice != TOOL_CHOICE_NONE, .tools = r->tools,
                          .known_only = 1, .id_seed = request_serial()};
    glm_parse_init(&r->parser, &po);
    r->popts = po;
    if (force && po.start == GLM_PARSE_START_AFTER_THINK) {
        ApiBuf pre = {0};
        call_prefill(a, r->tools, kw, *text, *len, r->tool_name[0] ? r->tool_name : NULL, &pre);
        if (pre.len) {
            r->prefill = xstrdup(pre.p);
            *text = xrealloc(*text, *len + pre.len + 1);
            memcpy(*text + *len, pre.p, pre.len + 1);
            *len += pre.len;
            parse_text(r, pre.p, pre.len, 0);
        }
        openai_buf_free(&pre);
    }
    json_decref(kw);
    return 0;
}

/* serve --script-output: the output every request is made to generate, the tokenization of the
 * file's text then the model's first eos (*ids malloc'ed). */
static int script_tokens(Api *a, int **ids, int *n, ApiErr *err)
{
    size_t len;
    char *text = file_read_all(a->script_path, &len), e[256];
    if (!text) {
        errbuf_set(err->msg, sizeof err->msg, "--script-output %s cannot be read: %s", a->script_path,
                   file_read_error(errno));
        return API_EINTERNAL;
    }
    *n = tokenizer_encode(a->text->tok, text, len, 0, ids, e, sizeof e);
    free(text);
    if (*n < 0) {
        errbuf_set(err->msg, sizeof err->msg, "--script-output %s cannot be tokenized: %s", a->script_path, e);
        return API_EINTERNAL;
    }
    if (a->text->n_eos > 0) {
        *ids = xrealloc(*ids, (size_t)(*n + 1) * sizeof(int));
        (*ids)[(*n)++] = a->text->eos_ids[0];
    }
    return 0;
}

/* Everything but the engine call; *ids and *forced (malloc'ed) and *params on success. */
static int parse_request(Api *a, ApiReq *r, json_t *root, int **ids, int **forced, RequestParams *rp, int *stop_ids, ApiErr *err)
{
    long long x;
    int rc;
    /* n choices, sampled in parallel from one prompt */
    r->n_choices = 1;
    if ((rc = field_int(root, "n", 1, INT32_MAX, &x, err)) < 0) return rc;
    if (rc && x > API_MAX_N) return bad_field(err, "n", "n = %lld is more than the %d choices a request may ask for", x, API_MAX_N);
    if (rc) r->n_choices = (int)x;
    if ((rc = field_int(root, "best_of", 1, INT32_MAX, &x, err)) < 0) return rc;
    if (rc && x < r->n_choices)
        return bad_field(err, "best_of", "best_of = %lld must be at least n = %d", x, r->n_choices);
    if (rc && x > r->n_choices)
        return bad_field(err, "best_of", "best_of = %lld is not supported: it must equal n (%d); every sampled choice is returned",
                         x, r->n_choices);
    if ((rc = field_bool(root, "stream", &r->stream, err)) < 0) return rc;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad_field(err, "stream_options", "'stream_options' must be an object");
        if (!r->stream) return bad_field(err, "stream_options", "'stream_options' is only allowed with \"stream\": true");
        if ((rc = field_bool(so, "include_usage", &r->include_usage, err)) < 0) return rc;
    }
    if (!r->chat && (rc = field_bool(root, "echo", &r->echo, err)) < 0) return rc;
    if ((rc = field_bool(root, "skip_special_tokens", &r->skip_special, err)) < 0) return rc;
    if ((rc = field_bool(root, "include_stop_str_in_output", &r->include_stop, err)) < 0) return rc;
    json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return bad_field(err, "suffix", "'suffix' is not supported");
    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *t = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(t)) return bad_field(err, "response_format", "'response_format' must be an object with a 'type'");
        char sb[480];
        if (!jstr_is(t, "text"))
            return bad_field(err, "response_format", "response_format '%s' is not supported (only 'text')", shown(t, sb, sizeof sb));
    }
    json_t *user = json_object_get(root, "user");
    if (user && !json_is_null(user) && !json_is_string(user)) return bad_field(err, "user", "'user' must be a string");

    /* sampling: the model's defaults, then the request's values */
    SamplingParams sp = a->text->defaults;
    if ((rc = field_num(root, "temperature", &sp.temperature, err)) < 0) return rc;
    if ((rc = field_num(root, "top_p", &sp.top_p, err)) < 0) return rc;
    if ((rc = field_num(root, "min_p", &sp.min_p, err)) < 0) return rc;
    if ((rc = field_num(root, "repetition_penalty", &sp.repetition_penalty, err)) < 0) return rc;
    if ((rc = field_num(root, "frequency_penalty", &sp.frequency_penalty, err)) < 0) return rc;
    if ((rc = field_num(root, "presence_penalty", &sp.presence_penalty, err)) < 0) return rc;
    if ((rc = field_int(root, "top_k", -1, INT32_MAX, &x, err)) < 0) return rc;
    if (rc) sp.top_k = (int)x;
    if ((rc = field_int(root, "seed", INT64_MIN, INT64_MAX, &x, err)) < 0) return rc;
    /* any int64 seeds; without one, serve's --seed, else the clock (< 0) */
    sp.seed = rc ? (int64_t)((uint64_t)x & (uint64_t)INT64_MAX) : a->seeded ? a->default_seed : -1;
    sp.logprobs = -1;
    if (r->chat) {
        int lp = 0;
        if ((rc = field_bool(root, "logprobs", &lp, err)) < 0) return rc;
        if ((rc = field_int(root, "top_logprobs", 0, SAMPLER_MAX_LOGPROBS, &x, err)) < 0) return rc;
        if (rc && x > 0 && !lp) return bad_field(err, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
        if (lp) sp.logprobs = rc ? (int)x : 0;
    } else {
        if ((rc = field_int(root, "logprobs", 0, SAMPLER_MAX_LOGPROBS, &x, err)) < 0) return rc;
        if (rc) sp.logprobs = (int)x;
    }
    r->logprobs = sp.logprobs;
    /* logit_bias: {"token id": bias in [-100, 100]} (the OpenAI form; vLLM and SGLang take it too) */
    sp.n_bias = 0;
    json_t *bias = json_object_get(root, "logit_bias");
    if (bias && !json_is_null(bias)) {
        if (!json_is_object(bias)) return bad_field(err, "logit_bias", "'logit_bias' must be an object of token ids to biases");
        if (json_object_size(bias) > SAMPLER_MAX_BIAS)
            return bad_field(err, "logit_bias", "'logit_bias' holds %zu tokens, at most %d", json_object_size(bias), SAMPLER_MAX_BIAS);
        const char *key;
        json_t *v;
        json_object_foreach(bias, key, v) {
            char *end = NULL;
            errno = 0;
            long long id = strtoll(key, &end, 10);
            if (!*key || *end || errno || id < 0 || id >= a->vocab)
                return bad_field(err, "logit_bias", "logit_bias key '%.32s' is not a token id in [0, %d)", key, a->vocab);
            if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
                return bad_field(err, "logit_bias", "logit_bias['%.32s'] must be a number in [-100, 100]", key);
            for (int j = 0; j < sp.n_bias; j++) /* "5", "05" and " 5": one token, two biases that would add up */
                if (sp.bias_id[j] == (int)id)
                    return bad_field(err, "logit_bias", "logit_bias key '%.32s' names token %lld, which another key names too", key, id);
            sp.bias_id[sp.n_bias] = (int)id;
            sp.bias_val[sp.n_bias++] = (float)json_number_value(v);
        }
    }
    const char *bad = sampling_params_check(&sp);
    if (bad) {
        errbuf_set(err->msg, sizeof err->msg, "%s", bad);
        err->param = sampling_param_name(bad);
        return API_EINVAL;
    }

    /* stops */
    json_t *stop = json_object_get(root, "stop");
    if (json_is_array(stop)) {
        for (size_t i = 0; i < json_array_size(stop); i++)
            if ((rc = add_stop(r, json_array_get(stop, i), err)) < 0) return rc;
    } else if (stop && !json_is_null(stop) && (rc = add_stop(r, stop, err)) < 0) return rc;
    int n_stop_ids = 0;
    json_t *sti = json_object_get(root, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti)) return bad_field(err, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (json_array_size(sti) > API_MAX_STOP_IDS) return bad_field(err, "stop_token_ids", "at most %d stop_token_ids", API_MAX_STOP_IDS);
        for (size_t i = 0; i < json_array_size(sti); i++) {
            json_t *v = json_array_get(sti, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= a->vocab)
                return bad_field(err, "stop_token_ids", "stop_token_ids[%zu] is not a token id in [0, %d)", i, a->vocab);
            stop_ids[n_stop_ids++] = (int)json_integer_value(v);
        }
    }
    int ignore_eos = 0;
    if ((rc = field_bool(root, "ignore_eos", &ignore_eos, err)) < 0) return rc;

    /* output length: max_completion_tokens wins over max_tokens */
    long long max_tokens = -1;
    if ((rc = field_int(root, "max_tokens", 1, INT32_MAX, &max_tokens, err)) < 0) return rc;
    if (r->chat && (rc = field_int(root, "max_completion_tokens", 1, INT32_MAX, &max_tokens, err)) < 0) return rc;

    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) return bad_field(err, "model", "'model' must be a string");

    /* the prompt's tokens */
    int n = 0;
    if (r->chat) {
        char *text = NULL, e[512];
        size_t len = 0;
        if ((rc = chat_prompt(a, r, root, &text, &len, err)) < 0) return rc;
        n = tokenizer_encode(a->text->tok, text, len, 0, ids, e, sizeof e);
        free(text);
        if (n < 0) return bad_field(err, "messages", "the messages could not be tokenized: %s", e);
    } else if ((rc = parse_prompt(a, r, json_object_get(root, "prompt"), ids, &n, err)) < 0) return rc;
    r->gen_start = r->text.len;
    const char *what = r->chat ? "messages" : "prompt";
    if (n == 0) return bad_field(err, what, "the prompt is empty (it encodes to no tokens)");
    if (*ids && (rc = check_prompt_ids(a, *ids, n, what, err)) < 0) return rc;
    if (max_tokens < 0) max_tokens = r->chat ? (long long)a->max_model_len - n : 16;
    if (n >= a->max_model_len || n + max_tokens > a->max_model_len) {
        errbuf_set(err->msg, sizeof err->msg, "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                   "(%d in the %s, %lld in the completion). Please reduce the length of the %s or completion.",
                   a->max_model_len, n + (max_tokens > 0 ? max_tokens : 1), n, what, max_tokens > 0 ? max_tokens : 1, what);
        err->param = what;
        err->code = "context_length_exceeded";
        return API_EINVAL;
    }

    /* the model, once the body is known to be well-formed: a malformed request is a 400 whatever
     * model it names (as vLLM) */
    if (model && !json_is_null(model) && !model_known(a, json_string_value(model), json_string_length(model))) {
        char sb[480];
        return no_model(shown(model, sb, sizeof sb), err);
    }
    r->n_prompt = n;
    int n_forced = 0;
    if (a->script_path && (rc = script_tokens(a, forced, &n_forced, err)) < 0) return rc;
    *rp = (RequestParams){.prompt = *ids, .n_prompt = n, .sampling = sp, .max_tokens = (int)max_tokens,
                          .ignore_eos = ignore_eos, .stop_ids = stop_ids, .n_stop_ids = n_stop_ids,
                          .forced = *forced, .n_forced = n_forced};
    return 0;
}

static void emit_chunk_start(ApiReq *r)
{
    apibuf_puts(&r->out, "data: ");
    openai_buf_add(&r->out, r->head.p, r->head.len);
}

/* Choice i of r (i >= 1): r's options, its own engine request (r->id + i), text and parser. */
static void choice_init(Api *a, const ApiReq *r, ApiReq *c, int i)
{
    openai_req_reset(c);
    c->route = r->route;
    c->chat = r->chat, c->stream = r->stream, c->echo = r->echo, c->skip_special = r->skip_special;
    c->include_stop = r->include_stop, c->logprobs = r->logprobs;
    openai_buf_add(&c->stop_buf, r->stop_buf.p, r->stop_buf.len);
    memcpy(c->stop_off, r->stop_off, sizeof c->stop_off);
    memcpy(c->stop_len, r->stop_len, sizeof c->stop_len);
    c->n_stops = r->n_stops;
    c->id = r->id + (uint64_t)i;
    c->index = i;
    c->n_prompt = r->n_prompt;
    openai_buf_add(&c->text, r->text.p, r->gen_start); /* the echoed prompt */
    c->gen_start = r->gen_start;
    detok_init(&c->dt, a->text->tok, c->chat ? 0 : c->skip_special);
    openai_buf_add(&c->head, r->head.p, r->head.len);
    memcpy(c->rid, r->rid, sizeof c->rid);
    c->created = r->created;
    if (c->chat) {
        c->tools = json_incref(r->tools);
        c->call_required = r->call_required;
        memcpy(c->tool_name, r->tool_name, sizeof c->tool_name);
        GlmParseOptions po = r->popts;
        po.tools = c->tools;
        po.id_seed = request_serial(); /* call ids differ between choices */
        glm_parse_init(&c->parser, &po);
        if (r->prefill) parse_text(c, r->prefill, strlen(r->prefill), 0);
    }
}

/* Streaming: a choice's first chunks (chat: the role; completions: the echoed prompt). */
static void stream_open(ApiReq *r)
{
    if (r->stream && r->chat) {
        emit_chunk_start(r);
        apibuf_printf(&r->out, "{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                   "\"finish_reason\":null}]}\n\n", r->index);
    }
    if (r->stream && r->gen_start > 0) { /* the echoed prompt */
        emit_chunk_start(r);
        apibuf_printf(&r->out, "{\"index\":%d,\"text\":", r->index);
        apibuf_jstr(&r->out, r->text.p, r->gen_start);
        apibuf_puts(&r->out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        r->sent = r->gen_start;
    }
}

/* A choice's new chunks go out with the request's (whole SSE events, in the order made). */
static void move_out(ApiReq *r, ApiReq *c)
{
    openai_buf_add(&r->out, c->out.p, c->out.len);
    apibuf_clear(&c->out);
}

int openai_start(Api *a, ApiReq *r, const char *body, size_t len, EngineNotify notify, void *user, ApiErr *err)
{
    r->chat = r->route == ROUTE_CHAT;
    if (__atomic_load_n(&a->loading, __ATOMIC_ACQUIRE)) {
        errbuf_set(err->msg, sizeof err->msg, "the model is still loading; try again later");
        return API_EBUSY;
    }
    if (len == 0) return bad_field(err, NULL, "the request body is empty: expected a JSON object");
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_invalid_utf8)
            errbuf_set(err->msg, sizeof err->msg, "the request body is not valid JSON: invalid UTF-8 at byte %d", je.position);
        else
            errbuf_set(err->msg, sizeof err->msg, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                       je.column);
        return API_EINVAL;
    }
    int *ids = NULL, *forced = NULL, stop_ids[API_MAX_STOP_IDS];
    RequestParams rp;
    int rc = json_is_object(root) ? parse_request(a, r, root, &ids, &forced, &rp, stop_ids, err)
                                  : bad_field(err, NULL, "the request body must be a JSON object");
    json_decref(root);
    if (rc == 0 && a->draining) {
        errbuf_set(err->msg, sizeof err->msg, "the server is shutting down");
        rc = API_EBUSY;
    }
    if (rc < 0) {
        free(ids);
        free(forced);
        return rc;
    }
    /* chat output keeps its special tokens for the parser; drop_token applies skip_special */
    detok_init(&r->dt, a->text->tok, r->chat ? 0 : r->skip_special);
    begin_response(a, r);
    char e[256];
    /* what the engine would refuse in the request itself is the client's (400); what is left of
     * engine_submit's refusals is a full queue or a stop (503, to retry) */
    if (engine_check(a->engine, &rp, e, sizeof e) != 0) {
        free(ids);
        free(forced);
        errbuf_set(err->msg, sizeof err->msg, "the request cannot be served: %s", e);
        return API_EINVAL;
    }
    r->id = engine_submit_n(a->engine, &rp, r->n_choices, notify, user, e, sizeof e);
    free(ids);
    free(forced);
    if (!r->id) {
        errbuf_set(err->msg, sizeof err->msg, "the server is overloaded: %s; try again later", e);
        return API_EBUSY;
    }
    if (r->n_choices > 1) {
        r->more = xcalloc(r->n_choices - 1, sizeof *r->more);
        for (int i = 1; i < r->n_choices; i++) choice_init(a, r, &r->more[i - 1], i);
    }
    for (int i = 0; i < r->n_choices; i++) stream_open(i ? &r->more[i - 1] : r);
    for (int i = 1; i < r->n_choices; i++) move_out(r, &r->more[i - 1]);
    return API_OK;
}

void openai_cancel(Api *a, ApiReq *r)
{
    if (r->id && !r->finished) engine_cancel(a->engine, r->id);
    r->finished = 1;
    for (int i = 0; i + 1 < r->n_choices && r->more; i++) openai_cancel(a, &r->more[i]);
}

/* ---- events to text, stop strings and chunks ---- */

/* The earliest stop string in the generated text that ends after byte old_len (earlier text
 * was searched before); its start, or -1, and its end in *end (of two that start there, the
 * shorter: it was complete first). */
static long stop_find(const ApiReq *r, size_t old_len, size_t *end)
{
    long best = -1;
    for (int i = 0; i < r->n_stops; i++) {
        size_t L = (size_t)r->stop_len[i], from = old_len > L - 1 ? old_len - (L - 1) : 0;
        if (from < r->gen_start) from = r->gen_start;
        if (from >= r->text.len) continue;
        const char *p = memmem(r->text.p + from, r->text.len - from, stop_str(r, i), L);
        long at = p ? p - r->text.p : -1;
        if (at >= 0 && (best < 0 || at < best || (at == best && (size_t)at + L < *end))) {
            best = at;
            *end = (size_t)at + L;
        }
    }
    return best;
}

/* Bytes at the end of the text that could still grow into a stop string (the longest suffix
 * that is a proper prefix of one); they are not streamed yet. */
static size_t stop_holdback(const ApiReq *r)
{
    size_t hold = 0, gen = r->text.len - r->gen_start;
    if (r->include_stop) return 0; /* a stop string is returned too: nothing to hold back */
    for (int i = 0; i < r->n_stops; i++) {
        const char *s = stop_str(r, i);
        size_t L = (size_t)r->stop_len[i], kmax = L - 1 < gen ? L - 1 : gen;
        for (size_t k = kmax; k > hold; k--)
            if (r->text.p[r->text.len - k] == s[0] && !memcmp(r->text.p + r->text.len - k, s, k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* A token's text for logprobs (special tokens included, as decoded alone). */
static void token_json(Api *a, ApiBuf *o, int id, int with_bytes)
{
    char *s;
    size_t n;
    tokenizer_decode(a->text->tok, &id, 1, 0, &s, &n);
    apibuf_jstr(o, s, n);
    if (with_bytes) {
        apibuf_puts(o, ",\"bytes\":[");
        for (size_t i = 0; i < n; i++) apibuf_printf(o, "%s%u", i ? "," : "", (unsigned char)s[i]);
        apibuf_puts(o, "]");
    }
    free(s);
}

/* The logprobs object of the tokens recorded in r->lp (OpenAI's completions or chat shape). */
static void emit_logprobs(Api *a, ApiReq *r)
{
    const EngineEvent *ev = (const EngineEvent *)r->lp.p;
    const size_t *off = (const size_t *)r->lp_off.p;
    size_t n = r->lp.len / sizeof(EngineEvent);
    ApiBuf *o = &r->out;
    if (r->chat) {
        apibuf_puts(o, "{\"content\":[");
        for (size_t i = 0; i < n; i++) {
            apibuf_puts(o, i ? ",{\"token\":" : "{\"token\":");
            token_json(a, o, ev[i].token, 1);
            apibuf_puts(o, ",\"logprob\":");
            apibuf_logprob(o, ev[i].logprob);
            apibuf_puts(o, ",\"top_logprobs\":[");
            for (int k = 0; k < ev[i].n_top; k++) {
                apibuf_puts(o, k ? ",{\"token\":" : "{\"token\":");
                token_json(a, o, ev[i].top_ids[k], 1);
                apibuf_puts(o, ",\"logprob\":");
                apibuf_logprob(o, ev[i].top_logprobs[k]);
                apibuf_puts(o, "}");
            }
            apibuf_puts(o, "]}");
        }
        apibuf_puts(o, "]}");
        return;
    }
    apibuf_puts(o, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) apibuf_puts(o, ",");
        token_json(a, o, ev[i].token, 0);
    }
    apibuf_puts(o, "],\"token_logprobs\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) apibuf_puts(o, ",");
        apibuf_logprob(o, ev[i].logprob);
    }
    apibuf_puts(o, "],\"top_logprobs\":[");
    for (size_t i = 0; i < n; i++) {
        /* a dict keyed by token text: the first of equal texts wins (keys must be unique) */
        apibuf_puts(o, i ? ",{" : "{");
        int ids[SAMPLER_MAX_LOGPROBS];
        int nk = 0;
        for (int k = 0; k < ev[i].n_top; k++) {
            char *s, *t;
            size_t sl, tl;
            int dup = 0;
            tokenizer_decode(a->text->tok, &ev[i].top_ids[k], 1, 0, &s, &sl);
            for (int j = 0; j < nk && !dup; j++) {
                tokenizer_decode(a->text->tok, &ids[j], 1, 0, &t, &tl);
                dup = tl == sl && !memcmp(s, t, sl);
                free(t);
            }
            if (!dup) {
                if (nk) apibuf_puts(o, ",");
                apibuf_jstr(o, s, sl);
                apibuf_puts(o, ":");
                apibuf_logprob(o, ev[i].top_logprobs[k]);
                ids[nk++] = ev[i].top_ids[k];
            }
            free(s);
        }
        apibuf_puts(o, "}");
    }
    apibuf_puts(o, "],\"text_offset\":[");
    for (size_t i = 0; i < n; i++) apibuf_printf(o, "%s%zu", i ? "," : "", off[i]);
    apibuf_puts(o, "]}");
}

static void emit_usage(ApiReq *r)
{
    apibuf_printf(&r->out, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->n_prompt,
               r->total_completion, r->n_prompt + r->total_completion);
}

/* A parsed tool call: {"index" (when index >= 0: a streamed delta), "id", "type", "function"}. */
static void emit_call(ApiBuf *o, json_t *c, long index)
{
    json_t *id = json_object_get(c, "id"), *f = json_object_get(c, "function");
    json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
    apibuf_puts(o, "{");
    if (index >= 0) apibuf_printf(o, "\"index\":%ld,", index);
    apibuf_puts(o, "\"id\":");
    apibuf_jstr(o, json_string_value(id), json_string_length(id));
    apibuf_puts(o, ",\"type\":\"function\",\"function\":{\"name\":");
    apibuf_jstr(o, json_string_value(name), json_string_length(name));
    apibuf_puts(o, ",\"arguments\":");
    apibuf_jstr(o, json_string_value(args), json_string_length(args));
    apibuf_puts(o, "}}");
}

/* The fields of a chat delta, in the shape of glm_parse_delta_json: the parsed reasoning and
 * content not yet sent, the tool calls not yet sent; then they count as sent. */
static void emit_delta(ApiReq *r)
{
    const char *sep = "";
    if (r->reasoning.len) {
        apibuf_puts(&r->out, "\"reasoning_content\":");
        apibuf_jstr(&r->out, r->reasoning.p, r->reasoning.len);
        sep = ",";
    }
    if (r->content.len) {
        apibuf_printf(&r->out, "%s\"content\":", sep);
        apibuf_jstr(&r->out, r->content.p, r->content.len);
        sep = ",";
    }
    size_t n_calls = json_array_size(r->calls);
    if (n_calls > r->calls_sent) {
        apibuf_printf(&r->out, "%s\"tool_calls\":[", sep);
        for (size_t i = r->calls_sent; i < n_calls; i++) {
            if (i > r->calls_sent) apibuf_puts(&r->out, ",");
            emit_call(&r->out, json_array_get(r->calls, i), (long)i);
        }
        apibuf_puts(&r->out, "]");
    }
    apibuf_clear(&r->reasoning);
    apibuf_clear(&r->content);
    r->calls_sent = n_calls;
}

/* One SSE chunk: text[sent..upto) (chat: what the parser makes of it) and the pending logprobs;
 * the finish reason on the last. */
static void emit_stream_chunk(Api *a, ApiReq *r, size_t upto, int final)
{
    size_t n = upto > r->sent ? upto - r->sent : 0;
    int has_lp = r->logprobs >= 0 && r->lp.len > 0;
    if (r->chat && !r->parsed) {
        r->parsed = final || r->stopped; /* a stop string ends the text before the final event */
        parse_text(r, r->text.p + r->sent, n, r->parsed);
        r->sent = upto;
    }
    if (r->chat) n = r->reasoning.len + r->content.len + (json_array_size(r->calls) - r->calls_sent);
    if (!n && !has_lp && !final) return; /* nothing to say (a character, a stop prefix or markup held back) */
    emit_chunk_start(r);
    if (r->chat) {
        apibuf_printf(&r->out, "{\"index\":%d,\"delta\":{", r->index);
        emit_delta(r);
        apibuf_puts(&r->out, "}");
    } else {
        apibuf_printf(&r->out, "{\"index\":%d,\"text\":", r->index);
        apibuf_jstr(&r->out, r->text.p + r->sent, n);
    }
    apibuf_puts(&r->out, ",\"logprobs\":");
    if (has_lp) emit_logprobs(a, r);
    else apibuf_puts(&r->out, "null");
    apibuf_clear(&r->lp);
    apibuf_clear(&r->lp_off);
    if (final) apibuf_printf(&r->out, ",\"finish_reason\":\"%s\"}]}\n\n", openai_req_finish_name(r));
    else apibuf_puts(&r->out, ",\"finish_reason\":null}]}\n\n");
    r->sent = upto;
}

/* One choice of a non-streaming response into o. */
static void emit_choice(Api *a, ApiReq *r, ApiBuf *o)
{
    apibuf_printf(o, "{\"index\":%d,", r->index);
    if (r->chat) {
        /* content is null when the reply is only reasoning and tool calls */
        size_t n_calls = json_array_size(r->calls);
        apibuf_puts(o, "\"message\":{\"role\":\"assistant\",\"content\":");
        if (r->content.len || (!r->reasoning.len && !n_calls)) apibuf_jstr(o, r->content.p ? r->content.p : "", r->content.len);
        else apibuf_puts(o, "null");
        if (r->reasoning.len) {
            apibuf_puts(o, ",\"reasoning_content\":");
            apibuf_jstr(o, r->reasoning.p, r->reasoning.len);
        }
        if (n_calls) {
            apibuf_puts(o, ",\"tool_calls\":[");
            for (size_t i = 0; i < n_calls; i++) {
                if (i) apibuf_puts(o, ",");
                emit_call(o, json_array_get(r->calls, i), -1);
            }
            apibuf_puts(o, "]");
        }
        apibuf_puts(o, ",\"refusal\":null},\"logprobs\":");
    } else {
        apibuf_puts(o, "\"text\":");
        apibuf_jstr(o, r->text.p, r->text.len);
        apibuf_puts(o, ",\"logprobs\":");
    }
    if (r->logprobs >= 0) emit_logprobs(a, r);
    else apibuf_puts(o, "null");
    apibuf_printf(o, ",\"finish_reason\":\"%s\"}", openai_req_finish_name(r));
}

/* The whole response of a non-streaming request. */
static void emit_body(Api *a, ApiReq *r)
{
    ApiBuf *o = &r->out;
    apibuf_printf(o, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->rid,
               r->chat ? "chat.completion" : "text_completion", (long long)r->created);
    apibuf_jstr(o, a->model_name, strlen(a->model_name));
    apibuf_puts(o, ",\"choices\":[");
    for (int i = 0; i < r->n_choices; i++) {
        if (i) apibuf_puts(o, ",");
        emit_choice(a, i ? &r->more[i - 1] : r, o);
    }
    apibuf_puts(o, "],");
    emit_usage(r);
    apibuf_puts(o, "}");
}

static void text_append(ApiReq *r, const char *s, size_t n)
{
    size_t old = r->text.len;
    openai_buf_add(&r->text, s, n);
    if (r->n_stops == 0 || r->stopped) return;
    size_t end = 0;
    long at = stop_find(r, old, &end);
    if (at >= 0) {
        /* what follows the stop string is not returned, nor the stop string itself unless
         * include_stop_str_in_output */
        r->text.len = r->include_stop ? end : (size_t)at;
        r->text.p[r->text.len] = 0;
        r->stopped = 1;
    }
}

/* Chat output is detokenized with its special tokens (the parser needs <think>, <tool_call> and
 * the argument tags, special tokens of the GLM tokenizers); skip_special_tokens drops the others
 * here, as the detokenizer would have. */
static int drop_token(const Api *a, const ApiReq *r, int id)
{
    static const char *const markup[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
    if (!r->chat || !r->skip_special || !tokenizer_is_special(a->text->tok, id)) return 0;
    const char *s = tokenizer_token(a->text->tok, id);
    for (size_t i = 0; s && i < sizeof markup / sizeof markup[0]; i++)
        if (!strcmp(s, markup[i])) return 0;
    return 1;
}

static void handle_event(Api *a, ApiReq *r, const EngineEvent *ev)
{
    int final = ev->finish != FINISH_NONE;
    if (ev->token >= 0 && !r->stopped) {
        r->n_gen++;
        metrics_req_token(&r->mr);
        if (r->logprobs >= 0) {
            size_t off = r->text.len;
            openai_buf_add(&r->lp, ev, sizeof *ev);
            openai_buf_add(&r->lp_off, &off, sizeof off);
        }
        /* an eos or stop token id ends the text without adding to it (its text is not returned) */
        if (!(final && ev->finish == FINISH_STOP) && !drop_token(a, r, ev->token)) {
            char piece[4096];
            int n = detok_push(&r->dt, ev->token, piece, sizeof piece);
            if (n > 0) text_append(r, piece, (size_t)n);
        }
        if (r->stopped && !final) engine_finish(a->engine, r->id);
    }
    if (final) {
        r->finished = 1;
        if (!r->stopped) {
            char tail[16];
            int n = detok_flush(&r->dt, tail, sizeof tail);
            if (n > 0) text_append(r, tail, (size_t)n);
        }
        r->finish = r->stopped ? FINISH_STOP : ev->finish;
        /* usage: the engine's count, or ours when a stop string cut the output short */
        r->completion_tokens = r->stopped ? r->n_gen : ev->completion_tokens;
    }
    if (!r->stream) {
        if (r->finished && r->chat) parse_text(r, r->text.p, r->text.len, r->parsed = 1);
        return;
    }
    size_t upto = r->finished || r->stopped ? r->text.len : r->text.len - stop_holdback(r);
    emit_stream_chunk(a, r, upto, r->finished);
}

/* One choice's pending events; 1 once it has finished. */
static int pump_choice(Api *a, ApiReq *r)
{
    EngineEvent ev[API_POLL_EVENTS];
    while (!r->finished) {
        int n = engine_poll(a->engine, r->id, ev, API_POLL_EVENTS);
        for (int i = 0; i < n && !r->finished; i++) handle_event(a, r, &ev[i]);
        if (n < API_POLL_EVENTS) break;
    }
    return r->finished;
}

int openai_pump(Api *a, ApiReq *r)
{
    if (r->done) return 1;
    int all = pump_choice(a, r);
    for (int i = 1; i < r->n_choices; i++) {
        all &= pump_choice(a, &r->more[i - 1]);
        move_out(r, &r->more[i - 1]);
    }
    if (!all) return 0;
    /* usage as vLLM counts it: the prompt once, the completions of every choice */
    r->total_completion = 0;
    for (int i = 0; i < r->n_choices; i++) r->total_completion += (i ? &r->more[i - 1] : r)->completion_tokens;
    if (!r->stream) emit_body(a, r);
    else {
        if (r->include_usage) {
            emit_chunk_start(r);
            apibuf_puts(&r->out, "],");
            emit_usage(r);
            apibuf_puts(&r->out, "}\n\n");
        }
        apibuf_puts(&r->out, "data: [DONE]\n\n");
    }
    r->done = 1;
    return 1;
}

/* ---- errors ---- */

int openai_error(int rc, const ApiErr *err, ApiBuf *out)
{
    static const struct { int rc, status; const char *type; } map[] = {
        {API_EINVAL, 400, "invalid_request_error"}, {API_EAUTH, 401, "invalid_request_error"},
        {API_ENOROUTE, 404, "invalid_request_error"}, {API_ENOMODEL, 404, "invalid_request_error"},
        {API_EMETHOD, 405, "invalid_request_error"}, {API_ETOOBIG, 413, "invalid_request_error"},
        {API_EBUSY, 503, "server_error"}, {API_EINTERNAL, 500, "server_error"},
        {API_ENOTIMPL, 501, "invalid_request_error"},
    };
    int status = 500;
    const char *type = "server_error";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].rc == rc) { status = map[i].status; type = map[i].type; }
    apibuf_clear(out);
    apibuf_puts(out, "{\"error\":{\"message\":");
    const char *msg = err && err->msg[0] ? err->msg : "internal error";
    apibuf_jstr(out, msg, strlen(msg));
    apibuf_printf(out, ",\"type\":\"%s\",\"param\":", type);
    if (err && err->param) apibuf_jstr(out, err->param, strlen(err->param));
    else apibuf_puts(out, "null");
    apibuf_puts(out, ",\"code\":");
    if (err && err->code) apibuf_jstr(out, err->code, strlen(err->code));
    else apibuf_puts(out, "null");
    apibuf_puts(out, "}}");
    return status;
}

const char *openai_template_tool_parser(const Api *a)
{
    static const char probe[] = "<tool_call>moeserve_probe";
    json_t *msgs = probe_messages();
    char *text = NULL, e[256];
    const char *at = NULL, *r = NULL;
    if (a->text->chat && model_text_render(a->text, msgs, NULL, NULL, 0, &text, e, sizeof e) == 0) at = strstr(text,
    probe);
    if (at) r = at[strlen(probe)] == '\n' ? "glm45" : "glm47";
    free(text);
    json_decref(msgs);
    return r;
}
