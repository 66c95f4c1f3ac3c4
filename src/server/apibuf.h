/* apibuf: a growing byte buffer (the server's request bodies and responses) and the JSON text the
 * OpenAI layer writes into it: strings escaped with invalid UTF-8 replaced, log-probabilities as
 * the API prints them. */
#ifndef MOESERVE_APIBUF_H
#define MOESERVE_APIBUF_H

#include <stddef.h>

typedef struct {
    char *p;
    size_t len, cap;
} ApiBuf;

void openai_buf_add(ApiBuf *b, const void *p, size_t n); /* grows as needed; keeps a NUL after the end */
void openai_buf_free(ApiBuf *b);
void apibuf_reserve(ApiBuf *b, size_t extra);            /* room for extra bytes and the NUL */
void apibuf_puts(ApiBuf *b, const char *s);
void apibuf_printf(ApiBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void apibuf_clear(ApiBuf *b);                             /* empty, keeping its memory */
/* A JSON string: quotes, escapes, and U+FFFD for any byte that is not valid UTF-8. */
void apibuf_jstr(ApiBuf *b, const char *s, size_t n);
/* A log-probability as JSON: finite, and -9999.0 for "very unlikely" as the OpenAI API does. */
void apibuf_logprob(ApiBuf *b, float lp);

#endif
