/* train_multitf.c - the multi-timeframe model and its training loop (docs/EXAMPLE.md).
 *
 * Model (examples/multitf.h): five LSTM encoders, one per timeframe segment of a sample (M1
 * 480 bars, M5 288, M15 192, H1 96, H4 48: the `segments` attribute of the file), each
 * handing on its last hidden state; the five states concatenated and a two-layer head
 * predicting the K targets. Loss: MSE (or Huber). AdamW with gradient clipping, a
 * learning-rate schedule, gradient accumulation; f16 adds the dynamic loss scaler.
 *
 *   build/train_multitf      --train data/train.h5 --val data/val.h5     (CPU, cc)
 *   build/train_multitf_cuda --train data/train.h5 --val data/val.h5     (GPU, nvcc)
 *   build/train_multitf_mpi  under mpirun -np N: data parallel (section "data parallel")
 *
 * The same source is the CUDA program: nvcc compiles it with megabatch_cuda.cuh. Flags:
 * --help. What is not the model or the loop is in examples/mb_train.h: the progress bar,
 * the metrics CSV and its SVG, checkpoints (--ckpt, --resume: bitwise the weights of an
 * uninterrupted run), the epoch lines and the last line, for scripts:
 *   summary: epochs=.. steps=.. train_loss=.. val_loss=.. baseline_val_loss=.. samples_per_s=.. world=..
 * (under the CUDA simulator, tests/cudasim, also launches_per_step=.. graphs_per_step=.. syncs_per_step=..).
 * A training step never waits for the device, and on the GPU it is one CUDA graph launch
 * (section "the training step").
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
#include "mb_train.h" /* progress, metrics, picture, checkpoints, report; mb_args.h */
#include "multitf.h"  /* the model; its weights file: --export, --init */
#include "mtf_onnx.h" /* --export-onnx */
#include "mb_select.h" /* --ema, --swa-start, --keep-best, --patience */
#include "mb_metrics.h" /* hit rate, IC, rank IC of the validation predictions */
#include "mb_walk.h"    /* --walk-forward K: the folds */

// ---- options ----

typedef struct options { /* those that shape a run are in each checkpoint: options_key below */
    const char *train, *val, *metrics, *plot, *ckpt;
    const char *export_path, *init;  /* --export, --init FILE.safetensors (docs/TRADING.md) */
    int epochs, layers, accum, threads, carry, quiet, checkpoint_k, resume;
    int64_t ckpt_every;
    int64_t batch, hidden, head, max_batches;
    float lr, clip, weight_decay, chunk_fraction;
    int warmup;
    float ema;          /* --ema DECAY; 0: off */
    float dropout;      /* --dropout P: nn.LSTM's between layers and before the head (multitf.h); 0: off */
    int swa_start, keep_best, patience; /* --swa-start EPOCH, --keep-best, --patience N (mb_select.h) */
    int walk_forward;   /* --walk-forward K: K folds of --train (mb_walk.h), 0: off; not in the key (no --ckpt) */
    int64_t wf_window;  /* --wf-window W: a rolling training window of W samples, 0: expanding */
    mb_lr_kind schedule;
    mb_loss_kind loss;
    mb_dtype precision;
    uint64_t seed;
    int world;          /* data parallel: ranks (set by trainer_open; part of a checkpoint's shape) */
    int no_ftz;         /* --no-ftz: the CPU keeps denormals */
    mb_cpu_kernel cpu_kernel; /* --cpu-kernel: the CPU LSTM's own kernels (the same bits: not in the key) */
} options;

/* The options that shape a run, by their flags' names: a checkpoint holds them and a resume
 * must match them (mb_ckpt_key; not the paths, --quiet, --resume, --threads, --cpu-kernel,
 * --epochs, --ckpt-every). A new option that shapes a run is one more entry, with the value that files
 * written before it hold as its `before`. */
enum { OPTION_KEYS = 24, OPTION_KEYS_V1 = 19 };
static void options_key(const options *o, mb_ckpt_key *out) {
    const mb_ckpt_key key[OPTION_KEYS] = {
        MB_CKPT_INT("layers", o->layers), MB_CKPT_INT("accum", o->accum), MB_CKPT_INT("carry", o->carry),
        MB_CKPT_INT("checkpoint-k", o->checkpoint_k), MB_CKPT_INT("batch", o->batch), MB_CKPT_INT("hidden", o->hidden),
        MB_CKPT_INT("head", o->head), MB_CKPT_INT("max-batches", o->max_batches), MB_CKPT_F32("lr", o->lr),
        MB_CKPT_F32("clip", o->clip), MB_CKPT_F32("weight-decay", o->weight_decay),
        MB_CKPT_F32("chunk-fraction", o->chunk_fraction), MB_CKPT_INT("warmup", o->warmup),
        MB_CKPT_INT("schedule", o->schedule), MB_CKPT_INT("loss", o->loss), MB_CKPT_INT("precision", o->precision),
        MB_CKPT_UINT("seed", o->seed), MB_CKPT_INT("world", o->world), MB_CKPT_INT("no-ftz", o->no_ftz),
        {"ema", MB_CKPT_KIND_F32, 0, 0, (double)o->ema, "0"}, {"swa-start", MB_CKPT_KIND_INT, o->swa_start, 0, 0, "0"},
        {"keep-best", MB_CKPT_KIND_INT, o->keep_best, 0, 0, "0"}, {"patience", MB_CKPT_KIND_INT, o->patience, 0, 0, "0"},
        {"dropout", MB_CKPT_KIND_F32, 0, 0, (double)o->dropout, "0"}};
    memcpy(out, key, sizeof key);
}

/* Checkpoints of the older format held these options as this struct's raw bytes, as gcc and
 * clang lay it out on x86-64 and aarch64 (176 bytes; the paths and run-only fields zero):
 * where each lay, so that such a file still resumes (mb_ckpt_check_key_bytes). Any other
 * size or a stray byte is refused with what to do. Frozen: never edit for a new option. */
static const mb_ckpt_field options_v1[OPTION_KEYS_V1] = {
    {"layers", MB_CKPT_KIND_INT, 60, 4},        {"accum", MB_CKPT_KIND_INT, 64, 4},
    {"carry", MB_CKPT_KIND_INT, 72, 4},         {"checkpoint-k", MB_CKPT_KIND_INT, 80, 4},
    {"batch", MB_CKPT_KIND_INT, 96, 8},         {"hidden", MB_CKPT_KIND_INT, 104, 8},
    {"head", MB_CKPT_KIND_INT, 112, 8},         {"max-batches", MB_CKPT_KIND_INT, 120, 8},
    {"lr", MB_CKPT_KIND_F32, 128, 4},           {"clip", MB_CKPT_KIND_F32, 132, 4},
    {"weight-decay", MB_CKPT_KIND_F32, 136, 4}, {"chunk-fraction", MB_CKPT_KIND_F32, 140, 4},
    {"warmup", MB_CKPT_KIND_INT, 144, 4},       {"schedule", MB_CKPT_KIND_INT, 148, 4},
    {"loss", MB_CKPT_KIND_INT, 152, 4},         {"precision", MB_CKPT_KIND_INT, 156, 4},
    {"seed", MB_CKPT_KIND_UINT, 160, 8},        {"world", MB_CKPT_KIND_INT, 168, 4},
    {"no-ftz", MB_CKPT_KIND_INT, 172, 4}}; /* its bytes 172..175: padding before --no-ftz, zero */

