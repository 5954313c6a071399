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
 * Weights: --export FILE.safetensors writes the trained weights (PyTorch's names, the
 * normalisation in its metadata) at the end; --init FILE.safetensors starts from a file
 * (also one PyTorch wrote): examples/multitf.h, docs/TRADING.md.
 * Checkpoints: --ckpt FILE writes everything a run needs (params, AdamW moments and step,
 * loader position, accumulation window, counters; crash-safe: temp file, fsync, rename,
 * checksum) after every epoch and every --ckpt-every N optimizer steps; --resume continues
 * from FILE and ends with the same weights, bit for bit, as an uninterrupted run.
 * Data parallel (docs/DIST.md): build/train_multitf_mpi (this file built by mpicc with
 * -DMEGABATCH_MPI) under `mpirun -np N`: each rank trains on its shard of every global
 * batch of N x --batch samples, the gradients are averaged by one all-reduce per step,
 * and rank 0 alone prints, writes metrics and checkpoints (section "data parallel").
 * Last line, for scripts:
 *   summary: epochs=.. steps=.. train_loss=.. val_loss=.. baseline_val_loss=.. samples_per_s=.. world=..
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
#include "mb_args.h"
#include "mb_plot.h"
#include "multitf.h" /* the weights file: --export, --init */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- options ----

typedef struct options {
    const char *train, *val, *metrics, *plot, *ckpt;
    const char *export_path, *init;  /* --export, --init FILE.safetensors (docs/TRADING.md) */
    int epochs, layers, accum, threads, carry, quiet, checkpoint_k, resume;
    int64_t ckpt_every;
    int64_t batch, hidden, head, max_batches;
    float lr, clip, weight_decay, chunk_fraction;
    int warmup;
    mb_lr_kind schedule;
    mb_loss_kind loss;
    mb_dtype precision;
    uint64_t seed;
    int world;          /* data parallel: ranks (set by run(); part of a checkpoint's shape) */
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

static const char usage[] =
    "usage: train_multitf [--train data/train.h5] [--val data/val.h5] [flags]   (train_multitf_cuda: the GPU)\n"
    "Trains five LSTM encoders (one per timeframe segment) + fusion + head on the files that\n"
    "build/prepare writes; a line per epoch and a last `summary:` line (docs/EXAMPLE.md).\n"
    "model:      --hidden H [32]  --head N [64]  --layers L [1]  --loss mse|huber [mse]\n"
    "            --carry (carry the encoders' state from batch to batch)\n"
    "training:   --epochs E [3]  --batch B [128]  --lr X [2e-3]  --schedule constant|cosine|onecycle [cosine]\n"
    "            --warmup STEPS [20]  --accum N [1]  --clip X [1.0]  --weight-decay X [0.01]\n"
    "            --precision f32|bf16|f16 [f32]  --seed S [1]  --max-batches N [0: all]\n"
    "machine:    --threads N [0: the cores]  --chunk-fraction X [0.75]  --checkpoint-k K [0: auto]\n"
    "output:     --metrics FILE.csv  --plot FILE.svg [the metrics name with .svg]  --quiet\n"
    "checkpoint: --ckpt FILE  --ckpt-every STEPS [0: each epoch only]  --resume\n"
    "weights:    --export FILE.safetensors (at the end)  --init FILE.safetensors (start from it; docs/TRADING.md)\n"
    "            -h, --help: this text\n"
    "Exit 2 with one line `error: ...` on stderr on bad flags or data.\n";

static int bad_flag(const char *flag, const char *value, const char *want) {
    if (!value) mba_missing(flag);
    else mba_error("%s '%s': %s", flag, value, want);
    return 0;
}

static int num(const char *flag, const char *v, double lo, double hi, double *out) {
    if (mba_number(v, lo, hi, out)) {
        char want[96];
        snprintf(want, sizeof want, "expected a number in [%g, %g]", lo, hi);
        return bad_flag(flag, v, want);
    }
    return 1;
}

/* Returns 1 when the flags are good; prints `error: ...` and returns 0 otherwise. */
static int parse_options(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = mba_value(argc, argv, i);
        double x = 0;
        int used = 1;
        if (!strcmp(a, "--carry")) { o->carry = 1; used = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; used = 0; }
        else if (!strcmp(a, "--resume")) { o->resume = 1; used = 0; }
        else if (!strcmp(a, "--ckpt")) { if (!v) return bad_flag(a, v, "needs a file"); o->ckpt = v; }
        else if (!strcmp(a, "--ckpt-every")) { if (!num(a, v, 0, 1e12, &x)) return 0; o->ckpt_every = (int64_t)x; }
        else if (!strcmp(a, "--export")) { if (!v) return bad_flag(a, v, "needs a file"); o->export_path = v; }
        else if (!strcmp(a, "--init")) { if (!v) return bad_flag(a, v, "needs a file"); o->init = v; }
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
        } else return mba_unknown(a), 0;
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
    mb_dist *dist;                                       /* data parallel: a world of one without MPI */
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
    k.export_path = k.init = NULL;
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
    MB_TRY(mb_ckpt_open(&rd, m->dev, o->ckpt));
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

// ---- weights file ----
// --export FILE.safetensors at the end of training, --init FILE.safetensors before it
// (a file of this program or of bench/pytorch/multitf.py): examples/multitf.h, docs/TRADING.md.

static mtf_spec spec_of(const model *m, const mb_dataset_meta *meta, const options *o) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = m->nseg; s.layers = m->layers; s.carry = o->carry;
    s.F = m->F; s.K = m->K; s.H = m->H; s.head = m->head; s.T = m->T;
    for (int i = 0; i < m->nseg; i++) {
        s.seg_len[i] = m->seg_len[i];
        size_t n = strlen(s.seg_names);
        snprintf(s.seg_names + n, sizeof s.seg_names - n, "%s%s", i ? "," : "", meta->segment_name[i]);
    }
    if (!meta->segment_name[0][0]) s.seg_names[0] = 0;
    mtf_spec_read_norm(&s, o->train);
    return s;
}

