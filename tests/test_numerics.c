/* numerics (CPU backend), optimizer side: AdamW against hand-computed values and
 * torch.optim.AdamW golden values (tests/golden/), clipping, LR schedules, the dynamic
 * loss scaler (PyTorch's update cases, inf/NaN anywhere, skipped steps bitwise equal to
 * a control run, floor/cap, no overflow), gradient accumulation (K micro-batches == one
 * batch of K*B; an inf skips the window; resume mid-window) and bad input. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mb_args.h" /* the programs' --schedule parser (mba_parse) */

/* weight (3, 4) + bias (3): indices 0 and 1 */
static mb_params *make_wb(mb_device *dev) {
    mb_params *p;
    int64_t ws[2] = {3, 4}, bs[1] = {3};
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_params_add(p, "w", 2, ws, 0.5f, NULL));
    tu_ok(mb_params_add(p, "b", 1, bs, 0.5f, NULL));
    tu_ok(mb_params_finalize(p));
    return p;
}

static void test_adamw_hand_computed(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p = make_wb(dev);
    float *w = mb_params_tensor(p, 0), *b = mb_params_tensor(p, 1);
    float *gw = mb_params_tensor_grad(p, 0), *gb = mb_params_tensor_grad(p, 1);
    for (int decay_all = 0; decay_all <= 1; decay_all++) {
        mb_adamw_config c = mb_adamw_config_default();
        c.weight_decay = 0.1f;
        c.decay_all = decay_all;
        mb_adamw *o;
        tu_ok(mb_adamw_create(&o, p, &c));
        for (int i = 0; i < 12; i++) { w[i] = 1.0f; gw[i] = 0.5f; }
        for (int i = 0; i < 3; i++) { b[i] = 1.0f; gb[i] = 0.5f; }
        tu_ok(mb_adamw_step(o, 0.1f, NULL));
        /* step 1: m = 0.05, v = 2.5e-4, m^ = 0.5, v^ = 0.25: update lr * 0.5 / (0.5 + eps) */
        double upd = 0.1 * 0.5 / (0.5 + 1e-8);
        assert_true(fabs(w[0] - ((1.0 - 0.1 * 0.1) - upd)) < 1e-6);
        assert_true(fabs(b[2] - ((decay_all ? 0.99 : 1.0) - upd)) < 1e-6);
        assert_true(fabsf(mb_adamw_m(o)[0] - 0.05f) < 1e-8f && fabsf(mb_adamw_v(o)[0] - 2.5e-4f) < 1e-10f);
        /* step 2 with g = -0.5: m = 0.045 - 0.05 = -0.005... computed from the formulas */
        for (int i = 0; i < 12; i++) gw[i] = -0.5f;
        float w1 = w[0];
        tu_ok(mb_adamw_step(o, 0.1f, NULL));
        double m = 0.9 * 0.05 + 0.1 * -0.5, v = 0.999 * 2.5e-4 + 0.001 * 0.25;
        double mh = m / (1 - 0.81), vh = v / (1 - 0.999 * 0.999);
        double want = w1 * (1 - 0.01) - 0.1 * mh / (sqrt(vh) + 1e-8);
        assert_true(fabs(w[0] - want) < 2e-6);
        int64_t steps;
        tu_ok(mb_adamw_steps(o, &steps));
        assert_int_equal(steps, 2);
        mb_adamw_destroy(o);
    }
    mb_params_destroy(p);
    mb_device_close(dev);
}

static void test_clip_hand_computed(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p = make_wb(dev);
    mb_adamw_config c = mb_adamw_config_default();
    c.max_grad_norm = 1.0f;
    mb_adamw *o;
    tu_ok(mb_adamw_create(&o, p, &c));
    float *gw = mb_params_tensor_grad(p, 0), *gb = mb_params_tensor_grad(p, 1);
    gw[0] = 3.0f; gw[5] = -4.0f; gb[1] = 0.0f;   /* norm 5 */
    tu_ok(mb_adamw_step(o, 1e-3f, NULL));
    float norm;
    tu_ok(mb_adamw_grad_norm(o, &norm));
    assert_true(norm == 5.0f);
    double coef = 1.0 / (5.0 + 1e-6);   /* torch: max_norm / (norm + 1e-6) */
    assert_true(fabs(mb_adamw_m(o)[0] - 0.1 * 3.0 * coef) < 1e-8);
    assert_true(fabs(mb_adamw_m(o)[5] - 0.1 * -4.0 * coef) < 1e-8);
    assert_true(gw[0] == 3.0f);   /* the gradient buffer itself is not rewritten */
    /* below the threshold: no clipping */
    mb_adamw_destroy(o);
    tu_ok(mb_adamw_create(&o, p, &c));
    gw[0] = 0.3f; gw[5] = -0.4f;
    tu_ok(mb_adamw_step(o, 1e-3f, NULL));
    assert_true(mb_adamw_m(o)[0] == (float)(0.1f * 0.3f));
    mb_adamw_destroy(o);
    mb_params_destroy(p);
    mb_device_close(dev);
}

