/* CUDA numerics tests: every numerics kernel against the CPU path on fresh random
 * inputs (linear, activations, concat, dropout, losses, unscale + found_inf, scaler
 * update, the AdamW norm/finalize/update passes, skipped steps), and weight averaging
 * (mb_avg: torch's AveragedModel golden, random updates bitwise against the CPU's formulas,
 * skipped steps, swapping, a resume: tests/avg_case.h, the CPU's test_avg cases). Without a GPU every
 * test checks the clear MB_ERR_NO_DEVICE and skips itself. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"
#include "avg_case.h"
#include <unistd.h>

/* MB_TEST_SMALL (set under the sanitizers): the unscale and AdamW passes on at most ~20,000
 * elements, the same code (the plain build's sizes reach the grids' block caps). */
static int small(void) { return getenv("MB_TEST_SMALL") != NULL; }

/* A device copy of n host floats. */
static float *up(mb_device *g, const float *h, size_t n) {
    float *d = NULL;
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, n * sizeof(float), (void **)&d));
    tu_ok(mb_copy(g, 0, d, h, n * sizeof(float)));
    return d;
}
static void down(mb_device *g, float *h, const float *d, size_t n) {
    tu_ok(mb_copy(g, 0, h, d, n * sizeof(float)));
    tu_ok(mb_sync(g, 0));
}

static void test_cuda_linear(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c = tu_open_cpu();
    int64_t B = tu_int(1, 70), in = tu_int(1, 90), out = tu_int(1, 40);
    mb_params *pg, *pc;
    mb_linear lg, lc;
    tu_ok(mb_params_create(&pg, g));
    tu_ok(mb_params_create(&pc, c));
    tu_ok(mb_linear_init(&lg, pg, "fc", in, out));
    tu_ok(mb_linear_init(&lc, pc, "fc", in, out));
    tu_ok(mb_params_finalize(pg));
    tu_ok(mb_params_finalize(pc));
    tu_ok(mb_params_init(pg, 8));
    tu_ok(mb_params_init(pc, 8));
    size_t nx = (size_t)(B * in), ny = (size_t)(B * out), np = mb_params_total(pc);
    float *x = tu_alloc_f32(nx), *dy = tu_alloc_f32(ny), *y = tu_alloc_f32(ny), *dx = tu_alloc_f32(nx);
    float *hy = tu_alloc_f32(ny), *hdx = tu_alloc_f32(nx), *hg = tu_alloc_f32(np);
    tu_fill(x, nx, -1, 1);
    tu_fill(dy, ny, -1, 1);
    float *dxg = up(g, x, nx), *ddy = up(g, dy, ny), *dyg = up(g, y, ny), *ddx = up(g, dx, nx);
    tu_ok(mb_linear_forward(&lc, 0, x, B, y));
    tu_ok(mb_linear_forward(&lg, 0, dxg, B, dyg));
    down(g, hy, dyg, ny);
    tu_assert_close(hy, y, ny, 1e-5, 1e-5, "linear forward");
    tu_ok(mb_stream_wait(g, 1, 0));          /* stream 1 after the uploads and the forward */
    for (int pass = 0; pass < 2; pass++) {   /* accumulate twice */
        tu_ok(mb_linear_backward(&lc, 0, x, dy, B, dx));
        tu_ok(mb_linear_backward(&lg, 1, dxg, ddy, B, ddx));   /* another stream */
    }
    tu_ok(mb_sync(g, 1));
    down(g, hdx, ddx, nx);
    tu_assert_close(hdx, dx, nx, 1e-5, 1e-5, "linear dx");
    down(g, hg, mb_params_grad(pg), np);
    tu_assert_close(hg, mb_params_grad(pc), np, 1e-4, 1e-5, "linear dW, db");
    mb_free(g, dxg); mb_free(g, ddy); mb_free(g, dyg); mb_free(g, ddx);
    free(x); free(dy); free(y); free(dx); free(hy); free(hdx); free(hg);
    mb_params_destroy(pg); mb_params_destroy(pc);
    tu_device_close(g); tu_device_close(c);
}

