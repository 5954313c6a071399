/* bench_avg: what weight averaging (mb_avg, --ema) costs in a training step (issue 43's goal:
 * at most 2% at F=32 H=64 B=128 on the CPU). The multi-timeframe model of train_multitf
 * (examples/multitf.h: five encoders of 480/288/192/96/48 steps, the head) on random inputs:
 *   plain  zero grads, forward, MSE, backward, AdamW
 *   ema    the same, then mb_avg_update (EMA 0.999) after the optimizer step
 * in turn (the order reversed every other round), and mb_avg_update alone (the same number of
 * weights, 200 calls a round). Prints each case's median and min-max ms per step, the update's
 * median microseconds, and its share of the plain step (median update / median plain step).
 *   build/bench/bench_avg [F H B [rounds [threads]]]    defaults 32 64 128, 7 rounds, 1 thread
 * The device's denormal mode (flush-to-zero) holds for every case. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mb_args.h"
#include "examples/multitf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: bench_avg [F H B [rounds [threads]]]\n"
    "The cost of an EMA of the weights (mb_avg_update) in the multi-timeframe model's training\n"
    "step on the CPU: the step with and without it, in turn, and the update alone; medians and\n"
    "min-max. Defaults 32 64 128, 7 rounds, 1 thread. -h, --help: this text.\n";

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench {
    mtf_model net;
    mb_adamw *opt;
    mb_avg *avg;
    float *x, *y;
    int64_t B;
} bench;

static mb_result step(bench *b, int ema) {
    const float *pred;
    MB_TRY(mb_params_zero_grad(b->net.params));
    MB_TRY(mtf_model_forward(&b->net, b->x, b->B, &pred));
    MB_TRY(mb_loss(b->net.dev, MB_STREAM_COMPUTE, NULL, pred, b->y, b->B, b->net.spec.K, 1.0f, NULL, NULL,
                   b->net.dpred));
    MB_TRY(mtf_model_backward(&b->net, b->B));
    MB_TRY(mb_adamw_step(b->opt, 1e-3f, NULL));
    if (ema) MB_TRY(mb_avg_update(b->avg, b->opt));
    return mb_sync(b->net.dev, -1);
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    if (argc != 1 && argc < 4) return mba_error("give F H B [rounds [threads]] (see --help)");
    if (argc > 6) return mba_error("too many arguments (see --help)");
    int64_t F = 32, H = 64, B = 128;
    int rounds = 7, threads = 1;
    if (argc > 1 && !(mba_arg("F", argv[1], MBA_I64, &F, 1, 64, NULL) && mba_arg("H", argv[2], MBA_I64, &H, 1, 1e4, NULL) &&
                      mba_arg("B", argv[3], MBA_I64, &B, 1, 1e5, NULL)))
        return 2;
    if (argc > 4 && !mba_arg("rounds", argv[4], MBA_INT, &rounds, 1, 1000, NULL)) return 2;
    if (argc > 5 && !mba_arg("threads", argv[5], MBA_INT, &threads, 0, 1024, NULL)) return 2;
    static const int64_t seg[5] = {480, 288, 192, 96, 48};
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = 5; s.layers = 1; s.F = F; s.K = 36; s.hidden_size = H; s.head = 64;
    for (int i = 0; i < 5; i++) { s.seg_len[i] = seg[i]; s.T += seg[i]; }
    mb_device *dev = NULL;
    bench b;
    memset(&b, 0, sizeof b);
    b.B = B;
    mtf_config c = {B, 0, 1, 0, MB_F32, 0.0f, 0}; /* no dropout */
    mb_avg_config ac = {0.999, MB_AVG_EMA};
    size_t nx = (size_t)(B * s.T * F), ny = (size_t)(B * s.K);
    mb_result r = mtf_device_open(&dev, MB_CPU, threads);
    if (r == MB_OK) r = mtf_model_build(&b.net, dev, &s, &c);
    if (r == MB_OK) r = mb_params_init(b.net.params, 1);
    if (r == MB_OK) r = mb_adamw_create(&b.opt, b.net.params, NULL);
    if (r == MB_OK) r = mb_avg_create(&b.avg, b.net.params, &ac);
    if (r == MB_OK) r = mb_alloc(dev, MB_MEM_DEVICE, nx * sizeof(float), (void **)&b.x);
    if (r == MB_OK) r = mb_alloc(dev, MB_MEM_DEVICE, ny * sizeof(float), (void **)&b.y);
    if (r != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
    for (size_t i = 0; i < nx; i++) b.x[i] = mb_rng_symmetric(7, 0, i, 1.0f);
    for (size_t i = 0; i < ny; i++) b.y[i] = mb_rng_symmetric(7, 1, i, 1.0f);
    size_t n = mb_params_total(b.net.params);
    printf("bench_avg: F=%lld H=%lld B=%lld T=%lld, %zu weights, %d thread(s), %s, flush-to-zero on, %d rounds\n",
           (long long)F, (long long)H, (long long)B, (long long)s.T, n, threads, mb_device_name(dev), rounds);
    double t_plain[1000], t_ema[1000], t_upd[1000];
    for (int w = 0; w < 2 && r == MB_OK; w++) r = step(&b, w); /* warm-up */
    for (int k = 0; k < rounds && r == MB_OK; k++) {
        for (int j = 0; j < 2 && r == MB_OK; j++) {
            int ema = (j + k) % 2; /* the order reversed every other round */
            double t0 = mba_now();
            r = step(&b, ema);
            (ema ? t_ema : t_plain)[k] = (mba_now() - t0) * 1e3;
        }
        double t0 = mba_now();
        for (int i = 0; i < 200 && r == MB_OK; i++) r = mb_avg_update(b.avg, NULL);
        t_upd[k] = (mba_now() - t0) / 200 * 1e6;
    }
    if (r != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
    double lo[3] = {1e30, 1e30, 1e30}, hi[3] = {0, 0, 0};
    for (int k = 0; k < rounds; k++) {
        double v[3] = {t_plain[k], t_ema[k], t_upd[k]};
        for (int i = 0; i < 3; i++) { lo[i] = v[i] < lo[i] ? v[i] : lo[i]; hi[i] = v[i] > hi[i] ? v[i] : hi[i]; }
    }
    double mp = median(t_plain, rounds), me = median(t_ema, rounds), mu = median(t_upd, rounds);
    printf("step plain  %.2f ms (%.2f-%.2f)\nstep ema    %.2f ms (%.2f-%.2f)\n", mp, lo[0], hi[0], me, lo[1], hi[1]);
    printf("update      %.1f us (%.1f-%.1f) = %.3f%% of the plain step (ema/plain medians: %+.2f%%)\n", mu, lo[2],
           hi[2], mu / (mp * 1e3) * 100.0, (me / mp - 1.0) * 100.0);
    mb_avg_destroy(b.avg);
    mb_adamw_destroy(b.opt);
    mb_free(dev, b.x);
    mb_free(dev, b.y);
    mtf_model_destroy(&b.net);
    mb_device_close(dev);
    return 0;
}
