/* bench_serve: `moeserve bench serve`, the serving benchmark against any OpenAI-compatible
 * server, whose numbers stand next to `python -m sglang.bench_serving` and `vllm bench serve`
 * (computed as vllm/benchmarks/serve.py and python/sglang/bench_serving.py compute them): the
 * types shared by its three files. dataset.c makes the requests, bench_serve.c sends them
 * (libcurl multi, one thread) and records what came back, report.c turns the records into the
 * metrics, the printed report (SGLang or vLLM layout), one JSON line per run and the sweep
 * table; bench_plot.c draws a results file. */
#ifndef MOESERVE_BENCH_SERVE_H
#define MOESERVE_BENCH_SERVE_H

#include <stddef.h>
#include <stdint.h>

/* ---- requests (dataset.c) ---- */

typedef enum { API_COMPLETIONS, API_CHAT } ServeApi; /* /v1/completions, /v1/chat/completions */
typedef enum { FORMAT_SGLANG, FORMAT_VLLM } ReportFormat;

typedef struct {
    char *body;                /* the JSON request body, ready to send (owned) */
    size_t body_len;           /* bytes */
    int prompt_len;            /* prompt tokens as the dataset knows them (-1: unknown) */
    int output_len;            /* max_tokens asked for */
} BenchRequest;

typedef struct {
    BenchRequest *reqs;        /* [n] */
    int n;
    int prompt_len_exact;      /* 1: prompt_len is a token count, 0: an estimate */
} Dataset;

struct Tokenizer;

/* What dataset_build needs: the options of the command line that shape requests. */
typedef struct {
    const char *name;          /* random | random-ids | sharegpt | jsonl */
    const char *path;          /* --dataset-path (sharegpt, jsonl; random: a ShareGPT file to sample from) */
    int num_prompts;
    int input_len, output_len; /* --random-input-len, --random-output-len */
    double range_ratio;        /* --random-range-ratio */
    int range_vllm;            /* --random-range-vllm: [len(1-r), len(1+r)] instead of SGLang's [len r, len] */
    int fixed_output_len;      /* --output-len / --sharegpt-output-len (0: the dataset's) */
    int vocab;                 /* --random-vocab-size for random-ids without a tokenizer */
    uint64_t seed;
    ServeApi api;
    const char *model;         /* the "model" field */
    int ignore_eos;
    double temperature;        /* "temperature" of every body (0, greedy, as SGLang sends); < 0: not sent */
    const char *extra_body;    /* JSON object merged into every body, or NULL */
    const struct Tokenizer *tok; /* borrowed; NULL when no --tokenizer */
} DatasetOptions;

/* Builds opt->num_prompts requests (fewer only when a file has fewer usable entries). Errors in
 * the input files or options stop with fatal(). */
void dataset_build(Dataset *d, const DatasetOptions *opt);
/* A copy of a request body with max_tokens (and max_completion_tokens) set to out: the
 * warm-up requests. Caller frees. */
char *dataset_body_set_max_tokens(const char *body, int out, size_t *len);
void dataset_free(Dataset *d);

/* ---- what one request gave (bench_serve.c fills, report.c reads) ---- */

typedef struct {
    int ok;                    /* 1: a 200 stream with at least one token */
    char error[256];           /* why not, when !ok */
    double t_start;            /* s, monotonic: when the request was handed to libcurl */
    double ttft;               /* s: start -> first chunk carrying a token */
    double t_last_token;       /* s, monotonic: the last chunk carrying a token */
    double t_last_chunk;       /* s, monotonic: the last SSE event ([DONE] included) */
    float *itl;                /* [n_itl] s: gaps between consecutive token chunks */
    int n_itl, cap_itl;
    int n_chunks;              /* chunks that carried a token */
    int retries;               /* sent again on a fresh connection: the server had closed the kept-alive one */
    int usage_prompt;          /* usage.prompt_tokens (-1: not sent) */
    int usage_completion;      /* usage.completion_tokens (-1: not sent) */
    char *text;                /* generated text, kept only with a tokenizer (retokenized counts) */
    size_t text_len, text_cap;
} RequestResult;

