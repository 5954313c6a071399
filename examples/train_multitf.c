/* train_multitf.c - the multi-timeframe model and its training loop (docs/EXAMPLE.md).
 *
 * Model (examples/multitf.h): five LSTM encoders, one per timeframe segment of a sample (M1
 * 480 bars, M5 288, M15 192, H1 96, H4 48: the file's `segments`), their last hidden states
 * concatenated, a two-layer head predicting the K targets. Loss: MSE (or Huber). AdamW with
 * clipping, a learning-rate schedule, gradient accumulation; f16 adds the dynamic loss scaler.
 *   build/train_multitf      --train data/train.h5 --val data/val.h5     (CPU, cc)
 *   build/train_multitf_cuda --train data/train.h5 --val data/val.h5     (GPU, nvcc: the same source)
 *   build/train_multitf_mpi  under mpirun -np N: data parallel (section "data parallel")
 * Read top to bottom: what training adds to the model, the run (trainer_open), the step, the
 * loop (train), the end (trainer_finish). What a reader of the loop need not see is in the
 * headers below: the flags (--help), progress, metrics, checkpoints (--resume: bitwise the
 * weights of an uninterrupted run), the lines printed, the last one for scripts:
 *   summary: epochs=.. steps=.. train_loss=.. val_loss=.. baseline_val_loss=.. samples_per_s=.. world=..
 * (under tests/cudasim also launches_per_step=.. graphs_per_step=.. syncs_per_step=..). Exit 2
 * with `error: ...` on bad flags or data. */
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#define MTF_BACKEND MB_CUDA
#else
#include "megabatch.h"
#define MTF_BACKEND MB_CPU
#endif
#include "mb_train.h"    /* progress, metrics, picture, checkpoints, report; mb_args.h */
#include "multitf.h"     /* the model; its weights file: --export, --init */
#include "mtf_onnx.h"    /* --export-onnx */
#include "mb_select.h"   /* --ema, --swa-start, --keep-best, --patience */
#include "mb_metrics.h"  /* hit rate, IC, rank IC of the validation predictions */
#include "mb_walk.h"     /* --walk-forward K: the folds */
#include "mtf_options.h" /* the flags (mtf_options_parse), the options a checkpoint holds, --help */

// ---- model ----
// The network is multitf.h's mtf_model; here, what training adds: the loss, the f16 loss
// scaler, zeros (the baseline's prediction), the meter the losses sum into on the device, and
// what the graph step needs (section "the training step").

enum { MAX_SEG = 5 };

/* A step's CUDA graph (section "the training step"): what changes a step's calls, a bit each. */
typedef enum step_graph {
    GRAPH_SHORT = 1, /* the epoch's short last batch (another B) */
    GRAPH_STEP = 2,  /* ends with the optimizer step */
    GRAPH_START = 4, /* starts an accumulation window (zeroes the gradients) */
    STEP_GRAPHS = 8  /* every combination */
} step_graph;

typedef struct model {
    mtf_model net;
    mb_loss_config loss_cfg;
    mb_scaler *scaler;   /* f16: the dynamic loss scaler, else NULL */
    float *zeros, *loss; /* (B, K) zeros; one device float */
    mb_dist *dist;       /* data parallel: a world of one without MPI */
    mbs_select *sel;     /* the weight average's update follows each optimizer step (mb_select.h) */
    mb_meter *meter;     /* device sums: 0 training loss, 1 validation loss, 2 baseline */
    mbt_losses losses;   /* each step's metrics row until its loss lands (mb_train.h) */
    int graphs, warm;    /* the step runs as CUDA graphs; a step of this process ran (the warm-up) */
    mb_graph *graph[STEP_GRAPHS]; /* by step_graph_of (section "the training step") */
    float *xb, *yb;      /* the batch copied into fixed device buffers, which the graphs read */
    mbm_pass metrics;    /* the trading metrics of the validated weights (mb_metrics.h) */
} model;

