/* tokenizer: a Hugging Face tokenizer.json (byte-level BPE: GLM-4/4.5/5, Qwen2/3, DeepSeek-V3,
 * Llama-3) read with jansson, encoding exactly as HF `tokenizers` does (checked id for id against
 * it by tests/unit/test_tokenizer.c on fixtures from tools/make_tokenizer_fixtures.py).
 * The pipeline of one encode, in HF's order: invalid UTF-8 -> U+FFFD (as from_utf8_lossy);
 * added tokens cut out of the raw text (leftmost-longest, single_word/lstrip/rstrip); the
 * normalizer (utf8proc) on the pieces between them; normalized added tokens cut out of those;
 * the pre-tokenizers (Split regexes on PCRE2 with JIT, ByteLevel); BPE on each piece (merge
 * ranks in a hash map, lowest rank first through a heap, as models/bpe/word.rs, with a per-call
 * word cache); the post-processor's special tokens on request. Decoding maps byte-level
 * characters back to bytes; Detokenizer does it one id at a time for streaming. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "../base/util.h"

/* ---- types ---- */

#define MAX_TEXT (256u << 20)      /* longest text encode accepts (offsets are 32-bit) */
#define MAX_DEPTH 8                /* nesting of Sequence pre-tokenizers */
#define MAX_IDS (1 << 24)          /* largest token id + 1 accepted (the id tables are dense) */
#define CACHE_MAX_WORD 256         /* words longer than this are not cached (HF: MAX_LENGTH) */
#define CACHE_MAX_ENTRIES (1 << 17)

typedef struct { char *p; size_t n, cap; } Buf;
typedef struct { int32_t *v; size_t n, cap; } IntVec;

/* Open addressing, keys are byte strings stored in an arena the caller passes in. */
typedef struct { uint64_t h; uint32_t off, len; int32_t val; } Slot;   /* h == 0: empty */
typedef struct { Slot *s; size_t cap, n; } Map;

/* BPE merges: (left id, right id) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, id; } MSlot;              /* id == -1: empty */
typedef struct { MSlot *s; size_t cap, n; } MergeMap;

typedef struct { pcre2_code *code; int jit; } Regex;
typedef struct { size_t out, src; } Mark;                   /* see regex_translate */
typedef struct { Mark *v; size_t n, cap; } Marks;

typedef struct {                   /* one added token (HF AddedToken) */
    uint32_t off, len;             /* content, in the arena */
    uint32_t moff, mlen;           /* the form matched and decoded: normalized content if it differs */
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} AddedTok;

typedef struct { int32_t child, sibling, tok; uint8_t byte; } TrieNode;  /* tok: index in added, -1 */
typedef struct { TrieNode *n; int count, cap; uint8_t first[256]; } Trie;

typedef enum { NORM_SEQ, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_REPLACE,
               NORM_PREPEND, NORM_STRIP, NORM_BYTELEVEL } NormKind;
typedef struct Norm {
    NormKind kind;
    struct Norm *kids; int n_kids;    /* NORM_SEQ */
    char *s; size_t slen;             /* Replace content, Prepend text */
    Regex re;                         /* Replace pattern */
    int left, right;                  /* Strip */
} Norm;

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } SplitBehavior;
typedef enum { PRE_SEQ, PRE_SPLIT, PRE_BYTELEVEL } PreKind;
typedef struct Pre {
    PreKind kind;
    struct Pre *kids; int n_kids;     /* PRE_SEQ */
    Regex re;                         /* PRE_SPLIT */
    SplitBehavior behavior;
    int invert;
    int add_prefix_space, use_regex;  /* PRE_BYTELEVEL */
} Pre;

typedef struct { int is_seq; int32_t *ids; int n; } TplItem;   /* $A, or special ids */
typedef struct { TplItem *items; int n; } Template;

typedef enum { DEC_BYTELEVEL, DEC_FUSE, DEC_NONE } DecodeKind;

struct Tokenizer {
    Buf arena;                    /* every token string, NUL-terminated */
    int n_ids;                    /* largest id + 1 */
    int64_t *tok;                 /* [n_ids] id -> off << 32 | len of its string (HF id_to_token), -1 none */
    uint8_t *special;             /* [n_ids] its string is a special added token's */
    int64_t *dec;                 /* [n_ids] off << 32 | len of its decoded bytes in dec_bytes */
    Buf dec_bytes;
    DecodeKind decoder;

    Map vocab;                    /* model vocabulary: string -> id */
    int vocab_len;                /* its number of entries (HF get_vocab_size) */
    MergeMap merges;
    int ignore_merges, byte_fallback, fuse_unk;
    char *prefix, *suffix, *unk;  /* continuing_subword_prefix, end_of_word_suffix, unk_token */
    int byte_ids[256];            /* byte_fallback: id of "<0xXX>", -1 */
    int32_t char_ids[0x144];      /* id of the one-character token of each code point below U+0144 */

    AddedTok *added; int n_added, added_cap;
    Map added_map;                /* content -> id */
    int32_t *added_of;            /* [added_of_n] id -> index in added, -1 (n_ids + 1 or more once loaded) */
    size_t added_of_n;
    Trie raw_trie, norm_trie;     /* normalized = false / true tokens */

    Norm *norm;                   /* NULL: none */
    Pre *pre;                     /* NULL: none */
    Template *post; int n_post;   /* applied in order when add_special */
    Regex gpt2;                   /* ByteLevel's own split, compiled when use_regex */
    int bos, eos;
};

/* Scratch of one encode call (the Tokenizer itself stays read-only: encodes may run in parallel). */
typedef struct { uint32_t off, len; } Piece;
typedef struct { Piece *v; size_t n, cap; } Pieces;
typedef struct { uint32_t s, e; uint8_t m; } Span;
typedef struct { Span *v; size_t n, cap; } Spans;
typedef struct { uint32_t off, len; int32_t id; } Seg;       /* id -1: text */
typedef struct { Seg *v; size_t n, cap; } Segs;
typedef struct { uint32_t rank, pos; int32_t id, left, right; } HeapItem;   /* a queued merge of (left, right) */

typedef struct {
    const Tokenizer *t;
    Buf work;                     /* bytes of the pieces being pre-tokenized */
    Buf nbuf, sbuf;               /* normalized segment; scratch strings */
    Pieces pieces, tmp;           /* the pieces; the next list while splitting */
    Spans spans, spans2;
    Segs raw, normd;
    IntVec *out;
    Map cache; Buf ckeys; IntVec cids;   /* word -> ids (cids: count, ids...) */
    int32_t *sc, *sprev, *snext; uint32_t *slen; size_t scap;   /* BPE symbols */
    HeapItem *heap; size_t hn, hcap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    char *err; size_t errlen;
} Enc;

/* ---- helpers: buffers, hashing, maps ---- */

static void buf_reserve(Buf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

static void buf_add(Buf *b, const void *p, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void buf_free(Buf *b) { free(b->p); memset(b, 0, sizeof *b); }

static void ivec_push(IntVec *v, int32_t x)
{
    if (v->n == v->cap) { v->cap = v->cap ? 2 * v->cap : 64; v->v = xrealloc(v->v, v->cap * sizeof *v->v); }
    v->v[v->n++] = x;
}

#define VEC_PUSH(vec, item) do { \
    if ((vec)->n == (vec)->cap) { (vec)->cap = (vec)->cap ? 2 * (vec)->cap : 64; \
        (vec)->v = xrealloc((vec)->v, (vec)->cap * sizeof *(vec)->v); } \
    (vec)->v[(vec)->n++] = (item); } while (0)

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w) | 1;       /* never 0: 0 marks an empty slot */
}

static void map_grow(Map *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    Slot *s = xcalloc(cap, sizeof *s);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->s[i].h) continue;
        size_t j = m->s[i].h & (cap - 1);
        while (s[j].h) j = (j + 1) & (cap - 1);
        s[j] = m->s[i];
    }
    free(m->s);
    m->s = s;
    m->cap = cap;
}

static int32_t map_get_h(const Map *m, const char *base, const char *k, size_t len, uint64_t h)
{
    if (!m->cap) return -1;
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const Slot *s = &m->s[j];
        if (!s->h) return -1;
        if (s->h == h && s->len == len && !memcmp(base + s->off, k, len)) return s->val;
    }
}

static int32_t map_get(const Map *m, const char *base, const char *k, size_t len)
{
    return map_get_h(m, base, k, len, hash_bytes(k, len));
}

/* Insert or replace (the key is base + off, len). */
static void map_put(Map *m, const char *base, uint32_t off, uint32_t len, int32_t val)
{
    if ((m->n + 1) * 10 > m->cap * 7) map_grow(m);
    uint64_t h = hash_bytes(base + off, len);
    size_t j = h & (m->cap - 1);
    for (; m->s[j].h; j = (j + 1) & (m->cap - 1)) {
        Slot *s = &m->s[j];
        if (s->h == h && s->len == len && !memcmp(base + s->off, base + off, len)) { s->val = val; return; }
    }
    m->s[j] = (Slot){h, off, len, val};
    m->n++;
}

static void map_free(Map *m) { free(m->s); memset(m, 0, sizeof *m); }

static void merges_grow(MergeMap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    MSlot *s = xmalloc(cap * sizeof *s);
    for (size_t i = 0; i < cap; i++) s[i].id = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->s[i].id < 0) continue;
        size_t j = mix64(m->s[i].key) & (cap - 1);
        while (s[j].id >= 0) j = (j + 1) & (cap - 1);
        s[j] = m->s[i];
    }
    free(m->s);
    m->s = s;
    m->cap = cap;
}

static void merges_put(MergeMap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->n + 1) * 10 > m->cap * 7) merges_grow(m);
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = mix64(key) & (m->cap - 1);
    for (; m->s[j].id >= 0; j = (j + 1) & (m->cap - 1))
        if (m->s[j].key == key) { m->s[j].rank = rank; m->s[j].id = id; return; }  /* later wins, as HF */
    m->s[j] = (MSlot){key, rank, id};
    m->n++;
}

static const MSlot *merges_get(const MergeMap *m, int32_t a, int32_t b)
{
    if (!m->cap) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t j = mix64(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->s[j].id < 0) return NULL;
        if (m->s[j].key == key) return &m->s[j];
    }
}

/* ---- helpers: UTF-8 ---- */

/* The UTF-8 sequence at s (n bytes left): k > 0 a valid character of k bytes; 0 a valid but
 * incomplete prefix (all n bytes); -k an invalid sequence whose maximal valid prefix is k bytes
 * (replaced by one U+FFFD, as Rust's from_utf8_lossy and Python's errors="replace"). */
