/* examples/mb_metrics.h: the trading metrics (hit rate, Pearson IC, Spearman rank IC, per
 * horizon and their means) against numpy/scipy on the committed golden
 * (tests/golden/metrics_golden.txt, made by tests/golden/make_metrics_golden.py) within 1e-6,
 * fed through the accumulator in the golden's uneven batches; then properties on fresh random
 * inputs (the seed is printed, MB_TEST_SEED replays): the batch split and the memory reserve
 * change no bit (also at 300,000 rows, whose mbm_compute CPU time is printed), Pearson of x and a*x+b is +-1, Spearman is unchanged by a monotone transform,
 * the hit rate of y against y is 1 (against -y: 0), the row order changes nothing beyond
 * rounding, and the ranks are the average ranks of a naive count; the CSV and text writers. */
#define _POSIX_C_SOURCE 200809L /* fmemopen, clock_gettime */
#define MEGABATCH_IMPLEMENTATION /* MB_FAIL, as the tools that include mb_metrics.h */
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mb_metrics.h"

/* Both NaN, or within 1e-6 absolute. */
static void assert_metric(double got, double want, const char *what, const char *name, int64_t j) {
    if (isnan(want) && isnan(got)) return;
    if (isnan(want) || isnan(got) || !(fabs(got - want) <= 1e-6))
        fail_msg("%s: horizon %lld: %s = %.17g, want %.17g", name, (long long)j + 1, what, got, want);
}

static void read_floats(FILE *f, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (fscanf(f, "%f", &x[i]) != 1) fail_msg("golden file truncated");
}

/* The horizons and means of two computations bitwise equal. */
static void assert_same(const mbm_horizon *a, const mbm_horizon *b, int64_t k, const mbm_mean *ma, const mbm_mean *mb,
                        const char *what) {
    for (int64_t j = 0; j < k; j++)
        if (memcmp(&a[j], &b[j], sizeof *a) != 0)
            fail_msg("%s: horizon %lld differs: hit %.17g/%.17g ic %.17g/%.17g rank_ic %.17g/%.17g", what,
                     (long long)j + 1, a[j].hit, b[j].hit, a[j].ic, b[j].ic, a[j].rank_ic, b[j].rank_ic);
    if (memcmp(ma, mb, sizeof *ma) != 0) fail_msg("%s: the means differ", what);
}

