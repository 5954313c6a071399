/* examples/prepare.c: CSV formats and bad rows, resampling, no look-ahead in the sample
 * windows, and the written HDF5 files. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include <sys/wait.h>
#define PREPARE_NO_MAIN
#include "../examples/prepare.c"

static int parse(const char *text, int skip_bad, mbc_bars *out, size_t *skipped) {
    char *buf = strdup(text);
    int r = mbc_parse_csv(buf, skip_bad, out, skipped);
    free(buf);
    return r;
}

static void test_csv_mt5_tab(void **state) {
    (void)state;
    mbc_bars b;
    size_t sk;
    const char *csv = "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\r\n"
                      "2024.01.02\t00:00:00\t1.10000\t1.10100\t1.09900\t1.10050\t120\t0\t5\r\n"
                      "2024.01.02\t00:01:00\t1.10050\t1.10060\t1.10000\t1.10010\t80\t0\t5\r\n";
    assert_int_equal(parse(csv, 0, &b, &sk), 0);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.t[0], mbc_days_from_civil(2024, 1, 2) * 86400);
    assert_int_equal(b.t[1] - b.t[0], 60);
    assert_true(b.o[0] == 1.1 && b.h[0] == 1.101 && b.l[0] == 1.099 && b.c[0] == 1.1005 && b.v[0] == 120);
    mbc_bars_free(&b);
    assert_int_equal(mbc_days_from_civil(1970, 1, 1), 0);
    assert_int_equal(mbc_days_from_civil(2000, 3, 1), 11017);
}

static void test_csv_mt4_histdata_utf16(void **state) {
    (void)state;
    mbc_bars b;
    size_t sk;
    assert_int_equal(parse("2024.01.02,00:00,1.1,1.2,1.0,1.15,10\n2024.01.02,00:01,1.15,1.2,1.1,1.12,11\n", 0, &b, &sk), 0);
    assert_int_equal(b.n, 2);
    assert_true(b.c[1] == 1.12 && b.t[1] - b.t[0] == 60);
    mbc_bars_free(&b);
    assert_int_equal(parse("20240102 000000;1.1;1.2;1.0;1.15;10\n20240102 000100;1.15;1.2;1.1;1.12;0\n", 0, &b, &sk), 0);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.t[0], mbc_days_from_civil(2024, 1, 2) * 86400);
    mbc_bars_free(&b);
    assert_int_equal(parse("2024-01-02,00:01:00,1,1,1,1\n", 0, &b, &sk), 0);
    assert_int_equal(b.t[0] % 86400, 60);
    mbc_bars_free(&b);
    /* UTF-16LE with BOM, as MetaTrader 5 writes it */
    const char *ascii = "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\n2024.01.02\t00:00\t1\t2\t0.5\t1.5\t3\n";
    size_t n = strlen(ascii), len = 2 + 2 * n;
    unsigned char *u16 = (unsigned char *)malloc(len + 1);
    u16[0] = 0xFF; u16[1] = 0xFE;
    for (size_t i = 0; i < n; i++) { u16[2 + 2 * i] = (unsigned char)ascii[i]; u16[3 + 2 * i] = 0; }
    mbc_decode_text(&u16, &len);
    u16[len] = 0;
    assert_string_equal((char *)u16, ascii);
    assert_int_equal(mbc_parse_csv((char *)u16, 0, &b, &sk), 0);
    assert_true(b.n == 1 && b.h[0] == 2 && b.v[0] == 3);
    mbc_bars_free(&b);
    free(u16);
    /* UTF-8 BOM */
    unsigned char *u8 = (unsigned char *)strdup("\xEF\xBB\xBF" "2024.01.02,00:00,1,1,1,1\n");
    size_t l8 = strlen((char *)u8);
    mbc_decode_text(&u8, &l8);
    u8[l8] = 0;
    assert_int_equal(mbc_parse_csv((char *)u8, 0, &b, &sk), 0);
    mbc_bars_free(&b);
    free(u8);
}

