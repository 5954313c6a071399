/* examples/mb_walk.h: walk-forward folds that cannot leak. On prepare's synthetic data (made
 * here, in process, so each sample's M1 bar index is known): the purge by the bar rule and
 * the time rule, the fold order, the rolling window; that no fold's statistics or training
 * data depend on samples after its training part (and do on a sample inside it); the
 * per-fold normalisation against raw statistics fitted directly; the refusals; determinism;
 * the table. Randomized perturbations: seed printed, replay with MB_TEST_SEED. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#define PREPARE_NO_MAIN
#include "../examples/prepare.c"
#include "../examples/multitf.h"
#include "../examples/mb_walk.h"
#include <dirent.h>

typedef struct data {
    char dir[64], path[128];   /* the prepared training file */
    mbc_bars m1;               /* its M1 bars */
    int stride, k;             /* prepare's --stride and --targets */
    int64_t n, *times, *bar;   /* samples; their times (read here with HDF5) and M1 bar indices */
} data;

static data g_a, g_b; /* a: stride 30, K 6 (H / S = 1 exactly); b: stride 7, K 8 (H / S = 5.7) */

static int64_t *read_times_h5(const char *path, int64_t *n) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), d = H5Dopen2(f, "times", H5P_DEFAULT), sp = H5Dget_space(d);
    hsize_t dim = 0;
    H5Sget_simple_extent_dims(sp, &dim, NULL);
    int64_t *v = (int64_t *)malloc((size_t)dim * sizeof *v);
    if (!v || H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) fail_msg("reading times of %s", path);
    H5Sclose(sp); H5Dclose(d); H5Fclose(f);
    *n = (int64_t)dim;
    return v;
}

static int make_data(data *d, size_t bars, uint64_t seed, int nf, int k, int stride, int series) {
    snprintf(d->dir, sizeof d->dir, "/tmp/mb_walk_XXXXXX");
    if (!mkdtemp(d->dir)) return -1;
    char va[128];
    snprintf(d->path, sizeof d->path, "%s/train.h5", d->dir);
    snprintf(va, sizeof va, "%s/val.h5", d->dir);
    if (make_synthetic(bars, seed, &d->m1)) return -1;
    prep_config c = {nf, k, stride, 0.2, 0, 1, d->path, va, series};
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (prepare(&d->m1, &c)) return -1;
    remove(va);
    d->stride = stride; d->k = k;
    d->times = read_times_h5(d->path, &d->n);
    d->bar = (int64_t *)malloc((size_t)d->n * sizeof *d->bar);
    for (int64_t i = 0; i < d->n; i++) { /* sample time = its last M1 bar's open + 60 s */
        size_t lo = 0, hi = d->m1.n;
        while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (d->m1.t[mid] <= d->times[i] - 60) lo = mid; else hi = mid; }
        if (d->m1.t[lo] != d->times[i] - 60) return -1;
        d->bar[i] = (int64_t)lo;
    }
    return 0;
}

static void free_data(data *d) {
    remove(d->path); rmdir(d->dir);
    free(d->times); free(d->bar);
    mbc_bars_free(&d->m1);
}

static int setup(void **state) {
    (void)state;
    if (make_data(&g_a, 60000, 5, 3, 6, 30, 0)) return -1;
    return make_data(&g_b, 20000, 6, 2, 8, 7, 0);
}

static int teardown(void **state) {
    (void)state;
    free_data(&g_a); free_data(&g_b);
    return 0;
}

static mbw_config config(const data *d, int folds, int64_t window, int64_t min_samples) {
    mbw_config c;
    memset(&c, 0, sizeof c);
    c.folds = folds; c.window = window; c.min_samples = min_samples; c.targets = d->k;
    return c;
}

