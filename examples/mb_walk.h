/* mb_walk.h - walk-forward evaluation on one prepared file (docs/EXAMPLE.md, "Walk-forward
 * evaluation"): the parts of examples/train_multitf.c's --walk-forward K [--wf-window W]
 * that are not the training loop. In reading order:
 *   times       mbw_read_times: the file's `times` dataset (int64 seconds per sample), read
 *               in a child process as the probe reads a file (docs/RELIABILITY.md)
 *   plan        mbw_plan_make: K folds in time order over the file, each validating on its
 *               block and training only on samples before it (expanding, or a rolling window
 *               of W samples), purged of every sample whose target horizon reaches the block
 *   fold data   mbw_fold_load: a fold's training and validation samples in host memory,
 *               re-normalised with statistics of its training part only, as in-memory
 *               datasets that a trainer takes like files; mbw_fold_spec: the fold's
 *               normalisation into a model spec, so an exported fold model carries its own
 *   table       mbw_print_plan, mbw_print_fold, mbw_print_table: a line per fold, then each
 *               fold's losses and metrics with their mean, spread and range
 *   the walk    mbw_run: all of the above in one process, a fold's training the caller's
 * Every fold is independent of the others (its plan entry and its file ranges): a program may
 * run any subset of them, e.g. one list of folds per rank (mbw_fold_on_rank), the ranks' rows
 * then summed into every rank's table (mbw_scores_gather).
 *
 * Use (one file, K folds; errors: MB_TRY):
 *   mba_open_data(path, 1, &ds);                       the file, probed (mb_args.h)
 *   mbw_read_times(path, mb_dataset_info(ds)->n, &times); before threads, MPI and loaders
 *   mbw_plan_make(&plan, times, n, &cfg);              cfg: folds, window, min_samples = batch, targets = K
 *   for each fold k (any subset, any order):
 *       mbw_fold_load(&fd, ds, &plan, k);              fd.train, fd.val: datasets for the loaders
 *       spec = mtf_spec_of_data(mb_dataset_info(fd.train), ...); mbw_fold_spec(&fd, &spec);
 *       train, evaluate, export; mbw_print_fold(...); mbw_fold_free(&fd);
 *   mbw_print_table(stdout, &plan, scores, names, n_metrics);
 *
 * Include after megabatch.h, in the file with MEGABATCH_IMPLEMENTATION (MB_FAIL), and after
 * multitf.h for mbw_fold_spec. All names are mbw_* (static: each including file gets its own
 * copy). C11 and C++ (nvcc compiles the example as C++).
 */
#ifndef MB_WALK_H
#define MB_WALK_H

#include "mb_args.h" /* mba_open_data (mbw_run) */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBW_API static __attribute__((unused)) /* an includer need not use everything */
#else
#define MBW_API static
#endif

#define MBW_MAX_FOLDS 64       /* folds of one plan */
#define MBW_MAX_METRICS 16     /* metric columns of the table */
#define MBW_BARS_PER_TARGET 5  /* prepare's targets: horizons 5, 10, ..., 5K M1 bars */
#define MBW_BAR_SECONDS 60     /* M1 bars: at least this far apart (markets have gaps) */

// ---- times ----
// The `times` dataset prepare writes beside `features` and `targets`: [N] int64, the close time
// (seconds) of each sample's last M1 bar, increasing. The library reads only features and
// targets, so this reads it with HDF5 itself, in a forked child as mb_dataset_probe does: a
// hostile file that crashes or hangs HDF5 here fails with an error, and this process makes no
// HDF5 call on the dataset. Call it before any thread of this process is inside HDF5 (before
// loaders start: the child would inherit a held lock and time out).

#define MBW_TIMES_TIMEOUT_S 10

typedef struct mbw__times_msg { int32_t code; int64_t n; char text[240]; } mbw__times_msg;

#ifndef MEGABATCH_NO_HDF5
/* In the child (or in this process where there is no fork): `times` of path, checked: rank 1,
 * an integer type of at most 8 bytes, n values (n: the features' N). */
static int64_t *mbw__times_h5(const char *path, int64_t n, mbw__times_msg *msg) {
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int64_t *v = NULL;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f < 0 || H5Lexists(f, "times", H5P_DEFAULT) <= 0 ? -1 : H5Dopen2(f, "times", H5P_DEFAULT);
    hid_t sp = d < 0 ? -1 : H5Dget_space(d), ty = d < 0 ? -1 : H5Dget_type(d);
    hsize_t dim = 0;
    int rank = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    if (rank == 1) H5Sget_simple_extent_dims(sp, &dim, NULL);
    msg->code = MB_ERR_FORMAT;
    if (f < 0) snprintf(msg->text, sizeof msg->text, "%s: cannot open the file", path);
    else if (d < 0) snprintf(msg->text, sizeof msg->text, "%s: no dataset 'times' (walk-forward needs each sample's time: "
                             "the files build/prepare writes have it)", path);
    else if (rank != 1 || ty < 0 || H5Tget_class(ty) != H5T_INTEGER || H5Tget_size(ty) > 8)
        snprintf(msg->text, sizeof msg->text, "%s: dataset 'times' must be [N] integers (seconds)", path);
    else if ((int64_t)dim != n)
        snprintf(msg->text, sizeof msg->text, "%s: dataset 'times' has %llu values for %lld samples", path,
                 (unsigned long long)dim, (long long)n);
    else if (!(v = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof *v)))
        msg->code = MB_ERR_OUT_OF_MEMORY, snprintf(msg->text, sizeof msg->text, "no memory for %lld times", (long long)n);
    else if (H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        msg->code = MB_ERR_IO, snprintf(msg->text, sizeof msg->text, "%s: reading dataset 'times' failed", path);
        free(v);
        v = NULL;
    } else msg->code = MB_OK, msg->n = n;
    if (ty >= 0) H5Tclose(ty);
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    if (f >= 0) H5Fclose(f);
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    return v;
}
#endif