static void test_golden(void **state) {
    (void)state;
    const char *path = "tests/golden/metrics_golden.txt";
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    int cases;
    assert_int_equal(fscanf(f, "%d", &cases), 1);
    assert_int_equal(cases, 10);
    for (int c = 0; c < cases; c++) {
        char name[64];
        long long n, k;
        int nb;
        assert_int_equal(fscanf(f, "%63s %lld %lld %d", name, &n, &k, &nb), 4);
        assert_true(n >= 0 && k >= 1 && k <= 16 && nb >= 1);
        int64_t *sizes = (int64_t *)calloc((size_t)nb, sizeof *sizes);
        float *pred = tu_alloc_f32((size_t)(n * k)), *targ = tu_alloc_f32((size_t)(n * k));
        for (int b = 0; b < nb; b++) assert_int_equal(fscanf(f, "%lld", (long long *)&sizes[b]), 1);
        read_floats(f, pred, n * k);
        read_floats(f, targ, n * k);
        mbm_acc a, one;
        tu_ok(mbm_init(&a, k, 0)); /* grows as the batches come */
        for (int b = 0, at = 0; b < nb; at += (int)sizes[b], b++)
            tu_ok(mbm_add(&a, pred + at * k, targ + at * k, sizes[b]));
        assert_int_equal(a.n, n);
        mbm_horizon per[16], per1[16];
        mbm_mean m, m1;
        tu_ok(mbm_compute(&a, per, &m));
        for (int64_t j = 0; j < k; j++) {
            long long cnt[6];
            double want[3];
            for (int q = 0; q < 6; q++) assert_int_equal(fscanf(f, "%lld", &cnt[q]), 1);
            for (int q = 0; q < 3; q++) assert_int_equal(fscanf(f, "%lf", &want[q]), 1);
            const mbm_horizon *h = &per[j];
            long long got[6] = {h->n, h->nonfinite, h->zeros, h->zero_pred, h->zero_target, h->hits};
            const char *what[6] = {"n", "nonfinite", "zeros", "zero_pred", "zero_target", "hits"};
            for (int q = 0; q < 6; q++)
                if (got[q] != cnt[q]) fail_msg("%s: horizon %lld: %s = %lld, numpy %lld", name, (long long)j + 1, what[q], got[q], cnt[q]);
            assert_metric(h->hit, want[0], "hit", name, j);
            assert_metric(h->ic, want[1], "ic", name, j);
            assert_metric(h->rank_ic, want[2], "rank_ic", name, j);
        }
        double wm[3];
        long long rows, zeros, nonfinite;
        for (int q = 0; q < 3; q++) assert_int_equal(fscanf(f, "%lf", &wm[q]), 1);
        assert_int_equal(fscanf(f, "%lld %lld %lld", &rows, &zeros, &nonfinite), 3);
        assert_metric(m.hit, wm[0], "mean hit", name, -1);
        assert_metric(m.ic, wm[1], "mean ic", name, -1);
        assert_metric(m.rank_ic, wm[2], "mean rank_ic", name, -1);
        assert_true(m.rows == rows && m.zeros == zeros && m.nonfinite == nonfinite);
        /* the same rows in one batch, into a reserved accumulator: the same bits */
        tu_ok(mbm_init(&one, k, n));
        tu_ok(mbm_add(&one, pred, targ, n));
        tu_ok(mbm_compute(&one, per1, &m1));
        assert_same(per, per1, k, &m, &m1, name);
        printf("%-9s n=%-4lld k=%lld batches=%-2d mean hit=%.4f ic=%.4f rank_ic=%.4f\n", name, n, k, nb, m.hit, m.ic,
               m.rank_ic);
        mbm_free(&a);
        mbm_free(&one);
        free(sizes); free(pred); free(targ);
    }
    fclose(f);
}

/* Random (n, k) predictions with some signal in the targets; values in a few forms: smooth,
 * rounded (ties), with exact zeros. */
static void random_data(float *p, float *t, int64_t n, int64_t k) {
    int form = tu_int(0, 2);
    for (int64_t i = 0; i < n * k; i++) {
        float x = tu_uniform(-1, 1), y = 0.3f * x + tu_uniform(-1, 1);
        if (form == 1) { x = roundf(x * 8) / 8; y = roundf(y * 4) / 4; }
        if (form == 2 && tu_int(0, 5) == 0) x = 0;
        if (form == 2 && tu_int(0, 4) == 0) y = tu_int(0, 1) ? 0.0f : -0.0f;
        p[i] = x;
        t[i] = y;
    }
}

static void compute(const float *p, const float *t, int64_t n, int64_t k, int64_t reserve, int64_t batch_max,
                    mbm_horizon *per, mbm_mean *m) {
    mbm_acc a;
    tu_ok(mbm_init(&a, k, reserve));
    for (int64_t at = 0; at < n;) {
        int64_t b = batch_max ? tu_int(0, (int)batch_max) : n;
        if (b > n - at) b = n - at;
        tu_ok(mbm_add(&a, p + at * k, t + at * k, b));
        at += b;
    }
    tu_ok(mbm_compute(&a, per, m));
    mbm_free(&a);
}

