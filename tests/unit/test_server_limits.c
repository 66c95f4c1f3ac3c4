/* test_server_limits: `moeserve serve` against hostile clients on loopback (src/server/http.c).
 *   - a slow-trickle flood: many connections from 127.0.0.2 that each send a byte of their
 *     headers every quarter second; the server closes each by --header-timeout although it
 *     keeps sending, caps them at --max-connections-per-client, and /health probes and a
 *     completion from 127.0.0.1 are answered throughout; bodies trickled after their headers
 *     (with a Content-Length and chunked) are closed by their deadline too;
 *   - big uploads: uploads of almost 4 MiB, sent at once and dropped before their body ends,
 *     dropped right after it, or answered; the server's RSS comes back within 300 MB of what it
 *     was before them (under ASan too: big bodies are the server's own mmap'ed pages, and ASan
 *     unmaps the big blocks it frees).
 * Bounded: 100 connections at a time and 10 s for the flood, 160 uploads from five addresses;
 * loopback only.
 * Run: make test FILTER=server_limits. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "server_harness.h"

/* A connection from a chosen loopback address (127.0.0.0/8 is all local on Linux), blocking,
 * with send and receive timeouts; -1 if it cannot connect. */
static int connect_from(const char *src, int port, int timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &a.sin_addr);
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

/* The peer closed or reset the connection (without blocking; bytes it sent are read and
 * dropped). */
