/* model_opts: where a command's model comes from and where it runs: --model (a directory, or a
 * Hub id resolved into the cache), --dummy-weights, --kv-cache-dtype, the layout options; the
 * model loaded for this rank, put where the backend reads it, and a worker rank's loop
 * (model_opts.h). */
#include "model_opts.h"
#include <jansson.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/util.h"
#include "../format/config.h"
#include "../hub/hub.h"
#include "forward.h"
#include "mtp.h"

const char *model_dir_resolve(const char *cmd, const char *arg, const char *revision, int weights)
{
    static char *kept[8]; /* the resolved directories live as long as the command */
    static int n_kept;
    (void)kept;
    if (!arg) return NULL;
    char dir[4096], err[4096];
    int r = hub_resolve(arg, revision, weights, dir, sizeof dir, err, sizeof err);
    if (r < 0) fatal("%s: %s", cmd, err);
    if (r == 0) return arg;
    char *d = xstrdup(dir);
    if (n_kept < 8) kept[n_kept++] = d;
    return d;
}

void model_on_backend(Model *dev, const Model *host, Backend *be)
{
    if (be->host_memory && !host->dummy) {
        *dev = *host;
        dev->cfg.kv_dtype = model_kv_dtype(&host->cfg, 1);
        return;
    }
    model_upload(dev, host, be);
}

void model_on_backend_free(Model *dev, Backend *be)
{
    if (!dev->dev_buffer) return; /* the host model itself: it owns everything */
    model_upload_free(dev, be);
}

static int take_kv_dtype(const char *v, void *dst, char *err, size_t errlen)
{
    if (model_kv_dtype_parse(v, dst) == 0) return 0;
    errbuf_set(err, errlen, "'%s' is not one of %s", v, MODEL_KV_DTYPES);
    return -1;
}

/* vLLM's --load-format: dummy is --dummy-weights; the checkpoints moeserve reads are safetensors */
static int take_load_format(const char *v, void *dst, char *err, size_t errlen)
{
    if (!strcmp(v, "dummy")) *(int *)dst = 1;
    else if (!strcmp(v, "auto") || !strcmp(v, "safetensors")) *(int *)dst = 0;
    else {
        errbuf_set(err, errlen,
        "'%s': moeserve reads safetensors checkpoints (auto, safetensors) or makes random weights "
                   "(dummy)", v);
        return -1;
    }
    return 0;
}

OptGroup model_opt_group(ModelOpts *o, int which)
{
    const OptSpec all[] = {
        {.names = "--model|--model-path", .type = OPT_STR, .dst = &o->dir, .metavar = "DIR|ORG/NAME",
         .help = "the model: a directory, or a Hugging Face Hub id fetched into the cache (or the first argument)"},
        {.names = "--revision", .type = OPT_STR, .dst = &o->revision, .metavar = "REV",
         .help = "the Hub revision of ORG/NAME: a branch, tag or commit", .def = "main"},
        {.names = "--dummy-weights", .type = OPT_FLAG, .dst = &o->dummy,
         .help = "random weights from the model's config.json alone (for timing)", .def = "off"},
        {.names = "--load-format", .type = OPT_FN, .dst = &o->dummy, .metavar = "auto|dummy",
         .help = "dummy is --dummy-weights", .def = "auto", .fn = take_load_format},
        {.names = "--dummy-quant", .type = OPT_STR, .dst = &o->dummy_quant, .metavar = "nvfp4|fp8|bf16",
         .help = "the format of --dummy-weights", .def = "nvfp4"},
        {.names = "--num-layers", .type = OPT_INT, .dst = &o->num_layers, .metavar = "N",
         .help = "with --dummy-weights: the first N layers only", .def = "the config's", .lo = 1,
         .hi = MODEL_MAX_LAYERS},
        {.names = "--quantization|-q", .type = OPT_STR, .dst = &o->quantization, .metavar = "NAME",
         .help = "the checkpoint's quantization, checked against it: modelopt_fp4, fp8 or none",
         .def = "the checkpoint's"},
        {.names = "--trust-remote-code", .type = OPT_NOTE,
         .help = "moeserve runs its own code for the architectures it knows"},
        {.names = "--dtype", .type = OPT_NOTE, .metavar = "TYPE",
         .help = "activations are float32 on the CPU and the kernels' own types on the GPU"},
        {.names = "--kv-cache-dtype", .type = OPT_FN, .dst = &o->kv_dtype, .metavar = "auto|float32|bf16|fp8",
         .help = "the KV cache's element type (auto: fp8 when the checkpoint asks, else bf16 on a GPU, float32 on "
                 "the CPU)",
         .def = "auto", .fn = take_kv_dtype},
    };
    static OptSpec kept[sizeof all / sizeof all[0]];
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        int w = i < 2 ? MODEL_OPT_DIR : i < 9 ? MODEL_OPT_WEIGHTS : MODEL_OPT_KV;
        if (which & w) kept[n++] = all[i];
    }
    return (OptGroup){"model", kept, n};
}

