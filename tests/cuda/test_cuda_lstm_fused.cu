/* The fused LSTM recurrence (megabatch_cuda.cuh, section "fused LSTM"): full storage on the GPU
 * runs it. Against the CPU backend on fresh random inputs, in f32 (relative norm error < 1e-4,
 * as test_cuda_lstm.cu states) and bf16/f16 (< 2e-2 against the CPU in f32, and < 2.5e-3 bf16 /
 * 1e-3 f16 against the CPU in the same precision, which rounds at the same points); several
 * LSTMs of different T, H and layers in one mb_lstm_*_many (one launch per layer) bitwise equal
 * to single calls and to a repeated run; odd shapes (H not a multiple of 16, B not a multiple
 * of the 8-row tile, T = 1) and whole tiles (B a multiple of 8, H of 16); the gradient of
 * h_last alone (dout_seq NULL, in f32) or of every output; a second backward of a forward gives
 * the same gradients. Under the simulator, the launch count of a step does not grow with T.
 * Without a GPU every test skips cleanly. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

enum { NMAX = 5 };
typedef struct net { int n, B, F, T[NMAX], H[NMAX], L[NMAX], h_last_only; } net; /* h_last_only: dout_seq NULL */
enum { I_X, I_H0, I_C0, I_DOUT, I_DHL, I_N };                          /* inputs per LSTM */
enum { O_OUT, O_HL, O_HN, O_CN, O_DX, O_DH0, O_DC0, O_N };             /* outputs per LSTM */
static const char *onames[O_N + 1] = {"out_seq", "h_last", "h_n", "c_n", "dx", "dh0", "dc0", "grad"};

/* Element counts of LSTM i's inputs or outputs. */
static void sizes(const net *s, int i, int outputs, size_t *n) {
    size_t B = (size_t)s->B, T = (size_t)s->T[i], F = (size_t)s->F, H = (size_t)s->H[i], st = (size_t)s->L[i] * B * H;
    size_t in[I_N] = {B * T * F, st, st, B * T * H, B * H}, out[O_N] = {B * T * H, B * H, st, st, B * T * F, st, st};
    for (int k = 0; k < (outputs ? (int)O_N : (int)I_N); k++) n[k] = outputs ? out[k] : in[k];
}
static size_t total(const net *s, int outputs) {
    size_t t = 0, n[O_N];
    for (int i = 0; i < s->n; i++) {
        sizes(s, i, outputs, n);
        for (int k = 0; k < (outputs ? (int)O_N : (int)I_N); k++) t += n[k];
    }
    return t;
}

/* The n LSTMs ("e0." ...) in one params on dev; fb: their fused_blocks. */
static void build(mb_device *dev, const net *s, int ck, mb_dtype prec, int fb, mb_params **p, mb_lstm **l) {
    tu_ok(mb_params_create(p, dev));
    for (int i = 0; i < s->n; i++) {
        char pre[16];
        snprintf(pre, sizeof pre, "e%d.", i);
        mb_lstm_config c;
        memset(&c, 0, sizeof c);
        c.input_size = s->F; c.hidden_size = s->H[i]; c.layers = s->L[i]; c.checkpoint = ck; c.prefix = pre;
        c.max_steps = s->T[i]; c.max_batch = s->B; c.precision = prec; c.stream = i % dev->streams;
        c.fused_blocks = fb;
        tu_ok(mb_lstm_create(&l[i], *p, &c));
    }
    tu_ok(mb_params_finalize(*p));
}

typedef struct ins { float *params, *data; } ins; /* host: the parameters, every LSTM's inputs */

static ins make_inputs(const net *s) {
    mb_device *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    mb_params *p;
    mb_lstm *l[NMAX];
    build(cpu, s, -1, MB_F32, 0, &p, l);
    tu_ok(mb_params_init(p, tu_next()));
    ins in = {tu_alloc_f32(mb_params_total(p)), tu_alloc_f32(total(s, 0))};
    tu_ok(mb_params_get(p, in.params));
    tu_fill(in.data, total(s, 0), -1, 1);
    for (int i = 0; i < s->n; i++) mb_lstm_destroy(l[i]);
    mb_params_destroy(p);
    tu_device_close(cpu);
    return in;
}

/* Forward + backward of every LSTM on dev (many: one _many call each way; else single calls
 * in order; fb: fused_blocks); returns the outputs then the gradient, in one host array; *fused:
 * how many ran fused. */
