/* predict.c - the K predictions of a trained multi-timeframe model (docs/TRADING.md).
 *
 *   build/predict --model FILE.safetensors --data FILE.h5 --out preds.csv
 *                 [--batch 256] [--threads 0] [--quiet]
 *   build/predict --model FILE.safetensors --csv BARS.csv --live [--stateful] [--out lines.csv]
 *   build/predict --model FILE.safetensors --to-onnx FILE.onnx
 *
 * The model file is what `train_multitf --export` or PyTorch (bench/pytorch/multitf.py's
 * state_dict, safetensors) wrote; the data file is what `prepare` wrote. The samples go
 * through the loader in file order, in batches, on the CPU (build/predict) or the GPU
 * (build/predict_cuda, the same source through nvcc). preds.csv: a header line
 * `pred_1,...,pred_K`, then one row per sample of the file, in its order: the K
 * predictions (%.9g: float32 exactly).
 * --live (CPU build): replays an MT5/MT4/histdata export (read with prepare's own row parser
 * and text decoding: examples/prepare.c is compiled in, its main renamed) through the live
 * predictor (examples/mtf_live.h), one closed M1 bar at a time, and prints one line per
 * row of the file: `time,status[,pred_1..pred_K]`, time the bar's start (UTC, as in the
 * file), status `ok` (with the K predictions), `warmup` (not enough history yet) or
 * `refused: <why>` (out of order, duplicate, bad values: the bar is skipped, nothing
 * changes); a closing line on stderr counts them and gives the latency per bar.
 * --stateful: the O(1)-per-bar mode of a model trained with --carry (mtf_live.h).
 * --metrics (with --data; --out then optional): the loss of the predictions as train_multitf
 * computes it (--loss mse|huber, per batch on the device, summed in double: pass training's
 * --batch for the same bits) and the trading metrics per horizon (examples/mb_metrics.h), on
 * stdout: one line `metrics: val_loss=.. baseline_val_loss=.. hit=.. ic=.. rank_ic=..`, then
 * one line per horizon.
 * --to-onnx: writes the model as one ONNX graph (examples/mtf_onnx.h: raw feature window
 * in, predictions in the target's units out) for MetaTrader 5 and onnxruntime, and stops.
 * Exit 2 with `error: ...` on bad flags, a bad model file or data that does not fit it.
 */
#define _POSIX_C_SOURCE 200809L /* gmtime_r, clock_gettime */
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#define BACKEND MB_CUDA
#else
#include "megabatch.h"
#define BACKEND MB_CPU
#endif
#include "multitf.h"
#include "mtf_onnx.h"
#include "mb_args.h"
#include "mb_metrics.h" /* --metrics */
#ifndef __CUDACC__
#include "mtf_live.h"
#include "mb_csv.h" /* prepare's CSV parser, for --live: one implementation */
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    const char *model, *data, *out, *csv, *onnx;
    int64_t batch;
    int threads, quiet, live, stateful, metrics;
    mb_loss_kind loss;
} options;

static const char predict_usage[] =
    "usage: " MBA_TOOL("predict") " --model FILE.safetensors --data FILE.h5 --out preds.csv [--batch 256] [--threads 0] [--quiet]\n"
    "       " MBA_TOOL("predict") " --model FILE.safetensors --csv BARS.csv --live [--stateful] [--out lines.csv]\n"
    "       " MBA_TOOL("predict") " --model FILE.safetensors --data FILE.h5 --metrics [--loss mse|huber] [--out preds.csv]\n"
    "       " MBA_TOOL("predict") " --model FILE.safetensors --to-onnx FILE.onnx\n"
    "  The K predictions of a trained multi-timeframe model (docs/TRADING.md): one CSV row per\n"
    "  sample of an HDF5 file written by prepare, or (--live) one line per closed M1 bar of an\n"
    "  MT5/MT4 export replayed through the live predictor; --stateful: the O(1)-per-bar mode of\n"
    "  a model trained with --carry; --metrics: the loss as train_multitf computes it (val_loss=) and\n"
    "  the trading metrics per horizon (hit rate, IC, rank IC) of the file's predictions; --to-onnx: the model as one ONNX graph for MetaTrader 5 and\n"
    "  onnxruntime (raw feature window in, forward returns out; docs/TRADING.md), nothing else.\n"
    "  The data file is checked in a child process first (docs/RELIABILITY.md). -h, --help: this text.\n"
    "Exit 2 with one line `error: ...` on stderr on bad flags, files or data.\n";

