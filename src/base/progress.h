/* progress: lines on stderr (log_info) for the jobs that run for minutes on a big model (loading
 * it, `synth`, `quantize`, `bench model`), so that they are not silent:
 *
 *     load: 12 of 92 layers (13%), 1.5 layers/s, about 53 s left
 *     upload: 12.3 of 69.1 GB (18%), 1.9 GB/s, about 30 s left
 *     upload: 69.1 GB in 36.2 s (1.9 GB/s)
 *
 * The last is the final line, which progress_end always prints. The others are time based, so a
 * big job shows life and a small one stays quiet: none in the first PROGRESS_MIN_GAP seconds;
 * then one when a new tenth of the total is reached, at least PROGRESS_MIN_GAP seconds after the
 * previous line, or PROGRESS_MAX_GAP seconds after it whatever the count (a slow tenth). A job
 * that ends within PROGRESS_MIN_GAP (the built-in model's load) prints the final line alone, and
 * that one at the debug level (MOESERVE_LOG=3): the output of a command that took a blink stays
 * what it was.
 *
 * progress_add may be called from many threads at once (an OpenMP loop): the count is atomic and
 * one thread at a time decides and prints while the others go on. Add per chunk of work, not per
 * element: each call reads the clock. MOESERVE_LOG=1 (warnings and errors only) silences it. */
#ifndef MOESERVE_PROGRESS_H
#define MOESERVE_PROGRESS_H

#include <stdatomic.h>
#include <stdint.h>

#define PROGRESS_MIN_GAP 2.0  /* seconds: no two lines closer */
#define PROGRESS_MAX_GAP 15.0 /* seconds: a line at least this often while the job runs */
#define PROGRESS_BYTES "B"    /* the unit of a job counted in bytes: printed as kB, MB, GB, TB */

typedef struct {
    const char *what;           /* the line's prefix: "load", "upload", "synth" */
    const char *unit;           /* PROGRESS_BYTES, or what a count counts ("layers", "steps") */
    uint64_t total;             /* 0: unknown (no percentage, no time left) */
    _Atomic uint64_t done;
    atomic_flag busy;           /* held by the one thread deciding whether to print */
    double t0, last;            /* the start; the last line printed (t0 before any) */
    int last_tenth;             /* the tenth of total the last line reached */
    int lines;                  /* progress lines printed, the final one not counted */
    double (*clock)(void);      /* monotonic seconds: clock_now */
    void (*sink)(int level, const char *line, void *ctx); /* NULL: log_msg */
    void *sink_ctx;
} Progress;

void progress_start(Progress *p, const char *what, uint64_t total, const char *unit);
/* progress_start with a clock and a sink of lines (and their log level) of the caller's (tests: a
 * clock they set, the lines collected); NULL for either: clock_now, log_msg. */
void progress_start_with(Progress *p, const char *what, uint64_t total, const char *unit, double (*clock)(void),
                         void (*sink)(int level, const char *line, void *ctx), void *sink_ctx);
/* n more units done; may print a line (see above). Thread safe. */
void progress_add(Progress *p, uint64_t n);
/* The final line: the count, the time since progress_start and the rate ("12 of 92 layers" when
 * the job stopped short of its total); a debug line after a quick job (above). Call once, after
 * every progress_add has returned. */
void progress_end(Progress *p);

#endif
