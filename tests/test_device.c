/* device (CPU backend): open/close, name, memory, streams, allocation counters and
 * alignment, failure injection, CUDA requested from a build without it. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "backend_check.h"

static void test_open_cpu_defaults(void **state) {
    (void)state;
    mb_device *dev = NULL;
    tu_ok(mb_device_open(&dev, NULL));
    assert_int_equal(mb_device_backend(dev), MB_CPU);
    assert_non_null(strstr(mb_device_name(dev), "cpu"));
    assert_int_equal(mb_device_streams(dev), 2);
    assert_null(mb_device_stream(dev, 0));
    size_t total = 0, avail = 0;
    tu_ok(mb_device_memory(dev, &total, &avail));
    assert_true(total > ((size_t)64 << 20));
    assert_true(avail > 0 && avail <= total);
    tu_ok(mb_device_set_tf32(dev, 1));
    assert_int_equal(mb_device_tf32(dev), 1);
    tu_ok(mb_sync(dev, -1));
    tu_ok(mb_stream_wait(dev, 0, 1));
    tu_assert_error(mb_stream_wait(dev, 0, 2), MB_ERR_INVALID_ARG, "stream 2 out of range");
    mb_device_close(dev);
    mb_device_close(NULL);
}

static void test_cuda_not_built(void **state) {
    (void)state;
    mb_device_config cfg = {0};
    cfg.backend = MB_CUDA;
    mb_device *dev = (mb_device *)&cfg; /* must be reset to NULL */
    tu_assert_error(mb_device_open(&dev, &cfg), MB_ERR_NO_DEVICE, "no CUDA backend");
    assert_null(dev);
    cfg.backend = (mb_backend)5;
    tu_assert_error(mb_device_open(&dev, &cfg), MB_ERR_INVALID_ARG, "unknown backend 5");
    tu_assert_error(mb_device_open(NULL, &cfg), MB_ERR_INVALID_ARG, "out is NULL");
}

static void test_alloc_counters(void **state) {
    (void)state;
    mb_device_config cfg = {0};
    cfg.streams = 4;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, &cfg));
    assert_int_equal(mb_device_streams(dev), 4);
    void *a, *b, *c, *z;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 1000, &a));
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 3000, &b));
    tu_ok(mb_alloc(dev, MB_MEM_PINNED, 500, &c));
    tu_ok(mb_alloc(dev, MB_MEM_HOST, 0, &z));
    assert_non_null(z);
    mb_mem_stats s = mb_device_mem_stats(dev);
    assert_int_equal(s.live[MB_MEM_DEVICE], 4000);
    assert_int_equal(s.count[MB_MEM_DEVICE], 2);
    assert_int_equal(s.live[MB_MEM_PINNED], 500);
    assert_int_equal(s.allocs[MB_MEM_HOST], 1);
    mb_free(dev, a);
    s = mb_device_mem_stats(dev);
    assert_int_equal(s.live[MB_MEM_DEVICE], 3000);
    assert_int_equal(s.peak[MB_MEM_DEVICE], 4000);
    /* copies and zeroing on any stream */
    memset(b, 7, 3000);
    tu_ok(mb_zero(dev, 3, b, 3000));
    assert_int_equal(((unsigned char *)b)[2999], 0);
    tu_ok(mb_copy(dev, 1, c, "hello", 6));
    assert_string_equal((char *)c, "hello");
    tu_assert_error(mb_copy(dev, 4, c, "x", 1), MB_ERR_INVALID_ARG, "stream 4");
    tu_assert_error(mb_copy(dev, 0, NULL, "x", 1), MB_ERR_INVALID_ARG, "NULL pointer");
    tu_ok(mb_copy(dev, 0, NULL, NULL, 0));
    /* 2D: column block 1..2 of a 3 x 4 matrix into a dense 3 x 2 one */
    float m[12], d2[6];
    for (int i = 0; i < 12; i++) m[i] = (float)i;
    tu_ok(mb_copy_2d(dev, 1, d2, 2 * sizeof(float), m + 1, 4 * sizeof(float), 2 * sizeof(float), 3));
    for (int r = 0; r < 3; r++) assert_true(d2[2 * r] == (float)(4 * r + 1) && d2[2 * r + 1] == (float)(4 * r + 2));
    tu_assert_error(mb_copy_2d(dev, 0, d2, 4, m, 16, 8, 3), MB_ERR_INVALID_ARG, "pitches 4/16 smaller than the width 8");
    mb_free(dev, b);
    mb_free(dev, c);
    mb_free(dev, z);
    mb_free(dev, NULL);
    s = mb_device_mem_stats(dev);
    for (int k = 0; k < MB_MEM_KINDS; k++) assert_int_equal(s.live[k], 0);
    mb_device_close(dev);
}

