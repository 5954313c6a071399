/* examples/mb_features.h: the incremental multi-timeframe bars and features.
 * - bars and close times equal a batch resample with the closed-bar rule, gaps included;
 * - features 0-11 are bitwise those of the first prepare (its code is kept here), the
 *   others agree with a plain batch implementation (two-pass moments, one loop per window);
 * - an engine started later agrees bitwise after MBF_WARMUP bars; bad bars change nothing;
 * - every feature has a distinct name, documented in docs/PREPARE.md. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mb_features.h"
#include <float.h>

typedef struct ref_bars { int64_t *t; double *o, *h, *l, *c, *v; size_t n; } ref_bars;

static void ref_alloc(ref_bars *b, size_t n) {
    b->t = (int64_t *)calloc(n, sizeof(int64_t));
    double **cols[5] = {&b->o, &b->h, &b->l, &b->c, &b->v};
    for (int i = 0; i < 5; i++) *cols[i] = (double *)calloc(n, sizeof(double));
    b->n = 0;
}
static void ref_free(ref_bars *b) { free(b->t); free(b->o); free(b->h); free(b->l); free(b->c); free(b->v); }

/* A random M1 series with weekends, missing minutes and hours, and gaps in the price. */
static void make_m1(ref_bars *m1, size_t n) {
    ref_alloc(m1, n);
    int64_t t = (int64_t)19723 * 86400 + tu_int(0, 1439) * 60; /* 2024-01-01 + some minutes */
    double price = 1.1;
    while (m1->n < n) {
        t += 60;
        int64_t dow = ((t / 86400) + 3) % 7;
        if (dow >= 5) continue;                               /* weekend */
        if (tu_int(0, 99) < 3) t += 60 * tu_int(1, 300);      /* a gap of minutes to hours */
        double o = price * exp(tu_uniform(-2e-4f, 2e-4f) * (tu_int(0, 9) == 0));
        double c = o * exp(tu_uniform(-1e-3f, 1e-3f));
        size_t i = m1->n++;
        m1->t[i] = t - t % 60; m1->o[i] = o; m1->c[i] = c;
        m1->h[i] = fmax(o, c) * exp(tu_uniform(0, 5e-4f));
        m1->l[i] = fmin(o, c) * exp(-tu_uniform(0, 5e-4f));
        m1->v[i] = tu_int(0, 20) == 0 ? 0 : floor(tu_uniform(1, 500));
        price = c;
        t = m1->t[i];
    }
}

/* The first prepare's resampling (buckets by start time). */
static void ref_resample(const ref_bars *m1, int minutes, ref_bars *out) {
    int64_t p = (int64_t)minutes * 60;
    ref_alloc(out, m1->n);
    for (size_t i = 0; i < m1->n; i++) {
        int64_t start = m1->t[i] - (m1->t[i] % p + p) % p;
        size_t k = out->n;
        if (k && out->t[k - 1] == start) {
            k--;
            out->h[k] = fmax(out->h[k], m1->h[i]); out->l[k] = fmin(out->l[k], m1->l[i]);
            out->c[k] = m1->c[i]; out->v[k] += m1->v[i];
        } else {
            out->t[k] = start; out->o[k] = m1->o[i]; out->h[k] = m1->h[i]; out->l[k] = m1->l[i];
            out->c[k] = m1->c[i]; out->v[k] = m1->v[i]; out->n++;
        }
    }
}

/* The first prepare's bar_features, verbatim but for libm's log, sin and cos: the engine's
 * own (mbf_log, mbf_sin, mbf_cos: the same bits on every platform; test_math below checks
 * them against libm). */
