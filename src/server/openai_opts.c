/* openai_opts: the command-line options of the API (--served-model-name, --seed, --chat-template,
 * the GLM parsers, and the vLLM/SGLang options that mean nothing here), openai.h's ApiOptions. */
#include <string.h>

#include "../base/util.h"
#include "openai.h"

void api_options_default(ApiOptions *o) { *o = (ApiOptions){.seed = -1}; }

static int take_tool_parser(const char *v, void *dst, char *err, size_t errlen)
{
    if (strcmp(v, "glm45") && strcmp(v, "glm47")) {
        errbuf_set(err, errlen, "'%s': moeserve parses GLM tool calls: glm45 (GLM-4.5, 4.6) or glm47 (GLM-4.7, GLM-5)",
        v);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

static int take_reasoning_parser(const char *v, void *dst, char *err, size_t errlen)
{
    if (strcmp(v, "glm45")) {
        errbuf_set(err, errlen, "'%s': moeserve splits GLM reasoning (<think>): glm45", v);
        return -1;
    }
    *(const char **)dst = v;
    return 0;
}

OptGroup api_opt_group(ApiOptions *o)
{
    OPT_GROUP_RETURN("API",
        {.names = "--served-model-name", .type = OPT_STRS, .dst = &o->names, .metavar = "NAME...",
         .help = "the names /v1/models lists and requests may give; responses carry the first",
         .def = "--model as given, and its last path component"},
        {.names = "--api-key", .type = OPT_STR, .dst = &o->api_key, .metavar = "KEY",
         .help = "/v1/ requests need 'Authorization: Bearer KEY'", .def = "none"},
        {.names = "--seed", .type = OPT_FN, .dst = &o->seed, .metavar = "N",
         .help = "the seed of requests that bring none",
         .def = "from the clock, per request", .fn = sampling_take_seed},
        {.names = "--chat-template", .type = OPT_STR, .dst = &o->chat_template, .metavar = "FILE",
         .help = "a Jinja chat template (a file, or the template itself) instead of the model's", .def = "the model's"},
        {.names = "--tool-call-parser", .type = OPT_FN, .dst = &o->tool_parser, .metavar = "glm45|glm47",
         .help = "GLM tool calls: both markups are parsed; this one is written when tool_choice forces a call",
         .def = "the chat template's", .fn = take_tool_parser},
        {.names = "--reasoning-parser", .type = OPT_FN, .dst = &o->reasoning_parser, .metavar = "glm45",
         .help = "GLM reasoning (<think>) into reasoning_content: always on", .def = "glm45",
         .fn = take_reasoning_parser},
        {.names = "--enable-auto-tool-choice", .type = OPT_NOTE,
         .help = "tool_choice auto is always on (GLM tool calls are parsed when a request has tools)"},
        {.names = "--disable-log-requests|--disable-log-stats|--enable-metrics|"
                  "--skip-server-warmup|--disable-fastapi-docs",
         .type = OPT_NOTE, .help = "requests are not logged, /metrics is always on and there is no warm-up"},
        {.names = "--uvicorn-log-level|--log-level", .type = OPT_NOTE, .metavar = "LEVEL",
         .help = "moeserve logs at one level"},
        {.names = "--script-output", .type = OPT_STR, .dst = &o->script_path, .metavar = "FILE"});
}
