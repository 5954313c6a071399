/* mtf_live_dll.c - the live predictor as a shared library with a small C ABI
 * (examples/dll/mtf_live_dll.h): mtf_live.dll for MetaTrader 5 (#import, examples/mql5/)
 * and Windows C hosts, libmtf_live.so on Linux. docs/TRADING.md, docs/PLATFORMS.md.
 *
 *   make build/cross/win/mtf_live.dll     (x86_64-w64-mingw32-gcc; no DLL dependencies but
 *                                           KERNEL32 and msvcrt: nothing to ship next to it)
 *   make build/cross/linux/libmtf_live.so
 *
 * Built with MEGABATCH_NO_HDF5 (a DLL reads safetensors models, not datasets) and, on
 * Windows, MEGABATCH_NO_CBLAS (no OpenBLAS for MinGW in Debian): the LSTM's own kernels
 * (AVX-512, AVX2 + FMA, portable C; picked at run time) do the work, as in `predict --live`.
 *
 * Handles: a table of MTFL_MAX_HANDLES slots under one lock; a handle is slot + 64 x
 * generation, so a closed handle never reaches the predictor that reuses its slot. A call
 * marks its slot busy for its duration (another thread's call on it: MTFL_ERR_BUSY; close
 * waits for nothing, it refuses). Every argument is checked before the predictor is
 * touched, and mtf_live_push refuses a bad bar without changing anything, so an error
 * leaves the handle as it was. */
#define MTFL_BUILD
#define MEGABATCH_IMPLEMENTATION
#define MEGABATCH_STATIC
#include "../../megabatch.h"
#include "../mtf_live.h"
#include "mtf_live_dll.h"
#include <math.h>
#include <stdarg.h>

typedef struct mtfl_slot {
    mtf_live *lv;
    int gen;  /* bumped at every open of the slot */
    int busy; /* a call is using lv */
} mtfl_slot;

static mtfl_slot mtfl_slots[MTFL_MAX_HANDLES];
static MB__TLS char mtfl_err[MB_MAX_ERROR];

#ifdef _WIN32
static SRWLOCK mtfl_mu = SRWLOCK_INIT;
static void mtfl_lock(int on) {
    if (on) AcquireSRWLockExclusive(&mtfl_mu);
    else ReleaseSRWLockExclusive(&mtfl_mu);
}
#else
static pthread_mutex_t mtfl_mu = PTHREAD_MUTEX_INITIALIZER;
static void mtfl_lock(int on) {
    if (on) pthread_mutex_lock(&mtfl_mu);
    else pthread_mutex_unlock(&mtfl_mu);
}
#endif

/* Set this thread's last error; returns code. */
static int mtfl_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mtfl_err, sizeof mtfl_err, fmt, ap);
    va_end(ap);
    return code;
}

/* megabatch's result (its text in mb_last_error) as an MTFL code. */
static int mtfl_from(mb_result r, int refused) {
    int code = r == MB_ERR_OUT_OF_MEMORY ? MTFL_ERR_MEMORY : refused ? MTFL_ERR_BAR : MTFL_ERR_INTERNAL;
    return mtfl_fail(code, "%s", mb_last_error());
}

/* The slot of handle h, marked busy (release with mtfl_release); NULL with the error set. */
static mtfl_slot *mtfl_acquire(int h, int *err) {
    int i = h % MTFL_MAX_HANDLES, gen = h / MTFL_MAX_HANDLES;
    mtfl_slot *s = NULL;
    mtfl_lock(1);
    if (h > 0 && mtfl_slots[i].lv && mtfl_slots[i].gen == gen) {
        if (mtfl_slots[i].busy) *err = mtfl_fail(MTFL_ERR_BUSY, "handle %d is in use on another thread", h);
        else { s = &mtfl_slots[i]; s->busy = 1; }
    } else {
        *err = mtfl_fail(MTFL_ERR_HANDLE, "%d is not an open handle", h);
    }
    mtfl_lock(0);
    return s;
}
static void mtfl_release(mtfl_slot *s) {
    mtfl_lock(1);
    s->busy = 0;
    mtfl_lock(0);
}

MTFL_API int mtfl_version(void) { return MTFL_ABI_VERSION; }

