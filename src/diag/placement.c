/* placement: the ranks' CPUs and whether they share cores (placement.h). */
#include "placement.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"

static int read_int(const char *path, int *v)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%d", v) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

void placement_self(RankPlace *r, int threads)
{
    memset(r, 0, sizeof *r);
    if (gethostname(r->host, sizeof r->host - 1) != 0) snprintf(r->host, sizeof r->host, "?");
    r->threads = threads > 0 ? threads : 1;
    cpu_set_t set;
    int have = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    size_t o = 0;
    int run = -1; /* the first CPU of the run being written */
    for (int c = 0; c <= CPU_SETSIZE; c++) {
        int in = c < CPU_SETSIZE && (have ? CPU_ISSET(c, &set) : c < online);
        if (in) {
            r->n_cpus++;
            /* the physical core: hyperthreads of one core share its arithmetic units */
            char path[128];
            int pkg = 0, core = c;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
            if (read_int(path, &pkg) != 0 || pkg < 0) pkg = 0;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
            if (read_int(path, &core) != 0 || core < 0) core = c;
            int key = (pkg & 0x7fff) << 16 | (core & 0xffff), seen = 0;
            for (int i = 0; i < r->n_cores && !seen; i++) seen = r->core[i] == key;
            if (!seen && r->n_cores < PLACE_MAX_CORES) r->core[r->n_cores++] = key;
            if (run < 0) run = c;
        } else if (run >= 0) {
            if (o < sizeof r->cpus)
                o += snprintf(r->cpus + o, sizeof r->cpus - o, c - 1 > run ? "%s%d-%d" : "%s%d", o ? "," : "", run,
                              c - 1);
            run = -1;
        }
    }
    if (r->n_cpus == 0) { /* no affinity and no count: one CPU */
        r->n_cpus = r->n_cores = 1;
        snprintf(r->cpus, sizeof r->cpus, "?");
    }
    qsort(r->core, (size_t)r->n_cores, sizeof r->core[0], cmp_int);
}

/* cores both sorted lists hold */
static int common_cores(const RankPlace *a, const RankPlace *b)
{
    int i = 0, j = 0, n = 0;
    while (i < a->n_cores && j < b->n_cores) {
        if (a->core[i] == b->core[j]) n++, i++, j++;
        else if (a->core[i] < b->core[j]) i++;
        else j++;
    }
    return n;
}

void placement_judge(const RankPlace *r, int n, int cpu, Placement *out)
{
    memset(out, 0, sizeof *out);
    out->ranks = n;
    out->cpu = cpu;
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = strcmp(r[i].host, r[j].host) != 0;
        out->hosts += first;
    }
    if (!cpu) {
        snprintf(out->why, sizeof out->why, "%d rank%s on GPUs", n, n == 1 ? "" : "s");
        return;
    }
    /* 1. two ranks of one host whose CPU sets reach a common core */
    for (int i = 0; i < n && !out->shares_cores; i++)
        for (int j = i + 1; j < n && !out->shares_cores; j++)
            if (!strcmp(r[i].host, r[j].host) && common_cores(&r[i], &r[j]) > 0) {
                out->shares_cores = 1;
                snprintf(
                    out->why, sizeof out->why,
                    "ranks %d and %d on host %.64s may run on the same cores: their CPU sets %.32s and %.32s share %d",
                    i, j, r[i].host, r[i].cpus, r[j].cpus, common_cores(&r[i], &r[j]));
            }
    /* 2. a host's ranks run more threads than the CPUs they may use */
    for (int i = 0; i < n && !out->shares_cores; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = strcmp(r[i].host, r[j].host) != 0;
        if (!first) continue;
        int ranks = 0, threads = 0, cpus = 0;
        for (int j = i; j < n; j++)
            if (!strcmp(r[i].host, r[j].host)) ranks++, threads += r[j].threads, cpus += r[j].n_cpus;
        /* the sets are disjoint here (rule 1), so their sizes add up */
        if (threads > cpus) {
            out->shares_cores = 1;
            snprintf(out->why, sizeof out->why, "%d rank%s x %d thread%s on host %.64s's %d CPU%s", ranks,
                     ranks == 1 ? "" : "s", r[i].threads, r[i].threads == 1 ? "" : "s", r[i].host, cpus,
                     cpus == 1 ? "" : "s");
        }
    }
    if (!out->shares_cores)
        snprintf(out->why, sizeof out->why, "%d rank%s on %d host%s, each on cores of its own", n, n == 1 ? "" : "s",
                 out->hosts, out->hosts == 1 ? "" : "s");
}

void placement_get(Placement *pl, Backend *be, Dist *d)
{
    int cpu = be->host_memory != 0;
    int world = d ? d->world : 1;
    RankPlace *all = xcalloc((size_t)world, sizeof *all);
    placement_self(&all[0], cpu ? be->n_threads : 1);
    if (cpu && world > 1) {
        /* the CPU backend's memory is the host's: the records travel as they are */
        if (d->rank == 0) {
            for (int r = 1; r < world; r++) dist_recv(d, be, &all[r], sizeof all[r], r);
        } else {
            dist_send(d, be, &all[0], sizeof all[0], 0);
            dist_flush(d, be);
        }
    }
    int judged = cpu && (!d || d->rank == 0) ? world : 1;
    placement_judge(all, judged, cpu, pl);
    pl->ranks = world;
    free(all);
}

json_t *placement_json(const Placement *pl)
{
    return json_pack("{s:i, s:i, s:b, s:b, s:s}", "ranks", pl->ranks, "hosts", pl->hosts, "cpu", pl->cpu,
                     "shares_cores", pl->shares_cores, "why", pl->why);
}
