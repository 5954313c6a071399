/* gemm (CPU backend): against a naive triple loop on random shapes, odd sizes,
 * transposes, alpha/beta, strided batches and half-precision operands; bad arguments. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "gemm_case.h"

static int open_cpu(void **state) { return mb_device_open((mb_device **)state, NULL) == MB_OK ? 0 : -1; }
static int close_dev(void **state) { mb_device_close((mb_device *)*state); return 0; }

static void test_gemm_f32_random(void **state) {
    mb_device *dev = (mb_device *)*state;
    for (int i = 0; i < 200; i++) {
        tu_gemm_case g = tu_gemm_random();
        tu_gemm_run(dev, &g, 1e-6, 1e-6);
    }
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
}

static void test_gemm_all_transposes_odd_sizes(void **state) {
    mb_device *dev = (mb_device *)*state;
    const int64_t sizes[][3] = {{1, 1, 1}, {1, 7, 3}, {13, 1, 5}, {17, 19, 1}, {33, 65, 127}, {128, 96, 64}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 4; t++) {
            tu_gemm_case g = tu_gemm_random();
            g.m = sizes[s][0]; g.n = sizes[s][1]; g.k = sizes[s][2];
            g.ta = t & 1; g.tb = t >> 1;
            tu_gemm_run(dev, &g, 1e-6, 1e-6);
        }
}

static void test_gemm_half_operands(void **state) {
    mb_device *dev = (mb_device *)*state;
    for (int i = 0; i < 60; i++) {
        tu_gemm_case g = tu_gemm_random();
        g.ab = i % 2 ? MB_BF16 : MB_F16;
        g.c = i % 3 == 0 ? g.ab : MB_F32;
        /* operands are rounded before the reference; C stored in half adds one rounding */
        tu_gemm_run(dev, &g, 1e-6, g.c == MB_F32 ? 1e-6 : (g.c == MB_BF16 ? 8e-3 : 1e-3));
    }
}

static void test_gemm_k_zero_scales_c(void **state) {
    mb_device *dev = (mb_device *)*state;
    float c[6] = {1, 2, 3, 4, 5, 6}, a[1] = {0}, b[1] = {0};
    mb_gemm_args g = {0};
    g.m = 2; g.n = 3; g.k = 0; g.alpha = 1; g.beta = 0.5f;
    g.a = a; g.lda = 1; g.b = b; g.ldb = 3; g.c = c; g.ldc = 3;
    tu_ok(mb_gemm(dev, &g));
    for (int i = 0; i < 6; i++) assert_true(c[i] == 0.5f * (float)(i + 1));
    g.beta = 0; /* beta 0 overwrites, even NaN */
    c[0] = NAN;
    tu_ok(mb_gemm(dev, &g));
    for (int i = 0; i < 6; i++) assert_true(c[i] == 0.0f);
}

static void test_gemm_bad_args(void **state) {
    mb_device *dev = (mb_device *)*state;
    float x[64] = {0};
    mb_gemm_args g = {0};
    g.m = 4; g.n = 4; g.k = 4; g.alpha = 1; g.a = x; g.b = x; g.c = x; g.lda = 4; g.ldb = 4; g.ldc = 4;
    tu_ok(mb_gemm(dev, &g));
    g.lda = 3;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_INVALID_ARG, "lda=3");
    g.lda = 4; g.m = -1;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_INVALID_ARG, "negative size m=-1");
    g.m = 4; g.c_type = MB_BF16;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_INVALID_ARG, "C must be f32");
    g.c_type = MB_F32; g.c = NULL;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_INVALID_ARG, "NULL operand");
    g.c = x; g.stream = 5;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_INVALID_ARG, "stream 5");
    g.stream = 0; g.k = (int64_t)1 << 33; g.lda = g.k;
    tu_assert_error(mb_gemm(dev, &g), MB_ERR_OVERFLOW, "2^31");
    tu_assert_error(mb_gemm(dev, NULL), MB_ERR_INVALID_ARG, "NULL");
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_f32_random),     cmocka_unit_test(test_gemm_all_transposes_odd_sizes),
        cmocka_unit_test(test_gemm_half_operands),  cmocka_unit_test(test_gemm_k_zero_scales_c),
        cmocka_unit_test(test_gemm_bad_args),
    };
    return cmocka_run_group_tests_name("gemm", tests, open_cpu, close_dev);
}
