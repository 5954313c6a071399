/* mtf_live.h - the live predictor: closed M1 bars in, one at a time; once every timeframe
 * has a full window, the model's K predictions for that moment out (docs/TRADING.md).
 *
 *   mtf_live *lv;
 *   mtf_live_open(&lv, "model.safetensors", MB_CPU, 1, MTF_LIVE_WINDOW); // train_multitf --export
 *   for each closed M1 bar b (start time, o, h, l, c, volume):
 *       float pred[K]; int ready;
 *       mb_result r = mtf_live_push(lv, &b, pred, &ready);    // MB_OK, or the bar is refused
 *       if (r == MB_OK && ready) ... pred[0..K) ...
 *   mtf_live_close(lv);
 *
 * No train/serve skew: the bars of every timeframe and their features come from
 * examples/mb_features.h, the engine `prepare` itself is built on, fed the same M1 bars;
 * the rows are normalised with the file's feature_mean/feature_std by the expression
 * prepare uses ((x - mean) / std in float); the sample at bar t is the last seg_len[k]
 * closed rows of each timeframe k, oldest first, as prepare's sample at t (a forming
 * higher-timeframe bar is never used). So the model's input is bit for bit that of
 * prepare's sample at the same time (tests/test_live.c).
 *
 * Bars that are not the next closed M1 bar (mbf_push's checks) are refused with
 * MB_ERR_INVALID_ARG and change nothing, so the stream can go on with the next bar:
 *   - out of order (older than the last bar) and duplicate (same start time): refused;
 *   - a start time not on a minute, a non-positive or non-finite price, high < low, a
 *     negative or non-finite volume: refused;
 *   - a gap (weekend, missing minutes) is no error: as in prepare, the higher-timeframe
 *     bars that the gap ended close with the next bar, and nothing is filled in.
 *
 * Modes: MTF_LIVE_WINDOW (the default) runs the model over the whole sample at every bar
 * (1104 LSTM steps: prepare + predict exactly). MTF_LIVE_STATEFUL, for a model trained
 * with --carry (metadata carry=1): each encoder carries its (h, c) from bar to bar and
 * reads only the rows that closed with the bar (one LSTM step per closed row: O(1) per
 * bar); its prediction is that of the encoders run over the whole history since the first
 * bar (tests/test_live.c), not over the window, so it differs from prepare + predict.
 * Readiness is the same in both modes (every timeframe has a full window of rows).
 */
#ifndef MTF_LIVE_H
#define MTF_LIVE_H
#include "mb_features.h"
#include "mb_args.h" /* mba_now */
#include "multitf.h"

enum { MTF_LIVE_WINDOW = 0, MTF_LIVE_STATEFUL = 1 };

typedef struct mtf_live {
    mtf_model m;
    int mode;
    float *rowdev[MBF_TFS];         /* stateful: this bar's new rows per timeframe (device) */
    mb_device *dev;
    mbf_state *eng;                 /* the feature engine (about 115 KB) */
    mbf_out out;                    /* rows of the last push */
    int64_t rows[MBF_TFS];          /* closed rows seen per timeframe */
    float *ring[MBF_TFS];           /* per timeframe: the last seg_len[k] normalised rows (F each) */
    float *x;                       /* the sample (T, F), host */
    float *xdev;                    /* the same on the device (== x on the CPU) */
    int64_t bars;                   /* bars accepted */
} mtf_live;

MTF_API void mtf_live_close(mtf_live *lv) {
    if (!lv) return;
    if (lv->m.params) mtf_model_destroy(&lv->m);
    if (lv->xdev != lv->x) mb_free(lv->dev, lv->xdev);
    for (int k = 0; k < MBF_TFS; k++) mb_free(lv->dev, lv->rowdev[k]);
    mb_device_close(lv->dev);
    for (int k = 0; k < MBF_TFS; k++) free(lv->ring[k]);
    free(lv->x);
    free(lv->eng);
    free(lv);
}

/* What the live path needs of a model: the five timeframes of prepare, its features, the
 * normalisation. */
