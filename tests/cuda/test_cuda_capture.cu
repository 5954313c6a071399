/* Stream capture and CUDA graphs as the simulator (tests/cudasim/cudasim.h) models them, in the
 * CUDA runtime's own terms: work on a capturing stream is recorded, not run; fork/join through
 * events; the illegal calls and the error codes they give; replay, cudaGraphExecUpdate, child
 * graphs; and a randomized program over three streams whose replay must equal its eager run.
 * Under the simulator it also checks the counters. Built by nvcc too: on a GPU it checks the
 * simulator's model against the real runtime, and each failure names the call and both answers
 * (docs/GPU.md lists which answers were read off a GPU). It asserts only what a program can rely
 * on: the simulator's own choices (a cuBLAS call is one node, memory nodes are refused, the
 * counters) are marked CUDASIM, and where the runtime documents only "an error" a GPU run checks
 * just that. Without a GPU every test skips. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

#include <thread>

__global__ void k_add(float *y, float v, int n) { /* y += v */
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] += v;
}
__global__ void k_axpy(float *y, const float *x, float a, int n) { /* y = a*y + x */
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * y[i] + x[i];
}
__global__ void k_set(float *y, float v, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = v;
}

enum { N = 64 };

static void need_gpu(void) { /* skips the test where there is no device */
    tu_device_close(tu_open_cuda_or_skip(0));
}

