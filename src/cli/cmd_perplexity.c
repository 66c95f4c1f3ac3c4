/* cmd_perplexity: `moeserve perplexity --model DIR --text-file F [--ctx N] [--max-windows N]`
 * reports held-out perplexity: the text is encoded (no special tokens added), cut into
 * consecutive windows of N tokens, each evaluated on its own from an empty cache; every
 * position but a window's first predicts the next token; perplexity = exp(mean NLL).
 * tools/perplexity_ref.py computes the same with transformers. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../engine/runner.h"
#include "../format/tokenizer.h"
#include "../dist/dist.h"
#include "cli.h"

int cmd_perplexity(int argc, char **argv)
{
    ModelOpts mo = {0};
    DeviceOpts dev = {0};
    const char *file = NULL;
    int ctx = 512, max_windows = 0, as_json = 0;
    const OptSpec specs[] = {
        {.names = "--text-file", .type = OPT_STR, .dst = &file, .metavar = "FILE",
         .help = "the text to evaluate (required)"},
        {.names = "--ctx", .type = OPT_INT, .dst = &ctx, .metavar = "N", .help = "tokens of a window", .def = "512",
         .lo = 2,
         .hi = 1 << 20},
        {.names = "--max-windows", .type = OPT_INT, .dst = &max_windows, .metavar = "N",
         .help = "windows at most (0: all)",
         .def = "0", .lo = 0, .hi = 1 << 30},
        {.names = "--json", .type = OPT_FLAG, .dst = &as_json, .help = "one JSON object instead of the text line",
         .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("perplexity", specs), model_opt_group(&mo, MODEL_OPT_ALL),
    par_opt_group(&mo.par),
                               device_opt_group(&dev)};
    const OptCommand cmd = {.cmd = "perplexity", .synopsis = "MODEL --text-file FILE [options]",
                            .about = "Held-out perplexity of a text, in consecutive windows of --ctx tokens.",
                            .groups = groups, .n_groups = (int)(sizeof groups / sizeof groups[0]), .max_pos = 1,
                            .pos_name = "MODEL"};
    model_opt_parse(&cmd, argc, argv, &mo, 1);
    if (!file) {
        fprintf(stderr, "error: perplexity: --text-file is required\n");
        return 2;
    }
    const char *dir = mo.dir = model_dir_resolve("perplexity", mo.dir, mo.revision, !mo.dummy);
    size_t len;
    char *text = file_read_all(file, &len);
    if (!text) fatal("perplexity: cannot read %s: %s", file, file_read_error(errno));
    char err[1024];
    const char *device = model_dist_start(&mo, dev.device);
    Model m;
    model_open(&m, &mo);
    if (ctx > m.cfg.max_position) fatal("perplexity: --ctx %d exceeds the context length %d", ctx, m.cfg.max_position);
    Tokenizer *tok = tokenizer_load(dir, err, sizeof err);
    if (!tok) fatal("%s", err);
    int *ids;
    int n = tokenizer_encode(tok, text, len, 0, &ids, err, sizeof err);
    if (n < 0) fatal("perplexity: %s", err);
    if (n < 2) fatal("perplexity: %s encodes to %d tokens; at least 2 are needed", file, n);
    for (int i = 0; i < n; i++)
        if (ids[i] >= m.cfg.vocab) fatal("perplexity: token %d is outside the model's vocabulary (%d)", ids[i], m.cfg.vocab);

    Backend be;
    backend_open(&be, device, dev.threads);
    Model dm;
    model_on_backend(&dm, &m, &be);
    if (model_worker(&dm, &be)) { /* rank 0 prints; this rank repeats its steps */
        model_on_backend_free(&dm, &be);
        backend_free(&be);
        dist_shutdown();
        return 0;
    }
    int chunk = ctx < 512 ? ctx : 512;
    Runner run;
    runner_init(&run, &dm, &be, ctx, chunk, 16);
    int V = m.cfg.vocab;
    float *logits = xmalloc((size_t)ctx * V * sizeof(float));
    double nll = 0;
    long count = 0;
    int windows = 0;
    double t0 = clock_now();
    for (int w0 = 0; w0 + 1 < n; w0 += ctx) {
        if (max_windows && windows == max_windows) break;
        int wn = n - w0 < ctx ? n - w0 : ctx;
        if (wn < 2) break;
        runner_reset(&run);
        runner_feed(&run, ids + w0, wn, 1, logits);
        for (int i = 0; i + 1 < wn; i++) {
            const float *l = logits + (size_t)i * V;
            float mx = l[0];
            for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
            double s = 0;
            for (int v = 0; v < V; v++) s += exp((double)l[v] - mx);
            nll += mx + log(s) - l[ids[w0 + i + 1]];
            count++;
        }
        windows++;
    }
    double secs = clock_now() - t0, ppl = exp(nll / count);
    const char *kvd = model_kv_dtype_name(run.kv.dtype);
    if (as_json)
        out_printf("{\"perplexity\": %.6f, \"nll\": %.8f, \"tokens\": %ld, \"windows\": %d, \"ctx\": %d, "
                   "\"seconds\": %.3f, \"kv_cache_dtype\": \"%s\"}\n",
                   ppl, nll / count, count, windows, ctx, secs, kvd);
    else
        printf("perplexity %.4f (mean NLL %.5f nats) over %ld predicted tokens in %d windows of up to %d; %.1f tok/s on %s, "
               "KV cache %s\n",
               ppl, nll / count, count, windows, ctx, (count + windows) / secs, be.name, kvd);

    free(logits);
    free(ids);
    free(text);
    runner_free(&run);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    tokenizer_free(tok);
    model_free(&m);
    dist_shutdown();
    return 0;
}
