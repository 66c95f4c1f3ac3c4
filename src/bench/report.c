/* report: the metrics of one `moeserve bench serve` run, computed as the peers compute them
 * (vLLM's calculate_metrics, SGLang's bench_serving.py), and written out in their layouts:
 *   --format sglang  the SGLang print block and JSON keys (python/sglang/bench_serving.py):
 *                    latency = send -> last SSE event, input tokens from the dataset,
 *                    "Concurrency" = sum(E2E) / duration
 *   --format vllm    the vLLM print block and JSON keys (vllm/benchmarks/serve.py): latency =
 *                    send -> last token chunk, input tokens from usage.prompt_tokens when the
 *                    server sends it
 * Common to both: output tokens = usage.completion_tokens, else the token chunks counted; TTFT =
 * send -> first chunk carrying a token (non-empty text, content or reasoning_content: SGLang's
 * rule; vLLM's chat client also takes the empty role chunk a server sends first, which makes its
 * TTFT the time to that chunk, not to a token); TPOT = (latency - TTFT)/(out - 1) per request with
 * out > 1, request-weighted; ITL = every gap between token chunks of every request (chunk-
 * weighted); percentiles interpolate linearly (numpy's default); std is the population std.
 * Two peaks differ from the peers' on purpose:
 *   peak concurrent requests: the most requests in flight at one instant, by a sweep line over
 *     [start, end) (vLLM's way). SGLang counts every request that touched a 1-second bucket, so
 *     at --max-concurrency 1 a run of short requests showed 7 "concurrent" requests.
 *   peak output throughput: the most token chunks stamped in any 1-second window, sliding (or
 *     per second over the whole run when it is shorter than that). Both peers count fixed
 *     buckets from the first send; a bucket holding the first TTFT, or cut by the run's end,
 *     put the "peak" below the mean of a steady run. A sliding window is never below a fixed
 *     bucket, and in a steady run never below the mean. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/util.h"
#include "../format/tokenizer.h"
#include "bench_serve.h"

#define MAX_REASONS 32

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double report_percentile(const double *x, int n, double p)
{
    if (n <= 0) return 0;
    double rank = p / 100.0 * (n - 1);
    int lo = (int)floor(rank), hi = lo + 1 < n ? lo + 1 : n - 1;
    return x[lo] + (x[hi] - x[lo]) * (rank - lo);
}

/* x[n] in seconds, sorted in place; the MetricDist in ms. An empty list gives zeros (numpy on [0]). */
static void dist_compute(MetricDist *d, double *x, int n, const RunInfo *run)
{
    memset(d, 0, sizeof *d);
    if (n <= 0) return;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    double mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    d->mean = mean * 1e3;
    d->std = sqrt(ss / n) * 1e3;
    d->median = report_percentile(x, n, 50) * 1e3;
    d->p90 = report_percentile(x, n, 90) * 1e3;
    d->p95 = report_percentile(x, n, 95) * 1e3;
    d->p99 = report_percentile(x, n, 99) * 1e3;
    d->max = x[n - 1] * 1e3;
    for (int i = 0; i < run->n_percentiles && i < 8; i++) d->pct[i] = report_percentile(x, n, run->percentiles[i]) * 1e3;
}

typedef struct { double t; int d; } Event;

static int cmp_event(const void *a, const void *b)
{
    const Event *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->d - y->d;   /* a departure before an arrival at the same instant: [start, end) */
}

static double latency_of(const RequestResult *r, const RunInfo *run)
{
    return (run->format == FORMAT_VLLM ? r->t_last_token : r->t_last_chunk) - r->t_start;
}

/* ---- compute ---- */

/* --output-details: one request's entry in each list, as SGLang writes them (a failed request
 * has output length 0 and TTFT 0 unless a token had come; times in seconds). */
static void details_add(json_t *d, const RequestResult *r, int in, int out)
{
    json_array_append_new(json_object_get(d, "input_lens"), json_integer(in));
    json_array_append_new(json_object_get(d, "output_lens"), json_integer(out));
    json_array_append_new(json_object_get(d, "ttfts"), json_real(r->n_chunks ? r->ttft : 0.0));
    json_t *itl = json_array();
    for (int j = 0; j < r->n_itl; j++) json_array_append_new(itl, json_real(r->itl[j]));
    json_array_append_new(json_object_get(d, "itls"), itl);
    json_t *text = json_stringn(r->text ? r->text : "", r->text_len); /* NULL: not UTF-8 */
    json_array_append_new(json_object_get(d, "generated_texts"), text ? text : json_null());
    json_t *err = json_string(r->ok ? "" : r->error);
    json_array_append_new(json_object_get(d, "errors"), err ? err : json_null());
}

