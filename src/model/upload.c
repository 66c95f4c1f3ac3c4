/* upload: a loaded Model's weights copied into backend memory (model.h model_upload). Two
 * passes over the same walk: the first sums the bytes, then one allocation is made and the
 * second copies each tensor into it and rewrites the pointers. QTensor slices are uploaded as
 * what they cover (an expert of a fused tensor, the FP8 block-scale rows of a slice). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/backend.h"
#include "../base/knobs.h"
#include "../base/progress.h"
#include "../base/util.h"
#include "model.h"

#define UP_ALIGN 256

typedef struct {
    Backend *be;
    uint8_t *base;   /* NULL in the counting pass */
    size_t off;
    uint64_t seed;   /* dummy weights: advanced once per filled buffer */
    int pack;        /* NVFP4 goes through be->ops->pack_nvfp4 (the backend's kernel layout) */
    uint8_t *stage;  /* backend memory for one tensor's checkpoint layout before packing */
    size_t stage_need;  /* counting pass: the largest tensor packed */
    int n_packed;       /* tensors packed (copy pass) */
    int64_t moe_f, moe_fp;   /* the experts' width F padded to moe_fp (up_widths; equal: none) */
    int64_t dense_f, dense_fp; /* the dense MLP's */
    Progress *pg;       /* copy pass: the bytes placed so far */
} Up;

static size_t up_aligned(size_t n) { return (n + UP_ALIGN - 1) / UP_ALIGN * UP_ALIGN; }

/* n bytes of backend memory reserved at u->off (both passes) */
static size_t up_take(Up *u, size_t n)
{
    size_t at = u->off;
    u->off += up_aligned(n);
    return at;
}

/* the n bytes reserved by an up_take placed (copy pass): their share of the total counted */
static void up_placed(Up *u, size_t n)
{
    if (u->pg) progress_add(u->pg, up_aligned(n));
}

static void *up_bytes(Up *u, const void *src, size_t n)
{
    size_t at = up_take(u, n);
    if (!u->base) return NULL;
    if (n) be_to_device(u->be, u->base + at, src, n);
    up_placed(u, n);
    return u->base + at;
}

static float *up_vec(Up *u, const float *v, size_t n)
{
    return v ? up_bytes(u, v, n * sizeof(float)) : NULL;
}

static size_t row_bytes(const QTensor *w)
{
    switch (w->fmt) {
    case QF_F32: return w->cols * 4;
    case QF_BF16: case QF_F16: return w->cols * 2;
    case QF_FP8: case QF_FP8_BLOCK: return w->cols;
    case QF_NVFP4: return w->cols / 2;
    default: die("upload: unknown format %d", (int)w->fmt);
    }
}

/* n elements of a dummy tensor, filled on the backend (model_load_dummy's skeletons) */
static void *up_fill(Up *u, size_t bytes, size_t n, FillKind kind, float a, float b)
{
    size_t at = up_take(u, bytes);
    if (!u->base) return NULL;
    u->seed = u->seed * 6364136223846793005ull + 1442695040888963407ull;
    be_fill(u->be, u->base + at, n, kind, a, b, u->seed);
    up_placed(u, bytes);
    return u->base + at;
}

/* An NVFP4 tensor the backend packs: N % 16 == 0 and K % 256 == 0 (the W4P records of
 * src/backend/cuda/w4_common.cuh), unless MOESERVE_W4=0 keeps the checkpoint layout. */
static int up_packs(const Up *u, const QTensor *w)
{
    return u->pack && w->fmt == QF_NVFP4 && w->rows > 0 && w->rows % 16 == 0 && w->cols % 256 == 0;
}

/* NVFP4 into the backend's layout: the checkpoint's codes and scales (copied, or for a dummy
 * tensor filled with the seeds up_fill would use, so the values are the same either way) go
 * to the stage, then pack_nvfp4 writes the same number of bytes at the final place. Padded
 * (up_widths): its `halves` parts of rows each followed by zero rows up to rows_p, its rows by
 * zero columns up to cols_p (a dummy tensor is random all over: only its speed matters). */