/* 0 when the options are usable; else the exit status (2), the error printed (mb_args.h). */
static int parse_options(int argc, char **argv, options *o) {
    static const char *const losses[] = {"mse", "huber", NULL}; /* mb_loss_kind's order */
    memset(o, 0, sizeof *o);
    o->batch = 256;
    const mba_flag flags[] = {
        {"--model", MBA_STR, &o->model, 0, 0, NULL}, {"--data", MBA_STR, &o->data, 0, 0, NULL},
        {"--out", MBA_STR, &o->out, 0, 0, NULL}, {"--csv", MBA_STR, &o->csv, 0, 0, NULL},
        {"--batch", MBA_I64, &o->batch, 1, 1e6, NULL}, {"--threads", MBA_INT, &o->threads, 0, 1024, NULL},
        {"--quiet", MBA_SET, &o->quiet, 0, 0, NULL}, {"--live", MBA_SET, &o->live, 0, 0, NULL},
        {"--stateful", MBA_SET, &o->stateful, 0, 0, NULL}, {"--to-onnx", MBA_STR, &o->onnx, 0, 0, NULL},
        {"--metrics", MBA_SET, &o->metrics, 0, 0, NULL}, {"--loss", MBA_CHOICE, &o->loss, 0, 0, losses}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 2;
    if (!o->model) return mba_error("--model is needed (see --help)");
    if (o->onnx && (o->data || o->out || o->csv || o->live || o->stateful))
        return mba_error("--to-onnx takes only --model (see --help)");
    if (!o->onnx && (o->live != !!o->csv || (o->stateful && !o->live)))
        return mba_error("--live and --csv go together, and --stateful needs them (see --help)");
    if ((o->metrics || o->loss) && (o->live || !o->data)) return mba_error("--metrics and --loss go with --data (see --help)");
    if (!o->onnx && !o->live && (!o->data || (!o->out && !o->metrics)))
        return mba_error("--data and --out (or --metrics) are needed (see --help)");
    if (o->live && o->data) return mba_error("--live reads --csv, not --data (see --help)");
    /* the output-path rule (mb_args.h): --to-onnx is written as FILE.tmp, then renamed; --out
     * too, but for a device (/dev/null), written in place */
    mba_file in[] = {{"--model", o->model, 0, 0}, {"--data", o->data, 0, 0}, {"--csv", o->csv, 0, 0}};
    mba_file out[] = {{"--out", o->out, 0, 0}, {"--to-onnx", o->onnx, 0, 1}};
    return mba_outputs_ok(in, 3, out, 2) ? 0 : 2;
}

/* The output file --out, written as FILE.tmp (mba_write_path) and renamed into place by
 * out_close when all went well; NULL and the error set when it cannot be opened. */
static FILE *out_open(const char *path, char *tmp, size_t cap) {
    FILE *f = mba_write_path(path, tmp, cap) ? NULL : fopen(tmp, "w");
    if (!f) MB_FAIL(NULL, MB_ERR_IO, "cannot write '%s': %s", path, strerror(errno ? errno : ENAMETOOLONG));
    return f;
}

/* Close --out: renamed into place when r is MB_OK and the writes went well, else removed. */
static mb_result out_close(FILE *f, const char *tmp, const char *path, mb_result r) {
    if (!f) return r;
    int bad = ferror(f) | fclose(f);
    if (r == MB_OK && bad) r = MB_FAIL(NULL, MB_ERR_IO, "cannot write '%s': %s", path, strerror(errno ? errno : EIO));
    if (r == MB_OK && mba_commit(tmp, path)) r = MB_FAIL(NULL, MB_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    else if (r != MB_OK && strcmp(tmp, path)) unlink(tmp);
    return r;
}

/* The data file must be the model's: T, F, K and the segment lengths. */
static mb_result check_fit(mtf_spec *s, const mb_dataset_meta *d, const options *o) {
    if (d->f != s->F || d->k != s->K)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s has F=%lld K=%lld, the model %s F=%lld K=%lld", o->data, (long long)d->f,
                       (long long)d->k, o->model, (long long)s->F, (long long)s->K);
    int nseg = d->segments ? d->segments : 1;
    if (!s->T) { /* a file without segment metadata (e.g. PyTorch's): the data's */
        for (int i = 0; i < nseg && i < MTF_MAX_SEG; i++) s->seg_len[i] = d->segments ? d->segment_len[i] : d->t;
        s->T = d->t;
    }
    int same = nseg == s->nseg && d->t == s->T;
    for (int i = 0; same && i < nseg; i++) same = (d->segments ? d->segment_len[i] : d->t) == s->seg_len[i];
    return same ? MB_OK
                : MB_FAIL(NULL, MB_ERR_FORMAT, "%s: its %d segments (T=%lld) are not the model's %d (T=%lld)", o->data,
                          nseg, (long long)d->t, s->nseg, (long long)s->T);
}

static mb_result write_rows(FILE *out, const float *p, int64_t B, int64_t K) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < K; k++) fprintf(out, "%.9g%c", (double)p[b * K + k], k + 1 < K ? ',' : '\n');
    return ferror(out) ? MB_FAIL(NULL, MB_ERR_IO, "writing the predictions failed") : MB_OK;
}

