/* train_multitf.c - the whole multi-timeframe training loop in one file.
 *
 * Model: five LSTM encoders, one per timeframe segment of a sample (M1 480 bars, M5 288,
 * M15 192, H1 96, H4 48: the `segments` attribute of the file), each reading its segment
 * and handing on its last hidden state; the five states are concatenated (fusion) and a
 * two-layer head predicts the K targets. Loss: MSE (or Huber). Optimiser: AdamW with
 * gradient clipping, a learning-rate schedule and gradient accumulation.
 *
 *   build/train_multitf      --train data/train.h5 --val data/val.h5     (CPU, cc)
 *   build/train_multitf_cuda --train data/train.h5 --val data/val.h5     (GPU, nvcc)
 *
 * The same source is the CUDA program: nvcc compiles it with megabatch_cuda.cuh.
 * Flags (defaults in brackets; see usage()): --epochs [3] --batch [128] --hidden [32]
 * --head [64] --layers [1] --lr [2e-3] --schedule constant|cosine|onecycle [cosine]
 * --warmup [20] --accum [1] --clip [1.0] --weight-decay [0.01] --loss mse|huber [mse]
 * --chunk-fraction [0.75] --checkpoint-k [0: auto] --carry --seed [1] --threads [0]
 * --metrics FILE [none] --max-batches N [0: all] --quiet.
 * Checkpoints: --ckpt FILE writes everything a run needs (params, AdamW moments and step,
 * loader position, accumulation window, counters; crash-safe: temp file, fsync, rename,
 * checksum) after every epoch and every --ckpt-every N optimizer steps; --resume continues
 * from FILE and ends with the same weights, bit for bit, as an uninterrupted run.
 * Last line, for scripts:
 *   summary: epochs=.. steps=.. train_loss=.. val_loss=.. baseline_val_loss=.. samples_per_s=..
 * Exit 2 with `error: ...` on bad flags or data.
 */
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#define BACKEND MB_CUDA
#else
#include "megabatch.h"
#define BACKEND MB_CPU
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- options ----

typedef struct options {
    const char *train, *val, *metrics, *ckpt;
    int epochs, layers, accum, threads, carry, quiet, checkpoint_k, resume;
    int64_t ckpt_every;
    int64_t batch, hidden, head, max_batches;
    float lr, clip, weight_decay, chunk_fraction;
    int warmup;
    mb_lr_kind schedule;
    mb_loss_kind loss;
    uint64_t seed;
} options;

static options default_options(void) {
    options o;
    memset(&o, 0, sizeof o);
    o.train = "data/train.h5"; o.val = "data/val.h5";
    o.epochs = 3; o.layers = 1; o.accum = 1;
    o.batch = 128; o.hidden = 32; o.head = 64;
    o.lr = 2e-3f; o.clip = 1.0f; o.weight_decay = 0.01f; o.chunk_fraction = 0.75f;
    o.warmup = 20; o.schedule = MB_LR_WARMUP_COSINE; o.loss = MB_LOSS_MSE; o.seed = 1;
    return o;
}

static int bad_flag(const char *flag, const char *value, const char *want) {
    fprintf(stderr, "error: %s '%s': %s\n", flag, value ? value : "", want);
    return 0;
}

static int num(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || errno || !(x >= lo && x <= hi)) {
        char want[96];
        snprintf(want, sizeof want, "expected a number in [%g, %g]", lo, hi);
        return bad_flag(flag, v, want);
    }
    *out = x;
    return 1;
}