#if !defined(MEGABATCH_NO_HDF5) && (defined(__unix__) || defined(__APPLE__))
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mbw__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read exactly len bytes from fd within the deadline (ms left in *ms). 1, or 0. */
static int mbw__read_all(int fd, void *buf, size_t len, int *ms) {
    char *p = (char *)buf;
    while (len) {
        struct pollfd pf = {fd, POLLIN, 0};
        double t0 = mbw__now();
        int r = poll(&pf, 1, *ms);
        *ms -= (int)((mbw__now() - t0) * 1000);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || *ms < 0) return 0;
        ssize_t got = read(fd, p, len);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        p += got;
        len -= (size_t)got;
    }
    return 1;
}

static void mbw__write_all(int fd, const void *buf, size_t len) {
    const char *p = (const char *)buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        len -= (size_t)w;
    }
}
#endif

/* The `times` of the file at path (n values: the features' N, from mb_dataset_info) into
 * *out (malloc'd; free it). Checks they increase strictly. MB_ERR_FORMAT naming the file for
 * a missing or malformed dataset, or when HDF5 crashed or hung reading it. */
MBW_API mb_result mbw_read_times(const char *path, int64_t n, int64_t **out) {
    *out = NULL;
    if (!path || n < 1) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbw_read_times: no path, or n < 1");
#ifdef MEGABATCH_NO_HDF5
    return MB_FAIL(NULL, MB_ERR_UNSUPPORTED, "walk-forward reads the file's 'times': this build has no HDF5");
#else
    mbw__times_msg msg;
    memset(&msg, 0, sizeof msg);
    int64_t *v = NULL;
#if defined(__unix__) || defined(__APPLE__)
    int fds[2];
    if (pipe(fds) != 0) return MB_FAIL(NULL, MB_ERR_IO, "walk-forward: pipe: %s", strerror(errno));
    fflush(NULL); /* the child leaves with _exit: nothing buffered twice */
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]); close(fds[1]);
        return MB_FAIL(NULL, MB_ERR_IO, "walk-forward: fork: %s", strerror(errno));
    }
    if (pid == 0) { /* the child: read, send, leave */
        /* the host's crash handlers (test frameworks, ASan) must not run on in the child, and
         * what HDF5 prints goes nowhere (as the library's probe) */
        const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) { dup2(dn, 1); dup2(dn, 2); close(dn); }
        close(fds[0]);
        int64_t *cv = mbw__times_h5(path, n, &msg);
        mbw__write_all(fds[1], &msg, sizeof msg);
        if (cv) mbw__write_all(fds[1], cv, (size_t)n * sizeof *cv);
        _exit(0);
    }
    close(fds[1]);
    int ms = MBW_TIMES_TIMEOUT_S * 1000, got = mbw__read_all(fds[0], &msg, sizeof msg, &ms);
    if (got && msg.code == MB_OK) {
        v = msg.n == n ? (int64_t *)malloc((size_t)n * sizeof *v) : NULL;
        got = v && mbw__read_all(fds[0], v, (size_t)n * sizeof *v, &ms);
    }
    close(fds[0]);
    int status = 0;
    if (!got) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (!got) {
        free(v);
        if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)
            return MB_FAIL(NULL, MB_ERR_FORMAT, "HDF5 crashed while reading 'times' of '%s' (signal %d)", path,
                           WTERMSIG(status));
        return MB_FAIL(NULL, MB_ERR_FORMAT, "reading 'times' of '%s' failed or timed out (%d s)", path,
                       MBW_TIMES_TIMEOUT_S);
    }
#else
    v = mbw__times_h5(path, n, &msg);
#endif
    msg.text[sizeof msg.text - 1] = 0;
    if (msg.code != MB_OK) { free(v); return MB_FAIL(NULL, (mb_result)msg.code, "%s", msg.text); }
    for (int64_t i = 1; i < n; i++)
        if (v[i] <= v[i - 1]) {
            mb_result r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: 'times' must increase: sample %lld at %lld, sample %lld at %lld",
                                  path, (long long)(i - 1), (long long)v[i - 1], (long long)i, (long long)v[i]);
            free(v);
            return r;
        }
    *out = v;
    return MB_OK;
#endif
}

