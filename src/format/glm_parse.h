/* glm_parse: a GLM model's raw output (the text after the chat template's generation prompt)
 * split into the OpenAI fields reasoning_content, content and tool_calls, as vLLM's glm45 /
 * glm47 reasoning and tool parsers do, whole (glm_parse_text) or one detokenized piece at a
 * time (glm_parse_feed). Markup, as the GLM chat templates write it (both forms are accepted
 * whatever the model):
 *   <think>REASONING</think>CONTENT
 *   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>   (GLM-4.5, 4.6)
 *   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>         (GLM-4.7, GLM-5)
 * All of these tags are special tokens of the GLM tokenizer: detokenize with skip_special = 0.
 *
 * Behaviour (tests/unit/test_glm_parse.c pins each point):
 * - Streamed deltas, concatenated, are exactly the whole-text result for any chunking: text
 *   that may still be markup (a tag prefix at the end of a piece, whitespace that a tag may
 *   swallow, an open <tool_call>) is held back until decided, never sent as content.
 * - A tool call is sent whole, in one delta, when its </tool_call> arrives (vLLM's GLM parser
 *   up to 0.15; vLLM 0.16 streams string arguments as they arrive). Whole calls are what lets
 *   malformed markup fall back to content in the streamed and the whole result alike.
 * - Arguments: a parameter the tool's schema types as a string keeps its text exactly; else a
 *   value that parses as JSON other than a string (number, true/false/null, object, array) is
 *   that JSON value, written as the model wrote it; else a string, surrounding whitespace
 *   trimmed. Keys are trimmed; a repeated key keeps its first place and its last value.
 * - Content is all text outside <think> and tool calls, text after a call included. The
 *   whitespace next to a tag goes with the tag (so "\n<think>R</think>\nHi\n<tool_call>..."
 *   gives "R" and "Hi"); output without markup passes through unchanged.
 * - Malformed markup (no </tool_call>, no name, a name with spaces, text between arguments, a
 *   key without a value, an empty key; with known_only, a function not among the tools) never
 *   fails: the <tool_call> tag and the whitespace before it become content, one log_warn, and
 *   parsing goes on after the tag (so a good call nested after junk is still found). <think> counts only before any other text of an output
 *   that starts in content; an unterminated <think> leaves everything after it as reasoning. */
#ifndef MOESERVE_GLM_PARSE_H
#define MOESERVE_GLM_PARSE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Where the output starts, read off the end of the rendered prompt (glm_parse_start_of). */
typedef enum {
    GLM_PARSE_START_CONTENT,     /* prompt ends with the assistant header (GLM-4.5/4.6, thinking on):
                                    a <think> before any other text opens the reasoning */
    GLM_PARSE_START_REASONING,   /* prompt ends with <think> (GLM-4.7, GLM-5, thinking on) */
    GLM_PARSE_START_AFTER_THINK, /* prompt ends with </think> or <think></think> (thinking off) */
} GlmParseStart;

typedef struct {
    GlmParseStart start;
    int parse_tools;     /* 0: <tool_call> is plain content (no tools, or tool_choice "none") */
    json_t *tools;       /* borrowed: the request's "tools" array, or NULL; a parameter whose
                            schema type is "string" keeps its text even when it looks like JSON */
    int known_only;      /* a call of a function that is not among tools is malformed (content, a
                            warning), as the server wants; 0: returned as a call (vLLM's parser) */
    uint64_t id_seed;    /* tool call ids are "call_" + 24 hex digits of (id_seed, index):
                            the server draws one seed per request */
} GlmParseOptions;

/* What one feed completed. The strings point into the parser and stay valid until its next
 * feed/finish/free; tool_calls is borrowed likewise (json_incref to keep it). */
typedef struct {
    const char *reasoning;  /* reasoning_content delta; reasoning_len bytes, NUL-terminated */
    size_t reasoning_len;
    const char *content;    /* content delta; content_len bytes, NUL-terminated */
    size_t content_len;
    json_t *tool_calls;     /* NULL, or the calls that closed in this feed, each complete (vLLM's
                               shape): {"index", "id", "type": "function",
                               "function": {"name", "arguments": JSON text}} */
} GlmParseDelta;

typedef struct { char *p; size_t n, cap; } GlmParseBuf; /* p NUL-terminated when cap > 0 */

