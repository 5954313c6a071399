/* mtf_options.h - train_multitf.c's command line, what a reader of its training loop need not
 * see (docs/EXAMPLE.md). In reading order:
 *   options     mtf_options: every flag's value; defaults, the table of flags and the checks
 *               between flags (mtf_options_parse); the usage text (mtf_options_help)
 *   outputs     mtf_fold_path (--walk-forward's NAME.foldK.EXT), mtf_outputs_writable: every
 *               file a run writes is checked before the data, the device and training
 *   checkpoint  mtf_options_key: the options that shape a run, which a checkpoint holds and a
 *               resume must match; mtf_options_v1: where the older format held them (frozen)
 *   configs     the library's configs that the options fill: mtf_options_device, _loader,
 *               _schedule; mtf_options_ckpt (with mb_train.h's mbt_ckpt)
 *   title       mtf_options_title: the run's key options, for the loss-curve picture
 * The hidden size is hidden_size from the flag (--hidden) to the library's
 * mb_lstm_config.hidden_size (through mtf_spec.hidden_size, multitf.h). The schedules' names
 * are the library's (mb_lr_kind_name). Include after megabatch.h, mb_args.h and mb_walk.h
 * (MBW_MAX_FOLDS) and mb_train.h (mbt_ckpt). All names are mtf_* (static: each including file gets its own copy).
 */
#ifndef MTF_OPTIONS_H
#define MTF_OPTIONS_H
#include <stdio.h>
#include <string.h>

#ifndef MTF_BACKEND
#define MTF_BACKEND MB_CPU /* the including program's backend: the default --precision */
#endif

// ---- options ----

typedef struct mtf_options { /* those that shape a run are in each checkpoint: mtf_options_key */
    const char *train, *val, *metrics, *plot, *ckpt;
    const char *export_path, *init;  /* --export, --init FILE.safetensors (docs/TRADING.md) */
    int epochs, layers, accum, threads, carry, quiet, checkpoint_k, resume;
    int64_t ckpt_every;
    int64_t batch, hidden_size, head, max_batches; /* hidden_size: --hidden */
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
    int world;          /* data parallel: ranks (set when the run opens; part of a checkpoint's shape) */
    int no_ftz;         /* --no-ftz: the CPU keeps denormals */
    mb_cpu_kernel cpu_kernel; /* --cpu-kernel: the CPU LSTM's own kernels (the same bits: not in the key) */
} mtf_options;

/* %s: the schedules' names (mtf_options_help) */
static const char mtf_usage[] =
    "usage: " MBA_TOOL("train_multitf") " [--train data/train.h5] [--val data/val.h5] [flags]\n"
    "       (build/train_multitf_cuda: the GPU; build/train_multitf_mpi under mpirun: data parallel)\n"
    "Trains five LSTM encoders (one per timeframe segment) + fusion + head on the files that\n"
    "build/prepare writes; a line per epoch and a last `summary:` line (docs/EXAMPLE.md).\n"
    "model:      --hidden H [32] (the LSTMs' hidden_size)  --head N [64]  --layers L [1]  --loss mse|huber [mse]\n"
    "            --carry (carry the encoders' state from batch to batch)  --dropout P [0] (nn.LSTM's, and before the head)\n"
    "training:   --epochs E [3]  --batch B [128]  --lr X [2e-3]  --schedule %s [cosine]\n"
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

enum { MTF_SCHEDULES_MAX = 8 };

/* The schedules' names from the library (mb_lr_kind_name), NULL-terminated: --schedule's choices. */
static const char *const *mtf_schedule_names(void) {
    static const char *names[MTF_SCHEDULES_MAX + 1];
    for (int k = 0; k < MTF_SCHEDULES_MAX; k++) names[k] = mb_lr_kind_name((mb_lr_kind)k);
    return names;
}