// ---- plan ----
// The file's N samples (in time order) are cut into K + 1 contiguous blocks, block j starting
// at sample j N / (K + 1) (their sizes differ by at most one). Block 0 only ever trains;
// fold k (1..K) validates on block k and trains on the samples before it, all of them
// (expanding) or the last W (rolling), minus the purge:
//   the bar rule (exact): sample p trains for a block starting at sample q only when
//     p * S + H < q * S, i.e. p <= q - 1 - floor(H / S): the last floor(H / S) samples before
//     the block are left out. H = 5 K M1 bars (the longest target's horizon), S = the M1 bars
//     between samples (prepare's --stride): a target ends at bar p S + H, before the block's
//     first bar. It is prepare's own rule between its train and val files.
//   the time rule: times[p] + 60 H < times[q]. Bars are at least 60 s apart, so it follows from
//     the bar rule; it is a second guard when S is not known (below).
// S: given, or inferred as the smallest time step between samples / 60 s. Samples are S bars
// apart and bars at least 60 s apart (weekends and missing minutes only widen a step), so the
// smallest step is 60 S exactly as soon as one pair of neighbouring samples has no missing
// minute between them (every weekday pair in prepare's synthetic data; nearly every pair in
// real M1 data). A file with a gap in every step would infer a larger S, a smaller purge: give
// S then. Each validation block and each training part (after the purge and the window) must
// hold at least min_samples (e.g. a batch), else the plan is refused, naming the most folds
// the file allows.

typedef struct mbw_config {
    int folds;            /* K >= 2 */
    int64_t window;       /* rolling: train on at most the last W samples before the purge; 0: expanding */
    int64_t min_samples;  /* each validation block and each training part holds at least this (>= 1) */
    int64_t targets;      /* the file's K targets: the purge covers MBW_BARS_PER_TARGET * targets bars */
    int64_t stride;       /* M1 bars between samples; 0: inferred from the times */
} mbw_config;

typedef struct mbw_fold {
    int64_t train_begin, train_end; /* training samples [begin, end) */
    int64_t purged;                 /* samples [train_end, val_begin) left out by the purge */
    int64_t val_begin, val_end;     /* validation samples [begin, end): block k + 1 of K + 1 */
    int64_t train_t0, train_t1, val_t0, val_t1; /* times of the first and the last sample of each part */
} mbw_fold;

typedef struct mbw_plan {
    int folds;
    int64_t n;                 /* samples in the file */
    int64_t stride;            /* M1 bars between samples (given or inferred) */
    int stride_inferred;       /* 1: from the smallest time step */
    int64_t horizon_bars;      /* H = MBW_BARS_PER_TARGET * targets */
    int64_t purge_samples;     /* floor(H / S): the bar rule's samples left out before each block */
    int64_t window;            /* 0: expanding */
    int64_t min_samples;
    mbw_fold fold[MBW_MAX_FOLDS];
} mbw_plan;

/* The folds of plan p for K folds (p's other fields set); 0 when each block and each training
 * part holds at least p->min_samples, else 1 with *why set. */
static int mbw__cut(mbw_plan *p, const int64_t *times, int K, const char **why) {
    int64_t n = p->n;
    p->folds = K;
    for (int k = 0; k < K; k++) {
        mbw_fold *f = &p->fold[k];
        f->val_begin = (int64_t)(k + 1) * n / (K + 1);
        f->val_end = (int64_t)(k + 2) * n / (K + 1);
        int64_t q = f->val_begin, e = q - p->purge_samples;
        if (e < 0) e = 0;
        while (e > 0 && times[e - 1] + MBW_BAR_SECONDS * p->horizon_bars >= times[q]) e--; /* the time rule */
        f->train_end = e;
        f->train_begin = p->window && e > p->window ? e - p->window : 0;
        f->purged = q - e;
        if (f->val_end - f->val_begin < p->min_samples) return *why = "validation block", 1;
        if (f->train_end - f->train_begin < p->min_samples) return *why = "training part", 1;
        f->train_t0 = times[f->train_begin]; f->train_t1 = times[f->train_end - 1];
        f->val_t0 = times[f->val_begin]; f->val_t1 = times[f->val_end - 1];
    }
    return 0;
}

/* The plan for the n samples at times (increasing: mbw_read_times) and config c. Refused
 * with MB_ERR_INVALID_ARG and a message in the flags' words (--walk-forward, --wf-window):
 * fewer than 2 folds, more than MBW_MAX_FOLDS, a window under min_samples, or more folds
 * than the samples allow. */
