/* http: libmicrohttpd glue (http.h). Who touches what:
 *   - MHD polling threads run the access handler, the stream reader and the completion
 *     callback of a connection (always the same thread for one connection);
 *   - the engine thread calls slot_notify, with the engine's mutex held: it only resumes a
 *     suspended connection or leaves a note, under the slot's mutex, and never calls back into
 *     the engine. The MHD side never holds a slot's mutex while it calls the engine, so the
 *     lock order is always engine -> slot -> MHD's own.
 * A connection waits for tokens like this: clear the note, poll the engine, and if nothing
 * came, suspend under the slot's mutex unless a note arrived meanwhile; the engine's notify
 * resumes it.
 * Deadlines: each open connection is a Conn (MHD's socket context) on a list that a keeper
 * thread looks through every HTTP_KEEPER_TICK_MS; a connection whose headers or body are late
 * is shut down (shutdown(2): MHD reads the end of input and closes it in its own thread). MHD
 * reports a connection closed before it closes its socket, and the Conn leaves the list then,
 * under conn_mu, so the keeper never touches a descriptor that was closed or reused. The
 * keeper also gives freed memory back to the system after big requests (malloc_trim). */
#include "http.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/util.h"

#define HTTP_HEADER_LIMIT (32 * 1024)   /* bytes of request line + headers per connection */
#define HTTP_STREAM_BLOCK (16 * 1024)   /* bytes MHD asks the stream reader for at most */

#define HTTP_MAX_DROP (64 << 20) /* the most of an oversized chunked body read to answer it */

#define HTTP_BODY_SMALL (64 * 1024)   /* a body past this many bytes gets pages of its own (mmap) */
#define HTTP_TRIM_BYTES (1u << 20)    /* a request that held this much: give freed memory back to the system */
#define HTTP_KEEPER_TICK_MS 200       /* how often deadlines are checked */
#define HTTP_KEEPER_LOG_S 10.0        /* at most one line this often about connections closed for being late */
#define HTTP_SLOW_S 1.0               /* a connection waiting this long for its client counts against the client's cap */

/* What a connection's deadline waits for: nothing, its first request's headers, a later request
 * on a kept-alive connection (closing an idle one is routine), a body. */
enum { CONN_IDLE, CONN_HEADERS, CONN_NEXT, CONN_BODY };

/* An open connection, from its accept to its close (MHD's socket context). */
typedef struct Conn {
    struct Conn *prev, *next;  /* HttpServer.conns; all fields under conn_mu */
    MHD_socket fd;
    int waiting;               /* CONN_*: what must arrive by the deadline */
    double deadline;           /* clock_now() time; 0: none (a request is being answered) */
    double since;              /* when it began to wait for `waiting` */
    int expired;               /* shut down by the keeper for missing its deadline */
    unsigned char addr[16];    /* the client's address (IPv4 in the first 4 bytes) */
} Conn;

typedef struct Slot {
    /* shared with the engine thread, under mu */
    pthread_mutex_t mu;
    struct MHD_Connection *conn;
    uint64_t wake_id;          /* the engine requests whose notifications count: wake_id .. + wake_n - 1 (n
                                  choices); 0: none */
    int wake_n;
    int suspended;             /* the connection is suspended, waiting for slot_notify */
    int notified;              /* events arrived while the connection was not suspended */
    /* the connection's own thread only */
    struct HttpServer *srv;
    struct Slot *next_free;
    int busy;                  /* taken from the pool (under the pool's mutex) */
    int started;               /* the request was handed to openai_get / openai_start */
    int status;                /* HTTP status sent */
    MetricsRoute mroute;
    ApiBuf body;                  /* the request body while it is small (reused from request to request) */
    char *big;                    /* or, past HTTP_BODY_SMALL bytes, all of it in pages of its own */
    size_t big_len, big_cap;
    size_t over;                  /* bytes of a chunked body past max_body, read and dropped (413) */
    int chunked;                  /* no Content-Length: the body's deadline follows what has come */
    int body_in;                  /* the whole body has come (its deadline is off) */
    double t_head;                /* when the headers were in */
    ApiReq req;
} Slot;

