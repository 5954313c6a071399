/* megabatch_cuda.cuh - the CUDA backend of megabatch (CUDA runtime + cuBLAS).
 *
 *   #define MEGABATCH_IMPLEMENTATION   // in exactly one translation unit
 *   #include "megabatch_cuda.cuh"      // compiled by nvcc; includes megabatch.h
 *
 * Everything in megabatch.h works unchanged; mb_device_open with MB_CUDA now opens a
 * GPU. Link with -lcublas (nvcc links the CUDA runtime itself).
 *
 * License: MIT (see LICENSE).
 */
#ifndef MEGABATCH_CUDA_CUH
#define MEGABATCH_CUDA_CUH

#ifndef __CUDACC__
#error "megabatch_cuda.cuh must be compiled by nvcc (CUDA C++)"
#endif

#define MEGABATCH_CUDA 1
#include "megabatch.h"

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- cuda core ----
// MB_CUDA_TRY(dev, call): a failed CUDA runtime or cuBLAS call becomes a returned
// MB_ERR_CUDA (or MB_ERR_OUT_OF_MEMORY) with the call, file, line and the CUDA message,
// logged through dev's logger. Usable in any function returning mb_result.
// MB__RUN / MB__RUN_N: every kernel launch of the backend (through MB_LAUNCH).

#ifdef __cplusplus
extern "C" {
#endif
/* The CUDA stream of a device stream index, for user kernels beside megabatch's. */
MBDEF cudaStream_t mb_cuda_stream(const mb_device *dev, int stream);
/* The compute stream's cuBLAS handle (a cublasHandle_t) as void*, for user gemms beside
 * megabatch's; NULL for a CPU device. Every stream has its own handle, bound to it at open. */
MBDEF void *mb_device_cublas(const mb_device *dev);
#ifdef __cplusplus
}
#endif

#endif /* MEGABATCH_CUDA_CUH */

#ifdef MEGABATCH_IMPLEMENTATION
#ifndef MEGABATCH_CUDA_IMPLEMENTATION_INCLUDED
#define MEGABATCH_CUDA_IMPLEMENTATION_INCLUDED

static const char *mb__cublas_string(cublasStatus_t s) {
#if CUDART_VERSION >= 11040
    return cublasGetStatusString(s);
#else
    (void)s;
    return "cuBLAS error";
#endif
}

static mb_result mb__cuda_fail(mb_device *dev, cudaError_t e, const char *call, const char *file, int line) {
    cudaGetLastError(); /* clear a sticky-free error so a retry (smaller request) can succeed */
    mb_result r = e == cudaErrorMemoryAllocation ? MB_ERR_OUT_OF_MEMORY
                  : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? MB_ERR_NO_DEVICE : MB_ERR_CUDA;
    return mb__fail(dev ? &dev->cfg.log : NULL, r, file, line, "%s failed: %s (%s) at %s:%d", call,
                    cudaGetErrorString(e), cudaGetErrorName(e), file, line);
}
static mb_result mb__cublas_fail(mb_device *dev, cublasStatus_t s, const char *call, const char *file, int line) {
    mb_result r = s == CUBLAS_STATUS_ALLOC_FAILED ? MB_ERR_OUT_OF_MEMORY : MB_ERR_CUDA;
    return mb__fail(dev ? &dev->cfg.log : NULL, r, file, line, "%s failed: %s (cuBLAS status %d) at %s:%d", call,
                    mb__cublas_string(s), (int)s, file, line);
}
static inline mb_result mb__cuda_check(mb_device *dev, cudaError_t e, const char *call, const char *file, int line) {
    return e == cudaSuccess ? MB_OK : mb__cuda_fail(dev, e, call, file, line);
}
static inline mb_result mb__cuda_check(mb_device *dev, cublasStatus_t s, const char *call, const char *file, int line) {
    return s == CUBLAS_STATUS_SUCCESS ? MB_OK : mb__cublas_fail(dev, s, call, file, line);
}
#define MB_CUDA_TRY(dev, expr) MB_TRY(mb__cuda_check((dev), (expr), #expr, __FILE__, __LINE__))

/* Every kernel launch: MB_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...). A CPU
 * executor of this source (tests/cudasim) defines its own before including this header. */
#ifndef MB_LAUNCH
#define MB_LAUNCH(k, grid, block, smem, stream) k<<<grid, block, smem, stream>>>
#endif
/* A kernel's dynamic shared memory (the launch's smem bytes): MB_DYNAMIC_SHARED(float, sh);
 * the simulator defines its own (`extern __shared__` cannot be spelled in plain C++). Above 48 KB
 * the kernel needs cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes). */
#ifndef MB_DYNAMIC_SHARED
#define MB_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

/* The CUDA backend's private state (dev->ctx): per stream, its CUDA stream, an event for
 * mb_stream_wait, and a cuBLAS handle bound to it once (concurrent gemms never share a
 * workspace, and a capture sees no stream switch); the GPU's ordinal. */
typedef struct mb__cuda_ctx {
    cudaStream_t stream[MB_MAX_STREAMS];
    cudaEvent_t event[MB_MAX_STREAMS];
    cublasHandle_t blas[MB_MAX_STREAMS];
    int index;
} mb__cuda_ctx;

static inline mb__cuda_ctx *mb__cu(const mb_device *dev) { return (mb__cuda_ctx *)dev->ctx; }
static inline cudaStream_t mb__st(const mb_device *dev, int stream) { return mb__cu(dev)->stream[stream]; }

/* The launch error of the kernel just launched (e.g. a bad configuration), as a result. */
static mb_result mb__launched(mb_device *dev, const char *kernel, const char *file, int line) {
    return mb__cuda_check(dev, cudaGetLastError(), kernel, file, line);
}

/* The one launch wrapper: MB__RUN(dev, stream, kernel, grid, block, args...) launches through
 * MB_LAUNCH on a device stream index and evaluates to the launch's mb_result, so a backend
 * operation is `return MB__RUN(...);`. MB__RUN_N(dev, stream, kernel, n, args...) is the same
 * for a grid-stride kernel over n elements (256 threads a block). */
#define MB__RUN(dev, stream, k, grid, block, ...) \
    (MB_LAUNCH(k, grid, block, 0, mb__st((dev), (stream)))(__VA_ARGS__), mb__launched((dev), #k, __FILE__, __LINE__))
#define MB__RUN_N(dev, stream, k, n, ...) MB__RUN(dev, stream, k, mb__grid((size_t)(n), 256), 256, __VA_ARGS__)

MBDEF cudaStream_t mb_cuda_stream(const mb_device *dev, int stream) {
    return (cudaStream_t)mb_device_stream(dev, stream);
}
MBDEF void *mb_device_cublas(const mb_device *dev) {
    return dev->be == mb__cuda_backend() ? (void *)mb__cu(dev)->blas[MB_STREAM_COMPUTE] : NULL;
}

/* Grid size for a grid-stride loop over n elements. */
static inline unsigned mb__grid(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 65535u * 8u ? 65535u * 8u : g);
}
/* The same for a kernel whose blocks end in a barrier (a block reduction): at most
 * MB__NORM_BLOCKS blocks, the loop covering the rest (the simulator runs such a block as 256
 * fibers, so a grid of n / 256 made large n slow there; a GPU is as fast with 1024). */
static inline unsigned mb__grid_barrier(size_t n, unsigned block) {
    unsigned g = mb__grid(n, block);
    return g < MB__NORM_BLOCKS ? g : MB__NORM_BLOCKS;
}

// ---- cuda device ----

static void mb__cuda_close(mb_device *dev);
static mb_result mb__cuda_set_tf32(mb_device *dev, int on);

static mb_result mb__cuda_open(mb_device *dev) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return MB_FAIL(&dev->cfg.log, MB_ERR_NO_DEVICE, "mb_device_open: no usable CUDA GPU: %s (%s)",
                       cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (dev->cfg.index >= count)
        return MB_FAIL(&dev->cfg.log, MB_ERR_NO_DEVICE, "mb_device_open: GPU %d requested, %d present",
                       dev->cfg.index, count);
    MB_CUDA_TRY(dev, cudaSetDevice(dev->cfg.index));
    cudaDeviceProp prop;
    MB_CUDA_TRY(dev, cudaGetDeviceProperties(&prop, dev->cfg.index));
    snprintf(dev->name, sizeof dev->name, "%.200s (sm_%d%d, %zu MiB)", prop.name, prop.major, prop.minor,
             prop.totalGlobalMem >> 20);
    mb__cuda_ctx *cx = (mb__cuda_ctx *)mb__host_calloc(1, sizeof *cx);
    if (!cx) return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_device_open: no host memory");
    cx->index = dev->cfg.index;
    dev->ctx = cx;
    mb_result r = MB_OK;
    for (int i = 0; i < dev->streams && r == MB_OK; i++) {
        r = mb__cuda_check(dev, cudaStreamCreateWithFlags(&cx->stream[i], cudaStreamNonBlocking), "cudaStreamCreate",
                           __FILE__, __LINE__);
        if (r == MB_OK)
            r = mb__cuda_check(dev, cudaEventCreateWithFlags(&cx->event[i], cudaEventDisableTiming), "cudaEventCreate",
                               __FILE__, __LINE__);
    }
    for (int i = 0; i < dev->streams && r == MB_OK; i++) { /* one handle per stream */
        r = mb__cuda_check(dev, cublasCreate(&cx->blas[i]), "cublasCreate", __FILE__, __LINE__);
        if (r == MB_OK) r = mb__cuda_check(dev, cublasSetStream(cx->blas[i], cx->stream[i]), "cublasSetStream", __FILE__, __LINE__);
    }
    if (r == MB_OK) r = mb__cuda_set_tf32(dev, dev->tf32);
    if (r != MB_OK) mb__cuda_close(dev);
    return r;
}

static void mb__cuda_close(mb_device *dev) {
    mb__cuda_ctx *cx = mb__cu(dev);
    if (!cx) return;
    cudaSetDevice(cx->index);
    cudaDeviceSynchronize();
    for (int i = 0; i < dev->streams; i++) {
        if (cx->blas[i]) cublasDestroy(cx->blas[i]);
        if (cx->event[i]) cudaEventDestroy(cx->event[i]);
        if (cx->stream[i]) cudaStreamDestroy(cx->stream[i]);
    }
    MB_FREE(cx);
    dev->ctx = NULL;
    cudaGetLastError();
}

static mb_result mb__cuda_set_tf32(mb_device *dev, int on) {
    for (int i = 0; i < dev->streams; i++)
        MB_CUDA_TRY(dev, cublasSetMathMode(mb__cu(dev)->blas[i],
                                      on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return MB_OK;
}

static mb_result mb__cuda_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    MB_CUDA_TRY(dev, cudaSetDevice(mb__cu(dev)->index));
    MB_CUDA_TRY(dev, cudaMemGetInfo(free_bytes, total));
    return MB_OK;
}

static mb_result mb__cuda_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out) {
    size_t b = bytes ? bytes : 1;
    cudaError_t e;
    if (kind == MB_MEM_HOST) {
        *out = MB_MALLOC(b);
        if (*out) return MB_OK;
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: host allocation of %zu bytes failed", bytes);
    }
    e = kind == MB_MEM_PINNED ? cudaMallocHost(out, b) : cudaMalloc(out, b);
    if (e == cudaSuccess) return MB_OK;
    *out = NULL;
    cudaGetLastError(); /* an OOM must not poison the next, smaller request */
    return MB_FAIL(&dev->cfg.log, e == cudaErrorMemoryAllocation ? MB_ERR_OUT_OF_MEMORY : MB_ERR_CUDA,
                   "mb_alloc: %s of %zu bytes failed: %s", kind == MB_MEM_PINNED ? "cudaMallocHost" : "cudaMalloc",
                   bytes, cudaGetErrorString(e));
}

static void mb__cuda_dealloc(mb_device *dev, mb_mem_kind kind, void *ptr) {
    (void)dev;
    if (kind == MB_MEM_HOST) MB_FREE(ptr);
    else if (kind == MB_MEM_PINNED) cudaFreeHost(ptr);
    else cudaFree(ptr);
}

static mb_result mb__cuda_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes) {
    MB_CUDA_TRY(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, mb__st(dev, stream)));
    return MB_OK;
}

static mb_result mb__cuda_copy_2d(mb_device *dev, int stream, void *dst, size_t dpitch, const void *src,
                                  size_t spitch, size_t width, size_t rows) {
    MB_CUDA_TRY(dev, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, mb__st(dev, stream)));
    return MB_OK;
}

static mb_result mb__cuda_zero(mb_device *dev, int stream, void *dst, size_t bytes) {
    MB_CUDA_TRY(dev, cudaMemsetAsync(dst, 0, bytes, mb__st(dev, stream)));
    return MB_OK;
}

static mb_result mb__cuda_stream_wait(mb_device *dev, int waiter, int waited) {
    cudaEvent_t ev = mb__cu(dev)->event[waited];
    MB_CUDA_TRY(dev, cudaEventRecord(ev, mb__st(dev, waited)));
    MB_CUDA_TRY(dev, cudaStreamWaitEvent(mb__st(dev, waiter), ev, 0));
    return MB_OK;
}

