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
} Ceilings;

/* The cached ceilings of this backend (and layout), or measure them (quick: smaller buffers,
 * fewer repetitions; diagnose's own) and cache them. force: measure even when cached. */
void calibrate_get(Ceilings *c, Backend *be, Dist *d, int quick, int force);
json_t *ceilings_json(const Ceilings *c);
void ceilings_print(const Ceilings *c);

#endif
