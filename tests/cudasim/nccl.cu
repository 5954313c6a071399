/* The simulator's NCCL (tests/cudasim/cudasim_nccl.h) itself, under mpirun -np N (N >= 2; run by
 * tests/cudasim/mpi.sh as build/sim-mpi/nccl): the argument errors, ids that differ across ranks
 * refused on every rank, out-of-place sum and max, stream order (a kernel queued before the
 * all-reduce is reduced), the counter. Prints "nccl: rank R: N checks failed"; exit 1 on a failure. */
#define OMPI_SKIP_MPICXX 1 /* the C API only (OpenMPI's C++ bindings do not build with -Werror) */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>

static int failed;
#define CHECK(c) ((c) ? (void)0 : (void)(failed++, fprintf(stderr, "nccl.cu:%d: %s\n", __LINE__, #c)))

__global__ void fill(float *x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

int main(int argc, char **argv) {
    int provided = 0, rank = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclComm_t c = nullptr;
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(nullptr) == ncclInvalidArgument);
    CHECK(ncclGetUniqueId(&id) == ncclSuccess); /* each rank its own: refused */
    CHECK(ncclCommInitRank(&c, size, id, rank) == ncclInvalidUsage && c == nullptr);
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(ncclCommInitRank(&c, size + 1, id, rank) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&c, size, id, size) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&c, size, id, rank) == ncclSuccess && c != nullptr);
    const int n = 1000;
    float *a = nullptr, *b = nullptr, h[n], host[4] = {0};
    cudaStream_t st;
    CHECK(cudaMalloc(&a, n * sizeof(float)) == cudaSuccess && cudaMalloc(&b, n * sizeof(float)) == cudaSuccess);
    CHECK(cudaStreamCreate(&st) == cudaSuccess);
    CHECK(ncclAllReduce(host, host, 4, ncclFloat, ncclSum, c, st) == ncclInvalidArgument); /* not device memory */
    CHECK(ncclAllReduce(a, a, n, ncclFloat16, ncclSum, c, st) == ncclInvalidArgument);   /* not implemented */
    CHECK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, nullptr, st) == ncclInvalidArgument);
    MB_LAUNCH(fill, (n + 255) / 256, 256, 0, st)(a, (float)(rank + 1), n); /* queued: the all-reduce waits for it */
    CHECK(ncclAllReduce(a, b, n, ncclFloat, ncclSum, c, st) == ncclSuccess);
    CHECK(cudaMemcpyAsync(h, b, sizeof h, cudaMemcpyDeviceToHost, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess);
    for (int i = 0; i < n; i++) CHECK(h[i] == (float)(size * (size + 1) / 2));
    CHECK(ncclAllReduce(a, a, n, ncclFloat, ncclMax, c, st) == ncclSuccess);
    CHECK(cudaMemcpy(h, a, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 0; i < n; i++) CHECK(h[i] == (float)size);
    CHECK(cudasim::get_stats().nccl_allreduces == 2);
    CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)") == 0);
    CHECK(ncclCommDestroy(c) == ncclSuccess && ncclCommDestroy(nullptr) == ncclInvalidArgument);
    cudaFree(a); cudaFree(b); cudaStreamDestroy(st);
    printf("nccl: rank %d: %d checks failed\n", rank, failed);
    MPI_Finalize();
    return failed != 0;
}