/* Returns 1 when the flags are good; prints `error: ...` and returns 0 otherwise. */
static int parse_options(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        int used = 1;
        if (!strcmp(a, "--carry")) { o->carry = 1; used = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; used = 0; }
        else if (!strcmp(a, "--resume")) { o->resume = 1; used = 0; }
        else if (!strcmp(a, "--ckpt")) { if (!v) return bad_flag(a, v, "needs a file"); o->ckpt = v; }
        else if (!strcmp(a, "--ckpt-every")) { if (!num(a, v, 0, 1e12, &x)) return 0; o->ckpt_every = (int64_t)x; }
        else if (!strcmp(a, "--train")) { if (!v) return bad_flag(a, v, "needs a file"); o->train = v; }
        else if (!strcmp(a, "--val")) { if (!v) return bad_flag(a, v, "needs a file"); o->val = v; }
        else if (!strcmp(a, "--metrics")) { if (!v) return bad_flag(a, v, "needs a file"); o->metrics = v; }
        else if (!strcmp(a, "--epochs")) { if (!num(a, v, 1, 1e6, &x)) return 0; o->epochs = (int)x; }
        else if (!strcmp(a, "--batch")) { if (!num(a, v, 1, 1e6, &x)) return 0; o->batch = (int64_t)x; }
        else if (!strcmp(a, "--hidden")) { if (!num(a, v, 1, 1e5, &x)) return 0; o->hidden = (int64_t)x; }
        else if (!strcmp(a, "--head")) { if (!num(a, v, 1, 1e5, &x)) return 0; o->head = (int64_t)x; }
        else if (!strcmp(a, "--layers")) { if (!num(a, v, 1, 16, &x)) return 0; o->layers = (int)x; }
        else if (!strcmp(a, "--accum")) { if (!num(a, v, 1, 1e4, &x)) return 0; o->accum = (int)x; }
        else if (!strcmp(a, "--threads")) { if (!num(a, v, 0, 1024, &x)) return 0; o->threads = (int)x; }
        else if (!strcmp(a, "--checkpoint-k")) { if (!num(a, v, -1, 1e6, &x)) return 0; o->checkpoint_k = (int)x; }
        else if (!strcmp(a, "--max-batches")) { if (!num(a, v, 0, 1e12, &x)) return 0; o->max_batches = (int64_t)x; }
        else if (!strcmp(a, "--warmup")) { if (!num(a, v, 0, 1e9, &x)) return 0; o->warmup = (int)x; }
        else if (!strcmp(a, "--seed")) { if (!num(a, v, 0, 4e9, &x)) return 0; o->seed = (uint64_t)x; }
        else if (!strcmp(a, "--lr")) { if (!num(a, v, 1e-9, 10, &x)) return 0; o->lr = (float)x; }
        else if (!strcmp(a, "--clip")) { if (!num(a, v, 0, 1e9, &x)) return 0; o->clip = (float)x; }
        else if (!strcmp(a, "--weight-decay")) { if (!num(a, v, 0, 1, &x)) return 0; o->weight_decay = (float)x; }
        else if (!strcmp(a, "--chunk-fraction")) { if (!num(a, v, 0.01, 0.95, &x)) return 0; o->chunk_fraction = (float)x; }
        else if (!strcmp(a, "--schedule")) {
            if (v && !strcmp(v, "constant")) o->schedule = MB_LR_CONSTANT;
            else if (v && !strcmp(v, "cosine")) o->schedule = MB_LR_WARMUP_COSINE;
            else if (v && !strcmp(v, "onecycle")) o->schedule = MB_LR_ONE_CYCLE;
            else return bad_flag(a, v, "expected constant, cosine or onecycle");
        } else if (!strcmp(a, "--loss")) {
            if (v && !strcmp(v, "mse")) o->loss = MB_LOSS_MSE;
            else if (v && !strcmp(v, "huber")) o->loss = MB_LOSS_HUBER;
            else return bad_flag(a, v, "expected mse or huber");
        } else return bad_flag("flag", a, "unknown (see the comment at the top of examples/train_multitf.c)");
        i += used;
    }
    if ((o->resume || o->ckpt_every) && !o->ckpt) return bad_flag("--resume/--ckpt-every", "", "need --ckpt FILE");
    if (o->resume && o->carry)
        return bad_flag("--resume", "--carry", "the carried hidden state is not checkpointed yet: resume without --carry");
    return 1;
}

// ---- model ----
// enc[s]: LSTM over segment s (B, T_s, F) -> h_last (B, H); fused (B, S*H) ->
// fc1 -> GELU -> fc2 -> pred (B, K). The five encoders run at once (mb_lstm_*_many):
// on a GPU each on its own stream 2+s, on the CPU side by side on the device's threads,
// so the critical path is the longest encoder (M1, 480 steps), not the sum. Each reads
// its segment of the batch in place (x_stride = T*F): no copies.

