/* test_server_defaults: what `moeserve serve` picks by itself (src/engine/engine.c, src/cli/cmd_serve.c,
 * src/backend/cpu/cpu.c) and n > 1 choices (src/server/openai.c), over real loopback HTTP
 * (tests/server_harness.c): the context from config.json, reported as /v1/models max_model_len
 * and enforced with vLLM's 400; shortened with a warning where one request of it does not fit
 * the KV pool; the built-in model's resident memory at start (its KV pool is not touched before
 * use); a taken port failing at once, before the model loads.
 * Run: make test FILTER=defaults (the n > 1 tests are server_n_*, so they also run under ASan). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "server/openai.h"
#include "server_harness.h"

/* A copy of the test model whose config.json says max_position_embeddings = ctx (made once per
 * ctx and run); its path. */
static const char *model_with_context(int ctx)
{
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/ctx-%d", test_tmpdir(), ctx);
    struct stat sb;
    if (stat(dir, &sb) == 0) return dir;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", model_dir(), dir);
    if (test_run(cmd, NULL) != 0) return NULL;
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    if (!c) return NULL;
    json_object_set_new(c, "max_position_embeddings", json_integer(ctx));
    int rc = json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    return rc == 0 ? dir : NULL;
}

static long long models_max_len(int port)
{
    Resp r;
    if (http(port, "GET", "/v1/models", NULL, NULL, &r) != 0) return -1;
    json_t *j = body_json(&r);
    long long v = j && json_is_integer(jget(j, "data.0.max_model_len")) ? jint(j, "data.0.max_model_len") : -1;
    json_decref(j);
    resp_free(&r);
    return v;
}

/* a completion request of n prompt token ids and max_tokens 1 */
static void post_ids(int port, int n, Resp *r)
{
    ApiBuf b = {0};
    openai_buf_add(&b, "{\"max_tokens\":1,\"prompt\":[", 26);
    for (int i = 0; i < n; i++) openai_buf_add(&b, i ? ",17" : "17", i ? 3 : 2);
    openai_buf_add(&b, "]}", 2);
    post(port, "/v1/completions", b.p, r);
    openai_buf_free(&b);
}

static int log_has(const Srv *s, const char *what)
{
    char *t = file_read_all(s->log, NULL);
    int has = t && strstr(t, what);
    free(t);
    return has;
}

/* The context is config.json's (8192 here, past the old fixed 4096): /v1/models says so, a
 * 5000-token prompt is served, one past the context is vLLM's 400. */
TEST(defaults_context_from_config)
{
    const char *dir = model_with_context(8192);
    ASSERT(dir, "the model copy");
    Srv s;
    ASSERT(srv_start_model(&s, "ctx8192", dir, "--num-kv-blocks 1024") == 0);
    EXPECT_EQ_INT(models_max_len(s.port), 8192);
    EXPECT(log_has(&s, "context 8192 tokens"), "the start-up line names the context");
    Resp r;
    post_ids(s.port, 5000, &r);
    EXPECT(r.status == 200, "a 5000-token prompt under an 8192 context: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    post_ids(s.port, 8200, &r);
    expect_error(__FILE__, __LINE__, "8200 ids", &r, 400, "invalid_request_error", "maximum context length is 8192 tokens",
                 "prompt");
    json_t *j = body_json(&r);
    EXPECT(j && jstr(j, "error.code") && !strcmp(jstr(j, "error.code"), "context_length_exceeded"));
    json_decref(j);
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
}

/* One request of the model's context does not fit the pool: the context is shortened to the pool
 * with a warning (the server starts); an explicit --max-model-len that does not fit still stops
 * it with the numbers. */
TEST(defaults_context_capped_to_kv)
{
    const char *dir = model_with_context(8192);
    ASSERT(dir, "the model copy");
    Srv s;
    ASSERT(srv_start_model(&s, "ctx-capped", dir, "--num-kv-blocks 100") == 0, "100 blocks of 16 under an 8192 context");
    EXPECT_EQ_INT(models_max_len(s.port), 1600);
    EXPECT(log_has(&s, "max_model_len is 1600"), "the warning says the context served");
    Resp r;
    post_ids(s.port, 1700, &r);
    expect_error(__FILE__, __LINE__, "1700 ids", &r, 400, "invalid_request_error", "maximum context length is 1600 tokens",
                 "prompt");
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' serve --model '%s' --device cpu --port 0 --num-kv-blocks 100 --max-model-len 4096 </dev/null",
             test_bin(), dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc != 0 && rc < 128, "an explicit --max-model-len past the pool: exit %d", rc);
    EXPECT(out && strstr(out, "--max-model-len"), "%s", out ? out : "");
    free(out);
}

