/* series: the series layout (docs/SERIES.md). Random series read back as the windows they
 * define; the loader's series mode gives batches bitwise equal to the window layout's
 * (shuffle, drop_last, bf16/f16, shards, resume); the fallbacks (bars over the budget,
 * non-finite values); every validation error, in memory and in HDF5 files; prepare
 * --layout series + train_multitf train to the window layout's losses. */
#define _GNU_SOURCE /* mkdtemp, popen */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"
#include <sys/stat.h>

/* A random series and the windows it defines. */
typedef struct gen {
    int S;
    int64_t n, f, k, t, win[MB_MAX_SEGMENTS], nb[MB_MAX_SEGMENTS];
    float *bars[MB_MAX_SEGMENTS], *targ, *windows; /* windows: (n, t, f) */
    int64_t *ends;
} gen;

static void gen_windows(gen *g) {
    for (int64_t i = 0; i < g->n; i++) {
        float *dst = g->windows + (size_t)(i * g->t * g->f);
        for (int s = 0; s < g->S; s++)
            for (int64_t r = 0; r < g->win[s]; r++, dst += g->f)
                memcpy(dst, g->bars[s] + (size_t)((g->ends[i * g->S + s] - g->win[s] + 1 + r) * g->f),
                       (size_t)g->f * sizeof(float));
    }
}

static void gen_make(gen *g, int S, int64_t n, int64_t f, int64_t k) {
    memset(g, 0, sizeof *g);
    g->S = S; g->n = n; g->f = f; g->k = k;
    g->ends = (int64_t *)calloc((size_t)(n * S), sizeof(int64_t));
    for (int s = 0; s < S; s++) {
        g->win[s] = tu_int(1, 6);
        g->nb[s] = g->win[s] + tu_int(0, 25);
        g->t += g->win[s];
        g->bars[s] = tu_alloc_f32((size_t)(g->nb[s] * f));
        tu_fill(g->bars[s], (size_t)(g->nb[s] * f), -2.0f, 2.0f);
        int64_t e = tu_int((int)g->win[s] - 1, (int)g->nb[s] - 1);
        for (int64_t i = 0; i < n; i++) {
            g->ends[i * S + s] = e;
            e += tu_int(0, 2);
            if (e > g->nb[s] - 1) e = g->nb[s] - 1;
        }
    }
    g->targ = tu_alloc_f32((size_t)(n * k));
    tu_fill(g->targ, (size_t)(n * k), -1.0f, 1.0f);
    g->windows = tu_alloc_f32((size_t)(n * g->t * f));
    gen_windows(g);
}

static void gen_free(gen *g) {
    for (int s = 0; s < g->S; s++) free(g->bars[s]);
    free(g->ends); free(g->targ); free(g->windows);
}

static mb_series gen_desc(const gen *g) {
    mb_series d;
    memset(&d, 0, sizeof d);
    d.segments = g->S; d.window = g->win; d.bars_n = g->nb; d.bars = (const float *const *)g->bars;
    d.ends = g->ends; d.targets = g->targ; d.n = g->n; d.f = g->f; d.k = g->k;
    return d;
}

static void gen_random(gen *g) {
    gen_make(g, tu_int(1, 5), tu_int(1, 60), tu_int(1, 5), tu_int(1, 3));
}


static void test_reads_match_windows(void **state) {
    (void)state;
    for (int rep = 0; rep < 40; rep++) {
        gen g;
        gen_random(&g);
        mb_series d = gen_desc(&g);
        mb_dataset *ds;
        tu_ok(mb_dataset_open_series(&ds, &d, NULL));
        const mb_dataset_meta *m = mb_dataset_info(ds);
        assert_int_equal(m->layout, MB_LAYOUT_SERIES);
        assert_true(m->n == g.n && m->t == g.t && m->f == g.f && m->k == g.k && m->segments == g.S);
        for (int s = 0; s < g.S; s++) assert_true(m->bars[s] == g.nb[s] && m->segment_len[s] == g.win[s]);
        assert_int_equal(m->bytes_per_sample, (size_t)(g.t * g.f + g.k) * 4);
        int64_t a = tu_int(0, (int)g.n - 1), b = tu_int((int)a, (int)g.n), rows = -1;
        float *f = tu_alloc_f32((size_t)((b - a) * g.t * g.f)), *t = tu_alloc_f32((size_t)((b - a) * g.k));
        tu_ok(mb_dataset_read(ds, a, b, f, t, &rows));
        assert_int_equal(rows, b - a);
        if (b > a) {
            assert_memory_equal(f, g.windows + (size_t)(a * g.t * g.f), (size_t)((b - a) * g.t * g.f) * 4);
            assert_memory_equal(t, g.targ + (size_t)(a * g.k), (size_t)((b - a) * g.k) * 4);
        }
        free(f); free(t);
        mb_dataset_close(ds);
        gen_free(&g);
    }
}

