/* calibrate: the ceilings of this machine that diagnosis compares a step against (issue #9):
 * memory copy and read bandwidth, tensor (GPU) or FMA (CPU) throughput per dtype, and, with
 * several ranks, the collectives a step uses at the sizes it uses them. Measured once and cached
 * as JSON per machine (~/.cache/moeserve/calibrate-<key>.json, or MOESERVE_CALIBRATE_CACHE). */
#ifndef MOESERVE_CALIBRATE_H
#define MOESERVE_CALIBRATE_H

#include <jansson.h>

#include "../backend/backend.h"
#include "../dist/dist.h"

typedef struct {
    char key[256];             /* what the cache is per: backend, device name, threads or SMs */
    char device[256];
    int gpu;
    double copy_gbps;          /* read + write bytes per second of a copy */
    double read_gbps;
    double bf16_tflops;        /* GPU: cuBLASLt BF16; CPU: float32 FMA (the reference's maths) */
    double fp8_tflops;         /* GPU: cuBLASLt FP8 E4M3 (0: not offered) */
    double fp4_tflops;         /* 0: no FP4 tensor cores (Hopper, CPUs) */
    int ranks;                 /* collectives measured over this many ranks (1: none) */
    int tp, pp;
    double allreduce_gbps;     /* bus bandwidth of an all-reduce of a decode step's hidden state x 64 */
    double allreduce_us;       /* latency of a small all-reduce (one token's hidden state) */
    double p2p_gbps;           /* point to point (pipeline stages) */
    char comm[16];             /* "mpi", "nccl", "" */
    char link[64];             /* how the ranks are linked, as far as seen */
    char p2p[160];             /* GPUs: how many, whether they reach each other directly; NVLink links up */
    char when[32];
    char busy[200];            /* "": measured on a quiet machine; else what showed it busy */
} Ceilings;

/* What calibrate_get does: take the cache when there is one (else measure and cache); measure
 * anew, keeping a cached profile of a quiet machine when this one is busy; measure anew and
 * cache it whatever the machine's load. */
typedef enum { CAL_CACHED, CAL_MEASURE, CAL_FORCE } CalMode;
typedef enum { CAL_READ, CAL_SAVED, CAL_KEPT_CACHE, CAL_NOT_SAVED } CalResult;

/* The ceilings of this backend (and layout), from the cache or measured (quick: smaller buffers,
 * fewer repetitions; diagnose's own). A machine is busy when the measurement did not have it to
 * itself: on the CPU, its threads ran less than CAL_MIN_CPU_SHARE of the time they were
 * measured (other processes took the cores; the load average would lag by a minute and count
 * this process too); on a GPU, where the host's share says nothing, two measurements disagree
 * by more than CAL_MAX_DISAGREE. A busy measurement is cached only when no profile of a quiet
 * machine is (or with CAL_FORCE), marked busy so that the next quiet one replaces it.
 * MOESERVE_TEST_CALIBRATE_BUSY decides instead of the measurement (test_hooks.h). Rank 0 decides
 * for every rank; the result is rank 0's. */
#define CAL_MIN_CPU_SHARE 0.8
#define CAL_MAX_DISAGREE 0.15
CalResult calibrate_get(Ceilings *c, Backend *be, Dist *d, int quick, CalMode mode);
json_t *ceilings_json(const Ceilings *c);
void ceilings_print(const Ceilings *c);

#endif
