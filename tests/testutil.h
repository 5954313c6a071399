/* testutil.h - helpers shared by the cmocka tests (include after megabatch.h).
 *
 * Random inputs are fresh each run: the seed comes from MB_TEST_SEED or the clock and
 * is printed, so a failure can be replayed with MB_TEST_SEED=<seed>. */
#ifndef MB_TESTUTIL_H
#define MB_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <pthread.h>
#ifdef __cplusplus
extern "C" {
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif

static uint64_t tu_rng_state;

static inline uint64_t tu_seed(void) {
    static int done;
    if (!done) {
        const char *s = getenv("MB_TEST_SEED");
        tu_rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
        printf("MB_TEST_SEED=%llu\n", (unsigned long long)tu_rng_state);
        done = 1;
    }
    return tu_rng_state;
}

/* "dir/name" in one of 16 rotating static buffers: file paths in a test's temporary directory
 * (up to 16 of them alive at once, e.g. in one command line). */
static inline const char *tu_path(const char *dir, const char *name) {
    static char buf[16][256];
    static int i;
    i = (i + 1) % 16;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

/* A whole file into memory (malloc'd, one byte more than *n); fails the test if it cannot. */
static inline unsigned char *tu_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = (unsigned char *)malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* splitmix64: the tests' own generator (independent of the library's RNG). */
static inline uint64_t tu_next(void) {
    tu_seed();
    uint64_t z = (tu_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float tu_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((tu_next() >> 40) * (1.0 / 16777216.0));
}
static inline int tu_int(int lo, int hi) { return lo + (int)(tu_next() % (uint64_t)(hi - lo + 1)); }
static inline void tu_fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = tu_uniform(lo, hi);
}
static inline float *tu_alloc_f32(size_t n) {
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

/* Every element within atol + rtol*|ref|; non-finite values are never skipped: a NaN or
 * Inf in either array where the other is not identical fails. Returns the max error. */
static inline double tu_assert_close(const float *got, const float *ref, size_t n, double atol, double rtol,
                                     const char *what) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) || !isfinite(r)) {
            if (memcmp(&got[i], &ref[i], sizeof(float)) != 0 && !(isnan(g) && isnan(r))) {
                fail_msg("%s: element %zu: got %g, want %g (non-finite)", what, i, g, r);
            }
            continue;
        }
        double err = fabs(g - r);
        if (err > atol + rtol * fabs(r)) fail_msg("%s: element %zu: got %.9g, want %.9g (err %.3g)", what, i, g, r, err);
        if (err > worst) worst = err;
    }
    return worst;
}

/* ||got - ref|| / max(||ref||, rms_min * sqrt(n)): the reference's rms counted as at least
 * rms_min (0: as it is), for outputs that may cancel to near zero, whose rounding error is
 * set by their terms, not by themselves. An all-zero reference with rms_min 0 gives the
 * absolute ||got - ref||. Fails on any non-finite value. */
static inline double tu_rel_norm_err_floor(const float *got, const float *ref, size_t n, double rms_min) {
    double num = 0, den = 0, den_min = rms_min * rms_min * (double)n;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) fail_msg("element %zu non-finite: got %g ref %g", i, got[i], ref[i]);
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den < den_min) den = den_min;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ||got - ref|| / ||ref|| (fails on any non-finite value). */
static inline double tu_rel_norm_err(const float *got, const float *ref, size_t n) {
    return tu_rel_norm_err_floor(got, ref, n, 0);
}

/* Assert a call failed with `code` and its message contains `needle`. */
#define tu_assert_error(call, code, needle)                                                        \
    do {                                                                                           \
        mb_clear_error();                                                                          \
        mb_result tu_r_ = (call);                                                                  \
        if (tu_r_ != (code))                                                                       \
            fail_msg("%s returned %d (%s), want %d; message: %s", #call, (int)tu_r_,               \
                     mb_result_string(tu_r_), (int)(code), mb_last_error());                       \
        if (!strstr(mb_last_error(), (needle)))                                                    \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #call, mb_last_error(), (needle));         \
    } while (0)

