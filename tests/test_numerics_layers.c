/* numerics (CPU backend), layers and losses: linear against a double-precision
 * reference (and gradient accumulation with beta = 1), activations and losses against
 * central finite differences of double-precision formulas, concat/split, reproducible
 * dropout masks, and bad input. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

static void test_linear_forward_backward(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    int64_t B = tu_int(1, 9), in = tu_int(1, 13), out = tu_int(1, 7);
    mb_params *p;
    mb_linear l;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_linear_init(&l, p, "head", in, out));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 99));
    const mb_param_info *wi = mb_params_info(p, l.weight), *bi = mb_params_info(p, l.bias);
    assert_string_equal(wi->name, "head.weight");
    assert_string_equal(bi->name, "head.bias");
    assert_int_equal(wi->shape[0], out);
    assert_int_equal(wi->shape[1], in);
    assert_true(fabsf(wi->init_bound - 1.0f / sqrtf((float)in)) < 1e-7f && bi->no_decay && !wi->no_decay);
    float *x = tu_alloc_f32((size_t)(B * in)), *y = tu_alloc_f32((size_t)(B * out)), *dy = tu_alloc_f32((size_t)(B * out));
    float *dx = tu_alloc_f32((size_t)(B * in)), *ref = tu_alloc_f32((size_t)(B * in + in * out + B * out));
    tu_fill(x, (size_t)(B * in), -1, 1);
    tu_fill(dy, (size_t)(B * out), -1, 1);
    const float *W = mb_params_tensor(p, l.weight), *bias = mb_params_tensor(p, l.bias);
    tu_ok(mb_linear_forward(&l, 0, x, B, y));
    for (int64_t i = 0; i < B; i++)
        for (int64_t o = 0; o < out; o++) {
            double s = bias[o];
            for (int64_t k = 0; k < in; k++) s += (double)x[i * in + k] * W[o * in + k];
            ref[i * out + o] = (float)s;
        }
    tu_assert_close(y, ref, (size_t)(B * out), 1e-6, 1e-5, "linear forward");
    for (int pass = 1; pass <= 2; pass++) {   /* the second pass accumulates (beta = 1) */
        tu_ok(mb_linear_backward(&l, 0, x, dy, B, dx));
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < in; k++) {
                double s = 0;
                for (int64_t i = 0; i < B; i++) s += (double)dy[i * out + o] * x[i * in + k];
                ref[o * in + k] = (float)(pass * s);
            }
        tu_assert_close(mb_params_tensor_grad(p, l.weight), ref, (size_t)(in * out), 1e-6, 1e-5, "dW");
        for (int64_t o = 0; o < out; o++) {
            double s = 0;
            for (int64_t i = 0; i < B; i++) s += dy[i * out + o];
            ref[o] = (float)(pass * s);
        }
        tu_assert_close(mb_params_tensor_grad(p, l.bias), ref, (size_t)out, 1e-6, 1e-5, "db");
        for (int64_t i = 0; i < B; i++)
            for (int64_t k = 0; k < in; k++) {
                double s = 0;
                for (int64_t o = 0; o < out; o++) s += (double)dy[i * out + o] * W[o * in + k];
                ref[i * in + k] = (float)s;
            }
        tu_assert_close(dx, ref, (size_t)(B * in), 1e-6, 1e-5, "dx (overwritten, not accumulated)");
    }
    tu_ok(mb_linear_backward(&l, 0, x, dy, B, NULL));   /* dx optional */
    free(x); free(y); free(dy); free(dx); free(ref);
    mb_params_destroy(p);
    mb_device_close(dev);
}

/* Finite differences of the linear layer's L = sum(r * y) with respect to W, b and x. */
static void test_linear_finite_differences(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    int64_t B = 3, in = 4, out = 2;
    mb_params *p;
    mb_linear l;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_linear_init(&l, p, "fc", in, out));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 5));
    float x[12], r[6], y[6], dx[12];
    tu_fill(x, 12, -1, 1);
    tu_fill(r, 6, -1, 1);
    tu_ok(mb_linear_backward(&l, 0, x, r, B, dx));
    float *targets[3] = {mb_params_tensor(p, l.weight), mb_params_tensor(p, l.bias), x};
    float *grads[3] = {mb_params_tensor_grad(p, l.weight), mb_params_tensor_grad(p, l.bias), dx};
    int counts[3] = {8, 2, 12};
    for (int t = 0; t < 3; t++)
        for (int j = 0; j < counts[t]; j++) {
            float keep = targets[t][j], h = 1e-2f;
            double lp = 0, lm = 0;
            targets[t][j] = keep + h;
            tu_ok(mb_linear_forward(&l, 0, x, B, y));
            for (int i = 0; i < 6; i++) lp += (double)r[i] * y[i];
            targets[t][j] = keep - h;
            tu_ok(mb_linear_forward(&l, 0, x, B, y));
            for (int i = 0; i < 6; i++) lm += (double)r[i] * y[i];
            targets[t][j] = keep;
            double fd = (lp - lm) / (2.0 * h);
            if (fabs(fd - grads[t][j]) > 1e-3 + 1e-3 * fabs(fd))
                fail_msg("linear tensor %d element %d: analytic %g, finite difference %g", t, j, grads[t][j], fd);
        }
    mb_params_destroy(p);
    mb_device_close(dev);
}

