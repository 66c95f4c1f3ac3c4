/* util: the few helpers every file uses: fatal errors, checked allocation, logging, clocks.
 * Errors come in two kinds: bugs and broken environments stop the process through
 * die()/fatal(); anything a client or an input can cause returns a negative code instead. */
#ifndef MOESERVE_UTIL_H
#define MOESERVE_UTIL_H

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Stop with "error: file:line: message" (a bug or a broken environment). */
#define die(...) util_die(__FILE__, __LINE__, __VA_ARGS__)
/* Stop with "error: message" (a bad input file or option: the message names the file). */
void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void util_die(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
/* CHECK(cond, "what failed: %s", why): die unless cond holds. */
#define CHECK(cond, ...) do { if (!(cond)) die(__VA_ARGS__); } while (0)

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* Allocation aligned to 64 bytes (cache line / AVX-512), freed with free(). */
void *xmalloc_aligned(size_t n);

/* Logging to stderr. Level: 0 error, 1 warn, 2 info, 3 debug; MOESERVE_LOG sets it (knobs.h). */
enum { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };
extern int log_level;
extern int log_rank; /* >= 0 under several ranks: lines are prefixed "[rank r]" */
/* Called by fatal() and die() before exit (src/dist: stop every rank, not just this one). */
extern void (*util_exit_hook)(int code);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* Machine-readable output (every --json result) goes to stdout, logs to stderr, and a result
 * leaves in one write(2) after whatever stdio held: never in pieces that a log line could land
 * between when the two streams share a pipe (2>&1, or several ranks' output forwarded by mpirun).
 * Up to PIPE_BUF (4096) bytes a pipe keeps one write whole; stdio would cut a line at its buffer
 * size (1024 bytes on the pseudo-terminal mpirun gives a rank). Still, a reader that wants the
 * JSON alone reads stdout alone: mpirun forwards a rank's stdout in pieces of its own.
 * out_json: json_dumps(o, flags) and a newline; out_printf: the formatted text as given.
 * Return 0, or -1 (errno set) when stdout cannot take it. */
int out_json(const json_t *o, size_t flags);
int out_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

double clock_now(void); /* monotonic seconds */

/* Formatting into a caller's buffer for error messages: snprintf that never overflows. */
void errbuf_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Files a model directory or an option names are regular files: anything else (a FIFO, whose
 * open waits for a writer that may never come; a device such as /dev/zero, which never ends; a
 * directory) is refused at once with errno FILE_NOT_REGULAR, which no read of a regular file
 * gives (STREAMS' "not a stream"). file_open_regular returns a blocking read-only descriptor, or
 * -1 with errno set; it never waits. */
#define FILE_NOT_REGULAR ENOSTR
int file_open_regular(const char *path);

/* Reading a whole small regular file (config.json, a template, a text to tokenize) into a
 * NUL-terminated buffer. Returns NULL (and sets *len = 0) when it cannot be read, errno saying
 * why; the caller frees. At most FILE_READ_MAX bytes: a longer file (or one that grows while it
 * is read, or whose size the file system does not know) is refused with errno EFBIG after
 * reading FILE_READ_MAX + 1 bytes. */
#define FILE_READ_MAX ((size_t)64 << 20)
char *file_read_all(const char *path, size_t *len);
/* Why file_read_all failed, from its errno: strerror's words, "not a regular file", or the limit
 * for EFBIG. */
const char *file_read_error(int errnum);
/* A whole JSON file (json_loadb flags) read by file_read_all, so within its bounds (jansson's
 * json_load_file reads /dev/zero or a FIFO forever); NULL with err "cannot read: why" or "not
 * valid JSON: why (line L, column C)" (the caller names the file). */
json_t *file_read_json(const char *path, size_t flags, char *err, size_t errlen);
/* json_loadb for the JSON files of a model directory (config.json, generation_config.json,
 * tokenizer.json, tokenizer_config.json, hf_quant_config.json, the safetensors index; also what
 * file_read_json reads). Python writes integers of any size and jansson refuses those outside
 * int64 ("too big integer"): many tokenizer_config.json files hold "model_max_length":
 * 1000000000000000019884624838656 (transformers' VERY_LARGE_INTEGER), which refused the whole
 * tokenizer. Here such an integer reads as INT64_MAX (INT64_MIN when negative), still an
 * integer, so a field read as an integer keeps its type and its own range check names it; a real
 * past the range of a double (1e999, which Python reads as inf) reads as +-DBL_MAX. Only text that
 * jansson refused for that reason is scanned again; anything else is refused as by json_loadb. */
json_t *json_loadb_clamped(const char *text, size_t n, size_t flags, json_error_t *je);
int file_exists(const char *path);
/* dir + "/" + name into out; returns out. */
char *path_join(char *out, size_t outlen, const char *dir, const char *name);

/* splitmix64: the deterministic generator for synthetic weights and tests. */
typedef struct { uint64_t s; } Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
float rng_uniform(Rng *r);       /* [0, 1) */
float rng_normal(Rng *r);        /* N(0, 1) */

#endif