static void read_floats(FILE *f, float *x, int n) {
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%f", &x[i]) != 1) fail_msg("golden file truncated");
}

static void test_adamw_torch_golden(void **state) {
    (void)state;
    const char *path = "tests/golden/adamw_golden.txt";
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    mb_device *dev = tu_open_cpu();
    int scenarios;
    assert_int_equal(fscanf(f, "%d", &scenarios), 1);
    assert_int_equal(scenarios, 2);
    for (int sc = 0; sc < scenarios; sc++) {
        float max_norm, w[12], b[3], want_w[12], want_b[3], lr, norm, got_norm = -1;
        int steps, nw, nb;
        assert_int_equal(fscanf(f, "%f %d %d %d", &max_norm, &steps, &nw, &nb), 4);
        assert_true(nw == 12 && nb == 3);
        mb_params *p = make_wb(dev);
        read_floats(f, w, 12);
        read_floats(f, b, 3);
        memcpy(mb_params_tensor(p, 0), w, sizeof w);
        memcpy(mb_params_tensor(p, 1), b, sizeof b);
        mb_adamw_config c = mb_adamw_config_default();
        c.weight_decay = 0.1f;   /* the script's bias group has weight_decay 0: our no_decay default */
        c.max_grad_norm = max_norm;
        mb_adamw *o;
        tu_ok(mb_adamw_create(&o, p, &c));
        for (int s = 0; s < steps; s++) {
            read_floats(f, &lr, 1);
            read_floats(f, mb_params_tensor_grad(p, 0), 12);
            read_floats(f, mb_params_tensor_grad(p, 1), 3);
            read_floats(f, &norm, 1);
            read_floats(f, want_w, 12);
            read_floats(f, want_b, 3);
            tu_ok(mb_adamw_step(o, lr, NULL));
            tu_ok(mb_adamw_grad_norm(o, &got_norm));
            assert_true(fabsf(got_norm - norm) <= 1e-6f * norm);
            tu_assert_close(mb_params_tensor(p, 0), want_w, 12, 1e-7, 1e-6, "torch AdamW weight");
            tu_assert_close(mb_params_tensor(p, 1), want_b, 3, 1e-7, 1e-6, "torch AdamW bias");
        }
        mb_adamw_destroy(o);
        mb_params_destroy(p);
    }
    fclose(f);
    mb_device_close(dev);
}