/* Every batch of `a` equals the batch of `b` byte for byte, for `epochs` epochs. */
static void assert_same_batches(mb_loader *a, mb_loader *b, int epochs, size_t es, const gen *g) {
    for (int e = 0; e < epochs; e++)
        for (;;) {
            mb_batch x, y;
            tu_ok(mb_loader_next(a, &x));
            tu_ok(mb_loader_next(b, &y));
            assert_true(x.count == y.count && x.epoch == y.epoch && x.index == y.index && x.end_of_epoch == y.end_of_epoch);
            if (x.end_of_epoch) break;
            assert_memory_equal(x.features, y.features, (size_t)(x.count * g->t * g->f) * es);
            assert_memory_equal(x.targets, y.targets, (size_t)(x.count * g->k) * es);
        }
}

/* Series mode against the resident window layout over the same windows. */
static void test_batches_match_window_layout(void **state) {
    (void)state;
    for (int rep = 0; rep < 60; rep++) {
        gen g;
        gen_random(&g);
        mb_series d = gen_desc(&g);
        mb_device *dev = tu_open_cpu();
        mb_dataset *ds = NULL, *dw = NULL;
        tu_ok(mb_dataset_open_series(&ds, &d, NULL));
        tu_ok(mb_dataset_open_memory(&dw, g.windows, g.targ, g.n, g.t, g.f, g.k, NULL));
        mb_loader_config c;
        memset(&c, 0, sizeof c);
        c.batch = tu_int(1, 9);
        c.shuffle = tu_int(0, 1);
        c.seed = tu_next();
        c.drop_last = tu_int(0, 1);
        c.dtype = (mb_dtype)tu_int(0, 2);
        c.chunk_bytes = (size_t)1 << 30;
        if (tu_int(0, 2) == 0) { c.shard_count = tu_int(2, 3); c.shard_rank = tu_int(0, c.shard_count - 1); }
        mb_loader *ls, *lw;
        tu_ok(mb_loader_open(&ls, dev, ds, &c));
        tu_ok(mb_loader_open(&lw, dev, dw, &c));
        assert_ptr_equal(ls->src, mb__series_source()); /* series mode */
        assert_int_equal(mb_loader_get_plan(ls)->batches, mb_loader_get_plan(lw)->batches);
        assert_same_batches(ls, lw, 3, mb_dtype_size(c.dtype), &g);
        /* resume: a saved position gives the same batches again */
        mb_loader_pos p = {tu_int(0, 4), 0, tu_int(0, (int)mb_loader_get_plan(ls)->batches)};
        tu_ok(mb_loader_set_position(ls, p));
        tu_ok(mb_loader_set_position(lw, p));
        assert_same_batches(ls, lw, 1, mb_dtype_size(c.dtype), &g);
        mb_loader_stats st = mb_loader_get_stats(ls);
        assert_int_equal(st.bytes_read, 0);
        assert_int_equal(st.chunk_loads, 0);
        assert_true(st.bytes_copied > 0);
        mb_loader_close(ls); mb_loader_close(lw);
        mb_dataset_close(ds); mb_dataset_close(dw);
        tu_close_checked(dev);
        gen_free(&g);
    }
}

/* Bars over the budget, or a non-finite value: windows cut on the host into chunks (the
 * window path), same batches; the NaN policy as for windows. */
