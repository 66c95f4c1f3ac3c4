/* test_server: `moeserve serve` over real loopback HTTP (src/server/, src/cli/cmd_serve.c) on the
 * CPU backend with a tiny synth checkpoint (built-in tokenizer and chat template). The server runs
 * as a child process on a free port (--port 0, the port read from its "listening on" line); a
 * small socket client (tests/server_harness.c) speaks HTTP/1.1 (Content-Length and chunked
 * bodies, SSE).
 * Covered: every endpoint and error path (status, error type, param, message), streaming and not
 * for both generation endpoints with exact usage, stop strings and stop token ids, max_tokens,
 * seeds, logprobs, abrupt disconnects, a very slow reader, a chunked body over the limit,
 * --api-key, a full queue (503), 256 concurrent streams, memory over 5,000 requests, the
 * official OpenAI Python client (tests/openai_client.py), and a draining SIGTERM that exits 0
 * (under ASan that also means no leak). Tests share one server, started on first use; names
 * carry a number so that they run in order. Tool calls and reasoning: test_server_tools.c.
 * Run: make test FILTER=server. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "format/model_text.h"
#include "server/openai.h"
#include "server_harness.h"

static Srv shared;

static void shared_atexit(void)
{
    if (shared.pid) srv_stop(&shared, 60);
}

/* The server most tests use: room for the long requests and 256 concurrent ones (all from
 * 127.0.0.1, so no cap per client address). */
static Srv *srv(void)
{
    if (!shared.pid) {
        if (srv_start(&shared, "shared", "--num-kv-blocks 4096 --max-running-requests 64 ") != 0)
            return NULL;
        atexit(shared_atexit);
    }
    return &shared;
}

/* ---- tests ---- */

TEST(server_01_endpoints)
{
    Srv *s = srv();
    ASSERT(s);
    Resp r;
    ASSERT(http(s->port, "GET", "/health", NULL, NULL, &r) == 0);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    http(s->port, "HEAD", "/health", NULL, NULL, &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);

    http(s->port, "GET", "/v1/models", NULL, NULL, &r);
    EXPECT_EQ_INT(r.status, 200);
    json_t *j = body_json(&r);
    EXPECT(j && !strcmp(jstr(j, "object"), "list") && json_array_size(jget(j, "data")) == 1);
    EXPECT(j && jstr(j, "data.0.id") && !strcmp(jstr(j, "data.0.id"), model_dir()), "the model's name is --model as given");
    EXPECT(j && !strcmp(jstr(j, "data.0.object"), "model") && json_is_integer(jget(j, "data.0.created")));
    json_decref(j);
    resp_free(&r);
    http(s->port, "GET", "/v1/models/server-tiny", NULL, NULL, &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    http(s->port, "GET", "/v1/models/gpt-4", NULL, NULL, &r);
    expect_error(__FILE__, __LINE__, "GET /v1/models/gpt-4", &r, 404, "invalid_request_error", "does not exist", NULL);
    resp_free(&r);

    /* a completion first, so that the histograms have something */
    post(s->port, "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":2}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    http(s->port, "GET", "/metrics", NULL, NULL, &r);
    EXPECT_EQ_INT(r.status, 200);
    const char *must[] = {"moeserve_requests_total{route=\"/v1/completions\",status=\"200\"}", "moeserve_prompt_tokens_total",
                          "moeserve_generation_tokens_total", "moeserve_time_to_first_token_seconds_bucket",
                          "moeserve_inter_token_latency_seconds_count", "moeserve_e2e_request_latency_seconds_sum",
                          "moeserve_requests_running", "moeserve_requests_waiting", "moeserve_kv_blocks_used",
                          "moeserve_kv_cache_usage_ratio", "moeserve_prefix_cache_hit_rate", "# TYPE moeserve_time_to_first_token_seconds histogram"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) EXPECT(strstr(r.body, must[i]), "/metrics lacks %s", must[i]);
    resp_free(&r);
    EXPECT(metric(s->port, "moeserve_time_to_first_token_seconds_count") >= 1);
    EXPECT(metric(s->port, "moeserve_kv_blocks_total") == 4096);

    /* unknown routes and wrong methods */
    http(s->port, "GET", "/v2/completions", NULL, NULL, &r);
    expect_error(__FILE__, __LINE__, "GET /v2/completions", &r, 404, "invalid_request_error", "Invalid URL", NULL);
    resp_free(&r);
    post(s->port, "/v1/completion", "{}", &r);
    expect_error(__FILE__, __LINE__, "POST /v1/completion", &r, 404, "invalid_request_error", "Invalid URL", NULL);
    resp_free(&r);
    http(s->port, "GET", "/v1/chat/completions", NULL, NULL, &r);
    expect_error(__FILE__, __LINE__, "GET /v1/chat/completions", &r, 405, "invalid_request_error", "not allowed", NULL);
    EXPECT(r.head && header_value(r.head, "Allow") && !strncmp(header_value(r.head, "Allow"), "POST", 4));
    resp_free(&r);
    post(s->port, "/health", "{}", &r);
    expect_error(__FILE__, __LINE__, "POST /health", &r, 405, "invalid_request_error", "not allowed", NULL);
    resp_free(&r);
    http(s->port, "DELETE", "/v1/models", NULL, NULL, &r);
    expect_error(__FILE__, __LINE__, "DELETE /v1/models", &r, 405, "invalid_request_error", NULL, NULL);
    resp_free(&r);
}

TEST(server_02_completions)
{
    Srv *s = srv();
    ASSERT(s);
    const char *prompt = "The Debian package management system";
    int np = prompt_tokens(prompt);
    ASSERT(np > 0);
    Resp r;
    Full f;
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"user\":\"u1\"}",
             model_dir(), prompt);
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &f);
    resp_free(&r);
    EXPECT_EQ_INT(f.prompt_tokens, np);
    EXPECT_EQ_INT(f.completion_tokens, 12);
    EXPECT(!strcmp(f.finish, "length"), "finish '%s'", f.finish);
    EXPECT(strlen(f.text) > 0);

    /* the same prompt as token ids, and through the model's base name */
    int *ids = NULL;
    char err[128];
    int n = tokenizer_encode(model_text()->tok, prompt, strlen(prompt), 1, &ids, err, sizeof err);
    char idlist[512] = "";
    for (int i = 0; i < n; i++) snprintf(idlist + strlen(idlist), sizeof idlist - strlen(idlist), "%s%d", i ? "," : "", ids[i]);
    free(ids);
    snprintf(body, sizeof body, "{\"model\":\"server-tiny\",\"prompt\":[%s],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}", idlist);
    Full g;
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &g);
    resp_free(&r);
    EXPECT_EQ_INT(g.prompt_tokens, np);
    EXPECT(!strcmp(g.text, f.text), "token-id prompt: '%s' vs '%s'", g.text, f.text);

    /* streaming: the same text, one token per chunk, usage at the end */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}", prompt);
    Stream st;
    post(s->port, "/v1/completions", body, &r);
    stream_check(__FILE__, __LINE__, &r, 0, &st);
    resp_free(&r);
    EXPECT(!strcmp(st.text, f.text), "stream '%s' vs '%s'", st.text, f.text);
    EXPECT(st.has_usage && st.prompt_tokens == np && st.completion_tokens == 12 && st.total_tokens == np + 12);
    EXPECT(st.n_chunks <= 12 && st.n_chunks >= 2, "%d chunks", st.n_chunks);
    EXPECT(!strcmp(st.finish, "length"));

    /* without include_usage there is no usage chunk; echo returns the prompt first */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":3,\"stream\":true,\"echo\":true}", prompt);
    post(s->port, "/v1/completions", body, &r);
    stream_check(__FILE__, __LINE__, &r, 0, &st);
    resp_free(&r);
    EXPECT(!st.has_usage);
    EXPECT(!strncmp(st.text, prompt, strlen(prompt)), "echo: '%s'", st.text);

    /* the default max_tokens of a completion is 16 */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"ignore_eos\":true}", prompt);
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &f);
    resp_free(&r);
    EXPECT_EQ_INT(f.completion_tokens, 16);

    /* logprobs: one entry per token, top alternatives as asked */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":3}", prompt);
    post(s->port, "/v1/completions", body, &r);
    json_t *j = body_json(&r);
    resp_free(&r);
    json_t *lp = j ? jget(j, "choices.0.logprobs") : NULL;
    EXPECT(json_array_size(jget(lp, "tokens")) == 5 && json_array_size(jget(lp, "token_logprobs")) == 5 &&
           json_array_size(jget(lp, "top_logprobs")) == 5 && json_array_size(jget(lp, "text_offset")) == 5);
    for (size_t i = 0; i < json_array_size(jget(lp, "token_logprobs")); i++) {
        double v = json_number_value(json_array_get(jget(lp, "token_logprobs"), i));
        EXPECT(v <= 0 && v >= -9999, "logprob %g", v);
        size_t nt = json_object_size(json_array_get(jget(lp, "top_logprobs"), i));
        EXPECT(nt >= 1 && nt <= 3, "%zu top logprobs", nt);
    }
    json_decref(j);
}