static void up_nvfp4_packed(Up *u, QTensor *dst, const QTensor *src, int halves, int64_t rows_p, int64_t cols_p)
{
    int64_t R = (int64_t)halves * rows_p;
    size_t n = (size_t)R * cols_p, bytes = n / 2 + n / 16;
    if (bytes > u->stage_need) u->stage_need = bytes;
    size_t at = up_take(u, bytes);
    if (!u->base) return;
    uint8_t *codes = u->stage, *scales = u->stage + n / 2;
    if (!src->data) {
        u->seed = u->seed * 6364136223846793005ull + 1442695040888963407ull;
        be_fill(u->be, codes, n / 2, FILL_U8_RANDOM, 0, 0, u->seed);
        u->seed = u->seed * 6364136223846793005ull + 1442695040888963407ull;
        be_fill(u->be, scales, n / 16, FILL_U8_CONST, 0x38, 0, u->seed);
        dst->gscale = 1.0f / sqrtf((float)src->cols) / 2.9257f;
    } else if (R == src->rows && cols_p == src->cols) {
        be_to_device(u->be, codes, src->data, n / 2);
        be_to_device(u->be, scales, src->scale, n / 16);
    } else {
        uint8_t *h = xmalloc(bytes);
        if (qtensor_nvfp4_pad(src, halves, rows_p, cols_p, h, h + n / 2) < 0)
            die("upload: %s: [%lld, %lld] does not pad to %d x [%lld, %lld]", src->name ? src->name : "a linear",
                (long long)src->rows, (long long)src->cols, halves, (long long)rows_p, (long long)cols_p);
        be_to_device(u->be, codes, h, n / 2);
        be_to_device(u->be, scales, h + n / 2, n / 16);
        free(h);
    }
    u->be->ops->pack_nvfp4(u->be, u->base + at, codes, scales, R, cols_p);
    up_placed(u, bytes);
    u->n_packed++;
    dst->data = u->base + at;
    dst->scale = NULL;
    dst->packed = 1;
    dst->rows = R;
    dst->cols = cols_p;
}

/* Random weights with std about 1/sqrt(K) in the skeleton's format: NVFP4 codes uniform over
 * the 16 E2M1 values (std 2.93) with block scale 1.0 (E4M3 0x38) and a global scale to match. */
static void up_dummy(Up *u, QTensor *dst, const QTensor *src)
{
    size_t n = (size_t)src->rows * src->cols;
    float sd = 1.0f / sqrtf((float)src->cols);
    switch (src->fmt) {
    case QF_BF16: dst->data = up_fill(u, n * 2, n, FILL_BF16_NORMAL, 0, sd); break;
    case QF_F32: dst->data = up_fill(u, n * 4, n, FILL_F32_NORMAL, 0, sd); break;
    case QF_FP8: dst->data = up_fill(u, n, n, FILL_E4M3_UNIT, 0, 0); dst->gscale = sd / 1.25f; break;
    case QF_NVFP4:
        dst->data = up_fill(u, n / 2, n / 2, FILL_U8_RANDOM, 0, 0);
        dst->scale = up_fill(u, n / 16, n / 16, FILL_U8_CONST, 0x38, 0);
        dst->gscale = sd / 2.9257f;
        break;
    default: die("dummy weights: format %s", qformat_name(src->fmt));
    }
}

/* src into backend memory; the packed NVFP4 ones with their padding: `halves` parts of rows each
 * padded to rows_p, columns to cols_p (0: as they are) */
static void up_qtensor_pad(Up *u, QTensor *dst, const QTensor *src, int halves, int64_t rows_p, int64_t cols_p)
{
    *dst = *src;
    if (!src->rows) return; /* absent (e.g. no indexer on a shared layer) */
    if (up_packs(u, src) || (rows_p && u->pack && src->fmt == QF_NVFP4)) {
        up_nvfp4_packed(u, dst, src, halves, rows_p ? rows_p : src->rows / halves, cols_p ? cols_p : src->cols);
        return;
    }
    if (!src->data) { /* a dummy skeleton */
        up_dummy(u, dst, src);
        return;
    }
    dst->data = up_bytes(u, src->data, (size_t)src->rows * row_bytes(src));
    if (src->fmt == QF_NVFP4) {
        dst->scale = up_bytes(u, src->scale, (size_t)src->rows * (src->cols / 16));
    } else if (src->fmt == QF_FP8_BLOCK) {
        int64_t gk = (src->cols + 127) / 128, lo = src->scale_row_off / 128;
        int64_t hi = (src->scale_row_off + src->rows - 1) / 128;
        size_t el = src->scale_dtype == DT_BF16 ? 2 : 4;
        dst->scale = up_bytes(u, src->scale + lo * gk * el, (size_t)(hi - lo + 1) * gk * el);
        dst->scale_row_off = src->scale_row_off - lo * 128;
    }
}