/* The model of spec (the training file's shape and normalisation: trainer_open). */
static mb_result model_create(model *m, mb_device *dev, const mtf_spec *spec, const mb_dataset_meta *meta,
                              const mtf_options *o) {
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
    MB_TRY(mb_meter_create(&m->meter, dev, 3, MBT_METER_DEPTH));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, (size_t)(o->batch * meta->t * meta->f) * sizeof(float), (void **)&m->xb));
    MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, (size_t)(o->batch * meta->k) * sizeof(float), (void **)&m->yb));
    MB_TRY(mbm_pass_init(&m->metrics, dev, meta->k, o->batch));
    return mb_zero(dev, MB_STREAM_COMPUTE, m->zeros, zeros);
}

static void model_destroy(model *m) {
    for (int i = 0; i < STEP_GRAPHS; i++) mb_graph_destroy(m->graph[i]);
    float *bufs[] = {m->xb, m->yb, m->zeros, m->loss};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mb_free(m->net.dev, bufs[i]);
    mb_meter_destroy(m->meter);
    mbm_pass_free(&m->metrics);
    mb_scaler_destroy(m->scaler);
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

/* Mean validation loss of the model and of the naive baseline (predict 0 return), summed on
 * the device (meter slots 1, 2) and read once, at the end; with metrics, the trading metrics
 * of the predictions into m->metrics (per horizon, and their means). */
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
        if (metrics) MB_TRY(mbm_pass_add(&m->metrics, pred, (const float *)b.targets, b.count));
    }
    MB_TRY(mbm_pass_end(&m->metrics, metrics));
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

// ---- the run ----
// Everything a run holds, opened by trainer_open in one plain sequence, closed by
// trainer_close (which takes a half-opened trainer too). Data parallel: under mpirun
// (build/train_multitf_mpi, docs/DIST.md) each rank's loader reads its shard of every global
// batch; rank 0's weights are broadcast at the start; per batch one all-reduce averages the
// gradients over all ranks' samples before the optimizer step (the same bits on every rank);
// the ranks' losses are summed at each fold (meter_fold); after each epoch the ranks check
// they are bitwise in sync. Rank 0 alone prints and writes files. Validation runs whole on
// every rank. Refused with several ranks: --accum > 1 and --carry.

typedef struct trainer {
    mtf_options o;             /* o.world: the ranks */
    mb_ckpt_key key[MTF_OPTION_KEYS]; /* the options that shape the run: a checkpoint holds them */
    int lead;              /* rank 0: prints, writes metrics, the picture and checkpoints */
    mb_dist *dist; mb_device *dev;
    mb_dataset *dtr, *dva;
    mtf_spec spec;         /* the model's, from the training file (with prepare's normalisation) */
    mb_loader *tr, *va;
    model m;
    mb_adamw *opt; mb_lr_schedule sched; /* AdamW and its learning-rate schedule */
    mbs_select sel;        /* --ema/--swa-start, --keep-best, --patience (mb_select.h) */
    mbt_run rs;            /* the loop's counters: what a checkpoint holds besides the weights */
    mbt_ckpt ckpt;
    FILE *csv;             /* --metrics */
    char plot[1024];       /* the picture's path, "" for none */
    const char *onnx;      /* --export-onnx */
    double avg_val_loss;   /* the last epoch's averaged weights' validation loss (0: no average) */
    mbw_fold_data *fold;   /* --walk-forward: this fold's data (in memory, owned by the caller), else NULL */
    int fold_k;            /* its number, 1-based (the export files' suffix) */
    mbt_progress pb;       /* the progress bar */
    size_t live0;          /* device memory in use at the start (mbt_epoch_report: growth) */
    int64_t run_samples0, epoch_samples0, epoch_steps; /* at the run's and the epoch's start; steps timed */
    double epoch_t0;
} trainer;

/* Batches per epoch: the loader's plan, capped by --max-batches. */
static int64_t batches_per_epoch(const trainer *t) {
    int64_t nb = mb_loader_get_plan(t->tr)->batches;
    return t->o.max_batches && t->o.max_batches < nb ? t->o.max_batches : nb;
}

