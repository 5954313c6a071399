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

static inline cudaStream_t mb__st(const mb_device *dev, int stream) { return (cudaStream_t)dev->stream[stream]; }

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
    return (stream >= 0 && stream < dev->streams) ? mb__st(dev, stream) : (cudaStream_t)0;
}

/* Grid size for a grid-stride loop over n elements. */
static inline unsigned mb__grid(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 65535u * 8u ? 65535u * 8u : g);
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
    dev->cuda_index = dev->cfg.index;
    MB_CUDA_TRY(dev, cudaSetDevice(dev->cuda_index));
    cudaDeviceProp prop;
    MB_CUDA_TRY(dev, cudaGetDeviceProperties(&prop, dev->cuda_index));
    snprintf(dev->name, sizeof dev->name, "%.200s (sm_%d%d, %zu MiB)", prop.name, prop.major, prop.minor,
             prop.totalGlobalMem >> 20);
    mb_result r = MB_OK;
    for (int i = 0; i < dev->streams && r == MB_OK; i++) {
        cudaStream_t s;
        cudaEvent_t ev;
        r = mb__cuda_check(dev, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", __FILE__, __LINE__);
        if (r != MB_OK) break;
        dev->stream[i] = (void *)s;
        r = mb__cuda_check(dev, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate", __FILE__, __LINE__);
        if (r == MB_OK) dev->event[i] = (void *)ev;
    }
    for (int i = 0; i < dev->streams && r == MB_OK; i++) { /* one handle per stream */
        cublasHandle_t h = NULL;
        r = mb__cuda_check(dev, cublasCreate(&h), "cublasCreate", __FILE__, __LINE__);
        dev->cublas_on[i] = (void *)h;
        if (r == MB_OK) r = mb__cuda_check(dev, cublasSetStream(h, mb__st(dev, i)), "cublasSetStream", __FILE__, __LINE__);
    }
    dev->cublas = dev->cublas_on[MB_STREAM_COMPUTE];
    if (r == MB_OK) r = mb__cuda_set_tf32(dev, dev->tf32);
    if (r != MB_OK) mb__cuda_close(dev);
    return r;
}

static void mb__cuda_close(mb_device *dev) {
    cudaSetDevice(dev->cuda_index);
    cudaDeviceSynchronize();
    for (int i = 0; i < dev->streams; i++) {
        if (dev->cublas_on[i]) cublasDestroy((cublasHandle_t)dev->cublas_on[i]);
        dev->cublas_on[i] = NULL;
        if (dev->event[i]) cudaEventDestroy((cudaEvent_t)dev->event[i]);
        if (dev->stream[i]) cudaStreamDestroy(mb__st(dev, i));
    }
    dev->cublas = NULL;
    cudaGetLastError();
}

static mb_result mb__cuda_set_tf32(mb_device *dev, int on) {
    for (int i = 0; i < dev->streams; i++)
        MB_CUDA_TRY(dev, cublasSetMathMode((cublasHandle_t)dev->cublas_on[i],
                                      on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return MB_OK;
}

static mb_result mb__cuda_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    MB_CUDA_TRY(dev, cudaSetDevice(dev->cuda_index));
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
    cudaEvent_t ev = (cudaEvent_t)dev->event[waited];
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
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = st == MB_F32 ? ((const float *)src)[i]
                  : st == MB_BF16 ? mb_bf16_to_f32(((const uint16_t *)src)[i]) : mb_f16_to_f32(((const uint16_t *)src)[i]);
        if (dt == MB_F32) ((float *)dst)[i] = v;
        else ((uint16_t *)dst)[i] = dt == MB_BF16 ? mb_f32_to_bf16(v) : mb_f32_to_f16(v);
    }
}

static mb_result mb__cuda_convert(mb_device *dev, int stream, void *dst, mb_dtype dt, const void *src, mb_dtype st,
                                  size_t n) {
    return MB__RUN_N(dev, stream, mb__k_convert, n, dst, dt, src, st, n);
}

// ---- cuda gemm ----
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands
// and hand cuBLAS the same buffers.

static cudaDataType_t mb__cuda_type(mb_dtype t) {
    return t == MB_F32 ? CUDA_R_32F : t == MB_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

static mb_result mb__cuda_gemm(mb_device *dev, const mb_gemm_args *g) {
    cublasHandle_t h = (cublasHandle_t)dev->cublas_on[g->stream]; /* bound to g->stream at open */
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

// ---- cuda dataset ----

// ---- cuda end dataset ----

// ---- cuda loader ----
// The reader thread issues copies on this device's streams: make it current there.

static void mb__cuda_thread_init(mb_device *dev) {
    cudaSetDevice(dev->cuda_index);
    cudaGetLastError();
}

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

__global__ void mb__k_series_gather(mb__gather g) {
    if (g.es == 4) mb__series_gather_elems<uint32_t>(g);
    else mb__series_gather_elems<uint16_t>(g);
}

static mb_result mb__cuda_series_gather(mb_device *dev, int stream, const mb__gather *g) {
    size_t n = (size_t)g->count * ((size_t)g->t * g->row + g->trow) / (size_t)g->es;
    return MB__RUN_N(dev, stream, mb__k_series_gather, n, *g);
}
// ---- cuda end series ----

// ---- cuda lstm ----
// The LSTM's elementwise kernels: fused gates (forward), gate gradients (backward), the
// strided row copy (batch-major <-> time-major), add and fill. The math is mb__lstm_cell_fwd/bwd
// from megabatch.h, shared with the CPU; the gemms go through mb_gemm (cuBLAS).

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

__global__ void mb__k_lstm_copy3(float *dst, int64_t ds0, int64_t ds1, const float *src, int64_t ss0, int64_t ss1,
                                 int64_t n0, int64_t n1, int64_t d) {
    int64_t n = n0 * n1 * d;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t q = e % d, r = e / d, j = r % n1, i = r / n1; /* row (i, j), element q */
        dst[i * ds0 + j * ds1 + q] = src[i * ss0 + j * ss1 + q];
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

static mb_result mb__cuda_copy3(mb_device *dev, int stream, float *dst, int64_t ds0, int64_t ds1, const float *src,
                                int64_t ss0, int64_t ss1, int64_t n0, int64_t n1, int64_t d) {
    return MB__RUN_N(dev, stream, mb__k_lstm_copy3, n0 * n1 * d, dst, ds0, ds1, src, ss0, ss1, n0, n1, d);
}

static mb_result mb__cuda_add(mb_device *dev, int stream, float *y, const float *x, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_lstm_add, n, y, x, n);
}

static mb_result mb__cuda_fill(mb_device *dev, int stream, float *y, float v, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_lstm_fill, n, y, v, n);
}

// -- the fused recurrence --
// The persistent fused recurrence (docs/LSTM.md, "The fused recurrence on the GPU"). One launch
// runs a layer of every LSTM given (blocks = (LSTM, tile of MB__FUSED_ROWS batch rows)); each
// block keeps W_hh in shared memory for all T steps and per step computes the recurrent product
// (wmma tensor cores for bf16/f16, explicit FMA for f32), the gates and the cell update with the
// shared mb__lstm_cell_fwd/bwd. Batch rows are independent, so blocks never wait on each other.

#include <mma.h>

#ifndef MB_DYNAMIC_SHARED /* the simulator defines its own; nvcc: the launch's dynamic shared memory */
#define MB_DYNAMIC_SHARED(T, name) extern __shared__ __align__(32) T name[]
#endif

/* Round v into an operand element (f32: as is). */
__device__ inline void mb__fput(float *p, float v) { *p = v; }
__device__ inline void mb__fput(__nv_bfloat16 *p, float v) { *(uint16_t *)p = mb_f32_to_bf16(v); }
__device__ inline void mb__fput(__half *p, float v) { *(uint16_t *)p = mb_f32_to_f16(v); }

/* The block's shared memory (sizes: mb__lstm_fused_smem): W_hh as (4 Hp, Hp), row q*Hp + j =
 * gate q unit j, zero padded; the operand tile (16 x 4Hp: h forward, dg backward); the f32
 * product (16 x 4Hp forward, 16 x Hp backward) and dc (16 x Hp). */
template <class T> struct mb__fsm {
    T *w, *tile;
    float *acc, *dc;
    int Hp;
};
template <class T> __device__ mb__fsm<T> mb__fused_carve(unsigned char *sm, int H) {
    mb__fsm<T> s;
    s.Hp = (H + 15) / 16 * 16;
    size_t w = (size_t)4 * s.Hp * s.Hp * sizeof(T), tile = (size_t)MB__FUSED_ROWS * 4 * s.Hp * sizeof(T);
    s.w = (T *)sm;
    s.tile = (T *)(sm + w);
    s.acc = (float *)(sm + w + tile);
    s.dc = s.acc + MB__FUSED_ROWS * 4 * s.Hp;
    return s;
}

/* This block's descriptor and row tile. */
__device__ inline mb__fused_desc mb__fused_find(const mb__fused_args &a, int *tile) {
    int b = (int)blockIdx.x, i = 0;
    while (i + 1 < a.n && b >= a.d[i + 1].tile0) i++;
    *tile = b - a.d[i].tile0;
    return a.d[i];
}

/* W_hh (4H, H) into shared memory, zero padded; the tile zeroed (padding rows and columns). */
template <class T> __device__ void mb__fused_setup(const mb__fsm<T> &s, const void *whh, int H) {
    int Hp = s.Hp;
    for (int e = threadIdx.x; e < 4 * Hp * Hp; e += blockDim.x) {
        int n = e / Hp, k = e % Hp, q = n / Hp, j = n % Hp;
        if (j < H && k < H) s.w[e] = ((const T *)whh)[((size_t)q * H + j) * H + k];
        else mb__fput(&s.w[e], 0.0f);
    }
    for (int e = threadIdx.x; e < MB__FUSED_ROWS * 4 * Hp; e += blockDim.x) {
        mb__fput(&s.tile[e], 0.0f);
        s.acc[e] = 0.0f;
    }
    for (int e = threadIdx.x; e < MB__FUSED_ROWS * Hp; e += blockDim.x) s.dc[e] = 0.0f;
}

/* acc (16 x N) = a (16 x K) times B, B(k, n) = bm[n K + k] (bt) or bm[k N + n]. f32: one
 * thread per output, a fixed-order chain of explicit FMAs (no contraction choices left). */
__device__ inline void mb__fused_mm(const float *a, const float *bm, float *acc, int K, int N, int bt) {
    for (int e = threadIdx.x; e < MB__FUSED_ROWS * N; e += blockDim.x) {
        int r = e / N, n = e % N;
        float s = 0.0f;
        for (int k = 0; k < K; k++) s = __fmaf_rn(a[r * K + k], bt ? bm[(size_t)n * K + k] : bm[(size_t)k * N + n], s);
        acc[e] = s;
    }
}
/* bf16 / f16: tensor cores, one warp per 16-column tile of the output, f32 accumulation. */
template <class T> __device__ void mb__fused_wmma(const T *a, const T *bm, float *acc, int K, int N, int bt) {
    using namespace nvcuda;
    for (int nt = (int)(threadIdx.x / 32); nt < N / 16; nt += (int)(blockDim.x / 32)) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        wmma::fill_fragment(c, 0.0f);
        for (int kt = 0; kt < K / 16; kt++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, a + kt * 16, (unsigned)K);
            if (bt) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, bm + (size_t)nt * 16 * K + kt * 16, (unsigned)K);
                wmma::mma_sync(c, fa, fb, c);
            } else {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fb, bm + (size_t)kt * 16 * N + nt * 16, (unsigned)N);
                wmma::mma_sync(c, fa, fb, c);
            }
        }
        wmma::store_matrix_sync(acc + nt * 16, c, (unsigned)N, wmma::mem_row_major);
    }
}