struct HttpServer {
    HttpOptions o;
    Api *api;                  /* borrowed */
    struct MHD_Daemon *d;
    int port;
    Slot *slots;               /* [n_slots] */
    int n_slots;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;    /* signalled when a slot comes back */
    Slot *free_list;
    int in_use;                /* slots taken */
    int in_flight;             /* of which hold a whole request being answered (not one still uploading) */
    volatile int closing;      /* http_stop: no connection may suspend any more */
    /* the open connections and their deadlines; the keeper thread */
    pthread_mutex_t conn_mu;
    pthread_cond_t keeper_cv;
    Conn *conns;
    pthread_t keeper;
    int keeper_on, keeper_stop;
    int trim;                  /* a big request ended: malloc_trim at the keeper's next tick */
    int late_heads, late_bodies; /* connections closed for being late, not yet logged */
    int over_cap;              /* connections refused by --max-connections-per-client, not yet logged */
    int n_conns;               /* open connections */
};

void http_options_default(HttpOptions *o)
{
    *o = (HttpOptions){.host = "127.0.0.1", .port = 8000, .max_body = 4u << 20, .max_connections = 1024, .threads = 2,
                       .timeout_s = 60, .header_timeout_s = 10, .body_min_rate = 64 * 1024, .max_per_client = 64,
                       .drain_timeout_s = 60};
}

/* --max-body MB and --body-min-rate KB into bytes */
static int take_scaled(const char *v, size_t *dst, int shift, long lo, long hi, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        snprintf(err, errlen, "'%s' is not an integer in [%ld, %ld]", v, lo, hi);
        return -1;
    }
    *dst = (size_t)x << shift;
    return 0;
}
static int take_mb(const char *v, void *dst, char *err, size_t errlen) { return take_scaled(v, dst, 20, 1, 4096, err,
errlen); }
static int take_kb(const char *v, void *dst, char *err, size_t errlen) { return take_scaled(v, dst, 10, 0, 1 << 20,
err, errlen); }

OptGroup http_opt_group(HttpOptions *o)
{
    OPT_GROUP_RETURN("server",
        {.names = "--host", .type = OPT_STR, .dst = &o->host, .metavar = "ADDR", .help = "the address to listen on",
         .def = o->host},
        {.names = "--port", .type = OPT_INT, .dst = &o->port, .metavar = "N", .help = "the port (0: any free one)",
         .def = opt_def("%d", o->port), .lo = 0, .hi = 65535},
        {.names = "--max-body", .type = OPT_FN, .dst = &o->max_body, .metavar = "MB",
         .help = "the largest request body",
         .def = opt_def("%zu", o->max_body >> 20), .fn = take_mb},
        {.names = "--max-connections", .type = OPT_INT, .dst = &o->max_connections, .metavar = "N",
         .help = "connections open at once", .def = opt_def("%d", o->max_connections), .lo = 1, .hi = 1 << 16},
        {.names = "--max-connections-per-client", .type = OPT_INT, .dst = &o->max_per_client, .metavar = "N",
         .help = "connections one client address may hold waiting (0: no limit)",
         .def = opt_def("%d", o->max_per_client),
         .lo = 0, .hi = 1 << 16},
        {.names = "--header-timeout", .type = OPT_INT, .dst = &o->header_timeout_s, .metavar = "S",
         .help = "seconds for a request's headers to arrive (0: no limit)", .def = opt_def("%d", o->header_timeout_s),
         .lo = 0, .hi = 86400},
        {.names = "--body-min-rate", .type = OPT_FN, .dst = &o->body_min_rate, .metavar = "KB",
         .help = "KB/s a request body must arrive at, after --header-timeout (0: no limit)",
         .def = opt_def("%zu", o->body_min_rate >> 10), .fn = take_kb},
        {.names = "--http-threads", .type = OPT_INT, .dst = &o->threads, .metavar = "N",
         .help = "threads polling connections",
         .def = opt_def("%d", o->threads), .lo = 1, .hi = 256},
        {.names = "--drain-timeout", .type = OPT_INT, .dst = &o->drain_timeout_s, .metavar = "S",
         .help = "at SIGINT or SIGTERM, seconds the accepted requests get to finish",
         .def = opt_def("%d", o->drain_timeout_s),
         .lo = 0, .hi = 86400});
}

