/* test_hub: models from the Hugging Face Hub (src/hub/) against a fake Hub on loopback, into a
 * temporary HF_HOME, checking the cache layout huggingface_hub itself uses.
 *
 * The fake Hub (threads of this test process) serves GET /api/models/{repo}/revision/{rev}
 * (the commit "sha" and "siblings"), HEAD and GET /{repo}/resolve/{rev}/{file}: small files at
 * once with ETag and X-Repo-Commit, large (LFS) ones as a 302 to a second listener on another
 * loopback address (the storage a real Hub redirects to, another origin: the token must not go
 * there) with X-Linked-Etag (their SHA-256) and X-Linked-Size; that storage answers Range
 * requests, and on demand cuts a body once halfway or flips a byte of it. Tokens: hf_good sees
 * everything, hf_nogate everything but the gated repository; any other is refused (401, as the
 * Hub words it). Its repositories hold the built-in NVFP4 model (models/builtin-nvfp4) and files
 * a model does not need (README.md, pytorch_model.bin, original/...).
 * When the Python package huggingface_hub can be imported ($MOESERVE_HUB_PYTHON, else python3),
 * tests/hub_interop.py checks that it reads the cache this code wrote, and writes one (from the
 * same fake Hub) that this code then reuses; otherwise that test is skipped. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "hub/hub.h"
#include "hub/sha256.h"

/* ---- SHA-256 ---- */

TEST(hub_sha256_vectors)
{
    /* FIPS 180-4's examples, and the empty message */
    static const struct { const char *msg, *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
         "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        sha256_hex(v[i].msg, strlen(v[i].msg), hex);
        EXPECT(!strcmp(hex, v[i].hex), "'%s': %s", v[i].msg, hex);
    }
    /* a million 'a', fed in uneven pieces that cross the 64-byte blocks every way */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    Sha256 s;
    uint8_t d[32];
    sha256_init(&s);
    for (size_t at = 0, step = 1; at < 1000000; at += step, step = step % 131 + 7)
        sha256_update(&s, a + at, at + step > 1000000 ? 1000000 - at : step);
    sha256_final(&s, d);
    sha256_to_hex(d, hex);
    EXPECT(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "%s", hex);
    /* every length around the padding's edges: streamed byte by byte equals one call */
    for (size_t n = 50; n < 140; n++) {
        char one[65];
        sha256_hex(a, n, one);
        sha256_init(&s);
        for (size_t k = 0; k < n; k++) sha256_update(&s, a + k, 1);
        sha256_final(&s, d);
        sha256_to_hex(d, hex);
        EXPECT(!strcmp(hex, one), "length %zu", n);
    }
    free(a);
}

/* ---- the fake Hub ---- */

typedef struct {
    char path[128];
    char *data;
    size_t len;
    int lfs;
    char etag[65];   /* the SHA-256 for an LFS file; a 40-digit name for a small one */
    int ghost;       /* listed, but resolve answers 404 */
} FFile;

typedef struct {
    char id[64], sha[41];
    FFile f[12];
    int n, gated;
} FRepo;

static struct {
    int hub_fd, cdn_fd, hub_port, cdn_port;
    char cdn_host[32];
    pthread_t hub_t, cdn_t;
    FRepo repo[4];
    int n_repo;
    atomic_int n_api, n_head, n_get, n_cdn, n_cdn_auth, n_ranged, active;
    atomic_int cut_once, corrupt;
    atomic_llong cdn_bytes, last_range;
    pthread_mutex_t mu;
    char auth[256];  /* the last Authorization the Hub (not the storage) got */
} F;

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int reply(int fd, int status, const char *extra, const char *body, int head)
{
    char hdr[2048];
    const char *why = status == 200 ? "OK" : status == 206 ? "Partial Content" : status == 302 ? "Found"
                    : status == 401 ? "Unauthorized" : status == 403 ? "Forbidden" : "Not Found";
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", status,
                     why, extra ? extra : "", bl);
    if (write_all(fd, hdr, (size_t)n)) return -1;
    return head || !bl ? 0 : write_all(fd, body, bl);
}

static void url_decode(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%' && p[1] && p[2]) {
            char h[3] = {p[1], p[2], 0};
            *o++ = (char)strtol(h, NULL, 16);
            p += 2;
        } else *o++ = *p;
    }
    *o = 0;
}

static FRepo *find_repo(const char *id)
{
    for (int i = 0; i < F.n_repo; i++)
        if (!strcmp(F.repo[i].id, id)) return &F.repo[i];
    return NULL;
}

