/* lstm_bits - one fingerprint of the CPU LSTM's results, to compare across platforms and
 * CPU kernels (tests/cross/run.sh: Linux x86-64, Windows x64 under Wine, ARM64 under
 * qemu-aarch64). For three shapes (2 layers, full storage and checkpointed), seeded
 * parameters, inputs, initial state and output gradients: the forward (out_seq, h_last,
 * final h and c), the backward (parameter gradients, dx, dh0, dc0), each kernel this CPU
 * runs (c; avx2, avx512 on x86). Every result's bytes go into a 64-bit FNV-1a hash.
 * No libm call is involved (the cell's exp is the library's own fmaf polynomial, the
 * gemm is the library's), so the hash is the same on every platform where the kernels
 * keep their promise: same bits.
 *   lstm_bits [seed]     prints "lstm_bits: seed S kernel K hash H" per kernel; exit 1 when
 *                        two kernels of this run disagree, 2 on an error. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bits.h"

/* The hash of one shape's run on kernel k (0 on an error, reported). */
static uint64_t run(mb_cpu_kernel k, uint64_t seed, int64_t B, int64_t T, int64_t F, int64_t H, int ckpt) {
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.cpu_kernel = k;
    dc.threads = 1;
    mb_device *dev = NULL;
    mb_params *p = NULL;
    mb_lstm *l = NULL;
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = F; cfg.hidden_size = H; cfg.layers = 2; cfg.checkpoint = ckpt; cfg.max_steps = T; cfg.max_batch = B;
    size_t nx = (size_t)(B * T * F), no = (size_t)(B * T * H), ns = (size_t)(2 * B * H), nb = (size_t)(B * H);
    float *buf = (float *)calloc(3 * nx + 3 * no + 8 * ns + 3 * nb, sizeof(float));
    float *x = buf, *dx = x + nx, *out = dx + nx, *dout = out + no, *h0 = dout + no, *c0 = h0 + ns, *dh0 = c0 + ns;
    float *dc0 = dh0 + ns, *hn = dc0 + ns, *cn = hn + ns, *hl = cn + ns, *dhl = hl + nb;
    uint64_t h = 1469598103934665603ull;
    mb_result r = buf ? mb_device_open(&dev, &dc) : MB_ERR_OUT_OF_MEMORY;
    if (r == MB_OK) r = mb_params_create(&p, dev);
    if (r == MB_OK) r = mb_lstm_create(&l, p, &cfg);
    if (r == MB_OK) r = mb_params_finalize(p);
    if (r == MB_OK) r = mb_params_init(p, seed);
    if (r == MB_OK) {
        rng = seed;
        for (size_t i = 0; i < nx; i++) x[i] = unif(-1, 1);
        for (size_t i = 0; i < ns; i++) { h0[i] = unif(-0.5f, 0.5f); c0[i] = unif(-0.5f, 0.5f); }
        for (size_t i = 0; i < no; i++) dout[i] = unif(-1, 1);
        for (size_t i = 0; i < nb; i++) dhl[i] = unif(-1, 1);
        r = mb_lstm_forward(l, x, B, T, h0, c0, out, hl);
    }
    if (r == MB_OK) r = mb_lstm_final_state(l, hn, cn);
    if (r == MB_OK) r = mb_lstm_backward(l, dhl, dout, dx, dh0, dc0);
    if (r == MB_OK) r = mb_sync(dev, -1);
    if (r == MB_OK) {
        h = fnv(h, out, no * 4); h = fnv(h, hl, nb * 4); h = fnv(h, hn, ns * 4); h = fnv(h, cn, ns * 4);
        h = fnv(h, dx, nx * 4); h = fnv(h, dh0, ns * 4); h = fnv(h, dc0, ns * 4);
        h = fnv(h, mb_params_grad(p), mb_params_total(p) * 4);
    } else {
        fprintf(stderr, "error: %s\n", mb_last_error());
        h = 0;
    }
    mb_lstm_destroy(l);
    mb_params_destroy(p);
    mb_device_close(dev);
    free(buf);
    return h;
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 44;
    static const struct { mb_cpu_kernel k; const char *name; } ks[] = {
        {MB_CPU_KERNEL_C, "c"}, {MB_CPU_KERNEL_AVX2, "avx2"}, {MB_CPU_KERNEL_AVX512, "avx512"}};
    uint64_t first = 0;
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        mb_device_config dc;
        memset(&dc, 0, sizeof dc);
        dc.cpu_kernel = ks[i].k;
        mb_device *dev = NULL;
        if (mb_device_open(&dev, &dc) != MB_OK) continue; /* not on this CPU or platform */
        mb_device_close(dev);
        uint64_t h = run(ks[i].k, seed, 3, 37, 5, 19, -1);
        h ^= run(ks[i].k, seed + 1, 5, 64, 12, 40, 8) * 3;
        h ^= run(ks[i].k, seed + 2, 1, 200, 3, 33, 0) * 5;
        printf("lstm_bits: seed %llu kernel %s hash %016llx\n", (unsigned long long)seed, ks[i].name,
               (unsigned long long)h);
        if (!first) first = h;
        bad |= h != first;
    }
    if (!first) return 2;
    return bad;
}
