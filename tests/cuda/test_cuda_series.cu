/* CUDA series gather (megabatch_cuda.cuh, "cuda series") against the CPU loop, bitwise:
 * the gather op itself on random series and sample lists (f32 and 16-bit elements), and
 * the loader's series mode on the GPU against the same loader on the CPU (shuffle,
 * drop_last, bf16/f16, shards). Without a GPU every test skips after checking the no-GPU
 * error. Random shapes: the seed is printed, MB_TEST_SEED replays it. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

typedef struct gen {
    int S;
    int64_t n, f, k, t, win[MB_MAX_SEGMENTS], nb[MB_MAX_SEGMENTS];
    float *bars[MB_MAX_SEGMENTS], *targ;
    int64_t *ends;
} gen;

static void gen_make(gen *g) {
    memset(g, 0, sizeof *g);
    g->S = tu_int(1, 5); g->n = tu_int(1, 80); g->f = tu_int(1, 6); g->k = tu_int(1, 3);
    g->ends = (int64_t *)calloc((size_t)(g->n * g->S), sizeof(int64_t));
    for (int s = 0; s < g->S; s++) {
        g->win[s] = tu_int(1, 7);
        g->nb[s] = g->win[s] + tu_int(0, 30);
        g->t += g->win[s];
        g->bars[s] = tu_alloc_f32((size_t)(g->nb[s] * g->f));
        tu_fill(g->bars[s], (size_t)(g->nb[s] * g->f), -3.0f, 3.0f);
        int64_t e = tu_int((int)g->win[s] - 1, (int)g->nb[s] - 1);
        for (int64_t i = 0; i < g->n; i++) {
            g->ends[i * g->S + s] = e;
            if (e < g->nb[s] - 1 && tu_int(0, 1)) e++;
        }
    }
    g->targ = tu_alloc_f32((size_t)(g->n * g->k));
    tu_fill(g->targ, (size_t)(g->n * g->k), -1.0f, 1.0f);
}

static void gen_free(gen *g) {
    for (int s = 0; s < g->S; s++) free(g->bars[s]);
    free(g->ends); free(g->targ);
}

/* Device copy of host bytes. */
static void *up(mb_device *dev, const void *src, size_t bytes) {
    void *p = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, bytes ? bytes : 1, &p));
    if (bytes) tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, p, src, bytes));
    return p;
}

/* The gather op on one device for sample list idx (count rows), element size es; the
 * batch comes back as host bytes in out (features then targets). */
static void gather_on(mb_device *dev, const gen *g, int es, const int64_t *idx, int64_t count, char *out) {
    mb__gather a;
    memset(&a, 0, sizeof a);
    void *bars[MB_MAX_SEGMENTS];
    a.segments = g->S; a.es = es; a.t = g->t; a.count = count;
    a.row = (size_t)g->f * (size_t)es; a.trow = (size_t)g->k * (size_t)es;
    for (int s = 0; s < g->S; s++) { /* es = 2: the f32 bits' low halves stand in for 16-bit data */
        a.len[s] = g->win[s];
        bars[s] = up(dev, g->bars[s], (size_t)g->nb[s] * a.row);
        a.bars[s] = (const char *)bars[s];
    }
    void *ends = up(dev, g->ends, (size_t)(g->n * g->S) * 8), *targ = up(dev, g->targ, (size_t)g->n * a.trow);
    void *di = up(dev, idx, (size_t)count * 8), *dst = NULL;
    size_t fb = (size_t)(count * g->t) * a.row, tb = (size_t)count * a.trow;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, fb + tb, &dst));
    a.ends = (const int64_t *)ends; a.targ = (const char *)targ; a.idx = (const int64_t *)di;
    a.dst_f = (char *)dst; a.dst_t = a.dst_f + fb;
    tu_ok(mb__series_gather(dev, MB_STREAM_COMPUTE, &a));
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, out, dst, fb + tb));
    tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
    for (int s = 0; s < g->S; s++) mb_free(dev, bars[s]);
    mb_free(dev, ends); mb_free(dev, targ); mb_free(dev, di); mb_free(dev, dst);
}

static void test_cuda_gather_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    for (int rep = 0; rep < 30; rep++) {
        gen g;
        gen_make(&g);
        int es = tu_int(0, 1) ? 4 : 2;
        int64_t count = tu_int(1, 40), *idx = (int64_t *)calloc((size_t)count, 8);
        for (int64_t i = 0; i < count; i++) idx[i] = tu_int(0, (int)g.n - 1); /* any order, repeats */
        size_t bytes = (size_t)count * ((size_t)g.t * (size_t)g.f + (size_t)g.k) * (size_t)es;
        char *a = (char *)calloc(bytes, 1), *b = (char *)calloc(bytes, 1);
        gather_on(cpu, &g, es, idx, count, a);
        gather_on(gpu, &g, es, idx, count, b);
        assert_memory_equal(a, b, bytes);
        if (es == 4) /* and the CPU loop is the windows' definition */
            for (int64_t i = 0; i < count; i++) {
                const float *w = (const float *)a + (size_t)(i * g.t * g.f);
                for (int s = 0; s < g.S; w += g.win[s] * g.f, s++)
                    assert_memory_equal(w, g.bars[s] + (size_t)((g.ends[idx[i] * g.S + s] - g.win[s] + 1) * g.f),
                                        (size_t)(g.win[s] * g.f) * 4);
            }
        free(a); free(b); free(idx);
        gen_free(&g);
    }
    tu_device_close(cpu);
    tu_device_close(gpu);
}

/* Two epochs of a series-mode loader as host bytes. */
static size_t collect(mb_device *dev, const gen *g, const mb_loader_config *c, char *out, size_t cap) {
    mb_series d;
    memset(&d, 0, sizeof d);
    d.segments = g->S; d.window = g->win; d.bars_n = g->nb; d.bars = (const float *const *)g->bars;
    d.ends = g->ends; d.targets = g->targ; d.n = g->n; d.f = g->f; d.k = g->k;
    mb_dataset *ds;
    tu_ok(mb_dataset_open_series(&ds, &d, NULL));
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, c));
    assert_ptr_equal(ld->src, mb__series_source()); /* series mode */
    return tu_drain_two_epochs(dev, ld, ds, (size_t)(g->t * g->f), (size_t)g->k, mb_dtype_size(c->dtype), out, cap);
}

static void test_cuda_series_loader_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    for (int rep = 0; rep < 20; rep++) {
        gen g;
        gen_make(&g);
        mb_loader_config c;
        memset(&c, 0, sizeof c);
        c.batch = tu_int(1, 9); c.shuffle = tu_int(0, 1); c.seed = tu_next(); c.drop_last = tu_int(0, 1);
        c.dtype = (mb_dtype)tu_int(0, 2); c.chunk_bytes = (size_t)1 << 28;
        if (tu_int(0, 2) == 0) { c.shard_count = 2; c.shard_rank = tu_int(0, 1); }
        size_t cap = 2 * (size_t)g.n * ((size_t)(g.t * g.f + g.k)) * 4 + 1;
        char *a = (char *)calloc(cap, 1), *b = (char *)calloc(cap, 1);
        size_t na = collect(cpu, &g, &c, a, cap), nb = collect(gpu, &g, &c, b, cap);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na);
        free(a); free(b);
        gen_free(&g);
    }
    tu_device_close(cpu);
    tu_device_close(gpu);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_gather_matches_cpu),
        tu_cuda_test(test_cuda_series_loader_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
