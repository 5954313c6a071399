/* loader (CPU backend): chunk planning (the seeds' table), every batch of an epoch equal
 * to the source rows for several chunk/slab/batch sizes and both drop_last settings,
 * seeded reproducible shuffles, resume mid-epoch, NaN handling, injected pinned and
 * device allocation failures (same data, no leaks), bad input. */
#define _GNU_SOURCE /* mkdtemp */
#include <stdint.h>
#include <stdlib.h>
/* The library's host allocations (MB_MALLOC) through a hook that can fail the nth one. */
static uint64_t g_host_allocs, g_host_fail_at;
static void *host_malloc(size_t n) {
    uint64_t k = __atomic_add_fetch(&g_host_allocs, 1, __ATOMIC_SEQ_CST);
    return k == __atomic_load_n(&g_host_fail_at, __ATOMIC_SEQ_CST) ? NULL : malloc(n);
}
#define MB_MALLOC(n) host_malloc(n)
#define MB_FREE(p) free(p)
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"

enum { N = 53, T = 4, F = 3, K = 2, ROW = T * F };
static float g_feat[N * ROW], g_targ[N * K];
static const char *g_file;

static mb_loader_config config(int64_t batch, size_t chunk_samples, size_t slab_samples) {
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = batch;
    c.chunk_bytes = chunk_samples * (ROW + K) * sizeof(float);
    c.slab_bytes = slab_samples * (ROW + K) * sizeof(float);
    return c;
}
static mb_dataset *open_file(void) {
    mb_dataset *ds;
    tu_ok(mb_dataset_open_file(&ds, g_file, NULL));
    return ds;
}

/* One epoch: every row must equal its source row (identified by its target); ids gets
 * the sample ids in order. Returns rows; *batches gets the batch count. */
static int64_t run_epoch(mb_loader *ld, int64_t *ids, int64_t *batches, int64_t want_epoch) {
    mb_batch b;
    int64_t rows = 0, nb = 0;
    for (;;) {
        tu_ok(mb_loader_next(ld, &b));
        if (b.end_of_epoch) { assert_int_equal(b.count, 0); assert_int_equal(b.epoch, want_epoch); break; }
        assert_int_equal(b.epoch, want_epoch);
        assert_int_equal(b.index, nb);
        assert_true(b.count >= 1 && b.count <= mb_loader_get_plan(ld)->samples_per_chunk);
        const float *f = (const float *)b.features, *t = (const float *)b.targets;
        for (int64_t i = 0; i < b.count; i++) {
            int64_t id = (int64_t)floorf(-t[i * K]);
            assert_true(id >= 0 && id < N);
            assert_memory_equal(f + i * ROW, g_feat + id * ROW, ROW * sizeof(float));
            assert_memory_equal(t + i * K, g_targ + id * K, K * sizeof(float));
            assert_true(rows < N);
            ids[rows++] = id;
        }
        nb++;
    }
    if (batches) *batches = nb;
    return rows;
}