/* A checkpoint's own state of this program: the model's (--carry's (h, c), --dropout's step)
 * and the average, the best weights and their epoch (mb_select.h). */
static mb_result save_state(mb_ckpt_writer *w, void *user) {
    trainer *t = (trainer *)user;
    MB_TRY(mtf_model_save_state(w, &t->m.net));
    return mbs_save(w, &t->sel);
}
static mb_result load_state(mb_ckpt_reader *rd, void *user) {
    trainer *t = (trainer *)user;
    MB_TRY(mtf_model_load_state(rd, &t->m.net));
    return mbs_load(rd, &t->sel);
}

/* --ckpt: what a checkpoint holds (mb_train.h) and the options a resume must match. */
static void checkpoint_init(trainer *t) {
    mbt_ckpt *c = &t->ckpt;
    mtf_options_ckpt(&t->o, t->key, c);
    c->dev = t->dev; c->params = t->m.net.params; c->opt = t->opt; c->scaler = t->m.scaler;
    c->save_state = save_state; c->load_state = load_state; c->ctx = t;
}

static mb_result trainer_open(trainer *t, const mtf_options *opts) {
    const mtf_options *o = &t->o;
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
    t->spec = mtf_spec_of_data(mt, o->hidden_size, o->head, o->layers, o->carry);
    if (t->fold) mbw_fold_spec(t->fold, &t->spec);
    else MB_TRY(mtf_spec_read_norm(&t->spec, t->dtr)); /* for --export; before the loaders read the file */
    MB_TRY(mb_dist_open(&t->dist, NULL));
    t->o.world = mb_dist_size(t->dist);
    t->lead = mb_dist_rank(t->dist) == 0;
    mb_device_config dc = mtf_options_device(o, MAX_SEG, mb_dist_local_rank(t->dist)); /* encoder s: stream 2 + s */
    MB_TRY(mb_device_open(&t->dev, &dc));
    if (o->world > 1 && (o->accum > 1 || o->carry))
        return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "--accum > 1 and --carry are not supported with %d ranks", o->world);
    mb_loader_config tl = mtf_options_loader(o, t->dist), vl = mtf_options_loader(o, NULL); /* train: sharded */
    MB_TRY(mb_loader_open(&t->tr, t->dev, t->dtr, &tl));
    MB_TRY(mb_loader_open(&t->va, t->dev, t->dva, &vl));
    MB_TRY(mbt_memory_hint(model_create(&t->m, t->dev, &t->spec, mt, o), o->batch)); /* out of memory: the flag */
    t->m.dist = t->dist;
    t->m.losses.csv = &t->csv; t->m.losses.dist = t->dist; t->m.losses.k = t->spec.K;
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
    if (!o->quiet && t->lead) /* every check done (the resume's options too): the device and data lines */
        mbt_open_report(t->dev, t->fold ? mt->source : o->train, mt, t->m.net.spec.nseg, mb_params_total(t->m.net.params),
                        o->world, o->resume ? o->ckpt : NULL, &t->rs);
    t->sched = mtf_options_schedule(o, batches_per_epoch(t)); /* over the whole run's optimizer steps */
    return MB_OK;
}

// ---- the training step ----
// A step queues its work and never waits for the device (issue 15): the loss adds into the
// meter on the device, the learning rate comes from the schedule on the device, and the loop
// reads each step's loss a few steps late (section "the losses, read late"). So nothing of a
// step changes from batch to batch but the batch: on the GPU the batch is copied into fixed
// buffers and the whole step (zero grads, forward, loss, backward, unscale, clip, AdamW,
// scaler) is captured once as a CUDA graph and replayed, a graph for each variant
// (step_graph), after a first plain step (the warm-up the capture needs). Plain launches
// instead, said once: the CPU, --carry (the encoders' state path changes between batches),
// several ranks (each all-reduce first sums the ranks' sample counts on the host).