static float *run(mb_device *dev, const net *s, int ck, mb_dtype prec, int fb, int many, const ins *in, size_t *n_out,
                  int *fused) {
    mb_params *p;
    mb_lstm *l[NMAX];
    build(dev, s, ck, prec, fb, &p, l);
    tu_ok(mb_params_set(p, in->params));
    size_t ni = total(s, 0), no = total(s, 1), ng = mb_params_total(p);
    float *di = NULL, *dout = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, ni * sizeof(float), (void **)&di));
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, no * sizeof(float), (void **)&dout));
    tu_ok(mb_copy(dev, 0, di, in->data, ni * sizeof(float)));
    unsigned char *nan = (unsigned char *)malloc(no * sizeof(float)); /* poison: all-ones bytes are NaN */
    memset(nan, 0xff, no * sizeof(float));
    tu_ok(mb_copy(dev, 0, dout, nan, no * sizeof(float)));
    tu_ok(mb_sync(dev, 0));
    free(nan);
    mb_lstm_call c[NMAX];
    memset(c, 0, sizeof c);
    float *pi = di, *po = dout, *hn[NMAX], *cn[NMAX];
    *fused = 0;
    for (int i = 0; i < s->n; i++) {
        size_t a[I_N], b[O_N];
        sizes(s, i, 0, a);
        sizes(s, i, 1, b);
        c[i].lstm = l[i]; c[i].B = s->B; c[i].T = s->T[i];
        c[i].x = pi; c[i].h0 = pi + a[I_X]; c[i].c0 = c[i].h0 + a[I_H0];
        c[i].dout_seq = c[i].c0 + a[I_C0]; c[i].dh_last = c[i].dout_seq + a[I_DOUT];
        if (s->h_last_only) c[i].dout_seq = NULL; /* the multi-timeframe encoders' case */
        c[i].out_seq = po; c[i].h_last = po + b[O_OUT]; hn[i] = c[i].h_last + b[O_HL]; cn[i] = hn[i] + b[O_HN];
        c[i].dx = cn[i] + b[O_CN]; c[i].dh0 = c[i].dx + b[O_DX]; c[i].dc0 = c[i].dh0 + b[O_DH0];
        pi = (float *)c[i].dh_last + a[I_DHL];
        po = c[i].dc0 + b[O_DC0];
        *fused += mb_lstm_fused_blocks(l[i]) != 0;
    }
    if (many) tu_ok(mb_lstm_forward_many(c, s->n));
    for (int i = 0; !many && i < s->n; i++)
        tu_ok(mb_lstm_forward(l[i], c[i].x, c[i].B, c[i].T, c[i].h0, c[i].c0, c[i].out_seq, c[i].h_last));
    for (int i = 0; i < s->n; i++) tu_ok(mb_lstm_final_state(l[i], hn[i], cn[i]));
    if (many) tu_ok(mb_lstm_backward_many(c, s->n));
    for (int i = 0; !many && i < s->n; i++)
        tu_ok(mb_lstm_backward(l[i], c[i].dh_last, c[i].dout_seq, c[i].dx, c[i].dh0, c[i].dc0));
    tu_ok(mb_sync(dev, -1));
    float *o = tu_alloc_f32(no + ng);
    tu_ok(mb_copy(dev, 0, o, dout, no * sizeof(float)));
    tu_ok(mb_copy(dev, 0, o + no, mb_params_grad(p), ng * sizeof(float)));
    tu_ok(mb_sync(dev, 0));
    if (!many) { /* a second backward of the same forward gives the same gradients (layer 0's x kept, or
                    gathered again where its d_in's scratch took it) */
        float *g2 = tu_alloc_f32(ng);
        tu_ok(mb_params_zero_grad(p));
        tu_ok(mb_sync(dev, -1));
        for (int i = 0; i < s->n; i++)
            tu_ok(mb_lstm_backward(l[i], c[i].dh_last, c[i].dout_seq, c[i].dx, c[i].dh0, c[i].dc0));
        tu_ok(mb_sync(dev, -1));
        tu_ok(mb_copy(dev, 0, g2, mb_params_grad(p), ng * sizeof(float)));
        tu_ok(mb_sync(dev, 0));
        if (memcmp(g2, o + no, ng * sizeof(float))) fail_msg("a second backward gives other gradients");
        free(g2);
    }
    mb_free(dev, di); mb_free(dev, dout);
    for (int i = 0; i < s->n; i++) mb_lstm_destroy(l[i]);
    mb_params_destroy(p);
    *n_out = no + ng;
    return o;
}

/* Relative norm error of every output of every LSTM and of the gradient; the worst. Each
 * output's reference rms counts as at least 1e-2 (tu_rel_norm_err_floor): a value that
 * cancels to near zero has a rounding error set by its terms, not by itself (MB_TEST_SMALL,
 * seed 568: a one-element dx of -4.84e-4, from terms of 1e-2 to 1e-1, 1.1e-5 off in f16:
 * 2.3e-2 of itself). */
