/* chat_template: the model's Jinja chat template (tokenizer_config.json "chat_template" or
 * chat_template.jinja) rendered by a Jinja subset large enough for the GLM-4.5/4.6/4.7, GLM-5
 * and Qwen3 templates: the same text transformers' apply_chat_template produces. A template
 * that uses something unsupported is an error at load, never a wrong prompt. */
#ifndef MOESERVE_CHAT_TEMPLATE_H
#define MOESERVE_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

typedef struct ChatTemplate ChatTemplate;

/* Load from a model directory (chat_template.jinja, else tokenizer_config.json chat_template,
 * string or the list of named templates: "default"). NULL with err set when absent or invalid. */
ChatTemplate *chat_template_load(const char *model_dir, char *err, size_t errlen);
/* Parse a template text directly. */
ChatTemplate *chat_template_parse(const char *text, char *err, size_t errlen);
void chat_template_free(ChatTemplate *t);

/* Render: messages is a JSON array of OpenAI-style messages ({"role", "content", "tool_calls",
 * "reasoning_content", ...}); tools a JSON array or NULL; kwargs extra template variables
 * (chat_template_kwargs such as enable_thinking) or NULL; bos_token / eos_token strings are
 * available to the template. Returns 0 with *out malloc'ed, or -1 with err set (a runtime error
 * such as raise_exception from the template, or a type error). */
int chat_template_render(const ChatTemplate *t, json_t *messages, json_t *tools, int add_generation_prompt,
                         json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                         char *err, size_t errlen);
/* The same with the text's length in *out_len: a message may hold a NUL, which the text keeps
 * (strlen would cut the prompt there, generation prompt and all). */
int chat_template_render_n(const ChatTemplate *t, json_t *messages, json_t *tools, int add_generation_prompt,
                           json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                           size_t *out_len, char *err, size_t errlen);

#endif
