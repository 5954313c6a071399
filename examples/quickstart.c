/* quickstart.c - the API as it stands, in one page: open a device, register parameters in
 * one flat buffer, initialise them from a seed, run the one matrix multiply.
 *
 *   make build/quickstart && build/quickstart
 */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: quickstart\n"
    "The API on one page (README.md, \"Using it\"): opens the CPU device, registers parameters in\n"
    "one flat buffer, initialises them from a seed, runs the one matrix multiply and shows an\n"
    "error value. Takes no arguments. -h, --help: this text.\n";

#define CHECK(call)                                                               \
    do {                                                                          \
        if ((call) != MB_OK) {                                                    \
            fprintf(stderr, "error: %s\n", mb_last_error());                      \
            return 2;                                                             \
        }                                                                         \
    } while (0)

/* --help: the usage (0); any other argument: one error line, as every tool answers (2);
 * none: -1, run. (Standalone: a user's program builds from this file alone.) */
static int arguments(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    if (argc < 2) return -1;
    fprintf(stderr, argv[1][0] == '-' ? "error: unknown flag '%s' (see --help)\n"
                                      : "error: unexpected argument '%s' (see --help)\n", argv[1]);
    return 2;
}

int main(int argc, char **argv) {
    int done = arguments(argc, argv);
    if (done >= 0) return done;
    enum { B = 4, F = 16, H = 8 };
    mb_device *dev;
    CHECK(mb_device_open(&dev, NULL)); /* CPU; MB_CUDA needs megabatch_cuda.cuh */
    printf("device: %s\n", mb_device_name(dev));

    mb_params *p; /* every weight in one flat buffer, every gradient in another */
    int64_t w_shape[2] = {4 * H, F}, b_shape[1] = {4 * H};
    int w, b;
    CHECK(mb_params_create(&p, dev));
    CHECK(mb_params_add(p, "weight_ih_l0", 2, w_shape, 1.0f / 2.828427f, &w)); /* +-1/sqrt(H) */
    CHECK(mb_params_add(p, "bias_ih_l0", 1, b_shape, 1.0f / 2.828427f, &b));
    CHECK(mb_params_finalize(p));
    CHECK(mb_params_init(p, 42)); /* the same bits on CPU and CUDA */

    float x[B * F], y[B * 4 * H];
    for (int i = 0; i < B * F; i++) x[i] = (float)(i % 7) / 7.0f;
    mb_gemm_args g = {0}; /* y (B, 4H) = x (B, F) @ W^T (F, 4H) */
    g.m = B; g.n = 4 * H; g.k = F; g.alpha = 1.0f; g.trans_b = 1;
    g.a = x; g.lda = F;
    g.b = mb_params_tensor(p, w); g.ldb = F;
    g.c = y; g.ldc = 4 * H;
    CHECK(mb_gemm(dev, &g));
    printf("y[0][0..3] = %.5f %.5f %.5f %.5f\n", y[0], y[1], y[2], y[3]);
    printf("params: %d tensors, %zu floats in one buffer\n", mb_params_num_tensors(p), mb_params_total(p));

    mb_gemm_args bad = g;
    bad.lda = 3; /* a bad argument is an error value with a message, never a crash */
    if (mb_gemm(dev, &bad) != MB_OK) printf("expected error: %s\n", mb_last_error());

    mb_params_destroy(p);
    mb_device_close(dev);
    return 0;
}