/* The Hub's answer to who may see repo r at rev; 0 when the request goes on. */
static int check_access(int fd, FRepo *r, const char *id, const char *tok, const char *rev, int head)
{
    char extra[512];
    if (!r) {
        return reply(fd, tok ? 404 : 401, "X-Error-Code: RepoNotFound\r\nX-Error-Message: Repository not found\r\n",
                     "{\"error\":\"Repository not found\"}", head) ? -1 : 1;
    }
    if (r->gated && (!tok || strcmp(tok, "hf_good"))) {
        snprintf(extra, sizeof extra, "X-Error-Code: GatedRepo\r\nX-Error-Message: Access to model %s is restricted "
                 "and you are not in the authorized list. Visit http://127.0.0.1:%d/%s to ask for access.\r\n", id,
                 F.hub_port, id);
        return reply(fd, tok ? 403 : 401, extra, "{\"error\":\"gated\"}", head) ? -1 : 1;
    }
    if (strcmp(rev, "main") && strcmp(rev, r->sha)) {
        snprintf(extra, sizeof extra, "X-Error-Code: RevisionNotFound\r\nX-Error-Message: Invalid rev id: %s\r\n", rev);
        return reply(fd, 404, extra, "{\"error\":\"Invalid rev id\"}", head) ? -1 : 1;
    }
    return 0;
}

/* GET /cdn/<sha256>: the storage behind the redirects */
static int serve_cdn(int fd, const char *name, long long from)
{
    FFile *f = NULL;
    for (int i = 0; i < F.n_repo && !f; i++)
        for (int k = 0; k < F.repo[i].n; k++)
            if (F.repo[i].f[k].lfs && !strcmp(F.repo[i].f[k].etag, name)) f = &F.repo[i].f[k];
    if (!f) return reply(fd, 404, NULL, "{\"error\":\"no such blob\"}", 0);
    if (from < 0) from = 0;
    if ((size_t)from > f->len) from = (long long)f->len;
    size_t n = f->len - (size_t)from;
    char hdr[512];
    int hl = from > 0 ? snprintf(hdr, sizeof hdr, "HTTP/1.1 206 Partial Content\r\n"
                                 "Content-Range: bytes %lld-%zu/%zu\r\nContent-Length: %zu\r\n\r\n", from,
                                 f->len - 1, f->len, n)
                      : snprintf(hdr, sizeof hdr, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
    if (write_all(fd, hdr, (size_t)hl)) return -1;
    int cut = atomic_exchange(&F.cut_once, 0);
    size_t send_n = cut ? n / 2 : n;
    const char *body = f->data + from;
    char *bad = NULL;
    if (atomic_load(&F.corrupt)) {
        bad = malloc(n ? n : 1);
        memcpy(bad, body, n);
        if (n) bad[n / 3] ^= 0x5a;
        body = bad;
    }
    int rc = write_all(fd, body, send_n);
    free(bad);
    atomic_fetch_add(&F.cdn_bytes, (long long)send_n);
    return cut ? -1 : rc; /* a cut body ends the connection */
}

static int serve_one(int fd, char *req)
{
    char method[8] = "", target[2048] = "";
    if (sscanf(req, "%7s %2047s", method, target) != 2) return -1;
    int head = !strcmp(method, "HEAD");
    char auth[256] = "";
    const char *a = strcasestr(req, "\r\nAuthorization:");
    if (a) sscanf(a + 16, " %255[^\r\n]", auth);
    long long range = -1;
    const char *rg = strcasestr(req, "\r\nRange: bytes=");
    if (rg) range = strtoll(rg + 15, NULL, 10);
    char *q = strchr(target, '?');
    if (q) *q = 0;

    if (!strncmp(target, "/cdn/", 5)) {
        atomic_fetch_add(&F.n_cdn, 1);
        if (auth[0]) atomic_fetch_add(&F.n_cdn_auth, 1);
        if (range >= 0) atomic_fetch_add(&F.n_ranged, 1), atomic_store(&F.last_range, range);
        return serve_cdn(fd, target + 5, range);
    }
    pthread_mutex_lock(&F.mu);
    snprintf(F.auth, sizeof F.auth, "%s", auth);
    pthread_mutex_unlock(&F.mu);
    const char *tok = !strncmp(auth, "Bearer ", 7) ? auth + 7 : NULL;
    if (auth[0] && (!tok || (strcmp(tok, "hf_good") && strcmp(tok, "hf_nogate"))))
        return reply(fd, 401, "X-Error-Message: Invalid credentials in Authorization header\r\n",
                     "{\"error\":\"Invalid credentials in Authorization header\"}", head);

    char org[128], name[128], rest[1800], id[260];
    if (sscanf(target, "/api/models/%127[^/]/%127[^/]/revision/%1799s", org, name, rest) == 3) {
        atomic_fetch_add(&F.n_api, 1);
        url_decode(rest);
        snprintf(id, sizeof id, "%s/%s", org, name);
        FRepo *r = find_repo(id);
        int c = check_access(fd, r, id, tok, rest, head);
        if (c) return c < 0 ? -1 : 0;
        json_t *sib = json_array();
        for (int k = 0; k < r->n; k++) json_array_append_new(sib, json_pack("{s:s}", "rfilename", r->f[k].path));
        json_t *j = json_pack("{s:s, s:s, s:s, s:b, s:o}", "_id", "0123", "id", id, "sha", r->sha, "private", 0,
                              "siblings", sib);
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        int rc = reply(fd, 200, NULL, body, head);
        free(body);
        return rc;
    }
    if (sscanf(target, "/%127[^/]/%127[^/]/resolve/%1799s", org, name, rest) == 3) {
        atomic_fetch_add(head ? &F.n_head : &F.n_get, 1);
        char *slash = strchr(rest, '/');
        if (!slash) return reply(fd, 404, NULL, "{}", head);
        *slash = 0;
        char rev[1800], file[1800];
        snprintf(rev, sizeof rev, "%s", rest);
        snprintf(file, sizeof file, "%s", slash + 1);
        url_decode(rev);
        url_decode(file);
        snprintf(id, sizeof id, "%s/%s", org, name);
        FRepo *r = find_repo(id);
        int c = check_access(fd, r, id, tok, rev, head);
        if (c) return c < 0 ? -1 : 0;
        FFile *f = NULL;
        for (int k = 0; k < r->n; k++)
            if (!strcmp(r->f[k].path, file) && !r->f[k].ghost) f = &r->f[k];
        char extra[1024];
        if (!f) {
            snprintf(extra, sizeof extra, "X-Error-Code: EntryNotFound\r\nX-Error-Message: Entry not found\r\n"
                     "X-Repo-Commit: %s\r\n", r->sha);
            return reply(fd, 404, extra, "{\"error\":\"Entry not found\"}", head);
        }
        if (f->lfs) {
            snprintf(extra, sizeof extra, "Location: http://%s:%d/cdn/%s?X-Signature=abc\r\nX-Linked-Etag: \"%s\"\r\n"
                     "X-Linked-Size: %zu\r\nX-Repo-Commit: %s\r\nETag: \"%.40s\"\r\n", F.cdn_host, F.cdn_port, f->etag,
                     f->etag, f->len, r->sha, f->etag + 24);
            return reply(fd, 302, extra, NULL, head);
        }
        char hdr[512];
        int hl = snprintf(hdr, sizeof hdr,
                          "HTTP/1.1 200 OK\r\nETag: \"%s\"\r\nX-Repo-Commit: %s\r\nContent-Length: %zu\r\n\r\n",
                          f->etag, r->sha, f->len);
        if (write_all(fd, hdr, (size_t)hl)) return -1;
        return head ? 0 : write_all(fd, f->data, f->len);
    }
    return reply(fd, 404, NULL, "{\"error\":\"not found\"}", head);
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    size_t cap = 1 << 14, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        char *end;
        while (!(end = memmem(buf, len, "\r\n\r\n", 4))) {
            if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
            ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
            if (r <= 0) goto out;
            len += (size_t)r;
        }
        size_t hl = (size_t)(end - buf) + 4;
        char saved = buf[hl];
        buf[hl] = 0;
        int rc = serve_one(fd, buf);
        buf[hl] = saved;
        if (rc) break;
        memmove(buf, buf + hl, len - hl);
        len -= hl;
    }
out:
    free(buf);
    close(fd);
    atomic_fetch_sub(&F.active, 1);
    return NULL;
}

