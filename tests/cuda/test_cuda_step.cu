/* The step API on the CUDA backend (issue 15), the cases of tests/step_cases.h plus: the loss
 * meter's reads cost no host sync (counted by the simulator), the scheduled AdamW matches the
 * CPU backend, the checkpoint default is full storage when memory allows, one cuBLAS
 * handle per stream gives the same bits on concurrent streams, and a whole step replayed as a
 * graph gives the bits of plain launches. Without a GPU (and outside the
 * simulator) every test checks the clear MB_ERR_NO_DEVICE and skips itself. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "step_cases.h"

static void test_cuda_meter_loss(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    for (int i = 0; i < 4; i++) sc_meter_loss(g, tu_next());
    sc_meter_bad_input(g);
    tu_device_close(g);
}

static void test_cuda_meter_lagged(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    for (int i = 0; i < 4; i++) sc_meter_lagged(g);
    tu_device_close(g);
}

/* Losses into the meter and polled reads (mb_meter_next without wait): not one host sync (the simulator counts them). */
static void test_cuda_meter_no_sync(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    uint64_t seed = tu_next();
    float *pred = sc_upload_rand(g, 256, seed, 1, 2.0f), *tgt = sc_upload_rand(g, 256, seed, 2, 2.0f);
    mb_meter *m;
    tu_ok(mb_meter_create(&m, g, 1, 1));
    mb_loss_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.acc = mb_meter_slot(m, 0);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 5; i++) tu_ok(mb_loss(g, MB_STREAM_COMPUTE, &cfg, pred, tgt, 64, 4, 1.0f, NULL, NULL, NULL));
        tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 1));
        sc_next_until_landed(m);
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
    tu_device_close(g);
}

static void test_cuda_scheduled_adamw(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c;
    tu_ok(mb_device_open(&c, NULL));
    for (int k = MB_LR_CONSTANT; k <= MB_LR_ONE_CYCLE; k++) {
        float *hg = tu_alloc_f32(SC_SCHEDULED_MAX_FLOATS), *hc = tu_alloc_f32(SC_SCHEDULED_MAX_FLOATS);
        size_t ng = 0, nc = 0;
        uint64_t seed = tu_next(), rs = tu_rng_state;
        sc_scheduled_adamw(g, seed, (mb_lr_kind)k, hg, &ng);
        tu_rng_state = rs; /* the same shapes on the CPU */
        sc_scheduled_adamw(c, seed, (mb_lr_kind)k, hc, &nc);
        assert_int_equal(ng, nc);
        tu_assert_close(hg, hc, ng, 1e-6, 1e-5, "scheduled AdamW, CUDA vs CPU");
        free(hg); free(hc);
    }
    tu_device_close(c);
    tu_device_close(g);
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
    tu_device_close(g);
}

/* The full-storage decision counts the fused recurrence's workspace: mb__lstm_fused_bytes is
 * what mb__lstm_fused_alloc takes (the tracked live device bytes), in f32 and bf16, at odd
 * shapes; and the decision adds it to the activations. */
static void test_cuda_fused_workspace_counted(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    for (int i = 0; i < 2; i++) {
        mb_dtype op = i ? MB_BF16 : MB_F32;
        mb_params *p;
        tu_ok(mb_params_create(&p, g));
        mb_lstm_config c;
        memset(&c, 0, sizeof c);
        c.input_size = tu_int(1, 9); c.hidden_size = tu_int(1, 40); c.max_steps = tu_int(1, 50);
        c.max_batch = tu_int(1, 20); c.layers = tu_int(1, 2); c.precision = op;
        mb_lstm *l;
        tu_ok(mb_lstm_create(&l, p, &c));
        assert_true(mb_lstm_fused_blocks(l));
        size_t before = mb_device_mem_stats(g).live[MB_MEM_DEVICE];
        mb__lstm_fused_free(l);
        size_t freed = mb_device_mem_stats(g).live[MB_MEM_DEVICE];
        tu_ok(mb__lstm_fused_alloc(l));
        size_t want = mb__lstm_fused_bytes(c.max_batch, c.max_steps, c.input_size, c.hidden_size, op);
        if (before - freed != want || mb_device_mem_stats(g).live[MB_MEM_DEVICE] != before)
            fail_msg("%s B %lld T %lld F %lld H %lld: the workspace takes %zu bytes, counted %zu", mb_dtype_name(op),
                     (long long)c.max_batch, (long long)c.max_steps, (long long)c.input_size,
                     (long long)c.hidden_size, before - freed, want);
        size_t full = 0, total = 0, free_bytes = 0;
        tu_ok(mb_lstm_memory(&c, c.max_batch, c.max_steps, &full, NULL));
        tu_ok(mb_device_memory(g, &total, &free_bytes));
        assert_int_equal(mb__lstm_full_fits(g, &c), mb__lstm_full_fits_in(full + want, free_bytes));
        mb_lstm_destroy(l);
        mb_params_destroy(p);
    }
    assert_int_equal(mb__lstm_fused_bytes(INT64_MAX, 2, 1, 1, MB_F32), SIZE_MAX); /* overflow: never fits */
    tu_device_close(g);
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
    tu_device_close(g);
}

/* A whole training step of a linear model (forward, loss into the meter, backward, unscale,
 * scheduled AdamW, scaler update) replayed through one graph gives the bits of plain launches:
 * nothing in it changes from step to step but the batch, copied into fixed buffers. */