static const char usage[] =
    "usage: " MBA_TOOL("train_multitf") " [--train data/train.h5] [--val data/val.h5] [flags]\n"
    "       (build/train_multitf_cuda: the GPU; build/train_multitf_mpi under mpirun: data parallel)\n"
    "Trains five LSTM encoders (one per timeframe segment) + fusion + head on the files that\n"
    "build/prepare writes; a line per epoch and a last `summary:` line (docs/EXAMPLE.md).\n"
    "model:      --hidden H [32]  --head N [64]  --layers L [1]  --loss mse|huber [mse]\n"
    "            --carry (carry the encoders' state from batch to batch)  --dropout P [0] (nn.LSTM's, and before the head)\n"
    "training:   --epochs E [3]  --batch B [128]  --lr X [2e-3]  --schedule constant|cosine|onecycle [cosine]\n"
    "            --warmup STEPS [20]  --accum N [1]  --clip X [1.0]  --weight-decay X [0.01]\n"
    "            --precision f32|bf16|f16 [f32; bf16 on the GPU]  --seed S [1]  --max-batches N [0: all]\n"
    "machine:    --threads N [0: the cores]  --chunk-fraction X [0.75]  --checkpoint-k K [0: auto]\n"
    "            --no-ftz (the CPU keeps denormals; default: flushed to zero, FTZ+DAZ; no effect on the GPU)\n"
    "            --cpu-kernel auto|avx512|avx2|c [auto: the widest the CPU runs; the same results; no effect on the GPU]\n"
    "selection:  --ema DECAY (an EMA of the weights, each step)  --swa-start EPOCH (SWA: their mean from that\n"
    "            epoch's end on)  --keep-best (export the best epoch)  --patience N (stop after N epochs without a better one)\n"
    "walk-forward: --walk-forward K (K folds of --train in time order, each trained on its past only;\n"
    "            --val unused; --export/--export-onnx write one file a fold, NAME.foldK.EXT)  --wf-window W [0: expanding]\n"
    "output:     --metrics FILE.csv  --plot FILE.svg [the metrics name with .svg]  --quiet\n"
    "checkpoint: --ckpt FILE  --ckpt-every STEPS [0: each epoch only]  --resume\n"
    "weights:    --export FILE.safetensors (at the end)  --init FILE.safetensors (start from it; docs/TRADING.md)\n"
    "            --export-onnx FILE.onnx (at the end: the model for MetaTrader 5 and onnxruntime)\n"
    "            -h, --help: this text\n"
    "The data files are checked in a child process first (docs/RELIABILITY.md); the output\n"
    "files' places are checked before anything else. Exit 2 with one line `error: ...` on\n"
    "stderr on bad flags, files or data.\n";

/* path, or for fold k >= 1 path with ".fold<k>" before its extension (m.safetensors:
 * m.fold2.safetensors), into buf. 1, or the error printed and 0. */
static int fold_path(const char *path, int k, char *buf, size_t cap) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - path) : (int)strlen(path);
    int n = k ? snprintf(buf, cap, "%.*s.fold%d%s", stem, path, k, path + stem) : snprintf(buf, cap, "%s", path);
    return n >= 0 && (size_t)n < cap ? 1 : mba_bad("--export", path, "path too long");
}

/* The output-path rule (mb_args.h): every file the run writes can be written and is
 * neither an input nor another output. Checked before the data, the device and training;
 * with --walk-forward, each fold's files. 1, or the error printed and 0. */
static int outputs_writable(const options *o, const char *onnx) {
    char plot[1024];
    if (o->metrics && mbt_plot_path(o->metrics, o->plot, plot, sizeof plot) != MB_OK)
        return mba_error("%s", mb_last_error()), 0;
    mba_file in[] = {{"--train", o->train, 0, 0}, {"--val", o->walk_forward ? NULL : o->val, 0, 0},
                     {"--init", o->resume ? NULL : o->init, 0, 0}, {"--ckpt", o->resume ? o->ckpt : NULL, 0, 0}};
    for (int k = o->walk_forward ? 1 : 0; k <= o->walk_forward; k++) {
        char ex[1024], ox[1024];
        if (o->export_path && !fold_path(o->export_path, k, ex, sizeof ex)) return 0;
        if (onnx && !fold_path(onnx, k, ox, sizeof ox)) return 0;
        mba_file out[] = {{"--metrics", o->metrics, 0, 0}, {"--plot", o->metrics ? plot : NULL, 0, 0},
                          {"--ckpt", o->ckpt, 0, 1}, {"--export", o->export_path ? ex : NULL, 0, 1},
                          {"--export-onnx", onnx ? ox : NULL, 0, 1}};
        if (!mba_outputs_ok(in, 4, out, 5)) return 0;
    }
    return 1;
}

/* The defaults, then the flags; 1 when they are good, else `error: ...` printed and 0.
 * *onnx: --export-onnx, kept out of the options (a checkpoint holds those that shape the run). */
