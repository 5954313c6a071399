/* bench_lstm: CPU LSTM forward+backward time per step and kept activation memory, full
 * storage vs checkpointed.  Usage: build/bench/bench_lstm [B T F H [iters]]
 * (default 128 480 128 256 1). Peer: bench/pytorch/lstm_cpu.py with the same arguments. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int run(int64_t B, int64_t T, int64_t F, int64_t H, int ck, int iters) {
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    mb_lstm_config cfg = {0};
    cfg.input_size = F; cfg.hidden_size = H; cfg.layers = 1; cfg.checkpoint = ck;
    cfg.max_steps = T; cfg.max_batch = B;
    if (mb_device_open(&dev, NULL) || mb_params_create(&p, dev) || mb_lstm_create(&l, p, &cfg) ||
        mb_params_finalize(p) || mb_params_init(p, 1)) {
        fprintf(stderr, "setup failed: %s\n", mb_last_error());
        return 1;
    }
    float *x = (float *)calloc((size_t)(B * T * F), 4), *hl = (float *)calloc((size_t)(B * H), 4);
    float *dl = (float *)calloc((size_t)(B * H), 4);
    for (int64_t i = 0; i < B * T * F; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < B * H; i++) dl[i] = 1.0f / (float)(B * H);
    double tf = 0, tb = 0;
    for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
        double t0 = now();
        if (mb_lstm_forward(l, x, B, T, NULL, NULL, NULL, hl)) { fprintf(stderr, "%s\n", mb_last_error()); return 1; }
        double t1 = now();
        if (mb_lstm_backward(l, dl, NULL, NULL, NULL, NULL)) { fprintf(stderr, "%s\n", mb_last_error()); return 1; }
        double t2 = now();
        if (it) { tf += t1 - t0; tb += t2 - t1; }
    }
    size_t full, kept;
    mb_lstm_memory(&cfg, B, T, &full, &kept);
    printf("B=%lld T=%lld F=%lld H=%lld checkpoint=%-3lld fwd %8.1f us/step  fwd+bwd %8.1f us/step  "
           "activations %.1f MiB\n", (long long)B, (long long)T, (long long)F, (long long)H,
           (long long)mb_lstm_checkpoint_steps(l, T), 1e6 * tf / iters / T, 1e6 * (tf + tb) / iters / T,
           kept / 1048576.0);
    free(x); free(hl); free(dl);
    mb_lstm_destroy(l); mb_params_destroy(p); mb_device_close(dev);
    return 0;
}

int main(int argc, char **argv) {
    int64_t B = argc > 4 ? atoll(argv[1]) : 128, T = argc > 4 ? atoll(argv[2]) : 480;
    int64_t F = argc > 4 ? atoll(argv[3]) : 128, H = argc > 4 ? atoll(argv[4]) : 256;
    int iters = argc > 5 ? atoi(argv[5]) : 1;
    return run(B, T, F, H, -1, iters) || run(B, T, F, H, 0, iters);
}
