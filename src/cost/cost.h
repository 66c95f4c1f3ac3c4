/* cost: the time of an op on a device that may not be here, and of a collective over a link.
 *
 * An op's time comes from the counts the op table keeps for it (backend.c: FLOPs, bytes moved),
 * the device's ceilings (streaming read bandwidth, BF16 tensor rate) and the efficiency the
 * engine's kernels reach on that device, by category (diagnose's) and rows bucket:
 *
 *     t = fixed + max(flops / (tensor rate x compute efficiency), bytes / (read x memory efficiency))
 *
 * with fixed, compute and memory efficiency interpolated in log2(rows) between the buckets 1, 4,
 * 16, 64, 256, 1024 and 4096 rows (clamped outside). A collective takes the link's latency for
 * its algorithm and rank count plus the bytes a rank sends over the link's bandwidth.
 *
 * Device and link profiles are JSON data files (profiles/ in the repository, compiled into the
 * binary; a user's own by path): see docs/USAGE.md "moeserve plan" for their fields. plan.h builds
 * a deployment's steps out of these two functions; a simulated device asks them op by op. */
#ifndef MOESERVE_COST_H
#define MOESERVE_COST_H

#include <jansson.h>
#include <stddef.h>

#include "../backend/backend.h"
#include "../format/quant.h"

/* The categories of compute ops an efficiency is kept for (diagnose's names, step_cat_name). */
typedef enum { CC_DENSE_GEMM, CC_MOE_GEMM, CC_ATTENTION, CC_INDEXER, CC_NORM, CC_ROUTER, CC_SAMPLE, CC_COUNT } CostCat;
#define COST_BUCKETS 7
extern const int cost_bucket_rows[COST_BUCKETS];   /* 1, 4, 16, 64, 256, 1024, 4096 */
const char *cost_cat_name(CostCat c);               /* "dense_gemm", ... */
CostCat cost_cat_of(OpId op);                       /* CC_COUNT for the collectives */

typedef struct {
    double memory[COST_BUCKETS];   /* share of the read roof the op's bytes move at */
    double compute[COST_BUCKETS];  /* share of the BF16 tensor (or float32 FMA) rate its FLOPs run at */
    double fixed_us[COST_BUCKETS]; /* a launch's fixed cost (decode tail, prologue, graph node) */
} CostEff;

typedef struct {
    char name[64];
    char description[256];
    char source[512];              /* where the numbers come from */
    char default_link[64];         /* the link between such cards when --link is not given */
    int gpu;                       /* 1: a GPU (CUDA graphs, side streams), 0: the CPU backend */
    int estimated;                 /* efficiencies carried over from another card, not measured here */
    double memory_bytes;           /* memory of one device */
    double read_gbps;              /* streaming read, GB/s */
    double bf16_tflops;            /* the rate moeserve's GEMMs run on: BF16 tensor cores (W4A16, W8A16);
                                      on the CPU float32 FMA */
    double fp8_tflops, fp4_tflops; /* datasheet figures, for reference (moeserve's kernels do not use them) */
    double smem_kb;                /* shared memory per block (the MLA piece kernel needs 198 KB) */
    int side_rows;                 /* steps of at most this many rows run the shared expert and the
                                      indexer beside the main path (0: never) */
    double step_us;                /* a step's fixed cost on the device side: a decode graph's launch, the
                                      batch's upload, the sampled ids' copy back */
    double host_step_us;           /* as the engine's host (plan --host): its own work per step (scheduling,
                                      building the batch) ... */
    double host_token_us;          /* ... and per sequence in the step */
    double reserve_bytes;          /* memory held before weights: context, workspaces, NCCL buffers */
    CostEff eff[CC_COUNT];
} CostDevice;

typedef struct {
    char name[64];
    char description[256];
    char source[512];
    double bus_gbps;               /* bandwidth of the bytes a rank sends in a collective, GB/s */
    double p2p_gbps;               /* one point-to-point send (pipeline stages) */
    double latency_us;             /* one step of a collective (a hop) */
    double shared_gbps;            /* all ranks' traffic through one shared path (host memory), 0: none */
} CostLink;

/* One op's seconds on dev: flops and bytes as the op table counts them, rows the op's token rows
 * (the batch's T; a MoE op's tokens), wfmt a GEMM's or MoE op's weight format (QF_COUNT: none).
 * The collectives (OP_ALL_REDUCE ...) are cost_comm_seconds's, and give 0 here. */
double cost_op_seconds(const CostDevice *dev, OpId op, double flops, double bytes, int rows, QFormat wfmt);
/* One collective's seconds over link: op OP_ALL_REDUCE, OP_ALL_GATHER, OP_ALL_TO_ALL, OP_PP_SEND or
 * OP_PP_RECV (the transfer alone), bytes what a rank sends (the op table's count), ranks taking
 * part. 0 for one rank or a compute op. */
double cost_comm_seconds(const CostLink *link, OpId op, double bytes, int ranks);

/* A pipeline step: mb micro-batches through pp stages, stage_s[i] one micro-batch's seconds on stage
 * i (its send on included). The first micro-batch crosses every stage, the others follow the slowest
 * one: sum + (mb - 1) x max. *slowest: that stage; *bubble: the time it waits in the step. */
double cost_pipeline_seconds(const double *stage_s, int pp, int mb, int *slowest, double *bubble);

/* Profiles: a built-in name (profiles/devices/NAME.json, profiles/links/NAME.json compiled in) or
 * the path of a JSON file. 0, or -1 with err: an unknown name lists the known ones; a file
 * missing a field names the field. */
int cost_device_load(CostDevice *d, const char *name_or_file, char *err, size_t errlen);
int cost_link_load(CostLink *l, const char *name_or_file, char *err, size_t errlen);
int cost_device_from_json(CostDevice *d, const json_t *o, const char *what, char *err, size_t errlen);
int cost_link_from_json(CostLink *l, const json_t *o, const char *what, char *err, size_t errlen);
json_t *cost_device_json(const CostDevice *d);
json_t *cost_link_json(const CostLink *l);
/* The built-in profile of a device by its name as the driver gives it ("NVIDIA H100 80GB HBM3":
 * "h100"; H200, B200, RTX PRO 6000 likewise), "cpu" when gpu is 0; NULL when none describes it. */
const char *cost_device_for(const char *device_name, int gpu);
/* "b200, cpu, h100, ..." : the built-in names */
void cost_device_names(char *buf, size_t n);
void cost_link_names(char *buf, size_t n);

#endif
