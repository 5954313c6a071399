/* lstm (CPU backend): forward against a double-precision reference, gradients against
 * finite differences of that reference (every parameter, the input, h0 and c0),
 * checkpointed vs full storage bitwise, carry-over, gradient accumulation, shared
 * params, memory query, bad input and allocation failure. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

typedef struct shape { int B, T, F, H, L; } shape;

/* ---- double reference: loss = sum(out * r1) + sum(h_last * r2) ---- */

static double sigm(double z) { return 1.0 / (1.0 + exp(-z)); }

/* p: flat params (double) with the layout of `params` under prefix ""; x (B,T,F);
 * h0/c0 (L,B,H) or NULL. Writes out (B,T,H) and hn/cn (L,B,H) when not NULL. */
static double ref_loss(mb_params *params, const shape *s, const double *p, const double *x, const double *h0,
                       const double *c0, const double *r1, const double *r2, double *out, double *hn, double *cn) {
    int B = s->B, T = s->T, H = s->H;
    double *in = (double *)calloc((size_t)B * T * (s->F > H ? s->F : H), sizeof(double));
    double *nxt = (double *)calloc((size_t)B * T * H, sizeof(double));
    double *h = (double *)calloc((size_t)H, sizeof(double)), *c = (double *)calloc((size_t)H, sizeof(double));
    double *z = (double *)calloc((size_t)4 * H, sizeof(double));
    memcpy(in, x, (size_t)B * T * s->F * sizeof(double));
    int width = s->F;
    double loss = 0;
    for (int k = 0; k < s->L; k++) {
        char nm[4][32];
        const double *w[4];
        snprintf(nm[0], 32, "weight_ih_l%d", k); snprintf(nm[1], 32, "weight_hh_l%d", k);
        snprintf(nm[2], 32, "bias_ih_l%d", k); snprintf(nm[3], 32, "bias_hh_l%d", k);
        for (int i = 0; i < 4; i++) w[i] = p + mb_params_info(params, mb_params_find(params, nm[i]))->offset;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < H; j++) {
                h[j] = h0 ? h0[((size_t)k * B + b) * H + j] : 0;
                c[j] = c0 ? c0[((size_t)k * B + b) * H + j] : 0;
            }
            for (int t = 0; t < T; t++) {
                const double *xt = in + ((size_t)b * T + t) * width;
                for (int r = 0; r < 4 * H; r++) {
                    double acc = w[2][r] + w[3][r];
                    for (int q = 0; q < width; q++) acc += w[0][(size_t)r * width + q] * xt[q];
                    for (int q = 0; q < H; q++) acc += w[1][(size_t)r * H + q] * h[q];
                    z[r] = acc;
                }
                for (int j = 0; j < H; j++) {
                    double ig = sigm(z[j]), fg = sigm(z[H + j]), gg = tanh(z[2 * H + j]), og = sigm(z[3 * H + j]);
                    c[j] = fg * c[j] + ig * gg;
                    h[j] = og * tanh(c[j]);
                    nxt[((size_t)b * T + t) * H + j] = h[j];
                }
            }
            for (int j = 0; j < H; j++) {
                if (hn) hn[((size_t)k * B + b) * H + j] = h[j];
                if (cn) cn[((size_t)k * B + b) * H + j] = c[j];
                if (k == s->L - 1) loss += h[j] * r2[(size_t)b * H + j];
            }
        }
        memcpy(in, nxt, (size_t)B * T * H * sizeof(double));
        width = H;
    }
    for (size_t i = 0; i < (size_t)B * T * H; i++) {
        loss += in[i] * r1[i];
        if (out) out[i] = in[i];
    }
    free(in); free(nxt); free(h); free(c); free(z);
    return loss;
}

static double *to_double(const float *x, size_t n) {
    double *d = (double *)calloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* The automatic checkpoint rule forced to checkpoint: a device whose memory query reports
 * 64 bytes free (its backend copied with another memory function; a test hook, nothing in
 * the library changes), so full storage does not fit a quarter of it and checkpoint = 0
 * takes the ceil(sqrt(T)) interval. CK_AUTO_TIGHT as a test's checkpoint asks for it. */
enum { CK_AUTO_TIGHT = -1000 }; /* not a checkpoint value: make_cfg gives 0 for it */
static mb_result tight_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    (void)dev;
    *total = (size_t)1 << 20;
    *free_bytes = 64;
    return MB_OK;
}
static mb__runtime_ops tight_rt;
static mb__backend tight_be;
static void make_tight(mb_device *dev) {
    tight_rt = *dev->be->rt;
    tight_rt.memory = tight_memory;
    tight_be = *dev->be;
    tight_be.rt = &tight_rt;
    dev->be = &tight_be;
}

static mb_lstm_config make_cfg(const shape *s, int checkpoint) {
    mb_lstm_config c;
    memset(&c, 0, sizeof c);
    c.input_size = s->F; c.hidden_size = s->H; c.layers = s->L;
    c.checkpoint = checkpoint == CK_AUTO_TIGHT ? 0 : checkpoint; c.max_steps = s->T; c.max_batch = s->B;
    return c;
}

