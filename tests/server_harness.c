/* server_harness: the server tests' shared model, server process, HTTP client and response
 * checks (server_harness.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "server_harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "test.h"

/* ---- the model and its tokenizer ---- */

const char *model_dir(void)
{
    static char dir[512];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/server-tiny", test_tmpdir());
        char cmd[1200], *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' synth --arch glm4_moe --preset tiny --quant nvfp4 --out '%s'", test_bin(), dir);
        if (test_run(cmd, &out) != 0) fprintf(stderr, "    $ %s\n%s", cmd, out ? out : "");
        free(out);
    }
    return dir;
}

ModelText *model_text(void)
{
    static ModelText mt;
    static int loaded;
    if (!loaded) {
        model_text_open(&mt, model_dir(), NULL, 0);
        loaded = 1;
    }
    return &mt;
}

/* Tokens of a completion prompt (with the tokenizer's special tokens, as the server does). */
int prompt_tokens(const char *text)
{
    int *ids = NULL;
    char err[256];
    int n = tokenizer_encode(model_text()->tok, text, strlen(text), 1, &ids, err, sizeof err);
    free(ids);
    return n;
}

/* Tokens of one user message through the chat template with the generation prompt. */
int chat_tokens(const char *user)
{
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", user);
    char *text = NULL, err[256];
    int *ids = NULL, n = -1;
    if (model_text_render(model_text(), msgs, NULL, NULL, 1, &text, err, sizeof err) == 0)
        n = tokenizer_encode(model_text()->tok, text, strlen(text), 0, &ids, err, sizeof err);
    json_decref(msgs);
    free(text);
    free(ids);
    return n;
}

/* ---- the server process ---- */

void srv_print_log(const Srv *s)
{
    char cmd[700], *out = NULL;
    snprintf(cmd, sizeof cmd, "tail -n 30 '%s'", s->log);
    test_run(cmd, &out);
    fprintf(stderr, "    server log (%s):\n%s", s->log, out ? out : "");
    free(out);
}

int srv_start(Srv *s, const char *name, const char *extra) { return srv_start_model(s, name, model_dir(), extra); }

int srv_start_model(Srv *s, const char *name, const char *dir, const char *extra)
{
    return srv_start_launched(s, name, dir, "", extra);
}

int srv_start_launched(Srv *s, const char *name, const char *dir, const char *launcher, const char *extra)
{
    static int serial;
    memset(s, 0, sizeof *s);
    snprintf(s->log, sizeof s->log, "%s/server-%s-%d.log", test_tmpdir(), name, serial++);
    char cmd[2048];
#ifdef __SANITIZE_ADDRESS__
    /* a small quarantine, so that the memory test sees the server's own growth */
    const char *env = "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16\" ";
#else
    const char *env = "";
#endif
    snprintf(cmd, sizeof cmd, "%sexec %s '%s' serve --model '%s' --port 0 --device cpu --threads 1 %s </dev/null 2>'%s'", env,
             launcher, test_bin(), dir, extra ? extra : "", s->log);
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        sigset_t none; /* a launcher (mpirun) must see the SIGTERM of srv_stop */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    s->pid = pid;
    char line[256];
    size_t n = 0;
    struct pollfd p = {.fd = fd[0], .events = POLLIN};
    while (n + 1 < sizeof line && poll(&p, 1, 120000) > 0) { /* loading under ASan takes a while */
        ssize_t got = read(fd[0], line + n, 1);
        if (got <= 0) break;
        if (line[n++] == '\n') break;
    }
    line[n] = 0;
    close(fd[0]);
    const char *at = strstr(line, "listening on http://127.0.0.1:");
    if (!at) {
        fprintf(stderr, "    the server did not start: stdout '%s'\n", line);
        srv_print_log(s);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        s->pid = 0;
        return -1;
    }
    s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
    return 0;
}

long srv_rss_kb(const Srv *s)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* SIGTERM and wait (at most timeout_s); the exit status, or -1 if it had to be killed. */
int srv_stop(Srv *s, double timeout_s)
{
    if (!s->pid) return -1;
    kill(s->pid, SIGTERM);
    return srv_wait(s, timeout_s);
}

