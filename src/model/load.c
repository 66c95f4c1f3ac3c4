/* load: a Hugging Face checkpoint directory -> Model (config, mmapped tensors, QTensor views).
 * Precision is decided per tensor (load_qtensor, model.h) and cross-checked against the quantization
 * config; every shape is checked against config.json. Experts load stored per expert
 * (mlp.experts.E.gate_proj) or fused 3-D (mlp.experts.gate_up_proj [E, 2F, D], down_proj
 * [E, D, F]). MTP layers (index >= num_hidden_layers) are recognised and skipped. A malformed
 * checkpoint stops with one line naming the file and the tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/knobs.h"
#include "../base/progress.h"
#include "../base/util.h"
#include "../dist/dist.h"
#include "../format/config.h"
#include "model.h"

/* ---- helpers ---- */

static const char *tfile(const SafeTensors *st, const StTensor *t) { return safetensors_file_of(st, t); }

static int shape_is(const StTensor *t, int ndim, int64_t d0, int64_t d1)
{
    if (t->ndim != ndim) return 0;
    if (ndim >= 1 && t->shape[0] != d0) return 0;
    if (ndim >= 2 && t->shape[1] != d1) return 0;
    return 1;
}

static void shape_str(const StTensor *t, char *buf, size_t n)
{
    size_t o = snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++) o += snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static float scalar_of(const StTensor *t) { return dtype_load(t->dtype, t->data, 0); }

/* The first E4M3 NaN (S.1111.111: 0x7f or 0xff) among n bytes, or -1. Eight bytes a step: with
 * the sign bits cleared a byte is 0x7f iff adding 1 sets its top bit (no byte carries into the
 * next). The block scales are 1/9 of an NVFP4 checkpoint and are read at upload anyway. */
static int64_t e4m3_first_nan(const uint8_t *p, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8); /* safetensors data need not be aligned */
        if (((w & 0x7f7f7f7f7f7f7f7full) + 0x0101010101010101ull) & 0x8080808080808080ull) break;
    }
    for (; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) return i;
    return -1;
}

/* A per-tensor scale (NVFP4 weight_scale_2, FP8 weight_scale, input_scale): one float, F32 as
 * ModelOpt writes it (BF16 and F16 hold a scale exactly too; any other dtype would be read as
 * a different number), and with check_value finite and not negative; else err. */
static int scale_ok(const SafeTensors *st, const StTensor *t, const char *what, int check_value, char *err,
                    size_t errlen)
{
    if (t->numel != 1 || (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)) {
        char s[128];
        shape_str(t, s, sizeof s);
        errbuf_set(err, errlen, "%s: tensor '%s': %s must hold one F32, BF16 or F16 value, got %s %s",
                   tfile(st, t), t->name, what, dtype_name(t->dtype), s);
        return 0;
    }
    float v = scalar_of(t);
    if (!check_value || (isfinite(v) && v >= 0)) return 1;
    errbuf_set(err, errlen, "%s: tensor '%s': %s must be a finite scale >= 0, got %g", tfile(st, t), t->name, what, v);
    return 0;
}

