/* bench_plot: `moeserve bench plot RESULTS.jsonl...` draws the results of `bench serve` (the JSON
 * lines of --output-file, in SGLang's or vLLM's keys, or the peers' own files) as one SVG with
 * two charts: output throughput against concurrency, and the Pareto chart people share: per-user
 * tokens/s (1000 / mean TPOT) against output throughput per GPU (--gpus N, else the lines' own
 * "gpus"). One series per input file, or per "label"/"tag" when the lines carry one. A PNG is
 * written beside the SVG when rsvg-convert or ImageMagick is installed.
 *   moeserve bench plot results.jsonl [more.jsonl] [--gpus 8] [--output chart.svg] [--title T] */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../backend/backend.h"
#include "../base/opt.h"
#include "../base/svg.h"
#include "../engine/engine.h"
#include "../model/model_opts.h"
#include "bench_serve.h"

#define MAX_FILES 16
#define MAX_SERIES 16

/* ---- types ---- */

typedef struct {
    double conc;               /* max_concurrency (or the measured mean concurrency) */
    double out_tps;            /* output tokens/s, all GPUs */
    double user_tps;           /* tokens/s seen by one user: 1000 / mean TPOT */
    int gpus;
} Point;

typedef struct {
    char name[128];
    Point *p;
    int n, cap;
} Series;

typedef struct { double x0, y0, w, h; double xmin, xmax, ymin, ymax; int xlog; } Axes;

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

/* ---- reading ---- */

static double num(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (!json_is_number(v) && b) v = json_object_get(o, b);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static Series *series_for(Series *s, int *ns, const char *name)
{
    for (int i = 0; i < *ns; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    if (*ns == MAX_SERIES) fatal("bench plot: more than %d series", MAX_SERIES);
    Series *x = &s[(*ns)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    return x;
}

static void read_file(const char *path, Series *s, int *ns)
{
    int fd = file_open_regular(path); /* a FIFO would wait for a writer, a device never end */
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) fatal("bench plot: cannot open %s: %s", path, file_read_error(errno));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, kept = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!o) {
            if (strspn(line, " \t\r\n") == strlen(line)) continue;
            fatal("bench plot: %s:%d: %s", path, lineno, e.text);
        }
        const char *label = json_string_value(json_object_get(o, "label"));
        if (!label) label = json_string_value(json_object_get(o, "tag"));
        char name[128];
        snprintf(name, sizeof name, "%s", label ? label : base);
        Point p;
        p.conc = num(o, "max_concurrency", NULL);
        if (!isfinite(p.conc)) p.conc = num(o, "concurrency", NULL);
        p.out_tps = num(o, "output_throughput", NULL);
        double tpot = num(o, "mean_tpot_ms", NULL);
        p.user_tps = tpot > 0 ? 1e3 / tpot : NAN;
        double g = num(o, "gpus", NULL);
        p.gpus = isfinite(g) && g >= 1 ? (int)g : 0;
        json_decref(o);
        if (!isfinite(p.out_tps)) continue;
        Series *x = series_for(s, ns, name);
        if (x->n == x->cap) {
            x->cap = x->cap ? x->cap * 2 : 16;
            x->p = xrealloc(x->p, (size_t)x->cap * sizeof *x->p);
        }
        x->p[x->n++] = p;
        kept++;
    }
    free(line);
    fclose(f);
    if (!kept) fatal("bench plot: %s: no result lines (with \"output_throughput\")", path);
}

/* ---- drawing ---- */

static double nice_step(double range)
{
    double raw = range / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

static double ax_x(const Axes *a, double v)
{
    double t = a->xlog ? (log2(v) - log2(a->xmin)) / (log2(a->xmax) - log2(a->xmin)) : (v - a->xmin) / (a->xmax - a->xmin);
    return a->x0 + t * a->w;
}

static double ax_y(const Axes *a, double v) { return a->y0 + a->h - (v - a->ymin) / (a->ymax - a->ymin) * a->h; }

static void fmt_num(char *b, size_t n, double v)
{
    if (fabs(v) >= 1e6) snprintf(b, n, "%.3gM", v / 1e6);
    else if (fabs(v) >= 1e4) snprintf(b, n, "%.3gk", v / 1e3);
    else snprintf(b, n, "%g", v);
}

static void axes_draw(FILE *f, const Axes *a, const char *title, const char *xl, const char *yl)
{
    char b[32];
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", a->x0, a->y0, a->w, a->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
            a->x0 + a->w / 2, a->y0 - 12, title);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\">%s</text>\n", a->x0 + a->w / 2, a->y0 + a->h + 40, xl);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
            a->x0 - 58, a->y0 + a->h / 2, a->x0 - 58, a->y0 + a->h / 2, yl);
    double ys = nice_step(a->ymax - a->ymin);
    for (double v = ceil(a->ymin / ys) * ys; v <= a->ymax + 1e-9 * ys; v += ys) {
        double y = ax_y(a, v);
        fmt_num(b, sizeof b, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", a->x0, y, a->x0 + a->w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%s</text>\n", a->x0 - 6, y + 4, b);
    }
    if (a->xlog) {
        for (double v = pow(2, ceil(log2(a->xmin))); v <= a->xmax * (1 + 1e-9); v *= 2) {
            double x = ax_x(a, v);
            fmt_num(b, sizeof b, v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, a->y0, x, a->y0 + a->h);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%s</text>\n", x, a->y0 + a->h + 16, b);
        }
    } else {
        double xs = nice_step(a->xmax - a->xmin);
        for (double v = ceil(a->xmin / xs) * xs; v <= a->xmax + 1e-9 * xs; v += xs) {
            double x = ax_x(a, v);
            fmt_num(b, sizeof b, v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, a->y0, x, a->y0 + a->h);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%s</text>\n", x, a->y0 + a->h + 16, b);
        }
    }
}

