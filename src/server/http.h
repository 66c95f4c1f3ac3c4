/* http: the HTTP side of the server on libmicrohttpd (docs/ARCHITECTURE.md, the path of one request). Internal polling
 * threads (epoll) serve every connection; a connection that waits for tokens is suspended and
 * resumed from the engine's notify callback (no busy loop); a vanished client is learnt of
 * through the completion notification and its request cancelled; a body over the limit is
 * refused from its Content-Length before it is read (413), or by closing the connection once
 * a chunked upload passes the limit. Each connection has a slot from a pool allocated at
 * start-up; its small buffers are reused from request to request, a big body has pages of its
 * own, given back when its request ends. Against slow and greedy clients: deadlines for a
 * request's headers and body that trickling bytes cannot extend, and a cap on the connections
 * of one client address. */
#ifndef MOESERVE_HTTP_H
#define MOESERVE_HTTP_H

#include <stddef.h>

#include "openai.h"

typedef struct {
    const char *host;          /* address to bind (numeric or a name), default 127.0.0.1 */
    int port;                  /* 0: any free port (http_port says which) */
    size_t max_body;           /* bytes of request body accepted */
    int max_connections;       /* open connections at once */
    int threads;               /* polling threads */
    int timeout_s;             /* idle connection timeout (a suspended one never times out) */
    int header_timeout_s;      /* a request's line and headers must be in within this of the connection's accept (of
                                * the previous response's end on a kept-alive one), however slowly they trickle;
                                * 0: no deadline */
    size_t body_min_rate;      /* bytes/s: a body must be in within header_timeout_s + its length / this of its
                                * headers' end (a chunked one: of what has come so far); 0: no deadline */
    int max_per_client;        /* connections one client address may hold waiting for it (slow or idle; http.c
                                  over_client_cap); 0: no limit */
    int drain_timeout_s;       /* at a stop, how long accepted requests may take to finish (the caller's wait) */
} HttpOptions;

void http_options_default(HttpOptions *o);
/* The server's options on a command line (--host, --port, the connection limits) into o. */
OptGroup http_opt_group(HttpOptions *o);

typedef struct HttpServer HttpServer;

/* Listening on return; NULL with err set when the address cannot be bound (a start-up error). */
HttpServer *http_start(const HttpOptions *o, Api *api, char *err, size_t errlen);
int http_port(const HttpServer *h);
/* Stop accepting connections (the listening socket is closed; open ones are served on). */
void http_quiesce(HttpServer *h);
/* Wait until every request received whole has been answered (one still uploading is not
 * waited for), at most timeout_s; returns the number still in flight. */
int http_wait_idle(HttpServer *h, double timeout_s);
/* Close every connection (cancelling what is left) and free everything. */
void http_stop(HttpServer *h);

#endif