static int parse_options(int argc, char **argv, options *o, const char **onnx) {
    static const char *const schedules[] = {"constant", "cosine", "onecycle", NULL}, *const losses[] = {"mse", "huber", NULL},
                             *const precisions[] = {"f32", "bf16", "f16", NULL},
                             *const kernels[] = {"auto", "avx512", "avx2", "c", NULL}; /* mb_cpu_kernel's order */
    memset(o, 0, sizeof *o);
    *onnx = NULL;
    o->train = "data/train.h5"; o->val = "data/val.h5";
    o->epochs = 3; o->layers = 1; o->accum = 1; o->batch = 128; o->hidden = 32; o->head = 64;
    o->lr = 2e-3f; o->clip = 1.0f; o->weight_decay = 0.01f; o->chunk_fraction = 0.75f;
    o->warmup = 20; o->schedule = MB_LR_WARMUP_COSINE; o->loss = MB_LOSS_MSE; o->seed = 1;
    o->precision = BACKEND == MB_CUDA ? MB_BF16 : MB_F32; /* the GPU: bf16 tensor cores, no scaler needed */
    const mba_flag flags[] = {
        {"--train", MBA_STR, &o->train, 0, 0, NULL}, {"--val", MBA_STR, &o->val, 0, 0, NULL},
        {"--metrics", MBA_STR, &o->metrics, 0, 0, NULL}, {"--plot", MBA_STR, &o->plot, 0, 0, NULL},
        {"--ckpt", MBA_STR, &o->ckpt, 0, 0, NULL}, {"--ckpt-every", MBA_I64, &o->ckpt_every, 0, 1e12, NULL},
        {"--export", MBA_STR, &o->export_path, 0, 0, NULL}, {"--init", MBA_STR, &o->init, 0, 0, NULL},
        {"--export-onnx", MBA_STR, onnx, 0, 0, NULL},
        {"--carry", MBA_SET, &o->carry, 0, 0, NULL}, {"--quiet", MBA_SET, &o->quiet, 0, 0, NULL},
        {"--resume", MBA_SET, &o->resume, 0, 0, NULL}, {"--no-ftz", MBA_SET, &o->no_ftz, 0, 0, NULL},
        {"--epochs", MBA_INT, &o->epochs, 1, 1e6, NULL},
        {"--batch", MBA_I64, &o->batch, 1, 1e6, NULL}, {"--hidden", MBA_I64, &o->hidden, 1, 1e5, NULL},
        {"--head", MBA_I64, &o->head, 1, 1e5, NULL}, {"--layers", MBA_INT, &o->layers, 1, 16, NULL},
        {"--accum", MBA_INT, &o->accum, 1, 1e4, NULL}, {"--threads", MBA_INT, &o->threads, 0, 1024, NULL},
        {"--checkpoint-k", MBA_INT, &o->checkpoint_k, -1, 1e6, NULL},
        {"--max-batches", MBA_I64, &o->max_batches, 0, 1e12, NULL}, {"--warmup", MBA_INT, &o->warmup, 0, 1e9, NULL},
        {"--seed", MBA_U64, &o->seed, 0, 4e9, NULL}, {"--lr", MBA_F32, &o->lr, 1e-9, 10, NULL},
        {"--clip", MBA_F32, &o->clip, 0, 1e9, NULL}, {"--weight-decay", MBA_F32, &o->weight_decay, 0, 1, NULL},
        {"--chunk-fraction", MBA_F32, &o->chunk_fraction, 0.01, 0.95, NULL},
        {"--schedule", MBA_CHOICE, &o->schedule, 0, 0, schedules}, {"--loss", MBA_CHOICE, &o->loss, 0, 0, losses},
        {"--precision", MBA_CHOICE, &o->precision, 0, 0, precisions},
        {"--cpu-kernel", MBA_CHOICE, &o->cpu_kernel, 0, 0, kernels},
        {"--ema", MBA_F32, &o->ema, 1e-6, 0.999999, NULL}, {"--swa-start", MBA_INT, &o->swa_start, 1, 1e6, NULL},
        {"--keep-best", MBA_SET, &o->keep_best, 0, 0, NULL}, {"--patience", MBA_INT, &o->patience, 1, 1e6, NULL},
        {"--walk-forward", MBA_INT, &o->walk_forward, 2, MBW_MAX_FOLDS, NULL},
        {"--dropout", MBA_F32, &o->dropout, 0, 0.999, NULL},
        {"--wf-window", MBA_I64, &o->wf_window, 1, 1e12, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 0;
    if ((o->resume || o->ckpt_every) && !o->ckpt) return mba_bad("--resume/--ckpt-every", "", "need --ckpt FILE");
    if (o->plot && !o->metrics) return mba_bad("--plot", o->plot, "needs --metrics FILE (the picture is drawn from it)");
    if (o->ema > 0 && o->swa_start) return mba_bad("--ema/--swa-start", "", "choose one average, EMA or SWA");
    if (o->wf_window && !o->walk_forward) return mba_bad("--wf-window", "", "needs --walk-forward K");
    if (o->walk_forward && (o->ckpt || o->metrics))
        return mba_bad("--walk-forward", "", "takes no --ckpt or --metrics (each fold is a run of its own)");
#ifdef MEGABATCH_MPI
    if (o->walk_forward) return mba_bad("--walk-forward", "", "runs in build/train_multitf (one process), not under MPI");
#endif
    if (o->swa_start > o->epochs) {
        char v[32];
        snprintf(v, sizeof v, "%d", o->swa_start);
        return mba_bad("--swa-start", v, "is past the last epoch (--epochs)");
    }
    return outputs_writable(o, *onnx);
}

// ---- model ----
// The network is multitf.h's mtf_model (built with its backward's buffers); here, what
// training adds: the loss, the f16 loss scaler, zeros (the baseline's prediction), the meter
// the losses sum into on the device, and what the graph step needs (section "the training step").

enum { MAX_SEG = 5, METER_DEPTH = 64, DP_ROWS = 256 };

typedef struct model {
    mtf_model net;
    mb_loss_config loss_cfg;
    mb_scaler *scaler;   /* f16: the dynamic loss scaler, else NULL */
    float *zeros, *loss; /* (B, K) zeros; one device float */
    mb_dist *dist;       /* data parallel: a world of one without MPI */
    mbs_select *sel;     /* the weight average's update follows each optimizer step (mb_select.h) */
    mb_meter *meter;     /* device sums: 0 training loss, 1 validation loss, 2 baseline */
    mbt_step_row rows[METER_DEPTH]; /* the metrics row of meter read id, at id % METER_DEPTH */
    double last_loss;    /* the loss of the last step whose read landed */
    /* several ranks: the dp_n steps landed since the last fold, their rows and this rank's
     * {loss sum, samples} of each, summed over the ranks at the fold (with the fold's sum) */
    int dp_n;
    mbt_step_row dp_rows[DP_ROWS];
    double dp_sums[2 * DP_ROWS + 1];
    int graphs, warm;    /* the step runs as CUDA graphs; a step of this process ran (the warm-up) */
    mb_graph *graph[8];  /* by (window start, optimizer step, short batch) */
    float *xb, *yb;      /* the batch copied into fixed device buffers, which the graphs read */
    float *hpred, *htarg; /* a validation batch's predictions and targets on the host, for */
    mbm_acc macc;         /* the trading metrics of the validated weights (mb_metrics.h): */
    mbm_horizon *per;     /* per horizon, */
    mbm_mean mean;        /* and their means over the horizons */
} model;

/* The model of spec (the training file's shape and normalisation: trainer_open). */
static mb_result model_create(model *m, mb_device *dev, const mtf_spec *spec, const mb_dataset_meta *meta,
                              const options *o) {
    memset(m, 0, sizeof *m);
    if (meta->segments > MAX_SEG)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: %d segments, this example handles at most %d", meta->source,
                       meta->segments, MAX_SEG);
    mtf_config c = {o->batch, o->carry, 1, o->checkpoint_k, o->precision, o->dropout,
                    o->seed ^ 0x9E3779B97F4A7C15ull}; /* the masks' seed: apart from the weights' */
    size_t zeros = (size_t)(o->batch * meta->k) * sizeof(float);
    m->loss_cfg.kind = o->loss;
    MB_TRY(mtf_model_build(&m->net, dev, spec, &c));
    MB_TRY(mb_params_init(m->net.params, o->seed));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, zeros, (void **)&m->zeros));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, sizeof(float), (void **)&m->loss));
    if (o->precision == MB_F16) MB_TRY(mb_scaler_create(&m->scaler, dev, NULL)); /* GradScaler defaults */
    MB_TRY(mb_meter_create(&m->meter, dev, 3, METER_DEPTH));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, (size_t)(o->batch * meta->t * meta->f) * sizeof(float), (void **)&m->xb));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, (size_t)(o->batch * meta->k) * sizeof(float), (void **)&m->yb));
    MB_TRY(mb_alloc(dev, MB_MEM_HOST, zeros, (void **)&m->hpred));
    MB_TRY(mb_alloc(dev, MB_MEM_HOST, zeros, (void **)&m->htarg));
    m->per = (mbm_horizon *)calloc((size_t)meta->k, sizeof *m->per);
    if (!m->per) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the metrics");
    MB_TRY(mbm_init(&m->macc, meta->k, 0));
    return mb_zero(dev, MB_STREAM_COMPUTE, m->zeros, zeros);
}

