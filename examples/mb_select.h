/* mb_select.h - choosing the model to trade, for a training loop (docs/TRADING.md, "Choosing
 * the model to trade"): weight averaging (--ema DECAY, --swa-start EPOCH: the library's mb_avg),
 * the best epoch (--keep-best) and early stopping (--patience N), and their part of a
 * checkpoint, so a resumed run keeps them bitwise.
 *
 *   mbs_open(&s, params, &cfg)             after the optimizer
 *   each optimizer step:  mbs_after_step(&s, opt)          (EMA; queued, no host sync)
 *   each epoch's end:     mbs_epoch_end(&s, epoch)         (SWA from cfg.swa_start)
 *                         validate the live weights; if mbs_averaging(&s): mbs_swap, validate, mbs_swap
 *                         mbs_consider(&s, epoch, loss)    loss: the selected weights' (mbs_selected_loss)
 *   at the end:           mbs_final_weights(&s, last_epoch, what, cap)   the weights to export, now live
 *
 * The selected weights of an epoch are those an export would write then: the averaged ones
 * when an average exists, else the live ones; --keep-best keeps the epoch whose selected
 * weights had the lowest validation loss (a device copy: one more flat buffer), and --patience
 * stops after N epochs without a lower one. Include after megabatch.h. Names: mbs_*. */
#ifndef MB_SELECT_H
#define MB_SELECT_H
#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBS_API static __attribute__((unused))
#else
#define MBS_API static
#endif

typedef struct mbs_config {
    float ema;        /* EMA decay in (0, 1); 0: none */
    int swa_start;    /* SWA: the equal-weight mean of the weights at the end of epochs swa_start.. (1-based); 0: none */
    int keep_best;    /* export the best epoch's selected weights */
    int patience;     /* stop after this many epochs without a lower validation loss; 0: never */
} mbs_config;

typedef struct mbs_state {        /* the part a checkpoint carries ("select.state") */
    int64_t best_epoch;           /* 0: none yet */
    double best_loss;             /* the selected weights' validation loss at best_epoch */
    int64_t since_best;           /* epochs since best_epoch */
} mbs_state;

typedef struct mbs_select {
    mbs_config cfg;
    mb_params *params;
    mb_avg *avg;      /* --ema / --swa-start, else NULL */
    float *best;      /* --keep-best: the best epoch's selected weights (device), else NULL */
    mbs_state st;
    int stop;         /* --patience ran out */
} mbs_select;

MBS_API void mbs_close(mbs_select *s) {
    if (s->params) mb_free(mb_params_device(s->params), s->best);
    mb_avg_destroy(s->avg);
    memset(s, 0, sizeof *s);
}

MBS_API mb_result mbs_open(mbs_select *s, mb_params *p, const mbs_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->params = p;
    if (cfg->ema > 0 || cfg->swa_start > 0) {
        mb_avg_config ac = {cfg->ema > 0 ? (double)cfg->ema : 0.0, cfg->ema > 0 ? MB_AVG_EMA : MB_AVG_SWA};
        MB_TRY(mb_avg_create(&s->avg, p, &ac));
    }
    if (cfg->keep_best)
        MB_TRY(mb_alloc(mb_params_device(p), MB_MEM_DEVICE, mb_params_total(p) * sizeof(float), (void **)&s->best));
    return MB_OK;
}

/* After an optimizer step (inside a captured step: one device pass, skipped with the step). */
MBS_API mb_result mbs_after_step(mbs_select *s, const mb_adamw *opt) {
    return s->avg && s->cfg.ema > 0 ? mb_avg_update(s->avg, opt) : MB_OK;
}

/* At the end of epoch `epoch` (1-based), before validation: SWA's update from swa_start on. */
MBS_API mb_result mbs_epoch_end(mbs_select *s, int64_t epoch) {
    return s->avg && s->cfg.swa_start > 0 && epoch >= s->cfg.swa_start ? mb_avg_update(s->avg, NULL) : MB_OK;
}

/* 1 when an average exists at the end of epoch `epoch` (EMA: from the first step on). */
MBS_API int mbs_averaging(const mbs_select *s, int64_t epoch) {
    return s->avg && (s->cfg.ema > 0 || epoch >= s->cfg.swa_start);
}

MBS_API mb_result mbs_swap(mbs_select *s) { return mb_avg_swap(s->avg); }

/* The loss that selects: the averaged weights' when averaging at this epoch, else the live ones'. */
MBS_API double mbs_selected_loss(const mbs_select *s, int64_t epoch, double live, double averaged) {
    return mbs_averaging(s, epoch) ? averaged : live;
}