static void test_fallbacks(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        gen g;
        gen_make(&g, tu_int(1, 4), tu_int(8, 60), tu_int(1, 4), tu_int(1, 3));
        mb_series d = gen_desc(&g);
        mb_device *dev = tu_open_cpu();
        mb_dataset *ds = NULL, *dw = NULL;
        tu_ok(mb_dataset_open_series(&ds, &d, NULL));
        tu_ok(mb_dataset_open_memory(&dw, g.windows, g.targ, g.n, g.t, g.f, g.k, NULL));
        mb_loader_config c;
        memset(&c, 0, sizeof c);
        c.batch = tu_int(1, 4);
        size_t need = 0;
        assert_true(mb__sl_bytes(mb_dataset_info(ds), &c, &need));
        c.chunk_bytes = need - (size_t)tu_int(1, 64); /* the series does not fit */
        mb_loader *ls, *lw;
        tu_ok(mb_loader_open(&ls, dev, ds, &c));
        tu_ok(mb_loader_open(&lw, dev, dw, &c));
        assert_ptr_equal(ls->src, mb__window_source()); /* chunks */
        assert_same_batches(ls, lw, 2, 4, &g);
        assert_true(mb_loader_get_stats(ls).bytes_read > 0);
        mb_loader_close(ls); mb_loader_close(lw);
        ls = NULL; /* GCC's -Wuse-after-free at -O3 cannot see that the reopen below sets it */
        mb_dataset_close(ds); mb_dataset_close(dw);
        /* a NaN in one bar: policy error names a sample that uses it; zero: windows with 0 there */
        int s = tu_int(0, g.S - 1);
        int64_t bar = g.ends[(g.n - 1) * g.S + s];
        g.bars[s][bar * g.f] = 0.0f; /* the windows the zero policy must give: that value 0, all else as is */
        gen_windows(&g);
        g.bars[s][bar * g.f] = NAN;
        mb_dataset_config dc;
        memset(&dc, 0, sizeof dc);
        dc.nan_policy = MB_NAN_ZERO;
        tu_ok(mb_dataset_open_series(&ds, &d, &dc));
        c.chunk_bytes = (size_t)1 << 30;
        tu_ok(mb_loader_open(&ls, dev, ds, &c));
        assert_ptr_equal(ls->src, mb__window_source()); /* chunks */
        mb_batch b;
        /* every value as the windows with 0 for the NaN (the last sample's window ends at it) */
        for (int64_t seen = 0; seen < g.n; seen += b.count) {
            tu_ok(mb_loader_next(ls, &b));
            const float *x = (const float *)b.features, *want = g.windows + (size_t)(seen * g.t * g.f);
            for (int64_t i = 0; i < b.count * g.t * g.f; i++) {
                if (memcmp(&x[i], &want[i], sizeof(float)))
                    fail_msg("NaN zero: sample %lld value %lld is %g, want %g", (long long)(seen + i / (g.t * g.f)),
                             (long long)(i % (g.t * g.f)), (double)x[i], (double)want[i]);
            }
        }
        mb_loader_close(ls);
        mb_dataset_close(ds);
        tu_ok(mb_dataset_open_series(&ds, &d, NULL));
        tu_ok(mb_loader_open(&ls, dev, ds, &c));
        mb_result r = MB_OK;
        for (int64_t seen = 0; r == MB_OK && seen <= g.n; seen += b.count) r = mb_loader_next(ls, &b);
        assert_int_equal(r, MB_ERR_NONFINITE);
        mb_loader_close(ls);
        mb_dataset_close(ds);
        tu_close_checked(dev);
        gen_free(&g);
    }
}