enum { MAX_SEG = 5 };

typedef struct model {
    mb_device *dev;
    mb_params *params;
    int nseg;
    int64_t T, F, K, H, head, maxB, seg_off[MAX_SEG], seg_len[MAX_SEG];
    mb_lstm *enc[MAX_SEG];
    mb_linear fc1, fc2;
    mb_loss_config loss_cfg;
    float *hlast[MAX_SEG], *dh[MAX_SEG];                 /* (B, H) each */
    mb_lstm_call call[MAX_SEG];                          /* the encoders' calls of this batch */
    float *fused, *dfused;                               /* (B, S*H) */
    float *z1, *a1, *da1;                                /* (B, head) */
    float *pred, *dpred, *zeros;                         /* (B, K) */
    float *loss;                                         /* one device float */
} model;

static mb_result alloc_f32(mb_device *dev, float **p, int64_t n) {
    return mb_alloc(dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)p);
}

static mb_result model_create(model *m, mb_device *dev, const mb_dataset_meta *meta, const options *o) {
    memset(m, 0, sizeof *m);
    m->dev = dev; m->T = meta->t; m->F = meta->f; m->K = meta->k; m->H = o->hidden; m->head = o->head;
    m->maxB = o->batch;
    m->nseg = meta->segments ? meta->segments : 1;
    if (m->nseg > MAX_SEG) return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: %d segments, this example handles at most %d",
                                          meta->source, m->nseg, MAX_SEG);
    for (int s = 0, off = 0; s < m->nseg; s++) {
        m->seg_len[s] = meta->segments ? meta->segment_len[s] : meta->t;
        m->seg_off[s] = off;
        off += (int)m->seg_len[s];
    }
    m->loss_cfg.kind = o->loss;
    MB_TRY(mb_params_create(&m->params, dev));
    for (int s = 0; s < m->nseg; s++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "enc%d.", s);
        mb_lstm_config lc;
        memset(&lc, 0, sizeof lc);
        lc.input_size = m->F; lc.hidden_size = m->H; lc.layers = o->layers; lc.prefix = prefix;
        lc.checkpoint = o->checkpoint_k; lc.max_steps = m->seg_len[s]; lc.max_batch = m->maxB;
        lc.carry_state = o->carry; lc.stream = 2 + s;
        MB_TRY(mb_lstm_create(&m->enc[s], m->params, &lc));
    }
    MB_TRY(mb_linear_init(&m->fc1, m->params, "head.fc1", m->nseg * m->H, m->head));
    MB_TRY(mb_linear_init(&m->fc2, m->params, "head.fc2", m->head, m->K));
    MB_TRY(mb_params_finalize(m->params));
    MB_TRY(mb_params_init(m->params, o->seed));
    for (int s = 0; s < m->nseg; s++) {
        MB_TRY(alloc_f32(dev, &m->hlast[s], m->maxB * m->H));
        MB_TRY(alloc_f32(dev, &m->dh[s], m->maxB * m->H));
    }
    MB_TRY(alloc_f32(dev, &m->fused, m->maxB * m->nseg * m->H));
    MB_TRY(alloc_f32(dev, &m->dfused, m->maxB * m->nseg * m->H));
    MB_TRY(alloc_f32(dev, &m->z1, m->maxB * m->head));
    MB_TRY(alloc_f32(dev, &m->a1, m->maxB * m->head));
    MB_TRY(alloc_f32(dev, &m->da1, m->maxB * m->head));
    MB_TRY(alloc_f32(dev, &m->pred, m->maxB * m->K));
    MB_TRY(alloc_f32(dev, &m->dpred, m->maxB * m->K));
    MB_TRY(alloc_f32(dev, &m->zeros, m->maxB * m->K));
    MB_TRY(alloc_f32(dev, &m->loss, 1));
    return mb_zero(dev, MB_STREAM_COMPUTE, m->zeros, (size_t)(m->maxB * m->K) * sizeof(float));
}