static double act_ref(mb_act a, double x) {
    switch (a) {
    case MB_ACT_RELU: return x > 0 ? x : 0;
    case MB_ACT_GELU: return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case MB_ACT_TANH: return tanh(x);
    default: return x;
    }
}

static void test_activations(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    enum { N = 257 };
    float x[N], y[N], dy[N], dx[N], ref[N];
    for (int a = MB_ACT_IDENTITY; a <= MB_ACT_TANH; a++) {
        for (int i = 0; i < N; i++) {
            x[i] = tu_uniform(-4, 4);
            if (fabsf(x[i]) < 1e-2f) x[i] = 0.5f;   /* keep ReLU's kink out of the differences */
        }
        x[0] = 30.0f; x[1] = -30.0f;              /* saturated tails stay finite */
        tu_fill(dy, N, -1, 1);
        tu_ok(mb_act_forward(dev, 0, (mb_act)a, x, y, N));
        for (int i = 0; i < N; i++) ref[i] = (float)act_ref((mb_act)a, x[i]);
        tu_assert_close(y, ref, N, 1e-6, 1e-5, mb_act_name((mb_act)a));
        tu_ok(mb_act_backward(dev, 0, (mb_act)a, x, dy, dx, N));
        for (int i = 0; i < N; i++) {
            double h = 1e-4, fd = (act_ref((mb_act)a, x[i] + h) - act_ref((mb_act)a, x[i] - h)) / (2 * h);
            ref[i] = (float)(fd * dy[i]);
        }
        tu_assert_close(dx, ref, N, 1e-5, 1e-4, mb_act_name((mb_act)a));
        tu_ok(mb_act_forward(dev, 0, (mb_act)a, x, x, N));   /* in place */
        assert_memory_equal(x, y, sizeof y);
    }
    assert_string_equal(mb_act_name(MB_ACT_GELU), "gelu");
    mb_device_close(dev);
}

static void test_concat_split(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    int n = tu_int(1, 5);
    int64_t B = tu_int(1, 6), dims[5], total = 0;
    float *xs[5], *back[5];
    for (int i = 0; i < n; i++) {
        dims[i] = tu_int(1, 7);
        total += dims[i];
        xs[i] = tu_alloc_f32((size_t)(B * dims[i]));
        back[i] = tu_alloc_f32((size_t)(B * dims[i]));
        tu_fill(xs[i], (size_t)(B * dims[i]), -1, 1);
    }
    float *y = tu_alloc_f32((size_t)(B * total));
    tu_ok(mb_concat_forward(dev, 0, n, (const float *const *)xs, dims, B, y));
    for (int64_t b = 0, col = 0; b < B; b++, col = 0)
        for (int i = 0; i < n; col += dims[i], i++)
            for (int64_t j = 0; j < dims[i]; j++) assert_true(y[b * total + col + j] == xs[i][b * dims[i] + j]);
    tu_ok(mb_concat_backward(dev, 0, n, y, dims, B, back));
    for (int i = 0; i < n; i++) assert_memory_equal(back[i], xs[i], (size_t)(B * dims[i]) * sizeof(float));
    float *first = back[0];
    back[0] = NULL;   /* a NULL gradient slot is skipped */
    tu_ok(mb_concat_backward(dev, 0, n, y, dims, B, back));
    back[0] = first;
    for (int i = 0; i < n; i++) { free(xs[i]); free(back[i]); }
    free(y);
    mb_device_close(dev);
}