static mb_result mb__cuda_sync(mb_device *dev, int stream) {
    if (stream < 0) MB_CUDA_TRY(dev, cudaDeviceSynchronize());
    else MB_CUDA_TRY(dev, cudaStreamSynchronize(mb__st(dev, stream)));
    return MB_OK;
}

__global__ void mb__k_convert(void *dst, mb_dtype dt, const void *src, mb_dtype st, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        mb__store(dst, dt, i, mb__load(src, st, i));
}

static mb_result mb__cuda_convert(mb_device *dev, int stream, void *dst, mb_dtype dt, const void *src, mb_dtype st,
                                  size_t n) {
    return MB__RUN_N(dev, stream, mb__k_convert, n, dst, dt, src, st, n);
}

/* The loader's reader thread issues copies on this device's streams: make it current there. */
static void mb__cuda_thread_init(mb_device *dev) {
    cudaSetDevice(mb__cu(dev)->index);
    cudaGetLastError();
}

static void *mb__cuda_native_stream(const mb_device *dev, int stream) { return (void *)mb__st(dev, stream); }

static const mb__runtime_ops mb__cuda_runtime_ops = {
    .open = mb__cuda_open, .close = mb__cuda_close, .memory = mb__cuda_memory, .set_tf32 = mb__cuda_set_tf32,
    .alloc = mb__cuda_alloc, .dealloc = mb__cuda_dealloc, .copy = mb__cuda_copy, .copy_2d = mb__cuda_copy_2d,
    .zero = mb__cuda_zero, .convert = mb__cuda_convert, .stream_wait = mb__cuda_stream_wait, .sync = mb__cuda_sync,
    .thread_init = mb__cuda_thread_init, .native_stream = mb__cuda_native_stream,
};

// ---- cuda gemm ----
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands
// and hand cuBLAS the same buffers.

static cudaDataType_t mb__cuda_type(mb_dtype t) {
    return t == MB_F32 ? CUDA_R_32F : t == MB_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

static mb_result mb__cuda_gemm(mb_device *dev, const mb_gemm_args *g) {
    cublasHandle_t h = mb__cu(dev)->blas[g->stream]; /* bound to g->stream at open */
    if (g->m == 0 || g->n == 0) return MB_OK;
    cublasComputeType_t ct = (g->ab_type == MB_F32 && dev->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    float alpha = g->k == 0 ? 0.0f : g->alpha;
    int64_t batch = g->batch > 1 ? g->batch : 1;
    /* k = 0: cuBLAS requires lda >= 1 rows; use k = 1 with alpha = 0 against a valid pointer
     * (the operands are not read when alpha is 0). */
    int k = g->k == 0 ? 1 : (int)g->k;
    const void *a = g->k == 0 ? g->c : g->a, *b = g->k == 0 ? g->c : g->b;
    int lda = g->k == 0 ? (int)(g->trans_a ? g->m : 1) : (int)g->lda;
    int ldb = g->k == 0 ? (int)(g->trans_b ? 1 : g->n) : (int)g->ldb;
    mb_dtype abt = g->k == 0 ? g->c_type : g->ab_type;
    MB_CUDA_TRY(dev, cublasGemmStridedBatchedEx(
        h, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)g->m, k,
        &alpha, b, mb__cuda_type(abt), ldb, g->stride_b, a, mb__cuda_type(abt), lda, g->stride_a, &g->beta, g->c,
        mb__cuda_type(g->c_type), (int)g->ldc, g->stride_c, (int)batch, ct, CUBLAS_GEMM_DEFAULT));
    return MB_OK;
}

static const mb__gemm_ops mb__cuda_gemm_ops = {.run = mb__cuda_gemm};

// ---- cuda params ----

__global__ void mb__k_fill_uniform(float *dst, size_t n, uint64_t seed, uint64_t stream, float bound) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = mb_rng_symmetric(seed, stream, i, bound);
}

static mb_result mb__cuda_fill_uniform(mb_device *dev, float *dst, size_t n, uint64_t seed, uint64_t stream,
                                       float bound) {
    if (n == 0) return MB_OK;
    return MB__RUN_N(dev, MB_STREAM_COMPUTE, mb__k_fill_uniform, n, dst, n, seed, stream, bound);
}

static const mb__params_ops mb__cuda_params_ops = {.fill_uniform = mb__cuda_fill_uniform};

// ---- cuda dataset ----

// ---- cuda end dataset ----

// ---- cuda loader ----

// ---- cuda end loader ----

// ---- cuda series ----
// The series gather (megabatch.h, "the gather operation"): one thread per es-byte element
// of the batch's windows, then of its targets; mb__gather_row is the CPU loop's index math.

template <typename E>
__device__ void mb__series_gather_elems(const mb__gather &g) {
    size_t rw = g.row / sizeof(E), tw = g.trow / sizeof(E), nf = (size_t)(g.count * g.t) * rw;
    size_t n = nf + (size_t)g.count * tw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (i < nf) {
            size_t row = i / rw;
            const E *src = (const E *)mb__gather_row(&g, (int64_t)(row / (size_t)g.t), (int64_t)(row % (size_t)g.t));
            ((E *)g.dst_f)[i] = src[i % rw];
        } else {
            size_t j = i - nf, b = j / tw;
            ((E *)g.dst_t)[j] = ((const E *)(g.targ + (size_t)g.idx[b] * g.trow))[j % tw];
        }
    }
}

#ifdef CUDASIM /* the simulator checks these pointers at each launch, as it checks pointer arguments */
CUDASIM_ARG_POINTERS(mb__gather, g, v) {
    for (int s = 0; s < g.segments; s++) v(g.bars[s], "bars[]");
    v(g.ends, "ends");
    v(g.idx, "idx");
    v(g.targ, "targ");
    v(g.dst_f, "dst_f");
    v(g.dst_t, "dst_t");
}
#endif
__global__ void mb__k_series_gather(mb__gather g) {
    if (g.es == 4) mb__series_gather_elems<uint32_t>(g);
    else mb__series_gather_elems<uint16_t>(g);
}

static mb_result mb__cuda_series_gather(mb_device *dev, int stream, const mb__gather *g) {
    size_t n = (size_t)g->count * ((size_t)g->t * g->row + g->trow) / (size_t)g->es;
    return MB__RUN_N(dev, stream, mb__k_series_gather, n, *g);
}
static const mb__series_ops mb__cuda_series_ops = {.gather = mb__cuda_series_gather};

// ---- cuda end series ----

// ---- cuda lstm ----
// The lstm group on the GPU. The per-step path's elementwise kernels: fused gates (forward),
// gate gradients (backward), the strided row copy (batch-major <-> time-major), add and fill
// (the math is mb__lstm_cell_fwd/bwd from megabatch.h, shared with the CPU; the gemms go
// through mb_gemm, cuBLAS). Then the fused recurrence (its types, kernels and host side), the
// choice between it (1, 2 or 4 blocks a row tile) and the per-step path, with its latency
// constants, and the group's recurrence operations, which run the choice (mb__cuda_lstm_ops).

__global__ void mb__k_lstm_fwd_gates(int64_t B, int64_t H, float *g, const float *b_ih, const float *b_hh,
                                     const float *c_prev, float *c, float *h) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < B * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        mb__lstm_cell_fwd(g + b * 4 * H, H, j, b_ih[j] + b_hh[j], b_ih[H + j] + b_hh[H + j],
                          b_ih[2 * H + j] + b_hh[2 * H + j], b_ih[3 * H + j] + b_hh[3 * H + j], c_prev[e], &c[e], &h[e]);
    }
}

__global__ void mb__k_lstm_bwd_gates(int64_t B, int64_t H, const float *a, const float *c_prev, const float *c,
                                     const float *dh_rec, const float *dout, float *dc, float *dg) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < B * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        float dh = dh_rec[e] + (dout ? dout[e] : 0.0f);
        mb__lstm_cell_bwd(a + b * 4 * H, H, j, c_prev[e], c[e], dh, &dc[e], dg + b * 4 * H);
    }
}

__global__ void mb__k_lstm_copy_strided(void *dst, mb_dtype dt, int64_t ds0, int64_t ds1, const float *src, int64_t ss0,
                                        int64_t ss1, int64_t n0, int64_t n1, int64_t d) {
    int64_t n = n0 * n1 * d;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t q = e % d, r = e / d, j = r % n1, i = r / n1; /* row (i, j), element q */
        mb__store(dst, dt, (size_t)(i * ds0 + j * ds1 + q), src[i * ss0 + j * ss1 + q]);
    }
}

__global__ void mb__k_lstm_add(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}

__global__ void mb__k_lstm_fill(float *y, float v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = v;
}

static mb_result mb__cuda_lstm_fwd_gates(mb_device *dev, int stream, int64_t B, int64_t H, float *g,
                                         const float *b_ih, const float *b_hh, const float *c_prev, float *c,
                                         float *h, int need_h) {
    (void)need_h; /* h is always written: cheaper than a branch */
    return MB__RUN_N(dev, stream, mb__k_lstm_fwd_gates, B * H, B, H, g, b_ih, b_hh, c_prev, c, h);
}

static mb_result mb__cuda_lstm_bwd_gates(mb_device *dev, int stream, int64_t B, int64_t H, const float *a,
                                         const float *c_prev, const float *c, const float *dh_rec,
                                         const float *dout, float *dc, float *dg) {
    return MB__RUN_N(dev, stream, mb__k_lstm_bwd_gates, B * H, B, H, a, c_prev, c, dh_rec, dout, dc, dg);
}

static mb_result mb__cuda_copy_strided(mb_device *dev, int stream, void *dst, mb_dtype dt, int64_t ds0, int64_t ds1,
                                       const float *src, int64_t ss0, int64_t ss1, int64_t n0, int64_t n1, int64_t d) {
    return MB__RUN_N(dev, stream, mb__k_lstm_copy_strided, n0 * n1 * d, dst, dt, ds0, ds1, src, ss0, ss1, n0, n1, d);
}

static mb_result mb__cuda_add(mb_device *dev, int stream, float *y, const float *x, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_lstm_add, n, y, x, n);
}

static mb_result mb__cuda_fill(mb_device *dev, int stream, float *y, float v, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_lstm_fill, n, y, v, n);
}

// -- the fused recurrence: types --
// The kernels' descriptors and shared-memory layout (the host side below fills them). One descriptor per
// LSTM layer in a launch, passed by value. A row tile of 8 batch rows of one LSTM is owned by
// `cl` blocks (1, or a thread-block cluster of 2 or 4 on sm_90), block c of them by the hidden
// units c*Hc .. c*Hc+Hc-1 (Hc = Hp/cl, Hp = H rounded up to 16 cl), and its warp w by units
// c*Hc + 16w .. +15 of those rows, all four gates: Hc/16 warps a block.

enum { MB__FUSED_ROWS = 8, MB__FUSED_MAX = 16 }; /* rows per block, layers per launch */

typedef struct mb__fused_desc {
    float *g;              /* (T, B, 4H) gates: x W_ih^T in, activated out (forward) */
    float *cs, *hs;        /* (T+1, B, H) cells and outputs, slot 0 = c0, h0 */
    void *hs_op;           /* hs in the operand type, NULL in f32 */
    const void *whh;       /* (4H, H) in the operand type */
    const float *bih, *bhh;
    const float *dout;     /* backward: (T, B, H) gradient w.r.t. the outputs */
    float *dg;             /* backward: (T, B, 4H) gate gradients in f32, NULL in bf16/f16 */
    void *dg_op;           /* backward: dg in the operand type, NULL in f32 */
    float *dsum;           /* backward: (B, 4H) each row's gate gradients summed over the steps, from
                              t = T-1 down (the bias gradients' source) */
    float *dh0, *dc0;      /* backward: (B, H) */
    int B, T, H, tile0;    /* tile0: the first block of this layer in the launch */
} mb__fused_desc;

typedef struct mb__fused_args {
    int n, cl; /* descriptors; blocks a row tile */
    mb__fused_desc d[MB__FUSED_MAX];
} mb__fused_args;


/* A block's shared memory at hidden size H, cl blocks a row tile (byte offsets;
 * megabatch_cuda.cuh carves it so): its slice of W_hh in the operand type at 0, row-major, rows
 * wld elements apart (forward: its units' rows of all four gates, (4Hc, Hp); backward: its
 * units' columns as rows, (Hc, 4Hp)); the operand tiles (forward: two of h (8, Hp), backward:
 * one of dg (8, 4Hp)) in the operand type at `tiles`, rows tld apart; then per warp, `warp`
 * bytes from `warps`: its step inputs staged in f32 (8 rows, sld floats apart, of `seg`
 * segments of its 16 units: forward the 4 input gates, backward the 4 activated gates, c_{t-1}
 * and dout). Rows are padded by 16 bytes so that the 8 rows an ldmatrix or a warp's 16-byte
 * loads touch fall in different banks (a row is then an odd number of 16 bytes); regions are
 * 128-byte aligned. bytes: the total; 0 when H or cl is out of range. */
typedef struct mb__fused_layout {
    size_t tiles, warps, warp, bytes;
    int Hp, Hc, seg, wld, tld, sld;
} mb__fused_layout;

