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
 * Flags (defaults in brackets; parsed by parse_options()): --epochs [3] --batch [128]
 * --hidden [32] --head [64] --layers [1] --lr [2e-3] --schedule constant|cosine|onecycle
 * [cosine] --warmup [20] --accum [1] --clip [1.0] --weight-decay [0.01] --loss mse|huber
 * [mse] --chunk-fraction [0.75] --checkpoint-k [0: auto] --carry --seed [1] --threads [0]
 * --metrics FILE [none] --plot FILE.svg [FILE of --metrics with .svg] --max-batches N
 * [0: all] --precision f32|bf16|f16 [f32] --quiet.
 * Mixed precision: bf16/f16 make the encoders' gemm operands 16-bit (f32 master weights,
 * f32 accumulation and cell state); f16 adds the dynamic loss scaler (scaled loss,
 * unscale, AdamW skips a step with inf/NaN gradients, the scale backs off or grows).
 * Output: a progress bar on stderr when it is a terminal (epoch, batches, samples/s, mean
 * loss, loss scale, device memory; nothing per batch in pipes or with --quiet), a line per
 * epoch; with --metrics a CSV row per batch and per epoch (section "metrics") and, at the
 * end, an SVG of the loss curves drawn from it (section "loss-curve picture").
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
    const char *train, *val, *metrics, *plot, *ckpt;
    int epochs, layers, accum, threads, carry, quiet, checkpoint_k, resume;
    int64_t ckpt_every;
    int64_t batch, hidden, head, max_batches;
    float lr, clip, weight_decay, chunk_fraction;
    int warmup;
    mb_lr_kind schedule;
    mb_loss_kind loss;
    mb_dtype precision;
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
        else if (!strcmp(a, "--plot")) { if (!v) return bad_flag(a, v, "needs a file"); o->plot = v; }
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
        } else if (!strcmp(a, "--precision")) {
            if (v && !strcmp(v, "f32")) o->precision = MB_F32;
            else if (v && !strcmp(v, "bf16")) o->precision = MB_BF16;
            else if (v && !strcmp(v, "f16")) o->precision = MB_F16;
            else return bad_flag(a, v, "expected f32, bf16 or f16");
        } else if (!strcmp(a, "--loss")) {
            if (v && !strcmp(v, "mse")) o->loss = MB_LOSS_MSE;
            else if (v && !strcmp(v, "huber")) o->loss = MB_LOSS_HUBER;
            else return bad_flag(a, v, "expected mse or huber");
        } else return bad_flag("flag", a, "unknown (see the comment at the top of examples/train_multitf.c)");
        i += used;
    }
    if ((o->resume || o->ckpt_every) && !o->ckpt) return bad_flag("--resume/--ckpt-every", "", "need --ckpt FILE");
    if (o->plot && !o->metrics) return bad_flag("--plot", o->plot, "needs --metrics FILE (the picture is drawn from it)");
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
    mb_scaler *scaler;                                   /* f16: the dynamic loss scaler, else NULL */
    int layers;
    float *state_h, *state_c;                            /* --carry: (layers, B, H) for checkpoints */
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
        lc.carry_state = o->carry; lc.stream = 2 + s; lc.precision = o->precision;
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
    m->layers = o->layers;
    if (o->carry) {
        MB_TRY(alloc_f32(dev, &m->state_h, m->layers * m->maxB * m->H));
        MB_TRY(alloc_f32(dev, &m->state_c, m->layers * m->maxB * m->H));
    }
    if (o->precision == MB_F16) MB_TRY(mb_scaler_create(&m->scaler, dev, NULL)); /* GradScaler defaults */
    return mb_zero(dev, MB_STREAM_COMPUTE, m->zeros, (size_t)(m->maxB * m->K) * sizeof(float));
}

