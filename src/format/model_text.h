/* model_text: the text side of a model directory, shared by `generate` and `serve`: the
 * tokenizer, the chat template (optional), the end-of-sequence ids (config.json, the
 * tokenizer's eos, generation_config.json) and the sampling defaults of generation_config.json
 * (temperature, top_p, top_k, repetition_penalty, do_sample), which a request's own values
 * override, as in vLLM. */
#ifndef MOESERVE_MODEL_TEXT_H
#define MOESERVE_MODEL_TEXT_H

#include <jansson.h>
#include <stddef.h>

#include "sampling_params.h"
#include "chat_template.h"
#include "tokenizer.h"

#define MODEL_TEXT_MAX_EOS 24

typedef struct {
    Tokenizer *tok;
    ChatTemplate *chat;        /* NULL when the model has none (chat_err says why) */
    char chat_err[512];
    const char *bos, *eos;     /* the special token strings the template sees ("" when none); borrowed from tok */
    int eos_ids[MODEL_TEXT_MAX_EOS], n_eos; /* every id that ends a generation */
    SamplingParams defaults;   /* sampling_params_default, then generation_config.json */
} ModelText;

/* Load from dir; cfg_eos are the eos ids of config.json. A missing or broken tokenizer is
 * fatal (a start-up error); a missing chat template is not (chat is NULL). */
void model_text_open(ModelText *t, const char *dir, const int *cfg_eos, int n_cfg_eos);
void model_text_free(ModelText *t);
/* The chat template of --chat-template instead of the model's: arg is a file, or (holding "{%" or
 * "{{") the template itself. 0, or -1 with err naming the file and what is wrong with it. */
int model_text_use_template(ModelText *t, const char *arg, char *err, size_t errlen);
/* Render messages (and tools, kwargs: NULL or JSON) through the chat template with the
 * generation prompt; returns 0 with *out malloc'ed, or -1 with err set (no template, or the
 * template's own error). */
int model_text_render(const ModelText *t, json_t *messages, json_t *tools, json_t *kwargs, int add_generation_prompt,
                      char **out, char *err, size_t errlen);
/* The same with the text's length (a message may hold a NUL, which the text keeps). */
int model_text_render_n(const ModelText *t, json_t *messages, json_t *tools, json_t *kwargs, int add_generation_prompt,
                        char **out, size_t *len, char *err, size_t errlen);
int model_text_is_eos(const ModelText *t, int id);

#endif
