/* test_denormals: the CPU backend computes with flush-to-zero + denormals-are-zero by
 * default (x86), with IEEE denormals when mb_device_config.keep_denormals = 1; the
 * caller's FTZ/DAZ bits come back unchanged from every call, whatever they were; the pool
 * workers run in the device's mode; an LSTM's results in the two modes agree within
 * tolerance. Skipped where there is no SSE MXCSR. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

#ifdef MB__MXCSR

static const float DENORM = 1e-39f; /* below FLT_MIN = 1.18e-38 */

static mb_device *open_dev(int keep, int threads) {
    mb_device_config c;
    memset(&c, 0, sizeof c);
    c.threads = threads; c.keep_denormals = keep; c.streams = 4;
    mb_device *dev = NULL;
    tu_ok(mb_device_open(&dev, &c));
    return dev;
}

/* Tested on the bits: a float compare would itself see denormals as 0 under the
 * caller's DAZ. */
static uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static int is_denormal(float x) { return (bits(x) & 0x7f800000u) == 0 && (bits(x) & 0x007fffffu) != 0; }

static unsigned csr_mode(void) { return _mm_getcsr() & ~0x3fu; } /* all but the exception flags */

/* x = a * b through mb_gemm (1x1x1). */
static float gemm1(mb_device *dev, float a, float b) {
    float c = 123.0f;
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = g.n = g.k = 1; g.alpha = 1.0f; g.ab_type = MB_F32; g.c_type = MB_F32;
    g.a = &a; g.lda = 1; g.b = &b; g.ldb = 1; g.c = &c; g.ldc = 1;
    tu_ok(mb_gemm(dev, &g));
    return c;
}

static void test_mode_and_restore(void **state) {
    (void)state;
    unsigned saved = _mm_getcsr();
    unsigned caller[2] = {saved & ~(unsigned)MB__FTZ_DAZ, saved | (unsigned)MB__FTZ_DAZ};
    for (int keep = 0; keep < 2; keep++)
        for (int ci = 0; ci < 2; ci++) {
            mb_device *dev = open_dev(keep, 1);
            _mm_setcsr(caller[ci]);
            unsigned before = csr_mode();
            float daz = gemm1(dev, DENORM, 1.0f), ftz = gemm1(dev, 1e-20f, 1e-20f);
            assert_int_equal(csr_mode(), before);
            if (keep) { /* IEEE whatever the caller had */
                assert_int_equal(bits(daz), bits(DENORM));
                assert_true(is_denormal(ftz));
            } else {
                assert_int_equal(bits(daz), 0);
                assert_int_equal(bits(ftz), 0);
            }
            mb_device_close(dev);
            assert_int_equal(csr_mode(), before);
        }
    _mm_setcsr(saved);
}

/* The pool workers run in the device's mode: a job of 3 items on the caller and 2 workers,
 * each item held at a barrier of 3, so every thread takes exactly one. */
typedef struct seen {
    pthread_mutex_t mu;
    pthread_barrier_t all;
    pthread_t caller;
    unsigned worker_csr;
    int worker_runs;
} seen;
static void record(void *arg, int item) {
    seen *s = (seen *)arg;
    (void)item;
    unsigned c = _mm_getcsr();
    pthread_mutex_lock(&s->mu);
    if (!pthread_equal(pthread_self(), s->caller)) { s->worker_csr = c; s->worker_runs++; }
    pthread_mutex_unlock(&s->mu);
    pthread_barrier_wait(&s->all);
}

static void test_pool_workers_mode(void **state) {
    (void)state;
    for (int keep = 0; keep < 2; keep++) {
        mb_device *dev = open_dev(keep, 3);
        seen s;
        memset(&s, 0, sizeof s);
        pthread_mutex_init(&s.mu, NULL);
        pthread_barrier_init(&s.all, NULL, 3);
        s.caller = pthread_self();
        for (int rep = 0; rep < 20; rep++) MB__POOL_FOR(dev, 2, 3, record, &s);
        assert_int_equal(s.worker_runs, 40); /* every job ran on both workers asked for */
        assert_int_equal(s.worker_csr & MB__FTZ_DAZ, keep ? 0u : (unsigned)MB__FTZ_DAZ);
        pthread_barrier_destroy(&s.all);
        pthread_mutex_destroy(&s.mu);
        mb_device_close(dev);
    }
}

