/* chat_template: a Jinja2 subset interpreter for Hugging Face chat templates (GLM-4.5/4.6/4.7,
 * GLM-5, Qwen3, Llama-3 and DeepSeek-style), giving byte for byte the text that transformers'
 * apply_chat_template renders: its ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks
 * and the loopcontrols extension, default Undefined, the tojson override (json.dumps with
 * ensure_ascii=False), raise_exception, strftime_now and the {% generation %} tag.
 *
 * Pipeline: source -> lexer (jinja2/lexer.py's rules, whitespace control included) -> tokens ->
 * recursive-descent parser (jinja2/parser.py's grammar and precedence) -> AST -> variable scoping
 * resolved at load as Jinja's compiler does (jinja2/idtracking.py) -> tree-walking evaluator over
 * Value, which follows Python's semantics (str(), repr(), ==, <, +, slicing, code-point strings,
 * Unicode case mapping through utf8proc plus Python's special cases).
 * Anything outside the subset (an unknown tag, filter, test, method or global function) fails at
 * load, even in a branch that would not run (Jinja defers some of these to render time); type
 * errors and raise_exception() fail the render. Where Python's result cannot be reproduced
 * (printing a generator's address, big integers, complex numbers) the render fails too: no output
 * is ever approximated.
 *
 * Memory: a parsed template lives in one arena and is read-only while rendering, so renders may
 * run concurrently; a render allocates every value, frame and buffer in its own arena freed at
 * the end, and errors unwind with longjmp to chat_template_render without leaks. Input strings
 * from jansson are borrowed, not copied.
 * Tests: tests/unit/test_chat_template.c against fixtures from tools/make_chat_fixtures.py. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "format/chat_template.h"
#include "format/config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/util.h"

/* ---- limits (bounds on what a template or a request can make the renderer do) ---- */

#define RENDER_MEM_LIMIT   ((size_t)512 << 20) /* bytes a render may allocate in all */
#define RENDER_STEP_LIMIT  50000000            /* loop iterations + macro calls + comparisons per render,
                                                  and one per 8 bytes scanned (step_bytes) */
#define MACRO_DEPTH_LIMIT  200                 /* nested macro calls (Python would hit its recursion limit) */
#define EVAL_DEPTH_LIMIT   1000                /* nested expressions + statement bodies in a render, macro calls
                                                  included: C recursion, a few MB of stack at most */
#define PARSE_DEPTH_LIMIT  200                 /* nested expressions / statements in a template */
#define JSON_DEPTH_LIMIT   256                 /* nesting of messages/tools/kwargs JSON, and of values
                                                  printed, compared or hashed (C recursion) */
#define RANGE_LIMIT        100000              /* Jinja's sandbox MAX_RANGE */
#define LOAD_MEM_LIMIT     ((size_t)256 << 20) /* bytes loading a template may allocate (AST, scoping) */
#define FRAME_NAME_LIMIT   1024                /* names one frame references or assigns (linear lookups) */

/* ---- types ---- */

/* A thrown error: parse and render errors longjmp here with the message in err. */
typedef struct {
    jmp_buf jb;
    char *err;     /* borrowed: the caller's buffer */
    size_t errlen;
    int line;      /* template line being parsed / evaluated, 0 if unknown */
} Fail;

typedef struct ArenaBlock {
    struct ArenaBlock *next;
    size_t used, cap;
    max_align_t data[];
} ArenaBlock;

typedef struct {
    ArenaBlock *head;
    size_t total;  /* bytes obtained from malloc */
    size_t limit;  /* 0: none */
    Fail *fail;    /* borrowed: where exceeding limit throws */
    const char *what; /* for that error: "the render" or "loading the template" */
} Arena;

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

enum { /* Value kinds */
    V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_LOOP, V_MACRO, V_FUNC, V_METHOD,
    V_ABSENT /* internal: a parameter not passed, or a variable Jinja holds as `missing`; never seen by a template */
};
enum { /* List kinds: the Python types a sequence value stands for */
    LK_LIST, LK_TUPLE, LK_RANGE, LK_ITER /* generator / iterator: one pass, no len() */,
    LK_ITEMS, LK_KEYS, LK_VALUES /* dict views */
};

typedef struct List List;
typedef struct Dict Dict;
typedef struct Loop Loop;
typedef struct Macro Macro;
typedef struct Method Method;

typedef struct Value {
    int t; /* V_* */
    union {
        int64_t i;                             /* V_BOOL, V_INT; V_FUNC: F_* id */
        double f;                              /* V_FLOAT */
        struct { const char *p; size_t n; } s; /* V_STR (UTF-8); V_UNDEF: the name, for errors */
        List *l;
        Dict *d;                               /* V_DICT, V_NS */
        Loop *lp;
        Macro *m;
        Method *me;
    };
} Value;

struct List {
    Value *v;
    size_t n, cap;
    int kind;              /* LK_* */
    size_t pos;            /* LK_ITER: items before pos are consumed */
    int64_t r0, r1, rs;    /* LK_RANGE: start, stop, step (for repr) */
};
struct Dict { /* insertion-ordered; linear lookup (template dicts are small) */
    Value *k, *v;
    size_t n, cap;
};
struct Loop {
    Value *items;
    size_t n, i;
};
typedef struct Node Node;
typedef struct Frame Frame;
struct Macro {
    const Node *def;  /* S_MACRO */
    Frame *closure;
};
struct Method {
    Value self;
    int id;           /* M_* */
};

/* Variables follow Jinja's compile-time scoping (jinja2/idtracking.py): each frame (the template,
   a loop body, a loop filter, a for-else, a macro, a with block, a set block, a generation block)
   has one slot per name it references or assigns, initialized on entry from the enclosing frames
   or the render variables as Jinja's code generator does; a name in an expression is resolved at
   load to (frames up, slot). */
enum { LD_PARAM, LD_RESOLVE, LD_ALIAS, LD_UNDEF }; /* how a slot starts (VAR_LOAD_*) */
typedef struct {
    int n;                /* slots */
    const char **names;   /* [n] */
    int *load;            /* [n] LD_* */
    int *alias_depth;     /* [n] LD_ALIAS: frames up to the aliased variable */
    int *alias_slot;      /* [n] LD_ALIAS: its slot there */
} FrameInfo;

struct Frame { /* a frame at render time */
    Frame *parent;
    const FrameInfo *fi;  /* borrowed: the template's */
    Value *slots;         /* [fi->n]; V_ABSENT = Jinja's `missing` */
};

/* AST. One node type; the fields each kind uses:
 *   S_DATA     s,sn text                    S_OUT    a expr
 *   S_IF       a cond, v body, x elifs (S_IF), w else
 *   S_FOR      names targets (op: tuple), a iter, b filter, v body, w else; fi loop / filter / else
 *              frames, slots / slots2 the targets in the loop / filter frame, slot `loop`
 *   S_SET      names targets (op&1: tuple, op&2: block) with slots, or c namespace name and s its
 *              attribute; a expr | v block body + w filters, fi[0] the block's frame
 *   S_MACRO    s name (slot), names params (slots), w defaults (NULL where none), v body, fi[0]
 *   S_WITH     names targets (slots), w values, v body, fi[0]
 *   S_SCOPE    v body, fi[0] ({% generation %} and the template)   S_GROUP  v body, no frame ({% print %})
 *   S_BREAK / S_CONTINUE
 *   E_CONST k  E_NAME s (depth, slot; depth -1: a render variable)  E_ATTR a.s  E_ITEM a[b]  E_SLICE a[v0:v1:v2]
 *   E_CALL / E_FILTER / E_TEST   a callee/operand, op filter/test id, v args, names+w keyword args
 *   E_NOT / E_NEG / E_POS a     E_BIN op a b     E_AND / E_OR a b     E_CONCAT v
 *   E_CMP a first, v operands, ops operators     E_COND a if b else c     E_LIST / E_TUPLE v   E_DICT v keys, w values */
enum {
    S_DATA, S_OUT, S_IF, S_FOR, S_SET, S_MACRO, S_WITH, S_SCOPE, S_GROUP, S_BREAK, S_CONTINUE,
    E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS, E_BIN,
    E_AND, E_OR, E_CONCAT, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT
};
struct Node {
    int kind, line, op;
    Node *a, *b, *c;
    Node **v, **w, **x;
    int nv, nw, nx;
    const char **names;
    int nn;
    int *ops;
    const char *s;
    size_t sn;
    Value k;
    FrameInfo *fi[3];     /* frames this statement opens */
    int depth, slot;      /* E_NAME: where the variable is; S_FOR: slot of `loop`; S_MACRO: its name */
    int *slots, *slots2;  /* slots of names[] */
};

typedef struct {
    Arena arena;
    Node *root;       /* S_SCOPE holding the top-level body */
} Tmpl;

struct ChatTemplate {
    Tmpl *def;        /* the template ("default" of a named list) */
    Tmpl *tool_use;   /* the "tool_use" template of a named list, used when tools are given; or NULL */
};

/* Operators: tokens and binary operations share these ids. */
enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GTEQ, OP_LT, OP_LTEQ, OP_IN, OP_NOTIN,
    OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON
};

/* Filters, tests, methods and global functions this interpreter implements. */
enum {
    FL_ABS, FL_CAPITALIZE, FL_COUNT, FL_D, FL_DEFAULT, FL_DICTSORT, FL_FIRST, FL_FLOAT, FL_INT, FL_ITEMS,
    FL_JOIN, FL_LAST, FL_LENGTH, FL_LIST, FL_LOWER, FL_MAP, FL_MAX, FL_MIN, FL_REJECT, FL_REJECTATTR,
    FL_REPLACE, FL_REVERSE, FL_ROUND, FL_SELECT, FL_SELECTATTR, FL_SORT, FL_STRING, FL_SUM, FL_TITLE,
    FL_TOJSON, FL_TRIM, FL_UNIQUE, FL_UPPER, FL__N
};
static const char *const filter_names[FL__N] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "first", "float", "int", "items",
    "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
    "replace", "reverse", "round", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper",
};
/* Jinja's other built-in filters: known names, so that the error says "not supported" */
static const char *const jinja_other_filters[] = {
    "attr", "batch", "center", "e", "escape", "filesizeformat", "forceescape", "format", "groupby",
    "indent", "pprint", "random", "safe", "slice", "striptags", "truncate", "urlencode", "urlize",
    "wordcount", "wordwrap", "xmlattr", NULL
};
enum {
    TS_DEFINED, TS_UNDEFINED, TS_NONE, TS_BOOLEAN, TS_FALSE, TS_TRUE, TS_INTEGER, TS_FLOAT, TS_NUMBER,
    TS_STRING, TS_MAPPING, TS_ITERABLE, TS_SEQUENCE, TS_CALLABLE, TS_SAMEAS, TS_LOWER, TS_UPPER, TS_ODD,
    TS_EVEN, TS_DIVISIBLEBY, TS_IN, TS_EQ, TS_EQUALTO, TS_NE, TS_GT, TS_GREATERTHAN, TS_GE, TS_LT,
    TS_LESSTHAN, TS_LE, TS_ESCAPED, TS_FILTER, TS_TEST, TS__N
};
static const char *const test_names[TS__N] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "sameas", "lower", "upper", "odd",
    "even", "divisibleby", "in", "eq", "equalto", "ne", "gt", "greaterthan", "ge", "lt",
    "lessthan", "le", "escaped", "filter", "test",
};
enum {
    M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_RSPLIT, M_STRIP, M_LSTRIP, M_RSTRIP, M_LOWER, M_UPPER, M_TITLE,
    M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM,
    M_ISSPACE, M_ISUPPER, M_ISLOWER, M_REMOVEPREFIX, M_REMOVESUFFIX, /* str (index, count: list too) */
    M_ITEMS, M_KEYS, M_VALUES, M_GET, /* dict */
    M_CYCLE, /* loop */
    M__N
};
static const char *const method_names[M__N] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "lower", "upper", "title",
    "capitalize", "replace", "find", "rfind", "index", "count", "join", "isdigit", "isalpha", "isalnum",
    "isspace", "isupper", "islower", "removeprefix", "removesuffix",
    "items", "keys", "values", "get",
    "cycle",
};
#define M_STR_LAST M_REMOVESUFFIX
/* Python attributes that exist but are not implemented: reading one is an error, not Undefined */
static const char *const str_attrs_other[] = {
    "casefold", "center", "encode", "expandtabs", "format", "format_map", "isascii", "isdecimal",
    "isidentifier", "isnumeric", "isprintable", "istitle", "ljust", "maketrans", "partition", "rindex",
    "rjust", "rpartition", "splitlines", "swapcase", "translate", "zfill", NULL
};
static const char *const num_attrs[] = {
    "real", "imag", "numerator", "denominator", "conjugate", "bit_length", "bit_count", "as_integer_ratio",
    "is_integer", "hex", "fromhex", "to_bytes", "from_bytes", NULL
};
/* dict / list methods the immutable sandbox refuses: Jinja returns an Undefined for them */
static const char *const dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
static const char *const dict_other[] = { "copy", "fromkeys", NULL };
static const char *const list_unsafe[] = { "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL };
static const char *const list_other[] = { "copy", NULL };
enum { F_RANGE, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME, F__N };
static const char *const func_names[F__N] = { "range", "namespace", "dict", "raise_exception", "strftime_now" };
static const char *const jinja_other_globals[] = { "lipsum", "cycler", "joiner", NULL };

/* ---- errors ---- */

static void fail_throw(Fail *f, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail_throw(Fail *f, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->line > 0) errbuf_set(f->err, f->errlen, "chat template line %d: %s", f->line, msg);
    else errbuf_set(f->err, f->errlen, "chat template: %s", msg);
    longjmp(f->jb, 1);
}

static int in_list(const char *const *list, const char *s)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return 1;
    return 0;
}

static int name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

/* ---- arena and buffers ---- */