static void test_plan_seeds_table(void **state) {
    (void)state;
    /* seeds: 8/12/16/24 GB GPUs -> 6/9/12/18 GB chunks, batch 64/96/128/192; a multi-TF
     * sample (T = 1104, F = 128, K = 36) is 565,392 bytes. */
    const double gb[4] = {8, 12, 16, 24}, chunk_gb[4] = {6, 9, 12, 18};
    const int64_t batch[4] = {64, 96, 128, 192}, n = 1000000;
    for (int i = 0; i < 4; i++) {
        mb_loader_config c;
        memset(&c, 0, sizeof c);
        c.batch = batch[i];
        mb_chunk_plan p;
        tu_ok(mb_loader_plan(n, 1104, 128, 36, &c, (size_t)(gb[i] * 1e9), &p));
        assert_int_equal(p.bytes_per_sample, 565392);
        assert_int_equal(p.budget_bytes, (size_t)(chunk_gb[i] * 1e9));
        assert_int_equal(p.buffers, 2);
        size_t half = p.budget_bytes / 2;
        assert_int_equal(p.samples_per_chunk % batch[i], 0);
        assert_true((size_t)p.samples_per_chunk * p.bytes_per_sample <= half);
        assert_true((size_t)(p.samples_per_chunk + batch[i]) * p.bytes_per_sample > half);
        assert_int_equal(p.chunks, (n + p.samples_per_chunk - 1) / p.samples_per_chunk);
        assert_int_equal(p.batches, (n + batch[i] - 1) / batch[i]); /* chunks are whole batches */
    }
    /* the 16 GB row: 12 GB hold about 21,000 samples (seeds), split over two buffers */
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = 128;
    mb_chunk_plan p;
    tu_ok(mb_loader_plan(21000, 1104, 128, 36, &c, (size_t)16e9, &p));
    assert_int_equal(p.buffers, 1); /* fits: resident */
    assert_int_equal(p.samples_per_chunk, 21000);
    assert_int_equal(p.chunks, 1);
    assert_int_equal(p.batches, (21000 + 127) / 128);
    c.drop_last = 1;
    tu_ok(mb_loader_plan(21000, 1104, 128, 36, &c, (size_t)16e9, &p));
    assert_int_equal(p.batches, 21000 / 128);
    c.dtype = MB_BF16;
    tu_ok(mb_loader_plan(21000, 1104, 128, 36, &c, (size_t)16e9, &p));
    assert_int_equal(p.bytes_per_sample, 565392 / 2);
}

/* Brute force: batches of an epoch from the plan's chunk sizes. */
static void test_plan_counts(void **state) {
    (void)state;
    for (int it = 0; it < 300; it++) {
        mb_loader_config c;
        memset(&c, 0, sizeof c);
        c.batch = tu_int(1, 20);
        c.drop_last = tu_int(0, 1);
        int64_t n = tu_int(1, 500);
        c.chunk_bytes = (size_t)tu_int(1, 600) * 20;
        mb_chunk_plan p;
        tu_ok(mb_loader_plan(n, 2, 2, 1, &c, 0, &p));
        assert_int_equal(p.bytes_per_sample, 20);
        int64_t want_spc = (int64_t)(c.chunk_bytes / 2 / 20);
        if ((size_t)n * 20 <= c.chunk_bytes) want_spc = n;
        else want_spc = want_spc >= c.batch ? want_spc - want_spc % c.batch : c.batch;
        if (want_spc > n) want_spc = n;
        assert_int_equal(p.samples_per_chunk, want_spc);
        int64_t batches = 0, chunks = 0;
        for (int64_t s = 0; s < n; s += want_spc, chunks++) {
            int64_t r = n - s < want_spc ? n - s : want_spc;
            batches += c.drop_last ? r / c.batch : (r + c.batch - 1) / c.batch;
        }
        assert_int_equal(p.chunks, chunks);
        assert_int_equal(p.batches, batches);
        assert_int_equal(p.buffers, chunks == 1 ? 1 : 2);
    }
}

static void test_plan_bad_input(void **state) {
    (void)state;
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    mb_chunk_plan p;
    tu_assert_error(mb_loader_plan(10, 2, 2, 1, &c, 1000, &p), MB_ERR_INVALID_ARG, "batch = 0");
    c.batch = 4;
    c.chunk_fraction = 1.5;
    tu_assert_error(mb_loader_plan(10, 2, 2, 1, &c, 1000, &p), MB_ERR_INVALID_ARG, "chunk_fraction = 1.5");
    c.chunk_fraction = 0;
    tu_assert_error(mb_loader_plan(0, 2, 2, 1, &c, 1000, &p), MB_ERR_INVALID_ARG, "N=0");
    tu_assert_error(mb_loader_plan(10, INT64_MAX / 2, 4, 1, &c, 1000, &p), MB_ERR_OVERFLOW, "overflow");
    c.dtype = (mb_dtype)9;
    tu_assert_error(mb_loader_plan(10, 2, 2, 1, &c, 1000, &p), MB_ERR_INVALID_ARG, "unknown dtype 9");
}

