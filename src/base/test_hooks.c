/* test_hooks: the MOESERVE_TEST_* variables (test_hooks.h). */
#include "test_hooks.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static TestFault fault_kind;
static int fault_rank = -1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void read_hooks(void)
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

TestFault test_hook_fault(int rank)
{
    pthread_once(&once, read_hooks);
    return rank == fault_rank ? fault_kind : TEST_FAULT_NONE;
}
