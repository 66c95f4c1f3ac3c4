/* metrics: Prometheus counters and histograms of the server (metrics.h). */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

/* upper bounds in seconds, shared by the three histograms (1 ms .. 80 s) */
static const double bucket_le[METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                                  0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const char *route_name[METRICS_ROUTE_COUNT] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                                      "/health", "/metrics", "other"};
static const char *finish_name[4] = {"none", "stop", "length", "abort"};

static void hist_add(Histogram *h, double v)
{
    int b = 0;
    while (b < METRICS_BUCKETS && v > bucket_le[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

static void hist_merge(Histogram *dst, const Histogram *src)
{
    for (int b = 0; b <= METRICS_BUCKETS; b++) dst->count[b] += src->count[b];
    dst->sum += src->sum;
    dst->n += src->n;
}

void metrics_init(Metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->t_start = clock_now();
}

void metrics_free(Metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_req_start(MetricsReq *r)
{
    memset(r, 0, sizeof *r);
    r->t_start = clock_now();
}

void metrics_req_token(MetricsReq *r)
{
    double now = clock_now();
    if (r->t_first == 0) r->t_first = now;
    else hist_add(&r->itl, now - r->t_last);
    r->t_last = now;
}

void metrics_request(Metrics *m, MetricsRoute route, int status, const MetricsReq *r, FinishReason finish,
                     int prompt_tokens, int generation_tokens)
{
    double now = clock_now();
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < METRICS_MAX_STATUS && m->status_code[route][i] && m->status_code[route][i] != status) i++;
    if (i == METRICS_MAX_STATUS) i = METRICS_MAX_STATUS - 1; /* more distinct statuses than slots: lump */
    m->status_code[route][i] = status;
    m->status_count[route][i]++;
    if (finish != FINISH_NONE) {
        m->finish[finish]++;
        m->prompt_tokens += prompt_tokens;
        m->generation_tokens += generation_tokens;
        if (r->t_first > 0) hist_add(&m->ttft, r->t_first - r->t_start);
        hist_merge(&m->itl, &r->itl);
        hist_add(&m->e2e, now - r->t_start);
    }
    pthread_mutex_unlock(&m->mu);
}

static void render_hist(FILE *f, const char *name, const char *help, const Histogram *h)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < METRICS_BUCKETS; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[b], (unsigned long long)cum);
    }
    cum += h->count[METRICS_BUCKETS];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
            h->sum, name, (unsigned long long)h->n);
}

/* attention data parallel (--dp): each group's placements, sequences and KV pool */
static void render_groups(FILE *f, const EngineStats *s)
{
    fprintf(f, "# HELP moeserve_dp_group_requests_total Requests placed on each attention group (--dp).\n"
               "# TYPE moeserve_dp_group_requests_total counter\n");
    for (int g = 0; g < s->dp; g++)
        fprintf(f, "moeserve_dp_group_requests_total{group=\"%d\"} %llu\n", g, (unsigned long long)s->group[g].placed);
    fprintf(f, "# HELP moeserve_dp_group_requests_running Requests running on each attention group.\n"
               "# TYPE moeserve_dp_group_requests_running gauge\n");
    for (int g = 0; g < s->dp; g++)
        fprintf(f, "moeserve_dp_group_requests_running{group=\"%d\"} %d\n", g, s->group[g].running);
    fprintf(f, "# HELP moeserve_dp_group_requests_waiting Preempted requests waiting to resume on each attention "
               "group.\n"
               "# TYPE moeserve_dp_group_requests_waiting gauge\n");
    for (int g = 0; g < s->dp; g++)
        fprintf(f, "moeserve_dp_group_requests_waiting{group=\"%d\"} %d\n", g, s->group[g].waiting);
    fprintf(f, "# HELP moeserve_dp_group_kv_cache_usage_ratio Fraction of each attention group's KV blocks in use.\n"
               "# TYPE moeserve_dp_group_kv_cache_usage_ratio gauge\n");
    for (int g = 0; g < s->dp; g++)
        fprintf(f, "moeserve_dp_group_kv_cache_usage_ratio{group=\"%d\"} %.6f\n", g,
                s->group[g].kv_blocks_total > 0 ? (double)s->group[g].kv_blocks_used / s->group[g].kv_blocks_total
                                                : 0.0);
}