/* Every batch equals the source rows, in file order, for many sizes, 2 epochs each. */
static void test_epoch_matches_source(void **state) {
    (void)state;
    const size_t chunks[] = {N, N * 2, 16, 10, 7};
    const size_t slabs[] = {1, 3, 5, 64};
    const int64_t batches[] = {1, 4, 5, 7};
    int64_t ids[N];
    for (int memory = 0; memory < 2; memory++)
    for (int ci = 0; ci < 5; ci++)
        for (int si = 0; si < 4; si++)
            for (int bi = 0; bi < 4; bi++)
                for (int dl = 0; dl < 2; dl++) {
                    mb_device *dev = tu_open_cpu();
                    mb_dataset *ds;
                    if (memory) tu_ok(mb_dataset_open_memory(&ds, g_feat, g_targ, N, T, F, K, NULL));
                    else ds = open_file();
                    mb_loader_config c = config(batches[bi], chunks[ci], slabs[si]);
                    c.drop_last = dl;
                    mb_loader *ld;
                    tu_ok(mb_loader_open(&ld, dev, ds, &c));
                    const mb_chunk_plan *p = mb_loader_get_plan(ld);
                    for (int64_t e = 0; e < 2; e++) {
                        int64_t nb = 0, rows = run_epoch(ld, ids, &nb, e);
                        assert_int_equal(nb, p->batches);
                        for (int64_t i = 0; i < rows; i++) assert_int_equal(ids[i], i); /* file order */
                        int64_t want = N;
                        if (dl) { /* each chunk loses its short tail */
                            want = 0;
                            for (int64_t s = 0; s < N; s += p->samples_per_chunk) {
                                int64_t r = N - s < p->samples_per_chunk ? N - s : p->samples_per_chunk;
                                want += r - r % batches[bi];
                            }
                        }
                        assert_int_equal(rows, want);
                    }
                    mb_loader_stats st = mb_loader_get_stats(ld);
                    size_t bps = (ROW + K) * sizeof(float);
                    /* resident: read once; double-buffered: once per epoch (plus a prefetch) */
                    if (p->buffers == 1) assert_int_equal(st.bytes_read, N * bps);
                    else assert_true(st.bytes_read >= 2 * N * bps);
                    assert_true(st.chunk_loads >= (p->buffers == 1 ? 1 : 2 * p->chunks));
                    mb_loader_close(ld);
                    mb_dataset_close(ds);
                    tu_close_checked(dev);
                }
}

