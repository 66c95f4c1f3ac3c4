/* fuzz_config: a config.json text through config_parse (then the sizes derived from an accepted
 * config: KV width, indexer width, parameter counts), and the same text as the checkpoint's
 * quantization description through quant_config_load (config.json's quantization_config, and as
 * hf_quant_config.json), whose exclude patterns are then matched against module names. */
#include "fuzz.h"

#include <sys/stat.h>

#include "base/util.h"
#include "format/config.h"
#include "model/model.h"

static char dir_cfg[64], dir_hf[64];

static void put(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) { perror(path); abort(); }
}

static void quant(const char *dir)
{
    QuantConfig q;
    memset(&q, 0, sizeof q);
    char err[1024];
    err[0] = 0;
    if (quant_config_load(&q, dir, err, sizeof err) != 0) {
        FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "quantization config refused without a message");
        quant_config_free(&q);
        return;
    }
    static const char *modules[] = {"lm_head", "model.layers.0.mlp.gate", "model.layers.3.self_attn.q_proj",
                                    "model.layers.12.mlp.experts.7.up_proj", "model.embed_tokens", ""};
    for (size_t i = 0; i < sizeof modules / sizeof *modules; i++) (void)quant_config_excluded(&q, modules[i]);
    quant_config_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir_cfg[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir_cfg, sizeof dir_cfg, "%s/fuzz-config-XXXXXX", base);
        snprintf(dir_hf, sizeof dir_hf, "%s/fuzz-config-XXXXXX", base);
        if (!mkdtemp(dir_cfg) || !mkdtemp(dir_hf)) { perror("fuzz: mkdtemp"); abort(); }
        put(dir_hf, "config.json", (const uint8_t *)"{}", 2);
    }
    char *text = fuzz_cstr(data, size);
    ModelConfig c;
    memset(&c, 0, sizeof c);
    char err[1024];
    err[0] = 0;
    if (config_parse(&c, text, "config.json", err, sizeof err) == 0) {
        FUZZ_CHECK(c.n_layers >= 0 && c.n_layers <= MODEL_MAX_LAYERS, "%d layers", c.n_layers);
        (void)model_kv_width(&c);
        (void)model_index_width(&c);
        ParamCount pc;
        model_count_params(&c, &pc);
    } else {
        FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "refused without a message");
    }
    free(text);
    put(dir_cfg, "config.json", data, size);
    quant(dir_cfg);
    put(dir_hf, "hf_quant_config.json", data, size);
    quant(dir_hf);
    return 0;
}