/* Analytic gradients (f32) vs central differences of the double reference. */
static void gradcheck_one(const shape *s, int with_state, int checkpoint) {
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(s, checkpoint);
    cfg.grad_block = tu_int(0, 1) ? tu_int(1, 4) : 0;
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, tu_next()));
    size_t np = mb_params_total(p), nx = (size_t)s->B * s->T * s->F, no = (size_t)s->B * s->T * s->H;
    size_t ns = (size_t)s->L * s->B * s->H, nb = (size_t)s->B * s->H;
    float *x = tu_alloc_f32(nx), *h0 = tu_alloc_f32(ns), *c0 = tu_alloc_f32(ns), *r1 = tu_alloc_f32(no);
    float *r2 = tu_alloc_f32(nb), *out = tu_alloc_f32(no), *hl = tu_alloc_f32(nb), *dx = tu_alloc_f32(nx);
    float *dh0 = tu_alloc_f32(ns), *dc0 = tu_alloc_f32(ns), *pf = tu_alloc_f32(np), *hn = tu_alloc_f32(ns);
    float *cn = tu_alloc_f32(ns);
    tu_fill(x, nx, -1, 1); tu_fill(h0, ns, -0.5f, 0.5f); tu_fill(c0, ns, -0.5f, 0.5f);
    tu_fill(r1, no, -1, 1); tu_fill(r2, nb, -1, 1);
    tu_ok(mb_lstm_forward(l, x, s->B, s->T, with_state ? h0 : NULL, with_state ? c0 : NULL, out, hl));
    tu_ok(mb_lstm_final_state(l, hn, cn));
    tu_ok(mb_lstm_backward(l, r2, r1, dx, dh0, dc0));
    tu_ok(mb_params_get(p, pf));
    double *pd = to_double(pf, np), *xd = to_double(x, nx), *h0d = to_double(h0, ns), *c0d = to_double(c0, ns);
    double *r1d = to_double(r1, no), *r2d = to_double(r2, nb), *outd = (double *)calloc(no, sizeof(double));
    double *hnd = (double *)calloc(ns, sizeof(double)), *cnd = (double *)calloc(ns, sizeof(double));
    const double *H0 = with_state ? h0d : NULL, *C0 = with_state ? c0d : NULL;
    ref_loss(p, s, pd, xd, H0, C0, r1d, r2d, outd, hnd, cnd);
    float *of = tu_alloc_f32(no), *hnf = tu_alloc_f32(ns), *cnf = tu_alloc_f32(ns);
    for (size_t i = 0; i < no; i++) of[i] = (float)outd[i];
    for (size_t i = 0; i < ns; i++) { hnf[i] = (float)hnd[i]; cnf[i] = (float)cnd[i]; }
    tu_assert_close(out, of, no, 2e-6, 1e-5, "out_seq vs double reference");
    tu_assert_close(hn, hnf, ns, 2e-6, 1e-5, "h_n vs double reference");
    tu_assert_close(cn, cnf, ns, 2e-6, 1e-5, "c_n vs double reference");
    tu_assert_close(hl, hnf + (size_t)(s->L - 1) * nb, nb, 2e-6, 1e-5, "h_last vs double reference");
    /* finite differences of every parameter, input element and initial state */
    struct { double *v; size_t n; const float *got; const char *what; } sets[4] = {
        {pd, np, mb_params_grad(p), "params grad"}, {xd, nx, dx, "dx"}, {h0d, ns, dh0, "dh0"}, {c0d, ns, dc0, "dc0"}};
    const double eps = 1e-6;
    for (int set = 0; set < (with_state ? 4 : 2); set++) {
        float *num = tu_alloc_f32(sets[set].n);
        for (size_t i = 0; i < sets[set].n; i++) {
            double keep = sets[set].v[i];
            sets[set].v[i] = keep + eps;
            double lp = ref_loss(p, s, pd, xd, H0, C0, r1d, r2d, NULL, NULL, NULL);
            sets[set].v[i] = keep - eps;
            double lm = ref_loss(p, s, pd, xd, H0, C0, r1d, r2d, NULL, NULL, NULL);
            sets[set].v[i] = keep;
            num[i] = (float)((lp - lm) / (2 * eps));
        }
        tu_assert_close(sets[set].got, num, sets[set].n, 1e-4, 1e-3, sets[set].what);
        free(num);
    }
    if (!with_state) { /* without h0/c0 the initial-state gradients still come back */
        double *z = (double *)calloc(ns, sizeof(double));
        for (size_t i = 0; i < 4; i++) {
            double keep = z[i % ns];
            z[i % ns] = keep + eps;
            double lp = ref_loss(p, s, pd, xd, z, NULL, r1d, r2d, NULL, NULL, NULL);
            z[i % ns] = keep - eps;
            double lm = ref_loss(p, s, pd, xd, z, NULL, r1d, r2d, NULL, NULL, NULL);
            z[i % ns] = keep;
            float want = (float)((lp - lm) / (2 * eps));
            tu_assert_close(&dh0[i % ns], &want, 1, 1e-4, 1e-3, "dh0 from zeros");
        }
        free(z);
    }
    free(x); free(h0); free(c0); free(r1); free(r2); free(out); free(hl); free(dx); free(dh0); free(dc0);
    free(pf); free(hn); free(cn); free(pd); free(xd); free(h0d); free(c0d); free(r1d); free(r2d); free(outd);
    free(hnd); free(cnd); free(of); free(hnf); free(cnf);
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    mb_device_close(dev);
}

static void test_gradcheck_shapes(void **state) {
    (void)state;
    shape fixed[] = {{1, 1, 1, 1, 1}, {2, 5, 3, 4, 1}, {3, 4, 2, 3, 2}, {2, 6, 4, 2, 3}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        for (int st = 0; st < 2; st++) gradcheck_one(&fixed[i], st, st ? 2 : -1);
    for (int i = 0; i < 4; i++) {
        shape s = {tu_int(1, 3), tu_int(1, 7), tu_int(1, 5), tu_int(1, 5), tu_int(1, 3)};
        gradcheck_one(&s, tu_int(0, 1), tu_int(-1, 3));
    }
}

/* ---- checkpointed == full, bit for bit ---- */

typedef struct run_out { float *out, *hl, *hn, *cn, *grad, *dx, *dh0, *dc0; size_t np; } run_out;

/* The CPU LSTM's kernel variant of the device run_model opens (-1: the device's pick;
 * else mb__rk_variants[v], which this CPU must run), through mb_device_config.cpu_kernel. */
static int run_variant = -1;

static run_out run_model(const shape *s, int checkpoint, int grad_block, mb_dtype prec, const float *pvals,
                         const float *x, const float *h0, const float *c0, const float *r1, const float *r2) {
    mb_device *dev;
    mb_device_config dc = {0};
    dc.cpu_kernel = (mb_cpu_kernel)(run_variant + 1); /* -1: MB_CPU_KERNEL_AUTO */
    tu_ok(mb_device_open(&dev, &dc));
    if (checkpoint == CK_AUTO_TIGHT) make_tight(dev);
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(s, checkpoint);
    cfg.grad_block = grad_block;
    cfg.precision = prec;
    tu_ok(mb_lstm_create(&l, p, &cfg));
    if (checkpoint > 0 || checkpoint == CK_AUTO_TIGHT) { /* checkpointed as asked: recompute from kept states */
        int64_t k = mb_lstm_checkpoint_steps(l, s->T);
        if (k < 1 || (checkpoint > 0 && k != (checkpoint < s->T ? checkpoint : s->T)))
            fail_msg("checkpoint %d at T=%lld: the LSTM takes %lld", checkpoint, (long long)s->T, (long long)k);
    }
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_set(p, pvals));
    size_t nx = (size_t)s->B * s->T * s->F, no = (size_t)s->B * s->T * s->H, ns = (size_t)s->L * s->B * s->H;
    run_out r;
    r.np = mb_params_total(p);
    r.out = tu_alloc_f32(no); r.hl = tu_alloc_f32((size_t)s->B * s->H); r.hn = tu_alloc_f32(ns);
    r.cn = tu_alloc_f32(ns); r.grad = tu_alloc_f32(r.np); r.dx = tu_alloc_f32(nx);
    r.dh0 = tu_alloc_f32(ns); r.dc0 = tu_alloc_f32(ns);
    tu_ok(mb_lstm_forward(l, x, s->B, s->T, h0, c0, r.out, r.hl));
    tu_ok(mb_lstm_final_state(l, r.hn, r.cn));
    tu_ok(mb_lstm_backward(l, r2, r1, r.dx, r.dh0, r.dc0));
    memcpy(r.grad, mb_params_grad(p), r.np * sizeof(float));
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    mb_device_close(dev);
    return r;
}