static void ref_base(const ref_bars *b, size_t i, double *f) {
    double prev_c = i ? b->c[i - 1] : b->o[i], prev_v = i ? b->v[i - 1] : b->v[i];
    double top = fmax(b->o[i], b->c[i]), bot = fmin(b->o[i], b->c[i]);
    double tod = 6.283185307179586 * (double)(b->t[i] % 86400) / 86400.0;
    double dow = 6.283185307179586 * (double)((b->t[i] / 86400 + 3) % 7) / 7.0;
    f[0] = mbf_log(b->c[i] / prev_c);
    f[1] = mbf_log(b->h[i] / b->l[i]);
    f[2] = mbf_log(b->c[i] / b->o[i]);
    f[3] = mbf_log(b->h[i] / top);
    f[4] = mbf_log(bot / b->l[i]);
    f[5] = mbf_log((b->v[i] + 1.0) / (prev_v + 1.0));
    f[6] = mbf_sin(tod); f[7] = mbf_cos(tod); f[8] = mbf_sin(dow); f[9] = mbf_cos(dow);
    size_t w = i + 1 < 20 ? i + 1 : 20;
    double mean = 0, s1 = 0, s2 = 0;
    for (size_t j = i + 1 - w; j <= i; j++) {
        double r = j ? mbf_log(b->c[j] / b->c[j - 1]) : 0.0;
        mean += b->c[j]; s1 += r; s2 += r * r;
    }
    f[10] = mbf_log(b->c[i] / (mean / (double)w));
    f[11] = sqrt(fmax(s2 / (double)w - (s1 / (double)w) * (s1 / (double)w), 0.0));
}

/* Calendar features, the date found by counting years and months from 1970. */
static void ref_calendar(int64_t t, double *f) {
    const double tau = 6.283185307179586;
    int64_t secs = t % 86400, day = t / 86400, dow = (day + 3) % 7, hour = secs / 3600;
    int y = 1970, m = 1;
    int64_t d = day;
    for (;;) {
        int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (d < 365 + leap) break;
        d -= 365 + leap; y++;
    }
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int len;
    while (d >= (len = dm[m - 1] + (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)))) { d -= len; m++; }
    double dim = len, tod = tau * (double)secs / 86400;
    double v[13] = {sin(2 * tod), cos(2 * tod), sin(tau * (double)(dow * 86400 + secs) / 604800),
                    cos(tau * (double)(dow * 86400 + secs) / 604800), sin(tau * (double)d / dim),
                    cos(tau * (double)d / dim), sin(tau * ((double)(m - 1) + (double)d / dim) / 12),
                    cos(tau * ((double)(m - 1) + (double)d / dim) / 12), sin(tau * (double)(secs % 3600) / 3600),
                    cos(tau * (double)(secs % 3600) / 3600), hour < 9, hour >= 7 && hour < 16,
                    hour >= 12 && hour < 21};
    memcpy(f, v, sizeof v);
}

static double mean_of(const double *x, int n) { double s = 0; for (int i = 0; i < n; i++) s += x[i]; return s / n; }
static double cmoment(const double *x, int n, double mu, int p) {
    double s = 0;
    for (int i = 0; i < n; i++) s += p == 2 ? (x[i] - mu) * (x[i] - mu) : (x[i] - mu) * (x[i] - mu) * (x[i] - mu);
    return s / n;
}

