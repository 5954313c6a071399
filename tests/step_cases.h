/* The step API's cases (issue 15: no host sync in a step), run on any device: the CPU test
 * (test_step.c) and the CUDA one (cuda/test_cuda_step.cu, under the simulator or a GPU) share
 * them. Data come from the library's Philox RNG under a seed drawn by the test (printed, replayed
 * from MB_TEST_SEED), so both backends see the same numbers. */
#ifndef MB_STEP_CASES_H
#define MB_STEP_CASES_H

#include "testutil.h"

/* A device copy of n floats drawn from U(-b, b) under (seed, stream). */
static float *sc_upload_rand(mb_device *dev, size_t n, uint64_t seed, uint64_t stream, float b) {
    float *h = tu_alloc_f32(n), *d = NULL;
    for (size_t i = 0; i < n; i++) h[i] = mb_rng_symmetric(seed, stream, i, b);
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, n * sizeof(float), (void **)&d));
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, d, h, n * sizeof(float)));
    tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
    free(h);
    return d;
}

/* The mean loss of pred against target as the host computes it (double). */
static double sc_mean_loss(uint64_t seed, int huber, size_t n) {
    double s = 0;
    float g;
    for (size_t i = 0; i < n; i++)
        s += (double)mb__loss_elem(huber, 1.0f, mb_rng_symmetric(seed, 1, i, 2.0f), mb_rng_symmetric(seed, 2, i, 2.0f), &g);
    return s / (double)n;
}

/* Poll a meter until its oldest read in flight lands (bounded: 20 s), counting the polls. */
static int sc_next_until_landed(mb_meter *m) {
    int landed = 0, polls = 0;
    for (; polls < 20000 && !landed; polls++) {
        tu_ok(mb_meter_next(m, 0, &landed));
        if (!landed) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!landed) fail_msg("mb_meter_next: the read did not land in 20 s");
    return polls;
}

/* The landed read's slot: sum and weight against `times` rounds of `want` over B samples. */
static void sc_meter_expect(mb_meter *m, int slot, double want, int64_t B, int64_t times, const char *what) {
    double sum = 0, w = 0, t = (double)times;
    tu_ok(mb_meter_value(m, slot, &sum, &w));
    if (fabs(sum - want * t) > 1e-12 * fabs(want * t) + 1e-300 || w != (double)(B * times))
        fail_msg("meter %s: slot %d sum %.17g weight %g, want %.17g and %lld", what, slot, sum, w, want * t,
                 (long long)(B * times));
}

/* mb_loss adds mean * B and B into its meter slot, rounds times, with a read queued after each
 * of the first `depth`: they land in order, each with the sums after its round; one more read
 * while depth are in flight is refused; a read with reset returns the sums and zeroes them. */
static void sc_meter_loss(mb_device *dev, uint64_t seed) {
    int64_t B = tu_int(1, 300), K = tu_int(1, 5), rounds = tu_int(1, 6), depth = tu_int(1, 4);
    int huber = tu_int(0, 1);
    size_t n = (size_t)(B * K);
    float *pred = sc_upload_rand(dev, n, seed, 1, 2.0f), *tgt = sc_upload_rand(dev, n, seed, 2, 2.0f);
    mb_meter *m;
    tu_ok(mb_meter_create(&m, dev, 3, (int)depth));
    mb_loss_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = huber ? MB_LOSS_HUBER : MB_LOSS_MSE;
    cfg.acc = mb_meter_slot(m, 1);
    int64_t queued = 0;
    for (int r = 0; r < rounds; r++) {
        tu_ok(mb_loss(dev, MB_STREAM_COMPUTE, &cfg, pred, tgt, B, K, 1.0f, NULL, NULL, NULL)); /* acc alone */
        if (queued < depth) {
            tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 0));
            queued++;
        }
    }
    assert_int_equal(mb_meter_pending(m), queued);
    if (queued == depth) tu_assert_error(mb_meter_read(m, MB_STREAM_COMPUTE, 0), MB_ERR_STATE, "in flight");
    double want = sc_mean_loss(seed, huber, n) * (double)B;
    for (int64_t i = 1; i <= queued; i++) { /* in the order queued */
        sc_next_until_landed(m);
        sc_meter_expect(m, 1, want, B, i, "queued read");
    }
    tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 1));
    tu_ok(mb_meter_wait(m));
    sc_meter_expect(m, 1, want, B, rounds, "read with reset");
    sc_meter_expect(m, 0, 0.0, 0, 0, "unused slot");
    assert_int_equal(mb_meter_reads(m), queued + 1);
    /* after the reset, one more batch; a read without reset; the host polls */
    tu_ok(mb_loss(dev, MB_STREAM_COMPUTE, &cfg, pred, tgt, B, K, 1.0f, NULL, NULL, NULL));
    tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 0));
    sc_next_until_landed(m);
    sc_meter_expect(m, 1, want, B, 1, "after reset");
    assert_int_equal(mb_meter_reads(m), queued + 2);
    assert_int_equal(mb_meter_pending(m), 0);
    mb_meter_destroy(m);
    mb_free(dev, pred);
    mb_free(dev, tgt);
}

