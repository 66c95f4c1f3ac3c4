/* report: diagnosis text, the layout sweep, its markdown and SVG charts (report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/svg.h"
#include "../base/util.h"
#include "profile.h"

static double jnum(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

void report_print_json(FILE *f, json_t *d)
{
    json_t *br = json_object_get(d, "breakdown"), *dep = json_object_get(d, "deployment");
    if (dep)
        fprintf(f, "layout: tp %lld, pp %lld, ep %lld; a step %.3f ms, %.1f tokens/s\n",
                (long long)json_integer_value(json_object_get(dep, "tp")), (long long)json_integer_value(json_object_get(dep, "pp")),
                (long long)json_integer_value(json_object_get(dep, "ep")), jnum(d, "step_ms"), jnum(d, "tokens_per_s"));
    fprintf(f, "%-24s %10s %7s %10s %10s\n", "category", "ms/step", "share", "% FLOP", "% bytes");
    for (int k = 0; k < SC_COUNT; k++) {
        json_t *c = json_object_get(br, step_cat_name(k));
        if (!c || jnum(c, "ms") <= 0) continue;
        fprintf(f, "%-24s %10.3f %6.1f%% %9.1f%% %9.1f%%\n", step_cat_title(k), jnum(c, "ms"), 100 * jnum(c, "share"),
                jnum(c, "tflops_pct"), jnum(c, "gbps_pct"));
    }
    fprintf(f, "\nverdict: %s\n", json_string_value(json_object_get(d, "verdict")));
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "evidence"), i, v) fprintf(f, "  - %s\n", json_string_value(v));
    fprintf(f, "advice:\n");
    json_array_foreach(json_object_get(d, "advice"), i, v) fprintf(f, "  - %s\n", json_string_value(v));
}

int report_parse_layout(const char *s, int *tp, int *pp, int *ep)
{
    *tp = *pp = *ep = 1;
    const char *p = s;
    int any = 0;
    while (*p) {
        int *dst = !strncmp(p, "tp", 2) ? tp : !strncmp(p, "pp", 2) ? pp : !strncmp(p, "ep", 2) ? ep : NULL;
        if (!dst) return -1;
        p += 2;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1024) return -1;
        *dst = (int)v;
        p = end;
        any = 1;
    }
    if (*ep > 1 && *tp == 1) *tp = *ep;
    return any ? 0 : -1;
}

static double share_of(json_t *d, int k) { return jnum(json_object_get(json_object_get(d, "breakdown"), step_cat_name(k)), "share"); }

static double comm_share(json_t *d)
{
    return share_of(d, SC_ALL_REDUCE) + share_of(d, SC_ALL_TO_ALL) + share_of(d, SC_PP_SEND);
}

int report_scaling(const SweepRun *r, int n, char *buf, size_t len)
{
    size_t o = 0;
#define W(...) do { if (o < len) o += snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
    buf[0] = 0;
    /* ranks that take turns on the same cores measure the sharing, not the layout: no reading */
    int shared = 0;
    for (int i = 0; i < n; i++) {
        json_t *pl = r[i].diag ? json_object_get(r[i].diag, "placement") : NULL;
        if (!json_is_true(json_object_get(pl, "shares_cores"))) continue;
        W("%s%s (%s)", shared++ ? "; " : "", r[i].name, json_string_value(json_object_get(pl, "why")));
    }
    if (shared) {
        char which[2048];
        snprintf(which, sizeof which, "%s", buf);
        o = 0;
        W("The sweep is not meaningful here: ranks share cores in %s. Their throughput measures how the ranks take "
          "turns on the cores (and the rest of the machine's load), not the layout, so no scaling is read from it. "
          "Give each rank cores of its own to compare layouts: mpirun binds a rank to a core when there are cores "
          "enough, and --threads times the ranks of a host should not pass its cores.", which);
        return 0;
    }
    int best = -1;
    for (int i = 0; i < n; i++)
        if (r[i].diag && (best < 0 || jnum(r[i].diag, "tokens_per_s") > jnum(r[best].diag, "tokens_per_s"))) best = i;
    if (best < 0) {
        W("no layout produced a diagnosis.");
        return 0;
    }
    W("Fastest: %s at %.1f tokens/s (%s). ", r[best].name, jnum(r[best].diag, "tokens_per_s"),
      json_string_value(json_object_get(r[best].diag, "verdict")));
    /* pairs with the same number of ranks but a different split of them: the scaling signature */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || !r[i].diag || !r[j].diag || r[i].world != r[j].world || r[i].tp <= r[j].tp) continue;
            double ti = jnum(r[i].diag, "tokens_per_s"), tj = jnum(r[j].diag, "tokens_per_s");
            double ci = comm_share(r[i].diag), cj = comm_share(r[j].diag);
            double ratio = tj > 0 ? ti / tj : 0;
            W("%s (more tensor parallelism) gives %.2fx the throughput of %s; communication is %.0f%% vs %.0f%% of a step: ",
              r[i].name, ratio, r[j].name, 100 * ci, 100 * cj);
            if (ratio >= 1.05 && ci < 0.25)
                W("fewer collective participants are slower while communication stays small, so the work is on the "
                  "compute side (kernels or bubbles), not the links. ");
            else if (ratio <= 0.95 && ci >= 0.25)
                W("more collective participants cost more than they add: communication-bound, prefer the layout with "
                  "fewer tensor-parallel ranks. ");
            else if (ratio <= 0.95)
                W("the wider tensor split is slower although communication is modest: look at the dominant op's "
                  "efficiency at the smaller per-rank shapes. ");
            else
                W("the two are within 5%%: neither the links nor the split decide. ");
        }
    /* the same split over more ranks */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || !r[i].diag || !r[j].diag || r[i].world <= r[j].world || r[i].pp != r[j].pp || r[i].tp == r[j].tp) continue;
            double ratio = jnum(r[j].diag, "tokens_per_s") > 0 ? jnum(r[i].diag, "tokens_per_s") / jnum(r[j].diag, "tokens_per_s") : 0;
            W("%s over %s: %.2fx throughput for %.1fx the ranks%s. ", r[i].name, r[j].name, ratio,
              (double)r[i].world / r[j].world, ratio < 0.8 * r[i].world / r[j].world ? " (sub-linear: see the communication share)" : "");
        }