int srv_wait(Srv *s, double timeout_s)
{
    if (!s->pid) return -1;
    double t0 = clock_now();
    int st = 0;
    for (;;) {
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid) break;
        if (clock_now() - t0 > timeout_s) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            srv_print_log(s);
            return -1;
        }
        usleep(20000);
    }
    s->pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || clock_now() - t0 > 10) {
        fprintf(stderr, "    the server took %.1f s to stop\n", clock_now() - t0);
        srv_print_log(s);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- an HTTP/1.1 client on plain sockets ---- */

void resp_free(Resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int hc_connect(int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct timeval tv = {.tv_sec = SRV_IO_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int tries = 0; connect(fd, (struct sockaddr *)&a, sizeof a) != 0; tries++) {
        if (errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR) { close(fd); return -1; }
        if (tries == 50) { close(fd); return -1; }
        usleep(20000);
    }
    return fd;
}

int hc_send(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int hc_send_request(int fd, const char *method, const char *path, const char *headers, const char *body, size_t len)
{
    char head[4096];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                     headers ? headers : "");
    if (body) n += snprintf(head + n, sizeof head - n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", len);
    n += snprintf(head + n, sizeof head - n, "\r\n");
    if (hc_send(fd, head, (size_t)n) != 0) return -1;
    return body && len ? hc_send(fd, body, len) : 0;
}

/* Read to the end of the connection; returns the bytes (malloc'ed, NUL-terminated). */
char *hc_read_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 + 1 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

const char *header_value(const char *head, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, name, nl) && p[2 + nl] == ':') {
            const char *v = p + 3 + nl;
            while (*v == ' ') v++;
            return v;
        }
    return NULL;
}

void hc_parse(char *raw, size_t n, Resp *r)
{
    memset(r, 0, sizeof *r);
    char *end = strstr(raw, "\r\n\r\n");
    if (!end || sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) {
        r->status = 0;
        r->body = calloc(1, 1);
        r->head = calloc(1, 1);
        return;
    }
    r->head = strndup(raw, (size_t)(end - raw) + 2);
    char *b = end + 4;
    size_t blen = n - (size_t)(b - raw);
    const char *te = header_value(r->head, "Transfer-Encoding");
    if (te && !strncasecmp(te, "chunked", 7)) {
        char *out = malloc(blen + 1), *p = b;
        size_t o = 0;
        while (p < raw + n) {
            size_t sz = strtoul(p, NULL, 16);
            char *crlf = strstr(p, "\r\n");
            if (!crlf || sz == 0) break;
            p = crlf + 2;
            if (p + sz > raw + n) sz = (size_t)(raw + n - p);
            memcpy(out + o, p, sz);
            o += sz;
            p += sz + 2;
        }
        out[o] = 0;
        r->body = out;
        r->body_len = o;
    } else {
        r->body = strndup(b, blen);
        r->body_len = blen;
    }
}

/* One request on a fresh connection; 0 if a response came back. */
int http(int port, const char *method, const char *path, const char *headers, const char *body, Resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = hc_connect(port, 0);
    if (fd < 0) return -1;
    if (hc_send_request(fd, method, path, headers, body, body ? strlen(body) : 0) != 0) {
        close(fd);
        return -1;
    }
    size_t n;
    char *raw = hc_read_all(fd, &n);
    close(fd);
    hc_parse(raw, n, r);
    free(raw);
    return r->status ? 0 : -1;
}

int post(int port, const char *path, const char *body, Resp *r) { return http(port, "POST", path, NULL, body, r); }

/* ---- response checks ---- */

/* The body as JSON (NULL and a failure if it is not). */
json_t *body_json(const Resp *r)
{
    json_error_t e;
    json_t *j = json_loads(r->body ? r->body : "", JSON_ALLOW_NUL, &e);
    if (!j) test_fail(__FILE__, __LINE__, "response body is not JSON (%s): '%.300s'", e.text, r->body ? r->body : "");
    return j;
}

/* The value at "a.b.0.c" (objects by key, arrays by index), or NULL. */
json_t *jget(json_t *o, const char *path)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = o;
    for (char *tok = strtok_r(buf, ".", &save); tok && v; tok = strtok_r(NULL, ".", &save))
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(tok)) : json_object_get(v, tok);
    return v;
}

const char *jstr(json_t *o, const char *path) { return json_string_value(jget(o, path)); }

long long jint(json_t *o, const char *path) { return json_integer_value(jget(o, path)); }

/* An OpenAI error object with this status and type; msg_part must occur in the message, param
 * (if given) must be the param. Prints the request on failure. */
