/* mb_train.h - what a training program needs besides its model and its loop, shared by
 * examples/train_multitf.c and examples/train_minimal.c (docs/EXAMPLE.md):
 *   clock          mbt_rate (the clock itself: mb_args.h's mba_now)
 *   run state      mbt_run: the loop's counters (epoch, step, batches, losses, loader position,
 *                  accumulation window), the part of a checkpoint that is not weights
 *   logging        mbt_log_warnings (data files: mb_args.h's mba_open_data, probed in a child)
 *   progress bar   mbt_progress_draw: one line on stderr, redrawn in place
 *   metrics        mbt_metrics_open/_step/_epoch: the CSV, kept exact across --resume;
 *                  mbt_losses: each step's row kept until its loss, read late from the device, lands
 *   picture        mbt_plot_path, mbt_plot_write: the SVG of the loss curves (mb_plot.h)
 *   checkpoints    mbt_ckpt_save, mbt_ckpt_load: params, AdamW, scaler, run state, options
 *   checks         mbt_inputs_check, mbt_clamp_batch: before the device and the data lines
 *   data parallel  mbt_ranks_in_sync: the ranks' weights bitwise the same
 *   report         mbt_open_report, mbt_epoch_report, mbt_summary: the device and data lines, the
 *                  per-epoch lines and the `summary:` line
 *   sim counters   mbt_sim_count_from/_to/_text: the work per step under tests/cudasim
 * Include after megabatch.h. All names are mbt_* (static: each including file gets its own
 * copy); the command line is mb_args.h's. */
#ifndef MB_TRAIN_H
#define MB_TRAIN_H
#include "mb_args.h"
#include "mb_plot.h"
#include "mb_metrics.h" /* the validation metrics' columns */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBT_API static __attribute__((unused)) /* an includer need not use everything */
#else
#define MBT_API static
#endif

// ---- clock ----

MBT_API double mbt_rate(int64_t samples, double seconds) { return seconds > 0 ? (double)samples / seconds : 0; }

// ---- run state ----
// Everything of the loop that a checkpoint must carry besides params and optimizer (saved
// as one blob: its layout is part of the checkpoint format).

typedef struct mbt_run {
    int64_t epoch;                   /* the epoch being trained, 1-based */
    int64_t step, samples, batches;  /* optimizer steps, samples and batches so far */
    int64_t epoch_batches, epoch_n;  /* this epoch so far */
    double epoch_loss_sum;           /* sum of batch loss x count, this epoch */
    mb_loader_pos pos;               /* the next training batch */
    mb_accum acc;                    /* the accumulation window */
    double train_loss, val_loss, baseline;
    double seconds;                  /* training time of this process (not checkpointed) */
    int64_t samples_run;             /* samples trained by this process (not checkpointed) */
} mbt_run;

/* A batch of n samples with mean loss `loss` trained. */
MBT_API void mbt_run_batch(mbt_run *rs, double loss, int64_t n) {
    rs->epoch_loss_sum += loss * (double)n;
    rs->epoch_n += n;
    rs->epoch_batches++;
    rs->batches++;
    rs->samples += n;
}

MBT_API double mbt_run_mean(const mbt_run *rs) { return rs->epoch_n ? rs->epoch_loss_sum / (double)rs->epoch_n : 0; }

/* The epoch's counters back to zero (the run's go on). */
MBT_API void mbt_run_new_epoch(mbt_run *rs) {
    rs->epoch_batches = rs->epoch_n = 0;
    rs->epoch_loss_sum = 0;
}

// ---- logging ----

/* Warnings and info from the library go to stderr; errors are printed once, by main. */
MBT_API void mbt_log_warnings(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    if (level != MB_LOG_ERROR) mb_log_stderr(level, msg, file, line, user);
}

