/* hub: the Hugging Face Hub's file API over libcurl, into huggingface_hub's cache layout (hub.h).
 *
 * A fetch: GET /api/models/{repo}/revision/{rev} gives the commit ("sha") and the file list
 * ("siblings"); for each wanted file whose snapshot link is missing, HEAD
 * /{repo}/resolve/{commit}/{file} gives its ETag (X-Linked-Etag on a redirect to a large file's
 * storage), its size (X-Linked-Size or Content-Length) and where to GET it; the blob is written to
 * blobs/<etag>.incomplete (continued with a Range request when one is there), its SHA-256
 * checked against the ETag when the ETag is one (a large LFS file), renamed into place, then
 * linked. refs/<rev> is written once every wanted file is in: a ref only ever names a commit
 * whose files were all fetched. */
#include "hub.h"

#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../base/util.h"
#include "sha256.h"

#define HUB_PATH 4096
#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"

/* snprintf that leaves "" (errno ENAMETOOLONG) rather than a cut string, which as a path could
 * name another file; returns 0, or -1 when it did not fit */
static int fmt(char *out, size_t n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static int fmt(char *out, size_t n, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int r = vsnprintf(out, n, f, ap);
    va_end(ap);
    if (r >= 0 && (size_t)r < n) return 0;
    if (n) out[0] = 0;
    errno = ENAMETOOLONG;
    return -1;
}

/* ---- the environment ---- */

static int env_true(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* v with a leading "~/" made $HOME's */
static void expand_home(char *out, size_t n, const char *v)
{
    const char *home = getenv("HOME");
    if (v[0] == '~' && (v[1] == '/' || !v[1]) && home) fmt(out, n, "%s%s", home, v + 1);
    else fmt(out, n, "%s", v);
}

static void hf_home(char *out, size_t n)
{
    const char *v = env_nonempty("HF_HOME");
    if (v) { expand_home(out, n, v); return; }
    char base[HUB_PATH];
    v = env_nonempty("XDG_CACHE_HOME");
    if (v) expand_home(base, sizeof base, v);
    else expand_home(base, sizeof base, "~/.cache");
    fmt(out, n, "%s/huggingface", base);
}

void hub_cache_dir(char *out, size_t n)
{
    const char *v = env_nonempty("HF_HUB_CACHE");
    if (!v) v = env_nonempty("HUGGINGFACE_HUB_CACHE");
    if (v) { expand_home(out, n, v); return; }
    char home[HUB_PATH];
    hf_home(home, sizeof home);
    fmt(out, n, "%s/hub", home);
}

static int hub_offline(void) { return env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE"); }

static void hub_endpoint(char *out, size_t n)
{
    const char *v = env_nonempty("HF_ENDPOINT");
    fmt(out, n, "%s", v ? v : HUB_DEFAULT_ENDPOINT);
    size_t l = strlen(out);
    while (l > 0 && out[l - 1] == '/') out[--l] = 0;
}

/* $HF_TOKEN, else the legacy $HUGGING_FACE_HUB_TOKEN, else the first line of the token file that
 * `hf auth login` writes; "" when none. */
static void hub_token(char *out, size_t n)
{
    out[0] = 0;
    const char *v = env_nonempty("HF_TOKEN");
    if (!v) v = env_nonempty("HUGGING_FACE_HUB_TOKEN");
    if (v) fmt(out, n, "%s", v);
    else {
        char path[HUB_PATH], home[HUB_PATH];
        const char *p = env_nonempty("HF_TOKEN_PATH");
        if (p) expand_home(path, sizeof path, p);
        else {
            hf_home(home, sizeof home);
            fmt(path, sizeof path, "%s/token", home);
        }
        size_t len;
        char *s = file_exists(path) ? file_read_all(path, &len) : NULL;
        if (s) fmt(out, n, "%s", s);
        free(s);
    }
    /* the token alone: no surrounding blanks, nothing after its first line */
    size_t b = strspn(out, " \t\r\n");
    memmove(out, out + b, strlen(out + b) + 1);
    out[strcspn(out, "\r\n")] = 0;
    for (size_t l = strlen(out); l > 0 && (out[l - 1] == ' ' || out[l - 1] == '\t'); l--) out[l - 1] = 0;
}

/* ---- names ---- */

static int name_part_valid(const char *s, size_t n)
{
    if (n == 0 || n > 96) return 0;
    if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return 0;
        if (i > 0 && ((s[i] == '-' && s[i - 1] == '-') || (s[i] == '.' && s[i - 1] == '.'))) return 0;
    }
    return 1;
}

int hub_repo_id_valid(const char *id)
{
    const char *slash = strchr(id, '/');
    if (!slash) return name_part_valid(id, strlen(id));
    return !strchr(slash + 1, '/') && name_part_valid(id, (size_t)(slash - id)) &&
           name_part_valid(slash + 1, strlen(slash + 1));
}

static int is_commit(const char *s)
{
    if (strlen(s) != 40) return 0;
    for (int i = 0; i < 40; i++)
        if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) return 0;
    return 1;
}

static int is_sha256_hex(const char *s)
{
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

/* A path inside the repository that may be written under snapshots/<commit>/: relative, no ".",
 * ".." or empty component, no backslash or control character (the Hub's list is input). */
static int repo_path_safe(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > 1024 || p[0] == '/') return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == '\\' || p[i] == 0x7f) return 0;
    for (const char *c = p;;) {
        size_t l = strcspn(c, "/");
        if (l == 0 || (l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!c[l]) return 1;
        c += l + 1;
    }
}

/* A revision as refs/<revision> may hold it: a branch or tag ("main", "v1.0", "refs/pr/1"). */
static int revision_safe(const char *r) { return strlen(r) <= 255 && repo_path_safe(r); }

/* A blob name from an ETag: W/ and quotes dropped, then nothing a file name could misuse. */
static int etag_normalize(const char *in, char *out, size_t n)
{
    const char *s = in;
    if (!strncmp(s, "W/", 2)) s += 2;
    size_t l = strlen(s);
    while (l > 0 && *s == '"') s++, l--;
    while (l > 0 && s[l - 1] == '"') l--;
    if (l == 0 || l >= n || l > 128 || s[0] == '.') return -1;
    for (size_t i = 0; i < l; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return -1;
    memcpy(out, s, l);
    out[l] = 0;
    return 0;
}

/* Percent-encoding as the Hub's URLs want it: unreserved characters kept, and '/' where keep_slash. */
static void url_quote(char *out, size_t n, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s && o + 4 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (c == '/' && keep_slash)) out[o++] = (char)c;
        else out[o++] = '%', out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
    }
    out[o] = 0;
}