static void test_lr_schedules(void **state) {
    (void)state;
    float lr;
    mb_lr_schedule c = {.kind = MB_LR_CONSTANT, .lr = 3e-4f};
    tu_ok(mb_lr_at(&c, 123456, &lr));
    assert_true(lr == 3e-4f);
    mb_lr_schedule wc = {.kind = MB_LR_WARMUP_COSINE, .lr = 1e-3f, .total_steps = 110, .warmup_steps = 10, .min_lr = 1e-5f};
    tu_ok(mb_lr_at(&wc, 0, &lr));
    assert_true(fabsf(lr - 1e-4f) < 1e-10f);              /* 1e-3 * 1/10 */
    tu_ok(mb_lr_at(&wc, 4, &lr));
    assert_true(fabsf(lr - 5e-4f) < 1e-10f);
    tu_ok(mb_lr_at(&wc, 9, &lr));
    assert_true(lr == 1e-3f);                             /* end of warmup */
    tu_ok(mb_lr_at(&wc, 10, &lr));
    assert_true(lr == 1e-3f);                             /* cos(0) */
    tu_ok(mb_lr_at(&wc, 60, &lr));
    assert_true(fabsf(lr - 5.05e-4f) < 1e-9f);            /* halfway: (max + min) / 2 */
    tu_ok(mb_lr_at(&wc, 35, &lr));                        /* a quarter: min + (max-min)(1+cos(pi/4))/2 */
    assert_true(fabs(lr - (1e-5 + (1e-3 - 1e-5) * (1 + sqrt(0.5)) / 2)) < 1e-9);
    tu_ok(mb_lr_at(&wc, 109, &lr));
    assert_true(lr > 1e-5f && lr < 1.1e-5f);
    /* one-cycle, torch defaults: 1000 steps, max 1e-2: start 4e-4, peak at step 299, end 4e-8 */
    mb_lr_schedule oc = {.kind = MB_LR_ONE_CYCLE, .lr = 1e-2f, .total_steps = 1000};
    tu_ok(mb_lr_at(&oc, 0, &lr));
    assert_true(fabsf(lr - 4e-4f) < 1e-10f);
    tu_ok(mb_lr_at(&oc, 299, &lr));
    assert_true(fabsf(lr - 1e-2f) < 1e-9f);
    tu_ok(mb_lr_at(&oc, 999, &lr));
    assert_true(fabsf(lr - 4e-8f) < 1e-13f);
    tu_ok(mb_lr_at(&oc, 649, &lr));                       /* halfway down: (1e-2 + 4e-8) / 2 */
    assert_true(fabs(lr - (1e-2 + 4e-8) / 2) < 1e-8);
    /* bad schedules */
    mb_lr_schedule bad = c;
    bad.lr = 0;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "lr 0 must be finite and > 0");
    bad.lr = -1e-3f;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "lr -0.001");
    tu_assert_error(mb_lr_at(&c, -1, &lr), MB_ERR_INVALID_ARG, "step -1");
    tu_assert_error(mb_lr_at(&wc, 110, &lr), MB_ERR_INVALID_ARG, "step 110 outside");
    bad = wc;
    bad.warmup_steps = 110;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "warmup_steps 110");
    bad = wc;
    bad.min_lr = 2e-3f;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "min_lr");
    bad = oc;
    bad.pct_start = 1.5f;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "pct_start 1.5");
    bad.kind = (mb_lr_kind)9;
    tu_assert_error(mb_lr_at(&bad, 0, &lr), MB_ERR_INVALID_ARG, "unknown schedule kind 9");
}

/* mb_lr_kind_name: every kind has a name and every name is a kind, the names are distinct, and
 * each round-trips through the programs' --schedule parser (a choice list built from them) to
 * its kind; past the last name, the kind is refused (so a new kind without a name fails here). */
static void test_lr_kind_names(void **state) {
    (void)state;
    const char *names[8] = {NULL};
    int n = 0;
    while (n < 7 && mb_lr_kind_name((mb_lr_kind)n)) names[n] = mb_lr_kind_name((mb_lr_kind)n), n++;
    assert_true(n >= 3 && n < 7);
    assert_null(mb_lr_kind_name((mb_lr_kind)-1));
    float lr;
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < k; j++) assert_string_not_equal(names[j], names[k]);
        int kind = -1;
        char *argv[] = {(char *)"prog", (char *)"--schedule", (char *)names[k], NULL};
        const mba_flag flags[] = {{"--schedule", MBA_CHOICE, &kind, 0, 0, names}};
        assert_int_equal(mba_parse(3, argv, flags, 1), 1);
        assert_int_equal(kind, k);
        assert_string_equal(mb_lr_kind_name((mb_lr_kind)kind), names[k]);
        mb_lr_schedule s = {.lr = 1e-3f, .kind = (mb_lr_kind)k, .total_steps = 10};
        tu_ok(mb_lr_at(&s, 0, &lr));
    }
    mb_lr_schedule past = {.lr = 1e-3f, .kind = (mb_lr_kind)n, .total_steps = 10};
    tu_assert_error(mb_lr_at(&past, 0, &lr), MB_ERR_INVALID_ARG, "unknown schedule kind");
}

static mb_scaler *make_scaler(mb_device *dev, float init, float growth, float backoff, int interval) {
    mb_scaler_config c;
    memset(&c, 0, sizeof c);
    c.init_scale = init; c.growth_factor = growth; c.backoff_factor = backoff; c.growth_interval = interval;
    mb_scaler *s;
    tu_ok(mb_scaler_create(&s, dev, &c));
    return s;
}