static float *dev_f32(size_t n) { return (float *)tu_cuda_malloc(n * sizeof(float)); }
static float get1(const float *d, int i) {
    float v;
    assert_int_equal(cudaMemcpy(&v, d + i, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

/* The call gave the model's answer, or the test fails naming both (the runtime's names). */
#define EXPECT(call, want) expect_rc(#call, (call), (want))
static void expect_rc(const char *call, cudaError_t got, cudaError_t want) {
    if (got != want)
        fail_msg("%s returned %s (%d); the model says %s (%d)", call, cudaGetErrorName(got), (int)got,
                 cudaGetErrorName(want), (int)want);
}
/* Where the runtime documents an error but not its code: the code under the simulator, any error on a GPU. */
#define EXPECT_ERROR(call, sim_code) expect_error(#call, (call), (sim_code))
static void expect_error(const char *call, cudaError_t got, cudaError_t sim_code) {
#ifdef CUDASIM
    expect_rc(call, got, sim_code);
#else
    if (got == cudaSuccess) fail_msg("%s succeeded; the model says %s", call, cudaGetErrorName(sim_code));
    printf("%s: %s (%d)\n", call, cudaGetErrorName(got), (int)got);
#endif
    cudaGetLastError();
}
/* Where the runtime documents nothing: the simulator's answer under it, what a GPU gives printed. */
#define OBSERVE(call, sim_code) observe(#call, (call), (sim_code))
static void observe(const char *call, cudaError_t got, cudaError_t sim_code) {
#ifdef CUDASIM
    expect_rc(call, got, sim_code);
#else
    printf("%s: %s (%d); the model says %s\n", call, cudaGetErrorName(got), (int)got, cudaGetErrorName(sim_code));
#endif
    cudaGetLastError();
}
static const char *status_name(cudaStreamCaptureStatus st) {
    return st == cudaStreamCaptureStatusNone ? "none" : st == cudaStreamCaptureStatusActive ? "active" : "invalidated";
}
/* After an end on another thread: the simulator ends the capture; a GPU's answer is printed, and
 * the capture ended here if it did not. */
static void capture_ended(cudaStream_t s, const char *after) {
    cudaStreamCaptureStatus st;
    EXPECT(cudaStreamIsCapturing(s, &st), cudaSuccess);
#ifdef CUDASIM
    if (st != cudaStreamCaptureStatusNone) fail_msg("after %s the stream is %s", after, status_name(st));
#else
    printf("after %s: %s\n", after, status_name(st));
    if (st != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(s, &g);
        if (g) tu_hold(TU_GRAPH, g);
        cudaGetLastError();
    }
#endif
}
static void expect_status(cudaStream_t s, cudaStreamCaptureStatus want, const char *after) {
    cudaStreamCaptureStatus st;
    EXPECT(cudaStreamIsCapturing(s, &st), cudaSuccess);
    if (st != want) fail_msg("after %s the capture status is %s; the model says %s", after, status_name(st), status_name(want));
}
static cudaGraphExec_t instantiate(cudaGraph_t g) {
    cudaGraphExec_t x = NULL;
    EXPECT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    return (cudaGraphExec_t)tu_hold(TU_EXEC, x);
}
static cudaGraph_t end_capture(cudaStream_t s) {
    cudaGraph_t g = NULL;
    EXPECT(cudaStreamEndCapture(s, &g), cudaSuccess);
    return (cudaGraph_t)tu_hold(TU_GRAPH, g);
}
static size_t nodes_of(cudaGraph_t g) {
    size_t n = 0;
    EXPECT(cudaGraphGetNodes(g, NULL, &n), cudaSuccess);
    return n;
}

/* Kernel, memset, copies and a cuBLAS call are recorded in order and run only at each launch;
 * the counters count what ran. */
static void test_capture_records_not_runs(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = tu_cuda_stream();
    float *y = dev_f32(N), *c = dev_f32(1), *pin = NULL, one = 1.0f, zero = 0.0f;
    EXPECT(cudaMallocHost((void **)&pin, N * sizeof(float)), cudaSuccess);
    tu_hold(TU_PINNED, pin);
    for (int i = 0; i < N; i++) pin[i] = (float)i;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    tu_hold(TU_CUBLAS, h);
    cublasSetStream(h, a);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    expect_status(a, cudaStreamCaptureStatusNone, "cudaStreamCreate");
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    expect_status(a, cudaStreamCaptureStatusActive, "cudaStreamBeginCapture");
    EXPECT(cudaMemcpyAsync(y, pin, N * sizeof(float), cudaMemcpyHostToDevice, a), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 0.5f, N);
    /* c = y[0:2] . y[0:2] (a 1x1 gemm over k = 2) */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 2, &one, y, CUDA_R_32F, 2, y, CUDA_R_32F, 2, &zero, c,
                                  CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    EXPECT(cudaMemsetAsync(y + N - 1, 0, sizeof(float), a), cudaSuccess);
    EXPECT(cudaMemcpyAsync(pin, y, N * sizeof(float), cudaMemcpyDeviceToHost, a), cudaSuccess);
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    cudaGraph_t during = NULL;
    size_t ndeps = 0;
    EXPECT(cudaStreamGetCaptureInfo(a, &st, &id, &during, NULL, NULL, &ndeps), cudaSuccess);
    assert_true(st == cudaStreamCaptureStatusActive && id != 0 && during != NULL && ndeps == 1);
    cudaGraph_t g = end_capture(a);
    assert_ptr_equal(g, during);
    expect_status(a, cudaStreamCaptureStatusNone, "cudaStreamEndCapture");
    /* nothing ran: y is still zero (cudaMemcpy on the legacy stream is legal with non-blocking streams capturing) */
#ifdef CUDASIM
    cudasim::stats s = cudasim::get_stats();
    assert_int_equal(s.launches + s.cublas_calls + s.bytes_h2d + s.bytes_d2h + s.graph_launches, 0);
#endif
    assert_true(get1(y, 0) == 0.0f && pin[1] == 1.0f);
    /* 4 nodes of ours and the cuBLAS call's: 1 here, 4 on the H100 (CUDA 13.0), a number that
     * depends on the cuBLAS version, so only "at least one" is asserted on a GPU */
    size_t nodes = nodes_of(g);
#ifdef CUDASIM
    assert_int_equal(nodes, 5);
#else
    printf("a capture with one cublasGemmEx has %zu nodes\n", nodes);
    assert_true(nodes >= 5);
#endif
    cudaGraphExec_t x = instantiate(g);
    EXPECT(cudaGraphDestroy(g), cudaSuccess); /* the exec keeps its own copy */
    tu_let_go(g);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < N; i++) pin[i] = (float)i; /* the copy node reads pinned memory at launch */
        EXPECT(cudaGraphLaunch(x, a), cudaSuccess);
        EXPECT(cudaStreamSynchronize(a), cudaSuccess);
        assert_true(pin[0] == 0.5f && pin[1] == 1.5f && pin[N - 1] == 0.0f);
        assert_true(get1(c, 0) == 0.5f * 0.5f + 1.5f * 1.5f);
    }
#ifdef CUDASIM
    s = cudasim::get_stats();
    assert_int_equal(s.graph_launches, 2);
    assert_int_equal(s.graph_nodes, 10);
    assert_int_equal(s.launches, 2);
    assert_int_equal(s.cublas_calls, 2);
    assert_int_equal(s.bytes_h2d, 2 * N * sizeof(float));
    assert_int_equal(s.bytes_d2h, 2 * N * sizeof(float) + 2 * sizeof(float)); /* + the two get1 */
#endif
}

/* Fork/join: b joins a's capture through an event, a joins b back; without the join the capture
 * ends as unjoined. */
static void test_fork_join(void **state) {
    (void)state;
    need_gpu();
    tu_cuda_capture_errors_expected();
    cudaStream_t a = tu_cuda_stream(), b = tu_cuda_stream();
    cudaEvent_t fork = tu_cuda_event(), join = tu_cuda_event();
    float *y = dev_f32(N), *z = dev_f32(N);
    for (int joined = 0; joined < 2; joined++) {
        EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        MB_LAUNCH(k_set, 1, 32, 0, a)(y, 2.0f, N);
        EXPECT(cudaEventRecord(fork, a), cudaSuccess);
        expect_status(b, cudaStreamCaptureStatusNone, "cudaEventRecord on the capturing stream");
        EXPECT(cudaStreamWaitEvent(b, fork, 0), cudaSuccess);
        expect_status(b, cudaStreamCaptureStatusActive, "cudaStreamWaitEvent on an event of the capture");
        MB_LAUNCH(k_axpy, 1, 32, 0, b)(z, y, 3.0f, N); /* z = 3z + y, after a's k_set */
        if (joined) {
            EXPECT(cudaEventRecord(join, b), cudaSuccess);
            EXPECT(cudaStreamWaitEvent(a, join, 0), cudaSuccess);
        }
        MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N); /* after b read y (when joined) */
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(a, &g);
        expect_status(a, cudaStreamCaptureStatusNone, "cudaStreamEndCapture");
        expect_status(b, cudaStreamCaptureStatusNone, "cudaStreamEndCapture on the origin");
        if (!joined) {
            expect_rc("cudaStreamEndCapture (b not joined back)", e, cudaErrorStreamCaptureUnjoined);
            assert_null(g);
            cudaGetLastError();
            continue;
        }
        expect_rc("cudaStreamEndCapture", e, cudaSuccess);
        tu_hold(TU_GRAPH, g);
        assert_int_equal(nodes_of(g), 3);
        cudaGraphExec_t x = instantiate(g);
        EXPECT(cudaMemset(z, 0, N * sizeof(float)), cudaSuccess);
        EXPECT(cudaGraphLaunch(x, a), cudaSuccess); /* replay in capture order */
        EXPECT(cudaGraphLaunch(x, a), cudaSuccess);
        EXPECT(cudaStreamSynchronize(a), cudaSuccess);
        /* launch 1: y = 2, z = 0*3 + 2 = 2, y = 3; launch 2: y = 2, z = 2*3 + 2 = 8, y = 3 */
        assert_true(get1(y, 5) == 3.0f && get1(z, 5) == 8.0f);
    }
    /* the events work outside a capture again */
    EXPECT(cudaEventRecord(fork, a), cudaSuccess);
    EXPECT(cudaEventSynchronize(fork), cudaSuccess);
    EXPECT(cudaEventQuery(fork), cudaSuccess);
    cudaGraph_t g = NULL;
    EXPECT_ERROR(cudaStreamEndCapture(a, &g), cudaErrorIllegalState); /* no capture under way */
}