/* The built-in model (4096 context, 64 running: a 1.5 GiB float32 pool) starts small: its KV
 * pool is sized to max_model_len x max running requests within the host's memory, and pages are
 * only resident once written. */
TEST(defaults_kv_pool_builtin)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
    Srv s;
    ASSERT(srv_start_model(&s, "builtin-pool", dir, "") == 0);
    long rss = srv_rss_kb(&s);
    Resp r;
    ASSERT(http(s.port, "GET", "/get_server_info", NULL, NULL, &r) == 0);
    json_t *j = body_json(&r);
    long long kv = j ? jint(j, "kv_tokens") : -1, len = j ? jint(j, "max_model_len") : -1;
    long long running = j ? jint(j, "max_running_requests") : -1;
    json_decref(j);
    resp_free(&r);
    fprintf(stderr, "    builtin: %lld KV tokens, max_model_len %lld x %lld running; RSS %ld kB\n", kv, len, running, rss);
    EXPECT(kv > 0 && kv <= len * running, "the pool (%lld tokens) past max_model_len x running", kv);
    EXPECT(rss > 0 && rss < 512 * 1024, "RSS %ld kB at start", rss);
    /* the memory is there when used: a request still completes */
    post(s.port, "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":4}", &r);
    EXPECT(r.status == 200, "%d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
}

/* 1 when /proc/PID/environ holds the entry "kv" exactly */
static int environ_has(pid_t pid, const char *kv)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    size_t n = 0;
    char *t = file_read_all(path, &n);
    int has = 0;
    for (size_t i = 0; t && i < n; i += strlen(t + i) + 1)
        if (!strcmp(t + i, kv)) has = 1;
    free(t);
    return has;
}

/* OpenMP threads sleep when idle unless the user chose (OMP_WAIT_POLICY, GOMP_SPINCOUNT); the
 * CPU thread count is the affinity mask's. */
TEST(defaults_cpu_threads)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
    Srv s;
    ASSERT(srv_start_launched(&s, "omp-default", dir, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT", "") == 0);
    EXPECT(environ_has(s.pid, "OMP_WAIT_POLICY=passive"), "the server's OpenMP wait policy is not passive");
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    ASSERT(srv_start_launched(&s, "omp-active", dir, "env OMP_WAIT_POLICY=active", "") == 0);
    EXPECT(environ_has(s.pid, "OMP_WAIT_POLICY=active"), "the user's OMP_WAIT_POLICY was not kept");
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "taskset -c 0 '%s' logits --model '%s' --tokens 1,2,3 --device cpu --out '%s/l.f32'", test_bin(), dir,
             test_tmpdir());
    EXPECT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    EXPECT(out && strstr(out, " 1 threads"), "one CPU allowed, one thread: %s", out ? out : "");
    free(out);
}

/* ---- n > 1 ---- */

static Srv n_srv;

static void n_srv_atexit(void)
{
    if (n_srv.pid) srv_stop(&n_srv, 60);
}

static Srv *nsrv(void)
{
    if (!n_srv.pid) {
        if (srv_start(&n_srv, "n-choices", "--num-kv-blocks 512") != 0) return NULL;
        atexit(n_srv_atexit);
    }
    return &n_srv;
}

/* The choices of a non-streaming response: each index 0..n-1 once; texts (chat: contents) into
 * texts[index] (caller frees), completion tokens from the usage summed over them. */
