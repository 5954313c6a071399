/* CUDA LSTM vs the CPU LSTM on fresh random inputs (relative norm error, fp32 < 1e-4),
 * device outputs poisoned with NaN before each run; checkpoint intervals against one
 * segment (k = T) on the GPU; two LSTMs on their own streams. Without a GPU every test
 * skips cleanly. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"


typedef struct shape { int B, T, F, H, L; } shape;
enum { O_OUT, O_HL, O_HN, O_CN, O_GRAD, O_DX, O_DH0, O_DC0, O_N };

typedef struct run_in { const float *p, *x, *h0, *c0, *r1, *r2; } run_in;

static void *dev_buf(mb_device *dev, size_t n, const float *init) {
    void *d = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, n * sizeof(float), &d));
    if (init) tu_ok(mb_copy(dev, 0, d, init, n * sizeof(float)));
    else { /* poison: all-ones bytes are NaN */
        unsigned char *nan = (unsigned char *)malloc(n * sizeof(float));
        memset(nan, 0xff, n * sizeof(float));
        tu_ok(mb_copy(dev, 0, d, nan, n * sizeof(float)));
        tu_ok(mb_sync(dev, 0));
        free(nan);
    }
    return d;
}

/* Forward + backward on dev with checkpoint ck and stream; results copied to host o[]. */
static void run_on(mb_device *dev, const shape *s, int ck, int stream, mb_dtype prec, const run_in *in, float **o,
                   size_t *n) {
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = s->F; cfg.hidden_size = s->H; cfg.layers = s->L; cfg.checkpoint = ck;
    cfg.max_steps = s->T; cfg.max_batch = s->B; cfg.stream = stream; cfg.precision = prec;
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_set(p, in->p));
    n[O_OUT] = (size_t)s->B * s->T * s->H; n[O_HL] = (size_t)s->B * s->H; n[O_HN] = n[O_CN] = (size_t)s->L * n[O_HL];
    n[O_GRAD] = mb_params_total(p); n[O_DX] = (size_t)s->B * s->T * s->F; n[O_DH0] = n[O_DC0] = n[O_HN];
    float *d[O_N];
    for (int i = 0; i < O_N; i++) d[i] = i == O_GRAD ? mb_params_grad(p) : (float *)dev_buf(dev, n[i], NULL);
    float *x = (float *)dev_buf(dev, n[O_DX], in->x), *h0 = (float *)dev_buf(dev, n[O_HN], in->h0);
    float *c0 = (float *)dev_buf(dev, n[O_HN], in->c0), *r1 = (float *)dev_buf(dev, n[O_OUT], in->r1);
    float *r2 = (float *)dev_buf(dev, n[O_HL], in->r2);
    tu_ok(mb_sync(dev, 0));
    tu_ok(mb_lstm_forward(l, x, s->B, s->T, h0, c0, d[O_OUT], d[O_HL]));
    tu_ok(mb_lstm_final_state(l, d[O_HN], d[O_CN]));
    tu_ok(mb_lstm_backward(l, r2, r1, d[O_DX], d[O_DH0], d[O_DC0]));
    tu_ok(mb_sync(dev, -1));
    for (int i = 0; i < O_N; i++) {
        o[i] = tu_alloc_f32(n[i]);
        tu_ok(mb_copy(dev, 0, o[i], d[i], n[i] * sizeof(float)));
    }
    tu_ok(mb_sync(dev, 0));
    for (int i = 0; i < O_N; i++) if (i != O_GRAD) mb_free(dev, d[i]);
    mb_free(dev, x); mb_free(dev, h0); mb_free(dev, c0); mb_free(dev, r1); mb_free(dev, r2);
    mb_lstm_destroy(l);
    mb_params_destroy(p);
}

static run_in make_inputs(mb_device *cpu, const shape *s) {
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_params_create(&p, cpu));
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = s->F; cfg.hidden_size = s->H; cfg.layers = s->L; cfg.max_steps = 1; cfg.max_batch = 1;
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, tu_next()));
    float *pv = tu_alloc_f32(mb_params_total(p));
    tu_ok(mb_params_get(p, pv));
    mb_lstm_destroy(l); mb_params_destroy(p);
    size_t ns = (size_t)s->L * s->B * s->H;
    float *x = tu_alloc_f32((size_t)s->B * s->T * s->F), *h0 = tu_alloc_f32(ns), *c0 = tu_alloc_f32(ns);
    float *r1 = tu_alloc_f32((size_t)s->B * s->T * s->H), *r2 = tu_alloc_f32((size_t)s->B * s->H);
    tu_fill(x, (size_t)s->B * s->T * s->F, -2, 2); tu_fill(h0, ns, -1, 1); tu_fill(c0, ns, -1, 1);
    tu_fill(r1, (size_t)s->B * s->T * s->H, -1, 1); tu_fill(r2, (size_t)s->B * s->H, -1, 1);
    run_in in = {pv, x, h0, c0, r1, r2};
    return in;
}
static void free_inputs(run_in *in) {
    free((void *)in->p); free((void *)in->x); free((void *)in->h0); free((void *)in->c0);
    free((void *)in->r1); free((void *)in->r2);
}

static const char *onames[O_N] = {"out_seq", "h_last", "h_n", "c_n", "grad", "dx", "dh0", "dc0"};

/* MB_TEST_SMALL (set under the sanitizers): sequences of at most 16 steps, the same code paths
 * (checkpoint intervals up to 7 included). */
