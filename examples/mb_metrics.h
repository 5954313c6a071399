/* mb_metrics.h - trading metrics of a model's predictions against their targets, per horizon
 * and their mean over the horizons (docs/TRADING.md, "Trading metrics"): what a trader reads
 * besides the loss.
 *   hit rate   how often the sign of the prediction is the sign of the target; rows where
 *              either is exactly 0 (+0 or -0) are left out of the rate and counted (zeros)
 *   ic         Pearson correlation of prediction and target (the information coefficient)
 *   rank ic    Spearman's: Pearson of the ranks, ties given their average rank (as
 *              scipy.stats.spearmanr)
 * Host-side and deterministic. Predictions and targets come batch by batch, (rows, K) float
 * arrays in row-major order, as a validation pass copies them from the device; the
 * accumulator keeps every value (Spearman needs them all), 8 bytes per row and horizon (a
 * float each), and mbm_compute takes 32 bytes per row more while it runs (freed on return):
 * 1M rows x 64 horizons = 512 MB kept + 32 MB. Sums are in double, two-pass (means first);
 * ranks come from a stable radix sort (exact, O(n) per horizon). The same rows added in any
 * batch split give bitwise the same results.
 *   mbm_acc a;  mbm_init(&a, K, expected_rows)           empty accumulator (reserve: 0 is fine)
 *   mbm_add(&a, pred, target, rows)                      a batch: (rows, K) each
 *   mbm_compute(&a, per, &mean)                          per[K] and the means over horizons
 *   mbm_reset(&a) (next epoch, memory kept), mbm_free(&a)
 *   mbm_csv_header(f, K, prefix), mbm_csv_row(f, K, per, &mean)   every horizon, one CSV row
 *   mbm_csv_empty(f, K)                                  the same columns, empty (rows without)
 *   mbm_text(buf, cap, &mean)                            "hit=0.5312 ic=0.0421 rank_ic=0.0380"
 * Rules a quant should know:
 * - a row whose prediction or target is NaN or Inf is left out of that horizon and counted
 *   (nonfinite); n counts the rest (the sample of ic and rank ic);
 * - a metric with nothing to measure is NaN, as scipy gives it: the hit rate with no row of
 *   nonzero prediction and target; ic and rank ic with fewer than 2 rows or a constant column
 *   (every prediction, or every target, equal: scipy returns nan there too, with a warning);
 * - the means over horizons are the plain means of the horizons where the metric is defined
 *   (numpy's nanmean), NaN when it is defined in none; the hit rate's mean is of the
 *   horizons' rates, not pooled over their rows.
 * Include after megabatch.h, in its implementation's translation unit (errors: mb_result
 * through MB_FAIL, the message in mb_last_error, as mb_train.h). All names are mbm_* (static:
 * each including file gets its own copy). */
#ifndef MB_METRICS_H
#define MB_METRICS_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBM_API static __attribute__((unused)) /* an includer need not use everything */
#else
#define MBM_API static
#endif

// ---- results ----

typedef struct mbm_horizon {
    int64_t n;           /* rows with a finite prediction and target: the sample of ic and rank_ic */
    int64_t nonfinite;   /* rows left out: the prediction or the target NaN or +-Inf */
    int64_t zeros;       /* rows of n left out of the hit rate: prediction or target exactly 0 */
    int64_t zero_pred;   /* rows of n whose prediction is 0 (a row may count here and in zero_target) */
    int64_t zero_target; /* rows of n whose target is 0 */
    int64_t hits;        /* rows of n - zeros where prediction and target have the same sign */
    double hit;          /* hits / (n - zeros); NaN when n == zeros */
    double ic;           /* Pearson; NaN with n < 2 or a constant column */
    double rank_ic;      /* Spearman (average ranks for ties); NaN as ic */
} mbm_horizon;

typedef struct mbm_mean {
    double hit, ic, rank_ic;           /* means over the horizons where each is defined (NaN: none) */
    int64_t rows;                      /* rows added */
    int64_t zeros, nonfinite;          /* summed over the horizons */
} mbm_mean;

