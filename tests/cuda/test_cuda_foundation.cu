/* CUDA foundation tests: the CUDA device against the CPU reference.
 * Without a GPU every test checks that opening MB_CUDA gives a clear MB_ERR_NO_DEVICE
 * and then skips itself. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "gemm_case.h"
#include "backend_check.h"

/* The CUDA table fills every slot of its groups (needs no GPU). */
static void test_cuda_backend_table(void **state) {
    (void)state;
    bc_check_table(mb__cuda_backend());
}

static void test_cuda_device_basics(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    assert_int_equal(mb_device_backend(dev), MB_CUDA);
    assert_non_null(mb_device_stream(dev, 3));
    assert_non_null(mb_device_cublas(dev));
    printf("device: %s\n", mb_device_name(dev));
    size_t total = 0, avail = 0;
    tu_ok(mb_device_memory(dev, &total, &avail));
    assert_true(total > ((size_t)1 << 30) && avail <= total);
    /* device, pinned and host memory; copies between all of them on several streams */
    unsigned char *d = NULL, *pin = NULL, *h = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 1 << 20, (void **)&d));
    tu_ok(mb_alloc(dev, MB_MEM_PINNED, 1 << 20, (void **)&pin));
    tu_ok(mb_alloc(dev, MB_MEM_HOST, 1 << 20, (void **)&h));
    for (int i = 0; i < (1 << 20); i++) pin[i] = (unsigned char)(i * 7);
    tu_ok(mb_copy(dev, MB_STREAM_COPY, d, pin, 1 << 20));
    tu_ok(mb_stream_wait(dev, 2, MB_STREAM_COPY));
    tu_ok(mb_zero(dev, 2, d, 1000));
    tu_ok(mb_stream_wait(dev, 0, 2));
    tu_ok(mb_copy(dev, 0, h, d, 1 << 20));
    tu_ok(mb_sync(dev, 0));
    for (int i = 0; i < (1 << 20); i++) assert_int_equal(h[i], i < 1000 ? 0 : (unsigned char)(i * 7));
    /* 2D copy device -> host: rows of 100 bytes at pitch 1000 */
    tu_ok(mb_copy_2d(dev, 0, h, 100, d + 5, 1000, 100, 50));
    tu_ok(mb_sync(dev, 0));
    for (int r = 0; r < 50; r++)
        for (int c = 0; c < 100; c++) {
            int i = r * 1000 + 5 + c;
            assert_int_equal(h[r * 100 + c], i < 1000 ? 0 : (unsigned char)(i * 7));
        }
    mb_mem_stats s = mb_device_mem_stats(dev);
    assert_int_equal(s.live[MB_MEM_DEVICE], 1 << 20);
    assert_int_equal(s.live[MB_MEM_PINNED], 1 << 20);
    /* injected failure, then a real one (far more than the GPU has), then recovery */
    void *x = NULL;
    mb_device_fail_alloc(dev, MB_MEM_DEVICE, 1);
    tu_assert_error(mb_alloc(dev, MB_MEM_DEVICE, 64, &x), MB_ERR_OUT_OF_MEMORY, "injected");
    tu_assert_error(mb_alloc(dev, MB_MEM_DEVICE, total * 4, &x), MB_ERR_OUT_OF_MEMORY, "cudaMalloc");
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, 64, &x));
    mb_free(dev, x);
    mb_free(dev, d); mb_free(dev, pin); mb_free(dev, h);
    assert_int_equal(mb_device_mem_stats(dev).live[MB_MEM_DEVICE], 0);
    tu_device_close(dev);
}

static void test_cuda_gemm_vs_reference(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    for (int i = 0; i < 200; i++) {
        tu_gemm_case g = tu_gemm_random();
        tu_gemm_run(dev, &g, 1e-5, 1e-5);
    }
    for (int i = 0; i < 60; i++) {
        tu_gemm_case g = tu_gemm_random();
        g.ab = i % 2 ? MB_BF16 : MB_F16;
        g.c = i % 3 == 0 ? g.ab : MB_F32;
        tu_gemm_run(dev, &g, 1e-5, g.c == MB_F32 ? 1e-5 : (g.c == MB_BF16 ? 8e-3 : 1e-3));
    }
    tu_gemm_case g = tu_gemm_random();
    g.k = 0;
    tu_gemm_run(dev, &g, 0, 0);
    tu_device_close(dev);
}