/* The plan's folds against the bar indices and times read here. */
static void check_plan(const data *d, const mbw_plan *p, int K, int64_t W) {
    int64_t H = 5 * d->k;
    assert_int_equal(p->folds, K);
    assert_int_equal(p->stride, d->stride); /* inferred from the smallest step */
    assert_int_equal(p->purge_samples, H / d->stride);
    for (int k = 0; k < K; k++) {
        const mbw_fold *f = &p->fold[k];
        int64_t q = f->val_begin;
        /* blocks in time order, disjoint, contiguous: block k + 1 of K + 1 */
        assert_int_equal(f->val_begin, (int64_t)(k + 1) * d->n / (K + 1));
        assert_int_equal(f->val_end, (int64_t)(k + 2) * d->n / (K + 1));
        if (k) assert_int_equal(f->val_begin, p->fold[k - 1].val_end);
        assert_true(f->val_begin < f->val_end);
        assert_true(0 <= f->train_begin && f->train_begin < f->train_end && f->train_end <= q);
        assert_int_equal(f->purged, q - f->train_end);
        for (int64_t i = f->train_begin; i < f->train_end; i++) {
            if (!(d->bar[i] + H < d->bar[q])) /* the bar rule: the target ends before the block's first bar */
                fail_msg("fold %d: training sample %lld (bar %lld) + %lld bars reaches validation bar %lld", k,
                         (long long)i, (long long)d->bar[i], (long long)H, (long long)d->bar[q]);
            if (!(d->times[i] + 60 * H < d->times[q])) fail_msg("fold %d: sample %lld breaks the time rule", k, (long long)i);
        }
        /* no more purged than the rule asks: the first purged sample breaks it */
        if (f->train_end < q) assert_true(d->bar[f->train_end] + H >= d->bar[q]);
        assert_true(d->times[f->train_end - 1] < d->times[q]);
        assert_true(f->train_t1 == d->times[f->train_end - 1] && f->val_t0 == d->times[q]);
        if (W) assert_int_equal(f->train_end - f->train_begin, f->train_end < W ? f->train_end : W);
        else assert_int_equal(f->train_begin, 0);
    }
    assert_int_equal(p->fold[K - 1].val_end, d->n);
}

static void test_purge_and_order(void **state) {
    (void)state;
    const data *ds[2] = {&g_a, &g_b};
    for (int i = 0; i < 2; i++) {
        const data *d = ds[i];
        int64_t *t = NULL;
        assert_int_equal(mbw_read_times(d->path, d->n, &t), MB_OK); /* in the child: the same values */
        assert_memory_equal(t, d->times, (size_t)d->n * sizeof *t);
        /* the data have weekends: the smallest step is the stride, the largest days */
        int64_t big = 0;
        for (int64_t j = 1; j < d->n; j++) if (t[j] - t[j - 1] > big) big = t[j] - t[j - 1];
        assert_true(big > 86400);
        int folds[3] = {2, 3, 5};
        for (int j = 0; j < 3; j++) {
            int64_t windows[2] = {0, d->n / 7};
            for (int w = 0; w < 2; w++) {
                mbw_plan p;
                mbw_config c = config(d, folds[j], windows[w], 16);
                if (mbw_plan_make(&p, t, d->n, &c) != MB_OK) fail_msg("%s", mb_last_error());
                check_plan(d, &p, folds[j], windows[w]);
            }
        }
        /* a stride given (the true one) makes the same plan */
        mbw_plan p1, p2;
        mbw_config c = config(d, 4, 0, 16);
        assert_int_equal(mbw_plan_make(&p1, t, d->n, &c), MB_OK);
        c.stride = d->stride;
        assert_int_equal(mbw_plan_make(&p2, t, d->n, &c), MB_OK);
        assert_int_equal(p2.stride_inferred, 0);
        p2.stride_inferred = 1;
        assert_memory_equal(&p1, &p2, sizeof p1);
        free(t);
    }
}

/* Markets' gaps where they hurt: a weekend or missing minutes right before each validation
 * block, so the time rule passes samples that the bar rule must purge (sample i is at M1 bar
 * i S; a gap widens the time between samples, never the bars). Random sizes, strides, gaps. */
