/* bench_live: latency per closed M1 bar of the live predictor (examples/mtf_live.h), batch 1,
 * CPU: the feature engine + normalisation + the sample's assembly + the model's forward.
 *   build/bench/bench_live [bars [F [H [threads [window|stateful]]]]]   defaults 2000 12 32 1 window
 * stateful: the O(1)-per-bar mode of a --carry model (one LSTM step per closed row).
 * The model has the example's shape (segments 480,288,192,96,48, head 64, K 36) with
 * seeded random weights (latency does not depend on their values), written to a temporary
 * safetensors file and opened as a user would. Random-walk M1 bars with weekends; the
 * warm-up bars (until every window is full) are not timed. Prints the median, p90, p99,
 * min and max per bar, and the same for the feature engine alone (mbf_push). */
#define _POSIX_C_SOURCE 200809L
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mtf_live.h"
#include "examples/mb_args.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void report(const char *what, double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, mtf_by_value);
    printf("%-28s median %9.1f us  p90 %9.1f  p99 %9.1f  min %9.1f  max %9.1f  (%d bars)\n", what, 1e6 * v[n / 2],
           1e6 * v[n * 9 / 10], 1e6 * v[n * 99 / 100], 1e6 * v[0], 1e6 * v[n - 1], n);
}

/* The next M1 bar of a random walk, skipping Friday 22:00 .. Sunday 22:00. */
static mbf_bar next_bar(mbf_bar prev, uint64_t i) {
    mbf_bar b = prev;
    do b.t += 60; while (((b.t / 86400 + 3) % 7 == 4 && b.t % 86400 >= 22 * 3600) || (b.t / 86400 + 3) % 7 == 5 ||
                         ((b.t / 86400 + 3) % 7 == 6 && b.t % 86400 < 22 * 3600));
    b.o = prev.c;
    b.c = b.o * exp(3e-4 * (double)mb_rng_symmetric(7, 0, i, 1.0f));
    b.h = fmax(b.o, b.c) * 1.0001;
    b.l = fmin(b.o, b.c) * 0.9999;
    b.v = 10 + (double)(i % 50);
    return b;
}

static mb_result write_model(const char *path, int64_t F, int64_t H) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    const int64_t seg[5] = {480, 288, 192, 96, 48};
    s.nseg = 5; s.layers = 1; s.carry = 1; /* opens in both modes */ s.F = F; s.K = 36; s.hidden_size = H; s.head = 64; s.has_norm = 1;
    for (int k = 0; k < 5; k++) { s.seg_len[k] = seg[k]; s.T += seg[k]; }
    snprintf(s.seg_names, sizeof s.seg_names, "M1,M5,M15,H1,H4");
    for (int i = 0; i < 5 * F; i++) { s.mean[i] = 0; s.std[i] = 1; }
    mb_device *dev = NULL;
    mtf_model m;
    mtf_meta_text t;
    memset(&m, 0, sizeof m);
    mb_result r = mtf_device_open(&dev, MB_CPU, 1);
    if (r == MB_OK) r = mtf_model_create(&m, dev, &s, 1, 0);
    if (r == MB_OK) r = mb_params_init(m.params, 1);
    if (r == MB_OK) r = mtf_meta_of(&s, &t);
    if (r == MB_OK) r = mb_st_save_params(path, m.params, mtf_rename, t.kv, t.n);
    if (r == MB_OK) mtf_meta_free(&t);
    if (m.params) mtf_model_destroy(&m);
    mb_device_close(dev);
    return r;
}

static const char usage[] =
    "usage: bench_live [bars [F [H [threads [window|stateful]]]]]   defaults 2000 12 32 1 window\n"
    "Latency per closed M1 bar of the live predictor (examples/mtf_live.h), batch 1, CPU, with the\n"
    "example's model shape and random weights (docs/BENCHMARKS.md). -h, --help: this text.\n";

int main(int argc, char **argv) {
    static const char *const modes[] = {"window", "stateful", NULL};
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    if (argc > 6) return mba_error("more than 5 arguments (see --help)");
    int n = 2000, threads = 1, mode = 0;
    int64_t F = 12, H = 32;
    if ((argc > 1 && !mba_arg("bars", argv[1], MBA_INT, &n, 1, 1e8, NULL)) ||
        (argc > 2 && !mba_arg("F", argv[2], MBA_I64, &F, 1, MTF_MAX_F, NULL)) ||
        (argc > 3 && !mba_arg("H", argv[3], MBA_I64, &H, 1, 4096, NULL)) ||
        (argc > 4 && !mba_arg("threads", argv[4], MBA_INT, &threads, 0, 1024, NULL)) ||
        (argc > 5 && !mba_arg("mode", argv[5], MBA_CHOICE, &mode, 0, 0, modes)))
        return 2;
    mode = mode ? MTF_LIVE_STATEFUL : MTF_LIVE_WINDOW;
    char path[64];
    snprintf(path, sizeof path, "/tmp/bench_live_%d.safetensors", (int)getpid());
    mtf_live *lv = NULL;
    mb_result r = write_model(path, F, H);
    if (r == MB_OK) r = mtf_live_open(&lv, path, MB_CPU, threads, mode);
    remove(path);
    if (r != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 2;
    }
    printf("live predictor, CPU, batch 1, %s mode: F=%lld H=%lld head 64 K=36, T=1104 (480,288,192,96,48), "
           "threads %d, FTZ/DAZ on (the device's default)\n", mode ? "stateful" : "window", (long long)F, (long long)H,
           threads);
    double *lat = (double *)malloc((size_t)n * sizeof *lat), *eng = (double *)malloc((size_t)n * sizeof *eng);
    float pred[36];
    int ready = 0, timed = 0;
    uint64_t i = 0, warm = 0;
    mbf_bar b = {1704067200 - 60, 1.1, 1.1, 1.1, 1.1, 0};
    mbf_state *e = (mbf_state *)malloc(sizeof *e);
    mbf_out *out = (mbf_out *)malloc(sizeof *out);
    mbf_init(e, (int)F);
    while (timed < n && r == MB_OK) {
        b = next_bar(b, i++);
        double t0 = mba_now();
        r = mtf_live_push(lv, &b, pred, &ready);
        double t1 = mba_now();
        mbf_push(e, &b, out); /* the engine alone, on the same bars */
        double t2 = mba_now();
        if (ready) { lat[timed] = t1 - t0; eng[timed++] = t2 - t1; }
        else warm++;
    }
    if (r != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
    printf("warm-up: %llu bars before the first prediction\n", (unsigned long long)warm);
    report("per bar (push -> K preds)", lat, n);
    report("feature engine alone", eng, n);
    mtf_live_close(lv);
    free(lat); free(eng); free(e); free(out);
    return 0;
}