static void free_run(run_out *r) {
    free(r->out); free(r->hl); free(r->hn); free(r->cn); free(r->grad); free(r->dx); free(r->dh0); free(r->dc0);
}

/* Random parameters (PyTorch's init), inputs, states and upstream gradients for s. */
typedef struct inputs { float *pv, *x, *h0, *c0, *r1, *r2; size_t np, nx, no, ns; } inputs;

static inputs make_inputs(const shape *s) {
    inputs in;
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_device_open(&dev, NULL));
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(s, -1);
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    in.np = mb_params_total(p); in.nx = (size_t)s->B * s->T * s->F; in.no = (size_t)s->B * s->T * s->H;
    in.ns = (size_t)s->L * s->B * s->H;
    in.pv = tu_alloc_f32(in.np); in.x = tu_alloc_f32(in.nx); in.h0 = tu_alloc_f32(in.ns); in.c0 = tu_alloc_f32(in.ns);
    in.r1 = tu_alloc_f32(in.no); in.r2 = tu_alloc_f32((size_t)s->B * s->H);
    tu_ok(mb_params_init(p, tu_next()));
    tu_ok(mb_params_get(p, in.pv));
    mb_lstm_destroy(l); mb_params_destroy(p); mb_device_close(dev);
    tu_fill(in.x, in.nx, -2, 2); tu_fill(in.h0, in.ns, -1, 1); tu_fill(in.c0, in.ns, -1, 1);
    tu_fill(in.r1, in.no, -1, 1); tu_fill(in.r2, (size_t)s->B * s->H, -1, 1);
    return in;
}

static void free_inputs(inputs *in) { free(in->pv); free(in->x); free(in->h0); free(in->c0); free(in->r1); free(in->r2); }

/* Two runs of the same model and inputs gave the same bits everywhere. */
static void assert_runs_equal(const run_out *a, const run_out *b, const inputs *in, int bh) {
    assert_memory_equal(a->out, b->out, in->no * sizeof(float));
    assert_memory_equal(a->hl, b->hl, (size_t)bh * sizeof(float));
    assert_memory_equal(a->hn, b->hn, in->ns * sizeof(float));
    assert_memory_equal(a->cn, b->cn, in->ns * sizeof(float));
    assert_memory_equal(a->grad, b->grad, in->np * sizeof(float));
    assert_memory_equal(a->dx, b->dx, in->nx * sizeof(float));
    assert_memory_equal(a->dh0, b->dh0, in->ns * sizeof(float));
    assert_memory_equal(a->dc0, b->dc0, in->ns * sizeof(float));
}