static void model_destroy(model *m) {
    mb_scaler_destroy(m->scaler);
    float *bufs[] = {m->fused, m->dfused, m->z1, m->a1, m->da1, m->pred, m->dpred, m->zeros, m->loss,
                     m->state_h, m->state_c};
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
        int64_t carried = mb_lstm_state_batch(m->enc[s]); /* --carry: a batch of another size */
        if (carried && carried != B) mb_lstm_reset_state(m->enc[s]); /* (the epoch's last) starts fresh */
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
    const float *loss_scale = m->scaler ? mb_scaler_scale_ptr(m->scaler) : NULL; /* f16: scaled gradients */
    return mb_loss(dev, MB_STREAM_COMPUTE, &m->loss_cfg, m->pred, y, B, m->K, grad_scale, loss_scale, m->loss,
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
    k.train = k.val = k.metrics = k.plot = k.ckpt = NULL;
    k.quiet = k.resume = k.threads = 0;
    k.ckpt_every = 0;
    k.epochs = 0; /* a resumed run may train for more epochs */
    return k;
}

/* The metrics rows so far reach the file first: a resume keeps them (section "metrics"). */
/* --carry: each encoder's carried (h, c) and its batch size (0: none), so a resumed run
 * continues the carried state exactly. */
typedef struct carry_names { char batch[32], h[32], c[32]; } carry_names;
static carry_names carry_names_of(int s) {
    carry_names n;
    snprintf(n.batch, sizeof n.batch, "enc%d.carry_batch", s);
    snprintf(n.h, sizeof n.h, "enc%d.h_n", s);
    snprintf(n.c, sizeof n.c, "enc%d.c_n", s);
    return n;
}

static mb_result save_carry(mb_ckpt_writer *w, model *m) {
    for (int s = 0; s < m->nseg; s++) {
        carry_names name = carry_names_of(s);
        int64_t B = mb_lstm_state_batch(m->enc[s]);
        size_t bytes = (size_t)(m->layers * B * m->H) * sizeof(float);
        MB_TRY(mb_ckpt_add(w, name.batch, &B, sizeof B));
        if (!B) continue;
        MB_TRY(mb_lstm_final_state(m->enc[s], m->state_h, m->state_c));
        MB_TRY(mb_stream_wait(m->dev, MB_STREAM_COMPUTE, 2 + s)); /* copied on the encoder's stream, read on compute */
        MB_TRY(mb_ckpt_add(w, name.h, m->state_h, bytes));
        MB_TRY(mb_ckpt_add(w, name.c, m->state_c, bytes));
    }
    return MB_OK;
}

static mb_result load_carry(mb_ckpt_reader *rd, model *m) {
    for (int s = 0; s < m->nseg; s++) {
        carry_names name = carry_names_of(s);
        int64_t B = 0;
        MB_TRY(mb_ckpt_get(rd, name.batch, &B, sizeof B));
        mb_lstm_reset_state(m->enc[s]);
        if (!B) continue;
        if (B < 0 || B > m->maxB) return MB_FAIL(NULL, MB_ERR_FORMAT, "checkpoint: %s = %lld", name.batch, (long long)B);
        size_t bytes = (size_t)(m->layers * B * m->H) * sizeof(float);
        MB_TRY(mb_ckpt_get(rd, name.h, m->state_h, bytes));
        MB_TRY(mb_ckpt_get(rd, name.c, m->state_c, bytes));
        MB_TRY(mb_lstm_set_state(m->enc[s], B, m->state_h, m->state_c));
        MB_TRY(mb_stream_wait(m->dev, MB_STREAM_COMPUTE, 2 + s)); /* read on its stream before compute refills them */
    }
    return MB_OK;
}

static mb_result save_ckpt(const options *o, model *m, mb_adamw *opt, const run_state *rs, FILE *metrics) {
    mb_ckpt_writer *w = NULL;
    if (metrics) fflush(metrics);
    options k = shape_of(o);
    run_state st = *rs;
    st.seconds = 0; /* timings are not state: a resumed run's file must equal an uninterrupted one's */
    st.samples_run = 0;
    mb_result r = mb_ckpt_writer_create(&w, m->dev);
    if (r == MB_OK) r = mb_ckpt_add_params(w, m->params);
    if (r == MB_OK) r = mb_ckpt_add_adamw(w, opt);
    if (r == MB_OK && m->scaler) r = mb_ckpt_add_scaler(w, m->scaler);
    if (r == MB_OK && o->carry) r = save_carry(w, m);
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
    if (r == MB_OK && m->scaler) r = mb_ckpt_load_scaler(rd, m->scaler);
    if (r == MB_OK && o->carry) r = load_carry(rd, m);
    if (r == MB_OK) r = mb_ckpt_get(rd, "run", rs, sizeof *rs);
    mb_ckpt_close(rd);
    return r;
}

// ---- progress bar ----
// One line on stderr, redrawn in place (\r) at most ten times a second, and only when
// stderr is a terminal and --quiet is off: pipes and CI logs get nothing per batch.
//   epoch 2 [=======>                ] 37/120  412 samples/s  loss 0.9312  scale -  mem 12.3 MB

typedef struct progress {
    int on;       /* stderr is a terminal and no --quiet */
    double drawn; /* when the line was last drawn (now_seconds), 0 at an epoch's start */
} progress;

/* Device memory in use: the library's live device allocations and, on a GPU, what the
 * driver reports used of the total (the CPU's "device memory" is host RAM: not shown). */
static void memory_text(mb_device *dev, char *buf, size_t cap) {
    size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE], total = 0, avail = 0;
    int n = snprintf(buf, cap, "%.1f MB", (double)live / 1e6);
    if (n > 0 && (size_t)n < cap && mb_device_backend(dev) == MB_CUDA && mb_device_memory(dev, &total, &avail) == MB_OK)
        snprintf(buf + n, cap - (size_t)n, " (GPU %.2f of %.2f GB used)", (double)(total - avail) / 1e9,
                 (double)total / 1e9);
}

