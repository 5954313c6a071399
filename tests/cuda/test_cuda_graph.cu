/* The graph API on the CUDA backend: a captured sequence of library calls (zero_grad, two LSTMs'
 * forward and backward through mb_lstm_*_many, i.e. forked onto their streams and joined back, a
 * gemm and an AdamW step) replayed twice gives the same bits as running it twice directly, in f32
 * and bf16, for fresh random shapes and values; mb_graph_run captures once and launches after,
 * and falls back (logged once) when its function cannot be captured; the state errors. Runs under
 * the simulator (tests/cudasim) and on a GPU; without either every test skips. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

enum { NL = 2 };
typedef struct model {
    mb_device *dev;
    mb_params *p;
    mb_lstm *l[NL];
    mb_adamw *o;
    int64_t B, T[NL], F, H, K;
    float *x[NL], *h[NL], *dh[NL], *w, *y; /* device: inputs, final h, its gradient, head, head output */
    float *init;                            /* host: the initial parameters */
    size_t total;
} model;

static float *dev_copy(mb_device *dev, const float *host, size_t n) {
    float *d = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, n * sizeof(float), (void **)&d));
    if (host) tu_ok(mb_copy(dev, 0, d, host, n * sizeof(float)));
    else tu_ok(mb_zero(dev, 0, d, n * sizeof(float)));
    return d;
}
static float *dev_random(mb_device *dev, size_t n) {
    float *h = (float *)malloc(n * sizeof(float));
    tu_fill(h, n, -1.0f, 1.0f);
    float *d = dev_copy(dev, h, n);
    tu_ok(mb_sync(dev, 0));
    free(h);
    return d;
}

static void model_open(model *m, mb_device *dev, mb_dtype prec) {
    memset(m, 0, sizeof *m);
    m->dev = dev;
    m->B = tu_int(1, 5); m->F = tu_int(1, 4); m->H = tu_int(1, 9); m->K = tu_int(1, 3);
    tu_ok(mb_params_create(&m->p, dev));
    for (int i = 0; i < NL; i++) {
        m->T[i] = tu_int(1, 7);
        mb_lstm_config c;
        memset(&c, 0, sizeof c);
        char prefix[16];
        snprintf(prefix, sizeof prefix, "e%d.", i);
        c.input_size = m->F; c.hidden_size = m->H; c.layers = i + 1; c.prefix = prefix;
        c.max_steps = m->T[i]; c.max_batch = m->B; c.stream = 2 + i; c.precision = prec;
        c.checkpoint = i == 0 ? -1 : 0;
        tu_ok(mb_lstm_create(&m->l[i], m->p, &c));
    }
    tu_ok(mb_params_finalize(m->p));
    tu_ok(mb_params_init(m->p, tu_next()));
    mb_adamw_config oc = mb_adamw_config_default();
    oc.max_grad_norm = 1.0f;
    tu_ok(mb_adamw_create(&m->o, m->p, &oc));
    m->total = mb_params_total(m->p);
    m->init = (float *)malloc(m->total * sizeof(float));
    tu_ok(mb_params_get(m->p, m->init));
    for (int i = 0; i < NL; i++) {
        m->x[i] = dev_random(dev, (size_t)(m->B * m->T[i] * m->F));
        m->h[i] = dev_copy(dev, NULL, (size_t)(m->B * m->H));
        m->dh[i] = dev_random(dev, (size_t)(m->B * m->H));
    }
    m->w = dev_random(dev, (size_t)(m->H * m->K));
    m->y = dev_copy(dev, NULL, (size_t)(m->B * m->K));
    tu_ok(mb_sync(dev, -1));
}

static void model_close(model *m) {
    for (int i = 0; i < NL; i++) {
        mb_free(m->dev, m->x[i]); mb_free(m->dev, m->h[i]); mb_free(m->dev, m->dh[i]);
        mb_lstm_destroy(m->l[i]);
    }
    mb_free(m->dev, m->w); mb_free(m->dev, m->y);
    mb_adamw_destroy(m->o);
    mb_params_destroy(m->p);
    free(m->init);
}

/* Back to the initial parameters, zero moments and step count. */
static void model_reset(model *m) {
    tu_ok(mb_params_set(m->p, m->init));
    tu_ok(mb_zero(m->dev, 0, mb_adamw_m(m->o), m->total * sizeof(float)));
    tu_ok(mb_zero(m->dev, 0, mb_adamw_v(m->o), m->total * sizeof(float)));
    tu_ok(mb_adamw_set_steps(m->o, 0));
    tu_ok(mb_sync(m->dev, -1));
}