typedef struct step_args {
    model *m;
    mb_adamw *opt;
    const mb_lr_schedule *sched;
    const float *x, *y;
    int64_t B;
    float grad_scale, lr; /* lr: the window's, for the metrics (the device computes its own) */
    int start, stepped;   /* zero the gradients first, end with the optimizer */
    int window_end, dp, warm; /* the accumulation window ends (several ranks: the step after the
                                 all-reduce); a step of this process ran before (the warm-up) */
} step_args;

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

/* The step itself, top to bottom: forward and backward are multitf.h's (each calls the
 * library's LSTM once for all five encoders), the loss and the optimizer step above. */
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

static step_graph step_graph_of(const step_args *a, int64_t maxB) {
    return (step_graph)((a->start ? GRAPH_START : 0) | (a->stepped ? GRAPH_STEP : 0) | (a->B != maxB ? GRAPH_SHORT : 0));
}

static void graphs_choose(model *m, const mtf_options *o) {
    const char *off = !mb_graph_supported(m->net.dev) ? NULL
                      : o->carry ? "--carry (the encoders' state changes the step)"
                      : mb_dist_size(m->dist) > 1 ? "several ranks (each all-reduce first sums the sample counts on the host)"
                                                  : NULL;
    m->graphs = mb_graph_supported(m->net.dev) && !off;
    if (off && !o->quiet && mb_dist_rank(m->dist) == 0) fprintf(stderr, "note: CUDA graphs off: %s; plain launches\n", off);
}

/* The step through its graph (graphs on, after the warm-up): the batch copied into the
 * buffers the graphs read, then the step's graph replayed (captured on its first run). */
static mb_result graph_step(model *m, step_args *a, const mb_batch *b) {
    const mtf_spec *sp = &m->net.spec;
    size_t xbytes = (size_t)(b->count * sp->T * sp->F) * sizeof(float), ybytes = (size_t)(b->count * sp->K) * sizeof(float);
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->xb, b->features, xbytes)); /* device to device */
    MB_TRY(mb_copy(m->net.dev, MB_STREAM_COMPUTE, m->yb, b->targets, ybytes));
    a->x = m->xb;
    a->y = m->yb;
    return mb_graph_run(&m->graph[step_graph_of(a, m->net.maxB)], m->net.dev, MB_STREAM_COMPUTE, train_step, a);
}

// ---- the losses, read late ----
// Meter slot 0 sums the training loss on the device since the last fold (epoch start or
// checkpoint). After each step mb_meter_step queues a read of it (no reset) and lands those
// that have landed (mbt_losses_landed, mb_train.h, writes each one's row); the epoch's sums are
// the same whenever reads land (a resumed run's epoch sum is the uninterrupted run's, bitwise).

/* Every step's loss landed (waits), the device's sums folded into the epoch's and restarted
 * (epoch ends, checkpoints, and with several ranks every MBT_DP_ROWS steps: on every rank). */
static mb_result meter_fold(trainer *t) {
    double sum = 0, w = 0;
    MB_TRY(mb_meter_fold(t->m.meter, MB_STREAM_COMPUTE, mbt_losses_landed, &t->m.losses));
    MB_TRY(mb_meter_value(t->m.meter, 0, &sum, &w));
    if (mb_dist_size(t->dist) > 1) MB_TRY(mbt_losses_fold_ranks(&t->m.losses, &sum));
    t->rs.epoch_loss_sum += sum; /* (the samples: counted per batch, mbt_run_batch) */
    return MB_OK;
}

// ---- the training loop ----
// Epochs of steps, as llm.c's main loop: train (below) takes each batch (next_batch), sets up
// its step (step_of), runs it (train_step, or graph_step), and books it (step_end); then the
// epoch's end (epoch_end): validation, model selection, the report, a checkpoint.

/* The next training batch of the epoch into *b; b->count 0: the epoch is over (or --max-batches). */
static mb_result next_batch(trainer *t, mb_batch *b) {
    if (t->o.max_batches && t->rs.epoch_batches >= t->o.max_batches) { /* skip to the next epoch */
        mb_loader_pos next = {t->rs.epoch, 0, 0};
        b->count = 0;
        return mb_loader_set_position(t->tr, next);
    }
    return mb_loader_next(t->tr, b);
}

