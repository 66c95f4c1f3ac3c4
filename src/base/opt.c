/* opt: the table-driven command-line parser (opt.h). */
#include "opt.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define OPT_MAX_GIVEN 256

static const void *given[OPT_MAX_GIVEN]; /* dst of every option the command line gave */
static int n_given;

/* Stop with one line, "error: CMD: ...", and exit status 2 (a usage error): the line names the
 * option and the rule it broke, never the whole option list. */
static void opt_fail(const OptCommand *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void opt_fail(const OptCommand *c, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "error: %s: ", c->cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* The i-th spelling of names ("--a|--b|-c") into buf; 0 when there is none. */
static int spelling(const char *names, int i, char *buf, size_t n)
{
    const char *p = names;
    for (int k = 0; k < i; k++) {
        p = strchr(p, '|');
        if (!p) return 0;
        p++;
    }
    size_t len = strcspn(p, "|");
    if (!len || len >= n) return 0;
    memcpy(buf, p, len);
    buf[len] = 0;
    return 1;
}

static int has_spelling(const char *names, const char *s, size_t len)
{
    char b[96];
    for (int i = 0; spelling(names, i, b, sizeof b); i++)
        if (strlen(b) == len && !strncmp(b, s, len)) return 1;
    return 0;
}

/* The spec named s[0..len) (with its dashes), or NULL; *neg when it is a flag's --no- form. */
static const OptSpec *find(const OptCommand *c, const char *s, size_t len, int *neg)
{
    *neg = 0;
    for (int g = 0; g < c->n_groups; g++)
        for (int i = 0; i < c->groups[g].n; i++)
            if (has_spelling(c->groups[g].specs[i].names, s, len)) return &c->groups[g].specs[i];
    if (len > 5 && !strncmp(s, "--no-", 5)) {
        char b[96];
        int n = snprintf(b, sizeof b, "--%.*s", (int)(len - 5), s + 5);
        for (int g = 0; n > 0 && (size_t)n < sizeof b && g < c->n_groups; g++)
            for (int i = 0; i < c->groups[g].n; i++) {
                const OptSpec *o = &c->groups[g].specs[i];
                if (o->type == OPT_FLAG && o->negatable && has_spelling(o->names, b, (size_t)n)) {
                    *neg = 1;
                    return o;
                }
            }
    }
    return NULL;
}

/* Edit distance of a and b (dashes and case ignored by the caller), capped at 64. */
static int distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 64;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            int best = sub < del ? sub : del;
            d[i][j] = best < ins ? best : ins;
        }
    return d[n][m];
}

static const char *undash(const char *s)
{
    while (*s == '-') s++;
    return s;
}

int opt_suggest(const OptCommand *c, const char *wrong, const char *out[3])
{
    static char keep[3][96];
    const char *w = undash(wrong);
    char wn[96];
    snprintf(wn, sizeof wn, "%.*s", (int)strcspn(w, "="), w);
    int best[3] = {1 << 20, 1 << 20, 1 << 20}, n = 0;
    char cand[3][96];
    for (int g = 0; g < c->n_groups; g++)
        for (int i = 0; i < c->groups[g].n; i++) {
            const OptSpec *o = &c->groups[g].specs[i];
            if (!o->help) continue; /* hooks are not suggested */
            char b[96];
            for (int k = 0; spelling(o->names, k, b, sizeof b); k++) {
                const char *u = undash(b);
                int d = distance(wn, u);
                /* a word of the wrong name inside a right one (--max-seqs, --max-num-seqs) */
                if (strlen(wn) >= 4 && strlen(u) >= 4 && (strstr(u, wn) || strstr(wn, u))) d = d < 2 ? d : 2;
                int limit = (int)strlen(wn) / 3 > 2 ? (int)strlen(wn) / 3 : 2;
                if (d > limit) continue;
                int dup = 0;
                for (int j = 0; j < n; j++) dup |= !strcmp(cand[j], c->groups[g].specs[i].names);
                if (dup) continue;
                /* keep the three closest, by spec (first spelling shown) */
                int pos = n < 3 ? n : 3;
                while (pos > 0 && d < best[pos - 1]) pos--;
                if (pos >= 3) continue;
                for (int j = (n < 3 ? n : 2); j > pos; j--) {
                    best[j] = best[j - 1];
                    memcpy(cand[j], cand[j - 1], sizeof cand[j]);
                    memcpy(keep[j], keep[j - 1], sizeof keep[j]);
                }
                best[pos] = d;
                snprintf(cand[pos], sizeof cand[pos], "%s", c->groups[g].specs[i].names);
                snprintf(keep[pos], sizeof keep[pos], "%s", b);
                if (n < 3) n++;
                break;
            }
        }
    for (int j = 0; j < n; j++) out[j] = keep[j];
    return n;
}