__device__ inline void mb__fused_mm(const __half *a, const __half *bm, float *acc, int K, int N, int bt) {
    mb__fused_wmma(a, bm, acc, K, N, bt);
}
__device__ inline void mb__fused_mm(const __nv_bfloat16 *a, const __nv_bfloat16 *bm, float *acc, int K, int N, int bt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 /* no bf16 tensor cores before sm_80: FMA */
    for (int e = threadIdx.x; e < MB__FUSED_ROWS * N; e += blockDim.x) {
        int r = e / N, n = e % N;
        float s = 0.0f;
        for (int k = 0; k < K; k++)
            s = __fmaf_rn(__bfloat162float(a[r * K + k]),
                          __bfloat162float(bt ? bm[(size_t)n * K + k] : bm[(size_t)k * N + n]), s);
        acc[e] = s;
    }
#else
    mb__fused_wmma(a, bm, acc, K, N, bt);
#endif
}

/* A block's start: its descriptor, shared memory and rows [r0, r0 + nr); W_hh loaded. */
template <class T> struct mb__fblock {
    mb__fused_desc d;
    mb__fsm<T> s;
    int r0, nr;
};
template <class T> __device__ mb__fblock<T> mb__fused_begin(const mb__fused_args &a, unsigned char *sm) {
    mb__fblock<T> k;
    int tile;
    k.d = mb__fused_find(a, &tile);
    k.s = mb__fused_carve<T>(sm, k.d.H);
    k.r0 = tile * MB__FUSED_ROWS;
    k.nr = k.d.B - k.r0 < MB__FUSED_ROWS ? k.d.B - k.r0 : MB__FUSED_ROWS;
    mb__fused_setup(k.s, k.d.whh, k.d.H);
    __syncthreads();
    return k;
}

