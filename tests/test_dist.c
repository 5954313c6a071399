/* dist (docs/DIST.md). Built twice: as a plain test (a world of one: rank 0, size 1,
 * every reduction the identity) and with mpicc -DMEGABATCH_MPI as build/mpi/test_dist,
 * which tests/dist/run.sh runs under `mpirun -np 2` and `-np 3`. Every rank runs every
 * test; the test seed is rank 0's (broadcast), so all ranks draw the same numbers.
 *   - broadcast: ranks start from different weights, end with rank 0's, bitwise;
 *   - the all-reduce equals sum_r(count_r grad_r) / sum_r(count_r) added in rank order in
 *     double, bitwise, for random sizes and counts (zeros included), loss too;
 *   - training a linear layer with AdamW and clipping on W shards of a global batch (an
 *     uneven last step included): weights bitwise equal on every rank after every step,
 *     the clip norm bitwise equal, and weights and losses within 1e-5 of one process
 *     training on the whole global batch;
 *   - an inf/NaN gradient on one rank: every rank skips the step (f16 loss scaler backs off);
 *   - bad counts are refused on every rank alike. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

static mb_device *g_dev;
static mb_dist *g_dist;
static int g_rank, g_size;

/* A value every rank can compute: element i of rank r's array, stream s, from the seed. */
static float val(uint64_t seed, int r, uint64_t s, uint64_t i) {
    return mb_rng_symmetric(seed, ((uint64_t)r << 32) | s, i, 1.0f);
}

static mb_params *one_tensor(int64_t n, uint64_t seed) {
    mb_params *p;
    int idx;
    tu_ok(mb_params_create(&p, g_dev));
    tu_ok(mb_params_add(p, "w", 1, &n, 0.5f, &idx));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, seed));
    return p;
}

static void test_world(void **state) {
    (void)state;
    assert_true(g_size >= 1);
    assert_true(g_rank >= 0 && g_rank < g_size);
    assert_true(mb_dist_local_rank(g_dist) >= 0 && mb_dist_local_rank(g_dist) < g_size);
#ifndef MEGABATCH_MPI
    assert_int_equal(g_size, 1);
#endif
    assert_int_equal(mb_dist_size(NULL), 1);
    tu_ok(mb_dist_barrier(g_dist));
}

static void test_broadcast_params(void **state) {
    (void)state;
    int64_t n = 1000 + (int64_t)(tu_next() % 5000);
    mb_params *p = one_tensor(n, 100 + (uint64_t)g_rank), *want = one_tensor(n, 100);
    int same = -1;
    tu_ok(mb_dist_check_sync(g_dist, p, &same));
    assert_int_equal(same, g_size == 1);
    tu_ok(mb_dist_broadcast_params(g_dist, p));
    tu_ok(mb_dist_check_sync(g_dist, p, &same));
    assert_int_equal(same, 1);
    assert_memory_equal(mb_params_data(p), mb_params_data(want), (size_t)n * sizeof(float));
    mb_params_destroy(p);
    mb_params_destroy(want);
}

static void test_allreduce_exact(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        uint64_t seed = tu_next();
        int64_t n = 1 + (int64_t)(tu_next() % (rep < 10 ? 7 : 40000)); /* fewer elements than ranks, too */
        int64_t counts[16], total = 0;
        for (int r = 0; r < g_size; r++) {
            counts[r] = (int64_t)(tu_next() % 4) == 0 ? 0 : 1 + (int64_t)(tu_next() % 300);
            total += counts[r];
        }
        if (!total) { counts[g_size - 1] = 7; total = 7; }
        mb_params *p = one_tensor(n, 1);
        float *g = mb_params_grad(p), loss = val(seed, g_rank, 1, 0), *want = tu_alloc_f32((size_t)n);
        for (int64_t i = 0; i < n; i++) g[i] = val(seed, g_rank, 0, (uint64_t)i);
        double lw = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int r = 0; r < g_size; r++) s += (double)val(seed, r, 0, (uint64_t)i) * (double)counts[r];
            want[i] = g_size == 1 ? g[i] : (float)(s / (double)total);
        }
        for (int r = 0; r < g_size; r++) lw += (double)val(seed, r, 1, 0) * (double)counts[r];
        float lwant = g_size == 1 ? loss : (float)(lw / (double)total);
        int64_t got_total = 0;
        tu_ok(mb_dist_allreduce_grads(g_dist, p, counts[g_rank], &loss, &got_total));
        assert_int_equal(got_total, total);
        assert_memory_equal(g, want, (size_t)n * sizeof(float));
        assert_memory_equal(&loss, &lwant, sizeof loss);
        free(want);
        mb_params_destroy(p);
    }
    mb_dist_stats st = mb_dist_get_stats(g_dist);
    assert_int_equal(st.reductions, g_size > 1 ? 20 : 0);
}