static int looks_numeric(const char *s)
{
    char *end;
    errno = 0;
    (void)strtod(s, &end);
    return end != s && *end == 0;
}

static void mark_given(const void *dst)
{
    if (dst && n_given < OPT_MAX_GIVEN) given[n_given++] = dst;
}

int opt_given(const OptCommand *c, const void *dst)
{
    (void)c;
    for (int i = 0; i < n_given; i++)
        if (given[i] == dst) return 1;
    return 0;
}

/* o's first spelling, for messages */
static const char *name_of(const OptSpec *o, char *buf, size_t n)
{
    if (!spelling(o->names, 0, buf, n)) snprintf(buf, n, "%s", o->names);
    return buf;
}

static void take(const OptCommand *c, const OptSpec *o, const char *v, const char *as)
{
    char err[256] = "", nm[96];
    name_of(o, nm, sizeof nm);
    mark_given(o->dst);
    switch (o->type) {
    case OPT_INT: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end) opt_fail(c, "option %s: '%s' is not an integer", as, v);
        if ((o->lo || o->hi) && (x < o->lo || x > o->hi))
            opt_fail(c, "option %s: %ld is out of range [%.0f, %.0f]", as, x, o->lo, o->hi);
        *(int *)o->dst = (int)x;
        break;
    }
    case OPT_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || x != x) opt_fail(c, "option %s: '%s' is not a number", as, v);
        if ((o->lo || o->hi) && (x < o->lo || x > o->hi)) opt_fail(c, "option %s: %g is out of range [%g, %g]", as, x, o->lo, o->hi);
        *(double *)o->dst = x;
        break;
    }
    case OPT_FLOAT: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || x != x) opt_fail(c, "option %s: '%s' is not a number", as, v);
        if ((o->lo || o->hi) && (x < o->lo || x > o->hi))
            opt_fail(c, "option %s: %g is out of range [%g, %g]", as, x, o->lo, o->hi);
        *(float *)o->dst = (float)x;
        break;
    }
    case OPT_STR: *(const char **)o->dst = v; break;
    case OPT_STRS: {
        OptStrs *l = o->dst;
        if (l->n == OPT_STRS_MAX) opt_fail(c, "option %s: more than %d values", as, OPT_STRS_MAX);
        l->v[l->n++] = v;
        break;
    }
    case OPT_FN:
        if (o->fn(v, o->dst, err, sizeof err) < 0) opt_fail(c, "option %s: %s", as, err[0] ? err : "bad value");
        break;
    case OPT_NOTE:
        log_info("%s: option %s%s%s: %s", c->cmd, as, v ? " " : "", v ? v : "", o->help ? o->help : "ignored");
        break;
    case OPT_FLAG: break;
    }
}

void opt_parse(const OptCommand *c, int argc, char **argv, const char **pos, int *n_pos)
{
    int np = 0, only_pos = 0;
    n_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1] || (looks_numeric(a) && !find(c, a, strlen(a), &(int){0}))) {
            if (np >= c->max_pos)
                opt_fail(c, c->max_pos ? "unexpected argument '%s' (it takes %d: %s)" : "unexpected argument '%s'", a,
                         c->max_pos, c->pos_name ? c->pos_name : "");
            pos[np++] = a;
            continue;
        }
        if (!strcmp(a, "--")) { only_pos = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            opt_help(c, stdout);
            exit(0);
        }
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        int neg;
        const OptSpec *o = find(c, a, len, &neg);
        char as[96];
        snprintf(as, sizeof as, "%.*s", (int)(len < 95 ? len : 95), a);
        if (!o) {
            const char *s[3];
            int k = opt_suggest(c, as, s);
            if (k == 1) opt_fail(c, "unknown option '%s'; did you mean %s?", as, s[0]);
            if (k == 2) opt_fail(c, "unknown option '%s'; did you mean %s or %s?", as, s[0], s[1]);
            if (k == 3) opt_fail(c, "unknown option '%s'; did you mean %s, %s or %s?", as, s[0], s[1], s[2]);
            opt_fail(c, "unknown option '%s' (moeserve %s --help lists the options)", as, c->cmd);
        }
        if (o->type == OPT_FLAG) {
            int on = o->inverse ? 0 : 1, v = neg ? !on : on;
            if (eq) {
                const char *x = eq + 1;
                if (!strcmp(x, "true") || !strcmp(x, "1") || !strcmp(x, "yes")) v = neg ? !on : on;
                else if (!strcmp(x, "false") || !strcmp(x, "0") || !strcmp(x, "no")) v = neg ? on : !on;
                else opt_fail(c, "option %s: '%s' is not true or false", as, x);
            }
            mark_given(o->dst);
            if (o->dst) *(int *)o->dst = v;
            continue;
        }
        if (o->type == OPT_NOTE && !o->metavar) {
            take(c, o, eq ? eq + 1 : NULL, as);
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] && !looks_numeric(argv[i + 1])))
                opt_fail(c, "option %s needs a value (%s)", as, o->metavar ? o->metavar : "VALUE");
            v = argv[++i];
        }
        take(c, o, v, as);
        /* more values of a list, up to the next option */
        while (o->type == OPT_STRS && !eq && i + 1 < argc && argv[i + 1][0] != '-') take(c, o, argv[++i], as);
    }
    if (n_pos) *n_pos = np;
}

