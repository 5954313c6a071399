/* Self-tests of the CPU executor (tests/cudasim/cudasim.h): it is a test oracle, so each
 * feature is checked against what a GPU does. Runs only under the simulator (make sim-test). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "testutil.h"

static float *dev_f32(size_t n) {
    float *p = NULL;
    assert_int_equal(cudaMalloc((void **)&p, n * sizeof(float)), cudaSuccess);
    return p;
}

__global__ void k_block_reverse(const float *x, float *y) {
    __shared__ float sh[256];
    sh[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    y[blockIdx.x * 256 + threadIdx.x] = sh[255 - threadIdx.x];
}

__global__ void k_sync_preds(int *out) {
    int t = (int)threadIdx.x;
    int r0 = __syncthreads_or(t == 77), r1 = __syncthreads_and(t >= 0), r2 = __syncthreads_and(t != 5);
    int r3 = __syncthreads_count(t % 3 == 0);
    if (t == 0) { out[0] = r0; out[1] = r1; out[2] = r2; out[3] = r3; }
}

__global__ void k_warp(const int *x, int *out) {
    unsigned l = threadIdx.x;
    int v = x[l];
    int s = v;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o); /* butterfly sum */
    int d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o); /* tree sum in lane 0 */
    int up = __shfl_up_sync(0xffffffffu, v, 1);
    int b0 = __shfl_sync(0xffffffffu, v, 3);
    unsigned bal = __ballot_sync(0xffffffffu, v % 2);
    int any = __any_sync(0xffffffffu, v == 5), all = __all_sync(0xffffffffu, v >= 0);
    int w8 = __shfl_sync(0xffffffffu, v, 0, 8); /* width 8: lane 0 of each group of 8 */
    out[l * 8 + 0] = s; out[l * 8 + 1] = d; out[l * 8 + 2] = up; out[l * 8 + 3] = b0;
    out[l * 8 + 4] = (int)bal; out[l * 8 + 5] = any; out[l * 8 + 6] = all; out[l * 8 + 7] = w8;
}

__global__ void k_atomics(int *ci, float *cf, unsigned *mx) {
    atomicAdd(ci, 1);
    atomicAdd(cf, 0.5f);
    atomicMax(mx, blockIdx.x * blockDim.x + threadIdx.x);
}

__global__ void k_dyn(float *y, int n) {
    MB_DYNAMIC_SHARED(float, sh);
    for (int i = threadIdx.x; i < n; i += blockDim.x) sh[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < n; i++) s += sh[i];
        *y = __ldg(&s);
    }
}

/* 16x16x16 half x half -> f32 on tensor cores (wmma), with an element-wise scale in between */
__global__ void k_wmma(const __half *a, const __half *b, float *c) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= 2.0f;
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

/* ldmatrix and mma.m16n8k16 (cudasim_mma.h) as the PTX ISA lays them out: A (16 x 16 bf16,
 * row-major) and B (8 columns of 16 k, each contiguous) staged in dynamic shared memory (the
 * only kind the simulator's ldmatrix takes, as the kernels use), loaded by ldmatrix with the
 * addresses the ISA names (lane l: row l%8 of matrix l/8), multiplied onto D = 1; out: D by its
 * documented positions (lane l: rows l/4, l/4+8, columns 2(l%4), +1), and each lane's A
 * registers as loaded. */
