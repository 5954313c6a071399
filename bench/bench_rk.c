/* bench_rk: the CPU LSTM's recurrent product alone (issue 29): our kernel (mb__rk_product,
 * in chunks of rows as the layer calls it) against OpenBLAS's sgemm on the same product,
 * GFLOP/s on one thread, for the two products of one layer step at B, F, H:
 *   forward   C (B, 4H) = [x_t h_{t-1}] [W_ih W_hh]^T    K = F + H
 *   backward  C (B, H)  = dg W_hh                        K = 4H
 * Three cases a product, called in turn (the order reversed every other round):
 *   hot    ours, writing the same rows of C every call;
 *   fresh  ours, writing rows that are not in cache: each call the next part of a 64 MiB
 *          region (more than most L3 caches), touched once before timing, as the forward
 *          writes each step's gates under full storage (the backward's dh stays in cache);
 *   blas   cblas_sgemm on the same operands ([x h] side by side, [W_ih W_hh]), hot.
 * All buffers are device memory (mb_alloc), as the layer's.
 * Prints each case's best and median GFLOP/s, and the largest difference between our C and
 * OpenBLAS's relative to the largest |C| (both compute the same product, in other orders).
 * Read the rates against build/bench/peak_fma (this core's multiply-add peak).
 *   build/bench/bench_rk [B F H [rounds]]    defaults 128 128 256, 50 rounds
 * MB_LSTM_KERNEL=auto|avx512|avx2|c: our kernel variant, as for bench_lstm. Operands are
 * hashed values in [-0.5, 0.5); the device's denormal mode (flush-to-zero) holds for all. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mb_args.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: bench_rk [B F H [rounds]]\n"
    "The CPU LSTM's recurrent products alone: our kernel (into the same rows, and into rows\n"
    "out of cache) against OpenBLAS's sgemm, GFLOP/s on one thread, best and median of the\n"
    "rounds. Defaults 128 128 256, 50 rounds. MB_LSTM_KERNEL=auto|avx512|avx2|c picks our\n"
    "kernel. -h, --help: this text.\n";

enum { CASES = 3, FRESH_BYTES = 64 << 20 };
static const char *const case_names[CASES] = {"hot", "fresh", "blas"};

/* One product C (M, N) = A op(W) in both forms: A as two blocks of columns for ours ([x h]), one
 * matrix for BLAS. */
typedef struct product {
    const char *name;
    int64_t M, N, K1, K2;
    float *a1, *a2, *a;  /* ours: rows of a1 (K1) and a2 (K2); BLAS: a = [a1 a2] (M, K1 + K2) */
    float *w;            /* (N, K1 + K2) for the forward, (K1, N) for the backward (trans 0) */
    int trans;           /* mb__rk_pack's trans, and cblas's op(W) */
    float *packed, *c, *cb, *fresh;
    int64_t slots, chunk;
} product;

/* n floats of device memory: hashed values in [-0.5, 0.5) (seed), or zeros (seed 0). */
static float *dev_floats(mb_device *dev, int64_t n, uint32_t seed) {
    float *p = NULL;
    if (mb_alloc(dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)&p) != MB_OK) return NULL;
    for (int64_t i = 0; i < n; i++)
        p[i] = seed ? (float)(((uint32_t)i * 2654435761u + seed) % 1000u) / 1000.0f - 0.5f : 0.0f;
    return p;
}

/* Operands, the packed W and the outputs of one product; 0 on failure (out of memory). */
static int product_init(product *p, mb_device *dev, const mb__rk *k, int64_t B) {
    int64_t K = p->K1 + p->K2;
    p->M = B;
    p->slots = FRESH_BYTES / (B * p->N * (int64_t)sizeof(float));
    if (p->slots < 2) p->slots = 2;
    p->a1 = dev_floats(dev, B * p->K1, 1); p->a2 = p->K2 ? dev_floats(dev, B * p->K2, 2) : p->a1;
    p->a = dev_floats(dev, B * K, 0); p->w = dev_floats(dev, p->N * K, 3);
    p->packed = dev_floats(dev, (int64_t)mb__rk_packed_size(p->N, K), 0);
    p->c = dev_floats(dev, B * p->N, 0); p->cb = dev_floats(dev, B * p->N, 0);
    p->fresh = dev_floats(dev, p->slots * B * p->N, 0); /* its pages exist before timing */
    if (!p->a1 || !p->a2 || !p->a || !p->w || !p->packed || !p->c || !p->cb || !p->fresh) return 0;
    for (int64_t r = 0; r < B; r++) {
        memcpy(p->a + r * K, p->a1 + r * p->K1, (size_t)p->K1 * sizeof(float));
        if (p->K2) memcpy(p->a + r * K + p->K1, p->a2 + r * p->K2, (size_t)p->K2 * sizeof(float));
    }
    mb__rk_pack(k->nr, p->N, K, p->w, p->trans, K, 0, p->packed);
    p->chunk = mb__rec_chunk(k, B, K); /* the layer's rows a chunk */
    return 1;
}