static void *accept_main(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break;
        }
        atomic_fetch_add(&F.active, 1);
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)fd)) {
            close(fd);
            atomic_fetch_sub(&F.active, 1);
        } else pthread_detach(t);
    }
    return NULL;
}

static int listen_on(const char *addr, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, addr, &a.sin_addr);
    socklen_t al = sizeof a;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) || getsockname(fd, (struct sockaddr *)&a, &al)) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static char *slurp(const char *path, size_t *len)
{
    char *s = file_read_all(path, len);
    return s;
}

static void add_file(FRepo *r, const char *path, const char *data, size_t len, int lfs)
{
    FFile *f = &r->f[r->n++];
    snprintf(f->path, sizeof f->path, "%s", path);
    f->data = malloc(len ? len : 1);
    memcpy(f->data, data, len);
    f->len = len;
    f->lfs = lfs;
    char hex[65];
    sha256_hex(data, len, hex);
    if (lfs) snprintf(f->etag, sizeof f->etag, "%s", hex);
    else snprintf(f->etag, sizeof f->etag, "%.40s", hex); /* stands for the git blob id */
}

static void add_model(FRepo *r)
{
    static const char *const names[] = {"config.json", "generation_config.json", "hf_quant_config.json",
                                        "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    char path[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len;
        snprintf(path, sizeof path, "%s/models/builtin-nvfp4/%s", test_root(), names[i]);
        char *d = slurp(path, &len);
        if (!d) continue;
        add_file(r, names[i], d, len, strstr(names[i], ".safetensors") != NULL);
        free(d);
    }
}