/* Redraw (throttled; always when final, which also ends the line). The loss scale (f16)
 * is read from the device only when drawing; "-" without a scaler. */
static void progress_draw(progress *p, model *m, const run_state *rs, int64_t total, double samples_per_s,
                          int final) {
    if (!p->on) return;
    double now = now_seconds();
    if (!final && now - p->drawn < 0.1) return;
    p->drawn = now;
    mb_device *dev = m->dev;
    mb_scaler_state st;
    double scale = m->scaler && mb_scaler_get(m->scaler, &st) == MB_OK ? st.scale : 0;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1], sc[32] = "-", mem[96];
    int64_t done = total > 0 ? rs->epoch_batches * WIDTH / total : (int64_t)WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < done ? '=' : i == done ? '>' : ' ';
    bar[WIDTH] = 0;
    if (scale > 0) snprintf(sc, sizeof sc, "%g", scale);
    memory_text(dev, mem, sizeof mem);
    fprintf(stderr, "\repoch %lld [%s] %lld/%lld  %.0f samples/s  loss %.4f  scale %s  mem %s\033[K",
            (long long)rs->epoch, bar, (long long)rs->epoch_batches, (long long)total, samples_per_s,
            rs->epoch_n ? rs->epoch_loss_sum / (double)rs->epoch_n : 0.0, sc, mem);
    if (final) fputc('\n', stderr);
}

// ---- metrics ----
// --metrics FILE: one CSV, a row per training batch (kind `step`) and one per epoch (kind
// `epoch`), in the order they happen:
//   kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes
// batch and step: batches and optimizer steps of the run so far (equal with --accum 1);
// loss: the batch's loss (step rows; the value the loop fetches anyway) or the epoch's mean
// training loss (epoch rows); lr: the step's learning rate (step rows); samples_per_s: this
// epoch so far; device_bytes: live device allocations (epoch rows). The rows are flushed
// before every checkpoint; --resume keeps the rows the checkpoint covers, drops any that
// the interrupted run wrote after it, and appends, so the file ends as an uninterrupted
// run's would (timings aside).

static const char metrics_header[] =
    "kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n";

/* A row that the checkpoint's run state rs covers (header and foreign lines: no). */
static int metrics_row_kept(const char *line, const run_state *rs) {
    char kind[8];
    long long epoch, batch;
    if (sscanf(line, "%7[a-z],%lld,%lld", kind, &epoch, &batch) != 3) return 0;
    if (!strcmp(kind, "step")) return batch <= rs->batches;
    return !strcmp(kind, "epoch") && epoch < rs->epoch;
}

/* The whole file as a string (NULL when it cannot be read). */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? (char *)malloc((size_t)n + 1) : NULL;
    if (s) s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

/* Open the metrics file: new, or on --resume rewritten to the rows rs covers (a last line
 * cut short by a kill has no newline and goes too). NULL with errno on failure. */
