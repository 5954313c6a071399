/* cudasim_nccl.h - the NCCL calls megabatch makes ("cuda dist" in megabatch_cuda.cuh), over MPI,
 * for the simulator. Included by cudasim.h's implementation when MEGABATCH_NCCL is defined (the
 * build adds MPI's include and link flags). Declarations and types: NVIDIA's nccl.h.
 *
 * One process = one rank = one simulated device, whose "device memory" is host memory, so a
 * collective is an MPI collective on the calling (host) thread: MPI stays on the main thread
 * (the library initialises MPI with MPI_THREAD_FUNNELED). ncclAllReduce first waits for the
 * work queued earlier on its stream, reduces, and returns with the result in place: stronger
 * ordering than a GPU, where the call only enqueues (a missing wait on the result cannot show
 * here; docs/GPU.md). A communicator is an MPI_Comm_dup of MPI_COMM_WORLD: nranks and rank
 * must be the world's (the only communicator megabatch makes), and every rank must pass the
 * same ncclUniqueId (checked: a missing broadcast of rank 0's id fails as ncclInvalidUsage).
 */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1 /* OpenMPI's C++ bindings do not build with -Werror; the C API is all we use */
#endif
#include <mpi.h>
#include <nccl.h>
#include <fcntl.h>

struct ncclComm {
    MPI_Comm comm;
    int rank, nranks;
};

namespace cudasim {
static ncclResult_t nccl_err(ncclResult_t e, const char *call, const char *why) {
    fprintf(stderr, "cudasim: %s: %s\n", call, why); /* what NCCL_DEBUG=WARN would say */
    return e;
}
static MPI_Datatype nccl_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt32: return MPI_INT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL; /* the 8- and 16-bit types: not used by megabatch */
    }
}
static MPI_Op nccl_op(ncclRedOp_t op) {
    switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_OP_NULL; /* ncclAvg and custom ops: not used by megabatch */
    }
}
} // namespace cudasim

extern "C" {
const char *ncclGetErrorString(ncclResult_t e) { /* NCCL's own strings */
    switch (e) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* Random bytes: ranks that did not receive rank 0's id hold a different one. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return nccl_err(ncclInvalidArgument, "ncclGetUniqueId", "uniqueId is NULL");
    int fd = open("/dev/urandom", O_RDONLY);
    ssize_t got = fd < 0 ? -1 : read(fd, id->internal, sizeof id->internal);
    if (fd >= 0) close(fd);
    if (got != (ssize_t)sizeof id->internal) return nccl_err(ncclSystemError, "ncclGetUniqueId", "cannot read /dev/urandom");
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    const char *call = "ncclCommInitRank";
    if (!comm) return nccl_err(ncclInvalidArgument, call, "comm is NULL");
    *comm = nullptr;
    int init = 0, fin = 0, size = 0, me = 0;
    MPI_Initialized(&init);
    if (init) MPI_Finalized(&fin);
    if (!init || fin) return nccl_err(ncclInvalidUsage, call, "MPI is not initialised (the simulator's NCCL runs over MPI)");
    if (nranks < 1 || rank < 0 || rank >= nranks) return nccl_err(ncclInvalidArgument, call, "rank or nranks out of range");
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != size || rank != me)
        return nccl_err(ncclInvalidArgument, call, "nranks and rank must be MPI_COMM_WORLD's size and rank");
    MPI_Comm c;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c) != MPI_SUCCESS) return nccl_err(ncclSystemError, call, "MPI_Comm_dup failed");
    /* every rank holds the same id: its bytes' sum and xor agree with rank 0's */
    uint64_t h[2] = {0, 0}, h0[2];
    for (size_t i = 0; i < sizeof id.internal; i++) {
        h[0] += (unsigned char)id.internal[i] * (i + 1);
        h[1] = (h[1] * 1099511628211ull) ^ (unsigned char)id.internal[i];
    }
    memcpy(h0, h, sizeof h);
    int same = 0, all = 0;
    if (MPI_Bcast(h0, 2, MPI_UINT64_T, 0, c) == MPI_SUCCESS) same = h0[0] == h[0] && h0[1] == h[1];
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, c);
    if (!all) {
        MPI_Comm_free(&c);
        return nccl_err(ncclInvalidUsage, call, "the ranks passed different ncclUniqueIds (rank 0's is to be broadcast)");
    }
    *comm = new ncclComm{c, rank, nranks};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return nccl_err(ncclInvalidArgument, "ncclCommDestroy", "comm is NULL");
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st) {
    const char *call = "ncclAllReduce";
    MPI_Datatype t = nccl_type(datatype);
    MPI_Op o = nccl_op(op);
    if (!comm) return nccl_err(ncclInvalidArgument, call, "comm is NULL");
    if (t == MPI_DATATYPE_NULL || o == MPI_OP_NULL)
        return nccl_err(ncclInvalidArgument, call, "data type or reduction not implemented by the simulator");
    if (count > (size_t)INT_MAX) return nccl_err(ncclInvalidArgument, call, "count over INT_MAX (simulator limit)");
    int tsize = 0;
    MPI_Type_size(t, &tsize);
    size_t bytes = count * (size_t)tsize;
    if (count && (kind_of(sendbuff, bytes) != MEM_DEVICE || kind_of(recvbuff, bytes) != MEM_DEVICE))
        return nccl_err(ncclInvalidArgument, call, "a buffer is not (all) in device memory");
    stream *s = get_stream(st);
    if (!s) return nccl_err(ncclInvalidArgument, call, "stream is not a live stream");
    if (capture_forbids(s, "ncclAllReduce") != cudaSuccess) /* a host-side MPI collective cannot be a graph node here */
        return nccl_err(ncclInvalidUsage, call, "the stream is capturing (NCCL in graphs is not simulated)");
    s->drain(); /* the stream's earlier work (not counted as a host sync: on a GPU it is none) */
    if (sticky() != cudaSuccess) return nccl_err(ncclUnhandledCudaError, call, "the device has faulted");
    ctx().nccl++;
    const void *src = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
    if (MPI_Allreduce(src, recvbuff, (int)count, t, o, comm->comm) != MPI_SUCCESS)
        return nccl_err(ncclSystemError, call, "MPI_Allreduce failed");
    return ncclSuccess;
}
} // extern "C"