static void test_cuda_activations_concat_dropout(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c = tu_open_cpu();
    size_t n = (size_t)tu_int(1, 300000);
    float *x = tu_alloc_f32(n), *dy = tu_alloc_f32(n), *y = tu_alloc_f32(n), *h = tu_alloc_f32(n);
    tu_fill(x, n, -6, 6);
    tu_fill(dy, n, -1, 1);
    x[0] = NAN;
    if (n > 1) x[1] = INFINITY;
    float *dx = up(g, x, n), *ddy = up(g, dy, n), *dy_out = up(g, y, n);
    for (int a = MB_ACT_IDENTITY; a <= MB_ACT_TANH; a++) {
        tu_ok(mb_act_forward(c, 0, (mb_act)a, x, y, n));
        tu_ok(mb_act_forward(g, 0, (mb_act)a, dx, dy_out, n));
        down(g, h, dy_out, n);
        tu_assert_close(h, y, n, 1e-6, 1e-6, mb_act_name((mb_act)a));
        tu_ok(mb_act_backward(c, 0, (mb_act)a, x, dy, y, n));
        tu_ok(mb_act_backward(g, 0, (mb_act)a, dx, ddy, dy_out, n));
        down(g, h, dy_out, n);
        tu_assert_close(h, y, n, 1e-6, 1e-6, mb_act_name((mb_act)a));
    }
    /* dropout: the same mask bit for bit */
    float p = tu_uniform(0.05f, 0.9f);
    uint64_t seed = tu_next(), step = tu_next() % 1000;
    tu_ok(mb_dropout_forward(c, 0, p, seed, step, dy, y, n));
    tu_ok(mb_dropout_forward(g, 0, p, seed, step, ddy, dy_out, n));
    down(g, h, dy_out, n);
    assert_memory_equal(h, y, n * sizeof(float));
    tu_ok(mb_dropout_backward(g, 0, p, seed, step, ddy, dy_out, n));
    down(g, h, dy_out, n);
    assert_memory_equal(h, y, n * sizeof(float));
    /* concat of 5 encoders and its split */
    int64_t B = tu_int(1, 64), dims[5], total = 0;
    const float *xs[5], *dxs_c[5];
    float *dxs[5], *hx[5];
    for (int i = 0; i < 5; i++) {
        dims[i] = tu_int(1, 50);
        total += dims[i];
        hx[i] = tu_alloc_f32((size_t)(B * dims[i]));
        tu_fill(hx[i], (size_t)(B * dims[i]), -1, 1);
        dxs[i] = up(g, hx[i], (size_t)(B * dims[i]));
        xs[i] = dxs[i];
        dxs_c[i] = hx[i];
    }
    float *cat_c = tu_alloc_f32((size_t)(B * total)), *cat_h = tu_alloc_f32((size_t)(B * total));
    float *cat_g = up(g, cat_c, (size_t)(B * total));
    tu_ok(mb_concat_forward(c, 0, 5, dxs_c, dims, B, cat_c));
    tu_ok(mb_concat_forward(g, 0, 5, xs, dims, B, cat_g));
    down(g, cat_h, cat_g, (size_t)(B * total));
    assert_memory_equal(cat_h, cat_c, (size_t)(B * total) * sizeof(float));
    for (int i = 0; i < 5; i++) tu_ok(mb_zero(g, 0, dxs[i], (size_t)(B * dims[i]) * sizeof(float)));
    tu_ok(mb_concat_backward(g, 0, 5, cat_g, dims, B, dxs));
    for (int i = 0; i < 5; i++) {
        float *back = tu_alloc_f32((size_t)(B * dims[i]));
        down(g, back, dxs[i], (size_t)(B * dims[i]));
        assert_memory_equal(back, hx[i], (size_t)(B * dims[i]) * sizeof(float));
        free(back); free(hx[i]); mb_free(g, dxs[i]);
    }
    mb_free(g, cat_g); free(cat_c); free(cat_h);
    mb_free(g, dx); mb_free(g, ddy); mb_free(g, dy_out);
    free(x); free(dy); free(y); free(h);
    tu_device_close(g); tu_device_close(c);
}