MTFL_API int mtfl_open(const char *path, int mode, int threads) {
    if (!path) return mtfl_fail(MTFL_ERR_ARG, "mtfl_open: NULL path");
    if (mode != MTFL_WINDOW && mode != MTFL_STATEFUL)
        return mtfl_fail(MTFL_ERR_ARG, "mtfl_open: mode %d is not MTFL_WINDOW (0) or MTFL_STATEFUL (1)", mode);
    if (threads < 0 || threads > 256) return mtfl_fail(MTFL_ERR_ARG, "mtfl_open: threads %d not in [0, 256]", threads);
    mtf_live *lv = NULL;
    mb_result r = mtf_live_open(&lv, path, MB_CPU, threads ? threads : 1, mode);
    if (r != MB_OK)
        return mtfl_fail(r == MB_ERR_OUT_OF_MEMORY ? MTFL_ERR_MEMORY : MTFL_ERR_MODEL, "%s", mb_last_error());
    int h = 0;
    mtfl_lock(1);
    for (int i = 0; i < MTFL_MAX_HANDLES && !h; i++) {
        if (mtfl_slots[i].lv) continue;
        mtfl_slots[i].gen = mtfl_slots[i].gen % (1 << 24) + 1;
        mtfl_slots[i].lv = lv;
        mtfl_slots[i].busy = 0;
        h = mtfl_slots[i].gen * MTFL_MAX_HANDLES + i;
    }
    mtfl_lock(0);
    if (!h) {
        mtf_live_close(lv);
        return mtfl_fail(MTFL_ERR_FULL, "mtfl_open: %d handles are open already", MTFL_MAX_HANDLES);
    }
    return h;
}

#ifdef _WIN32
MTFL_API int mtfl_open_w(const wchar_t *path, int mode, int threads) {
    if (!path) return mtfl_fail(MTFL_ERR_ARG, "mtfl_open_w: NULL path");
    int n = WideCharToMultiByte(CP_UTF8, WC_ERR_INVALID_CHARS, path, -1, NULL, 0, NULL, NULL);
    if (n <= 0) return mtfl_fail(MTFL_ERR_ARG, "mtfl_open_w: the path is not valid UTF-16");
    char *u = (char *)malloc((size_t)n);
    if (!u) return mtfl_fail(MTFL_ERR_MEMORY, "mtfl_open_w: no memory");
    WideCharToMultiByte(CP_UTF8, WC_ERR_INVALID_CHARS, path, -1, u, n, NULL, NULL);
    int h = mtfl_open(u, mode, threads); /* megabatch opens UTF-8 paths through _wopen */
    free(u);
    return h;
}
#endif

MTFL_API int mtfl_close(int h) {
    int err = 0;
    mtfl_slot *s = mtfl_acquire(h, &err);
    if (!s) return err;
    mtf_live *lv = s->lv;
    mtfl_lock(1);
    s->lv = NULL;
    s->busy = 0;
    mtfl_lock(0);
    mtf_live_close(lv);
    return 0;
}

/* What of the model: 0 K, 1 F, 2 T. */
static int mtfl_shape(int h, int what) {
    int err = 0;
    mtfl_slot *s = mtfl_acquire(h, &err);
    if (!s) return err;
    const mtf_spec *sp = &s->lv->m.spec;
    int v = (int)(what == 0 ? sp->K : what == 1 ? sp->F : sp->T);
    mtfl_release(s);
    return v;
}
MTFL_API int mtfl_outputs(int h) { return mtfl_shape(h, 0); }
MTFL_API int mtfl_features(int h) { return mtfl_shape(h, 1); }
MTFL_API int mtfl_window(int h) { return mtfl_shape(h, 2); }

MTFL_API long long mtfl_bars(int h) {
    int err = 0;
    mtfl_slot *s = mtfl_acquire(h, &err);
    if (!s) return err;
    long long n = (long long)s->lv->bars;
    mtfl_release(s);
    return n;
}

/* One bar through the predictor of a busy slot: MTFL_READY (pred: K floats), MTFL_WARMUP or
 * an error. */
static int mtfl_push1(mtfl_slot *s, long long t, const double v[5], float *pred) {
    mbf_bar b = {(int64_t)t, v[0], v[1], v[2], v[3], v[4]};
    int ready = 0;
    mb_result r = mtf_live_push(s->lv, &b, pred, &ready);
    if (r != MB_OK) return mtfl_from(r, r == MB_ERR_INVALID_ARG);
    return ready ? MTFL_READY : MTFL_WARMUP;
}