static int utf8_check(const unsigned char *s, size_t n)
{
    unsigned b = s[0], need, lo = 0x80, hi = 0xbf;
    if (b < 0x80) return 1;
    if (b < 0xc2) return -1;
    if (b < 0xe0) need = 2;
    else if (b < 0xf0) { need = 3; if (b == 0xe0) lo = 0xa0; if (b == 0xed) hi = 0x9f; }
    else if (b < 0xf5) { need = 4; if (b == 0xf0) lo = 0x90; if (b == 0xf4) hi = 0x8f; }
    else return -1;
    for (unsigned i = 1; i < need; i++) {
        if (i >= n) return 0;
        if (s[i] < lo || s[i] > hi) return -(int)i;
        lo = 0x80;
        hi = 0xbf;
    }
    return (int)need;
}

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd};

/* Append s (any bytes) to out as valid UTF-8, each invalid sequence replaced by U+FFFD. */
static void utf8_lossy(Buf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    buf_reserve(out, n);
    size_t i = 0, run = 0;         /* run: start of the valid bytes not yet copied */
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int k = utf8_check(u + i, n - i);
        if (k > 0) { i += (size_t)k; continue; }
        buf_add(out, s + run, i - run);
        buf_add(out, REPLACEMENT, 3);
        i += k == 0 ? n - i : (size_t)-k;
        run = i;
    }
    buf_add(out, s + run, n - run);
}

static int utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { i++; continue; }
        int k = utf8_check(u + i, n - i);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* Decode the (valid) character at s; returns its length. */
static int utf8_decode(const char *s, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    if (u[0] < 0xe0) { *cp = (u[0] & 0x1fu) << 6 | (u[1] & 0x3fu); return 2; }
    if (u[0] < 0xf0) { *cp = (u[0] & 0x0fu) << 12 | (u[1] & 0x3fu) << 6 | (u[2] & 0x3fu); return 3; }
    *cp = (u[0] & 0x07u) << 18 | (u[1] & 0x3fu) << 12 | (u[2] & 0x3fu) << 6 | (u[3] & 0x3fu);
    return 4;
}

static int utf8_encode(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Start of the character that ends at s + n (valid UTF-8). */
static size_t utf8_last_start(const char *s, size_t n)
{
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    return i;
}

/* Unicode White_Space (Rust char::is_whitespace, regex \s). */
static int is_white(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* Rust regex \w: Alphabetic, marks, decimal digits, connector punctuation, join controls
 * (Alphabetic approximated by letters, letter numbers and marks). */
static int is_word(uint32_t c)
{
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return c == 0x200c || c == 0x200d;
    }
}

/* ---- helpers: the GPT-2 byte <-> character table (pre_tokenizers/byte_level.rs bytes_char) ---- */

static uint32_t bl_char[256];       /* byte -> code point */
static char bl_utf8[256][2];        /* its UTF-8 */
static uint8_t bl_utf8_len[256];
static int16_t bl_byte[0x144];      /* code point -> byte, -1 */

static void bl_build(void)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        bl_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int c = 0; c < 0x144; c++) bl_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        char tmp[4];
        bl_utf8_len[b] = (uint8_t)utf8_encode(bl_char[b], tmp);
        memcpy(bl_utf8[b], tmp, bl_utf8_len[b]);
        bl_byte[bl_char[b]] = (int16_t)b;
    }
}

static void bl_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bl_build);
}

/* ---- regexes (PCRE2, UTF + UCP, JIT) ---- */

/* HF's regex engine is Oniguruma; PCRE2 (UTF + UCP) reads its patterns the same way except:
 * \s is White_Space there but also U+180E in PCRE2 10.42, so \s and \S become explicit classes;
 * \h is a hex digit there (horizontal space in PCRE2); \uHHHH is \x{HHHH} in PCRE2. Inside a
 * character class \S is left as it is (no tokenizer.json uses it there). */
#define WS_RANGES "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* marks: (output offset, pattern offset) at the start and the end of each rewritten escape, so
 * that a compile error's offset names the place in the pattern as written (regex_source_offset). */
static char *regex_translate(const char *pat, size_t len, size_t *outlen, Marks *marks)
{
    Buf b = {0};
    int in_class = 0;
    buf_reserve(&b, len);
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            int hex4 = d == 'u' && i + 6 <= len;
            for (size_t k = 2; hex4 && k < 6; k++) hex4 = pat[i + k] && strchr("0123456789abcdefABCDEF", pat[i + k]);
            int rewrite = hex4 || d == 's' || (d == 'S' && !in_class) || d == 'h' || (d == 'H' && !in_class);
            if (rewrite) VEC_PUSH(marks, ((Mark){b.n, i}));
            if (hex4) {
                buf_add(&b, "\\x{", 3);
                buf_add(&b, pat + i + 2, 4);
                buf_add(&b, "}", 1);
                i += 5;
            } else if (d == 's' || (d == 'S' && !in_class)) {
                const char *open = in_class ? "" : d == 's' ? "[" : "[^";
                buf_add(&b, open, strlen(open));
                buf_add(&b, WS_RANGES, strlen(WS_RANGES));
                if (!in_class) buf_add(&b, "]", 1);
                i++;
            } else if (d == 'h' || (d == 'H' && !in_class)) {
                const char *x = in_class ? "0-9a-fA-F" : d == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]";
                buf_add(&b, x, strlen(x));
                i++;
            } else {
                buf_add(&b, pat + i, 2);
                i++;
            }
            if (rewrite) VEC_PUSH(marks, ((Mark){b.n, i + 1}));
            continue;
        }
        buf_add(&b, &c, 1);
        if (!in_class && c == '[') {
            in_class = 1;
            if (i + 1 < len && pat[i + 1] == '^') buf_add(&b, pat + ++i, 1);
            if (i + 1 < len && pat[i + 1] == ']') buf_add(&b, pat + ++i, 1);     /* a literal ] first */
        } else if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *e = strstr(pat + i, ":]");                                /* [:alpha:] */
            if (e && (size_t)(e - pat) < len) {
                buf_add(&b, pat + i + 1, (size_t)(e - pat) + 1 - i);
                i = (size_t)(e - pat) + 1;
            }
        } else if (in_class && c == ']') in_class = 0;
    }
    *outlen = b.n;
    return b.p;
}

/* The offset in the pattern as written of offset eo of its translation. */
static size_t regex_source_offset(const Marks *marks, size_t eo)
{
    size_t k = marks->n;
    while (k > 0 && marks->v[k - 1].out > eo) k--;
    if (!k) return eo;
    const Mark *m = &marks->v[k - 1];
    return k % 2 ? m->src : m->src + (eo - m->out);   /* odd k: inside a rewritten escape */
}

/* The pattern for an error message: its first 60 bytes, control characters as \xHH. */
static void regex_show(const char *pat, size_t len, char *out, size_t cap)
{
    size_t n = len > 60 ? 60 : len, o = 0;
    while (n < len && n > 0 && ((unsigned char)pat[n] & 0xc0) == 0x80) n--;   /* whole characters */
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)pat[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    snprintf(out + o, cap - o, "%s", n < len ? "..." : "");
}

/* Patterns are compiled with PCRE2_NEVER_BACKSLASH_C: \C matches one byte, so a match could end
 * inside a UTF-8 character and cut pieces that are not UTF-8, which all that follows assumes. */
static int regex_compile(Regex *r, const char *pat, size_t len, int literal, const char *what, char *err,
                         size_t errlen)
{
    memset(r, 0, sizeof *r);
    size_t tlen = len;
    Marks marks = {0};
    char *tpat = literal ? NULL : regex_translate(pat, len, &tlen, &marks);
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C);
    r->code = pcre2_compile((PCRE2_SPTR)(literal ? pat : tpat), tlen, opts, &ec, &eo, NULL);
    free(tpat);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        char show[300];
        pcre2_get_error_message(ec, msg, sizeof msg);
        regex_show(pat, len, show, sizeof show);
        const char *why = ec == PCRE2_ERROR_BACKSLASH_C_CALLER_DISABLED
                          ? " (\\C matches one byte and can split a UTF-8 character)" : "";
        errbuf_set(err, errlen, "%s: regex \"%s\" does not compile at offset %zu: %s%s", what, show,
                   regex_source_offset(&marks, (size_t)eo), (char *)msg, why);
        free(marks.v);
        return -1;
    }
    free(marks.v);
    r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static void regex_free(Regex *r) { pcre2_code_free(r->code); memset(r, 0, sizeof *r); }

static int enc_match(Enc *e, const Regex *r, const char *s, size_t n, size_t start)
{
    int rc;
    for (;;) {
        if (r->jit) rc = pcre2_jit_match(r->code, (PCRE2_SPTR)s, n, start, 0, e->md, e->mctx);
        else rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || e->jstack) break;
        /* a long backtracking match: give JIT a bigger stack and retry */
        e->jstack = pcre2_jit_stack_create(64 << 10, 64 << 20, NULL);
        if (!e->mctx) e->mctx = pcre2_match_context_create(NULL);
        if (!e->jstack || !e->mctx) break;
        pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
    }
    if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) return rc;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    errbuf_set(e->err, e->errlen, "regex match failed: %s", (char *)msg);
    return -2;
}

/* HF Pattern::find_matches: spans covering s, each a match or not, in order. Matches come from
 * Oniguruma's find_iter: an empty match right where the previous one ended is skipped and the
 * search moves on one character. */
static int find_matches(Enc *e, const Regex *r, const char *s, size_t n, int invert, Spans *out)
{
    out->n = 0;
    if (n == 0) return 0;
    size_t prev = 0, last = 0;
    long last_match_end = -1;
    while (last <= n) {
        int rc = enc_match(e, r, s, n, last);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && last_match_end == (long)me) {
            if (last >= n) break;
            uint32_t cp;
            last += (size_t)utf8_decode(s + last, &cp);
            continue;
        }
        last = me;
        last_match_end = (long)me;
        if (prev != ms) VEC_PUSH(out, ((Span){(uint32_t)prev, (uint32_t)ms, (uint8_t)invert}));
        VEC_PUSH(out, ((Span){(uint32_t)ms, (uint32_t)me, (uint8_t)!invert}));
        prev = me;
    }
    if (prev != n) VEC_PUSH(out, ((Span){(uint32_t)prev, (uint32_t)n, (uint8_t)invert}));
    return 0;
}