static void shuffled_epochs(uint64_t seed, size_t chunk, int64_t out[3][N]) {
    mb_device *dev = tu_open_cpu();
    mb_dataset *ds = open_file();
    mb_loader_config c = config(4, chunk, 3);
    c.shuffle = 1;
    c.seed = seed;
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    for (int e = 0; e < 3; e++) {
        int64_t nb;
        assert_int_equal(run_epoch(ld, out[e], &nb, e), N);
        int seen[N] = {0};
        for (int i = 0; i < N; i++) seen[out[e][i]]++;
        for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1); /* a permutation */
    }
    mb_loader_close(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

static int same(const int64_t *a, const int64_t *b) { return memcmp(a, b, N * sizeof *a) == 0; }

static void test_shuffle_seeded_permutation(void **state) {
    (void)state;
    static int64_t a[3][N], b[3][N], c[3][N], ident[N];
    for (int i = 0; i < N; i++) ident[i] = i;
    const size_t chunks[] = {N, 24};
    for (int k = 0; k < 2; k++) { /* resident (in-place reshuffle each epoch) and 2 buffers */
        shuffled_epochs(42, chunks[k], a);
        shuffled_epochs(42, chunks[k], b);
        shuffled_epochs(43, chunks[k], c);
        for (int e = 0; e < 3; e++) {
            assert_true(same(a[e], b[e]));      /* reproducible */
            assert_false(same(a[e], c[e]));     /* seed matters */
            assert_false(same(a[e], ident));    /* shuffled */
        }
        assert_false(same(a[0], a[1]));         /* new order each epoch */
        if (k == 1) { /* chunks of 12 (budget 24 -> 2 x 12), samples shuffled within a chunk */
            for (int e = 0; e < 3; e++)
                for (int i = 0; i < N;) {
                    int64_t chunk = a[e][i] / 12, size = chunk == N / 12 ? N % 12 : 12;
                    for (int j = 0; j < size; j++) assert_int_equal(a[e][i + j] / 12, chunk);
                    i += (int)size;
                }
        }
    }
}

static void resume_case(int shuffle, size_t chunk, int64_t batch, int stop) {
    mb_device *dev = tu_open_cpu();
    mb_dataset *ds = open_file(), *ds2 = open_file();
    mb_loader_config c = config(batch, chunk, 2);
    c.shuffle = shuffle;
    c.seed = 7;
    mb_loader *a, *b;
    tu_ok(mb_loader_open(&a, dev, ds, &c));
    tu_ok(mb_loader_open(&b, dev, ds2, &c));
    mb_batch x, y;
    for (int i = 0; i < stop; i++) tu_ok(mb_loader_next(a, &x));
    mb_loader_pos pos = mb_loader_position(a);
    tu_ok(mb_loader_set_position(b, pos));
    int na = 0;
    for (int i = 0; i < 3 * N; i++) {
        tu_ok(mb_loader_next(a, &x));
        tu_ok(mb_loader_next(b, &y));
        assert_int_equal(x.count, y.count);
        assert_int_equal(x.epoch, y.epoch);
        assert_int_equal(x.index, y.index);
        assert_int_equal(x.end_of_epoch, y.end_of_epoch);
        assert_memory_equal(x.features, y.features, (size_t)x.count * ROW * sizeof(float));
        assert_memory_equal(x.targets, y.targets, (size_t)x.count * K * sizeof(float));
        na += x.count > 0;
    }
    assert_true(na > 0);
    /* reset_epoch goes back to batch 0 of the current epoch, same order */
    mb_loader_pos p0 = mb_loader_position(b);
    tu_ok(mb_loader_reset_epoch(b));
    mb_loader_pos p1 = mb_loader_position(b);
    assert_int_equal(p1.epoch, p0.epoch);
    assert_int_equal(p1.chunk, 0);
    assert_int_equal(p1.batch, 0);
    mb_loader_close(a);
    mb_loader_close(b);
    mb_dataset_close(ds);
    mb_dataset_close(ds2);
    tu_close_checked(dev);
}

static void test_resume_mid_epoch(void **state) {
    (void)state;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        resume_case(shuffle, N, 5, 3);
        resume_case(shuffle, 12, 4, 5);
        resume_case(shuffle, 12, 4, tu_int(0, 40));
        resume_case(shuffle, 20, 3, 17);
    }
}

