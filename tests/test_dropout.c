/* Dropout inside the captured step (issue 43): the mask of mb_dropout_*_dev against its formula
 * recomputed here, the device step counter (mb_dropout_step_advance); nn.LSTM's dropout between
 * layers against the layers run one by one with the mask applied between them (forward and
 * backward, f32 and bf16, bitwise), checkpointed = full storage, mb_lstm_forward_many = single
 * calls, evaluation mode = no dropout; the multi-timeframe model's dropout (the head's mask, the
 * switch, the counter in a checkpoint). CPU backend: device memory is host memory. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/multitf.h"
#include <unistd.h>

/* The documented mask, recomputed: element i kept iff uniform(seed, step, i) >= p, scaled 1/(1-p). */
static float ref_drop(float p, uint64_t seed, uint64_t step, size_t i, float x) {
    return mb_rng_uniform(seed, step, (uint64_t)i) >= p ? x * (1.0f / (1.0f - p)) : 0.0f;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void test_dropout_dev_mask(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    size_t n = (size_t)tu_int(1, 5000);
    float p = tu_uniform(0.05f, 0.9f);
    uint64_t seed = tu_next(), step = tu_next() >> 1, *step_dev = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, sizeof *step_dev, (void **)&step_dev));
    *step_dev = step;
    float *x = tu_alloc_f32(n), *y = tu_alloc_f32(n), *y2 = tu_alloc_f32(n), *r = tu_alloc_f32(n);
    tu_fill(x, n, 0.5f, 2.0f); /* never zero: a kept element is never 0 */
    tu_ok(mb_dropout_forward_dev(dev, 0, p, seed, step_dev, x, y, n));
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        r[i] = ref_drop(p, seed, step, i, x[i]);
        kept += y[i] != 0.0f;
    }
    assert_true(same_bits(y, r, n));                                   /* the formula, bit for bit */
    tu_ok(mb_dropout_forward(dev, 0, p, seed, step, x, y2, n));        /* = the host-step call */
    assert_true(same_bits(y, y2, n));
    double q = 1.0 - p, sd = sqrt((double)n * q * (1.0 - q));           /* keep rate: within 6 sigma */
    assert_true(fabs((double)kept - (double)n * q) <= 6.0 * sd + 1.0);
    tu_ok(mb_dropout_forward_dev(dev, 0, p, seed, step_dev, x, y2, n)); /* a repeat: the same mask */
    assert_true(same_bits(y, y2, n));
    tu_ok(mb_dropout_backward_dev(dev, 0, p, seed, step_dev, x, y2, n)); /* the gradient: the same mask */
    assert_true(same_bits(y, y2, n));
    tu_ok(mb_dropout_step_advance(dev, 0, step_dev));
    assert_true(*step_dev == step + 1);
    tu_ok(mb_dropout_forward_dev(dev, 0, p, seed, step_dev, x, y2, n)); /* the next step: another mask */
    for (size_t i = 0; i < n; i++) r[i] = ref_drop(p, seed, step + 1, i, x[i]);
    assert_true(same_bits(y2, r, n));
    if (n > 64) assert_false(same_bits(y, y2, n));
    tu_ok(mb_dropout_forward_dev(dev, 0, 0.0f, seed, step_dev, x, y2, n)); /* p = 0: identity */
    assert_true(same_bits(x, y2, n));
    tu_assert_error(mb_dropout_forward_dev(dev, 0, p, seed, NULL, x, y, n), MB_ERR_INVALID_ARG, "NULL step_dev");
    tu_assert_error(mb_dropout_backward_dev(dev, 0, 1.0f, seed, step_dev, x, y, n), MB_ERR_INVALID_ARG, "[0, 1)");
    tu_assert_error(mb_dropout_step_advance(dev, 0, NULL), MB_ERR_INVALID_ARG, "NULL step_dev");
    tu_assert_error(mb_dropout_step_advance(dev, 99, step_dev), MB_ERR_INVALID_ARG, "stream");
    mb_free(dev, step_dev);
    free(x); free(y); free(y2); free(r);
    tu_close_checked(dev);
}

/* Every CPU kernel variant (the blocks of counters are compiled per ISA) gives the formula's bits,
 * in place too. */