static void test_csv_bad_rows(void **state) {
    (void)state;
    const char *head = "2024.01.02,00:00,1.1,1.2,1.0,1.15,10\n";
    struct { const char *row, *why; } bad[] = {
        {"2024.13.02,00:01,1.1,1.2,1.0,1.15,10\n", "line 2: bad date '2024.13.02'"},
        {"2024.01.02,25:01,1.1,1.2,1.0,1.15,10\n", "line 2: bad time '25:01'"},
        {"2024.01.02,00:01,1.1,abc,1.0,1.15,10\n", "line 2: bad number 'abc'"},
        {"2024.01.02,00:01,1.1,1.2\n", "line 2: expected at least 6 fields"},
        {"2024.01.02,00:00,1.1,1.2,1.0,1.15,10\n", "line 2: bar has the same time as the previous bar (duplicate)"},
        {"2024.01.01,23:59,1.1,1.2,1.0,1.15,10\n", "line 2: bar is older than the previous bar (out of order)"},
        {"2024.01.02,00:01:20,1.1,1.2,1.0,1.15,10\n", "line 2: bar time is not on a minute boundary"},
        {"2024.01.02,00:01,1.1,1.0,1.2,1.15,10\n", "line 2: high 1 < low 1.2"},
        {"2024.01.02,00:01,0,1.2,1.0,1.15,10\n", "line 2: non-positive price"},
        {"2024.01.02,00:01,1.1,1.2,1.0,-1.15,10\n", "line 2: non-positive price"},
        {"2024.01.02,00:01,1.1,1.2,1.0,1.15,-3\n", "line 2: negative volume"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[256];
        snprintf(text, sizeof text, "%s%s2024.01.02,00:05,1.1,1.2,1.0,1.15,10\n", head, bad[i].row);
        mbc_bars b;
        size_t sk = 99;
        assert_int_equal(parse(text, 0, &b, &sk), -1);
        if (!strstr(mbc_error, bad[i].why)) fail_msg("row %zu: '%s' lacks '%s'", i, mbc_error, bad[i].why);
        assert_int_equal(parse(text, 1, &b, &sk), 0); /* skip mode: counted, the rest kept */
        assert_int_equal(sk, 1);
        assert_int_equal(b.n, 2);
        mbc_bars_free(&b);
    }
    mbc_bars b;
    size_t sk;
    assert_int_equal(parse("<DATE>\t<TIME>\n\n", 0, &b, &sk), -1);
    assert_non_null(strstr(mbc_error, "no bars"));
    assert_int_equal(mbc_read_csv_file("/nonexistent/x.csv", 0, &b, &sk), -1);
    assert_non_null(strstr(mbc_error, "cannot open '/nonexistent/x.csv'"));
}

/* Bars come from the incremental engine (tests/test_features.c checks it against a batch
 * resample): M1 minutes 0..6 and 11 (a gap) give M5 buckets [0,5), [5,10), [10,15), the
 * last still forming at the end of the data, so not in the series. */
static void test_resample(void **state) {
    (void)state;
    mbc_bars m1;
    memset(&m1, 0, sizeof m1);
    int64_t t0 = mbc_days_from_civil(2024, 1, 2) * 86400;
    int mins[] = {0, 1, 2, 3, 4, 5, 6, 11};
    for (int i = 0; i < 8; i++) mbc_bars_push(&m1, t0 + mins[i] * 60, 10 + i, 11 + i + (i == 2 ? 5 : 0), 9 + i, 10.5 + i, 1);
    series s;
    assert_int_equal(series_build(&m1, 4, &s), 0);
    const mbc_bars *m5 = &s.tf[1];
    assert_int_equal(m5->n, 2);
    assert_int_equal(s.tf[0].n, 8);
    assert_true(m5->t[0] == t0 && m5->t[1] == t0 + 300);
    assert_true(m5->o[0] == 10 && m5->h[0] == 18 && m5->l[0] == 9 && m5->c[0] == 14.5 && m5->v[0] == 5);
    assert_true(m5->o[1] == 15 && m5->c[1] == 16.5 && m5->v[1] == 2);
    /* closed-bar count: the bucket [5,10) closes at minute 10 */
    assert_int_equal(closed_bars(m5, 5, t0 + 9 * 60), 1);
    assert_int_equal(closed_bars(m5, 5, t0 + 10 * 60), 2);
    series_free(&s);
    /* a bar off the minute is refused with its number */
    m1.t[7] += 30;
    assert_int_equal(series_build(&m1, 4, &s), -1);
    assert_non_null(strstr(mbc_error, "M1 bar 8"));
    assert_non_null(strstr(mbc_error, "not on a minute boundary"));
    series_free(&s);
    mbc_bars_free(&m1);
}

/* Sample t's features must not change when every bar after t changes, and must change
 * when the bar that closes at t changes (so the check can fail). */
static void test_no_look_ahead(void **state) {
    (void)state;
    mbc_bars m1;
    assert_int_equal(make_synthetic(20000, 7, &m1), 0);
    series s;
    assert_int_equal(series_build(&m1, MAXF, &s), 0);
    size_t row = (size_t)1104 * MAXF;
    float *a = tu_alloc_f32(row), *b = tu_alloc_f32(row);
    for (int trial = 0; trial < 6; trial++) {
        size_t i = 13000 + (size_t)tu_int(0, 5000);      /* M1 bar whose close is t */
        int64_t t = m1.t[i] + 60;
        assert_int_equal(sample_features(&s, t, a), 0);
        mbc_bars p = m1;                                       /* perturb every bar after i */
        p.o = (double *)malloc(m1.n * sizeof(double)); p.h = (double *)malloc(m1.n * sizeof(double));
        p.l = (double *)malloc(m1.n * sizeof(double)); p.c = (double *)malloc(m1.n * sizeof(double));
        p.v = (double *)malloc(m1.n * sizeof(double));
        for (size_t j = 0; j < m1.n; j++) {
            double k = j > i ? 1.5 + tu_uniform(0, 1) : 1.0;
            p.o[j] = m1.o[j] * k; p.h[j] = m1.h[j] * k * (j > i ? 1.01 : 1.0); p.l[j] = m1.l[j] * k; p.c[j] = m1.c[j] * k;
            p.v[j] = m1.v[j] * (j > i ? 3 : 1);
        }
        series s2;
        assert_int_equal(series_build(&p, MAXF, &s2), 0);
        assert_int_equal(sample_features(&s2, t, b), 0);
        assert_memory_equal(a, b, row * sizeof(float));
        series_free(&s2);
        p.c[i] *= 1.001;                                   /* now the bar closing at t */
        assert_int_equal(series_build(&p, MAXF, &s2), 0);
        assert_int_equal(sample_features(&s2, t, b), 0);
        assert_memory_not_equal(a, b, row * sizeof(float));
        series_free(&s2);
        free(p.o); free(p.h); free(p.l); free(p.c); free(p.v);
    }
    free(a); free(b);
    series_free(&s);
    mbc_bars_free(&m1);
}

static void test_write_files(void **state) {
    (void)state;
    char dir[] = "/tmp/mb_prep_XXXXXX", tr[128], va[128];
    assert_non_null(mkdtemp(dir));
    snprintf(tr, sizeof tr, "%s/train.h5", dir);
    snprintf(va, sizeof va, "%s/val.h5", dir);
    mbc_bars m1;
    assert_int_equal(make_synthetic(30000, 3, &m1), 0);
    prep_config c = {4, 6, 60, 0.25, 0, 1, tr, va, 0};
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    assert_int_equal(prepare(&m1, &c), 0);
    hid_t f = H5Fopen(tr, H5F_ACC_RDONLY, H5P_DEFAULT), g = H5Fopen(va, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0 && g >= 0);
    hid_t d = H5Dopen2(f, "features", H5P_DEFAULT), sp = H5Dget_space(d);
    hsize_t dims[3];
    assert_int_equal(H5Sget_simple_extent_ndims(sp), 3);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    assert_true(dims[0] > 10 && dims[1] == 1104 && dims[2] == 4);
    int seg[5];
    hid_t at = H5Aopen(d, "segments", H5P_DEFAULT);
    H5Aread(at, H5T_NATIVE_INT, seg);
    assert_true(seg[0] == 480 && seg[1] == 288 && seg[2] == 192 && seg[3] == 96 && seg[4] == 48);
    H5Aclose(at); H5Sclose(sp); H5Dclose(d);
    /* validation starts after the last training target's horizon */
    int64_t last_train, first_val;
    hid_t tt = H5Dopen2(f, "times", H5P_DEFAULT), vt = H5Dopen2(g, "times", H5P_DEFAULT);
    hid_t ts = H5Dget_space(tt);
    hsize_t nt;
    H5Sget_simple_extent_dims(ts, &nt, NULL);
    int64_t *times = (int64_t *)malloc(nt * sizeof(int64_t));
    H5Dread(tt, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, times);
    last_train = times[nt - 1];
    for (hsize_t i = 1; i < nt; i++) assert_true(times[i] > times[i - 1]);
    hsize_t one = 1, zero = 0;
    hid_t ms = H5Screate_simple(1, &one, NULL), vs = H5Dget_space(vt);
    H5Sselect_hyperslab(vs, H5S_SELECT_SET, &zero, NULL, &one, NULL);
    H5Dread(vt, H5T_NATIVE_INT64, ms, vs, H5P_DEFAULT, &first_val);
    assert_true(first_val - last_train > 5 * 6 * 60);
    free(times);
    H5Sclose(ms); H5Sclose(vs); H5Sclose(ts); H5Dclose(tt); H5Dclose(vt); H5Fclose(f); H5Fclose(g);
    remove(tr); remove(va);
    /* the widest rows: every feature, finite */
    prep_config wide = {MAXF, 6, 60, 0.25, 12, 1, tr, va, 0};
    assert_int_equal(prepare(&m1, &wide), 0);
    f = H5Fopen(tr, H5F_ACC_RDONLY, H5P_DEFAULT);
    d = H5Dopen2(f, "features", H5P_DEFAULT);
    sp = H5Dget_space(d);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    assert_true(dims[0] == 9 && dims[1] == 1104 && dims[2] == MAXF);
    size_t cnt = (size_t)(dims[0] * dims[1] * dims[2]);
    float *all = tu_alloc_f32(cnt);
    assert_true(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0);
    for (size_t i = 0; i < cnt; i++) if (!isfinite(all[i])) fail_msg("feature value %zu is %g", i, all[i]);
    free(all);
    H5Sclose(sp); H5Dclose(d); H5Fclose(f);
    remove(tr); remove(va); rmdir(dir);
    /* too little data is a clear error */
    mbc_bars tiny;
    assert_int_equal(make_synthetic(3000, 3, &tiny), 0);
    assert_int_equal(prepare(&tiny, &c), -1);
    assert_non_null(strstr(mbc_error, "too little data"));
    mbc_bars_free(&tiny);
    mbc_bars_free(&m1);
}

/* The command line: bad flags exit 2 with one `error: ...` line (run from the repo root). */
static void test_cli_errors(void **state) {
    (void)state;
    FILE *probe = fopen("build/prepare", "rb");
    if (!probe) skip(); /* make test builds it first; a bare test run may not have it */
    fclose(probe);
    struct { const char *args, *want; } cases[] = {
        {"", "give exactly one of --synthetic or --csv FILE"},
        {"--synthetic --csv x.csv", "give exactly one"},
        {"--synthetic --features 170", "--features '170': expected an integer in [1, 169]"},
        {"--synthetic --features 0", "--features '0': expected an integer in [1, 169]"},
        {"--synthetic --features 2.5", "--features '2.5': expected an integer in [1, 169]"},
        {"--synthetic --stride 0", "--stride '0': expected an integer in [1, 100000]"},
        {"--synthetic --val-fraction 1.5", "--val-fraction '1.5': expected a number in [1e-09, 0.999999999]"},
        {"--synthetic --layout tiles", "--layout 'tiles': expected window or series"},
        {"--synthetic --out-train /dev/null/dir/t.h5", "--out-train '/dev/null/dir/t.h5': a part of the path is not a directory"},
        {"--synthetic --out-train /tmp", "--out-train '/tmp': is a directory"},
        {"--synthetic --out-train /tmp/mb_v.h5", "--out-val '/tmp/mb_v.h5' is also --out-train '/tmp/mb_v.h5'"},
        {"--synthetic --write-mt5 /nonexistent/x.csv", "--write-mt5 '/nonexistent/x.csv': its directory '/nonexistent' does not exist"},
        {"--synthetic --bars 30000 --bars 20000", "--bars given twice ('30000', then '20000')"},
        {"--synthetic --bogus", "unknown flag '--bogus'"},
        {"--csv", "--csv needs a value"},
        {"--csv /nonexistent.csv", "cannot open '/nonexistent.csv'"},
        {"--synthetic --bars 2000 --quiet", "too little data"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[256], line[512] = "";
        snprintf(cmd, sizeof cmd, "build/prepare %s %s %s 2>&1 >/dev/null", /* a flag is given once */
                 strstr(cases[i].args, "--out-train") ? "" : "--out-train /tmp/mb_t.h5",
                 strstr(cases[i].args, "--out-val") ? "" : "--out-val /tmp/mb_v.h5", cases[i].args);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        int rc = pclose(p);
        assert_int_equal(WEXITSTATUS(rc), 2);
        if (strncmp(line, "error: ", 7) != 0 || !strstr(line, cases[i].want))
            fail_msg("'%s': got '%s', want 'error: ...%s'", cases[i].args, line, cases[i].want);
    }
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_mt5_tab),    cmocka_unit_test(test_csv_mt4_histdata_utf16),
        cmocka_unit_test(test_csv_bad_rows),   cmocka_unit_test(test_resample),
        cmocka_unit_test(test_no_look_ahead),  cmocka_unit_test(test_write_files),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests_name("prepare", tests, NULL, NULL);
}