MTF_API mb_result mtf_live_check(const mtf_spec *s, const char *path) {
    if (s->nseg != MBF_TFS || !s->T)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: the live predictor needs the %d timeframes of prepare (segments "
                       "metadata M1,M5,M15,H1,H4); the file has %d segments%s", path, MBF_TFS, s->nseg,
                       s->T ? "" : " and no segment lengths");
    if (s->seg_names[0] && strcmp(s->seg_names, "M1,M5,M15,H1,H4"))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: segments '%s' are not M1,M5,M15,H1,H4", path, s->seg_names);
    if (s->F > MBF_MAX) return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: F=%lld > %d features", path, (long long)s->F, MBF_MAX);
    if (!s->has_norm)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: no feature normalisation (feature_mean/feature_std metadata): write "
                       "the file with train_multitf --export from prepare's data", path);
    return MB_OK;
}

/* Open a model file for live prediction on backend (MB_CPU, or MB_CUDA in a CUDA build). */
MTF_API mb_result mtf_live_open(mtf_live **out, const char *path, mb_backend backend, int threads, int mode) {
    *out = NULL;
    mtf_live *lv = (mtf_live *)calloc(1, sizeof *lv);
    mb_st_file *f = NULL;
    mtf_spec s;
    if (!lv) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the live predictor");
    mb_result r = mb_st_open(&f, path);
    if (r == MB_OK) r = mtf_spec_of(f, path, &s);
    if (r == MB_OK) r = mtf_live_check(&s, path);
    if (r == MB_OK && mode == MTF_LIVE_STATEFUL && !s.carry)
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: the stateful mode needs a model trained with --carry (metadata carry=1)",
                    path);
    lv->mode = mode;
    if (r == MB_OK) r = mtf_device_open(&lv->dev, backend, threads);
    if (r == MB_OK) r = mtf_model_create(&lv->m, lv->dev, &s, 1, mode == MTF_LIVE_STATEFUL);
    for (int k = 0; r == MB_OK && mode == MTF_LIVE_STATEFUL && k < MBF_TFS; k++)
        r = mtf_alloc(&lv->m, &lv->rowdev[k], 2 * s.F); /* at most two rows of a timeframe close with a bar */
    if (r == MB_OK) r = mtf_model_load(&lv->m, f);
    for (int k = 0; r == MB_OK && k < s.nseg; k++) mb_lstm_freeze(lv->m.enc[k], 1); /* packed once, not per bar */
    if (r == MB_OK) {
        lv->eng = (mbf_state *)malloc(sizeof *lv->eng);
        lv->x = (float *)malloc((size_t)(s.T * s.F) * sizeof(float));
        for (int k = 0; k < MBF_TFS; k++) lv->ring[k] = (float *)malloc((size_t)(s.seg_len[k] * s.F) * sizeof(float));
        int ok = lv->eng && lv->x;
        for (int k = 0; k < MBF_TFS; k++) ok = ok && lv->ring[k];
        r = ok ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the live predictor");
    }
    if (r == MB_OK) {
        mbf_init(lv->eng, (int)s.F);
        lv->xdev = lv->x;
        if (backend != MB_CPU) r = mtf_alloc(&lv->m, &lv->xdev, s.T * s.F);
    }
    mb_st_close(f);
    if (r != MB_OK) { mtf_live_close(lv); return r; }
    *out = lv;
    return MB_OK;
}

/* A closed row of timeframe k: normalised as prepare does, into its ring. */
MTF_API void mtf_live_row(mtf_live *lv, const mbf_row *row) {
    const mtf_spec *s = &lv->m.spec;
    int k = row->tf;
    float *dst = lv->ring[k] + (lv->rows[k] % s->seg_len[k]) * s->F;
    for (int64_t f = 0; f < s->F; f++) {
        int64_t m = k * s->F + f;
        dst[f] = (row->x[f] - s->mean[m]) / s->std[m];
    }
    lv->rows[k]++;
}

/* 1 when every timeframe has a full window. */
MTF_API int mtf_live_ready(const mtf_live *lv) {
    for (int k = 0; k < MBF_TFS; k++)
        if (lv->rows[k] < lv->m.spec.seg_len[k]) return 0;
    return 1;
}