TEST(server_03_chat)
{
    Srv *s = srv();
    ASSERT(s);
    int np = chat_tokens("What is apt?");
    ASSERT(np > 0);
    Resp r;
    Full f;
    post(s->port, "/v1/chat/completions", CHAT_BODY("What is apt?", ",\"max_completion_tokens\":10,\"temperature\":0,\"ignore_eos\":true"), &r);
    full_check(__FILE__, __LINE__, &r, 1, &f);
    resp_free(&r);
    EXPECT_EQ_INT(f.prompt_tokens, np);
    EXPECT_EQ_INT(f.completion_tokens, 10);
    EXPECT(!strcmp(f.finish, "length"));

    Stream st;
    post(s->port, "/v1/chat/completions",
         CHAT_BODY("What is apt?", ",\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}"), &r);
    stream_check(__FILE__, __LINE__, &r, 1, &st);
    resp_free(&r);
    EXPECT(!strcmp(st.text, f.text), "stream '%s' vs '%s'", st.text, f.text);
    EXPECT(st.has_usage && st.prompt_tokens == np && st.completion_tokens == 10);

    /* system + content parts + developer role; logprobs in the chat shape */
    post(s->port, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},"
         "{\"type\":\"text\",\"text\":\"there\"}]}],\"max_tokens\":4,\"logprobs\":true,\"top_logprobs\":2,\"ignore_eos\":true}", &r);
    json_t *j = body_json(&r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    json_t *content = j ? jget(j, "choices.0.logprobs.content") : NULL;
    EXPECT(json_array_size(content) == 4, "%zu logprob entries", json_array_size(content));
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *e = json_array_get(content, i);
        EXPECT(json_is_string(json_object_get(e, "token")) && json_is_number(json_object_get(e, "logprob")) &&
               json_is_array(json_object_get(e, "bytes")) && json_array_size(json_object_get(e, "top_logprobs")) == 2);
    }
    json_decref(j);
}

TEST(server_04_stop)
{
    Srv *s = srv();
    ASSERT(s);
    Resp r;
    Full f, g;
    const char *base = "{\"prompt\":\"Packages are installed with\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true";
    char body[2048];
    snprintf(body, sizeof body, "%s}", base);
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &f);
    resp_free(&r);
    size_t len = strlen(f.text);
    ASSERT(len >= 12, "text '%s' too short to cut", f.text);
    /* a stop string from the middle of the greedy text, starting on a character boundary */
    size_t a = len / 3;
    while (a < len && ((unsigned char)f.text[a] & 0xC0) == 0x80) a++;
    char stop[8];
    size_t sl = 0;
    while (sl < 3 && a + sl < len) stop[sl] = f.text[a + sl], sl++;
    while (a + sl < len && ((unsigned char)f.text[a + sl] & 0xC0) == 0x80) stop[sl] = f.text[a + sl], sl++;
    stop[sl] = 0;
    const char *first = strstr(f.text, stop);
    size_t cut = (size_t)(first - f.text);
    json_t *js = json_string(stop);
    char *jstop = json_dumps(js, JSON_ENCODE_ANY);
    json_decref(js);

    snprintf(body, sizeof body, "%s,\"stop\":%s}", base, jstop);
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &g);
    resp_free(&r);
    EXPECT(strlen(g.text) == cut && !strncmp(g.text, f.text, cut), "stop %s: '%s', expected the first %zu bytes of '%s'", jstop, g.text,
           cut, f.text);
    EXPECT(!strcmp(g.finish, "stop"), "finish '%s'", g.finish);
    EXPECT(g.completion_tokens >= 1 && g.completion_tokens < 24, "completion_tokens %d", g.completion_tokens);

    /* streamed: never a byte of the stop string; a list of stops, the first match wins */
    snprintf(body, sizeof body, "%s,\"stop\":[\"zzzz-never\",%s],\"stream\":true,\"stream_options\":{\"include_usage\":true}}", base, jstop);
    Stream st;
    post(s->port, "/v1/completions", body, &r);
    stream_check(__FILE__, __LINE__, &r, 0, &st);
    resp_free(&r);
    EXPECT(!strcmp(st.text, g.text), "stream '%s' vs '%s'", st.text, g.text);
    EXPECT(!strcmp(st.finish, "stop"));
    EXPECT_EQ_INT(st.completion_tokens, g.completion_tokens);

    /* chat with a stop string */
    Full c, d;
    post(s->port, "/v1/chat/completions", CHAT_BODY("Hello", ",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true"), &r);
    full_check(__FILE__, __LINE__, &r, 1, &c);
    resp_free(&r);
    if (strlen(c.text) >= 6) {
        char cs[4] = {c.text[3], c.text[4], 0, 0};
        if (((unsigned char)cs[0] & 0x80) == 0 && ((unsigned char)cs[1] & 0x80) == 0) {
            js = json_string(cs);
            char *jcs = json_dumps(js, JSON_ENCODE_ANY);
            json_decref(js);
            snprintf(body, sizeof body, CHAT_BODY("Hello", ",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,\"stop\":%s"), jcs);
            post(s->port, "/v1/chat/completions", body, &r);
            full_check(__FILE__, __LINE__, &r, 1, &d);
            resp_free(&r);
            size_t ccut = (size_t)(strstr(c.text, cs) - c.text);
            EXPECT(strlen(d.text) == ccut && !strcmp(d.finish, "stop"), "chat stop '%s': '%s' from '%s'", cs, d.text, c.text);
            free(jcs);
        }
    }

    /* stop_token_ids: the id of the third generated token ends the output before it */
    snprintf(body, sizeof body, "%s,\"logprobs\":0}", base);
    post(s->port, "/v1/completions", body, &r);
    json_t *j = body_json(&r);
    resp_free(&r);
    json_t *toks = j ? jget(j, "choices.0.logprobs.tokens") : NULL;
    const char *t3 = json_string_value(json_array_get(toks, 2));
    int *ids = NULL;
    char err[128];
    int n = t3 ? tokenizer_encode(model_text()->tok, t3, strlen(t3), 0, &ids, err, sizeof err) : 0;
    if (n == 1) {
        size_t k = 0; /* the first generated token with that text */
        while (strcmp(json_string_value(json_array_get(toks, k)), t3)) k++;
        char prefix[4096] = "";
        for (size_t i = 0; i < k; i++) strncat(prefix, json_string_value(json_array_get(toks, i)), sizeof prefix - strlen(prefix) - 1);
        snprintf(body, sizeof body, "%s,\"stop_token_ids\":[%d]}", base, ids[0]);
        post(s->port, "/v1/completions", body, &r);
        full_check(__FILE__, __LINE__, &r, 0, &g);
        resp_free(&r);
        EXPECT(!strcmp(g.text, prefix) && !strcmp(g.finish, "stop"), "stop_token_ids [%d] ('%s'): '%s' (%s), expected '%s'", ids[0],
               t3, g.text, g.finish, prefix);
        EXPECT_EQ_INT(g.completion_tokens, (int)k + 1);
    } else {
        fprintf(stderr, "    note: token '%s' does not re-encode to one id: stop_token_ids not checked\n", t3 ? t3 : "?");
    }
    free(ids);
    json_decref(j);
    free(jstop);
}