static FILE *metrics_open(const char *path, int resume, const run_state *rs) {
    char *old = resume ? read_text(path) : NULL;
    FILE *f = fopen(path, "w");
    if (f) fputs(metrics_header, f);
    for (char *line = old, *end; f && line && (end = strchr(line, '\n')); line = end + 1) {
        *end = 0;
        if (metrics_row_kept(line, rs)) fprintf(f, "%s\n", line);
    }
    free(old);
    return f;
}

static void metrics_step(FILE *f, const run_state *rs, float loss, float lr, double samples_per_s) {
    if (f) fprintf(f, "step,%lld,%lld,%lld,%.6g,,,%.6g,%.1f,\n", (long long)rs->epoch, (long long)rs->batches,
                   (long long)rs->step, (double)loss, (double)lr, samples_per_s);
}

static void metrics_epoch(FILE *f, const run_state *rs, double samples_per_s, size_t device_bytes) {
    if (f) fprintf(f, "epoch,%lld,%lld,%lld,%.6g,%.6g,%.6g,,%.1f,%zu\n", (long long)rs->epoch, (long long)rs->batches,
                   (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, samples_per_s, device_bytes);
}

// ---- loss-curve picture ----
// At the end of a run with --metrics: an SVG (plain text, deterministic) drawn from the
// metrics file, so that a resumed run shows the whole run. x: batches trained; y: loss.
// Each batch's loss (thin line, class "step") and its running mean (class "mean"), the
// epochs' mean training loss (circles) and validation loss (squares), the baseline's
// validation loss (dashed). Non-finite losses are left out.

#define SVG_STEP "stroke=\"#a8a8a8\" stroke-width=\"0.8\""
#define SVG_MEAN "stroke=\"#1f77b4\" stroke-width=\"2\""
#define SVG_BASE "stroke=\"#555\" stroke-dasharray=\"6 4\""
enum { SVG_W = 720, SVG_H = 420, PL = 64, PR = 16, PT = 48, PB = 44 }; /* size; plot margins */

typedef struct series { double *xy; int64_t n, cap; } series; /* points x0 y0 x1 y1 ... */
typedef struct curves {
    series step, mean, train, val;
    double last[3];  /* the last epoch row's train, validation and baseline losses */
    int epochs;      /* epoch rows */
    double x1, y0, y1; /* x from 0 to x1, y from y0 to y1 */
} curves;

static int series_add(series *s, double x, double y) { /* 0: out of memory */
    if (!isfinite(x) || !isfinite(y)) return 1;
    if (s->n == s->cap) {
        double *xy = (double *)realloc(s->xy, (size_t)(s->cap ? 4 * s->cap : 512) * sizeof(double));
        if (!xy) return 0;
        s->xy = xy;
        s->cap = s->cap ? 2 * s->cap : 256;
    }
    s->xy[2 * s->n] = x; s->xy[2 * s->n + 1] = y; s->n++;
    return 1;
}

/* The step and epoch rows of the metrics file, the running mean (trailing window of a
 * 25th of the steps) and the data's range. */
static int read_curves(FILE *f, curves *c) {
    char line[512];
    long long e, b, s;
    double loss, val, base, lo = INFINITY, hi = -INFINITY;
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        if (sscanf(line, "step,%lld,%lld,%lld,%lf", &e, &b, &s, &loss) == 4) ok = series_add(&c->step, (double)b, loss);
        else if (sscanf(line, "epoch,%lld,%lld,%lld,%lf,%lf,%lf", &e, &b, &s, &loss, &val, &base) == 6) {
            ok = series_add(&c->train, (double)b, loss) && series_add(&c->val, (double)b, val);
            c->last[0] = loss; c->last[1] = val; c->last[2] = base;
            c->epochs++;
        }
    }
    int64_t w = c->step.n / 25 > 1 ? c->step.n / 25 : 1;
    double sum = 0;
    for (int64_t i = 0; ok && i < c->step.n; i++) {
        sum += c->step.xy[2 * i + 1] - (i >= w ? c->step.xy[2 * (i - w) + 1] : 0);
        ok = series_add(&c->mean, c->step.xy[2 * i], sum / (double)(i < w ? i + 1 : w));
    }
    series *all[] = {&c->step, &c->train, &c->val};
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < all[k]->n; i++) {
            c->x1 = fmax(c->x1, all[k]->xy[2 * i]);
            lo = fmin(lo, all[k]->xy[2 * i + 1]); hi = fmax(hi, all[k]->xy[2 * i + 1]);
        }
    if (c->epochs && isfinite(c->last[2])) { lo = fmin(lo, c->last[2]); hi = fmax(hi, c->last[2]); }
    if (!(lo <= hi)) { lo = 0; hi = 1; } /* nothing to draw */
    double pad = fmax((hi - lo) * 0.05, 0.05 * fmax(fabs(lo), fabs(hi)) + 1e-6); /* also when all are equal */
    c->y0 = lo - pad; c->y1 = hi + pad;
    if (!(c->x1 > 0)) c->x1 = 1;
    return ok;
}

