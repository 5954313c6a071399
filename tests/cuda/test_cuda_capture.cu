/* Stream capture and CUDA graphs as the simulator (tests/cudasim/cudasim.h) models them, in the
 * CUDA runtime's own terms: work on a capturing stream is recorded, not run; fork/join through
 * events; the illegal calls and the error codes they give; replay, cudaGraphExecUpdate, child
 * graphs; and a randomized program over three streams whose replay must equal its eager run.
 * Under the simulator it also checks the counters. Built by nvcc too: on a GPU it checks the
 * simulator's model against the real runtime (the simulator's own choices are marked CUDASIM);
 * without a GPU every test skips. */
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
    mb_device *d = tu_open_cuda_or_skip(0);
    mb_device_close(d);
}

static float *dev_f32(size_t n) {
    float *p = NULL;
    assert_int_equal(cudaMalloc((void **)&p, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMemset(p, 0, n * sizeof(float)), cudaSuccess);
    return p;
}
static float get1(const float *d, int i) {
    float v;
    assert_int_equal(cudaMemcpy(&v, d + i, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}
static cudaStream_t new_stream(void) {
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    return s;
}
static cudaStreamCaptureStatus status_of(cudaStream_t s) {
    cudaStreamCaptureStatus st;
    assert_int_equal(cudaStreamIsCapturing(s, &st), cudaSuccess);
    return st;
}
static cudaGraphExec_t instantiate(cudaGraph_t g) {
    cudaGraphExec_t x = NULL;
    assert_int_equal(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    return x;
}

/* Kernel, memset, copies and a cuBLAS call are recorded in order and run only at each launch;
 * the counters count what ran. */
static void test_capture_records_not_runs(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = new_stream();
    float *y = dev_f32(N), *c = dev_f32(1), *pin = NULL, one = 1.0f, zero = 0.0f;
    assert_int_equal(cudaMallocHost((void **)&pin, N * sizeof(float)), cudaSuccess);
    for (int i = 0; i < N; i++) pin[i] = (float)i;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cublasSetStream(h, a);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    assert_int_equal(status_of(a), cudaStreamCaptureStatusNone);
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(status_of(a), cudaStreamCaptureStatusActive);
    assert_int_equal(cudaMemcpyAsync(y, pin, N * sizeof(float), cudaMemcpyHostToDevice, a), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 0.5f, N);
    /* c = y[0:2] . y[0:2] (a 1x1 gemm over k = 2) */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 2, &one, y, CUDA_R_32F, 2, y, CUDA_R_32F, 2, &zero, c,
                                  CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemsetAsync(y + N - 1, 0, sizeof(float), a), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(pin, y, N * sizeof(float), cudaMemcpyDeviceToHost, a), cudaSuccess);
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    cudaGraph_t during = NULL;
    size_t ndeps = 0;
    assert_int_equal(cudaStreamGetCaptureInfo(a, &st, &id, &during, NULL, NULL, &ndeps), cudaSuccess);
    assert_true(st == cudaStreamCaptureStatusActive && id != 0 && during != NULL && ndeps == 1);
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaSuccess);
    assert_ptr_equal(g, during);
    assert_int_equal(status_of(a), cudaStreamCaptureStatusNone);
    /* nothing ran: y is still zero (cudaMemcpy would be illegal during the capture, not after) */
#ifdef CUDASIM
    cudasim::stats s = cudasim::get_stats();
    assert_int_equal(s.launches + s.cublas_calls + s.bytes_h2d + s.bytes_d2h + s.graph_launches, 0);
#endif
    assert_true(get1(y, 0) == 0.0f && pin[1] == 1.0f);
    size_t nodes = 0;
    assert_int_equal(cudaGraphGetNodes(g, NULL, &nodes), cudaSuccess);
    assert_int_equal(nodes, 5);
    cudaGraphExec_t x = instantiate(g);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess); /* the exec keeps its own copy */
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < N; i++) pin[i] = (float)i; /* the copy node reads pinned memory at launch */
        assert_int_equal(cudaGraphLaunch(x, a), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(a), cudaSuccess);
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
    assert_int_equal(cudaGraphExecDestroy(x), cudaSuccess);
    cublasDestroy(h);
    cudaStreamDestroy(a);
    cudaFree(y); cudaFree(c); cudaFreeHost(pin);
}

/* Fork/join: b joins a's capture through an event, a joins b back; without the join the capture
 * ends as unjoined. Ending on a joined stream, or on none, is refused. */