/* A gemm large enough to be split over the pool: every part in the device's mode, and
 * the same bits as on a 1-thread device (the parts do not depend on who runs them). */
static void test_split_gemm(void **state) {
    (void)state;
    int64_t m = tu_int(128, 200), n = tu_int(257, 700), k = tu_int(128, 200); /* 2-3 parts */
    int ta = tu_int(0, 1), tb = tu_int(0, 1);
    float *a = tu_alloc_f32((size_t)(m * k)), *b = tu_alloc_f32((size_t)(k * n)), *c[2];
    tu_fill(a, (size_t)(m * k), -1, 1); tu_fill(b, (size_t)(k * n), -1, 1);
    for (size_t i = 0; i < (size_t)(m * k); i += 3) a[i] = DENORM; /* read as 0 under DAZ */
    for (int r = 0; r < 2; r++) {
        mb_device *dev = open_dev(0, r == 0 ? 1 : 3);
        c[r] = tu_alloc_f32((size_t)(m * n));
        mb_gemm_args g;
        memset(&g, 0, sizeof g);
        g.trans_a = ta; g.trans_b = tb; g.m = m; g.n = n; g.k = k; g.alpha = 1.0f;
        g.a = a; g.lda = ta ? m : k; g.b = b; g.ldb = tb ? k : n; g.c = c[r]; g.ldc = n;
        tu_ok(mb_gemm(dev, &g));
        mb_device_close(dev);
    }
    assert_memory_equal(c[0], c[1], (size_t)(m * n) * sizeof(float));
    /* the denormal operands read as 0 in every part: the same as zeros there */
    float *z = tu_alloc_f32((size_t)(m * k));
    memcpy(z, a, (size_t)(m * k) * sizeof(float));
    for (size_t i = 0; i < (size_t)(m * k); i += 3) z[i] = 0.0f;
    mb_device *dev = open_dev(0, 3);
    float *cz = tu_alloc_f32((size_t)(m * n));
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.trans_a = ta; g.trans_b = tb; g.m = m; g.n = n; g.k = k; g.alpha = 1.0f;
    g.a = z; g.lda = ta ? m : k; g.b = b; g.ldb = tb ? k : n; g.c = cz; g.ldc = n;
    tu_ok(mb_gemm(dev, &g));
    mb_device_close(dev);
    assert_memory_equal(c[1], cz, (size_t)(m * n) * sizeof(float)); /* DAZ on every part */
    for (int r = 0; r < 2; r++) free(c[r]);
    free(a); free(b); free(z); free(cz);
}

typedef struct run_out { float *hl, *grad, *dx; size_t np; } run_out;

static size_t count_denormal(const float *x, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (size_t)is_denormal(x[i]);
    return c;
}

/* Two LSTMs (one per thread) through forward_many/backward_many, plus an AdamW step;
 * dh_last tiny, so the backward's gradients decay through the denormal range. */