static float scale_of(mb_scaler *s) {
    mb_scaler_state st;
    tu_ok(mb_scaler_get(s, &st));
    return st.scale;
}

/* PyTorch's test_grad_scaling_update_scale: growth 2, backoff 0.25, interval 2. */
static void test_scaler_torch_sequence(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_scaler *s = make_scaler(dev, 4.0f, 2.0f, 0.25f, 2);
    float g[3] = {4.0f, -8.0f, 2.0f};
    int taken = -1;
    mb_scaler_state st;
    tu_ok(mb_scaler_unscale(s, g, 3));
    assert_true(g[0] == 1.0f && g[1] == -2.0f && g[2] == 0.5f);
    tu_ok(mb_scaler_update(s));
    tu_ok(mb_scaler_get(s, &st));
    assert_true(st.scale == 4.0f && st.growth_tracker == 1 && !st.found_inf);
    tu_ok(mb_scaler_update(s));
    tu_ok(mb_scaler_get(s, &st));
    assert_true(st.scale == 8.0f && st.growth_tracker == 0);   /* 4 -> 8 */
    tu_ok(mb_scaler_step_taken(s, &taken));
    assert_true(taken);
    g[1] = INFINITY;
    tu_ok(mb_scaler_unscale(s, g, 3));
    tu_ok(mb_scaler_get(s, &st));
    assert_true(st.found_inf == 1);
    tu_ok(mb_scaler_update(s));
    tu_ok(mb_scaler_get(s, &st));
    assert_true(st.scale == 2.0f && st.growth_tracker == 0 && st.found_inf == 0 && st.last_found_inf == 1); /* 8 -> 2 */
    tu_ok(mb_scaler_step_taken(s, &taken));
    assert_false(taken);
    assert_non_null(mb_scaler_scale_ptr(s));
    assert_true(*mb_scaler_scale_ptr(s) == 2.0f);
    mb_scaler_destroy(s);
    /* the defaults: 2^16, growth after 2000 clean steps */
    tu_ok(mb_scaler_create(&s, dev, NULL));
    tu_ok(mb_scaler_get(s, &st));
    assert_true(st.scale == 65536.0f);
    for (int i = 0; i < 1999; i++) tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 65536.0f);
    tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 131072.0f);
    mb_scaler_destroy(s);
    mb_device_close(dev);
}

static void test_scaler_inf_nan_anywhere(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_scaler *s = make_scaler(dev, 1024.0f, 2.0f, 0.5f, 100);
    enum { N = 67 };
    float g[N];
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    mb_scaler_state st;
    for (int pos = 0; pos < N; pos++)
        for (int k = 0; k < 3; k++) {
            tu_fill(g, N, -1e3f, 1e3f);
            g[pos] = bad[k];
            tu_ok(mb_scaler_unscale(s, g, N));
            tu_ok(mb_scaler_get(s, &st));
            if (!st.found_inf) fail_msg("%g at position %d not detected", (double)bad[k], pos);
            st.found_inf = 0;
            tu_ok(mb_scaler_set(s, &st));
        }
    tu_fill(g, N, -1e30f, 1e30f);   /* big but finite: clean */
    tu_ok(mb_scaler_unscale(s, g, N));
    tu_ok(mb_scaler_get(s, &st));
    assert_int_equal(st.found_inf, 0);
    mb_scaler_destroy(s);
    mb_device_close(dev);
}

static void test_scaler_limits(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_scaler_config c;
    memset(&c, 0, sizeof c);
    c.init_scale = 1e38f; c.growth_factor = 1e10f; c.growth_interval = 1;
    mb_scaler *s;
    tu_ok(mb_scaler_create(&s, dev, &c));
    for (int i = 0; i < 3; i++) tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 1e38f);   /* growth to inf refused, scale unchanged */
    mb_scaler_destroy(s);
    memset(&c, 0, sizeof c);             /* cap */
    c.init_scale = 1; c.growth_factor = 4; c.growth_interval = 1; c.max_scale = 8;
    tu_ok(mb_scaler_create(&s, dev, &c));
    tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 4.0f);
    tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 8.0f);
    tu_ok(mb_scaler_update(s));
    assert_true(scale_of(s) == 8.0f);
    mb_scaler_destroy(s);
    memset(&c, 0, sizeof c);             /* floor */
    c.init_scale = 1; c.min_scale = 0.3f;
    tu_ok(mb_scaler_create(&s, dev, &c));
    float g = NAN;
    for (int i = 0; i < 3; i++) {
        tu_ok(mb_scaler_unscale(s, &g, 1));
        tu_ok(mb_scaler_update(s));
    }
    assert_true(scale_of(s) == 0.3f);
    mb_scaler_destroy(s);
    mb_device_close(dev);
}

