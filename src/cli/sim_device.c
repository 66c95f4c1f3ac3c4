/* sim_device: what --device sim:GPU needs from the command layer (cli.h): the modelled devices'
 * timers, and the ids a simulated draw may give.
 *
 * STAND-IN: the timer below is a plain roofline from a few numbers per device, in place of the
 * cost model (src/cost/, `plan`), which replaces it: cli_sim_timer then fills SimTimer with
 * cost_op_seconds / cost_comm_seconds and the cost model's device profiles (names or files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/sim/sim.h"
#include "../base/util.h"
#include "../format/model_text.h"
#include "cli.h"

typedef struct {
    const char *name, *title;
    double bw;         /* memory bandwidth, bytes/s */
    double bf16;       /* dense BF16 tensor rate, FLOP/s */
    double fp32;       /* CUDA-core FP32 rate, FLOP/s (the elementwise ops) */
    double mem;        /* memory, bytes */
    double link_bw;    /* NVLink, bytes/s a rank sends */
    double link_s;     /* a collective's fixed cost, s */
} RoofDevice;

/* H200: 4.42e12 B/s, 798e12 BF16 FLOP/s, 141e9 bytes; H100 SXM: 3.35e12 B/s, 80e9 bytes and about
 * 760e12 BF16 FLOP/s (an estimate); 67e12 FP32 FLOP/s on both; NVLink 4: 450e9 B/s and 5 us. */
static const RoofDevice roof_devices[] = {
    {"h200", "H200 (stand-in roofline)", 4.42e12, 798e12, 67e12, 141e9, 450e9, 5e-6},
    {"h100", "H100 (stand-in roofline)", 3.35e12, 760e12, 67e12, 80e9, 450e9, 5e-6},
};

/* Every kernel, however small, takes about this long on the device. */
#define ROOF_KERNEL_S 2e-6

static double roof_op_seconds(void *ctx, OpId op, double flops, double bytes, int rows, QFormat wfmt)
{
    const RoofDevice *d = ctx;
    (void)rows;
    double rate;
    switch (op_category(op)) {
    case CAT_GEMM: case CAT_MOE: case CAT_ATTENTION: case CAT_INDEXER:
        /* FP8 weights run on the FP8 tensor cores (twice BF16); NVFP4 on Hopper is W4A16: BF16 */
        rate = wfmt == QF_FP8 || wfmt == QF_FP8_BLOCK ? 2 * d->bf16 : d->bf16;
        break;
    default:
        rate = d->fp32;
    }
    double t = flops / rate, m = bytes / d->bw;
    return (t > m ? t : m) + ROOF_KERNEL_S;
}

static double roof_comm_seconds(void *ctx, OpId op, double bytes, int ranks)
{
    const RoofDevice *d = ctx;
    (void)op, (void)ranks;
    return d->link_s + bytes / d->link_bw;
}

int cli_sim_timer(const char *spec, SimTimer *t, char *err, size_t errlen)
{
    char known[128] = "";
    for (size_t i = 0; i < sizeof roof_devices / sizeof roof_devices[0]; i++) {
        const RoofDevice *d = &roof_devices[i];
        if (!strcmp(spec, d->name)) {
            *t = (SimTimer){.op_seconds = roof_op_seconds, .comm_seconds = roof_comm_seconds, .ctx = (void *)d,
                            .mem_bytes = d->mem, .name = d->title};
            return 0;
        }
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", d->name);
    }
    errbuf_set(err, errlen, "no modelled device '%s' (known: %s)", spec, known);
    return -1;
}

void cli_sim_tokens(Backend *be, const ModelText *mt, int vocab)
{
    if (!backend_is_sim(be)) return;
    int n = tokenizer_vocab_size(mt->tok), k = 0;
    if (n > vocab) n = vocab;
    int *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int id = 0; id < n; id++) {
        int eos = 0;
        for (int e = 0; e < mt->n_eos; e++) eos |= mt->eos_ids[e] == id;
        if (eos || tokenizer_is_special(mt->tok, id) || !tokenizer_token(mt->tok, id)) continue;
        /* alone it decodes to text: not empty, no piece of a UTF-8 sequence (U+FFFD) */
        char *text = NULL;
        size_t len = 0;
        tokenizer_decode(mt->tok, &id, 1, 0, &text, &len);
        if (len > 0 && !strstr(text, "\xEF\xBF\xBD")) ids[k++] = id;
        free(text);
    }
    if (k == 0) log_warn("sim: no token of the tokenizer decodes alone to text; draws are plain ids");
    sim_set_tokens(be, ids, k, mt->n_eos > 0 ? mt->eos_ids[0] : -1, vocab);
    free(ids);
}
