/* params (CPU backend): flat layout, views, seeded init (same bits twice, PyTorch-style
 * bounds), zero_grad, get/set, bad input, allocation failure without leaks. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

static mb_params *make_lstm_like(mb_device *dev, int64_t H, int64_t F) {
    mb_params *p;
    tu_ok(mb_params_create(&p, dev));
    int64_t wih[2] = {4 * H, F}, whh[2] = {4 * H, H}, bias[1] = {4 * H};
    float bound = 1.0f / sqrtf((float)H);
    int idx;
    tu_ok(mb_params_add(p, "weight_ih_l0", 2, wih, bound, &idx));
    assert_int_equal(idx, 0);
    tu_ok(mb_params_add(p, "weight_hh_l0", 2, whh, bound, &idx));
    tu_ok(mb_params_add(p, "bias_ih_l0", 1, bias, bound, NULL));
    tu_ok(mb_params_add(p, "bias_hh_l0", 1, bias, bound, &idx));
    assert_int_equal(idx, 3);
    return p;
}

static void test_layout_and_views(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_params *p = make_lstm_like(dev, 5, 3);
    assert_null(mb_params_data(p));
    tu_ok(mb_params_finalize(p));
    assert_int_equal(mb_params_num_tensors(p), 4);
    const mb_param_info *w = mb_params_info(p, 0), *u = mb_params_info(p, 1), *b = mb_params_info(p, 3);
    assert_int_equal(w->count, 60);
    assert_int_equal(w->offset, 0);
    assert_int_equal(u->offset, 64);           /* 64-element aligned */
    assert_int_equal(u->count, 100);
    assert_int_equal(b->offset % 64, 0);
    assert_true(b->no_decay && !w->no_decay);
    assert_int_equal(mb_params_total(p) % 64, 0);
    assert_true(mb_params_total(p) >= b->offset + b->count);
    assert_ptr_equal(mb_params_tensor(p, 1), mb_params_data(p) + 64);
    assert_ptr_equal(mb_params_tensor_grad(p, 3), mb_params_grad(p) + b->offset);
    assert_null(mb_params_tensor(p, 4));
    assert_int_equal(mb_params_find(p, "bias_ih_l0"), 2);
    assert_int_equal(mb_params_find(p, "nope"), -1);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 2 * mb_params_total(p) * sizeof(float));
    mb_params_destroy(p);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    mb_device_close(dev);
}

static void test_seeded_init(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_params *p = make_lstm_like(dev, 16, 5), *q = make_lstm_like(dev, 16, 5);
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_finalize(q));
    size_t n = mb_params_total(p);
    float *x = tu_alloc_f32(n), *y = tu_alloc_f32(n);
    tu_ok(mb_params_init(p, 1234));
    tu_ok(mb_params_init(q, 1234));
    tu_ok(mb_params_get(p, x));
    tu_ok(mb_params_get(q, y));
    assert_memory_equal(x, y, n * sizeof(float)); /* same bits twice */
    /* within +-1/sqrt(H), spread over the range, and element j is the documented RNG value */
    float bound = 0.25f;
    double sum = 0;
    float lo = 1, hi = -1;
    for (int t = 0; t < 4; t++) {
        const mb_param_info *in = mb_params_info(p, t);
        for (size_t j = 0; j < in->count; j++) {
            float v = x[in->offset + j];
            assert_true(v >= -bound && v < bound);
            assert_true(v == mb_rng_symmetric(1234, (uint64_t)t, j, bound));
            sum += v; lo = v < lo ? v : lo; hi = v > hi ? v : hi;
        }
    }
    assert_true(lo < -0.2f && hi > 0.2f);
    assert_true(fabs(sum) / 2176.0 < 0.02);
    /* padding stays zero; another seed gives other values */
    for (int t = 0; t < 4; t++) {
        const mb_param_info *in = mb_params_info(p, t);
        size_t end = t < 3 ? mb_params_info(p, t + 1)->offset : n;
        for (size_t j = in->offset + in->count; j < end; j++) assert_true(x[j] == 0.0f);
    }
    tu_ok(mb_params_init(q, 1235));
    tu_ok(mb_params_get(q, y));
    assert_memory_not_equal(x, y, n * sizeof(float));
    /* set, zero_grad */
    for (size_t i = 0; i < n; i++) x[i] = (float)i;
    tu_ok(mb_params_set(p, x));
    assert_true(mb_params_tensor(p, 1)[3] == (float)(mb_params_info(p, 1)->offset + 3));
    mb_params_grad(p)[5] = 3.0f;
    tu_ok(mb_params_zero_grad(p));
    assert_true(mb_params_grad(p)[5] == 0.0f);
    free(x); free(y);
    mb_params_destroy(p);
    mb_params_destroy(q);
    mb_device_close(dev);
}