/* Both mtfl_push flavours: out as double (dbl) or float. */
static int mtfl_push_any(int h, long long t, const double v[5], void *pred, int pred_len, int dbl) {
    int err = 0;
    if (!pred) return mtfl_fail(MTFL_ERR_ARG, "mtfl_push: NULL pred");
    mtfl_slot *s = mtfl_acquire(h, &err);
    if (!s) return err;
    int64_t K = s->lv->m.spec.K;
    float out[MB_MAX_SEGMENTS * MTF_MAX_F];
    int rc;
    if (pred_len < K || K > (int64_t)(sizeof out / sizeof out[0]))
        rc = mtfl_fail(MTFL_ERR_SHAPE, "mtfl_push: pred has %d elements, the model gives %lld", pred_len, (long long)K);
    else
        rc = mtfl_push1(s, t, v, out);
    for (int64_t k = 0; rc == MTFL_READY && k < K; k++) {
        if (dbl) ((double *)pred)[k] = (double)out[k];
        else ((float *)pred)[k] = out[k];
    }
    mtfl_release(s);
    return rc;
}

MTFL_API int mtfl_push(int h, long long t, double open, double high, double low, double close, double volume,
                       double *pred, int pred_len) {
    const double v[5] = {open, high, low, close, volume};
    return mtfl_push_any(h, t, v, pred, pred_len, 1);
}
MTFL_API int mtfl_push_f(int h, long long t, double open, double high, double low, double close, double volume,
                         float *pred, int pred_len) {
    const double v[5] = {open, high, low, close, volume};
    return mtfl_push_any(h, t, v, pred, pred_len, 0);
}

MTFL_API int mtfl_push_bars(int h, const long long *t, const double *open, const double *high, const double *low,
                            const double *close, const double *volume, int n, double *pred, int pred_len) {
    if (n < 0) return mtfl_fail(MTFL_ERR_ARG, "mtfl_push_bars: n = %d", n);
    if (n > 0 && (!t || !open || !high || !low || !close || !volume || !pred))
        return mtfl_fail(MTFL_ERR_ARG, "mtfl_push_bars: a NULL array");
    int err = 0;
    mtfl_slot *s = mtfl_acquire(h, &err);
    if (!s) return err;
    int64_t K = s->lv->m.spec.K;
    float out[MB_MAX_SEGMENTS * MTF_MAX_F];
    int rc = 0, ready = 0;
    if ((int64_t)pred_len < (int64_t)n * K || K > (int64_t)(sizeof out / sizeof out[0]))
        rc = mtfl_fail(MTFL_ERR_SHAPE, "mtfl_push_bars: pred has %d elements, %d bars of %lld outputs need %lld",
                       pred_len, n, (long long)K, (long long)n * K);
    for (int i = 0; rc >= 0 && i < n; i++) {
        const double v[5] = {open[i], high[i], low[i], close[i], volume[i]};
        rc = mtfl_push1(s, t[i], v, out);
        if (rc < 0) {
            char why[MB_MAX_ERROR];
            snprintf(why, sizeof why, "%s", mtfl_err);
            mtfl_fail(rc, "mtfl_push_bars: bar %d of %d: %s", i, n, why);
            break;
        }
        for (int64_t k = 0; k < K; k++) pred[i * K + k] = rc == MTFL_READY ? (double)out[k] : NAN;
        ready += rc == MTFL_READY;
    }
    mtfl_release(s);
    return rc < 0 ? rc : ready;
}

MTFL_API int mtfl_last_error(char *buf, int len) {
    int n = (int)strlen(mtfl_err);
    if (buf && len > 0) snprintf(buf, (size_t)len, "%s", mtfl_err);
    return n;
}

#ifdef _WIN32
MTFL_API int mtfl_last_error_w(wchar_t *buf, int len) {
    int n = MultiByteToWideChar(CP_UTF8, 0, mtfl_err, -1, NULL, 0) - 1;
    if (buf && len > 0) {
        if (!MultiByteToWideChar(CP_UTF8, 0, mtfl_err, -1, buf, len)) buf[len - 1] = 0; /* too short: cut */
    }
    return n < 0 ? 0 : n;
}
#endif