/* An event recorded in a capture cannot be queried (cudaErrorCapturedEvent, read off the H100),
 * and the query invalidates the capture: a wait on the event from another stream is then
 * cudaErrorInvalidValue (the H100), and the stream stays out of it. Ending a capture on a stream
 * that only joined it is cudaErrorStreamCaptureUnmatched. */
static void test_captured_event(void **state) {
    (void)state;
    need_gpu();
    tu_cuda_capture_errors_expected();
    cudaStream_t a = tu_cuda_stream(), b = tu_cuda_stream();
    cudaEvent_t e = tu_cuda_event();
    float *y = dev_f32(N);
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    MB_LAUNCH(k_set, 1, 32, 0, a)(y, 2.0f, N);
    EXPECT(cudaEventRecord(e, a), cudaSuccess);
    EXPECT(cudaEventQuery(e), cudaErrorCapturedEvent);
    EXPECT(cudaGetLastError(), cudaErrorCapturedEvent);
    expect_status(b, cudaStreamCaptureStatusNone, "cudaEventQuery on an event of a capture");
    EXPECT(cudaStreamWaitEvent(b, e, 0), cudaErrorInvalidValue);
    cudaGetLastError();
    expect_status(b, cudaStreamCaptureStatusNone, "cudaStreamWaitEvent on that event");
    expect_status(a, cudaStreamCaptureStatusInvalidated, "cudaEventQuery on an event of the capture");
    cudaGraph_t g = (cudaGraph_t)1;
    EXPECT(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    cudaGetLastError();
    /* ending on a stream that joined (and was joined back): refused; the origin ends it */
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT(cudaEventRecord(e, a), cudaSuccess);
    EXPECT(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, b)(y, 1.0f, N);
    EXPECT(cudaEventRecord(e, b), cudaSuccess);
    EXPECT(cudaStreamWaitEvent(a, e, 0), cudaSuccess);
    EXPECT(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureUnmatched);
    g = NULL;
    OBSERVE(cudaStreamEndCapture(a, &g), cudaSuccess); /* the refused end left the capture as it was? */
    if (g) {
        tu_hold(TU_GRAPH, g);
        assert_int_equal(nodes_of(g), 1);
    }
}

/* Begins capture, runs bad(), and checks that it fails with err, that the capture is then
 * invalidated (a later launch says so, the end gives no graph), and that the stream works after. */
template <class F>
static void invalidated_by(cudaStream_t a, cudaStreamCaptureMode mode, cudaError_t err, const char *what, F bad) {
    float *y = dev_f32(N);
    EXPECT(cudaStreamBeginCapture(a, mode), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    expect_rc(what, bad(), err);
    expect_rc("cudaGetLastError after it", cudaGetLastError(), err);
    expect_status(a, cudaStreamCaptureStatusInvalidated, what);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    expect_rc("a launch into the invalidated capture", cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    cudaGraph_t g = (cudaGraph_t)1;
    EXPECT(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    cudaGetLastError();
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N); /* runs now */
    EXPECT(cudaStreamSynchronize(a), cudaSuccess);
    assert_true(get1(y, 0) == 1.0f);
}
#define INVALIDATED_BY(a, mode, err, call) invalidated_by(a, mode, err, #call, [&] { return call; })

/* Begins capture, runs ok(), which must succeed and leave the capture active; the end gives the graph. */
template <class F> static void legal_during(cudaStream_t a, cudaStreamCaptureMode mode, const char *what, F ok) {
    float *y = dev_f32(N);
    EXPECT(cudaStreamBeginCapture(a, mode), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    expect_rc(what, ok(), cudaSuccess);
    expect_status(a, cudaStreamCaptureStatusActive, what);
    cudaGraph_t g = end_capture(a);
    assert_int_equal(nodes_of(g), 1);
}
#define LEGAL_DURING(a, mode, call) legal_during(a, mode, #call, [&] { return call; })

/* The illegal calls during a capture and their errors; the legal ones that look illegal. */
static void test_illegal_during_capture(void **state) {
    (void)state;
    need_gpu();
    tu_cuda_capture_errors_expected();
    cudaStream_t a = tu_cuda_stream(), b = tu_cuda_stream();
    cudaEvent_t outside = tu_cuda_event(), e = tu_cuda_event();
    float *y = dev_f32(N), h = 0;
    void *p = NULL;
    INVALIDATED_BY(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, cudaStreamSynchronize(a));
    INVALIDATED_BY(a, cudaStreamCaptureModeThreadLocal, cudaErrorStreamCaptureUnsupported, cudaDeviceSynchronize());
    /* the legacy stream waits for no non-blocking stream: its synchronous calls are legal while
     * non-blocking streams capture (the H100: cudaMemcpy returned success) */
    LEGAL_DURING(a, cudaStreamCaptureModeGlobal, cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost));
    LEGAL_DURING(a, cudaStreamCaptureModeGlobal, cudaMemset(y, 0, 4));
    INVALIDATED_BY(a, cudaStreamCaptureModeThreadLocal, cudaErrorStreamCaptureUnsupported, cudaMalloc(&p, 16));
    INVALIDATED_BY(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, cudaFree(y));
#ifdef CUDASIM /* the simulator's own refusals (CUDA captures memory nodes) */
    INVALIDATED_BY(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, cudaMallocAsync(&p, 16, a));
    INVALIDATED_BY(a, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureUnsupported, cudaStreamDestroy(a));
#endif
    cudaEventRecord(outside, b); /* plain execution: a capture may not wait on it */
    INVALIDATED_BY(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureIsolation, cudaStreamWaitEvent(a, outside, 0));
    /* a stream of another capture waits on an event of this one: the captures would merge (both
     * invalidated; b's capture is relaxed, so the helper's allocations stay legal) */
    cudaGraph_t g;
    EXPECT(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent(b, e of a)", [&] {
        cudaEventRecord(e, a);
        return cudaStreamWaitEvent(b, e, 0);
    });
    EXPECT(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    /* relaxed: allocation is allowed during the capture, and so it is for a thread in relaxed mode */
    LEGAL_DURING(a, cudaStreamCaptureModeRelaxed, cudaMalloc(&p, 16));
    EXPECT(cudaFree(p), cudaSuccess);
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    EXPECT(cudaThreadExchangeStreamCaptureMode(&m), cudaSuccess);
    assert_int_equal(m, cudaStreamCaptureModeGlobal);
    EXPECT(cudaMalloc(&p, 16), cudaSuccess);
    EXPECT(cudaFree(p), cudaSuccess);
    EXPECT(cudaThreadExchangeStreamCaptureMode(&m), cudaSuccess);
    /* another thread (in global mode): refused under a global capture, which only its own thread
     * may end; free under a thread-local one, which only its own thread may end */
    cudaError_t other = cudaSuccess;
    std::thread([&] { other = cudaMalloc(&p, 16); }).join();
    expect_rc("cudaMalloc on another thread during a global capture", other, cudaErrorStreamCaptureUnsupported);
    /* that invalidated the capture, which then ends on any thread (the H100, CUDA 13.0) */
    std::thread([&] { other = cudaStreamEndCapture(a, &g); }).join();
    expect_rc("cudaStreamEndCapture of an invalidated global capture on another thread", other,
              cudaErrorStreamCaptureInvalidated);
    capture_ended(a, "the other thread's cudaStreamEndCapture (invalidated)");
    /* a global capture that is not invalidated: another thread's end fails, and ends it */
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    std::thread([&] { other = cudaStreamEndCapture(a, &g); }).join();
    expect_rc("cudaStreamEndCapture of a global capture on another thread", other, cudaErrorStreamCaptureWrongThread);
    capture_ended(a, "the other thread's cudaStreamEndCapture (wrong thread)");
    cudaGetLastError();
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    std::thread([&] {
        other = cudaMalloc(&p, 16);
        if (other == cudaSuccess) other = cudaFree(p);
        if (other == cudaSuccess) other = cudaStreamEndCapture(a, &g);
    }).join();
    expect_rc("cudaMalloc, cudaFree, cudaStreamEndCapture of a thread-local capture on another thread", other,
              cudaErrorStreamCaptureWrongThread);
    capture_ended(a, "the other thread's cudaStreamEndCapture (thread-local, wrong thread)");
    cudaGetLastError();
    /* a relaxed capture ends on any thread */
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed), cudaSuccess);
    std::thread([&] { other = cudaStreamEndCapture(a, &g); }).join();
    expect_rc("cudaStreamEndCapture of a relaxed capture on another thread", other, cudaSuccess);
    tu_hold(TU_GRAPH, g);
    /* the legacy default stream cannot capture, and is unusable while a blocking stream captures */
    EXPECT_ERROR(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    cudaStream_t blocking;
    EXPECT(cudaStreamCreate(&blocking), cudaSuccess);
    tu_hold(TU_STREAM, blocking);
    EXPECT(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    EXPECT(cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureImplicit);
    cudaGetLastError();
    g = NULL;
    OBSERVE(cudaStreamEndCapture(blocking, &g), cudaSuccess); /* not invalidated by the refused call? */
    if (g) tu_hold(TU_GRAPH, g);
}

/* cudaGraphExecUpdate takes new arguments, a new grid, even another function for a kernel node
 * (the H100, CUDA 13.0); it refuses another topology or node type and leaves the exec as it was.
 * A graph launched in a capture becomes a node, which replays it. */
static void test_exec_update_and_nested_launch(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = tu_cuda_stream();
    float *y = dev_f32(N), *z = dev_f32(N);
    cudaGraph_t gr[5];
    for (int i = 0; i < 5; i++) {
        EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
        if (i == 0) MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
        if (i == 1) MB_LAUNCH(k_add, 2, 32, 0, a)(z, 5.0f, N); /* other arguments and grid */
        if (i == 2) MB_LAUNCH(k_set, 1, 32, 0, a)(z, 7.0f, N); /* another function */
        for (int k = 0; k < (i == 3 ? 2 : 0); k++) MB_LAUNCH(k_add, 1, 32, 0, a)(z, 1.0f, N); /* another topology */
        if (i == 4) EXPECT(cudaMemsetAsync(z, 0, 4, a), cudaSuccess); /* another node type */
        gr[i] = end_capture(a);
    }
    cudaGraphExec_t x = instantiate(gr[0]);
    cudaGraphExecUpdateResultInfo info;
    EXPECT(cudaGraphExecUpdate(x, gr[1], &info), cudaSuccess);
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    EXPECT(cudaGraphLaunch(x, a), cudaSuccess); /* gr[1]'s arguments: z += 5 */
    EXPECT(cudaStreamSynchronize(a), cudaSuccess);
    assert_true(get1(y, 3) == 0.0f && get1(z, 3) == 5.0f);
    EXPECT(cudaGraphExecUpdate(x, gr[2], &info), cudaSuccess);
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    EXPECT(cudaGraphExecUpdate(x, gr[3], &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    cudaGetLastError();
    EXPECT(cudaGraphExecUpdate(x, gr[4], &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorNodeTypeChanged);
    cudaGetLastError();
    EXPECT(cudaGraphLaunch(x, a), cudaSuccess); /* still gr[2]: z = 7 */
    EXPECT(cudaStreamSynchronize(a), cudaSuccess);
    assert_true(get1(z, 3) == 7.0f);
    /* an exec launched on a capturing stream: refused, and the capture invalidated (the H100,
     * CUDA 13.0; a child graph is cudaGraphAddChildGraphNode's, which the library does not use) */
    tu_cuda_capture_errors_expected();
    EXPECT(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT(cudaGraphLaunch(x, a), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t outer = NULL;
    OBSERVE(cudaStreamEndCapture(a, &outer), cudaErrorStreamCaptureInvalidated);
    if (outer) tu_hold(TU_GRAPH, outer);
    expect_status(a, cudaStreamCaptureStatusNone, "cudaStreamEndCapture");
}

/* A random program over 3 streams and 4 buffers (kernels, copies, memsets, cross-stream
 * event waits that fork and join) run eagerly, then captured and replayed from the same
 * start: the same bits, and the same counters. */
static void test_random_program_replay(void **state) {
    (void)state;
    need_gpu();
    tu_seed();
    enum { S = 3, NB = 4, OPS = 40 };
    cudaStream_t st[S];
    cudaEvent_t ev[S];
    for (int i = 0; i < S; i++) {
        st[i] = tu_cuda_stream();
        ev[i] = tu_cuda_event();
    }
    float *buf[NB], init[NB][N], eager[NB][N], replay[NB][N];
    for (int b = 0; b < NB; b++) {
        buf[b] = dev_f32(N);
        tu_fill(init[b], N, -1.0f, 1.0f);
    }
    /* each op: kind, stream, buffers, scalar; every stream ends joined into stream 0. Each buffer
     * belongs to one stream at a time (the op moves it with a wait), so there are no races. */
    struct op { int kind, s, b, b2; float v; } prog[OPS];
    for (int i = 0; i < OPS; i++) {
        op &o = prog[i];
        o.kind = tu_int(0, 3); o.s = tu_int(0, S - 1); o.b = tu_int(0, NB - 1); o.b2 = tu_int(0, NB - 1);
        o.v = tu_uniform(-2.0f, 2.0f);
    }
    auto run = [&](bool capture) {
        for (int b = 0; b < NB; b++) cudaMemcpy(buf[b], init[b], sizeof init[b], cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        if (capture) assert_int_equal(cudaStreamBeginCapture(st[0], cudaStreamCaptureModeGlobal), cudaSuccess);
        int own[NB] = {0, 0, 0, 0};
        auto take = [&](int b, int s) { /* stream s waits for the buffer's last user */
            if (own[b] == s) return;
            assert_int_equal(cudaEventRecord(ev[own[b]], st[own[b]]), cudaSuccess);
            assert_int_equal(cudaStreamWaitEvent(st[s], ev[own[b]], 0), cudaSuccess);
            own[b] = s;
        };
        for (int s = 1; s < S; s++) take(0, s), take(0, 0); /* fork every stream from stream 0 */
        for (const op &o : prog) {
            take(o.b, o.s);
            take(o.b2, o.s);
            switch (o.kind) {
            case 0: MB_LAUNCH(k_add, 2, 32, 0, st[o.s])(buf[o.b], o.v, N); break;
            case 1: if (o.b != o.b2) MB_LAUNCH(k_axpy, 1, 64, 0, st[o.s])(buf[o.b], buf[o.b2], o.v, N); break;
            case 2: if (o.b != o.b2) cudaMemcpyAsync(buf[o.b], buf[o.b2], N * sizeof(float), cudaMemcpyDeviceToDevice, st[o.s]); break;
            default: cudaMemsetAsync(buf[o.b], 0, (size_t)(N / 2) * sizeof(float), st[o.s]); break;
            }
        }
        for (int s = 1; s < S; s++) { /* join every stream back */
            cudaEventRecord(ev[s], st[s]);
            cudaStreamWaitEvent(st[0], ev[s], 0);
        }
        if (capture) {
            cudaGraphExec_t x = instantiate(end_capture(st[0]));
            assert_int_equal(cudaGraphLaunch(x, st[1]), cudaSuccess); /* any stream */
            cudaStreamSynchronize(st[1]);
        }
        cudaDeviceSynchronize();
        for (int b = 0; b < NB; b++) cudaMemcpy(capture ? replay[b] : eager[b], buf[b], sizeof init[b], cudaMemcpyDeviceToHost);
    };
#ifdef CUDASIM
    cudasim::reset_stats();
    run(false);
    cudasim::stats e = cudasim::get_stats();
    cudasim::reset_stats();
    run(true);
    cudasim::stats r = cudasim::get_stats();
    assert_int_equal(e.launches, r.launches);
    assert_int_equal(e.bytes_d2d, r.bytes_d2d);
    assert_int_equal(r.graph_launches, 1);
#else
    run(false);
    run(true);
#endif
    assert_memory_equal(eager, replay, sizeof eager);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        tu_cuda_test(test_capture_records_not_runs), tu_cuda_test(test_fork_join),
        tu_cuda_test(test_captured_event),           tu_cuda_test(test_illegal_during_capture),
        tu_cuda_test(test_exec_update_and_nested_launch), tu_cuda_test(test_random_program_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
