/* dataset: HDF5 files (contiguous, chunked + gzip/shuffle, float64/int16 converted,
 * rank-1 targets, segments, custom names) and in-memory datasets read back exactly;
 * every bad input its own error; NaN policies; HDF5 never prints. */
#define _GNU_SOURCE /* mkdtemp, truncate */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"
#include <fcntl.h>
#include <sys/stat.h>

enum { N = 11, T = 5, F = 3, K = 2 };
static float g_feat[N * T * F], g_targ[N * K];

static mb_dataset *open_ok(const char *path, const mb_dataset_config *cfg) {
    mb_dataset *ds = NULL;
    tu_ok(mb_dataset_open_file(&ds, path, cfg));
    return ds;
}

/* Read [a, b) and compare with the source rows (exact for float32 storage). */
static void check_range(mb_dataset *ds, int64_t a, int64_t b, const float *feat, const float *targ, int64_t k,
                        double tol) {
    size_t rows = (size_t)(b - a);
    float *f = tu_alloc_f32(rows * T * F), *t = tu_alloc_f32(rows * (size_t)k);
    int64_t got = -1;
    tu_ok(mb_dataset_read(ds, a, b, f, t, &got));
    assert_int_equal(got, b - a);
    tu_assert_close(f, feat + (size_t)a * T * F, rows * T * F, tol, 0, "features");
    tu_assert_close(t, targ + (size_t)a * (size_t)k, rows * (size_t)k, tol, 0, "targets");
    free(f);
    free(t);
}

static void check_all_ranges(mb_dataset *ds, const float *feat, const float *targ, int64_t k, double tol) {
    check_range(ds, 0, N, feat, targ, k, tol);
    for (int i = 0; i < 6; i++) {
        int64_t a = tu_int(0, N - 1), b = tu_int((int)a + 1, N);
        check_range(ds, a, b, feat, targ, k, tol);
    }
}