static inline MB__HD mb__fused_layout mb__fused_layout_of(int64_t H, size_t es, int backward, int cl) {
    mb__fused_layout y = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (H < 1 || H > 4096 || (cl != 1 && cl != 2 && cl != 4) || (es != 2 && es != 4)) return y;
    size_t Hp = (size_t)(H + 16 * cl - 1) / (16 * cl) * (16 * cl), Hc = Hp / (size_t)cl, R = MB__FUSED_ROWS;
    y.Hp = (int)Hp;
    y.Hc = (int)Hc;
    y.seg = backward ? 6 : 4;
    y.wld = y.tld = (int)((backward ? 4 * Hp : Hp) + 16 / es);
    y.sld = 16 * y.seg + 4;
    y.tiles = ((backward ? Hc : 4 * Hc) * (size_t)y.wld * es + 127) / 128 * 128;
    y.warps = y.tiles + ((backward ? 1 : 2) * R * (size_t)y.tld * es + 127) / 128 * 128;
    y.warp = R * (size_t)y.sld * sizeof(float);
    y.bytes = y.warps + Hc / 16 * y.warp;
    return y;
}

/* Threads of a block at hidden size H, cl blocks a row tile: a warp per 16 of its units. At most
 * 256 (8 warps): a block may then use all 255 registers a thread can have. */
enum { MB__FUSED_THREADS_MAX = 256 };
static unsigned mb__lstm_fused_threads(int64_t H, int cl) {
    return (unsigned)((H + 16 * cl - 1) / (16 * cl) * 32);
}

/* Shared memory of a block at hidden size H, cl blocks a row tile: the larger of forward and
 * backward; 0 when out of range. */
static size_t mb__lstm_fused_smem(int64_t H, mb_dtype op, int cl) {
    size_t f = mb__fused_layout_of(H, mb_dtype_size(op), 0, cl).bytes;
    size_t b = mb__fused_layout_of(H, mb_dtype_size(op), 1, cl).bytes;
    return f > b ? f : b;
}


// -- the fused recurrence --
// The persistent fused recurrence (docs/LSTM.md, "The fused recurrence on the GPU"). One launch
// runs a layer of every LSTM given: a tile of 8 batch rows of one LSTM is owned by cl blocks
// (1, or a cluster of 2 or 4 on sm_90, each with its slice of W_hh:
// mb__fused_layout_of), and batch rows being independent, no tile waits for another. Warp w of
// a block owns 16 hidden units of its rows, all four gates (a gate tile each, below), and
// keeps for all T steps, in registers, what the recurrence carries for them: the cell state
// and biases (forward), the cell gradient, the recurrent product and the gate gradients' sums
// (backward). W_hh sits in shared memory; a step multiplies it with the operand tile by
// ldmatrix and mma.m16n8k16 (bf16/f16) or by FMA (f32).
// Nothing in a step's chain waits on global memory: each warp fetches its own inputs of the
// next step with cp.async into its staging area while this step computes (so a __syncwarp,
// not a block barrier, publishes them), and writes its outputs with stores nothing waits
// on. Barriers (of the block, or the cluster): one a step forward (h into the double-buffered
// operand tile every warp's product reads, in every block of the tile), two backward (dg
// into the operand tile, and the tile free again).

#include <cuda_pipeline_primitives.h>
#include <cooperative_groups.h>
#include <type_traits>

/* A launch in clusters of cl blocks along x (sm_90; cudaLaunchKernelEx), else as MB_LAUNCH:
 * MB_LAUNCH_CLUSTER(kernel, grid, block, shared_bytes, stream, cl)(args...). A launch error is
 * left for cudaGetLastError. The simulator defines its own. */
#ifndef MB_LAUNCH_CLUSTER
template <class... P> struct mb__cluster_launch {
    void (*k)(P...);
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    template <class... A> void operator()(A &&...args) {
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
    }
};
template <class... P>
static mb__cluster_launch<P...> mb__cluster_launcher(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                                     unsigned cl) {
    mb__cluster_launch<P...> l = {};
    l.k = k;
    l.cfg.gridDim = grid;
    l.cfg.blockDim = block;
    l.cfg.dynamicSmemBytes = smem;
    l.cfg.stream = st;
    l.at.id = cudaLaunchAttributeClusterDimension;
    l.at.val.clusterDim.x = cl;
    l.at.val.clusterDim.y = 1;
    l.at.val.clusterDim.z = 1;
    return l;
}
#define MB_LAUNCH_CLUSTER(k, grid, block, smem, stream, cl) mb__cluster_launcher(k, grid, block, smem, stream, cl)
#endif

/* The barrier of a row tile's blocks in two halves: the block's (arrive does nothing, wait is
 * __syncthreads), or the cluster's (cl > 1, sm_90 only: barrier_arrive releases what this
 * thread wrote, into other blocks' shared memory too, and barrier_wait returns when every
 * thread of the cluster has arrived). Between the halves a thread does work the others do not
 * wait for: a cluster's arrive fences this thread's memory operations before it, so the global
 * stores of a step go after it and overlap the wait. */
__device__ inline void mb__fused_arrive(int cl) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if (cl > 1) cooperative_groups::this_cluster().barrier_arrive();
#endif
    (void)cl;
}
__device__ inline void mb__fused_wait(int cl) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if (cl > 1) {
        cooperative_groups::this_cluster().barrier_wait();
        return;
    }
#endif
    (void)cl;
    __syncthreads();
}
__device__ inline void mb__fused_sync(int cl) {
    mb__fused_arrive(cl);
    mb__fused_wait(cl);
}

/* Address p of this block's shared memory in block r of its cluster (cl 1: p itself). */
template <class T> __device__ inline T *mb__fused_peer(T *p, int cl, int r) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if (cl > 1) return cooperative_groups::this_cluster().map_shared_rank(p, r);
#endif
    (void)cl;
    (void)r;
    return p;
}

#ifndef MB_DYNAMIC_SHARED /* the simulator defines its own; nvcc: the launch's dynamic shared memory */
#define MB_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif

/* Round v into an operand element (f32: as is; 16 bits: the hardware's round to nearest even, the
 * bits of mb_f32_to_bf16/f16 for every non-NaN), and back. */
__device__ inline void mb__fput(float *p, float v) { *p = v; }
__device__ inline void mb__fput(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void mb__fput(__half *p, float v) { *p = __float2half_rn(v); }
__device__ inline float mb__fget(float v) { return v; }
__device__ inline float mb__fget(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float mb__fget(__half v) { return __half2float(v); }
/* Four consecutive elements at p (16-byte aligned in f32, 8-byte in 16 bits) in one load. */
__device__ inline void mb__fget4(const float *p, float v[4]) {
    float4 a = *(const float4 *)p;
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}
__device__ inline void mb__fget4(const __nv_bfloat16 *p, float v[4]) {
    const __nv_bfloat162 *q = (const __nv_bfloat162 *)p;
    float2 a = __bfloat1622float2(q[0]), b = __bfloat1622float2(q[1]);
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}
__device__ inline void mb__fget4(const __half *p, float v[4]) {
    const __half2 *q = (const __half2 *)p;
    float2 a = __half22float2(q[0]), b = __half22float2(q[1]);
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}

/* The cell's nonlinearities: mb__fsigmoid and mb__ftanh's formulas, sigmoid(z) = 1/(1 + e^-z) and
 * tanh(z) = 1 - 2/(e^2z + 1), with the GPU's ex2 and reciprocal (relative error ~1e-6): the fused
 * kernels' only departure from the CPU's math besides the order of the product's sums. The
 * special-function unit is a step's narrowest resource, so a cell's four gate denominators share
 * one reciprocal: each exponent is capped at 31 (NaN passes), keeping their product finite;
 * sigmoid(z) for z < -21.4 is then 4.6e-10 instead of smaller, tanh(z) for z > 10.7 is 1 either
 * way. mb__ex2 and mb__rcp: the special-function unit's instructions themselves (flushing
 * denormal results, which the sums they enter do not notice); mb__gden(x): 1 + 2^min(x, 31). */
#if defined(__CUDA_ARCH__)
__device__ inline float mb__ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ inline float mb__rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
__device__ inline float mb__ex2(float x) { return exp2f(x); }
__device__ inline float mb__rcp(float x) { return 1.0f / x; }
#endif
__device__ inline float mb__gden(float x) { return 1.0f + mb__ex2(x > 31.0f ? 31.0f : x); }
__device__ inline float mb__gtanh(float z) { return 1.0f - 2.0f * mb__rcp(mb__gden(2.8853901f * z)); }

/* The forward cell: pre-activations z of the four gates -> the gates (in z), c (in and out), h. */
__device__ inline void mb__gcell_fwd(float z[4], float *c, float *h) {
    float di = mb__gden(-1.4426950f * z[0]), df = mb__gden(-1.4426950f * z[1]);
    float dg = mb__gden(2.8853901f * z[2]), dq = mb__gden(-1.4426950f * z[3]);
    float p = di * df, q = dg * dq, r = mb__rcp(p * q), rq = r * q, rp = r * p;
    z[0] = rq * df;              /* 1/di */
    z[1] = rq * di;              /* 1/df */
    z[2] = 1.0f - 2.0f * rp * dq; /* 1 - 2/dg */
    z[3] = rp * dg;              /* 1/dq */
    *c = z[1] * *c + z[0] * z[2];
    *h = z[3] * mb__gtanh(*c);
}

// A warp's gate tile: 16 hidden units x 8 batch rows of one gate in f32, 4 elements a lane, in
// the layout of the accumulator of the tensor cores' mma.m16n8k16 (PTX ISA, "Matrix fragments
// for mma.m16n8k16"; its M the units, its N the rows): lane l holds units l/4 (elements 0, 1)
// and l/4 + 8 (2, 3) of rows 2(l%4) (elements 0, 2) and 2(l%4) + 1 (1, 3). Every operand type
// uses it, the FMA path too: element-wise code pairs the four gates' tiles element by element,
// and code that stores or loads an element knows where it goes.

struct mb__gtile {
    float x[4];
};
__device__ inline int mb__lane() { return (int)(threadIdx.x & 31u); }
__device__ inline int mb__gunit(int e) { return (mb__lane() >> 2) + 8 * (e >> 1); } /* element e's unit, 0..15 */
__device__ inline int mb__grow(int e) { return 2 * (mb__lane() & 3) + (e & 1); }   /* and its row, 0..7 */
/* This lane's first element of a gate tile at p, rows ld apart: its elements are there, at +ld,
 * +8 and +ld+8 (mb__gunit, mb__grow). */
template <class D> __device__ inline D *mb__glane(D *p, size_t ld) {
    return p + (size_t)mb__grow(0) * ld + mb__gunit(0);
}

__device__ inline void mb__gfill(mb__gtile &f, float v) {
    for (int e = 0; e < 4; e++) f.x[e] = v;
}

/* Does operand type T multiply on the tensor cores (bf16/f16 from sm_80 on, and in the
 * simulator), or by FMA (f32; bf16/f16 before sm_80)? */
template <class T> struct mb__tc { static const bool on = false; };
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <> struct mb__tc<__nv_bfloat16> { static const bool on = true; };
template <> struct mb__tc<__half> { static const bool on = true; };
#endif

// The tensor cores' instructions (sm_80+; the simulator: cudasim_mma.h, which documents the
// fragment layouts): ldmatrix loads 2 or 4 8x8 matrices of 16-bit elements from shared memory,
// lane l giving the address of row l%8 of matrix l/8, its register i getting word l%4 of row
// l/4 of matrix i; mma.m16n8k16 adds A (16 x 16, 4 registers a lane) times B (16 x 8, 2) to a
// gate tile.
#if defined(__CUDA_ARCH__)
__device__ inline unsigned mb__saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif
__device__ inline void mb__ldsm4(unsigned r[4], const void *p) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(mb__saddr(p)));
#elif defined(CUDASIM)
    cudasim::ldmatrix(r, 4, p);
#else
    (void)r, (void)p;
#endif
}
__device__ inline void mb__ldsm2(unsigned r[2], const void *p) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(mb__saddr(p)));
#elif defined(CUDASIM)
    cudasim::ldmatrix(r, 2, p);
#else
    (void)r, (void)p;
#endif
}
template <class T> __device__ inline void mb__mma(mb__gtile &d, const unsigned a[4], const unsigned b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (std::is_same<T, __half>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CUDASIM)
    cudasim::mma_m16n8k16(d.x, a, b, std::is_same<T, __half>::value);
#else
    (void)d, (void)a, (void)b;
#endif
}

// The recurrent products of a warp's 16 units, lu0.. of its block's Hc, into gate tiles: A times
// the transpose of an operand tile of 8 rows, A rows of the block's slice of W_hh in shared
// memory (forward: (4Hc, Hp), gate q's rows from q Hc; backward: W_hh's transpose, (Hc, 4Hp)),
// both row-major, wld and tld elements apart. Tensor cores: ldmatrix and mma.m16n8k16 with f32
// accumulation; FMA: each sum in k order.

