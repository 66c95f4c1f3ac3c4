/* apibuf: the growing byte buffer of the server's responses, and JSON text written into it
 * (apibuf.h). */
#include "apibuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

void apibuf_reserve(ApiBuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void openai_buf_add(ApiBuf *b, const void *p, size_t n)
{
    apibuf_reserve(b, n);
    if (n) memcpy(b->p + b->len, p, n); /* an empty buffer's p may be NULL */
    b->len += n;
    b->p[b->len] = 0;
}

void apibuf_puts(ApiBuf *b, const char *s) { openai_buf_add(b, s, strlen(s)); }

void apibuf_printf(ApiBuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    apibuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void apibuf_clear(ApiBuf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void openai_buf_free(ApiBuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Length of the valid UTF-8 character at s[0..n), or 0 if it is not one (RFC 3629). */
static int utf8_char_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    unsigned cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3F);
    static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* A JSON string: quotes, escapes, and U+FFFD for any byte that is not valid UTF-8. */
void apibuf_jstr(ApiBuf *b, const char *s, size_t n)
{
    apibuf_reserve(b, n + 2);
    b->p[b->len++] = '"';
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            size_t j = i + 1; /* a run of plain ASCII */
            while (j < n && u[j] >= 0x20 && u[j] < 0x80 && u[j] != '"' && u[j] != '\\') j++;
            openai_buf_add(b, s + i, j - i);
            i = j;
            continue;
        }
        if (c < 0x80) {
            char e[8];
            const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                            : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (!esc) { snprintf(e, sizeof e, "\\u%04x", c); esc = e; }
            apibuf_puts(b, esc);
            i++;
            continue;
        }
        int len = utf8_char_len(u + i, n - i);
        if (len) { openai_buf_add(b, s + i, (size_t)len); i += (size_t)len; }
        else { apibuf_puts(b, "\xEF\xBF\xBD"); i++; }
    }
    openai_buf_add(b, "\"", 1);
}

/* A log-probability as JSON: finite, and -9999.0 for "very unlikely" as the OpenAI API does. */
void apibuf_logprob(ApiBuf *b, float lp)
{
    if (!isfinite(lp) || lp < -9999.0f) apibuf_puts(b, "-9999.0");
    else apibuf_printf(b, "%.8g", (double)lp);
}