static double sx(const curves *c, double x) { return PL + x / c->x1 * (SVG_W - PL - PR); }
static double sy(const curves *c, double y) { return SVG_H - PB - (y - c->y0) / (c->y1 - c->y0) * (SVG_H - PT - PB); }

static double tick_step(double range) { /* 1, 2 or 5 x 10^k: about five ticks */
    double s = pow(10, floor(log10(range / 4))), r = range / 4 / s;
    return s * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
}

static void svg_axes(FILE *f, const curves *c) {
    int w = SVG_W - PL - PR, h = SVG_H - PT - PB;
    double st = tick_step(c->y1 - c->y0);
    for (double k = ceil(c->y0 / st); k * st <= c->y1; k++)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                PL, sy(c, k * st), PL + w, sy(c, k * st), PL - 6, sy(c, k * st) + 4, k * st + 0.0);
    st = fmax(1, tick_step(c->x1));
    for (double k = 0; k * st <= c->x1; k++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999\"/>"
                   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                sx(c, k * st), PT + h, sx(c, k * st), PT + h + 5, sx(c, k * st), PT + h + 18, k * st);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", PL, PT, w, h);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">batches trained</text>\n", PL + w / 2, SVG_H - 8);
    fprintf(f, "<text transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\">loss</text>\n", PT + h / 2);
}

static void svg_polyline(FILE *f, const curves *c, const char *cls, const char *style, const series *s) {
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" %s points=\"", cls, style);
    for (int64_t i = 0; i < s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", sx(c, s->xy[2 * i]), sy(c, s->xy[2 * i + 1]));
    fprintf(f, "\"/>\n");
}

static void svg_markers_legend(FILE *f, const curves *c) {
    for (int64_t i = 0; i < c->train.n; i++)
        fprintf(f, "<circle class=\"train\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f77b4\"/>\n",
                sx(c, c->train.xy[2 * i]), sy(c, c->train.xy[2 * i + 1]));
    for (int64_t i = 0; i < c->val.n; i++)
        fprintf(f, "<rect class=\"val\" x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"#d62728\"/>\n",
                sx(c, c->val.xy[2 * i]) - 4, sy(c, c->val.xy[2 * i + 1]) - 4);
    if (c->epochs && isfinite(c->last[2]))
        fprintf(f, "<line class=\"baseline\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" %s/>\n", PL,
                sy(c, c->last[2]), SVG_W - PR, sy(c, c->last[2]), SVG_BASE);
    static const char *const legend[][2] = {
        {"batch loss", "<line x2=\"18\" " SVG_STEP "/>"},
        {"running mean", "<line x2=\"18\" " SVG_MEAN "/>"},
        {"epoch: train loss", "<circle cx=\"9\" r=\"4\" fill=\"#1f77b4\"/>"},
        {"epoch: validation loss", "<rect x=\"5\" y=\"-4\" width=\"8\" height=\"8\" fill=\"#d62728\"/>"},
        {"baseline validation loss", "<line x2=\"18\" " SVG_BASE "/>"},
    };
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"170\" height=\"86\" fill=\"white\" fill-opacity=\"0.8\"/>\n",
            SVG_W - PR - 176, PT + 4);
    for (int i = 0; i < 5; i++)
        fprintf(f, "<g transform=\"translate(%d %d)\">%s<text x=\"24\" y=\"4\">%s</text></g>\n", SVG_W - PR - 170,
                PT + 14 + 16 * i, legend[i][1], legend[i][0]);
}