/* The 16 families of window W at bar i, one loop each, two-pass moments. */
static void ref_families(const ref_bars *b, size_t i, int W, double *f) {
    int w = (int)(i + 1 < (size_t)W ? i + 1 : (size_t)W);
    double r[256], ar[256], lv[256], hl[256], lc[256], x[256];
    double hmax = 0, lmin = 1e300, sv = 0, stv = 0, styp = 0, sbf = 0, sc = 0;
    for (int a = 0; a < w; a++) { /* oldest first */
        size_t j = i + 1 - (size_t)w + (size_t)a;
        r[a] = j ? log(b->c[j] / b->c[j - 1]) : 0.0;
        ar[a] = fabs(r[a]); lv[a] = log(b->v[j] + 1); hl[a] = log(b->h[j] / b->l[j]); lc[a] = log(b->c[j]);
        x[a] = a;
        hmax = fmax(hmax, b->h[j]); lmin = fmin(lmin, b->l[j]);
        double typ = (b->h[j] + b->l[j] + b->c[j]) / 3;
        sv += b->v[j]; stv += typ * b->v[j]; styp += typ; sc += b->c[j];
        sbf += b->h[j] > b->l[j] ? (b->c[j] - b->o[j]) / (b->h[j] - b->l[j]) : 0;
    }
    double mr = mean_of(r, w), m2 = cmoment(r, w, mr, 2), sabs = 0, sr = 0, r2 = 0, acf = 0, hl2 = 0;
    int up = 0, down = 0;
    for (int a = 0; a < w; a++) {
        sabs += ar[a]; sr += r[a]; r2 += r[a] * r[a]; hl2 += hl[a] * hl[a];
        up += r[a] > 0; down += r[a] < 0;
        if (a) acf += r[a] * r[a - 1];
    }
    double mx = mean_of(x, w), my = mean_of(lc, w), sxy = 0, sxx = 0;
    for (int a = 0; a < w; a++) { sxy += (x[a] - mx) * (lc[a] - my); sxx += (x[a] - mx) * (x[a] - mx); }
    double ma = mean_of(ar, w), ml = mean_of(lv, w), va = cmoment(ar, w, ma, 2), vl = cmoment(lv, w, ml, 2), cov = 0;
    for (int a = 0; a < w; a++) cov += (ar[a] - ma) * (lv[a] - ml) / w;
    double c = b->c[i];
    double v[16] = {sr, log(hmax / lmin), sqrt(m2), log((b->v[i] + 1) / (sv / w + 1)), log(c / (sc / w)),
                    hmax > lmin ? (2 * c - hmax - lmin) / (hmax - lmin) : 0, sqrt(hl2 / w / (4 * log(2.0))),
                    sabs > 0 ? sr / sabs : 0, sqrt(cmoment(lv, w, ml, 2)), (double)(up - down) / w,
                    sxx > 0 ? sxy / sxx : 0, log(c / (sv > 0 ? stv / sv : styp / w)), sbf / w,
                    m2 > 0 ? cmoment(r, w, mr, 3) / pow(m2, 1.5) : 0,
                    va > 0 && vl > 0 ? cov / sqrt(va * vl) : 0, r2 > 0 ? acf / r2 : 0};
    for (int k = 0; k < 16; k++) f[k * MBF_WINDOWS] = v[k];
}

static void ref_row(const ref_bars *b, size_t i, double *f) {
    ref_base(b, i, f);
    ref_calendar(b->t[i], f + MBF_BASE);
    for (int wi = 0; wi < MBF_WINDOWS; wi++) ref_families(b, i, mbf_window[wi], f + MBF_BASE + MBF_CAL + wi);
}

/* Rows of every timeframe from an engine fed m1[from..n), and where each closed. */
typedef struct rows { float *x[MBF_TFS]; mbf_bar *bar[MBF_TFS]; size_t *at[MBF_TFS]; size_t n[MBF_TFS]; } rows;

static void run_engine(const ref_bars *m1, size_t from, int nf, rows *out) {
    mbf_state *s = (mbf_state *)malloc(sizeof *s);
    mbf_out *o = (mbf_out *)malloc(sizeof *o);
    assert_true(s && o);
    mbf_init(s, nf);
    memset(out, 0, sizeof *out);
    for (int k = 0; k < MBF_TFS; k++) {
        out->x[k] = tu_alloc_f32(m1->n * MBF_MAX);
        out->bar[k] = (mbf_bar *)calloc(m1->n, sizeof(mbf_bar));
        out->at[k] = (size_t *)calloc(m1->n, sizeof(size_t));
    }
    for (size_t i = from; i < m1->n; i++) {
        mbf_bar b = {m1->t[i], m1->o[i], m1->h[i], m1->l[i], m1->c[i], m1->v[i]};
        assert_int_equal(mbf_push(s, &b, o), MBF_OK);
        for (int j = 0; j < o->n; j++) {
            int k = o->row[j].tf;
            size_t n = out->n[k]++;
            memcpy(out->x[k] + n * MBF_MAX, o->row[j].x, MBF_MAX * sizeof(float));
            out->bar[k][n] = o->row[j].bar;
            out->at[k][n] = i;
        }
    }
    free(s); free(o);
}

static void rows_free(rows *r) {
    for (int k = 0; k < MBF_TFS; k++) { free(r->x[k]); free(r->bar[k]); free(r->at[k]); }
}