static void test_fork_join(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = new_stream(), b = new_stream();
    cudaEvent_t fork, join;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    float *y = dev_f32(N), *z = dev_f32(N);
    for (int joined = 0; joined < 2; joined++) {
        assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        MB_LAUNCH(k_set, 1, 32, 0, a)(y, 2.0f, N);
        assert_int_equal(cudaEventRecord(fork, a), cudaSuccess);
        assert_int_equal(cudaEventQuery(fork), cudaErrorCapturedEvent);
        assert_int_equal(cudaGetLastError(), cudaErrorCapturedEvent);
        assert_int_equal(status_of(b), cudaStreamCaptureStatusNone);
        assert_int_equal(cudaStreamWaitEvent(b, fork, 0), cudaSuccess);
        assert_int_equal(status_of(b), cudaStreamCaptureStatusActive);
        MB_LAUNCH(k_axpy, 1, 32, 0, b)(z, y, 3.0f, N); /* z = 3z + y, after a's k_set */
        cudaGraph_t g = NULL;
        assert_int_equal(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureUnmatched); /* b did not begin it */
        assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureUnmatched);
        if (joined) {
            assert_int_equal(cudaEventRecord(join, b), cudaSuccess);
            assert_int_equal(cudaStreamWaitEvent(a, join, 0), cudaSuccess);
        }
        MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N); /* after b read y (when joined) */
        cudaError_t e = cudaStreamEndCapture(a, &g);
        assert_int_equal(status_of(a), cudaStreamCaptureStatusNone);
        assert_int_equal(status_of(b), cudaStreamCaptureStatusNone);
        if (!joined) {
            assert_int_equal(e, cudaErrorStreamCaptureUnjoined);
            assert_null(g);
            cudaGetLastError();
            continue;
        }
        assert_int_equal(e, cudaSuccess);
        size_t nodes = 0;
        cudaGraphGetNodes(g, NULL, &nodes);
        assert_int_equal(nodes, 3);
        cudaGraphExec_t x = instantiate(g);
        cudaGraphDestroy(g);
        assert_int_equal(cudaMemset(z, 0, N * sizeof(float)), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(x, a), cudaSuccess); /* replay in capture order */
        assert_int_equal(cudaGraphLaunch(x, a), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(a), cudaSuccess);
        /* launch 1: y = 2, z = 0*3 + 2 = 2, y = 3; launch 2: y = 2, z = 2*3 + 2 = 8, y = 3 */
        assert_true(get1(y, 5) == 3.0f && get1(z, 5) == 8.0f);
        cudaGraphExecDestroy(x);
    }
    /* the events left no pending state behind: usable outside a capture */
    assert_int_equal(cudaEventQuery(fork), cudaSuccess);
    assert_int_equal(cudaEventRecord(fork, a), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(fork), cudaSuccess);
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaErrorIllegalState);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalState);
    cudaEventDestroy(fork); cudaEventDestroy(join);
    cudaStreamDestroy(a); cudaStreamDestroy(b);
    cudaFree(y); cudaFree(z);
}

/* Begins capture, runs bad(), and checks that it fails with err, that the capture is then
 * invalidated (a later launch says so, the end gives no graph), and that the stream works after. */
template <class F> static void invalidated_by(cudaStream_t a, cudaStreamCaptureMode mode, cudaError_t err, F bad) {
    float *y = dev_f32(N);
    assert_int_equal(cudaStreamBeginCapture(a, mode), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    assert_int_equal(bad(), err);
    assert_int_equal(cudaGetLastError(), err);
    assert_int_equal(status_of(a), cudaStreamCaptureStatusInvalidated);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    cudaGraph_t g = (cudaGraph_t)1;
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    cudaGetLastError();
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N); /* runs now */
    assert_int_equal(cudaStreamSynchronize(a), cudaSuccess);
    assert_true(get1(y, 0) == 1.0f);
    cudaFree(y);
}

/* The illegal calls during a capture and their errors. */
static void test_illegal_during_capture(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = new_stream(), b = new_stream();
    cudaEvent_t outside;
    cudaEventCreate(&outside);
    float *y = dev_f32(N), h = 0;
    void *p = NULL;
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamSynchronize(a); });
    invalidated_by(a, cudaStreamCaptureModeThreadLocal, cudaErrorStreamCaptureUnsupported, [&] { return cudaDeviceSynchronize(); });
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported,
                   [&] { return cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost); });
    invalidated_by(a, cudaStreamCaptureModeThreadLocal, cudaErrorStreamCaptureUnsupported, [&] { return cudaMalloc(&p, 16); });
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(y); });
#ifdef CUDASIM /* the simulator's own refusals (CUDA captures memory nodes) */
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported, [&] { return cudaMallocAsync(&p, 16, a); });
    invalidated_by(a, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamDestroy(a); });
