/* test_main: registry and runner for the tests in tests/unit/ (see test.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "test.h"
#include "base/knobs.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_TESTS 1024
typedef struct { const char *name, *file; TestFn fn; } TestEntry;
static TestEntry tests[MAX_TESTS];
static int n_tests, cur_failed, cur_skipped;

void test_register(const char *name, const char *file, TestFn fn)
{
    if (n_tests == MAX_TESTS) { fprintf(stderr, "too many tests\n"); exit(2); }
    tests[n_tests].name = name;
    tests[n_tests].file = file;
    tests[n_tests].fn = fn;
    n_tests++;
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cur_failed++;
}

void test_fail_cond(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    FAIL %s:%d: expected %s%s", file, line, cond, *fmt ? ": " : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cur_failed++;
}

void test_skip(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    skipped: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cur_skipped = 1;
}

int test_failed_now(void) { return cur_failed > 0; }

const char *test_root(void)
{
    static char root[4096];
    if (!root[0]) {
        const char *e = getenv("MOESERVE_ROOT");
        if (e) snprintf(root, sizeof root, "%s", e);
        else if (!getcwd(root, sizeof root)) snprintf(root, sizeof root, ".");
    }
    return root;
}

const char *test_bin(void)
{
    static char bin[4200];
    if (!bin[0]) {
        const char *e = getenv("MOESERVE_BIN");
        if (e) snprintf(bin, sizeof bin, "%s", e);
        else snprintf(bin, sizeof bin, "%s/build/moeserve", test_root());
    }
    return bin;
}

const char *test_data(const char *name)
{
    static char buf[8][4300];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 4300, "%s/tests/data/%s", test_root(), name);
    return p;
}

const char *test_tmpdir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/moeserve-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    }
    return dir;
}

const char *test_assets(void)
{
    static char dir[4200];
    if (!dir[0]) {
        const char *e = getenv("MOESERVE_ASSETS");
        if (e && *e) snprintf(dir, sizeof dir, "%s", e);
        else snprintf(dir, sizeof dir, "%s/../shared/assets", test_root());
    }
    return dir;
}

static void on_alarm(int sig) { (void)sig; }

void test_alarm(unsigned secs)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = secs ? on_alarm : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    alarm(0);
    sigaction(SIGALRM, &sa, NULL);
    alarm(secs);
}

const char *test_fifo(const char *dir, const char *name)
{
    static char bufs[4][4400];
    static int k;
    char *p = bufs[k++ % 4];
    mkdir(dir, 0755);
    snprintf(p, sizeof bufs[0], "%s/%s", dir, name);
    unlink(p);
    return mkfifo(p, 0644) == 0 ? p : NULL;
}

int test_run(const char *cmd, char **out)
{
    /* stderr joins stdout around the command, not after it: "cmd 2>/dev/null 2>&1" would undo
     * the command's own 2>/dev/null, and a test that reads JSON from stdout would get the logs
     * too (under mpirun, in the middle of the JSON line) */
    char *full = NULL;
    if (asprintf(&full, "{ %s\n} 2>&1", cmd) < 0) return -1;
    FILE *p = popen(full, "r");
    free(full);
    if (!p) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

float *test_read_f32(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *v = malloc(sz > 0 ? sz : 1);
    *n = fread(v, 1, sz > 0 ? sz : 0, f) / sizeof(float);
    fclose(f);
    return v;
}

static int cmp_tests(const void *a, const void *b)
{
    const TestEntry *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv)
{
    knobs_init();
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0, skipped = 0;
    const char *failed_names[64];
    qsort(tests, n_tests, sizeof tests[0], cmp_tests);
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        cur_failed = 0;
        cur_skipped = 0;
        fprintf(stderr, "  %-40s\n", tests[i].name);
        tests[i].fn();
        if (cur_failed) {
            if (failed < 64) failed_names[failed] = tests[i].name;
            failed++;
            fprintf(stderr, "  %s: FAILED\n", tests[i].name);
        }
        else if (cur_skipped) skipped++;
        else passed++;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_tmpdir());
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", test_tmpdir());
    if (skipped) fprintf(stderr, "%d skipped\n", skipped);
    /* The names again at the end: CI keeps only the tail of a long log. */
    for (int i = 0; i < failed && i < 64; i++) fprintf(stderr, "FAILED: %s\n", failed_names[i]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

double test_rel_l2(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