void model_opt_positional(ModelOpts *o, const char *cmd, const char *pos, int required)
{
    if (pos && o->dir) {
        fprintf(stderr, "error: %s: the model is given twice ('%s' and --model %s)\n", cmd, pos, o->dir);
        exit(2);
    }
    if (pos) o->dir = pos;
    if (!o->dir && required) {
        fprintf(stderr,
        "error: %s: a model is required: moeserve %s MODEL (a directory or a Hub id ORG/NAME), or --model\n",
                cmd, cmd);
        exit(2);
    }
}

/* what a --quantization names: 'n' NVFP4, '8' FP8, '0' none, 0 unknown */
static char quant_kind(const char *s)
{
    static const char *const nv[] = {"modelopt_fp4", "nvfp4", "modelopt_nvfp4", "fp4"};
    static const char *const f8[] = {"fp8", "modelopt", "modelopt_fp8"};
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) if (!strcasecmp(s, nv[i])) return 'n';
    for (size_t i = 0; i < sizeof f8 / sizeof f8[0]; i++) if (!strcasecmp(s, f8[i])) return '8';
    if (!strcasecmp(s, "none") || !strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) return '0';
    return 0;
}

int model_quant_check(const char *dir, const ModelOpts *o, char *err, size_t errlen)
{
    const char *want = o->quantization;
    if (!want) return 0;
    char k = quant_kind(want);
    if (!k) {
        errbuf_set(err, errlen,
        "--quantization %s: moeserve runs ModelOpt NVFP4 (modelopt_fp4), FP8 (fp8) and unquantized "
                   "(none) checkpoints", want);
        return -1;
    }
    char have = 0;
    const char *what;
    char desc[96];
    if (o->dummy) {
        const char *q = o->dummy_quant ? o->dummy_quant : "nvfp4";
        have = !strcmp(q, "nvfp4") ? 'n' : !strcmp(q, "fp8") ? '8' : '0';
        snprintf(desc, sizeof desc, "--dummy-weights are %s (--dummy-quant)", q);
        what = desc;
    } else {
        QuantConfig q;
        char e[512];
        if (quant_config_load(&q, dir, e, sizeof e)) return errbuf_set(err, errlen, "%s", e), -1;
        have = q.algo == QALGO_NVFP4 || q.algo == QALGO_W4A16_NVFP4 ? 'n'
               : q.algo == QALGO_FP8 || q.algo == QALGO_FP8_BLOCK ? '8' : q.algo == QALGO_NONE ? '0' : 'm';
        if (q.algo == QALGO_NONE) snprintf(desc, sizeof desc, "the checkpoint is not quantized");
        else snprintf(desc, sizeof desc, "the checkpoint is %s (%s)", q.algo_name, q.source);
        what = desc;
        quant_config_free(&q);
        if (have == 'm' && k != '0') return 0; /* mixed precision: NVFP4 and FP8 modules alike */
    }
    if (k == have) return 0;
    if (have == '0')
        errbuf_set(err, errlen,
        "--quantization %s: %s, and moeserve does not quantize at load time (moeserve quantize writes "
                   "an NVFP4 checkpoint); leave --quantization out", want, what);
    else
        errbuf_set(err, errlen,
        "--quantization %s: %s; moeserve runs a checkpoint in the format it was saved in: leave "
                   "--quantization out, or give %s", want, what,
                   have == 'n' ? "modelopt_fp4" : have == '8' ? "fp8" : "its own");
    return -1;
}