static void model_destroy(model *m) {
    for (int i = 0; i < 8; i++) mb_graph_destroy(m->graph[i]);
    mb_meter_destroy(m->meter);
    mb_free(m->net.dev, m->xb);
    mb_free(m->net.dev, m->yb);
    mb_free(m->net.dev, m->hpred);
    mb_free(m->net.dev, m->htarg);
    mbm_free(&m->macc);
    free(m->per);
    mb_scaler_destroy(m->scaler);
    mb_free(m->net.dev, m->zeros);
    mb_free(m->net.dev, m->loss);
    mtf_model_destroy(&m->net);
}

/* The loss of B predictions pred (B, K) against y (B, K): into m->loss and added into meter
 * slot `slot` and, when grad_scale > 0, dLoss/dpred * grad_scale into the model's dpred (f16:
 * times the scale), where mtf_model_backward starts. */
static mb_result model_loss(model *m, const float *pred, const float *y, int64_t B, float grad_scale, int slot) {
    const float *loss_scale = m->scaler ? mb_scaler_scale_ptr(m->scaler) : NULL;
    mb_loss_config lc = m->loss_cfg;
    lc.acc = mb_meter_slot(m->meter, slot);
    return mb_loss(m->net.dev, MB_STREAM_COMPUTE, &lc, pred, y, B, m->net.spec.K, grad_scale, loss_scale, m->loss,
                   grad_scale > 0 ? m->net.dpred : NULL);
}

/* A validation batch's predictions and targets to the host, into the metrics (a host sync a
 * batch: validation is outside the training step). */
static mb_result metrics_add(model *m, const float *pred, const float *y, int64_t B) {
    size_t bytes = (size_t)(B * m->net.spec.K) * sizeof(float);
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->hpred, pred, bytes));
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->htarg, y, bytes));
    MB_TRY(mb_sync(m->net.dev, MB_STREAM_COMPUTE));
    return mbm_add(&m->macc, m->hpred, m->htarg, B);
}

/* Mean validation loss of the model and of the naive baseline (predict 0 return), summed on
 * the device (meter slots 1, 2) and read once, at the end; with metrics, the trading metrics
 * of the predictions into m->per and m->mean. */
static mb_result evaluate_pass(model *m, mb_loader *val, double *loss, double *baseline, int metrics) {
    mb_batch b;
    const float *pred;
    mb_loss_config base = m->loss_cfg;
    base.acc = mb_meter_slot(m->meter, 2);
    for (int s = 0; s < m->net.spec.nseg; s++) mb_lstm_reset_state(m->net.enc[s]);
    for (;;) {
        MB_TRY(mb_loader_next(val, &b));
        if (b.count == 0) break;
        MB_TRY(mtf_model_forward(&m->net, (const float *)b.features, b.count, &pred));
        MB_TRY(model_loss(m, pred, (const float *)b.targets, b.count, 0.0f, 1));
        MB_TRY(mb_loss(m->net.dev, MB_STREAM_COMPUTE, &base, m->zeros, (const float *)b.targets, b.count,
                       m->net.spec.K, 0.0f, NULL, NULL, NULL));
        if (metrics) MB_TRY(metrics_add(m, pred, (const float *)b.targets, b.count));
    }
    if (metrics) MB_TRY(mbm_compute(&m->macc, m->per, &m->mean));
    mbm_reset(&m->macc);
    for (int s = 0; s < m->net.spec.nseg; s++) mb_lstm_reset_state(m->net.enc[s]);
    double v[2][2];
    MB_TRY(mb_meter_fold(m->meter, MB_STREAM_COMPUTE, NULL, NULL)); /* no step read in flight: the epoch folded */
    for (int i = 0; i < 2; i++) MB_TRY(mb_meter_value(m->meter, 1 + i, &v[i][0], &v[i][1]));
    *loss = v[0][1] > 0 ? v[0][0] / v[0][1] : 0;
    *baseline = v[1][1] > 0 ? v[1][0] / v[1][1] : 0;
    return MB_OK;
}

/* The validation pass in evaluation mode (--dropout off), training mode after. */
static mb_result evaluate(model *m, mb_loader *val, double *loss, double *baseline, int metrics) {
    mtf_model_set_training(&m->net, 0);
    mb_result r = evaluate_pass(m, val, loss, baseline, metrics);
    mtf_model_set_training(&m->net, 1);
    return r;
}

// ---- data parallel ----
// Under mpirun (build/train_multitf_mpi) each rank's training loader reads its shard of
// every global batch (mb_loader_config.shard_*); rank 0's weights are broadcast at the
// start; per batch one all-reduce averages the gradients over all ranks' samples before
// the optimizer step, so clipping and the f16 skip see the same bits on every rank (with
// NCCL on the device: no host sync). Each rank's batch losses go into its meter; at each
// fold (epoch end, checkpoint, every DP_ROWS steps) the ranks sum them (meter_fold), and
// rank 0 writes the steps' rows. After each epoch the ranks check they are bitwise in sync.
// Rank 0 alone prints, writes metrics, the picture and checkpoints (which every rank
// reads on --resume). Validation runs whole on every rank. Refused with several ranks:
// --accum > 1 and --carry. docs/DIST.md.

static mb_result data_parallel_in_sync(model *m) {
    int same = 1;
    if (mb_dist_size(m->dist) > 1) MB_TRY(mb_dist_check_sync(m->dist, m->net.params, &same));
    return same ? MB_OK : MB_FAIL(NULL, MB_ERR_CORRUPT, "the ranks' weights differ (rank %d)", mb_dist_rank(m->dist));
}

// ---- the run ----
// Everything a run holds, opened by trainer_open in one plain sequence, closed by
// trainer_close (which takes a half-opened trainer too).

typedef struct trainer {
    options o;             /* o.world: the ranks */
    mb_ckpt_key key[OPTION_KEYS]; /* the options that shape the run: a checkpoint holds them */
    int lead;              /* rank 0: prints, writes metrics, the picture and checkpoints */
    mb_dist *dist;
    mb_device *dev;
    mb_dataset *dtr, *dva;
    mtf_spec spec;         /* the model's, from the training file (with prepare's normalisation) */
    mb_loader *tr, *va;
    model m;
    mb_adamw *opt;
    mbs_select sel;        /* --ema/--swa-start, --keep-best, --patience (mb_select.h) */
    mb_lr_schedule sched;
    mbt_run rs;
    mbt_ckpt ckpt;
    FILE *csv;             /* --metrics */
    char plot[1024];       /* the picture's path, "" for none */
    const char *onnx;      /* --export-onnx */
    double avg_val_loss;   /* the last epoch's averaged weights' validation loss (0: no average) */
    mbw_fold_data *fold;   /* --walk-forward: this fold's data (in memory, owned by the caller), else NULL */
    int fold_k;            /* its number, 1-based (the export files' suffix) */
} trainer;

static mb_result open_loader(trainer *t, mb_dataset *ds, mb_dist *shard, mb_loader **ld) {
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = t->o.batch; lc.shuffle = 0; lc.seed = t->o.seed; lc.chunk_fraction = t->o.chunk_fraction;
    lc.shard_rank = mb_dist_rank(shard); lc.shard_count = mb_dist_size(shard); /* NULL: unsharded */
    return mb_loader_open(ld, t->dev, ds, &lc);
}

