/* bench_lstm: one LSTM layer, forward+backward time per step and kept activation memory,
 * full storage vs checkpointed (the automatic interval, ceil(sqrt(T)) rounded up to 16: what
 * checkpoint = 0 takes when memory is short; with memory to spare it keeps full storage).
 *   build/bench/bench_lstm      [--no-ftz] [B T F H [iters [f32|bf16|f16 [threads]]]]   (CPU)
 *   build/bench/bench_lstm_cuda [B T F H [iters [f32|bf16|f16]]]             (GPU: nvcc, same source)
 * Defaults 128 480 128 256 1 f32, threads 0 (= the cores). Loss: the mean of h_last. Timings end with a device sync.
 * --no-ftz: the device keeps IEEE denormals (mb_device_config.keep_denormals = 1); by
 * default the library flushes them (ftz=on in the output). bench/compare_lstm.sh runs this
 * and the PyTorch peer alternately with the same setting.
 * MB_FUSED_BLOCKS=n: the LSTM's fused_blocks (GPU: -1 the per-step gemms, 1/2/4 the fused kernel
 * with that many blocks a row tile; default 0, the library's choice, printed as fused=).
 * MB_LSTM_KERNEL=auto|avx512|avx2|c (CPU): the LSTM's own kernels (mb_device_config.cpu_kernel)
 * instead of the widest this CPU runs (an error where it cannot); the device name says which
 * ran ("LSTM kernel ...").
 * Peer: python3 bench/pytorch/lstm.py with the same arguments (--device cuda --amp on a
 * GPU: fp16 autocast, cuDNN). */
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#define BACKEND MB_CUDA
#else
#include "megabatch.h"
#define BACKEND MB_CPU
#endif
#include "examples/mb_args.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: " MBA_TOOL("bench_lstm") " [--no-ftz] [B T F H [iters [f32|bf16|f16 [threads]]]]\n"
    "One LSTM layer: forward+backward time per step and kept activation memory, full storage\n"
    "against checkpointed (docs/BENCHMARKS.md). Defaults 128 480 128 256, 1 iteration, f32,\n"
    "threads 0 (the cores). --no-ftz: keep IEEE denormals. -h, --help: this text.\n";

/* A device buffer of n floats holding init(i). */
static float *dev_floats(mb_device *dev, int64_t n, float (*init)(int64_t, int64_t), int64_t arg) {
    float *h = (float *)malloc((size_t)n * sizeof(float)), *d = NULL;
    if (!h) return NULL;
    for (int64_t i = 0; i < n; i++) h[i] = init(i, arg);
    if (mb_alloc(dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)&d) != MB_OK ||
        mb_copy(dev, 0, d, h, (size_t)n * sizeof(float)) != MB_OK || mb_sync(dev, 0) != MB_OK)
        d = NULL;
    free(h);
    return d;
}
static float hashed(int64_t i, int64_t arg) { (void)arg; return (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f; }
static float mean_grad(int64_t i, int64_t n) { (void)i; return 1.0f / (float)n; }

static int fail(const char *what) {
    fprintf(stderr, "%s failed: %s\n", what, mb_last_error());
    return 1;
}

static int keep_denormals;

static int run(int64_t B, int64_t T, int64_t F, int64_t H, int ck, int iters, mb_dtype prec, int threads) {
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = BACKEND; dc.threads = threads; dc.keep_denormals = keep_denormals;
    if (BACKEND == MB_CPU && mba_cpu_kernel(&dc.cpu_kernel)) return 1;
    mb_lstm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_size = F; cfg.hidden_size = H; cfg.layers = 1; cfg.checkpoint = ck;
    cfg.max_steps = T; cfg.max_batch = B; cfg.precision = prec;
    cfg.fused_blocks = getenv("MB_FUSED_BLOCKS") ? atoi(getenv("MB_FUSED_BLOCKS")) : 0; /* GPU: force a path */
    if (mb_device_open(&dev, &dc) || mb_params_create(&p, dev) || mb_lstm_create(&l, p, &cfg) ||
        mb_params_finalize(p) || mb_params_init(p, 1))
        return fail("setup");
    float *x = dev_floats(dev, B * T * F, hashed, 0), *dl = dev_floats(dev, B * H, mean_grad, B * H);
    float *hl = dev_floats(dev, B * H, hashed, 0);
    if (!x || !dl || !hl) return fail("device buffers");
    double tf = 0, tb = 0;
    for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
        double t0 = mba_now();
        if (mb_lstm_forward(l, x, B, T, NULL, NULL, NULL, hl) || mb_sync(dev, -1)) return fail("forward");
        double t1 = mba_now();
        if (mb_lstm_backward(l, dl, NULL, NULL, NULL, NULL) || mb_sync(dev, -1)) return fail("backward");
        double t2 = mba_now();
        if (it) { tf += t1 - t0; tb += t2 - t1; }
    }
    size_t full, kept;
    mb_lstm_memory(&cfg, B, T, &full, &kept);
    printf("%s ftz=%s %s B=%lld T=%lld F=%lld H=%lld checkpoint=%-3lld fused=%d fwd %8.1f us/step  fwd+bwd %8.1f "
           "us/step  activations %.1f MiB\n", mb_device_name(dev), keep_denormals ? "off" : "on", mb_dtype_name(prec),
           (long long)B, (long long)T, (long long)F, (long long)H, (long long)mb_lstm_checkpoint_steps(l, T),
           mb_lstm_fused_blocks(l), 1e6 * tf / iters / (double)T,
           1e6 * (tf + tb) / iters / (double)T, (double)kept / 1048576.0);
    mb_free(dev, x); mb_free(dev, dl); mb_free(dev, hl);
    mb_lstm_destroy(l); mb_params_destroy(p); mb_device_close(dev);
    return 0;
}

int main(int argc, char **argv) {
    static const char *const precisions[] = {"f32", "bf16", "f16", NULL};
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    if (argc > 1 && !strcmp(argv[1], "--no-ftz")) { keep_denormals = 1; argv[1] = argv[0]; argv++; argc--; }
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    if (argc != 1 && (argc < 5 || argc > 8)) return mba_error("give B T F H [iters [f32|bf16|f16 [threads]]] (see --help)");
    int64_t B = 128, T = 480, F = 128, H = 256;
    int iters = 1, threads = 0, pi = 0;
    if (argc > 1 && !(mba_arg("B", argv[1], MBA_I64, &B, 1, 1e6, NULL) && mba_arg("T", argv[2], MBA_I64, &T, 1, 1e7, NULL) &&
                      mba_arg("F", argv[3], MBA_I64, &F, 1, 1e6, NULL) && mba_arg("H", argv[4], MBA_I64, &H, 1, 1e6, NULL)))
        return 2;
    if (argc > 5 && !mba_arg("iters", argv[5], MBA_INT, &iters, 1, 1e6, NULL)) return 2;
    if (argc > 6 && !mba_arg("precision", argv[6], MBA_CHOICE, &pi, 0, 0, precisions)) return 2;
    if (argc > 7 && !mba_arg("threads", argv[7], MBA_INT, &threads, 0, 1024, NULL)) return 2;
    mb_dtype prec = pi == 1 ? MB_BF16 : pi == 2 ? MB_F16 : MB_F32;
    return run(B, T, F, H, -1, iters, prec, threads) || run(B, T, F, H, (int)mb__lstm_auto_k(T, 16), iters, prec, threads);
}