static void model_destroy(model *m) {
    float *bufs[] = {m->fused, m->dfused, m->z1, m->a1, m->da1, m->pred, m->dpred, m->zeros, m->loss};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mb_free(m->dev, bufs[i]);
    for (int s = 0; s < m->nseg; s++) {
        mb_lstm_destroy(m->enc[s]);
        mb_free(m->dev, m->hlast[s]); mb_free(m->dev, m->dh[s]);
    }
    mb_params_destroy(m->params);
}

/* Forward of B samples x (B, T, F) against y (B, K): loss into m->loss and, when
 * grad_scale > 0, dLoss/dpred * grad_scale into m->dpred. */
static mb_result model_forward(model *m, const float *x, const float *y, int64_t B, float grad_scale) {
    mb_device *dev = m->dev;
    int64_t dims[MAX_SEG];
    const float *hs[MAX_SEG];
    memset(m->call, 0, sizeof m->call);
    for (int s = 0; s < m->nseg; s++) {
        mb_lstm_call *c = &m->call[s];
        c->lstm = m->enc[s]; c->B = B; c->T = m->seg_len[s];
        c->x = x + m->seg_off[s] * m->F; c->x_stride = m->T * m->F; /* segment s of each sample */
        c->h_last = m->hlast[s];
        c->dh_last = m->dh[s];                                      /* for the backward */
        dims[s] = m->H;
        hs[s] = m->hlast[s];
    }
    MB_TRY(mb_lstm_forward_many(m->call, m->nseg));                 /* the five encoders at once */
    MB_TRY(mb_concat_forward(dev, MB_STREAM_COMPUTE, m->nseg, hs, dims, B, m->fused)); /* (B, S*H) */
    MB_TRY(mb_linear_forward(&m->fc1, MB_STREAM_COMPUTE, m->fused, B, m->z1));         /* (B, head) */
    MB_TRY(mb_act_forward(dev, MB_STREAM_COMPUTE, MB_ACT_GELU, m->z1, m->a1, (size_t)(B * m->head)));
    MB_TRY(mb_linear_forward(&m->fc2, MB_STREAM_COMPUTE, m->a1, B, m->pred));          /* (B, K) */
    return mb_loss(dev, MB_STREAM_COMPUTE, &m->loss_cfg, m->pred, y, B, m->K, grad_scale, NULL, m->loss,
                   grad_scale > 0 ? m->dpred : NULL);
}

/* Backward of the last forward: gradients accumulate into the flat gradient buffer. */
static mb_result model_backward(model *m, int64_t B) {
    mb_device *dev = m->dev;
    int64_t dims[MAX_SEG];
    float *dhs[MAX_SEG];
    MB_TRY(mb_linear_backward(&m->fc2, MB_STREAM_COMPUTE, m->a1, m->dpred, B, m->da1));
    MB_TRY(mb_act_backward(dev, MB_STREAM_COMPUTE, MB_ACT_GELU, m->z1, m->da1, m->da1, (size_t)(B * m->head)));
    MB_TRY(mb_linear_backward(&m->fc1, MB_STREAM_COMPUTE, m->fused, m->da1, B, m->dfused));
    for (int s = 0; s < m->nseg; s++) { dims[s] = m->H; dhs[s] = m->dh[s]; }
    MB_TRY(mb_concat_backward(dev, MB_STREAM_COMPUTE, m->nseg, m->dfused, dims, B, dhs));
    return mb_lstm_backward_many(m->call, m->nseg); /* reads the batch again: it is still valid */
}

// ---- evaluation ----

/* Mean validation loss of the model and of the naive baseline (predict 0 return). */
static mb_result evaluate(model *m, mb_loader *val, double *loss, double *baseline) {
    double sum = 0, base = 0;
    int64_t n = 0;
    mb_batch b;
    for (int s = 0; s < m->nseg; s++) mb_lstm_reset_state(m->enc[s]);
    for (;;) {
        MB_TRY(mb_loader_next(val, &b));
        if (b.count == 0) break;
        float l, z;
        MB_TRY(model_forward(m, (const float *)b.features, (const float *)b.targets, b.count, 0.0f));
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));
        MB_TRY(mb_loss(m->dev, MB_STREAM_COMPUTE, &m->loss_cfg, m->zeros, (const float *)b.targets, b.count, m->K,
                       0.0f, NULL, m->loss, NULL));
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &z));
        sum += (double)l * (double)b.count;
        base += (double)z * (double)b.count;
        n += b.count;
    }
    for (int s = 0; s < m->nseg; s++) mb_lstm_reset_state(m->enc[s]);
    *loss = n ? sum / (double)n : 0;
    *baseline = n ? base / (double)n : 0;
    return MB_OK;
}

