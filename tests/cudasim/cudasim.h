/* cudasim.h - PROTOTYPE: the CUDA runtime + cuBLAS subset megabatch uses, executed on the CPU.
 *
 * Types, enums and prototypes come from NVIDIA's own host headers (cuda_runtime.h, cublas_v2.h,
 * cuda_fp16.h, cuda_bf16.h compile with g++ in host mode); this file supplies the definitions.
 *   g++ -std=c++17 -x c++ -include cudasim.h -I$CUDA/include ...   (each program's sources)
 *   g++ ... -DCUDASIM_IMPLEMENTATION -c cudasim_impl.cu            (once: the definitions, linked in)
 * Kernels: plain C++ functions. A launch runs every block of the grid on the stream's worker thread;
 * the threads of a block are ucontext fibers that switch only at __syncthreads* (so __shared__ is
 * `static thread_local`). Streams are worker threads with FIFO queues; events are counters.
 */
#ifndef CUDASIM_H
#define CUDASIM_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <atomic>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CUDASIM_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CUDASIM_TSAN 1
#endif
#endif

// ---- device-side language ----
// __global__/__device__/__host__ are already empty in NVIDIA's host-mode headers.
#undef __shared__
#define __shared__ static thread_local /* one copy per worker thread = per running block */

extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
enum { warpSize = 32 };

/* A barrier is known by its place in the source (a static in a lambda at the call site), not by
 * its return address: a compiler that duplicates the code around a __syncthreads (g++ -O2 does,
 * around a loop's warp-uniform branch) still calls the same barrier. */
namespace cudasim {
int barrier_at(int pred, int op, const void *site);
}
#define CUDASIM_SITE ([] { static const char site = 0; return (const void *)&site; }())
#define __syncthreads() ((void)cudasim::barrier_at(1, 0, CUDASIM_SITE))
#define __syncthreads_or(pred) cudasim::barrier_at((pred), 0, CUDASIM_SITE)
#define __syncthreads_and(pred) cudasim::barrier_at((pred), 1, CUDASIM_SITE)
#define __syncthreads_count(pred) cudasim::barrier_at((pred), 2, CUDASIM_SITE)
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
long long clock64();