static void up_qtensor(Up *u, QTensor *dst, const QTensor *src) { up_qtensor_pad(u, dst, src, 1, 0, 0); }

/* a gate or up projection of width f ([f, D]; fused [2f, D]: halves 2) padded to fp rows, or
 * a down projection ([D, f]) to fp columns; as it is where fp == f */
static void up_ffn_in(Up *u, QTensor *dst, const QTensor *src, int halves, int64_t f, int64_t fp)
{
    if (fp == f || !src->rows) up_qtensor(u, dst, src);
    else up_qtensor_pad(u, dst, src, halves, fp * (src->rows / halves) / f, 0);
}

static void up_ffn_out(Up *u, QTensor *dst, const QTensor *src, int64_t f, int64_t fp)
{
    if (fp == f || !src->rows) up_qtensor(u, dst, src);
    else up_qtensor_pad(u, dst, src, 1, src->rows, fp * src->cols / f);
}

static void up_layer(Up *u, LayerWeights *d, const LayerWeights *s, const ModelConfig *c, int moe)
{
    *d = *s;
    d->attn_norm = up_vec(u, s->attn_norm, c->hidden);
    d->ffn_norm = up_vec(u, s->ffn_norm, c->hidden);
    const QTensor *qd[LAYER_LINEARS], *qs[LAYER_LINEARS];
    layer_linears(d, qd);
    layer_linears(s, qs);
    for (int i = 0; i < LAYER_LINEARS; i++) { /* qd: d's, written here */
        const QTensor *t = qs[i];
        int64_t f = moe ? u->moe_f : u->dense_f, fp = moe ? u->moe_fp : u->dense_fp;
        int64_t fs = moe ? f * (c->n_shared_experts > 0 ? c->n_shared_experts : 1) : f, fsp = fs / f * fp;
        if (t == &s->w_gate || t == &s->w_up || t == &s->sh_gate || t == &s->sh_up) up_ffn_in(u, (QTensor *)qd[i], t, 1, fs, fsp);
        else if (t == &s->w_gate_up || t == &s->sh_gate_up) up_ffn_in(u, (QTensor *)qd[i], t, 2, fs, fsp);
        else if (t == &s->w_down || t == &s->sh_down) up_ffn_out(u, (QTensor *)qd[i], t, fs, fsp);
        else up_qtensor(u, (QTensor *)qd[i], t);
    }
    int64_t qdim = (int64_t)c->n_heads * c->head_dim, kdim = (int64_t)c->n_kv_heads * c->head_dim;
    d->bq = up_vec(u, s->bq, qdim);
    d->bk = up_vec(u, s->bk, kdim);
    d->bv = up_vec(u, s->bv, kdim);
    d->q_norm = up_vec(u, s->q_norm, c->head_dim);
    d->k_norm = up_vec(u, s->k_norm, c->head_dim);
    d->q_a_norm = up_vec(u, s->q_a_norm, c->q_lora_rank);
    d->kv_a_norm = up_vec(u, s->kv_a_norm, c->kv_lora_rank);
    d->idx_norm_w = up_vec(u, s->idx_norm_w, c->index_head_dim);
    d->idx_norm_b = up_vec(u, s->idx_norm_b, c->index_head_dim);
    d->router_bias = up_vec(u, s->router_bias, c->n_experts);
    d->exp_gate = d->exp_up = d->exp_down = NULL;
    d->exp_table = NULL;
    if (!moe) return;
    int E = c->n_local_experts; /* this rank's (EP); all of them otherwise */
    /* host arrays of device QTensors (the counts read them) and their device copy for kernels */
    d->exp_gate = u->base ? xcalloc(3 * E, sizeof(QTensor)) : NULL;
    QTensor tmp;
    for (int e = 0; e < E; e++) {
        up_ffn_in(u, d->exp_gate ? &d->exp_gate[e] : &tmp, &s->exp_gate[e], 1, u->moe_f, u->moe_fp);
        up_ffn_in(u, d->exp_gate ? &d->exp_gate[E + e] : &tmp, &s->exp_up[e], 1, u->moe_f, u->moe_fp);
        up_ffn_out(u, d->exp_gate ? &d->exp_gate[2 * E + e] : &tmp, &s->exp_down[e], u->moe_f, u->moe_fp);
    }
    if (d->exp_gate) {
        d->exp_up = d->exp_gate + E;
        d->exp_down = d->exp_gate + 2 * E;
    }
    d->exp_table = up_bytes(u, d->exp_gate, 3 * (size_t)E * sizeof(QTensor));
}