static double worst_err(const net *s, const float *got, const float *ref, size_t n_all, const char *what) {
    double worst = 0;
    size_t off = 0, n[O_N];
    for (int i = 0; i <= s->n; i++) {
        if (i < s->n) sizes(s, i, 1, n);
        for (int k = 0; k < (i < s->n ? O_N : 1); k++) {
            size_t m = i < s->n ? n[k] : n_all - off;
            double e = tu_rel_norm_err_floor(got + off, ref + off, m, 1e-2);
            if (e > 0.0 && (i == s->n || getenv("MB_TEST_VERBOSE")))
                printf("  %s %s %d: rel err %.3g\n", what, onames[i < s->n ? k : O_N], i, e);
            worst = e > worst ? e : worst;
            off += m;
        }
    }
    return worst;
}

static void print_net(const net *s, mb_dtype prec) {
    printf("%s B=%d F=%d%s:", mb_dtype_name(prec), s->B, s->F, s->h_last_only ? " (h_last only)" : "");
    for (int i = 0; i < s->n; i++) printf(" (T=%d H=%d L=%d)", s->T[i], s->H[i], s->L[i]);
    printf("\n");
}

/* MB_TEST_SMALL (set under the sanitizers): smaller random shapes, the same code paths. */
static int small(void) { return getenv("MB_TEST_SMALL") != NULL; }

/* One net in one precision, the GPU's LSTMs with fused_blocks fb: the GPU's many call against
 * the CPU, single calls and (but at MB_TEST_SMALL) a repeat. The gradient of h_last alone is
 * checked in f32: carried back many steps it becomes small, and at 16 bits a few roundings
 * that differ from the CPU's then exceed the tolerances (full size, T=23: f16 dh0 4% off the
 * f32 CPU, subnormal without loss scaling; bf16 dh0 of a 3-layer LSTM 1.3e-3 off the CPU in
 * bf16, seed 4). */
static void check_net(mb_device *gpu, mb_device *cpu, const net *net_in, mb_dtype prec, int fb) {
    net t = *net_in;
    const net *s = &t;
    if (prec != MB_F32) t.h_last_only = 0;
    print_net(s, prec);
    printf("  fused_blocks %d\n", fb);
    ins in = make_inputs(s);
    size_t n;
    int fused, f2;
    float *ref = run(cpu, s, -1, MB_F32, 0, 1, &in, &n, &f2);
    float *refp = prec == MB_F32 ? NULL : run(cpu, s, -1, prec, 0, 1, &in, &n, &f2);
    float *got = run(gpu, s, -1, prec, fb, 1, &in, &n, &fused);
    if (fused != s->n) fail_msg("%d of %d LSTMs ran fused", fused, s->n);
    double e = worst_err(s, got, ref, n, "vs cpu f32"), tol = prec == MB_F32 ? 1e-4 : 2e-2;
    if (!(e < tol)) fail_msg("%s: relative norm error %g >= %g against the CPU in f32", mb_dtype_name(prec), e, tol);
    if (refp) {
        /* bf16 2.5e-3, f16 1e-3 (bf16's unit roundoff is 2^-8, f16's 2^-11): where the sums'
         * order differs a rounding to 16 bits can flip, by a unit of the precision, so bf16's
         * errors run about 7x f16's. MB_TEST_SMALL, seeds 1-450: worst 1.35e-3 in bf16 (dx of
         * the H=8 3-layer LSTM; 1e-3 failed 3 seeds), 2.1e-4 in f16; bf16 against the CPU in
         * f32 is never closer than 3.46e-3, so a GPU that rounds elsewhere still fails. */
        double e2 = worst_err(s, got, refp, n, "vs cpu same precision"), tol2 = prec == MB_BF16 ? 2.5e-3 : 1e-3;
        if (!(e2 < tol2))
            fail_msg("%s: relative norm error %g >= %g against the CPU in %s", mb_dtype_name(prec), e2, tol2,
                     mb_dtype_name(prec));
    }
    /* a repeat of the same run: the plain build (the sanitizers' small shapes skip it: TSan sees
     * the same accesses again) */
    float *again = small() ? NULL : run(gpu, s, -1, prec, fb, 1, &in, &n, &fused);
    float *single = run(gpu, s, -1, prec, fb, 0, &in, &n, &fused);
    if (again && memcmp(again, got, n * sizeof(float))) fail_msg("a repeated run gives other bits");
    if (memcmp(single, got, n * sizeof(float))) fail_msg("single calls give other bits than the many call");
    free(ref); free(refp); free(got); free(again); free(single);
    free(in.params); free(in.data);
}