#undef W
    return 1;
}

/* ---- SVG ---- */

static const char *const colors[SC_COUNT] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    "#ff9da7", "#9c755f", "#bab0ac", "#d37295", "#8cd17d", "#499894",
};

#define CHART_PAD 12.0

/* A chart's text goes through its placer (svg.h): a label is drawn at the first of its spots
 * that is inside the picture and clear of every label before it, or left out (a tick label
 * that would touch its neighbour). The picture's height is known at the end: the body is
 * written to memory first, and bottom is how far down anything reaches. */
typedef struct {
    FILE *f;
    char *buf;
    size_t len;
    SvgPlacer pl;
    double bottom;
} Chart;

static void chart_open(Chart *c, double w)
{
    memset(c, 0, sizeof *c);
    c->f = open_memstream(&c->buf, &c->len);
    if (!c->f) fatal("report: out of memory");
    svg_placer_init(&c->pl, w, 1e9);
}

static void chart_reach(Chart *c, double y)
{
    if (y > c->bottom) c->bottom = y;
}

static int chart_text(Chart *c, double x, double y, double px, SvgAnchor a, const char *text)
{
    if (svg_place(&c->pl, text, px, &x, &y, &a, 1) < 0) return 0;
    svg_text(c->f, x, y, px, a, NULL, text);
    chart_reach(c, y + 0.25 * px);
    return 1;
}