MBW_API mb_result mbw_plan_make(mbw_plan *p, const int64_t *times, int64_t n, const mbw_config *c) {
    memset(p, 0, sizeof *p);
    if (!times || !c || n < 1 || c->min_samples < 1 || c->targets < 1 || c->stride < 0 || c->window < 0)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbw_plan_make: no times, n < 1, min_samples < 1, targets < 1, "
                       "stride < 0 or window < 0");
    if (c->folds < 2 || c->folds > MBW_MAX_FOLDS)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "--walk-forward %d: give 2 to %d folds (each fold validates on "
                       "its own block after the ones before it)", c->folds, MBW_MAX_FOLDS);
    if (c->window && c->window < c->min_samples)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "--wf-window %lld: a training window needs at least %lld samples "
                       "(a batch)", (long long)c->window, (long long)c->min_samples);
    int64_t step = INT64_MAX;
    for (int64_t i = 1; i < n; i++) {
        if (times[i] <= times[i - 1])
            return MB_FAIL(NULL, MB_ERR_FORMAT, "walk-forward: the samples' times must increase (sample %lld)",
                           (long long)i);
        if (times[i] - times[i - 1] < step) step = times[i] - times[i - 1];
    }
    p->n = n; p->window = c->window; p->min_samples = c->min_samples;
    p->horizon_bars = MBW_BARS_PER_TARGET * c->targets;
    p->stride = c->stride;
    if (!p->stride && n > 1 && step >= MBW_BAR_SECONDS) p->stride = step / MBW_BAR_SECONDS, p->stride_inferred = 1;
    if (!p->stride)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "walk-forward: cannot infer the samples' stride: %s",
                       n < 2 ? "a single sample" : "two samples are under 60 s apart (not M1 bars)");
    p->purge_samples = p->horizon_bars / p->stride;
    const char *why = NULL;
    if (!mbw__cut(p, times, c->folds, &why)) return MB_OK;
    int most = 0;
    mbw_plan q = *p;
    for (int k = c->folds - 1; k >= 2 && !most; k--)
        if (!mbw__cut(&q, times, k, &why)) most = k;
    if (!most)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "--walk-forward %d: %lld samples are too few for even 2 folds: each of "
                       "the K + 1 blocks of the file and each fold's training part (after a purge of %lld samples) "
                       "needs at least %lld samples", c->folds, (long long)n, (long long)p->purge_samples,
                       (long long)c->min_samples);
    return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "--walk-forward %d: %lld samples allow at most %d folds (the file is cut "
                   "into K + 1 blocks; each block and each fold's training part, after a purge of %lld samples%s, "
                   "needs at least %lld samples)", c->folds, (long long)n, most, (long long)p->purge_samples,
                   c->window ? " and the window" : "", (long long)c->min_samples);
}

// ---- fold data ----
// prepare stores features already normalised, x = (raw - mean) / std per (timeframe, feature),
// with mean and std fitted on the bars of its whole training period: inside one file, every
// fold but the last would see statistics of its future. So each fold fits its own, on its
// training samples only: the mean mu and the (population) std sigma of the stored values of
// each (segment, feature) over every row of that segment of every training sample, and
// standardises its training AND validation samples with them: (x - mu) / sigma. Since x is an
// affine map of raw, that is fitting raw statistics on the training part: raw mean
// mean + std mu, raw std std sigma (recorded: mean, std below, what the live predictor applies
// to raw features). Rows are weighted by how often a bar appears in the training windows,
// where prepare weighs each bar once: close, and from the past either way. The targets alike:
// stored y = return / target_scale; the fold divides them by rho, their rms over its training
// samples (all horizons; prepare's rule), and records target_scale rho. A std under 1e-10
// counts as 1 (prepare's rule).
// Memory: a fold holds its training and validation samples in host memory, (train + val) *
// (T F + K) * 4 bytes (T 1104, F 12: 53 KB a sample; 10 000 samples 530 MB), freed by
// mbw_fold_free; the trainer's loaders then copy them to the device as they would a file's.

typedef struct mbw_fold_data {
    int fold;                    /* its index in the plan */
    int64_t n_train, n_val, t, f, k;
    int nseg;                    /* the segments the statistics are per (1 when the file has none) */
    float *train_x, *train_y;    /* (n_train, t, f), (n_train, k): normalised with the fold's statistics */
    float *val_x, *val_y;        /* (n_val, t, f), (n_val, k): the same statistics */
    float *stored_mean, *stored_std; /* (nseg, f): mu, sigma of the stored features over the training part */
    double target_rms;           /* rho: the stored targets' rms over the training part */
    int file_norm;               /* the file carried prepare's feature_mean/feature_std */
    float *mean, *std;           /* (nseg, f): the fold's normalisation of raw features (prepare's form) */
    float target_scale;          /* the fold's: raw return = target * target_scale */
    mb_dataset *train, *val;     /* in-memory datasets over the arrays, with the file's segments */
} mbw_fold_data;

MBW_API void mbw_fold_free(mbw_fold_data *d) {
    mb_dataset_close(d->train);
    mb_dataset_close(d->val);
    free(d->train_x); free(d->train_y); free(d->val_x); free(d->val_y);
    free(d->stored_mean); free(d->stored_std); free(d->mean); free(d->std);
    memset(d, 0, sizeof *d);
}

/* An in-memory dataset over (x, y) that reads as the file does: mb_dataset_open_memory knows
 * no segments, and a trainer reads them from mb_dataset_info (mtf_spec_of_data). The meta is
 * the dataset's own (the pointer is const for callers only): set once here, before any loader
 * opens on it. */