/* scheme://host[:port] of an absolute URL, the port made explicit, lowercased; "" if none. */
static void url_origin(const char *url, char *out, size_t n)
{
    out[0] = 0;
    const char *p = strstr(url, "://");
    if (!p) return;
    size_t sl = (size_t)(p - url);
    const char *h = p + 3, *e = h + strcspn(h, "/?#");
    const char *at = memchr(h, '@', (size_t)(e - h));
    if (at) h = at + 1;
    const char *colon = memrchr(h, ':', (size_t)(e - h));
    if (colon && memchr(h, ']', (size_t)(e - h)) > (void *)colon) colon = NULL; /* an IPv6 literal's */
    char scheme[16];
    fmt(scheme, sizeof scheme, "%.*s", (int)(sl < 15 ? sl : 15), url);
    for (char *c = scheme; *c; c++) *c = (char)tolower((unsigned char)*c);
    const char *port = colon ? colon + 1 : !strcmp(scheme, "https") ? "443" : "80";
    int hl = (int)((colon ? colon : e) - h), pl = colon ? (int)(e - port) : (int)strlen(port);
    fmt(out, n, "%s://%.*s:%.*s", scheme, hl, h, pl, port);
    for (char *c = out; *c; c++) *c = (char)tolower((unsigned char)*c);
}

/* A Location header against the URL that answered it: absolute as it is, else on base's origin. */
static void url_join(char *out, size_t n, const char *base, const char *loc)
{
    if (strstr(loc, "://")) { fmt(out, n, "%s", loc); return; }
    const char *p = strstr(base, "://");
    const char *h = p ? p + 3 : base;
    size_t ol = (size_t)(h - base) + strcspn(h, "/?#");
    if (loc[0] == '/' && loc[1] == '/') {   /* scheme-relative */
        fmt(out, n, "%.*s%s", (int)(h - base - 2), base, loc);
        return;
    }
    if (loc[0] == '/') { fmt(out, n, "%.*s%s", (int)ol, base, loc); return; }
    /* relative to base's directory */
    const char *q = base + ol + strcspn(base + ol, "?#");
    const char *slash = memrchr(base + ol, '/', (size_t)(q - (base + ol)));
    size_t keep = slash ? (size_t)(slash - base) + 1 : ol;
    fmt(out, n, "%.*s%s%s", (int)keep, base, slash ? "" : "/", loc);
}

/* ---- files ---- */

