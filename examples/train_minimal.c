/* train_minimal.c - the smallest whole training loop megabatch can show: one LSTM reads
 * each sample's window, a linear head maps its last hidden state to the K targets, MSE,
 * AdamW. After each epoch the validation loss is printed beside the naive baseline (predict
 * 0), the number to beat. The multi-timeframe model with all the options is
 * train_multitf.c; this file is the same loop with nothing else (the flags and the data
 * files' opening come from examples/mb_train.h, which both share).
 *
 *   make build/train_minimal && build/train_minimal          (the data `make run` wrote)
 *   build/train_minimal [--train FILE] [--val FILE] [--epochs N] [--hidden H] [--batch B]
 *                       [--lr LR] [--seed S]
 */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "mb_train.h"
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: train_minimal [--train FILE] [--val FILE] [--epochs N] [--hidden H] [--batch B] [--lr LR] [--seed S]\n"
    "  one LSTM + a linear head trained with AdamW on an HDF5 file of features (N, T, F) and\n"
    "  targets (N, K); defaults: data/train.h5, data/val.h5 (from `make run`), 4 epochs,\n"
    "  the LSTM's hidden_size H 32, B 32, lr 1e-3, seed 1. The files are checked in a child process\n"
    "  first. -h, --help: this text.\n"
    "Exit 2 with one line `error: ...` on stderr on bad flags, files or data.\n";

typedef struct options {
    const char *train, *val;
    int64_t epochs, hidden_size, batch; /* hidden_size: --hidden */
    uint64_t seed;
    float lr;
} options;

typedef struct model {
    mb_device *dev;
    mb_params *params;                 /* every weight in one flat buffer, every gradient in another */
    mb_lstm *lstm;
    mb_linear head;
    int64_t T, K, hidden_size;
    float *h_last, *dh_last;           /* (B, H) */
    float *pred, *dpred, *zeros;       /* (B, K) */
    float *loss;                       /* one float */
} model;

static mb_result alloc_f32(mb_device *dev, int64_t n, float **p) {
    return mb_alloc(dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)p);
}

static mb_result model_create(model *m, mb_device *dev, const mb_dataset_meta *d, const options *o) {
    memset(m, 0, sizeof *m);
    m->dev = dev; m->T = d->t; m->K = d->k; m->hidden_size = o->hidden_size;
    mb_lstm_config lc;
    memset(&lc, 0, sizeof lc);
    lc.input_size = d->f; lc.hidden_size = m->hidden_size; lc.layers = 1;
    lc.max_steps = d->t; lc.max_batch = o->batch;           /* checkpoint 0: automatic */
    MB_TRY(mb_params_create(&m->params, dev));
    MB_TRY(mb_lstm_create(&m->lstm, m->params, &lc));      /* weight_ih_l0, weight_hh_l0, ... */
    MB_TRY(mb_linear_init(&m->head, m->params, "head", m->hidden_size, m->K));
    MB_TRY(mb_params_finalize(m->params));
    MB_TRY(mb_params_init(m->params, o->seed));
    MB_TRY(alloc_f32(dev, o->batch * m->hidden_size, &m->h_last));
    MB_TRY(alloc_f32(dev, o->batch * m->hidden_size, &m->dh_last));
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
    // snippet: minimal-loop
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
    // end snippet
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

/* Everything the run holds: opened in one plain sequence, closed (also half opened) at the end. */
typedef struct run {
    mb_dataset *dtr, *dva;
    mb_device *dev;
    mb_loader *tr, *va;
    model m;
    mb_adamw *opt;
} run;

static mb_result open_loader(run *r, mb_dataset *ds, const options *o, mb_loader **ld) {
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch;               /* in file order, the whole file on the device if it fits */
    return mb_loader_open(ld, r->dev, ds, &lc);
}

static mb_result run_open(run *r, const options *o) {
    MB_TRY(mba_open_data(o->train, 1, &r->dtr));                    /* probed in a child: a bad file is an error */
    MB_TRY(mba_open_data(o->val, 1, &r->dva));
    MB_TRY(mb_device_open(&r->dev, NULL));                          /* the CPU */
    MB_TRY(open_loader(r, r->dtr, o, &r->tr));
    MB_TRY(open_loader(r, r->dva, o, &r->va));
    MB_TRY(model_create(&r->m, r->dev, mb_dataset_info(r->dtr), o));
    return mb_adamw_create(&r->opt, r->m.params, NULL);            /* torch's AdamW defaults */
}

static mb_result train(run *r, const options *o) {
    double train_loss = 0, val_loss = 0, baseline = 0;
    for (int64_t e = 1; e <= o->epochs; e++) {
        MB_TRY(train_epoch(&r->m, r->tr, r->opt, o->lr, &train_loss));
        MB_TRY(evaluate(&r->m, r->va, &val_loss, &baseline));
        printf("epoch %lld: train_loss %.5f val_loss %.5f baseline %.5f\n", (long long)e, train_loss, val_loss, baseline);
    }
    printf("summary: val_loss=%.5f baseline_val_loss=%.5f (%.1f%% below)\n", val_loss, baseline,
           100.0 * (baseline - val_loss) / baseline);
    return MB_OK;
}

static void run_close(run *r) {
    mb_adamw_destroy(r->opt);
    if (r->m.params) model_destroy(&r->m);
    mb_loader_close(r->tr); mb_loader_close(r->va);
    mb_dataset_close(r->dtr); mb_dataset_close(r->dva);
    mb_device_close(r->dev);
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    options o = {"data/train.h5", "data/val.h5", 4, 32, 32, 1, 1e-3f};
    const mba_flag flags[] = {
        {"--train", MBA_STR, &o.train, 0, 0, NULL},    {"--val", MBA_STR, &o.val, 0, 0, NULL},
        {"--epochs", MBA_I64, &o.epochs, 1, 1e6, NULL}, {"--hidden", MBA_I64, &o.hidden_size, 1, 1e6, NULL},
        {"--batch", MBA_I64, &o.batch, 1, 1e6, NULL},   {"--seed", MBA_U64, &o.seed, 1, 1e6, NULL},
        {"--lr", MBA_F32, &o.lr, 1e-9, 10, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 2;
    run r;
    memset(&r, 0, sizeof r);
    mb_result res = run_open(&r, &o);
    if (res == MB_OK) res = train(&r, &o);
    run_close(&r);
    if (res == MB_OK) return 0;
    fprintf(stderr, "error: %s\n", mb_last_error());
    return 2;
}