static mb_result mbw__open_memory(mb_dataset **out, float *x, float *y, int64_t n, const mb_dataset_meta *like,
                                  const char *what, int k) {
    MB_TRY(mb_dataset_open_memory(out, x, y, n, like->t, like->f, like->k, NULL));
    mb_dataset_meta *m = (mb_dataset_meta *)mb_dataset_info(*out);
    m->segments = like->segments;
    memcpy(m->segment_len, like->segment_len, sizeof m->segment_len);
    memcpy(m->segment_name, like->segment_name, sizeof m->segment_name);
    char src[sizeof m->source];
    snprintf(src, sizeof src, "%.200s, fold %d %s", like->source, k + 1, what);
    memcpy(m->source, src, sizeof src);
    return MB_OK;
}

/* Samples [begin, end) of ds into x, y (malloc'd), exactly: a NaN policy that skips is refused
 * (it would shift samples against their times). */
static mb_result mbw__read(mb_dataset *ds, int64_t begin, int64_t end, float **x, float **y) {
    const mb_dataset_meta *m = mb_dataset_info(ds);
    size_t nx, ny;
    int64_t n = end - begin, rows = 0, dx[3] = {n, m->t, m->f}, dy[2] = {n, m->k};
    if (!mb_size_product(dx, 3, sizeof(float), &nx) || !mb_size_product(dy, 2, sizeof(float), &ny))
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "walk-forward: %lld samples overflow size_t", (long long)n);
    *x = (float *)malloc(nx ? nx : 1);
    *y = (float *)malloc(ny ? ny : 1);
    if (!*x || !*y)
        return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "walk-forward: no host memory for a fold's %lld samples (%zu bytes): "
                       "a fold holds its samples in host memory; use fewer samples (--wf-window) or more folds",
                       (long long)n, nx + ny);
    MB_TRY(mb_dataset_read(ds, begin, end, *x, *y, &rows));
    if (rows != n)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: samples [%lld, %lld) read as %lld rows: walk-forward needs every "
                       "sample (no skipping NaN policy)", m->source, (long long)begin, (long long)end, (long long)rows);
    return MB_OK;
}

/* mu, sigma of each (segment, feature) over the n samples x (n, t, f): two passes in double,
 * in a fixed order (the same bits every run). seg_len: nseg lengths summing to t. */
static void mbw__feature_stats(const float *x, int64_t n, int64_t t, int64_t f, int nseg, const int64_t *seg_len,
                               double *acc, float *mu, float *sigma) {
    int64_t nsf = nseg * f;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t j = 0; j < nsf; j++) acc[j] = 0;
        for (int64_t i = 0; i < n; i++) {
            const float *row = x + (size_t)(i * t * f);
            for (int s = 0; s < nseg; s++)
                for (int64_t r = 0; r < seg_len[s]; r++, row += f)
                    for (int64_t c = 0; c < f; c++) {
                        double v = row[c];
                        if (pass) v -= mu[s * f + c], acc[s * f + c] += v * v;
                        else acc[s * f + c] += v;
                    }
        }
        for (int s = 0; s < nseg; s++) {
            double cnt = (double)n * (double)seg_len[s];
            for (int64_t c = 0; c < f; c++) {
                double a = acc[s * f + c] / cnt;
                if (!pass) mu[s * f + c] = (float)a;
                else sigma[s * f + c] = (float)(a > 1e-20 ? sqrt(a) : 1.0);
            }
        }
    }
}

/* (x - mu) / sigma per (segment, feature), in place, over n samples. */
static void mbw__standardise(float *x, int64_t n, int64_t f, int nseg, const int64_t *seg_len, const float *mu,
                             const float *sigma) {
    for (int64_t i = 0; i < n; i++)
        for (int s = 0; s < nseg; s++)
            for (int64_t r = 0; r < seg_len[s]; r++, x += f)
                for (int64_t c = 0; c < f; c++) x[c] = (x[c] - mu[s * f + c]) / sigma[s * f + c];
}

/* prepare's attributes of the file: feature_mean/feature_std (nseg, f) into mean, std (1 when
 * present with that shape, else mean 0, std 1 and 0), target_scale into *scale (1 when absent). */
static mb_result mbw__file_norm(mb_dataset *ds, int64_t nsf, float *mean, float *std, float *scale, int *has) {
    int64_t got[2] = {0, 0}, gs = 0;
    mb_result r = mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", mean, nsf, &got[0]);
    if (r == MB_OK) r = mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_std", std, nsf, &got[1]);
    if (r == MB_ERR_INVALID_ARG || r == MB_ERR_OUT_OF_MEMORY) return r;
    *has = r == MB_OK && got[0] == nsf && got[1] == nsf; /* another shape: not per (segment, feature) */
    for (int64_t j = 0; !*has && j < nsf; j++) mean[j] = 0, std[j] = 1;
    r = mb_dataset_read_attr(ds, MB_ON_TARGETS, "target_scale", scale, 1, &gs);
    if (r == MB_ERR_INVALID_ARG || r == MB_ERR_OUT_OF_MEMORY) return r;
    if (r != MB_OK || gs != 1 || !(*scale > 0)) *scale = 1;
    mb_clear_error();
    return MB_OK;
}

