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
 * Layout of this file follows the data flow (DESIGN.md section 3): core, device,
 * gemm, params, then dataset, loader, lstm, layers, amp, optim, checkpoint.  Each
 * module starts with a banner `// ---- name ----` in the API part and again in the
 * implementation part.
 *
 * License: MIT (see LICENSE).
 */
#ifndef MEGABATCH_H
#define MEGABATCH_H

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

/* Where memory lives. On the CPU backend all three are host memory. */
typedef enum mb_mem_kind { MB_MEM_HOST = 0, MB_MEM_PINNED = 1, MB_MEM_DEVICE = 2, MB_MEM_KINDS = 3 } mb_mem_kind;

/* Streams: MB_STREAM_COMPUTE, MB_STREAM_COPY, then 2 .. streams-1 extra compute
 * streams for independent work (e.g. the five timeframe encoders). On the CPU backend
 * every operation completes before it returns, so streams only order nothing. */
enum { MB_STREAM_COMPUTE = 0, MB_STREAM_COPY = 1 };

typedef struct mb_device_config {
    mb_backend backend; /* MB_CPU (default) or MB_CUDA */
    int index;          /* GPU ordinal (CUDA); ignored on CPU */
    int streams;        /* total streams, 0 = 2 (compute + copy); at most MB_MAX_STREAMS */
    int threads;        /* CPU threads for BLAS and loops; 0 = library default */
    int tf32;           /* 1: allow TF32 tensor cores for f32 gemm (CUDA); 0: exact f32 */
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

MBDEF mb_backend mb_device_backend(const mb_device *dev);
MBDEF const char *mb_device_name(const mb_device *dev);   /* "cpu (x86_64, 2 threads)", "NVIDIA H100 ..." */
MBDEF const mb_logger *mb_device_logger(const mb_device *dev);
/* Total and free memory of the device (host RAM for the CPU backend). */
MBDEF mb_result mb_device_memory(mb_device *dev, size_t *total, size_t *free_bytes);
MBDEF mb_mem_stats mb_device_mem_stats(const mb_device *dev);
MBDEF int mb_device_streams(const mb_device *dev);
/* The native handles (cudaStream_t, cublasHandle_t) as void*; NULL on the CPU. */
MBDEF void *mb_device_stream(const mb_device *dev, int stream);
MBDEF void *mb_device_cublas(const mb_device *dev);
MBDEF mb_result mb_device_set_tf32(mb_device *dev, int on);
MBDEF int mb_device_tf32(const mb_device *dev);

/* Allocate bytes of the given kind (bytes may be 0: a valid unique pointer comes back).
 * Live and peak counters follow every allocation. Memory is not initialised. */
MBDEF mb_result mb_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out);
/* Free memory from mb_alloc (NULL is fine). */
MBDEF void mb_free(mb_device *dev, void *ptr);
/* Test hook: the nth allocation of this kind from now on fails with
 * MB_ERR_OUT_OF_MEMORY (n = 1: the next one; n = 0: cancel). */
MBDEF void mb_device_fail_alloc(mb_device *dev, mb_mem_kind kind, uint64_t nth);

/* Copy bytes between any two places (host, pinned, device) on a stream, asynchronously
 * where the backend can. */
MBDEF mb_result mb_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes);
MBDEF mb_result mb_zero(mb_device *dev, int stream, void *dst, size_t bytes);
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
    mb_dtype dtype;         /* dtype of the device chunk: MB_F32 (default; the only one the
                               loader fills today - others are accepted by mb_loader_plan) */
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

// ---- lstm ----

// ---- end lstm ----

// ---- numerics ----

// ---- end numerics ----

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
#include <unistd.h>

#ifndef MEGABATCH_NO_CBLAS
#include <cblas.h>
#endif

#ifdef __cplusplus
#define MB__TLS thread_local
#elif defined(_MSC_VER)
#define MB__TLS __declspec(thread)
#else
#define MB__TLS _Thread_local
#endif

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
/* Propagate a failed result unchanged (its message is already recorded). */
#define MB_TRY(expr) do { mb_result mb__r = (expr); if (mb__r != MB_OK) return mb__r; } while (0)

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

// ---- device ----

/* The CUDA backend (megabatch_cuda.cuh) defines these; megabatch.h only calls them. */
#ifdef MEGABATCH_CUDA
static mb_result mb__cuda_open(mb_device *dev);
static void mb__cuda_close(mb_device *dev);
static mb_result mb__cuda_memory(mb_device *dev, size_t *total, size_t *free_bytes);
static mb_result mb__cuda_alloc(mb_device *dev, mb_mem_kind kind, size_t bytes, void **out);
static void mb__cuda_free(mb_device *dev, mb_mem_kind kind, void *ptr);
static mb_result mb__cuda_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes);
static mb_result mb__cuda_zero(mb_device *dev, int stream, void *dst, size_t bytes);
static mb_result mb__cuda_stream_wait(mb_device *dev, int waiter, int waited);
static mb_result mb__cuda_convert(mb_device *dev, int stream, void *dst, mb_dtype dt, const void *src, mb_dtype st,
                                  size_t n);