// ---- training ----

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Everything of the loop that a checkpoint must carry besides params and optimizer. */
typedef struct run_state {
    int64_t epoch;                   /* the epoch being trained, 1-based */
    int64_t step, samples, batches;  /* optimizer steps, samples and batches so far */
    int64_t epoch_batches, epoch_n;  /* this epoch so far */
    double epoch_loss_sum;           /* sum of batch loss x count, this epoch */
    mb_loader_pos pos;               /* the next training batch */
    mb_accum acc;                    /* the accumulation window */
    double train_loss, val_loss, baseline;
    double seconds;                  /* training time of this process (not checkpointed) */
    int64_t samples_run;             /* samples trained by this process (not checkpointed) */
} run_state;

// ---- checkpoints ----
// One file: params, AdamW (m, v, steps), the run state and the options that shape the
// run (a resume with other options is refused).

static options shape_of(const options *o) {
    options k = *o;
    k.train = k.val = k.metrics = k.ckpt = NULL;
    k.quiet = k.resume = k.threads = 0;
    k.ckpt_every = 0;
    k.epochs = 0; /* a resumed run may train for more epochs */
    return k;
}

static mb_result save_ckpt(const options *o, model *m, mb_adamw *opt, const run_state *rs) {
    mb_ckpt_writer *w = NULL;
    options k = shape_of(o);
    run_state st = *rs;
    st.seconds = 0; /* timings are not state: a resumed run's file must equal an uninterrupted one's */
    st.samples_run = 0;
    mb_result r = mb_ckpt_writer_create(&w, m->dev);
    if (r == MB_OK) r = mb_ckpt_add_params(w, m->params);
    if (r == MB_OK) r = mb_ckpt_add_adamw(w, opt);
    if (r == MB_OK) r = mb_ckpt_add(w, "run", &st, sizeof st);
    if (r == MB_OK) r = mb_ckpt_add(w, "options", &k, sizeof k);
    if (r == MB_OK) r = mb_ckpt_write(w, o->ckpt);
    mb_ckpt_writer_destroy(w);
    return r;
}

static mb_result load_ckpt(const options *o, model *m, mb_adamw *opt, run_state *rs) {
    mb_ckpt_reader *rd = NULL;
    options k = shape_of(o), saved;
    MB_TRY(mb_ckpt_read(&rd, m->dev, o->ckpt));
    mb_result r = mb_ckpt_get(rd, "options", &saved, sizeof saved);
    if (r == MB_OK && memcmp(&saved, &k, sizeof k) != 0)
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s was written with other model or training options", o->ckpt);
    if (r == MB_OK) r = mb_ckpt_load_params(rd, m->params);
    if (r == MB_OK) r = mb_ckpt_load_adamw(rd, opt);
    if (r == MB_OK) r = mb_ckpt_get(rd, "run", rs, sizeof *rs);
    mb_ckpt_close(rd);
    return r;
}

/* The rest of epoch rs->epoch over the training loader: accumulation, clipping (inside
 * AdamW), schedule, checkpoints every --ckpt-every steps (at window boundaries). */