// ---- accumulator ----

typedef struct mbm_acc {
    int64_t k;   /* horizons */
    int64_t n;   /* rows added */
    int64_t cap; /* rows room is allocated for */
    float *col;  /* 2k columns of cap floats: horizon j's predictions at j*cap, its targets at (k+j)*cap */
} mbm_acc;

/* Rows a mbm_acc of k horizons may hold: ranks and row indices are 32-bit. */
#define MBM_MAX_ROWS ((int64_t)UINT32_MAX)

/* Room for cap rows (columns moved to their new places; n kept). */
MBM_API mb_result mbm__grow(mbm_acc *a, int64_t cap) {
    if (cap > MBM_MAX_ROWS) cap = MBM_MAX_ROWS;
    if ((uint64_t)cap > SIZE_MAX / sizeof(float) / (uint64_t)(2 * a->k))
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "mbm: %lld rows x %lld horizons do not fit in memory", (long long)cap,
                       (long long)a->k);
    float *col = (float *)malloc((size_t)cap * (size_t)(2 * a->k) * sizeof(float));
    if (!col)
        return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "mbm: no memory for %lld rows x %lld horizons (%.1f MB)",
                       (long long)cap, (long long)a->k, (double)cap * (double)(2 * a->k) * sizeof(float) / 1e6);
    for (int64_t c = 0; a->col && c < 2 * a->k; c++)
        memcpy(col + c * cap, a->col + c * a->cap, (size_t)a->n * sizeof(float));
    free(a->col);
    a->col = col;
    a->cap = cap;
    return MB_OK;
}

/* An empty accumulator of k horizons (1..65536) with room for `reserve` rows (0: it grows as
 * rows come, doubling; the validation set's size: no regrowth). */
MBM_API mb_result mbm_init(mbm_acc *a, int64_t k, int64_t reserve) {
    memset(a, 0, sizeof *a);
    if (k < 1 || k > 65536 || reserve < 0 || reserve > MBM_MAX_ROWS)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbm_init: k = %lld (1..65536), reserve = %lld (0..%lld)",
                       (long long)k, (long long)reserve, (long long)MBM_MAX_ROWS);
    a->k = k;
    return reserve ? mbm__grow(a, reserve) : MB_OK;
}

MBM_API void mbm_free(mbm_acc *a) {
    free(a->col);
    memset(a, 0, sizeof *a);
}

/* No rows (the memory is kept for the next epoch). */
MBM_API void mbm_reset(mbm_acc *a) { a->n = 0; }

/* Add `rows` rows: pred and target are (rows, k) in row-major order (a batch's predictions
 * and its targets as the model sees them). Any value is accepted (NaN and Inf: counted by
 * mbm_compute). On an error nothing is added. */
MBM_API mb_result mbm_add(mbm_acc *a, const float *pred, const float *target, int64_t rows) {
    if (!a || a->k < 1 || rows < 0 || (rows && (!pred || !target)))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbm_add: bad arguments (rows = %lld)", (long long)rows);
    if (rows == 0) return MB_OK;
    if (rows > MBM_MAX_ROWS - a->n)
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "mbm_add: more than %lld rows", (long long)MBM_MAX_ROWS);
    if (a->n + rows > a->cap) {
        int64_t cap = a->cap ? a->cap : 1024;
        while (cap < a->n + rows) cap = cap > MBM_MAX_ROWS / 2 ? MBM_MAX_ROWS : 2 * cap;
        mb_result r = mbm__grow(a, cap);
        if (r != MB_OK) return r;
    }
    for (int64_t j = 0; j < a->k; j++) {
        float *p = a->col + j * a->cap + a->n, *t = a->col + (a->k + j) * a->cap + a->n;
        for (int64_t i = 0; i < rows; i++) {
            p[i] = pred[i * a->k + j];
            t[i] = target[i * a->k + j];
        }
    }
    a->n += rows;
    return MB_OK;
}

// ---- correlation ----