int load_qtensor(const SafeTensors *st, const char *prefix, QTensor *w, char *err, size_t errlen)
{
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const StTensor *wt = safetensors_find(st, name);
    if (!wt) return 0;
    *w = (QTensor){.gscale = 1.0f, .name = wt->name, .data = wt->data};
    if (wt->ndim != 2) {
        char s[128];
        shape_str(wt, s, sizeof s);
        errbuf_set(err, errlen, "%s: tensor '%s': a linear weight must be 2-D, got shape %s", tfile(st, wt), name, s);
        return -1;
    }
    int64_t N = wt->shape[0], Kst = wt->shape[1];
    char sname[512], s2name[512], siname[512], iname[512];
    snprintf(sname, sizeof sname, "%s.weight_scale", prefix);
    snprintf(s2name, sizeof s2name, "%s.weight_scale_2", prefix);
    snprintf(siname, sizeof siname, "%s.weight_scale_inv", prefix);
    snprintf(iname, sizeof iname, "%s.input_scale", prefix);
    const StTensor *sc = safetensors_find(st, sname), *sc2 = safetensors_find(st, s2name),
                   *sci = safetensors_find(st, siname), *isc = safetensors_find(st, iname);
    w->rows = N;
    /* the activation scale of a quantized linear: unused (weight-only), but it says what the
       checkpoint is, so it must be one too */
    if ((wt->dtype == DT_U8 || wt->dtype == DT_F8_E4M3) && isc && !scale_ok(st, isc, "input_scale", 0, err, errlen))
        return -1;
    switch (wt->dtype) {
    case DT_F32: w->fmt = QF_F32; w->cols = Kst; return 1;
    case DT_BF16: w->fmt = QF_BF16; w->cols = Kst; return 1;
    case DT_F16: w->fmt = QF_F16; w->cols = Kst; return 1;
    case DT_U8: {
        /* ModelOpt NVFP4: U8 codes [N, K/2], E4M3 scales [N, K/16], F32 scalar weight_scale_2 */
        if (!sc || !sc2) {
            errbuf_set(err, errlen, "%s: tensor '%s': U8 weight without %s (NVFP4 needs weight_scale and weight_scale_2)",
                       tfile(st, wt), name, !sc ? sname : s2name);
            return -1;
        }
        int64_t K = Kst * 2;
        if (sc->dtype != DT_F8_E4M3 || !shape_is(sc, 2, N, K / 16) || K % 16) {
            char s[128];
            shape_str(sc, s, sizeof s);
            errbuf_set(err, errlen, "%s: tensor '%s': NVFP4 block scales must be F8_E4M3 [%lld, %lld] for weight [%lld, %lld], got %s %s",
                       tfile(st, sc), sname, (long long)N, (long long)(K / 16), (long long)N, (long long)Kst,
                       dtype_name(sc->dtype), s);
            return -1;
        }
        if (!scale_ok(st, sc2, "weight_scale_2", 1, err, errlen)) return -1;
        int64_t nan = e4m3_first_nan(sc->data, N * (K / 16));
        if (nan >= 0) {
            errbuf_set(err, errlen, "%s: tensor '%s': block scale of row %lld, columns %lld..%lld is an E4M3 NaN (0x%02x): the "
                       "checkpoint is corrupt", tfile(st, sc), sname, (long long)(nan / (K / 16)), (long long)(nan % (K / 16) * 16),
                       (long long)(nan % (K / 16) * 16 + 15), ((const uint8_t *)sc->data)[nan]);
            return -1;
        }
        w->fmt = QF_NVFP4;
        w->cols = K;
        w->scale = sc->data;
        w->gscale = scalar_of(sc2);
        return 1;
    }
    case DT_F8_E4M3:
        w->cols = Kst;
        if (sci) { /* Z.ai / DeepSeek block FP8: weight_scale_inv [ceil(N/128), ceil(K/128)] */
            if (!shape_is(sci, 2, (N + 127) / 128, (Kst + 127) / 128) ||
                (sci->dtype != DT_F32 && sci->dtype != DT_BF16)) {
                char s[128];
                shape_str(sci, s, sizeof s);
                errbuf_set(err, errlen, "%s: tensor '%s': block scales must be F32/BF16 [%lld, %lld], got %s %s",
                           tfile(st, sci), siname, (long long)((N + 127) / 128), (long long)((Kst + 127) / 128),
                           dtype_name(sci->dtype), s);
                return -1;
            }
            w->fmt = QF_FP8_BLOCK;
            w->scale = sci->data;
            w->scale_dtype = sci->dtype;
            return 1;
        }
        if (sc) { /* ModelOpt FP8 per tensor: W = q * weight_scale */
            if (!scale_ok(st, sc, "FP8 weight_scale", 1, err, errlen)) return -1;
            w->fmt = QF_FP8;
            w->gscale = scalar_of(sc);
            return 1;
        }
        errbuf_set(err, errlen, "%s: tensor '%s': F8_E4M3 weight without a weight_scale or a weight_scale_inv",
                   tfile(st, wt), name);
        return -1;
    default:
        errbuf_set(err, errlen, "%s: tensor '%s': dtype %s is not a weight format moeserve reads",
                   tfile(st, wt), name, dtype_name(wt->dtype));
        return -1;
    }
}

/* ---- loading with shape checks ---- */

typedef struct {
    Model *m;
    const char *dir;
    unsigned char *used;        /* [n_tensors] consumed by the model */
    QuantConfig qc;
    int warned_quant;
    QFormat dummy;              /* dummy weights: the format of quantised linears; QF_COUNT: real */
} Loader;

static void mark_used(Loader *ld, const char *name)
{
    const StTensor *t = safetensors_find(&ld->m->st, name);
    if (t) ld->used[t - ld->m->st.tensors] = 1;
}

static void mark_prefix_used(Loader *ld, const char *prefix)
{
    static const char *sfx[] = {".weight", ".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale"};
    char name[600];
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, sfx[i]);
        mark_used(ld, name);
    }
}

static void account(Model *m, const QTensor *w)
{
    if (!w->rows) return;
    m->bytes_by_format[w->fmt] += qtensor_bytes(w);
    m->params_by_format[w->fmt] += w->rows * w->cols;
}

/* the bytes and parameters of what this rank holds, per storage format */
static void account_model(Model *m)
{
    const ModelConfig *c = &m->cfg;
    account(m, &m->embed);
    /* tied: lm_head is a view of the embedding (a row slice of it under TP), no bytes of its own;
     * comparing data pointers would miss the slice, and dummy weights have none yet */
    if (!c->tie_embeddings) account(m, &m->lm_head);
    for (int l = c->layer_begin; l < c->layer_end; l++) {
        const LayerWeights *w = &m->layers[l];
        const QTensor *t[LAYER_LINEARS];
        layer_linears(w, t);
        for (int i = 0; i < LAYER_LINEARS; i++) account(m, t[i]);
        if (c->layer_moe[l] && w->exp_gate)
            for (int e = 0; e < c->n_local_experts; e++) {
                account(m, &w->exp_gate[e]);
                account(m, &w->exp_up[e]);
                account(m, &w->exp_down[e]);
            }
    }
}

/* Dummy weights (model_load_dummy): the format a release would store this linear in. The
 * directory's quantization config decides when it has one; else the dummy format, except for
 * what real NVFP4 releases keep in BF16 (ModelOpt's default exclusions, ckpt.h) and in-feature
 * sizes NVFP4 cannot take. */