// ---- progress bar ----
// One line on stderr, redrawn in place (\r) at most ten times a second, and only when
// stderr is a terminal and --quiet is off: pipes and CI logs get nothing per batch.
//   epoch 2 [=======>                ] 37/120  412 samples/s  loss 0.9312  scale -  mem 12.3 MB

typedef struct mbt_progress {
    int on;       /* stderr is a terminal and no --quiet */
    double drawn; /* when the line was last drawn (mba_now), 0 at an epoch's start */
    double loss;  /* the last training loss the loop read from the device */
    double scale; /* f16: the last loss scale read (0: none yet, or no scaler) */
} mbt_progress;

/* Device memory in use: the library's live device allocations and, on a GPU, what the
 * driver reports used of the total (the CPU's "device memory" is host RAM: not shown). */
MBT_API void mbt_memory_text(mb_device *dev, char *buf, size_t cap) {
    size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE], total = 0, avail = 0;
    int n = snprintf(buf, cap, "%.1f MB", (double)live / 1e6);
    if (n > 0 && (size_t)n < cap && mb_device_backend(dev) == MB_CUDA && mb_device_memory(dev, &total, &avail) == MB_OK)
        snprintf(buf + n, cap - (size_t)n, " (GPU %.2f of %.2f GB used)", (double)(total - avail) / 1e9,
                 (double)total / 1e9);
}

/* Redraw (throttled; always when final, which also ends the line). The loss and the loss
 * scale are the last values the loop read (p->loss, p->scale; "-" for no scale): drawing never
 * waits for the device. */
MBT_API void mbt_progress_draw(mbt_progress *p, mb_device *dev, const mbt_run *rs, int64_t total, double samples_per_s,
                               int final) {
    if (!p->on) return;
    double now = mba_now(), scale = p->scale;
    if (!final && now - p->drawn < 0.1) return;
    p->drawn = now;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1], sc[32] = "-", mem[96];
    int64_t done = total > 0 ? rs->epoch_batches * WIDTH / total : (int64_t)WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < done ? '=' : i == done ? '>' : ' ';
    bar[WIDTH] = 0;
    if (scale > 0) snprintf(sc, sizeof sc, "%g", scale);
    mbt_memory_text(dev, mem, sizeof mem);
    fprintf(stderr, "\repoch %lld [%s] %lld/%lld  %.0f samples/s  loss %.4f  scale %s  mem %s\033[K",
            (long long)rs->epoch, bar, (long long)rs->epoch_batches, (long long)total, samples_per_s,
            p->loss, sc, mem);
    if (final) fputc('\n', stderr);
}

// ---- metrics ----
// --metrics FILE: one CSV, a row per training batch (kind `step`) and one per epoch (kind
// `epoch`), in the order they happen:
//   kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes,val_hit,...
// then the validation metrics of the epoch's selected weights (mb_metrics.h's columns with the
// prefix val_: the means over horizons, then every horizon's; empty in step rows).
// batch and step: batches and optimizer steps of the run so far (equal with --accum 1);
// loss: the batch's loss (step rows) or the epoch's mean training loss (epoch rows); lr: the
// step's learning rate (step rows); samples_per_s: this epoch so far; device_bytes: live
// device allocations (epoch rows). The rows are flushed before every checkpoint; --resume
// keeps the rows the checkpoint covers, drops any that the interrupted run wrote after it,
// and appends, so the file ends as an uninterrupted run's would (timings aside).

static const char mbt_metrics_header[] =
    "kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n";

/* A row that the checkpoint's run state rs covers (header and foreign lines: no). */
MBT_API int mbt_metrics_row_kept(const char *line, const mbt_run *rs) {
    char kind[8];
    long long epoch, batch;
    if (sscanf(line, "%7[a-z],%lld,%lld", kind, &epoch, &batch) != 3) return 0;
    if (!strcmp(kind, "step")) return batch <= rs->batches;
    return !strcmp(kind, "epoch") && epoch < rs->epoch;
}