static int peer_closed(int fd)
{
    char b[256];
    for (;;) {
        ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (n > 0) continue;
        return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
}

/* ---- the slow-trickle flood ---- */

#define FLOOD_HEADER_S 2                          /* --header-timeout of the flooded server */
#define FLOOD_ARGS "--max-connections 48 --max-connections-per-client 16 --header-timeout 2 --body-min-rate 1"
#define FLOOD_S 10.0                              /* how long the flood lasts */
#define TRICKLE_S 0.25                            /* a byte this often per connection */
#define CLOSE_SLACK_S 6.0                         /* a busy machine's lateness on top of a deadline */
enum { FLOOD_CONNS = 100 };

typedef struct {
    int port;
    volatile int stop;
    int ok, failed;
    char why[256];
} Probe;

/* GET /health from 127.0.0.1 on a fresh connection every 0.2 s until told to stop; an answer
 * that does not come within 15 s is a failure. */
static void *health_probe(void *p)
{
    Probe *a = p;
    while (!a->stop) {
        int fd = connect_from("127.0.0.1", a->port, 15);
        Resp r = {0};
        if (fd >= 0 && hc_send_request(fd, "GET", "/health", NULL, NULL, 0) == 0) {
            size_t n;
            char *raw = hc_read_all(fd, &n);
            hc_parse(raw, n, &r);
            free(raw);
        }
        if (fd >= 0) close(fd);
        if (r.status == 200) a->ok++;
        else if (a->failed++ == 0)
            snprintf(a->why, sizeof a->why, "%s, status %d", fd < 0 ? "no connection" : "no answer within 15 s", r.status);
        resp_free(&r);
        usleep(200000);
    }
    return NULL;
}

typedef struct {
    int port;
    int connects, closed_trickling;   /* connections made; closed by the server while they trickled */
    double longest;                   /* the longest a trickling connection lived (closed or at the end) */
} Flood;

/* FLOOD_CONNS connections from 127.0.0.2, each sending its request line and headers a byte at
 * a time and never ending them; one that the server closes is made again 0.3 s later. */
static void *flood(void *p)
{
    Flood *f = p;
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: ";
    struct { int fd, sent; double t0, next, retry; } c[FLOOD_CONNS];
    for (int i = 0; i < FLOOD_CONNS; i++) c[i].fd = -1, c[i].retry = 0;
    double t_end = clock_now() + FLOOD_S;
    while (clock_now() < t_end) {
        for (int i = 0; i < FLOOD_CONNS; i++) {
            double now = clock_now();
            if (c[i].fd < 0) {
                if (now < c[i].retry) continue;
                c[i].fd = connect_from("127.0.0.2", f->port, 5);
                c[i].t0 = c[i].next = now;
                c[i].sent = 0;
                c[i].retry = now + 0.3;
                if (c[i].fd >= 0) f->connects++;
                continue;
            }
            int gone = peer_closed(c[i].fd);
            if (!gone && now >= c[i].next) {
                char b = c[i].sent < (int)sizeof head - 1 ? head[c[i].sent] : 'a';
                gone = send(c[i].fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1 && errno != EAGAIN;
                c[i].sent++;
                c[i].next = now + TRICKLE_S;
            }
            if (gone) {
                double life = now - c[i].t0;
                if (c[i].sent >= 4) { /* it was accepted and trickled for a second at least */
                    f->closed_trickling++;
                    if (life > f->longest) f->longest = life;
                }
                close(c[i].fd);
                c[i].fd = -1;
                c[i].retry = now + 0.3;
            }
        }
        usleep(20000);
    }
    for (int i = 0; i < FLOOD_CONNS; i++)
        if (c[i].fd >= 0) {
            if (clock_now() - c[i].t0 > f->longest) f->longest = clock_now() - c[i].t0;
            close(c[i].fd);
        }
    return NULL;
}

/* A request whose headers are whole and whose body then comes a byte every quarter second:
 * how long the server let it go on (it is closed by then), or -1 if still open after limit_s. */
static double trickle_body(int port, const char *headers, const char *piece, double limit_s)
{
    int fd = connect_from("127.0.0.3", port, 5);
    if (fd < 0) return -2;
    double t0 = clock_now();
    char head[512];
    int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n",
                     headers);
    if (hc_send(fd, head, (size_t)n) != 0) { close(fd); return -2; }
    double life = -1;
    while (clock_now() - t0 < limit_s) {
        if (peer_closed(fd) || send(fd, piece, strlen(piece), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            life = clock_now() - t0;
            break;
        }
        usleep((useconds_t)(TRICKLE_S * 1e6));
    }
    close(fd);
    return life;
}

TEST(server_limits_1_trickle_flood)
{
    Srv s;
    ASSERT(srv_start(&s, "flood", FLOOD_ARGS) == 0);
    Probe pr = {.port = s.port};
    Flood fl = {.port = s.port};
    pthread_t tp, tf;
    pthread_create(&tf, NULL, flood, &fl);
    usleep(500000); /* the flood has taken what it can */
    pthread_create(&tp, NULL, health_probe, &pr);
    /* a generation from another address in the middle of it */
    usleep((useconds_t)(FLOOD_S / 2 * 1e6));
    Resp r;
    post(s.port, "/v1/completions", "{\"prompt\":\"Under siege\",\"max_tokens\":3,\"ignore_eos\":true}", &r);
    EXPECT(r.status == 200, "a completion during the flood: status %d '%.200s'", r.status, r.body ? r.body : "");
    resp_free(&r);
    pthread_join(tf, NULL);
    pr.stop = 1;
    pthread_join(tp, NULL);
    fprintf(stderr, "    flood: %d connections from 127.0.0.2, %d closed while trickling (the longest lived %.1f s); "
            "/health from 127.0.0.1: %d answered, %d not\n", fl.connects, fl.closed_trickling, fl.longest, pr.ok, pr.failed);
    EXPECT(pr.failed == 0 && pr.ok >= 10, "/health during the flood: %d answered, %d not (first: %s)", pr.ok, pr.failed, pr.why);
    EXPECT(fl.closed_trickling > 0, "no trickling connection was closed by the server in %.0f s", FLOOD_S);
    EXPECT(fl.longest <= FLOOD_HEADER_S + CLOSE_SLACK_S, "a connection trickling its headers lived %.1f s (--header-timeout %d)",
           fl.longest, FLOOD_HEADER_S);

    /* bodies trickled after whole headers: 2 s + 2048 B at 1 KiB/s, and chunked (2 s + what came at 1 KiB/s) */
    double limit = FLOOD_HEADER_S + 2 + CLOSE_SLACK_S;
    double life = trickle_body(s.port, "Content-Length: 2048\r\n", "a", limit + 2);
    EXPECT(life >= 0 && life <= limit, "a body trickled after its headers (Content-Length 2048) lived %s %.1f s",
           life < 0 ? "more than" : "", life < 0 ? limit + 2 : life);
    life = trickle_body(s.port, "Transfer-Encoding: chunked\r\n", "1\r\na\r\n", limit + 2);
    EXPECT(life >= 0 && life <= limit, "a chunked body trickled after its headers lived %s %.1f s", life < 0 ? "more than" : "",
           life < 0 ? limit + 2 : life);

    /* the server is whole */
    ASSERT(http(s.port, "GET", "/health", NULL, NULL, &r) == 0);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
}

/* ---- big uploads dropped ---- */

enum { UPLOADS = 160 };
#define UPLOAD_BYTES ((4u << 20) - 1024)          /* under the default --max-body of 4 MiB */
#define RSS_SLACK_KB (300 * 1024)

typedef struct {
    int port, kind, status;
    const char *src;
    const char *body;
} Upload;

/* kind 0: the headers and half the body, then a reset; 1: the whole body, then a close
 * without reading; 2: the whole body and its answer. */
static void *upload(void *p)
{
    Upload *a = p;
    int fd = connect_from(a->src, a->port, 120);
    if (fd < 0) return NULL;
    char head[256];
    int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %u\r\n\r\n", UPLOAD_BYTES);
    size_t len = a->kind == 0 ? UPLOAD_BYTES / 2 : UPLOAD_BYTES;
    if (hc_send(fd, head, (size_t)n) == 0 && hc_send(fd, a->body, len) == 0) {
        if (a->kind == 0) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        } else if (a->kind == 2) {
            size_t got;
            char *raw = hc_read_all(fd, &got);
            Resp r;
            hc_parse(raw, got, &r);
            a->status = r.status;
            free(raw);
            resp_free(&r);
        }
    }
    close(fd);
    return NULL;
}

TEST(server_limits_2_upload_memory)
{
    Srv s;
    ASSERT(srv_start(&s, "upload", "") == 0);
    Resp r;
    for (int i = 0; i < 8; i++) { /* the base: a server that has answered a few requests */
        post(s.port, "/v1/completions", "{\"prompt\":\"Warm up\",\"max_tokens\":2}", &r);
        EXPECT_EQ_INT(r.status, 200);
        resp_free(&r);
    }
    long base = srv_rss_kb(&s);
    ASSERT(base > 0);
    /* {"prompt":"x","max_tokens":1,"user":"aaa...a"}: a valid request of UPLOAD_BYTES bytes */
    char *body = malloc(UPLOAD_BYTES);
    const char *pre = "{\"prompt\":\"x\",\"max_tokens\":1,\"user\":\"";
    memset(body, 'a', UPLOAD_BYTES);
    memcpy(body, pre, strlen(pre));
    memcpy(body + UPLOAD_BYTES - 2, "\"}", 2);
    static Upload up[UPLOADS];
    pthread_t th[UPLOADS];
    /* from five addresses, within the default cap per client */
    static const char *src[] = {"127.0.0.1", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"};
    for (int i = 0; i < UPLOADS; i++) {
        up[i] = (Upload){.port = s.port, .kind = i % 3, .src = src[i % 5], .body = body};
        pthread_create(&th[i], NULL, upload, &up[i]);
    }
    long peak = base;
    int answered = 0;
    for (int i = 0; i < UPLOADS; i++) {
        long kb = srv_rss_kb(&s);
        if (kb > peak) peak = kb;
        pthread_join(th[i], NULL);
        if (up[i].kind == 2) {
            EXPECT(up[i].status == 200, "upload %d: status %d", i, up[i].status);
            answered += up[i].status == 200;
        }
    }
    free(body);
    /* idle again: RSS comes back (polled; the server may give memory back a little later) */
    double t0 = clock_now();
    long now = srv_rss_kb(&s);
    while (now - base > RSS_SLACK_KB && clock_now() - t0 < 60) {
        usleep(250000);
        now = srv_rss_kb(&s);
    }
    fprintf(stderr, "    %d uploads of %u bytes (%d answered): server RSS %ld kB before, %ld kB at least at the peak, "
            "%ld kB %.1f s after\n", UPLOADS, UPLOAD_BYTES, answered, base, peak, now, clock_now() - t0);
    EXPECT(now - base <= RSS_SLACK_KB, "RSS stays %ld MB over its base of %ld MB after the uploads ended", (now - base) >> 10,
           base >> 10);
    ASSERT(http(s.port, "GET", "/health", NULL, NULL, &r) == 0);
    EXPECT_EQ_INT(r.status, 200);
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
}

/* ---- a client's pool of idle kept-alive connections ---- */

/* GET /health on a kept-alive connection and read its one answer (headers, then Content-Length
 * bytes); the status, or 0 if the connection closed or timed out first. */
static int health_keepalive(int fd)
{
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) return 0;
    char b[4096];
    size_t n = 0;
    char *end = NULL;
    while (!end) {
        if (n == sizeof b - 1) return 0;
        ssize_t r = recv(fd, b + n, sizeof b - 1 - n, 0);
        if (r <= 0) return 0;
        n += (size_t)r;
        b[n] = 0;
        end = strstr(b, "\r\n\r\n");
    }
    const char *cl = strcasestr(b, "Content-Length:");
    size_t body = cl && cl < end ? (size_t)strtoul(cl + 15, NULL, 10) : 0, have = n - (size_t)(end + 4 - b);
    while (have < body) {
        ssize_t r = recv(fd, b, sizeof b, 0);
        if (r <= 0) return 0;
        have += (size_t)r;
    }
    int status = 0;
    sscanf(b, "HTTP/1.%*d %d", &status);
    return status;
}

/* A client at its --max-connections-per-client whose connections all sit idle between requests
 * (a benchmark's pool after its run) opens one more: the server closes its longest idle one to
 * make room and answers the new one; the other idle ones stay usable. */
TEST(server_limits_3_idle_pool)
{
    enum { CAP = 4 };
    Srv s;
    ASSERT(srv_start(&s, "idlepool", "--max-connections-per-client 4 --header-timeout 60") == 0);
    int fd[CAP + 1];
    for (int i = 0; i < CAP; i++) {
        fd[i] = connect_from("127.0.0.3", s.port, 30);
        ASSERT(fd[i] >= 0);
        EXPECT_EQ_INT(health_keepalive(fd[i]), 200);
        usleep(50000); /* the first is the longest idle */
    }
    usleep(1500000); /* every one now waits for its client past the server's 1 s: each counts */
    fd[CAP] = connect_from("127.0.0.3", s.port, 30);
    ASSERT(fd[CAP] >= 0);
    EXPECT(health_keepalive(fd[CAP]) == 200, "a new connection of a client whose %d others idle was not answered", CAP);
    int closed = 0;
    for (int t = 0; t < 100 && !(closed = peer_closed(fd[0])); t++) usleep(100000);
    EXPECT(closed, "the longest idle connection was not closed to make room");
    for (int i = 1; i <= CAP; i++) EXPECT(health_keepalive(fd[i]) == 200, "idle connection %d no longer answered", i);
    for (int i = 0; i <= CAP; i++) close(fd[i]);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
}
