/* knobs: the table of MOESERVE_* runtime switches and its reader (knobs.h). */
#include "knobs.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The reasons behind the defaults are in docs/PERFORMANCE.md and docs/log/, by knob name. */
static const Knob table[KNOB_COUNT] = {
    [KNOB_LOG] = {"MOESERVE_LOG", KNOB_INT, "2", 0, 3, NULL, "log level: 0 errors, 1 warnings too, 2 information, 3 debug"},
    [KNOB_SYNC] = {"MOESERVE_SYNC", KNOB_INT, "0", 0, 1, NULL,
                   "1: synchronise after every CUDA launch, so that an asynchronous fault names its kernel (slow)"},
    [KNOB_W4] = {"MOESERVE_W4", KNOB_INT, "1", 0, 1, NULL,
                 "0: keep NVFP4 weights in the checkpoint's layout for the simple dequantising kernels instead of "
                 "repacking them for the W4A16 tensor-core kernels"},
    [KNOB_W4_ACT] = {"MOESERVE_W4_ACT", KNOB_CHOICE, "split", 0, 0, "split|bf16",
                     "W4A16 activations: split, two BF16 halves (float32-like accuracy); bf16, one (half the "
                     "tensor-core work in prefill, the rounding of other engines)"},
    [KNOB_W4_PDL] = {"MOESERVE_W4_PDL", KNOB_INT, "1", 0, 1, NULL,
                     "0: no programmatic dependent launch of the dense decode and MoE down kernels (sm_90 and later)"},
    [KNOB_W4_WG_PERSIST] = {"MOESERVE_W4_WG_PERSIST", KNOB_INT, "1", 0, 1, NULL,
                            "0: the wgmma MoE kernels launch a block an item instead of one wave of persistent blocks"},
    [KNOB_W4_SK_CLUSTER] = {"MOESERVE_W4_SK_CLUSTER", KNOB_CHOICE, "auto", 0, 0, "auto|1|2|4",
                            "stream-K dense decode: blocks of a cluster that stage the activation rows together "
                            "(auto: 2 from 24576 row-columns, else 1)"},
    [KNOB_W4_SK_KSPLIT] = {"MOESERVE_W4_SK_KSPLIT", KNOB_CHOICE, "auto", 0, 0, "auto|1|2|4",
                           "stream-K dense decode: parts of K a cluster's blocks take (auto: 4 where K whole cannot "
                           "run, up to 8 rows; else 1)"},
    [KNOB_W4_LT_ROWS] = {"MOESERVE_W4_LT_ROWS", KNOB_INT, "-1", -1, 1 << 24, NULL,
                         "dense NVFP4 GEMMs of at least this many rows dequantise to BF16 and run on cuBLASLt "
                         "(-1: 1536 where the wgmma split-K kernel runs the weight, else 256; 0: never)"},
    [KNOB_W4_MOE_HOT] = {"MOESERVE_W4_MOE_HOT", KNOB_INT, "-1", -1, 1 << 20, NULL,
                         "MoE: experts with more pairs than this in a call run as the hot class on the 128-token "
                         "tile (-1: the threshold of the call tile's class rule; 0: no hot class)"},
    [KNOB_W4_MOE_SMALL] = {"MOESERVE_W4_MOE_SMALL", KNOB_INT, "-1", -1, 1 << 20, NULL,
                           "MoE: experts with at most this many pairs in a call run as the small class on the "
                           "8-token decode tile (-1: the threshold of the call tile's class rule; 0: no small class)"},
    [KNOB_W4_MOE_SIDE] = {"MOESERVE_W4_MOE_SIDE", KNOB_CHOICE, "1", 0, 0, "0|1|2",
                          "MoE expert classes on side streams: 0 none; 1 the small class beside the call's tile, "
                          "the hot class beside the tiles whose class rule says so (the decode tile); 2 the hot class "
                          "beside every tile"},
    [KNOB_SHARED_SIDE] = {"MOESERVE_SHARED_SIDE", KNOB_INT, "16", 0, 1024, NULL,
                          "the shared expert runs beside the router and routed experts (a side stream) in steps of "
                          "up to this many tokens (0: never)"},
    [KNOB_INDEXER_SIDE] = {"MOESERVE_INDEXER_SIDE", KNOB_INT, "16", 0, 1024, NULL,
                           "GLM-5's indexer runs beside the query and latent path in steps of up to this many "
                           "tokens (0: never)"},
    [KNOB_FUSE] = {"MOESERVE_FUSE", KNOB_INT, "1", 0, 1, NULL,
                   "0: keep linears that read the same input apart instead of one fused GEMM"},
    [KNOB_MLA_KERNEL] = {"MOESERVE_MLA_KERNEL", KNOB_CHOICE, "auto", 0, 0, "auto|grouped|per-head",
                         "MLA absorbed decode kernel, the first to try (each falls back to the next where the shape or "
                         "cache does not suit it): auto, tensor cores (32 heads a block); grouped, CUDA cores (16 heads "
                         "a block); per-head, a block per token and head"},
    [KNOB_MLA_PIECE_KERNEL] = {"MOESERVE_MLA_PIECE_KERNEL", KNOB_CHOICE, "auto", 0, 0, "auto|tc|f32",
                               "MLA expanded prefill kernel: auto, tensor cores with the keys staged by cp.async where "
                               "its 198 KB of shared memory fit, else tc; tc, tensor cores, 64 or 48 queries a block; "
                               "f32, float32 on CUDA cores"},
    [KNOB_MLA_PIECE] = {"MOESERVE_MLA_PIECE", KNOB_INT, "0", 0, 4096, NULL,
                        "MLA expanded form: cached positions expanded a piece (0: about 128 MiB of keys and values, "
                        "256 to 4096)"},
    [KNOB_MLA_EXPAND_MIN] = {"MOESERVE_MLA_EXPAND_MIN", KNOB_INT, "32", 1, 1 << 30, NULL,
                             "MLA: a batch with at least this many prompt tokens, half its tokens or more, runs its "
                             "prompt chunks in the expanded form"},
    [KNOB_TUNE_CACHE] = {"MOESERVE_TUNE_CACHE", KNOB_STR, "", 0, 0, NULL,
                         "the tuned tile table's file (default: $XDG_CACHE_HOME or ~/.cache, moeserve/w4-tune.json)"},
    [KNOB_CALIBRATE_CACHE] = {"MOESERVE_CALIBRATE_CACHE", KNOB_STR, "", 0, 0, NULL,
                              "calibrate's ceilings file (default: $XDG_CACHE_HOME or ~/.cache, "
                              "moeserve/calibrate-KEY.json, KEY the backend, device and layout)"},
    [KNOB_COMM] = {"MOESERVE_COMM", KNOB_CHOICE, "auto", 0, 0, "auto|nccl",
                   "collectives: auto, NCCL between GPUs and MPI between CPU ranks; nccl, NCCL for one rank too"},
    [KNOB_COMM_TIMEOUT] = {"MOESERVE_COMM_TIMEOUT", KNOB_INT, "300", 1, 1 << 24, NULL,
                           "seconds a rank waits for the others in a collective before stopping every rank"},
    [KNOB_NCCL_LIB] = {"MOESERVE_NCCL_LIB", KNOB_STR, "", 0, 0, NULL,
                       "the NCCL library to open (default: libnccl.so.2, then libnccl.so)"},
};