static void test_checkpoint_bitwise(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++) {
        shape s = {tu_int(1, 5), tu_int(8, 40), tu_int(1, 9), tu_int(1, 12), tu_int(1, 3)};
        int gb = tu_int(0, 1) ? tu_int(1, 9) : 0;
        mb_dtype prec = (mb_dtype)(rep % 3); /* f32, bf16, f16: the same kernels in the same order */
        inputs in = make_inputs(&s);
        run_out full = run_model(&s, -1, gb, prec, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
        int ks[] = {1, 2, 7, s.T, CK_AUTO_TIGHT}; /* the automatic rule, forced to checkpoint */
        for (int i = 0; i < 5; i++) {
            run_out ck = run_model(&s, ks[i], gb, prec, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
            assert_runs_equal(&ck, &full, &in, s.B * s.H);
            free_run(&ck);
        }
        free_run(&full);
        free_inputs(&in);
    }
}

/* ---- low precision: bf16/f16 operands against f32, relative norm error < 2e-2 ---- */

static void assert_near_not_equal(const float *got, const float *ref, size_t n, double tol, int *differs) {
    double e = tu_rel_norm_err(got, ref, n);
    assert_true(e < tol);
    if (memcmp(got, ref, n * sizeof(float)) != 0) *differs = 1;
}

static void test_low_precision(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        shape s = {tu_int(2, 6), tu_int(20, 60), tu_int(3, 9), tu_int(4, 16), tu_int(1, 2)};
        inputs in = make_inputs(&s);
        run_out ref = run_model(&s, -1, 0, MB_F32, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
        mb_dtype prec = rep % 2 ? MB_F16 : MB_BF16;
        run_out lp = run_model(&s, 0, 0, prec, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
        int differs = 0; /* rounding must show somewhere, else the precision was ignored */
        assert_near_not_equal(lp.out, ref.out, in.no, 2e-2, &differs);
        assert_near_not_equal(lp.hn, ref.hn, in.ns, 2e-2, &differs);
        assert_near_not_equal(lp.cn, ref.cn, in.ns, 2e-2, &differs);
        assert_near_not_equal(lp.grad, ref.grad, in.np, 2e-2, &differs);
        assert_near_not_equal(lp.dx, ref.dx, in.nx, 2e-2, &differs);
        assert_near_not_equal(lp.dh0, ref.dh0, in.ns, 2e-2, &differs);
        assert_true(differs);
        free_run(&ref); free_run(&lp);
        free_inputs(&in);
    }
}

/* ---- carry-over: two halves == one sequence; reset starts from zeros ---- */

static void test_carry_over(void **state) {
    (void)state;
    shape s = {tu_int(1, 4), 2 * tu_int(2, 10), tu_int(1, 6), tu_int(1, 8), tu_int(1, 2)};
    int T2 = s.T / 2;
    mb_device *dev;
    mb_params *p;
    mb_lstm *whole, *half;
    tu_ok(mb_device_open(&dev, NULL));
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(&s, tu_int(-1, 3));
    cfg.prefix = "a.";
    tu_ok(mb_lstm_create(&whole, p, &cfg));
    cfg.prefix = "b.";
    cfg.carry_state = 1;
    cfg.max_steps = T2;
    tu_ok(mb_lstm_create(&half, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, tu_next()));
    /* same weights for both: copy a.* over b.* */
    for (int i = 0; i < 4 * s.L; i++) {
        const mb_param_info *a = mb_params_info(p, i), *b = mb_params_info(p, i + 4 * s.L);
        assert_int_equal(strncmp(a->name, "a.", 2), 0);
        assert_string_equal(a->name + 2, b->name + 2);
        memcpy(mb_params_tensor(p, i + 4 * s.L), mb_params_tensor(p, i), a->count * sizeof(float));
    }
    size_t nx = (size_t)s.B * s.T * s.F, no = (size_t)s.B * s.T * s.H, nb = (size_t)s.B * s.H;
    float *x = tu_alloc_f32(nx), *xh = tu_alloc_f32(nx), *out = tu_alloc_f32(no), *o2 = tu_alloc_f32(no);
    float *hl = tu_alloc_f32(nb), *hl2 = tu_alloc_f32(nb), *first = tu_alloc_f32(no), *o3 = tu_alloc_f32(no);
    float *hn = tu_alloc_f32((size_t)s.L * nb), *cn = tu_alloc_f32((size_t)s.L * nb);
    tu_fill(x, nx, -1, 1);
    tu_ok(mb_lstm_forward(whole, x, s.B, s.T, NULL, NULL, out, hl));
    for (int half_i = 0; half_i < 2; half_i++) { /* (B, T2, F) halves */
        for (int b = 0; b < s.B; b++)
            memcpy(xh + (size_t)b * T2 * s.F, x + ((size_t)b * s.T + half_i * T2) * s.F, (size_t)T2 * s.F * sizeof(float));
        tu_ok(mb_lstm_forward(half, xh, s.B, T2, NULL, NULL, o2, hl2));
        if (half_i == 0) memcpy(first, o2, (size_t)s.B * T2 * s.H * sizeof(float));
        if (half_i == 0) tu_ok(mb_lstm_final_state(half, hn, cn)); /* what a checkpoint saves */
        for (int b = 0; b < s.B; b++)
            tu_assert_close(o2 + (size_t)b * T2 * s.H, out + ((size_t)b * s.T + half_i * T2) * s.H, (size_t)T2 * s.H,
                            1e-6, 1e-5, "carried half vs whole sequence");
    }
    tu_assert_close(hl2, hl, nb, 1e-6, 1e-5, "h_last after two halves");
    /* set_state with the state saved after the first half: the second half again, bitwise */
    mb_lstm_reset_state(half);
    assert_int_equal(mb_lstm_state_batch(half), 0);
    tu_ok(mb_lstm_set_state(half, s.B, hn, cn));
    assert_int_equal(mb_lstm_state_batch(half), s.B);
    tu_assert_error(mb_lstm_backward(half, NULL, NULL, NULL, NULL, NULL), MB_ERR_STATE, "before mb_lstm_forward");
    tu_assert_error(mb_lstm_set_state(half, s.B + 100, hn, cn), MB_ERR_INVALID_ARG, "max_batch");
    tu_ok(mb_lstm_forward(half, xh, s.B, T2, NULL, NULL, o3, NULL));
    assert_memory_equal(o3, o2, (size_t)s.B * T2 * s.H * sizeof(float));
    /* reset: the first half again gives the first half's outputs exactly */
    mb_lstm_reset_state(half);
    for (int b = 0; b < s.B; b++)
        memcpy(xh + (size_t)b * T2 * s.F, x + (size_t)b * s.T * s.F, (size_t)T2 * s.F * sizeof(float));
    tu_ok(mb_lstm_forward(half, xh, s.B, T2, NULL, NULL, o2, NULL));
    assert_memory_equal(o2, first, (size_t)s.B * T2 * s.H * sizeof(float));
    /* carry with another batch size is an error */
    if (s.B > 1)
        tu_assert_error(mb_lstm_forward(half, xh, s.B - 1, T2, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG,
                        "carried state has batch");
    free(x); free(xh); free(out); free(o2); free(hl); free(hl2); free(first); free(hn); free(cn); free(o3);
    mb_lstm_destroy(whole); mb_lstm_destroy(half); mb_params_destroy(p);
    mb_device_close(dev);
}

/* ---- gradients accumulate (beta = 1); backward may repeat ---- */

static void test_grad_accumulates(void **state) {
    (void)state;
    shape s = {3, 9, 4, 5, 2};
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_device_open(&dev, NULL));
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(&s, 0);
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, tu_next()));
    size_t n = mb_params_total(p);
    float *x = tu_alloc_f32(36 * 4), *dl = tu_alloc_f32(15), *g1 = tu_alloc_f32(n), *g2 = tu_alloc_f32(n);
    tu_fill(x, 36 * 4, -1, 1); tu_fill(dl, 15, -1, 1);
    tu_ok(mb_lstm_forward(l, x, 3, 9, NULL, NULL, NULL, NULL));
    tu_ok(mb_lstm_backward(l, dl, NULL, NULL, NULL, NULL));
    memcpy(g1, mb_params_grad(p), n * sizeof(float));
    tu_ok(mb_lstm_backward(l, dl, NULL, NULL, NULL, NULL));
    memcpy(g2, mb_params_grad(p), n * sizeof(float));
    double nz = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(g2[i] == 2.0f * g1[i]); /* x + x is exact */
        nz += fabs(g1[i]);
    }
    assert_true(nz > 0);
    free(x); free(dl); free(g1); free(g2);
    mb_lstm_destroy(l); mb_params_destroy(p); mb_device_close(dev);
}

/* ---- memory query ---- */

static void test_memory_query(void **state) {
    (void)state;
    shape s = {128, 480, 128, 256, 1};
    mb_lstm_config cfg = make_cfg(&s, 0);
    size_t full = 0, ck = 0, f2 = 0, c2 = 0;
    tu_ok(mb_lstm_memory(&cfg, 128, 480, &full, &ck));
    /* docs/DESIGN.md, "Numbers to aim at": at most a quarter at the bench shape */
    assert_true(ck > 0 && ck * 4 <= full);
    /* full storage keeps gates + c + h per step: at least 6H floats per (b, t) */
    assert_true(full >= (size_t)128 * 480 * 6 * 256 * 4);
    cfg.checkpoint = -1;
    tu_ok(mb_lstm_memory(&cfg, 128, 480, &f2, &c2));
    assert_true(f2 == full && c2 == full);
    /* the live device memory of an LSTM covers what the query says it keeps */
    shape t = {4, 30, 3, 5, 2};
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_device_open(&dev, NULL));
    tu_ok(mb_params_create(&p, dev));
    for (int c = -1; c <= 6; c += 7) {
        cfg = make_cfg(&t, c);
        tu_ok(mb_lstm_memory(&cfg, t.B, t.T, &f2, &c2));
        size_t before = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
        cfg.prefix = c < 0 ? "f." : "c.";
        tu_ok(mb_lstm_create(&l, p, &cfg));
        size_t used = mb_device_mem_stats(dev).live[MB_MEM_DEVICE] - before;
        assert_true(used >= c2 && (c < 0 || c2 < f2));
        mb_lstm_destroy(l);
        assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], before);
    }
    mb_params_destroy(p);
    mb_device_close(dev);
}

