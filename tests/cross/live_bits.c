/* live_bits - one fingerprint of the live predictor's platform-sensitive parts, to compare
 * across platforms (tests/cross/run.sh: Linux x86-64, Windows x64 under Wine, ARM64 under
 * qemu-aarch64), as lstm_bits does for the LSTM:
 *   - the feature engine (examples/mb_features.h): every row of every timeframe, all 169
 *     features, over a seeded random walk of M1 bars with gaps and weekends;
 *   - its own log, sin and cos on seeded random arguments (those of the features and wider);
 *   - the plain C gemm's A B^T (MEGABATCH_NO_CBLAS: the model head's linear layers), odd
 *     shapes included, and the GELU and TANH activations, forward and backward, on each CPU
 *     kernel this CPU runs (c; avx2, avx512 on x86).
 * Every result's bytes go into a 64-bit FNV-1a hash; no libm call decides a hashed bit.
 *   live_bits [seed]     prints "live_bits: seed S kernel K hash H" per kernel; exit 1 when two
 *                        kernels of this run disagree, 2 on an error. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mb_features.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bits.h"

static double unifd(double lo, double hi) { return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1p-53; }

/* 20,000 M1 bars (random walk, 2% gaps of up to 5 hours, weekends): every row's features. */
static uint64_t features(uint64_t h) {
    mbf_state *s = (mbf_state *)malloc(sizeof *s);
    mbf_out *o = (mbf_out *)malloc(sizeof *o);
    if (!s || !o) { fprintf(stderr, "live_bits: no memory\n"); exit(2); }
    mbf_init(s, MBF_MAX);
    mbf_bar b = {1704067200, 1.1, 1.1, 1.1, 1.1, 0};
    for (int i = 0; i < 20000; i++) {
        b.t += 60 * (unifd(0, 1) < 0.02 ? 1 + (int64_t)unifd(0, 300) : 1);
        if ((b.t / 86400 + 3) % 7 >= 5) { i--; continue; }
        b.o = b.c;
        b.c = b.o * (1 + unifd(-1e-3, 1e-3));
        b.h = (b.o > b.c ? b.o : b.c) * (1 + unifd(0, 5e-4));
        b.l = (b.o < b.c ? b.o : b.c) * (1 - unifd(0, 5e-4));
        b.v = unifd(0, 1) < 0.05 ? 0 : (double)(int)unifd(1, 500);
        if (mbf_push(s, &b, o) != MBF_OK) { fprintf(stderr, "live_bits: bar %d refused\n", i); exit(2); }
        for (int j = 0; j < o->n; j++) h = fnv(h, o->row[j].x, MBF_MAX * sizeof(float));
    }
    free(s); free(o);
    return h;
}

static uint64_t math(uint64_t h) {
    for (int i = 0; i < 50000; i++) {
        double x = i % 2 ? 1 + unifd(-1e-2, 1e-2) : unifd(0.5, 1) * ldexp(1.0, (int)unifd(-60, 60)); /* ldexp: exact */
        double a = i % 3 ? unifd(-4 * 3.141592653589793, 4 * 3.141592653589793) : unifd(-1e6, 1e6);
        double r[3] = {mbf_log(x), mbf_sin(a), mbf_cos(a)};
        h = fnv(h, r, sizeof r);
    }
    return h;
}

/* On CPU kernel k: C (m, n) = A (m, k) B (n, k)^T (+ C) through mb_gemm, then GELU and TANH
 * forward and backward over C (the head's activation). 0 when the kernel is not here. */
static uint64_t device(uint64_t h, mb_cpu_kernel kern) {
    static const int64_t shapes[][3] = {{1, 64, 160}, {1, 36, 64}, {3, 7, 13}, {5, 129, 31}, {2, 4, 8}};
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.threads = 1;
    dc.cpu_kernel = kern;
    mb_device *dev = NULL;
    if (mb_device_open(&dev, &dc) != MB_OK) return 0;
    mb_result r = MB_OK;
    for (size_t s = 0; r == MB_OK && s < sizeof shapes / sizeof *shapes; s++) {
        int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], all = m * k + n * k + 3 * m * n;
        float *a = (float *)malloc((size_t)all * sizeof(float)), *b = a + m * k, *c = b + n * k, *y = c + m * n,
              *dy = y + m * n;
        if (!a) { r = MB_ERR_OUT_OF_MEMORY; break; }
        for (int64_t i = 0; i < all; i++) a[i] = 3 * unif(-1, 1);
        mb_gemm_args g;
        memset(&g, 0, sizeof g);
        g.trans_b = 1; g.m = m; g.n = n; g.k = k; g.alpha = 1.0f; g.beta = s % 2 ? 1.0f : 0.0f;
        g.a = a; g.lda = k; g.b = b; g.ldb = k; g.c = c; g.ldc = n;
        r = mb_gemm(dev, &g);
        if (r == MB_OK) h = fnv(h, c, (size_t)(m * n) * sizeof(float));
        for (int act = MB_ACT_GELU; r == MB_OK && act <= MB_ACT_TANH; act++) {
            r = mb_act_forward(dev, 0, (mb_act)act, c, y, (size_t)(m * n));
            if (r == MB_OK) h = fnv(h, y, (size_t)(m * n) * sizeof(float));
            if (r == MB_OK) r = mb_act_backward(dev, 0, (mb_act)act, c, dy, y, (size_t)(m * n));
            if (r == MB_OK) h = fnv(h, y, (size_t)(m * n) * sizeof(float));
        }
        free(a);
    }
    mb_device_close(dev);
    if (r != MB_OK) { fprintf(stderr, "live_bits: error: %s\n", mb_last_error()); exit(2); }
    return h;
}

int main(int argc, char **argv) {
    static const struct { mb_cpu_kernel k; const char *name; } ks[] = {
        {MB_CPU_KERNEL_C, "c"}, {MB_CPU_KERNEL_AVX2, "avx2"}, {MB_CPU_KERNEL_AVX512, "avx512"}};
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1, first = 0;
    rng = seed;
    uint64_t h0 = math(features(14695981039346656037ull));
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        rng = seed;
        uint64_t h = device(h0, ks[i].k);
        if (!h) continue; /* not on this CPU or platform */
        printf("live_bits: seed %llu kernel %s hash %016llx\n", (unsigned long long)seed, ks[i].name,
               (unsigned long long)h);
        if (!first) first = h;
        bad |= h != first;
    }
    return first ? bad : 2;
}