/* Run S steps of scaled gradients through unscale + AdamW + update. inf_at: the step
 * whose gradient gets an inf (-1: none); skip_at: a step left out entirely (-1: none). */
static void scaled_run(mb_device *dev, int S, int inf_at, int skip_at, float *params_out, float *m_out, float *v_out,
                       float *scale_out, int64_t *steps_out, int *skips_out) {
    mb_params *p = make_wb(dev);
    tu_ok(mb_params_init(p, 42));
    mb_adamw_config c = mb_adamw_config_default();
    c.max_grad_norm = 1.0f;
    mb_adamw *o;
    tu_ok(mb_adamw_create(&o, p, &c));
    mb_scaler *s = make_scaler(dev, 1024.0f, 2.0f, 0.5f, 2);
    size_t n = mb_params_total(p);
    *skips_out = 0;
    for (int step = 0; step < S; step++) {
        if (step == skip_at) continue;
        float scale = scale_of(s);
        float *g = mb_params_grad(p);
        for (size_t i = 0; i < n; i++) g[i] = 0.0f;
        for (int i = 0; i < 12; i++) mb_params_tensor_grad(p, 0)[i] = scale * (float)((step * 7 + i) % 11 - 5) / 8.0f;
        for (int i = 0; i < 3; i++) mb_params_tensor_grad(p, 1)[i] = scale * (float)(i - step) / 4.0f;
        if (step == inf_at) mb_params_tensor_grad(p, 0)[step % 12] = INFINITY;
        tu_ok(mb_scaler_unscale(s, g, n));
        tu_ok(mb_adamw_step(o, 1e-2f, s));
        tu_ok(mb_scaler_update(s));
        int taken = -1, taken2 = -2;
        tu_ok(mb_scaler_step_taken(s, &taken));
        tu_ok(mb_adamw_last_step_taken(o, &taken2));
        assert_int_equal(taken, taken2);
        *skips_out += !taken;
    }
    memcpy(params_out, mb_params_data(p), n * sizeof(float));
    memcpy(m_out, mb_adamw_m(o), n * sizeof(float));
    memcpy(v_out, mb_adamw_v(o), n * sizeof(float));
    *scale_out = scale_of(s);
    tu_ok(mb_adamw_steps(o, steps_out));
    mb_scaler_destroy(s);
    mb_adamw_destroy(o);
    mb_params_destroy(p);
}

static void test_skipped_step_bitwise(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    enum { S = 7, K = 3, NMAX = 128 };
    float pa[NMAX], ma[NMAX], va[NMAX], pb[NMAX], mb_[NMAX], vb[NMAX], sa, sb;
    int64_t ta, tb;
    int ka, kb;
    scaled_run(dev, S, K, -1, pa, ma, va, &sa, &ta, &ka);
    scaled_run(dev, S, -1, K, pb, mb_, vb, &sb, &tb, &kb);
    assert_int_equal(ka, 1);
    assert_int_equal(kb, 0);
    assert_memory_equal(pa, pb, sizeof pa);
    assert_memory_equal(ma, mb_, sizeof ma);
    assert_memory_equal(va, vb, sizeof va);
    assert_int_equal(ta, S - 1);
    assert_int_equal(tb, S - 1);
    /* interval 2: grown after steps 1 and 5, backed off at step 3 */
    assert_true(sa == 1024.0f * powf(2.0f, 2) * powf(0.5f, 1));
    mb_device_close(dev);
}