static void test_set_position_bad(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_dataset *ds = open_file();
    mb_loader_config c = config(4, 12, 2);
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    mb_loader_pos p = {0, 99, 0};
    tu_assert_error(mb_loader_set_position(ld, p), MB_ERR_INVALID_ARG, "chunk 99 batch 0 outside the plan");
    p.chunk = 0;
    p.batch = 2;
    tu_assert_error(mb_loader_set_position(ld, p), MB_ERR_INVALID_ARG, "batch 2 outside"); /* 6 per chunk: 2 batches */
    p.batch = 1;
    tu_ok(mb_loader_set_position(ld, p));
    mb_loader_close(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

static void test_open_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_dataset *ds = open_file();
    mb_loader *ld = NULL;
    mb_loader_config c = config(0, 12, 2);
    tu_assert_error(mb_loader_open(&ld, dev, ds, &c), MB_ERR_INVALID_ARG, "batch = 0");
    c.batch = 4;
    c.dtype = (mb_dtype)7;
    tu_assert_error(mb_loader_open(&ld, dev, ds, &c), MB_ERR_INVALID_ARG, "unknown dtype 7");
    c.dtype = MB_F32;
    tu_assert_error(mb_loader_open(&ld, dev, NULL, &c), MB_ERR_INVALID_ARG, "NULL argument");
    assert_null(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

/* Epoch ids through a loader, for comparing failure paths with the normal one. */
static void epoch_of(mb_device *dev, const mb_loader_config *c, int64_t *ids) {
    mb_dataset *ds = open_file();
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, c));
    int64_t nb;
    assert_int_equal(run_epoch(ld, ids, &nb, 0), N);
    mb_loader_close(ld);
    mb_dataset_close(ds);
}

static char g_log[8192];
static void capture_log(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    (void)level; (void)file; (void)line; (void)user;
    size_t len = strlen(g_log);
    snprintf(g_log + len, sizeof g_log - len, "%s\n", msg);
}
static mb_device *cpu_logged(void) {
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.log.fn = capture_log;
    dc.log.max = MB_LOG_WARN;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, &dc));
    g_log[0] = 0;
    return dev;
}

static void test_pinned_failure_falls_back(void **state) {
    (void)state;
    int64_t ref[N], got[N];
    mb_device *dev = cpu_logged();
    mb_loader_config c = config(4, 12, 5);
    c.shuffle = 1;
    epoch_of(dev, &c, ref);
    mb_device_fail_alloc(dev, MB_MEM_PINNED, 1); /* first slab: smaller slabs */
    epoch_of(dev, &c, got);
    assert_memory_equal(ref, got, sizeof ref);
    assert_non_null(strstr(g_log, "pinned slabs failed; trying 2 x"));
    c.slab_bytes = 1; /* one-sample slabs cannot shrink: pageable */
    mb_device_fail_alloc(dev, MB_MEM_PINNED, 2);
    epoch_of(dev, &c, got);
    assert_memory_equal(ref, got, sizeof ref);
    assert_non_null(strstr(g_log, "staging through pageable"));
    tu_close_checked(dev);
}

/* One epoch that may fail: MB_OK with every row equal to its source row and the ids in
 * order, or the first error. */
static mb_result try_epoch(mb_device *dev, mb_dataset *ds, const mb_loader_config *c, int64_t *ids, int64_t *rows) {
    mb_loader *ld = NULL;
    mb_result r = mb_loader_open(&ld, dev, ds, c);
    *rows = 0;
    while (r == MB_OK) {
        mb_batch b;
        r = mb_loader_next(ld, &b);
        if (r != MB_OK || b.end_of_epoch) break;
        const float *f = (const float *)b.features, *t = (const float *)b.targets;
        for (int64_t i = 0; i < b.count; i++) {
            int64_t id = (int64_t)floorf(-t[i * K]);
            assert_true(id >= 0 && id < N && *rows < N);
            assert_memory_equal(f + i * ROW, g_feat + id * ROW, ROW * sizeof(float));
            ids[(*rows)++] = id;
        }
    }
    mb_loader_close(ld);
    return r;
}

/* Fail the nth allocation of a kind from now on: host through the MB_MALLOC hook, pinned
 * and device through mb_device_fail_alloc. 0 cancels. Returns the kind's count so far. */
static uint64_t fail_nth(mb_device *dev, int kind, uint64_t nth) {
    if (kind != MB_MEM_HOST) {
        mb_device_fail_alloc(dev, (mb_mem_kind)kind, nth);
        return mb_device_mem_stats(dev).allocs[kind];
    }
    uint64_t now = __atomic_load_n(&g_host_allocs, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_host_fail_at, nth ? now + nth : 0, __ATOMIC_SEQ_CST);
    return now;
}