/* a title up the left side, turned a quarter anticlockwise about its middle (x, y) */
static void chart_text_up(Chart *c, double x, double y, double px, const char *text)
{
    double w = svg_text_width(text, px);
    svg_placer_block(&c->pl, (SvgBox){x - 0.8 * px, y - w / 2, x + 0.25 * px, y + w / 2});
    char rot[64];
    snprintf(rot, sizeof rot, "transform=\"rotate(-90 %.1f %.1f)\"", x, y);
    svg_text(c->f, x, y, px, SVG_MIDDLE, rot, text);
    chart_reach(c, y + w / 2);
}

static int chart_close(Chart *c, const char *path)
{
    fclose(c->f);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(c->buf);
        return -1;
    }
    svg_begin(f, c->pl.w, ceil(c->bottom + CHART_PAD));
    fwrite(c->buf, 1, c->len, f);
    fputs("</svg>\n", f);
    free(c->buf);
    return fclose(f);
}

/* A legend: a swatch (drawn by the caller at x, y - 10, 12 x 12) and a label an entry, left to
 * right, a new row where the next would pass the right edge. */
typedef struct {
    double x0, x1, x, y;
} Flow;

static void flow_entry(Chart *c, Flow *fl, const char *text, int swatch, double *sx, double *sy)
{
    double px = 12, room = fl->x1 - fl->x0 - (swatch ? 18 : 0);
    char cut[400];
    if (svg_text_width(text, px) > room) { /* longer than a row: as much as fits, then "..." */
        size_t k = strlen(text) < sizeof cut - 4 ? strlen(text) : sizeof cut - 4;
        memcpy(cut, text, k);
        do {
            while (k > 0 && (cut[k - 1] & 0xC0) == 0x80) k--; /* not inside a UTF-8 character */
            if (k > 0) k--;
            memcpy(cut + k, "...", 4);
        } while (k > 0 && svg_text_width(cut, px) > room);
        text = cut;
    }
    double need = (swatch ? 18 : 0) + svg_text_width(text, px);
    if (fl->x > fl->x0 && fl->x + need > fl->x1) fl->x = fl->x0, fl->y += 22;
    *sx = fl->x;
    *sy = fl->y - 10;
    chart_text(c, fl->x + (swatch ? 18 : 0), fl->y, px, SVG_START, text);
    chart_reach(c, fl->y + 4);
    fl->x += need + 20;
}

static void flow_break(Flow *fl)
{
    if (fl->x > fl->x0) fl->x = fl->x0, fl->y += 22;
}

/* the rows' title: the runs of `diagnose --batch` are loads, a sweep's are layouts */
static const char *rows_title(const SweepRun *r, int n)
{
    for (int i = 0; i < n; i++)
        if (strncmp(r[i].name, "batch", 5)) return "layout";
    return "load";
}

/* Stacked step time a run a row: the categories' ms per step, an x axis in ms, a legend of the
 * categories some run has. */