static void test_purge_across_gaps(void **state) {
    (void)state;
    int planned = 0;
    for (int rep = 0; rep < 200; rep++) {
        int K = tu_int(2, 6), S = tu_int(1, 40), targets = tu_int(1, 40);
        int64_t n = tu_int(60, 600), H = 5 * targets, *t = (int64_t *)malloc((size_t)n * sizeof *t);
        t[0] = 1704067200 + 60 * tu_int(0, 1000);
        for (int64_t i = 1; i < n; i++) {
            int64_t gap = 0, u = (int64_t)(tu_next() % 100);
            if (u < 3) gap = 2 * 86400;               /* a weekend */
            else if (u < 10) gap = 60 * tu_int(1, 90); /* missing minutes */
            for (int k = 1; k <= K; k++)
                if (i == (int64_t)k * n / (K + 1)) gap = tu_int(0, 1) ? 2 * 86400 : 60 * tu_int(1, 5 * targets);
            t[i] = t[i - 1] + 60 * S + gap;
        }
        t[1] = t[0] + 60 * S; /* one pair without a gap: the stride is inferred exactly */
        mbw_plan p;
        mbw_config c;
        memset(&c, 0, sizeof c);
        c.folds = K; c.targets = targets; c.min_samples = 1; c.window = tu_int(0, 1) ? tu_int(1, (int)n) : 0;
        mb_result r = mbw_plan_make(&p, t, n, &c);
        if (r != MB_OK) { /* only for want of samples */
            assert_non_null(strstr(mb_last_error(), "--walk-forward"));
            free(t);
            continue;
        }
        assert_int_equal(p.stride, S);
        planned++;
        for (int k = 0; k < K; k++) {
            const mbw_fold *f = &p.fold[k];
            int64_t q = f->val_begin;
            for (int64_t i = f->train_begin; i < f->train_end; i++)
                if (!(i * S + H < q * S) || !(t[i] + 60 * H < t[q]))
                    fail_msg("rep %d: K %d S %d H %lld fold %d: sample %lld trains for a block at %lld", rep, K, S,
                             (long long)H, k, (long long)i, (long long)q);
            if (f->train_end < q) /* the first sample left out breaks a rule */
                assert_true(f->train_end * S + H >= q * S || t[f->train_end] + 60 * H >= t[q]);
        }
        free(t);
    }
    /* a stride given too large (a smaller bar-rule purge): without gaps the time rule alone
     * still purges what the true stride would */
    for (int rep = 0; rep < 50; rep++) {
        int S = tu_int(1, 20), targets = tu_int(1, 8 * S); /* purge <= 40 samples of 100-sample blocks */
        int64_t n = 400, H = 5 * targets, t[400];
        for (int64_t i = 0; i < n; i++) t[i] = 1704067200 + 60 * S * i;
        mbw_plan p;
        mbw_config c;
        memset(&c, 0, sizeof c);
        c.folds = 3; c.targets = targets; c.min_samples = 1; c.stride = S * tu_int(2, 5);
        assert_int_equal(mbw_plan_make(&p, t, n, &c), MB_OK);
        for (int k = 0; k < 3; k++) {
            assert_true((p.fold[k].train_end - 1) * S + H < p.fold[k].val_begin * S);
            assert_true(p.fold[k].train_end * S + H >= p.fold[k].val_begin * S);
        }
    }
    printf("gaps: %d of 200 random files planned (the others too short for their purge)\n", planned);
    assert_true(planned >= 100);
}

/* The whole file in memory, as an in-memory dataset with its segments (what the fold reads). */
typedef struct whole { float *x, *y; int64_t n, row, k; mb_dataset *ds; mb_dataset_meta meta; } whole;

static void whole_open(whole *w, const data *d) {
    mb_dataset *f = NULL;
    assert_int_equal(mb_dataset_open_file(&f, d->path, NULL), MB_OK);
    w->meta = *mb_dataset_info(f);
    w->n = w->meta.n; w->row = w->meta.t * w->meta.f; w->k = w->meta.k;
    w->x = tu_alloc_f32((size_t)(w->n * w->row));
    w->y = tu_alloc_f32((size_t)(w->n * w->k));
    assert_int_equal(mb_dataset_read(f, 0, w->n, w->x, w->y, NULL), MB_OK);
    mb_dataset_close(f);
    w->ds = NULL;
}

static void whole_reopen(whole *w) {
    mb_dataset_close(w->ds);
    assert_int_equal(mb_dataset_open_memory(&w->ds, w->x, w->y, w->n, w->meta.t, w->meta.f, w->k, NULL), MB_OK);
    mb_dataset_meta *m = (mb_dataset_meta *)mb_dataset_info(w->ds);
    m->segments = w->meta.segments;
    memcpy(m->segment_len, w->meta.segment_len, sizeof m->segment_len);
}

static void whole_close(whole *w) { mb_dataset_close(w->ds); free(w->x); free(w->y); }

/* Every value that the fold fitted or trains on. */
static void assert_same_training(const mbw_fold_data *a, const mbw_fold_data *b) {
    size_t nsf = (size_t)(a->nseg * a->f);
    assert_int_equal(a->n_train, b->n_train);
    assert_memory_equal(a->stored_mean, b->stored_mean, nsf * sizeof(float));
    assert_memory_equal(a->stored_std, b->stored_std, nsf * sizeof(float));
    assert_memory_equal(a->mean, b->mean, nsf * sizeof(float));
    assert_memory_equal(a->std, b->std, nsf * sizeof(float));
    assert_memory_equal(&a->target_rms, &b->target_rms, sizeof(double));
    assert_memory_equal(&a->target_scale, &b->target_scale, sizeof(float));
    assert_memory_equal(a->train_x, b->train_x, (size_t)(a->n_train * a->t * a->f) * sizeof(float));
    assert_memory_equal(a->train_y, b->train_y, (size_t)(a->n_train * a->k) * sizeof(float));
}