static void test_checkpoint_steps(void **state) {
    (void)state;
    mb_device *dev;
    mb_params *p;
    mb_lstm *a, *b, *c;
    tu_ok(mb_device_open(&dev, NULL));
    tu_ok(mb_params_create(&p, dev));
    shape s = {2, 100, 3, 4, 1};
    mb_lstm_config cfg = make_cfg(&s, 0);
    cfg.prefix = "a.";
    tu_ok(mb_lstm_create(&a, p, &cfg));
    cfg.checkpoint = 7; cfg.prefix = "b.";
    tu_ok(mb_lstm_create(&b, p, &cfg));
    cfg.checkpoint = -1; cfg.prefix = "c.";
    tu_ok(mb_lstm_create(&c, p, &cfg));
    for (int T = 1; T <= 100; T++) {
        /* auto: full storage, as it fits; the interval it would take when memory is short:
         * ceil(sqrt(T)) rounded up to a multiple of the block (16), at most T */
        assert_int_equal(mb_lstm_checkpoint_steps(a, T), -1);
        int64_t r = 1;
        while (r * r < T) r++;
        r = (r + 15) / 16 * 16;
        int64_t k = mb__lstm_auto_k(T, 16);
        assert_int_equal(k < T ? k : T, r < T ? r : T);
        assert_int_equal(mb_lstm_checkpoint_steps(b, T), T < 7 ? T : 7);
        assert_int_equal(mb_lstm_checkpoint_steps(c, T), -1);
    }
    mb_lstm_destroy(a); mb_lstm_destroy(b); mb_lstm_destroy(c);
    mb_params_destroy(p);
    mb_device_close(dev);
}

/* ---- bad input ---- */

typedef struct fixture { mb_device *dev; mb_params *p; mb_lstm *l; float *x, *y; } fixture;

static fixture make_fixture(int finalize) {
    fixture f;
    tu_ok(mb_device_open(&f.dev, NULL));
    tu_ok(mb_params_create(&f.p, f.dev));
    shape s = {2, 5, 3, 4, 2};
    mb_lstm_config cfg = make_cfg(&s, 0);
    tu_ok(mb_lstm_create(&f.l, f.p, &cfg));
    if (finalize) tu_ok(mb_params_finalize(f.p));
    f.x = tu_alloc_f32(2 * 5 * 4 * 4);
    f.y = tu_alloc_f32(2 * 5 * 4 * 4);
    return f;
}
static void free_fixture(fixture *f) {
    free(f->x); free(f->y);
    mb_lstm_destroy(f->l); mb_params_destroy(f->p);
    assert_int_equal(mb_device_mem_stats(f->dev).live[MB_MEM_DEVICE], 0);
    mb_device_close(f->dev);
}

static void test_bad_config_sizes(void **state) {
    (void)state;
    fixture f = make_fixture(0);
    mb_lstm *l = NULL;
    shape s = {2, 5, 3, 4, 1};
    mb_lstm_config c = make_cfg(&s, 0);
    c.hidden_size = 0;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "hidden_size H=0");
    assert_null(l);
    c = make_cfg(&s, 0); c.input_size = 0;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "input_size F=0");
    c = make_cfg(&s, 0); c.max_steps = 0;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "max_steps=0");
    c = make_cfg(&s, 0); c.max_batch = -3;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "max_batch=-3");
    c = make_cfg(&s, -2);
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "checkpoint=-2");
    c = make_cfg(&s, 0); c.layers = -1;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "layers=-1");
    c = make_cfg(&s, 0); c.carry_state = 2;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "carry_state=2");
    c = make_cfg(&s, 0); c.precision = (mb_dtype)7;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "precision=7");
    c = make_cfg(&s, 0); c.stream = 5;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "stream 5 out of range");
    tu_assert_error(mb_lstm_create(&l, f.p, NULL), MB_ERR_INVALID_ARG, "NULL argument");
    free_fixture(&f);
}

static void test_bad_overflow(void **state) {
    (void)state;
    fixture f = make_fixture(0);
    mb_lstm *l = NULL;
    shape s = {2, 5, 3, 4, 1};
    mb_lstm_config c = make_cfg(&s, 0);
    c.max_steps = INT64_MAX / 2; c.max_batch = INT64_MAX / 2;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_OVERFLOW, "overflows");
    c = make_cfg(&s, -1); c.hidden_size = (int64_t)1 << 40;
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_OVERFLOW, "H=1099511627776");
    size_t a, b;
    c = make_cfg(&s, 0);
    tu_assert_error(mb_lstm_memory(&c, (int64_t)1 << 40, (int64_t)1 << 40, &a, &b), MB_ERR_OVERFLOW, "overflows");
    tu_assert_error(mb_lstm_memory(&c, 0, 5, &a, &b), MB_ERR_INVALID_ARG, "B=0");
    assert_int_equal(mb_params_num_tensors(f.p), 8); /* failed creates registered nothing */
    free_fixture(&f);
}

static void test_bad_duplicate_prefix(void **state) {
    (void)state;
    fixture f = make_fixture(0);
    mb_lstm *l = NULL;
    shape s = {2, 5, 3, 4, 1};
    mb_lstm_config c = make_cfg(&s, 0);
    tu_assert_error(mb_lstm_create(&l, f.p, &c), MB_ERR_INVALID_ARG, "'weight_ih_l0' registered twice");
    assert_null(l);
    free_fixture(&f);
}