TEST(server_05_seed)
{
    Srv *s = srv();
    ASSERT(s);
    Resp r;
    Full a, b;
    const char *body = "{\"prompt\":\"Random text:\",\"max_tokens\":16,\"temperature\":1.0,\"top_p\":0.95,\"seed\":1234,\"ignore_eos\":true}";
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &a);
    resp_free(&r);
    post(s->port, "/v1/completions", body, &r);
    full_check(__FILE__, __LINE__, &r, 0, &b);
    resp_free(&r);
    EXPECT(!strcmp(a.text, b.text), "same seed, different text: '%s' vs '%s'", a.text, b.text);
    Stream st;
    post(s->port, "/v1/completions",
         "{\"prompt\":\"Random text:\",\"max_tokens\":16,\"temperature\":1.0,\"top_p\":0.95,\"seed\":1234,\"ignore_eos\":true,\"stream\":true}", &r);
    stream_check(__FILE__, __LINE__, &r, 0, &st);
    resp_free(&r);
    EXPECT(!strcmp(st.text, a.text), "same seed streamed: '%s' vs '%s'", st.text, a.text);
    /* a large or negative int64 seed is a seed too */
    post(s->port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"seed\":-9223372036854775807}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
}

/* logit_bias: +100 on a token makes greedy decoding repeat it; -100 on the greedy choice bans it
 * (the sampler adds the biases to the logits on the host: the device sampler does not take them) */
TEST(server_05_logit_bias)
{
    Srv *s = srv();
    ASSERT(s);
    int id = tokenizer_token_id(model_text()->tok, "the");
    if (id < 0) id = tokenizer_token_id(model_text()->tok, "\xc4\xa0the"); /* byte-level BPE's " the" */
    ASSERT(id >= 0, "no token 'the' in the tiny model's vocabulary");
    char *piece = NULL, body[512];
    size_t n = 0;
    ASSERT(tokenizer_decode(model_text()->tok, &id, 1, 0, &piece, &n) == 0);
    Resp r;
    Full f, g;
    for (int chat = 0; chat < 2; chat++) {
        if (chat)
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":4,"
                     "\"temperature\":0,\"ignore_eos\":true,\"logit_bias\":{\"%d\":100}}", id);
        else
            snprintf(body, sizeof body, "{\"prompt\":\"Random text:\",\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true,"
                     "\"logit_bias\":{\"%d\":100,\"7\":-3.5}}", id);
        post(s->port, chat ? "/v1/chat/completions" : "/v1/completions", body, &r);
        full_check(__FILE__, __LINE__, &r, chat, &f);
        resp_free(&r);
        char want[256] = "";
        for (int i = 0; i < 4; i++) strcat(want, piece);
        EXPECT(!strcmp(f.text, want), "%s: +100 on token %d ('%s'): got '%s'", chat ? "chat" : "completions", id, piece, f.text);
    }
    /* two tokens raised, the larger one banned: the other wins; both raised: the larger wins */
    int id2 = tokenizer_token_id(model_text()->tok, "and");
    if (id2 < 0) id2 = tokenizer_token_id(model_text()->tok, "\xc4\xa0" "and");
    ASSERT(id2 >= 0 && id2 != id, "no token 'and' in the tiny model's vocabulary");
    char *piece2 = NULL;
    ASSERT(tokenizer_decode(model_text()->tok, &id2, 1, 0, &piece2, &n) == 0);
    for (int ban = 0; ban < 2; ban++) {
        snprintf(body, sizeof body, "{\"prompt\":\"Random text:\",\"max_tokens\":2,\"temperature\":0,\"ignore_eos\":true,"
                 "\"logit_bias\":{\"%d\":%s,\"%d\":90}}", id, ban ? "-100" : "100", id2);
        post(s->port, "/v1/completions", body, &r);
        full_check(__FILE__, __LINE__, &r, 0, &g);
        resp_free(&r);
        char want[256];
        snprintf(want, sizeof want, "%s%s", ban ? piece2 : piece, ban ? piece2 : piece);
        EXPECT(!strcmp(g.text, want), "%s: got '%s', want '%s'", ban ? "banned" : "raised", g.text, want);
    }
    free(piece2);
    free(piece);
}