static mb_result train_epoch(model *m, mb_loader *tr, mb_adamw *opt, const mb_lr_schedule *sched, const options *o,
                             run_state *rs, double *seconds) {
    double t0 = now_seconds();
    int64_t samples0 = rs->samples;
    mb_batch b;
    for (;;) {
        if (o->max_batches && rs->epoch_batches >= o->max_batches) { /* skip to the next epoch */
            mb_loader_pos next = {rs->epoch, 0, 0};
            MB_TRY(mb_loader_set_position(tr, next));
            break;
        }
        MB_TRY(mb_loader_next(tr, &b));
        if (b.count == 0) break;
        if (mb_accum_window_start(&rs->acc)) MB_TRY(mb_params_zero_grad(m->params));
        MB_TRY(model_forward(m, (const float *)b.features, (const float *)b.targets, b.count,
                             mb_accum_loss_scale(&rs->acc)));
        MB_TRY(model_backward(m, b.count));
        int stepped = mb_accum_tick(&rs->acc);
        if (stepped) {
            float lr;
            MB_TRY(mb_lr_at(sched, rs->step, &lr));
            MB_TRY(mb_adamw_step(opt, lr, NULL)); /* f32: no loss scaler */
            rs->step++;
        }
        float l; /* fetching the loss waits for the batch: one host sync per batch, after its step */
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));
        rs->epoch_loss_sum += (double)l * (double)b.count;
        rs->epoch_n += b.count;
        rs->epoch_batches++;
        rs->batches++;
        rs->samples += b.count;
        if (!o->quiet)
            fprintf(stderr, "\repoch %lld batch %lld loss %.4f  %.0f samples/s   ", (long long)rs->epoch,
                    (long long)rs->epoch_batches, (double)l, (double)(rs->samples - samples0) / (now_seconds() - t0));
        if (stepped && o->ckpt_every && rs->step % o->ckpt_every == 0) {
            rs->pos = mb_loader_position(tr);
            MB_TRY(save_ckpt(o, m, opt, rs));
        }
    }
    if (!o->quiet) fputc('\n', stderr);
    MB_TRY(mb_sync(m->dev, -1));
    *seconds += now_seconds() - t0;
    rs->train_loss = rs->epoch_n ? rs->epoch_loss_sum / (double)rs->epoch_n : 0; /* mean over the epoch */
    return MB_OK;
}

/* Warnings and info from the library go to stderr; errors are printed once, by main. */
static void log_warnings(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    if (level != MB_LOG_ERROR) mb_log_stderr(level, msg, file, line, user);
}

static mb_result open_data(mb_device *dev, const char *path, const options *o, int shuffle, mb_dataset **ds,
                           mb_loader **ld) {
    mb_dataset_config dc;
    memset(&dc, 0, sizeof dc);
    MB_TRY(mb_dataset_open_file(ds, path, &dc));
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch; lc.shuffle = shuffle; lc.seed = o->seed; lc.chunk_fraction = o->chunk_fraction;
    return mb_loader_open(ld, dev, *ds, &lc);
}

