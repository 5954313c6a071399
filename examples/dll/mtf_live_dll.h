/* mtf_live_dll.h - the C ABI of mtf_live.dll (Windows) / libmtf_live.so (Linux): the live
 * predictor (examples/mtf_live.h) behind opaque int handles, for MetaTrader 5's #import
 * (examples/mql5/MegabatchLive.mq5) and any C host (docs/TRADING.md).
 *
 *   int h = mtfl_open("model.safetensors", MTFL_WINDOW, 1);   // > 0, or an MTFL_ERR_* < 0
 *   double pred[K];                                            // K = mtfl_outputs(h)
 *   int r = mtfl_push(h, t, open, high, low, close, volume, pred, K);
 *   // r == MTFL_READY: pred[0..K) is the prediction at bar t; MTFL_WARMUP: not yet; < 0: error
 *   mtfl_close(h);
 *
 * Only int, long long (MQL5 long, datetime), double, float, and arrays of them cross the
 * boundary; strings are UTF-8 (char) or UTF-16 (wchar_t, Windows: MQL5's string).
 * Errors are negative codes; the text of the last one on this thread: mtfl_last_error.
 * A refused call changes nothing: the handle keeps working (bad bars, short arrays, a bad
 * model file opened next to it). One handle is for one thread at a time (a second thread
 * gets MTFL_ERR_BUSY); different handles run in parallel. */
#ifndef MTF_LIVE_DLL_H
#define MTF_LIVE_DLL_H
#include <stddef.h>

#ifdef _WIN32
#ifdef MTFL_BUILD
#define MTFL_API __declspec(dllexport)
#else
#define MTFL_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define MTFL_API __attribute__((visibility("default")))
#else
#define MTFL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MTFL_ABI_VERSION 1

enum { MTFL_WINDOW = 0, MTFL_STATEFUL = 1 }; /* mtf_live.h's modes (stateful: a --carry model) */

enum {
    MTFL_WARMUP = 0,           /* bar accepted, not every window full yet: no prediction */
    MTFL_READY = 1,            /* bar accepted, prediction written */
    MTFL_ERR_HANDLE = -1,      /* not an open handle (never opened, closed, or 0) */
    MTFL_ERR_ARG = -2,         /* a NULL pointer, a bad mode, a negative count */
    MTFL_ERR_SHAPE = -3,       /* an output array shorter than the model's K outputs (per bar) */
    MTFL_ERR_BAR = -4,         /* bar refused: out of order, duplicate, off the minute, bad values */
    MTFL_ERR_MODEL = -5,       /* the model file cannot be read or is not a live model */
    MTFL_ERR_MEMORY = -6,      /* out of memory */
    MTFL_ERR_FULL = -7,        /* MTFL_MAX_HANDLES open already */
    MTFL_ERR_BUSY = -8,        /* the handle is in use on another thread */
    MTFL_ERR_INTERNAL = -9     /* the model's computation failed (the handle should be closed) */
};
enum { MTFL_MAX_HANDLES = 64 };

/* MTFL_ABI_VERSION of the library. */
MTFL_API int mtfl_version(void);

/* Open a model (train_multitf --export) in mode MTFL_WINDOW or MTFL_STATEFUL with threads
 * CPU threads (0: 1). Returns a handle > 0, or MTFL_ERR_MODEL/ARG/MEMORY/FULL. */
MTFL_API int mtfl_open(const char *path_utf8, int mode, int threads);
#ifdef _WIN32
MTFL_API int mtfl_open_w(const wchar_t *path, int mode, int threads); /* MQL5: string */
#endif
/* Close a handle (0 or MTFL_ERR_HANDLE/BUSY). */
MTFL_API int mtfl_close(int h);

/* The model's K outputs per bar, its features F, its window T (rows), or an error. */
MTFL_API int mtfl_outputs(int h);
MTFL_API int mtfl_features(int h);
MTFL_API int mtfl_window(int h);
/* Bars accepted so far (>= 0), or an error. */
MTFL_API long long mtfl_bars(int h);

/* Push one closed M1 bar (t: its start, seconds since 1970 UTC; MQL5's datetime). On
 * MTFL_READY, pred[0..K) is the prediction (pred_len >= K); MTFL_WARMUP leaves it as is.
 * pred_len < K: MTFL_ERR_SHAPE before the bar is looked at (nothing changes). */
MTFL_API int mtfl_push(int h, long long t, double open, double high, double low, double close, double volume,
                       double *pred, int pred_len);
MTFL_API int mtfl_push_f(int h, long long t, double open, double high, double low, double close, double volume,
                         float *pred, int pred_len);

/* Push n bars given as arrays (MQL5: CopyTime/CopyOpen/... into non-series arrays, oldest
 * first). pred: n rows of K (pred_len >= n * K), a bar in warm-up gets a row of NaN.
 * Returns the number of bars that gave a prediction (>= 0), or an error: a shape error
 * before any bar; a refused bar stops there (the bars before it stay pushed, their rows
 * written; mtfl_bars tells how many; the text names the bar). */
MTFL_API int mtfl_push_bars(int h, const long long *t, const double *open, const double *high, const double *low,
                            const double *close, const double *volume, int n, double *pred, int pred_len);

/* The last error's text on this thread (UTF-8; "" if none): copied into buf (len bytes,
 * truncated, always terminated). Returns the text's full length. */
MTFL_API int mtfl_last_error(char *buf, int len);
#ifdef _WIN32
MTFL_API int mtfl_last_error_w(wchar_t *buf, int len); /* MQL5: ushort buf[], len in characters */
#endif

#ifdef __cplusplus
}
#endif
#endif /* MTF_LIVE_DLL_H */