/* Batch b's step: its place in the accumulation window and the window's learning rate. */
static mb_result step_of(trainer *t, const mb_batch *b, step_args *a) {
    mbt_run *rs = &t->rs;
    memset(a, 0, sizeof *a);
    a->m = &t->m; a->opt = t->opt; a->sched = &t->sched;
    a->x = (const float *)b->features; a->y = (const float *)b->targets; a->B = b->count;
    MB_TRY(mb_lr_at(&t->sched, rs->step, &a->lr));
    a->warm = t->m.warm;
    a->dp = mb_dist_size(t->dist) > 1;
    a->start = mb_accum_window_start(&rs->acc);
    a->window_end = mb_accum_tick(&rs->acc);
    a->grad_scale = mb_accum_loss_scale(&rs->acc);
    a->stepped = a->window_end && !a->dp;
    return MB_OK;
}

/* After a step: several ranks' all-reduce and optimizer step; the counters; the warm-up waited
 * for once; the loss's read queued (its row written when it lands); progress; --ckpt-every. */
static mb_result step_end(trainer *t, const step_args *a) {
    model *m = &t->m;
    mbt_run *rs = &t->rs;
    int64_t n = a->B; /* samples of the batch, over all ranks */
    if (a->dp) { /* the gradients averaged over the ranks' samples, then the step */
        MB_TRY(mb_dist_allreduce_grads(m->dist, m->net.params, a->B, NULL, &n));
        if (a->window_end) MB_TRY(optimizer_step(m, t->opt, &t->sched));
    }
    mbt_run_batch(rs, 0.0, n); /* the loss sums: folded from the meter (meter_fold) */
    if (a->window_end) rs->step++;
    if (!a->warm) { /* the warm-up step is not counted: wait for it once, count from here */
        MB_TRY(mb_sync(t->dev, -1));
        mbt_sim_count_from();
        m->warm = 1;
    } else t->epoch_steps++;
    double sps = mbt_rate(rs->samples - t->epoch_samples0, mba_now() - t->epoch_t0);
    int64_t id = 0; /* the step's meter read: its row is written when its loss lands */
    MB_TRY(mb_meter_step(m->meter, MB_STREAM_COMPUTE, mbt_losses_landed, &m->losses, &id));
    m->losses.rows[id % MBT_METER_DEPTH] = mbt_step_row_of(rs, a->lr, sps);
    t->pb.loss = m->losses.last;
    mbt_progress_draw(&t->pb, t->dev, rs, batches_per_epoch(t), sps, 0);
    if (a->window_end && t->o.ckpt_every && rs->step % t->o.ckpt_every == 0) {
        rs->pos = mb_loader_position(t->tr);
        MB_TRY(meter_fold(t)); /* the epoch's loss so far, in the checkpoint */
        if (t->lead) MB_TRY(mbt_ckpt_save(&t->ckpt, rs, t->csv));
    } else if (a->dp && rs->epoch_batches % MBT_DP_ROWS == 0) { /* folds at most MBT_DP_ROWS steps apart, */
        MB_TRY(meter_fold(t));                               /* at the same step on every rank */
    }
    return MB_OK;
}

/* The epoch's steps done: every loss landed, the progress bar's last line, the device waited for. */
static mb_result epoch_trained(trainer *t) {
    mbt_run *rs = &t->rs;
    mbt_sim_count_to(t->epoch_steps); /* before the fold: its host syncs are the epoch's, not the steps' */
    MB_TRY(meter_fold(t));
    t->pb.loss = t->m.losses.last;
    mbt_progress_draw(&t->pb, t->dev, rs, batches_per_epoch(t), mbt_rate(rs->samples - t->epoch_samples0,
                      mba_now() - t->epoch_t0), 1);
    MB_TRY(mb_sync(t->dev, -1));
    rs->seconds += mba_now() - t->epoch_t0;
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
    mbm_text(avg_text + n + 1, cap - n - 1, &t->m.metrics.mean);
    return mbs_consider(s, e, mbs_selected_loss(s, e, t->rs.val_loss, *avg_loss));
}