static mb_result mb__cuda_sync(mb_device *dev, int stream);
static mb_result mb__cuda_set_tf32(mb_device *dev, int on);
static mb_result mb__cuda_gemm(mb_device *dev, const mb_gemm_args *g);
static mb_result mb__cuda_fill_uniform(mb_device *dev, float *dst, size_t n, uint64_t seed,
                                       uint64_t stream, float bound);
#endif

typedef struct mb__alloc_rec { void *ptr; size_t bytes; mb_mem_kind kind; } mb__alloc_rec;

struct mb_device {
    mb_device_config cfg;
    char name[256];
    int streams;
    int tf32;
    void *stream[MB_MAX_STREAMS];   /* cudaStream_t */
    void *event[MB_MAX_STREAMS];    /* cudaEvent_t, one per stream for mb_stream_wait */
    void *cublas;                   /* cublasHandle_t */
    int cuda_index;
    mb_mem_stats stats;
    uint64_t fail_at[MB_MEM_KINDS]; /* fail when allocs[kind] reaches this (0: never) */
    mb__alloc_rec *recs;            /* live allocations */
    size_t nrecs, caprecs;
};

static mb_result mb__cpu_open(mb_device *dev) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = dev->cfg.threads > 0 ? dev->cfg.threads : (int)(ncpu > 0 ? ncpu : 1);
#if !defined(MEGABATCH_NO_CBLAS) && defined(OPENBLAS_VERSION)
    openblas_set_num_threads(threads);
#endif
    snprintf(dev->name, sizeof dev->name, "cpu (%ld cores, %d threads)", ncpu, threads);
    return MB_OK;
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
    if (c.streams == 0) c.streams = 2;
    if (c.streams < 2 || c.streams > MB_MAX_STREAMS)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: streams = %d, must be 2..%d",
                       c.streams, MB_MAX_STREAMS);
    if (c.threads < 0 || c.index < 0)
        return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_device_open: threads = %d and index = %d must be >= 0",
                       c.threads, c.index);
#ifndef MEGABATCH_CUDA
    if (c.backend == MB_CUDA)
        return MB_FAIL(lg, MB_ERR_NO_DEVICE, "mb_device_open: this build has no CUDA backend "
                       "(include megabatch_cuda.cuh and compile that file with nvcc)");
#endif
    mb_device *dev = (mb_device *)mb__host_calloc(1, sizeof *dev);
    if (!dev) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_device_open: no host memory for the device object");
    dev->cfg = c;
    dev->streams = c.streams;
    dev->tf32 = c.tf32 ? 1 : 0;
    mb_result r = MB_OK;
#ifdef MEGABATCH_CUDA
    if (c.backend == MB_CUDA) r = mb__cuda_open(dev);
    else
#endif
        r = mb__cpu_open(dev);
    if (r != MB_OK) { MB_FREE(dev); return r; }
    *out = dev;
    return MB_OK;
}

MBDEF void mb_device_close(mb_device *dev) {
    if (!dev) return;
    if (dev->nrecs)
        MB_LOG(&dev->cfg.log, MB_LOG_WARN, "mb_device_close: %zu allocation(s) still live, %zu device bytes",
               dev->nrecs, dev->stats.live[MB_MEM_DEVICE]);
    for (size_t i = 0; i < dev->nrecs; i++) {
#ifdef MEGABATCH_CUDA
        if (dev->cfg.backend == MB_CUDA) { mb__cuda_free(dev, dev->recs[i].kind, dev->recs[i].ptr); continue; }
#endif
        MB_FREE(dev->recs[i].ptr);
    }
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) mb__cuda_close(dev);
#endif
    MB_FREE(dev->recs);
    MB_FREE(dev);
}

MBDEF mb_backend mb_device_backend(const mb_device *dev) { return dev->cfg.backend; }
MBDEF const char *mb_device_name(const mb_device *dev) { return dev->name; }
MBDEF const mb_logger *mb_device_logger(const mb_device *dev) { return dev ? &dev->cfg.log : NULL; }
MBDEF mb_mem_stats mb_device_mem_stats(const mb_device *dev) { return dev->stats; }
MBDEF int mb_device_streams(const mb_device *dev) { return dev->streams; }
MBDEF void *mb_device_stream(const mb_device *dev, int stream) {
    return (stream >= 0 && stream < dev->streams) ? dev->stream[stream] : NULL;
}
MBDEF void *mb_device_cublas(const mb_device *dev) { return dev->cublas; }
MBDEF int mb_device_tf32(const mb_device *dev) { return dev->tf32; }

