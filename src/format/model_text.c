/* model_text: tokenizer, chat template, eos ids and sampling defaults of a model directory
 * (model_text.h). */
#include "model_text.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"

static void add_eos(ModelText *t, int id)
{
    if (id < 0 || model_text_is_eos(t, id) || t->n_eos == MODEL_TEXT_MAX_EOS) return;
    t->eos_ids[t->n_eos++] = id;
}

/* One default from generation_config.json, kept only if the sampler takes it: a value out of
 * range there would otherwise make every request that relies on the defaults fail, blaming the
 * request. */
static void take_default(SamplingParams *p, const char *path, const char *key, float *field, double v)
{
    float was = *field;
    *field = (float)v;
    const char *why = sampling_params_check(p);
    if (why) {
        *field = was;
        log_warn("%s: %s = %g ignored (%s); the default stays %g", path, key, v, why, was);
    }
}

/* generation_config.json: temperature, top_p, top_k, repetition_penalty, do_sample and
 * eos_token_id, when present; a file that is there but not JSON, and values the sampler refuses,
 * are named in a warning and left out (vLLM reads the file the same way, when it reads) */
static void read_generation_config(ModelText *t, const char *dir)
{
    char path[4200];
    path_join(path, sizeof path, dir, "generation_config.json");
    char err[400];
    json_t *g = file_read_json(path, 0, err, sizeof err);
    if (!g) {
        if (access(path, F_OK) == 0) log_warn("%s: not read (%s); the sampling defaults are moeserve's", path, err);
        return;
    }
    SamplingParams *p = &t->defaults;
    json_t *v;
    if ((v = json_object_get(g, "temperature")) && json_is_number(v)) take_default(p, path, "temperature", &p->temperature, json_number_value(v));
    if ((v = json_object_get(g, "top_p")) && json_is_number(v)) take_default(p, path, "top_p", &p->top_p, json_number_value(v));
    if ((v = json_object_get(g, "top_k")) && json_is_integer(v)) {
        json_int_t k = json_integer_value(v);
        if (k >= -1 && k <= INT32_MAX) p->top_k = (int)k;
        else log_warn("%s: top_k = %lld ignored (top_k must be -1, 0 (off) or positive); the default stays %d", path, (long long)k, p->top_k);
    }
    if ((v = json_object_get(g, "repetition_penalty")) && json_is_number(v))
        take_default(p, path, "repetition_penalty", &p->repetition_penalty, json_number_value(v));
    if ((v = json_object_get(g, "do_sample")) && json_is_false(v)) p->temperature = 0;
    v = json_object_get(g, "eos_token_id");
    if (json_is_integer(v)) add_eos(t, (int)json_integer_value(v));
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
        if (json_is_integer(json_array_get(v, i))) add_eos(t, (int)json_integer_value(json_array_get(v, i)));
    json_decref(g);
}

void model_text_open(ModelText *t, const char *dir, const int *cfg_eos, int n_cfg_eos)
{
    memset(t, 0, sizeof *t);
    char err[1024];
    t->tok = tokenizer_load(dir, err, sizeof err);
    if (!t->tok) fatal("%s", err);
    t->chat = chat_template_load(dir, t->chat_err, sizeof t->chat_err);
    int bos = tokenizer_bos_id(t->tok), eos = tokenizer_eos_id(t->tok);
    t->bos = bos >= 0 && tokenizer_token(t->tok, bos) ? tokenizer_token(t->tok, bos) : "";
    t->eos = eos >= 0 && tokenizer_token(t->tok, eos) ? tokenizer_token(t->tok, eos) : "";
    for (int i = 0; i < n_cfg_eos; i++) add_eos(t, cfg_eos[i]);
    add_eos(t, eos);
    sampling_params_default(&t->defaults);
    read_generation_config(t, dir);
}

int model_text_use_template(ModelText *t, const char *arg, char *err, size_t errlen)
{
    size_t len;
    int e = 0;
    char *text = file_read_all(arg, &len);
    if (!text) {
        e = errno;
        /* vLLM also takes the template itself on the command line */
        if (!strstr(arg, "{%") && !strstr(arg, "{{")) {
            errbuf_set(err, errlen, "--chat-template %s: cannot read it: %s", arg, file_read_error(e));
            return -1;
        }
        text = xstrdup(arg);
    }
    char why[512];
    ChatTemplate *c = chat_template_parse(text, why, sizeof why);
    free(text);
    if (!c) {
        errbuf_set(err, errlen, "--chat-template %s: %s", e ? "(the text given)" : arg, why);
        return -1;
    }
    if (t->chat) chat_template_free(t->chat);
    t->chat = c;
    return 0;
}

void model_text_free(ModelText *t)
{
    tokenizer_free(t->tok);
    if (t->chat) chat_template_free(t->chat);
    memset(t, 0, sizeof *t);
}

int model_text_render(const ModelText *t, json_t *messages, json_t *tools, json_t *kwargs, int add_generation_prompt,
                      char **out, char *err, size_t errlen)
{
    size_t len;
    return model_text_render_n(t, messages, tools, kwargs, add_generation_prompt, out, &len, err, errlen);
}

int model_text_render_n(const ModelText *t, json_t *messages, json_t *tools, json_t *kwargs, int add_generation_prompt,
                        char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (!t->chat) {
        errbuf_set(err, errlen, "this model has no chat template (%s)", t->chat_err);
        return -1;
    }
    return chat_template_render_n(t->chat, messages, tools, add_generation_prompt, kwargs, t->bos, t->eos, out, len, err,
                                  errlen);
}

int model_text_is_eos(const ModelText *t, int id)
{
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 1;
    return 0;
}