static int cmp_x(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* One series: points (x, y, tag) sorted by x, a polyline and dots labelled with the tag. */
static void series_draw(FILE *f, const Axes *a, double *xyt, int n, const char *color)
{
    qsort(xyt, (size_t)n, 3 * sizeof *xyt, cmp_x);
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
    for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", ax_x(a, xyt[3 * i]), ax_y(a, xyt[3 * i + 1]));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double x = ax_x(a, xyt[3 * i]), y = ax_y(a, xyt[3 * i + 1]);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", x, y, color);
        if (isfinite(xyt[3 * i + 2]))
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">c=%g</text>\n", x + 6, y - 6, color, xyt[3 * i + 2]);
    }
}

static void range_of(Axes *a, double lo_x, double hi_x, double hi_y, int xlog)
{
    a->xlog = xlog && lo_x > 0 && hi_x / lo_x >= 8;
    if (a->xlog) {
        a->xmin = pow(2, floor(log2(lo_x)));
        a->xmax = pow(2, ceil(log2(hi_x)));
        if (a->xmax <= a->xmin) a->xmax = a->xmin * 2;
    } else {
        double pad = (hi_x - lo_x) * 0.05 + (hi_x == lo_x ? fabs(hi_x) * 0.5 + 1 : 0);
        a->xmin = lo_x - pad < 0 && lo_x >= 0 ? 0 : lo_x - pad;
        a->xmax = hi_x + pad;
    }
    a->ymin = 0;
    a->ymax = hi_y > 0 ? hi_y * 1.1 : 1;
}

static int have_tool(const char *cmd, const char *needle)
{
    char full[256], buf[256] = "";
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return st == 0 && strstr(buf, needle) != NULL;
}

/* ---- the command ---- */