static int write_breakdown_svg(const SweepRun *r, int n, const char *path)
{
    const double title_px = 15, px = 12, tick_px = 11, row = 34, barh = 24, barw = 520, top = 58;
    double maxms = 0;
    int present[SC_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        if (!r[i].diag) continue;
        if (jnum(r[i].diag, "step_ms") > maxms) maxms = jnum(r[i].diag, "step_ms");
        json_t *br = json_object_get(r[i].diag, "breakdown");
        for (int k = 0; k < SC_COUNT; k++) present[k] |= jnum(json_object_get(br, step_cat_name(k)), "ms") > 0;
    }
    if (maxms <= 0) maxms = 1;
    const char *ytitle = rows_title(r, n), *title = "Step time by category";
    /* the widths: names on the left, each bar's figures after its end */
    double namew = svg_text_width(ytitle, px);
    for (int i = 0; i < n; i++) namew = fmax(namew, svg_text_width(r[i].name, px));
    double left = CHART_PAD + namew + 12, right = left + barw;
    char (*ends)[96] = xcalloc((size_t)(n ? n : 1), sizeof *ends);
    for (int i = 0; i < n; i++) {
        double end = left;
        if (r[i].diag) {
            snprintf(ends[i], sizeof ends[i], "%.3g ms, %.0f tok/s", jnum(r[i].diag, "step_ms"),
                     jnum(r[i].diag, "tokens_per_s"));
            end += jnum(r[i].diag, "step_ms") / maxms * barw;
        } else {
            snprintf(ends[i], sizeof ends[i], "failed");
        }
        right = fmax(right, end + 6 + svg_text_width(ends[i], px));
    }
    double W = fmax(fmax(right, CHART_PAD + svg_text_width(title, title_px)), 480) + CHART_PAD;
    Chart c;
    chart_open(&c, W);
    chart_text(&c, CHART_PAD, 24, title_px, SVG_START, title);
    chart_text(&c, CHART_PAD, top - 8, px, SVG_START, ytitle);
    for (int i = 0; i < n; i++) {
        double y = top + row * i, x = left;
        chart_text(&c, CHART_PAD, y + barh / 2 + 4, px, SVG_START, r[i].name);
        json_t *br = r[i].diag ? json_object_get(r[i].diag, "breakdown") : NULL;
        for (int k = 0; br && k < SC_COUNT; k++) {
            double ms = jnum(json_object_get(br, step_cat_name(k)), "ms"), w = ms / maxms * barw;
            if (w <= 0) continue;
            fprintf(c.f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\"><title>", x, y, w,
                    barh, colors[k]);
            fprintf(c.f, "%s %.3f ms</title></rect>\n", step_cat_title(k), ms);
            x += w;
        }
        chart_text(&c, x + 6, y + barh / 2 + 4, px, SVG_START, ends[i]);
    }
    free(ends);
    /* the x axis: ms per step */
    double ya = top + row * n + 2, step = svg_nice_step(maxms);
    fprintf(c.f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", left, ya, left + barw,
            ya);
    for (double v = 0; v <= maxms * (1 + 1e-9); v += step) {
        double x = left + v / maxms * barw;
        char t[32];
        snprintf(t, sizeof t, "%g", v);
        fprintf(c.f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, ya, x, ya + 4);
        chart_text(&c, x, ya + 17, tick_px, SVG_MIDDLE, t);
    }
    chart_text(&c, left + barw / 2, ya + 38, px, SVG_MIDDLE, "time per step (ms)");
    /* the legend: the categories present */
    Flow fl = {.x0 = CHART_PAD, .x1 = W - CHART_PAD, .x = CHART_PAD, .y = ya + 66};
    for (int k = 0; k < SC_COUNT; k++) {
        if (!present[k]) continue;
        double sx, sy;
        flow_entry(&c, &fl, step_cat_title(k), 1, &sx, &sy);
        fprintf(c.f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", sx, sy, colors[k]);
    }
    return chart_close(&c, path);
}

/* a run's mark on the roofline: its shape tells the run, its colour the category */
static void marker(FILE *f, int shape, double x, double y, const char *fill, const char *stroke)
{
    const char *st = stroke ? stroke : "none";
    switch (shape % 5) {
    case 0: fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\" stroke=\"%s\">", x, y, fill, st); return;
    case 1:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"%s\" stroke=\"%s\">", x - 4.5, y - 4.5,
                fill, st);
        return;
    case 2:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\" stroke=\"%s\">", x, y - 6, x + 5.5,
                y + 4, x - 5.5, y + 4, fill, st);
        return;
    case 3:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\" stroke=\"%s\">", x, y - 6,
                x + 6, y, x, y + 6, x - 6, y, fill, st);
        return;
    default:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\" stroke=\"%s\">", x, y + 6, x + 5.5,
                y - 4, x - 5.5, y - 4, fill, st);
        return;
    }
}
static const char *const marker_end[5] = {"</circle>", "</rect>", "</polygon>", "</polygon>", "</polygon>"};

static const char *const dashes[] = {"", "8 4", "3 3", "10 3 3 3", "1 4"};

static void decade_label(char *b, size_t n, int e)
{
    if (e >= -4 && e <= 5) snprintf(b, n, "%g", pow(10, e));
    else snprintf(b, n, "1e%d", e);
}