static void test_corruption_after_unscale(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p = make_wb(dev);
    tu_ok(mb_params_init(p, 3));
    size_t n = mb_params_total(p);
    mb_adamw *o;
    tu_ok(mb_adamw_create(&o, p, NULL));
    mb_scaler *s = make_scaler(dev, 8.0f, 2.0f, 0.5f, 2000);
    float before[128];
    memcpy(before, mb_params_data(p), n * sizeof(float));
    tu_fill(mb_params_tensor_grad(p, 0), 12, -8, 8);
    tu_ok(mb_scaler_unscale(s, mb_params_grad(p), n));
    mb_params_tensor_grad(p, 1)[2] = NAN;   /* after the check, before the step */
    tu_ok(mb_adamw_step(o, 1e-2f, s));
    tu_ok(mb_scaler_update(s));
    int taken = -1;
    tu_ok(mb_scaler_step_taken(s, &taken));
    assert_false(taken);
    assert_memory_equal(before, mb_params_data(p), n * sizeof(float));
    assert_true(scale_of(s) == 4.0f);
    for (size_t i = 0; i < n; i++) assert_true(mb_adamw_m(o)[i] == 0.0f && mb_adamw_v(o)[i] == 0.0f);
    /* bf16 mode: no scaler; a non-finite gradient still skips, a clean one steps */
    tu_ok(mb_adamw_step(o, 1e-2f, NULL));
    tu_ok(mb_adamw_last_step_taken(o, &taken));
    assert_false(taken);
    mb_params_tensor_grad(p, 1)[2] = 0.5f;
    tu_ok(mb_adamw_step(o, 1e-2f, NULL));
    tu_ok(mb_adamw_last_step_taken(o, &taken));
    assert_true(taken);
    assert_memory_not_equal(before, mb_params_data(p), n * sizeof(float));
    mb_scaler_destroy(s);
    mb_adamw_destroy(o);
    mb_params_destroy(p);
    mb_device_close(dev);
}

/* Linear model, MSE: K micro-batches of B with loss scale 1/K == one batch of K*B. */
static void accum_run(mb_device *dev, int K, int B, const float *x, const float *t, int inf_micro, float *grad_out,
                      float *param_out, int *taken_out) {
    mb_params *p;
    mb_linear l;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_linear_init(&l, p, "fc", 5, 3));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 17));
    /* eps 1e-3, not 1e-8: AdamW's first step moves a weight by lr g/(|g|+eps), which changes
     * by up to lr/eps times a change of g. With 1e-8, a gradient that cancels to about eps
     * turned its two summation orders' 9e-10 into 4.5e-5 of the weight (MB_TEST_SEED=2213:
     * 3.45e-8 against 3.54e-8); with 1e-3 the step passes on at most 10x the gradient's error. */
    mb_adamw_config oc = mb_adamw_config_default();
    oc.eps = 1e-3f;
    mb_adamw *o;
    tu_ok(mb_adamw_create(&o, p, &oc));
    mb_scaler *s = make_scaler(dev, 256.0f, 2.0f, 0.5f, 2000);
    mb_accum a;
    tu_ok(mb_accum_init(&a, K));
    float y[64 * 3], dy[64 * 3], xin[64 * 5], loss;
    size_t n = mb_params_total(p);
    for (int micro = 0; micro < K; micro++) {
        if (mb_accum_window_start(&a)) tu_ok(mb_params_zero_grad(p));
        memcpy(xin, x + micro * B * 5, (size_t)B * 5 * sizeof(float));
        if (micro == inf_micro) xin[3] = INFINITY;
        tu_ok(mb_linear_forward(&l, 0, xin, B, y));
        tu_ok(mb_loss(dev, 0, NULL, y, t + micro * B * 3, B, 3, mb_accum_loss_scale(&a), mb_scaler_scale_ptr(s), &loss, dy));
        tu_ok(mb_linear_backward(&l, 0, xin, dy, B, NULL));
        int step = mb_accum_tick(&a);
        assert_int_equal(step, micro == K - 1);
        if (step) {
            tu_ok(mb_scaler_unscale(s, mb_params_grad(p), n));
            memcpy(grad_out, mb_params_grad(p), n * sizeof(float));
            tu_ok(mb_adamw_step(o, 1e-2f, s));
            tu_ok(mb_scaler_update(s));
            tu_ok(mb_scaler_step_taken(s, taken_out));
        }
    }
    assert_int_equal(a.windows, 1);
    memcpy(param_out, mb_params_data(p), n * sizeof(float));
    mb_scaler_destroy(s);
    mb_adamw_destroy(o);
    mb_params_destroy(p);
}