/* Every host, pinned and device allocation made while opening and loading fails in turn:
 * each run ends with the very same epoch (smaller slabs or chunks, or the pageable path)
 * or a clean out-of-memory error, and nothing is left allocated either way. Then pinned
 * memory denied entirely: the pageable path, the same batches. */
static void test_every_allocation_fails_in_turn(void **state) {
    (void)state;
    int64_t ref[N], got[N], rows;
    mb_device *dev = tu_open_cpu();
    mb_loader_config c = config(4, 12, 5);
    c.shuffle = 1;
    epoch_of(dev, &c, ref);
    mb_dataset *ds = open_file();
    const char *kinds[] = {"host", "pinned", "device"};
    for (int kind = 0; kind < MB_MEM_KINDS; kind++) {
        int same = 0, errors = 0;
        for (uint64_t nth = 1;; nth++) {
            uint64_t before = fail_nth(dev, kind, nth);
            mb_result r = try_epoch(dev, ds, &c, got, &rows);
            int hit = fail_nth(dev, kind, 0) - before >= nth;
            mb_mem_stats st = mb_device_mem_stats(dev);
            for (int k = 0; k < MB_MEM_KINDS; k++) assert_int_equal(st.live[k], 0); /* nothing leaked */
            if (r == MB_OK) {
                assert_int_equal(rows, N);
                assert_memory_equal(got, ref, sizeof ref);
                same += hit;
            } else {
                assert_int_equal(r, MB_ERR_OUT_OF_MEMORY);
                if (!strstr(mb_last_error(), "memory") && !strstr(mb_last_error(), "allocation"))
                    fail_msg("%s #%llu: unclear message: %s", kinds[kind], (unsigned long long)nth, mb_last_error());
                printf("  %s #%llu: %s\n", kinds[kind], (unsigned long long)nth, mb_last_error());
                errors++;
            }
            if (!hit) break; /* past the last allocation of this kind */
        }
        printf("%s allocations failed in turn: %d runs gave the same epoch, %d a clean error\n", kinds[kind], same,
               errors);
    }
    mb_device_deny_alloc(dev, MB_MEM_PINNED, 1);
    tu_ok(try_epoch(dev, ds, &c, got, &rows));
    mb_device_deny_alloc(dev, MB_MEM_PINNED, 0);
    assert_int_equal(rows, N);
    assert_memory_equal(got, ref, sizeof ref);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_PINNED], 0);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