static void test_cuda_losses(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c = tu_open_cpu();
    int64_t B = tu_int(1, 300), K = tu_int(1, 40);
    size_t n = (size_t)(B * K);
    float *pr = tu_alloc_f32(n), *t = tu_alloc_f32(n), *d = tu_alloc_f32(n), *h = tu_alloc_f32(n);
    tu_fill(pr, n, -3, 3);
    tu_fill(t, n, -3, 3);
    float sdev = 65536.0f, scale = 0.25f;
    float *dp = up(g, pr, n), *dt = up(g, t, n), *dd = up(g, d, n), *ds = up(g, &sdev, 1), *dl = up(g, &sdev, 1);
    for (int huber = 0; huber <= 1; huber++) {
        mb_loss_config cfg = {};
        cfg.kind = huber ? MB_LOSS_HUBER : MB_LOSS_MSE;
        cfg.huber_delta = huber ? tu_uniform(0.1f, 2.0f) : 0.0f;
        float lc, lgv;
        tu_ok(mb_loss(c, 0, &cfg, pr, t, B, K, scale, &sdev, &lc, d));
        tu_ok(mb_loss(g, 0, &cfg, dp, dt, B, K, scale, ds, dl, dd));
        tu_ok(mb_fetch_scalar(g, 0, dl, &lgv));
        assert_true(fabsf(lgv - lc) <= 1e-6f * fabsf(lc) + 1e-7f);
        down(g, h, dd, n);
        assert_memory_equal(h, d, n * sizeof(float));   /* same element math, same bits */
    }
    mb_free(g, dp); mb_free(g, dt); mb_free(g, dd); mb_free(g, ds); mb_free(g, dl);
    free(pr); free(t); free(d); free(h);
    tu_device_close(g); tu_device_close(c);
}

static void test_cuda_unscale_and_update(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c = tu_open_cpu();
    size_t n = (size_t)tu_int(1000, small() ? 20000 : 2000000);
    float *x = tu_alloc_f32(n), *h = tu_alloc_f32(n);
    mb_scaler_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.init_scale = 1024.0f; cfg.growth_interval = 2; cfg.backoff_factor = 0.25f;
    mb_scaler *sg, *sc;
    tu_ok(mb_scaler_create(&sg, g, &cfg));
    tu_ok(mb_scaler_create(&sc, c, &cfg));
    float *dx = NULL;
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, n * sizeof(float), (void **)&dx));
    for (int round = 0; round < 8; round++) {
        tu_fill(x, n, -1e4f, 1e4f);
        if (round % 3 == 1) {   /* inf or NaN somewhere, anywhere */
            size_t pos = tu_next() % n;
            x[pos] = round % 2 ? NAN : -INFINITY;
        }
        tu_ok(mb_copy(g, 0, dx, x, n * sizeof(float)));
        tu_ok(mb_scaler_unscale(sg, dx, n));
        tu_ok(mb_scaler_unscale(sc, x, n));
        down(g, h, dx, n);
        tu_assert_close(h, x, n, 0, 0, "unscaled gradients");
        mb_scaler_state a, b;
        tu_ok(mb_scaler_get(sg, &a));
        tu_ok(mb_scaler_get(sc, &b));
        assert_int_equal(a.found_inf, b.found_inf);
        assert_int_equal(a.found_inf, round % 3 == 1);
        tu_ok(mb_scaler_update(sg));
        tu_ok(mb_scaler_update(sc));
        tu_ok(mb_scaler_get(sg, &a));
        tu_ok(mb_scaler_get(sc, &b));
        assert_memory_equal(&a, &b, sizeof a);
    }
    mb_free(g, dx);
    free(x); free(h);
    mb_scaler_destroy(sg); mb_scaler_destroy(sc);
    tu_device_close(g); tu_device_close(c);
}

static mb_params *make_params(mb_device *dev, int64_t rows, int64_t cols) {
    mb_params *p;
    int64_t ws[2] = {rows, cols}, bs[1] = {rows};
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_params_add(p, "w", 2, ws, 0.3f, NULL));
    tu_ok(mb_params_add(p, "b", 1, bs, 0.3f, NULL));
    tu_ok(mb_params_add(p, "w2", 2, ws, 0.3f, NULL));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 77));
    return p;
}