static void test_accumulation_equivalence(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    int K = tu_int(2, 4), B = tu_int(1, 16);
    float x[64 * 5], t[64 * 3], g1[128], gk[128], p1[128], pk[128], p0[128];
    tu_fill(x, (size_t)(K * B * 5), -1, 1);
    tu_fill(t, (size_t)(K * B * 3), -1, 1);
    int taken1, takenk;
    accum_run(dev, 1, K * B, x, t, -1, g1, p1, &taken1);
    accum_run(dev, K, B, x, t, -1, gk, pk, &takenk);
    assert_true(taken1 && takenk);
    double e = tu_rel_norm_err(gk, g1, 128);
    if (e > 1e-5) fail_msg("K=%d micro-batches of %d vs one batch: gradient rel err %g", K, B, e);
    e = tu_rel_norm_err(pk, p1, 128);
    if (e > 1e-5) fail_msg("params after the step: rel err %g", e);
    /* an inf in one micro-batch skips the whole window: params stay at their init */
    accum_run(dev, K, B, x, t, tu_int(0, K - 1), gk, pk, &takenk);
    assert_false(takenk);
    mb_params *p;
    mb_linear l;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_linear_init(&l, p, "fc", 5, 3));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 17));
    memcpy(p0, mb_params_data(p), sizeof p0);
    assert_memory_equal(pk, p0, sizeof p0);
    mb_params_destroy(p);
    mb_device_close(dev);
}

static void test_accum_counter_and_resume(void **state) {
    (void)state;
    mb_accum a, b;
    memset(&b, 0, sizeof b); /* set by mb_accum_restore below; GCC 12 -O3 cannot always see it */
    tu_ok(mb_accum_init(&a, 3));
    assert_true(mb_accum_loss_scale(&a) == 1.0f / 3.0f);
    int pattern[7];
    for (int i = 0; i < 7; i++) {
        if (i == 4) { tu_ok(mb_accum_restore(&b, a.n, a.micro, a.windows)); }   /* save mid-window */
        pattern[i] = mb_accum_tick(&a);
    }
    const int want[7] = {0, 0, 1, 0, 0, 1, 0};
    assert_memory_equal(pattern, want, sizeof want);
    assert_int_equal(a.windows, 2);
    assert_int_equal(b.micro, 1);
    assert_false(mb_accum_window_start(&b));
    assert_int_equal(mb_accum_tick(&b), 0);   /* the resumed copy goes on where a was */
    assert_int_equal(mb_accum_tick(&b), 1);
    assert_int_equal(b.windows, 2);
    assert_true(mb_accum_window_start(&b));
    tu_ok(mb_accum_init(&a, 1));
    assert_int_equal(mb_accum_tick(&a), 1);
    tu_assert_error(mb_accum_init(&a, 0), MB_ERR_INVALID_ARG, "n = 0 micro-batches");
    tu_assert_error(mb_accum_init(&a, -2), MB_ERR_INVALID_ARG, "n = -2");
    tu_assert_error(mb_accum_restore(&a, 3, 3, 0), MB_ERR_INVALID_ARG, "micro 3 must be in 0..2");
    tu_assert_error(mb_accum_restore(&a, 3, 0, -1), MB_ERR_INVALID_ARG, "windows -1");
}

