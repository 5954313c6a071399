/* bench_lstm_launches: kernel launches + cuBLAS calls of one forward + backward of the
 * multi-timeframe example's five encoders (T = 480/288/192/96/48, B = 128, F = 8, H = 32),
 * through mb_lstm_forward_many / mb_lstm_backward_many, counted by the simulator.
 *   build/sim/bench/bench_lstm_launches [checkpoint [f32|bf16|f16]]   (default 0 = auto, f32)
 * checkpoint -1 (full storage) runs the fused recurrence where it fits (docs/LSTM.md). Under
 * nvcc (build/bench/bench_lstm_launches) it runs the same calls and says that counting
 * needs the simulator. Uses the public API only, so it builds against older headers too. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK(x)                                                                                 \
    do {                                                                                      \
        if ((x) != MB_OK) { fprintf(stderr, "%s: %s\n", #x, mb_last_error()); return 1; }     \
    } while (0)

static int buf(mb_device *dev, size_t n, float **p) {
    return mb_alloc(dev, MB_MEM_DEVICE, n * sizeof(float), (void **)p) == MB_OK &&
           mb_zero(dev, 0, *p, n * sizeof(float)) == MB_OK;
}

/* The command line as examples/mb_args.h answers (not included: this file builds against
 * older headers too): --help, unknown flags and bad values, exit 2 with one `error:` line. */
static int args(int argc, char **argv, int *ck, mb_dtype *prec) {
    static const char usage[] = "usage: bench_lstm_launches [checkpoint [f32|bf16|f16]]   (default 0 = auto, f32)\n"
                                "Kernel launches + cuBLAS calls of one forward + backward of the example's five\n"
                                "encoders, counted by the simulator (docs/BENCHMARKS.md). -h, --help: this text.\n";
    char *end = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage, stdout); return 0; }
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-' && (argv[i][1] < '0' || argv[i][1] > '9')) {
            fprintf(stderr, "error: unknown flag '%s' (see --help)\n", argv[i]);
            return 2;
        }
    long v = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    if (argc > 3 || (argc > 1 && (*end || end == argv[1] || v < -1 || v > 100000))) {
        fprintf(stderr, argc > 3 ? "error: more than 2 arguments (see --help)\n"
                                 : "error: checkpoint '%s': expected an integer in [-1, 100000]\n", argv[1]);
        return 2;
    }
    const char *ps = argc > 2 ? argv[2] : "f32";
    if (strcmp(ps, "f32") && strcmp(ps, "bf16") && strcmp(ps, "f16")) {
        fprintf(stderr, "error: precision '%s': expected f32, bf16 or f16\n", ps);
        return 2;
    }
    *ck = (int)v;
    *prec = !strcmp(ps, "bf16") ? MB_BF16 : !strcmp(ps, "f16") ? MB_F16 : MB_F32;
    return -1;
}

int main(int argc, char **argv) {
    int ck = 0;
    mb_dtype prec = MB_F32;
    int done = args(argc, argv, &ck, &prec);
    if (done >= 0) return done;
    const char *ps = mb_dtype_name(prec);
    enum { N = 5 };
    const int64_t B = 128, F = 8, H = 32, Ts[N] = {480, 288, 192, 96, 48};
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MB_CUDA; dc.streams = 2 + N;
    mb_device *dev;
    mb_params *p;
    mb_lstm *l[N];
    mb_lstm_call c[N];
    memset(c, 0, sizeof c);
    OK(mb_device_open(&dev, &dc));
    OK(mb_params_create(&p, dev));
    for (int i = 0; i < N; i++) {
        mb_lstm_config lc;
        memset(&lc, 0, sizeof lc);
        char pre[16];
        snprintf(pre, sizeof pre, "e%d.", i);
        lc.input_size = F; lc.hidden_size = H; lc.checkpoint = ck; lc.max_steps = Ts[i]; lc.max_batch = B;
        lc.prefix = pre; lc.stream = 2 + i; lc.precision = prec;
        OK(mb_lstm_create(&l[i], p, &lc));
    }
    OK(mb_params_finalize(p));
    OK(mb_params_init(p, 1));
    for (int i = 0; i < N; i++) {
        float *x, *hl, *dhl, *dx;
        if (!buf(dev, (size_t)(B * Ts[i] * F), &x) || !buf(dev, (size_t)(B * H), &hl) ||
            !buf(dev, (size_t)(B * H), &dhl) || !buf(dev, (size_t)(B * Ts[i] * F), &dx))
            return fprintf(stderr, "allocation failed: %s\n", mb_last_error()), 1;
        c[i].lstm = l[i]; c[i].x = x; c[i].B = B; c[i].T = Ts[i]; c[i].h_last = hl; c[i].dh_last = dhl; c[i].dx = dx;
    }
    OK(mb_sync(dev, -1));
    for (int it = 0; it < 2; it++) { /* the second step is reported: no first-call setup */
#ifdef CUDASIM
        cudasim::stats a = cudasim::get_stats();
#endif
        OK(mb_lstm_forward_many(c, N));
        OK(mb_lstm_backward_many(c, N));
        OK(mb_sync(dev, -1));
#ifdef CUDASIM
        cudasim::stats b = cudasim::get_stats();
        if (it) printf("checkpoint=%d %s: %llu kernel launches + %llu cuBLAS calls = %llu per forward+backward\n", ck, ps,
                       b.launches - a.launches, b.cublas_calls - a.cublas_calls,
                       b.launches - a.launches + b.cublas_calls - a.cublas_calls);
#endif
    }
#ifndef CUDASIM
    printf("ran; counting the launches needs the simulator (build/sim/bench/bench_lstm_launches)\n");
#endif
    for (int i = 0; i < N; i++) {
        mb_free(dev, (void *)c[i].x); mb_free(dev, c[i].h_last); mb_free(dev, (void *)c[i].dh_last); mb_free(dev, c[i].dx);
        mb_lstm_destroy(l[i]);
    }
    mb_params_destroy(p);
    mb_device_close(dev);
    return 0;
}