static void small_shapes(shape *s, int n) {
    for (int i = 0; getenv("MB_TEST_SMALL") && i < n; i++)
        if (s[i].T > 16) s[i].T = 16;
}

static void test_cuda_lstm_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    shape shapes[] = {{tu_int(1, 8), tu_int(1, 30), tu_int(1, 20), tu_int(1, 40), tu_int(1, 3)},
                      {16, 480, 32, 64, 2}, {tu_int(1, 32), tu_int(100, 480), tu_int(1, 64), tu_int(1, 128), 1}};
    small_shapes(shapes, 3);
    for (int i = 0; i < 3; i++) {
        const shape *s = &shapes[i];
        run_in in = make_inputs(cpu, s);
        int ck = i == 1 ? 0 : tu_int(-1, 9);
        float *a[O_N], *b[O_N];
        size_t n[O_N];
        run_on(cpu, s, ck, 0, MB_F32, &in, a, n);
        run_on(gpu, s, ck, tu_int(0, 3), MB_F32, &in, b, n);
        for (int k = 0; k < O_N; k++) {
            double e = tu_rel_norm_err(b[k], a[k], n[k]);
            printf("B=%d T=%d F=%d H=%d L=%d ck=%d %s: rel err %.3g\n", s->B, s->T, s->F, s->H, s->L, ck, onames[k], e);
            if (!(e < 1e-4)) fail_msg("%s: relative norm error %g >= 1e-4", onames[k], e);
            free(a[k]); free(b[k]);
        }
        free_inputs(&in);
    }
    tu_device_close(cpu); tu_device_close(gpu);
}

static void test_cuda_lstm_checkpoint_bitwise(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    shape s = {tu_int(1, 16), tu_int(20, 120), tu_int(1, 32), tu_int(1, 64), tu_int(1, 2)};
    small_shapes(&s, 1);
    run_in in = make_inputs(cpu, &s);
    float *a[O_N], *b[O_N];
    size_t n[O_N];
    mb_dtype prec = (mb_dtype)tu_int(0, 2);
    /* one segment against shorter ones; full storage (k = -1, and k = 0 on the GPU when memory
     * allows) runs the fused recurrence, whose weight gradients sum in another order:
     * test_cuda_lstm_fused.cu */
    run_on(gpu, &s, s.T, 0, prec, &in, a, n);
    int ks[] = {1, 2, 7};
    for (int i = 0; i < 3; i++) {
        run_on(gpu, &s, ks[i], 0, prec, &in, b, n);
        for (int k = 0; k < O_N; k++) {
            if (memcmp(a[k], b[k], n[k] * sizeof(float)) != 0) fail_msg("k=%d: %s differs from k=T", ks[i], onames[k]);
            free(b[k]);
        }
    }
    for (int k = 0; k < O_N; k++) free(a[k]);
    free_inputs(&in);
    tu_device_close(cpu); tu_device_close(gpu);
}

/* bf16/f16 operands on the GPU against the CPU in f32 (< 2e-2) and, for information,
 * against the CPU with the same rounding points. */
static void test_cuda_lstm_low_precision(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    shape shapes[] = {{tu_int(1, 8), tu_int(1, 40), tu_int(1, 20), tu_int(1, 40), tu_int(1, 2)},
                      {32, 480, 16, 64, 1}};
    small_shapes(shapes, 2);
    for (int i = 0; i < 2; i++)
        for (int pi = 1; pi <= 2; pi++) {
            const shape *s = &shapes[i];
            mb_dtype prec = (mb_dtype)pi;
            run_in in = make_inputs(cpu, s);
            float *a[O_N], *c[O_N], *b[O_N];
            size_t n[O_N];
            run_on(cpu, s, 0, 0, MB_F32, &in, a, n);
            run_on(cpu, s, 0, 0, prec, &in, c, n);
            run_on(gpu, s, 0, 2, prec, &in, b, n);
            for (int k = 0; k < O_N; k++) {
                double e = tu_rel_norm_err(b[k], a[k], n[k]), e2 = tu_rel_norm_err(b[k], c[k], n[k]);
                printf("%s B=%d T=%d F=%d H=%d L=%d %s: vs cpu f32 %.3g, vs cpu %s %.3g\n", mb_dtype_name(prec), s->B,
                       s->T, s->F, s->H, s->L, onames[k], e, mb_dtype_name(prec), e2);
                if (!(e < 2e-2)) fail_msg("%s %s: relative norm error %g >= 2e-2", mb_dtype_name(prec), onames[k], e);
                free(a[k]); free(b[k]); free(c[k]);
            }
            free_inputs(&in);
        }
    tu_device_close(cpu); tu_device_close(gpu);
}

static void test_cuda_lstm_bad_stream(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0);
    mb_params *p;
    mb_lstm *l = NULL;
    tu_ok(mb_params_create(&p, gpu));
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = 3; cfg.hidden_size = 4; cfg.max_steps = 5; cfg.max_batch = 2; cfg.stream = 4;
    tu_assert_error(mb_lstm_create(&l, p, &cfg), MB_ERR_INVALID_ARG, "stream 4 out of range 0..3");
    mb_params_destroy(p);
    tu_device_close(gpu);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_lstm_matches_cpu),
        tu_cuda_test(test_cuda_lstm_checkpoint_bitwise),
        tu_cuda_test(test_cuda_lstm_low_precision),
        tu_cuda_test(test_cuda_lstm_bad_stream),
    };
    return cmocka_run_group_tests_name("cuda_lstm", tests, NULL, NULL);
}