static void test_dropout_cpu_kernels(void **state) {
    (void)state;
    mb_cpu_kernel ks[] = {MB_CPU_KERNEL_AVX512, MB_CPU_KERNEL_AVX2, MB_CPU_KERNEL_C};
    size_t n = (size_t)tu_int(1, 3000);
    float p = tu_uniform(0.01f, 0.95f);
    uint64_t seed = tu_next(), step = tu_next();
    float *x = tu_alloc_f32(n), *y = tu_alloc_f32(n), *r = tu_alloc_f32(n);
    tu_fill(x, n, -2.0f, 2.0f);
    for (size_t i = 0; i < n; i++) r[i] = ref_drop(p, seed, step, i, x[i]);
    for (int k = 0; k < 3; k++) {
        mb_device_config dc;
        memset(&dc, 0, sizeof dc);
        dc.cpu_kernel = ks[k];
        mb_device *dev = NULL;
        if (mb_device_open(&dev, &dc) != MB_OK) { printf("cpu kernel %d: not on this CPU\n", (int)ks[k]); continue; }
        tu_ok(mb_dropout_forward_dev(dev, 0, p, seed, &step, x, y, n));
        if (!same_bits(y, r, n)) fail_msg("cpu kernel %d: not the formula's mask", (int)ks[k]);
        memcpy(y, x, n * sizeof(float));
        tu_ok(mb_dropout_backward_dev(dev, 0, p, seed, &step, y, y, n)); /* in place */
        if (!same_bits(y, r, n)) fail_msg("cpu kernel %d: in place differs", (int)ks[k]);
        tu_close_checked(dev);
    }
    free(x); free(y); free(r);
}

// ---- the LSTM ----

typedef struct lcase { int B, T, F, H, L, G; float p; uint64_t seed; mb_dtype prec; } lcase;
typedef struct lrun { float *out, *hl, *grad, *dx; } lrun; /* out (B,T,H), h_last (B,H), grads, dx (B,T,F) */
typedef struct linputs { float *pv, *x, *r1, *r2; size_t np; } linputs;

static mb_lstm_config lcfg(const lcase *c, int layers, int64_t in, int ck, const uint64_t *step) {
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = in; cfg.hidden_size = c->H; cfg.layers = layers; cfg.checkpoint = ck;
    cfg.max_steps = c->T; cfg.max_batch = c->B; cfg.grad_block = c->G; cfg.precision = c->prec;
    if (layers > 1) { cfg.dropout = c->p; cfg.dropout_seed = c->seed; cfg.dropout_step = step; }
    return cfg;
}

static lcase random_case(void) {
    lcase c;
    c.B = tu_int(1, 9); c.T = tu_int(1, 13); c.F = tu_int(1, 7); c.H = tu_int(1, 12); c.L = tu_int(2, 4);
    c.G = tu_int(1, 5); c.p = tu_uniform(0.1f, 0.7f); c.seed = tu_next(); c.prec = MB_F32;
    printf("case B=%d T=%d F=%d H=%d L=%d G=%d p=%g\n", c.B, c.T, c.F, c.H, c.L, c.G, (double)c.p);
    return c;
}

static linputs make_inputs(mb_device *dev, const lcase *c) {
    linputs in;
    mb_params *p;
    mb_lstm *l;
    uint64_t step = 0;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = lcfg(c, c->L, c->F, -1, &step);
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, tu_next()));
    in.np = mb_params_total(p);
    in.pv = tu_alloc_f32(in.np);
    tu_ok(mb_params_get(p, in.pv));
    mb_lstm_destroy(l); mb_params_destroy(p);
    size_t bt = (size_t)c->B * (size_t)c->T;
    in.x = tu_alloc_f32(bt * (size_t)c->F); in.r1 = tu_alloc_f32(bt * (size_t)c->H); in.r2 = tu_alloc_f32((size_t)(c->B * c->H));
    tu_fill(in.x, bt * (size_t)c->F, -1, 1); tu_fill(in.r1, bt * (size_t)c->H, -1, 1); tu_fill(in.r2, (size_t)(c->B * c->H), -1, 1);
    return in;
}

static void free_inputs(linputs *in) { free(in->pv); free(in->x); free(in->r1); free(in->r2); }
static void free_run(lrun *r) { free(r->out); free(r->hl); free(r->grad); free(r->dx); }

static lrun alloc_run(const lcase *c, size_t np) {
    lrun r;
    size_t bt = (size_t)c->B * (size_t)c->T;
    r.out = tu_alloc_f32(bt * (size_t)c->H); r.hl = tu_alloc_f32((size_t)(c->B * c->H));
    r.grad = tu_alloc_f32(np); r.dx = tu_alloc_f32(bt * (size_t)c->F);
    return r;
}