static int full_choices(const Resp *r, int chat, int n, char **texts, int *prompt_tokens, int *completion_tokens)
{
    json_t *j = body_json(r);
    if (!j) return -1;
    json_t *ch = json_object_get(j, "choices");
    int ok = json_is_array(ch) && (int)json_array_size(ch) == n;
    for (int i = 0; ok && i < n; i++) {
        json_t *c = json_array_get(ch, i);
        json_t *ix = json_object_get(c, "index");
        int k = json_is_integer(ix) ? (int)json_integer_value(ix) : -1;
        const char *t = chat ? jstr(c, "message.content") : jstr(c, "text");
        ok = k >= 0 && k < n && !texts[k] && t && jstr(c, "finish_reason");
        if (ok) texts[k] = xstrdup(t);
    }
    *prompt_tokens = (int)jint(j, "usage.prompt_tokens");
    *completion_tokens = (int)jint(j, "usage.completion_tokens");
    ok = ok && jint(j, "usage.total_tokens") == *prompt_tokens + *completion_tokens;
    json_decref(j);
    return ok ? 0 : -1;
}

/* n = 2 and 3, completions and chat: distinct indexes, every choice max_tokens long (ignore_eos),
 * usage the prompt once and the completions summed; the same seed gives the same choices, and
 * the choices differ between themselves (seed + i). */
TEST(server_n_choices)
{
    Srv *s = nsrv();
    ASSERT(s);
    for (int chat = 0; chat < 2; chat++)
        for (int n = 2; n <= 3; n++) {
            char body[512];
            if (chat)
                snprintf(body, sizeof body, CHAT_BODY("Tell me a story", ", \"n\": %d, \"max_tokens\": 12, \"ignore_eos\": true, "
                         "\"temperature\": 1.0, \"seed\": 1234"), n);
            else
                snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"n\": %d, \"max_tokens\": 12, \"ignore_eos\": true, "
                         "\"temperature\": 1.0, \"seed\": 1234}", n);
            const char *path = chat ? "/v1/chat/completions" : "/v1/completions";
            char *t1[3] = {0}, *t2[3] = {0};
            int p1 = 0, c1 = 0, p2 = 0, c2 = 0;
            Resp r;
            post(s->port, path, body, &r);
            EXPECT(r.status == 200, "%s n=%d: %d %s", path, n, r.status, r.body ? r.body : "");
            EXPECT(full_choices(&r, chat, n, t1, &p1, &c1) == 0, "%s n=%d: choices: %s", path, n, r.body ? r.body : "");
            resp_free(&r);
            int want_p = chat ? chat_tokens("Tell me a story") : prompt_tokens("Once upon a time");
            EXPECT_EQ_INT(p1, want_p);
            EXPECT_EQ_INT(c1, 12 * n);
            post(s->port, path, body, &r);
            EXPECT(full_choices(&r, chat, n, t2, &p2, &c2) == 0, "%s n=%d again: %s", path, n, r.body ? r.body : "");
            resp_free(&r);
            int distinct = 0;
            for (int i = 0; i < n; i++) {
                EXPECT(t1[i] && t2[i] && !strcmp(t1[i], t2[i]), "%s n=%d choice %d not reproduced: '%s' vs '%s'", path, n, i,
                       t1[i] ? t1[i] : "(none)", t2[i] ? t2[i] : "(none)");
                if (i && t1[i] && t1[0] && strcmp(t1[i], t1[0])) distinct = 1;
            }
            EXPECT(distinct, "%s n=%d: every choice is the same text '%s'", path, n, t1[0] ? t1[0] : "");
            for (int i = 0; i < 3; i++) free(t1[i]), free(t2[i]);
        }
}

/* Streaming n = 3: every chunk carries an index in 0..2, each index ends once with a finish
 * reason, the texts of each index put together equal the non-streaming choices of the same
 * seed, and the usage chunk sums the completions. */
