/* avg_case.h - weight averaging (mb_avg) checks run on any device: tests/test_avg.c on the
 * CPU, tests/cuda/test_cuda_numerics.cu on the GPU (and the simulator). Include after
 * testutil.h. Every function takes the device to test; data moves through mb_params_set/get
 * and mb_copy, so the same code reads device memory. */
#ifndef MB_AVG_CASE_H
#define MB_AVG_CASE_H

/* weight (3, 4) and bias (3,), as tests/golden/make_avg_golden.py's model */
static mb_params *avg_case_wb(mb_device *dev) {
    mb_params *p;
    int64_t ws[2] = {3, 4}, bs[1] = {3};
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_params_add(p, "weight", 2, ws, 0.5f, NULL));
    tu_ok(mb_params_add(p, "bias", 1, bs, 0.5f, NULL));
    tu_ok(mb_params_finalize(p));
    return p;
}

static void avg_case_read(FILE *f, float *x, int n) {
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%f", &x[i]) != 1) fail_msg("avg golden file truncated");
}

/* The averaged weights on the host (total floats). */
static void avg_case_get(mb_avg *a, mb_params *p, float *host) {
    mb_device *dev = mb_params_device(p);
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, host, mb_avg_data(a), mb_params_total(p) * sizeof(float)));
    tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
}

/* torch.optim.swa_utils.AveragedModel's averages of tests/golden/avg_golden.txt, within 1e-6
 * relative, and its n_averaged exactly. */
static void avg_case_torch_golden(mb_device *dev) {
    const char *path = "tests/golden/avg_golden.txt";
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    int scenarios = 0;
    assert_int_equal(fscanf(f, "%d", &scenarios), 1);
    assert_int_equal(scenarios, 4);
    for (int sc = 0; sc < scenarios; sc++) {
        int kind, updates, nw, nb;
        double decay;
        assert_int_equal(fscanf(f, "%d %lf %d %d %d", &kind, &decay, &updates, &nw, &nb), 5);
        assert_true(nw == 12 && nb == 3 && updates > 0);
        mb_params *p = avg_case_wb(dev);
        size_t total = mb_params_total(p);
        size_t ob = mb_params_info(p, 1)->offset;
        float *host = tu_alloc_f32(total), *got = tu_alloc_f32(total), want[15];
        mb_avg_config c = {decay, kind == 1 ? MB_AVG_SWA : MB_AVG_EMA};
        mb_avg *a;
        tu_ok(mb_avg_create(&a, p, &c));
        for (int s = 0; s < updates; s++) {
            avg_case_read(f, host, 12);
            avg_case_read(f, host + ob, 3);
            avg_case_read(f, want, 15);
            long long n_want = -1;
            assert_int_equal(fscanf(f, "%lld", &n_want), 1);
            tu_ok(mb_params_set(p, host));
            tu_ok(mb_avg_update(a, NULL));
            avg_case_get(a, p, got);
            tu_assert_close(got, want, 12, 1e-7, 1e-6, kind ? "SWA weight against torch" : "EMA weight against torch");
            tu_assert_close(got + ob, want + 12, 3, 1e-7, 1e-6, kind ? "SWA bias against torch" : "EMA bias against torch");
            int64_t n = -1;
            tu_ok(mb_avg_count(a, &n));
            assert_int_equal(n, n_want);
        }
        mb_avg_destroy(a);
        mb_params_destroy(p);
        free(host); free(got);
    }
    fclose(f);
}

/* A skipped optimizer step (an inf gradient) leaves the average and n_averaged alone; a taken
 * one updates it. Swapping twice restores both buffers bitwise; an update while swapped is
 * refused. */
