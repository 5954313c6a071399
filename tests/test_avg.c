/* Weight averaging (mb_avg) on the CPU: against torch.optim.swa_utils.AveragedModel (a
 * committed golden, tests/golden/make_avg_golden.py), skipped steps, swapping, random
 * updates against torch's formulas, a bitwise resume in the middle of an average, bad input
 * and injected allocation failures. The same cases run on the GPU in
 * tests/cuda/test_cuda_numerics.cu (tests/avg_case.h). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "avg_case.h"
#include <unistd.h>

static char tmpdir[64];

static void test_avg_torch_golden(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    avg_case_torch_golden(dev);
    tu_close_checked(dev);
}

static void test_avg_skip_and_swap(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    avg_case_skip_and_swap(dev);
    tu_close_checked(dev);
}

static void test_avg_random(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    for (int i = 0; i < 20; i++) avg_case_random(dev);
    tu_close_checked(dev);
}

static void test_avg_resume(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mb_avg_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    avg_case_resume(dev, tmpdir);
    unlink(tu_path(tmpdir, "avg.ckpt"));
    rmdir(tmpdir);
    tu_close_checked(dev);
}

static void test_avg_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *p = avg_case_wb(dev), *q = avg_case_wb(dev), *unfinished;
    mb_avg *a = NULL;
    mb_adamw *o;
    mb_avg_config bad = {1.0, MB_AVG_EMA};
    tu_assert_error(mb_avg_create(&a, p, &bad), MB_ERR_INVALID_ARG, "decay 1 must be in (0, 1)");
    bad.decay = -0.5;
    tu_assert_error(mb_avg_create(&a, p, &bad), MB_ERR_INVALID_ARG, "must be in (0, 1)");
    bad.kind = (mb_avg_kind)7;
    tu_assert_error(mb_avg_create(&a, p, &bad), MB_ERR_INVALID_ARG, "unknown kind");
    assert_null(a);
    tu_assert_error(mb_avg_create(NULL, p, NULL), MB_ERR_INVALID_ARG, "NULL out");
    tu_ok(mb_params_create(&unfinished, dev));
    tu_assert_error(mb_avg_create(&a, unfinished, NULL), MB_ERR_STATE, "");
    mb_params_destroy(unfinished);
    tu_ok(mb_avg_create(&a, p, NULL));
    mb_avg_config c = mb_avg_get_config(a);
    assert_int_equal(c.kind, MB_AVG_EMA);
    assert_true(c.decay == 0.999);
    tu_ok(mb_adamw_create(&o, q, NULL));
    tu_assert_error(mb_avg_update(a, o), MB_ERR_INVALID_ARG, "other parameters");
    tu_assert_error(mb_avg_update(NULL, NULL), MB_ERR_INVALID_ARG, "NULL average");
    tu_assert_error(mb_avg_set_count(a, -1), MB_ERR_INVALID_ARG, "< 0");
    mb_ckpt_writer *w;
    tu_ok(mb_ckpt_writer_create(&w, dev));
    tu_ok(mb_avg_swap(a));
    tu_assert_error(mb_ckpt_add_avg(w, a), MB_ERR_STATE, "swapped in");
    tu_ok(mb_avg_swap(a));
    mb_ckpt_writer_destroy(w);
    mb_adamw_destroy(o);
    mb_avg_destroy(a);
    mb_avg_destroy(NULL);
    for (int k = 1; k <= 2; k++) { /* each device allocation of create fails in turn, nothing leaks */
        mb_avg *b = NULL;
        mb_device_fail_alloc(dev, MB_MEM_DEVICE, k);
        tu_assert_error(mb_avg_create(&b, p, NULL), MB_ERR_OUT_OF_MEMORY, "injected");
        assert_null(b);
    }
    mb_params_destroy(p);
    mb_params_destroy(q);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    mb_device_close(dev);
}

/* docs/NUMERICS.md's example, as written there, run on a small model. */
static void test_avg_doc_example(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    mb_params *params = avg_case_wb(dev);
    mb_adamw *opt;
    mb_scaler *scaler = NULL;
    float lr = 1e-2f;
    tu_ok(mb_params_init(params, 3));
    tu_ok(mb_adamw_create(&opt, params, NULL));
    tu_fill(mb_params_grad(params), mb_params_total(params), -1, 1);
    // snippet: avg-usage
    mb_avg *avg;
    mb_avg_config ac = {0.999, MB_AVG_EMA};      /* or {0, MB_AVG_SWA}: the equal-weight mean */
    mb_avg_create(&avg, params, &ac);
    /* each step, after the optimizer (inside a captured step too): skipped with a skipped step */
    mb_adamw_step(opt, lr, scaler);
    mb_avg_update(avg, opt);
    /* evaluate or export the averaged weights: swap them in, and back */
    mb_avg_swap(avg); /* ... validate, mb_st_save_params ... */ mb_avg_swap(avg);
    // end snippet
    int64_t n = 0;
    tu_ok(mb_avg_count(avg, &n));
    assert_int_equal(n, 1); /* the first update: a copy of the weights after the step */
    assert_memory_equal(mb_avg_data(avg), mb_params_data(params), mb_params_total(params) * sizeof(float));
    assert_int_equal(mb_avg_swapped(avg), 0);
    mb_avg_destroy(avg);
    mb_adamw_destroy(opt);
    mb_params_destroy(params);
    tu_close_checked(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avg_torch_golden),
        cmocka_unit_test(test_avg_skip_and_swap),
        cmocka_unit_test(test_avg_random),
        cmocka_unit_test(test_avg_resume),
        cmocka_unit_test(test_avg_bad_input),
        cmocka_unit_test(test_avg_doc_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