static int fake_start(void)
{
    memset(&F, 0, sizeof F);
    pthread_mutex_init(&F.mu, NULL);
    atomic_store(&F.last_range, -1);
    F.hub_fd = listen_on("127.0.0.1", &F.hub_port);
    /* the storage on another loopback address, else another port: another origin either way */
    snprintf(F.cdn_host, sizeof F.cdn_host, "127.0.0.2");
    F.cdn_fd = listen_on(F.cdn_host, &F.cdn_port);
    if (F.cdn_fd < 0) {
        snprintf(F.cdn_host, sizeof F.cdn_host, "127.0.0.1");
        F.cdn_fd = listen_on(F.cdn_host, &F.cdn_port);
    }
    if (F.hub_fd < 0 || F.cdn_fd < 0) return -1;

    FRepo *r = &F.repo[F.n_repo++];
    snprintf(r->id, sizeof r->id, "org/tiny");
    snprintf(r->sha, sizeof r->sha, "0123456789abcdef0123456789abcdef01234567");
    add_model(r);
    add_file(r, "README.md", "# tiny\n", 7, 0);
    add_file(r, "pytorch_model.bin", "not read: moeserve reads safetensors", 36, 1);
    add_file(r, "original/consolidated.safetensors", "a subfolder's weights", 21, 1);
    if (r->n != 9) return -1;

    r = &F.repo[F.n_repo++];
    snprintf(r->id, sizeof r->id, "org/gated");
    snprintf(r->sha, sizeof r->sha, "89abcdef0123456789abcdef0123456789abcdef");
    r->gated = 1;
    add_model(r);

    r = &F.repo[F.n_repo++]; /* a pytorch-only model, and a file its list names but the Hub lacks */
    snprintf(r->id, sizeof r->id, "org/old");
    snprintf(r->sha, sizeof r->sha, "fedcba9876543210fedcba9876543210fedcba98");
    add_file(r, "config.json", "{}", 2, 0);
    add_file(r, "pytorch_model.bin", "weights", 7, 1);
    add_file(r, "tokenizer.json", "{}", 2, 0);
    r->f[r->n - 1].ghost = 1;

    if (pthread_create(&F.hub_t, NULL, accept_main, (void *)(intptr_t)F.hub_fd)) return -1;
    if (pthread_create(&F.cdn_t, NULL, accept_main, (void *)(intptr_t)F.cdn_fd)) return -1;
    return 0;
}

static void fake_stop(void)
{
    shutdown(F.hub_fd, SHUT_RDWR);
    shutdown(F.cdn_fd, SHUT_RDWR);
    close(F.hub_fd);
    close(F.cdn_fd);
    pthread_join(F.hub_t, NULL);
    pthread_join(F.cdn_t, NULL);
    /* connections end when their clients do (each fetch closes its own) */
    for (int i = 0; i < 5000 && atomic_load(&F.active) > 0; i++) usleep(1000);
    for (int i = 0; i < F.n_repo; i++)
        for (int k = 0; k < F.repo[i].n; k++) free(F.repo[i].f[k].data);
    F.n_repo = 0;
}

/* ---- helpers ---- */

/* a fresh HF_HOME under the test's directory, the fake Hub as HF_ENDPOINT, and the rest unset */
static const char *hub_env(const char *name, const char *token)
{
    static char home[512];
    snprintf(home, sizeof home, "%s/hub-%s", test_tmpdir(), name);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", home);
    test_run(cmd, NULL);
    mkdir(home, 0755);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d/", F.hub_port); /* a trailing '/' is dropped */
    setenv("HF_HOME", home, 1);
    setenv("HF_ENDPOINT", ep, 1);
    setenv("no_proxy", "127.0.0.1,127.0.0.2,localhost", 1);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HUGGINGFACE_HUB_CACHE");
    unsetenv("HF_HUB_OFFLINE");
    unsetenv("TRANSFORMERS_OFFLINE");
    unsetenv("HF_TOKEN_PATH");
    unsetenv("HUGGING_FACE_HUB_TOKEN");
    if (token) setenv("HF_TOKEN", token, 1);
    else unsetenv("HF_TOKEN");
    return home;
}

