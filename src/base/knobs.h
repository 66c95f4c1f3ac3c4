/* knobs: the runtime switches read from MOESERVE_* environment variables, in one typed table
 * (knobs.c): each knob's variable, type, default, range and meaning. The environment is read
 * once, at the first knob_get (main calls knobs_init first thing); a value out of range or not of
 * the knob's type gets one warning and the default. `moeserve help env` prints the table, and
 * docs/USAGE.md's list of variables is that output (a test holds them equal).
 *
 * Knobs are for operators and for A/B runs of kernels; options belong on the command line. Test
 * hooks are not knobs: they are MOESERVE_TEST_* variables read in test_hooks.c. This file and that
 * one are the only two that read MOESERVE_* variables. */
#ifndef MOESERVE_KNOBS_H
#define MOESERVE_KNOBS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KNOB_LOG,                  /* log level */
    KNOB_SYNC,                 /* CUDA: synchronise after every launch */
    KNOB_W4,                   /* NVFP4 weights repacked for the W4A16 tensor-core kernels */
    KNOB_W4_ACT,               /* W4A16 activations: split halves or plain BF16 */
    KNOB_W4_PDL,               /* programmatic dependent launch of the W4A16 kernels */
    KNOB_W4_WG_PERSIST,        /* wgmma MoE kernels: persistent blocks */
    KNOB_W4_SK_CLUSTER,        /* stream-K dense decode: blocks staging activations together */
    KNOB_W4_SK_KSPLIT,         /* stream-K dense decode: K parts of a cluster */
    KNOB_W4_LT_ROWS,           /* dense NVFP4 GEMMs: rows from which BF16 + cuBLASLt runs them */
    KNOB_W4_MOE_HOT,           /* MoE: pairs above which an expert joins the hot class */
    KNOB_W4_MOE_SMALL,         /* MoE: pairs up to which an expert joins the small class */
    KNOB_W4_MOE_SIDE,          /* MoE: which expert classes run on side streams */
    KNOB_SHARED_SIDE,          /* shared expert beside the routed ones, up to this many rows */
    KNOB_INDEXER_SIDE,         /* GLM-5 indexer beside the attention path, up to this many rows */
    KNOB_FUSE,                 /* linears of one input fused into one GEMM at load */
    KNOB_MLA_KERNEL,           /* MLA absorbed decode kernel */
    KNOB_MLA_PIECE_KERNEL,     /* MLA expanded prefill kernel */
    KNOB_MLA_PIECE,            /* MLA expanded form: positions a piece (0: from the model's shape) */
    KNOB_MLA_EXPAND_MIN,       /* MLA expanded form: prompt tokens a batch needs for it */
    KNOB_TUNE_CACHE,           /* the tuned tile table's file */
    KNOB_CALIBRATE_CACHE,      /* calibrate's ceilings file */
    KNOB_COMM,                 /* collectives: nccl forces NCCL for one rank too */
    KNOB_COMM_TIMEOUT,         /* seconds a rank waits for the others before stopping all */
    KNOB_NCCL_LIB,             /* the NCCL library to open */
    KNOB_COUNT
} KnobId;

typedef enum {
    KNOB_INT,                  /* an integer in [lo, hi] */
    KNOB_CHOICE,               /* one of a list of words: knob_get gives its index */
    KNOB_STR,                  /* a path or name, any text */
} KnobType;

typedef struct {
    const char *var;           /* MOESERVE_... */
    KnobType type;
    const char *def;           /* the default as written in the environment ("" for none) */
    long lo, hi;               /* KNOB_INT's range */
    const char *choices;       /* KNOB_CHOICE: the words, '|' between them; the first is index 0 */
    const char *meaning;       /* one line: what it changes, what each value does */
} Knob;

/* Read every knob from the environment (once; later calls do nothing). */
void knobs_init(void);
/* The value: a KNOB_INT's integer, a KNOB_CHOICE's index (0: the first word). */
long knob_get(KnobId k);
/* A KNOB_STR's text ("" when neither set nor defaulted), or any knob's value as written. */
const char *knob_str(KnobId k);
/* 1 when the environment set it (to a valid value), 0 when the default holds. */
int knob_is_set(KnobId k);
/* Tests and A/B runs inside one process: set a knob's value (an index for a choice); -1
 * restores what the environment gave. Not for the request path: knobs hold for a process. */
void knob_override(KnobId k, long v);
const Knob *knob_info(KnobId k);
/* The table as a Markdown list (docs/USAGE.md, `moeserve help env`). */
void knobs_print(FILE *f);

#ifdef __cplusplus
}
#endif

#endif