static QFormat dummy_format(const Loader *ld, const char *prefix, int64_t K)
{
    int excluded = strcmp(prefix, "lm_head") == 0 || strcmp(prefix, "model.embed_tokens") == 0 ||
                   (strlen(prefix) > 9 && strcmp(prefix + strlen(prefix) - 9, ".mlp.gate") == 0);
    if (ld->qc.algo != QALGO_NONE) excluded |= quant_config_excluded(&ld->qc, prefix);
    if (excluded || (ld->dummy == QF_NVFP4 && K % 16)) return QF_BF16;
    return ld->dummy;
}

/* Linear `prefix` with shape [N, K]; required unless optional (then 0 if absent). */
static int linear(Loader *ld, QTensor *w, const char *prefix, int64_t N, int64_t K, int optional)
{
    char err[1024];
    if (ld->dummy != QF_COUNT) { /* a skeleton: model_upload fills data == NULL with random weights */
        if (optional && strcmp(prefix, "lm_head") == 0 && ld->m->cfg.tie_embeddings) return 0;
        *w = (QTensor){.fmt = dummy_format(ld, prefix, K), .rows = N, .cols = K, .gscale = 1.0f,
                       .scale_dtype = DT_F32};
        return 1;
    }
    int rc = load_qtensor(&ld->m->st, prefix, w, err, sizeof err);
    if (rc < 0) fatal("%s", err);
    if (rc == 0) {
        if (optional) return 0;
        fatal("%s: missing tensor '%s.weight' (config.json %s needs it)", ld->dir, prefix, ld->m->cfg.architecture);
    }
    const StTensor *t = safetensors_find(&ld->m->st, w->name);
    if (w->rows != N || w->cols != K)
        fatal("%s: tensor '%s': shape is [%lld, %lld] as a %s linear, config.json says [%lld, %lld]",
              safetensors_file_of(&ld->m->st, t), w->name, (long long)w->rows, (long long)w->cols,
              qformat_name(w->fmt), (long long)N, (long long)K);
    if (w->fmt == QF_NVFP4 && ld->qc.algo == QALGO_NONE && !ld->warned_quant) {
        log_warn("%s: NVFP4 tensors but no quantization config (hf_quant_config.json or quantization_config); "
                 "precision is read from the tensors", ld->dir);
        ld->warned_quant = 1;
    }
    if (ld->qc.algo != QALGO_NONE && w->fmt == QF_NVFP4 && quant_config_excluded(&ld->qc, prefix))
        log_warn("%s: '%s' is NVFP4 although the quantization config excludes it; using the stored format", ld->dir, prefix);
    mark_prefix_used(ld, prefix);
    return 1;
}

/* A 1-D float vector (norm weight, bias) of n elements, decoded to an owned float array. */
static float *vec(Loader *ld, const char *name, int64_t n, int optional)
{
    if (ld->dummy != QF_COUNT) { /* norms 1, biases 0: a dummy model stays numerically tame */
        int is_norm = strstr(name, "norm.weight") != NULL;
        float *v = xmalloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++) v[i] = is_norm ? 1.0f : 0.0f;
        return v;
    }
    const StTensor *t = safetensors_find(&ld->m->st, name);
    if (!t) {
        if (optional) return NULL;
        fatal("%s: missing tensor '%s' (config.json %s needs it)", ld->dir, name, ld->m->cfg.architecture);
    }
    if (t->numel != n || t->ndim != 1) {
        char s[128];
        shape_str(t, s, sizeof s);
        fatal("%s: tensor '%s': shape %s, config.json says [%lld]", safetensors_file_of(&ld->m->st, t), name, s, (long long)n);
    }
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        fatal("%s: tensor '%s': dtype %s, expected a float vector", safetensors_file_of(&ld->m->st, t), name, dtype_name(t->dtype));
    float *v = xmalloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = dtype_load(t->dtype, t->data, i);
    ld->used[t - ld->m->st.tensors] = 1;
    return v;
}

/* ---- the shard of one rank (src/dist/plan.h) ---- */

static int sharded(const ModelConfig *c) { return c->tp > 1 || c->pp > 1 || c->ep > 1; }

/* rows [r0, r0 + n) of a loaded linear: a view of the mapped file */
static void shard_rows(QTensor *w, int64_t r0, int64_t n)
{
    if (!w->rows || (r0 == 0 && n == w->rows)) return;
    if (!w->data) { w->rows = n; return; }
    *w = qtensor_rows(w, r0, n);
}

static void own(Model *m, void *buf)
{
    m->owned = xrealloc(m->owned, (m->n_owned + 1) * sizeof(void *));
    m->owned[m->n_owned++] = buf;
}

/* Linears that read the same input fused into one GEMM of their rows one after the other
 * (q_a and kv_a; gate and up of the dense MLP and of the shared experts), as vLLM and SGLang
 * merge them: one launch instead of two (with the BF16 route one split of the activations and
 * one join, cuda/matmul.cu), and one GEMM of the rows of both. The parts are left empty. Only
 * where one GEMM computes the same sums (qtensor_rows_concat: one format, one global scale;
 * block FP8 on whole scale blocks), else they stay apart; MOESERVE_FUSE=0 keeps them apart. The
 * fused copy is the model's (host memory: the parts' bytes again, on this rank's shard). */
