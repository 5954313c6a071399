/* onnx_inputs.c - the inputs tests/onnx/run.sh hands to onnxruntime: raw feature windows,
 * the ONNX model's input (examples/mtf_onnx.h), as float32 files (N, T, F).
 *
 *   onnx_inputs data MODEL.safetensors FILE.h5 N OUT.f32
 *       The first N samples of a file prepare wrote (window or series layout), read through
 *       the loader as build/predict reads them, turned back into raw rows: each value x is
 *       replaced by the float y with (y - mean) / std == x exactly, in float as prepare
 *       computes it (y exists: prepare made x from one), so the graph's normalisation gives
 *       the file's rows bit for bit. Exit 1 if some value has no such y.
 *   onnx_inputs live MODEL.safetensors BARS.csv N OUT.f32 PREDS.f32
 *       The CSV's M1 bars (MT5/MT4 export, read by prepare's parser) through the live
 *       predictor (examples/mtf_live.h, window mode) and, beside it, through a feature engine
 *       (examples/mb_features.h) keeping each timeframe's last closed raw rows: for the
 *       last N bars with a prediction, the raw window an Expert Advisor would build (the
 *       last 480 M1, 288 M5, 192 M15, 96 H1, 48 H4 rows, oldest first) and mtf_live's K
 *       predictions (PREDS.f32: N x K).
 * Prints one line: `inputs: N samples T=.. F=.. K=..`. */
#define _POSIX_C_SOURCE 200809L
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "../../examples/mtf_live.h"
#define PREPARE_NO_MAIN
#include "../../examples/prepare.c"
#include <float.h>

static int fail(const char *what) {
    fprintf(stderr, "onnx_inputs: %s\n", what[0] ? what : mb_last_error());
    return 1;
}

static int write_f32(const char *path, const float *x, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(x, sizeof *x, n, f) == n;
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : fail("cannot write the output");
}

/* Floats in their order as integers (-0 and +0 both 0), and back. */
static int64_t ord_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x80000000u ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}
static float float_of(int64_t k) {
    uint32_t u = k >= 0 ? (uint32_t)k : 0x80000000u | (uint32_t)-k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The raw value y with (y - mean) / std == x in float (std > 0: the map is monotone, so a
 * binary search over all finite floats finds the smallest y that reaches x). 0 if none. */
static int raw_of(float x, float mean, float std, float *y) {
    int64_t lo = ord_of(-FLT_MAX), hi = ord_of(FLT_MAX);
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        float v = (float_of(mid) - mean) / std;
        if (v < x) lo = mid + 1;
        else hi = mid;
    }
    *y = float_of(lo);
    return (*y - mean) / std == x;
}

static int data_inputs(const mtf_spec *s, const char *path, int64_t n, const char *out) {
    mb_device *dev = NULL;
    mb_dataset *ds = NULL;
    mb_loader *ld = NULL;
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = 64;
    size_t row = (size_t)(s->T * s->F), got = 0, missed = 0;
    float *x = (float *)malloc((size_t)n * row * sizeof(float));
    if (!x || mb_dataset_open_file(&ds, path, NULL) != MB_OK || mtf_device_open(&dev, MB_CPU, 1) != MB_OK ||
        mb_loader_open(&ld, dev, ds, &lc) != MB_OK)
        return fail("");
    while ((int64_t)got < n) {
        mb_batch b;
        if (mb_loader_next(ld, &b) != MB_OK) return fail("");
        if (b.count == 0 || b.end_of_epoch) break;
        int64_t take = b.count < n - (int64_t)got ? b.count : n - (int64_t)got;
        memcpy(x + got * row, b.features, (size_t)take * row * sizeof(float));
        got += (size_t)take;
    }
    for (size_t i = 0; i < got * row; i++) { /* segment k of a sample: rows of timeframe k */
        int64_t t = (int64_t)(i / (size_t)s->F) % s->T, f = (int64_t)(i % (size_t)s->F), k = 0;
        for (int64_t end = s->seg_len[0]; t >= end; end += s->seg_len[++k]) {}
        missed += !raw_of(x[i], s->mean[k * s->F + f], s->std[k * s->F + f], &x[i]);
    }
    printf("inputs: %zu samples T=%lld F=%lld K=%lld, %zu values without an exact raw value\n", got,
           (long long)s->T, (long long)s->F, (long long)s->K, missed);
    mb_loader_close(ld);
    mb_dataset_close(ds);
    mb_device_close(dev);
    int r = missed || (int64_t)got < n ? fail("some values have no raw value, or too few samples") : 0;
    if (!r) r = write_f32(out, x, got * row);
    free(x);
    return r;
}

