/* test_platform - the platform module of megabatch.h (threads, cores, memory, clock, files)
 * as a portable cmocka test: built natively and by make cross for Windows (run under Wine)
 * and ARM64 (qemu-aarch64), where tests/test_checkpoint.c and tests/test_export.c cannot
 * run (mkdtemp, fork, setrlimit, chmod). Covers: a checkpoint and a safetensors file written
 * and read back bit for bit under a UTF-8 path with non-ASCII characters (Windows: through
 * _wopen and MoveFileExW, not the ANSI code page); a second write replacing the first, no
 * .tmp left; a missing file and a truncated one refused; the device's cores and memory;
 * a pooled computation on several threads equal to the single-threaded one; the clock
 * monotonic; mb_dataset_open_untrusted and mb_dataset_probe refusing (MB_ERR_UNSUPPORTED). Files go to the current directory (Wine maps it to the same Linux one). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

#define DIR_UTF8 "mb_plat_\xc3\xa4\xe6\x97\xa5" /* "mb_plat_ä日" */

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s_%s", DIR_UTF8, name);
    return buf[k];
}

static int exists(const char *path) {
    FILE *f = NULL;
#ifdef _WIN32
    wchar_t *w = mb__wpath(path); /* the library's own conversion, to look where it wrote */
    if (w) f = _wfopen(w, L"rb");
    MB_FREE(w);
#else
    f = fopen(path, "rb");
#endif
    if (f) fclose(f);
    return f != NULL;
}

static void test_checkpoint_utf8_replace(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    enum { N = 1000 };
    float a[N], b[N], got[N];
    tu_fill(a, N, -1, 1);
    tu_fill(b, N, -1, 1);
    for (int round = 0; round < 2; round++) { /* the second write replaces the first */
        mb_ckpt_writer *w = NULL;
        tu_ok(mb_ckpt_writer_create(&w, dev));
        tu_ok(mb_ckpt_add(w, "x", round ? b : a, sizeof a));
        tu_ok(mb_ckpt_write(w, path_of("state.ckpt")));
        mb_ckpt_writer_destroy(w);
        assert_false(exists(path_of("state.ckpt.tmp")));
        mb_ckpt_reader *r = NULL;
        tu_ok(mb_ckpt_open(&r, dev, path_of("state.ckpt")));
        size_t bytes = 0;
        assert_true(mb_ckpt_has(r, "x", &bytes));
        assert_int_equal(bytes, sizeof a);
        tu_ok(mb_ckpt_get(r, "x", got, sizeof got));
        assert_memory_equal(got, round ? b : a, sizeof a);
        mb_ckpt_close(r);
    }
    /* truncated: refused by size/CRC; missing: MB_ERR_IO */
    size_t n = 0;
    unsigned char *all = NULL;
    {
        mb_ckpt_reader *r = NULL;
        FILE *f = NULL;
#ifdef _WIN32
        wchar_t *wp = mb__wpath(path_of("state.ckpt"));
        f = _wfopen(wp, L"rb");
        MB_FREE(wp);
#else
        f = fopen(path_of("state.ckpt"), "rb");
#endif
        assert_non_null(f);
        all = (unsigned char *)malloc(1 << 16);
        n = fread(all, 1, 1 << 16, f);
        fclose(f);
        assert_true(n > 100);
#ifdef _WIN32
        wp = mb__wpath(path_of("short.ckpt"));
        f = _wfopen(wp, L"wb");
        MB_FREE(wp);
#else
        f = fopen(path_of("short.ckpt"), "wb");
#endif
        assert_non_null(f);
        assert_int_equal(fwrite(all, 1, n - 7, f), n - 7);
        fclose(f);
        assert_int_not_equal(mb_ckpt_open(&r, dev, path_of("short.ckpt")), MB_OK);
        assert_null(r);
        assert_int_equal(mb_ckpt_open(&r, dev, path_of("missing.ckpt")), MB_ERR_IO);
        free(all);
        assert_int_equal(mb__os_unlink(path_of("short.ckpt")), 0);
        assert_int_equal(mb__os_unlink(path_of("state.ckpt")), 0);
    }
    tu_close_checked(dev);
}

