/* CUDA dropout inside the captured step (issue 43) against the CPU: mb_dropout_*_dev with the
 * step in device memory gives the CPU's mask bit for bit, and a captured graph of (advance, mask)
 * draws the next step's mask at each replay; a multi-layer LSTM with dropout (full storage,
 * checkpointed, two at once) and the multi-timeframe model match the CPU (the masks the same:
 * the head's dropped elements are the same ones), evaluation = no dropout, and the model's
 * training step captured once and replayed gives the eager steps' bits, a new mask each time.
 * Without a GPU every test skips cleanly. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"
#include "../examples/multitf.h"

static float *up(mb_device *g, const float *h, size_t n) {
    float *d = NULL;
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, n * sizeof(float), (void **)&d));
    tu_ok(mb_copy(g, 0, d, h, n * sizeof(float)));
    tu_ok(mb_sync(g, 0));
    return d;
}
static void down(mb_device *g, void *h, const void *d, size_t bytes) {
    tu_ok(mb_sync(g, -1));
    tu_ok(mb_copy(g, 0, h, d, bytes));
    tu_ok(mb_sync(g, 0));
}

static float ref_drop(float p, uint64_t seed, uint64_t step, size_t i, float x) {
    return mb_rng_uniform(seed, step, (uint64_t)i) >= p ? x * (1.0f / (1.0f - p)) : 0.0f;
}

static void test_cuda_dropout_dev_graph(void **state) {
    (void)state;
    mb_device *g = tu_open_cuda_or_skip(0);
    size_t n = (size_t)tu_int(1, 300000);
    float p = tu_uniform(0.05f, 0.9f);
    uint64_t seed = tu_next(), step = tu_next() >> 2, *sd = NULL, sh = 0;
    float *x = tu_alloc_f32(n), *y = tu_alloc_f32(n);
    tu_fill(x, n, 0.5f, 2.0f);
    float *dx = up(g, x, n), *dy = NULL;
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, n * sizeof(float), (void **)&dy));
    tu_ok(mb_alloc(g, MB_MEM_DEVICE, sizeof *sd, (void **)&sd));
    tu_ok(mb_copy(g, 0, sd, &step, sizeof step));
    tu_ok(mb_dropout_forward_dev(g, 0, p, seed, sd, dx, dy, n));
    down(g, y, dy, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float r = ref_drop(p, seed, step, i, x[i]);
        if (memcmp(&y[i], &r, sizeof r)) fail_msg("element %zu: not the mask", i);
    }
    tu_ok(mb_dropout_backward_dev(g, 1, p, seed, sd, dx, dy, n)); /* the gradient, on another stream */
    float *y2 = tu_alloc_f32(n);
    down(g, y2, dy, n * sizeof(float));
    assert_memory_equal(y, y2, n * sizeof(float));
    /* captured once: advance, then the mask; each replay draws the next step's */
    mb_graph *gr = NULL;
    tu_ok(mb_graph_begin(g, MB_STREAM_COMPUTE));
    tu_ok(mb_dropout_step_advance(g, MB_STREAM_COMPUTE, sd));
    tu_ok(mb_dropout_forward_dev(g, MB_STREAM_COMPUTE, p, seed, sd, dx, dy, n));
    tu_ok(mb_graph_end(g, &gr));
    for (int r = 1; r <= 3; r++) {
        tu_ok(mb_graph_launch(gr));
        down(g, y, dy, n * sizeof(float));
        down(g, &sh, sd, sizeof sh);
        assert_true(sh == step + (uint64_t)r);
        for (size_t i = 0; i < n; i++) {
            float v = ref_drop(p, seed, step + (uint64_t)r, i, x[i]);
            if (memcmp(&y[i], &v, sizeof v))
                fail_msg("replay %d, element %zu: not step %llu's mask", r, i, (unsigned long long)(step + r));
        }
    }
    mb_graph_destroy(gr);
    mb_free(g, dx); mb_free(g, dy); mb_free(g, sd);
    free(x); free(y); free(y2);
    tu_device_close(g);
}

// ---- the LSTM ----

typedef struct lcase { int B, T, F, H, L; float p; uint64_t seed; } lcase;
enum { R_OUT, R_HL, R_GRAD, R_DX, R_N };
static const char *rnames[R_N] = {"out_seq", "h_last", "grads", "dx"};