void report_compute(Metrics *m, const RunInfo *run, const Dataset *ds, const RequestResult *res, int n,
                    double duration, const Tokenizer *tok)
{
    memset(m, 0, sizeof *m);
    m->accept_length = -1; /* bench_serve.c fills it from the server's counters when it has them */
    m->duration = duration;
    m->total_output_retok = tok ? 0 : -1;
    long n_itl = 0;
    for (int i = 0; i < n; i++)
        if (res[i].ok) n_itl += res[i].n_itl;
    double *ttft = xmalloc((size_t)(n + 1) * sizeof *ttft), *tpot = xmalloc((size_t)(n + 1) * sizeof *tpot);
    double *e2e = xmalloc((size_t)(n + 1) * sizeof *e2e), *itl = xmalloc((size_t)(n_itl + 1) * sizeof *itl);
    int n_tpot = 0;
    long k = 0;
    double sum_lat = 0;
    m->reasons = xcalloc(MAX_REASONS, sizeof *m->reasons);
    m->reason_count = xcalloc(MAX_REASONS, sizeof *m->reason_count);
    if (run->output_details) {
        m->details = json_object();
        static const char *const keys[] = {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"};
        for (size_t q = 0; q < sizeof keys / sizeof keys[0]; q++) json_object_set_new(m->details, keys[q], json_array());
    }
    for (int i = 0; i < n; i++) {
        const RequestResult *r = &res[i];
        m->retried += r->retries > 0;
        if (!r->ok) {
            if (m->details) details_add(m->details, r, ds->reqs[i].prompt_len > 0 ? ds->reqs[i].prompt_len : 0, 0);
            m->failed++;
            const char *why = r->error[0] ? r->error : "unknown";
            int j = 0;
            while (j < m->n_reasons && strcmp(m->reasons[j], why) && !(j == MAX_REASONS - 1)) j++;
            if (j == m->n_reasons) m->reasons[m->n_reasons++] = xstrdup(j == MAX_REASONS - 1 ? "other reasons" : why);
            m->reason_count[j]++;
            continue;
        }
        int out = r->usage_completion >= 0 ? r->usage_completion : r->n_chunks;
        int in = ds->reqs[i].prompt_len;
        if (r->usage_prompt >= 0 && (run->format == FORMAT_VLLM || !ds->prompt_len_exact || in < 0)) in = r->usage_prompt;
        if (in < 0) in = 0;
        double lat = latency_of(r, run);
        if (m->details) details_add(m->details, r, in, out);
        m->completed++;
        m->total_input += in;
        m->total_output += out;
        ttft[m->completed - 1] = r->ttft;
        e2e[m->completed - 1] = lat;
        sum_lat += lat;
        if (out > 1) tpot[n_tpot++] = (lat - r->ttft) / (out - 1);
        /* vLLM's goodput: every limit given holds (a one-token output counts TPOT 0) */
        double ms[3] = {r->ttft * 1e3, out > 1 ? (lat - r->ttft) / (out - 1) * 1e3 : 0, lat * 1e3};
        int good = 1;
        for (int q = 0; q < 3; q++)
            if (run->has_goodput && run->slo_ms[q] >= 0 && ms[q] > run->slo_ms[q]) good = 0;
        m->good += good;
        for (int j = 0; j < r->n_itl; j++) itl[k++] = r->itl[j];
        if (tok && r->text_len) {
            int *ids = NULL;
            char err[128];
            int c = tokenizer_encode(tok, r->text, r->text_len, 0, &ids, err, sizeof err);
            free(ids);
            if (c > 0) m->total_output_retok += c;
        }
    }
    double d = duration > 0 ? duration : 1e-9;
    m->request_throughput = m->completed / d;
    m->request_goodput = m->good / d;
    m->input_throughput = m->total_input / d;
    m->output_throughput = m->total_output / d;
    m->total_throughput = (m->total_input + m->total_output) / d;
    m->mean_concurrency = sum_lat / d;

    /* the peaks: a sliding window over every token chunk's time stamp (start + TTFT + the ITLs),
     * and a sweep line over the requests' [start, end) */
    if (m->completed) {
        double *tt = xmalloc((size_t)(n_itl + m->completed) * sizeof *tt);
        Event *ev = xmalloc((size_t)m->completed * 2 * sizeof *ev);
        long nt = 0;
        int ne = 0;
        for (int i = 0; i < n; i++) {
            const RequestResult *r = &res[i];
            if (!r->ok) continue;
            double t = r->t_start + r->ttft;
            tt[nt++] = t;
            for (int j = 0; j < r->n_itl; j++) tt[nt++] = t += r->itl[j];
            ev[ne++] = (Event){r->t_start, +1};
            ev[ne++] = (Event){r->t_start + latency_of(r, run), -1};
        }
        qsort(tt, (size_t)nt, sizeof *tt, cmp_double);
        double w = duration > 0 && duration < 1 ? duration : 1;
        long best = 0;
        for (long i = 0, j = 0; i < nt; i++) { /* tokens in [tt[i], tt[i] + w) */
            if (j < i) j = i;
            while (j < nt && tt[j] < tt[i] + w) j++;
            if (j - i > best) best = j - i;
        }
        m->peak_output_throughput = best / w;
        qsort(ev, (size_t)ne, sizeof *ev, cmp_event);
        int cur = 0;
        for (int i = 0; i < ne; i++) {
            cur += ev[i].d;
            if (cur > m->peak_concurrency) m->peak_concurrency = cur;
        }
        free(tt);
        free(ev);
    }
    dist_compute(&m->ttft, ttft, m->completed, run);
    dist_compute(&m->tpot, tpot, n_tpot, run);
    dist_compute(&m->itl, itl, (int)k, run);
    dist_compute(&m->e2e, e2e, m->completed, run);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

void report_free(Metrics *m)
{
    for (int i = 0; i < m->n_reasons; i++) free(m->reasons[i]);
    free(m->reasons);
    free(m->reason_count);
    json_decref(m->details);
    memset(m, 0, sizeof *m);
}

/* ---- print ---- */

/* Python's "{:<40} {:<10}" */
static void line_s(const char *label, const char *v) { printf("%-40s %-10s\n", label, v); }
static void line_i(const char *label, long v) { printf("%-40s %-10ld\n", label, v); }
static void line_f(const char *label, double v) { printf("%-40s %-10.2f\n", label, v); }

/* "{s:{c}^{n}}": s centred in n columns of c (Python puts the odd column on the right) */
static void rule(const char *s, char c)
{
    int n = 50, len = (int)strlen(s), left = (n - len) / 2, right = n - len - left;
    for (int i = 0; i < left; i++) putchar(c);
    fputs(s, stdout);
    for (int i = 0; i < right; i++) putchar(c);
    putchar('\n');
}

/* A Python float's str(): 4.0, 0.5, inf */
static void py_float(char *buf, size_t cap, double v)
{
    if (isinf(v)) { snprintf(buf, cap, "inf"); return; }
    snprintf(buf, cap, "%.15g", v);
    if (!strpbrk(buf, ".en")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void pct_word(char *buf, size_t cap, double p)
{
    if (p == floor(p)) snprintf(buf, cap, "%d", (int)p);
    else snprintf(buf, cap, "%g", p);
}

static int metric_selected(const RunInfo *run, const char *name)
{
    const char *s = run->percentile_metrics;
    size_t n = strlen(name);
    while (s && *s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == n && !strncmp(s, name, n)) return 1;
        s = e ? e + 1 : NULL;
    }
    return 0;
}

static void print_vllm_metric(const RunInfo *run, const char *attr, const char *name, const char *header, const MetricDist *d)
{
    if (!metric_selected(run, attr)) return;
    char label[96], w[32];
    rule(header, '-');
    snprintf(label, sizeof label, "Mean %s (ms):", name);
    line_f(label, d->mean);
    snprintf(label, sizeof label, "Median %s (ms):", name);
    line_f(label, d->median);
    for (int i = 0; i < run->n_percentiles; i++) {
        pct_word(w, sizeof w, run->percentiles[i]);
        snprintf(label, sizeof label, "P%s %s (ms):", w, name);
        line_f(label, d->pct[i]);
    }
}

void report_print(const Metrics *m, const RunInfo *run)
{
    char v[64];
    if (run->format == FORMAT_SGLANG) {
        printf("\n");
        rule(" Serving Benchmark Result ", '=');
        line_s("Backend:", run->backend);
        py_float(v, sizeof v, run->request_rate);
        line_s("Traffic request rate:", v);
        if (run->max_concurrency) snprintf(v, sizeof v, "%d", run->max_concurrency);
        else snprintf(v, sizeof v, "not set");
        line_s("Max request concurrency:", v);
        line_i("Successful requests:", m->completed);
        line_i("Failed requests:", m->failed);
        line_f("Benchmark duration (s):", m->duration);
        line_i("Total input tokens:", m->total_input);
        line_i("Total input text tokens:", m->total_input);
        line_i("Total generated tokens:", m->total_output);
        if (m->total_output_retok >= 0) line_i("Total generated tokens (retokenized):", m->total_output_retok);
        line_f("Request throughput (req/s):", m->request_throughput);
        if (run->has_goodput) line_f("Request goodput (req/s):", m->request_goodput);
        line_f("Input token throughput (tok/s):", m->input_throughput);
        line_f("Output token throughput (tok/s):", m->output_throughput);
        line_f("Peak output token throughput (tok/s):", m->peak_output_throughput);
        line_i("Peak concurrent requests:", m->peak_concurrency);
        line_f("Total token throughput (tok/s):", m->total_throughput);
        line_f("Concurrency:", m->mean_concurrency);
        if (m->accept_length >= 0) line_f("Accept length:", m->accept_length);
        rule("End-to-End Latency", '-');
        line_f("Mean E2E Latency (ms):", m->e2e.mean);
        line_f("Median E2E Latency (ms):", m->e2e.median);
        line_f("P90 E2E Latency (ms):", m->e2e.p90);
        line_f("P99 E2E Latency (ms):", m->e2e.p99);
        rule("Time to First Token", '-');
        line_f("Mean TTFT (ms):", m->ttft.mean);
        line_f("Median TTFT (ms):", m->ttft.median);
        line_f("P99 TTFT (ms):", m->ttft.p99);
        rule("Time per Output Token (excl. 1st token)", '-');
        line_f("Mean TPOT (ms):", m->tpot.mean);
        line_f("Median TPOT (ms):", m->tpot.median);
        line_f("P99 TPOT (ms):", m->tpot.p99);
        rule("Inter-Token Latency", '-');
        line_f("Mean ITL (ms):", m->itl.mean);
        line_f("Median ITL (ms):", m->itl.median);
        line_f("P95 ITL (ms):", m->itl.p95);
        line_f("P99 ITL (ms):", m->itl.p99);
        line_f("Max ITL (ms):", m->itl.max);
    } else {
        rule(" Serving Benchmark Result ", '=');
        line_i("Successful requests:", m->completed);
        line_i("Failed requests:", m->failed);
        if (run->max_concurrency) line_i("Maximum request concurrency:", run->max_concurrency);
        if (isfinite(run->request_rate)) line_f("Request rate configured (RPS):", run->request_rate);
        line_f("Benchmark duration (s):", m->duration);
        line_i("Total input tokens:", m->total_input);
        line_i("Total generated tokens:", m->total_output);
        line_f("Request throughput (req/s):", m->request_throughput);
        if (run->has_goodput) line_f("Request goodput (req/s):", m->request_goodput);
        line_f("Output token throughput (tok/s):", m->output_throughput);
        line_f("Peak output token throughput (tok/s):", m->peak_output_throughput);
        line_f("Peak concurrent requests:", m->peak_concurrency);
        line_f("Total token throughput (tok/s):", m->total_throughput);
        if (m->accept_length >= 0) line_f("Acceptance length:", m->accept_length);
        print_vllm_metric(run, "ttft", "TTFT", "Time to First Token", &m->ttft);
        print_vllm_metric(run, "tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m->tpot);
        print_vllm_metric(run, "itl", "ITL", "Inter-token Latency", &m->itl);
        print_vllm_metric(run, "e2el", "E2EL", "End-to-end Latency", &m->e2e);
    }
    for (int i = 0; i < 50; i++) putchar('=');
    putchar('\n');
    if (m->retried)
        printf("Requests sent again on a new connection (the server had closed a kept-alive one): %d\n", m->retried);
    if (m->failed) {
        printf("Failed requests by reason:\n");
        for (int i = 0; i < m->n_reasons; i++) printf("  %6d  %s\n", m->reason_count[i], m->reasons[i]);
    }
    const ClientOverhead *c = &m->client;
    printf("Client overhead: chunk timing lag mean %.1f us, p99 %.1f us, max %.1f us; "
           "CPU %.2f us per chunk, %.1f%% of one core\n",
           c->lag_mean_us, c->lag_p99_us, c->lag_max_us, c->cpu_us_per_chunk, c->cpu_util * 100);
    fflush(stdout);
}

/* ---- JSON ---- */

static void set_real(json_t *o, const char *k, double v) { json_object_set_new(o, k, isfinite(v) ? json_real(v) : json_null()); }

static void set_dist(json_t *o, const RunInfo *run, const char *attr, const MetricDist *d)
{
    char k[64], w[32];
#define KEY(fmt) (snprintf(k, sizeof k, fmt, attr), k)
    set_real(o, KEY("mean_%s_ms"), d->mean);
    set_real(o, KEY("median_%s_ms"), d->median);
    set_real(o, KEY("std_%s_ms"), d->std);
    set_real(o, KEY("p90_%s_ms"), d->p90);
    set_real(o, KEY("p95_%s_ms"), d->p95);
    set_real(o, KEY("p99_%s_ms"), d->p99);
    set_real(o, KEY("max_%s_ms"), d->max);
#undef KEY
    if (run->format == FORMAT_VLLM)
        for (int i = 0; i < run->n_percentiles; i++) {
            pct_word(w, sizeof w, run->percentiles[i]);
            snprintf(k, sizeof k, "p%s_%s_ms", w, attr);
            set_real(o, k, d->pct[i]);
        }
}

int report_append_json(const char *path, const Metrics *m, const RunInfo *run)
{
    json_t *o = json_object();
    json_t *rate = isfinite(run->request_rate) ? json_real(run->request_rate) : json_string("inf");
    json_t *conc = run->max_concurrency ? json_integer(run->max_concurrency) : json_null();
    if (run->format == FORMAT_SGLANG) {
        json_object_set_new(o, "tag", run->label ? json_string(run->label) : json_null());
        json_object_set_new(o, "backend", json_string(run->backend));
        json_object_set_new(o, "dataset_name", json_string(run->dataset_name));
        json_object_set_new(o, "request_rate", rate);
        json_object_set_new(o, "max_concurrency", conc);
        json_object_set_new(o, "sharegpt_output_len", run->fixed_output_len ? json_integer(run->fixed_output_len) : json_null());
        json_object_set_new(o, "random_input_len", json_integer(run->random_input_len));
        json_object_set_new(o, "random_output_len", json_integer(run->random_output_len));
        set_real(o, "random_range_ratio", run->random_range_ratio);
        set_real(o, "duration", m->duration);
        json_object_set_new(o, "completed", json_integer(m->completed));
        json_object_set_new(o, "failed", json_integer(m->failed));
        json_object_set_new(o, "retried_requests", json_integer(m->retried));
        json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
        json_object_set_new(o, "total_input_text_tokens", json_integer(m->total_input));
        json_object_set_new(o, "total_output_tokens", json_integer(m->total_output));
        json_object_set_new(o, "total_output_tokens_retokenized", m->total_output_retok >= 0 ? json_integer(m->total_output_retok) : json_null());
        set_real(o, "request_throughput", m->request_throughput);
        if (run->has_goodput) set_real(o, "request_goodput", m->request_goodput);
        set_real(o, "input_throughput", m->input_throughput);
        set_real(o, "output_throughput", m->output_throughput);
        set_real(o, "total_throughput", m->total_throughput);
        set_dist(o, run, "e2e_latency", &m->e2e);
        set_dist(o, run, "ttft", &m->ttft);
        set_dist(o, run, "tpot", &m->tpot);
        set_dist(o, run, "itl", &m->itl);
        set_real(o, "concurrency", m->mean_concurrency);
        if (m->accept_length >= 0) set_real(o, "accept_length", m->accept_length);
        else json_object_set_new(o, "accept_length", json_null());
        set_real(o, "max_output_tokens_per_s", m->peak_output_throughput);
        json_object_set_new(o, "max_concurrent_requests", json_integer(m->peak_concurrency));
        json_object_set_new(o, "model_id", json_string(run->model ? run->model : ""));
        json_object_set_new(o, "num_prompts", json_integer(run->num_prompts));
    } else {
        char date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
        json_object_set_new(o, "date", json_string(date));
        json_object_set_new(o, "endpoint_type", json_string(run->backend));
        json_object_set_new(o, "backend", json_string(run->backend));
        json_object_set_new(o, "label", run->label ? json_string(run->label) : json_null());
        json_object_set_new(o, "model_id", json_string(run->model ? run->model : ""));
        json_object_set_new(o, "tokenizer_id", run->tokenizer ? json_string(run->tokenizer) : json_null());
        json_object_set_new(o, "num_prompts", json_integer(run->num_prompts));
        json_object_set_new(o, "request_rate", rate);
        set_real(o, "burstiness", run->burstiness > 0 ? run->burstiness : 1.0);
        json_object_set_new(o, "max_concurrency", conc);
        set_real(o, "duration", m->duration);
        json_object_set_new(o, "completed", json_integer(m->completed));
        json_object_set_new(o, "failed", json_integer(m->failed));
        json_object_set_new(o, "retried_requests", json_integer(m->retried));
        json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
        json_object_set_new(o, "total_output_tokens", json_integer(m->total_output));
        set_real(o, "request_throughput", m->request_throughput);
        if (run->has_goodput) set_real(o, "request_goodput", m->request_goodput);
        else json_object_set_new(o, "request_goodput", json_null());
        set_real(o, "output_throughput", m->output_throughput);
        set_real(o, "total_token_throughput", m->total_throughput);
        set_real(o, "input_throughput", m->input_throughput);
        set_real(o, "max_output_tokens_per_s", m->peak_output_throughput);
        json_object_set_new(o, "max_concurrent_requests", json_integer(m->peak_concurrency));
        set_real(o, "concurrency", m->mean_concurrency);
        set_dist(o, run, "ttft", &m->ttft);
        set_dist(o, run, "tpot", &m->tpot);
        set_dist(o, run, "itl", &m->itl);
        set_dist(o, run, "e2el", &m->e2e);
        if (m->accept_length >= 0) set_real(o, "accept_length", m->accept_length);
    }
    json_t *why = json_object();
    for (int i = 0; i < m->n_reasons; i++) json_object_set_new(why, m->reasons[i], json_integer(m->reason_count[i]));
    json_object_set_new(o, "failure_reasons", why);
    json_object_set_new(o, "gpus", json_integer(run->gpus));
    set_real(o, "client_lag_mean_us", m->client.lag_mean_us);
    set_real(o, "client_lag_p99_us", m->client.lag_p99_us);
    set_real(o, "client_lag_max_us", m->client.lag_max_us);
    set_real(o, "client_cpu_us_per_chunk", m->client.cpu_us_per_chunk);
    set_real(o, "client_cpu_util", m->client.cpu_util);
    if (run->server_info) json_object_set(o, "server_info", run->server_info);
    if (m->details) json_object_update(o, m->details);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(o);
    FILE *f = fopen(path, "a");
    int rc = f && s && fprintf(f, "%s\n", s) > 0 ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(s);
    return rc;
}

/* ---- the sweep table ---- */

#define RULE "========================================================================================================================================================================"

void report_print_sweep(const Metrics *ms, const RunInfo *runs, int n)
{
    char head[256];
    int w = snprintf(head, sizeof head, "%-11s %9s %6s %9s %12s %12s %9s %10s %10s %10s %10s %10s %10s %11s", "concurrency",
                     "completed", "failed", "req/s", "output tok/s", "total tok/s", "peak conc", "mean TTFT", "P99 TTFT",
                     "mean TPOT", "P99 TPOT", "mean ITL", "mean E2E", "tok/s/user");
    const char *title = " Sweep over --max-concurrency ";
    int left = (w - (int)strlen(title)) / 2;
    printf("\n%.*s%s%.*s\n%s\n", left, RULE, title, w - left - (int)strlen(title), RULE, head);
    for (int i = 0; i < n; i++) {
        const Metrics *m = &ms[i];
        char c[16];
        if (runs[i].max_concurrency) snprintf(c, sizeof c, "%d", runs[i].max_concurrency);
        else snprintf(c, sizeof c, "not set");
        double per_user = m->tpot.mean > 0 ? 1e3 / m->tpot.mean : 0;
        printf("%-11s %9d %6d %9.2f %12.2f %12.2f %9d %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %11.2f\n", c, m->completed,
               m->failed, m->request_throughput, m->output_throughput, m->total_throughput, m->peak_concurrency,
               m->ttft.mean, m->ttft.p99, m->tpot.mean, m->tpot.p99, m->itl.mean, m->e2e.mean, per_user);
    }
    printf("(latencies in ms; tok/s/user = 1000 / mean TPOT)\n");
    fflush(stdout);
}