static void test_cuda_adamw(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0), *c = tu_open_cpu();
    int64_t rows = tu_int(1, small() ? 40 : 300), cols = tu_int(1, small() ? 120 : 700);
    for (int use_scaler = 0; use_scaler <= 1; use_scaler++) {
        mb_params *pg = make_params(g, rows, cols), *pc = make_params(c, rows, cols);
        size_t n = mb_params_total(pc);
        mb_adamw_config cfg = mb_adamw_config_default();
        cfg.max_grad_norm = use_scaler ? 1.0f : 0.0f;
        cfg.weight_decay = 0.05f;
        mb_adamw *og, *oc;
        tu_ok(mb_adamw_create(&og, pg, &cfg));
        tu_ok(mb_adamw_create(&oc, pc, &cfg));
        mb_scaler *sg = NULL, *sc = NULL;
        if (use_scaler) { tu_ok(mb_scaler_create(&sg, g, NULL)); tu_ok(mb_scaler_create(&sc, c, NULL)); }
        float *grad = tu_alloc_f32(n), *h = tu_alloc_f32(n);
        for (int step = 0; step < 6; step++) {
            tu_fill(grad, n, -0.1f, 0.1f);
            for (size_t i = 0; i < n; i += 64) grad[i] *= 0.0f;   /* keep some zeros, padding too */
            if (step == 3) grad[tu_next() % n] = NAN;              /* a skipped step on both */
            memcpy(mb_params_grad(pc), grad, n * sizeof(float));
            tu_ok(mb_copy(g, 0, mb_params_grad(pg), grad, n * sizeof(float)));
            if (use_scaler) { tu_ok(mb_scaler_unscale(sg, mb_params_grad(pg), n)); tu_ok(mb_scaler_unscale(sc, mb_params_grad(pc), n)); }
            float lr = tu_uniform(1e-4f, 1e-2f);
            tu_ok(mb_adamw_step(og, lr, sg));
            tu_ok(mb_adamw_step(oc, lr, sc));
            if (use_scaler) { tu_ok(mb_scaler_update(sg)); tu_ok(mb_scaler_update(sc)); }
            int tg, tc;
            float ng = 0, nc = 0;
            tu_ok(mb_adamw_last_step_taken(og, &tg));
            tu_ok(mb_adamw_last_step_taken(oc, &tc));
            assert_int_equal(tg, tc);
            assert_int_equal(tg, step != 3);
            tu_ok(mb_adamw_grad_norm(og, &ng));
            tu_ok(mb_adamw_grad_norm(oc, &nc));
            if (step != 3) assert_true(fabsf(ng - nc) <= 1e-6f * nc);
            down(g, h, mb_params_data(pg), n);
            tu_assert_close(h, mb_params_data(pc), n, 1e-6, 1e-5, "adamw params");
            down(g, h, mb_adamw_m(og), n);
            tu_assert_close(h, mb_adamw_m(oc), n, 1e-7, 1e-5, "adamw m");
            down(g, h, mb_adamw_v(og), n);
            tu_assert_close(h, mb_adamw_v(oc), n, 1e-9, 1e-5, "adamw v");
        }
        int64_t sg_steps, sc_steps;
        tu_ok(mb_adamw_steps(og, &sg_steps));
        tu_ok(mb_adamw_steps(oc, &sc_steps));
        assert_int_equal(sg_steps, 5);
        assert_int_equal(sc_steps, 5);
        free(grad); free(h);
        mb_scaler_destroy(sg); mb_scaler_destroy(sc);
        mb_adamw_destroy(og); mb_adamw_destroy(oc);
        mb_params_destroy(pg); mb_params_destroy(pc);
    }
    tu_device_close(g); tu_device_close(c);
}

static void test_cuda_avg(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/mb_cuda_avg_XXXXXX");
    assert_non_null(mkdtemp(dir));
    avg_case_torch_golden(g);
    avg_case_skip_and_swap(g);
    for (int i = 0; i < (small() ? 3 : 10); i++) avg_case_random(g);
    avg_case_resume(g, dir);
    unlink(tu_path(dir, "avg.ckpt"));
    rmdir(dir);
    tu_device_close(g);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_linear),
        tu_cuda_test(test_cuda_activations_concat_dropout),
        tu_cuda_test(test_cuda_losses),
        tu_cuda_test(test_cuda_unscale_and_update),
        tu_cuda_test(test_cuda_adamw),
        tu_cuda_test(test_cuda_avg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