static void test_optim_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu(), *dev2 = tu_open_cpu();
    mb_params *p = make_wb(dev), *raw;
    mb_adamw *o;
    tu_ok(mb_params_create(&raw, dev));
    tu_assert_error(mb_adamw_create(&o, raw, NULL), MB_ERR_STATE, "mb_adamw_create: mb_params_finalize not called");
    mb_adamw_config c = mb_adamw_config_default();
    c.beta1 = 1.0f;
    tu_assert_error(mb_adamw_create(&o, p, &c), MB_ERR_INVALID_ARG, "beta1 1");
    c = mb_adamw_config_default();
    c.eps = 0;
    tu_assert_error(mb_adamw_create(&o, p, &c), MB_ERR_INVALID_ARG, "eps 0");
    c = mb_adamw_config_default();
    c.weight_decay = -0.1f;
    tu_assert_error(mb_adamw_create(&o, p, &c), MB_ERR_INVALID_ARG, "weight_decay -0.1");
    c = mb_adamw_config_default();
    c.max_grad_norm = -1;
    tu_assert_error(mb_adamw_create(&o, p, &c), MB_ERR_INVALID_ARG, "max_grad_norm -1");
    tu_ok(mb_adamw_create(&o, p, NULL));
    tu_assert_error(mb_adamw_step(o, 0.0f, NULL), MB_ERR_INVALID_ARG, "learning rate 0");
    tu_assert_error(mb_adamw_step(o, -1e-3f, NULL), MB_ERR_INVALID_ARG, "learning rate -0.001");
    tu_assert_error(mb_adamw_step(o, NAN, NULL), MB_ERR_INVALID_ARG, "learning rate nan");
    tu_assert_error(mb_adamw_step(o, INFINITY, NULL), MB_ERR_INVALID_ARG, "must be finite");
    mb_scaler *other;
    tu_ok(mb_scaler_create(&other, dev2, NULL));
    tu_assert_error(mb_adamw_step(o, 1e-3f, other), MB_ERR_INVALID_ARG, "different devices");
    tu_assert_error(mb_adamw_set_steps(o, -1), MB_ERR_INVALID_ARG, "-1 < 0");
    tu_assert_error(mb_adamw_step(NULL, 1e-3f, NULL), MB_ERR_INVALID_ARG, "NULL optimizer");
    mb_scaler_destroy(other);
    mb_adamw_destroy(o);
    /* allocation failure at each allocation: an error, nothing leaked */
    size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
    for (uint64_t k = 1; k <= 4; k++) {
        mb_device_fail_alloc(dev, MB_MEM_DEVICE, k);
        tu_assert_error(mb_adamw_create(&o, p, NULL), MB_ERR_OUT_OF_MEMORY, "injected");
        assert_null(o);
        assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], live);
    }
    mb_params_destroy(raw);
    mb_params_destroy(p);
    mb_device_close(dev);
    mb_device_close(dev2);
}

static void test_scaler_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_scaler *s;
    mb_scaler_config c;
    memset(&c, 0, sizeof c);
    c.growth_factor = 1.0f;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "growth_factor 1 must be finite and > 1");
    c.growth_factor = INFINITY;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "growth_factor inf");
    memset(&c, 0, sizeof c);
    c.backoff_factor = 1.0f;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "backoff_factor 1 must be in (0, 1)");
    c.backoff_factor = -0.5f;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "backoff_factor -0.5");
    memset(&c, 0, sizeof c);
    c.init_scale = -1.0f;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "init_scale -1");
    memset(&c, 0, sizeof c);
    c.growth_interval = -3;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "growth_interval -3");
    memset(&c, 0, sizeof c);
    c.min_scale = 10; c.max_scale = 5;
    tu_assert_error(mb_scaler_create(&s, dev, &c), MB_ERR_INVALID_ARG, "min <= max");
    tu_ok(mb_scaler_create(&s, dev, NULL));
    mb_scaler_state st = {0.0f, 0, 0, 0};
    tu_assert_error(mb_scaler_set(s, &st), MB_ERR_INVALID_ARG, "scale 0 must be finite > 0");
    st.scale = 4; st.growth_tracker = 2000;
    tu_assert_error(mb_scaler_set(s, &st), MB_ERR_INVALID_ARG, "growth_tracker 2000 in 0..1999");
    tu_assert_error(mb_scaler_unscale(s, NULL, 4), MB_ERR_INVALID_ARG, "NULL gradients");
    tu_assert_error(mb_scaler_unscale(NULL, NULL, 4), MB_ERR_INVALID_ARG, "NULL scaler");
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 1);
    mb_scaler *s2 = NULL;
    tu_assert_error(mb_scaler_create(&s2, dev, NULL), MB_ERR_OUT_OF_MEMORY, "injected");
    assert_null(s2);
    mb_scaler_destroy(s);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    mb_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_hand_computed),
        cmocka_unit_test(test_clip_hand_computed),
        cmocka_unit_test(test_adamw_torch_golden),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_lr_kind_names),
        cmocka_unit_test(test_scaler_torch_sequence),
        cmocka_unit_test(test_scaler_inf_nan_anywhere),
        cmocka_unit_test(test_scaler_limits),
        cmocka_unit_test(test_skipped_step_bitwise),
        cmocka_unit_test(test_corruption_after_unscale),
        cmocka_unit_test(test_accumulation_equivalence),
        cmocka_unit_test(test_accum_counter_and_resume),
        cmocka_unit_test(test_optim_bad_input),
        cmocka_unit_test(test_scaler_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