static mb_result mbw__fold_load(mbw_fold_data *d, mb_dataset *ds, const mbw_plan *p, int k) {
    const mb_dataset_meta *m = mb_dataset_info(ds);
    if (!m || k < 0 || k >= p->folds || m->n != p->n)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbw_fold_load: fold %d of %d, or a dataset of %lld samples for a plan "
                       "of %lld", k, p->folds, m ? (long long)m->n : -1LL, (long long)p->n);
    const mbw_fold *fd = &p->fold[k];
    int64_t seg_len[MB_MAX_SEGMENTS];
    d->fold = k; d->t = m->t; d->f = m->f; d->k = m->k;
    d->n_train = fd->train_end - fd->train_begin; d->n_val = fd->val_end - fd->val_begin;
    d->nseg = m->segments ? m->segments : 1;
    for (int s = 0; s < d->nseg; s++) seg_len[s] = m->segments ? m->segment_len[s] : m->t;
    int64_t nsf = d->nseg * d->f;
    float *file_mean = (float *)malloc((size_t)nsf * sizeof(float)), *file_std = (float *)malloc((size_t)nsf * sizeof(float));
    double *acc = (double *)malloc((size_t)nsf * sizeof(double));
    d->stored_mean = (float *)malloc((size_t)nsf * sizeof(float)); d->stored_std = (float *)malloc((size_t)nsf * sizeof(float));
    d->mean = (float *)malloc((size_t)nsf * sizeof(float)); d->std = (float *)malloc((size_t)nsf * sizeof(float));
    float file_scale = 1;
    mb_result r = file_mean && file_std && acc && d->stored_mean && d->stored_std && d->mean && d->std
                      ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "walk-forward: no host memory");
    if (r == MB_OK) r = mbw__file_norm(ds, nsf, file_mean, file_std, &file_scale, &d->file_norm);
    if (r == MB_OK) r = mbw__read(ds, fd->train_begin, fd->train_end, &d->train_x, &d->train_y);
    if (r == MB_OK) r = mbw__read(ds, fd->val_begin, fd->val_end, &d->val_x, &d->val_y);
    if (r == MB_OK) { /* the statistics: of the training part only */
        mbw__feature_stats(d->train_x, d->n_train, d->t, d->f, d->nseg, seg_len, acc, d->stored_mean, d->stored_std);
        mbw__standardise(d->train_x, d->n_train, d->f, d->nseg, seg_len, d->stored_mean, d->stored_std);
        mbw__standardise(d->val_x, d->n_val, d->f, d->nseg, seg_len, d->stored_mean, d->stored_std);
        double s2 = 0;
        size_t ny = (size_t)(d->n_train * d->k);
        for (size_t j = 0; j < ny; j++) s2 += (double)d->train_y[j] * d->train_y[j];
        d->target_rms = sqrt(s2 / (double)ny);
        if (!(d->target_rms > 1e-10)) d->target_rms = 1;
        float rho = (float)d->target_rms;
        for (size_t j = 0; j < ny; j++) d->train_y[j] /= rho;
        for (size_t j = 0; j < (size_t)(d->n_val * d->k); j++) d->val_y[j] /= rho;
        for (int64_t j = 0; j < nsf; j++) { /* raw = mean + std x: the raw statistics of the part */
            d->mean[j] = (float)((double)file_mean[j] + (double)file_std[j] * d->stored_mean[j]);
            d->std[j] = (float)((double)file_std[j] * d->stored_std[j]);
        }
        d->target_scale = (float)((double)file_scale * d->target_rms);
    }
    if (r == MB_OK) r = mbw__open_memory(&d->train, d->train_x, d->train_y, d->n_train, m, "train", k);
    if (r == MB_OK) r = mbw__open_memory(&d->val, d->val_x, d->val_y, d->n_val, m, "val", k);
    free(file_mean); free(file_std); free(acc);
    return r;
}

/* Fold k of plan p from ds (the file the plan's times are of, opened as any data file; no
 * loader open on it: the file's attributes are read here). On failure d holds nothing. */
MBW_API mb_result mbw_fold_load(mbw_fold_data *d, mb_dataset *ds, const mbw_plan *p, int k) {
    memset(d, 0, sizeof *d);
    mb_result r = mbw__fold_load(d, ds, p, k);
    if (r != MB_OK) mbw_fold_free(d);
    return r;
}

#ifdef MTF_MULTITF_H
/* The fold's normalisation into the model's spec (made from d->train's info by
 * mtf_spec_of_data): what mtf_model_export writes as feature_mean, feature_std and
 * target_scale, so the fold's model predicts from raw features as it was trained. Features
 * beyond MTF_MAX_F: no feature normalisation in the spec (as mtf_spec_read_norm). */
MBW_API void mbw_fold_spec(const mbw_fold_data *d, mtf_spec *s) {
    int64_t nsf = d->nseg * d->f;
    s->has_norm = d->f <= MTF_MAX_F && s->nseg == d->nseg && s->F == d->f;
    for (int64_t j = 0; s->has_norm && j < nsf; j++) s->mean[j] = d->mean[j], s->std[j] = d->std[j];
    s->target_scale = d->target_scale;
}
#endif