/* NormalizedString::split: the spans regrouped by the behavior (empty pieces dropped later). */
static void split_behave(const Spans *in, SplitBehavior b, Spans *out)
{
    out->n = 0;
    int prev = 0;
    switch (b) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < in->n; i++) VEC_PUSH(out, ((Span){in->v[i].s, in->v[i].e, 0}));
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < in->n; i++)
            if (!in->v[i].m) VEC_PUSH(out, ((Span){in->v[i].s, in->v[i].e, 0}));
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < in->n; i++) {
            int m = in->v[i].m;
            if (m == prev && out->n) out->v[out->n - 1].e = in->v[i].e;
            else VEC_PUSH(out, ((Span){in->v[i].s, in->v[i].e, 0}));
            prev = m;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < in->n; i++) {
            int m = in->v[i].m;
            if (m && !prev && out->n) out->v[out->n - 1].e = in->v[i].e;
            else VEC_PUSH(out, ((Span){in->v[i].s, in->v[i].e, 0}));
            prev = m;
        }
        break;
    case SPLIT_MERGED_NEXT:
        for (size_t i = in->n; i-- > 0;) {
            int m = in->v[i].m;
            if (m && !prev && out->n) out->v[out->n - 1].s = in->v[i].s;
            else VEC_PUSH(out, ((Span){in->v[i].s, in->v[i].e, 0}));
            prev = m;
        }
        for (size_t i = 0, j = out->n ? out->n - 1 : 0; i < j; i++, j--) {
            Span x = out->v[i];
            out->v[i] = out->v[j];
            out->v[j] = x;
        }
        break;
    }
}

/* ---- JSON helpers ---- */

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* What a JSON value is, for errors. */
static const char *jkind(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Optional fields of one JSON type: absent or null leave *out as it is; a value of another type is
 * an error naming where.key (a wrong type used to read as absent: "byte_fallback": "yes" as
 * false, "decoders": 5 as an empty chain). */
static int opt_bool(json_t *o, const char *key, const char *where, int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        errbuf_set(err, errlen, "%s.%s must be a boolean, not %s", where, key, jkind(v));
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int opt_str(json_t *o, const char *key, const char *where, const char **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) {
        errbuf_set(err, errlen, "%s.%s must be a string, not %s", where, key, jkind(v));
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

/* A list field (absent or null: NULL, which callers refuse or take as empty, each as HF does). */
static int opt_list(json_t *o, const char *key, const char *where, json_t **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) {
        errbuf_set(err, errlen, "%s.%s must be a list, not %s", where, key, jkind(v));
        return -1;
    }
    *out = v;
    return 0;
}

/* The "type" of a normalizer, pre-tokenizer, post-processor or decoder (what): j an object, its
 * type a string; NULL with err set otherwise. */
static const char *comp_type(json_t *j, const char *what, char *err, size_t errlen)
{
    json_t *t = json_object_get(j, "type");
    if (!json_is_object(j)) errbuf_set(err, errlen, "%s must be an object, not %s", what, jkind(j));
    else if (!t) errbuf_set(err, errlen, "%s has no type", what);
    else if (!json_is_string(t)) errbuf_set(err, errlen, "%s.type must be a string, not %s", what, jkind(t));
    else return json_string_value(t);
    return NULL;
}

/* Add a string to the arena; returns its offset. */
static uint32_t arena_add(Tokenizer *t, const char *s, size_t n)
{
    uint32_t off = (uint32_t)t->arena.n;
    buf_add(&t->arena, s, n);
    buf_add(&t->arena, "", 1);       /* keep the NUL inside: strings are NUL-terminated */
    return off;
}

/* ---- normalizers ---- */

static int norm_parse(Norm *n, json_t *j, char *err, size_t errlen);

static int norm_parse_seq(Norm *n, json_t *j, char *err, size_t errlen)
{
    n->kind = NORM_SEQ;
    json_t *arr;
    if (opt_list(j, "normalizers", "normalizer Sequence", &arr, err, errlen)) return -1;
    if (!arr) { errbuf_set(err, errlen, "normalizer Sequence: no normalizers list"); return -1; }
    n->n_kids = (int)json_array_size(arr);
    n->kids = xcalloc((size_t)n->n_kids + 1, sizeof *n->kids);
    for (int i = 0; i < n->n_kids; i++)
        if (norm_parse(&n->kids[i], json_array_get(arr, (size_t)i), err, errlen)) return -1;
    return 0;
}

static int norm_parse(Norm *n, json_t *j, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    const char *type = comp_type(j, "normalizer", err, errlen);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) return norm_parse_seq(n, j, err, errlen);
    if (!strcmp(type, "NFC")) { n->kind = NORM_NFC; return 0; }
    if (!strcmp(type, "NFD")) { n->kind = NORM_NFD; return 0; }
    if (!strcmp(type, "NFKC")) { n->kind = NORM_NFKC; return 0; }
    if (!strcmp(type, "NFKD")) { n->kind = NORM_NFKD; return 0; }
    if (!strcmp(type, "Lowercase")) { n->kind = NORM_LOWER; return 0; }
    if (!strcmp(type, "ByteLevel")) { n->kind = NORM_BYTELEVEL; return 0; }
    if (!strcmp(type, "Strip")) {
        n->kind = NORM_STRIP;
        return opt_bool(j, "strip_left", "normalizer Strip", &n->left, err, errlen) ||
               opt_bool(j, "strip_right", "normalizer Strip", &n->right, err, errlen) ? -1 : 0;
    }
    if (!strcmp(type, "Prepend")) {
        json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) { errbuf_set(err, errlen, "normalizer Prepend: no prepend string"); return -1; }
        n->kind = NORM_PREPEND;
        n->slen = json_string_length(p);
        n->s = xmalloc(n->slen + 1);
        memcpy(n->s, json_string_value(p), n->slen + 1);
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        json_t *pat = json_object_get(j, "pattern"), *c = json_object_get(j, "content");
        json_t *ps = json_object_get(pat, "String"), *pr = json_object_get(pat, "Regex");
        if (!json_is_string(c) || (!json_is_string(ps) && !json_is_string(pr))) {
            errbuf_set(err, errlen, "normalizer Replace: needs pattern.String or pattern.Regex and content");
            return -1;
        }
        n->kind = NORM_REPLACE;
        n->slen = json_string_length(c);
        n->s = xmalloc(n->slen + 1);
        memcpy(n->s, json_string_value(c), n->slen + 1);
        json_t *p = ps ? ps : pr;
        return regex_compile(&n->re, json_string_value(p), json_string_length(p), ps != NULL,
                             "normalizer Replace", err, errlen);
    }
    errbuf_set(err, errlen, "unsupported normalizer '%s' (supported: Sequence, NFC, NFD, NFKC, NFKD, "
               "Lowercase, Replace, Prepend, Strip, ByteLevel)", type);
    return -1;
}

static void norm_free(Norm *n)
{
    if (!n) return;
    for (int i = 0; i < n->n_kids; i++) norm_free(&n->kids[i]);
    free(n->kids);
    free(n->s);
    regex_free(&n->re);
}

static int norm_is_identity(const Norm *n)
{
    if (n->kind != NORM_SEQ) return 0;
    for (int i = 0; i < n->n_kids; i++)
        if (!norm_is_identity(&n->kids[i])) return 0;
    return 1;
}

/* Only code points below U+0300 (lead bytes below 0xCC): already NFC (none is a combining mark
 * or composes with its predecessor). */
static int below_u0300(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0xcc) return 0;
    return 1;
}

static int norm_unicode_run(int options, const char *s, size_t n, Buf *out, char *err, size_t errlen)
{
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | options));
    if (r < 0) {
        errbuf_set(err, errlen, "unicode normalization failed: %s", utf8proc_errmsg(r));
        return -1;
    }
    buf_add(out, dst, (size_t)r);
    free(dst);
    return 0;
}

/* NFC/NFD/NFKC/NFKD of s. An ASCII character is a starter that no form changes and that never
 * composes with what precedes it, so the text splits before each one: only the runs of
 * non-ASCII characters (with the ASCII character before them, a possible base) go through
 * utf8proc, and for NFC only those holding a code point from U+0300 up. */
static int norm_unicode(int options, int nfc, const char *s, size_t n, Buf *out, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < n) {
        size_t a = i;
        while (i < n && (unsigned char)s[i] < 0x80) i++;
        buf_add(out, s + a, i - a);
        if (i >= n) break;
        size_t st = i;
        while (i < n && (unsigned char)s[i] >= 0x80) i++;
        if (nfc && below_u0300(s + st, i - st)) { buf_add(out, s + st, i - st); continue; }
        if (st > 0) { st--; out->n--; }             /* the base character before the run */
        if (norm_unicode_run(options, s + st, i - st, out, err, errlen)) return -1;
    }
    if (!out->p) buf_reserve(out, 0);
    return 0;
}

/* Apply n to s, appending the result to out (out->n reset by the caller). */
static int norm_apply(const Norm *n, const char *s, size_t len, Buf *out, char *err, size_t errlen)
{
    switch (n->kind) {
    case NORM_SEQ: {
        Buf a = {0}, b = {0};
        buf_add(&a, s, len);
        int rc = 0;
        for (int i = 0; i < n->n_kids && !rc; i++) {
            b.n = 0;
            buf_reserve(&b, 0);
            rc = norm_apply(&n->kids[i], a.p, a.n, &b, err, errlen);
            Buf x = a; a = b; b = x;
        }
        if (!rc) buf_add(out, a.p, a.n);
        buf_free(&a);
        buf_free(&b);
        return rc;
    }
    case NORM_NFC:
        return norm_unicode(UTF8PROC_COMPOSE, 1, s, len, out, err, errlen);
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD:
        return norm_unicode(n->kind == NORM_NFD ? UTF8PROC_DECOMPOSE
                            : n->kind == NORM_NFKC ? UTF8PROC_COMPOSE | UTF8PROC_COMPAT
                                                   : UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
                            0, s, len, out, err, errlen);
    case NORM_LOWER:
        /* per character, full mapping (Rust char::to_lowercase): only U+0130 maps to two */
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            i += (size_t)utf8_decode(s + i, &cp);
            char o[8];
            if (cp == 0x130) { buf_add(out, "i\xcc\x87", 3); continue; }
            buf_add(out, o, (size_t)utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), o));
        }
        if (!out->p) buf_reserve(out, 0);
        return 0;
    case NORM_BYTELEVEL:
        buf_reserve(out, 2 * len);
        for (size_t i = 0; i < len; i++) buf_add(out, bl_utf8[(unsigned char)s[i]], bl_utf8_len[(unsigned char)s[i]]);
        return 0;
    case NORM_STRIP: {
        size_t a = 0, b = len;
        uint32_t cp;
        while (n->left && a < b) {
            int k = utf8_decode(s + a, &cp);
            if (!is_white(cp)) break;
            a += (size_t)k;
        }
        while (n->right && b > a) {
            size_t st = utf8_last_start(s, b);
            utf8_decode(s + st, &cp);
            if (!is_white(cp)) break;
            b = st;
        }
        buf_add(out, s + a, b - a);
        return 0;
    }
    case NORM_PREPEND:
        if (len) buf_add(out, n->s, n->slen);
        buf_add(out, s, len);
        return 0;
    case NORM_REPLACE: {
        /* a throwaway Enc for the matcher (normalizers are applied on short segments) */
        Enc e = {0};
        e.md = pcre2_match_data_create(1, NULL);
        e.err = err;
        e.errlen = errlen;
        int rc = find_matches(&e, &n->re, s, len, 0, &e.spans);
        for (size_t i = 0; !rc && i < e.spans.n; i++) {
            Span sp = e.spans.v[i];
            if (sp.m) buf_add(out, n->s, n->slen);
            else buf_add(out, s + sp.s, sp.e - sp.s);
        }
        if (!out->p) buf_reserve(out, 0);
        free(e.spans.v);
        pcre2_match_data_free(e.md);
        pcre2_match_context_free(e.mctx);
        pcre2_jit_stack_free(e.jstack);
        return rc;
    }
    }
    return 0;
}