void opt_help(const OptCommand *c, FILE *f)
{
    fprintf(f, "usage: moeserve %s %s\n", c->cmd, c->synopsis);
    if (c->about) fprintf(f, "\n%s\n", c->about);
    for (int g = 0; g < c->n_groups; g++) {
        const OptGroup *G = &c->groups[g];
        int shown = 0;
        for (int i = 0; i < G->n; i++) shown += G->specs[i].help != NULL && G->specs[i].type != OPT_NOTE;
        if (!shown) continue;
        fprintf(f, "\n%s options:\n", G->title);
        for (int i = 0; i < G->n; i++) {
            const OptSpec *o = &G->specs[i];
            if (!o->help || o->type == OPT_NOTE) continue;
            char first[96], head[160], more[256] = "";
            name_of(o, first, sizeof first);
            snprintf(head, sizeof head, "%s%s%s%s", first, o->metavar ? " " : "", o->metavar ? o->metavar : "",
                     o->type == OPT_FLAG && o->negatable ? " (--no-" : "");
            if (o->type == OPT_FLAG && o->negatable) {
                size_t l = strlen(head);
                snprintf(head + l, sizeof head - l, "%s)", undash(first));
            }
            char b[96];
            size_t m = 0;
            for (int k = 1; spelling(o->names, k, b, sizeof b) && m < sizeof more - 8; k++)
                m += (size_t)snprintf(more + m, sizeof more - m, "%s%s", m ? ", " : "", b);
            fprintf(f, "  %-30s %s", head, o->help);
            if (more[0]) fprintf(f, " (also %s)", more);
            if (o->def) fprintf(f, " (default: %s)", o->def);
            fputc('\n', f);
        }
    }
    int notes = 0;
    for (int g = 0; g < c->n_groups; g++)
        for (int i = 0; i < c->groups[g].n; i++) notes += c->groups[g].specs[i].type == OPT_NOTE;
    if (notes) {
        fprintf(f, "\naccepted from other engines' launch lines, with no effect here:");
        for (int g = 0; g < c->n_groups; g++)
            for (int i = 0; i < c->groups[g].n; i++)
                if (c->groups[g].specs[i].type == OPT_NOTE) {
                    char b[96];
                    for (int k = 0; spelling(c->groups[g].specs[i].names, k, b, sizeof b); k++) fprintf(f, " %s", b);
                }
        fputc('\n', f);
    }
}

int opt_span(const OptCommand *c, int argc, char **argv, int i, const OptSpec **spec)
{
    const char *a = argv[i];
    *spec = NULL;
    if (a[0] != '-' || !a[1] || !strcmp(a, "--") || (looks_numeric(a) && !find(c, a, strlen(a), &(int){0}))) return 1;
    const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    int neg;
    const OptSpec *o = find(c, a, eq ? (size_t)(eq - a) : strlen(a), &neg);
    *spec = o;
    if (!o || eq || o->type == OPT_FLAG || (o->type == OPT_NOTE && !o->metavar)) return 1;
    int n = i + 1 < argc ? 2 : 1;
    while (o->type == OPT_STRS && i + n < argc && argv[i + n][0] != '-') n++;
    return n;
}

const char *opt_def(const char *fmt, ...)
{
    static char pool[16384];
    static size_t used;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(pool + used, sizeof pool - used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof pool - used) return "?";
    const char *r = pool + used;
    used += (size_t)n + 1;
    return r;
}