TEST(server_06_errors)
{
    Srv *s = srv();
    ASSERT(s);
    static const struct { const char *path, *body; int status; const char *msg, *param; } cases[] = {
        {"/v1/completions", "{\"prompt\": \"x\",", 400, "not valid JSON", NULL},
        {"/v1/completions", "[1, 2]", 400, "JSON object", NULL},
        {"/v1/completions", "", 400, "empty", NULL},
        {"/v1/completions", "{\"max_tokens\": 4}", 400, "prompt", "prompt"},
        {"/v1/completions", "{\"prompt\": 5}", 400, "prompt", "prompt"},
        {"/v1/completions", "{\"prompt\": {\"a\": 1}}", 400, "prompt", "prompt"},
        {"/v1/completions", "{\"prompt\": []}", 400, "empty", "prompt"},
        {"/v1/completions", "{\"prompt\": [\"a\", \"b\"]}", 400, "batched", "prompt"},
        {"/v1/completions", "{\"prompt\": [1, \"b\"]}", 400, "token ids", "prompt"},
        {"/v1/completions", "{\"prompt\": [999999]}", 400, "vocabulary", "prompt"},
        {"/v1/completions", "{\"prompt\": [-5]}", 400, "vocabulary", "prompt"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", 400, "integer", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "at least 1", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -1}", 400, "at least 1", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "integer", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2147483648}", 400, "[1, 2147483647], got 2147483648", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 1e12}", 400, "[1, 2147483647]", "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 5000}", 400, "maximum context length", "prompt"},
        {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": -1}", 400, "temperature", "temperature"},
        {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": \"hot\"}", 400, "number", "temperature"},
        {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": 1e300}", 400, "temperature", "temperature"},
        {"/v1/completions", "{\"prompt\": \"x\", \"top_p\": 0}", 400, "top_p", "top_p"},
        {"/v1/completions", "{\"prompt\": \"x\", \"top_p\": 1.5}", 400, "top_p", "top_p"},
        {"/v1/completions", "{\"prompt\": \"x\", \"top_k\": -2}", 400, "top_k", "top_k"},
        {"/v1/completions", "{\"prompt\": \"x\", \"min_p\": 2}", 400, "min_p", "min_p"},
        {"/v1/completions", "{\"prompt\": \"x\", \"presence_penalty\": 3}", 400, "presence_penalty", "presence_penalty"},
        {"/v1/completions", "{\"prompt\": \"x\", \"frequency_penalty\": -2.5}", 400, "frequency_penalty", "frequency_penalty"},
        {"/v1/completions", "{\"prompt\": \"x\", \"repetition_penalty\": 0}", 400, "repetition_penalty", "repetition_penalty"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 129}", 400, "n = 129", "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 3, \"best_of\": 2}", 400, "best_of = 2 must be at least n", "best_of"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 0}", 400, "n", "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"best_of\": 3}", 400, "best_of", "best_of"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": 21}", 400, "logprobs", "logprobs"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": true}", 400, "integer", "logprobs"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stream\": \"yes\"}", 400, "boolean", "stream"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", 400, "stream", "stream_options"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop\": 5}", 400, "stop", "stop"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"a\", 3]}", 400, "stop", "stop"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "at most", "stop"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop_token_ids\": [-1]}", 400, "token id", "stop_token_ids"},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop_token_ids\": 7}", 400, "array", "stop_token_ids"},
        {"/v1/completions", "{\"prompt\": \"x\", \"ignore_eos\": 1}", 400, "boolean", "ignore_eos"},
        {"/v1/completions", "{\"prompt\": \"x\", \"seed\": \"abc\"}", 400, "integer", "seed"},
        {"/v1/completions", "{\"prompt\": \"x\", \"model\": 5}", 400, "string", "model"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 10}}", 400, "not a token id", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5x\": 10}}", 400, "not a token id", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 10}}", 400, "not a token id", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"99999999\": 10}}", 400, "not a token id", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 100.5}}", 400, "[-100, 100]", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 1, \"05\": 2}}", 400, "names token 5, which another key", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"up\"}}", 400, "[-100, 100]", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": [5]}", 400, "object", "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"suffix\": \"end\"}", 400, "not supported", "suffix"},
        {"/v1/completions", "{\"prompt\": \"\\ud800\"}", 400, "JSON", NULL},
        {"/v1/completions", "{\"prompt\": \"x\", \"model\": \"gpt-4o\"}", 404, "does not exist", "model"},
        {"/v1/chat/completions", "{}", 400, "messages", "messages"},
        {"/v1/chat/completions", "{\"messages\": []}", 400, "empty", "messages"},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "array", "messages"},
        {"/v1/chat/completions", "{\"messages\": [5]}", 400, "object", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", 400, "role", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", 400, "role", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "content", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "content", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}", 400, "not supported", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 400, "content[0].text must be a string", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 5}]}]}", 400, "content[0].text must be a string", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 2}", 400, "logprobs", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 21}", 400, "top_logprobs", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_completion_tokens\": 0}", 400, "at least 1", "max_completion_tokens"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_object\"}}", 400, "not supported", "response_format"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"model\": \"nope\"}", 404, "does not exist", "model"},
        /* a malformed body is a 400 whatever model it names (it was a 404 before the body was read) */
        {"/v1/completions", "{\"model\": \"nope\"}", 400, "'prompt' is required", "prompt"},
        {"/v1/completions", "{\"model\": \"nope\", \"prompt\": []}", 400, "empty", "prompt"},
        {"/v1/completions", "{\"model\": \"nope\", \"prompt\": \"x\", \"max_tokens\": 5000}", 400, "maximum context length", "prompt"},
        {"/v1/chat/completions", "{\"model\": \"nope\"}", 400, "'messages' is required", "messages"},
        {"/v1/chat/completions", "{\"model\": \"nope\", \"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", 400, "role", "messages"},
        /* strings compare over their whole length: a NUL does not end them */
        {"/v1/completions", "{\"prompt\": \"x\", \"model\": \"server-tiny\\u0000anything\"}", 404, "server-tiny\\u0000anything", "model"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\\u0000x\", \"content\": \"hi\"}]}", 400, "role 'user\\u0000x'", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\\u0000\", \"text\": \"hi\"}]}]}", 400,
         "not supported", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"text\\u0000json\"}}",
         400, "not supported", "response_format"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\\u0000\", "
         "\"function\": {\"name\": \"f\"}}]}", 400, "function", "tools"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}], \"tool_choice\": \"auto\\u0000x\"}", 400, "auto\\u0000x", "tool_choice"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\\u0000\", \"function\": {\"name\": \"f\"}}}", 400,
         "tool_choice", "tool_choice"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\\u0000g\"}}}", 400,
         "f\\u0000g", "tool_choice"},
        {"/v1/completions", "{\"prompt\": [8192]}", 400, "token id 8192 is outside the vocabulary", "prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Resp r;
        post(s->port, cases[i].path, cases[i].body, &r);
        char what[600];
        snprintf(what, sizeof what, "POST %s %s", cases[i].path, cases[i].body);
        expect_error(__FILE__, __LINE__, what, &r, cases[i].status, "invalid_request_error", cases[i].msg, cases[i].param);
        resp_free(&r);
    }

    /* a NUL is a character like any other (the model may produce one too) */
    Resp r;
    post(s->port, "/v1/completions", "{\"prompt\": \"a\\u0000b\", \"max_tokens\": 2}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    /* in a chat message too: the rendered prompt keeps it and what follows (strlen cut the prompt
       there, the rest of the message and the generation prompt with it) */
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "a\001b c d e f g"); /* \001 for the NUL */
    char *text = NULL, terr[256];
    size_t tlen = 0;
    int *tids = NULL, want = -1;
    if (model_text_render(model_text(), msgs, NULL, NULL, 1, &text, terr, sizeof terr) == 0) {
        tlen = strlen(text);
        *strchr(text, '\001') = 0;
        want = tokenizer_encode(model_text()->tok, text, tlen, 0, &tids, terr, sizeof terr);
    }
    EXPECT(want > chat_tokens("a"), "the rendered prompt: %zu bytes, %d tokens", tlen, want);
    json_decref(msgs);
    free(text);
    free(tids);
    Full nf;
    post(s->port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b c d e f g\"}], \"max_tokens\": 2}", &r);
    full_check(__FILE__, __LINE__, &r, 1, &nf);
    resp_free(&r);
    EXPECT_EQ_INT(nf.prompt_tokens, want);

    /* invalid UTF-8 inside a JSON string */
    post(s->port, "/v1/completions", "{\"prompt\": \"ab\xff\xfe\"}", &r);
    expect_error(__FILE__, __LINE__, "invalid UTF-8", &r, 400, "invalid_request_error", "UTF-8", NULL);
    resp_free(&r);
    post(s->port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}", &r);
    expect_error(__FILE__, __LINE__, "invalid UTF-8 in chat", &r, 400, "invalid_request_error", "UTF-8", NULL);
    resp_free(&r);

    /* a prompt longer than the context, as ids and as text */
    ApiBuf big = {0};
    openai_buf_add(&big, "{\"prompt\":[", 11);
    for (int i = 0; i < SRV_CONTEXT + 10; i++) openai_buf_add(&big, i ? ",17" : "17", i ? 3 : 2);
    openai_buf_add(&big, "]}", 2);
    post(s->port, "/v1/completions", big.p, &r);
    expect_error(__FILE__, __LINE__, "prompt of 4106 ids", &r, 400, "invalid_request_error", "maximum context length", "prompt");
    json_t *j = json_loads(r.body, 0, NULL);
    EXPECT(j && jstr(j, "error.code") && !strcmp(jstr(j, "error.code"), "context_length_exceeded"));
    json_decref(j);
    resp_free(&r);
    big.len = 0;
    openai_buf_add(&big, "{\"messages\":[{\"role\":\"user\",\"content\":\"", 39);
    for (int i = 0; i < SRV_CONTEXT + 10; i++) openai_buf_add(&big, " apt", 4);
    openai_buf_add(&big, "\"}]}", 4);
    post(s->port, "/v1/chat/completions", big.p, &r);
    expect_error(__FILE__, __LINE__, "chat of 4106 words", &r, 400, "invalid_request_error", "maximum context length", "messages");
    resp_free(&r);
    openai_buf_free(&big);

    /* a body over --max-body (4 MB): refused from its Content-Length, before it is sent */
    int fd = hc_connect(s->port, 0);
    ASSERT(fd >= 0);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n{\"prompt\":\"";
    hc_send(fd, head, strlen(head));
    size_t n;
    char *raw = hc_read_all(fd, &n);
    close(fd);
    hc_parse(raw, n, &r);
    free(raw);
    expect_error(__FILE__, __LINE__, "5 MB body", &r, 413, "invalid_request_error", "limit", NULL);
    resp_free(&r);

    /* a chunked body that passes the limit: read to its end and answered 413 */
    fd = hc_connect(s->port, 0);
    ASSERT(fd >= 0);
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    hc_send(fd, head, strlen(head));
    char *chunk = malloc(65536 + 16);
    int cl = snprintf(chunk, 16, "10000\r\n");
    memset(chunk + cl, 'a', 65536);
    memcpy(chunk + cl + 65536, "\r\n", 2);
    for (int i = 0; i < 80; i++) /* 5 MB */
        if (hc_send(fd, chunk, (size_t)cl + 65536 + 2) != 0) break;
    free(chunk);
    hc_send(fd, "0\r\n\r\n", 5);
    raw = hc_read_all(fd, &n);
    close(fd);
    hc_parse(raw, n, &r);
    free(raw);
    expect_error(__FILE__, __LINE__, "chunked 5 MB body", &r, 413, "invalid_request_error", "limit", NULL);
    resp_free(&r);

    /* a transfer coding other than chunked: refused at once, not read to the end of the
     * connection while the client waits for an answer */
    fd = hc_connect(s->port, 0);
    ASSERT(fd >= 0);
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    hc_send(fd, head, strlen(head));
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    EXPECT(poll(&pf, 1, 10000) == 1, "Transfer-Encoding gzip: no answer in 10 s");
    raw = hc_read_all(fd, &n);
    close(fd);
    hc_parse(raw, n, &r);
    free(raw);
    expect_error(__FILE__, __LINE__, "Transfer-Encoding gzip", &r, 501, "invalid_request_error", "Transfer-Encoding", NULL);
    resp_free(&r);

    /* headers over the limit */
    fd = hc_connect(s->port, 0);
    ASSERT(fd >= 0);
    ApiBuf hb = {0};
    const char *h1 = "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ";
    openai_buf_add(&hb, h1, strlen(h1));
    for (int i = 0; i < 100000; i++) openai_buf_add(&hb, "a", 1);
    openai_buf_add(&hb, "\r\n\r\n", 4);
    hc_send(fd, hb.p, hb.len);
    openai_buf_free(&hb);
    raw = hc_read_all(fd, &n);
    close(fd);
    hc_parse(raw, n, &r);
    free(raw);
    EXPECT(r.status == 0 || r.status >= 400, "100 kB header: status %d", r.status);
    resp_free(&r);

    /* still serving */
    post(s->port, "/v1/completions", "{\"prompt\":\"still there?\",\"max_tokens\":2}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    EXPECT(metric(s->port, "moeserve_requests_total{route=\"/v1/completions\",status=\"400\"}") >= 40);
}