/* Forward + backward of an L-layer LSTM with dropout on dev (checkpoint ck; training as given;
 * step: the masks' step; two: beside a second LSTM through mb_lstm_*_many); results to host. */
static void run_on(mb_device *dev, const lcase *c, int ck, int training, uint64_t step, int two, const float *pv,
                   size_t np, const float *x, const float *r1, const float *r2, float **o, size_t *n) {
    mb_params *p;
    mb_lstm *l[2] = {NULL, NULL};
    uint64_t *sd = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, sizeof *sd, (void **)&sd));
    tu_ok(mb_copy(dev, 0, sd, &step, sizeof step));
    tu_ok(mb_params_create(&p, dev));
    for (int i = 0; i < 1 + two; i++) {
        mb_lstm_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.input_size = c->F; cfg.hidden_size = c->H; cfg.layers = c->L; cfg.checkpoint = ck;
        cfg.max_steps = c->T; cfg.max_batch = c->B; cfg.stream = i;
        cfg.dropout = c->p; cfg.dropout_seed = c->seed + 100 * (uint64_t)i; cfg.dropout_step = sd;
        cfg.prefix = i ? "b." : "a.";
        tu_ok(mb_lstm_create(&l[i], p, &cfg));
        mb_lstm_set_training(l[i], training);
    }
    tu_ok(mb_params_finalize(p));
    if (mb_device_backend(dev) == MB_CUDA) printf("recurrence: %s\n", mb_lstm_fused_blocks(l[0]) ? "fused" : "per-step gemms");
    size_t bt = (size_t)c->B * (size_t)c->T;
    int nt = mb_params_num_tensors(p), nt1 = nt / (1 + two); /* the first LSTM's tensors: one LSTM's layout */
    for (int t = 0; t < nt; t++) {
        const mb_param_info *in = mb_params_info(p, t);
        tu_ok(mb_copy(dev, 0, mb_params_data(p) + in->offset, pv + mb_params_info(p, t % nt1)->offset,
                      in->count * sizeof(float)));
    }
    n[R_OUT] = bt * (size_t)c->H; n[R_HL] = (size_t)(c->B * c->H); n[R_GRAD] = np; n[R_DX] = bt * (size_t)c->F;
    float *dxin = up(dev, x, n[R_DX]), *d1 = up(dev, r1, n[R_OUT]), *d2 = up(dev, r2, n[R_HL]), *d[R_N];
    for (int k = 0; k < R_N; k++)
        if (k != R_GRAD) tu_ok(mb_alloc(dev, MB_MEM_DEVICE, (1 + two) * n[k] * sizeof(float), (void **)&d[k]));
    d[R_GRAD] = mb_params_grad(p);
    mb_lstm_call calls[2];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < 1 + two; i++) {
        calls[i].lstm = l[i]; calls[i].x = dxin; calls[i].B = c->B; calls[i].T = c->T;
        calls[i].out_seq = d[R_OUT] + i * n[R_OUT]; calls[i].h_last = d[R_HL] + i * n[R_HL];
        calls[i].dout_seq = d1; calls[i].dh_last = d2; calls[i].dx = d[R_DX] + i * n[R_DX];
    }
    tu_ok(mb_lstm_forward_many(calls, 1 + two));
    tu_ok(mb_lstm_backward_many(calls, 1 + two));
    for (int k = 0; k < R_N; k++) {
        o[k] = tu_alloc_f32(n[k]);
        down(dev, o[k], d[k], n[k] * sizeof(float)); /* the first LSTM's */
        if (k != R_GRAD) mb_free(dev, d[k]);
    }
    mb_free(dev, dxin); mb_free(dev, d1); mb_free(dev, d2); mb_free(dev, sd);
    mb_lstm_destroy(l[0]); mb_lstm_destroy(l[1]);
    mb_params_destroy(p);
}