/* The address this lane gives ldmatrix (add the k-step's first column k) for the A fragment of
 * rows m0..m0+15 of a row-major array (rows ld apart), and for the B fragment of the 8 rows of
 * an operand tile: one k-step's (x4 0: ldmatrix.x2) or two consecutive k-steps' (x4 1: .x4). */
template <class T> __device__ inline const T *mb__afrag(const T *a, int ld, int m0) {
    return a + (size_t)(m0 + (mb__lane() & 7) + 8 * ((mb__lane() >> 3) & 1)) * ld + 8 * (mb__lane() >> 4);
}
template <class T> __device__ inline const T *mb__bfrag(const T *b, int ld, int x4) {
    return b + (size_t)(mb__lane() & 7) * ld + 8 * ((mb__lane() >> 3) & (x4 ? 3 : 1));
}

/* Forward: acc[q] += W_q h^T, h the (8, Hp) operand tile. */
template <class T>
__device__ void mb__whh_product_fwd(mb__gtile acc[4], const T *h, int tld, const T *w, int wld, int Hp, int Hc, int lu0) {
    if constexpr (mb__tc<T>::on) {
        const T *bp = mb__bfrag(h, tld, 0), *ap = mb__afrag(w, wld, lu0);
        for (int k = 0; k < Hp; k += 16) {
            unsigned b[2];
            mb__ldsm2(b, bp + k);
            for (int q = 0; q < 4; q++) {
                unsigned a[4];
                mb__ldsm4(a, ap + (size_t)q * Hc * wld + k);
                mb__mma<T>(acc[q], a, b);
            }
        }
    } else {
        const T *h0 = h + (size_t)mb__grow(0) * tld, *h1 = h0 + tld, *w0 = w + (size_t)(lu0 + mb__gunit(0)) * wld;
        for (int k = 0; k < Hp; k += 4) { /* 4 k at a time: a row's 4 in one load */
            float x0[4], x1[4];
            mb__fget4(h0 + k, x0);
            mb__fget4(h1 + k, x1);
            for (int q = 0; q < 4; q++) {
                float a0[4], a1[4];
                mb__fget4(w0 + (size_t)q * Hc * wld + k, a0);
                mb__fget4(w0 + (size_t)(q * Hc + 8) * wld + k, a1);
                for (int j = 0; j < 4; j++) {
                    acc[q].x[0] = __fmaf_rn(x0[j], a0[j], acc[q].x[0]);
                    acc[q].x[1] = __fmaf_rn(x1[j], a0[j], acc[q].x[1]);
                    acc[q].x[2] = __fmaf_rn(x0[j], a1[j], acc[q].x[2]);
                    acc[q].x[3] = __fmaf_rn(x1[j], a1[j], acc[q].x[3]);
                }
            }
        }
    }
}

/* Backward: acc = W^T dg^T (dh_rec), dg the (8, 4Hp) operand tile; tensor cores: two partial
 * sums (even and odd k-steps, Hp/4 of them, an even number) so that two products are in flight. */
template <class T> __device__ void mb__whh_product_bwd(mb__gtile &acc, const T *dg, int tld, const T *w, int wld, int Hp, int lu0) {
    if constexpr (mb__tc<T>::on) {
        const T *bp = mb__bfrag(dg, tld, 1), *ap = mb__afrag(w, wld, lu0);
        mb__gtile part[2];
        mb__gfill(part[0], 0.0f);
        mb__gfill(part[1], 0.0f);
        for (int k = 0; k < 4 * Hp; k += 32) {
            unsigned b[4], a0[4], a1[4];
            mb__ldsm4(b, bp + k);
            mb__ldsm4(a0, ap + k);
            mb__ldsm4(a1, ap + k + 16);
            mb__mma<T>(part[0], a0, b);
            mb__mma<T>(part[1], a1, b + 2);
        }
        for (int e = 0; e < 4; e++) acc.x[e] = part[0].x[e] + part[1].x[e];
    } else {
        const T *d0 = dg + (size_t)mb__grow(0) * tld, *d1 = d0 + tld, *w0 = w + (size_t)(lu0 + mb__gunit(0)) * wld,
                *w1 = w0 + (size_t)8 * wld;
        mb__gfill(acc, 0.0f);
        for (int k = 0; k < 4 * Hp; k += 4) {
            float x0[4], x1[4], a0[4], a1[4];
            mb__fget4(d0 + k, x0);
            mb__fget4(d1 + k, x1);
            mb__fget4(w0 + k, a0);
            mb__fget4(w1 + k, a1);
            for (int j = 0; j < 4; j++) {
                acc.x[0] = __fmaf_rn(x0[j], a0[j], acc.x[0]);
                acc.x[1] = __fmaf_rn(x1[j], a0[j], acc.x[1]);
                acc.x[2] = __fmaf_rn(x0[j], a1[j], acc.x[2]);
                acc.x[3] = __fmaf_rn(x1[j], a1[j], acc.x[3]);
            }
        }
    }
}

// The block: its descriptor, rows and shared memory, and the warp's units and staging area.

template <class T> struct mb__fblock {
    mb__fused_desc d;
    T *w, *tiles;               /* the slice of W_hh; the operand tiles (mb__fused_tile) */
    float *stage, *slane;       /* this warp's; this lane's first element in it (mb__glane) */
    int Hp, Hc, wld, tld, sld;  /* mb__fused_layout's */
    int cl, r0, nr;             /* blocks a row tile; rows r0 .. r0+nr-1 of the batch */
    int u0, lu0, nu;            /* this warp's units u0 .. u0+nu-1 (lu0 in its block's); nu <= 0: none */
};

/* This block's descriptor, row tile and place in it (blocks cl at a time a row tile). */
__device__ inline mb__fused_desc mb__fused_find(const mb__fused_args &a, int *tile, int *rank) {
    int b = (int)blockIdx.x / a.cl, i = 0;
    while (i + 1 < a.n && b >= a.d[i + 1].tile0) i++;
    *tile = b - a.d[i].tile0;
    *rank = (int)blockIdx.x % a.cl;
    return a.d[i];
}

/* Carve shared memory, load the block's slice of W_hh (the backward's transposed, read along
 * W_hh's rows), zero the operand tiles and the staging areas (padding rows and units stay
 * zero); then a barrier of the row tile's blocks. */
template <class T> __device__ mb__fblock<T> mb__fused_begin(const mb__fused_args &a, unsigned char *sm, int backward) {
    mb__fblock<T> k;
    int tile, rank, warp = (int)(threadIdx.x / 32);
    k.d = mb__fused_find(a, &tile, &rank);
    const int H = k.d.H;
    mb__fused_layout y = mb__fused_layout_of(H, sizeof(T), backward, a.cl);
    k.Hp = y.Hp; k.Hc = y.Hc; k.wld = y.wld; k.tld = y.tld; k.sld = y.sld;
    k.cl = a.cl;
    k.r0 = tile * MB__FUSED_ROWS;
    k.nr = k.d.B - k.r0 < MB__FUSED_ROWS ? k.d.B - k.r0 : MB__FUSED_ROWS;
    k.lu0 = 16 * warp;
    k.u0 = rank * k.Hc + k.lu0;
    k.nu = k.lu0 < k.Hc ? (H - k.u0 < 16 ? H - k.u0 : 16) : 0;
    k.w = (T *)sm;
    k.tiles = (T *)(sm + y.tiles);
    k.stage = (float *)(sm + y.warps + (size_t)warp * y.warp);
    k.slane = mb__glane(k.stage, (size_t)k.sld);
    const int Hp = k.Hp, Hc = k.Hc, u1 = rank * Hc;
    for (int e = (int)threadIdx.x; e < 4 * Hc * Hp; e += (int)blockDim.x) {
        /* forward: row n = q Hc + j (gate q, unit u1 + j), column c; backward: W_hh's row n = q Hp
         * + c (gate q, unit c) into column n of row j (unit u1 + j) */
        int n = backward ? e / Hc : e / Hp, q = backward ? n / Hp : n / Hc;
        int j = backward ? e % Hc : n % Hc, c = backward ? n % Hp : e % Hp;
        float v = u1 + j < H && c < H ? mb__fget(((const T *)k.d.whh)[((size_t)q * H + (backward ? c : u1 + j)) * H +
                                                                     (backward ? u1 + j : c)])
                                      : 0.0f;
        mb__fput(backward ? &k.w[(size_t)j * k.wld + n] : &k.w[(size_t)n * k.wld + c], v);
    }
    for (int e = (int)threadIdx.x; e < (backward ? 1 : 2) * MB__FUSED_ROWS * k.tld; e += (int)blockDim.x)
        mb__fput(&k.tiles[e], 0.0f);
    if (k.nu > 0)
        for (int e = mb__lane(); e < (int)(y.warp / sizeof(float)); e += 32) k.stage[e] = 0.0f;
    mb__fused_sync(k.cl); /* no block of the tile writes into another's tiles before they are zeroed */
    return k;
}

/* Forward operand tile i % 2. */
template <class T> __device__ inline T *mb__fused_tile(const mb__fblock<T> &k, int i) {
    return k.tiles + (i & 1) * MB__FUSED_ROWS * k.tld;
}

/* Issue cp.async copies of NS segments of one array into this warp's staging area, from segment
 * s0 on: segment s of row r (rows < nr, units < nu) from src + r*ld + s*ss. 16-byte copies when
 * the rows are 16-byte aligned (v16: a lane then copies 4 units of one segment, in every
 * 32/(4 NS)-th row: 4 copies a lane forward, 6 backward), else 4-byte ones. */
template <int NS, class T>
__device__ void mb__fused_fetch(const mb__fblock<T> &k, int s0, const float *src, size_t ld, size_t ss, bool v16,
                                bool whole) {
    float *stage = k.stage + s0 * 16;
    if (v16) {
        const int p = mb__lane() % (4 * NS), s = p / 4, j = p % 4 * 4, step = 32 / (4 * NS), r0 = mb__lane() / (4 * NS);
        if (j < k.nu)
            for (int m = 0; m < MB__FUSED_ROWS / step; m++) {
                int r = r0 + m * step;
                if (whole || r < k.nr) __pipeline_memcpy_async(stage + r * k.sld + s * 16 + j, src + r * ld + s * ss + j, 16);
            }
    } else {
        for (int e = mb__lane(); e < 16 * NS; e += 32) {
            int s = e / 16, j = e % 16;
            for (int r = 0; r < k.nr && j < k.nu; r++)
                __pipeline_memcpy_async(stage + r * k.sld + s * 16 + j, src + r * ld + s * ss + j, 4);
        }
    }
}

/* Segment s of the warp's staging area as a gate tile (after the wait and __syncwarp that
 * publish it). */
template <class T> __device__ inline void mb__stage_get(const mb__fblock<T> &k, mb__gtile &f, int s) {
    const float *q = k.slane + s * 16;
    f.x[0] = q[0], f.x[1] = q[k.sld], f.x[2] = q[8], f.x[3] = q[k.sld + 8];
}

/* The tile to p (this warp's first unit of the tile's first row), rows ld apart, in p's type;
 * C: only its elements of rows < nr, units < nu. */
template <bool C, class D> __device__ inline void mb__gstore(D *p, size_t ld, const mb__gtile &f, int nr, int nu) {
    D *q = mb__glane(p, ld);
    const bool r0 = !C || mb__grow(0) < nr, r1 = !C || mb__grow(1) < nr, u0 = !C || mb__gunit(0) < nu,
               u1 = !C || mb__gunit(2) < nu;
    if (r0 && u0) mb__fput(&q[0], f.x[0]);
    if (r1 && u0) mb__fput(&q[ld], f.x[1]);
    if (r0 && u1) mb__fput(&q[8], f.x[2]);
    if (r1 && u1) mb__fput(&q[ld + 8], f.x[3]);
}

/* The tile into the operand tile at o (this warp's first unit; rows ld apart) of each of the cl
 * blocks of the row tile; C: its elements outside rows < nr, units < nu as 0 (so padding
 * multiplies as zero). */
template <bool C, class T> __device__ inline void mb__goperand(T *o, int ld, int cl, const mb__gtile &f, int nr, int nu) {
    T w[4];
    for (int e = 0; e < 4; e++) mb__fput(&w[e], !C || (mb__grow(e) < nr && mb__gunit(e) < nu) ? f.x[e] : 0.0f);
    for (int b = 0; b < cl; b++) {
        T *q = mb__glane(mb__fused_peer(o, cl, b), (size_t)ld);
        q[0] = w[0], q[ld] = w[1], q[8] = w[2], q[ld + 8] = w[3];
    }
}

/* The block's tile is whole (8 rows, H a multiple of 16) and the arrays are 16-byte aligned: then
 * no bound is checked. */
__device__ inline bool mb__fused_whole(int nr, int H, const void *const *p, int n) {
    uintptr_t any = 0;
    for (int i = 0; i < n; i++) any |= (uintptr_t)p[i];
    return nr == MB__FUSED_ROWS && H % 16 == 0 && any % 16 == 0;
}

/* Forward over all T steps (W: the whole tile, mb__fused_whole; C: cl > 1, a cluster). In: the input gates x W_ih^T
 * in g (T, B, 4H); out: the activated gates in g, cells cs and outputs hs (T+1, B, H) from slot 1
 * (slot 0: c0, h0), and hs in the operand type (hs_op, low precision). */