/* The whole file as a string (NULL when it cannot be read). */
MBT_API char *mbt_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? (char *)malloc((size_t)n + 1) : NULL;
    if (s) s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

/* Open the metrics file (k: the horizons): new, or on --resume rewritten to the rows rs
 * covers (a last line cut short by a kill has no newline and goes too). */
MBT_API mb_result mbt_metrics_open(FILE **out, const char *path, int resume, const mbt_run *rs, int64_t k) {
    char *old = resume ? mbt_read_text(path) : NULL;
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.*s,", (int)strlen(mbt_metrics_header) - 1, mbt_metrics_header);
        mbm_csv_header(f, k, "val_");
        fputc('\n', f);
    }
    for (char *line = old, *end; f && line && (end = strchr(line, '\n')); line = end + 1) {
        *end = 0;
        if (mbt_metrics_row_kept(line, rs)) fprintf(f, "%s\n", line);
    }
    free(old);
    *out = f;
    return f ? MB_OK : MB_FAIL(NULL, MB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

/* A step row of the metrics: what the loop knew when it queued the step; its loss comes when
 * the device's read of it lands (train_multitf's meter), or at once. */
typedef struct mbt_step_row {
    int64_t epoch, batch, step;
    float lr;
    double samples_per_s;
} mbt_step_row;

MBT_API mbt_step_row mbt_step_row_of(const mbt_run *rs, float lr, double samples_per_s) {
    mbt_step_row row = {rs->epoch, rs->batches, rs->step, lr, samples_per_s};
    return row;
}

MBT_API void mbt_metrics_step(FILE *f, const mbt_step_row *row, float loss, int64_t k) {
    if (!f) return;
    fprintf(f, "step,%lld,%lld,%lld,%.6g,,,%.6g,%.1f,,", (long long)row->epoch, (long long)row->batch,
            (long long)row->step, (double)loss, (double)row->lr, row->samples_per_s);
    mbm_csv_empty(f, k);
    fputc('\n', f);
}

// ---- step losses, read late ----
// A trainer's meter (mb_meter) sums the training loss on the device in its slot 0; after each
// step the trainer queues a read of it (mb_meter_step, no wait) and keeps the step's metrics
// row here, at the read's id, until the read lands: mbt_losses_landed (the on_read of
// mb_meter_step and mb_meter_fold) takes the step's loss as the growth since the read before
// (mb_meter_delta) and writes the row. With several ranks each rank keeps its share of every
// landed step, and mbt_losses_fold_ranks sums them over the ranks at a fold (epoch end,
// checkpoint, every MBT_DP_ROWS steps: the same step on every rank), rank 0 writing the rows.

enum { MBT_METER_DEPTH = 64, MBT_DP_ROWS = 256 };

typedef struct mbt_losses {
    FILE *const *csv;   /* the trainer's metrics file (*csv NULL: none) */
    mb_dist *dist;      /* the ranks (NULL: one) */
    int64_t k;          /* the targets (the metrics' columns) */
    mbt_step_row rows[MBT_METER_DEPTH]; /* the row of meter read id, at id % MBT_METER_DEPTH */
    double last;        /* the loss of the last step whose read landed */
    /* several ranks: the dp_n steps landed since the last fold, their rows and this rank's
     * {loss sum, samples} of each, summed over the ranks at the fold (with the fold's sum) */
    int dp_n;
    mbt_step_row dp_rows[MBT_DP_ROWS];
    double dp_sums[2 * MBT_DP_ROWS + 1];
} mbt_losses;

/* A step's loss landed (read id; user: the mbt_losses): shown, and written with its row. */
MBT_API mb_result mbt_losses_landed(void *user, const mb_meter *meter, int64_t id) {
    mbt_losses *l = (mbt_losses *)user;
    double sum = 0, w = 0;
    MB_TRY(mb_meter_delta(meter, 0, &sum, &w));
    if (w > 0) l->last = sum / w;
    if (mb_dist_size(l->dist) == 1) {
        mbt_metrics_step(*l->csv, &l->rows[id % MBT_METER_DEPTH], (float)l->last, l->k);
        return MB_OK;
    }
    l->dp_rows[l->dp_n] = l->rows[id % MBT_METER_DEPTH];
    l->dp_sums[2 * l->dp_n] = sum;
    l->dp_sums[2 * l->dp_n + 1] = w;
    l->dp_n++;
    return MB_OK;
}

/* Several ranks: the landed steps' losses and the fold's *sum, summed over the ranks in rank
 * order (every rank folds at the same step, with the same steps landed); rank 0 writes the rows. */
MBT_API mb_result mbt_losses_fold_ranks(mbt_losses *l, double *sum) {
    int n = l->dp_n;
    l->dp_sums[2 * n] = *sum;
    MB_TRY(mb_dist_sum(l->dist, l->dp_sums, 2 * n + 1));
    for (int i = 0; i < n; i++) {
        l->last = l->dp_sums[2 * i] / l->dp_sums[2 * i + 1];
        mbt_metrics_step(*l->csv, &l->dp_rows[i], (float)l->last, l->k);
    }
    *sum = l->dp_sums[2 * n];
    l->dp_n = 0;
    return MB_OK;
}

/* An epoch's row: its losses, and the validation metrics (per: k horizons, and their means). */
MBT_API void mbt_metrics_epoch(FILE *f, const mbt_run *rs, double samples_per_s, size_t device_bytes, int64_t k,
                               const mbm_horizon *per, const mbm_mean *mean) {
    if (!f) return;
    fprintf(f, "epoch,%lld,%lld,%lld,%.6g,%.6g,%.6g,,%.1f,%zu,", (long long)rs->epoch, (long long)rs->batches,
            (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, samples_per_s, device_bytes);
    mbm_csv_row(f, k, per, mean);
    fputc('\n', f);
}

/* Close the metrics file (NULL: none), keeping the first error. */
MBT_API mb_result mbt_metrics_close(FILE *f, const char *path, mb_result r) {
    if (f && fclose(f) && r == MB_OK) return MB_FAIL(NULL, MB_ERR_IO, "cannot write %s", path);
    return r;
}

// ---- loss-curve picture ----
// At the end of a run with --metrics: an SVG drawn from the metrics file (so a resumed run
// shows the whole run) by examples/mb_plot.h: the last validation loss against the
// baseline in percent, the epochs' losses on a y range of their own, the batch losses in
// a small panel below (docs/EXAMPLE.md).

/* plot (--plot FILE), or the metrics file's name with .svg for its extension, into buf
 * (check it with mba_writable before training). */
MBT_API mb_result mbt_plot_path(const char *metrics, const char *plot, char *buf, size_t cap) {
    const char *dot = strrchr(metrics, '.'), *slash = strrchr(metrics, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - metrics) : (int)strlen(metrics);
    int n = plot ? snprintf(buf, cap, "%s", plot) : snprintf(buf, cap, "%.*s.svg", stem, metrics);
    if (n < 0 || (size_t)n >= cap) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "picture path too long: %s", buf);
    return MB_OK;
}

MBT_API mb_result mbt_plot_write(const char *path, const char *metrics, const char *title) {
    if (mb_plot_svg(metrics, path, title) != 0) return MB_FAIL(NULL, MB_ERR_IO, "cannot draw %s from %s", path, metrics);
    return MB_OK;
}

// ---- checkpoints ----
// One file (crash-safe: mb_ckpt_write): params, AdamW (m, v, steps), the f16 scaler, any
// state of the model's own (a hook), the run state and the options that shape the run as
// named entries ("options.key": a resume with other options is refused naming the first
// that differs and both values). Saved inside an accumulation window (an epoch's end when its
// batches are not a multiple of --accum), it also holds the gradients summed so far
// ("grads"), so the resumed window sums the same micro-batches. Files of the older format
// held the options as a struct's raw bytes ("options"): read through a layout table where
// that is unambiguous, else refused saying what to do.

typedef struct mbt_ckpt {
    mb_device *dev;
    const char *path;
    mb_params *params;
    mb_adamw *opt;
    mb_scaler *scaler;                                     /* NULL: none */
    const mb_ckpt_key *key;                                /* the options a resume must match */
    int key_n;
    const mb_ckpt_field *legacy;                           /* where older files' "options" bytes */
    int legacy_n;                                          /* held them (NULL: such files refused) */
    size_t legacy_bytes;
    mb_result (*save_state)(mb_ckpt_writer *w, void *ctx); /* the model's own state (NULL: none) */
    mb_result (*load_state)(mb_ckpt_reader *rd, void *ctx);
    void *ctx;
} mbt_ckpt;

MBT_API mb_result mbt_ckpt_fill(mb_ckpt_writer *w, const mbt_ckpt *c, const mbt_run *rs) {
    mbt_run st = *rs;
    st.seconds = 0; /* timings are not state: a resumed run's file must equal an uninterrupted one's */
    st.samples_run = 0;
    MB_TRY(mb_ckpt_add_params(w, c->params));
    MB_TRY(mb_ckpt_add_adamw(w, c->opt));
    if (c->scaler) MB_TRY(mb_ckpt_add_scaler(w, c->scaler));
    if (c->save_state) MB_TRY(c->save_state(w, c->ctx));
    if (!mb_accum_window_start(&rs->acc))
        MB_TRY(mb_ckpt_add(w, "grads", mb_params_grad(c->params), mb_params_total(c->params) * sizeof(float)));
    MB_TRY(mb_ckpt_add(w, "run", &st, sizeof st));
    MB_TRY(mb_ckpt_add_key(w, "options.key", c->key, c->key_n));
    return mb_ckpt_write(w, c->path);
}

/* The metrics rows so far reach their file first: a resume keeps them. */
MBT_API mb_result mbt_ckpt_save(const mbt_ckpt *c, const mbt_run *rs, FILE *metrics) {
    mb_ckpt_writer *w = NULL;
    if (metrics) fflush(metrics);
    MB_TRY(mb_ckpt_writer_create(&w, c->dev));
    mb_result r = mbt_ckpt_fill(w, c, rs);
    mb_ckpt_writer_destroy(w);
    return r;
}

/* The file's options against the run's: named entries, or an older file's struct bytes
 * read through the layout table (mb_ckpt_check_key_bytes); one that cannot be read
 * unambiguously is refused saying so and what to do. Changes nothing. */
MBT_API mb_result mbt_ckpt_check_options(mb_ckpt_reader *rd, const mbt_ckpt *c) {
    if (mb_ckpt_has(rd, "options.key", NULL)) return mb_ckpt_check_key(rd, "options.key", c->key, c->key_n);
    if (!mb_ckpt_has(rd, "options", NULL))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s holds no training options (not a checkpoint of this program)", c->path);
    mb_result r = c->legacy ? mb_ckpt_check_key_bytes(rd, "options", c->legacy_bytes, c->legacy, c->legacy_n, c->key,
                                                      c->key_n)
                            : MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "this build reads no options of the older format");
    if (r != MB_ERR_UNSUPPORTED) return r;
    char why[MB_MAX_ERROR];
    snprintf(why, sizeof why, "%s", mb_last_error());
    return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "%s is a checkpoint of an older format, whose options are the raw bytes of "
                   "a struct that this build cannot read unambiguously (%s): resume it with the build that wrote it, "
                   "or start again without --resume", c->path, why);
}