/* The sample (T, F) at the last bar, host memory: segment k = the last seg_len[k] rows of
 * timeframe k, oldest first. Valid after a push that returned ready. */
MTF_API const float *mtf_live_sample(mtf_live *lv) { return lv->x; }

/* Stateful: the rows that closed with this bar (normalised, in lv->ring) through their
 * encoders; the prediction once every window is full. */
MTF_API mb_result mtf_live_step(mtf_live *lv, float *pred, int *ready) {
    const mtf_spec *s = &lv->m.spec;
    int64_t n[MBF_TFS] = {0};
    const float *x[MBF_TFS];
    for (int i = 0; i < lv->out.n; i++) n[lv->out.row[i].tf]++;
    for (int k = 0; k < MBF_TFS; k++) { /* the newest n[k] rows, oldest first */
        for (int64_t j = 0; j < n[k]; j++) {
            int64_t at = (lv->rows[k] - n[k] + j) % s->seg_len[k];
            MB_TRY(mb_copy(lv->dev, MB_STREAM_COMPUTE, lv->rowdev[k] + j * s->F, lv->ring[k] + at * s->F,
                           (size_t)s->F * sizeof(float)));
        }
        x[k] = lv->rowdev[k];
    }
    const float *p = NULL;
    int full = mtf_live_ready(lv);
    MB_TRY(mtf_model_step(&lv->m, x, n, full ? &p : NULL));
    if (full) MB_TRY(mb_copy(lv->dev, MB_STREAM_COMPUTE, pred, p, (size_t)s->K * sizeof(float)));
    MB_TRY(mb_sync(lv->dev, MB_STREAM_COMPUTE));
    *ready = full;
    return MB_OK;
}

/* Feed one closed M1 bar. MB_OK: accepted; *ready = 1 and pred (K floats) set when every
 * timeframe has a full window, else *ready = 0. MB_ERR_INVALID_ARG: refused (out of order,
 * duplicate, bad values; see the top of this file), nothing changed. */
MTF_API mb_result mtf_live_push(mtf_live *lv, const mbf_bar *bar, float *pred, int *ready) {
    const mtf_spec *s = &lv->m.spec;
    *ready = 0;
    int e = mbf_push(lv->eng, bar, &lv->out);
    if (e != MBF_OK)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "bar at %lld refused: %s", (long long)bar->t, mbf_error_text(e));
    lv->bars++;
    for (int i = 0; i < lv->out.n; i++) mtf_live_row(lv, &lv->out.row[i]);
    if (lv->mode == MTF_LIVE_STATEFUL) return mtf_live_step(lv, pred, ready);
    if (!mtf_live_ready(lv)) return MB_OK;
    int64_t off = 0;
    for (int k = 0; k < MBF_TFS; k++) { /* the ring from its oldest row: two copies */
        int64_t w = s->seg_len[k], head = lv->rows[k] % w;
        memcpy(lv->x + off * s->F, lv->ring[k] + head * s->F, (size_t)((w - head) * s->F) * sizeof(float));
        memcpy(lv->x + (off + w - head) * s->F, lv->ring[k], (size_t)(head * s->F) * sizeof(float));
        off += w;
    }
    const float *p = NULL;
    size_t bytes = (size_t)(s->T * s->F) * sizeof(float);
    if (lv->xdev != lv->x) MB_TRY(mb_copy(lv->dev, MB_STREAM_COMPUTE, lv->xdev, lv->x, bytes));
    MB_TRY(mtf_model_forward(&lv->m, lv->xdev, 1, &p));
    MB_TRY(mb_copy(lv->dev, MB_STREAM_COMPUTE, pred, p, (size_t)s->K * sizeof(float)));
    MB_TRY(mb_sync(lv->dev, MB_STREAM_COMPUTE));
    *ready = 1;
    return MB_OK;
}

/* Latency bookkeeping of the replay (predict --live) and bench/bench_live.c: a qsort
 * comparator of doubles (the clock: mb_args.h's mba_now). */
MTF_API int mtf_by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif /* MTF_LIVE_H */