template <class T> inline T atomicAdd(T *p, T v) {
    if constexpr (std::is_integral_v<T>) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    } else {
        T old, nv;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do nv = old + v;
        while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    }
}
template <class T> inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
template <class T> inline T atomicCAS(T *p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
template <class T> inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <class T> inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
template <class T> inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
template <class T> inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }
template <class T, class F> inline T atomic_update(T *p, F f) {
    T old, nv;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do nv = f(old);
    while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
template <class T> inline T atomicMax(T *p, T v) { return atomic_update(p, [v](T o) { return o < v ? v : o; }); }
template <class T> inline T atomicMin(T *p, T v) { return atomic_update(p, [v](T o) { return v < o ? v : o; }); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* read-only cache load, IEEE-rounded float ops (never contracted), fast-math intrinsics */
template <class T> inline T __ldg(const T *p) { return *p; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return __builtin_expf(x); }
inline float __logf(float x) { return __builtin_logf(x); }
inline float __tanhf(float x) { return __builtin_tanhf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }

/* Warp-collective operations: every lane of `mask` must arrive (the block's threads are fibers,
 * so a lane waits for the others); a lane not in the mask, exited, or at a __syncthreads is a
 * reported error, as is reading a lane outside the mask. */
namespace cudasim {
const std::atomic<uint64_t> *warp_collective(unsigned mask, uint64_t v, const char *op);
unsigned lane_id();
unsigned live_lanes();
[[noreturn]] void device_error(const char *what);
template <class T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffle of a type wider than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> inline T shfl_at(unsigned mask, T v, const std::atomic<uint64_t> *all, unsigned src) {
    if (!(mask >> src & 1u)) device_error("warp shuffle reads a lane outside its mask");
    T r;
    uint64_t u = all[src].load(std::memory_order_relaxed);
    memcpy(&r, &u, sizeof r);
    (void)v;
    return r;
}
} // namespace cudasim
inline void __syncwarp(unsigned mask = 0xffffffffu) { cudasim::warp_collective(mask, 0, "__syncwarp"); }
inline unsigned __activemask() { return cudasim::live_lanes(); }
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const std::atomic<uint64_t> *all = cudasim::warp_collective(mask, cudasim::bits_of(v), "__shfl_sync");
    unsigned l = cudasim::lane_id(), base = l & ~(unsigned)(width - 1);
    return cudasim::shfl_at(mask, v, all, base + ((unsigned)src & (unsigned)(width - 1)));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const std::atomic<uint64_t> *all = cudasim::warp_collective(mask, cudasim::bits_of(v), "__shfl_up_sync");
    unsigned l = cudasim::lane_id(), base = l & ~(unsigned)(width - 1);
    return l - base < d ? v : cudasim::shfl_at(mask, v, all, l - d);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const std::atomic<uint64_t> *all = cudasim::warp_collective(mask, cudasim::bits_of(v), "__shfl_down_sync");
    unsigned l = cudasim::lane_id(), base = l & ~(unsigned)(width - 1);
    return l - base + d >= (unsigned)width ? v : cudasim::shfl_at(mask, v, all, l + d);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int x, int width = 32) {
    const std::atomic<uint64_t> *all = cudasim::warp_collective(mask, cudasim::bits_of(v), "__shfl_xor_sync");
    unsigned l = cudasim::lane_id(), base = l & ~(unsigned)(width - 1), s = l ^ (unsigned)x;
    return s < base || s >= base + (unsigned)width ? v : cudasim::shfl_at(mask, v, all, s);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    const std::atomic<uint64_t> *all = cudasim::warp_collective(mask, pred != 0, "__ballot_sync");
    unsigned r = 0;
    for (unsigned i = 0; i < 32; i++)
        if ((mask >> i & 1u) && all[i].load(std::memory_order_relaxed)) r |= 1u << i;
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == (mask & cudasim::live_lanes()); }
#include "cudasim_wmma.h"
#include "cudasim_pipeline.h"
#include "cudasim_cluster.h"
#include "cudasim_mma.h"

// ---- launch: MB_LAUNCH(k, grid, block, smem, stream)(args...) ----
namespace cudasim {
using task = std::function<void()>;
void enqueue_kernel(const char *name, const void *key, dim3 g, dim3 b, size_t smem, cudaStream_t st, task body,
                    unsigned cluster, bool bad_args);

/* A kernel's pointer arguments must point into device memory or pinned host memory (a GPU
 * cannot read malloc'ed or stack memory: an illegal address): each is checked against the
 * allocation map at the launch. A launch with one that does not prints which and faults (sticky
 * cudaErrorIllegalAddress), as it would on a GPU. Null and one-past-the-end pointers are fine.
 * Pointers inside a struct passed by value are checked when the struct's type declares them:
 *   #ifdef CUDASIM
 *   CUDASIM_ARG_POINTERS(my_args, a, v) { v(a.x, "x"); for (int i = 0; i < a.n; i++) v(a.p[i], "p[]"); }
 *   #endif
 * (after the struct, before the launch; plain code, so it follows the struct as it changes); a
 * struct without a declaration is not looked into. */
void check_pointer(const char *kernel, int arg, const char *field, const void *p, bool *bad);
struct arg_visitor {
    const char *kernel;
    int arg;
    bool *bad;
    template <class T> void operator()(T *p, const char *field) const { check_pointer(kernel, arg, field, (const void *)p, bad); }
};
template <class T> inline void cudasim_arg_pointers(const T &, const arg_visitor &) {} /* not declared: not looked into */
template <class A> void check_arg(const char *kernel, int i, const A &a, bool *bad) {
    if constexpr (std::is_pointer_v<A>) {
        if constexpr (std::is_object_v<std::remove_pointer_t<A>>) check_pointer(kernel, i, nullptr, (const void *)a, bad);
    } else if constexpr (std::is_class_v<A>) {
        cudasim_arg_pointers(a, arg_visitor{kernel, i, bad}); /* a declaration of A's, by ADL, or the above */
    }
}
template <class Args, size_t... I> bool bad_args(const char *kernel, const Args &t, std::index_sequence<I...>) {
    bool bad = false;
    (check_arg(kernel, (int)I, std::get<I>(t), &bad), ...);
    return bad;
}

template <class... P> struct launcher {
    void (*k)(P...);
    const char *name;
    dim3 g, b;
    size_t smem;
    cudaStream_t st;
    unsigned cluster; /* blocks a cluster, along x (cudasim_cluster.h) */
    template <class... A> void operator()(A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        /* by value, converted to the parameter types at the launch, as nvcc does */
        auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
        bool bad = bad_args(name, *args, std::index_sequence_for<P...>{});
        auto kk = k;
        enqueue_kernel(name, (const void *)kk, g, b, smem, st, [kk, args = std::move(args)] { std::apply(kk, *args); }, cluster,
                       bad);
    }
};
template <class... P>
launcher<P...> launch(void (*k)(P...), const char *name, dim3 g, dim3 b, size_t smem = 0, cudaStream_t st = 0) {
    return launcher<P...>{k, name, g, b, smem, st, 1};
}
template <class... P>
launcher<P...> launch_cluster(void (*k)(P...), const char *name, dim3 g, dim3 b, size_t smem, cudaStream_t st, unsigned cl) {
    return launcher<P...>{k, name, g, b, smem, st, cl};
}
/* Counters since the start (or the last reset): what the GPU work is steered by. Work is counted
 * when it runs, whether issued one by one or as the nodes of a graph: `launches` and
 * `cublas_calls` include the kernels and cuBLAS calls graphs ran, bytes_* their copies; graph
 * launches and their nodes are counted apart as well. host_syncs: the calls that made the host
 * wait for the device (stream, event and device syncs, synchronous copies). */
struct stats {
    unsigned long long launches, blocks, threads, fiber_switches, direct_threads;
    unsigned long long cublas_calls, host_syncs, device_allocs, bytes_h2d, bytes_d2h, bytes_d2d;
    unsigned long long nccl_allreduces; /* tests/cudasim/cudasim_nccl.h (MEGABATCH_NCCL builds) */
    unsigned long long graph_launches, graph_nodes; /* graphs run, and the nodes they ran */
};
stats get_stats();
void reset_stats();
void print_stats(FILE *f);
/* Print the counters to stderr when the program exits (the example and benchmarks call it). */
int print_stats_at_exit();
/* Wait until every stream's queued work has run, without counting a host sync: a program's own
 * bookkeeping of the counters (cudasim_train.h), not a sync of the code it measures. */
void wait_idle();
/* Fault injection: the n-th device allocation from now fails (cudaErrorMemoryAllocation);
 * the n-th kernel launch from now faults (sticky cudaErrorIllegalAddress). 0 disarms. */
void fail_alloc(long n);
void fault_launch(long n);
/* A capture that fails (cudaStreamEndCapture: invalidated or unjoined) is an error here: the
 * simulator says why and aborts. A program or test that makes captures fail on purpose says so
 * (returns the previous setting); CUDASIM_CAPTURE_ERRORS=1 does it for a whole program. */
bool expect_capture_errors(bool on);
/* A planted fault of tests/cudasim/plant.sh: true when CUDASIM_PLANT names it. */
bool planted(const char *name);
} // namespace cudasim
#define CUDASIM 1 /* for programs that print the counters under the simulator */
namespace cudasim {
} // namespace cudasim

#define MB_LAUNCH(k, ...) cudasim::launch(k, #k, __VA_ARGS__)
#define MB_LAUNCH_CLUSTER(k, ...) cudasim::launch_cluster(k, #k, __VA_ARGS__)
#define CUDASIM_ARG_POINTERS(T, a, v) extern "C++" inline void cudasim_arg_pointers(const T &a, const cudasim::arg_visitor &v)

/* Dynamic shared memory. `extern __shared__ T name[]` cannot be spelled in C++, so a kernel that
 * is to run here declares it as MB_DYNAMIC_SHARED(T, name); under nvcc the library defines
 * MB_DYNAMIC_SHARED(T, name) as `extern __shared__ T name[]` (beside MB_LAUNCH). The buffer has
 * exactly the launch's dynamic size, so ASan reports an access past it. */
namespace cudasim {
void *dynamic_shared();
}
#define MB_DYNAMIC_SHARED(T, name) T *name = (T *)cudasim::dynamic_shared()

#include "cudasim_train.h" /* the training examples' per-step counters (examples/mb_train.h's hook) */

// =====================================================================================
#ifdef CUDASIM_IMPLEMENTATION
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>
#include <csetjmp>
#include <csignal>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <x86intrin.h>
#ifdef CUDASIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef CUDASIM_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreWritesBegin(const char *f, int l);
extern "C" void AnnotateIgnoreWritesEnd(const char *f, int l);
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
extern "C" void AnnotateIgnoreSyncBegin(const char *f, int l);
extern "C" void AnnotateIgnoreSyncEnd(const char *f, int l);
extern "C" void AnnotateIgnoreReadsBegin(const char *f, int l);
extern "C" void AnnotateIgnoreReadsEnd(const char *f, int l);
#endif

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

long long clock64() { return (long long)__rdtsc(); }

namespace cudasim {

[[noreturn]] static void fatal(const char *fmt, const char *a = "", const char *b = "") {
    fprintf(stderr, "cudasim: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    abort();
}
static long env_long(const char *n, long d) {
    const char *s = getenv(n);
    return s && *s ? atol(s) : d;
}
/* TSan's view of the order between the host and the streams is exactly CUDA's (docs/GPU.md):
 * a queued operation is ordered after what the host did before queueing it, an event wait after
 * the work before the record, the host after a sync (stream, event, device, a synchronous copy)
 * and after an event query that says the work is done; nothing else. The simulator's own
 * bookkeeping (queues, maps, counters, reference counts) is shared by the host and the workers
 * under locks and atomics that TSan would otherwise count as orderings: it runs `quiet`. */
static void tsan_acquire(void *a) {
#ifdef CUDASIM_TSAN
    __tsan_acquire(a);
#else
    (void)a;
#endif
}
static void tsan_release(void *a) {
#ifdef CUDASIM_TSAN
    __tsan_release(a);
#else
    (void)a;
#endif
}
struct quiet { /* in scope: this thread's synchronisation and memory accesses are not TSan's */
#ifdef CUDASIM_TSAN
    quiet() {
        AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~quiet() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
        AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
#else
    quiet() {}
#endif
    quiet(const quiet &) = delete;
};

/* CUDASIM_MEM: the device memory, e.g. 2G, 512M, 80G (the default: an H100's 80 GiB). */
static size_t mem_total() {
    const char *s = getenv("CUDASIM_MEM");
    if (!s || !*s) return (size_t)80 << 30;
    char *end;
    double v = strtod(s, &end);
    int sh = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
    if (!(v > 0)) fatal("CUDASIM_MEM=%s: want a size such as 2G or 512M", s);
    return (size_t)(v * (double)((size_t)1 << sh));
}

// ---- context: allocations, streams, errors ----
/* A counter the stream workers bump: relaxed, so that TSan sees no order between the workers
 * through it (a seq_cst increment would order every worker after the last one to count). */
struct counter {
    std::atomic<unsigned long long> v{0};
    void operator++(int) { v.fetch_add(1, std::memory_order_relaxed); }
    void operator+=(unsigned long long n) { v.fetch_add(n, std::memory_order_relaxed); }
    operator unsigned long long() const { return v.load(std::memory_order_relaxed); }
    void store(unsigned long long n) { v.store(n, std::memory_order_relaxed); }
};
enum mem_kind { MEM_PAGEABLE = 0, MEM_DEVICE = 1, MEM_PINNED = 2 };
struct alloc_rec { size_t size; mem_kind kind; };
struct stream;
struct context {
    std::mutex m;
    std::map<uintptr_t, alloc_rec> allocs;
    size_t total = mem_total(), used = 0;
    std::vector<stream *> streams;
    stream *null_stream = nullptr;
    std::atomic<int> sticky{cudaSuccess};
    std::unordered_map<const void *, int> kernel_mode; /* 1: has barriers (fibers), 2: none seen (direct) */
    counter launches, blocks, threads, switches, direct;
    counter cublas, syncs, dallocs, h2d, d2h, d2d, nccl, glaunch, gnodes;
    std::atomic<long> fail_alloc_in{env_long("CUDASIM_FAIL_ALLOC", 0)}, fault_launch_in{env_long("CUDASIM_FAULT_LAUNCH", 0)};
    std::unordered_map<const void *, size_t> max_dyn_smem; /* cudaFuncAttributeMaxDynamicSharedMemorySize */
};
/* counts down an armed fault; true when it fires now */
static bool fires(std::atomic<long> &in) {
    long v = in.load();
    while (v > 0 && !in.compare_exchange_weak(v, v - 1)) { }
    return v == 1;
}
static context &ctx() {
    static context *c = [] {
        auto *x = new context; /* never destroyed: workers may outlive main's statics */
        if (env_long("CUDASIM_STATS", 0)) print_stats_at_exit();
        return x;
    }();
    return *c;
}
static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}
static cudaError_t sticky() { return (cudaError_t)ctx().sticky.load(); }

/* The allocation holding [p, p+n), or null. */
static const alloc_rec *find(const void *p, size_t n, uintptr_t *base = nullptr) {
    uintptr_t a = (uintptr_t)p;
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    auto it = c.allocs.upper_bound(a);
    if (it == c.allocs.begin()) return nullptr;
    --it;
    if (a < it->first || a + n > it->first + it->second.size) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}
static mem_kind kind_of(const void *p, size_t n) {
    const alloc_rec *r = find(p, n ? n : 1);
    return r ? r->kind : MEM_PAGEABLE;
}

// ---- streams: a worker thread and a FIFO queue each ----
struct stream {
    struct op {
        task t;
        char *queued; /* TSan: the host's state when it queued t (released there, acquired here) */
        bool always;  /* runs after a fault too (an event's bookkeeping) */
    };
    std::mutex m;
    std::condition_variable cv, idle;
    std::deque<op> q;
    uint64_t enq = 0;
    std::atomic<uint64_t> done{0};
    bool stop = false;
    std::thread th;
    long delay_us = env_long("CUDASIM_DELAY_US", 0); /* jitter before an op: other interleavings */
    long delay_every = std::max(1L, env_long("CUDASIM_DELAY_EVERY", 1)); /* ... before one op in this many */
    bool legacy = false;             /* the legacy default stream (stream 0) */
    bool nonblocking = false;        /* cudaStreamNonBlocking: no implicit order with the legacy stream */
    std::atomic<uint64_t> cap_id{0}; /* the capture it takes part in (0: none); see "stream capture" */
    std::vector<size_t> cap_deps;    /* the nodes its next captured operation depends on (capture lock) */
    char done_sync = 0;              /* TSan: released after each operation, acquired by host waits */
    stream() { th = std::thread([this] { run(); }); }
    void run() {
        unsigned seed = (unsigned)(uintptr_t)this;
        for (;;) {
            op o;
            {
                quiet q_;
                std::unique_lock<std::mutex> l(m);
                cv.wait(l, [&] { return stop || !q.empty(); });
                if (q.empty()) return;
                o = std::move(q.front());
                q.pop_front();
            }
            tsan_acquire(o.queued);
            delete o.queued;
            if (delay_us && rand_r(&seed) % delay_every == 0) usleep((useconds_t)(rand_r(&seed) % (delay_us + 1)));
            if (o.always || sticky() == cudaSuccess) o.t(); /* after a fault, queued work is dropped */
            tsan_release(&done_sync); /* a host sync sees this operation's effects */
            quiet q_;
            o.t = nullptr; /* the last owner of what the operation captured: no order with the host */
            {
                std::lock_guard<std::mutex> l(m);
                done.fetch_add(1);
            }
            idle.notify_all();
        }
    }
    uint64_t push(task t, bool always = false) {
        op o{std::move(t), new char, always};
        tsan_release(o.queued);
        quiet q_;
        std::lock_guard<std::mutex> l(m);
        q.push_back(std::move(o));
        cv.notify_one();
        return ++enq;
    }
    /* The host waits for operation id: ordered after the stream's work (done_sync), not the
     * other way round (the stream's later operations are ordered by push alone). */
    void wait(uint64_t id) {
        {
            quiet q_;
            std::unique_lock<std::mutex> l(m);
            idle.wait(l, [&] { return done.load() >= id; });
        }
        tsan_acquire(&done_sync);
    }
    void drain() {
        uint64_t id;
        {
            quiet q_;
            std::lock_guard<std::mutex> l(m);
            id = enq;
        }
        wait(id);
    }
};
/* The stream of a handle; null when the handle is not a live stream. */
static stream *get_stream(cudaStream_t s) {
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        if (!c.null_stream) { /* TODO: legacy-stream implicit syncs */
            c.null_stream = new stream;
            c.null_stream->legacy = true;
        }
        return c.null_stream;
    }
    for (stream *x : c.streams)
        if ((cudaStream_t)x == s) return x;
    return nullptr;
}
static void sync_all() {
    std::vector<stream *> all;
    {
        auto &c = ctx();
        std::lock_guard<std::mutex> l(c.m);
        all = c.streams;
        if (c.null_stream) all.push_back(c.null_stream);
    }
    for (stream *s : all) s->drain();
}

struct event { /* m, cv, recorded, completed, waits: quiet (see tsan_acquire) */
    std::mutex m;
    std::condition_variable cv;
    uint64_t recorded = 0, completed = 0;
    int waits = 0;                /* stream waits queued on it and not yet done */
    char done_sync = 0;           /* TSan: released when a record completes, acquired by its waiters */
    uint64_t cap_id = 0;          /* last recorded in this capture (0: in plain execution); capture lock */
    std::vector<size_t> cap_deps; /* the nodes that record stands for */
};

// ---- stream capture: work issued on a capturing stream becomes the nodes of a graph ----
/* What the real runtime does, as far as megabatch needs it (docs/GPU.md says which answers were
 * read off a GPU): cudaStreamBeginCapture puts a stream in capture; kernels, copies, memsets,
 * cuBLAS calls and graph launches issued on it are recorded (arguments by value, as at a launch),
 * not run. cudaEventRecord on a capturing stream and cudaStreamWaitEvent on another stream make
 * that stream join the capture (fork); the origin waiting on an event of the joined stream joins
 * it back. cudaStreamEndCapture on the origin, from the thread that began it unless the capture is
 * relaxed, gives the graph: cudaErrorStreamCaptureUnjoined when a joined stream's work is not
 * joined back, cudaErrorStreamCaptureInvalidated after an illegal call during the capture.
 * Illegal: a sync of a capturing stream (cudaStreamSynchronize), a wait on an event recorded
 * outside the capture (cudaErrorStreamCaptureIsolation), querying or syncing an event recorded in
 * it (cudaErrorCapturedEvent; a later wait on that event is cudaErrorInvalidValue), the "potentially
 * unsafe" calls (cudaMalloc, cudaMallocHost, cudaFree, cudaFreeHost, cudaDeviceSynchronize) from a
 * thread the capture modes forbid them (cudaErrorStreamCaptureUnsupported), and the legacy stream
 * (cudaMemcpy, cudaMemset) while a blocking stream (one created without cudaStreamNonBlocking)
 * captures (cudaErrorStreamCaptureImplicit); each but the last invalidates the capture(s)
 * concerned. Under the simulator a capture that fails is an error (cudasim: ..., abort) unless the
 * program said it expects failures (cudasim::expect_capture_errors, CUDASIM_CAPTURE_ERRORS=1): a
 * program that falls back to plain launches would otherwise hide it. A cuBLAS call is one node
 * here (a GPU's cuBLAS records several, a number that depends on its version).
 * A graph replays its nodes in the order they were captured (a topological order) on the stream
 * it is launched on. Not modelled: captures on the legacy or per-thread default stream (refused),
 * implicit legacy-stream synchronisation, cudaMallocAsync/cudaFreeAsync nodes (refused), NCCL
 * (refused, cudasim_nccl.h), cudaStreamDestroy of a capturing stream (refused: end the capture first). */
enum node_kind { NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_CUBLAS, NODE_GRAPH };
struct node {
    node_kind kind;
    const void *key;          /* a kernel: its function; a copy: its memory kinds (cudaGraphExecUpdate) */
    std::shared_ptr<task> run; /* executes and counts the operation */
    std::vector<size_t> deps; /* the earlier nodes it depends on */
};
using node_list = std::vector<node>;
struct graph_obj { std::shared_ptr<node_list> nodes = std::make_shared<node_list>(); };
struct capture {
    cudaStreamCaptureMode mode;
    std::thread::id owner;
    stream *origin;
    bool invalid;
    std::vector<stream *> members; /* the origin, then the streams that joined */
    graph_obj *graph;
    char why[160];                 /* what invalidated it first */
};
struct capture_registry {
    std::mutex m;
    std::map<uint64_t, capture> caps;
    uint64_t next = 0;
    std::atomic<int> active{0};
    std::atomic<bool> errors_expected{env_long("CUDASIM_CAPTURE_ERRORS", 0) != 0};
};
static capture_registry &reg() {
    static capture_registry *r = new capture_registry; /* never destroyed, like the context */
    return *r;
}
/* The thread's interaction mode (cudaThreadExchangeStreamCaptureMode). */
static thread_local cudaStreamCaptureMode tl_capture_mode = cudaStreamCaptureModeGlobal;
static const char *err_name(cudaError_t e);
/* Invalidate a capture (registry lock held): the first cause is kept for the error message. */
static cudaError_t invalidate(capture &c, const char *call, cudaError_t e) {
    if (!c.invalid) snprintf(c.why, sizeof c.why, "%s returned %s", call, err_name(e));
    c.invalid = true;
    return e;
}

/* Queue an operation on a stream, or, when the stream is capturing, record it as a node that
 * depends on the stream's capture dependencies (and becomes them). */
static cudaError_t issue(stream *s, node_kind k, const void *key, task t) {
    if (s->cap_id.load() == 0) {
        s->push(std::move(t));
        return cudaSuccess;
    }
    auto &r = reg();
    std::lock_guard<std::mutex> l(r.m);
    auto it = r.caps.find(s->cap_id.load());
    if (it == r.caps.end()) fatal("a stream names a capture that has ended");
    if (it->second.invalid) return cudaErrorStreamCaptureInvalidated;
    node_list &nl = *it->second.graph->nodes;
    nl.push_back(node{k, key, std::make_shared<task>(std::move(t)), s->cap_deps});
    s->cap_deps.assign(1, nl.size() - 1);
    return cudaSuccess;
}
/* A "potentially unsafe" call: refused (and the captures that forbid it invalidated) when this
 * thread has a capture not begun in relaxed mode, or, in global mode, another thread has a global
 * capture; a thread in relaxed mode may make it. */
static cudaError_t unsafe_call(const char *call) {
    auto &r = reg();
    if (r.active.load() == 0 || tl_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    std::lock_guard<std::mutex> l(r.m);
    bool refused = false;
    for (auto &kv : r.caps) {
        capture &c = kv.second;
        bool mine = c.owner == std::this_thread::get_id();
        if ((mine && c.mode != cudaStreamCaptureModeRelaxed) ||
            (!mine && c.mode == cudaStreamCaptureModeGlobal && tl_capture_mode == cudaStreamCaptureModeGlobal)) {
            invalidate(c, call, cudaErrorStreamCaptureUnsupported);
            refused = true;
        }
    }
    return refused ? set_err(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
/* A use of the legacy stream (cudaMemcpy, cudaMemset): it would wait for every blocking stream,
 * so it is refused while one of them captures; with only non-blocking streams capturing it is
 * legal (as on the H100, CUDA 13.0). */
static cudaError_t legacy_use() {
    auto &r = reg();
    if (r.active.load() == 0) return cudaSuccess;
    std::lock_guard<std::mutex> l(r.m);
    for (auto &kv : r.caps)
        for (stream *m : kv.second.members)
            if (!m->nonblocking) return set_err(cudaErrorStreamCaptureImplicit);
    return cudaSuccess;
}
/* An operation that is illegal on a capturing stream: refused, and the capture invalidated. */
static cudaError_t capture_forbids(stream *s, const char *call) {
    if (s->cap_id.load() == 0) return cudaSuccess;
    auto &r = reg();
    std::lock_guard<std::mutex> l(r.m);
    auto it = r.caps.find(s->cap_id.load());
    if (it != r.caps.end()) invalidate(it->second, call, cudaErrorStreamCaptureUnsupported);
    return set_err(cudaErrorStreamCaptureUnsupported);
}
/* cudaEventRecord on a capturing stream: the event stands for the stream's capture dependencies
 * (nothing is queued). Otherwise the event leaves any capture; false: record it as usual. */
static bool record_in_capture(stream *s, event *e) {
    auto &r = reg();
    std::lock_guard<std::mutex> l(r.m);
    e->cap_id = s->cap_id.load();
    if (e->cap_id) e->cap_deps = s->cap_deps;
    else e->cap_deps.clear();
    return e->cap_id != 0;
}
/* cudaStreamWaitEvent where a capture is concerned: on an event recorded in a capture, the stream
 * joins it (or, already in it, adds the event's nodes to its dependencies; *joined = true); a
 * capturing stream cannot wait on an event of plain execution (or of another capture). */
static cudaError_t wait_in_capture(stream *s, event *e, bool *joined) {
    auto &r = reg();
    if (r.active.load() == 0) return cudaSuccess;
    std::lock_guard<std::mutex> l(r.m);
    uint64_t ec = r.caps.count(e->cap_id) ? e->cap_id : 0, sc = s->cap_id.load();
    const char *call = "cudaStreamWaitEvent";
    if (!ec && !sc) return cudaSuccess;
    if (!ec) return invalidate(r.caps[sc], call, cudaErrorStreamCaptureIsolation);
    if (sc && sc != ec) return invalidate(r.caps[sc], call, invalidate(r.caps[ec], call, cudaErrorStreamCaptureMerge));
    capture &c = r.caps[ec];
    /* an event of a capture that an illegal call invalidated: refused as an invalid value (what
     * the H100 gave after cudaEventQuery on the event), the waiting stream left as it was */
    if (c.invalid) return sc ? cudaErrorStreamCaptureInvalidated : cudaErrorInvalidValue;
    if (!sc) {
        if (s->legacy) return invalidate(c, call, cudaErrorStreamCaptureImplicit);
        s->cap_id = ec;
        s->cap_deps.clear();
        c.members.push_back(s);
    }
    for (size_t d : e->cap_deps)
        if (std::find(s->cap_deps.begin(), s->cap_deps.end(), d) == s->cap_deps.end()) s->cap_deps.push_back(d);
    *joined = true;
    return cudaSuccess;
}
/* A query or sync of an event last recorded in a capture still going on: cudaErrorCapturedEvent,
 * and the capture is invalidated; cudaSuccess otherwise. */
static cudaError_t captured_event(event *e, const char *call) {
    auto &r = reg();
    if (r.active.load() == 0) return cudaSuccess;
    std::lock_guard<std::mutex> l(r.m);
    auto it = e->cap_id ? r.caps.find(e->cap_id) : r.caps.end();
    if (it == r.caps.end()) return cudaSuccess;
    return set_err(invalidate(it->second, call, cudaErrorCapturedEvent));
}

/* TSan keeps a shadow call stack per (TSan) fiber: the switch itself must not push a frame,
 * or a fiber's first switch leaves one behind on its shadow stack. */
#ifdef CUDASIM_TSAN
#define CUDASIM_NO_TSAN __attribute__((no_sanitize_thread))
#else
#define CUDASIM_NO_TSAN
#endif
// ---- fiber contexts: glibc ucontext (2 sigprocmask syscalls a switch) or a register-only switch ----
#if defined(CUDASIM_USE_UCONTEXT) || !defined(__x86_64__)
struct fctx { ucontext_t uc; };
static void fctx_make(fctx *c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
CUDASIM_NO_TSAN static void fctx_swap(fctx *from, fctx *to) { swapcontext(&from->uc, &to->uc); }
#else
struct fctx { void *sp; };
extern "C" void cudasim_swap(void **save_sp, void *load_sp);
/* callee-saved registers, MXCSR and the x87 control word on the old stack; rsp swapped */
asm(".text\n.globl cudasim_swap\n.type cudasim_swap,@function\ncudasim_swap:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "subq $8, %rsp\nstmxcsr (%rsp)\nfnstcw 4(%rsp)\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "ldmxcsr (%rsp)\nfldcw 4(%rsp)\naddq $8, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size cudasim_swap,.-cudasim_swap\n");
static void fctx_make(fctx *c, char *stack, size_t size, void (*entry)()) {
    uint64_t *top = (uint64_t *)(((uintptr_t)stack + size) & ~(uintptr_t)15);
    uint64_t *sp = top - 2; /* sp[0]: entry (popped by ret), sp[1]: entry's fake return address */
    sp[0] = (uint64_t)entry;
    sp[1] = 0;
    sp -= 6; /* r15 r14 r13 r12 rbx rbp */
    for (int i = 0; i < 6; i++) sp[i] = 0;
    sp -= 1;
    uint32_t mx = 0x1F80, cw = 0x037F;
    memcpy(sp, &mx, 4);
    memcpy((char *)sp + 4, &cw, 4);
    c->sp = sp;
}
CUDASIM_NO_TSAN static void fctx_swap(fctx *from, fctx *to) { cudasim_swap(&from->sp, to->sp); }
#endif

#include "cudasim_pipeline.h" /* its implementation part: pipe_state */

// ---- kernel execution: blocks in order, the threads of a block as fibers ----
enum { F_READY = 0, F_BARRIER = 1, F_DONE = 2, F_WARP = 3, F_CLUSTER = 4 };
/* Fiber bookkeeping: all fibers of a block run on one OS thread, so relaxed loads and stores
 * suffice; atomics only so that TSan (which sees fibers as threads) does not flag them. */
struct rint {
    std::atomic<int> v;
    rint(int x = 0) : v(x) {}
    operator int() const { return v.load(std::memory_order_relaxed); }
    rint &operator=(int x) { v.store(x, std::memory_order_relaxed); return *this; }
    void operator++(int) { v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};
static thread_local unsigned long long tl_switches;
struct fiber {
    fctx uc;
    char *stack = nullptr;
    uint3 tid;
    rint state{F_READY};
    void *tsan = nullptr;
    void *fake = nullptr;
    unsigned lin = 0;                            /* linear thread index in the block */
    std::atomic<const void *> site{nullptr};     /* the __syncthreads it waits at */
    std::atomic<uint64_t> wval{0};               /* its value for a warp collective */
    std::atomic<unsigned> wmask{0};
    std::atomic<const std::atomic<uint64_t> *> wres{nullptr}; /* the warp's values, when resolved */
    pipe_state pipe;                             /* its cp.async copies (cudasim_pipeline.h) */
    struct block_run *blk = nullptr;             /* its block (a cluster runs several) */
    int phase = -1;                              /* the cluster barrier phase it arrived in, -1: none */
};
/* The blocks of a cluster launch that run together (cudasim_cluster.h). */
struct cluster_run {
    struct block_run *blocks = nullptr;
    unsigned n = 1;
    char tsan_bar[2]; /* the cluster barrier's phases: release/acquire */
    rint gen{0};      /* phases ended (bookkeeping: relaxed atomics, as block_run's) */
    rint arrived{0};  /* threads arrived in this phase */
};
struct block_run {
    fctx sched;
    const task *body;
    const char *name;
    rint arrived{0}, acc_or{0}, acc_and{1}, acc_count{0}, res_or{0}, res_and{0}, res_count{0};
    rint gen{0}, saw_barrier{0};
    fiber *fibers = nullptr;
    char tsan_warp[32]; /* __syncwarp: release/acquire per warp */
    bool direct = false;
    bool tsan_on = true; /* this block's fibers are TSan fibers (race-checked) */
    int nthreads = 1;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    void *sched_tsan = nullptr;
    char tsan_start, tsan_end, tsan_bar[2]; /* addresses for __tsan_acquire/release */
    char *smem = nullptr;                    /* its dynamic shared memory */
    uint3 idx;                               /* its blockIdx */
    cluster_run *cl = nullptr;               /* its cluster (nullptr: a launch without clusters) */
    unsigned rank = 0;                       /* ... and its place there */
};
static thread_local block_run *cur_block;
static thread_local fiber *cur_fiber;
static thread_local char *dyn_smem; /* the running block's dynamic shared memory: exactly its size (ASan) */
static thread_local size_t tl_dyn_bytes;
#if defined(CUDASIM_ASAN) || defined(CUDASIM_TSAN)
static const size_t STACK = 256 << 10;
#else
static const size_t STACK = 64 << 10;
#endif
static thread_local std::vector<char *> stack_pool;

static char *get_stack() {
    if (!stack_pool.empty()) {
        char *s = stack_pool.back();
        stack_pool.pop_back();
#ifdef CUDASIM_ASAN
        /* the frames the fiber that last ran here left poisoned: its entry's, at the top (every
         * frame below returned and unpoisoned itself; a stack abandoned by a fault is not reused).
         * Not the whole stack: that memset per fiber start was most of a kernel's time under ASan */
        __asan_unpoison_memory_region(s + STACK - (16 << 10), 16 << 10);
#endif
        return s;
    }
    const int per = 64; /* a chunk of 64 stacks, each below a guard page */
    size_t one = STACK + 4096;
    char *p = (char *)mmap(nullptr, one * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fatal("fiber stack mmap failed");
    for (int i = 0; i < per; i++) {
        mprotect(p + i * one, 4096, PROT_NONE);
        if (i) stack_pool.push_back(p + i * one + 4096);
    }
    return p + 4096;
}

/* fiber -> scheduler; exiting: the fiber never resumes (its fake stack is dropped). Not
 * TSan-instrumented: an exiting fiber never returns from here, and an instrumented frame
 * would stay on its (shared, persistent) TSan fiber's shadow stack forever. */
#ifdef CUDASIM_TSAN
__attribute__((no_sanitize_thread))
#endif
static void to_sched(fiber *f, bool exiting) {
    block_run *b = cur_block;
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f->fake, b->sched_bottom, b->sched_size);
#endif
#ifdef CUDASIM_TSAN
    /* at a barrier no happens-before to the scheduler (and so to the other fibers): the
     * barrier's own release/acquire orders them; at exit the scheduler sees everything */
    __tsan_switch_to_fiber(b->sched_tsan, exiting ? 0 : __tsan_switch_to_fiber_no_sync);
#endif
    fctx_swap(&f->uc, &b->sched);
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(f->fake, nullptr, nullptr);
#endif
    (void)exiting;
}

#ifdef CUDASIM_TSAN
__attribute__((no_sanitize_thread))
#endif
static void fiber_main() {
    block_run *b = cur_block;
    fiber *f = cur_fiber;
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &b->sched_bottom, &b->sched_size);
#endif
    tsan_acquire(&b->tsan_start); /* sees what the launch saw */
    (*b->body)();
    tsan_release(&b->tsan_end);
    f->state = F_DONE;
    to_sched(f, true);
    fatal("a finished fiber was resumed");
}

/* scheduler -> fiber */
static void resume(block_run *b, fiber *f) {
#ifdef CUDASIM_TSAN /* the per-thread "registers": written here, read by the fibers (one OS thread) */
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
    cur_fiber = f;
    threadIdx = f->tid;
    cur_block = b;
    blockIdx = b->idx;
    dyn_smem = b->smem;
#ifdef CUDASIM_TSAN
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
    tl_switches += 2;
#ifdef CUDASIM_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK);
#endif
#ifdef CUDASIM_TSAN
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
    fctx_swap(&b->sched, &f->uc);
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
#ifdef CUDASIM_TSAN
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
    cur_fiber = nullptr;
#ifdef CUDASIM_TSAN
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
}

static int barrier(int pred, int op, const void *site) {
    block_run *b = cur_block;
    if (!b) fatal("__syncthreads called outside a kernel");
    fiber *f = cur_fiber;
    if (!f) { /* direct mode: legal only for one-thread blocks */
        if (b->nthreads == 1) return op == 2 ? (pred != 0) : (pred != 0);
        fatal("kernel %s reached __syncthreads after earlier launches reached none; "
              "set CUDASIM_FIBERS=1 (a data-dependent barrier)", b->name);
    }
    b->saw_barrier = 1;
    f->site.store(site, std::memory_order_relaxed);
    if (pred) b->acc_or = 1; else b->acc_and = 0;
    if (pred) b->acc_count++;
    unsigned g = (unsigned)(int)b->gen;
    tsan_release(&b->tsan_bar[g & 1]);
    f->state = F_BARRIER;
    b->arrived++;
    to_sched(f, false);
    tsan_acquire(&b->tsan_bar[g & 1]);
    return op == 0 ? (int)b->res_or : op == 1 ? (int)b->res_and : (int)b->res_count;
}

[[noreturn]] static void block_error(block_run &b, const fiber &f, const char *what, const fiber *g = nullptr) {
    char msg[512];
    int k = snprintf(msg, sizeof msg, "kernel %s block (%u,%u,%u) thread (%u,%u,%u): %s", b.name, blockIdx.x, blockIdx.y,
                     blockIdx.z, f.tid.x, f.tid.y, f.tid.z, what);
    if (g) snprintf(msg + k, sizeof msg - (size_t)k, "; thread (%u,%u,%u) is elsewhere", g->tid.x, g->tid.y, g->tid.z);
    fatal("%s", msg);
}

/* The warp collectives whose lanes have all arrived: their values published, lanes resumed. */
static bool resolve_warps(block_run &b, fiber *fs, int n, std::atomic<uint64_t> *res, unsigned *wgen) {
    bool progressed = false;
    for (int w = 0; w * 32 < n; w++) {
        int first = -1;
        for (int l = w * 32; l < n && l < w * 32 + 32; l++)
            if (fs[l].state == F_WARP) { first = l; break; }
        if (first < 0) continue;
        unsigned m = fs[first].wmask.load(std::memory_order_relaxed);
        for (int l = 0; l < 32; l++) {
            int t = w * 32 + l;
            bool in = m >> l & 1u;
            if (in && t >= n) block_error(b, fs[first], "warp collective's mask names a lane the block does not have");
            if (t >= n) break;
            int st = fs[t].state;
            if (in && st == F_DONE) block_error(b, fs[first], "warp collective waits for a lane that exited", &fs[t]);
            if (in && st == F_BARRIER) block_error(b, fs[first], "warp collective in divergent code: a lane of its mask waits at __syncthreads", &fs[t]);
            if (st == F_WARP && fs[t].wmask.load(std::memory_order_relaxed) != m)
                block_error(b, fs[first], "lanes of one warp wait in warp collectives with different masks", &fs[t]);
        }
        std::atomic<uint64_t> *slot = res + (size_t)(w * 2 + (wgen[w]++ & 1u)) * 32;
        for (int l = 0; l < 32 && w * 32 + l < n; l++) {
            fiber &f = fs[w * 32 + l];
            if (!(m >> l & 1u)) continue;
            slot[l].store(f.wval.load(std::memory_order_relaxed), std::memory_order_relaxed);
            f.wres.store(slot, std::memory_order_relaxed);
            f.state = F_READY;
        }
        progressed = true;
    }
    return progressed;
}

/* Every live thread waits at a __syncthreads: the same one, and none has exited. */
static void check_barrier(block_run &b, fiber *fs, int n, int live) {
    const fiber *w = nullptr;
    for (int i = 0; i < n; i++)
        if (fs[i].state == F_BARRIER) { w = &fs[i]; break; }
    for (int i = 0; i < n; i++) {
        if (fs[i].state == F_DONE && live < n)
            block_error(b, *w, "__syncthreads in divergent code: it waits for a thread that exited", &fs[i]);
        if (fs[i].state == F_BARRIER && fs[i].site.load(std::memory_order_relaxed) != w->site.load(std::memory_order_relaxed))
            block_error(b, *w, "__syncthreads in divergent code: threads wait at different barriers", &fs[i]);
    }
}

/* Release the __syncthreads of a block whose every live thread waits at it (check_barrier's
 * errors otherwise); false when some thread of the block is elsewhere (a cluster barrier). */
static bool release_barrier(block_run &b, fiber *fs, int n) {
    int live = 0, waiting = 0;
    for (int i = 0; i < n; i++) {
        live += fs[i].state != F_DONE;
        waiting += fs[i].state == F_BARRIER;
    }
    if (!waiting) return false;
    if (waiting < live) {
        for (int i = 0; i < n; i++)
            if (fs[i].state == F_CLUSTER)
                block_error(b, fs[i], "cluster.sync in divergent code: other threads of its block wait at __syncthreads");
        return false;
    }
    check_barrier(b, fs, n, live);
    /* every live thread waits at the barrier (exited threads count as arrived) */
    b.res_or = (int)b.acc_or;
    b.res_and = (int)b.acc_and;
    b.res_count = (int)b.acc_count;
    b.acc_or = 0;
    b.acc_and = 1;
    b.acc_count = 0;
    b.arrived = 0;
    b.gen++;
    for (int i = 0; i < n; i++)
        if (fs[i].state == F_BARRIER) fs[i].state = F_READY;
    return true;
}

/* End the cluster barrier's phase when every live thread of the cluster has arrived: its
 * waiting threads go on. A thread that exited without arriving while others wait is an error. */
static bool release_cluster(block_run *bs, fiber *fs, int total) {
    cluster_run *c = bs[0].cl;
    int live = 0, waiting = 0;
    for (int i = 0; i < total; i++) {
        live += fs[i].state != F_DONE;
        waiting += fs[i].state == F_CLUSTER;
    }
    if (!waiting) return false;
    if ((int)c->arrived < live) {
        for (int i = 0; i < total; i++)
            if (fs[i].state == F_DONE && fs[i].phase < 0)
                block_error(*fs[i].blk, fs[i], "the cluster barrier waits for a thread of the cluster that exited");
        return false;
    }
    c->arrived = 0;
    c->gen++;
    for (int i = 0; i < total; i++)
        if (fs[i].state == F_CLUSTER) fs[i].state = F_READY;
    return true;
}

/* The threads of nb blocks (a cluster; nb = 1 without) as fibers, n a block; fiber i is thread
 * i % n of block i / n. They switch at barriers and warp collectives. */
static void run_block_fibers(block_run *bs, int nb, int n) {
    /* thread-local, not on this frame: a faulting kernel leaves the frame by siglongjmp */
    static thread_local std::unique_ptr<fiber[]> fs_keep;
    static thread_local std::unique_ptr<std::atomic<uint64_t>[]> wres;
    static thread_local std::vector<unsigned> wgen;
    const int total = nb * n;
    fs_keep.reset(new fiber[total]);
    fiber *fs = fs_keep.get();
    unsigned bx = blockDim.x, by = blockDim.y;
    for (int i = 0; i < total; i++) {
        int t = i % n;
        fs[i].tid = make_uint3(t % bx, (t / bx) % by, t / (bx * by));
        fs[i].lin = (unsigned)t;
        fs[i].blk = &bs[i / n];
    }
    wres.reset(new std::atomic<uint64_t>[(size_t)(total + 31) / 32 * 64]);
    wgen.assign((size_t)(total + 31) / 32, 0);
    for (int r = 0; r < nb; r++) {
        bs[r].fibers = fs + r * n;
#ifdef CUDASIM_TSAN
        bs[r].sched_tsan = __tsan_get_current_fiber();
#endif
        tsan_release(&bs[r].tsan_start);
    }
    int live = total, started = 0;
    while (live > 0) {
        for (int i = 0; i < total; i++) {
            fiber &f = fs[i];
            if (f.state != F_READY) continue;
            if (!f.stack) { /* first run: a stack from the pool (one stack for barrier-free blocks) */
                f.stack = get_stack();
                fctx_make(&f.uc, f.stack, STACK, fiber_main);
#ifdef CUDASIM_TSAN
                /* TSan v3 has ~255 thread slots: a 256-thread block cannot get one TSan fiber
                 * per CUDA thread, and creating/destroying them per block is slow. 31 persistent
                 * TSan fibers per worker; CUDA thread i runs as fiber i % 31 (races between
                 * threads 31*m apart are missed). fiber_main has no TSan frame, so stacks stay
                 * bounded. */
                static thread_local std::vector<void *> tsan_ctx;
                if (tsan_ctx.empty())
                    for (int q = 0; q < 31; q++) tsan_ctx.push_back(__tsan_create_fiber(0));
                f.tsan = tsan_ctx[i % 31];
#endif
                started++;
            }
            resume(f.blk, &f);
            if (f.state == F_DONE) {
                live--;
                stack_pool.push_back(f.stack);
            }
        }
        if (live == 0) break;
        if (resolve_warps(bs[0], fs, total, wres.get(), wgen.data())) continue;
        bool released = false;
        for (int r = 0; r < nb; r++) released |= release_barrier(bs[r], fs + r * n, n);
        if (released) continue;
        if (nb > 1 && release_cluster(bs, fs, total)) continue;
        fatal("kernel %s: its threads wait for each other at barriers none can pass", bs[0].name);
    }
    cur_block = &bs[0];
    for (int r = 0; r < nb; r++) tsan_acquire(&bs[r].tsan_end);
    (void)started;
}

/* A kernel that faults (SIGSEGV/SIGBUS) poisons the context as on a GPU: the launch ends,
 * every later call returns cudaErrorIllegalAddress. A fault outside a kernel still crashes. */
static thread_local sigjmp_buf *tl_fault_jmp;
static void on_fault(int sig, siginfo_t *, void *) {
    if (tl_fault_jmp) siglongjmp(*tl_fault_jmp, 1);
    signal(sig, SIG_DFL); /* not a kernel: crash as usual */
}
static void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
    });
#ifndef CUDASIM_ASAN /* ASan gives every thread its own alternate signal stack */
    static thread_local char *alt;
    if (!alt) { /* the fault may be a fiber's stack overflow: handle it on its own stack */
        alt = (char *)malloc(64 << 10);
        stack_t ss;
        memset(&ss, 0, sizeof ss);
        ss.ss_sp = alt;
        ss.ss_size = 64 << 10;
        sigaltstack(&ss, nullptr);
    }
#endif
}

static void run_grid_checked(const char *name, const void *key, dim3 g, dim3 blk, const task &body, char *const *smem,
                             unsigned cl, block_run *bs);
static void run_grid(const char *name, const void *key, dim3 g, dim3 blk, size_t smem, const task &body, unsigned cl) {
    /* a GPU's shared memory window is 1024-byte aligned; exactly smem bytes, so ASan sees overruns;
     * one for each block of a cluster */
    struct aligned_delete {
        void operator()(char *p) const { operator delete[](p, std::align_val_t(1024)); }
    };
    std::vector<std::unique_ptr<char[], aligned_delete>> dyn;
    std::vector<char *> bufs;
    for (unsigned r = 0; r < cl; r++) {
        dyn.emplace_back(new (std::align_val_t(1024)) char[smem ? smem : 1]);
        memset(dyn.back().get(), 0xFF, smem); /* uninitialised, as on a GPU: NaN bytes */
        bufs.push_back(dyn.back().get());
    }
    dyn_smem = bufs[0];
    tl_dyn_bytes = smem;
    install_fault_handler();
    sigjmp_buf jb;
    std::vector<block_run> bs(cl); /* here, not below: a fault's siglongjmp skips destructors there */
    if (sigsetjmp(jb, 1) == 0) {
        tl_fault_jmp = &jb;
        run_grid_checked(name, key, g, blk, body, bufs.data(), cl, bs.data());
        tl_fault_jmp = nullptr;
    } else {
        tl_fault_jmp = nullptr;
        cur_block = nullptr;
        cur_fiber = nullptr;
        stack_pool.clear(); /* stacks of abandoned fibers: leaked */
        fprintf(stderr, "cudasim: kernel %s faulted in block (%u,%u,%u) thread (%u,%u,%u): illegal address\n", name,
                blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
        int ok = cudaSuccess;
        ctx().sticky.compare_exchange_strong(ok, cudaErrorIllegalAddress);
    }
}
static void run_grid_checked(const char *name, const void *key, dim3 g, dim3 blk, const task &body, char *const *smem,
                             unsigned cl, block_run *bs) {
    auto &c = ctx();
    int mode;
    {
        quiet q_; /* the simulator's own map: no order between the streams */
        std::lock_guard<std::mutex> l(c.m);
        mode = c.kernel_mode[key];
    }
    static const bool force_fibers = env_long("CUDASIM_FIBERS", 0) != 0;
    bool direct = mode == 2 && !force_fibers && cl == 1;
    int n = (int)(blk.x * blk.y * blk.z);
    cluster_run cr;
    cr.blocks = bs;
    cr.n = cl;
    for (unsigned r = 0; r < cl; r++) {
        bs[r].body = &body;
        bs[r].name = name;
        bs[r].direct = direct;
        bs[r].nthreads = n;
        bs[r].smem = smem[r];
        bs[r].cl = cl > 1 ? &cr : nullptr;
        bs[r].rank = r;
    }
    block_run &b = bs[0];
    cur_block = &b;
    gridDim = g;
    blockDim = blk;
    c.launches++;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x += cl) { /* a cluster at a time: blocks x .. x+cl-1 */
                for (unsigned r = 0; r < cl; r++) bs[r].idx = make_uint3(x + r, y, z);
                blockIdx = b.idx;
                c.blocks += cl;
                c.threads += (unsigned long long)n * cl;
                if (!direct && mode == 0 && (x | y | z) != 0 && !b.saw_barrier && !force_fibers && cl == 1)
                    direct = true; /* block 0 of a kernel's first launch reached no barrier: run the rest directly */
                b.direct = direct;
                if (direct || (n == 1 && cl == 1)) {
                    for (int i = 0; i < n; i++) {
                        threadIdx = make_uint3(i % blk.x, (i / blk.x) % blk.y, i / (blk.x * blk.y));
                        body();
                    }
                    c.direct += (unsigned long long)n;
                } else {
                    run_block_fibers(bs, (int)cl, n);
                }
                for (unsigned r = 1; r < cl; r++) b.saw_barrier = b.saw_barrier | bs[r].saw_barrier;
            }
    cur_block = nullptr;
    c.switches += tl_switches;
    tl_switches = 0;
    if (mode == 0) {
        quiet q_;
        std::lock_guard<std::mutex> l(c.m);
        c.kernel_mode[key] = b.saw_barrier ? 1 : 2;
    }
}

void check_pointer(const char *kernel, int arg, const char *field, const void *p, bool *bad) {
    if (!p) return;
    uintptr_t a = (uintptr_t)p;
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    auto it = c.allocs.upper_bound(a);
    if (it != c.allocs.begin() && a <= (--it)->first + it->second.size) return; /* inside, or one past the end */
    fprintf(stderr, "cudasim: kernel %s: argument %d%s%s (%p) points at no device or pinned allocation (malloc'ed, "
            "stack or freed memory): an illegal address on a GPU\n", kernel, arg, field ? ", field " : "",
            field ? field : "", p);
    *bad = true;
}

void enqueue_kernel(const char *name, const void *key, dim3 g, dim3 b, size_t smem, cudaStream_t st, task body,
                    unsigned cluster, bool bad_args) {
    if (sticky() != cudaSuccess) { set_err(sticky()); return; }
    /* an H100's limits (cudaGetDeviceProperties below), with the errors its launch gives */
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    if (nt == 0 || nt > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 || g.y == 0 || g.z == 0 ||
        g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        fprintf(stderr, "cudasim: launch of %s: grid (%u,%u,%u) block (%u,%u,%u) exceeds the device limits\n", name, g.x, g.y,
                g.z, b.x, b.y, b.z);
        set_err(cudaErrorInvalidConfiguration);
        return;
    }
    /* clusters: sm_90's portable sizes (1..8 blocks along x, dividing the grid), whole warps
     * (the simulator's rule: a cluster's warps are 32 consecutive fibers) */
    if (cluster < 1 || cluster > 8 || g.x % cluster || (cluster > 1 && nt % 32)) {
        fprintf(stderr, "cudasim: launch of %s: clusters of %u blocks for grid (%u,%u,%u) block (%u,%u,%u)\n", name, cluster,
                g.x, g.y, g.z, b.x, b.y, b.z);
        set_err(cudaErrorInvalidClusterSize);
        return;
    }
    size_t dyn_max = 48 << 10;
    {
        std::lock_guard<std::mutex> l(ctx().m);
        auto it = ctx().max_dyn_smem.find(key);
        if (it != ctx().max_dyn_smem.end()) dyn_max = it->second;
    }
    if (smem > dyn_max) {
        fprintf(stderr, "cudasim: launch of %s: %zu bytes of dynamic shared memory, the limit is %zu%s\n", name, smem, dyn_max,
                dyn_max == 48 << 10 ? " (above 48 KB needs cudaFuncSetAttribute)" : "");
        set_err(cudaErrorInvalidValue);
        return;
    }
    stream *s = get_stream(st);
    if (!s) { set_err(cudaErrorInvalidResourceHandle); return; }
    bool injected = fires(ctx().fault_launch_in);
    if (injected || bad_args) { /* the kernel faults on the device (a bad argument: said above) */
        set_err(issue(s, NODE_KERNEL, key, [name, injected] {
            if (injected) fprintf(stderr, "cudasim: kernel %s: injected fault (illegal address)\n", name);
            int ok = cudaSuccess;
            ctx().sticky.compare_exchange_strong(ok, cudaErrorIllegalAddress);
        }));
        return;
    }
    auto bp = std::make_shared<task>(std::move(body));
    set_err(issue(s, NODE_KERNEL, key,
                  [name, key, g, b, smem, bp = std::move(bp), cluster] { run_grid(name, key, g, b, smem, *bp, cluster); }));
}

stats get_stats() {
    auto &c = ctx();
    return stats{c.launches, c.blocks, c.threads, c.switches, c.direct, c.cublas, c.syncs, c.dallocs, c.h2d, c.d2h, c.d2d,
                 c.nccl, c.glaunch, c.gnodes};
}
void reset_stats() {
    auto &c = ctx();
    for (auto *x : {&c.launches, &c.blocks, &c.threads, &c.switches, &c.direct, &c.cublas, &c.syncs, &c.dallocs, &c.h2d,
                    &c.d2h, &c.d2d, &c.nccl, &c.glaunch, &c.gnodes})
        x->store(0);
}
void print_stats(FILE *f) {
    stats s = get_stats();
    fprintf(f, "cudasim: %llu kernel launches, %llu cuBLAS calls, %llu host syncs, %llu device allocations, "
               "copied %.1f MB H2D, %.1f MB D2H, %.1f MB D2D (%llu blocks, %llu threads)\n",
            s.launches, s.cublas_calls, s.host_syncs, s.device_allocs, (double)s.bytes_h2d / 1e6, (double)s.bytes_d2h / 1e6,
            (double)s.bytes_d2d / 1e6, s.blocks, s.threads);
    if (s.nccl_allreduces) fprintf(f, "cudasim: %llu NCCL all-reduces (MPI_Allreduce)\n", s.nccl_allreduces);
    if (s.graph_launches)
        fprintf(f, "cudasim: %llu graph launches ran %llu nodes (counted above too)\n", s.graph_launches, s.graph_nodes);
}
int print_stats_at_exit() {
    static int once = atexit([] { print_stats(stderr); });
    return once;
}
void wait_idle() { sync_all(); }
void fail_alloc(long n) { ctx().fail_alloc_in = n; }
bool expect_capture_errors(bool on) { return reg().errors_expected.exchange(on); }
bool planted(const char *name) {
    static const char *which = getenv("CUDASIM_PLANT");
    return which && !strcmp(which, name);
}
void fault_launch(long n) { ctx().fault_launch_in = n; }

// ---- copies ----
/* CUDA's documented host synchronisation: pageable H2D is staged (the source may be reused
 * at once), D2H into pageable memory and host-to-host return when done; pinned and
 * device-to-device are asynchronous. */
static cudaError_t copy_async(stream *s, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t rows, cudaMemcpyKind kind) {
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (sticky() != cudaSuccess) return set_err(sticky());
    if (width > dpitch || width > spitch) return set_err(cudaErrorInvalidPitchValue);
    if (rows == 0 || width == 0) return cudaSuccess;
    size_t dext = dpitch * (rows - 1) + width, sext = spitch * (rows - 1) + width;
    mem_kind dk = kind_of(dst, dext), sk = kind_of(src, sext);
    /* a pointer inside a device allocation but running past its end */
    uintptr_t base;
    if (dk == MEM_PAGEABLE && find(dst, 1, &base) && find(dst, 1)->kind != MEM_PAGEABLE) return set_err(cudaErrorInvalidValue);
    if (sk == MEM_PAGEABLE && find(src, 1, &base) && find(src, 1)->kind != MEM_PAGEABLE) return set_err(cudaErrorInvalidValue);
    if ((kind == cudaMemcpyHostToDevice && dk != MEM_DEVICE) || (kind == cudaMemcpyDeviceToHost && sk != MEM_DEVICE) ||
        (kind == cudaMemcpyDeviceToDevice && (dk != MEM_DEVICE || sk != MEM_DEVICE)))
        return set_err(cudaErrorInvalidValue);
    bool dev = dk == MEM_DEVICE || sk == MEM_DEVICE;
    auto *bytes = !dev ? nullptr : dk == MEM_DEVICE ? (sk == MEM_DEVICE ? &ctx().d2d : &ctx().h2d) : &ctx().d2h;
    auto copy = [=](const char *from) { /* counted when it runs (once per graph launch when captured) */
        for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dpitch, from + r * spitch, width);
        if (bytes) *bytes += width * rows;
    };
    if (s->cap_id.load()) /* a memcpy node: reads and writes the host memory when the graph runs */
        return set_err(issue(s, NODE_MEMCPY, (const void *)(uintptr_t)(1 + dk * 3 + sk), /* its memory kinds */
                             [copy, src] { copy((const char *)src); }));
    if (dev && sk == MEM_PAGEABLE) { /* staged */
        auto stage = std::make_shared<std::vector<char>>(sext);
        memcpy(stage->data(), src, sext);
        s->push([copy, stage = std::move(stage)] { copy(stage->data()); }); /* the worker frees it */
    } else if (!dev || dk == MEM_PAGEABLE) { /* synchronous */
        s->wait(s->push([copy, src] { copy((const char *)src); }));
        ctx().syncs++;
    } else {
        s->push([copy, src] { copy((const char *)src); });
    }
    return cudaSuccess;
}

static const char *err_name(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorGraphExecUpdateFailure: return "cudaErrorGraphExecUpdateFailure";
    default: return "cudaErrorUnknown";
    }
}
static const char *err_string(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (cudasim: CUDASIM_NO_DEVICE)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    default: return "unknown error";
    }
}
} // namespace cudasim