static void test_batch_split_and_order(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        int64_t n = tu_int(0, 3000), k = tu_int(1, 8);
        float *p = tu_alloc_f32((size_t)(n * k)), *t = tu_alloc_f32((size_t)(n * k));
        float *ps = tu_alloc_f32((size_t)(n * k)), *ts = tu_alloc_f32((size_t)(n * k));
        random_data(p, t, n, k);
        mbm_horizon a[8], b[8], c[8];
        mbm_mean ma, mb, mc;
        compute(p, t, n, k, 0, 0, a, &ma);
        compute(p, t, n, k, tu_int(0, 1) ? n : 0, tu_int(1, 700), b, &mb);
        assert_same(a, b, k, &ma, &mb, "another batch split");
        /* the rows shuffled (Fisher-Yates): counts exact, correlations to rounding */
        memcpy(ps, p, (size_t)(n * k) * sizeof(float));
        memcpy(ts, t, (size_t)(n * k) * sizeof(float));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(tu_next() % (uint64_t)(i + 1));
            for (int64_t q = 0; q < k; q++) {
                float s = ps[i * k + q]; ps[i * k + q] = ps[j * k + q]; ps[j * k + q] = s;
                s = ts[i * k + q]; ts[i * k + q] = ts[j * k + q]; ts[j * k + q] = s;
            }
        }
        compute(ps, ts, n, k, 0, tu_int(1, 500), c, &mc);
        for (int64_t j = 0; j < k; j++) {
            assert_true(a[j].n == c[j].n && a[j].zeros == c[j].zeros && a[j].hits == c[j].hits);
            assert_true(a[j].zero_pred == c[j].zero_pred && a[j].zero_target == c[j].zero_target);
            assert_true(memcmp(&a[j].hit, &c[j].hit, sizeof(double)) == 0);
            assert_metric(c[j].ic, a[j].ic, "shuffled ic", "order", j);
            assert_metric(c[j].rank_ic, a[j].rank_ic, "shuffled rank_ic", "order", j);
            if (!isnan(a[j].ic)) assert_true(fabs(c[j].ic - a[j].ic) <= 1e-12 && fabs(c[j].rank_ic - a[j].rank_ic) <= 1e-12);
        }
        free(p); free(t); free(ps); free(ts);
    }
}

/* 300,000 rows x 4 horizons, grown from nothing in batches of up to 4096 and reserved at once:
 * the same bits; prints mbm_compute's CPU time per row and horizon and the memory kept. */
static void test_large(void **state) {
    (void)state;
    int64_t n = 300000, k = 4;
    float *p = tu_alloc_f32((size_t)(n * k)), *t = tu_alloc_f32((size_t)(n * k));
    random_data(p, t, n, k);
    mbm_acc a, b;
    tu_ok(mbm_init(&a, k, 0));
    tu_ok(mbm_init(&b, k, n));
    for (int64_t at = 0; at < n;) {
        int64_t m = tu_int(0, 4096);
        if (m > n - at) m = n - at;
        tu_ok(mbm_add(&a, p + at * k, t + at * k, m));
        at += m;
    }
    tu_ok(mbm_add(&b, p, t, n));
    mbm_horizon ha[4], hb[4];
    mbm_mean ma, mb;
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    tu_ok(mbm_compute(&a, ha, &ma));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    tu_ok(mbm_compute(&b, hb, &mb));
    assert_same(ha, hb, k, &ma, &mb, "grown and reserved");
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("mbm_compute: %lld rows x %lld horizons in %.3f s CPU (%.0f ns per row and horizon); kept %.1f MB "
           "(8 bytes per row and horizon), %.1f MB more while it runs\n", (long long)n, (long long)k, s,
           s / (double)(n * k) * 1e9, (double)(n * k * 8) / 1e6, (double)(n * 32) / 1e6);
    mbm_free(&a);
    mbm_free(&b);
    free(p); free(t);
}