// snippet: graph-step
/* The captured sequence: one training-like step, no host sync, no allocation. */
static mb_result model_step(void *user) {
    model *m = (model *)user;
    mb_lstm_call c[NL];
    memset(c, 0, sizeof c);
    for (int i = 0; i < NL; i++) {
        c[i].lstm = m->l[i]; c[i].x = m->x[i]; c[i].B = m->B; c[i].T = m->T[i]; c[i].h_last = m->h[i];
        c[i].dh_last = m->dh[i];
    }
    MB_TRY(mb_params_zero_grad(m->p));
    MB_TRY(mb_lstm_forward_many(c, NL));
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = m->B; g.n = m->K; g.k = m->H; g.alpha = 1.0f; g.a = m->h[1]; g.lda = m->H; g.b = m->w; g.ldb = m->K;
    g.c = m->y; g.ldc = m->K;
    MB_TRY(mb_gemm(m->dev, &g));
    MB_TRY(mb_lstm_backward_many(c, NL));
    return mb_adamw_step(m->o, 1e-2f, NULL);
}
// end snippet

/* Everything the steps wrote, on the host: params, grads, moments, h, y. */
typedef struct snap { float *v; size_t n; int64_t steps; } snap;
static snap model_snap(model *m) {
    size_t hn = (size_t)(m->B * m->H), yn = (size_t)(m->B * m->K);
    snap s;
    s.n = 4 * m->total + NL * hn + yn;
    s.v = (float *)malloc(s.n * sizeof(float));
    float *q = s.v;
    const float *src[4] = {mb_params_data(m->p), mb_params_grad(m->p), mb_adamw_m(m->o), mb_adamw_v(m->o)};
    for (int i = 0; i < 4; i++, q += m->total) tu_ok(mb_copy(m->dev, 0, q, src[i], m->total * sizeof(float)));
    for (int i = 0; i < NL; i++, q += hn) tu_ok(mb_copy(m->dev, 0, q, m->h[i], hn * sizeof(float)));
    tu_ok(mb_copy(m->dev, 0, q, m->y, yn * sizeof(float)));
    tu_ok(mb_sync(m->dev, -1));
    tu_ok(mb_adamw_steps(m->o, &s.steps));
    return s;
}
static void snap_equal(const snap *a, const snap *b) {
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->steps, b->steps);
    assert_memory_equal(a->v, b->v, a->n * sizeof(float));
}

#ifdef CUDASIM
static unsigned long long sim_work(void) {
    cudasim::stats s = cudasim::get_stats();
    return s.launches + s.cublas_calls;
}
#endif

/* Two direct steps vs one capture replayed twice (and vs mb_graph_run twice): the same bits. */
static void test_graph_replay_bitwise(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    for (int pi = 0; pi < 2; pi++) {
        model m;
        model_open(&m, dev, pi ? MB_BF16 : MB_F32);
        model_reset(&m);
#ifdef CUDASIM
        cudasim::reset_stats();
#endif
        tu_ok(model_step(&m));
        tu_ok(model_step(&m));
        snap eager = model_snap(&m);
        assert_int_equal(eager.steps, 2);
#ifdef CUDASIM
        unsigned long long work = sim_work();
#endif
        model_reset(&m);
        // snippet: graph-capture
        mb_graph *g = NULL;
        tu_ok(mb_graph_begin(dev, MB_STREAM_COMPUTE));
        tu_ok(model_step(&m)); /* recorded, not run */
        tu_ok(mb_graph_end(dev, &g));
        // end snippet
        assert_true(mb_graph_nodes(g) > 10);
        float *after = (float *)malloc(m.total * sizeof(float));
        tu_ok(mb_params_get(m.p, after)); /* the capture ran nothing */
        assert_memory_equal(after, m.init, m.total * sizeof(float));
        free(after);
#ifdef CUDASIM
        cudasim::reset_stats();
#endif
        tu_ok(mb_graph_launch(g));
        tu_ok(mb_graph_launch(g));
        tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
#ifdef CUDASIM
        assert_int_equal(sim_work(), work); /* the same kernels and cuBLAS calls, as nodes */
        assert_int_equal(cudasim::get_stats().graph_launches, 2);
        assert_int_equal(cudasim::get_stats().graph_nodes, 2 * mb_graph_nodes(g));
#endif
        snap replay = model_snap(&m);
        snap_equal(&eager, &replay);
        mb_graph_destroy(g);
        /* mb_graph_run: captures and launches, then launches */
        model_reset(&m);
        // snippet: graph-run
        mb_graph *step = NULL; /* the first call captures and launches, the later ones launch */
        tu_ok(mb_graph_run(&step, dev, MB_STREAM_COMPUTE, model_step, &m));
        // end snippet
        g = step;
        assert_non_null(g);
        mb_graph *first = g;
        tu_ok(mb_graph_run(&g, dev, MB_STREAM_COMPUTE, model_step, &m));
        assert_ptr_equal(g, first);
        snap run = model_snap(&m);
        snap_equal(&eager, &run);
        mb_graph_destroy(g);
        free(eager.v); free(replay.v); free(run.v);
        model_close(&m);
    }
    tu_device_close(dev);
}