static int mkdir_p(const char *path)
{
    char buf[HUB_PATH];
    fmt(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) && errno != EEXIST) return -1;
    struct stat st;
    if (stat(buf, &st) || !S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

static int mkdir_parent(const char *path)
{
    char buf[HUB_PATH];
    fmt(buf, sizeof buf, "%s", path);
    char *s = strrchr(buf, '/');
    if (!s || s == buf) return 0;
    *s = 0;
    return mkdir_p(buf);
}

/* path (whose parent exists) holds text, replaced at once: a reader sees the old or the new one */
static int write_atomic(const char *path, const char *text)
{
    char tmp[HUB_PATH + 32];
    fmt(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    int e = errno;
    if (close(fd)) ok = 0, e = errno;
    if (!ok || rename(tmp, path)) {
        if (ok) e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

/* A regular file (through links) */
static int is_file(const char *path)
{
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

static int is_dir(const char *path)
{
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

static void human_bytes(char *out, size_t n, double b)
{
    static const char *u[] = {"B", "kB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    fmt(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* ---- HTTP ---- */

typedef struct {
    long status;
    char commit[64], etag[256], linked_etag[256], error_code[64], error_message[512], content_range[128];
    char location[HUB_PATH];
    long long linked_size, content_length; /* -1: not given */
} Resp;

/* Where a response body goes: memory (the API's JSON, an error's text) or a blob's .incomplete. */
typedef struct Hub Hub;
typedef struct {
    Hub *h;
    Resp r;
    char *mem;
    size_t mlen, mmax;
    /* the file */
    int fd;
    long long offset, start;  /* bytes in the file now; when this response began */
    int hashing, first, write_errno, range_bad;
    Sha256 sha;
} Sink;

struct Hub {
    CURL *c;
    char endpoint[1024], origin[1100], token[2048];
    char curl_err[CURL_ERROR_SIZE];
    /* progress */
    int progress, tty;
    const char *file;
    int file_i, n_files;
    long long file_size, file_done, bytes;
    double t0, last_draw;
    int drawn;
};

static void resp_reset(Resp *r)
{
    memset(r, 0, sizeof *r);
    r->linked_size = r->content_length = -1;
}

static void header_value(char *out, size_t n, const char *v, size_t len)
{
    while (len > 0 && (*v == ' ' || *v == '\t')) v++, len--;
    while (len > 0 && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    fmt(out, n, "%.*s", (int)(len < n - 1 ? len : n - 1), v);
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *arg)
{
    Sink *s = arg;
    size_t n = size * nitems;
    if (n > 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response (after a redirect, or a 100) */
        resp_reset(&s->r);
        const char *sp = memchr(buf, ' ', n);
        if (sp) s->r.status = strtol(sp + 1, NULL, 10);
        return n;
    }
    const char *colon = memchr(buf, ':', n);
    if (!colon) return n;
    size_t kl = (size_t)(colon - buf), vl = n - kl - 1;
    const char *v = colon + 1;
    char tmp[64];
#define IS(name) (kl == strlen(name) && !strncasecmp(buf, name, kl))
    if (IS("X-Repo-Commit")) header_value(s->r.commit, sizeof s->r.commit, v, vl);
    else if (IS("ETag")) header_value(s->r.etag, sizeof s->r.etag, v, vl);
    else if (IS("X-Linked-Etag")) header_value(s->r.linked_etag, sizeof s->r.linked_etag, v, vl);
    else if (IS("X-Error-Code")) header_value(s->r.error_code, sizeof s->r.error_code, v, vl);
    else if (IS("X-Error-Message")) header_value(s->r.error_message, sizeof s->r.error_message, v, vl);
    else if (IS("Location")) header_value(s->r.location, sizeof s->r.location, v, vl);
    else if (IS("Content-Range")) header_value(s->r.content_range, sizeof s->r.content_range, v, vl);
    else if (IS("X-Linked-Size")) {
        header_value(tmp, sizeof tmp, v, vl);
        s->r.linked_size = strtoll(tmp, NULL, 10);
    } else if (IS("Content-Length")) {
        header_value(tmp, sizeof tmp, v, vl);
        s->r.content_length = strtoll(tmp, NULL, 10);
    }
#undef IS
    return n;
}

static void progress_draw(Hub *h)
{
    if (!h->progress || !h->tty || log_level < LOG_INFO) return;
    double now = clock_now();
    if (now - h->last_draw < 0.25) return; /* a few updates a second at most */
    h->last_draw = now;
    char done[32], size[32] = "?", rate[32];
    human_bytes(done, sizeof done, (double)h->file_done);
    double dt = now - h->t0;
    human_bytes(rate, sizeof rate, dt > 0 ? (double)h->bytes / dt : 0);
    if (h->file_size >= 0) human_bytes(size, sizeof size, (double)h->file_size);
    int pct = h->file_size > 0 ? (int)(100 * h->file_done / h->file_size) : 100;
    fprintf(stderr, "\r[%d/%d] %.60s  %s / %s (%d%%)  %s/s\033[K", h->file_i, h->n_files, h->file ? h->file : "",
            done, size, pct, rate);
    h->drawn = 1;
    fflush(stderr);
}

static void progress_end(Hub *h)
{
    if (h->drawn) fprintf(stderr, "\r\033[K");
    h->drawn = 0;
}

static size_t on_body(char *buf, size_t size, size_t nmemb, void *arg)
{
    Sink *s = arg;
    size_t n = size * nmemb;
    if (s->fd < 0 || s->r.status >= 300) { /* JSON, or an error's text: kept up to mmax */
        if (!s->mem) return n;
        size_t take = s->mlen + n > s->mmax ? s->mmax - s->mlen : n;
        memcpy(s->mem + s->mlen, buf, take);
        s->mlen += take;
        s->mem[s->mlen] = 0;
        if (s->fd < 0 && take < n) return 0; /* the API's answer must be whole */
        return n;
    }
    if (s->first) {
        s->first = 0;
        if (s->r.status == 200 && s->start > 0) { /* the server ignored the Range: start over */
            if (ftruncate(s->fd, 0)) { s->write_errno = errno; return 0; }
            s->offset = s->start = 0;
            sha256_init(&s->sha);
        } else if (s->r.status == 206) { /* it must continue where the file ends */
            long long a = -1;
            if (sscanf(s->r.content_range, "bytes %lld-", &a) != 1 || a != s->offset) { s->range_bad = 1; return 0; }
        }
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(s->fd, buf + done, n - done, (off_t)s->offset);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { s->write_errno = w < 0 ? errno : ENOSPC; return 0; }
        if (s->hashing) sha256_update(&s->sha, buf + done, (size_t)w);
        done += (size_t)w;
        s->offset += w;
        s->h->bytes += w;
    }
    s->h->file_done = s->offset;
    progress_draw(s->h);
    return n;
}

/* One request, no redirect followed unless follow; the body into s. Returns curl's code. */
static CURLcode http_do(Hub *h, const char *method, const char *url, int auth, int follow, Sink *s)
{
    CURL *c = h->c;
    curl_easy_reset(c);
    resp_reset(&s->r);
    s->h = h;
    s->first = 1;
    h->curl_err[0] = 0;
    struct curl_slist *hd = NULL;
    char line[2200];
    if (auth && h->token[0]) {
        fmt(line, sizeof line, "Authorization: Bearer %s", h->token);
        hd = curl_slist_append(hd, line);
    }
    hd = curl_slist_append(hd, "Accept-Encoding: identity"); /* sizes are the files' own */
    if (s->fd >= 0 && s->offset > 0) {
        fmt(line, sizeof line, "Range: bytes=%lld-", s->offset);
        hd = curl_slist_append(hd, line);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "moeserve (huggingface_hub cache layout)");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled transfer ends (and resumes) */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->curl_err);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(hd);
    return rc;
}

static const char *curl_why(Hub *h, CURLcode rc) { return h->curl_err[0] ? h->curl_err : curl_easy_strerror(rc); }

/* The "error" of the Hub's JSON error body, else the body's first line. */
static void body_message(const Sink *s, char *out, size_t n)
{
    out[0] = 0;
    if (!s->mem || !s->mlen) return;
    json_t *j = json_loadb(s->mem, s->mlen, 0, NULL);
    const char *e = j ? json_string_value(json_object_get(j, "error")) : NULL;
    if (e) fmt(out, n, "%s", e);
    else if (!j) fmt(out, n, "%.*s", (int)strcspn(s->mem, "\r\n"), s->mem);
    json_decref(j);
}

typedef enum { HE_OTHER, HE_REVISION, HE_ENTRY } HttpErrKind;

/* An HTTP error answer of the Hub as a sentence naming its cause. what: the repository's or the
 * file's name. */
static HttpErrKind http_error(Hub *h, const Sink *s, const char *repo, const char *rev, const char *file, char *err,
                              size_t errlen)
{
    char msg[600];
    fmt(msg, sizeof msg, "%s", s->r.error_message);
    if (!msg[0]) body_message(s, msg, sizeof msg);
    const char *code = s->r.error_code;
    long st = s->r.status;
    if (!strcmp(code, "GatedRepo")) {
        errbuf_set(err, errlen, "%s is a gated repository (HTTP %ld%s%s): accept its conditions at %s/%s and %s", repo,
                   st, msg[0] ? ": " : "", msg, h->endpoint, repo,
                   h->token[0] ? "use a token (HF_TOKEN) of an account that has access"
                               : "set HF_TOKEN to a token of an account with access");
        return HE_OTHER;
    }
    if (!strcmp(code, "RevisionNotFound")) {
        errbuf_set(err, errlen, "revision '%s' not found in %s (HTTP %ld)", rev, repo, st);
        return HE_REVISION;
    }
    if (!strcmp(code, "EntryNotFound") || (file && st == 404 && strcmp(code, "RepoNotFound"))) {
        errbuf_set(err, errlen, "file %s not found in %s at %s (HTTP %ld)", file ? file : "?", repo, rev, st);
        return HE_ENTRY;
    }
    if (st == 401 && h->token[0] && strcmp(code, "RepoNotFound")) {
        errbuf_set(err, errlen, "the token was refused by %s (HTTP 401%s%s): check HF_TOKEN (or %s)", h->endpoint,
                   msg[0] ? ": " : "", msg, "the token file of `hf auth login`");
        return HE_OTHER;
    }
    if (!strcmp(code, "RepoNotFound") || st == 401 || st == 404) {
        errbuf_set(err, errlen, "repository %s not found on %s (HTTP %ld)%s", repo, h->endpoint, st,
                   h->token[0] ? "; if it is private, the token (HF_TOKEN) must give access to it"
                               : "; if it is private or gated, set HF_TOKEN");
        return HE_OTHER;
    }
    if (st == 403)
        errbuf_set(err, errlen, "%s refused access to %s (HTTP 403%s%s)", h->endpoint, file ? file : repo,
                   msg[0] ? ": " : "", msg);
    else
        errbuf_set(err, errlen, "%s answered HTTP %ld for %s%s%s", h->endpoint, st, file ? file : repo,
                   msg[0] ? ": " : "", msg);
    return HE_OTHER;
}

/* ---- the cache ---- */

typedef struct {
    char repo[200], rev[256];
    char cache[HUB_PATH], storage[HUB_PATH];
} Where;

/* What an offline answer needs: the snapshot of rev (a commit, or the one refs/<rev> names) with
 * the wanted files in it. 0 with dir set, or -1 with err saying what is missing. */
static int from_cache(const Where *w, const HubRequest *rq, char *dir, size_t dirlen, HubResult *res, char *err,
                      size_t errlen)
{
    char commit[64] = "", path[HUB_PATH * 2];
    if (is_commit(w->rev)) fmt(commit, sizeof commit, "%s", w->rev);
    else {
        fmt(path, sizeof path, "%s/refs/%s", w->storage, w->rev);
        size_t len;
        char *s = is_file(path) ? file_read_all(path, &len) : NULL;
        if (s) header_value(commit, sizeof commit, s, strlen(s));
        free(s);
        if (!is_commit(commit)) {
            errbuf_set(err, errlen, "%s (revision %s) is not in the cache %s (no refs/%s)", w->repo, w->rev, w->cache,
                       w->rev);
            return -1;
        }
    }
    char snap[HUB_PATH * 2];
    fmt(snap, sizeof snap, "%s/snapshots/%s", w->storage, commit);
    if (!is_dir(snap)) {
        errbuf_set(err, errlen, "%s (revision %s, commit %s) is not in the cache %s", w->repo, w->rev, commit,
                   w->cache);
        return -1;
    }
    const char *missing = NULL;
    char shard[HUB_PATH];
    int n_files = 0;
    /* every link must reach its blob */
    DIR *d = opendir(snap);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        fmt(path, sizeof path, "%s/%s", snap, e->d_name);
        struct stat st;
        if (!lstat(path, &st) && S_ISLNK(st.st_mode) && stat(path, &st) && !missing) {
            fmt(shard, sizeof shard, "%s (its blob is gone)", e->d_name);
            missing = shard;
        }
        n_files++;
    }
    if (d) closedir(d);
    /* what a model needs, as far as the snapshot itself tells it (the Hub's list is not at hand) */
    if (!missing && rq->n_include == 0) {
        fmt(path, sizeof path, "%s/config.json", snap);
        if (!is_file(path)) missing = "config.json";
        fmt(path, sizeof path, "%s/model.safetensors.index.json", snap);
        if (!missing && rq->weights && is_file(path)) {
            char e[256];
            json_t *j = file_read_json(path, 0, e, sizeof e);
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(j, "weight_map"), k, v) {
                const char *f = json_string_value(v);
                fmt(path, sizeof path, "%s/%s", snap, f ? f : "");
                if (!f || !repo_path_safe(f) || !is_file(path)) {
                    fmt(shard, sizeof shard, "%s (named by model.safetensors.index.json)", f ? f : "?");
                    missing = shard;
                    break;
                }
            }
            json_decref(j);
        } else if (!missing && rq->weights) {
            int any = 0;
            d = opendir(snap);
            for (struct dirent *e; d && (e = readdir(d));) {
                size_t l = strlen(e->d_name);
                fmt(path, sizeof path, "%s/%s", snap, e->d_name);
                if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && is_file(path)) any = 1;
            }
            if (d) closedir(d);
            if (!any) missing = "*.safetensors (the weights)";
        }
    }
    if (missing) {
        errbuf_set(err, errlen, "the cached snapshot %s lacks %s", snap, missing);
        return -1;
    }
    fmt(dir, dirlen, "%s", snap);
    if (res) {
        fmt(res->commit, sizeof res->commit, "%s", commit);
        res->n_files = n_files;
        res->offline = 1;
    }
    return 0;
}

/* A wanted file of the Hub's list */
static int pattern_match(const char *pat, const char *name)
{
    size_t l = strlen(pat);
    if (l > 0 && pat[l - 1] == '/') { /* a folder: everything under it */
        char p[1100];
        fmt(p, sizeof p, "%s*", pat);
        return !fnmatch(p, name, 0);
    }
    return !fnmatch(pat, name, 0);
}

static const char *const model_files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                          "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                                          "special_tokens_map.json", "hf_quant_config.json"};

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int wanted(const HubRequest *rq, const char *name)
{
    if (rq->n_include > 0) {
        for (int i = 0; i < rq->n_include; i++)
            if (pattern_match(rq->include[i], name)) return 1;
        return 0;
    }
    if (strchr(name, '/')) return 0;
    for (size_t i = 0; i < sizeof model_files / sizeof model_files[0]; i++)
        if (!strcmp(name, model_files[i])) return 1;
    return rq->weights && (ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json"));
}

/* ---- one file ---- */

/* snapshots/<commit>/<path> -> ../../blobs/<etag> (one more ../ per folder of path), replacing
 * whatever link was there at once. */
static int link_pointer(const char *pointer, const char *path, const char *etag)
{
    char target[HUB_PATH] = "../../";
    for (const char *p = path; (p = strchr(p, '/')); p++) strncat(target, "../", sizeof target - strlen(target) - 1);
    strncat(target, "blobs/", sizeof target - strlen(target) - 1);
    strncat(target, etag, sizeof target - strlen(target) - 1);
    char tmp[HUB_PATH + 32];
    fmt(tmp, sizeof tmp, "%s.%d.link", pointer, (int)getpid());
    unlink(tmp);
    if (mkdir_parent(pointer) || symlink(target, tmp)) return -1;
    if (rename(tmp, pointer)) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

static int transient(CURLcode rc)
{
    return rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING ||
           rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_COULDNT_CONNECT || rc == CURLE_SSL_CONNECT_ERROR ||
           rc == CURLE_HTTP2 || rc == CURLE_HTTP2_STREAM;
}

/* The blob's bytes from url into <blob>.incomplete (continuing what is there), checked, then
 * renamed to blob. Called under the blob's lock. */
static int download_blob(Hub *h, const Where *w, const char *file, const char *url, int auth, const char *blob,
                         const char *etag, long long size, int *fetched, char *err, size_t errlen)
{
    char part[HUB_PATH + 16];
    fmt(part, sizeof part, "%s.incomplete", blob);
    int fd = open(part, O_RDWR | O_CREAT, 0666);
    if (fd < 0) { errbuf_set(err, errlen, "cannot write %s: %s", part, strerror(errno)); return -1; }
    struct stat st;
    long long have = fstat(fd, &st) == 0 ? (long long)st.st_size : 0;
    if (size >= 0 && have > size) { /* not a prefix of this file */
        if (ftruncate(fd, 0)) {
            errbuf_set(err, errlen, "cannot write %s: %s", part, strerror(errno));
            close(fd);
            return -1;
        }
        have = 0;
    }
    Sink s = {.h = h, .fd = fd, .offset = have, .hashing = is_sha256_hex(etag)};
    char ebody[2048];
    s.mem = ebody, s.mmax = sizeof ebody - 1;
    sha256_init(&s.sha);
    if (s.hashing && have > 0) { /* the part already here counts in the digest */
        char *buf = xmalloc(1 << 20);
        for (long long at = 0; at < have;) {
            ssize_t r = pread(fd, buf, (size_t)(have - at < (1 << 20) ? have - at : (1 << 20)), (off_t)at);
            if (r <= 0) { have = at; break; }
            sha256_update(&s.sha, buf, (size_t)r);
            at += r;
        }
        free(buf);
        s.offset = have;
    }
    if (size > 0) {
        struct statvfs vf;
        if (!fstatvfs(fd, &vf) && (long long)vf.f_bavail * (long long)vf.f_frsize < size - have) {
            char need[32], free_[32];
            human_bytes(need, sizeof need, (double)(size - have));
            human_bytes(free_, sizeof free_, (double)vf.f_bavail * (double)vf.f_frsize);
            log_warn("hub: %s needs %s more and %s holds %s free", file, need, w->cache, free_);
        }
    }
    h->file_size = size;
    h->file_done = have;
    int fails = 0, restarted = 0;
    for (int tries = 0; size < 0 || s.offset < size; tries++) {
        long long before = s.offset;
        s.start = s.offset;
        s.mlen = 0;
        ebody[0] = 0;
        *fetched = 1;
        CURLcode rc = http_do(h, "GET", url, auth, 1, &s);
        if (s.write_errno) {
            progress_end(h);
            int e = s.write_errno;
            char done[32];
            human_bytes(done, sizeof done, (double)s.offset);
            if (e == ENOSPC || e == EDQUOT)
                errbuf_set(err, errlen, "disk full: cannot write %s (%s of %s in): %s; free space under %s and run "
                           "again (the part already here is kept and continued)", part, done, file, strerror(e),
                           w->cache);
            else errbuf_set(err, errlen, "cannot write %s: %s", part, strerror(e));
            close(fd);
            return -1;
        }
        if (s.range_bad) {
            progress_end(h);
            errbuf_set(err, errlen, "%s: the server answered a range that does not continue the file (%s)", file,
                       s.r.content_range);
            close(fd);
            return -1;
        }
        if (rc == CURLE_OK && s.r.status == 416 && !restarted) { /* the part here is no prefix: start over */
            restarted = 1;
            if (ftruncate(fd, 0) == 0) { s.offset = 0; sha256_init(&s.sha); continue; }
        }
        if (rc == CURLE_OK && s.r.status >= 400) {
            progress_end(h);
            http_error(h, &s, w->repo, w->rev, file, err, errlen);
            close(fd);
            return -1;
        }
        if (rc == CURLE_OK && s.r.status >= 300) {
            progress_end(h);
            errbuf_set(err, errlen, "%s: too many redirects from %s", file, url);
            close(fd);
            return -1;
        }
        if (rc == CURLE_OK && size < 0) break; /* the size known only now */
        if (rc == CURLE_OK && s.offset == before && s.offset < size) rc = CURLE_PARTIAL_FILE; /* nothing came */
        if (rc != CURLE_OK) {
            fails = s.offset > before ? 0 : fails + 1;
            if (!transient(rc) || fails >= 5 || tries >= 100) {
                progress_end(h);
                errbuf_set(err, errlen, "downloading %s from %s: %s (the part already here is kept and continued by "
                           "the next run)", file, url, curl_why(h, rc));
                close(fd);
                return -1;
            }
            log_debug("hub: %s cut at %lld bytes (%s); continuing", file, s.offset, curl_why(h, rc));
            usleep(200000u * (unsigned)(fails + 1));
        }
    }
    if (size >= 0 && s.offset != size) {
        progress_end(h);
        errbuf_set(err, errlen, "%s: %lld bytes received, the Hub said %lld", file, s.offset, size);
        close(fd);
        return -1;
    }
    if (s.hashing) {
        uint8_t d[32];
        char hex[65];
        sha256_final(&s.sha, d);
        sha256_to_hex(d, hex);
        if (strcasecmp(hex, etag)) {
            progress_end(h);
            /* a wrong byte anywhere: continuing this part would keep it, so it goes */
            unlink(part);
            close(fd);
            errbuf_set(err, errlen, "%s: SHA-256 mismatch: the bytes received hash to %s, the Hub names the file %s; "
                       "nothing was cached (run again to download it anew)", file, hex, etag);
            return -1;
        }
    }
    if (fdatasync(fd) && errno != EINVAL) {
        int e = errno;
        close(fd);
        errbuf_set(err, errlen, "%s%s: %s", e == ENOSPC ? "disk full: " : "cannot write ", part, strerror(e));
        return -1;
    }
    close(fd);
    if (rename(part, blob)) {
        errbuf_set(err, errlen, "cannot rename %s to %s: %s", part, blob, strerror(errno));
        return -1;
    }
    return 0;
}

/* One file of the snapshot into the cache. */
static int fetch_file(Hub *h, const Where *w, const char *commit, const char *file, HubResult *res, char *err,
                      size_t errlen)
{
    char pointer[HUB_PATH * 2], url[HUB_PATH * 2], qfile[HUB_PATH * 3];
    url_quote(qfile, sizeof qfile, file, 1);
    if (fmt(pointer, sizeof pointer, "%s/snapshots/%s/%s", w->storage, commit, file) ||
        fmt(url, sizeof url, "%s/%s/resolve/%s/%s", h->endpoint, w->repo, commit, qfile)) {
        errbuf_set(err, errlen, "%s: the path is too long", file);
        return -1;
    }
    /* HEAD, following redirects that stay on the Hub's origin; a redirect elsewhere (large files'
     * storage) carries the file's metadata itself and is where the bytes come from */
    Sink s = {.fd = -1};
    char ebody[2048], cur[HUB_PATH * 2], next[HUB_PATH * 2], origin[1100];
    s.mem = ebody, s.mmax = sizeof ebody - 1;
    fmt(cur, sizeof cur, "%s", url);
    int hops = 0;
    for (;; hops++) {
        CURLcode rc = http_do(h, "HEAD", cur, 1, 0, &s);
        if (rc != CURLE_OK) {
            errbuf_set(err, errlen, "cannot reach %s for %s: %s", h->endpoint, file, curl_why(h, rc));
            return -1;
        }
        if (s.r.status >= 400) {
            http_error(h, &s, w->repo, w->rev, file, err, errlen);
            return -1;
        }
        if (s.r.status < 300 || !s.r.location[0]) break;
        url_join(next, sizeof next, cur, s.r.location);
        url_origin(next, origin, sizeof origin);
        /* a redirect with the file's metadata on it is the storage's, whatever its host */
        if (strcmp(origin, h->origin) || s.r.linked_etag[0] || hops >= 10) break;
        fmt(cur, sizeof cur, "%s", next);
    }
    if (!s.r.commit[0]) {
        errbuf_set(err, errlen, "%s answered %s without X-Repo-Commit: is HF_ENDPOINT a Hugging Face Hub?", h->endpoint,
                   cur);
        return -1;
    }
    if (strcmp(s.r.commit, commit)) {
        errbuf_set(err, errlen, "%s: the Hub answered commit %s for a file of commit %s", file, s.r.commit, commit);
        return -1;
    }
    char etag[160];
    const char *raw = s.r.linked_etag[0] ? s.r.linked_etag : s.r.etag;
    if (!raw[0] || etag_normalize(raw, etag, sizeof etag)) {
        errbuf_set(err, errlen, "%s: the Hub gave %s ETag ('%s'): the file cannot be cached by it", file,
                   raw[0] ? "an unusable" : "no", raw);
        return -1;
    }
    int redirected = s.r.status >= 300 && s.r.location[0];
    long long size = s.r.linked_size >= 0 ? s.r.linked_size : redirected ? -1 : s.r.content_length;
    char get_url[HUB_PATH * 2];
    if (redirected) url_join(get_url, sizeof get_url, cur, s.r.location);
    else fmt(get_url, sizeof get_url, "%s", cur);
    url_origin(get_url, origin, sizeof origin);
    int auth = !strcmp(origin, h->origin); /* the token stays with the Hub */

    char blob[HUB_PATH * 2], lockdir[HUB_PATH * 2], lock[HUB_PATH * 3];
    if (fmt(blob, sizeof blob, "%s/blobs/%s", w->storage, etag) ||
        fmt(lockdir, sizeof lockdir, "%s/.locks/%s", w->cache, strrchr(w->storage, '/') + 1) ||
        fmt(lock, sizeof lock, "%s/%s.lock", lockdir, etag) || mkdir_p(lockdir) || mkdir_parent(blob)) {
        errbuf_set(err, errlen, "cannot make the cache folders under %s: %s", w->cache, strerror(errno));
        return -1;
    }
    int lfd = open(lock, O_RDWR | O_CREAT, 0666);
    if (lfd < 0) { errbuf_set(err, errlen, "cannot open the lock %s: %s", lock, strerror(errno)); return -1; }
    if (flock(lfd, LOCK_EX | LOCK_NB)) {
        log_info("hub: waiting for another download of %s (%s)", file, lock);
        while (flock(lfd, LOCK_EX) && errno == EINTR) {}
    }
    int rc = 0, fetched = 0;
    if (!is_file(blob)) {
        long long before = h->bytes;
        rc = download_blob(h, w, file, get_url, auth, blob, etag, size, &fetched, err, errlen);
        if (res) res->bytes += h->bytes - before;
    }
    if (!rc && link_pointer(pointer, file, etag)) {
        errbuf_set(err, errlen, "cannot link %s: %s", pointer, strerror(errno));
        rc = -1;
    }
    flock(lfd, LOCK_UN);
    close(lfd);
    if (!rc && res) {
        if (fetched) res->n_fetched++;
        else res->n_linked++;
    }
    return rc;
}

/* ---- a repository ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static int split_repo(const char *arg, const char *revision, Where *w, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    const char *at = strchr(arg, '@');
    size_t rl = at ? (size_t)(at - arg) : strlen(arg);
    if (rl >= sizeof w->repo) rl = sizeof w->repo - 1;
    memcpy(w->repo, arg, rl);
    w->repo[rl] = 0;
    if (!hub_repo_id_valid(w->repo)) {
        errbuf_set(err, errlen, "'%s' is not a Hugging Face repository id (org/name: letters, digits, '-', '_', '.')",
                   w->repo);
        return -1;
    }
    if (at && revision && strcmp(at + 1, revision)) {
        errbuf_set(err, errlen, "%s names revision %s and --revision %s: give one", arg, at + 1, revision);
        return -1;
    }
    fmt(w->rev, sizeof w->rev, "%s", at ? at + 1 : revision ? revision : "main");
    if (!revision_safe(w->rev)) {
        errbuf_set(err, errlen, "'%s' is not a revision (a branch, tag or commit)", w->rev);
        return -1;
    }
    hub_cache_dir(w->cache, sizeof w->cache);
    char folder[256] = "models--";
    for (const char *p = w->repo; *p; p++) {
        size_t l = strlen(folder);
        if (*p == '/') strncat(folder, "--", sizeof folder - l - 1);
        else if (l + 1 < sizeof folder) folder[l] = *p, folder[l + 1] = 0;
    }
    if (!w->cache[0] || fmt(w->storage, sizeof w->storage, "%s/%s", w->cache, folder)) {
        errbuf_set(err, errlen, "the cache directory's path is too long (HF_HUB_CACHE, HF_HOME)");
        return -1;
    }
    return 0;
}

typedef struct { char **v; int n, cap; } StrList;
static void list_push(StrList *l, const char *s)
{
    if (l->n == l->cap) l->v = xrealloc(l->v, (size_t)(l->cap = l->cap ? 2 * l->cap : 32) * sizeof *l->v);
    l->v[l->n++] = xstrdup(s);
}
static void list_free(StrList *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

/* The cache instead of the Hub, when the Hub failed with why: a complete snapshot, with a warning. */
static int fall_back(const Where *w, const HubRequest *rq, const char *why, char *dir, size_t dirlen, HubResult *res,
                     char *err, size_t errlen)
{
    char e2[1024];
    if (from_cache(w, rq, dir, dirlen, res, e2, sizeof e2) == 0) {
        log_warn("hub: %s; using the cached %s at %s", why, w->repo, res && res->commit[0] ? res->commit : dir);
        return 0;
    }
    errbuf_set(err, errlen, "%s", why);
    return -1;
}

int hub_fetch(const char *repo_arg, const HubRequest *rq, char *dir, size_t dirlen, HubResult *res, char *err,
              size_t errlen)
{
    HubResult local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    Where w;
    if (split_repo(repo_arg, rq->revision, &w, err, errlen)) return -1;
    if (hub_offline()) {
        if (from_cache(&w, rq, dir, dirlen, res, err, errlen) == 0) return 0;
        char why[1200];
        fmt(why, sizeof why, "HF_HUB_OFFLINE is set and %s", err);
        errbuf_set(err, errlen, "%s; run `moeserve download %s%s%s` where the Hub can be reached", why, w.repo,
                   strcmp(w.rev, "main") ? " --revision " : "", strcmp(w.rev, "main") ? w.rev : "");
        return -1;
    }
    pthread_once(&curl_once, curl_init);
    Hub *h = xcalloc(1, sizeof *h);
    h->c = curl_easy_init();
    if (!h->c) { free(h); errbuf_set(err, errlen, "libcurl could not start"); return -1; }
    hub_endpoint(h->endpoint, sizeof h->endpoint);
    url_origin(h->endpoint, h->origin, sizeof h->origin);
    hub_token(h->token, sizeof h->token);
    h->progress = rq->progress;
    h->tty = isatty(2);
    h->t0 = clock_now();
    int rc = -1;
    StrList files = {0};
    json_t *j = NULL;
    char why[1500];

    /* the commit and the file list */
    char url[HUB_PATH], qrev[1024];
    url_quote(qrev, sizeof qrev, w.rev, 0);
    fmt(url, sizeof url, "%s/api/models/%s/revision/%s", h->endpoint, w.repo, qrev);
    Sink s = {.fd = -1, .mmax = 64u << 20};
    s.mem = xmalloc(s.mmax + 1);
    s.mem[0] = 0;
    CURLcode cc = http_do(h, "GET", url, 1, 1, &s);
    if (cc != CURLE_OK) {
        fmt(why, sizeof why, "cannot reach %s: %s", h->endpoint, curl_why(h, cc));
        rc = fall_back(&w, rq, why, dir, dirlen, res, err, errlen);
        goto out;
    }
    if (s.r.status >= 300) {
        if (http_error(h, &s, w.repo, w.rev, NULL, why, sizeof why) == HE_REVISION) errbuf_set(err, errlen, "%s", why);
        else rc = fall_back(&w, rq, why, dir, dirlen, res, err, errlen);
        goto out;
    }
    json_error_t je;
    j = json_loadb(s.mem, s.mlen, 0, &je);
    const char *sha = j ? json_string_value(json_object_get(j, "sha")) : NULL;
    json_t *sib = j ? json_object_get(j, "siblings") : NULL;
    if (!sha || !is_commit(sha) || !json_is_array(sib)) {
        errbuf_set(err, errlen, "%s did not answer %s as the Hub does (%s): is HF_ENDPOINT a Hugging Face Hub?",
                   h->endpoint, url, !j ? je.text : !sha || !is_commit(sha) ? "no commit \"sha\"" : "no \"siblings\"");
        goto out;
    }
    fmt(res->commit, sizeof res->commit, "%s", sha);
    size_t i;
    json_t *e;
    int has_st = 0, has_bin = 0, has_config = 0;
    json_array_foreach(sib, i, e) {
        const char *f = json_string_value(json_object_get(e, "rfilename"));
        if (!f) continue;
        if (!strchr(f, '/') && ends_with(f, ".safetensors")) has_st = 1;
        if (ends_with(f, ".bin")) has_bin = 1;
        if (!strcmp(f, "config.json")) has_config = 1;
        if (!wanted(rq, f)) continue;
        if (!repo_path_safe(f)) {
            errbuf_set(err, errlen, "%s lists the file name '%s', which cannot be a path in the cache", w.repo, f);
            goto out;
        }
        list_push(&files, f);
    }
    if (rq->n_include > 0 && files.n == 0) {
        errbuf_set(err, errlen, "no file of %s at %s matches --include %s%s", w.repo, w.rev, rq->include[0],
                   rq->n_include > 1 ? " (nor the other patterns)" : "");
        goto out;
    }
    if (rq->n_include == 0 && !has_config) {
        errbuf_set(err, errlen, "%s at %s has no config.json: not a model moeserve can load (--include picks files)",
                   w.repo, w.rev);
        goto out;
    }
    if (rq->n_include == 0 && rq->weights && !has_st) {
        errbuf_set(err, errlen, "%s at %s has no .safetensors weights%s: moeserve reads safetensors", w.repo, w.rev,
                   has_bin ? " (only pytorch .bin files)" : "");
        goto out;
    }

    /* the files whose snapshot link is missing; the rest cost nothing */
    int todo = 0;
    char path[HUB_PATH * 2];
    for (int k = 0; k < files.n; k++) {
        fmt(path, sizeof path, "%s/snapshots/%s/%s", w.storage, sha, files.v[k]);
        todo += !is_file(path);
    }
    res->n_files = files.n;
    char shortc[8];
    fmt(shortc, sizeof shortc, "%.7s", sha);
    if (rq->progress && todo > 0)
        log_info("hub: %s at %s (%s): %d files, %d to fetch into %s", w.repo, w.rev, shortc, files.n, todo, w.cache);
    if (mkdir_p(w.storage)) {
        errbuf_set(err, errlen, "cannot make %s: %s", w.storage, strerror(errno));
        goto out;
    }
    fmt(path, sizeof path, "%s/CACHEDIR.TAG", w.cache); /* backup tools skip the cache */
    if (!file_exists(path))
        write_atomic(path, "Signature: 8a477f597d28d172789f06886806bc55\n"
                           "# This file is a cache directory tag created by huggingface_hub (and moeserve).\n");
    h->n_files = todo;
    for (int k = 0; k < files.n; k++) {
        fmt(path, sizeof path, "%s/snapshots/%s/%s", w.storage, sha, files.v[k]);
        if (is_file(path)) continue;
        h->file_i++;
        h->file = files.v[k];
        if (fetch_file(h, &w, sha, files.v[k], res, err, errlen)) goto out;
    }
    progress_end(h);
    if (strcmp(w.rev, sha)) {
        fmt(path, sizeof path, "%s/refs/%s", w.storage, w.rev);
        size_t len;
        char *old = is_file(path) ? file_read_all(path, &len) : NULL;
        if ((!old || strcmp(old, sha)) && (mkdir_parent(path) || write_atomic(path, sha))) {
            errbuf_set(err, errlen, "cannot write %s: %s", path, strerror(errno));
            free(old);
            goto out;
        }
        free(old);
    }
    fmt(dir, dirlen, "%s/snapshots/%s", w.storage, sha);
    if (!is_dir(dir) && mkdir_p(dir)) { /* an --include of nothing but folders' names can leave none */
        errbuf_set(err, errlen, "cannot make %s: %s", dir, strerror(errno));
        goto out;
    }
    if (rq->progress && todo > 0) {
        double dt = clock_now() - h->t0;
        char got[32], rate[32];
        human_bytes(got, sizeof got, (double)res->bytes);
        human_bytes(rate, sizeof rate, dt > 0 ? (double)res->bytes / dt : 0);
        log_info("hub: %s at %s: %d fetched (%s in %.1f s, %s/s), %d already cached -> %s", w.repo, shortc,
                 res->n_fetched, got, dt, rate, files.n - res->n_fetched, dir);
    }
    rc = 0;
out:
    progress_end(h);
    json_decref(j);
    free(s.mem);
    list_free(&files);
    curl_easy_cleanup(h->c);
    free(h);
    return rc;
}

int hub_resolve(const char *arg, const char *revision, int weights, char *dir_out, size_t n, char *err, size_t errlen)
{
    struct stat st;
    const char *at = strchr(arg, '@');
    char id[256];
    fmt(id, sizeof id, "%.*s", (int)(at ? at - arg : (long)strlen(arg)), arg);
    /* a path that is there is a path; "org/name" with exactly one slash may be a repository */
    if (!stat(arg, &st) || !strchr(id, '/') || !hub_repo_id_valid(id)) {
        if (revision) {
            errbuf_set(err, errlen, "--revision %s goes with a Hugging Face repository id, and %s is %s", revision, arg,
                       !stat(arg, &st) ? "a local path" : "not one");
            return -1;
        }
        fmt(dir_out, n, "%s", arg);
        return 0;
    }
    HubRequest rq = {.revision = revision, .weights = weights, .progress = 1};
    char e[2048];
    if (hub_fetch(arg, &rq, dir_out, n, NULL, e, sizeof e)) {
        errbuf_set(err, errlen, "%s is no directory here, so it was taken as a Hugging Face repository: %s", arg, e);
        return -1;
    }
    return 1;
}
