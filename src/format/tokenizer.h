/* tokenizer: byte-level BPE from a Hugging Face tokenizer.json (GLM-4.5, GLM-5, Qwen,
 * DeepSeek-V3, Llama-3 families), giving exactly the ids Hugging Face `tokenizers` gives:
 * normalizer (NFC through utf8proc), Split pre-tokenizer regexes on PCRE2 with JIT, ByteLevel,
 * BPE with merges (or ranks) and ignore_merges, added tokens (special or not) recognised in the
 * text, the post-processor's special tokens on request, and the ByteLevel decoder, with an
 * incremental decoder for streaming that holds back an incomplete UTF-8 character. */
#ifndef MOESERVE_TOKENIZER_H
#define MOESERVE_TOKENIZER_H

#include <stddef.h>

typedef struct Tokenizer Tokenizer;

/* path: a tokenizer.json file, or a model directory holding tokenizer.json (and optionally
 * tokenizer_config.json, whose added_tokens_decoder / bos / eos settings are read too).
 * NULL with err set on failure (unsupported component named in the message). */
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t); /* NULL is fine */

/* Encode len bytes of text (any bytes; invalid UTF-8 is handled as HF does). add_special:
 * add what the post-processor adds (BOS for Llama-3, ...). *ids is malloc'ed, caller frees.
 * Returns the number of ids, or -1 with err set. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int add_special, int **ids,
                     char *err, size_t errlen);
/* Decode ids to text (malloc'ed, NUL-terminated; *len bytes), as HF decode: unknown ids are
 * dropped, invalid UTF-8 becomes U+FFFD. skip_special drops special tokens. Returns 0. */
int tokenizer_decode(const Tokenizer *t, const int *ids, int n, int skip_special, char **text, size_t *len);

int tokenizer_vocab_size(const Tokenizer *t);        /* largest id + 1 */
int tokenizer_token_id(const Tokenizer *t, const char *token); /* exact token string, -1 if absent */
const char *tokenizer_token(const Tokenizer *t, int id);      /* the vocabulary string, or NULL */
int tokenizer_is_special(const Tokenizer *t, int id);
int tokenizer_bos_id(const Tokenizer *t);            /* -1 when none */
int tokenizer_eos_id(const Tokenizer *t);            /* -1 when none */

/* Incremental detokenisation for streaming: push one id at a time, get the bytes that are now
 * complete (a UTF-8 character split across tokens is held back until it is whole). */
typedef struct {
    const Tokenizer *tok;      /* borrowed */
    int skip_special;
    char pending[16];          /* bytes of an incomplete UTF-8 character */
    int n_pending;
    int started;               /* a token was emitted (a tokenizer without decoder joins with ' ') */
} Detokenizer;

void detok_init(Detokenizer *d, const Tokenizer *t, int skip_special);
/* Appends the text completed by id to out (at most cap bytes, NUL-terminated); returns bytes
 * written, -1 if cap is too small. */
int detok_push(Detokenizer *d, int id, char *out, size_t cap);
/* Whatever is still held back (an incomplete character at the end), as U+FFFD as HF does. */
int detok_flush(Detokenizer *d, char *out, size_t cap);

#endif