static void product_free(product *p, mb_device *dev) {
    float *bufs[8] = {p->a1, p->a2 != p->a1 ? p->a2 : NULL, p->a, p->w, p->packed, p->c, p->cb, p->fresh};
    for (int i = 0; i < 8; i++) mb_free(dev, bufs[i]);
}

/* Ours into c, chunk by chunk, as the layer's rows call it. */
static void ours(const mb__rk *k, const product *p, float *c) {
    for (int64_t c0 = 0; c0 < p->M; c0 += p->chunk) {
        int64_t n = p->M - c0 < p->chunk ? p->M - c0 : p->chunk;
        mb__rk_a A = {p->a1 + c0 * p->K1, p->a2 + c0 * p->K2, p->K1, p->K2, p->K1, p->K2};
        mb__rk_product(k, n, p->N, &A, p->packed, c + c0 * p->N, p->N, 0);
    }
}

static void blas(const product *p) {
    int64_t K = p->K1 + p->K2;
    mb__gemm_job j = mb__gemm_job_of(0, p->trans, p->M, p->N, K, 1.0f, p->a, K, p->w, p->trans ? K : p->N, 0.0f, p->cb, p->N);
    j.w = j.n; /* one part: BLAS's product as it is */
    mb__gemm_part(&j, 0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* rounds of the three cases on p; prints one line. */
static void run(const mb__rk *k, product *p, int rounds, double *t) {
    double flop = 2.0 * (double)p->M * (double)p->N * (double)(p->K1 + p->K2);
    int64_t slot = 0;
    ours(k, p, p->c); blas(p); /* warm up */
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < CASES; i++) {
            int cs = r % 2 ? CASES - 1 - i : i;
            double t0 = mba_now();
            if (cs == 0) ours(k, p, p->c);
            else if (cs == 1) ours(k, p, p->fresh + (slot++ % p->slots) * p->M * p->N);
            else blas(p);
            t[cs * rounds + r] = mba_now() - t0;
        }
    double big = 0, diff = 0;
    for (int64_t i = 0; i < p->M * p->N; i++) {
        double b = fabs((double)p->cb[i]), d = fabs((double)p->c[i] - (double)p->cb[i]);
        big = b > big ? b : big; diff = d > diff ? d : diff;
    }
    printf("%-8s M=%lld N=%lld K=%lld (chunks of %lld rows):", p->name, (long long)p->M, (long long)p->N,
           (long long)(p->K1 + p->K2), (long long)p->chunk);
    for (int cs = 0; cs < CASES; cs++) {
        qsort(t + cs * rounds, (size_t)rounds, sizeof(double), cmp_double);
        const double *tc = t + cs * rounds; /* sorted: the best first, the median in the middle */
        printf("  %s %.1f / %.1f", case_names[cs], flop / tc[0] / 1e9, flop / tc[rounds / 2] / 1e9);
    }
    printf("  |ours-blas|/max %.1e\n", big > 0 ? diff / big : diff);
}

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    if (argc != 1 && argc != 4 && argc != 5) return mba_error("give B F H [rounds] (see --help)");
    int64_t B = 128, F = 128, H = 256;
    int rounds = 50;
    if (argc > 1 && !(mba_arg("B", argv[1], MBA_I64, &B, 1, 1e5, NULL) &&
                      mba_arg("F", argv[2], MBA_I64, &F, 1, 1e5, NULL) && mba_arg("H", argv[3], MBA_I64, &H, 1, 1e4, NULL)))
        return 2;
    if (argc > 4 && !mba_arg("rounds", argv[4], MBA_INT, &rounds, 1, 1e6, NULL)) return 2;
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MB_CPU; dc.threads = 1;
    if (mba_cpu_kernel(&dc.cpu_kernel)) return 2;
    mb_device *dev;
    if (mb_device_open(&dev, &dc) != MB_OK) return mba_error("%s", mb_last_error());
    const mb__rk *k = mb__rk_of(mb__cpu(dev)->kernel);
    product p[2] = {{.name = "forward", .N = 4 * H, .K1 = F, .K2 = H, .trans = 1},
                    {.name = "backward", .N = H, .K1 = 4 * H, .K2 = 0, .trans = 0}};
    double *t = (double *)malloc((size_t)(CASES * rounds) * sizeof(double));
    int ok = t != NULL;
    for (int i = 0; i < 2; i++) ok = product_init(&p[i], dev, k, B) && ok;
    if (ok) {
        printf("bench_rk: %s ftz=on; our kernel %s (%d x %d tile); B=%lld F=%lld H=%lld; %d rounds; GFLOP/s best / "
               "median\n", mb_device_name(dev), mb__rk_name(k), k->mr, k->nr, (long long)B, (long long)F, (long long)H,
               rounds);
        mb__fpenv e = mb__fp_enter(dev);
        for (int i = 0; i < 2; i++) run(k, &p[i], rounds, t);
        mb__fp_leave(e);
    } else
        fprintf(stderr, "error: out of memory\n");
    for (int i = 0; i < 2; i++) product_free(&p[i], dev);
    free(t);
    mb_device_close(dev);
    return ok ? 0 : 1;
}