/* The usage on stdout; 0 (the exit status). */
static int mtf_options_help(void) {
    char list[128] = "";
    const char *const *names = mtf_schedule_names();
    for (int k = 0; names[k]; k++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? "|" : "", names[k]);
    printf(mtf_usage, list);
    return 0;
}

/* ---- outputs ---- */

/* path, or for fold k >= 1 path with ".fold<k>" before its extension (m.safetensors:
 * m.fold2.safetensors), into buf. 1, or the error printed and 0. */
static int mtf_fold_path(const char *path, int k, char *buf, size_t cap) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - path) : (int)strlen(path);
    int n = k ? snprintf(buf, cap, "%.*s.fold%d%s", stem, path, k, path + stem) : snprintf(buf, cap, "%s", path);
    return n >= 0 && (size_t)n < cap ? 1 : mba_bad("--export", path, "path too long");
}

/* The output-path rule (mb_args.h): every file the run writes can be written and is
 * neither an input nor another output. Checked before the data, the device and training;
 * with --walk-forward, each fold's files. 1, or the error printed and 0. */
static int mtf_outputs_writable(const mtf_options *o, const char *onnx) {
    char plot[1024];
    if (o->metrics && mbt_plot_path(o->metrics, o->plot, plot, sizeof plot) != MB_OK)
        return mba_error("%s", mb_last_error()), 0;
    mba_file in[] = {{"--train", o->train, 0, 0}, {"--val", o->walk_forward ? NULL : o->val, 0, 0},
                     {"--init", o->resume ? NULL : o->init, 0, 0}, {"--ckpt", o->resume ? o->ckpt : NULL, 0, 0}};
    for (int k = o->walk_forward ? 1 : 0; k <= o->walk_forward; k++) {
        char ex[1024], ox[1024];
        if (o->export_path && !mtf_fold_path(o->export_path, k, ex, sizeof ex)) return 0;
        if (onnx && !mtf_fold_path(onnx, k, ox, sizeof ox)) return 0;
        mba_file out[] = {{"--metrics", o->metrics, 0, 0}, {"--plot", o->metrics ? plot : NULL, 0, 0},
                          {"--ckpt", o->ckpt, 0, 1}, {"--export", o->export_path ? ex : NULL, 0, 1},
                          {"--export-onnx", onnx ? ox : NULL, 0, 1}};
        if (!mba_outputs_ok(in, 4, out, 5)) return 0;
    }
    return 1;
}

/* The checks between flags, after the table; 1, or the error printed and 0. */
static int mtf_options_check(const mtf_options *o) {
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
    return 1;
}

/* The defaults, then the flags; 1 when they are good, else `error: ...` printed and 0.
 * *onnx: --export-onnx, kept out of the options (a checkpoint holds those that shape the run). */