static void avg_case_skip_and_swap(mb_device *dev) {
    mb_params *p = avg_case_wb(dev);
    size_t total = mb_params_total(p);
    tu_ok(mb_params_init(p, tu_next()));
    float *g = tu_alloc_f32(total), *before = tu_alloc_f32(total), *after = tu_alloc_f32(total);
    float *live = tu_alloc_f32(total), *live2 = tu_alloc_f32(total);
    mb_adamw *o;
    mb_avg *a;
    mb_avg_config c = {0.5, MB_AVG_EMA};
    tu_ok(mb_adamw_create(&o, p, NULL));
    tu_ok(mb_avg_create(&a, p, &c));
    tu_ok(mb_avg_update(a, NULL)); /* n = 1: a copy */
    tu_fill(g, total, -1, 1);
    g[tu_int(0, 11)] = INFINITY;
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_grad(p), g, total * sizeof(float)));
    tu_ok(mb_adamw_step(o, 1e-2f, NULL)); /* skipped on the device */
    avg_case_get(a, p, before);
    tu_ok(mb_avg_update(a, o));
    avg_case_get(a, p, after);
    int64_t n = 0;
    tu_ok(mb_avg_count(a, &n));
    assert_int_equal(n, 1);
    assert_memory_equal(before, after, total * sizeof(float));
    tu_fill(g, total, -1, 1); /* finite: the step is taken, the update runs */
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_grad(p), g, total * sizeof(float)));
    tu_ok(mb_adamw_step(o, 1e-2f, NULL));
    tu_ok(mb_avg_update(a, o));
    tu_ok(mb_avg_count(a, &n));
    assert_int_equal(n, 2);
    avg_case_get(a, p, after);
    assert_true(memcmp(before, after, total * sizeof(float)) != 0);
    tu_ok(mb_params_get(p, live));
    tu_ok(mb_avg_swap(a));
    assert_int_equal(mb_avg_swapped(a), 1);
    tu_ok(mb_params_get(p, live2));
    assert_memory_equal(live2, after, total * sizeof(float)); /* the average is live */
    tu_assert_error(mb_avg_update(a, NULL), MB_ERR_STATE, "swapped");
    tu_ok(mb_avg_swap(a));
    tu_ok(mb_params_get(p, live2));
    assert_memory_equal(live2, live, total * sizeof(float));
    avg_case_get(a, p, before);
    assert_memory_equal(before, after, total * sizeof(float));
    mb_avg_destroy(a);
    mb_adamw_destroy(o);
    mb_params_destroy(p);
    free(g); free(before); free(after); free(live); free(live2);
}

/* One update of n random weights on dev, EMA of a random decay or SWA at a random n_averaged,
 * against the CPU's (on the CPU itself: against torch's formulas written out here), bitwise:
 * the update is one elementwise pass with no reduction. */
static void avg_case_random(mb_device *dev) {
    int64_t shape[1] = {tu_int(1, 3) == 1 ? tu_int(1, 100) : tu_int(1000, 200000)};
    mb_params *p;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_params_add(p, "x", 1, shape, 1.0f, NULL));
    tu_ok(mb_params_finalize(p));
    size_t n = mb_params_total(p);
    float *x0 = tu_alloc_f32(n), *x1 = tu_alloc_f32(n), *got = tu_alloc_f32(n), *want = tu_alloc_f32(n);
    tu_fill(x0, n, -2, 2);
    tu_fill(x1, n, -2, 2);
    int swa = tu_int(0, 1);
    double decay = swa ? 0.0 : (tu_int(0, 1) ? 0.999 : tu_uniform(0.01f, 0.99f));
    int64_t n0 = tu_int(1, 5000);
    mb_avg_config c = {decay, swa ? MB_AVG_SWA : MB_AVG_EMA};
    mb_avg *a;
    tu_ok(mb_avg_create(&a, p, &c));
    tu_ok(mb_params_set(p, x0));
    tu_ok(mb_avg_update(a, NULL)); /* avg = x0 */
    tu_ok(mb_avg_set_count(a, n0));
    tu_ok(mb_params_set(p, x1));
    tu_ok(mb_avg_update(a, NULL));
    avg_case_get(a, p, got);
    float w = (float)(1.0 - decay), d = (float)(n0 + 1);
    for (size_t i = 0; i < n; i++) { /* torch: avg + (cur - avg) / (n + 1); lerp(avg, cur, 1 - decay) */
        float av = x0[i], cur = x1[i];
        want[i] = swa ? av + (cur - av) / d : w < 0.5f ? av + w * (cur - av) : cur - (cur - av) * (1.0f - w);
    }
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s n=%zu n_averaged=%lld decay=%.9g: element %zu %.9g, want %.9g", swa ? "SWA" : "EMA", n,
                     (long long)n0, decay, i, got[i], want[i]);
    int64_t count = 0;
    tu_ok(mb_avg_count(a, &count));
    assert_int_equal(count, n0 + 1);
    mb_avg_destroy(a);
    mb_params_destroy(p);
    free(x0); free(x1); free(got); free(want);
}