typedef struct sc_step {
    mb_device *dev;
    mb_params *p;
    mb_linear fc;
    mb_adamw *opt;
    mb_scaler *sc;
    mb_meter *meter;
    mb_lr_schedule sched;
    float *x, *y, *pred, *dpred; /* fixed device buffers */
    int64_t B, in, out;
} sc_step;

static mb_result sc_step_fn(void *user) {
    sc_step *t = (sc_step *)user;
    mb_loss_config lc;
    memset(&lc, 0, sizeof lc);
    lc.acc = mb_meter_slot(t->meter, 0);
    MB_TRY(mb_params_zero_grad(t->p));
    MB_TRY(mb_linear_forward(&t->fc, MB_STREAM_COMPUTE, t->x, t->B, t->pred));
    MB_TRY(mb_loss(t->dev, MB_STREAM_COMPUTE, &lc, t->pred, t->y, t->B, t->out, 1.0f, mb_scaler_scale_ptr(t->sc), NULL,
                   t->dpred));
    MB_TRY(mb_linear_backward(&t->fc, MB_STREAM_COMPUTE, t->x, t->dpred, t->B, NULL));
    MB_TRY(mb_scaler_unscale(t->sc, mb_params_grad(t->p), mb_params_total(t->p)));
    MB_TRY(mb_adamw_step_scheduled(t->opt, &t->sched, t->sc));
    return mb_scaler_update(t->sc);
}

static void sc_step_run(mb_device *g, int graph, uint64_t seed, int steps, float *params, double *loss_sum) {
    sc_step t;
    memset(&t, 0, sizeof t);
    t.dev = g; t.B = 33; t.in = 7; t.out = 3;
    tu_ok(mb_params_create(&t.p, g));
    tu_ok(mb_linear_init(&t.fc, t.p, "fc", t.in, t.out));
    tu_ok(mb_params_finalize(t.p));
    tu_ok(mb_params_init(t.p, seed));
    tu_ok(mb_adamw_create(&t.opt, t.p, NULL));
    tu_ok(mb_scaler_create(&t.sc, g, NULL));
    tu_ok(mb_meter_create(&t.meter, g, 1, 1));
    t.sched.kind = MB_LR_WARMUP_COSINE; t.sched.lr = 1e-2f; t.sched.total_steps = steps; t.sched.warmup_steps = 2;
    size_t nx = (size_t)(t.B * t.in), ny = (size_t)(t.B * t.out);
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, nx * 4, (void **)&t.x));
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, ny * 4, (void **)&t.y));
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, ny * 4, (void **)&t.pred));
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, ny * 4, (void **)&t.dpred));
    float *hx = tu_alloc_f32(nx), *hy = tu_alloc_f32(ny);
    mb_graph *gr = NULL;
    for (int i = 0; i < steps; i++) {
        for (size_t e = 0; e < nx; e++) hx[e] = mb_rng_symmetric(seed, 100 + (uint64_t)i, e, 1.0f);
        for (size_t e = 0; e < ny; e++) hy[e] = mb_rng_symmetric(seed, 200 + (uint64_t)i, e, 1.0f);
        tu_ok(mb_copy(g, MB_STREAM_COMPUTE, t.x, hx, nx * 4)); /* the batch into the fixed buffers */
        tu_ok(mb_copy(g, MB_STREAM_COMPUTE, t.y, hy, ny * 4));
        if (graph && i > 0) tu_ok(mb_graph_run(&gr, g, MB_STREAM_COMPUTE, sc_step_fn, &t)); /* step 0: warm-up */
        else tu_ok(sc_step_fn(&t));
    }
    if (graph) { assert_non_null(gr); assert_true(mb_graph_nodes(gr) >= 7); }
    tu_ok(mb_meter_read(t.meter, MB_STREAM_COMPUTE, 1));
    tu_ok(mb_meter_wait(t.meter));
    double w = 0;
    tu_ok(mb_meter_value(t.meter, 0, loss_sum, &w));
    assert_true(w == (double)(t.B * steps));
    int64_t k = 0;
    tu_ok(mb_adamw_schedule_step(t.opt, &k));
    assert_int_equal(k, steps);
    tu_ok(mb_params_get(t.p, params));
    mb_graph_destroy(gr);
    free(hx); free(hy);
    mb_free(g, t.x); mb_free(g, t.y); mb_free(g, t.pred); mb_free(g, t.dpred);
    mb_meter_destroy(t.meter); mb_scaler_destroy(t.sc); mb_adamw_destroy(t.opt); mb_params_destroy(t.p);
}

static void test_cuda_step_graph_replay(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    uint64_t seed = tu_next();
    int steps = tu_int(3, 12);
    float a[128], b[128];
    double la = 0, lb = 0;
    sc_step_run(g, 0, seed, steps, a, &la);
    sc_step_run(g, 1, seed, steps, b, &lb);
    assert_memory_equal(a, b, (7 * 3 + 3) * sizeof(float));
    assert_true(la == lb);
    tu_device_close(g);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_meter_loss),
        tu_cuda_test(test_cuda_meter_no_sync),
        tu_cuda_test(test_cuda_meter_lagged),
        tu_cuda_test(test_cuda_scheduled_adamw),
        tu_cuda_test(test_cuda_checkpoint_default),
        tu_cuda_test(test_cuda_fused_workspace_counted),
        tu_cuda_test(test_cuda_gemm_per_stream_handles),
        tu_cuda_test(test_cuda_step_graph_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