static int mtf_options_parse(int argc, char **argv, mtf_options *o, const char **onnx) {
    static const char *const losses[] = {"mse", "huber", NULL}, *const precisions[] = {"f32", "bf16", "f16", NULL},
                             *const kernels[] = {"auto", "avx512", "avx2", "c", NULL}; /* mb_cpu_kernel's order */
    memset(o, 0, sizeof *o);
    *onnx = NULL;
    o->train = "data/train.h5"; o->val = "data/val.h5";
    o->epochs = 3; o->layers = 1; o->accum = 1; o->batch = 128; o->hidden_size = 32; o->head = 64;
    o->lr = 2e-3f; o->clip = 1.0f; o->weight_decay = 0.01f; o->chunk_fraction = 0.75f;
    o->warmup = 20; o->schedule = MB_LR_WARMUP_COSINE; o->loss = MB_LOSS_MSE; o->seed = 1;
    o->precision = MTF_BACKEND == MB_CUDA ? MB_BF16 : MB_F32; /* the GPU: bf16 tensor cores, no scaler needed */
    const mba_flag flags[] = {
        {"--train", MBA_STR, &o->train, 0, 0, NULL}, {"--val", MBA_STR, &o->val, 0, 0, NULL},
        {"--metrics", MBA_STR, &o->metrics, 0, 0, NULL}, {"--plot", MBA_STR, &o->plot, 0, 0, NULL},
        {"--ckpt", MBA_STR, &o->ckpt, 0, 0, NULL}, {"--ckpt-every", MBA_I64, &o->ckpt_every, 0, 1e12, NULL},
        {"--export", MBA_STR, &o->export_path, 0, 0, NULL}, {"--init", MBA_STR, &o->init, 0, 0, NULL},
        {"--export-onnx", MBA_STR, onnx, 0, 0, NULL},
        {"--carry", MBA_SET, &o->carry, 0, 0, NULL}, {"--quiet", MBA_SET, &o->quiet, 0, 0, NULL},
        {"--resume", MBA_SET, &o->resume, 0, 0, NULL}, {"--no-ftz", MBA_SET, &o->no_ftz, 0, 0, NULL},
        {"--epochs", MBA_INT, &o->epochs, 1, 1e6, NULL},
        {"--batch", MBA_I64, &o->batch, 1, 1e6, NULL}, {"--hidden", MBA_I64, &o->hidden_size, 1, 1e5, NULL},
        {"--head", MBA_I64, &o->head, 1, 1e5, NULL}, {"--layers", MBA_INT, &o->layers, 1, 16, NULL},
        {"--accum", MBA_INT, &o->accum, 1, 1e4, NULL}, {"--threads", MBA_INT, &o->threads, 0, 1024, NULL},
        {"--checkpoint-k", MBA_INT, &o->checkpoint_k, -1, 1e6, NULL},
        {"--max-batches", MBA_I64, &o->max_batches, 0, 1e12, NULL}, {"--warmup", MBA_INT, &o->warmup, 0, 1e9, NULL},
        {"--seed", MBA_U64, &o->seed, 0, 4e9, NULL}, {"--lr", MBA_F32, &o->lr, 1e-9, 10, NULL},
        {"--clip", MBA_F32, &o->clip, 0, 1e9, NULL}, {"--weight-decay", MBA_F32, &o->weight_decay, 0, 1, NULL},
        {"--chunk-fraction", MBA_F32, &o->chunk_fraction, 0.01, 0.95, NULL},
        {"--schedule", MBA_CHOICE, &o->schedule, 0, 0, mtf_schedule_names()},
        {"--loss", MBA_CHOICE, &o->loss, 0, 0, losses}, {"--precision", MBA_CHOICE, &o->precision, 0, 0, precisions},
        {"--cpu-kernel", MBA_CHOICE, &o->cpu_kernel, 0, 0, kernels},
        {"--ema", MBA_F32, &o->ema, 1e-6, 0.999999, NULL}, {"--swa-start", MBA_INT, &o->swa_start, 1, 1e6, NULL},
        {"--keep-best", MBA_SET, &o->keep_best, 0, 0, NULL}, {"--patience", MBA_INT, &o->patience, 1, 1e6, NULL},
        {"--walk-forward", MBA_INT, &o->walk_forward, 2, MBW_MAX_FOLDS, NULL},
        {"--dropout", MBA_F32, &o->dropout, 0, 0.999, NULL},
        {"--wf-window", MBA_I64, &o->wf_window, 1, 1e12, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 0;
    return mtf_options_check(o) && mtf_outputs_writable(o, *onnx);
}

/* ---- the options in a checkpoint ----
 * The options that shape a run, by their flags' names: a checkpoint holds them and a resume
 * must match them (mb_ckpt_key; not the paths, --quiet, --resume, --threads, --cpu-kernel,
 * --epochs, --ckpt-every). A new option that shapes a run is one more entry, with the value
 * that files written before it hold as its `before`. */

enum { MTF_OPTION_KEYS = 24, MTF_OPTION_KEYS_V1 = 19, MTF_OPTIONS_V1_BYTES = 176 };

static void mtf_options_key(const mtf_options *o, mb_ckpt_key *out) {
    const mb_ckpt_key key[MTF_OPTION_KEYS] = {
        MB_CKPT_INT("layers", o->layers), MB_CKPT_INT("accum", o->accum), MB_CKPT_INT("carry", o->carry),
        MB_CKPT_INT("checkpoint-k", o->checkpoint_k), MB_CKPT_INT("batch", o->batch),
        MB_CKPT_INT("hidden", o->hidden_size), /* the flag's name */
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

/* Checkpoints of the older format held these options as the options struct's raw bytes, as gcc
 * and clang lay it out on x86-64 and aarch64 (176 bytes; the paths and run-only fields zero):
 * where each lay, so that such a file still resumes (mb_ckpt_check_key_bytes). Any other
 * size or a stray byte is refused with what to do. Frozen: never edit for a new option. */
static const mb_ckpt_field mtf_options_v1[MTF_OPTION_KEYS_V1] = {
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

/* ---- configs ---- */

/* The device: streams 0, 1 and one per encoder (2 + s; segments: at most max_seg), warnings to
 * stderr (mb_train.h), the GPU of this rank on its machine (local_rank). */
static mb_device_config mtf_options_device(const mtf_options *o, int max_seg, int local_rank) {
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MTF_BACKEND; dc.streams = 2 + max_seg; dc.threads = o->threads;
    dc.keep_denormals = o->no_ftz;
    dc.cpu_kernel = o->cpu_kernel;
    dc.log.fn = mbt_log_warnings; dc.log.max = MB_LOG_WARN;
    dc.index = local_rank; /* CUDA: one GPU per rank of this machine */
    return dc;
}

/* A loader in time order (--batch, --seed, --chunk-fraction); shard: the ranks whose shards of
 * each batch it reads (NULL: unsharded). */
static mb_loader_config mtf_options_loader(const mtf_options *o, const mb_dist *shard) {
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch; lc.shuffle = 0; lc.seed = o->seed; lc.chunk_fraction = o->chunk_fraction;
    lc.shard_rank = mb_dist_rank(shard); lc.shard_count = mb_dist_size(shard);
    return lc;
}

/* The learning-rate schedule over the optimizer steps of the whole run (--epochs of
 * batches_per_epoch batches, --accum a step). */
static mb_lr_schedule mtf_options_schedule(const mtf_options *o, int64_t batches_per_epoch) {
    mb_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.kind = o->schedule; s.lr = o->lr;
    s.total_steps = (int64_t)o->epochs * ((batches_per_epoch + o->accum - 1) / o->accum);
    if (s.total_steps < 2) s.total_steps = 2;
    s.warmup_steps = o->warmup < s.total_steps ? o->warmup : s.total_steps / 2;
    return s;
}

/* --ckpt: the checkpoint's path and the options a resume must match (key: MTF_OPTION_KEYS
 * entries, kept by the caller; the older format's layout too). */
static void mtf_options_ckpt(const mtf_options *o, mb_ckpt_key *key, mbt_ckpt *c) {
    mtf_options_key(o, key);
    c->path = o->ckpt;
    c->key = key; c->key_n = MTF_OPTION_KEYS;
    c->legacy = mtf_options_v1; c->legacy_n = MTF_OPTION_KEYS_V1; c->legacy_bytes = MTF_OPTIONS_V1_BYTES;
}

/* ---- title ---- */

/* The run's key options, the loss-curve picture's title. */
static void mtf_options_title(const mtf_options *o, char *buf, size_t cap) {
    snprintf(buf, cap, "train_multitf: hidden %lld, head %lld, layers %d, batch %lld, accum %d, lr %g %s, "
             "%s loss, %s, seed %llu", (long long)o->hidden_size, (long long)o->head, o->layers, (long long)o->batch,
             o->accum, (double)o->lr, mb_lr_kind_name(o->schedule), o->loss == MB_LOSS_HUBER ? "huber" : "mse",
             mb_dtype_name(o->precision), (unsigned long long)o->seed);
}

#endif /* MTF_OPTIONS_H */