/* --metrics: what the predictions score against the file's targets. */
typedef struct scoring {
    mb_meter *meter;      /* slot 0: the loss, slot 1: the baseline's (predict 0), as train_multitf sums them */
    float *zeros, *htarg; /* (batch, K) zeros on the device; a batch's targets on the host */
    mbm_acc acc;
} scoring;

/* One batch into the loss sums (on the device, as train_multitf's evaluate) and the metrics. */
static mb_result score_batch(const options *o, mb_device *dev, scoring *sc, const float *pred, const float *host_pred,
                             const float *targets, int64_t B, int64_t K) {
    mb_loss_config lc = {0.0f, o->loss, mb_meter_slot(sc->meter, 0)}, base = lc;
    base.acc = mb_meter_slot(sc->meter, 1);
    MB_TRY(mb_loss(dev, MB_STREAM_COMPUTE, &lc, pred, targets, B, K, 0.0f, NULL, NULL, NULL));
    MB_TRY(mb_loss(dev, MB_STREAM_COMPUTE, &base, sc->zeros, targets, B, K, 0.0f, NULL, NULL, NULL));
    MB_TRY(mb_copy(dev, MB_STREAM_COMPUTE, sc->htarg, targets, (size_t)(B * K) * sizeof(float)));
    MB_TRY(mb_sync(dev, MB_STREAM_COMPUTE));
    return mbm_add(&sc->acc, host_pred, sc->htarg, B);
}