/* The L-layer LSTM with dropout: forward (out_seq, h_last) and backward (dout_seq r1, dh_last r2),
 * checkpoint ck, training mode as given, masks at *step. many: through mb_lstm_*_many beside
 * a second LSTM (another seed: its masks must not disturb these). */
static lrun run_multi(mb_device *dev, const lcase *c, const linputs *in, int ck, int training, uint64_t *step,
                      int many) {
    mb_params *p;
    mb_lstm *l, *l2 = NULL;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = lcfg(c, c->L, c->F, ck, step), cfg2 = cfg;
    cfg2.prefix = "other."; cfg2.dropout_seed = c->seed + 1000;
    tu_ok(mb_lstm_create(&l, p, &cfg));
    if (many) tu_ok(mb_lstm_create(&l2, p, &cfg2));
    tu_ok(mb_params_finalize(p));
    float *pv = tu_alloc_f32(mb_params_total(p));
    memcpy(pv, in->pv, in->np * sizeof(float));
    if (many) memcpy(pv + in->np, in->pv, (mb_params_total(p) - in->np) * sizeof(float));
    tu_ok(mb_params_set(p, pv));
    mb_lstm_set_training(l, training);
    lrun r = alloc_run(c, in->np);
    if (!many) {
        tu_ok(mb_lstm_forward(l, in->x, c->B, c->T, NULL, NULL, r.out, r.hl));
        tu_ok(mb_lstm_backward(l, in->r2, in->r1, r.dx, NULL, NULL));
    } else {
        lrun r2 = alloc_run(c, in->np);
        mb_lstm_call calls[2];
        memset(calls, 0, sizeof calls);
        calls[0].lstm = l2; calls[1].lstm = l;
        for (int i = 0; i < 2; i++) {
            lrun *o = i ? &r : &r2;
            calls[i].x = in->x; calls[i].B = c->B; calls[i].T = c->T; calls[i].out_seq = o->out; calls[i].h_last = o->hl;
            calls[i].dh_last = in->r2; calls[i].dout_seq = in->r1; calls[i].dx = o->dx;
        }
        tu_ok(mb_lstm_forward_many(calls, 2));
        tu_ok(mb_lstm_backward_many(calls, 2));
        free_run(&r2);
    }
    memcpy(r.grad, mb_params_grad(p), in->np * sizeof(float));
    free(pv);
    mb_lstm_destroy(l); mb_lstm_destroy(l2);
    mb_params_destroy(p);
    return r;
}

/* Element (b, t, j) of (B, T, H) through layer k's mask: key seed + k, index (t B + b) H + j. */
static void mask_seq(const lcase *c, int k, uint64_t step, float *v) {
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int j = 0; j < c->H; j++) {
                float *e = v + ((size_t)b * c->T + t) * c->H + j;
                *e = ref_drop(c->p, c->seed + (uint64_t)k, step, ((size_t)t * c->B + b) * c->H + j, *e);
            }
}

/* The reference: L one-layer LSTMs, layer k's weights copied in, run one after the other with
 * the documented mask applied (here, on the host) to each output sequence but the top's; the
 * backward the other way, the same mask on each input gradient. */
