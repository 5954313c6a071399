/* Loader sharding for data parallelism (docs/DIST.md), in one process: for world sizes
 * 1..4, ranks' batch k put side by side in rank order equal batch k of the unsharded
 * loader with the global batch W*B (file and memory datasets, shuffle on and off,
 * drop_last on and off, resident and double-buffered chunks, slabs smaller than a shard),
 * except a last short global batch of fewer than W samples, which the ranks drop; every
 * rank has the same number of batches (plan.batches); resume at a random position gives
 * the same remaining batches; bad shards are refused. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"

enum { T = 3, F = 2, K = 1, ROW = T * F, MAXN = 97, MAXW = 4 };
static float g_feat[MAXN * ROW], g_targ[MAXN * K];
static const char *g_file;

/* sample ids of a batch (the fixture's first feature identifies the row) */
static int64_t ids(const mb_batch *b, int64_t *out) {
    const float *f = (const float *)b->features;
    for (int64_t i = 0; i < b->count; i++) {
        int64_t id = -1;
        for (int64_t s = 0; s < MAXN; s++)
            if (memcmp(&g_feat[s * ROW], f + i * ROW, ROW * sizeof(float)) == 0) { id = s; break; }
        assert_true(id >= 0);
        assert_memory_equal(&g_targ[id * K], (const float *)b->targets + i * K, K * sizeof(float));
        out[i] = id;
    }
    return b->count;
}

typedef struct shard_case { int64_t n, batch, chunk, slab; int w, shuffle, drop_last, file; uint64_t seed; } shard_case;

static mb_loader_config cfg_of(const shard_case *c, int rank, int w) {
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = c->batch * (rank < 0 ? w : 1);
    lc.shuffle = c->shuffle; lc.seed = c->seed; lc.drop_last = c->drop_last;
    lc.chunk_bytes = (size_t)c->chunk * (ROW + K) * sizeof(float) * (size_t)(rank < 0 ? w : 1); /* shards: W x */
    lc.slab_bytes = (size_t)c->slab * (ROW + K) * sizeof(float);
    if (rank >= 0) { lc.shard_rank = rank; lc.shard_count = w; }
    return lc;
}

static void open_loader(mb_device *dev, const shard_case *c, int rank, mb_dataset **ds, mb_loader **ld) {
    if (c->file) tu_ok(mb_dataset_open_file(ds, g_file, NULL));
    else tu_ok(mb_dataset_open_memory(ds, g_feat, g_targ, c->n, T, F, K, NULL));
    mb_loader_config lc = cfg_of(c, rank, c->w);
    tu_ok(mb_loader_open(ld, dev, *ds, &lc));
}

/* Two epochs (or the rest of the current one and the next, from a position): every
 * global batch of the reference equals the ranks' batches side by side. */
static void check_case(const shard_case *c, int resume) {
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_dataset *rds, *ds[MAXW] = {0};
    mb_loader *ref, *ld[MAXW] = {0};
    open_loader(dev, c, -1, &rds, &ref);
    for (int r = 0; r < c->w; r++) {
        open_loader(dev, c, r, &ds[r], &ld[r]);
        assert_int_equal(mb_loader_get_plan(ld[r])->batches, mb_loader_get_plan(ld[0])->batches);
        assert_int_equal(mb_loader_get_plan(ld[r])->chunks, mb_loader_get_plan(ref)->chunks);
    }
    if (resume) { /* a position part-way: every rank and the reference jump there */
        mb_batch b;
        int64_t skip = tu_int(0, (int)mb_loader_get_plan(ld[0])->batches);
        for (int64_t k = 0; k < skip; k++) {
            tu_ok(mb_loader_next(ld[0], &b));
            if (b.count == 0) break;
        }
        mb_loader_pos pos = mb_loader_position(ld[0]);
        for (int r = 0; r < c->w; r++) tu_ok(mb_loader_set_position(ld[r], pos));
        tu_ok(mb_loader_set_position(ref, pos));
    }
    int64_t want[MAXN], got[MAXN];
    for (int epoch = 0; epoch < 2; epoch++) {
        int64_t batches = 0;
        for (;;) {
            mb_batch rb, b;
            tu_ok(mb_loader_next(ref, &rb));
            int64_t nw = ids(&rb, want), ng = 0;
            if (rb.count > 0 && rb.count < c->w) continue; /* a tail of fewer than W samples: the ranks drop it */
            for (int r = 0; r < c->w; r++) {
                tu_ok(mb_loader_next(ld[r], &b));
                assert_int_equal(b.count == 0, rb.count == 0);
                assert_true(b.count <= c->batch);
                ng += ids(&b, got + ng);
            }
            if (rb.count == 0) break;
            assert_int_equal(ng, nw);
            assert_memory_equal(got, want, (size_t)nw * sizeof(int64_t));
            batches++;
        }
        if (!resume || epoch > 0) assert_int_equal(batches, mb_loader_get_plan(ld[0])->batches);
    }
    for (int r = 0; r < c->w; r++) { mb_loader_close(ld[r]); mb_dataset_close(ds[r]); }
    mb_loader_close(ref);
    mb_dataset_close(rds);
    mb_device_close(dev);
}

static void test_shards_make_the_global_batch(void **state) {
    (void)state;
    int cases = 0;
    for (int w = 1; w <= MAXW; w++)
        for (int file = 0; file < 2; file++)
            for (int shuffle = 0; shuffle < 2; shuffle++)
                for (int drop = 0; drop < 2; drop++)
                    for (int rep = 0; rep < 3; rep++) {
                        shard_case c;
                        c.w = w; c.file = file; c.shuffle = shuffle; c.drop_last = drop;
                        c.n = file ? MAXN : tu_int(1, MAXN);
                        c.batch = tu_int(1, 7);
                        c.chunk = rep == 0 ? MAXN : tu_int(1, MAXN); /* resident, or chunks */
                        c.slab = tu_int(1, 12);
                        c.seed = tu_next();
                        check_case(&c, rep == 2);
                        cases++;
                    }
    printf("%d sharded cases\n", cases);
}

static void test_bad_shard(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_dataset *ds;
    tu_ok(mb_dataset_open_memory(&ds, g_feat, g_targ, MAXN, T, F, K, NULL));
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = 4; lc.chunk_bytes = 1 << 20;
    lc.shard_count = 2; lc.shard_rank = 2;
    mb_loader *ld = NULL;
    assert_int_equal(mb_loader_open(&ld, dev, ds, &lc), MB_ERR_INVALID_ARG);
    assert_non_null(strstr(mb_last_error(), "shard 2 of 2"));
    lc.shard_rank = -1;
    assert_int_equal(mb_loader_open(&ld, dev, ds, &lc), MB_ERR_INVALID_ARG);
    assert_null(ld);
    mb_dataset_close(ds);
    mb_device_close(dev);
}

static int teardown_all(void **state) {
    (void)state;
    remove(g_file);
    fx_cleanup();
    return 0;
}

int main(void) {
    tu_seed();
    fx_data(g_feat, g_targ, MAXN, T, F, K);
    fx_opts o;
    memset(&o, 0, sizeof o);
    g_file = fx_path("dist_shard.h5");
    fx_write(g_file, g_feat, g_targ, MAXN, T, F, K, &o);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_make_the_global_batch),
        cmocka_unit_test(test_bad_shard),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