static void test_linear_and_monotone(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        int64_t n = tu_int(2, 2000);
        float *x = tu_alloc_f32((size_t)n), *y = tu_alloc_f32((size_t)n), *z = tu_alloc_f32((size_t)n);
        float *yf = tu_alloc_f32((size_t)n);
        float sa = tu_uniform(0.1f, 10.0f) * (tu_int(0, 1) ? 1 : -1), sb = tu_uniform(-5, 5);
        for (int64_t i = 0; i < n; i++) {
            x[i] = i == 0 ? -3 : i == 1 ? 3 : tu_uniform(-3, 3); /* never constant */
            y[i] = sa * x[i] + sb;
            z[i] = (float)tu_int(-200, 200); /* integers: ties, and z^3 + 5z is exact and increasing */
            yf[i] = z[i] * z[i] * z[i] + 5 * z[i];
        }
        mbm_horizon h[1], g[1], hz[1], hf[1];
        mbm_mean m;
        compute(x, y, n, 1, 0, 97, h, &m);
        if (fabs(h[0].ic - (sa > 0 ? 1 : -1)) > 1e-6) fail_msg("Pearson of x and %g*x%+g = %.17g", sa, sb, h[0].ic);
        if (fabs(h[0].rank_ic - (sa > 0 ? 1 : -1)) > 1e-6) fail_msg("Spearman of x and %g*x%+g = %.17g", sa, sb, h[0].rank_ic);
        /* y against y: every nonzero row a hit; against -y: none */
        compute(y, y, n, 1, 0, 0, g, &m);
        assert_true(g[0].hit == 1.0 || (isnan(g[0].hit) && g[0].zeros == n));
        assert_true(fabs(g[0].ic - 1) <= 1e-12 && fabs(g[0].rank_ic - 1) <= 1e-12);
        for (int64_t i = 0; i < n; i++) z[i] = i % 3 ? z[i] : 0; /* some zeros: left out, counted */
        for (int64_t i = 0; i < n; i++) yf[i] = z[i] * z[i] * z[i] + 5 * z[i];
        compute(z, z, n, 1, 0, 0, g, &m);
        int64_t zeros = 0;
        for (int64_t i = 0; i < n; i++) zeros += z[i] == 0;
        assert_int_equal(g[0].zeros, zeros);
        assert_true(g[0].hit == 1.0 || (isnan(g[0].hit) && zeros == n));
        for (int64_t i = 0; i < n; i++) y[i] = -z[i];
        compute(z, y, n, 1, 0, 0, g, &m);
        assert_true(g[0].hit == 0.0 || (isnan(g[0].hit) && zeros == n));
        /* Spearman of (x, z) and (x, f(z)) with f increasing: the same ranks, the same bits */
        compute(x, z, n, 1, 0, 0, hz, &m);
        compute(x, yf, n, 1, 0, 0, hf, &m);
        assert_true(memcmp(&hz[0].rank_ic, &hf[0].rank_ic, sizeof(double)) == 0);
        assert_true(hz[0].hits == hf[0].hits && hz[0].zeros == hf[0].zeros);
        free(x); free(y); free(z); free(yf);
    }
}

/* mbm_rank against the average ranks of a naive count: rank = (number below) + (number
 * equal + 1) / 2, -0 equal to +0; sizes past one radix digit, negative values, many ties. */
static void test_ranks_naive(void **state) {
    (void)state;
    for (int rep = 0; rep < 30; rep++) {
        int64_t n = tu_int(0, 1500);
        int levels = tu_int(1, 3) == 1 ? 5 : 100000;
        double *x = (double *)malloc((size_t)(n + 1) * sizeof(double)), *r = (double *)malloc((size_t)(n + 1) * sizeof(double));
        uint64_t *pair = (uint64_t *)malloc((size_t)(n + 1) * 8), *tmp = (uint64_t *)malloc((size_t)(n + 1) * 8);
        for (int64_t i = 0; i < n; i++) {
            int v = tu_int(-levels, levels);
            x[i] = v == 0 ? (tu_int(0, 1) ? 0.0 : -0.0) : (double)(float)(v * 1e-3f * (tu_int(0, 1) ? 1.0f : 1e30f));
        }
        memcpy(r, x, (size_t)n * sizeof(double));
        mbm_rank(r, n, pair, tmp);
        for (int64_t i = 0; i < n; i++) {
            int64_t below = 0, equal = 0;
            for (int64_t j = 0; j < n; j++) { below += x[j] < x[i]; equal += x[j] == x[i]; }
            double want = (double)below + (double)(equal + 1) / 2;
            if (r[i] != want) fail_msg("n=%lld: rank of x[%lld] = %.17g is %.17g, the average rank is %.17g", (long long)n,
                                       (long long)i, x[i], r[i], want);
        }
        free(x); free(r); free(pair); free(tmp);
    }
}

