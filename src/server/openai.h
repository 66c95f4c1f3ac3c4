/* openai: the OpenAI-compatible API on top of the engine (docs/ARCHITECTURE.md): routing,
 * authentication, request parsing and validation (jansson; every size a client controls is
 * bounded before anything is allocated for it), tokenization and chat templates, submission to
 * the engine, and the responses: one JSON body, or SSE chunks one token each, in the shapes of
 * the OpenAI API (https://github.com/openai/openai-openapi, openapi.yaml: CreateCompletionResponse,
 * CreateChatCompletionResponse, CreateChatCompletionStreamResponse, ErrorResponse). Stop strings are matched on the
 * detokenized text; text that could still become a stop string is held back, so a stop string
 * is never streamed, not even partly. http.c moves the bytes; this file knows no sockets.
 *
 * Chat completions also carry GLM reasoning and tool calls (docs/USAGE.md): `tools` and
 * `tool_choice` are validated and rendered by the chat template, the generated text (stop
 * strings already cut) goes through the GLM parser (../format/glm_parse.h), and its
 * reasoning_content, content and tool_calls are returned as vLLM does; `tool_choice` "required"
 * or a named function prefills the opening of a call after the prompt.
 *
 * Client-caused errors are negative ApiError codes with an ApiErr; openai_error is the one place
 * where one becomes an HTTP status and an OpenAI error object. */
#ifndef MOESERVE_OPENAI_H
#define MOESERVE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../format/glm_parse.h"
#include "../format/model_text.h"
#include "apibuf.h"
#include "metrics.h"

typedef enum {
    API_OK = 0,
    API_EINVAL = -1,           /* 400 invalid_request_error */
    API_EAUTH = -2,            /* 401 invalid_request_error, code invalid_api_key */
    API_ENOROUTE = -3,         /* 404 invalid_request_error */
    API_ENOMODEL = -4,         /* 404 invalid_request_error, code model_not_found */
    API_EMETHOD = -5,          /* 405 invalid_request_error */
    API_ETOOBIG = -6,          /* 413 invalid_request_error */
    API_EBUSY = -7,            /* 503 server_error (engine queue full, shutting down, no connection slot) */
    API_EINTERNAL = -8,        /* 500 server_error (never from a request: a bug) */
    API_ENOTIMPL = -9,         /* 501 invalid_request_error (a transfer coding other than chunked) */
} ApiError;

typedef struct {
    char msg[512];
    const char *param;         /* the offending field, or NULL */
    const char *code;          /* a machine-readable code, or NULL */
} ApiErr;


typedef enum {
    ROUTE_NONE, ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MODELS, ROUTE_MODEL, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_DIAGNOSIS,
    ROUTE_SERVER_INFO
} ApiRoute;

typedef struct {
    Engine *engine;            /* borrowed */
    const ModelText *text;     /* borrowed: tokenizer, chat template, eos ids, sampling defaults */
    const char *model_name;    /* --served-model-name, as /v1/models lists it */
    const char *model_alias;   /* another name accepted in requests (the model directory's base name), or NULL */
    const char *const *more_names; /* --served-model-name's names after the first: listed and accepted too */
    int n_more_names;
    int seeded;                /* --seed was given: default_seed seeds the requests without a seed (else the clock) */
    int64_t default_seed;
    const char *tool_parser;   /* --tool-call-parser glm45|glm47: the markup of a tool_choice prefill; NULL: the
                                  chat template's */
    const char *api_key;       /* NULL: no authentication */
    const char *script_path;   /* serve --script-output FILE, a test hook, else NULL: every
                                  completion is the tokenization of FILE's text (read at each
                                  request) then the model's first eos, forced on the engine */
    int max_model_len;         /* prompt + output tokens, as the engine enforces it */
    int vocab;                 /* V */
    int64_t created;           /* unix seconds of start-up (GET /v1/models) */
    Metrics *metrics;          /* borrowed */
    const Ceilings *ceilings;  /* borrowed: the roofs GET /v1/diagnosis compares against (NULL: none) */
    Deployment layout;         /* tp, pp, ep, micro-batches */
    const char *server_info;   /* GET /get_server_info's JSON object (device, layout, engine options), or NULL */
    volatile int draining;     /* shutting down: /health says 503, new generations are refused */
    int loading;               /* the model is not ready (atomic): /health says 503 "loading", every
                                  other route 503; only the names, api_key, created and metrics are set */
} Api;

/* The API's options on serve's command line (api_opt_group). */
typedef struct {
    OptStrs names;             /* --served-model-name: the first is the one responses carry */
    const char *api_key;       /* --api-key */
    int64_t seed;              /* --seed (-1: none) */
    const char *tool_parser;   /* --tool-call-parser glm45|glm47, or NULL */
    const char *reasoning_parser; /* --reasoning-parser glm45, or NULL */
    const char *chat_template; /* --chat-template FILE (or the template's text), or NULL */
    const char *script_path;   /* --script-output FILE: a test hook (Api.script_path) */
} ApiOptions;
void api_options_default(ApiOptions *o);
OptGroup api_opt_group(ApiOptions *o);
/* The tool-call markup the chat template writes: "glm45" (a newline after the function name),
 * "glm47" (none), or NULL when it writes no GLM tool call. */