static void hub_env_clear(void)
{
    static const char *const v[] = {"HF_HOME", "HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) unsetenv(v[i]);
}

static int fetch(const char *repo, int weights, const char *const *include, int n_include, char *dir, HubResult *res,
                 char *err)
{
    HubRequest rq = {.weights = weights, .include = include, .n_include = n_include};
    return hub_fetch(repo, &rq, dir, 4096, res, err, 2048);
}

static const FFile *ffile(const char *repo, const char *path)
{
    FRepo *r = find_repo(repo);
    for (int k = 0; r && k < r->n; k++)
        if (!strcmp(r->f[k].path, path)) return &r->f[k];
    return NULL;
}

/* path is the link huggingface_hub makes for f: relative, to ../../blobs/<etag> (one more ../ per
 * folder), and reads as f's bytes */
static int linked_as_hub_does(const char *snap, const FFile *f)
{
    char path[4400], target[512], want[512] = "../../";
    snprintf(path, sizeof path, "%s/%s", snap, f->path);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    for (const char *p = f->path; (p = strchr(p, '/')); p++) strcat(want, "../");
    strcat(want, "blobs/");
    strcat(want, f->etag);
    if (strcmp(target, want)) { fprintf(stderr, "    %s -> %s, expected %s\n", path, target, want); return 0; }
    size_t len;
    char *d = file_read_all(path, &len);
    int same = d && len == f->len && !memcmp(d, f->data, len);
    free(d);
    return same;
}

static int exists(const char *fmt, const char *a, const char *b)
{
    char path[16384];
    snprintf(path, sizeof path, fmt, a, b);
    struct stat st;
    return lstat(path, &st) == 0;
}

static int count_files(const char *dir, const char *suffix)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof cmd, "find '%s' -name '*%s' | wc -l", dir, suffix);
    test_run(cmd, &out);
    int n = out ? atoi(out) : -1;
    free(out);
    return n;
}

/* ---- tests ---- */

static const char *const model_needs[] = {"config.json", "generation_config.json", "hf_quant_config.json",
                                          "model.safetensors", "tokenizer.json", "tokenizer_config.json"};

TEST(hub_download_layout)
{
    ASSERT(fake_start() == 0);
    const char *home = hub_env("layout", NULL);
    char dir[4096], err[2048], want[9000], storage[1024];
    HubResult res;
    int rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    FRepo *r = find_repo("org/tiny");
    snprintf(storage, sizeof storage, "%s/hub/models--org--tiny", home);
    snprintf(want, sizeof want, "%s/snapshots/%s", storage, r->sha);
    EXPECT(!strcmp(dir, want), "%s", dir);
    EXPECT(!strcmp(res.commit, r->sha));
    EXPECT_EQ_INT(res.n_files, 6);
    EXPECT_EQ_INT(res.n_fetched, 6);
    /* the files a model needs, each a link to its blob; nothing else */
    for (size_t i = 0; i < sizeof model_needs / sizeof model_needs[0]; i++)
        EXPECT(linked_as_hub_does(dir, ffile("org/tiny", model_needs[i])), "%s", model_needs[i]);
    EXPECT(!exists("%s/%s", dir, "README.md"));
    EXPECT(!exists("%s/%s", dir, "pytorch_model.bin"), "a model with safetensors gets no .bin");
    EXPECT(!exists("%s/%s", dir, "original"));
    /* refs/main names the commit; the large blob is named by its SHA-256 */
    snprintf(want, sizeof want, "%s/refs/main", storage);
    size_t len;
    char *ref = file_read_all(want, &len);
    EXPECT(ref && !strcmp(ref, r->sha), "refs/main: %s", ref ? ref : "(none)");
    free(ref);
    EXPECT(exists("%s/blobs/%s", storage, ffile("org/tiny", "model.safetensors")->etag));
    EXPECT_EQ_INT(count_files(storage, ".incomplete"), 0);
    EXPECT(exists("%s/hub/.locks/models--org--tiny/%s.lock", home, ffile("org/tiny", "model.safetensors")->etag));
    /* the large file came from the storage, without the token-less request carrying any */
    EXPECT_EQ_INT(atomic_load(&F.n_api), 1);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn), 1);
    EXPECT_EQ_INT(atomic_load(&F.n_ranged), 0);

    /* a second run asks for the list and downloads nothing */
    int head = atomic_load(&F.n_head), get = atomic_load(&F.n_get), cdn = atomic_load(&F.n_cdn);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    EXPECT_EQ_INT(res.n_fetched, 0);
    EXPECT_EQ_INT(atomic_load(&F.n_api), 2);
    EXPECT_EQ_INT(atomic_load(&F.n_head) - head, 0);
    EXPECT_EQ_INT(atomic_load(&F.n_get) - get, 0);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn) - cdn, 0);

    /* --include picks other files, a subfolder's linked one level deeper; a blob already there
     * (the same bytes under another name would be) is linked without a download */
    const char *inc[] = {"original/*", "README.md"};
    rc = fetch("org/tiny", 1, inc, 2, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    EXPECT_EQ_INT(res.n_files, 2);
    EXPECT(linked_as_hub_does(dir, ffile("org/tiny", "original/consolidated.safetensors")));
    EXPECT(linked_as_hub_does(dir, ffile("org/tiny", "README.md")));
    EXPECT(!exists("%s/%s", dir, "pytorch_model.bin"));
    /* the commit as the revision, and "@rev" */
    char id[128];
    snprintf(id, sizeof id, "org/tiny@%s", r->sha);
    rc = fetch(id, 1, NULL, 0, dir, &res, err);
    EXPECT(rc == 0 && res.n_fetched == 0, "%s", err);
    hub_env_clear();
    fake_stop();
}