static void test_device_failure_retries_smaller(void **state) {
    (void)state;
    int64_t ref[N], got[N];
    mb_device *dev = cpu_logged();
    mb_loader_config c = config(4, N, 3); /* resident */
    epoch_of(dev, &c, ref);
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 1);
    mb_dataset *ds = open_file();
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    assert_non_null(strstr(g_log, "retrying with"));
    assert_non_null(strstr(g_log, "fraction 0.60"));
    assert_int_equal(mb_loader_get_plan(ld)->buffers, 2); /* 0.8 x the budget no longer holds it all */
    int64_t nb;
    assert_int_equal(run_epoch(ld, got, &nb, 0), N);
    assert_memory_equal(ref, got, sizeof ref);
    mb_loader_close(ld);
    /* below one batch: a clear error, nothing leaked */
    c = config(8, 16, 3); /* two buffers of exactly one batch */
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 2);
    ld = (mb_loader *)1;
    tu_assert_error(mb_loader_open(&ld, dev, ds, &c), MB_ERR_OUT_OF_MEMORY, "below one batch of 8 samples");
    assert_null(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

static void test_nan_through_loader(void **state) {
    (void)state;
    static float feat[N * ROW], targ[N * K];
    memcpy(feat, g_feat, sizeof feat);
    memcpy(targ, g_targ, sizeof targ);
    feat[30 * ROW + 1] = NAN;
    const char *p = fx_path("nan_loader.h5");
    fx_write(p, feat, targ, N, T, F, K, NULL);
    mb_device *dev = tu_open_cpu();
    mb_dataset *ds;
    tu_ok(mb_dataset_open_file(&ds, p, NULL));
    mb_loader_config c = config(4, 12, 5);
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    mb_batch b = {0};
    mb_result r = MB_OK;
    int ok = 0;
    while ((r = mb_loader_next(ld, &b)) == MB_OK && !b.end_of_epoch) ok++;
    assert_int_equal(r, MB_ERR_NONFINITE);
    assert_non_null(strstr(mb_last_error(), "at sample 30"));
    assert_int_equal(ok, 7); /* chunks of 4 (budget 12 -> 2 x 6 -> whole batches): samples 0..27 came first */
    mb_loader_close(ld);
    mb_dataset_close(ds);
    /* skip: one sample fewer, the others intact */
    mb_dataset_config dc;
    memset(&dc, 0, sizeof dc);
    dc.nan_policy = MB_NAN_SKIP;
    tu_ok(mb_dataset_open_file(&ds, p, &dc));
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    int64_t rows = 0;
    while (mb_loader_next(ld, &b) == MB_OK && !b.end_of_epoch) {
        for (int64_t i = 0; i < b.count; i++)
            assert_int_not_equal((int64_t)floorf(-((const float *)b.targets)[i * K]), 30);
        rows += b.count;
    }
    assert_int_equal(rows, N - 1);
    mb_loader_close(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

/* Half-precision chunks: g_feat / g_targ converted with mb_f32_to_bf16 / f16. */
static uint16_t g_hfeat[N * ROW], g_htarg[N * K];
static void convert_source(mb_dtype dt) {
    for (int i = 0; i < N * ROW; i++) g_hfeat[i] = dt == MB_BF16 ? mb_f32_to_bf16(g_feat[i]) : mb_f32_to_f16(g_feat[i]);
    for (int i = 0; i < N * K; i++) g_htarg[i] = dt == MB_BF16 ? mb_f32_to_bf16(g_targ[i]) : mb_f32_to_f16(g_targ[i]);
}

/* One epoch of a half-precision loader: every row bitwise equal to a converted source
 * row; ids gets the matching sample ids in order. Returns rows. */
static int64_t run_epoch_half(mb_loader *ld, int64_t *ids, int64_t want_epoch) {
    mb_batch b;
    int64_t rows = 0, nb = 0;
    for (;;) {
        tu_ok(mb_loader_next(ld, &b));
        assert_int_equal(b.epoch, want_epoch);
        if (b.end_of_epoch) break;
        assert_int_equal(b.index, nb++);
        const uint16_t *f = (const uint16_t *)b.features, *t = (const uint16_t *)b.targets;
        for (int64_t i = 0; i < b.count; i++) {
            int64_t id = 0;
            while (id < N && (memcmp(f + i * ROW, g_hfeat + id * ROW, ROW * 2) || memcmp(t + i * K, g_htarg + id * K, K * 2)))
                id++;
            assert_true(id < N); /* no converted source row matched */
            assert_true(rows < N);
            ids[rows++] = id;
        }
    }
    assert_int_equal(nb, mb_loader_get_plan(ld)->batches);
    return rows;
}

/* bf16 and f16 chunks: every batch of 2 epochs equals the converted source rows, for
 * several chunk/slab/batch sizes, file order and shuffled (the same order as f32). */
static void test_half_epoch_matches_source(void **state) {
    (void)state;
    const mb_dtype dts[] = {MB_BF16, MB_F16};
    const size_t chunks[] = {N, 16, 7}, slabs[] = {1, 3, 64};
    const int64_t batches[] = {1, 4, 5};
    int64_t ids[N], ref[N];
    for (int di = 0; di < 2; di++) {
        convert_source(dts[di]);
        for (int ci = 0; ci < 3; ci++)
            for (int si = 0; si < 3; si++)
                for (int bi = 0; bi < 3; bi++)
                    for (int sh = 0; sh < 2; sh++) {
                        mb_device *dev = tu_open_cpu();
                        mb_dataset *ds = open_file();
                        mb_loader_config c = config(batches[bi], chunks[ci], slabs[si]);
                        c.shuffle = sh;
                        c.seed = 5;
                        mb_loader *ld = NULL, *l32 = NULL;
                        tu_ok(mb_loader_open(&l32, dev, ds, &c)); /* the f32 order, for the shuffle */
                        int64_t nb;
                        assert_int_equal(run_epoch(l32, ref, &nb, 0), N);
                        mb_loader_close(l32);
                        c.chunk_bytes /= 2; /* same samples per chunk as f32 */
                        c.dtype = dts[di];
                        tu_ok(mb_loader_open(&ld, dev, ds, &c));
                        assert_int_equal(mb_loader_get_plan(ld)->bytes_per_sample, (ROW + K) * 2);
                        for (int64_t e = 0; e < 2; e++) {
                            assert_int_equal(run_epoch_half(ld, ids, e), N);
                            if (e == 0) assert_memory_equal(ids, ref, sizeof ids);
                            if (!sh) for (int64_t i = 0; i < N; i++) assert_int_equal(ids[i], i);
                        }
                        mb_loader_close(ld);
                        mb_dataset_close(ds);
                        tu_close_checked(dev);
                    }
    }
}

/* The device conversion stage: an injected failure halves it (smaller reads, same
 * data); with one-sample slabs it cannot shrink: a clean error, nothing leaked. */
static void test_half_stage_failure(void **state) {
    (void)state;
    int64_t ids[N];
    convert_source(MB_BF16);
    mb_device *dev = cpu_logged();
    mb_dataset *ds = open_file();
    mb_loader_config c = config(4, N, 6); /* resident: device allocs chunk, stage, tmp_row */
    c.dtype = MB_BF16;
    c.shuffle = 1;
    mb_loader *ld;
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 2);
    tu_ok(mb_loader_open(&ld, dev, ds, &c));
    assert_non_null(strstr(g_log, "bf16 conversion stage failed; trying"));
    for (int e = 0; e < 2; e++) {
        assert_int_equal(run_epoch_half(ld, ids, e), N);
        int seen[N] = {0};
        for (int i = 0; i < N; i++) seen[ids[i]]++;
        for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
    }
    mb_loader_close(ld);
    c.slab_bytes = 1;
    c.dtype = MB_F16;
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 2);
    ld = (mb_loader *)1;
    tu_assert_error(mb_loader_open(&ld, dev, ds, &c), MB_ERR_OUT_OF_MEMORY, "f16 conversion stage of one sample");
    assert_null(ld);
    mb_dataset_close(ds);
    tu_close_checked(dev);
}

static int teardown_all(void **state) {
    (void)state;
    fx_cleanup();
    return 0;
}

int main(void) {
    fx_data(g_feat, g_targ, N, T, F, K);
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.chunked = 1;
    o.gzip = 1;
    g_file = fx_path("loader.h5");
    fx_write(g_file, g_feat, g_targ, N, T, F, K, &o);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_seeds_table),       cmocka_unit_test(test_plan_counts),
        cmocka_unit_test(test_plan_bad_input),         cmocka_unit_test(test_epoch_matches_source),
        cmocka_unit_test(test_shuffle_seeded_permutation), cmocka_unit_test(test_resume_mid_epoch),
        cmocka_unit_test(test_set_position_bad),       cmocka_unit_test(test_open_bad_input),
        cmocka_unit_test(test_pinned_failure_falls_back), cmocka_unit_test(test_device_failure_retries_smaller),
        cmocka_unit_test(test_every_allocation_fails_in_turn),
        cmocka_unit_test(test_nan_through_loader),
        cmocka_unit_test(test_half_epoch_matches_source), cmocka_unit_test(test_half_stage_failure),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