static void fuse(Model *m, QTensor *fused, QTensor *a, QTensor *b)
{
    const int off = !knob_get(KNOB_FUSE);
    const QTensor *parts[2] = {a, b};
    void *buf;
    if (off || qtensor_rows_concat(parts, 2, fused, &buf)) return;
    if (buf) own(m, buf);
    *a = *b = (QTensor){0};
    m->n_fused++;
}

/* columns [c0, c0 + n): a copy of just those bytes, owned by the model. A slice that cuts a
 * scale block (a small model split finely) is decoded to float32 instead: the same values. */
static void shard_cols(Loader *ld, QTensor *w, int64_t c0, int64_t n)
{
    if (!w->rows || (c0 == 0 && n == w->cols)) return;
    void *buf;
    if (qtensor_cols_copy(w, c0, n, w, &buf) == 0) {
        if (buf) own(ld->m, buf);
        return;
    }
    if (!w->data)
        fatal("%s: '%s' (%s): --tp %d slices its %lld input columns at %lld, off the format's block boundary "
              "(NVFP4 16, block FP8 128)", ld->dir, w->name ? w->name : "?", qformat_name(w->fmt), ld->m->cfg.tp,
              (long long)w->cols, (long long)c0);
    log_warn("%s: '%s' (%s): --tp %d cuts its scale blocks (columns %lld..%lld of %lld); this rank keeps the slice "
             "in float32", ld->dir, w->name ? w->name : "?", qformat_name(w->fmt), ld->m->cfg.tp, (long long)c0,
             (long long)(c0 + n), (long long)w->cols);
    float *row = xmalloc(w->cols * sizeof(float)), *out = xmalloc((size_t)w->rows * n * sizeof(float));
    for (int64_t r = 0; r < w->rows; r++) {
        qtensor_decode(w, r, 0, w->cols, row);
        memcpy(out + r * n, row + c0, n * sizeof(float));
    }
    free(row);
    own(ld->m, out);
    *w = (QTensor){.fmt = QF_F32, .rows = w->rows, .cols = n, .data = (const uint8_t *)out, .gscale = 1.0f,
                   .name = w->name};
}

/* elements [i0, i0 + n) of an owned vector, in place */
static float *vec_slice(float *v, int64_t i0, int64_t n)
{
    if (v && i0) memmove(v, v + i0, n * sizeof(float));
    return v;
}

/* Fused experts: prefix.gate_up_proj [E, 2F, D] and prefix.down_proj [E, D, F] ("" or ".weight"). */
static int fused_experts(Loader *ld, LayerWeights *lw, const char *prefix, int E, int F, int D)
{
    const SafeTensors *st = &ld->m->st;
    char gu[1100], dn[1100];
    const StTensor *tg = NULL, *td = NULL;
    static const char *sfx[] = {"", ".weight"};
    for (int i = 0; i < 2 && !tg; i++) {
        snprintf(gu, sizeof gu, "%s.gate_up_proj%s", prefix, sfx[i]);
        snprintf(dn, sizeof dn, "%s.down_proj%s", prefix, sfx[i]);
        tg = safetensors_find(st, gu);
        td = safetensors_find(st, dn);
    }
    if (!tg) return 0;
    if (!td) fatal("%s: missing tensor '%s' (fused experts need gate_up_proj and down_proj)", ld->dir, dn);
    const StTensor *ts[2] = {tg, td};
    int64_t want[2][3] = {{E, 2 * F, D}, {E, D, F}};
    for (int i = 0; i < 2; i++) {
        const StTensor *t = ts[i];
        if (t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_F32)
            fatal("%s: tensor '%s': fused experts in %s are not supported (BF16, F16, F32)", safetensors_file_of(st, t),
                  t->name, dtype_name(t->dtype));
        if (t->ndim != 3 || t->shape[0] != want[i][0] || t->shape[1] != want[i][1] || t->shape[2] != want[i][2]) {
            char s[128];
            shape_str(t, s, sizeof s);
            fatal("%s: tensor '%s': shape %s, config.json says [%lld, %lld, %lld]", safetensors_file_of(st, t), t->name, s,
                  (long long)want[i][0], (long long)want[i][1], (long long)want[i][2]);
        }
        ld->used[t - st->tensors] = 1;
    }
    QFormat fmt = tg->dtype == DT_BF16 ? QF_BF16 : tg->dtype == DT_F16 ? QF_F16 : QF_F32;
    QFormat fmtd = td->dtype == DT_BF16 ? QF_BF16 : td->dtype == DT_F16 ? QF_F16 : QF_F32;
    size_t es = dtype_bits(tg->dtype) / 8, esd = dtype_bits(td->dtype) / 8;
    int e0 = ld->m->cfg.expert0, El = ld->m->cfg.n_local_experts; /* this rank's experts (EP) */
    for (int e = e0; e < e0 + El; e++) {
        QTensor whole = {.fmt = fmt, .rows = 2 * F, .cols = D, .gscale = 1, .name = tg->name,
                         .data = tg->data + (size_t)e * 2 * F * D * es};
        lw->exp_gate[e - e0] = qtensor_rows(&whole, 0, F);
        lw->exp_up[e - e0] = qtensor_rows(&whole, F, F);
        lw->exp_down[e - e0] = (QTensor){.fmt = fmtd, .rows = D, .cols = F, .gscale = 1, .name = td->name,
                                         .data = td->data + (size_t)e * D * F * esd};
    }
    return 1;
}

