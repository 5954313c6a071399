/* mb_features.h - the multi-timeframe bars and per-bar features of examples/prepare.c,
 * built incrementally: one implementation for the dataset (prepare) and a live predictor.
 *
 *   mbf_state *s = malloc(sizeof *s);  mbf_init(s, nf);
 *   mbf_out out;                                         (rows that closed with the bar)
 *   for each closed M1 bar b, in time order:
 *       if (mbf_push(s, &b, &out) != MBF_OK) ... mbf_error_text(code)
 *       for (int i = 0; i < out.n; i++) out.row[i].tf, out.row[i].bar, out.row[i].x[0..nf)
 *
 * Timeframes M1, M5, M15, H1, H4 (mbf_minutes). A bar of period P holds the M1 bars whose
 * start lies in [k P, (k+1) P) (open = first open, high = max, low = min, close = last
 * close, volume = sum, time = the bucket's start). It closes, and its feature row is
 * yielded, at the first M1 bar whose close (start + 60 s) reaches the bucket's end:
 * the bar ending the bucket, or after a gap the first bar of a later bucket (the gap bar
 * is closed first, then the new bar is added; one push can close two bars of a
 * timeframe). A forming bar is never used: a row depends only on closed bars of its own
 * timeframe. Rows come in timeframe order, each timeframe oldest first.
 *
 * Features (docs/PREPARE.md lists each with its formula): 0-11 the original twelve, 12-24
 * calendar encodings, then 16 families over 9 windows (3 .. 233 bars). Every feature looks
 * back at most MBF_RING - 1 bars of its timeframe, so an engine started later yields the
 * same rows, bit for bit, once a timeframe has MBF_WARMUP closed bars since it started.
 * Deterministic: the same bars give the same bits on every run and every platform (its own
 * log, sin and cos below, not libm's).
 * C11 and C++17; no allocation (an mbf_state is about 115 KB: allocate it). */
#ifndef MB_FEATURES_H
#define MB_FEATURES_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum {
    MBF_TFS = 5,      /* M1, M5, M15, H1, H4 */
    MBF_BASE = 12,    /* the original features */
    MBF_CAL = 13,     /* calendar encodings */
    MBF_FAMILIES = 16,
    MBF_WINDOWS = 9,
    MBF_MAX = MBF_BASE + MBF_CAL + MBF_FAMILIES * MBF_WINDOWS, /* 169 */
    MBF_RING = 256,   /* closed bars kept per timeframe (> the longest window) */
    MBF_WARMUP = 235  /* closed bars after which a late-started engine agrees bitwise */
};
static const int mbf_minutes[MBF_TFS] = {1, 5, 15, 60, 240};
static const int mbf_window[MBF_WINDOWS] = {3, 5, 8, 13, 34, 55, 89, 144, 233}; /* no 21: madev_20 and vol_20 are features 10, 11 */

/* mbf_push's results. */
enum { MBF_OK = 0, MBF_ERR_ORDER = -1, MBF_ERR_DUPLICATE = -2, MBF_ERR_ALIGN = -3, MBF_ERR_BAR = -4 };

typedef struct mbf_bar {
    int64_t t;           /* start, seconds since 1970-01-01 UTC */
    double o, h, l, c, v;
} mbf_bar;

typedef struct mbf_row {
    int tf;              /* 0..4: M1, M5, M15, H1, H4 */
    mbf_bar bar;         /* the bar that closed */
    float x[MBF_MAX];    /* its features (the first nf are set) */
} mbf_row;

typedef struct mbf_out {
    int n;
    mbf_row row[2 * MBF_TFS];
} mbf_out;

/* Per closed bar: the bar and the values its features reuse. */
typedef struct mbf__past {
    mbf_bar b;
    double r;            /* log(c / previous close), 0 for a timeframe's first bar */
    double lv, hl, lc;   /* log(v + 1), log(h / l), log(c) */
    double bf;           /* (c - o) / (h - l), 0 when h == l */
} mbf__past;