void model_open(Model *m, const ModelOpts *o)
{
    void (*shard)(ModelConfig *, void *) = dist_get() ? dist_shard : NULL;
    void *par = (void *)&o->par;
    char err[1024];
    if (model_quant_check(o->dir, o, err, sizeof err) < 0) fatal("%s", err);
    if (!o->dummy) {
        if (o->dummy_quant || o->num_layers) fatal("--dummy-quant and --num-layers go with --dummy-weights");
        model_load_shard(m, o->dir, shard, par);
        m->cfg.kv_dtype = o->kv_dtype;
        if (o->spec.k > 0) model_load_mtp(m, o->dir);
        return;
    }
    const char *q = o->dummy_quant ? o->dummy_quant : "nvfp4";
    QFormat fmt = !strcmp(q, "nvfp4") ? QF_NVFP4 : !strcmp(q, "fp8") ? QF_FP8 : !strcmp(q, "bf16") ? QF_BF16 : QF_COUNT;
    if (fmt == QF_COUNT) fatal("--dummy-quant '%s': expected nvfp4, fp8 or bf16", q);
    model_load_dummy_shard(m, o->dir, fmt, o->num_layers, shard, par);
    m->cfg.kv_dtype = o->kv_dtype;
    if (o->spec.k > 0) model_load_mtp(m, o->dir);
}

void model_opt_device(ModelOpts *o, const char *device)
{
    if (device && !strncmp(device, "sim:", 4)) o->dummy = 1;
}

const char *model_dist_start(ModelOpts *o, const char *device) { return dist_setup(&o->par, device); }

int model_worker(const Model *dm, Backend *be)
{
    Dist *d = dist_get();
    if (!d || d->rank == 0) return 0;
    sigset_t none; /* a command may have blocked them for its own sigwait (serve) */
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    if (dist_under_mpirun()) { /* mpirun passes a Ctrl-C or SIGTERM to every rank: rank 0 drains, then stops us */
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
    }
    forward_worker(dm, be);
    return 1;
}