/* The FP8 KV cache scales of layer l (ModelOpt: x = code * scale): k_scale and v_scale under the
 * names vLLM reads (weight_utils.maybe_remap_kv_scale_name): self_attn.{k,v}_proj.{k,v}_scale,
 * self_attn.{k,v}_scale, self_attn.attn.{k,v}_scale; MLA keeps one latent row, so only k_scale
 * (also under kv_a_proj_with_mqa). Absent: 0 (the cache uses 1). */
static void kv_scales(Loader *ld, int l)
{
    if (ld->dummy != QF_COUNT) return;
    static const char *fmt[2][4] = {
        {"self_attn.k_proj.k_scale", "self_attn.k_scale", "self_attn.attn.k_scale",
         "self_attn.kv_a_proj_with_mqa.k_scale"},
        {"self_attn.v_proj.v_scale", "self_attn.v_scale", "self_attn.attn.v_scale", NULL},
    };
    for (int kv = 0; kv < 2; kv++)
        for (int i = 0; i < 4 && fmt[kv][i]; i++) {
            char name[600];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, fmt[kv][i]);
            const StTensor *t = safetensors_find(&ld->m->st, name);
            if (!t) continue;
            if (t->numel != 1 || (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16))
                fatal("%s: tensor '%s': expected a float scalar", safetensors_file_of(&ld->m->st, t), name);
            float v = scalar_of(t);
            if (!(v > 0 && v < INFINITY))
                fatal("%s: tensor '%s': KV cache scale %g is not a positive finite number",
                      safetensors_file_of(&ld->m->st, t), name, v);
            ld->m->cfg.kv_scale[l][kv] = v;
            ld->used[t - ld->m->st.tensors] = 1;
            break;
        }
}

/* kv_cache_quant_algo (hf_quant_config.json, as ModelOpt's exporter writes it): "FP8" asks for an FP8
   KV cache; anything else moeserve cannot honour. */
static void kv_cache_request(Loader *ld)
{
    const char *a = ld->qc.kv_cache_algo;
    ld->m->cfg.kv_cache_fp8 = !strcmp(a, "FP8");
    if (a[0] && !ld->m->cfg.kv_cache_fp8)
        log_warn("%s: kv_cache_quant_algo %s is not supported; the KV cache uses its default dtype", ld->dir, a);
}