/* A streaming request that is read up to its first token and then dropped with a RST. */
static void drop_stream(int port, const char *body, int nonstream)
{
    int fd = hc_connect(port, 0);
    if (fd < 0) return;
    hc_send_request(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    if (nonstream) usleep(300000); /* let it reach the engine */
    else {
        char buf[512];
        size_t got = 0;
        while (got < sizeof buf && !memmem(buf, got, "data: ", 6)) {
            ssize_t r = recv(fd, buf + got, sizeof buf - got, 0);
            if (r <= 0) break;
            got += (size_t)r;
        }
    }
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

TEST(server_07_disconnect)
{
    Srv *s = srv();
    ASSERT(s);
    double aborted0 = metric(s->port, "moeserve_request_finish_total{reason=\"abort\"}");
    /* long streams (the whole context) dropped after their first token */
    const char *body = "{\"prompt\":\"Tell me everything.\",\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}";
    for (int i = 0; i < 4; i++) drop_stream(s->port, body, 0);
    /* and non-streaming ones, dropped as soon as they are sent (found when they next wake) */
    const char *nbody = "{\"prompt\":\"Tell me everything.\",\"max_tokens\":4000,\"ignore_eos\":true}";
    for (int i = 0; i < 2; i++) drop_stream(s->port, nbody, 1);
    /* a request dropped while its body is still coming */
    int fd = hc_connect(s->port, 0);
    if (fd >= 0) {
        const char *part = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
        hc_send(fd, part, strlen(part));
        close(fd);
    }
    Resp r;
    ASSERT(http(s->port, "GET", "/health", NULL, NULL, &r) == 0);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    /* the engine drops them: nothing left running within a few seconds (4000 tokens take longer) */
    double t0 = clock_now(), running = -1;
    while (clock_now() - t0 < 10) {
        running = metric(s->port, "moeserve_requests_running") + metric(s->port, "moeserve_requests_waiting");
        if (running == 0) break;
        usleep(50000);
    }
    EXPECT(running == 0, "%g requests still in the engine %.1f s after their clients left", running, clock_now() - t0);
    EXPECT(metric(s->port, "moeserve_request_finish_total{reason=\"abort\"}") >= aborted0 + 6);
    Full f;
    post(s->port, "/v1/completions", "{\"prompt\":\"After the storm\",\"max_tokens\":6,\"ignore_eos\":true}", &r);
    full_check(__FILE__, __LINE__, &r, 0, &f);
    resp_free(&r);
    EXPECT_EQ_INT(f.completion_tokens, 6);
}

typedef struct {
    int port;
    Resp r;
    double seconds;
} SlowArg;

/* Reads a long stream 64 bytes at a time with pauses, through a small receive buffer. */
static void *slow_reader(void *p)
{
    SlowArg *a = p;
    double t0 = clock_now();
    int fd = hc_connect(a->port, 2048);
    const char *body = "{\"prompt\":\"Slowly\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    hc_send_request(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    ApiBuf raw = {0};
    char buf[64];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        openai_buf_add(&raw, buf, (size_t)n);
        usleep(2000);
    }
    close(fd);
    hc_parse(raw.p ? raw.p : (char *)"", raw.len, &a->r);
    openai_buf_free(&raw);
    a->seconds = clock_now() - t0;
    return NULL;
}

TEST(server_08_slow_reader)
{
    Srv *s = srv();
    ASSERT(s);
    SlowArg a = {.port = s->port};
    pthread_t t;
    pthread_create(&t, NULL, slow_reader, &a);
    usleep(200000);
    /* everyone else is served meanwhile */
    double t0 = clock_now();
    Resp r;
    Full f;
    post(s->port, "/v1/chat/completions", CHAT_BODY("quick?", ",\"max_tokens\":4,\"ignore_eos\":true"), &r);
    full_check(__FILE__, __LINE__, &r, 1, &f);
    resp_free(&r);
    double quick = clock_now() - t0;
    pthread_join(t, NULL);
    Stream st;
    stream_check(__FILE__, __LINE__, &a.r, 0, &st);
    EXPECT(st.has_usage && st.completion_tokens == 300, "slow reader: usage %d", st.completion_tokens);
    EXPECT(quick < a.seconds, "a quick request took %.2f s while the slow reader took %.2f s", quick, a.seconds);
    fprintf(stderr, "    slow reader: %zu bytes in %.2f s; a quick request meanwhile: %.3f s\n", a.r.body_len, a.seconds, quick);
    resp_free(&a.r);
}

typedef struct {
    int port, index, expect_prompt, chat;
    int ok;
    char why[1024];
} ConcArg;

static void *concurrent_stream(void *p)
{
    ConcArg *a = p;
    char body[512];
    if (a->chat)
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Request number %d\"}],\"max_tokens\":8,"
                 "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", a->index);
    else
        snprintf(body, sizeof body, "{\"prompt\":\"Request number %d\",\"max_tokens\":8,\"ignore_eos\":true,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", a->index);
    Resp r;
    if (post(a->port, a->chat ? "/v1/chat/completions" : "/v1/completions", body, &r) != 0) {
        snprintf(a->why, sizeof a->why, "no response");
        return NULL;
    }
    Sse s;
    sse_parse(r.body, &s);
    size_t n = json_array_size(s.chunks);
    json_t *last = json_array_get(s.chunks, n ? n - 1 : 0);
    long long pt = jint(last, "usage.prompt_tokens"), ct = jint(last, "usage.completion_tokens");
    a->ok = r.status == 200 && s.done && !s.bad && pt == a->expect_prompt && ct == 8;
    if (!a->ok) {
        const char *tail = r.body_len > 600 ? r.body + r.body_len - 600 : r.body;

        snprintf(a->why, sizeof a->why, "status %d, done %d, bad %d, usage %lld + %lld (expected %d + 8); the stream ends '%s'",
                 r.status, s.done, s.bad, pt, ct, a->expect_prompt, tail);

    }
    json_decref(s.chunks);
    resp_free(&r);
    return NULL;
}