/* Forward over all T steps: gates g (T, B, 4H) in: x W_ih^T, out: activated; cells cs and
 * outputs hs (T+1, B, H) from slot 0; hs_op: hs in the operand type (low precision). */
template <class T> __global__ void mb__k_lstm_fused_fwd(mb__fused_args a) {
    MB_DYNAMIC_SHARED(unsigned char, mb__fsm_bytes);
    const mb__fblock<T> k = mb__fused_begin<T>(a, mb__fsm_bytes);
    const mb__fused_desc &d = k.d;
    const int H = d.H, Hp = k.s.Hp, r0 = k.r0, nr = k.nr;
    for (int e = threadIdx.x; e < nr * H; e += blockDim.x) /* h0: rounded as mb_convert rounds */
        mb__fput(&k.s.tile[(e / H) * Hp + e % H], d.hs[(r0 + e / H) * (size_t)H + e % H]);
    __syncthreads();
    for (int t = 0; t < d.T; t++) {
        mb__fused_mm(k.s.tile, k.s.w, k.s.acc, Hp, 4 * Hp, 1);
        __syncthreads();
        for (int e = threadIdx.x; e < nr * H; e += blockDim.x) {
            int r = e / H, j = e % H;
            size_t row = (size_t)t * d.B + r0 + r;
            float *g4 = d.g + row * 4 * H, h;
            for (int q = 0; q < 4; q++) g4[q * H + j] += k.s.acc[r * 4 * Hp + q * Hp + j];
            mb__lstm_cell_fwd(g4, H, j, d.bih[j] + d.bhh[j], d.bih[H + j] + d.bhh[H + j],
                              d.bih[2 * H + j] + d.bhh[2 * H + j], d.bih[3 * H + j] + d.bhh[3 * H + j],
                              d.cs[row * H + j], &d.cs[(row + d.B) * H + j], &h);
            d.hs[(row + d.B) * H + j] = h;
            if (d.hs_op) mb__fput((T *)d.hs_op + (row + d.B) * H + j, h);
            mb__fput(&k.s.tile[r * Hp + j], h);
        }
        __syncthreads();
    }
}

