/* dist on CUDA params (docs/DIST.md). Built plain by `make cuda` (a world of one) and, with
 * MPI and NCCL, as build/mpi/test_cuda_dist (-DMEGABATCH_MPI -DMEGABATCH_NCCL), to run as
 * `mpirun -np N build/mpi/test_cuda_dist` with a GPU per rank (GPU = local rank): the
 * NCCL all-reduce of the flat gradients against the count-weighted mean computed on the
 * host (1e-6 relative: NCCL's order is its own), broadcast, ranks bitwise in sync after
 * AdamW steps. Without a GPU every test checks MB_ERR_NO_DEVICE and skips.
 * Not run on a GPU yet; runs under the simulator as build/sim-mpi/test_cuda_dist, NCCL over MPI
 * (tests/cudasim/mpi.sh, with CUDASIM_DEVICES=N so that every local rank has its GPU). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

static mb_dist *g_dist;

/* Every rank opens the GPU of its local rank, and the ranks agree before any collective:
 * when one has no GPU all skip (a rank skipping alone would leave the others waiting in
 * the all-reduce); another failure fails that rank, and the others skip. */
static mb_device *open_gpu_or_skip(void) {
    mb_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = MB_CUDA;
    cfg.index = mb_dist_local_rank(g_dist);
    mb_device *dev = NULL;
    mb_result r = mb_device_open(&dev, &cfg);
    char why[1024];
    snprintf(why, sizeof why, "%s", r == MB_OK ? "" : mb_last_error());
    double missing = r == MB_OK ? 0 : 1;
    tu_ok(mb_dist_sum(g_dist, &missing, 1));
    if (r == MB_ERR_NO_DEVICE) {
        assert_null(dev);
        assert_non_null(strstr(why, "GPU"));
        skip();
    }
    if (r != MB_OK) fail_msg("mb_device_open(MB_CUDA): %s", why);
    if (missing > 0) {
        printf("rank %d: %g other rank(s) have no GPU: skipped with them\n", mb_dist_rank(g_dist), missing);
        tu_device_close(dev);
        skip();
    }
    return (mb_device *)tu_hold(TU_DEVICE, dev);
}

static float val(uint64_t seed, int r, uint64_t i) { return mb_rng_symmetric(seed, (uint64_t)r, i, 1.0f); }

static void test_cuda_allreduce_and_sync(void **state) {
    (void)state;
    mb_device *dev = open_gpu_or_skip();
    int rank = mb_dist_rank(g_dist), size = mb_dist_size(g_dist);
    uint64_t seed = tu_next();
    int64_t n = 1 + (int64_t)(tu_next() % 100000);
    mb_params *p;
    int idx;
    tu_ok(mb_params_create(&p, dev));
    tu_ok(mb_params_add(p, "w", 1, &n, 0.5f, &idx));
    tu_ok(mb_params_finalize(p));
    tu_ok(mb_params_init(p, 100 + (uint64_t)rank));
    tu_ok(mb_dist_broadcast_params(g_dist, p));
    int same = 0;
    tu_ok(mb_dist_check_sync(g_dist, p, &same));
    assert_int_equal(same, 1);
    float *h = tu_alloc_f32((size_t)n), *want = tu_alloc_f32((size_t)n);
    int64_t total = 0, counts[64];
    for (int r = 0; r < size && r < 64; r++) { counts[r] = 1 + r % 3; total += counts[r]; }
    for (int64_t i = 0; i < n; i++) {
        h[i] = val(seed, rank, (uint64_t)i);
        double s = 0;
        for (int r = 0; r < size; r++) s += (double)val(seed, r, (uint64_t)i) * (double)counts[r];
        want[i] = (float)(s / (double)total);
    }
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, mb_params_grad(p), h, (size_t)n * sizeof(float)));
    float loss = (float)rank;
    int64_t got_total = 0;
    tu_ok(mb_dist_allreduce_grads(g_dist, p, counts[rank], &loss, &got_total));
    assert_int_equal(got_total, total);
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, h, mb_params_grad(p), (size_t)n * sizeof(float)));
    tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
    tu_assert_close(h, want, (size_t)n, 1e-7, 1e-6, "all-reduced gradients");
    mb_adamw *opt;
    tu_ok(mb_adamw_create(&opt, p, NULL));
    tu_ok(mb_adamw_step(opt, 1e-2f, NULL));
    tu_ok(mb_dist_check_sync(g_dist, p, &same));
    assert_int_equal(same, 1);
    mb_adamw_destroy(opt);
    free(h); free(want);
    mb_params_destroy(p);
    tu_device_close(dev);
}

int main(void) {
    if (mb_dist_open(&g_dist, NULL) != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 1;
    }
    if (mb_dist_size(g_dist) > 64) return 1;
    uint64_t seed = tu_seed();
    if (mb_dist_broadcast(g_dist, &seed, sizeof seed) != MB_OK) return 1;
    tu_rng_state = seed;
    const struct CMUnitTest tests[] = {tu_cuda_test(test_cuda_allreduce_and_sync)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    mb_dist_close(g_dist);
    return failed;
}