typedef struct mbf_tf {
    int64_t period;      /* seconds */
    int forming;         /* cur holds a bar not yet closed */
    mbf_bar cur;
    int64_t n;           /* closed bars so far; bar i is past[i % MBF_RING] */
    mbf__past past[MBF_RING];
} mbf_tf;

typedef struct mbf_state {
    int nf;              /* features per row, 1..MBF_MAX */
    int started;
    int64_t last;        /* start of the last M1 bar pushed */
    mbf_tf tf[MBF_TFS];
} mbf_state;

static inline void mbf_init(mbf_state *s, int nf) {
    memset(s, 0, sizeof *s);
    s->nf = nf < 1 ? 1 : nf > MBF_MAX ? MBF_MAX : nf;
    for (int k = 0; k < MBF_TFS; k++) s->tf[k].period = (int64_t)mbf_minutes[k] * 60;
}

static inline const char *mbf_error_text(int code) {
    switch (code) {
    case MBF_OK: return "ok";
    case MBF_ERR_ORDER: return "bar is older than the previous bar (out of order)";
    case MBF_ERR_DUPLICATE: return "bar has the same time as the previous bar (duplicate)";
    case MBF_ERR_ALIGN: return "bar time is not on a minute boundary";
    default: return "bad bar (prices must be finite and > 0, high >= low, volume finite and >= 0)";
    }
}

static inline int64_t mbf__floor_mod(int64_t a, int64_t p) { return (a % p + p) % p; }

/* ---- deterministic log, sin, cos ----
 * The engine's own log, sin and cos, so that a feature row has the same bits on every
 * platform (glibc, msvcrt, Apple's libm and MSVC's round differently in the last bit):
 * fdlibm's algorithms (Sun Microsystems, 1993: "Permission to use, copy, modify, and
 * distribute this software is freely granted, provided that this notice is preserved"),
 * in plain IEEE double operations (+ - * /, no library call, no fma), so any C11 or C++
 * compiler with SSE2 or NEON doubles and round to nearest gives the same bits. The
 * product-sums must not be contracted into fmas (GCC contracts in GNU and C++ modes on
 * targets with fma, Clang within an expression): the pragmas around this module turn that
 * off here (MSVC does not contract unless /fp:fast). The rest of the engine is plain
 * arithmetic too: build it with -std=c11 (GCC's ISO modes do not contract) or
 * -ffp-contract=off for the same bits on an fma target. Error below 1 ulp (tests/test_features.c
 * measures it against libm and long double on fresh random inputs: at most 1 ulp apart).
 * mbf_sin/mbf_cos reduce by pi/2 in three parts (fdlibm's medium case), exact for
 * |x| < 2^20 pi/2 (about 1.6e6); beyond that they return NaN (the features' angles are
 * in [0, 4 pi)). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

static inline uint32_t mbf__hi(double x) { uint64_t u; memcpy(&u, &x, 8); return (uint32_t)(u >> 32); }
static inline uint32_t mbf__lo(double x) { uint64_t u; memcpy(&u, &x, 8); return (uint32_t)u; }
static inline double mbf__with_hi(double x, uint32_t hi) {
    uint64_t u;
    memcpy(&u, &x, 8);
    u = (u & 0xffffffffu) | (uint64_t)hi << 32;
    memcpy(&x, &u, 8);
    return x;
}

/* Natural logarithm (fdlibm e_log.c): x = 2^k (1 + f), f in [sqrt(2)/2 - 1, sqrt(2) - 1),
 * log(1 + f) = 2 s + s R(s^2) with s = f / (2 + f). */