/* Pearson of x and y (n values each), two-pass in double; NaN with n < 2 or a constant
 * column (tested as every value equal to the first, as scipy does: a computed variance of a
 * constant column need not be exactly 0). */
MBM_API double mbm_pearson(const double *x, const double *y, int64_t n) {
    if (n < 2) return NAN;
    int xc = 1, yc = 1;
    for (int64_t i = 1; i < n && (xc || yc); i++) {
        xc &= x[i] == x[0];
        yc &= y[i] == y[0];
    }
    if (xc || yc) return NAN;
    double mx = 0, my = 0;
    for (int64_t i = 0; i < n; i++) { mx += x[i]; my += y[i]; }
    mx /= (double)n;
    my /= (double)n;
    double sxx = 0, syy = 0, sxy = 0;
    for (int64_t i = 0; i < n; i++) {
        double dx = x[i] - mx, dy = y[i] - my;
        sxx += dx * dx;
        syy += dy * dy;
        sxy += dx * dy;
    }
    double r = sxy / (sqrt(sxx) * sqrt(syy));
    return r > 1 ? 1 : r < -1 ? -1 : r;
}

/* A float's bits as an unsigned key that sorts as the float does (-0 as +0; no NaN). */
static inline uint32_t mbm__key(double v) {
    float f = (float)v;
    if (f == 0) f = 0; /* -0 ties with +0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* x[0..n) (floats held as doubles, finite) replaced by their ranks, 1..n, ties given the
 * mean of the ranks they span. pair and tmp: n each. A stable LSD radix sort of
 * (key << 32 | index), 8 bits a pass. */
MBM_API void mbm_rank(double *x, int64_t n, uint64_t *pair, uint64_t *tmp) {
    for (int64_t i = 0; i < n; i++) pair[i] = (uint64_t)mbm__key(x[i]) << 32 | (uint64_t)i;
    for (int shift = 32; shift < 64; shift += 8) {
        int64_t count[257] = {0};
        for (int64_t i = 0; i < n; i++) count[((pair[i] >> shift) & 255) + 1]++;
        if (n && count[((pair[0] >> shift) & 255) + 1] == n) continue; /* one bucket: the order stands */
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int64_t i = 0; i < n; i++) tmp[count[(pair[i] >> shift) & 255]++] = pair[i];
        uint64_t *s = pair; pair = tmp; tmp = s;
    }
    for (int64_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && pair[j] >> 32 == pair[i] >> 32; j++) {}
        double r = (double)(i + j + 1) / 2; /* the mean of the 1-based ranks i+1..j */
        for (int64_t m = i; m < j; m++) x[pair[m] & 0xffffffffu] = r;
    }
}

// ---- compute ----

/* One horizon: its n finite rows gathered into x (predictions) and y (targets). */
MBM_API void mbm__horizon(mbm_horizon *h, double *x, double *y, uint64_t *pair, uint64_t *tmp) {
    int64_t n = h->n, signed_n = 0;
    for (int64_t i = 0; i < n; i++) {
        int zp = x[i] == 0, zt = y[i] == 0;
        h->zero_pred += zp;
        h->zero_target += zt;
        if (zp || zt) continue;
        signed_n++;
        h->hits += (x[i] > 0) == (y[i] > 0);
    }
    h->zeros = n - signed_n;
    h->hit = signed_n ? (double)h->hits / (double)signed_n : NAN;
    h->ic = mbm_pearson(x, y, n);
    if (isnan(h->ic)) { /* fewer than 2 rows or a constant column: so are the ranks */
        h->rank_ic = NAN;
        return;
    }
    mbm_rank(x, n, pair, tmp);
    mbm_rank(y, n, pair, tmp);
    h->rank_ic = mbm_pearson(x, y, n);
}

/* The metrics of the rows added: per[0..k) (k = a->k) and their means (mean may be NULL; on
 * an error its metrics are NaN and its counts 0). */
