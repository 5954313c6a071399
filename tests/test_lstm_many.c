/* test_lstm_many: mb_lstm_forward_many / mb_lstm_backward_many run independent LSTMs
 * side by side (CPU threads) with results equal, bit for bit, to single calls in order;
 * segments read in place from one wide batch (x_stride); bad input; errors from a
 * worker thread reach the caller; one LSTM whose steps' rows are split over the pool (the
 * CPU recurrence) gives the 1-thread bits. Also run under ThreadSanitizer (make tsan). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

enum { NL = 5 };

typedef struct encoders {
    mb_device *dev;
    mb_params *p;
    mb_lstm *l[NL];
    int64_t B, F, Ttot, T[NL], off[NL], H[NL];
    int layers[NL];
} encoders;

/* Five encoders over segments of one (B, Ttot, F) batch, random sizes and checkpointing. */
static encoders make_encoders(int threads) {
    encoders e;
    memset(&e, 0, sizeof e);
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MB_CPU; dc.threads = threads; dc.streams = 2 + NL;
    tu_ok(mb_device_open(&e.dev, &dc));
    tu_ok(mb_params_create(&e.p, e.dev));
    e.B = tu_int(1, 6); e.F = tu_int(1, 7);
    for (int s = 0; s < NL; s++) {
        e.T[s] = tu_int(1, 40); e.H[s] = tu_int(1, 9); e.layers[s] = tu_int(1, 2);
        e.off[s] = e.Ttot;
        e.Ttot += e.T[s];
        char prefix[16];
        snprintf(prefix, sizeof prefix, "e%d.", s);
        mb_lstm_config c;
        memset(&c, 0, sizeof c);
        c.input_size = e.F; c.hidden_size = e.H[s]; c.layers = e.layers[s]; c.prefix = prefix;
        c.checkpoint = tu_int(-1, 3); c.max_steps = e.T[s]; c.max_batch = e.B; c.stream = 2 + s;
        tu_ok(mb_lstm_create(&e.l[s], e.p, &c));
    }
    tu_ok(mb_params_finalize(e.p));
    tu_ok(mb_params_init(e.p, 7));
    return e;
}

static void free_encoders(encoders *e) {
    for (int s = 0; s < NL; s++) mb_lstm_destroy(e->l[s]);
    mb_params_destroy(e->p);
    mb_device_close(e->dev);
}

/* One call per encoder: segment s of the (B, Ttot, F) batch x, read in place. */
static void segment_calls(const encoders *e, const float *x, mb_lstm_call *calls) {
    memset(calls, 0, NL * sizeof *calls);
    for (int s = 0; s < NL; s++) {
        calls[s].lstm = e->l[s]; calls[s].x = x + e->off[s] * e->F; calls[s].x_stride = e->Ttot * e->F;
        calls[s].B = e->B; calls[s].T = e->T[s];
    }
}

