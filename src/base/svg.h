/* svg: what the charts (diag/report.c, bench/bench_plot.c) need to write SVG a person can read:
 * text escaped for XML, an estimate of a label's width (no font is at hand to measure one), the
 * box a label covers, and a placer that puts each label where it neither covers another nor
 * leaves the picture. Every label is written with its x, y, font-size and text-anchor spelled
 * out, so that a test can read the boxes back from the file (tests/unit/test_diag.c does). */
#ifndef MOESERVE_SVG_H
#define MOESERVE_SVG_H

#include <stdio.h>

typedef struct {
    double x0, y0, x1, y1;
} SvgBox;

typedef enum { SVG_START, SVG_MIDDLE, SVG_END } SvgAnchor;

/* The width of text at font size px in a sans-serif face, erring wide: each character by its
 * class (narrow like "il.", wide like "mW", capitals, the rest), in ems. XML entities count as
 * the one character they stand for. */
double svg_text_width(const char *text, double px);
/* The box of text drawn with its baseline at y, anchored at x: from the ascent (0.8 em above the
 * baseline) to the descent (0.25 em below). */
SvgBox svg_text_box(const char *text, double x, double y, double px, SvgAnchor anchor);
int svg_overlap(const SvgBox *a, const SvgBox *b);
/* s with &, <, >, " as entities */
void svg_escape(FILE *f, const char *s);
/* <text x y font-size text-anchor [extra]>text</text> (extra: more attributes, or NULL) */
void svg_text(FILE *f, double x, double y, double px, SvgAnchor anchor, const char *extra, const char *text);
/* The opening <svg> with its width, height and viewBox, a white ground. */
void svg_begin(FILE *f, double w, double h);

/* Labels placed so far in a picture of w x h: a label goes at the first candidate spot whose box
 * is inside the picture and clear of every box placed before (placed is kept too: axes and
 * plotted marks a label must not hide). */
#define SVG_MAX_BOXES 512
typedef struct {
    double w, h;
    int n;
    SvgBox box[SVG_MAX_BOXES];
} SvgPlacer;
void svg_placer_init(SvgPlacer *p, double w, double h);
/* a box that labels must keep clear of (no-op once full) */
void svg_placer_block(SvgPlacer *p, SvgBox b);
/* Is this label's box free (inside and clear)? */
int svg_placer_fits(const SvgPlacer *p, const SvgBox *b);
/* The first of n candidate spots (x[i], y[i] with anchor[i]) where text fits; it is then taken.
 * The index, or -1 when none fits (the caller leaves the label out, or says it elsewhere). */
int svg_place(SvgPlacer *p, const char *text, double px, const double *x, const double *y, const SvgAnchor *anchor,
              int n);

/* A step for about five ticks over range: 1, 2 or 5 times a power of ten. */
double svg_nice_step(double range);

#endif