static inline double mbf_log(double x) {
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01, Lg3 = 2.857142874366239149e-01,
                 Lg4 = 2.222219843214978396e-01, Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                 Lg7 = 1.479819860511658591e-01;
    int32_t hx = (int32_t)mbf__hi(x), k = 0;
    if (hx < 0x00100000) {                                   /* x < 2^-1022: zero, negative, subnormal */
        if (((hx & 0x7fffffff) | (int32_t)mbf__lo(x)) == 0) return -HUGE_VAL;
        if (hx < 0) return NAN;
        k -= 54;
        x *= 18014398509481984.0;                            /* 2^54 */
        hx = (int32_t)mbf__hi(x);
    }
    if (hx >= 0x7ff00000) return x + x;                      /* inf or NaN */
    k += (hx >> 20) - 1023;
    hx &= 0x000fffff;
    int32_t i = (hx + 0x95f64) & 0x100000;
    x = mbf__with_hi(x, (uint32_t)(hx | (i ^ 0x3ff00000))); /* x or x/2 into [sqrt(2)/2, sqrt(2)) */
    k += i >> 20;
    double f = x - 1.0, dk = (double)k;
    if ((0x000fffff & (2 + hx)) < 3) {                       /* |f| < 2^-20 */
        if (f == 0.0) return k == 0 ? 0.0 : dk * ln2_hi + dk * ln2_lo;
        double R = f * f * (0.5 - 0.33333333333333333 * f);
        return k == 0 ? f - R : dk * ln2_hi - ((R - dk * ln2_lo) - f);
    }
    double s = f / (2.0 + f), z = s * s, w = z * z;
    double t1 = w * (Lg2 + w * (Lg4 + w * Lg6)), t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7))), R = t2 + t1;
    if (((hx - 0x6147a) | (0x6b851 - hx)) > 0) {
        double hfsq = 0.5 * f * f;
        return k == 0 ? f - (hfsq - s * (hfsq + R)) : dk * ln2_hi - ((hfsq - (s * (hfsq + R) + dk * ln2_lo)) - f);
    }
    return k == 0 ? f - s * (f - R) : dk * ln2_hi - ((s * (f - R) - dk * ln2_lo) - f);
}

/* sin(x + y) and cos(x + y) for |x + y| <= pi/4, y the tail of x (fdlibm k_sin.c, k_cos.c). */
static inline double mbf__ksin(double x, double y) {
    const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03, S3 = -1.98412698298579493134e-04,
                 S4 = 2.75573137070700676789e-06, S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    if ((mbf__hi(x) & 0x7fffffff) < 0x3e400000) return x;          /* |x| < 2^-27 */
    double z = x * x, v = z * x, r = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)));
    if (y == 0.0) return x + v * (S1 + z * r);
    return x - ((z * (0.5 * y - v * r) - y) - v * S1);
}
static inline double mbf__kcos(double x, double y) {
    const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03, C3 = 2.48015872894767294178e-05,
                 C4 = -2.75573143513906633035e-07, C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    uint32_t ix = mbf__hi(x) & 0x7fffffff;
    if (ix < 0x3e400000) return 1.0;                                 /* |x| < 2^-27 */
    double z = x * x, r = z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
    if (ix < 0x3fd33333) return 1.0 - (0.5 * z - (z * r - x * y)); /* |x| < 0.3 */
    double qx = ix > 0x3fe90000 ? 0.28125 : mbf__with_hi(0.0, ix - 0x00200000); /* x/4, rounded down */
    return (1.0 - qx) - ((0.5 * z - qx) - (z * r - x * y));
}

/* x = n pi/2 + (y[0] + y[1]), |y| <= pi/4; returns n (mod 4), or -1 when |x| >= 2^20 pi/2
 * (fdlibm e_rem_pio2.c, the medium case: pi/2 in three parts of 33 bits). */