/* Bars, close times and every feature against the batch reference. */
static void test_engine_vs_batch(void **state) {
    (void)state;
    ref_bars m1;
    make_m1(&m1, 20000);
    rows e;
    run_engine(&m1, 0, MBF_MAX, &e);
    double f[MBF_MAX], worst = 0;
    for (int k = 0; k < MBF_TFS; k++) {
        ref_bars b;
        ref_resample(&m1, mbf_minutes[k], &b);
        int64_t p = (int64_t)mbf_minutes[k] * 60;
        /* every bar closed except perhaps the last, which may still be forming */
        assert_true(e.n[k] == b.n || (e.n[k] + 1 == b.n && b.t[b.n - 1] + p > m1.t[m1.n - 1] + 60));
        for (size_t i = 0; i < e.n[k]; i++) {
            const mbf_bar *x = &e.bar[k][i];
            assert_true(x->t == b.t[i] && x->o == b.o[i] && x->h == b.h[i] && x->l == b.l[i] && x->c == b.c[i] &&
                        x->v == b.v[i]);
            size_t at = e.at[k][i]; /* closes at the first M1 close that reaches its end, not before */
            assert_true(b.t[i] + p <= m1.t[at] + 60);
            assert_true(at == 0 || b.t[i] + p > m1.t[at - 1] + 60);
            ref_row(&b, i, f);
            const float *y = e.x[k] + i * MBF_MAX;
            for (int j = 0; j < MBF_MAX; j++) {
                if (j < MBF_BASE) { /* the first prepare's features: bitwise */
                    if (y[j] != (float)f[j]) fail_msg("tf %d bar %zu feature %d: %.9g != %.9g", k, i, j, y[j], f[j]);
                    continue;
                }
                double err = fabs((double)y[j] - f[j]) / (1 + fabs(f[j]));
                if (err > worst) worst = err;
                if (err > 2e-5) {
                    char name[32];
                    mbf_feature_name(j, name, sizeof name);
                    fail_msg("tf %d bar %zu feature %d %s: %.9g, reference %.9g", k, i, j, name, y[j], f[j]);
                }
            }
        }
        ref_free(&b);
    }
    printf("bars %zu/%zu/%zu/%zu/%zu, worst relative difference %.3g\n", e.n[0], e.n[1], e.n[2], e.n[3], e.n[4], worst);
    rows_free(&e);
    ref_free(&m1);
}

/* A later start agrees bitwise once a timeframe has MBF_WARMUP closed bars; fewer
 * features are a prefix of more. */
static void test_warmup_and_prefix(void **state) {
    (void)state;
    ref_bars m1;
    make_m1(&m1, 40000);
    size_t from = (size_t)tu_int(1, 5000);
    rows a, b, c;
    run_engine(&m1, 0, MBF_MAX, &a);
    run_engine(&m1, from, MBF_MAX, &b);
    run_engine(&m1, 0, 30, &c);
    for (int k = 0; k < MBF_TFS; k++) {
        size_t off = 0;
        while (off < a.n[k] && a.bar[k][off].t != b.bar[k][MBF_WARMUP - 1].t) off++;
        assert_true(b.n[k] > MBF_WARMUP && off < a.n[k]);
        for (size_t i = MBF_WARMUP - 1; i < b.n[k]; i++)
            assert_memory_equal(b.x[k] + i * MBF_MAX, a.x[k] + (off + i - (MBF_WARMUP - 1)) * MBF_MAX,
                                MBF_MAX * sizeof(float));
        for (size_t i = 0; i < a.n[k]; i++) assert_memory_equal(c.x[k] + i * MBF_MAX, a.x[k] + i * MBF_MAX, 30 * sizeof(float));
    }
    rows_free(&a); rows_free(&b); rows_free(&c);
    ref_free(&m1);
}