/* Batches per epoch: the loader's plan, capped by --max-batches. */
static int64_t batches_per_epoch(const trainer *t) {
    int64_t nb = mb_loader_get_plan(t->tr)->batches;
    return t->o.max_batches && t->o.max_batches < nb ? t->o.max_batches : nb;
}

/* The learning-rate schedule over the optimizer steps of the whole run. */
static void schedule_init(trainer *t) {
    const options *o = &t->o;
    mb_lr_schedule *s = &t->sched;
    s->kind = o->schedule; s->lr = o->lr;
    s->total_steps = (int64_t)o->epochs * ((batches_per_epoch(t) + o->accum - 1) / o->accum);
    if (s->total_steps < 2) s->total_steps = 2;
    s->warmup_steps = o->warmup < s->total_steps ? o->warmup : s->total_steps / 2;
}

/* A checkpoint's own state of this program: the carried (h, c) with --carry, the dropout
 * masks' step with --dropout, and the average, the best weights and their epoch (mb_select.h). */
static mb_result save_state(mb_ckpt_writer *w, void *user) {
    trainer *t = (trainer *)user;
    if (t->o.carry) MB_TRY(mtf_model_save_carry(w, &t->m.net));
    MB_TRY(mtf_model_save_dropout(w, &t->m.net)); /* --dropout: the masks' step counter */
    return mbs_save(w, &t->sel);
}
static mb_result load_state(mb_ckpt_reader *rd, void *user) {
    trainer *t = (trainer *)user;
    if (t->o.carry) MB_TRY(mtf_model_load_carry(rd, &t->m.net));
    MB_TRY(mtf_model_load_dropout(rd, &t->m.net));
    return mbs_load(rd, &t->sel);
}

/* --ckpt: what a checkpoint holds (mb_train.h) and the options a resume must match. */
static void checkpoint_init(trainer *t) {
    mbt_ckpt *c = &t->ckpt;
    options_key(&t->o, t->key);
    c->dev = t->dev; c->path = t->o.ckpt; c->params = t->m.net.params; c->opt = t->opt; c->scaler = t->m.scaler;
    c->key = t->key; c->key_n = OPTION_KEYS;
    c->legacy = options_v1; c->legacy_n = OPTION_KEYS_V1; c->legacy_bytes = 176;
    c->save_state = save_state; c->load_state = load_state; c->ctx = t;
}

static mb_result trainer_open(trainer *t, const options *opts) {
    const options *o = &t->o;
    t->o = *opts;
    if (t->fold) { /* --walk-forward: the fold's data, its own normalisation (mb_walk.h) */
        t->dtr = t->fold->train;
        t->dva = t->fold->val;
    } else {
        MB_TRY(mbt_inputs_check(o->resume ? o->ckpt : NULL, o->resume ? NULL : o->init)); /* mb_train.h */
        MB_TRY(mba_open_data(o->train, 1, &t->dtr)); /* probed in a child: before any thread starts */
        MB_TRY(mba_open_data(o->val, 1, &t->dva));
    }
    const mb_dataset_meta *mt = mb_dataset_info(t->dtr), *mv = mb_dataset_info(t->dva);
    mbt_clamp_batch(&t->o.batch, mt->n, o->quiet); /* before anything is allocated for it */
    if (mt->t != mv->t || mt->f != mv->f || mt->k != mv->k)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s and %s differ in shape (T, F, K)", o->train, o->val);
    t->spec = mtf_spec_of_data(mt, o->hidden, o->head, o->layers, o->carry);
    if (t->fold) mbw_fold_spec(t->fold, &t->spec);
    else MB_TRY(mtf_spec_read_norm(&t->spec, t->dtr)); /* for --export; before the loaders read the file */
    MB_TRY(mb_dist_open(&t->dist, NULL));
    t->o.world = mb_dist_size(t->dist);
    t->lead = mb_dist_rank(t->dist) == 0;
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = BACKEND; dc.streams = 2 + MAX_SEG; dc.threads = o->threads; /* encoder s on stream 2 + s */
    dc.keep_denormals = o->no_ftz;
    dc.cpu_kernel = o->cpu_kernel;
    dc.log.fn = mbt_log_warnings; dc.log.max = MB_LOG_WARN;
    dc.index = mb_dist_local_rank(t->dist); /* CUDA: one GPU per rank of this machine */
    MB_TRY(mb_device_open(&t->dev, &dc));
    if (o->world > 1 && (o->accum > 1 || o->carry))
        return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "--accum > 1 and --carry are not supported with %d ranks", o->world);
    MB_TRY(open_loader(t, t->dtr, t->dist, &t->tr));
    MB_TRY(open_loader(t, t->dva, NULL, &t->va));
    MB_TRY(mbt_memory_hint(model_create(&t->m, t->dev, &t->spec, mt, o), o->batch)); /* out of memory: the flag */
    t->m.dist = t->dist;
    if (o->init && !o->resume) MB_TRY(mtf_model_init_file(&t->m.net, o->init));
    MB_TRY(mb_dist_broadcast_params(t->dist, t->m.net.params));
    mb_adamw_config ac = mb_adamw_config_default();
    ac.weight_decay = o->weight_decay; ac.max_grad_norm = o->clip;
    MB_TRY(mb_adamw_create(&t->opt, t->m.net.params, &ac));
    mbs_config sc = {o->ema, o->swa_start, o->keep_best, o->patience};
    MB_TRY(mbs_open(&t->sel, t->m.net.params, &sc));
    t->m.sel = &t->sel;
    t->rs.epoch = 1;
    MB_TRY(mb_accum_init(&t->rs.acc, o->accum));
    checkpoint_init(t);
    if (o->resume) {
        MB_TRY(mbt_ckpt_load(&t->ckpt, &t->rs));
        MB_TRY(mb_adamw_set_schedule_step(t->opt, t->rs.step)); /* the device's schedule counter */
        MB_TRY(mb_loader_set_position(t->tr, t->rs.pos));
    }
    if (o->metrics && t->lead) MB_TRY(mbt_plot_path(o->metrics, o->plot, t->plot, sizeof t->plot)); /* checked writable */
    if (o->metrics && t->lead) MB_TRY(mbt_metrics_open(&t->csv, o->metrics, o->resume, &t->rs, t->spec.K));
    /* every check done (the resume's options too): the device and data lines */
    if (!o->quiet && t->lead && o->world > 1) printf("data parallel: %d ranks\n", o->world);
    if (!o->quiet && t->lead)
        printf("device: %s\ndata: %s N=%lld T=%lld F=%lld K=%lld, %d segments; params: %zu floats\n",
               mb_device_name(t->dev), t->fold ? mt->source : o->train, (long long)mt->n, (long long)mt->t,
               (long long)mt->f, (long long)mt->k, t->m.net.spec.nseg, mb_params_total(t->m.net.params));
    if (o->resume && !o->quiet && t->lead)
        printf("resumed from %s: epoch %lld, step %lld\n", o->ckpt, (long long)t->rs.epoch, (long long)t->rs.step);
    schedule_init(t);
    return MB_OK;
}

// ---- the training loop ----

/* One optimizer step. f16: unscale the gradients, AdamW (skipped on the device when any
 * gradient is inf/NaN), then the scaler backs off or grows; --ema: the average's update. No
 * host sync, and nothing that changes from step to step: the schedule's learning rate is
 * computed on the device. */