/* Changing every sample after a fold's training part (the purge, its block, the folds after)
 * leaves its statistics and its training data bitwise the same; so does changing one before
 * a rolling window; changing one sample inside the part changes them. */
static void test_no_statistic_from_the_future(void **state) {
    (void)state;
    whole w;
    whole_open(&w, &g_a);
    float *x0 = tu_alloc_f32((size_t)(w.n * w.row)), *y0 = tu_alloc_f32((size_t)(w.n * w.k));
    memcpy(x0, w.x, (size_t)(w.n * w.row) * sizeof(float));
    memcpy(y0, w.y, (size_t)(w.n * w.k) * sizeof(float));
    for (int rolling = 0; rolling < 2; rolling++) {
        mbw_plan p;
        mbw_config c = config(&g_a, 3, rolling ? g_a.n / 6 : 0, 16);
        assert_int_equal(mbw_plan_make(&p, g_a.times, g_a.n, &c), MB_OK);
        for (int k = 0; k < p.folds; k++) {
            const mbw_fold *f = &p.fold[k];
            mbw_fold_data a, b;
            memcpy(w.x, x0, (size_t)(w.n * w.row) * sizeof(float));
            memcpy(w.y, y0, (size_t)(w.n * w.k) * sizeof(float));
            whole_reopen(&w);
            assert_int_equal(mbw_fold_load(&a, w.ds, &p, k), MB_OK);
            /* the future: every sample from train_end on gets other values (scaled, shifted) */
            float scale = tu_uniform(1.5f, 3.0f), shift = tu_uniform(-2.0f, 2.0f);
            for (int64_t i = f->train_end * w.row; i < w.n * w.row; i++) w.x[i] = w.x[i] * scale + shift;
            for (int64_t i = f->train_end * w.k; i < w.n * w.k; i++) w.y[i] = -w.y[i] * scale;
            if (f->train_begin > 0) /* and a sample before a rolling window */
                for (int64_t i = 0; i < w.row; i++) w.x[(f->train_begin - 1) * w.row + i] += 5.0f;
            whole_reopen(&w);
            assert_int_equal(mbw_fold_load(&b, w.ds, &p, k), MB_OK);
            assert_same_training(&a, &b);
            /* (the change reached the fold: its validation samples differ) */
            assert_true(memcmp(a.val_x, b.val_x, (size_t)(a.n_val * a.t * a.f) * sizeof(float)) != 0);
            mbw_fold_free(&b);
            /* one sample inside the training part, one value of one feature and one target */
            int64_t s = f->train_begin + (int64_t)(tu_next() % (uint64_t)(f->train_end - f->train_begin));
            int64_t e = (int64_t)(tu_next() % (uint64_t)w.row);
            w.x[s * w.row + e] += 3.0f;
            w.y[s * w.k] += 1.0f;
            whole_reopen(&w);
            assert_int_equal(mbw_fold_load(&b, w.ds, &p, k), MB_OK);
            size_t nsf = (size_t)(a.nseg * a.f);
            assert_true(memcmp(a.stored_mean, b.stored_mean, nsf * sizeof(float)) != 0);
            assert_true(memcmp(a.mean, b.mean, nsf * sizeof(float)) != 0);
            assert_true(a.target_rms != b.target_rms);
            mbw_fold_free(&a); mbw_fold_free(&b);
        }
    }
    free(x0); free(y0);
    whole_close(&w);
}

/* A fold's normalisation is that of raw values fitted on its training part: raw = file mean
 * + file std * stored, its statistics computed here directly; the fold's data are the raw
 * values standardised with them (validation too); targets alike; the exported metadata. */