static void test_many_equals_single_calls(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        encoders e = make_encoders(rep % 2 ? 2 : 4);
        size_t nx = (size_t)(e.B * e.Ttot * e.F), np = mb_params_total(e.p);
        float *x = tu_alloc_f32(nx), *dx_many = tu_alloc_f32(nx), *dx_one = tu_alloc_f32(nx);
        float *g_many = tu_alloc_f32(np), *xs = tu_alloc_f32(nx), *dxs = tu_alloc_f32(nx);
        float *hl[NL][2], *dh[NL], *hn[NL][2];
        tu_fill(x, nx, -2, 2);
        mb_lstm_call calls[NL];
        memset(calls, 0, sizeof calls);
        for (int s = 0; s < NL; s++) {
            size_t bh = (size_t)(e.B * e.H[s]), lbh = bh * (size_t)e.layers[s];
            hl[s][0] = tu_alloc_f32(bh); hl[s][1] = tu_alloc_f32(bh); dh[s] = tu_alloc_f32(bh);
            hn[s][0] = tu_alloc_f32(2 * lbh); hn[s][1] = tu_alloc_f32(2 * lbh);
            tu_fill(dh[s], bh, -1, 1);
            mb_lstm_call c = {0};
            c.lstm = e.l[s]; c.x = x + e.off[s] * e.F; c.x_stride = e.Ttot * e.F; c.B = e.B; c.T = e.T[s];
            c.h_last = hl[s][0]; c.dh_last = dh[s]; c.dx = dx_many + e.off[s] * e.F;
            calls[s] = c;
        }
        /* many: segments in place, dx into the wide gradient */
        tu_ok(mb_params_zero_grad(e.p));
        tu_ok(mb_lstm_forward_many(calls, NL));
        for (int s = 0; s < NL; s++) tu_ok(mb_lstm_final_state(e.l[s], hn[s][0], hn[s][0] + e.layers[s] * e.B * e.H[s]));
        tu_ok(mb_lstm_backward_many(calls, NL));
        memcpy(g_many, mb_params_grad(e.p), np * sizeof(float));
        /* single calls in order, each on a contiguous copy of its segment */
        tu_ok(mb_params_zero_grad(e.p));
        for (int s = 0; s < NL; s++) {
            for (int64_t b = 0; b < e.B; b++)
                memcpy(xs + b * e.T[s] * e.F, x + (b * e.Ttot + e.off[s]) * e.F, (size_t)(e.T[s] * e.F) * sizeof(float));
            tu_ok(mb_lstm_forward(e.l[s], xs, e.B, e.T[s], NULL, NULL, NULL, hl[s][1]));
            tu_ok(mb_lstm_final_state(e.l[s], hn[s][1], hn[s][1] + e.layers[s] * e.B * e.H[s]));
            tu_ok(mb_lstm_backward(e.l[s], dh[s], NULL, dxs, NULL, NULL));
            for (int64_t b = 0; b < e.B; b++)
                memcpy(dx_one + (b * e.Ttot + e.off[s]) * e.F, dxs + b * e.T[s] * e.F, (size_t)(e.T[s] * e.F) * sizeof(float));
            size_t bh = (size_t)(e.B * e.H[s]);
            assert_memory_equal(hl[s][0], hl[s][1], bh * sizeof(float));
            assert_memory_equal(hn[s][0], hn[s][1], 2 * bh * (size_t)e.layers[s] * sizeof(float));
        }
        assert_memory_equal(g_many, mb_params_grad(e.p), np * sizeof(float));
        assert_memory_equal(dx_many, dx_one, nx * sizeof(float));
        for (int s = 0; s < NL; s++) { free(hl[s][0]); free(hl[s][1]); free(dh[s]); free(hn[s][0]); free(hn[s][1]); }
        free(x); free(dx_many); free(dx_one); free(g_many); free(xs); free(dxs);
        free_encoders(&e);
    }
}

static void test_blas_threads_restored(void **state) {
    (void)state;
#if !defined(MEGABATCH_NO_CBLAS) && defined(OPENBLAS_VERSION)
    encoders e = make_encoders(2);
    int before = openblas_get_num_threads();
    float *x = tu_alloc_f32((size_t)(e.B * e.Ttot * e.F));
    mb_lstm_call calls[NL];
    segment_calls(&e, x, calls);
    tu_ok(mb_lstm_forward_many(calls, NL));
    assert_int_equal(openblas_get_num_threads(), before);
    free(x);
    free_encoders(&e);
#else
    skip();
#endif
}