MBM_API mb_result mbm_compute(const mbm_acc *a, mbm_horizon *per, mbm_mean *mean) {
    if (mean) {
        memset(mean, 0, sizeof *mean);
        mean->hit = mean->ic = mean->rank_ic = NAN;
    }
    if (!a || a->k < 1 || !per) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbm_compute: bad arguments");
    int64_t n = a->n;
    size_t each = (size_t)(n ? n : 1);
    double *x = (double *)malloc(each * sizeof(double)), *y = (double *)malloc(each * sizeof(double));
    uint64_t *pair = (uint64_t *)malloc(each * sizeof(uint64_t)), *tmp = (uint64_t *)malloc(each * sizeof(uint64_t));
    if (!x || !y || !pair || !tmp) {
        free(x); free(y); free(pair); free(tmp);
        return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "mbm_compute: no memory for %lld rows (%.1f MB)", (long long)n,
                       (double)n * 32 / 1e6);
    }
    mbm_mean m = {0, 0, 0, n, 0, 0};
    int defined[3] = {0, 0, 0};
    for (int64_t j = 0; j < a->k; j++) {
        const float *p = n ? a->col + j * a->cap : NULL, *t = n ? a->col + (a->k + j) * a->cap : NULL;
        mbm_horizon *h = &per[j];
        memset(h, 0, sizeof *h);
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(p[i]) || !isfinite(t[i])) { h->nonfinite++; continue; }
            x[h->n] = p[i];
            y[h->n++] = t[i];
        }
        mbm__horizon(h, x, y, pair, tmp);
        m.zeros += h->zeros;
        m.nonfinite += h->nonfinite;
        double v[3] = {h->hit, h->ic, h->rank_ic}, *s[3] = {&m.hit, &m.ic, &m.rank_ic};
        for (int q = 0; q < 3; q++)
            if (!isnan(v[q])) { *s[q] += v[q]; defined[q]++; }
    }
    m.hit = defined[0] ? m.hit / defined[0] : NAN;
    m.ic = defined[1] ? m.ic / defined[1] : NAN;
    m.rank_ic = defined[2] ? m.rank_ic / defined[2] : NAN;
    if (mean) *mean = m;
    free(x); free(y); free(pair); free(tmp);
    return MB_OK;
}

// ---- output ----
// CSV: the means, then every horizon (1-based, as predict's pred_1..pred_K), each name after
// `prefix` (e.g. "val_"), without a leading comma or an ending newline (the caller's row has
// its own columns around them):
//   hit,ic,rank_ic,rows,zeros,nonfinite,hit_1,ic_1,rank_ic_1,n_1,zeros_1,nonfinite_1,...,hit_K,...
// Numbers in %.9g (NaN as `nan`, which pandas and numpy read).

static inline void mbm__num(FILE *f, double v) {
    if (isnan(v)) fputs("nan", f);
    else fprintf(f, "%.9g", v);
}

MBM_API void mbm_csv_header(FILE *f, int64_t k, const char *prefix) {
    const char *p = prefix ? prefix : "";
    fprintf(f, "%shit,%sic,%srank_ic,%srows,%szeros,%snonfinite", p, p, p, p, p, p);
    for (int64_t j = 1; j <= k; j++)
        fprintf(f, ",%shit_%lld,%sic_%lld,%srank_ic_%lld,%sn_%lld,%szeros_%lld,%snonfinite_%lld", p, (long long)j, p,
                (long long)j, p, (long long)j, p, (long long)j, p, (long long)j, p, (long long)j);
}

MBM_API void mbm_csv_row(FILE *f, int64_t k, const mbm_horizon *per, const mbm_mean *m) {
    mbm__num(f, m->hit); fputc(',', f);
    mbm__num(f, m->ic); fputc(',', f);
    mbm__num(f, m->rank_ic);
    fprintf(f, ",%lld,%lld,%lld", (long long)m->rows, (long long)m->zeros, (long long)m->nonfinite);
    for (int64_t j = 0; j < k; j++) {
        const mbm_horizon *h = &per[j];
        fputc(',', f); mbm__num(f, h->hit);
        fputc(',', f); mbm__num(f, h->ic);
        fputc(',', f); mbm__num(f, h->rank_ic);
        fprintf(f, ",%lld,%lld,%lld", (long long)h->n, (long long)h->zeros, (long long)h->nonfinite);
    }
}

