/* placement: where a run's ranks compute, and whether they share cores. Ranks of the CPU backend
 * on one host whose CPU sets reach a common core, or whose threads outnumber the host's cores
 * they may use, take turns on the cores: their step times then measure that sharing (and the
 * rest of the machine's load), not the layout, so a sweep reads no scaling from them
 * (report_scaling). GPU ranks compute on their GPUs: their host threads are not judged. */
#ifndef MOESERVE_PLACEMENT_H
#define MOESERVE_PLACEMENT_H

#include <jansson.h>

#include "../backend/backend.h"
#include "../dist/dist.h"

#define PLACE_MAX_CORES 256

/* One rank's CPUs, as it sees them. */
typedef struct {
    char host[64];
    int threads;               /* the CPU backend's threads */
    int n_cpus;                /* logical CPUs of its affinity set */
    int n_cores;               /* physical cores they belong to (hyperthreads of one core count once) */
    int core[PLACE_MAX_CORES]; /* those cores, ascending (package << 16 | core id) */
    char cpus[64];             /* the affinity set as a list, "0-3,8" (for the message) */
} RankPlace;

typedef struct {
    int ranks, hosts;
    int cpu;          /* the ranks compute on CPUs (only those are judged) */
    int shares_cores; /* 1: ranks share cores (or threads outnumber them) */
    char why[320];    /* what was seen, in words */
} Placement;

/* This process's record (threads: the CPU backend's). */
void placement_self(RankPlace *r, int threads);
/* The judgement over n ranks' records (pure, for tests). */
void placement_judge(const RankPlace *r, int n, int cpu, Placement *out);
/* Every rank calls it (the records travel to rank 0, which judges; the others get their own
 * record's judgement). */
void placement_get(Placement *pl, Backend *be, Dist *d);
/* {"ranks", "hosts", "cpu", "shares_cores", "why"} */
json_t *placement_json(const Placement *pl);

#endif