TEST(hub_resume)
{
    ASSERT(fake_start() == 0);
    const FFile *big = ffile("org/tiny", "model.safetensors");
    char dir[4096], err[2048], blobs[8192], part[8400];
    HubResult res;
    /* a body cut halfway: the same run continues it with a Range request */
    const char *home = hub_env("resume1", NULL);
    atomic_store(&F.cut_once, 1);
    int rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    EXPECT_EQ_INT(atomic_load(&F.cut_once), 0);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn), 2);
    EXPECT_EQ_INT(atomic_load(&F.n_ranged), 1);
    EXPECT_EQ_INT(atomic_load(&F.last_range), (long long)(big->len / 2));
    EXPECT_EQ_INT(atomic_load(&F.cdn_bytes), (long long)big->len); /* half, then the other half */
    EXPECT(linked_as_hub_does(dir, big));

    /* a part left by an earlier run (or by huggingface_hub) is continued, not begun again */
    home = hub_env("resume2", NULL);
    snprintf(blobs, sizeof blobs, "%s/hub/models--org--tiny/blobs", home);
    char cmd[8500];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", blobs);
    test_run(cmd, NULL);
    snprintf(part, sizeof part, "%s/%s.incomplete", blobs, big->etag);
    FILE *f = fopen(part, "wb");
    ASSERT(f);
    fwrite(big->data, 1, 1000000, f);
    fclose(f);
    atomic_store(&F.cdn_bytes, 0);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    EXPECT_EQ_INT(atomic_load(&F.last_range), 1000000);
    EXPECT_EQ_INT(atomic_load(&F.cdn_bytes), (long long)big->len - 1000000);
    EXPECT(linked_as_hub_does(dir, big));
    EXPECT(!exists("%s%s", part, ""));
    hub_env_clear();
    fake_stop();
}

TEST(hub_sha256_mismatch)
{
    ASSERT(fake_start() == 0);
    const char *home = hub_env("corrupt", NULL);
    const FFile *big = ffile("org/tiny", "model.safetensors");
    char dir[4096], err[2048], storage[8192];
    HubResult res;
    atomic_store(&F.corrupt, 1);
    int rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1);
    EXPECT(strstr(err, "SHA-256 mismatch") && strstr(err, "model.safetensors") && strstr(err, big->etag), "%s", err);
    /* neither the blob, nor its part, nor a link to it, nor a ref to a commit whose files are not in */
    snprintf(storage, sizeof storage, "%s/hub/models--org--tiny", home);
    EXPECT(!exists("%s/blobs/%s", storage, big->etag));
    EXPECT_EQ_INT(count_files(storage, ".incomplete"), 0);
    EXPECT(!exists("%s/snapshots/%s/model.safetensors", storage, find_repo("org/tiny")->sha));
    EXPECT(!exists("%s/refs/%s", storage, "main"));
    /* the next good download fills it in */
    atomic_store(&F.corrupt, 0);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    ASSERT(rc == 0, "%s", err);
    EXPECT(linked_as_hub_does(dir, big));
    hub_env_clear();
    fake_stop();
}