// ---- table ----
// What the caller measured per fold, and the printing: mbw_print_plan once, mbw_print_fold as
// each fold ends, mbw_print_table at the end. Fixed formats (%.6f), so the same numbers print
// the same text. Spread: the sample standard deviation over the folds (n - 1) and the range.

typedef struct mbw_scores {
    double train_loss, val_loss, baseline;
    double metric[MBW_MAX_METRICS]; /* the caller's, named in the calls below */
} mbw_scores;

typedef struct mbw_spread { double mean, std, min, max; } mbw_spread;

/* Mean, sample std (0 for one value), min and max of v[0 .. n - 1]. */
MBW_API mbw_spread mbw_spread_of(const double *v, int n) {
    mbw_spread s = {0, 0, 0, 0};
    if (n < 1) return s;
    s.min = s.max = v[0];
    for (int i = 0; i < n; i++) {
        s.mean += v[i];
        if (v[i] < s.min) s.min = v[i];
        if (v[i] > s.max) s.max = v[i];
    }
    s.mean /= n;
    for (int i = 0; i < n && n > 1; i++) s.std += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = n > 1 ? sqrt(s.std / (n - 1)) : 0;
    return s;
}

/* Column i of a fold's scores: train_loss, val_loss, baseline, then the metrics. */
static double mbw__column(const mbw_scores *s, int i) {
    return i == 0 ? s->train_loss : i == 1 ? s->val_loss : i == 2 ? s->baseline : s->metric[i - 3];
}

/* Folds over ranks (mb_dist; a world of one without MPI): fold k runs on rank k mod size. */
MBW_API int mbw_fold_on_rank(int k, int rank, int size) { return size <= 1 || k % size == rank; }

/* Each rank filled the rows of its folds in s[0 .. folds - 1] and left the others zero: every
 * rank gets every row (mb_dist_sum adds in rank order: x + 0 is x, the rows' bits unchanged). */
MBW_API mb_result mbw_scores_gather(mb_dist *d, mbw_scores *s, int folds) {
    enum { COLS = 3 + MBW_MAX_METRICS };
    double v[MBW_MAX_FOLDS * COLS];
    if (folds < 1 || folds > MBW_MAX_FOLDS) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mbw_scores_gather: %d folds", folds);
    for (int k = 0; k < folds; k++)
        for (int i = 0; i < COLS; i++) v[k * COLS + i] = mbw__column(&s[k], i);
    MB_TRY(mb_dist_sum(d, v, folds * COLS));
    for (int k = 0; k < folds; k++) {
        s[k].train_loss = v[k * COLS]; s[k].val_loss = v[k * COLS + 1]; s[k].baseline = v[k * COLS + 2];
        for (int i = 0; i < MBW_MAX_METRICS; i++) s[k].metric[i] = v[k * COLS + 3 + i];
    }
    return MB_OK;
}

/* "YYYY-MM-DD HH:MM" (UTC) of t seconds, without the C library's time zones. */
static void mbw__date(int64_t t, char *out, size_t cap) {
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400), sec = t - days * 86400;
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097, doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365, doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153, d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    snprintf(out, cap, "%04lld-%02lld-%02lld %02lld:%02lld", (long long)(yoe + era * 400 + (m <= 2)), (long long)m,
             (long long)d, (long long)(sec / 3600), (long long)(sec / 60 % 60));
}

/* The plan, before training: a line, then one per fold (its parts, their times). */
MBW_API void mbw_print_plan(FILE *out, const mbw_plan *p) {
    fprintf(out, "walk-forward: %lld samples, %d folds, %s, stride %lld bars (%s), purge %lld samples (horizon %lld bars)\n",
            (long long)p->n, p->folds, p->window ? "rolling" : "expanding", (long long)p->stride,
            p->stride_inferred ? "the smallest time step" : "given", (long long)p->purge_samples,
            (long long)p->horizon_bars);
    if (p->window) fprintf(out, "walk-forward: training window %lld samples\n", (long long)p->window);
    for (int k = 0; k < p->folds; k++) {
        const mbw_fold *f = &p->fold[k];
        char a[72], b[72], c[72], d[72];
        mbw__date(f->train_t0, a, sizeof a); mbw__date(f->train_t1, b, sizeof b);
        mbw__date(f->val_t0, c, sizeof c); mbw__date(f->val_t1, d, sizeof d);
        fprintf(out, "fold %d/%d: train [%lld, %lld) %s .. %s, purged %lld, val [%lld, %lld) %s .. %s\n", k + 1, p->folds,
                (long long)f->train_begin, (long long)f->train_end, a, b, (long long)f->purged,
                (long long)f->val_begin, (long long)f->val_end, c, d);
    }
}

/* Fold k's line once it is trained: its sizes and scores (names: n_metrics metric names). */
MBW_API void mbw_print_fold(FILE *out, const mbw_plan *p, int k, const mbw_scores *s, const char *const *names,
                            int n_metrics) {
    const mbw_fold *f = &p->fold[k];
    fprintf(out, "fold %d/%d: train=%lld val=%lld train_loss=%.6f val_loss=%.6f baseline_val_loss=%.6f", k + 1, p->folds,
            (long long)(f->train_end - f->train_begin), (long long)(f->val_end - f->val_begin), s->train_loss,
            s->val_loss, s->baseline);
    for (int i = 0; i < n_metrics && i < MBW_MAX_METRICS; i++) fprintf(out, " %s=%.6f", names[i], s->metric[i]);
    fputc('\n', out);
}