static void test_bad_forward_shapes(void **state) {
    (void)state;
    fixture f = make_fixture(1);
    tu_assert_error(mb_lstm_forward(f.l, f.x, 0, 5, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "B=0");
    tu_assert_error(mb_lstm_forward(f.l, f.x, 2, 0, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "T=0");
    tu_assert_error(mb_lstm_forward(f.l, f.x, 3, 5, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "exceed max_batch=2");
    tu_assert_error(mb_lstm_forward(f.l, f.x, 2, 6, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "max_steps=5");
    tu_assert_error(mb_lstm_forward(f.l, NULL, 2, 5, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "x is NULL");
    tu_ok(mb_lstm_forward(f.l, f.x, 2, 5, NULL, NULL, f.y, NULL));
    free_fixture(&f);
}

static void test_bad_backward_before_forward(void **state) {
    (void)state;
    fixture f = make_fixture(1);
    tu_assert_error(mb_lstm_backward(f.l, f.x, NULL, NULL, NULL, NULL), MB_ERR_STATE, "before mb_lstm_forward");
    tu_assert_error(mb_lstm_final_state(f.l, f.y, NULL), MB_ERR_STATE, "no forward yet");
    /* a failed forward leaves no forward to differentiate */
    tu_ok(mb_lstm_forward(f.l, f.x, 2, 5, NULL, NULL, NULL, NULL));
    tu_assert_error(mb_lstm_forward(f.l, f.x, 2, 9, NULL, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "max_steps");
    tu_ok(mb_lstm_backward(f.l, f.x, NULL, NULL, NULL, NULL)); /* the earlier forward is intact */
    free_fixture(&f);
}

static void test_bad_forward_unfinalized(void **state) {
    (void)state;
    fixture f = make_fixture(0);
    tu_assert_error(mb_lstm_forward(f.l, f.x, 2, 5, NULL, NULL, NULL, NULL), MB_ERR_STATE, "not finalized");
    free_fixture(&f);
}

static void test_alloc_failure_leaks_nothing(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    shape s = {2, 5, 3, 4, 2};
    /* full storage, auto (full here), an interval with recompute segments (2 at T=5: 2, 2, 1)
     * and the automatic rule forced to checkpoint (ceil(sqrt(5)) = 3 with grad_block 1), each
     * in f32 and bf16 (the operand copies): every allocation of each fails once in turn,
     * the checkpointed ones (kept cells, a segment's gates and cells) among them */
    const int cks[] = {-1, 0, 2, CK_AUTO_TIGHT};
    mb_device *tight;
    tu_ok(mb_device_open(&tight, NULL));
    make_tight(tight);
    for (int ci = 0; ci < 8; ci++) {
        int ck = cks[ci / 2], allocs = 0;
        mb_device *d = ck == CK_AUTO_TIGHT ? tight : dev;
        for (uint64_t nth = 1;; nth++) {
            mb_params *p;
            mb_lstm *l = NULL;
            tu_ok(mb_params_create(&p, d));
            mb_lstm_config c = make_cfg(&s, ck);
            c.precision = ci % 2 ? MB_BF16 : MB_F32; /* bf16 adds the operand copies */
            c.grad_block = ck == CK_AUTO_TIGHT ? 1 : 0;
            uint64_t before = mb_device_mem_stats(d).allocs[MB_MEM_DEVICE];
            mb_device_fail_alloc(d, MB_MEM_DEVICE, nth);
            mb_result r = mb_lstm_create(&l, p, &c);
            mb_device_fail_alloc(d, MB_MEM_DEVICE, 0);
            if (r == MB_OK) {
                allocs = (int)(mb_device_mem_stats(d).allocs[MB_MEM_DEVICE] - before);
                int64_t k = mb_lstm_checkpoint_steps(l, s.T);
                if (ck > 0 || ck == CK_AUTO_TIGHT) { if (k < 2 || k >= s.T) fail_msg("checkpoint %d: interval %lld", ck, (long long)k); }
                else if (k != -1) fail_msg("checkpoint %d: interval %lld, want full storage", ck, (long long)k);
                mb_lstm_destroy(l); mb_params_destroy(p);
                if ((int)nth != allocs + 1) /* each of its allocations failed once, each failure refused */
                    fail_msg("checkpoint %d, %s: mb_lstm_create succeeded with allocation %d of its %d failed", ck,
                             ci % 2 ? "bf16" : "f32", (int)nth, allocs);
                break;
            }
            assert_int_equal(r, MB_ERR_OUT_OF_MEMORY);
            assert_null(l);
            assert_int_equal(mb_params_num_tensors(p), 0);
            assert_int_equal(mb_device_mem_stats(d).live[MB_MEM_DEVICE], 0);
            tu_ok(mb_lstm_create(&l, p, &c)); /* retry works */
            mb_lstm_destroy(l);
            mb_params_destroy(p);
        }
        assert_true(allocs > 10);
    }
    mb_device_close(tight);
    mb_device_close(dev);
}

#include "test_lstm_golden.h"

/* mb__fexp (the cell's exp) within 3e-7 relative of double exp over the clamp range, at
 * random points and at the ends (+-87, where 2^n is +-126: no denormal); beyond, the
 * clamp's values; NaN of either sign gives the one quiet NaN 0x7fc00000. */
static void test_fexp_accuracy(void **state) {
    (void)state;
    for (int i = 0; i < 200000; i++) {
        float x = i < 2 ? (i ? -87.0f : 87.0f) : (float)tu_int(-870000, 870000) * 1e-4f + (float)tu_int(0, 99) * 1e-9f;
        double want = exp((double)x), got = (double)mb__fexp(x);
        if (fabs(got / want - 1.0) > 3e-7) fail_msg("mb__fexp(%.9g) = %.9g, exp %.9g", (double)x, got, want);
    }
    assert_true(mb__fexp(1000.0f) == mb__fexp(87.0f) && mb__fexp(INFINITY) == mb__fexp(87.0f));
    assert_true(mb__fexp(-1000.0f) == mb__fexp(-87.0f) && mb__fexp(-INFINITY) == mb__fexp(-87.0f));
    for (int sign = 0; sign < 2; sign++) {
        float y = mb__fexp(sign ? -NAN : NAN);
        uint32_t u;
        memcpy(&u, &y, sizeof u);
        assert_int_equal(u, 0x7fc00000u);
    }
}

/* The AVX2 and AVX-512 row functions give the bits of the baseline ones (random rows, large
 * pre-activations, NaN), and without h (a recompute) the same gates and cells; a variant
 * the CPU lacks is left out (all skipped without AVX2). */
/* The AVX-512 variants are checked by test_avx512_kernels, which runs the three tests below
 * with avx512_pass = 1 (only AVX-512 against the reference) and is skipped, saying so, on a
 * CPU without AVX-512; with avx512_pass = 0 they check the other variants. */
static int avx512_pass;

static void test_rows_simd_bitwise(void **state) {
    (void)state;
    if (!mb__rk_supported(avx512_pass ? 0 : 1)) {
        printf("skipped: this CPU has no %s: the SIMD gate rows are not checked\n", avx512_pass ? "AVX-512" : "AVX2+FMA");
        skip();
        return;
    }
    mb__lstm_fwd_row_fn fwd[3] = {mb__lstm_fwd_row_base, mb__lstm_fwd_row_avx2, mb__lstm_fwd_row_avx512};
    mb__lstm_bwd_row_fn bwd[3] = {mb__lstm_bwd_row_base, mb__lstm_bwd_row_avx2, mb__lstm_bwd_row_avx512};
    int nv = mb__rk_supported(0) ? 3 : 2;
    for (int rep = 0; rep < 20; rep++) {
        int64_t H = tu_int(1, 70);
        size_t h4 = (size_t)(4 * H), h1 = (size_t)H;
        float *g[3], *c[3], *h[3], *d4[3], *dc[3];
        float *b1 = tu_alloc_f32(h4), *b2 = tu_alloc_f32(h4), *cp = tu_alloc_f32(h1), *g0 = tu_alloc_f32(h4);
        float *dh = tu_alloc_f32(h1), *dout = tu_alloc_f32(h1), *dc0 = tu_alloc_f32(h1);
        tu_fill(b1, h4, -1, 1); tu_fill(b2, h4, -1, 1); tu_fill(cp, h1, -3, 3); tu_fill(g0, h4, -30, 30);
        tu_fill(dh, h1, -1, 1); tu_fill(dout, h1, -1, 1); tu_fill(dc0, h1, -1, 1);
        g0[tu_int(0, (int)h4 - 1)] = 100.0f; g0[tu_int(0, (int)h4 - 1)] = NAN;
        for (int v = 0; v < nv; v++) {
            if (v && (v == 2) != avx512_pass) { g[v] = c[v] = h[v] = d4[v] = dc[v] = NULL; continue; }
            g[v] = tu_alloc_f32(h4); c[v] = tu_alloc_f32(h1); h[v] = tu_alloc_f32(h1);
            d4[v] = tu_alloc_f32(h4); dc[v] = tu_alloc_f32(h1);
            memcpy(g[v], g0, h4 * sizeof(float));
            memcpy(dc[v], dc0, h1 * sizeof(float));
            fwd[v](H, g[v], b1, b2, cp, c[v], h[v]);
            bwd[v](H, g[v], cp, c[v], dh, dout, dc[v], d4[v]);
            float *gn = tu_alloc_f32(h4), *cn = tu_alloc_f32(h1); /* no h: gates and cells as with it */
            memcpy(gn, g0, h4 * sizeof(float));
            fwd[v](H, gn, b1, b2, cp, cn, NULL);
            assert_memory_equal(gn, g[v], h4 * sizeof(float));
            assert_memory_equal(cn, c[v], h1 * sizeof(float));
            free(gn); free(cn);
        }
        for (int v = 1; v < nv; v++) {
            if ((v == 2) != avx512_pass) continue;
            assert_memory_equal(g[0], g[v], h4 * sizeof(float));
            assert_memory_equal(c[0], c[v], h1 * sizeof(float));
            assert_memory_equal(h[0], h[v], h1 * sizeof(float));
            assert_memory_equal(d4[0], d4[v], h4 * sizeof(float));
            assert_memory_equal(dc[0], dc[v], h1 * sizeof(float));
        }
        for (int v = 0; v < nv; v++) { free(g[v]); free(c[v]); free(h[v]); free(d4[v]); free(dc[v]); }
        free(b1); free(b2); free(cp); free(g0); free(dh); free(dout); free(dc0);
    }
}

/* ---- the CPU recurrence's product (gemm module: mb__rk_*) ---- */

/* A random product: C (M, N) = [A1 A2] op([W1; W2]) (+ C); A1 (M, K1) rows lda1 apart, A2
 * (M, K2) rows lda2 apart, W1 and W2 (N, K) with trans, (K, N) without. */
typedef struct rk_case {
    int64_t M, N, K1, K2, lda1, lda2;
    int trans, add;
    float *a1, *a2, *w1, *w2, *c0;
} rk_case;

static rk_case rk_case_random(void) {
    rk_case q;
    q.M = tu_int(1, 40); q.N = tu_int(1, 80); q.K1 = tu_int(1, 70); q.K2 = tu_int(0, 1) ? tu_int(1, 40) : 0;
    q.lda1 = q.K1 + tu_int(0, 3); q.lda2 = q.K2 + tu_int(0, 3);
    q.trans = tu_int(0, 1); q.add = tu_int(0, 1);
    float scale = tu_int(0, 3) ? 1.0f : 1e4f; /* now and then magnitudes whose sums round a lot */
    q.a1 = tu_alloc_f32((size_t)(q.M * q.lda1)); q.a2 = tu_alloc_f32((size_t)(q.M * q.lda2 + 1));
    q.w1 = tu_alloc_f32((size_t)(q.N * q.K1)); q.w2 = tu_alloc_f32((size_t)(q.N * q.K2 + 1));
    q.c0 = tu_alloc_f32((size_t)(q.M * q.N));
    tu_fill(q.a1, (size_t)(q.M * q.lda1), -scale, scale); tu_fill(q.a2, (size_t)(q.M * q.lda2 + 1), -1, 1);
    tu_fill(q.w1, (size_t)(q.N * q.K1), -1, 1); tu_fill(q.w2, (size_t)(q.N * q.K2 + 1), -1, 1);
    tu_fill(q.c0, (size_t)(q.M * q.N), -2, 2);
    return q;
}

static void rk_case_free(rk_case *q) { free(q->a1); free(q->a2); free(q->w1); free(q->w2); free(q->c0); }

/* Through variant v into c (a copy of c0 first), rows [0, M) in pieces of the given sizes,
 * each piece one call (as a step's rows or a segment's are). */
static void rk_run(int v, const rk_case *q, float *c, const int64_t *pieces, int np) {
    const mb__rk *k = &mb__rk_variants[v];
    int64_t Kt = q->K1 + q->K2;
    float *pk = tu_alloc_f32(mb__rk_packed_size(q->N, Kt));
    mb__rk_pack(k->nr, q->N, q->K1, q->w1, q->trans, Kt, 0, pk);
    if (q->K2) mb__rk_pack(k->nr, q->N, q->K2, q->w2, q->trans, Kt, q->K1, pk);
    memcpy(c, q->c0, (size_t)(q->M * q->N) * sizeof(float));
    for (int64_t r = 0, i = 0; r < q->M; i++) {
        int64_t n = i < np && pieces[i] < q->M - r ? pieces[i] : q->M - r;
        mb__rk_a A = {q->a1 + r * q->lda1, q->a2 + r * q->lda2, q->lda1, q->lda2, q->K1, q->K2};
        mb__rk_product(k, n, q->N, &A, pk, c + r * q->N, q->N, q->add);
        r += n;
    }
    free(pk);
}

/* Every variant this CPU runs gives the portable C one's bits, whole or in random pieces of
 * rows (a row's bits never depend on the call); the C one is within float rounding of a
 * double reference. Random M, N, K1, K2 (edge panels and tiles, one or two operands),
 * strides, W^T or W, store or add. */
static void test_rk_variants_bitwise(void **state) {
    (void)state;
    for (int rep = 0; rep < 40; rep++) {
        rk_case q = rk_case_random();
        size_t mn = (size_t)(q.M * q.N);
        float *ref = tu_alloc_f32(mn), *got = tu_alloc_f32(mn);
        int64_t pieces[8];
        for (int i = 0; i < 8; i++) pieces[i] = tu_int(1, 9);
        rk_run(2, &q, ref, NULL, 0);
        for (int64_t i = 0; i < q.M; i++) /* the C variant against double sums */
            for (int64_t j = 0; j < q.N; j++) {
                double d = q.add ? q.c0[i * q.N + j] : 0, mag = fabs(d);
                for (int part = 0; part < 2; part++)
                    for (int64_t k = 0, K = part ? q.K2 : q.K1; k < K; k++) {
                        const float *w = part ? q.w2 : q.w1;
                        double av = part ? q.a2[i * q.lda2 + k] : q.a1[i * q.lda1 + k];
                        double p = av * (q.trans ? w[j * K + k] : w[k * q.N + j]);
                        d += p; mag += fabs(p);
                    }
                assert_true(fabs(ref[i * q.N + j] - d) <= 1e-6 * mag * (double)(q.K1 + q.K2 + 1) + 1e-30);
            }
        for (int v = 0; v < 3; v++) {
            if (!mb__rk_supported(v) || (v == 0) != avx512_pass) continue;
            for (int split = 0; split < 2; split++) {
                rk_run(v, &q, got, pieces, split ? 8 : 0);
                assert_memory_equal(got, ref, mn * sizeof(float));
            }
        }
        free(ref); free(got);
        rk_case_free(&q);
    }
}

/* A whole LSTM (1-3 layers, full and checkpointed, random shapes) gives the same bits with
 * each kernel variant this CPU runs (product and gate rows, picked by cpu_kernel) as with
 * the portable C one. A variant this CPU lacks, or an unknown one, is refused at open. */
static void test_lstm_kernel_variants_bitwise(void **state) {
    (void)state;
    for (int v = -1; v <= 4; v++) {
        mb_device *dev = NULL;
        mb_device_config dc = {0};
        dc.cpu_kernel = (mb_cpu_kernel)v;
        mb_result r = mb_device_open(&dev, &dc);
        if (v < 0 || v > 3) {
            assert_int_equal(r, MB_ERR_INVALID_ARG);
        } else if (v == 0 || mb__rk_supported(v - 1)) {
            tu_ok(r);
            char want[64];
            snprintf(want, sizeof want, "LSTM kernel %s)", v ? mb__rk_variants[v - 1].name : mb__rk_variants[mb__cpu(dev)->kernel].name);
            assert_non_null(strstr(mb_device_name(dev), want));
        } else {
            assert_int_equal(r, MB_ERR_UNSUPPORTED);
        }
        assert_true(r == MB_OK || dev == NULL);
        mb_device_close(dev);
    }
    for (int rep = 0; rep < 2; rep++) {
        shape s = {tu_int(1, 11), tu_int(3, 30), tu_int(1, 9), tu_int(1, 40), tu_int(1, 3)};
        int ck = rep ? tu_int(1, 8) : -1;
        inputs in = make_inputs(&s);
        run_variant = 2;
        run_out ref = run_model(&s, ck, 0, MB_F32, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
        for (int v = 0; v < 2; v++) {
            if (!mb__rk_supported(v) || (v == 0) != avx512_pass) continue;
            run_variant = v;
            run_out got = run_model(&s, ck, 0, MB_F32, in.pv, in.x, in.h0, in.c0, in.r1, in.r2);
            assert_runs_equal(&got, &ref, &in, s.B * s.H);
            free_run(&got);
        }
        run_variant = -1;
        free_run(&ref);
        free_inputs(&in);
    }
}

/* The AVX-512 rows, products and whole LSTMs against the references (the three tests
 * above, AVX-512 only); skipped, with a line that says so, on a CPU without AVX-512. */
static void test_avx512_kernels(void **state) {
    if (!mb__rk_supported(0)) {
        printf("skipped: this CPU has no AVX-512: its gate rows, products and LSTM runs are not checked\n");
        skip();
        return;
    }
    avx512_pass = 1;
    test_rows_simd_bitwise(state);
    test_rk_variants_bitwise(state);
    test_lstm_kernel_variants_bitwise(state);
    avx512_pass = 0;
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_shapes),         cmocka_unit_test(test_checkpoint_bitwise),
        cmocka_unit_test(test_low_precision),
        cmocka_unit_test(test_carry_over),               cmocka_unit_test(test_grad_accumulates),
        cmocka_unit_test(test_memory_query),             cmocka_unit_test(test_checkpoint_steps),
        cmocka_unit_test(test_bad_config_sizes),         cmocka_unit_test(test_bad_overflow),
        cmocka_unit_test(test_bad_duplicate_prefix),     cmocka_unit_test(test_bad_forward_shapes),
        cmocka_unit_test(test_bad_backward_before_forward), cmocka_unit_test(test_bad_forward_unfinalized),
        cmocka_unit_test(test_alloc_failure_leaks_nothing), cmocka_unit_test(test_golden_torch),
        cmocka_unit_test(test_fexp_accuracy),
        cmocka_unit_test(test_rows_simd_bitwise),       cmocka_unit_test(test_rk_variants_bitwise),
        cmocka_unit_test(test_lstm_kernel_variants_bitwise), cmocka_unit_test(test_avx512_kernels),
    };
    return cmocka_run_group_tests_name("lstm", tests, NULL, NULL);
}