static net random_net(int hmax) {
    net s;
    memset(&s, 0, sizeof s);
    int tmax = small() ? 6 : 24;
    s.n = tu_int(1, 4); s.B = tu_int(1, small() ? 18 : 24); s.F = tu_int(1, 12);
    for (int i = 0; i < s.n; i++) { s.T[i] = tu_int(1, tmax); s.H[i] = tu_int(1, small() ? 24 : hmax); s.L[i] = tu_int(1, 2); }
    if (tu_int(0, 1)) s.T[tu_int(0, s.n - 1)] = 1;
    s.h_last_only = tu_int(0, 1);
    return s;
}

static void test_fused_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    /* fixed odd shapes: H 17, 33, 8 (not multiples of 16), B 17 (two full tiles and one row), T = 1,
     * the gradient of h_last only */
    net odd = {3, 17, 5, {1, 23, 9}, {17, 33, 8}, {2, 1, 3}, 1};
    /* whole tiles: B 32, H 32 and 48 (the kernels' loops without bounds) */
    net whole = {2, 32, 7, {6, 3}, {32, 48}, {1, 2}, 0};
    for (int i = 0; small() && i < 3; i++) { /* the sanitizers: 4 steps at most (the loops' code is the same) */
        if (odd.T[i] > 4) odd.T[i] = 4;
        if (i < whole.n && whole.T[i] > 4) whole.T[i] = 4;
    }
    /* blocks a row tile: the cost model's choice (LSTMs of one net may differ), and 1, 2 and 4
     * forced (clusters on sm_90; H rounds up to 16 units a block) */
    static const int fbs[] = {1, 2, 4};
    for (int p = MB_F32; p <= MB_F16; p++) {
        check_net(gpu, cpu, &odd, (mb_dtype)p, 0);
        check_net(gpu, cpu, &odd, (mb_dtype)p, 4);
        check_net(gpu, cpu, &whole, (mb_dtype)p, 2);
        net r = random_net(p == MB_F32 ? 48 : 64);
        check_net(gpu, cpu, &r, (mb_dtype)p, fbs[tu_int(0, 2)]);
    }
    tu_device_close(cpu); tu_device_close(gpu);
}

/* The path an LSTM of hidden size H takes (mb_lstm_fused_blocks: blocks a row tile, 0: the per-step
 * gemms), checkpoint ck, fused_blocks fb; -1 when mb_lstm_create refuses it (its result in *r). */
static int fused_of(mb_device *dev, int64_t H, int ck, mb_dtype prec, int fb, mb_result *r) {
    mb_params *p;
    mb_lstm *l = NULL;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config c;
    memset(&c, 0, sizeof c);
    c.input_size = 3; c.hidden_size = H; c.checkpoint = ck; c.max_steps = 5; c.max_batch = 4; c.precision = prec;
    c.fused_blocks = fb;
    *r = mb_lstm_create(&l, p, &c);
    int f = l ? mb_lstm_fused_blocks(l) : -1;
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    return f;
}

/* The fused path's one decision (mb__lstm_fused_choice): a GPU, full storage, and of the block
 * counts a row tile whose shared memory fits, the cheapest by the latency model, else the
 * per-step gemms; fused_blocks forces one (refused where it does not fit) or the gemms. */