static void test_dropout(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    enum { N = 20000 };
    float *x = tu_alloc_f32(N), *y = tu_alloc_f32(N), *y2 = tu_alloc_f32(N), *dx = tu_alloc_f32(N);
    tu_fill(x, N, 0.5f, 1.5f);   /* never zero: a zero output means dropped */
    float p = 0.3f;
    tu_ok(mb_dropout_forward(dev, 0, p, 11, 7, x, y, N));
    tu_ok(mb_dropout_forward(dev, 0, p, 11, 7, x, y2, N));
    assert_memory_equal(y, y2, N * sizeof(float));   /* recompute: same mask */
    int kept = 0;
    for (int i = 0; i < N; i++) {
        int keep = mb_rng_uniform(11, 7, (uint64_t)i) >= p;
        assert_true(y[i] == (keep ? x[i] * (1.0f / (1.0f - p)) : 0.0f));
        kept += keep;
    }
    assert_true(fabs(kept / (double)N - 0.7) < 0.02);
    tu_ok(mb_dropout_backward(dev, 0, p, 11, 7, x, dx, N));   /* same mask on the gradient */
    assert_memory_equal(dx, y, N * sizeof(float));
    tu_ok(mb_dropout_forward(dev, 0, p, 11, 8, x, y2, N));    /* the next step: another mask */
    assert_memory_not_equal(y, y2, N * sizeof(float));
    tu_ok(mb_dropout_forward(dev, 0, 0.0f, 11, 7, x, y2, N)); /* p = 0: identity */
    assert_memory_equal(x, y2, N * sizeof(float));
    tu_assert_error(mb_dropout_forward(dev, 0, 1.0f, 1, 1, x, y, N), MB_ERR_INVALID_ARG, "probability 1");
    tu_assert_error(mb_dropout_backward(dev, 0, -0.1f, 1, 1, x, y, N), MB_ERR_INVALID_ARG, "must be in [0, 1)");
    tu_assert_error(mb_dropout_forward(dev, 0, NAN, 1, 1, x, y, N), MB_ERR_INVALID_ARG, "probability");
    tu_assert_error(mb_dropout_forward(dev, 0, 0.5f, 1, 1, NULL, y, N), MB_ERR_INVALID_ARG, "NULL buffer");
    free(x); free(y); free(y2); free(dx);
    mb_device_close(dev);
}

static double loss_ref(int huber, double delta, const float *p, const float *t, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)p[i] - t[i], a = fabs(d);
        s += !huber ? d * d : a <= delta ? 0.5 * d * d : delta * (a - 0.5 * delta);
    }
    return s / n;
}

static void test_losses(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    int64_t B = tu_int(1, 8), K = tu_int(1, 6);
    int n = (int)(B * K);
    float *pred = tu_alloc_f32((size_t)n), *tgt = tu_alloc_f32((size_t)n), *d = tu_alloc_f32((size_t)n);
    float *ref = tu_alloc_f32((size_t)n);
    for (int huber = 0; huber <= 1; huber++) {
        mb_loss_config cfg = {.kind = huber ? MB_LOSS_HUBER : MB_LOSS_MSE, .huber_delta = huber ? 0.5f : 0.0f};
        double delta = huber ? 0.5 : 1.0;
        tu_fill(pred, (size_t)n, -2, 2);
        tu_fill(tgt, (size_t)n, -2, 2);
        float loss = -1, scale = 0.25f, sdev = 8.0f;   /* accumulation divisor, loss scale */
        tu_ok(mb_loss(dev, 0, &cfg, pred, tgt, B, K, scale, &sdev, &loss, d));
        double want = loss_ref(huber, delta, pred, tgt, n);
        assert_true(fabs(loss - want) <= 1e-6 + 1e-6 * want);
        for (int i = 0; i < n; i++) {
            float keep = pred[i];
            double h = 1e-3;
            pred[i] = (float)(keep + h);
            double lp = loss_ref(huber, delta, pred, tgt, n), hp = (double)pred[i] - keep;
            pred[i] = (float)(keep - h);
            double lm = loss_ref(huber, delta, pred, tgt, n), hm = keep - (double)pred[i];
            pred[i] = keep;
            ref[i] = (float)((lp - lm) / (hp + hm) * scale * sdev);
        }
        tu_assert_close(d, ref, (size_t)n, 2e-4, 2e-3, huber ? "huber dpred" : "mse dpred");
        float loss2 = -1;
        tu_ok(mb_loss(dev, 0, &cfg, pred, tgt, B, K, 1.0f, NULL, &loss2, NULL));   /* loss only */
        assert_true(loss2 == loss);
        float host = 0;
        tu_ok(mb_fetch_scalar(dev, 0, &loss2, &host));
        assert_true(host == loss);
    }
    /* Huber with the default delta (1) equals MSE/2 where every |diff| <= 1 */
    for (int i = 0; i < n; i++) { pred[i] = tu_uniform(-0.4f, 0.4f); tgt[i] = tu_uniform(-0.4f, 0.4f); }
    mb_loss_config hub = {.kind = MB_LOSS_HUBER};
    float lh, lm;
    tu_ok(mb_loss(dev, 0, &hub, pred, tgt, B, K, 1, NULL, &lh, NULL));
    tu_ok(mb_loss(dev, 0, NULL, pred, tgt, B, K, 1, NULL, &lm, NULL));
    assert_true(fabsf(lh - 0.5f * lm) <= 1e-6f * lm + 1e-9f);
    free(pred); free(tgt); free(d); free(ref);
    mb_device_close(dev);
}