/* Out of order, duplicate, off-minute and bad bars: an error code, no rows, no change. */
static void test_bad_bars(void **state) {
    (void)state;
    mbf_state *s = (mbf_state *)malloc(sizeof *s), *copy = (mbf_state *)malloc(sizeof *copy);
    mbf_out o;
    mbf_init(s, MBF_MAX);
    int64_t t0 = (int64_t)19724 * 86400; /* a Tuesday, 00:00 */
    for (int i = 0; i < 7; i++) {
        mbf_bar b = {t0 + 60 * i, 1.0, 1.1, 0.9, 1.05, 10};
        assert_int_equal(mbf_push(s, &b, &o), MBF_OK);
        assert_int_equal(o.n, i == 4 ? 2 : 1); /* minute 4 ends the first M5 bar */
    }
    memcpy(copy, s, sizeof *s);
    const int64_t last = t0 + 360;
    struct { mbf_bar b; int want; } bad[] = {
        {{last - 60, 1, 1, 1, 1, 0}, MBF_ERR_ORDER},      {{last, 1, 1, 1, 1, 0}, MBF_ERR_DUPLICATE},
        {{last + 90, 1, 1, 1, 1, 0}, MBF_ERR_ALIGN},      {{last + 60, 0, 1, 1, 1, 0}, MBF_ERR_BAR},
        {{last + 60, 1, 0.9, 1.1, 1, 0}, MBF_ERR_BAR},    {{last + 60, 1, 1, 1, NAN, 0}, MBF_ERR_BAR},
        {{last + 60, 1, 1, 1, 1, -1}, MBF_ERR_BAR},       {{last + 60, 1, INFINITY, 1, 1, 0}, MBF_ERR_BAR},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o.n = 5;
        assert_int_equal(mbf_push(s, &bad[i].b, &o), bad[i].want);
        assert_int_equal(o.n, 0);
        assert_memory_equal(s, copy, sizeof *s);
        assert_true(strlen(mbf_error_text(bad[i].want)) > 10);
    }
    /* a gap: the next bar, minute 17, closes M5 [5,10) and M15 [0,15), which ended in it */
    mbf_bar g = {t0 + 17 * 60, 1, 1.2, 0.8, 1.1, 5};
    assert_int_equal(mbf_push(s, &g, &o), MBF_OK);
    assert_int_equal(o.n, 3);
    assert_true(o.row[0].tf == 0 && o.row[1].tf == 1 && o.row[1].bar.t == t0 + 300 && o.row[1].bar.c == 1.05);
    assert_true(o.row[2].tf == 2 && o.row[2].bar.t == t0 && o.row[2].bar.v == 70);
    /* minute 19 ends M5 [15,20) (minutes 17 and 19) */
    g.t = t0 + 19 * 60;
    assert_int_equal(mbf_push(s, &g, &o), MBF_OK);
    assert_true(o.n == 2 && o.row[1].tf == 1 && o.row[1].bar.t == t0 + 900 && o.row[1].bar.v == 10);
    /* two bars of one timeframe in one push: minute 20 opens M5 [20,25); minute 29 closes
     * it (gap), then its own [25,30), then M15 [15,30) */
    g.t = t0 + 20 * 60;
    assert_int_equal(mbf_push(s, &g, &o), MBF_OK);
    g.t = t0 + 29 * 60;
    assert_int_equal(mbf_push(s, &g, &o), MBF_OK);
    assert_true(o.n == 4 && o.row[1].tf == 1 && o.row[2].tf == 1 && o.row[1].bar.t == t0 + 1200 &&
                o.row[2].bar.t == t0 + 1500 && o.row[3].tf == 2 && o.row[3].bar.t == t0 + 900);
    free(s); free(copy);
}

/* Distinct names, each in docs/PREPARE.md (run from the repository root). */
static void test_names_documented(void **state) {
    (void)state;
    FILE *f = fopen("docs/PREPARE.md", "rb");
    if (!f) skip();
    static char doc[1 << 17];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    char names[MBF_MAX][32];
    for (int j = 0; j < MBF_MAX; j++) {
        mbf_feature_name(j, names[j], sizeof names[j]);
        for (int i = 0; i < j; i++) if (!strcmp(names[i], names[j])) fail_msg("features %d and %d: %s", i, j, names[j]);
        char key[40], fam[32];
        snprintf(key, sizeof key, "`%s`", names[j]);
        snprintf(fam, sizeof fam, "%s", names[j]);
        char *u = strrchr(fam, '_');
        if (j >= MBF_BASE + MBF_CAL && u) { snprintf(key, sizeof key, "`%.*s_W`", (int)(u - fam), fam); }
        if (!strstr(doc, key)) fail_msg("feature %d %s: %s not in docs/PREPARE.md", j, names[j], key);
    }
    assert_int_equal(MBF_MAX, 169);
}

/* Distance in ulps between two doubles of the same sign (0 when equal, both NaN, or both
 * the same infinity). */
static uint64_t ulps(double a, double b) {
    if (a == b || (a != a && b != b)) return 0;
    int64_t x, y;
    memcpy(&x, &a, 8); memcpy(&y, &b, 8);
    if ((x < 0) != (y < 0)) return UINT64_MAX;
    return x > y ? (uint64_t)(x - y) : (uint64_t)(y - x);
}