/* ---- the slot pool ---- */

static Slot *slot_get(HttpServer *h)
{
    pthread_mutex_lock(&h->pool_mu);
    Slot *s = h->free_list;
    if (s) {
        h->free_list = s->next_free;
        s->busy = 1;
        h->in_use++;
    }
    pthread_mutex_unlock(&h->pool_mu);
    if (!s) return NULL;
    s->started = 0;
    s->status = 0;
    s->mroute = METRICS_ROUTE_OTHER;
    s->body.len = 0;
    s->over = 0;
    s->chunked = 0;
    s->body_in = 0;
    openai_req_reset(&s->req);
    metrics_req_start(&s->req.mr);
    return s;
}

static void slot_put(HttpServer *h, Slot *s)
{
    pthread_mutex_lock(&h->pool_mu);
    s->next_free = h->free_list;
    h->free_list = s;
    s->busy = 0;
    h->in_use--;
    if (s->started) h->in_flight--;
    pthread_cond_broadcast(&h->pool_cv);
    pthread_mutex_unlock(&h->pool_mu);
}

/* ---- the request body ---- */

/* Small bodies go to the slot's buffer, kept from request to request. A bigger one moves to
 * pages of its own, grown as bytes arrive (mremap moves pages, it copies nothing) and unmapped
 * when its request ends: the memory of big uploads goes back to the system at once, whatever
 * the allocator would keep, and a body announced but never sent costs nothing. -1: no memory. */
static int body_add(Slot *s, const char *p, size_t n)
{
    if (!s->big && s->body.len + n <= HTTP_BODY_SMALL) {
        openai_buf_add(&s->body, p, n);
        return 0;
    }
    size_t len = s->big ? s->big_len : s->body.len;
    if (len + n + 1 > s->big_cap) {
        size_t cap = s->big_cap ? s->big_cap : 2 * HTTP_BODY_SMALL;
        while (cap < len + n + 1) cap *= 2;
        void *q = s->big ? mremap(s->big, s->big_cap, cap, MREMAP_MAYMOVE)
                         : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) return -1;
        if (!s->big) {
            memcpy(q, s->body.p, s->body.len);
            s->body.len = 0;
        }
        s->big = q;
        s->big_cap = cap;
    }
    memcpy(s->big + len, p, n);
    s->big_len = len + n;
    s->big[s->big_len] = 0;
    return 0;
}

static size_t body_len(const Slot *s) { return s->big ? s->big_len : s->body.len; }
static const char *body_ptr(const Slot *s) { return s->big ? s->big : s->body.p; }

static void body_release(Slot *s)
{
    if (s->big) munmap(s->big, s->big_cap);
    s->big = NULL;
    s->big_len = s->big_cap = 0;
    s->body.len = 0;
}

/* ---- deadlines ---- */

static Conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* From now on the connection waits for `waiting` until `deadline` (0: for nothing). */
static void conn_wait(HttpServer *h, struct MHD_Connection *c, int waiting, double deadline)
{
    Conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&h->conn_mu);
    if (!k->expired) {
        if (k->waiting != waiting) k->since = clock_now();
        k->waiting = waiting;
        k->deadline = deadline;
    }
    pthread_mutex_unlock(&h->conn_mu);
}

/* A request of the connection has ended: the headers of its next one are due (an idle
 * kept-alive connection is closed after header_timeout_s). Returns whether the keeper closed it
 * for being late. */
static int conn_request_ended(HttpServer *h, struct MHD_Connection *c)
{
    Conn *k = conn_of(c);
    if (!k) return 0;
    pthread_mutex_lock(&h->conn_mu);
    int expired = k->expired;
    if (!expired) {
        k->waiting = CONN_NEXT;
        k->since = clock_now();
        k->deadline = h->o.header_timeout_s > 0 ? k->since + h->o.header_timeout_s : 0;
    }
    pthread_mutex_unlock(&h->conn_mu);
    return expired;
}

/* The body is due: header_timeout_s from the end of the headers, plus a second per body_min_rate
 * bytes of it (of its Content-Length, or of what has come of a chunked one). */