static void test_contiguous_f32(void **state) {
    (void)state;
    const char *p = fx_path("contig.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    mb_dataset *ds = open_ok(p, NULL);
    const mb_dataset_meta *m = mb_dataset_info(ds);
    assert_int_equal(m->n, N); assert_int_equal(m->t, T); assert_int_equal(m->f, F); assert_int_equal(m->k, K);
    assert_int_equal(m->bytes_per_sample, (T * F + K) * 4);
    assert_int_equal(m->total_bytes, N * (T * F + K) * 4);
    assert_int_equal(m->segments, 0);
    assert_string_equal(m->features_type, "float32");
    assert_string_equal(m->source, p);
    check_all_ranges(ds, g_feat, g_targ, K, 0);
    int64_t rows = -1;
    tu_ok(mb_dataset_read(ds, 4, 4, NULL, NULL, &rows)); /* empty range */
    assert_int_equal(rows, 0);
    mb_dataset_close(ds);
}

static void test_chunked_gzip_shuffle(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.chunked = 1;
    const char *p = fx_path("chunked.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset *ds = open_ok(p, NULL);
    check_all_ranges(ds, g_feat, g_targ, K, 0);
    mb_dataset_close(ds);
    o.gzip = 1;
    p = fx_path("gzip.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.chunk_cache_bytes = 1 << 20;
    ds = open_ok(p, &cfg);
    check_all_ranges(ds, g_feat, g_targ, K, 0);
    mb_dataset_close(ds);
}

static char g_log[4096];
static void capture_log(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    (void)level; (void)file; (void)line; (void)user;
    size_t len = strlen(g_log);
    snprintf(g_log + len, sizeof g_log - len, "%s\n", msg);
}

static void test_float64_and_int_converted(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.ftype = H5T_IEEE_F64LE;
    o.ttype = H5T_STD_I16LE;
    float ti[N * K];
    for (int i = 0; i < N * K; i++) ti[i] = (float)tu_int(-300, 300);
    const char *p = fx_path("f64.h5");
    fx_write(p, g_feat, ti, N, T, F, K, &o);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.log.fn = capture_log;
    cfg.log.max = MB_LOG_INFO;
    g_log[0] = 0;
    mb_dataset *ds = open_ok(p, &cfg);
    assert_string_equal(mb_dataset_info(ds)->features_type, "float64");
    assert_string_equal(mb_dataset_info(ds)->targets_type, "int16");
    assert_non_null(strstr(g_log, "converts to float32"));
    check_all_ranges(ds, g_feat, ti, K, 0);
    mb_dataset_close(ds);
}

static void test_targets_rank1_and_names(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.targets_rank1 = 1;
    o.fname = "x";
    o.tname = "y";
    const char *p = fx_path("rank1.h5");
    fx_write(p, g_feat, g_targ, N, T, F, 1, &o);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.features_name = "x";
    cfg.targets_name = "y";
    mb_dataset *ds = open_ok(p, &cfg);
    assert_int_equal(mb_dataset_info(ds)->k, 1);
    check_all_ranges(ds, g_feat, g_targ, 1, 0);
    mb_dataset_close(ds);
}

static void test_segments(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.segments = "2,2,1";
    o.names = "M1,M5,H1";
    const char *p = fx_path("seg.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset *ds = open_ok(p, NULL);
    const mb_dataset_meta *m = mb_dataset_info(ds);
    assert_int_equal(m->segments, 3);
    assert_int_equal(m->segment_len[0], 2);
    assert_int_equal(m->segment_len[2], 1);
    assert_string_equal(m->segment_name[0], "M1");
    assert_string_equal(m->segment_name[2], "H1");
    mb_dataset_close(ds);
}

/* segment_names as h5py writes it: attrs['segment_names'] = "M1,M5" is a scalar
 * variable-length UTF-8 string; numpy's fixed-length strings and HDF5's C strings are
 * fixed-length (UTF-8 or ASCII, NUL- or space-padded). Each loads. A string longer than
 * the names can hold, an array of strings and an empty string are refused. */
static const char *write_names(const char *file, const char *text, int vlen, H5T_cset_t cset, H5T_str_t pad,
                               hsize_t count) {
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.segments = "2,3";
    const char *p = fx_path(file);
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT), d = H5Dopen2(f, "features", H5P_DEFAULT);
    hid_t ty = H5Tcopy(H5T_C_S1), sp = count ? H5Screate_simple(1, &count, NULL) : H5Screate(H5S_SCALAR);
    assert_true(H5Tset_size(ty, vlen ? H5T_VARIABLE : strlen(text)) >= 0);
    assert_true(H5Tset_cset(ty, cset) >= 0 && H5Tset_strpad(ty, pad) >= 0);
    hid_t a = H5Acreate2(d, "segment_names", ty, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0);
    const char *many[2] = {text, text};
    size_t len = strlen(text);
    char *fixed = (char *)calloc(2 * len + 1, 1);               /* one or two elements back to back */
    memcpy(fixed, text, len);
    if (count) memcpy(fixed + len, text, len);
    assert_true(H5Awrite(a, ty, vlen ? (const void *)many : (const void *)fixed) >= 0);
    free(fixed);
    H5Aclose(a); H5Sclose(sp); H5Tclose(ty); H5Dclose(d); H5Fclose(f);
    return p;
}

static void test_segment_names_utf8(void **state) {
    (void)state;
    struct { int vlen; H5T_cset_t cset; H5T_str_t pad; const char *text; } ok[] = {
        {1, H5T_CSET_UTF8, H5T_STR_NULLTERM, "M1,M5"},           /* h5py's default */
        {0, H5T_CSET_UTF8, H5T_STR_NULLPAD, "M1,M5"},            /* numpy fixed-length, UTF-8 */
        {0, H5T_CSET_UTF8, H5T_STR_NULLTERM, "\xc2\xb5s,H\xc3\xa9"}, /* "µs,Hé": non-ASCII names */
        {1, H5T_CSET_ASCII, H5T_STR_NULLTERM, "M1,M5"},
        {0, H5T_CSET_ASCII, H5T_STR_SPACEPAD, "M1,M5"},
        {0, H5T_CSET_ASCII, H5T_STR_NULLPAD, "M1,M5"},           /* np.bytes_ */
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        const char *p = write_names("names.h5", ok[i].text, ok[i].vlen, ok[i].cset, ok[i].pad, 0);
        mb_dataset *ds = NULL;
        if (mb_dataset_open_file(&ds, p, NULL) != MB_OK) fail_msg("case %zu: %s", i, mb_last_error());
        const mb_dataset_meta *m = mb_dataset_info(ds);
        char want[2][16];
        sscanf(ok[i].text, "%15[^,],%15s", want[0], want[1]);
        assert_int_equal(m->segments, 2);
        assert_string_equal(m->segment_name[0], want[0]);
        assert_string_equal(m->segment_name[1], want[1]);
        mb_dataset_close(ds);
    }
    mb_dataset *ds;
    char long_text[3000];
    memset(long_text, 'a', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    long_text[5] = ',';
    tu_assert_error(mb_dataset_open_file(&ds, write_names("long.h5", long_text, 1, H5T_CSET_UTF8, H5T_STR_NULLTERM, 0),
                    NULL), MB_ERR_FORMAT, "'segment_names' too long (2999 bytes)");
    tu_assert_error(mb_dataset_open_file(&ds, write_names("long2.h5", long_text, 0, H5T_CSET_UTF8, H5T_STR_NULLPAD, 0),
                    NULL), MB_ERR_FORMAT, "'segment_names' too long (2999 bytes)");
    tu_assert_error(mb_dataset_open_file(&ds, write_names("arr.h5", "M1,M5", 1, H5T_CSET_UTF8, H5T_STR_NULLTERM, 2),
                    NULL), MB_ERR_FORMAT, "must be one string (\"A,B,C\"); it has 2 elements");
    tu_assert_error(mb_dataset_open_file(&ds, write_names("empty.h5", "", 1, H5T_CSET_UTF8, H5T_STR_NULLTERM, 0),
                    NULL), MB_ERR_FORMAT, "has 1 names for 2 segments");
    /* a name cut to MB_MAX_NAME - 1 bytes ends on a whole UTF-8 character */
    char cut[200] = "M1,";
    for (int i = 0; i < 60; i++) strcat(cut, "\xc3\xa9"); /* 120 bytes of "é" */
    assert_int_equal(mb_dataset_open_file(&ds, write_names("cut.h5", cut, 1, H5T_CSET_UTF8, H5T_STR_NULLTERM, 0), NULL),
                     MB_OK);
    const char *n1 = mb_dataset_info(ds)->segment_name[1];
    size_t len = strlen(n1);
    assert_true(len >= (size_t)MB_MAX_NAME - 2 && len <= (size_t)MB_MAX_NAME - 1 && len % 2 == 0);
    mb_dataset_close(ds);
}

static void test_memory_dataset(void **state) {
    (void)state;
    mb_dataset *ds = NULL;
    tu_ok(mb_dataset_open_memory(&ds, g_feat, g_targ, N, T, F, K, NULL));
    assert_string_equal(mb_dataset_info(ds)->source, "memory");
    check_all_ranges(ds, g_feat, g_targ, K, 0);
    tu_assert_error(mb_dataset_read(ds, 3, N + 1, g_feat, g_targ, NULL), MB_ERR_INVALID_ARG, "outside [0, 11)");
    tu_assert_error(mb_dataset_read(ds, 5, 4, g_feat, g_targ, NULL), MB_ERR_INVALID_ARG, "range [5, 4)");
    mb_dataset_close(ds);
    tu_assert_error(mb_dataset_open_memory(&ds, g_feat, g_targ, 0, T, F, K, NULL), MB_ERR_FORMAT, "zero dimension");
    tu_assert_error(mb_dataset_open_memory(&ds, NULL, g_targ, N, T, F, K, NULL), MB_ERR_INVALID_ARG, "NULL");
    assert_null(ds);
}

/* ---- bad input: each its own test ---- */

static void test_bad_missing_file(void **state) {
    (void)state;
    mb_dataset *ds = (mb_dataset *)1;
    tu_assert_error(mb_dataset_open_file(&ds, fx_path("nope.h5"), NULL), MB_ERR_IO, "nope.h5: cannot open");
    assert_null(ds);
}

static void test_bad_not_hdf5(void **state) {
    (void)state;
    const char *p = fx_path("text.h5");
    FILE *fp = fopen(p, "w");
    fputs("features,targets\n1,2\n", fp);
    fclose(fp);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "text.h5: not an HDF5 file");
}

static void test_bad_missing_dataset(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.tname = "labels";
    const char *p = fx_path("missing.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "missing.h5: missing dataset 'targets'");
}

static void test_bad_group_not_dataset(void **state) {
    (void)state;
    const char *p = fx_path("group.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    hid_t file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Gclose(H5Gcreate2(file, "grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Fclose(file);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.features_name = "grp";
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, &cfg), MB_ERR_FORMAT, "'grp' is a group, not a dataset");
}

static void test_bad_rank(void **state) {
    (void)state;
    const char *p = fx_path("rank.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d2[2] = {N, T * F}, dt[2] = {N, K};
    hid_t s = H5Screate_simple(2, d2, NULL), st = H5Screate_simple(2, dt, NULL);
    H5Dclose(H5Dcreate2(file, "features", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dclose(H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(s); H5Sclose(st); H5Fclose(file);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "dataset 'features' has rank 2, expected 3");
}

static void test_bad_zero_dim(void **state) {
    (void)state;
    const char *p = fx_path("zero.h5");
    fx_write(p, g_feat, g_targ, N, T, 0, K, NULL);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "zero dimension");
}

static void test_bad_n_mismatch(void **state) {
    (void)state;
    const char *p = fx_path("nmis.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d3[3] = {N, T, F}, dt[2] = {N - 1, K};
    hid_t s = H5Screate_simple(3, d3, NULL), st = H5Screate_simple(2, dt, NULL);
    hid_t a = H5Dcreate2(file, "features", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t b = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(a, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_feat);
    H5Dwrite(b, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_targ);
    H5Dclose(a); H5Dclose(b); H5Sclose(s); H5Sclose(st); H5Fclose(file);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "N differs: 'features' has 11 samples, 'targets' has 10");
}

static void test_bad_dtype(void **state) {
    (void)state;
    const char *p = fx_path("str.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d3[3] = {N, T, F}, dt[2] = {N, K};
    hid_t s = H5Screate_simple(3, d3, NULL), st = H5Screate_simple(2, dt, NULL), ty = H5Tcopy(H5T_C_S1);
    H5Tset_size(ty, 8);
    H5Dclose(H5Dcreate2(file, "features", ty, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dclose(H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Tclose(ty); H5Sclose(s); H5Sclose(st); H5Fclose(file);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'features' has dtype string, not a number");
}

/* Chunked datasets with huge shapes and no data written: the file stays tiny. */
static void write_huge(const char *p, hsize_t n, hsize_t t, hsize_t f) {
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d3[3] = {n, t, f}, dt[2] = {n, 1}, c3[3] = {1, 1, 1}, c2[2] = {1, 1};
    hid_t s = H5Screate_simple(3, d3, NULL), st = H5Screate_simple(2, dt, NULL);
    hid_t p3 = H5Pcreate(H5P_DATASET_CREATE), p2 = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(p3, 3, c3);
    H5Pset_chunk(p2, 2, c2);
    hid_t a = H5Dcreate2(file, "features", H5T_IEEE_F32LE, s, H5P_DEFAULT, p3, H5P_DEFAULT);
    hid_t b = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, p2, H5P_DEFAULT);
    assert_true(a >= 0 && b >= 0);
    H5Dclose(a); H5Dclose(b); H5Pclose(p3); H5Pclose(p2); H5Sclose(s); H5Sclose(st); H5Fclose(file);
}

static void test_bad_byte_overflow(void **state) {
    (void)state;
    const char *p = fx_path("overflow.h5");
    write_huge(p, (hsize_t)1 << 40, (hsize_t)1 << 11, (hsize_t)1 << 11); /* 2^62 elements, 2^64 bytes */
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_OVERFLOW, "byte count overflows");
}

static void test_bad_over_cap(void **state) {
    (void)state;
    const char *p = fx_path("cap.h5");
    write_huge(p, (hsize_t)1 << 30, 1024, 1024); /* 4 PiB as float32 */
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_OVERFLOW, "exceed the cap of 1099511627776 bytes");
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.max_bytes = 100;
    tu_assert_error(mb_dataset_open_file(&ds, p, &cfg), MB_ERR_OVERFLOW, "748 bytes exceed the cap of 100 bytes");
}

static void test_bad_segments_sum(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.segments = "2,2";
    const char *p = fx_path("segsum.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'segments' of 'features' sums to 4, but T = 5");
}

static void test_bad_segment_names_count(void **state) {
    (void)state;
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.segments = "2,3";
    o.names = "M1,M5,H1";
    const char *p = fx_path("segnames.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "has 3 names for 2 segments");
}

static void test_bad_storage_smaller_than_shape(void **state) {
    (void)state;
    const char *p = fx_path("unwritten.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d3[3] = {N, T, F}, dt[2] = {N, K};
    hid_t s = H5Screate_simple(3, d3, NULL), st = H5Screate_simple(2, dt, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(pl, H5D_ALLOC_TIME_LATE);
    hid_t a = H5Dcreate2(file, "features", H5T_IEEE_F32LE, s, H5P_DEFAULT, pl, H5P_DEFAULT);
    hid_t b = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Dwrite(b, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_targ);
    H5Dclose(a); H5Dclose(b); H5Pclose(pl); H5Sclose(s); H5Sclose(st); H5Fclose(file);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT,
                    "dataset 'features' is truncated: 0 bytes stored, its shape needs 660");
}

static void test_bad_truncated_file(void **state) {
    (void)state;
    const char *p = fx_path("cut.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size / 2), 0);
    mb_dataset *ds;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_IO, "cut.h5: HDF5 cannot open the file: ");
    assert_non_null(strstr(mb_last_error(), "truncated"));
}

/* HDF5 prints nothing, even for its own errors; the caller's handler is restored. */
static void test_hdf5_silent(void **state) {
    (void)state;
    const char *out = fx_path("stderr.txt"), *p = fx_path("cut2.h5");
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    assert_int_equal(truncate(p, 100), 0);
    H5E_auto2_t fn0 = NULL, fn1 = NULL;
    void *d0 = NULL, *d1 = NULL;
    H5Eget_auto2(H5E_DEFAULT, &fn0, &d0);
    fflush(stderr);
    int saved = dup(2), fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    mb_dataset *ds;
    mb_result r1 = mb_dataset_open_file(&ds, p, NULL);
    mb_result r2 = mb_dataset_open_file(&ds, fx_path("text.h5"), NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    assert_int_not_equal(r1, MB_OK);
    assert_int_not_equal(r2, MB_OK);
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(sb.st_size, 0);
    H5Eget_auto2(H5E_DEFAULT, &fn1, &d1);
    assert_true(fn0 == fn1 && d0 == d1);
}

/* ---- NaN / Inf policies ---- */

static void nan_file(const char *p, float *feat, float *targ) {
    memcpy(feat, g_feat, sizeof g_feat);
    memcpy(targ, g_targ, sizeof g_targ);
    feat[4 * T * F + 7] = NAN;
    targ[8 * K + 1] = INFINITY;
    fx_write(p, feat, targ, N, T, F, K, NULL);
}

static void test_nan_error(void **state) {
    (void)state;
    static float feat[N * T * F], targ[N * K], f[N * T * F], t[N * K];
    const char *p = fx_path("nan.h5");
    nan_file(p, feat, targ);
    mb_dataset *ds = open_ok(p, NULL);
    tu_ok(mb_dataset_read(ds, 0, 4, f, t, NULL));
    tu_assert_error(mb_dataset_read(ds, 2, N, f, t, NULL), MB_ERR_NONFINITE, "'features': non-finite value nan at sample 4");
    tu_assert_error(mb_dataset_read(ds, 5, N, f, t, NULL), MB_ERR_NONFINITE, "'targets': non-finite value inf at sample 8");
    mb_dataset_close(ds);
    /* in memory too */
    tu_ok(mb_dataset_open_memory(&ds, feat, targ, N, T, F, K, NULL));
    tu_assert_error(mb_dataset_read(ds, 0, N, f, t, NULL), MB_ERR_NONFINITE, "at sample 4");
    mb_dataset_close(ds);
}

static void test_nan_skip(void **state) {
    (void)state;
    static float feat[N * T * F], targ[N * K], f[N * T * F], t[N * K];
    const char *p = fx_path("nan2.h5");
    nan_file(p, feat, targ);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.nan_policy = MB_NAN_SKIP;
    mb_dataset *ds = open_ok(p, &cfg);
    int64_t rows = 0;
    tu_ok(mb_dataset_read(ds, 3, N, f, t, &rows));
    assert_int_equal(rows, N - 3 - 2);
    int64_t want[] = {3, 5, 6, 7, 9, 10};
    for (int i = 0; i < 6; i++) {
        assert_memory_equal(f + (size_t)i * T * F, feat + (size_t)want[i] * T * F, T * F * sizeof(float));
        assert_memory_equal(t + (size_t)i * K, targ + (size_t)want[i] * K, K * sizeof(float));
    }
    tu_assert_error(mb_dataset_read(ds, 3, 5, f, t, NULL), MB_ERR_INVALID_ARG, "rows is NULL");
    mb_dataset_close(ds);
}

static void test_nan_zero(void **state) {
    (void)state;
    static float feat[N * T * F], targ[N * K], f[N * T * F], t[N * K];
    const char *p = fx_path("nan3.h5");
    nan_file(p, feat, targ);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.nan_policy = MB_NAN_ZERO;
    mb_dataset *ds = open_ok(p, &cfg);
    int64_t rows = 0;
    tu_ok(mb_dataset_read(ds, 0, N, f, t, &rows));
    assert_int_equal(rows, N);
    feat[4 * T * F + 7] = 0;
    targ[8 * K + 1] = 0;
    assert_memory_equal(f, feat, sizeof feat);
    assert_memory_equal(t, targ, sizeof targ);
    mb_dataset_close(ds);
    cfg.nan_policy = (mb_nan_policy)7;
    tu_assert_error(mb_dataset_open_file(&ds, p, &cfg), MB_ERR_INVALID_ARG, "unknown nan_policy 7");
}

static int teardown_all(void **state) {
    (void)state;
    fx_cleanup();
    return 0;
}

int main(void) {
    fx_data(g_feat, g_targ, N, T, F, K);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous_f32),          cmocka_unit_test(test_chunked_gzip_shuffle),
        cmocka_unit_test(test_float64_and_int_converted), cmocka_unit_test(test_targets_rank1_and_names),
        cmocka_unit_test(test_segments),                cmocka_unit_test(test_memory_dataset),
        cmocka_unit_test(test_segment_names_utf8),
        cmocka_unit_test(test_bad_missing_file),        cmocka_unit_test(test_bad_not_hdf5),
        cmocka_unit_test(test_bad_missing_dataset),     cmocka_unit_test(test_bad_group_not_dataset),
        cmocka_unit_test(test_bad_rank),                cmocka_unit_test(test_bad_zero_dim),
        cmocka_unit_test(test_bad_n_mismatch),          cmocka_unit_test(test_bad_dtype),
        cmocka_unit_test(test_bad_byte_overflow),       cmocka_unit_test(test_bad_over_cap),
        cmocka_unit_test(test_bad_segments_sum),        cmocka_unit_test(test_bad_segment_names_count),
        cmocka_unit_test(test_bad_storage_smaller_than_shape), cmocka_unit_test(test_bad_truncated_file),
        cmocka_unit_test(test_hdf5_silent),             cmocka_unit_test(test_nan_error),
        cmocka_unit_test(test_nan_skip),                cmocka_unit_test(test_nan_zero),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
