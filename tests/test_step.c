/* The step API on the CPU backend (issue 15): the device-side loss meter and its lagged
 * per-step reads, AdamW with the schedule's learning rate computed at the optimizer's own
 * counter, the checkpoint default (full storage when memory allows, on every backend). The cases are tests/step_cases.h, which the
 * CUDA test runs too. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "step_cases.h"

static void test_meter_loss(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    for (int i = 0; i < 4; i++) sc_meter_loss(dev, tu_next());
    mb_device_close(dev);
}

static void test_meter_bad_input(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    sc_meter_bad_input(dev);
    mb_device_close(dev);
}

static void test_meter_lagged(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    for (int i = 0; i < 8; i++) sc_meter_lagged(dev);
    mb_device_close(dev);
}

static void test_scheduled_adamw(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    size_t n;
    for (int k = MB_LR_CONSTANT; k <= MB_LR_ONE_CYCLE; k++) {
        float *out = tu_alloc_f32(SC_SCHEDULED_MAX_FLOATS);
        sc_scheduled_adamw(dev, tu_next(), (mb_lr_kind)k, out, &n);
        free(out);
    }
    mb_device_close(dev);
}

/* The rule, on every backend: full storage when it takes at most a quarter of the free memory
 * (here a small LSTM on the CPU: it fits), else ceil(sqrt(T)) rounded up to the block. */
static void test_checkpoint_default(void **state) {
    (void)state;
    assert_true(mb__lstm_full_fits_in(100, 400));
    assert_false(mb__lstm_full_fits_in(101, 400));
    assert_false(mb__lstm_full_fits_in(1, 3));
    mb_device *dev = tu_open_cpu();
    mb_params *p;
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config c;
    memset(&c, 0, sizeof c);
    c.input_size = 3; c.hidden_size = 5; c.max_steps = 100; c.max_batch = 4;
    mb_lstm *l;
    tu_ok(mb_lstm_create(&l, p, &c));
    assert_int_equal(mb_lstm_checkpoint_steps(l, 100), -1);
    assert_int_equal(mb__lstm_auto_k(100, 16), 16); /* the interval when memory is short */
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    mb_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meter_loss),
        cmocka_unit_test(test_meter_bad_input),
        cmocka_unit_test(test_meter_lagged),
        cmocka_unit_test(test_scheduled_adamw),
        cmocka_unit_test(test_checkpoint_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