static void *arena_alloc(Arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ((size_t)64 << 10) ? n : ((size_t)64 << 10);
        if (a->limit && a->total + cap > a->limit)
            fail_throw(a->fail, "%s needs more than %zu MiB of memory", a->what, a->limit >> 20);
        ArenaBlock *b = xmalloc(sizeof(ArenaBlock) + cap);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(Arena *a)
{
    for (ArenaBlock *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    a->head = NULL;
    a->total = 0;
}

static char *arena_strndup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Growth doubles, so building a string of n bytes costs O(n) (old blocks stay in the arena). */
static void buf_reserve(Arena *a, Buf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = arena_alloc(a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

static void buf_put(Arena *a, Buf *b, const char *s, size_t n)
{
    if (!n) return;
    buf_reserve(a, b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void buf_puts(Arena *a, Buf *b, const char *s) { buf_put(a, b, s, strlen(s)); }
static void buf_putc(Arena *a, Buf *b, char c) { buf_put(a, b, &c, 1); }

static void buf_printf(Arena *a, Buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void buf_printf(Arena *a, Buf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    buf_put(a, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A growable array of pointers (parser lists), in the arena. */
typedef struct {
    void **p;
    int n, cap;
} PtrVec;

static void vec_push(Arena *a, PtrVec *v, void *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        void **p = arena_alloc(a, sizeof(void *) * (size_t)cap);
        if (v->n) memcpy(p, v->p, sizeof(void *) * (size_t)v->n);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

/* ---- UTF-8 and Python's character classes ---- */

/* Decode one code point of valid UTF-8; returns its length in bytes. */
static int u8_dec(const unsigned char *p, uint32_t *cp)
{
    if (p[0] < 0x80) { *cp = p[0]; return 1; }
    if (p[0] < 0xE0) { *cp = ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F); return 2; }
    if (p[0] < 0xF0) { *cp = ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F); return 3; }
    *cp = ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) | ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return 4;
}

static int u8_enc(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* 1 if s is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
static int u8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        if (c < 0x80) { p++; continue; }
        int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!len || c > 0xF4 || e - p < len) return 0;
        for (int i = 1; i < len; i++)
            if ((p[i] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;
        if (c == 0xED && p[1] >= 0xA0) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        p += len;
    }
    return 1;
}

static int is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static size_t u8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's str.isspace() (also what `\s` matches in Jinja's lexer regexes). */
static int py_space_cp(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length in bytes of the Python whitespace character at p (0 if none). */
static int py_space_at(const char *p, const char *e)
{
    unsigned c = (unsigned char)*p;
    if (c < 0x80) return py_space_cp(c) ? 1 : 0;
    if (c != 0xC2 && c != 0xE1 && c != 0xE2 && c != 0xE3) return 0;
    uint32_t cp;
    int l = u8_dec((const unsigned char *)p, &cp);
    return (p + l <= e && py_space_cp(cp)) ? l : 0;
}

/* Length of s after Python's str.rstrip() (whitespace). */
static size_t py_rstrip_len(const char *s, size_t n)
{
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        if (!py_space_at(s + k, s + n)) break;
        n = k;
    }
    return n;
}

/* Python's str.isprintable() for repr(): other (Cc Cf Cs Co Cn) and separator (Zl Zp Zs) characters
   are escaped, except the space. */
static int py_printable(uint32_t c)
{
    if (c == ' ') return 1;
    int k = (int)utf8proc_category((utf8proc_int32_t)c);
    return !(k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF ||
             k == UTF8PROC_CATEGORY_CS || k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_ZS ||
             k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP);
}

/* ---- Python number formatting ---- */

/* repr(float): the shortest digits that round-trip, laid out as Python's float_repr does
   (exponent form when the decimal point position is <= -4 or > 16). out needs 32 bytes. */
static void py_float_repr(double x, char *out)
{
    if (isnan(x)) { strcpy(out, "nan"); return; }
    if (isinf(x)) { strcpy(out, x < 0 ? "-inf" : "inf"); return; }
    if (x == 0) { strcpy(out, signbit(x) ? "-0.0" : "0.0"); return; }
    char e[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e(+|-)XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = e;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
}

/* ---- lexer (jinja2/lexer.py with trim_blocks=True, lstrip_blocks=True) ---- */

enum { TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP };

typedef struct {
    int type, op, line;
    const char *p; /* TK_DATA: text; TK_NAME: name; TK_STRING: unescaped value (arena) */
    size_t n;
    int64_t i;
    double f;
} Token;

typedef struct {
    Fail *f;
    Arena *A;
    Token *tk;
    int n, cap;
} TokVec;

static Token *tok_push(TokVec *tv, int type, int line)
{
    if (tv->n == tv->cap) {
        tv->cap = tv->cap ? tv->cap * 2 : 256;
        tv->tk = xrealloc(tv->tk, sizeof(Token) * (size_t)tv->cap);
    }
    Token *t = &tv->tk[tv->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static size_t count_nl(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static size_t skip_space(const char *s, size_t pos, size_t len)
{
    while (pos < len) {
        int l = py_space_at(s + pos, s + len);
        if (!l) break;
        pos += (size_t)l;
    }
    return pos;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* (\d+_)*\d+ at s[pos]: returns the end, or pos if no match */
static size_t scan_digits(const char *s, size_t pos, size_t len)
{
    size_t p = pos, end = pos;
    while (p < len && is_digit(s[p])) {
        while (p < len && is_digit(s[p])) p++;
        end = p;
        if (p + 1 < len && s[p] == '_' && is_digit(s[p + 1])) p++;
        else break;
    }
    return end;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal's body, unescaped as Python's "unicode-escape" codec does (what Jinja uses). */
static void lex_unescape(TokVec *tv, Token *t, const char *s, size_t n)
{
    Buf b = { 0 };
    buf_reserve(tv->A, &b, n + 1);
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            size_t j = i;
            while (j < n && s[j] != '\\') j++;
            buf_put(tv->A, &b, s + i, j - i);
            i = j;
            continue;
        }
        char c = s[i + 1]; /* the literal regex guarantees a character after a backslash */
        i += 2;
        uint32_t cp = 0;
        int nhex = 0;
        switch (c) {
        case '\n': continue;
        case '\\': buf_putc(tv->A, &b, '\\'); continue;
        case '\'': buf_putc(tv->A, &b, '\''); continue;
        case '"': buf_putc(tv->A, &b, '"'); continue;
        case 'a': buf_putc(tv->A, &b, '\a'); continue;
        case 'b': buf_putc(tv->A, &b, '\b'); continue;
        case 'f': buf_putc(tv->A, &b, '\f'); continue;
        case 'n': buf_putc(tv->A, &b, '\n'); continue;
        case 'r': buf_putc(tv->A, &b, '\r'); continue;
        case 't': buf_putc(tv->A, &b, '\t'); continue;
        case 'v': buf_putc(tv->A, &b, '\v'); continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N': fail_throw(tv->f, "\\N{...} escapes in string literals are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                break;
            }
            if ((unsigned char)c >= 0x80) fail_throw(tv->f, "a backslash before a non-ASCII character in a string literal is not supported");
            buf_putc(tv->A, &b, '\\'); /* unknown escapes stay as they are */
            buf_putc(tv->A, &b, c);
            continue;
        }
        for (int k = 0; k < nhex; k++) {
            int h = i < n ? hexval(s[i]) : -1;
            if (h < 0) fail_throw(tv->f, "truncated \\%c escape in a string literal", c);
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            fail_throw(tv->f, "escape \\%c%0*X in a string literal is not a valid character", c, nhex, cp);
        char u[4];
        buf_put(tv->A, &b, u, (size_t)u8_enc(cp, u));
    }
    buf_putc(tv->A, &b, 0);
    t->p = b.p;
    t->n = b.n - 1;
}

static const struct { const char *s; int op; } lex_ops[] = {
    { "//", OP_FLOORDIV }, { "**", OP_POW }, { "==", OP_EQ }, { "!=", OP_NE }, { ">=", OP_GTEQ }, { "<=", OP_LTEQ },
    { "+", OP_ADD }, { "-", OP_SUB }, { "/", OP_DIV }, { "*", OP_MUL }, { "%", OP_MOD }, { "~", OP_TILDE },
    { "[", OP_LBRACKET }, { "]", OP_RBRACKET }, { "(", OP_LPAREN }, { ")", OP_RPAREN }, { "{", OP_LBRACE },
    { "}", OP_RBRACE }, { ">", OP_GT }, { "<", OP_LT }, { "=", OP_ASSIGN }, { ".", OP_DOT }, { ":", OP_COLON },
    { "|", OP_PIPE }, { ",", OP_COMMA }, { ";", OP_SEMICOLON },
};

/* Tokens inside {{ }} or {% %}, from *ppos to the end tag; returns whether the end tag consumed a
   trailing newline (Jinja's line_starting for the next lstrip_blocks decision). */
static int lex_tag(TokVec *tv, const char *s, size_t len, size_t *ppos, int *pline, int is_block)
{
    size_t pos = *ppos;
    char balance[PARSE_DEPTH_LIMIT];
    int nb = 0;
    for (;;) {
        tv->f->line = *pline;
        if (pos >= len) fail_throw(tv->f, "unexpected end of template inside a %s tag", is_block ? "{% %}" : "{{ }}");
        if (nb == 0) {
            size_t end = 0;
            if (is_block) {
                if (pos + 2 < len && s[pos] == '+' && s[pos + 1] == '%' && s[pos + 2] == '}') end = pos + 3;
                else if (pos + 2 < len && s[pos] == '-' && s[pos + 1] == '%' && s[pos + 2] == '}') end = skip_space(s, pos + 3, len);
                else if (pos + 1 < len && s[pos] == '%' && s[pos + 1] == '}') {
                    end = pos + 2;
                    if (end < len && s[end] == '\n') end++;
                }
            } else {
                if (pos + 2 < len && s[pos] == '-' && s[pos + 1] == '}' && s[pos + 2] == '}') end = skip_space(s, pos + 3, len);
                else if (pos + 1 < len && s[pos] == '}' && s[pos + 1] == '}') end = pos + 2;
            }
            if (end) {
                tok_push(tv, is_block ? TK_BLOCK_END : TK_VAR_END, *pline);
                *pline += (int)count_nl(s + pos, end - pos);
                *ppos = end;
                return s[end - 1] == '\n';
            }
        }
        size_t q = skip_space(s, pos, len);
        if (q > pos) {
            *pline += (int)count_nl(s + pos, q - pos);
            pos = q;
            continue;
        }
        char c = s[pos];
        if (is_digit(c)) {
            /* float first: (\d+_)*\d+ ( (\.(\d+_)*\d+)? e[+-]?(\d+_)*\d+ | \.(\d+_)*\d+ ), not after '.' */
            size_t d = scan_digits(s, pos, len), fend = 0;
            if (!(pos > 0 && s[pos - 1] == '.')) {
                size_t f = d;
                if (f + 1 < len && s[f] == '.' && is_digit(s[f + 1])) f = scan_digits(s, f + 1, len);
                size_t e = f;
                if (e < len && (s[e] == 'e' || s[e] == 'E')) {
                    e++;
                    if (e < len && (s[e] == '+' || s[e] == '-')) e++;
                    size_t x = scan_digits(s, e, len);
                    if (x > e) fend = x;
                }
                if (!fend && f > d) fend = f;
            }
            if (fend) {
                char tmp[128];
                size_t k = 0;
                for (size_t i = pos; i < fend && k < sizeof tmp - 1; i++)
                    if (s[i] != '_') tmp[k++] = s[i];
                tmp[k] = 0;
                Token *t = tok_push(tv, TK_FLOAT, *pline);
                t->f = strtod(tmp, NULL);
                pos = fend;
                continue;
            }
            /* integer: 0b(_?[01])+ | 0o(_?[0-7])+ | 0x(_?[0-9a-f])+ | [1-9](_?\d)* | 0(_?0)* */
            int base = 10, zero = c == '0', ndig = 0, overflow = 0;
            size_t i = pos + 1;
            uint64_t v = (uint64_t)(c - '0');
            if (zero && pos + 1 < len && (s[pos + 1] == 'b' || s[pos + 1] == 'B' || s[pos + 1] == 'o' ||
                                          s[pos + 1] == 'O' || s[pos + 1] == 'x' || s[pos + 1] == 'X')) {
                char k = (char)(s[pos + 1] | 0x20);
                base = k == 'b' ? 2 : k == 'o' ? 8 : 16;
                i = pos + 2;
                v = 0;
            }
            for (;;) {
                size_t j = i;
                if (j < len && s[j] == '_') j++;
                int h = j < len ? hexval(s[j]) : -1;
                if (h < 0 || h >= base || (base == 10 && zero && h != 0)) break;
                if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base) overflow = 1;
                v = v * (uint64_t)base + (uint64_t)h;
                ndig++;
                i = j + 1;
            }
            if (base != 10 && !ndig) fail_throw(tv->f, "invalid integer literal");
            if (overflow || v > INT64_MAX) fail_throw(tv->f, "integer literal too large (moeserve uses 64-bit integers)");
            Token *t = tok_push(tv, TK_INT, *pline);
            t->i = (int64_t)v;
            pos = i;
            continue;
        }
        if (is_name_start(c)) {
            size_t e = pos;
            while (e < len && is_name_char(s[e])) e++;
            if (e < len && (unsigned char)s[e] >= 0x80) fail_throw(tv->f, "non-ASCII identifiers are not supported");
            Token *t = tok_push(tv, TK_NAME, *pline);
            t->p = arena_strndup(tv->A, s + pos, e - pos);
            t->n = e - pos;
            pos = e;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t e = pos + 1;
            while (e < len && s[e] != c) e += s[e] == '\\' ? 2 : 1;
            if (e >= len) fail_throw(tv->f, "unterminated string literal");
            Token *t = tok_push(tv, TK_STRING, *pline);
            lex_unescape(tv, t, s + pos + 1, e - pos - 1);
            *pline += (int)count_nl(s + pos, e - pos);
            pos = e + 1;
            continue;
        }
        int op = -1;
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof lex_ops / sizeof lex_ops[0]; k++) {
            size_t l = strlen(lex_ops[k].s);
            if (pos + l <= len && !memcmp(s + pos, lex_ops[k].s, l)) { op = lex_ops[k].op; oplen = l; break; }
        }
        if (op < 0) {
            if ((unsigned char)c >= 0x80) fail_throw(tv->f, "unexpected non-ASCII character in a tag");
            fail_throw(tv->f, "unexpected character '%c' in a tag", c);
        }
        if (op == OP_LPAREN || op == OP_LBRACKET || op == OP_LBRACE) {
            if (nb == PARSE_DEPTH_LIMIT) fail_throw(tv->f, "brackets nested too deeply");
            balance[nb++] = op == OP_LPAREN ? ')' : op == OP_LBRACKET ? ']' : '}';
        } else if (op == OP_RPAREN || op == OP_RBRACKET || op == OP_RBRACE) {
            if (!nb) fail_throw(tv->f, "unexpected '%c'", c);
            if (balance[--nb] != c) fail_throw(tv->f, "unexpected '%c', expected '%c'", c, balance[nb]);
        }
        Token *t = tok_push(tv, TK_OP, *pline);
        t->op = op;
        pos += oplen;
    }
}

/* Emit data text with the whitespace control of the tag that follows it: '-' strips all
   trailing whitespace; otherwise lstrip_blocks removes spaces between the line start and a
   {% or {# tag (not {{), unless the tag says '+'. */
static void lex_data(TokVec *tv, const char *text, size_t tn, char sign, int tag_is_var, int line_starting, int line)
{
    if (sign == '-') tn = py_rstrip_len(text, tn);
    else if (sign != '+' && !tag_is_var) {
        size_t lp = tn;
        while (lp > 0 && text[lp - 1] != '\n') lp--;
        if ((lp > 0 || line_starting) && tn > lp && skip_space(text, lp, tn) == tn) tn = lp;
    }
    if (tn) {
        Token *t = tok_push(tv, TK_DATA, line);
        t->p = text;
        t->n = tn;
    }
}

/* src: normalized source (newlines are \n, one trailing newline removed), kept alive by caller. */
static void lex(TokVec *tv, const char *s, size_t len)
{
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos < len) {
        size_t t = pos;
        while (t + 1 < len && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= len) {
            lex_data(tv, s + pos, len - pos, 0, 1, line_starting, line);
            break;
        }
        char kind = s[t + 1], sign = 0;
        size_t o = t + 2;
        if (o < len && (s[o] == '-' || s[o] == '+')) sign = s[o++];
        int data_line = line;
        line += (int)count_nl(s + pos, o - pos);
        tv->f->line = line;
        if (kind == '%') { /* {% raw %} ... {% endraw %} */
            size_t q = skip_space(s, o, len);
            if (q + 3 <= len && !memcmp(s + q, "raw", 3)) {
                size_t r = skip_space(s, q + 3, len), body = 0;
                if (r + 2 < len && s[r] == '-' && s[r + 1] == '%' && s[r + 2] == '}') body = skip_space(s, r + 3, len);
                else if (r + 1 < len && s[r] == '%' && s[r + 1] == '}') body = r + 2;
                if (body) {
                    lex_data(tv, s + pos, t - pos, sign, 0, line_starting, data_line);
                    line_starting = s[body - 1] == '\n';
                    line += (int)count_nl(s + o, body - o);
                    /* (.*?)({%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?)) */
                    for (size_t e = body; e + 1 < len; e++) {
                        if (s[e] != '{' || s[e + 1] != '%') continue;
                        size_t k = e + 2;
                        char esign = 0;
                        if (k < len && (s[k] == '-' || s[k] == '+')) esign = s[k++];
                        k = skip_space(s, k, len);
                        if (k + 6 > len || memcmp(s + k, "endraw", 6)) continue;
                        k = skip_space(s, k + 6, len);
                        size_t end = 0;
                        if (k + 2 < len && s[k] == '+' && s[k + 1] == '%' && s[k + 2] == '}') end = k + 3;
                        else if (k + 2 < len && s[k] == '-' && s[k + 1] == '%' && s[k + 2] == '}') end = skip_space(s, k + 3, len);
                        else if (k + 1 < len && s[k] == '%' && s[k + 1] == '}') {
                            end = k + 2;
                            if (end < len && s[end] == '\n') end++;
                        }
                        if (!end) continue;
                        lex_data(tv, s + body, e - body, esign, 0, line_starting, line);
                        line += (int)count_nl(s + body, end - body);
                        line_starting = s[end - 1] == '\n';
                        pos = end;
                        goto next;
                    }
                    fail_throw(tv->f, "missing {%% endraw %%}");
                }
            }
        }
        lex_data(tv, s + pos, t - pos, sign, kind == '{', line_starting, data_line);
        if (kind == '#') { /* (.*?)(+#}|-#}\s*|#}\n?) */
            size_t e = o, end = 0;
            for (; e + 1 < len; e++) {
                if (e + 2 < len && s[e] == '+' && s[e + 1] == '#' && s[e + 2] == '}') { end = e + 3; break; }
                if (e + 2 < len && s[e] == '-' && s[e + 1] == '#' && s[e + 2] == '}') { end = skip_space(s, e + 3, len); break; }
                if (s[e] == '#' && s[e + 1] == '}') {
                    end = e + 2;
                    if (end < len && s[end] == '\n') end++;
                    break;
                }
            }
            if (!end) fail_throw(tv->f, "missing end of comment tag");
            line += (int)count_nl(s + o, end - o);
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        tok_push(tv, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, line);
        pos = o;
        line_starting = lex_tag(tv, s, len, &pos, &line, kind == '%');
    next:;
    }
    tok_push(tv, TK_EOF, line);
}

/* ---- parser (jinja2/parser.py) ---- */

typedef struct {
    Fail *f;
    Arena *A;
    Token *tk;
    int pos, depth;
    int loop_depth, in_macro;
    PtrVec macros, called; /* macro names defined; bare names called (checked at the end) */
    PtrVec called_lines;
} Parser;

static Token *cur(Parser *P) { return &P->tk[P->pos]; }
static Token *peek(Parser *P, int k) { Token *t = &P->tk[P->pos]; for (int i = 0; i < k && t->type != TK_EOF; i++) t++; return t; }
static void advance(Parser *P) { if (P->tk[P->pos].type != TK_EOF) P->pos++; }

static const char *tok_desc(Token *t, char *buf, size_t n)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: snprintf(buf, n, "'%s'", t->p); return buf;
    case TK_STRING: return "string literal";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default:
        for (size_t k = 0; k < sizeof lex_ops / sizeof lex_ops[0]; k++)
            if (lex_ops[k].op == t->op) { snprintf(buf, n, "'%s'", lex_ops[k].s); return buf; }
        return "operator";
    }
}

static void perr_unexpected(Parser *P, const char *expected) __attribute__((noreturn));
static void perr_unexpected(Parser *P, const char *expected)
{
    char b[96];
    P->f->line = cur(P)->line;
    fail_throw(P->f, "unexpected %s, expected %s", tok_desc(cur(P), b, sizeof b), expected);
}

static int is_name(Parser *P, const char *s) { return cur(P)->type == TK_NAME && !strcmp(cur(P)->p, s); }
static int is_op(Parser *P, int op) { return cur(P)->type == TK_OP && cur(P)->op == op; }
static int skip_op(Parser *P, int op) { if (is_op(P, op)) { advance(P); return 1; } return 0; }
static int skip_name(Parser *P, const char *s) { if (is_name(P, s)) { advance(P); return 1; } return 0; }

static void expect_op(Parser *P, int op, const char *what) { if (!skip_op(P, op)) perr_unexpected(P, what); }
static void expect_type(Parser *P, int type, const char *what) { if (cur(P)->type != type) perr_unexpected(P, what); advance(P); }
static const char *expect_ident(Parser *P)
{
    if (cur(P)->type != TK_NAME) perr_unexpected(P, "a name");
    const char *s = cur(P)->p;
    advance(P);
    return s;
}

static Node *node_new(Parser *P, int kind, int line)
{
    Node *n = arena_alloc(P->A, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

static Node **vec_nodes(PtrVec *v) { return (Node **)v->p; }

static void enter(Parser *P)
{
    if (++P->depth > PARSE_DEPTH_LIMIT) {
        P->f->line = cur(P)->line;
        fail_throw(P->f, "template nested too deeply");
    }
}

static Node *parse_expression(Parser *P, int with_condexpr);
static Node *parse_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
static Node *parse_primary(Parser *P, int with_namespace);
static Node *parse_postfix(Parser *P, Node *n);
static Node *parse_filter_expr(Parser *P, Node *n);
static void parse_body(Parser *P, PtrVec *out, const char *const *end_names);

/* (args, kwargs) of a call; *args and **kwargs are not supported */
static void parse_call_args(Parser *P, Node *n)
{
    PtrVec args = { 0 }, kwv = { 0 }, kwn = { 0 };
    expect_op(P, OP_LPAREN, "'('");
    int need_comma = 0;
    while (!is_op(P, OP_RPAREN)) {
        if (need_comma) {
            expect_op(P, OP_COMMA, "','");
            if (is_op(P, OP_RPAREN)) break;
        }
        if (is_op(P, OP_MUL) || is_op(P, OP_POW)) {
            P->f->line = cur(P)->line;
            fail_throw(P->f, "*args / **kwargs in calls are not supported");
        }
        if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && peek(P, 1)->op == OP_ASSIGN) {
            vec_push(P->A, &kwn, (void *)cur(P)->p);
            P->pos += 2;
            vec_push(P->A, &kwv, parse_expression(P, 1));
        } else {
            if (kwn.n) {
                P->f->line = cur(P)->line;
                fail_throw(P->f, "positional argument follows keyword argument");
            }
            vec_push(P->A, &args, parse_expression(P, 1));
        }
        need_comma = 1;
    }
    expect_op(P, OP_RPAREN, "')'");
    n->v = vec_nodes(&args);
    n->nv = args.n;
    n->w = vec_nodes(&kwv);
    n->nw = kwv.n;
    n->names = (const char **)kwn.p;
    n->nn = kwn.n;
}

/* map / select / reject / selectattr / rejectattr name a filter or test by a string argument:
   check it now when it is a literal */
static void check_named_arg(Parser *P, Node *n, int line)
{
    int idx = (n->op == FL_SELECTATTR || n->op == FL_REJECTATTR) ? 1 : 0;
    if (n->op == FL_MAP && n->nv == 0) return; /* map(attribute=...) */
    if (n->nv <= idx || n->v[idx]->kind != E_CONST || n->v[idx]->k.t != V_STR) return;
    const char *name = n->v[idx]->k.s.p;
    P->f->line = line;
    if (n->op == FL_MAP) {
        if (name_index(filter_names, FL__N, name) < 0) fail_throw(P->f, "map(): filter '%s' is not supported", name);
    } else if (name_index(test_names, TS__N, name) < 0) {
        fail_throw(P->f, "%s(): test '%s' is not supported", filter_names[n->op], name);
    }
}

static Node *parse_filter(Parser *P, Node *operand)
{
    int d0 = P->depth;
    while (is_op(P, OP_PIPE)) {
        advance(P);
        enter(P);
        int line = cur(P)->line;
        const char *name = expect_ident(P);
        P->f->line = line;
        if (is_op(P, OP_DOT)) fail_throw(P->f, "dotted filter names are not supported");
        int id = name_index(filter_names, FL__N, name);
        if (id < 0) {
            if (in_list(jinja_other_filters, name)) fail_throw(P->f, "filter '%s' is not supported", name);
            fail_throw(P->f, "no filter named '%s'", name);
        }
        Node *n = node_new(P, E_FILTER, line);
        n->op = id;
        n->a = operand;
        if (is_op(P, OP_LPAREN)) parse_call_args(P, n);
        if (id == FL_MAP || id == FL_SELECT || id == FL_REJECT || id == FL_SELECTATTR || id == FL_REJECTATTR)
            check_named_arg(P, n, line);
        operand = n;
    }
    P->depth = d0;
    return operand;
}

static Node *parse_test(Parser *P, Node *operand)
{
    int line = cur(P)->line;
    advance(P); /* is */
    int negated = skip_name(P, "not");
    const char *name = expect_ident(P);
    P->f->line = line;
    if (is_op(P, OP_DOT)) fail_throw(P->f, "dotted test names are not supported");
    int id = name_index(test_names, TS__N, name);
    if (id < 0) fail_throw(P->f, "no test named '%s'", name);
    Node *n = node_new(P, E_TEST, line);
    n->op = id;
    n->a = operand;
    Token *t = cur(P);
    if (is_op(P, OP_LPAREN)) {
        parse_call_args(P, n);
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
                (t->type == TK_OP && (t->op == OP_LBRACKET || t->op == OP_LBRACE))) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) fail_throw(P->f, "you cannot chain multiple tests with is");
        Node *arg = parse_postfix(P, parse_primary(P, 0));
        n->v = arena_alloc(P->A, sizeof(Node *));
        n->v[0] = arg;
        n->nv = 1;
    }
    if (negated) {
        Node *nn = node_new(P, E_NOT, line);
        nn->a = n;
        return nn;
    }
    return n;
}

static void check_call(Parser *P, Node *call)
{
    Node *f = call->a;
    P->f->line = call->line;
    if (f->kind == E_NAME) {
        if (name_index(func_names, F__N, f->s) >= 0) return;
        if (in_list(jinja_other_globals, f->s)) fail_throw(P->f, "global function '%s' is not supported", f->s);
        vec_push(P->A, &P->called, (void *)f->s);
        vec_push(P->A, &P->called_lines, (void *)(intptr_t)call->line);
    } else if (f->kind == E_ATTR) {
        if (name_index(method_names, M__N, f->s) < 0) fail_throw(P->f, "method '%s()' is not supported", f->s);
    }
}

static Node *parse_call(Parser *P, Node *callee)
{
    Node *n = node_new(P, E_CALL, cur(P)->line);
    n->a = callee;
    parse_call_args(P, n);
    check_call(P, n);
    return n;
}

static Node *parse_subscribed(Parser *P)
{
    int line = cur(P)->line;
    Node *parts[3] = { NULL, NULL, NULL };
    if (is_op(P, OP_COLON)) {
        advance(P);
    } else {
        Node *e = parse_expression(P, 1);
        if (!is_op(P, OP_COLON)) return e;
        advance(P);
        parts[0] = e;
    }
    if (!is_op(P, OP_COLON) && !is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA)) parts[1] = parse_expression(P, 1);
    if (is_op(P, OP_COLON)) {
        advance(P);
        if (!is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA)) parts[2] = parse_expression(P, 1);
    }
    Node *s = node_new(P, E_SLICE, line);
    s->v = arena_alloc(P->A, sizeof(Node *) * 3);
    memcpy(s->v, parts, sizeof parts);
    s->nv = 3;
    return s; /* a: filled in by the caller */
}

static Node *parse_subscript(Parser *P, Node *obj)
{
    int line = cur(P)->line;
    if (skip_op(P, OP_DOT)) {
        Token *t = cur(P);
        if (t->type == TK_NAME) {
            advance(P);
            Node *n = node_new(P, E_ATTR, line);
            n->a = obj;
            n->s = t->p;
            return n;
        }
        if (t->type != TK_INT) perr_unexpected(P, "a name or number after '.'");
        advance(P);
        Node *k = node_new(P, E_CONST, line);
        k->k.t = V_INT;
        k->k.i = t->i;
        Node *n = node_new(P, E_ITEM, line);
        n->a = obj;
        n->b = k;
        return n;
    }
    expect_op(P, OP_LBRACKET, "'['");
    PtrVec args = { 0 };
    while (!is_op(P, OP_RBRACKET)) {
        if (args.n) expect_op(P, OP_COMMA, "','");
        vec_push(P->A, &args, parse_subscribed(P));
    }
    expect_op(P, OP_RBRACKET, "']'");
    Node *idx;
    if (args.n == 1) {
        idx = vec_nodes(&args)[0];
        if (idx->kind == E_SLICE && !idx->a) {
            idx->a = obj;
            return idx;
        }
    } else {
        for (int i = 0; i < args.n; i++)
            if (vec_nodes(&args)[i]->kind == E_SLICE && !vec_nodes(&args)[i]->a) {
                P->f->line = line;
                fail_throw(P->f, "multi-dimensional slicing is not supported");
            }
        idx = node_new(P, E_TUPLE, line);
        idx->v = vec_nodes(&args);
        idx->nv = args.n;
    }
    Node *n = node_new(P, E_ITEM, line);
    n->a = obj;
    n->b = idx;
    return n;
}

static Node *parse_postfix(Parser *P, Node *n)
{
    int d0 = P->depth;
    for (;; enter(P)) {
        if (is_op(P, OP_DOT) || is_op(P, OP_LBRACKET)) n = parse_subscript(P, n);
        else if (is_op(P, OP_LPAREN)) n = parse_call(P, n);
        else break;
    }
    P->depth = d0;
    return n;
}

static Node *parse_filter_expr(Parser *P, Node *n)
{
    int d0 = P->depth;
    for (;; enter(P)) {
        if (is_op(P, OP_PIPE)) n = parse_filter(P, n);
        else if (is_name(P, "is")) n = parse_test(P, n);
        else if (is_op(P, OP_LPAREN)) n = parse_call(P, n);
        else break;
    }
    P->depth = d0;
    return n;
}

static Node *parse_primary(Parser *P, int with_namespace)
{
    Token *t = cur(P);
    int line = t->line;
    Node *n;
    if (t->type == TK_NAME) {
        advance(P);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True") || !strcmp(t->p, "false") || !strcmp(t->p, "False")) {
            n = node_new(P, E_CONST, line);
            n->k.t = V_BOOL;
            n->k.i = t->p[0] == 't' || t->p[0] == 'T';
        } else if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) {
            n = node_new(P, E_CONST, line);
            n->k.t = V_NONE;
        } else if (with_namespace && is_op(P, OP_DOT)) {
            advance(P);
            n = node_new(P, E_ATTR, line); /* namespace reference ns.attr (an assignment target) */
            n->a = node_new(P, E_NAME, line);
            n->a->s = t->p;
            n->s = expect_ident(P);
        } else {
            n = node_new(P, E_NAME, line);
            n->s = t->p;
            if (P->in_macro && (!strcmp(t->p, "varargs") || !strcmp(t->p, "kwargs") || !strcmp(t->p, "caller"))) {
                P->f->line = line;
                fail_throw(P->f, "the macro variable '%s' is not supported", t->p);
            }
        }
    } else if (t->type == TK_STRING) {
        Buf b = { 0 };
        while (cur(P)->type == TK_STRING) { /* adjacent literals concatenate */
            buf_put(P->A, &b, cur(P)->p, cur(P)->n);
            advance(P);
        }
        buf_putc(P->A, &b, 0); /* NUL-terminated too: names of filters and tests are looked up */
        n = node_new(P, E_CONST, line);
        n->k.t = V_STR;
        n->k.s.p = b.p;
        n->k.s.n = b.n - 1;
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        advance(P);
        n = node_new(P, E_CONST, line);
        if (t->type == TK_INT) { n->k.t = V_INT; n->k.i = t->i; }
        else { n->k.t = V_FLOAT; n->k.f = t->f; }
    } else if (is_op(P, OP_LPAREN)) {
        advance(P);
        n = parse_tuple(P, 0, 1, NULL, 1);
        expect_op(P, OP_RPAREN, "')'");
    } else if (is_op(P, OP_LBRACKET)) {
        advance(P);
        PtrVec items = { 0 };
        while (!is_op(P, OP_RBRACKET)) {
            if (items.n) expect_op(P, OP_COMMA, "','");
            if (is_op(P, OP_RBRACKET)) break;
            vec_push(P->A, &items, parse_expression(P, 1));
        }
        expect_op(P, OP_RBRACKET, "']'");
        n = node_new(P, E_LIST, line);
        n->v = vec_nodes(&items);
        n->nv = items.n;
    } else if (is_op(P, OP_LBRACE)) {
        advance(P);
        PtrVec keys = { 0 }, vals = { 0 };
        while (!is_op(P, OP_RBRACE)) {
            if (keys.n) expect_op(P, OP_COMMA, "','");
            if (is_op(P, OP_RBRACE)) break;
            vec_push(P->A, &keys, parse_expression(P, 1));
            expect_op(P, OP_COLON, "':'");
            vec_push(P->A, &vals, parse_expression(P, 1));
        }
        expect_op(P, OP_RBRACE, "'}'");
        n = node_new(P, E_DICT, line);
        n->v = vec_nodes(&keys);
        n->nv = keys.n;
        n->w = vec_nodes(&vals);
        n->nw = vals.n;
    } else {
        perr_unexpected(P, "an expression");
    }
    return n;
}

static Node *parse_unary(Parser *P, int with_filter)
{
    enter(P);
    int line = cur(P)->line;
    Node *n;
    if (is_op(P, OP_SUB) || is_op(P, OP_ADD)) {
        int neg = is_op(P, OP_SUB);
        advance(P);
        n = node_new(P, neg ? E_NEG : E_POS, line);
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P, 0);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static Node *bin_node(Parser *P, int kind, int op, Node *a, Node *b, int line)
{
    Node *n = node_new(P, kind, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* Each operand of an operator chain counts as a level of nesting: the tree is left-deep and the
   analysis and the evaluator recurse along it. */
static Node *parse_pow(Parser *P)
{
    int d0 = P->depth;
    Node *l = parse_unary(P, 1);
    while (is_op(P, OP_POW)) {
        int line = cur(P)->line;
        advance(P);
        enter(P);
        l = bin_node(P, E_BIN, OP_POW, l, parse_unary(P, 1), line);
    }
    P->depth = d0;
    return l;
}

static Node *parse_math2(Parser *P)
{
    int d0 = P->depth;
    Node *l = parse_pow(P);
    while (is_op(P, OP_MUL) || is_op(P, OP_DIV) || is_op(P, OP_FLOORDIV) || is_op(P, OP_MOD)) {
        int op = cur(P)->op, line = cur(P)->line;
        advance(P);
        enter(P);
        l = bin_node(P, E_BIN, op, l, parse_pow(P), line);
    }
    P->depth = d0;
    return l;
}

static Node *parse_concat(Parser *P)
{
    int line = cur(P)->line;
    Node *first = parse_math2(P);
    if (!is_op(P, OP_TILDE)) return first;
    PtrVec args = { 0 };
    vec_push(P->A, &args, first);
    while (skip_op(P, OP_TILDE)) vec_push(P->A, &args, parse_math2(P));
    Node *n = node_new(P, E_CONCAT, line);
    n->v = vec_nodes(&args);
    n->nv = args.n;
    return n;
}

static Node *parse_math1(Parser *P)
{
    int d0 = P->depth;
    Node *l = parse_concat(P);
    while (is_op(P, OP_ADD) || is_op(P, OP_SUB)) {
        int op = cur(P)->op, line = cur(P)->line;
        advance(P);
        enter(P);
        l = bin_node(P, E_BIN, op, l, parse_concat(P), line);
    }
    P->depth = d0;
    return l;
}

static Node *parse_compare(Parser *P)
{
    int line = cur(P)->line;
    Node *first = parse_math1(P);
    PtrVec operands = { 0 };
    int opsbuf[64], nops = 0;
    for (;;) {
        int op;
        if (cur(P)->type == TK_OP && (cur(P)->op == OP_EQ || cur(P)->op == OP_NE || cur(P)->op == OP_LT ||
                                      cur(P)->op == OP_LTEQ || cur(P)->op == OP_GT || cur(P)->op == OP_GTEQ)) {
            op = cur(P)->op;
            advance(P);
        } else if (skip_name(P, "in")) {
            op = OP_IN;
        } else if (is_name(P, "not") && peek(P, 1)->type == TK_NAME && !strcmp(peek(P, 1)->p, "in")) {
            P->pos += 2;
            op = OP_NOTIN;
        } else {
            break;
        }
        if (nops == 64) {
            P->f->line = line;
            fail_throw(P->f, "comparison chain too long");
        }
        opsbuf[nops++] = op;
        vec_push(P->A, &operands, parse_math1(P));
    }
    if (!nops) return first;
    Node *n = node_new(P, E_CMP, line);
    n->a = first;
    n->v = vec_nodes(&operands);
    n->nv = operands.n;
    n->ops = arena_alloc(P->A, sizeof(int) * (size_t)nops);
    memcpy(n->ops, opsbuf, sizeof(int) * (size_t)nops);
    return n;
}

static Node *parse_not(Parser *P)
{
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        advance(P);
        enter(P);
        Node *n = node_new(P, E_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static Node *parse_and(Parser *P)
{
    int d0 = P->depth;
    Node *l = parse_not(P);
    while (is_name(P, "and")) {
        int line = cur(P)->line;
        advance(P);
        enter(P);
        l = bin_node(P, E_AND, 0, l, parse_not(P), line);
    }
    P->depth = d0;
    return l;
}

static Node *parse_or(Parser *P)
{
    int d0 = P->depth;
    Node *l = parse_and(P);
    while (is_name(P, "or")) {
        int line = cur(P)->line;
        advance(P);
        enter(P);
        l = bin_node(P, E_OR, 0, l, parse_and(P), line);
    }
    P->depth = d0;
    return l;
}

static Node *parse_expression(Parser *P, int with_condexpr)
{
    enter(P);
    int line = cur(P)->line;
    Node *e = parse_or(P);
    while (with_condexpr && skip_name(P, "if")) {
        Node *n = node_new(P, E_COND, line);
        n->a = e;
        n->b = parse_or(P);
        if (skip_name(P, "else")) n->c = parse_expression(P, 1);
        e = n;
        line = cur(P)->line;
    }
    P->depth--;
    return e;
}

static int is_tuple_end(Parser *P, const char *extra_end)
{
    Token *t = cur(P);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF) return 1;
    if (is_op(P, OP_RPAREN)) return 1;
    return extra_end && is_name(P, extra_end);
}

static Node *parse_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens)
{
    int line = cur(P)->line, is_tuple = 0;
    PtrVec args = { 0 };
    for (;;) {
        if (args.n) expect_op(P, OP_COMMA, "','");
        if (is_tuple_end(P, extra_end)) break;
        vec_push(P->A, &args, simplified ? parse_primary(P, simplified == 2) : parse_expression(P, with_condexpr));
        if (is_op(P, OP_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return vec_nodes(&args)[0];
        if (!explicit_parens) perr_unexpected(P, "an expression");
    }
    Node *n = node_new(P, E_TUPLE, line);
    n->v = vec_nodes(&args);
    n->nv = args.n;
    return n;
}

/* Assignment target: names (op=1 when a tuple), or a namespace attribute (s = attribute). */
static void parse_target(Parser *P, Node *stmt, const char *extra_end, int with_namespace)
{
    int line = cur(P)->line;
    Node *t = parse_tuple(P, with_namespace ? 2 : 1, 1, extra_end, 0);
    P->f->line = line;
    if (t->kind == E_ATTR) {
        stmt->names = arena_alloc(P->A, sizeof(char *));
        stmt->names[0] = t->a->s;
        stmt->nn = 1;
        stmt->c = t->a; /* the namespace, loaded like any name */
        stmt->s = t->s;
        return;
    }
    Node **items = &t;
    int n = 1;
    if (t->kind == E_TUPLE) {
        items = t->v;
        n = t->nv;
        stmt->op = 1;
    }
    stmt->names = arena_alloc(P->A, sizeof(char *) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        if (items[i]->kind == E_ATTR) fail_throw(P->f, "namespace attributes in a tuple assignment are not supported");
        if (items[i]->kind != E_NAME) fail_throw(P->f, "can't assign to this expression");
        stmt->names[i] = items[i]->s;
    }
    stmt->nn = n;
}

static void parse_block_body(Parser *P, Node *stmt, const char *const *end_names, int which_w)
{
    skip_op(P, OP_COLON);
    expect_type(P, TK_BLOCK_END, "'%}'");
    PtrVec body = { 0 };
    parse_body(P, &body, end_names);
    if (cur(P)->type == TK_EOF) {
        char b[128];
        snprintf(b, sizeof b, "'%s'", end_names[0]);
        perr_unexpected(P, b);
    }
    if (which_w) { stmt->w = vec_nodes(&body); stmt->nw = body.n; }
    else { stmt->v = vec_nodes(&body); stmt->nv = body.n; }
}

static Node *parse_statement(Parser *P)
{
    Token *t = cur(P);
    int line = t->line;
    P->f->line = line;
    if (t->type != TK_NAME) perr_unexpected(P, "a tag name");
    const char *tag = t->p;
    advance(P);
    enter(P);
    Node *n;
    if (!strcmp(tag, "if")) { /* as Jinja's If: elif branches are a list of If nodes (see sym_if) */
        n = node_new(P, S_IF, line);
        Node *c = n;
        PtrVec elifs = { 0 };
        for (;;) {
            c->a = parse_tuple(P, 0, 0, NULL, 0);
            static const char *const ends[] = { "endif", "elif", "else", NULL };
            parse_block_body(P, c, ends, 0);
            const char *which = cur(P)->p;
            advance(P);
            if (!strcmp(which, "elif")) {
                c = node_new(P, S_IF, cur(P)->line);
                vec_push(P->A, &elifs, c);
                continue;
            }
            if (!strcmp(which, "else")) {
                static const char *const ends2[] = { "endif", NULL };
                parse_block_body(P, n, ends2, 1);
                advance(P);
            }
            break;
        }
        n->x = vec_nodes(&elifs);
        n->nx = elifs.n;
    } else if (!strcmp(tag, "for")) {
        n = node_new(P, S_FOR, line);
        parse_target(P, n, "in", 0);
        if (!skip_name(P, "in")) perr_unexpected(P, "'in'");
        n->a = parse_tuple(P, 0, 0, "recursive", 0);
        if (skip_name(P, "if")) n->b = parse_expression(P, 1);
        if (is_name(P, "recursive")) fail_throw(P->f, "recursive for loops are not supported");
        static const char *const ends[] = { "endfor", "else", NULL };
        P->loop_depth++;
        parse_block_body(P, n, ends, 0);
        P->loop_depth--;
        if (is_name(P, "else")) {
            advance(P);
            static const char *const ends2[] = { "endfor", NULL };
            parse_block_body(P, n, ends2, 1);
        }
        advance(P);
    } else if (!strcmp(tag, "set")) {
        n = node_new(P, S_SET, line);
        parse_target(P, n, NULL, 1);
        if (skip_op(P, OP_ASSIGN)) {
            n->a = parse_tuple(P, 0, 1, NULL, 0);
        } else {
            Node *f = parse_filter(P, NULL);
            PtrVec filters = { 0 };
            for (; f; f = f->a) vec_push(P->A, &filters, f); /* outermost first */
            static const char *const ends[] = { "endset", NULL };
            parse_block_body(P, n, ends, 0);
            advance(P);
            n->w = arena_alloc(P->A, sizeof(Node *) * (size_t)(filters.n ? filters.n : 1));
            for (int i = 0; i < filters.n; i++) n->w[i] = vec_nodes(&filters)[filters.n - 1 - i];
            n->nw = filters.n;
            n->op |= 2; /* block form */
        }
    } else if (!strcmp(tag, "macro")) {
        n = node_new(P, S_MACRO, line);
        n->s = expect_ident(P);
        vec_push(P->A, &P->macros, (void *)n->s);
        PtrVec params = { 0 }, defaults = { 0 };
        expect_op(P, OP_LPAREN, "'('");
        int have_default = 0;
        while (!is_op(P, OP_RPAREN)) {
            if (params.n) expect_op(P, OP_COMMA, "','");
            vec_push(P->A, &params, (void *)expect_ident(P));
            if (skip_op(P, OP_ASSIGN)) {
                vec_push(P->A, &defaults, parse_expression(P, 1));
                have_default = 1;
            } else {
                if (have_default) fail_throw(P->f, "non-default argument follows default argument");
                vec_push(P->A, &defaults, NULL);
            }
        }
        expect_op(P, OP_RPAREN, "')'");
        n->names = (const char **)params.p;
        n->nn = params.n;
        n->w = vec_nodes(&defaults);
        n->nw = defaults.n;
        int saved_loop = P->loop_depth;
        P->loop_depth = 0;
        P->in_macro++;
        static const char *const ends[] = { "endmacro", NULL };
        parse_block_body(P, n, ends, 0);
        P->in_macro--;
        P->loop_depth = saved_loop;
        advance(P);
    } else if (!strcmp(tag, "print")) { /* {% print a, b %}: each expression printed */
        n = node_new(P, S_GROUP, line);
        PtrVec outs = { 0 };
        while (cur(P)->type != TK_BLOCK_END) {
            if (outs.n) expect_op(P, OP_COMMA, "','");
            Node *o = node_new(P, S_OUT, cur(P)->line);
            o->a = parse_expression(P, 1);
            vec_push(P->A, &outs, o);
        }
        n->v = vec_nodes(&outs);
        n->nv = outs.n;
    } else if (!strcmp(tag, "with")) {
        n = node_new(P, S_WITH, line);
        PtrVec names = { 0 }, vals = { 0 };
        while (cur(P)->type != TK_BLOCK_END) {
            if (names.n) expect_op(P, OP_COMMA, "','");
            vec_push(P->A, &names, (void *)expect_ident(P));
            expect_op(P, OP_ASSIGN, "'='");
            vec_push(P->A, &vals, parse_expression(P, 1));
        }
        n->names = (const char **)names.p;
        n->nn = names.n;
        n->w = vec_nodes(&vals);
        n->nw = vals.n;
        static const char *const ends[] = { "endwith", NULL };
        PtrVec body = { 0 };
        expect_type(P, TK_BLOCK_END, "'%}'");
        parse_body(P, &body, ends);
        if (cur(P)->type == TK_EOF) perr_unexpected(P, "'endwith'");
        advance(P);
        n->v = vec_nodes(&body);
        n->nv = body.n;
    } else if (!strcmp(tag, "generation")) {
        n = node_new(P, S_SCOPE, line);
        int saved_loop = P->loop_depth;
        P->loop_depth = 0;
        static const char *const ends[] = { "endgeneration", NULL };
        parse_block_body(P, n, ends, 0);
        P->loop_depth = saved_loop;
        advance(P);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loop_depth) fail_throw(P->f, "'%s' outside of a loop", tag);
        n = node_new(P, tag[0] == 'b' ? S_BREAK : S_CONTINUE, line);
    } else {
        static const char *const known[] = { "block", "extends", "include", "import", "from", "autoescape", "call",
                                             "filter", NULL };
        if (in_list(known, tag)) fail_throw(P->f, "the '%s' tag is not supported", tag);
        fail_throw(P->f, "unknown tag '%s'", tag);
    }
    P->depth--;
    return n;
}

/* Statements and data up to {% <one of end_names> (left as the current token) or the end. */
static void parse_body(Parser *P, PtrVec *out, const char *const *end_names)
{
    for (;;) {
        Token *t = cur(P);
        if (t->type == TK_EOF) return;
        if (t->type == TK_DATA) {
            Node *n = node_new(P, S_DATA, t->line);
            n->s = t->p;
            n->sn = t->n;
            vec_push(P->A, out, n);
            advance(P);
        } else if (t->type == TK_VAR_BEGIN) {
            advance(P);
            Node *n = node_new(P, S_OUT, t->line);
            n->a = parse_tuple(P, 0, 1, NULL, 0);
            expect_type(P, TK_VAR_END, "'}}'");
            vec_push(P->A, out, n);
        } else if (t->type == TK_BLOCK_BEGIN) {
            advance(P);
            if (end_names && cur(P)->type == TK_NAME)
                for (int i = 0; end_names[i]; i++)
                    if (!strcmp(cur(P)->p, end_names[i])) return;
            vec_push(P->A, out, parse_statement(P));
            expect_type(P, TK_BLOCK_END, "'%}'");
        } else {
            perr_unexpected(P, "template data or a tag");
        }
    }
}

/* ---- variable scoping: Jinja's symbol tracking (jinja2/idtracking.py Symbols, RootVisitor,
 * FrameSymbolVisitor), run once at load. A frame's analysis is complete before its child frames
 * are analyzed, as in Jinja, where child frames are analyzed while code is generated. ---- */

typedef struct Syms Syms;
typedef struct {
    const char *name;
    int ref;        /* the frame has a variable for name (refs) */
    int stored;     /* name is assigned in the frame (stores) */
    int load;       /* LD_*: how the variable starts (loads) */
    Syms *alias;    /* LD_ALIAS: the frame whose variable it copies */
} SymEnt;

struct Syms {
    Syms *parent;
    int level;
    SymEnt *e;
    int n, cap;
    FrameInfo *fi;  /* set when the frame's analysis is final */
};

typedef struct {
    Fail *f;
    Arena *A;
    int resolve;    /* 0: collect symbols; 1: resolve names to (depth, slot) and queue child frames */
    PtrVec jobs;    /* resolve: child frames of the current frame, (node, which) pairs */
} Ana;

static SymEnt *sym_entry(Ana *a, Syms *S, const char *name)
{
    for (int i = 0; i < S->n; i++)
        if (!strcmp(S->e[i].name, name)) return &S->e[i];
    if (S->n == FRAME_NAME_LIMIT) fail_throw(a->f, "more than %d names in one scope", FRAME_NAME_LIMIT);
    if (S->n == S->cap) {
        int cap = S->cap ? S->cap * 2 : 8;
        SymEnt *e = arena_alloc(a->A, sizeof(SymEnt) * (size_t)cap);
        if (S->n) memcpy(e, S->e, sizeof(SymEnt) * (size_t)S->n);
        S->e = e;
        S->cap = cap;
    }
    SymEnt *e = &S->e[S->n++];
    memset(e, 0, sizeof *e);
    e->name = name;
    return e;
}

static Syms *sym_find_ref(Syms *S, const char *name)
{
    for (; S; S = S->parent)
        for (int i = 0; i < S->n; i++)
            if (S->e[i].ref && !strcmp(S->e[i].name, name)) return S;
    return NULL;
}

static void sym_define(SymEnt *e, int load, Syms *alias)
{
    e->ref = 1;
    e->load = load;
    e->alias = alias;
}

static void sym_store(Ana *a, Syms *S, const char *name)
{
    SymEnt *e = sym_entry(a, S, name);
    e->stored = 1;
    if (e->ref) return;
    Syms *outer = S->parent ? sym_find_ref(S->parent, name) : NULL;
    sym_define(e, outer ? LD_ALIAS : LD_UNDEF, outer);
}

static void sym_param(Ana *a, Syms *S, const char *name)
{
    SymEnt *e = sym_entry(a, S, name);
    e->stored = 1;
    sym_define(e, LD_PARAM, NULL);
}

static void sym_load(Ana *a, Syms *S, const char *name)
{
    if (!sym_find_ref(S, name)) sym_define(sym_entry(a, S, name), LD_RESOLVE, NULL);
}

static Syms *sym_copy(Ana *a, Syms *S)
{
    Syms *c = arena_alloc(a->A, sizeof *c);
    *c = *S;
    c->e = arena_alloc(a->A, sizeof(SymEnt) * (size_t)(S->cap ? S->cap : 1));
    if (S->n) memcpy(c->e, S->e, sizeof(SymEnt) * (size_t)S->n);
    return c;
}

/* Symbols.branch_update: merge the if/elif/else branches; a name first assigned in some branch
   starts from the enclosing frame's variable (or the render variables), not from missing. */
static void sym_branch_update(Ana *a, Syms *S, Syms **br, int nb)
{
    /* a branch is a copy of S plus its own names: its entry i < n0 is S's entry i, so only the
       names new in a branch are looked up (a lookup per copied name made each if cost n^2) */
    const int n0 = S->n;
    PtrVec fresh = { 0 };
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < br[b]->n; i++) {
            SymEnt *e = &br[b]->e[i];
            if (!e->stored) continue;
            SymEnt *o = i < n0 ? &S->e[i] : NULL;
            if (o && o->stored) continue;
            int dup = 0;
            for (int k = 0; k < fresh.n && !dup; k++) dup = !strcmp(fresh.p[k], e->name);
            if (!dup) vec_push(a->A, &fresh, (void *)e->name);
        }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < br[b]->n; i++) {
            SymEnt *e = &br[b]->e[i], *t = i < n0 ? &S->e[i] : sym_entry(a, S, e->name);
            if (e->ref) sym_define(t, e->load, e->alias);
            if (e->stored) t->stored = 1;
        }
    for (int k = 0; k < fresh.n; k++) {
        SymEnt *t = sym_entry(a, S, fresh.p[k]);
        Syms *outer = S->parent ? sym_find_ref(S->parent, t->name) : NULL;
        sym_define(t, outer ? LD_ALIAS : LD_RESOLVE, outer);
    }
}

static int fi_slot(const FrameInfo *fi, const char *name)
{
    for (int i = 0; i < fi->n; i++)
        if (!strcmp(fi->names[i], name)) return i;
    return -1;
}

static int *slots_of(Ana *a, Syms *S, const char *const *names, int n)
{
    int *sl = arena_alloc(a->A, sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) sl[i] = fi_slot(S->fi, names[i]);
    return sl;
}

static void sym_expr(Ana *a, Syms *S, Node *n)
{
    if (!n) return;
    if (n->kind == E_NAME) {
        if (!a->resolve) { sym_load(a, S, n->s); return; }
        Syms *o = sym_find_ref(S, n->s);
        if (!o) { n->depth = -1; return; } /* not analyzed (a set block's filter arguments) */
        n->depth = S->level - o->level;
        n->slot = fi_slot(o->fi, n->s);
        return;
    }
    sym_expr(a, S, n->a);
    sym_expr(a, S, n->b);
    sym_expr(a, S, n->c);
    for (int i = 0; i < n->nv; i++) sym_expr(a, S, n->v[i]);
    for (int i = 0; i < n->nw; i++) sym_expr(a, S, n->w[i]);
}

static void sym_job(Ana *a, Node *n, int which)
{
    vec_push(a->A, &a->jobs, n);
    vec_push(a->A, &a->jobs, (void *)(intptr_t)which);
}

static void sym_body(Ana *a, Syms *S, Node **v, int nv);

/* FrameSymbolVisitor over one statement of frame S */
static void sym_stmt(Ana *a, Syms *S, Node *n)
{
    switch (n->kind) {
    case S_OUT: sym_expr(a, S, n->a); return;
    case S_GROUP: sym_body(a, S, n->v, n->nv); return;
    case S_IF:
        sym_expr(a, S, n->a);
        if (a->resolve) {
            sym_body(a, S, n->v, n->nv);
            sym_body(a, S, n->x, n->nx);
            sym_body(a, S, n->w, n->nw);
        } else {
            Syms *br[3];
            br[0] = sym_copy(a, S);
            sym_body(a, br[0], n->v, n->nv);
            br[1] = sym_copy(a, S);
            sym_body(a, br[1], n->x, n->nx);
            br[2] = sym_copy(a, S);
            sym_body(a, br[2], n->w, n->nw);
            sym_branch_update(a, S, br, 3);
        }
        return;
    case S_FOR: /* the iterable belongs to this frame; body, filter and else are frames of their own */
        sym_expr(a, S, n->a);
        if (a->resolve) {
            sym_job(a, n, 0);
            if (n->b) sym_job(a, n, 1);
            if (n->nw) sym_job(a, n, 2);
        }
        return;
    case S_SET:
        if (n->op & 2) { if (a->resolve) sym_job(a, n, 0); }
        else sym_expr(a, S, n->a);
        if (n->c) { sym_expr(a, S, n->c); return; } /* ns.attr = ...: a load of ns */
        if (a->resolve) n->slots = slots_of(a, S, n->names, n->nn);
        else for (int i = 0; i < n->nn; i++) sym_store(a, S, n->names[i]);
        return;
    case S_MACRO:
        if (a->resolve) {
            n->slot = fi_slot(S->fi, n->s);
            sym_job(a, n, 0);
        } else {
            sym_store(a, S, n->s);
        }
        return;
    case S_WITH:
        for (int i = 0; i < n->nw; i++) sym_expr(a, S, n->w[i]);
        if (a->resolve) sym_job(a, n, 0);
        return;
    case S_SCOPE:
        if (a->resolve) sym_job(a, n, 0);
        return;
    default: return; /* S_DATA, S_BREAK, S_CONTINUE */
    }
}

static void sym_body(Ana *a, Syms *S, Node **v, int nv)
{
    for (int i = 0; i < nv; i++) sym_stmt(a, S, v[i]);
}

/* What frame `which` of node n contains (RootVisitor); params only in the collecting pass. */
static void sym_frame_content(Ana *a, Syms *S, Node *n, int which)
{
    switch (n->kind) {
    case S_FOR:
        if (which == 0) {
            if (!a->resolve) {
                sym_param(a, S, "loop");
                for (int i = 0; i < n->nn; i++) sym_param(a, S, n->names[i]);
            } else {
                n->slot = fi_slot(S->fi, "loop");
                n->slots = slots_of(a, S, n->names, n->nn);
            }
            sym_body(a, S, n->v, n->nv);
        } else if (which == 1) {
            if (!a->resolve) for (int i = 0; i < n->nn; i++) sym_param(a, S, n->names[i]);
            else n->slots2 = slots_of(a, S, n->names, n->nn);
            sym_expr(a, S, n->b);
        } else {
            sym_body(a, S, n->w, n->nw);
        }
        return;
    case S_MACRO:
        if (!a->resolve) for (int i = 0; i < n->nn; i++) sym_param(a, S, n->names[i]);
        else n->slots = slots_of(a, S, n->names, n->nn);
        for (int i = 0; i < n->nw; i++) sym_expr(a, S, n->w[i]);
        sym_body(a, S, n->v, n->nv);
        return;
    case S_WITH:
        if (!a->resolve) for (int i = 0; i < n->nn; i++) sym_param(a, S, n->names[i]);
        else n->slots = slots_of(a, S, n->names, n->nn);
        sym_body(a, S, n->v, n->nv);
        return;
    case S_SET: /* block set: the body; its filters' arguments too (Jinja leaves them unanalyzed) */
        sym_body(a, S, n->v, n->nv);
        for (int i = 0; i < n->nw; i++) sym_expr(a, S, n->w[i]);
        return;
    default: /* S_SCOPE: the template, {% generation %} */
        sym_body(a, S, n->v, n->nv);
        return;
    }
}

static void sym_frame(Ana *a, Syms *parent, Node *n, int which)
{
    Syms *S = arena_alloc(a->A, sizeof *S);
    memset(S, 0, sizeof *S);
    S->parent = parent;
    S->level = parent ? parent->level + 1 : 0;
    if (n->kind == S_FOR && which == 0)
        for (int i = 0; i < n->nn; i++)
            if (!strcmp(n->names[i], "loop")) {
                a->f->line = n->line;
                fail_throw(a->f, "can't assign to special loop variable in for-loop target");
            }
    a->resolve = 0;
    sym_frame_content(a, S, n, which);
    FrameInfo *fi = arena_alloc(a->A, sizeof *fi);
    int nref = 0;
    for (int i = 0; i < S->n; i++) nref += S->e[i].ref;
    fi->n = nref;
    fi->names = arena_alloc(a->A, sizeof(char *) * (size_t)(nref ? nref : 1));
    fi->load = arena_alloc(a->A, sizeof(int) * (size_t)(nref ? nref : 1));
    fi->alias_depth = arena_alloc(a->A, sizeof(int) * (size_t)(nref ? nref : 1));
    fi->alias_slot = arena_alloc(a->A, sizeof(int) * (size_t)(nref ? nref : 1));
    for (int i = 0, k = 0; i < S->n; i++) {
        SymEnt *e = &S->e[i];
        if (!e->ref) continue;
        fi->names[k] = e->name;
        fi->load[k] = e->load;
        fi->alias_depth[k] = e->alias ? S->level - e->alias->level : 0;
        fi->alias_slot[k] = e->alias ? fi_slot(e->alias->fi, e->name) : 0;
        k++;
    }
    S->fi = fi;
    n->fi[which] = fi;
    PtrVec saved = a->jobs;
    memset(&a->jobs, 0, sizeof a->jobs);
    a->resolve = 1;
    sym_frame_content(a, S, n, which);
    PtrVec jobs = a->jobs;
    a->jobs = saved;
    for (int i = 0; i < jobs.n; i += 2) sym_frame(a, S, jobs.p[i], (int)(intptr_t)jobs.p[i + 1]);
}

/* Parse source text into a Tmpl (NULL with err set on failure). */
static Tmpl *tmpl_parse(const char *text, size_t len, char *err, size_t errlen)
{
    Tmpl *T = xcalloc(1, sizeof *T);
    Fail *f = xcalloc(1, sizeof *f);
    TokVec *tv = xcalloc(1, sizeof *tv);
    f->err = err;
    f->errlen = errlen;
    T->arena.fail = f;
    T->arena.limit = LOAD_MEM_LIMIT;
    T->arena.what = "loading the template";
    if (setjmp(f->jb)) {
        free(tv->tk);
        free(tv);
        arena_free(&T->arena);
        free(T);
        free(f);
        return NULL;
    }
    if (!u8_valid(text, len)) fail_throw(f, "the template is not valid UTF-8");
    /* newlines normalized to \n and one trailing newline dropped (keep_trailing_newline=False) */
    char *src = arena_alloc(&T->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    tv->f = f;
    tv->A = &T->arena;
    lex(tv, src, n);
    Parser P = { 0 };
    P.f = f;
    P.A = &T->arena;
    P.tk = tv->tk;
    PtrVec body = { 0 };
    parse_body(&P, &body, NULL);
    if (cur(&P)->type != TK_EOF) perr_unexpected(&P, "end of template");
    for (int i = 0; i < P.called.n; i++) {
        const char *name = P.called.p[i];
        int found = 0;
        for (int k = 0; k < P.macros.n && !found; k++) found = !strcmp(P.macros.p[k], name);
        if (!found) {
            f->line = (int)(intptr_t)P.called_lines.p[i];
            fail_throw(f, "call of '%s', which is neither a macro of this template nor a supported global function", name);
        }
    }
    T->root = node_new(&P, S_SCOPE, 1);
    T->root->v = vec_nodes(&body);
    T->root->nv = body.n;
    Ana ana = { 0 };
    ana.f = f;
    ana.A = &T->arena;
    sym_frame(&ana, NULL, T->root, 0);
    T->arena.fail = NULL;
    T->arena.limit = 0;
    free(tv->tk);
    free(tv);
    free(f);
    return T;
}

/* ---- render context and values ---- */

typedef struct {
    Fail f;
    Arena A;
    Buf *out;          /* where output goes (a macro call swaps it) */
    Dict *vars;        /* render variables: messages, tools, add_generation_prompt, bos/eos tokens, kwargs */
    int depth;         /* macro call depth */
    int nest;          /* eval / exec_body calls in progress (EVAL_DEPTH_LIMIT) */
    long steps;
    size_t scanned;    /* bytes scanned not yet counted in steps (< 8) */
} Ctx;

static void rerr(Ctx *C, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void rerr(Ctx *C, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_throw(&C->f, "%s", msg);
}

static void step(Ctx *C)
{
    if (++C->steps > RENDER_STEP_LIMIT) rerr(C, "the render takes more than %d steps", RENDER_STEP_LIMIT);
}

/* Reading n bytes without allocating (comparing, searching, measuring a string) costs steps too:
   the memory limit bounds only what is built, so a loop that rescans a 100 MB string, or one
   quadratic search, would otherwise run for hours within both limits. One step per 8 bytes: a
   loop over code points (py_space_at, u8_count) reads about that many in the time of a step. */
static void step_bytes(Ctx *C, size_t n)
{
    C->scanned += n;
    C->steps += (long)(C->scanned >> 3);
    C->scanned &= 7;
    if (C->steps > RENDER_STEP_LIMIT) rerr(C, "the render takes more than %d steps", RENDER_STEP_LIMIT);
}

static Value v_undef(const char *name)
{
    Value v = { .t = V_UNDEF };
    v.s.p = name;
    v.s.n = name ? strlen(name) : 0;
    return v;
}
static Value v_none(void) { return (Value){ .t = V_NONE }; }
static Value v_absent(void) { return (Value){ .t = V_ABSENT }; }
static Value v_bool(int b) { Value v = { .t = V_BOOL }; v.i = b != 0; return v; }
static Value v_int(int64_t i) { Value v = { .t = V_INT }; v.i = i; return v; }
static Value v_float(double f) { Value v = { .t = V_FLOAT }; v.f = f; return v; }
static Value v_str(const char *p, size_t n) { Value v = { .t = V_STR }; v.s.p = p; v.s.n = n; return v; }
static Value v_cstr(const char *p) { return v_str(p, strlen(p)); }
static Value v_list(List *l) { Value v = { .t = V_LIST }; v.l = l; return v; }
static Value v_dict(Dict *d) { Value v = { .t = V_DICT }; v.d = d; return v; }
static Value v_func(int id) { Value v = { .t = V_FUNC }; v.i = id; return v; }
static Value v_buf(Buf *b) { return v_str(b->p ? b->p : "", b->n); }

static Value v_strcopy(Ctx *C, const char *p, size_t n) { return v_str(n ? arena_strndup(&C->A, p, n) : "", n); }

static List *list_new(Ctx *C, int kind, size_t cap)
{
    List *l = arena_alloc(&C->A, sizeof *l);
    memset(l, 0, sizeof *l);
    l->kind = kind;
    if (cap) {
        l->v = arena_alloc(&C->A, sizeof(Value) * cap);
        l->cap = cap;
    }
    return l;
}

static void list_push(Ctx *C, List *l, Value x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        Value *v = arena_alloc(&C->A, sizeof(Value) * cap);
        if (l->n) memcpy(v, l->v, sizeof(Value) * l->n);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static List *list_from(Ctx *C, int kind, const Value *v, size_t n)
{
    List *l = list_new(C, kind, n);
    if (n) memcpy(l->v, v, sizeof(Value) * n);
    l->n = n;
    return l;
}

static Value v_tuple2(Ctx *C, Value a, Value b)
{
    List *l = list_new(C, LK_TUPLE, 2);
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    return v_list(l);
}

static Dict *dict_new(Ctx *C)
{
    Dict *d = arena_alloc(&C->A, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

static const char *type_name(Value v)
{
    switch (v.t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST:
        switch (v.l->kind) {
        case LK_LIST: return "list";
        case LK_TUPLE: return "tuple";
        case LK_RANGE: return "range";
        case LK_ITEMS: return "dict_items";
        case LK_KEYS: return "dict_keys";
        case LK_VALUES: return "dict_values";
        default: return "generator";
        }
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_LOOP: return "LoopContext";
    case V_MACRO: return "Macro";
    case V_FUNC: return "function";
    case V_METHOD: return "builtin_function_or_method";
    default: return "?";
    }
}

static int is_num(Value v) { return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT; }
static double num_f(Value v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

static int truthy(Value v)
{
    switch (v.t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s.n > 0;
    case V_LIST: return v.l->kind == LK_ITER ? 1 : v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return 1;
    }
}

/* Python ==. */
static int py_eq(Ctx *C, Value a, Value b);

static int num_eq(Value a, Value b)
{
    if (a.t != V_FLOAT && b.t != V_FLOAT) return a.i == b.i;
    if (a.t == V_FLOAT && b.t == V_FLOAT) return a.f == b.f;
    double f = a.t == V_FLOAT ? a.f : b.f;
    int64_t i = a.t == V_FLOAT ? b.i : a.i;
    if (f != f || f != floor(f) || fabs(f) >= 9223372036854775808.0) return 0; /* exact int/float compare */
    return (int64_t)f == i;
}

static Value *dict_find(Ctx *C, Dict *d, Value k)
{
    if (k.t == V_STR) { /* the common case */
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].t == V_STR && d->k[i].s.n == k.s.n && !memcmp(d->k[i].s.p, k.s.p, k.s.n)) return &d->v[i];
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (py_eq(C, d->k[i], k)) return &d->v[i];
    return NULL;
}

static Value *dict_find_str(Dict *d, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, s, n)) return &d->v[i];
    return NULL;
}

/* Values a template builds in a loop ({% set ns.x = [ns.x] %}) can nest far deeper than the C
   stack allows recursing into them; Python stops at its recursion limit too. */
static void check_nesting(Ctx *C, int depth)
{
    if (depth > JSON_DEPTH_LIMIT) rerr(C, "value nested deeper than %d to compare or hash", JSON_DEPTH_LIMIT);
}

static void check_hashable_at(Ctx *C, Value k, int depth)
{
    check_nesting(C, depth);
    if ((k.t == V_LIST && k.l->kind != LK_TUPLE && k.l->kind != LK_RANGE && k.l->kind != LK_ITER) || k.t == V_DICT)
        rerr(C, "unhashable type: '%s'", type_name(k));
    if (k.t == V_LIST && k.l->kind == LK_TUPLE)
        for (size_t i = 0; i < k.l->n; i++) check_hashable_at(C, k.l->v[i], depth + 1);
}

static void check_hashable(Ctx *C, Value k) { check_hashable_at(C, k, 0); }

static void dict_set(Ctx *C, Dict *d, Value k, Value v)
{
    check_hashable(C, k);
    Value *p = dict_find(C, d, k);
    if (p) { *p = v; return; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        Value *nk = arena_alloc(&C->A, sizeof(Value) * cap), *nv = arena_alloc(&C->A, sizeof(Value) * cap);
        if (d->n) {
            memcpy(nk, d->k, sizeof(Value) * d->n);
            memcpy(nv, d->v, sizeof(Value) * d->n);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

static int py_eq_at(Ctx *C, Value a, Value b, int depth)
{
    check_nesting(C, depth);
    step(C);
    if (is_num(a) && is_num(b)) return num_eq(a, b);
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR:
        if (a.s.n != b.s.n) return 0;
        step_bytes(C, a.s.n);
        return !memcmp(a.s.p, b.s.p, a.s.n);
    case V_LIST: {
        List *x = a.l, *y = b.l;
        if (x == y) return 1;
        int seq_x = x->kind == LK_LIST || x->kind == LK_TUPLE || x->kind == LK_RANGE;
        int seq_y = y->kind == LK_LIST || y->kind == LK_TUPLE || y->kind == LK_RANGE;
        if (!seq_x || !seq_y) {
            if (x->kind == LK_ITER || y->kind == LK_ITER) return 0;
            rerr(C, "comparing %s and %s is not supported", type_name(a), type_name(b));
        }
        if (x->kind != y->kind || x->n != y->n) return 0;
        for (size_t i = 0; i < x->n; i++)
            if (!py_eq_at(C, x->v[i], y->v[i], depth + 1)) return 0;
        return 1;
    }
    case V_DICT: {
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            Value *o = dict_find(C, b.d, a.d->k[i]);
            if (!o || !py_eq_at(C, a.d->v[i], *o, depth + 1)) return 0;
        }
        return 1;
    }
    case V_FUNC: return a.i == b.i;
    case V_NS: return a.d == b.d;
    case V_LOOP: return a.lp == b.lp;
    case V_MACRO: return a.m == b.m;
    default: return a.me == b.me;
    }
}

static int py_eq(Ctx *C, Value a, Value b) { return py_eq_at(C, a, b, 0); }

/* Python ordering (<, >, sorted): <0, 0, >0, or a TypeError. */
static int py_cmp_at(Ctx *C, Value a, Value b, int depth)
{
    check_nesting(C, depth);
    step(C);
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return (a.i > b.i) - (a.i < b.i);
        if (num_eq(a, b)) return 0;
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.t == V_STR && b.t == V_STR) { /* UTF-8 byte order is code point order */
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        step_bytes(C, n);
        int c = memcmp(a.s.p, b.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.t == V_LIST && b.t == V_LIST && a.l->kind == b.l->kind && (a.l->kind == LK_LIST || a.l->kind == LK_TUPLE)) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++)
            if (!py_eq_at(C, a.l->v[i], b.l->v[i], depth + 1)) return py_cmp_at(C, a.l->v[i], b.l->v[i], depth + 1);
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) rerr(C, "'%s' is undefined", a.t == V_UNDEF ? a.s.p ? a.s.p : "value" : b.s.p ? b.s.p : "value");
    rerr(C, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

static int py_cmp(Ctx *C, Value a, Value b) { return py_cmp_at(C, a, b, 0); }

/* ---- str() and repr() ---- */

static void py_repr(Ctx *C, Buf *b, Value v, int depth);

static void py_str_repr(Ctx *C, Buf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    buf_putc(&C->A, b, q);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            i++;
            if (c == (unsigned char)q || c == '\\') { buf_putc(&C->A, b, '\\'); buf_putc(&C->A, b, (char)c); }
            else if (c == '\t') buf_puts(&C->A, b, "\\t");
            else if (c == '\n') buf_puts(&C->A, b, "\\n");
            else if (c == '\r') buf_puts(&C->A, b, "\\r");
            else if (c < 0x20 || c == 0x7F) buf_printf(&C->A, b, "\\x%02x", c);
            else buf_putc(&C->A, b, (char)c);
            continue;
        }
        uint32_t cp;
        int l = u8_dec((const unsigned char *)s + i, &cp);
        if (py_printable(cp)) buf_put(&C->A, b, s + i, (size_t)l);
        else if (cp <= 0xFF) buf_printf(&C->A, b, "\\x%02x", cp);
        else if (cp <= 0xFFFF) buf_printf(&C->A, b, "\\u%04x", cp);
        else buf_printf(&C->A, b, "\\U%08x", cp);
        i += (size_t)l;
    }
    buf_putc(&C->A, b, q);
}

static void py_items_repr(Ctx *C, Buf *b, const Value *v, size_t n, int depth)
{
    for (size_t i = 0; i < n; i++) {
        if (i) buf_puts(&C->A, b, ", ");
        py_repr(C, b, v[i], depth + 1);
    }
}

static void py_dict_repr(Ctx *C, Buf *b, Dict *d, int depth)
{
    buf_putc(&C->A, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) buf_puts(&C->A, b, ", ");
        py_repr(C, b, d->k[i], depth + 1);
        buf_puts(&C->A, b, ": ");
        py_repr(C, b, d->v[i], depth + 1);
    }
    buf_putc(&C->A, b, '}');
}

static void py_repr(Ctx *C, Buf *b, Value v, int depth)
{
    if (depth > JSON_DEPTH_LIMIT) rerr(C, "value nested too deeply to print");
    char num[40];
    switch (v.t) {
    case V_UNDEF: buf_puts(&C->A, b, "Undefined"); return;
    case V_NONE: buf_puts(&C->A, b, "None"); return;
    case V_BOOL: buf_puts(&C->A, b, v.i ? "True" : "False"); return;
    case V_INT: buf_printf(&C->A, b, "%" PRId64, v.i); return;
    case V_FLOAT: py_float_repr(v.f, num); buf_puts(&C->A, b, num); return;
    case V_STR: py_str_repr(C, b, v.s.p, v.s.n); return;
    case V_LIST: {
        List *l = v.l;
        switch (l->kind) {
        case LK_LIST:
            buf_putc(&C->A, b, '[');
            py_items_repr(C, b, l->v, l->n, depth);
            buf_putc(&C->A, b, ']');
            return;
        case LK_TUPLE:
            buf_putc(&C->A, b, '(');
            py_items_repr(C, b, l->v, l->n, depth);
            buf_puts(&C->A, b, l->n == 1 ? ",)" : ")");
            return;
        case LK_RANGE:
            if (l->rs == 1) buf_printf(&C->A, b, "range(%" PRId64 ", %" PRId64 ")", l->r0, l->r1);
            else buf_printf(&C->A, b, "range(%" PRId64 ", %" PRId64 ", %" PRId64 ")", l->r0, l->r1, l->rs);
            return;
        case LK_ITEMS: case LK_KEYS: case LK_VALUES:
            buf_puts(&C->A, b, type_name(v));
            buf_puts(&C->A, b, "([");
            py_items_repr(C, b, l->v, l->n, depth);
            buf_puts(&C->A, b, "])");
            return;
        default:
            rerr(C, "printing a generator (the result of a filter such as map or selectattr) is not supported: apply |list first");
        }
    }
    case V_DICT: py_dict_repr(C, b, v.d, depth); return;
    case V_NS:
        buf_puts(&C->A, b, "<Namespace ");
        py_dict_repr(C, b, v.d, depth);
        buf_putc(&C->A, b, '>');
        return;
    case V_LOOP: buf_printf(&C->A, b, "<LoopContext %zu/%zu>", v.lp->i + 1, v.lp->n); return;
    case V_MACRO: buf_printf(&C->A, b, "<Macro '%s'>", v.m->def->s); return;
    default: rerr(C, "printing a %s is not supported", type_name(v));
    }
}

static void py_str(Ctx *C, Buf *b, Value v)
{
    if (v.t == V_UNDEF) return;
    if (v.t == V_STR) { buf_put(&C->A, b, v.s.p, v.s.n); return; }
    py_repr(C, b, v, 0);
}

static Value to_str(Ctx *C, Value v)
{
    if (v.t == V_STR) return v;
    Buf b = { 0 };
    py_str(C, &b, v);
    return v_buf(&b);
}

/* ---- JSON in (jansson) and out (json.dumps) ---- */

static Value from_json(Ctx *C, json_t *j, int depth)
{
    if (depth > JSON_DEPTH_LIMIT) rerr(C, "input JSON nested deeper than %d", JSON_DEPTH_LIMIT);
    switch (json_typeof(j)) {
    case JSON_NULL: return v_none();
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    case JSON_INTEGER: return v_int((int64_t)json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_STRING: return v_str(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        List *l = list_new(C, LK_LIST, n);
        for (size_t i = 0; i < n; i++) l->v[i] = from_json(C, json_array_get(j, i), depth + 1);
        l->n = n;
        return v_list(l);
    }
    default: { /* object: jansson keeps insertion order, as Python's dict does */
        Dict *d = dict_new(C);
        size_t n = json_object_size(j);
        d->k = arena_alloc(&C->A, sizeof(Value) * (n ? n : 1));
        d->v = arena_alloc(&C->A, sizeof(Value) * (n ? n : 1));
        d->cap = n ? n : 1;
        const char *key;
        json_t *val;
        json_object_foreach(j, key, val) {
            d->k[d->n] = v_cstr(key);
            d->v[d->n] = from_json(C, val, depth + 1);
            d->n++;
        }
        return v_dict(d);
    }
    }
}

typedef struct {
    int indent;               /* indentation on (json.dumps indent is not None) */
    Value ind;                /* the indent string */
    Value isep, ksep;         /* item and key separators */
    int sort_keys, ascii;
} JsonOpt;

static void json_str(Ctx *C, Buf *b, const char *s, size_t n, int ascii)
{
    buf_putc(&C->A, b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            i++;
            switch (c) {
            case '"': buf_puts(&C->A, b, "\\\""); break;
            case '\\': buf_puts(&C->A, b, "\\\\"); break;
            case '\n': buf_puts(&C->A, b, "\\n"); break;
            case '\r': buf_puts(&C->A, b, "\\r"); break;
            case '\t': buf_puts(&C->A, b, "\\t"); break;
            case '\b': buf_puts(&C->A, b, "\\b"); break;
            case '\f': buf_puts(&C->A, b, "\\f"); break;
            default:
                if (c < 0x20 || (ascii && c == 0x7F)) buf_printf(&C->A, b, "\\u%04x", c);
                else buf_putc(&C->A, b, (char)c);
            }
            continue;
        }
        uint32_t cp;
        int l = u8_dec((const unsigned char *)s + i, &cp);
        if (!ascii) buf_put(&C->A, b, s + i, (size_t)l);
        else if (cp < 0x10000) buf_printf(&C->A, b, "\\u%04x", cp);
        else {
            cp -= 0x10000;
            buf_printf(&C->A, b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        }
        i += (size_t)l;
    }
    buf_putc(&C->A, b, '"');
}

static void json_newline(Ctx *C, Buf *b, const JsonOpt *o, int level)
{
    buf_putc(&C->A, b, '\n');
    for (int i = 0; i < level; i++) buf_put(&C->A, b, o->ind.s.p, o->ind.s.n);
}

static void json_float(Ctx *C, Buf *b, double f)
{
    char num[40];
    if (isnan(f)) buf_puts(&C->A, b, "NaN");
    else if (isinf(f)) buf_puts(&C->A, b, f < 0 ? "-Infinity" : "Infinity");
    else { py_float_repr(f, num); buf_puts(&C->A, b, num); }
}

static void json_dump(Ctx *C, Buf *b, Value v, const JsonOpt *o, int level)
{
    if (level > JSON_DEPTH_LIMIT) rerr(C, "tojson: value nested too deeply");
    switch (v.t) {
    case V_NONE: buf_puts(&C->A, b, "null"); return;
    case V_BOOL: buf_puts(&C->A, b, v.i ? "true" : "false"); return;
    case V_INT: buf_printf(&C->A, b, "%" PRId64, v.i); return;
    case V_FLOAT: json_float(C, b, v.f); return;
    case V_STR: json_str(C, b, v.s.p, v.s.n, o->ascii); return;
    case V_LIST:
        if (v.l->kind == LK_LIST || v.l->kind == LK_TUPLE) {
            if (!v.l->n) { buf_puts(&C->A, b, "[]"); return; }
            buf_putc(&C->A, b, '[');
            for (size_t i = 0; i < v.l->n; i++) {
                if (i) buf_put(&C->A, b, o->isep.s.p, o->isep.s.n);
                if (o->indent) json_newline(C, b, o, level + 1);
                json_dump(C, b, v.l->v[i], o, level + 1);
            }
            if (o->indent) json_newline(C, b, o, level);
            buf_putc(&C->A, b, ']');
            return;
        }
        break;
    case V_DICT: {
        Dict *d = v.d;
        if (!d->n) { buf_puts(&C->A, b, "{}"); return; }
        size_t *ord = arena_alloc(&C->A, sizeof(size_t) * d->n);
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort_keys) { /* insertion sort is fine for the sizes of template dicts */
            for (size_t i = 0; i < d->n; i++) {
                if (d->k[i].t != V_STR) rerr(C, "tojson(sort_keys=True) with non-string keys is not supported");
                for (size_t j = i; j > 0 && py_cmp(C, d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
            }
        }
        buf_putc(&C->A, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            Value k = d->k[ord[i]];
            if (i) buf_put(&C->A, b, o->isep.s.p, o->isep.s.n);
            if (o->indent) json_newline(C, b, o, level + 1);
            switch (k.t) {
            case V_STR: json_str(C, b, k.s.p, k.s.n, o->ascii); break;
            case V_INT: buf_printf(&C->A, b, "\"%" PRId64 "\"", k.i); break;
            case V_BOOL: buf_puts(&C->A, b, k.i ? "\"true\"" : "\"false\""); break;
            case V_NONE: buf_puts(&C->A, b, "\"null\""); break;
            case V_FLOAT: buf_putc(&C->A, b, '"'); json_float(C, b, k.f); buf_putc(&C->A, b, '"'); break;
            default: rerr(C, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
            }
            buf_put(&C->A, b, o->ksep.s.p, o->ksep.s.n);
            json_dump(C, b, d->v[ord[i]], o, level + 1);
        }
        if (o->indent) json_newline(C, b, o, level);
        buf_putc(&C->A, b, '}');
        return;
    }
    default: break;
    }
    rerr(C, "tojson: object of type %s is not JSON serializable", type_name(v));
}

/* ---- sequences ---- */

typedef struct {
    Value *v;
    size_t n;
} Seq;

/* iter(x) materialized; consumes a one-pass iterator. */
static Seq iterate(Ctx *C, Value x)
{
    Seq s = { NULL, 0 };
    switch (x.t) {
    case V_UNDEF: return s;
    case V_LIST:
        if (x.l->kind == LK_ITER) {
            s.n = x.l->n - x.l->pos;
            s.v = s.n ? x.l->v + x.l->pos : NULL; /* an empty list may have no array: NULL + 0 is undefined in C */
            x.l->pos = x.l->n;
        } else {
            s.v = x.l->v;
            s.n = x.l->n;
        }
        return s;
    case V_DICT: s.v = x.d->k; s.n = x.d->n; return s;
    case V_STR: {
        s.v = arena_alloc(&C->A, sizeof(Value) * (x.s.n ? x.s.n : 1));
        for (size_t i = 0; i < x.s.n;) {
            size_t l = 1;
            while (i + l < x.s.n && ((unsigned char)x.s.p[i + l] & 0xC0) == 0x80) l++;
            s.v[s.n++] = v_str(x.s.p + i, l);
            i += l;
        }
        return s;
    }
    default: rerr(C, "'%s' object is not iterable", type_name(x));
    }
}

static int64_t py_len(Ctx *C, Value v)
{
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: step_bytes(C, v.s.n); return (int64_t)u8_count(v.s.p, v.s.n);
    case V_LIST:
        if (v.l->kind == LK_ITER) rerr(C, "object of type 'generator' has no len()");
        return (int64_t)v.l->n;
    case V_DICT: return (int64_t)v.d->n;
    case V_LOOP: return (int64_t)v.lp->n;
    default: rerr(C, "object of type '%s' has no len()", type_name(v));
    }
}

/* Byte offsets of the code points of s (n+1 entries, last = byte length); NULL if ASCII. */
static size_t *u8_offsets(Ctx *C, Value s, size_t *ncp)
{
    step_bytes(C, s.s.n);
    if (is_ascii(s.s.p, s.s.n)) { *ncp = s.s.n; return NULL; }
    size_t n = u8_count(s.s.p, s.s.n), k = 0;
    size_t *off = arena_alloc(&C->A, sizeof(size_t) * (n + 1));
    for (size_t i = 0; i < s.s.n; i++)
        if (((unsigned char)s.s.p[i] & 0xC0) != 0x80) off[k++] = i;
    off[n] = s.s.n;
    *ncp = n;
    return off;
}

static int py_contains(Ctx *C, Value container, Value item)
{
    switch (container.t) {
    case V_STR:
        if (item.t != V_STR) rerr(C, "'in <string>' requires string as left operand, not %s", type_name(item));
        step_bytes(C, container.s.n);
        return item.s.n == 0 || memmem(container.s.p, container.s.n, item.s.p, item.s.n) != NULL;
    case V_DICT:
        check_hashable(C, item);
        return dict_find(C, container.d, item) != NULL;
    case V_UNDEF: return 0;
    case V_LIST:
        if (container.l->kind == LK_ITER) { /* consumes up to the match, as Python does */
            List *l = container.l;
            while (l->pos < l->n)
                if (py_eq(C, l->v[l->pos++], item)) return 1;
            return 0;
        }
        if (container.l->kind == LK_ITEMS && !(item.t == V_LIST && item.l->kind == LK_TUPLE)) return 0;
        for (size_t i = 0; i < container.l->n; i++)
            if (py_eq(C, container.l->v[i], item)) return 1;
        return 0;
    default: rerr(C, "argument of type '%s' is not iterable", type_name(container));
    }
}

/* ---- attribute and item access (jinja2.sandbox getattr / getitem) ---- */

static Value mk_method(Ctx *C, Value self, int id)
{
    Method *m = arena_alloc(&C->A, sizeof *m);
    m->self = self;
    m->id = id;
    Value v = { .t = V_METHOD };
    v.me = m;
    return v;
}

/* getattr(obj, name) as Python would resolve it for a type's own attributes (methods); *found
   tells whether name is an attribute of the type at all. */
static Value type_attr(Ctx *C, Value obj, const char *name, int *found)
{
    *found = 1;
    int m = name_index(method_names, M__N, name);
    switch (obj.t) {
    case V_STR:
        if (m >= 0 && m <= M_STR_LAST) return mk_method(C, obj, m);
        if (in_list(str_attrs_other, name)) rerr(C, "str.%s is not supported", name);
        break;
    case V_DICT:
        if (m == M_ITEMS || m == M_KEYS || m == M_VALUES || m == M_GET) return mk_method(C, obj, m);
        if (in_list(dict_unsafe, name)) return v_undef(name); /* the sandbox's unsafe undefined */
        if (in_list(dict_other, name)) rerr(C, "dict.%s is not supported", name);
        break;
    case V_LIST:
        if (obj.l->kind == LK_LIST || obj.l->kind == LK_TUPLE) {
            if (m == M_INDEX || m == M_COUNT) return mk_method(C, obj, m);
            if (obj.l->kind == LK_LIST && in_list(list_unsafe, name)) return v_undef(name);
            if (in_list(list_other, name)) rerr(C, "list.%s is not supported", name);
            break;
        }
        rerr(C, "attributes of a %s are not supported", type_name(obj));
    case V_BOOL: case V_INT: case V_FLOAT:
        if (in_list(num_attrs, name)) rerr(C, "%s.%s is not supported", type_name(obj), name);
        break;
    case V_LOOP:
        if (m == M_CYCLE) return mk_method(C, obj, m);
        if (!strcmp(name, "changed")) rerr(C, "loop.changed is not supported");
        break;
    case V_MACRO: case V_FUNC: case V_METHOD:
        rerr(C, "attributes of a %s are not supported", type_name(obj));
    default: break;
    }
    *found = 0;
    return v_undef(name);
}

static Value loop_attr(Ctx *C, Loop *L, const char *name, int *found)
{
    (void)C;
    *found = 1;
    size_t i = L->i, n = L->n;
    if (!strcmp(name, "index")) return v_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return v_int((int64_t)i);
    if (!strcmp(name, "revindex")) return v_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return v_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return v_bool(i == 0);
    if (!strcmp(name, "last")) return v_bool(i + 1 == n);
    if (!strcmp(name, "length")) return v_int((int64_t)n);
    if (!strcmp(name, "depth")) return v_int(1);
    if (!strcmp(name, "depth0")) return v_int(0);
    if (!strcmp(name, "previtem")) return i > 0 ? L->items[i - 1] : v_undef("previtem");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? L->items[i + 1] : v_undef("nextitem");
    *found = 0;
    return v_undef(name);
}

static Value get_attr(Ctx *C, Value obj, const char *name)
{
    int found;
    if (obj.t == V_UNDEF) rerr(C, "'%s' is undefined", obj.s.p ? obj.s.p : "value");
    if (obj.t == V_NS) {
        Value *p = dict_find_str(obj.d, name);
        return p ? *p : v_undef(name);
    }
    if (obj.t == V_LOOP) {
        Value v = loop_attr(C, obj.lp, name, &found);
        if (found) return v;
    }
    Value v = type_attr(C, obj, name, &found);
    if (found) return v;
    if (obj.t == V_DICT) {
        Value *p = dict_find_str(obj.d, name);
        if (p) return *p;
    }
    return v_undef(name);
}

static int as_index(Value v, int64_t *i)
{
    if (v.t == V_INT || v.t == V_BOOL) { *i = v.i; return 1; }
    return 0;
}

static Value str_char(Ctx *C, Value s, int64_t i)
{
    size_t ncp;
    size_t *off = u8_offsets(C, s, &ncp);
    if (i < 0) i += (int64_t)ncp;
    if (i < 0 || (size_t)i >= ncp) return v_undef("index");
    if (!off) return v_str(s.s.p + i, 1);
    return v_str(s.s.p + off[i], off[i + 1] - off[i]);
}

static Value get_item(Ctx *C, Value obj, Value key)
{
    int64_t i;
    switch (obj.t) {
    case V_UNDEF: rerr(C, "'%s' is undefined", obj.s.p ? obj.s.p : "value");
    case V_DICT: {
        if (!((key.t == V_LIST && key.l->kind == LK_LIST) || key.t == V_DICT)) {
            Value *p = dict_find(C, obj.d, key);
            if (p) return *p;
        }
        break;
    }
    case V_LIST:
        if (obj.l->kind == LK_LIST || obj.l->kind == LK_TUPLE || obj.l->kind == LK_RANGE) {
            if (as_index(key, &i)) {
                if (i < 0) i += (int64_t)obj.l->n;
                if (i < 0 || (size_t)i >= obj.l->n) return v_undef("index");
                return obj.l->v[i];
            }
        }
        break;
    case V_STR:
        if (as_index(key, &i)) return str_char(C, obj, i);
        break;
    default: break;
    }
    if (key.t == V_STR) { /* obj[name] failed: Jinja falls back to getattr(obj, name) */
        if (obj.t == V_DICT) {
            int found;
            Value v = type_attr(C, obj, arena_strndup(&C->A, key.s.p, key.s.n), &found);
            return v;
        }
        return get_attr(C, obj, arena_strndup(&C->A, key.s.p, key.s.n));
    }
    return v_undef("item");
}

/* Python slice indices (PySlice_AdjustIndices) */
static size_t slice_indices(Ctx *C, Value *parts, size_t len, int64_t *start, int64_t *stop, int64_t *stepp)
{
    int64_t step = 1, n = (int64_t)len;
    for (int k = 0; k < 3; k++)
        if (parts[k].t != V_NONE && parts[k].t != V_INT && parts[k].t != V_BOOL)
            rerr(C, "slice indices must be integers or None, not %s", type_name(parts[k]));
    if (parts[2].t != V_NONE) {
        step = parts[2].i;
        if (step == 0) rerr(C, "slice step cannot be zero");
    }
    int64_t lo, hi;
    if (parts[0].t == V_NONE) lo = step < 0 ? n - 1 : 0;
    else {
        lo = parts[0].i;
        if (lo < 0) { lo += n; if (lo < 0) lo = step < 0 ? -1 : 0; }
        else if (lo >= n) lo = step < 0 ? n - 1 : n;
    }
    if (parts[1].t == V_NONE) hi = step < 0 ? -1 : n;
    else {
        hi = parts[1].i;
        if (hi < 0) { hi += n; if (hi < 0) hi = step < 0 ? -1 : 0; }
        else if (hi >= n) hi = step < 0 ? n - 1 : n;
    }
    *start = lo;
    *stop = hi;
    *stepp = step;
    if (step < 0) return hi < lo ? (size_t)((lo - hi - 1) / (-step) + 1) : 0;
    return lo < hi ? (size_t)((hi - lo - 1) / step + 1) : 0;
}

/* obj[a:b:c]: Jinja compiles slices to plain Python subscription (not environment.getitem), so
   what cannot be sliced is an error rather than Undefined. */
static Value get_slice(Ctx *C, Value obj, Value *parts)
{
    int64_t start, stop, stp;
    if (obj.t == V_UNDEF) rerr(C, "'%s' is undefined", obj.s.p ? obj.s.p : "value");
    if (obj.t == V_STR) {
        size_t ncp;
        size_t *off = u8_offsets(C, obj, &ncp);
        size_t cnt = slice_indices(C, parts, ncp, &start, &stop, &stp);
        if (stp == 1) {
            size_t a = off ? off[start] : (size_t)start, b = off ? off[start + (int64_t)cnt] : (size_t)(start + (int64_t)cnt);
            return cnt ? v_str(obj.s.p + a, b - a) : v_str("", 0);
        }
        Buf b = { 0 };
        for (size_t k = 0; k < cnt; k++) {
            int64_t i = start + (int64_t)k * stp;
            if (off) buf_put(&C->A, &b, obj.s.p + off[i], off[i + 1] - off[i]);
            else buf_putc(&C->A, &b, obj.s.p[i]);
        }
        return v_buf(&b);
    }
    if (obj.t == V_LIST && (obj.l->kind == LK_LIST || obj.l->kind == LK_TUPLE)) {
        size_t cnt = slice_indices(C, parts, obj.l->n, &start, &stop, &stp);
        List *l = list_new(C, obj.l->kind, cnt);
        for (size_t k = 0; k < cnt; k++) l->v[k] = obj.l->v[start + (int64_t)k * stp];
        l->n = cnt;
        return v_list(l);
    }
    if (obj.t == V_LIST && obj.l->kind == LK_RANGE) rerr(C, "slicing a range is not supported");
    if (obj.t == V_DICT) rerr(C, "unhashable type: 'slice'");
    rerr(C, "'%s' object is not subscriptable", type_name(obj));
}

/* ---- arithmetic (Python semantics; int64 overflow is an error, not a big integer) ---- */

static Value py_add(Ctx *C, Value a, Value b)
{
    if ((a.t == V_INT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_BOOL)) {
        int64_t r;
        if (__builtin_add_overflow(a.i, b.i, &r)) rerr(C, "integer overflow");
        return v_int(r);
    }
    if (is_num(a) && is_num(b)) return v_float(num_f(a) + num_f(b));
    if (a.t == V_STR && b.t == V_STR) {
        char *p = arena_alloc(&C->A, a.s.n + b.s.n + 1);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        return v_str(p, a.s.n + b.s.n);
    }
    if (a.t == V_LIST && b.t == V_LIST && a.l->kind == b.l->kind && (a.l->kind == LK_LIST || a.l->kind == LK_TUPLE)) {
        List *l = list_new(C, a.l->kind, a.l->n + b.l->n);
        if (a.l->n) memcpy(l->v, a.l->v, sizeof(Value) * a.l->n);
        if (b.l->n) memcpy(l->v + a.l->n, b.l->v, sizeof(Value) * b.l->n);
        l->n = a.l->n + b.l->n;
        return v_list(l);
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) {
        Value u = a.t == V_UNDEF ? a : b;
        rerr(C, "'%s' is undefined", u.s.p ? u.s.p : "value");
    }
    if (a.t == V_STR) rerr(C, "can only concatenate str (not \"%s\") to str", type_name(b));
    if (a.t == V_LIST && a.l->kind == LK_LIST) rerr(C, "can only concatenate list (not \"%s\") to list", type_name(b));
    rerr(C, "unsupported operand type(s) for +: '%s' and '%s'", type_name(a), type_name(b));
}

static Value py_repeat(Ctx *C, Value s, int64_t k)
{
    size_t unit = s.t == V_STR ? s.s.n : s.l->n * sizeof(Value);
    if (k < 0 || !unit) k = 0; /* '' * 10**18 is '' at once, not 10**18 empty copies */
    if (unit && (uint64_t)k > (RENDER_MEM_LIMIT / unit)) rerr(C, "repetition result too large");
    if (s.t == V_STR) {
        size_t n = s.s.n * (size_t)k;
        char *p = arena_alloc(&C->A, n + 1);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.s.n, s.s.p, s.s.n);
        return v_str(p, n);
    }
    List *l = list_new(C, s.l->kind, s.l->n * (size_t)k);
    for (int64_t i = 0; i < k; i++) {
        if (s.l->n) memcpy(l->v + (size_t)i * s.l->n, s.l->v, sizeof(Value) * s.l->n);
    }
    l->n = s.l->n * (size_t)k;
    return v_list(l);
}

/* Python's float floor division and modulo (Objects/floatobject.c float_divmod). */
static void float_divmod(double vx, double wx, double *floordiv, double *mod)
{
    double m = fmod(vx, wx), div = (vx - m) / wx;
    if (m) {
        if ((wx < 0) != (m < 0)) { m += wx; div -= 1.0; }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static Value py_binop(Ctx *C, int op, Value a, Value b)
{
    if (op == OP_ADD) return py_add(C, a, b);
    int ints = (a.t == V_INT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_BOOL);
    if (op == OP_MUL) {
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(a.i, b.i, &r)) rerr(C, "integer overflow");
            return v_int(r);
        }
        if (is_num(a) && is_num(b)) return v_float(num_f(a) * num_f(b));
        if ((a.t == V_STR || (a.t == V_LIST && (a.l->kind == LK_LIST || a.l->kind == LK_TUPLE))) && (b.t == V_INT || b.t == V_BOOL))
            return py_repeat(C, a, b.i);
        if ((b.t == V_STR || (b.t == V_LIST && (b.l->kind == LK_LIST || b.l->kind == LK_TUPLE))) && (a.t == V_INT || a.t == V_BOOL))
            return py_repeat(C, b, a.i);
    } else if (is_num(a) && is_num(b)) {
        switch (op) {
        case OP_SUB:
            if (ints) {
                int64_t r;
                if (__builtin_sub_overflow(a.i, b.i, &r)) rerr(C, "integer overflow");
                return v_int(r);
            }
            return v_float(num_f(a) - num_f(b));
        case OP_DIV:
            if (num_f(b) == 0) rerr(C, "division by zero");
            return v_float(num_f(a) / num_f(b));
        case OP_FLOORDIV: case OP_MOD:
            if (ints) {
                if (b.i == 0) rerr(C, "integer division or modulo by zero");
                if (a.i == INT64_MIN && b.i == -1) rerr(C, "integer overflow");
                int64_t q = a.i / b.i, r = a.i % b.i;
                if (r && ((r < 0) != (b.i < 0))) { q--; r += b.i; }
                return v_int(op == OP_MOD ? r : q);
            } else {
                if (num_f(b) == 0) rerr(C, "float division by zero");
                double fd, m;
                float_divmod(num_f(a), num_f(b), &fd, &m);
                return v_float(op == OP_MOD ? m : fd);
            }
        case OP_POW:
            if (ints && b.i >= 0) {
                int64_t r = 1, base = a.i, e = b.i;
                while (e) {
                    if (e & 1 && __builtin_mul_overflow(r, base, &r)) rerr(C, "integer overflow");
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) rerr(C, "integer overflow");
                }
                return v_int(r);
            } else {
                double x = num_f(a), y = num_f(b);
                if (x == 0 && y < 0) rerr(C, "0.0 cannot be raised to a negative power");
                if (x < 0 && y != floor(y)) rerr(C, "a negative number to a fractional power is complex");
                double r = pow(x, y);
                if (isinf(r) && isfinite(x) && isfinite(y)) rerr(C, "numerical result out of range");
                return v_float(r);
            }
        default: break;
        }
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) {
        Value u = a.t == V_UNDEF ? a : b;
        rerr(C, "'%s' is undefined", u.s.p ? u.s.p : "value");
    }
    if (op == OP_MOD && a.t == V_STR) rerr(C, "printf-style string formatting ('%%') is not supported");
    static const char *const sym[] = { [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/", [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**" };
    rerr(C, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op] ? sym[op] : "?", type_name(a), type_name(b));
}

static int py_compare_op(Ctx *C, int op, Value a, Value b)
{
    switch (op) {
    case OP_EQ: return py_eq(C, a, b);
    case OP_NE: return !py_eq(C, a, b);
    case OP_LT: return py_cmp(C, a, b) < 0;
    case OP_LTEQ: return py_cmp(C, a, b) <= 0;
    case OP_GT: return py_cmp(C, a, b) > 0;
    case OP_GTEQ: return py_cmp(C, a, b) >= 0;
    case OP_IN: return py_contains(C, b, a);
    default: return !py_contains(C, b, a);
    }
}

/* ---- strings ---- */

static void need_str(Ctx *C, Value v, const char *what)
{
    if (v.t != V_STR) rerr(C, "%s must be str, not %s", what, type_name(v));
}

/* ---- Unicode case (Python's str.lower/upper/title/capitalize/islower/isupper/isalpha...) ----
 * utf8proc gives the simple mappings and general categories (its simple mappings agree with
 * Python 3.11's for every code point); what Python adds on top is here: the full mappings that
 * expand to several characters (SpecialCasing.txt, generated from Python 3.11), Other_Lowercase
 * / Other_Uppercase, the digits outside Nd, and the Final_Sigma rule of str.lower(). */

static const struct { uint32_t cp, lower[3], upper[3], title[3]; } special_case[] = {
    { 0x00DF, {0xDF}, {0x53, 0x53}, {0x53, 0x73} },
    { 0x0130, {0x69, 0x307}, {0x130}, {0x130} },
    { 0x0149, {0x149}, {0x2BC, 0x4E}, {0x2BC, 0x4E} },
    { 0x01F0, {0x1F0}, {0x4A, 0x30C}, {0x4A, 0x30C} },
    { 0x0390, {0x390}, {0x399, 0x308, 0x301}, {0x399, 0x308, 0x301} },
    { 0x03B0, {0x3B0}, {0x3A5, 0x308, 0x301}, {0x3A5, 0x308, 0x301} },
    { 0x0587, {0x587}, {0x535, 0x552}, {0x535, 0x582} },
    { 0x1E96, {0x1E96}, {0x48, 0x331}, {0x48, 0x331} },
    { 0x1E97, {0x1E97}, {0x54, 0x308}, {0x54, 0x308} },
    { 0x1E98, {0x1E98}, {0x57, 0x30A}, {0x57, 0x30A} },
    { 0x1E99, {0x1E99}, {0x59, 0x30A}, {0x59, 0x30A} },
    { 0x1E9A, {0x1E9A}, {0x41, 0x2BE}, {0x41, 0x2BE} },
    { 0x1F50, {0x1F50}, {0x3A5, 0x313}, {0x3A5, 0x313} },
    { 0x1F52, {0x1F52}, {0x3A5, 0x313, 0x300}, {0x3A5, 0x313, 0x300} },
    { 0x1F54, {0x1F54}, {0x3A5, 0x313, 0x301}, {0x3A5, 0x313, 0x301} },
    { 0x1F56, {0x1F56}, {0x3A5, 0x313, 0x342}, {0x3A5, 0x313, 0x342} },
    { 0x1F80, {0x1F80}, {0x1F08, 0x399}, {0x1F88} },
    { 0x1F81, {0x1F81}, {0x1F09, 0x399}, {0x1F89} },
    { 0x1F82, {0x1F82}, {0x1F0A, 0x399}, {0x1F8A} },
    { 0x1F83, {0x1F83}, {0x1F0B, 0x399}, {0x1F8B} },
    { 0x1F84, {0x1F84}, {0x1F0C, 0x399}, {0x1F8C} },
    { 0x1F85, {0x1F85}, {0x1F0D, 0x399}, {0x1F8D} },
    { 0x1F86, {0x1F86}, {0x1F0E, 0x399}, {0x1F8E} },
    { 0x1F87, {0x1F87}, {0x1F0F, 0x399}, {0x1F8F} },
    { 0x1F88, {0x1F80}, {0x1F08, 0x399}, {0x1F88} },
    { 0x1F89, {0x1F81}, {0x1F09, 0x399}, {0x1F89} },
    { 0x1F8A, {0x1F82}, {0x1F0A, 0x399}, {0x1F8A} },
    { 0x1F8B, {0x1F83}, {0x1F0B, 0x399}, {0x1F8B} },
    { 0x1F8C, {0x1F84}, {0x1F0C, 0x399}, {0x1F8C} },
    { 0x1F8D, {0x1F85}, {0x1F0D, 0x399}, {0x1F8D} },
    { 0x1F8E, {0x1F86}, {0x1F0E, 0x399}, {0x1F8E} },
    { 0x1F8F, {0x1F87}, {0x1F0F, 0x399}, {0x1F8F} },
    { 0x1F90, {0x1F90}, {0x1F28, 0x399}, {0x1F98} },
    { 0x1F91, {0x1F91}, {0x1F29, 0x399}, {0x1F99} },
    { 0x1F92, {0x1F92}, {0x1F2A, 0x399}, {0x1F9A} },
    { 0x1F93, {0x1F93}, {0x1F2B, 0x399}, {0x1F9B} },
    { 0x1F94, {0x1F94}, {0x1F2C, 0x399}, {0x1F9C} },
    { 0x1F95, {0x1F95}, {0x1F2D, 0x399}, {0x1F9D} },
    { 0x1F96, {0x1F96}, {0x1F2E, 0x399}, {0x1F9E} },
    { 0x1F97, {0x1F97}, {0x1F2F, 0x399}, {0x1F9F} },
    { 0x1F98, {0x1F90}, {0x1F28, 0x399}, {0x1F98} },
    { 0x1F99, {0x1F91}, {0x1F29, 0x399}, {0x1F99} },
    { 0x1F9A, {0x1F92}, {0x1F2A, 0x399}, {0x1F9A} },
    { 0x1F9B, {0x1F93}, {0x1F2B, 0x399}, {0x1F9B} },
    { 0x1F9C, {0x1F94}, {0x1F2C, 0x399}, {0x1F9C} },
    { 0x1F9D, {0x1F95}, {0x1F2D, 0x399}, {0x1F9D} },
    { 0x1F9E, {0x1F96}, {0x1F2E, 0x399}, {0x1F9E} },
    { 0x1F9F, {0x1F97}, {0x1F2F, 0x399}, {0x1F9F} },
    { 0x1FA0, {0x1FA0}, {0x1F68, 0x399}, {0x1FA8} },
    { 0x1FA1, {0x1FA1}, {0x1F69, 0x399}, {0x1FA9} },
    { 0x1FA2, {0x1FA2}, {0x1F6A, 0x399}, {0x1FAA} },
    { 0x1FA3, {0x1FA3}, {0x1F6B, 0x399}, {0x1FAB} },
    { 0x1FA4, {0x1FA4}, {0x1F6C, 0x399}, {0x1FAC} },
    { 0x1FA5, {0x1FA5}, {0x1F6D, 0x399}, {0x1FAD} },
    { 0x1FA6, {0x1FA6}, {0x1F6E, 0x399}, {0x1FAE} },
    { 0x1FA7, {0x1FA7}, {0x1F6F, 0x399}, {0x1FAF} },
    { 0x1FA8, {0x1FA0}, {0x1F68, 0x399}, {0x1FA8} },
    { 0x1FA9, {0x1FA1}, {0x1F69, 0x399}, {0x1FA9} },
    { 0x1FAA, {0x1FA2}, {0x1F6A, 0x399}, {0x1FAA} },
    { 0x1FAB, {0x1FA3}, {0x1F6B, 0x399}, {0x1FAB} },
    { 0x1FAC, {0x1FA4}, {0x1F6C, 0x399}, {0x1FAC} },
    { 0x1FAD, {0x1FA5}, {0x1F6D, 0x399}, {0x1FAD} },
    { 0x1FAE, {0x1FA6}, {0x1F6E, 0x399}, {0x1FAE} },
    { 0x1FAF, {0x1FA7}, {0x1F6F, 0x399}, {0x1FAF} },
    { 0x1FB2, {0x1FB2}, {0x1FBA, 0x399}, {0x1FBA, 0x345} },
    { 0x1FB3, {0x1FB3}, {0x391, 0x399}, {0x1FBC} },
    { 0x1FB4, {0x1FB4}, {0x386, 0x399}, {0x386, 0x345} },
    { 0x1FB6, {0x1FB6}, {0x391, 0x342}, {0x391, 0x342} },
    { 0x1FB7, {0x1FB7}, {0x391, 0x342, 0x399}, {0x391, 0x342, 0x345} },
    { 0x1FBC, {0x1FB3}, {0x391, 0x399}, {0x1FBC} },
    { 0x1FC2, {0x1FC2}, {0x1FCA, 0x399}, {0x1FCA, 0x345} },
    { 0x1FC3, {0x1FC3}, {0x397, 0x399}, {0x1FCC} },
    { 0x1FC4, {0x1FC4}, {0x389, 0x399}, {0x389, 0x345} },
    { 0x1FC6, {0x1FC6}, {0x397, 0x342}, {0x397, 0x342} },
    { 0x1FC7, {0x1FC7}, {0x397, 0x342, 0x399}, {0x397, 0x342, 0x345} },
    { 0x1FCC, {0x1FC3}, {0x397, 0x399}, {0x1FCC} },
    { 0x1FD2, {0x1FD2}, {0x399, 0x308, 0x300}, {0x399, 0x308, 0x300} },
    { 0x1FD3, {0x1FD3}, {0x399, 0x308, 0x301}, {0x399, 0x308, 0x301} },
    { 0x1FD6, {0x1FD6}, {0x399, 0x342}, {0x399, 0x342} },
    { 0x1FD7, {0x1FD7}, {0x399, 0x308, 0x342}, {0x399, 0x308, 0x342} },
    { 0x1FE2, {0x1FE2}, {0x3A5, 0x308, 0x300}, {0x3A5, 0x308, 0x300} },
    { 0x1FE3, {0x1FE3}, {0x3A5, 0x308, 0x301}, {0x3A5, 0x308, 0x301} },
    { 0x1FE4, {0x1FE4}, {0x3A1, 0x313}, {0x3A1, 0x313} },
    { 0x1FE6, {0x1FE6}, {0x3A5, 0x342}, {0x3A5, 0x342} },
    { 0x1FE7, {0x1FE7}, {0x3A5, 0x308, 0x342}, {0x3A5, 0x308, 0x342} },
    { 0x1FF2, {0x1FF2}, {0x1FFA, 0x399}, {0x1FFA, 0x345} },
    { 0x1FF3, {0x1FF3}, {0x3A9, 0x399}, {0x1FFC} },
    { 0x1FF4, {0x1FF4}, {0x38F, 0x399}, {0x38F, 0x345} },
    { 0x1FF6, {0x1FF6}, {0x3A9, 0x342}, {0x3A9, 0x342} },
    { 0x1FF7, {0x1FF7}, {0x3A9, 0x342, 0x399}, {0x3A9, 0x342, 0x345} },
    { 0x1FFC, {0x1FF3}, {0x3A9, 0x399}, {0x1FFC} },
    { 0xFB00, {0xFB00}, {0x46, 0x46}, {0x46, 0x66} },
    { 0xFB01, {0xFB01}, {0x46, 0x49}, {0x46, 0x69} },
    { 0xFB02, {0xFB02}, {0x46, 0x4C}, {0x46, 0x6C} },
    { 0xFB03, {0xFB03}, {0x46, 0x46, 0x49}, {0x46, 0x66, 0x69} },
    { 0xFB04, {0xFB04}, {0x46, 0x46, 0x4C}, {0x46, 0x66, 0x6C} },
    { 0xFB05, {0xFB05}, {0x53, 0x54}, {0x53, 0x74} },
    { 0xFB06, {0xFB06}, {0x53, 0x54}, {0x53, 0x74} },
    { 0xFB13, {0xFB13}, {0x544, 0x546}, {0x544, 0x576} },
    { 0xFB14, {0xFB14}, {0x544, 0x535}, {0x544, 0x565} },
    { 0xFB15, {0xFB15}, {0x544, 0x53B}, {0x544, 0x56B} },
    { 0xFB16, {0xFB16}, {0x54E, 0x546}, {0x54E, 0x576} },
    { 0xFB17, {0xFB17}, {0x544, 0x53D}, {0x544, 0x56D} },
};
static const uint32_t other_lower[][2] = {
    { 0xAA, 0xAA }, { 0xBA, 0xBA }, { 0x2B0, 0x2B8 }, { 0x2C0, 0x2C1 }, { 0x2E0, 0x2E4 }, { 0x345, 0x345 },
    { 0x37A, 0x37A }, { 0x1D2C, 0x1D6A }, { 0x1D78, 0x1D78 }, { 0x1D9B, 0x1DBF }, { 0x2071, 0x2071 },
    { 0x207F, 0x207F }, { 0x2090, 0x209C }, { 0x2170, 0x217F }, { 0x24D0, 0x24E9 }, { 0x2C7C, 0x2C7D },
    { 0xA69C, 0xA69D }, { 0xA770, 0xA770 }, { 0xA7F8, 0xA7F9 }, { 0xAB5C, 0xAB5F }, { 0x10780, 0x10780 },
    { 0x10783, 0x10785 }, { 0x10787, 0x107B0 }, { 0x107B2, 0x107BA },
};
static const uint32_t other_upper[][2] = {
    { 0x2160, 0x216F }, { 0x24B6, 0x24CF }, { 0x1F130, 0x1F149 }, { 0x1F150, 0x1F169 }, { 0x1F170, 0x1F189 },
};
static const uint32_t digit_other[][2] = { /* str.isdigit() beyond Nd */
    { 0xB2, 0xB3 }, { 0xB9, 0xB9 }, { 0x1369, 0x1371 }, { 0x19DA, 0x19DA }, { 0x2070, 0x2070 }, { 0x2074, 0x2079 },
    { 0x2080, 0x2089 }, { 0x2460, 0x2468 }, { 0x2474, 0x247C }, { 0x2488, 0x2490 }, { 0x24EA, 0x24EA },
    { 0x24F5, 0x24FD }, { 0x24FF, 0x24FF }, { 0x2776, 0x277E }, { 0x2780, 0x2788 }, { 0x278A, 0x2792 },
    { 0x10A40, 0x10A43 }, { 0x10E60, 0x10E68 }, { 0x11052, 0x1105A }, { 0x1F100, 0x1F10A },
};
#define NRANGES(t) (sizeof(t) / sizeof((t)[0]))

static int in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i][0] && c <= r[i][1]) return 1;
    return 0;
}

static int uc_cat(uint32_t c) { return (int)utf8proc_category((utf8proc_int32_t)c); }
static int uc_is_lower(uint32_t c) { return uc_cat(c) == UTF8PROC_CATEGORY_LL || in_ranges(c, other_lower, NRANGES(other_lower)); }
static int uc_is_upper(uint32_t c) { return uc_cat(c) == UTF8PROC_CATEGORY_LU || in_ranges(c, other_upper, NRANGES(other_upper)); }
static int uc_is_title(uint32_t c) { return uc_cat(c) == UTF8PROC_CATEGORY_LT; }
static int uc_is_cased(uint32_t c) { return uc_is_lower(c) || uc_is_upper(c) || uc_is_title(c); }
static int uc_is_alpha(uint32_t c) { int k = uc_cat(c); return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO; }
static int uc_is_num(uint32_t c) { int k = uc_cat(c); return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO; }
static int uc_is_digit(uint32_t c) { return uc_cat(c) == UTF8PROC_CATEGORY_ND || in_ranges(c, digit_other, NRANGES(digit_other)); }

/* Case_Ignorable: Mn, Me, Cf, Lm, Sk and the Word_Break MidLetter / MidNumLet / Single_Quote characters */
static int uc_is_case_ignorable(uint32_t c)
{
    static const uint32_t wb[] = { 0x27, 0x2E, 0x3A, 0xB7, 0x387, 0x55F, 0x5F4, 0x2018, 0x2019, 0x2024, 0x2027,
                                   0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A };
    int k = uc_cat(c);
    if (k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
        k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK) return 1;
    for (size_t i = 0; i < sizeof wb / sizeof wb[0]; i++)
        if (wb[i] == c) return 1;
    return 0;
}

enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE, CASE_JINJA_TITLE };

