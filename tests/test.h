/* test.h: the unit-test harness. A test is `TEST(name) { ... }` in any file of tests/unit/; it
 * registers itself. EXPECT_* records a failure and goes on, ASSERT_* records it and returns.
 * `build/test_unit [filter]` runs the tests whose name contains filter and ends with the line
 * "N passed, N failed" (non-zero exit on any failure). Seeds are fixed and printed. */
#ifndef MOESERVE_TEST_H
#define MOESERVE_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef void (*TestFn)(void);
void test_register(const char *name, const char *file, TestFn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int test_failed_now(void); /* the current test has failed */

#define TEST(name) \
    static void test_##name(void); \
    __attribute__((constructor)) static void test_reg_##name(void) { test_register(#name, __FILE__, test_##name); } \
    static void test_##name(void)

/* The condition's text is printed, then the optional printf-style message. */
void test_fail_cond(const char *file, int line, const char *cond, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define EXPECT(cond, ...) do { if (!(cond)) test_fail_cond(__FILE__, __LINE__, #cond, "" __VA_ARGS__); } while (0)
#define ASSERT(cond, ...) do { if (!(cond)) { test_fail_cond(__FILE__, __LINE__, #cond, "" __VA_ARGS__); return; } } while (0)
#define EXPECT_EQ_INT(a, b) do { long long _a = (a), _b = (b); \
    if (_a != _b) test_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, _a, #b, _b); } while (0)
/* |a - b| <= atol + rtol * |b| (b is the reference) */
#define EXPECT_NEAR(a, b, atol, rtol) do { double _a = (a), _b = (b); \
    if (!(fabs(_a - _b) <= (atol) + (rtol) * fabs(_b))) \
        test_fail(__FILE__, __LINE__, "%s = %.9g, expected %.9g (atol %g rtol %g)", #a, _a, _b, (double)(atol), (double)(rtol)); } while (0)

/* Paths: the repository root (tests run from it), the built binary, tests/data. */
const char *test_root(void);
const char *test_bin(void);               /* build/moeserve, or $MOESERVE_BIN */
const char *test_data(const char *name);  /* tests/data/<name> (static buffer, rotates 8) */
const char *test_tmpdir(void);            /* a fresh directory for this run */
/* relative L2 error of got against ref (INFINITY when got holds a NaN) */
double test_rel_l2(const float *got, const float *ref, size_t n);
const char *test_assets(void);            /* $MOESERVE_ASSETS, else ../shared/assets (may be absent) */
/* A whole file of little-endian float32 (malloc'ed; *n floats), or NULL. */
float *test_read_f32(const char *path, size_t *n);
/* Run a shell command; returns its exit status; *out (if given) receives its stdout and stderr,
 * but what the command redirects itself goes where it says ("cmd 2>/dev/null": stdout alone). */
int test_run(const char *cmd, char **out);
/* SIGALRM in secs seconds (0: cancel, and the default action back), caught without SA_RESTART:
 * a call that would block forever (the open or read of a FIFO no one writes) fails with EINTR
 * instead of hanging the run. */
void test_alarm(unsigned secs);
/* A FIFO at dir/name (dir made if absent, the name replaced) that no one writes: its path
 * (static buffer, rotates 4), or NULL. */
const char *test_fifo(const char *dir, const char *name);

#endif