static lrun run_ref(mb_device *dev, const lcase *c, const linputs *in, uint64_t step) {
    mb_params *pm, *p[8];
    mb_lstm *lm, *l[8];
    uint64_t unused = 0;
    size_t bt = (size_t)c->B * (size_t)c->T, seq = bt * (size_t)c->H;
    tu_ok(mb_params_create(&pm, dev)); /* the multi-layer names, for the layout of the gradients */
    mb_lstm_config cm = lcfg(c, c->L, c->F, -1, &unused);
    tu_ok(mb_lstm_create(&lm, pm, &cm));
    tu_ok(mb_params_finalize(pm));
    lrun r = alloc_run(c, in->np);
    float *outs[8] = {0}, *dins[8] = {0};
    for (int k = 0; k < c->L; k++) {
        tu_ok(mb_params_create(&p[k], dev));
        mb_lstm_config cfg = lcfg(c, 1, k ? c->H : c->F, -1, NULL);
        tu_ok(mb_lstm_create(&l[k], p[k], &cfg));
        tu_ok(mb_params_finalize(p[k]));
        const char *names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
        for (int w = 0; w < 4; w++) {
            char a[64], b[64];
            snprintf(a, sizeof a, "%s_l%d", names[w], k);
            snprintf(b, sizeof b, "%s_l0", names[w]);
            const mb_param_info *im = mb_params_info(pm, mb_params_find(pm, a));
            int ir = mb_params_find(p[k], b);
            assert_true(ir >= 0 && mb_params_info(p[k], ir)->count == im->count);
            memcpy(mb_params_tensor(p[k], ir), in->pv + im->offset, im->count * sizeof(float));
        }
        outs[k] = tu_alloc_f32(seq);
        dins[k] = tu_alloc_f32(bt * (size_t)(k ? c->H : c->F));
    }
    float *xin[8] = {0}; /* each layer's input, kept until its backward */
    for (int k = 0; k < c->L; k++) { /* forward, masks between */
        const float *x = in->x;
        if (k) {
            xin[k] = tu_alloc_f32(seq);
            memcpy(xin[k], outs[k - 1], seq * sizeof(float));
            mask_seq(c, k - 1, step, xin[k]);
            x = xin[k];
        }
        tu_ok(mb_lstm_forward(l[k], x, c->B, c->T, NULL, NULL, outs[k], k == c->L - 1 ? r.hl : NULL));
    }
    memcpy(r.out, outs[c->L - 1], seq * sizeof(float));
    for (int k = c->L - 1; k >= 0; k--) { /* backward: the input gradient through the mask */
        const float *dout = in->r1;
        if (k < c->L - 1) { mask_seq(c, k, step, dins[k + 1]); dout = dins[k + 1]; }
        tu_ok(mb_lstm_backward(l[k], k == c->L - 1 ? in->r2 : NULL, dout, dins[k], NULL, NULL));
    }
    memcpy(r.dx, dins[0], bt * (size_t)c->F * sizeof(float));
    memset(r.grad, 0, in->np * sizeof(float));
    for (int k = 0; k < c->L; k++) {
        const char *names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
        for (int w = 0; w < 4; w++) {
            char a[64], b[64];
            snprintf(a, sizeof a, "%s_l%d", names[w], k);
            snprintf(b, sizeof b, "%s_l0", names[w]);
            const mb_param_info *im = mb_params_info(pm, mb_params_find(pm, a));
            memcpy(r.grad + im->offset, mb_params_tensor_grad(p[k], mb_params_find(p[k], b)), im->count * sizeof(float));
        }
        mb_lstm_destroy(l[k]); mb_params_destroy(p[k]);
        free(outs[k]); free(dins[k]); free(xin[k]);
    }
    mb_lstm_destroy(lm); mb_params_destroy(pm);
    return r;
}

static void assert_same_run(const lcase *c, const lrun *a, const lrun *b, size_t np, const char *what) {
    size_t bt = (size_t)c->B * (size_t)c->T;
    if (!same_bits(a->out, b->out, bt * (size_t)c->H)) fail_msg("%s: out_seq differs", what);
    if (!same_bits(a->hl, b->hl, (size_t)(c->B * c->H))) fail_msg("%s: h_last differs", what);
    if (!same_bits(a->dx, b->dx, bt * (size_t)c->F)) fail_msg("%s: dx differs", what);
    for (size_t i = 0; i < np; i++)
        if (memcmp(&a->grad[i], &b->grad[i], sizeof(float)))
            fail_msg("%s: the weight gradients differ at %zu: %.9g vs %.9g", what, i, (double)a->grad[i], (double)b->grad[i]);
}

/* Against the one-layer-at-a-time reference, bitwise; f32 and bf16 operands. */
static void test_lstm_dropout_reference(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    for (int rep = 0; rep < 6; rep++) {
        lcase c = random_case();
        c.prec = rep % 3 == 2 ? MB_BF16 : MB_F32;
        linputs in = make_inputs(dev, &c);
        uint64_t step = tu_next() >> 8;
        lrun ref = run_ref(dev, &c, &in, step);
        for (int ck = -1; ck <= 2; ck += 3) { /* full storage and every 2 steps: the same bits */
            uint64_t s = step;
            lrun got = run_multi(dev, &c, &in, ck, 1, &s, 0);
            assert_true(s == step); /* the LSTM reads its step, never advances it */
            assert_same_run(&c, &got, &ref, in.np, ck < 0 ? "full storage vs reference" : "checkpoint 2 vs reference");
            free_run(&got);
        }
        free_run(&ref);
        free_inputs(&in);
    }
    tu_close_checked(dev);
}

/* A repeat at the same step gives the same bits, the next step another mask; evaluation mode is
 * the LSTM without dropout; mb_lstm_*_many equal the single calls. */