#endif
    cudaEventRecord(outside, b); /* plain execution: a capture may not wait on it */
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureIsolation, [&] { return cudaStreamWaitEvent(a, outside, 0); });
    /* a stream of another capture waits on an event of this one: the captures would merge (both
     * invalidated; b's capture is relaxed, so the helper's allocations stay legal) */
    cudaGraph_t g;
    cudaEvent_t e;
    cudaEventCreate(&e);
    assert_int_equal(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    invalidated_by(a, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureMerge, [&] {
        cudaEventRecord(e, a);
        return cudaStreamWaitEvent(b, e, 0);
    });
    assert_int_equal(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    cudaEventDestroy(e);
    /* relaxed: allocation is allowed during the capture, and so it is for a thread in relaxed mode */
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, 16), cudaSuccess);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaSuccess);
    cudaGraphDestroy(g);
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    assert_int_equal(cudaThreadExchangeStreamCaptureMode(&m), cudaSuccess);
    assert_int_equal(m, cudaStreamCaptureModeGlobal);
    assert_int_equal(cudaMalloc(&p, 16), cudaSuccess);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudaThreadExchangeStreamCaptureMode(&m), cudaSuccess);
    /* another thread (in global mode): refused under a global capture, which is invalidated
     * (and may be ended from any thread); free under a thread-local one, which only its own
     * thread may end */
    cudaError_t other = cudaSuccess;
    std::thread([&] { other = cudaMalloc(&p, 16); }).join();
    assert_int_equal(other, cudaErrorStreamCaptureUnsupported);
    std::thread([&] { other = cudaStreamEndCapture(a, &g); }).join();
    assert_int_equal(other, cudaErrorStreamCaptureInvalidated);
    assert_int_equal(status_of(a), cudaStreamCaptureStatusNone);
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    std::thread([&] {
        other = cudaMalloc(&p, 16);
        if (other == cudaSuccess) other = cudaFree(p);
        if (other == cudaSuccess) other = cudaStreamEndCapture(a, &g);
    }).join();
    assert_int_equal(other, cudaErrorStreamCaptureWrongThread);
    assert_int_equal(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaErrorIllegalState);
    assert_int_equal(cudaStreamEndCapture(a, &g), cudaSuccess);
    cudaGraphDestroy(g);
    /* the legacy default stream cannot capture */
    assert_int_equal(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    cudaEventDestroy(outside);
    cudaStreamDestroy(a); cudaStreamDestroy(b);
    cudaFree(y);
}

/* cudaGraphExecUpdate takes new arguments for the same kernels, refuses another function; a graph
 * launched in a capture becomes one node. */
static void test_exec_update_and_child_graph(void **state) {
    (void)state;
    need_gpu();
    cudaStream_t a = new_stream();
    float *y = dev_f32(N), *z = dev_f32(N);
    cudaGraph_t g1, g2, g3, outer;
    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    MB_LAUNCH(k_add, 1, 32, 0, a)(y, 1.0f, N);
    assert_int_equal(cudaStreamEndCapture(a, &g1), cudaSuccess);
    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    MB_LAUNCH(k_add, 2, 32, 0, a)(z, 5.0f, N);
    assert_int_equal(cudaStreamEndCapture(a, &g2), cudaSuccess);
    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    MB_LAUNCH(k_set, 1, 32, 0, a)(z, 5.0f, N);
    assert_int_equal(cudaStreamEndCapture(a, &g3), cudaSuccess);
    cudaGraphExec_t x = instantiate(g1);
    cudaGraphExecUpdateResultInfo info;
    assert_int_equal(cudaGraphExecUpdate(x, g2, &info), cudaSuccess);
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    assert_int_equal(cudaGraphExecUpdate(x, g3, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorUnsupportedFunctionChange);
    cudaGetLastError();
    cudaGraphLaunch(x, a); /* g2's arguments: z += 5 */
    cudaStreamSynchronize(a);
    assert_true(get1(y, 3) == 0.0f && get1(z, 3) == 5.0f);
    /* the exec launched inside a capture: one node, which replays it */
    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    assert_int_equal(cudaGraphLaunch(x, a), cudaSuccess);
    MB_LAUNCH(k_add, 1, 32, 0, a)(z, 1.0f, N);
    assert_int_equal(cudaStreamEndCapture(a, &outer), cudaSuccess);
    size_t nodes = 0;
    cudaGraphGetNodes(outer, NULL, &nodes);
    assert_int_equal(nodes, 2);
    cudaGraphExec_t xo = instantiate(outer);
#ifdef CUDASIM
    cudasim::reset_stats();
#endif
    cudaGraphLaunch(xo, a);
    cudaStreamSynchronize(a);
    assert_true(get1(z, 3) == 11.0f);
#ifdef CUDASIM
    assert_int_equal(cudasim::get_stats().graph_launches, 2);
    assert_int_equal(cudasim::get_stats().launches, 2);
#endif
    cudaGraphExecDestroy(x); cudaGraphExecDestroy(xo);
    cudaGraphDestroy(g1); cudaGraphDestroy(g2); cudaGraphDestroy(g3); cudaGraphDestroy(outer);
    cudaStreamDestroy(a);
    cudaFree(y); cudaFree(z);
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
        st[i] = new_stream();
        cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
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
            cudaGraph_t g;
            assert_int_equal(cudaStreamEndCapture(st[0], &g), cudaSuccess);
            cudaGraphExec_t x = instantiate(g);
            cudaGraphDestroy(g);
            assert_int_equal(cudaGraphLaunch(x, st[1]), cudaSuccess); /* any stream */
            cudaStreamSynchronize(st[1]);
            cudaGraphExecDestroy(x);
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
    for (int i = 0; i < S; i++) { cudaEventDestroy(ev[i]); cudaStreamDestroy(st[i]); }
    for (int b = 0; b < NB; b++) cudaFree(buf[b]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_records_not_runs), cmocka_unit_test(test_fork_join),
        cmocka_unit_test(test_illegal_during_capture),   cmocka_unit_test(test_exec_update_and_child_graph),
        cmocka_unit_test(test_random_program_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