/* Each broken invariant of a series in memory is its own clear error. */
static void test_validation_memory(void **state) {
    (void)state;
    gen g;
    gen_make(&g, 3, 20, 2, 1);
    if (g.nb[2] == g.win[2]) { /* one spare bar in timeframe 2, for the decreasing pair below */
        g.bars[2] = (float *)realloc(g.bars[2], (size_t)((g.nb[2] + 1) * g.f) * sizeof(float));
        memset(g.bars[2] + g.nb[2] * g.f, 0, (size_t)g.f * sizeof(float));
        g.nb[2]++;
    }
    mb_series d = gen_desc(&g);
    mb_dataset *ds = NULL;
    mb_dataset_config small;
    memset(&small, 0, sizeof small);
    small.max_bytes = 64;
    tu_assert_error(mb_dataset_open_series(&ds, &d, &small), MB_ERR_OVERFLOW, "exceed the cap");
    int64_t *e = &g.ends[7 * 3 + 1], keep = *e;
    *e = g.nb[1];
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "past the last bar");
    *e = g.win[1] - 2;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "the window is incomplete");
    *e = -5;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "incomplete");
    *e = keep;
    int64_t k0 = g.ends[0 * 3 + 2], k1 = g.ends[1 * 3 + 2];
    g.ends[0 * 3 + 2] = g.nb[2] - 1;
    g.ends[1 * 3 + 2] = g.nb[2] - 2;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "'ends' decreases in timeframe 2");
    g.ends[0 * 3 + 2] = k0; g.ends[1 * 3 + 2] = k1;
    int64_t huge[3] = {g.nb[0], INT64_MAX / 4, g.nb[2]};
    d.bars_n = huge;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_OVERFLOW, "overflows");
    d.bars_n = g.nb;
    int64_t w0[3] = {0, 1, 1};
    d.window = w0;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "window 0");
    d.window = g.win;
    d.segments = 0;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "0 timeframes");
    d.segments = MB_MAX_SEGMENTS + 1;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "timeframes");
    d.segments = 3;
    d.n = 0;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_FORMAT, "N = 0");
    d.n = 20;
    d.ends = NULL;
    tu_assert_error(mb_dataset_open_series(&ds, &d, NULL), MB_ERR_INVALID_ARG, "NULL");
    assert_null(ds);
    d.ends = g.ends;
    tu_ok(mb_dataset_open_series(&ds, &d, NULL));
    mb_dataset_close(ds);
    gen_free(&g);
}

// ---- HDF5 files ----

typedef struct sx_opts {
    hid_t bar_type, ends_type;  /* 0: float32, int64 */
    int ends_rank;              /* 0: 2 */
    int no_segments, extra_segment, wrong_f, short_targets, skip_bar, chunked;
} sx_opts;

static hid_t sx_dataset(hid_t file, const char *name, hid_t type, int rank, const hsize_t *dims, int chunked) {
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.chunked = o.gzip = chunked && dims[0] >= 3 && (rank < 2 || dims[1] >= 1);
    return fx_dataset(file, name, type, rank, dims, &o);
}

/* g as a series file (docs/SERIES.md), with the defects o asks for. */
static void sx_write(const char *path, const gen *g, const sx_opts *o) {
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0);
    for (int s = 0; s < g->S; s++) {
        if (o->skip_bar && s == g->S - 1) break;
        char name[32];
        snprintf(name, sizeof name, "bars_%d", s);
        hsize_t dims[2] = {(hsize_t)g->nb[s], (hsize_t)g->f - (o->wrong_f && s == g->S - 1 ? 1 : 0)};
        hid_t d = sx_dataset(file, name, o->bar_type ? o->bar_type : H5T_IEEE_F32LE, 2, dims, o->chunked);
        assert_true(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g->bars[s]) >= 0);
        H5Dclose(d);
    }
    hsize_t ed[3] = {(hsize_t)g->n, (hsize_t)g->S, 1}, td[2] = {(hsize_t)g->n - (o->short_targets ? 1 : 0), (hsize_t)g->k};
    int er = o->ends_rank ? o->ends_rank : 2;
    if (er == 1) ed[0] *= (hsize_t)g->S;
    hid_t de = sx_dataset(file, "ends", o->ends_type ? o->ends_type : H5T_STD_I64LE, er, ed, o->chunked);
    assert_true(H5Dwrite(de, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, g->ends) >= 0);
    if (!o->no_segments) {
        int v[MB_MAX_SEGMENTS + 1];
        hsize_t m = (hsize_t)g->S + (o->extra_segment ? 1 : 0);
        for (int s = 0; s < (int)m; s++) v[s] = s < g->S ? (int)g->win[s] : 1;
        hid_t sp = H5Screate_simple(1, &m, NULL), a = H5Acreate2(de, "segments", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT, v);
        H5Aclose(a); H5Sclose(sp);
    }
    hid_t dt = sx_dataset(file, "targets", H5T_IEEE_F32LE, 2, td, o->chunked);
    assert_true(H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g->targ) >= 0);
    H5Dclose(de); H5Dclose(dt); H5Fclose(file);
}

/* IEEE half as an HDF5 type (what h5py writes for numpy float16). */
static hid_t sx_f16(void) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