/* Backward over all T steps, in reverse: dg (T, B, 4H) (and its operand copy dg_op) for the
 * weight-gradient gemms, dh0/dc0 (B, H) the gradients w.r.t. h0 and c0. */
template <class T> __global__ void mb__k_lstm_fused_bwd(mb__fused_args a) {
    MB_DYNAMIC_SHARED(unsigned char, mb__fsm_bytes);
    const mb__fblock<T> k = mb__fused_begin<T>(a, mb__fsm_bytes);
    const mb__fused_desc &d = k.d;
    const int H = d.H, Hp = k.s.Hp, r0 = k.r0, nr = k.nr;
    for (int t = d.T - 1; t >= 0; t--) {
        for (int e = threadIdx.x; e < nr * H; e += blockDim.x) {
            int r = e / H, j = e % H;
            size_t row = (size_t)t * d.B + r0 + r;
            float dc = k.s.dc[r * Hp + j], *dg4 = d.dg + row * 4 * H;
            mb__lstm_cell_bwd(d.g + row * 4 * H, H, j, d.cs[row * H + j], d.cs[(row + d.B) * H + j],
                              k.s.acc[r * Hp + j] + d.dout[row * H + j], &dc, dg4);
            k.s.dc[r * Hp + j] = dc;
            for (int q = 0; q < 4; q++) {
                mb__fput(&k.s.tile[r * 4 * Hp + q * Hp + j], dg4[q * H + j]);
                if (d.dg_op) mb__fput((T *)d.dg_op + row * 4 * H + q * H + j, dg4[q * H + j]);
            }
        }
        __syncthreads();
        mb__fused_mm(k.s.tile, k.s.w, k.s.acc, 4 * Hp, Hp, 0); /* dh_rec = dg W_hh */
        __syncthreads();
    }
    for (int e = threadIdx.x; e < nr * H; e += blockDim.x) {
        size_t o = (r0 + e / H) * (size_t)H + e % H;
        d.dh0[o] = k.s.acc[(e / H) * Hp + e % H];
        d.dc0[o] = k.s.dc[(e / H) * Hp + e % H];
    }
}