TEST(server_09_concurrent_256)
{
    Srv *s = srv();
    ASSERT(s);
    enum { N = 256 };
    static ConcArg args[N];
    pthread_t th[N];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    double t0 = clock_now();
    for (int i = 0; i < N; i++) {
        char text[64];
        args[i] = (ConcArg){.port = s->port, .index = i, .chat = i % 2};
        snprintf(text, sizeof text, "Request number %d", i);
        args[i].expect_prompt = args[i].chat ? chat_tokens(text) : prompt_tokens(text);
    }
    for (int i = 0; i < N; i++) pthread_create(&th[i], &at, concurrent_stream, &args[i]);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
        if (!args[i].ok) fprintf(stderr, "    stream %d: %s\n", i, args[i].why);
    }
    pthread_attr_destroy(&at);
    EXPECT_EQ_INT(ok, N);
    fprintf(stderr, "    %d concurrent streams (8 tokens each) in %.2f s\n", N, clock_now() - t0);
}

typedef struct {
    int port, n, failures;
} MemArg;

static void *mem_worker(void *p)
{
    MemArg *a = p;
    for (int i = 0; i < a->n; i++) {
        Resp r;
        int kind = i % 4, want = 200;
        if (kind == 0) post(a->port, "/v1/completions", "{\"prompt\":\"Memory\",\"max_tokens\":2}", &r);
        else if (kind == 1) post(a->port, "/v1/chat/completions", CHAT_BODY("mem", ",\"max_tokens\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":2"), &r);
        else if (kind == 2) post(a->port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"stop\":[\"a\",\"b\"],\"stream\":true}", &r);
        else { post(a->port, "/v1/completions", "{\"prompt\":\"x\",\"temperature\":-3}", &r); want = 400; }
        if (r.status != want) a->failures++;
        resp_free(&r);
    }
    return NULL;
}

/* n requests of a mix of kinds from 8 client threads; the number that failed. */
static int mem_round(int port, int n)
{
    enum { T = 8 };
    MemArg a[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        a[i] = (MemArg){.port = port, .n = n / T};
        pthread_create(&th[i], NULL, mem_worker, &a[i]);
    }
    int fail = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        fail += a[i].failures;
    }
    return fail;
}

TEST(server_10_memory)
{
    Srv *s = srv();
    ASSERT(s);
    EXPECT_EQ_INT(mem_round(s->port, 1000), 0); /* warm up: slots, buffers and arenas reach their sizes */
    long before = srv_rss_kb(s);
    double t0 = clock_now();
    EXPECT_EQ_INT(mem_round(s->port, 5000), 0);
    long after = srv_rss_kb(s);
    fprintf(stderr, "    5000 requests in %.1f s; server RSS %ld -> %ld kB\n", clock_now() - t0, before, after);
    ASSERT(before > 0 && after > 0);
#ifdef __SANITIZE_ADDRESS__
    long bound = 32 * 1024; /* ASan's quarantine (16 MB here) holds freed memory for a while */
#else
    long bound = 4 * 1024;
#endif
    EXPECT(after - before < bound, "RSS grew by %ld kB over 5000 requests (bound %ld kB)", after - before, bound);
}

TEST(server_11_api_key)
{
    Srv k;
    ASSERT(srv_start(&k, "apikey", "--api-key sk-test-123 --served-model-name tiny") == 0);
    Resp r;
    post(k.port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":1}", &r);
    expect_error(__FILE__, __LINE__, "no key", &r, 401, "invalid_request_error", "API key", NULL);
    resp_free(&r);
    http(k.port, "POST", "/v1/completions", "Authorization: Bearer sk-wrong\r\n", "{\"prompt\":\"x\",\"max_tokens\":1}", &r);
    expect_error(__FILE__, __LINE__, "wrong key", &r, 401, "invalid_request_error", "Incorrect API key", NULL);
    resp_free(&r);
    http(k.port, "GET", "/v1/models", "Authorization: Basic c2stdGVzdC0xMjM=\r\n", NULL, &r);
    expect_error(__FILE__, __LINE__, "basic auth", &r, 401, "invalid_request_error", NULL, NULL);
    resp_free(&r);
    http(k.port, "POST", "/v1/completions", "Authorization: Bearer sk-test-123\r\n", "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":1}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    http(k.port, "POST", "/v1/completions", "Authorization: Bearer sk-test-123\r\n", "{\"model\":\"server-tiny\",\"prompt\":\"x\"}", &r);
    expect_error(__FILE__, __LINE__, "the directory name is no alias under --served-model-name", &r, 404, "invalid_request_error", NULL, "model");
    resp_free(&r);
    http(k.port, "GET", "/v1/models", "Authorization: bearer sk-test-123\r\n", NULL, &r);
    EXPECT_EQ_INT(r.status, 200);
    json_t *j = body_json(&r);
    EXPECT(j && jstr(j, "data.0.id") && !strcmp(jstr(j, "data.0.id"), "tiny"));
    json_decref(j);
    resp_free(&r);
    http(k.port, "GET", "/health", NULL, NULL, &r); /* health and metrics stay open */
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&k, 60), 0);
}