static void test_file_roundtrip(void **state) {
    (void)state;
    for (int rep = 0; rep < 12; rep++) {
        gen g;
        gen_random(&g);
        sx_opts o;
        memset(&o, 0, sizeof o);
        o.chunked = rep % 2;
        int half = rep % 3 == 0;
        hid_t f16 = sx_f16();
        if (half) {
            o.bar_type = f16;
            for (int s = 0; s < g.S; s++) /* the values a 16-bit file holds */
                for (int64_t i = 0; i < g.nb[s] * g.f; i++) g.bars[s][i] = mb_f16_to_f32(mb_f32_to_f16(g.bars[s][i]));
            gen_windows(&g);
        }
        const char *path = fx_path("series.h5");
        sx_write(path, &g, &o);
        H5Tclose(f16);
        mb_dataset *ds;
        tu_ok(mb_dataset_open_file(&ds, path, NULL));
        const mb_dataset_meta *m = mb_dataset_info(ds);
        assert_int_equal(m->layout, MB_LAYOUT_SERIES);
        assert_string_equal(m->features_type, half ? "float16" : "float32");
        assert_true(m->n == g.n && m->t == g.t && m->f == g.f && m->k == g.k && m->segments == g.S);
        float *f = tu_alloc_f32((size_t)(g.n * g.t * g.f)), *t = tu_alloc_f32((size_t)(g.n * g.k));
        tu_ok(mb_dataset_read(ds, 0, g.n, f, t, NULL));
        assert_memory_equal(f, g.windows, (size_t)(g.n * g.t * g.f) * 4);
        assert_memory_equal(t, g.targ, (size_t)(g.n * g.k) * 4);
        free(f); free(t);
        mb_dataset_close(ds);
        mb_dataset_meta pm;
        tu_ok(mb_dataset_probe(path, NULL, &pm));
        assert_true(pm.layout == MB_LAYOUT_SERIES && pm.n == g.n && pm.bars[0] == g.nb[0]);
        gen_free(&g);
    }
}

static void file_error(const gen *g, const sx_opts *o, mb_result code, const char *needle) {
    const char *path = fx_path("bad.h5");
    sx_write(path, g, o);
    mb_dataset *ds = (mb_dataset *)1;
    tu_assert_error(mb_dataset_open_file(&ds, path, NULL), code, needle);
    assert_null(ds);
    if (H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) fail_msg("%s: HDF5 objects left open", needle);
}

static void test_file_errors(void **state) {
    (void)state;
    gen g;
    gen_make(&g, 3, 12, 2, 2);
    sx_opts o;
#define CASE(field, value, code, needle) \
    memset(&o, 0, sizeof o);             \
    o.field = value;                     \
    file_error(&g, &o, code, needle)
    CASE(ends_type, H5T_IEEE_F32LE, MB_ERR_FORMAT, "bar indices must be integers");
    CASE(ends_rank, 1, MB_ERR_FORMAT, "rank 1, expected 2");
    CASE(ends_rank, 3, MB_ERR_FORMAT, "rank 3, expected 2");
    CASE(no_segments, 1, MB_ERR_FORMAT, "attribute 'segments' on 'ends', one per timeframe, is required");
    CASE(extra_segment, 1, MB_ERR_FORMAT, "3 columns and 4 window lengths");
    CASE(skip_bar, 1, MB_ERR_FORMAT, "missing dataset 'bars_2'");
    CASE(bar_type, H5T_STD_I16LE, MB_ERR_FORMAT, "'bars_0' has dtype int16: bars are float32 or a 16-bit float");
    CASE(bar_type, H5T_IEEE_F64LE, MB_ERR_FORMAT, "dtype float64");
    CASE(wrong_f, 1, MB_ERR_FORMAT, "same F");
    CASE(short_targets, 1, MB_ERR_FORMAT, "N differs");
#undef CASE
    memset(&o, 0, sizeof o);
    int64_t keep = g.ends[5 * 3 + 0];
    g.ends[5 * 3 + 0] = g.nb[0] + 3;
    file_error(&g, &o, MB_ERR_FORMAT, "'ends'[5][0] (timeframe 0) = ");
    g.ends[5 * 3 + 0] = keep;
    /* sizes that overflow: an unwritten chunked bars_1 of 2^61 rows costs nothing to create */
    const char *path = fx_path("huge.h5");
    sx_write(path, &g, &o);
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(file, "bars_1", H5P_DEFAULT);
    hsize_t dims[2] = {(hsize_t)1 << 61, (hsize_t)g.f};
    H5Dclose(sx_dataset(file, "bars_1", H5T_IEEE_F32LE, 2, dims, 1));
    H5Fclose(file);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, path, NULL), MB_ERR_OVERFLOW, "overflows");
    dims[0] = (hsize_t)1 << 40; /* 8 TiB: over the default cap of 1 TiB */
    file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(file, "bars_1", H5P_DEFAULT);
    H5Dclose(sx_dataset(file, "bars_1", H5T_IEEE_F32LE, 2, dims, 1));
    H5Fclose(file);
    tu_assert_error(mb_dataset_open_file(&ds, path, NULL), MB_ERR_OVERFLOW, "exceed the cap");
    gen_free(&g);
}

