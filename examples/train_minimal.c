/* train_minimal.c - the smallest whole training loop megabatch can show: one LSTM reads
 * each sample's window, a linear head maps its last hidden state to the K targets, MSE,
 * AdamW. After each epoch the validation loss is printed beside the naive baseline (predict
 * 0), the number to beat. The multi-timeframe model with all the options is
 * train_multitf.c; this file is the same loop with nothing else.
 *
 *   make build/train_minimal && build/train_minimal          (data from `make run`)
 *   build/train_minimal [--train FILE] [--val FILE] [--epochs N] [--hidden H] [--batch B]
 *                       [--lr LR] [--seed S]
 */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "mb_args.h"
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: train_minimal [--train FILE] [--val FILE] [--epochs N] [--hidden H] [--batch B] [--lr LR] [--seed S]\n"
    "  one LSTM + a linear head trained with AdamW on an HDF5 file of features (N, T, F) and\n"
    "  targets (N, K); defaults: data/train.h5, data/val.h5, 4 epochs, H 32, B 32, lr 1e-3, seed 1\n";

typedef struct options {
    const char *train, *val;
    long long epochs, hidden, batch, seed;
    double lr;
} options;

typedef struct model {
    mb_device *dev;
    mb_params *params;                 /* every weight in one flat buffer, every gradient in another */
    mb_lstm *lstm;
    mb_linear head;
    int64_t T, K, H;
    float *h_last, *dh_last;           /* (B, H) */
    float *pred, *dpred, *zeros;       /* (B, K) */
    float *loss;                       /* one float */
} model;

static mb_result alloc_f32(mb_device *dev, int64_t n, float **p) {
    return mb_alloc(dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)p);
}

static mb_result model_create(model *m, mb_device *dev, const mb_dataset_meta *d, const options *o) {
    memset(m, 0, sizeof *m);
    m->dev = dev; m->T = d->t; m->K = d->k; m->H = o->hidden;
    mb_lstm_config lc = {0};
    lc.input_size = d->f; lc.hidden_size = m->H; lc.layers = 1;
    lc.max_steps = d->t; lc.max_batch = o->batch;           /* checkpoint 0: automatic */
    MB_TRY(mb_params_create(&m->params, dev));
    MB_TRY(mb_lstm_create(&m->lstm, m->params, &lc));      /* weight_ih_l0, weight_hh_l0, ... */
    MB_TRY(mb_linear_init(&m->head, m->params, "head", m->H, m->K));
    MB_TRY(mb_params_finalize(m->params));
    MB_TRY(mb_params_init(m->params, (uint64_t)o->seed));
    MB_TRY(alloc_f32(dev, o->batch * m->H, &m->h_last));
    MB_TRY(alloc_f32(dev, o->batch * m->H, &m->dh_last));
    MB_TRY(alloc_f32(dev, o->batch * m->K, &m->pred));
    MB_TRY(alloc_f32(dev, o->batch * m->K, &m->dpred));
    MB_TRY(alloc_f32(dev, o->batch * m->K, &m->zeros));
    MB_TRY(mb_zero(dev, MB_STREAM_COMPUTE, m->zeros, (size_t)(o->batch * m->K) * sizeof(float)));
    return alloc_f32(dev, 1, &m->loss);
}

static void model_destroy(model *m) {
    float *bufs[] = {m->h_last, m->dh_last, m->pred, m->dpred, m->zeros, m->loss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mb_free(m->dev, bufs[i]);
    mb_lstm_destroy(m->lstm);
    mb_params_destroy(m->params);
}

/* Forward of one batch and its mean loss; with dpred, also the loss gradient. */
static mb_result forward(model *m, const mb_batch *b, float *dpred) {
    const float *x = (const float *)b->features, *y = (const float *)b->targets;
    MB_TRY(mb_lstm_forward(m->lstm, x, b->count, m->T, NULL, NULL, NULL, m->h_last)); /* (B, H) */
    MB_TRY(mb_linear_forward(&m->head, MB_STREAM_COMPUTE, m->h_last, b->count, m->pred));          /* (B, K) */
    return mb_loss(m->dev, MB_STREAM_COMPUTE, NULL, m->pred, y, b->count, m->K, 1.0f, NULL, m->loss, dpred);
}

/* One epoch of training; the mean training loss. */
static mb_result train_epoch(model *m, mb_loader *tr, mb_adamw *opt, float lr, double *mean) {
    double sum = 0;
    int64_t n = 0;
    for (;;) {
        mb_batch b;
        MB_TRY(mb_loader_next(tr, &b));
        if (b.end_of_epoch) break;
        MB_TRY(mb_params_zero_grad(m->params));
        MB_TRY(forward(m, &b, m->dpred));
        MB_TRY(mb_linear_backward(&m->head, MB_STREAM_COMPUTE, m->h_last, m->dpred, b.count, m->dh_last));
        MB_TRY(mb_lstm_backward(m->lstm, m->dh_last, NULL, NULL, NULL, NULL));  /* grads += */
        MB_TRY(mb_adamw_step(opt, lr, NULL));
        float l;
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));  /* a host sync, for the print */
        sum += (double)l * (double)b.count;
        n += b.count;
    }
    *mean = n ? sum / (double)n : 0;
    return MB_OK;
}