static void test_cuda_lstm_dropout_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    for (int rep = 0; rep < 3; rep++) {
        lcase c = {tu_int(1, 12), tu_int(2, 24), tu_int(1, 12), tu_int(4, 40), tu_int(2, 3), tu_uniform(0.1f, 0.6f),
                   tu_next()};
        /* per rep: full storage (the fused recurrence where it runs), checkpointed, two at once */
        int ck = rep == 1 ? 2 : -1, two = rep == 2;
        uint64_t step = tu_next() >> 4;
        size_t np = 0, n[R_N];
        {
            mb_params *p;
            mb_lstm *l;
            mb_lstm_config cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.input_size = c.F; cfg.hidden_size = c.H; cfg.layers = c.L; cfg.max_steps = 1; cfg.max_batch = 1;
            tu_ok(mb_params_create(&p, cpu));
            tu_ok(mb_lstm_create(&l, p, &cfg));
            tu_ok(mb_params_finalize(p));
            np = mb_params_total(p);
            mb_lstm_destroy(l); mb_params_destroy(p);
        }
        size_t bt = (size_t)c.B * (size_t)c.T;
        float *pv = tu_alloc_f32(np), *x = tu_alloc_f32(bt * (size_t)c.F), *r1 = tu_alloc_f32(bt * (size_t)c.H);
        float *r2 = tu_alloc_f32((size_t)(c.B * c.H));
        tu_fill(pv, np, -0.3f, 0.3f); tu_fill(x, bt * (size_t)c.F, -1, 1);
        tu_fill(r1, bt * (size_t)c.H, -1, 1); tu_fill(r2, (size_t)(c.B * c.H), -1, 1);
        float *a[R_N], *b[R_N], *e[R_N], *z[R_N];
        run_on(cpu, &c, ck, 1, step, 0, pv, np, x, r1, r2, a, n);
        run_on(gpu, &c, ck, 1, step, two, pv, np, x, r1, r2, b, n);
        run_on(gpu, &c, ck, 0, step, 0, pv, np, x, r1, r2, e, n); /* evaluation */
        lcase c0 = c;
        c0.p = 0.0f;
        run_on(gpu, &c0, ck, 1, step, 0, pv, np, x, r1, r2, z, n); /* no dropout */
        for (int k = 0; k < R_N; k++) {
            double err = tu_rel_norm_err(b[k], a[k], n[k]);
            printf("B=%d T=%d F=%d H=%d L=%d p=%.3f ck=%d two=%d %s: rel err %.3g\n", c.B, c.T, c.F, c.H, c.L,
                   (double)c.p, ck, two, rnames[k], err);
            if (!(err < 1e-4)) fail_msg("%s: relative norm error %g >= 1e-4 (another mask?)", rnames[k], err);
            assert_memory_equal(e[k], z[k], n[k] * sizeof(float));
            free(a[k]); free(b[k]); free(e[k]); free(z[k]);
        }
        free(pv); free(x); free(r1); free(r2);
    }
    tu_device_close(cpu);
    tu_device_close(gpu);
}

// ---- the multi-timeframe model ----

static mtf_spec small_spec(void) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = 2; s.layers = 2; s.F = 3; s.K = 2; s.hidden_size = 8; s.head = 6;
    s.seg_len[0] = 6; s.seg_len[1] = 4; s.T = 10;
    return s;
}

static void build(mtf_model *m, mb_device *dev, float p, int64_t B) {
    mtf_spec s = small_spec();
    mtf_config c;
    memset(&c, 0, sizeof c);
    c.maxB = B; c.train = 1; c.checkpoint_k = -1; c.dropout = p; c.dropout_seed = 4242;
    tu_ok(mtf_model_build(m, dev, &s, &c));
    tu_ok(mb_params_init(m->params, 3));
}

typedef struct step_args { mtf_model *m; const float *x; int64_t B; } step_args;
static mb_result train_step(void *u) { /* forward (advances the step), backward from dpred */
    step_args *a = (step_args *)u;
    const float *pred;
    MB_TRY(mtf_model_forward(a->m, a->x, a->B, &pred));
    return mtf_model_backward(a->m, a->B);
}

