/* server_harness: what the server tests share (tests/unit/test_server.c, test_server_tools.c):
 * the tiny synth checkpoint they serve (built-in tokenizer and chat template) and its token
 * counts, `moeserve serve` as a child process on a free port, a small HTTP/1.1 client on plain
 * sockets (Content-Length and chunked bodies, SSE), checks of the OpenAI response shapes, and
 * whether the official OpenAI Python client is there.
 * The checks report failures at the caller's file and line (pass __FILE__, __LINE__). */
#ifndef MOESERVE_SERVER_HARNESS_H
#define MOESERVE_SERVER_HARNESS_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

#include "format/model_text.h"

#define SRV_CONTEXT 4096        /* the tiny preset's max_position_embeddings */
#define SRV_IO_TIMEOUT_S 120    /* a socket read that takes longer is a hang */

#define CHAT_BODY(user, extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"" user "\"}]" extra "}"

/* ---- the model and its tokenizer ---- */

/* The tiny glm4_moe synth checkpoint (NVFP4), written once per run into the test directory. */
const char *model_dir(void);
ModelText *model_text(void);
/* Tokens of a completion prompt (with the tokenizer's special tokens, as the server does). */
int prompt_tokens(const char *text);
/* Tokens of one user message through the chat template with the generation prompt. */
int chat_tokens(const char *user);

/* ---- the server process ---- */

typedef struct {
    pid_t pid;
    int port;
    char log[600];              /* its stderr */
} Srv;

/* Start `moeserve serve --model model_dir() --port 0 --device cpu` with extra arguments; 0 when
 * it listens (its port in s->port). */
int srv_start(Srv *s, const char *name, const char *extra);
/* The same on another model directory. */
int srv_start_model(Srv *s, const char *name, const char *dir, const char *extra);
/* The same started through a launcher command (e.g. "mpirun -np 2"); stopping signals it. */
int srv_start_launched(Srv *s, const char *name, const char *dir, const char *launcher, const char *extra);
/* SIGTERM and wait (at most timeout_s); the exit status, or -1 if it had to be killed. */
int srv_stop(Srv *s, double timeout_s);
/* Wait without signalling (someone else asked it to stop); as srv_stop. */
int srv_wait(Srv *s, double timeout_s);
void srv_print_log(const Srv *s);
/* The server process's resident memory (VmRSS), kB; -1 if unreadable. */
long srv_rss_kb(const Srv *s);

/* ---- an HTTP/1.1 client on plain sockets ---- */

typedef struct {
    int status;                /* 0: no response (connection closed or reset) */
    char *head;                /* status line and headers */
    char *body;                /* the body, de-chunked, NUL-terminated */
    size_t body_len;
} Resp;

void resp_free(Resp *r);
int hc_connect(int port, int rcvbuf);
int hc_send(int fd, const char *p, size_t n);
int hc_send_request(int fd, const char *method, const char *path, const char *headers, const char *body, size_t len);
/* Read to the end of the connection; returns the bytes (malloc'ed, NUL-terminated). */
char *hc_read_all(int fd, size_t *len);
const char *header_value(const char *head, const char *name);
void hc_parse(char *raw, size_t n, Resp *r);
/* One request on a fresh connection; 0 if a response came back. */
int http(int port, const char *method, const char *path, const char *headers, const char *body, Resp *r);
int post(int port, const char *path, const char *body, Resp *r);

/* ---- response checks ---- */

/* The body as JSON (NULL and a failure if it is not). */
json_t *body_json(const Resp *r);
/* The value at "a.b.0.c" (objects by key, arrays by index), or NULL. */
json_t *jget(json_t *o, const char *path);
const char *jstr(json_t *o, const char *path);
long long jint(json_t *o, const char *path);
/* An OpenAI error object with this status and type; msg_part must occur in the message, param
 * (if given) must be the param. Prints the request on failure. */
void expect_error(const char *file, int line, const char *what, const Resp *r, int status, const char *type, const char *msg_part,
                  const char *param);

/* SSE: the data events of a stream, parsed; done: "[DONE]" came last. */
typedef struct {
    json_t *chunks;            /* array */
    int done, bad;
} Sse;

void sse_parse(const char *body, Sse *s);

/* A finished stream: texts concatenated (chat: the content deltas), finish reason, usage (if
 * sent). */
typedef struct {
    char text[65536];
    char finish[16];
    int prompt_tokens, completion_tokens, total_tokens, has_usage, n_chunks, n_role, n_empty;
} Stream;

/* Checks the shape of every chunk; 0 when well-formed. */
int stream_check(const char *file, int line, const Resp *r, int chat, Stream *st);

/* A finished non-streaming response's text (chat: the message content; "" when null), finish
 * reason and usage. */
typedef struct {
    char text[65536];
    char finish[16];
    int prompt_tokens, completion_tokens, total_tokens;
} Full;

int full_check(const char *file, int line, const Resp *r, int chat, Full *f);

/* A metric's value from /metrics (-1 if absent). */
double metric(int port, const char *name);

/* Whether python3 can import the official OpenAI client (tried once: pip install --user when
 * it cannot). */
int openai_python_ok(void);

#endif