TEST(hub_offline)
{
    ASSERT(fake_start() == 0);
    const char *home = hub_env("offline", NULL);
    char dir[4096], dir2[4096], err[2048];
    HubResult res;
    ASSERT(fetch("org/tiny", 1, NULL, 0, dir, &res, err) == 0, "%s", err);
    int api = atomic_load(&F.n_api);
    /* HF_HUB_OFFLINE: refs/main and the snapshot, no request at all */
    setenv("HF_HUB_OFFLINE", "1", 1);
    int rc = fetch("org/tiny", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == 0, "%s", err);
    EXPECT(!strcmp(dir, dir2) && res.offline);
    EXPECT_EQ_INT(atomic_load(&F.n_api), api);
    /* what the cache lacks is named */
    rc = fetch("org/gated", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == -1 && strstr(err, "HF_HUB_OFFLINE") && strstr(err, "org/gated") && strstr(err, "not in the cache"),
           "%s", err);
    rc = fetch("org/tiny@v2", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == -1 && strstr(err, "refs/v2"), "%s", err);
    char blob[8192];
    snprintf(blob, sizeof blob, "%s/hub/models--org--tiny/blobs/%s", home,
             ffile("org/tiny", "model.safetensors")->etag);
    char keep[8300];
    snprintf(keep, sizeof keep, "%s.kept", blob);
    ASSERT(rename(blob, keep) == 0);
    rc = fetch("org/tiny", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == -1 && strstr(err, "lacks") && strstr(err, "model.safetensors"), "%s", err);
    rc = fetch("org/tiny", 0, NULL, 0, dir2, &res, err); /* config and tokenizer alone are there */
    EXPECT(rc == -1 && strstr(err, "blob is gone"), "a broken link is named too: %s", err);
    ASSERT(rename(keep, blob) == 0);
    unsetenv("HF_HUB_OFFLINE");
    /* the Hub out of reach: the complete cached snapshot, with a warning */
    setenv("HF_ENDPOINT", "http://127.0.0.1:1", 1);
    rc = fetch("org/tiny", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == 0 && !strcmp(dir, dir2) && res.offline, "%s", err);
    rc = fetch("org/gated", 1, NULL, 0, dir2, &res, err);
    EXPECT(rc == -1 && strstr(err, "cannot reach http://127.0.0.1:1"), "%s", err);
    hub_env_clear();
    fake_stop();
}

TEST(hub_token_and_errors)
{
    ASSERT(fake_start() == 0);
    char dir[4096], err[2048];
    HubResult res;
    /* HF_TOKEN goes to the Hub as a bearer token, and not to the storage it redirects to */
    hub_env("token", "hf_good");
    int rc = fetch("org/gated", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == 0, "%s", err);
    pthread_mutex_lock(&F.mu);
    EXPECT(!strcmp(F.auth, "Bearer hf_good"), "%s", F.auth);
    pthread_mutex_unlock(&F.mu);
    EXPECT(atomic_load(&F.n_cdn) > 0);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn_auth), 0);
    /* the token file of `hf auth login` when HF_TOKEN is not set */
    const char *home = hub_env("tokenfile", NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/token", home);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("hf_good\n", f);
    fclose(f);
    rc = fetch("org/gated", 0, NULL, 0, dir, &res, err);
    EXPECT(rc == 0, "%s", err);

    /* each error names its cause */
    hub_env("errors", "hf_bad");
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "token was refused") && strstr(err, "401") && strstr(err, "HF_TOKEN"), "%s", err);
    hub_env("errors", NULL);
    rc = fetch("org/nope", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "repository org/nope not found") && strstr(err, "HF_TOKEN"), "%s", err);
    rc = fetch("org/gated", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "gated") && strstr(err, "set HF_TOKEN"), "%s", err);
    hub_env("errors", "hf_nogate");
    rc = fetch("org/gated", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "gated") && strstr(err, "not in the authorized list"), "%s", err);
    rc = fetch("org/tiny@v9", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "revision 'v9' not found"), "%s", err);
    rc = fetch("org/old", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "no .safetensors") && strstr(err, ".bin"), "%s", err);
    rc = fetch("org/old", 0, NULL, 0, dir, &res, err); /* listed, but the Hub has no such file */
    EXPECT(rc == -1 && strstr(err, "file tokenizer.json not found in org/old") && strstr(err, "404"), "%s", err);
    const char *none[] = {"*.gguf"};
    rc = fetch("org/tiny", 1, none, 1, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "matches --include *.gguf"), "%s", err);
    rc = fetch("../etc", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "not a Hugging Face repository id"), "%s", err);
    /* a full disk: the part being written is /dev/full, which fails every write with ENOSPC */
    home = hub_env("full", NULL);
    char blobs[700], cmd[1600];
    snprintf(blobs, sizeof blobs, "%s/hub/models--org--tiny/blobs", home);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -s /dev/full '%s/%s.incomplete'", blobs, blobs,
             ffile("org/tiny", "model.safetensors")->etag);
    ASSERT(test_run(cmd, NULL) == 0);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == -1 && strstr(err, "disk full") && strstr(err, "No space left on device"), "%s", err);
    hub_env_clear();
    fake_stop();
}

