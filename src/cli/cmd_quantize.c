/* cmd_quantize: `moeserve quantize --model BF16_DIR --out DIR [--exclude PATTERN,...]
 * [--shard-mb N] [--threads N]` writes the ModelOpt NVFP4 checkpoint of a BF16 (or F16/F32)
 * one (the format of ModelOpt's exporter, src/format/ckpt.h): every 2-D linear "<module>.weight"
 * that is not excluded becomes weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
 * weight_scale_2 F32 [] and input_scale F32 [] (a 1.0 placeholder: no activations are seen;
 * W4A16 engines ignore it). gate_proj and up_proj of one MLP share weight_scale_2 =
 * max(amax) / 2688 (engines fuse them into one GEMM). Excluded by default, as in real releases
 * (ModelOpt's default exclusions, ckpt_default_excludes): lm_head, embeddings, routers (mlp.gate)
 * and the MTP layers; norms, biases and e_score_correction_bias are not linears. Every other
 * tensor is copied byte for byte in its dtype and the tensors keep their order. The exclude list
 * is recorded in hf_quant_config.json and config.json quantization_config; the tokenizer and
 * generation config are copied. */
#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "../base/util.h"
#include "../format/ckpt.h"
#include "../format/config.h"
#include "../format/safetensors.h"
#include "cli.h"

/* Files beside the weights that travel unchanged. */
static const char *const copied_files[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja",
};

/* ---- helpers ---- */

/* The source tensors in plan order (borrowed from the mmapped checkpoint). */
typedef struct {
    const SafeTensors *st;
    const StTensor **t;    /* [plan.n] */
} Source;

static const void *source_fetch(void *ctx, int i, int64_t r0, int64_t r1)
{
    (void)r1;
    const Source *s = ctx;
    const StTensor *t = s->t[i];
    int64_t rows = t->ndim >= 2 ? t->shape[0] : 1;
    return t->data + (size_t)r0 * (t->nbytes / (size_t)(rows > 0 ? rows : 1));
}