/* Log-log roofline: x FLOP per byte, y the rate achieved; each compute category of each run a
 * mark (colour: the category, shape: the run), each run's roof from its own ceilings (runs whose
 * ceilings are the same share one). */
static int write_roofline_svg(const SweepRun *r, int n, const char *path)
{
    double peak[32], bw[32]; /* TFLOP/s, TB/s per run (0: none) */
    int any = 0;
    if (n > 32) n = 32;
    double maxpeak = 0;
    for (int i = 0; i < n; i++) {
        json_t *cl = r[i].diag ? json_object_get(r[i].diag, "ceilings") : NULL;
        peak[i] = cl ? jnum(cl, "bf16_tflops") : 0;
        bw[i] = cl ? jnum(cl, "copy_gbps") / 1e3 : 0;
        if (peak[i] > 0 && bw[i] > 0) any = 1, maxpeak = fmax(maxpeak, peak[i]);
        else peak[i] = bw[i] = 0;
    }
    if (!any) return -1;
    /* a CPU's rates read better in GFLOP/s */
    double unit = maxpeak >= 1 ? 1 : 1e3;
    const char *yunit = maxpeak >= 1 ? "TFLOP/s" : "GFLOP/s";
    /* the ranges, in decades: every mark and every ridge point, at least three decades each way */
    double lxmin = INFINITY, lxmax = -INFINITY, lymin = INFINITY;
    int present[SC_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        if (!peak[i]) continue;
        double ridge = log10(peak[i] / bw[i]);
        lxmin = fmin(lxmin, ridge - 1), lxmax = fmax(lxmax, ridge + 1);
        json_t *br = json_object_get(r[i].diag, "breakdown");
        for (int k = 0; k <= SC_SAMPLE; k++) {
            json_t *cat = json_object_get(br, step_cat_name(k));
            double tf = jnum(cat, "tflops_pct") / 100 * peak[i], gb = jnum(cat, "gbps_pct") / 100 * bw[i];
            if (tf <= 0 || gb <= 0) continue;
            present[k] = 1;
            lxmin = fmin(lxmin, log10(tf / gb)), lxmax = fmax(lxmax, log10(tf / gb));
            lymin = fmin(lymin, log10(tf * unit));
        }
    }
    double lx0 = floor(lxmin), lx1 = ceil(lxmax), ly1 = ceil(log10(maxpeak * unit) + 0.15);
    double ly0 = isfinite(lymin) ? floor(lymin) : ly1 - 4;
    if (lx1 - lx0 < 3) lx0 -= 1, lx1 = lx0 + 4;
    if (lx1 - lx0 > 9) lx0 = lx1 - 9;
    if (ly1 - ly0 < 3) ly0 = ly1 - 3;
    if (ly1 - ly0 > 8) ly0 = ly1 - 8;
    const double title_px = 15, px = 12, tick_px = 11, x0 = 88, top = 44, pw = 520, ph = 300;
    const char *title = "Roofline: each op category of each run";
    double W = x0 + pw + 24;
    Chart c;
    chart_open(&c, W);
    chart_text(&c, CHART_PAD, 24, title_px, SVG_START, title);
#define PX(l) (x0 + ((l) - lx0) / (lx1 - lx0) * pw)
#define PY(l) (top + ph - ((l) - ly0) / (ly1 - ly0) * ph)
    fprintf(c.f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", x0,
            top, pw, ph);
    for (int e = (int)lx0; e <= (int)lx1; e++) {
        char t[32];
        decade_label(t, sizeof t, e);
        if (e > lx0 && e < lx1)
            fprintf(c.f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", PX(e), top, PX(e),
                    top + ph);
        chart_text(&c, PX(e), top + ph + 17, tick_px, SVG_MIDDLE, t);
    }
    for (int e = (int)ly0; e <= (int)ly1; e++) {
        char t[32];
        decade_label(t, sizeof t, e);
        if (e > ly0 && e < ly1)
            fprintf(c.f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x0, PY(e),
                    x0 + pw, PY(e));
        chart_text(&c, x0 - 6, PY(e) + 4, tick_px, SVG_END, t);
    }
    chart_text(&c, x0 + pw / 2, top + ph + 38, px, SVG_MIDDLE, "arithmetic intensity (FLOP per byte)");
    char ytitle[64];
    snprintf(ytitle, sizeof ytitle, "achieved %s", yunit);
    chart_text_up(&c, 20, top + ph / 2, px, ytitle);
    /* the roofs, min(peak, bandwidth x intensity): one a set of equal ceilings */
    int roof_of[32], n_roofs = 0, first_of[32];
    for (int i = 0; i < n; i++) {
        roof_of[i] = -1;
        if (!peak[i]) continue;
        for (int j = 0; j < n_roofs && roof_of[i] < 0; j++) {
            int f = first_of[j];
            if (fabs(peak[f] - peak[i]) <= 1e-9 * peak[i] && fabs(bw[f] - bw[i]) <= 1e-9 * bw[i]) roof_of[i] = j;
        }
        if (roof_of[i] < 0) first_of[n_roofs] = i, roof_of[i] = n_roofs++;
    }
    for (int j = 0; j < n_roofs; j++) {
        int f = first_of[j];
        fprintf(c.f, "<polyline fill=\"none\" stroke=\"#333\" stroke-width=\"2\" stroke-dasharray=\"%s\" points=\"",
                dashes[j % 5]);
        for (double l = lx0; l <= lx1 + 1e-9; l += 0.02) {
            double y = log10(fmin(peak[f], bw[f] * pow(10, l)) * unit);
            if (y >= ly0 && y <= ly1) fprintf(c.f, "%.1f,%.1f ", PX(l), PY(y));
        }
        fprintf(c.f, "\"/>\n");
    }
    for (int i = 0; i < n; i++) {
        if (!peak[i]) continue;
        json_t *br = json_object_get(r[i].diag, "breakdown");
        for (int k = 0; k <= SC_SAMPLE; k++) {
            json_t *cat = json_object_get(br, step_cat_name(k));
            double tf = jnum(cat, "tflops_pct") / 100 * peak[i], gb = jnum(cat, "gbps_pct") / 100 * bw[i];
            if (tf <= 0 || gb <= 0) continue;
            double ai = tf / gb;
            double lx = fmin(fmax(log10(ai), lx0), lx1), ly = fmin(fmax(log10(tf * unit), ly0), ly1);
            marker(c.f, n > 1 ? i : 0, PX(lx), PY(ly), colors[k], NULL);
            fprintf(c.f, "<title>");
            svg_escape(c.f, r[i].name);
            fprintf(c.f, " %s: %.4g %s at %.3g FLOP/byte</title>%s\n", step_cat_title(k), tf * unit, yunit, ai,
                    marker_end[(n > 1 ? i : 0) % 5]);
        }
    }
#undef PX
#undef PY
    /* the legend: the categories marked, the runs' shapes, the roofs */
    Flow fl = {.x0 = CHART_PAD, .x1 = W - CHART_PAD, .x = CHART_PAD, .y = top + ph + 66};
    double sx, sy;
    for (int k = 0; k <= SC_SAMPLE; k++) {
        if (!present[k]) continue;
        flow_entry(&c, &fl, step_cat_title(k), 1, &sx, &sy);
        marker(c.f, 0, sx + 6, sy + 6, colors[k], NULL);
        fprintf(c.f, "%s\n", marker_end[0]);
    }
    if (n > 1) {
        flow_break(&fl);
        for (int i = 0; i < n; i++) {
            if (!peak[i]) continue;
            flow_entry(&c, &fl, r[i].name, 1, &sx, &sy);
            marker(c.f, i, sx + 6, sy + 6, "white", "#333");
            fprintf(c.f, "%s\n", marker_end[i % 5]);
        }
    }
    flow_break(&fl);
    for (int j = 0; j < n_roofs; j++) {
        char names[256] = "", t[400];
        size_t o = 0;
        for (int i = 0; i < n; i++)
            if (roof_of[i] == j && o < sizeof names)
                o += snprintf(names + o, sizeof names - o, "%s%s", o ? ", " : "", r[i].name);
        int f = first_of[j];
        snprintf(t, sizeof t, "roof of %s: %.4g %s, %.4g GB/s", names, peak[f] * unit, yunit, bw[f] * 1e3);
        if (n == 1) snprintf(t, sizeof t, "roof: %.4g %s, %.4g GB/s", peak[f] * unit, yunit, bw[f] * 1e3);
        flow_entry(&c, &fl, t, 1, &sx, &sy);
        /* a roof's swatch: its line, 14 px long, between the entry's swatch spot and its label */
        fprintf(c.f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"2\" "
                "stroke-dasharray=\"%s\"/>\n",
                sx, sy + 6, sx + 14, sy + 6, dashes[j % 5]);
    }
    return chart_close(&c, path);
}