const char *openai_template_tool_parser(const Api *a);

#define API_MAX_STOPS 16           /* stop strings per request */
#define API_MAX_STOP_LEN 512       /* bytes per stop string */
#define API_MAX_STOP_IDS 64        /* stop_token_ids per request */
#define API_MAX_TOOLS 128          /* tools per request */
#define API_MAX_TOOL_NAME 64       /* bytes of a function name, as the OpenAI API allows */
#define API_MAX_N 128              /* choices per request (n) */

/* One request's state; kept by a connection slot and reused (its buffers stay allocated). With
 * n > 1 it is also the first choice's, and more[] holds the others' (each its own engine request,
 * text, stop strings and parser), whose chunks are moved into this one's out. */
typedef struct ApiReq {
    ApiRoute route;
    /* options */
    int chat, stream, include_usage, echo, skip_special;
    int include_stop;          /* include_stop_str_in_output: the text ends after the stop string */
    int logprobs;              /* top alternatives per token; -1: no logprobs */
    ApiBuf stop_buf;              /* the stop strings, back to back */
    int stop_off[API_MAX_STOPS], stop_len[API_MAX_STOPS], n_stops;
    /* generation */
    uint64_t id;               /* the engine's request id (choice i's: id + i); 0: none */
    int n_choices;             /* n: choices asked for (>= 1) */
    int index;                 /* this choice's index */
    struct ApiReq *more;       /* [n_choices - 1] choices 1 .. n - 1, or NULL */
    int total_completion;      /* usage: every choice's completion tokens, at the end */
    int n_prompt, n_gen;       /* prompt tokens; tokens received */
    int finished;              /* the final event was received (the engine has forgotten id) */
    int stopped;               /* a stop string was found: later tokens are ignored */
    int done;                  /* everything to send is in out */
    FinishReason finish;
    int completion_tokens;
    Detokenizer dt;
    ApiBuf text;                  /* the returned text: echo, then complete generated characters */
    size_t gen_start;          /* where the generated part of text starts (after an echo) */
    size_t sent;               /* bytes of text already streamed */
    ApiBuf out;                   /* bytes for the client */
    size_t out_off;            /* bytes of out already handed to the client */
    ApiBuf lp;                    /* non-streaming logprobs: EngineEvent records */
    ApiBuf lp_off;                /* and the text offset of each (size_t) */
    ApiBuf head;                  /* streaming: the common start of every chunk, up to "choices":[ */
    /* chat: reasoning and tool calls */
    GlmParser parser;          /* the generated text, stop strings cut, goes through it */
    GlmParseOptions popts;     /* its options, for the other choices' parsers */
    char *prefill;             /* the call opening fed to the parser first (tool_choice), or NULL */
    int parsed;                /* the parser has seen the end of the text */
    json_t *tools;             /* the request's tools (a reference, for the parser's schemas), or NULL */
    int call_required;         /* tool_choice is "required" or names a function */
    char tool_name[API_MAX_TOOL_NAME + 1]; /* tool_choice names this function; "" otherwise */
    ApiBuf reasoning, content;    /* parsed text: not yet streamed, or (not streaming) all of it */
    json_t *calls;             /* parsed tool calls ({"id", "type", "function"}), or NULL */
    size_t calls_sent;         /* streaming: calls already sent */
    char rid[48];              /* "cmpl-..." / "chatcmpl-..." */
    int64_t created;
    MetricsReq mr;
} ApiReq;

void openai_req_reset(ApiReq *r);  /* for a new request, keeping the buffers */
void openai_req_free(ApiReq *r);

/* method + url -> route; API_ENOROUTE or API_EMETHOD (*allow: the methods the route takes). */
int openai_route(const char *method, const char *url, ApiRoute *route, const char **allow, ApiErr *err);
/* --api-key: /v1/ routes need "Authorization: Bearer KEY" (authorization may be NULL). */
int openai_auth(const Api *a, ApiRoute route, const char *authorization, ApiErr *err);
/* GET routes: the body into r->out; *content_type set. Returns the HTTP status (200, or 503 for
 * /health while draining) or an ApiError. */
int openai_get(Api *a, ApiReq *r, const char *url, const char **content_type, ApiErr *err);
/* POST routes: parse and validate body[0..len), tokenize, submit to the engine (notify(user, id)
 * is called from the engine thread when events wait). Returns API_OK or an ApiError. */
int openai_start(Api *a, ApiReq *r, const char *body, size_t len, EngineNotify notify, void *user, ApiErr *err);
/* Move the request's pending engine events into r->out (SSE chunks, or at the end the JSON
 * body). Never blocks. Returns 1 once everything is in out (r->done), else 0. */
int openai_pump(Api *a, ApiReq *r);
/* The client is gone before the end: the engine forgets the request. */
void openai_cancel(Api *a, ApiReq *r);
/* The one place an error becomes a response: the OpenAI error object into out (replacing its
 * content); returns the HTTP status. */
int openai_error(int rc, const ApiErr *err, ApiBuf *out);
const char *openai_finish_name(FinishReason f);
/* The finish_reason of a finished request: "tool_calls" when its reply has any, else its
 * FinishReason's name. */
const char *openai_req_finish_name(const ApiReq *r);

#endif