TEST(server_12_queue_full)
{
    Srv q;
    ASSERT(srv_start(&q, "queue", "--max-running-requests 1 --max-queue 1") == 0);
    /* one running (its first token seen), one waiting: the third is refused */
    const char *body = "{\"prompt\":\"Busy\",\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}";
    int fd1 = hc_connect(q.port, 0), fd2 = hc_connect(q.port, 0);
    ASSERT(fd1 >= 0 && fd2 >= 0);
    hc_send_request(fd1, "POST", "/v1/completions", NULL, body, strlen(body));
    char buf[1024];
    size_t got = 0;
    while (got < sizeof buf && !memmem(buf, got, "data: ", 6)) { /* its first token: it runs */
        ssize_t n = recv(fd1, buf + got, sizeof buf - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    EXPECT(memmem(buf, got, "data: ", 6));
    hc_send_request(fd2, "POST", "/v1/completions", NULL, body, strlen(body));
    usleep(200000);
    Resp r;
    post(q.port, "/v1/completions", "{\"prompt\":\"one more\",\"max_tokens\":2}", &r);
    expect_error(__FILE__, __LINE__, "third request", &r, 503, "server_error", "overloaded", NULL);
    EXPECT(r.head && header_value(r.head, "Retry-After"));
    resp_free(&r);
    /* the waiting one's client leaves: its place comes back while the first still runs, not
     * when the request would have started */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd2, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd2);
    double t0 = clock_now();
    while (clock_now() - t0 < 5 && metric(q.port, "moeserve_requests_waiting") != 0) usleep(50000);
    EXPECT(metric(q.port, "moeserve_requests_waiting") == 0, "the request of a client that left still waits after 5 s");
    EXPECT(metric(q.port, "moeserve_requests_running") == 1);
    setsockopt(fd1, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd1);
    /* room again once they are gone */
    t0 = clock_now();
    int status = 0;
    while (clock_now() - t0 < 10 && status != 200) {
        post(q.port, "/v1/completions", "{\"prompt\":\"one more\",\"max_tokens\":2}", &r);
        status = r.status;
        resp_free(&r);
        if (status != 200) usleep(50000);
    }
    EXPECT_EQ_INT(status, 200);
    EXPECT_EQ_INT(srv_stop(&q, 60), 0);
}

TEST(server_13_openai_python)
{
    Srv *s = srv();
    ASSERT(s);
    if (!openai_python_ok()) {
        test_skip("the official OpenAI Python client is not available (python3 -m pip install openai failed)");
        return;
    }
    char cmd[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "python3 '%s/tests/openai_client.py' http://127.0.0.1:%d/v1 '%s'", test_root(), s->port, model_dir());
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s -> %d:\n%s", cmd, rc, out ? out : "");
    if (rc == 0) fprintf(stderr, "    %s", out);
    free(out);
}

typedef struct {
    int port;
    ApiBuf body;
    Resp r;
} KvArg;

static void *kv_request(void *p)
{
    KvArg *a = p;
    post(a->port, "/v1/completions", a->body.p, &a->r);
    return NULL;
}

/* Two requests that do not fit the KV cache together (8 blocks of 16 tokens; 120 tokens each):
 * the younger one gives its blocks back once and waits for the older, instead of the two taking
 * each other's blocks every step and each recomputing its context for every token. */
TEST(server_14_kv_pressure)
{
    Srv k;
    ASSERT(srv_start(&k, "kv", "--num-kv-blocks 8 --max-model-len 128") == 0);
    enum { N = 2 };
    KvArg a[N];
    pthread_t th[N];
    double t0 = clock_now();
    for (int i = 0; i < N; i++) {
        a[i] = (KvArg){.port = k.port};
        openai_buf_add(&a[i].body, "{\"prompt\":[", 11);
        for (int t = 0; t < 48; t++) {
            char id[16];
            int n = snprintf(id, sizeof id, "%s%d", t ? "," : "", 300 + 50 * i + t);
            openai_buf_add(&a[i].body, id, (size_t)n);
        }
        const char *tail = "],\"max_tokens\":72,\"ignore_eos\":true,\"temperature\":0}";
        openai_buf_add(&a[i].body, tail, strlen(tail));
        pthread_create(&th[i], NULL, kv_request, &a[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        EXPECT_EQ_INT(a[i].r.status, 200);
        json_t *j = body_json(&a[i].r);
        EXPECT(j && jint(j, "usage.completion_tokens") == 72, "request %d: %s", i, a[i].r.body ? a[i].r.body : "");
        json_decref(j);
        resp_free(&a[i].r);
        openai_buf_free(&a[i].body);
    }
    double pre = metric(k.port, "moeserve_preemptions_total");
    fprintf(stderr, "    2 requests over a full KV cache in %.1f s, %g preemptions\n", clock_now() - t0, pre);
    EXPECT(pre >= 0 && pre <= 4, "%g preemptions for two requests", pre);
    EXPECT_EQ_INT(srv_stop(&k, 60), 0);
}

/* A tokenizer with one added token more than the model has rows (tokenizer.json's ids past the
 * vocabulary): a prompt holding it used to reach the engine, whose refusal was answered 503 with
 * Retry-After, so clients retried for ever. It is the request's prompt: 400, naming the token.
 * serve says so at start too. */
TEST(server_15_tokenizer_past_vocab)
{
    char dir[4200], cmd[9000], path[4400], *out = NULL;
    snprintf(dir, sizeof dir, "%s/vocab-plus-one", test_tmpdir());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, model_dir(), dir);
    ASSERT(test_run(cmd, &out) == 0, "%s: %s", cmd, out);
    free(out);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_error_t je;
    json_t *tj = json_load_file(path, 0, &je);
    ASSERT(tj, "%s: %s", path, je.text);
    int vocab = tokenizer_vocab_size(model_text()->tok); /* the tiny model's vocabulary is the tokenizer's */
    json_array_append_new(json_object_get(tj, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", vocab, "content", "<|extra|>", "single_word", 0,
                                    "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    ASSERT(json_dump_file(tj, path, 0) == 0);
    json_decref(tj);

    Srv v;
    ASSERT(srv_start_model(&v, "vocab-plus-one", dir, "") == 0);
    char want[64], body[512];
    snprintf(want, sizeof want, "'<|extra|>' (id %d)", vocab);
    Resp r;
    post(v.port, "/v1/completions", "{\"prompt\":\"Hello <|extra|> there\",\"max_tokens\":2}", &r);
    expect_error(__FILE__, __LINE__, "a prompt with the extra token", &r, 400, "invalid_request_error", want, "prompt");
    EXPECT(r.head && !header_value(r.head, "Retry-After"), "a 400 has no Retry-After");
    resp_free(&r);
    post(v.port, "/v1/chat/completions", CHAT_BODY("Hello <|extra|>", ",\"max_tokens\":2,\"stream\":true"), &r);
    expect_error(__FILE__, __LINE__, "a chat message with the extra token", &r, 400, "invalid_request_error", want, "messages");
    resp_free(&r);
    snprintf(body, sizeof body, "{\"prompt\":[5, %d],\"max_tokens\":2}", vocab);
    post(v.port, "/v1/completions", body, &r);
    snprintf(want, sizeof want, "token id %d is outside the vocabulary", vocab);
    expect_error(__FILE__, __LINE__, "the extra token's id", &r, 400, "invalid_request_error", want, "prompt");
    resp_free(&r);
    post(v.port, "/v1/completions", "{\"prompt\":\"Hello there\",\"max_tokens\":2}", &r);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&v, 60), 0);
    snprintf(cmd, sizeof cmd, "grep -c 'the tokenizer has %d token ids, the model.s vocabulary %d' '%s'", vocab + 1, vocab, v.log);
    test_run(cmd, &out);
    EXPECT(out && atoi(out) == 1, "no warning at start: %s", out ? out : "");
    free(out);
}

/* One response's text and its logprobs (tokens, their logprobs, completions' text_offset), from a
 * body or the chunks of a stream put together. */
typedef struct {
    char text[4096], tokens[4096];
    int n, completion_tokens, offsets[256];
    double lp[256];
    char tok[256][64];
} LpOut;

static void lp_take(json_t *choice, int chat, LpOut *o)
{
    json_t *t = chat ? (json_object_get(choice, "delta") ? jget(choice, "delta.content") : jget(choice, "message.content"))
                     : json_object_get(choice, "text");
    if (json_is_string(t)) strncat(o->text, json_string_value(t), sizeof o->text - strlen(o->text) - 1);
    json_t *lp = json_object_get(choice, "logprobs");
    size_t m = chat ? json_array_size(json_object_get(lp, "content")) : json_array_size(json_object_get(lp, "tokens"));
    for (size_t i = 0; i < m && o->n < 256; i++, o->n++) {
        json_t *e = chat ? json_array_get(json_object_get(lp, "content"), i) : NULL;
        const char *tok = json_string_value(chat ? json_object_get(e, "token") : json_array_get(json_object_get(lp, "tokens"), i));
        snprintf(o->tok[o->n], sizeof o->tok[o->n], "%s", tok ? tok : "");
        strncat(o->tokens, tok ? tok : "", sizeof o->tokens - strlen(o->tokens) - 1);
        o->lp[o->n] = json_number_value(chat ? json_object_get(e, "logprob") : json_array_get(json_object_get(lp, "token_logprobs"), i));
        o->offsets[o->n] = chat ? -1 : (int)json_integer_value(json_array_get(json_object_get(lp, "text_offset"), i));
    }
}

static int lp_request(int port, int chat, int stream, const char *extra, LpOut *o)
{
    char body[1024];
    memset(o, 0, sizeof *o);
    if (chat)
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":40,\"logprobs\":true,"
                 "\"stream\":%s,\"stream_options\":%s%s}", stream ? "true" : "false", stream ? "{\"include_usage\":true}" : "null", extra);
    else
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"max_tokens\":40,\"logprobs\":0,\"stream\":%s,\"stream_options\":%s%s}",
                 stream ? "true" : "false", stream ? "{\"include_usage\":true}" : "null", extra);
    Resp r;
    post(port, chat ? "/v1/chat/completions" : "/v1/completions", body, &r);
    int ok = r.status == 200;
    if (!ok) fprintf(stderr, "    %s -> %d %s\n", body, r.status, r.body ? r.body : "");
    if (stream) {
        Sse ss;
        sse_parse(r.body, &ss);
        ok &= ss.done && !ss.bad;
        size_t i;
        json_t *c;
        json_array_foreach(ss.chunks, i, c) {
            if (json_array_size(json_object_get(c, "choices"))) lp_take(jget(c, "choices.0"), chat, o);
            if (json_is_object(json_object_get(c, "usage"))) o->completion_tokens = (int)jint(c, "usage.completion_tokens");
        }
        json_decref(ss.chunks);
    } else {
        json_t *j = body_json(&r);
        if (j) {
            lp_take(jget(j, "choices.0"), chat, o);
            o->completion_tokens = (int)jint(j, "usage.completion_tokens");
        }
        ok &= j != NULL;
        json_decref(j);
    }
    resp_free(&r);
    return ok ? 0 : -1;
}