static void load_layer(Loader *ld, int l)
{
    Model *m = ld->m;
    const ModelConfig *c = &m->cfg;
    LayerWeights *w = &m->layers[l];
    /* shapes are checked against the whole model (g_*), then cut to this rank's shard */
    int64_t D = c->hidden, H = c->g_heads, Hl = c->n_heads, h0 = c->head0;
    char p[256], q[1024];
#define PFX(...) (snprintf(q, sizeof q, "%s." __VA_ARGS__), q)
    snprintf(p, sizeof p, "model.layers.%d", l);
    kv_scales(ld, l);
    w->attn_norm = vec(ld, PFX("input_layernorm.weight", p), D, 0);
    w->ffn_norm = vec(ld, PFX("post_attention_layernorm.weight", p), D, 0);

    if (config_is_mla(c)) {
        int64_t R = c->q_lora_rank, C = c->kv_lora_rank, Dr = c->qk_rope_dim, Dq = c->qk_nope_dim + Dr;
        int64_t Dkv = c->qk_nope_dim + c->v_head_dim, Dv = c->v_head_dim;
        if (R > 0) {
            linear(ld, &w->wq_a, PFX("self_attn.q_a_proj", p), R, D, 0);
            w->q_a_norm = vec(ld, PFX("self_attn.q_a_layernorm.weight", p), R, 0);
            linear(ld, &w->wq_b, PFX("self_attn.q_b_proj", p), H * Dq, R, 0);
        } else {
            linear(ld, &w->wq_b, PFX("self_attn.q_proj", p), H * Dq, D, 0);
        }
        shard_rows(&w->wq_b, h0 * Dq, Hl * Dq);
        linear(ld, &w->wkv_a, PFX("self_attn.kv_a_proj_with_mqa", p), C + Dr, D, 0);
        w->kv_a_norm = vec(ld, PFX("self_attn.kv_a_layernorm.weight", p), C, 0);
        if (R > 0) fuse(ld->m, &w->wqkv_a, &w->wq_a, &w->wkv_a);
        linear(ld, &w->wkv_b, PFX("self_attn.kv_b_proj", p), H * Dkv, C, 0);
        shard_rows(&w->wkv_b, h0 * Dkv, Hl * Dkv);
        linear(ld, &w->wo, PFX("self_attn.o_proj", p), D, H * Dv, 0);
        shard_cols(ld, &w->wo, h0 * Dv, Hl * Dv);
        if (c->layer_indexer[l] == INDEXER_FULL) { /* replicated on every rank */
            int64_t Hi = c->index_n_heads, Di = c->index_head_dim;
            linear(ld, &w->idx_wq_b, PFX("self_attn.indexer.wq_b", p), Hi * Di, R, 0);
            linear(ld, &w->idx_wk, PFX("self_attn.indexer.wk", p), Di, D, 0);
            linear(ld, &w->idx_wproj, PFX("self_attn.indexer.weights_proj", p), Hi, D, 0);
            w->idx_norm_w = vec(ld, PFX("self_attn.indexer.k_norm.weight", p), Di, 0);
            w->idx_norm_b = vec(ld, PFX("self_attn.indexer.k_norm.bias", p), Di, 0);
        }
    } else {
        int64_t Dh = c->head_dim, Hkv = c->g_kv_heads, Hkvl = c->n_kv_heads, k0 = c->kv_head0;
        linear(ld, &w->wq, PFX("self_attn.q_proj", p), H * Dh, D, 0);
        linear(ld, &w->wk, PFX("self_attn.k_proj", p), Hkv * Dh, D, 0);
        linear(ld, &w->wv, PFX("self_attn.v_proj", p), Hkv * Dh, D, 0);
        linear(ld, &w->wo, PFX("self_attn.o_proj", p), D, H * Dh, 0);
        shard_rows(&w->wq, h0 * Dh, Hl * Dh);
        shard_rows(&w->wk, k0 * Dh, Hkvl * Dh);
        shard_rows(&w->wv, k0 * Dh, Hkvl * Dh);
        shard_cols(ld, &w->wo, h0 * Dh, Hl * Dh);
        if (c->attention_bias) {
            w->bq = vec_slice(vec(ld, PFX("self_attn.q_proj.bias", p), H * Dh, 0), h0 * Dh, Hl * Dh);
            w->bk = vec_slice(vec(ld, PFX("self_attn.k_proj.bias", p), Hkv * Dh, 0), k0 * Dh, Hkvl * Dh);
            w->bv = vec_slice(vec(ld, PFX("self_attn.v_proj.bias", p), Hkv * Dh, 0), k0 * Dh, Hkvl * Dh);
        }
        if (c->use_qk_norm) {
            w->q_norm = vec(ld, PFX("self_attn.q_norm.weight", p), Dh, 0);
            w->k_norm = vec(ld, PFX("self_attn.k_norm.weight", p), Dh, 0);
        }
    }

    int tp = c->tp, tr = c->tp_rank;
    if (!c->layer_moe[l]) {
        int64_t Fd = c->g_intermediate, Fl = c->intermediate;
        linear(ld, &w->w_gate, PFX("mlp.gate_proj", p), Fd, D, 0);
        linear(ld, &w->w_up, PFX("mlp.up_proj", p), Fd, D, 0);
        linear(ld, &w->w_down, PFX("mlp.down_proj", p), D, Fd, 0);
        shard_rows(&w->w_gate, tr * Fl, Fl);
        shard_rows(&w->w_up, tr * Fl, Fl);
        shard_cols(ld, &w->w_down, tr * Fl, Fl);
        fuse(ld->m, &w->w_gate_up, &w->w_gate, &w->w_up);
        return;
    }
    int E = c->n_experts, El = c->n_local_experts, e0 = c->expert0;
    int64_t F = c->g_moe_intermediate, Fl = c->moe_intermediate, Fs = F * c->n_shared_experts, Fsl = Fs / tp;
    linear(ld, &w->router, PFX("mlp.gate", p), E, D, 0);
    w->router_bias = vec(ld, PFX("mlp.gate.e_score_correction_bias", p), E, 1);
    w->exp_gate = xcalloc(El, sizeof(QTensor));
    w->exp_up = xcalloc(El, sizeof(QTensor));
    w->exp_down = xcalloc(El, sizeof(QTensor));
    if (!fused_experts(ld, w, PFX("mlp.experts", p), E, F, D)) {
        for (int e = e0; e < e0 + El; e++) {
            char ep[600];
            snprintf(ep, sizeof ep, "%s.mlp.experts.%d", p, e);
            linear(ld, &w->exp_gate[e - e0], PFX("gate_proj", ep), F, D, 0);
            linear(ld, &w->exp_up[e - e0], PFX("up_proj", ep), F, D, 0);
            linear(ld, &w->exp_down[e - e0], PFX("down_proj", ep), D, F, 0);
        }
    }
    if (Fl != F) /* experts sliced by width (TP without EP) */
        for (int e = 0; e < El; e++) {
            shard_rows(&w->exp_gate[e], tr * Fl, Fl);
            shard_rows(&w->exp_up[e], tr * Fl, Fl);
            shard_cols(ld, &w->exp_down[e], tr * Fl, Fl);
        }
    if (Fs > 0) {
        linear(ld, &w->sh_gate, PFX("mlp.shared_experts.gate_proj", p), Fs, D, 0);
        linear(ld, &w->sh_up, PFX("mlp.shared_experts.up_proj", p), Fs, D, 0);
        linear(ld, &w->sh_down, PFX("mlp.shared_experts.down_proj", p), D, Fs, 0);
        shard_rows(&w->sh_gate, tr * Fsl, Fsl);
        shard_rows(&w->sh_up, tr * Fsl, Fsl);
        shard_cols(ld, &w->sh_down, tr * Fsl, Fsl);
        fuse(ld->m, &w->sh_gate_up, &w->sh_gate, &w->sh_up);
    }
#undef PFX
}

