/* test_layers: src/'s folders stack as docs/ARCHITECTURE.md says. The floor order is read from
 * its line "Floors, from the bottom: ..."; every #include "..." of every file of src/ must name
 * a file of its own folder or of a folder below it, and no file may include one that includes
 * it back (directly or through others). */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "test.h"

#define MAX_FILES 512
#define MAX_FLOORS 32

typedef struct {
    char path[512];           /* "src/model/forward.c" */
    int floor;                 /* index in the order; -1 for a folder the order does not name */
    int inc[64], n_inc;        /* files included (indices) */
} SrcFile;

static SrcFile files[MAX_FILES];
static int n_files;
static char floors[MAX_FLOORS][32];
static int n_floors;

static int floor_of(const char *path) /* path below src/ */
{
    char top[64];
    snprintf(top, sizeof top, "%.*s", (int)strcspn(path, "/"), path);
    for (int i = 0; i < n_floors; i++)
        if (!strcmp(floors[i], top)) return i;
    return -1;
}

static void walk(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st)) continue;
        if (S_ISDIR(st.st_mode)) { walk(p); continue; }
        const char *x = strrchr(e->d_name, '.');
        if (!x || (strcmp(x, ".c") && strcmp(x, ".h") && strcmp(x, ".cu") && strcmp(x, ".cuh"))) continue;
        if (n_files < MAX_FILES) {
            if (strlen(p) >= sizeof files[n_files].path) continue;
            memcpy(files[n_files].path, p, strlen(p) + 1);
            files[n_files].floor = floor_of(p + 4);
            n_files++;
        }
    }
    closedir(d);
}

/* dir/rel normalised ("src/model/../base/util.h" -> "src/base/util.h") */
static void normalise(const char *dir, const char *rel, char *out, size_t n)
{
    char buf[1100], *parts[64];
    snprintf(buf, sizeof buf, "%s/%s", dir, rel);
    int k = 0;
    for (char *save = NULL, *t = strtok_r(buf, "/", &save); t && k < 64; t = strtok_r(NULL, "/", &save)) {
        if (!strcmp(t, ".")) continue;
        if (!strcmp(t, "..")) { if (k) k--; continue; }
        parts[k++] = t;
    }
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < k && o < n; i++) o += (size_t)snprintf(out + o, n - o, "%s%s", i ? "/" : "", parts[i]);
}

static int find_file(const char *p)
{
    for (int i = 0; i < n_files; i++)
        if (!strcmp(files[i].path, p)) return i;
    return -1;
}

static int color[MAX_FILES];
static int cycle_at = -1;

static int dfs(int u)
{
    color[u] = 1;
    for (int k = 0; k < files[u].n_inc; k++) {
        int v = files[u].inc[k];
        if (color[v] == 1) { cycle_at = v; return 1; }
        if (!color[v] && dfs(v)) return 1;
    }
    color[u] = 2;
    return 0;
}

TEST(layers_includes_go_down)
{
    char *doc = file_read_all("docs/ARCHITECTURE.md", NULL);
    ASSERT(doc, "docs/ARCHITECTURE.md (the tests run from the repository root)");
    const char *key = "Floors, from the bottom: ";
    char *line = strstr(doc, key);
    ASSERT(line, "ARCHITECTURE.md names the floors on a line \"%s...\"", key);
    line += strlen(key);
    line[strcspn(line, "\n")] = 0;
    for (char *save = NULL, *t = strtok_r(line, ", ", &save); t && n_floors < MAX_FLOORS; t = strtok_r(NULL, ", ", &save))
        snprintf(floors[n_floors++], sizeof floors[0], "%s", t);
    free(doc);
    ASSERT(n_floors >= 5, "%d floors read", n_floors);
    n_files = 0;
    walk("src");
    ASSERT(n_files > 50, "%d source files under src/", n_files);
    int up = 0, unnamed = 0;
    for (int i = 0; i < n_files; i++) {
        SrcFile *f = &files[i];
        if (f->floor < 0 && !unnamed++) test_fail(__FILE__, __LINE__, "%s: its folder is no floor of ARCHITECTURE.md", f->path);
        char dir[512];
        snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(f->path, '/') - f->path), f->path);
        FILE *fp = fopen(f->path, "r");
        if (!fp) continue;
        char l[1024];
        while (fgets(l, sizeof l, fp)) {
            const char *s = l;
            while (*s == ' ') s++;
            if (strncmp(s, "#include \"", 10)) continue;
            char rel[512], p[512];
            snprintf(rel, sizeof rel, "%.*s", (int)strcspn(s + 10, "\""), s + 10);
            normalise(dir, rel, p, sizeof p);
            int j = find_file(p);
            if (j < 0) continue; /* generated, or outside src/ */
            if (f->n_inc < 64) f->inc[f->n_inc++] = j;
            if (files[j].floor > f->floor && f->floor >= 0) {
                up++;
                test_fail(__FILE__, __LINE__, "%s includes %s, a floor above it", f->path, p);
            }
        }
        fclose(fp);
    }
    EXPECT_EQ_INT(up, 0);
    memset(color, 0, sizeof color);
    int cyc = 0;
    for (int i = 0; i < n_files && !cyc; i++)
        if (!color[i]) cyc = dfs(i);
    EXPECT(!cyc, "an include cycle through %s", cycle_at >= 0 ? files[cycle_at].path : "?");
}