/* The epoch's selected loss: a new best (kept: a device copy of the selected weights), or one
 * more epoch without; s->stop when --patience ran out. */
MBS_API mb_result mbs_consider(mbs_select *s, int64_t epoch, double loss) {
    if (s->st.best_epoch == 0 || loss < s->st.best_loss) {
        s->st.best_epoch = epoch;
        s->st.best_loss = loss;
        s->st.since_best = 0;
        if (s->best) {
            const float *src = mbs_averaging(s, epoch) ? mb_avg_data(s->avg) : mb_params_data(s->params);
            MB_TRY(mb_copy(mb_params_device(s->params), MB_STREAM_COMPUTE, s->best, src,
                           mb_params_total(s->params) * sizeof(float)));
        }
    } else {
        s->st.since_best++;
    }
    s->stop = s->cfg.patience > 0 && s->st.since_best >= s->cfg.patience;
    return MB_OK;
}

/* After training: the weights to export made live (training is over), and what they are, for
 * the files' metadata ("weights"): the best epoch's, the average's, or the last epoch's. */
MBS_API mb_result mbs_final_weights(mbs_select *s, int64_t last_epoch, char *what, size_t cap) {
    mb_device *dev = mb_params_device(s->params);
    size_t bytes = mb_params_total(s->params) * sizeof(float);
    const char *avg = s->cfg.ema > 0 ? "EMA" : "SWA";
    int64_t n = 0;
    if (s->avg) MB_TRY(mb_avg_count(s->avg, &n));
    if (s->best && s->st.best_epoch > 0) {
        MB_TRY(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_data(s->params), s->best, bytes));
        snprintf(what, cap, "best epoch %lld of %lld (val_loss %.9g)%s%s", (long long)s->st.best_epoch,
                 (long long)last_epoch, s->st.best_loss, mbs_averaging(s, s->st.best_epoch) ? ", averaged " : "",
                 mbs_averaging(s, s->st.best_epoch) ? avg : "");
    } else if (s->avg && n > 0) {
        MB_TRY(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_data(s->params), mb_avg_data(s->avg), bytes));
        if (s->cfg.ema > 0) snprintf(what, cap, "EMA decay %g over %lld steps", (double)s->cfg.ema, (long long)n);
        else snprintf(what, cap, "SWA over epochs %d..%lld (%lld averaged)", s->cfg.swa_start, (long long)last_epoch, (long long)n);
    } else {
        snprintf(what, cap, "last epoch %lld", (long long)last_epoch);
    }
    return mb_sync(dev, MB_STREAM_COMPUTE);
}

/* The `summary:` line's part (mb_train.h's mbt_summary): " best_epoch=E best_val_loss=L" and,
 * with an average (averaged), " avg_val_loss=A" (avg_loss: its last validation loss). What
 * snprintf returns. */
MBS_API int mbs_summary_text(char *buf, size_t cap, const mbs_state *st, int averaged, double avg_loss) {
    int n = snprintf(buf, cap, " best_epoch=%lld best_val_loss=%.5f", (long long)st->best_epoch, st->best_loss);
    if (averaged && n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " avg_val_loss=%.5f", avg_loss);
    return n;
}

/* Checkpoint: the average, the best weights and the state, so a resume continues them bitwise. */
MBS_API mb_result mbs_save(mb_ckpt_writer *w, const mbs_select *s) {
    if (s->avg) MB_TRY(mb_ckpt_add_avg(w, s->avg));
    if (s->best) MB_TRY(mb_ckpt_add(w, "select.best", s->best, mb_params_total(s->params) * sizeof(float)));
    return mb_ckpt_add(w, "select.state", &s->st, sizeof s->st);
}

/* A file without "select.state" (written before it existed, with none of these options: the
 * caller's options key says so) leaves the state at its start. */
MBS_API mb_result mbs_load(mb_ckpt_reader *r, mbs_select *s) {
    if (!mb_ckpt_has(r, "select.state", NULL) && !s->avg && !s->best) return MB_OK;
    MB_TRY(mb_ckpt_get(r, "select.state", &s->st, sizeof s->st));
    if (s->avg) MB_TRY(mb_ckpt_load_avg(r, s->avg));
    if (s->best) MB_TRY(mb_ckpt_get(r, "select.best", s->best, mb_params_total(s->params) * sizeof(float)));
    s->stop = s->cfg.patience > 0 && s->st.since_best >= s->cfg.patience;
    return MB_OK;
}

#endif /* MB_SELECT_H */