template <class T, bool W, bool C> __device__ void mb__fused_fwd(const mb__fblock<T> &k) {
    const mb__fused_desc &d = k.d;
    const int cl = C ? k.cl : 1;
    const int H = d.H, nr = W ? MB__FUSED_ROWS : k.nr, nu = W && k.nu > 0 ? 16 : k.nu, u0 = k.u0;
    const bool v16 = W || (H % 4 == 0 && (uintptr_t)d.g % 16 == 0);
    const size_t gstep = (size_t)d.B * 4 * H, hstep = (size_t)d.B * H; /* a step in g; in cs and hs */
    float *g = d.g + (size_t)k.r0 * 4 * H + u0;                        /* this tile's rows, step t */
    size_t o = ((size_t)d.B + k.r0) * H + u0;                           /* ... in cs and hs, slot t+1 */
    mb__gtile acc[4], bias[4], c, h;
    if (nu > 0) { /* the biases and c0 into registers, the first step's input gates fetched */
        for (int e = 0; e < 4; e++) {
            int j = mb__gunit(e), r = mb__grow(e);
            for (int q = 0; q < 4; q++) bias[q].x[e] = j < nu ? d.bih[q * H + u0 + j] + d.bhh[q * H + u0 + j] : 0.0f;
            c.x[e] = j < nu && r < nr ? d.cs[(size_t)(k.r0 + r) * H + u0 + j] : 0.0f;
        }
        mb__fused_fetch<4>(k, 0, g, (size_t)4 * H, (size_t)H, v16, W);
        __pipeline_commit();
    }
    for (int e = (int)threadIdx.x; e < MB__FUSED_ROWS * k.Hp; e += (int)blockDim.x) { /* h0, all units */
        int r = e / k.Hp, j = e % k.Hp;
        if (r < nr && j < H) mb__fput(&k.tiles[r * k.tld + j], d.hs[(size_t)(k.r0 + r) * H + j]);
    }
    __syncthreads();
    for (int t = 0; t < d.T; t++, g += gstep, o += hstep) {
        if (nu > 0) {
            __pipeline_wait_prior(0);
            __syncwarp();
            for (int q = 0; q < 4; q++) mb__stage_get(k, acc[q], q);
            __syncwarp();
            if (t + 1 < d.T) mb__fused_fetch<4>(k, 0, g + gstep, (size_t)4 * H, (size_t)H, v16, W);
            __pipeline_commit();
        }
        if (t) mb__fused_wait(cl); /* h_{t-1} in every block's operand tile */
        if (nu > 0) {
            mb__whh_product_fwd(acc, mb__fused_tile(k, t), k.tld, k.w, k.wld, k.Hp, k.Hc, k.lu0);
            for (int e = 0; e < 4; e++) {
                float z[4] = {acc[0].x[e] + bias[0].x[e], acc[1].x[e] + bias[1].x[e], acc[2].x[e] + bias[2].x[e],
                              acc[3].x[e] + bias[3].x[e]};
                mb__gcell_fwd(z, &c.x[e], &h.x[e]);
                for (int q = 0; q < 4; q++) acc[q].x[e] = z[q];
            }
            mb__goperand<!W>(mb__fused_tile(k, t + 1) + u0, k.tld, cl, h, nr, nu);
        }
        mb__fused_arrive(cl);
        if (nu > 0) { /* the step's outputs, while the other blocks arrive */
            if (d.hs_op) mb__gstore<!W>((T *)d.hs_op + o, (size_t)H, h, nr, nu);
            mb__gstore<!W>(d.hs + o, (size_t)H, h, nr, nu);
            mb__gstore<!W>(d.cs + o, (size_t)H, c, nr, nu);
            for (int q = 0; q < 4; q++) mb__gstore<!W>(g + q * H, (size_t)4 * H, acc[q], nr, nu);
        }
    }
    mb__fused_wait(cl); /* no block leaves while another may still write into its tiles */
}

#ifdef CUDASIM /* the simulator checks these pointers at each launch */
CUDASIM_ARG_POINTERS(mb__fused_args, a, v) {
    for (int i = 0; i < a.n; i++) {
        const mb__fused_desc *d = &a.d[i];
        v(d->g, "d[].g"), v(d->cs, "d[].cs"), v(d->hs, "d[].hs"), v(d->hs_op, "d[].hs_op"), v(d->whh, "d[].whh");
        v(d->bih, "d[].bih"), v(d->bhh, "d[].bhh"), v(d->dout, "d[].dout"), v(d->dg, "d[].dg"), v(d->dg_op, "d[].dg_op");
        v(d->dsum, "d[].dsum"), v(d->dh0, "d[].dh0"), v(d->dc0, "d[].dc0");
    }
}
#endif
template <class T> __global__ void __launch_bounds__(MB__FUSED_THREADS_MAX) mb__k_lstm_fused_fwd(mb__fused_args a) {
    MB_DYNAMIC_SHARED(unsigned char, mb__fsm_bytes);
    const mb__fblock<T> k = mb__fused_begin<T>(a, mb__fsm_bytes, 0);
    const void *p[4] = {k.d.g, k.d.cs, k.d.hs, k.d.hs_op};
    const bool w = mb__fused_whole(k.nr, k.d.H, p, 4);
    if (a.cl > 1) w ? mb__fused_fwd<T, true, true>(k) : mb__fused_fwd<T, false, true>(k);
    else w ? mb__fused_fwd<T, true, false>(k) : mb__fused_fwd<T, false, false>(k);
}

/* Backward over all T steps, in reverse (W: the whole tile; C: a cluster): in the activated gates g, cs and
 * dout (T, B, H); out: dg (T, B, 4H) for the weight-gradient gemms (in f32, or in the operand
 * type, dg_op), its sums over the steps dsum (B, 4H) for the bias gradients (in registers until
 * the end), dh0/dc0 (B, H) the gradients w.r.t. h0 and c0. A step fetches the 4 activated
 * gates, c_{t-1} (cs slot t) and dout of the step before. */
template <class T, bool W, bool C> __device__ void mb__fused_bwd(const mb__fblock<T> &k) {
    const mb__fused_desc &d = k.d;
    const int cl = C ? k.cl : 1;
    const int H = d.H, nr = W ? MB__FUSED_ROWS : k.nr, nu = W && k.nu > 0 ? 16 : k.nu, u0 = k.u0;
    const bool v16 = W || (H % 4 == 0 && ((uintptr_t)d.g | (uintptr_t)d.cs | (uintptr_t)d.dout) % 16 == 0);
    const size_t gstep = (size_t)d.B * 4 * H, hstep = (size_t)d.B * H;
    size_t gt = ((size_t)(d.T - 1) * d.B + k.r0) * 4 * H + u0, ht = ((size_t)(d.T - 1) * d.B + k.r0) * H + u0;
    mb__gtile acc, dc, cn, a4[4], cp, dh, sum[4];
    if (nu > 0) { /* dh_rec = dc = the sums = 0, c_T into registers, the last step's inputs fetched */
        mb__gfill(acc, 0.0f);
        mb__gfill(dc, 0.0f);
        for (int q = 0; q < 4; q++) mb__gfill(sum[q], 0.0f);
        for (int e = 0; e < 4; e++)
            cn.x[e] = mb__gunit(e) < nu && mb__grow(e) < nr ? d.cs[ht + hstep + (size_t)mb__grow(e) * H + mb__gunit(e)] : 0.0f;
        mb__fused_fetch<4>(k, 0, d.g + gt, (size_t)4 * H, (size_t)H, v16, W);
        mb__fused_fetch<1>(k, 4, d.cs + ht, (size_t)H, 0, v16, W);
        mb__fused_fetch<1>(k, 5, d.dout + ht, (size_t)H, 0, v16, W);
        __pipeline_commit();
    }
    for (int t = d.T - 1; t >= 0; t--, gt -= gstep, ht -= hstep) {
        if (nu > 0) {
            __pipeline_wait_prior(0);
            __syncwarp();
            for (int q = 0; q < 4; q++) mb__stage_get(k, a4[q], q);
            mb__stage_get(k, cp, 4);
            mb__stage_get(k, dh, 5);
            __syncwarp();
            if (t > 0) {
                mb__fused_fetch<4>(k, 0, d.g + gt - gstep, (size_t)4 * H, (size_t)H, v16, W);
                mb__fused_fetch<1>(k, 4, d.cs + ht - hstep, (size_t)H, 0, v16, W);
                mb__fused_fetch<1>(k, 5, d.dout + ht - hstep, (size_t)H, 0, v16, W);
            }
            __pipeline_commit();
            for (int e = 0; e < 4; e++) { /* mb__lstm_cell_bwd, in registers */
                float ig = a4[0].x[e], fg = a4[1].x[e], gg = a4[2].x[e], og = a4[3].x[e];
                float tc = mb__gtanh(cn.x[e]), dhv = acc.x[e] + dh.x[e];
                float dcv = dc.x[e] + dhv * og * (1.0f - tc * tc);
                a4[0].x[e] = dcv * gg * ig * (1.0f - ig);
                a4[1].x[e] = dcv * cp.x[e] * fg * (1.0f - fg);
                a4[2].x[e] = dcv * ig * (1.0f - gg * gg);
                a4[3].x[e] = dhv * tc * og * (1.0f - og);
                dc.x[e] = dcv * fg;
                cn.x[e] = cp.x[e];
                for (int q = 0; q < 4; q++) sum[q].x[e] += a4[q].x[e];
            }
        }
        if (t < d.T - 1) mb__fused_wait(cl); /* the operand tile free again (the step after's product done) */
        if (nu > 0)
            for (int q = 0; q < 4; q++) mb__goperand<!W>(k.tiles + q * k.Hp + u0, k.tld, cl, a4[q], nr, nu);
        mb__fused_arrive(cl); /* dg in the operand tiles */
        if (nu > 0) /* the step's outputs, while the other blocks arrive */
            for (int q = 0; q < 4; q++) {
                if (d.dg_op) mb__gstore<!W>((T *)d.dg_op + gt + q * H, (size_t)4 * H, a4[q], nr, nu);
                else mb__gstore<!W>(d.dg + gt + q * H, (size_t)4 * H, a4[q], nr, nu);
            }
        mb__fused_wait(cl);
        if (nu > 0) mb__whh_product_bwd(acc, k.tiles, k.tld, k.w, k.wld, k.Hp, k.lu0); /* dh_rec = dg W_hh */
        mb__fused_arrive(cl);
    }
    mb__fused_wait(cl);
    if (nu > 0) {
        mb__gstore<!W>(d.dh0 + (size_t)k.r0 * H + u0, (size_t)H, acc, nr, nu);
        mb__gstore<!W>(d.dc0 + (size_t)k.r0 * H + u0, (size_t)H, dc, nr, nu);
        for (int q = 0; q < 4; q++) mb__gstore<!W>(d.dsum + (size_t)k.r0 * 4 * H + q * H + u0, (size_t)4 * H, sum[q], nr, nu);
    }
}

template <class T> __global__ void __launch_bounds__(MB__FUSED_THREADS_MAX) mb__k_lstm_fused_bwd(mb__fused_args a) {
    MB_DYNAMIC_SHARED(unsigned char, mb__fsm_bytes);
    const mb__fblock<T> k = mb__fused_begin<T>(a, mb__fsm_bytes, 1);
    const void *p[8] = {k.d.g, k.d.cs, k.d.dout, k.d.dg, k.d.dg_op, k.d.dsum, k.d.dh0, k.d.dc0};
    const bool w = mb__fused_whole(k.nr, k.d.H, p, 8);
    if (a.cl > 1) w ? mb__fused_bwd<T, true, true>(k) : mb__fused_bwd<T, false, true>(k);
    else w ? mb__fused_bwd<T, true, false>(k) : mb__fused_bwd<T, false, false>(k);
}

/* One launch for the a->n descriptors (all of operand type T, a->cl blocks a row tile);
 * *blocks: their row tiles. The widest layer sets the threads and the shared memory. Empties
 * a and *blocks for the next launch. */
template <class T> static mb_result mb__cuda_lstm_fused_t(mb_device *dev, int stream, int backward, mb__fused_args *a,
                                                          unsigned *blocks) {
    int64_t H = 1;
    for (int i = 0; i < a->n; i++) H = a->d[i].H > H ? a->d[i].H : H;
    size_t smem = mb__fused_layout_of(H, sizeof(T), backward, a->cl).bytes;
    unsigned threads = mb__lstm_fused_threads(H, a->cl), nb = *blocks;
    void (*k)(mb__fused_args) = backward ? mb__k_lstm_fused_bwd<T> : mb__k_lstm_fused_fwd<T>;
    mb__fused_args args = *a;
    a->n = 0;
    *blocks = 0;
    MB_CUDA_TRY(dev, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (args.cl > 1) MB_LAUNCH_CLUSTER(k, nb * args.cl, threads, smem, mb__st(dev, stream), args.cl)(args);
    else MB_LAUNCH(k, nb, threads, smem, mb__st(dev, stream))(args); /* MB__RUN with dynamic shared memory */
    return mb__launched(dev, "mb__k_lstm_fused", __FILE__, __LINE__);
}

/* The shared memory a block may opt into on this device, and its largest cluster for the fused
 * recurrence (4 with clusters, sm_90, else 1). */
static void mb__cuda_fused_limits(mb_device *dev, size_t *smem, int *cluster) {
    int v = 0, c = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, mb__cu(dev)->index) != cudaSuccess ||
        cudaDeviceGetAttribute(&c, cudaDevAttrClusterLaunch, mb__cu(dev)->index) != cudaSuccess) {
        cudaGetLastError();
        v = c = 0;
    }
    *smem = (size_t)v;
    *cluster = c ? 4 : 1;
}