static void test_cuda_mtf_dropout(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mtf_device_open(&cpu, MB_CPU, 0));
    int64_t B = tu_int(2, 9);
    mtf_model mc, mg;
    build(&mc, cpu, 0.3f, B);
    build(&mg, gpu, 0.3f, B);
    const mtf_spec *s = &mc.spec;
    size_t nx = (size_t)(B * s->T * s->F), nk = (size_t)(B * s->K), nf = (size_t)(B * s->nseg * s->hidden_size);
    size_t np = mb_params_total(mc.params);
    float *x = tu_alloc_f32(nx), *dp = tu_alloc_f32(nk), *hp = tu_alloc_f32(nk), *hf = tu_alloc_f32(nf);
    float *hg = tu_alloc_f32(np), *e1 = tu_alloc_f32(nk), *e2 = tu_alloc_f32(nk), *eg = tu_alloc_f32(np);
    tu_fill(x, nx, -1, 1);
    tu_fill(dp, nk, -1, 1);
    float *xg = up(gpu, x, nx);
    memcpy(mc.dpred, dp, nk * sizeof(float));
    tu_ok(mb_copy(gpu, 0, mg.dpred, dp, nk * sizeof(float)));
    step_args ac = {&mc, x, B}, ag = {&mg, xg, B};
    tu_ok(train_step(&ac));
    tu_ok(train_step(&ag));
    down(gpu, hp, mg.pred, nk * sizeof(float));
    down(gpu, hf, mg.fused_drop, nf * sizeof(float));
    double err = tu_rel_norm_err(hp, mc.pred, nk);
    printf("B=%lld pred rel err %.3g\n", (long long)B, err);
    assert_true(err < 1e-4);
    for (size_t i = 0; i < nf; i++) /* the head's mask: the same elements dropped */
        if ((hf[i] == 0.0f) != (mc.fused_drop[i] == 0.0f)) fail_msg("head element %zu: masks differ", i);
    down(gpu, hg, mb_params_grad(mg.params), np * sizeof(float));
    err = tu_rel_norm_err(hg, mb_params_grad(mc.params), np);
    printf("grads rel err %.3g\n", err);
    assert_true(err < 1e-4);
    /* the step captured once, replayed: the eager steps' bits, a new mask each time */
    tu_ok(train_step(&ag)); /* eager step 2 */
    down(gpu, e1, mg.pred, nk * sizeof(float));
    tu_ok(train_step(&ag)); /* eager step 3 */
    down(gpu, e2, mg.pred, nk * sizeof(float));
    down(gpu, eg, mb_params_grad(mg.params), np * sizeof(float)); /* grads summed over 3 steps */
    assert_false(memcmp(e1, e2, nk * sizeof(float)) == 0);
    uint64_t one = 1, got = 0;
    tu_ok(mb_copy(gpu, 0, mg.drop_step, &one, sizeof one)); /* back to after step 1 */
    tu_ok(mb_copy(gpu, 0, mb_params_grad(mg.params), hg, np * sizeof(float)));
    mb_graph *gr = NULL;
    tu_ok(mb_graph_run(&gr, gpu, MB_STREAM_COMPUTE, train_step, &ag)); /* captures, launches: step 2 */
    assert_non_null(gr);
    down(gpu, hp, mg.pred, nk * sizeof(float));
    assert_memory_equal(hp, e1, nk * sizeof(float));
    tu_ok(mb_graph_run(&gr, gpu, MB_STREAM_COMPUTE, train_step, &ag)); /* launches: step 3 */
    down(gpu, hp, mg.pred, nk * sizeof(float));
    assert_memory_equal(hp, e2, nk * sizeof(float));
    down(gpu, hg, mb_params_grad(mg.params), np * sizeof(float));
    assert_memory_equal(hg, eg, np * sizeof(float));
    down(gpu, &got, mg.drop_step, sizeof got);
    assert_true(got == 3);
    mb_graph_destroy(gr);
    mtf_model_set_training(&mg, 0); /* evaluation: the counter stays */
    tu_ok(train_step(&ag));
    down(gpu, &got, mg.drop_step, sizeof got);
    assert_true(got == 3);
    mb_free(gpu, xg);
    free(x); free(dp); free(hp); free(hf); free(hg); free(e1); free(e2); free(eg);
    mtf_model_destroy(&mc);
    mtf_model_destroy(&mg);
    tu_device_close(cpu);
    tu_device_close(gpu);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_dropout_dev_graph),
        tu_cuda_test(test_cuda_lstm_dropout_matches_cpu),
        tu_cuda_test(test_cuda_mtf_dropout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