static inline int mbf__rem_pio2(double x, double *y) {
    const double invpio2 = 6.36619772367581382433e-01, pio2_1 = 1.57079632673412561417e+00,
                 pio2_1t = 6.07710050650619224932e-11, pio2_2 = 6.07710050630396597660e-11,
                 pio2_2t = 2.02226624879595063154e-21, pio2_3 = 2.02226624871116645580e-21,
                 pio2_3t = 8.47842766036889956997e-32;
    uint32_t ix = mbf__hi(x) & 0x7fffffff;
    if (ix <= 0x3fe921fb) { y[0] = x; y[1] = 0.0; return 0; }       /* |x| <= pi/4 */
    if (ix > 0x413921fb) return -1;                                  /* |x| >= 2^20 pi/2, inf, NaN */
    double t = fabs(x);
    int n = (int)(t * invpio2 + 0.5);
    double fn = (double)n, r = t - fn * pio2_1, w = fn * pio2_1t;
    int j = (int)(ix >> 20);
    y[0] = r - w;
    if (j - (int)((mbf__hi(y[0]) >> 20) & 0x7ff) > 16) {             /* cancellation: 2nd part */
        t = r; w = fn * pio2_2; r = t - w; w = fn * pio2_2t - ((t - r) - w); y[0] = r - w;
        if (j - (int)((mbf__hi(y[0]) >> 20) & 0x7ff) > 49) {         /* 3rd part */
            t = r; w = fn * pio2_3; r = t - w; w = fn * pio2_3t - ((t - r) - w); y[0] = r - w;
        }
    }
    y[1] = (r - y[0]) - w;
    if (x < 0) { y[0] = -y[0]; y[1] = -y[1]; n = -n; }
    return n & 3;
}

static inline double mbf_sin(double x) {
    double y[2];
    switch (mbf__rem_pio2(x, y)) {
    case 0: return mbf__ksin(y[0], y[1]);
    case 1: return mbf__kcos(y[0], y[1]);
    case 2: return -mbf__ksin(y[0], y[1]);
    case 3: return -mbf__kcos(y[0], y[1]);
    default: return NAN;
    }
}

static inline double mbf_cos(double x) {
    double y[2];
    switch (mbf__rem_pio2(x, y)) {
    case 0: return mbf__kcos(y[0], y[1]);
    case 1: return -mbf__ksin(y[0], y[1]);
    case 2: return -mbf__kcos(y[0], y[1]);
    case 3: return mbf__ksin(y[0], y[1]);
    default: return NAN;
    }
}

#if defined(__clang__)
#pragma clang fp contract(on)
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif

/* Days since 1970-01-01 -> civil date (Howard Hinnant's algorithm). */
static inline void mbf__civil(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097, doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}

static inline int mbf__days_in_month(int y, int m) {
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return dm[m - 1] + (m == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0));
}

static inline const mbf__past *mbf__at(const mbf_tf *tf, int64_t i) { return &tf->past[i % MBF_RING]; }

/* 0-11: the original features (their formulas and summation order are those of the first
 * prepare, so files of up to 12 features are unchanged). */
static inline void mbf__base(const mbf_tf *tf, int64_t i, double *f) {
    const mbf_bar *b = &mbf__at(tf, i)->b, *p = i ? &mbf__at(tf, i - 1)->b : b;
    double prev_c = i ? p->c : b->o, prev_v = p->v;
    double top = fmax(b->o, b->c), bot = fmin(b->o, b->c);
    double tod = 6.283185307179586 * (double)mbf__floor_mod(b->t, 86400) / 86400.0;
    double dow = 6.283185307179586 * (double)mbf__floor_mod(b->t / 86400 + 3, 7) / 7.0; /* Monday = 0 */
    f[0] = mbf_log(b->c / prev_c);
    f[1] = mbf_log(b->h / b->l);
    f[2] = mbf_log(b->c / b->o);
    f[3] = mbf_log(b->h / top);
    f[4] = mbf_log(bot / b->l);
    f[5] = mbf_log((b->v + 1.0) / (prev_v + 1.0));
    f[6] = mbf_sin(tod); f[7] = mbf_cos(tod); f[8] = mbf_sin(dow); f[9] = mbf_cos(dow);
    int64_t w = i + 1 < 20 ? i + 1 : 20;
    double mean = 0, s1 = 0, s2 = 0;
    for (int64_t j = i + 1 - w; j <= i; j++) {
        const mbf__past *q = mbf__at(tf, j);
        mean += q->b.c; s1 += q->r; s2 += q->r * q->r;
    }
    f[10] = mbf_log(b->c / (mean / (double)w));
    f[11] = sqrt(fmax(s2 / (double)w - (s1 / (double)w) * (s1 / (double)w), 0.0));
}