static void test_fused_choice(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    size_t optin = 0;
    int maxcl = 0;
    mb__cuda_fused_limits(gpu, &optin, &maxcl);
    printf("shared memory per block (opt-in): %zu bytes, clusters of up to %d blocks\n", optin, maxcl);
    int64_t hs[] = {1, 17, 64, 96, 128, 144, 160, 256, 320};
    mb_result r;
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        for (int p = MB_F32; p <= MB_F16; p++) {
            mb_dtype op = (mb_dtype)p;
            int want = 0; /* the cheapest that fits, by the model */
            for (int cl = 1; cl <= maxcl; cl *= 2)
                if (mb__lstm_fused_smem(hs[i], op, cl) && mb__lstm_fused_smem(hs[i], op, cl) <= optin &&
                    mb__lstm_fused_threads(hs[i], cl) <= MB__FUSED_THREADS_MAX &&
                    mb__lstm_step_us(hs[i], cl) < mb__lstm_step_us(hs[i], want))
                    want = cl;
            printf("H=%lld %s: %d\n", (long long)hs[i], mb_dtype_name(op), want);
            if (fused_of(gpu, hs[i], -1, op, 0, &r) != want)
                fail_msg("H=%lld %s: fused is not %d", (long long)hs[i], mb_dtype_name(op), want);
            /* checkpoint 0 on the GPU: full storage when it fits (these shapes), so fused as -1 is */
            if (fused_of(gpu, hs[i], 0, op, 0, &r) != want)
                fail_msg("H=%lld %s: the GPU's auto checkpoint is not fused %d", (long long)hs[i], mb_dtype_name(op), want);
            if (fused_of(gpu, hs[i], 3, op, 0, &r) || fused_of(cpu, hs[i], -1, op, 0, &r) ||
                fused_of(cpu, hs[i], 0, op, 0, &r) || fused_of(gpu, hs[i], -1, op, -1, &r))
                fail_msg("H=%lld: fused with checkpointing, on the CPU or with fused_blocks -1", (long long)hs[i]);
            for (int fb = 1; fb <= 4; fb *= 2) { /* forced: that count where it fits, else refused */
                int fits = mb__lstm_fused_fits(gpu, hs[i], op, fb), f = fused_of(gpu, hs[i], -1, op, fb, &r);
                if (fits ? f != fb : (f != -1 || r != MB_ERR_UNSUPPORTED))
                    fail_msg("H=%lld %s fused_blocks %d: %d (result %d)", (long long)hs[i], mb_dtype_name(op), fb, f, r);
            }
        }
    /* bad values and forcing where there is no fused path */
    assert_int_equal(fused_of(gpu, 32, -1, MB_BF16, 3, &r), -1);
    assert_int_equal(r, MB_ERR_INVALID_ARG);
    assert_int_equal(fused_of(gpu, 32, -1, MB_BF16, -2, &r), -1);
    assert_int_equal(r, MB_ERR_INVALID_ARG);
    assert_int_equal(fused_of(gpu, 32, 3, MB_BF16, 1, &r), -1); /* checkpointed */
    assert_int_equal(r, MB_ERR_UNSUPPORTED);
    assert_int_equal(fused_of(cpu, 32, -1, MB_BF16, 1, &r), -1);
    assert_int_equal(r, MB_ERR_UNSUPPORTED);
    mb_clear_error();
    if (optin >= (227u << 10) && maxcl >= 4) { /* an H100: every size here but f32 above 96 runs fused */
        assert_true(fused_of(gpu, 64, -1, MB_F32, 0, &r) && fused_of(gpu, 128, -1, MB_BF16, 0, &r) &&
                    fused_of(gpu, 256, -1, MB_BF16, 0, &r) == 4 && fused_of(gpu, 256, -1, MB_F16, 0, &r) == 4);
        assert_int_equal(fused_of(gpu, 32, -1, MB_BF16, 0, &r), 1);
    }
    tu_device_close(cpu); tu_device_close(gpu);
}

#ifdef CUDASIM
/* Kernel launches + cuBLAS calls of one forward + backward of the example's five encoders. */
static unsigned long long step_calls(mb_device *gpu, const net *s) {
    ins in = make_inputs(s);
    size_t n;
    int fused;
    float *warm = run(gpu, s, -1, MB_F32, 0, 1, &in, &n, &fused); /* setup costs are counted too: run twice */
    cudasim::stats a = cudasim::get_stats();
    float *o = run(gpu, s, -1, MB_F32, 0, 1, &in, &n, &fused);
    cudasim::stats b = cudasim::get_stats();
    free(warm); free(o); free(in.params); free(in.data);
    return b.launches - a.launches + b.cublas_calls - a.cublas_calls;
}

static void test_fused_launches_independent_of_T(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0);
    net s = {5, 16, 8, {60, 36, 24, 12, 6}, {32, 32, 32, 32, 32}, {1, 1, 1, 1, 1}, 0}, s2 = s;
    for (int i = 0; i < s.n; i++) {
        if (small()) s.T[i] /= 6;
        s2.T[i] = 2 * s.T[i];
    }
    unsigned long long a = step_calls(gpu, &s), b = step_calls(gpu, &s2);
    printf("kernel launches + cuBLAS calls (setup, forward, backward, read-back) at T = %d/%d/%d/%d/%d: %llu, at "
           "twice the T: %llu\n", s.T[0], s.T[1], s.T[2], s.T[3], s.T[4], a, b);
    assert_int_equal(a, b);
    tu_device_close(gpu);
}
#endif

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_fused_matches_cpu),
        tu_cuda_test(test_fused_choice),
#ifdef CUDASIM
        tu_cuda_test(test_fused_launches_independent_of_T),
#endif
    };
    return cmocka_run_group_tests_name("cuda_lstm_fused", tests, NULL, NULL);
}
