/* Planted faults the simulator must report (tests/cudasim/neg.sh checks each):  neg CASE
 *   ok          the same work with every sync in place                     (clean everywhere)
 *   streams     stream 1 reads what stream 0 writes, no event               (TSan: data race)
 *   early_read  a kernel reads device memory before its copy completed      (TSan: data race)
 *   nobarrier   a block sum missing the __syncthreads after the store       (TSan: data race)
 *   oob         a kernel writes one float past a cudaMalloc'd buffer        (ASan: heap-buffer-overflow)
 *   divergent   __syncthreads on one side of a branch only                  (reported error)
 *   smem        a block asks for more shared memory than the device has     (cudaErrorInvalidValue)
 *   hostptr     a kernel's pointer argument points at malloc'ed memory      (reported, sticky fault)
 *   hoststruct  the same inside a struct argument that declares its pointers (reported, sticky fault)
 *   backlog     the host rewrites pinned memory that a copy it queued behind a long kernel has
 *               yet to read (the stream takes the copy after the write)   (TSan: data race)
 *   finished    stream 1's kernel reads what stream 0's kernel (run without fibers) wrote 20 ms
 *               before, no event                                          (TSan: data race)
 *   unjoined    a capture forks a stream and does not join it back          (reported error)
 * The planted faults in the library itself are tests/cudasim/plant.sh's (neg.sh runs both).
 */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"

__global__ void fill(float *y, float v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = v;
}
__global__ void scale2(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = 2 * x[i];
}
__global__ void block_sum(const float *x, float *out, int planted) {
    __shared__ float sh[256];
    sh[threadIdx.x] = x[threadIdx.x];
    if (!planted) __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}