/* 12-24: calendar encodings of the bar's start time (UTC). */
static inline void mbf__calendar(int64_t t, double *f) {
    const double tau = 6.283185307179586;
    int64_t day = (t - mbf__floor_mod(t, 86400)) / 86400, secs = mbf__floor_mod(t, 86400);
    int64_t dow = mbf__floor_mod(day + 3, 7), hour = secs / 3600;
    int y, m, d;
    mbf__civil(day, &y, &m, &d);
    double dim = (double)mbf__days_in_month(y, m), tod = tau * (double)secs / 86400.0;
    double how = tau * (double)(dow * 86400 + secs) / 604800.0, dom = tau * (double)(d - 1) / dim;
    double moy = tau * ((double)(m - 1) + (double)(d - 1) / dim) / 12.0;
    double moh = tau * (double)(secs % 3600) / 3600.0;
    f[0] = mbf_sin(2 * tod); f[1] = mbf_cos(2 * tod);
    f[2] = mbf_sin(how); f[3] = mbf_cos(how);
    f[4] = mbf_sin(dom); f[5] = mbf_cos(dom);
    f[6] = mbf_sin(moy); f[7] = mbf_cos(moy);
    f[8] = mbf_sin(moh); f[9] = mbf_cos(moh);
    f[10] = hour < 9;                 /* Tokyo session, 00-09 UTC */
    f[11] = hour >= 7 && hour < 16;   /* London, 07-16 */
    f[12] = hour >= 12 && hour < 21;  /* New York, 12-21 */
}

/* Sums over the newest w bars of a timeframe (age 0 = the bar that closed). */
typedef struct mbf__sums {
    double r, r2, r3, ar, hmax, lmin, c, v, lv, lv2, hl2, x, x2, y, xy, tv, typ, bf, arlv, acf;
    int up, down;
} mbf__sums;

static inline void mbf__add(mbf__sums *s, const mbf__past *q, int64_t age, double r_newer) {
    double r = q->r, typ = (q->b.h + q->b.l + q->b.c) / 3.0, x = (double)age;
    s->r += r; s->r2 += r * r; s->r3 += r * r * r; s->ar += fabs(r);
    s->hmax = age ? fmax(s->hmax, q->b.h) : q->b.h;
    s->lmin = age ? fmin(s->lmin, q->b.l) : q->b.l;
    s->c += q->b.c; s->v += q->b.v; s->lv += q->lv; s->lv2 += q->lv * q->lv; s->hl2 += q->hl * q->hl;
    s->x += x; s->x2 += x * x; s->y += q->lc; s->xy += x * q->lc;
    s->tv += typ * q->b.v; s->typ += typ; s->bf += q->bf; s->arlv += fabs(r) * q->lv;
    if (age) s->acf += r * r_newer;
    s->up += r > 0; s->down += r < 0;
}

/* Central second moment from sums, 0 when it is rounding noise of equal values. */
static inline double mbf__var(double s1, double s2, double w) {
    double m = s1 / w, v = s2 / w - m * m;
    return v > 1e-12 * (s2 / w) ? v : 0.0;
}