int bench_plot_main(int argc, char **argv)
{
    const char *files[MAX_FILES], *out = NULL, *title = NULL;
    int nf = 0, gpus = 0;
    const OptSpec specs[] = {
        {.names = "--output|-o", .type = OPT_STR, .dst = &out, .metavar = "FILE.svg",
         .help = "the chart (and a PNG beside it)",
         .def = "the first results file's name, .svg"},
        {.names = "--gpus", .type = OPT_INT, .dst = &gpus, .metavar = "N",
         .help = "GPUs of the runs, for per-GPU throughput",
         .def = "the results' own", .lo = 1, .hi = 1 << 16},
        {.names = "--title", .type = OPT_STR, .dst = &title, .metavar = "TEXT", .help = "the chart's title"},
    };
    const OptGroup groups[] = {OPT_GROUP("bench plot", specs)};
    const OptCommand oc = {.cmd = "bench plot", .synopsis = "RESULTS.jsonl [RESULTS.jsonl...] [options]",
                            .about = "Throughput against per-user speed, an SVG of bench serve's results files.",
                            .groups = groups, .n_groups = 1, .max_pos = MAX_FILES, .pos_name = "RESULTS.jsonl files"};
    opt_parse(&oc, argc, argv, files, &nf);
    if (!nf) {
        fprintf(stderr, "error: bench plot: a results file is required\n");
        return 2;
    }
    Series s[MAX_SERIES];
    int ns = 0;
    for (int i = 0; i < nf; i++) read_file(files[i], s, &ns);
    char svg[4200], png[4200];
    if (out) snprintf(svg, sizeof svg, "%s", out);
    else {
        snprintf(svg, sizeof svg, "%s", files[0]);
        char *dot = strrchr(svg, '.'), *slash = strrchr(svg, '/');
        if (dot && (!slash || dot > slash)) *dot = 0;
        strncat(svg, ".svg", sizeof svg - strlen(svg) - 1);
    }
    snprintf(png, sizeof png, "%s", svg);
    char *dot = strrchr(png, '.');
    if (dot && !strcmp(dot, ".svg")) *dot = 0;
    strncat(png, ".png", sizeof png - strlen(png) - 1);

    /* ranges over every series */
    double cmin = INFINITY, cmax = 0, tmax = 0, umin = INFINITY, umax = 0, gmax = 0;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < s[i].n; j++) {
            Point *p = &s[i].p[j];
            int g = gpus ? gpus : p->gpus ? p->gpus : 1;
            if (isfinite(p->conc) && p->conc > 0) { if (p->conc < cmin) cmin = p->conc; if (p->conc > cmax) cmax = p->conc; }
            if (p->out_tps > tmax) tmax = p->out_tps;
            if (isfinite(p->user_tps)) {
                if (p->user_tps < umin) umin = p->user_tps;
                if (p->user_tps > umax) umax = p->user_tps;
                if (p->out_tps / g > gmax) gmax = p->out_tps / g;
            }
        }
    if (!isfinite(cmin)) cmin = cmax = 1;
    if (!isfinite(umin)) umin = umax = 1;

    FILE *f = fopen(svg, "w");
    if (!f) fatal("bench plot: cannot write %s", svg);
    const int W = 1160, H = 520;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
    /* the title and the series' names are the user's text: escaped, or one "&" or "<" breaks the file */
    if (title) svg_text(f, W / 2, 22, 17, SVG_MIDDLE, NULL, title);
    Axes a1 = {.x0 = 90, .y0 = 60, .w = 440, .h = 360}, a2 = {.x0 = 680, .y0 = 60, .w = 440, .h = 360};
    range_of(&a1, cmin, cmax, tmax, 1);
    range_of(&a2, umin, umax, gmax, 0);
    axes_draw(f, &a1, "Throughput vs concurrency", "max concurrency (requests)", "output throughput (tok/s)");
    char yl[64];
    if (gpus) snprintf(yl, sizeof yl, "output tok/s per GPU (%d GPU%s)", gpus, gpus > 1 ? "s" : "");
    else snprintf(yl, sizeof yl, "output tok/s per GPU");
    axes_draw(f, &a2, "Per-user speed vs throughput per GPU", "per-user tok/s (1000 / mean TPOT)", yl);
    for (int i = 0; i < ns; i++) {
        const char *col = colors[i % (int)(sizeof colors / sizeof colors[0])];
        double *xyt = xmalloc((size_t)(s[i].n ? s[i].n : 1) * 3 * sizeof *xyt);
        int k = 0;
        for (int j = 0; j < s[i].n; j++)
            if (isfinite(s[i].p[j].conc) && s[i].p[j].conc > 0)
                xyt[3 * k] = s[i].p[j].conc, xyt[3 * k + 1] = s[i].p[j].out_tps, xyt[3 * k + 2] = NAN, k++;
        series_draw(f, &a1, xyt, k, col);
        k = 0;
        for (int j = 0; j < s[i].n; j++) {
            Point *p = &s[i].p[j];
            if (!isfinite(p->user_tps)) continue;
            int g = gpus ? gpus : p->gpus ? p->gpus : 1;
            xyt[3 * k] = p->user_tps, xyt[3 * k + 1] = p->out_tps / g, xyt[3 * k + 2] = p->conc, k++;
        }
        series_draw(f, &a2, xyt, k, col);
        free(xyt);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"4\" fill=\"%s\"/>\n", 90 + 260 * (i % 4), H - 42 + 18 * (i / 4), col);
        svg_text(f, 110 + 260 * (i % 4), H - 36 + 18 * (i / 4), 12, SVG_START, NULL, s[i].name);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f)) fatal("bench plot: cannot write %s", svg);
    printf("wrote %s\n", svg);
    for (int i = 0; i < ns; i++) free(s[i].p);

    /* the PNG, when a converter is installed (never a hard requirement) */
    if (strchr(svg, '\'') || strchr(png, '\'')) return 0;
    char cmd[9000];
    if (have_tool("rsvg-convert --version", "rsvg")) snprintf(cmd, sizeof cmd, "rsvg-convert -o '%s' '%s'", png, svg);
    else if (have_tool("convert -version", "ImageMagick")) snprintf(cmd, sizeof cmd, "convert '%s' '%s'", svg, png);
    else { printf("no PNG: neither rsvg-convert (librsvg2-bin) nor ImageMagick is installed\n"); return 0; }
    if (system(cmd) == 0) printf("wrote %s\n", png);
    else fprintf(stderr, "bench plot: %s failed\n", cmd);
    return 0;
}