MBT_API mb_result mbt_ckpt_get(mb_ckpt_reader *rd, const mbt_ckpt *c, mbt_run *rs) {
    mbt_run st;
    MB_TRY(mbt_ckpt_check_options(rd, c));
    MB_TRY(mb_ckpt_get(rd, "run", &st, sizeof st));
    int mid = !mb_accum_window_start(&st.acc);
    if (mid && !mb_ckpt_has(rd, "grads", NULL)) /* written mid-window by a build before "grads" */
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s was saved inside an accumulation window without its gradients "
                       "(an older build): resume from a checkpoint at a window's end, or start again", c->path);
    MB_TRY(mb_ckpt_load_params(rd, c->params));
    MB_TRY(mb_ckpt_load_adamw(rd, c->opt));
    if (c->scaler) MB_TRY(mb_ckpt_load_scaler(rd, c->scaler));
    if (c->load_state) MB_TRY(c->load_state(rd, c->ctx));
    if (mid) MB_TRY(mb_ckpt_get(rd, "grads", mb_params_grad(c->params), mb_params_total(c->params) * sizeof(float)));
    *rs = st;
    return MB_OK;
}

MBT_API mb_result mbt_ckpt_load(const mbt_ckpt *c, mbt_run *rs) {
    mb_ckpt_reader *rd = NULL;
    MB_TRY(mb_ckpt_open(&rd, c->dev, c->path));
    mb_result r = mbt_ckpt_get(rd, c, rs);
    mb_ckpt_close(rd);
    return r;
}