static void test_safetensors_utf8(void **state) {
    (void)state;
    float w[6 * 7];
    tu_fill(w, 42, -3, 3);
    mb_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "enc.w_\xc3\xa4"; /* a UTF-8 tensor name too */
    t.rank = 2; t.shape[0] = 6; t.shape[1] = 7; t.data = w;
    mb_st_meta meta = {"note", "p\xc3\xa4th"};
    for (int round = 0; round < 2; round++) {
        w[0] = (float)round;
        tu_ok(mb_st_write(path_of("m.safetensors"), &t, 1, &meta, 1));
        assert_false(exists(path_of("m.safetensors.tmp")));
        mb_st_file *f = NULL;
        tu_ok(mb_st_open(&f, path_of("m.safetensors")));
        const mb_st_tensor *g = mb_st_find(f, t.name);
        assert_non_null(g);
        assert_int_equal(g->count, 42);
        assert_memory_equal(g->data, w, sizeof w);
        mb_st_close(f);
    }
    assert_int_equal(mb__os_unlink(path_of("m.safetensors")), 0);
    assert_false(exists(path_of("m.safetensors")));
}

static void test_cores_memory_clock(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    size_t total = 0, avail = 0;
    tu_ok(mb_device_memory(dev, &total, &avail));
    assert_true(total >= ((size_t)64 << 20));
    assert_true(avail > 0 && avail <= total);
    assert_true(mb__os_cores() >= 1);
    assert_non_null(strstr(mb_device_name(dev), "cores"));
    double t0 = mb__os_now(), t1 = t0;
    for (int i = 0; i < 1000000 && t1 == t0; i++) t1 = mb__os_now();
    assert_true(t1 > t0); /* it moves, forward */
    tu_close_checked(dev);
}

/* A gemm split over the pool (4 threads) equals the single-threaded one, bit for bit. */
static void test_threads(void **state) {
    (void)state;
    enum { M = 96, K = 80, N = 1024 }; /* wide enough that mb__sgemm_split uses the pool */
    float *a = tu_alloc_f32((size_t)M * K), *b = tu_alloc_f32((size_t)K * N);
    float *c1 = tu_alloc_f32((size_t)M * N), *c4 = tu_alloc_f32((size_t)M * N);
    tu_fill(a, (size_t)M * K, -1, 1);
    tu_fill(b, (size_t)K * N, -1, 1);
    for (int th = 1; th <= 4; th += 3) {
        mb_device_config dc;
        memset(&dc, 0, sizeof dc);
        dc.threads = th;
        mb_device *dev = NULL;
        tu_ok(mb_device_open(&dev, &dc));
        mb_gemm_args g;
        memset(&g, 0, sizeof g);
        g.m = M; g.n = N; g.k = K; g.alpha = 1.0f; g.ab_type = MB_F32; g.c_type = MB_F32;
        g.a = a; g.lda = K; g.b = b; g.ldb = N; g.c = th == 1 ? c1 : c4; g.ldc = N;
        tu_ok(mb_gemm(dev, &g));
        tu_ok(mb_sync(dev, -1));
        char want[32];
        snprintf(want, sizeof want, "%d threads", th);
        assert_non_null(strstr(mb_device_name(dev), want));
        mb_device_close(dev);
    }
    assert_memory_equal(c1, c4, (size_t)M * N * sizeof(float));
    free(a); free(b); free(c1); free(c4);
}

/* No fork off POSIX, no HDF5 in these builds: the isolated open says so, it does not pretend. */
static void test_untrusted_unsupported(void **state) {
    (void)state;
    mb_dataset *ds = NULL;
    assert_int_equal(mb_dataset_open_untrusted(&ds, path_of("x.h5"), NULL), MB_ERR_UNSUPPORTED);
    assert_null(ds);
    assert_non_null(strstr(mb_last_error(), "MEGABATCH_NO_HDF5"));
    mb_dataset_meta meta;
    assert_int_equal(mb_dataset_probe(path_of("x.h5"), NULL, &meta), MB_ERR_UNSUPPORTED);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_utf8_replace), cmocka_unit_test(test_safetensors_utf8),
        cmocka_unit_test(test_cores_memory_clock), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_untrusted_unsupported),
    };
    return cmocka_run_group_tests_name("platform", tests, NULL, NULL);
}
