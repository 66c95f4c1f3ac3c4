/* report: diagnoses as text, and the sweep over parallel layouts (issue #9): each layout run as
 * its own `moeserve diagnose --json`, their throughput and breakdowns side by side, the scaling
 * signature read from them, a markdown report with SVG charts (stacked step time per layout, a
 * roofline with each op category as a point and each layout's roof), their labels placed by
 * base/svg.h so that none covers another or leaves the picture. */
#ifndef MOESERVE_REPORT_H
#define MOESERVE_REPORT_H

#include <jansson.h>
#include <stdio.h>

/* a diagnosis JSON (GET /v1/diagnosis, diagnose --json) as the text diagnose prints */
void report_print_json(FILE *f, json_t *diag);

/* One layout's result. */
typedef struct {
    char name[32];             /* "tp2pp2" */
    int tp, pp, ep, world;
    json_t *diag;              /* its diagnosis (owned) */
} SweepRun;

/* "tp2pp2" -> tp 2, pp 2, ep 1; 0 ok, -1 not a layout */
int report_parse_layout(const char *s, int *tp, int *pp, int *ep);
/* The scaling read across runs (at least 2 with a diagnosis), one paragraph into buf. 1 when it is
 * read; 0 when there is nothing to read, or when a run's ranks share cores (its diagnosis's
 * "placement"): the paragraph then says that the sweep is not meaningful there, and why. */
int report_scaling(const SweepRun *runs, int n, char *buf, size_t len);
/* report.md, breakdown.svg and roofline.svg in dir. 0 ok. */
int report_write(const SweepRun *runs, int n, const char *dir, const char *title);
/* The sweep: runs each layout of the comma-separated list with pass (quoted options) on device,
 * under launcher (NULL: mpirun for CPU layouts of several ranks, none for GPUs), writes the
 * report to out_dir and prints it (as JSON with as_json). */
int report_sweep(const char *layouts, const char *pass, const char *device, const char *launcher, const char *out_dir,
                 int as_json);

#endif
