/* sim_device: what --device sim:GPU needs from the command layer (cli.h): the modelled device's
 * timer, from the cost model's device and link profiles (src/cost/: a built-in name or a file, as
 * `plan --gpu` takes them), and the ids a simulated draw may give. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/sim/sim.h"
#include "../base/util.h"
#include "../cost/cost.h"
#include "../format/model_text.h"
#include "cli.h"

/* A modelled device: its profile and the link between such cards (the profile's default_link), as
 * plan reads them, so that a simulated run and plan's prediction share one cost model. */
typedef struct {
    CostDevice dev;
    CostLink link;
    char title[320];
} SimCost;

static double sim_cost_op(void *ctx, OpId op, double flops, double bytes, int rows, QFormat wfmt)
{
    return cost_op_seconds(&((SimCost *)ctx)->dev, op, flops, bytes, rows, wfmt);
}

static double sim_cost_comm(void *ctx, OpId op, double bytes, int ranks)
{
    return cost_comm_seconds(&((SimCost *)ctx)->link, op, bytes, ranks);
}

int cli_sim_timer(const char *spec, SimTimer *t, char *err, size_t errlen)
{
    SimCost *s = xcalloc(1, sizeof *s); /* lives as long as the backend: the process */
    char why[512];
    if (cost_device_load(&s->dev, spec, why, sizeof why) < 0) {
        errbuf_set(err, errlen, "%s", why);
        free(s);
        return -1;
    }
    if (!s->dev.gpu) {
        errbuf_set(err, errlen, "%s is a CPU's profile; a modelled device is a GPU (run the CPU as itself)",
                   spec);
        free(s);
        return -1;
    }
    const char *link = s->dev.default_link[0] ? s->dev.default_link : "nvlink4";
    if (cost_link_load(&s->link, link, why, sizeof why) < 0) {
        errbuf_set(err, errlen, "its link %s: %s", link, why);
        free(s);
        return -1;
    }
    snprintf(s->title, sizeof s->title, "%s (modelled: %s, %s)", s->dev.name, s->dev.description, s->link.name);
    *t = (SimTimer){.op_seconds = sim_cost_op, .comm_seconds = sim_cost_comm, .ctx = s, .mem_bytes = s->dev.memory_bytes,
                    .step_seconds = s->dev.step_us * 1e-6, .reserve_bytes = s->dev.reserve_bytes, .name = s->title};
    return 0;
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