template <class T> static mb_result mb__cuda_lstm_fused_t(mb_device *dev, int stream, int backward,
                                                          const mb__fused_args *a, unsigned blocks, size_t smem) {
    void (*k)(mb__fused_args) = backward ? mb__k_lstm_fused_bwd<T> : mb__k_lstm_fused_fwd<T>;
    MB_CUDA_TRY(dev, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    MB_LAUNCH(k, blocks, MB__FUSED_THREADS, smem, mb__st(dev, stream))(*a); /* MB__RUN with dynamic shared memory */
    return mb__launched(dev, "mb__k_lstm_fused", __FILE__, __LINE__);
}

/* One launch for the a->n descriptors (all of operand type op); blocks: their row tiles. */
static mb_result mb__cuda_lstm_fused(mb_device *dev, int stream, mb_dtype op, int backward, const mb__fused_args *a,
                                     unsigned blocks) {
    int64_t H = 1;
    for (int i = 0; i < a->n; i++) H = a->d[i].H > H ? a->d[i].H : H;
    size_t smem = mb__lstm_fused_smem(H, op);
    if (op == MB_BF16) return mb__cuda_lstm_fused_t<__nv_bfloat16>(dev, stream, backward, a, blocks, smem);
    if (op == MB_F16) return mb__cuda_lstm_fused_t<__half>(dev, stream, backward, a, blocks, smem);
    return mb__cuda_lstm_fused_t<float>(dev, stream, backward, a, blocks, smem);
}

/* The shared memory a block may opt into on this device. */
static size_t mb__cuda_smem_optin(mb_device *dev) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev->cuda_index) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (size_t)v;
}

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

__global__ void mb__k_dropout(float p, float ks, uint64_t seed, uint64_t step, const float *x, float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = mb__dropout_elem(p, ks, seed, step, i, x[i]);
}

static mb_result mb__cuda_dropout(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step, const float *x,
                                  float *y, size_t n) {
    return MB__RUN_N(dev, stream, mb__k_dropout, n, p, 1.0f / (1.0f - p), seed, step, x, y, n);
}

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
    return MB__RUN_N(dev, MB_STREAM_COMPUTE, mb__k_unscale, n, st, grad, n);
}

__global__ void mb__k_scaler_update(mb_scaler_state *st, mb__scaler_hp hp) { mb__scaler_update_state(st, &hp); }

static mb_result mb__cuda_scaler_update(mb_device *dev, mb_scaler_state *st, const mb__scaler_hp *hp) {
    return MB__RUN(dev, MB_STREAM_COMPUTE, mb__k_scaler_update, 1, 1, st, *hp);
}

// ---- cuda optim ----

/* Pass 1: per-block sums of squares (double) over a fixed grid. */
__global__ void mb__k_sumsq_partial(const float *grad, size_t n, double *partials) {
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)grad[i] * (double)grad[i];
    double s = mb__block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* Pass 2 (one block): total, norm, clip coefficient, inf check, step count, bias
 * corrections. reset_own: clear the optimizer's own found_inf first (no scaler). */