static void test_layers_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p;
    mb_linear l;
    float buf[64] = {0}, loss;
    tu_ok(mb_params_create(&p, dev));
    tu_assert_error(mb_linear_init(&l, p, "fc", 0, 3), MB_ERR_INVALID_ARG, "in=0 out=3");
    tu_assert_error(mb_linear_init(&l, p, "", 2, 3), MB_ERR_INVALID_ARG, "prefix");
    tu_assert_error(mb_linear_init(NULL, p, "fc", 2, 3), MB_ERR_INVALID_ARG, "NULL");
    tu_ok(mb_linear_init(&l, p, "fc", 2, 3));
    tu_assert_error(mb_linear_init(&l, p, "fc", 2, 3), MB_ERR_INVALID_ARG, "registered twice");
    tu_assert_error(mb_linear_forward(&l, 0, buf, 1, buf + 8), MB_ERR_STATE, "finalize not called");
    tu_ok(mb_params_finalize(p));
    tu_assert_error(mb_linear_forward(&l, 0, buf, 0, buf + 8), MB_ERR_INVALID_ARG, "'fc.weight' batch 0");
    tu_assert_error(mb_linear_forward(&l, 0, NULL, 1, buf + 8), MB_ERR_INVALID_ARG, "NULL buffer");
    tu_assert_error(mb_linear_backward(&l, 5, buf, buf, 1, NULL), MB_ERR_INVALID_ARG, "stream 5");
    tu_assert_error(mb_act_forward(dev, 0, (mb_act)9, buf, buf, 4), MB_ERR_INVALID_ARG, "unknown activation 9");
    tu_assert_error(mb_act_backward(dev, 0, MB_ACT_RELU, buf, NULL, buf, 4), MB_ERR_INVALID_ARG, "NULL dy");
    int64_t dims[2] = {2, 0};
    const float *xs[2] = {buf, buf};
    tu_assert_error(mb_concat_forward(dev, 0, 2, xs, dims, 1, buf), MB_ERR_INVALID_ARG, "input 1 has 0 features");
    tu_assert_error(mb_concat_forward(dev, 0, 0, xs, dims, 1, buf), MB_ERR_INVALID_ARG, "n=0");
    dims[1] = 2;
    xs[1] = NULL;
    tu_assert_error(mb_concat_forward(dev, 0, 2, xs, dims, 1, buf), MB_ERR_INVALID_ARG, "input 1 is NULL");
    mb_loss_config bad = {.kind = (mb_loss_kind)7}, badd = {.kind = MB_LOSS_HUBER, .huber_delta = -1.0f};
    tu_assert_error(mb_loss(dev, 0, &bad, buf, buf, 2, 2, 1, NULL, &loss, NULL), MB_ERR_INVALID_ARG, "kind 7");
    tu_assert_error(mb_loss(dev, 0, &badd, buf, buf, 2, 2, 1, NULL, &loss, NULL), MB_ERR_INVALID_ARG, "huber_delta -1");
    tu_assert_error(mb_loss(dev, 0, NULL, buf, buf, 0, 2, 1, NULL, &loss, NULL), MB_ERR_INVALID_ARG, "shape (0, 2)");
    tu_assert_error(mb_loss(dev, 0, NULL, buf, buf, 2, 2, 1, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "neither");
    tu_assert_error(mb_loss(dev, 0, NULL, buf, buf, 2, 2, INFINITY, NULL, &loss, NULL), MB_ERR_INVALID_ARG,
                    "not finite");
    tu_assert_error(mb_fetch_scalar(dev, 0, NULL, &loss), MB_ERR_INVALID_ARG, "NULL pointer");
    mb_params_destroy(p);
    mb_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_forward_backward),
        cmocka_unit_test(test_linear_finite_differences),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_concat_split),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_layers_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