static mb_result optimizer_step(model *m, mb_adamw *opt, const mb_lr_schedule *sched) {
    if (m->scaler) MB_TRY(mb_scaler_unscale(m->scaler, mb_params_grad(m->net.params), mb_params_total(m->net.params)));
    MB_TRY(mb_adamw_step_scheduled(opt, sched, m->scaler)); /* scaler NULL: f32 and bf16, no loss scaling */
    if (m->scaler) MB_TRY(mb_scaler_update(m->scaler));
    return mbs_after_step(m->sel, opt); /* --ema: the average follows the step (not a skipped one) */
}

// ---- the training step ----
// A step queues its work and never waits for the device (issue 15): the loss adds into the
// meter on the device, the learning rate comes from the schedule on the device, and the loop
// queues a read of the meter after each step and takes the reads that landed (mb_meter_step:
// pinned memory + an event, a poll, no wait), so each step's metrics row is exact, written a
// little late (section "the losses, read late"). So
// nothing of a step changes from batch to batch but the batch itself: on the GPU the batch is
// copied into fixed buffers and the whole step (zero grads, forward, loss, backward,
// unscale, clip, AdamW, scaler) is captured once as a CUDA graph and replayed, one graph
// launch per batch. Variants (window start, optimizer step, short last batch) each get their
// graph. The first step of a run runs plain (the warm-up the capture needs). Plain launches
// instead, said once: the CPU (mb_graph_run runs the calls directly), --carry (the encoders'
// state path changes between batches), several ranks (each all-reduce first sums the ranks'
// sample counts on the host).

typedef struct step_args {
    model *m;
    mb_adamw *opt;
    const mb_lr_schedule *sched;
    const float *x, *y;
    int64_t B;
    float grad_scale;
    int start, stepped; /* zero the gradients first, end with the optimizer */
} step_args;

/* The step itself, top to bottom: forward and backward are multitf.h's, the loss and the
 * optimizer step above. */
static mb_result train_step(void *user) {
    step_args *a = (step_args *)user;
    model *m = a->m;
    const float *pred;
    if (a->start) MB_TRY(mb_params_zero_grad(m->net.params));
    MB_TRY(mtf_model_forward(&m->net, a->x, a->B, &pred));
    MB_TRY(model_loss(m, pred, a->y, a->B, a->grad_scale, 0)); /* meter slot 0: the training loss */
    MB_TRY(mtf_model_backward(&m->net, a->B));
    return a->stepped ? optimizer_step(m, a->opt, a->sched) : MB_OK;
}

static void graphs_choose(model *m, const options *o) {
    const char *off = !mb_graph_supported(m->net.dev) ? NULL
                      : o->carry ? "--carry (the encoders' state changes the step)"
                      : mb_dist_size(m->dist) > 1 ? "several ranks (each all-reduce first sums the sample counts on the host)"
                                                  : NULL;
    m->graphs = mb_graph_supported(m->net.dev) && !off;
    if (off && !o->quiet && mb_dist_rank(m->dist) == 0) fprintf(stderr, "note: CUDA graphs off: %s; plain launches\n", off);
}

/* One batch's step: through its graph when graphs are on and the warm-up step ran. */
static mb_result run_step(model *m, step_args *a, const mb_batch *b, int warm) {
    if (!m->graphs || !warm) return train_step(a);
    const mtf_spec *sp = &m->net.spec;
    size_t xbytes = (size_t)(b->count * sp->T * sp->F) * sizeof(float), ybytes = (size_t)(b->count * sp->K) * sizeof(float);
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->xb, b->features, xbytes)); /* device to device */
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->yb, b->targets, ybytes));
    a->x = m->xb;
    a->y = m->yb;
    int v = a->start * 4 + a->stepped * 2 + (b->count != m->net.maxB);
    return mb_graph_run(&m->graph[v], m->net.dev, MB_STREAM_COMPUTE, train_step, a);
}

// ---- the losses, read late ----
// Meter slot 0 sums the training loss on the device since the last fold (epoch start or
// checkpoint). After each step mb_meter_step queues a read of it (no reset) and lands those
// that have landed, calling meter_landed for each: its step's loss is the growth between its
// read and the one before (mb_meter_delta), and the epoch's sums are the same whenever reads
// land (a resumed run's epoch sum is the uninterrupted run's, bitwise).

/* A step's loss landed (read id): shown, and written to the metrics with its row. Several
 * ranks: this rank's share kept, summed over the ranks at the fold. */
static mb_result meter_landed(void *user, const mb_meter *meter, int64_t id) {
    trainer *t = (trainer *)user;
    model *m = &t->m;
    double sum = 0, w = 0;
    MB_TRY(mb_meter_delta(meter, 0, &sum, &w));
    if (w > 0) m->last_loss = sum / w;
    if (mb_dist_size(m->dist) == 1) {
        mbt_metrics_step(t->csv, &m->rows[id % METER_DEPTH], (float)m->last_loss, m->net.spec.K);
        return MB_OK;
    }
    m->dp_rows[m->dp_n] = m->rows[id % METER_DEPTH];
    m->dp_sums[2 * m->dp_n] = sum;
    m->dp_sums[2 * m->dp_n + 1] = w;
    m->dp_n++;
    return MB_OK;
}

/* Several ranks: the landed steps' losses and the fold's sum, summed over the ranks in rank
 * order (every rank folds at the same step, with the same steps landed); rank 0 writes the rows. */
static mb_result meter_fold_ranks(model *m, FILE *csv, double *sum) {
    int n = m->dp_n;
    m->dp_sums[2 * n] = *sum;
    MB_TRY(mb_dist_sum(m->dist, m->dp_sums, 2 * n + 1));
    for (int i = 0; i < n; i++) {
        m->last_loss = m->dp_sums[2 * i] / m->dp_sums[2 * i + 1];
        mbt_metrics_step(csv, &m->dp_rows[i], (float)m->last_loss, m->net.spec.K);
    }
    *sum = m->dp_sums[2 * n];
    m->dp_n = 0;
    return MB_OK;
}

/* Every step's loss landed (waits), the device's sums folded into the epoch's and restarted
 * (epoch ends, checkpoints, and with several ranks every DP_ROWS steps: on every rank). */
static mb_result meter_fold(trainer *t) {
    double sum = 0, w = 0;
    MB_TRY(mb_meter_fold(t->m.meter, MB_STREAM_COMPUTE, meter_landed, t));
    MB_TRY(mb_meter_value(t->m.meter, 0, &sum, &w));
    if (mb_dist_size(t->dist) > 1) MB_TRY(meter_fold_ranks(&t->m, t->csv, &sum));
    t->rs.epoch_loss_sum += sum; /* (the samples: counted per batch, mbt_run_batch) */
    return MB_OK;
}

/* The rest of epoch rs->epoch over the training loader: accumulation, clipping (inside
 * AdamW), schedule, checkpoints every --ckpt-every steps (at window boundaries). */