__global__ void k_mma(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *d, unsigned *regs) {
    MB_DYNAMIC_SHARED(__nv_bfloat16, sa); /* A, then B: 768 bytes */
    __nv_bfloat16 *sb = sa + 256;
    const int l = (int)threadIdx.x, g = l / 4, t = l % 4;
    for (int i = l; i < 256; i += 32) sa[i] = a[i];
    for (int i = l; i < 128; i += 32) sb[i] = b[i];
    __syncwarp();
    unsigned ra[4], rb[2];
    mb__ldsm4(ra, sa + (l % 8 + 8 * (l / 8 % 2)) * 16 + 8 * (l / 16));
    mb__ldsm2(rb, sb + (l % 8) * 16 + 8 * (l / 8 % 2));
    mb__gtile acc;
    mb__gfill(acc, 1.0f);
    mb__mma<__nv_bfloat16>(acc, ra, rb);
    for (int e = 0; e < 4; e++) d[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = acc.x[e];
    for (int i = 0; i < 4; i++) regs[l * 4 + i] = ra[i];
}

__global__ void k_nop(float *y) {
    if (y) y[0] = 1.0f;
}

static void test_barrier_and_shared(void **state) {
    (void)state;
    const int blocks = 3;
    float h[blocks * 256], g[blocks * 256];
    for (int i = 0; i < blocks * 256; i++) h[i] = (float)i;
    float *x = dev_f32(blocks * 256), *y = dev_f32(blocks * 256);
    assert_int_equal(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    MB_LAUNCH(k_block_reverse, blocks, 256, 0, 0)(x, y);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMemcpy(g, y, sizeof g, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < 256; t++) assert_true(g[b * 256 + t] == h[b * 256 + 255 - t]);
    int *o = NULL, ho[4];
    assert_int_equal(cudaMalloc((void **)&o, sizeof ho), cudaSuccess);
    MB_LAUNCH(k_sync_preds, 1, 128, 0, 0)(o);
    assert_int_equal(cudaMemcpy(ho, o, sizeof ho, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(ho[0], 1);
    assert_int_equal(ho[1], 1);
    assert_int_equal(ho[2], 0);
    assert_int_equal(ho[3], 43); /* 0, 3, ..., 126 */
    cudaFree(x); cudaFree(y); cudaFree(o);
}

static void test_warp_intrinsics(void **state) {
    (void)state;
    int hx[32], ho[32 * 8], *x = NULL, *o = NULL, sum = 0;
    unsigned odd = 0;
    for (int i = 0; i < 32; i++) {
        hx[i] = (i * 7 + 3) % 11;
        sum += hx[i];
        if (hx[i] % 2) odd |= 1u << i;
    }
    cudaMalloc((void **)&x, sizeof hx);
    cudaMalloc((void **)&o, sizeof ho);
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    MB_LAUNCH(k_warp, 1, 32, 0, 0)(x, o);
    assert_int_equal(cudaMemcpy(ho, o, sizeof ho, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int l = 0; l < 32; l++) {
        assert_int_equal(ho[l * 8 + 0], sum);
        if (l == 0) assert_int_equal(ho[1], sum);
        assert_int_equal(ho[l * 8 + 2], l == 0 ? hx[0] : hx[l - 1]);
        assert_int_equal(ho[l * 8 + 3], hx[3]);
        assert_int_equal((unsigned)ho[l * 8 + 4], odd);
        assert_int_equal(ho[l * 8 + 5], 1);
        assert_int_equal(ho[l * 8 + 6], 1);
        assert_int_equal(ho[l * 8 + 7], hx[l / 8 * 8]);
    }
    cudaFree(x); cudaFree(o);
}

static void test_atomics_dynamic_shared(void **state) {
    (void)state;
    int *ci = NULL, hci;
    float *cf = dev_f32(1), hcf, *y = dev_f32(1), hy;
    unsigned *mx = NULL, hmx;
    cudaMalloc((void **)&ci, 4);
    cudaMalloc((void **)&mx, 4);
    cudaMemset(ci, 0, 4); cudaMemset(cf, 0, 4); cudaMemset(mx, 0, 4);
    MB_LAUNCH(k_atomics, 7, 96, 0, 0)(ci, cf, mx);
    cudaMemcpy(&hci, ci, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hcf, cf, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hmx, mx, 4, cudaMemcpyDeviceToHost);
    assert_int_equal(hci, 7 * 96);
    assert_true(hcf == 7 * 96 * 0.5f);
    assert_int_equal(hmx, 7 * 96 - 1);
    /* dynamic shared memory: 48 KB without opting in, up to 227 KB with it */
    MB_LAUNCH(k_dyn, 1, 128, 1000 * sizeof(float), 0)(y, 1000);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaMemcpy(&hy, y, 4, cudaMemcpyDeviceToHost);
    assert_true(hy == 999.0f * 1000.0f / 2.0f);
    MB_LAUNCH(k_dyn, 1, 128, 100 << 10, 0)(y, 1000);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute((const void *)k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10),
                     cudaSuccess);
    MB_LAUNCH(k_dyn, 1, 128, 100 << 10, 0)(y, 25600);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    MB_LAUNCH(k_dyn, 1, 128, (227 << 10) + 4, 0)(y, 10);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute((const void *)k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(ci); cudaFree(cf); cudaFree(mx); cudaFree(y);
}

/* cp.async: before the issuing thread's wait the destination holds its old bytes, after the
 * wait (and a barrier, for another thread's copy) the source's. */
__global__ void k_pipeline(const float *x, float *y) {
    MB_DYNAMIC_SHARED(float, sh);
    int t = (int)threadIdx.x;
    sh[t] = -1.0f;
    __syncthreads();
    __pipeline_memcpy_async(&sh[t], &x[t], 4);
    __pipeline_commit();
    y[t] = sh[t]; /* not yet waited for: the simulator gives the old value */
    __pipeline_wait_prior(0);
    __syncthreads();
    y[32 + t] = sh[31 - t];
}

/* A cluster of 4 blocks: each writes its shared memory, cluster.sync, then reads the next
 * block's through map_shared_rank; the last cluster.sync keeps it alive until all have read. */
__global__ void k_cluster(float *y) {
    namespace cg = cooperative_groups;
    MB_DYNAMIC_SHARED(float, sh);
    cg::cluster_group cl = cg::this_cluster();
    unsigned r = cl.block_rank(), n = cl.num_blocks();
    sh[threadIdx.x] = (float)(100 * r + threadIdx.x);
    __syncthreads();
    cl.sync();
    const float *next = cl.map_shared_rank(sh, (int)((r + 1) % n));
    y[blockIdx.x * blockDim.x + threadIdx.x] = next[blockDim.x - 1 - threadIdx.x] + (float)(r == blockIdx.x % n);
    cl.sync();
}

static void test_pipeline_and_clusters(void **state) {
    (void)state;
    float hx[32], hy[256], *x = dev_f32(32), *y = dev_f32(256);
    for (int i = 0; i < 32; i++) hx[i] = (float)i;
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    MB_LAUNCH(k_pipeline, 1, 32, 32 * sizeof(float), 0)(x, y);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaMemcpy(hy, y, 64 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 32; i++) assert_true(hy[i] == -1.0f && hy[32 + i] == (float)(31 - i));
    MB_LAUNCH_CLUSTER(k_cluster, 8, 32, 32 * sizeof(float), 0, 4)(y);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaMemcpy(hy, y, 256 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int b = 0; b < 8; b++)
        for (int t = 0; t < 32; t++) assert_true(hy[b * 32 + t] == (float)(100 * ((b % 4 + 1) % 4) + 31 - t) + 1.0f);
    /* a launch without clusters: every block a cluster of one */
    MB_LAUNCH(k_cluster, 2, 32, 32 * sizeof(float), 0)(y);
    cudaMemcpy(hy, y, 64 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) assert_true(hy[t] == (float)(31 - t % 32) + 1.0f);
    /* a cluster that does not divide the grid, or of more than 8 blocks */
    MB_LAUNCH_CLUSTER(k_cluster, 6, 32, 128, 0, 4)(y);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidClusterSize);
    MB_LAUNCH_CLUSTER(k_cluster, 16, 32, 128, 0, 16)(y);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidClusterSize);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(x); cudaFree(y);
}

static void test_wmma(void **state) {
    (void)state;
    __half ha[256], hb[256];
    float ref[256], got[256];
    for (int i = 0; i < 256; i++) {
        ha[i] = __float2half((float)(i % 7 - 3) / 4.0f);
        hb[i] = __float2half((float)(i % 5 - 2) / 2.0f);
    }
    for (int i = 0; i < 16; i++) /* b is column-major: b(k, j) = hb[j * 16 + k] */
        for (int j = 0; j < 16; j++) {
            float acc = 1.0f;
            for (int k = 0; k < 16; k++) acc += __half2float(ha[i * 16 + k]) * __half2float(hb[j * 16 + k]);
            ref[i * 16 + j] = 2.0f * acc;
        }
    __half *a = NULL, *b = NULL;
    float *c = dev_f32(256);
    cudaMalloc((void **)&a, sizeof ha);
    cudaMalloc((void **)&b, sizeof hb);
    cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice);
    MB_LAUNCH(k_wmma, 1, 32, 0, 0)(a, b, c);
    assert_int_equal(cudaMemcpy(got, c, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(got, ref, sizeof ref); /* small dyadic values: exact in any order */
    cudaFree(a); cudaFree(b); cudaFree(c);
}

static void test_ldmatrix_mma(void **state) {
    (void)state;
    __nv_bfloat16 ha[256], hb[128];
    float ref[128], got[128];
    unsigned regs[128];
    for (int i = 0; i < 256; i++) ha[i] = __float2bfloat16((float)(i % 7 - 3) / 4.0f);
    for (int i = 0; i < 128; i++) hb[i] = __float2bfloat16((float)(i % 5 - 2) / 2.0f);
    for (int m = 0; m < 16; m++) /* b(k, n) = hb[n * 16 + k] */
        for (int n = 0; n < 8; n++) {
            float acc = 1.0f;
            for (int k = 0; k < 16; k++) acc += __bfloat162float(ha[m * 16 + k]) * __bfloat162float(hb[n * 16 + k]);
            ref[m * 8 + n] = acc;
        }
    __nv_bfloat16 *a = NULL, *b = NULL;
    float *d = dev_f32(128);
    unsigned *r = NULL;
    cudaMalloc((void **)&a, sizeof ha);
    cudaMalloc((void **)&b, sizeof hb);
    cudaMalloc((void **)&r, sizeof regs);
    cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice);
    MB_LAUNCH(k_mma, 1, 32, 768, 0)(a, b, d, r);
    assert_int_equal(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(regs, r, sizeof regs, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(got, ref, sizeof ref); /* small dyadic values: exact in any order */
    for (int l = 0; l < 32; l++) /* register i: A rows l/4 (+8 for i odd), columns 2(l%4) (+8 for i >= 2), low half first */
        for (int i = 0; i < 4; i++) {
            const __nv_bfloat16 *e = ha + (l / 4 + 8 * (i % 2)) * 16 + 2 * (l % 4) + 8 * (i / 2);
            unsigned lo, hi;
            memcpy(&lo, &e[0], 2), memcpy(&hi, &e[1], 2);
            assert_int_equal(regs[l * 4 + i], (lo & 0xffffu) | (hi & 0xffffu) << 16);
        }
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(r);
}

static void test_launch_limits(void **state) {
    (void)state;
    MB_LAUNCH(k_nop, 1, 1025, 0, 0)(nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* not sticky */
    MB_LAUNCH(k_nop, 1, dim3(1, 1, 65), 0, 0)(nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MB_LAUNCH(k_nop, dim3(1, 65536), 1, 0, 0)(nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MB_LAUNCH(k_nop, 0, 32, 0, 0)(nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MB_LAUNCH(k_nop, dim3(70000), dim3(32, 32), 0, 0)(nullptr); /* legal: 2^31-1 blocks in x */
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    assert_int_equal(p.maxThreadsPerBlock, 1024);
    assert_int_equal(p.sharedMemPerBlock, 48 << 10);
    assert_int_equal(p.sharedMemPerBlockOptin, 227 << 10);
    assert_int_equal(p.major * 10 + p.minor, 90);
}

/* Streams run in order on their own threads; an event orders two streams; counters count. */
static void test_streams_events_counters(void **state) {
    (void)state;
    const size_t n = 1 << 16;
    cudaStream_t a, b;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    float *d = dev_f32(n), *pin = NULL;
    cudaMallocHost((void **)&pin, n * sizeof(float));
    for (size_t i = 0; i < n; i++) pin[i] = (float)i;
    cudasim::reset_stats();
    assert_int_equal(cudaMemcpyAsync(d, pin, n * sizeof(float), cudaMemcpyHostToDevice, a), cudaSuccess);
    assert_int_equal(cudaEventRecord(e, a), cudaSuccess);
    assert_int_equal(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
    MB_LAUNCH(k_nop, 1, 1, 0, b)(d);
    assert_int_equal(cudaMemcpyAsync(pin, d, n * sizeof(float), cudaMemcpyDeviceToHost, b), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(b), cudaSuccess);
    assert_true(pin[0] == 1.0f && pin[n - 1] == (float)(n - 1));
    assert_int_equal(cudaEventQuery(e), cudaSuccess);
    cudasim::stats s = cudasim::get_stats();
    assert_int_equal(s.launches, 1);
    assert_int_equal(s.bytes_h2d, n * sizeof(float));
    assert_int_equal(s.bytes_d2h, n * sizeof(float));
    assert_int_equal(s.host_syncs, 1);
    cudaEventDestroy(e); cudaStreamDestroy(a); cudaStreamDestroy(b);
    cudaFree(d); cudaFreeHost(pin);
}

/* cuBLAS honours the handle's math mode: TF32 rounds the inputs to 10 mantissa bits. */
static void test_cublas_math_mode(void **state) {
    (void)state;
    float ha = 1.0f + 1.0f / 4096.0f, hb = 1.0f, hc = 0, alpha = 1, beta = 0;
    float *a = dev_f32(1), *b = dev_f32(1), *c = dev_f32(1);
    cudaMemcpy(a, &ha, 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, &hb, 4, cudaMemcpyHostToDevice);
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cudasim::reset_stats();
    for (int mode = 0; mode < 2; mode++) {
        cublasSetMathMode(h, mode ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
        assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, a, CUDA_R_32F, 1, b, CUDA_R_32F, 1,
                                      &beta, c, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_SUCCESS);
        cudaMemcpy(&hc, c, 4, cudaMemcpyDeviceToHost);
        assert_true(hc == (mode ? 1.0f : ha));
    }
    assert_int_equal(cudasim::get_stats().cublas_calls, 2);
    /* an operand outside device memory is refused, as cuBLAS would fault on it */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, a, CUDA_R_32F, 0, b, CUDA_R_32F, 1,
                                  &beta, c, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    cublasDestroy(h);
    cudaFree(a); cudaFree(b); cudaFree(c);
}

/* Device memory: CUDASIM_MEM-sized, garbage on allocation, injected faults. */
static void test_memory_and_faults(void **state) {
    (void)state;
    size_t fr, tot;
    assert_int_equal(cudaMemGetInfo(&fr, &tot), cudaSuccess);
    float *d = dev_f32(4), h[4];
    size_t fr2;
    cudaMemGetInfo(&fr2, &tot);
    assert_int_equal(fr - fr2, 16);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    assert_true(isnan(h[0])); /* unwritten device memory reads as NaN */
    void *x = NULL;
    assert_int_equal(cudaMalloc(&x, tot), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    cudasim::fail_alloc(2);
    assert_int_equal(cudaMalloc(&x, 8), cudaSuccess);
    cudaFree(x);
    assert_int_equal(cudaMalloc(&x, 8), cudaErrorMemoryAllocation);
    assert_int_equal(cudaMalloc(&x, 8), cudaSuccess);
    cudaFree(x);
    cudaGetLastError();
    cudaFree(d);
}

/* Last: an injected launch fault poisons the context for good. */
static void test_sticky_fault(void **state) {
    (void)state;
    cudasim::fault_launch(1);
    MB_LAUNCH(k_nop, 1, 1, 0, 0)(nullptr);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
    void *x = NULL;
    assert_int_equal(cudaMalloc(&x, 8), cudaErrorIllegalAddress);
    MB_LAUNCH(k_nop, 1, 1, 0, 0)(nullptr);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barrier_and_shared),     cmocka_unit_test(test_warp_intrinsics),
        cmocka_unit_test(test_atomics_dynamic_shared), cmocka_unit_test(test_wmma), cmocka_unit_test(test_ldmatrix_mma),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_streams_events_counters), cmocka_unit_test(test_cublas_math_mode),
        cmocka_unit_test(test_pipeline_and_clusters),  cmocka_unit_test(test_memory_and_faults),
        cmocka_unit_test(test_sticky_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
