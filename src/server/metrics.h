/* metrics: the server's Prometheus counters and histograms (GET /metrics, text format 0.0.4):
 * requests by route and status, finish reasons, prompt and generation tokens, time to first
 * token, inter-token latency and end-to-end latency histograms; at render time the engine's
 * gauges (running and waiting requests, KV blocks, prefix-cache hit rate). Requests record
 * into their own MetricsReq without locking; metrics_request merges one at its end. */
#ifndef MOESERVE_METRICS_H
#define MOESERVE_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "../engine/engine.h"

#define METRICS_BUCKETS 20         /* histogram upper bounds, + Inf */
#define METRICS_MAX_STATUS 16      /* distinct HTTP statuses counted per route */

typedef enum {
    METRICS_ROUTE_COMPLETIONS, METRICS_ROUTE_CHAT, METRICS_ROUTE_MODELS, METRICS_ROUTE_HEALTH,
    METRICS_ROUTE_METRICS, METRICS_ROUTE_OTHER, METRICS_ROUTE_COUNT
} MetricsRoute;

typedef struct {
    uint64_t count[METRICS_BUCKETS + 1]; /* per bucket (not cumulative); the last is +Inf */
    double sum;                /* seconds */
    uint64_t n;
} Histogram;

/* What one request contributes, gathered on its own (no lock). */
typedef struct {
    Histogram itl;             /* gaps between its tokens */
    double t_start, t_first, t_last; /* clock_now() seconds; t_first 0 until the first token */
} MetricsReq;

typedef struct {
    pthread_mutex_t mu;
    int status_code[METRICS_ROUTE_COUNT][METRICS_MAX_STATUS];
    uint64_t status_count[METRICS_ROUTE_COUNT][METRICS_MAX_STATUS];
    uint64_t finish[4];        /* by FinishReason */
    uint64_t prompt_tokens, generation_tokens;
    Histogram ttft, itl, e2e;
    double t_start;
} Metrics;

void metrics_init(Metrics *m);
void metrics_free(Metrics *m);
void metrics_req_start(MetricsReq *r);
/* A token of r arrived now. */
void metrics_req_token(MetricsReq *r);
/* r is over: its route's status and, for generation requests (finish != FINISH_NONE), tokens. */
void metrics_request(Metrics *m, MetricsRoute route, int status, const MetricsReq *r, FinishReason finish,
                     int prompt_tokens, int generation_tokens);
/* The Prometheus text, malloc'ed (*len bytes); e adds the engine's gauges (NULL: none). */
char *metrics_render(Metrics *m, Engine *e, size_t *len);

#endif
