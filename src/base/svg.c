/* svg: labels that fit (svg.h). */
#include "svg.h"

#include <math.h>
#include <string.h>

/* Ems per character, from the wider of the usual sans-serif faces (DejaVu Sans, which Linux
 * viewers fall back to, is wider than Helvetica): a label estimated too narrow would overlap
 * its neighbour on screen, one estimated too wide only leaves a gap. */
static double char_em(unsigned char c)
{
    if (c >= 0x80) return 0.75; /* the first byte of a UTF-8 character; the others count 0 */
    if (strchr("iljtfr.,:;'!|()[] -", c)) return 0.4;
    if (strchr("mwMW%@", c)) return 0.95;
    if (c >= 'A' && c <= 'Z') return 0.75;
    if (c >= '0' && c <= '9') return 0.65;
    return 0.62;
}

double svg_text_width(const char *s, double px)
{
    double em = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p & 0xC0) == 0x80) continue;
        if (*p == '&') { /* an entity: one character */
            const char *semi = strchr((const char *)p, ';');
            if (semi && semi - (const char *)p <= 8) {
                em += 0.75;
                p = (const unsigned char *)semi;
                continue;
            }
        }
        em += char_em(*p);
    }
    return em * px;
}

SvgBox svg_text_box(const char *text, double x, double y, double px, SvgAnchor anchor)
{
    double w = svg_text_width(text, px);
    double x0 = anchor == SVG_START ? x : anchor == SVG_MIDDLE ? x - w / 2 : x - w;
    return (SvgBox){x0, y - 0.8 * px, x0 + w, y + 0.25 * px};
}

int svg_overlap(const SvgBox *a, const SvgBox *b)
{
    return a->x0 < b->x1 && b->x0 < a->x1 && a->y0 < b->y1 && b->y0 < a->y1;
}

void svg_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static const char *const anchor_names[] = {"start", "middle", "end"};

void svg_text(FILE *f, double x, double y, double px, SvgAnchor anchor, const char *extra, const char *text)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\" text-anchor=\"%s\"%s%s>", x, y, px, anchor_names[anchor],
            extra ? " " : "", extra ? extra : "");
    svg_escape(f, text);
    fputs("</text>\n", f);
}

void svg_begin(FILE *f, double w, double h)
{
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            w, h, w, h);
}

void svg_placer_init(SvgPlacer *p, double w, double h)
{
    p->w = w;
    p->h = h;
    p->n = 0;
}

void svg_placer_block(SvgPlacer *p, SvgBox b)
{
    if (p->n < SVG_MAX_BOXES) p->box[p->n++] = b;
}

int svg_placer_fits(const SvgPlacer *p, const SvgBox *b)
{
    if (b->x0 < 0 || b->y0 < 0 || b->x1 > p->w || b->y1 > p->h) return 0;
    for (int i = 0; i < p->n; i++)
        if (svg_overlap(b, &p->box[i])) return 0;
    return 1;
}

int svg_place(SvgPlacer *p, const char *text, double px, const double *x, const double *y, const SvgAnchor *anchor,
              int n)
{
    if (p->n >= SVG_MAX_BOXES) return -1; /* nothing more can be kept clear of it */
    for (int i = 0; i < n; i++) {
        SvgBox b = svg_text_box(text, x[i], y[i], px, anchor[i]);
        if (svg_placer_fits(p, &b)) {
            svg_placer_block(p, b);
            return i;
        }
    }
    return -1;
}

double svg_nice_step(double range)
{
    if (!(range > 0)) return 1;
    double raw = range / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}