MBDEF mb_result mb_device_set_tf32(mb_device *dev, int on) {
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) MB_TRY(mb__cuda_set_tf32(dev, on));
#endif
    dev->tf32 = on ? 1 : 0;
    return MB_OK;
}

MBDEF mb_result mb_device_memory(mb_device *dev, size_t *total, size_t *free_bytes) {
    size_t t = 0, f = 0;
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) MB_TRY(mb__cuda_memory(dev, &t, &f));
    else
#endif
    {
        long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || avail < 0 || psz <= 0)
            return MB_FAIL(&dev->cfg.log, MB_ERR_UNSUPPORTED, "mb_device_memory: sysconf cannot tell host memory");
        t = (size_t)pages * (size_t)psz;
        f = (size_t)avail * (size_t)psz;
    }
    if (total) *total = t;
    if (free_bytes) *free_bytes = f;
    return MB_OK;
}

MBDEF void mb_device_fail_alloc(mb_device *dev, mb_mem_kind kind, uint64_t nth) {
    if ((unsigned)kind >= MB_MEM_KINDS) return;
    dev->fail_at[kind] = nth ? dev->stats.allocs[kind] + nth : 0;
}

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
    if (dev->fail_at[kind] && n == dev->fail_at[kind]) {
        dev->fail_at[kind] = 0;
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: %s allocation #%llu of %zu bytes "
                       "failed (injected by mb_device_fail_alloc)", mb__kind_name(kind), (unsigned long long)n, bytes);
    }
    void *p = NULL;
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) MB_TRY(mb__cuda_alloc(dev, kind, bytes, &p));
    else
#endif
    if (!(p = mb__host_alloc(bytes)))
        return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_alloc: %s allocation of %zu bytes failed",
                       mb__kind_name(kind), bytes);
    if (!mb__track(dev, p, bytes, kind)) {
#ifdef MEGABATCH_CUDA
        if (dev->cfg.backend == MB_CUDA) mb__cuda_free(dev, kind, p); else
#endif
        MB_FREE(p);
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
#ifdef MEGABATCH_CUDA
        if (dev->cfg.backend == MB_CUDA) { mb__cuda_free(dev, r.kind, ptr); return; }
#endif
        MB_FREE(ptr);
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

MBDEF mb_result mb_copy(mb_device *dev, int stream, void *dst, const void *src, size_t bytes) {
    MB_TRY(mb__check_stream(dev, stream, "mb_copy"));
    if (bytes == 0) return MB_OK;
    if (!dst || !src) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_copy: NULL pointer for %zu bytes", bytes);
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) return mb__cuda_copy(dev, stream, dst, src, bytes);
#endif
    memmove(dst, src, bytes);
    return MB_OK;
}

MBDEF mb_result mb_zero(mb_device *dev, int stream, void *dst, size_t bytes) {
    MB_TRY(mb__check_stream(dev, stream, "mb_zero"));
    if (bytes == 0) return MB_OK;
    if (!dst) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_zero: NULL pointer for %zu bytes", bytes);
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) return mb__cuda_zero(dev, stream, dst, bytes);
#endif
    memset(dst, 0, bytes);
    return MB_OK;
}

static float mb__load(const void *p, mb_dtype t, size_t i);
static void mb__store(void *p, mb_dtype t, size_t i, float v);

MBDEF mb_result mb_convert(mb_device *dev, int stream, void *dst, mb_dtype dst_type, const void *src,
                           mb_dtype src_type, size_t n) {
    MB_TRY(mb__check_stream(dev, stream, "mb_convert"));
    if (!mb_dtype_size(dst_type) || !mb_dtype_size(src_type))
        return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_convert: unknown dtype %d or %d", (int)dst_type,
                       (int)src_type);
    if (n == 0) return MB_OK;
    if (!dst || !src) return MB_FAIL(&dev->cfg.log, MB_ERR_INVALID_ARG, "mb_convert: NULL pointer");
    if (dst_type == src_type) return mb_copy(dev, stream, dst, src, n * mb_dtype_size(dst_type));
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) return mb__cuda_convert(dev, stream, dst, dst_type, src, src_type, n);
#endif
    for (size_t i = 0; i < n; i++) mb__store(dst, dst_type, i, mb__load(src, src_type, i));
    return MB_OK;
}