typedef struct {
    long v;                    /* the value in force */
    long env;                  /* what the environment (or the default) gave */
    int set;                   /* the environment set it */
    const char *text;          /* as written (the default's text when not set) */
} KnobValue;

static KnobValue values[KNOB_COUNT];
static long overrides[KNOB_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The index of word w in choices ("a|b|c"), or -1. */
static long choice_index(const char *choices, const char *w)
{
    size_t n = strlen(w);
    long i = 0;
    for (const char *p = choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, w, n)) return i;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

/* text as the knob's value; -1 with *why when it is not one */
static int parse(const Knob *k, const char *text, long *out, const char **why)
{
    if (k->type == KNOB_STR) { *out = 0; return 0; }
    if (k->type == KNOB_CHOICE) {
        *out = choice_index(k->choices, text);
        *why = "not one of the choices";
        return *out < 0 ? -1 : 0;
    }
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end) { *why = "not an integer"; return -1; }
    if (v < k->lo || v > k->hi) { *why = "out of range"; return -1; }
    *out = v;
    return 0;
}

static void read_all(void)
{
    for (int i = 0; i < KNOB_COUNT; i++) {
        const Knob *k = &table[i];
        KnobValue *kv = &values[i];
        const char *why = NULL;
        if (!k->var || parse(k, k->def, &kv->env, &why)) die("knob %d: its default '%s' is %s", i, k->def ? k->def : "", why);
        kv->text = k->def;
        const char *e = getenv(k->var);
        long v;
        if (e && *e) {
            if (parse(k, e, &v, &why) == 0) {
                kv->env = v;
                kv->set = 1;
                kv->text = e;
            } else if (k->type == KNOB_CHOICE) {
                log_warn("%s=%s: %s (%s); using %s", k->var, e, why, k->choices, k->def);
            } else {
                log_warn("%s=%s: %s [%ld, %ld]; using %s", k->var, e, why, k->lo, k->hi, k->def);
            }
        }
        kv->v = kv->env;
        overrides[i] = -1;
        if (i == KNOB_LOG) log_level = (int)kv->v; /* first, so that the warnings below obey it */
    }
}

void knobs_init(void) { pthread_once(&once, read_all); }

static KnobValue *value(KnobId k)
{
    knobs_init();
    if ((unsigned)k >= KNOB_COUNT) die("knob %d: no such knob", (int)k);
    return &values[k];
}

long knob_get(KnobId k) { return value(k)->v; }
const char *knob_str(KnobId k) { return value(k)->text; }
int knob_is_set(KnobId k) { return value(k)->set || overrides[k] >= 0; }
const Knob *knob_info(KnobId k) { value(k); return &table[k]; }

void knob_override(KnobId k, long v)
{
    KnobValue *kv = value(k);
    overrides[k] = v;
    kv->v = v < 0 ? kv->env : v;
}

void knobs_print(FILE *f)
{
    for (int i = 0; i < KNOB_COUNT; i++) {
        const Knob *k = &table[i];
        fprintf(f, "- `%s`", k->var);
        if (k->type == KNOB_CHOICE) fprintf(f, " (%s; default %s)", k->choices, k->def);
        else if (k->type == KNOB_INT) fprintf(f, " (%ld to %ld; default %s)", k->lo, k->hi, k->def);
        else fprintf(f, " (a path)");
        fprintf(f, ": %s\n", k->meaning);
    }
}