void expect_error(const char *file, int line, const char *what, const Resp *r, int status, const char *type, const char *msg_part,
                         const char *param)
{
    int fails = test_failed_now();
    if (r->status != status) test_fail(file, line, "%s: status %d, expected %d; body '%.300s'", what, r->status, status, r->body);
    json_t *j = json_loads(r->body ? r->body : "", 0, NULL);
    const char *t = j ? jstr(j, "error.type") : NULL, *m = j ? jstr(j, "error.message") : NULL;
    json_t *err = j ? json_object_get(j, "error") : NULL;
    if (!t || !m || !json_object_get(err, "param") || !json_object_get(err, "code"))
        test_fail(file, line, "%s: not an OpenAI error object: '%.300s'", what, r->body);
    else {
        if (strcmp(t, type)) test_fail(file, line, "%s: error type '%s', expected '%s'", what, t, type);
        if (msg_part && !strcasestr(m, msg_part)) test_fail(file, line, "%s: message '%s' lacks '%s'", what, m, msg_part);
        const char *p = jstr(j, "error.param");
        if (param && (!p || strcmp(p, param))) test_fail(file, line, "%s: param '%s', expected '%s'", what, p ? p : "null", param);
    }
    if (!fails && test_failed_now()) fprintf(stderr, "    (request: %s)\n", what);
    json_decref(j);
}

void sse_parse(const char *body, Sse *s)
{
    s->chunks = json_array();
    s->done = s->bad = 0;
    for (const char *p = body; p && *p;) {
        const char *end = strstr(p, "\n\n");
        if (!end) { s->bad = 1; break; }
        if (strncmp(p, "data: ", 6) != 0) { s->bad = 1; break; }
        if (s->done) s->bad = 1; /* nothing after [DONE] */
        if (!strncmp(p + 6, "[DONE]\n\n", 8)) s->done = 1;
        else {
            json_t *j = json_loadb(p + 6, (size_t)(end - p - 6), JSON_ALLOW_NUL, NULL);
            if (!j) { s->bad = 1; break; }
            json_array_append_new(s->chunks, j);
        }
        p = end + 2;
    }
}

int stream_check(const char *file, int line, const Resp *r, int chat, Stream *st)
{
    memset(st, 0, sizeof *st);
    int fails = test_failed_now();
    if (r->status != 200) test_fail(file, line, "stream status %d: '%.300s'", r->status, r->body);
    const char *ct = r->head ? header_value(r->head, "Content-Type") : NULL;
    if (r->status == 200 && (!ct || strncmp(ct, "text/event-stream", 17)))
        test_fail(file, line, "stream content type '%.40s'", ct ? ct : "none");
    Sse s;
    sse_parse(r->body ? r->body : "", &s);
    if (s.bad || !s.done) test_fail(file, line, "malformed SSE (bad %d, done %d): '%.300s'", s.bad, s.done, r->body);
    const char *id0 = NULL;
    size_t n = json_array_size(s.chunks);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(s.chunks, i);
        const char *id = jstr(c, "id"), *obj = jstr(c, "object");
        if (!id || !obj || !json_is_integer(jget(c, "created")) || !jstr(c, "model") || !json_is_array(jget(c, "choices")))
            test_fail(file, line, "chunk %zu lacks id/object/created/model/choices", i);
        if (id && !id0) id0 = id;
        if (id && id0 && strcmp(id, id0)) test_fail(file, line, "chunk ids differ");
        if (obj && strcmp(obj, chat ? "chat.completion.chunk" : "text_completion")) test_fail(file, line, "object '%s'", obj);
        json_t *u = jget(c, "usage");
        if (u && !json_is_null(u)) {
            if (i + 1 != n || json_array_size(jget(c, "choices")) != 0) test_fail(file, line, "usage not in a last, choice-less chunk");
            st->has_usage = 1;
            st->prompt_tokens = (int)jint(c, "usage.prompt_tokens");
            st->completion_tokens = (int)jint(c, "usage.completion_tokens");
            st->total_tokens = (int)jint(c, "usage.total_tokens");
            continue;
        }
        json_t *ch = jget(c, "choices.0");
        if (!ch || jint(ch, "index") != 0 || !json_object_get(ch, "finish_reason") || !json_object_get(ch, "logprobs")) {
            test_fail(file, line, "chunk %zu: bad choice", i);
            continue;
        }
        const char *piece = chat ? jstr(ch, "delta.content") : jstr(ch, "text");
        if (chat && jstr(ch, "delta.role")) {
            st->n_role++;
            if (i != 0 || strcmp(jstr(ch, "delta.role"), "assistant")) test_fail(file, line, "role not in the first chunk");
        } else if (!piece || !*piece) {
            st->n_empty++;
        }
        if (piece) strncat(st->text, piece, sizeof st->text - strlen(st->text) - 1);
        const char *fin = jstr(ch, "finish_reason");
        if (fin) {
            if (st->finish[0]) test_fail(file, line, "two chunks with a finish_reason");
            snprintf(st->finish, sizeof st->finish, "%s", fin);
        }
        st->n_chunks++;
    }
    if (!st->finish[0]) test_fail(file, line, "no finish_reason in the stream");
    if (chat && st->n_role != 1) test_fail(file, line, "%d role chunks", st->n_role);
    json_decref(s.chunks);
    if (!fails && test_failed_now()) fprintf(stderr, "    (stream body: '%.500s')\n", r->body ? r->body : "");
    return test_failed_now() && !fails ? -1 : 0;
}