typedef struct ulp_count { uint64_t worst, differ, n; double worst_at; } ulp_count;

/* One result of ours against libm's (and long double's, where wider) : at most 1 ulp. */
static void ulp_check(ulp_count *u, const char *what, double x, double ours, double libm, long double wide) {
    uint64_t d = ulps(ours, libm);
    u->n++; u->differ += d != 0;
    if (d > u->worst) { u->worst = d; u->worst_at = x; }
    if (d > 1) fail_msg("%s(%.17g): %.17g, libm %.17g: %llu ulps", what, x, ours, libm, (unsigned long long)d);
    if (LDBL_MANT_DIG > 53 && isfinite(ours)) { /* the true value within 1 ulp of ours */
        long double err = fabsl((long double)ours - wide), ulp = fabs(nextafter(ours, INFINITY) - ours);
        if (err > (long double)ulp) fail_msg("%s(%.17g): %.17g is %Lg ulps from %.21Lg", what, x, ours, err / ulp, wide);
    }
}

/* mbf_log, mbf_sin, mbf_cos against libm on fresh random inputs: the returns and ratios of
 * prices, volumes, prices; the calendar's angles and wider; zero, subnormals, negatives,
 * infinities, NaN. */
static void test_math(void **state) {
    (void)state;
    ulp_count l = {0, 0, 0, 0}, sn = {0, 0, 0, 0}, cs = {0, 0, 0, 0};
    for (int i = 0; i < 400000; i++) {
        double u = (double)tu_uniform(0, 1) + (double)tu_uniform(0, 1) * 0x1p-24, x;
        switch (i % 4) {
        case 0: x = 1 + (u - 0.5) * 1e-2 * pow(10, -tu_int(0, 8)); break; /* ratios near 1 */
        case 1: x = exp((u - 0.5) * 1400); break;                          /* 1e-304 .. 1e304 */
        case 2: x = 1 + u * 1e6; break;                                    /* volumes + 1 */
        default: x = 0.5 + u * 2; break;                                   /* prices */
        }
        ulp_check(&l, "mbf_log", x, mbf_log(x), log(x), logl((long double)x));
        double a = i % 3 ? (u - 0.5) * 8 * 3.141592653589793 : (u - 0.5) * 2e6; /* |a| < 4 pi; wider */
        ulp_check(&sn, "mbf_sin", a, mbf_sin(a), sin(a), sinl((long double)a));
        ulp_check(&cs, "mbf_cos", a, mbf_cos(a), cos(a), cosl((long double)a));
    }
    for (int64_t k = 0; k < 86400; k += 60) { /* the calendar's time-of-day angles, exactly as the engine forms them */
        double a = 6.283185307179586 * (double)k / 86400.0;
        ulp_check(&sn, "mbf_sin", a, mbf_sin(a), sin(a), sinl((long double)a));
        ulp_check(&cs, "mbf_cos", a, mbf_cos(a), cos(a), cosl((long double)a));
    }
    const double special[] = {0.0, -0.0, 0x1p-1074, 0x1p-1022, 1.0, 2.0, -1.0, INFINITY, -INFINITY, NAN, 1e308};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        assert_int_equal(ulps(mbf_log(special[i]), log(special[i])), 0);
    assert_true(mbf_sin(0.0) == 0.0 && mbf_cos(0.0) == 1.0 && isnan(mbf_sin(NAN)) && isnan(mbf_cos(INFINITY)));
    assert_true(isnan(mbf_sin(1e7))); /* outside the documented domain: NaN, not a wrong value */
    printf("vs libm: log %llu/%llu differ (max %llu ulp), sin %llu/%llu (max %llu), cos %llu/%llu (max %llu)\n",
           (unsigned long long)l.differ, (unsigned long long)l.n, (unsigned long long)l.worst,
           (unsigned long long)sn.differ, (unsigned long long)sn.n, (unsigned long long)sn.worst,
           (unsigned long long)cs.differ, (unsigned long long)cs.n, (unsigned long long)cs.worst);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_vs_batch),
        cmocka_unit_test(test_warmup_and_prefix),
        cmocka_unit_test(test_bad_bars),
        cmocka_unit_test(test_names_documented),
        cmocka_unit_test(test_math),
    };
    return cmocka_run_group_tests_name("features", tests, NULL, NULL);
}
