/* cost: an op's time and a collective's from a device and a link profile (cost.h). */
#include "cost.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../base/util.h"

const int cost_bucket_rows[COST_BUCKETS] = {1, 4, 16, 64, 256, 1024, 4096};

static const char *const cat_names[CC_COUNT] = {"dense_gemm", "moe_gemm", "attention", "indexer", "norms_elementwise",
                                                "router_dispatch", "sampling"};

const char *cost_cat_name(CostCat c) { return (unsigned)c < CC_COUNT ? cat_names[c] : "?"; }

CostCat cost_cat_of(OpId op)
{
    switch (op_category(op)) {
    case CAT_GEMM: return CC_DENSE_GEMM;
    case CAT_MOE: return CC_MOE_GEMM;
    case CAT_ATTENTION: return CC_ATTENTION;
    case CAT_INDEXER: return CC_INDEXER;
    case CAT_ELEMENTWISE: return CC_NORM;
    case CAT_ROUTER: return CC_ROUTER;
    case CAT_SAMPLE: return CC_SAMPLE;
    default: return CC_COUNT;
    }
}

/* v at rows, linear in log2(rows) between the buckets, clamped at the ends */
static double interp(const double *v, int rows)
{
    double x = log2(rows < 1 ? 1 : rows);
    if (x <= 0) return v[0];
    for (int i = 1; i < COST_BUCKETS; i++) {
        double x1 = log2(cost_bucket_rows[i]);
        if (x <= x1) {
            double x0 = log2(cost_bucket_rows[i - 1]), a = (x - x0) / (x1 - x0);
            return v[i - 1] + a * (v[i] - v[i - 1]);
        }
    }
    return v[COST_BUCKETS - 1];
}

double cost_op_seconds(const CostDevice *dev, OpId op, double flops, double bytes, int rows, QFormat wfmt)
{
    (void)wfmt; /* the engine's GEMMs run on the BF16 tensor cores whatever the weights' format (W4A16,
                   W8A16): the format is in the bytes; kept in the contract for a kernel that differs */
    CostCat c = cost_cat_of(op);
    if (c == CC_COUNT) return 0;
    const CostEff *e = &dev->eff[c];
    double me = interp(e->memory, rows), ce = interp(e->compute, rows), fixed = interp(e->fixed_us, rows) * 1e-6;
    double tm = me > 0 && dev->read_gbps > 0 ? bytes / (dev->read_gbps * 1e9 * me) : 0;
    double tc = ce > 0 && dev->bf16_tflops > 0 ? flops / (dev->bf16_tflops * 1e12 * ce) : 0;
    return fixed + (tm > tc ? tm : tc);
}

static double log2_ceil(int n)
{
    int k = 0;
    while ((1 << k) < n) k++;
    return k;
}

double cost_comm_seconds(const CostLink *link, OpId op, double bytes, int ranks)
{
    if (ranks <= 1 || !link) return 0;
    double bw = (op == OP_PP_SEND || op == OP_PP_RECV ? link->p2p_gbps : link->bus_gbps) * 1e9;
    /* every rank's traffic through one shared path (host memory): a rank gets its share of it */
    if (link->shared_gbps > 0) {
        double share = link->shared_gbps * 1e9 / (op == OP_PP_SEND || op == OP_PP_RECV ? 1 : ranks);
        if (share < bw) bw = share;
    }
    double lat = link->latency_us * 1e-6, hops;
    switch (op) {
    case OP_ALL_REDUCE: hops = 2 * log2_ceil(ranks); break;  /* reduce then broadcast (a tree at small sizes) */
    case OP_ALL_GATHER: hops = log2_ceil(ranks); break;
    case OP_ALL_TO_ALL: hops = 2; break;                      /* every pair at once: a send and its wait */
    case OP_PP_SEND: case OP_PP_RECV: hops = 1; break;
    default: return 0;
    }
    return hops * lat + (bw > 0 ? bytes / bw : 0);
}

double cost_pipeline_seconds(const double *stage_s, int pp, int mb, int *slowest, double *bubble)
{
    double sum = 0, worst = -1;
    int k = 0;
    for (int i = 0; i < pp; i++) {
        sum += stage_s[i];
        if (stage_s[i] > worst) worst = stage_s[i], k = i;
    }
    if (mb < 1) mb = 1;
    double step = sum + (mb - 1) * worst;
    if (slowest) *slowest = k;
    if (bubble) *bubble = step - mb * worst;
    return step;
}

/* ---- profiles ---- */

extern const char *const cost_builtin_devices[][2];
extern const char *const cost_builtin_links[][2];

static void names(const char *const table[][2], char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; table[i][0] && o < n; i++) o += snprintf(buf + o, n - o, "%s%s", i ? ", " : "", table[i][0]);
}

void cost_device_names(char *buf, size_t n) { names(cost_builtin_devices, buf, n); }
void cost_link_names(char *buf, size_t n) { names(cost_builtin_links, buf, n); }