static void test_cuda_gemm_tf32(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(1);
    assert_int_equal(mb_device_tf32(dev), 1);
    for (int i = 0; i < 50; i++) {
        tu_gemm_case g = tu_gemm_random();
        tu_gemm_run(dev, &g, 2e-3, 2e-3); /* TF32: 10-bit mantissa operands */
    }
    tu_device_close(dev);
}

static void test_cuda_params_init_matches_cpu(void **state) {
    (void)state;
    mb_device *gpu = tu_open_cuda_or_skip(0), *cpu = NULL;
    tu_ok(mb_device_open(&cpu, NULL));
    mb_params *p[2];
    mb_device *devs[2] = {cpu, gpu};
    int64_t w[2] = {1024, 257}, b[1] = {1024};
    for (int i = 0; i < 2; i++) {
        tu_ok(mb_params_create(&p[i], devs[i]));
        tu_ok(mb_params_add(p[i], "weight", 2, w, 1.0f / 16.0f, NULL));
        tu_ok(mb_params_add(p[i], "bias", 1, b, 0.3f, NULL));
        tu_ok(mb_params_finalize(p[i]));
        tu_ok(mb_params_init(p[i], 0xC0FFEEull));
    }
    size_t n = mb_params_total(p[0]);
    float *x = tu_alloc_f32(n), *y = tu_alloc_f32(n);
    tu_ok(mb_params_get(p[0], x));
    tu_ok(mb_params_get(p[1], y));
    assert_memory_equal(x, y, n * sizeof(float)); /* the same bits on both backends */
    float *gz = tu_alloc_f32(n);
    tu_ok(mb_params_zero_grad(p[1]));
    tu_ok(mb_copy(gpu, 0, gz, mb_params_grad(p[1]), n * sizeof(float)));
    tu_ok(mb_sync(gpu, 0));
    for (size_t i = 0; i < n; i++) assert_true(gz[i] == 0.0f);
    free(x); free(y); free(gz);
    mb_params_destroy(p[0]); mb_params_destroy(p[1]);
    tu_device_close(cpu); tu_device_close(gpu);
}

static void test_cuda_convert_matches_cpu(void **state) {
    (void)state;
    mb_device *dev = tu_open_cuda_or_skip(0);
    const size_t n = 100003;
    float *x = tu_alloc_f32(n), *back = tu_alloc_f32(n);
    tu_fill(x, n, -70000.0f, 70000.0f);
    x[0] = NAN; x[1] = INFINITY; x[2] = 1e-6f; x[3] = -3e-8f;
    uint16_t *h = (uint16_t *)malloc(n * 2);
    void *dx = tu_to_device(dev, x, n * 4), *dh = NULL, *dy = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, n * 2, &dh));
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, n * 4, &dy));
    for (int t = 1; t <= 2; t++) {
        mb_dtype dt = (mb_dtype)t;
        tu_ok(mb_convert(dev, 0, dh, dt, dx, MB_F32, n));
        tu_ok(mb_convert(dev, 0, dy, MB_F32, dh, dt, n));
        tu_ok(mb_copy(dev, 0, h, dh, n * 2));
        tu_ok(mb_copy(dev, 0, back, dy, n * 4));
        tu_ok(mb_sync(dev, 0));
        for (size_t i = 0; i < n; i++) {
            uint16_t want = dt == MB_BF16 ? mb_f32_to_bf16(x[i]) : mb_f32_to_f16(x[i]);
            if (h[i] != want) fail_msg("%s: element %zu of %g: %04x, want %04x", mb_dtype_name(dt), i, x[i], h[i], want);
            float wb = dt == MB_BF16 ? mb_bf16_to_f32(want) : mb_f16_to_f32(want);
            assert_true(memcmp(&wb, &back[i], 4) == 0 || (isnan(wb) && isnan(back[i])));
        }
    }
    mb_free(dev, dx); mb_free(dev, dh); mb_free(dev, dy);
    free(x); free(back); free(h);
    tu_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_cuda_device_basics),  tu_cuda_test(test_cuda_gemm_vs_reference),
        tu_cuda_test(test_cuda_gemm_tf32),      tu_cuda_test(test_cuda_params_init_matches_cpu),
        tu_cuda_test(test_cuda_convert_matches_cpu), cmocka_unit_test(test_cuda_backend_table),
    };
    return cmocka_run_group_tests_name("cuda_foundation", tests, NULL, NULL);
}
