/* prepare.c - make the multi-timeframe dataset: M1 bars -> M5, M15, H1, H4 bars ->
 * per-bar features (examples/mb_features.h, built bar by bar as a live predictor would)
 * -> one sample per time t holding the last 480/288/192/96/48 bars of
 * each timeframe that CLOSED at or before t (no look-ahead) -> HDF5 files in the seeds'
 * layout (`features` [N, 1104, F], `targets` [N, K]), split by time into train and val.
 *
 *   build/prepare --synthetic [--bars N] [--seed S]          (the embedded default series)
 *   build/prepare --csv FILE [--skip-bad]                     (MetaTrader 5/4, histdata)
 *   build/prepare --synthetic --write-mt5 FILE                (a sample MT5 export, no HDF5)
 *   options: --out-train data/train.h5 --out-val data/val.h5 --features F (1..169) --targets K
 *            --stride S --val-fraction X --max-samples N --quiet
 *
 * Targets: K forward log returns of the M1 close after t, over horizons of 5, 10, ...,
 * 5K bars, divided by a scale fitted on the training period (stored as `target_scale`).
 * Features are normalised per timeframe with mean/std from training-period bars only
 * (stored as `feature_mean`/`feature_std` [5, F] in both files).
 * Exit 0 on success, 2 with one line `error: ...` on bad flags or data.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* isatty, fileno, gmtime_r */
#endif
#ifndef MEGABATCH_IMPLEMENTATION
#define MEGABATCH_IMPLEMENTATION /* standalone (a test that includes it has it already) */
#endif
#include "megabatch.h"
#include "mb_args.h"
#include "mb_features.h"
#include "mb_csv.h"     /* the CSV parser (predict --live reads with it too) */
#include <hdf5.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

enum { NTF = MBF_TFS, MAXF = MBF_MAX };
static const int tf_window[NTF] = {480, 288, 192, 96, 48}; /* bars per sample */
static const char *const tf_names = "M1,M5,M15,H1,H4";

// ---- synthetic ----
// A seeded M1 series a model can learn from: a hidden drift regime (up / flat / down,
// switching on average once a day), GARCH(1,1)-style volatility clustering, intraday
// seasonality of volatility, and weekends off. Randoms come from megabatch's Philox RNG.