/* a required number: 0, or -1 with err naming the field */
static int need_num(const json_t *o, const char *key, double *v, const char *what, const char *path, char *err,
                    size_t errlen)
{
    const json_t *j = json_object_get(o, key);
    if (!json_is_number(j)) {
        errbuf_set(err, errlen, "%s: field '%s%s%s' %s", what, path, path[0] ? "." : "", key,
                   j ? "is not a number" : "is missing");
        return -1;
    }
    *v = json_number_value(j);
    if (!isfinite(*v) || *v < 0) {
        errbuf_set(err, errlen, "%s: field '%s%s%s' must be a finite number >= 0", what, path, path[0] ? "." : "", key);
        return -1;
    }
    return 0;
}

static double opt_num(const json_t *o, const char *key, double def)
{
    const json_t *j = json_object_get(o, key);
    return json_is_number(j) && isfinite(json_number_value(j)) ? json_number_value(j) : def;
}

static void opt_str(const json_t *o, const char *key, char *dst, size_t n)
{
    const char *s = json_string_value(json_object_get(o, key));
    snprintf(dst, n, "%s", s ? s : "");
}

static int need_name(const json_t *o, char *dst, size_t n, const char *what, char *err, size_t errlen)
{
    const char *s = json_string_value(json_object_get(o, "name"));
    if (!s || !*s) {
        errbuf_set(err, errlen, "%s: field 'name' is missing (a string)", what);
        return -1;
    }
    snprintf(dst, n, "%s", s);
    return 0;
}

static int need_array(const json_t *o, const char *key, double *v, const char *what, const char *path, char *err,
                      size_t errlen)
{
    const json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || json_array_size(a) != COST_BUCKETS) {
        errbuf_set(err, errlen, "%s: field '%s.%s' %s (an array of %d numbers, one for each of 1, 4, 16, 64, 256, "
                   "1024, 4096 rows)", what, path, key, a ? "is malformed" : "is missing", COST_BUCKETS);
        return -1;
    }
    for (int i = 0; i < COST_BUCKETS; i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_number(x) || !isfinite(json_number_value(x)) || json_number_value(x) < 0) {
            errbuf_set(err, errlen, "%s: field '%s.%s'[%d] must be a finite number >= 0", what, path, key, i);
            return -1;
        }
        v[i] = json_number_value(x);
    }
    return 0;
}

int cost_device_from_json(CostDevice *d, const json_t *o, const char *what, char *err, size_t errlen)
{
    *d = (CostDevice){0};
    if (!json_is_object(o)) return errbuf_set(err, errlen, "%s: not a JSON object", what), -1;
    if (need_name(o, d->name, sizeof d->name, what, err, errlen)) return -1;
    double gb;
    if (need_num(o, "memory_gb", &gb, what, "", err, errlen) || need_num(o, "read_gbps", &d->read_gbps, what, "", err, errlen) ||
        need_num(o, "bf16_tflops", &d->bf16_tflops, what, "", err, errlen))
        return -1;
    d->memory_bytes = gb * 1e9;
    opt_str(o, "description", d->description, sizeof d->description);
    opt_str(o, "source", d->source, sizeof d->source);
    opt_str(o, "default_link", d->default_link, sizeof d->default_link);
    d->gpu = json_is_true(json_object_get(o, "gpu"));
    d->estimated = json_is_true(json_object_get(o, "estimated"));
    d->fp8_tflops = opt_num(o, "fp8_tflops", 0);
    d->fp4_tflops = opt_num(o, "fp4_tflops", 0);
    d->smem_kb = opt_num(o, "smem_kb", 0);
    d->side_rows = (int)opt_num(o, "side_rows", 0);
    d->step_us = opt_num(o, "step_us", 0);
    d->host_step_us = opt_num(o, "host_step_us", 0);
    d->host_token_us = opt_num(o, "host_token_us", 0);
    d->reserve_bytes = opt_num(o, "reserve_gb", 0) * 1e9;
    const json_t *eff = json_object_get(o, "efficiency");
    if (!json_is_object(eff))
        return errbuf_set(err, errlen, "%s: field 'efficiency' is missing (an object: %s, ... each with memory, compute "
                          "and fixed_us arrays)", what, cat_names[0]), -1;
    for (int c = 0; c < CC_COUNT; c++) {
        const json_t *e = json_object_get(eff, cat_names[c]);
        char path[64];
        snprintf(path, sizeof path, "efficiency.%s", cat_names[c]);
        if (!json_is_object(e)) return errbuf_set(err, errlen, "%s: field '%s' is missing", what, path), -1;
        if (need_array(e, "memory", d->eff[c].memory, what, path, err, errlen) ||
            need_array(e, "compute", d->eff[c].compute, what, path, err, errlen) ||
            need_array(e, "fixed_us", d->eff[c].fixed_us, what, path, err, errlen))
            return -1;
    }
    return 0;
}