static void svg_title(FILE *f, const options *o, const curves *c) {
    static const char *const sched[] = {"constant", "cosine", "onecycle"};
    fprintf(f, "<text x=\"%d\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">train_multitf: hidden %lld, head %lld, "
               "layers %d, batch %lld, accum %d, lr %g %s, %s loss, seed %llu</text>\n",
            SVG_W / 2, (long long)o->hidden, (long long)o->head, o->layers, (long long)o->batch, o->accum,
            (double)o->lr, sched[o->schedule], o->loss == MB_LOSS_HUBER ? "huber" : "mse", (unsigned long long)o->seed);
    if (c->epochs)
        fprintf(f, "<text x=\"%d\" y=\"36\" text-anchor=\"middle\">last epoch: train %.4f, validation %.4f, "
                   "baseline %.4f</text>\n", SVG_W / 2, c->last[0], c->last[1], c->last[2]);
}

/* --plot FILE, or the metrics file's name with .svg for its extension. */
static mb_result plot_path(const options *o, char *buf, size_t cap) {
    const char *dot = strrchr(o->metrics, '.'), *slash = strrchr(o->metrics, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - o->metrics) : (int)strlen(o->metrics);
    int n = o->plot ? snprintf(buf, cap, "%s", o->plot) : snprintf(buf, cap, "%.*s.svg", stem, o->metrics);
    if (n < 0 || (size_t)n >= cap) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "picture path too long: %s", buf);
    FILE *f = fopen(buf, "r"); /* writable? checked before training, the file left as it was */
    int existed = f != NULL;
    if (f) fclose(f);
    if (!(f = fopen(buf, "a"))) return MB_FAIL(NULL, MB_ERR_IO, "cannot write %s: %s", buf, strerror(errno));
    fclose(f);
    if (!existed) remove(buf);
    return MB_OK;
}

static mb_result write_plot(const char *path, const options *o) {
    curves c;
    memset(&c, 0, sizeof c);
    FILE *in = fopen(o->metrics, "r"), *f = NULL;
    int ok = in && read_curves(in, &c);
    if (in) fclose(in);
    if (ok && !(f = fopen(path, "w"))) ok = 0;
    if (f) {
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
                SVG_W, SVG_H, SVG_W, SVG_H, SVG_W, SVG_H);
        svg_title(f, o, &c);
        svg_axes(f, &c);
        svg_polyline(f, &c, "step", SVG_STEP, &c.step);
        svg_polyline(f, &c, "mean", SVG_MEAN, &c.mean);
        svg_markers_legend(f, &c);
        fputs("</svg>\n", f);
        ok = !ferror(f);
        ok = !fclose(f) && ok;
    }
    free(c.step.xy); free(c.mean.xy); free(c.train.xy); free(c.val.xy);
    return ok ? MB_OK : MB_FAIL(NULL, MB_ERR_IO, "cannot draw %s from %s", path, o->metrics);
}

// ---- the training loop ----

static double rate(int64_t samples, double seconds) { return seconds > 0 ? (double)samples / seconds : 0; }

/* Batches per epoch: the loader's plan, capped by --max-batches. */
static int64_t batches_per_epoch(mb_loader *tr, const options *o) {
    int64_t nb = mb_loader_get_plan(tr)->batches;
    return o->max_batches && o->max_batches < nb ? o->max_batches : nb;
}

/* One optimizer step. f16: unscale the gradients, AdamW (skipped on the device when any
 * gradient is inf/NaN), then the scaler backs off or grows. No host sync. */
static mb_result optimizer_step(model *m, mb_adamw *opt, float lr) {
    if (!m->scaler) return mb_adamw_step(opt, lr, NULL); /* f32 and bf16: no loss scaling */
    MB_TRY(mb_scaler_unscale(m->scaler, mb_params_grad(m->params), mb_params_total(m->params)));
    MB_TRY(mb_adamw_step(opt, lr, m->scaler));
    return mb_scaler_update(m->scaler);
}

/* The rest of epoch rs->epoch over the training loader: accumulation, clipping (inside
 * AdamW), schedule, checkpoints every --ckpt-every steps (at window boundaries). */