int report_write(const SweepRun *r, int n, const char *dir, const char *title)
{
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/breakdown.svg", dir);
    if (write_breakdown_svg(r, n, path)) return -1;
    snprintf(path, sizeof path, "%s/roofline.svg", dir);
    write_roofline_svg(r, n, path);
    snprintf(path, sizeof path, "%s/report.md", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "# %s\n\n", title);
    fprintf(f, "| layout | ranks | tokens/s | step ms | verdict | compute | comm | bubble | host |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        if (!r[i].diag) {
            fprintf(f, "| %s | %d | failed | | | | | | |\n", r[i].name, r[i].world);
            continue;
        }
        double comp = 0;
        for (int k = 0; k <= SC_SAMPLE; k++) comp += share_of(r[i].diag, k);
        fprintf(f, "| %s | %d | %.1f | %.3f | %s | %.0f%% | %.0f%% | %.0f%% | %.0f%% |\n", r[i].name, r[i].world,
                jnum(r[i].diag, "tokens_per_s"), jnum(r[i].diag, "step_ms"), json_string_value(json_object_get(r[i].diag, "verdict")),
                100 * comp, 100 * comm_share(r[i].diag), 100 * share_of(r[i].diag, SC_PP_WAIT),
                100 * (share_of(r[i].diag, SC_HOST_GAP) + share_of(r[i].diag, SC_SCHEDULING)));
    }
    char scal[4096];
    report_scaling(r, n, scal, sizeof scal);
    fprintf(f, "\n## Scaling\n\n%s\n\n![step time per layout](breakdown.svg)\n\n![roofline](roofline.svg)\n", scal);
    for (int i = 0; i < n; i++) {
        if (!r[i].diag) continue;
        fprintf(f, "\n## %s\n\n```\n", r[i].name);
        report_print_json(f, r[i].diag);
        fprintf(f, "```\n");
    }
    return fclose(f);
}