/* ---- pre-tokenizers ---- */

static const char *const GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int pre_parse(Tokenizer *t, Pre *p, json_t *j, int depth, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (depth >= MAX_DEPTH) { errbuf_set(err, errlen, "pre_tokenizer: Sequences nested too deep"); return -1; }
    const char *type = comp_type(j, "pre_tokenizer", err, errlen);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        if (opt_list(j, "pretokenizers", "pre_tokenizer Sequence", &arr, err, errlen)) return -1;
        if (!arr) { errbuf_set(err, errlen, "pre_tokenizer Sequence: no pretokenizers list"); return -1; }
        p->kind = PRE_SEQ;
        p->n_kids = (int)json_array_size(arr);
        p->kids = xcalloc((size_t)p->n_kids + 1, sizeof *p->kids);
        for (int i = 0; i < p->n_kids; i++)
            if (pre_parse(t, &p->kids[i], json_array_get(arr, (size_t)i), depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->kind = PRE_BYTELEVEL;
        p->add_prefix_space = p->use_regex = 1;
        int trim = 0;
        if (opt_bool(j, "add_prefix_space", "pre_tokenizer ByteLevel", &p->add_prefix_space, err, errlen) ||
            opt_bool(j, "use_regex", "pre_tokenizer ByteLevel", &p->use_regex, err, errlen) ||
            opt_bool(j, "trim_offsets", "pre_tokenizer ByteLevel", &trim, err, errlen)) return -1;
        if (p->use_regex && !t->gpt2.code &&
            regex_compile(&t->gpt2, GPT2_RE, strlen(GPT2_RE), 0, "ByteLevel", err, errlen)) return -1;
        return 0;
    }
    p->kind = PRE_SPLIT;
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(j, "pattern");
        json_t *ps = json_object_get(pat, "String"), *pr = json_object_get(pat, "Regex");
        const char *beh = NULL;
        if (opt_str(j, "behavior", "pre_tokenizer Split", &beh, err, errlen)) return -1;
        if ((!json_is_string(ps) && !json_is_string(pr)) || !beh) {
            errbuf_set(err, errlen, "pre_tokenizer Split: needs pattern.String or pattern.Regex and behavior");
            return -1;
        }
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(beh, names[i])) b = i;
        if (b < 0) { errbuf_set(err, errlen, "pre_tokenizer Split: unknown behavior '%s'", beh); return -1; }
        p->behavior = (SplitBehavior)b;
        if (opt_bool(j, "invert", "pre_tokenizer Split", &p->invert, err, errlen)) return -1;
        json_t *pj = ps ? ps : pr;
        return regex_compile(&p->re, json_string_value(pj), json_string_length(pj), ps != NULL,
                             "pre_tokenizer Split", err, errlen);
    }
    /* The simple HF pre-tokenizers are Splits on a character class. */
    const char *re = NULL;
    if (!strcmp(type, "Digits")) {
        re = "\\p{N}";
        int single = 0;
        if (opt_bool(j, "individual_digits", "pre_tokenizer Digits", &single, err, errlen)) return -1;
        p->behavior = single ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
    } else if (!strcmp(type, "Punctuation")) {
        re = "[\\p{P}!-/:-@\\[-`{-~]";
        const char *beh = "Isolated";   /* HF's default */
        if (opt_str(j, "behavior", "pre_tokenizer Punctuation", &beh, err, errlen)) return -1;
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(beh, names[i])) b = i;
        if (b < 0) { errbuf_set(err, errlen, "pre_tokenizer Punctuation: unknown behavior '%s'", beh); return -1; }
        p->behavior = (SplitBehavior)b;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        re = "[\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]";
        p->behavior = SPLIT_REMOVED;
    } else if (!strcmp(type, "Whitespace")) {
        re = "[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]+|[^\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}"
             "\\x{200c}\\x{200d}\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
             "\\x{202f}\\x{205f}\\x{3000}]+";
        p->behavior = SPLIT_REMOVED;
        p->invert = 1;
    } else {
        errbuf_set(err, errlen, "unsupported pre_tokenizer '%s' (supported: Sequence, Split, ByteLevel, Digits, "
                   "Punctuation, Whitespace, WhitespaceSplit)", type);
        return -1;
    }
    return regex_compile(&p->re, re, strlen(re), 0, type, err, errlen);
}

static void pre_free(Pre *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_kids; i++) pre_free(&p->kids[i]);
    free(p->kids);
    regex_free(&p->re);
}

/* Split every piece of e->pieces with re (invert, behavior) into e->tmp, then swap. */
static int pre_split(Enc *e, const Regex *re, int invert, SplitBehavior b)
{
    Pieces *out = &e->tmp;
    out->n = 0;
    for (size_t i = 0; i < e->pieces.n; i++) {
        Piece pc = e->pieces.v[i];
        if (find_matches(e, re, e->work.p + pc.off, pc.len, invert, &e->spans)) return -1;
        split_behave(&e->spans, b, &e->spans2);
        for (size_t k = 0; k < e->spans2.n; k++) {
            Span sp = e->spans2.v[k];
            if (sp.e > sp.s) VEC_PUSH(out, ((Piece){pc.off + sp.s, sp.e - sp.s}));
        }
    }
    Pieces x = e->pieces; e->pieces = *out; *out = x;
    return 0;
}

static int pre_apply(Enc *e, const Pre *p)
{
    switch (p->kind) {
    case PRE_SEQ:
        for (int i = 0; i < p->n_kids; i++)
            if (pre_apply(e, &p->kids[i])) return -1;
        return 0;
    case PRE_SPLIT:
        return pre_split(e, &p->re, p->invert, p->behavior);
    case PRE_BYTELEVEL:
        if (p->add_prefix_space)
            for (size_t i = 0; i < e->pieces.n; i++) {
                Piece *pc = &e->pieces.v[i];
                if (e->work.p[pc->off] == ' ') continue;
                buf_reserve(&e->work, pc->len + 1);
                uint32_t off = (uint32_t)e->work.n;
                e->work.p[e->work.n++] = ' ';
                memcpy(e->work.p + e->work.n, e->work.p + pc->off, pc->len);
                e->work.n += pc->len;
                *pc = (Piece){off, pc->len + 1};
            }
        if (p->use_regex && pre_split(e, &e->t->gpt2, 0, SPLIT_ISOLATED)) return -1;
        /* every byte becomes its printable stand-in character */
        for (size_t i = 0; i < e->pieces.n; i++) {
            Piece *pc = &e->pieces.v[i];
            buf_reserve(&e->work, 2 * (size_t)pc->len);
            uint32_t off = (uint32_t)e->work.n;
            char *o = e->work.p + e->work.n;
            const unsigned char *s = (const unsigned char *)e->work.p + pc->off;
            for (uint32_t k = 0; k < pc->len; k++) {
                o[0] = bl_utf8[s[k]][0];
                o[1] = bl_utf8[s[k]][1];
                o += bl_utf8_len[s[k]];
            }
            e->work.n = (size_t)(o - e->work.p);
            *pc = (Piece){off, (uint32_t)(e->work.n - off)};
        }
        return 0;
    }
    return 0;
}

/* ---- BPE ---- */

static void heap_push(Enc *e, HeapItem x)
{
    if (e->hn == e->hcap) { e->hcap = e->hcap ? 2 * e->hcap : 256; e->heap = xrealloc(e->heap, e->hcap * sizeof *e->heap); }
    size_t i = e->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        HeapItem *q = &e->heap[p];
        if (q->rank < x.rank || (q->rank == x.rank && q->pos <= x.pos)) break;
        e->heap[i] = *q;
        i = p;
    }
    e->heap[i] = x;
}

static HeapItem heap_pop(Enc *e)
{
    HeapItem top = e->heap[0], x = e->heap[--e->hn];
    size_t i = 0, n = e->hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (e->heap[c + 1].rank < e->heap[c].rank ||
                          (e->heap[c + 1].rank == e->heap[c].rank && e->heap[c + 1].pos < e->heap[c].pos))) c++;
        if (x.rank < e->heap[c].rank || (x.rank == e->heap[c].rank && x.pos <= e->heap[c].pos)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    e->heap[i] = x;
    return top;
}

static void sym_add(Enc *e, size_t *n, int32_t id, uint32_t len)
{
    if (*n == e->scap) {
        e->scap = e->scap ? 2 * e->scap : 256;
        e->sc = xrealloc(e->sc, e->scap * sizeof *e->sc);
        e->sprev = xrealloc(e->sprev, e->scap * sizeof *e->sprev);
        e->snext = xrealloc(e->snext, e->scap * sizeof *e->snext);
        e->slen = xrealloc(e->slen, e->scap * sizeof *e->slen);
    }
    size_t i = (*n)++;
    e->sc[i] = id;
    e->slen[i] = len;
    e->sprev[i] = (int32_t)i - 1;
    e->snext[i] = -1;
    if (i > 0) e->snext[i - 1] = (int32_t)i;
}

static int32_t vocab_id(const Tokenizer *t, const char *s, size_t n)
{
    return map_get(&t->vocab, t->arena.p, s, n);
}

/* BPE::merge_word then Word::merge_all (models/bpe/word.rs): the word's characters as symbols,
 * then merges applied lowest rank first (ties: leftmost), a queued merge skipped when its pair
 * no longer yields the same token. Appends the ids to out. */