static void conn_wait_body(HttpServer *h, Slot *s, size_t bytes)
{
    double d = 0;
    if (h->o.header_timeout_s > 0 && h->o.body_min_rate > 0)
        d = s->t_head + h->o.header_timeout_s + (double)bytes / (double)h->o.body_min_rate;
    conn_wait(h, s->conn, CONN_BODY, d);
}

/* --max-connections-per-client: does the client at addr hold too many connections for one
 * more? Counted are its connections that wait for it (a request's headers or body, or the next
 * request on a kept-alive connection), those that have waited at least HTTP_SLOW_S: a client
 * that sends its requests promptly can have as many answered at once as it likes (a benchmark
 * streaming 256 requests from one machine), one that trickles or idles holds at most N. Once the
 * server's connections are three quarters taken, every waiting one counts, young or not, so that
 * a burst cannot fill the rest. At the cap, the client's longest idle kept-alive connections
 * (between requests, holding nothing) are closed to make room, as a keep-alive timeout would
 * close them: a client with a pool of idle connections (a benchmark after its run) still gets
 * its new one answered; one whose connections trickle requests does not. Under conn_mu. */
static int over_client_cap(HttpServer *h, const unsigned char *addr, double now)
{
    int cap = h->o.max_per_client;
    if (cap <= 0) return 0;
    int crowded = 4 * h->n_conns >= 3 * h->o.max_connections;
    for (;;) {
        int n = 0;
        Conn *idle = NULL;
        for (Conn *k = h->conns; k; k = k->next)
            if (k->waiting != CONN_IDLE && !k->expired && !memcmp(k->addr, addr, sizeof k->addr) &&
                (crowded || now - k->since >= HTTP_SLOW_S)) {
                n++;
                if (k->waiting == CONN_NEXT && (!idle || k->since < idle->since)) idle = k;
            }
        if (n < cap) return 0;
        if (!idle) return 1;
        shutdown(idle->fd, SHUT_RDWR); /* MHD reads the end of input and closes it */
        idle->expired = 1;
        idle->deadline = 0;
    }
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code)
{
    HttpServer *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) { /* just accepted */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        Conn *k = xcalloc(1, sizeof *k);
        k->fd = ci ? ci->connect_fd : MHD_INVALID_SOCKET;
        k->waiting = CONN_HEADERS;
        k->since = clock_now();
        k->deadline = h->o.header_timeout_s > 0 && k->fd != MHD_INVALID_SOCKET ? k->since + h->o.header_timeout_s : 0;
        if (ai && ai->client_addr) {
            const struct sockaddr *sa = ai->client_addr;
            if (sa->sa_family == AF_INET) memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
            else if (sa->sa_family == AF_INET6) memcpy(k->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        }
        pthread_mutex_lock(&h->conn_mu);
        if (k->fd != MHD_INVALID_SOCKET && over_client_cap(h, k->addr, k->since)) {
            shutdown(k->fd, SHUT_RDWR); /* MHD reads the end of input and closes it */
            k->expired = 1;
            k->deadline = 0;
            h->over_cap++;
        }
        k->next = h->conns;
        if (h->conns) h->conns->prev = k;
        h->conns = k;
        h->n_conns++;
        pthread_mutex_unlock(&h->conn_mu);
        *socket_context = k;
        return;
    }
    Conn *k = *socket_context; /* MHD_CONNECTION_NOTIFY_CLOSED: its socket is closed right after */
    if (!k) return;
    pthread_mutex_lock(&h->conn_mu);
    if (k->prev) k->prev->next = k->next;
    else h->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    h->n_conns--;
    pthread_mutex_unlock(&h->conn_mu);
    free(k);
    *socket_context = NULL;
}

/* The keeper thread: shuts down the connections past their deadline, gives freed memory back
 * to the system after big requests, and says now and then how many connections were late. */