static mb_result train_epoch(trainer *t, mbt_progress *pb) {
    const options *o = &t->o;
    model *m = &t->m;
    mbt_run *rs = &t->rs;
    double t0 = mba_now();
    int64_t samples0 = rs->samples, total = batches_per_epoch(t), counted = 0;
    int dp = mb_dist_size(m->dist) > 1;
    mbt_sim_count_from(); /* the simulator's per-step counters (mb_train.h) */
    mb_batch b;
    pb->drawn = 0;
    for (;;) {
        if (o->max_batches && rs->epoch_batches >= o->max_batches) { /* skip to the next epoch */
            mb_loader_pos next = {rs->epoch, 0, 0};
            MB_TRY(mb_loader_set_position(t->tr, next));
            break;
        }
        MB_TRY(mb_loader_next(t->tr, &b));
        if (b.count == 0) break;
        float lr; /* this window's learning rate, for the metrics (the device computes its own) */
        MB_TRY(mb_lr_at(&t->sched, rs->step, &lr));
        int warm = m->warm, start = mb_accum_window_start(&rs->acc);
        int stepped = mb_accum_tick(&rs->acc);
        step_args a = {m, t->opt, &t->sched, (const float *)b.features, (const float *)b.targets, b.count,
                       mb_accum_loss_scale(&rs->acc), start, stepped && !dp};
        MB_TRY(run_step(m, &a, &b, warm));
        int64_t n = b.count; /* samples of the batch, over all ranks */
        if (dp) { /* the gradients averaged over the ranks' samples, then the step */
            MB_TRY(mb_dist_allreduce_grads(m->dist, m->net.params, b.count, NULL, &n));
            if (stepped) MB_TRY(optimizer_step(m, t->opt, &t->sched));
        }
        mbt_run_batch(rs, 0.0, n); /* the loss sums: folded from the meter (meter_fold) */
        if (stepped) rs->step++;
        if (!warm) { /* the warm-up step is not counted: wait for it once, count from here */
            MB_TRY(mb_sync(t->dev, -1));
            mbt_sim_count_from();
            m->warm = 1;
        } else counted++;
        double sps = mbt_rate(rs->samples - samples0, mba_now() - t0);
        int64_t id = 0; /* the step's meter read: its row is written when its loss lands (meter_landed) */
        MB_TRY(mb_meter_step(m->meter, MB_STREAM_COMPUTE, meter_landed, t, &id));
        m->rows[id % METER_DEPTH] = mbt_step_row_of(rs, lr, sps);
        pb->loss = m->last_loss;
        mbt_progress_draw(pb, t->dev, rs, total, sps, 0);
        if (stepped && o->ckpt_every && rs->step % o->ckpt_every == 0) {
            rs->pos = mb_loader_position(t->tr);
            MB_TRY(meter_fold(t)); /* the epoch's loss so far, in the checkpoint */
            if (t->lead) MB_TRY(mbt_ckpt_save(&t->ckpt, rs, t->csv));
        } else if (dp && rs->epoch_batches % DP_ROWS == 0) { /* folds at most DP_ROWS steps apart, */
            MB_TRY(meter_fold(t));                            /* at the same step on every rank */
        }
    }
    mbt_sim_count_to(counted); /* before the fold: its host syncs are the epoch's, not the steps' */
    MB_TRY(meter_fold(t));
    pb->loss = m->last_loss;
    mbt_progress_draw(pb, t->dev, rs, total, mbt_rate(rs->samples - samples0, mba_now() - t0), 1);
    MB_TRY(mb_sync(t->dev, -1));
    rs->seconds += mba_now() - t0;
    rs->train_loss = mbt_run_mean(rs); /* mean over the epoch */
    return MB_OK;
}

/* The epoch's end for model selection (mb_select.h): SWA's update, the averaged weights
 * validated (swapped in and back: no host copy), the selected weights' loss considered for the
 * best epoch and --patience. *avg_text: the epoch line's part ("" without an average). */
static mb_result select_epoch(trainer *t, double *avg_loss, char *avg_text, size_t cap) {
    mbs_select *s = &t->sel;
    int64_t e = t->rs.epoch;
    double base;
    *avg_loss = 0;
    avg_text[0] = 0;
    MB_TRY(mbs_epoch_end(s, e));
    if (mbs_averaging(s, e)) {
        MB_TRY(mbs_swap(s));
        mb_result r = evaluate(&t->m, t->va, avg_loss, &base, 1); /* the metrics: of the selected weights */
        MB_TRY(mbs_swap(s)); /* back, whatever the evaluation gave */
        MB_TRY(r);
        snprintf(avg_text, cap, " avg_val_loss %.5f", *avg_loss);
    }
    size_t n = strlen(avg_text);
    avg_text[n] = ' ';
    mbm_text(avg_text + n + 1, cap - n - 1, &t->m.mean);
    return mbs_consider(s, e, mbs_selected_loss(s, e, t->rs.val_loss, *avg_loss));
}

/* Epochs up to --epochs (or until --patience runs out), each: train, validate, report,
 * checkpoint (at the next epoch's start). */
static mb_result train(trainer *t) {
    const options *o = &t->o;
    mbt_run *rs = &t->rs;
    size_t live0 = mb_device_mem_stats(t->dev).live[MB_MEM_DEVICE];
    mbt_progress pb = {!o->quiet && t->lead && isatty(STDERR_FILENO), 0, 0, 0};
    int64_t samples0 = rs->samples;
    graphs_choose(&t->m, o);
    while (rs->epoch <= o->epochs && !t->sel.stop) {
        char avg_text[160];
        MB_TRY(train_epoch(t, &pb));
        MB_TRY(evaluate(&t->m, t->va, &rs->val_loss, &rs->baseline, !mbs_averaging(&t->sel, rs->epoch)));
        MB_TRY(select_epoch(t, &t->avg_val_loss, avg_text, sizeof avg_text));
        MB_TRY(data_parallel_in_sync(&t->m));
        double sps = mbt_rate(rs->samples - samples0, rs->seconds);
        mb_scaler_state st; /* the scale the progress bar shows next epoch (read here: the epoch's end) */
        if (t->m.scaler && mb_scaler_get(t->m.scaler, &st) == MB_OK) pb.scale = st.scale;
        if (t->lead) mbt_epoch_report(t->dev, t->m.scaler, rs, sps, &live0, avg_text);
        mbt_metrics_epoch(t->csv, rs, sps, mb_device_mem_stats(t->dev).live[MB_MEM_DEVICE], t->spec.K, t->m.per,
                          &t->m.mean);
        mbt_run_new_epoch(rs);
        rs->epoch++;
        rs->pos = mb_loader_position(t->tr);
        if (o->ckpt && t->lead) MB_TRY(mbt_ckpt_save(&t->ckpt, rs, t->csv));
    }
    if (t->sel.stop && t->lead && !o->quiet)
        printf("early stop: %d epochs without a lower validation loss (the best: epoch %lld)\n", o->patience,
               (long long)t->sel.st.best_epoch);
    rs->epoch--; /* the last epoch trained */
    rs->samples_run = rs->samples - samples0;
    return MB_OK;
}