/* Mean validation loss of the model and of the baseline that predicts 0. */
static mb_result evaluate(model *m, mb_loader *va, double *loss, double *baseline) {
    double sum = 0, base = 0;
    int64_t n = 0;
    for (;;) {
        mb_batch b;
        MB_TRY(mb_loader_next(va, &b));
        if (b.end_of_epoch) break;
        float l, z;
        MB_TRY(forward(m, &b, NULL));
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));
        MB_TRY(mb_loss(m->dev, MB_STREAM_COMPUTE, NULL, m->zeros, (const float *)b.targets, b.count, m->K, 1.0f,
                       NULL, m->loss, NULL));
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &z));
        sum += (double)l * (double)b.count; base += (double)z * (double)b.count;
        n += b.count;
    }
    *loss = n ? sum / (double)n : 0;
    *baseline = n ? base / (double)n : 0;
    return MB_OK;
}

static mb_result open_data(mb_device *dev, const char *path, const options *o, mb_dataset **ds, mb_loader **ld) {
    mb_dataset_config dc = {0};
    dc.isolate = 1;                    /* a file that crashes HDF5 becomes an error, not a crash */
    MB_TRY(mb_dataset_open_file(ds, path, &dc));
    mb_loader_config lc = {0};
    lc.batch = o->batch;               /* in file order, the whole file on the device if it fits */
    return mb_loader_open(ld, dev, *ds, &lc);
}

static mb_result run(const options *o) {
    mb_device *dev = NULL;
    mb_dataset *dtr = NULL, *dva = NULL;
    mb_loader *tr = NULL, *va = NULL;
    mb_adamw *opt = NULL;
    model m = {0};
    double train_loss = 0, val_loss = 0, baseline = 0;
    mb_result r = mb_device_open(&dev, NULL);                           /* the CPU */
    if (r == MB_OK) r = open_data(dev, o->train, o, &dtr, &tr);
    if (r == MB_OK) r = open_data(dev, o->val, o, &dva, &va);
    if (r == MB_OK) r = model_create(&m, dev, mb_dataset_info(dtr), o);
    if (r == MB_OK) r = mb_adamw_create(&opt, m.params, NULL);         /* torch's AdamW defaults */
    for (long long e = 1; r == MB_OK && e <= o->epochs; e++) {
        r = train_epoch(&m, tr, opt, (float)o->lr, &train_loss);
        if (r == MB_OK) r = evaluate(&m, va, &val_loss, &baseline);
        if (r == MB_OK) printf("epoch %lld: train_loss %.5f val_loss %.5f baseline %.5f\n", e, train_loss, val_loss, baseline);
    }
    if (r == MB_OK) printf("summary: val_loss=%.5f baseline_val_loss=%.5f (%.1f%% below)\n", val_loss, baseline,
                           100.0 * (baseline - val_loss) / baseline);
    mb_adamw_destroy(opt);
    if (m.params) model_destroy(&m);
    mb_loader_close(tr); mb_loader_close(va);
    mb_dataset_close(dtr); mb_dataset_close(dva);
    mb_device_close(dev);
    return r;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){"data/train.h5", "data/val.h5", 4, 32, 32, 1, 1e-3};
    for (int i = 1; i < argc; i++, i++) {
        const char *a = argv[i], *v = mba_value(argc, argv, i);
        long long *num = !strcmp(a, "--epochs") ? &o->epochs : !strcmp(a, "--hidden") ? &o->hidden
                       : !strcmp(a, "--batch") ? &o->batch : !strcmp(a, "--seed") ? &o->seed : NULL;
        if (!num && strcmp(a, "--train") && strcmp(a, "--val") && strcmp(a, "--lr")) return mba_unknown(a);
        if (!v) return mba_missing(a);
        if (!strcmp(a, "--train")) o->train = v;
        else if (!strcmp(a, "--val")) o->val = v;
        else if (!strcmp(a, "--lr")) { if (mba_number(v, 1e-9, 10, &o->lr)) return mba_error("--lr wants a number in (0, 10]: %s", v); }
        else if (mba_long(v, 1, 1000000, num)) return mba_error("%s wants an integer 1..1000000: %s", a, v);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    options o;
    int bad = parse(argc, argv, &o);
    if (bad) return bad;
    if (run(&o) == MB_OK) return 0;
    fprintf(stderr, "error: %s\n", mb_last_error());
    return 1;
}