static int bpe_merge_word(Enc *e, const char *w, size_t n, IntVec *out)
{
    const Tokenizer *t = e->t;
    size_t ns = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = (size_t)utf8_decode(w + i, &cp);
        int first = i == 0, last = i + cl >= n;
        const char *s = w + i;
        size_t sl = cl;
        if ((!first && t->prefix) || (last && t->suffix)) {
            e->sbuf.n = 0;
            if (!first && t->prefix) buf_add(&e->sbuf, t->prefix, strlen(t->prefix));
            buf_add(&e->sbuf, w + i, cl);
            if (last && t->suffix) buf_add(&e->sbuf, t->suffix, strlen(t->suffix));
            s = e->sbuf.p;
            sl = e->sbuf.n;
        }
        i += cl;
        int32_t id = s == w + i - cl && cp < 0x144 ? t->char_ids[cp] : vocab_id(t, s, sl);
        if (id >= 0) {
            if (unk_id >= 0) { sym_add(e, &ns, unk_id, unk_len); unk_id = -1; }
            sym_add(e, &ns, id, (uint32_t)cl);
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t k = 0; k < sl; k++) ok &= t->byte_ids[(unsigned char)s[k]] >= 0;
            if (ok) {
                for (size_t k = 0; k < sl; k++) sym_add(e, &ns, t->byte_ids[(unsigned char)s[k]], 1);
                continue;
            }
        }
        if (t->unk) {
            int32_t u = vocab_id(t, t->unk, strlen(t->unk));
            if (u < 0) { errbuf_set(e->err, e->errlen, "unk_token '%s' is not in the vocabulary", t->unk); return -1; }
            if (unk_id >= 0 && t->fuse_unk) unk_len += (uint32_t)cl;
            else {
                if (unk_id >= 0) sym_add(e, &ns, unk_id, unk_len);
                unk_id = u;
                unk_len = (uint32_t)cl;
            }
        }
        /* no unk token: the character is dropped, as HF does */
    }
    if (unk_id >= 0) sym_add(e, &ns, unk_id, unk_len);

    e->hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const MSlot *m = merges_get(&t->merges, e->sc[i], e->sc[i + 1]);
        if (m) heap_push(e, (HeapItem){(uint32_t)m->rank, (uint32_t)i, m->id, e->sc[i], e->sc[i + 1]});
    }
    while (e->hn) {
        HeapItem top = heap_pop(e);
        size_t p = top.pos;
        if (e->slen[p] == 0 || e->snext[p] < 0) continue;
        size_t r = (size_t)e->snext[p];
        const MSlot *m;
        if (e->sc[p] != top.left || e->sc[r] != top.right) {    /* HF's test: the pair now there yields the same token */
            m = merges_get(&t->merges, e->sc[p], e->sc[r]);
            if (!m || m->id != top.id) continue;
        }
        e->sc[p] = top.id;
        e->slen[p] += e->slen[r];
        e->snext[p] = e->snext[r];
        e->slen[r] = 0;
        if (e->snext[r] >= 0) e->sprev[e->snext[r]] = (int32_t)p;
        if (e->sprev[p] >= 0) {
            size_t q = (size_t)e->sprev[p];
            m = merges_get(&t->merges, e->sc[q], e->sc[p]);
            if (m) heap_push(e, (HeapItem){(uint32_t)m->rank, (uint32_t)q, m->id, e->sc[q], e->sc[p]});
        }
        if (e->snext[p] >= 0) {
            m = merges_get(&t->merges, e->sc[p], e->sc[e->snext[p]]);
            if (m) heap_push(e, (HeapItem){(uint32_t)m->rank, (uint32_t)p, m->id, e->sc[p], e->sc[e->snext[p]]});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (e->slen[i]) ivec_push(out, e->sc[i]);
    return 0;
}

/* BPE::tokenize for one pre-token, through ignore_merges and the word cache. */
static int bpe_word(Enc *e, const char *w, size_t n)
{
    const Tokenizer *t = e->t;
    if (n == 0) return 0;
    uint64_t h = hash_bytes(w, n);
    if (t->ignore_merges) {
        int32_t id = map_get_h(&t->vocab, t->arena.p, w, n, h);
        if (id >= 0) { ivec_push(e->out, id); return 0; }
    }
    int32_t c = map_get_h(&e->cache, e->ckeys.p, w, n, h);
    if (c >= 0) {
        int32_t k = e->cids.v[c];
        for (int32_t i = 0; i < k; i++) ivec_push(e->out, e->cids.v[c + 1 + i]);
        return 0;
    }
    size_t before = e->out->n;
    if (bpe_merge_word(e, w, n, e->out)) return -1;
    if (n < CACHE_MAX_WORD && e->cache.n < CACHE_MAX_ENTRIES) {
        uint32_t off = (uint32_t)e->ckeys.n;
        buf_add(&e->ckeys, w, n);
        int32_t at = (int32_t)e->cids.n;
        ivec_push(&e->cids, (int32_t)(e->out->n - before));
        for (size_t i = before; i < e->out->n; i++) ivec_push(&e->cids, e->out->v[i]);
        map_put(&e->cache, e->ckeys.p, off, (uint32_t)n, at);
    }
    return 0;
}

/* ---- added tokens ---- */

static int trie_child(const Trie *tr, int node, uint8_t b)
{
    for (int c = tr->n[node].child; c >= 0; c = tr->n[c].sibling)
        if (tr->n[c].byte == b) return c;
    return -1;
}

static void trie_insert(Trie *tr, const char *s, size_t n, int tok)
{
    if (!tr->count) {
        tr->cap = 64;
        tr->n = xmalloc((size_t)tr->cap * sizeof *tr->n);
        tr->n[0] = (TrieNode){-1, -1, -1, 0};
        tr->count = 1;
    }
    int node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int c = trie_child(tr, node, b);
        if (c < 0) {
            if (tr->count == tr->cap) tr->n = xrealloc(tr->n, (size_t)(tr->cap *= 2) * sizeof *tr->n);
            c = tr->count++;
            tr->n[c] = (TrieNode){-1, tr->n[node].child, -1, b};
            tr->n[node].child = c;
        }
        node = c;
    }
    tr->n[node].tok = tok;
    if (n) tr->first[(uint8_t)s[0]] = 1;
}

/* Leftmost-longest match at or after pos: returns its start (or n) and sets *end, *tok. */
static size_t trie_find(const Trie *tr, const char *s, size_t n, size_t pos, size_t *end, int *tok)
{
    if (!tr->count) return n;
    for (size_t i = pos; i < n; i++) {
        if (!tr->first[(uint8_t)s[i]]) continue;
        int node = 0, best = -1;
        size_t best_end = 0;
        for (size_t k = i; k < n; k++) {
            node = trie_child(tr, node, (uint8_t)s[k]);
            if (node < 0) break;
            if (tr->n[node].tok >= 0) { best = tr->n[node].tok; best_end = k + 1; }
        }
        if (best >= 0) { *end = best_end; *tok = best; return i; }
    }
    return n;
}

/* AddedVocabulary::find_matches: cut s into text and added-token segments. */
static void added_split(const Tokenizer *t, const Trie *tr, const char *s, size_t n, Segs *out)
{
    out->n = 0;
    size_t pos = 0, start_off = 0;
    for (;;) {
        size_t end;
        int k;
        size_t st = trie_find(tr, s, n, pos, &end, &k);
        if (st >= n) break;
        pos = end;
        const AddedTok *a = &t->added[k];
        size_t stop = end;
        uint32_t cp;
        if (a->single_word) {
            int before_word = 0, after_word = 0;
            if (st > 0) { utf8_decode(s + utf8_last_start(s, st), &cp); before_word = is_word(cp); }
            if (stop < n) { utf8_decode(s + stop, &cp); after_word = is_word(cp); }
            if (before_word || after_word) continue;
        }
        if (a->lstrip) {
            size_t ns = st;
            while (ns > 0) {
                size_t ps = utf8_last_start(s, ns);
                utf8_decode(s + ps, &cp);
                if (!is_white(cp)) break;
                ns = ps;
            }
            st = ns > start_off ? ns : start_off;
        }
        if (a->rstrip)
            while (stop < n) {
                int l = utf8_decode(s + stop, &cp);
                if (!is_white(cp)) break;
                stop += (size_t)l;
            }
        if (start_off < st) VEC_PUSH(out, ((Seg){(uint32_t)start_off, (uint32_t)(st - start_off), -1}));
        VEC_PUSH(out, ((Seg){(uint32_t)st, (uint32_t)(stop - st), a->id}));
        start_off = stop;
    }
    if (start_off < n) VEC_PUSH(out, ((Seg){(uint32_t)start_off, (uint32_t)(n - start_off), -1}));
}

/* ---- encode ---- */

/* Pre-tokenize and BPE one piece of normalized text. */
static int encode_text(Enc *e, const char *s, size_t n)
{
    if (!n) return 0;
    e->work.n = 0;
    buf_add(&e->work, s, n);
    e->pieces.n = 0;
    VEC_PUSH(&e->pieces, ((Piece){0, (uint32_t)n}));
    if (e->t->pre && pre_apply(e, e->t->pre)) return -1;
    for (size_t i = 0; i < e->pieces.n; i++)
        if (bpe_word(e, e->work.p + e->pieces.v[i].off, e->pieces.v[i].len)) return -1;
    return 0;
}

/* A text segment between raw added tokens: normalize, then cut out the normalized added tokens. */
static int encode_segment(Enc *e, const char *s, size_t n)
{
    const Tokenizer *t = e->t;
    if (t->norm) {
        e->nbuf.n = 0;
        buf_reserve(&e->nbuf, n);
        if (norm_apply(t->norm, s, n, &e->nbuf, e->err, e->errlen)) return -1;
        s = e->nbuf.p;
        n = e->nbuf.n;
    }
    if (!t->norm_trie.count) return encode_text(e, s, n);
    added_split(t, &t->norm_trie, s, n, &e->normd);
    for (size_t i = 0; i < e->normd.n; i++) {
        Seg g = e->normd.v[i];
        if (g.id >= 0) ivec_push(e->out, g.id);
        else if (encode_text(e, s + g.off, g.len)) return -1;
    }
    return 0;
}