MBDEF mb_result mb_stream_wait(mb_device *dev, int waiter, int waited) {
    MB_TRY(mb__check_stream(dev, waiter, "mb_stream_wait"));
    MB_TRY(mb__check_stream(dev, waited, "mb_stream_wait"));
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA && waiter != waited) return mb__cuda_stream_wait(dev, waiter, waited);
#endif
    return MB_OK;
}

MBDEF mb_result mb_sync(mb_device *dev, int stream) {
    if (stream != -1) MB_TRY(mb__check_stream(dev, stream, "mb_sync"));
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) return mb__cuda_sync(dev, stream);
#endif
    return MB_OK;
}

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

static float mb__load(const void *p, mb_dtype t, size_t i) {
    if (t == MB_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == MB_BF16 ? mb_bf16_to_f32(h) : mb_f16_to_f32(h);
}
static void mb__store(void *p, mb_dtype t, size_t i, float v) {
    if (t == MB_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == MB_BF16 ? mb_f32_to_bf16(v) : mb_f32_to_f16(v);
}

/* Widen a rows x cols (leading dim ld) half-precision matrix to dense f32. */
static float *mb__widen(const void *x, mb_dtype t, int64_t rows, int64_t cols, int64_t ld) {
    float *w = (float *)mb__host_calloc((size_t)(rows * cols) + 1, sizeof(float));
    if (!w) return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] = mb__load(x, t, (size_t)(r * ld + c));
    return w;
}

/* One f32 product C = alpha op(A) op(B) + beta C, row-major, dense-or-strided f32. */
static void mb__sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
#ifndef MEGABATCH_NO_CBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#else
    for (int64_t i = 0; i < m; i++) {
        float *crow = c + i * ldc;
        for (int64_t j = 0; j < n; j++) crow[j] = beta == 0.0f ? 0.0f : beta * crow[j];
        for (int64_t p = 0; p < k; p++) {
            float av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
            if (tb) for (int64_t j = 0; j < n; j++) crow[j] += av * b[j * ldb + p];
            else { const float *brow = b + p * ldb; for (int64_t j = 0; j < n; j++) crow[j] += av * brow[j]; }
        }
    }
#endif
}

static mb_result mb__cpu_gemm(mb_device *dev, const mb_gemm_args *g) {
    int64_t batch = g->batch > 1 ? g->batch : 1;
    int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    for (int64_t i = 0; i < batch; i++) {
        const char *a = (const char *)g->a + (size_t)(i * g->stride_a) * mb_dtype_size(g->ab_type);
        const char *b = (const char *)g->b + (size_t)(i * g->stride_b) * mb_dtype_size(g->ab_type);
        char *c = (char *)g->c + (size_t)(i * g->stride_c) * mb_dtype_size(g->c_type);
        if (g->m == 0 || g->n == 0) continue;
        const float *af = (const float *)a, *bf = (const float *)b;
        float *wa = NULL, *wb = NULL, *wc = NULL;
        int64_t lda = g->lda, ldb = g->ldb;
        if (g->ab_type != MB_F32 && g->k > 0) {
            wa = mb__widen(a, g->ab_type, ar, ac, g->lda);
            wb = mb__widen(b, g->ab_type, br, bc, g->ldb);
            af = wa; bf = wb; lda = ac; ldb = bc;
        }
        float *cf = (float *)c;
        if (g->c_type != MB_F32) cf = wc = mb__widen(c, g->c_type, g->m, g->n, g->ldc);
        if ((g->ab_type != MB_F32 && g->k > 0 && (!wa || !wb)) || (g->c_type != MB_F32 && !wc)) {
            MB_FREE(wa); MB_FREE(wb); MB_FREE(wc);
            return MB_FAIL(&dev->cfg.log, MB_ERR_OUT_OF_MEMORY, "mb_gemm: no host memory to widen operands");
        }
        int64_t ldc = wc ? g->n : g->ldc;
        if (g->k == 0) {
            for (int64_t r = 0; r < g->m; r++)
                for (int64_t col = 0; col < g->n; col++)
                    cf[r * ldc + col] = g->beta == 0.0f ? 0.0f : g->beta * cf[r * ldc + col];
        } else {
            mb__sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, af, lda, bf, ldb, g->beta, cf, ldc);
        }
        if (wc)
            for (int64_t r = 0; r < g->m; r++)
                for (int64_t col = 0; col < g->n; col++)
                    mb__store(c, g->c_type, (size_t)(r * g->ldc + col), wc[r * g->n + col]);
        MB_FREE(wa); MB_FREE(wb); MB_FREE(wc);
    }
    return MB_OK;
}

