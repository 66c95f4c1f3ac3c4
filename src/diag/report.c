/* report: diagnosis text, the layout sweep, its markdown and SVG charts (report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static int write_breakdown_svg(const SweepRun *r, int n, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int W = 760, H = 80 + 40 * n + 30 * ((SC_COUNT + 2) / 3), left = 110, barw = 560;
    double maxms = 0;
    for (int i = 0; i < n; i++)
        if (r[i].diag && jnum(r[i].diag, "step_ms") > maxms) maxms = jnum(r[i].diag, "step_ms");
    if (maxms <= 0) maxms = 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Step time by category (ms per step)</text>\n", left);
    for (int i = 0; i < n; i++) {
        int y = 40 + 40 * i;
        fprintf(f, "<text x=\"5\" y=\"%d\">%s</text>\n", y + 18, r[i].name);
        if (!r[i].diag) continue;
        double x = left;
        json_t *br = json_object_get(r[i].diag, "breakdown");
        for (int k = 0; k < SC_COUNT; k++) {
            double ms = jnum(json_object_get(br, step_cat_name(k)), "ms"), w = ms / maxms * barw;
            if (w <= 0) continue;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"26\" fill=\"%s\"><title>%s %.3f ms</title></rect>\n", x, y,
                    w, colors[k], step_cat_title(k), ms);
            x += w;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%d\">%.2f ms, %.0f tok/s</text>\n", x + 4, y + 18, jnum(r[i].diag, "step_ms"),
                jnum(r[i].diag, "tokens_per_s"));
    }
    for (int k = 0; k < SC_COUNT; k++) {
        int x = left + (k % 3) * 200, y = 60 + 40 * n + 24 * (k / 3);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", x, y,
                colors[k], x + 16, y + 11, step_cat_title(k));
    }
    fprintf(f, "</svg>\n");
    return fclose(f);
}

/* log-log roofline: x FLOP per byte, y achieved TFLOP/s; the roofs from the first run's ceilings */
static int write_roofline_svg(const SweepRun *r, int n, const char *path)
{
    json_t *cl = NULL;
    for (int i = 0; i < n && !cl; i++)
        if (r[i].diag) cl = json_object_get(r[i].diag, "ceilings");
    if (!cl) return -1;
    double peak = jnum(cl, "bf16_tflops"), bw = jnum(cl, "copy_gbps") / 1e3; /* TB/s */
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int W = 640, H = 420, x0 = 60, y0 = 370, pw = 540, ph = 330;
    double lx0 = -2, lx1 = 4, ly1 = ceil(log10(peak)) + 0.5, ly0 = ly1 - 5;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Roofline: each op category of each layout (TFLOP/s vs FLOP/byte)</text>\n", x0);
#define PX(l) (x0 + ((l) - lx0) / (lx1 - lx0) * pw)
#define PY(l) (y0 - ((l) - ly0) / (ly1 - ly0) * ph)
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0 - ph, pw, ph);
    for (int e = (int)lx0; e <= (int)lx1; e++)
        fprintf(f, "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">1e%d</text>\n", PX(e), y0 + 16, e);
    for (int e = (int)ceil(ly0); e <= (int)ly1; e++)
        fprintf(f, "<text x=\"%d\" y=\"%.0f\" text-anchor=\"end\">1e%d</text>\n", x0 - 4, PY(e) + 4, e);
    /* the roof: min(peak, bw * ai) */
    fprintf(f, "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"2\" points=\"");
    for (double l = lx0; l <= lx1 + 1e-9; l += 0.05) {
        double y = log10(fmin(peak, bw * pow(10, l)));
        if (y < ly0) y = ly0;
        fprintf(f, "%.1f,%.1f ", PX(l), PY(y));
    }
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) {
        if (!r[i].diag) continue;
        json_t *br = json_object_get(r[i].diag, "breakdown");
        for (int k = 0; k <= SC_SAMPLE; k++) {
            json_t *c = json_object_get(br, step_cat_name(k));
            double tf = jnum(c, "tflops_pct") / 100 * peak, gb = jnum(c, "gbps_pct") / 100 * bw;
            if (tf <= 0 || gb <= 0) continue;
            double ai = tf / gb; /* TFLOP/s over TB/s = FLOP per byte */
            double lx = fmin(fmax(log10(ai), lx0), lx1), ly = fmin(fmax(log10(tf), ly0), ly1);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"><title>%s %s: %.3g TFLOP/s at %.3g FLOP/B</title></circle>\n",
                    PX(lx), PY(ly), colors[k], r[i].name, step_cat_title(k), tf, ai);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\">%s %s</text>\n", PX(lx) + 6, PY(ly) - 4, r[i].name,
                    step_cat_name(k));
        }
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    return fclose(f);
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