// -- the choice of recurrence --
/* The fused recurrence can run here with cl blocks a row tile: the GPU has clusters of cl, a
 * block has at most MB__FUSED_THREADS_MAX threads, and its shared memory fits a block's. */
static int mb__lstm_fused_fits(mb_device *dev, int64_t H, mb_dtype op, int cl) {
    size_t smem = 0, need = mb__lstm_fused_smem(H, op, cl);
    int maxcl = 0;
    mb__cuda_fused_limits(dev, &smem, &maxcl);
    return cl <= maxcl && need && need <= smem && mb__lstm_fused_threads(H, cl) <= MB__FUSED_THREADS_MAX;
}

/* The recurrence's time per timestep of one layer, forward + backward, in microseconds on an
 * H100 at B = 128, T = 480, bf16 (the latency model of docs/BENCHMARKS.md): the fused kernel
 * with cl blocks a row tile, or for cl = 0 the per-step gemms (a chain of launches a timestep).
 * Fused: a fixed part (the cell update, the fetches and stores of a warp's tile), a part that
 * grows with the product's length Hp, a part for the warps past four a block (two then share a
 * scheduler) and the cluster's barriers. The fused constants fit the model's prediction for
 * these kernels (bench/latency_model.sh, its table of the 8-row kernels, H = 32 .. 256, cl 1, 2,
 * 4: within 9%, the same choice at every H but 128, where 2 and 4 blocks tie here and the model
 * prefers 4 by 9%); no GPU has run them yet. The per-step constant fits the H100 runs of
 * 2026-11-26 (bench/results/2026-11-26-h100-fused, run 3: 44.7 at H = 256). */
#define MB__US_STEP 1.3
#define MB__US_K 0.0175
#define MB__US_CROWD 0.07
#define MB__US_CLUSTER 1.8
#define MB__US_PERSTEP 38.3
static double mb__lstm_step_us(int64_t H, int cl) {
    if (cl == 0) return MB__US_PERSTEP + 0.025 * (double)H;
    double Hp = (double)((H + 16 * cl - 1) / (16 * cl) * (16 * cl)), warps = Hp / cl / 16;
    return MB__US_STEP + MB__US_K * Hp + MB__US_CROWD * (warps > 4 ? warps - 4 : 0) * Hp / 16 + (cl > 1 ? MB__US_CLUSTER : 0);
}

/* How an LSTM of hidden size H with full storage runs its recurrence on dev: the fused kernel
 * with that many blocks a row tile (1, 2 or 4), or 0: the per-step gemms. forced (the config's
 * fused_blocks): -1 the per-step gemms, n > 0 that n (0 when it does not fit); 0: the cheapest
 * of those that fit, by mb__lstm_step_us. */
static int mb__lstm_fused_choice(mb_device *dev, int64_t H, mb_dtype op, int forced) {
    if (forced) return forced > 0 && mb__lstm_fused_fits(dev, H, op, forced) ? forced : 0;
    int best = 0;
    for (int cl = 1; cl <= 4; cl *= 2)
        if (mb__lstm_fused_fits(dev, H, op, cl) && mb__lstm_step_us(H, cl) < mb__lstm_step_us(H, best)) best = cl;
    return best;
}

/* Device bytes of its workspace at (B, T) (what mb__lstm_fused_alloc takes): x of all steps
 * (T*B, F) in f32 and the gate gradients (T*B, 4H) in the operand type, in bf16/f16 x's
 * operand copy too, and each row's gate gradients summed over the steps (B, 4H). SIZE_MAX on
 * overflow. */
static size_t mb__lstm_fused_bytes(int64_t B, int64_t T, int64_t F, int64_t H, mb_dtype op) {
    size_t rows, a, b, out, es = mb_dtype_size(op);
    size_t row = (size_t)F * (sizeof(float) + (op == MB_F32 ? 0 : es)) + 4 * (size_t)H * es; /* a row of all steps */
    if (!mb_size_mul((size_t)B, (size_t)T, &rows) || !mb_size_mul(rows, row, &a) ||
        !mb_size_mul((size_t)B, 4 * (size_t)H * sizeof(float), &b) || !mb_size_add(a, b, &out))
        return SIZE_MAX;
    return out;
}


/* CUDA's state for one LSTM (l->be_lstm): which recurrence runs it, and the fused one's
 * workspace (mb__lstm_fused_alloc). */
typedef struct mb__cuda_lstm {
    int fused;                /* the fused recurrence with that many blocks a row tile; 0: the per-step gemms */
    float *xall, *dgs, *dsum; /* (T*B, F) x, (T*B, 4H) gate gradients (f32 only), (B, 4H) each row's gate
                                 gradients summed over the steps */
    void *xall_lp, *dgs_lp;   /* low precision: x's operand copy, the gate gradients */
    int x_kept;               /* xall (xall_lp) holds the last forward's x */
} mb__cuda_lstm;

static mb__cuda_lstm *mb__cuda_lstm_of(const mb_lstm *l) { return (mb__cuda_lstm *)l->be_lstm; }

// -- the fused recurrence: the host side --
// Host side of the persistent fused recurrence (its kernels above).
// Per layer: the input projection of all T steps as one gemm into the gates, one launch for
// the recurrence, and after the backward recurrence the weight gradients as one gemm each over
// all T*B rows. mb_lstm_*_many runs a layer of every LSTM in one launch.

/* All steps' x gathered time-major (T*B, F) with its operand copy, the gate gradients of all
 * steps (T*B, 4H) in the operand type (f32 in f32: they are the gemms' operand as they are),
 * and their sums over the steps (B, 4H), from which the bias gradients come:
 * mb__lstm_fused_bytes, which the GPU's full-storage default counts. */
static mb_result mb__lstm_fused_alloc(mb_lstm *l) {
    mb__cuda_lstm *st = mb__cuda_lstm_of(l);
    size_t rows = (size_t)(l->maxT * l->maxB), es = mb_dtype_size(l->op);
    MB_TRY(mb__lstm_alloc(l, &st->xall, rows * (size_t)l->F));
    MB_TRY(mb__lstm_alloc(l, &st->dsum, (size_t)l->maxB * 4 * (size_t)l->H));
    if (l->op == MB_F32) return mb__lstm_alloc(l, &st->dgs, rows * 4 * (size_t)l->H);
    MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, rows * (size_t)l->F * es, &st->xall_lp));
    return mb_alloc(l->dev, MB_MEM_DEVICE, rows * 4 * (size_t)l->H * es, &st->dgs_lp);
}

static void mb__lstm_fused_free(mb_lstm *l) {
    mb__cuda_lstm *st = mb__cuda_lstm_of(l);
    mb_free(l->dev, st->xall); mb_free(l->dev, st->dgs); mb_free(l->dev, st->dsum);
    mb_free(l->dev, st->xall_lp); mb_free(l->dev, st->dgs_lp);
}

/* Layer k's input rows of all T steps (T*B, in) as gemm operands. Layer 0's are the caller's
 * x gathered time-major by the forward; the backward gathers them again only where layer 0's
 * d_in has used xall as its scratch since (f32). */
static mb_result mb__lstm_fused_input(mb_lstm *l, int li, int backward, const void **rows) {
    mb__cuda_lstm *st = mb__cuda_lstm_of(l);
    int64_t B = l->B, F = l->F;
    if (li) { *rows = mb__lstm_in_op(l, li); return MB_OK; }
    void *dst = l->op == MB_F32 ? (void *)st->xall : st->xall_lp;
    *rows = dst;
    if (backward && st->x_kept) return MB_OK;
    MB_TRY(mb__lstm_copy_strided(l, dst, l->op, F, B * F, l->x, l->xs, F, B, l->T, F));
    st->x_kept = 1;
    return MB_OK;
}

/* The input projection of all steps: gates = x W_ih^T, one gemm. */
static mb_result mb__lstm_fused_project(mb_lstm *l, int li) {
    int64_t in = l->layer[li].in;
    float *w[4] = {0};
    const void *wih, *whh, *x;
    MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_forward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    MB_TRY(mb__lstm_fused_input(l, li, 0, &x));
    return mb__lstm_gemm(l, l->op, 0, 1, l->T * l->B, 4 * l->H, in, x, in, wih, in, 0.0f, l->layer[li].gates, 4 * l->H);
}