/* The scores' lines on stdout: the losses and the means, then each horizon. */
static mb_result score_report(scoring *sc, int64_t K) {
    double v[2][2];
    mbm_mean mean;
    mbm_horizon *per = (mbm_horizon *)calloc((size_t)K, sizeof *per);
    if (!per) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the metrics");
    mb_result r = mb_meter_read(sc->meter, MB_STREAM_COMPUTE, 0);
    if (r == MB_OK) r = mb_meter_wait(sc->meter);
    for (int i = 0; r == MB_OK && i < 2; i++) r = mb_meter_value(sc->meter, i, &v[i][0], &v[i][1]);
    if (r == MB_OK) r = mbm_compute(&sc->acc, per, &mean);
    if (r == MB_OK) {
        char text[160];
        mbm_text(text, sizeof text, &mean);
        printf("metrics: rows=%lld val_loss=%.5f baseline_val_loss=%.5f %s zeros=%lld nonfinite=%lld\n",
               (long long)mean.rows, v[0][1] > 0 ? v[0][0] / v[0][1] : 0, v[1][1] > 0 ? v[1][0] / v[1][1] : 0, text,
               (long long)mean.zeros, (long long)mean.nonfinite);
        for (int64_t k = 0; k < K; k++)
            printf("horizon %lld: n=%lld hit=%.6f ic=%.6f rank_ic=%.6f zeros=%lld nonfinite=%lld\n", (long long)k + 1,
                   (long long)per[k].n, per[k].hit, per[k].ic, per[k].rank_ic, (long long)per[k].zeros,
                   (long long)per[k].nonfinite);
    }
    free(per);
    return r;
}

static mb_result predict_file(const options *o, mb_device *dev, mtf_model *m, mb_loader *ld, FILE *out, scoring *sc,
                              int64_t *n) {
    int64_t K = m->spec.K, B = m->maxB; /* the batch: --batch, or the data's N when smaller */
    float *host = (float *)malloc((size_t)(B * K) * sizeof(float));
    if (!host) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for %lld predictions", (long long)(B * K));
    mb_result r = MB_OK;
    for (int64_t k = 0; out && k < K; k++) fprintf(out, "pred_%lld%c", (long long)k + 1, k + 1 < K ? ',' : '\n');
    for (;;) {
        mb_batch b;
        const float *pred = NULL;
        if ((r = mb_loader_next(ld, &b)) != MB_OK || b.count == 0) break;
        r = mtf_model_forward(m, (const float *)b.features, b.count, &pred);
        if (r == MB_OK) r = mb_copy(dev, MB_STREAM_COMPUTE, host, pred, (size_t)(b.count * K) * sizeof(float));
        if (r == MB_OK) r = mb_sync(dev, MB_STREAM_COMPUTE);
        if (r == MB_OK && out) r = write_rows(out, host, b.count, K);
        if (r == MB_OK && sc) r = score_batch(o, dev, sc, pred, host, (const float *)b.targets, b.count, K);
        if (r != MB_OK) break;
        *n += b.count;
    }
    free(host);
    if (r == MB_OK && sc) r = score_report(sc, K);
    return r;
}

static mb_result run(const options *o, int64_t *n) {
    mb_st_file *f = NULL;
    mb_device *dev = NULL;
    mb_dataset *ds = NULL;
    mb_loader *ld = NULL;
    mtf_model m;
    mtf_spec spec;
    memset(&m, 0, sizeof m);
    FILE *out = NULL;
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch;
    mb_result r = mb_st_open(&f, o->model);
    if (r == MB_OK) r = mtf_spec_of(f, o->model, &spec);
    if (r == MB_OK) r = mba_open_data(o->data, 1, &ds); /* probed in a child first */
    if (r == MB_OK) r = check_fit(&spec, mb_dataset_info(ds), o);
    if (r == MB_OK && lc.batch > mb_dataset_info(ds)->n) lc.batch = mb_dataset_info(ds)->n; /* no bigger than the data */
    if (r == MB_OK) r = mtf_device_open(&dev, BACKEND, o->threads);
    if (r == MB_OK) r = mtf_model_create(&m, dev, &spec, lc.batch, 0);
    if (r == MB_OK) r = mtf_model_load(&m, f);
    if (r == MB_OK) r = mb_loader_open(&ld, dev, ds, &lc);
    scoring sc;
    memset(&sc, 0, sizeof sc);
    size_t zb = (size_t)(lc.batch * spec.K) * sizeof(float);
    if (r == MB_OK && o->metrics) r = mb_meter_create(&sc.meter, dev, 2, 1);
    if (r == MB_OK && o->metrics) r = mb_alloc(dev, MB_MEM_DEVICE, zb, (void **)&sc.zeros);
    if (r == MB_OK && o->metrics) r = mb_zero(dev, MB_STREAM_COMPUTE, sc.zeros, zb);
    if (r == MB_OK && o->metrics) r = mb_alloc(dev, MB_MEM_HOST, zb, (void **)&sc.htarg);
    if (r == MB_OK && o->metrics) r = mbm_init(&sc.acc, spec.K, mb_dataset_info(ds)->n);
    char tmp[1100];
    if (r == MB_OK && o->out && !(out = out_open(o->out, tmp, sizeof tmp))) r = MB_ERR_IO;
    if (r == MB_OK) r = predict_file(o, dev, &m, ld, out, o->metrics ? &sc : NULL, n);
    r = out_close(out, tmp, o->out, r);
    mb_meter_destroy(sc.meter);
    mb_free(dev, sc.zeros);
    mb_free(dev, sc.htarg);
    mbm_free(&sc.acc);
    mb_loader_close(ld);
    mb_dataset_close(ds);
    if (m.params) mtf_model_destroy(&m);
    mb_device_close(dev);
    mb_st_close(f);
    return r;
}