__global__ void mb__k_adamw_finalize(const double *partials, mb__adamw_dev *dv, int32_t *found_inf, int reset_own,
                                     mb__adamw_hp hp) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < MB__NORM_BLOCKS; i += blockDim.x) acc += partials[i];
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
    MB_TRY(MB__RUN(dev, C, mb__k_sumsq_partial, MB__NORM_BLOCKS, MB__RED_THREADS, grad, n, partials));
    MB_TRY(MB__RUN(dev, C, mb__k_adamw_finalize, 1, MB__RED_THREADS, partials, dv, found_inf,
                   found_inf == &dv->own_found_inf, *hp));
    return MB__RUN_N(dev, C, mb__k_adamw, n, *hp, dv, param, grad, m, v, decay, n);
}

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

static void mb__nccl_destroy(mb_dist *d) {
    if (d->nccl) ncclCommDestroy((ncclComm_t)d->nccl);
    d->nccl = NULL;
}

static mb_result mb__nccl_comm(mb_dist *d, mb_device *dev) {
    if (d->nccl) return MB_OK;
    ncclUniqueId id;
    if (d->rank == 0) MB_TRY(mb__nccl_check(d, ncclGetUniqueId(&id), "ncclGetUniqueId"));
    MB_TRY(mb__mpi(d, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, d->comm), "mb_dist: MPI_Bcast of the NCCL id"));
    MB_CUDA_TRY(dev, cudaSetDevice(dev->cfg.index));
    ncclComm_t c;
    MB_TRY(mb__nccl_check(d, ncclCommInitRank(&c, d->size, id, d->rank), "ncclCommInitRank"));
    d->nccl = (void *)c;
    d->nccl_destroy = mb__nccl_destroy;
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
                                           (ncclComm_t)d->nccl, mb__st(dev, MB_STREAM_COMPUTE)), "ncclAllReduce"));
    if (loss) *loss = (float)(v[1] / v[0]);
    if (total) *total = (int64_t)v[0];
    d->stats.reductions++;
    d->stats.bytes_sent += (uint64_t)(2.0 * (double)(d->size - 1) / d->size * (double)n * sizeof(float));
    return MB_OK;
}
#define MB__CUDA_ALLREDUCE mb__nccl_allreduce
#else
#define MB__CUDA_ALLREDUCE NULL
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

// ---- cuda end graph ----

// ---- cuda backend ----
// The CUDA table: the mb__cuda_* functions above (see "the backend table" in megabatch.h).

static const mb__backend *mb__cuda_backend(void) {
    static const mb__backend be = {
        /* name */ "cuda",
        mb__cuda_open, mb__cuda_close, mb__cuda_memory, mb__cuda_set_tf32, mb__cuda_alloc, mb__cuda_dealloc,
        /* copies and streams */
        mb__cuda_copy, mb__cuda_copy_2d, mb__cuda_zero, mb__cuda_convert, mb__cuda_stream_wait, mb__cuda_sync,
        mb__cuda_thread_init,
        /* gemm, params */
        mb__cuda_gemm, mb__cuda_fill_uniform,
        /* lstm */
        mb__cuda_lstm_fwd_gates, mb__cuda_lstm_bwd_gates, mb__cuda_copy3, mb__cuda_add, mb__cuda_fill,
        /* layers, loss, amp */
        mb__cuda_fill_rows, mb__cuda_colsum_add, mb__cuda_act, mb__cuda_dropout, mb__cuda_loss, mb__cuda_unscale,
        mb__cuda_scaler_update,
        /* optim: the sum-of-squares partials */
        MB__NORM_BLOCKS * sizeof(double), mb__cuda_adamw,
        /* dist: NCCL when built with it */
        MB__CUDA_ALLREDUCE,
        /* step */
        mb__cuda_event_create, mb__cuda_event_destroy, mb__cuda_event_record, mb__cuda_event_done,
        /* lstm_full_auto: full storage when memory allows */
        1,

        /* series */
        mb__cuda_series_gather,

        /* lstm: the fused recurrence */
        mb__cuda_smem_optin, mb__cuda_lstm_fused,
        /* graph: stream capture */
        mb__cuda_graph_begin, mb__cuda_graph_end, mb__cuda_graph_launch, mb__cuda_graph_destroy,
    };
    return &be;
}

// ---- cuda end backend ----

#endif /* MEGABATCH_CUDA_IMPLEMENTATION_INCLUDED */
#endif /* MEGABATCH_IMPLEMENTATION */