/* Every kind of CPU memory starts on a 64-byte cache line, whatever its size (malloc's
 * large blocks start 16 bytes past one), and all of it is writable up to its last byte. */
static void test_alloc_on_a_cache_line(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    const size_t sizes[] = {0, 1, 15, 64, 1000, 4096, 100003, (size_t)1 << 20, ((size_t)4 << 20) + 4};
    for (int k = 0; k < MB_MEM_KINDS; k++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            unsigned char *p = NULL;
            tu_ok(mb_alloc(dev, (mb_mem_kind)k, sizes[i], (void **)&p));
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % 64, 0);
            memset(p, 0xa5, sizes[i]);
            if (sizes[i]) assert_int_equal(p[sizes[i] - 1], 0xa5);
            mb_free(dev, p);
        }
    mb_mem_stats s = mb_device_mem_stats(dev);
    for (int k = 0; k < MB_MEM_KINDS; k++) assert_int_equal(s.live[k], 0);
    mb_device_close(dev);
}

static void test_alloc_failure_injection(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    void *p[4];
    mb_device_fail_alloc(dev, MB_MEM_PINNED, 3);
    tu_ok(mb_alloc(dev, MB_MEM_PINNED, 16, &p[0]));
    tu_ok(mb_alloc(dev, MB_MEM_PINNED, 16, &p[1]));
    tu_assert_error(mb_alloc(dev, MB_MEM_PINNED, 16, &p[2]), MB_ERR_OUT_OF_MEMORY, "pinned allocation #3");
    assert_null(p[2]);
    tu_ok(mb_alloc(dev, MB_MEM_PINNED, 16, &p[3])); /* one failure only */
    /* other kinds are unaffected; 0 cancels */
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 1);
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 0);
    void *d;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 8, &d));
    mb_device_fail_alloc(dev, MB_MEM_HOST, 1);
    tu_assert_error(mb_alloc(dev, MB_MEM_HOST, 8, &p[2]), MB_ERR_OUT_OF_MEMORY, "host allocation");
    mb_free(dev, d);
    mb_free(dev, p[0]); mb_free(dev, p[1]); mb_free(dev, p[3]);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_PINNED], 0);
    mb_device_close(dev);
}

static void test_convert(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    float x[5] = {1.0f, -2.5f, 1.0f + 1.0f / 256.0f, NAN, 70000.0f}, y[5];
    uint16_t h[5];
    tu_ok(mb_convert(dev, 0, h, MB_BF16, x, MB_F32, 5));
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], mb_f32_to_bf16(x[i]));
    tu_ok(mb_convert(dev, 0, h, MB_F16, x, MB_F32, 5));
    assert_int_equal(h[4], 0x7c00); /* overflow to inf */
    tu_ok(mb_convert(dev, 0, y, MB_F32, h, MB_F16, 5));
    assert_true(y[0] == 1.0f && y[1] == -2.5f && isnan(y[3]) && isinf(y[4]));
    tu_ok(mb_convert(dev, 0, y, MB_F32, x, MB_F32, 3));
    assert_memory_equal(x, y, 3 * sizeof(float));
    tu_assert_error(mb_convert(dev, 0, y, (mb_dtype)9, x, MB_F32, 1), MB_ERR_INVALID_ARG, "unknown dtype 9");
    mb_device_close(dev);
}

typedef struct { int warns; char msg[256]; } warn_capture;
static void on_log(mb_log_level level, const char *m, const char *f, int l, void *u) {
    (void)f; (void)l;
    warn_capture *w = (warn_capture *)u;
    if (level == MB_LOG_WARN) { w->warns++; snprintf(w->msg, sizeof w->msg, "%s", m); }
}

static void test_close_reports_and_frees_leaks(void **state) {
    (void)state;
    warn_capture w = {0};
    mb_device_config cfg = {0};
    cfg.log.fn = on_log; cfg.log.user = &w; cfg.log.max = MB_LOG_WARN;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, &cfg));
    void *p;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 128, &p));
    mb_device_close(dev); /* frees p (ASan would report it otherwise) and warns */
    assert_int_equal(w.warns, 1);
    assert_non_null(strstr(w.msg, "1 allocation(s) still live, 128 device bytes"));
}

/* The CPU table fills every slot of its groups, and a slot left out is seen. */
static void test_backend_table(void **state) {
    (void)state;
    bc_check_table(mb__cpu_backend());
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_cpu_defaults),  cmocka_unit_test(test_cuda_not_built),
        cmocka_unit_test(test_alloc_counters),     cmocka_unit_test(test_alloc_failure_injection),
        cmocka_unit_test(test_alloc_on_a_cache_line),
        cmocka_unit_test(test_close_reports_and_frees_leaks), cmocka_unit_test(test_convert),
        cmocka_unit_test(test_backend_table),
    };
    return cmocka_run_group_tests_name("device", tests, NULL, NULL);
}