/* A linear layer in -> out with MSE, trained by AdamW with clipping. */
enum { IN = 24, OUT = 3, BATCH = 5, STEPS = 12 };
typedef struct lin_model { mb_params *p; mb_linear l; mb_adamw *opt; float *y, *dy, *loss; } lin_model;

static void lin_create(lin_model *m, int64_t maxb) {
    tu_ok(mb_params_create(&m->p, g_dev));
    tu_ok(mb_linear_init(&m->l, m->p, "fc", IN, OUT));
    tu_ok(mb_params_finalize(m->p));
    tu_ok(mb_params_init(m->p, 7));
    mb_adamw_config c = mb_adamw_config_default();
    c.max_grad_norm = 0.05f; /* small: clipping happens */
    tu_ok(mb_adamw_create(&m->opt, m->p, &c));
    m->y = tu_alloc_f32((size_t)(maxb * OUT));
    m->dy = tu_alloc_f32((size_t)(maxb * OUT));
    m->loss = tu_alloc_f32(1);
}
static void lin_destroy(lin_model *m) {
    mb_adamw_destroy(m->opt);
    mb_params_destroy(m->p);
    free(m->y); free(m->dy); free(m->loss);
}
/* forward + backward of B samples: gradients of the mean loss; returns the loss */
static float lin_grad(lin_model *m, const float *x, const float *t, int64_t B) {
    tu_ok(mb_params_zero_grad(m->p));
    tu_ok(mb_linear_forward(&m->l, MB_STREAM_COMPUTE, x, B, m->y));
    tu_ok(mb_loss(g_dev, MB_STREAM_COMPUTE, NULL, m->y, t, B, OUT, 1.0f, NULL, m->loss, m->dy));
    tu_ok(mb_linear_backward(&m->l, MB_STREAM_COMPUTE, x, m->dy, B, NULL));
    float l;
    tu_ok(mb_fetch_scalar(g_dev, MB_STREAM_COMPUTE, m->loss, &l));
    return l;
}

static void test_training_matches_one_process(void **state) {
    (void)state;
    uint64_t seed = tu_next();
    int64_t gmax = BATCH * g_size;
    float *x = tu_alloc_f32((size_t)(gmax * IN)), *t = tu_alloc_f32((size_t)(gmax * OUT));
    lin_model m, ref;
    lin_create(&m, BATCH);
    lin_create(&ref, gmax);
    if (g_rank) tu_ok(mb_params_init(m.p, 1000 + (uint64_t)g_rank)); /* other starts: the broadcast fixes them */
    tu_ok(mb_dist_broadcast_params(g_dist, m.p));
    assert_memory_equal(mb_params_data(m.p), mb_params_data(ref.p), mb_params_total(m.p) * sizeof(float));
    double worst_w = 0, worst_l = 0;
    for (int step = 0; step < STEPS; step++) {
        /* the global batch: rank r's rows [off_r, off_r + b_r); the last step uneven */
        int64_t b[16], off[16], g = 0;
        for (int r = 0; r < g_size; r++) {
            b[r] = step == STEPS - 1 ? 1 + (r * 3) % BATCH : BATCH;
            off[r] = g;
            g += b[r];
        }
        for (int64_t i = 0; i < g * IN; i++) x[i] = val(seed, 0, 10 + (uint64_t)step, (uint64_t)i);
        for (int64_t i = 0; i < g * OUT; i++) t[i] = val(seed, 0, 1000 + (uint64_t)step, (uint64_t)i);
        // snippet: dist-step
        /* forward + backward of this rank's b[g_rank] samples: the gradient of their mean loss */
        float l = lin_grad(&m, x + off[g_rank] * IN, t + off[g_rank] * OUT, b[g_rank]);
        /* every rank: the gradient (and loss) of the mean over all ranks' samples */
        tu_ok(mb_dist_allreduce_grads(g_dist, m.p, b[g_rank], &l, NULL));
        float lr = 1e-2f;
        tu_ok(mb_adamw_step(m.opt, lr, NULL)); /* clips by the global norm: the same bits everywhere */
        // end snippet
        float lref = lin_grad(&ref, x, t, g);
        tu_ok(mb_adamw_step(ref.opt, lr, NULL));
        int same = 0;
        tu_ok(mb_dist_check_sync(g_dist, m.p, &same));
        assert_int_equal(same, 1);
        float norm = 0, norm0, nref = 0;
        tu_ok(mb_adamw_grad_norm(m.opt, &norm));
        tu_ok(mb_adamw_grad_norm(ref.opt, &nref));
        norm0 = norm;
        tu_ok(mb_dist_broadcast(g_dist, &norm0, sizeof norm0));
        assert_memory_equal(&norm, &norm0, sizeof norm); /* every rank clipped by the same norm */
        assert_true(nref > 0.05f);                        /* ... and clipping was on */
        assert_true(fabs((double)norm - (double)nref) <= 1e-5 * (double)nref);
        worst_l = fmax(worst_l, fabs((double)l - (double)lref) / fabs((double)lref));
        assert_true(fabs((double)l - (double)lref) <= 1e-5 * fabs((double)lref));
        worst_w = fmax(worst_w, tu_assert_close(mb_params_data(m.p), mb_params_data(ref.p), mb_params_total(m.p),
                                                1e-6, 1e-5, "weights vs one process"));
    }
    if (g_rank == 0) printf("world %d: worst weight error %.3g, worst loss rel. error %.3g over %d steps\n", g_size,
                            worst_w, worst_l, STEPS);
    lin_destroy(&m);
    lin_destroy(&ref);
    free(x); free(t);
}