int cost_link_from_json(CostLink *l, const json_t *o, const char *what, char *err, size_t errlen)
{
    *l = (CostLink){0};
    if (!json_is_object(o)) return errbuf_set(err, errlen, "%s: not a JSON object", what), -1;
    if (need_name(o, l->name, sizeof l->name, what, err, errlen)) return -1;
    if (need_num(o, "bus_gbps", &l->bus_gbps, what, "", err, errlen) || need_num(o, "p2p_gbps", &l->p2p_gbps, what, "", err, errlen) ||
        need_num(o, "latency_us", &l->latency_us, what, "", err, errlen))
        return -1;
    if (l->bus_gbps <= 0 || l->p2p_gbps <= 0) return errbuf_set(err, errlen, "%s: bus_gbps and p2p_gbps must be above 0", what), -1;
    l->shared_gbps = opt_num(o, "shared_gbps", 0);
    opt_str(o, "description", l->description, sizeof l->description);
    opt_str(o, "source", l->source, sizeof l->source);
    return 0;
}

/* a name of the table, or a file; *o the parsed JSON */
static json_t *profile_json(const char *const table[][2], const char *kind, const char *arg, char *what, size_t wn,
                            char *err, size_t errlen)
{
    for (int i = 0; table[i][0]; i++)
        if (!strcmp(table[i][0], arg)) {
            snprintf(what, wn, "built-in %s profile '%s'", kind, arg);
            json_error_t je;
            json_t *o = json_loads(table[i][1], 0, &je);
            if (!o) errbuf_set(err, errlen, "%s: line %d: %s", what, je.line, je.text);
            return o;
        }
    if (!strchr(arg, '/') && !strstr(arg, ".json")) {
        char known[512];
        names(table, known, sizeof known);
        errbuf_set(err, errlen, "unknown %s '%s': known %ss are %s (or give a JSON file)", kind, arg, kind, known);
        return NULL;
    }
    snprintf(what, wn, "%s", arg);
    char why[400];
    json_t *o = file_read_json(arg, 0, why, sizeof why);
    if (!o) errbuf_set(err, errlen, "%s: %s", arg, why);
    return o;
}

int cost_device_load(CostDevice *d, const char *arg, char *err, size_t errlen)
{
    char what[600];
    json_t *o = profile_json(cost_builtin_devices, "GPU", arg, what, sizeof what, err, errlen);
    if (!o) return -1;
    int rc = cost_device_from_json(d, o, what, err, errlen);
    json_decref(o);
    return rc;
}

int cost_link_load(CostLink *l, const char *arg, char *err, size_t errlen)
{
    char what[600];
    json_t *o = profile_json(cost_builtin_links, "link", arg, what, sizeof what, err, errlen);
    if (!o) return -1;
    /* `calibrate --json` of several ranks: the device profile with its link inside */
    const json_t *in = json_object_get(o, "link_profile");
    int rc = cost_link_from_json(l, in ? in : o, what, err, errlen);
    json_decref(o);
    return rc;
}

static json_t *arr(const double *v)
{
    json_t *a = json_array();
    for (int i = 0; i < COST_BUCKETS; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *cost_device_json(const CostDevice *d)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:f, s:f}", "name", d->name,
                          "description", d->description, "source", d->source, "gpu", d->gpu, "estimated", d->estimated,
                          "memory_gb", d->memory_bytes / 1e9, "read_gbps", d->read_gbps, "bf16_tflops", d->bf16_tflops,
                          "fp8_tflops", d->fp8_tflops, "fp4_tflops", d->fp4_tflops, "smem_kb", d->smem_kb, "side_rows",
                          d->side_rows, "host_step_us", d->host_step_us, "host_token_us", d->host_token_us, "reserve_gb",
                          d->reserve_bytes / 1e9);
    json_object_set_new(o, "default_link", json_string(d->default_link));
    json_object_set_new(o, "step_us", json_real(d->step_us));
    json_t *eff = json_object();
    for (int c = 0; c < CC_COUNT; c++)
        json_object_set_new(eff, cat_names[c], json_pack("{s:o, s:o, s:o}", "memory", arr(d->eff[c].memory), "compute",
                                                         arr(d->eff[c].compute), "fixed_us", arr(d->eff[c].fixed_us)));
    json_object_set_new(o, "efficiency", eff);
    return o;
}

json_t *cost_link_json(const CostLink *l)
{
    return json_pack("{s:s, s:s, s:s, s:f, s:f, s:f, s:f}", "name", l->name, "description", l->description, "source",
                     l->source, "bus_gbps", l->bus_gbps, "p2p_gbps", l->p2p_gbps, "latency_us", l->latency_us,
                     "shared_gbps", l->shared_gbps);
}

const char *cost_device_for(const char *device_name, int gpu)
{
    if (!gpu) return "cpu";
    static const struct { const char *part, *profile; } names[] = {
        {"H100", "h100"}, {"H200", "h200"}, {"B200", "b200"}, {"RTX PRO 6000", "rtx-pro-6000"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (device_name && strstr(device_name, names[i].part)) return names[i].profile;
    return NULL;
}