static void *keeper_main(void *arg)
{
    HttpServer *h = arg;
    double last_log = 0;
    pthread_mutex_lock(&h->conn_mu);
    while (!h->keeper_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += HTTP_KEEPER_TICK_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&h->keeper_cv, &h->conn_mu, &until);
        if (h->keeper_stop) break;
        double now = clock_now();
        for (Conn *k = h->conns; k; k = k->next)
            if (k->deadline > 0 && now > k->deadline) {
                shutdown(k->fd, SHUT_RDWR); /* MHD reads the end of input and closes the connection */
                k->deadline = 0;
                k->expired = 1;
                if (k->waiting == CONN_BODY) h->late_bodies++;
                else if (k->waiting == CONN_HEADERS) h->late_heads++;
            }
        int trim = h->trim, heads = 0, bodies = 0, capped = 0;
        h->trim = 0;
        if ((h->late_heads || h->late_bodies || h->over_cap) && now - last_log >= HTTP_KEEPER_LOG_S) {
            heads = h->late_heads;
            bodies = h->late_bodies;
            capped = h->over_cap;
            h->late_heads = h->late_bodies = h->over_cap = 0;
            last_log = now;
        }
        pthread_mutex_unlock(&h->conn_mu);
        if (heads)
            log_warn("http: closed %d connections whose request headers were not in within %d s of their accept (--header-timeout)",
                     heads, h->o.header_timeout_s);
        if (capped)
            log_warn("http: refused %d connections of clients that held %d waiting ones (--max-connections-per-client)", capped,
                     h->o.max_per_client);
        if (bodies)
            log_warn("http: closed %d connections whose request body was not in within %d s plus 1 s per %zu KiB (--header-timeout, "
                     "--body-min-rate)", bodies, h->o.header_timeout_s, h->o.body_min_rate >> 10);
#ifdef __GLIBC__
        if (trim) malloc_trim(0); /* what the allocator keeps of freed big requests (parsed JSON, buffers) */
#else
        (void)trim;
#endif
        pthread_mutex_lock(&h->conn_mu);
    }
    pthread_mutex_unlock(&h->conn_mu);
    return NULL;
}