static run_out run_lstms(int keep, int64_t B, int64_t T, int64_t F, int64_t H, const float *x, const float *dh,
                         unsigned caller_csr) {
    mb_device *dev = open_dev(keep, 2);
    mb_params *p;
    mb_lstm *l[2];
    tu_ok(mb_params_create(&p, dev));
    for (int i = 0; i < 2; i++) {
        mb_lstm_config c;
        memset(&c, 0, sizeof c);
        c.input_size = F; c.hidden_size = H; c.max_steps = T; c.max_batch = B; c.stream = 2 + i;
        c.checkpoint = i ? 0 : -1; c.prefix = i ? "b." : "a.";
        tu_ok(mb_lstm_create(&l[i], p, &c));
    }
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 3));
    run_out o;
    o.np = mb_params_total(p);
    o.hl = tu_alloc_f32((size_t)(2 * B * H)); o.grad = tu_alloc_f32(o.np); o.dx = tu_alloc_f32((size_t)(2 * B * T * F));
    mb_lstm_call calls[2];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < 2; i++) {
        calls[i].lstm = l[i]; calls[i].x = x; calls[i].B = B; calls[i].T = T;
        calls[i].h_last = o.hl + i * B * H; calls[i].dh_last = dh; calls[i].dx = o.dx + i * B * T * F;
    }
    mb_adamw_config ac = mb_adamw_config_default();
    mb_adamw *opt;
    tu_ok(mb_adamw_create(&opt, p, &ac));
    _mm_setcsr(caller_csr);
    unsigned before = csr_mode();
    tu_ok(mb_params_zero_grad(p));
    tu_ok(mb_lstm_forward_many(calls, 2));
    assert_int_equal(csr_mode(), before);
    tu_ok(mb_lstm_backward_many(calls, 2));
    assert_int_equal(csr_mode(), before);
    memcpy(o.grad, mb_params_grad(p), o.np * sizeof(float));
    tu_ok(mb_lstm_forward(l[0], x, B, T, NULL, NULL, NULL, NULL));
    assert_int_equal(csr_mode(), before);
    tu_ok(mb_lstm_backward(l[0], dh, NULL, NULL, NULL, NULL));
    assert_int_equal(csr_mode(), before);
    tu_ok(mb_adamw_step(opt, 1e-3f, NULL));
    assert_int_equal(csr_mode(), before);
    mb_adamw_destroy(opt);
    for (int i = 0; i < 2; i++) mb_lstm_destroy(l[i]);
    mb_params_destroy(p);
    mb_device_close(dev);
    return o;
}

static void test_lstm_flush_vs_ieee(void **state) {
    (void)state;
    unsigned saved = _mm_getcsr();
    int64_t B = tu_int(1, 4), T = tu_int(20, 60), F = tu_int(1, 5), H = tu_int(1, 8);
    float *x = tu_alloc_f32((size_t)(B * T * F)), *dh = tu_alloc_f32((size_t)(B * H));
    tu_fill(x, (size_t)(B * T * F), -2, 2);
    for (int64_t i = 0; i < B * H; i++) dh[i] = tu_uniform(-1, 1) * 1e-34f; /* into the denormals in a few steps */
    unsigned ieee = saved & ~(unsigned)MB__FTZ_DAZ;
    run_out f = run_lstms(0, B, T, F, H, x, dh, ieee);
    run_out k = run_lstms(1, B, T, F, H, x, dh, saved | (unsigned)MB__FTZ_DAZ);
    size_t nx = (size_t)(2 * B * T * F);
    /* flushed: no denormal comes out; IEEE: the decayed gradients are denormal */
    assert_int_equal(count_denormal(f.dx, nx) + count_denormal(f.grad, f.np), 0);
    assert_true(count_denormal(k.dx, nx) > 0);
    /* within tolerance of each other: a flushed value is below FLT_MIN */
    _mm_setcsr(saved & ~(unsigned)MB__FTZ_DAZ); /* compare the denormals as they are */
    tu_assert_close(f.hl, k.hl, (size_t)(2 * B * H), 1e-36, 1e-6, "h_last");
    tu_assert_close(f.dx, k.dx, nx, 1e-36, 1e-5, "dx");
    tu_assert_close(f.grad, k.grad, f.np, 1e-36, 1e-5, "grad");
    free(f.hl); free(f.grad); free(f.dx); free(k.hl); free(k.grad); free(k.dx);
    free(x); free(dh);
    _mm_setcsr(saved);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_and_restore),
        cmocka_unit_test(test_pool_workers_mode),
        cmocka_unit_test(test_split_gemm),
        cmocka_unit_test(test_lstm_flush_vs_ieee),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no MXCSR: nothing to test */
static void test_skipped(void **state) { (void)state; skip(); }
int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