TEST(server_n_choices_stream)
{
    Srv *s = nsrv();
    ASSERT(s);
    for (int chat = 0; chat < 2; chat++) {
        const char *path = chat ? "/v1/chat/completions" : "/v1/completions";
        const char *base = chat ? CHAT_BODY("Tell me a story", ", \"n\": 3, \"max_tokens\": 10, \"ignore_eos\": true, \"temperature\": 1.0, "
                                            "\"seed\": 99%s")
                                : "{\"prompt\": \"Once upon a time\", \"n\": 3, \"max_tokens\": 10, \"ignore_eos\": true, "
                                  "\"temperature\": 1.0, \"seed\": 99%s}";
        char body[512];
        snprintf(body, sizeof body, base, "");
        Resp r;
        post(s->port, path, body, &r);
        char *full[3] = {0};
        int pt = 0, ct = 0;
        EXPECT(full_choices(&r, chat, 3, full, &pt, &ct) == 0, "%s: %s", path, r.body ? r.body : "");
        resp_free(&r);
        snprintf(body, sizeof body, base, ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
        post(s->port, path, body, &r);
        EXPECT(r.status == 200, "%s stream: %d", path, r.status);
        Sse sse;
        sse_parse(r.body ? r.body : "", &sse);
        EXPECT(sse.done && !sse.bad, "%s: the stream did not end with [DONE]", path);
        ApiBuf text[3] = {{0}};
        int finished[3] = {0}, usage_seen = 0;
        size_t k;
        json_t *c;
        json_array_foreach(sse.chunks, k, c) {
            json_t *ch = json_object_get(c, "choices");
            if (json_array_size(ch) == 0) {
                EXPECT_EQ_INT(jint(c, "usage.completion_tokens"), 30);
                EXPECT_EQ_INT(jint(c, "usage.prompt_tokens"), pt);
                usage_seen++;
                continue;
            }
            json_t *x = json_array_get(ch, 0);
            json_t *ix = json_object_get(x, "index");
            ASSERT(json_is_integer(ix), "a chunk without an index");
            int i = (int)json_integer_value(ix);
            ASSERT(i >= 0 && i < 3, "index %d", i);
            const char *t = chat ? jstr(x, "delta.content") : jstr(x, "text");
            if (t) openai_buf_add(&text[i], t, strlen(t));
            if (json_is_string(json_object_get(x, "finish_reason"))) finished[i]++;
        }
        EXPECT_EQ_INT(usage_seen, 1);
        for (int i = 0; i < 3; i++) {
            EXPECT_EQ_INT(finished[i], 1);
            EXPECT(full[i] && text[i].p && !strcmp(full[i], text[i].p), "%s choice %d: streamed '%s', not streamed '%s'", path, i,
                   text[i].p ? text[i].p : "", full[i] ? full[i] : "");
            openai_buf_free(&text[i]);
            free(full[i]);
        }
        json_decref(sse.chunks);
        resp_free(&r);
    }
}

/* The samples share the prompt's KV blocks: n = 3 over a prompt of several full blocks finds
 * them in the prefix cache twice (the first sample computed them). */
TEST(server_n_shares_prompt)
{
    Srv *s = nsrv();
    ASSERT(s);
    const char *prompt = "The quick brown fox jumps over the lazy dog while the cat watches from the window and the bird "
                         "sings in the old oak tree by the river on a quiet summer morning";
    int np = prompt_tokens(prompt);
    ASSERT(np >= 33, "the prompt has %d tokens", np);
    double before = metric(s->port, "moeserve_prefix_cache_hits_total");
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"n\": 3, \"max_tokens\": 2, \"temperature\": 1.0}", prompt);
    Resp r;
    post(s->port, "/v1/completions", body, &r);
    EXPECT(r.status == 200, "%d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    double hits = metric(s->port, "moeserve_prefix_cache_hits_total") - before;
    int full = (np - 1) / 16 * 16;
    EXPECT(hits >= 2 * full, "prefix cache hits %.0f, expected at least 2 x %d", hits, full);
}

/* ---- start-up ---- */

/* A port that is taken fails serve at once with a clear error, before the model is loaded
 * (the port is bound first); /health of a server that is up says ok. */
TEST(defaults_port_taken)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ASSERT(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0 &&
           getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    int port = ntohs(sa.sin_port);
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' serve --model '%s/models/builtin-nvfp4' --device cpu --port %d </dev/null", test_bin(),
             test_root(), port);
    int rc = test_run(cmd, &out);
    close(fd);
    EXPECT(rc != 0 && rc < 128, "serve on a taken port: exit %d", rc);
    EXPECT(out && strstr(out, "cannot listen"), "no clear error:\n%s", out ? out : "");
    EXPECT(out && !strstr(out, "KV cache"), "the model was loaded before the port was tried:\n%s", out ? out : "");
    free(out);
    Srv *s = nsrv();
    ASSERT(s);
    Resp r;
    ASSERT(http(s->port, "GET", "/health", NULL, NULL, &r) == 0);
    EXPECT(r.status == 200 && strstr(r.body, "ok"), "%d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
}