static void sc_meter_bad_input(mb_device *dev) {
    mb_meter *m = NULL;
    double s, w;
    int landed = 1;
    tu_assert_error(mb_meter_create(&m, dev, 0, 1), MB_ERR_INVALID_ARG, "slots");
    tu_assert_error(mb_meter_create(&m, dev, 1, 0), MB_ERR_INVALID_ARG, "depth");
    tu_assert_error(mb_meter_create(&m, dev, 1, 4097), MB_ERR_INVALID_ARG, "depth");
    tu_assert_error(mb_meter_create(NULL, dev, 1, 1), MB_ERR_INVALID_ARG, "NULL");
    tu_ok(mb_meter_create(&m, dev, 2, 2));
    assert_null(mb_meter_slot(m, 2));
    assert_null(mb_meter_slot(m, -1));
    assert_null(mb_meter_slot(NULL, 0));
    tu_assert_error(mb_meter_value(m, 2, &s, &w), MB_ERR_INVALID_ARG, "slot 2");
    tu_assert_error(mb_meter_read(m, 99, 0), MB_ERR_INVALID_ARG, "stream");
    tu_assert_error(mb_meter_next(m, 0, NULL), MB_ERR_INVALID_ARG, "NULL");
    tu_ok(mb_meter_next(m, 1, &landed)); /* nothing in flight: nothing lands, nothing waits */
    assert_int_equal(landed, 0);
    tu_ok(mb_meter_wait(m));
    assert_int_equal(mb_meter_reads(m), 0);
    assert_int_equal(mb_meter_pending(NULL), 0);
    tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 0)); /* destroyed with reads in flight: they land first */
    tu_ok(mb_meter_read(m, MB_STREAM_COMPUTE, 1));
    mb_meter_destroy(m);
    mb_meter_destroy(NULL);
}

/* What mb_meter_step's and mb_meter_fold's on_read saw: the read ids, in the order they came,
 * and each one's delta of slot 0; a call numbered fail_at returns a planted error instead. */
typedef struct sc_lag {
    int n, fail_at;
    int64_t id[128];
    double sum[128], w[128];
} sc_lag;

static mb_result sc_lag_landed(void *user, const mb_meter *m, int64_t id) {
    sc_lag *l = (sc_lag *)user;
    if (l->n == l->fail_at) return MB_FAIL(NULL, MB_ERR_IO, "sc_lag_landed: planted");
    tu_ok(mb_meter_delta(m, 0, &l->sum[l->n], &l->w[l->n]));
    l->id[l->n++] = id;
    return MB_OK;
}

/* Lagged per-step reads (train_multitf's loop): before each step the slot is set to its running
 * sums (steps' integer {sum, weight}, exact in doubles), mb_meter_step queues its read; folds at
 * random points. Every step's read lands exactly once, in order, in a later call than the one
 * that queued it, with its own step's sum and weight as the delta (from 0 again after a fold);
 * a fold's value is the sums since the fold before; an error of on_read is the call's. */