static mb_result export_model(const options *o, model *m, const mb_dataset_meta *meta) {
    mtf_spec s = spec_of(m, meta, o);
    mtf_meta_text t;
    mb_result r = mtf_meta_of(&s, &t);
    if (r == MB_OK) r = mb_st_save_params(o->export_path, m->params, mtf_rename, t.kv, t.n);
    mtf_meta_free(&t);
    return r;
}

/* --export's directory must take the file: checked before training, not after it. */
static mb_result export_writable(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", path); /* what mb_st_write creates first */
    FILE *f = fopen(tmp, "w");
    if (!f) return MB_FAIL(NULL, MB_ERR_IO, "--export: cannot create '%s': %s", tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    return MB_OK;
}

static mb_result init_model(const options *o, model *m) {
    mb_st_file *f = NULL;
    mtf_spec s;
    MB_TRY(mb_st_open(&f, o->init));
    mb_result r = mtf_spec_of(f, o->init, &s);
    for (int i = 0; r == MB_OK && s.T && i < m->nseg; i++)
        if (s.nseg != m->nseg || s.seg_len[i] != m->seg_len[i])
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: its segments differ from the data's", o->init);
    if (r == MB_OK) r = mb_st_load_params(f, m->params, mtf_rename);
    mb_st_close(f);
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
// At the end of a run with --metrics: an SVG drawn from the metrics file (so a resumed run
// shows the whole run) by examples/mb_plot.h: the last validation loss against the
// baseline in percent, the epochs' losses on a y range of their own, the batch losses in
// a small panel below (docs/EXAMPLE.md).

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
    static const char *const sched[] = {"constant", "cosine", "onecycle"};
    char title[256];
    snprintf(title, sizeof title, "train_multitf: hidden %lld, head %lld, layers %d, batch %lld, accum %d, lr %g %s, "
             "%s loss, %s, seed %llu", (long long)o->hidden, (long long)o->head, o->layers, (long long)o->batch,
             o->accum, (double)o->lr, sched[o->schedule], o->loss == MB_LOSS_HUBER ? "huber" : "mse",
             mb_dtype_name(o->precision), (unsigned long long)o->seed);
    if (mb_plot_svg(o->metrics, path, title) != 0)
        return MB_FAIL(NULL, MB_ERR_IO, "cannot draw %s from %s", path, o->metrics);
    return MB_OK;
}

// ---- data parallel ----
// Under mpirun (build/train_multitf_mpi) each rank's training loader reads its shard of
// every global batch (mb_loader_config.shard_*); rank 0's weights are broadcast at the
// start; per batch one all-reduce averages the gradients over all ranks' samples (the
// batch loss rides along) before the optimizer step, so clipping and the f16 skip see
// the same bits on every rank; after each epoch the ranks check they are bitwise in sync.
// Rank 0 alone prints, writes metrics, the picture and checkpoints (which every rank
// reads on --resume: a shared file system, or a copy on each machine). Validation runs
// whole on every rank (same weights, same numbers). Not supported with several ranks:
// --accum > 1 and --carry (refused).

static mb_result data_parallel_check(const options *o) {
    if (o->world > 1 && (o->accum > 1 || o->carry))
        return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "--accum > 1 and --carry are not supported with %d ranks", o->world);
    return MB_OK;
}

/* The batch's gradients (and loss) averaged over the ranks, weighted by their samples. */
static mb_result data_parallel_reduce(model *m, int64_t count, float *loss, int64_t *total) {
    MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, loss)); /* the host reduces: the batch is done */
    return mb_dist_allreduce_grads(m->dist, m->params, count, loss, total);
}