// ---- checks before the work ----
// What a training program checks before the device and the data lines (docs/RELIABILITY.md):
// the output-path rule (mb_args.h's mba_outputs_ok), a checkpoint to resume (read whole and
// verified: magic, size, CRC), a weights file to start from (a safetensors file), and the
// batch against the data.

/* --resume's checkpoint (path) and --init's weights file (init; NULL: none) can be read, on
 * the host, before any device: MB_OK, or the error set (in the user's words). */
MBT_API mb_result mbt_inputs_check(const char *resume_path, const char *init) {
    if (resume_path) {
        mb_ckpt_reader *rd = NULL;
        mb_result r = mb_ckpt_open(&rd, NULL, resume_path);
        mb_ckpt_close(rd);
        if (r != MB_OK) {
            char why[MB_MAX_ERROR];
            snprintf(why, sizeof why, "%s", mba_user_text(mb_last_error()));
            return MB_FAIL(NULL, r, "--resume: %s", why);
        }
    }
    if (init) {
        mb_st_file *f = NULL;
        mb_result r = mb_st_open(&f, init);
        mb_st_close(f);
        if (r != MB_OK) {
            char why[MB_MAX_ERROR];
            snprintf(why, sizeof why, "%s", mba_user_text(mb_last_error()));
            return MB_FAIL(NULL, r, "--init: %s", why);
        }
    }
    return MB_OK;
}

