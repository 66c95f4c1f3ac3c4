/* test_hooks: the MOESERVE_TEST_* variables (test_hooks.h). */
#include "test_hooks.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The integer hooks: 0 when unset (or set to a bad value), the floor of their range being the
 * value that changes nothing. */
enum { HOOK_HOST_DELAY, HOOK_GEMM_REPEAT, HOOK_COMM_DELAY, HOOK_CALIBRATE_BUSY, HOOK_GRAPH_PAD, HOOK_COUNT };

static const struct {
    const char *var;
    long lo, hi;
    const char *meaning;
} hooks[HOOK_COUNT] = {
    [HOOK_HOST_DELAY] = {"MOESERVE_TEST_HOST_DELAY_US", 0, 10000000,
                         "the scheduler sleeps this many microseconds each step (a host-bound engine)"},
    [HOOK_GEMM_REPEAT] = {"MOESERVE_TEST_GEMM_REPEAT", 1, 10000,
                          "every GEMM and MoE op runs this many times, counted once (slow kernels)"},
    [HOOK_COMM_DELAY] = {"MOESERVE_TEST_COMM_DELAY_US", 0, 10000000,
                         "every collective waits this many microseconds first, on the stream where the ranks run "
                         "on GPUs (a slow link)"},
    [HOOK_CALIBRATE_BUSY] = {"MOESERVE_TEST_CALIBRATE_BUSY", 0, 2,
                             "calibrate takes the machine as quiet (1) or busy (2) instead of judging it by its "
                             "measurement (0)"},
    [HOOK_GRAPH_PAD] = {"MOESERVE_TEST_GRAPH_PAD", 0, 1,
                        "on a backend without graphs (the CPU), the steps a CUDA graph would replay run padded to "
                        "the graph's sizes, op by op (1; a test of the padding)"},
};

static const char *fault_meaning = "rank R exits (exit:R) or stops answering (hang:R) at the start of its first "
                                   "forward step";

static TestFault fault_kind;
static int fault_rank = -1;
static long hook_value[HOOK_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void read_fault(void)
{
    const char *f = getenv("MOESERVE_TEST_FAULT");
    if (!f || !*f) return;
    char *end;
    if (!strncmp(f, "exit:", 5) || !strncmp(f, "hang:", 5)) {
        long r = strtol(f + 5, &end, 10);
        if (!*end && end != f + 5 && r >= 0) {
            fault_kind = f[0] == 'e' ? TEST_FAULT_EXIT : TEST_FAULT_HANG;
            fault_rank = (int)r;
            return;
        }
    }
    log_warn("MOESERVE_TEST_FAULT=%s: expected exit:RANK or hang:RANK; no fault", f);
}

static void read_hooks(void)
{
    read_fault();
    for (int i = 0; i < HOOK_COUNT; i++) {
        hook_value[i] = hooks[i].lo;
        const char *e = getenv(hooks[i].var);
        if (!e || !*e) continue;
        char *end;
        errno = 0;
        long v = strtol(e, &end, 10);
        if (errno || end == e || *end || v < hooks[i].lo || v > hooks[i].hi)
            log_warn("%s=%s: expected an integer in [%ld, %ld]; no hook", hooks[i].var, e, hooks[i].lo, hooks[i].hi);
        else
            hook_value[i] = v;
    }
}

static long hook(int i)
{
    pthread_once(&once, read_hooks);
    return hook_value[i];
}

TestFault test_hook_fault(int rank)
{
    pthread_once(&once, read_hooks);
    return rank == fault_rank ? fault_kind : TEST_FAULT_NONE;
}

void test_hooks_reread(void)
{
    pthread_once(&once, read_hooks);
    fault_kind = TEST_FAULT_NONE;
    fault_rank = -1;
    read_hooks();
}

int test_hook_host_delay_us(void) { return (int)hook(HOOK_HOST_DELAY); }
int test_hook_gemm_repeat(void) { return (int)hook(HOOK_GEMM_REPEAT); }
int test_hook_comm_delay_us(void) { return (int)hook(HOOK_COMM_DELAY); }
int test_hook_calibrate_busy(void) { return (int)hook(HOOK_CALIBRATE_BUSY); }
int test_hook_graph_pad(void) { return (int)hook(HOOK_GRAPH_PAD); }

void test_hooks_print(FILE *f)
{
    fprintf(f, "- `MOESERVE_TEST_FAULT` (exit:R or hang:R): %s\n", fault_meaning);
    for (int i = 0; i < HOOK_COUNT; i++)
        fprintf(f, "- `%s` (%ld to %ld; default %ld): %s\n", hooks[i].var, hooks[i].lo, hooks[i].hi, hooks[i].lo,
                hooks[i].meaning);
}