typedef struct counted { int n; char last[2048]; } counted;
static void count_log(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    (void)file; (void)line;
    counted *c = (counted *)user;
    if (level != MB_LOG_WARN) return;
    c->n++;
    snprintf(c->last, sizeof c->last, "%s", msg);
}

typedef struct syncing { mb_device *dev; float *a, *b; int calls; } syncing;
static mb_result copy_then_sync(void *user) { /* b = a (a kernel), then a host sync */
    syncing *s = (syncing *)user;
    s->calls++;
    MB_TRY(mb_act_forward(s->dev, 0, MB_ACT_IDENTITY, s->a, s->b, 4));
    return mb_sync(s->dev, 0);
}

/* A function that syncs cannot be captured: mb_graph_run says so once and runs it directly. */
static void test_graph_run_falls_back(void **state) {
    (void)state;
    tu_device_close(tu_open_cuda_or_skip(0));
    tu_cuda_capture_errors_expected();
    counted log;
    memset(&log, 0, sizeof log);
    mb_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = MB_CUDA; cfg.streams = 2;
    cfg.log.fn = count_log; cfg.log.user = &log; cfg.log.max = MB_LOG_INFO;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, &cfg));
    tu_hold(TU_DEVICE, dev);
    const float ones[4] = {1, 2, 3, 4};
    syncing s = {dev, dev_copy(dev, ones, 4), dev_copy(dev, NULL, 4), 0};
    tu_ok(mb_sync(dev, -1));
    mb_graph *g = NULL;
    for (int rep = 0; rep < 3; rep++) {
        tu_ok(mb_graph_run(&g, dev, 0, copy_then_sync, &s));
        assert_null(g);
    }
    assert_int_equal(s.calls, 4); /* captured (and discarded) once, then directly three times */
    assert_int_equal(log.n, 1);
    assert_non_null(strstr(log.last, "running the calls directly"));
    assert_non_null(strstr(log.last, "cudaStreamSynchronize"));
    float out[4];
    tu_ok(mb_copy(dev, 0, out, s.b, sizeof out));
    tu_ok(mb_sync(dev, 0));
    assert_memory_equal(out, ones, sizeof out);
    mb_free(dev, s.a); mb_free(dev, s.b);
    tu_device_close(dev);
}

/* Out-of-order calls, and a sync inside a capture: errors, after which the device works. */
static void test_graph_errors(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    tu_cuda_capture_errors_expected();
    mb_graph *g = (mb_graph *)1;
    assert_int_equal(mb_graph_supported(dev), 1);
    tu_assert_error(mb_graph_end(dev, &g), MB_ERR_STATE, "no capture under way");
    assert_null(g);
    tu_assert_error(mb_graph_begin(dev, 4), MB_ERR_INVALID_ARG, "stream 4 out of range");
    tu_ok(mb_graph_begin(dev, 2));
    tu_assert_error(mb_graph_begin(dev, 0), MB_ERR_STATE, "a capture on stream 2 is under way");
    assert_int_not_equal(mb_sync(dev, 2), MB_OK); /* a host sync of the capturing stream */
    tu_assert_error(mb_graph_end(dev, &g), MB_ERR_UNSUPPORTED, "cannot be captured");
    assert_null(g);
    tu_ok(mb_graph_begin(dev, 2)); /* a fresh capture works, and an empty graph launches */
    tu_ok(mb_graph_end(dev, &g));
    assert_int_equal(mb_graph_nodes(g), 0);
    tu_ok(mb_graph_launch(g));
    tu_ok(mb_sync(dev, -1));
    mb_graph_destroy(g);
    mb_graph_destroy(NULL);
    tu_ok(mb_graph_begin(dev, 0)); /* closing the device ends a capture left open */
    tu_device_close(dev);
    dev = tu_open_cuda_or_skip(0);
    float *d = dev_copy(dev, NULL, 4); /* allocations are allowed again */
    mb_free(dev, d);
    tu_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_graph_replay_bitwise),
        tu_cuda_test(test_graph_run_falls_back),
        tu_cuda_test(test_graph_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