#define tu_ok(call)                                                                                \
    do {                                                                                           \
        mb_result tu_r_ = (call);                                                                  \
        if (tu_r_ != MB_OK) fail_msg("%s failed: %s: %s", #call, mb_result_string(tu_r_), mb_last_error()); \
    } while (0)

/* The CPU device with its defaults. */
static inline mb_device *tu_open_cpu(void) {
    mb_device *dev;
    tu_ok(mb_device_open(&dev, NULL));
    return dev;
}

/* Close a device after checking that nothing allocated on it is still live. */
static inline void tu_close_checked(mb_device *dev) {
    mb_mem_stats s = mb_device_mem_stats(dev);
    for (int k = 0; k < MB_MEM_KINDS; k++) assert_int_equal(s.live[k], 0);
    mb_device_close(dev);
}

/* Two epochs of a loader's batches into out, features then targets, batch after batch, each
 * copied on the compute stream into a device buffer as a training step would read it, with no
 * host sync before the end: the loader itself must order a chunk's reload after the reads queued
 * on compute (then closes the loader and its dataset). row: feature elements per sample, k:
 * targets per sample, in the loader's dtype (es bytes each). Returns the bytes written (at most
 * cap). */
static inline size_t tu_drain_two_epochs(mb_device *dev, mb_loader *ld, mb_dataset *ds, size_t row, size_t k,
                                         size_t es, char *out, size_t cap) {
    size_t used = 0;
    char *d = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, cap, (void **)&d));
    mb_batch b;
    for (int e = 0; e < 2;) {
        tu_ok(mb_loader_next(ld, &b));
        if (b.end_of_epoch) { e++; continue; }
        size_t nf = (size_t)b.count * row * es, nk = (size_t)b.count * k * es;
        assert_true(used + nf + nk <= cap);
        tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, d + used, b.features, nf));
        tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, d + used + nf, b.targets, nk));
        used += nf + nk;
    }
    tu_ok(mb_copy(dev, MB_STREAM_COMPUTE, out, d, used));
    tu_ok(mb_sync(dev, MB_STREAM_COMPUTE));
    mb_free(dev, d);
    mb_loader_close(ld);
    mb_dataset_close(ds);
    return used;
}

#ifdef MEGABATCH_CUDA
/* ---- the CUDA test fixture ----
 * Every CUDA test runs as tu_cuda_test(fn), so that a failing test (cmocka leaves it at the failed
 * assertion) leaves the device usable and one failure never hides the others. The teardown puts
 * the thread back in the global capture mode; ends the captures left open on the streams the
 * test holds (and on the streams of the devices it holds, through mb_graph_end too), dropping
 * their graphs; drains the device; fails the test when the device has a sticky error
 * (tu_cuda_sticky_expected() says that this one meant to make it); and releases what the test
 * holds: streams, events, memory, cuBLAS handles, graphs (tu_hold, or the tu_cuda_* helpers), and
 * devices from tu_open_cuda_or_skip (close them with tu_device_close; a device the test did not
 * close is left open: a loader of the failed test may still use it). Under the simulator a capture
 * that fails is an error unless the test called tu_cuda_capture_errors_expected(). */
typedef enum { TU_DEVICE, TU_STREAM, TU_EVENT, TU_DEVMEM, TU_PINNED, TU_CUBLAS, TU_GRAPH, TU_EXEC } tu_kind;
enum { TU_HELD_MAX = 256 };
static struct tu_held_item { tu_kind kind; void *p; } tu_held[TU_HELD_MAX];
static int tu_nheld, tu_sticky_ok;

/* The fixture releases p (of that kind) after the test, unless tu_let_go(p) came first. */
static inline void *tu_hold(tu_kind kind, void *p) {
    if (tu_nheld == TU_HELD_MAX) fail_msg("tu_hold: more than %d things held", TU_HELD_MAX);
    tu_held[tu_nheld].kind = kind;
    tu_held[tu_nheld++].p = p;
    return p;
}
static inline void tu_let_go(void *p) {
    for (int i = tu_nheld - 1; i >= 0; i--)
        if (tu_held[i].p == p) {
            tu_held[i] = tu_held[--tu_nheld];
            return;
        }
}
static inline void tu_device_close(mb_device *dev) {
    tu_let_go(dev);
    mb_device_close(dev);
}
static inline void tu_cuda_sticky_expected(void) { tu_sticky_ok = 1; }
static inline void tu_cuda_capture_errors_expected(void) { /* this test makes captures fail on purpose */
#ifdef CUDASIM
    cudasim::expect_capture_errors(true);
#endif
}
static inline cudaStream_t tu_cuda_stream(void) {
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    return (cudaStream_t)tu_hold(TU_STREAM, s);
}
static inline cudaEvent_t tu_cuda_event(void) {
    cudaEvent_t e = NULL;
    assert_int_equal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    return (cudaEvent_t)tu_hold(TU_EVENT, e);
}
static inline void *tu_cuda_malloc(size_t bytes) { /* zeroed */
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
    assert_int_equal(cudaMemset(p, 0, bytes), cudaSuccess);
    return tu_hold(TU_DEVMEM, p);
}

