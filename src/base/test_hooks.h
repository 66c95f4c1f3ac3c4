/* test_hooks: the MOESERVE_TEST_* environment variables, which tests set to make a failure happen
 * where a real one would (knobs.h holds the switches for operators). Read once; a hook never
 * runs in a step unless its variable is set.
 *   MOESERVE_TEST_FAULT=exit:R | hang:R   rank R fails, or stops answering, at its first step */
#ifndef MOESERVE_TEST_HOOKS_H
#define MOESERVE_TEST_HOOKS_H

typedef enum { TEST_FAULT_NONE, TEST_FAULT_EXIT, TEST_FAULT_HANG } TestFault;

/* The fault MOESERVE_TEST_FAULT asks of rank `rank` (TEST_FAULT_NONE for every other rank). */
TestFault test_hook_fault(int rank);

#endif