/* The table of every fold's scores (s[0 .. folds - 1]), then their mean, std, min and max. */
MBW_API void mbw_print_table(FILE *out, const mbw_plan *p, const mbw_scores *s, const char *const *names, int n_metrics) {
    enum { COLS = 3 + MBW_MAX_METRICS };
    const char *head[COLS] = {"train_loss", "val_loss", "baseline"};
    if (n_metrics > MBW_MAX_METRICS) n_metrics = MBW_MAX_METRICS;
    int nc = 3 + n_metrics, w[COLS];
    for (int i = 0; i < n_metrics; i++) head[3 + i] = names[i];
    for (int i = 0; i < nc; i++) w[i] = strlen(head[i]) > 10 ? (int)strlen(head[i]) : 10;
    fprintf(out, "%-6s %8s %8s", "fold", "train", "val");
    for (int i = 0; i < nc; i++) fprintf(out, " %*s", w[i], head[i]);
    fputc('\n', out);
    for (int k = 0; k < p->folds; k++) {
        const mbw_fold *f = &p->fold[k];
        fprintf(out, "%-6d %8lld %8lld", k + 1, (long long)(f->train_end - f->train_begin),
                (long long)(f->val_end - f->val_begin));
        for (int i = 0; i < nc; i++) fprintf(out, " %*.6f", w[i], mbw__column(&s[k], i));
        fputc('\n', out);
    }
    mbw_spread sp[COLS];
    for (int i = 0; i < nc; i++) {
        double v[MBW_MAX_FOLDS];
        for (int k = 0; k < p->folds; k++) v[k] = mbw__column(&s[k], i);
        sp[i] = mbw_spread_of(v, p->folds);
    }
    static const char *const what[4] = {"mean", "std", "min", "max"};
    for (int j = 0; j < 4; j++) {
        fprintf(out, "%-6s %8s %8s", what[j], "", "");
        for (int i = 0; i < nc; i++)
            fprintf(out, " %*.6f", w[i], j == 0 ? sp[i].mean : j == 1 ? sp[i].std : j == 2 ? sp[i].min : sp[i].max);
        fputc('\n', out);
    }
}

/* ---- the whole walk ----
 * One process, every fold in turn (docs/EXAMPLE.md, "Walk-forward evaluation"): the file at
 * path opened (probed, mb_args.h), its times read (before any thread starts), the plan made
 * (cfg->targets: the file's) and printed unless quiet; then each fold: its data loaded, fold
 * (the caller's training of it) filling its scores, its line; then the table and the last line
 *   summary: folds=K val_loss_mean=.. val_loss_std=.. val_loss_min=.. val_loss_max=.. */
typedef mb_result (*mbw_fold_fn)(void *ctx, mbw_fold_data *fd, int k, mbw_scores *sc);

MBW_API mb_result mbw_run(const char *path, mbw_config cfg, int quiet, mbw_fold_fn fold, void *ctx,
                          const char *const *names, int n_metrics) {
    static mbw_scores sc[MBW_MAX_FOLDS];
    mbw_plan plan;
    mbw_fold_data fd;
    mb_dataset *file = NULL;
    int64_t *times = NULL;
    memset(sc, 0, sizeof sc);
    memset(&fd, 0, sizeof fd);
    mb_result r = mba_open_data(path, 1, &file);
    const mb_dataset_meta *mt = r == MB_OK ? mb_dataset_info(file) : NULL;
    if (r == MB_OK) r = mbw_read_times(path, mt->n, &times); /* in a child: before any thread starts */
    if (mt) cfg.targets = mt->k;
    if (r == MB_OK) r = mbw_plan_make(&plan, times, mt->n, &cfg);
    if (r == MB_OK && !quiet) mbw_print_plan(stdout, &plan);
    for (int k = 0; r == MB_OK && k < plan.folds; k++) {
        r = mbw_fold_load(&fd, file, &plan, k);
        if (r == MB_OK) r = fold(ctx, &fd, k, &sc[k]);
        mbw_fold_free(&fd);
        if (r == MB_OK) mbw_print_fold(stdout, &plan, k, &sc[k], names, n_metrics);
    }
    if (r == MB_OK) {
        double v[MBW_MAX_FOLDS];
        for (int k = 0; k < plan.folds; k++) v[k] = sc[k].val_loss;
        mbw_spread vs = mbw_spread_of(v, plan.folds);
        mbw_print_table(stdout, &plan, sc, names, n_metrics);
        printf("summary: folds=%d val_loss_mean=%.5f val_loss_std=%.5f val_loss_min=%.5f val_loss_max=%.5f\n",
               plan.folds, vs.mean, vs.std, vs.min, vs.max);
    }
    free(times);
    mb_dataset_close(file);
    return r;
}

#endif /* MB_WALK_H */