/* The 16 family values of one window (w bars) into f[fam * MBF_WINDOWS]. */
static inline void mbf__window(const mbf__sums *s, const mbf_bar *b, double w, double *f) {
    double vr = mbf__var(s->r, s->r2, w), vlv = mbf__var(s->lv, s->lv2, w), va = mbf__var(s->ar, s->r2, w);
    double mu = s->r / w, m3 = s->r3 / w - 3 * mu * s->r2 / w + 2 * mu * mu * mu;
    double dx = w * s->x2 - s->x * s->x, vwap = s->v > 0 ? s->tv / s->v : s->typ / w;
    double corr = va > 0 && vlv > 0 ? (s->arlv / w - (s->ar / w) * (s->lv / w)) / sqrt(va * vlv) : 0.0;
    double v[MBF_FAMILIES] = {
        s->r,                                                             /* ret */
        mbf_log(s->hmax / s->lmin),                                           /* range */
        sqrt(vr),                                                         /* vol */
        mbf_log((b->v + 1.0) / (s->v / w + 1.0)),                             /* vrel */
        mbf_log(b->c / (s->c / w)),                                           /* madev */
        s->hmax > s->lmin ? (2 * b->c - s->hmax - s->lmin) / (s->hmax - s->lmin) : 0.0, /* pos */
        sqrt(s->hl2 / w / (4 * 0.6931471805599453 /* ln 2 */)),                                /* park */
        s->ar > 0 ? s->r / s->ar : 0.0,                                   /* eff */
        sqrt(vlv),                                                        /* vstd */
        (double)(s->up - s->down) / w,                                    /* updown */
        dx > 0 ? -(w * s->xy - s->x * s->y) / dx : 0.0,                   /* slope */
        mbf_log(b->c / vwap),                                                 /* vwapdev */
        s->bf / w,                                                        /* bodyfrac */
        vr > 0 ? m3 / (vr * sqrt(vr)) : 0.0,                              /* skew */
        fmax(-1.0, fmin(1.0, corr)),                                      /* rvcorr */
        s->r2 > 0 ? s->acf / s->r2 : 0.0,                                 /* acf1 */
    };
    for (int k = 0; k < MBF_FAMILIES; k++) f[k * MBF_WINDOWS] = v[k];
}

/* 25-168: one pass from the newest bar back, each window read off when it is complete
 * (fewer bars than the window at a timeframe's start: all of them). */
static inline void mbf__families(const mbf_tf *tf, int64_t i, double *f) {
    int64_t avail = i + 1;
    mbf__sums s;
    memset(&s, 0, sizeof s);
    const mbf_bar *b = &mbf__at(tf, i)->b;
    double r_newer = 0;
    int wi = 0;
    for (int64_t age = 0; age < avail && wi < MBF_WINDOWS; age++) {
        const mbf__past *q = mbf__at(tf, i - age);
        mbf__add(&s, q, age, r_newer);
        r_newer = q->r;
        for (; wi < MBF_WINDOWS && (mbf_window[wi] == age + 1 || (age + 1 == avail && mbf_window[wi] > avail)); wi++)
            mbf__window(&s, b, (double)(age + 1), f + wi);
    }
}

/* Close timeframe k's forming bar: remember it, compute its row into out. */
static inline void mbf__close(mbf_state *s, int k, mbf_out *out) {
    mbf_tf *tf = &s->tf[k];
    int64_t i = tf->n;
    mbf__past *q = &tf->past[i % MBF_RING];
    const mbf_bar *b = &tf->cur;
    q->b = *b;
    q->r = i ? mbf_log(b->c / mbf__at(tf, i - 1)->b.c) : 0.0;
    q->lv = mbf_log(b->v + 1.0); q->hl = mbf_log(b->h / b->l); q->lc = mbf_log(b->c);
    q->bf = b->h > b->l ? (b->c - b->o) / (b->h - b->l) : 0.0;
    tf->n++;
    tf->forming = 0;
    double f[MBF_MAX];
    mbf__base(tf, i, f);
    if (s->nf > MBF_BASE) mbf__calendar(b->t, f + MBF_BASE);
    if (s->nf > MBF_BASE + MBF_CAL) mbf__families(tf, i, f + MBF_BASE + MBF_CAL);
    mbf_row *row = &out->row[out->n++];
    row->tf = k;
    row->bar = *b;
    for (int j = 0; j < s->nf; j++) row->x[j] = (float)f[j];
}

