/* progress: time-based progress lines of long jobs (progress.h). */
#include "progress.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

void progress_start_with(Progress *p, const char *what, uint64_t total, const char *unit, double (*clock)(void),
                         void (*sink)(int level, const char *line, void *ctx), void *sink_ctx)
{
    p->what = what;
    p->unit = unit ? unit : "";
    p->total = total;
    atomic_init(&p->done, 0);
    atomic_flag_clear(&p->busy);
    p->clock = clock ? clock : clock_now;
    p->sink = sink;
    p->sink_ctx = sink_ctx;
    p->t0 = p->last = p->clock();
    p->last_tenth = 0;
    p->lines = 0;
}

void progress_start(Progress *p, const char *what, uint64_t total, const char *unit)
{
    progress_start_with(p, what, total, unit, NULL, NULL, NULL);
}

static int is_bytes(const Progress *p) { return !strcmp(p->unit, PROGRESS_BYTES); }

/* the decimal scale that shows v in 1..999 of its unit: 1, 1e3, 1e6, ... and its prefix */
static double byte_scale(double v, const char **name)
{
    static const char *names[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int k = 0;
    double s = 1;
    while (k < 5 && v >= s * 1000) s *= 1000, k++;
    *name = names[k];
    return s;
}

/* "12.3 of 69.1 GB" or "12 of 92 layers"; of_total 0: "69.1 GB", "92 layers"; bytes below a kB
 * whole ("512 B") */
static void amount(const Progress *p, uint64_t done, int of_total, char *buf, size_t n)
{
    if (is_bytes(p)) {
        const char *u;
        double s = byte_scale((double)(of_total ? p->total : done), &u);
        int d = s > 1;
        if (of_total) snprintf(buf, n, "%.*f of %.*f %s", d, done / s, d, p->total / s, u);
        else snprintf(buf, n, "%.*f %s", d, done / s, u);
    } else if (of_total) {
        snprintf(buf, n, "%llu of %llu %s", (unsigned long long)done, (unsigned long long)p->total, p->unit);
    } else {
        snprintf(buf, n, "%llu %s", (unsigned long long)done, p->unit);
    }
}

/* "1.9 GB/s" or "1.5 layers/s" */
static void rate(const Progress *p, double per_s, char *buf, size_t n)
{
    if (is_bytes(p)) {
        const char *u;
        double s = byte_scale(per_s, &u);
        snprintf(buf, n, "%.*f %s/s", s > 1, per_s / s, u);
    } else {
        snprintf(buf, n, "%.1f %s/s", per_s, p->unit);
    }
}

static void emit(const Progress *p, int level, const char *line)
{
    if (p->sink) p->sink(level, line, p->sink_ctx);
    else log_msg(level, "%s", line);
}

static int tenth_of(const Progress *p, uint64_t done)
{
    if (!p->total) return 0;
    return done >= p->total ? 10 : (int)(done * 10 / p->total);
}

void progress_add(Progress *p, uint64_t n)
{
    uint64_t done = atomic_fetch_add_explicit(&p->done, n, memory_order_relaxed) + n;
    if (p->total && done >= p->total) return; /* the final line says it */
    if (atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire)) return; /* another thread decides */
    double now = p->clock(), since = now - p->last;
    int tenth = tenth_of(p, done);
    if (since >= PROGRESS_MAX_GAP || (since >= PROGRESS_MIN_GAP && tenth > p->last_tenth)) {
        char a[96], r[64], line[320];
        double t = now - p->t0, per_s = t > 0 ? done / t : 0;
        amount(p, done, p->total > 0, a, sizeof a);
        rate(p, per_s, r, sizeof r);
        if (p->total && per_s > 0)
            snprintf(line, sizeof line, "%s: %s (%d%%), %s, about %.0f s left", p->what, a,
                     (int)(100.0 * done / p->total), r, (p->total - done) / per_s);
        else
            snprintf(line, sizeof line, "%s: %s, %s", p->what, a, r);
        emit(p, LOG_INFO, line);
        p->last = now;
        p->last_tenth = tenth;
        p->lines++;
    }
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
}

void progress_end(Progress *p)
{
    uint64_t done = atomic_load(&p->done);
    double t = p->clock() - p->t0;
    char a[96], r[64], line[320];
    amount(p, done, p->total && done != p->total, a, sizeof a);
    if (t > 0) {
        rate(p, done / t, r, sizeof r);
        snprintf(line, sizeof line, "%s: %s in %.1f s (%s)", p->what, a, t, r);
    } else {
        snprintf(line, sizeof line, "%s: %s in %.1f s", p->what, a, t);
    }
    /* a quick job's final line is a debug one: the commands that load the built-in model in a
     * blink keep their stderr as it was (scripts read it with 2>&1) */
    emit(p, p->lines || t >= PROGRESS_MIN_GAP ? LOG_INFO : LOG_DEBUG, line);
}