/* The epoch's end: validation, model selection, the ranks' check, the epoch line and the CSV
 * row, then the next epoch's position and, with --ckpt, its checkpoint. */
static mb_result epoch_end(trainer *t) {
    mbt_run *rs = &t->rs;
    char avg_text[160];
    MB_TRY(epoch_trained(t));
    MB_TRY(evaluate(&t->m, t->va, &rs->val_loss, &rs->baseline, !mbs_averaging(&t->sel, rs->epoch)));
    MB_TRY(select_epoch(t, &t->avg_val_loss, avg_text, sizeof avg_text));
    MB_TRY(mbt_ranks_in_sync(t->dist, t->m.net.params)); /* data parallel: bitwise the same weights */
    double sps = mbt_rate(rs->samples - t->run_samples0, rs->seconds);
    mb_scaler_state st; /* the scale the progress bar shows next epoch (read here: the epoch's end) */
    if (t->m.scaler && mb_scaler_get(t->m.scaler, &st) == MB_OK) t->pb.scale = st.scale;
    if (t->lead) mbt_epoch_report(t->dev, t->m.scaler, rs, sps, &t->live0, avg_text);
    mbt_metrics_epoch(t->csv, rs, sps, mb_device_mem_stats(t->dev).live[MB_MEM_DEVICE], t->spec.K, t->m.metrics.per,
                      &t->m.metrics.mean);
    mbt_run_new_epoch(rs);
    rs->epoch++;
    rs->pos = mb_loader_position(t->tr);
    return t->o.ckpt && t->lead ? mbt_ckpt_save(&t->ckpt, rs, t->csv) : MB_OK;
}

/* Epochs up to --epochs (or until --patience runs out): each batch's step, then the epoch's end. */
static mb_result train(trainer *t) {
    mbt_run *rs = &t->rs;
    t->live0 = mb_device_mem_stats(t->dev).live[MB_MEM_DEVICE];
    memset(&t->pb, 0, sizeof t->pb);
    t->pb.on = !t->o.quiet && t->lead && isatty(STDERR_FILENO);
    t->run_samples0 = rs->samples;
    graphs_choose(&t->m, &t->o);
    while (rs->epoch <= t->o.epochs && !t->sel.stop) {
        t->epoch_t0 = mba_now(); t->epoch_samples0 = rs->samples; t->epoch_steps = 0;
        mbt_sim_count_from(); /* the simulator's per-step counters (mb_train.h) */
        t->pb.drawn = 0;
        for (;;) {
            mb_batch b;
            step_args a;
            MB_TRY(next_batch(t, &b));
            if (b.count == 0) break;
            MB_TRY(step_of(t, &b, &a));
            MB_TRY(t->m.graphs && a.warm ? graph_step(&t->m, &a, &b) : train_step(&a));
            MB_TRY(step_end(t, &a));
        }
        MB_TRY(epoch_end(t));
    }
    if (t->sel.stop && t->lead && !t->o.quiet)
        printf("early stop: %d epochs without a lower validation loss (the best: epoch %lld)\n", t->o.patience,
               (long long)t->sel.st.best_epoch);
    rs->epoch--; /* the last epoch trained */
    rs->samples_run = rs->samples - t->run_samples0;
    return MB_OK;
}

