/* core: results and messages, last error, logging, overflow helpers, dtypes, RNG. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

static void test_result_strings(void **state) {
    (void)state;
    assert_string_equal(mb_result_string(MB_OK), "ok");
    assert_string_equal(mb_result_string(MB_ERR_OUT_OF_MEMORY), "out of memory");
    for (int r = MB_ERR_CORRUPT; r <= MB_OK; r++) {
        const char *s = mb_result_string((mb_result)r);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown result");
    }
    assert_string_equal(mb_result_string((mb_result)-999), "unknown result");
    assert_string_equal(MEGABATCH_VERSION_STRING, "0.1.0");
    assert_int_equal(MEGABATCH_VERSION_MAJOR, 0);
}

typedef struct { int calls; mb_log_level level; char msg[256]; int line; } log_capture;
static void capture(mb_log_level level, const char *message, const char *file, int line, void *user) {
    log_capture *c = (log_capture *)user;
    c->calls++;
    c->level = level;
    c->line = line;
    snprintf(c->msg, sizeof c->msg, "%s", message);
    assert_non_null(strstr(file, "megabatch.h"));
}

static void test_last_error_and_log(void **state) {
    (void)state;
    mb_clear_error();
    assert_string_equal(mb_last_error(), "");
    /* silent by default: an error with no logger only sets the message */
    mb_device_config cfg = {0};
    cfg.streams = 99;
    mb_device *dev = NULL;
    tu_assert_error(mb_device_open(&dev, &cfg), MB_ERR_INVALID_ARG, "streams = 99");
    assert_null(dev);
    /* with a logger the error is passed on, with file and line */
    log_capture cap = {0};
    cfg.log.fn = capture;
    cfg.log.user = &cap;
    tu_assert_error(mb_device_open(&dev, &cfg), MB_ERR_INVALID_ARG, "streams = 99");
    assert_int_equal(cap.calls, 1);
    assert_int_equal(cap.level, MB_LOG_ERROR);
    assert_string_equal(cap.msg, mb_last_error());
    assert_true(cap.line > 0);
    mb_clear_error();
    assert_string_equal(mb_last_error(), "");
}

static void *thread_sets_error(void *arg) {
    (void)arg;
    mb_device *dev;
    mb_device_config cfg = {0};
    cfg.threads = -3;
    mb_device_open(&dev, &cfg);
    return (void *)(strstr(mb_last_error(), "threads = -3") != NULL ? (void *)1 : NULL);
}

static void test_last_error_is_thread_local(void **state) {
    (void)state;
    mb_clear_error();
    pthread_t t;
    void *ok = NULL;
    assert_int_equal(pthread_create(&t, NULL, thread_sets_error, NULL), 0);
    assert_int_equal(pthread_join(t, &ok), 0);
    assert_non_null(ok);
    assert_string_equal(mb_last_error(), ""); /* this thread saw nothing */
}

static void test_size_overflow(void **state) {
    (void)state;
    size_t out = 7;
    assert_true(mb_size_mul(1u << 20, 1u << 10, &out));
    assert_int_equal(out, (size_t)1 << 30);
    out = 7;
    assert_false(mb_size_mul(SIZE_MAX / 2 + 1, 2, &out));
    assert_int_equal(out, 7);
    assert_true(mb_size_mul(0, SIZE_MAX, &out));
    assert_int_equal(out, 0);
    assert_false(mb_size_add(SIZE_MAX, 1, &out));
    assert_true(mb_size_add(SIZE_MAX - 1, 1, &out));
    assert_int_equal(out, SIZE_MAX);
    int64_t dims[3] = {100000, 1104, 128};
    assert_true(mb_size_product(dims, 3, 4, &out));
    assert_int_equal(out, (size_t)100000 * 1104 * 128 * 4);
    int64_t huge[3] = {INT64_MAX / 2, 1104, 128};
    assert_false(mb_size_product(huge, 3, 4, &out));
    int64_t neg[2] = {4, -1};
    assert_false(mb_size_product(neg, 2, 4, &out));
}

