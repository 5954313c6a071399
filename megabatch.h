/* megabatch.h - train LSTM time-series models fast on one GPU, with a CPU backend
 * that runs the same API anywhere.  Header-only, stb style.
 *
 *   #define MEGABATCH_IMPLEMENTATION   // in exactly one translation unit
 *   #include "megabatch.h"             // CPU backend
 *
 * For the CUDA backend include "megabatch_cuda.cuh" instead (it includes this file)
 * in a translation unit compiled by nvcc.
 *
 * Options (define before including):
 *   MEGABATCH_IMPLEMENTATION  compile the implementation in this translation unit
 *   MEGABATCH_STATIC          make every public function static (private copy per TU)
 *   MEGABATCH_NO_CBLAS        CPU gemm in plain C instead of CBLAS (OpenBLAS)
 *   MEGABATCH_NO_HDF5         in-memory datasets only, no HDF5 dependency
 *   MEGABATCH_NO_THREADS      no pthreads (everything runs on the calling thread)
 *   MB_MALLOC/MB_FREE         host allocator (define both or neither)
 *   MB_ASSERT                 assertion for programmer errors (default: assert)
 *   MB_MAX_NAME, MB_MAX_RANK, MB_MAX_STREAMS, MB_MAX_ERROR   limits, see below
 *
 * Contents. The file is the API, then the implementation (under MEGABATCH_IMPLEMENTATION),
 * module by module in the same order, the data flow of docs/DESIGN.md ("Data flow"; that
 * document is the design: architecture, the backend interface, threads and streams). Each
 * module opens with the banner `// ---- name ----` in both parts (some also close with
 * `// ---- end name ----`); parts within a module are `// -- name --`. Within a module the
 * implementation follows the API's order where it can: a function is defined before its
 * callers (close before open, since open's failure path calls it; private helpers first).
 * README.md lists the same modules (tests/docs/modules.sh).
 *   core         results, the last error, logging, dtypes, overflow-checked sizes
 *   rng          Philox4x32-10 counter-based RNG (API only: inline, host and device)
 *   backend      (implementation only) the backend interface: the runtime group, the
 *                capabilities, and one op group per module, declared in that module and
 *                filled at the end of its CPU code (here) and of its CUDA section
 *   device       a CPU or GPU: streams, tracked memory, copies, conversions
 *   gemm         the one matrix multiply (CBLAS / cuBLAS); the CPU LSTM's own row-independent
 *                product kernels (AVX-512, AVX2+FMA, portable C)
 *   params       all parameters in one flat buffer, all gradients in another
 *   dataset      HDF5 or in-memory samples, validated, read by ranges
 *   loader       chunk planning, reader thread, device batches
 *   series       the series layout: bars once, windows gathered on the device
 *   lstm         multi-layer LSTM, forward and backward, checkpointed recompute
 *   layers       linear, activations, concat, dropout
 *   loss         MSE, Huber
 *   amp          the dynamic loss scaler
 *   optim        AdamW, global-norm clipping, LR schedules
 *   accum        gradient accumulation
 *   step         a step without host syncs: scheduled AdamW, the device loss meter
 *   checkpoint   crash-safe checkpoint files
 *   export       safetensors files
 *   dist         data parallel over MPI (NCCL for CUDA params)
 *   graph        capture a step once, replay it as one CUDA graph launch
 *   testing      test hooks (allocation-failure injection)
 *   cpu backend  (implementation only) the CPU backend's table: its groups by name
 * megabatch_cuda.cuh follows the same order with `// ---- cuda name ----` banners.
 *
 * Lifetime verbs: create/destroy for objects the library builds in memory (params, lstm,
 * scaler, adamw, ckpt writer); open/close for objects bound to something outside the
 * process's memory (device: a GPU or threads; dataset: a file; loader: a dataset and a
 * thread; ckpt reader and st file: a file; dist: an MPI world); init for plain structs
 * the caller owns, filled in place, with nothing to release (mb_linear, mb_accum).
 *
 * License: MIT (see LICENSE).
 */
#ifndef MEGABATCH_H
#define MEGABATCH_H

/* The implementation uses POSIX.1-2008 (clock_gettime, kill, fork, pthreads). Request it
 * before the first system header, so strict `-std=c11 -pedantic` builds declare them; a
 * translation unit that includes a system header first must define it itself (checked
 * in the implementation, with a clear #error). */
#if defined(MEGABATCH_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && \
    !defined(_DEFAULT_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif

#define MEGABATCH_VERSION_MAJOR 0
#define MEGABATCH_VERSION_MINOR 1
#define MEGABATCH_VERSION_PATCH 0
#define MEGABATCH_VERSION_STRING "0.1.0"

#include <stddef.h>
#include <stdint.h>

#ifdef MEGABATCH_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define MBDEF static __attribute__((unused)) /* a private copy need not use everything */
#else
#define MBDEF static
#endif
#else
#define MBDEF extern
#endif

#ifndef MB_MAX_NAME
#define MB_MAX_NAME 64      /* bytes of a tensor or dataset name, with the NUL */
#endif
#ifndef MB_MAX_RANK
#define MB_MAX_RANK 4       /* dimensions of a registered tensor */
#endif
#ifndef MB_MAX_STREAMS
#define MB_MAX_STREAMS 8    /* streams per device: compute, copy, then extra compute */
#endif
#ifndef MB_MAX_ERROR
#define MB_MAX_ERROR 1024   /* bytes of the thread-local last-error message */
#endif
#if MB_MAX_STREAMS < 2
#error "MB_MAX_STREAMS must be at least 2 (a compute and a copy stream)"
#endif
#if MB_MAX_RANK < 1 || MB_MAX_NAME < 8
#error "MB_MAX_RANK must be >= 1 and MB_MAX_NAME >= 8"
#endif

/* Functions usable from CUDA kernels too (the RNG, dtype conversions). */
#ifdef __CUDACC__
#define MB__HD __host__ __device__
#else
#define MB__HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---- core ----
// Results, the thread-local last error, logging, dtypes, overflow-checked sizes.

/* windows.h defines MB_OK (MessageBox's OK button) as a macro for 0, our MB_OK's value:
 * included before this header, its macro gives way to the enum; after it, both read 0. */
#if defined(_WIN32) && defined(MB_OK)
#undef MB_OK
#endif
typedef enum mb_result {
    MB_OK = 0,
    MB_ERR_INVALID_ARG = -1,   /* a bad argument or config field */
    MB_ERR_OUT_OF_MEMORY = -2, /* a host, pinned or device allocation failed */
    MB_ERR_OVERFLOW = -3,      /* a size or byte count does not fit, or exceeds a cap */
    MB_ERR_IO = -4,            /* reading or writing a file failed */
    MB_ERR_FORMAT = -5,        /* a file or dataset has the wrong shape, type or layout */
    MB_ERR_NONFINITE = -6,     /* NaN or Inf where finite numbers are required */
    MB_ERR_CUDA = -7,          /* a CUDA or cuBLAS call failed */
    MB_ERR_NO_DEVICE = -8,     /* the backend is not built in, or no such device */
    MB_ERR_UNSUPPORTED = -9,   /* a valid request this build or backend cannot do */
    MB_ERR_STATE = -10,        /* a call out of order (e.g. backward before forward) */
    MB_ERR_CORRUPT = -11       /* a checkpoint or file failed its integrity check */
} mb_result;

/* A short fixed text for a result code ("out of memory"). Never NULL. */
MBDEF const char *mb_result_string(mb_result r);

/* The detail of the last error raised on this thread: what failed, with names and
 * sizes, and the CUDA/HDF5 message where there is one. "" when none. */
MBDEF const char *mb_last_error(void);
MBDEF void mb_clear_error(void);

/* Propagate a failed result from a function that returns mb_result: `MB_TRY(mb_x(...));`
 * returns the result unchanged when it is not MB_OK (its message is already recorded). */
#define MB_TRY(expr) do { mb_result mb_try_r_ = (expr); if (mb_try_r_ != MB_OK) return mb_try_r_; } while (0)

typedef enum mb_log_level { MB_LOG_ERROR = 0, MB_LOG_WARN = 1, MB_LOG_INFO = 2, MB_LOG_DEBUG = 3 } mb_log_level;

/* Log callback: silent by default (no callback, nothing printed, ever). */
typedef void (*mb_log_fn)(mb_log_level level, const char *message, const char *file, int line,
                          void *user);
typedef struct mb_logger {
    mb_log_fn fn;     /* NULL: silent */
    void *user;       /* passed back to fn */
    mb_log_level max; /* highest level passed on; 0 (the default) means errors only */
} mb_logger;

/* A ready-made callback that prints "megabatch: LEVEL: message" to the FILE* in user
 * (stderr when user is NULL). */
MBDEF void mb_log_stderr(mb_log_level level, const char *message, const char *file, int line,
                         void *user);

/* Element types of tensors. f32 is the master type; bf16/f16 are storage types for
 * mixed precision (operands of gemm, device copies of data and weights). */
typedef enum mb_dtype { MB_F32 = 0, MB_BF16 = 1, MB_F16 = 2 } mb_dtype;
MBDEF size_t mb_dtype_size(mb_dtype t);       /* 4, 2, 2; 0 for an unknown value */
MBDEF const char *mb_dtype_name(mb_dtype t);  /* "f32", "bf16", "f16" */

/* Overflow-checked size arithmetic: return 0 and leave *out untouched on overflow. */
MBDEF int mb_size_mul(size_t a, size_t b, size_t *out);
MBDEF int mb_size_add(size_t a, size_t b, size_t *out);
/* Product of n dimensions (each must be >= 0) times elem_size. 0 on overflow. */
MBDEF int mb_size_product(const int64_t *dims, int n, size_t elem_size, size_t *out);

/* Round-to-nearest-even conversions (NaN stays NaN, overflow goes to Inf for f16). */
static inline MB__HD uint16_t mb_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x0040u); /* quiet NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
static inline MB__HD float mb_bf16_to_f32(uint16_t h) {
    union { float f; uint32_t u; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline MB__HD uint16_t mb_f32_to_f16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);            /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           /* rounds to Inf */
    if (a < 0x38800000u) {                                             /* f16 subnormal or 0 */
        if (a < 0x33000000u) return (uint16_t)sign;                    /* below half the least */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 (shifted by 13) */
    uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
static inline MB__HD float mb_f16_to_f32(uint16_t h) {
    union { float f; uint32_t u; } v;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) v.u = sign | 0x7f800000u | (m << 13);
    else if (e != 0) v.u = sign | ((e + 112u) << 23) | (m << 13);
    else if (m == 0) v.u = sign;
    else { /* subnormal: m * 2^-24 */
        v.f = (float)m * 5.9604644775390625e-8f;
        v.u |= sign;
    }
    return v.f;
}

// ---- rng ----
// Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND and
// PyTorch). Value i of stream s under seed k is a pure function of (k, s, i), so the CPU,
// a CUDA kernel, a recompute and a resumed run all draw the same bits.

typedef struct mb_u32x4 { uint32_t v[4]; } mb_u32x4;

static inline MB__HD mb_u32x4 mb_philox(uint64_t key, uint64_t stream, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    mb_u32x4 out;
    out.v[0] = c0; out.v[1] = c1; out.v[2] = c2; out.v[3] = c3;
    return out;
}
/* Uniform float in [0, 1) with 24 random bits: element i of (key, stream). */
static inline MB__HD float mb_rng_uniform(uint64_t key, uint64_t stream, uint64_t i) {
    mb_u32x4 r = mb_philox(key, stream, i >> 2);
    return (float)(r.v[i & 3] >> 8) * 5.9604644775390625e-8f;
}
/* Uniform in [-bound, bound): exact on every backend (one rounding, in the multiply). */
static inline MB__HD float mb_rng_symmetric(uint64_t key, uint64_t stream, uint64_t i, float bound) {
    return bound * (2.0f * mb_rng_uniform(key, stream, i) - 1.0f);
}

// ---- device ----
// One object per CPU or GPU: streams, cuBLAS handle, memory with live/peak counters and
// allocation-failure injection. Every other object lives on a device.

typedef enum mb_backend { MB_CPU = 0, MB_CUDA = 1 } mb_backend;
/* The CPU LSTM's own kernels (the recurrent product and the cell rows). All give the same
 * bits; AUTO (0) picks the widest this CPU runs. */
typedef enum mb_cpu_kernel {
    MB_CPU_KERNEL_AUTO = 0, MB_CPU_KERNEL_AVX512 = 1, MB_CPU_KERNEL_AVX2 = 2, MB_CPU_KERNEL_C = 3
} mb_cpu_kernel;

/* Where memory lives. On the CPU backend all three are host memory. */
typedef enum mb_mem_kind { MB_MEM_HOST = 0, MB_MEM_PINNED = 1, MB_MEM_DEVICE = 2, MB_MEM_KINDS = 3 } mb_mem_kind;

/* Streams: MB_STREAM_COMPUTE, MB_STREAM_COPY, then 2 .. streams-1 extra compute
 * streams for independent work (e.g. the five timeframe encoders). On the CPU backend
 * every operation completes before it returns, so streams only order nothing. */
enum { MB_STREAM_COMPUTE = 0, MB_STREAM_COPY = 1 };

/* Zero-initialise (`mb_device_config cfg = {0};`, also in C++): every 0 is the default.
 * No public config starts with an enum field, so `= {0}` compiles in C++ as well. */
typedef struct mb_device_config {
    int index;          /* GPU ordinal (CUDA); ignored on CPU */
    mb_backend backend; /* MB_CPU (default) or MB_CUDA */
    int streams;        /* total streams, 0 = 2 (compute + copy); at most MB_MAX_STREAMS */
    int threads;        /* CPU threads for BLAS and loops; 0 = library default */
    int tf32;           /* 1: allow TF32 tensor cores for f32 gemm (CUDA); 0: exact f32 */
    int keep_denormals; /* CPU: 0 (default) = flush-to-zero + denormals-are-zero while the library
                           computes (x86; the caller's state is restored), 1 = IEEE denormals */
    mb_cpu_kernel cpu_kernel; /* CPU: the LSTM's own kernels, AUTO (default) = the widest this CPU
                           runs; another (to measure or test a narrower one: the same bits) fails
                           with MB_ERR_UNSUPPORTED where this CPU or build lacks it */
    mb_logger log;      /* log callback; silent by default */
} mb_device_config;

typedef struct mb_device mb_device;

typedef struct mb_mem_stats {
    size_t live[MB_MEM_KINDS];   /* bytes allocated now, per kind */
    size_t peak[MB_MEM_KINDS];   /* highest live bytes seen, per kind */
    size_t count[MB_MEM_KINDS];  /* live allocations, per kind */
    uint64_t allocs[MB_MEM_KINDS]; /* allocations ever attempted, per kind */
} mb_mem_stats;

/* Open a device. cfg may be NULL (CPU, defaults). MB_CUDA from a build that did not
 * include megabatch_cuda.cuh, or on a machine without that GPU: MB_ERR_NO_DEVICE with
 * the reason in mb_last_error(). */
MBDEF mb_result mb_device_open(mb_device **out, const mb_device_config *cfg);
/* Close (NULL is fine). Frees nothing the caller still holds; warns through the logger
 * about allocations still live. */
MBDEF void mb_device_close(mb_device *dev);

MBDEF mb_backend mb_device_backend(const mb_device *dev); /* MB_CPU or MB_CUDA */
MBDEF const char *mb_device_name(const mb_device *dev);   /* "cpu (x86_64, 2 threads)", "NVIDIA H100 ..." */
MBDEF const mb_logger *mb_device_logger(const mb_device *dev); /* the config's logger (NULL for a NULL dev) */
/* Total and free memory of the device (host RAM for the CPU backend). */
MBDEF mb_result mb_device_memory(mb_device *dev, size_t *total, size_t *free_bytes);
MBDEF mb_mem_stats mb_device_mem_stats(const mb_device *dev);
MBDEF int mb_device_streams(const mb_device *dev);
/* The native stream handle (cudaStream_t) as void*; NULL on the CPU. The CUDA header has the
 * typed stream (mb_cuda_stream) and the cuBLAS handle (mb_device_cublas). */
MBDEF void *mb_device_stream(const mb_device *dev, int stream);
MBDEF mb_result mb_device_set_tf32(mb_device *dev, int on);
MBDEF int mb_device_tf32(const mb_device *dev);

/* Allocate bytes of the given kind (bytes may be 0: a valid unique pointer comes back).
 * Live and peak counters follow every allocation. Memory is not initialised; on the CPU it
 * starts on a 64-byte cache line. */
MBDEF mb_result mb_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out);
/* Free memory from mb_alloc (NULL is fine). */
MBDEF void mb_free(mb_device *dev, void *ptr);

/* Copy bytes between any two places (host, pinned, device) on a stream, asynchronously
 * where the backend can. */
MBDEF mb_result mb_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes);
MBDEF mb_result mb_zero(mb_device *dev, int stream, void *dst, size_t bytes);
/* Copy `rows` rows of `width` bytes: row r goes from src + r*src_pitch to
 * dst + r*dst_pitch (pitches >= width). One call for a strided view, e.g. one timeframe
 * segment (B, T_s, F) out of a batch (B, T, F). */
MBDEF mb_result mb_copy_2d(mb_device *dev, int stream, void *dst, size_t dst_pitch, const void *src,
                           size_t src_pitch, size_t width, size_t rows);
/* Convert n elements between dtypes (f32 <-> bf16/f16, or a plain copy for equal types)
 * on a stream, round to nearest even. dst and src are memory of this device. */
MBDEF mb_result mb_convert(mb_device *dev, int stream, void *dst, mb_dtype dst_type, const void *src,
                           mb_dtype src_type, size_t n);
/* `waiter` stream waits for all work queued so far on `waited` (an event, no host wait). */
MBDEF mb_result mb_stream_wait(mb_device *dev, int waiter, int waited);
/* The host waits for a stream (or, with stream = -1, the whole device). */
MBDEF mb_result mb_sync(mb_device *dev, int stream);

// ---- gemm ----
// The one matrix multiply every layer uses. Row-major:
//   C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i],  i < batch,
// op(A) is (m, k), op(B) is (k, n), C is (m, n); op transposes when trans_* is set.
// Operands f32, bf16 or f16 (A and B of one type), C f32 or the operand type;
// accumulation in f32 always. CUDA: cuBLAS (cublasGemmStridedBatchedEx). CPU: CBLAS
// (OpenBLAS), or plain C with MEGABATCH_NO_CBLAS; bf16/f16 operands are widened to f32.

typedef struct mb_gemm_args {
    int trans_a, trans_b;    /* 0 or 1 */
    int64_t m, n, k;         /* >= 0 each; any 0 makes the call a scale of C by beta */
    float alpha, beta;       /* beta = 1 accumulates (gradients) */
    mb_dtype ab_type;        /* type of A and B */
    mb_dtype c_type;         /* type of C: f32, or ab_type */
    const void *a; int64_t lda; int64_t stride_a; /* stride: elements between batches */
    const void *b; int64_t ldb; int64_t stride_b;
    void *c; int64_t ldc; int64_t stride_c;
    int64_t batch;           /* 0 or 1: one product */
    int stream;              /* device stream (default 0: compute) */
} mb_gemm_args;

/* Validates shapes and leading dimensions (lda >= columns of stored A, ...). */
MBDEF mb_result mb_gemm(mb_device *dev, const mb_gemm_args *g);

// ---- params ----
// All parameters in one flat f32 buffer, all gradients in another (same layout), so
// unscale, norm, clip, AdamW and checkpoints are single passes over one array each.
// Register tensors, then finalize (one allocation each), then take views.

typedef struct mb_param_info {
    char name[MB_MAX_NAME];
    int rank;
    int64_t shape[MB_MAX_RANK];
    size_t offset;  /* in elements from the start of the flat buffer (64-element aligned) */
    size_t count;   /* elements */
    float init_bound; /* init: uniform in [-b, b); 0 = zeros */
    int no_decay;   /* 1: optimizers skip weight decay (biases by default) */
} mb_param_info;

typedef struct mb_params mb_params;

/* An empty set of parameters on dev; destroy frees its buffers (NULL is fine). */
MBDEF mb_result mb_params_create(mb_params **out, mb_device *dev);
MBDEF void mb_params_destroy(mb_params *p);
/* Register a tensor before mb_params_finalize. init_bound: uniform(-b, b) init (PyTorch
 * uses 1/sqrt(hidden) for LSTMs and 1/sqrt(fan_in) for linear layers); 0 initialises to
 * zero. Tensors of rank 1 are marked no_decay (biases). Returns its index in *index. */
MBDEF mb_result mb_params_add(mb_params *p, const char *name, int rank, const int64_t *shape,
                              float init_bound, int *index);
/* Allocate the flat parameter and gradient buffers on the device (grads zeroed). */
MBDEF mb_result mb_params_finalize(mb_params *p);
MBDEF int mb_params_num_tensors(const mb_params *p);
MBDEF const mb_param_info *mb_params_info(const mb_params *p, int index);
MBDEF int mb_params_find(const mb_params *p, const char *name); /* -1 when absent */
MBDEF size_t mb_params_total(const mb_params *p);     /* elements in each flat buffer */
MBDEF float *mb_params_data(mb_params *p);            /* flat parameters (device memory) */
MBDEF float *mb_params_grad(mb_params *p);            /* flat gradients (device memory) */
MBDEF float *mb_params_tensor(mb_params *p, int index);      /* view into data */
MBDEF float *mb_params_tensor_grad(mb_params *p, int index); /* view into grad */
MBDEF mb_device *mb_params_device(const mb_params *p);
/* Initialise every tensor from seed: element j of tensor t is
 * mb_rng_symmetric(seed, t, j, init_bound) - the same bits on every backend. */
MBDEF mb_result mb_params_init(mb_params *p, uint64_t seed);
MBDEF mb_result mb_params_zero_grad(mb_params *p);
/* Copy all parameters to/from a host array of mb_params_total() floats. */
MBDEF mb_result mb_params_get(mb_params *p, float *host);
MBDEF mb_result mb_params_set(mb_params *p, const float *host);

// ---- dataset ----
// Open and validate `features` (N, T, F) and `targets` (N, K) (HDF5 file or caller's
// arrays), read sample ranges [start, end) straight into caller buffers as float32.

#ifndef MB_MAX_SEGMENTS
#define MB_MAX_SEGMENTS 16  /* entries of the `segments` attribute (timeframes) */
#endif

/* What to do with NaN/Inf in a sample (features or targets), applied as data is read. */
typedef enum mb_nan_policy {
    MB_NAN_ERROR = 0, /* default: MB_ERR_NONFINITE naming the first bad sample index */
    MB_NAN_SKIP = 1,  /* drop the sample (reads return fewer rows) */
    MB_NAN_ZERO = 2   /* replace each non-finite value by 0 */
} mb_nan_policy;

typedef struct mb_dataset_config {
    const char *features_name; /* NULL: "features" (rank 3: N, T, F) */
    const char *targets_name;  /* NULL: "targets" (rank 2: N, K, or rank 1: K = 1) */
    mb_nan_policy nan_policy;  /* default MB_NAN_ERROR */
    size_t max_bytes;          /* cap on the float32 bytes of features + targets; 0 = 1 TiB */
    size_t chunk_cache_bytes;  /* HDF5 chunk cache per dataset; 0 = enough for one row of
                                  HDF5 chunks across T and F, at least 16 MiB */
    mb_logger log;             /* silent by default */
    int isolate;               /* 1: mb_dataset_open_file first runs mb_dataset_probe on the file (a
                                  child process), so a crash inside HDF5 becomes an error; 0 (the
                                  default): no probe (it costs a fork, see docs/RELIABILITY.md) */
    double probe_timeout_s;    /* mb_dataset_probe: a child still busy after this is killed;
                                  0 = 10 seconds */
} mb_dataset_config;

/* Shape and metadata of an open dataset. */
typedef struct mb_dataset_meta {
    int64_t n, t, f, k;              /* features (n, t, f), targets (n, k) */
    int segments;                    /* entries in segment_len; 0: no `segments` attribute */
    int64_t segment_len[MB_MAX_SEGMENTS];           /* e.g. 480,288,192,96,48; sum = t */
    char segment_name[MB_MAX_SEGMENTS][MB_MAX_NAME]; /* from `segment_names`, "" when absent */
    size_t bytes_per_sample;         /* float32: t*f*4 + k*4 */
    size_t total_bytes;              /* n * bytes_per_sample */
    char features_type[32];          /* stored type, e.g. "float32", "float64", "int16" */
    char targets_type[32];
    char source[256];                /* file path, or "memory" */
    int layout;                      /* MB_LAYOUT_WINDOW (0) or MB_LAYOUT_SERIES (// ---- series ----) */
    int64_t bars[MB_MAX_SEGMENTS];   /* series: bars stored per timeframe (0 for the window layout) */
} mb_dataset_meta;

typedef struct mb_dataset mb_dataset;

/* Open and validate an HDF5 file (read only). Every check happens before any large
 * allocation; a failure names the file, the dataset and the problem. cfg may be NULL.
 * Built with MEGABATCH_NO_HDF5: MB_ERR_UNSUPPORTED. */
MBDEF mb_result mb_dataset_open_file(mb_dataset **out, const char *path, const mb_dataset_config *cfg);
/* Wrap caller arrays (not copied; they must outlive the dataset): features (n, t, f)
 * and targets (n, k), row-major float32. cfg may be NULL (names and cache ignored). */
MBDEF mb_result mb_dataset_open_memory(mb_dataset **out, const float *features, const float *targets,
                                       int64_t n, int64_t t, int64_t f, int64_t k, const mb_dataset_config *cfg);
MBDEF void mb_dataset_close(mb_dataset *ds); /* NULL is fine */
MBDEF const mb_dataset_meta *mb_dataset_info(const mb_dataset *ds);
/* Read samples [start, end) into features (end-start, t, f) and targets (end-start, k),
 * float32, applying the NaN policy. *rows (may be NULL unless MB_NAN_SKIP) gets the rows
 * written: end-start, or fewer when samples were skipped (kept rows are packed first).
 * Not thread-safe per dataset: one call at a time. */
MBDEF mb_result mb_dataset_read(mb_dataset *ds, int64_t start, int64_t end, float *features, float *targets,
                                int64_t *rows);
/* Isolated probe for untrusted files (HDF5 is not built for them): a child process
 * (fork) opens and validates the file and reads its first and last samples with HDF5's
 * error printing off and stdout/stderr sent to /dev/null, and reports through a pipe.
 * This process makes no HDF5 call. Returns the child's result and message, or
 * MB_ERR_FORMAT "HDF5 crashed while parsing '<path>' (signal N)" when the child died,
 * or "... timed out" when it ran past cfg->probe_timeout_s (it is killed). meta may be
 * NULL; on MB_OK it gets the file's metadata. The NaN policy is not applied to the
 * probe's reads. Needs POSIX fork and threads: built with MEGABATCH_NO_THREADS, or
 * MEGABATCH_NO_HDF5, or off POSIX, it returns MB_ERR_UNSUPPORTED. Call it while no other
 * thread of this process is inside HDF5 (the child would inherit a held lock and time
 * out). */
MBDEF mb_result mb_dataset_probe(const char *path, const mb_dataset_config *cfg, mb_dataset_meta *meta);
/* The one way to open a data file this program did not write itself (a user's file, a
 * download; docs/RELIABILITY.md): mb_dataset_probe in a child process first, then, only
 * when the probe succeeded, mb_dataset_open_file in this process, which must find the
 * shape and metadata the probe reported (else MB_ERR_FORMAT: the file changed in
 * between). A file that crashes or hangs HDF5 in the probe gives MB_ERR_FORMAT naming it,
 * and this process has made no HDF5 call on it. cfg may be NULL; its isolate field is
 * ignored (the probe always runs), probe_timeout_s bounds the probe (0 = 10 s). Costs a
 * fork (a few ms). Call it while no other thread of this process is inside HDF5 (open
 * files before starting loaders on others). MB_ERR_UNSUPPORTED where mb_dataset_probe is
 * (MEGABATCH_NO_THREADS, MEGABATCH_NO_HDF5, off POSIX). Same as mb_dataset_open_file with
 * cfg->isolate = 1. */
MBDEF mb_result mb_dataset_open_untrusted(mb_dataset **out, const char *path, const mb_dataset_config *cfg);

#ifndef MB_MAX_ATTR_VALUES
#define MB_MAX_ATTR_VALUES (1 << 20) /* values of one attribute mb_dataset_read_attr reads */
#endif
enum { MB_ON_FEATURES = 0, MB_ON_TARGETS = 1 }; /* where an attribute sits (mb_dataset_read_attr) */
/* A numeric attribute `name` of an open file dataset (on the features dataset, `ends` in
 * the series layout, with MB_ON_FEATURES; on the targets dataset with MB_ON_TARGETS), e.g.
 * prepare's feature_mean, converted to float32 into out (room for cap values). *count gets
 * the number of values, 0 when the attribute is absent (and for in-memory datasets).
 * MB_ERR_FORMAT when it is not an integer or float type, has a malformed type, or more
 * than cap or MB_MAX_ATTR_VALUES values (nothing is written then). The probe (and so
 * mb_dataset_open_untrusted) reads every such attribute of both datasets in its child
 * first, so an attribute that crashes HDF5 fails the open instead (a dataset with more than
 * 256 attributes fails the probe). name: under MB_MAX_NAME bytes. Not while a loader on ds
 * is open (its reader thread uses the dataset). */
MBDEF mb_result mb_dataset_read_attr(mb_dataset *ds, int on, const char *name, float *out, int64_t cap,
                                     int64_t *count);

// ---- end dataset ----

// ---- loader ----
// Chunk planning from a memory budget, pinned staging slabs, a reader thread, async
// copies on the copy stream, double-buffered (or resident) device chunks, batch views.

typedef struct mb_loader_config {
    int64_t batch;          /* samples per batch, >= 1 (required) */
    int shuffle;            /* 0 (default): file order. 1: seeded permutation of the chunk
                               order and of the samples within each chunk, new per epoch */
    uint64_t seed;          /* shuffle seed */
    int drop_last;          /* 1: drop a final short batch of a chunk; default 0: return it */
    double chunk_fraction;  /* budget = this fraction of the device's free memory; 0 = 0.75 */
    size_t chunk_bytes;     /* explicit budget in bytes (overrides chunk_fraction); 0 = unset */
    size_t slab_bytes;      /* bytes of each of the 2 pinned staging slabs; 0 = 256 MiB */
    mb_dtype dtype;         /* dtype of the device chunk (features and targets): MB_F32
                               (default), MB_BF16 or MB_F16 (read as f32, converted on the
                               device; needs one extra device buffer of one f32 slab) */
    int shard_rank, shard_count; /* data parallel (docs/DIST.md): with shard_count W > 1 this
                               loader returns rank shard_rank's slice of every global batch of
                               W * batch samples (same seed on every rank); 0/0 = unsharded */
} mb_loader_config;

/* The chunk plan: what a run on a device with `free_bytes` will do. */
typedef struct mb_chunk_plan {
    size_t bytes_per_sample;   /* t*f*s + k*s, s = bytes of cfg->dtype */
    size_t budget_bytes;       /* device bytes for data: fraction * free, or chunk_bytes */
    int buffers;               /* 1: resident (all data fits the budget), else 2 (double buffer,
                                  each budget/2) */
    int64_t samples_per_chunk; /* max(batch, min(buffer budget / bps, n)), whole batches when < n */
    size_t chunk_bytes;        /* samples_per_chunk * bytes_per_sample */
    int64_t chunks;            /* ceil(n / samples_per_chunk) */
    int64_t batches;           /* batches per epoch (with drop_last) */
} mb_chunk_plan;

/* Pure planning (no device needed): n, t, f, k of the data, cfg (batch, fraction or
 * bytes, dtype, drop_last), free_bytes of the device (ignored when cfg->chunk_bytes). */
MBDEF mb_result mb_loader_plan(int64_t n, int64_t t, int64_t f, int64_t k, const mb_loader_config *cfg,
                               size_t free_bytes, mb_chunk_plan *out);

/* A batch: views into the device chunk (never copies), valid until the next call to
 * mb_loader_next / reset / set_position / close. count = 0: the epoch ended. */
typedef struct mb_batch {
    const void *features;  /* (count, t, f) of the loader dtype, device memory */
    const void *targets;   /* (count, k) */
    int64_t count;         /* samples; 0 at the end of an epoch */
    int64_t epoch;         /* epoch this batch belongs to */
    int64_t index;         /* batch index within the epoch */
    int end_of_epoch;      /* 1 when count == 0 */
} mb_batch;

/* Where the loader is: the next batch to return is batch `batch` of chunk `chunk` (in
 * that epoch's chunk order) of `epoch`. Save it, restore it to resume at that batch. */
typedef struct mb_loader_pos { int64_t epoch, chunk, batch; } mb_loader_pos;

typedef struct mb_loader_stats {
    uint64_t bytes_read;   /* bytes read from the dataset */
    double read_seconds;   /* reader thread time in mb_dataset_read */
    double copy_seconds;   /* reader thread time issuing and finishing staging copies */
    double wait_seconds;   /* time mb_loader_next waited for a chunk that was not there yet */
    int64_t chunk_loads;   /* chunks loaded from the dataset */
    uint64_t bytes_copied; /* bytes copied from host memory to the device (series: bars once) */
} mb_loader_stats;

typedef struct mb_loader mb_loader;

/* Plan, allocate the device chunk(s) (retrying with 0.8x the budget on out-of-memory,
 * logged; error below one batch) and two staging slabs (pinned; on failure smaller, then
 * pageable), start the reader thread. The dataset must outlive the loader and must not be
 * used by the caller while the loader is open (the reader thread reads it). */
MBDEF mb_result mb_loader_open(mb_loader **out, mb_device *dev, mb_dataset *ds, const mb_loader_config *cfg);
MBDEF void mb_loader_close(mb_loader *ld); /* NULL is fine */
/* The next batch (MB_OK, count >= 1), or the end of the epoch (MB_OK, count 0,
 * end_of_epoch 1; the following call starts the next epoch). */
MBDEF mb_result mb_loader_next(mb_loader *ld, mb_batch *out);
MBDEF mb_result mb_loader_reset_epoch(mb_loader *ld); /* back to batch 0 of the current epoch */
MBDEF mb_loader_pos mb_loader_position(const mb_loader *ld);
MBDEF mb_result mb_loader_set_position(mb_loader *ld, mb_loader_pos pos);
MBDEF const mb_chunk_plan *mb_loader_get_plan(const mb_loader *ld);
MBDEF mb_loader_stats mb_loader_get_stats(const mb_loader *ld);

// ---- end loader ----

// ---- series ----
// The series layout (docs/SERIES.md): each timeframe's bars stored once, `bars_<s>` (N_s, F),
// and per sample the index of its last closed bar in each timeframe, `ends` (N, S), with
// `targets` (N, K). Window s of sample i is rows [ends[i][s] - len[s] + 1, ends[i][s]] of
// bars_<s>; the windows concatenated are the sample's (T, F) features, T = sum of len[s].
// mb_dataset_open_file detects the layout (no `features`, an `ends`): every dataset call
// and the loader then work as on the window layout. The loader keeps the bars resident on
// the device and cuts each batch's windows there with one gather (mb__cpu/cuda_series_gather).

enum { MB_LAYOUT_WINDOW = 0, MB_LAYOUT_SERIES = 1 };

/* A series dataset in caller memory (not copied; it must outlive the dataset). */
typedef struct mb_series {
    int segments;               /* timeframes S, 1..MB_MAX_SEGMENTS */
    const int64_t *window;      /* [S] bars per window (the segment lengths), each >= 1 */
    const int64_t *bars_n;      /* [S] bars stored per timeframe */
    const float *const *bars;   /* [S] row-major (bars_n[s], f) float32 */
    const int64_t *ends;        /* (n, S): last closed bar of each timeframe per sample */
    const float *targets;       /* (n, k) */
    int64_t n, f, k;
} mb_series;

/* Open and validate a series in memory (the checks of the file layout: every index in
 * range, every window complete, indices non-decreasing over samples, sizes that fit).
 * cfg may be NULL (names and cache ignored). */
MBDEF mb_result mb_dataset_open_series(mb_dataset **out, const mb_series *s, const mb_dataset_config *cfg);

// ---- end series ----

// ---- lstm ----
// Multi-layer unidirectional LSTM over (B, T, F) input with PyTorch's weight layout and
// gate order (i, f, g, o), forward and backward, with checkpointed recompute and
// optional hidden-state carry-over between batches.
//
// Math per layer and step t (torch.nn.LSTM):
//   z = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh          (B, 4H) in blocks i, f, g, o
//   i, f, o = sigmoid(z_i, z_f, z_o);  g = tanh(z_g)
//   c_t = f * c_{t-1} + i * g;  h_t = o * tanh(c_t)        (cell state in f32)
// All tensors are device memory of the params' device (host memory on the CPU backend).

typedef struct mb_lstm_config {
    int64_t input_size;  /* F: features per step, >= 1 */
    int64_t hidden_size; /* H: hidden units of every layer, >= 1 */
    int layers;          /* stacked layers; 0 = 1 */
    const char *prefix;  /* parameter name prefix, e.g. "m5."; NULL = "" */
    int checkpoint;      /* steps between kept cell states: 0 = auto (full storage when it, with
                            the fused recurrence's workspace on a GPU, takes at most a quarter of
                            the free device memory, host memory on the CPU; else ceil(sqrt(T))
                            rounded up to a multiple of grad_block), -1 = off (full storage of
                            gates and cells), k >= 1 = every k steps */
    int64_t max_steps;   /* largest T a forward may get (sizes the workspace), >= 1 */
    int64_t max_batch;   /* largest B a forward may get (sizes the workspace), >= 1 */
    int grad_block;      /* steps per gemm of the input projection (forward) and of the weight
                            gradients (backward); 0 = 16 */
    int carry_state;     /* 1: a forward whose h0/c0 is NULL starts from the previous forward's
                            final (h, c) (detached); 0 (default): from zeros */
    int stream;          /* device stream for all of this LSTM's work; 0 = compute stream */
    mb_dtype precision;  /* gemm operands: MB_F32 (default), or MB_BF16 / MB_F16: weights, inputs,
                            h and gate gradients rounded to it, f32 accumulation, f32 cell state
                            and gradients (the f32 weights in params stay the master copy) */
    int fused_blocks;    /* GPU with full storage, how the recurrence runs (docs/LSTM.md): 0 = the
                            cheapest by the latency model (default); -1 = the per-step gemms;
                            1, 2, 4 = the fused kernel with that many blocks a row tile (2, 4:
                            a cluster, sm_90), an error where that does not fit */
    float dropout;       /* nn.LSTM's dropout: in training mode (mb_lstm_set_training) the output
                            sequence of every layer but the last goes through inverted dropout
                            with this probability before the next layer reads it (and its gradient
                            through the same mask); [0, 1), 0 = none (default). With one layer
                            nothing is dropped (torch warns). Costs one (T, B, H) buffer a layer
                            but the first (f32, or 2 bytes an element in bf16/f16; mb_lstm_memory) */
    uint64_t dropout_seed; /* the mask of layer k's outputs (k < layers - 1): element (b, t, j) is kept
                            iff mb_rng_uniform(dropout_seed + k, *dropout_step, (t B + b) H + j) >= p:
                            mb_dropout_forward_dev's mask of the time-major (T, B, H) sequence */
    const uint64_t *dropout_step; /* dropout > 0: the step the masks are keyed by, a uint64_t in
                            device memory read when the work runs (so a captured step replays new
                            masks); the caller advances it (mb_dropout_step_advance) before each
                            training forward, never between a forward and its backward. Required
                            with dropout > 0; several LSTMs may share it (distinct seeds) */
} mb_lstm_config;

typedef struct mb_lstm mb_lstm;

/* Register `<prefix>weight_ih_l{k}` (4H, in), `<prefix>weight_hh_l{k}` (4H, H),
 * `<prefix>bias_ih_l{k}` and `<prefix>bias_hh_l{k}` (4H) for every layer k into params
 * (before mb_params_finalize; init bound 1/sqrt(H) as PyTorch), and allocate the
 * workspace for max_batch x max_steps on the params' device. */
MBDEF mb_result mb_lstm_create(mb_lstm **out, mb_params *params, const mb_lstm_config *cfg);
MBDEF void mb_lstm_destroy(mb_lstm *l); /* NULL is fine */

/* Forward over x (B, T, F). The backward reads x again (as PyTorch's autograd keeps its
 * input): keep x unchanged until mb_lstm_backward. h0, c0: (layers, B, H) or NULL (zeros,
 * or the carried state with carry_state). out_seq (B, T, H): the top layer's outputs,
 * NULL to skip. h_last (B, H): the top layer's final hidden state, NULL to skip. Needs
 * finalized params. */
MBDEF mb_result mb_lstm_forward(mb_lstm *l, const float *x, int64_t B, int64_t T, const float *h0,
                                const float *c0, float *out_seq, float *h_last);
/* Backward of the last forward. dh_last (B, H) and dout_seq (B, T, H): gradients of the
 * loss w.r.t. h_last and out_seq (either may be NULL, meaning zero). Accumulates (+=)
 * into the params' gradient buffer; writes dx (B, T, F), dh0 and dc0 (layers, B, H) when
 * not NULL. Gradients are bitwise identical for every checkpoint setting. */
MBDEF mb_result mb_lstm_backward(mb_lstm *l, const float *dh_last, const float *dout_seq, float *dx, float *dh0,
                                 float *dc0);
/* Final (h_T, c_T) of every layer after the last forward: (layers, B, H) each, NULL to skip. */
MBDEF mb_result mb_lstm_final_state(mb_lstm *l, float *h_n, float *c_n);
/* Forget the carried state: the next forward starts from zeros (or its h0/c0). */
MBDEF void mb_lstm_reset_state(mb_lstm *l);
/* Batch size of the carried state (the last forward's B, or mb_lstm_set_state's), 0
 * when there is none (no forward yet, or reset). */
MBDEF int64_t mb_lstm_state_batch(const mb_lstm *l);
/* Set the carried state to h_n, c_n (layers, B, H), as if a forward of batch B had just
 * ended with them: for restoring a checkpointed run with carry_state. No backward
 * follows it (MB_ERR_STATE until the next forward). */
MBDEF mb_result mb_lstm_set_state(mb_lstm *l, int64_t B, const float *h_n, const float *c_n);
/* Training (1, the default, as a new torch module) or evaluation (0) mode: cfg.dropout applies
 * in training mode only. A backward follows its forward's mode whatever is set in between. */
MBDEF void mb_lstm_set_training(mb_lstm *l, int training);
/* frozen = 1: the caller promises that the LSTM's weights do not change until
 * mb_lstm_freeze(l, 0), so the CPU recurrence packs a one-layer LSTM's weights at the next
 * forward only, not at every forward (a stateful stream of T = 1 steps: the packing costs
 * as much as the step). The same bits either way; no effect on a GPU. */
MBDEF void mb_lstm_freeze(mb_lstm *l, int frozen);
/* Bytes of activations one forward keeps for backward at (B, T): with full storage and
 * with checkpointing as cfg asks (checkpoint -1 gives the same number twice). */
MBDEF mb_result mb_lstm_memory(const mb_lstm_config *cfg, int64_t B, int64_t T, size_t *full_bytes,
                               size_t *checkpointed_bytes);
/* The checkpoint interval a forward at T uses: 1..T, or -1 for full storage. */
MBDEF int64_t mb_lstm_checkpoint_steps(const mb_lstm *l, int64_t T);
/* How its recurrence runs: the fused kernel's blocks a row tile (1, 2 or 4), or 0 for the
 * per-step gemms (every checkpointed or CPU LSTM; docs/LSTM.md). */
MBDEF int mb_lstm_fused_blocks(const mb_lstm *l);

/* Independent LSTMs at once (the five encoders of the multi-timeframe model). One call
 * per LSTM: the arguments of mb_lstm_forward (x .. h_last) and of mb_lstm_backward
 * (dh_last .. dc0); x_stride: floats between the samples of x and of dx (0 = T*F), so
 * an LSTM can read its segment of a wider (B, T', F) batch in place. */
typedef struct mb_lstm_call {
    mb_lstm *lstm;
    const float *x; int64_t x_stride, B, T; const float *h0, *c0; float *out_seq, *h_last;
    const float *dh_last, *dout_seq; float *dx, *dh0, *dc0;
} mb_lstm_call;

/* The forwards (backwards) of n (<= 64) distinct LSTMs of one device; results equal, bit for
 * bit, those of n single calls in order. CUDA: each LSTM runs on its own stream (its
 * cfg.stream), which first waits for the compute stream; the compute stream then waits
 * for all of them. CPU: up to the device's threads run the LSTMs side by side, longest
 * first, each with single-threaded BLAS (one thread from mb_device_open on, process-wide). The
 * log callback may then be called from those threads. An error is the first failing
 * call's (in order); the other calls still ran. */
MBDEF mb_result mb_lstm_forward_many(mb_lstm_call *calls, int n);
MBDEF mb_result mb_lstm_backward_many(mb_lstm_call *calls, int n);

// ---- end lstm ----

// ---- layers ----
// Training numerics on both backends, in five modules: layers (linear, activations,
// concat, dropout), loss (MSE, Huber), amp (the dynamic loss scaler: torch GradScaler
// semantics, state on the device), optim (AdamW with global-norm clipping, LR schedules)
// and accum (gradient accumulation). The optimizer step, unscale and scaler update need
// no host sync.

/* A linear layer y = x W^T + b, PyTorch layout: "<prefix>.weight" (out, in) and
 * "<prefix>.bias" (out), registered into a caller's mb_params (before finalize) with
 * init bound 1/sqrt(in) as torch.nn.Linear. A plain struct: copy it freely. */
typedef struct mb_linear {
    mb_params *params;
    int weight, bias;   /* tensor indices in params */
    int64_t in, out;
} mb_linear;

/* Register the layer's two tensors. prefix: 1..MB_MAX_NAME-8 bytes. */
MBDEF mb_result mb_linear_init(mb_linear *l, mb_params *p, const char *prefix, int64_t in, int64_t out);
/* y (B, out) = x (B, in) W^T + b. Device memory; params finalized. */
MBDEF mb_result mb_linear_forward(const mb_linear *l, int stream, const float *x, int64_t B, float *y);
/* Given dy (B, out): dW += dy^T x and db += sum_rows dy (gradients accumulate into the
 * flat gradient buffer, beta = 1); dx (B, in) = dy W is overwritten (dx may be NULL). */
MBDEF mb_result mb_linear_backward(const mb_linear *l, int stream, const float *x, const float *dy, int64_t B,
                                   float *dx);

/* Elementwise activations. GELU is the tanh approximation (torch's
 * gelu(approximate='tanh')): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
typedef enum mb_act { MB_ACT_IDENTITY = 0, MB_ACT_RELU = 1, MB_ACT_GELU = 2, MB_ACT_TANH = 3 } mb_act;
MBDEF const char *mb_act_name(mb_act a); /* "identity", "relu", "gelu", "tanh" ("unknown" otherwise) */
/* y[i] = f(x[i]), n elements (y may equal x). */
MBDEF mb_result mb_act_forward(mb_device *dev, int stream, mb_act a, const float *x, float *y, size_t n);
/* dx[i] = f'(x[i]) dy[i] from the pre-activation x (dx may equal dy). */
MBDEF mb_result mb_act_backward(mb_device *dev, int stream, mb_act a, const float *x, const float *dy, float *dx,
                                size_t n);

/* Concatenate n inputs xs[i] (B, dims[i]) along features into y (B, sum dims): the
 * multi-timeframe fusion of encoder outputs. Backward splits dy into dxs[i] (B, dims[i])
 * (overwritten; a NULL dxs[i] is skipped). */
MBDEF mb_result mb_concat_forward(mb_device *dev, int stream, int n, const float *const *xs, const int64_t *dims,
                                  int64_t B, float *y);
MBDEF mb_result mb_concat_backward(mb_device *dev, int stream, int n, const float *dy, const int64_t *dims,
                                   int64_t B, float *const *dxs);

/* Inverted dropout: element i is kept when mb_rng_uniform(seed, step, i) >= p and then
 * scaled by 1/(1-p). The mask is a pure function of (seed, step, i): recompute and a
 * resumed run reproduce it, and backward needs no stored mask. p in [0, 1). Use a seed
 * other than the mb_params_init seed. */
MBDEF mb_result mb_dropout_forward(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step, const float *x,
                                   float *y, size_t n);
MBDEF mb_result mb_dropout_backward(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step,
                                    const float *dy, float *dx, size_t n);
/* The same, inside a captured step (docs/LSTM.md, "Dropout"): the step is read from step_dev,
 * a uint64_t in device memory (host memory on the CPU backend), when the work runs, not when
 * the call is made. A CUDA graph that captured these calls then draws a new mask at each replay
 * once the device has advanced *step_dev (mb_dropout_step_advance), with nothing the host
 * passes changing. The mask is mb_dropout_forward's at step = *step_dev, bit for bit. */
MBDEF mb_result mb_dropout_forward_dev(mb_device *dev, int stream, float p, uint64_t seed, const uint64_t *step_dev,
                                       const float *x, float *y, size_t n);
MBDEF mb_result mb_dropout_backward_dev(mb_device *dev, int stream, float p, uint64_t seed, const uint64_t *step_dev,
                                        const float *dy, float *dx, size_t n);
/* *step_dev += 1 on the device, in the order of stream's work (no host sync: capturable).
 * Advance it before a training forward, never between a forward and its backward (the
 * backward must see the forward's step). Read or restore it for a checkpoint with mb_copy
 * (or mb_ckpt_add / mb_ckpt_get, which take device memory). */
MBDEF mb_result mb_dropout_step_advance(mb_device *dev, int stream, uint64_t *step_dev);

// ---- loss ----

typedef enum mb_loss_kind { MB_LOSS_MSE = 0, MB_LOSS_HUBER = 1 } mb_loss_kind;
typedef struct mb_loss_config {
    float huber_delta;   /* Huber threshold; 0 = 1.0 (torch.nn.HuberLoss default) */
    mb_loss_kind kind;   /* MB_LOSS_MSE (default) */
    double *acc;         /* NULL, or a meter slot (mb_meter_slot, device memory): the loss kernel adds
                            mean loss * B to acc[0] and B to acc[1], with no host sync */
} mb_loss_config;

/* Loss of pred (B, K) against target (B, K), computed in fp32 (summed in double),
 * reduced as the mean over B*K (torch reduction='mean').
 *   loss_out: a device float; receives the (unscaled) mean loss; may be NULL.
 *   dpred:    (B, K) receives scale * (*scale_dev if not NULL) * dLoss/dpred; may be NULL.
 * scale carries the accumulation divisor (1/N); scale_dev the loss scale on the device
 * (mb_scaler_scale_ptr), so no host sync is needed. cfg may be NULL (MSE). */
MBDEF mb_result mb_loss(mb_device *dev, int stream, const mb_loss_config *cfg, const float *pred,
                        const float *target, int64_t B, int64_t K, float scale, const float *scale_dev,
                        float *loss_out, float *dpred);
/* Copy one device float to the host (syncs the stream): for logging the loss. */
MBDEF mb_result mb_fetch_scalar(mb_device *dev, int stream, const float *dev_scalar, float *host);

// ---- amp ----

/* Dynamic loss scaler, torch.cuda.amp.GradScaler semantics and defaults. State (scale,
 * growth tracker, found_inf) lives in device memory. Per optimizer step:
 *   mb_loss(..., scale_dev = mb_scaler_scale_ptr(s), ...); backward;
 *   mb_scaler_unscale(s, grads, n);    // grads *= 1/scale; found_inf on any inf/NaN
 *   mb_adamw_step(opt, lr, s);         // skipped on the device when found_inf is set
 *   mb_scaler_update(s);               // back off (found_inf) or grow, reset found_inf
 * bf16 training needs no scaler: pass NULL to mb_adamw_step. All on MB_STREAM_COMPUTE. */
typedef struct mb_scaler_config {
    float init_scale;      /* 0 = 65536 (2^16) */
    float growth_factor;   /* 0 = 2.0; must be > 1 and finite */
    float backoff_factor;  /* 0 = 0.5; must be in (0, 1) */
    int growth_interval;   /* clean steps before growing; 0 = 2000; must be >= 1 */
    float min_scale;       /* floor after backoff; 0 = none */
    float max_scale;       /* cap after growth; 0 = none (growth never goes to inf anyway) */
} mb_scaler_config;

/* The scaler state as the host sees it (for logs and checkpoints). */
typedef struct mb_scaler_state {
    float scale;
    int32_t growth_tracker;  /* clean steps since the last growth or backoff */
    int32_t found_inf;       /* inf/NaN seen since the last update (pending) */
    int32_t last_found_inf;  /* the last update saw inf/NaN: that step was skipped */
} mb_scaler_state;

typedef struct mb_scaler mb_scaler;

/* A loss scaler on dev, its state on the device (cfg NULL: the defaults above); destroy: NULL
 * is fine. */
MBDEF mb_result mb_scaler_create(mb_scaler **out, mb_device *dev, const mb_scaler_config *cfg);
MBDEF void mb_scaler_destroy(mb_scaler *s);
/* The current scale as a device float (for mb_loss's scale_dev). */
MBDEF const float *mb_scaler_scale_ptr(const mb_scaler *s);
/* One pass over grad[0..n): multiply by 1/scale and set found_inf on any inf/NaN. */
MBDEF mb_result mb_scaler_unscale(mb_scaler *s, float *grad, size_t n);
/* After the optimizer step: on found_inf scale *= backoff (floored at min_scale) and the
 * tracker resets; else after growth_interval clean steps scale *= growth when the result
 * is finite (capped at max_scale). found_inf is then cleared for the next step. */
MBDEF mb_result mb_scaler_update(mb_scaler *s);
/* Read / restore the state (synchronises; outside the step). */
MBDEF mb_result mb_scaler_get(mb_scaler *s, mb_scaler_state *st);
MBDEF mb_result mb_scaler_set(mb_scaler *s, const mb_scaler_state *st);
/* 1 when the last updated step was taken, 0 when it was skipped (synchronises). */
MBDEF mb_result mb_scaler_step_taken(mb_scaler *s, int *taken);

// ---- optim ----

typedef struct mb_adamw_config {
    double beta1, beta2;   /* 0.9, 0.999 (double, as torch: 1 - beta rounds like torch's) */
    float eps;             /* 1e-8 */
    float weight_decay;    /* 0.01 (torch.optim.AdamW), decoupled: p *= 1 - lr*wd */
    float max_grad_norm;   /* global L2 norm clip; 0 = off (the seeds use 1.0) */
    int decay_all;         /* 0: tensors marked no_decay (biases) get no weight decay */
} mb_adamw_config;
/* The defaults above (weight decay and the betas have meaningful zeros). */
MBDEF mb_adamw_config mb_adamw_config_default(void);

typedef struct mb_adamw mb_adamw;

/* An optimizer over the flat buffers of p (finalized), with its own moment buffers m, v
 * (zeroed) and a device-side step counter. cfg NULL = defaults. */
MBDEF mb_result mb_adamw_create(mb_adamw **out, mb_params *p, const mb_adamw_config *cfg);
MBDEF void mb_adamw_destroy(mb_adamw *o);
/* One step with learning rate lr (> 0, e.g. from mb_lr_at), on MB_STREAM_COMPUTE:
 * a norm pass (global grad norm, clip coefficient, inf/NaN check), then one fused
 * AdamW pass. If the scaler's found_inf is set, or any gradient is inf/NaN (checked on
 * the final gradients, so corruption after unscale is caught too), the step is skipped
 * on the device: params, moments and the step count stay untouched, and the scaler's
 * found_inf is set so mb_scaler_update backs off. scaler may be NULL (bf16 / fp32). */
MBDEF mb_result mb_adamw_step(mb_adamw *o, float lr, mb_scaler *scaler);
/* Synchronising getters (outside the step): steps taken so far, whether the last call
 * took its step, and the global gradient norm the last call saw (before clipping). */
MBDEF mb_result mb_adamw_steps(mb_adamw *o, int64_t *steps);
MBDEF mb_result mb_adamw_last_step_taken(mb_adamw *o, int *taken);
MBDEF mb_result mb_adamw_grad_norm(mb_adamw *o, float *norm);
/* The moment buffers (device memory, mb_params_total floats each) and the step count,
 * for checkpoints. */
MBDEF float *mb_adamw_m(mb_adamw *o);
MBDEF float *mb_adamw_v(mb_adamw *o);
MBDEF mb_result mb_adamw_set_steps(mb_adamw *o, int64_t steps);

/* Learning-rate schedules: pure host functions of the step (0-based). */
typedef enum mb_lr_kind { MB_LR_CONSTANT = 0, MB_LR_WARMUP_COSINE = 1, MB_LR_ONE_CYCLE = 2 } mb_lr_kind;
typedef struct mb_lr_schedule {
    float lr;               /* base (constant), peak (cosine), max_lr (one-cycle); > 0 */
    mb_lr_kind kind;        /* MB_LR_CONSTANT (default) */
    int64_t total_steps;    /* cosine, one-cycle: steps in the schedule; step must be < it */
    int64_t warmup_steps;   /* cosine: linear ramp lr*(step+1)/warmup; 0 = none */
    float min_lr;           /* cosine: final value, 0 <= min_lr < lr; default 0 */
    float pct_start;        /* one-cycle: fraction of steps rising; 0 = 0.3 (torch) */
    float div_factor;       /* one-cycle: initial lr = lr/div_factor; 0 = 25 (torch) */
    float final_div_factor; /* one-cycle: final lr = initial/final_div_factor; 0 = 1e4 */
} mb_lr_schedule;
/* The learning rate at a step (validates the schedule and the step). */
MBDEF mb_result mb_lr_at(const mb_lr_schedule *s, int64_t step, float *lr);
/* A schedule kind's name, as a command line spells it: "constant", "cosine", "onecycle" (the
 * enum's order); NULL past the last kind, so `for (k = 0; mb_lr_kind_name(k); k++)` lists all. */
MBDEF const char *mb_lr_kind_name(mb_lr_kind kind);

/* Weight averaging over the flat parameter buffer: torch.optim.swa_utils.AveragedModel, its
 * n_averaged, its default (SWA) average and get_ema_multi_avg_fn, with the averaged weights on
 * the device (one more flat buffer of mb_params_total floats; torch's recipe keeps a second
 * whole model, deepcopy'd) and a device counter n_averaged. Each mb_avg_update is one pass over
 * the weights on MB_STREAM_COMPUTE, with no host sync, so it can sit inside a captured step:
 *   n_averaged == 0:  avg = params                            (the first update copies, as torch)
 *   MB_AVG_EMA:       avg = lerp(avg, params, 1 - decay)      (get_ema_multi_avg_fn(decay))
 *   MB_AVG_SWA:       avg = avg + (params - avg) / (n_averaged + 1)   (the equal-weight mean)
 * then n_averaged += 1. With `after` (the optimizer whose step this update follows) the update
 * is skipped on the device when that step was (a skipped f16 step changes neither the average
 * nor n_averaged); NULL: always (e.g. SWA at each epoch's end, as torch's recipe).
 *   mb_avg_swap(a); evaluate or export params; mb_avg_swap(a);   // the averaged weights, no host copy
 * Differences from torch: no buffers (the LSTM has none; no update_bn needed), float32 state
 * always, and n_averaged is an int64 on the device. docs/TRADING.md, "Choosing the model". */
typedef enum mb_avg_kind { MB_AVG_EMA = 0, MB_AVG_SWA = 1 } mb_avg_kind;
typedef struct mb_avg_config {
    double decay;     /* EMA: in (0, 1); 0 = 0.999 (get_ema_multi_avg_fn's default) */
    mb_avg_kind kind; /* MB_AVG_EMA (default) */
} mb_avg_config;
typedef struct mb_avg mb_avg;
/* An average over p (finalized) with n_averaged = 0 (cfg NULL: EMA 0.999); destroy: NULL is fine. */
MBDEF mb_result mb_avg_create(mb_avg **out, mb_params *p, const mb_avg_config *cfg);
MBDEF void mb_avg_destroy(mb_avg *a);
/* One update (above). MB_ERR_STATE while swapped. */
MBDEF mb_result mb_avg_update(mb_avg *a, const mb_adamw *after);
/* Exchange the averaged and the live weights, one pass on the device; again to swap back.
 * mb_avg_swapped: 1 between two swaps. */
MBDEF mb_result mb_avg_swap(mb_avg *a);
MBDEF int mb_avg_swapped(const mb_avg *a);
/* n_averaged, read or set (synchronise; n >= 0); the averaged weights (device memory, the live
 * ones while swapped); the config with its defaults filled in. */
MBDEF mb_result mb_avg_count(mb_avg *a, int64_t *n);
MBDEF mb_result mb_avg_set_count(mb_avg *a, int64_t n);
MBDEF float *mb_avg_data(mb_avg *a);
MBDEF mb_avg_config mb_avg_get_config(const mb_avg *a);

// ---- accum ----

/* Gradient accumulation over n micro-batches: a plain struct (save its fields to resume
 * in the middle of a window, restore with mb_accum_restore).
 *   if (mb_accum_window_start(&a)) mb_params_zero_grad(p);
 *   forward; mb_loss(..., scale = mb_accum_loss_scale(&a), ...); backward;
 *   if (mb_accum_tick(&a)) { unscale; mb_adamw_step; mb_scaler_update; } */
typedef struct mb_accum {
    int n;            /* micro-batches per optimizer step */
    int micro;        /* micro-batches done in the current window, 0..n-1 */
    int64_t windows;  /* completed windows (optimizer steps attempted) */
} mb_accum;
/* init: n micro-batches per step (n >= 1), at the start of a window; restore: the state a
 * checkpoint saved (0 <= micro < n, windows >= 0). MB_ERR_INVALID_ARG otherwise. */
MBDEF mb_result mb_accum_init(mb_accum *a, int n);
MBDEF mb_result mb_accum_restore(mb_accum *a, int n, int micro, int64_t windows);
MBDEF float mb_accum_loss_scale(const mb_accum *a);      /* 1/n */
MBDEF int mb_accum_window_start(const mb_accum *a);      /* 1 before the first micro-batch of a window */
/* Count one finished micro-batch; 1 when it completes the window (step now). */
MBDEF int mb_accum_tick(mb_accum *a);

// ---- step ----
// A training step with nothing in it that changes from step to step, and no host sync (issue
// 15): the learning rate from the schedule on the device (mb_adamw_step_scheduled), and
// losses and metrics summed on the device and read later without stalling the queue.

/* A step whose learning rate the device computes: mb_lr_at(s, n) at the optimizer's schedule
 * counter n, which the device then increments (on every call, taken or skipped, as torch's
 * scheduler steps past a skipped f16 step). Nothing of the call changes from step to step,
 * so a captured graph replays it unchanged. Past total_steps the last step's rate holds.
 * The counter starts at 0; a resumed run sets it (it is not part of mb_ckpt_add_adamw). */
MBDEF mb_result mb_adamw_step_scheduled(mb_adamw *o, const mb_lr_schedule *s, mb_scaler *scaler);
MBDEF mb_result mb_adamw_set_schedule_step(mb_adamw *o, int64_t step);
/* Synchronising getters (outside the step): the schedule counter, and the learning rate the
 * last step used (either kind of step). */
MBDEF mb_result mb_adamw_schedule_step(mb_adamw *o, int64_t *step);
MBDEF mb_result mb_adamw_last_lr(mb_adamw *o, float *lr);

/* A meter holds `slots` running sums on the device, each two doubles {sum, weight}: mb_loss adds
 * mean loss * B and B into the slot in mb_loss_config.acc; a caller's kernel may add its own.
 *   after each step: mb_meter_read(m, stream, 0); then, while mb_meter_next(m, 0, &landed)
 *                    lands one, mb_meter_value(...) is the sums as they were after its step
 *   epoch end:       mb_meter_read(m, stream, 1); mb_meter_wait(m); mb_meter_value(...)
 * mb_meter_read queues, after the work queued so far on the stream, a copy of every slot into
 * pinned memory and an event (and with reset = 1 zeroes the slots behind the copy): the host
 * goes on at once. Up to `depth` reads are in flight; they land in the order they were queued.
 * mb_meter_next never waits unless asked; mb_meter_wait waits (one host sync). On the CPU
 * backend a read lands at once. */
typedef struct mb_meter mb_meter;
/* slots >= 1 sums, zeroed; depth 1..4096 reads in flight at most */
MBDEF mb_result mb_meter_create(mb_meter **out, mb_device *dev, int slots, int depth);
MBDEF void mb_meter_destroy(mb_meter *m); /* NULL is fine; reads in flight land first */
/* Device memory of a slot: {sum, weight} (for mb_loss_config.acc); NULL for a bad slot. */
MBDEF double *mb_meter_slot(mb_meter *m, int slot);
/* Queue a read (MB_ERR_STATE while `depth` reads are in flight). */
MBDEF mb_result mb_meter_read(mb_meter *m, int stream, int reset);
/* The oldest read in flight: *landed = 1 when it has landed (wait = 1: after waiting for it, a
 * host sync), and mb_meter_value now gives it; *landed = 0 when it has not, or none is in flight. */
MBDEF mb_result mb_meter_next(mb_meter *m, int wait, int *landed);
/* Land every read in flight, waiting for them (a host sync when any is in flight). */
MBDEF mb_result mb_meter_wait(mb_meter *m);
/* The last landed read of a slot: sum and weight (0, 0 before the first); mean = sum / weight. */
MBDEF mb_result mb_meter_value(const mb_meter *m, int slot, double *sum, double *weight);
/* Reads landed so far, and reads in flight now. */
MBDEF int64_t mb_meter_reads(const mb_meter *m);
MBDEF int mb_meter_pending(const mb_meter *m);

/* Per-step values, lagged: what a training loop does with a meter, with no host sync in a step.
 *   each step:  mb_meter_step(m, stream, on_read, user, &id); rows[id % depth] = this step's row;
 *               on_read(user, m, id) runs for each of the step reads that has landed, oldest
 *               first: mb_meter_delta is then the sums' growth over read id's step alone
 *   a fold:     mb_meter_fold(m, stream, on_read, user): the rest land (on_read for each), then
 *               mb_meter_value is the sums since the last fold, and the device's are zeroed
 * A read lands in a later call at the earliest, so what the caller keeps per read (a metrics
 * row) is stored after the call that returned its id, in a ring of `depth` entries. on_read
 * may be NULL; an error it returns ends the call with that error. */
typedef mb_result (*mb_meter_fn)(void *user, const mb_meter *m, int64_t id);
/* Land every read that has landed (when `depth` are in flight, the oldest after waiting for it:
 * the host is `depth` steps ahead, the device still has their work queued), then queue a read
 * without reset; *id (NULL: not wanted): its number, counting every read of the meter from 0. */
MBDEF mb_result mb_meter_step(mb_meter *m, int stream, mb_meter_fn on_read, void *user, int64_t *id);
/* Land every read in flight (waiting: a host sync), then read with reset and wait for it. */
MBDEF mb_result mb_meter_fold(mb_meter *m, int stream, mb_meter_fn on_read, void *user);
/* The last landed read of a slot less the one landed before it (the sums after a reset, or at
 * creation, count as 0): the slot's growth between the two reads, one step's sum and weight. */
MBDEF mb_result mb_meter_delta(const mb_meter *m, int slot, double *sum, double *weight);

// ---- end step ----

// ---- checkpoint ----
// Crash-safe checkpoints: one file of named byte sections with a CRC32 over everything,
// written to `path.tmp`, fsynced, renamed over `path`, and the directory fsynced, so a
// crash at any moment leaves either the previous or the new checkpoint, never a mix.
//
// File layout (integers little-endian):
//   "MBCKPT01" | u32 version (1) | u32 section count | u64 file size
//   per section: u32 name length | name (no NUL) | u64 payload bytes | payload
//   u32 CRC-32 (IEEE, as zlib's crc32) of every byte before it
// Payloads are stored as given (native byte order: little-endian on every supported
// platform).
//
//   mb_ckpt_writer *w;
//   mb_ckpt_writer_create(&w, dev);
//   mb_ckpt_add_params(w, params); mb_ckpt_add_adamw(w, opt); mb_ckpt_add_scaler(w, sc);
//   mb_ckpt_add(w, "step", &step, sizeof step);             // any named blob
//   mb_ckpt_write(w, "run/ckpt.mb"); mb_ckpt_writer_destroy(w);
//   ...
//   mb_ckpt_reader *r;
//   mb_ckpt_open(&r, dev, "run/ckpt.mb");                     // checks everything first
//   mb_ckpt_load_params(r, params); mb_ckpt_load_adamw(r, opt); mb_ckpt_load_scaler(r, sc);
//   mb_ckpt_get(r, "step", &step, sizeof step);
//   mb_ckpt_close(r);

#define MB_CKPT_VERSION 1

typedef struct mb_ckpt_writer mb_ckpt_writer;
typedef struct mb_ckpt_reader mb_ckpt_reader;

/* A writer collecting sections in host memory. dev: the device whose memory the added
 * data may live in (copies go through mb_copy on MB_STREAM_COMPUTE, then mb_sync), and
 * whose allocator (tracked, failure injection) and logger are used; NULL: host data only. */
MBDEF mb_result mb_ckpt_writer_create(mb_ckpt_writer **out, mb_device *dev);
MBDEF void mb_ckpt_writer_destroy(mb_ckpt_writer *w); /* NULL is fine */
/* Snapshot `bytes` bytes at data (host or device memory of the writer's device) as
 * section `name` (1..MB_MAX_NAME-1 bytes, unique within the writer). bytes may be 0. */
MBDEF mb_result mb_ckpt_add(mb_ckpt_writer *w, const char *name, const void *data, size_t bytes);
/* Write all sections to path crash-safely (path.tmp, fsync, rename, fsync of the
 * directory). On any failure (unwritable directory, disk full, ...) MB_ERR_IO naming the
 * file and the system's reason; path.tmp is removed and a previous file at path is left
 * untouched. May be called again (e.g. to another path). */
MBDEF mb_result mb_ckpt_write(mb_ckpt_writer *w, const char *path);

/* Read and verify a whole checkpoint file: magic, file size against the header (a
 * truncated or extended file), the CRC-32, then the version and every section's bounds,
 * all before anything is used. Failures: MB_ERR_IO (cannot open/read), MB_ERR_CORRUPT
 * (naming the path and the check that failed), MB_ERR_UNSUPPORTED (intact file of
 * another version). dev as for the writer (NULL: host destinations only). */
MBDEF mb_result mb_ckpt_open(mb_ckpt_reader **out, mb_device *dev, const char *path);
MBDEF void mb_ckpt_close(mb_ckpt_reader *r); /* NULL is fine */
/* 1 when section `name` exists (its size into *bytes when not NULL), else 0. */
MBDEF int mb_ckpt_has(const mb_ckpt_reader *r, const char *name, size_t *bytes);
/* Copy section `name` into dst (host or device memory of the reader's device).
 * MB_ERR_FORMAT when the section is missing or holds a different number of bytes (both
 * sizes in the message); dst is then untouched. */
MBDEF mb_result mb_ckpt_get(mb_ckpt_reader *r, const char *name, void *dst, size_t bytes);

/* Helpers for the training state. Sections: "params" (the flat f32 buffer) and
 * "params.layout" (text, one line per tensor: name and shape); "adamw.m", "adamw.v"
 * (flat f32) and "adamw.steps" (int64); "scaler" (mb_scaler_state). The loaders check
 * everything they need before changing anything: a model of another layout is refused
 * with MB_ERR_FORMAT naming the first tensor that differs and both shapes. */
MBDEF mb_result mb_ckpt_add_params(mb_ckpt_writer *w, mb_params *p);
MBDEF mb_result mb_ckpt_load_params(mb_ckpt_reader *r, mb_params *p);
MBDEF mb_result mb_ckpt_add_adamw(mb_ckpt_writer *w, mb_adamw *o);
MBDEF mb_result mb_ckpt_load_adamw(mb_ckpt_reader *r, mb_adamw *o);
MBDEF mb_result mb_ckpt_add_scaler(mb_ckpt_writer *w, mb_scaler *s);
MBDEF mb_result mb_ckpt_load_scaler(mb_ckpt_reader *r, mb_scaler *s);
/* A weight average: "avg" (flat f32) and "avg.state" (int64 n_averaged, int64 kind, f64 decay).
 * The loader checks the section's size (its layout is params.layout's: load the params too) and
 * that the file's kind and decay are the average's, before changing anything; both refuse
 * while the average is swapped in (MB_ERR_STATE). */
MBDEF mb_result mb_ckpt_add_avg(mb_ckpt_writer *w, mb_avg *a);
MBDEF mb_result mb_ckpt_load_avg(mb_ckpt_reader *r, mb_avg *a);

/* A compatibility key: the named values a resume must match (the options that shape a
 * run), one text section of "name=value\n" lines in the caller's order (integers in
 * decimal, a float as %.9g, a double as %.17g), so it depends on no struct layout, padding,
 * byte order or compiler. The check compares entry by entry, by name and exactly (a float
 * by its value), and names the first entry that differs with both values. An option added
 * later is one more entry; `before` says what files written before it hold.
 *
 *   mb_ckpt_key key[] = {MB_CKPT_INT("hidden", o.hidden), MB_CKPT_F32("lr", o.lr),
 *                        {"no_ftz", MB_CKPT_KIND_INT, o.no_ftz, 0, 0, "0"}};  // added later
 *   mb_ckpt_add_key(w, "options.key", key, 3);
 *   mb_ckpt_check_key(r, "options.key", key, 3);  // "... hidden is 16 in the checkpoint but 8 here" */
typedef enum mb_ckpt_kind { MB_CKPT_KIND_INT, MB_CKPT_KIND_UINT, MB_CKPT_KIND_F32, MB_CKPT_KIND_F64 } mb_ckpt_kind;
typedef struct mb_ckpt_key {
    const char *name;   /* 1..MB_MAX_NAME-1 bytes of letters, digits, '_', '-', '.'; unique */
    mb_ckpt_kind kind;
    int64_t i;          /* MB_CKPT_KIND_INT's value */
    uint64_t u;         /* MB_CKPT_KIND_UINT's */
    double f;           /* MB_CKPT_KIND_F32's (a float's value) and MB_CKPT_KIND_F64's */
    const char *before; /* the value, as text, of a file written before this entry existed
                           ("0"); NULL: such a file is refused */
} mb_ckpt_key;
#define MB_CKPT_INT(name, v) {name, MB_CKPT_KIND_INT, (int64_t)(v), 0, 0.0, NULL}
#define MB_CKPT_UINT(name, v) {name, MB_CKPT_KIND_UINT, 0, (uint64_t)(v), 0.0, NULL}
#define MB_CKPT_F32(name, v) {name, MB_CKPT_KIND_F32, 0, 0, (double)(float)(v), NULL}
#define MB_CKPT_F64(name, v) {name, MB_CKPT_KIND_F64, 0, 0, (double)(v), NULL}

/* Add the n entries (0..4096) as text section `section`. MB_ERR_INVALID_ARG (naming the
 * entry) for a bad or repeated name, a bad kind, or a `before` that is not a value of its
 * kind. */
MBDEF mb_result mb_ckpt_add_key(mb_ckpt_writer *w, const char *section, const mb_ckpt_key *key, int n);
/* Compare section `section` with the n entries. MB_ERR_FORMAT when the file has no such
 * section, or an entry differs ("'run.ckpt' was written with other options: hidden is 16
 * in the checkpoint but 8 here", and how many more differ), is missing (and has no
 * `before`), or is one this build does not know; MB_ERR_CORRUPT for a malformed key text.
 * Reads only: nothing changes whatever the answer. */
MBDEF mb_result mb_ckpt_check_key(mb_ckpt_reader *r, const char *section, const mb_ckpt_key *key, int n);

/* Where one named value of a struct's raw bytes lies: offset and width in bytes,
 * little-endian (INT and UINT 1, 2, 4 or 8 bytes, INT sign-extended; F32 4; F64 8). */
typedef struct mb_ckpt_field { const char *name; mb_ckpt_kind kind; uint32_t offset, width; } mb_ckpt_field;
/* A key that an older program stored as a struct's raw bytes, read back unambiguously
 * through a layout table of `fields` named fields: section `section` must hold exactly
 * `bytes` bytes, every byte outside the fields zero. Compared with the n entries as
 * mb_ckpt_check_key does (MB_ERR_FORMAT naming the first entry that differs). A section
 * of another size or with a stray non-zero byte (another layout, platform or build: not
 * readable without guessing) is MB_ERR_UNSUPPORTED saying so; a missing section
 * MB_ERR_FORMAT; a bad layout table (a field outside `bytes`, overlapping another, of a
 * bad width) MB_ERR_INVALID_ARG. Reads only. */
MBDEF mb_result mb_ckpt_check_key_bytes(mb_ckpt_reader *r, const char *section, size_t bytes,
                                        const mb_ckpt_field *layout, int fields, const mb_ckpt_key *key, int n);

// ---- end checkpoint ----

// ---- export ----
// Weights in safetensors, the format PyTorch, JAX and most inference runtimes read: an
// 8-byte little-endian header length N, N bytes of JSON, then the raw little-endian
// tensors. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
// end)} (offsets into the data that follows the header) and may hold "__metadata__", a map
// of strings to strings. mb_st_* ("st": safetensors) writes and reads such files; the
// header is untrusted input on read: every length, offset, shape and dtype is checked
// (overflow included) before anything is used, and a file is refused, with the reason,
// unless its tensors exactly tile the data (as the reference reader requires).
//
//   mb_st_meta meta[] = {{"hidden", "32"}};
//   const char *const names[] = {"enc0.", "enc.0.", "head.", "", NULL}; // ours -> file's
//   mb_st_save_params("model.safetensors", params, names, meta, 1);
//   mb_st_file *f;
//   mb_st_open(&f, "model.safetensors");
//   mb_st_load_params(f, params, names);       // strict: same names, shapes, dtype F32
//   const char *h = mb_st_meta_get(f, "hidden"); // NULL when absent
//   mb_st_close(f);

#ifndef MB_ST_MAX_HEADER
#define MB_ST_MAX_HEADER (100u << 20) /* bytes of JSON header accepted on read (the reference's cap) */
#endif
#define MB_ST_MAX_RANK 8              /* dimensions of a tensor in a file */

typedef struct mb_st_tensor {
    const char *name;                 /* write: any 1..MB_MAX_NAME-1 bytes; read: NUL-terminated */
    char dtype[8];                    /* "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8",
                                         "BOOL"; write: "" or "F32" (only f32 is written) */
    int rank;                         /* 0..MB_ST_MAX_RANK */
    int64_t shape[MB_ST_MAX_RANK];
    size_t count;                     /* elements (the product of shape); read only */
    const void *data;                 /* write: host memory; read: into the file's data (aligned) */
} mb_st_tensor;

typedef struct mb_st_meta { const char *key, *value; } mb_st_meta;
typedef struct mb_st_file mb_st_file;

/* Write n tensors (host f32) and nmeta metadata pairs to path crash-safely (path.tmp,
 * fsync, rename, fsync of the directory; a previous file is untouched on failure). Names
 * must be unique. The header is padded with spaces to a multiple of 8 bytes. */
MBDEF mb_result mb_st_write(const char *path, const mb_st_tensor *t, int n, const mb_st_meta *meta, int nmeta);
/* Read and validate a whole file. MB_ERR_IO: cannot open or read; MB_ERR_OVERFLOW: a
 * header longer than MB_ST_MAX_HEADER, or sizes that overflow; MB_ERR_FORMAT: anything
 * else wrong (truncated, bad JSON, unknown dtype or field, a duplicate name, offsets out of
 * range, overlapping or leaving a hole, a byte count that disagrees with the shape). */
MBDEF mb_result mb_st_open(mb_st_file **out, const char *path);
/* The same from bytes in memory (copied; `what` names them in messages). */
MBDEF mb_result mb_st_parse(mb_st_file **out, const void *bytes, size_t n, const char *what);
MBDEF void mb_st_close(mb_st_file *f); /* NULL is fine */
MBDEF int mb_st_count(const mb_st_file *f);
MBDEF const mb_st_tensor *mb_st_at(const mb_st_file *f, int i);         /* in the header's order */
MBDEF const mb_st_tensor *mb_st_find(const mb_st_file *f, const char *name); /* NULL when absent */
MBDEF const char *mb_st_meta_get(const mb_st_file *f, const char *key);  /* NULL when absent */
MBDEF int mb_st_meta_count(const mb_st_file *f);
MBDEF void mb_st_meta_at(const mb_st_file *f, int i, const char **key, const char **value);

/* Parameters <-> file. rename: NULL, or pairs {ours, theirs, ..., NULL}: a parameter
 * whose name starts with `ours` (the first pair that matches) is stored under `theirs`
 * followed by the rest of the name ("enc0.weight_ih_l0" -> "enc.0.weight_ih_l0"). Load is
 * strict, as torch's load_state_dict(strict=True): every parameter must be in the file as
 * F32 with the same shape, and every tensor of the file must be a parameter; any mismatch
 * is MB_ERR_FORMAT naming the tensor (and both shapes), and the parameters are then
 * untouched. */
MBDEF mb_result mb_st_save_params(const char *path, mb_params *p, const char *const *rename,
                                  const mb_st_meta *meta, int nmeta);
MBDEF mb_result mb_st_load_params(const mb_st_file *f, mb_params *p, const char *const *rename);

// ---- end export ----

// ---- dist ----
// Data-parallel training over MPI ranks (docs/DIST.md). Compiled with -DMEGABATCH_MPI
// (and mpicc, or MPI's include and library flags); without it the same calls see a world
// of one (rank 0, size 1, every reduction the identity), so one training loop serves both.
// Per optimizer step one all-reduce of the flat gradient buffer (with the batch loss
// riding along), in a fixed order: reduce-scatter (each rank owns a slice and sums every
// rank's contribution to it in rank order, in double) then all-gather. The result is
// bitwise the same on every rank and from run to run for a given world size, so ranks'
// weights stay bitwise identical; the global gradient norm (clipping) and the f16
// found_inf (skip) are computed from the reduced buffer by mb_adamw_step and
// mb_scaler_unscale, i.e. from the same bits on every rank (an inf/NaN on any rank
// reaches every rank: IEEE sums propagate it).

typedef struct mb_dist mb_dist;

typedef struct mb_dist_stats {
    int64_t reductions;      /* gradient all-reduces so far */
    uint64_t bytes_sent;     /* bytes this rank sent in them (both halves) */
    double seconds;          /* wall time inside them, copies included */
} mb_dist_stats;

/* Join the world (MPI_COMM_WORLD): initialises MPI (funneled: only the calling thread
 * uses MPI) unless the caller already did, in which case the caller finalizes it. dev:
 * the device whose memory mb_dist_broadcast's data lives in and whose logger is used; may
 * be NULL (host memory; open the dist first to pick a GPU by mb_dist_local_rank). The
 * params calls use the params' own device. */
MBDEF mb_result mb_dist_open(mb_dist **out, mb_device *dev);
/* Finalizes MPI when mb_dist_open initialised it. NULL is fine. */
MBDEF void mb_dist_close(mb_dist *d);
MBDEF int mb_dist_rank(const mb_dist *d);        /* 0..size-1 (0 for NULL) */
MBDEF int mb_dist_size(const mb_dist *d);        /* ranks in the world (1 for NULL) */
MBDEF int mb_dist_local_rank(const mb_dist *d);  /* rank among the ranks of this machine (GPU choice) */
/* Copy rank 0's `bytes` bytes at data (host or device memory of the dist's device) to
 * every rank. mb_dist_broadcast_params: the flat parameters (at start, so every rank
 * starts from rank 0's weights). */
MBDEF mb_result mb_dist_broadcast(mb_dist *d, void *data, size_t bytes);
MBDEF mb_result mb_dist_broadcast_params(mb_dist *d, mb_params *p);
/* The step's all-reduce: every rank's gradients become sum_r(count_r * grad_r) /
 * sum_r(count_r), the gradient of the mean loss over all ranks' samples (count_r: the
 * samples rank r's gradient is the mean over, 0..2^24; the sum must be > 0). loss (host,
 * may be NULL): this rank's mean loss in, the same weighted mean over ranks out.
 * total (may be NULL): sum_r(count_r). Synchronises the compute stream. */
MBDEF mb_result mb_dist_allreduce_grads(mb_dist *d, mb_params *p, int64_t count, float *loss, int64_t *total);
/* v[0..n) (host) becomes the sum over ranks, added in rank order in double: the same
 * bits on every rank. */
MBDEF mb_result mb_dist_sum(mb_dist *d, double *v, int n);
/* *same = 1 when every rank's flat parameters are bitwise equal to rank 0's (a 64-bit
 * FNV-1a hash of the bytes is compared), else 0; the same answer on every rank. */
MBDEF mb_result mb_dist_check_sync(mb_dist *d, mb_params *p, int *same);
MBDEF mb_result mb_dist_barrier(mb_dist *d);
MBDEF mb_dist_stats mb_dist_get_stats(const mb_dist *d);
/* After a failure on this rank: end every rank (MPI_Abort with code; the others would
 * wait in their next collective for ever). A world of one: nothing (return the error). */
MBDEF void mb_dist_abort(mb_dist *d, int code);

// ---- end dist ----

// ---- graph ----
// Capture the device work of a sequence of calls once and replay it as one CUDA graph launch:
// the host cost of hundreds of kernel launches and cuBLAS calls is paid once, at capture.
// CUDA only. The CPU backend has no queue to record (every call completes before it returns):
// there mb_graph_supported is 0, mb_graph_begin fails with MB_ERR_UNSUPPORTED, and mb_graph_run
// runs the calls directly.
//
// A graph replays exactly the device work that was captured: the same kernels with the same
// arguments (pointers, sizes and scalars as they were at capture), the same cuBLAS calls, copies
// and memsets. The host code of the captured calls runs once, at capture, and none of their device
// work runs then. So a captured sequence keeps every value that changes between replays in device
// memory (inputs copied into fixed buffers before the launch, step counts and learning rates on
// the device), and never makes the host wait for the device or allocate: a host sync, an allocation
// or a wait on work issued outside the capture fails the capture (mb_graph_end: MB_ERR_UNSUPPORTED).
// Warm up once before capturing, so that buffers a call allocates on first use exist.

typedef struct mb_graph mb_graph;

/* 1 when this device can capture and replay graphs (the CUDA backend), 0 otherwise. */
MBDEF int mb_graph_supported(const mb_device *dev);
/* Start capturing the work this thread issues on `stream`, and on the streams it forks to and joins
 * back through mb_stream_wait (as mb_lstm_forward_many does with the encoders' streams). Nothing
 * issued runs until the graph is launched. One capture at a time per device (MB_ERR_STATE);
 * MB_ERR_UNSUPPORTED on the CPU backend. */
MBDEF mb_result mb_graph_begin(mb_device *dev, int stream);
/* End the capture and instantiate its graph in *out (NULL on failure). The capture is over either
 * way. MB_ERR_UNSUPPORTED: something issued during it cannot be captured (the message names the
 * CUDA error); MB_ERR_STATE: no capture under way. */
MBDEF mb_result mb_graph_end(mb_device *dev, mb_graph **out);
/* Replay the captured work on the stream the capture began on, asynchronously, as one launch.
 * Launches of one graph run in order, one after the other. */
MBDEF mb_result mb_graph_launch(mb_graph *g);
MBDEF size_t mb_graph_nodes(const mb_graph *g); /* graph nodes (cuBLAS may record several per call) */
MBDEF void mb_graph_destroy(mb_graph *g);       /* NULL is fine; launches in flight finish */

/* Run fn(user) through a graph: the first call captures fn into *g and launches it; later calls
 * (with *g set) launch *g. Where graphs cannot be used (the CPU backend, or a capture of fn failed
 * once on this device) fn runs directly, every time; the first such fallback is logged (warning,
 * with the reason; information on the CPU), later ones are silent. fn must be safe to run twice
 * for one call: after a failed capture it runs again, directly. An error of fn itself is returned
 * as it is (no graph is kept). */
typedef mb_result (*mb_graph_fn)(void *user);
MBDEF mb_result mb_graph_run(mb_graph **g, mb_device *dev, int stream, mb_graph_fn fn, void *user);

// ---- end graph ----

// ---- testing ----
// Hooks for tests of the library and of programs built on it; not for production use.

/* Test hook: the nth allocation of this kind from now on fails with
 * MB_ERR_OUT_OF_MEMORY (n = 1: the next one; n = 0: cancel). */
MBDEF void mb_device_fail_alloc(mb_device *dev, mb_mem_kind kind, uint64_t nth);
/* Test hook: every allocation of this kind fails (MB_ERR_OUT_OF_MEMORY) while deny is 1,
 * e.g. pinned memory denied entirely. */
MBDEF void mb_device_deny_alloc(mb_device *dev, mb_mem_kind kind, int deny);

#ifdef __cplusplus
}
#endif
#endif /* MEGABATCH_H */

/* ======================================================================================
 * Implementation
 * ====================================================================================== */
#ifdef MEGABATCH_IMPLEMENTATION
#ifndef MEGABATCH_IMPLEMENTATION_INCLUDED
#define MEGABATCH_IMPLEMENTATION_INCLUDED

#if defined(MB_MALLOC) && defined(MB_FREE)
#elif !defined(MB_MALLOC) && !defined(MB_FREE)
#include <stdlib.h>
#define MB_MALLOC(sz) malloc(sz)
#define MB_FREE(p) free(p)
#else
#error "Define both MB_MALLOC and MB_FREE, or neither."
#endif
#ifndef MB_ASSERT
#include <assert.h>
#define MB_ASSERT(x) assert(x)
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#if !defined(_WIN32) && !defined(CLOCK_MONOTONIC)
#error "megabatch: the implementation needs POSIX.1-2008: include megabatch.h before any system header in this file, or define _POSIX_C_SOURCE 200809L first"
#endif

#ifndef MEGABATCH_NO_CBLAS
#include <cblas.h>
#endif

#ifdef __cplusplus
#define MB__RESTRICT __restrict
#else
#define MB__RESTRICT restrict
#endif

#ifdef __cplusplus
#define MB__TLS thread_local
#elif defined(_MSC_VER)
#define MB__TLS __declspec(thread)
#else
#define MB__TLS _Thread_local
#endif

// -- platform (part of core: what differs between operating systems) --
/* What differs between POSIX (Linux, macOS, BSDs) and Windows (MinGW-w64; MSVC's C11 mode
 * is kept in mind, untested here): threads, the core count and host memory, a monotonic
 * clock, and files (UTF-8 paths, binary mode, crash-safe replace). The rest of the
 * implementation calls these and nothing OS-specific (docs/PLATFORMS.md).
 *
 * Threads on Windows are native Win32 ones (SRW locks, condition variables, _beginthreadex):
 * no winpthread DLL to ship next to a MetaTrader DLL, the same code under MSVC, and it does
 * not depend on which thread model (win32 or posix) the MinGW-w64 toolchain was built with. */
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#include <io.h>
#include <process.h>
#else
#include <unistd.h>
#ifndef MEGABATCH_NO_THREADS
#include <pthread.h>
#endif
#endif
#include <errno.h>
#include <fcntl.h>
#include <sys/types.h>
#include <sys/stat.h>

#ifndef MEGABATCH_NO_THREADS
#ifdef _WIN32
typedef SRWLOCK mb__mutex;
typedef CONDITION_VARIABLE mb__cond;
typedef HANDLE mb__thread;
static void mb__mutex_init(mb__mutex *m) { InitializeSRWLock(m); }
static void mb__mutex_destroy(mb__mutex *m) { (void)m; } /* an SRW lock holds no resources */
static void mb__mutex_lock(mb__mutex *m) { AcquireSRWLockExclusive(m); }
static void mb__mutex_unlock(mb__mutex *m) { ReleaseSRWLockExclusive(m); }
static void mb__cond_init(mb__cond *c) { InitializeConditionVariable(c); }
static void mb__cond_destroy(mb__cond *c) { (void)c; }
static void mb__cond_wait(mb__cond *c, mb__mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void mb__cond_signal(mb__cond *c) { WakeConditionVariable(c); }
static void mb__cond_broadcast(mb__cond *c) { WakeAllConditionVariable(c); }
typedef struct mb__thread_start { void *(*fn)(void *); void *arg; } mb__thread_start;
static unsigned __stdcall mb__thread_main(void *a) {
    mb__thread_start s = *(mb__thread_start *)a;
    MB_FREE(a);
    s.fn(s.arg);
    return 0;
}
/* 0 on success. */
static int mb__thread_create(mb__thread *t, void *(*fn)(void *), void *arg) {
    mb__thread_start *s = (mb__thread_start *)MB_MALLOC(sizeof *s);
    if (!s) return -1;
    s->fn = fn;
    s->arg = arg;
    uintptr_t h = _beginthreadex(NULL, 0, mb__thread_main, s, 0, NULL);
    if (!h) { MB_FREE(s); return -1; }
    *t = (HANDLE)h;
    return 0;
}
static void mb__thread_join(mb__thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
#else
typedef pthread_mutex_t mb__mutex;
typedef pthread_cond_t mb__cond;
typedef pthread_t mb__thread;
static void mb__mutex_init(mb__mutex *m) { pthread_mutex_init(m, NULL); }
static void mb__mutex_destroy(mb__mutex *m) { pthread_mutex_destroy(m); }
static void mb__mutex_lock(mb__mutex *m) { pthread_mutex_lock(m); }
static void mb__mutex_unlock(mb__mutex *m) { pthread_mutex_unlock(m); }
static void mb__cond_init(mb__cond *c) { pthread_cond_init(c, NULL); }
static void mb__cond_destroy(mb__cond *c) { pthread_cond_destroy(c); }
static void mb__cond_wait(mb__cond *c, mb__mutex *m) { pthread_cond_wait(c, m); }
static void mb__cond_signal(mb__cond *c) { pthread_cond_signal(c); }
static void mb__cond_broadcast(mb__cond *c) { pthread_cond_broadcast(c); }
static int mb__thread_create(mb__thread *t, void *(*fn)(void *), void *arg) { return pthread_create(t, NULL, fn, arg); }
static void mb__thread_join(mb__thread t) { pthread_join(t, NULL); }
#endif
#endif /* MEGABATCH_NO_THREADS */

/* Cores online (>= 1). */
static long mb__os_cores(void) {
#ifdef _WIN32
    SYSTEM_INFO si;
    GetSystemInfo(&si); /* the processors of this process's group (<= 64: one pool's reach) */
    return si.dwNumberOfProcessors > 0 ? (long)si.dwNumberOfProcessors : 1;
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
#endif
}

/* Physical memory in bytes, total and available now. 0 on success. */
static int mb__os_memory(size_t *total, size_t *avail) {
#ifdef _WIN32
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    if (!GlobalMemoryStatusEx(&ms)) return -1;
    *total = (size_t)ms.ullTotalPhys;
    *avail = (size_t)ms.ullAvailPhys;
#else
    long pages = sysconf(_SC_PHYS_PAGES), av = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || av < 0 || psz <= 0) return -1;
    *total = (size_t)pages * (size_t)psz;
    *avail = (size_t)av * (size_t)psz;
#endif
    return 0;
}

/* Seconds on a monotonic clock (differences only). */
static double mb__os_now(void) {
#ifdef _WIN32
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

/* Files by descriptor, paths in UTF-8 everywhere (Windows: converted to UTF-16 for the
 * wide-character calls, so any file name works, not only the ANSI code page's), binary mode.
 * Return -1 with errno set on failure. */
#ifdef _WIN32
typedef int mb__ssize;
typedef struct _stat64 mb__stat;
#define MB__S_ISREG(m) (((m) & _S_IFMT) == _S_IFREG)
#define MB__S_ISDIR(m) (((m) & _S_IFMT) == _S_IFDIR)
/* MB_MALLOC'd UTF-16 copy of a UTF-8 path; NULL (errno EINVAL or ENOMEM) on failure. */
static wchar_t *mb__wpath(const char *path) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    if (n <= 0) { errno = EINVAL; return NULL; }
    wchar_t *w = (wchar_t *)MB_MALLOC((size_t)n * sizeof *w);
    if (!w) { errno = ENOMEM; return NULL; }
    MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, w, n);
    return w;
}
static int mb__os_open(const char *path, int write) {
    wchar_t *w = mb__wpath(path);
    if (!w) return -1;
    int fd = write ? _wopen(w, _O_WRONLY | _O_CREAT | _O_TRUNC | _O_BINARY | _O_NOINHERIT, _S_IREAD | _S_IWRITE)
                   : _wopen(w, _O_RDONLY | _O_BINARY | _O_NOINHERIT);
    MB_FREE(w);
    return fd;
}
#ifndef MEGABATCH_NO_HDF5
static FILE *mb__os_fopen_rb(const char *path) {
    wchar_t *w = mb__wpath(path);
    FILE *fp = w ? _wfopen(w, L"rb") : NULL;
    MB_FREE(w);
    return fp;
}
#endif
static mb__ssize mb__os_write(int fd, const void *p, size_t n) { return _write(fd, p, (unsigned)n); } /* n <= 1 GiB */
static mb__ssize mb__os_read(int fd, void *p, size_t n) {
    return _read(fd, p, n > ((size_t)1 << 30) ? (1u << 30) : (unsigned)n);
}
static int mb__os_close(int fd) { return _close(fd); }
static int mb__os_fstat(int fd, mb__stat *st) { return _fstat64(fd, st); }
static int mb__os_errno(DWORD e) {
    return e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND ? ENOENT
         : e == ERROR_ACCESS_DENIED || e == ERROR_SHARING_VIOLATION || e == ERROR_LOCK_VIOLATION ? EACCES
         : e == ERROR_DISK_FULL || e == ERROR_HANDLE_DISK_FULL ? ENOSPC : EIO;
}
/* The data and the file's metadata on disk (FlushFileBuffers: Windows' fsync). */
static int mb__os_fsync(int fd) {
    HANDLE h = (HANDLE)_get_osfhandle(fd);
    if (h == INVALID_HANDLE_VALUE) { errno = EBADF; return -1; }
    if (!FlushFileBuffers(h)) { errno = mb__os_errno(GetLastError()); return -1; }
    return 0;
}
/* from replaces to atomically, durable on return (MOVEFILE_WRITE_THROUGH: the move is on
 * disk before MoveFileExW returns, which is what POSIX's fsync of the directory gives). */
static int mb__os_replace(const char *from, const char *to) {
    wchar_t *wf = mb__wpath(from), *wt = wf ? mb__wpath(to) : NULL;
    int rc = -1;
    if (wf && wt) {
        if (MoveFileExW(wf, wt, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) rc = 0;
        else errno = mb__os_errno(GetLastError());
    }
    MB_FREE(wf);
    MB_FREE(wt);
    return rc;
}
static int mb__os_unlink(const char *path) {
    wchar_t *w = mb__wpath(path);
    int rc = w ? _wunlink(w) : -1;
    MB_FREE(w);
    return rc;
}
static int mb__os_sync_dir(const char *path) { (void)path; return 0; } /* done by MOVEFILE_WRITE_THROUGH */
#else
typedef ssize_t mb__ssize;
typedef struct stat mb__stat;
#define MB__S_ISREG(m) S_ISREG(m)
#define MB__S_ISDIR(m) S_ISDIR(m)
static int mb__os_open(const char *path, int write) {
    return write ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open(path, O_RDONLY);
}
#ifndef MEGABATCH_NO_HDF5
static FILE *mb__os_fopen_rb(const char *path) { return fopen(path, "rb"); }
#endif
static mb__ssize mb__os_write(int fd, const void *p, size_t n) { return write(fd, p, n); }
static mb__ssize mb__os_read(int fd, void *p, size_t n) { return read(fd, p, n); }
static int mb__os_close(int fd) { return close(fd); }
static int mb__os_fstat(int fd, mb__stat *st) { return fstat(fd, st); }
static int mb__os_fsync(int fd) { return fsync(fd); }
static int mb__os_replace(const char *from, const char *to) { return rename(from, to); }
static int mb__os_unlink(const char *path) { return unlink(path); }
/* fsync the directory holding path, so a rename into it is durable. */
static int mb__os_sync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else if ((size_t)(slash - path) >= sizeof dir) { errno = ENAMETOOLONG; return -1; }
    else { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    if (rc != 0 && (errno == EINVAL || errno == EROFS)) rc = 0; /* directories that cannot be synced */
    close(fd);
    return rc;
}
#endif

/* fmaf with one rounding, as C99 specifies and the kernels' bitwise equality needs (the
 * LSTM cell's mb__fexp and the portable C gemm tile). MinGW-w64's libm fmaf is not fused:
 * it rounds the product first (22% of random operands one ulp off, measured under Wine),
 * so on Windows the fused result is computed here: the float product is exact in double,
 * the sum is rounded to odd (TwoSum gives its exact error; of the two doubles around the
 * exact sum, the odd one), and odd-rounded doubles round to float correctly (53 >= 24 + 2
 * bits). With GCC or Clang, fmaf is renamed to it by an asm label, which also catches the
 * library calls the compiler emits for fmaf in code built for a target without FMA, while
 * code built for an FMA target (the AVX2 and AVX-512 rows) keeps the instruction: a plain
 * function there would cost them their vectorization (the window mode ran 40x slower).
 * Elsewhere libm's fmaf (an FMA instruction where the target has one). */
#if defined(_WIN32)
#if defined(__GNUC__)
#define MB__STR2(x) #x
#define MB__STR(x) MB__STR2(x)
float fmaf(float, float, float) __asm__(MB__STR(__USER_LABEL_PREFIX__) "mb__fmaf_exact");
#define MB__FMAF(a, b, c) fmaf(a, b, c)
__attribute__((used)) /* called through the asm name only */
#else
#define MB__FMAF(a, b, c) mb__fmaf_exact(a, b, c)
#endif
static float mb__fmaf_exact(float a, float b, float c) {
    double p = (double)a * (double)b, s = p + (double)c;
    double bv = s - p, e = (p - (s - bv)) + ((double)c - bv); /* s + e == p + c exactly */
    uint64_t u;
    memcpy(&u, &s, sizeof u);
    if ((e < 0 || e > 0) && !(u & 1)) u += (e > 0) == (s > 0) ? 1u : ~(uint64_t)0; /* NaN/inf: e is NaN */
    memcpy(&s, &u, sizeof s);
    return (float)s;
}
#else
#define MB__FMAF(a, b, c) fmaf(a, b, c)
#endif

// -- end platform --

#ifdef __cplusplus
extern "C" {
#endif

// ---- core ----

static MB__TLS char mb__error[MB_MAX_ERROR];

MBDEF const char *mb_result_string(mb_result r) {
    switch (r) {
    case MB_OK: return "ok";
    case MB_ERR_INVALID_ARG: return "invalid argument";
    case MB_ERR_OUT_OF_MEMORY: return "out of memory";
    case MB_ERR_OVERFLOW: return "size overflow";
    case MB_ERR_IO: return "i/o error";
    case MB_ERR_FORMAT: return "bad format";
    case MB_ERR_NONFINITE: return "non-finite value";
    case MB_ERR_CUDA: return "cuda error";
    case MB_ERR_NO_DEVICE: return "no such device";
    case MB_ERR_UNSUPPORTED: return "unsupported";
    case MB_ERR_STATE: return "call out of order";
    case MB_ERR_CORRUPT: return "corrupt data";
    }
    return "unknown result";
}

MBDEF const char *mb_last_error(void) { return mb__error; }
MBDEF void mb_clear_error(void) { mb__error[0] = 0; }

static const char *mb__level_name(mb_log_level l) {
    return l == MB_LOG_ERROR ? "error" : l == MB_LOG_WARN ? "warning" : l == MB_LOG_INFO ? "info" : "debug";
}

MBDEF void mb_log_stderr(mb_log_level level, const char *message, const char *file, int line, void *user) {
    (void)file; (void)line;
    fprintf(user ? (FILE *)user : stderr, "megabatch: %s: %s\n", mb__level_name(level), message);
}

static void mb__vlog(const mb_logger *lg, mb_log_level level, const char *file, int line,
                     const char *fmt, va_list ap) {
    if (!lg || !lg->fn || level > lg->max) return;
    char msg[MB_MAX_ERROR];
    vsnprintf(msg, sizeof msg, fmt, ap);
    lg->fn(level, msg, file, line, lg->user);
}

/* printf-style log line through lg (NULL: nowhere). */
static void mb__log(const mb_logger *lg, mb_log_level level, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mb__vlog(lg, level, file, line, fmt, ap);
    va_end(ap);
}
#define MB_LOG(lg, level, ...) mb__log((lg), (level), __FILE__, __LINE__, __VA_ARGS__)

/* Record an error: the message becomes mb_last_error() on this thread and goes to the
 * logger at error level. Returns r, so `return MB_FAIL(lg, MB_ERR_..., "...")`. */
static mb_result mb__fail(const mb_logger *lg, mb_result r, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mb__error, sizeof mb__error, fmt, ap);
    va_end(ap);
    mb__log(lg, MB_LOG_ERROR, file, line, "%s", mb__error);
    return r;
}
#define MB_FAIL(lg, r, ...) mb__fail((lg), (r), __FILE__, __LINE__, __VA_ARGS__)

MBDEF size_t mb_dtype_size(mb_dtype t) {
    return t == MB_F32 ? 4 : (t == MB_BF16 || t == MB_F16) ? 2 : 0;
}
MBDEF const char *mb_dtype_name(mb_dtype t) {
    return t == MB_F32 ? "f32" : t == MB_BF16 ? "bf16" : t == MB_F16 ? "f16" : "unknown";
}

MBDEF int mb_size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
MBDEF int mb_size_add(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
MBDEF int mb_size_product(const int64_t *dims, int n, size_t elem_size, size_t *out) {
    size_t acc = elem_size;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0 || (uint64_t)dims[i] > (uint64_t)SIZE_MAX) return 0;
        if (!mb_size_mul(acc, (size_t)dims[i], &acc)) return 0;
    }
    *out = acc;
    return 1;
}

/* Host allocation through MB_MALLOC (size 0 allowed). */
static void *mb__host_alloc(size_t bytes) { return MB_MALLOC(bytes ? bytes : 1); }
static void *mb__host_calloc(size_t n, size_t size) {
    size_t bytes;
    if (!mb_size_mul(n, size, &bytes)) return NULL;
    void *p = mb__host_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Finite check by bits (no dependence on isfinite being a macro or a function). */
static inline MB__HD int mb__finite_f(float x) {
    union { float f; uint32_t u; } v;
    v.f = x;
    return (v.u & 0x7f800000u) != 0x7f800000u;
}
static inline MB__HD int mb__finite_d(double x) {
    union { double d; uint64_t u; } v;
    v.d = x;
    return (v.u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

// ---- backend ----

/* What a backend provides: a runtime group (memory, copies, streams, events), values that
 * say what it can do, and one group of operations per module. The public functions check
 * their arguments, then call `dev->be->GROUP->op(...)`; nothing else in this file knows
 * which backend runs. Each module declares its group beside its shared element math (the
 * MB__HD functions both backends call, so they cannot drift); the CPU instance
 * (mb__cpu_MODULE_ops) closes the module's CPU code here, the CUDA instance
 * (mb__cuda_MODULE_ops) closes the module's section of megabatch_cuda.cuh, both filled by
 * field name. The tables mb__cpu_backend (the end of this file) and mb__cuda_backend (the
 * end of megabatch_cuda.cuh) name the groups; mb_device_open picks one. A group is all or
 * nothing: every slot filled (mb_device_open checks), or the group pointer NULL where the
 * backend lacks it (dist, graph). A backend's private state (the CPU's threads, pool and
 * kernel variant; the CUDA streams and cuBLAS handles) hangs off dev->ctx, which its open
 * makes and its close frees; its state for one LSTM (the CPU's packed weights, the GPU's
 * choice of recurrence and fused workspace) off l->be_lstm, which its lstm group's create
 * makes and destroy frees.
 *
 * Adding an operation: a field in the module's group (and its MB__OPS_CHECK count), its CPU
 * body and initializer line at the end of the module's CPU part, its CUDA body and
 * initializer line at the end of the module's CUDA section. The operations get valid
 * arguments (checked by the caller), never run on an empty range unless said so, and report
 * failures as mb_result through MB_FAIL. docs/DESIGN.md has the whole picture. */

/* A compile-time check: `MB__OPS_CHECK(mb__lstm_ops, 5);` fails the build when a group's slot
 * count changes without its declaration's count (and so without a look at both instances). */
#ifdef __cplusplus
#define MB__STATIC_ASSERT(c, msg) static_assert(c, msg)
#else
#define MB__STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#endif
#define MB__OPS_CHECK(T, n) \
    MB__STATIC_ASSERT(sizeof(T) == (n) * sizeof(void (*)(void)), #T " must hold " #n " function pointers")
/* Designated initializers are C99 and C++20; g++, clang++ and nvcc take them in C++17 too,
 * and say so under `-pedantic`: MB__OPS_BEGIN/END around this file's instances keep such
 * builds quiet (megabatch_cuda.cuh needs none: nvcc does not warn). */
#if defined(__cplusplus) && __cplusplus < 202002L && defined(__clang__) && !defined(__CUDACC__)
#define MB__OPS_BEGIN _Pragma("clang diagnostic push") _Pragma("clang diagnostic ignored \"-Wc++20-designator\"")
#define MB__OPS_END _Pragma("clang diagnostic pop")
#elif defined(__cplusplus) && __cplusplus < 202002L && defined(__GNUC__) && !defined(__CUDACC__)
#define MB__OPS_BEGIN \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpragmas\"") \
    _Pragma("GCC diagnostic ignored \"-Wc++20-extensions\"")
#define MB__OPS_END _Pragma("GCC diagnostic pop")
#else
#define MB__OPS_BEGIN
#define MB__OPS_END
#endif

/* The runtime: open fills dev->name and dev->ctx; close releases them (dev->recs are freed
 * first). Copies and waits are in stream order; stream -1 for sync is the whole device.
 * The device module's CPU code ends with its CPU instance. */
typedef struct mb__runtime_ops {
    mb_result (*open)(mb_device *dev);
    void (*close)(mb_device *dev);
    mb_result (*memory)(mb_device *dev, size_t *total, size_t *free_bytes);
    mb_result (*set_tf32)(mb_device *dev, int on);
    mb_result (*alloc)(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out);
    void (*dealloc)(mb_device *dev, mb_mem_kind kind, void *ptr);
    mb_result (*copy)(mb_device *dev, int stream, void *dst, const void *src, size_t bytes);
    mb_result (*copy_2d)(mb_device *dev, int stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t rows);
    mb_result (*zero)(mb_device *dev, int stream, void *dst, size_t bytes);
    mb_result (*convert)(mb_device *dev, int stream, void *dst, mb_dtype dt, const void *src, mb_dtype st, size_t n);
    mb_result (*stream_wait)(mb_device *dev, int waiter, int waited); /* waiter != waited */
    mb_result (*sync)(mb_device *dev, int stream);
    void (*thread_init)(mb_device *dev); /* a library thread (the loader's reader) starts using dev */
    void *(*native_stream)(const mb_device *dev, int stream); /* cudaStream_t; NULL: none */
} mb__runtime_ops;
MB__OPS_CHECK(mb__runtime_ops, 14);

/* What a backend can do, as values. */
typedef struct mb__caps {
    int host;            /* 1: operations compute on the calling thread and dev's pool (the CPU):
                            the flush-to-zero mode and the pool's width apply */
    size_t adamw_scratch; /* device bytes the optim group's adamw needs, allocated by mb_adamw_create */
} mb__caps;

typedef struct mb__backend {
    const char *name;
    mb__caps caps;
    const mb__runtime_ops *rt;
    const struct mb__gemm_ops *gemm;     /* the groups, in the modules' order */
    const struct mb__params_ops *params;
    const struct mb__series_ops *series;
    const struct mb__lstm_ops *lstm;
    const struct mb__layers_ops *layers;
    const struct mb__loss_ops *loss;
    const struct mb__amp_ops *amp;
    const struct mb__optim_ops *optim;
    const struct mb__step_ops *step;
    const struct mb__dist_ops *dist;     /* NULL: the host path of mb_dist */
    const struct mb__graph_ops *graph;   /* NULL: no graphs */
} mb__backend;

static const mb__backend *mb__cpu_backend(void); /* the end of this file */
#ifdef MEGABATCH_CUDA
static const mb__backend *mb__cuda_backend(void); /* the end of megabatch_cuda.cuh */
#define MB__CUDA_BACKEND mb__cuda_backend()
#else
#define MB__CUDA_BACKEND NULL
#endif

static int mb__backend_complete(const mb__backend *be); /* the end of this file */

/* The table of a backend; NULL when this build has none. */
static const mb__backend *mb__backend_of(mb_backend backend) {
    if (backend == MB_CPU) return mb__cpu_backend();
    if (backend == MB_CUDA) return MB__CUDA_BACKEND;
    return NULL;
}

/* A group's slots all set (`bytes` of function pointers at `ops`, not NULL). Read through
 * memcpy: a group is a struct of function pointers only. */
static int mb__ops_complete(const void *ops, size_t bytes) {
    for (size_t at = 0; at < bytes; at += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, (const char *)ops + at, sizeof fn);
        if (!fn) return 0;
    }
    return 1;
}

// ---- device ----

typedef struct mb__alloc_rec { void *ptr; size_t bytes; mb_mem_kind kind; } mb__alloc_rec;

struct mb_device {
    const mb__backend *be;
    mb_device_config cfg;
    char name[256];
    int streams;
    int tf32;
    void *ctx;                      /* the backend's private state (mb__cpu_ctx, mb__cuda_ctx) */
    mb_mem_stats stats;
    uint64_t fail_at[MB_MEM_KINDS]; /* fail when allocs[kind] reaches this (0: never) */
    int deny[MB_MEM_KINDS];         /* fail every allocation of this kind */
    mb__alloc_rec *recs;            /* live allocations */
    size_t nrecs, caprecs;
    int graph_stream;               /* the stream of the capture under way, -1: none (graph) */
    int graph_off;                  /* mb_graph_run runs calls directly (graph) */
};

/* The CPU backend's private state (dev->ctx, made by its open). */
typedef struct mb__cpu_ctx {
    int threads;              /* threads for BLAS and for mb_lstm_*_many */
    struct mb__pool *pool;    /* threads-1 persistent workers (NULL: none) */
    int kernel;               /* its LSTM kernels' variant: 0 AVX-512, 1 AVX2+FMA, 2 portable C (the
                                 product: mb__rk_of(kernel), gemm; the gate rows: mb__lstm_*_row_of) */
} mb__cpu_ctx;
/* The CPU state of a CPU device; NULL on any other. */
static mb__cpu_ctx *mb__cpu(const mb_device *dev) {
    return dev->be->caps.host ? (mb__cpu_ctx *)dev->ctx : NULL;
}

// -- CPU: denormals --
/* The CPU compute runs with flush-to-zero (FTZ: a denormal result becomes 0) and
 * denormals-are-zero (DAZ: a denormal operand reads as 0) unless cfg.keep_denormals, which
 * clears both instead. A denormal operand or result costs ~100 cycles on x86 (a microcode
 * assist); an LSTM's backward over hundreds of steps makes many (decaying gradients).
 * The public entry points that compute on the CPU set the mode on the caller's thread
 * and restore the caller's FTZ/DAZ bits on return; the pool workers (below) keep it.
 * x86 (SSE MXCSR) only; elsewhere the mode is left as it is. */
#if (defined(__x86_64__) || defined(_M_X64) || (defined(__i386__) && defined(__SSE__))) && !defined(__CUDA_ARCH__)
#include <xmmintrin.h>
#define MB__MXCSR 1
#endif

typedef struct mb__fpenv { unsigned csr; int changed; } mb__fpenv;
enum { MB__FTZ_DAZ = 0x8040u }; /* MXCSR bit 15 flush-to-zero, bit 6 denormals-are-zero */

/* Set the device's mode on this thread; returns what mb__fp_leave restores. */
static mb__fpenv mb__fp_enter(const mb_device *dev) {
    mb__fpenv e = {0u, 0};
#ifdef MB__MXCSR
    if (!dev || !dev->be->caps.host) return e;
    e.csr = _mm_getcsr();
    unsigned want = dev->cfg.keep_denormals ? e.csr & ~(unsigned)MB__FTZ_DAZ : e.csr | (unsigned)MB__FTZ_DAZ;
    if (want != e.csr) { _mm_setcsr(want); e.changed = 1; }
#else
    (void)dev;
#endif
    return e;
}

/* Give the caller back its FTZ/DAZ bits (the exception flags raised meanwhile stay). */
static void mb__fp_leave(mb__fpenv e) {
#ifdef MB__MXCSR
    if (e.changed) _mm_setcsr((_mm_getcsr() & ~(unsigned)MB__FTZ_DAZ) | (e.csr & (unsigned)MB__FTZ_DAZ));
#else
    (void)e;
#endif
}

// -- CPU: the worker pool --
/* threads-1 workers, started at mb_device_open and joined at mb_device_close, that sleep
 * on a condition variable until a job comes. A job is n items, fn(arg, i) each, taken in
 * turn by the caller's thread and by the workers it was handed to; MB__POOL_FOR runs one:
 * mb__pool_start hands it to up to `workers` workers, the caller's thread takes items
 * (mb__pool_take) until none are left, and mb__pool_join waits for the workers' last ones.
 * One job at a time per device (the `run` lock); inside a job, or with no pool, the
 * caller's thread takes every item itself. Which thread runs an item never changes what
 * it computes. */
typedef struct mb__pool_job {
    void (*fn)(void *, int);
    void *arg;
    int n, next;   /* items, and the next one to take */
    int workers;   /* pool threads it was handed to (0: the caller's thread alone) */
} mb__pool_job;
#define MB__POOL_FOR(dev, nworkers, nitems, func, farg)                                           \
    do {                                                                                          \
        mb__pool_job pj_ = {func, farg, nitems, 0, 0};                                            \
        mb__pool_start(dev, &pj_, nworkers);                                                      \
        for (int i_; (i_ = mb__pool_take(dev, &pj_)) >= 0;) (func)(farg, i_);                    \
        mb__pool_join(dev, &pj_);                                                                 \
    } while (0)
#ifndef MEGABATCH_NO_THREADS
enum { MB__POOL_MAX = 63 };
typedef struct mb__pool mb__pool;
typedef struct mb__pool_who { mb__pool *p; int id; } mb__pool_who;
static MB__TLS int mb__pool_inside; /* this thread runs a pool job (or is a worker) */
struct mb__pool {
    mb_device *dev;
    mb__mutex mu, run;
    mb__cond go, done;
    mb__thread th[MB__POOL_MAX];
    mb__pool_who who[MB__POOL_MAX];
    int n;               /* workers running */
    int want, active;    /* workers asked for by the current job, and still in it */
    int quit;
    uint64_t gen;        /* jobs handed out so far */
    mb__pool_job *job;
};

static int mb__pool_take(mb_device *dev, mb__pool_job *j);

static void *mb__pool_worker(void *arg) {
    mb__pool_who *w = (mb__pool_who *)arg;
    mb__pool *p = w->p;
    (void)mb__fp_enter(p->dev); /* for good: this thread only runs the library's work */
    mb__pool_inside = 1;
    uint64_t seen = 0;
    mb__mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) mb__cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        if (w->id >= p->want) continue; /* not needed for this job */
        mb__pool_job *j = p->job;
        mb__mutex_unlock(&p->mu);
        for (int i; (i = mb__pool_take(p->dev, j)) >= 0;) j->fn(j->arg, i);
        mb__mutex_lock(&p->mu);
        if (--p->active == 0) mb__cond_signal(&p->done);
    }
    mb__mutex_unlock(&p->mu);
    return NULL;
}

/* The device's pool (NULL: none). */
static mb__pool *mb__pool_of(const mb_device *dev) {
    mb__cpu_ctx *c = mb__cpu(dev);
    return c ? c->pool : NULL;
}

static void mb__pool_close(mb_device *dev) {
    mb__pool *p = mb__pool_of(dev);
    if (!p) return;
    mb__mutex_lock(&p->mu);
    p->quit = 1;
    mb__cond_broadcast(&p->go);
    mb__mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) mb__thread_join(p->th[i]);
    mb__cond_destroy(&p->go); mb__cond_destroy(&p->done);
    mb__mutex_destroy(&p->mu); mb__mutex_destroy(&p->run);
    MB_FREE(p);
    mb__cpu(dev)->pool = NULL;
}

static mb_result mb__pool_open(mb_device *dev, int workers) {
    if (workers > MB__POOL_MAX) workers = MB__POOL_MAX;
    if (workers < 1) return MB_OK;
    mb__pool *p = (mb__pool *)mb__host_calloc(1, sizeof *p);
    if (!p) return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_device_open: no host memory for the thread pool");
    p->dev = dev;
    mb__mutex_init(&p->mu); mb__mutex_init(&p->run);
    mb__cond_init(&p->go); mb__cond_init(&p->done);
    mb__cpu(dev)->pool = p;
    for (; p->n < workers; p->n++) { /* fewer threads than asked for: still correct */
        p->who[p->n].p = p; p->who[p->n].id = p->n;
        if (mb__thread_create(&p->th[p->n], mb__pool_worker, &p->who[p->n]) != 0) break;
    }
    return MB_OK;
}

/* Hands job j to up to `workers` pool threads (none from inside a job, or with no pool),
 * never to more than it has items for besides the caller's. */
static void mb__pool_start(mb_device *dev, mb__pool_job *j, int workers) {
    mb__pool *p = mb__pool_of(dev);
    if (workers > j->n - 1) workers = j->n - 1;
    if (!p || workers < 1 || p->n < 1 || mb__pool_inside) return;
    if (workers > p->n) workers = p->n;
    mb__mutex_lock(&p->run);
    mb__pool_inside = 1;
    mb__mutex_lock(&p->mu);
    j->workers = workers;
    p->job = j; p->want = workers; p->active = workers; p->gen++;
    mb__cond_broadcast(&p->go);
    mb__mutex_unlock(&p->mu);
}

/* The next item of j for this thread, -1 when all are taken. */
static int mb__pool_take(mb_device *dev, mb__pool_job *j) {
    mb__pool *p = j->workers ? mb__pool_of(dev) : NULL;
    if (p) mb__mutex_lock(&p->mu);
    int i = j->next < j->n ? j->next++ : -1;
    if (p) mb__mutex_unlock(&p->mu);
    return i;
}

/* Returns once the workers j was handed to have finished their items. */
static void mb__pool_join(mb_device *dev, mb__pool_job *j) {
    mb__pool *p = mb__pool_of(dev);
    if (!j->workers) return;
    mb__mutex_lock(&p->mu);
    while (p->active) mb__cond_wait(&p->done, &p->mu);
    mb__mutex_unlock(&p->mu);
    mb__pool_inside = 0;
    mb__mutex_unlock(&p->run);
}
static void mb__pool_lock(mb_device *dev, int lock) {
    mb__pool *p = mb__pool_of(dev);
    if (!p) return;
    if (lock) mb__mutex_lock(&p->mu);
    else mb__mutex_unlock(&p->mu);
}
/* Whether mb__pool_start would hand work to workers now (not from inside a job). */
static int mb__pool_free(const mb_device *dev) {
    mb__pool *p = mb__pool_of(dev);
    return p && p->n > 0 && !mb__pool_inside;
}
#else
static int mb__pool_free(const mb_device *dev) { (void)dev; return 0; }
static void mb__pool_lock(mb_device *dev, int lock) { (void)dev; (void)lock; }
static void mb__pool_close(mb_device *dev) { (void)dev; }
static mb_result mb__pool_open(mb_device *dev, int workers) { (void)dev; (void)workers; return MB_OK; }
static void mb__pool_start(mb_device *dev, mb__pool_job *j, int workers) { (void)dev; (void)j; (void)workers; }
static int mb__pool_take(mb_device *dev, mb__pool_job *j) { (void)dev; return j->next < j->n ? j->next++ : -1; }
static void mb__pool_join(mb_device *dev, mb__pool_job *j) { (void)dev; (void)j; }
#endif

/* The CPU device runs all its compute on threads it controls (the caller's and the pool's),
 * so that each runs in the device's denormal mode: OpenBLAS's own threads do not take the
 * caller's MXCSR (measured: half of a 512^3 product computed with denormals, half
 * without), so OpenBLAS runs single-threaded (process-wide, set at open) and large gemms
 * are split by columns over the pool instead (mb__gemm_job_of). */
struct mb__rk;
static int mb__rk_pick(mb_cpu_kernel want); /* gemm */
static const struct mb__rk *mb__rk_of(int v);
static const char *mb__rk_name(const struct mb__rk *k);
static void mb__cpu_close(mb_device *dev);

static mb_result mb__cpu_open(mb_device *dev) {
    long ncpu = mb__os_cores();
    int threads = dev->cfg.threads > 0 ? dev->cfg.threads : (int)ncpu;
#if !defined(MEGABATCH_NO_CBLAS) && defined(OPENBLAS_VERSION)
    openblas_set_num_threads(1);
#endif
    mb__cpu_ctx *cx = (mb__cpu_ctx *)mb__host_calloc(1, sizeof *cx);
    if (!cx) return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_device_open: no host memory for the CPU state");
    dev->ctx = cx;
    cx->threads = threads;
    const char *blas = "";
#if !defined(MEGABATCH_NO_CBLAS) && defined(OPENBLAS_VERSION)
    blas = openblas_get_corename(); /* the kernels OpenBLAS picked (OPENBLAS_CORETYPE overrides) */
#endif
    cx->kernel = mb__rk_pick(dev->cfg.cpu_kernel);
    if (cx->kernel < 0) {
        mb__cpu_close(dev);
        static const char *const kname[] = {"auto", "avx512", "avx2", "c"}; /* mb_cpu_kernel's order */
        int k = (int)dev->cfg.cpu_kernel;
        return MB_FAIL(&dev->cfg.log, MB_ERR_UNSUPPORTED, "mb_device_open: the CPU kernel %s: this CPU or build does "
                       "not run it (auto picks the widest it runs)", k >= 0 && k < 4 ? kname[k] : "?");
    }
    snprintf(dev->name, sizeof dev->name, "cpu (%ld cores, %d threads%s%s%s, LSTM kernel %s)", ncpu, threads,
             dev->cfg.keep_denormals ? ", denormals kept" : "", *blas ? ", OpenBLAS " : "", blas, mb__rk_name(mb__rk_of(cx->kernel)));
    mb_result r = mb__pool_open(dev, threads - 1);
    if (r != MB_OK) mb__cpu_close(dev);
    return r;
}

MBDEF mb_result mb_device_open(mb_device **out, const mb_device_config *cfg) {
    mb_device_config c;
    if (!out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_device_open: out is NULL");
    *out = NULL;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    const mb_logger *lg = &c.log;
    if (c.backend != MB_CPU && c.backend != MB_CUDA)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: unknown backend %d", (int)c.backend);
    const mb__backend *be = mb__backend_of(c.backend);
    if (c.streams == 0) c.streams = 2;
    if (c.streams < 2 || c.streams > MB_MAX_STREAMS)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: streams = %d, must be 2..%d",
                       c.streams, MB_MAX_STREAMS);
    if (c.threads < 0 || c.index < 0)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: threads = %d and index = %d must be >= 0",
                       c.threads, c.index);
    if ((int)c.cpu_kernel < 0 || (int)c.cpu_kernel > (int)MB_CPU_KERNEL_C)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: unknown cpu_kernel %d", (int)c.cpu_kernel);
    if (!be)
        return MB_FAIL(lg, MB_ERR_NO_DEVICE, "mb_device_open: this build has no CUDA backend "
                       "(include megabatch_cuda.cuh and compile that file with nvcc)");
    if (!mb__backend_complete(be)) /* a library bug: a slot left unfilled in a backend's table */
        return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_device_open: the %s backend's table is incomplete", be->name);
    mb_device *dev = (mb_device *)mb__host_calloc(1, sizeof *dev);
    if (!dev) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_device_open: no host memory for the device object");
    dev->be = be;
    dev->cfg = c;
    dev->streams = c.streams;
    dev->tf32 = c.tf32 ? 1 : 0;
    dev->graph_stream = -1;
    mb_result r = be->rt->open(dev);
    if (r != MB_OK) { MB_FREE(dev); return r; }
    *out = dev;
    return MB_OK;
}

MBDEF void mb_device_close(mb_device *dev) {
    if (!dev) return;
    if (dev->graph_stream >= 0) { /* graph: a capture left open would outlive the device */
        mb_graph *g = NULL;
        MB_LOG(&dev->cfg.log, MB_LOG_WARN, "mb_device_close: a graph capture was under way: ended, discarded");
        mb_graph_end(dev, &g);
        mb_graph_destroy(g);
    }
    if (dev->nrecs)
        MB_LOG(&dev->cfg.log, MB_LOG_WARN, "mb_device_close: %zu allocation(s) still live, %zu device bytes",
               dev->nrecs, dev->stats.live[MB_MEM_DEVICE]);
    for (size_t i = 0; i < dev->nrecs; i++) dev->be->rt->dealloc(dev, dev->recs[i].kind, dev->recs[i].ptr);
    dev->be->rt->close(dev);
    MB_FREE(dev->recs);
    MB_FREE(dev);
}

MBDEF mb_backend mb_device_backend(const mb_device *dev) { return dev->cfg.backend; }
MBDEF const char *mb_device_name(const mb_device *dev) { return dev->name; }
MBDEF const mb_logger *mb_device_logger(const mb_device *dev) { return dev ? &dev->cfg.log : NULL; }
MBDEF mb_result mb_device_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    size_t t = 0, f = 0;
    MB_TRY(dev->be->rt->memory(dev, &t, &f));
    if (total) *total = t;
    if (free_bytes) *free_bytes = f;
    return MB_OK;
}

MBDEF mb_mem_stats mb_device_mem_stats(const mb_device *dev) { return dev->stats; }
MBDEF int mb_device_streams(const mb_device *dev) { return dev->streams; }
MBDEF void *mb_device_stream(const mb_device *dev, int stream) {
    return (stream >= 0 && stream < dev->streams) ? dev->be->rt->native_stream(dev, stream) : NULL;
}

MBDEF mb_result mb_device_set_tf32(mb_device *dev, int on) {
    MB_TRY(dev->be->rt->set_tf32(dev, on));
    dev->tf32 = on ? 1 : 0;
    return MB_OK;
}
MBDEF int mb_device_tf32(const mb_device *dev) { return dev->tf32; }

static int mb__track(mb_device *dev, void *ptr, size_t bytes, mb_mem_kind kind) {
    if (dev->nrecs == dev->caprecs) {
        size_t cap = dev->caprecs ? dev->caprecs * 2 : 16;
        mb__alloc_rec *n = (mb__alloc_rec *)mb__host_alloc(cap * sizeof *n);
        if (!n) return 0;
        if (dev->nrecs) memcpy(n, dev->recs, dev->nrecs * sizeof *n);
        MB_FREE(dev->recs);
        dev->recs = n;
        dev->caprecs = cap;
    }
    dev->recs[dev->nrecs].ptr = ptr;
    dev->recs[dev->nrecs].bytes = bytes;
    dev->recs[dev->nrecs].kind = kind;
    dev->nrecs++;
    dev->stats.live[kind] += bytes;
    dev->stats.count[kind]++;
    if (dev->stats.live[kind] > dev->stats.peak[kind]) dev->stats.peak[kind] = dev->stats.live[kind];
    return 1;
}

static const char *mb__kind_name(mb_mem_kind k) {
    return k == MB_MEM_HOST ? "host" : k == MB_MEM_PINNED ? "pinned" : "device";
}

MBDEF mb_result mb_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out) {
    if (!dev || !out || (unsigned)kind >= MB_MEM_KINDS)
        return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_alloc: bad arguments");
    *out = NULL;
    uint64_t n = ++dev->stats.allocs[kind];
    if ((dev->fail_at[kind] && n == dev->fail_at[kind]) || dev->deny[kind]) {
        if (!dev->deny[kind]) dev->fail_at[kind] = 0;
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: %s allocation #%llu of %zu bytes "
                       "failed (injected by %s)", mb__kind_name(kind), (unsigned long long)n, bytes,
                       dev->deny[kind] ? "mb_device_deny_alloc" : "mb_device_fail_alloc");
    }
    void *p = NULL;
    MB_TRY(dev->be->rt->alloc(dev, kind, bytes, &p));
    if (!mb__track(dev, p, bytes, kind)) {
        dev->be->rt->dealloc(dev, kind, p);
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: no host memory to track an allocation");
    }
    *out = p;
    return MB_OK;
}

MBDEF void mb_free(mb_device *dev, void *ptr) {
    if (!dev || !ptr) return;
    for (size_t i = dev->nrecs; i-- > 0;) {
        if (dev->recs[i].ptr != ptr) continue;
        mb__alloc_rec r = dev->recs[i];
        dev->recs[i] = dev->recs[--dev->nrecs];
        dev->stats.live[r.kind] -= r.bytes;
        dev->stats.count[r.kind]--;
        dev->be->rt->dealloc(dev, r.kind, ptr);
        return;
    }
    MB_ASSERT(!"mb_free: pointer not from mb_alloc on this device");
}

static mb_result mb__check_stream(mb_device *dev, int stream, const char *what) {
    if (stream < 0 || stream >= dev->streams)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: stream %d out of range 0..%d", what, stream,
                       dev->streams - 1);
    return MB_OK;
}

static mb_result mb__check_dev_stream(mb_device *dev, int stream, const char *what) {
    if (!dev) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: NULL device", what);
    return mb__check_stream(dev, stream, what);
}

MBDEF mb_result mb_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes) {
    MB_TRY(mb__check_stream(dev, stream, "mb_copy"));
    if (bytes == 0) return MB_OK;
    if (!dst || !src) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_copy: NULL pointer for %zu bytes", bytes);
    return dev->be->rt->copy(dev, stream, dst, src, bytes);
}

MBDEF mb_result mb_zero(mb_device *dev, int stream, void *dst, size_t bytes) {
    MB_TRY(mb__check_stream(dev, stream, "mb_zero"));
    if (bytes == 0) return MB_OK;
    if (!dst) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_zero: NULL pointer for %zu bytes", bytes);
    return dev->be->rt->zero(dev, stream, dst, bytes);
}

MBDEF mb_result mb_copy_2d(mb_device *dev, int stream, void *dst, size_t dst_pitch, const void *src,
                           size_t src_pitch, size_t width, size_t rows) {
    MB_TRY(mb__check_stream(dev, stream, "mb_copy_2d"));
    if (width == 0 || rows == 0) return MB_OK;
    if (!dst || !src) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_copy_2d: NULL pointer");
    if (dst_pitch < width || src_pitch < width)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_copy_2d: pitches %zu/%zu smaller than the width %zu",
                       dst_pitch, src_pitch, width);
    return dev->be->rt->copy_2d(dev, stream, dst, dst_pitch, src, src_pitch, width, rows);
}

/* Element i of an f32/bf16/f16 array, as f32; v stored as element i (rounded to nearest even). */
static inline MB__HD float mb__load(const void *p, mb_dtype t, size_t i) {
    if (t == MB_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == MB_BF16 ? mb_bf16_to_f32(h) : mb_f16_to_f32(h);
}
static inline MB__HD void mb__store(void *p, mb_dtype t, size_t i, float v) {
    if (t == MB_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == MB_BF16 ? mb_f32_to_bf16(v) : mb_f32_to_f16(v);
}

MBDEF mb_result mb_convert(mb_device *dev, int stream, void *dst, mb_dtype dst_type, const void *src,
                           mb_dtype src_type, size_t n) {
    MB_TRY(mb__check_stream(dev, stream, "mb_convert"));
    if (!mb_dtype_size(dst_type) || !mb_dtype_size(src_type))
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_convert: unknown dtype %d or %d", (int)dst_type,
                       (int)src_type);
    if (n == 0) return MB_OK;
    if (!dst || !src) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_convert: NULL pointer");
    if (dst_type == src_type) return mb_copy(dev, stream, dst, src, n * mb_dtype_size(dst_type));
    return dev->be->rt->convert(dev, stream, dst, dst_type, src, src_type, n);
}

MBDEF mb_result mb_stream_wait(mb_device *dev, int waiter, int waited) {
    MB_TRY(mb__check_stream(dev, waiter, "mb_stream_wait"));
    MB_TRY(mb__check_stream(dev, waited, "mb_stream_wait"));
    return waiter == waited ? MB_OK : dev->be->rt->stream_wait(dev, waiter, waited);
}

MBDEF mb_result mb_sync(mb_device *dev, int stream) {
    if (stream != -1) MB_TRY(mb__check_stream(dev, stream, "mb_sync"));
    return dev->be->rt->sync(dev, stream);
}

/* The CPU backend's device operations: host memory, synchronous copies, no streams. */
static void mb__cpu_close(mb_device *dev) {
    if (!dev->ctx) return; /* open failed before making it */
    mb__pool_close(dev);
    MB_FREE(dev->ctx);
    dev->ctx = NULL;
}

static mb_result mb__cpu_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    if (mb__os_memory(total, free_bytes) != 0)
        return MB_FAIL(&dev->cfg.log, MB_ERR_UNSUPPORTED, "mb_device_memory: the OS cannot tell host memory");
    return MB_OK;
}

static mb_result mb__cpu_set_tf32(mb_device *dev, int on) { (void)dev; (void)on; return MB_OK; }

/* CPU device memory starts on a cache line (malloc's large blocks start 16 bytes past one):
 * a row of 16 floats is then one line, not two, and no 64-byte load (an AVX-512 tile's row
 * of packed weights) spans two. On a Zen 3 (AVX2) the training step did not move beyond
 * the noise (docs/BENCHMARKS.md, issue 29's sixth pass). MB_MALLOC's own pointer is kept
 * just below the one returned. */
enum { MB__CPU_ALIGN = 64 };
static mb_result mb__cpu_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out) {
    size_t total;
    char *raw = mb_size_add(bytes, MB__CPU_ALIGN + sizeof(void *), &total) ? (char *)mb__host_alloc(total) : NULL;
    *out = NULL;
    if (!raw)
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: %s allocation of %zu bytes failed",
                       mb__kind_name(kind), bytes);
    uintptr_t at = ((uintptr_t)raw + sizeof(void *) + MB__CPU_ALIGN - 1) & ~(uintptr_t)(MB__CPU_ALIGN - 1);
    ((void **)at)[-1] = raw;
    *out = (void *)at;
    return MB_OK;
}

static void mb__cpu_dealloc(mb_device *dev, mb_mem_kind kind, void *ptr) {
    (void)dev; (void)kind;
    if (ptr) MB_FREE(((void **)ptr)[-1]);
}

static mb_result mb__cpu_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes) {
    (void)dev; (void)stream;
    memmove(dst, src, bytes);
    return MB_OK;
}

static mb_result mb__cpu_copy_2d(mb_device *dev, int stream, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t rows) {
    (void)dev; (void)stream;
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return MB_OK;
}

static mb_result mb__cpu_zero(mb_device *dev, int stream, void *dst, size_t bytes) {
    (void)dev; (void)stream;
    memset(dst, 0, bytes);
    return MB_OK;
}

static mb_result mb__cpu_convert(mb_device *dev, int stream, void *dst, mb_dtype dt, const void *src, mb_dtype st,
                                 size_t n) {
    (void)dev; (void)stream;
    for (size_t i = 0; i < n; i++) mb__store(dst, dt, i, mb__load(src, st, i));
    return MB_OK;
}

static mb_result mb__cpu_stream_wait(mb_device *dev, int waiter, int waited) {
    (void)dev; (void)waiter; (void)waited;
    return MB_OK;
}

static mb_result mb__cpu_sync(mb_device *dev, int stream) { (void)dev; (void)stream; return MB_OK; }

static void mb__cpu_thread_init(mb_device *dev) { (void)dev; }

static void *mb__cpu_native_stream(const mb_device *dev, int stream) { (void)dev; (void)stream; return NULL; }

MB__OPS_BEGIN
static const mb__runtime_ops mb__cpu_runtime_ops = {
    .open = mb__cpu_open, .close = mb__cpu_close, .memory = mb__cpu_memory, .set_tf32 = mb__cpu_set_tf32,
    .alloc = mb__cpu_alloc, .dealloc = mb__cpu_dealloc, .copy = mb__cpu_copy, .copy_2d = mb__cpu_copy_2d,
    .zero = mb__cpu_zero, .convert = mb__cpu_convert, .stream_wait = mb__cpu_stream_wait, .sync = mb__cpu_sync,
    .thread_init = mb__cpu_thread_init, .native_stream = mb__cpu_native_stream,
};
MB__OPS_END


// ---- gemm ----

/* Rows and columns of the stored matrix behind op(X) (X is rows x cols row-major). */
static mb_result mb__gemm_check(mb_device *dev, const mb_gemm_args *g) {
    const mb_logger *lg = &dev->cfg.log;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_gemm: negative size m=%lld n=%lld k=%lld batch=%lld",
                       (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
    if (!mb_dtype_size(g->ab_type) || (g->c_type != MB_F32 && g->c_type != g->ab_type))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_gemm: types A/B %s, C %s: C must be f32 or the A/B type",
                       mb_dtype_name(g->ab_type), mb_dtype_name(g->c_type));
    int64_t acols = g->trans_a ? g->m : g->k, bcols = g->trans_b ? g->k : g->n;
    if (g->lda < (acols > 1 ? acols : 1) || g->ldb < (bcols > 1 ? bcols : 1) || g->ldc < (g->n > 1 ? g->n : 1))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_gemm: leading dimensions lda=%lld ldb=%lld ldc=%lld too "
                       "small for A cols %lld, B cols %lld, C cols %lld", (long long)g->lda, (long long)g->ldb,
                       (long long)g->ldc, (long long)acols, (long long)bcols, (long long)g->n);
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->lda > INT32_MAX ||
        g->ldb > INT32_MAX || g->ldc > INT32_MAX)
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "mb_gemm: a dimension exceeds 2^31-1 (BLAS limit)");
    if ((g->m && g->n && !g->c) || (g->m && g->n && g->k && (!g->a || !g->b)))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_gemm: NULL operand");
    return mb__check_stream(dev, g->stream, "mb_gemm");
}

/* Widen a rows x cols (leading dim ld) half-precision matrix to dense f32. */
static float *mb__widen(const void *x, mb_dtype t, int64_t rows, int64_t cols, int64_t ld) {
    float *w = (float *)mb__host_calloc((size_t)(rows * cols) + 1, sizeof(float));
    if (!w) return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] = mb__load(x, t, (size_t)(r * ld + c));
    return w;
}

/* MB__NO_CONTRACT, at the top of a function, keeps a * b + c from becoming an fma there (and
 * where the function is inlined into code built for an FMA target): Clang contracts within an
 * expression by default, and only this pragma (not an attribute) stops it; GCC does not in
 * ISO C modes, and its rows (lstm, layers) turn contraction off by attribute. */
#if defined(__clang__) && !defined(__CUDACC__)
#define MB__NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define MB__NO_CONTRACT
#endif

#ifdef MEGABATCH_NO_CBLAS
/* Row a times rows b[0..3] of B^T (ldb apart; nb < 4: the last one again, its results
 * dropped), each dot product in 8 lanes (lane j sums k = j, j + 8, ...; then the lanes
 * pairwise, then the tail in order): a fixed order that the compiler vectorizes, 4 rows
 * at once to hide the adds' latency; the same bits on every platform, and an element's
 * bits depend neither on M nor on N. */
static inline void mb__lanes8(float *s, const float *a, const float *b) {
    MB__NO_CONTRACT
    for (int j = 0; j < 8; j++) s[j] += a[j] * b[j];
}
static void mb__dot8x4(const float *a, const float *b, int64_t ldb, int nb, int64_t k, float *t) {
    MB__NO_CONTRACT
    const float *r[4];
    float s[4][8];
    for (int q = 0; q < 4; q++) r[q] = b + (q < nb ? q : nb - 1) * ldb;
    memset(s, 0, sizeof s);
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
        mb__lanes8(s[0], a + p, r[0] + p); mb__lanes8(s[1], a + p, r[1] + p);
        mb__lanes8(s[2], a + p, r[2] + p); mb__lanes8(s[3], a + p, r[3] + p);
    }
    for (int q = 0; q < nb; q++) {
        t[q] = ((s[q][0] + s[q][4]) + (s[q][2] + s[q][6])) + ((s[q][1] + s[q][5]) + (s[q][3] + s[q][7]));
        for (int64_t u = p; u < k; u++) t[q] += a[u] * r[q][u];
    }
}
#endif

/* One f32 product C = alpha op(A) op(B) + beta C, row-major, as a pool job: split by columns
 * of C into parts of MB__SPLIT_COLS when large (else one part), taken by the caller's thread
 * and the pool's workers. The parts depend only on the shape, never on the thread count or on
 * which thread runs them (a 1-thread device, or a gemm inside a pool job, runs them one after
 * the other): OpenBLAS's bits depend on N (measured), so the parts must not. */
typedef struct mb__gemm_job {
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc, w; /* w: columns per part */
    float alpha, beta;
    const float *a, *b;
    float *c;
} mb__gemm_job;

/* below ~4 MFLOP a handoff costs more than it gains; parts of 256 columns (the LSTM's 4H
   at H = 64 stays whole; at H = 256 its 1024 gate columns make 4 parts) */
enum { MB__SPLIT_FLOPS = 1 << 22, MB__SPLIT_COLS = 256 };

static mb__gemm_job mb__gemm_job_of(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    mb__gemm_job j = {ta, tb, m, n, k, lda, ldb, ldc, n, alpha, beta, a, b, c};
    if (n > MB__SPLIT_COLS && 2.0 * (double)m * (double)n * (double)k >= (double)MB__SPLIT_FLOPS) j.w = MB__SPLIT_COLS;
    return j;
}

static int mb__gemm_parts(const mb__gemm_job *j) { return j->m && j->n ? (int)((j->n + j->w - 1) / j->w) : 0; }

/* A pool item: part i's columns of C, BLAS's product; without CBLAS, A B^T (a linear layer's
 * forward: rows of both contiguous in k) as dot products, the rest as plain loops; k = 0:
 * C = beta C. */
static void mb__gemm_part(void *arg, int i) {
    const mb__gemm_job *j = (const mb__gemm_job *)arg;
    int64_t c0 = i * j->w, n = c0 + j->w < j->n ? j->w : j->n - c0, m = j->m, k = j->k, lda = j->lda, ldb = j->ldb;
    int ta = j->ta, tb = j->tb;
    const float *a = j->a, *b = j->b + (tb ? c0 * ldb : c0);
    float *c = j->c + c0, alpha = j->alpha, beta = j->beta;
    if (k == 0) {
        for (int64_t r = 0; r < m; r++)
            for (int64_t col = 0; col < n; col++) c[r * j->ldc + col] = beta == 0.0f ? 0.0f : beta * c[r * j->ldc + col];
        return;
    }
#ifndef MEGABATCH_NO_CBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)j->ldc);
#else
    for (int64_t i = 0; i < m; i++) {
        float *crow = c + i * j->ldc;
        if (!ta && tb) {
            for (int64_t q0 = 0; q0 < n; q0 += 4) {
                float t[4];
                int nb = n - q0 < 4 ? (int)(n - q0) : 4;
                mb__dot8x4(a + i * lda, b + q0 * ldb, ldb, nb, k, t);
                for (int q = 0; q < nb; q++) crow[q0 + q] = (beta == 0.0f ? 0.0f : beta * crow[q0 + q]) + alpha * t[q];
            }
            continue;
        }
        for (int64_t q = 0; q < n; q++) crow[q] = beta == 0.0f ? 0.0f : beta * crow[q];
        for (int64_t p = 0; p < k; p++) {
            float av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
            if (tb) for (int64_t q = 0; q < n; q++) crow[q] += av * b[q * ldb + p];
            else { const float *brow = b + p * ldb; for (int64_t q = 0; q < n; q++) crow[q] += av * brow[q]; }
        }
    }
#endif
}

/* Product i of g's batch as a job on f32 operands: wide[0..2] the copies of A, B and C widened
 * from bf16/f16 (NULL: not needed; the caller frees them); none at all when C is empty. */
static mb_result mb__cpu_gemm_job(mb_device *dev, const mb_gemm_args *g, int64_t i, mb__gemm_job *j, float **wide) {
    int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    const char *a = (const char *)g->a + (size_t)(i * g->stride_a) * mb_dtype_size(g->ab_type);
    const char *b = (const char *)g->b + (size_t)(i * g->stride_b) * mb_dtype_size(g->ab_type);
    char *c = (char *)g->c + (size_t)(i * g->stride_c) * mb_dtype_size(g->c_type);
    int widen = g->ab_type != MB_F32 && g->k > 0;
    *j = mb__gemm_job_of(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, (const float *)a, g->lda,
                         (const float *)b, g->ldb, g->beta, (float *)c, g->ldc);
    if (!g->m || !g->n) return MB_OK;
    if (widen) {
        j->a = wide[0] = mb__widen(a, g->ab_type, ar, ac, g->lda);
        j->b = wide[1] = mb__widen(b, g->ab_type, br, bc, g->ldb);
        j->lda = ac; j->ldb = bc;
    }
    if (g->c_type != MB_F32) { j->c = wide[2] = mb__widen(c, g->c_type, g->m, g->n, g->ldc); j->ldc = g->n; }
    if ((widen && (!wide[0] || !wide[1])) || (g->c_type != MB_F32 && !wide[2]))
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_gemm: no host memory to widen operands");
    return MB_OK;
}

/* The backend's gemm group (// ---- backend ----): g checked by mb_gemm. */
typedef struct mb__gemm_ops {
    mb_result (*run)(mb_device *dev, const mb_gemm_args *g);
} mb__gemm_ops;
MB__OPS_CHECK(mb__gemm_ops, 1);

MBDEF mb_result mb_gemm(mb_device *dev, const mb_gemm_args *g) {
    if (!dev || !g) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_gemm: NULL argument");
    MB_TRY(mb__gemm_check(dev, g));
    return dev->be->gemm->run(dev, g);
}

static mb_result mb__cpu_gemm(mb_device *dev, const mb_gemm_args *g) {
    mb__fpenv e = mb__fp_enter(dev);
    mb_result r = MB_OK;
    for (int64_t i = 0; r == MB_OK && i < (g->batch > 1 ? g->batch : 1); i++) {
        float *wide[3] = {NULL, NULL, NULL};
        mb__gemm_job j;
        r = mb__cpu_gemm_job(dev, g, i, &j, wide);
        if (r == MB_OK) MB__POOL_FOR(dev, mb__cpu(dev)->threads - 1, mb__gemm_parts(&j), mb__gemm_part, &j);
        char *c = (char *)g->c + (size_t)(i * g->stride_c) * mb_dtype_size(g->c_type);
        for (int64_t row = 0; r == MB_OK && wide[2] && row < g->m; row++) /* C back to its type */
            mb__cpu_convert(dev, 0, c + (size_t)(row * g->ldc) * mb_dtype_size(g->c_type), g->c_type,
                            wide[2] + row * g->n, MB_F32, (size_t)g->n);
        MB_FREE(wide[0]); MB_FREE(wide[1]); MB_FREE(wide[2]);
    }
    mb__fp_leave(e);
    return r;
}

// -- CPU: the row-independent product (the LSTM's recurrence) --
/* C (M, N) = [A1 A2] op(W) (+ C), f32, for the CPU LSTM (forward z = [x_t, h_{t-1}] [W_ih
 * W_hh]^T; backward dg W_hh and dg W_ih), with our own register-blocked kernels instead of
 * BLAS. A row of the operand is a row of A1 (K1 values) followed by one of A2 (K2, may be
 * 0). W is packed once per call into panels of nr columns, (K1 + K2, nr) each, zero-padded
 * past N. Every output element is one chain of fused multiply-adds over k = 0..K1+K2-1 in
 * order, from +0, then added to C (add) or stored: a row's bits depend neither on M, nor
 * on where the row falls in a tile, nor on which variant runs. So a call over the rows of
 * one step and one over a whole segment give the same bits (the checkpointed recompute
 * relies on it), and the AVX-512, AVX2+FMA and portable C variants agree bit for bit
 * (tested; the C one calls fmaf, exact wherever C99's fmaf is). Picked at run time. */
typedef struct mb__rk_a {
    const float *a1, *a2; /* row r at a1 + r lda1 (K1 values) and a2 + r lda2 (K2 values) */
    int64_t lda1, lda2, K1, K2;
} mb__rk_a;
typedef void (*mb__rk_tile_fn)(int mr, const mb__rk_a *A, int64_t r, const float *p, float *c, int64_t ldc, int nc,
                               int add);
/* mb__rk, "row kernel": one variant of this product (its name, tile shape and tile function);
 * the mb__rk_* functions below pack W for it, pick it at open and run it over rows. */
typedef struct mb__rk {
    const char *name;    /* "avx512", "avx2", "c" */
    int nr, mr;          /* panel width (columns), rows of a tile */
    mb__rk_tile_fn tile; /* rows r.. r+mr'-1 (mr' <= mr) x nc <= nr columns of C from one panel p */
} mb__rk;
enum { MB__RK_NR_MAX = 32 };

/* Pack W into rows k0 .. k0+K-1 of panels of nr columns, Kt rows each: trans 1: W is (N, K)
 * row-major (C = A W^T), 0: W is (K, N) (C = A W). out: ceil(N / nr) panels of Kt * nr. */
static void mb__rk_pack(int nr, int64_t N, int64_t K, const float *w, int trans, int64_t Kt, int64_t k0, float *out) {
    for (int64_t p0 = 0; p0 < N; p0 += nr, out += (size_t)nr * (size_t)Kt)
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < nr; j++) {
                int64_t n = p0 + j;
                out[(k0 + k) * nr + j] = n >= N ? 0.0f : trans ? w[n * K + k] : w[k * N + n];
            }
}

/* floats of a packed W (the widest panels) */
static size_t mb__rk_packed_size(int64_t N, int64_t K) {
    return (size_t)((N + MB__RK_NR_MAX - 1) / MB__RK_NR_MAX * MB__RK_NR_MAX) * (size_t)K;
}

/* The portable tile: 4 rows x 16 columns, fmaf. */
static void mb__rk_tile_c(int mr, const mb__rk_a *A, int64_t r, const float *p, float *c, int64_t ldc, int nc,
                          int add) {
    float acc[4][16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 16; j++) acc[i][j] = 0.0f;
    for (int part = 0; part < 2; part++) {
        const float *a = part ? A->a2 + r * A->lda2 : A->a1 + r * A->lda1;
        int64_t lda = part ? A->lda2 : A->lda1, K = part ? A->K2 : A->K1;
        for (int64_t k = 0; k < K; k++, p += 16)
            for (int i = 0; i < mr; i++) {
                float av = a[i * lda + k];
                for (int j = 0; j < 16; j++) acc[i][j] = MB__FMAF(av, p[j], acc[i][j]);
            }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nc; j++) c[i * ldc + j] = add ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__)
#include <immintrin.h>
#define MB__RK_X86 1
/* A tile's R rows of C (nc columns) into cache before its products run: the forward writes
 * each step's gates to memory no step has touched yet (full storage), and a store that
 * misses stalls the tile; the fetch overlaps the misses with the products (measured on a
 * Zen 3: the F=32 H=64 forward 221 -> 149 us a step, docs/BENCHMARKS.md). Same bits. */
#define MB__RK_PREFETCH_C(R)                                                                                     \
    for (int i_ = 0; i_ < (R); i_++) {                                                                           \
        for (int j_ = 0; j_ < nc; j_ += 16) __builtin_prefetch(c + i_ * ldc + j_, 1, 3);                         \
        __builtin_prefetch(c + i_ * ldc + nc - 1, 1, 3);                                                         \
    }
/* AVX-512: R <= 8 rows x 32 columns (two zmm a row), 16 accumulators named so that unused
 * rows vanish at any optimization level. */
#define MB__RK512_FMA(i)                                                                                         \
    if (R > i) {                                                                                                 \
        __m512 av = _mm512_set1_ps(a[i * lda + k]);                                                              \
        c##i##0 = _mm512_fmadd_ps(av, b0, c##i##0);                                                              \
        c##i##1 = _mm512_fmadd_ps(av, b1, c##i##1);                                                              \
    }
#define MB__RK512_STORE(i)                                                                                       \
    if (R > i) {                                                                                                 \
        float *ci = c + i * ldc;                                                                                 \
        if (add) {                                                                                               \
            c##i##0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, ci), c##i##0);                                     \
            c##i##1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), c##i##1);                                \
        }                                                                                                        \
        _mm512_mask_storeu_ps(ci, m0, c##i##0);                                                                  \
        _mm512_mask_storeu_ps(ci + 16, m1, c##i##1);                                                             \
    }
#define MB__RK512_TILE(RV)                                                                                       \
    __attribute__((target("avx512f"))) static void mb__rk_tile512_##RV(const mb__rk_a *A, int64_t r,           \
                                                                       const float *p, float *c, int64_t ldc,  \
                                                                       int nc, int add) {                      \
        enum { R = RV };                                                                                         \
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;     \
        __m512 c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00; \
        MB__RK_PREFETCH_C(R)                                                                                     \
        for (int part = 0; part < 2; part++) {                                                                   \
            const float *a = part ? A->a2 + r * A->lda2 : A->a1 + r * A->lda1;                                   \
            int64_t lda = part ? A->lda2 : A->lda1, K = part ? A->K2 : A->K1;                                    \
            for (int64_t k = 0; k < K; k++, p += 32) {                                                           \
                __m512 b0 = _mm512_loadu_ps(p), b1 = _mm512_loadu_ps(p + 16);                                    \
                MB__RK512_FMA(0) MB__RK512_FMA(1) MB__RK512_FMA(2) MB__RK512_FMA(3)                              \
                MB__RK512_FMA(4) MB__RK512_FMA(5) MB__RK512_FMA(6) MB__RK512_FMA(7)                              \
            }                                                                                                    \
        }                                                                                                        \
        __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffffu : (1u << nc) - 1u);                                        \
        __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xffffu : nc > 16 ? (1u << (nc - 16)) - 1u : 0u);                 \
        MB__RK512_STORE(0) MB__RK512_STORE(1) MB__RK512_STORE(2) MB__RK512_STORE(3)                              \
        MB__RK512_STORE(4) MB__RK512_STORE(5) MB__RK512_STORE(6) MB__RK512_STORE(7)                              \
        (void)c00; (void)c01; (void)c10; (void)c11; (void)c20; (void)c21; (void)c30; (void)c31;                 \
        (void)c40; (void)c41; (void)c50; (void)c51; (void)c60; (void)c61; (void)c70; (void)c71;                 \
    }
MB__RK512_TILE(8)
MB__RK512_TILE(4)
MB__RK512_TILE(2)
MB__RK512_TILE(1)
typedef void (*mb__rk_rows_fn)(const mb__rk_a *A, int64_t r, const float *p, float *c, int64_t ldc, int nc, int add);
/* mr rows through a variant's tiles f of MR, 4, 2 and 1 rows (the same bits a row). */
static void mb__rk_rows(const mb__rk_rows_fn *f, int MR, int mr, const mb__rk_a *A, int64_t r, const float *p,
                        float *c, int64_t ldc, int nc, int add) {
    for (int i = 0; i < mr;) {
        int n = mr - i >= MR ? MR : mr - i >= 4 ? 4 : mr - i >= 2 ? 2 : 1;
        f[n == MR ? 0 : n == 4 ? 1 : n == 2 ? 2 : 3](A, r + i, p, c + i * ldc, ldc, nc, add);
        i += n;
    }
}
static void mb__rk_tile_avx512(int mr, const mb__rk_a *A, int64_t r, const float *p, float *c, int64_t ldc, int nc,
                               int add) {
    static const mb__rk_rows_fn f[4] = {mb__rk_tile512_8, mb__rk_tile512_4, mb__rk_tile512_2, mb__rk_tile512_1};
    mb__rk_rows(f, 8, mr, A, r, p, c, ldc, nc, add);
}

/* AVX2 + FMA: R <= 6 rows x 16 columns (two ymm a row), 12 accumulators. */
#define MB__RK256_FMA(i)                                                                                         \
    if (R > i) {                                                                                                 \
        __m256 av = _mm256_broadcast_ss(a + i * lda + k);                                                        \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                                                              \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                                                              \
    }
#define MB__RK256_STORE(i)                                                                                       \
    if (R > i) {                                                                                                 \
        float *ci = c + i * ldc;                                                                                 \
        if (nc == 16) {                                                                                          \
            if (add) {                                                                                           \
                c##i##0 = _mm256_add_ps(_mm256_loadu_ps(ci), c##i##0);                                           \
                c##i##1 = _mm256_add_ps(_mm256_loadu_ps(ci + 8), c##i##1);                                       \
            }                                                                                                    \
            _mm256_storeu_ps(ci, c##i##0);                                                                       \
            _mm256_storeu_ps(ci + 8, c##i##1);                                                                   \
        } else { /* the last panel's columns */                                                                  \
            float t[16];                                                                                         \
            _mm256_storeu_ps(t, c##i##0);                                                                        \
            _mm256_storeu_ps(t + 8, c##i##1);                                                                    \
            for (int j = 0; j < nc; j++) ci[j] = add ? ci[j] + t[j] : t[j];                                      \
        }                                                                                                        \
    }
#define MB__RK256_TILE(RV)                                                                                       \
    __attribute__((target("avx2,fma"))) static void mb__rk_tile256_##RV(const mb__rk_a *A, int64_t r,          \
                                                                        const float *p, float *c, int64_t ldc, \
                                                                        int nc, int add) {                     \
        enum { R = RV };                                                                                         \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;                \
        __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                                \
        MB__RK_PREFETCH_C(R)                                                                                     \
        for (int part = 0; part < 2; part++) {                                                                   \
            const float *a = part ? A->a2 + r * A->lda2 : A->a1 + r * A->lda1;                                   \
            int64_t lda = part ? A->lda2 : A->lda1, K = part ? A->K2 : A->K1;                                    \
            for (int64_t k = 0; k < K; k++, p += 16) {                                                           \
                __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);                                     \
                MB__RK256_FMA(0) MB__RK256_FMA(1) MB__RK256_FMA(2)                                               \
                MB__RK256_FMA(3) MB__RK256_FMA(4) MB__RK256_FMA(5)                                               \
            }                                                                                                    \
        }                                                                                                        \
        MB__RK256_STORE(0) MB__RK256_STORE(1) MB__RK256_STORE(2) MB__RK256_STORE(3) MB__RK256_STORE(4)           \
        MB__RK256_STORE(5)                                                                                       \
        (void)c00; (void)c01; (void)c10; (void)c11; (void)c20; (void)c21;                                       \
        (void)c30; (void)c31; (void)c40; (void)c41; (void)c50; (void)c51;                                       \
    }
MB__RK256_TILE(6)
MB__RK256_TILE(4)
MB__RK256_TILE(2)
MB__RK256_TILE(1)
static void mb__rk_tile_avx2(int mr, const mb__rk_a *A, int64_t r, const float *p, float *c, int64_t ldc, int nc,
                             int add) {
    static const mb__rk_rows_fn f[4] = {mb__rk_tile256_6, mb__rk_tile256_4, mb__rk_tile256_2, mb__rk_tile256_1};
    mb__rk_rows(f, 6, mr, A, r, p, c, ldc, nc, add);
}
#endif

/* The variants: 0 AVX-512, 1 AVX2+FMA, 2 portable C. */
static const mb__rk mb__rk_variants[3] = {
#ifdef MB__RK_X86
    {"avx512", 32, 8, mb__rk_tile_avx512},
    {"avx2", 16, 6, mb__rk_tile_avx2},
#else
    {"c", 16, 4, mb__rk_tile_c},
    {"c", 16, 4, mb__rk_tile_c},
#endif
    {"c", 16, 4, mb__rk_tile_c},
};

/* Whether this CPU runs variant v. */
static int mb__rk_supported(int v) {
#ifdef MB__RK_X86
    if (v == 0) return __builtin_cpu_supports("avx512f");
    if (v == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return v == 2;
}

static const char *mb__rk_name(const mb__rk *k) { return k->name; }
static const mb__rk *mb__rk_of(int v) { return &mb__rk_variants[v]; }

/* The variant for a device's cpu_kernel (checked by mb_device_open): AUTO, the widest this
 * CPU runs; another, that one, or -1 where this CPU (or a build without x86 kernels) does
 * not run it. */
static int mb__rk_pick(mb_cpu_kernel want) {
    if (want == MB_CPU_KERNEL_AUTO) {
        for (int v = 0; v < 2; v++)
            if (mb__rk_supported(v)) return v;
        return 2;
    }
    int v = (int)want - 1;
#ifndef MB__RK_X86
    if (v < 2) return -1; /* variants 0 and 1 are the portable one here */
#endif
    return mb__rk_supported(v) ? v : -1;
}

/* C rows [0, M) = [A1 A2] op(W) (+ C) from W packed (mb__rk_pack, k->nr, K1 + K2 rows a
 * panel); panel by panel, so that a panel stays in cache while the rows pass. */
static void mb__rk_product(const mb__rk *k, int64_t M, int64_t N, const mb__rk_a *A, const float *packed, float *c,
                           int64_t ldc, int add) {
    int64_t Kt = A->K1 + A->K2;
    for (int64_t p0 = 0; p0 < N; p0 += k->nr) {
        const float *p = packed + p0 * Kt;
        int nc = (int)(N - p0 < k->nr ? N - p0 : k->nr);
        for (int64_t r = 0; r < M; r += k->mr)
            k->tile((int)(M - r < k->mr ? M - r : k->mr), A, r, p, c + r * ldc + p0, ldc, nc, add);
    }
}

/* The one-operand case: C = A op(W) (+ C), A (M, K) rows lda apart. */
static mb__rk_a mb__rk_a1(const float *a, int64_t lda, int64_t K) {
    mb__rk_a A = {a, a, lda, lda, K, 0};
    return A;
}

MB__OPS_BEGIN
static const mb__gemm_ops mb__cpu_gemm_ops = {.run = mb__cpu_gemm};
MB__OPS_END

// ---- params ----

struct mb_params {
    mb_device *dev;
    mb_param_info *info;
    int n, cap;
    size_t total;
    float *data, *grad;   /* device memory, NULL until finalized */
};

MBDEF mb_result mb_params_create(mb_params **out, mb_device *dev) {
    if (!out || !dev) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_params_create: NULL argument");
    *out = (mb_params *)mb__host_calloc(1, sizeof **out);
    if (!*out) return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_params_create: no host memory");
    (*out)->dev = dev;
    return MB_OK;
}

MBDEF void mb_params_destroy(mb_params *p) {
    if (!p) return;
    mb_free(p->dev, p->data);
    mb_free(p->dev, p->grad);
    MB_FREE(p->info);
    MB_FREE(p);
}

MBDEF mb_result mb_params_add(mb_params *p, const char *name, int rank, const int64_t *shape, float init_bound,
                              int *index) {
    const mb_logger *lg = p ? &p->dev->cfg.log : NULL;
    if (index) *index = -1; /* on failure too */
    if (!p || !name || !shape) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: NULL argument");
    if (p->data) return MB_FAIL(lg, MB_ERR_STATE, "mb_params_add: '%s' added after mb_params_finalize", name);
    if (strlen(name) == 0 || strlen(name) >= MB_MAX_NAME)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: name '%s' must be 1..%d bytes", name, MB_MAX_NAME - 1);
    if (rank < 1 || rank > MB_MAX_RANK)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: '%s' has rank %d, must be 1..%d", name, rank, MB_MAX_RANK);
    if (mb_params_find(p, name) >= 0)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: '%s' registered twice", name);
    if (!(init_bound >= 0.0f) || isinf(init_bound))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: '%s' init bound %g must be finite and >= 0", name,
                       (double)init_bound);
    for (int i = 0; i < rank; i++)
        if (shape[i] < 1)
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_params_add: '%s' dimension %d is %lld, must be >= 1", name, i,
                           (long long)shape[i]);
    size_t count, offset = (p->total + 63) & ~(size_t)63, end;
    if (!mb_size_product(shape, rank, 1, &count) || !mb_size_add(offset, count, &end) || end > SIZE_MAX / 8)
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "mb_params_add: '%s' makes the flat buffer overflow", name);
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 16;
        mb_param_info *n = (mb_param_info *)mb__host_calloc((size_t)cap, sizeof *n);
        if (!n) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_params_add: no host memory");
        if (p->n) memcpy(n, p->info, (size_t)p->n * sizeof *n);
        MB_FREE(p->info);
        p->info = n;
        p->cap = cap;
    }
    mb_param_info *t = &p->info[p->n];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
    t->offset = offset;
    t->count = count;
    t->init_bound = init_bound;
    t->no_decay = rank == 1;
    p->total = end;
    if (index) *index = p->n;
    p->n++;
    return MB_OK;
}

MBDEF mb_result mb_params_finalize(mb_params *p) {
    if (!p) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_params_finalize: NULL");
    const mb_logger *lg = &p->dev->cfg.log;
    if (p->data) return MB_FAIL(lg, MB_ERR_STATE, "mb_params_finalize: called twice");
    if (p->n == 0) return MB_FAIL(lg, MB_ERR_STATE, "mb_params_finalize: no tensors registered");
    size_t total = (p->total + 63) & ~(size_t)63, bytes = total * sizeof(float);
    float *d = NULL, *g = NULL;
    MB_TRY(mb_alloc(p->dev, MB_MEM_DEVICE, bytes, (void **)&d));
    mb_result r = mb_alloc(p->dev, MB_MEM_DEVICE, bytes, (void **)&g);
    if (r == MB_OK) r = mb_zero(p->dev, MB_STREAM_COMPUTE, d, bytes);
    if (r == MB_OK) r = mb_zero(p->dev, MB_STREAM_COMPUTE, g, bytes);
    if (r != MB_OK) { mb_free(p->dev, d); mb_free(p->dev, g); return r; }
    p->total = total;
    p->data = d;
    p->grad = g;
    return MB_OK;
}

MBDEF int mb_params_num_tensors(const mb_params *p) { return p->n; }
MBDEF const mb_param_info *mb_params_info(const mb_params *p, int i) { return (i >= 0 && i < p->n) ? &p->info[i] : NULL; }
MBDEF int mb_params_find(const mb_params *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->info[i].name, name) == 0) return i;
    return -1;
}
MBDEF size_t mb_params_total(const mb_params *p) { return p->total; }
MBDEF float *mb_params_data(mb_params *p) { return p->data; }
MBDEF float *mb_params_grad(mb_params *p) { return p->grad; }
MBDEF float *mb_params_tensor(mb_params *p, int i) {
    return (p->data && i >= 0 && i < p->n) ? p->data + p->info[i].offset : NULL;
}
MBDEF float *mb_params_tensor_grad(mb_params *p, int i) {
    return (p->grad && i >= 0 && i < p->n) ? p->grad + p->info[i].offset : NULL;
}
MBDEF mb_device *mb_params_device(const mb_params *p) { return p->dev; }

static mb_result mb__params_ready(mb_params *p, const char *what) {
    if (!p) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: NULL params", what);
    if (!p->data) return MB_FAIL(&p->dev->cfg.log, MB_ERR_STATE, "%s: mb_params_finalize not called", what);
    return MB_OK;
}

/* The backend's params group: n uniform values in [-bound, bound] from (seed, stream), on the
 * compute stream (mb_rng_symmetric: the same numbers on every backend). */
typedef struct mb__params_ops {
    mb_result (*fill_uniform)(mb_device *dev, float *dst, size_t n, uint64_t seed, uint64_t stream, float bound);
} mb__params_ops;
MB__OPS_CHECK(mb__params_ops, 1);

MBDEF mb_result mb_params_init(mb_params *p, uint64_t seed) {
    MB_TRY(mb__params_ready(p, "mb_params_init"));
    for (int t = 0; t < p->n; t++) {
        const mb_param_info *in = &p->info[t];
        MB_TRY(p->dev->be->params->fill_uniform(p->dev, p->data + in->offset, in->count, seed, (uint64_t)t, in->init_bound));
    }
    return MB_OK;
}

static mb_result mb__cpu_fill_uniform(mb_device *dev, float *dst, size_t n, uint64_t seed, uint64_t stream,
                                      float bound) {
    (void)dev;
    for (size_t j = 0; j < n; j++) dst[j] = mb_rng_symmetric(seed, stream, j, bound);
    return MB_OK;
}

MBDEF mb_result mb_params_zero_grad(mb_params *p) {
    MB_TRY(mb__params_ready(p, "mb_params_zero_grad"));
    return mb_zero(p->dev, MB_STREAM_COMPUTE, p->grad, p->total * sizeof(float));
}

MBDEF mb_result mb_params_get(mb_params *p, float *host) {
    MB_TRY(mb__params_ready(p, "mb_params_get"));
    MB_TRY(mb_copy(p->dev, MB_STREAM_COMPUTE, host, p->data, p->total * sizeof(float)));
    return mb_sync(p->dev, MB_STREAM_COMPUTE);
}

MBDEF mb_result mb_params_set(mb_params *p, const float *host) {
    MB_TRY(mb__params_ready(p, "mb_params_set"));
    MB_TRY(mb_copy(p->dev, MB_STREAM_COMPUTE, p->data, host, p->total * sizeof(float)));
    return mb_sync(p->dev, MB_STREAM_COMPUTE);
}

MB__OPS_BEGIN
static const mb__params_ops mb__cpu_params_ops = {.fill_uniform = mb__cpu_fill_uniform};
MB__OPS_END

// ---- dataset ----

#ifndef MEGABATCH_NO_HDF5
#ifdef __cplusplus
} /* hdf5.h outside our extern "C" block */
#endif
#include <hdf5.h>
#ifdef __cplusplus
extern "C" {
#endif
#endif
#include <errno.h>

struct mb_dataset {
    mb_dataset_meta meta;
    mb_dataset_config cfg;
    char fname[MB_MAX_NAME], tname[MB_MAX_NAME];
    const struct mb__source *src; /* the layout behind the samples (// -- the data source --) */
    void *ctx;                   /* the source's own state (series: mb__series_ds); NULL: none */
    const float *mem_f, *mem_t;  /* the window layout in memory: caller arrays */
#ifndef MEGABATCH_NO_HDF5
    hid_t file, dfeat, dtarg;    /* HDF5 handles (file datasets) */
    const char *dfeat_name;      /* what dfeat holds, for attributes: fname, or "ends" (series) */
#endif
};

// -- the data source --
// Where a dataset's samples come from, and how the loader gets them onto the device. Two
// layouts implement it: the window layout (features (N, T, F) stored as trained, in caller
// memory or an HDF5 file: its reads in // -- the window layout -- below) and the series
// layout (bars stored once, windows cut by index: // ---- series ----). A source fills
// ds->meta when it opens a dataset; after that the dataset and the loader reach it only
// through these functions, so neither knows which layout it serves.
typedef struct mb__source {
    const char *name; /* "window" or "series" */
    /* Samples [start, start + n) as float32 (n, t, f) and (n, k), before the NaN policy. */
    mb_result (*read)(mb_dataset *ds, int64_t start, int64_t n, float *feat, float *targ);
    /* Free ds->ctx (the dataset closes its HDF5 handles itself). */
    void (*close)(mb_dataset *ds);
    /* The loader's device side, after mb_loader_open's checks and plan (ld->plan): allocate
     * it and adjust the plan (loader_open), the batch at the loader's position (loader_next:
     * *done = 1 with *out filled, or 0 when none is left there and the position moved on),
     * free it, also after a failed open (loader_close). */
    mb_result (*loader_open)(mb_loader *ld, size_t free_bytes);
    mb_result (*loader_next)(mb_loader *ld, mb_batch *out, int *done);
    void (*loader_close)(mb_loader *ld);
} mb__source;

/* The window layout's table, at the end of the loader module beside its chunks (the series
 * layout's ends its module). A function that returns it, not a declaration of the table:
 * C++ cannot declare a static object ahead of its definition. */
static const mb__source *mb__window_source(void);
#ifndef MEGABATCH_NO_HDF5
static mb_result mb__sr_h5_validate(mb_dataset *ds); /* a series file: its source opens the rest */
#endif

/* Check one non-finite-free sample, apply the policy. Returns 1 to keep, 0 to skip,
 * -1 for an error (recorded). i: the file index of the sample. */
static int mb__ds_sample_policy(mb_dataset *ds, float *feat, float *targ, int64_t i) {
    size_t nf = (size_t)(ds->meta.t * ds->meta.f), nk = (size_t)ds->meta.k, bad = 0;
    const char *where = NULL;
    for (size_t j = 0; j < nf; j++) if (!isfinite(feat[j])) { if (!where) { where = ds->fname; bad = j; } break; }
    if (!where) for (size_t j = 0; j < nk; j++) if (!isfinite(targ[j])) { where = ds->tname; bad = j; break; }
    if (!where) return 1;
    if (ds->cfg.nan_policy == MB_NAN_SKIP) return 0;
    if (ds->cfg.nan_policy == MB_NAN_ZERO) {
        for (size_t j = 0; j < nf; j++) if (!isfinite(feat[j])) feat[j] = 0.0f;
        for (size_t j = 0; j < nk; j++) if (!isfinite(targ[j])) targ[j] = 0.0f;
        return 1;
    }
    float v = where == ds->fname ? feat[bad] : targ[bad];
    MB_FAIL(&ds->cfg.log, MB_ERR_NONFINITE, "%s: dataset '%s': non-finite value %g at sample %lld (element %zu of "
            "the sample; nan_policy = error)", ds->meta.source, where, (double)v, (long long)i, bad);
    return -1;
}

/* Apply the NaN policy to rows read for samples [start, start+n), packing kept rows. */
static mb_result mb__ds_policy(mb_dataset *ds, int64_t start, int64_t n, float *feat, float *targ, int64_t *rows) {
    size_t nf = (size_t)(ds->meta.t * ds->meta.f), nk = (size_t)ds->meta.k;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        float *fi = feat + (size_t)i * nf, *ti = targ + (size_t)i * nk;
        int keep = mb__ds_sample_policy(ds, fi, ti, start + i);
        if (keep < 0) return MB_ERR_NONFINITE;
        if (!keep) continue;
        if (kept != i) {
            memmove(feat + (size_t)kept * nf, fi, nf * sizeof(float));
            memmove(targ + (size_t)kept * nk, ti, nk * sizeof(float));
        }
        kept++;
    }
    if (kept != n && !rows)
        return MB_FAIL(&ds->cfg.log, MB_ERR_INVALID_ARG, "mb_dataset_read: %s: samples skipped (nan_policy = "
                       "skip) but rows is NULL", ds->meta.source);
    if (rows) *rows = kept;
    return MB_OK;
}

/* Shape checks shared by both kinds of dataset; fills sizes in meta. */
static mb_result mb__ds_check_shape(mb_dataset *ds) {
    mb_dataset_meta *m = &ds->meta;
    const mb_logger *lg = &ds->cfg.log;
    if (m->n < 1 || m->t < 1 || m->f < 1 || m->k < 1)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: '%s' (%lld, %lld, %lld) / '%s' (%lld, %lld): zero dimension "
                       "(N, T, F and K must be >= 1)", m->source, ds->fname, (long long)m->n, (long long)m->t,
                       (long long)m->f, ds->tname, (long long)m->n, (long long)m->k);
    int64_t per[2] = {m->t, m->f};
    size_t fb, bps, total, cap = ds->cfg.max_bytes ? ds->cfg.max_bytes : ((size_t)1 << 40);
    if (!mb_size_product(per, 2, sizeof(float), &fb) || !mb_size_add(fb, (size_t)m->k * sizeof(float), &bps) ||
        (uint64_t)m->k > SIZE_MAX / 8 || !mb_size_mul(bps, (size_t)m->n, &total))
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "%s: '%s' (%lld, %lld, %lld): byte count overflows size_t",
                       m->source, ds->fname, (long long)m->n, (long long)m->t, (long long)m->f);
    if (total > cap)
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "%s: '%s' (%lld, %lld, %lld) + '%s': %zu bytes exceed the cap of %zu "
                       "bytes (mb_dataset_config.max_bytes)", m->source, ds->fname, (long long)m->n,
                       (long long)m->t, (long long)m->f, ds->tname, total, cap);
    m->bytes_per_sample = bps;
    m->total_bytes = total;
    return MB_OK;
}

static mb_result mb__ds_new(mb_dataset **out, const char *source, const mb_dataset_config *cfg) {
    mb_dataset *ds = (mb_dataset *)mb__host_calloc(1, sizeof *ds);
    if (!ds) return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_OUT_OF_MEMORY, "mb_dataset: no host memory");
    if (cfg) ds->cfg = *cfg;
    const char *fn = ds->cfg.features_name ? ds->cfg.features_name : "features";
    const char *tn = ds->cfg.targets_name ? ds->cfg.targets_name : "targets";
    ds->cfg.features_name = ds->cfg.targets_name = NULL; /* the caller's strings need not outlive us */
    if (strlen(fn) == 0 || strlen(fn) >= MB_MAX_NAME || strlen(tn) == 0 || strlen(tn) >= MB_MAX_NAME) {
        MB_FREE(ds);
        return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_INVALID_ARG, "mb_dataset: dataset names '%s', '%s' must be "
                       "1..%d bytes", fn, tn, MB_MAX_NAME - 1);
    }
    if ((unsigned)ds->cfg.nan_policy > MB_NAN_ZERO) {
        MB_FREE(ds);
        return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_INVALID_ARG, "mb_dataset: unknown nan_policy %d",
                       (int)cfg->nan_policy);
    }
    strcpy(ds->fname, fn);
    strcpy(ds->tname, tn);
    snprintf(ds->meta.source, sizeof ds->meta.source, "%s", source);
    ds->src = mb__window_source(); /* until an open finds the series layout */
#ifndef MEGABATCH_NO_HDF5
    ds->file = ds->dfeat = ds->dtarg = -1;
    ds->dfeat_name = ds->fname;
#endif
    *out = ds;
    return MB_OK;
}

MBDEF mb_result mb_dataset_open_memory(mb_dataset **out, const float *features, const float *targets, int64_t n,
                                       int64_t t, int64_t f, int64_t k, const mb_dataset_config *cfg) {
    if (!out || !features || !targets)
        return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_INVALID_ARG, "mb_dataset_open_memory: NULL argument");
    *out = NULL;
    mb_dataset *ds = NULL;
    MB_TRY(mb__ds_new(&ds, "memory", cfg));
    ds->meta.n = n; ds->meta.t = t; ds->meta.f = f; ds->meta.k = k;
    strcpy(ds->meta.features_type, "float32");
    strcpy(ds->meta.targets_type, "float32");
    mb_result r = mb__ds_check_shape(ds);
    if (r != MB_OK) { MB_FREE(ds); return r; }
    ds->mem_f = features;
    ds->mem_t = targets;
    *out = ds;
    return MB_OK;
}

MBDEF const mb_dataset_meta *mb_dataset_info(const mb_dataset *ds) { return ds ? &ds->meta : NULL; }

#ifndef MEGABATCH_NO_HDF5
/* HDF5 never prints: its automatic error printing is off while we call it, and its
 * error stack is folded into our message. */
/* Plugin (dynamically loaded filter) loading is off while we call it too: a file must
 * not make this process load a shared library; the caller's setting comes back after. */
#include <H5PLpublic.h>
typedef struct mb__h5quiet { H5E_auto2_t fn; void *data; unsigned plugins; } mb__h5quiet;
static mb__h5quiet mb__h5_quiet(void) {
    mb__h5quiet q;
    q.fn = NULL; q.data = NULL; q.plugins = 0;
    H5Eget_auto2(H5E_DEFAULT, &q.fn, &q.data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (H5PLget_loading_state(&q.plugins) < 0) q.plugins = H5PL_ALL_PLUGIN;
    H5PLset_loading_state(0);
    return q;
}
static void mb__h5_restore(mb__h5quiet q) {
    H5PLset_loading_state(q.plugins);
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, q.fn, q.data);
}

static herr_t mb__h5_walk(unsigned n, const H5E_error2_t *e, void *user) {
    char *buf = (char *)user;
    size_t len = strlen(buf);
    if (n < 4 && e->desc && len + 8 < 512)
        snprintf(buf + len, 512 - len, "%s%s (%s)", len ? "; " : "", e->desc, e->func_name ? e->func_name : "?");
    return 0;
}
/* The current HDF5 error stack as one line (innermost first), then cleared. */
static const char *mb__h5_stack(char *buf) {
    buf[0] = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, mb__h5_walk, buf);
    H5Eclear2(H5E_DEFAULT);
    return buf[0] ? buf : "no HDF5 detail";
}

static void mb__h5_type_name(hid_t type, char *out, size_t cap) {
    H5T_class_t c = H5Tget_class(type);
    size_t sz = H5Tget_size(type);
    if (c == H5T_FLOAT) snprintf(out, cap, "float%zu", sz * 8);
    else if (c == H5T_INTEGER) snprintf(out, cap, "%sint%zu", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", sz * 8);
    else snprintf(out, cap, "%s", c == H5T_STRING ? "string" : c == H5T_COMPOUND ? "compound" : c == H5T_ENUM ? "enum"
                  : c == H5T_ARRAY ? "array" : c == H5T_VLEN ? "vlen" : c == H5T_REFERENCE ? "reference"
                  : c == H5T_OPAQUE ? "opaque" : c == H5T_BITFIELD ? "bitfield" : c == H5T_TIME ? "time" : "unknown");
}

/* A numeric type whose bit layout fits its size: HDF5 1.10.8 takes the precision, bit
 * offset and float fields from the file as they are, and its conversion on read then
 * copies bits far outside the element (an int16 at bit offset 4096, found by fuzzing,
 * crashes with SIGBUS). Float fields count from the offset and must not overlap. */
static int mb__h5_type_sane(hid_t type, H5T_class_t c) {
    size_t bits = H5Tget_size(type) * 8, prec = H5Tget_precision(type);
    int off = H5Tget_offset(type);
    if (prec < 1 || off < 0 || (size_t)off > bits || prec > bits - (size_t)off) return 0;
    if (c != H5T_FLOAT) return 1;
    size_t sp = 0, ep = 0, es = 0, mp = 0, ms = 0;
    if (H5Tget_fields(type, &sp, &ep, &es, &mp, &ms) < 0 || es < 1 || ms < 1) return 0;
    return sp < prec && ep + es <= prec && mp + ms <= prec && (ep >= mp + ms || mp >= ep + es) &&
           (sp < mp || sp >= mp + ms) && (sp < ep || sp >= ep + es);
}

/* Filters HDF5 has built in that we accept; anything else (including plugins) is refused. */
static int mb__h5_filter_ok(H5Z_filter_t id) {
    return id == H5Z_FILTER_DEFLATE || id == H5Z_FILTER_SHUFFLE || id == H5Z_FILTER_FLETCHER32;
}

/* Chunk shape of a chunked dataset: rank r, every dim >= 1 and not absurdly larger than
 * the dataset's (at most 16x + 1024), one chunk at most 1 GiB. */
static mb_result mb__h5_check_chunks(mb_dataset *ds, const char *name, hid_t pl, const hsize_t *dims, int r,
                                     hsize_t esz) {
    const mb_logger *lg = &ds->cfg.log;
    hsize_t cd[32];
    int cr = H5Pget_chunk(pl, 32, cd);
    if (cr != r)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has chunks of rank %d for rank %d", ds->meta.source,
                       name, cr, r);
    hsize_t bytes = esz;
    for (int i = 0; i < r; i++) {
        if (cd[i] < 1 || cd[i] > dims[i] * 16 + 1024 || cd[i] > ((hsize_t)1 << 30))
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s': chunk dimension %d is %llu for a dimension of %llu",
                           ds->meta.source, name, i, (unsigned long long)cd[i], (unsigned long long)dims[i]);
        bytes *= cd[i];
        if (bytes > ((hsize_t)1 << 30))
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s': one chunk exceeds 1 GiB", ds->meta.source, name);
    }
    return MB_OK;
}

/* Storage checks: contiguous or chunked layout, no external files, filters on the allow
 * list, sane chunks, and stored bytes consistent with the shape (need) and the file size. */
static mb_result mb__h5_check_storage(mb_dataset *ds, const char *name, hid_t d, hid_t pl, const hsize_t *dims,
                                      int r, hsize_t esz, hsize_t need) {
    const mb_logger *lg = &ds->cfg.log;
    const char *src = ds->meta.source;
    H5D_layout_t lay = H5Pget_layout(pl);
    if (lay != H5D_CONTIGUOUS && lay != H5D_CHUNKED)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has %s layout (only contiguous or chunked are read)", src,
                       name, lay == H5D_COMPACT ? "compact" : lay == H5D_VIRTUAL ? "virtual" : "an unknown");
    int ext = H5Pget_external_count(pl);
    if (ext != 0)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' keeps its data in %d external file(s) (refused)", src,
                       name, ext);
    int nf = H5Pget_nfilters(pl);
    if (nf < 0 || nf > 8) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has %d filters", src, name, nf);
    for (int i = 0; i < nf; i++) {
        unsigned flags = 0, cv[8];
        size_t ncv = 8;
        char fname[64] = "";
        H5Z_filter_t id = H5Pget_filter2(pl, (unsigned)i, &flags, &ncv, cv, sizeof fname, fname, NULL);
        if (!mb__h5_filter_ok(id))
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' uses filter %d '%s' (allowed: deflate, shuffle, "
                           "fletcher32)", src, name, (int)id, fname);
    }
    if (lay == H5D_CHUNKED) MB_TRY(mb__h5_check_chunks(ds, name, pl, dims, r, esz));
    hsize_t stored = H5Dget_storage_size(d), fsize = 0;
    if (H5Fget_filesize(ds->file, &fsize) >= 0 && stored > fsize)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' claims %llu bytes of storage in a file of %llu bytes",
                       src, name, (unsigned long long)stored, (unsigned long long)fsize);
    if (lay == H5D_CONTIGUOUS && need > 0) {
        if (stored < need)
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' is truncated: %llu bytes stored, its shape needs "
                           "%llu", src, name, (unsigned long long)stored, (unsigned long long)need);
        haddr_t off = H5Dget_offset(d);
        if (off == HADDR_UNDEF || off > fsize || fsize - off < need)
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s': its %llu bytes at offset %llu lie past the end of "
                           "the file (%llu bytes)", src, name, (unsigned long long)need, (unsigned long long)off,
                           (unsigned long long)fsize);
    }
    return MB_OK;
}

/* Open dataset `name` and check it: reached by a hard link, a dataset (not a group), rank
 * in [rmin, rmax], a numeric type, storage per mb__h5_check_storage. dims gets the shape. */
static mb_result mb__h5_open_ds(mb_dataset *ds, const char *name, int rmin, int rmax, hid_t *out, hsize_t *dims,
                                int *rank, char *tname) {
    const mb_logger *lg = &ds->cfg.log;
    const char *src = ds->meta.source;
    char st[512];
    htri_t ex = H5Lexists(ds->file, name, H5P_DEFAULT);
    if (ex <= 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: missing dataset '%s'", src, name);
    H5L_info_t li;
    if (H5Lget_info(ds->file, name, &li, H5P_DEFAULT) < 0)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: cannot read the link '%s': %s", src, name, mb__h5_stack(st));
    if (li.type != H5L_TYPE_HARD)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: '%s' is a %s link, not a dataset in this file (hard link)", src, name,
                       li.type == H5L_TYPE_SOFT ? "soft" : li.type == H5L_TYPE_EXTERNAL ? "external" : "user-defined");
    hid_t obj = H5Oopen(ds->file, name, H5P_DEFAULT);
    if (obj < 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: cannot open '%s': %s", src, name, mb__h5_stack(st));
    H5I_type_t it = H5Iget_type(obj);
    H5Oclose(obj);
    if (it != H5I_DATASET)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: '%s' is a %s, not a dataset", src, name,
                       it == H5I_GROUP ? "group" : it == H5I_DATATYPE ? "named datatype" : "non-dataset object");
    hid_t d = H5Dopen2(ds->file, name, H5P_DEFAULT);
    if (d < 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: cannot open dataset '%s': %s", src, name, mb__h5_stack(st));
    hid_t sp = H5Dget_space(d), ty = H5Dget_type(d), pl = H5Dget_create_plist(d);
    int r = H5Sget_simple_extent_ndims(sp);
    mb_result res = MB_OK;
    H5T_class_t cls = H5Tget_class(ty);
    mb__h5_type_name(ty, tname, 32);
    size_t esz = H5Tget_size(ty);
    if (r < rmin || r > rmax)
        res = MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has rank %d, expected %s", src, name, r,
                      rmin == rmax ? (rmin == 3 ? "3 (N, T, F)" : "2") : "2 (N, K) or 1 (N)");
    else if (cls != H5T_FLOAT && cls != H5T_INTEGER)
        res = MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has dtype %s, not a number (float or integer)", src, name,
                      tname);
    else if (!mb__h5_type_sane(ty, cls))
        res = MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has a malformed %s type (precision %zu, bit offset %d)",
                      src, name, tname, H5Tget_precision(ty), H5Tget_offset(ty));
    if (res == MB_OK) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        *rank = r;
        hsize_t need = esz;
        int over = 0;
        for (int i = 0; i < r; i++) {
            if (dims[i] && need > (hsize_t)-1 / dims[i]) over = 1;
            else need *= dims[i];
        }
        if (over) res = MB_FAIL(lg, MB_ERR_OVERFLOW, "%s: dataset '%s': byte count overflows", src, name);
        else res = mb__h5_check_storage(ds, name, d, pl, dims, r, esz, need);
    }
    H5Sclose(sp); H5Tclose(ty); H5Pclose(pl);
    if (res != MB_OK) { H5Dclose(d); H5Eclear2(H5E_DEFAULT); return res; }
    *out = d;
    return MB_OK;
}

/* Reopen a dataset with a chunk cache big enough for a range read of whole chunk rows. */
static mb_result mb__h5_set_cache(mb_dataset *ds, hid_t *d, const char *name) {
    hid_t pl = H5Dget_create_plist(*d);
    if (H5Pget_layout(pl) != H5D_CHUNKED) { H5Pclose(pl); return MB_OK; }
    hsize_t cd[3] = {1, 1, 1}, dims[3] = {1, 1, 1};
    hid_t sp = H5Dget_space(*d), ty = H5Dget_type(*d);
    int r = H5Pget_chunk(pl, 3, cd);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    size_t bytes = H5Tget_size(ty);
    for (int i = 0; i < r; i++) bytes *= (size_t)cd[i] * (i ? (size_t)((dims[i] + cd[i] - 1) / cd[i]) : 1);
    H5Sclose(sp); H5Tclose(ty); H5Pclose(pl);
    size_t want = ds->cfg.chunk_cache_bytes ? ds->cfg.chunk_cache_bytes : bytes < ((size_t)16 << 20) ? ((size_t)16 << 20) : bytes;
    hid_t ap = H5Pcreate(H5P_DATASET_ACCESS);
    H5Pset_chunk_cache(ap, 12421, want, 1.0);
    hid_t nd = H5Dopen2(ds->file, name, ap);
    H5Pclose(ap);
    char st[512];
    if (nd < 0) return MB_FAIL(&ds->cfg.log, MB_ERR_IO, "%s: reopening '%s' with a chunk cache: %s", ds->meta.source,
                               name, mb__h5_stack(st));
    H5Dclose(*d);
    *d = nd;
    MB_LOG(&ds->cfg.log, MB_LOG_DEBUG, "%s: '%s' chunked, chunk cache %zu bytes", ds->meta.source, name, want);
    return MB_OK;
}

/* Read a string attribute that must be one element into text (cap bytes with the NUL):
 * fixed-length or variable-length (h5py's default for str), ASCII or UTF-8 (read in the
 * file's character set: HDF5 converts neither into the other), NUL- or space-padded.
 * A longer string is refused, not cut. */
static mb_result mb__h5_attr_string(mb_dataset *ds, hid_t a, const char *name, char *text, size_t cap) {
    const mb_logger *lg = &ds->cfg.log;
    const char *src = ds->meta.source;
    char st[512];
    hid_t ty = H5Aget_type(a), asp = H5Aget_space(a), mt = H5Tcopy(H5T_C_S1);
    hssize_t np = H5Sget_simple_extent_npoints(asp); /* H5Aread writes every element: one buffer, one string */
    H5T_cset_t cs = H5Tget_cset(ty);
    int vlen = H5Tis_variable_str(ty) > 0;
    size_t sz = vlen ? 0 : H5Tget_size(ty);
    text[0] = 0;
    mb_result r = MB_OK;
    if (H5Tget_class(ty) != H5T_STRING)
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s' is not a string", src, name, ds->fname);
    else if (np != 1)
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s' must be one string (\"A,B,C\"); it has %lld "
                    "elements", src, name, ds->fname, (long long)np);
    else if (cs != H5T_CSET_ASCII && cs != H5T_CSET_UTF8)
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' has an unknown character set %d", src, name, (int)cs);
    else if (!vlen && (sz == 0 || sz >= cap))
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: '%s' too long (%zu bytes)", src, name, sz);
    else if (H5Tset_cset(mt, cs) < 0 || H5Tset_size(mt, vlen ? H5T_VARIABLE : sz + 1) < 0)
        r = MB_FAIL(lg, MB_ERR_IO, "%s: reading '%s': %s", src, name, mb__h5_stack(st));
    if (r == MB_OK && vlen) {
        char *s = NULL;
        if (H5Aread(a, mt, &s) < 0) r = MB_FAIL(lg, MB_ERR_IO, "%s: reading '%s': %s", src, name, mb__h5_stack(st));
        else if (s && strlen(s) >= cap) r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: '%s' too long (%zu bytes)", src, name, strlen(s));
        else if (s) memcpy(text, s, strlen(s) + 1);
        if (s) H5free_memory(s);
    } else if (r == MB_OK && H5Aread(a, mt, text) < 0) {
        r = MB_FAIL(lg, MB_ERR_IO, "%s: reading '%s': %s", src, name, mb__h5_stack(st));
    }
    text[cap - 1] = 0;
    for (size_t n = strlen(text); n > 0 && text[n - 1] == ' '; n--) text[n - 1] = 0; /* space padding */
    H5Tclose(mt); H5Sclose(asp); H5Tclose(ty);
    return r;
}

/* Optional attributes on features: `segments` (ints summing to T), `segment_names`. */
static mb_result mb__h5_segments(mb_dataset *ds) {
    mb_dataset_meta *m = &ds->meta;
    const mb_logger *lg = &ds->cfg.log;
    char st[512];
    if (H5Aexists(ds->dfeat, "segments") > 0) {
        hid_t a = H5Aopen(ds->dfeat, "segments", H5P_DEFAULT), sp = H5Aget_space(a), ty = H5Aget_type(a);
        hssize_t n = H5Sget_simple_extent_npoints(sp);
        H5T_class_t c = H5Tget_class(ty);
        H5Sclose(sp); H5Tclose(ty);
        long long v[MB_MAX_SEGMENTS];
        mb_result r = MB_OK;
        if (c != H5T_INTEGER || n < 1 || n > MB_MAX_SEGMENTS)
            r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute 'segments' of '%s' must be 1..%d integers (has %lld "
                        "values)", m->source, ds->fname, MB_MAX_SEGMENTS, (long long)n);
        else if (H5Aread(a, H5T_NATIVE_LLONG, v) < 0)
            r = MB_FAIL(lg, MB_ERR_IO, "%s: reading attribute 'segments': %s", m->source, mb__h5_stack(st));
        H5Aclose(a);
        MB_TRY(r);
        long long sum = 0;
        for (int i = 0; i < (int)n; i++) {
            if (v[i] < 1 || v[i] > (m->t ? (long long)m->t : 1ll << 40)) /* bounded: the sum cannot overflow */
                return MB_FAIL(lg, MB_ERR_FORMAT, "%s: segment %d of '%s' has length %lld (T = %lld)", m->source, i,
                               ds->fname, v[i], (long long)m->t);
            sum += v[i];
            m->segment_len[i] = v[i];
        }
        if (m->t == 0) m->t = sum; /* the series layout: the windows define T */
        else if (sum != m->t)
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute 'segments' of '%s' sums to %lld, but T = %lld",
                           m->source, ds->fname, sum, (long long)m->t);
        m->segments = (int)n;
    }
    if (H5Aexists(ds->dfeat, "segment_names") <= 0) return MB_OK;
    if (!m->segments)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: the required attribute 'segments' of '%s' is missing (it has "
                       "'segment_names' but no segment lengths)", m->source, ds->fname);
    char text[MB_MAX_SEGMENTS * MB_MAX_NAME];
    hid_t a = H5Aopen(ds->dfeat, "segment_names", H5P_DEFAULT);
    mb_result r = mb__h5_attr_string(ds, a, "segment_names", text, sizeof text);
    H5Aclose(a);
    MB_TRY(r);
    int i = 0;
    for (char *p = text, *tok; (tok = p) != NULL && i <= MB_MAX_SEGMENTS; i++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        p = comma ? comma + 1 : NULL;
        if (i < MB_MAX_SEGMENTS) {
            size_t len = strlen(tok) < MB_MAX_NAME - 1 ? strlen(tok) : MB_MAX_NAME - 1;
            while (len < strlen(tok) && len > 0 && ((unsigned char)tok[len] & 0xC0) == 0x80) len--; /* whole UTF-8 characters */
            memcpy(m->segment_name[i], tok, len);
            m->segment_name[i][len] = 0;
        }
    }
    if (i != m->segments)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute 'segment_names' of '%s' has %d names for %d segments",
                       m->source, ds->fname, i, m->segments);
    return MB_OK;
}

/* Everything after H5Fopen: both datasets, their agreement, attributes, cache. */
static mb_result mb__h5_validate(mb_dataset *ds) {
    mb_dataset_meta *m = &ds->meta;
    hsize_t fd[3] = {0, 0, 0}, td[2] = {0, 1};
    int fr = 0, tr = 0;
    if (H5Lexists(ds->file, ds->fname, H5P_DEFAULT) <= 0 && H5Lexists(ds->file, "ends", H5P_DEFAULT) > 0)
        return mb__sr_h5_validate(ds); /* the series layout */
    MB_TRY(mb__h5_open_ds(ds, ds->fname, 3, 3, &ds->dfeat, fd, &fr, m->features_type));
    MB_TRY(mb__h5_open_ds(ds, ds->tname, 1, 2, &ds->dtarg, td, &tr, m->targets_type));
    if (tr == 1) td[1] = 1;
    if (fd[0] != td[0])
        return MB_FAIL(&ds->cfg.log, MB_ERR_FORMAT, "%s: N differs: '%s' has %llu samples, '%s' has %llu",
                       m->source, ds->fname, (unsigned long long)fd[0], ds->tname, (unsigned long long)td[0]);
    for (int i = 0; i < 3; i++)
        if (fd[i] > (hsize_t)INT64_MAX / 2 || (i < 2 && td[i] > (hsize_t)INT64_MAX / 2))
            return MB_FAIL(&ds->cfg.log, MB_ERR_OVERFLOW, "%s: dimension too large", m->source);
    m->n = (int64_t)fd[0]; m->t = (int64_t)fd[1]; m->f = (int64_t)fd[2]; m->k = (int64_t)td[1];
    MB_TRY(mb__ds_check_shape(ds));
    MB_TRY(mb__h5_segments(ds));
    if (strcmp(m->features_type, "float32") || strcmp(m->targets_type, "float32"))
        MB_LOG(&ds->cfg.log, MB_LOG_INFO, "%s: '%s' is %s and '%s' is %s; HDF5 converts to float32 on read",
               m->source, ds->fname, m->features_type, ds->tname, m->targets_type);
    MB_TRY(mb__h5_set_cache(ds, &ds->dfeat, ds->fname));
    return mb__h5_set_cache(ds, &ds->dtarg, ds->tname);
}

/* On some corrupt files H5Fclose fails and HDF5 keeps the file open; HDF5's own shutdown
 * at exit then crashes on it (found by fuzzing: docs/RELIABILITY.md). Nothing here can
 * undo that (a second H5Fclose crashes too); the warning says so. */
static void mb__h5_close(mb_dataset *ds) {
    if (ds->dfeat >= 0) H5Dclose(ds->dfeat);
    if (ds->dtarg >= 0) H5Dclose(ds->dtarg);
    if (ds->file >= 0 && H5Fclose(ds->file) < 0)
        MB_LOG(&ds->cfg.log, MB_LOG_WARN, "%s: HDF5 could not close the file; it stays open inside HDF5, whose "
               "shutdown at exit may crash on it (open untrusted files with isolate = 1)", ds->meta.source);
    ds->dfeat = ds->dtarg = ds->file = -1;
}

/* The probe's report and the in-process open describe the same file. */
static int mb__meta_same(const mb_dataset_meta *a, const mb_dataset_meta *b) {
    int same = a->n == b->n && a->t == b->t && a->f == b->f && a->k == b->k && a->segments == b->segments &&
               a->layout == b->layout && !strcmp(a->features_type, b->features_type) &&
               !strcmp(a->targets_type, b->targets_type);
    for (int i = 0; same && i < a->segments; i++)
        same = a->segment_len[i] == b->segment_len[i] && a->bars[i] == b->bars[i] &&
               !strcmp(a->segment_name[i], b->segment_name[i]);
    return same;
}

MBDEF mb_result mb_dataset_open_file(mb_dataset **out, const char *path, const mb_dataset_config *cfg) {
    const mb_logger *lg = cfg ? &cfg->log : NULL;
    if (!out || !path) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_dataset_open_file: NULL argument");
    *out = NULL;
    FILE *fp = mb__os_fopen_rb(path);
    if (!fp) return MB_FAIL(lg, MB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fclose(fp);
    mb_dataset_meta probed;
    if (cfg && cfg->isolate) MB_TRY(mb_dataset_probe(path, cfg, &probed));
    mb_dataset *ds = NULL;
    MB_TRY(mb__ds_new(&ds, path, cfg));
    mb__h5quiet q = mb__h5_quiet();
    char st[512];
    mb_result r = MB_OK;
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: not an HDF5 file (%s)", path, is < 0 ? mb__h5_stack(st) : "no HDF5 signature");
    } else if ((ds->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        r = MB_FAIL(lg, MB_ERR_IO, "%s: HDF5 cannot open the file: %s", path, mb__h5_stack(st));
    } else {
        r = mb__h5_validate(ds);
    }
    if (r == MB_OK && cfg && cfg->isolate && !mb__meta_same(&probed, &ds->meta))
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: the file changed between the probe and the open (the probe saw N=%lld "
                    "T=%lld F=%lld K=%lld, the open N=%lld T=%lld F=%lld K=%lld)", path, (long long)probed.n,
                    (long long)probed.t, (long long)probed.f, (long long)probed.k, (long long)ds->meta.n,
                    (long long)ds->meta.t, (long long)ds->meta.f, (long long)ds->meta.k);
    if (r != MB_OK) { mb__h5_close(ds); ds->src->close(ds); MB_FREE(ds); }
    else *out = ds;
    H5Eclear2(H5E_DEFAULT);
    mb__h5_restore(q);
    return r;
}

/* Hyperslab read of rows [start, start+n) of a rank-r dataset into dst (float32). */
static mb_result mb__h5_read_rows(mb_dataset *ds, hid_t d, const char *name, int64_t start, int64_t n, float *dst) {
    hid_t fs = H5Dget_space(d);
    int r = H5Sget_simple_extent_ndims(fs);
    hsize_t off[3] = {(hsize_t)start, 0, 0}, cnt[3];
    H5Sget_simple_extent_dims(fs, cnt, NULL);
    cnt[0] = (hsize_t)n;
    herr_t e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
    hid_t ms = H5Screate_simple(r, cnt, NULL);
    if (e >= 0) e = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst);
    H5Sclose(ms); H5Sclose(fs);
    char st[512];
    if (e < 0)
        return MB_FAIL(&ds->cfg.log, MB_ERR_IO, "%s: reading samples [%lld, %lld) of '%s': %s", ds->meta.source,
                       (long long)start, (long long)(start + n), name, mb__h5_stack(st));
    return MB_OK;
}
#endif /* MEGABATCH_NO_HDF5 */

#ifdef MEGABATCH_NO_HDF5
MBDEF mb_result mb_dataset_open_file(mb_dataset **out, const char *path, const mb_dataset_config *cfg) {
    if (out) *out = NULL;
    return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_UNSUPPORTED, "%s: built with MEGABATCH_NO_HDF5: only in-memory "
                   "datasets", path ? path : "(null)");
}
#endif

// -- the window layout --
// The data source of features (N, T, F) and targets (N, K) stored as they are trained:
// opened by mb_dataset_open_memory or mb__h5_validate above, read row ranges as they are.
// Its loader side is the loader module's chunks; its table closes that module.

/* Samples [start, start + n): a copy of the caller's arrays, or hyperslabs of the file. */
static mb_result mb__win_read(mb_dataset *ds, int64_t start, int64_t n, float *features, float *targets) {
    size_t nf = (size_t)(ds->meta.t * ds->meta.f), nk = (size_t)ds->meta.k;
    if (ds->mem_f) {
        memcpy(features, ds->mem_f + (size_t)start * nf, (size_t)n * nf * sizeof(float));
        memcpy(targets, ds->mem_t + (size_t)start * nk, (size_t)n * nk * sizeof(float));
        return MB_OK;
    }
#ifndef MEGABATCH_NO_HDF5
    mb__h5quiet q = mb__h5_quiet();
    mb_result r = mb__h5_read_rows(ds, ds->dfeat, ds->fname, start, n, features);
    if (r == MB_OK) r = mb__h5_read_rows(ds, ds->dtarg, ds->tname, start, n, targets);
    mb__h5_restore(q);
    return r;
#else
    return MB_OK;
#endif
}

static void mb__win_close(mb_dataset *ds) { (void)ds; } /* the arrays are the caller's */

#ifndef MEGABATCH_NO_HDF5
/* A numeric attribute of dataset obj (named oname) into out (mb_dataset_read_attr). */
static mb_result mb__h5_read_attr(mb_dataset *ds, hid_t obj, const char *oname, const char *name, float *out,
                                  int64_t cap, int64_t *count) {
    const mb_logger *lg = &ds->cfg.log;
    const char *src = ds->meta.source;
    char st[512], tn[32];
    htri_t ex = H5Aexists(obj, name);
    if (ex < 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s': %s", src, name, oname, mb__h5_stack(st));
    if (ex == 0) return MB_OK;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: cannot open attribute '%s' of '%s': %s", src, name, oname,
                              mb__h5_stack(st));
    hid_t ty = H5Aget_type(a), sp = H5Aget_space(a);
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    H5T_class_t c = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
    float *buf = NULL;
    mb_result r = MB_OK;
    if (ty < 0 || np < 0) r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s': %s", src, name, oname,
                                      mb__h5_stack(st));
    else if (c != H5T_INTEGER && c != H5T_FLOAT)
        mb__h5_type_name(ty, tn, sizeof tn), r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s' is %s, not a "
                                                           "number", src, name, oname, tn);
    else if (!mb__h5_type_sane(ty, c))
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s' has a malformed type", src, name, oname);
    else if (np < 1 || np > cap || np > MB_MAX_ATTR_VALUES)
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute '%s' of '%s' has %lld values (1..%lld fit)", src, name, oname,
                    (long long)np, (long long)(cap < MB_MAX_ATTR_VALUES ? cap : MB_MAX_ATTR_VALUES));
    else if (!(buf = (float *)mb__host_alloc((size_t)np * sizeof(float))))
        r = MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "%s: no host memory for attribute '%s'", src, name);
    else if (H5Aread(a, H5T_NATIVE_FLOAT, buf) < 0)
        r = MB_FAIL(lg, MB_ERR_IO, "%s: reading attribute '%s' of '%s': %s", src, name, oname, mb__h5_stack(st));
    if (r == MB_OK) {
        memcpy(out, buf, (size_t)np * sizeof(float));
        *count = (int64_t)np;
    }
    MB_FREE(buf);
    if (sp >= 0) H5Sclose(sp);
    if (ty >= 0) H5Tclose(ty);
    H5Aclose(a);
    return r;
}
#endif

MBDEF mb_result mb_dataset_read_attr(mb_dataset *ds, int on, const char *name, float *out, int64_t cap,
                                     int64_t *count) {
    if (count) *count = 0;
    if (!ds || !name || !count || cap < 0 || (!out && cap > 0) || (on != MB_ON_FEATURES && on != MB_ON_TARGETS) ||
        strlen(name) >= MB_MAX_NAME)
        return MB_FAIL(ds ? &ds->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_dataset_read_attr: bad argument (NULL, cap "
                       "< 0, `on` not MB_ON_FEATURES or MB_ON_TARGETS, or a name of %d bytes or more)", MB_MAX_NAME);
#ifndef MEGABATCH_NO_HDF5
    if (ds->file < 0) return MB_OK; /* in memory: no attributes */
    mb__h5quiet q = mb__h5_quiet();
    mb_result r = mb__h5_read_attr(ds, on ? ds->dtarg : ds->dfeat, on ? ds->tname : ds->dfeat_name, name, out, cap,
                                   count);
    mb__h5_restore(q);
    return r;
#else
    (void)out;
    return MB_OK;
#endif
}

MBDEF mb_result mb_dataset_open_untrusted(mb_dataset **out, const char *path, const mb_dataset_config *cfg) {
    mb_dataset_config c;
    if (cfg) c = *cfg;
    else memset(&c, 0, sizeof c);
    c.isolate = 1;
    return mb_dataset_open_file(out, path, &c);
}

MBDEF void mb_dataset_close(mb_dataset *ds) {
    if (!ds) return;
#ifndef MEGABATCH_NO_HDF5
    if (ds->file >= 0) {
        mb__h5quiet q = mb__h5_quiet();
        mb__h5_close(ds);
        mb__h5_restore(q);
    }
#endif
    ds->src->close(ds);
    MB_FREE(ds);
}

MBDEF mb_result mb_dataset_read(mb_dataset *ds, int64_t start, int64_t end, float *features, float *targets,
                                int64_t *rows) {
    if (!ds) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_dataset_read: NULL dataset");
    const mb_dataset_meta *m = &ds->meta;
    if (start < 0 || end < start || end > m->n)
        return MB_FAIL(&ds->cfg.log, MB_ERR_INVALID_ARG, "mb_dataset_read: %s: range [%lld, %lld) outside [0, %lld)",
                       m->source, (long long)start, (long long)end, (long long)m->n);
    if (rows) *rows = 0;
    if (end == start) return MB_OK;
    if (!features || !targets) return MB_FAIL(&ds->cfg.log, MB_ERR_INVALID_ARG, "mb_dataset_read: NULL buffer");
    int64_t n = end - start;
    MB_TRY(ds->src->read(ds, start, n, features, targets));
    return mb__ds_policy(ds, start, n, features, targets, rows);
}

#if !defined(MEGABATCH_NO_HDF5) && !defined(MEGABATCH_NO_THREADS) && (defined(__unix__) || defined(__APPLE__))
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

/* What the probe's child sends back through its pipe. */
typedef struct mb__probe_msg {
    int32_t code;         /* mb_result of open + validate + reads */
    mb_dataset_meta meta; /* on MB_OK */
    char text[1024];      /* mb_last_error() of the child on failure */
} mb__probe_msg;

/* Child: read the first and last samples (float32, no NaN policy). */
static mb_result mb__probe_read(mb_dataset *ds) {
    const mb_dataset_meta *m = &ds->meta;
    float *buf = (float *)calloc(m->bytes_per_sample / sizeof(float), sizeof(float));
    if (!buf) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "%s: probe: no memory for one sample (%zu bytes)", m->source,
                             m->bytes_per_sample);
    float *targ = buf + (size_t)(m->t * m->f);
    mb_result r = mb_dataset_read(ds, 0, 1, buf, targ, NULL);
    if (r == MB_OK && m->n > 1) r = mb_dataset_read(ds, m->n - 1, m->n, buf, targ, NULL);
    free(buf);
    return r;
}

/* Child: the names of every attribute of obj (H5Aiterate2), at most MB__PROBE_ATTRS. */
enum { MB__PROBE_ATTRS = 256 };
typedef struct mb__attr_names { int n, more; char name[MB__PROBE_ATTRS][MB_MAX_NAME]; } mb__attr_names;
static herr_t mb__probe_attr_name(hid_t loc, const char *name, const H5A_info_t *info, void *user) {
    mb__attr_names *a = (mb__attr_names *)user;
    (void)loc; (void)info;
    if (strlen(name) >= MB_MAX_NAME) return 0; /* mb_dataset_read_attr refuses such a name */
    if (a->n == MB__PROBE_ATTRS) { a->more = 1; return 1; }
    strcpy(a->name[a->n++], name);
    return 0;
}

/* Child: read every numeric attribute of both datasets as mb_dataset_read_attr would in the
 * host, so an attribute that crashes HDF5 fails the probe, not the host later. A refused
 * attribute (a string, too many values) is not an error here: the host's read refuses it too. */
static mb_result mb__probe_attrs(mb_dataset *ds) {
    mb__attr_names *names = (mb__attr_names *)calloc(1, sizeof *names);
    float *buf = (float *)malloc((size_t)MB_MAX_ATTR_VALUES * sizeof(float));
    mb_result r = names && buf ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "%s: probe: no memory", ds->meta.source);
    for (int on = 0; on < 2 && r == MB_OK && ds->file >= 0; on++) {
        hid_t obj = on ? ds->dtarg : ds->dfeat;
        const char *oname = on ? ds->tname : ds->dfeat_name;
        hsize_t idx = 0;
        char st[512];
        names->n = names->more = 0;
        mb__h5quiet q = mb__h5_quiet();
        herr_t e = H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, mb__probe_attr_name, names);
        if (e < 0) r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: cannot list the attributes of '%s': %s", ds->meta.source, oname,
                               mb__h5_stack(st));
        else if (names->more)
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: '%s' has more than %d attributes", ds->meta.source, oname,
                        MB__PROBE_ATTRS);
        mb__h5_restore(q);
        int64_t count;
        for (int i = 0; i < names->n && r == MB_OK; i++)
            mb_dataset_read_attr(ds, on, names->name[i], buf, MB_MAX_ATTR_VALUES, &count);
    }
    free(names);
    free(buf);
    return r;
}

/* Child: everything HDF5 does with the file happens here; never returns. */
static void mb__probe_child(int wfd, const char *path, const mb_dataset_config *cfg) {
    /* the host's crash handlers (test frameworks, ASan) must not run on in the child */
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
    int dn = open("/dev/null", O_WRONLY);
    if (dn >= 0) { dup2(dn, 1); dup2(dn, 2); close(dn); }
    mb__probe_msg msg;
    memset(&msg, 0, sizeof msg);
    mb_dataset_config c;
    if (cfg) c = *cfg;
    else memset(&c, 0, sizeof c);
    c.isolate = 0;
    c.log.fn = NULL;
    c.nan_policy = MB_NAN_ZERO;
    mb_dataset *ds = NULL;
    mb_result r = mb_dataset_open_file(&ds, path, &c);
    if (r == MB_OK) {
        msg.meta = ds->meta;
        r = mb__probe_read(ds);
        if (r == MB_OK) r = mb__probe_attrs(ds);
        mb_dataset_close(ds);
    }
    msg.code = (int32_t)r;
    if (r != MB_OK) snprintf(msg.text, sizeof msg.text, "%s", mb_last_error());
    const char *p = (const char *)&msg;
    for (size_t done = 0; done < sizeof msg;) {
        ssize_t w = write(wfd, p + done, sizeof msg - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    _exit(0); /* no atexit handlers: HDF5's library shutdown is skipped */
}

/* Parent: the child ran HDF5 on a hostile file, so its report is checked before use:
 * dimensions >= 1, segments in range, every string terminated. */
static int mb__probe_meta_ok(const mb_dataset_meta *m) {
    if (m->n < 1 || m->t < 1 || m->f < 1 || m->k < 1 || m->segments < 0 || m->segments > MB_MAX_SEGMENTS) return 0;
    for (int i = 0; i < MB_MAX_SEGMENTS; i++)
        if (!memchr(m->segment_name[i], 0, MB_MAX_NAME)) return 0;
    return memchr(m->features_type, 0, sizeof m->features_type) && memchr(m->targets_type, 0, sizeof m->targets_type)
           && memchr(m->source, 0, sizeof m->source);
}

static double mb__probe_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parent: read the child's report until complete, EOF or the deadline. Returns the bytes
 * read; *timed_out is set when the deadline passed first. */
static size_t mb__probe_collect(int rfd, mb__probe_msg *msg, double timeout_s, int *timed_out) {
    double end = mb__probe_now() + timeout_s;
    size_t got = 0;
    *timed_out = 0;
    while (got < sizeof *msg) {
        double left = end - mb__probe_now();
        if (left <= 0) { *timed_out = 1; break; }
        struct pollfd pf;
        pf.fd = rfd; pf.events = POLLIN; pf.revents = 0;
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) break;
        if (pr == 0) continue;
        ssize_t n = read(rfd, (char *)msg + got, sizeof *msg - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* EOF: the child is gone */
        got += (size_t)n;
    }
    return got;
}

MBDEF mb_result mb_dataset_probe(const char *path, const mb_dataset_config *cfg, mb_dataset_meta *meta) {
    const mb_logger *lg = cfg ? &cfg->log : NULL;
    if (!path) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_dataset_probe: NULL path");
    double to = cfg && cfg->probe_timeout_s > 0 ? cfg->probe_timeout_s : 10.0;
    int fds[2];
    if (pipe(fds) != 0) return MB_FAIL(lg, MB_ERR_IO, "%s: probe: pipe: %s", path, strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]); close(fds[1]);
        return MB_FAIL(lg, MB_ERR_IO, "%s: probe: fork: %s", path, strerror(errno));
    }
    if (pid == 0) { close(fds[0]); mb__probe_child(fds[1], path, cfg); }
    close(fds[1]);
    mb__probe_msg msg;
    memset(&msg, 0, sizeof msg);
    int timed_out = 0, st = 0;
    size_t got = mb__probe_collect(fds[0], &msg, to, &timed_out);
    close(fds[0]);
    if (got < sizeof msg) kill(pid, SIGKILL);
    pid_t w;
    while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {}
    if (got == sizeof msg) {
        msg.text[sizeof msg.text - 1] = 0;
        if (msg.code > 0 || msg.code < MB_ERR_CORRUPT)
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: probe: bad report from the child (code %d)", path, (int)msg.code);
        if (msg.code != MB_OK) return MB_FAIL(lg, (mb_result)msg.code, "%s", msg.text[0] ? msg.text : path);
        if (!mb__probe_meta_ok(&msg.meta))
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: probe: bad report from the child (metadata out of range)", path);
        if (meta) *meta = msg.meta;
        return MB_OK;
    }
    if (timed_out)
        return MB_FAIL(lg, MB_ERR_FORMAT, "HDF5 probe of '%s' timed out after %.1f s (child killed)", path, to);
    if (w == pid && WIFSIGNALED(st))
        return MB_FAIL(lg, MB_ERR_FORMAT, "HDF5 crashed while parsing '%s' (signal %d)", path, WTERMSIG(st));
    return MB_FAIL(lg, MB_ERR_FORMAT, "HDF5 crashed while parsing '%s' (the probe exited with status %d and no "
                   "report)", path, w == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}
#else
MBDEF mb_result mb_dataset_probe(const char *path, const mb_dataset_config *cfg, mb_dataset_meta *meta) {
    (void)meta;
    return MB_FAIL(cfg ? &cfg->log : NULL, MB_ERR_UNSUPPORTED, "%s: mb_dataset_probe is unavailable in this build "
                   "(it needs HDF5, threads and POSIX fork; built with MEGABATCH_NO_HDF5, MEGABATCH_NO_THREADS or "
                   "off POSIX)", path ? path : "(null)");
}
#endif

// ---- end dataset ----

// ---- loader ----

static double mb__seconds(void) { return mb__os_now(); }

/* Seeded Fisher-Yates permutation of 0..n-1 from Philox (key seed, stream). */
static void mb__permutation(uint64_t seed, uint64_t stream, int64_t n, int64_t *p) {
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        mb_u32x4 r = mb_philox(seed, stream, (uint64_t)i);
        int64_t j = (int64_t)((((uint64_t)r.v[0] << 32) | r.v[1]) % (uint64_t)(i + 1));
        int64_t t = p[i]; p[i] = p[j]; p[j] = t;
    }
}
static uint64_t mb__shuffle_stream(int64_t epoch, uint64_t chunk) { return ((uint64_t)epoch << 32) | (chunk & 0xffffffffu); }

/* Sharding (shard_count W > 1, docs/DIST.md): a chunk of m samples in its epoch order is
 * cut into global batches of G = W * batch; rank r takes rows [r*batch, (r+1)*batch) of
 * each full one, and [t*r/W, t*(r+1)/W) of a last short one of t >= W rows (dropped when
 * t < W or with drop_last). Rows of this rank for a chunk of m samples: */
static int64_t mb__shard_rows(const mb_loader_config *c, int64_t m) {
    int64_t w = c->shard_count, r = c->shard_rank, g = c->batch * w, t = m % g;
    return m / g * c->batch + (c->drop_last || t < w ? 0 : t * (r + 1) / w - t * r / w);
}
/* Position in the chunk's order of this rank's local row i. */
static int64_t mb__shard_pos(const mb_loader_config *c, int64_t m, int64_t i) {
    int64_t w = c->shard_count, b = c->batch, g = b * w, full = m / g;
    if (i < full * b) return i / b * g + c->shard_rank * b + i % b;
    return full * g + m % g * c->shard_rank / w + (i - full * b);
}

/* cfg->chunk_fraction with 0 meaning the default, 0.75: the one place it is resolved. */
static double mb__chunk_fraction(const mb_loader_config *cfg) {
    return cfg->chunk_fraction == 0 ? 0.75 : cfg->chunk_fraction;
}

MBDEF mb_result mb_loader_plan(int64_t n, int64_t t, int64_t f, int64_t k, const mb_loader_config *cfg,
                               size_t free_bytes, mb_chunk_plan *out) {
    if (!cfg || !out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: NULL argument");
    memset(out, 0, sizeof *out);
    size_t s = mb_dtype_size(cfg->dtype), bps, tf;
    double frac = mb__chunk_fraction(cfg);
    if (cfg->batch < 1) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: batch = %lld, must be >= 1", (long long)cfg->batch);
    if (n < 1 || t < 1 || f < 1 || k < 1)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: shape N=%lld T=%lld F=%lld K=%lld must be >= 1",
                       (long long)n, (long long)t, (long long)f, (long long)k);
    if (!s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: unknown dtype %d", (int)cfg->dtype);
    if (!(frac > 0 && frac <= 1))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: chunk_fraction = %g, must be in (0, 1]", frac);
    int64_t dims[2] = {t, f};
    if (!mb_size_product(dims, 2, s, &tf) || (uint64_t)k > SIZE_MAX / 16 || !mb_size_add(tf, (size_t)k * s, &bps))
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "mb_loader_plan: bytes per sample of T=%lld F=%lld K=%lld overflow",
                       (long long)t, (long long)f, (long long)k);
    size_t budget = cfg->chunk_bytes ? cfg->chunk_bytes : (size_t)((double)free_bytes * frac), total;
    int fits = mb_size_mul(bps, (size_t)n, &total) && total <= budget;
    int64_t spc = n, b = cfg->batch;
    if (!fits) {
        spc = (int64_t)((budget / 2) / bps);
        spc = spc >= b ? spc - spc % b : b;
        if (spc > n) spc = n;
    }
    out->bytes_per_sample = bps;
    out->budget_bytes = budget;
    out->samples_per_chunk = spc;
    out->buffers = spc >= n ? 1 : 2;
    out->chunk_bytes = (size_t)spc * bps;
    out->chunks = (n + spc - 1) / spc;
    int64_t last = n - (out->chunks - 1) * spc, per = cfg->drop_last ? spc / b : (spc + b - 1) / b;
    out->batches = (out->chunks - 1) * per + (cfg->drop_last ? last / b : (last + b - 1) / b);
    return MB_OK;
}

typedef struct mb__chunk_buf {
    void *mem;            /* device: features (cap, t, f) then targets (cap, k) */
    char *feat, *targ;
    int64_t rows;         /* rows loaded (fewer than planned when samples were skipped) */
    int64_t epoch, chunk; /* the item held (epoch, index in that epoch's order); epoch -1: none */
    int64_t *cur;         /* cur[i]: chunk-local sample at row i (for in-place shuffles) */
} mb__chunk_buf;

typedef struct mb__job { int buf; int64_t epoch, chunk, fid; } mb__job;

struct mb_loader {
    mb_device *dev;
    mb_dataset *ds;
    const mb_logger *lg;
    mb_loader_config cfg;
    mb_chunk_plan plan;
    int64_t cap;                  /* rows per device chunk */
    size_t row_f, row_t;          /* bytes of one sample's features / targets (f32: slabs) */
    size_t drow_f, drow_t;        /* the same in the chunk dtype (device chunks, tmp_row) */
    mb__chunk_buf buf[2];
    int cur_buf;                  /* buffer of the last batch returned; -1 none */
    void *slab[2];                /* staging: features (slab_rows, t, f) then targets */
    int64_t slab_rows;
    void *tmp_row;                /* device: one sample, for in-place shuffles */
    void *stage;                  /* device, dtype != f32 only: one slab of f32 (slab_rows, t, f)
                                     then (stage_rows, k), converted into the chunk */
    int64_t *perm, *inv, *order;  /* host scratch: row permutation, its inverse, chunk order */
    int64_t *gperm;               /* sharded: the whole chunk's sample order (samples_per_chunk) */
    const mb__source *src;        /* whose loader side runs: the dataset's, or the window layout's
                                     chunks for a series that does not stay resident */
    void *ctx;                    /* that source's own state (series: mb__series_ld); NULL: none */
    unsigned char *seen;
    int64_t order_epoch;
    int64_t epoch, chunk, batch, index; /* position of the next batch */
    /* reader thread: one job at a time. state 0 idle, 1 queued/running, 2 done */
    int state, quit, started;     /* state and quit: shared, under mu */
    int pending;                  /* main thread only: a job was queued and not yet waited for */
    mb__job job;
    mb_result job_result;
    char job_msg[MB_MAX_ERROR];
    mb_loader_stats stats;
#ifndef MEGABATCH_NO_THREADS
    mb__thread thread;
    mb__mutex mu;
    mb__cond cv;
#endif
};

static int64_t mb__ld_fid(mb_loader *ld, int64_t epoch, int64_t chunk) {
    if (!ld->cfg.shuffle || ld->plan.chunks == 1) return chunk;
    if (ld->order_epoch != epoch) {
        mb__permutation(ld->cfg.seed, mb__shuffle_stream(epoch, 0xffffffffu), ld->plan.chunks, ld->order);
        ld->order_epoch = epoch;
    }
    return ld->order[chunk];
}

/* Put buffer b's rows in the order of permutation (epoch, fid): in place, following
 * cycles, one row copy per moved row on the copy stream (through tmp_row). */
static mb_result mb__ld_permute(mb_loader *ld, int b, int64_t epoch, int64_t fid) {
    mb__chunk_buf *cb = &ld->buf[b];
    int64_t n = cb->rows, *p = ld->perm, *inv = ld->inv;
    if (n <= 0) return MB_OK;
    mb__permutation(ld->cfg.seed, mb__shuffle_stream(epoch, (uint64_t)fid), n, p);
    for (int64_t i = 0; i < n; i++) inv[cb->cur[i]] = i;
    memset(ld->seen, 0, (size_t)n);
    mb_device *dev = ld->dev;
    char *tf = (char *)ld->tmp_row, *tt = tf + ld->drow_f;
    size_t rf = ld->drow_f, rt = ld->drow_t;
    for (int64_t s = 0; s < n; s++) {
        if (ld->seen[s]) continue;
        ld->seen[s] = 1;
        int64_t j = s, src = inv[p[s]];
        if (src == s) continue;
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, tf, cb->feat + (size_t)s * rf, rf));
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, tt, cb->targ + (size_t)s * rt, rt));
        while (src != s) {
            MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->feat + (size_t)j * rf, cb->feat + (size_t)src * rf, rf));
            MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->targ + (size_t)j * rt, cb->targ + (size_t)src * rt, rt));
            j = src;
            ld->seen[j] = 1;
            src = inv[p[j]];
        }
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->feat + (size_t)j * rf, tf, rf));
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->targ + (size_t)j * rt, tt, rt));
    }
    memcpy(cb->cur, p, (size_t)n * sizeof *p);
    return MB_OK;
}

/* Rows [row, row + got) of chunk buffer cb from a slab's features sf and targets stg
 * (f32), on the copy stream. f32: copied. Else copied to the device stage, then
 * converted into the chunk, still on the copy stream: the next slab's copy into the stage
 * is queued after this conversion, and the chunk is handed out only after a sync. */
static mb_result mb__ld_put(mb_loader *ld, mb__chunk_buf *cb, int64_t row, const float *sf, const float *stg,
                            int64_t got) {
    mb_device *dev = ld->dev;
    size_t nf = (size_t)got * ld->row_f, nt = (size_t)got * ld->row_t;
    char *df = cb->feat + (size_t)row * ld->drow_f, *dt = cb->targ + (size_t)row * ld->drow_t;
    if (ld->cfg.dtype == MB_F32) {
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, df, sf, nf));
        return mb_copy(dev, MB_STREAM_COPY, dt, stg, nt);
    }
    char *gf = (char *)ld->stage, *gt = gf + nf; /* (got, t, f) then (got, k), f32 */
    MB_TRY(mb_copy(dev, MB_STREAM_COPY, gf, sf, nf));
    MB_TRY(mb_copy(dev, MB_STREAM_COPY, gt, stg, nt));
    MB_TRY(mb_convert(dev, MB_STREAM_COPY, df, ld->cfg.dtype, gf, MB_F32, nf / sizeof(float)));
    return mb_convert(dev, MB_STREAM_COPY, dt, ld->cfg.dtype, gt, MB_F32, nt / sizeof(float));
}

/* Sharded: this rank's rows of file chunk fid, in the chunk's epoch order (the same
 * permutation as unsharded), read as runs of consecutive samples (hyperslabs) into the
 * slabs, slab by slab; no device shuffle is needed afterwards. */
static mb_result mb__ld_load_shard(mb_loader *ld, const mb__job *j, mb_loader_stats *st) {
    mb__chunk_buf *cb = &ld->buf[j->buf];
    int64_t spc = ld->plan.samples_per_chunk, start = j->fid * spc, n = mb_dataset_info(ld->ds)->n;
    int64_t m = n - start < spc ? n - start : spc, want = mb__shard_rows(&ld->cfg, m), *p = ld->gperm, i = 0, rows = 0;
    if (ld->cfg.shuffle) mb__permutation(ld->cfg.seed, mb__shuffle_stream(j->epoch, (uint64_t)j->fid), m, p);
    else for (int64_t k = 0; k < m; k++) p[k] = k;
    for (int s = 0; i < want; s ^= 1) {
        float *sf = (float *)ld->slab[s], *stg = (float *)((char *)ld->slab[s] + (size_t)ld->slab_rows * ld->row_f);
        int64_t filled = 0;
        double t0 = mb__seconds();
        while (i < want && filled < ld->slab_rows) {
            int64_t a = start + p[mb__shard_pos(&ld->cfg, m, i)], len = 1, got = 0;
            while (i + len < want && filled + len < ld->slab_rows && start + p[mb__shard_pos(&ld->cfg, m, i + len)] == a + len)
                len++;
            MB_TRY(mb_dataset_read(ld->ds, a, a + len, sf + (size_t)filled * (ld->row_f / sizeof(float)),
                                   stg + (size_t)filled * (ld->row_t / sizeof(float)), &got));
            st->bytes_read += (uint64_t)len * (ld->row_f + ld->row_t);
            i += len;
            filled += got;
        }
        double t1 = mb__seconds();
        st->read_seconds += t1 - t0;
        MB_TRY(mb_sync(ld->dev, MB_STREAM_COPY));
        MB_TRY(mb__ld_put(ld, cb, rows, sf, stg, filled));
        st->bytes_copied += (uint64_t)filled * (ld->row_f + ld->row_t);
        rows += filled;
        st->copy_seconds += mb__seconds() - t1;
    }
    MB_TRY(mb_sync(ld->dev, MB_STREAM_COPY));
    cb->rows = rows;
    for (int64_t k = 0; k < rows; k++) cb->cur[k] = k;
    st->chunk_loads++;
    cb->epoch = j->epoch;
    cb->chunk = j->chunk;
    return MB_OK;
}

/* The reader's job: file chunk fid into buffer b, slab by slab; the read of slab i
 * overlaps the copy of slab i-1 (the copy stream is synced before reusing a slab). */
static mb_result mb__ld_load(mb_loader *ld, const mb__job *j, mb_loader_stats *st) {
    if (ld->cfg.shard_count > 1) return mb__ld_load_shard(ld, j, st);
    mb__chunk_buf *cb = &ld->buf[j->buf];
    mb_device *dev = ld->dev;
    int64_t start = j->fid * ld->plan.samples_per_chunk, end = start + ld->plan.samples_per_chunk, rows = 0;
    if (end > mb_dataset_info(ld->ds)->n) end = mb_dataset_info(ld->ds)->n;
    int s = 0;
    for (int64_t p = start; p < end; p += ld->slab_rows, s ^= 1) {
        int64_t e = p + ld->slab_rows < end ? p + ld->slab_rows : end, got = 0;
        float *sf = (float *)ld->slab[s], *stg = (float *)((char *)ld->slab[s] + (size_t)ld->slab_rows * ld->row_f);
        double t0 = mb__seconds();
        MB_TRY(mb_dataset_read(ld->ds, p, e, sf, stg, &got));
        double t1 = mb__seconds();
        st->read_seconds += t1 - t0;
        st->bytes_read += (uint64_t)(e - p) * (ld->row_f + ld->row_t);
        MB_TRY(mb_sync(dev, MB_STREAM_COPY)); /* the copy out of slab s (two reads ago) is done */
        MB_TRY(mb__ld_put(ld, cb, rows, sf, stg, got));
        st->bytes_copied += (uint64_t)got * (ld->row_f + ld->row_t);
        rows += got;
        st->copy_seconds += mb__seconds() - t1;
    }
    double t2 = mb__seconds();
    MB_TRY(mb_sync(dev, MB_STREAM_COPY));
    st->copy_seconds += mb__seconds() - t2;
    cb->rows = rows;
    for (int64_t i = 0; i < rows; i++) cb->cur[i] = i;
    if (ld->cfg.shuffle) {
        MB_TRY(mb__ld_permute(ld, j->buf, j->epoch, j->fid));
        MB_TRY(mb_sync(dev, MB_STREAM_COPY));
    }
    st->chunk_loads++;
    cb->epoch = j->epoch;
    cb->chunk = j->chunk;
    return MB_OK;
}

/* Run the queued job (reader thread, or inline without threads); keep its message. */
static void mb__ld_run(mb_loader *ld, mb_loader_stats *st) {
    mb__job j = ld->job;
    mb_result r = mb__ld_load(ld, &j, st);
    if (r != MB_OK) snprintf(ld->job_msg, sizeof ld->job_msg, "%s", mb_last_error());
    ld->job_result = r;
}

static void mb__ld_merge(mb_loader_stats *a, const mb_loader_stats *b) {
    a->bytes_read += b->bytes_read;
    a->read_seconds += b->read_seconds;
    a->copy_seconds += b->copy_seconds;
    a->chunk_loads += b->chunk_loads;
    a->bytes_copied += b->bytes_copied;
}

#ifndef MEGABATCH_NO_THREADS
static void *mb__ld_thread(void *arg) {
    mb_loader *ld = (mb_loader *)arg;
    ld->dev->be->rt->thread_init(ld->dev);
    mb__mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->quit && ld->state != 1) mb__cond_wait(&ld->cv, &ld->mu);
        if (ld->quit) break;
        mb__mutex_unlock(&ld->mu);
        mb_loader_stats st;
        memset(&st, 0, sizeof st);
        mb__ld_run(ld, &st);
        mb__mutex_lock(&ld->mu);
        mb__ld_merge(&ld->stats, &st);
        ld->state = 2;
        mb__cond_broadcast(&ld->cv);
    }
    mb__mutex_unlock(&ld->mu);
    return NULL;
}
#endif

/* Queue a load of item (epoch, chunk) into buffer b. The copy stream first waits for
 * the compute work queued so far (it may still read the buffer's old contents). */
static mb_result mb__ld_kick(mb_loader *ld, int b, int64_t epoch, int64_t chunk) {
    MB_TRY(mb_stream_wait(ld->dev, MB_STREAM_COPY, MB_STREAM_COMPUTE));
    ld->buf[b].epoch = -1;
    ld->job.buf = b;
    ld->job.epoch = epoch;
    ld->job.chunk = chunk;
    ld->job.fid = mb__ld_fid(ld, epoch, chunk);
    ld->pending = 1;
#ifndef MEGABATCH_NO_THREADS
    mb__mutex_lock(&ld->mu);
    ld->state = 1;
    mb__cond_broadcast(&ld->cv);
    mb__mutex_unlock(&ld->mu);
#else
    ld->state = 1;
#endif
    return MB_OK;
}

/* Wait for the queued job; its failure becomes ours (report = 0: discard it). */
static mb_result mb__ld_wait(mb_loader *ld, int report) {
    if (!ld->pending) return MB_OK;
    double t0 = mb__seconds();
#ifndef MEGABATCH_NO_THREADS
    mb__mutex_lock(&ld->mu);
    while (ld->state != 2) mb__cond_wait(&ld->cv, &ld->mu);
    ld->state = 0;
    ld->stats.wait_seconds += mb__seconds() - t0;
    mb__mutex_unlock(&ld->mu);
    ld->pending = 0;
#else
    mb_loader_stats st;
    memset(&st, 0, sizeof st);
    mb__ld_run(ld, &st);
    mb__ld_merge(&ld->stats, &st);
    ld->stats.wait_seconds += mb__seconds() - t0;
    ld->state = 0;
    ld->pending = 0;
#endif
    if (ld->job_result != MB_OK && report) return MB_FAIL(ld->lg, ld->job_result, "%s", ld->job_msg);
    return MB_OK;
}

/* Make item (epoch, chunk) present in a buffer; *out gets the buffer. */
static mb_result mb__ld_acquire(mb_loader *ld, int64_t epoch, int64_t chunk, int *out) {
    if (ld->plan.buffers == 1) {
        mb__chunk_buf *cb = &ld->buf[0];
        *out = 0;
        if (cb->epoch < 0) {
            MB_TRY(mb__ld_kick(ld, 0, epoch, 0));
            return mb__ld_wait(ld, 1);
        }
        if (ld->cfg.shuffle && cb->epoch != epoch && ld->cfg.shard_count > 1) { /* sharded: this epoch's rows */
            MB_TRY(mb__ld_kick(ld, 0, epoch, 0));
            return mb__ld_wait(ld, 1);
        }
        if (ld->cfg.shuffle && cb->epoch != epoch) { /* resident: reshuffle in place */
            MB_TRY(mb_stream_wait(ld->dev, MB_STREAM_COPY, MB_STREAM_COMPUTE));
            MB_TRY(mb__ld_permute(ld, 0, epoch, 0));
            MB_TRY(mb_stream_wait(ld->dev, MB_STREAM_COMPUTE, MB_STREAM_COPY));
            cb->epoch = epoch;
        }
        return MB_OK;
    }
    for (int b = 0; b < 2; b++) /* (the buffer of a queued job belongs to the reader) */
        if (!(ld->pending && b == ld->job.buf) && ld->buf[b].epoch == epoch && ld->buf[b].chunk == chunk) {
            *out = b;
            return MB_OK;
        }
    if (ld->pending) {
        if (ld->job.epoch == epoch && ld->job.chunk == chunk) {
            *out = ld->job.buf;
            return mb__ld_wait(ld, 1);
        }
        MB_TRY(mb__ld_wait(ld, 0)); /* a prefetch we no longer need */
    }
    int b = ld->cur_buf >= 0 ? 1 - ld->cur_buf : 0;
    MB_TRY(mb__ld_kick(ld, b, epoch, chunk));
    *out = b;
    return mb__ld_wait(ld, 1);
}

/* Start loading the item after (epoch, chunk) into the other buffer, if idle. */
static mb_result mb__ld_prefetch(mb_loader *ld, int b) {
    if (ld->plan.buffers == 1 || ld->pending) return MB_OK;
    int64_t e = ld->epoch, c = ld->chunk + 1;
    if (c == ld->plan.chunks) { e++; c = 0; }
    if (ld->buf[1 - b].epoch == e && ld->buf[1 - b].chunk == c) return MB_OK;
    return mb__ld_kick(ld, 1 - b, e, c);
}

/* The window layout's batch at the loader's position: a view into the buffer that holds
 * chunk (epoch, chunk), loaded or waited for; none when the chunk's batches are over. */
static mb_result mb__ld_chunks_next(mb_loader *ld, mb_batch *out, int *done) {
    int64_t B = ld->cfg.batch;
    int b;
    *done = 0;
    MB_TRY(mb__ld_acquire(ld, ld->epoch, ld->chunk, &b));
    mb__chunk_buf *cb = &ld->buf[b];
    int64_t first = ld->batch * B, count = cb->rows - first < B ? cb->rows - first : B;
    if (count <= 0 || (ld->cfg.drop_last && count < B)) {
        ld->chunk++;
        ld->batch = 0;
        return MB_OK;
    }
    ld->cur_buf = b;
    MB_TRY(mb__ld_prefetch(ld, b));
    out->features = cb->feat + (size_t)first * ld->drow_f;
    out->targets = cb->targ + (size_t)first * ld->drow_t;
    out->count = count;
    out->epoch = ld->epoch;
    out->index = ld->index++;
    ld->batch++;
    *done = 1;
    return MB_OK;
}

MBDEF mb_result mb_loader_next(mb_loader *ld, mb_batch *out) {
    if (!ld || !out) return MB_FAIL(ld ? ld->lg : NULL, MB_ERR_INVALID_ARG, "mb_loader_next: NULL argument");
    memset(out, 0, sizeof *out);
    for (;;) {
        if (ld->chunk >= ld->plan.chunks) {
            out->epoch = ld->epoch;
            out->index = ld->index;
            out->end_of_epoch = 1;
            ld->epoch++;
            ld->chunk = ld->batch = ld->index = 0;
            return MB_OK;
        }
        int done = 0;
        MB_TRY(ld->src->loader_next(ld, out, &done));
        if (done) return MB_OK;
    }
}

MBDEF mb_loader_pos mb_loader_position(const mb_loader *ld) {
    mb_loader_pos p;
    p.epoch = ld->epoch;
    p.chunk = ld->chunk;
    p.batch = ld->batch;
    return p;
}

/* Planned batches of the chunk at position `chunk` of `epoch`. */
static int64_t mb__ld_chunk_batches(mb_loader *ld, int64_t epoch, int64_t chunk) {
    int64_t spc = ld->plan.samples_per_chunk, n = mb_dataset_info(ld->ds)->n, B = ld->cfg.batch;
    int64_t start = mb__ld_fid(ld, epoch, chunk) * spc, rows = n - start < spc ? n - start : spc;
    if (ld->cfg.shard_count > 1) return (mb__shard_rows(&ld->cfg, rows) + B - 1) / B;
    return ld->cfg.drop_last ? rows / B : (rows + B - 1) / B;
}

MBDEF mb_result mb_loader_set_position(mb_loader *ld, mb_loader_pos pos) {
    if (!ld) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_set_position: NULL loader");
    if (pos.epoch < 0 || pos.chunk < 0 || pos.chunk >= ld->plan.chunks || pos.batch < 0 ||
        pos.batch > mb__ld_chunk_batches(ld, pos.epoch, pos.chunk))
        return MB_FAIL(ld->lg, MB_ERR_INVALID_ARG, "mb_loader_set_position: epoch %lld chunk %lld batch %lld outside "
                       "the plan (%lld chunks)", (long long)pos.epoch, (long long)pos.chunk, (long long)pos.batch,
                       (long long)ld->plan.chunks);
    ld->epoch = pos.epoch;
    ld->chunk = pos.chunk;
    ld->batch = pos.batch;
    ld->index = pos.batch;
    for (int64_t c = 0; c < pos.chunk; c++) ld->index += mb__ld_chunk_batches(ld, pos.epoch, c);
    return MB_OK;
}

MBDEF mb_result mb_loader_reset_epoch(mb_loader *ld) {
    if (!ld) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_reset_epoch: NULL loader");
    mb_loader_pos p;
    p.epoch = ld->epoch;
    p.chunk = p.batch = 0;
    return mb_loader_set_position(ld, p);
}

MBDEF const mb_chunk_plan *mb_loader_get_plan(const mb_loader *ld) { return ld ? &ld->plan : NULL; }

MBDEF mb_loader_stats mb_loader_get_stats(const mb_loader *ld) {
    mb_loader_stats s;
#ifndef MEGABATCH_NO_THREADS
    mb__mutex_lock((mb__mutex *)&ld->mu);
    s = ld->stats;
    mb__mutex_unlock((mb__mutex *)&ld->mu);
#else
    s = ld->stats;
#endif
    return s;
}

/* The loader's plan. Sharded: the plan of the global batch W * batch over W times the
 * budget (each rank holds its ~1/W of every chunk), batches counted per rank. */
static mb_result mb__ld_plan(const mb_loader_config *cfg, const mb_dataset_meta *m, size_t free_bytes,
                             mb_chunk_plan *out) {
    if (cfg->shard_count <= 1) return mb_loader_plan(m->n, m->t, m->f, m->k, cfg, free_bytes, out);
    if (cfg->shard_rank < 0 || cfg->shard_rank >= cfg->shard_count || cfg->batch < 1 ||
        cfg->batch > INT64_MAX / cfg->shard_count)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_open: shard %d of %d (batch %lld) is not a shard",
                       cfg->shard_rank, cfg->shard_count, (long long)cfg->batch);
    mb_loader_config c = *cfg;
    size_t w = (size_t)cfg->shard_count;
    c.batch *= cfg->shard_count;
    c.chunk_bytes = cfg->chunk_bytes <= SIZE_MAX / w ? cfg->chunk_bytes * w : SIZE_MAX;
    MB_TRY(mb_loader_plan(m->n, m->t, m->f, m->k, &c, free_bytes <= SIZE_MAX / w ? free_bytes * w : SIZE_MAX, out));
    int64_t spc = out->samples_per_chunk, last = m->n - (out->chunks - 1) * spc, b = cfg->batch;
    out->batches = (out->chunks - 1) * ((mb__shard_rows(cfg, spc) + b - 1) / b) + (mb__shard_rows(cfg, last) + b - 1) / b;
    return MB_OK;
}

/* Device chunk buffers for the current plan; on out-of-memory retry with 0.8x the
 * budget (0.75 -> 0.60 -> 0.48 of free memory), error below one batch. */
static mb_result mb__ld_alloc_chunks(mb_loader *ld, const mb_dataset_meta *m, size_t free_bytes) {
    double frac = mb__chunk_fraction(&ld->cfg);
    for (;;) {
        mb_result r = MB_OK;
        ld->cap = ld->cfg.shard_count > 1 ? mb__shard_rows(&ld->cfg, ld->plan.samples_per_chunk) : ld->plan.samples_per_chunk;
        for (int b = 0; b < ld->plan.buffers && r == MB_OK; b++) {
            r = mb_alloc(ld->dev, MB_MEM_DEVICE, (size_t)ld->cap * (ld->drow_f + ld->drow_t), &ld->buf[b].mem);
            ld->buf[b].feat = (char *)ld->buf[b].mem;
            ld->buf[b].targ = ld->buf[b].feat + (size_t)ld->cap * ld->drow_f;
        }
        if (r == MB_OK) return MB_OK;
        for (int b = 0; b < 2; b++) { mb_free(ld->dev, ld->buf[b].mem); ld->buf[b].mem = NULL; }
        if (r != MB_ERR_OUT_OF_MEMORY) return r;
        size_t failed = ld->plan.budget_bytes, next = (size_t)((double)failed * 0.8);
        /* the least that works: one batch per buffer (two buffers unless one batch is all) */
        size_t need = ld->plan.bytes_per_sample * (size_t)(ld->cfg.batch < m->n ? 2 * ld->cfg.batch : m->n);
        if (next < need)
            return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: %s: no device memory for a chunk: %zu bytes "
                           "failed and %zu bytes are below one batch of %lld samples per buffer (%zu bytes)", m->source, failed,
                           next, (long long)ld->cfg.batch, need);
        frac *= 0.8;
        MB_LOG(ld->lg, MB_LOG_WARN, "mb_loader_open: device chunk budget of %zu bytes failed; retrying with %zu "
               "bytes (fraction %.2f)", failed, next, frac);
        mb_loader_config c = ld->cfg;
        c.chunk_bytes = c.shard_count > 1 ? next / (size_t)c.shard_count : next;
        MB_TRY(mb__ld_plan(&c, m, free_bytes, &ld->plan));
    }
}

/* Two staging slabs: pinned; on failure up to 4 halvings, then pageable at full size. */
static mb_result mb__ld_alloc_slabs(mb_loader *ld) {
    size_t bps = ld->row_f + ld->row_t, want = ld->cfg.slab_bytes ? ld->cfg.slab_bytes : ((size_t)256 << 20);
    int64_t full = (int64_t)(want / bps);
    if (full < 1) full = 1;
    if (full > ld->cap) full = ld->cap;
    int64_t rows = full;
    mb_mem_kind kind = MB_MEM_PINNED;
    for (int tries = 0;; tries++) {
        mb_result r = mb_alloc(ld->dev, kind, (size_t)rows * bps, &ld->slab[0]);
        if (r == MB_OK) r = mb_alloc(ld->dev, kind, (size_t)rows * bps, &ld->slab[1]);
        if (r == MB_OK) break;
        mb_free(ld->dev, ld->slab[0]);
        ld->slab[0] = ld->slab[1] = NULL;
        if (r != MB_ERR_OUT_OF_MEMORY || kind == MB_MEM_HOST) return r;
        if (tries < 4 && rows > 1) {
            rows = (rows + 1) / 2;
            MB_LOG(ld->lg, MB_LOG_WARN, "mb_loader_open: pinned slabs failed; trying 2 x %zu bytes", (size_t)rows * bps);
        } else {
            kind = MB_MEM_HOST;
            rows = full;
            MB_LOG(ld->lg, MB_LOG_WARN, "mb_loader_open: no pinned memory; staging through pageable 2 x %zu bytes "
                   "(slower copies, same data)", (size_t)rows * bps);
        }
    }
    ld->slab_rows = rows;
    return MB_OK;
}

static mb_result mb__ld_alloc_host(mb_loader *ld) {
    size_t cap = (size_t)ld->cap;
    ld->perm = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    ld->inv = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    ld->seen = (unsigned char *)mb__host_calloc(cap, 1);
    ld->order = (int64_t *)mb__host_calloc((size_t)ld->plan.chunks, sizeof(int64_t));
    ld->gperm = (int64_t *)mb__host_calloc(ld->cfg.shard_count > 1 ? (size_t)ld->plan.samples_per_chunk : 1, sizeof(int64_t));
    ld->buf[0].cur = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    ld->buf[1].cur = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    if (!ld->perm || !ld->inv || !ld->seen || !ld->order || !ld->gperm || !ld->buf[0].cur || !ld->buf[1].cur)
        return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory for %zu-row index arrays", cap);
    if (ld->cfg.shuffle) return mb_alloc(ld->dev, MB_MEM_DEVICE, ld->drow_f + ld->drow_t, &ld->tmp_row);
    return MB_OK;
}

/* dtype != f32: the device stage of one slab of f32. On out-of-memory halve it (the
 * slabs are then filled only that far: smaller reads, same data); error at one row. */
static mb_result mb__ld_alloc_stage(mb_loader *ld) {
    if (ld->cfg.dtype == MB_F32) return MB_OK;
    size_t bps = ld->row_f + ld->row_t;
    for (;;) {
        mb_result r = mb_alloc(ld->dev, MB_MEM_DEVICE, (size_t)ld->slab_rows * bps, &ld->stage);
        if (r != MB_ERR_OUT_OF_MEMORY) return r;
        if (ld->slab_rows == 1)
            return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no device memory for the %s conversion "
                           "stage of one sample (%zu bytes)", mb_dtype_name(ld->cfg.dtype), bps);
        ld->slab_rows = (ld->slab_rows + 1) / 2;
        MB_LOG(ld->lg, MB_LOG_WARN, "mb_loader_open: %s conversion stage failed; trying %zu bytes (smaller reads)",
               mb_dtype_name(ld->cfg.dtype), (size_t)ld->slab_rows * bps);
    }
}

/* The window layout's device side: the chunk buffers of the plan, two staging slabs, the
 * conversion stage, the host index arrays, the reader thread. */
static mb_result mb__ld_chunks_open(mb_loader *ld, size_t free_bytes) {
    const mb_dataset_meta *m = mb_dataset_info(ld->ds);
    mb_result r = mb__ld_alloc_chunks(ld, m, free_bytes);
    if (r == MB_OK) r = mb__ld_alloc_slabs(ld);
    if (r == MB_OK) r = mb__ld_alloc_stage(ld);
    if (r == MB_OK) r = mb__ld_alloc_host(ld);
#ifndef MEGABATCH_NO_THREADS
    if (r == MB_OK) {
        if (mb__thread_create(&ld->thread, mb__ld_thread, ld) != 0)
            r = MB_FAIL(ld->lg, MB_ERR_UNSUPPORTED, "mb_loader_open: cannot start the reader thread");
        else ld->started = 1;
    }
#endif
    MB_TRY(r);
    MB_LOG(ld->lg, MB_LOG_INFO, "mb_loader_open: %s: %lld samples of %zu bytes, %lld chunk(s) of %lld samples in %d "
           "buffer(s), %lld batches/epoch, slabs 2 x %lld samples, %s", m->source, (long long)m->n,
           ld->plan.bytes_per_sample, (long long)ld->plan.chunks, (long long)ld->plan.samples_per_chunk,
           ld->plan.buffers, (long long)ld->plan.batches, (long long)ld->slab_rows,
           mb_dtype_name(ld->cfg.dtype));
    return MB_OK;
}

/* Stop the reader thread, then free what mb__ld_chunks_open allocated (NULL is fine). */
static void mb__ld_chunks_close(mb_loader *ld) {
#ifndef MEGABATCH_NO_THREADS
    if (ld->started) {
        mb__mutex_lock(&ld->mu);
        ld->quit = 1;
        mb__cond_broadcast(&ld->cv);
        mb__mutex_unlock(&ld->mu);
        mb__thread_join(ld->thread);
    }
#endif
    mb_sync(ld->dev, MB_STREAM_COPY);
    for (int b = 0; b < 2; b++) { mb_free(ld->dev, ld->buf[b].mem); MB_FREE(ld->buf[b].cur); }
    mb_free(ld->dev, ld->slab[0]);
    mb_free(ld->dev, ld->slab[1]);
    mb_free(ld->dev, ld->tmp_row);
    mb_free(ld->dev, ld->stage);
    MB_FREE(ld->perm); MB_FREE(ld->inv); MB_FREE(ld->seen); MB_FREE(ld->order); MB_FREE(ld->gperm);
}

MBDEF void mb_loader_close(mb_loader *ld) {
    if (!ld) return;
    ld->src->loader_close(ld);
#ifndef MEGABATCH_NO_THREADS
    mb__mutex_destroy(&ld->mu);
    mb__cond_destroy(&ld->cv);
#endif
    MB_FREE(ld);
}

MBDEF mb_result mb_loader_open(mb_loader **out, mb_device *dev, mb_dataset *ds, const mb_loader_config *cfg) {
    if (!out || !dev || !ds || !cfg) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_loader_open: NULL argument");
    *out = NULL;
    const mb_logger *lg = &dev->cfg.log;
    const mb_dataset_meta *m = mb_dataset_info(ds);
    size_t free_bytes = 0;
    if (!cfg->chunk_bytes) MB_TRY(mb_device_memory(dev, NULL, &free_bytes));
    mb_chunk_plan plan;
    MB_TRY(mb__ld_plan(cfg, m, free_bytes, &plan));
    mb_loader *ld = (mb_loader *)mb__host_calloc(1, sizeof *ld);
    if (!ld) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory");
    ld->dev = dev; ld->ds = ds; ld->lg = lg; ld->cfg = *cfg; ld->plan = plan;
    ld->row_f = (size_t)(m->t * m->f) * sizeof(float);
    ld->row_t = (size_t)m->k * sizeof(float);
    ld->drow_f = (size_t)(m->t * m->f) * mb_dtype_size(cfg->dtype);
    ld->drow_t = (size_t)m->k * mb_dtype_size(cfg->dtype);
    ld->buf[0].epoch = ld->buf[1].epoch = -1;
    ld->cur_buf = -1;
    ld->order_epoch = -1;
#ifndef MEGABATCH_NO_THREADS
    mb__mutex_init(&ld->mu);
    mb__cond_init(&ld->cv);
#endif
    ld->src = ds->src;
    mb_result r = ld->src->loader_open(ld, free_bytes);
    if (r != MB_OK) { mb_loader_close(ld); return r; }
    *out = ld;
    return MB_OK;
}

// -- the window layout's source --
// Its reads (// -- the window layout -- in the dataset module) and its chunks (above).

static const mb__source *mb__window_source(void) {
    MB__OPS_BEGIN
    static const mb__source src = {
        .name = "window", .read = mb__win_read, .close = mb__win_close,
        .loader_open = mb__ld_chunks_open, .loader_next = mb__ld_chunks_next, .loader_close = mb__ld_chunks_close,
    };
    MB__OPS_END
    return &src;
}

// ---- end loader ----

// ---- series ----
// The series layout (docs/SERIES.md) as a data source (// -- the data source -- in the
// dataset module): the dataset side (validation, host reads that cut windows on the host),
// the gather backend operation, the loader's series mode, and last the source's table.

typedef struct mb__series_ds {
    int s;                                  /* timeframes */
    const float *bars[MB_MAX_SEGMENTS];     /* (meta.bars[i], f) */
    const int64_t *ends;                    /* (n, s) */
    const float *targ;                      /* (n, k) */
    void *owned[MB_MAX_SEGMENTS + 2];       /* file datasets: what was read at open */
    int nonfinite;                          /* some bar or target is NaN/Inf */
} mb__series_ds;

/* The series of a dataset this source opened (its ctx). */
static mb__series_ds *mb__sr(const mb_dataset *ds) { return (mb__series_ds *)ds->ctx; }

static const mb__source *mb__series_source(void); /* the table, at the end of this module */

static void mb__sr_close(mb_dataset *ds) {
    mb__series_ds *sr = mb__sr(ds);
    if (!sr) return;
    for (int i = 0; i < MB_MAX_SEGMENTS + 2; i++) MB_FREE(sr->owned[i]);
    MB_FREE(sr);
    ds->ctx = NULL;
}

/* Byte counts of a series (float32 bars + int64 ends + float32 targets) and of one sample's
 * window; overflow and the cap are errors. Fills bytes_per_sample and total_bytes. */
static mb_result mb__sr_sizes(mb_dataset *ds) {
    mb_dataset_meta *m = &ds->meta;
    const mb_logger *lg = &ds->cfg.log;
    size_t total = 0, b, cap = ds->cfg.max_bytes ? ds->cfg.max_bytes : ((size_t)1 << 40), tf, bps;
    int ok = 1;
    for (int i = 0; i < m->segments && ok; i++)
        ok = mb_size_mul((size_t)m->bars[i], (size_t)m->f, &b) && mb_size_mul(b, sizeof(float), &b) &&
             mb_size_add(total, b, &total);
    ok = ok && mb_size_mul((size_t)m->n, (size_t)m->segments * sizeof(int64_t), &b) && mb_size_add(total, b, &total) &&
         mb_size_mul((size_t)m->n, (size_t)m->k, &b) && mb_size_mul(b, sizeof(float), &b) && mb_size_add(total, b, &total);
    int64_t tfd[2] = {m->t, m->f};
    ok = ok && mb_size_product(tfd, 2, sizeof(float), &tf) && mb_size_add(tf, (size_t)m->k * sizeof(float), &bps);
    if (!ok)
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "%s: series of %lld samples, F = %lld, K = %lld, T = %lld: byte count "
                       "overflows size_t", m->source, (long long)m->n, (long long)m->f, (long long)m->k, (long long)m->t);
    if (total > cap)
        return MB_FAIL(lg, MB_ERR_OVERFLOW, "%s: series: %zu bytes exceed the cap of %zu bytes "
                       "(mb_dataset_config.max_bytes)", m->source, total, cap);
    m->bytes_per_sample = bps;
    m->total_bytes = total;
    return MB_OK;
}

/* Every index in range, every window complete, indices non-decreasing over samples; notes
 * non-finite bars or targets (the loader then cuts windows on the host, applying the policy). */
static mb_result mb__sr_check(mb_dataset *ds) {
    const mb_dataset_meta *m = &ds->meta;
    mb__series_ds *sr = mb__sr(ds);
    int S = sr->s;
    for (int64_t i = 0; i < m->n; i++)
        for (int s = 0; s < S; s++) {
            int64_t e = sr->ends[i * S + s], len = m->segment_len[s];
            char tf[MB_MAX_NAME + 1] = "";
            if (m->segment_name[s][0]) snprintf(tf, sizeof tf, " %s", m->segment_name[s]);
            if (e < len - 1 || e >= m->bars[s])
                return MB_FAIL(&ds->cfg.log, MB_ERR_FORMAT, "%s: 'ends'[%lld][%d] (timeframe %d%s) = %lld: %s (a window of "
                               "%lld bars needs an index in [%lld, %lld])", m->source, (long long)i, s, s, tf, (long long)e,
                               e >= m->bars[s] ? "past the last bar" : "the window is incomplete", (long long)len,
                               (long long)(len - 1), (long long)(m->bars[s] - 1));
            if (i > 0 && e < sr->ends[(i - 1) * S + s])
                return MB_FAIL(&ds->cfg.log, MB_ERR_FORMAT, "%s: 'ends' decreases in timeframe %d%s: sample %lld ends at "
                               "bar %lld, sample %lld at %lld (samples must be in time order)", m->source, s, tf,
                               (long long)(i - 1), (long long)sr->ends[(i - 1) * S + s], (long long)i, (long long)e);
        }
    for (int s = 0; s < S && !sr->nonfinite; s++)
        for (size_t j = 0; j < (size_t)(m->bars[s] * m->f) && !sr->nonfinite; j++) sr->nonfinite = !isfinite(sr->bars[s][j]);
    for (size_t j = 0; j < (size_t)(m->n * m->k) && !sr->nonfinite; j++) sr->nonfinite = !isfinite(sr->targ[j]);
    return MB_OK;
}

MBDEF mb_result mb_dataset_open_series(mb_dataset **out, const mb_series *s, const mb_dataset_config *cfg) {
    const mb_logger *lg = cfg ? &cfg->log : NULL;
    if (!out || !s || !s->window || !s->bars_n || !s->bars || !s->ends || !s->targets)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_dataset_open_series: NULL argument");
    *out = NULL;
    if (s->segments < 1 || s->segments > MB_MAX_SEGMENTS || s->n < 1 || s->f < 1 || s->k < 1)
        return MB_FAIL(lg, MB_ERR_FORMAT, "mb_dataset_open_series: %d timeframes (1..%d), N = %lld, F = %lld, K = %lld "
                       "(each >= 1)", s->segments, MB_MAX_SEGMENTS, (long long)s->n, (long long)s->f, (long long)s->k);
    mb_dataset *ds = NULL;
    MB_TRY(mb__ds_new(&ds, "memory", cfg));
    mb_dataset_meta *m = &ds->meta;
    mb_result r = MB_OK;
    mb__series_ds *sr = (mb__series_ds *)mb__host_calloc(1, sizeof *sr);
    ds->src = mb__series_source();
    ds->ctx = sr;
    if (!sr) r = MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_dataset_open_series: no host memory");
    m->n = s->n; m->f = s->f; m->k = s->k; m->segments = s->segments; m->layout = MB_LAYOUT_SERIES;
    for (int i = 0; i < s->segments && r == MB_OK; i++) {
        if (s->window[i] < 1 || s->window[i] > ((int64_t)1 << 40) || s->bars_n[i] < 1 || !s->bars[i])
            r = MB_FAIL(lg, MB_ERR_FORMAT, "mb_dataset_open_series: timeframe %d: window %lld, %lld bars (each >= 1) "
                        "at %p", i, (long long)s->window[i], (long long)s->bars_n[i], (const void *)s->bars[i]);
        else { m->segment_len[i] = s->window[i]; m->t += s->window[i]; m->bars[i] = s->bars_n[i]; sr->bars[i] = s->bars[i]; }
    }
    strcpy(m->features_type, "float32");
    strcpy(m->targets_type, "float32");
    strcpy(ds->fname, "bars");
    if (r == MB_OK) {
        sr->s = s->segments; sr->ends = s->ends; sr->targ = s->targets;
        r = mb__sr_sizes(ds);
    }
    if (r == MB_OK) r = mb__sr_check(ds);
    if (r != MB_OK) { mb_dataset_close(ds); return r; }
    *out = ds;
    return MB_OK;
}

/* Samples [start, start + n) as windows (n, t, f) and targets (n, k), cut on the host. */
static mb_result mb__sr_read(mb_dataset *ds, int64_t start, int64_t n, float *feat, float *targ) {
    const mb_dataset_meta *m = &ds->meta;
    const mb__series_ds *sr = mb__sr(ds);
    size_t f = (size_t)m->f, k = (size_t)m->k;
    for (int64_t i = 0; i < n; i++) {
        float *dst = feat + (size_t)i * (size_t)m->t * f;
        for (int s = 0; s < sr->s; s++) {
            int64_t len = m->segment_len[s], first = sr->ends[(start + i) * sr->s + s] - len + 1;
            memcpy(dst, sr->bars[s] + (size_t)first * f, (size_t)len * f * sizeof(float));
            dst += (size_t)len * f;
        }
        memcpy(targ + (size_t)i * k, sr->targ + (size_t)(start + i) * k, k * sizeof(float));
    }
    return MB_OK;
}

#ifndef MEGABATCH_NO_HDF5
/* Read a whole dataset as mem_type into a new host buffer of `bytes` (owned by the series). */
static mb_result mb__sr_h5_read_all(mb_dataset *ds, hid_t d, const char *name, hid_t mem_type, size_t bytes, int slot) {
    char st[512];
    void *p = mb__host_alloc(bytes ? bytes : 1);
    if (!p) return MB_FAIL(&ds->cfg.log, MB_ERR_OUT_OF_MEMORY, "%s: no host memory for '%s' (%zu bytes)",
                           ds->meta.source, name, bytes);
    mb__sr(ds)->owned[slot] = p;
    if (H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p) < 0)
        return MB_FAIL(&ds->cfg.log, MB_ERR_IO, "%s: reading '%s': %s", ds->meta.source, name, mb__h5_stack(st));
    return MB_OK;
}

/* `bars_<s>` (N_s, F): float32 or a 16-bit float, every timeframe the same F. */
static mb_result mb__sr_h5_bars(mb_dataset *ds, int s, hid_t *d) {
    mb_dataset_meta *m = &ds->meta;
    char name[32], tn[32];
    hsize_t dims[2] = {0, 0};
    int r = 0;
    snprintf(name, sizeof name, "bars_%d", s);
    MB_TRY(mb__h5_open_ds(ds, name, 2, 2, d, dims, &r, tn));
    mb_result res = MB_OK;
    if (strcmp(tn, "float32") && strcmp(tn, "float16"))
        res = MB_FAIL(&ds->cfg.log, MB_ERR_FORMAT, "%s: dataset '%s' has dtype %s: bars are float32 or a 16-bit float",
                      m->source, name, tn);
    else if (dims[0] < 1 || dims[1] < 1 || dims[0] > (hsize_t)INT64_MAX / 2 || dims[1] > (hsize_t)INT64_MAX / 2 ||
             (s > 0 && (int64_t)dims[1] != m->f))
        res = MB_FAIL(&ds->cfg.log, MB_ERR_FORMAT, "%s: dataset '%s' is (%llu, %llu): each timeframe needs >= 1 bar "
                      "of the same F (%lld)", m->source, name, (unsigned long long)dims[0], (unsigned long long)dims[1],
                      (long long)(s > 0 ? m->f : (int64_t)dims[1]));
    if (res != MB_OK) { H5Dclose(*d); return res; }
    m->bars[s] = (int64_t)dims[0];
    m->f = (int64_t)dims[1];
    if (s == 0) snprintf(m->features_type, sizeof m->features_type, "%s", tn);
    return MB_OK;
}

/* Everything of a series file after H5Fopen: ends, targets, segments, bars; then the whole
 * series is read into host memory and its indices checked. */
static mb_result mb__sr_h5_validate(mb_dataset *ds) {
    mb_dataset_meta *m = &ds->meta;
    const mb_logger *lg = &ds->cfg.log;
    hsize_t ed[2] = {0, 0}, td[2] = {0, 1};
    int er = 0, tr = 0;
    char et[32];
    strcpy(ds->fname, "ends");
    ds->dfeat_name = "ends";
    ds->src = mb__series_source();
    m->layout = MB_LAYOUT_SERIES;
    MB_TRY(mb__h5_open_ds(ds, "ends", 2, 2, &ds->dfeat, ed, &er, et));
    if (strncmp(et, "int", 3) && strncmp(et, "uint", 4))
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset 'ends' has dtype %s: bar indices must be integers", m->source, et);
    MB_TRY(mb__h5_open_ds(ds, ds->tname, 1, 2, &ds->dtarg, td, &tr, m->targets_type));
    if (tr == 1) td[1] = 1;
    if (ed[0] != td[0])
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: N differs: 'ends' has %llu samples, '%s' has %llu", m->source,
                       (unsigned long long)ed[0], ds->tname, (unsigned long long)td[0]);
    if (ed[0] < 1 || td[1] < 1 || ed[0] > (hsize_t)INT64_MAX / 2 || td[1] > (hsize_t)INT64_MAX / 2)
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: 'ends' (%llu, %llu) / '%s' (%llu, %llu): N and K must be >= 1 and fit",
                       m->source, (unsigned long long)ed[0], (unsigned long long)ed[1], ds->tname,
                       (unsigned long long)td[0], (unsigned long long)td[1]);
    m->n = (int64_t)ed[0]; m->k = (int64_t)td[1]; m->t = 0;
    MB_TRY(mb__h5_segments(ds));
    if (m->segments < 1 || (hsize_t)m->segments != ed[1])
        return MB_FAIL(lg, MB_ERR_FORMAT, "%s: 'ends' has %llu columns and %d window lengths (attribute 'segments' on "
                       "'ends', one per timeframe, is required)", m->source, (unsigned long long)ed[1], m->segments);
    hid_t bd[MB_MAX_SEGMENTS];
    int opened = 0;
    mb_result r = MB_OK;
    for (; opened < m->segments && r == MB_OK; opened++) r = mb__sr_h5_bars(ds, opened, &bd[opened]);
    if (r != MB_OK) opened--; /* the failed one is not open */
    if (r == MB_OK) r = mb__sr_sizes(ds);
    mb__series_ds *sr = NULL;
    if (r == MB_OK && !(ds->ctx = sr = (mb__series_ds *)mb__host_calloc(1, sizeof *sr)))
        r = MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "%s: no host memory", m->source);
    for (int s = 0; s < m->segments && r == MB_OK; s++) {
        r = mb__sr_h5_read_all(ds, bd[s], "bars", H5T_NATIVE_FLOAT, (size_t)(m->bars[s] * m->f) * sizeof(float), s);
        sr->bars[s] = (const float *)sr->owned[s];
    }
    for (int s = 0; s < opened; s++) H5Dclose(bd[s]);
    if (r == MB_OK) r = mb__sr_h5_read_all(ds, ds->dfeat, "ends", H5T_NATIVE_INT64,
                                            (size_t)m->n * (size_t)m->segments * sizeof(int64_t), MB_MAX_SEGMENTS);
    if (r == MB_OK) r = mb__sr_h5_read_all(ds, ds->dtarg, ds->tname, H5T_NATIVE_FLOAT,
                                            (size_t)(m->n * m->k) * sizeof(float), MB_MAX_SEGMENTS + 1);
    MB_TRY(r);
    sr->s = m->segments;
    sr->ends = (const int64_t *)sr->owned[MB_MAX_SEGMENTS];
    sr->targ = (const float *)sr->owned[MB_MAX_SEGMENTS + 1];
    MB_TRY(mb__sr_check(ds));
    strcpy(ds->fname, "bars");
    if (strcmp(m->features_type, "float32") || strcmp(m->targets_type, "float32"))
        MB_LOG(lg, MB_LOG_INFO, "%s: bars are %s and '%s' is %s; HDF5 converts to float32 on read", m->source,
               m->features_type, ds->tname, m->targets_type);
    return MB_OK;
}
#endif

/* ---- the gather operation ----
 * One batch of windows out of resident bars: row r of batch row b is bar
 * ends[idx[b]][s] - len[s] + 1 + (r - start of segment s) of timeframe s; targets are row
 * idx[b] of targ. Plain byte copies of `es`-byte elements, so every dtype is bitwise the
 * same as the window layout's rows. CPU: memcpy per (sample, timeframe); CUDA: one kernel
 * (megabatch_cuda.cuh, "cuda series"), both through mb__gather_row. */
typedef struct mb__gather {
    int segments, es;                       /* timeframes; bytes per element (4 or 2) */
    int64_t len[MB_MAX_SEGMENTS], t, count; /* window lengths, their sum, batch rows */
    const char *bars[MB_MAX_SEGMENTS];      /* device: (bars, f) of es-byte elements */
    size_t row, trow;                       /* bytes of one bar row / one target row */
    const int64_t *ends, *idx;              /* device: (n, segments); the batch's samples */
    const char *targ;                       /* device: (n, k) */
    char *dst_f, *dst_t;                    /* device: (count, t, f) and (count, k) */
} mb__gather;

/* The bar row that window row r of batch row b reads. */
static inline MB__HD const char *mb__gather_row(const mb__gather *g, int64_t b, int64_t r) {
    int s = 0;
    while (r >= g->len[s]) r -= g->len[s++];
    int64_t bar = g->ends[g->idx[b] * g->segments + s] - g->len[s] + 1 + r;
    return g->bars[s] + (size_t)bar * g->row;
}

/* The backend's series group: one batch gathered on a stream (g->count > 0). */
typedef struct mb__series_ops {
    mb_result (*gather)(mb_device *dev, int stream, const mb__gather *g);
} mb__series_ops;
MB__OPS_CHECK(mb__series_ops, 1);

static mb_result mb__cpu_series_gather(mb_device *dev, int stream, const mb__gather *g) {
    (void)dev; (void)stream;
    for (int64_t b = 0; b < g->count; b++) {
        char *dst = g->dst_f + (size_t)(b * g->t) * g->row;
        for (int s = 0, r = 0; s < g->segments; r += (int)g->len[s], s++) {
            memcpy(dst, mb__gather_row(g, b, r), (size_t)g->len[s] * g->row);
            dst += (size_t)g->len[s] * g->row;
        }
        memcpy(g->dst_t + (size_t)b * g->trow, g->targ + (size_t)g->idx[b] * g->trow, g->trow);
    }
    return MB_OK;
}

/* Validate, then the backend's series group. */
static mb_result mb__series_gather(mb_device *dev, int stream, const mb__gather *g) {
    MB_TRY(mb__check_stream(dev, stream, "mb__series_gather"));
    if (g->count <= 0) return MB_OK;
    return dev->be->series->gather(dev, stream, g);
}

/* ---- the loader's series mode ----
 * Bars, ends and targets are copied to the device once at open (in the loader dtype:
 * 16-bit rounding on the host, mb_f32_to_bf16/f16 as the device conversion does); each
 * epoch's sample order (the resident window layout's permutation, sharded the same way)
 * is computed on the host and copied to the device once; each batch is one gather on the
 * compute stream into one batch buffer. No dataset read after open. */
typedef struct mb__series_ld {
    void *bars[MB_MAX_SEGMENTS], *ends, *targ, *idx, *batch; /* device */
    int64_t *hidx, *perm;  /* host: the epoch's sample per local row; the permutation */
    int64_t rows;          /* local rows per epoch (this rank's when sharded) */
    int64_t idx_epoch;     /* epoch whose order is in idx; -1: none */
    mb__gather g;
} mb__series_ld;

/* The series mode of a loader this source opened (its ctx). */
static mb__series_ld *mb__sl(const mb_loader *ld) { return (mb__series_ld *)ld->ctx; }

static void mb__sl_close(mb_loader *ld) {
    mb__series_ld *sl = mb__sl(ld);
    if (!sl) return;
    mb_sync(ld->dev, -1);
    for (int s = 0; s < MB_MAX_SEGMENTS; s++) mb_free(ld->dev, sl->bars[s]);
    mb_free(ld->dev, sl->ends); mb_free(ld->dev, sl->targ); mb_free(ld->dev, sl->idx); mb_free(ld->dev, sl->batch);
    MB_FREE(sl->hidx); MB_FREE(sl->perm);
    MB_FREE(sl);
    ld->ctx = NULL;
}

/* Device bytes of series mode: bars, ends, targets, the order and one batch buffer. */
static int mb__sl_bytes(const mb_dataset_meta *m, const mb_loader_config *cfg, size_t *out) {
    size_t s = mb_dtype_size(cfg->dtype), total = 0, b;
    int ok = 1;
    for (int i = 0; i < m->segments && ok; i++)
        ok = mb_size_mul((size_t)(m->bars[i] * m->f), s, &b) && mb_size_add(total, b, &total);
    return ok && mb_size_mul((size_t)m->n, (size_t)m->segments * 8 + (size_t)m->k * s + 8, &b) &&
           mb_size_add(total, b, &total) && mb_size_mul((size_t)cfg->batch, m->bytes_per_sample / 4 * s, &b) &&
           mb_size_add(total, b, out);
}

/* Host float32 rows to the device in the loader dtype (16-bit: rounded on the host). */
static mb_result mb__sl_upload(mb_loader *ld, void **dst, const float *src, size_t n) {
    size_t es = mb_dtype_size(ld->cfg.dtype);
    MB_TRY(mb_alloc(ld->dev, MB_MEM_DEVICE, n * es, dst));
    if (ld->cfg.dtype == MB_F32) {
        ld->stats.bytes_copied += n * es;
        MB_TRY(mb_copy(ld->dev, MB_STREAM_COPY, *dst, src, n * es));
        return mb_sync(ld->dev, MB_STREAM_COPY);
    }
    uint16_t *h = (uint16_t *)mb__host_calloc(n ? n : 1, sizeof *h);
    if (!h) return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory for %zu elements", n);
    for (size_t i = 0; i < n; i++) h[i] = ld->cfg.dtype == MB_BF16 ? mb_f32_to_bf16(src[i]) : mb_f32_to_f16(src[i]);
    ld->stats.bytes_copied += n * es;
    mb_result r = mb_copy(ld->dev, MB_STREAM_COPY, *dst, h, n * es);
    if (r == MB_OK) r = mb_sync(ld->dev, MB_STREAM_COPY);
    MB_FREE(h);
    return r;
}

static mb_result mb__sl_alloc(mb_loader *ld) {
    const mb_dataset_meta *m = mb_dataset_info(ld->ds);
    const mb__series_ds *sr = mb__sr(ld->ds);
    mb__series_ld *sl = mb__sl(ld);
    mb__gather *g = &sl->g;
    size_t es = mb_dtype_size(ld->cfg.dtype);
    for (int s = 0; s < m->segments; s++) {
        MB_TRY(mb__sl_upload(ld, &sl->bars[s], sr->bars[s], (size_t)(m->bars[s] * m->f)));
        g->bars[s] = (const char *)sl->bars[s];
        g->len[s] = m->segment_len[s];
    }
    MB_TRY(mb__sl_upload(ld, &sl->targ, sr->targ, (size_t)(m->n * m->k)));
    size_t eb = (size_t)m->n * (size_t)m->segments * sizeof(int64_t);
    MB_TRY(mb_alloc(ld->dev, MB_MEM_DEVICE, eb, &sl->ends));
    ld->stats.bytes_copied += eb;
    MB_TRY(mb_copy(ld->dev, MB_STREAM_COPY, sl->ends, sr->ends, eb));
    MB_TRY(mb_sync(ld->dev, MB_STREAM_COPY));
    MB_TRY(mb_alloc(ld->dev, MB_MEM_DEVICE, (size_t)sl->rows * sizeof(int64_t), &sl->idx));
    MB_TRY(mb_alloc(ld->dev, MB_MEM_DEVICE, (size_t)ld->cfg.batch * (ld->drow_f + ld->drow_t), &sl->batch));
    sl->hidx = (int64_t *)mb__host_calloc((size_t)sl->rows, sizeof(int64_t));
    sl->perm = (int64_t *)mb__host_calloc((size_t)m->n, sizeof(int64_t));
    if (!sl->hidx || !sl->perm) return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory for the order");
    g->segments = m->segments; g->es = (int)es; g->t = m->t;
    g->row = (size_t)m->f * es; g->trow = (size_t)m->k * es;
    g->ends = (const int64_t *)sl->ends; g->targ = (const char *)sl->targ;
    g->dst_f = (char *)sl->batch; g->dst_t = g->dst_f + (size_t)ld->cfg.batch * ld->drow_f;
    return MB_OK;
}

/* The series layout's device side: bars, ends and targets resident (series mode) when they
 * fit the budget and are all finite. Otherwise the loader runs the window layout's chunks
 * over this dataset: windows cut on the host by mb_dataset_read (the chunk rule; the NaN
 * policy then applies as for windows). */
static mb_result mb__sl_open(mb_loader *ld, size_t free_bytes) {
    const mb_dataset_meta *m = mb_dataset_info(ld->ds);
    const mb_loader_config *cfg = &ld->cfg;
    size_t need = 0, budget = cfg->chunk_bytes ? cfg->chunk_bytes
                                               : (size_t)((double)free_bytes * (cfg->chunk_fraction ? cfg->chunk_fraction : 0.75));
    if (mb__sr(ld->ds)->nonfinite || !mb__sl_bytes(m, cfg, &need) || need > budget) {
        MB_LOG(ld->lg, MB_LOG_INFO, "mb_loader_open: %s: series %s; windows are cut on the host into chunks", m->source,
               mb__sr(ld->ds)->nonfinite ? "holds non-finite values" : "does not fit the device budget");
        ld->src = mb__window_source();
        return ld->src->loader_open(ld, free_bytes);
    }
    mb_loader_config whole = *cfg;
    whole.chunk_bytes = SIZE_MAX; /* one chunk: every sample */
    MB_TRY(mb__ld_plan(&whole, m, free_bytes, &ld->plan));
    ld->plan.budget_bytes = budget;
    ld->plan.chunk_bytes = need;
    mb__series_ld *sl = (mb__series_ld *)mb__host_calloc(1, sizeof *sl);
    ld->ctx = sl;
    if (!sl) return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory");
    sl->idx_epoch = -1;
    sl->rows = cfg->shard_count > 1 ? mb__shard_rows(cfg, m->n) : m->n;
    MB_TRY(mb__sl_alloc(ld));
    MB_LOG(ld->lg, MB_LOG_INFO, "mb_loader_open: %s: series mode, %lld samples, %zu device bytes resident, %lld "
           "batches/epoch, %s", m->source, (long long)m->n, need, (long long)ld->plan.batches, mb_dtype_name(cfg->dtype));
    return MB_OK;
}

/* The sample of each local row for ld->epoch on the device: the permutation the window
 * layout applies to a resident chunk (Philox stream (epoch, 0)), sharded as mb__shard_pos. */
static mb_result mb__sl_order(mb_loader *ld) {
    mb__series_ld *sl = mb__sl(ld);
    int64_t n = mb_dataset_info(ld->ds)->n;
    if (sl->idx_epoch == ld->epoch || (!ld->cfg.shuffle && sl->idx_epoch >= 0)) return MB_OK;
    if (sl->idx_epoch >= 0) MB_TRY(mb_sync(ld->dev, MB_STREAM_COMPUTE)); /* the last copy out of hidx is done */
    if (ld->cfg.shuffle) mb__permutation(ld->cfg.seed, mb__shuffle_stream(ld->epoch, 0), n, sl->perm);
    else for (int64_t i = 0; i < n; i++) sl->perm[i] = i;
    for (int64_t i = 0; i < sl->rows; i++)
        sl->hidx[i] = sl->perm[ld->cfg.shard_count > 1 ? mb__shard_pos(&ld->cfg, n, i) : i];
    ld->stats.bytes_copied += (uint64_t)sl->rows * sizeof(int64_t);
    MB_TRY(mb_copy(ld->dev, MB_STREAM_COMPUTE, sl->idx, sl->hidx, (size_t)sl->rows * sizeof(int64_t)));
    sl->idx_epoch = ld->epoch;
    return MB_OK;
}

/* mb_loader_next in series mode: the next batch gathered into the batch buffer (*done = 1),
 * or the epoch's batches are over (*done = 0; the caller ends the epoch). */
static mb_result mb__sl_batch(mb_loader *ld, mb_batch *out, int *done) {
    mb__series_ld *sl = mb__sl(ld);
    int64_t B = ld->cfg.batch, first = ld->batch * B, count = sl->rows - first < B ? sl->rows - first : B;
    *done = 0;
    if (count <= 0 || (ld->cfg.drop_last && count < B)) {
        ld->chunk = ld->plan.chunks;
        return MB_OK;
    }
    MB_TRY(mb__sl_order(ld));
    sl->g.idx = (const int64_t *)sl->idx + first;
    sl->g.count = count;
    MB_TRY(mb__series_gather(ld->dev, MB_STREAM_COMPUTE, &sl->g));
    out->features = sl->g.dst_f;
    out->targets = sl->g.dst_t;
    out->count = count;
    out->epoch = ld->epoch;
    out->index = ld->index++;
    ld->batch++;
    *done = 1;
    return MB_OK;
}

// -- the series layout's source --

static const mb__source *mb__series_source(void) {
    MB__OPS_BEGIN
    static const mb__source src = {
        .name = "series", .read = mb__sr_read, .close = mb__sr_close,
        .loader_open = mb__sl_open, .loader_next = mb__sl_batch, .loader_close = mb__sl_close,
    };
    MB__OPS_END
    return &src;
}

MB__OPS_BEGIN
static const mb__series_ops mb__cpu_series_ops = {.gather = mb__cpu_series_gather};
MB__OPS_END

// ---- end series ----

// ---- lstm ----

/* Names in this module: H is the hidden size everywhere (mb_lstm_config.hidden_size; the CUDA
 * kernels' Hp is H padded to their tile); `li` a layer index (layer 0 reads x); `interval` the
 * checkpoint interval (steps of T a segment recomputes; 0: full storage; mb__lstm_auto_k
 * picks it), `interval_max` the largest one the buffers hold; `kern` the CPU's row kernel (mb__rk,
 * the row-independent product of the gemm module). */

/* The cell's functions below are declared MB__CELL_FN: always inlined (the row loops
 * vectorize only with the cell inside; Clang's inliner left the call out of line, measured:
 * 100 ns a cell). MB__NO_CONTRACT (gemm module), at the top of each, keeps a * b + c from
 * becoming an fma where they are inlined into rows built for an FMA target. */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define MB__CELL_FN static inline __attribute__((always_inline))
#else
#define MB__CELL_FN static inline MB__HD
#endif

/* Gate nonlinearities without library calls or float branches, so that the CPU cell
 * loops vectorize (libm's expf/tanhf calls were most of a CPU step at small H).
 * exp: x clamped to [-87, 87] by comparisons that let NaN through (NaN in, NaN out), n =
 * round(x / ln2) by the 1.5 * 2^23 shifter (whose bits also give 2^n), Cody-Waite
 * reduction x = n ln2 + r, degree-6 Taylor polynomial; relative error about 2.3e-7. Every
 * step is an explicit fmaf: one rounding each, so the same bits on any CPU and on a GPU
 * whatever the compiler's contraction setting, and a chain half as long as with separate
 * multiplies and adds (the cell loops wait on that chain: twice the speed, measured). Where
 * the CPU has no FMA instruction, fmaf is libm's (exact, slower).
 * sigmoid = 1/(1+exp(-z)); tanh = 1 - 2/(exp(2z)+1), absolute error about 2e-7. The same
 * code runs in the CUDA kernels. */
MB__CELL_FN float mb__fexp(float x) {
    MB__NO_CONTRACT
    x = -87.0f > x ? -87.0f : x; /* the comparisons are false for NaN */
    x = 87.0f < x ? 87.0f : x;
    float k = MB__FMAF(x, 1.44269504f, 12582912.0f), n = k - 12582912.0f; /* k's low bits: n */
    float r = MB__FMAF(-n, 0.693145752f, x);
    r = MB__FMAF(-n, 1.42860677e-6f, r);
    float p = MB__FMAF(r, 1.38888892e-3f, 8.33333377e-3f);
    p = MB__FMAF(p, r, 4.16666679e-2f);
    p = MB__FMAF(p, r, 1.66666672e-1f);
    p = MB__FMAF(p, r, 0.5f);
    p = MB__FMAF(p, r, 1.0f);
    p = MB__FMAF(p, r, 1.0f);
    union { float f; uint32_t u; } e, nan;
    e.f = k;
    e.u = (e.u + 127u) << 23; /* 2^n: k's bits are 0x4b400000 + n, and 0x4b400000 << 23 wraps to 0 */
    nan.u = 0x7fc00000u;      /* NaN in: this quiet NaN out (which NaN an fma passes on varies) */
    e.f = p * e.f;
    uint32_t m = isnan(x) ? 0xffffffffu : 0u; /* a select of bits, not of floats: GCC (trapping
        math) keeps a float select as a branch, and then the AVX2 rows did not vectorize */
    e.u = (e.u & ~m) | (nan.u & m);
    return e.f;
}
MB__CELL_FN float mb__fsigmoid(float z) {
    MB__NO_CONTRACT
    return 1.0f / (1.0f + mb__fexp(-z));
}
MB__CELL_FN float mb__ftanh(float z) {
    MB__NO_CONTRACT
    return 1.0f - 2.0f / (mb__fexp(2.0f * z) + 1.0f);
}

/* One LSTM cell, element j of row b: the same math on the CPU and in the CUDA kernels.
 * g4 points at the row's 4H pre-activations (overwritten with i, f, g, o). */
MB__CELL_FN void mb__lstm_cell_fwd(float *g4, int64_t H, int64_t j, float bias_i, float bias_f,
                                   float bias_g, float bias_o, float c_prev, float *c, float *h) {
    MB__NO_CONTRACT
    float i = mb__fsigmoid(g4[j] + bias_i);
    float f = mb__fsigmoid(g4[H + j] + bias_f);
    float g = mb__ftanh(g4[2 * H + j] + bias_g);
    float o = mb__fsigmoid(g4[3 * H + j] + bias_o);
    float cn = f * c_prev + i * g;
    *c = cn;
    *h = o * mb__ftanh(cn);
    g4[j] = i; g4[H + j] = f; g4[2 * H + j] = g; g4[3 * H + j] = o;
}

/* Backward of one cell: a4 the activated gates, dh the gradient w.r.t. h_t, *dc in: the
 * gradient w.r.t. c_t from step t+1, out: w.r.t. c_{t-1}. Writes the 4 pre-activation
 * gradients to d4. */
MB__CELL_FN void mb__lstm_cell_bwd(const float *a4, int64_t H, int64_t j, float c_prev, float c,
                                   float dh, float *dc, float *d4) {
    MB__NO_CONTRACT
    float i = a4[j], f = a4[H + j], g = a4[2 * H + j], o = a4[3 * H + j];
    float tc = mb__ftanh(c);
    float dcv = *dc + dh * o * (1.0f - tc * tc);
    d4[j] = dcv * g * i * (1.0f - i);
    d4[H + j] = dcv * c_prev * f * (1.0f - f);
    d4[2 * H + j] = dcv * i * (1.0f - g * g);
    d4[3 * H + j] = dh * tc * o * (1.0f - o);
    *dc = dcv * f;
}

/* The backend's lstm group. The recurrence, a layer at a time: create makes the backend's
 * per-LSTM state (l->be_lstm: which strategy runs, its workspace; l->fused_blocks for
 * mb_lstm_fused_blocks) at the end of mb_lstm_create's allocations, and refuses a
 * cfg.fused_blocks it cannot run; destroy frees it (also after a failed create);
 * full_extra: the device bytes create would add at full storage (the checkpoint default counts
 * them; SIZE_MAX on overflow); layer_forward: layer li over the last forward's T steps
 * (mb__lstm_steps_forward is the per-step path any backend may run); layer_backward: its
 * backward, dout (T, B, H) its output gradients, d_in its input's (NULL: not needed; layer 0:
 * the caller's dx); many: mb_lstm_*_many's checked calls, their forwards or backwards whole
 * (mb__lstm_forward_begin / _end, mb__lstm_backward_begin / _tail and the dropout around the
 * layers, as mb__lstm_forward and mb__lstm_backward run them).
 * The per-step path's elementwise operations, on the LSTM's stream: a step's gates forward
 * (g: the pre-activations in, activated out; need_h 0: h may be left unwritten, a recompute)
 * and backward (dh = dh_rec + dout), strided rows (mb__lstm_copy_strided: f32 in, dt out),
 * y += x, y = v. */
typedef struct mb__lstm_ops {
    mb_result (*create)(mb_lstm *l);
    void (*destroy)(mb_lstm *l);
    size_t (*full_extra)(mb_device *dev, const mb_lstm_config *cfg);
    mb_result (*layer_forward)(mb_lstm *l, int li);
    mb_result (*layer_backward)(mb_lstm *l, int li, const float *dout, float *d_in);
    mb_result (*many)(mb_lstm_call *calls, int n, int backward);
    mb_result (*fwd_gates)(mb_device *dev, int stream, int64_t B, int64_t H, float *g, const float *b_ih,
                           const float *b_hh, const float *c_prev, float *c, float *h, int need_h);
    mb_result (*bwd_gates)(mb_device *dev, int stream, int64_t B, int64_t H, const float *a, const float *c_prev,
                           const float *c, const float *dh_rec, const float *dout, float *dc, float *dg);
    mb_result (*copy_strided)(mb_device *dev, int stream, void *dst, mb_dtype dt, int64_t ds0, int64_t ds1,
                              const float *src, int64_t ss0, int64_t ss1, int64_t n0, int64_t n1, int64_t d);
    mb_result (*add)(mb_device *dev, int stream, float *y, const float *x, size_t n);
    mb_result (*fill)(mb_device *dev, int stream, float *y, float v, size_t n);
} mb__lstm_ops;
MB__OPS_CHECK(mb__lstm_ops, 11);


enum { MB__LSTM_WIH = 0, MB__LSTM_WHH = 1, MB__LSTM_BIH = 2, MB__LSTM_BHH = 3 };

typedef struct mb__lstm_layer {
    int idx[4];     /* params indices: weight_ih, weight_hh, bias_ih, bias_hh */
    int64_t in;     /* input width: F for layer 0, H above */
    float *hs;      /* (T+1, B, H) time-major, slot 0 = h0: the layer's output, always kept */
    float *cs;      /* full storage: (T+1, B, H) cell states, slot 0 = c0; checkpoint: (nseg+1, B, H) */
    float *gates;   /* full storage: (T, B, 4H) activated gates; NULL when checkpointing */
    void *hs_lp, *wih_lp, *whh_lp; /* low precision: hs, W_ih, W_hh as gemm operands */
    float *xd;      /* dropout, layers k >= 1, f32: (T, B, H) the layer's input, the layer below's outputs
                       through the mask (cfg.dropout) */
    void *xd_lp;    /* dropout, layers k >= 1, low precision: xd in the operand type only */
} mb__lstm_layer;

struct mb_lstm {
    mb_device *dev;
    mb_params *params;
    mb_lstm_config cfg;
    int64_t F, H, maxT, maxB, interval_max; /* interval_max: largest segment, 0 = full storage */
    int L, G;
    mb__lstm_layer *layer;
    const float *x; /* the last forward's input (B, T, F), rows xs floats apart: the caller's */
    int64_t xs;
    float *xblk;    /* (G, B, F) one block of x, time-major; also one block of dx */
    mb_dtype op;    /* gemm operand type (cfg.precision) */
    void *x_lp;     /* low precision: (G, B, F) xblk */
    void *g_lp;     /* low precision: (G, B, 4H) gblk */
    float *seg_g;   /* checkpoint: (interval_max + 2G - 2, B, 4H) gates of one segment's blocks */
    float *seg_c;   /* checkpoint: (interval_max+1, B, H) cells of one segment */
    float *hscr;    /* (B, H) h of a recomputed step (equal to the kept one) */
    float *gblk;    /* (G, B, 4H) gate gradients of one weight-gradient block */
    float *ones;    /* (G * B) ones, for bias gradients as a gemm */
    float *dh, *dc; /* (B, H) recurrent gradients */
    float *dA, *dB; /* (T, B, H) gradients w.r.t. a layer's output, ping-pong */
    float *hn, *cn; /* (L, B, H) final state of the last forward */
    int64_t B, T, interval; /* shape and checkpoint interval of the last forward (0: full storage) */
    int seg_kept;    /* checkpointing: the layer whose last segment's gates and cells the forward
                        left in seg_g / seg_c (-1: none); its backward needs no recompute there */
    int have_fwd, have_state;
    int training;    /* mb_lstm_set_training (1 at creation) */
    int drop;        /* the last forward dropped between its layers (cfg.dropout, training, layers > 1) */
    int fused_blocks; /* what mb_lstm_fused_blocks reports: the backend's create sets it */
    void *be_lstm;    /* the backend's own state for this LSTM (its create and destroy), as dev->ctx is
                         the device's: the CPU's packed weights, the GPU's fused workspace */
    int frozen;       /* mb_lstm_freeze: the caller promises the weights do not change */
    unsigned freezes; /* mb_lstm_freeze's calls: a backend that keeps what it derived from the weights
                         (the CPU's packing) sees that a new promise began */
};

static const mb_logger *mb__lstm_log(const mb_lstm *l) { return &l->dev->cfg.log; }

// -- the per-step path's operations (the CPU's at the module's end, CUDA's in megabatch_cuda.cuh) --
static mb_result mb__lstm_fwd_gates(mb_lstm *l, int64_t B, float *g, const float *b_ih, const float *b_hh,
                                    const float *c_prev, float *c, float *h) {
    /* a recompute's h (hscr) equals the kept one: the CPU skips it */
    return l->dev->be->lstm->fwd_gates(l->dev, l->cfg.stream, B, l->H, g, b_ih, b_hh, c_prev, c, h, h != l->hscr);
}

/* dg (B, 4H) from the activated gates a (B, 4H); dh = dh_rec + dout. */
static mb_result mb__lstm_bwd_gates(mb_lstm *l, int64_t B, const float *a, const float *c_prev, const float *c,
                                    const float *dh_rec, const float *dout, float *dc, float *dg) {
    return l->dev->be->lstm->bwd_gates(l->dev, l->cfg.stream, B, l->H, a, c_prev, c, dh_rec, dout, dc, dg);
}

/* Rows of d floats: row (i, j) for i < n0, j < n1 goes from src + i*ss0 + j*ss1 to
 * dst + i*ds0 + j*ds1 (strides in elements), converted to dt (an input's operand copy in
 * one pass). With the strides swapped this is the batch-major <-> time-major transpose, of a
 * whole sequence or of one block of steps. */
static mb_result mb__lstm_copy_strided(mb_lstm *l, void *dst, mb_dtype dt, int64_t ds0, int64_t ds1, const float *src,
                                       int64_t ss0, int64_t ss1, int64_t n0, int64_t n1, int64_t d) {
    return l->dev->be->lstm->copy_strided(l->dev, l->cfg.stream, dst, dt, ds0, ds1, src, ss0, ss1, n0, n1, d);
}

static mb_result mb__lstm_add(mb_lstm *l, float *y, const float *x, size_t n) { /* y += x, not overlapping */
    return l->dev->be->lstm->add(l->dev, l->cfg.stream, y, x, n);
}

static mb_result mb__lstm_fill(mb_lstm *l, float *y, float v, size_t n) {
    return l->dev->be->lstm->fill(l->dev, l->cfg.stream, y, v, n);
}

/* A copy and a zero on the LSTM's stream: the backend's, straight (not mb_copy / mb_zero: the
 * LSTM's own buffers and stream pass their checks by construction). */
static mb_result mb__lstm_copy(mb_lstm *l, float *dst, const float *src, size_t n) {
    return l->dev->be->rt->copy(l->dev, l->cfg.stream, dst, src, n * sizeof(float));
}

static mb_result mb__lstm_zero(mb_lstm *l, float *dst, size_t n) {
    return l->dev->be->rt->zero(l->dev, l->cfg.stream, dst, n * sizeof(float));
}

/* C (m, n) = op(A) op(B) + beta C on the LSTM's stream, A and B of type t (l->op: the LSTM's
 * operands), C f32: checked as mb_gemm checks, then the backend's gemm. */
static mb_result mb__lstm_gemm(mb_lstm *l, mb_dtype t, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a,
                               int64_t lda, const void *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.trans_a = ta; g.trans_b = tb; g.m = m; g.n = n; g.k = k;
    g.alpha = 1.0f; g.beta = beta; g.ab_type = t; g.c_type = MB_F32;
    g.a = a; g.lda = lda; g.b = b; g.ldb = ldb; g.c = c; g.ldc = ldc;
    g.stream = l->cfg.stream;
    MB_TRY(mb__gemm_check(l->dev, &g));
    return l->dev->be->gemm->run(l->dev, &g);
}

/* Element e of an operand array (of type l->op). */
static const void *mb__lstm_el(const mb_lstm *l, const void *base, int64_t e) {
    return (const char *)base + (size_t)e * mb_dtype_size(l->op);
}

/* Low precision: round n floats of src into the operand copy dst (no-op in f32). */
static mb_result mb__lstm_round(mb_lstm *l, void *dst, const float *src, size_t n) {
    if (l->op == MB_F32) return MB_OK;
    return mb_convert(l->dev, l->cfg.stream, dst, l->op, src, MB_F32, n);
}

/* Layer k's operands: its kept outputs hs and its weights, in the operand type. */
static const void *mb__lstm_hs_op(const mb_lstm *l, int li) {
    return l->op == MB_F32 ? (const void *)l->layer[li].hs : l->layer[li].hs_lp;
}

/* Layer k's (k >= 1) input of all steps, time-major (T, B, H), as gemm operands: the layer
 * below's outputs (from slot 1 of its hs), or with dropout (l->drop) their dropped copy. */
static const void *mb__lstm_in_op(const mb_lstm *l, int k) {
    const mb__lstm_layer *y = &l->layer[k];
    if (l->drop) return l->op == MB_F32 ? (const void *)y->xd : y->xd_lp;
    return mb__lstm_el(l, mb__lstm_hs_op(l, k - 1), l->B * l->H);
}

// -- dropout between the layers (cfg.dropout, nn.LSTM's) --
/* Layer k's outputs h_1..h_T (T, B, H) keyed by dropout_seed + k: mb_dropout_forward_dev's mask
 * of that sequence at *dropout_step. Nothing is stored but the dropped copy the next layer reads
 * (every recompute reads it too); the backward draws the mask again. */
static uint64_t mb__lstm_drop_seed(const mb_lstm *l, int k) { return l->cfg.dropout_seed + (uint64_t)k; }

/* After layer k's forward (k < L-1): layer k+1's input = dropout(layer k's outputs). Low
 * precision: through dA (free until the backward, which writes all of it first) into the
 * operand copy. */
static mb_result mb__lstm_drop_forward(mb_lstm *l, int k) {
    if (!l->drop || k >= l->L - 1) return MB_OK;
    mb__lstm_layer *y = &l->layer[k + 1];
    size_t n = (size_t)(l->T * l->B * l->H);
    float *dst = l->op == MB_F32 ? y->xd : l->dA;
    MB_TRY(mb_dropout_forward_dev(l->dev, l->cfg.stream, l->cfg.dropout, mb__lstm_drop_seed(l, k), l->cfg.dropout_step,
                                  l->layer[k].hs + l->B * l->H, dst, n));
    return mb__lstm_round(l, y->xd_lp, dst, n);
}

/* After layer k's backward (k >= 1): the gradient w.r.t. its input (the dropped outputs of layer
 * k-1, in dout(k-1)) through the same mask, in place: the gradient w.r.t. layer k-1's outputs. */
static float *mb__lstm_dout(const mb_lstm *l, int k);
static mb_result mb__lstm_drop_backward(mb_lstm *l, int k) {
    if (!l->drop || k < 1) return MB_OK;
    float *d = mb__lstm_dout(l, k - 1);
    return mb_dropout_backward_dev(l->dev, l->cfg.stream, l->cfg.dropout, mb__lstm_drop_seed(l, k - 1),
                                   l->cfg.dropout_step, d, d, (size_t)(l->T * l->B * l->H));
}

// -- sizes --

static int64_t mb__lstm_G(const mb_lstm_config *c) { return c->grad_block ? c->grad_block : 16; }

/* Auto interval: ceil(sqrt(T)) rounded up to a multiple of the block G, so segments
 * start and end on block boundaries and a recompute projects no step twice. */
static int64_t mb__lstm_auto_k(int64_t T, int64_t G) {
    int64_t interval = (int64_t)ceil(sqrt((double)T));
    while (interval * interval < T) interval++;
    interval = (interval + G - 1) / G * G;
    return interval < 1 ? 1 : interval;
}

/* Checkpoint interval at T: 0 = full storage, else 1..T. */
static int64_t mb__lstm_interval(const mb_lstm_config *c, int64_t T) {
    if (c->checkpoint < 0) return 0;
    int64_t interval = c->checkpoint == 0 ? mb__lstm_auto_k(T, mb__lstm_G(c)) : c->checkpoint;
    return interval > T ? T : interval;
}

static mb_result mb__lstm_check_config(const mb_lstm_config *c, const mb_logger *lg) {
    if (c->input_size < 1 || c->hidden_size < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: input_size F=%lld and hidden_size H=%lld must be >= 1",
                       (long long)c->input_size, (long long)c->hidden_size);
    if (c->layers < 0 || c->checkpoint < -1 || c->grad_block < 0)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: layers=%d must be >= 0, checkpoint=%d >= -1, "
                       "grad_block=%d >= 0", c->layers, c->checkpoint, c->grad_block);
    if (c->max_steps < 1 || c->max_batch < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: max_steps=%lld and max_batch=%lld must be >= 1",
                       (long long)c->max_steps, (long long)c->max_batch);
    if (c->carry_state != 0 && c->carry_state != 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: carry_state=%d must be 0 or 1", c->carry_state);
    if (!mb_dtype_size(c->precision))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: precision=%d is not MB_F32, MB_BF16 or MB_F16",
                       (int)c->precision);
    if (c->fused_blocks < -1 || c->fused_blocks == 3 || c->fused_blocks > 4)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: fused_blocks=%d must be -1, 0, 1, 2 or 4",
                       c->fused_blocks);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_create: dropout=%g must be in [0, 1)", (double)c->dropout);
    return MB_OK;
}

/* Element counts of every buffer; 0 when a product overflows (or exceeds BLAS int). */
typedef struct mb__lstm_sizes {
    size_t hs, cs_full, cs_ckpt, gates, xblk, seg_g, seg_c, bh, gblk, ones, dbuf, state;
} mb__lstm_sizes;

static int mb__lstm_sizes_of(const mb_lstm_config *c, int64_t B, int64_t T, int64_t interval_max, mb__lstm_sizes *s) {
    int64_t F = c->input_size, H = c->hidden_size, L = c->layers ? c->layers : 1;
    int64_t G = mb__lstm_G(c), nseg = interval_max ? (T + interval_max - 1) / interval_max : 0;
    /* gate rows of a segment: from the block start of its first step to the block end of
       its last; k rows when segments are block-aligned (k a multiple of G) */
    int64_t kg = interval_max ? interval_max + (interval_max % G ? 2 * (G - 1) : 0) : 0;
    if (kg > T) kg = T;
    const int64_t lim = INT32_MAX;
    if (B > lim || T > lim || F > lim || H > lim / 4 || G > lim) return 0;
    int64_t d[][3] = {{T + 1, B, H}, {T, B, 4 * H}, {G, B, F}, {kg, B, 4 * H}, {interval_max + 1, B, H},
                      {nseg + 1, B, H}, {G, B, 4 * H}, {L, B, H}};
    size_t v[8];
    for (int i = 0; i < 8; i++)
        if (!mb_size_product(d[i], 3, 1, &v[i]) || v[i] > (size_t)lim * 64) return 0;
    if ((int64_t)(v[1] / (size_t)(4 * H)) > lim || (size_t)B * (size_t)T * (size_t)F > (size_t)lim * 64)
        return 0; /* gemm rows; x and dx (B, T, F) are the caller's */
    s->hs = v[0]; s->cs_full = v[0]; s->gates = v[1]; s->xblk = v[2]; s->seg_g = v[3]; s->seg_c = v[4];
    s->cs_ckpt = v[5]; s->gblk = v[6]; s->state = v[7];
    s->bh = (size_t)(B * H); s->ones = (size_t)(G * B); s->dbuf = v[0] - s->bh;
    return 1;
}

/* Kept-activation bytes: per layer hs + cells (+ gates), the input block, and the
 * checkpoint segment buffers. The input x itself is the caller's (kept by reference until
 * backward, as PyTorch's autograd does) and not counted. */
static size_t mb__lstm_kept(const mb__lstm_sizes *s, int64_t L, int full, mb_dtype op, int drop) {
    size_t per = s->hs + (full ? s->cs_full + s->gates : s->cs_ckpt);
    size_t lp = op == MB_F32 ? 0 : (s->hs * (size_t)L + s->xblk) * 2; /* operand copies of h and x */
    size_t xd = drop ? s->dbuf * (size_t)(L - 1) * (op == MB_F32 ? sizeof(float) : 2) : 0; /* dropped inputs */
    return (per * (size_t)L + s->xblk + (full ? 0 : s->seg_g + s->seg_c)) * sizeof(float) + lp + xd;
}

MBDEF mb_result mb_lstm_memory(const mb_lstm_config *cfg, int64_t B, int64_t T, size_t *full_bytes,
                               size_t *checkpointed_bytes) {
    if (!cfg) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_memory: NULL config");
    MB_TRY(mb__lstm_check_config(cfg, NULL));
    if (B < 1 || T < 1)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_memory: B=%lld and T=%lld must be >= 1", (long long)B,
                       (long long)T);
    mb__lstm_sizes sf, sc;
    int64_t interval = mb__lstm_interval(cfg, T), L = cfg->layers ? cfg->layers : 1;
    if (!mb__lstm_sizes_of(cfg, B, T, 0, &sf) || !mb__lstm_sizes_of(cfg, B, T, interval, &sc))
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "mb_lstm_memory: B=%lld T=%lld F=%lld H=%lld overflows",
                       (long long)B, (long long)T, (long long)cfg->input_size, (long long)cfg->hidden_size);
    int drop = cfg->dropout > 0.0f && L > 1;
    if (full_bytes) *full_bytes = mb__lstm_kept(&sf, L, 1, cfg->precision, drop);
    if (checkpointed_bytes) *checkpointed_bytes = mb__lstm_kept(interval ? &sc : &sf, L, interval == 0, cfg->precision, drop);
    return MB_OK;
}

MBDEF int64_t mb_lstm_checkpoint_steps(const mb_lstm *l, int64_t T) {
    int64_t interval = mb__lstm_interval(&l->cfg, T < 1 ? 1 : T);
    return interval ? interval : -1;
}

MBDEF int mb_lstm_fused_blocks(const mb_lstm *l) { return l ? l->fused_blocks : 0; }

// -- create / destroy --

/* A backend's create when it cannot run cfg.fused_blocks > 0. */
static mb_result mb__lstm_fused_refused(const mb_lstm *l) {
    return MB_FAIL(mb__lstm_log(l), MB_ERR_UNSUPPORTED, "mb_lstm_create: fused_blocks=%d: the fused recurrence with %d "
                   "blocks a row tile needs a GPU that has it, full storage (checkpoint -1, or 0 when memory allows) "
                   "and H=%lld in %s to fit a block's shared memory", l->cfg.fused_blocks, l->cfg.fused_blocks,
                   (long long)l->H, mb_dtype_name(l->op));
}

static mb_result mb__lstm_register(mb_lstm *l) {
    const char *pre = l->cfg.prefix ? l->cfg.prefix : "";
    const char *names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    float bound = 1.0f / sqrtf((float)l->H);
    for (int li = 0; li < l->L; li++) {
        int64_t shapes[4][2] = {{4 * l->H, l->layer[li].in}, {4 * l->H, l->H}, {4 * l->H, 0}, {4 * l->H, 0}};
        for (int w = 0; w < 4; w++) {
            char name[MB_MAX_NAME * 2];
            snprintf(name, sizeof name, "%s%s_l%d", pre, names[w], li);
            MB_TRY(mb_params_add(l->params, name, w < 2 ? 2 : 1, shapes[w], bound, &l->layer[li].idx[w]));
        }
    }
    return MB_OK;
}

static mb_result mb__lstm_alloc(mb_lstm *l, float **p, size_t n) {
    return mb_alloc(l->dev, MB_MEM_DEVICE, n * sizeof(float), (void **)p);
}

static mb_result mb__lstm_alloc_all(mb_lstm *l) {
    mb__lstm_sizes s;
    if (!mb__lstm_sizes_of(&l->cfg, l->maxB, l->maxT, l->interval_max, &s))
        return MB_FAIL(mb__lstm_log(l), MB_ERR_OVERFLOW, "mb_lstm_create: workspace for max_batch=%lld max_steps=%lld "
                       "F=%lld H=%lld overflows", (long long)l->maxB, (long long)l->maxT, (long long)l->F,
                       (long long)l->H);
    for (int li = 0; li < l->L; li++) {
        mb__lstm_layer *y = &l->layer[li];
        MB_TRY(mb__lstm_alloc(l, &y->hs, s.hs));
        MB_TRY(mb__lstm_alloc(l, &y->cs, l->interval_max ? s.cs_ckpt : s.cs_full));
        if (!l->interval_max) MB_TRY(mb__lstm_alloc(l, &y->gates, s.gates));
    }
    if (l->interval_max) {
        MB_TRY(mb__lstm_alloc(l, &l->seg_g, s.seg_g));
        MB_TRY(mb__lstm_alloc(l, &l->seg_c, s.seg_c));
    }
    MB_TRY(mb__lstm_alloc(l, &l->xblk, s.xblk));
    if (l->op != MB_F32) { /* 2-byte operand copies */
        for (int li = 0; li < l->L; li++) {
            mb__lstm_layer *y = &l->layer[li];
            MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, s.hs * 2, &y->hs_lp));
            MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, (size_t)(4 * l->H * y->in) * 2, &y->wih_lp));
            MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, (size_t)(4 * l->H * l->H) * 2, &y->whh_lp));
        }
        MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, s.xblk * 2, &l->x_lp));
        MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, s.gblk * 2, &l->g_lp));
    }
    for (int k = 1; l->cfg.dropout > 0.0f && k < l->L; k++) { /* the dropped inputs (T, B, H) */
        if (l->op == MB_F32) MB_TRY(mb__lstm_alloc(l, &l->layer[k].xd, s.dbuf));
        else MB_TRY(mb_alloc(l->dev, MB_MEM_DEVICE, s.dbuf * 2, &l->layer[k].xd_lp));
    }
    MB_TRY(mb__lstm_alloc(l, &l->hscr, s.bh));
    MB_TRY(mb__lstm_alloc(l, &l->gblk, s.gblk));
    MB_TRY(mb__lstm_alloc(l, &l->ones, s.ones));
    MB_TRY(mb__lstm_alloc(l, &l->dh, s.bh));
    MB_TRY(mb__lstm_alloc(l, &l->dc, s.bh));
    MB_TRY(mb__lstm_alloc(l, &l->dA, s.dbuf));
    if (l->L > 1) MB_TRY(mb__lstm_alloc(l, &l->dB, s.dbuf));
    MB_TRY(mb__lstm_alloc(l, &l->hn, s.state));
    MB_TRY(mb__lstm_alloc(l, &l->cn, s.state));
    MB_TRY(l->dev->be->lstm->create(l)); /* the backend's state: its strategy and workspace */
    return mb__lstm_fill(l, l->ones, 1.0f, s.ones);
}

MBDEF void mb_lstm_destroy(mb_lstm *l) {
    if (!l) return;
    mb_device *d = l->dev;
    if (l->layer)
        for (int li = 0; li < l->L; li++) {
            mb_free(d, l->layer[li].hs); mb_free(d, l->layer[li].cs); mb_free(d, l->layer[li].gates);
            mb_free(d, l->layer[li].hs_lp); mb_free(d, l->layer[li].wih_lp); mb_free(d, l->layer[li].whh_lp);
            mb_free(d, l->layer[li].xd); mb_free(d, l->layer[li].xd_lp);
        }
    float *bufs[] = {l->xblk, l->seg_g, l->seg_c, l->hscr, l->gblk, l->ones, l->dh, l->dc, l->dA, l->dB, l->hn,
                     l->cn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mb_free(d, bufs[i]);
    mb_free(d, l->x_lp); mb_free(d, l->g_lp);
    d->be->lstm->destroy(l);
    MB_FREE(l->layer);
    MB_FREE(l);
}

/* ---- the checkpoint default ----
 * checkpoint = 0, on every backend: full storage (no recompute, the fastest backward) when the
 * LSTM's full activations at max_batch x max_steps, with the fused recurrence's workspace where
 * it runs, take at most a quarter of the device's free memory at creation (room for the other
 * encoders, the head and the optimizer; on the CPU the host's available memory); the
 * ceil(sqrt(T)) interval only when memory is short. Gradients are bitwise the same either way.
 * (The CPU used the interval always until issue 29 measured its recompute: 1.3-1.4x the full
 * storage's time a layer, 1.25-1.3x the multi-timeframe step's, docs/BENCHMARKS.md.) */
static int mb__lstm_full_fits_in(size_t full_bytes, size_t free_bytes) { return full_bytes <= free_bytes / 4; }

static int mb__lstm_full_fits(mb_device *dev, const mb_lstm_config *cfg) {
    size_t full = 0, total = 0, free_bytes = 0, ws = 0;
    if (mb_lstm_memory(cfg, cfg->max_batch, cfg->max_steps, &full, NULL) != MB_OK) { mb_clear_error(); return 0; }
    if (mb_device_memory(dev, &total, &free_bytes) != MB_OK) { mb_clear_error(); return 0; }
    ws = dev->be->lstm->full_extra(dev, cfg);
    return mb_size_add(full, ws, &full) && mb__lstm_full_fits_in(full, free_bytes);
}

MBDEF mb_result mb_lstm_create(mb_lstm **out, mb_params *params, const mb_lstm_config *cfg) {
    if (out) *out = NULL;
    if (!out || !params || !cfg) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_create: NULL argument");
    mb_device *dev = mb_params_device(params);
    MB_TRY(mb__lstm_check_config(cfg, &dev->cfg.log));
    MB_TRY(mb__check_stream(dev, cfg->stream, "mb_lstm_create"));
    if (cfg->dropout > 0.0f && !cfg->dropout_step)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_lstm_create: dropout=%g needs dropout_step (a uint64_t "
                       "in device memory)", (double)cfg->dropout);
    mb_lstm *l = (mb_lstm *)mb__host_calloc(1, sizeof *l);
    if (!l) return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_lstm_create: no host memory");
    l->dev = dev; l->params = params; l->cfg = *cfg; l->training = 1;
    if (cfg->checkpoint == 0 && mb__lstm_full_fits(dev, cfg))
        l->cfg.checkpoint = -1; /* auto: full storage when memory allows (above) */
    l->F = cfg->input_size; l->H = cfg->hidden_size; l->L = cfg->layers ? cfg->layers : 1;
    l->G = (int)mb__lstm_G(cfg);
    l->op = cfg->precision;
    l->maxT = cfg->max_steps; l->maxB = cfg->max_batch;
    int ck = l->cfg.checkpoint;
    l->interval_max = ck < 0 ? 0 : ck > 0 ? (ck < l->maxT ? ck : l->maxT) : mb__lstm_auto_k(l->maxT, l->G);
    l->layer = (mb__lstm_layer *)mb__host_calloc((size_t)l->L, sizeof *l->layer);
    mb_result r = l->layer ? MB_OK : MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_lstm_create: no host memory");
    for (int li = 0; r == MB_OK && li < l->L; li++) l->layer[li].in = li ? l->H : l->F;
    if (r == MB_OK) r = mb__lstm_alloc_all(l); /* before registering: a failure leaves params untouched */
    if (r == MB_OK) r = mb__lstm_register(l);
    if (r != MB_OK) { mb_lstm_destroy(l); return r; }
    *out = l;
    return MB_OK;
}

MBDEF void mb_lstm_reset_state(mb_lstm *l) {
    if (l) l->have_state = 0;
}

MBDEF int64_t mb_lstm_state_batch(const mb_lstm *l) { return l && l->have_state ? l->B : 0; }

MBDEF void mb_lstm_set_training(mb_lstm *l, int training) {
    if (l) l->training = training != 0;
}

MBDEF void mb_lstm_freeze(mb_lstm *l, int frozen) {
    if (l) { l->frozen = frozen != 0; l->freezes++; }
}

MBDEF mb_result mb_lstm_set_state(mb_lstm *l, int64_t B, const float *h_n, const float *c_n) {
    if (!l || !h_n || !c_n) return MB_FAIL(l ? mb__lstm_log(l) : NULL, MB_ERR_INVALID_ARG, "mb_lstm_set_state: NULL argument");
    if (B < 1 || B > l->maxB)
        return MB_FAIL(mb__lstm_log(l), MB_ERR_INVALID_ARG, "mb_lstm_set_state: B=%lld must be in 1..max_batch=%lld",
                       (long long)B, (long long)l->maxB);
    size_t n = (size_t)(l->L * B * l->H);
    MB_TRY(mb__lstm_copy(l, l->hn, h_n, n));
    MB_TRY(mb__lstm_copy(l, l->cn, c_n, n));
    l->B = B;
    l->have_state = 1;
    l->have_fwd = 0;
    return MB_OK;
}

// -- forward --

static mb_result mb__lstm_weights(mb_lstm *l, int li, float **w, int grad, const char *what) {
    for (int i = 0; i < 4; i++) {
        w[i] = grad ? mb_params_tensor_grad(l->params, l->layer[li].idx[i]) : mb_params_tensor(l->params, l->layer[li].idx[i]);
        if (!w[i]) return MB_FAIL(mb__lstm_log(l), MB_ERR_STATE, "%s: parameters not finalized (mb_params_finalize)", what);
    }
    return MB_OK;
}

/* Layer k's input rows of steps [a, a+n), time-major (n*B, in): above layer 0 the kept
 * outputs of the layer below; for layer 0 the caller's x gathered into xblk. */
static mb_result mb__lstm_block_input(mb_lstm *l, int li, int64_t a, int64_t n, const void **rows) {
    int64_t B = l->B, F = l->F;
    if (li) { *rows = mb__lstm_el(l, mb__lstm_in_op(l, li), a * B * l->H); return MB_OK; }
    void *dst = l->op == MB_F32 ? (void *)l->xblk : l->x_lp;
    *rows = dst;
    return mb__lstm_copy_strided(l, dst, l->op, F, B * F, l->x + a * F, l->xs, F, B, n, F);
}

/* Layer k's weights as gemm operands: the f32 parameters w, or their low-precision copies. */
static void mb__lstm_w_ops(const mb_lstm *l, int li, float *const *w, const void **wih, const void **whh) {
    const mb__lstm_layer *y = &l->layer[li];
    *wih = l->op == MB_F32 ? (const void *)w[MB__LSTM_WIH] : y->wih_lp;
    *whh = l->op == MB_F32 ? (const void *)w[MB__LSTM_WHH] : y->whh_lp;
}

/* First step of the block holding step t (blocks of G steps from t = 0). */
static int64_t mb__lstm_block0(const mb_lstm *l, int64_t t) { return t - t % l->G; }

// -- the per-step path: any backend's recurrence on its gemm and elementwise operations --

/* Steps [s0, s1) of layer li. Gates g (rows from a0 = block start of s0, B, 4H), cells c
 * (s1-s0+1, B, H) with slot 0 holding c_{s0}. The input projection runs one gemm per
 * whole block of G steps, so the forward and a recompute make the very same gemm calls
 * (same shapes, same rows) whatever the segment: bitwise identical gates. h goes to hs
 * (forward) or to a scratch row (recompute: the same bits as kept). */
static mb_result mb__lstm_segment(mb_lstm *l, int li, int64_t s0, int64_t s1, float *g, float *c, int keep_h) {
    int64_t B = l->B, H = l->H, in = l->layer[li].in, a0 = mb__lstm_block0(l, s0);
    float *w[4] = {0};
    const void *wih, *whh, *x, *hop = mb__lstm_hs_op(l, li);
    float *hs = l->layer[li].hs;
    MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_forward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    for (int64_t a = a0; a < s1; a += l->G) {
        int64_t n = a + l->G < l->T ? l->G : l->T - a;
        MB_TRY(mb__lstm_block_input(l, li, a, n, &x));
        MB_TRY(mb__lstm_gemm(l, l->op, 0, 1, n * B, 4 * H, in, x, in, wih, in, 0.0f, g + (a - a0) * B * 4 * H, 4 * H));
    }
    for (int64_t t = s0; t < s1; t++) {
        float *gt = g + (t - a0) * B * 4 * H, *ct = c + (t - s0) * B * H;
        MB_TRY(mb__lstm_gemm(l, l->op, 0, 1, B, 4 * H, H, mb__lstm_el(l, hop, t * B * H), H, whh, H, 1.0f, gt, 4 * H));
        float *h = keep_h ? hs + (t + 1) * B * H : l->hscr;
        MB_TRY(mb__lstm_fwd_gates(l, B, gt, w[MB__LSTM_BIH], w[MB__LSTM_BHH], ct, ct + B * H, h));
        if (keep_h) MB_TRY(mb__lstm_round(l, (void *)mb__lstm_el(l, hop, (t + 1) * B * H), h, (size_t)(B * H)));
    }
    return MB_OK;
}

/* Layer li forward on the per-step path, as the checkpoint plan goes: all T steps in one
 * segment with full storage, else segments of `interval` steps keeping the cell state at each
 * segment start (the CPU recurrence's items, mb__cpu_lstm_fwd_item, follow the same plan). */
static mb_result mb__lstm_steps_forward(mb_lstm *l, int li) {
    mb__lstm_layer *y = &l->layer[li];
    size_t bh = (size_t)(l->B * l->H);
    if (!l->interval) return mb__lstm_segment(l, li, 0, l->T, y->gates, y->cs, 1);
    for (int64_t s = 0, s0 = 0; s0 < l->T; s++, s0 += l->interval) {
        int64_t s1 = s0 + l->interval < l->T ? s0 + l->interval : l->T;
        MB_TRY(mb__lstm_copy(l, l->seg_c, y->cs + s * bh, bh));
        MB_TRY(mb__lstm_segment(l, li, s0, s1, l->seg_g, l->seg_c, 1));
        MB_TRY(mb__lstm_copy(l, y->cs + (s + 1) * bh, l->seg_c + (s1 - s0) * bh, bh));
    }
    return MB_OK;
}

/* c_T of layer k after its forward. */
static float *mb__lstm_c_last(mb_lstm *l, int li) {
    size_t bh = (size_t)(l->B * l->H);
    return l->layer[li].cs + (size_t)(l->interval ? (l->T + l->interval - 1) / l->interval : l->T) * bh;
}

static mb_result mb__lstm_check_shape(mb_lstm *l, const float *x, int64_t B, int64_t T) {
    const mb_logger *lg = mb__lstm_log(l);
    if (!x) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_forward: x is NULL");
    if (B < 1 || T < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_forward: B=%lld and T=%lld must be >= 1", (long long)B,
                       (long long)T);
    if (B > l->maxB || T > l->maxT)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_lstm_forward: B=%lld T=%lld exceed max_batch=%lld max_steps=%lld "
                       "of the workspace", (long long)B, (long long)T, (long long)l->maxB, (long long)l->maxT);
    return MB_OK;
}

/* Initial states into slot 0 of hs and cs: given, carried, or zero. */
static mb_result mb__lstm_init_state(mb_lstm *l, int64_t B, const float *h0, const float *c0) {
    int carry = l->cfg.carry_state && l->have_state;
    if (carry && (!h0 || !c0) && l->B != B)
        return MB_FAIL(mb__lstm_log(l), MB_ERR_INVALID_ARG, "mb_lstm_forward: carried state has batch %lld, "
                       "this batch has B=%lld (mb_lstm_reset_state first)", (long long)l->B, (long long)B);
    mb_device *d = l->dev;
    int s = l->cfg.stream;
    size_t bh = (size_t)(B * l->H), bytes = bh * sizeof(float);
    const float *hsrc = h0 ? h0 : carry ? l->hn : NULL, *csrc = c0 ? c0 : carry ? l->cn : NULL;
    for (int li = 0; li < l->L; li++) { /* the backend's copy and zero, straight: the LSTM's own buffers */
        float *hs = l->layer[li].hs, *cs = l->layer[li].cs;
        MB_TRY(hsrc ? d->be->rt->copy(d, s, hs, hsrc + li * bh, bytes) : d->be->rt->zero(d, s, hs, bytes));
        MB_TRY(csrc ? d->be->rt->copy(d, s, cs, csrc + li * bh, bytes) : d->be->rt->zero(d, s, cs, bytes));
    }
    return MB_OK;
}

/* Low precision: the operand copies of every layer's weights (from the f32 master
 * weights, so after each optimizer step) and of h0. */
static mb_result mb__lstm_refresh(mb_lstm *l, int64_t B) {
    if (l->op == MB_F32) return MB_OK;
    for (int li = 0; li < l->L; li++) {
        mb__lstm_layer *y = &l->layer[li];
        float *w[4] = {0};
        MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_forward"));
        MB_TRY(mb__lstm_round(l, y->wih_lp, w[MB__LSTM_WIH], (size_t)(4 * l->H * y->in)));
        MB_TRY(mb__lstm_round(l, y->whh_lp, w[MB__LSTM_WHH], (size_t)(4 * l->H * l->H)));
        MB_TRY(mb__lstm_round(l, y->hs_lp, y->hs, (size_t)(B * l->H)));
    }
    return MB_OK;
}

/* The forward with x's rows xs floats apart (xs >= T*F): begin, every layer, end. */
static mb_result mb__lstm_forward_begin(mb_lstm *l, const float *x, int64_t xs, int64_t B, int64_t T,
                                        const float *h0, const float *c0) {
    if (!l) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_forward: NULL lstm");
    MB_TRY(mb__lstm_check_shape(l, x, B, T));
    if (xs < T * l->F)
        return MB_FAIL(mb__lstm_log(l), MB_ERR_INVALID_ARG, "mb_lstm_forward: x_stride=%lld is less than T*F=%lld",
                       (long long)xs, (long long)(T * l->F));
    float *w[4] = {0};
    MB_TRY(mb__lstm_weights(l, 0, w, 0, "mb_lstm_forward"));
    MB_TRY(mb__lstm_init_state(l, B, h0, c0));
    MB_TRY(mb__lstm_refresh(l, B));
    l->have_fwd = 0;
    l->B = B; l->T = T; l->interval = mb__lstm_interval(&l->cfg, T);
    l->x = x; l->xs = xs;
    l->seg_kept = -1;
    l->drop = l->cfg.dropout > 0.0f && l->training && l->L > 1;
    return MB_OK;
}

static mb_result mb__lstm_forward_end(mb_lstm *l, float *out_seq, float *h_last) {
    int64_t B = l->B, T = l->T;
    l->seg_kept = l->interval ? l->L - 1 : -1;
    size_t bh = (size_t)(B * l->H);
    for (int li = 0; li < l->L; li++) {
        MB_TRY(mb__lstm_copy(l, l->hn + li * bh, l->layer[li].hs + T * bh, bh));
        MB_TRY(mb__lstm_copy(l, l->cn + li * bh, mb__lstm_c_last(l, li), bh));
    }
    const float *top = l->layer[l->L - 1].hs;
    if (out_seq)
        MB_TRY(mb__lstm_copy_strided(l, out_seq, MB_F32, l->H, T * l->H, top + bh, (int64_t)bh, l->H, T, B, l->H));
    if (h_last) MB_TRY(mb__lstm_copy(l, h_last, top + T * bh, bh));
    l->have_fwd = 1;
    l->have_state = 1;
    return MB_OK;
}

static mb_result mb__lstm_forward(mb_lstm *l, const float *x, int64_t xs, int64_t B, int64_t T, const float *h0,
                                  const float *c0, float *out_seq, float *h_last) {
    MB_TRY(mb__lstm_forward_begin(l, x, xs, B, T, h0, c0));
    for (int li = 0; li < l->L; li++) {
        MB_TRY(l->dev->be->lstm->layer_forward(l, li));
        MB_TRY(mb__lstm_drop_forward(l, li));
    }
    return mb__lstm_forward_end(l, out_seq, h_last);
}

MBDEF mb_result mb_lstm_forward(mb_lstm *l, const float *x, int64_t B, int64_t T, const float *h0,
                                const float *c0, float *out_seq, float *h_last) {
    mb__fpenv e = mb__fp_enter(l ? l->dev : NULL);
    mb_result r = mb__lstm_forward(l, x, l ? T * l->F : 0, B, T, h0, c0, out_seq, h_last);
    mb__fp_leave(e);
    return r;
}

MBDEF mb_result mb_lstm_final_state(mb_lstm *l, float *h_n, float *c_n) {
    if (!l) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_final_state: NULL lstm");
    if (!l->have_state) return MB_FAIL(mb__lstm_log(l), MB_ERR_STATE, "mb_lstm_final_state: no forward yet");
    size_t n = (size_t)(l->L * l->B * l->H);
    if (h_n) MB_TRY(mb__lstm_copy(l, h_n, l->hn, n));
    if (c_n) MB_TRY(mb__lstm_copy(l, c_n, l->cn, n));
    return MB_OK;
}

// -- backward --

/* Weight, bias and input gradients of the block of steps [t0, t0+nb) whose gate
 * gradients are in gblk. d_in (NULL: not needed) receives steps t0..: for layer 0 the
 * caller's dx (B, T, F) through xblk, above it the time-major (T, B, H) buffer. */
static mb_result mb__lstm_flush_block(mb_lstm *l, int li, int64_t t0, int64_t nb, float *d_in) {
    int64_t B = l->B, H = l->H, in = l->layer[li].in, rows = nb * B;
    float *w[4] = {0}, *dw[4] = {0};
    const void *wih, *whh, *x, *hp = mb__lstm_el(l, mb__lstm_hs_op(l, li), t0 * B * H);
    const void *gb = l->op == MB_F32 ? (const void *)l->gblk : l->g_lp; /* rounded step by step */
    MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_backward"));
    MB_TRY(mb__lstm_weights(l, li, dw, 1, "mb_lstm_backward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    MB_TRY(mb__lstm_block_input(l, li, t0, nb, &x));
    MB_TRY(mb__lstm_gemm(l, l->op, 1, 0, 4 * H, in, rows, gb, 4 * H, x, in, 1.0f, dw[MB__LSTM_WIH], in));
    MB_TRY(mb__lstm_gemm(l, l->op, 1, 0, 4 * H, H, rows, gb, 4 * H, hp, H, 1.0f, dw[MB__LSTM_WHH], H));
    for (int i = MB__LSTM_BIH; i <= MB__LSTM_BHH; i++) /* bias gradients: sums of f32 gate gradients */
        MB_TRY(mb__lstm_gemm(l, MB_F32, 0, 0, 1, 4 * H, rows, l->ones, rows, l->gblk, 4 * H, 1.0f, dw[i], 4 * H));
    if (!d_in) return MB_OK;
    float *dst = li ? d_in + t0 * B * in : l->xblk; /* xblk is free again: the dW_ih gemm read it */
    MB_TRY(mb__lstm_gemm(l, l->op, 0, 0, rows, in, 4 * H, gb, 4 * H, wih, in, 0.0f, dst, in));
    if (li) return MB_OK;
    return mb__lstm_copy_strided(l, d_in + t0 * in, MB_F32, l->xs, in, l->xblk, in, B * in, B, nb, in);
}

/* Steps [s0, s1) of layer k backwards, given their gates g (rows from the block start of
 * s0) and cells c (slot 0 = c_{s0}).
 * dout (T, B, H): gradient w.r.t. the layer's outputs. */
static mb_result mb__lstm_segment_backward(mb_lstm *l, int li, int64_t s0, int64_t s1, const float *g,
                                           const float *c, const float *dout, float *d_in) {
    int64_t B = l->B, H = l->H, bh = B * H;
    float *w[4] = {0};
    const void *wih, *whh;
    MB_TRY(mb__lstm_weights(l, li, w, 0, "mb_lstm_backward"));
    mb__lstm_w_ops(l, li, w, &wih, &whh);
    (void)wih;
    int64_t a0 = mb__lstm_block0(l, s0);
    for (int64_t t = s1 - 1; t >= s0; t--) {
        int64_t t0 = mb__lstm_block0(l, t), nb = t0 + l->G < l->T ? l->G : l->T - t0;
        float *dg = l->gblk + (t - t0) * B * 4 * H;
        const void *dgop = l->op == MB_F32 ? (const void *)dg : mb__lstm_el(l, l->g_lp, (t - t0) * B * 4 * H);
        const float *ct = c + (t - s0) * bh;
        MB_TRY(mb__lstm_bwd_gates(l, B, g + (t - a0) * B * 4 * H, ct, ct + bh, l->dh, dout + t * bh, l->dc, dg));
        MB_TRY(mb__lstm_round(l, (void *)dgop, dg, (size_t)(B * 4 * H)));
        MB_TRY(mb__lstm_gemm(l, l->op, 0, 0, B, H, 4 * H, dgop, 4 * H, whh, H, 0.0f, l->dh, H));
        if (t == t0) MB_TRY(mb__lstm_flush_block(l, li, t0, nb, d_in));
    }
    return MB_OK;
}

/* Layer li backward on the per-step path, as the checkpoint plan goes: its segments from the
 * last, each recomputed from its kept cell state (but the forward's last, still in seg_g /
 * seg_c), then back through (mb__cpu_lstm_bwd_item follows the same plan). */
static mb_result mb__lstm_steps_backward(mb_lstm *l, int li, const float *dout, float *d_in) {
    mb__lstm_layer *y = &l->layer[li];
    size_t bh = (size_t)(l->B * l->H);
    MB_TRY(mb__lstm_zero(l, l->dh, bh));
    MB_TRY(mb__lstm_zero(l, l->dc, bh));
    if (!l->interval) return mb__lstm_segment_backward(l, li, 0, l->T, y->gates, y->cs, dout, d_in);
    int64_t nseg = (l->T + l->interval - 1) / l->interval;
    int kept = l->seg_kept == li; /* the forward's last segment is still in seg_g / seg_c */
    l->seg_kept = -1;            /* overwritten below */
    for (int64_t s = nseg - 1; s >= 0; s--) {
        int64_t s0 = s * l->interval, s1 = s0 + l->interval < l->T ? s0 + l->interval : l->T;
        if (!(kept && s == nseg - 1)) {
            MB_TRY(mb__lstm_copy(l, l->seg_c, y->cs + s * bh, bh));
            MB_TRY(mb__lstm_segment(l, li, s0, s1, l->seg_g, l->seg_c, 0));
        }
        MB_TRY(mb__lstm_segment_backward(l, li, s0, s1, l->seg_g, l->seg_c, dout, d_in));
    }
    return MB_OK;
}

/* The gradient w.r.t. layer k's outputs: dA for the top layer, then dB, dA, ... */
static float *mb__lstm_dout(const mb_lstm *l, int li) { return (l->L - 1 - li) % 2 ? l->dB : l->dA; }

/* The top layer's output gradients from dout_seq and dh_last. */
static mb_result mb__lstm_backward_begin(mb_lstm *l, const float *dh_last, const float *dout_seq) {
    if (!l->have_fwd) return MB_FAIL(mb__lstm_log(l), MB_ERR_STATE, "mb_lstm_backward: called before mb_lstm_forward");
    int64_t B = l->B, T = l->T, H = l->H;
    size_t bh = (size_t)(B * H);
    float *dout = mb__lstm_dout(l, l->L - 1);
    if (dout_seq) MB_TRY(mb__lstm_copy_strided(l, dout, MB_F32, H, B * H, dout_seq, T * H, H, B, T, H));
    else MB_TRY(mb__lstm_zero(l, dout, (size_t)T * bh));
    if (dh_last) MB_TRY(mb__lstm_add(l, dout + (T - 1) * bh, dh_last, bh));
    return MB_OK;
}

/* After layer k's backward: its dh0, dc0. */
static mb_result mb__lstm_backward_tail(mb_lstm *l, int li, float *dh0, float *dc0) {
    size_t bh = (size_t)(l->B * l->H);
    if (dh0) MB_TRY(mb__lstm_copy(l, dh0 + li * bh, l->dh, bh));
    if (dc0) MB_TRY(mb__lstm_copy(l, dc0 + li * bh, l->dc, bh));
    return MB_OK;
}

static mb_result mb__lstm_backward(mb_lstm *l, const float *dh_last, const float *dout_seq, float *dx, float *dh0,
                                   float *dc0) {
    MB_TRY(mb__lstm_backward_begin(l, dh_last, dout_seq));
    for (int li = l->L - 1; li >= 0; li--) {
        MB_TRY(l->dev->be->lstm->layer_backward(l, li, mb__lstm_dout(l, li), li ? mb__lstm_dout(l, li - 1) : dx));
        MB_TRY(mb__lstm_drop_backward(l, li));
        MB_TRY(mb__lstm_backward_tail(l, li, dh0, dc0));
    }
    return MB_OK;
}

MBDEF mb_result mb_lstm_backward(mb_lstm *l, const float *dh_last, const float *dout_seq, float *dx, float *dh0,
                                 float *dc0) {
    if (!l) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lstm_backward: NULL lstm");
    mb__fpenv e = mb__fp_enter(l->dev);
    mb_result r = mb__lstm_backward(l, dh_last, dout_seq, dx, dh0, dc0);
    mb__fp_leave(e);
    return r;
}

// -- many LSTMs at once --
/* mb_lstm_*_many: the calls checked, their streams after the compute stream, the backend's
 * many operation in the device's denormal mode, then the compute stream after theirs. */

enum { MB__LSTM_MANY_MAX = 64 }; /* calls per mb_lstm_*_many */

static mb_result mb__lstm_many_begin(mb_lstm_call *calls, int n, const char *what, mb__fpenv *fe) {
    if (n < 0 || n > MB__LSTM_MANY_MAX || (n > 0 && !calls))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: n=%d (0..%d) calls=%p", what, n, MB__LSTM_MANY_MAX, (void *)calls);
    for (int i = 0; i < n; i++) {
        if (!calls[i].lstm) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: calls[%d].lstm is NULL", what, i);
        for (int j = 0; j < i; j++)
            if (calls[j].lstm == calls[i].lstm || calls[j].lstm->dev != calls[i].lstm->dev)
                return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: calls[%d] and calls[%d] %s", what, j, i,
                               calls[j].lstm == calls[i].lstm ? "are the same LSTM" : "are on different devices");
    }
    mb_device *dev = n ? calls[0].lstm->dev : NULL;
    for (int i = 0; i < n; i++) MB_TRY(mb_stream_wait(dev, calls[i].lstm->cfg.stream, MB_STREAM_COMPUTE));
    *fe = mb__fp_enter(dev);
    return MB_OK;
}

static mb_result mb__lstm_many_end(mb_lstm_call *calls, int n, mb__fpenv fe, mb_result r) {
    mb__fp_leave(fe);
    for (int i = 0; i < n; i++) {
        mb_result w = mb_stream_wait(calls[0].lstm->dev, MB_STREAM_COMPUTE, calls[i].lstm->cfg.stream);
        if (r == MB_OK) r = w;
    }
    return r;
}

MBDEF mb_result mb_lstm_forward_many(mb_lstm_call *calls, int n) {
    mb__fpenv fe;
    MB_TRY(mb__lstm_many_begin(calls, n, "mb_lstm_forward_many", &fe));
    return mb__lstm_many_end(calls, n, fe, n ? calls[0].lstm->dev->be->lstm->many(calls, n, 0) : MB_OK);
}

MBDEF mb_result mb_lstm_backward_many(mb_lstm_call *calls, int n) {
    mb__fpenv fe;
    MB_TRY(mb__lstm_many_begin(calls, n, "mb_lstm_backward_many", &fe));
    return mb__lstm_many_end(calls, n, fe, n ? calls[0].lstm->dev->be->lstm->many(calls, n, 1) : MB_OK);
}

static double mb__lstm_work(const mb_lstm_call *c) {
    const mb_lstm *l = c->lstm;
    return (double)c->B * (double)c->T * (double)l->L * (double)l->H * (double)(l->F + l->H);
}

/* A call's x row stride: x_stride, or T*F (dense rows) when that is 0. */
static int64_t mb__lstm_call_xs(const mb_lstm_call *c) { return c->x_stride ? c->x_stride : c->T * c->lstm->F; }

/* order: the calls' indices by decreasing work (stable: ties keep their order). */
static void mb__lstm_order(const mb_lstm_call *calls, int n, int *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && mb__lstm_work(&calls[order[j]]) > mb__lstm_work(&calls[order[j - 1]]); j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
}


// -- the CPU's lstm group --
/* The CPU backend's recurrence, the elementwise operations of its per-step path, and its
 * instance of the group. In f32 a layer runs on the CPU recurrence (below: the row kernels
 * inside the row-independent product, the weight gradients on BLAS); in bf16/f16 on the
 * per-step path (mb__lstm_steps_forward / _backward), whose gemms BLAS rounds. */

/* The CPU's state for one LSTM (l->be_lstm). */
typedef struct mb__cpu_lstm {
    const struct mb__rk *rk; /* the CPU recurrence's kernel (f32: the device's; NULL: the per-step path) */
    float *wpf, *wpb, *wpi;  /* packed: [W_ih W_hh] for z, W_hh for dh, W_ih for d_in */
    int packed;              /* wpf holds layer packed - 1 (0: none), packed under ... */
    unsigned packed_at;      /* ... the mb_lstm_freeze call l->freezes counted then */
    float *dbs;              /* (4H) a block's bias gradient */
    float *wgx, *wgs;        /* (G*B, in+H) a block's [x h] rows, (4H, in+H) their weight gradient */
} mb__cpu_lstm;

static mb__cpu_lstm *mb__cpu_lstm_of(const mb_lstm *l) { return (mb__cpu_lstm *)l->be_lstm; }

/* One row of cells on the CPU. The rows' arrays never overlap (restrict), so the compiler
 * vectorizes the loop (kept out of line, where GCC 12 does). */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define MB__NOINLINE __attribute__((noinline))
#else
#define MB__NOINLINE
#endif
/* The row functions are compiled three times on x86 with GCC or Clang: for the baseline
 * (SSE2, 4 lanes), for AVX2 + FMA (8 lanes; the default build targets plain x86-64) and for
 * AVX-512 (16 lanes); the device's kernel variant picks one (mb__cpu_ctx.kernel). With
 * contraction off in all (ISO C's default, forced there), the three compute the same
 * operations, mb__fexp's explicit fmaf included, so the same bits (tested, with GCC and
 * Clang; tests/compile/vectorized.sh checks that the wide ones vectorize). */
typedef void (*mb__lstm_fwd_row_fn)(int64_t, float *MB__RESTRICT, const float *MB__RESTRICT,
                                    const float *MB__RESTRICT, const float *MB__RESTRICT, float *MB__RESTRICT,
                                    float *MB__RESTRICT);
typedef void (*mb__lstm_bwd_row_fn)(int64_t, const float *MB__RESTRICT, const float *MB__RESTRICT,
                                    const float *MB__RESTRICT, const float *MB__RESTRICT, const float *MB__RESTRICT,
                                    float *MB__RESTRICT, float *MB__RESTRICT);
#define MB__LSTM_ROWS(SUFFIX, ATTR)                                                                                \
    ATTR static MB__NOINLINE void mb__lstm_fwd_row##SUFFIX(int64_t H, float *MB__RESTRICT g4,                    \
        const float *MB__RESTRICT b_ih, const float *MB__RESTRICT b_hh, const float *MB__RESTRICT c_prev,        \
        float *MB__RESTRICT c, float *MB__RESTRICT h) { /* h NULL: not needed (a recompute) */               \
        if (h)                                                                                                   \
            for (int64_t j = 0; j < H; j++)                                                                      \
                mb__lstm_cell_fwd(g4, H, j, b_ih[j] + b_hh[j], b_ih[H + j] + b_hh[H + j],                        \
                                  b_ih[2 * H + j] + b_hh[2 * H + j], b_ih[3 * H + j] + b_hh[3 * H + j],          \
                                  c_prev[j], &c[j], &h[j]);                                                      \
        else                                                                                                     \
            for (int64_t j = 0; j < H; j++) {                                                                    \
                float unused; /* its tanh(c) is dead code: one exp in five saved */                              \
                mb__lstm_cell_fwd(g4, H, j, b_ih[j] + b_hh[j], b_ih[H + j] + b_hh[H + j],                        \
                                  b_ih[2 * H + j] + b_hh[2 * H + j], b_ih[3 * H + j] + b_hh[3 * H + j],          \
                                  c_prev[j], &c[j], &unused);                                                    \
            }                                                                                                    \
    }                                                                                                            \
    ATTR static MB__NOINLINE void mb__lstm_bwd_row##SUFFIX(int64_t H, const float *MB__RESTRICT a4,              \
        const float *MB__RESTRICT c_prev, const float *MB__RESTRICT c, const float *MB__RESTRICT dh_rec,         \
        const float *MB__RESTRICT dout, float *MB__RESTRICT dc, float *MB__RESTRICT d4) {                        \
        for (int64_t j = 0; j < H; j++) {                                                                        \
            float dcj = dc[j];                                                                                   \
            mb__lstm_cell_bwd(a4, H, j, c_prev[j], c[j], dh_rec[j] + dout[j], &dcj, d4);                         \
            dc[j] = dcj;                                                                                         \
        }                                                                                                        \
    }
/* No contraction in any: GCC's (its default outside ISO C modes) by attribute, Clang's by
 * MB__NO_CONTRACT in the cell's functions. GCC vectorizes them at any -O level (it does
 * not by itself below -O3: the rows ran 10x slower at -O2, measured); Clang does at -O2. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define MB__ROWS_GCC "fp-contract=off", "tree-loop-vectorize", "vect-cost-model=dynamic"
#define MB__ROWS_ATTR(t) __attribute__((target(t), optimize(MB__ROWS_GCC)))
#define MB__ROWS_BASE __attribute__((optimize(MB__ROWS_GCC)))
#else
#define MB__ROWS_ATTR(t) __attribute__((target(t)))
#define MB__ROWS_BASE
#endif
/* Every per-kernel loop of the CPU (these rows, the layers' activations and dropout) is one
 * macro M(SUFFIX, ATTR) compiled three times by MB__KERNEL_VARIANTS: NAME_base, NAME_avx2 and
 * NAME_avx512 (where the compiler cannot target x86, the last two are the portable code again),
 * and MB__KERNEL_OF picks the device's: mb__cpu_ctx.kernel 0 AVX-512, 1 AVX2+FMA, 2 portable
 * (the device checked at open that this CPU runs it). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__)
#define MB__KERNEL_VARIANTS(M) M(_base, MB__ROWS_BASE) M(_avx2, MB__ROWS_ATTR("avx2,fma")) M(_avx512, MB__ROWS_ATTR("avx512f"))
#else
#define MB__KERNEL_VARIANTS(M) M(_base, MB__ROWS_BASE) M(_avx2, MB__ROWS_BASE) M(_avx512, MB__ROWS_BASE)
#endif
#define MB__KERNEL_OF(dev, NAME) \
    (mb__cpu(dev)->kernel == 0 ? NAME##_avx512 : mb__cpu(dev)->kernel == 1 ? NAME##_avx2 : NAME##_base)
MB__KERNEL_VARIANTS(MB__LSTM_ROWS) /* mb__lstm_fwd_row_base, mb__lstm_bwd_row_base, ..._avx2, ..._avx512:
                                      the names a profiler, a debugger or tests/docs/call_depth.sh shows */

/* The row functions of the CPU device's kernel variant. */
static mb__lstm_fwd_row_fn mb__lstm_fwd_row_of(const mb_device *dev) { return MB__KERNEL_OF(dev, mb__lstm_fwd_row); }
static mb__lstm_bwd_row_fn mb__lstm_bwd_row_of(const mb_device *dev) { return MB__KERNEL_OF(dev, mb__lstm_bwd_row); }

static mb_result mb__cpu_lstm_fwd_gates(mb_device *dev, int stream, int64_t B, int64_t H, float *g,
                                        const float *b_ih, const float *b_hh, const float *c_prev, float *c, float *h,
                                        int need_h) {
    (void)stream;
    mb__lstm_fwd_row_fn row = mb__lstm_fwd_row_of(dev);
    for (int64_t b = 0; b < B; b++) row(H, g + b * 4 * H, b_ih, b_hh, c_prev + b * H, c + b * H, need_h ? h + b * H : NULL);
    return MB_OK;
}

static mb_result mb__cpu_lstm_bwd_gates(mb_device *dev, int stream, int64_t B, int64_t H, const float *a,
                                        const float *c_prev, const float *c, const float *dh_rec, const float *dout,
                                        float *dc, float *dg) {
    (void)stream;
    mb__lstm_bwd_row_fn row = mb__lstm_bwd_row_of(dev);
    for (int64_t b = 0; b < B; b++)
        row(H, a + b * 4 * H, c_prev + b * H, c + b * H, dh_rec + b * H, dout + b * H, dc + b * H,
                         dg + b * 4 * H);
    return MB_OK;
}

static mb_result mb__cpu_copy_strided(mb_device *dev, int stream, void *dst, mb_dtype dt, int64_t ds0, int64_t ds1,
                                      const float *src, int64_t ss0, int64_t ss1, int64_t n0, int64_t n1, int64_t d) {
    (void)dev; (void)stream;
    for (int64_t i = 0; i < n0; i++)
        for (int64_t j = 0; j < n1; j++) {
            const float *a = src + i * ss0 + j * ss1;
            size_t o = (size_t)(i * ds0 + j * ds1);
            if (dt == MB_F32) memcpy((float *)dst + o, a, (size_t)d * sizeof(float));
            else for (int64_t q = 0; q < d; q++) mb__store(dst, dt, o + (size_t)q, a[q]);
        }
    return MB_OK;
}

/* y += x; they never overlap (restrict: vectorized at -O2 too, without an alias check) */
static mb_result mb__cpu_add(mb_device *dev, int stream, float *MB__RESTRICT y, const float *MB__RESTRICT x, size_t n) {
    (void)dev; (void)stream;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
    return MB_OK;
}

static mb_result mb__cpu_fill(mb_device *dev, int stream, float *y, float v, size_t n) {
    (void)dev; (void)stream;
    for (size_t i = 0; i < n; i++) y[i] = v;
    return MB_OK;
}


// -- the CPU recurrence --
/* On the CPU in f32 (mb__cpu_lstm.rk, the device's kernel: gemm module, "the row-independent
 * product") a layer's steps run on our own product instead of BLAS calls. Its weights are
 * packed once per layer and call. Forward: for a chunk of rows, z = [x_t, h_{t-1}] [W_ih
 * W_hh]^T in one product (the input projection folded in: no pass of its own), then the
 * chunk's gate rows right after, while z is still in cache; one call covers the steps of a
 * block of G (x gathered for them), rows in time order, in chunks of at most B rows, so
 * the rows of step t-1 (their h) are done before a chunk of step t reads them. Backward,
 * a step at a time: a chunk's gate-gradient rows, then its dh = dg W_hh and d_in = dg
 * W_ih (written straight into dx for layer 0). A row's arithmetic never depends on the
 * chunk, the call or the thread it runs in: the recompute of a segment gives the
 * forward's bits, and so does every thread count. BLAS keeps the weight gradients (dg^T
 * [x h] over G*B rows, one gemm a block: mb__lstm_flush_block). Several threads (outside a pool job, a product of at least
 * MB__REC_SPLIT_FLOPS a step): each step's rows are split over the pool, one step after
 * the other. */
enum { MB__REC_CACHE = 131072, MB__REC_SPLIT_FLOPS = 1 << 24 }; /* bytes of a chunk's input rows; flops a step */

typedef struct mb__rec_job {
    mb_lstm *l;
    int64_t rows, n, r0, part;       /* the call's rows, n of them a go from r0 on, in parts of `part` rows */
    int parts;
    int64_t in;                      /* the layer's input width */
    const float *x, *a, *bih, *bhh;  /* forward: row r's input x + r in, its h_{t-1} a + r H */
    float *g, *c, *h;                /* g (rows, 4H); c (rows + B, H): row r's c_{t-1} at r, c_t at r + B; h or NULL */
    const float *ga, *cp, *ct, *dout; /* backward, one step: activated gates (B, 4H), c_{t-1}, c_t, dout (B, H) */
    float *dg, *din;                 /* backward: gate gradients (B, 4H); d_in rows ldin apart, or NULL */
    int64_t ldin;
} mb__rec_job;

/* Rows of a chunk: its product's input rows (width floats each) in about MB__REC_CACHE
 * bytes of L2 (the packed weights then stream once a chunk), a multiple of kernel k's rows,
 * at most B. */
static int64_t mb__rec_chunk(const mb__rk *kern, int64_t B, int64_t width) {
    int64_t mr = kern->mr, mc = MB__REC_CACHE / (4 * width) / mr * mr;
    if (mc < mr) mc = mr;
    return mc < B ? mc : B;
}

/* Whether each step's rows are split over the device's threads. */
static int mb__rec_split(const mb_lstm *l) {
    return mb__cpu(l->dev)->threads > 1 && mb__pool_free(l->dev) &&
           8.0 * (double)l->B * (double)l->H * (double)l->H >= (double)MB__REC_SPLIT_FLOPS;
}

/* A job's goes: all its rows at once on the caller's thread, or (mb__rec_split) a step's B
 * rows a go, in parts of whole kernel tiles over the threads. */
static void mb__rec_goes(mb__rec_job *j, int64_t rows) {
    int64_t B = j->l->B, mr = mb__cpu_lstm_of(j->l)->rk->mr, th = mb__cpu(j->l->dev)->threads;
    int split = mb__rec_split(j->l);
    j->rows = rows;
    j->n = split ? B : rows;
    j->part = split ? ((B + th - 1) / th + mr - 1) / mr * mr : rows;
    j->parts = (int)((j->n + j->part - 1) / j->part);
}

/* A pool item, forward: part i of the go's rows, a chunk at a time: the chunk's z = [x h]
 * [W_ih W_hh]^T (mb__rk_product), then its cells (the row function) while z is in cache. */
static void mb__rec_fwd_part(void *arg, int i) {
    const mb__rec_job *j = (const mb__rec_job *)arg;
    mb_lstm *l = j->l;
    const mb__cpu_lstm *st = mb__cpu_lstm_of(l);
    int64_t H = l->H, B = l->B, in = j->in, mc = mb__rec_chunk(st->rk, B, in + H);
    int64_t r0 = j->r0 + i * j->part, r1 = r0 + j->part < j->r0 + j->n ? r0 + j->part : j->r0 + j->n;
    mb__lstm_fwd_row_fn row = mb__lstm_fwd_row_of(l->dev);
    for (int64_t c0 = r0; c0 < r1; c0 += mc) {
        int64_t n = r1 - c0 < mc ? r1 - c0 : mc;
        mb__rk_a A = {j->x + c0 * in, j->a + c0 * H, in, H, in, H};
        mb__rk_product(st->rk, n, 4 * H, &A, st->wpf, j->g + c0 * 4 * H, 4 * H, 0);
        for (int64_t r = c0; r < c0 + n; r++)
            row(H, j->g + r * 4 * H, j->bih, j->bhh, j->c + r * H, j->c + (r + B) * H, j->h ? j->h + r * H : NULL);
    }
}

/* A pool item, backward (one step): part i of its rows, a chunk at a time: the chunk's gate
 * gradients (the row function), then dh = dg W_hh and d_in = dg W_ih (mb__rk_product). */
static void mb__rec_bwd_part(void *arg, int i) {
    const mb__rec_job *j = (const mb__rec_job *)arg;
    mb_lstm *l = j->l;
    const mb__cpu_lstm *st = mb__cpu_lstm_of(l);
    int64_t H = l->H, mc = mb__rec_chunk(st->rk, l->B, 4 * H);
    int64_t r0 = j->r0 + i * j->part, r1 = r0 + j->part < j->r0 + j->n ? r0 + j->part : j->r0 + j->n;
    mb__lstm_bwd_row_fn row = mb__lstm_bwd_row_of(l->dev);
    for (int64_t c0 = r0; c0 < r1; c0 += mc) {
        int64_t n = r1 - c0 < mc ? r1 - c0 : mc;
        for (int64_t r = c0; r < c0 + n; r++) /* reads dh (from step t+1) before the product overwrites it */
            row(H, j->ga + r * 4 * H, j->cp + r * H, j->ct + r * H, l->dh + r * H, j->dout + r * H, l->dc + r * H,
                j->dg + r * 4 * H);
        mb__rk_a A = mb__rk_a1(j->dg + c0 * 4 * H, 4 * H, 4 * H);
        mb__rk_product(st->rk, n, H, &A, st->wpb, l->dh + c0 * H, H, 0);
        if (j->din) mb__rk_product(st->rk, n, j->in, &A, st->wpi, j->din + c0 * j->ldin, j->ldin, 0);
    }
}

/* Layer k's weights packed: forward (also the backward's recompute, when checkpointing)
 * [W_ih W_hh] for z; backward W_hh for dh and W_ih for d_in. */
static mb_result mb__lstm_rec_pack(mb_lstm *l, int li, int backward) {
    mb__cpu_lstm *st = mb__cpu_lstm_of(l);
    float *w[4] = {0};
    int64_t H = l->H, in = l->layer[li].in, nr = st->rk->nr;
    if (!backward && l->frozen && st->packed == li + 1 && st->packed_at == l->freezes)
        return MB_OK; /* mb_lstm_freeze: packed already under this promise */
    MB_TRY(mb__lstm_weights(l, li, w, 0, backward ? "mb_lstm_backward" : "mb_lstm_forward"));
    if (!backward || l->interval) {
        mb__rk_pack((int)nr, 4 * H, in, w[MB__LSTM_WIH], 1, in + H, 0, st->wpf);
        mb__rk_pack((int)nr, 4 * H, H, w[MB__LSTM_WHH], 1, in + H, in, st->wpf);
        st->packed = li + 1;
        st->packed_at = l->freezes;
    }
    if (backward) {
        mb__rk_pack((int)nr, H, 4 * H, w[MB__LSTM_WHH], 0, 4 * H, 0, st->wpb);
        mb__rk_pack((int)nr, in, 4 * H, w[MB__LSTM_WIH], 0, 4 * H, 0, st->wpi);
    }
    return MB_OK;
}


/* mb__cpu_lstm_many's job: item i is calls[order[i]]'s layer at layer step k, on the CPU
 * recurrence (f32) or the per-step path (bf16/f16). */
typedef struct mb__cpu_many {
    mb_lstm_call *calls;
    int n, k;                          /* the calls; the step: layer k from the bottom, or from the top */
    int order[MB__LSTM_MANY_MAX];      /* the calls by decreasing work */
    mb_result res[MB__LSTM_MANY_MAX];  /* each call's result so far (a failed call stops) */
    int failed;                        /* the first failing call, in calls' order (n: none) */
    char failed_msg[MB_MAX_ERROR];     /* its mb_last_error(), taken on its thread */
} mb__cpu_many;

/* Call c's result r, kept (and the first failing call's message, taken on this thread). */
static void mb__cpu_many_done(mb__cpu_many *m, int c, mb_result r) {
    if (r == MB_OK) return;
    mb__pool_lock(m->calls[c].lstm->dev, 1);
    m->res[c] = r;
    if (c < m->failed) {
        m->failed = c;
        snprintf(m->failed_msg, sizeof m->failed_msg, "%s", mb_last_error());
    }
    mb__pool_lock(m->calls[c].lstm->dev, 0);
}

/* The job of the steps [u0, u1) of layer li that the block of G from a has in [s0, s1): their
 * input rows gathered (layer 0: from x, time-major, into xblk), g their gate rows (g: from
 * s0's block start), c the cells with slot 0 = c_{s0}, h where h_{u0+1}.. go (keep_h 0: a
 * recompute, not kept), w the layer's weights; in goes of mb__rec_goes. */
static mb__rec_job mb__cpu_lstm_block(mb_lstm *l, int li, int64_t a, int64_t s0, int64_t s1, float *g, float *c,
                                      int keep_h, float *const *w) {
    int64_t B = l->B, H = l->H, F = l->F, u0 = a > s0 ? a : s0, u1 = a + l->G < s1 ? a + l->G : s1;
    float *hs = l->layer[li].hs;
    mb__rec_job j;
    memset(&j, 0, sizeof j);
    j.l = l; j.in = l->layer[li].in;
    j.x = li ? (const float *)mb__lstm_in_op(l, li) + u0 * B * H : l->xblk;
    if (!li) mb__cpu_copy_strided(l->dev, 0, l->xblk, MB_F32, F, B * F, l->x + u0 * F, l->xs, F, B, u1 - u0, F);
    j.a = hs + u0 * B * H; j.bih = w[MB__LSTM_BIH]; j.bhh = w[MB__LSTM_BHH];
    j.g = g + (u0 - mb__lstm_block0(l, s0)) * B * 4 * H; j.c = c + (u0 - s0) * B * H;
    j.h = keep_h ? hs + (u0 + 1) * B * H : NULL;
    mb__rec_goes(&j, (u1 - u0) * B);
    return j;
}

/* The job of step t of layer li backward (a go of B rows): dg from the activated gates g
 * (rows from s0's block start), c_{t-1} and c_t (c: slot 0 = c_{s0}), dh (l->dh) + dout and dc
 * (l->dc, updated); then l->dh = dg W_hh and d_in's rows (ldin apart; layer 0: dx) = dg W_ih. */
static mb__rec_job mb__cpu_lstm_step(mb_lstm *l, int li, int64_t s0, int64_t t, const float *g, const float *c,
                                     const float *dout, float *d_in) {
    int64_t B = l->B, H = l->H, bh = B * H;
    mb__rec_job j;
    memset(&j, 0, sizeof j);
    j.l = l; j.in = l->layer[li].in;
    j.ga = g + (t - mb__lstm_block0(l, s0)) * B * 4 * H; j.cp = c + (t - s0) * bh; j.ct = j.cp + bh;
    j.dout = dout + t * bh; j.dg = l->gblk + (t - mb__lstm_block0(l, t)) * B * 4 * H;
    j.din = !d_in ? NULL : li ? d_in + t * bh : d_in + t * l->F; j.ldin = li ? H : l->xs;
    mb__rec_goes(&j, B);
    return j;
}

/* The weight and bias gradients of the block of steps [t0, t0+nb) whose gate gradients are in
 * gblk (the CPU recurrence wrote d_in already): dW_ih and dW_hh as one gemm over [x h] rows
 * (gathered into wgx) into wgs, then added, so BLAS packs the gate gradients once, not twice
 * (perf at H=64: that packing took 9.5% of a step, the products 10.9%); then the bias
 * gradient summed once, rows in order (the block fixes the bits). */
static mb_result mb__cpu_lstm_flush_block(mb_lstm *l, int li, int64_t t0, int64_t nb) {
    mb__cpu_lstm *st = mb__cpu_lstm_of(l);
    int64_t B = l->B, H = l->H, F = l->F, in = l->layer[li].in, rows = nb * B, wd = in + H;
    float *dw[4] = {0};
    MB_TRY(mb__lstm_weights(l, li, dw, 1, "mb_lstm_backward"));
    if (li)
        mb__cpu_copy_strided(l->dev, 0, st->wgx, MB_F32, 0, wd, (const float *)mb__lstm_in_op(l, li) + t0 * B * H, 0,
                             in, 1, rows, in);
    else mb__cpu_copy_strided(l->dev, 0, st->wgx, MB_F32, wd, B * wd, l->x + t0 * F, l->xs, F, B, nb, F);
    mb__cpu_copy_strided(l->dev, 0, st->wgx + in, MB_F32, 0, wd, l->layer[li].hs + t0 * B * H, 0, H, 1, rows, H);
    mb__gemm_job gj = mb__gemm_job_of(1, 0, 4 * H, wd, rows, 1.0f, l->gblk, 4 * H, st->wgx, wd, 0.0f, st->wgs, wd);
    MB__POOL_FOR(l->dev, mb__cpu(l->dev)->threads - 1, mb__gemm_parts(&gj), mb__gemm_part, &gj);
    for (int64_t m = 0; m < 4 * H; m++) {
        mb__cpu_add(l->dev, 0, dw[MB__LSTM_WIH] + m * in, st->wgs + m * wd, (size_t)in);
        mb__cpu_add(l->dev, 0, dw[MB__LSTM_WHH] + m * H, st->wgs + m * wd + in, (size_t)H);
    }
    memset(st->dbs, 0, (size_t)(4 * H) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) mb__cpu_add(l->dev, 0, st->dbs, l->gblk + r * 4 * H, (size_t)(4 * H));
    for (int i = MB__LSTM_BIH; i <= MB__LSTM_BHH; i++) mb__cpu_add(l->dev, 0, dw[i], st->dbs, (size_t)(4 * H));
    return MB_OK;
}

/* An item, forward: layer k of the call, its weights packed, then its steps a segment of the
 * checkpoint plan at a time (one with full storage; else each from the cell state kept at
 * its start, keeping the one at its end), a segment a block of G steps at a time, a block a
 * go of rows at a time (mb__rec_fwd_part's parts). */
static void mb__cpu_lstm_fwd_item(void *arg, int i) {
    mb__cpu_many *m = (mb__cpu_many *)arg;
    int ci = m->order[i], li = m->k;
    mb_lstm *l = m->calls[ci].lstm;
    if (li >= l->L || m->res[ci] != MB_OK) return;
    if (!mb__cpu_lstm_of(l)->rk) { mb__cpu_many_done(m, ci, mb__lstm_steps_forward(l, li)); return; }
    mb__lstm_layer *y = &l->layer[li];
    int64_t iv = l->interval ? l->interval : l->T;
    size_t bh = (size_t)(l->B * l->H);
    float *w[4] = {0}, *g = l->interval ? l->seg_g : y->gates, *c = l->interval ? l->seg_c : y->cs;
    mb_result r = mb__lstm_weights(l, li, w, 0, "mb_lstm_forward");
    if (r == MB_OK) r = mb__lstm_rec_pack(l, li, 0);
    for (int64_t s = 0, s0 = 0; r == MB_OK && s0 < l->T; s++, s0 += iv) {
        int64_t s1 = s0 + iv < l->T ? s0 + iv : l->T;
        if (l->interval) memcpy(c, y->cs + s * bh, bh * sizeof(float));
        for (int64_t a = mb__lstm_block0(l, s0); a < s1; a += l->G) {
            mb__rec_job j = mb__cpu_lstm_block(l, li, a, s0, s1, g, c, 1, w);
            for (j.r0 = 0; j.r0 < j.rows; j.r0 += j.n) MB__POOL_FOR(l->dev, j.parts - 1, j.parts, mb__rec_fwd_part, &j);
        }
        if (l->interval) memcpy(y->cs + (s + 1) * bh, c + (s1 - s0) * bh, bh * sizeof(float));
    }
    mb__cpu_many_done(m, ci, r);
}

/* An item, backward: layer L-1-k of the call, its weights packed, dh and dc zeroed, then its
 * segments from the last: each recomputed (as the forward, h not kept) from its kept cell
 * state, but the forward's last (still in seg_g / seg_c), then its steps from the last, a go
 * at a time (mb__rec_bwd_part's parts), a block's weight gradients at its first step. */
static void mb__cpu_lstm_bwd_item(void *arg, int i) {
    mb__cpu_many *m = (mb__cpu_many *)arg;
    int ci = m->order[i];
    mb_lstm *l = m->calls[ci].lstm;
    int li = l->L - 1 - m->k;
    if (li < 0 || m->res[ci] != MB_OK) return;
    float *dout = mb__lstm_dout(l, li), *d_in = li ? mb__lstm_dout(l, li - 1) : m->calls[ci].dx;
    if (!mb__cpu_lstm_of(l)->rk) { mb__cpu_many_done(m, ci, mb__lstm_steps_backward(l, li, dout, d_in)); return; }
    mb__lstm_layer *y = &l->layer[li];
    int64_t iv = l->interval ? l->interval : l->T, nseg = (l->T + iv - 1) / iv;
    size_t bh = (size_t)(l->B * l->H);
    float *w[4] = {0}, *g = l->interval ? l->seg_g : y->gates, *c = l->interval ? l->seg_c : y->cs;
    int kept = l->seg_kept == li; /* the forward's last segment is still in seg_g / seg_c */
    l->seg_kept = -1;            /* overwritten below */
    mb_result r = mb__lstm_weights(l, li, w, 0, "mb_lstm_backward");
    if (r == MB_OK) r = mb__lstm_rec_pack(l, li, 1);
    memset(l->dh, 0, bh * sizeof(float));
    memset(l->dc, 0, bh * sizeof(float));
    for (int64_t s = nseg - 1; r == MB_OK && s >= 0; s--) {
        int64_t s0 = s * iv, s1 = s0 + iv < l->T ? s0 + iv : l->T;
        if (l->interval && !(kept && s == nseg - 1)) {
            memcpy(c, y->cs + s * bh, bh * sizeof(float));
            for (int64_t a = mb__lstm_block0(l, s0); a < s1; a += l->G) {
                mb__rec_job j = mb__cpu_lstm_block(l, li, a, s0, s1, g, c, 0, w);
                for (j.r0 = 0; j.r0 < j.rows; j.r0 += j.n) MB__POOL_FOR(l->dev, j.parts - 1, j.parts, mb__rec_fwd_part, &j);
            }
        }
        for (int64_t t = s1 - 1; r == MB_OK && t >= s0; t--) {
            mb__rec_job j = mb__cpu_lstm_step(l, li, s0, t, g, c, dout, d_in);
            MB__POOL_FOR(l->dev, j.parts - 1, j.parts, mb__rec_bwd_part, &j);
            if (t == mb__lstm_block0(l, t)) r = mb__cpu_lstm_flush_block(l, li, t, t + l->G < l->T ? l->G : l->T - t);
        }
    }
    mb__cpu_many_done(m, ci, r);
}

/* mb_lstm_*_many on the CPU: the calls begun (checked, their initial or output gradients in
 * place), then a layer at a time (the forward from the bottom, the backward from the top)
 * one pool job with an item per call, longest first, on up to the device's threads, then
 * that layer's dropout (and the backward's dh0 / dc0), then the forwards ended. A failing
 * call stops, the others go on; the result: the first failing call's, in calls' order. */
static mb_result mb__cpu_lstm_many(mb_lstm_call *calls, int n, int backward) {
    mb__cpu_many m;
    memset(&m, 0, sizeof m);
    m.calls = calls; m.n = n; m.failed = n;
    mb__lstm_order(calls, n, m.order);
    int L = 0;
    for (int i = 0; i < n; i++) {
        mb_lstm_call *c = &calls[i];
        mb_lstm *l = c->lstm;
        mb__cpu_many_done(&m, i, backward ? mb__lstm_backward_begin(l, c->dh_last, c->dout_seq)
                                          : mb__lstm_forward_begin(l, c->x, mb__lstm_call_xs(c), c->B, c->T, c->h0, c->c0));
        if (l->L > L) L = l->L;
    }
    for (m.k = 0; m.k < L; m.k++) {
        MB__POOL_FOR(calls[0].lstm->dev, mb__cpu(calls[0].lstm->dev)->threads - 1, n,
                     backward ? mb__cpu_lstm_bwd_item : mb__cpu_lstm_fwd_item, &m);
        for (int i = 0; i < n; i++) {
            mb_lstm *l = calls[i].lstm;
            int li = backward ? l->L - 1 - m.k : m.k;
            if (m.res[i] != MB_OK || li < 0 || li >= l->L) continue;
            mb_result r = backward ? mb__lstm_drop_backward(l, li) : mb__lstm_drop_forward(l, li);
            if (r == MB_OK && backward) r = mb__lstm_backward_tail(l, li, calls[i].dh0, calls[i].dc0);
            mb__cpu_many_done(&m, i, r);
        }
    }
    for (int i = 0; i < n && !backward; i++)
        if (m.res[i] == MB_OK) mb__cpu_many_done(&m, i, mb__lstm_forward_end(calls[i].lstm, calls[i].out_seq, calls[i].h_last));
    return m.failed < n ? MB_FAIL(NULL, m.res[m.failed], "%s", m.failed_msg) : MB_OK; /* logged already */
}

/* The group's layer operations (mb_lstm_forward / _backward): one call's item. */
static mb_result mb__cpu_lstm_layer_forward(mb_lstm *l, int li) {
    mb__cpu_many m;
    mb_lstm_call c;
    memset(&c, 0, sizeof c);
    c.lstm = l;
    memset(&m, 0, sizeof m);
    m.calls = &c; m.n = 1; m.k = li; m.failed = 1;
    mb__cpu_lstm_fwd_item(&m, 0);
    return m.res[0];
}

static mb_result mb__cpu_lstm_layer_backward(mb_lstm *l, int li, const float *dout, float *d_in) {
    mb__cpu_many m;
    mb_lstm_call c;
    memset(&c, 0, sizeof c);
    c.lstm = l; c.dx = li ? NULL : d_in;
    (void)dout; /* mb__lstm_dout(l, li): the generic backward's own */
    memset(&m, 0, sizeof m);
    m.calls = &c; m.n = 1; m.k = l->L - 1 - li; m.failed = 1;
    mb__cpu_lstm_bwd_item(&m, 0);
    return m.res[0];
}

/* The state: the kernel, and in f32 the packed weights and a block's weight-gradient rows (for
 * the widest layer input). No fused recurrence: cfg.fused_blocks > 0 is refused. */
static mb_result mb__cpu_lstm_create(mb_lstm *l) {
    if (l->cfg.fused_blocks > 0) return mb__lstm_fused_refused(l);
    mb__cpu_lstm *st = (mb__cpu_lstm *)mb__host_calloc(1, sizeof *st);
    if (!st) return MB_FAIL(mb__lstm_log(l), MB_ERR_OUT_OF_MEMORY, "mb_lstm_create: no host memory");
    l->be_lstm = st;
    if (l->op != MB_F32) return MB_OK;
    st->rk = mb__rk_of(mb__cpu(l->dev)->kernel);
    int64_t H = l->H, in = l->F > H ? l->F : H, gb = (int64_t)l->G * l->maxB;
    MB_TRY(mb__lstm_alloc(l, &st->wpf, mb__rk_packed_size(4 * H, in + H)));
    MB_TRY(mb__lstm_alloc(l, &st->wpb, mb__rk_packed_size(H, 4 * H)));
    MB_TRY(mb__lstm_alloc(l, &st->wpi, mb__rk_packed_size(in, 4 * H)));
    MB_TRY(mb__lstm_alloc(l, &st->dbs, (size_t)(4 * H)));
    MB_TRY(mb__lstm_alloc(l, &st->wgx, (size_t)gb * (size_t)(in + H)));
    return mb__lstm_alloc(l, &st->wgs, (size_t)(4 * H * (in + H)));
}

static void mb__cpu_lstm_destroy(mb_lstm *l) {
    mb__cpu_lstm *st = mb__cpu_lstm_of(l);
    if (!st) return;
    float *bufs[] = {st->wpf, st->wpb, st->wpi, st->dbs, st->wgx, st->wgs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mb_free(l->dev, bufs[i]);
    MB_FREE(st);
    l->be_lstm = NULL;
}

/* Full storage adds nothing the checkpoint default counts (the packed weights are small). */
static size_t mb__cpu_lstm_full_extra(mb_device *dev, const mb_lstm_config *cfg) {
    (void)dev; (void)cfg;
    return 0;
}


MB__OPS_BEGIN
static const mb__lstm_ops mb__cpu_lstm_ops = {
    .create = mb__cpu_lstm_create, .destroy = mb__cpu_lstm_destroy, .full_extra = mb__cpu_lstm_full_extra,
    .layer_forward = mb__cpu_lstm_layer_forward, .layer_backward = mb__cpu_lstm_layer_backward,
    .many = mb__cpu_lstm_many,
    .fwd_gates = mb__cpu_lstm_fwd_gates, .bwd_gates = mb__cpu_lstm_bwd_gates, .copy_strided = mb__cpu_copy_strided,
    .add = mb__cpu_add, .fill = mb__cpu_fill,
};
MB__OPS_END

// ---- end lstm ----

// ---- layers ----

MBDEF mb_result mb_linear_init(mb_linear *l, mb_params *p, const char *prefix, int64_t in, int64_t out) {
    if (!l || !p || !prefix) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_linear_init: NULL argument");
    const mb_logger *lg = &p->dev->cfg.log;
    if (strlen(prefix) == 0 || strlen(prefix) > MB_MAX_NAME - 8)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_linear_init: prefix '%s' must be 1..%d bytes", prefix,
                       MB_MAX_NAME - 8);
    if (in < 1 || out < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_linear_init: '%s' in=%lld out=%lld must be >= 1", prefix,
                       (long long)in, (long long)out);
    char name[MB_MAX_NAME];
    int64_t wshape[2] = {out, in}, bshape[1] = {out};
    float bound = (float)(1.0 / sqrt((double)in));
    mb_linear r;   /* *l is written only on success */
    memset(&r, 0, sizeof r);
    snprintf(name, sizeof name, "%s.weight", prefix);
    MB_TRY(mb_params_add(p, name, 2, wshape, bound, &r.weight));
    snprintf(name, sizeof name, "%s.bias", prefix);
    MB_TRY(mb_params_add(p, name, 1, bshape, bound, &r.bias));
    r.params = p;
    r.in = in;
    r.out = out;
    *l = r;
    return MB_OK;
}

static mb_result mb__linear_check(const mb_linear *l, int stream, int64_t B, const void *a, const void *b,
                                  const char *what) {
    if (!l || !l->params) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: NULL or uninitialised layer", what);
    MB_TRY(mb__params_ready(l->params, what));
    mb_device *dev = l->params->dev;
    MB_TRY(mb__check_stream(dev, stream, what));
    if (B < 1 || !a || !b)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: '%s' batch %lld (must be >= 1) or NULL buffer", what,
                       mb_params_info(l->params, l->weight)->name, (long long)B);
    return MB_OK;
}

/* The backend's layers group: y (rows, cols) = b broadcast over rows; db (cols) += column sums of
 * dy, each in row order; an activation (dy NULL: out = f(x), else out = f'(x) dy); dropout. */
typedef struct mb__layers_ops {
    mb_result (*fill_rows)(mb_device *dev, int stream, float *y, const float *b, int64_t rows, int64_t cols);
    mb_result (*colsum_add)(mb_device *dev, int stream, float *db, const float *dy, int64_t rows, int64_t cols);
    mb_result (*act)(mb_device *dev, int stream, mb_act a, const float *x, const float *dy, float *out, size_t n);
    mb_result (*dropout)(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step, const uint64_t *step_dev,
                         const float *x, float *y, size_t n); /* the step: *step_dev when not NULL, read as it runs */
    mb_result (*step_add)(mb_device *dev, int stream, uint64_t *c, uint64_t add); /* *c += add, in stream order */
} mb__layers_ops;
MB__OPS_CHECK(mb__layers_ops, 5);

/* y (rows, cols) = b broadcast over rows. */
static mb_result mb__cpu_fill_rows(mb_device *dev, int stream, float *y, const float *b, int64_t rows, int64_t cols) {
    (void)dev;
    (void)stream;
    for (int64_t i = 0; i < rows; i++) memcpy(y + i * cols, b, (size_t)cols * sizeof(float));
    return MB_OK;
}

/* db (cols) += sum over rows of dy (rows, cols), each column summed in row order. */
static mb_result mb__cpu_colsum_add(mb_device *dev, int stream, float *db, const float *dy, int64_t rows,
                                    int64_t cols) {
    (void)dev;
    (void)stream;
    for (int64_t j = 0; j < cols; j++) {
        float s = 0.0f;
        for (int64_t i = 0; i < rows; i++) s += dy[i * cols + j];
        db[j] += s;
    }
    return MB_OK;
}

MBDEF mb_result mb_linear_forward(const mb_linear *l, int stream, const float *x, int64_t B, float *y) {
    MB_TRY(mb__linear_check(l, stream, B, x, y, "mb_linear_forward"));
    mb_device *dev = l->params->dev;
    MB_TRY(dev->be->layers->fill_rows(dev, stream, y, mb_params_tensor(l->params, l->bias), B, l->out));
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.trans_b = 1;                       /* y (B, out) += x (B, in) @ W^T, W (out, in) */
    g.m = B; g.n = l->out; g.k = l->in;
    g.alpha = 1.0f; g.beta = 1.0f;
    g.a = x; g.lda = l->in;
    g.b = mb_params_tensor(l->params, l->weight); g.ldb = l->in;
    g.c = y; g.ldc = l->out;
    g.stream = stream;
    return mb_gemm(dev, &g);
}

MBDEF mb_result mb_linear_backward(const mb_linear *l, int stream, const float *x, const float *dy, int64_t B,
                                   float *dx) {
    MB_TRY(mb__linear_check(l, stream, B, x, dy, "mb_linear_backward"));
    mb_device *dev = l->params->dev;
    mb_gemm_args g;
    memset(&g, 0, sizeof g);
    g.trans_a = 1;                       /* dW (out, in) += dy^T (out, B) @ x (B, in) */
    g.m = l->out; g.n = l->in; g.k = B;
    g.alpha = 1.0f; g.beta = 1.0f;
    g.a = dy; g.lda = l->out;
    g.b = x; g.ldb = l->in;
    g.c = mb_params_tensor_grad(l->params, l->weight); g.ldc = l->in;
    g.stream = stream;
    MB_TRY(mb_gemm(dev, &g));
    MB_TRY(dev->be->layers->colsum_add(dev, stream, mb_params_tensor_grad(l->params, l->bias), dy, B, l->out));
    if (!dx) return MB_OK;
    memset(&g, 0, sizeof g);             /* dx (B, in) = dy (B, out) @ W (out, in) */
    g.m = B; g.n = l->in; g.k = l->out;
    g.alpha = 1.0f; g.beta = 0.0f;
    g.a = dy; g.lda = l->out;
    g.b = mb_params_tensor(l->params, l->weight); g.ldb = l->in;
    g.c = dx; g.ldc = l->in;
    g.stream = stream;
    return mb_gemm(dev, &g);
}

MBDEF const char *mb_act_name(mb_act a) {
    return a == MB_ACT_IDENTITY ? "identity" : a == MB_ACT_RELU ? "relu" : a == MB_ACT_GELU ? "gelu" :
           a == MB_ACT_TANH ? "tanh" : "unknown";
}

#define MB__GELU_C 0.7978845608028654f /* sqrt(2/pi) */
/* tanh is the LSTM cell's (mb__ftanh: no libm call, absolute error about 2e-7), so an
 * activation has the same bits on every platform (glibc's, msvcrt's and CUDA's tanhf differ
 * in the last bit) and on the CPU and a GPU. */
MB__CELL_FN float mb__act_f(mb_act a, float x) {
    MB__NO_CONTRACT
    switch (a) {
    case MB_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case MB_ACT_GELU: return 0.5f * x * (1.0f + mb__ftanh(MB__GELU_C * (x + 0.044715f * x * x * x)));
    case MB_ACT_TANH: return mb__ftanh(x);
    default: return x;
    }
}
MB__CELL_FN float mb__act_df(mb_act a, float x) {
    MB__NO_CONTRACT
    switch (a) {
    case MB_ACT_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case MB_ACT_GELU: {
        float t = mb__ftanh(MB__GELU_C * (x + 0.044715f * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * MB__GELU_C * (1.0f + 3.0f * 0.044715f * x * x);
    }
    case MB_ACT_TANH: { float t = mb__ftanh(x); return 1.0f - t * t; }
    default: return 1.0f;
    }
}

static mb_result mb__act_check(mb_device *dev, int stream, mb_act a, const void *x, const void *y, size_t n,
                               const char *what) {
    MB_TRY(mb__check_dev_stream(dev, stream, what));
    if ((unsigned)a > (unsigned)MB_ACT_TANH)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: unknown activation %d", what, (int)a);
    if (n && (!x || !y)) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: NULL buffer for %zu elements", what, n);
    return MB_OK;
}

MBDEF mb_result mb_act_forward(mb_device *dev, int stream, mb_act a, const float *x, float *y, size_t n) {
    MB_TRY(mb__act_check(dev, stream, a, x, y, n, "mb_act_forward"));
    if (n == 0) return MB_OK;
    return dev->be->layers->act(dev, stream, a, x, NULL, y, n);
}

MBDEF mb_result mb_act_backward(mb_device *dev, int stream, mb_act a, const float *x, const float *dy, float *dx,
                                size_t n) {
    MB_TRY(mb__act_check(dev, stream, a, x, dx, n, "mb_act_backward"));
    if (n && !dy) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_act_backward: NULL dy");
    if (n == 0) return MB_OK;
    return dev->be->layers->act(dev, stream, a, x, dy, dx, n);
}

/* The CPU's activation loop, compiled as the LSTM rows are (portable, AVX2 + FMA, AVX-512;
 * the same bits in all): mb__ftanh's fmaf is an instruction in the wide ones, where the
 * portable build may have only a library call (MinGW-w64's exact one costs 4 ns). */
#define MB__ACT_ROWS(SUFFIX, ATTR)                                                                                 \
    ATTR static MB__NOINLINE void mb__act_rows##SUFFIX(mb_act a, const float *x, const float *dy, float *out,       \
                                                       size_t n) {                                                  \
        if (dy) for (size_t i = 0; i < n; i++) out[i] = mb__act_df(a, x[i]) * dy[i];                                \
        else for (size_t i = 0; i < n; i++) out[i] = mb__act_f(a, x[i]);                                            \
    }
MB__KERNEL_VARIANTS(MB__ACT_ROWS)

static mb_result mb__cpu_act(mb_device *dev, int stream, mb_act a, const float *x, const float *dy, float *out,
                             size_t n) {
    (void)stream;
    MB__KERNEL_OF(dev, mb__act_rows)(a, x, dy, out, n);
    return MB_OK;
}

/* Copy a (rows, cols) block between row-major matrices with leading dims ldd, lds. */
static mb_result mb__copy2d(mb_device *dev, int stream, float *dst, int64_t ldd, const float *src, int64_t lds,
                            int64_t rows, int64_t cols) {
    return mb_copy_2d(dev, stream, dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                      (size_t)cols * sizeof(float), (size_t)rows);
}

static mb_result mb__concat_check(mb_device *dev, int stream, int n, const void *list, const int64_t *dims,
                                  int64_t B, const void *y, int64_t *total, const char *what) {
    MB_TRY(mb__check_dev_stream(dev, stream, what));
    const mb_logger *lg = &dev->cfg.log;
    if (n < 1 || !list || !dims || !y || B < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: n=%d inputs and batch %lld must be >= 1, buffers non-NULL", what,
                       n, (long long)B);
    *total = 0;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 1 || dims[i] > INT64_MAX / 2 - *total)
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: input %d has %lld features, must be >= 1", what, i,
                           (long long)dims[i]);
        *total += dims[i];
    }
    return MB_OK;
}

MBDEF mb_result mb_concat_forward(mb_device *dev, int stream, int n, const float *const *xs, const int64_t *dims,
                                  int64_t B, float *y) {
    int64_t total = 0, col = 0;
    MB_TRY(mb__concat_check(dev, stream, n, xs, dims, B, y, &total, "mb_concat_forward"));
    for (int i = 0; i < n; i++)
        if (!xs[i]) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_concat_forward: input %d is NULL", i);
    for (int i = 0; i < n; col += dims[i], i++) MB_TRY(mb__copy2d(dev, stream, y + col, total, xs[i], dims[i], B, dims[i]));
    return MB_OK;
}

MBDEF mb_result mb_concat_backward(mb_device *dev, int stream, int n, const float *dy, const int64_t *dims,
                                   int64_t B, float *const *dxs) {
    int64_t total = 0, col = 0;
    MB_TRY(mb__concat_check(dev, stream, n, dxs, dims, B, dy, &total, "mb_concat_backward"));
    for (int i = 0; i < n; col += dims[i], i++)
        if (dxs[i]) MB_TRY(mb__copy2d(dev, stream, dxs[i], dims[i], dy + col, total, B, dims[i]));
    return MB_OK;
}

static inline MB__HD float mb__dropout_elem(float p, float keep_scale, uint64_t seed, uint64_t step, size_t i,
                                            float x) {
    return mb_rng_uniform(seed, step, (uint64_t)i) >= p ? x * keep_scale : 0.0f;
}

/* The dropout calls' checks (want_dev: the _dev calls, a step in device memory); *go 0: nothing
 * left to do (n = 0, or p = 0: y = x copied), else the backend's dropout runs (step_dev NULL: the
 * mask of `step`; else of *step_dev, read when the work runs). */
static mb_result mb__dropout_check(mb_device *dev, int stream, float p, int want_dev, const uint64_t *step_dev,
                                   const float *x, float *y, size_t n, const char *what, int *go) {
    *go = 0;
    MB_TRY(mb__check_dev_stream(dev, stream, what));
    if (want_dev && !step_dev) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: NULL step_dev", what);
    if (!(p >= 0.0f && p < 1.0f))
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: probability %g must be in [0, 1)", what, (double)p);
    if (n && (!x || !y)) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "%s: NULL buffer for %zu elements", what, n);
    if (n == 0) return MB_OK;
    if (p == 0.0f) return x == y ? MB_OK : mb_copy(dev, stream, y, x, n * sizeof(float));
    *go = 1;
    return MB_OK;
}

/* The CPU's dropout pass, in blocks of MB__DROP_CTRS Philox counters (4 elements each) drawn
 * side by side so that the rounds vectorize (mb_rng_uniform draws all four lanes of a counter
 * and keeps one: 4x the work). Compiled three times on x86 as the LSTM's rows (base, AVX2,
 * AVX-512; the device's kernel variant picks one): integer rounds, then one compare and one
 * multiply an element, so the same bits as mb__dropout_elem in every variant (tested against
 * it). x may equal y. Measured on the multi-timeframe step at p > 0 (F=32 H=64 B=128, 2 layers,
 * CPU): mb_rng_uniform an element took about 20% of the step. */
enum { MB__DROP_CTRS = 16 };
#define MB__DROPOUT_BLOCKS(SUFFIX, ATTR)                                                                       \
    ATTR static MB__NOINLINE void mb__dropout_blocks##SUFFIX(float p, float ks, uint64_t seed, uint64_t step,    \
                                                             const float *x, float *y, size_t nblk) {          \
        for (size_t b = 0; b < nblk; b++) {                                                                    \
            uint32_t a0[MB__DROP_CTRS], a1[MB__DROP_CTRS], a2[MB__DROP_CTRS], a3[MB__DROP_CTRS];               \
            uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);                                         \
            for (int g = 0; g < MB__DROP_CTRS; g++) { /* mb_philox's counter and stream words */               \
                uint64_t c = (uint64_t)b * MB__DROP_CTRS + (uint64_t)g;                                        \
                a0[g] = (uint32_t)c; a1[g] = (uint32_t)(c >> 32); a2[g] = (uint32_t)step;                      \
                a3[g] = (uint32_t)(step >> 32);                                                                \
            }                                                                                                  \
            for (int r = 0; r < 10; r++) {                                                                     \
                for (int g = 0; g < MB__DROP_CTRS; g++) {                                                      \
                    uint64_t p0 = (uint64_t)0xD2511F53u * a0[g], p1 = (uint64_t)0xCD9E8D57u * a2[g];           \
                    uint32_t n0 = (uint32_t)(p1 >> 32) ^ a1[g] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ a3[g] ^ k1;   \
                    a1[g] = (uint32_t)p1; a3[g] = (uint32_t)p0; a0[g] = n0; a2[g] = n2;                        \
                }                                                                                              \
                k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;                                                          \
            }                                                                                                  \
            size_t e = b * 4 * MB__DROP_CTRS;                                                                  \
            for (int g = 0; g < MB__DROP_CTRS; g++, e += 4) { /* lane q: mb_rng_uniform's 24 bits */           \
                uint32_t v[4] = {a0[g], a1[g], a2[g], a3[g]};                                                  \
                for (int q = 0; q < 4; q++)                                                                    \
                    y[e + q] = (float)(v[q] >> 8) * 5.9604644775390625e-8f >= p ? x[e + q] * ks : 0.0f;        \
            }                                                                                                  \
        }                                                                                                      \
    }
MB__KERNEL_VARIANTS(MB__DROPOUT_BLOCKS)

static mb_result mb__cpu_dropout(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step,
                                 const uint64_t *step_dev, const float *x, float *y, size_t n) {
    (void)stream;
    float ks = 1.0f / (1.0f - p);
    if (step_dev) step = *step_dev;
    size_t nblk = n / (4 * MB__DROP_CTRS), i = nblk * 4 * MB__DROP_CTRS;
    MB__KERNEL_OF(dev, mb__dropout_blocks)(p, ks, seed, step, x, y, nblk);
    for (; i < n; i++) y[i] = mb__dropout_elem(p, ks, seed, step, i, x[i]);
    return MB_OK;
}

static mb_result mb__cpu_step_add(mb_device *dev, int stream, uint64_t *c, uint64_t add) {
    (void)dev; (void)stream;
    *c += add;
    return MB_OK;
}

MBDEF mb_result mb_dropout_forward(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step, const float *x,
                                   float *y, size_t n) {
    int go;
    MB_TRY(mb__dropout_check(dev, stream, p, 0, NULL, x, y, n, "mb_dropout_forward", &go));
    return go ? dev->be->layers->dropout(dev, stream, p, seed, step, NULL, x, y, n) : MB_OK;
}
MBDEF mb_result mb_dropout_backward(mb_device *dev, int stream, float p, uint64_t seed, uint64_t step,
                                    const float *dy, float *dx, size_t n) {
    int go;
    MB_TRY(mb__dropout_check(dev, stream, p, 0, NULL, dy, dx, n, "mb_dropout_backward", &go));
    return go ? dev->be->layers->dropout(dev, stream, p, seed, step, NULL, dy, dx, n) : MB_OK;
}
MBDEF mb_result mb_dropout_forward_dev(mb_device *dev, int stream, float p, uint64_t seed, const uint64_t *step_dev,
                                       const float *x, float *y, size_t n) {
    int go;
    MB_TRY(mb__dropout_check(dev, stream, p, 1, step_dev, x, y, n, "mb_dropout_forward_dev", &go));
    return go ? dev->be->layers->dropout(dev, stream, p, seed, 0, step_dev, x, y, n) : MB_OK;
}
MBDEF mb_result mb_dropout_backward_dev(mb_device *dev, int stream, float p, uint64_t seed, const uint64_t *step_dev,
                                        const float *dy, float *dx, size_t n) {
    int go;
    MB_TRY(mb__dropout_check(dev, stream, p, 1, step_dev, dy, dx, n, "mb_dropout_backward_dev", &go));
    return go ? dev->be->layers->dropout(dev, stream, p, seed, 0, step_dev, dy, dx, n) : MB_OK;
}

MBDEF mb_result mb_dropout_step_advance(mb_device *dev, int stream, uint64_t *step_dev) {
    MB_TRY(mb__check_dev_stream(dev, stream, "mb_dropout_step_advance"));
    if (!step_dev) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_dropout_step_advance: NULL step_dev");
    return dev->be->layers->step_add(dev, stream, step_dev, 1);
}

MB__OPS_BEGIN
static const mb__layers_ops mb__cpu_layers_ops = {
    .fill_rows = mb__cpu_fill_rows, .colsum_add = mb__cpu_colsum_add, .act = mb__cpu_act, .dropout = mb__cpu_dropout,
    .step_add = mb__cpu_step_add,
};
MB__OPS_END

// ---- loss ----

/* Elementwise loss and its derivative (before the 1/(B K) of the mean). */
static inline MB__HD float mb__loss_elem(int huber, float delta, float p, float t, float *grad) {
    float d = p - t;
    if (!huber) { *grad = 2.0f * d; return d * d; }
    float a = d < 0.0f ? -d : d;
    if (a <= delta) { *grad = d; return 0.5f * d * d; }
    *grad = d < 0.0f ? -delta : delta;
    return delta * (a - 0.5f * delta);
}
/* mb_loss_config.acc: a meter slot {sum, weight} gains mean * w and w (w = B: samples). */
static inline MB__HD void mb__loss_acc(double *acc, double mean, double w) {
    if (!acc) return;
    acc[0] += mean * w;
    acc[1] += w;
}
/* The factor on dLoss/dpred: scale * scale_dev / (B K), computed the same way everywhere. */
static inline MB__HD float mb__loss_coef(float scale, const float *scale_dev, size_t n) {
    return (float)((double)scale * (scale_dev ? (double)*scale_dev : 1.0) / (double)n);
}

/* The backend's loss group: the mean loss of n elements (into loss_out and the meter slot acc,
 * which gains mean * w and w; each NULL: none) and dpred = dLoss/dpred * scale * scale_dev. */
typedef struct mb__loss_ops {
    mb_result (*run)(mb_device *dev, int stream, int huber, float delta, const float *pred, const float *target,
                     size_t n, float scale, const float *scale_dev, float *loss_out, float *dpred, double *acc,
                     double w);
} mb__loss_ops;
MB__OPS_CHECK(mb__loss_ops, 1);

MBDEF mb_result mb_loss(mb_device *dev, int stream, const mb_loss_config *cfg, const float *pred,
                        const float *target, int64_t B, int64_t K, float scale, const float *scale_dev,
                        float *loss_out, float *dpred) {
    MB_TRY(mb__check_dev_stream(dev, stream, "mb_loss"));
    const mb_logger *lg = &dev->cfg.log;
    mb_loss_config c;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    if (c.kind != MB_LOSS_MSE && c.kind != MB_LOSS_HUBER)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_loss: unknown loss kind %d", (int)c.kind);
    if (c.huber_delta == 0.0f) c.huber_delta = 1.0f;
    if (!(c.huber_delta > 0.0f) || !mb__finite_f(c.huber_delta))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_loss: huber_delta %g must be finite and > 0", (double)c.huber_delta);
    if (B < 1 || K < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_loss: shape (%lld, %lld) must be >= 1 each", (long long)B,
                       (long long)K);
    if (!pred || !target || (!loss_out && !dpred && !c.acc))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG,
                       "mb_loss: NULL pred/target, or neither loss_out nor dpred (nor cfg->acc) given");
    if (!mb__finite_f(scale)) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_loss: scale %g is not finite", (double)scale);
    size_t n;
    if (!mb_size_mul((size_t)B, (size_t)K, &n)) return MB_FAIL(lg, MB_ERR_OVERFLOW, "mb_loss: B*K overflows");
    int huber = c.kind == MB_LOSS_HUBER;
    return dev->be->loss->run(dev, stream, huber, c.huber_delta, pred, target, n, scale, scale_dev, loss_out, dpred,
                         c.acc, (double)B);
}

static mb_result mb__cpu_loss(mb_device *dev, int stream, int huber, float delta, const float *pred,
                              const float *target, size_t n, float scale, const float *scale_dev, float *loss_out,
                              float *dpred, double *acc, double w) {
    (void)dev; (void)stream;
    float coef = mb__loss_coef(scale, scale_dev, n), g;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        sum += (double)mb__loss_elem(huber, delta, pred[i], target[i], &g);
        if (dpred) dpred[i] = g * coef;
    }
    if (loss_out) *loss_out = (float)(sum / (double)n);
    mb__loss_acc(acc, sum / (double)n, w);
    return MB_OK;
}

MBDEF mb_result mb_fetch_scalar(mb_device *dev, int stream, const float *dev_scalar, float *host) {
    MB_TRY(mb__check_dev_stream(dev, stream, "mb_fetch_scalar"));
    if (!dev_scalar || !host) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_fetch_scalar: NULL pointer");
    MB_TRY(mb_copy(dev, stream, host, dev_scalar, sizeof(float)));
    return mb_sync(dev, stream);
}

MB__OPS_BEGIN
static const mb__loss_ops mb__cpu_loss_ops = {.run = mb__cpu_loss};
MB__OPS_END

// ---- amp ----

typedef struct mb__scaler_hp { float growth, backoff, min_scale, max_scale; int32_t interval; } mb__scaler_hp;

struct mb_scaler {
    mb_device *dev;
    mb__scaler_hp hp;
    mb_scaler_state *st;  /* device memory */
};

/* The GradScaler update rule (torch's _amp_update_scale_) plus the optional floor/cap. */
static inline MB__HD void mb__scaler_update_state(mb_scaler_state *st, const mb__scaler_hp *hp) {
    if (st->found_inf) {
        float s = st->scale * hp->backoff;
        if (hp->min_scale > 0.0f && s < hp->min_scale) s = hp->min_scale;
        st->scale = s;
        st->growth_tracker = 0;
    } else if (st->growth_tracker + 1 >= hp->interval) {
        float s = st->scale * hp->growth;
        if (mb__finite_f(s)) st->scale = (hp->max_scale > 0.0f && s > hp->max_scale) ? hp->max_scale : s;
        st->growth_tracker = 0;
    } else {
        st->growth_tracker++;
    }
    st->last_found_inf = st->found_inf;
    st->found_inf = 0;
}

/* The backend's amp group, on the compute stream: grad *= 1/scale, found_inf set on a
 * non-finite value; the scale's update (mb__scaler_update_state). */
typedef struct mb__amp_ops {
    mb_result (*unscale)(mb_device *dev, mb_scaler_state *st, float *grad, size_t n);
    mb_result (*scaler_update)(mb_device *dev, mb_scaler_state *st, const mb__scaler_hp *hp);
} mb__amp_ops;
MB__OPS_CHECK(mb__amp_ops, 2);

static mb_result mb__scaler_put(mb_scaler *s, const mb_scaler_state *st) {
    MB_TRY(mb_copy(s->dev, MB_STREAM_COMPUTE, s->st, st, sizeof *st));
    return mb_sync(s->dev, MB_STREAM_COMPUTE);
}

MBDEF mb_result mb_scaler_create(mb_scaler **out, mb_device *dev, const mb_scaler_config *cfg) {
    if (!out || !dev) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_create: NULL argument");
    *out = NULL;
    const mb_logger *lg = &dev->cfg.log;
    mb_scaler_config c;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    if (c.init_scale == 0.0f) c.init_scale = 65536.0f;
    if (c.growth_factor == 0.0f) c.growth_factor = 2.0f;
    if (c.backoff_factor == 0.0f) c.backoff_factor = 0.5f;
    if (c.growth_interval == 0) c.growth_interval = 2000;
    if (!(c.init_scale > 0.0f) || !mb__finite_f(c.init_scale))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_scaler_create: init_scale %g must be finite and > 0", (double)c.init_scale);
    if (!(c.growth_factor > 1.0f) || !mb__finite_f(c.growth_factor))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_scaler_create: growth_factor %g must be finite and > 1",
                       (double)c.growth_factor);
    if (!(c.backoff_factor > 0.0f && c.backoff_factor < 1.0f))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_scaler_create: backoff_factor %g must be in (0, 1)",
                       (double)c.backoff_factor);
    if (c.growth_interval < 1)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_scaler_create: growth_interval %d must be >= 1", c.growth_interval);
    if (!(c.min_scale >= 0.0f) || !(c.max_scale >= 0.0f) || !mb__finite_f(c.min_scale) || !mb__finite_f(c.max_scale) ||
        (c.max_scale > 0.0f && c.max_scale < c.min_scale))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_scaler_create: min_scale %g / max_scale %g must be finite, >= 0, "
                       "min <= max", (double)c.min_scale, (double)c.max_scale);
    mb_scaler *s = (mb_scaler *)mb__host_calloc(1, sizeof *s);
    if (!s) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_scaler_create: no host memory");
    s->dev = dev;
    s->hp.growth = c.growth_factor; s->hp.backoff = c.backoff_factor;
    s->hp.min_scale = c.min_scale; s->hp.max_scale = c.max_scale; s->hp.interval = c.growth_interval;
    mb_scaler_state st;
    memset(&st, 0, sizeof st);
    st.scale = c.init_scale;
    mb_result r = mb_alloc(dev, MB_MEM_DEVICE, sizeof st, (void **)&s->st);
    if (r == MB_OK) r = mb__scaler_put(s, &st);
    if (r != MB_OK) { mb_scaler_destroy(s); return r; }
    *out = s;
    return MB_OK;
}

MBDEF void mb_scaler_destroy(mb_scaler *s) {
    if (!s) return;
    mb_free(s->dev, s->st);
    MB_FREE(s);
}

MBDEF const float *mb_scaler_scale_ptr(const mb_scaler *s) { return s ? &s->st->scale : NULL; }

MBDEF mb_result mb_scaler_unscale(mb_scaler *s, float *grad, size_t n) {
    if (!s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_unscale: NULL scaler");
    if (n && !grad) return MB_FAIL(&s->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_scaler_unscale: NULL gradients");
    if (n == 0) return MB_OK;
    return s->dev->be->amp->unscale(s->dev, s->st, grad, n);
}

MBDEF mb_result mb_scaler_update(mb_scaler *s) {
    if (!s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_update: NULL scaler");
    return s->dev->be->amp->scaler_update(s->dev, s->st, &s->hp);
}

static mb_result mb__cpu_unscale(mb_device *dev, mb_scaler_state *st, float *grad, size_t n) {
    (void)dev;
    float inv = (float)(1.0 / (double)st->scale);
    int32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= !mb__finite_f(grad[i]);
        grad[i] *= inv;
    }
    if (bad) st->found_inf = 1;
    return MB_OK;
}

static mb_result mb__cpu_scaler_update(mb_device *dev, mb_scaler_state *st, const mb__scaler_hp *hp) {
    (void)dev;
    mb__scaler_update_state(st, hp);
    return MB_OK;
}

MBDEF mb_result mb_scaler_get(mb_scaler *s, mb_scaler_state *st) {
    if (!s || !st) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_get: NULL argument");
    MB_TRY(mb_copy(s->dev, MB_STREAM_COMPUTE, st, s->st, sizeof *st));
    return mb_sync(s->dev, MB_STREAM_COMPUTE);
}

MBDEF mb_result mb_scaler_set(mb_scaler *s, const mb_scaler_state *st) {
    if (!s || !st) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_set: NULL argument");
    if (!(st->scale > 0.0f) || !mb__finite_f(st->scale) || st->growth_tracker < 0 ||
        st->growth_tracker >= s->hp.interval)
        return MB_FAIL(&s->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_scaler_set: scale %g must be finite > 0 and "
                       "growth_tracker %d in 0..%d", (double)st->scale, (int)st->growth_tracker, (int)s->hp.interval - 1);
    return mb__scaler_put(s, st);
}

MBDEF mb_result mb_scaler_step_taken(mb_scaler *s, int *taken) {
    mb_scaler_state st;
    if (!taken) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_scaler_step_taken: NULL argument");
    MB_TRY(mb_scaler_get(s, &st));
    *taken = !st.last_found_inf;
    return MB_OK;
}

MB__OPS_BEGIN
static const mb__amp_ops mb__cpu_amp_ops = {.unscale = mb__cpu_unscale, .scaler_update = mb__cpu_scaler_update};
MB__OPS_END

// ---- optim ----

static inline MB__HD double mb__cos_anneal(double start, double end, double pct) {
    return end + (start - end) / 2.0 * (cos(3.14159265358979323846 * pct) + 1.0);
}

/* The schedule's rate at a step (checked by mb__lr_check; past total_steps, the last step's
 * rate): on the host (mb_lr_at) and in the optimizer's kernel alike. */
static inline MB__HD float mb__lr_value(const mb_lr_schedule *s, int64_t step) {
    double base = s->lr, v = base;
    if (s->kind != MB_LR_CONSTANT && step >= s->total_steps) step = s->total_steps - 1;
    if (s->kind == MB_LR_WARMUP_COSINE) {
        if (step < s->warmup_steps) v = base * (double)(step + 1) / (double)s->warmup_steps;
        else v = mb__cos_anneal(base, s->min_lr, (double)(step - s->warmup_steps) /
                                                     (double)(s->total_steps - s->warmup_steps));
    } else if (s->kind == MB_LR_ONE_CYCLE) {   /* torch.optim.lr_scheduler.OneCycleLR, cos, two phases */
        double pct = s->pct_start > 0.0f ? s->pct_start : 0.3, div = s->div_factor > 0.0f ? s->div_factor : 25.0;
        double fdiv = s->final_div_factor > 0.0f ? s->final_div_factor : 1e4;
        double initial = base / div, final_lr = initial / fdiv;
        double end1 = pct * (double)s->total_steps - 1.0, end2 = (double)s->total_steps - 1.0;
        if ((double)step <= end1) v = mb__cos_anneal(initial, base, end1 > 0 ? (double)step / end1 : 1.0);
        else v = mb__cos_anneal(base, final_lr, (double)step - end1 > 0 ? ((double)step - end1) / (end2 - end1) : 1.0);
    }
    return (float)v;
}

/* Host-computed constants of one step, passed by value to the kernels. */
typedef struct mb__adamw_hp {
    double beta1_d, beta2_d;                        /* for the bias corrections */
    float lr, beta1, beta2, eps, max_norm, weight_decay;
    float one_minus_b1, one_minus_b2;               /* 1 - b1, 1 - b2 */
    int scheduled;                                  /* 1: lr from sched at the device's counter */
    mb_lr_schedule sched;
} mb__adamw_hp;
/* Device-side optimizer state, written by the norm pass and read by the update pass. */
typedef struct mb__adamw_dev {
    int64_t step;        /* steps taken */
    int64_t sched_step;  /* scheduled calls so far (the schedule's position) */
    double sumsq;        /* sum of squared gradients seen by the last call */
    float lr, decay_mul; /* this call's learning rate and 1 - lr*wd (double, rounded) */
    float norm, clip_coef, step_size, bc2_sqrt;
    int32_t own_found_inf; /* found_inf flag when no scaler is given */
    int32_t skipped;     /* the last call skipped its step */
} mb__adamw_dev;

/* Device-side state of a weight average (mb_avg), written by its one-thread finalize and read
 * by its pass. */
typedef struct mb__avg_dev {
    int64_t n;       /* n_averaged */
    int32_t go;      /* this update runs (the optimizer's step was taken, or no optimizer) */
    int32_t copy;    /* this update copies (n_averaged was 0) */
    float denom;     /* SWA: n_averaged + 1, as torch divides (a float) */
} mb__avg_dev;

/* The backend's optim group, on the compute stream: the gradients' global norm, the clip, the
 * skip on found_inf and the AdamW update of n parameters (mb__adamw_finalize, mb__adamw_elem);
 * scratch: the backend's caps.adamw_scratch bytes of device memory. avg: a weight average's
 * update (mb__avg_finalize, then mb__avg_elem over n; `after` NULL or the optimizer's device
 * state); avg_swap: exchange a[i] and b[i] over n. */
typedef struct mb__optim_ops {
    mb_result (*adamw)(mb_device *dev, const mb__adamw_hp *hp, mb__adamw_dev *dv, int32_t *found_inf, float *param,
                       const float *grad, float *m, float *v, const uint8_t *decay, size_t n, double *scratch);
    mb_result (*avg)(mb_device *dev, mb__avg_dev *st, const mb__adamw_dev *after, int swa, float w, float *avg,
                     const float *param, size_t n);
    mb_result (*avg_swap)(mb_device *dev, float *a, float *b, size_t n);
} mb__optim_ops;
MB__OPS_CHECK(mb__optim_ops, 3);

#define MB__NORM_BLOCKS 1024 /* CUDA: the most blocks of the sum-of-squares pass (its grid: a function of n) */

struct mb_adamw {
    mb_params *params;
    mb_adamw_config cfg;
    float *m, *v;         /* (total) moments, device */
    uint8_t *decay;       /* (total/64) 1 where weight decay applies, device */
    mb__adamw_dev *dv;    /* device */
    double *partials;     /* CUDA norm partial sums, device */
};

MBDEF mb_adamw_config mb_adamw_config_default(void) {
    mb_adamw_config c;
    memset(&c, 0, sizeof c);
    c.beta1 = 0.9; c.beta2 = 0.999; c.eps = 1e-8f; c.weight_decay = 0.01f;
    return c;
}

/* After the sum of squares: norm, clip coefficient, the inf check, bias corrections. */
static inline MB__HD void mb__adamw_finalize(mb__adamw_dev *dv, double sumsq, int32_t *found_inf,
                                             const mb__adamw_hp *hp) {
    dv->lr = hp->scheduled ? mb__lr_value(&hp->sched, dv->sched_step++) : hp->lr;
    dv->decay_mul = (float)(1.0 - (double)dv->lr * (double)hp->weight_decay);
    dv->sumsq = sumsq;
    float norm = (float)sqrt(sumsq);
    dv->norm = norm;
    float coef = 1.0f;
    if (hp->max_norm > 0.0f) { coef = hp->max_norm / (norm + 1e-6f); coef = coef < 1.0f ? coef : 1.0f; }
    dv->clip_coef = coef;
    if (!mb__finite_d(sumsq)) *found_inf = 1;
    dv->skipped = *found_inf != 0;
    if (dv->skipped) return;
    dv->step++;
    double bc1 = 1.0 - pow(hp->beta1_d, (double)dv->step), bc2 = 1.0 - pow(hp->beta2_d, (double)dv->step);
    dv->step_size = (float)((double)dv->lr / bc1);
    dv->bc2_sqrt = (float)sqrt(bc2);
}

/* One element of AdamW, in torch's order of operations (_single_tensor_adamw). */
static inline MB__HD void mb__adamw_elem(const mb__adamw_hp *hp, const mb__adamw_dev *dv, int decay, float *param,
                                         float grad, float *m, float *v) {
    float g = grad * dv->clip_coef, p = *param, mi = *m, w = hp->one_minus_b1;
    if (decay) p *= dv->decay_mul;
    mi = w < 0.5f ? mi + w * (g - mi) : g - (g - mi) * (1.0f - w);   /* lerp(m, g, 1 - b1) */
    float vi = *v * hp->beta2 + hp->one_minus_b2 * g * g;
    float denom = sqrtf(vi) / dv->bc2_sqrt + hp->eps;
    *param = p + -dv->step_size * mi / denom;
    *m = mi;
    *v = vi;
}

static mb_result mb__adamw_decay_mask(mb_adamw *o) {
    mb_params *p = o->params;
    size_t nb = p->total / 64;
    uint8_t *h = (uint8_t *)mb__host_calloc(nb ? nb : 1, 1);
    if (!h) return MB_FAIL(&p->dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_adamw_create: no host memory for the mask");
    for (int t = 0; t < p->n; t++) {
        const mb_param_info *in = &p->info[t];
        uint8_t d = (uint8_t)(o->cfg.decay_all || !in->no_decay);
        for (size_t b = in->offset / 64; b < (in->offset + in->count + 63) / 64; b++) h[b] = d;
    }
    mb_result r = mb_alloc(p->dev, MB_MEM_DEVICE, nb, (void **)&o->decay);
    if (r == MB_OK) r = mb_copy(p->dev, MB_STREAM_COMPUTE, o->decay, h, nb);
    if (r == MB_OK) r = mb_sync(p->dev, MB_STREAM_COMPUTE);
    MB_FREE(h);
    return r;
}

static mb_result mb__adamw_check_cfg(const mb_logger *lg, const mb_adamw_config *c) {
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_adamw_create: beta1 %g and beta2 %g must be in [0, 1)",
                       c->beta1, c->beta2);
    if (!(c->eps > 0.0f) || !mb__finite_f(c->eps))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_adamw_create: eps %g must be finite and > 0", (double)c->eps);
    if (!(c->weight_decay >= 0.0f) || !mb__finite_f(c->weight_decay))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_adamw_create: weight_decay %g must be finite and >= 0",
                       (double)c->weight_decay);
    if (!(c->max_grad_norm >= 0.0f) || !mb__finite_f(c->max_grad_norm))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_adamw_create: max_grad_norm %g must be finite and >= 0 (0 = off)",
                       (double)c->max_grad_norm);
    return MB_OK;
}

MBDEF mb_result mb_adamw_create(mb_adamw **out, mb_params *p, const mb_adamw_config *cfg) {
    if (!out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_create: NULL out");
    *out = NULL;
    MB_TRY(mb__params_ready(p, "mb_adamw_create"));
    mb_adamw_config c = cfg ? *cfg : mb_adamw_config_default();
    MB_TRY(mb__adamw_check_cfg(&p->dev->cfg.log, &c));
    mb_adamw *o = (mb_adamw *)mb__host_calloc(1, sizeof *o);
    if (!o) return MB_FAIL(&p->dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_adamw_create: no host memory");
    o->params = p;
    o->cfg = c;
    size_t bytes = p->total * sizeof(float);
    mb__adamw_dev dv;
    memset(&dv, 0, sizeof dv);
    mb_device *dev = p->dev;
    mb_result r = mb_alloc(dev, MB_MEM_DEVICE, bytes, (void **)&o->m);
    if (r == MB_OK) r = mb_alloc(dev, MB_MEM_DEVICE, bytes, (void **)&o->v);
    if (r == MB_OK) r = mb_alloc(dev, MB_MEM_DEVICE, sizeof dv, (void **)&o->dv);
    if (r == MB_OK && dev->be->caps.adamw_scratch) r = mb_alloc(dev, MB_MEM_DEVICE, dev->be->caps.adamw_scratch, (void **)&o->partials);
    if (r == MB_OK) r = mb_zero(dev, MB_STREAM_COMPUTE, o->m, bytes);
    if (r == MB_OK) r = mb_zero(dev, MB_STREAM_COMPUTE, o->v, bytes);
    if (r == MB_OK) r = mb_copy(dev, MB_STREAM_COMPUTE, o->dv, &dv, sizeof dv);
    if (r == MB_OK) r = mb__adamw_decay_mask(o);
    if (r != MB_OK) { mb_adamw_destroy(o); return r; }
    *out = o;
    return MB_OK;
}

MBDEF void mb_adamw_destroy(mb_adamw *o) {
    if (!o) return;
    mb_device *dev = o->params->dev;
    mb_free(dev, o->m); mb_free(dev, o->v); mb_free(dev, o->decay); mb_free(dev, o->dv); mb_free(dev, o->partials);
    MB_FREE(o);
}

/* Both kinds of step: hp.lr (> 0) or, with sched, the schedule's rate on the device. */
static mb_result mb__adamw_step(mb_adamw *o, float lr, const mb_lr_schedule *sched, mb_scaler *scaler) {
    mb_device *dev = o->params->dev;
    if (scaler && scaler->dev != dev)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_adamw_step: scaler and params live on different devices");
    mb__adamw_hp hp;
    memset(&hp, 0, sizeof hp);
    hp.beta1_d = o->cfg.beta1; hp.beta2_d = o->cfg.beta2;
    hp.lr = lr; hp.beta1 = (float)o->cfg.beta1; hp.beta2 = (float)o->cfg.beta2; hp.eps = o->cfg.eps;
    hp.max_norm = o->cfg.max_grad_norm; hp.weight_decay = o->cfg.weight_decay;
    hp.one_minus_b1 = (float)(1.0 - o->cfg.beta1);
    hp.one_minus_b2 = (float)(1.0 - o->cfg.beta2);
    if (sched) { hp.scheduled = 1; hp.sched = *sched; }
    int32_t *found_inf = scaler ? &scaler->st->found_inf : &o->dv->own_found_inf;
    float *param = o->params->data;
    const float *grad = o->params->grad;
    size_t n = o->params->total;
    return dev->be->optim->adamw(dev, &hp, o->dv, found_inf, param, grad, o->m, o->v, o->decay, n, o->partials);
}

static mb_result mb__cpu_adamw(mb_device *dev, const mb__adamw_hp *hp, mb__adamw_dev *dv, int32_t *found_inf,
                               float *param, const float *grad, float *m, float *v, const uint8_t *decay, size_t n,
                               double *scratch) {
    (void)scratch;
    mb__fpenv fe = mb__fp_enter(dev); /* v = E[g^2] of tiny gradients: denormal */
    double sumsq = 0.0;
    for (size_t i = 0; i < n; i++) sumsq += (double)grad[i] * (double)grad[i];
    if (found_inf == &dv->own_found_inf) *found_inf = 0; /* the own flag (no scaler) covers this call only */
    mb__adamw_finalize(dv, sumsq, found_inf, hp);
    if (!dv->skipped)
        for (size_t i = 0; i < n; i++) mb__adamw_elem(hp, dv, decay[i / 64], &param[i], grad[i], &m[i], &v[i]);
    mb__fp_leave(fe);
    return MB_OK;
}

/* A weight average's update, before its pass (one thread on a GPU): whether it runs, whether it
 * copies, and n_averaged counted. */
static inline MB__HD void mb__avg_finalize(mb__avg_dev *st, const mb__adamw_dev *after) {
    st->go = !(after && after->skipped);
    if (!st->go) return;
    st->copy = st->n == 0;
    st->denom = (float)(st->n + 1);
    st->n++;
}

/* One element of the average: torch's copy, lerp (EMA, w = 1 - decay) or default SWA average. */
static inline MB__HD float mb__avg_elem(const mb__avg_dev *st, int swa, float w, float avg, float cur) {
    if (st->copy) return cur;
    if (swa) return avg + (cur - avg) / st->denom;
    return w < 0.5f ? avg + w * (cur - avg) : cur - (cur - avg) * (1.0f - w); /* torch's lerp */
}

static mb_result mb__cpu_avg(mb_device *dev, mb__avg_dev *st, const mb__adamw_dev *after, int swa, float w,
                             float *avg, const float *param, size_t n) {
    mb__fpenv fe = mb__fp_enter(dev);
    mb__avg_finalize(st, after);
    if (st->go)
        for (size_t i = 0; i < n; i++) avg[i] = mb__avg_elem(st, swa, w, avg[i], param[i]);
    mb__fp_leave(fe);
    return MB_OK;
}

static mb_result mb__cpu_avg_swap(mb_device *dev, float *a, float *b, size_t n) {
    (void)dev;
    for (size_t i = 0; i < n; i++) { float t = a[i]; a[i] = b[i]; b[i] = t; }
    return MB_OK;
}

MB__OPS_BEGIN
static const mb__optim_ops mb__cpu_optim_ops = {.adamw = mb__cpu_adamw, .avg = mb__cpu_avg, .avg_swap = mb__cpu_avg_swap};
MB__OPS_END

MBDEF mb_result mb_adamw_step(mb_adamw *o, float lr, mb_scaler *scaler) {
    if (!o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_step: NULL optimizer");
    if (!(lr > 0.0f) || !mb__finite_f(lr))
        return MB_FAIL(&o->params->dev->cfg.log, MB_ERR_INVALID_ARG,
                       "mb_adamw_step: learning rate %g must be finite and > 0", (double)lr);
    return mb__adamw_step(o, lr, NULL, scaler);
}

static mb_result mb__adamw_fetch(mb_adamw *o, mb__adamw_dev *dv, const char *what) {
    if (!o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: NULL optimizer", what);
    MB_TRY(mb_copy(o->params->dev, MB_STREAM_COMPUTE, dv, o->dv, sizeof *dv));
    return mb_sync(o->params->dev, MB_STREAM_COMPUTE);
}

MBDEF mb_result mb_adamw_steps(mb_adamw *o, int64_t *steps) {
    mb__adamw_dev dv;
    memset(&dv, 0, sizeof dv); /* GCC 12 -O3 -Wmaybe-uninitialized cannot see the fetch's copy */
    if (!steps) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_steps: NULL argument");
    MB_TRY(mb__adamw_fetch(o, &dv, "mb_adamw_steps"));
    *steps = dv.step;
    return MB_OK;
}
MBDEF mb_result mb_adamw_last_step_taken(mb_adamw *o, int *taken) {
    mb__adamw_dev dv;
    if (!taken) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_last_step_taken: NULL argument");
    MB_TRY(mb__adamw_fetch(o, &dv, "mb_adamw_last_step_taken"));
    *taken = !dv.skipped;
    return MB_OK;
}
MBDEF mb_result mb_adamw_grad_norm(mb_adamw *o, float *norm) {
    mb__adamw_dev dv;
    if (!norm) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_grad_norm: NULL argument");
    MB_TRY(mb__adamw_fetch(o, &dv, "mb_adamw_grad_norm"));
    *norm = dv.norm;
    return MB_OK;
}
MBDEF float *mb_adamw_m(mb_adamw *o) { return o ? o->m : NULL; }
MBDEF float *mb_adamw_v(mb_adamw *o) { return o ? o->v : NULL; }
MBDEF mb_result mb_adamw_set_steps(mb_adamw *o, int64_t steps) {
    mb__adamw_dev dv;
    if (!o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_set_steps: NULL optimizer");
    if (steps < 0) return MB_FAIL(&o->params->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_adamw_set_steps: %lld < 0", (long long)steps);
    MB_TRY(mb__adamw_fetch(o, &dv, "mb_adamw_set_steps"));
    dv.step = steps;
    MB_TRY(mb_copy(o->params->dev, MB_STREAM_COMPUTE, o->dv, &dv, sizeof dv));
    return mb_sync(o->params->dev, MB_STREAM_COMPUTE);
}

static mb_result mb__lr_check(const mb_lr_schedule *s, int64_t step) {
    if (!(s->lr > 0.0f) || !mb__finite_f(s->lr))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: lr %g must be finite and > 0", (double)s->lr);
    if (step < 0) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: step %lld < 0", (long long)step);
    if (s->kind == MB_LR_CONSTANT) return MB_OK;
    if (s->kind != MB_LR_WARMUP_COSINE && s->kind != MB_LR_ONE_CYCLE)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: unknown schedule kind %d", (int)s->kind);
    if (s->total_steps < 2 || step >= s->total_steps)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: step %lld outside the schedule's total_steps %lld "
                       "(which must be >= 2)", (long long)step, (long long)s->total_steps);
    if (s->kind == MB_LR_WARMUP_COSINE &&
        (s->warmup_steps < 0 || s->warmup_steps >= s->total_steps || !(s->min_lr >= 0.0f && s->min_lr < s->lr)))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: warmup_steps %lld must be in [0, total_steps) and "
                       "min_lr %g in [0, lr)", (long long)s->warmup_steps, (double)s->min_lr);
    if (s->kind == MB_LR_ONE_CYCLE && (!(s->pct_start >= 0.0f && s->pct_start < 1.0f) || !(s->div_factor >= 0.0f) ||
                                       !(s->final_div_factor >= 0.0f)))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: one-cycle pct_start %g must be in [0, 1), div factors "
                       ">= 0 (0 = default)", (double)s->pct_start);
    return MB_OK;
}

MBDEF mb_result mb_lr_at(const mb_lr_schedule *s, int64_t step, float *lr) {
    if (!s || !lr) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_lr_at: NULL argument");
    MB_TRY(mb__lr_check(s, step));
    *lr = mb__lr_value(s, step);
    return MB_OK;
}

MBDEF const char *mb_lr_kind_name(mb_lr_kind kind) {
    static const char *const names[] = {"constant", "cosine", "onecycle"}; /* mb_lr_kind's order */
    return (int)kind >= 0 && (int)kind < (int)(sizeof names / sizeof *names) ? names[(int)kind] : NULL;
}

// -- averaging --

struct mb_avg {
    mb_params *params;
    mb_avg_config cfg;    /* defaults filled in */
    float w;              /* EMA: (float)(1 - decay), as torch passes the lerp weight */
    float *avg;           /* (total) the averaged weights, device */
    mb__avg_dev *st;      /* device */
    int swapped;
};

MBDEF mb_result mb_avg_create(mb_avg **out, mb_params *p, const mb_avg_config *cfg) {
    if (!out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_avg_create: NULL out");
    *out = NULL;
    MB_TRY(mb__params_ready(p, "mb_avg_create"));
    mb_avg_config c;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    if (c.kind != MB_AVG_EMA && c.kind != MB_AVG_SWA)
        return MB_FAIL(&p->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_avg_create: unknown kind %d", (int)c.kind);
    if (c.kind == MB_AVG_EMA && c.decay == 0.0) c.decay = 0.999;
    if (c.kind == MB_AVG_EMA && !(c.decay > 0.0 && c.decay < 1.0))
        return MB_FAIL(&p->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_avg_create: EMA decay %g must be in (0, 1)", c.decay);
    if (c.kind == MB_AVG_SWA) c.decay = 0.0;
    mb_avg *a = (mb_avg *)mb__host_calloc(1, sizeof *a);
    if (!a) return MB_FAIL(&p->dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_avg_create: no host memory");
    a->params = p;
    a->cfg = c;
    a->w = (float)(1.0 - c.decay);
    mb__avg_dev st;
    memset(&st, 0, sizeof st);
    mb_result r = mb_alloc(p->dev, MB_MEM_DEVICE, p->total * sizeof(float), (void **)&a->avg);
    if (r == MB_OK) r = mb_alloc(p->dev, MB_MEM_DEVICE, sizeof st, (void **)&a->st);
    if (r == MB_OK) r = mb_zero(p->dev, MB_STREAM_COMPUTE, a->avg, p->total * sizeof(float));
    if (r == MB_OK) r = mb_copy(p->dev, MB_STREAM_COMPUTE, a->st, &st, sizeof st);
    if (r == MB_OK) r = mb_sync(p->dev, MB_STREAM_COMPUTE); /* st: a stack copy */
    if (r != MB_OK) { mb_avg_destroy(a); return r; }
    *out = a;
    return MB_OK;
}

MBDEF void mb_avg_destroy(mb_avg *a) {
    if (!a) return;
    mb_free(a->params->dev, a->avg);
    mb_free(a->params->dev, a->st);
    MB_FREE(a);
}

MBDEF mb_result mb_avg_update(mb_avg *a, const mb_adamw *after) {
    if (!a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_avg_update: NULL average");
    mb_device *dev = a->params->dev;
    if (a->swapped)
        return MB_FAIL(&dev->cfg.log, MB_ERR_STATE, "mb_avg_update: the averaged weights are swapped in (swap back first)");
    if (after && after->params != a->params)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_avg_update: the optimizer is over other parameters");
    return dev->be->optim->avg(dev, a->st, after ? after->dv : NULL, a->cfg.kind == MB_AVG_SWA, a->w, a->avg,
                               a->params->data, a->params->total);
}

MBDEF mb_result mb_avg_swap(mb_avg *a) {
    if (!a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_avg_swap: NULL average");
    mb_device *dev = a->params->dev;
    MB_TRY(dev->be->optim->avg_swap(dev, a->avg, a->params->data, a->params->total));
    a->swapped = !a->swapped;
    return MB_OK;
}

MBDEF int mb_avg_swapped(const mb_avg *a) { return a ? a->swapped : 0; }
MBDEF float *mb_avg_data(mb_avg *a) { return a ? a->avg : NULL; }
MBDEF mb_avg_config mb_avg_get_config(const mb_avg *a) {
    mb_avg_config c;
    memset(&c, 0, sizeof c);
    return a ? a->cfg : c;
}

MBDEF mb_result mb_avg_count(mb_avg *a, int64_t *n) {
    mb__avg_dev st;
    if (!a || !n) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_avg_count: NULL argument");
    MB_TRY(mb_copy(a->params->dev, MB_STREAM_COMPUTE, &st, a->st, sizeof st));
    MB_TRY(mb_sync(a->params->dev, MB_STREAM_COMPUTE));
    *n = st.n;
    return MB_OK;
}

MBDEF mb_result mb_avg_set_count(mb_avg *a, int64_t n) {
    mb__avg_dev st;
    if (!a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_avg_set_count: NULL average");
    if (n < 0) return MB_FAIL(&a->params->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_avg_set_count: %lld < 0", (long long)n);
    memset(&st, 0, sizeof st);
    st.n = n;
    MB_TRY(mb_copy(a->params->dev, MB_STREAM_COMPUTE, a->st, &st, sizeof st));
    return mb_sync(a->params->dev, MB_STREAM_COMPUTE);
}

// ---- accum ----

MBDEF mb_result mb_accum_init(mb_accum *a, int n) { return mb_accum_restore(a, n, 0, 0); }

MBDEF mb_result mb_accum_restore(mb_accum *a, int n, int micro, int64_t windows) {
    if (!a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_accum: NULL state");
    if (n < 1) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_accum: n = %d micro-batches per step, must be >= 1", n);
    if (micro < 0 || micro >= n || windows < 0)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_accum: micro %d must be in 0..%d and windows %lld >= 0", micro,
                       n - 1, (long long)windows);
    a->n = n;
    a->micro = micro;
    a->windows = windows;
    return MB_OK;
}

MBDEF float mb_accum_loss_scale(const mb_accum *a) { return 1.0f / (float)a->n; }
MBDEF int mb_accum_window_start(const mb_accum *a) { return a->micro == 0; }
MBDEF int mb_accum_tick(mb_accum *a) {
    if (++a->micro < a->n) return 0;
    a->micro = 0;
    a->windows++;
    return 1;
}

// ---- step ----
// What a training step needs so that nothing of it changes from step to step (issue 15): the
// learning rate from the schedule on the device, and (mb_meter below) losses summed on the device
// and read without a host sync.

MBDEF mb_result mb_adamw_step_scheduled(mb_adamw *o, const mb_lr_schedule *s, mb_scaler *scaler) {
    if (!o || !s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_step_scheduled: NULL argument");
    MB_TRY(mb__lr_check(s, 0));
    return mb__adamw_step(o, 0.0f, s, scaler);
}

/* The device state for a getter whose output pointer is out (checked). */
static mb_result mb__adamw_read(mb_adamw *o, const void *out, mb__adamw_dev *dv, const char *what) {
    memset(dv, 0, sizeof *dv);
    if (!out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "%s: NULL argument", what);
    return mb__adamw_fetch(o, dv, what);
}

MBDEF mb_result mb_adamw_schedule_step(mb_adamw *o, int64_t *step) {
    mb__adamw_dev dv;
    MB_TRY(mb__adamw_read(o, step, &dv, "mb_adamw_schedule_step"));
    *step = dv.sched_step;
    return MB_OK;
}

MBDEF mb_result mb_adamw_last_lr(mb_adamw *o, float *lr) {
    mb__adamw_dev dv;
    MB_TRY(mb__adamw_read(o, lr, &dv, "mb_adamw_last_lr"));
    *lr = dv.lr;
    return MB_OK;
}

MBDEF mb_result mb_adamw_set_schedule_step(mb_adamw *o, int64_t step) {
    mb__adamw_dev dv;
    memset(&dv, 0, sizeof dv);
    if (!o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_adamw_set_schedule_step: NULL optimizer");
    if (step < 0)
        return MB_FAIL(&o->params->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_adamw_set_schedule_step: %lld < 0",
                       (long long)step);
    MB_TRY(mb__adamw_fetch(o, &dv, "mb_adamw_set_schedule_step"));
    dv.sched_step = step;
    MB_TRY(mb_copy(o->params->dev, MB_STREAM_COMPUTE, o->dv, &dv, sizeof dv));
    return mb_sync(o->params->dev, MB_STREAM_COMPUTE);
}

/* The backend's step group: events for mb_meter's reads. done = 1 when the work queued before
 * the record is complete (wait = 1: wait for it). */
typedef struct mb__step_ops {
    mb_result (*event_create)(mb_device *dev, void **ev);
    void (*event_destroy)(void *ev);
    mb_result (*event_record)(mb_device *dev, int stream, void *ev);
    mb_result (*event_done)(mb_device *dev, void *ev, int wait, int *done);
} mb__step_ops;
MB__OPS_CHECK(mb__step_ops, 4);

/* The CPU's events: work is done when a call returns, nothing to wait for. */
static mb_result mb__cpu_event_create(mb_device *dev, void **ev) {
    (void)dev;
    *ev = NULL;
    return MB_OK;
}
static void mb__cpu_event_destroy(void *ev) { (void)ev; }
static mb_result mb__cpu_event_record(mb_device *dev, int stream, void *ev) {
    (void)dev; (void)stream; (void)ev;
    return MB_OK;
}
static mb_result mb__cpu_event_done(mb_device *dev, void *ev, int wait, int *done) {
    (void)dev; (void)ev; (void)wait;
    *done = 1;
    return MB_OK;
}

MB__OPS_BEGIN
static const mb__step_ops mb__cpu_step_ops = {
    .event_create = mb__cpu_event_create, .event_destroy = mb__cpu_event_destroy,
    .event_record = mb__cpu_event_record, .event_done = mb__cpu_event_done,
};
MB__OPS_END

struct mb_meter {
    mb_device *dev;
    int slots, depth;
    double *sums;     /* device: slots x {sum, weight} */
    double *pinned;   /* pinned: depth reads of slots x {sum, weight}, a ring */
    double *last;     /* host: the last landed read */
    double *prev;     /* host: the read landed before it, or 0s after a reset (mb_meter_delta) */
    void **ev;        /* per ring entry: recorded after its read's copy */
    unsigned char *reset; /* per ring entry: its read zeroed the sums behind the copy */
    int head, pending; /* the oldest read in flight; reads in flight */
    int from_zero;    /* the last landed read reset: the next one's delta counts from 0 */
    int64_t reads;    /* reads landed */
};

MBDEF void mb_meter_destroy(mb_meter *m) {
    if (!m) return;
    if (m->pending) mb_meter_wait(m); /* the copies must land before their buffers go */
    for (int i = 0; m->ev && i < m->depth; i++)
        if (m->ev[i]) m->dev->be->step->event_destroy(m->ev[i]);
    mb_free(m->dev, m->sums);
    mb_free(m->dev, m->pinned);
    MB_FREE(m->ev);
    MB_FREE(m->reset);
    MB_FREE(m->last); /* and prev: one block */
    MB_FREE(m);
}

MBDEF mb_result mb_meter_create(mb_meter **out, mb_device *dev, int slots, int depth) {
    if (!out || !dev) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_create: NULL argument");
    *out = NULL;
    if (slots < 1 || slots > 1 << 20)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_meter_create: slots = %d, want 1..2^20", slots);
    if (depth < 1 || depth > 4096)
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_meter_create: depth = %d, want 1..4096", depth);
    mb_meter *m = (mb_meter *)mb__host_calloc(1, sizeof *m);
    size_t bytes = (size_t)slots * 2 * sizeof(double);
    if (m) m->last = (double *)mb__host_calloc((size_t)slots * 4, sizeof(double));
    if (m) m->ev = (void **)mb__host_calloc((size_t)depth, sizeof(void *));
    if (m) m->reset = (unsigned char *)mb__host_calloc((size_t)depth, 1);
    if (!m || !m->last || !m->ev || !m->reset) {
        if (m) { MB_FREE(m->last); MB_FREE(m->ev); MB_FREE(m->reset); }
        MB_FREE(m);
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_meter_create: no host memory");
    }
    m->dev = dev;
    m->slots = slots;
    m->depth = depth;
    m->prev = m->last + (size_t)slots * 2;
    m->from_zero = 1; /* the sums start zeroed */
    mb_result r = mb_alloc(dev, MB_MEM_DEVICE, bytes, (void **)&m->sums);
    if (r == MB_OK) r = mb_alloc(dev, MB_MEM_PINNED, bytes * (size_t)depth, (void **)&m->pinned);
    for (int i = 0; r == MB_OK && i < depth; i++) r = dev->be->step->event_create(dev, &m->ev[i]);
    if (r == MB_OK) r = mb_zero(dev, MB_STREAM_COMPUTE, m->sums, bytes);
    if (r == MB_OK) r = mb_sync(dev, MB_STREAM_COMPUTE);
    if (r != MB_OK) { mb_meter_destroy(m); return r; }
    *out = m;
    return MB_OK;
}

MBDEF double *mb_meter_slot(mb_meter *m, int slot) {
    return m && slot >= 0 && slot < m->slots ? m->sums + 2 * slot : NULL;
}

MBDEF mb_result mb_meter_read(mb_meter *m, int stream, int reset) {
    if (!m) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_read: NULL meter");
    MB_TRY(mb__check_stream(m->dev, stream, "mb_meter_read"));
    if (m->pending == m->depth)
        return MB_FAIL(&m->dev->cfg.log, MB_ERR_STATE, "mb_meter_read: %d reads are in flight, the meter's depth "
                       "(mb_meter_next or mb_meter_wait first)", m->depth);
    size_t n = (size_t)m->slots * 2, bytes = n * sizeof(double);
    int i = (m->head + m->pending) % m->depth;
    MB_TRY(mb_copy(m->dev, stream, m->pinned + (size_t)i * n, m->sums, bytes));
    MB_TRY(m->dev->be->step->event_record(m->dev, stream, m->ev[i]));
    if (reset) MB_TRY(mb_zero(m->dev, stream, m->sums, bytes));
    m->reset[i] = (unsigned char)(reset != 0);
    m->pending++;
    return MB_OK;
}

MBDEF mb_result mb_meter_next(mb_meter *m, int wait, int *landed) {
    if (!m || !landed) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_next: NULL argument");
    int done = 0;
    if (m->pending) MB_TRY(m->dev->be->step->event_done(m->dev, m->ev[m->head], wait, &done));
    *landed = done;
    if (!done) return MB_OK;
    size_t n = (size_t)m->slots * 2;
    if (m->from_zero) memset(m->prev, 0, n * sizeof(double));
    else memcpy(m->prev, m->last, n * sizeof(double));
    memcpy(m->last, m->pinned + (size_t)m->head * n, n * sizeof(double));
    m->from_zero = m->reset[m->head];
    m->head = (m->head + 1) % m->depth;
    m->pending--;
    m->reads++;
    return MB_OK;
}

MBDEF mb_result mb_meter_wait(mb_meter *m) {
    if (!m) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_wait: NULL meter");
    int landed;
    while (m->pending) MB_TRY(mb_meter_next(m, 1, &landed));
    return MB_OK;
}

MBDEF mb_result mb_meter_value(const mb_meter *m, int slot, double *sum, double *weight) {
    if (!m || !sum || !weight) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_value: NULL argument");
    if (slot < 0 || slot >= m->slots)
        return MB_FAIL(&m->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_meter_value: slot %d of %d", slot, m->slots);
    *sum = m->last[2 * slot];
    *weight = m->last[2 * slot + 1];
    return MB_OK;
}

MBDEF int64_t mb_meter_reads(const mb_meter *m) { return m ? m->reads : 0; }
MBDEF int mb_meter_pending(const mb_meter *m) { return m ? m->pending : 0; }

/* Land reads in order, on_read for each: every one in flight (wait = 1), else those that have
 * landed, and the oldest waited for when all `depth` ring entries are in flight. */
static mb_result mb__meter_land(mb_meter *m, int wait, mb_meter_fn on_read, void *user) {
    int landed = 1;
    while (m->pending && landed) {
        MB_TRY(mb_meter_next(m, wait || m->pending == m->depth, &landed));
        if (landed && on_read) MB_TRY(on_read(user, m, m->reads - 1));
    }
    return MB_OK;
}

MBDEF mb_result mb_meter_step(mb_meter *m, int stream, mb_meter_fn on_read, void *user, int64_t *id) {
    if (!m) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_step: NULL meter");
    MB_TRY(mb__check_stream(m->dev, stream, "mb_meter_step"));
    MB_TRY(mb__meter_land(m, 0, on_read, user));
    if (id) *id = m->reads + m->pending;
    return mb_meter_read(m, stream, 0);
}

MBDEF mb_result mb_meter_fold(mb_meter *m, int stream, mb_meter_fn on_read, void *user) {
    if (!m) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_fold: NULL meter");
    MB_TRY(mb__check_stream(m->dev, stream, "mb_meter_fold"));
    MB_TRY(mb__meter_land(m, 1, on_read, user));
    MB_TRY(mb_meter_read(m, stream, 1));
    return mb_meter_wait(m);
}

MBDEF mb_result mb_meter_delta(const mb_meter *m, int slot, double *sum, double *weight) {
    if (!m || !sum || !weight) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_meter_delta: NULL argument");
    if (slot < 0 || slot >= m->slots)
        return MB_FAIL(&m->dev->cfg.log, MB_ERR_INVALID_ARG, "mb_meter_delta: slot %d of %d", slot, m->slots);
    *sum = m->last[2 * slot] - m->prev[2 * slot];
    *weight = m->last[2 * slot + 1] - m->prev[2 * slot + 1];
    return MB_OK;
}

// ---- end step ----

// ---- checkpoint ----

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#define MB__CKPT_MAGIC "MBCKPT01"
#define MB__CKPT_HEADER 24u   /* magic 8, version 4, count 4, file size 8 */
#define MB__CKPT_PATH 4096    /* bytes of a checkpoint path, with the NUL */

typedef struct mb__ckpt_blob { char name[MB_MAX_NAME]; size_t bytes; unsigned char *data; size_t off; } mb__ckpt_blob;

struct mb_ckpt_writer {
    mb_device *dev;
    mb__ckpt_blob *sec;
    int n, cap;
};

struct mb_ckpt_reader {
    mb_device *dev;
    char path[256];          /* for messages (truncated) */
    unsigned char *buf;      /* the whole file */
    size_t size;
    mb__ckpt_blob *sec;      /* data points into buf */
    int n;
};

static const mb_logger *mb__ckpt_log(mb_device *dev) { return dev ? &dev->cfg.log : NULL; }

/* Host memory: tracked through the device when there is one (failure injection). */
static mb_result mb__ckpt_alloc(mb_device *dev, size_t bytes, void **out) {
    if (dev) return mb_alloc(dev, MB_MEM_HOST, bytes, out);
    if (!(*out = mb__host_alloc(bytes)))
        return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "checkpoint: no host memory for %zu bytes", bytes);
    return MB_OK;
}
static void mb__ckpt_free(mb_device *dev, void *p) {
    if (dev) mb_free(dev, p);
    else MB_FREE(p);
}

/* CRC-32 (IEEE 802.3, reflected 0xEDB88320; the value zlib's crc32 gives). */
typedef struct mb__crc32 { uint32_t table[256]; uint32_t crc; } mb__crc32;
static void mb__crc32_init(mb__crc32 *c) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t v = i;
        for (int k = 0; k < 8; k++) v = (v >> 1) ^ (0xEDB88320u & (0u - (v & 1u)));
        c->table[i] = v;
    }
    c->crc = 0xFFFFFFFFu;
}
static void mb__crc32_update(mb__crc32 *c, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t v = c->crc;
    for (size_t i = 0; i < n; i++) v = c->table[(v ^ p[i]) & 0xFFu] ^ (v >> 8);
    c->crc = v;
}
static uint32_t mb__crc32_final(const mb__crc32 *c) { return c->crc ^ 0xFFFFFFFFu; }

static void mb__put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t mb__get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static mb_result mb__ckpt_check_name(const mb_logger *lg, const char *name, const char *what) {
    if (!name || !name[0] || strlen(name) >= MB_MAX_NAME)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: section name '%s' must be 1..%d bytes", what,
                       name ? name : "(null)", MB_MAX_NAME - 1);
    return MB_OK;
}

MBDEF mb_result mb_ckpt_writer_create(mb_ckpt_writer **out, mb_device *dev) {
    if (!out) return MB_FAIL(mb__ckpt_log(dev), MB_ERR_INVALID_ARG, "mb_ckpt_writer_create: out is NULL");
    *out = NULL;
    mb_ckpt_writer *w = NULL;
    MB_TRY(mb__ckpt_alloc(dev, sizeof *w, (void **)&w));
    mb_ckpt_writer zero;
    memset(&zero, 0, sizeof zero);
    zero.dev = dev;
    *w = zero;
    *out = w;
    return MB_OK;
}

MBDEF void mb_ckpt_writer_destroy(mb_ckpt_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) mb__ckpt_free(w->dev, w->sec[i].data);
    mb__ckpt_free(w->dev, w->sec);
    mb__ckpt_free(w->dev, w);
}

static mb_result mb__ckpt_grow(mb_ckpt_writer *w) {
    if (w->n < w->cap) return MB_OK;
    int cap = w->cap ? w->cap * 2 : 16;
    mb__ckpt_blob *s = NULL;
    MB_TRY(mb__ckpt_alloc(w->dev, (size_t)cap * sizeof *s, (void **)&s));
    if (w->n) memcpy(s, w->sec, (size_t)w->n * sizeof *s);
    mb__ckpt_free(w->dev, w->sec);
    w->sec = s;
    w->cap = cap;
    return MB_OK;
}

MBDEF mb_result mb_ckpt_add(mb_ckpt_writer *w, const char *name, const void *data, size_t bytes) {
    if (!w) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add: writer is NULL");
    const mb_logger *lg = mb__ckpt_log(w->dev);
    MB_TRY(mb__ckpt_check_name(lg, name, "mb_ckpt_add"));
    if (bytes && !data) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_add: '%s': NULL data for %zu bytes", name, bytes);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->sec[i].name, name) == 0)
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_add: section '%s' added twice", name);
    MB_TRY(mb__ckpt_grow(w));
    unsigned char *copy = NULL;
    MB_TRY(mb__ckpt_alloc(w->dev, bytes, (void **)&copy));
    mb_result r = MB_OK;
    if (w->dev) {
        r = mb_copy(w->dev, MB_STREAM_COMPUTE, copy, data, bytes);
        if (r == MB_OK) r = mb_sync(w->dev, MB_STREAM_COMPUTE);
    } else if (bytes) {
        memcpy(copy, data, bytes);
    }
    if (r != MB_OK) { mb__ckpt_free(w->dev, copy); return r; }
    mb__ckpt_blob *s = &w->sec[w->n++];
    memset(s, 0, sizeof *s);
    strcpy(s->name, name);
    s->bytes = bytes;
    s->data = copy;
    return MB_OK;
}

/* write(2) all of it (retrying short writes and EINTR), feeding the CRC. 0 on success. */
static int mb__ckpt_write_all(int fd, const void *data, size_t n, mb__crc32 *crc) {
    const unsigned char *p = (const unsigned char *)data;
    if (crc) mb__crc32_update(crc, data, n);
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        mb__ssize k = mb__os_write(fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) { errno = EIO; return -1; }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int mb__ckpt_write_file(mb_ckpt_writer *w, int fd, uint64_t total) {
    mb__crc32 crc;
    unsigned char hdr[MB__CKPT_HEADER], sh[12];
    mb__crc32_init(&crc);
    memcpy(hdr, MB__CKPT_MAGIC, 8);
    mb__put_le(hdr + 8, MB_CKPT_VERSION, 4);
    mb__put_le(hdr + 12, (uint64_t)w->n, 4);
    mb__put_le(hdr + 16, total, 8);
    if (mb__ckpt_write_all(fd, hdr, sizeof hdr, &crc)) return -1;
    for (int i = 0; i < w->n; i++) {
        size_t len = strlen(w->sec[i].name);
        mb__put_le(sh, len, 4);
        if (mb__ckpt_write_all(fd, sh, 4, &crc) || mb__ckpt_write_all(fd, w->sec[i].name, len, &crc)) return -1;
        mb__put_le(sh, w->sec[i].bytes, 8);
        if (mb__ckpt_write_all(fd, sh, 8, &crc) || mb__ckpt_write_all(fd, w->sec[i].data, w->sec[i].bytes, &crc))
            return -1;
    }
    mb__put_le(sh, mb__crc32_final(&crc), 4);
    if (mb__ckpt_write_all(fd, sh, 4, NULL)) return -1;
    return mb__os_fsync(fd);
}

/* fsync the directory holding path, so the rename itself is durable. */
static int mb__ckpt_sync_dir(const char *path) { return mb__os_sync_dir(path); }

MBDEF mb_result mb_ckpt_write(mb_ckpt_writer *w, const char *path) {
    if (!w || !path || !path[0]) return MB_FAIL(w ? mb__ckpt_log(w->dev) : NULL, MB_ERR_INVALID_ARG,
                                                "mb_ckpt_write: NULL writer or empty path");
    const mb_logger *lg = mb__ckpt_log(w->dev);
    char tmp[MB__CKPT_PATH];
    if (strlen(path) + 5 > sizeof tmp)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_write: path of %zu bytes is too long", strlen(path));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint64_t total = MB__CKPT_HEADER + 4;
    for (int i = 0; i < w->n; i++) total += 12 + strlen(w->sec[i].name) + (uint64_t)w->sec[i].bytes;
    int fd = mb__os_open(tmp, 1);
    if (fd < 0)
        return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_write: cannot create '%s': %s", tmp, strerror(errno));
    int rc = mb__ckpt_write_file(w, fd, total), err = errno;
    if (mb__os_close(fd) != 0 && rc == 0) { rc = -1; err = errno; }
    if (rc != 0) {
        mb__os_unlink(tmp);
        return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_write: writing %llu bytes to '%s' failed: %s (previous '%s' "
                       "left untouched)", (unsigned long long)total, tmp, strerror(err), path);
    }
    if (mb__os_replace(tmp, path) != 0) {
        err = errno;
        mb__os_unlink(tmp);
        return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_write: cannot rename '%s' to '%s': %s", tmp, path, strerror(err));
    }
    if (mb__ckpt_sync_dir(path) != 0)
        return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_write: '%s' written but syncing its directory failed: %s", path,
                       strerror(errno));
    return MB_OK;
}

/* Read the whole file into r->buf. */
static mb_result mb__ckpt_slurp(mb_ckpt_reader *r, const char *path) {
    const mb_logger *lg = mb__ckpt_log(r->dev);
    int fd = mb__os_open(path, 0);
    if (fd < 0) return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_open: cannot open '%s': %s", path, strerror(errno));
    mb__stat st;
    int got = mb__os_fstat(fd, &st) == 0;
    if (!got || !MB__S_ISREG(st.st_mode) || (uint64_t)st.st_size > (uint64_t)SIZE_MAX / 2) {
        mb__os_close(fd);
        if (got && MB__S_ISDIR(st.st_mode)) return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_open: '%s' is a directory", path);
        return MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_open: '%s' is not a regular file of a readable size", path);
    }
    r->size = (size_t)st.st_size;
    mb_result res = mb__ckpt_alloc(r->dev, r->size, (void **)&r->buf);
    for (size_t got = 0; res == MB_OK && got < r->size;) {
        mb__ssize k = mb__os_read(fd, r->buf + got, r->size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            res = MB_FAIL(lg, MB_ERR_IO, "mb_ckpt_open: reading '%s' failed at byte %zu of %zu: %s", path, got,
                          r->size, k < 0 ? strerror(errno) : "file shrank");
        else got += (size_t)k;
    }
    mb__os_close(fd);
    return res;
}

/* Magic, size, CRC, version: before any section is looked at. */
static mb_result mb__ckpt_verify(mb_ckpt_reader *r, const char *path) {
    const mb_logger *lg = mb__ckpt_log(r->dev);
    const unsigned char *b = r->buf;
    if (r->size < MB__CKPT_HEADER + 4)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s' is truncated: %zu bytes, less than a header",
                       path, r->size);
    if (memcmp(b, MB__CKPT_MAGIC, 8) != 0)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s' has a bad magic (not a megabatch checkpoint)", path);
    uint64_t want = mb__get_le(b + 16, 8);
    if (want != (uint64_t)r->size)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s' is %zu bytes but its header says %llu (%s)", path,
                       r->size, (unsigned long long)want, want > r->size ? "truncated" : "bad size field");
    mb__crc32 crc;
    mb__crc32_init(&crc);
    mb__crc32_update(&crc, b, r->size - 4);
    uint32_t got = mb__crc32_final(&crc), stored = (uint32_t)mb__get_le(b + r->size - 4, 4);
    if (got != stored)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s' fails its checksum (CRC-32 %08x, stored %08x)", path,
                       (unsigned)got, (unsigned)stored);
    uint32_t version = (uint32_t)mb__get_le(b + 8, 4);
    if (version != MB_CKPT_VERSION)
        return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_ckpt_open: '%s' has format version %u, this build reads %d",
                       path, (unsigned)version, MB_CKPT_VERSION);
    return MB_OK;
}

/* Walk the sections, checking every bound (a file with a valid CRC may still lie). */
static mb_result mb__ckpt_parse(mb_ckpt_reader *r, const char *path) {
    const mb_logger *lg = mb__ckpt_log(r->dev);
    size_t end = r->size - 4, pos = MB__CKPT_HEADER;
    uint64_t count = mb__get_le(r->buf + 12, 4);
    if (count > (end - pos) / 13)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s' claims %llu sections in %zu bytes", path,
                       (unsigned long long)count, r->size);
    MB_TRY(mb__ckpt_alloc(r->dev, (size_t)count * sizeof *r->sec, (void **)&r->sec));
    for (uint64_t i = 0; i < count; i++) {
        mb__ckpt_blob *s = &r->sec[i];
        uint64_t len = end - pos >= 4 ? mb__get_le(r->buf + pos, 4) : UINT64_MAX;
        if (len == 0 || len >= MB_MAX_NAME || len + 12 > end - pos)
            return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s': section %llu has a bad name length", path,
                           (unsigned long long)i);
        memcpy(s->name, r->buf + pos + 4, (size_t)len);
        s->name[len] = 0;
        uint64_t bytes = mb__get_le(r->buf + pos + 4 + len, 8);
        pos += 12 + (size_t)len;
        if (bytes > end - pos)
            return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s': section '%s' of %llu bytes runs past the end",
                           path, s->name, (unsigned long long)bytes);
        s->bytes = (size_t)bytes;
        s->data = r->buf + pos;
        pos += (size_t)bytes;
        r->n = (int)i + 1;
    }
    if (pos != end)
        return MB_FAIL(lg, MB_ERR_CORRUPT, "mb_ckpt_open: '%s': %zu stray bytes after the last section", path, end - pos);
    return MB_OK;
}

MBDEF mb_result mb_ckpt_open(mb_ckpt_reader **out, mb_device *dev, const char *path) {
    const mb_logger *lg = mb__ckpt_log(dev);
    if (!out || !path) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_open: NULL argument");
    *out = NULL;
    mb_ckpt_reader *r = NULL;
    MB_TRY(mb__ckpt_alloc(dev, sizeof *r, (void **)&r));
    memset(r, 0, sizeof *r);
    r->dev = dev;
    snprintf(r->path, sizeof r->path, "%s", path);
    mb_result res = mb__ckpt_slurp(r, path);
    if (res == MB_OK) res = mb__ckpt_verify(r, path);
    if (res == MB_OK) res = mb__ckpt_parse(r, path);
    if (res != MB_OK) { mb_ckpt_close(r); return res; }
    *out = r;
    return MB_OK;
}

MBDEF void mb_ckpt_close(mb_ckpt_reader *r) {
    if (!r) return;
    mb__ckpt_free(r->dev, r->sec);
    mb__ckpt_free(r->dev, r->buf);
    mb__ckpt_free(r->dev, r);
}

static const mb__ckpt_blob *mb__ckpt_find(const mb_ckpt_reader *r, const char *name) {
    for (int i = 0; name && i < r->n; i++)
        if (strcmp(r->sec[i].name, name) == 0) return &r->sec[i];
    return NULL;
}

MBDEF int mb_ckpt_has(const mb_ckpt_reader *r, const char *name, size_t *bytes) {
    const mb__ckpt_blob *s = r ? mb__ckpt_find(r, name) : NULL;
    if (s && bytes) *bytes = s->bytes;
    return s != NULL;
}

/* The section, checked to hold exactly `bytes` bytes. */
static mb_result mb__ckpt_section(mb_ckpt_reader *r, const char *name, size_t bytes, const mb__ckpt_blob **out) {
    const mb_logger *lg = mb__ckpt_log(r->dev);
    const mb__ckpt_blob *s = mb__ckpt_find(r, name);
    if (!s) return MB_FAIL(lg, MB_ERR_FORMAT, "mb_ckpt_get: '%s' has no section '%s'", r->path, name ? name : "(null)");
    if (s->bytes != bytes)
        return MB_FAIL(lg, MB_ERR_FORMAT, "mb_ckpt_get: section '%s' of '%s' holds %zu bytes, the caller expects %zu",
                       name, r->path, s->bytes, bytes);
    *out = s;
    return MB_OK;
}

MBDEF mb_result mb_ckpt_get(mb_ckpt_reader *r, const char *name, void *dst, size_t bytes) {
    if (!r) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_get: reader is NULL");
    const mb__ckpt_blob *s;
    MB_TRY(mb__ckpt_section(r, name, bytes, &s));
    if (bytes && !dst) return MB_FAIL(mb__ckpt_log(r->dev), MB_ERR_INVALID_ARG, "mb_ckpt_get: '%s': NULL dst", name);
    if (!r->dev) { if (bytes) memcpy(dst, s->data, bytes); return MB_OK; }
    MB_TRY(mb_copy(r->dev, MB_STREAM_COMPUTE, dst, s->data, bytes));
    return mb_sync(r->dev, MB_STREAM_COMPUTE);
}

/* -- training-state helpers -- */

/* One line per tensor, "name [d0,d1]\n"; into buf (NULL: just the length). */
static size_t mb__ckpt_layout_line(const mb_param_info *t, char *buf, size_t cap) {
    char line[MB_MAX_NAME + 32 * MB_MAX_RANK + 8];
    int k = snprintf(line, sizeof line, "%s [", t->name);
    for (int d = 0; d < t->rank; d++) k += snprintf(line + k, sizeof line - (size_t)k, "%s%lld", d ? "," : "",
                                                    (long long)t->shape[d]);
    k += snprintf(line + k, sizeof line - (size_t)k, "]\n");
    if (buf && (size_t)k <= cap) memcpy(buf, line, (size_t)k);
    return (size_t)k;
}

static mb_result mb__ckpt_layout(mb_params *p, char **out, size_t *len) {
    size_t n = 0;
    for (int i = 0; i < mb_params_num_tensors(p); i++) n += mb__ckpt_layout_line(mb_params_info(p, i), NULL, 0);
    MB_TRY(mb__ckpt_alloc(p->dev, n + 1, (void **)out));
    size_t k = 0;
    for (int i = 0; i < mb_params_num_tensors(p); i++) k += mb__ckpt_layout_line(mb_params_info(p, i), *out + k, n - k);
    (*out)[n] = 0;
    *len = n;
    return MB_OK;
}

MBDEF mb_result mb_ckpt_add_params(mb_ckpt_writer *w, mb_params *p) {
    if (!w) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add_params: writer is NULL");
    MB_TRY(mb__params_ready(p, "mb_ckpt_add_params"));
    char *layout;
    size_t len;
    MB_TRY(mb__ckpt_layout(p, &layout, &len));
    mb_result r = mb_ckpt_add(w, "params.layout", layout, len);
    mb__ckpt_free(p->dev, layout);
    MB_TRY(r);
    return mb_ckpt_add(w, "params", mb_params_data(p), mb_params_total(p) * sizeof(float));
}

/* Line `i` (0-based) of a layout text, as a NUL-terminated copy ("(none)" past the end). */
static void mb__ckpt_nth_line(const char *text, size_t len, int i, char *out, size_t cap) {
    size_t pos = 0;
    for (int k = 0; k < i && pos < len; pos++)
        if (text[pos] == '\n') k++;
    size_t e = pos;
    while (e < len && text[e] != '\n') e++;
    if (pos >= len) { snprintf(out, cap, "(none)"); return; }
    snprintf(out, cap, "%.*s", (int)(e - pos), text + pos);
}

MBDEF mb_result mb_ckpt_load_params(mb_ckpt_reader *r, mb_params *p) {
    if (!r) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_load_params: reader is NULL");
    MB_TRY(mb__params_ready(p, "mb_ckpt_load_params"));
    const mb__ckpt_blob *saved;
    size_t have;
    if (!mb_ckpt_has(r, "params.layout", &have))
        return MB_FAIL(&p->dev->cfg.log, MB_ERR_FORMAT, "mb_ckpt_load_params: '%s' has no section 'params.layout'",
                       r->path);
    MB_TRY(mb__ckpt_section(r, "params.layout", have, &saved));
    char *layout;
    size_t len;
    MB_TRY(mb__ckpt_layout(p, &layout, &len));
    if (len != saved->bytes || memcmp(layout, saved->data, len) != 0) {
        int line = 0;
        size_t i = 0;
        while (i < len && i < saved->bytes && layout[i] == (char)saved->data[i]) line += layout[i++] == '\n';
        char a[MB_MAX_NAME + 160], b[MB_MAX_NAME + 160];
        mb__ckpt_nth_line((const char *)saved->data, saved->bytes, line, a, sizeof a);
        mb__ckpt_nth_line(layout, len, line, b, sizeof b);
        mb__ckpt_free(p->dev, layout);
        return MB_FAIL(&p->dev->cfg.log, MB_ERR_FORMAT, "mb_ckpt_load_params: '%s' holds another model: tensor %d "
                       "is '%s' in the checkpoint but '%s' in this model", r->path, line, a, b);
    }
    mb__ckpt_free(p->dev, layout);
    return mb_ckpt_get(r, "params", mb_params_data(p), mb_params_total(p) * sizeof(float));
}

MBDEF mb_result mb_ckpt_add_adamw(mb_ckpt_writer *w, mb_adamw *o) {
    if (!w || !o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add_adamw: NULL argument");
    size_t bytes = mb_params_total(o->params) * sizeof(float);
    int64_t steps;
    MB_TRY(mb_adamw_steps(o, &steps));
    MB_TRY(mb_ckpt_add(w, "adamw.m", mb_adamw_m(o), bytes));
    MB_TRY(mb_ckpt_add(w, "adamw.v", mb_adamw_v(o), bytes));
    return mb_ckpt_add(w, "adamw.steps", &steps, sizeof steps);
}

MBDEF mb_result mb_ckpt_load_adamw(mb_ckpt_reader *r, mb_adamw *o) {
    if (!r || !o) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_load_adamw: NULL argument");
    size_t bytes = mb_params_total(o->params) * sizeof(float);
    const mb__ckpt_blob *s;
    MB_TRY(mb__ckpt_section(r, "adamw.m", bytes, &s)); /* everything checked before anything changes */
    MB_TRY(mb__ckpt_section(r, "adamw.v", bytes, &s));
    MB_TRY(mb__ckpt_section(r, "adamw.steps", sizeof(int64_t), &s));
    int64_t steps;
    memcpy(&steps, s->data, sizeof steps);
    if (steps < 0)
        return MB_FAIL(mb__ckpt_log(r->dev), MB_ERR_FORMAT, "mb_ckpt_load_adamw: '%s' has a negative step count %lld",
                       r->path, (long long)steps);
    MB_TRY(mb_ckpt_get(r, "adamw.m", mb_adamw_m(o), bytes));
    MB_TRY(mb_ckpt_get(r, "adamw.v", mb_adamw_v(o), bytes));
    return mb_adamw_set_steps(o, steps);
}

MBDEF mb_result mb_ckpt_add_scaler(mb_ckpt_writer *w, mb_scaler *s) {
    if (!w || !s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add_scaler: NULL argument");
    mb_scaler_state st;
    MB_TRY(mb_scaler_get(s, &st));
    int32_t v[4];
    memcpy(&v[0], &st.scale, 4);
    v[1] = st.growth_tracker; v[2] = st.found_inf; v[3] = st.last_found_inf;
    return mb_ckpt_add(w, "scaler", v, sizeof v); /* host memory: mb_copy handles it */
}

MBDEF mb_result mb_ckpt_load_scaler(mb_ckpt_reader *r, mb_scaler *s) {
    if (!r || !s) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_load_scaler: NULL argument");
    const mb__ckpt_blob *b;
    MB_TRY(mb__ckpt_section(r, "scaler", 4 * sizeof(int32_t), &b));
    int32_t v[4];
    memcpy(v, b->data, sizeof v);
    mb_scaler_state st;
    memcpy(&st.scale, &v[0], 4);
    st.growth_tracker = v[1]; st.found_inf = v[2]; st.last_found_inf = v[3];
    return mb_scaler_set(s, &st);
}

MBDEF mb_result mb_ckpt_add_avg(mb_ckpt_writer *w, mb_avg *a) {
    if (!w || !a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add_avg: NULL argument");
    if (a->swapped)
        return MB_FAIL(&a->params->dev->cfg.log, MB_ERR_STATE, "mb_ckpt_add_avg: the averaged weights are swapped in");
    int64_t st[3];
    double decay = a->cfg.decay;
    MB_TRY(mb_avg_count(a, &st[0]));
    st[1] = (int64_t)a->cfg.kind;
    memcpy(&st[2], &decay, sizeof decay);
    MB_TRY(mb_ckpt_add(w, "avg", a->avg, mb_params_total(a->params) * sizeof(float)));
    return mb_ckpt_add(w, "avg.state", st, sizeof st);
}

MBDEF mb_result mb_ckpt_load_avg(mb_ckpt_reader *r, mb_avg *a) {
    if (!r || !a) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_load_avg: NULL argument");
    if (a->swapped)
        return MB_FAIL(&a->params->dev->cfg.log, MB_ERR_STATE, "mb_ckpt_load_avg: the averaged weights are swapped in");
    const mb__ckpt_blob *s;
    MB_TRY(mb__ckpt_section(r, "avg", mb_params_total(a->params) * sizeof(float), &s)); /* checked first */
    MB_TRY(mb__ckpt_section(r, "avg.state", 3 * sizeof(int64_t), &s));
    int64_t st[3];
    double decay;
    memcpy(st, s->data, sizeof st);
    memcpy(&decay, &st[2], sizeof decay);
    if (st[0] < 0 || st[1] != (int64_t)a->cfg.kind || decay != a->cfg.decay)
        return MB_FAIL(mb__ckpt_log(r->dev), MB_ERR_FORMAT, "mb_ckpt_load_avg: '%s' holds another average (%s, decay "
                       "%g, %lld averaged) than this one (%s, decay %g)", r->path, st[1] == MB_AVG_SWA ? "SWA" : "EMA",
                       decay, (long long)st[0], a->cfg.kind == MB_AVG_SWA ? "SWA" : "EMA", a->cfg.decay);
    MB_TRY(mb_ckpt_get(r, "avg", a->avg, mb_params_total(a->params) * sizeof(float)));
    return mb_avg_set_count(a, st[0]);
}

/* -- compatibility keys: "name=value\n" lines -- */

#define MB__CKPT_KEY_VALUE 64     /* bytes of a value's text, with the NUL */
#define MB__CKPT_KEY_LINES 4096   /* lines a key section may hold */

static int mb__ckpt_key_name_ok(const char *s, size_t len) {
    if (len == 0 || len >= MB_MAX_NAME) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return 0;
    }
    return 1;
}

static const char *mb__ckpt_kind_name(mb_ckpt_kind kind) {
    switch (kind) {
    case MB_CKPT_KIND_INT: return "an integer";
    case MB_CKPT_KIND_UINT: return "an unsigned integer";
    case MB_CKPT_KIND_F32: return "a float";
    case MB_CKPT_KIND_F64: return "a double";
    }
    return "(bad kind)";
}

/* A parsed value of one kind. */
typedef struct mb__ckpt_val { int64_t i; uint64_t u; double f; } mb__ckpt_val;

/* The text of a value: 1 on success. */
static int mb__ckpt_key_format(mb_ckpt_kind kind, const mb__ckpt_val *v, char *buf) {
    switch (kind) {
    case MB_CKPT_KIND_INT: snprintf(buf, MB__CKPT_KEY_VALUE, "%lld", (long long)v->i); return 1;
    case MB_CKPT_KIND_UINT: snprintf(buf, MB__CKPT_KEY_VALUE, "%llu", (unsigned long long)v->u); return 1;
    case MB_CKPT_KIND_F32: snprintf(buf, MB__CKPT_KEY_VALUE, "%.9g", (double)(float)v->f); return 1;
    case MB_CKPT_KIND_F64: snprintf(buf, MB__CKPT_KEY_VALUE, "%.17g", v->f); return 1;
    }
    return 0;
}

/* Parse len bytes of text as a value of `kind`: the whole text, no sign on a UINT, no
 * leading blank or '+', an integer in range (a float's overflow is inf, which then differs
 * from any finite value). 1 on success. */
static int mb__ckpt_key_parse(mb_ckpt_kind kind, const char *s, size_t len, mb__ckpt_val *v) {
    char buf[MB__CKPT_KEY_VALUE], *end = NULL;
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (!(buf[0] == '-' || buf[0] == '.' || (buf[0] >= '0' && buf[0] <= '9') || buf[0] == 'i' || buf[0] == 'n'))
        return 0;
    memset(v, 0, sizeof *v);
    errno = 0;
    switch (kind) {
    case MB_CKPT_KIND_INT: v->i = (int64_t)strtoll(buf, &end, 10); break;
    case MB_CKPT_KIND_UINT:
        if (buf[0] == '-') return 0;
        v->u = (uint64_t)strtoull(buf, &end, 10);
        break;
    case MB_CKPT_KIND_F32: v->f = (double)strtof(buf, &end); errno = 0; break; /* a subnormal is a value */
    case MB_CKPT_KIND_F64: v->f = strtod(buf, &end); errno = 0; break;
    default: return 0;
    }
    return end == buf + len && errno != ERANGE; /* an integer out of range */
}

static int mb__ckpt_key_equal(mb_ckpt_kind kind, const mb__ckpt_val *a, const mb__ckpt_val *b) {
    switch (kind) {
    case MB_CKPT_KIND_INT: return a->i == b->i;
    case MB_CKPT_KIND_UINT: return a->u == b->u;
    case MB_CKPT_KIND_F32:
    case MB_CKPT_KIND_F64: return a->f == b->f || (a->f != a->f && b->f != b->f); /* NaN matches NaN */
    }
    return 0;
}

static mb__ckpt_val mb__ckpt_key_val(const mb_ckpt_key *k) {
    mb__ckpt_val v;
    v.i = k->i; v.u = k->u; v.f = k->kind == MB_CKPT_KIND_F32 ? (double)(float)k->f : k->f;
    return v;
}

/* The section's name and the entries: names, kinds, uniqueness, `before`. */
static mb_result mb__ckpt_key_valid(const mb_logger *lg, const char *what, const char *section, const mb_ckpt_key *key,
                                    int n) {
    MB_TRY(mb__ckpt_check_name(lg, section, what));
    if (n < 0 || n > MB__CKPT_KEY_LINES || (n && !key))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: %d entries at %p (0..%d)", what, n, (const void *)key,
                       MB__CKPT_KEY_LINES);
    for (int e = 0; e < n; e++) {
        const mb_ckpt_key *k = &key[e];
        mb__ckpt_val v;
        if (!k->name || !mb__ckpt_key_name_ok(k->name, strlen(k->name)))
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: entry %d's name '%s' must be 1..%d bytes of letters, digits, "
                           "'_', '-', '.'", what, e, k->name ? k->name : "(null)", MB_MAX_NAME - 1);
        if ((unsigned)k->kind > (unsigned)MB_CKPT_KIND_F64)
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: entry '%s' has kind %d", what, k->name, (int)k->kind);
        if (k->before && !mb__ckpt_key_parse(k->kind, k->before, strlen(k->before), &v))
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: entry '%s': before='%s' is not %s", what, k->name, k->before,
                           mb__ckpt_kind_name(k->kind));
        for (int j = 0; j < e; j++)
            if (strcmp(key[j].name, k->name) == 0)
                return MB_FAIL(lg, MB_ERR_INVALID_ARG, "%s: entry '%s' given twice", what, k->name);
    }
    return MB_OK;
}

MBDEF mb_result mb_ckpt_add_key(mb_ckpt_writer *w, const char *section, const mb_ckpt_key *key, int n) {
    if (!w) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_add_key: writer is NULL");
    const mb_logger *lg = mb__ckpt_log(w->dev);
    MB_TRY(mb__ckpt_key_valid(lg, "mb_ckpt_add_key", section, key, n));
    size_t cap = (size_t)n * (MB_MAX_NAME + MB__CKPT_KEY_VALUE + 2) + 1, len = 0;
    char *text = NULL;
    MB_TRY(mb__ckpt_alloc(w->dev, cap, (void **)&text));
    for (int e = 0; e < n; e++) {
        char v[MB__CKPT_KEY_VALUE];
        mb__ckpt_val val = mb__ckpt_key_val(&key[e]);
        mb__ckpt_key_format(key[e].kind, &val, v);
        len += (size_t)snprintf(text + len, cap - len, "%s=%s\n", key[e].name, v);
    }
    mb_result r = mb_ckpt_add(w, section, text, len);
    mb__ckpt_free(w->dev, text);
    return r;
}

/* Line `i` of a checked key text: its name and value (not NUL-terminated). */
typedef struct mb__ckpt_line { const char *name, *value; size_t nlen, vlen; } mb__ckpt_line;

/* Split a key text into lines, checking each: "name=value\n", a valid name, a value of
 * 1..63 printable bytes without blanks, no name twice. */
static mb_result mb__ckpt_key_lines(const mb_logger *lg, const char *path, const char *section, const char *text,
                                    size_t len, mb__ckpt_line *lines, int *count) {
    int n = 0;
    for (size_t pos = 0; pos < len; n++) {
        const char *s = text + pos, *nl = (const char *)memchr(s, '\n', len - pos);
        const char *eq = nl ? (const char *)memchr(s, '=', (size_t)(nl - s)) : NULL;
        if (n >= MB__CKPT_KEY_LINES)
            return MB_FAIL(lg, MB_ERR_CORRUPT, "'%s': key section '%s' has more than %d lines", path, section,
                           MB__CKPT_KEY_LINES);
        if (!nl) return MB_FAIL(lg, MB_ERR_CORRUPT, "'%s': key section '%s' is cut short in line %d", path, section, n + 1);
        mb__ckpt_line *l = &lines[n];
        l->name = s; l->nlen = eq ? (size_t)(eq - s) : 0;
        l->value = eq ? eq + 1 : s; l->vlen = eq ? (size_t)(nl - eq - 1) : 0;
        int ok = eq && mb__ckpt_key_name_ok(l->name, l->nlen) && l->vlen > 0 && l->vlen < MB__CKPT_KEY_VALUE;
        for (size_t i = 0; ok && i < l->vlen; i++) ok = l->value[i] > ' ' && l->value[i] < 127;
        if (!ok) {
            char shown[64]; /* the line's start, bytes that are not printable as '?' */
            size_t k = 0;
            for (; k < sizeof shown - 1 && s + k < nl; k++) shown[k] = s[k] >= ' ' && s[k] < 127 ? s[k] : '?';
            shown[k] = 0;
            return MB_FAIL(lg, MB_ERR_CORRUPT, "'%s': key section '%s': line %d is not name=value: '%s%s'", path,
                           section, n + 1, shown, s + k < nl ? "..." : "");
        }
        for (int j = 0; j < n; j++)
            if (lines[j].nlen == l->nlen && memcmp(lines[j].name, l->name, l->nlen) == 0)
                return MB_FAIL(lg, MB_ERR_CORRUPT, "'%s': key section '%s' holds '%.*s' twice", path, section,
                               (int)l->nlen, l->name);
        pos = (size_t)(nl - text) + 1;
    }
    *count = n;
    return MB_OK;
}

static const mb__ckpt_line *mb__ckpt_key_find(const mb__ckpt_line *lines, int count, const char *name) {
    size_t len = strlen(name);
    for (int j = 0; j < count; j++)
        if (lines[j].nlen == len && memcmp(lines[j].name, name, len) == 0) return &lines[j];
    return NULL;
}

/* Compare a key text with the entries; the first difference named, the others counted. */
static mb_result mb__ckpt_key_compare(const mb_logger *lg, mb_device *dev, const char *path, const char *section,
                                      const char *text, size_t len, const mb_ckpt_key *key, int n) {
    mb__ckpt_line *lines = NULL;
    int count = 0, differ = 0;
    char first[MB_MAX_NAME * 2 + MB__CKPT_KEY_VALUE * 2 + 96] = "";
    size_t most = len / 4 + 1; /* each line takes at least "a=b\n" */
    MB_TRY(mb__ckpt_alloc(dev, (most < MB__CKPT_KEY_LINES ? most : MB__CKPT_KEY_LINES) * sizeof *lines,
                          (void **)&lines));
    mb_result res = mb__ckpt_key_lines(lg, path, section, text, len, lines, &count);
    for (int e = 0; res == MB_OK && e < n; e++) {
        const mb_ckpt_key *k = &key[e];
        const mb__ckpt_line *l = mb__ckpt_key_find(lines, count, k->name);
        char here[MB__CKPT_KEY_VALUE];
        mb__ckpt_val want = mb__ckpt_key_val(k), got;
        mb__ckpt_key_format(k->kind, &want, here);
        const char *saved = l ? l->value : k->before;
        size_t slen = l ? l->vlen : (k->before ? strlen(k->before) : 0);
        if (!saved) {
            if (!differ++)
                snprintf(first, sizeof first, "%s is not in the checkpoint (written before it existed) but %s here",
                         k->name, here);
        } else if (!mb__ckpt_key_parse(k->kind, saved, slen, &got)) {
            if (!differ++)
                snprintf(first, sizeof first, "%s is '%.*s' in the checkpoint, not %s as here (%s)", k->name, (int)slen,
                         saved, mb__ckpt_kind_name(k->kind), here);
        } else if (!mb__ckpt_key_equal(k->kind, &got, &want)) {
            if (!differ++)
                snprintf(first, sizeof first, "%s is %.*s in the checkpoint but %s here", k->name, (int)slen, saved, here);
        }
    }
    for (int j = 0; res == MB_OK && j < count; j++) {
        int known = 0;
        for (int e = 0; e < n && !known; e++)
            known = strlen(key[e].name) == lines[j].nlen && memcmp(key[e].name, lines[j].name, lines[j].nlen) == 0;
        if (!known && !differ++)
            snprintf(first, sizeof first, "%.*s=%.*s in the checkpoint is not an option of this build", (int)lines[j].nlen,
                     lines[j].name, (int)lines[j].vlen, lines[j].value);
    }
    mb__ckpt_free(dev, lines);
    char more[48] = "";
    if (differ > 1) snprintf(more, sizeof more, " (and %d more entr%s)", differ - 1, differ > 2 ? "ies differ" : "y differs");
    if (res == MB_OK && differ)
        res = MB_FAIL(lg, MB_ERR_FORMAT, "'%s' was written with other options: %s%s", path, first, more);
    return res;
}

MBDEF mb_result mb_ckpt_check_key(mb_ckpt_reader *r, const char *section, const mb_ckpt_key *key, int n) {
    if (!r) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_check_key: reader is NULL");
    const mb_logger *lg = mb__ckpt_log(r->dev);
    MB_TRY(mb__ckpt_key_valid(lg, "mb_ckpt_check_key", section, key, n));
    const mb__ckpt_blob *s = mb__ckpt_find(r, section);
    if (!s) return MB_FAIL(lg, MB_ERR_FORMAT, "mb_ckpt_check_key: '%s' has no key section '%s'", r->path, section);
    return mb__ckpt_key_compare(lg, r->dev, r->path, section, (const char *)s->data, s->bytes, key, n);
}

/* The layout table itself: names, kinds, widths, fields inside `bytes` and apart. */
static mb_result mb__ckpt_layout_valid(const mb_logger *lg, size_t bytes, const mb_ckpt_field *f, int fields) {
    if (fields < 0 || (fields && !f))
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_check_key_bytes: %d fields at %p", fields, (const void *)f);
    for (int e = 0; e < fields; e++) {
        uint32_t w = f[e].width;
        int width_ok = f[e].kind == MB_CKPT_KIND_F32 ? w == 4 : f[e].kind == MB_CKPT_KIND_F64 ? w == 8
                     : (unsigned)f[e].kind <= (unsigned)MB_CKPT_KIND_UINT && (w == 1 || w == 2 || w == 4 || w == 8);
        if (!f[e].name || !mb__ckpt_key_name_ok(f[e].name, strlen(f[e].name)) || !width_ok ||
            (uint64_t)f[e].offset + w > (uint64_t)bytes)
            return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_check_key_bytes: field %d ('%s', kind %d, %u bytes at %u) "
                           "is not a named value inside %zu bytes", e, f[e].name ? f[e].name : "(null)",
                           (int)f[e].kind, (unsigned)w, (unsigned)f[e].offset, bytes);
        for (int j = 0; j < e; j++)
            if (strcmp(f[j].name, f[e].name) == 0 || (f[j].offset < f[e].offset + w && f[e].offset < f[j].offset + f[j].width))
                return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_ckpt_check_key_bytes: fields '%s' and '%s' share a name or "
                               "bytes", f[j].name, f[e].name);
    }
    return MB_OK;
}

/* Field e of a struct's bytes as a value (little-endian; INT sign-extended). */
static mb__ckpt_val mb__ckpt_field_value(const unsigned char *b, const mb_ckpt_field *f) {
    mb__ckpt_val v;
    memset(&v, 0, sizeof v);
    uint64_t x = mb__get_le(b + f->offset, (int)f->width);
    if (f->kind == MB_CKPT_KIND_INT) {
        int sh = 64 - 8 * (int)f->width;
        v.i = sh ? (int64_t)(x << sh) / ((int64_t)1 << sh) : (int64_t)x; /* sign-extended */
    } else if (f->kind == MB_CKPT_KIND_UINT) {
        v.u = x;
    } else if (f->kind == MB_CKPT_KIND_F32) {
        uint32_t bits = (uint32_t)x;
        float fl;
        memcpy(&fl, &bits, 4);
        v.f = fl;
    } else {
        memcpy(&v.f, &x, 8);
    }
    return v;
}

MBDEF mb_result mb_ckpt_check_key_bytes(mb_ckpt_reader *r, const char *section, size_t bytes,
                                        const mb_ckpt_field *layout, int fields, const mb_ckpt_key *key, int n) {
    if (!r) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_ckpt_check_key_bytes: reader is NULL");
    const mb_logger *lg = mb__ckpt_log(r->dev);
    MB_TRY(mb__ckpt_key_valid(lg, "mb_ckpt_check_key_bytes", section, key, n));
    MB_TRY(mb__ckpt_layout_valid(lg, bytes, layout, fields));
    const mb__ckpt_blob *s = mb__ckpt_find(r, section);
    if (!s) return MB_FAIL(lg, MB_ERR_FORMAT, "mb_ckpt_check_key_bytes: '%s' has no section '%s'", r->path, section);
    if (s->bytes != bytes)
        return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_ckpt_check_key_bytes: '%s': section '%s' holds %zu bytes, not the %zu "
                       "of the layout this build reads (another build's or platform's struct)", r->path, section,
                       s->bytes, bytes);
    for (size_t i = 0; i < bytes; i++) {
        int inside = 0;
        for (int e = 0; e < fields && !inside; e++) inside = i >= layout[e].offset && i < layout[e].offset + layout[e].width;
        if (!inside && s->data[i])
            return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_ckpt_check_key_bytes: '%s': section '%s' has a non-zero byte at %zu, "
                           "outside every field of the layout this build reads (another build's struct)", r->path,
                           section, i);
    }
    size_t cap = (size_t)fields * (MB_MAX_NAME + MB__CKPT_KEY_VALUE + 2) + 1, len = 0;
    char *text = NULL;
    MB_TRY(mb__ckpt_alloc(r->dev, cap, (void **)&text));
    for (int e = 0; e < fields; e++) { /* the same text a key section would hold, then the same comparison */
        char v[MB__CKPT_KEY_VALUE];
        mb__ckpt_val val = mb__ckpt_field_value(s->data, &layout[e]);
        mb__ckpt_key_format(layout[e].kind, &val, v);
        len += (size_t)snprintf(text + len, cap - len, "%s=%s\n", layout[e].name, v);
    }
    mb_result res = mb__ckpt_key_compare(lg, r->dev, r->path, section, text, len, key, n);
    mb__ckpt_free(r->dev, text);
    return res;
}

// ---- end checkpoint ----

// ---- export ----

struct mb_st_file {
    char *text;              /* the header (NUL-terminated); names and metadata point into it */
    unsigned char *data;     /* the tensors (own allocation: aligned) */
    size_t data_bytes;
    mb_st_tensor *t;
    int n, cap;
    const char **meta;       /* key, value, key, value, ... */
    int nmeta, meta_cap;
};

static const struct { const char *name; size_t size; } mb__st_dtypes[] = {
    {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1}, {"U8", 1},
    {"BOOL", 1}};

static size_t mb__st_dtype_size(const char *s) {
    for (size_t i = 0; i < sizeof mb__st_dtypes / sizeof *mb__st_dtypes; i++)
        if (!strcmp(s, mb__st_dtypes[i].name)) return mb__st_dtypes[i].size;
    return 0;
}

// -- writing --

typedef struct mb__st_buf { char *p; size_t n, cap; int oom; } mb__st_buf;

static void mb__st_put(mb__st_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 4096) + n;
        char *q = (char *)mb__host_alloc(cap);
        if (!q) { b->oom = 1; return; }
        if (b->n) memcpy(q, b->p, b->n);
        MB_FREE(b->p);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void mb__st_puts(mb__st_buf *b, const char *s) { mb__st_put(b, s, strlen(s)); }

static void mb__st_put_json_string(mb__st_buf *b, const char *s) {
    mb__st_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; mb__st_put(b, e, 2); }
        else if (c < 0x20) { snprintf(e, sizeof e, "\\u%04x", c); mb__st_puts(b, e); }
        else mb__st_put(b, (const char *)&c, 1);
    }
    mb__st_puts(b, "\"");
}

static mb_result mb__st_header(mb__st_buf *b, const mb_st_tensor *t, int n, const mb_st_meta *meta, int nmeta,
                               size_t *data_bytes) {
    size_t off = 0;
    mb__st_puts(b, "{");
    if (nmeta > 0) {
        mb__st_puts(b, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (!meta[i].key || !meta[i].value)
                return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: metadata %d has a NULL key or value", i);
            if (i) mb__st_puts(b, ",");
            mb__st_put_json_string(b, meta[i].key);
            mb__st_puts(b, ":");
            mb__st_put_json_string(b, meta[i].value);
        }
        mb__st_puts(b, "}");
    }
    for (int i = 0; i < n; i++) {
        size_t bytes;
        char num[64];
        if (!t[i].name || !t[i].name[0] || strlen(t[i].name) >= MB_MAX_NAME || !strcmp(t[i].name, "__metadata__"))
            return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: tensor %d: bad name", i);
        if ((t[i].dtype[0] && strcmp(t[i].dtype, "F32")) || t[i].rank < 0 || t[i].rank > MB_ST_MAX_RANK)
            return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: '%s': only F32 of rank 0..%d is written",
                           t[i].name, MB_ST_MAX_RANK);
        if (!mb_size_product(t[i].shape, t[i].rank, 4, &bytes) || !mb_size_add(off, bytes, &off))
            return MB_FAIL(NULL, MB_ERR_OVERFLOW, "mb_st_write: '%s': shape overflows", t[i].name);
        if (bytes && !t[i].data) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: '%s': NULL data", t[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name))
                return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: tensor '%s' given twice", t[i].name);
        mb__st_puts(b, nmeta > 0 || i ? "," : "");
        mb__st_put_json_string(b, t[i].name);
        mb__st_puts(b, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t[i].rank; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            mb__st_puts(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", off - bytes, off);
        mb__st_puts(b, num);
    }
    mb__st_puts(b, "}");
    while (b->n % 8) mb__st_puts(b, " ");
    *data_bytes = off;
    return b->oom ? MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "mb_st_write: no host memory for the header") : MB_OK;
}

static int mb__st_write_fd(int fd, const mb__st_buf *b, const mb_st_tensor *t, int n) {
    unsigned char len[8];
    mb__put_le(len, b->n, 8);
    if (mb__ckpt_write_all(fd, len, 8, NULL) || mb__ckpt_write_all(fd, b->p, b->n, NULL)) return -1;
    for (int i = 0; i < n; i++) {
        size_t bytes = 0;
        mb_size_product(t[i].shape, t[i].rank, 4, &bytes); /* checked by mb__st_header */
        if (bytes && mb__ckpt_write_all(fd, t[i].data, bytes, NULL)) return -1;
    }
    return mb__os_fsync(fd);
}

MBDEF mb_result mb_st_write(const char *path, const mb_st_tensor *t, int n, const mb_st_meta *meta, int nmeta) {
    if (!path || !path[0] || n < 0 || nmeta < 0 || (n && !t) || (nmeta && !meta))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: NULL or empty argument");
    char tmp[MB__CKPT_PATH];
    if (strlen(path) + 5 > sizeof tmp)
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_write: path of %zu bytes is too long", strlen(path));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    mb__st_buf b;
    memset(&b, 0, sizeof b);
    size_t data_bytes = 0;
    mb_result r = mb__st_header(&b, t, n, meta, nmeta, &data_bytes);
    int fd = r == MB_OK ? mb__os_open(tmp, 1) : -1;
    if (r == MB_OK && fd < 0) r = MB_FAIL(NULL, MB_ERR_IO, "mb_st_write: cannot create '%s': %s", tmp, strerror(errno));
    if (fd >= 0) {
        int rc = mb__st_write_fd(fd, &b, t, n), err = errno;
        if (mb__os_close(fd) != 0 && rc == 0) { rc = -1; err = errno; }
        if (rc == 0 && mb__os_replace(tmp, path) != 0) { rc = -1; err = errno; }
        if (rc != 0) {
            mb__os_unlink(tmp);
            r = MB_FAIL(NULL, MB_ERR_IO, "mb_st_write: writing '%s' failed: %s (a previous '%s' is untouched)", tmp,
                        strerror(err), path);
        } else if (mb__ckpt_sync_dir(path) != 0) {
            r = MB_FAIL(NULL, MB_ERR_IO, "mb_st_write: '%s' written but syncing its directory failed", path);
        }
    }
    MB_FREE(b.p);
    (void)data_bytes;
    return r;
}

// -- reading: a strict parser for the header's JSON subset --

typedef struct mb__st_js { char *p, *end, *start; const char *what; } mb__st_js;

#define MB__ST_BAD(j, ...) MB_FAIL(NULL, MB_ERR_FORMAT, __VA_ARGS__) /* j: the parser, for the reader */

static void mb__st_ws(mb__st_js *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}
static int mb__st_peek(mb__st_js *j, char c) {
    mb__st_ws(j);
    return j->p < j->end && *j->p == c;
}
static mb_result mb__st_expect(mb__st_js *j, char c) {
    if (!mb__st_peek(j, c))
        return MB__ST_BAD(j, "%s: bad safetensors header: '%c' expected at header byte %lld", j->what, c,
                          (long long)(j->p - j->start));
    j->p++;
    return MB_OK;
}

static int mb__st_hex(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int mb__st_u4(const char *p, const char *end, unsigned *v) {
    if (end - p < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = mb__st_hex(p[i]);
        if (h < 0) return 0;
        *v = *v * 16 + (unsigned)h;
    }
    return 1;
}

/* A JSON string, decoded in place (UTF-8; never longer than its source) and
 * NUL-terminated where its closing quote was. */
static mb_result mb__st_string(mb__st_js *j, const char **out) {
    MB_TRY(mb__st_expect(j, '"'));
    char *w = j->p, *s = j->p;
    for (;;) {
        if (j->p >= j->end) return MB__ST_BAD(j, "%s: bad safetensors header: unterminated string", j->what);
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) return MB__ST_BAD(j, "%s: bad safetensors header: control byte in a string", j->what);
        if (c != '\\') { *w++ = (char)c; continue; }
        if (j->p >= j->end) return MB__ST_BAD(j, "%s: bad safetensors header: unterminated string", j->what);
        char e = *j->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) { *w++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]; continue; }
        unsigned u, lo;
        if (e != 'u' || !mb__st_u4(j->p, j->end, &u))
            return MB__ST_BAD(j, "%s: bad safetensors header: bad escape in a string", j->what);
        j->p += 4;
        if (u >= 0xD800 && u < 0xDC00) { /* a surrogate pair */
            if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !mb__st_u4(j->p + 2, j->end, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return MB__ST_BAD(j, "%s: bad safetensors header: lone surrogate in a string", j->what);
            j->p += 6;
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        } else if (u >= 0xDC00 && u <= 0xDFFF) {
            return MB__ST_BAD(j, "%s: bad safetensors header: lone surrogate in a string", j->what);
        }
        if (u == 0) return MB__ST_BAD(j, "%s: bad safetensors header: NUL in a string", j->what);
        if (u < 0x80) *w++ = (char)u;
        else if (u < 0x800) { *w++ = (char)(0xC0 | (u >> 6)); *w++ = (char)(0x80 | (u & 63)); }
        else if (u < 0x10000) {
            *w++ = (char)(0xE0 | (u >> 12)); *w++ = (char)(0x80 | ((u >> 6) & 63)); *w++ = (char)(0x80 | (u & 63));
        } else {
            *w++ = (char)(0xF0 | (u >> 18)); *w++ = (char)(0x80 | ((u >> 12) & 63));
            *w++ = (char)(0x80 | ((u >> 6) & 63)); *w++ = (char)(0x80 | (u & 63));
        }
    }
    *w = 0;
    *out = s;
    return MB_OK;
}

/* A non-negative integer below 2^63 (no sign, fraction or exponent). */
static mb_result mb__st_uint(mb__st_js *j, uint64_t *out) {
    mb__st_ws(j);
    uint64_t v = 0;
    int digits = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (v > ((uint64_t)INT64_MAX - 9) / 10)
            return MB_FAIL(NULL, MB_ERR_OVERFLOW, "%s: bad safetensors header: a number overflows", j->what);
        v = v * 10 + (uint64_t)(*j->p++ - '0');
        digits++;
    }
    if (!digits || (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')))
        return MB__ST_BAD(j, "%s: bad safetensors header: a non-negative integer expected", j->what);
    *out = v;
    return MB_OK;
}

/* [u, u, ...] into v (at most cap); *n gets the count. */
static mb_result mb__st_uints(mb__st_js *j, uint64_t *v, int cap, int *n, const char *field) {
    MB_TRY(mb__st_expect(j, '['));
    *n = 0;
    if (mb__st_peek(j, ']')) { j->p++; return MB_OK; }
    for (;;) {
        if (*n >= cap) return MB__ST_BAD(j, "%s: bad safetensors header: %s has more than %d entries", j->what, field, cap);
        MB_TRY(mb__st_uint(j, &v[(*n)++]));
        if (mb__st_peek(j, ']')) { j->p++; return MB_OK; }
        MB_TRY(mb__st_expect(j, ','));
    }
}

/* Room for entry n (entries are added one or two at a time; the header cap bounds n). */
static mb_result mb__st_grow(void **p, int *cap, int n, size_t elem) {
    if (n < *cap) return MB_OK;
    int c = *cap ? *cap * 2 : 32;
    void *q = mb__host_alloc((size_t)c * elem);
    if (!q) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "safetensors: no host memory for %d entries", c);
    if (*cap) memcpy(q, *p, (size_t)*cap * elem);
    MB_FREE(*p);
    *p = q;
    *cap = c;
    return MB_OK;
}

static mb_result mb__st_metadata(mb__st_js *j, mb_st_file *f) {
    MB_TRY(mb__st_expect(j, '{'));
    if (mb__st_peek(j, '}')) { j->p++; return MB_OK; }
    for (;;) {
        MB_TRY(mb__st_grow((void **)&f->meta, &f->meta_cap, 2 * f->nmeta + 1, sizeof *f->meta));
        MB_TRY(mb__st_string(j, &f->meta[2 * f->nmeta]));
        MB_TRY(mb__st_expect(j, ':'));
        MB_TRY(mb__st_string(j, &f->meta[2 * f->nmeta + 1]));
        f->nmeta++;
        if (mb__st_peek(j, '}')) { j->p++; return MB_OK; }
        MB_TRY(mb__st_expect(j, ','));
    }
}

/* {"dtype": .., "shape": [..], "data_offsets": [b, e]} in any order, each exactly once. */
static mb_result mb__st_entry(mb__st_js *j, mb_st_tensor *t, uint64_t off[2]) {
    int seen = 0, n;
    MB_TRY(mb__st_expect(j, '{'));
    for (;;) {
        const char *key, *dt;
        uint64_t v[MB_ST_MAX_RANK];
        MB_TRY(mb__st_string(j, &key));
        MB_TRY(mb__st_expect(j, ':'));
        if (!strcmp(key, "dtype") && !(seen & 1)) {
            MB_TRY(mb__st_string(j, &dt));
            if (strlen(dt) >= sizeof t->dtype || !mb__st_dtype_size(dt))
                return MB__ST_BAD(j, "%s: tensor '%s': unknown dtype '%.16s'", j->what, t->name, dt);
            strcpy(t->dtype, dt);
            seen |= 1;
        } else if (!strcmp(key, "shape") && !(seen & 2)) {
            MB_TRY(mb__st_uints(j, v, MB_ST_MAX_RANK, &n, "shape"));
            t->rank = n;
            for (int d = 0; d < n; d++) t->shape[d] = (int64_t)v[d];
            seen |= 2;
        } else if (!strcmp(key, "data_offsets") && !(seen & 4)) {
            MB_TRY(mb__st_uints(j, v, 2, &n, "data_offsets"));
            if (n != 2) return MB__ST_BAD(j, "%s: tensor '%s': data_offsets needs 2 entries", j->what, t->name);
            off[0] = v[0]; off[1] = v[1];
            seen |= 4;
        } else {
            return MB__ST_BAD(j, "%s: tensor '%s': unknown or repeated field '%.32s'", j->what, t->name, key);
        }
        if (mb__st_peek(j, '}')) { j->p++; break; }
        MB_TRY(mb__st_expect(j, ','));
    }
    if (seen != 7) return MB__ST_BAD(j, "%s: tensor '%s': dtype, shape or data_offsets missing", j->what, t->name);
    return MB_OK;
}

static mb_result mb__st_object(mb__st_js *j, mb_st_file *f, uint64_t **offs, int *offs_cap) {
    MB_TRY(mb__st_expect(j, '{'));
    if (mb__st_peek(j, '}')) { j->p++; return MB_OK; }
    int has_meta = 0;
    for (;;) {
        const char *key;
        MB_TRY(mb__st_string(j, &key));
        MB_TRY(mb__st_expect(j, ':'));
        if (!strcmp(key, "__metadata__")) {
            if (has_meta++) return MB__ST_BAD(j, "%s: __metadata__ given twice", j->what);
            MB_TRY(mb__st_metadata(j, f));
        } else {
            if (!key[0] || strlen(key) >= MB_MAX_NAME)
                return MB__ST_BAD(j, "%s: tensor name '%.64s' must be 1..%d bytes", j->what, key, MB_MAX_NAME - 1);
            MB_TRY(mb__st_grow((void **)&f->t, &f->cap, f->n, sizeof *f->t));
            MB_TRY(mb__st_grow((void **)offs, offs_cap, 2 * f->n + 1, sizeof **offs));
            mb_st_tensor *t = &f->t[f->n];
            memset(t, 0, sizeof *t);
            t->name = key;
            MB_TRY(mb__st_entry(j, t, *offs + 2 * f->n));
            f->n++;
        }
        if (mb__st_peek(j, '}')) { j->p++; break; }
        MB_TRY(mb__st_expect(j, ','));
    }
    mb__st_ws(j);
    if (j->p != j->end) return MB__ST_BAD(j, "%s: bad safetensors header: bytes after the JSON object", j->what);
    return MB_OK;
}

static MB__TLS const mb_st_file *mb__st_sort_file; /* qsort has no user pointer in C11 */
static MB__TLS const uint64_t *mb__st_sort_offs;
static int mb__st_by_name(const void *a, const void *b) {
    return strcmp(mb__st_sort_file->t[*(const int *)a].name, mb__st_sort_file->t[*(const int *)b].name);
}
static int mb__st_by_begin(const void *a, const void *b) {
    uint64_t x = mb__st_sort_offs[2 * *(const int *)a], y = mb__st_sort_offs[2 * *(const int *)b];
    return x < y ? -1 : x > y;
}

/* Sizes against shapes, unique names, and offsets that tile [0, data_bytes) exactly. */
static mb_result mb__st_check(mb_st_file *f, const uint64_t *off, const char *what) {
    int *ix = NULL;
    mb_result r = MB_OK;
    if (f->n && !(ix = (int *)mb__host_alloc((size_t)f->n * sizeof *ix)))
        return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    for (int i = 0; r == MB_OK && i < f->n; i++) {
        mb_st_tensor *t = &f->t[i];
        size_t bytes = 0;
        ix[i] = i;
        if (!mb_size_product(t->shape, t->rank, mb__st_dtype_size(t->dtype), &bytes) || bytes > (size_t)INT64_MAX)
            r = MB_FAIL(NULL, MB_ERR_OVERFLOW, "%s: tensor '%s': its shape overflows", what, t->name);
        else if (off[2 * i] > off[2 * i + 1] || off[2 * i + 1] - off[2 * i] != (uint64_t)bytes)
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, its %s shape "
                        "needs %zu", what, t->name, (unsigned long long)off[2 * i], (unsigned long long)off[2 * i + 1],
                        (unsigned long long)(off[2 * i + 1] - off[2 * i]), t->dtype, bytes);
        t->count = bytes / mb__st_dtype_size(t->dtype);
    }
    mb__st_sort_file = f; mb__st_sort_offs = off;
    if (r == MB_OK && f->n) qsort(ix, (size_t)f->n, sizeof *ix, mb__st_by_name);
    for (int i = 1; r == MB_OK && i < f->n; i++)
        if (!strcmp(f->t[ix[i]].name, f->t[ix[i - 1]].name))
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: tensor '%s' appears twice", what, f->t[ix[i]].name);
    if (r == MB_OK && f->n) qsort(ix, (size_t)f->n, sizeof *ix, mb__st_by_begin);
    uint64_t at = 0;
    for (int i = 0; r == MB_OK && i < f->n; i++) {
        const uint64_t *o = off + 2 * ix[i];
        if (o[0] != at)
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: tensor '%s' starts at data byte %llu, expected %llu (%s)", what,
                        f->t[ix[i]].name, (unsigned long long)o[0], (unsigned long long)at,
                        o[0] < at ? "overlap" : "a hole");
        at = o[1];
    }
    if (r == MB_OK && at != (uint64_t)f->data_bytes)
        r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: the tensors end at data byte %llu but the file holds %zu data bytes (%s)",
                    what, (unsigned long long)at, f->data_bytes, at > f->data_bytes ? "truncated" : "trailing bytes");
    for (int i = 0; r == MB_OK && i < f->n; i++) f->t[i].data = f->data + off[2 * i];
    MB_FREE(ix);
    return r;
}

MBDEF void mb_st_close(mb_st_file *f) {
    if (!f) return;
    MB_FREE(f->text); MB_FREE(f->data); MB_FREE(f->t); MB_FREE((void *)f->meta);
    MB_FREE(f);
}

MBDEF mb_result mb_st_parse(mb_st_file **out, const void *bytes, size_t n, const char *what) {
    if (!out || (n && !bytes)) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_parse: NULL argument");
    *out = NULL;
    what = what ? what : "safetensors";
    const unsigned char *b = (const unsigned char *)bytes;
    if (n < 8) return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: truncated: %zu bytes, less than the 8-byte header length", what, n);
    uint64_t hl = mb__get_le(b, 8);
    if (hl > MB_ST_MAX_HEADER)
        return MB_FAIL(NULL, MB_ERR_OVERFLOW, "%s is not a safetensors file (its header length %llu exceeds the cap of %u bytes)", what,
                       (unsigned long long)hl, (unsigned)MB_ST_MAX_HEADER);
    if (hl < 2 || hl > n - 8)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s is not a safetensors file, or is cut short (its header length %llu does not fit the file's %zu bytes)",
                       what, (unsigned long long)hl, n);
    mb_st_file *f = (mb_st_file *)mb__host_alloc(sizeof *f);
    if (!f) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    memset(f, 0, sizeof *f);
    f->data_bytes = n - 8 - (size_t)hl;
    f->text = (char *)mb__host_alloc((size_t)hl + 1);
    f->data = (unsigned char *)mb__host_alloc(f->data_bytes);
    uint64_t *offs = NULL;
    int offs_cap = 0;
    mb_result r = f->text && f->data ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "%s: no host memory", what);
    if (r == MB_OK) {
        memcpy(f->text, b + 8, (size_t)hl);
        f->text[hl] = 0;
        if (f->data_bytes) memcpy(f->data, b + 8 + hl, f->data_bytes);
        mb__st_js j = {f->text, f->text + hl, f->text, what};
        r = mb__st_object(&j, f, &offs, &offs_cap);
    }
    if (r == MB_OK) r = mb__st_check(f, offs, what);
    MB_FREE(offs);
    if (r != MB_OK) { mb_st_close(f); return r; }
    *out = f;
    return MB_OK;
}

MBDEF mb_result mb_st_open(mb_st_file **out, const char *path) {
    if (!out || !path) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_open: NULL argument");
    *out = NULL;
    mb_ckpt_reader rd; /* the checkpoint reader's whole-file read, with its checks */
    memset(&rd, 0, sizeof rd);
    mb_result r = mb__ckpt_slurp(&rd, path);
    if (r != MB_OK) { /* its message, named for this reader */
        char why[MB_MAX_ERROR];
        snprintf(why, sizeof why, "%s", mb_last_error());
        return MB_FAIL(NULL, r, "mb_st_open: %s", strncmp(why, "mb_ckpt_open: ", 14) ? why : why + 14);
    }
    r = mb_st_parse(out, rd.buf, rd.size, path);
    MB_FREE(rd.buf);
    return r;
}

MBDEF int mb_st_count(const mb_st_file *f) { return f ? f->n : 0; }
MBDEF const mb_st_tensor *mb_st_at(const mb_st_file *f, int i) { return f && i >= 0 && i < f->n ? &f->t[i] : NULL; }
MBDEF const mb_st_tensor *mb_st_find(const mb_st_file *f, const char *name) {
    for (int i = 0; f && name && i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}
MBDEF const char *mb_st_meta_get(const mb_st_file *f, const char *key) {
    for (int i = 0; f && key && i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}
MBDEF int mb_st_meta_count(const mb_st_file *f) { return f ? f->nmeta : 0; }
MBDEF void mb_st_meta_at(const mb_st_file *f, int i, const char **key, const char **value) {
    int ok = f && i >= 0 && i < f->nmeta;
    if (key) *key = ok ? f->meta[2 * i] : NULL;
    if (value) *value = ok ? f->meta[2 * i + 1] : NULL;
}

// -- parameters --

static mb_result mb__st_rename(const char *name, const char *const *rename, char *out) {
    for (int i = 0; rename && rename[i] && rename[i + 1]; i += 2) {
        size_t k = strlen(rename[i]);
        if (strncmp(name, rename[i], k)) continue;
        if (strlen(rename[i + 1]) + strlen(name + k) >= MB_MAX_NAME)
            return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "safetensors: '%s' renamed is too long", name);
        size_t a = strlen(rename[i + 1]);
        memcpy(out, rename[i + 1], a);
        strcpy(out + a, name + k);
        return MB_OK;
    }
    if (strlen(name) >= MB_MAX_NAME) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "safetensors: '%s' is too long", name);
    strcpy(out, name);
    return MB_OK;
}

MBDEF mb_result mb_st_save_params(const char *path, mb_params *p, const char *const *rename,
                                  const mb_st_meta *meta, int nmeta) {
    if (!p) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_save_params: params is NULL");
    int n = mb_params_num_tensors(p);
    float *host = (float *)mb__host_alloc(mb_params_total(p) * sizeof(float));
    mb_st_tensor *t = (mb_st_tensor *)mb__host_alloc((size_t)(n ? n : 1) * (sizeof *t + MB_MAX_NAME));
    mb_result r = host && t ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "mb_st_save_params: no host memory");
    if (r == MB_OK) r = mb_params_get(p, host);
    char *names = (char *)(t + (n ? n : 1));
    for (int i = 0; r == MB_OK && i < n; i++) {
        const mb_param_info *in = mb_params_info(p, i);
        memset(&t[i], 0, sizeof t[i]);
        r = mb__st_rename(in->name, rename, names + (size_t)i * MB_MAX_NAME);
        t[i].name = names + (size_t)i * MB_MAX_NAME;
        t[i].rank = in->rank;
        for (int d = 0; d < in->rank; d++) t[i].shape[d] = in->shape[d];
        t[i].data = host + in->offset;
    }
    if (r == MB_OK) r = mb_st_write(path, t, n, meta, nmeta);
    MB_FREE(host);
    MB_FREE(t);
    return r;
}

static void mb__st_shape_text(const mb_st_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->rank && k < cap; d++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

MBDEF mb_result mb_st_load_params(const mb_st_file *f, mb_params *p, const char *const *rename) {
    if (!f || !p) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_st_load_params: NULL argument");
    int n = mb_params_num_tensors(p);
    if (n != f->n) /* with every parameter found (below), a count that differs means extra tensors */
        for (int i = 0; i < f->n; i++) {
            int found = 0;
            for (int k = 0; k < n && !found; k++) {
                char name[MB_MAX_NAME];
                found = mb__st_rename(mb_params_info(p, k)->name, rename, name) == MB_OK && !strcmp(name, f->t[i].name);
            }
            if (!found) return MB_FAIL(NULL, MB_ERR_FORMAT, "safetensors: unexpected tensor '%s' (not a parameter of "
                                       "this model)", f->t[i].name);
        }
    float *host = (float *)mb__host_alloc(mb_params_total(p) * sizeof(float));
    if (!host) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "mb_st_load_params: no host memory");
    mb_result r = mb_params_get(p, host);
    for (int i = 0; r == MB_OK && i < n; i++) {
        const mb_param_info *in = mb_params_info(p, i);
        char name[MB_MAX_NAME], want[96], got[96];
        r = mb__st_rename(in->name, rename, name);
        const mb_st_tensor *t = r == MB_OK ? mb_st_find(f, name) : NULL;
        if (r != MB_OK) break;
        if (!t) { r = MB_FAIL(NULL, MB_ERR_FORMAT, "safetensors: missing tensor '%s'", name); break; }
        mb_st_tensor like;
        memset(&like, 0, sizeof like);
        like.rank = in->rank;
        for (int d = 0; d < in->rank; d++) like.shape[d] = in->shape[d];
        int same = t->rank == in->rank && !strcmp(t->dtype, "F32");
        for (int d = 0; same && d < in->rank; d++) same = t->shape[d] == in->shape[d];
        if (!same) {
            mb__st_shape_text(&like, want, sizeof want);
            mb__st_shape_text(t, got, sizeof got);
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "safetensors: tensor '%s' is %s %s, the model needs F32 %s", name, t->dtype,
                        got, want);
            break;
        }
        memcpy(host + in->offset, t->data, in->count * sizeof(float));
    }
    if (r == MB_OK) r = mb_params_set(p, host);
    MB_FREE(host);
    return r;
}

// ---- end export ----

// ---- dist ----

#ifdef MEGABATCH_MPI
#ifdef __cplusplus
}
#endif
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1 /* the C API only (OpenMPI's C++ bindings do not build with -Werror) */
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#ifdef __cplusplus
extern "C" {
#endif
#endif

/* The backend's dist group (NULL: the host path of mb_dist_allreduce_grads): the gradient
 * all-reduce on the device (same contract as mb_dist_allreduce_grads, d->size > 1), and release,
 * which frees the device communicator it made in d->comm_dev (mb_dist_close calls it). */
typedef struct mb__dist_ops {
    mb_result (*allreduce_grads)(mb_dist *d, mb_params *p, int64_t count, float *loss, int64_t *total);
    void (*release)(mb_dist *d);
} mb__dist_ops;
MB__OPS_CHECK(mb__dist_ops, 2);

struct mb_dist {
    mb_device *dev;
    int rank, size, local_rank, owns_mpi;
    float *send, *recv, *out;  /* host scratch of the all-reduce (grown on demand) */
    size_t cap;                /* payload floats the scratch holds */
    mb_dist_stats stats;
#ifdef MEGABATCH_MPI
    MPI_Comm comm;
    int *scount, *sdisp, *rcount, *rdisp, *gcount, *gdisp; /* per-rank counts and offsets */
#endif
    void *comm_dev;            /* a device communicator (CUDA: NCCL's), made on first use by the dist */
    const struct mb__dist_ops *comm_ops; /* group of the backend that made it; its release frees it */
};

MBDEF int mb_dist_rank(const mb_dist *d) { return d ? d->rank : 0; }
MBDEF int mb_dist_size(const mb_dist *d) { return d ? d->size : 1; }
MBDEF int mb_dist_local_rank(const mb_dist *d) { return d ? d->local_rank : 0; }
MBDEF mb_dist_stats mb_dist_get_stats(const mb_dist *d) {
    mb_dist_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

static const mb_logger *mb__dist_log(const mb_dist *d) { return d && d->dev ? &d->dev->cfg.log : NULL; }

#ifdef MEGABATCH_MPI
/* An MPI failure as an mb_result (MPI_ERRORS_RETURN is set on the communicator). */
static mb_result mb__mpi(const mb_dist *d, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return MB_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return MB_FAIL(mb__dist_log(d), MB_ERR_IO, "%s: MPI error: %.*s", what, len, msg);
}
#endif

MBDEF void mb_dist_close(mb_dist *d) {
    if (!d) return;
    if (d->comm_ops) d->comm_ops->release(d);
#ifdef MEGABATCH_MPI
    if (d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
    MB_FREE(d->scount); MB_FREE(d->sdisp); MB_FREE(d->rcount); MB_FREE(d->rdisp); MB_FREE(d->gcount); MB_FREE(d->gdisp);
    int fin = 0;
    if (d->owns_mpi && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
#endif
    MB_FREE(d->send); MB_FREE(d->recv); MB_FREE(d->out);
    MB_FREE(d);
}

MBDEF mb_result mb_dist_open(mb_dist **out, mb_device *dev) {
    const mb_logger *lg = dev ? &dev->cfg.log : NULL;
    if (!out) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_dist_open: NULL argument");
    *out = NULL;
    mb_dist *d = (mb_dist *)mb__host_calloc(1, sizeof *d);
    if (!d) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_dist_open: no host memory");
    d->dev = dev;
    d->size = 1;
#ifdef MEGABATCH_MPI
    d->comm = MPI_COMM_NULL;
    int init = 0, provided = 0;
    MPI_Initialized(&init);
    if (!init) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            MB_FREE(d);
            return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_dist_open: MPI_Init_thread failed");
        }
        d->owns_mpi = 1;
    }
    mb_result r = mb__mpi(d, MPI_Comm_dup(MPI_COMM_WORLD, &d->comm), "mb_dist_open: MPI_Comm_dup");
    if (r == MB_OK) {
        MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(d->comm, &d->rank);
        MPI_Comm_size(d->comm, &d->size);
        MPI_Comm node;
        r = mb__mpi(d, MPI_Comm_split_type(d->comm, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node),
                    "mb_dist_open: MPI_Comm_split_type");
        if (r == MB_OK) { MPI_Comm_rank(node, &d->local_rank); MPI_Comm_free(&node); }
    }
    int **arrays[6] = {&d->scount, &d->sdisp, &d->rcount, &d->rdisp, &d->gcount, &d->gdisp};
    for (int i = 0; r == MB_OK && i < 6; i++)
        if (!(*arrays[i] = (int *)mb__host_calloc((size_t)d->size, sizeof(int))))
            r = MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_dist_open: no host memory");
    if (r != MB_OK) { mb_dist_close(d); return r; }
#endif
    *out = d;
    return MB_OK;
}

MBDEF void mb_dist_abort(mb_dist *d, int code) {
#ifdef MEGABATCH_MPI
    if (d && d->size > 1) MPI_Abort(d->comm, code);
#else
    (void)d; (void)code;
#endif
}

MBDEF mb_result mb_dist_barrier(mb_dist *d) {
    if (!d) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_dist_barrier: NULL dist");
#ifdef MEGABATCH_MPI
    return mb__mpi(d, MPI_Barrier(d->comm), "mb_dist_barrier");
#else
    return MB_OK;
#endif
}

#ifdef MEGABATCH_MPI
/* Copy between host and dev's memory and wait (dev NULL: host memory). */
static mb_result mb__dist_copy(mb_device *dev, void *dst, const void *src, size_t bytes) {
    if (!dev) { memmove(dst, src, bytes); return MB_OK; }
    MB_TRY(mb_copy(dev, MB_STREAM_COMPUTE, dst, src, bytes));
    return mb_sync(dev, MB_STREAM_COMPUTE);
}
#endif

MBDEF mb_result mb_dist_broadcast(mb_dist *d, void *data, size_t bytes) {
    if (!d || (!data && bytes)) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_broadcast: NULL argument");
    if (d->size == 1 || bytes == 0) return MB_OK;
#ifdef MEGABATCH_MPI
    char *host = (char *)mb__host_alloc(bytes);
    if (!host) return MB_FAIL(mb__dist_log(d), MB_ERR_OUT_OF_MEMORY, "mb_dist_broadcast: no host memory for %zu bytes", bytes);
    mb_result r = mb__dist_copy(d->dev, host, data, bytes); /* device memory: through the host */
    for (size_t off = 0; r == MB_OK && off < bytes; off += (size_t)1 << 30) { /* MPI counts are int */
        size_t n = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
        r = mb__mpi(d, MPI_Bcast(host + off, (int)n, MPI_BYTE, 0, d->comm), "mb_dist_broadcast");
    }
    if (r == MB_OK) r = mb__dist_copy(d->dev, data, host, bytes);
    MB_FREE(host);
    return r;
#else
    return MB_OK;
#endif
}

MBDEF mb_result mb_dist_broadcast_params(mb_dist *d, mb_params *p) {
    if (!d || !p) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_broadcast_params: NULL argument");
    mb_device *dev = d->dev;
    d->dev = mb_params_device(p); /* the params' memory */
    mb_result r = mb_dist_broadcast(d, mb_params_data(p), mb_params_total(p) * sizeof(float));
    d->dev = dev;
    return r;
}

MBDEF mb_result mb_dist_sum(mb_dist *d, double *v, int n) {
    if (!d || (!v && n) || n < 0) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_sum: bad argument");
    if (d->size == 1 || n == 0) return MB_OK;
#ifdef MEGABATCH_MPI
    double *all = (double *)mb__host_calloc((size_t)n * (size_t)d->size, sizeof(double));
    if (!all) return MB_FAIL(mb__dist_log(d), MB_ERR_OUT_OF_MEMORY, "mb_dist_sum: no host memory");
    mb_result r = mb__mpi(d, MPI_Allgather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, d->comm), "mb_dist_sum");
    for (int i = 0; r == MB_OK && i < n; i++) {
        double s = 0;
        for (int j = 0; j < d->size; j++) s += all[(size_t)j * (size_t)n + (size_t)i];
        v[i] = s;
    }
    MB_FREE(all);
    return r;
#else
    return MB_OK;
#endif
}

/* 64-bit FNV-1a of bytes. */
static uint64_t mb__fnv1a(const void *data, size_t bytes) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

MBDEF mb_result mb_dist_check_sync(mb_dist *d, mb_params *p, int *same) {
    if (!d || !p || !same) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_check_sync: NULL argument");
    size_t n = mb_params_total(p);
    float *host = (float *)mb__host_calloc(n, sizeof(float));
    if (!host) return MB_FAIL(mb__dist_log(d), MB_ERR_OUT_OF_MEMORY, "mb_dist_check_sync: no host memory");
    mb_result r = mb_params_get(p, host);
    /* the hash as two exact doubles: rank r's differs from rank 0's iff (h_r - h_0) != 0 */
    uint64_t h = r == MB_OK ? mb__fnv1a(host, n * sizeof(float)) : 0;
    MB_FREE(host);
    double v[2] = {(double)(h >> 32), (double)(h & 0xffffffffu)}, v0[2] = {v[0], v[1]};
    if (r == MB_OK) r = mb_dist_broadcast(d, v0, sizeof v0);
    double diff[1] = {v[0] != v0[0] || v[1] != v0[1] ? 1.0 : 0.0};
    if (r == MB_OK) r = mb_dist_sum(d, diff, 1);
    *same = r == MB_OK && diff[0] == 0;
    return r;
}

#ifdef MEGABATCH_MPI
/* Host scratch for a payload of n floats on `size` ranks: send (n + size), recv and out. */
static mb_result mb__dist_reserve(mb_dist *d, size_t n) {
    if (n <= d->cap) return MB_OK;
    MB_FREE(d->send); MB_FREE(d->recv); MB_FREE(d->out);
    size_t w = (size_t)d->size, slice = n / w + 1;
    d->send = (float *)mb__host_calloc(n + w, sizeof(float));
    d->recv = (float *)mb__host_calloc(w * (slice + 1), sizeof(float));
    d->out = (float *)mb__host_calloc(n, sizeof(float));
    d->cap = d->send && d->recv && d->out ? n : 0;
    if (!d->cap)
        return MB_FAIL(mb__dist_log(d), MB_ERR_OUT_OF_MEMORY, "mb_dist_allreduce_grads: no host memory for %zu floats", n);
    return MB_OK;
}

/* The fixed-order all-reduce of x[0..n) weighted by count c: slice j = [n*j/W, n*(j+1)/W)
 * goes to rank j with c appended (reduce-scatter: one MPI_Alltoallv), rank j sums
 * x_r * c_r / sum(c) over r = 0..W-1 in that order in double, and the slices are
 * gathered back into d->out (one MPI_Allgatherv). *total receives sum(c). */
static mb_result mb__dist_reduce(mb_dist *d, const float *x, size_t n, float c, double *total) {
    int w = d->size, me = d->rank;
    for (int j = 0; j < w; j++) {
        size_t a = n * (size_t)j / (size_t)w, b = n * (size_t)(j + 1) / (size_t)w;
        d->gdisp[j] = (int)a;
        d->gcount[j] = (int)(b - a);
        d->sdisp[j] = (int)a + j;           /* send: slice j then c, packed */
        d->scount[j] = (int)(b - a) + 1;
        memcpy(d->send + a + (size_t)j, x + a, (b - a) * sizeof(float));
        d->send[b + (size_t)j] = c;
    }
    int mine = d->gcount[me] + 1;
    for (int j = 0; j < w; j++) { d->rcount[j] = mine; d->rdisp[j] = j * mine; }
    MB_TRY(mb__mpi(d, MPI_Alltoallv(d->send, d->scount, d->sdisp, MPI_FLOAT, d->recv, d->rcount, d->rdisp, MPI_FLOAT,
                                    d->comm), "mb_dist_allreduce_grads: MPI_Alltoallv"));
    double sum = 0;
    for (int j = 0; j < w; j++) sum += (double)d->recv[(size_t)j * (size_t)mine + (size_t)(mine - 1)];
    if (!(sum > 0)) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_allreduce_grads: no samples on any rank");
    float *dst = d->out + d->gdisp[me];
    for (int i = 0; i < mine - 1; i++) {
        double s = 0;
        for (int j = 0; j < w; j++) {
            const float *src = d->recv + (size_t)j * (size_t)mine;
            s += (double)src[i] * (double)src[mine - 1];
        }
        dst[i] = (float)(s / sum);
    }
    *total = sum;
    /* sent: the other ranks' slices (reduce-scatter), then our slice to each of them (all-gather) */
    d->stats.bytes_sent += (uint64_t)(n + (size_t)w - (size_t)mine + (size_t)(mine - 1) * (size_t)(w - 1)) * sizeof(float);
    return mb__mpi(d, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d->out, d->gcount, d->gdisp, MPI_FLOAT,
                                     d->comm), "mb_dist_allreduce_grads: MPI_Allgatherv");
}
#endif

MBDEF mb_result mb_dist_allreduce_grads(mb_dist *d, mb_params *p, int64_t count, float *loss, int64_t *total) {
    if (!d || !p) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_allreduce_grads: NULL argument");
    if (count < 0 || count > ((int64_t)1 << 24))
        return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_allreduce_grads: count %lld outside 0..2^24",
                       (long long)count);
    if (total) *total = count;
    if (d->size == 1) {
        if (!count) return MB_FAIL(mb__dist_log(d), MB_ERR_INVALID_ARG, "mb_dist_allreduce_grads: no samples on any rank");
        return MB_OK; /* a world of one: the identity, bit for bit */
    }
    const mb__backend *be = mb_params_device(p)->be;
    if (be->dist) return be->dist->allreduce_grads(d, p, count, loss, total);
#ifdef MEGABATCH_MPI
    size_t n = mb_params_total(p), payload = n + 1;
    if (payload / (size_t)d->size + 2 > (size_t)INT32_MAX / 2 || payload > (size_t)INT32_MAX - (size_t)d->size)
        return MB_FAIL(mb__dist_log(d), MB_ERR_OVERFLOW, "mb_dist_allreduce_grads: %zu floats exceed MPI's int counts", n);
    double t0 = mb__seconds(), sum = 0;
    MB_TRY(mb__dist_reserve(d, payload));
    float *x = d->out; /* gradients then the loss, gathered into out, packed into send by reduce */
    MB_TRY(mb__dist_copy(mb_params_device(p), x, mb_params_grad(p), n * sizeof(float)));
    x[n] = loss ? *loss : 0.0f;
    MB_TRY(mb__dist_reduce(d, x, payload, (float)count, &sum));
    MB_TRY(mb__dist_copy(mb_params_device(p), mb_params_grad(p), d->out, n * sizeof(float)));
    if (loss) *loss = d->out[n];
    if (total) *total = (int64_t)sum;
    d->stats.reductions++;
    d->stats.seconds += mb__seconds() - t0;
    return MB_OK;
#else
    (void)loss;
    return MB_FAIL(mb__dist_log(d), MB_ERR_UNSUPPORTED, "mb_dist_allreduce_grads: built without MEGABATCH_MPI");
#endif
}

// ---- end dist ----

// ---- graph ----

/* The backend's graph group (NULL: no graphs): begin a capture on a stream; end it and
 * instantiate it into *exec (its operation count in *nodes; end ends the capture even when it
 * fails); launch on a stream; destroy an exec. */
typedef struct mb__graph_ops {
    mb_result (*begin)(mb_device *dev, int stream);
    mb_result (*end)(mb_device *dev, int stream, void **exec, size_t *nodes);
    mb_result (*launch)(mb_device *dev, int stream, void *exec);
    void (*destroy)(void *exec);
} mb__graph_ops;
MB__OPS_CHECK(mb__graph_ops, 4);

struct mb_graph {
    mb_device *dev;
    int stream;   /* where it was captured, and is launched */
    void *exec;   /* cudaGraphExec_t */
    size_t nodes;
};

MBDEF int mb_graph_supported(const mb_device *dev) { return dev && dev->be->graph; }

MBDEF mb_result mb_graph_begin(mb_device *dev, int stream) {
    if (!dev) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_graph_begin: dev is NULL");
    MB_TRY(mb__check_stream(dev, stream, "mb_graph_begin"));
    if (!mb_graph_supported(dev))
        return MB_FAIL(&dev->cfg.log, MB_ERR_UNSUPPORTED, "mb_graph_begin: the %s backend has no graphs "
                       "(every call runs when made; check mb_graph_supported, or use mb_graph_run)", dev->name);
    if (dev->graph_stream >= 0)
        return MB_FAIL(&dev->cfg.log, MB_ERR_STATE, "mb_graph_begin: a capture on stream %d is under way",
                       dev->graph_stream);
    MB_TRY(dev->be->graph->begin(dev, stream));
    dev->graph_stream = stream;
    return MB_OK;
}

MBDEF mb_result mb_graph_end(mb_device *dev, mb_graph **out) {
    if (!dev || !out) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_graph_end: NULL argument");
    *out = NULL;
    if (dev->graph_stream < 0) return MB_FAIL(&dev->cfg.log, MB_ERR_STATE, "mb_graph_end: no capture under way");
    int stream = dev->graph_stream;
    dev->graph_stream = -1;
    mb_graph *g = (mb_graph *)mb__host_calloc(1, sizeof *g);
    mb_result r = g ? MB_OK : MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_graph_end: no host memory");
    void *exec = NULL;
    size_t nodes = 0;
    mb_result e = dev->be->graph->end(dev, stream, &exec, &nodes); /* ends the capture, even without g */
    if (r == MB_OK) r = e;
    else if (exec) dev->be->graph->destroy(exec);
    if (r != MB_OK) { MB_FREE(g); return r; }
    g->dev = dev;
    g->stream = stream;
    g->exec = exec;
    g->nodes = nodes;
    *out = g;
    return MB_OK;
}

MBDEF mb_result mb_graph_launch(mb_graph *g) {
    if (!g) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_graph_launch: g is NULL");
    return g->dev->be->graph->launch(g->dev, g->stream, g->exec); /* g exists: the backend has graphs */
}

MBDEF size_t mb_graph_nodes(const mb_graph *g) { return g ? g->nodes : 0; }

MBDEF void mb_graph_destroy(mb_graph *g) {
    if (!g) return;
    g->dev->be->graph->destroy(g->exec);
    MB_FREE(g);
}

/* fn runs directly from now on: say why, once per device. */
static mb_result mb__graph_fallback(mb_device *dev, mb_log_level level, const char *why, mb_graph_fn fn, void *user) {
    if (!dev->graph_off)
        MB_LOG(&dev->cfg.log, level, "mb_graph_run: running the calls directly from now on: %s", why);
    dev->graph_off = 1;
    return fn(user);
}

MBDEF mb_result mb_graph_run(mb_graph **g, mb_device *dev, int stream, mb_graph_fn fn, void *user) {
    if (!g || !dev || !fn) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_graph_run: NULL argument");
    if (*g) return mb_graph_launch(*g);
    if (!mb_graph_supported(dev))
        return mb__graph_fallback(dev, MB_LOG_INFO, "the CPU backend has no graphs", fn, user);
    if (dev->graph_off) return fn(user);
    MB_TRY(mb_graph_begin(dev, stream));
    mb_result r = fn(user);
    char first[MB_MAX_ERROR]; /* the first failure inside the capture: the likely cause */
    memcpy(first, r == MB_OK ? "" : mb_last_error(), r == MB_OK ? 1 : sizeof first);
    mb_graph *ng = NULL;
    mb_result e = mb_graph_end(dev, &ng);
    if (e == MB_OK && r == MB_OK) {
        *g = ng;
        return mb_graph_launch(ng);
    }
    mb_graph_destroy(ng);
    if (e == MB_OK) return r; /* fn's own error: the capture itself was fine */
    char why[2 * MB_MAX_ERROR + 64];
    snprintf(why, sizeof why, "the capture failed (%s)%s%s", mb_last_error(), *first ? "; the first error in it: " : "",
             first);
    mb_clear_error();
    return mb__graph_fallback(dev, MB_LOG_WARN, why, fn, user);
}

// ---- end graph ----

// ---- testing ----

MBDEF void mb_device_fail_alloc(mb_device *dev, mb_mem_kind kind, uint64_t nth) {
    if ((unsigned)kind >= MB_MEM_KINDS) return;
    dev->fail_at[kind] = nth ? dev->stats.allocs[kind] + nth : 0;
}

MBDEF void mb_device_deny_alloc(mb_device *dev, mb_mem_kind kind, int deny) {
    if ((unsigned)kind < MB_MEM_KINDS) dev->deny[kind] = deny != 0;
}

// ---- cpu backend ----
// The CPU table: the groups that close each module's CPU code (see "backend").

MB__OPS_BEGIN
static const mb__backend mb__cpu_table = {
    .name = "cpu",
    /* host: FTZ and the pool apply; no full-storage LSTM by default (caches favour
     * checkpointing's small working set); AdamW needs no scratch */
    .caps = {.host = 1, .adamw_scratch = 0},
    .rt = &mb__cpu_runtime_ops,
    .gemm = &mb__cpu_gemm_ops,
    .params = &mb__cpu_params_ops,
    .series = &mb__cpu_series_ops,
    .lstm = &mb__cpu_lstm_ops,
    .layers = &mb__cpu_layers_ops,
    .loss = &mb__cpu_loss_ops,
    .amp = &mb__cpu_amp_ops,
    .optim = &mb__cpu_optim_ops,
    .step = &mb__cpu_step_ops,
    .dist = NULL,  /* the host path */
    .graph = NULL, /* no graphs: every call completes when made */
};
MB__OPS_END

static const mb__backend *mb__cpu_backend(void) { return &mb__cpu_table; }

/* Every group of a table complete (mb__ops_complete); the optional ones may be NULL. */
static int mb__backend_complete(const mb__backend *be) {
#define MB__GROUP(g, optional) ((optional && !be->g) || (be->g && mb__ops_complete(be->g, sizeof *be->g)))
    return MB__GROUP(rt, 0) && MB__GROUP(gemm, 0) && MB__GROUP(params, 0) && MB__GROUP(series, 0) &&
           MB__GROUP(lstm, 0) && MB__GROUP(layers, 0) && MB__GROUP(loss, 0) &&
           MB__GROUP(amp, 0) && MB__GROUP(optim, 0) && MB__GROUP(step, 0) && MB__GROUP(dist, 1) &&
           MB__GROUP(graph, 1);
#undef MB__GROUP
}

// ---- end cpu backend ----

#ifdef __cplusplus
}
#endif
#endif /* MEGABATCH_IMPLEMENTATION_INCLUDED */
#endif /* MEGABATCH_IMPLEMENTATION */