/* Layer index of "model.layers.N...." or -1. */
static int layer_of(const char *name)
{
    if (strncmp(name, "model.layers.", 13) != 0) return -1;
    char *end;
    long v = strtol(name + 13, &end, 10);
    return end != name + 13 && *end == '.' ? (int)v : -1;
}

/* Every weight of the config: from the checkpoint, or as dummy skeletons. */
static void load_all(Loader *ld)
{
    Model *m = ld->m;
    const ModelConfig *c = &m->cfg;
    int first = c->layer_begin == 0, last = c->layer_end == c->n_layers; /* pipeline stage */
    if (first || (last && c->tie_embeddings)) linear(ld, &m->embed, "model.embed_tokens", c->vocab, c->hidden, 0);
    if (last) {
        if (!linear(ld, &m->lm_head, "lm_head", c->vocab, c->hidden, 1)) {
            if (!c->tie_embeddings) fatal("%s: missing tensor 'lm_head.weight' (tie_word_embeddings is false)", ld->dir);
            m->lm_head = m->embed;
        }
        shard_rows(&m->lm_head, c->vocab0, c->vocab_local);
        m->final_norm = vec(ld, "model.norm.weight", c->hidden, 0);
    }
    if (!first) m->embed = (QTensor){0};
    m->layers = xcalloc(c->n_layers + 1, sizeof(LayerWeights)); /* + the MTP layer's place (model_load_mtp) */
    /* a real checkpoint's layers: their scales scanned, vectors decoded, pairs fused (minutes on a
     * big model, its pages read from disk); dummy skeletons are instant, their weights are made at
     * upload (which counts them) */
    Progress pg;
    if (ld->dummy == QF_COUNT) progress_start(&pg, "load", (uint64_t)(c->layer_end - c->layer_begin), "layers");
    for (int l = c->layer_begin; l < c->layer_end; l++) {
        load_layer(ld, l);
        if (ld->dummy == QF_COUNT) progress_add(&pg, 1);
    }
    if (ld->dummy == QF_COUNT) progress_end(&pg);
    account_model(m);
    if (m->n_fused) log_debug("load: %d pairs of linears that read the same input run as one GEMM each", m->n_fused);
}

void model_load_dummy(Model *m, const char *dir, QFormat fmt, int n_layers)
{
    model_load_dummy_shard(m, dir, fmt, n_layers, NULL, NULL);
}

void model_load_dummy_shard(Model *m, const char *dir, QFormat fmt, int n_layers,
                            void (*shard)(ModelConfig *c, void *user), void *user)
{
    char err[1024];
    *m = (Model){0};
    if (config_load(&m->cfg, dir, err, sizeof err) < 0) fatal("%s", err);
    if (n_layers > 0) {
        if (n_layers > m->cfg.n_layers) fatal("--num-layers %d: the config has %d layers", n_layers, m->cfg.n_layers);
        m->cfg.n_layers = n_layers;
        m->cfg.layer_end = n_layers;
    }
    if (shard) shard(&m->cfg, user);
    if (fmt != QF_BF16 && fmt != QF_NVFP4 && fmt != QF_FP8) fatal("dummy weights: format %s is not offered", qformat_name(fmt));
    Loader ld = {.m = m, .dir = dir, .dummy = fmt};
    if (quant_config_load(&ld.qc, dir, err, sizeof err) < 0) fatal("%s", err);
    kv_cache_request(&ld);
    load_all(&ld);
    m->dummy = 1;
    m->dummy_fmt = fmt;
    quant_config_free(&ld.qc);
    log_info("dummy weights: %s, %d layers, %.2f GiB (%.2f GiB NVFP4, %.2f GiB BF16)", m->cfg.architecture,
             m->cfg.n_layers, (m->bytes_by_format[QF_NVFP4] + m->bytes_by_format[QF_BF16] + m->bytes_by_format[QF_FP8]) / 1073741824.0,
             m->bytes_by_format[QF_NVFP4] / 1073741824.0, m->bytes_by_format[QF_BF16] / 1073741824.0);
}

void model_load(Model *m, const char *dir) { model_load_shard(m, dir, NULL, NULL); }