static void enc_free(Enc *e)
{
    buf_free(&e->work); buf_free(&e->nbuf); buf_free(&e->sbuf); buf_free(&e->ckeys);
    free(e->pieces.v);
    free(e->tmp.v);
    free(e->spans.v); free(e->spans2.v); free(e->raw.v); free(e->normd.v);
    map_free(&e->cache);
    free(e->cids.v);
    free(e->sc); free(e->sprev); free(e->snext); free(e->slen); free(e->heap);
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jstack);
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int add_special, int **ids, char *err,
                     size_t errlen)
{
    *ids = NULL;
    if (len > MAX_TEXT) {
        errbuf_set(err, errlen, "text too long: %zu bytes (limit %u MiB)", len, MAX_TEXT >> 20);
        return -1;
    }
    Buf clean = {0};
    if (!utf8_valid(text, len)) {       /* HF takes a str: invalid bytes arrive as U+FFFD */
        utf8_lossy(&clean, text, len);
        text = clean.p;
        len = clean.n;
    }
    IntVec out = {0};
    Enc e = {0};
    e.t = t;
    e.out = &out;
    e.err = err;
    e.errlen = errlen;
    e.md = pcre2_match_data_create(1, NULL);
    int rc = 0;
    added_split(t, &t->raw_trie, text, len, &e.raw);
    for (size_t i = 0; i < e.raw.n && !rc; i++) {
        Seg g = e.raw.v[i];
        if (g.id >= 0) ivec_push(&out, g.id);
        else rc = encode_segment(&e, text + g.off, g.len);
    }
    enc_free(&e);
    buf_free(&clean);
    if (rc) { free(out.v); return -1; }
    if (add_special)
        for (int p = 0; p < t->n_post; p++) {
            const Template *tp = &t->post[p];
            IntVec next = {0};
            for (int k = 0; k < tp->n; k++) {
                const TplItem *it = &tp->items[k];
                if (it->is_seq) for (size_t i = 0; i < out.n; i++) ivec_push(&next, out.v[i]);
                else for (int i = 0; i < it->n; i++) ivec_push(&next, it->ids[i]);
            }
            free(out.v);
            out = next;
        }
    if (out.n > (size_t)INT32_MAX) { free(out.v); errbuf_set(err, errlen, "too many tokens"); return -1; }
    if (!out.v) out.v = xmalloc(sizeof *out.v);
    *ids = out.v;
    return (int)out.n;
}

/* ---- decode ---- */

static int token_bytes(const Tokenizer *t, int id, int skip_special, const char **p, size_t *n)
{
    if (id < 0 || id >= t->n_ids || t->dec[id] < 0) return 0;   /* unknown ids are dropped, as HF */
    if (skip_special && t->special[id]) return 0;
    *p = t->dec_bytes.p + (t->dec[id] >> 32);
    *n = (size_t)(t->dec[id] & 0xffffffff);
    return 1;
}

int tokenizer_decode(const Tokenizer *t, const int *ids, int n, int skip_special, char **text, size_t *len)
{
    Buf raw = {0}, out = {0};
    int first = 1;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t k;
        if (!token_bytes(t, ids[i], skip_special, &p, &k)) continue;
        if (t->decoder == DEC_NONE && !first) buf_add(&raw, " ", 1);
        buf_add(&raw, p, k);
        first = 0;
    }
    utf8_lossy(&out, raw.p ? raw.p : "", raw.n);
    buf_free(&raw);
    if (!out.p) buf_reserve(&out, 0), out.p[0] = 0;
    *text = out.p;
    if (len) *len = out.n;
    return 0;
}

void detok_init(Detokenizer *d, const Tokenizer *t, int skip_special)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = skip_special;
}

/* Feed bytes through the held-back UTF-8 state; writes complete characters (invalid sequences as
 * U+FFFD, as the whole-text decode does) to out. -1 if cap is too small. */
static int detok_feed(Detokenizer *d, const char *s, size_t n, char *out, size_t cap, size_t *w)
{
    for (size_t i = 0; i < n; i++) {
        d->pending[d->n_pending++] = s[i];
        for (;;) {
            int r = utf8_check((const unsigned char *)d->pending, (size_t)d->n_pending);
            if (r == 0) break;
            size_t emit = r > 0 ? (size_t)r : 3;
            if (*w + emit + 1 > cap) return -1;
            memcpy(out + *w, r > 0 ? d->pending : REPLACEMENT, emit);
            *w += emit;
            int used = r > 0 ? r : -r;
            memmove(d->pending, d->pending + used, (size_t)(d->n_pending - used));
            d->n_pending -= used;
            if (!d->n_pending) break;
        }
    }
    return 0;
}

int detok_push(Detokenizer *d, int id, char *out, size_t cap)
{
    const char *p;
    size_t n, w = 0;
    if (!cap) return -1;
    out[0] = 0;
    if (!token_bytes(d->tok, id, d->skip_special, &p, &n)) return 0;
    Detokenizer save = *d;
    int rc = 0;
    if (d->tok->decoder == DEC_NONE && d->started) rc = detok_feed(d, " ", 1, out, cap, &w);
    if (!rc) rc = detok_feed(d, p, n, out, cap, &w);
    if (rc) { *d = save; out[0] = 0; return -1; }
    d->started = 1;
    out[w] = 0;
    return (int)w;
}

int detok_flush(Detokenizer *d, char *out, size_t cap)
{
    if (!cap) return -1;
    out[0] = 0;
    if (!d->n_pending) return 0;
    if (cap < 4) return -1;
    memcpy(out, REPLACEMENT, 3);      /* the held bytes are a valid prefix: one U+FFFD, as from_utf8_lossy */
    out[3] = 0;
    d->n_pending = 0;
    return 3;
}

/* ---- loading ---- */

static int load_model(Tokenizer *t, json_t *m, int *maxid_out, char *err, size_t errlen)
{
    if (!m || json_is_null(m)) { errbuf_set(err, errlen, "no model"); return -1; }
    if (!json_is_object(m)) { errbuf_set(err, errlen, "model must be an object, not %s", jkind(m)); return -1; }
    const char *type = NULL, *s = NULL;
    if (opt_str(m, "type", "model", &type, err, errlen)) return -1;
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (type && strcmp(type, "BPE")) {
        errbuf_set(err, errlen, "unsupported model type '%s' (supported: BPE)", type);
        return -1;
    }
    if (vocab && !json_is_object(vocab)) { errbuf_set(err, errlen, "model.vocab must be an object, not %s", jkind(vocab)); return -1; }
    if (merges && !json_is_array(merges)) { errbuf_set(err, errlen, "model.merges must be a list, not %s", jkind(merges)); return -1; }
    if (!vocab || !merges) {
        errbuf_set(err, errlen, "model: %s", !type ? "no type (only BPE is supported)" : "BPE needs vocab and merges");
        return -1;
    }
    json_t *drop = json_object_get(m, "dropout");
    if (drop && !json_is_null(drop) && !json_is_number(drop)) {
        errbuf_set(err, errlen, "model.dropout must be a number, not %s", jkind(drop));
        return -1;
    }
    if (json_is_number(drop) && json_number_value(drop) > 0) {
        errbuf_set(err, errlen, "unsupported: BPE dropout %g (random segmentation)", json_number_value(drop));
        return -1;
    }
    if (opt_bool(m, "ignore_merges", "model", &t->ignore_merges, err, errlen) ||
        opt_bool(m, "byte_fallback", "model", &t->byte_fallback, err, errlen) ||
        opt_bool(m, "fuse_unk", "model", &t->fuse_unk, err, errlen)) return -1;
    /* an empty prefix or suffix is no prefix or suffix */
    if (opt_str(m, "continuing_subword_prefix", "model", &s, err, errlen)) return -1;
    if (s && *s) t->prefix = xstrdup(s);
    s = NULL;
    if (opt_str(m, "end_of_word_suffix", "model", &s, err, errlen)) return -1;
    if (s && *s) t->suffix = xstrdup(s);
    s = NULL;
    if (opt_str(m, "unk_token", "model", &s, err, errlen)) return -1;
    if (s) t->unk = xstrdup(s);

    const char *key;
    json_t *v;
    int maxid = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_IDS) {
            errbuf_set(err, errlen, "model.vocab: bad id for '%s'", key);
            return -1;
        }
        size_t kl = strlen(key);
        uint32_t off = arena_add(t, key, kl);
        int id = (int)json_integer_value(v);
        map_put(&t->vocab, t->arena.p, off, (uint32_t)kl, id);
        if (id > maxid) maxid = id;
    }
    t->vocab_len = (int)t->vocab.n;
    for (uint32_t cp = 0; cp < 0x144; cp++) {
        char c[4];
        t->char_ids[cp] = vocab_id(t, c, (size_t)utf8_encode(cp, c));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = vocab_id(t, name, strlen(name));
    }

    size_t plen = t->prefix ? strlen(t->prefix) : 0;
    Buf tmp = {0};
    size_t nm = json_array_size(merges);
    for (size_t i = 0; i < nm; i++) {
        json_t *mj = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(mj)) {
            const char *ms = json_string_value(mj), *sp = strchr(ms, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                errbuf_set(err, errlen, "model.merges[%zu]: '%s' is not two tokens separated by one space", i, ms);
                buf_free(&tmp);
                return -1;
            }
            a = ms; al = (size_t)(sp - ms);
            b = sp + 1; bl = strlen(b);
        } else if (json_is_array(mj) && json_array_size(mj) == 2 && json_is_string(json_array_get(mj, 0)) &&
                   json_is_string(json_array_get(mj, 1))) {
            a = json_string_value(json_array_get(mj, 0)); al = strlen(a);
            b = json_string_value(json_array_get(mj, 1)); bl = strlen(b);
        } else {
            errbuf_set(err, errlen, "model.merges[%zu]: neither \"a b\" nor [a, b]", i);
            buf_free(&tmp);
            return -1;
        }
        int32_t ia = vocab_id(t, a, al), ib = vocab_id(t, b, bl);
        tmp.n = 0;
        buf_add(&tmp, a, al);
        if (bl >= plen) buf_add(&tmp, b + plen, bl - plen);
        int32_t im = vocab_id(t, tmp.p, tmp.n);
        if (ia < 0 || ib < 0 || im < 0) {
            errbuf_set(err, errlen, "model.merges[%zu]: token '%.*s' is not in the vocabulary", i,
                       (int)(ia < 0 ? al : ib < 0 ? bl : tmp.n), ia < 0 ? a : ib < 0 ? b : tmp.p);
            buf_free(&tmp);
            return -1;
        }
        merges_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    buf_free(&tmp);
    *maxid_out = maxid;
    return 0;
}

/* Make added_of cover ids below n (new entries -1); it grows by doubling, so the index of n added
 * tokens costs O(n), not the O(n^2) of a search of the list per token. */
static void added_of_reserve(Tokenizer *t, size_t n)
{
    if (n <= t->added_of_n) return;
    size_t cap = t->added_of_n ? 2 * t->added_of_n : 1024;
    if (cap < n) cap = n;
    t->added_of = xrealloc(t->added_of, cap * sizeof *t->added_of);
    for (size_t i = t->added_of_n; i < cap; i++) t->added_of[i] = -1;
    t->added_of_n = cap;
}