static mb_result run(const options *o, run_state *rs) {
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = BACKEND; dc.streams = 2 + MAX_SEG; dc.threads = o->threads;
    dc.log.fn = log_warnings; dc.log.max = MB_LOG_WARN;
    mb_device *dev = NULL;
    mb_dataset *dtr = NULL, *dva = NULL;
    mb_loader *tr = NULL, *va = NULL;
    mb_adamw *opt = NULL;
    model m;
    memset(&m, 0, sizeof m);
    FILE *csv = NULL;
    mb_result r = mb_device_open(&dev, &dc);
    if (r == MB_OK) r = open_data(dev, o->train, o, 0, &dtr, &tr);
    if (r == MB_OK) r = open_data(dev, o->val, o, 0, &dva, &va);
    const mb_dataset_meta *mt = dtr ? mb_dataset_info(dtr) : NULL, *mv = dva ? mb_dataset_info(dva) : NULL;
    if (r == MB_OK && (mt->t != mv->t || mt->f != mv->f || mt->k != mv->k))
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s and %s differ in shape (T, F, K)", o->train, o->val);
    if (r == MB_OK) r = model_create(&m, dev, mt, o);
    mb_adamw_config ac = mb_adamw_config_default();
    ac.weight_decay = o->weight_decay; ac.max_grad_norm = o->clip;
    if (r == MB_OK) r = mb_adamw_create(&opt, m.params, &ac);
    if (r == MB_OK && o->metrics && !(csv = fopen(o->metrics, "w")))
        r = MB_FAIL(NULL, MB_ERR_IO, "cannot write %s: %s", o->metrics, strerror(errno));
    if (r == MB_OK && !o->quiet)
        printf("device: %s\ndata: %s N=%lld T=%lld F=%lld K=%lld, %d segments; params: %zu floats\n",
               mb_device_name(dev), o->train, (long long)mt->n, (long long)mt->t, (long long)mt->f,
               (long long)mt->k, m.nseg, mb_params_total(m.params));
    mb_lr_schedule sched;
    memset(&sched, 0, sizeof sched);
    rs->epoch = 1;
    if (r == MB_OK) r = mb_accum_init(&rs->acc, o->accum);
    if (r == MB_OK && o->resume) {
        r = load_ckpt(o, &m, opt, rs);
        if (r == MB_OK) r = mb_loader_set_position(tr, rs->pos);
        if (r == MB_OK && !o->quiet)
            printf("resumed from %s: epoch %lld, step %lld\n", o->ckpt, (long long)rs->epoch, (long long)rs->step);
    }
    sched.kind = o->schedule; sched.lr = o->lr;
    if (r == MB_OK) { /* optimizer steps in the whole run: the schedule's length */
        int64_t nb = mb_loader_get_plan(tr)->batches;
        if (o->max_batches && o->max_batches < nb) nb = o->max_batches;
        sched.total_steps = (int64_t)o->epochs * ((nb + o->accum - 1) / o->accum);
        if (sched.total_steps < 2) sched.total_steps = 2;
        sched.warmup_steps = o->warmup < sched.total_steps ? o->warmup : sched.total_steps / 2;
    }
    if (csv) fprintf(csv, "epoch,steps,train_loss,val_loss,baseline_val_loss,samples_per_s,device_bytes\n");
    size_t live0 = mb_device_mem_stats(dev ? dev : NULL).live[MB_MEM_DEVICE];
    double seconds = 0;
    int64_t samples0 = rs->samples;
    for (; r == MB_OK && rs->epoch <= o->epochs; rs->epoch++) {
        r = train_epoch(&m, tr, opt, &sched, o, rs, &seconds);
        if (r == MB_OK) r = evaluate(&m, va, &rs->val_loss, &rs->baseline);
        if (r != MB_OK) break;
        size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
        double sps = seconds > 0 ? (double)(rs->samples - samples0) / seconds : 0;
        printf("epoch %lld: steps %lld train_loss %.5f val_loss %.5f baseline %.5f  %.0f samples/s  device memory %.1f MB\n",
               (long long)rs->epoch, (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, sps, (double)live / 1e6);
        if (live > live0 + (size_t)100e6) printf("warning: device memory grew by %.0f MB this epoch (leak?)\n", (double)(live - live0) / 1e6);
        live0 = live;
        if (csv) fprintf(csv, "%lld,%lld,%.6f,%.6f,%.6f,%.1f,%zu\n", (long long)rs->epoch, (long long)rs->step,
                         rs->train_loss, rs->val_loss, rs->baseline, sps, live);
        run_state next = *rs; /* the checkpoint resumes at the start of the next epoch */
        next.epoch++;
        next.epoch_batches = next.epoch_n = 0;
        next.epoch_loss_sum = 0;
        next.pos = mb_loader_position(tr);
        if (o->ckpt) r = save_ckpt(o, &m, opt, &next);
        rs->epoch_batches = rs->epoch_n = 0;
        rs->epoch_loss_sum = 0;
    }
    rs->epoch--; /* the last epoch trained */
    rs->seconds = seconds;
    rs->samples_run = rs->samples - samples0;
    if (csv) fclose(csv);
    mb_adamw_destroy(opt);
    mb_loader_close(tr); mb_loader_close(va);
    mb_dataset_close(dtr); mb_dataset_close(dva);
    if (m.params) model_destroy(&m);
    mb_device_close(dev);
    return r;
}

int main(int argc, char **argv) {
    options o = default_options();
    if (!parse_options(argc, argv, &o)) return 2;
    run_state rs;
    memset(&rs, 0, sizeof rs);
    mb_result r = run(&o, &rs);
    if (r != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 2;
    }
    printf("summary: epochs=%lld steps=%lld train_loss=%.5f val_loss=%.5f baseline_val_loss=%.5f samples_per_s=%.1f\n",
           (long long)rs.epoch, (long long)rs.step, rs.train_loss, rs.val_loss, rs.baseline,
           rs.seconds > 0 ? (double)rs.samples_run / rs.seconds : 0.0);
    return 0;
}