/* not inlined: the return address names the barrier (divergence check) */
__attribute__((noinline)) CUDASIM_NO_TSAN int cudasim::barrier_at(int p, int op, const void *site) {
    return cudasim::barrier(p, op, site);
}

namespace cudasim {
void *dynamic_shared() {
    if (!cur_block) fatal("dynamic shared memory used outside a kernel");
    return dyn_smem;
}
void device_error(const char *what) {
    block_run *b = cur_block;
    fatal("kernel %s: %s", b ? b->name : "(none)", what);
}
/* cp.async (cudasim_pipeline.h): the issuing thread's state; a block run without fibers runs
 * one thread at a time, so one state per OS thread, emptied when the next thread starts. */
static pipe_state &my_pipe() {
    if (cur_fiber) return cur_fiber->pipe;
    static thread_local pipe_state direct;
    static thread_local uint3 who = make_uint3(~0u, ~0u, ~0u), where;
    if (who.x != threadIdx.x || who.y != threadIdx.y || who.z != threadIdx.z || where.x != blockIdx.x ||
        where.y != blockIdx.y || where.z != blockIdx.z)
        direct = pipe_state();
    who = threadIdx;
    where = blockIdx;
    return direct;
}
void pipeline_copy(void *dst, const void *src, size_t n, size_t zfill) {
    if (!cur_block) fatal("__pipeline_memcpy_async called outside a kernel");
    const char *d = (const char *)dst, *s = (const char *)src;
    if ((n != 4 && n != 8 && n != 16) || zfill > n) device_error("__pipeline_memcpy_async: size is not 4, 8 or 16 bytes");
    if (((uintptr_t)d | (uintptr_t)s) & (n - 1)) device_error("__pipeline_memcpy_async: an address is not aligned to the size");
    if (d < dyn_smem || d + n > dyn_smem + tl_dyn_bytes)
        device_error("__pipeline_memcpy_async: the destination is not in the launch's dynamic shared memory");
    if (s + n > dyn_smem && s < dyn_smem + tl_dyn_bytes) device_error("__pipeline_memcpy_async: the source is shared memory");
    my_pipe().open.push_back(pipe_copy{(char *)dst, s, n, zfill});
}
void pipeline_commit() { my_pipe().commit(); }
void pipeline_wait(size_t prior) { my_pipe().wait(prior); }

/* ldmatrix (cudasim_mma.h): the rows' addresses from all 32 lanes, then this lane's words. */
void ldmatrix(unsigned *r, int n, const void *p) {
    if (!cur_block) fatal("ldmatrix called outside a kernel");
    const std::atomic<uint64_t> *all = warp_collective(0xffffffffu, (uint64_t)(uintptr_t)p, "ldmatrix");
    const unsigned l = lane_id();
    for (int i = 0; i < n; i++) {
        const char *row = (const char *)(uintptr_t)all[8 * i + l / 4].load(std::memory_order_relaxed);
        if ((uintptr_t)row % 16) device_error("ldmatrix: a row address is not 16-byte aligned");
        if (row < dyn_smem || row + 16 > dyn_smem + tl_dyn_bytes)
            device_error("ldmatrix: a row is not in the launch's dynamic shared memory");
        memcpy(&r[i], row + 4 * (l % 4), 4);
    }
}

/* Clusters (cudasim_cluster.h). Without a cluster launch a block is a cluster of one: arrive
 * does nothing and wait is the block's barrier. */
void cluster_arrive() {
    block_run *b = cur_block;
    fiber *f = cur_fiber;
    if (!b) fatal("the cluster barrier used outside a kernel");
    if (!b->cl) return;
    cluster_run *c = b->cl;
    if (f->phase >= 0) device_error("barrier_arrive twice without barrier_wait");
    f->phase = (int)c->gen;
    tsan_release(&c->tsan_bar[f->phase & 1]);
    c->arrived++;
}
void cluster_wait() {
    block_run *b = cur_block;
    fiber *f = cur_fiber;
    if (!b) fatal("the cluster barrier used outside a kernel");
    if (!b->cl) {
        barrier(1, 0, (const void *)&cluster_wait);
        return;
    }
    cluster_run *c = b->cl;
    if (f->phase < 0) device_error("barrier_wait without barrier_arrive");
    if ((int)c->gen == f->phase) { /* the phase has not ended: wait for the others */
        f->state = F_CLUSTER;
        to_sched(f, false);
    }
    tsan_acquire(&c->tsan_bar[f->phase & 1]);
    f->phase = -1;
}
unsigned cluster_rank() {
    if (!cur_block) fatal("cluster block_rank called outside a kernel");
    return cur_block->rank;
}
unsigned cluster_size() {
    if (!cur_block) fatal("cluster num_blocks called outside a kernel");
    return cur_block->cl ? cur_block->cl->n : 1;
}
void *cluster_map(const void *p, unsigned rank) {
    block_run *b = cur_block;
    if (!b) fatal("map_shared_rank called outside a kernel");
    const char *q = (const char *)p;
    if (rank >= cluster_size()) device_error("map_shared_rank: no block of that rank in the cluster");
    if (q < b->smem || q >= b->smem + tl_dyn_bytes)
        device_error("map_shared_rank: the address is not in the block's dynamic shared memory");
    return (b->cl ? b->cl->blocks[rank].smem : b->smem) + (q - b->smem);
}

unsigned lane_id() {
    if (cur_fiber) return cur_fiber->lin % 32;
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}
unsigned live_lanes() {
    block_run *b = cur_block;
    if (!b) fatal("__activemask called outside a kernel");
    unsigned lin = cur_fiber ? cur_fiber->lin : threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned w0 = lin / 32 * 32, m = 0;
    for (unsigned l = 0; l < 32 && (int)(w0 + l) < b->nthreads; l++)
        if (!cur_fiber || b->fibers[w0 + l].state != F_DONE) m |= 1u << l;
    return m;
}
const std::atomic<uint64_t> *warp_collective(unsigned mask, uint64_t v, const char *op) {
    block_run *b = cur_block;
    fiber *f = cur_fiber;
    if (!b) fatal("%s called outside a kernel", op);
    unsigned lane = lane_id();
    if (!(mask >> lane & 1u)) device_error("a warp collective called by a lane outside its own mask");
    if (!f) {
        if (b->nthreads != 1) fatal("kernel %s reached %s after earlier launches reached no barrier; set CUDASIM_FIBERS=1", b->name, op);
        static thread_local std::atomic<uint64_t> one[32];
        one[0].store(v, std::memory_order_relaxed);
        if (mask != 1u) device_error("warp collective's mask names a lane the block does not have");
        return one;
    }
    b->saw_barrier = 1;
    f->wval.store(v, std::memory_order_relaxed);
    f->wmask.store(mask, std::memory_order_relaxed);
    tsan_release(&b->tsan_warp[f->lin / 32 % 32]); /* __syncwarp orders the lanes' memory */
    f->state = F_WARP;
    to_sched(f, false);
    tsan_acquire(&b->tsan_warp[f->lin / 32 % 32]);
    return f->wres.load(std::memory_order_relaxed);
}
} // namespace cudasim