/* AddedVocabulary::add_tokens: an added token's id is its content's id if the content is
 * already known (added, then model vocabulary), else the next free id; the id in the file is not
 * used (HF only warns when it differs). */
static int add_token(Tokenizer *t, json_t *j, const char *where, int *next_id, char *err, size_t errlen)
{
    json_t *c = json_object_get(j, "content");
    if (!json_is_object(j)) { errbuf_set(err, errlen, "%s must be an object, not %s", where, jkind(j)); return -1; }
    if (!c) { errbuf_set(err, errlen, "%s has no content", where); return -1; }
    if (!json_is_string(c)) { errbuf_set(err, errlen, "%s.content must be a string, not %s", where, jkind(c)); return -1; }
    const char *s = json_string_value(c);
    size_t n = json_string_length(c);
    if (!n) return 0;
    AddedTok a = {0};
    int single_word = 0, lstrip = 0, rstrip = 0, special = 0, normalized = -1;
    if (opt_bool(j, "single_word", where, &single_word, err, errlen) || opt_bool(j, "lstrip", where, &lstrip, err, errlen) ||
        opt_bool(j, "rstrip", where, &rstrip, err, errlen) || opt_bool(j, "special", where, &special, err, errlen) ||
        opt_bool(j, "normalized", where, &normalized, err, errlen)) return -1;
    a.single_word = (uint8_t)single_word;
    a.lstrip = (uint8_t)lstrip;
    a.rstrip = (uint8_t)rstrip;
    a.special = (uint8_t)special;
    a.normalized = (uint8_t)(normalized < 0 ? !special : normalized);
    int32_t id = map_get(&t->added_map, t->arena.p, s, n);
    if (id < 0) id = vocab_id(t, s, n);
    if (id < 0) id = (*next_id)++;
    a.id = id;
    a.off = arena_add(t, s, n);
    a.len = (uint32_t)n;
    a.moff = a.off;
    a.mlen = a.len;
    map_put(&t->added_map, t->arena.p, a.off, a.len, id);
    added_of_reserve(t, (size_t)id + 1);
    if (t->added_of[id] >= 0) { t->added[t->added_of[id]] = a; return 0; }   /* a token with this id: replaced */
    if (t->n_added == t->added_cap) {
        t->added_cap = t->added_cap ? 2 * t->added_cap : 64;
        t->added = xrealloc(t->added, (size_t)t->added_cap * sizeof *t->added);
    }
    t->added_of[id] = t->n_added;
    t->added[t->n_added++] = a;
    return 0;
}

static int add_tokens(Tokenizer *t, json_t *list, int *next_id, char *err, size_t errlen)
{
    size_t i;
    json_t *j;
    json_array_foreach(list, i, j) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (add_token(t, j, where, next_id, err, errlen)) return -1;
    }
    return 0;
}

/* A post-processor's special token id: an integer id of the vocabulary (checked against it once
 * the vocabulary is complete, in check_post_ids), as the encode output goes to the embedding. */
static int template_id(json_t *v, const char *name, int32_t *out, char *err, size_t errlen)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_IDS) {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        errbuf_set(err, errlen, "post_processor: special token '%s' has a bad id %.40s", name, s ? s : "(none)");
        free(s);
        return -1;
    }
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int parse_template_item(Tokenizer *t, json_t *it, json_t *specials, TplItem *out, char *err, size_t errlen)
{
    (void)t;
    json_t *seq = json_object_get(it, "Sequence"), *sp = json_object_get(it, "SpecialToken");
    const char *name = NULL, *seqid = NULL;
    if (json_is_string(it)) {                 /* "$A", "$B:1", "<s>", "<s>:0" */
        const char *s = json_string_value(it);
        if (s[0] == '$') seqid = s[1] && s[1] != ':' ? s + 1 : "A";
        else name = s;
    } else if (seq) seqid = jstr(seq, "id");
    else if (sp) name = jstr(sp, "id");
    if (seqid) {
        if (seqid[0] != 'A' && seqid[0] != '0') {
            errbuf_set(err, errlen, "post_processor TemplateProcessing: the single template uses sequence '%s'", seqid);
            return -1;
        }
        out->is_seq = 1;
        return 0;
    }
    if (!name) { errbuf_set(err, errlen, "post_processor TemplateProcessing: bad template piece"); return -1; }
    char nm[512];
    snprintf(nm, sizeof nm, "%s", name);
    char *colon = json_is_string(it) ? strrchr(nm, ':') : NULL;
    if (colon && colon != nm && !json_object_get(specials, nm)) *colon = 0;
    json_t *st = json_object_get(specials, nm), *ids = json_object_get(st, "ids");
    if (!json_is_array(ids)) {
        errbuf_set(err, errlen, "post_processor TemplateProcessing: special token '%s' has no ids", nm);
        return -1;
    }
    out->n = (int)json_array_size(ids);
    out->ids = xmalloc(((size_t)out->n + 1) * sizeof *out->ids);
    for (int k = 0; k < out->n; k++)
        if (template_id(json_array_get(ids, (size_t)k), nm, &out->ids[k], err, errlen)) return -1;
    return 0;
}

static int post_parse(Tokenizer *t, json_t *j, char *err, size_t errlen)
{
    const char *type = comp_type(j, "post_processor", err, errlen);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        if (opt_list(j, "processors", "post_processor Sequence", &arr, err, errlen)) return -1;
        if (!arr) { errbuf_set(err, errlen, "post_processor Sequence: no processors list"); return -1; }
        size_t i;
        json_t *k;
        json_array_foreach(arr, i, k)
            if (post_parse(t, k, err, errlen)) return -1;
        return 0;
    }
    int flag = 0;                                  /* offsets only: checked, not used */
    if (opt_bool(j, "trim_offsets", "post_processor", &flag, err, errlen) ||
        opt_bool(j, "add_prefix_space", "post_processor", &flag, err, errlen)) return -1;
    if (!strcmp(type, "ByteLevel")) return 0;
    Template tp = {0};
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (json_is_string(single)) {             /* "<s> $A </s>" */
            json_t *arr = json_array();
            char *s = xstrdup(json_string_value(single)), *save;
            for (char *w = strtok_r(s, " ", &save); w; w = strtok_r(NULL, " ", &save))
                json_array_append_new(arr, json_string(w));
            free(s);
            json_object_set_new(j, "single", arr);
            single = arr;
        }
        if (!json_is_array(single)) { errbuf_set(err, errlen, "post_processor TemplateProcessing: no single template"); return -1; }
        tp.n = (int)json_array_size(single);
        tp.items = xcalloc((size_t)tp.n + 1, sizeof *tp.items);
        for (int i = 0; i < tp.n; i++)
            if (parse_template_item(t, json_array_get(single, (size_t)i), specials, &tp.items[i], err, errlen)) {
                for (int k = 0; k <= i; k++) free(tp.items[k].ids);
                free(tp.items);
                return -1;
            }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_array(cls) || !json_is_array(sep)) {
            errbuf_set(err, errlen, "post_processor %s: needs cls and sep", type);
            return -1;
        }
        tp.n = 3;
        tp.items = xcalloc(4, sizeof *tp.items);
        tp.items[1].is_seq = 1;
        json_t *ends[2] = {cls, sep};
        for (int k = 0; k < 2; k++) {
            TplItem *it = &tp.items[k ? 2 : 0];
            it->n = 1;
            it->ids = xmalloc(sizeof *it->ids);
            if (template_id(json_array_get(ends[k], 1), k ? "sep" : "cls", &it->ids[0], err, errlen)) {
                for (int q = 0; q < 3; q++) free(tp.items[q].ids);
                free(tp.items);
                return -1;
            }
        }
    } else {
        errbuf_set(err, errlen, "unsupported post_processor '%s' (supported: TemplateProcessing, ByteLevel, "
                   "Sequence, RobertaProcessing, BertProcessing)", type);
        return -1;
    }
    t->post = xrealloc(t->post, (size_t)(t->n_post + 1) * sizeof *t->post);
    t->post[t->n_post++] = tp;
    return 0;
}

/* The decoder chain, reduced to what it does to a list of tokens. */
static int decoder_parse(json_t *j, int *bytelevel, int *fuse, char *err, size_t errlen)
{
    const char *type = comp_type(j, "decoder", err, errlen);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        if (opt_list(j, "decoders", "decoder Sequence", &arr, err, errlen)) return -1;
        if (!arr) { errbuf_set(err, errlen, "decoder Sequence: no decoders list"); return -1; }
        size_t i;
        json_t *k;
        json_array_foreach(arr, i, k)
            if (decoder_parse(k, bytelevel, fuse, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (*fuse) { errbuf_set(err, errlen, "unsupported decoder chain: ByteLevel after Fuse"); return -1; }
        *bytelevel = 1;
        return 0;
    }
    if (!strcmp(type, "Fuse")) { *fuse = 1; return 0; }
    errbuf_set(err, errlen, "unsupported decoder '%s' (supported: ByteLevel, Fuse, Sequence of them)", type);
    return -1;
}

static int32_t named_id(const Tokenizer *t, json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return tokenizer_token_id(t, json_string_value(v));
}

/* Everything derived once the vocabulary and added tokens are known. */
static void finish_tables(Tokenizer *t, int maxid)
{
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > maxid) maxid = t->added[i].id;
    t->n_ids = maxid + 1;
    size_t n = (size_t)t->n_ids + 1;
    t->tok = xmalloc(n * sizeof *t->tok);
    t->dec = xmalloc(n * sizeof *t->dec);
    t->special = xcalloc(n, 1);
    added_of_reserve(t, n);       /* already holds the added tokens' ids (add_token) */
    for (size_t i = 0; i < n; i++) { t->tok[i] = -1; t->dec[i] = -1; }
    for (size_t j = 0; j < t->vocab.cap; j++) {
        const Slot *s = &t->vocab.s[j];
        if (s->h && s->val < t->n_ids) t->tok[s->val] = (int64_t)s->off << 32 | s->len;
    }
    Map special = {0};
    for (int i = 0; i < t->n_added; i++) {
        AddedTok *a = &t->added[i];
        t->tok[a->id] = (int64_t)a->moff << 32 | a->mlen;
        if (a->special) map_put(&special, t->arena.p, a->off, a->len, 1);
        if (a->normalized) trie_insert(&t->norm_trie, t->arena.p + a->moff, a->mlen, i);
        else trie_insert(&t->raw_trie, t->arena.p + a->off, a->len, i);
    }
    for (int id = 0; id < t->n_ids; id++) {
        if (t->tok[id] < 0) continue;
        const char *s = t->arena.p + (t->tok[id] >> 32);
        size_t len = (size_t)(t->tok[id] & 0xffffffff);
        t->special[id] = special.n && map_get(&special, t->arena.p, s, len) >= 0;
        uint32_t off = (uint32_t)t->dec_bytes.n;
        int mapped = t->decoder == DEC_BYTELEVEL;
        if (mapped) {          /* every character must be a byte stand-in, else the token's own bytes */
            for (size_t i = 0; i < len;) {
                uint32_t cp;
                i += (size_t)utf8_decode(s + i, &cp);
                if (cp >= 0x144 || bl_byte[cp] < 0) { mapped = 0; break; }
                char b = (char)bl_byte[cp];
                buf_add(&t->dec_bytes, &b, 1);
            }
            if (!mapped) t->dec_bytes.n = off;
        }
        if (!mapped) buf_add(&t->dec_bytes, s, len);
        t->dec[id] = (int64_t)off << 32 | (t->dec_bytes.n - off);
    }
    map_free(&special);
}