static void sc_meter_lagged(mb_device *dev) {
    int depth = tu_int(1, 4), steps = tu_int(1, 40), step_of[128], k = 0;
    double run[40][2], cum[40][2], acc[2] = {0, 0}, sum, w;
    sc_lag l;
    memset(&l, 0, sizeof l);
    l.fail_at = -1;
    mb_meter *m;
    tu_ok(mb_meter_create(&m, dev, 2, depth));
    for (int i = 0; i < 128; i++) step_of[i] = -1;
    for (int s = 0; s < steps; s++) {
        double c[2] = {(double)tu_int(-1000, 1000), (double)tu_int(1, 50)};
        acc[0] += c[0], acc[1] += c[1];
        run[s][0] = c[0], run[s][1] = c[1];
        cum[s][0] = acc[0], cum[s][1] = acc[1]; /* kept: the copy may read it after the call */
        tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, mb_meter_slot(m, 0), cum[s], sizeof cum[s])); /* "the step" */
        int64_t id = -1;
        int before = l.n;
        tu_ok(mb_meter_step(m, MB_STREAM_COMPUTE, sc_lag_landed, &l, &id));
        assert_in_range(id, 0, 127);
        step_of[id] = s;
        for (int j = before; j < l.n; j++)
            if (l.id[j] >= id) fail_msg("read %lld landed in the call that queued it", (long long)l.id[j]);
        if (tu_int(0, 4) && s + 1 < steps) continue;
        tu_ok(mb_meter_fold(m, MB_STREAM_COMPUTE, sc_lag_landed, &l));
        tu_ok(mb_meter_value(m, 0, &sum, &w));
        if (sum != acc[0] || w != acc[1]) fail_msg("fold after step %d: %g %g, want %g %g", s, sum, w, acc[0], acc[1]);
        acc[0] = acc[1] = 0;
    }
    assert_int_equal(l.n, steps);
    assert_int_equal(mb_meter_pending(m), 0);
    for (int j = 0; j < l.n; j++) {
        int s = l.id[j] >= 0 && l.id[j] < 128 ? step_of[l.id[j]] : -1;
        if (s != k) fail_msg("landed #%d: read %lld is step %d, want step %d", j, (long long)l.id[j], s, k);
        if (l.sum[j] != run[s][0] || l.w[j] != run[s][1])
            fail_msg("step %d: delta %g %g, want %g %g", s, l.sum[j], l.w[j], run[s][0], run[s][1]);
        k++;
    }
    l.fail_at = l.n; /* the next read to land */
    tu_ok(mb_meter_step(m, MB_STREAM_COMPUTE, sc_lag_landed, &l, NULL));
    tu_assert_error(mb_meter_fold(m, MB_STREAM_COMPUTE, sc_lag_landed, &l), MB_ERR_IO, "planted");
    tu_assert_error(mb_meter_step(NULL, MB_STREAM_COMPUTE, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "NULL");
    tu_assert_error(mb_meter_step(m, 99, NULL, NULL, NULL), MB_ERR_INVALID_ARG, "stream");
    tu_assert_error(mb_meter_fold(NULL, MB_STREAM_COMPUTE, NULL, NULL), MB_ERR_INVALID_ARG, "NULL");
    tu_assert_error(mb_meter_delta(m, 2, &sum, &w), MB_ERR_INVALID_ARG, "slot 2");
    tu_assert_error(mb_meter_delta(m, 0, NULL, &w), MB_ERR_INVALID_ARG, "NULL");
    mb_meter_destroy(m);
}

/* Floats sc_scheduled_adamw may write to out: its parameters at their largest (w 40 x 50,
 * b 40), each padded to 64 floats as mb_params lays them out. */
#define SC_SCHEDULED_MAX_FLOATS ((40 * 50 + 63) / 64 * 64 + (40 + 63) / 64 * 64)

/* mb_adamw_step_scheduled against mb_adamw_step(mb_lr_at(s, i)) on twin parameters: the same bits
 * for every schedule, through a skipped step (an inf gradient) and past total_steps. Leaves the
 * scheduled twin's final parameters in out (mb_params_total floats, host; at most
 * SC_SCHEDULED_MAX_FLOATS). */