static int live_inputs(const char *model, const char *csv, int64_t n, const char *out, const char *pout) {
    mtf_live *lv = NULL;
    mbf_state *eng = (mbf_state *)malloc(sizeof *eng);
    mbc_bars in;
    size_t skipped = 0;
    if (!eng || mbc_read_csv_file(csv, 0, &in, &skipped)) return fail(mbc_error);
    if (mtf_live_open(&lv, model, MB_CPU, 1, MTF_LIVE_WINDOW) != MB_OK) return fail("");
    const mtf_spec *s = &lv->m.spec;
    size_t row = (size_t)(s->T * s->F);
    float *ring[MBF_TFS], *x = (float *)calloc((size_t)n * row, sizeof(float));
    float *pred = (float *)calloc((size_t)n * (size_t)s->K, sizeof(float));
    int64_t rows[MBF_TFS] = {0}, ready = 0;
    for (int k = 0; k < MBF_TFS; k++) ring[k] = (float *)calloc((size_t)(s->seg_len[k] * s->F), sizeof(float));
    mbf_init(eng, (int)s->F);
    for (size_t i = 0; i < in.n; i++) {
        mbf_bar b = {in.t[i], in.o[i], in.h[i], in.l[i], in.c[i], in.v[i]};
        mbf_out o;
        int ok = 0;
        float *slot = pred + (ready % n) * s->K;
        if (mtf_live_push(lv, &b, slot, &ok) != MB_OK || mbf_push(eng, &b, &o) != MBF_OK) return fail("bar refused");
        for (int j = 0; j < o.n; j++) { /* the raw row into its timeframe's ring */
            int k = o.row[j].tf;
            memcpy(ring[k] + (rows[k]++ % s->seg_len[k]) * s->F, o.row[j].x, (size_t)s->F * sizeof(float));
        }
        if (!ok) continue;
        float *w = x + (size_t)(ready++ % n) * row;
        for (int k = 0; k < MBF_TFS; k++) { /* the last seg_len[k] rows, oldest first */
            for (int64_t r = 0; r < s->seg_len[k]; r++)
                memcpy(w + r * s->F, ring[k] + ((rows[k] + r) % s->seg_len[k]) * s->F, (size_t)s->F * sizeof(float));
            w += s->seg_len[k] * s->F;
        }
    }
    if (ready < n) return fail("fewer predictions than asked for");
    /* the ring of the last n windows and predictions, oldest first */
    float *xs = (float *)malloc((size_t)n * row * sizeof(float)), *ps = (float *)malloc((size_t)(n * s->K) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        int64_t at = (ready + j) % n;
        memcpy(xs + j * (int64_t)row, x + at * (int64_t)row, row * sizeof(float));
        memcpy(ps + j * s->K, pred + at * s->K, (size_t)s->K * sizeof(float));
    }
    printf("inputs: %lld samples T=%lld F=%lld K=%lld, the last of %lld live predictions over %zu bars\n",
           (long long)n, (long long)s->T, (long long)s->F, (long long)s->K, (long long)ready, in.n);
    int r = write_f32(out, xs, (size_t)n * row) || write_f32(pout, ps, (size_t)(n * s->K));
    for (int k = 0; k < MBF_TFS; k++) free(ring[k]);
    free(x); free(pred); free(xs); free(ps); free(eng);
    mbc_bars_free(&in);
    mtf_live_close(lv);
    return r;
}

int main(int argc, char **argv) {
    (void)prepare; (void)make_synthetic; /* prepare.c's, not used here */
    int live = argc == 7 && !strcmp(argv[1], "live");
    if (!live && !(argc == 6 && !strcmp(argv[1], "data"))) {
        fprintf(stderr, "usage: onnx_inputs data MODEL.safetensors FILE.h5 N OUT.f32\n"
                        "       onnx_inputs live MODEL.safetensors BARS.csv N OUT.f32 PREDS.f32\n");
        return 2;
    }
    int64_t n = atoll(argv[4]);
    if (n < 1) return fail("N must be >= 1");
    if (live) return live_inputs(argv[2], argv[3], n, argv[5], argv[6]);
    mb_st_file *f = NULL;
    mtf_spec s;
    if (mb_st_open(&f, argv[2]) != MB_OK || mtf_spec_of(f, argv[2], &s) != MB_OK) return fail("");
    mb_st_close(f);
    if (!s.has_norm || !s.T) return fail("the model has no normalisation or segments metadata");
    return data_inputs(&s, argv[3], n, argv[5]);
}