/* The FFN widths the packed kernels can take. Their records are 256 columns wide, so a down
 * projection of F columns, F % 256 != 0 (GLM-4.5's experts: 1408; its dense layer: 10944),
 * would leave the whole MoE (or MLP) on the simple dequantising kernels, 30-50x slower. Such a
 * width is padded with zeros to the next multiple of 256 where every linear of it on this rank is
 * NVFP4 the backend packs once padded: gate and up gain zero rows (their outputs there are 0, and
 * silu(0) * 0 = 0), down gains zero columns, so the sums are the same; the bytes read grow by
 * the padding (1408 -> 1536: 9%). The device model's config then says the padded width. */
static int nvfp4_k_ok(const Up *u, const QTensor *w, int64_t k)
{
    return !w->rows || (u->pack && w->fmt == QF_NVFP4 && w->rows % 16 == 0 && k % 256 == 0);
}

static void up_widths(Up *u, const Model *m)
{
    const ModelConfig *c = &m->cfg;
    int64_t D = c->hidden, F = c->moe_intermediate, Fp = (F + 255) / 256 * 256, I = c->intermediate, Ip = (I + 255) / 256 * 256;
    int moe_ok = F > 0 && Fp != F, dense_ok = I > 0 && Ip != I, moes = 0, denses = 0;
    for (int l = c->layer_begin; l < c->layer_end; l++) {
        const LayerWeights *w = &m->layers[l];
        if (c->layer_moe[l]) {
            moes++;
            int64_t ns = c->n_shared_experts > 0 ? c->n_shared_experts : 1;
            for (int e = 0; moe_ok && e < c->n_local_experts; e++)
                moe_ok = nvfp4_k_ok(u, &w->exp_gate[e], D) && nvfp4_k_ok(u, &w->exp_up[e], D) &&
                         nvfp4_k_ok(u, &w->exp_down[e], Fp) && w->exp_down[e].cols == F;
            moe_ok = moe_ok && nvfp4_k_ok(u, &w->sh_gate, D) && nvfp4_k_ok(u, &w->sh_up, D) &&
                     nvfp4_k_ok(u, &w->sh_gate_up, D) && nvfp4_k_ok(u, &w->sh_down, ns * Fp);
        } else {
            denses++;
            dense_ok = dense_ok && nvfp4_k_ok(u, &w->w_gate, D) && nvfp4_k_ok(u, &w->w_up, D) &&
                       nvfp4_k_ok(u, &w->w_gate_up, D) && nvfp4_k_ok(u, &w->w_down, Ip) && w->w_down.cols == I;
        }
    }
    u->moe_f = F, u->moe_fp = moe_ok && moes ? Fp : F;
    u->dense_f = I, u->dense_fp = dense_ok && denses ? Ip : I;
}