/* Where one closing tag occurs in pend, for the <tool_call> blocks that share one </tool_call>
 * (those nested in a malformed block): each searches the same bytes, so what one found is kept. */
typedef struct {
    size_t lo, hi;          /* every occurrence starting in pend[lo..hi) is in at[]; lo SIZE_MAX: none */
    size_t *at;             /* [n] offsets in pend, ascending */
    const char **why;       /* [n] </arg_value> only: why the arguments after it are malformed, NULL
                               while not known */
    size_t n, cap;
} GlmTagIndex;

/* The streaming parser. */
typedef struct {
    GlmParseOptions opt;
    int state;              /* GLM_ST_CONTENT, GLM_ST_REASONING or GLM_ST_CALL (glm_parse.c) */
    int eat_ws;             /* drop the whitespace that opens the current run (after a tag) */
    int after_call;         /* the held whitespace follows a tool call: dropped unless text follows */
    int think_allowed;      /* nothing but whitespace yet and START_CONTENT: <think> is markup */
    int content_seen;       /* some content was emitted */
    GlmParseBuf pend;       /* text not decided yet: held whitespace, a possible tag prefix, or an
                               open <tool_call> block up to its </tool_call> */
    size_t close_from;      /* in an open block: where to resume looking for </tool_call> */
    size_t close_at;        /* 1 + where in pend the </tool_call> of the last block searched is, 0
                               none known, SIZE_MAX none to the end (final): a block nested in a
                               malformed one ends there too, found without searching again */
    size_t memo_end;        /* the </tool_call> offset in pend the two indexes belong to, or SIZE_MAX */
    GlmTagIndex key_close, value_close; /* </arg_key>s and </arg_value>s before memo_end */
    size_t held_ws;         /* pend starts with this much whitespace, already scanned (held while
                               a tag may follow): not scanned again, so a long run stays linear */
    GlmParseBuf call_ws;    /* the whitespace before the open <tool_call> (restored if malformed) */
    GlmParseBuf out_reasoning, out_content; /* this feed's delta text */
    json_t *out_calls;      /* this feed's closed calls (streaming shape), or NULL */
    json_t *calls;          /* every call so far (non-streaming shape) */
    int n_warnings;         /* malformed markup that fell back to content */
} GlmParser;

/* The parse of a whole output. */
typedef struct {
    char *reasoning;        /* malloc'ed, "" when none */
    char *content;          /* malloc'ed, "" when none */
    json_t *tool_calls;     /* owned array (possibly empty) of {"id", "type": "function",
                               "function": {"name", "arguments": JSON text}} */
    int n_warnings;
} GlmParseResult;

/* The start state for a rendered prompt (trailing whitespace ignored). */
GlmParseStart glm_parse_start_of(const char *prompt);

void glm_parse_init(GlmParser *p, const GlmParseOptions *opt);
void glm_parse_free(GlmParser *p);
/* Feed the next piece of output (any split; a piece from the detokenizer is whole UTF-8
 * characters). Never fails: malformed markup comes back as content, with a log_warn. */
void glm_parse_feed(GlmParser *p, const char *text, size_t len, GlmParseDelta *d);
/* End of output: whatever was held back (a tag prefix, trailing whitespace, an unterminated
 * <tool_call>) comes out as content. Nothing may be fed after. */
void glm_parse_finish(GlmParser *p, GlmParseDelta *d);
/* Tool calls parsed so far: finish_reason is "tool_calls" when this is > 0 at the end. */
int glm_parse_n_calls(const GlmParser *p);

/* The whole output at once (the same parser, fed once). */
void glm_parse_text(const char *text, size_t len, const GlmParseOptions *opt, GlmParseResult *r);
void glm_parse_result_free(GlmParseResult *r);

/* OpenAI JSON. The delta object of a chat.completion.chunk: "reasoning_content", "content"
 * and "tool_calls" where non-empty; NULL when the delta is empty (send nothing). */
json_t *glm_parse_delta_json(const GlmParseDelta *d);
/* The message of a chat.completion: {"role": "assistant", "content": text or null,
 * "reasoning_content" when any, "tool_calls" when any}. */
json_t *glm_parse_message_json(const GlmParseResult *r);

#endif
