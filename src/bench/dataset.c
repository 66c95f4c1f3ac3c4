/* dataset: the requests of `moeserve bench serve`, built before the run so that sending one costs
 * nothing but the send. Spelled as the peers spell them (the --dataset-name values of
 * `vllm bench serve` and `python -m sglang.bench_serving`):
 *   random-ids  token-id prompts (completions: "prompt" as an array of ints); needs no tokenizer
 *   random      text prompts of a known token length: random ids decoded and re-encoded to the
 *               target length (vLLM), or, with --dataset-path, ShareGPT prompts cut or repeated to
 *               it (SGLang); needs --tokenizer
 *   sharegpt    the first two turns of ShareGPT conversations (the JSON layout of
 *               ShareGPT_V3_unfiltered_cleaned_split.json), shuffled, filtered as vLLM does
 *   jsonl       one object a line: "prompt" (text or ids) or "text"/"question"/"turns"[0], and
 *               optionally "output_len"/"max_tokens"
 * Lengths of random prompts: SGLang draws from [max(L*r, 1), L]; --random-range-vllm draws from
 * [floor(L(1-r)), ceil(L(1+r))] as vLLM does. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"
#include "../format/tokenizer.h"
#include "bench_serve.h"

#define MAX_PROMPT_TOKENS (1 << 22)   /* bound on any prompt we build */

/* Words for prompts when there is no tokenizer to turn ids into text: common English words,
 * about one token each in any BPE vocabulary, so the length estimate is roughly right. */
static const char *const filler_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "system",
    "package", "file", "data", "value", "number", "small", "large", "water", "house", "world",
    "music", "light", "river",
};
#define N_FILLER ((int)(sizeof filler_words / sizeof filler_words[0]))

/* ---- helpers ---- */

static long rng_range(Rng *r, long lo, long hi) /* inclusive */
{
    if (hi <= lo) return lo;
    return lo + (long)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}

static void lens_draw(const DatasetOptions *o, int full, int *lo, int *hi)
{
    if (o->range_vllm) {
        *lo = (int)floor(full * (1.0 - o->range_ratio));
        *hi = (int)ceil(full * (1.0 + o->range_ratio));
    } else {
        *lo = (int)(full * o->range_ratio);
        *hi = full;
    }
    if (*lo < 1) *lo = 1;
    if (*hi < *lo) *hi = *lo;
}

static char *filler_text(const int *ids, int n)
{
    size_t cap = (size_t)n * 9 + 1, len = 0;
    char *s = xmalloc(cap);
    for (int i = 0; i < n; i++) {
        const char *w = filler_words[(unsigned)ids[i] % N_FILLER];
        len += snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
    }
    s[len] = 0;
    return s;
}

static int estimate_tokens(const char *s) { return (int)((strlen(s) + 3) / 4); }

static int count_tokens(const Tokenizer *t, const char *s)
{
    int *ids = NULL;
    char err[256];
    int n = tokenizer_encode(t, s, strlen(s), 0, &ids, err, sizeof err);
    free(ids);
    return n < 0 ? estimate_tokens(s) : n;
}