__global__ void divergent(float *y) {
    if (threadIdx.x < 16) {
        y[threadIdx.x] = 1;
        __syncthreads(); /* the other half never comes here */
        y[threadIdx.x] += y[threadIdx.x + 16];
    }
    __syncthreads();
}
// snippet: arg-pointers
struct two_ptrs { /* a kernel argument with pointers inside */
    const float *x;
    float *y;
    int n;
};
#ifdef CUDASIM /* the simulator checks these at each launch, as it checks pointer arguments */
CUDASIM_ARG_POINTERS(two_ptrs, a, v) {
    v(a.x, "x");
    v(a.y, "y");
}
#endif
// end snippet
__global__ void scale2_args(two_ptrs a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += gridDim.x * blockDim.x) a.y[i] = 2 * a.x[i];
}
__global__ void spin(float *y, long long cycles) { /* a long kernel: the stream's backlog */
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    y[0] = 1;
}
__global__ void dyn(float *y) {
    MB_DYNAMIC_SHARED(float, sh);
    sh[threadIdx.x] = 1;
    y[threadIdx.x] = sh[threadIdx.x];
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "ok";
    int ok = !strcmp(c, "ok");
    const size_t n = 1 << 16;
    cudaStream_t s0, s1;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    float *d, *d2, *pin;
    cudaMalloc((void **)&d, n * 4);
    cudaMalloc((void **)&d2, n * 4);
    cudaMallocHost((void **)&pin, n * 4);
    if (ok || !strcmp(c, "streams")) {
        MB_LAUNCH(fill, 64, 256, 0, s0)(d, 5.0f, n);
        if (ok) { cudaEventRecord(e, s0); cudaStreamWaitEvent(s1, e, 0); }
        MB_LAUNCH(scale2, 64, 256, 0, s1)(d2, d, n);
        cudaMemcpyAsync(pin, d2, n * 4, cudaMemcpyDeviceToHost, s1);
        cudaStreamSynchronize(s1);
        printf("streams: %g (want 10)\n", pin[0]);
    }
    if (ok || !strcmp(c, "early_read")) {
        for (size_t i = 0; i < n; i++) pin[i] = 3.0f;
        cudaMemcpyAsync(d, pin, n * 4, cudaMemcpyHostToDevice, s0);
        if (ok) { cudaEventRecord(e, s0); cudaStreamWaitEvent(s1, e, 0); }
        MB_LAUNCH(scale2, 64, 256, 0, s1)(d2, d, n);
        cudaDeviceSynchronize();
    }
    if (ok || !strcmp(c, "nobarrier")) {
        for (int i = 0; i < 256; i++) pin[i] = 1.0f;
        cudaMemcpyAsync(d, pin, 256 * 4, cudaMemcpyHostToDevice, s0);
        MB_LAUNCH(block_sum, 1, 256, 0, s0)(d, d2, !ok);
        cudaMemcpyAsync(pin, d2, 4, cudaMemcpyDeviceToHost, s0);
        cudaStreamSynchronize(s0);
        printf("block sum of 256 ones: %g\n", pin[0]);
    }
    if (ok || !strcmp(c, "oob")) {
        MB_LAUNCH(fill, 1, 256, 0, s0)(d, 1.0f, ok ? n : n + 1);
        cudaStreamSynchronize(s0);
    }
    if (!strcmp(c, "divergent")) {
        MB_LAUNCH(divergent, 1, 32, 0, s0)(d);
        cudaStreamSynchronize(s0);
    }
    if (ok || !strcmp(c, "hostptr") || !strcmp(c, "hoststruct")) {
        float *host = (float *)malloc(256 * 4);
        for (int i = 0; i < 256; i++) host[i] = 1;
        const float *x = ok ? d : host;
        if (ok || !strcmp(c, "hoststruct")) MB_LAUNCH(scale2_args, 1, 256, 0, s0)(two_ptrs{x, d2, 256});
        if (ok || !strcmp(c, "hostptr")) MB_LAUNCH(scale2, 1, 256, 0, s0)(d2, x, 256);
        printf("hostptr: %s\n", cudaGetErrorName(cudaStreamSynchronize(s0)));
        free(host);
    }
    if (ok || !strcmp(c, "backlog")) {
        MB_LAUNCH(spin, 1, 1, 0, s0)(d2, 200000000LL); /* ~0.1 s */
        cudaMemcpyAsync(d, pin, 256 * 4, cudaMemcpyHostToDevice, s0);
        if (ok) cudaStreamSynchronize(s0);
        for (int i = 0; i < 256; i++) pin[i] = 4.0f; /* the copy has not read pin yet */
        cudaStreamSynchronize(s0);
    }
    if (ok || !strcmp(c, "finished")) {
        MB_LAUNCH(fill, 64, 256, 0, s0)(d, 5.0f, n); /* reaches no barrier: later launches run without fibers */
        cudaStreamSynchronize(s0);
        MB_LAUNCH(fill, 64, 256, 0, s0)(d, 6.0f, n);
        usleep(20000); /* stream 0's kernel is long done, but nothing orders stream 1 after it */
        if (ok) { cudaEventRecord(e, s0); cudaStreamWaitEvent(s1, e, 0); }
        MB_LAUNCH(scale2, 64, 256, 0, s1)(d2, d, n);
        cudaDeviceSynchronize();
    }
    if (ok || !strcmp(c, "unjoined")) {
        cudaGraph_t g = NULL;
        cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal);
        MB_LAUNCH(fill, 1, 256, 0, s0)(d, 1.0f, 256);
        cudaEventRecord(e, s0);
        cudaStreamWaitEvent(s1, e, 0); /* s1 joins the capture */
        MB_LAUNCH(scale2, 1, 256, 0, s1)(d2, d, 256);
        if (ok) { cudaEventRecord(e, s1); cudaStreamWaitEvent(s0, e, 0); }
        printf("capture: %s\n", cudaGetErrorName(cudaStreamEndCapture(s0, &g)));
        if (g) cudaGraphDestroy(g);
    }
    if (ok || !strcmp(c, "smem")) {
        MB_LAUNCH(dyn, 1, 32, ok ? 32 * 4 : 64 << 10, s0)(d);
        printf("launch with %d bytes of shared memory: %s\n", ok ? 128 : 64 << 10, cudaGetErrorName(cudaGetLastError()));
    }
    cudaError_t r = cudaDeviceSynchronize();
    printf("%s: %s\n", c, cudaGetErrorName(r));
    cudaFree(d); cudaFree(d2); cudaFreeHost(pin);
    cudaEventDestroy(e); cudaStreamDestroy(s0); cudaStreamDestroy(s1);
    return 0;
}