static mb_result data_parallel_in_sync(model *m) {
    int same = 1;
    if (mb_dist_size(m->dist) > 1) MB_TRY(mb_dist_check_sync(m->dist, m->params, &same));
    return same ? MB_OK : MB_FAIL(NULL, MB_ERR_CORRUPT, "the ranks' weights differ (rank %d)", mb_dist_rank(m->dist));
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
        int stepped = mb_accum_tick(&rs->acc), dp = mb_dist_size(m->dist) > 1;
        float l;             /* the batch loss; data parallel: over all ranks' samples */
        int64_t n = b.count; /* samples of the batch, over all ranks */
        if (dp) MB_TRY(data_parallel_reduce(m, b.count, &l, &n));
        if (stepped) {
            MB_TRY(optimizer_step(m, opt, lr));
            rs->step++;
        }
        /* fetching the loss waits for the batch: one host sync per batch, after its step */
        if (!dp) MB_TRY(mb_fetch_scalar(m->dev, MB_STREAM_COMPUTE, m->loss, &l));
        rs->epoch_loss_sum += (double)l * (double)n;
        rs->epoch_n += n;
        rs->epoch_batches++;
        rs->batches++;
        rs->samples += n;
        double sps = rate(rs->samples - samples0, now_seconds() - t0);
        metrics_step(csv, rs, l, lr, sps);
        progress_draw(pb, m, rs, total, sps, 0);
        if (stepped && o->ckpt_every && rs->step % o->ckpt_every == 0 && mb_dist_rank(m->dist) == 0) {
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

/* Untrusted files: each is validated first in a child process (mb_dataset_probe), so a
 * file that crashes or hangs HDF5 ends in an error line. Both are opened before the device
 * and the loaders start threads: the probe must not fork while another thread is inside
 * HDF5. */
static mb_result open_dataset(const char *path, mb_dataset **ds) {
    mb_dataset_config dc;
    memset(&dc, 0, sizeof dc);
    dc.isolate = 1;
    return mb_dataset_open_file(ds, path, &dc);
}

static mb_result open_loader(mb_device *dev, mb_dataset *ds, const options *o, mb_dist *shard, mb_loader **ld) {
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch; lc.shuffle = 0; lc.seed = o->seed; lc.chunk_fraction = o->chunk_fraction;
    lc.shard_rank = mb_dist_rank(shard); lc.shard_count = mb_dist_size(shard); /* NULL: unsharded */
    return mb_loader_open(ld, dev, ds, &lc);
}

static mb_result run(const options *opts, run_state *rs, mb_dist **dist_out) {
    options oo = *opts;
    const options *o = &oo;
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
    mb_dist *dist = NULL;
    mb_result r = open_dataset(o->train, &dtr);
    if (r == MB_OK) r = open_dataset(o->val, &dva);
    if (r == MB_OK) r = mb_dist_open(&dist, NULL);
    *dist_out = dist;
    dc.index = mb_dist_local_rank(dist); /* CUDA: one GPU per rank of this machine */
    if (r == MB_OK) r = mb_device_open(&dev, &dc);
    oo.world = mb_dist_size(dist);
    int lead = mb_dist_rank(dist) == 0; /* rank 0 prints, writes metrics and checkpoints */
    if (r == MB_OK) r = data_parallel_check(o);
    if (r == MB_OK) r = open_loader(dev, dtr, o, dist, &tr);
    if (r == MB_OK) r = open_loader(dev, dva, o, NULL, &va);
    const mb_dataset_meta *mt = dtr ? mb_dataset_info(dtr) : NULL, *mv = dva ? mb_dataset_info(dva) : NULL;
    if (r == MB_OK && (mt->t != mv->t || mt->f != mv->f || mt->k != mv->k))
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s and %s differ in shape (T, F, K)", o->train, o->val);
    if (r == MB_OK) r = model_create(&m, dev, mt, o);
    m.dist = dist;
    if (r == MB_OK && o->init && !o->resume) r = init_model(o, &m);
    if (r == MB_OK) r = mb_dist_broadcast_params(dist, m.params);
    if (r == MB_OK && o->export_path && lead) r = export_writable(o->export_path);
    mb_adamw_config ac = mb_adamw_config_default();
    ac.weight_decay = o->weight_decay; ac.max_grad_norm = o->clip;
    if (r == MB_OK) r = mb_adamw_create(&opt, m.params, &ac);
    if (r == MB_OK && !o->quiet && lead && o->world > 1) printf("data parallel: %d ranks\n", o->world);
    if (r == MB_OK && !o->quiet && lead)
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
        if (r == MB_OK && !o->quiet && lead)
            printf("resumed from %s: epoch %lld, step %lld\n", o->ckpt, (long long)rs->epoch, (long long)rs->step);
    }
    char plot[1024] = "";
    if (r == MB_OK && o->metrics && lead) r = plot_path(o, plot, sizeof plot);
    if (r == MB_OK && o->metrics && lead && !(csv = metrics_open(o->metrics, o->resume, rs)))
        r = MB_FAIL(NULL, MB_ERR_IO, "cannot write %s: %s", o->metrics, strerror(errno));
    sched.kind = o->schedule; sched.lr = o->lr;
    if (r == MB_OK) { /* optimizer steps in the whole run: the schedule's length */
        int64_t nb = batches_per_epoch(tr, o);
        sched.total_steps = (int64_t)o->epochs * ((nb + o->accum - 1) / o->accum);
        if (sched.total_steps < 2) sched.total_steps = 2;
        sched.warmup_steps = o->warmup < sched.total_steps ? o->warmup : sched.total_steps / 2;
    }
    size_t live0 = dev ? mb_device_mem_stats(dev).live[MB_MEM_DEVICE] : 0;
    progress pb = {!o->quiet && lead && isatty(STDERR_FILENO), 0};
    double seconds = 0;
    int64_t samples0 = rs->samples;
    for (; r == MB_OK && rs->epoch <= o->epochs; rs->epoch++) {
        r = train_epoch(&m, tr, opt, &sched, o, rs, &seconds, csv, &pb);
        if (r == MB_OK) r = evaluate(&m, va, &rs->val_loss, &rs->baseline);
        if (r == MB_OK) r = data_parallel_in_sync(&m);
        if (r != MB_OK) break;
        size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
        double sps = rate(rs->samples - samples0, seconds);
        char mem[96];
        memory_text(dev, mem, sizeof mem);
        if (lead) printf("epoch %lld: steps %lld train_loss %.5f val_loss %.5f baseline %.5f  %.0f samples/s  device memory %s\n",
               (long long)rs->epoch, (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, sps, mem);
        mb_scaler_state sst;
        if (m.scaler && mb_scaler_get(m.scaler, &sst) == MB_OK && lead) printf("  f16 loss scale %g\n", (double)sst.scale);
        if (live > live0 + (size_t)100e6 && lead) printf("warning: device memory grew by %.0f MB this epoch (leak?)\n", (double)(live - live0) / 1e6);
        live0 = live;
        metrics_epoch(csv, rs, sps, live);
        run_state next = *rs; /* the checkpoint resumes at the start of the next epoch */
        next.epoch++;
        next.epoch_batches = next.epoch_n = 0;
        next.epoch_loss_sum = 0;
        next.pos = mb_loader_position(tr);
        if (o->ckpt && lead) r = save_ckpt(o, &m, opt, &next, csv);
        rs->epoch_batches = rs->epoch_n = 0;
        rs->epoch_loss_sum = 0;
    }
    rs->epoch--; /* the last epoch trained */
    rs->seconds = seconds;
    rs->samples_run = rs->samples - samples0;
    if (csv && fclose(csv) && r == MB_OK) r = MB_FAIL(NULL, MB_ERR_IO, "cannot write %s", o->metrics);
    if (r == MB_OK && plot[0]) r = write_plot(plot, o);
    if (r == MB_OK && plot[0] && !o->quiet) printf("loss curves: %s\n", plot); /* plot: rank 0 only */
    if (r == MB_OK && o->export_path && lead) r = export_model(o, &m, mt);
    if (r == MB_OK && o->export_path && lead && !o->quiet) printf("weights: %s\n", o->export_path);
    mb_adamw_destroy(opt);
    mb_loader_close(tr); mb_loader_close(va);
    mb_dataset_close(dtr); mb_dataset_close(dva);
    if (m.params) model_destroy(&m);
    mb_device_close(dev);
    return r;
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    options o = default_options();
    if (!parse_options(argc, argv, &o)) return 2;
    run_state rs;
    memset(&rs, 0, sizeof rs);
    mb_dist *dist = NULL;
    mb_result r = run(&o, &rs, &dist);
    if (r != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        mb_dist_abort(dist, 2); /* several ranks: end them all (they would wait for this one) */
        mb_dist_close(dist);
        return 2;
    }
    if (mb_dist_rank(dist) == 0) /* samples: over all ranks */
        printf("summary: epochs=%lld steps=%lld train_loss=%.5f val_loss=%.5f baseline_val_loss=%.5f samples_per_s=%.1f "
               "world=%d\n", (long long)rs.epoch, (long long)rs.step, rs.train_loss, rs.val_loss, rs.baseline,
               rs.seconds > 0 ? (double)rs.samples_run / rs.seconds : 0.0, mb_dist_size(dist));
    mb_dist_close(dist);
    return 0;
}
