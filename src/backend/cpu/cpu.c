/* cpu: the CPU backend's op table, memory and per-thread scratch (cpu.h). */
#include "cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../base/util.h"

static __thread void *scratch[CPU_SCRATCH_SLOTS];
static __thread size_t scratch_cap[CPU_SCRATCH_SLOTS];
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

/* at the exit of a thread that used scratch (the engine thread, say): free its buffers */
static void scratch_release(void *unused)
{
    (void)unused;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) {
        free(scratch[i]);
        scratch[i] = NULL;
        scratch_cap[i] = 0;
    }
}

static void scratch_key_init(void) { pthread_key_create(&scratch_key, scratch_release); }

void *cpu_scratch(int slot, size_t bytes)
{
    if (bytes > scratch_cap[slot]) {
        pthread_once(&scratch_once, scratch_key_init);
        pthread_setspecific(scratch_key, (void *)1);
        free(scratch[slot]);
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        scratch[slot] = xmalloc_aligned(cap);
        scratch_cap[slot] = cap;
    }
    return scratch[slot];
}

float cpu_dot(const float *a, const float *b, int64_t n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];         s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2]; s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4]; s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6]; s7 += a[i + 7] * b[i + 7];
    }
    float r = 0;
    for (; i < n; i++) r += a[i] * b[i];
    return r + ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}

/* Big buffers (the KV pool above all) are anonymous mappings: zero, and resident only once
 * written, so the process's memory grows with what the cache holds instead of its size. Their
 * sizes are kept here for munmap (few of them: a list is enough). */
#define CPU_MAP_MIN ((size_t)16 << 20)
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t n; } *maps;
static int n_maps, cap_maps;

static void *cpu_alloc(Backend *be, size_t bytes)
{
    (void)be;
    if (bytes >= CPU_MAP_MIN) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("out of memory mapping %zu bytes", bytes);
        pthread_mutex_lock(&maps_mu);
        if (n_maps == cap_maps) maps = xrealloc(maps, (cap_maps = cap_maps ? 2 * cap_maps : 16) * sizeof *maps);
        maps[n_maps].p = p;
        maps[n_maps++].n = bytes;
        pthread_mutex_unlock(&maps_mu);
        return p;
    }
    void *p = xmalloc_aligned(bytes);
    memset(p, 0, bytes);
    return p;
}

static void cpu_free(Backend *be, void *p)
{
    (void)be;
    if (!p) return;
    pthread_mutex_lock(&maps_mu);
    for (int i = 0; i < n_maps; i++)
        if (maps[i].p == p) {
            munmap(p, maps[i].n);
            maps[i] = maps[--n_maps];
            pthread_mutex_unlock(&maps_mu);
            return;
        }
    pthread_mutex_unlock(&maps_mu);
    free(p);
}

/* host and "device" are the same memory: both directions are a memcpy */
static void cpu_to_host(Backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (dst != src) memcpy(dst, src, bytes);
}

/* What the host can give without swapping: MemAvailable (free memory and the page cache that can
 * be dropped), else the free pages. */
static size_t cpu_mem_free(Backend *be)
{
    (void)be;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
        if (kb > 0) return (size_t)kb << 10;
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : (size_t)1 << 30;
}

static const BackendOps cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .fill = fill_cpu,
    .embed = embed_cpu,
    .rmsnorm = rmsnorm_cpu,
    .layernorm = layernorm_cpu,
    .rope = rope_cpu,
    .add = add_cpu,
    .get_rows = get_rows_cpu,
    .to_host = cpu_to_host,
    .to_device = cpu_to_host,
    .swiglu = swiglu_cpu,
    .kv_write = kv_write_cpu,
    .matmul = matmul_cpu,
    .router = router_cpu,
    .moe = moe_cpu,
    .attention_gqa = attention_gqa_cpu,
    .attention_mla = attention_mla_cpu,
    .kv_gather = kv_gather_cpu,
    .attention_mla_piece = attention_mla_piece_cpu,
    .indexer = indexer_cpu,
    .argmax = argmax_cpu,
    .sample = sample_cpu,
    .mem_free = cpu_mem_free,
};

float cpu_e4m3[256];

void backend_cpu_init(Backend *be, int n_threads)
{
    for (int i = 0; i < 256; i++) cpu_e4m3[i] = codec_e4m3_to_f32((uint8_t)i);
    *be = (Backend){0};
    be->name = "cpu";
    be->host_memory = 1;
    be->ops = &cpu_ops;
    be->n_threads = n_threads > 0 ? n_threads : 1;
}