MBDEF mb_result mb_gemm(mb_device *dev, const mb_gemm_args *g) {
    if (!dev || !g) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_gemm: NULL argument");
    MB_TRY(mb__gemm_check(dev, g));
#ifdef MEGABATCH_CUDA
    if (dev->cfg.backend == MB_CUDA) return mb__cuda_gemm(dev, g);
#endif
    return mb__cpu_gemm(dev, g);
}

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

MBDEF mb_result mb_params_init(mb_params *p, uint64_t seed) {
    MB_TRY(mb__params_ready(p, "mb_params_init"));
    for (int t = 0; t < p->n; t++) {
        const mb_param_info *in = &p->info[t];
        float *dst = p->data + in->offset;
#ifdef MEGABATCH_CUDA
        if (p->dev->cfg.backend == MB_CUDA) {
            MB_TRY(mb__cuda_fill_uniform(p->dev, dst, in->count, seed, (uint64_t)t, in->init_bound));
            continue;
        }
#endif
        for (size_t j = 0; j < in->count; j++) dst[j] = mb_rng_symmetric(seed, (uint64_t)t, j, in->init_bound);
    }
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
    const float *mem_f, *mem_t;  /* in-memory dataset: caller arrays */
#ifndef MEGABATCH_NO_HDF5
    hid_t file, dfeat, dtarg;    /* HDF5 handles (file datasets) */
#endif
};

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
#ifndef MEGABATCH_NO_HDF5
    ds->file = ds->dfeat = ds->dtarg = -1;
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
typedef struct mb__h5quiet { H5E_auto2_t fn; void *data; } mb__h5quiet;
static mb__h5quiet mb__h5_quiet(void) {
    mb__h5quiet q;
    q.fn = NULL; q.data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &q.fn, &q.data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return q;
}
static void mb__h5_restore(mb__h5quiet q) { H5Eset_auto2(H5E_DEFAULT, q.fn, q.data); }

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

/* Open dataset `name` and check it: a dataset (not a group), rank in [rmin, rmax], a
 * numeric type, storage not smaller than its shape (contiguous). dims gets the shape. */