int full_check(const char *file, int line, const Resp *r, int chat, Full *f)
{
    memset(f, 0, sizeof *f);
    int fails = test_failed_now();
    if (r->status != 200) {
        test_fail(file, line, "status %d: '%.300s'", r->status, r->body);
        return -1;
    }
    json_t *j = body_json(r);
    if (!j) return -1;
    const char *id = jstr(j, "id"), *obj = jstr(j, "object");
    if (!id || strncmp(id, chat ? "chatcmpl-" : "cmpl-", chat ? 9 : 5)) test_fail(file, line, "id '%s'", id ? id : "none");
    if (!obj || strcmp(obj, chat ? "chat.completion" : "text_completion")) test_fail(file, line, "object '%s'", obj ? obj : "none");
    if (!json_is_integer(jget(j, "created")) || !jstr(j, "model")) test_fail(file, line, "no created/model");
    if (json_array_size(jget(j, "choices")) != 1 || jint(j, "choices.0.index") != 0 || !jget(j, "choices.0.logprobs"))
        test_fail(file, line, "bad choices");
    const char *text = chat ? jstr(j, "choices.0.message.content") : jstr(j, "choices.0.text");
    if (chat && (!jstr(j, "choices.0.message.role") || strcmp(jstr(j, "choices.0.message.role"), "assistant")))
        test_fail(file, line, "message role");
    if (!text && !(chat && json_is_null(jget(j, "choices.0.message.content")))) test_fail(file, line, "no text");
    else snprintf(f->text, sizeof f->text, "%s", text ? text : "");
    const char *fin = jstr(j, "choices.0.finish_reason");
    snprintf(f->finish, sizeof f->finish, "%s", fin ? fin : "");
    f->prompt_tokens = (int)jint(j, "usage.prompt_tokens");
    f->completion_tokens = (int)jint(j, "usage.completion_tokens");
    f->total_tokens = (int)jint(j, "usage.total_tokens");
    if (f->total_tokens != f->prompt_tokens + f->completion_tokens) test_fail(file, line, "total_tokens != prompt + completion");
    json_decref(j);
    if (!fails && test_failed_now()) fprintf(stderr, "    (body: '%.500s')\n", r->body);
    return test_failed_now() && !fails ? -1 : 0;
}

/* A metric's value from /metrics (-1 if absent). */
double metric(int port, const char *name)
{
    Resp r;
    double v = -1;
    if (http(port, "GET", "/metrics", NULL, NULL, &r) == 0) {
        size_t nl = strlen(name);
        for (const char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
            if (!strncmp(p, name, nl) && p[nl] == ' ') v = atof(p + nl + 1);
    }
    resp_free(&r);
    return v;
}

/* Whether python3 can import the official OpenAI client (tried once: pip install --user when
 * it cannot). */
int openai_python_ok(void)
{
    static int ok = -1;
    if (ok >= 0) return ok;
    ok = test_run("python3 -c 'import openai'", NULL) == 0;
    if (!ok) {
        fprintf(stderr, "    the openai package is missing: trying pip install --user openai\n");
        ok = test_run("python3 -m pip install --user --quiet --retries 1 --timeout 20 openai", NULL) == 0 &&
             test_run("python3 -c 'import openai'", NULL) == 0;
    }
    return ok;
}