void model_opt_parse(const OptCommand *c, int argc, char **argv, ModelOpts *o, int required)
{
    const char *pos = NULL;
    int n_pos = 0;
    opt_parse(c, argc, argv, &pos, &n_pos);
    model_opt_positional(o, c->cmd, n_pos ? pos : NULL, required);
    char err[512];
    if (spec_opts_resolve(&o->spec, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s: %s\n", c->cmd, err);
        exit(2);
    }
}

/* the drafters moeserve has: the checkpoint's own MTP layer, under the names vLLM and SGLang give it */
static int spec_method_is_mtp(const char *m)
{
    static const char *const names[] = {"mtp", "deepseek_mtp", "glm4_moe_mtp", "nextn", "eagle"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(m, names[i])) return 1;
    return 0;
}

/* --speculative-config JSON (vLLM's): {"method": "mtp", "num_speculative_tokens": K}; a method that
 * drafts with another model or by n-grams is refused, other keys are vLLM's tuning and ignored */
static int take_spec_config(const char *v, void *dst, char *err, size_t errlen)
{
    SpecOpts *o = dst;
    json_error_t je;
    json_t *j = json_loads(v, 0, &je);
    if (!j || !json_is_object(j)) {
        errbuf_set(err, errlen, "expected a JSON object such as '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'%s%s",
                   j ? "" : ": ", j ? "" : je.text);
        json_decref(j);
        return -1;
    }
    json_t *m = json_object_get(j, "method"), *k = json_object_get(j, "num_speculative_tokens");
    json_t *dv = json_object_get(j, "draft_vocab_size");
    int rc = -1;
    if (m && (!json_is_string(m) || !spec_method_is_mtp(json_string_value(m))))
        errbuf_set(err, errlen, "method %s: moeserve drafts with the checkpoint's own MTP layer only (\"mtp\")",
                   json_is_string(m) ? json_string_value(m) : "(not a string)");
    else if (json_object_get(j, "model"))
        errbuf_set(err, errlen, "\"model\": moeserve drafts with the checkpoint's own MTP layer, not another model");
    else if (!json_is_integer(k) || json_integer_value(k) < 1 || json_integer_value(k) > MTP_MAX_DRAFTS)
        errbuf_set(err, errlen, "num_speculative_tokens must be an integer in [1, %d]", MTP_MAX_DRAFTS);
    else if (dv && (!json_is_integer(dv) || json_integer_value(dv) < 1 || json_integer_value(dv) > (1 << 24)))
        errbuf_set(err, errlen, "draft_vocab_size must be a positive integer (the drafter's first token ids)");
    else {
        o->config_k = (int)json_integer_value(k);
        o->draft_vocab = dv ? (int)json_integer_value(dv) : 0;
        rc = 0;
    }
    json_decref(j);
    return rc;
}

/* --speculative-algorithm (SGLang's): NEXTN, or EAGLE and MTP, which SGLang runs the MTP layer under */
static int take_spec_algo(const char *v, void *dst, char *err, size_t errlen)
{
    if (!spec_method_is_mtp(v)) {
        errbuf_set(err, errlen, "'%s': moeserve drafts with the checkpoint's own MTP layer: NEXTN (or EAGLE, MTP)", v);
        return -1;
    }
    *(int *)dst = 1;
    return 0;
}

OptGroup spec_opt_group(SpecOpts *o)
{
    OPT_GROUP_RETURN("speculative decoding",
        {.names = "--speculative-config", .type = OPT_FN, .dst = o, .metavar = "JSON",
         .help = "draft with the checkpoint's MTP layer: '{\"method\":\"mtp\",\"num_speculative_tokens\":K}' (and "
                 "moeserve's \"draft_vocab_size\":N: drafts among the first N token ids only)",
         .def = "off", .fn = take_spec_config},
        {.names = "--speculative-algorithm", .type = OPT_FN, .dst = &o->algo, .metavar = "NEXTN",
         .help = "the same, SGLang's spelling (NEXTN; EAGLE and MTP are taken as NEXTN)", .def = "off",
         .fn = take_spec_algo},
        {.names = "--speculative-num-steps", .type = OPT_INT, .dst = &o->steps, .metavar = "K",
         .help = "with --speculative-algorithm: drafts per step", .def = "3", .lo = 1, .hi = MTP_MAX_DRAFTS},
        {.names = "--speculative-eagle-topk", .type = OPT_NOTE, .metavar = "N",
         .help = "drafts are one chain (top 1)"},
        {.names = "--speculative-num-draft-tokens", .type = OPT_NOTE, .metavar = "N",
         .help = "a chain verifies --speculative-num-steps drafts and the token after them"});
}

int spec_opts_resolve(SpecOpts *o, char *err, size_t errlen)
{
    if (o->steps && !o->algo) {
        errbuf_set(err, errlen, "--speculative-num-steps goes with --speculative-algorithm NEXTN");
        return -1;
    }
    int sg = o->algo ? (o->steps ? o->steps : 3) : 0;
    if (o->config_k && sg && o->config_k != sg) {
        errbuf_set(err, errlen, "--speculative-config asks for %d drafts a step and --speculative-num-steps for %d",
                   o->config_k, sg);
        return -1;
    }
    o->k = o->config_k ? o->config_k : sg;
    return 0;
}
