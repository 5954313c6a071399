/* The step API on the CUDA backend (issue 15), the cases of tests/step_cases.h plus: the loss
 * meter's reads cost no host sync (counted by the simulator), the scheduled AdamW matches the
 * CPU backend, the GPU's checkpoint default is full storage when memory allows, and one cuBLAS
 * handle per stream gives the same bits on concurrent streams. Without a GPU (and outside the
 * simulator) every test checks the clear MB_ERR_NO_DEVICE and skips itself. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "step_cases.h"

static void test_cuda_meter_loss(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    for (int i = 0; i < 4; i++) sc_meter_loss(g, tu_next());
    sc_meter_bad_input(g);
    mb_device_close(g);
}

/* Losses into the meter and polled reads: not one host sync (the simulator counts them). */
static void test_cuda_meter_no_sync(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    uint64_t seed = tu_next();
    float *pred = sc_upload_rand(g, 256, seed, 1, 2.0f), *tgt = sc_upload_rand(g, 256, seed, 2, 2.0f);
    mb_meter *m;
    tu_ok(mb_meter_create(&m, g, 1));
    mb_loss_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.acc = mb_meter_slot(m, 0);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 5; i++) tu_ok(mb_loss(g, MB_STREAM_COMPUTE, &cfg, pred, tgt, 64, 4, 1.0f, NULL, NULL, NULL));
        tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 1));
        sc_poll_until_ready(m);
    }
#ifdef CUDASIM
    cudasim::stats st = cudasim::get_stats();
    assert_int_equal(st.host_syncs, 0);
    assert_int_equal(st.launches, 15);
#endif
    double sum = 0, w = 0;
    tu_ok(mb_meter_value(m, 0, &sum, &w));
    assert_true(w == 5.0 * 64);
    double want = sc_mean_loss(seed, 0, 256) * 64 * 5;
    if (fabs(sum - want) > 1e-12 * want) fail_msg("meter: %.17g, want %.17g", sum, want);
    mb_meter_destroy(m);
    mb_free(g, pred);
    mb_free(g, tgt);
    mb_device_close(g);
}

static void test_cuda_scheduled_adamw(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c;
    tu_ok(mb_device_open(&c, NULL));
    for (int k = MB_LR_CONSTANT; k <= MB_LR_ONE_CYCLE; k++) {
        float *hg = tu_alloc_f32(40 * 51 + 64), *hc = tu_alloc_f32(40 * 51 + 64);
        size_t ng = 0, nc = 0;
        uint64_t seed = tu_next(), rs = tu_rng_state;
        sc_scheduled_adamw(g, seed, (mb_lr_kind)k, hg, &ng);
        tu_rng_state = rs; /* the same shapes on the CPU */
        sc_scheduled_adamw(c, seed, (mb_lr_kind)k, hc, &nc);
        assert_int_equal(ng, nc);
        tu_assert_close(hg, hc, ng, 1e-6, 1e-5, "scheduled AdamW, CUDA vs CPU");
        free(hg); free(hc);
    }
    mb_device_close(c);
    mb_device_close(g);
}

/* checkpoint = 0 on the GPU: full storage (these activations are far below a quarter of the
 * device's memory); an explicit interval is kept. */
static void test_cuda_checkpoint_default(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    mb_params *p;
    tu_ok(mb_params_create(&p, g));
    mb_lstm_config c;
    memset(&c, 0, sizeof c);
    c.input_size = 3; c.hidden_size = 5; c.max_steps = 100; c.max_batch = 4;
    mb_lstm *full, *k7;
    tu_ok(mb_lstm_create(&full, p, &c));
    c.checkpoint = 7;
    c.prefix = "b.";
    tu_ok(mb_lstm_create(&k7, p, &c));
    assert_int_equal(mb_lstm_checkpoint_steps(full, 100), -1);
    assert_int_equal(mb_lstm_checkpoint_steps(k7, 100), 7);
    mb_lstm_destroy(full);
    mb_lstm_destroy(k7);
    mb_params_destroy(p);
    mb_device_close(g);
}

/* The same gemm on two streams at once: each stream's own handle, the same bits. */
static void test_cuda_gemm_per_stream_handles(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    assert_non_null(mb_device_cublas(g));
    int64_t m = tu_int(1, 90), n = tu_int(1, 90), k = tu_int(1, 200);
    uint64_t seed = tu_next();
    float *a = sc_upload_rand(g, (size_t)(m * k), seed, 1, 1.0f), *b = sc_upload_rand(g, (size_t)(k * n), seed, 2, 1.0f);
    float *c[2];
    for (int s = 0; s < 2; s++) tu_ok(mb_alloc(g, MB_MEM_DEVICE, (size_t)(m * n) * sizeof(float), (void **)&c[s]));
    for (int s = 0; s < 2; s++) {
        mb_gemm_args ga;
        memset(&ga, 0, sizeof ga);
        ga.stream = 2 + s; ga.m = m; ga.n = n; ga.k = k; ga.alpha = 1.0f; ga.beta = 0.0f;
        ga.a = a; ga.lda = k; ga.b = b; ga.ldb = n; ga.c = c[s]; ga.ldc = n;
        tu_ok(mb_gemm(g, &ga));
    }
    tu_ok(mb_sync(g, -1));
    float *h0 = tu_alloc_f32((size_t)(m * n)), *h1 = tu_alloc_f32((size_t)(m * n));
    tu_ok(mb_copy(g, 0, h0, c[0], (size_t)(m * n) * sizeof(float)));
    tu_ok(mb_copy(g, 0, h1, c[1], (size_t)(m * n) * sizeof(float)));
    tu_ok(mb_sync(g, 0));
    assert_memory_equal(h0, h1, (size_t)(m * n) * sizeof(float));
    free(h0); free(h1);
    mb_free(g, a); mb_free(g, b); mb_free(g, c[0]); mb_free(g, c[1]);
    mb_device_close(g);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_meter_loss),
        cmocka_unit_test(test_cuda_meter_no_sync),
        cmocka_unit_test(test_cuda_scheduled_adamw),
        cmocka_unit_test(test_cuda_checkpoint_default),
        cmocka_unit_test(test_cuda_gemm_per_stream_handles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