/* Layer k's descriptor; backward: dout its output gradients, dh0/dc0 into l->dh, l->dc. */
static mb_result mb__lstm_fused_desc_of(mb_lstm *l, int li, const float *dout, mb__fused_desc *d) {
    const mb__cuda_lstm *st = mb__cuda_lstm_of(l);
    mb__lstm_layer *y = &l->layer[li];
    float *w[4] = {0};
    const void *wih, *whh;
    MB_TRY(mb__lstm_weights(l, li, w, 0, dout ? "mb_lstm_backward" : "mb_lstm_forward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    memset(d, 0, sizeof *d);
    d->g = y->gates; d->cs = y->cs; d->hs = y->hs; d->hs_op = l->op == MB_F32 ? NULL : y->hs_lp;
    d->whh = whh; d->bih = w[MB__LSTM_BIH]; d->bhh = w[MB__LSTM_BHH];
    d->dout = dout; d->dg = st->dgs; d->dg_op = l->op == MB_F32 ? NULL : st->dgs_lp; d->dsum = st->dsum;
    d->dh0 = l->dh; d->dc0 = l->dc;
    d->B = (int)l->B; d->T = (int)l->T; d->H = (int)l->H;
    return MB_OK;
}

/* One launch per precision, per blocks a row tile and per MB__FUSED_MAX layers: layer k of each
 * of the n LSTMs that have one (douts[i]: LSTM i's output gradients, backward; NULL forward),
 * in the order given (the longest T first keeps a launch that needs more blocks than the GPU
 * holds at once short). A lone LSTM runs on its stream; several on MB_STREAM_COMPUTE, after
 * their streams and before them again. */
static mb_result mb__lstm_fused_run(mb_lstm *const *ls, const float *const *douts, int n, int li, int backward) {
    mb_device *dev = ls[0]->dev;
    int stream = n == 1 ? ls[0]->cfg.stream : MB_STREAM_COMPUTE;
    for (int i = 0; i < n && n > 1; i++) MB_TRY(mb_stream_wait(dev, stream, ls[i]->cfg.stream));
    for (int op = MB_F32; op <= MB_F16; op++)
        for (int cl = 1; cl <= 4; cl *= 2) {
            mb__fused_args a;
            a.n = 0;
            a.cl = cl;
            unsigned blocks = 0; /* row tiles; the launch has cl blocks each */
            for (int i = 0; i <= n; i++) {
                if (i < n) {
                    if (ls[i]->L <= li || (int)ls[i]->op != op || mb__cuda_lstm_of(ls[i])->fused != cl) continue;
                    MB_TRY(mb__lstm_fused_desc_of(ls[i], li, backward ? douts[i] : NULL, &a.d[a.n]));
                    a.d[a.n++].tile0 = (int)blocks;
                    blocks += (unsigned)((ls[i]->B + MB__FUSED_ROWS - 1) / MB__FUSED_ROWS);
                }
                if (a.n == MB__FUSED_MAX || (i == n && a.n)) /* a launch: full, or the last */
                    MB_TRY(op == MB_BF16 ? mb__cuda_lstm_fused_t<__nv_bfloat16>(dev, stream, backward, &a, &blocks)
                           : op == MB_F16 ? mb__cuda_lstm_fused_t<__half>(dev, stream, backward, &a, &blocks)
                                          : mb__cuda_lstm_fused_t<float>(dev, stream, backward, &a, &blocks));
            }
        }
    for (int i = 0; i < n && n > 1; i++) MB_TRY(mb_stream_wait(dev, ls[i]->cfg.stream, stream));
    return MB_OK;
}

/* After the backward recurrence of layer k: dW_ih, dW_hh and d_in, each one gemm over all T*B
 * rows (d_in NULL: not needed; layer 0: scattered into the caller's dx); the biases' from the
 * recurrence's sums over the steps, one gemm over B rows each. */
static mb_result mb__lstm_fused_grads(mb_lstm *l, int li, float *d_in) {
    int64_t B = l->B, H = l->H, in = l->layer[li].in, rows = l->T * B;
    float *w[4] = {0}, *dw[4] = {0};
    mb__cuda_lstm *st = mb__cuda_lstm_of(l);
    const void *wih, *whh, *x, *dg = l->op == MB_F32 ? (const void *)st->dgs : st->dgs_lp;
    MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_backward"));
    MB_TRY(mb__lstm_weights(l, li, dw, 1, "mb_lstm_backward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    MB_TRY(mb__lstm_fused_input(l, li, 1, &x));
    MB_TRY(mb__lstm_gemm(l, l->op, 1, 0, 4 * H, in, rows, dg, 4 * H, x, in, 1.0f, dw[MB__LSTM_WIH], in));
    MB_TRY(mb__lstm_gemm(l, l->op, 1, 0, 4 * H, H, rows, dg, 4 * H, mb__lstm_hs_op(l, li), H, 1.0f, dw[MB__LSTM_WHH], H));
    for (int i = MB__LSTM_BIH; i <= MB__LSTM_BHH; i++)
        MB_TRY(mb__lstm_gemm(l, MB_F32, 0, 0, 1, 4 * H, B, l->ones, B, st->dsum, 4 * H, 1.0f, dw[i], 4 * H));
    if (!d_in) return MB_OK;
    MB_TRY(mb__lstm_gemm(l, l->op, 0, 0, rows, in, 4 * H, dg, 4 * H, wih, in, 0.0f, li ? d_in : st->xall, in));
    if (li) return MB_OK;
    st->x_kept = l->op != MB_F32; /* f32: the scratch was x's rows */
    return mb__lstm_copy_strided(l, d_in, MB_F32, l->xs, in, st->xall, in, B * in, B, l->T, in);
}

/* One call's forward or backward. */
static mb_result mb__lstm_run_call(const mb_lstm_call *c, int backward) {
    mb_lstm *l = c->lstm;
    return backward ? mb__lstm_backward(l, c->dh_last, c->dout_seq, c->dx, c->dh0, c->dc0)
                    : mb__lstm_forward(l, c->x, mb__lstm_call_xs(c), c->B, c->T, c->h0, c->c0,
                                       c->out_seq, c->h_last);
}

/* The calls one after another from this thread (each on its own stream), longest first. The
 * result: the first failing call's (in calls' order); the other calls still ran. */
static mb_result mb__lstm_run_each(mb_lstm_call *calls, int n, int backward) {
    int order[MB__LSTM_MANY_MAX], failed = n;
    mb_result res = MB_OK;
    char msg[MB_MAX_ERROR];
    mb__lstm_order(calls, n, order);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        mb_result r = mb__lstm_run_call(&calls[i], backward);
        if (r == MB_OK || i > failed) continue;
        failed = i; res = r;
        snprintf(msg, sizeof msg, "%s", mb_last_error());
    }
    return failed < n ? MB_FAIL(NULL, res, "%s", msg) : MB_OK; /* logged already */
}

/* Whether mb_lstm_*_many can run in one launch per layer: every LSTM fused (and on the device
 * of the first: checked by mb_lstm_*_many). */
static int mb__lstm_fused_many_ok(const mb_lstm_call *calls, int n) {
    for (int i = 0; i < n; i++)
        if (!mb__cuda_lstm_of(calls[i].lstm)->fused) return 0;
    return n > 1;
}

/* The group's many: the calls begun, then a layer at a time one launch for that layer of every
 * LSTM (after the forward's input projections; then the backward's weight gradients), and the
 * forwards ended; else (not every LSTM fused) the calls one after another. */
static mb_result mb__cuda_lstm_many(mb_lstm_call *calls, int n, int backward) {
    if (!mb__lstm_fused_many_ok(calls, n)) return mb__lstm_run_each(calls, n, backward);
    mb_lstm *ls[MB__LSTM_MANY_MAX];
    const float *douts[MB__LSTM_MANY_MAX];
    int L = 0;
    for (int i = 0; i < n; i++) {
        mb_lstm_call *c = &calls[i];
        ls[i] = c->lstm;
        L = ls[i]->L > L ? ls[i]->L : L;
        if (backward) MB_TRY(mb__lstm_backward_begin(ls[i], c->dh_last, c->dout_seq));
        else MB_TRY(mb__lstm_forward_begin(ls[i], c->x, mb__lstm_call_xs(c), c->B, c->T, c->h0, c->c0));
    }
    for (int j = 0; j < L; j++) {
        int li = backward ? L - 1 - j : j;
        for (int i = 0; i < n; i++) {
            douts[i] = mb__lstm_dout(ls[i], li);
            if (!backward && li < ls[i]->L) MB_TRY(mb__lstm_fused_project(ls[i], li));
        }
        MB_TRY(mb__lstm_fused_run(ls, douts, n, li, backward));
        for (int i = 0; !backward && i < n; i++)
            if (li < ls[i]->L) MB_TRY(mb__lstm_drop_forward(ls[i], li));
        for (int i = 0; backward && i < n; i++)
            if (li < ls[i]->L) {
                MB_TRY(mb__lstm_fused_grads(ls[i], li, li ? mb__lstm_dout(ls[i], li - 1) : calls[i].dx));
                MB_TRY(mb__lstm_drop_backward(ls[i], li));
                MB_TRY(mb__lstm_backward_tail(ls[i], li, calls[i].dh0, calls[i].dc0));
            }
    }
    for (int i = 0; !backward && i < n; i++) MB_TRY(mb__lstm_forward_end(ls[i], calls[i].out_seq, calls[i].h_last));
    return MB_OK;
}


// -- the lstm group's recurrence --
/* The one place that decides: full activation storage (no checkpointing) and the fused kernel
 * chosen (mb__lstm_fused_choice): its blocks a row tile; else (0) the per-step cuBLAS path. A
 * forced count that does not fit is refused. */
static mb_result mb__cuda_lstm_create(mb_lstm *l) {
    mb__cuda_lstm *st = (mb__cuda_lstm *)mb__host_calloc(1, sizeof *st);
    if (!st) return MB_FAIL(mb__lstm_log(l), MB_ERR_OUT_OF_MEMORY, "mb_lstm_create: no host memory");
    l->be_lstm = st;
    st->fused = l->interval_max == 0 ? mb__lstm_fused_choice(l->dev, l->H, l->op, l->cfg.fused_blocks) : 0;
    l->fused_blocks = st->fused;
    if (l->cfg.fused_blocks > 0 && !st->fused) return mb__lstm_fused_refused(l);
    return st->fused ? mb__lstm_fused_alloc(l) : MB_OK;
}

static void mb__cuda_lstm_destroy(mb_lstm *l) {
    if (!l->be_lstm) return;
    mb__lstm_fused_free(l);
    MB_FREE(l->be_lstm);
    l->be_lstm = NULL;
}

/* The fused workspace, where full storage would run the fused kernel. */
static size_t mb__cuda_lstm_full_extra(mb_device *dev, const mb_lstm_config *c) {
    if (!mb__lstm_fused_choice(dev, c->hidden_size, c->precision, c->fused_blocks)) return 0;
    return mb__lstm_fused_bytes(c->max_batch, c->max_steps, c->input_size, c->hidden_size, c->precision);
}

static mb_result mb__cuda_lstm_layer_forward(mb_lstm *l, int li) {
    if (!mb__cuda_lstm_of(l)->fused) return mb__lstm_steps_forward(l, li);
    MB_TRY(mb__lstm_fused_project(l, li));
    return mb__lstm_fused_run(&l, NULL, 1, li, 0);
}

static mb_result mb__cuda_lstm_layer_backward(mb_lstm *l, int li, const float *dout, float *d_in) {
    if (!mb__cuda_lstm_of(l)->fused) return mb__lstm_steps_backward(l, li, dout, d_in);
    MB_TRY(mb__lstm_fused_run(&l, &dout, 1, li, 1));
    return mb__lstm_fused_grads(l, li, d_in);
}


static const mb__lstm_ops mb__cuda_lstm_ops = {
    .create = mb__cuda_lstm_create, .destroy = mb__cuda_lstm_destroy, .full_extra = mb__cuda_lstm_full_extra,
    .layer_forward = mb__cuda_lstm_layer_forward, .layer_backward = mb__cuda_lstm_layer_backward,
    .many = mb__cuda_lstm_many,
    .fwd_gates = mb__cuda_lstm_fwd_gates, .bwd_gates = mb__cuda_lstm_bwd_gates, .copy_strided = mb__cuda_copy_strided,
    .add = mb__cuda_add, .fill = mb__cuda_fill,
};

// ---- cuda end lstm ----

// ---- cuda layers ----
// Kernels of the numerics modules (layers, loss, amp, optim). Element math is shared with
// the CPU path (the MB__HD helpers in megabatch.h); reductions are deterministic (fixed
// grids, no float atomics), so repeated runs give the same bits.

__global__ void mb__k_fill_rows(float *y, const float *b, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = b[i % (size_t)cols];
}

static mb_result mb__cuda_fill_rows(mb_device *dev, int stream, float *y, const float *b, int64_t rows, int64_t cols) {
    return MB__RUN_N(dev, stream, mb__k_fill_rows, (size_t)rows * (size_t)cols, y, b, rows, cols);
}

/* One thread per column, rows summed in order (the CPU's order: same bits). */
__global__ void mb__k_colsum_add(float *db, const float *dy, int64_t rows, int64_t cols) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int64_t i = 0; i < rows; i++) s += dy[i * cols + j];
        db[j] += s;
    }
}

static mb_result mb__cuda_colsum_add(mb_device *dev, int stream, float *db, const float *dy, int64_t rows,
                                     int64_t cols) {
    return MB__RUN(dev, stream, mb__k_colsum_add, mb__grid((size_t)cols, 128), 128, db, dy, rows, cols);
}

/* dy NULL: out = f(x); else out = f'(x) dy. */
__global__ void mb__k_act(mb_act a, const float *x, const float *dy, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = dy ? mb__act_df(a, x[i]) * dy[i] : mb__act_f(a, x[i]);
}

static mb_result mb__cuda_act(mb_device *dev, int stream, mb_act a, const float *x, const float *dy, float *out,
                              size_t n) {
    return MB__RUN_N(dev, stream, mb__k_act, n, a, x, dy, out, n);
}

/* The step: *step_dev when not NULL (read as the kernel runs: a graph replays new masks). */
__global__ void mb__k_dropout(float p, float ks, uint64_t seed, uint64_t step, const uint64_t *step_dev, const float *x,
                              float *y, size_t n) {
    if (step_dev) step = *step_dev;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = mb__dropout_elem(p, ks, seed, step, i, x[i]);
}

static mb_result mb__cuda_dropout(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step,
                                  const uint64_t *step_dev, const float *x, float *y, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_dropout, n, p, 1.0f / (1.0f - p), seed, step, step_dev, x, y, n);
}

__global__ void mb__k_step_add(uint64_t *c, uint64_t add) { *c += add; }

static mb_result mb__cuda_step_add(mb_device *dev, int stream, uint64_t *c, uint64_t add) {
    return MB__RUN(dev, stream, mb__k_step_add, 1, 1, c, add);
}

static const mb__layers_ops mb__cuda_layers_ops = {
    .fill_rows = mb__cuda_fill_rows, .colsum_add = mb__cuda_colsum_add, .act = mb__cuda_act, .dropout = mb__cuda_dropout,
    .step_add = mb__cuda_step_add,
};

// ---- cuda loss ----

#define MB__RED_THREADS 256

/* Block-wide sum of one double per thread (blockDim.x == MB__RED_THREADS); result in
 * thread 0. Fixed tree: deterministic. */
__device__ double mb__block_sum(double v) {
    __shared__ double sh[MB__RED_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = MB__RED_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* One block: the loss is small (B x K), and one block keeps the sum deterministic. */
__global__ void mb__k_loss(int huber, float delta, const float *pred, const float *target, size_t n, float scale,
                           const float *scale_dev, float *loss_out, float *dpred, double *meter, double w) {
    float coef = mb__loss_coef(scale, scale_dev, n), g;
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        acc += (double)mb__loss_elem(huber, delta, pred[i], target[i], &g);
        if (dpred) dpred[i] = g * coef;
    }
    double sum = mb__block_sum(acc);
    if (threadIdx.x != 0) return;
    if (loss_out) *loss_out = (float)(sum / (double)n);
    mb__loss_acc(meter, sum / (double)n, w);
}

static mb_result mb__cuda_loss(mb_device *dev, int stream, int huber, float delta, const float *pred,
                               const float *target, size_t n, float scale, const float *scale_dev, float *loss_out,
                               float *dpred, double *acc, double w) {
    return MB__RUN(dev, stream, mb__k_loss, 1, MB__RED_THREADS, huber, delta, pred, target, n, scale, scale_dev,
                   loss_out, dpred, acc, w);
}

static const mb__loss_ops mb__cuda_loss_ops = {.run = mb__cuda_loss};

// ---- cuda amp ----

__global__ void mb__k_unscale(mb_scaler_state *st, float *grad, size_t n) {
    float inv = (float)(1.0 / (double)st->scale);
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        bad |= !mb__finite_f(g);
        grad[i] = g * inv;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) st->found_inf = 1; /* every writer writes 1 */
}

static mb_result mb__cuda_unscale(mb_device *dev, mb_scaler_state *st, float *grad, size_t n) {
    return MB__RUN(dev, MB_STREAM_COMPUTE, mb__k_unscale, mb__grid_barrier(n, 256), 256, st, grad, n);
}