static void test_writers_and_errors(void **state) {
    (void)state;
    float p[3 * 2] = {0.5f, -1, 0, 2, -0.25f, 3}, t[3 * 2] = {1, 1, 2, 0, -1, 1};
    mbm_acc a;
    tu_ok(mbm_init(&a, 2, 0));
    tu_ok(mbm_add(&a, p, t, 3));
    mbm_horizon per[2];
    mbm_mean m;
    tu_ok(mbm_compute(&a, per, &m));
    /* horizon 1: (0.5,1) (0,2) (-0.25,-1): 2 signed rows, both hits, one zero */
    assert_true(per[0].n == 3 && per[0].zeros == 1 && per[0].hits == 2 && per[0].hit == 1.0);
    /* horizon 2: (-1,1) (2,0) (3,1): one miss, one hit, one zero */
    assert_true(per[1].zeros == 1 && per[1].hits == 1 && per[1].hit == 0.5);
    char buf[4096];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    fputs("epoch,", f);
    mbm_csv_header(f, 2, "val_");
    fputs("\n7,", f);
    mbm_csv_row(f, 2, per, &m);
    fputs("\n8,", f);
    mbm_csv_empty(f, 2);
    fputc('\n', f);
    fclose(f);
    const char *want_head = "epoch,val_hit,val_ic,val_rank_ic,val_rows,val_zeros,val_nonfinite,"
                            "val_hit_1,val_ic_1,val_rank_ic_1,val_n_1,val_zeros_1,val_nonfinite_1,"
                            "val_hit_2,val_ic_2,val_rank_ic_2,val_n_2,val_zeros_2,val_nonfinite_2\n";
    assert_int_equal(strncmp(buf, want_head, strlen(want_head)), 0);
    const char *row = buf + strlen(want_head);
    int commas_head = 0, commas_row = 0;
    for (const char *s = buf; s < row; s++) commas_head += *s == ',';
    for (const char *s = row; *s && *s != '\n'; s++) commas_row += *s == ',';
    assert_int_equal(commas_head, commas_row);
    const char *empty = strchr(row, '\n') + 1;
    assert_int_equal(strncmp(empty, "8,", 2), 0);
    assert_int_equal((int)strspn(empty + 2, ","), commas_head - 1);
    assert_int_equal(empty[2 + commas_head - 1], '\n');
    assert_int_equal(strncmp(row, "7,0.75,", 7), 0);       /* (1 + 0.5) / 2 */
    assert_non_null(strstr(row, ",3,2,0,1,"));             /* rows, zeros, nonfinite, then hit_1 = 1 */
    char text[128];
    mbm_text(text, sizeof text, &m);
    char want[128];
    snprintf(want, sizeof want, "hit=0.7500 ic=%.4f rank_ic=%.4f", m.ic, m.rank_ic);
    assert_string_equal(text, want);
    mbm_mean none = {NAN, NAN, NAN, 0, 0, 0};
    mbm_text(text, sizeof text, &none);
    assert_string_equal(text, "hit=nan ic=nan rank_ic=nan");
    /* reset: the next epoch starts empty */
    mbm_reset(&a);
    tu_ok(mbm_compute(&a, per, &m));
    assert_true(m.rows == 0 && per[0].n == 0 && isnan(m.hit) && isnan(m.ic) && isnan(m.rank_ic));
    tu_assert_error(mbm_add(&a, NULL, t, 1), MB_ERR_INVALID_ARG, "mbm_add");
    tu_assert_error(mbm_add(&a, p, t, -1), MB_ERR_INVALID_ARG, "mbm_add");
    tu_ok(mbm_add(&a, NULL, NULL, 0));
    mbm_free(&a);
    tu_assert_error(mbm_init(&a, 0, 0), MB_ERR_INVALID_ARG, "k = 0");
    tu_assert_error(mbm_init(&a, 4, -1), MB_ERR_INVALID_ARG, "reserve");
    mbm_free(&a);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_batch_split_and_order),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_linear_and_monotone),
        cmocka_unit_test(test_ranks_naive),
        cmocka_unit_test(test_writers_and_errors),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