/* --to-onnx: the model file as an ONNX graph (on the CPU: nothing is computed). */
static mb_result to_onnx(const options *o) {
    mb_st_file *f = NULL;
    mb_device *dev = NULL;
    mtf_model m;
    mtf_spec spec;
    memset(&m, 0, sizeof m);
    mb_result r = mb_st_open(&f, o->model);
    if (r == MB_OK) r = mtf_spec_of(f, o->model, &spec);
    if (r == MB_OK && !spec.T)
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: no segments metadata, so no window length for the ONNX input "
                    "(write the file with train_multitf --export)", o->model);
    if (r == MB_OK) r = mtf_device_open(&dev, MB_CPU, 1);
    if (r == MB_OK) r = mtf_model_create(&m, dev, &spec, 1, 0);
    if (r == MB_OK) r = mtf_model_load(&m, f);
    if (r == MB_OK) r = mtf_onnx_export(&m, o->onnx);
    if (m.params) mtf_model_destroy(&m);
    mb_device_close(dev);
    mb_st_close(f);
    return r;
}

#ifndef __CUDACC__
// ---- --live: replay bars through the live predictor ----

typedef struct replay { int64_t rows, ok, warmup, refused, timed; double *lat; } replay;

/* One data row of the file: parse it as prepare does, push it, print its line. */
static mb_result replay_row(mtf_live *lv, char *line, size_t lineno, FILE *out, float *pred, replay *rp) {
    int64_t t = INT64_MIN; /* mbc_parse_bar sets it once the date and time parse */
    double v[5] = {0, 0, 0, 0, 0};
    char when[32];
    int ready = 0;
    int bad = mbc_parse_bar(line, &t, v);
    time_t tt = (time_t)t;
    struct tm tm;
    snprintf(when, sizeof when, "line %zu", lineno); /* a row without a time: its line */
    if (t != INT64_MIN && gmtime_r(&tt, &tm)) /* seconds shown when the bar is off the minute */
        strftime(when, sizeof when, t % 60 ? "%Y.%m.%d %H:%M:%S" : "%Y.%m.%d %H:%M", &tm);
    mbf_bar b = {t, v[0], v[1], v[2], v[3], v[4]};
    double t0 = mba_now();
    mb_result r = bad ? MB_ERR_INVALID_ARG : mtf_live_push(lv, &b, pred, &ready);
    if (ready) rp->lat[rp->timed++] = mba_now() - t0;
    rp->rows++;
    if (r == MB_ERR_INVALID_ARG) {
        rp->refused++;
        fprintf(out, "%s,refused: line %zu: %s\n", when, lineno, bad ? mbc_error : strchr(mb_last_error(), ':') + 2);
        return MB_OK;
    }
    if (r != MB_OK) return r;
    if (!ready) { rp->warmup++; fprintf(out, "%s,warmup\n", when); return MB_OK; }
    rp->ok++;
    fprintf(out, "%s,ok", when);
    for (int64_t k = 0; k < lv->m.spec.K; k++) fprintf(out, ",%.9g", (double)pred[k]);
    fputc('\n', out);
    return MB_OK;
}