static void sc_scheduled_adamw(mb_device *dev, uint64_t seed, mb_lr_kind kind, float *out, size_t *np) {
    mb_params *p[2];
    int64_t ws[2] = {tu_int(1, 40), tu_int(1, 50)}, bs[1] = {ws[0]};
    for (int t = 0; t < 2; t++) {
        tu_ok(mb_params_create(&p[t], dev));
        tu_ok(mb_params_add(p[t], "w", 2, ws, 0.5f, NULL));
        tu_ok(mb_params_add(p[t], "b", 1, bs, 0.5f, NULL));
        tu_ok(mb_params_finalize(p[t]));
        tu_ok(mb_params_init(p[t], seed));
    }
    size_t n = mb_params_total(p[0]);
    assert_true(n <= SC_SCHEDULED_MAX_FLOATS); /* out holds that many */
    mb_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.lr = 1e-2f;
    s.total_steps = 9;
    s.warmup_steps = kind == MB_LR_WARMUP_COSINE ? 3 : 0;
    s.min_lr = kind == MB_LR_WARMUP_COSINE ? 1e-4f : 0.0f;
    mb_adamw_config c = mb_adamw_config_default();
    c.max_grad_norm = 1.0f;
    mb_adamw *o[2];
    for (int t = 0; t < 2; t++) tu_ok(mb_adamw_create(&o[t], p[t], &c));
    float *g = tu_alloc_f32(n), *a = tu_alloc_f32(n), *b = tu_alloc_f32(n);
    int64_t steps = 12, skip_at = tu_int(0, 11);   /* 3 steps past total_steps */
    for (int64_t i = 0; i < steps; i++) {
        for (size_t e = 0; e < n; e++) g[e] = mb_rng_symmetric(seed, 10 + (uint64_t)i, e, 3.0f);
        if (i == skip_at) g[n - 1] = INFINITY;
        for (int t = 0; t < 2; t++) tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_grad(p[t]), g, n * sizeof(float)));
        float lr = 0;
        tu_ok(mb_lr_at(&s, i < s.total_steps ? i : s.total_steps - 1, &lr));
        tu_ok(mb_adamw_step(o[0], lr, NULL));
        tu_ok(mb_adamw_step_scheduled(o[1], &s, NULL));
        tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
    }
    tu_ok(mb_params_get(p[0], a));
    tu_ok(mb_params_get(p[1], b));
    if (memcmp(a, b, n * sizeof(float)) != 0) fail_msg("scheduled AdamW (kind %d) differs from mb_lr_at's", (int)kind);
    int64_t k, taken;
    float last = 0, want = 1;
    tu_ok(mb_adamw_schedule_step(o[1], &k));
    tu_ok(mb_adamw_steps(o[1], &taken));
    assert_int_equal(k, steps);          /* the skipped call counts for the schedule ... */
    assert_int_equal(taken, steps - 1);  /* ... not for the bias correction */
    tu_ok(mb_adamw_last_lr(o[1], &last));
    tu_ok(mb_lr_at(&s, s.total_steps - 1, &want));
    assert_true(last == want);
    tu_ok(mb_adamw_set_schedule_step(o[1], 1)); /* a resumed run: the rate of step 1 next */
    tu_ok(mb_adamw_step_scheduled(o[1], &s, NULL));
    tu_ok(mb_adamw_last_lr(o[1], &last));
    tu_ok(mb_lr_at(&s, 1, &want));
    assert_true(last == want);
    tu_ok(mb_adamw_schedule_step(o[1], &k));
    assert_int_equal(k, 2);
    tu_ok(mb_params_get(p[1], out));
    *np = n;
    tu_assert_error(mb_adamw_set_schedule_step(o[1], -1), MB_ERR_INVALID_ARG, "< 0");
    tu_assert_error(mb_adamw_step_scheduled(o[1], NULL, NULL), MB_ERR_INVALID_ARG, "NULL");
    s.lr = -1.0f;
    tu_assert_error(mb_adamw_step_scheduled(o[1], &s, NULL), MB_ERR_INVALID_ARG, "lr");
    for (int t = 0; t < 2; t++) { mb_adamw_destroy(o[t]); mb_params_destroy(p[t]); }
    free(g); free(a); free(b);
}

#endif