/* The body of one request: prompt as text (text != NULL) or as ids. */
static char *body_make(const DatasetOptions *o, const char *text, const int *ids, int n_ids, int out, size_t *len)
{
    json_t *b = json_object();
    json_object_set_new(b, "model", json_string(o->model ? o->model : ""));
    if (o->api == API_COMPLETIONS) {
        if (text) json_object_set_new(b, "prompt", json_string(text));
        else {
            json_t *a = json_array();
            for (int i = 0; i < n_ids; i++) json_array_append_new(a, json_integer(ids[i]));
            json_object_set_new(b, "prompt", a);
        }
        json_object_set_new(b, "max_tokens", json_integer(out));
    } else {
        json_t *msg = json_object(), *msgs = json_array();
        json_object_set_new(msg, "role", json_string("user"));
        json_object_set_new(msg, "content", json_string(text ? text : ""));
        json_array_append_new(msgs, msg);
        json_object_set_new(b, "messages", msgs);
        /* both spellings: older servers read max_tokens, the current API max_completion_tokens */
        json_object_set_new(b, "max_tokens", json_integer(out));
        json_object_set_new(b, "max_completion_tokens", json_integer(out));
    }
    if (o->temperature >= 0) json_object_set_new(b, "temperature", json_real(o->temperature));
    if (o->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    json_object_set_new(b, "stream", json_true());
    json_t *so = json_object();
    json_object_set_new(so, "include_usage", json_true());
    json_object_set_new(b, "stream_options", so);
    if (o->extra_body) {
        json_error_t e;
        json_t *x = json_loads(o->extra_body, 0, &e);
        if (!x || !json_is_object(x)) fatal("bench serve: --extra-body is not a JSON object: %s", x ? "not an object" : e.text);
        json_object_update(b, x);
        json_decref(x);
    }
    char *s = json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(b);
    if (!s) die("json_dumps failed (a prompt that is not UTF-8?)");
    *len = strlen(s);
    return s;
}

static void push(Dataset *d, int *cap, char *body, size_t body_len, int prompt_len, int out)
{
    if (d->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        d->reqs = xrealloc(d->reqs, (size_t)*cap * sizeof *d->reqs);
    }
    d->reqs[d->n++] = (BenchRequest){body, body_len, prompt_len, out};
}

/* Ids that are ordinary tokens: [0, vocab) less the special ones (the tokenizer's), else
 * [0, --random-vocab-size). */
static int *allowed_ids(const DatasetOptions *o, int *n)
{
    int v = o->tok ? tokenizer_vocab_size(o->tok) : o->vocab;
    int *a = xmalloc((size_t)(v > 0 ? v : 1) * sizeof *a), k = 0;
    for (int i = 0; i < v; i++)
        if (!o->tok || (!tokenizer_is_special(o->tok, i) && tokenizer_token(o->tok, i))) a[k++] = i;
    if (k == 0) fatal("bench serve: the vocabulary has no ordinary tokens");
    *n = k;
    return a;
}

/* vLLM's random prompt: ids decoded to text, re-encoded, cut to the target and decoded again so
 * that the text encodes to (about) target tokens. Returns the text; *len its token count. */
static char *decode_to_len(const Tokenizer *t, int *ids, int n, int *len)
{
    char *text;
    size_t tl;
    tokenizer_decode(t, ids, n, 0, &text, &tl);
    for (int tries = 0; tries < 4; tries++) {
        int *re = NULL;
        char err[256];
        int m = tokenizer_encode(t, text, tl, 0, &re, err, sizeof err);
        if (m < 0) fatal("bench serve: re-encoding a random prompt: %s", err);
        if (m <= n) { free(re); *len = m; return text; }
        free(text);
        tokenizer_decode(t, re, n, 0, &text, &tl);
        free(re);
    }
    *len = count_tokens(t, text);
    return text;
}

/* ---- the datasets ---- */

static void build_random(Dataset *d, const DatasetOptions *o, Rng *r, int text_prompts)
{
    int n_allowed, *allowed = allowed_ids(o, &n_allowed), cap = 0;
    int ilo, ihi, olo, ohi;
    lens_draw(o, o->input_len, &ilo, &ihi);
    lens_draw(o, o->output_len, &olo, &ohi);
    if (ihi > MAX_PROMPT_TOKENS) fatal("bench serve: --random-input-len %d is too large", o->input_len);
    int *ids = xmalloc((size_t)ihi * sizeof *ids);
    d->prompt_len_exact = 1;
    for (int i = 0; i < o->num_prompts; i++) {
        int in = (int)rng_range(r, ilo, ihi), out = (int)rng_range(r, olo, ohi);
        long off = rng_range(r, 0, n_allowed - 1);
        for (int j = 0; j < in; j++) ids[j] = allowed[(off + i + j) % n_allowed];
        size_t bl;
        char *body;
        if (!text_prompts && o->api == API_COMPLETIONS) {
            body = body_make(o, NULL, ids, in, out, &bl);
        } else if (o->tok) {
            int len;
            char *text = decode_to_len(o->tok, ids, in, &len);
            body = body_make(o, text, NULL, 0, out, &bl);
            free(text);
            in = len;
        } else {
            /* random-ids on the chat API without a tokenizer: chat carries text only */
            char *text = filler_text(ids, in);
            body = body_make(o, text, NULL, 0, out, &bl);
            free(text);
            d->prompt_len_exact = 0;
        }
        push(d, &cap, body, bl, in, out);
    }
    free(ids);
    free(allowed);
}

typedef struct { const char *prompt, *completion; } Pair;

static Pair *sharegpt_pairs(json_t *root, const char *path, int *n)
{
    if (!json_is_array(root)) fatal("bench serve: %s: not a ShareGPT file (a JSON array of conversations)", path);
    size_t m = json_array_size(root);
    Pair *p = xmalloc((m ? m : 1) * sizeof *p);
    int k = 0;
    for (size_t i = 0; i < m; i++) {
        json_t *e = json_array_get(root, i);
        json_t *c = json_object_get(e, "conversations");
        if (!c) c = json_object_get(e, "conversation");
        if (!json_is_array(c) || json_array_size(c) < 2) continue;
        const char *a = json_string_value(json_object_get(json_array_get(c, 0), "value"));
        const char *b = json_string_value(json_object_get(json_array_get(c, 1), "value"));
        if (!a || !b) continue;
        p[k++] = (Pair){a, b};
    }
    *n = k;
    return p;
}

static void shuffle(Pair *p, int n, Rng *r)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_range(r, 0, i);
        Pair t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* A dataset file: a regular file (a FIFO would wait for a writer, a device never end) of any
 * size (ShareGPT's is 642 MB, over file_read_all's limit). */
static int open_dataset(const char *path)
{
    int fd = file_open_regular(path);
    if (fd < 0) fatal("bench serve: cannot open %s: %s", path, file_read_error(errno));
    return fd;
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    int fd = open_dataset(path);
    json_t *root = json_loadfd(fd, 0, &e);
    close(fd);
    if (!root) fatal("bench serve: %s: line %d: %s", path, e.line, e.text);
    return root;
}

/* SGLang's random: ShareGPT prompts, tokenized, cut or repeated to the drawn length. */
static void build_random_sharegpt(Dataset *d, const DatasetOptions *o, Rng *r)
{
    json_t *root = load_json(o->path);
    int np, cap = 0, ilo, ihi, olo, ohi;
    Pair *p = sharegpt_pairs(root, o->path, &np);
    if (np == 0) fatal("bench serve: %s: no conversation with two turns", o->path);
    shuffle(p, np, r);
    lens_draw(o, o->input_len, &ilo, &ihi);
    lens_draw(o, o->output_len, &olo, &ohi);
    int *buf = xmalloc((size_t)ihi * sizeof *buf);
    d->prompt_len_exact = 1;
    for (int i = 0, k = 0; i < o->num_prompts; k++) {
        if (k >= np * 2 && i == 0) fatal("bench serve: %s: no prompt tokenizes to anything", o->path);
        int *ids = NULL;
        char err[256];
        int m = tokenizer_encode(o->tok, p[k % np].prompt, strlen(p[k % np].prompt), 0, &ids, err, sizeof err);
        if (m <= 0) { free(ids); continue; }
        int in = (int)rng_range(r, ilo, ihi), out = (int)rng_range(r, olo, ohi);
        for (int j = 0; j < in; j++) buf[j] = ids[j % m];
        free(ids);
        char *text;
        size_t tl, bl;
        tokenizer_decode(o->tok, buf, in, 0, &text, &tl);
        char *body = body_make(o, text, NULL, 0, out, &bl);
        free(text);
        push(d, &cap, body, bl, in, out);
        i++;
    }
    free(buf);
    free(p);
    json_decref(root);
}

static void build_sharegpt(Dataset *d, const DatasetOptions *o, Rng *r)
{
    json_t *root = load_json(o->path);
    int np, cap = 0;
    Pair *p = sharegpt_pairs(root, o->path, &np);
    shuffle(p, np, r);
    d->prompt_len_exact = o->tok != NULL;
    int first_n = -1;
    /* vLLM's filter: prompt and output of at least 4 tokens; without a fixed output length, a
     * prompt of at most 1024 and a total of at most 2048 tokens. Too few valid: cycle (vLLM
     * oversamples the same way). */
    for (int k = 0; d->n < o->num_prompts; k++) {
        if (k == np) {
            if (d->n == 0) fatal("bench serve: %s: no usable conversation", o->path);
            first_n = d->n;
        }
        if (first_n >= 0) {
            const BenchRequest *src = &d->reqs[(k - np) % first_n];
            char *b = xstrdup(src->body);
            push(d, &cap, b, src->body_len, src->prompt_len, src->output_len);
            continue;
        }
        const char *pr = p[k].prompt, *co = p[k].completion;
        int pl = o->tok ? count_tokens(o->tok, pr) : estimate_tokens(pr);
        int ol = o->fixed_output_len ? o->fixed_output_len : (o->tok ? count_tokens(o->tok, co) : estimate_tokens(co));
        if (pl < 4 || ol < 4) continue;
        if (!o->fixed_output_len && (pl > 1024 || pl + ol > 2048)) continue;
        size_t bl;
        char *body = body_make(o, pr, NULL, 0, ol, &bl);
        push(d, &cap, body, bl, pl, ol);
    }
    free(p);
    json_decref(root);
}

static const char *jsonl_prompt(json_t *e)
{
    static const char *const keys[] = {"prompt", "text", "question", "input"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *s = json_string_value(json_object_get(e, keys[i]));
        if (s) return s;
    }
    json_t *turns = json_object_get(e, "turns");
    if (json_is_array(turns)) return json_string_value(json_array_get(turns, 0));
    return NULL;
}

static void build_jsonl(Dataset *d, const DatasetOptions *o, Rng *r)
{
    FILE *f = fdopen(open_dataset(o->path), "r");
    if (!f) fatal("bench serve: cannot open %s: %s", o->path, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int cap = 0, lineno = 0, exact = 1;
    Dataset all = {0};
    int acap = 0;
    while ((got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        if (got <= 1) continue;
        json_error_t e;
        json_t *x = json_loads(line, 0, &e);
        if (!x || !json_is_object(x)) fatal("bench serve: %s:%d: not a JSON object%s%s", o->path, lineno, x ? "" : ": ", x ? "" : e.text);
        int out = o->fixed_output_len;
        if (!out) {
            json_t *v = json_object_get(x, "output_len");
            if (!v) v = json_object_get(x, "max_tokens");
            out = json_is_integer(v) ? (int)json_integer_value(v) : 256;
        }
        if (out < 1 || out > MAX_PROMPT_TOKENS) fatal("bench serve: %s:%d: output length %d out of range", o->path, lineno, out);
        json_t *pv = json_object_get(x, "prompt");
        size_t bl;
        char *body;
        int pl;
        if (json_is_array(pv)) {
            int n = (int)json_array_size(pv);
            if (n > MAX_PROMPT_TOKENS) fatal("bench serve: %s:%d: prompt too long", o->path, lineno);
            int *ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
            for (int i = 0; i < n; i++) {
                json_t *t = json_array_get(pv, i);
                if (!json_is_integer(t)) fatal("bench serve: %s:%d: prompt ids must be integers", o->path, lineno);
                ids[i] = (int)json_integer_value(t);
            }
            if (o->api == API_CHAT) fatal("bench serve: %s:%d: token-id prompts need --backend openai-completions", o->path, lineno);
            body = body_make(o, NULL, ids, n, out, &bl);
            pl = n;
            free(ids);
        } else {
            const char *s = jsonl_prompt(x);
            if (!s) fatal("bench serve: %s:%d: no \"prompt\" (or \"text\", \"question\", \"turns\")", o->path, lineno);
            body = body_make(o, s, NULL, 0, out, &bl);
            pl = o->tok ? count_tokens(o->tok, s) : estimate_tokens(s);
            if (!o->tok) exact = 0;
        }
        push(&all, &acap, body, bl, pl, out);
        json_decref(x);
    }
    free(line);
    fclose(f);
    if (all.n == 0) fatal("bench serve: %s: no requests", o->path);
    /* shuffle the order, then take num_prompts, cycling when the file is shorter */
    for (int i = all.n - 1; i > 0; i--) {
        int j = (int)rng_range(r, 0, i);
        BenchRequest t = all.reqs[i];
        all.reqs[i] = all.reqs[j];
        all.reqs[j] = t;
    }
    for (int i = 0; i < o->num_prompts; i++) {
        const BenchRequest *s = &all.reqs[i % all.n];
        push(d, &cap, xstrdup(s->body), s->body_len, s->prompt_len, s->output_len);
    }
    d->prompt_len_exact = exact;
    dataset_free(&all);
}

/* ---- public API ---- */

void dataset_build(Dataset *d, const DatasetOptions *o)
{
    memset(d, 0, sizeof *d);
    Rng r;
    rng_seed(&r, o->seed * 0x9E3779B97F4A7C15ull + 1);
    if (!strcmp(o->name, "random-ids")) {
        build_random(d, o, &r, 0);
    } else if (!strcmp(o->name, "random")) {
        if (!o->tok) fatal("bench serve: --dataset-name random needs --tokenizer (or use random-ids, which needs none)");
        if (o->path) build_random_sharegpt(d, o, &r);
        else build_random(d, o, &r, 1);
    } else if (!strcmp(o->name, "sharegpt")) {
        if (!o->path) fatal("bench serve: --dataset-name sharegpt needs --dataset-path FILE.json");
        if (!o->tok) log_warn("bench serve: no --tokenizer: ShareGPT lengths are estimated as bytes/4");
        build_sharegpt(d, o, &r);
    } else if (!strcmp(o->name, "jsonl")) {
        if (!o->path) fatal("bench serve: --dataset-name jsonl needs --dataset-path FILE.jsonl");
        build_jsonl(d, o, &r);
    } else {
        fatal("bench serve: unknown --dataset-name '%s' (random, random-ids, sharegpt, jsonl)", o->name);
    }
}

char *dataset_body_set_max_tokens(const char *body, int out, size_t *len)
{
    json_t *b = json_loads(body, 0, NULL);
    if (!b) die("a request body we built does not parse");
    json_object_set_new(b, "max_tokens", json_integer(out));
    if (json_object_get(b, "max_completion_tokens")) json_object_set_new(b, "max_completion_tokens", json_integer(out));
    char *s = json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(b);
    *len = strlen(s);
    return s;
}

void dataset_free(Dataset *d)
{
    for (int i = 0; i < d->n; i++) free(d->reqs[i].body);
    free(d->reqs);
    memset(d, 0, sizeof *d);
}