/* As many empty fields as mbm_csv_header names (for the rows of a CSV that have no
 * metrics, e.g. the training steps' rows): 6 + 6K - 1 commas. */
MBM_API void mbm_csv_empty(FILE *f, int64_t k) {
    for (int64_t i = 1; i < 6 + 6 * k; i++) fputc(',', f);
}

/* The means for an epoch line: "hit=0.5312 ic=0.0421 rank_ic=0.0380" (NaN: "nan"). Returns
 * what snprintf returns. */
MBM_API int mbm_text(char *buf, size_t cap, const mbm_mean *m) {
    char v[3][32];
    double x[3] = {m->hit, m->ic, m->rank_ic};
    for (int q = 0; q < 3; q++) {
        if (isnan(x[q])) snprintf(v[q], sizeof v[q], "nan");
        else snprintf(v[q], sizeof v[q], "%.4f", x[q]);
    }
    return snprintf(buf, cap, "hit=%s ic=%s rank_ic=%s", v[0], v[1], v[2]);
}

// ---- a validation pass on a device ----
// The metrics of a pass whose predictions and targets live on an mb_device: each batch copied
// into host buffers and added (a host sync a batch: validation is outside the training step),
// then, at the pass's end, computed per horizon and as their means, the rows dropped.
//   mbm_pass_init(&p, dev, k, max_rows); each batch: mbm_pass_add(&p, pred, y, rows);
//   mbm_pass_end(&p, 1): p.per[k], p.mean; mbm_pass_free(&p)

typedef struct mbm_pass {
    mb_device *dev;
    float *hpred, *htarg; /* (max_rows, k) host buffers */
    mbm_acc acc;
    mbm_horizon *per;     /* the last pass's, per horizon */
    mbm_mean mean;        /* and their means over the horizons */
} mbm_pass;

MBM_API mb_result mbm_pass_init(mbm_pass *p, mb_device *dev, int64_t k, int64_t max_rows) {
    size_t bytes = (size_t)(max_rows * k) * sizeof(float);
    memset(p, 0, sizeof *p);
    p->dev = dev;
    MB_TRY(mb_alloc(dev, MB_MEM_HOST, bytes, (void **)&p->hpred));
    MB_TRY(mb_alloc(dev, MB_MEM_HOST, bytes, (void **)&p->htarg));
    p->per = (mbm_horizon *)calloc((size_t)k, sizeof *p->per);
    if (!p->per) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the metrics");
    return mbm_init(&p->acc, k, 0);
}

MBM_API void mbm_pass_free(mbm_pass *p) {
    if (p->dev) {
        mb_free(p->dev, p->hpred);
        mb_free(p->dev, p->htarg);
    }
    mbm_free(&p->acc);
    free(p->per);
    memset(p, 0, sizeof *p);
}

/* A batch: pred and y (rows, k) in device memory, rows <= max_rows. */
MBM_API mb_result mbm_pass_add(mbm_pass *p, const float *pred, const float *y, int64_t rows) {
    size_t bytes = (size_t)(rows * p->acc.k) * sizeof(float);
    MB_TRY(mb_copy(p->dev, MB_STREAM_COMPUTE, p->hpred, pred, bytes));
    MB_TRY(mb_copy(p->dev, MB_STREAM_COMPUTE, p->htarg, y, bytes));
    MB_TRY(mb_sync(p->dev, MB_STREAM_COMPUTE));
    return mbm_add(&p->acc, p->hpred, p->htarg, rows);
}

/* The pass's end: with compute, its metrics into p->per and p->mean; the rows dropped. */
MBM_API mb_result mbm_pass_end(mbm_pass *p, int compute) {
    mb_result r = compute ? mbm_compute(&p->acc, p->per, &p->mean) : MB_OK;
    mbm_reset(&p->acc);
    return r;
}

#endif /* MB_METRICS_H */