int report_sweep(const char *layouts, const char *pass, const char *device, const char *launcher, const char *out_dir, int as_json)
{
    SweepRun runs[32];
    int n = 0;
    char list[1024];
    snprintf(list, sizeof list, "%s", layouts);
    int gpu = device ? !strncmp(device, "cuda", 4) : access("/dev/nvidiactl", F_OK) == 0;
    char self[1024];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) fatal("diagnose --sweep: cannot find its own binary");
    self[k] = 0;
    char *save_l = NULL;
    for (char *tok = strtok_r(list, ",", &save_l); tok && n < 32; tok = strtok_r(NULL, ",", &save_l)) {
        SweepRun *r = &runs[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", tok);
        if (report_parse_layout(tok, &r->tp, &r->pp, &r->ep) < 0) fatal("diagnose --sweep: '%s' is not a layout (tp2pp2, ep4, ...)", tok);
        r->world = r->tp * r->pp;
        char launch[512] = "";
        if (launcher) snprintf(launch, sizeof launch, "%s -np %d", launcher, r->world);
        else if (!gpu && r->world > 1)
            snprintf(launch, sizeof launch, "mpirun --allow-run-as-root --oversubscribe -np %d", r->world);
        /* stdout holds rank 0's one JSON line alone; the ranks' logs go to a file (merged into the
         * same pipe, another rank's log line could land inside the JSON line) */
        char errpath[] = "/tmp/moeserve-sweep-XXXXXX";
        int efd = mkstemp(errpath);
        if (efd < 0) fatal("diagnose --sweep: cannot make a log file in /tmp: %s", strerror(errno));
        close(efd);
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "%s '%s' diagnose --json --tp %d --pp %d --ep %d%s%s%s </dev/null 2>'%s'", launch, self, r->tp,
                 r->pp, r->ep, device ? " --device " : "", device ? device : "", pass, errpath);
        log_info("diagnose --sweep: %s", cmd);
        FILE *p = popen(cmd, "r");
        if (!p) fatal("diagnose --sweep: %s: %s", cmd, strerror(errno));
        char *out = NULL;
        size_t len = 0, cap = 0;
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
            if (len + got + 1 > cap) out = xrealloc(out, cap = 2 * (len + got + 1));
            memcpy(out + len, buf, got);
            len += got;
        }
        int st = pclose(p);
        if (out) out[len] = 0;
        /* the diagnosis is the one line that is a JSON object with a verdict */
        char *save = NULL;
        for (char *line = out ? strtok_r(out, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
            if (line[0] != '{') continue;
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            if (o && json_object_get(o, "verdict")) {
                r->diag = o;
                break;
            }
            if (o) json_decref(o);
        }
        if (!r->diag) {
            log_error("diagnose --sweep: %s gave no diagnosis (exit %d); its log:", r->name, st);
            FILE *ef = fopen(errpath, "r");
            char line[1024];
            while (ef && fgets(line, sizeof line, ef)) fprintf(stderr, "    %s", line);
            if (ef) fclose(ef);
        }
        else log_info("diagnose --sweep: %s: %.1f tokens/s, %s", r->name, jnum(r->diag, "tokens_per_s"),
                      json_string_value(json_object_get(r->diag, "verdict")));
        free(out);
        unlink(errpath);
    }
    if (report_write(runs, n, out_dir, "moeserve diagnose --sweep") != 0) fatal("diagnose --sweep: cannot write %s", out_dir);
    char scal[4096];
    int meaningful = report_scaling(runs, n, scal, sizeof scal);
    if (as_json) {
        json_t *o = json_object(), *arr = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(arr, json_pack("{s:s, s:i, s:i, s:i, s:O?}", "layout", runs[i].name, "tp", runs[i].tp, "pp",
                                                 runs[i].pp, "ep", runs[i].ep, "diagnosis", runs[i].diag));
        json_object_set_new(o, "runs", arr);
        json_object_set_new(o, "scaling", json_string(scal));
        json_object_set_new(o, "scaling_meaningful", json_boolean(meaningful));
        json_object_set_new(o, "report", json_string(out_dir));
        out_json(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
    } else {
        printf("%-10s %6s %12s %10s  %s\n", "layout", "ranks", "tokens/s", "step ms", "verdict");
        for (int i = 0; i < n; i++)
            printf("%-10s %6d %12.1f %10.3f  %s\n", runs[i].name, runs[i].world, runs[i].diag ? jnum(runs[i].diag, "tokens_per_s") : 0,
                   runs[i].diag ? jnum(runs[i].diag, "step_ms") : 0,
                   runs[i].diag ? json_string_value(json_object_get(runs[i].diag, "verdict")) : "failed");
        printf("\n%s\nreport: %s/report.md (breakdown.svg, roofline.svg)\n", scal, out_dir);
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (!runs[i].diag) failed++;
        json_decref(runs[i].diag);
    }
    return failed ? 1 : 0;
}