/* Stop strings and logprobs, vLLM's rule (docs/USAGE.md): the text ends before the stop string
 * (after it with include_stop_str_in_output); the logprobs are those of every generated token up
 * to and including the one that completed the stop string, the tokens usage counts: their texts
 * put together begin with the returned text and go on with the stop string; text_offset is each
 * token's start in that uncut text. The same streamed and not, completions and chat. The output
 * is scripted (--script-output) so that it holds the stop strings. */
TEST(server_16_stop_logprobs)
{
    char script[4200];
    snprintf(script, sizeof script, "%s/stop-script.txt", test_tmpdir());
    FILE *f = fopen(script, "w");
    ASSERT(f);
    fputs("Hello world\n\nSecond part here", f);
    fclose(f);
    char extra[4400];
    snprintf(extra, sizeof extra, "--script-output '%s'", script);
    Srv sc;
    ASSERT(srv_start(&sc, "script", extra) == 0);
    static const struct { const char *json, *stop, *text; int include; } cases[] = {
        {"\"\\n\\n\"", "\n\n", "Hello world", 0},              /* a whole token */
        {"[\"zzz\", \"d\\n\"]", "d\n", "Hello worl", 0},         /* across two tokens */
        {"\"\\n\\nSec\"", "\n\nSec", "Hello world", 0},        /* a token before the one that completes it */
        {"\"\\n\\n\"", "\n\n", "Hello world\n\n", 1},          /* include_stop_str_in_output */
        {"\"d\\n\"", "d\n", "Hello world\n", 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char x[256];
        snprintf(x, sizeof x, ",\"stop\":%s%s", cases[k].json, cases[k].include ? ",\"include_stop_str_in_output\":true" : "");
        for (int chat = 0; chat < 2; chat++) {
            static LpOut full, st;
            ASSERT(lp_request(sc.port, chat, 0, x, &full) == 0);
            ASSERT(lp_request(sc.port, chat, 1, x, &st) == 0);
            const char *what = chat ? "chat" : "completions";
            EXPECT(!strcmp(full.text, cases[k].text), "%s stop %s: text '%s', expected '%s'", what, x, full.text, cases[k].text);
            EXPECT(full.n > 0 && full.n == full.completion_tokens, "%s %s: %d logprobs, usage %d", what, x, full.n,
                   full.completion_tokens);
            /* the tokens' texts: the returned text, then the stop string (where it starts in the uncut
               text), completed by the last token and by no earlier one */
            size_t tl = strlen(full.text), L = strlen(cases[k].stop), at = cases[k].include ? tl - L : tl;
            size_t all = strlen(full.tokens), before_last = all - strlen(full.tok[full.n ? full.n - 1 : 0]);
            EXPECT(!strncmp(full.tokens, full.text, tl), "%s %s: the tokens '%s' do not begin with the text", what, x, full.tokens);
            EXPECT(all >= at + L && !strncmp(full.tokens + at, cases[k].stop, L) && before_last < at + L,
                   "%s %s: the tokens '%s' do not end with the one that completes the stop string", what, x, full.tokens);
            int off = 0;
            for (int i = 0; i < full.n && !chat; i++) {
                EXPECT(full.offsets[i] == off, "%s %s: text_offset[%d] = %d, expected %d", what, x, i, full.offsets[i], off);
                off += (int)strlen(full.tok[i]);
            }
            /* streamed: the same text, the same tokens with the same logprobs and offsets */
            EXPECT(!strcmp(st.text, full.text), "%s %s streamed: '%s' vs '%s'", what, x, st.text, full.text);
            EXPECT(st.n == full.n && st.completion_tokens == full.completion_tokens, "%s %s streamed: %d logprobs, usage %d; not "
                   "streamed %d, %d", what, x, st.n, st.completion_tokens, full.n, full.completion_tokens);
            for (int i = 0; i < st.n && i < full.n; i++)
                EXPECT(!strcmp(st.tok[i], full.tok[i]) && st.lp[i] == full.lp[i] && st.offsets[i] == full.offsets[i],
                       "%s %s: token %d streamed '%s' %g @%d, not '%s' %g @%d", what, x, i, st.tok[i], st.lp[i], st.offsets[i],
                       full.tok[i], full.lp[i], full.offsets[i]);
        }
    }
    EXPECT_EQ_INT(srv_stop(&sc, 60), 0);
}

typedef struct {
    int port;
    Resp r;
} DrainArg;

static void *drain_stream(void *p)
{
    DrainArg *a = p;
    post(a->port, "/v1/chat/completions",
         CHAT_BODY("drain", ",\"max_tokens\":200,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}"), &a->r);
    return NULL;
}

/* Last: SIGTERM while a stream runs; the stream completes and the server exits 0. */
TEST(server_99_shutdown)
{
    Srv *s = srv();
    ASSERT(s);
    DrainArg a = {.port = s->port};
    pthread_t t;
    pthread_create(&t, NULL, drain_stream, &a);
    double t0 = clock_now();
    while (metric(s->port, "moeserve_requests_running") < 1 && clock_now() - t0 < 10) usleep(10000);
    int rc = srv_stop(s, 120);
    pthread_join(t, NULL);
    EXPECT_EQ_INT(rc, 0);
    Stream st;
    stream_check(__FILE__, __LINE__, &a.r, 1, &st);
    EXPECT(st.has_usage && st.completion_tokens == 200, "the drained stream has %d tokens", st.completion_tokens);
    resp_free(&a.r);
    char cmd[700], *out = NULL;
    snprintf(cmd, sizeof cmd, "grep -c 'prompt +' '%s'", s->log);
    test_run(cmd, &out);
    EXPECT(out && atoi(out) > 0, "no log line per request: %s", out ? out : "");
    free(out);
}