/* After training (r: how it went): the metrics file closed, the picture, the weights file. */
static mb_result trainer_finish(trainer *t, mb_result r) {
    static const char *const sched[] = {"constant", "cosine", "onecycle"};
    const options *o = &t->o;
    char title[256];
    FILE *csv = t->csv;
    t->csv = NULL;
    MB_TRY(mbt_metrics_close(csv, o->metrics, r));
    snprintf(title, sizeof title, "train_multitf: hidden %lld, head %lld, layers %d, batch %lld, accum %d, lr %g %s, "
             "%s loss, %s, seed %llu", (long long)o->hidden, (long long)o->head, o->layers, (long long)o->batch,
             o->accum, (double)o->lr, sched[o->schedule], o->loss == MB_LOSS_HUBER ? "huber" : "mse",
             mb_dtype_name(o->precision), (unsigned long long)o->seed);
    if (t->plot[0]) MB_TRY(mbt_plot_write(t->plot, o->metrics, title)); /* t->plot: rank 0 only */
    if (t->plot[0] && !o->quiet) printf("loss curves: %s\n", t->plot);
    if ((o->export_path || t->onnx) && t->lead) { /* the selected weights made live: training is over (once: */
        if (!t->m.net.spec.weights[0])           /* a walk-forward fold has done it to validate them) */
            MB_TRY(mbs_final_weights(&t->sel, t->rs.epoch, t->m.net.spec.weights, sizeof t->m.net.spec.weights));
        if (!o->quiet) printf("exported weights: %s\n", t->m.net.spec.weights);
    }
    char path[1024];
    if (o->export_path && t->lead && fold_path(o->export_path, t->fold_k, path, sizeof path)) {
        MB_TRY(mtf_model_export(&t->m.net, path));
        if (!o->quiet) printf("weights: %s\n", path);
    }
    if (t->onnx && t->lead && fold_path(t->onnx, t->fold_k, path, sizeof path)) {
        MB_TRY(mtf_onnx_export(&t->m.net, path));
        if (!o->quiet) printf("onnx: %s\n", path);
    }
    return MB_OK;
}

static void trainer_close(trainer *t) { /* not the dist: main ends it */
    if (t->csv) fclose(t->csv);
    mbs_close(&t->sel);
    mb_adamw_destroy(t->opt);
    mb_loader_close(t->tr); mb_loader_close(t->va);
    if (!t->fold) { mb_dataset_close(t->dtr); mb_dataset_close(t->dva); } /* a fold's: its caller's */
    if (t->m.net.params) model_destroy(&t->m);
    mb_device_close(t->dev);
}

// ---- walk-forward ----
// --walk-forward K (mb_walk.h): the plan from the file's `times` (K folds in time order, each
// validating on its block and training on the samples before it, purged of those whose target
// horizon reaches the block), checked before anything is written; then each fold in turn: its
// samples in memory, normalised with its training part's statistics only, a fresh model from
// the same --seed, trained and selected as any run (averages, --keep-best, --patience), its
// exported weights validated once more for the table (the fold's losses and metrics are those
// of the weights it exports), a line; then the table with the folds' mean, spread and range.

static mb_result walk_fold(trainer *t, const options *o, const char *onnx, mbw_fold_data *fd, int k, mbw_scores *sc) {
    memset(t, 0, sizeof *t);
    t->onnx = onnx;
    t->fold = fd;
    t->fold_k = k + 1;
    mb_result r = trainer_open(t, o);
    if (r == MB_OK) r = train(t);
    if (r == MB_OK) r = mbs_final_weights(&t->sel, t->rs.epoch, t->m.net.spec.weights, sizeof t->m.net.spec.weights);
    double base = 0;
    if (r == MB_OK) r = evaluate(&t->m, t->va, &sc->val_loss, &base, 1);
    sc->train_loss = t->rs.train_loss;
    sc->baseline = t->rs.baseline;
    sc->metric[0] = t->m.mean.hit; sc->metric[1] = t->m.mean.ic; sc->metric[2] = t->m.mean.rank_ic;
    r = trainer_finish(t, r);
    trainer_close(t);
    mb_dist_close(t->dist);
    return r;
}

static mb_result walk_forward(const options *o, const char *onnx) {
    static trainer t; /* static: large */
    static const char *const names[3] = {"hit", "ic", "rank_ic"};
    mbw_scores sc[MBW_MAX_FOLDS];
    mbw_plan plan;
    mbw_fold_data fd;
    mb_dataset *file = NULL;
    int64_t *times = NULL;
    memset(sc, 0, sizeof sc);
    memset(&fd, 0, sizeof fd);
    mb_result r = mba_open_data(o->train, 1, &file);
    const mb_dataset_meta *mt = r == MB_OK ? mb_dataset_info(file) : NULL;
    if (r == MB_OK) r = mbw_read_times(o->train, mt->n, &times); /* in a child: before any thread starts */
    mbw_config wc = {o->walk_forward, o->wf_window, o->batch, mt ? mt->k : 0, 0};
    if (r == MB_OK) r = mbw_plan_make(&plan, times, mt->n, &wc);
    if (r == MB_OK && !o->quiet) mbw_print_plan(stdout, &plan);
    for (int k = 0; r == MB_OK && k < plan.folds; k++) {
        r = mbw_fold_load(&fd, file, &plan, k);
        if (r == MB_OK) r = walk_fold(&t, o, onnx, &fd, k, &sc[k]);
        mbw_fold_free(&fd);
        if (r == MB_OK) mbw_print_fold(stdout, &plan, k, &sc[k], names, 3);
    }
    if (r == MB_OK) {
        double v[MBW_MAX_FOLDS];
        for (int k = 0; k < plan.folds; k++) v[k] = sc[k].val_loss;
        mbw_spread vs = mbw_spread_of(v, plan.folds);
        mbw_print_table(stdout, &plan, sc, names, 3);
        printf("summary: folds=%d val_loss_mean=%.5f val_loss_std=%.5f val_loss_min=%.5f val_loss_max=%.5f\n",
               plan.folds, vs.mean, vs.std, vs.min, vs.max);
    }
    free(times);
    mb_dataset_close(file);
    return r;
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    static trainer t; /* static: zeroed, and large */
    options o;
    if (!parse_options(argc, argv, &o, &t.onnx)) return 2;
    if (o.walk_forward) {
        mb_result wr = walk_forward(&o, t.onnx);
        if (wr != MB_OK) mba_fail(mb_last_error()); /* in the user's words (mb_args.h) */
        return wr == MB_OK ? 0 : 2;
    }
    mb_result r = trainer_open(&t, &o);
    if (r == MB_OK) r = train(&t);
    r = trainer_finish(&t, r);
    mbs_state best = t.sel.st; /* for the summary: trainer_close clears it */
    int averaged = t.sel.avg != NULL;
    trainer_close(&t);
    if (r != MB_OK) {
        mba_fail(mb_last_error()); /* in the user's words (mb_args.h) */
        mb_dist_abort(t.dist, 2); /* several ranks: end them all (they would wait for this one) */
        mb_dist_close(t.dist);
        return 2;
    }
    if (t.lead) { /* samples: over all ranks */
        char extra[256];
        int n = snprintf(extra, sizeof extra, " best_epoch=%lld best_val_loss=%.5f", (long long)best.best_epoch,
                         best.best_loss);
        if (averaged) n += snprintf(extra + n, sizeof extra - (size_t)n, " avg_val_loss=%.5f", t.avg_val_loss);
        snprintf(extra + n, sizeof extra - (size_t)n, "%s", mbt_sim_count_text());
        mbt_summary(&t.rs, t.o.world, extra);
    }
    mb_dist_close(t.dist);
    return 0;
}