/* `--model org/name` of a command, `moeserve download`, through the fake Hub */
TEST(hub_cli_model)
{
    ASSERT(fake_start() == 0);
    const char *home = hub_env("cli", NULL);
    char cmd[2000], *out = NULL;
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_ENDPOINT=http://127.0.0.1:%d '%s' info --model org/tiny", home,
             F.hub_port, test_bin());
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0 && strstr(out, "Glm4MoeForCausalLM") && strstr(out, "models--org--tiny/snapshots/"), "%s\n%s", cmd,
           out);
    free(out);
    /* tokenize fetches no weights: a fresh cache stays without them */
    home = hub_env("cli-tok", NULL);
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_ENDPOINT=http://127.0.0.1:%d '%s' tokenize --tokenizer org/tiny --text "
             "'Debian packages'", home, F.hub_port, test_bin());
    rc = test_run(cmd, &out);
    EXPECT(rc == 0 && strlen(out) > 0, "%s\n%s", cmd, out);
    free(out);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn), 1); /* the info run's weights only */
    /* download prints the snapshot; --revision; an id that is no repository is a clear error */
    snprintf(cmd, sizeof cmd, "{ HF_HOME='%s' HF_ENDPOINT=http://127.0.0.1:%d '%s' download org/tiny --revision main "
             "--include '*.json' 2>/dev/null; }", home, F.hub_port, test_bin());
    rc = test_run(cmd, &out);
    char want[700];
    snprintf(want, sizeof want, "%s/hub/models--org--tiny/snapshots/%s\n", home, find_repo("org/tiny")->sha);
    EXPECT(rc == 0 && !strcmp(out, want), "%s\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_ENDPOINT=http://127.0.0.1:%d '%s' info --model org/nope", home,
             F.hub_port, test_bin());
    rc = test_run(cmd, &out);
    EXPECT(rc == 1 && strstr(out, "org/nope is no directory here") && strstr(out, "repository org/nope not found"),
           "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_HUB_OFFLINE=1 '%s' info --model org/tiny --json", home, test_bin());
    rc = test_run(cmd, &out);
    EXPECT(rc == 1 && strstr(out, "HF_HUB_OFFLINE") && strstr(out, "*.safetensors"),
           "offline, the tokenizer-only snapshot lacks the weights: %s", out);
    free(out);
    hub_env_clear();
    fake_stop();
}

static const char *hub_python(void)
{
    const char *p = getenv("MOESERVE_HUB_PYTHON");
    return p && *p ? p : "python3";
}

/* huggingface_hub reads the cache this code wrote, and this code reuses one it wrote */
TEST(hub_huggingface_hub_interop)
{
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' -c 'import huggingface_hub' 2>&1", hub_python());
    if (test_run(cmd, NULL) != 0) {
        test_skip("the Python package huggingface_hub is not importable (%s; MOESERVE_HUB_PYTHON names another)",
                  hub_python());
        return;
    }
    ASSERT(fake_start() == 0);
    const char *home = hub_env("py-read", NULL);
    char dir[4096], err[2048];
    HubResult res;
    ASSERT(fetch("org/tiny", 1, NULL, 0, dir, &res, err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_HUB_OFFLINE=1 '%s' '%s/tests/hub_interop.py' read org/tiny '%s' "
             "config.json model.safetensors tokenizer.json", home, hub_python(), test_root(), dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s\n%s", cmd, out);
    free(out);

    home = hub_env("py-write", NULL);
    snprintf(cmd, sizeof cmd, "HF_HOME='%s' HF_ENDPOINT=http://127.0.0.1:%d '%s' '%s/tests/hub_interop.py' write "
             "org/tiny config.json generation_config.json hf_quant_config.json model.safetensors tokenizer.json "
             "tokenizer_config.json", home, F.hub_port, hub_python(), test_root());
    int cdn = atomic_load(&F.n_cdn);
    rc = test_run(cmd, &out);
    EXPECT(rc == 0, "%s\n%s", cmd, out);
    free(out);
    EXPECT_EQ_INT(atomic_load(&F.n_cdn) - cdn, 1);
    /* this code finds everything there: offline, and online without a download */
    setenv("HF_HUB_OFFLINE", "1", 1);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == 0 && res.offline, "%s", err);
    unsetenv("HF_HUB_OFFLINE");
    int head = atomic_load(&F.n_head), get = atomic_load(&F.n_get);
    cdn = atomic_load(&F.n_cdn);
    rc = fetch("org/tiny", 1, NULL, 0, dir, &res, err);
    EXPECT(rc == 0 && res.n_fetched == 0 && res.n_files == 6, "%s", err);
    EXPECT_EQ_INT(atomic_load(&F.n_head) + atomic_load(&F.n_get) + atomic_load(&F.n_cdn) - head - get - cdn, 0);
    for (size_t i = 0; i < sizeof model_needs / sizeof model_needs[0]; i++)
        EXPECT(linked_as_hub_does(dir, ffile("org/tiny", model_needs[i])), "%s", model_needs[i]);
    hub_env_clear();
    fake_stop();
}