/* The full mapping of one code point (mode CASE_LOWER / UPPER / TITLE); returns its length. */
static int uc_map(uint32_t c, int mode, uint32_t out[3])
{
    size_t lo = 0, hi = sizeof special_case / sizeof special_case[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (special_case[mid].cp < c) lo = mid + 1;
        else hi = mid;
    }
    if (lo < sizeof special_case / sizeof special_case[0] && special_case[lo].cp == c) {
        const uint32_t *m = mode == CASE_LOWER ? special_case[lo].lower : mode == CASE_UPPER ? special_case[lo].upper : special_case[lo].title;
        int n = 0;
        while (n < 3 && m[n]) { out[n] = m[n]; n++; }
        return n;
    }
    utf8proc_int32_t x = (utf8proc_int32_t)c;
    out[0] = (uint32_t)(mode == CASE_LOWER ? utf8proc_tolower(x) : mode == CASE_UPPER ? utf8proc_toupper(x) : utf8proc_totitle(x));
    return 1;
}

/* str.lower() of cps[i] within the string cps[lo, hi): Final_Sigma for U+03A3 (Objects/unicodeobject.c
   handle_capital_sigma) */
static int uc_lower_at(const uint32_t *cps, size_t lo, size_t hi, size_t i, uint32_t out[3])
{
    if (cps[i] != 0x3A3) return uc_map(cps[i], CASE_LOWER, out);
    size_t j = i;
    while (j > lo && uc_is_case_ignorable(cps[j - 1])) j--;
    int final = j > lo && uc_is_cased(cps[j - 1]);
    if (final && i + 1 < hi) {
        j = i + 1;
        while (j < hi && uc_is_case_ignorable(cps[j])) j++;
        final = j == hi || !uc_is_cased(cps[j]);
    }
    out[0] = final ? 0x3C2 : 0x3C3;
    return 1;
}