/* r from building the model for a batch: out of memory is said with the flag that sets it
 * (what the user can change); anything else as it is. */
MBT_API mb_result mbt_memory_hint(mb_result r, int64_t batch) {
    if (r != MB_ERR_OUT_OF_MEMORY) return r;
    char why[MB_MAX_ERROR];
    snprintf(why, sizeof why, "%s", mba_user_text(mb_last_error()));
    return MB_FAIL(NULL, r, "not enough memory for --batch %lld (%s): use a smaller --batch", (long long)batch, why);
}

/* The batch no bigger than the training data's n samples (a batch is never fuller: memory
 * for more is waste, and a huge --batch on a small file asked for gigabytes). Says so on
 * stderr unless quiet. */
MBT_API void mbt_clamp_batch(int64_t *batch, int64_t n, int quiet) {
    if (n < 1 || *batch <= n) return;
    if (!quiet) fprintf(stderr, "note: --batch %lld is more than the %lld training samples: batch %lld\n",
                        (long long)*batch, (long long)n, (long long)n);
    *batch = n;
}

// ---- data parallel ----

/* Several ranks (d): their weights p bitwise the same (after each epoch), else an error. */
MBT_API mb_result mbt_ranks_in_sync(mb_dist *d, mb_params *p) {
    int same = 1;
    if (mb_dist_size(d) > 1) MB_TRY(mb_dist_check_sync(d, p, &same));
    return same ? MB_OK : MB_FAIL(NULL, MB_ERR_CORRUPT, "the ranks' weights differ (rank %d)", mb_dist_rank(d));
}