static mb_result replay_text(mtf_live *lv, char *text, FILE *out, replay *rp) {
    float *pred = (float *)malloc((size_t)lv->m.spec.K * sizeof(float));
    if (!pred) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory");
    mb_result r = MB_OK;
    size_t lineno = 0;
    int first = 1;
    for (char *line = text, *next; r == MB_OK && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        line[strcspn(line, "\r")] = 0;
        if (mbc_blank(line)) continue;
        int head = first && mbc_is_header(line); /* prepare's header rule (mb_csv.h): the first line only */
        first = 0;
        if (!head) r = replay_row(lv, line, lineno, out, pred, rp);
    }
    free(pred);
    return r;
}

static mb_result live(const options *o) {
    char *buf = NULL;
    size_t len = 0;
    int bad = mbc_read_text(o->csv, &buf, &len); /* the whole file, decoded as prepare decodes it */
    FILE *out = NULL;
    char tmp[1100];
    mtf_live *lv = NULL;
    replay rp;
    memset(&rp, 0, sizeof rp);
    mb_result r = !bad ? MB_OK : MB_FAIL(NULL, MB_ERR_IO, "%s", mbc_error);
    if (r == MB_OK) r = mtf_live_open(&lv, o->model, MB_CPU, o->threads ? o->threads : 1,
                                          o->stateful ? MTF_LIVE_STATEFUL : MTF_LIVE_WINDOW);
    if (r == MB_OK && !(rp.lat = (double *)malloc((len / 16 + 1) * sizeof(double)))) /* a row has > 16 bytes */
        r = MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory");
    if (r == MB_OK && !(out = o->out ? out_open(o->out, tmp, sizeof tmp) : stdout)) r = MB_ERR_IO;
    if (r == MB_OK) r = replay_text(lv, buf, out, &rp);
    if (r == MB_OK && rp.ok + rp.warmup == 0) /* as prepare: input without a bar is an error */
        r = rp.refused ? MB_FAIL(NULL, MB_ERR_FORMAT, "no bars in '%s': all %lld rows refused", o->csv, (long long)rp.refused)
                       : MB_FAIL(NULL, MB_ERR_FORMAT, "no bars in '%s'", o->csv);
    if (out != stdout) r = out_close(out, tmp, o->out, r);
    if (r == MB_OK && !o->quiet) {
        qsort(rp.lat, (size_t)rp.timed, sizeof *rp.lat, mtf_by_value);
        fprintf(stderr, "live: %lld rows: %lld predictions, %lld warmup, %lld refused; latency per bar (batch 1, "
                "CPU): median %.1f us, min %.1f, max %.1f\n", (long long)rp.rows, (long long)rp.ok,
                (long long)rp.warmup, (long long)rp.refused, rp.timed ? 1e6 * rp.lat[rp.timed / 2] : 0.0,
                rp.timed ? 1e6 * rp.lat[0] : 0.0, rp.timed ? 1e6 * rp.lat[rp.timed - 1] : 0.0);
    }
    free(rp.lat);
    free(buf);
    mtf_live_close(lv);
    return r;
}
#else
static mb_result live(const options *o) {
    (void)o;
    return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "--live runs in the CPU build (build/predict)");
}
#endif

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(predict_usage);
    options o;
    int bad = parse_options(argc, argv, &o);
    if (bad) return bad;
    int64_t n = 0;
    mb_result r = o.onnx ? to_onnx(&o) : o.live ? live(&o) : run(&o, &n);
    if (r != MB_OK) return mba_fail(mb_last_error()); /* in the user's words (mb_args.h) */
    if (!o.quiet && o.onnx) printf("onnx: %s\n", o.onnx);
    if (!o.quiet && !o.live && !o.onnx && o.out) printf("predictions: %lld samples -> %s\n", (long long)n, o.out);
    return 0;
}