/* Every id the post-processor adds names a token (else encode would hand the model an id past
 * its embedding: HF does not check, the model then fails on it). */
static int check_post_ids(const Tokenizer *t, char *err, size_t errlen)
{
    for (int p = 0; p < t->n_post; p++)
        for (int k = 0; k < t->post[p].n; k++)
            for (int i = 0; i < t->post[p].items[k].n; i++) {
                int32_t id = t->post[p].items[k].ids[i];
                if (id >= t->n_ids || t->tok[id] < 0) {
                    errbuf_set(err, errlen, "post_processor: special token id %d is not in the vocabulary "
                               "(ids 0..%d)", (int)id, t->n_ids - 1);
                    return -1;
                }
            }
    return 0;
}

static Tokenizer *load_fail(Tokenizer *t, json_t *root, json_t *cfg, char *err, size_t errlen, const char *file)
{
    if (err && errlen) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", err);
        errbuf_set(err, errlen, "%s: %s", file, msg);
    }
    json_decref(root);
    json_decref(cfg);
    tokenizer_free(t);
    return NULL;
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen)
{
    char file[4224], cfgpath[4224], dir[4096];
    if (err && errlen) err[0] = 0;
    bl_init();
    snprintf(dir, sizeof dir, "%s", path);
    size_t pl = strlen(dir);
    while (pl > 1 && dir[pl - 1] == '/') dir[--pl] = 0;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/tokenizer.json", dir);
    int is_dir = file_exists(probe);
    snprintf(file, sizeof file, "%s", is_dir ? probe : dir);
    if (!is_dir) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    }
    snprintf(cfgpath, sizeof cfgpath, "%s/tokenizer_config.json", dir);

    struct stat st;
    if (!is_dir && stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {   /* else jansson's "'[' or '{' expected" */
        errbuf_set(err, errlen, "%s: no tokenizer.json in this directory", file);
        return NULL;
    }
    char e1[400];
    json_t *root = file_read_json(file, JSON_ALLOW_NUL, e1, sizeof e1), *cfg = NULL;
    if (!root) {
        errbuf_set(err, errlen, "%s: %s%s", file, e1,
                   file_exists(file) ? "" : " (give a tokenizer.json or a directory holding one)");
        return NULL;
    }
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->bos = t->eos = -1;
    if (!json_is_object(root)) { errbuf_set(err, errlen, "not a JSON object"); return load_fail(t, root, cfg, err, errlen, file); }
    json_t *trunc = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (trunc && !json_is_null(trunc)) {
        errbuf_set(err, errlen, "unsupported: truncation is set");
        return load_fail(t, root, cfg, err, errlen, file);
    }
    if (pad && !json_is_null(pad) && !json_is_object(pad)) {
        errbuf_set(err, errlen, "padding must be an object or null, not %s", jkind(pad));
        return load_fail(t, root, cfg, err, errlen, file);
    }
    if (pad && !json_is_null(pad) && (!json_is_null(json_object_get(pad, "pad_to_multiple_of")) ||
                                      json_is_object(json_object_get(pad, "strategy")))) {
        errbuf_set(err, errlen, "unsupported: padding to a fixed length or a multiple is set");
        return load_fail(t, root, cfg, err, errlen, file);
    }

    int maxid = -1;
    if (load_model(t, json_object_get(root, "model"), &maxid, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);

    json_t *nj = json_object_get(root, "normalizer");
    if (nj && !json_is_null(nj)) {
        t->norm = xcalloc(1, sizeof *t->norm);
        if (norm_parse(t->norm, nj, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);
        if (norm_is_identity(t->norm)) { norm_free(t->norm); free(t->norm); t->norm = NULL; }
    }
    json_t *pj = json_object_get(root, "pre_tokenizer");
    if (pj && !json_is_null(pj)) {
        t->pre = xcalloc(1, sizeof *t->pre);
        if (pre_parse(t, t->pre, pj, 0, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);
    }
    json_t *ppj = json_object_get(root, "post_processor");
    if (ppj && !json_is_null(ppj) && post_parse(t, ppj, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);
    json_t *dj = json_object_get(root, "decoder");
    t->decoder = DEC_NONE;
    if (dj && !json_is_null(dj)) {
        int bl = 0, fuse = 0;
        if (decoder_parse(dj, &bl, &fuse, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);
        t->decoder = bl ? DEC_BYTELEVEL : fuse ? DEC_FUSE : DEC_NONE;
    }

    /* Added tokens, then those tokenizer_config.json declares and tokenizer.json lacks. */
    int next_id = t->vocab_len;
    json_t *at = json_object_get(root, "added_tokens");
    if (at && !json_is_array(at)) { errbuf_set(err, errlen, "added_tokens is not a list"); return load_fail(t, root, cfg, err, errlen, file); }
    if (at && add_tokens(t, at, &next_id, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);
    if (file_exists(cfgpath)) {
        cfg = file_read_json(cfgpath, 0, e1, sizeof e1);
        if (!cfg) {
            errbuf_set(err, errlen, "%s", e1);
            return load_fail(t, root, cfg, err, errlen, cfgpath);
        }
        const char *key;
        json_t *v, *atd = json_object_get(cfg, "added_tokens_decoder");
        if (atd && !json_is_null(atd) && !json_is_object(atd)) {
            errbuf_set(err, errlen, "added_tokens_decoder must be an object, not %s", jkind(atd));
            return load_fail(t, root, cfg, err, errlen, cfgpath);
        }
        json_object_foreach(atd, key, v) {
            char where[96];
            snprintf(where, sizeof where, "added_tokens_decoder[\"%.40s\"]", key);
            json_t *c = json_object_get(v, "content");
            if (json_is_string(c) && map_get(&t->added_map, t->arena.p, json_string_value(c), json_string_length(c)) >= 0)
                continue;                            /* tokenizer.json has it */
            if (add_token(t, v, where, &next_id, err, errlen)) return load_fail(t, root, cfg, err, errlen, cfgpath);
        }
        static const char *const named[] = {"bos_token", "eos_token"};
        for (int k = 0; k < 2; k++) {
            json_t *nv = json_object_get(cfg, named[k]), *nc = json_is_object(nv) ? json_object_get(nv, "content") : nv;
            if (nv && !json_is_null(nv) && !json_is_string(nc)) {
                errbuf_set(err, errlen, "%s must be a string or {\"content\": a string}, not %s", named[k], jkind(nv));
                return load_fail(t, root, cfg, err, errlen, cfgpath);
            }
        }
    }
    /* normalized added tokens match (and decode as) their normalized form */
    if (t->norm)
        for (int i = 0; i < t->n_added; i++) {
            AddedTok *a = &t->added[i];
            if (!a->normalized) continue;
            Buf nb = {0};
            buf_reserve(&nb, a->len);
            if (norm_apply(t->norm, t->arena.p + a->off, a->len, &nb, err, errlen)) {
                buf_free(&nb);
                return load_fail(t, root, cfg, err, errlen, file);
            }
            if (nb.n != a->len || memcmp(nb.p, t->arena.p + a->off, nb.n)) {
                a->moff = arena_add(t, nb.p, nb.n);
                a->mlen = (uint32_t)nb.n;
            }
            buf_free(&nb);
        }
    finish_tables(t, maxid);
    if (check_post_ids(t, err, errlen)) return load_fail(t, root, cfg, err, errlen, file);

    if (cfg) {
        t->bos = named_id(t, json_object_get(cfg, "bos_token"));
        t->eos = named_id(t, json_object_get(cfg, "eos_token"));
    }
    if (t->bos < 0)                          /* the post-processor's leading special token */
        for (int p = 0; p < t->n_post && t->bos < 0; p++)
            if (t->post[p].n > 1 && !t->post[p].items[0].is_seq && t->post[p].items[0].n == 1)
                t->bos = t->post[p].items[0].ids[0];
    if (t->eos < 0) {
        static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "</s>"};
        for (size_t i = 0; i < sizeof names / sizeof names[0] && t->eos < 0; i++)
            t->eos = tokenizer_token_id(t, names[i]);
    }
    json_decref(root);
    json_decref(cfg);
    return t;
}

void tokenizer_free(Tokenizer *t)
{
    if (!t) return;
    buf_free(&t->arena);
    buf_free(&t->dec_bytes);
    free(t->tok); free(t->special); free(t->dec); free(t->added_of);
    map_free(&t->vocab);
    free(t->merges.s);
    free(t->prefix); free(t->suffix); free(t->unk);
    free(t->added);
    map_free(&t->added_map);
    free(t->raw_trie.n); free(t->norm_trie.n);
    if (t->norm) { norm_free(t->norm); free(t->norm); }
    if (t->pre) { pre_free(t->pre); free(t->pre); }
    for (int p = 0; p < t->n_post; p++) {
        for (int k = 0; k < t->post[p].n; k++) free(t->post[p].items[k].ids);
        free(t->post[p].items);
    }
    free(t->post);
    regex_free(&t->gpt2);
    free(t);
}

/* ---- accessors ---- */

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }

int tokenizer_token_id(const Tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    int32_t id = map_get(&t->added_map, t->arena.p, token, n);
    return id >= 0 ? id : vocab_id(t, token, n);
}

const char *tokenizer_token(const Tokenizer *t, int id)
{
    if (id < 0 || id >= t->n_ids || t->tok[id] < 0) return NULL;
    return t->arena.p + (t->tok[id] >> 32);
}

int tokenizer_is_special(const Tokenizer *t, int id) { return id >= 0 && id < t->n_ids && t->special[id]; }
int tokenizer_bos_id(const Tokenizer *t) { return t->bos; }
int tokenizer_eos_id(const Tokenizer *t) { return t->eos; }