/* File order: shard by shard, by position in the file, so the output keeps the input's order. */
static const SafeTensors *sort_st;
static int cmp_file_order(const void *a, const void *b)
{
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    const uint8_t *bx = sort_st->files[x->file].map, *by = sort_st->files[y->file].map;
    ptrdiff_t ox = x->data - bx, oy = y->data - by;
    if (ox != oy) return ox < oy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, char *err, size_t errlen)
{
    char path[4096];
    size_t n;
    char *text = file_read_all(path_join(path, sizeof path, src_dir, name), &n);
    if (!text && errno == ENOENT) return 0; /* absent: nothing to copy */
    if (!text) { errbuf_set(err, errlen, "%s: cannot read: %s", path, file_read_error(errno)); return -1; }
    path_join(path, sizeof path, dst_dir, name);
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(text, 1, n, f) != n;
    if (f) bad |= fclose(f) != 0;
    free(text);
    if (bad) { errbuf_set(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    return 1;
}

/* Why st is not a checkpoint quantize accepts (NULL if it is). */
static const char *already_quantized(const SafeTensors *st, char *why, size_t n)
{
    for (int i = 0; i < st->n_tensors; i++) {
        const StTensor *t = &st->tensors[i];
        const char *nm = t->name;
        size_t len = strlen(nm);
        int scale = strstr(nm, ".weight_scale") != NULL || (len > 12 && !strcmp(nm + len - 12, ".input_scale"));
        int q8 = t->dtype == DT_F8_E4M3 || t->dtype == DT_F8_E5M2 || t->dtype == DT_F4 || t->dtype == DT_F8_E8M0;
        int packed = t->dtype == DT_U8 && len > 7 && !strcmp(nm + len - 7, ".weight");
        if (scale || q8 || packed) {
            snprintf(why, n, "tensor '%s' is %s%s", nm, dtype_name(t->dtype), scale ? " (a quantization scale)" : "");
            return why;
        }
    }
    return NULL;
}

/* 1 when path does not exist or is an empty directory */
static int dir_is_empty_or_absent(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return errno == ENOENT;
    if (!S_ISDIR(sb.st_mode)) return 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* ---- public API ---- */

int cmd_quantize(int argc, char **argv)
{
    ModelOpts mo = {0};
    const char *out = NULL, *exclude = NULL;
    int shard_mb = 4096, threads = 0, force = 0;
    const OptSpec specs[] = {
        {.names = "--out", .type = OPT_STR, .dst = &out, .metavar = "DIR",
         .help = "where the NVFP4 checkpoint goes (required)"},
        {.names = "--exclude", .type = OPT_STR, .dst = &exclude, .metavar = "PATTERN,...",
         .help = "modules kept in BF16 besides the defaults (router, lm_head, ...)"},
        {.names = "--shard-mb", .type = OPT_INT, .dst = &shard_mb, .metavar = "N", .help = "MB per safetensors shard",
         .def = "4096", .lo = 1, .hi = 1 << 24},
        {.names = "--threads", .type = OPT_INT, .dst = &threads, .metavar = "N", .help = "CPU threads",
         .def = "every core",
         .lo = 1, .hi = 4096},
        {.names = "--force", .type = OPT_FLAG, .dst = &force, .help = "write into an --out that is not empty",
         .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("quantize", specs), model_opt_group(&mo, MODEL_OPT_DIR)};
    const OptCommand cmd = {.cmd = "quantize", .synopsis = "MODEL --out DIR [options]",
                            .about = "Write a ModelOpt NVFP4 checkpoint from a BF16 one (MODEL: a directory or a "
                                     "Hub id).",
                            .groups = groups, .n_groups = 2, .max_pos = 1, .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    if (!out) {
        fprintf(stderr, "error: quantize: --out is required\n");
        return 2;
    }
    const char *model = mo.dir, *revision = mo.revision;
    if (threads > 0) omp_set_num_threads(threads);
    model = model_dir_resolve("quantize", model, revision, 1);
    char err[1024], rm[4096], ro[4096];
    if (realpath(model, rm) && realpath(out, ro) && !strcmp(rm, ro))
        fatal("quantize: --out %s is the input checkpoint; write the NVFP4 checkpoint elsewhere", out);
    /* an earlier checkpoint (or anything else) at --out is not overwritten by accident */
    if (!force && !dir_is_empty_or_absent(out))
        fatal("quantize: --out %s exists and is not empty; give --force to write over it, or another --out", out);

    ModelConfig c;
    if (config_load(&c, model, err, sizeof err)) fatal("quantize: %s", err);
    QuantConfig in_q;
    if (quant_config_load(&in_q, model, err, sizeof err)) fatal("quantize: %s", err);
    if (in_q.algo != QALGO_NONE)
        fatal("quantize: %s is already quantized (%s: quant_algo %s); quantize reads BF16, F16 or F32 checkpoints",
              model, in_q.source, in_q.algo_name[0] ? in_q.algo_name : "?");
    quant_config_free(&in_q);
    SafeTensors st = {0};
    if (safetensors_open_dir(&st, model, err, sizeof err)) fatal("quantize: %s", err);
    char why[600];
    if (already_quantized(&st, why, sizeof why))
        fatal("quantize: %s is already quantized: %s; quantize reads BF16, F16 or F32 checkpoints", model, why);

    /* the plan: every tensor, in file order */
    const StTensor **order = xmalloc((size_t)(st.n_tensors ? st.n_tensors : 1) * sizeof *order);
    for (int i = 0; i < st.n_tensors; i++) order[i] = &st.tensors[i];
    sort_st = &st;
    qsort(order, (size_t)st.n_tensors, sizeof *order, cmp_file_order);
    CkptPlan plan = {0};
    for (int i = 0; i < st.n_tensors; i++)
        ckpt_plan_add(&plan, order[i]->name, order[i]->dtype, order[i]->ndim, order[i]->shape);
    QuantConfig q = {0};
    ckpt_default_excludes(&q, &c, &plan);
    if (exclude) ckpt_add_excludes(&q, exclude);
    int n_q = ckpt_plan_nvfp4(&plan, &q);
    if (n_q == 0) fatal("quantize: no linear of %s is left to quantize (every 2-D .weight is excluded)", model);

    uint64_t bytes = ckpt_plan_bytes(&plan);
    char b1[32], b2[32];
    printf("quantize: %s (%s), %d tensors, %d linears to NVFP4 -> %s, %s (%llu bytes) of tensors\n", model,
           c.architecture, st.n_tensors, n_q, out, ckpt_fmt_bytes((double)bytes, b1, sizeof b1),
           (unsigned long long)bytes);
    printf("quantize: excluded:");
    for (int i = 0; i < q.n_exclude; i++) printf(" %s", q.exclude[i]);
    printf("\n");
    fflush(stdout);

    int64_t avail = ckpt_free_bytes(out);
    uint64_t need = bytes + bytes / 100 + (16u << 20);
    if (avail >= 0 && (uint64_t)avail < need)
        fatal("quantize: %s: the checkpoint needs %s but the filesystem has only %s free", out,
              ckpt_fmt_bytes((double)need, b1, sizeof b1), ckpt_fmt_bytes((double)avail, b2, sizeof b2));
    struct stat sb;
    const int out_existed = stat(out, &sb) == 0;
    if (ckpt_mkdir(out, err, sizeof err)) fatal("quantize: %s", err);

    double t0 = clock_now();
    Source src = {.st = &st, .t = order};
    if (ckpt_write(&plan, out, (uint64_t)shard_mb << 20, source_fetch, &src, "quantize", err, sizeof err)) {
        if (!out_existed) rmdir(out); /* ckpt_write removed what it wrote: no half checkpoint, no new directory */
        fatal("quantize: %s", err);
    }
    double dt = clock_now() - t0;

    char path[4096];
    char *config_text = file_read_all(path_join(path, sizeof path, model, "config.json"), NULL);
    if (!config_text) fatal("quantize: cannot read %s: %s", path, file_read_error(errno));
    if (ckpt_write_nvfp4_configs(out, config_text, &q, err, sizeof err)) fatal("quantize: %s", err);
    free(config_text);
    for (size_t i = 0; i < sizeof copied_files / sizeof copied_files[0]; i++)
        if (copy_file(model, out, copied_files[i], err, sizeof err) < 0) fatal("quantize: %s", err);
    printf("quantize: wrote %s in %.1f s (%.1f M parameters/s, %d threads)\n", out, dt,
           ckpt_plan_params(&plan) / 1e6 / (dt > 0 ? dt : 1e-9), omp_get_max_threads());

    quant_config_free(&q);
    ckpt_plan_free(&plan);
    free(order);
    safetensors_free(&st);
    return 0;
}