static void test_bad_input(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    mb_params *p;
    tu_ok(mb_params_create(&p, dev));
    int64_t s2[2] = {3, 4}, s0[2] = {3, 0}, big[4] = {INT64_MAX / 4, 1 << 20, 1 << 20, 4};
    tu_assert_error(mb_params_finalize(p), MB_ERR_STATE, "no tensors");
    tu_assert_error(mb_params_init(p, 1), MB_ERR_STATE, "finalize not called");
    tu_assert_error(mb_params_add(p, "w", 0, s2, 0, NULL), MB_ERR_INVALID_ARG, "rank 0");
    tu_assert_error(mb_params_add(p, "w", 2, s0, 0, NULL), MB_ERR_INVALID_ARG, "dimension 1 is 0");
    tu_assert_error(mb_params_add(p, "", 2, s2, 0, NULL), MB_ERR_INVALID_ARG, "must be 1..");
    tu_assert_error(mb_params_add(p, "w", 2, s2, -1.0f, NULL), MB_ERR_INVALID_ARG, "init bound");
    tu_assert_error(mb_params_add(p, "w", 2, s2, NAN, NULL), MB_ERR_INVALID_ARG, "init bound");
    tu_assert_error(mb_params_add(p, "huge", 4, big, 0, NULL), MB_ERR_OVERFLOW, "'huge'");
    tu_ok(mb_params_add(p, "w", 2, s2, 0.5f, NULL));
    tu_assert_error(mb_params_add(p, "w", 2, s2, 0, NULL), MB_ERR_INVALID_ARG, "registered twice");
    tu_ok(mb_params_finalize(p));
    tu_assert_error(mb_params_finalize(p), MB_ERR_STATE, "called twice");
    tu_assert_error(mb_params_add(p, "v", 2, s2, 0, NULL), MB_ERR_STATE, "after mb_params_finalize");
    mb_params_destroy(p);
    mb_device_close(dev);
}

static void test_finalize_alloc_failure_leaks_nothing(void **state) {
    (void)state;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    for (uint64_t nth = 1; nth <= 2; nth++) {
        mb_params *p = make_lstm_like(dev, 8, 3);
        mb_device_fail_alloc(dev, MB_MEM_DEVICE, nth);
        tu_assert_error(mb_params_finalize(p), MB_ERR_OUT_OF_MEMORY, "injected");
        assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
        tu_ok(mb_params_finalize(p)); /* retry works: nothing half-done was kept */
        mb_params_destroy(p);
    }
    mb_params *p;
    mb_device_fail_alloc(dev, MB_MEM_HOST, 1);
    assert_int_equal(mb_params_create(&p, dev), MB_OK); /* params' own struct is plain host memory */
    mb_device_fail_alloc(dev, MB_MEM_HOST, 0);
    mb_params_destroy(p);
    mb_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_views),  cmocka_unit_test(test_seeded_init),
        cmocka_unit_test(test_bad_input),         cmocka_unit_test(test_finalize_alloc_failure_leaks_nothing),
    };
    return cmocka_run_group_tests_name("params", tests, NULL, NULL);
}