static mb_result mb__h5_open_ds(mb_dataset *ds, const char *name, int rmin, int rmax, hid_t *out, hsize_t *dims,
                                int *rank, char *tname) {
    const mb_logger *lg = &ds->cfg.log;
    const char *src = ds->meta.source;
    char st[512];
    htri_t ex = H5Lexists(ds->file, name, H5P_DEFAULT);
    if (ex <= 0) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: missing dataset '%s'", src, name);
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
                      rmin == rmax ? "3 (N, T, F)" : "2 (N, K) or 1 (N)");
    else if (cls != H5T_FLOAT && cls != H5T_INTEGER)
        res = MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' has dtype %s, not a number (float or integer)", src, name,
                      tname);
    if (res == MB_OK) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        *rank = r;
        hsize_t need = esz;
        int over = 0;
        for (int i = 0; i < r; i++) {
            if (dims[i] && need > (hsize_t)-1 / dims[i]) over = 1;
            else need *= dims[i];
        }
        if (!over && need > 0 && H5Pget_layout(pl) == H5D_CONTIGUOUS && H5Dget_storage_size(d) < need)
            res = MB_FAIL(lg, MB_ERR_FORMAT, "%s: dataset '%s' is truncated: %llu bytes stored, its shape needs "
                          "%llu", src, name, (unsigned long long)H5Dget_storage_size(d), (unsigned long long)need);
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
            if (v[i] < 1) return MB_FAIL(lg, MB_ERR_FORMAT, "%s: segment %d of '%s' has length %lld", m->source, i,
                                         ds->fname, v[i]);
            sum += v[i];
            m->segment_len[i] = v[i];
        }
        if (sum != m->t)
            return MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute 'segments' of '%s' sums to %lld, but T = %lld",
                           m->source, ds->fname, sum, (long long)m->t);
        m->segments = (int)n;
    }
    if (H5Aexists(ds->dfeat, "segment_names") <= 0) return MB_OK;
    hid_t a = H5Aopen(ds->dfeat, "segment_names", H5P_DEFAULT), ty = H5Aget_type(a);
    char text[MB_MAX_SEGMENTS * MB_MAX_NAME];
    text[0] = 0;
    mb_result r = MB_OK;
    if (H5Tget_class(ty) != H5T_STRING) {
        r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: attribute 'segment_names' of '%s' is not a string", m->source, ds->fname);
    } else if (H5Tis_variable_str(ty) > 0) {
        char *s = NULL;
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        if (H5Aread(a, mt, &s) < 0) r = MB_FAIL(lg, MB_ERR_IO, "%s: reading 'segment_names': %s", m->source, mb__h5_stack(st));
        else if (s) { snprintf(text, sizeof text, "%s", s); H5free_memory(s); }
        H5Tclose(mt);
    } else {
        size_t sz = H5Tget_size(ty);
        hid_t mt = H5Tcopy(H5T_C_S1);
        if (sz >= sizeof text) r = MB_FAIL(lg, MB_ERR_FORMAT, "%s: 'segment_names' too long (%zu bytes)", m->source, sz);
        else {
            H5Tset_size(mt, sz + 1);
            if (H5Aread(a, mt, text) < 0) r = MB_FAIL(lg, MB_ERR_IO, "%s: reading 'segment_names': %s", m->source, mb__h5_stack(st));
        }
        H5Tclose(mt);
    }
    H5Tclose(ty); H5Aclose(a);
    MB_TRY(r);
    int i = 0;
    for (char *p = text, *tok; (tok = p) != NULL && i <= MB_MAX_SEGMENTS; i++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        p = comma ? comma + 1 : NULL;
        if (i < MB_MAX_SEGMENTS) {
            size_t len = strlen(tok) < MB_MAX_NAME - 1 ? strlen(tok) : MB_MAX_NAME - 1;
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

static void mb__h5_close(mb_dataset *ds) {
    if (ds->dfeat >= 0) H5Dclose(ds->dfeat);
    if (ds->dtarg >= 0) H5Dclose(ds->dtarg);
    if (ds->file >= 0) H5Fclose(ds->file);
    ds->dfeat = ds->dtarg = ds->file = -1;
}

MBDEF mb_result mb_dataset_open_file(mb_dataset **out, const char *path, const mb_dataset_config *cfg) {
    const mb_logger *lg = cfg ? &cfg->log : NULL;
    if (!out || !path) return MB_FAIL(lg, MB_ERR_INVALID_ARG, "mb_dataset_open_file: NULL argument");
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return MB_FAIL(lg, MB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fclose(fp);
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
    if (r != MB_OK) { mb__h5_close(ds); MB_FREE(ds); }
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

MBDEF void mb_dataset_close(mb_dataset *ds) {
    if (!ds) return;
#ifndef MEGABATCH_NO_HDF5
    if (ds->file >= 0) {
        mb__h5quiet q = mb__h5_quiet();
        mb__h5_close(ds);
        mb__h5_restore(q);
    }
#endif
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
    size_t nf = (size_t)(m->t * m->f), nk = (size_t)m->k;
    if (ds->mem_f) {
        memcpy(features, ds->mem_f + (size_t)start * nf, (size_t)n * nf * sizeof(float));
        memcpy(targets, ds->mem_t + (size_t)start * nk, (size_t)n * nk * sizeof(float));
    }
#ifndef MEGABATCH_NO_HDF5
    else {
        mb__h5quiet q = mb__h5_quiet();
        mb_result r = mb__h5_read_rows(ds, ds->dfeat, ds->fname, start, n, features);
        if (r == MB_OK) r = mb__h5_read_rows(ds, ds->dtarg, ds->tname, start, n, targets);
        mb__h5_restore(q);
        MB_TRY(r);
    }
#endif
    return mb__ds_policy(ds, start, n, features, targets, rows);
}

// ---- end dataset ----

// ---- loader ----

#ifndef MEGABATCH_NO_THREADS
#ifdef __cplusplus
}
#endif
#include <pthread.h>
#ifdef __cplusplus
extern "C" {
#endif
#endif
#include <time.h>

#ifdef MEGABATCH_CUDA
static void mb__cuda_loader_thread_init(mb_device *dev);
#endif

static double mb__seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

MBDEF mb_result mb_loader_plan(int64_t n, int64_t t, int64_t f, int64_t k, const mb_loader_config *cfg,
                               size_t free_bytes, mb_chunk_plan *out) {
    if (!cfg || !out) return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "mb_loader_plan: NULL argument");
    memset(out, 0, sizeof *out);
    size_t s = mb_dtype_size(cfg->dtype), bps, tf;
    double frac = cfg->chunk_fraction == 0 ? 0.75 : cfg->chunk_fraction;
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
    size_t row_f, row_t;          /* bytes of one sample's features / targets (f32) */
    mb__chunk_buf buf[2];
    int cur_buf;                  /* buffer of the last batch returned; -1 none */
    void *slab[2];                /* staging: features (slab_rows, t, f) then targets */
    int64_t slab_rows;
    void *tmp_row;                /* device: one sample, for in-place shuffles */
    int64_t *perm, *inv, *order;  /* host scratch: row permutation, its inverse, chunk order */
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
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
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
    char *tf = (char *)ld->tmp_row, *tt = tf + ld->row_f;
    size_t rf = ld->row_f, rt = ld->row_t;
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

/* The reader's job: file chunk fid into buffer b, slab by slab; the read of slab i
 * overlaps the copy of slab i-1 (the copy stream is synced before reusing a slab). */
static mb_result mb__ld_load(mb_loader *ld, const mb__job *j, mb_loader_stats *st) {
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
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->feat + (size_t)rows * ld->row_f, sf, (size_t)got * ld->row_f));
        MB_TRY(mb_copy(dev, MB_STREAM_COPY, cb->targ + (size_t)rows * ld->row_t, stg, (size_t)got * ld->row_t));
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
}

#ifndef MEGABATCH_NO_THREADS
static void *mb__ld_thread(void *arg) {
    mb_loader *ld = (mb_loader *)arg;
#ifdef MEGABATCH_CUDA
    if (ld->dev->cfg.backend == MB_CUDA) mb__cuda_loader_thread_init(ld->dev);
#endif
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->quit && ld->state != 1) pthread_cond_wait(&ld->cv, &ld->mu);
        if (ld->quit) break;
        pthread_mutex_unlock(&ld->mu);
        mb_loader_stats st;
        memset(&st, 0, sizeof st);
        mb__ld_run(ld, &st);
        pthread_mutex_lock(&ld->mu);
        mb__ld_merge(&ld->stats, &st);
        ld->state = 2;
        pthread_cond_broadcast(&ld->cv);
    }
    pthread_mutex_unlock(&ld->mu);
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
    pthread_mutex_lock(&ld->mu);
    ld->state = 1;
    pthread_cond_broadcast(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
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
    pthread_mutex_lock(&ld->mu);
    while (ld->state != 2) pthread_cond_wait(&ld->cv, &ld->mu);
    ld->state = 0;
    ld->stats.wait_seconds += mb__seconds() - t0;
    pthread_mutex_unlock(&ld->mu);
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

MBDEF mb_result mb_loader_next(mb_loader *ld, mb_batch *out) {
    if (!ld || !out) return MB_FAIL(ld ? ld->lg : NULL, MB_ERR_INVALID_ARG, "mb_loader_next: NULL argument");
    memset(out, 0, sizeof *out);
    int64_t B = ld->cfg.batch;
    for (;;) {
        if (ld->chunk >= ld->plan.chunks) {
            out->epoch = ld->epoch;
            out->index = ld->index;
            out->end_of_epoch = 1;
            ld->epoch++;
            ld->chunk = ld->batch = ld->index = 0;
            return MB_OK;
        }
        int b;
        MB_TRY(mb__ld_acquire(ld, ld->epoch, ld->chunk, &b));
        mb__chunk_buf *cb = &ld->buf[b];
        int64_t first = ld->batch * B, count = cb->rows - first < B ? cb->rows - first : B;
        if (count <= 0 || (ld->cfg.drop_last && count < B)) {
            ld->chunk++;
            ld->batch = 0;
            continue;
        }
        ld->cur_buf = b;
        MB_TRY(mb__ld_prefetch(ld, b));
        out->features = cb->feat + (size_t)first * ld->row_f;
        out->targets = cb->targ + (size_t)first * ld->row_t;
        out->count = count;
        out->epoch = ld->epoch;
        out->index = ld->index++;
        ld->batch++;
        return MB_OK;
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
    pthread_mutex_lock((pthread_mutex_t *)&ld->mu);
    s = ld->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&ld->mu);
#else
    s = ld->stats;
#endif
    return s;
}

/* Device chunk buffers for the current plan; on out-of-memory retry with 0.8x the
 * budget (0.75 -> 0.60 -> 0.48 of free memory), error below one batch. */
static mb_result mb__ld_alloc_chunks(mb_loader *ld, const mb_dataset_meta *m, size_t free_bytes) {
    double frac = ld->cfg.chunk_fraction == 0 ? 0.75 : ld->cfg.chunk_fraction;
    for (;;) {
        mb_result r = MB_OK;
        ld->cap = ld->plan.samples_per_chunk;
        for (int b = 0; b < ld->plan.buffers && r == MB_OK; b++) {
            r = mb_alloc(ld->dev, MB_MEM_DEVICE, (size_t)ld->cap * (ld->row_f + ld->row_t), &ld->buf[b].mem);
            ld->buf[b].feat = (char *)ld->buf[b].mem;
            ld->buf[b].targ = ld->buf[b].feat + (size_t)ld->cap * ld->row_f;
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
        c.chunk_bytes = next;
        MB_TRY(mb_loader_plan(m->n, m->t, m->f, m->k, &c, free_bytes, &ld->plan));
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
    ld->buf[0].cur = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    ld->buf[1].cur = (int64_t *)mb__host_calloc(cap, sizeof(int64_t));
    if (!ld->perm || !ld->inv || !ld->seen || !ld->order || !ld->buf[0].cur || !ld->buf[1].cur)
        return MB_FAIL(ld->lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory for %zu-row index arrays", cap);
    if (ld->cfg.shuffle) return mb_alloc(ld->dev, MB_MEM_DEVICE, ld->row_f + ld->row_t, &ld->tmp_row);
    return MB_OK;
}

MBDEF void mb_loader_close(mb_loader *ld) {
    if (!ld) return;
#ifndef MEGABATCH_NO_THREADS
    if (ld->started) {
        pthread_mutex_lock(&ld->mu);
        ld->quit = 1;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
        pthread_join(ld->thread, NULL);
    }
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
#endif
    mb_sync(ld->dev, MB_STREAM_COPY);
    for (int b = 0; b < 2; b++) { mb_free(ld->dev, ld->buf[b].mem); MB_FREE(ld->buf[b].cur); }
    mb_free(ld->dev, ld->slab[0]);
    mb_free(ld->dev, ld->slab[1]);
    mb_free(ld->dev, ld->tmp_row);
    MB_FREE(ld->perm); MB_FREE(ld->inv); MB_FREE(ld->seen); MB_FREE(ld->order);
    MB_FREE(ld);
}

MBDEF mb_result mb_loader_open(mb_loader **out, mb_device *dev, mb_dataset *ds, const mb_loader_config *cfg) {
    if (!out || !dev || !ds || !cfg) return MB_FAIL(dev ? &dev->cfg.log : NULL, MB_ERR_INVALID_ARG, "mb_loader_open: NULL argument");
    *out = NULL;
    const mb_logger *lg = &dev->cfg.log;
    const mb_dataset_meta *m = mb_dataset_info(ds);
    if (cfg->dtype != MB_F32)
        return MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_loader_open: device dtype %s: the loader fills f32 chunks only "
                       "(convert batches with mb_convert)", mb_dtype_name(cfg->dtype));
    size_t free_bytes = 0;
    if (!cfg->chunk_bytes) MB_TRY(mb_device_memory(dev, NULL, &free_bytes));
    mb_chunk_plan plan;
    MB_TRY(mb_loader_plan(m->n, m->t, m->f, m->k, cfg, free_bytes, &plan));
    mb_loader *ld = (mb_loader *)mb__host_calloc(1, sizeof *ld);
    if (!ld) return MB_FAIL(lg, MB_ERR_OUT_OF_MEMORY, "mb_loader_open: no host memory");
    ld->dev = dev; ld->ds = ds; ld->lg = lg; ld->cfg = *cfg; ld->plan = plan;
    ld->row_f = (size_t)(m->t * m->f) * sizeof(float);
    ld->row_t = (size_t)m->k * sizeof(float);
    ld->buf[0].epoch = ld->buf[1].epoch = -1;
    ld->cur_buf = -1;
    ld->order_epoch = -1;
#ifndef MEGABATCH_NO_THREADS
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
#endif
    mb_result r = mb__ld_alloc_chunks(ld, m, free_bytes);
    if (r == MB_OK) r = mb__ld_alloc_slabs(ld);
    if (r == MB_OK) r = mb__ld_alloc_host(ld);
#ifndef MEGABATCH_NO_THREADS
    if (r == MB_OK) {
        if (pthread_create(&ld->thread, NULL, mb__ld_thread, ld) != 0)
            r = MB_FAIL(lg, MB_ERR_UNSUPPORTED, "mb_loader_open: cannot start the reader thread");
        else ld->started = 1;
    }
#endif
    if (r != MB_OK) { mb_loader_close(ld); return r; }
    MB_LOG(lg, MB_LOG_INFO, "mb_loader_open: %s: %lld samples of %zu bytes, %lld chunk(s) of %lld samples in %d "
           "buffer(s), %lld batches/epoch, slabs 2 x %lld samples", m->source, (long long)m->n,
           plan.bytes_per_sample, (long long)ld->plan.chunks, (long long)ld->plan.samples_per_chunk,
           ld->plan.buffers, (long long)ld->plan.batches, (long long)ld->slab_rows);
    *out = ld;
    return MB_OK;
}

// ---- end loader ----

// ---- lstm ----

// ---- end lstm ----

// ---- numerics ----

// ---- end numerics ----

#ifdef __cplusplus
}
#endif
#endif /* MEGABATCH_IMPLEMENTATION_INCLUDED */
#endif /* MEGABATCH_IMPLEMENTATION */