// ---- the runtime API (NVIDIA's prototypes) ----
using namespace cudasim;
extern "C" {
cudaError_t cudaGetLastError(void) {
    cudaError_t s = sticky();
    if (s != cudaSuccess) return s;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky() != cudaSuccess ? sticky() : last_error; }
const char *cudaGetErrorString(cudaError_t e) { return err_string(e); }
const char *cudaGetErrorName(cudaError_t e) { return err_name(e); }
/* CUDASIM_DEVICES=N (default 1): N device indices, all the one simulated device of this process
 * (so that the ranks of an MPI run on one machine can each take the GPU of their local rank). */
static int device_count() { return (int)std::max(1L, env_long("CUDASIM_DEVICES", 1)); }
static thread_local int current_device;
cudaError_t cudaGetDeviceCount(int *n) {
    if (env_long("CUDASIM_NO_DEVICE", 0)) { *n = 0; return set_err(cudaErrorNoDevice); }
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return set_err(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) { *d = current_device; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d < 0 || d >= device_count()) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (cudasim on the CPU)");
    p->totalGlobalMem = ctx().total;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->major = 9;
    p->minor = 0;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->sharedMemPerBlock = 48 << 10;
    p->warpSize = 32;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d < 0 || d >= device_count()) return set_err(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrClockRate: *v = 1000000; break; /* kHz; clock64() counts TSC ticks */
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 227 << 10; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrClusterLaunch: *v = 1; break;
    default: *v = 0;
    }
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess; /* hints: accepted */
    if (value < 0 || value > (227 << 10)) return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(ctx().m);
    ctx().max_dyn_smem[func] = (size_t)value;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    *total = c.total;
    *free_b = c.total - c.used;
    return cudaSuccess;
}
static cudaError_t do_alloc(void **out, size_t n, mem_kind k) {
    auto &c = ctx();
    *out = nullptr;
    if (sticky() != cudaSuccess) return set_err(sticky());
    if (unsafe_call(k == MEM_DEVICE ? "cudaMalloc" : "cudaMallocHost") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    if (k == MEM_DEVICE && fires(c.fail_alloc_in)) return set_err(cudaErrorMemoryAllocation); /* injected */
    {
        std::lock_guard<std::mutex> l(c.m);
        if (k == MEM_DEVICE && n > c.total - c.used) return set_err(cudaErrorMemoryAllocation);
    }
    if (k == MEM_DEVICE) c.dallocs++;
    void *p = nullptr;
    if (posix_memalign(&p, 256, n ? n : 1) != 0) return set_err(cudaErrorMemoryAllocation); /* exact size: ASan redzones */
    if (k == MEM_DEVICE) memset(p, 0xFF, n); /* cudaMalloc memory is garbage: NaN bytes, not zeros */
    std::lock_guard<std::mutex> l(c.m);
    c.allocs[(uintptr_t)p] = alloc_rec{n ? n : 1, k};
    if (k == MEM_DEVICE) c.used += n;
    *out = p;
    return cudaSuccess;
}
static cudaError_t do_free(void *p, mem_kind k) {
    if (!p) return cudaSuccess;
    if (unsafe_call(k == MEM_DEVICE ? "cudaFree" : "cudaFreeHost") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    sync_all(); /* cudaFree/cudaFreeHost synchronise the device */
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    auto it = c.allocs.find((uintptr_t)p);
    if (it == c.allocs.end() || it->second.kind != k) return set_err(cudaErrorInvalidValue);
    if (k == MEM_DEVICE) c.used -= it->second.size;
    c.allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) { return do_alloc(p, n, MEM_DEVICE); }
cudaError_t cudaFree(void *p) { return do_free(p, MEM_DEVICE); }
cudaError_t cudaMallocHost(void **p, size_t n) { return do_alloc(p, n, MEM_PINNED); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int) { return do_alloc(p, n, MEM_PINNED); }
cudaError_t cudaFreeHost(void *p) { return do_free(p, MEM_PINNED); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (capture_forbids(s, "cudaMallocAsync") != cudaSuccess) return cudaErrorStreamCaptureUnsupported; /* no memory nodes here */
    return do_alloc(p, n, MEM_DEVICE);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (capture_forbids(s, "cudaFreeAsync") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    s->push([p] {
        quiet q_;
        auto &c = ctx();
        std::lock_guard<std::mutex> l(c.m);
        auto it = c.allocs.find((uintptr_t)p);
        if (it != c.allocs.end()) { c.used -= it->second.size; c.allocs.erase(it); free(p); }
    });
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t st) {
    return copy_async(get_stream(st), dst, n, src, n, n, 1, kind);
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    if (legacy_use() != cudaSuccess) return cudaErrorStreamCaptureImplicit;
    stream *s = get_stream(nullptr);
    sync_all();
    cudaError_t e = copy_async(s, dst, n, src, n, n, 1, kind);
    s->drain();
    ctx().syncs++;
    return e;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind kind,
                              cudaStream_t st) {
    return copy_async(get_stream(st), dst, dp, src, sp, w, h, kind);
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (sticky() != cudaSuccess) return set_err(sticky());
    if (n == 0) return cudaSuccess;
    if (kind_of(dst, n) != MEM_DEVICE) return set_err(cudaErrorInvalidValue);
    return set_err(issue(s, NODE_MEMSET, nullptr, [=] { memset(dst, v, n); }));
}
cudaError_t cudaMemset(void *dst, int v, size_t n) {
    if (legacy_use() != cudaSuccess) return cudaErrorStreamCaptureImplicit;
    sync_all();
    cudaError_t e = cudaMemsetAsync(dst, v, n, nullptr);
    if (e == cudaSuccess) get_stream(nullptr)->drain();
    return e;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    stream *s = new stream;
    s->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    auto &c = ctx();
    std::lock_guard<std::mutex> l(c.m);
    c.streams.push_back(s);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s || st == nullptr) return set_err(cudaErrorInvalidResourceHandle);
    if (capture_forbids(s, "cudaStreamDestroy") != cudaSuccess) return cudaErrorStreamCaptureUnsupported; /* end the capture first */
    s->drain();
    {
        auto &c = ctx();
        std::lock_guard<std::mutex> l(c.m);
        c.streams.erase(std::find(c.streams.begin(), c.streams.end(), s));
    }
    {
        std::lock_guard<std::mutex> l(s->m);
        s->stop = true;
    }
    s->cv.notify_all();
    s->th.join();
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (capture_forbids(s, "cudaStreamSynchronize") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    s->drain();
    ctx().syncs++;
    return sticky() != cudaSuccess ? set_err(sticky()) : cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    if (unsafe_call("cudaDeviceSynchronize") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    sync_all();
    ctx().syncs++;
    return sticky() != cudaSuccess ? set_err(sticky()) : cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
    *e = (cudaEvent_t) new event;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    event *e = (event *)ev;
    { /* CUDA defers the release until the recorded work and the waits on it are done: wait here */
        quiet q_;
        std::unique_lock<std::mutex> l(e->m);
        e->cv.wait(l, [&] { return e->completed >= e->recorded && e->waits == 0; });
    }
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s || !ev) return set_err(cudaErrorInvalidResourceHandle);
    event *e = (event *)ev;
    if (record_in_capture(s, e)) return cudaSuccess;
    uint64_t g;
    {
        quiet q_;
        std::lock_guard<std::mutex> l(e->m);
        g = ++e->recorded;
    }
    s->push([e, g] { /* notified under the lock: once a waiter sees it complete, e is no longer touched */
        tsan_release(&e->done_sync);
        quiet q_;
        std::lock_guard<std::mutex> l(e->m);
        e->completed = std::max(e->completed, g);
        e->cv.notify_all();
    }, true);
    return cudaSuccess;
}
/* Wait (quiet) until record g of e completed, then see its work; a stream's wait then lets go
 * of e (which cudaEventDestroy may free from then on). */
static void event_wait(event *e, uint64_t g, bool stream_wait) {
    std::unique_lock<std::mutex> l(e->m, std::defer_lock);
    {
        quiet q_;
        l.lock();
        e->cv.wait(l, [&] { return e->completed >= g; });
    }
    tsan_acquire(&e->done_sync);
    quiet q_;
    if (stream_wait && --e->waits == 0) e->cv.notify_all();
    l.unlock();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int) {
    stream *s = get_stream(st);
    if (!s || !ev) return set_err(cudaErrorInvalidResourceHandle);
    event *e = (event *)ev;
    bool joined = false;
    cudaError_t ce = wait_in_capture(s, e, &joined);
    if (ce != cudaSuccess || joined) return set_err(ce);
    uint64_t g;
    {
        quiet q_;
        std::lock_guard<std::mutex> l(e->m);
        g = e->recorded; /* the most recent record at the time of the call */
        if (g) e->waits++;
    }
    if (g) s->push([e, g] { event_wait(e, g, true); }, true);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    event *e = (event *)ev;
    if (captured_event(e, "cudaEventSynchronize") != cudaSuccess) return cudaErrorCapturedEvent;
    ctx().syncs++;
    uint64_t g;
    {
        quiet q_;
        std::lock_guard<std::mutex> l(e->m);
        g = e->recorded;
    }
    event_wait(e, g, false);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
    event *e = (event *)ev;
    if (captured_event(e, "cudaEventQuery") != cudaSuccess) return cudaErrorCapturedEvent;
    bool done;
    {
        quiet q_;
        std::lock_guard<std::mutex> l(e->m);
        done = e->completed >= e->recorded;
    }
    if (!done) return cudaErrorNotReady;
    tsan_acquire(&e->done_sync); /* done: the host sees the recorded work */
    return cudaSuccess;
}
} // extern "C"

// ---- stream capture and graphs: the runtime API (see "stream capture" above) ----
namespace cudasim {
struct exec_obj {
    std::mutex m;
    std::shared_ptr<const node_list> nodes; /* replaced whole by cudaGraphExecUpdate */
};
/* The host lets go of an exec's nodes, which launches in flight may still hold (copied quiet:
 * a reference count is no order): ordered after the runs so far, so that whichever side frees
 * them last is too (the only order, beyond CUDA's, that the simulator adds). */
static void drop_nodes(std::shared_ptr<const node_list> &nodes, std::shared_ptr<const node_list> by) {
    tsan_acquire((void *)nodes.get());
    tsan_release((void *)nodes.get());
    quiet q_;
    nodes = std::move(by);
}
/* The capture of a stream, under the registry lock; null when it is not capturing. */
static capture *capture_of(stream *s) {
    auto it = reg().caps.find(s->cap_id.load());
    return it == reg().caps.end() ? nullptr : &it->second;
}
/* Every stream's last captured work is an ancestor of (or is) the origin's. */
static bool joined(const capture &c) {
    const node_list &nl = *c.graph->nodes;
    std::vector<char> seen(nl.size(), 0);
    std::vector<size_t> todo = c.origin->cap_deps;
    while (!todo.empty()) {
        size_t i = todo.back();
        todo.pop_back();
        if (seen[i]) continue;
        seen[i] = 1;
        for (size_t d : nl[i].deps) todo.push_back(d);
    }
    for (stream *m : c.members)
        for (size_t d : m->cap_deps)
            if (!seen[d]) return false;
    return true;
}
} // namespace cudasim

extern "C" {
cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (s->legacy) return set_err(cudaErrorStreamCaptureUnsupported); /* the legacy/per-thread default stream */
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return set_err(cudaErrorInvalidValue);
    auto &r = reg();
    std::lock_guard<std::mutex> l(r.m);
    if (s->cap_id.load()) return set_err(cudaErrorIllegalState);
    uint64_t id = ++r.next;
    r.caps[id] = capture{mode, std::this_thread::get_id(), s, false, {s}, new graph_obj, ""};
    s->cap_deps.clear();
    s->cap_id = id;
    r.active++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *out) {
    stream *s = get_stream(st);
    if (!s || !out) return set_err(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    auto &r = reg();
    std::lock_guard<std::mutex> l(r.m);
    uint64_t id = s->cap_id.load();
    capture *c = capture_of(s);
    if (!c) return set_err(cudaErrorIllegalState);
    if (c->origin != s) return set_err(cudaErrorStreamCaptureUnmatched);
    /* a global or thread-local capture ended on another thread fails with WrongThread, and is
     * ended (the H100, CUDA 13.0: another thread's cudaMalloc then succeeds); an invalidated one
     * fails with Invalidated on any thread */
    bool wrong = c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id();
    cudaError_t e = c->invalid ? cudaErrorStreamCaptureInvalidated
                    : wrong    ? cudaErrorStreamCaptureWrongThread
                    : !joined(*c) ? cudaErrorStreamCaptureUnjoined
                                  : cudaSuccess;
    if (e != cudaSuccess && !r.errors_expected.load()) {
        fprintf(stderr, "cudasim: the capture on stream %p failed: %s (%s)%s%s; under the simulator a failed capture "
                "is an error (a program that expects it calls cudasim::expect_capture_errors(true))\n", (void *)s,
                err_name(e), err_string(e), c->invalid ? ": " : "", c->invalid ? c->why : "");
        abort();
    }
    for (stream *m : c->members) { /* the capture ends, whatever the outcome */
        m->cap_id = 0;
        m->cap_deps.clear();
    }
    *out = e == cudaSuccess ? (cudaGraph_t)c->graph : nullptr;
    if (e != cudaSuccess) delete c->graph;
    r.caps.erase(id);
    r.active--;
    return set_err(e);
}
cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status) {
    stream *s = get_stream(st);
    if (!s || !status) return set_err(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(reg().m);
    capture *c = capture_of(s);
    *status = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
/* Status, id, the graph being built and the number of dependencies; the dependency handles and
 * edge data are not modelled (null). */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t st, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                     cudaGraph_t *graph, const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                     size_t *ndeps) {
    stream *s = get_stream(st);
    if (!s || !status) return set_err(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    std::lock_guard<std::mutex> l(reg().m);
    capture *c = capture_of(s);
    *status = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    if (id) *id = c ? s->cap_id.load() : 0;
    if (graph) *graph = c ? (cudaGraph_t)c->graph : nullptr;
    if (deps) *deps = nullptr;
    if (edges) *edges = nullptr;
    if (ndeps) *ndeps = c ? s->cap_deps.size() : 0;
    return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (!mode) return set_err(cudaErrorInvalidValue);
    std::swap(*mode, tl_capture_mode);
    return cudaSuccess;
}
/* The number of nodes (the node handles themselves are not modelled). */
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    if (!g || !n || nodes) return set_err(cudaErrorInvalidValue);
    *n = ((graph_obj *)g)->nodes->size();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    if (!g) return set_err(cudaErrorInvalidValue);
    delete (graph_obj *)g;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
    if (!out || !g || flags) return set_err(cudaErrorInvalidValue); /* no instantiation flags modelled */
    auto *x = new exec_obj;
    x->nodes = std::make_shared<const node_list>(*((graph_obj *)g)->nodes); /* a snapshot: the graph may change or go */
    *out = (cudaGraphExec_t)x;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
    return cudaGraphInstantiate(out, g, flags);
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    if (!x) return set_err(cudaErrorInvalidValue);
    auto *ex = (exec_obj *)x;
    drop_nodes(ex->nodes, nullptr); /* launches in flight hold their own reference to the nodes */
    delete ex;
    return cudaSuccess;
}
/* The nodes of g replace those of x when the topology matches: the same number of nodes, each
 * of the same kind with the same dependencies; a copy node with the same memory kinds. The
 * arguments (pointers, sizes, scalars) may differ, and so may a kernel node's function (the H100,
 * CUDA 13.0: only a function of another context or with device-side launches is refused). */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    if (!x || !g) return set_err(cudaErrorInvalidValue);
    auto *ex = (exec_obj *)x;
    const node_list &nw = *((graph_obj *)g)->nodes;
    std::lock_guard<std::mutex> l(ex->m);
    cudaGraphExecUpdateResult res = cudaGraphExecUpdateSuccess;
    {
        quiet q_; /* launches in flight read these nodes too (see drop_nodes) */
        const node_list &old = *ex->nodes;
        if (nw.size() != old.size()) res = cudaGraphExecUpdateErrorTopologyChanged;
        for (size_t i = 0; i < nw.size() && res == cudaGraphExecUpdateSuccess; i++)
            res = nw[i].deps != old[i].deps ? cudaGraphExecUpdateErrorTopologyChanged
                  : nw[i].kind != old[i].kind ? cudaGraphExecUpdateErrorNodeTypeChanged
                  : nw[i].kind == NODE_MEMCPY && nw[i].key != old[i].key ? cudaGraphExecUpdateErrorParametersChanged
                                                                          : cudaGraphExecUpdateSuccess;
    }
    if (info) {
        memset(info, 0, sizeof *info);
        info->result = res;
    }
    if (res != cudaGraphExecUpdateSuccess) return set_err(cudaErrorGraphExecUpdateFailure);
    drop_nodes(ex->nodes, std::make_shared<const node_list>(nw));
    return cudaSuccess;
}
/* The nodes run in capture order, as one operation of the stream. Not on a capturing stream: the
 * H100 (CUDA 13.0) refuses that with cudaErrorStreamCaptureUnsupported and the capture is
 * invalidated (a child graph is built with cudaGraphAddChildGraphNode, not modelled here). */
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t st) {
    stream *s = get_stream(st);
    if (!s) return set_err(cudaErrorInvalidResourceHandle);
    if (!x) return set_err(cudaErrorInvalidValue);
    if (capture_forbids(s, "cudaGraphLaunch") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    if (sticky() != cudaSuccess) return set_err(sticky());
    auto *ex = (exec_obj *)x;
    task run;
    { /* the reference the launch takes: quiet (see drop_nodes) */
        quiet q_;
        std::lock_guard<std::mutex> l(ex->m);
        std::shared_ptr<const node_list> nodes = ex->nodes;
        run = [nodes] {
            ctx().glaunch++;
            for (const node &n : *nodes) {
                if (sticky() != cudaSuccess) break; /* after a fault the rest is dropped, as queued work is */
                ctx().gnodes++;
                (*n.run)();
            }
            tsan_release((void *)nodes.get());
        };
    }
    return set_err(issue(s, NODE_GRAPH, nullptr, std::move(run)));
}
} // extern "C"

// ---- cuBLAS: the handle, and GemmStridedBatchedEx as a CPU loop on the handle's stream ----
struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};
namespace cudasim {
static float ld(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: fatal("gemm: unsupported data type");
    }
}
static void st(void *p, cudaDataType_t t, size_t i, float v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: fatal("gemm: unsupported data type");
    }
}
static float tf32(float x) { /* round to 10 mantissa bits, nearest even */
    if (!std::isfinite(x)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
    memcpy(&x, &u, 4);
    return x;
}
/* acc[j] += sum_p a[p] * b[p*n + j], p ascending (vectorized over j) */
#if defined(__clang__)
#define CUDASIM_O3
#else
#define CUDASIM_O3 __attribute__((optimize("O3")))
#endif
CUDASIM_O3 static void axpy_rows(int n, int k, const float *__restrict a,
                                                     const float *__restrict b, float *__restrict acc) {
    for (int p = 0; p < k; p++) {
        float x = a[p];
        const float *__restrict row = b + (size_t)p * n;
        for (int j = 0; j < n; j++) acc[j] += x * row[j];
    }
}
static size_t tsize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
/* a column-major operand of `rows` x `cols` at leading dimension ld, `batch` times at `stride` */
static bool operand_ok(const void *p, cudaDataType_t t, long rows, long cols, long ldim, long long stride, int batch) {
    if (rows == 0 || cols == 0 || batch == 0) return true;
    size_t ext = ((size_t)(cols - 1) * ldim + rows + (size_t)(batch - 1) * (size_t)stride) * tsize(t);
    return kind_of(p, ext) == MEM_DEVICE;
}
} // namespace cudasim

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaDeviceSynchronize();
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!get_stream(s)) return CUBLAS_STATUS_INVALID_VALUE;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "unknown cuBLAS status";
    }
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t comp, cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, na ? m : k) || ldb < std::max(1, nb ? k : n) ||
        ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (at != bt || (comp != CUBLAS_COMPUTE_32F && comp != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        (comp == CUBLAS_COMPUTE_32F_FAST_TF32 && at != CUDA_R_32F) ||
        (at == CUDA_R_32F && ct != CUDA_R_32F) || (at != CUDA_R_32F && ct != at && ct != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    float al = *(const float *)alpha, be = *(const float *)beta; /* pointer mode host: read now */
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    bool read_ab = al != 0.0f && k > 0;
    if ((read_ab && (!operand_ok(A, at, na ? m : k, na ? k : m, lda, sa, batch) ||
                     !operand_ok(B, bt, nb ? k : n, nb ? n : k, ldb, sb, batch))) ||
        !operand_ok(C, ct, m, n, ldc, sc, batch)) {
        fprintf(stderr, "cudasim: cublasGemmStridedBatchedEx: an operand is not (all) in device memory\n");
        abort(); /* on a GPU: an illegal address, later */
    }
    /* TF32: asked by the compute type, or by the handle's math mode for an f32 compute */
    bool t32 = comp == CUBLAS_COMPUTE_32F_FAST_TF32 ||
               (comp == CUBLAS_COMPUTE_32F && at == CUDA_R_32F && (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH);
    stream *s = get_stream(h->stream);
    cudaError_t ce = issue(s, NODE_CUBLAS, nullptr, [=] {
        ctx().cublas++; /* counted when it runs (once per graph launch when captured) */
        /* op(A) and op(B) unpacked to f32 (TF32-rounded when asked), then C row by row; each
         * C element sums its k products in order, in f32 */
        std::vector<float> pa(read_ab ? (size_t)m * k : 0), pb(read_ab ? (size_t)k * n : 0), acc(n);
        for (int q = 0; q < batch; q++) {
            const char *a = (const char *)A + (size_t)q * sa * tsize(at), *b = (const char *)B + (size_t)q * sb * tsize(bt);
            char *c = (char *)C + (size_t)q * sc * tsize(ct);
            if (read_ab) {
                for (int i = 0; i < m; i++)
                    for (int p = 0; p < k; p++) {
                        float x = ld(a, at, na ? i + (size_t)p * lda : p + (size_t)i * lda);
                        pa[(size_t)i * k + p] = t32 ? tf32(x) : x;
                    }
                for (int p = 0; p < k; p++)
                    for (int j = 0; j < n; j++) {
                        float y = ld(b, bt, nb ? p + (size_t)j * ldb : j + (size_t)p * ldb);
                        pb[(size_t)p * n + j] = t32 ? tf32(y) : y;
                    }
            }
            for (int i = 0; i < m; i++) {
                std::fill(acc.begin(), acc.end(), 0.0f);
                if (read_ab) axpy_rows(n, k, &pa[(size_t)i * k], pb.data(), acc.data());
                for (int j = 0; j < n; j++) {
                    size_t ci = i + (size_t)j * ldc;
                    float v = al * acc[j];
                    if (be != 0.0f) v += be * ld(c, ct, ci); /* beta 0: C is not read */
                    st(c, ct, ci, v);
                }
            }
        }
    });
    if (ce != cudaSuccess) { set_err(ce); return CUBLAS_STATUS_EXECUTION_FAILED; }
    return CUBLAS_STATUS_SUCCESS;
}
} // extern "C"
extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                                       cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                                       cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                      comp, algo);
}
#ifdef MEGABATCH_NCCL
#include "cudasim_nccl.h" /* ncclAllReduce & co over MPI (builds with -DMEGABATCH_NCCL and MPI) */
#endif
#endif /* CUDASIM_IMPLEMENTATION */

/* From here on the source is "CUDA C++": what nvcc defines for it (after NVIDIA's headers and
 * the C++ library above were included in host mode, so they keep their host definitions). */
#define __CUDACC__ 1
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#endif /* CUDASIM_H */