static void test_fold_normalisation(void **state) {
    (void)state;
    mb_dataset *ds = NULL;
    assert_int_equal(mba_open_data(g_a.path, 1, &ds), MB_OK);
    const mb_dataset_meta *m = mb_dataset_info(ds);
    int nseg = m->segments, F = (int)m->f, nsf = nseg * F;
    float fm[5 * 8], fs[5 * 8], scale = 0;
    int64_t got = 0;
    assert_int_equal(nseg, 5);
    assert_int_equal(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", fm, nsf, &got), MB_OK);
    assert_int_equal(got, nsf);
    assert_int_equal(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_std", fs, nsf, &got), MB_OK);
    assert_int_equal(mb_dataset_read_attr(ds, MB_ON_TARGETS, "target_scale", &scale, 1, &got), MB_OK);
    mbw_plan p;
    mbw_config c = config(&g_a, 3, 0, 16);
    assert_int_equal(mbw_plan_make(&p, g_a.times, g_a.n, &c), MB_OK);
    for (int k = 0; k < p.folds; k++) {
        mbw_fold_data d;
        assert_int_equal(mbw_fold_load(&d, ds, &p, k), MB_OK);
        assert_int_equal(d.file_norm, 1);
        const mbw_fold *f = &p.fold[k];
        int64_t ntr = f->train_end - f->train_begin, nva = f->val_end - f->val_begin, row = m->t * F;
        float *x = tu_alloc_f32((size_t)((ntr + nva) * row)), *y = tu_alloc_f32((size_t)((ntr + nva) * m->k));
        assert_int_equal(mb_dataset_read(ds, f->train_begin, f->train_end, x, y, NULL), MB_OK);
        assert_int_equal(mb_dataset_read(ds, f->val_begin, f->val_end, x + ntr * row, y + ntr * m->k, NULL), MB_OK);
        double s1[40] = {0}, s2[40] = {0}, cnt[40] = {0};
        for (int64_t i = 0; i < ntr; i++)
            for (int64_t r = 0, seg = 0, left = m->segment_len[0]; r < m->t; r++, left--) {
                if (!left) left = m->segment_len[++seg];
                for (int j = 0; j < F; j++) {
                    double raw = (double)fm[seg * F + j] + (double)fs[seg * F + j] * x[i * row + r * F + j];
                    s1[seg * F + j] += raw; s2[seg * F + j] += raw * raw; cnt[seg * F + j] += 1;
                }
            }
        for (int j = 0; j < nsf; j++) {
            double mu = s1[j] / cnt[j], sd = sqrt(s2[j] / cnt[j] - mu * mu);
            if (fabs(d.mean[j] - mu) > 1e-4 * sd + 1e-6 || fabs(d.std[j] - sd) > 1e-4 * sd)
                fail_msg("fold %d feature %d: mean %.9g std %.9g, raw fit %.9g %.9g", k, j, d.mean[j], d.std[j], mu, sd);
        }
        /* the fold's data: raw standardised with the fold's raw statistics, train and val */
        double worst = 0, ym = 0;
        for (int64_t i = 0; i < ntr + nva; i++) {
            const float *dx = i < ntr ? d.train_x + i * row : d.val_x + (i - ntr) * row;
            for (int64_t r = 0, seg = 0, left = m->segment_len[0]; r < m->t; r++, left--) {
                if (!left) left = m->segment_len[++seg];
                for (int j = 0; j < F; j++) {
                    double raw = (double)fm[seg * F + j] + (double)fs[seg * F + j] * x[i * row + r * F + j];
                    double e = fabs((raw - d.mean[seg * F + j]) / d.std[seg * F + j] - dx[r * F + j]);
                    if (e > worst) worst = e;
                }
            }
        }
        if (worst > 1e-4) fail_msg("fold %d: the fold's data differ from raw standardised by %g", k, worst);
        for (int64_t i = 0; i < ntr * m->k; i++) ym += (double)d.train_y[i] * d.train_y[i];
        assert_true(fabs(sqrt(ym / (double)(ntr * m->k)) - 1) < 1e-5);
        assert_true(fabs(d.target_scale - scale * d.target_rms) <= 1e-6 * d.target_scale);
        assert_true(fabs(d.val_y[0] * d.target_scale - y[ntr * m->k] * scale) < 1e-6 * scale);
        /* the stored normalisation is not the fold's (it was fitted on the whole file) */
        int differ = 0;
        for (int j = 0; j < nsf; j++) differ |= d.mean[j] != fm[j] || d.std[j] != fs[j];
        assert_true(differ);
        /* the in-memory datasets read as the file: segments, names, sizes */
        const mb_dataset_meta *tm = mb_dataset_info(d.train), *vm = mb_dataset_info(d.val);
        assert_true(tm->n == ntr && vm->n == nva && tm->t == m->t && tm->f == m->f && tm->k == m->k);
        assert_int_equal(tm->segments, 5);
        assert_memory_equal(tm->segment_len, m->segment_len, sizeof m->segment_len);
        assert_string_equal(vm->segment_name[4], "H4");
        assert_non_null(strstr(tm->source, "fold"));
        /* a model spec for the fold carries the fold's normalisation into the weights file */
        mtf_spec sp = mtf_spec_of_data(tm, 8, 8, 1, 0);
        assert_int_equal(sp.T, 1104);
        mbw_fold_spec(&d, &sp);
        mtf_meta_text mt;
        assert_int_equal(mtf_meta_of(&sp, &mt), MB_OK);
        char *want = mtf_list_text(d.mean, nsf);
        const char *have = NULL, *ts = NULL;
        for (int i = 0; i < mt.n; i++) {
            if (!strcmp(mt.kv[i].key, "feature_mean")) have = mt.kv[i].value;
            if (!strcmp(mt.kv[i].key, "target_scale")) ts = mt.kv[i].value;
        }
        assert_non_null(have);
        assert_string_equal(have, want);
        assert_true(ts && fabs(strtod(ts, NULL) - d.target_scale) <= 1e-6 * d.target_scale);
        free(want);
        mtf_meta_free(&mt);
        /* in-memory datasets train like files: the first batch through a loader on the CPU */
        if (k == 0) {
            mb_device *dev = NULL;
            mb_device_config dc;
            memset(&dc, 0, sizeof dc);
            dc.backend = MB_CPU; dc.threads = 1;
            assert_int_equal(mb_device_open(&dev, &dc), MB_OK);
            mb_loader *ld = NULL;
            mb_loader_config lc;
            memset(&lc, 0, sizeof lc);
            lc.batch = 16;
            assert_int_equal(mb_loader_open(&ld, dev, d.train, &lc), MB_OK);
            mb_batch bt;
            assert_int_equal(mb_loader_next(ld, &bt), MB_OK);
            assert_int_equal(bt.count, 16);
            assert_int_equal(mb_sync(dev, -1), MB_OK);
            assert_memory_equal(bt.features, d.train_x, (size_t)(16 * row) * sizeof(float));
            assert_memory_equal(bt.targets, d.train_y, (size_t)(16 * m->k) * sizeof(float));
            mb_loader_close(ld);
            mb_device_close(dev);
        }
        free(x); free(y);
        mbw_fold_free(&d);
    }
    mb_dataset_close(ds);
}

static void expect_refused(mb_result r, mb_result want, const char *text) {
    assert_int_equal(r, want);
    if (!strstr(mb_last_error(), text)) fail_msg("error '%s' lacks '%s'", mb_last_error(), text);
}

static void test_refusals(void **state) {
    (void)state;
    const data *d = &g_a;
    mbw_plan p;
    mbw_config c = config(d, 1, 0, 16);
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "--walk-forward 1: give 2 to 64 folds");
    c.folds = 0;
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "--walk-forward 0");
    c.folds = 65;
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "--walk-forward 65");
    /* more folds than the samples allow: the message names the most, which works, and one more does not */
    c = config(d, 40, 0, 64);
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "allow at most");
    int most = atoi(strstr(mb_last_error(), "at most ") + 8);
    assert_true(most >= 2 && most < 40);
    c.folds = most;
    assert_int_equal(mbw_plan_make(&p, d->times, d->n, &c), MB_OK);
    c.folds = most + 1;
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "allow at most");
    /* too few samples for any split */
    c = config(d, 2, 0, d->n / 2);
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "too few for even 2 folds");
    /* a window under a batch */
    c = config(d, 3, 10, 16);
    expect_refused(mbw_plan_make(&p, d->times, d->n, &c), MB_ERR_INVALID_ARG, "--wf-window 10");
    /* times that do not increase; times under 60 s apart */
    int64_t t[4] = {600, 1200, 1200, 1800}, u[4] = {600, 630, 660, 690};
    c = config(d, 2, 0, 1);
    expect_refused(mbw_plan_make(&p, t, 4, &c), MB_ERR_FORMAT, "must increase");
    expect_refused(mbw_plan_make(&p, u, 4, &c), MB_ERR_FORMAT, "cannot infer");
    /* files: none, without `times`, with another N */
    int64_t *v = NULL;
    expect_refused(mbw_read_times("/nonexistent/x.h5", 10, &v), MB_ERR_FORMAT, "cannot open");
    char path[400];
    snprintf(path, sizeof path, "%s/no_times.h5", d->dir);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    expect_refused(mbw_read_times(path, 10, &v), MB_ERR_FORMAT, "no dataset 'times'");
    remove(path);
    expect_refused(mbw_read_times(d->path, d->n + 1, &v), MB_ERR_FORMAT, "values for");
    assert_null(v);
    /* a fold of a plan for another file */
    whole w;
    whole_open(&w, d);
    whole_reopen(&w);
    c = config(d, 2, 0, 16);
    int64_t *t2 = (int64_t *)malloc((size_t)(d->n + 1) * sizeof *t2);
    memcpy(t2, d->times, (size_t)d->n * sizeof *t2);
    t2[d->n] = t2[d->n - 1] + 1800;
    assert_int_equal(mbw_plan_make(&p, t2, d->n + 1, &c), MB_OK);
    mbw_fold_data fd;
    expect_refused(mbw_fold_load(&fd, w.ds, &p, 0), MB_ERR_INVALID_ARG, "plan");
    assert_null(fd.train_x);
    assert_int_equal(mbw_plan_make(&p, t2, d->n, &c), MB_OK);
    expect_refused(mbw_fold_load(&fd, w.ds, &p, 2), MB_ERR_INVALID_ARG, "fold 2 of 2");
    free(t2);
    whole_close(&w);
}