static void buf_put_cps(Ctx *C, Buf *b, const uint32_t *cps, int n)
{
    char u[4];
    for (int i = 0; i < n; i++) buf_put(&C->A, b, u, (size_t)u8_enc(cps[i], u));
}

/* Code points of a valid UTF-8 string (arena). */
static uint32_t *u8_decode_all(Ctx *C, Value s, size_t *n)
{
    uint32_t *cps = arena_alloc(&C->A, sizeof(uint32_t) * (s.s.n ? s.s.n : 1));
    size_t k = 0;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t c;
        i += (size_t)u8_dec((const unsigned char *)s.s.p + i, &c);
        cps[k++] = c;
    }
    *n = k;
    return cps;
}

static int jinja_title_sep(uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space_cp(c); }

static Value str_case(Ctx *C, Value s, int mode)
{
    size_t n;
    uint32_t *cps = u8_decode_all(C, s, &n), m[3];
    Buf b = { 0 };
    buf_reserve(&C->A, &b, s.s.n + 8);
    int prev_cased = 0;
    for (size_t i = 0; i < n; i++) {
        int k;
        switch (mode) {
        case CASE_LOWER: k = uc_lower_at(cps, 0, n, i, m); break;
        case CASE_UPPER: k = uc_map(cps[i], CASE_UPPER, m); break;
        case CASE_TITLE: /* a cased character after an uncased one starts a word */
            k = prev_cased ? uc_lower_at(cps, 0, n, i, m) : uc_map(cps[i], CASE_TITLE, m);
            prev_cased = uc_is_cased(cps[i]);
            break;
        case CASE_CAPITALIZE: k = i == 0 ? uc_map(cps[i], CASE_TITLE, m) : uc_lower_at(cps, 0, n, i, m); break;
        default: { /* Jinja's title filter: items split on runs of [-\s({\[<]; item[0].upper() + item[1:].lower() */
            size_t e = i + 1;
            int sep = jinja_title_sep(cps[i]);
            while (e < n && jinja_title_sep(cps[e]) == sep) e++;
            buf_put_cps(C, &b, m, uc_map(cps[i], CASE_UPPER, m));
            for (size_t j = i + 1; j < e; j++) buf_put_cps(C, &b, m, uc_lower_at(cps, i + 1, e, j, m));
            i = e - 1;
            continue;
        }
        }
        buf_put_cps(C, &b, m, k);
    }
    return v_buf(&b);
}