/* The client's own cost, measured during the run (bench_serve.c). */
typedef struct {
    double lag_mean_us;        /* chunk delivered by epoll -> processed by us, mean */
    double lag_p99_us, lag_max_us;
    double cpu_s;              /* user + system CPU time of the run */
    double cpu_us_per_chunk;   /* cpu_s / chunks received */
    double cpu_util;           /* cpu_s / wall time: 1.0 is one core saturated */
    long chunks;
} ClientOverhead;

/* ---- the metrics (report.c) ---- */

typedef struct {
    double mean, median, std, p90, p95, p99, max; /* ms */
    double pct[8];             /* ms, at RunInfo.percentiles (vLLM's --metric-percentiles) */
} MetricDist;

typedef struct {
    int completed, failed;
    int retried;               /* requests sent again on a fresh connection (the server had closed a kept-alive one) */
    long total_input, total_output, total_output_retok; /* retok: -1 without a tokenizer */
    double duration;           /* s */
    double request_throughput, input_throughput, output_throughput, total_throughput; /* per s */
    double peak_output_throughput; /* tokens a second in the busiest 1-second window (sliding) */
    int peak_concurrency;      /* most requests in flight at one instant (sweep line over [start, end)) */
    double mean_concurrency;   /* sum of E2E latencies / duration (SGLang's "Concurrency") */
    int good;                  /* completed requests within every --goodput limit */
    double request_goodput;    /* good / duration (vLLM's "Request goodput") */
    MetricDist ttft, tpot, itl, e2e;
    char **reasons;            /* [n_reasons] distinct failure reasons ... */
    int *reason_count;         /* ... and how many requests failed so */
    int n_reasons;
    ClientOverhead client;
    double accept_length;      /* speculative decoding: tokens a verified draft chain gave, from the server's
                                  counters before and after the run (1 + accepted / chains); < 0: unknown */
    struct json_t *details;    /* --output-details: the per-request lists (owned), else NULL */
} Metrics;

/* The run as configured, echoed in the report and the JSON line. */
typedef struct {
    ReportFormat format;
    const char *backend;       /* --backend as the user gave it (sglang, vllm, openai-chat, ...) */
    int output_details;        /* --output-details: per-request lists in the JSON line */
    const char *model, *tokenizer, *dataset_name, *dataset_path;
    int num_prompts;
    double request_rate;       /* INFINITY: all at once */
    double burstiness;         /* gamma shape of the arrival gaps (1: Poisson), vLLM's --burstiness */
    double slo_ms[3];          /* --goodput limits on TTFT, TPOT, E2E latency (ms); < 0: none */
    int has_goodput;
    int max_concurrency;       /* 0: not set */
    int random_input_len, random_output_len;
    double random_range_ratio;
    int fixed_output_len;
    const double *percentiles; /* vLLM layout: --metric-percentiles */
    int n_percentiles;
    const char *percentile_metrics; /* vLLM layout: --percentile-metrics, e.g. "ttft,tpot,itl,e2el" */
    const char *label;
    int gpus;                  /* --gpus, written to the JSON line for the plot */
    struct json_t *server_info; /* what the server said of itself after the run (owned), or NULL */
} RunInfo;

void report_compute(Metrics *m, const RunInfo *run, const Dataset *ds, const RequestResult *res, int n,
                    double duration, const struct Tokenizer *tok);
void report_print(const Metrics *m, const RunInfo *run);
/* Appends one JSON line; returns 0, or -1 when the file cannot be written. */
int report_append_json(const char *path, const Metrics *m, const RunInfo *run);
/* The sweep table: one row per concurrency level. */
void report_print_sweep(const Metrics *ms, const RunInfo *runs, int n);
void report_free(Metrics *m);

/* Linear-interpolated percentile of sorted x[n] (numpy's default), p in [0, 100]. */
double report_percentile(const double *sorted, int n, double p);

int bench_serve_main(int argc, char **argv);
int bench_plot_main(int argc, char **argv);

#endif
