/* CUDA loader: the same batches as the CPU loader (copied back from device memory), for
 * resident and double-buffered chunks, with and without shuffle, and with the pinned
 * slabs replaced by pageable ones; bf16 chunks bitwise equal to the CPU's. Without a GPU every test skips after checking the
 * no-GPU error. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

enum { N = 301, T = 7, F = 5, K = 3, ROW = T * F };
static float g_feat[N * ROW], g_targ[N * K];


/* Two epochs of batches as host bytes (features then targets, batch after batch, in
 * the loader dtype); returns bytes. */
static size_t collect(mb_device *dev, const mb_loader_config *c, char *out, size_t cap) {
    mb_dataset *ds;
    tu_ok(mb_dataset_open_memory(&ds, g_feat, g_targ, N, T, F, K, NULL));
    mb_loader *ld;
    tu_ok(mb_loader_open(&ld, dev, ds, c));
    return tu_drain_two_epochs(dev, ld, ds, ROW, K, mb_dtype_size(c->dtype), out, cap);
}

static void compare_with_cpu(mb_device *gpu, mb_loader_config c) {
    size_t cap = 2 * (size_t)N * (ROW + K) * sizeof(float);
    char *a = (char *)tu_alloc_f32(cap / sizeof(float)), *b = (char *)tu_alloc_f32(cap / sizeof(float));
    mb_device *cpu;
    tu_ok(mb_device_open(&cpu, NULL));
    size_t na = collect(cpu, &c, a, cap), nb = collect(gpu, &c, b, cap);
    assert_int_equal(na, nb);
    assert_true(na > 0);
    assert_memory_equal(a, b, na); /* bitwise, also for bf16: one rounding on both backends */
    tu_device_close(cpu);
    free(a);
    free(b);
}

static void test_cuda_loader_matches_cpu(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    const size_t bps = (ROW + K) * sizeof(float);
    const size_t chunks[] = {N, 100, 37};
    for (int ci = 0; ci < 3; ci++)
        for (int sh = 0; sh < 2; sh++)
            for (int dl = 0; dl < 2; dl++) {
                mb_loader_config c;
                memset(&c, 0, sizeof c);
                c.batch = 8;
                c.chunk_bytes = chunks[ci] * bps;
                c.slab_bytes = 11 * bps;
                c.shuffle = sh;
                c.seed = 99;
                c.drop_last = dl;
                compare_with_cpu(dev, c);
            }
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_PINNED], 0);
    tu_device_close(dev);
}

static void test_cuda_loader_pageable_fallback(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = 16;
    c.chunk_bytes = 90 * (ROW + K) * sizeof(float);
    c.slab_bytes = 1; /* one-sample slabs: a pinned failure goes straight to pageable */
    mb_device_fail_alloc(dev, MB_MEM_PINNED, 1);
    compare_with_cpu(dev, c);
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 1); /* first chunk buffer: retry smaller */
    compare_with_cpu(dev, c);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    tu_device_close(dev);
}

/* bf16 chunks (converted on the device by the copy stream): bitwise equal to the CPU's,
 * resident and double-buffered, shuffled, slabs of a few samples; then a failed
 * conversion stage (halved) gives the same batches. */
static void test_cuda_loader_bf16_matches_cpu(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    const size_t bps = (ROW + K) * 2;
    const size_t chunks[] = {N, 100, 37};
    for (int ci = 0; ci < 3; ci++)
        for (int sh = 0; sh < 2; sh++) {
            mb_loader_config c;
            memset(&c, 0, sizeof c);
            c.batch = 8;
            c.dtype = MB_BF16;
            c.chunk_bytes = chunks[ci] * bps;
            c.slab_bytes = 11 * (ROW + K) * sizeof(float);
            c.shuffle = sh;
            c.seed = 99;
            compare_with_cpu(dev, c);
        }
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = 16;
    c.dtype = MB_BF16;
    c.chunk_bytes = 90 * bps; /* two buffers: device allocs chunk, chunk, stage */
    c.slab_bytes = 20 * (ROW + K) * sizeof(float);
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 3);
    compare_with_cpu(dev, c);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_PINNED], 0);
    tu_device_close(dev);
}

int main(void) {
    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < ROW; j++) g_feat[i * ROW + j] = (float)i + tu_uniform(0.0f, 0.5f);
        for (size_t j = 0; j < K; j++) g_targ[i * K + j] = -(float)i - tu_uniform(0.0f, 0.5f);
    }
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_loader_matches_cpu),
        tu_cuda_test(test_cuda_loader_pageable_fallback),
        tu_cuda_test(test_cuda_loader_bf16_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
