/* http: libmicrohttpd glue (http.h). Who touches what:
 *   - MHD polling threads run the access handler, the stream reader and the completion
 *     callback of a connection (always the same thread for one connection);
 *   - the engine thread calls slot_notify, with the engine's mutex held: it only resumes a
 *     suspended connection or leaves a note, under the slot's mutex, and never calls back into
 *     the engine. The MHD side never holds a slot's mutex while it calls the engine, so the
 *     lock order is always engine -> slot -> MHD's own.
 * A connection waits for tokens like this: clear the note, poll the engine, and if nothing
 * came, suspend under the slot's mutex unless a note arrived meanwhile; the engine's notify
 * resumes it. */
#include "http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/util.h"

#define HTTP_HEADER_LIMIT (32 * 1024)   /* bytes of request line + headers per connection */
#define HTTP_STREAM_BLOCK (16 * 1024)   /* bytes MHD asks the stream reader for at most */

#define HTTP_MAX_DROP (64 << 20) /* the most of an oversized chunked body read to answer it */

typedef struct Slot {
    /* shared with the engine thread, under mu */
    pthread_mutex_t mu;
    struct MHD_Connection *conn;
    uint64_t wake_id;          /* the engine request whose notifications count; 0: none */
    int suspended;             /* the connection is suspended, waiting for slot_notify */
    int notified;              /* events arrived while the connection was not suspended */
    /* the connection's own thread only */
    struct HttpServer *srv;
    struct Slot *next_free;
    int busy;                  /* taken from the pool (under the pool's mutex) */
    int started;               /* the request was handed to openai_get / openai_start */
    int status;                /* HTTP status sent */
    MetricsRoute mroute;
    ApiBuf body;                  /* the request body, at most max_body bytes */
    size_t over;                  /* bytes of a chunked body past max_body, read and dropped (413) */
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
};

void http_options_default(HttpOptions *o)
{
    *o = (HttpOptions){.host = "127.0.0.1", .port = 8000, .max_body = 4u << 20, .max_connections = 1024, .threads = 2,
                       .timeout_s = 60};
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
    if (s->body.cap > (1u << 20)) openai_buf_free(&s->body); /* do not pin a big upload's memory */
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

/* Engine thread, engine mutex held: new events wait for request id. */
static void slot_notify(void *user, uint64_t id)
{
    Slot *s = user;
    pthread_mutex_lock(&s->mu);
    if (s->wake_id == id && s->conn) {
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
        if (rc < 0) return respond_error(s, rc, &err, rc == API_EMETHOD ? allow : NULL);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        /* a chunked body (no length announced) past --max-body: the rest is read and dropped
         * and answered 413 at its end, up to HTTP_MAX_DROP bytes more; past that the
         * connection is closed unanswered */
        if (s->over || s->body.len + *upload_size > h->o.max_body) {
            s->over += *upload_size;
            *upload_size = 0;
            if (s->over <= HTTP_MAX_DROP) return MHD_YES;
            log_warn("http: closing a connection whose chunked body passed %zu bytes (--max-body) by more than %d MiB",
                     h->o.max_body, HTTP_MAX_DROP >> 20);
            return MHD_NO;
        }
        openai_buf_add(&s->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
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
        int rc = openai_start(h->api, r, s->body.p, s->body.len, slot_notify, s, &err);
        if (rc < 0) return respond_error(s, rc, &err, NULL);
        pthread_mutex_lock(&s->mu);
        s->wake_id = r->id;
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
    (void)c;
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
    int status = s->status ? s->status : 499; /* nginx's "client closed request" when nothing was sent */
    int completion = vanished ? r->n_gen : r->completion_tokens;
    metrics_request(h->api->metrics, s->mroute, status, &r->mr, fin, r->n_prompt, completion);
    if (gen) {
        double now = clock_now();
        log_info("%s: %d, %d prompt + %d completion tokens, finish %s%s, ttft %.1f ms, %.1f ms", r->rid, status, r->n_prompt,
                 completion, gen && !vanished ? openai_req_finish_name(r) : openai_finish_name(fin), vanished && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK ? " (client gone)" : "",
                 r->mr.t_first > 0 ? 1e3 * (r->mr.t_first - r->mr.t_start) : 0.0, 1e3 * (now - r->mr.t_start));
    } else if (s->mroute == METRICS_ROUTE_COMPLETIONS || s->mroute == METRICS_ROUTE_CHAT || status >= 400) {
        log_info("%s request: %d, %.1f ms", status == 499 ? "abandoned" : s->mroute == METRICS_ROUTE_OTHER ? "unrouted" : "refused", status,
                 1e3 * (clock_now() - r->mr.t_start));
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
    if (h->d) MHD_stop_daemon(h->d);
    for (int i = 0; i < h->n_slots; i++) {
        openai_req_free(&h->slots[i].req);
        openai_buf_free(&h->slots[i].body);
        pthread_mutex_destroy(&h->slots[i].mu);
    }
    free(h->slots);
    pthread_mutex_destroy(&h->pool_mu);
    pthread_cond_destroy(&h->pool_cv);
    free(h);
}