// ---- prepare --layout series + train_multitf ----

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

/* train_multitf's summary line without its timing (samples_per_s). */
static int train_summary(const char *dir, const char *tag, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/%s_tr.h5 --val %s/%s_va.h5 --epochs 2 --batch 16 "
             "--hidden 4 --head 8 --export %s/%s.safetensors 2>&1", dir, tag, dir, tag, dir, tag);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[1024];
    out[0] = 0;
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "epoch ", 6)) { char *sps = strstr(line, "  "); if (sps) strcpy(sps, "\n"); strncat(out, line, cap - strlen(out) - 1); }
        if (!strncmp(line, "summary:", 8)) { char *sps = strstr(line, " samples_per_s"); if (sps) strcpy(sps, "\n"); strncat(out, line, cap - strlen(out) - 1); }
    }
    return pclose(p) == 0 ? 0 : -1;
}

static void test_prepare_and_train_same_losses(void **state) {
    (void)state;
    if (access("build/prepare", X_OK) != 0 || access("build/train_multitf", X_OK) != 0) {
        const char *ci = getenv("CI");
        if (ci && !strcmp(ci, "true")) fail_msg("build/prepare or build/train_multitf is not built (CI=true: a missing build fails)");
        printf("skipped: build/prepare or build/train_multitf is not built (make build)\n");
        skip();
    }
    char dir[] = "/tmp/mb_series_XXXXXX", cmd[1024];
    assert_non_null(mkdtemp(dir));
    const char *layout[2] = {"window", "series"}, *tag[2] = {"w", "s"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "build/prepare --synthetic --bars 20000 --features 3 --targets 2 --stride 9 --quiet "
                 "--layout %s --out-train %s/%s_tr.h5 --out-val %s/%s_va.h5", layout[i], dir, tag[i], dir, tag[i]);
        assert_int_equal(system(cmd), 0);
    }
    char sum[2][2048];
    for (int i = 0; i < 2; i++) assert_int_equal(train_summary(dir, tag[i], sum[i], sizeof sum[i]), 0);
    printf("    %s", sum[1]);
    assert_non_null(strstr(sum[0], "summary: epochs=2"));
    assert_string_equal(sum[0], sum[1]); /* the same losses, every epoch, to the printed digit */
    /* the same weights file: the same weights and the normalisation read from either layout */
    snprintf(cmd, sizeof cmd, "cmp -s %s/w.safetensors %s/s.safetensors", dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -q '\"feature_std\":\"[-0-9]' %s/s.safetensors", dir); /* it is there */
    assert_int_equal(system(cmd), 0);
    long w = file_size(tu_path(dir, "w_tr.h5")), s = file_size(tu_path(dir, "s_tr.h5"));
    printf("    train file: window %ld bytes, series %ld bytes (%.0fx smaller)\n", w, s, (double)w / (double)s);
    assert_true(s > 0 && w > 20 * s);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    tu_seed();
    (void)fx_write; (void)fx_data;
    if (getenv("MB_TEST_SKIP")) cmocka_set_skip_filter(getenv("MB_TEST_SKIP")); /* e.g. "*train*" in seed sweeps */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_match_windows),
        cmocka_unit_test(test_batches_match_window_layout),
        cmocka_unit_test(test_fallbacks),
        cmocka_unit_test(test_validation_memory),
        cmocka_unit_test(test_file_roundtrip),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_prepare_and_train_same_losses),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    fx_cleanup();
    return r;
}