static double gauss(uint64_t seed, uint64_t i) {
    double u1 = mb_rng_uniform(seed, 1, 2 * i) + 1e-9, u2 = mb_rng_uniform(seed, 1, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int make_synthetic(size_t nbars, uint64_t seed, mbc_bars *out) {
    memset(out, 0, sizeof *out);
    int64_t t = mbc_days_from_civil(2024, 1, 1) * 86400;  /* a Monday */
    double price = 1.1, var = 1e-8, base_var = 1e-8;
    int regime = 1;
    for (size_t i = 0; i < nbars; t += 60) {
        int64_t day = t / 86400, dow = (day + 4) % 7;  /* 1970-01-01 was a Thursday */
        if (dow == 6 || dow == 0) continue;            /* Saturday, Sunday */
        if (mb_rng_uniform(seed, 2, i) < 1.0 / 1440.0) regime = (int)(mb_rng_uniform(seed, 3, i) * 3.0);
        double hour = (double)(t % 86400) / 3600.0;
        double season = 0.6 + 0.8 * exp(-0.5 * pow((hour - 14.0) / 2.5, 2)) + 0.3 * exp(-0.5 * pow((hour - 8.0) / 2.0, 2));
        double e = sqrt(var) * gauss(seed, i);          /* GARCH(1,1) shock, unit mean variance */
        double r = (regime - 1) * 0.06 * sqrt(base_var) + season * e;
        var = base_var * 0.05 + 0.10 * e * e + 0.85 * var;
        double sigma = sqrt(var) * season;
        double open = price, close = price * exp(r);
        double wick = fabs(sigma * gauss(seed ^ 0x5bd1e995ull, i)) * 0.5;
        double high = fmax(open, close) * exp(wick), low = fmin(open, close) * exp(-wick * mb_rng_uniform(seed, 4, i));
        double vol = floor(50.0 * season * (1.0 + 20.0 * fabs(r) / sqrt(base_var) * 0.1) + 10.0 * mb_rng_uniform(seed, 5, i));
        if (mbc_bars_push(out, t, open, high, low, close, vol)) return -1;
        price = close;
        i++;
    }
    return 0;
}

// ---- samples ----
// Sample time t is the close of M1 bar i (its start + 60 s). A bar of timeframe P is
// usable iff start + P*60 <= t: a forming bar is never used.

typedef struct series {
    mbc_bars tf[NTF];          /* M1, M5, M15, H1, H4: closed mbc_bars */
    float *feat[NTF];      /* (tf[k].n, F) raw features, from mb_features.h */
    size_t feat_cap[NTF];  /* rows allocated in feat[k] */
    int nf;
} series;

static void series_free(series *s) {
    for (int k = 0; k < NTF; k++) { mbc_bars_free(&s->tf[k]); free(s->feat[k]); }
    memset(s, 0, sizeof *s);
}

/* Bars and feature rows of every timeframe, from the incremental engine (mb_features.h),
 * fed the M1 bars one at a time as a live predictor would be. */
static int series_add_row(series *s, const mbf_row *row) {
    mbc_bars *b = &s->tf[row->tf];
    size_t n = b->n;
    const mbf_bar *x = &row->bar;
    if (mbc_bars_push(b, x->t, x->o, x->h, x->l, x->c, x->v)) return -1;
    if (b->cap != s->feat_cap[row->tf]) {
        float *f = (float *)realloc(s->feat[row->tf], b->cap * (size_t)s->nf * sizeof(float));
        if (!f) return mbc_fail("out of memory for features");
        s->feat[row->tf] = f;
        s->feat_cap[row->tf] = b->cap;
    }
    memcpy(s->feat[row->tf] + n * (size_t)s->nf, row->x, (size_t)s->nf * sizeof(float));
    return 0;
}

static int series_build(const mbc_bars *m1, int nf, series *s) {
    memset(s, 0, sizeof *s);
    s->nf = nf;
    mbf_state *st = (mbf_state *)malloc(sizeof *st);
    mbf_out *out = (mbf_out *)malloc(sizeof *out);
    int r = st && out ? 0 : mbc_fail("out of memory for the feature engine");
    if (st) mbf_init(st, nf);
    for (size_t i = 0; r == 0 && i < m1->n; i++) {
        mbf_bar b = {m1->t[i], m1->o[i], m1->h[i], m1->l[i], m1->c[i], m1->v[i]};
        int e = mbf_push(st, &b, out);
        if (e) r = mbc_fail("M1 bar %zu (time %lld): %s", i + 1, (long long)b.t, mbf_error_text(e));
        for (int j = 0; r == 0 && j < out->n; j++) r = series_add_row(s, &out->row[j]);
    }
    free(st);
    free(out);
    return r;
}

/* Number of bars of timeframe k closed at time t (binary search on start times). */
static size_t closed_bars(const mbc_bars *b, int minutes, int64_t t) {
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (b->t[mid] + (int64_t)minutes * 60 <= t) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Raw (unnormalised) features of the sample at time t: (1104, F). Returns -1 when some
 * timeframe has fewer closed bars than its window. */
static int sample_features(const series *s, int64_t t, float *out) {
    size_t row = 0;
    for (int k = 0; k < NTF; k++) {
        size_t n = closed_bars(&s->tf[k], mbf_minutes[k], t), w = (size_t)tf_window[k];
        if (n < w) return -1;
        memcpy(out + row * (size_t)s->nf, s->feat[k] + (n - w) * (size_t)s->nf, w * (size_t)s->nf * sizeof(float));
        row += w;
    }
    return 0;
}

// ---- hdf5 output ----

typedef struct h5out { hid_t file, feat, targ, times; hsize_t n; } h5out;

static int h5_attr_floats(hid_t obj, const char *name, const float *v, hsize_t rows, hsize_t cols) {
    hsize_t dims[2] = {rows, cols};
    hid_t sp = H5Screate_simple(cols ? 2 : 1, dims, NULL);
    hid_t a = H5Acreate2(obj, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_FLOAT, v);
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return e < 0 ? mbc_fail("cannot write attribute %s", name) : 0;
}

/* The attributes that describe the windows (segments, segment_names) and the feature
 * normalisation (feature_mean, feature_std [5, F]): on `features`, or on `ends` (series). */
static int h5_segment_attrs(hid_t obj, int nf, const float *mean, const float *std) {
    int seg[NTF];
    for (int i = 0; i < NTF; i++) seg[i] = tf_window[i];
    hsize_t sd[1] = {NTF};
    hid_t ss = H5Screate_simple(1, sd, NULL), str = H5Tcopy(H5T_C_S1), scal = H5Screate(H5S_SCALAR);
    H5Tset_size(str, strlen(tf_names) + 1);
    hid_t a1 = H5Acreate2(obj, "segments", H5T_STD_I32LE, ss, H5P_DEFAULT, H5P_DEFAULT);
    hid_t a2 = H5Acreate2(obj, "segment_names", str, scal, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = (a1 < 0 || a2 < 0) ? -1 : (H5Awrite(a1, H5T_NATIVE_INT, seg) | H5Awrite(a2, str, tf_names));
    if (a1 >= 0) H5Aclose(a1);
    if (a2 >= 0) H5Aclose(a2);
    H5Sclose(ss); H5Sclose(scal); H5Tclose(str);
    if (e < 0) return -1;
    return h5_attr_floats(obj, "feature_mean", mean, NTF, (hsize_t)nf) || h5_attr_floats(obj, "feature_std", std, NTF, (hsize_t)nf);
}

static int h5_create(h5out *o, const char *path, hsize_t n, int nf, int k, const float *mean, const float *std,
                     float target_scale) {
    memset(o, 0, sizeof *o);
    o->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (o->file < 0) return mbc_fail("cannot create '%s'", path);
    hsize_t fd[3] = {n, 1104, (hsize_t)nf}, td[2] = {n, (hsize_t)k}, nd[1] = {n};
    hid_t fs = H5Screate_simple(3, fd, NULL), ts = H5Screate_simple(2, td, NULL), ns = H5Screate_simple(1, nd, NULL);
    o->feat = H5Dcreate2(o->file, "features", H5T_IEEE_F32LE, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    o->targ = H5Dcreate2(o->file, "targets", H5T_IEEE_F32LE, ts, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    o->times = H5Dcreate2(o->file, "times", H5T_STD_I64LE, ns, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Sclose(fs); H5Sclose(ts); H5Sclose(ns);
    if (o->feat < 0 || o->targ < 0 || o->times < 0) return mbc_fail("cannot create datasets in '%s'", path);
    if (h5_segment_attrs(o->feat, nf, mean, std) || h5_attr_floats(o->targ, "target_scale", &target_scale, 1, 0))
        return mbc_fail("cannot write attributes in '%s'", path);
    return 0;
}

/* Write sample rows [o->n, o->n + count) of the three datasets. */
static int h5_append(h5out *o, hsize_t count, int nf, int k, const float *feat, const float *targ, const int64_t *times) {
    hsize_t s3[3] = {o->n, 0, 0}, c3[3] = {count, 1104, (hsize_t)nf};
    hsize_t s2[2] = {o->n, 0}, c2[2] = {count, (hsize_t)k};
    hid_t ds[3] = {o->feat, o->targ, o->times}, mt[3] = {H5T_NATIVE_FLOAT, H5T_NATIVE_FLOAT, H5T_NATIVE_INT64};
    const void *bufs[3] = {feat, targ, times};
    const hsize_t *starts[3] = {s3, s2, s2}, *counts[3] = {c3, c2, c2};
    int ranks[3] = {3, 2, 1};
    for (int i = 0; i < 3; i++) {
        hid_t fs = H5Dget_space(ds[i]), ms = H5Screate_simple(ranks[i], counts[i], NULL);
        herr_t e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, starts[i], NULL, counts[i], NULL);
        if (e >= 0) e = H5Dwrite(ds[i], mt[i], ms, fs, H5P_DEFAULT, bufs[i]);
        H5Sclose(fs); H5Sclose(ms);
        if (e < 0) return mbc_fail("writing samples %llu.. failed", (unsigned long long)o->n);
    }
    o->n += count;
    return 0;
}

static int h5_close(h5out *o) {
    herr_t e = 0;
    if (o->feat > 0) e |= H5Dclose(o->feat);
    if (o->targ > 0) e |= H5Dclose(o->targ);
    if (o->times > 0) e |= H5Dclose(o->times);
    if (o->file > 0) e |= H5Fclose(o->file);
    memset(o, 0, sizeof *o);
    return e < 0 ? mbc_fail("closing the HDF5 file failed") : 0;
}

// ---- dataset assembly ----

typedef struct prep_config {
    int nf;              /* features per bar, 1..MAXF (169; default 12) */
    int k;               /* targets: horizons 5, 10, ..., 5K M1 bars (default 36) */
    int stride;          /* one sample every `stride` M1 bars (default 15) */
    double val_fraction; /* last part of the samples, by time (default 0.2) */
    size_t max_samples;  /* 0: all */
    int quiet;
    const char *out_train, *out_val;
    int series;          /* --layout series: bars once + per-sample bar indices (docs/SERIES.md) */
} prep_config;

typedef struct prep_plan {
    size_t *idx;          /* M1 bar index of each sample, in time order */
    size_t n, n_train;    /* samples; the first n_train are training samples */
    size_t first_val;     /* index into idx of the first validation sample */
} prep_plan;

/* Pick sample bars: enough history for every window, every horizon inside the data,
 * and a gap of at least the longest horizon between train and validation. */
static int plan_samples(const series *s, const prep_config *c, prep_plan *p) {
    const mbc_bars *m1 = &s->tf[0];
    size_t horizon = (size_t)5 * (size_t)c->k, cap = m1->n / (size_t)c->stride + 1;
    memset(p, 0, sizeof *p);
    p->idx = (size_t *)malloc(cap * sizeof *p->idx);
    if (!p->idx) return mbc_fail("out of memory");
    for (size_t i = 0; i + horizon < m1->n; i += (size_t)c->stride) {
        int64_t t = m1->t[i] + 60;
        int ok = 1;
        for (int k = 0; k < NTF && ok; k++) ok = closed_bars(&s->tf[k], mbf_minutes[k], t) >= (size_t)tf_window[k];
        if (ok) p->idx[p->n++] = i;
    }
    if (c->max_samples && p->n > c->max_samples) {
        memmove(p->idx, p->idx + (p->n - c->max_samples), c->max_samples * sizeof *p->idx);
        p->n = c->max_samples;
    }
    size_t n_val = (size_t)((double)p->n * c->val_fraction);
    p->n_train = p->n - n_val;
    p->first_val = p->n_train;
    if (p->n >= 3 && n_val < 1) /* the split, not the history, leaves the validation file empty */
        return mbc_fail("--val-fraction %g of %zu usable samples leaves no validation sample: use at least %.3g",
                        c->val_fraction, p->n, 1.0 / (double)p->n);
    if (p->n >= 3 && p->n_train < 2)
        return mbc_fail("--val-fraction %g of %zu usable samples leaves %zu training samples (2 needed): use a "
                        "smaller --val-fraction", c->val_fraction, p->n, p->n_train);
    if (p->n_train < 2 || n_val < 1)
        return mbc_fail("too little data: %zu usable samples (need 8 days of history before the first; "
                    "use more bars or a smaller --stride)", p->n);
    while (p->first_val < p->n && p->idx[p->first_val] <= p->idx[p->n_train - 1] + horizon) p->first_val++;
    if (p->first_val >= p->n)
        return mbc_fail("no validation sample after the gap of %zu bars: use more bars or a larger --val-fraction", horizon);
    return 0;
}

static void targets_of(const mbc_bars *m1, size_t i, int k, float scale, float *out) {
    for (int j = 0; j < k; j++) out[j] = (float)(log(m1->c[i + 5 * (size_t)(j + 1)] / m1->c[i]) / scale);
}

/* Mean and std per (timeframe, feature) over bars closed by the last training sample. */
static void fit_normaliser(const series *s, int64_t t_end, float *mean, float *std) {
    for (int k = 0; k < NTF; k++) {
        size_t n = closed_bars(&s->tf[k], mbf_minutes[k], t_end);
        for (int f = 0; f < s->nf; f++) {
            double s1 = 0, s2 = 0;
            for (size_t i = 0; i < n; i++) { double v = s->feat[k][i * (size_t)s->nf + f]; s1 += v; s2 += v * v; }
            double m = n ? s1 / (double)n : 0, var = n ? s2 / (double)n - m * m : 0;
            mean[k * s->nf + f] = (float)m;
            std[k * s->nf + f] = (float)(var > 1e-20 ? sqrt(var) : 1.0);
        }
    }
}

static float fit_target_scale(const mbc_bars *m1, const prep_plan *p, int k) {
    double s2 = 0;
    size_t n = 0;
    for (size_t s = 0; s < p->n_train; s++)
        for (int j = 0; j < k; j++) {
            double r = log(m1->c[p->idx[s] + 5 * (size_t)(j + 1)] / m1->c[p->idx[s]]);
            s2 += r * r; n++;
        }
    double rms = n ? sqrt(s2 / (double)n) : 1.0;
    return (float)(rms > 0 ? rms : 1.0);
}

static void progress(const prep_config *c, const char *what, size_t done, size_t total) {
    if (c->quiet || total == 0 || !isatty(fileno(stderr))) return;
    int w = 40, fill = (int)((double)done / (double)total * w);
    fprintf(stderr, "\r%-6s [%.*s%*s] %zu/%zu", what, fill, "########################################", w - fill, "",
            done, total);
    if (done == total) fputc('\n', stderr);
}

/* Write samples [from, to) of the plan to path. */
static int write_split(const series *s, const prep_plan *p, size_t from, size_t to, const prep_config *c,
                       const char *path, const char *what, const float *mean, const float *std, float scale) {
    enum { BLOCK = 64 };
    size_t row = (size_t)1104 * (size_t)c->nf;
    float *feat = (float *)malloc(BLOCK * row * sizeof(float)), *targ = (float *)malloc(BLOCK * (size_t)c->k * sizeof(float));
    int64_t times[BLOCK];
    h5out o;
    memset(&o, 0, sizeof o);
    int r = (!feat || !targ) ? mbc_fail("out of memory") : h5_create(&o, path, to - from, c->nf, c->k, mean, std, scale);
    for (size_t b = from; r == 0 && b < to; b += BLOCK) {
        size_t cnt = to - b < BLOCK ? to - b : BLOCK;
        for (size_t j = 0; j < cnt; j++) {
            size_t i = p->idx[b + j];
            times[j] = s->tf[0].t[i] + 60;
            float *fx = feat + j * row;
            sample_features(s, times[j], fx); /* planned samples always have full windows */
            for (size_t rr = 0, seg = 0, left = (size_t)tf_window[0]; rr < 1104; rr++, left--) {
                if (left == 0) left = (size_t)tf_window[++seg];
                for (int f = 0; f < c->nf; f++) {
                    size_t m = seg * (size_t)c->nf + (size_t)f;
                    fx[rr * (size_t)c->nf + (size_t)f] = (fx[rr * (size_t)c->nf + (size_t)f] - mean[m]) / std[m];
                }
            }
            targets_of(&s->tf[0], i, c->k, scale, targ + j * (size_t)c->k);
        }
        r = h5_append(&o, cnt, c->nf, c->k, feat, targ, times);
        progress(c, what, b + cnt - from, to - from);
    }
    if (o.file > 0 && h5_close(&o) && r == 0) r = -1;
    free(feat); free(targ);
    return r;
}

// ---- series layout ----
// Per timeframe k the normalised bars a split's windows use, `bars_k` (hi - lo + 1, F), and
// per sample the index of its last closed bar in each, `ends` (N, 5), relative to lo: the
// window layout's rows are bars_k[ends - w_k + 1 .. ends], bit for bit (same float math).

/* A whole dataset: create, write, and return it open (or -1). */
static hid_t h5_write_all(hid_t file, const char *name, hid_t ftype, hid_t mtype, int rank, const hsize_t *dims,
                          const void *buf) {
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(file, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Sclose(sp);
    if (d >= 0 && H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) { H5Dclose(d); d = -1; }
    if (d < 0) mbc_fail("cannot write '%s'", name);
    return d;
}

/* bars_k: rows [lo, hi] of timeframe k, normalised. */
static int write_bars(hid_t file, const series *s, int k, size_t lo, size_t hi, const float *mean, const float *std) {
    size_t nf = (size_t)s->nf, rows = hi - lo + 1;
    float *x = (float *)malloc(rows * nf * sizeof(float));
    if (!x) return mbc_fail("out of memory for %zu bars", rows);
    for (size_t r = 0; r < rows; r++)
        for (size_t f = 0; f < nf; f++)
            x[r * nf + f] = (s->feat[k][(lo + r) * nf + f] - mean[(size_t)k * nf + f]) / std[(size_t)k * nf + f];
    char name[32];
    snprintf(name, sizeof name, "bars_%d", k);
    hsize_t d[2] = {rows, nf};
    hid_t ds = h5_write_all(file, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, d, x);
    free(x);
    if (ds < 0) return -1;
    H5Dclose(ds);
    return 0;
}

/* Samples [from, to) of the plan as a series file. */
static int write_series(const series *s, const prep_plan *p, size_t from, size_t to, const prep_config *c,
                        const char *path, const float *mean, const float *std, float scale) {
    size_t n = to - from, lo[NTF];
    int64_t *ends = (int64_t *)malloc(n * NTF * sizeof *ends), *times = (int64_t *)malloc(n * sizeof *times);
    float *targ = (float *)malloc(n * (size_t)c->k * sizeof(float));
    int r = ends && times && targ ? 0 : mbc_fail("out of memory");
    for (size_t j = 0; r == 0 && j < n; j++) {
        size_t i = p->idx[from + j];
        times[j] = s->tf[0].t[i] + 60;
        for (int k = 0; k < NTF; k++) ends[j * NTF + (size_t)k] = (int64_t)closed_bars(&s->tf[k], mbf_minutes[k], times[j]) - 1;
        targets_of(&s->tf[0], i, c->k, scale, targ + j * (size_t)c->k);
    }
    hid_t file = r ? -1 : H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (r == 0 && file < 0) r = mbc_fail("cannot create '%s'", path);
    for (int k = 0; r == 0 && k < NTF; k++) {
        lo[k] = (size_t)ends[k] + 1 - (size_t)tf_window[k]; /* planned samples have full windows */
        r = write_bars(file, s, k, lo[k], (size_t)ends[(n - 1) * NTF + (size_t)k], mean, std);
        for (size_t j = 0; j < n; j++) ends[j * NTF + (size_t)k] -= (int64_t)lo[k];
    }
    hsize_t ed[2] = {n, NTF}, td[2] = {n, (hsize_t)c->k};
    hid_t de = r ? -1 : h5_write_all(file, "ends", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, ed, ends);
    hid_t dt = de < 0 ? -1 : h5_write_all(file, "targets", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, td, targ);
    hid_t dm = dt < 0 ? -1 : h5_write_all(file, "times", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, ed, times);
    if (r == 0 && dm < 0) r = -1;
    if (r == 0 && (h5_segment_attrs(de, c->nf, mean, std) || h5_attr_floats(dt, "target_scale", &scale, 1, 0)))
        r = mbc_fail("cannot write attributes in '%s'", path);
    hid_t h[3] = {de, dt, dm};
    for (int i = 0; i < 3; i++) if (h[i] >= 0) H5Dclose(h[i]);
    if (file >= 0 && H5Fclose(file) < 0 && r == 0) r = mbc_fail("closing '%s' failed", path);
    free(ends); free(times); free(targ);
    return r;
}

/* A file written, read back through the one open every tool uses (mba_open_data: the probe
 * in a child, then the in-process open): what train_multitf and predict will see. */
static int read_back(const char *path, const char *name, size_t n, const prep_config *c) {
    mb_dataset *ds = NULL;
    if (mba_open_data(path, 1, &ds) != MB_OK)
        return mbc_fail("reading back '%s': %s", name, mba_user_text(mb_last_error()));
    const mb_dataset_meta *m = mb_dataset_info(ds);
    int ok = m->n == (int64_t)n && m->t == 1104 && m->f == c->nf && m->k == c->k && m->segments == NTF;
    if (!ok) mbc_fail("'%s' reads back as N=%lld T=%lld F=%lld K=%lld, %d segments, not the N=%zu T=1104 F=%d K=%d, "
                       "%d segments written", name, (long long)m->n, (long long)m->t, (long long)m->f, (long long)m->k,
                       m->segments, n, c->nf, c->k, NTF);
    mb_dataset_close(ds);
    return ok ? 0 : -1;
}

/* The two files' directories made (mkdir -p), each file written to FILE.tmp (mba_write_path)
 * and read back, then both renamed into place (mba_commit): a failure leaves the files that
 * were there before as they were. */
static int write_outputs(const series *s, const prep_plan *p, const prep_config *c, const float *mean, const float *std,
                         float scale) {
    char tmp[2][1100], dir[1024];
    const char *path[2] = {c->out_train, c->out_val};
    size_t from[2] = {0, p->first_val}, to[2] = {p->n_train, p->n};
    int r = 0;
    for (int i = 0; r == 0 && i < 2; i++) {
        if (mba_mkdirs(path[i], dir, sizeof dir)) r = mbc_fail("cannot make the directory '%s': %s", dir, strerror(errno));
        else if (mba_write_path(path[i], tmp[i], sizeof tmp[i])) r = mbc_fail("'%s': the name is too long", path[i]);
        else if (c->series) r = write_series(s, p, from[i], to[i], c, tmp[i], mean, std, scale);
        else r = write_split(s, p, from[i], to[i], c, tmp[i], i ? "val" : "train", mean, std, scale);
        if (r == 0) r = read_back(tmp[i], path[i], to[i] - from[i], c);
        if (r && strcmp(tmp[i], path[i])) unlink(tmp[i]);
        if (r && i && strcmp(tmp[0], path[0])) unlink(tmp[0]);
    }
    for (int i = 0; r == 0 && i < 2; i++)
        if (mba_commit(tmp[i], path[i])) {
            r = mbc_fail("cannot write '%s': %s", path[i], strerror(errno));
            if (!i && strcmp(tmp[1], path[1])) unlink(tmp[1]);
        }
    return r;
}

static int prepare(const mbc_bars *m1, const prep_config *c) {
    series s;
    prep_plan p;
    memset(&p, 0, sizeof p);
    int r = series_build(m1, c->nf, &s);
    if (r == 0) r = plan_samples(&s, c, &p);
    if (r == 0) {
        float mean[NTF * MAXF], std[NTF * MAXF];
        fit_normaliser(&s, s.tf[0].t[p.idx[p.n_train - 1]] + 60, mean, std);
        float scale = fit_target_scale(&s.tf[0], &p, c->k);
        r = write_outputs(&s, &p, c, mean, std, scale);
        if (r == 0 && !c->quiet)
            printf("prepare: %zu M1 bars -> %zu train samples (%s), %zu val samples (%s), T=1104 F=%d K=%d, "
                   "target scale %.3g, %s layout\n", m1->n, p.n_train, c->out_train, p.n - p.first_val, c->out_val, c->nf,
                   c->k, (double)scale, c->series ? "series" : "window");
    }
    free(p.idx);
    series_free(&s);
    return r;
}

// ---- command line ----

#ifndef PREPARE_NO_MAIN
static const char usage[] =
    "usage: prepare --synthetic [--bars N] [--seed S]     the embedded synthetic M1 series\n"
    "       prepare --csv FILE [--skip-bad]               MetaTrader 5/4 or histdata M1 bars\n"
    "       prepare --synthetic --write-mt5 FILE          the synthetic bars as an MT5 export, no HDF5\n"
    "       prepare --list-features                       the feature names, one a line\n"
    "Makes data/train.h5 and data/val.h5: samples of the last 480 M1, 288 M5, 192 M15, 96 H1\n"
    "and 48 H4 closed bars x F features, K forward-return targets (docs/PREPARE.md).\n"
    "  --out-train FILE     [data/train.h5]\n"
    "  --out-val FILE       [data/val.h5]\n"
    "  --features F         features per bar, 1..169 [12]\n"
    "  --targets K          forward returns over 5, 10, ..., 5K M1 bars, 1..1000 [36]\n"
    "  --stride S           one sample every S M1 bars [15]\n"
    "  --val-fraction X     the last part of the samples, by time, in (0, 1) [0.2]\n"
    "  --max-samples N      keep the last N samples [all]\n"
    "  --layout L           window (every sample's window, [N, 1104, F]) or series (each bar once\n"
    "                       + per-sample bar indices; docs/SERIES.md) [window]\n"
    "  --bars N             synthetic M1 bars, 1..1e8 [400000]\n"
    "  --seed S             synthetic series seed [1]\n"
    "  --skip-bad           skip the CSV rows the live predictor would refuse (unparsable, bad\n"
    "                       values, out of order, duplicate, not on a minute) instead of stopping\n"
    "  --write-mt5 FILE     write the M1 bars (synthetic or --csv's) as a MetaTrader 5 export\n"
    "                       (tab-separated, <DATE> <TIME> ...) and stop: a sample file for docs/TRADING.md\n"
    "  --quiet              no progress and no summary line\n"
    "  -h, --help           this text\n"
    "The files written are read back through the probe every tool uses (docs/RELIABILITY.md).\n"
    "Exit 0 on success, 2 with one line `error: ...` on stderr otherwise.\n";

static int list_features(void) {
    for (int j = 0; j < MAXF; j++) {
        char name[32];
        mbf_feature_name(j, name, sizeof name);
        printf("%d %s\n", j, name);
    }
    return 0;
}

/* The M1 bars as a MetaTrader 5 export (what docs/TRADING.md starts from). */
static int write_mt5(const mbc_bars *m1, const char *path, int quiet) {
    char tmp[1100];
    if (mba_write_path(path, tmp, sizeof tmp)) return mbc_fail("'%s': the name is too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return mbc_fail("cannot write '%s': %s", path, strerror(errno));
    fputs("<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\n", f);
    for (size_t i = 0; i < m1->n; i++) {
        time_t tt = (time_t)m1->t[i];
        struct tm tm;
        char when[32] = "";
        if (gmtime_r(&tt, &tm)) strftime(when, sizeof when, "%Y.%m.%d\t%H:%M:%S", &tm);
        fprintf(f, "%s\t%.5f\t%.5f\t%.5f\t%.5f\t%.0f\t0\t10\n", when, m1->o[i], m1->h[i], m1->l[i], m1->c[i], m1->v[i]);
    }
    int bad = ferror(f) | fclose(f);
    if (bad && strcmp(tmp, path)) unlink(tmp);
    if (bad || mba_commit(tmp, path)) return mbc_fail("cannot write '%s': %s", path, strerror(errno ? errno : EIO));
    if (!quiet) printf("prepare: %zu M1 bars -> %s (MetaTrader 5 export)\n", m1->n, path);
    return 0;
}

/* The output-path rule (mb_args.h), before any work: the outputs are not the input, nor each
 * other; --out-train and --out-val may be in directories not made yet (made when written).
 * 0, or the error printed and 2. */
static int outputs_ok(const prep_config *c, const char *csv, const char *mt5) {
    mba_file in[] = {{"--csv", csv, 0, 0}};
    mba_file out[] = {{"--out-train", mt5 ? NULL : c->out_train, 1, 1}, {"--out-val", mt5 ? NULL : c->out_val, 1, 1},
                      {"--write-mt5", mt5, 0, 1}};
    return mba_outputs_ok(in, 1, out, 3) ? 0 : 2;
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    static const char *const layouts[] = {"window", "series", NULL};
    prep_config c = {12, 36, 15, 0.2, 0, 0, "data/train.h5", "data/val.h5", 0};
    const char *csv = NULL, *mt5 = NULL;
    int synthetic = 0, skip_bad = 0, list = 0;
    int64_t nbars = 400000, seed = 1, max_samples = 0;
    const mba_flag flags[] = {
        {"--synthetic", MBA_SET, &synthetic, 0, 0, NULL}, {"--skip-bad", MBA_SET, &skip_bad, 0, 0, NULL},
        {"--quiet", MBA_SET, &c.quiet, 0, 0, NULL}, {"--list-features", MBA_SET, &list, 0, 0, NULL},
        {"--csv", MBA_STR, &csv, 0, 0, NULL}, {"--out-train", MBA_STR, &c.out_train, 0, 0, NULL},
        {"--out-val", MBA_STR, &c.out_val, 0, 0, NULL}, {"--write-mt5", MBA_STR, &mt5, 0, 0, NULL},
        {"--layout", MBA_CHOICE, &c.series, 0, 0, layouts}, {"--bars", MBA_I64, &nbars, 1, 1e8, NULL},
        {"--seed", MBA_I64, &seed, 0, 2147483647, NULL}, {"--features", MBA_INT, &c.nf, 1, MAXF, NULL},
        {"--targets", MBA_INT, &c.k, 1, 1000, NULL}, {"--stride", MBA_INT, &c.stride, 1, 100000, NULL},
        {"--max-samples", MBA_I64, &max_samples, 1, 1e8, NULL},
        {"--val-fraction", MBA_F64, &c.val_fraction, 1e-9, 1 - 1e-9, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 2;
    if (list) return list_features();
    c.max_samples = (size_t)max_samples;
    if (synthetic == (csv != NULL)) return mba_error("give exactly one of --synthetic or --csv FILE (see --help)");
    int bad = outputs_ok(&c, csv, mt5);
    if (bad) return bad;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our own error lines only */
    mbc_bars m1 = {0};
    size_t skipped = 0;
    int r = synthetic ? make_synthetic((size_t)nbars, (uint64_t)seed, &m1) : mbc_read_csv_file(csv, skip_bad, &m1, &skipped);
    char why[256];
    if (r == 0 && skipped && !c.quiet) printf("prepare: skipped %zu bad rows (%s)\n", skipped, mbc_skips_text(why, sizeof why));
    if (r == 0) r = mt5 ? write_mt5(&m1, mt5, c.quiet) : prepare(&m1, &c);
    mbc_bars_free(&m1);
    if (r) { fprintf(stderr, "error: %s\n", mbc_error); return 2; }
    return 0;
}
#endif