static void test_lstm_dropout_step_eval_many(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    lcase c = random_case();
    c.B = tu_int(3, 9); c.T = tu_int(4, 13); c.H = tu_int(4, 12); /* enough elements that masks differ */
    linputs in = make_inputs(dev, &c);
    uint64_t step = 7, s2 = 7, s3 = 8;
    lrun a = run_multi(dev, &c, &in, -1, 1, &step, 0), b = run_multi(dev, &c, &in, -1, 1, &s2, 0);
    assert_same_run(&c, &a, &b, in.np, "a repeat");
    lrun d = run_multi(dev, &c, &in, -1, 1, &s3, 0);
    assert_false(same_bits(a.out, d.out, (size_t)(c.B * c.T * c.H)));
    lrun m = run_multi(dev, &c, &in, 2, 1, &s2, 1);
    assert_same_run(&c, &a, &m, in.np, "mb_lstm_*_many vs one call");
    lrun e = run_multi(dev, &c, &in, -1, 0, &step, 0); /* evaluation mode */
    lcase c0 = c;
    c0.p = 0.0f; /* no dropout at all */
    lrun z = run_multi(dev, &c0, &in, -1, 1, &step, 0);
    assert_same_run(&c, &e, &z, in.np, "evaluation mode vs no dropout");
    assert_false(same_bits(a.out, e.out, (size_t)(c.B * c.T * c.H)));
    free_run(&a); free_run(&b); free_run(&d); free_run(&m); free_run(&e); free_run(&z);
    free_inputs(&in);
    tu_close_checked(dev);
}

static void test_lstm_dropout_bad_config(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p;
    mb_lstm *l = NULL;
    uint64_t step = 0;
    tu_ok(mb_params_create(&p, dev));
    lcase c = {2, 3, 2, 4, 2, 0, 0.5f, 1, MB_F32};
    mb_lstm_config cfg = lcfg(&c, 2, 2, -1, NULL);
    tu_assert_error(mb_lstm_create(&l, p, &cfg), MB_ERR_INVALID_ARG, "needs dropout_step");
    float bad[] = {1.0f, -0.1f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        cfg = lcfg(&c, 2, 2, -1, &step);
        cfg.dropout = bad[i];
        tu_assert_error(mb_lstm_create(&l, p, &cfg), MB_ERR_INVALID_ARG, "dropout=");
    }
    assert_null(l);
    size_t f0 = 0, f1 = 0, c1 = 0; /* the dropped inputs' memory: (L-1) (T, B, H) floats */
    cfg = lcfg(&c, 2, 2, -1, &step);
    cfg.dropout = 0.0f;
    tu_ok(mb_lstm_memory(&cfg, 2, 3, &f0, NULL));
    cfg.dropout = 0.5f;
    tu_ok(mb_lstm_memory(&cfg, 2, 3, &f1, &c1));
    assert_true(f1 == f0 + 3 * 2 * 4 * sizeof(float) && c1 == f1);
    mb_params_destroy(p);
    tu_close_checked(dev);
}

// ---- the multi-timeframe model ----

static mtf_spec small_spec(void) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = 2; s.layers = 2; s.F = 3; s.K = 2; s.hidden_size = 5; s.head = 6;
    s.seg_len[0] = 4; s.seg_len[1] = 3; s.T = 7;
    return s;
}

static void build(mtf_model *m, mb_device *dev, float p, int64_t B) {
    mtf_spec s = small_spec();
    mtf_config c;
    memset(&c, 0, sizeof c);
    c.maxB = B; c.train = 1; c.checkpoint_k = -1; c.dropout = p; c.dropout_seed = 99;
    tu_ok(mtf_model_build(m, dev, &s, &c));
    tu_ok(mb_params_init(m->params, 5));
}

/* The head's mask on the concatenated states, the switch, eval = the model without dropout, the
 * gradient through the same mask, and the counter through a checkpoint. */