char *metrics_render(Metrics *m, Engine *e, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) die("open_memstream failed");
    pthread_mutex_lock(&m->mu);
    Metrics c = *m; /* a consistent copy; print without the lock */
    pthread_mutex_unlock(&m->mu);

    fprintf(f, "# HELP moeserve_requests_total HTTP requests by route and status.\n# TYPE moeserve_requests_total counter\n");
    for (int r = 0; r < METRICS_ROUTE_COUNT; r++)
        for (int i = 0; i < METRICS_MAX_STATUS && c.status_code[r][i]; i++)
            fprintf(f, "moeserve_requests_total{route=\"%s\",status=\"%d\"} %llu\n", route_name[r], c.status_code[r][i],
                    (unsigned long long)c.status_count[r][i]);
    fprintf(f, "# HELP moeserve_request_finish_total Generation requests by finish reason.\n"
               "# TYPE moeserve_request_finish_total counter\n");
    for (int i = 1; i < 4; i++)
        fprintf(f, "moeserve_request_finish_total{reason=\"%s\"} %llu\n", finish_name[i], (unsigned long long)c.finish[i]);
    fprintf(f, "# HELP moeserve_prompt_tokens_total Prompt tokens of finished requests.\n"
               "# TYPE moeserve_prompt_tokens_total counter\nmoeserve_prompt_tokens_total %llu\n",
            (unsigned long long)c.prompt_tokens);
    fprintf(f, "# HELP moeserve_generation_tokens_total Generated tokens of finished requests.\n"
               "# TYPE moeserve_generation_tokens_total counter\nmoeserve_generation_tokens_total %llu\n",
            (unsigned long long)c.generation_tokens);
    render_hist(f, "moeserve_time_to_first_token_seconds", "Time from request arrival to its first token.", &c.ttft);
    render_hist(f, "moeserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &c.itl);
    render_hist(f, "moeserve_e2e_request_latency_seconds", "Time from request arrival to its end.", &c.e2e);
    if (e) {
        EngineStats s;
        engine_stats(e, &s);
        fprintf(f, "# HELP moeserve_requests_running Requests in the running batch.\n# TYPE moeserve_requests_running gauge\n"
                   "moeserve_requests_running %d\n", s.running);
        fprintf(f, "# HELP moeserve_requests_waiting Requests waiting to be scheduled.\n# TYPE moeserve_requests_waiting gauge\n"
                   "moeserve_requests_waiting %d\n", s.waiting);
        fprintf(f, "# HELP moeserve_kv_blocks_total KV cache blocks in the pool.\n# TYPE moeserve_kv_blocks_total gauge\n"
                   "moeserve_kv_blocks_total %d\n", s.kv_blocks_total);
        fprintf(f, "# HELP moeserve_kv_blocks_used KV cache blocks in use (including cached prefixes).\n"
                   "# TYPE moeserve_kv_blocks_used gauge\nmoeserve_kv_blocks_used %d\n", s.kv_blocks_used);
        fprintf(f, "# HELP moeserve_kv_cache_usage_ratio Fraction of KV cache blocks in use.\n"
                   "# TYPE moeserve_kv_cache_usage_ratio gauge\nmoeserve_kv_cache_usage_ratio %.6f\n",
                s.kv_blocks_total > 0 ? (double)s.kv_blocks_used / s.kv_blocks_total : 0.0);
        fprintf(f, "# HELP moeserve_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.\n"
                   "# TYPE moeserve_prefix_cache_queries_total counter\nmoeserve_prefix_cache_queries_total %llu\n",
                (unsigned long long)s.prefix_queries);
        fprintf(f, "# HELP moeserve_prefix_cache_hits_total Prompt tokens found in the prefix cache.\n"
                   "# TYPE moeserve_prefix_cache_hits_total counter\nmoeserve_prefix_cache_hits_total %llu\n",
                (unsigned long long)s.prefix_hits);
        fprintf(f, "# HELP moeserve_prefix_cache_hit_rate Prefix-cache hits over queries since start.\n"
                   "# TYPE moeserve_prefix_cache_hit_rate gauge\nmoeserve_prefix_cache_hit_rate %.6f\n",
                s.prefix_queries ? (double)s.prefix_hits / s.prefix_queries : 0.0);
        fprintf(f, "# HELP moeserve_preemptions_total Sequences preempted (recomputed later).\n"
                   "# TYPE moeserve_preemptions_total counter\nmoeserve_preemptions_total %llu\n",
                (unsigned long long)s.preemptions);
        fprintf(f, "# HELP moeserve_engine_steps_total Forward steps run by the engine.\n"
                   "# TYPE moeserve_engine_steps_total counter\nmoeserve_engine_steps_total %llu\n",
                (unsigned long long)s.steps);
        if (s.dp > 1) render_groups(f, &s);
        /* speculative decoding (vLLM's spec_decode counters): drafts proposed and accepted over all requests;
           zero without it. Acceptance length, tokens per verified chain: 1 + accepted / chains */
        fprintf(f, "# HELP moeserve_spec_decode_draft_tokens_total Draft tokens verified (speculative decoding).\n"
                   "# TYPE moeserve_spec_decode_draft_tokens_total counter\nmoeserve_spec_decode_draft_tokens_total %llu\n",
                (unsigned long long)s.spec_draft_tokens);
        fprintf(f, "# HELP moeserve_spec_decode_accepted_tokens_total Draft tokens accepted.\n"
                   "# TYPE moeserve_spec_decode_accepted_tokens_total counter\n"
                   "moeserve_spec_decode_accepted_tokens_total %llu\n", (unsigned long long)s.spec_accepted_tokens);
        fprintf(f, "# HELP moeserve_spec_decode_num_drafts_total Draft chains verified.\n"
                   "# TYPE moeserve_spec_decode_num_drafts_total counter\nmoeserve_spec_decode_num_drafts_total %llu\n",
                (unsigned long long)s.spec_chains);
    }
    fclose(f);
    return buf;
}