/* Engine thread, engine mutex held: new events wait for request id. */
static void slot_notify(void *user, uint64_t id)
{
    Slot *s = user;
    pthread_mutex_lock(&s->mu);
    if (s->wake_id && id >= s->wake_id && id - s->wake_id < (uint64_t)s->wake_n && s->conn) {
        if (s->suspended) {
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        } else {
            s->notified = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* Clear the note before polling the engine. */
static void slot_arm(Slot *s)
{
    pthread_mutex_lock(&s->mu);
    s->notified = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Nothing to do until the engine speaks: suspend, unless it spoke since slot_arm. Returns 1 if
 * suspended, 0 to poll again, -1 if the server is closing. */
static int slot_wait(Slot *s)
{
    int rc;
    pthread_mutex_lock(&s->mu);
    if (s->srv->closing) rc = -1;
    else if (s->notified) rc = 0;
    else {
        s->suspended = 1;
        MHD_suspend_connection(s->conn);
        rc = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* The client closed or reset its end. MHD does not watch a suspended connection, so a request
 * waiting for tokens asks each time it wakes up; MHD itself takes an end of input as the end of
 * the connection, and so does this. */
static int client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- responses ---- */

static MetricsRoute metrics_route(ApiRoute r)
{
    switch (r) {
    case ROUTE_COMPLETIONS: return METRICS_ROUTE_COMPLETIONS;
    case ROUTE_CHAT: return METRICS_ROUTE_CHAT;
    case ROUTE_MODELS: case ROUTE_MODEL: return METRICS_ROUTE_MODELS;
    case ROUTE_HEALTH: return METRICS_ROUTE_HEALTH;
    case ROUTE_METRICS: return METRICS_ROUTE_METRICS;
    default: return METRICS_ROUTE_OTHER;
    }
}

/* out stays valid until the response is destroyed: the slot is only reused after MHD's
 * completion callback, and MHD reads no more of the body by then. */
static enum MHD_Result respond(Slot *s, int status, const ApiBuf *out, const char *content_type, const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(out->len, out->p ? out->p : (char *)"",
                                                                MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(s->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    s->status = status;
    return ok;
}

/* The one path from an ApiError to the wire. */
static enum MHD_Result respond_error(Slot *s, int rc, const ApiErr *err, const char *allow)
{
    int status = openai_error(rc, err, &s->req.out);
    return respond(s, status, &s->req.out, "application/json", allow);
}

/* Non-streaming generation: answer once the engine has finished, else wait suspended. */
static enum MHD_Result finish_or_wait(Slot *s)
{
    HttpServer *h = s->srv;
    for (;;) {
        slot_arm(s);
        if (openai_pump(h->api, &s->req)) return respond(s, 200, &s->req.out, "application/json", NULL);
        if (client_gone(s->conn)) return MHD_NO; /* the completion callback cancels it */
        int w = slot_wait(s);
        if (w < 0) return MHD_NO;
        if (w > 0) return MHD_YES;
    }
}

/* Streaming generation: MHD asks for the next bytes of the SSE stream. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    Slot *s = cls;
    ApiReq *r = &s->req;
    (void)pos;
    for (;;) {
        if (r->out_off < r->out.len) {
            size_t n = r->out.len - r->out_off < max ? r->out.len - r->out_off : max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            if (r->out_off == r->out.len) r->out.len = r->out_off = 0;
            return (ssize_t)n;
        }
        if (r->done) return MHD_CONTENT_READER_END_OF_STREAM;
        slot_arm(s);
        openai_pump(s->srv->api, r);
        if (r->out.len > r->out_off || r->done) continue;
        if (client_gone(s->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
        int w = slot_wait(s);
        if (w < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w > 0) return 0; /* suspended: slot_notify resumes us */
    }
}

static enum MHD_Result start_stream(Slot *s)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_STREAM_BLOCK, stream_reader, s, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(s->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    s->status = 200;
    return ok;
}

/* ---- MHD callbacks ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    HttpServer *h = cls;
    Slot *s = *con_cls;
    ApiErr err = {{0}, NULL, NULL};
    (void)version;
    if (!s) { /* the headers are in: route, authenticate, look at the size before any body */
        s = slot_get(h);
        if (!s) {
            conn_wait(h, c, CONN_IDLE, 0);
            ApiBuf tmp = {0};
            errbuf_set(err.msg, sizeof err.msg, "too many connections");
            openai_error(API_EBUSY, &err, &tmp);
            struct MHD_Response *resp = MHD_create_response_from_buffer(tmp.len, tmp.p, MHD_RESPMEM_MUST_COPY);
            openai_buf_free(&tmp);
            if (!resp) return MHD_NO;
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
            enum MHD_Result ok = MHD_queue_response(c, 503, resp);
            MHD_destroy_response(resp);
            return ok;
        }
        *con_cls = s;
        pthread_mutex_lock(&s->mu);
        s->conn = c;
        pthread_mutex_unlock(&s->mu);
        s->t_head = clock_now();
        const char *allow = NULL;
        int rc = openai_route(method, url, &s->req.route, &allow, &err);
        s->mroute = metrics_route(s->req.route);
        if (rc == API_OK) rc = openai_auth(h->api, s->req.route, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), &err);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (rc == API_OK && cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            errbuf_set(err.msg, sizeof err.msg, "the request body has %s bytes; the limit is %zu bytes (--max-body)", cl, h->o.max_body);
            rc = API_ETOOBIG;
        }
        /* MHD reads any other transfer coding as a body that ends with the connection: without
         * this the client would wait for its answer until the connection timeout */
        const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if (rc == API_OK && te && strcasecmp(te, "chunked") != 0) {
            errbuf_set(err.msg, sizeof err.msg, "Transfer-Encoding '%.100s' is not supported: send the body with a Content-Length or as chunked", te);
            rc = API_ENOTIMPL;
        }
        if (rc < 0) {
            conn_wait(h, c, CONN_IDLE, 0); /* answered early: MHD reads no body */
            return respond_error(s, rc, &err, rc == API_EMETHOD ? allow : NULL);
        }
        s->chunked = !cl;
        conn_wait_body(h, s, cl ? (size_t)strtoull(cl, NULL, 10) : 0);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        /* a chunked body (no length announced) past --max-body: the rest is read and dropped
         * and answered 413 at its end, up to HTTP_MAX_DROP bytes more; past that the
         * connection is closed unanswered */
        if (s->chunked) conn_wait_body(h, s, body_len(s) + s->over + *upload_size);
        if (s->over || body_len(s) + *upload_size > h->o.max_body) {
            s->over += *upload_size;
            *upload_size = 0;
            if (s->over <= HTTP_MAX_DROP) return MHD_YES;
            log_warn("http: closing a connection whose chunked body passed %zu bytes (--max-body) by more than %d MiB",
                     h->o.max_body, HTTP_MAX_DROP >> 20);
            return MHD_NO;
        }
        if (body_add(s, upload, *upload_size) != 0) {
            log_warn("http: no memory for a request body of %zu bytes: closing its connection", body_len(s) + *upload_size);
            return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!s->body_in) { /* the whole request is in: no deadline while it is answered */
        s->body_in = 1;
        conn_wait(h, c, CONN_IDLE, 0);
    }
    if (s->over) { /* the oversized chunked body has ended */
        errbuf_set(err.msg, sizeof err.msg, "the chunked request body passed %zu bytes; the limit is %zu bytes (--max-body)",
                   h->o.max_body, h->o.max_body);
        return respond_error(s, API_ETOOBIG, &err, NULL);
    }
    if (!s->started) { /* the whole request is in */
        pthread_mutex_lock(&h->pool_mu);
        s->started = 1;
        h->in_flight++;
        pthread_mutex_unlock(&h->pool_mu);
        ApiReq *r = &s->req;
        if (r->route != ROUTE_COMPLETIONS && r->route != ROUTE_CHAT) {
            const char *ct;
            int st = openai_get(h->api, r, url, &ct, &err);
            if (st < 0) return respond_error(s, st, &err, NULL);
            return respond(s, st, &r->out, ct, NULL);
        }
        int rc = openai_start(h->api, r, body_ptr(s), body_len(s), slot_notify, s, &err);
        if (rc < 0) return respond_error(s, rc, &err, NULL);
        pthread_mutex_lock(&s->mu);
        s->wake_id = r->id;
        s->wake_n = r->n_choices;
        pthread_mutex_unlock(&s->mu);
        if (r->stream) return start_stream(s);
    }
    if (h->closing) return MHD_NO;
    return finish_or_wait(s);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    HttpServer *h = cls;
    Slot *s = *con_cls;
    int late = conn_request_ended(h, c);
    if (!s) return;
    *con_cls = NULL;
    ApiReq *r = &s->req;
    int gen = r->id != 0;
    int vanished = gen && !r->done;
    openai_cancel(h->api, r); /* the engine forgets it, unless it already has */
    pthread_mutex_lock(&s->mu);
    s->wake_id = 0;
    s->suspended = 0;
    s->notified = 0;
    s->conn = NULL;
    pthread_mutex_unlock(&s->mu);
    FinishReason fin = gen ? (vanished ? FINISH_ABORT : r->finish) : FINISH_NONE;
    /* nothing sent: 408 if its headers or body came too late, else nginx's 499 "client closed request" */
    int status = s->status ? s->status : late ? 408 : 499;
    int completion = vanished ? r->n_gen : r->total_completion;
    metrics_request(h->api->metrics, s->mroute, status, &r->mr, fin, r->n_prompt, completion);
    if (gen) {
        double now = clock_now();
        log_info("%s: %d, %d prompt + %d completion tokens, finish %s%s, ttft %.1f ms, %.1f ms", r->rid, status, r->n_prompt,
                 completion, gen && !vanished ? openai_req_finish_name(r) : openai_finish_name(fin), vanished && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK ? " (client gone)" : "",
                 r->mr.t_first > 0 ? 1e3 * (r->mr.t_first - r->mr.t_start) : 0.0, 1e3 * (now - r->mr.t_start));
    } else if (s->mroute == METRICS_ROUTE_COMPLETIONS || s->mroute == METRICS_ROUTE_CHAT || status >= 400) {
        log_info("%s request: %d, %.1f ms", status == 499 ? "abandoned" : status == 408 ? "late" : s->mroute == METRICS_ROUTE_OTHER ? "unrouted" : "refused",
                 status, 1e3 * (clock_now() - r->mr.t_start));
    }
    /* a big request's memory goes back now, not when its slot is next taken: its body's pages,
     * its reply's buffers, and (by the keeper) what the allocator kept of its parsing */
    size_t held = s->big_cap + r->text.cap + r->out.cap + r->lp.cap + r->lp_off.cap + r->reasoning.cap + r->content.cap;
    body_release(s);
    if (held >= HTTP_TRIM_BYTES) {
        openai_req_reset(r);
        pthread_mutex_lock(&h->conn_mu);
        h->trim = 1;
        pthread_mutex_unlock(&h->conn_mu);
    }
    slot_put(h, s);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[1024];
    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    log_debug("libmicrohttpd: %s", msg);
}

/* ---- public API ---- */

HttpServer *http_start(const HttpOptions *o, Api *api, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0) {
        errbuf_set(err, errlen, "--host %s: %s", o->host, gai_strerror(gai));
        return NULL;
    }
    HttpServer *h = xcalloc(1, sizeof *h);
    h->o = *o;
    h->api = api;
    h->n_slots = o->max_connections + 16;
    h->slots = xcalloc((size_t)h->n_slots, sizeof(Slot));
    for (int i = h->n_slots - 1; i >= 0; i--) {
        Slot *s = &h->slots[i];
        pthread_mutex_init(&s->mu, NULL);
        s->srv = h;
        s->next_free = h->free_list;
        h->free_list = s;
    }
    pthread_mutex_init(&h->pool_mu, NULL);
    pthread_cond_init(&h->pool_cv, NULL);
    pthread_mutex_init(&h->conn_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->keeper_cv, &ca);
    pthread_condattr_destroy(&ca);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(o->threads > 1 ? o->threads : 1),
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_HEADER_LIMIT,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        errbuf_set(err, errlen, "cannot listen on %s:%d (in use, or not an address of this machine)", o->host, o->port);
        http_stop(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : o->port;
    if (pthread_create(&h->keeper, NULL, keeper_main, h) != 0) {
        errbuf_set(err, errlen, "cannot start the HTTP keeper thread");
        http_stop(h);
        return NULL;
    }
    h->keeper_on = 1;
    return h;
}

int http_port(const HttpServer *h) { return h->port; }

void http_quiesce(HttpServer *h)
{
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int http_wait_idle(HttpServer *h, double timeout_s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&h->pool_mu);
    while (h->in_flight > 0 && pthread_cond_timedwait(&h->pool_cv, &h->pool_mu, &until) == 0) {}
    int n = h->in_flight;
    for (int i = 0; i < h->n_slots && n; i++) {
        Slot *s = &h->slots[i];
        if (s->busy && s->started)
            log_warn("http: still open: %s (route %d, started %d, suspended %d, finished %d, done %d, %zu bytes unsent)",
                     s->req.rid[0] ? s->req.rid : "a request", (int)s->req.route, s->started, s->suspended, s->req.finished,
                     s->req.done, s->req.out.len - s->req.out_off);
    }
    pthread_mutex_unlock(&h->pool_mu);
    return n;
}

void http_stop(HttpServer *h)
{
    if (!h) return;
    /* MHD cannot stop with suspended connections: wake them to be closed */
    h->closing = 1;
    for (int i = 0; i < h->n_slots; i++) {
        Slot *s = &h->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->suspended) {
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (h->keeper_on) { /* before the connections go: it may be shutting one down */
        pthread_mutex_lock(&h->conn_mu);
        h->keeper_stop = 1;
        pthread_cond_signal(&h->keeper_cv);
        pthread_mutex_unlock(&h->conn_mu);
        pthread_join(h->keeper, NULL);
    }
    if (h->d) MHD_stop_daemon(h->d);
    for (int i = 0; i < h->n_slots; i++) {
        openai_req_free(&h->slots[i].req);
        openai_buf_free(&h->slots[i].body);
        body_release(&h->slots[i]);
        pthread_mutex_destroy(&h->slots[i].mu);
    }
    free(h->slots);
    pthread_mutex_destroy(&h->pool_mu);
    pthread_cond_destroy(&h->pool_cv);
    pthread_mutex_destroy(&h->conn_mu);
    pthread_cond_destroy(&h->keeper_cv);
    free(h);
}