static void test_mtf_dropout(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mtf_device_open(&dev, MB_CPU, 0));
    int64_t B = tu_int(2, 6);
    mtf_model m, z;
    build(&m, dev, 0.4f, B);
    build(&z, dev, 0.0f, B);
    const mtf_spec *s = &m.spec;
    size_t nx = (size_t)(B * s->T * s->F), nk = (size_t)(B * s->K), nf = (size_t)(B * s->nseg * s->hidden_size);
    float *x = tu_alloc_f32(nx), *p1 = tu_alloc_f32(nk), *p2 = tu_alloc_f32(nk), *pz = tu_alloc_f32(nk);
    tu_fill(x, nx, -1, 1);
    const float *pred;
    assert_true(*m.drop_step == 0);
    tu_ok(mtf_model_forward(&m, x, B, &pred)); /* training: step 1 */
    memcpy(p1, pred, nk * sizeof(float));
    assert_true(*m.drop_step == 1);
    for (size_t i = 0; i < nf; i++) /* the head's mask: key dropout_seed, this forward's step */
        assert_true(m.fused_drop[i] == ref_drop(0.4f, 99, 1, i, m.fused[i]));
    tu_fill(m.dpred, nk, -1, 1);
    tu_ok(mb_params_zero_grad(m.params));
    tu_ok(mtf_model_backward(&m, B));
    const float *w1 = mb_params_tensor(m.params, m.fc1.weight); /* (head, S H) */
    for (int64_t b = 0; b < B; b++) /* dh = mask * (da1 W1): exactly 0 where dropped */
        for (int64_t col = 0; col < s->nseg * s->hidden_size; col++) {
            double d = 0;
            for (int64_t u = 0; u < s->head; u++) d += (double)m.da1[b * s->head + u] * w1[u * s->nseg * s->hidden_size + col];
            size_t i = (size_t)(b * s->nseg * s->hidden_size + col);
            float got = m.dh[col / s->hidden_size][b * s->hidden_size + col % s->hidden_size];
            if (mb_rng_uniform(99, 1, i) < 0.4f) assert_true(got == 0.0f);
            else assert_true(fabs(got - d / 0.6) <= 1e-5 * (1 + fabs(d)));
        }
    tu_ok(mtf_model_forward(&m, x, B, &pred)); /* step 2: other masks */
    memcpy(p2, pred, nk * sizeof(float));
    assert_true(*m.drop_step == 2);
    assert_false(same_bits(p1, p2, nk));
    mtf_model_set_training(&m, 0); /* evaluation: the model without dropout, the counter untouched */
    tu_ok(mtf_model_forward(&m, x, B, &pred));
    memcpy(p2, pred, nk * sizeof(float));
    tu_ok(mtf_model_forward(&z, x, B, &pred));
    memcpy(pz, pred, nk * sizeof(float));
    assert_true(same_bits(p2, pz, nk));
    assert_true(*m.drop_step == 2);
    assert_null(z.drop_step); /* p = 0: nothing allocated, nothing advanced */
    const float *xs[2] = {x, x};
    int64_t n1[2] = {1, 1};
    mtf_model_set_training(&m, 1);
    tu_assert_error(mtf_model_step(&m, xs, n1, &pred), MB_ERR_STATE, "evaluation mode");
    char dir[] = "/tmp/mb_dropout_XXXXXX"; /* the counter through a checkpoint: a resume redraws step 1 */
    assert_non_null(mkdtemp(dir));
    const char *path = tu_path(dir, "ck");
    mb_ckpt_writer *w;
    mb_ckpt_reader *rd;
    *m.drop_step = 0;
    tu_ok(mb_ckpt_writer_create(&w, dev));
    tu_ok(mtf_model_save_dropout(w, &m));
    tu_ok(mb_ckpt_write(w, path));
    mb_ckpt_writer_destroy(w);
    *m.drop_step = 12345;
    tu_ok(mb_ckpt_open(&rd, dev, path));
    tu_ok(mtf_model_load_dropout(rd, &m));
    mb_ckpt_close(rd);
    assert_true(*m.drop_step == 0);
    tu_ok(mtf_model_forward(&m, x, B, &pred));
    assert_true(same_bits(pred, p1, nk));
    unlink(path);
    rmdir(dir);
    mtf_config bad;
    memset(&bad, 0, sizeof bad);
    bad.maxB = 1; bad.dropout = 1.0f;
    mtf_spec sp = small_spec();
    mtf_model bm;
    tu_assert_error(mtf_model_build(&bm, dev, &sp, &bad), MB_ERR_INVALID_ARG, "dropout 1 must be in [0, 1)");
    mtf_model_destroy(&bm);
    free(x); free(p1); free(p2); free(pz);
    mtf_model_destroy(&m);
    mtf_model_destroy(&z);
    tu_close_checked(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_dev_mask),
        cmocka_unit_test(test_dropout_cpu_kernels),
        cmocka_unit_test(test_lstm_dropout_reference),
        cmocka_unit_test(test_lstm_dropout_step_eval_many),
        cmocka_unit_test(test_lstm_dropout_bad_config),
        cmocka_unit_test(test_mtf_dropout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