static void test_dtype_conversions(void **state) {
    (void)state;
    assert_int_equal(mb_dtype_size(MB_F32), 4);
    assert_int_equal(mb_dtype_size(MB_BF16), 2);
    assert_int_equal(mb_dtype_size(MB_F16), 2);
    assert_int_equal(mb_dtype_size((mb_dtype)7), 0);
    assert_string_equal(mb_dtype_name(MB_BF16), "bf16");
    /* exact values round-trip */
    const float exact[] = {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-8f, -1024.0f};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        assert_true(mb_f16_to_f32(mb_f32_to_f16(exact[i])) == exact[i]);
        if (i < 3) assert_true(mb_bf16_to_f32(mb_f32_to_bf16(exact[i])) == exact[i]);
    }
    /* round to nearest even, overflow, NaN */
    assert_int_equal(mb_f32_to_f16(65520.0f), 0x7c00);  /* rounds up to inf */
    assert_int_equal(mb_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(mb_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);   /* tie -> even */
    assert_int_equal(mb_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);   /* tie -> even (up) */
    assert_int_equal(mb_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);   /* tie -> even */
    assert_int_equal(mb_f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
    assert_true(isnan(mb_f16_to_f32(mb_f32_to_f16(NAN))));
    assert_true(isnan(mb_bf16_to_f32(mb_f32_to_bf16(NAN))));
    assert_true(isinf(mb_bf16_to_f32(mb_f32_to_bf16(INFINITY))));
    /* every f16 bit pattern round-trips through f32 exactly (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mb_f16_to_f32((uint16_t)h);
        if (isnan(f)) assert_true(isnan(mb_f16_to_f32(mb_f32_to_f16(f))));
        else assert_int_equal(mb_f32_to_f16(f), h);
    }
    /* f16 against a double-precision rounding reference on random values */
    for (int i = 0; i < 100000; i++) {
        float x = tu_uniform(-70000.0f, 70000.0f) * powf(2.0f, (float)tu_int(-30, 0));
        float y = mb_f16_to_f32(mb_f32_to_f16(x));
        /* y is the nearest f16: no f16 neighbour is closer */
        uint16_t hy = mb_f32_to_f16(x);
        if (isinf(y)) { assert_true(fabsf(x) >= 65520.0f); continue; }
        for (int d = -1; d <= 1; d += 2) {
            float nb = mb_f16_to_f32((uint16_t)(hy + d));
            if (isfinite(nb) && ((hy & 0x7fff) != 0 || d > 0)) assert_true(fabs((double)nb - x) >= fabs((double)y - x));
        }
    }
}

static void test_philox_known_answer(void **state) {
    (void)state;
    /* Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors):
     * counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8;
     * counter ffffffff x4, key ffffffff x2 -> 408f276d 41c83b0e a20bc7c6 6d5451fd. */
    mb_u32x4 a = mb_philox(0, 0, 0);
    assert_int_equal(a.v[0], 0x6627e8d5u);
    assert_int_equal(a.v[1], 0xe169c58du);
    assert_int_equal(a.v[2], 0xbc57ac4cu);
    assert_int_equal(a.v[3], 0x9b00dbd8u);
    mb_u32x4 b = mb_philox(UINT64_MAX, UINT64_MAX, UINT64_MAX);
    assert_int_equal(b.v[0], 0x408f276du);
    assert_int_equal(b.v[1], 0x41c83b0eu);
    assert_int_equal(b.v[2], 0xa20bc7c6u);
    assert_int_equal(b.v[3], 0x6d5451fdu);
    /* counter 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0 */
    mb_u32x4 c = mb_philox(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
    assert_int_equal(c.v[0], 0xd16cfe09u);
    assert_int_equal(c.v[1], 0x94fdccebu);
    assert_int_equal(c.v[2], 0x5001e420u);
    assert_int_equal(c.v[3], 0x24126ea1u);
    /* uniform: in [0,1), mean about 1/2, different streams differ */
    double sum = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        float u = mb_rng_uniform(42, 3, i);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.01);
    assert_true(mb_rng_uniform(42, 3, 0) != mb_rng_uniform(42, 4, 0));
    float s = mb_rng_symmetric(1, 2, 3, 0.25f);
    assert_true(s >= -0.25f && s < 0.25f);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_strings),       cmocka_unit_test(test_last_error_and_log),
        cmocka_unit_test(test_last_error_is_thread_local), cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_dtype_conversions),    cmocka_unit_test(test_philox_known_answer),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