/* The set of code points in chars (strip(chars)). */
static int in_chars(Value chars, const char *p, int l)
{
    for (size_t i = 0; i < chars.s.n;) {
        int cl = 1;
        while (i + (size_t)cl < chars.s.n && ((unsigned char)chars.s.p[i + (size_t)cl] & 0xC0) == 0x80) cl++;
        if (cl == l && !memcmp(chars.s.p + i, p, (size_t)l)) return 1;
        i += (size_t)cl;
    }
    return 0;
}

static int cp_len_at(const char *p) { unsigned c = (unsigned char)*p; return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* The last occurrence of sub (m bytes, m > 0) in s (n bytes), or NULL. Candidates come from
   memrchr on sub's first byte and are compared in full, so a run of one byte costs n * m: each
   comparison is charged. */
static const char *str_rsearch(Ctx *C, const char *s, size_t n, const char *sub, size_t m)
{
    if (m > n) return NULL;
    for (size_t lim = n - m + 1; lim;) { /* candidates start before s + lim */
        const char *r = memrchr(s, sub[0], lim);
        step_bytes(C, (size_t)(s + lim - (r ? r : s)) + (r ? m : 0));
        if (!r) return NULL;
        if (!memcmp(r, sub, m)) return r;
        lim = (size_t)(r - s);
    }
    return NULL;
}

static Value str_strip(Ctx *C, Value s, Value chars, int left, int right)
{
    if (chars.t != V_ABSENT && chars.t != V_NONE && chars.t != V_STR)
        rerr(C, "strip arg must be None or str, not %s", type_name(chars));
    int ws = chars.t != V_STR;
    size_t per = ws ? 1 : chars.s.n; /* bytes read to test one character */
    const char *b = s.s.p, *e = s.s.p + s.s.n;
    if (left)
        while (b < e) {
            int l = cp_len_at(b);
            step_bytes(C, per);
            if (ws ? !py_space_at(b, e) : !in_chars(chars, b, l)) break;
            b += l;
        }
    if (right)
        while (e > b) {
            const char *q = e - 1;
            while (q > b && ((unsigned char)*q & 0xC0) == 0x80) q--;
            step_bytes(C, per);
            if (ws ? !py_space_at(q, e) : !in_chars(chars, q, (int)(e - q))) break;
            e = q;
        }
    return v_str(b, (size_t)(e - b));
}

static Value str_split(Ctx *C, Value s, Value sep, Value maxv, int from_right)
{
    int64_t maxsplit = -1;
    if (maxv.t != V_ABSENT) {
        if (maxv.t != V_INT && maxv.t != V_BOOL) rerr(C, "maxsplit must be an integer");
        maxsplit = maxv.i;
    }
    if (maxsplit < 0) maxsplit = INT64_MAX;
    step_bytes(C, s.s.n);
    List *l = list_new(C, LK_LIST, 0);
    const char *p = s.s.p, *e = s.s.p + s.s.n;
    if (sep.t == V_ABSENT || sep.t == V_NONE) { /* runs of whitespace; no empty strings */
        if (!from_right) {
            for (;;) {
                while (p < e && py_space_at(p, e)) p += py_space_at(p, e);
                if (p >= e) break;
                if (maxsplit-- == 0) { list_push(C, l, v_str(p, (size_t)(e - p))); break; }
                const char *q = p;
                while (q < e && !py_space_at(q, e)) q += cp_len_at(q);
                list_push(C, l, v_str(p, (size_t)(q - p)));
                p = q;
            }
        } else {
            const char *b = p;
            for (;;) {
                while (e > b) { /* trailing whitespace */
                    const char *q = e - 1;
                    while (q > b && ((unsigned char)*q & 0xC0) == 0x80) q--;
                    if (!py_space_at(q, e)) break;
                    e = q;
                }
                if (e <= b) break;
                if (maxsplit-- == 0) { list_push(C, l, v_str(b, (size_t)(e - b))); break; }
                const char *q = e;
                while (q > b) {
                    const char *r = q - 1;
                    while (r > b && ((unsigned char)*r & 0xC0) == 0x80) r--;
                    if (py_space_at(r, e)) break;
                    q = r;
                }
                list_push(C, l, v_str(q, (size_t)(e - q)));
                e = q;
            }
            for (size_t i = 0; i < l->n / 2; i++) {
                Value t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
        return v_list(l);
    }
    need_str(C, sep, "separator");
    if (!sep.s.n) rerr(C, "empty separator");
    if (!from_right) {
        for (;;) {
            const char *q = maxsplit-- == 0 ? NULL : memmem(p, (size_t)(e - p), sep.s.p, sep.s.n);
            if (!q) { list_push(C, l, v_str(p, (size_t)(e - p))); break; }
            list_push(C, l, v_str(p, (size_t)(q - p)));
            p = q + sep.s.n;
        }
    } else {
        const char *b = p;
        for (;;) {
            const char *q = maxsplit-- == 0 ? NULL : str_rsearch(C, b, (size_t)(e - b), sep.s.p, sep.s.n);
            if (!q) { list_push(C, l, v_str(b, (size_t)(e - b))); break; }
            list_push(C, l, v_str(q + sep.s.n, (size_t)(e - q - sep.s.n)));
            e = q;
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            Value t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    }
    return v_list(l);
}

static Value str_replace(Ctx *C, Value s, Value old, Value nw, int64_t count)
{
    if (count < 0) count = INT64_MAX;
    Buf b = { 0 };
    const char *p = s.s.p, *e = s.s.p + s.s.n;
    if (!old.s.n) { /* inserts between characters and at both ends */
        for (; count > 0; count--) {
            buf_put(&C->A, &b, nw.s.p, nw.s.n);
            if (p >= e) break;
            int l = cp_len_at(p);
            buf_put(&C->A, &b, p, (size_t)l);
            p += l;
        }
        buf_put(&C->A, &b, p, (size_t)(e - p));
        return v_buf(&b);
    }
    while (count-- > 0) {
        const char *q = memmem(p, (size_t)(e - p), old.s.p, old.s.n);
        if (!q) break;
        buf_put(&C->A, &b, p, (size_t)(q - p));
        buf_put(&C->A, &b, nw.s.p, nw.s.n);
        p = q + old.s.n;
    }
    buf_put(&C->A, &b, p, (size_t)(e - p));
    return v_buf(&b);
}

/* str.find / rfind as code point index, -1 if absent */
static int64_t str_find(Ctx *C, Value s, Value sub, int rev)
{
    const char *hit = NULL;
    step_bytes(C, s.s.n); /* memmem is linear; so is counting the code points before the hit */
    if (!rev) hit = sub.s.n ? memmem(s.s.p, s.s.n, sub.s.p, sub.s.n) : s.s.p;
    else hit = sub.s.n ? str_rsearch(C, s.s.p, s.s.n, sub.s.p, sub.s.n) : s.s.p + s.s.n;
    return hit ? (int64_t)u8_count(s.s.p, (size_t)(hit - s.s.p)) : -1;
}

/* ---- Python number parsing for the int and float filters ---- */

/* float(str): [sign] digits[.digits][e[sign]digits] with '_' between digits, or inf/nan */
static int py_parse_float(Value s, double *out)
{
    Value t = s;
    const char *b = t.s.p, *e = t.s.p + t.s.n;
    while (b < e && py_space_at(b, e)) b += py_space_at(b, e);
    while (e > b && (unsigned char)e[-1] < 0x80 && py_space_cp((unsigned char)e[-1])) e--;
    char tmp[128];
    size_t n = 0;
    if (e - b <= 0 || e - b >= (ptrdiff_t)sizeof tmp) return 0;
    const char *p = b;
    if (*p == '+' || *p == '-') tmp[n++] = *p++;
    size_t rest = (size_t)(e - p);
    if ((rest == 3 && !strncasecmp(p, "inf", 3)) || (rest == 8 && !strncasecmp(p, "infinity", 8)) || (rest == 3 && !strncasecmp(p, "nan", 3))) {
        memcpy(tmp + n, p, rest);
        tmp[n + rest] = 0;
        *out = strtod(tmp, NULL);
        return 1;
    }
    int digits = 0, seen_e = 0, seen_dot = 0;
    for (; p < e; p++) {
        char c = *p;
        if (is_digit(c)) { tmp[n++] = c; digits++; continue; }
        if (c == '_' && p > b && is_digit(p[-1]) && p + 1 < e && is_digit(p[1])) continue;
        if (c == '.' && !seen_dot && !seen_e) { tmp[n++] = c; seen_dot = 1; continue; }
        if ((c == 'e' || c == 'E') && digits && !seen_e) {
            tmp[n++] = c;
            seen_e = 1;
            digits = 0;
            if (p + 1 < e && (p[1] == '+' || p[1] == '-')) tmp[n++] = *++p;
            continue;
        }
        return 0;
    }
    if (!digits) return 0;
    tmp[n] = 0;
    *out = strtod(tmp, NULL);
    return 1;
}

static int py_parse_int(Value s, int64_t *out)
{
    const char *b = s.s.p, *e = s.s.p + s.s.n;
    while (b < e && py_space_at(b, e)) b += py_space_at(b, e);
    while (e > b && (unsigned char)e[-1] < 0x80 && py_space_cp((unsigned char)e[-1])) e--;
    int neg = 0;
    if (b < e && (*b == '+' || *b == '-')) neg = *b++ == '-';
    if (b >= e || !is_digit(*b)) return 0;
    uint64_t v = 0;
    for (const char *p = b; p < e; p++) {
        if (*p == '_' && p + 1 < e && is_digit(p[1]) && is_digit(p[-1])) continue;
        if (!is_digit(*p)) return 0;
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* ---- calls: argument binding ---- */

typedef struct {
    Value *args;
    int na;
    const char **kn;
    Value *kv;
    int nk;
} Args;

/* Bind positional and keyword arguments to params; missing ones are V_ABSENT. */
static void bind(Ctx *C, const char *what, const char *const *params, int np, const Args *a, Value *out)
{
    if (a->na > np) rerr(C, "%s takes at most %d argument(s) (%d given)", what, np, a->na);
    for (int i = 0; i < np; i++) out[i] = i < a->na ? a->args[i] : v_absent();
    for (int k = 0; k < a->nk; k++) {
        int i = name_index(params, np, a->kn[k]);
        if (i < 0) rerr(C, "%s got an unexpected keyword argument '%s'", what, a->kn[k]);
        if (out[i].t != V_ABSENT) rerr(C, "%s got multiple values for argument '%s'", what, a->kn[k]);
        out[i] = a->kv[k];
    }
}

static int arg_bool(Value v, int dflt) { return v.t == V_ABSENT ? dflt : truthy(v); }

static Value eval(Ctx *C, const Node *n, Frame *S);
static int exec_body(Ctx *C, Node *const *v, int nv, Frame *S);
static Frame *frame_enter(Ctx *C, const FrameInfo *fi, Frame *parent);
static Value call_value(Ctx *C, Value fn, const Args *a);
static Value filter_call(Ctx *C, int id, Value v, const Args *a);
static int test_call(Ctx *C, int id, Value v, const Args *a);

/* ---- methods ---- */

static Value call_method(Ctx *C, Method *m, const Args *a)
{
    Value self = m->self, p[3];
    const char *name = method_names[m->id];
    if (a->nk && m->id != M_SPLIT && m->id != M_RSPLIT) rerr(C, "%s() takes no keyword arguments", name);
    switch (m->id) {
    case M_STARTSWITH: case M_ENDSWITH: {
        static const char *const pn[] = { "prefix" };
        if (a->na > 1) rerr(C, "%s(): start/end arguments are not supported", name);
        bind(C, name, pn, 1, a, p);
        if (p[0].t == V_ABSENT) rerr(C, "%s() takes at least 1 argument", name);
        Value *cand = &p[0];
        size_t nc = 1;
        if (p[0].t == V_LIST && p[0].l->kind == LK_TUPLE) { cand = p[0].l->v; nc = p[0].l->n; }
        for (size_t i = 0; i < nc; i++) {
            if (cand[i].t != V_STR) rerr(C, "%s first arg must be str or a tuple of str, not %s", name, type_name(cand[i]));
            if (cand[i].s.n > self.s.n) continue;
            step_bytes(C, cand[i].s.n);
            const char *at = m->id == M_STARTSWITH ? self.s.p : self.s.p + self.s.n - cand[i].s.n;
            if (!memcmp(at, cand[i].s.p, cand[i].s.n)) return v_bool(1);
        }
        return v_bool(0);
    }
    case M_SPLIT: case M_RSPLIT: {
        static const char *const pn[] = { "sep", "maxsplit" };
        bind(C, name, pn, 2, a, p);
        return str_split(C, self, p[0], p[1], m->id == M_RSPLIT);
    }
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        static const char *const pn[] = { "chars" };
        bind(C, name, pn, 1, a, p);
        return str_strip(C, self, p[0], m->id != M_RSTRIP, m->id != M_LSTRIP);
    }
    case M_LOWER: case M_UPPER: case M_TITLE: case M_CAPITALIZE:
        bind(C, name, NULL, 0, a, p);
        return str_case(C, self, m->id == M_LOWER ? CASE_LOWER : m->id == M_UPPER ? CASE_UPPER : m->id == M_TITLE ? CASE_TITLE : CASE_CAPITALIZE);
    case M_REPLACE: {
        static const char *const pn[] = { "old", "new", "count" };
        bind(C, name, pn, 3, a, p);
        if (p[0].t == V_ABSENT || p[1].t == V_ABSENT) rerr(C, "replace() takes at least 2 arguments");
        need_str(C, p[0], "replace() argument 1");
        need_str(C, p[1], "replace() argument 2");
        if (p[2].t != V_ABSENT && p[2].t != V_INT && p[2].t != V_BOOL) rerr(C, "replace() count must be an integer");
        return str_replace(C, self, p[0], p[1], p[2].t == V_ABSENT ? -1 : p[2].i);
    }
    case M_FIND: case M_RFIND: case M_INDEX: case M_COUNT: {
        static const char *const pn[] = { "sub" };
        if (a->na > 1) rerr(C, "%s(): start/end arguments are not supported", name);
        bind(C, name, pn, 1, a, p);
        if (p[0].t == V_ABSENT) rerr(C, "%s() takes exactly one argument", name);
        if (self.t == V_LIST) {
            int64_t cnt = 0;
            for (size_t i = 0; i < self.l->n; i++)
                if (py_eq(C, self.l->v[i], p[0])) {
                    if (m->id == M_INDEX) return v_int((int64_t)i);
                    cnt++;
                }
            if (m->id == M_INDEX) rerr(C, "%s.index(x): x not in %s", type_name(self), type_name(self));
            return v_int(cnt);
        }
        need_str(C, p[0], "substring");
        if (m->id == M_COUNT) {
            step_bytes(C, self.s.n);
            if (!p[0].s.n) return v_int((int64_t)u8_count(self.s.p, self.s.n) + 1);
            int64_t cnt = 0;
            for (const char *q = self.s.p, *e = self.s.p + self.s.n; (q = memmem(q, (size_t)(e - q), p[0].s.p, p[0].s.n)); q += p[0].s.n) cnt++;
            return v_int(cnt);
        }
        int64_t at = str_find(C, self, p[0], m->id == M_RFIND);
        if (at < 0 && m->id == M_INDEX) rerr(C, "substring not found");
        return v_int(at);
    }
    case M_JOIN: {
        static const char *const pn[] = { "iterable" };
        bind(C, name, pn, 1, a, p);
        if (p[0].t == V_ABSENT) rerr(C, "join() takes exactly one argument");
        Seq s = iterate(C, p[0]);
        Buf b = { 0 };
        for (size_t i = 0; i < s.n; i++) {
            if (s.v[i].t != V_STR) rerr(C, "sequence item %zu: expected str instance, %s found", i, type_name(s.v[i]));
            if (i) buf_put(&C->A, &b, self.s.p, self.s.n);
            buf_put(&C->A, &b, s.v[i].s.p, s.v[i].s.n);
        }
        return v_buf(&b);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISUPPER: case M_ISLOWER: {
        bind(C, name, NULL, 0, a, p);
        size_t n;
        uint32_t *cps = u8_decode_all(C, self, &n);
        if (m->id == M_ISUPPER || m->id == M_ISLOWER) { /* no cased character of the other kind, some of this kind */
            int cased = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cps[i];
                if (uc_is_title(c) || (m->id == M_ISLOWER ? uc_is_upper(c) : uc_is_lower(c))) return v_bool(0);
                cased |= m->id == M_ISLOWER ? uc_is_lower(c) : uc_is_upper(c);
            }
            return v_bool(cased);
        }
        if (!n) return v_bool(0);
        for (size_t i = 0; i < n; i++) {
            uint32_t c = cps[i];
            int ok = m->id == M_ISDIGIT ? uc_is_digit(c) : m->id == M_ISALPHA ? uc_is_alpha(c) :
                     m->id == M_ISALNUM ? (uc_is_alpha(c) || uc_is_num(c)) : py_space_cp(c);
            if (!ok) return v_bool(0);
        }
        return v_bool(1);
    }
    case M_REMOVEPREFIX: case M_REMOVESUFFIX: {
        static const char *const pn[] = { "affix" };
        bind(C, name, pn, 1, a, p);
        if (p[0].t == V_ABSENT) rerr(C, "%s() takes exactly one argument", name);
        need_str(C, p[0], name);
        if (p[0].s.n > self.s.n) return self;
        step_bytes(C, p[0].s.n);
        if (m->id == M_REMOVEPREFIX)
            return memcmp(self.s.p, p[0].s.p, p[0].s.n) ? self : v_str(self.s.p + p[0].s.n, self.s.n - p[0].s.n);
        return memcmp(self.s.p + self.s.n - p[0].s.n, p[0].s.p, p[0].s.n) ? self : v_str(self.s.p, self.s.n - p[0].s.n);
    }
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        bind(C, name, NULL, 0, a, p);
        Dict *d = self.d;
        List *l = list_new(C, m->id == M_ITEMS ? LK_ITEMS : m->id == M_KEYS ? LK_KEYS : LK_VALUES, d->n);
        for (size_t i = 0; i < d->n; i++)
            l->v[i] = m->id == M_ITEMS ? v_tuple2(C, d->k[i], d->v[i]) : m->id == M_KEYS ? d->k[i] : d->v[i];
        l->n = d->n;
        return v_list(l);
    }
    case M_GET: {
        static const char *const pn[] = { "key", "default" };
        bind(C, name, pn, 2, a, p);
        if (p[0].t == V_ABSENT) rerr(C, "get expected at least 1 argument");
        check_hashable(C, p[0]);
        Value *r = dict_find(C, self.d, p[0]);
        return r ? *r : p[1].t == V_ABSENT ? v_none() : p[1];
    }
    default: /* M_CYCLE */
        if (!a->na) rerr(C, "no items for cycling given");
        return a->args[self.lp->i % (size_t)a->na];
    }
}

/* ---- global functions ---- */

static void ns_init(Ctx *C, Dict *d, const Args *a, const char *what)
{
    if (a->na > 1) rerr(C, "%s expected at most 1 positional argument", what);
    if (a->na == 1) {
        if (a->args[0].t != V_DICT) rerr(C, "%s: a positional argument must be a dict", what);
        for (size_t i = 0; i < a->args[0].d->n; i++) dict_set(C, d, a->args[0].d->k[i], a->args[0].d->v[i]);
    }
    for (int k = 0; k < a->nk; k++) dict_set(C, d, v_cstr(a->kn[k]), a->kv[k]);
}

static Value call_func(Ctx *C, int id, const Args *a)
{
    switch (id) {
    case F_RANGE: {
        if (a->nk) rerr(C, "range() takes no keyword arguments");
        if (a->na < 1 || a->na > 3) rerr(C, "range expected 1 to 3 arguments, got %d", a->na);
        int64_t r[3] = { 0, 0, 1 };
        for (int i = 0; i < a->na; i++) {
            if (a->args[i].t != V_INT && a->args[i].t != V_BOOL)
                rerr(C, "'%s' object cannot be interpreted as an integer", type_name(a->args[i]));
        }
        if (a->na == 1) r[1] = a->args[0].i;
        else {
            r[0] = a->args[0].i;
            r[1] = a->args[1].i;
            if (a->na == 3) r[2] = a->args[2].i;
        }
        if (r[2] == 0) rerr(C, "range() arg 3 must not be zero");
        /* the length as CPython's compute_range_length, in uint64: the span of two int64 bounds
           and i * step may not fit int64 although every item does */
        uint64_t lo = (uint64_t)r[0], hi = (uint64_t)r[1], st = (uint64_t)r[2], cnt = 0;
        if (r[2] > 0 && r[0] < r[1]) cnt = (hi - lo - 1) / st + 1;
        else if (r[2] < 0 && r[0] > r[1]) cnt = (lo - hi - 1) / (0 - st) + 1;
        if (cnt > RANGE_LIMIT) rerr(C, "range too big: the sandbox allows at most %d items", RANGE_LIMIT);
        List *l = list_new(C, LK_RANGE, (size_t)cnt);
        for (size_t i = 0; i < (size_t)cnt; i++) l->v[i] = v_int((int64_t)(lo + i * st));
        l->n = (size_t)cnt;
        l->r0 = r[0];
        l->r1 = r[1];
        l->rs = r[2];
        return v_list(l);
    }
    case F_NAMESPACE: case F_DICT: {
        Dict *d = dict_new(C);
        ns_init(C, d, a, func_names[id]);
        Value v = { .t = id == F_NAMESPACE ? V_NS : V_DICT };
        v.d = d;
        return v;
    }
    case F_RAISE: {
        if (a->na != 1 || a->nk) rerr(C, "raise_exception() takes exactly one argument");
        Value m = to_str(C, a->args[0]);
        rerr(C, "raise_exception: %.*s", (int)(m.s.n > 300 ? 300 : m.s.n), m.s.p);
    }
    default: { /* F_STRFTIME */
        if (a->na != 1 || a->nk || a->args[0].t != V_STR) rerr(C, "strftime_now() takes one string argument");
        char fmt[256], out[512];
        if (a->args[0].s.n >= sizeof fmt) rerr(C, "strftime_now(): format too long");
        memcpy(fmt, a->args[0].s.p, a->args[0].s.n);
        fmt[a->args[0].s.n] = 0;
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(out, sizeof out, fmt, &tmv);
        return v_strcopy(C, out, n);
    }
    }
}

/* ---- macros ---- */

static Value call_macro(Ctx *C, Macro *m, const Args *a)
{
    const Node *d = m->def;
    if (a->na > d->nn) rerr(C, "macro '%s' takes not more than %d argument(s)", d->s, d->nn);
    if (++C->depth > MACRO_DEPTH_LIMIT) rerr(C, "macro calls nested deeper than %d", MACRO_DEPTH_LIMIT);
    step(C);
    Frame *S = frame_enter(C, d->fi[0], m->closure);
    Value *given = arena_alloc(&C->A, sizeof(Value) * (size_t)(d->nn ? d->nn : 1));
    for (int i = 0; i < d->nn; i++) given[i] = i < a->na ? a->args[i] : v_absent();
    for (int k = 0; k < a->nk; k++) {
        int i = name_index(d->names, d->nn, a->kn[k]);
        if (i < 0) rerr(C, "macro '%s' takes no keyword argument '%s'", d->s, a->kn[k]);
        if (given[i].t != V_ABSENT) rerr(C, "macro '%s' got multiple values for argument '%s'", d->s, a->kn[k]);
        given[i] = a->kv[k];
    }
    for (int i = 0; i < d->nn; i++) S->slots[d->slots[i]] = given[i];
    for (int i = 0; i < d->nn; i++) /* defaults see the parameters before them */
        if (given[i].t == V_ABSENT) S->slots[d->slots[i]] = d->w[i] ? eval(C, d->w[i], S) : v_undef(d->names[i]);
    Buf *saved = C->out, b = { 0 };
    C->out = &b;
    exec_body(C, d->v, d->nv, S);
    C->out = saved;
    C->depth--;
    return v_buf(&b);
}

static Value call_value(Ctx *C, Value fn, const Args *a)
{
    switch (fn.t) {
    case V_MACRO: return call_macro(C, fn.m, a);
    case V_FUNC: return call_func(C, (int)fn.i, a);
    case V_METHOD: return call_method(C, fn.me, a);
    case V_UNDEF: rerr(C, "'%s' is undefined", fn.s.p ? fn.s.p : "value");
    default: rerr(C, "'%s' object is not callable", type_name(fn));
    }
}

/* ---- filters ---- */

/* make_attrgetter: "a.b.0" -> item lookups (Jinja's environment.getitem per part) */
static Value attr_get(Ctx *C, Value item, Value attr, Value dflt)
{
    if (attr.t == V_ABSENT || attr.t == V_NONE) return item;
    if (attr.t == V_INT) {
        item = get_item(C, item, attr);
    } else {
        need_str(C, attr, "attribute");
        const char *p = attr.s.p, *e = p + attr.s.n;
        for (;;) {
            const char *q = memchr(p, '.', (size_t)(e - p));
            if (!q) q = e;
            Value part = v_str(p, (size_t)(q - p));
            int digits = q > p;
            for (const char *r = p; r < q; r++) digits &= is_digit(*r);
            int64_t idx;
            if (digits && py_parse_int(part, &idx)) part = v_int(idx);
            item = get_item(C, item, part);
            if (dflt.t != V_ABSENT && dflt.t != V_NONE && item.t == V_UNDEF) item = dflt;
            if (q == e) break;
            p = q + 1;
        }
    }
    return item;
}

static Value ignore_case(Ctx *C, Value v, int case_sensitive)
{
    return (!case_sensitive && v.t == V_STR) ? str_case(C, v, CASE_LOWER) : v;
}

/* Stable merge sort of items by keys (Python's sorted; reverse keeps equal items in order). */
static void sort_values(Ctx *C, Value *items, Value *keys, size_t n, int reverse)
{
    if (n < 2) return;
    Value *ti = arena_alloc(&C->A, sizeof(Value) * n), *tk = arena_alloc(&C->A, sizeof(Value) * n);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = py_cmp(C, keys[j], keys[i]);
                int take_right = reverse ? c > 0 : c < 0;
                if (take_right) { ti[k] = items[j]; tk[k++] = keys[j++]; }
                else { ti[k] = items[i]; tk[k++] = keys[i++]; }
            }
            while (i < mid) { ti[k] = items[i]; tk[k++] = keys[i++]; }
            while (j < hi) { ti[k] = items[j]; tk[k++] = keys[j++]; }
        }
        memcpy(items, ti, sizeof(Value) * n);
        memcpy(keys, tk, sizeof(Value) * n);
    }
}

static Value select_filter(Ctx *C, int id, Value v, const Args *a)
{
    int attr = id == FL_SELECTATTR || id == FL_REJECTATTR, reject = id == FL_REJECT || id == FL_REJECTATTR;
    List *out = list_new(C, LK_ITER, 0);
    if (!truthy(v)) return v_list(out);
    if (attr && a->na < 1) rerr(C, "%s: missing parameter for attribute name", filter_names[id]);
    int off = attr ? 1 : 0, tid = -1;
    if (a->na > off) {
        if (a->args[off].t != V_STR) rerr(C, "%s: the test name must be a string", filter_names[id]);
        char *tn = arena_strndup(&C->A, a->args[off].s.p, a->args[off].s.n);
        tid = name_index(test_names, TS__N, tn);
        if (tid < 0) rerr(C, "no test named '%s'", tn);
    }
    Args ta = { a->na > off + 1 ? a->args + off + 1 : NULL, a->na > off + 1 ? a->na - off - 1 : 0, a->kn, a->kv, a->nk };
    Seq s = iterate(C, v);
    for (size_t i = 0; i < s.n; i++) {
        Value x = attr ? attr_get(C, s.v[i], a->args[0], v_absent()) : s.v[i];
        int r = tid >= 0 ? test_call(C, tid, x, &ta) : truthy(x);
        if (r != reject) list_push(C, out, s.v[i]);
    }
    return v_list(out);
}

static Value filter_call(Ctx *C, int id, Value v, const Args *a)
{
    Value p[4];
    const char *fname = filter_names[id];
    switch (id) {
    case FL_ABS:
        bind(C, fname, NULL, 0, a, p);
        if (v.t == V_INT || v.t == V_BOOL) {
            if (v.i == INT64_MIN) rerr(C, "integer overflow");
            return v_int(v.i < 0 ? -v.i : v.i);
        }
        if (v.t == V_FLOAT) return v_float(fabs(v.f));
        rerr(C, "bad operand type for abs(): '%s'", type_name(v));
    case FL_CAPITALIZE: case FL_LOWER: case FL_UPPER: case FL_TITLE:
        bind(C, fname, NULL, 0, a, p);
        return str_case(C, to_str(C, v), id == FL_CAPITALIZE ? CASE_CAPITALIZE : id == FL_LOWER ? CASE_LOWER : id == FL_UPPER ? CASE_UPPER : CASE_JINJA_TITLE);
    case FL_COUNT: case FL_LENGTH:
        bind(C, fname, NULL, 0, a, p);
        return v_int(py_len(C, v));
    case FL_D: case FL_DEFAULT: {
        static const char *const pn[] = { "default_value", "boolean" };
        bind(C, fname, pn, 2, a, p);
        if (v.t == V_UNDEF || (arg_bool(p[1], 0) && !truthy(v))) return p[0].t == V_ABSENT ? v_str("", 0) : p[0];
        return v;
    }
    case FL_DICTSORT: {
        static const char *const pn[] = { "case_sensitive", "by", "reverse" };
        bind(C, fname, pn, 3, a, p);
        if (v.t != V_DICT) rerr(C, "dictsort: a mapping is required, not %s", type_name(v));
        int by_value = 0;
        if (p[1].t != V_ABSENT) {
            if (p[1].t == V_STR && p[1].s.n == 5 && !memcmp(p[1].s.p, "value", 5)) by_value = 1;
            else if (!(p[1].t == V_STR && p[1].s.n == 3 && !memcmp(p[1].s.p, "key", 3)))
                rerr(C, "dictsort: you can only sort by either \"key\" or \"value\"");
        }
        size_t n = v.d->n;
        Value *items = arena_alloc(&C->A, sizeof(Value) * (n ? n : 1)), *keys = arena_alloc(&C->A, sizeof(Value) * (n ? n : 1));
        for (size_t i = 0; i < n; i++) {
            items[i] = v_tuple2(C, v.d->k[i], v.d->v[i]);
            keys[i] = ignore_case(C, by_value ? v.d->v[i] : v.d->k[i], arg_bool(p[0], 0));
        }
        sort_values(C, items, keys, n, arg_bool(p[2], 0));
        return v_list(list_from(C, LK_LIST, items, n));
    }
    case FL_FIRST: case FL_LAST: {
        bind(C, fname, NULL, 0, a, p);
        if (v.t == V_UNDEF) return v_undef(id == FL_FIRST ? "first" : "last");
        if (id == FL_LAST && v.t == V_LIST && v.l->kind == LK_ITER) rerr(C, "'generator' object is not reversible");
        if (id == FL_FIRST && v.t == V_LIST && v.l->kind == LK_ITER) {
            if (v.l->pos >= v.l->n) return v_undef("first");
            return v.l->v[v.l->pos++];
        }
        Seq s = iterate(C, v);
        if (!s.n) return v_undef(id == FL_FIRST ? "first" : "last");
        return s.v[id == FL_FIRST ? 0 : s.n - 1];
    }
    case FL_FLOAT: {
        static const char *const pn[] = { "default" };
        bind(C, fname, pn, 1, a, p);
        Value dflt = p[0].t == V_ABSENT ? v_float(0.0) : p[0];
        double f;
        switch (v.t) {
        case V_FLOAT: return v;
        case V_INT: case V_BOOL: return v_float((double)v.i);
        case V_STR: step_bytes(C, v.s.n); return py_parse_float(v, &f) ? v_float(f) : dflt;
        case V_UNDEF: rerr(C, "'%s' is undefined", v.s.p ? v.s.p : "value");
        default: return dflt;
        }
    }
    case FL_INT: {
        static const char *const pn[] = { "default", "base" };
        bind(C, fname, pn, 2, a, p);
        Value dflt = p[0].t == V_ABSENT ? v_int(0) : p[0];
        if (p[1].t != V_ABSENT && !(p[1].t == V_INT && p[1].i == 10)) rerr(C, "int filter: only base 10 is supported");
        int64_t i;
        double f;
        switch (v.t) {
        case V_INT: return v;
        case V_BOOL: return v_int(v.i);
        case V_FLOAT:
            if (isinf(v.f)) rerr(C, "cannot convert float infinity to integer");
            if (isnan(v.f)) return dflt;
            if (fabs(v.f) >= 9223372036854775808.0) rerr(C, "integer overflow");
            return v_int((int64_t)v.f);
        case V_STR:
            step_bytes(C, v.s.n);
            if (py_parse_int(v, &i)) return v_int(i);
            if (py_parse_float(v, &f) && isfinite(f) && fabs(f) < 9223372036854775808.0) return v_int((int64_t)f);
            return dflt;
        case V_UNDEF: rerr(C, "'%s' is undefined", v.s.p ? v.s.p : "value");
        default: return dflt;
        }
    }
    case FL_ITEMS: {
        bind(C, fname, NULL, 0, a, p);
        List *l = list_new(C, LK_ITER, 0);
        if (v.t == V_UNDEF) return v_list(l);
        if (v.t != V_DICT) rerr(C, "can only get item pairs from a mapping");
        for (size_t i = 0; i < v.d->n; i++) list_push(C, l, v_tuple2(C, v.d->k[i], v.d->v[i]));
        return v_list(l);
    }
    case FL_JOIN: {
        static const char *const pn[] = { "d", "attribute" };
        bind(C, fname, pn, 2, a, p);
        Value d = p[0].t == V_ABSENT ? v_str("", 0) : to_str(C, p[0]);
        Seq s = iterate(C, v);
        Buf b = { 0 };
        for (size_t i = 0; i < s.n; i++) {
            if (i) buf_put(&C->A, &b, d.s.p, d.s.n);
            py_str(C, &b, attr_get(C, s.v[i], p[1], v_absent()));
        }
        return v_buf(&b);
    }
    case FL_LIST: {
        bind(C, fname, NULL, 0, a, p);
        Seq s = iterate(C, v);
        return v_list(list_from(C, LK_LIST, s.v, s.n));
    }
    case FL_MAP: {
        List *out = list_new(C, LK_ITER, 0);
        if (a->na == 0) {
            Value attr = v_absent(), dflt = v_absent();
            for (int k = 0; k < a->nk; k++) {
                if (!strcmp(a->kn[k], "attribute")) attr = a->kv[k];
                else if (!strcmp(a->kn[k], "default")) dflt = a->kv[k];
                else rerr(C, "map: unexpected keyword argument '%s'", a->kn[k]);
            }
            if (attr.t == V_ABSENT) rerr(C, "map requires a filter argument");
            if (!truthy(v)) return v_list(out);
            Seq s = iterate(C, v);
            for (size_t i = 0; i < s.n; i++) list_push(C, out, attr_get(C, s.v[i], attr, dflt));
            return v_list(out);
        }
        if (a->args[0].t != V_STR) rerr(C, "map: the filter name must be a string");
        char *fn = arena_strndup(&C->A, a->args[0].s.p, a->args[0].s.n);
        int fid = name_index(filter_names, FL__N, fn);
        if (fid < 0) rerr(C, "map(): filter '%s' is not supported", fn);
        Args fa = { a->args + 1, a->na - 1, a->kn, a->kv, a->nk };
        if (!truthy(v)) return v_list(out);
        Seq s = iterate(C, v);
        for (size_t i = 0; i < s.n; i++) list_push(C, out, filter_call(C, fid, s.v[i], &fa));
        return v_list(out);
    }
    case FL_MAX: case FL_MIN: {
        static const char *const pn[] = { "case_sensitive", "attribute" };
        bind(C, fname, pn, 2, a, p);
        Seq s = iterate(C, v);
        if (!s.n) return v_undef(fname);
        size_t best = 0;
        Value bk = ignore_case(C, attr_get(C, s.v[0], p[1], v_absent()), arg_bool(p[0], 0));
        for (size_t i = 1; i < s.n; i++) {
            Value k = ignore_case(C, attr_get(C, s.v[i], p[1], v_absent()), arg_bool(p[0], 0));
            int c = py_cmp(C, k, bk);
            if (id == FL_MAX ? c > 0 : c < 0) { best = i; bk = k; }
        }
        return s.v[best];
    }
    case FL_REJECT: case FL_REJECTATTR: case FL_SELECT: case FL_SELECTATTR:
        return select_filter(C, id, v, a);
    case FL_REPLACE: {
        static const char *const pn[] = { "old", "new", "count" };
        bind(C, fname, pn, 3, a, p);
        if (p[0].t == V_ABSENT || p[1].t == V_ABSENT) rerr(C, "replace filter needs old and new");
        int64_t count = -1;
        if (p[2].t != V_ABSENT && p[2].t != V_NONE) {
            if (p[2].t != V_INT && p[2].t != V_BOOL) rerr(C, "replace filter: count must be an integer");
            count = p[2].i;
        }
        return str_replace(C, to_str(C, v), to_str(C, p[0]), to_str(C, p[1]), count);
    }
    case FL_REVERSE: {
        bind(C, fname, NULL, 0, a, p);
        if (v.t == V_STR) {
            Value sl[3] = { v_none(), v_none(), v_int(-1) };
            return get_slice(C, v, sl);
        }
        if (v.t == V_LIST && v.l->kind == LK_ITER) { /* reversed() fails: list(value) reversed */
            Seq s = iterate(C, v);
            List *l = list_new(C, LK_LIST, s.n);
            for (size_t i = 0; i < s.n; i++) l->v[i] = s.v[s.n - 1 - i];
            l->n = s.n;
            return v_list(l);
        }
        if (v.t != V_LIST && v.t != V_DICT && v.t != V_UNDEF) rerr(C, "reverse: argument must be iterable");
        Seq s = iterate(C, v);
        List *l = list_new(C, LK_ITER, s.n);
        for (size_t i = 0; i < s.n; i++) l->v[i] = s.v[s.n - 1 - i];
        l->n = s.n;
        return v_list(l);
    }
    case FL_ROUND: {
        static const char *const pn[] = { "precision", "method" };
        bind(C, fname, pn, 2, a, p);
        int64_t prec = 0;
        if (p[0].t != V_ABSENT) {
            if (p[0].t != V_INT && p[0].t != V_BOOL) rerr(C, "round: precision must be an integer");
            prec = p[0].i;
        }
        int method = 0; /* common, ceil, floor */
        if (p[1].t != V_ABSENT) {
            Value m = p[1];
            if (m.t == V_STR && m.s.n == 4 && !memcmp(m.s.p, "ceil", 4)) method = 1;
            else if (m.t == V_STR && m.s.n == 5 && !memcmp(m.s.p, "floor", 5)) method = 2;
            else if (!(m.t == V_STR && m.s.n == 6 && !memcmp(m.s.p, "common", 6))) rerr(C, "method must be common, ceil or floor");
        }
        if (!is_num(v)) rerr(C, "round: a number is required, not %s", type_name(v));
        if (prec < -300 || prec > 300) rerr(C, "round: precision out of range");
        if (method) {
            double sc = pow(10.0, (double)prec), x = num_f(v) * sc;
            return v_float((method == 1 ? ceil(x) : floor(x)) / sc);
        }
        if (v.t != V_FLOAT) {
            if (prec >= 0) return v_int(v.i);
            rerr(C, "round: negative precision on an integer is not supported");
        }
        if (!isfinite(v.f)) return v;
        if (prec < 0) rerr(C, "round: negative precision is not supported");
        char tmp[400]; /* correctly rounded (half-even on exact ties), as Python's round() */
        snprintf(tmp, sizeof tmp, "%.*f", (int)prec, v.f);
        return v_float(strtod(tmp, NULL));
    }
    case FL_SORT: {
        static const char *const pn[] = { "reverse", "case_sensitive", "attribute" };
        bind(C, fname, pn, 3, a, p);
        Seq s = iterate(C, v);
        Value *items = arena_alloc(&C->A, sizeof(Value) * (s.n ? s.n : 1)), *keys = arena_alloc(&C->A, sizeof(Value) * (s.n ? s.n : 1));
        /* make_multi_attrgetter: the key is a list, one entry per comma-separated attribute (so
           equal entries compare by ==, never by <) */
        Value attrs[16];
        int nattr = 0;
        if (p[2].t == V_STR) {
            for (const char *q = p[2].s.p, *e = q + p[2].s.n; nattr < 16;) {
                const char *c = memchr(q, ',', (size_t)(e - q));
                attrs[nattr++] = v_str(q, (size_t)((c ? c : e) - q));
                if (!c) break;
                q = c + 1;
            }
        } else {
            attrs[nattr++] = p[2];
        }
        for (size_t i = 0; i < s.n; i++) {
            items[i] = s.v[i];
            List *k = list_new(C, LK_LIST, (size_t)nattr);
            for (int j = 0; j < nattr; j++) k->v[j] = ignore_case(C, attr_get(C, s.v[i], attrs[j], v_absent()), arg_bool(p[1], 0));
            k->n = (size_t)nattr;
            keys[i] = v_list(k);
        }
        sort_values(C, items, keys, s.n, arg_bool(p[0], 0));
        return v_list(list_from(C, LK_LIST, items, s.n));
    }
    case FL_STRING:
        bind(C, fname, NULL, 0, a, p);
        return to_str(C, v);
    case FL_SUM: {
        static const char *const pn[] = { "attribute", "start" };
        bind(C, fname, pn, 2, a, p);
        Value acc = p[1].t == V_ABSENT ? v_int(0) : p[1];
        if (acc.t == V_STR) rerr(C, "sum() can't sum strings [use ''.join(seq) instead]");
        Seq s = iterate(C, v);
        for (size_t i = 0; i < s.n; i++) acc = py_add(C, acc, attr_get(C, s.v[i], p[0], v_absent()));
        return acc;
    }
    case FL_TOJSON: {
        static const char *const pn[] = { "ensure_ascii", "indent", "separators", "sort_keys" };
        bind(C, fname, pn, 4, a, p);
        JsonOpt o = { 0 };
        o.ascii = arg_bool(p[0], 0);
        o.sort_keys = arg_bool(p[3], 0);
        if (p[1].t != V_ABSENT && p[1].t != V_NONE) {
            o.indent = 1;
            if (p[1].t == V_STR) o.ind = p[1];
            else if (p[1].t == V_INT || p[1].t == V_BOOL) {
                int64_t k = p[1].i < 0 ? 0 : p[1].i > 64 ? -1 : p[1].i;
                if (k < 0) rerr(C, "tojson: indent too large");
                char *sp = arena_alloc(&C->A, (size_t)k + 1);
                memset(sp, ' ', (size_t)k);
                o.ind = v_str(sp, (size_t)k);
            } else rerr(C, "tojson: indent must be an integer or a string");
        }
        o.isep = v_cstr(o.indent ? "," : ", ");
        o.ksep = v_cstr(": ");
        if (p[2].t != V_ABSENT && p[2].t != V_NONE) {
            if (p[2].t != V_LIST || (p[2].l->kind != LK_TUPLE && p[2].l->kind != LK_LIST) || p[2].l->n != 2 ||
                p[2].l->v[0].t != V_STR || p[2].l->v[1].t != V_STR)
                rerr(C, "tojson: separators must be a pair of strings");
            o.isep = p[2].l->v[0];
            o.ksep = p[2].l->v[1];
        }
        Buf b = { 0 };
        json_dump(C, &b, v, &o, 0);
        return v_buf(&b);
    }
    case FL_TRIM: {
        static const char *const pn[] = { "chars" };
        bind(C, fname, pn, 1, a, p);
        return str_strip(C, to_str(C, v), p[0], 1, 1);
    }
    default: { /* FL_UNIQUE */
        static const char *const pn[] = { "case_sensitive", "attribute" };
        bind(C, fname, pn, 2, a, p);
        Seq s = iterate(C, v);
        List *out = list_new(C, LK_ITER, 0), *seen = list_new(C, LK_LIST, 0);
        for (size_t i = 0; i < s.n; i++) {
            Value k = ignore_case(C, attr_get(C, s.v[i], p[1], v_absent()), arg_bool(p[0], 0));
            check_hashable(C, k);
            int dup = 0;
            for (size_t j = 0; j < seen->n && !dup; j++) dup = py_eq(C, seen->v[j], k);
            if (dup) continue;
            list_push(C, seen, k);
            list_push(C, out, s.v[i]);
        }
        return v_list(out);
    }
    }
}

/* ---- tests ---- */

static int is_iterable(Value v) { return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF || v.t == V_LOOP; }

static int test_call(Ctx *C, int id, Value v, const Args *a)
{
    Value p[1];
    static const char *const pn[] = { "other" };
    int takes_arg = id == TS_SAMEAS || id == TS_DIVISIBLEBY || id == TS_IN || (id >= TS_EQ && id <= TS_LE);
    bind(C, test_names[id], pn, takes_arg ? 1 : 0, a, p);
    if (takes_arg && p[0].t == V_ABSENT) rerr(C, "test '%s' needs an argument", test_names[id]);
    switch (id) {
    case TS_DEFINED: return v.t != V_UNDEF;
    case TS_UNDEFINED: return v.t == V_UNDEF;
    case TS_NONE: return v.t == V_NONE;
    case TS_BOOLEAN: return v.t == V_BOOL;
    case TS_FALSE: return v.t == V_BOOL && !v.i;
    case TS_TRUE: return v.t == V_BOOL && v.i;
    case TS_INTEGER: return v.t == V_INT;
    case TS_FLOAT: return v.t == V_FLOAT;
    case TS_NUMBER: return is_num(v);
    case TS_STRING: return v.t == V_STR;
    case TS_MAPPING: return v.t == V_DICT;
    case TS_ITERABLE: return is_iterable(v);
    case TS_SEQUENCE:
        return v.t == V_STR || v.t == V_DICT || v.t == V_UNDEF ||
               (v.t == V_LIST && (v.l->kind == LK_LIST || v.l->kind == LK_TUPLE || v.l->kind == LK_RANGE));
    case TS_CALLABLE: return v.t == V_MACRO || v.t == V_FUNC || v.t == V_METHOD || v.t == V_UNDEF || v.t == V_LOOP;
    case TS_SAMEAS: {
        Value o = p[0];
        if (v.t != o.t) return 0;
        switch (v.t) {
        case V_NONE: case V_UNDEF: return v.t == V_NONE ? 1 : 0;
        case V_BOOL: return v.i == o.i;
        case V_INT: /* CPython caches small ints only */
            if (v.i == o.i && v.i >= -5 && v.i <= 256) return 1;
            if (v.i != o.i) return 0;
            rerr(C, "'sameas' on large integers depends on CPython internals and is not supported");
        case V_FLOAT: case V_STR: rerr(C, "'sameas' on %s values depends on CPython internals and is not supported", type_name(v));
        case V_LIST: return v.l == o.l;
        case V_DICT: case V_NS: return v.d == o.d;
        case V_LOOP: return v.lp == o.lp;
        case V_MACRO: return v.m == o.m;
        default: return v.i == o.i;
        }
    }
    case TS_LOWER: case TS_UPPER: { /* str(value).islower() / .isupper() */
        Method mm = { to_str(C, v), id == TS_LOWER ? M_ISLOWER : M_ISUPPER };
        Args none = { 0 };
        return (int)call_method(C, &mm, &none).i;
    }
    case TS_ODD: case TS_EVEN: {
        Value r = py_binop(C, OP_MOD, v, v_int(2));
        return py_eq(C, r, v_int(id == TS_ODD ? 1 : 0));
    }
    case TS_DIVISIBLEBY: return py_eq(C, py_binop(C, OP_MOD, v, p[0]), v_int(0));
    case TS_IN: return py_contains(C, p[0], v);
    case TS_EQ: case TS_EQUALTO: return py_eq(C, v, p[0]);
    case TS_NE: return !py_eq(C, v, p[0]);
    case TS_GT: case TS_GREATERTHAN: return py_cmp(C, v, p[0]) > 0;
    case TS_GE: return py_cmp(C, v, p[0]) >= 0;
    case TS_LT: case TS_LESSTHAN: return py_cmp(C, v, p[0]) < 0;
    case TS_LE: return py_cmp(C, v, p[0]) <= 0;
    case TS_ESCAPED: return 0; /* no Markup values here */
    default: { /* TS_FILTER, TS_TEST: whether Jinja (transformers' environment) has that name */
        if (v.t != V_STR) return 0;
        char *s = arena_strndup(&C->A, v.s.p, v.s.n);
        if (id == TS_FILTER) return name_index(filter_names, FL__N, s) >= 0 || in_list(jinja_other_filters, s);
        return name_index(test_names, TS__N, s) >= 0 || !strcmp(s, "==") || !strcmp(s, "!=") || !strcmp(s, "<") ||
               !strcmp(s, "<=") || !strcmp(s, ">") || !strcmp(s, ">=");
    }
    }
}

/* ---- expressions ---- */

/* Jinja's context.resolve: render variables, then the environment's globals; V_ABSENT if neither. */
static Value global_lookup(Ctx *C, const char *name)
{
    Value *p = dict_find_str(C->vars, name);
    if (p) return *p;
    int f = name_index(func_names, F__N, name);
    return f >= 0 ? v_func(f) : v_absent();
}

/* Enter a frame: its variables start as Jinja's enter_frame sets them. */
static Frame *frame_enter(Ctx *C, const FrameInfo *fi, Frame *parent)
{
    Frame *s = arena_alloc(&C->A, sizeof *s);
    s->parent = parent;
    s->fi = fi;
    s->slots = arena_alloc(&C->A, sizeof(Value) * (size_t)(fi->n ? fi->n : 1));
    for (int i = 0; i < fi->n; i++) {
        switch (fi->load[i]) {
        case LD_RESOLVE: s->slots[i] = global_lookup(C, fi->names[i]); break;
        case LD_ALIAS: {
            Frame *o = s;
            for (int d = 0; d < fi->alias_depth[i]; d++) o = o->parent;
            s->slots[i] = o->slots[fi->alias_slot[i]];
            break;
        }
        default: s->slots[i] = v_absent();
        }
    }
    return s;
}

static Value name_value(Ctx *C, const Node *n, Frame *S)
{
    Value v;
    if (n->depth < 0) {
        v = global_lookup(C, n->s);
    } else {
        for (int d = 0; d < n->depth; d++) S = S->parent;
        v = S->slots[n->slot];
    }
    return v.t == V_ABSENT ? v_undef(n->s) : v;
}

static Args eval_args(Ctx *C, const Node *n, Frame *S)
{
    Args a = { 0 };
    a.na = n->nv;
    a.nk = n->nw;
    a.kn = n->names;
    if (a.na) {
        a.args = arena_alloc(&C->A, sizeof(Value) * (size_t)a.na);
        for (int i = 0; i < a.na; i++) a.args[i] = eval(C, n->v[i], S);
    }
    if (a.nk) {
        a.kv = arena_alloc(&C->A, sizeof(Value) * (size_t)a.nk);
        for (int i = 0; i < a.nk; i++) a.kv[i] = eval(C, n->w[i], S);
    }
    return a;
}

/* Each macro level may nest expressions and statements up to PARSE_DEPTH_LIMIT again, so a
   recursive macro can nest C calls 200 x 200 deep and overflow the stack: the render counts
   them as a whole (Python would hit its recursion limit). */
static Value eval_node(Ctx *C, const Node *n, Frame *S);
static int exec_nodes(Ctx *C, Node *const *v, int nv, Frame *S);

static void nest_enter(Ctx *C)
{
    if (++C->nest > EVAL_DEPTH_LIMIT) rerr(C, "expressions and blocks nested deeper than %d (through macro calls)", EVAL_DEPTH_LIMIT);
}

static Value eval(Ctx *C, const Node *n, Frame *S)
{
    nest_enter(C);
    Value v = eval_node(C, n, S);
    C->nest--;
    return v;
}

static int exec_body(Ctx *C, Node *const *v, int nv, Frame *S)
{
    nest_enter(C);
    int r = exec_nodes(C, v, nv, S);
    C->nest--;
    return r;
}

static Value eval_node(Ctx *C, const Node *n, Frame *S)
{
    C->f.line = n->line;
    switch (n->kind) {
    case E_CONST: return n->k;
    case E_NAME: return name_value(C, n, S);
    case E_ATTR: {
        Value o = eval(C, n->a, S);
        C->f.line = n->line;
        return get_attr(C, o, n->s);
    }
    case E_ITEM: {
        Value o = eval(C, n->a, S), k = eval(C, n->b, S);
        C->f.line = n->line;
        return get_item(C, o, k);
    }
    case E_SLICE: {
        Value o = eval(C, n->a, S), parts[3];
        for (int i = 0; i < 3; i++) parts[i] = n->v[i] ? eval(C, n->v[i], S) : v_none();
        C->f.line = n->line;
        return get_slice(C, o, parts);
    }
    case E_CALL: {
        Value fn = eval(C, n->a, S);
        Args a = eval_args(C, n, S);
        C->f.line = n->line;
        return call_value(C, fn, &a);
    }
    case E_FILTER: {
        Value v = eval(C, n->a, S);
        Args a = eval_args(C, n, S);
        C->f.line = n->line;
        return filter_call(C, n->op, v, &a);
    }
    case E_TEST: {
        Value v = eval(C, n->a, S);
        Args a = eval_args(C, n, S);
        C->f.line = n->line;
        return v_bool(test_call(C, n->op, v, &a));
    }
    case E_NOT: return v_bool(!truthy(eval(C, n->a, S)));
    case E_NEG: case E_POS: {
        Value v = eval(C, n->a, S);
        C->f.line = n->line;
        if (v.t == V_INT || v.t == V_BOOL) {
            if (n->kind == E_POS) return v_int(v.i);
            if (v.i == INT64_MIN) rerr(C, "integer overflow");
            return v_int(-v.i);
        }
        if (v.t == V_FLOAT) return v_float(n->kind == E_NEG ? -v.f : v.f);
        if (v.t == V_UNDEF) rerr(C, "'%s' is undefined", v.s.p ? v.s.p : "value");
        rerr(C, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', type_name(v));
    }
    case E_BIN: {
        Value a = eval(C, n->a, S), b = eval(C, n->b, S);
        C->f.line = n->line;
        return py_binop(C, n->op, a, b);
    }
    case E_AND: {
        Value a = eval(C, n->a, S);
        return truthy(a) ? eval(C, n->b, S) : a;
    }
    case E_OR: {
        Value a = eval(C, n->a, S);
        return truthy(a) ? a : eval(C, n->b, S);
    }
    case E_CONCAT: {
        Buf b = { 0 };
        for (int i = 0; i < n->nv; i++) py_str(C, &b, eval(C, n->v[i], S));
        return v_buf(&b);
    }
    case E_CMP: {
        Value left = eval(C, n->a, S);
        for (int i = 0; i < n->nv; i++) {
            Value right = eval(C, n->v[i], S);
            C->f.line = n->line;
            if (!py_compare_op(C, n->ops[i], left, right)) return v_bool(0);
            left = right;
        }
        return v_bool(1);
    }
    case E_COND:
        if (truthy(eval(C, n->b, S))) return eval(C, n->a, S);
        return n->c ? eval(C, n->c, S) : v_undef(NULL);
    case E_LIST: case E_TUPLE: {
        List *l = list_new(C, n->kind == E_LIST ? LK_LIST : LK_TUPLE, (size_t)n->nv);
        for (int i = 0; i < n->nv; i++) l->v[i] = eval(C, n->v[i], S);
        l->n = (size_t)n->nv;
        return v_list(l);
    }
    case E_DICT: {
        Dict *d = dict_new(C);
        for (int i = 0; i < n->nv; i++) {
            Value k = eval(C, n->v[i], S), v = eval(C, n->w[i], S);
            C->f.line = n->line;
            dict_set(C, d, k, v);
        }
        return v_dict(d);
    }
    default: rerr(C, "internal error: node kind %d is not an expression", n->kind);
    }
}

/* ---- statements ---- */

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

/* Targets names (a tuple when n->op & 1) to their slots in frame S. */
static void assign(Ctx *C, Frame *S, const Node *n, const int *slots, Value v)
{
    if (!(n->op & 1)) {
        S->slots[slots[0]] = v;
        return;
    }
    Seq s = iterate(C, v);
    if ((int)s.n != n->nn)
        rerr(C, (int)s.n > n->nn ? "too many values to unpack (expected %d)" : "not enough values to unpack (expected %d)", n->nn);
    for (int i = 0; i < n->nn; i++) S->slots[slots[i]] = s.v[i];
}

static int exec_for(Ctx *C, const Node *n, Frame *S)
{
    Value it = eval(C, n->a, S);
    C->f.line = n->line;
    Seq s = iterate(C, it);
    if (n->b) { /* for x in xs if cond: loop.* count the kept items */
        Value *kept = arena_alloc(&C->A, sizeof(Value) * (s.n ? s.n : 1));
        size_t k = 0;
        for (size_t i = 0; i < s.n; i++) {
            step(C);
            Frame *fs = frame_enter(C, n->fi[1], S);
            assign(C, fs, n, n->slots2, s.v[i]);
            if (truthy(eval(C, n->b, fs))) kept[k++] = s.v[i];
        }
        s.v = kept;
        s.n = k;
    }
    Loop *L = arena_alloc(&C->A, sizeof *L);
    L->items = s.v;
    L->n = s.n;
    Value lv = { .t = V_LOOP };
    lv.lp = L;
    int completed = 0; /* some iteration ran its body to the end */
    for (size_t i = 0; i < s.n; i++) {
        step(C);
        L->i = i;
        Frame *is = frame_enter(C, n->fi[0], S); /* Jinja re-enters the loop frame each iteration */
        is->slots[n->slot] = lv;
        assign(C, is, n, n->slots, s.v[i]);
        int r = exec_body(C, n->v, n->nv, is);
        if (r == FLOW_NORMAL) completed = 1;
        if (r == FLOW_BREAK) break;
    }
    /* Jinja clears its "no iteration" flag at the end of the body, so break/continue skip that:
       the else block runs unless some iteration completed normally. */
    if (!completed && n->nw) return exec_body(C, n->w, n->nw, frame_enter(C, n->fi[2], S));
    return FLOW_NORMAL;
}

static void exec_set(Ctx *C, const Node *n, Frame *S)
{
    Value v;
    if (n->op & 2) { /* {% set x %}...{% endset %} */
        Buf *saved = C->out, b = { 0 };
        C->out = &b;
        Frame *bs = frame_enter(C, n->fi[0], S);
        exec_body(C, n->v, n->nv, bs);
        C->out = saved;
        v = v_buf(&b);
        for (int i = 0; i < n->nw; i++) {
            Args a = eval_args(C, n->w[i], bs);
            C->f.line = n->w[i]->line;
            v = filter_call(C, n->w[i]->op, v, &a);
        }
    } else {
        v = eval(C, n->a, S);
    }
    C->f.line = n->line;
    if (n->c) { /* ns.attr = v */
        Value ns = eval(C, n->c, S);
        if (ns.t != V_NS) rerr(C, "cannot assign attribute on non-namespace object '%s'", n->names[0]);
        dict_set(C, ns.d, v_cstr(n->s), v);
        return;
    }
    assign(C, S, n, n->slots, v);
}

static int exec_nodes(Ctx *C, Node *const *v, int nv, Frame *S)
{
    for (int i = 0; i < nv; i++) {
        const Node *n = v[i];
        C->f.line = n->line;
        switch (n->kind) {
        case S_DATA: buf_put(&C->A, C->out, n->s, n->sn); break;
        case S_OUT: py_str(C, C->out, eval(C, n->a, S)); break;
        case S_IF: {
            int r = FLOW_NORMAL, done = 0;
            if (truthy(eval(C, n->a, S))) { r = exec_body(C, n->v, n->nv, S); done = 1; }
            for (int k = 0; k < n->nx && !done; k++)
                if (truthy(eval(C, n->x[k]->a, S))) { r = exec_body(C, n->x[k]->v, n->x[k]->nv, S); done = 1; }
            if (!done) r = exec_body(C, n->w, n->nw, S);
            if (r != FLOW_NORMAL) return r;
            break;
        }
        case S_FOR: {
            int r = exec_for(C, n, S);
            if (r != FLOW_NORMAL) return r;
            break;
        }
        case S_SET: exec_set(C, n, S); break;
        case S_MACRO: {
            Macro *m = arena_alloc(&C->A, sizeof *m);
            m->def = n;
            m->closure = S;
            Value mv = { .t = V_MACRO };
            mv.m = m;
            S->slots[n->slot] = mv;
            break;
        }
        case S_WITH: {
            Value *vals = arena_alloc(&C->A, sizeof(Value) * (size_t)(n->nn ? n->nn : 1));
            for (int k = 0; k < n->nn; k++) vals[k] = eval(C, n->w[k], S);
            Frame *ws = frame_enter(C, n->fi[0], S);
            for (int k = 0; k < n->nn; k++) ws->slots[n->slots[k]] = vals[k];
            int r = exec_body(C, n->v, n->nv, ws);
            if (r != FLOW_NORMAL) return r;
            break;
        }
        case S_SCOPE: exec_body(C, n->v, n->nv, frame_enter(C, n->fi[0], S)); break;
        case S_GROUP: {
            int r = exec_body(C, n->v, n->nv, S);
            if (r != FLOW_NORMAL) return r;
            break;
        }
        case S_BREAK: return FLOW_BREAK;
        case S_CONTINUE: return FLOW_CONTINUE;
        default: rerr(C, "internal error: node kind %d is not a statement", n->kind);
        }
    }
    return FLOW_NORMAL;
}

/* ---- public API ---- */

ChatTemplate *chat_template_parse(const char *text, char *err, size_t errlen)
{
    Tmpl *t = tmpl_parse(text, strlen(text), err, errlen);
    if (!t) return NULL;
    ChatTemplate *ct = xcalloc(1, sizeof *ct);
    ct->def = t;
    return ct;
}

static void tmpl_free(Tmpl *t)
{
    if (!t) return;
    arena_free(&t->arena);
    free(t);
}

void chat_template_free(ChatTemplate *t)
{
    if (!t) return;
    tmpl_free(t->def);
    tmpl_free(t->tool_use);
    free(t);
}

ChatTemplate *chat_template_load(const char *model_dir, char *err, size_t errlen)
{
    char path[4096];
    size_t len;
    path_join(path, sizeof path, model_dir, "chat_template.jinja");
    if (file_exists(path)) {
        char *text = file_read_all(path, &len);
        if (!text) { errbuf_set(err, errlen, "%s: cannot read: %s", path, file_read_error(errno)); return NULL; }
        if (strlen(text) != len) {
            free(text);
            errbuf_set(err, errlen, "%s: contains a NUL byte", path);
            return NULL;
        }
        char e2[400];
        ChatTemplate *t = chat_template_parse(text, e2, sizeof e2);
        free(text);
        if (!t) errbuf_set(err, errlen, "%s: %s", path, e2);
        return t;
    }
    path_join(path, sizeof path, model_dir, "tokenizer_config.json");
    char e1[400];
    json_t *cfg = file_read_json(path, 0, e1, sizeof e1);
    if (!cfg) {
        if (!file_exists(path)) errbuf_set(err, errlen, "%s: no chat_template.jinja or tokenizer_config.json", model_dir);
        else errbuf_set(err, errlen, "%s: %s", path, e1);
        return NULL;
    }
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *def = NULL, *tool = NULL;
    if (json_is_string(ct)) {
        def = json_string_value(ct);
    } else if (json_is_array(ct)) { /* [{"name": ..., "template": ...}, ...] */
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            const char *tx = json_string_value(json_object_get(e, "template"));
            if (!name || !tx) continue;
            if (!strcmp(name, "default")) def = tx;
            else if (!strcmp(name, "tool_use")) tool = tx;
        }
        if (!def && !tool) {
            errbuf_set(err, errlen, "%s: chat_template is a list of named templates without \"default\"", path);
            json_decref(cfg);
            return NULL;
        }
    } else {
        if (ct && !json_is_null(ct)) errbuf_set(err, errlen, "%s: chat_template is %s, not a string or a list of named templates", path, json_kind(ct));
        else errbuf_set(err, errlen, "%s: no chat_template", path);
        json_decref(cfg);
        return NULL;
    }
    char e2[400];
    ChatTemplate *t = xcalloc(1, sizeof *t);
    int ok = (!def || (t->def = tmpl_parse(def, strlen(def), e2, sizeof e2))) &&
             (!tool || (t->tool_use = tmpl_parse(tool, strlen(tool), e2, sizeof e2)));
    if (!ok) {
        chat_template_free(t);
        t = NULL;
    }
    if (!t) errbuf_set(err, errlen, "%s: %s", path, e2);
    json_decref(cfg);
    return t;
}

int chat_template_render(const ChatTemplate *t, json_t *messages, json_t *tools, int add_generation_prompt,
                         json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                         char *err, size_t errlen)
{
    size_t len;
    return chat_template_render_n(t, messages, tools, add_generation_prompt, kwargs, bos_token, eos_token, out, &len,
                                  err, errlen);
}

int chat_template_render_n(const ChatTemplate *t, json_t *messages, json_t *tools, int add_generation_prompt,
                           json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                           size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    /* transformers' get_chat_template: "tool_use" when tools are given, else "default" */
    int have_tools = tools && !json_is_null(tools);
    const Tmpl *T = (have_tools && t->tool_use) ? t->tool_use : t->def;
    if (!T) {
        errbuf_set(err, errlen, "chat template: the model has a \"tool_use\" template but no \"default\" one, and no tools were given");
        return -1;
    }
    Ctx *C = xcalloc(1, sizeof *C);
    C->f.err = err;
    C->f.errlen = errlen;
    C->A.limit = RENDER_MEM_LIMIT;
    C->A.fail = &C->f;
    C->A.what = "the render";
    if (setjmp(C->f.jb)) {
        arena_free(&C->A);
        free(C);
        return -1;
    }
    if (!json_is_array(messages)) rerr(C, "messages must be a JSON array");
    if (tools && !json_is_array(tools) && !json_is_null(tools)) rerr(C, "tools must be a JSON array");
    if (kwargs && !json_is_object(kwargs) && !json_is_null(kwargs)) rerr(C, "chat_template_kwargs must be a JSON object");
    Dict *G = dict_new(C);
    /* transformers: render(messages=, tools=, documents=, add_generation_prompt=, **special_tokens, **kwargs) */
    dict_set(C, G, v_cstr("messages"), from_json(C, messages, 0));
    dict_set(C, G, v_cstr("tools"), have_tools ? from_json(C, tools, 0) : v_none());
    dict_set(C, G, v_cstr("documents"), v_none());
    dict_set(C, G, v_cstr("add_generation_prompt"), v_bool(add_generation_prompt));
    if (bos_token) dict_set(C, G, v_cstr("bos_token"), v_cstr(bos_token));
    if (eos_token) dict_set(C, G, v_cstr("eos_token"), v_cstr(eos_token));
    if (kwargs && json_is_object(kwargs)) {
        const char *key;
        json_t *val;
        json_object_foreach(kwargs, key, val) {
            if (!strcmp(key, "messages") || !strcmp(key, "tools") || !strcmp(key, "documents") ||
                !strcmp(key, "add_generation_prompt"))
                rerr(C, "chat_template_kwargs may not set '%s'", key);
            dict_set(C, G, v_cstr(key), from_json(C, val, 0));
        }
    }
    C->vars = G;
    Buf b = { 0 };
    C->out = &b;
    exec_body(C, T->root->v, T->root->nv, frame_enter(C, T->root->fi[0], NULL));
    char *res = xmalloc(b.n + 1);
    if (b.n) memcpy(res, b.p, b.n);
    res[b.n] = 0;
    *out = res;
    *out_len = b.n;
    arena_free(&C->A);
    free(C);
    return 0;
}