static void test_nonfinite_skips_everywhere(void **state) {
    (void)state;
    lin_model m;
    lin_create(&m, BATCH);
    mb_scaler *sc;
    tu_ok(mb_scaler_create(&sc, g_dev, NULL));
    float *x = tu_alloc_f32(BATCH * IN), *t = tu_alloc_f32(BATCH * OUT);
    tu_fill(x, BATCH * IN, -1, 1);
    tu_fill(t, BATCH * OUT, -1, 1);
    size_t n = mb_params_total(m.p);
    float *before = tu_alloc_f32(n);
    for (int bad = 0; bad < 2; bad++) {
        lin_grad(&m, x, t, BATCH);
        if (bad && g_rank == g_size - 1) mb_params_grad(m.p)[tu_next() % n] = (tu_next() & 1) ? NAN : INFINITY;
        tu_ok(mb_params_get(m.p, before));
        tu_ok(mb_dist_allreduce_grads(g_dist, m.p, BATCH, NULL, NULL));
        tu_ok(mb_scaler_unscale(sc, mb_params_grad(m.p), n));
        tu_ok(mb_adamw_step(m.opt, 1e-2f, sc));
        tu_ok(mb_scaler_update(sc));
        int taken = -1;
        tu_ok(mb_adamw_last_step_taken(m.opt, &taken));
        double all[1] = {(double)taken};
        tu_ok(mb_dist_sum(g_dist, all, 1));
        assert_true(all[0] == (bad ? 0.0 : (double)g_size)); /* every rank took, or every rank skipped */
        mb_scaler_state st;
        tu_ok(mb_scaler_get(sc, &st));
        assert_true(st.scale == (bad ? 32768.0f : 65536.0f));
        if (bad) assert_memory_equal(mb_params_data(m.p), before, n * sizeof(float));
        int same = 0;
        tu_ok(mb_dist_check_sync(g_dist, m.p, &same));
        assert_int_equal(same, 1);
    }
    free(x); free(t); free(before);
    mb_scaler_destroy(sc);
    lin_destroy(&m);
}

static void test_bad_counts(void **state) {
    (void)state;
    mb_params *p = one_tensor(10, 1);
    assert_int_equal(mb_dist_allreduce_grads(g_dist, p, -1, NULL, NULL), MB_ERR_INVALID_ARG);
    assert_int_equal(mb_dist_allreduce_grads(g_dist, p, ((int64_t)1 << 24) + 1, NULL, NULL), MB_ERR_INVALID_ARG);
    assert_int_equal(mb_dist_allreduce_grads(g_dist, p, 0, NULL, NULL), MB_ERR_INVALID_ARG); /* on every rank */
    assert_non_null(strstr(mb_last_error(), "no samples"));
    assert_int_equal(mb_dist_allreduce_grads(NULL, p, 1, NULL, NULL), MB_ERR_INVALID_ARG);
    tu_ok(mb_dist_allreduce_grads(g_dist, p, 1, NULL, NULL)); /* still usable */
    mb_params_destroy(p);
}

int main(void) {
    if (mb_device_open(&g_dev, NULL) != MB_OK || mb_dist_open(&g_dist, g_dev) != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 1;
    }
    g_rank = mb_dist_rank(g_dist);
    g_size = mb_dist_size(g_dist);
    if (g_size > 16) { fprintf(stderr, "test_dist: at most 16 ranks\n"); return 1; }
    uint64_t seed = tu_seed(); /* rank 0's seed for everyone */
    if (mb_dist_broadcast(g_dist, &seed, sizeof seed) != MB_OK) return 1;
    tu_rng_state = seed;
    if (g_rank == 0) printf("world size %d, seed %llu\n", g_size, (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world),
        cmocka_unit_test(test_broadcast_params),
        cmocka_unit_test(test_allreduce_exact),
        cmocka_unit_test(test_training_matches_one_process),
        cmocka_unit_test(test_nonfinite_skips_everywhere),
        cmocka_unit_test(test_bad_counts),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    mb_dist_close(g_dist);
    mb_device_close(g_dev);
    return failed;
}