static void test_bad_calls(void **state) {
    (void)state;
    encoders e = make_encoders(2);
    float *x = tu_alloc_f32((size_t)(e.B * e.Ttot * e.F));
    mb_lstm_call calls[NL];
    segment_calls(&e, x, calls);
    tu_ok(mb_lstm_forward_many(calls, 0));
    tu_assert_error(mb_lstm_forward_many(NULL, 2), MB_ERR_INVALID_ARG, "calls=");
    tu_assert_error(mb_lstm_forward_many(calls, -1), MB_ERR_INVALID_ARG, "n=-1");
    tu_assert_error(mb_lstm_forward_many(calls, 65), MB_ERR_INVALID_ARG, "n=65 (0..64)");
    mb_lstm_call two[2] = {calls[1], calls[1]};
    tu_assert_error(mb_lstm_forward_many(two, 2), MB_ERR_INVALID_ARG, "same LSTM");
    two[1].lstm = NULL;
    tu_assert_error(mb_lstm_forward_many(two, 2), MB_ERR_INVALID_ARG, "calls[1].lstm is NULL");
    /* a failure inside one call (on a worker thread) is the caller's error, with its message */
    mb_lstm_call bad[NL];
    memcpy(bad, calls, sizeof bad);
    bad[3].B = e.B + 1;
    tu_assert_error(mb_lstm_forward_many(bad, NL), MB_ERR_INVALID_ARG, "exceed max_batch");
    /* x_stride too small: 0 means "T*F" (the default), so the too-small stride T*F - 1
       is only a bad one where T*F >= 2: use the widest segment (issue 13: segment 2 had
       T = F = 1, stride 0, and the call rightly succeeded). A negative stride always is. */
    int wide = 0;
    for (int s = 1; s < NL; s++) if (e.T[s] > e.T[wide]) wide = s;
    memcpy(bad, calls, sizeof bad);
    bad[wide].x_stride = -1;
    tu_assert_error(mb_lstm_forward_many(bad, NL), MB_ERR_INVALID_ARG, "x_stride=-1");
    if (e.T[wide] * e.F >= 2) {
        bad[wide].x_stride = e.T[wide] * e.F - 1;
        tu_assert_error(mb_lstm_forward_many(bad, NL), MB_ERR_INVALID_ARG, "x_stride");
    }
    /* backward before any forward of that LSTM */
    encoders f = make_encoders(2);
    mb_lstm_call b1 = {0};
    b1.lstm = f.l[0];
    tu_assert_error(mb_lstm_backward_many(&b1, 1), MB_ERR_STATE, "before mb_lstm_forward");
    free_encoders(&f);
    free(x);
    free_encoders(&e);
}

/* One LSTM (H = 256, F <= 256, L <= 2) forward and backward on a device of `threads`
 * threads: h_last, the gradients (returns their count) and dx. split: whether each step's
 * rows must go to the pool (checked). */
static size_t run_split(int threads, int64_t B, int64_t T, int64_t F, int L, int ck, const float *x,
                        const float *dh, float *hl, float *grad, float *dx, int split) {
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.threads = threads;
    tu_ok(mb_device_open(&dev, &dc));
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config c;
    memset(&c, 0, sizeof c);
    c.input_size = F; c.hidden_size = 256; c.layers = L; c.checkpoint = ck; c.max_steps = T; c.max_batch = B;
    tu_ok(mb_lstm_create(&l, p, &c));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 11));
    tu_ok(mb_lstm_forward(l, x, B, T, NULL, NULL, NULL, hl));
    assert_int_equal(mb__rec_split(l), split);
    tu_ok(mb_lstm_backward(l, dh, NULL, dx, NULL, NULL));
    size_t np = mb_params_total(p);
    memcpy(grad, mb_params_grad(p), np * sizeof(float));
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    mb_device_close(dev);
    return np;
}

/* A single LSTM on 2 and 3 threads, at a shape where each step's rows are split over the
 * pool (the CPU recurrence), gives the bits of 1 thread. */
static void test_split_rows_bitwise(void **state) {
    (void)state;
    int64_t B = tu_int(32, 40), T = tu_int(2, 4), F = tu_int(1, 5);
    int L = tu_int(1, 2), ck = tu_int(0, 1) ? -1 : 1;
    size_t nx = (size_t)(B * T * F), bh = (size_t)B * 256, cap = 2 * 1024 * (256 + 256 + 2); /* >= the params */
    float *x = tu_alloc_f32(nx), *dh = tu_alloc_f32(bh), *hl[2], *g[2], *dx[2];
    tu_fill(x, nx, -2, 2); tu_fill(dh, bh, -1, 1);
    for (int i = 0; i < 2; i++) { hl[i] = tu_alloc_f32(bh); g[i] = tu_alloc_f32(cap); dx[i] = tu_alloc_f32(nx); }
    size_t np = run_split(1, B, T, F, L, ck, x, dh, hl[0], g[0], dx[0], 0);
    assert_true(np <= cap);
    for (int th = 2; th <= 3; th++) {
        run_split(th, B, T, F, L, ck, x, dh, hl[1], g[1], dx[1], 1);
        assert_memory_equal(hl[1], hl[0], bh * sizeof(float));
        assert_memory_equal(g[1], g[0], np * sizeof(float));
        assert_memory_equal(dx[1], dx[0], nx * sizeof(float));
    }
    for (int i = 0; i < 2; i++) { free(hl[i]); free(g[i]); free(dx[i]); }
    free(x); free(dh);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_equals_single_calls),
        cmocka_unit_test(test_blas_threads_restored),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_split_rows_bitwise),
    };
    tu_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