/* After training (r: how it went): the metrics file closed, the picture, the weights file. */
static mb_result trainer_finish(trainer *t, mb_result r) {
    const mtf_options *o = &t->o;
    char title[256];
    FILE *csv = t->csv;
    t->csv = NULL;
    MB_TRY(mbt_metrics_close(csv, o->metrics, r));
    mtf_options_title(o, title, sizeof title);
    if (t->plot[0]) MB_TRY(mbt_plot_write(t->plot, o->metrics, title)); /* t->plot: rank 0 only */
    if (t->plot[0] && !o->quiet) printf("loss curves: %s\n", t->plot);
    if ((o->export_path || t->onnx) && t->lead) { /* the selected weights made live: training is over (once: */
        if (!t->m.net.spec.weights[0])           /* a walk-forward fold has done it to validate them) */
            MB_TRY(mbs_final_weights(&t->sel, t->rs.epoch, t->m.net.spec.weights, sizeof t->m.net.spec.weights));
        if (!o->quiet) printf("exported weights: %s\n", t->m.net.spec.weights);
    }
    char path[1024];
    if (o->export_path && t->lead && mtf_fold_path(o->export_path, t->fold_k, path, sizeof path)) {
        MB_TRY(mtf_model_export(&t->m.net, path));
        if (!o->quiet) printf("weights: %s\n", path);
    }
    if (t->onnx && t->lead && mtf_fold_path(t->onnx, t->fold_k, path, sizeof path)) {
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
// --walk-forward K (mb_walk.h's mbw_run: the plan, the folds in turn, the table): each fold a
// run of its own on its samples, with a fresh model from the same --seed, trained and selected
// as any run; its exported weights validated once more for the table.

typedef struct walk { const mtf_options *o; const char *onnx; trainer *t; } walk;

static mb_result walk_fold(void *ctx, mbw_fold_data *fd, int k, mbw_scores *sc) {
    walk *w = (walk *)ctx;
    trainer *t = w->t;
    memset(t, 0, sizeof *t);
    t->onnx = w->onnx;
    t->fold = fd;
    t->fold_k = k + 1;
    mb_result r = trainer_open(t, w->o);
    if (r == MB_OK) r = train(t);
    if (r == MB_OK) r = mbs_final_weights(&t->sel, t->rs.epoch, t->m.net.spec.weights, sizeof t->m.net.spec.weights);
    double base = 0;
    if (r == MB_OK) r = evaluate(&t->m, t->va, &sc->val_loss, &base, 1);
    sc->train_loss = t->rs.train_loss;
    sc->baseline = t->rs.baseline;
    sc->metric[0] = t->m.metrics.mean.hit; sc->metric[1] = t->m.metrics.mean.ic; sc->metric[2] = t->m.metrics.mean.rank_ic;
    r = trainer_finish(t, r);
    trainer_close(t);
    mb_dist_close(t->dist);
    return r;
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mtf_options_help();
    static trainer t; /* static: zeroed, and large */
    mtf_options o;
    if (!mtf_options_parse(argc, argv, &o, &t.onnx)) return 2;
    if (o.walk_forward) { /* K runs, one a fold: mb_walk.h */
        static const char *const names[3] = {"hit", "ic", "rank_ic"};
        walk w = {&o, t.onnx, &t};
        mbw_config wc = {o.walk_forward, o.wf_window, o.batch, 0, 0};
        mb_result wr = mbw_run(o.train, wc, o.quiet, walk_fold, &w, names, 3);
        if (wr != MB_OK) mba_fail(mb_last_error()); /* in the user's words (mb_args.h) */
        return wr == MB_OK ? 0 : 2;
    }
    mb_result r = trainer_open(&t, &o);
    if (r == MB_OK) r = train(&t);
    r = trainer_finish(&t, r);
    char extra[256]; /* the summary's selection part: trainer_close clears the selection */
    int n = mbs_summary_text(extra, sizeof extra, &t.sel.st, t.sel.avg != NULL, t.avg_val_loss);
    trainer_close(&t);
    if (r != MB_OK) {
        mba_fail(mb_last_error()); /* in the user's words (mb_args.h) */
        mb_dist_abort(t.dist, 2); /* several ranks: end them all (they would wait for this one) */
        mb_dist_close(t.dist);
        return 2;
    }
    if (t.lead) { /* samples: over all ranks */
        snprintf(extra + n, sizeof extra - (size_t)n, "%s", mbt_sim_count_text());
        mbt_summary(&t.rs, t.o.world, extra);
    }
    mb_dist_close(t.dist);
    return 0;
}