/* A checkpoint in the middle of an average: saved after k of 8 updates, loaded into a new
 * average, the rest applied: the same bits as 8 updates in one go. A file of another kind or
 * decay is refused and changes nothing. dir: a temporary directory. */
static void avg_case_resume(mb_device *dev, const char *dir) {
    for (int kind = 0; kind <= 1; kind++) {
        mb_params *p = avg_case_wb(dev);
        size_t total = mb_params_total(p);
        float *seq = tu_alloc_f32(8 * total), *whole = tu_alloc_f32(total), *resumed = tu_alloc_f32(total);
        tu_fill(seq, 8 * total, -1, 1);
        mb_avg_config c = {kind ? 0.0 : 0.75, kind ? MB_AVG_SWA : MB_AVG_EMA};
        mb_avg *a, *b, *other;
        tu_ok(mb_avg_create(&a, p, &c));
        for (int s = 0; s < 8; s++) {
            tu_ok(mb_params_set(p, seq + s * total));
            tu_ok(mb_avg_update(a, NULL));
        }
        avg_case_get(a, p, whole);
        mb_avg_destroy(a);
        int k = tu_int(1, 7);
        const char *path = tu_path(dir, "avg.ckpt");
        tu_ok(mb_avg_create(&a, p, &c));
        for (int s = 0; s < k; s++) {
            tu_ok(mb_params_set(p, seq + s * total));
            tu_ok(mb_avg_update(a, NULL));
        }
        mb_ckpt_writer *w;
        tu_ok(mb_ckpt_writer_create(&w, dev));
        tu_ok(mb_ckpt_add_params(w, p));
        tu_ok(mb_ckpt_add_avg(w, a));
        tu_ok(mb_ckpt_write(w, path));
        mb_ckpt_writer_destroy(w);
        mb_avg_destroy(a);
        mb_avg_config oc = {kind ? 0.5 : 0.0, kind ? MB_AVG_EMA : MB_AVG_SWA};
        tu_ok(mb_avg_create(&b, p, &c));
        tu_ok(mb_avg_create(&other, p, &oc));
        mb_ckpt_reader *r;
        tu_ok(mb_ckpt_open(&r, dev, path));
        tu_assert_error(mb_ckpt_load_avg(r, other), MB_ERR_FORMAT, "another average");
        int64_t n = -1;
        tu_ok(mb_avg_count(other, &n));
        assert_int_equal(n, 0);
        tu_ok(mb_ckpt_load_avg(r, b));
        mb_ckpt_close(r);
        tu_ok(mb_avg_count(b, &n));
        assert_int_equal(n, k);
        for (int s = k; s < 8; s++) {
            tu_ok(mb_params_set(p, seq + s * total));
            tu_ok(mb_avg_update(b, NULL));
        }
        avg_case_get(b, p, resumed);
        if (memcmp(whole, resumed, total * sizeof(float)) != 0)
            fail_msg("%s resumed after %d of 8 updates differs from the whole run", kind ? "SWA" : "EMA", k);
        mb_avg_destroy(b);
        mb_avg_destroy(other);
        mb_params_destroy(p);
        free(seq); free(whole); free(resumed);
    }
}

#endif
