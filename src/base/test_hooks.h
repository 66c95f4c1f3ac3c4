/* test_hooks: the MOESERVE_TEST_* environment variables, which tests set to make a failure or a
 * slow part happen where a real one would (knobs.h holds the switches for operators; the command
 * line has no flags for these). Read once, at the first call; a value that is not one the hook
 * takes gets a warning and no hook. The callers read a hook when they start and keep the value,
 * so that an unset hook costs no work per op (backend.c, engine.c, dist.c say how). The list,
 * as docs/USAGE.md shows it (a test holds them equal), is test_hooks_print's. */
#ifndef MOESERVE_TEST_HOOKS_H
#define MOESERVE_TEST_HOOKS_H

#include <stdio.h>

typedef enum { TEST_FAULT_NONE, TEST_FAULT_EXIT, TEST_FAULT_HANG } TestFault;

/* The fault MOESERVE_TEST_FAULT asks of rank `rank` (TEST_FAULT_NONE for every other rank). */
TestFault test_hook_fault(int rank);
/* MOESERVE_TEST_HOST_DELAY_US: microseconds the scheduler sleeps each step (0: none). */
int test_hook_host_delay_us(void);
/* MOESERVE_TEST_GEMM_REPEAT: times every GEMM and MoE op runs (1: once, as without the hook). */
int test_hook_gemm_repeat(void);
/* MOESERVE_TEST_COMM_DELAY_US: microseconds added to every collective (0: none). */
int test_hook_comm_delay_us(void);
/* MOESERVE_TEST_CALIBRATE_BUSY: 0 calibrate judges the machine's load itself, 1 quiet, 2 busy. */
int test_hook_calibrate_busy(void);
/* MOESERVE_TEST_GRAPH_PAD: 1 pads graph-sized steps on a backend without graphs (forward.c). */
int test_hook_graph_pad(void);
/* Read the variables again: a test that sets a hook in its own process, with nothing running that
 * reads them. */
void test_hooks_reread(void);
/* The hooks as a Markdown list (docs/USAGE.md). */
void test_hooks_print(FILE *f);

#endif