static char *print_to_text(const mbw_plan *p, const mbw_scores *s, const char *const *names, int nm, int table) {
    FILE *f = tmpfile();
    assert_non_null(f);
    if (table) mbw_print_table(f, p, s, names, nm);
    else {
        mbw_print_plan(f, p);
        for (int k = 0; k < p->folds; k++) mbw_print_fold(f, p, k, &s[k], names, nm);
    }
    long n = ftell(f);
    char *t = (char *)calloc((size_t)n + 1, 1);
    rewind(f);
    assert_int_equal(fread(t, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return t;
}

/* The same file gives the same plan, the same folds bit for bit and the same text; the table's
 * mean, sample std and range. */
static void test_determinism_and_table(void **state) {
    (void)state;
    mb_dataset *ds = NULL;
    assert_int_equal(mb_dataset_open_file(&ds, g_b.path, NULL), MB_OK);
    mbw_plan p, q;
    mbw_config c = config(&g_b, 4, g_b.n / 5, 16);
    assert_int_equal(mbw_plan_make(&p, g_b.times, g_b.n, &c), MB_OK);
    assert_int_equal(mbw_plan_make(&q, g_b.times, g_b.n, &c), MB_OK);
    assert_memory_equal(&p, &q, sizeof p);
    check_plan(&g_b, &p, 4, g_b.n / 5);
    mbw_fold_data a, b;
    assert_int_equal(mbw_fold_load(&a, ds, &p, 3), MB_OK);
    assert_int_equal(mbw_fold_load(&b, ds, &p, 3), MB_OK);
    assert_same_training(&a, &b);
    assert_memory_equal(a.val_x, b.val_x, (size_t)(a.n_val * a.t * a.f) * sizeof(float));
    assert_memory_equal(a.val_y, b.val_y, (size_t)(a.n_val * a.k) * sizeof(float));
    assert_int_equal(a.nseg, 5);
    mbw_fold_free(&a); mbw_fold_free(&b);
    mb_dataset_close(ds);
    /* the table: val_loss 1, 2, 3, 4: mean 2.5, sample std sqrt(5/3), range 1..4 */
    mbw_scores s[4];
    memset(s, 0, sizeof s);
    const char *const names[2] = {"hit_rate", "information_coefficient"};
    for (int k = 0; k < 4; k++) {
        s[k].train_loss = 0.5 + 0.1 * k; s[k].val_loss = 1 + k; s[k].baseline = 2;
        s[k].metric[0] = 0.5 + 0.01 * k; s[k].metric[1] = k % 2 ? -0.02 : 0.04;
    }
    mbw_spread sp = mbw_spread_of((const double[]){1, 2, 3, 4}, 4);
    assert_true(sp.mean == 2.5 && fabs(sp.std - sqrt(5.0 / 3.0)) < 1e-15 && sp.min == 1 && sp.max == 4);
    sp = mbw_spread_of((const double[]){7}, 1);
    assert_true(sp.mean == 7 && sp.std == 0 && sp.min == 7 && sp.max == 7);
    char *t1 = print_to_text(&p, s, names, 2, 1), *t2 = print_to_text(&p, s, names, 2, 1);
    assert_string_equal(t1, t2);
    printf("%s", t1);
    assert_non_null(strstr(t1, "information_coefficient"));
    assert_non_null(strstr(t1, "\nmean   "));
    char want[64];
    snprintf(want, sizeof want, " %10.6f ", sqrt(5.0 / 3.0)); /* val_loss's std */
    const char *std_line = strstr(t1, "\nstd ");
    assert_non_null(std_line);
    assert_non_null(strstr(std_line, want));
    assert_non_null(strstr(t1, "  2.500000 ")); /* val_loss's mean */
    char *l1 = print_to_text(&p, s, names, 2, 0), *l2 = print_to_text(&p, s, names, 2, 0);
    assert_string_equal(l1, l2);
    printf("%s", l1);
    assert_non_null(strstr(l1, "fold 4/4: train="));
    assert_non_null(strstr(l1, "val_loss=4.000000 baseline_val_loss=2.000000 hit_rate=0.530000"));
    assert_non_null(strstr(l1, "walk-forward: "));
    free(t1); free(t2); free(l1); free(l2);
    /* folds over ranks: each fold on exactly one rank; a world of one gathers the rows unchanged */
    for (int size = 1; size <= 5; size++)
        for (int k = 0; k < 9; k++) {
            int on = 0;
            for (int r = 0; r < size; r++) on += mbw_fold_on_rank(k, r, size);
            assert_int_equal(on, 1);
        }
    mb_dist *dist = NULL;
    assert_int_equal(mb_dist_open(&dist, NULL), MB_OK);
    mbw_scores g[4];
    memcpy(g, s, sizeof g);
    assert_int_equal(mbw_scores_gather(dist, g, 4), MB_OK);
    assert_memory_equal(g, s, sizeof g);
    expect_refused(mbw_scores_gather(dist, g, 0), MB_ERR_INVALID_ARG, "0 folds");
    mb_dist_close(dist);
}

/* The series layout reads the same samples: the same folds, bit for bit. */
static void test_series_layout(void **state) {
    (void)state;
    data s;
    memset(&s, 0, sizeof s);
    assert_int_equal(make_data(&s, 20000, 6, 2, 8, 7, 1), 0);
    assert_int_equal(s.n, g_b.n);
    assert_memory_equal(s.times, g_b.times, (size_t)s.n * sizeof *s.times);
    mb_dataset *a = NULL, *b = NULL;
    assert_int_equal(mb_dataset_open_file(&a, g_b.path, NULL), MB_OK);
    assert_int_equal(mb_dataset_open_file(&b, s.path, NULL), MB_OK);
    mbw_plan p;
    mbw_config c = config(&s, 2, 0, 16);
    assert_int_equal(mbw_plan_make(&p, s.times, s.n, &c), MB_OK);
    mbw_fold_data fa, fb;
    assert_int_equal(mbw_fold_load(&fa, a, &p, 1), MB_OK);
    assert_int_equal(mbw_fold_load(&fb, b, &p, 1), MB_OK);
    assert_int_equal(fb.file_norm, 1);
    assert_same_training(&fa, &fb);
    mbw_fold_free(&fa); mbw_fold_free(&fb);
    mb_dataset_close(a); mb_dataset_close(b);
    free_data(&s);
}

/* mbw_read_times over every hostile file of the CVE corpus and the fuzz sets: each refused
 * with an error (the child may crash or hang: this process must not), none read. */
static void test_times_hostile_files(void **state) {
    (void)state;
    const char *dirs[3] = {getenv("MB_CVE_DIR") ? getenv("MB_CVE_DIR") : "../shared/testdata/hdf5-cve",
                           "tests/fuzz/regress", "tests/fuzz/seeds"};
    int files = 0, refused = 0;
    for (int d = 0; d < 3; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir && d == 0) {
            if (getenv("CI")) fail_msg("no CVE corpus at %s (CI=true: set MB_CVE_DIR)", dirs[0]);
            printf("skipped: no CVE corpus at %s (set MB_CVE_DIR); the fuzz sets only\n", dirs[0]);
            continue;
        }
        assert_non_null(dir);
        for (struct dirent *e; (e = readdir(dir));) {
            size_t n = strlen(e->d_name);
            if (n < 4 || strcmp(e->d_name + n - 3, ".h5")) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            int64_t *times = NULL;
            mb_result r = mbw_read_times(path, 3, &times); /* 3 samples: none of these files has a fitting `times` */
            files++;
            refused += r != MB_OK;
            if (r == MB_OK) fail_msg("%s: times read (%lld values expected)", path, 3LL);
            assert_null(times);
            assert_true(strlen(mb_last_error()) > 0);
        }
        closedir(dir);
    }
    printf("times: %d hostile or odd files, %d refused\n", files, refused);
    assert_true(files > 0);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_purge_and_order),       cmocka_unit_test(test_purge_across_gaps),
        cmocka_unit_test(test_no_statistic_from_the_future),
        cmocka_unit_test(test_fold_normalisation),    cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_determinism_and_table), cmocka_unit_test(test_series_layout),
        cmocka_unit_test(test_times_hostile_files),
    };
    return cmocka_run_group_tests_name("walk", tests, setup, teardown);
}