/* End a capture left open on s (any error: cleared). 1 when there was one. */
static inline int tu_end_capture(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess || st == cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return 0;
    }
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    return 1;
}

static inline int tu_cuda_setup(void **state) {
    (void)state;
    tu_nheld = 0;
    tu_sticky_ok = 0;
    return 0;
}

static inline int tu_cuda_teardown(void **state) {
    (void)state;
    int ok = 1, open = 0, gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) { /* no GPU: the test skipped, nothing to do */
        cudaGetLastError();
        tu_nheld = 0;
        return 0;
    }
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    cudaThreadExchangeStreamCaptureMode(&mode);
#ifdef CUDASIM
    cudasim::expect_capture_errors(true); /* ending what a failed test left is no error */
#endif
    for (int i = 0; i < tu_nheld; i++) {
        if (tu_held[i].kind == TU_STREAM) open += tu_end_capture((cudaStream_t)tu_held[i].p);
        if (tu_held[i].kind != TU_DEVICE) continue;
        mb_device *dev = (mb_device *)tu_held[i].p;
        mb_graph *g = NULL;
        if (mb_graph_end(dev, &g) != MB_ERR_STATE) open++; /* a capture of mb_graph_begin */
        mb_graph_destroy(g);
        for (int k = 0; k < mb_device_streams(dev); k++) open += tu_end_capture(mb_cuda_stream(dev, k));
    }
    mb_clear_error();
#ifdef CUDASIM
    cudasim::expect_capture_errors(false); /* the next test expects none, unless it says so */
#endif
    if (open) printf("tu_cuda_teardown: ended %d capture(s) the test left open\n", open);
    cudaError_t e = cudaDeviceSynchronize();
    cudaGetLastError();
    cudaError_t sticky = cudaGetLastError(); /* still there after it was read: it sticks */
    if (sticky != cudaSuccess && !tu_sticky_ok) {
        printf("tu_cuda_teardown: the device has a sticky error: %s (%s); the tests after this one cannot "
               "use it\n", cudaGetErrorName(sticky), cudaGetErrorString(sticky));
        ok = 0;
    }
    (void)e;
    for (int i = tu_nheld - 1; i >= 0; i--) {
        void *p = tu_held[i].p;
        switch (tu_held[i].kind) {
        case TU_EXEC: cudaGraphExecDestroy((cudaGraphExec_t)p); break;
        case TU_GRAPH: cudaGraphDestroy((cudaGraph_t)p); break;
        case TU_CUBLAS: cublasDestroy((cublasHandle_t)p); break;
        case TU_EVENT: cudaEventDestroy((cudaEvent_t)p); break;
        case TU_STREAM: cudaStreamDestroy((cudaStream_t)p); break;
        case TU_DEVMEM: cudaFree(p); break;
        case TU_PINNED: cudaFreeHost(p); break;
        case TU_DEVICE: break; /* not closed by the test: left open (see above) */
        }
    }
    tu_nheld = 0;
    cudaGetLastError();
    return ok ? 0 : -1;
}
#define tu_cuda_test(f) cmocka_unit_test_setup_teardown(f, tu_cuda_setup, tu_cuda_teardown)

/* Open the GPU (4 streams) or skip the calling test, after checking that a machine
 * without one gives MB_ERR_NO_DEVICE with a message naming CUDA. The fixture holds it. */
static inline mb_device *tu_open_cuda_or_skip(int tf32) {
    mb_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = MB_CUDA;
    cfg.streams = 4;
    cfg.tf32 = tf32;
    mb_device *dev = NULL;
    mb_result r = mb_device_open(&dev, &cfg);
    if (r == MB_ERR_NO_DEVICE) {
        assert_null(dev);
        assert_non_null(strstr(mb_last_error(), "CUDA"));
        skip();
    }
    if (r != MB_OK) fail_msg("mb_device_open(MB_CUDA): %s", mb_last_error());
    return (mb_device *)tu_hold(TU_DEVICE, dev);
}
#endif

#endif
