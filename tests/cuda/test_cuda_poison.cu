/* A CUDA error that poisons the context (a kernel writes to an illegal address): the
 * library reports it as MB_ERR_CUDA with CUDA's message, every later call fails too, and
 * no checkpoint is written after it: the one written before stays byte for byte intact.
 * Its own program, because a poisoned context cannot be used again. Without a GPU it
 * skips. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"
#include <stdint.h>

__global__ void bad_write(float *p) { p[threadIdx.x] = 1.0f; }

static size_t read_all(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void test_poisoned_context(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0);
    tu_cuda_sticky_expected(); /* the fixture's check: this test poisons the context on purpose */
    mb_params *p;
    int idx;
    int64_t shape[1] = {4096};
    tu_ok(mb_params_create(&p, gpu));
    tu_ok(mb_params_add(p, "w", 1, shape, 0.1f, &idx));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 1));
    char path[] = "/tmp/mb_poison_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    mb_ckpt_writer *w = NULL;
    tu_ok(mb_ckpt_writer_create(&w, gpu));
    tu_ok(mb_ckpt_add_params(w, p));
    tu_ok(mb_ckpt_write(w, path));
    mb_ckpt_writer_destroy(w);
    static unsigned char before[1 << 16], after[1 << 16];
    size_t nb = read_all(path, before, sizeof before);
    assert_true(nb > 4096 * sizeof(float));

    MB_LAUNCH(bad_write, 1, 32, 0, mb__st(gpu, MB_STREAM_COMPUTE))((float *)(uintptr_t)0x10);
    mb_result r = mb_sync(gpu, -1);
    printf("after the bad kernel: %s: %s\n", mb_result_string(r), mb_last_error());
    assert_int_equal(r, MB_ERR_CUDA);
    assert_non_null(strstr(mb_last_error(), "illegal"));

    /* a training step's next calls fail, and the checkpoint is not written */
    r = mb_params_zero_grad(p);
    if (r == MB_OK) r = mb_sync(gpu, -1);
    assert_int_equal(r, MB_ERR_CUDA);
    w = NULL;
    r = mb_ckpt_writer_create(&w, gpu);
    if (r == MB_OK) r = mb_ckpt_add_params(w, p);
    if (r == MB_OK) r = mb_ckpt_write(w, path);
    printf("checkpoint after it: %s: %s\n", mb_result_string(r), mb_last_error());
    assert_int_not_equal(r, MB_OK);
    mb_ckpt_writer_destroy(w);
    assert_int_equal(read_all(path, after, sizeof after), nb);
    assert_memory_equal(before, after, nb);
    remove(path);
    /* cleanup on the dead context: the CUDA calls fail, the host side is still released (LSan) */
    mb_params_destroy(p);
    tu_device_close(gpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {tu_cuda_test(test_poisoned_context)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