/* Would mbf_push take bar b after a bar starting at `last` (started = 0: b is the first)?
 * MBF_OK or the code mbf_push returns. prepare checks each CSV row with it, so a file's
 * rows are taken or refused alike by prepare and by the live predictor. */
static inline int mbf_check(const mbf_bar *b, int started, int64_t last) {
    if (started && b->t < last) return MBF_ERR_ORDER;
    if (started && b->t == last) return MBF_ERR_DUPLICATE;
    if (mbf__floor_mod(b->t, 60) != 0) return MBF_ERR_ALIGN;
    double p[4] = {b->o, b->h, b->l, b->c};
    for (int j = 0; j < 4; j++) if (!(p[j] > 0) || !isfinite(p[j])) return MBF_ERR_BAR;
    if (!(b->h >= b->l) || !(b->v >= 0) || !isfinite(b->v)) return MBF_ERR_BAR;
    return MBF_OK;
}

/* Feed one closed M1 bar (start time b->t on a minute, after the previous bar). Fills out
 * with the rows of every bar that closed with it (M1's always). On an error nothing
 * changes: out->n = 0 and the state is as before. */
static inline int mbf_push(mbf_state *s, const mbf_bar *b, mbf_out *out) {
    out->n = 0;
    int e = mbf_check(b, s->started, s->last);
    if (e != MBF_OK) return e;
    s->started = 1;
    s->last = b->t;
    for (int k = 0; k < MBF_TFS; k++) {
        mbf_tf *tf = &s->tf[k];
        int64_t start = b->t - mbf__floor_mod(b->t, tf->period);
        if (tf->forming && tf->cur.t != start) mbf__close(s, k, out); /* it ended in a gap */
        if (!tf->forming) {
            tf->cur = *b;
            tf->cur.t = start;
            tf->forming = 1;
        } else {
            tf->cur.h = fmax(tf->cur.h, b->h);
            tf->cur.l = fmin(tf->cur.l, b->l);
            tf->cur.c = b->c;
            tf->cur.v += b->v;
        }
        if (start + tf->period <= b->t + 60) mbf__close(s, k, out);
    }
    return MBF_OK;
}

/* Name of feature j (0..MBF_MAX-1), e.g. "ret_1", "tod_sin", "vol_21". */
static inline void mbf_feature_name(int j, char *buf, size_t cap) {
    static const char *const base[MBF_BASE + MBF_CAL] = {
        "ret_1", "range_1", "body", "wick_up", "wick_down", "dvol", "tod_sin", "tod_cos", "dow_sin", "dow_cos",
        "madev_20", "vol_20", "tod2_sin", "tod2_cos", "how_sin", "how_cos", "dom_sin", "dom_cos", "moy_sin",
        "moy_cos", "moh_sin", "moh_cos", "session_tokyo", "session_london", "session_newyork"};
    static const char *const fam[MBF_FAMILIES] = {"ret", "range", "vol", "vrel", "madev", "pos", "park", "eff",
        "vstd", "updown", "slope", "vwapdev", "bodyfrac", "skew", "rvcorr", "acf1"};
    if (j < 0 || j >= MBF_MAX) snprintf(buf, cap, "?");
    else if (j < MBF_BASE + MBF_CAL) snprintf(buf, cap, "%s", base[j]);
    else {
        int k = j - MBF_BASE - MBF_CAL;
        snprintf(buf, cap, "%s_%d", fam[k / MBF_WINDOWS], mbf_window[k % MBF_WINDOWS]);
    }
}

#endif /* MB_FEATURES_H */