static mb_result train_epoch(model *m, mb_loader *tr, mb_adamw *opt, const mb_lr_schedule *sched, const options *o,
                             run_state *rs, double *seconds, FILE *csv, progress *pb) {
    double t0 = now_seconds();
    int64_t samples0 = rs->samples, total = batches_per_epoch(tr, o);
    mb_batch b;
    pb->drawn = 0;
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
        float lr; /* this accumulation window's learning rate */
        MB_TRY(mb_lr_at(sched, rs->step, &lr));
        int stepped = mb_accum_tick(&rs->acc);
        if (stepped) {
            MB_TRY(optimizer_step(m, opt, lr));
            rs->step++;
        }
        float l; /* fetching the loss waits for the batch: one host sync per batch, after its step */
        MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));
        rs->epoch_loss_sum += (double)l * (double)b.count;
        rs->epoch_n += b.count;
        rs->epoch_batches++;
        rs->batches++;
        rs->samples += b.count;
        double sps = rate(rs->samples - samples0, now_seconds() - t0);
        metrics_step(csv, rs, l, lr, sps);
        progress_draw(pb, m, rs, total, sps, 0);
        if (stepped && o->ckpt_every && rs->step % o->ckpt_every == 0) {
            rs->pos = mb_loader_position(tr);
            MB_TRY(save_ckpt(o, m, opt, rs, csv));
        }
    }
    progress_draw(pb, m, rs, total, rate(rs->samples - samples0, now_seconds() - t0), 1);
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
    char plot[1024] = "";
    if (r == MB_OK && o->metrics) r = plot_path(o, plot, sizeof plot);
    if (r == MB_OK && o->metrics && !(csv = metrics_open(o->metrics, o->resume, rs)))
        r = MB_FAIL(NULL, MB_ERR_IO, "cannot write %s: %s", o->metrics, strerror(errno));
    sched.kind = o->schedule; sched.lr = o->lr;
    if (r == MB_OK) { /* optimizer steps in the whole run: the schedule's length */
        int64_t nb = batches_per_epoch(tr, o);
        sched.total_steps = (int64_t)o->epochs * ((nb + o->accum - 1) / o->accum);
        if (sched.total_steps < 2) sched.total_steps = 2;
        sched.warmup_steps = o->warmup < sched.total_steps ? o->warmup : sched.total_steps / 2;
    }
    size_t live0 = dev ? mb_device_mem_stats(dev).live[MB_MEM_DEVICE] : 0;
    progress pb = {!o->quiet && isatty(STDERR_FILENO), 0};
    double seconds = 0;
    int64_t samples0 = rs->samples;
    for (; r == MB_OK && rs->epoch <= o->epochs; rs->epoch++) {
        r = train_epoch(&m, tr, opt, &sched, o, rs, &seconds, csv, &pb);
        if (r == MB_OK) r = evaluate(&m, va, &rs->val_loss, &rs->baseline);
        if (r != MB_OK) break;
        size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
        double sps = rate(rs->samples - samples0, seconds);
        char mem[96];
        memory_text(dev, mem, sizeof mem);
        printf("epoch %lld: steps %lld train_loss %.5f val_loss %.5f baseline %.5f  %.0f samples/s  device memory %s\n",
               (long long)rs->epoch, (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, sps, mem);
        mb_scaler_state sst;
        if (m.scaler && mb_scaler_get(m.scaler, &sst) == MB_OK) printf("  f16 loss scale %g\n", (double)sst.scale);
        if (live > live0 + (size_t)100e6) printf("warning: device memory grew by %.0f MB this epoch (leak?)\n", (double)(live - live0) / 1e6);
        live0 = live;
        metrics_epoch(csv, rs, sps, live);
        run_state next = *rs; /* the checkpoint resumes at the start of the next epoch */
        next.epoch++;
        next.epoch_batches = next.epoch_n = 0;
        next.epoch_loss_sum = 0;
        next.pos = mb_loader_position(tr);
        if (o->ckpt) r = save_ckpt(o, &m, opt, &next, csv);
        rs->epoch_batches = rs->epoch_n = 0;
        rs->epoch_loss_sum = 0;
    }
    rs->epoch--; /* the last epoch trained */
    rs->seconds = seconds;
    rs->samples_run = rs->samples - samples0;
    if (csv && fclose(csv) && r == MB_OK) r = MB_FAIL(NULL, MB_ERR_IO, "cannot write %s", o->metrics);
    if (r == MB_OK && plot[0]) r = write_plot(plot, o);
    if (r == MB_OK && plot[0] && !o->quiet) printf("loss curves: %s\n", plot);
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
