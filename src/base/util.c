/* util: fatal errors, checked allocation, logging, clocks, small files, a seeded generator. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int log_level = LOG_INFO;
int log_rank = -1;
void (*util_exit_hook)(int code);

static void __attribute__((noreturn)) util_exit(int code)
{
    if (util_exit_hook) util_exit_hook(code); /* several ranks: stop them all (src/dist) */
    exit(code);
}

static void util_vprint(const char *prefix, const char *fmt, va_list ap)
{
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (log_rank >= 0)
        fprintf(stderr, "[rank %d] %s%s\n", log_rank, prefix, buf);
    else
        fprintf(stderr, "%s%s\n", prefix, buf);
}

void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    util_vprint("error: ", fmt, ap);
    va_end(ap);
    util_exit(1);
}

void util_die(const char *file, int line, const char *fmt, ...)
{
    char prefix[512];
    va_list ap;
    snprintf(prefix, sizeof prefix, "error: %s:%d: ", file, line);
    va_start(ap, fmt);
    util_vprint(prefix, fmt, ap);
    va_end(ap);
    util_exit(1);
}

void log_msg(int level, const char *fmt, ...)
{
    static const char *names[] = {"error: ", "warning: ", "", "debug: "};
    if (level > log_level) return;
    va_list ap;
    va_start(ap, fmt);
    util_vprint(names[level < 0 ? 0 : level > 3 ? 3 : level], fmt, ap);
    va_end(ap);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) die("out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void *xmalloc_aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0)
        die("out of memory allocating %zu aligned bytes", n);
    return p;
}

/* all of p[0..n) to stdout in one write when the kernel takes it so (a pipe up to PIPE_BUF,
 * a file), else in as few as it allows */
static int out_write(const char *p, size_t n)
{
    if (fflush(stdout) != 0) return -1;
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

int out_json(const json_t *o, size_t flags)
{
    char *s = json_dumps(o, flags);
    if (!s) die("json_dumps failed (a string that is not UTF-8?)");
    size_t n = strlen(s);
    char *line = xmalloc(n + 1);
    memcpy(line, s, n);
    line[n] = '\n';
    free(s);
    int rc = out_write(line, n + 1);
    free(line);
    return rc;
}

int out_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) die("out of memory formatting output");
    int rc = out_write(s, (size_t)n);
    free(s);
    return rc;
}

double clock_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int file_open_regular(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISREG(st.st_mode)) { errno = FILE_NOT_REGULAR; return -1; } /* not even opened */
    /* O_NONBLOCK: the path may turn into a FIFO between the stat and the open; fstat then
     * refuses what was opened. The flag changes nothing for a regular file's reads. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    int e = fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? FILE_NOT_REGULAR : 0;
    if (!e && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) e = errno;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

char *file_read_all(const char *path, size_t *len)
{
    if (len) *len = 0;
    int fd = file_open_regular(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) { int e = errno; close(fd); errno = e; return NULL; }
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size > FILE_READ_MAX) {
        fclose(f);                               /* too long, known without reading it */
        errno = EFBIG;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;                 /* at most FILE_READ_MAX + 2: the bytes, one more, a NUL */
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            cap = 2 * cap < FILE_READ_MAX + 2 ? 2 * cap : FILE_READ_MAX + 2;
            buf = xrealloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n > FILE_READ_MAX) { e = EFBIG; break; }
        if (got == 0) { if (ferror(f)) e = errno ? errno : EIO; break; }
    }
    fclose(f);
    if (e) { free(buf); errno = e; return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

const char *file_read_error(int errnum)
{
    _Static_assert(FILE_READ_MAX == (size_t)64 << 20, "the message below names the limit");
    if (errnum == FILE_NOT_REGULAR) return "not a regular file";
    return errnum == EFBIG ? "more than 64 MiB, the limit for reading a whole file" : strerror(errnum);
}

/* Append to a growing buffer (*p of *cap bytes, *len used). */
static void text_add(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        while (*len + n + 1 > *cap) *cap = *cap ? 2 * *cap : 256;
        *p = xrealloc(*p, *cap);
    }
    memcpy(*p + *len, s, n);
    *len += n;
}

/* Whether the integer literal s[0..n) (an optional '-', then digits) lies outside int64. */
static int int_literal_overflows(const char *s, size_t n)
{
    int neg = n && s[0] == '-';
    const char *d = s + neg, *lim = neg ? "9223372036854775808" : "9223372036854775807";
    size_t nd = n - (size_t)neg;
    while (nd > 1 && d[0] == '0') d++, nd--;  /* not valid JSON, but let jansson say so */
    return nd > 19 || (nd == 19 && memcmp(d, lim, 19) > 0);
}

json_t *json_loadb_clamped(const char *text, size_t n, size_t flags, json_error_t *je)
{
    json_t *j = json_loadb(text, n, flags, je);
    if (j || json_error_code(je) != json_error_numeric_overflow) return j;
    char *out = NULL, num[64];
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < n;) {
        if (text[i] == '"') {                   /* a string: copied as it is */
            size_t k = i + 1;
            while (k < n && text[k] != '"') k += text[k] == '\\' ? 2 : 1;
            k = k < n ? k + 1 : n;
            text_add(&out, &len, &cap, text + i, k - i);
            i = k;
            continue;
        }
        if (text[i] != '-' && (text[i] < '0' || text[i] > '9')) {
            text_add(&out, &len, &cap, text + i, 1);
            i++;
            continue;
        }
        size_t k = i;                           /* a number: its characters, checked by jansson later */
        int is_int = 1;
        while (k < n && strchr("+-0123456789.eE", text[k]) && text[k]) {
            if (text[k] == '.' || text[k] == 'e' || text[k] == 'E') is_int = 0;
            k++;
        }
        const char *rep = NULL;
        if (is_int && int_literal_overflows(text + i, k - i)) {
            rep = text[i] == '-' ? "-9223372036854775808" : "9223372036854775807";
        } else if (!is_int) {
            char *s = k - i < sizeof num ? num : xmalloc(k - i + 1);
            memcpy(s, text + i, k - i);
            s[k - i] = 0;
            double v = strtod(s, NULL);
            if (isinf(v)) rep = v < 0 ? "-1.7976931348623157e308" : "1.7976931348623157e308";
            if (s != num) free(s);
        }
        if (rep) text_add(&out, &len, &cap, rep, strlen(rep));
        else text_add(&out, &len, &cap, text + i, k - i);
        i = k;
    }
    j = json_loadb(out ? out : "", len, flags, je);
    free(out);
    return j;
}

json_t *file_read_json(const char *path, size_t flags, char *err, size_t errlen)
{
    size_t n;
    char *text = file_read_all(path, &n);
    if (!text) {
        errbuf_set(err, errlen, "cannot read: %s", file_read_error(errno));
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb_clamped(text, n, flags, &je);
    free(text);
    if (!j) errbuf_set(err, errlen, "not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    return j;
}

int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

char *path_join(char *out, size_t outlen, const char *dir, const char *name)
{
    size_t n = strlen(dir);
    snprintf(out, outlen, "%s%s%s", dir, (n && dir[n - 1] == '/') ? "" : "/", name);
    return out;
}

void rng_seed(Rng *r, uint64_t seed) { r->s = seed; }

uint64_t rng_u64(Rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float rng_uniform(Rng *r) { return (rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng *r)
{
    /* Box-Muller; u1 in (0, 1] so the log is finite. */
    float u1 = ((rng_u64(r) >> 40) + 1) * (1.0f / 16777216.0f);
    float u2 = rng_uniform(r);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}