// ---- report ----

/* The lines a run opens with, once every check is done: the ranks (world > 1), the device, the
 * data (source: its name; segments: the model's) and the parameters, and where a resume starts
 * (resumed: the checkpoint, NULL: none). */
MBT_API void mbt_open_report(mb_device *dev, const char *source, const mb_dataset_meta *mt, int segments,
                             size_t params, int world, const char *resumed, const mbt_run *rs) {
    if (world > 1) printf("data parallel: %d ranks\n", world);
    printf("device: %s\ndata: %s N=%lld T=%lld F=%lld K=%lld, %d segments; params: %zu floats\n", mb_device_name(dev),
           source, (long long)mt->n, (long long)mt->t, (long long)mt->f, (long long)mt->k, segments, params);
    if (resumed) printf("resumed from %s: epoch %lld, step %lld\n", resumed, (long long)rs->epoch, (long long)rs->step);
}

/* The epoch's line (extra: appended after the losses, "" for none), the f16 loss scale, and
 * the seeds' leak check: a warning when the library's live device memory grew by more than
 * 100 MB since *live0 (then updated). */
MBT_API void mbt_epoch_report(mb_device *dev, mb_scaler *scaler, const mbt_run *rs, double samples_per_s,
                              size_t *live0, const char *extra) {
    size_t live = mb_device_mem_stats(dev).live[MB_MEM_DEVICE];
    char mem[96];
    mb_scaler_state sst;
    mbt_memory_text(dev, mem, sizeof mem);
    printf("epoch %lld: steps %lld train_loss %.5f val_loss %.5f baseline %.5f%s  %.0f samples/s  device memory %s\n",
           (long long)rs->epoch, (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline, extra, samples_per_s,
           mem);
    if (scaler && mb_scaler_get(scaler, &sst) == MB_OK) printf("  f16 loss scale %g\n", (double)sst.scale);
    if (live > *live0 + (size_t)100e6)
        printf("warning: device memory grew by %.0f MB this epoch (leak?)\n", (double)(live - *live0) / 1e6);
    *live0 = live;
}

// ---- simulator counters ----
// Under the CUDA simulator (tests/cudasim) the summary line gains the work per training step:
// a trainer calls mbt_sim_count_from() where its counted steps start, mbt_sim_count_to(n) after
// n of them (before any host sync that is not theirs), and appends mbt_sim_count_text(). The
// simulator build brings the counting (tests/cudasim/cudasim_train.h, which defines
// MBT_SIM_COUNT); elsewhere these count nothing and the text is "".
#ifndef MBT_SIM_COUNT
MBT_API void mbt_sim_count_from(void) {}
MBT_API void mbt_sim_count_to(int64_t steps) { (void)steps; }
MBT_API const char *mbt_sim_count_text(void) { return ""; }
#endif

/* The last line, for scripts (samples_per_s over this process's training time); extra: appended ("" for none). */
MBT_API void mbt_summary(const mbt_run *rs, int world, const char *extra) {
    printf("summary: epochs=%lld steps=%lld train_loss=%.5f val_loss=%.5f baseline_val_loss=%.5f samples_per_s=%.1f "
           "world=%d%s\n", (long long)rs->epoch, (long long)rs->step, rs->train_loss, rs->val_loss, rs->baseline,
           mbt_rate(rs->samples_run, rs->seconds), world, extra);
}

#endif /* MB_TRAIN_H */
