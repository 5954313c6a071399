/* peak_fma: this CPU's f32 multiply-add peak on one thread, the ceiling against which
 * docs/BENCHMARKS.md reads the CPU kernels' GFLOP/s (issue 29). Twelve independent chains of
 * fused multiply-adds (more than the FMA latency times the units, so the units never wait),
 * AVX-512 (16 lanes) where the CPU has it, else AVX2+FMA (8 lanes); best of 3 runs.
 *
 *   build/bench/peak_fma [seconds per run, default 1]
 *
 * x86 with GCC or Clang only (the kernels it measures against are x86 too); elsewhere it
 * says so and exits 0. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h" /* examples/mb_args.h needs its types */
#include "examples/mb_args.h"
#include <stdio.h>

static const char *usage =
    "usage: peak_fma [seconds]\n"
    "This CPU's f32 fused multiply-add peak on one thread (GFLOP/s): twelve independent FMA\n"
    "chains, AVX-512 where the CPU has it, else AVX2+FMA; best of 3 runs of about `seconds`\n"
    "(default 1). docs/BENCHMARKS.md reads the CPU kernels' rates against it.\n";

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
/* n rounds of 12 FMAs of 16 (AVX-512) or 8 lanes; the asm keeps every chain live and in a register */
#define PEAK_KERNEL(NAME, TARGET, VT, SET1, FMA, ADD, STORE, LANES)                                    \
    __attribute__((target(TARGET))) static double NAME(long n, float *sink) {                          \
        VT b = SET1(1.0000001f), c = SET1(1e-7f);                                                      \
        VT a0 = b, a1 = b, a2 = b, a3 = b, a4 = b, a5 = b, a6 = b, a7 = b, a8 = b, a9 = b, a10 = b,    \
           a11 = b;                                                                                    \
        for (long k = 0; k < n; k++) {                                                                 \
            a0 = FMA(a0, b, c); a1 = FMA(a1, b, c); a2 = FMA(a2, b, c); a3 = FMA(a3, b, c);            \
            a4 = FMA(a4, b, c); a5 = FMA(a5, b, c); a6 = FMA(a6, b, c); a7 = FMA(a7, b, c);            \
            a8 = FMA(a8, b, c); a9 = FMA(a9, b, c); a10 = FMA(a10, b, c); a11 = FMA(a11, b, c);        \
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));         \
            __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));       \
        }                                                                                              \
        VT s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));                      \
        s = ADD(s, ADD(ADD(a8, a9), ADD(a10, a11)));                                                   \
        float out[LANES];                                                                              \
        STORE(out, s);                                                                                 \
        *sink += out[0];                                                                               \
        return 12.0 * 2.0 * LANES * (double)n;                                                         \
    }
PEAK_KERNEL(peak512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, 16)
PEAK_KERNEL(peak256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8)

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    if (argc > 2) return mba_error("give at most one argument: seconds (see --help)");
    double secs = 1.0;
    if (argc > 1 && !mba_arg("seconds", argv[1], MBA_F64, &secs, 0.01, 600, NULL)) return 2;
    int wide = __builtin_cpu_supports("avx512f");
    if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        printf("peak_fma: this CPU has neither AVX-512 nor AVX2+FMA\n");
        return 0;
    }
    double (*k)(long, float *) = wide ? peak512 : peak256, best = 0;
    float sink = 0;
    long n = 1000000;
    double t0 = mba_now();
    k(n, &sink); /* calibrate: about secs a run */
    double t = mba_now() - t0;
    n = (long)((double)n * secs / (t > 1e-6 ? t : 1e-6));
    if (n < 1) n = 1;
    for (int r = 0; r < 3; r++) {
        t0 = mba_now();
        double flop = k(n, &sink);
        double g = flop / (mba_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    printf("peak_fma: %s, 12 chains, best of 3: %.1f GFLOP/s f32 on one thread (checksum %g)\n",
           wide ? "AVX-512" : "AVX2+FMA", best, (double)sink);
    return 0;
}
#else
int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    printf("peak_fma: x86 with GCC or Clang only\n");
    return 0;
}
#endif