static void up_model(Up *u, Model *dst, const Model *src)
{
    const ModelConfig *c = &src->cfg;
    up_qtensor(u, &dst->embed, &src->embed);
    up_qtensor(u, &dst->lm_head, &src->lm_head);
    dst->final_norm = up_vec(u, src->final_norm, c->hidden);
    for (int l = c->layer_begin; l < c->layer_end; l++) { /* this pipeline stage's */
        LayerWeights scratch;
        up_layer(u, u->base ? &dst->layers[l] : &scratch, &src->layers[l], c, c->layer_moe[l]);
    }
    if (c->mtp_loaded) { /* the MTP layer (model_load_mtp); its shared head and embedding are views */
        int L = c->n_layers;
        LayerWeights scratch;
        up_layer(u, u->base ? &dst->layers[L] : &scratch, &src->layers[L], c, c->layer_moe[L]);
        const MtpWeights *s = &src->mtp;
        MtpWeights *d = &dst->mtp;
        d->enorm = up_vec(u, s->enorm, c->hidden);
        d->hnorm = up_vec(u, s->hnorm, c->hidden);
        d->head_norm = up_vec(u, s->head_norm, c->hidden);
        up_qtensor(u, &d->eh_proj, &s->eh_proj);
        if (s->own_head) up_qtensor(u, &d->head, &s->head);
        else d->head = dst->lm_head;
        if (s->own_embed) up_qtensor(u, &d->embed, &s->embed);
        else d->embed = dst->embed;
    }
}

void model_upload(Model *dst, const Model *src, Backend *be)
{
    *dst = *src;
    memset(&dst->st, 0, sizeof dst->st); /* the mapping stays src's */
    dst->cfg.kv_dtype = model_kv_dtype(&src->cfg, be->host_memory); /* the cache dtype on this backend */
    int pack = be->ops->pack_nvfp4 && knob_get(KNOB_W4);
    Up u = {.be = be, .pack = pack};
    up_widths(&u, src);
    if (u.moe_fp != u.moe_f || u.dense_fp != u.dense_f)
        log_info("upload: FFN widths padded with zeros for the W4A16 kernels: experts %lld -> %lld, dense %lld -> %lld",
                 (long long)u.moe_f, (long long)u.moe_fp, (long long)u.dense_f, (long long)u.dense_fp);
    dst->cfg.moe_intermediate = (int)u.moe_fp;
    dst->cfg.intermediate = (int)u.dense_fp;
    up_model(&u, dst, src);
    size_t stage = u.stage_need, total = u.off + stage, avail = be_mem_free(be);
    /* the weights must leave room for activations and the KV cache: say so before copying anything */
    if (total > avail)
        fatal("the model does not fit: its weights take %.2f GiB and %s has %.2f GiB free (%d layers; with "
              "--dummy-weights, --num-layers N keeps fewer)",
              total / 1073741824.0, be->name, avail / 1073741824.0, src->cfg.n_layers);
    log_info("upload: %.2f GiB of weights to %s (%.2f GiB free)", total / 1073741824.0, be->name, avail / 1073741824.0);
    dst->dev_buffer = be_alloc(be, total - stage);
    dst->layers = xcalloc(src->cfg.n_layers + 1, sizeof(LayerWeights)); /* + the MTP layer's place */
    /* dummy weights are made here, on the backend: the same walk, so the same count */
    Progress pg;
    progress_start(&pg, src->dummy ? "dummy weights" : "upload", total - stage, PROGRESS_BYTES);
    u = (Up){.be = be, .base = dst->dev_buffer, .seed = 20261202, .pack = pack, .stage = stage ? be_alloc(be, stage) : NULL,
             .moe_f = u.moe_f, .moe_fp = u.moe_fp, .dense_f = u.dense_f, .dense_fp = u.dense_fp, .pg = &pg};
    up_model(&u, dst, src);
    if (u.stage) be_free(be, u.stage);
    /* dummy weights' fills may still be queued on the backend: the final line waits for them */
    uint8_t one;
    if (total > stage) be_to_host(be, &one, dst->dev_buffer, 1);
    progress_end(&pg);
    if (u.n_packed) log_info("upload: %d NVFP4 tensors repacked for the W4A16 kernels", u.n_packed);
}

void model_upload_free(Model *m, Backend *be)
{
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers + m->cfg.mtp_loaded; l++) free(m->layers[l].exp_gate);
    free(m->layers);
    be_free(be, m->dev_buffer);
    *m = (Model){0};
}