__global__ void mb__k_scaler_update(mb_scaler_state *st, mb__scaler_hp hp) { mb__scaler_update_state(st, &hp); }

static mb_result mb__cuda_scaler_update(mb_device *dev, mb_scaler_state *st, const mb__scaler_hp *hp) {
    return MB__RUN(dev, MB_STREAM_COMPUTE, mb__k_scaler_update, 1, 1, st, *hp);
}

static const mb__amp_ops mb__cuda_amp_ops = {.unscale = mb__cuda_unscale, .scaler_update = mb__cuda_scaler_update};

// ---- cuda optim ----

/* Pass 1: per-block sums of squares (double) over a grid fixed by n: MB__NORM_BLOCKS blocks, or
 * one per 256 elements when fewer do (the same partition: a thread sums the same elements, the
 * blocks left out would give 0). */
__global__ void mb__k_sumsq_partial(const float *grad, size_t n, double *partials) {
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)grad[i] * (double)grad[i];
    double s = mb__block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* Pass 2 (one block): total, norm, clip coefficient, inf check, step count, bias
 * corrections. reset_own: clear the optimizer's own found_inf first (no scaler). */
__global__ void mb__k_adamw_finalize(const double *partials, int nb, mb__adamw_dev *dv, int32_t *found_inf,
                                     int reset_own, mb__adamw_hp hp) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) acc += partials[i];
    double s = mb__block_sum(acc);
    if (threadIdx.x != 0) return;
    if (reset_own) *found_inf = 0;
    mb__adamw_finalize(dv, s, found_inf, &hp);
}

/* Pass 3: the fused AdamW update; a no-op when the step was skipped. */
__global__ void mb__k_adamw(mb__adamw_hp hp, const mb__adamw_dev *dvp, float *param, const float *grad, float *m,
                            float *v, const uint8_t *decay, size_t n) {
    if (dvp->skipped) return;
    mb__adamw_dev dv = *dvp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        mb__adamw_elem(&hp, &dv, decay[i / 64], &param[i], grad[i], &m[i], &v[i]);
}

static mb_result mb__cuda_adamw(mb_device *dev, const mb__adamw_hp *hp, mb__adamw_dev *dv, int32_t *found_inf,
                                float *param, const float *grad, float *m, float *v, const uint8_t *decay, size_t n,
                                double *partials) {
    const int C = MB_STREAM_COMPUTE;
    unsigned nb = mb__grid_barrier(n, MB__RED_THREADS);
    MB_TRY(MB__RUN(dev, C, mb__k_sumsq_partial, nb, MB__RED_THREADS, grad, n, partials));
    MB_TRY(MB__RUN(dev, C, mb__k_adamw_finalize, 1, MB__RED_THREADS, partials, (int)nb, dv, found_inf,
                   found_inf == &dv->own_found_inf, *hp));
    return MB__RUN_N(dev, C, mb__k_adamw, n, *hp, dv, param, grad, m, v, decay, n);
}

/* A weight average: the one-thread finalize (whether it runs, n_averaged), then the pass. */
__global__ void mb__k_avg_finalize(mb__avg_dev *st, const mb__adamw_dev *after) { mb__avg_finalize(st, after); }

__global__ void mb__k_avg(const mb__avg_dev *stp, int swa, float w, float *avg, const float *param, size_t n) {
    if (!stp->go) return;
    mb__avg_dev st = *stp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        avg[i] = mb__avg_elem(&st, swa, w, avg[i], param[i]);
}

static mb_result mb__cuda_avg(mb_device *dev, mb__avg_dev *st, const mb__adamw_dev *after, int swa, float w,
                              float *avg, const float *param, size_t n) {
    MB_TRY(MB__RUN(dev, MB_STREAM_COMPUTE, mb__k_avg_finalize, 1, 1, st, after));
    return MB__RUN_N(dev, MB_STREAM_COMPUTE, mb__k_avg, n, st, swa, w, avg, param, n);
}

__global__ void mb__k_swap(float *a, float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

static mb_result mb__cuda_avg_swap(mb_device *dev, float *a, float *b, size_t n) {
    return MB__RUN_N(dev, MB_STREAM_COMPUTE, mb__k_swap, n, a, b, n);
}

static const mb__optim_ops mb__cuda_optim_ops = {
    .adamw = mb__cuda_adamw, .avg = mb__cuda_avg, .avg_swap = mb__cuda_avg_swap,
};

// ---- cuda end optim ----

// ---- cuda step ----
// Events for mb_meter's reads: recorded after the copy into pinned memory, polled without waiting.

static mb_result mb__cuda_event_create(mb_device *dev, void **ev) {
    cudaEvent_t e;
    MB_CUDA_TRY(dev, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = (void *)e;
    return MB_OK;
}

static void mb__cuda_event_destroy(void *ev) { cudaEventDestroy((cudaEvent_t)ev); }

static mb_result mb__cuda_event_record(mb_device *dev, int stream, void *ev) {
    MB_CUDA_TRY(dev, cudaEventRecord((cudaEvent_t)ev, mb__st(dev, stream)));
    return MB_OK;
}

static mb_result mb__cuda_event_done(mb_device *dev, void *ev, int wait, int *done) {
    if (wait) MB_CUDA_TRY(dev, cudaEventSynchronize((cudaEvent_t)ev));
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) cudaGetLastError(); /* not an error: still running */
    else MB_CUDA_TRY(dev, e);
    return MB_OK;
}

static const mb__step_ops mb__cuda_step_ops = {
    .event_create = mb__cuda_event_create, .event_destroy = mb__cuda_event_destroy,
    .event_record = mb__cuda_event_record, .event_done = mb__cuda_event_done,
};

// ---- cuda end step ----

// ---- cuda dist ----
// MEGABATCH_NCCL (with MEGABATCH_MPI; link -lnccl and MPI): the gradient all-reduce of
// CUDA params on the device, on the compute stream, no host sync: each rank scales its
// gradients by count / sum(counts) (the counts and the loss are summed on the host in
// rank order by mb_dist_sum, exact for the counts), then one ncclAllReduce (sum) of the
// flat buffer. The NCCL communicator is made on first use: rank 0's ncclUniqueId is
// broadcast through MPI. NCCL's ring/tree gives every rank the same result; its order is
// NCCL's (fixed for a given topology, world size and NCCL_ALGO), not the CPU path's rank
// order. Compiled by `make cuda`; not run on a GPU yet; runs under the simulator, whose NCCL
// is MPI (tests/cudasim/mpi.sh).
#if defined(MEGABATCH_MPI) && defined(MEGABATCH_NCCL)
#include <nccl.h>

static mb_result mb__nccl_check(mb_dist *d, ncclResult_t e, const char *call) {
    if (e == ncclSuccess) return MB_OK;
    return MB_FAIL(mb__dist_log(d), MB_ERR_CUDA, "%s failed: %s (NCCL %d)", call, ncclGetErrorString(e), (int)e);
}

__global__ void mb__k_dist_scale(float *g, float w, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) g[i] *= w;
}

static void mb__nccl_release(mb_dist *d) {
    if (d->comm_dev) ncclCommDestroy((ncclComm_t)d->comm_dev);
    d->comm_dev = NULL;
}

static mb_result mb__nccl_comm(mb_dist *d, mb_device *dev) {
    if (d->comm_dev) return MB_OK;
    ncclUniqueId id;
    if (d->rank == 0) MB_TRY(mb__nccl_check(d, ncclGetUniqueId(&id), "ncclGetUniqueId"));
    MB_TRY(mb__mpi(d, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, d->comm), "mb_dist: MPI_Bcast of the NCCL id"));
    MB_CUDA_TRY(dev, cudaSetDevice(dev->cfg.index));
    ncclComm_t c;
    MB_TRY(mb__nccl_check(d, ncclCommInitRank(&c, d->size, id, d->rank), "ncclCommInitRank"));
    d->comm_dev = (void *)c;
    d->comm_ops = dev->be->dist; /* this group: its release frees c */
    return MB_OK;
}

static mb_result mb__nccl_allreduce(mb_dist *d, mb_params *p, int64_t count, float *loss, int64_t *total) {
    mb_device *dev = mb_params_device(p);
    double v[2] = {(double)count, loss ? (double)*loss * (double)count : 0.0};
    MB_TRY(mb_dist_sum(d, v, 2)); /* rank order, the same on every rank */
    if (!(v[0] > 0)) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_allreduce_grads: no samples on any rank");
    MB_TRY(mb__nccl_comm(d, dev));
    size_t n = mb_params_total(p);
    MB_TRY(MB__RUN_N(dev, MB_STREAM_COMPUTE, mb__k_dist_scale, n, mb_params_grad(p), (float)((double)count / v[0]), n));
    MB_TRY(mb__nccl_check(d, ncclAllReduce(mb_params_grad(p), mb_params_grad(p), n, ncclFloat, ncclSum,
                                           (ncclComm_t)d->comm_dev, mb__st(dev, MB_STREAM_COMPUTE)), "ncclAllReduce"));
    if (loss) *loss = (float)(v[1] / v[0]);
    if (total) *total = (int64_t)v[0];
    d->stats.reductions++;
    d->stats.bytes_sent += (uint64_t)(2.0 * (double)(d->size - 1) / d->size * (double)n * sizeof(float));
    return MB_OK;
}
static const mb__dist_ops mb__cuda_dist_ops = {.allreduce_grads = mb__nccl_allreduce, .release = mb__nccl_release};
#define MB__CUDA_DIST (&mb__cuda_dist_ops)
#else
#define MB__CUDA_DIST NULL /* the host path */
#endif
// ---- cuda end dist ----

// ---- cuda graph ----
// Stream capture in thread-local mode: this thread may not sync or allocate while it captures
// (that fails the capture), other threads (the loader's copies on their own stream) carry on.

static mb_result mb__cuda_graph_begin(mb_device *dev, int stream) {
    MB_CUDA_TRY(dev, cudaStreamBeginCapture(mb__st(dev, stream), cudaStreamCaptureModeThreadLocal));
    return MB_OK;
}

static mb_result mb__cuda_graph_end(mb_device *dev, int stream, void **exec, size_t *nodes) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(mb__st(dev, stream), &graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        int capture = e >= cudaErrorStreamCaptureUnsupported && e <= cudaErrorStreamCaptureWrongThread;
        return MB_FAIL(&dev->cfg.log, capture ? MB_ERR_UNSUPPORTED : MB_ERR_CUDA,
                       "mb_graph_end: the capture on stream %d failed: %s (%s)%s", stream, cudaGetErrorString(e),
                       cudaGetErrorName(e), capture ? "; something in it cannot be captured (a host sync, an "
                       "allocation, or a wait on work issued outside the capture)" : "");
    }
    cudaGraphExec_t x = NULL;
    mb_result r = mb__cuda_check(dev, cudaGraphGetNodes(graph, NULL, nodes), "cudaGraphGetNodes", __FILE__, __LINE__);
    if (r == MB_OK) r = mb__cuda_check(dev, cudaGraphInstantiate(&x, graph, 0), "cudaGraphInstantiate", __FILE__, __LINE__);
    cudaGraphDestroy(graph); /* the instantiated graph is a copy */
    *exec = (void *)x;
    return r;
}

static mb_result mb__cuda_graph_launch(mb_device *dev, int stream, void *exec) {
    MB_CUDA_TRY(dev, cudaGraphLaunch((cudaGraphExec_t)exec, mb__st(dev, stream)));
    return MB_OK;
}

static void mb__cuda_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

static const mb__graph_ops mb__cuda_graph_ops = {
    .begin = mb__cuda_graph_begin, .end = mb__cuda_graph_end, .launch = mb__cuda_graph_launch,
    .destroy = mb__cuda_graph_destroy,
};

// ---- cuda end graph ----

// ---- cuda backend ----
// The CUDA table: the groups that close each section above (see "backend" in megabatch.h).

static const mb__backend mb__cuda_table = {
    .name = "cuda",
    /* not host: streams and kernels; full-storage LSTM when memory allows; AdamW's
     * sum-of-squares partials */
    .caps = {.host = 0, .adamw_scratch = MB__NORM_BLOCKS * sizeof(double)},
    .rt = &mb__cuda_runtime_ops,
    .gemm = &mb__cuda_gemm_ops,
    .params = &mb__cuda_params_ops,
    .series = &mb__cuda_series_ops,
    .lstm = &mb__cuda_lstm_ops,
    .layers = &mb__cuda_layers_ops,
    .loss = &mb__cuda_loss_ops,
    .amp = &mb__cuda_amp_ops,
    .optim = &mb__cuda_optim_ops,
    .step = &mb__cuda_step_ops,
    .dist = MB__CUDA_DIST, /* NCCL when built with it */
    .graph = &mb__cuda_graph_ops,
};

static const mb__backend *mb__cuda_backend(void) { return &mb__cuda_table; }

// ---- cuda end backend ----

#endif /* MEGABATCH_CUDA_IMPLEMENTATION_INCLUDED */
#endif /* MEGABATCH_IMPLEMENTATION */