void model_load_shard(Model *m, const char *dir, void (*shard)(ModelConfig *c, void *user), void *user)
{
    char err[1024];
    *m = (Model){0};
    if (config_load(&m->cfg, dir, err, sizeof err) < 0) fatal("%s", err);
    if (shard) shard(&m->cfg, user);
    if (safetensors_open_dir(&m->st, dir, err, sizeof err) < 0) fatal("%s", err);
    Loader ld = {.m = m, .dir = dir, .used = xcalloc(m->st.n_tensors + 1, 1), .dummy = QF_COUNT};
    if (quant_config_load(&ld.qc, dir, err, sizeof err) < 0) fatal("%s", err);
    kv_cache_request(&ld);
    const ModelConfig *c = &m->cfg;
    load_all(&ld);

    /* MTP layers and anything left over (a shard leaves the other ranks' tensors alone) */
    if (sharded(c)) {
        free(ld.used);
        quant_config_free(&ld.qc);
        return;
    }
    int mtp_lo = 1 << 30, mtp_hi = -1, mtp_n = 0, stray = 0;
    for (int i = 0; i < m->st.n_tensors; i++) {
        if (ld.used[i]) continue;
        const char *name = m->st.tensors[i].name;
        int l = layer_of(name);
        if (l >= c->n_layers) {
            mtp_lo = l < mtp_lo ? l : mtp_lo;
            mtp_hi = l > mtp_hi ? l : mtp_hi;
            mtp_n++;
        } else if (!strstr(name, ".input_scale") && !strstr(name, "rotary_emb.inv_freq")) {
            if (stray++ < 5) log_warn("%s: tensor '%s' is not used by %s", dir, name, c->architecture);
        }
    }
    if (mtp_n)
        log_debug("MTP layer%s %d..%d (%d tensors): loaded only for speculative decoding (--speculative-config)",
                 mtp_lo == mtp_hi ? "" : "s", mtp_lo, mtp_hi, mtp_n);
    if (stray > 5) log_warn("%s: %d unused tensors in all", dir, stray);
    free(ld.used);
    quant_config_free(&ld.qc);
}

void model_load_mtp(Model *m, const char *dir)
{
    ModelConfig *c = &m->cfg;
    if (c->n_mtp_layers < 1)
        fatal("%s: speculative decoding drafts with the checkpoint's MTP layer, and this model has none "
              "(num_nextn_predict_layers is 0)", dir);
    /* tensor and expert parallel: the layer sharded as the model's layers are (its head as
       lm_head, in vocabulary slices); a pipeline's or attention groups' MTP pass is not written */
    Dist *d = dist_get();
    if (c->pp > 1) fatal("speculative decoding runs without --pp for now: use --tp and --ep (or leave out speculation)");
    if (d && d->dp > 1)
        fatal("speculative decoding runs without --dp for now: use --tp and --ep (or leave out speculation)");
    if (c->mtp_loaded) return;
    int L = c->n_layers;
    Loader ld = {.m = m, .dir = dir, .dummy = m->dummy ? m->dummy_fmt : QF_COUNT};
    char err[1024];
    if (quant_config_load(&ld.qc, dir, err, sizeof err) < 0) fatal("%s", err);
    if (!m->dummy) ld.used = xcalloc(m->st.n_tensors + 1, 1);
    int64_t D = c->hidden, V = c->vocab;
    char p[64], q[128];
    snprintf(p, sizeof p, "model.layers.%d", L);
#define PFX(s) (snprintf(q, sizeof q, "%s.%s", p, s), q)
    MtpWeights *x = &m->mtp;
    x->enorm = vec(&ld, PFX("enorm.weight"), D, 0);
    x->hnorm = vec(&ld, PFX("hnorm.weight"), D, 0);
    linear(&ld, &x->eh_proj, PFX("eh_proj"), D, 2 * D, 0);
    x->head_norm = vec(&ld, PFX("shared_head.norm.weight"), D, 0);
    /* GLM-4.5 ships the layer's own head and embedding, GLM-5 and DeepSeek-V3 share the model's;
       dummy skeletons share them (the model's own, random alike) */
    x->own_head = !m->dummy && linear(&ld, &x->head, PFX("shared_head.head"), V, D, 1);
    if (x->own_head) shard_rows(&x->head, c->vocab0, c->vocab_local); /* lm_head's slice */
    else x->head = m->lm_head;
    x->own_embed = !m->dummy && linear(&ld, &x->embed, PFX("embed_tokens"), V, D, 1);
    if (!x->own_embed) x->embed = m->embed;
#undef PFX
    load_layer(&ld, L);
    c->mtp_loaded = 1;
    const QTensor *t[LAYER_LINEARS];
    layer_linears(&m->layers[L], t);
    for (int i = 0; i < LAYER_LINEARS; i++) account(m, t[i]);
    if (c->layer_moe[L] && m->layers[L].exp_gate)
        for (int e = 0; e < c->n_local_experts; e++) {
            account(m, &m->layers[L].exp_gate[e]);
            account(m, &m->layers[L].exp_up[e]);
            account(m, &m->layers[L].exp_down[e]);
        }
    account(m, &x->eh_proj);
    if (x->own_head) account(m, &x->head);
    if (x->own_embed) account(m, &x->embed);
    log_info("MTP layer %d loaded: speculative decoding drafts with it%s", L,
             x->own_head || x->own_embed ? " (its own embedding and head)" : "");
    free(ld.used);
    quant_config_free(&ld.qc);
}

void model_free(Model *m)
{
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers + m->cfg.mtp_loaded; l++) {
            LayerWeights *w = &m->layers[l];
            float *v[] = {w->attn_norm, w->ffn_norm, w->bq, w->bk, w->bv, w->q_norm, w->k_norm, w->q_a_norm,
                          w->kv_a_norm, w->idx_norm_w, w->idx_norm_b, w->router_bias};
            for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
            free(w->exp_gate);
            free(w->exp_up);
            free(w->exp_down);
        }
    }
    free(m->layers);
    free(m->final_norm);
    free(m->mtp.enorm);
    free(m->mtp.hnorm);
    free(m->mtp.head_norm);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    safetensors_free(&m->st);
    *m = (Model){0};
}
