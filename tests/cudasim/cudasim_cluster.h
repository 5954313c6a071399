/* cudasim_cluster.h - thread-block clusters (sm_90) for the CPU executor: the part of
 * cooperative_groups the library uses (this_cluster(): sync, block_rank, num_blocks,
 * map_shared_rank), included by cudasim.h. NVIDIA's cooperative_groups.h is device code; this
 * replaces it (its include guard is set).
 *
 * A cluster launch (MB_LAUNCH_CLUSTER: cudasim::launch_cluster, what cudaLaunchKernelEx with a
 * cluster dimension is on a GPU) runs a cluster's blocks together, their threads interleaved as
 * one block's are: __syncthreads waits for the threads of the caller's block, cluster.sync (or
 * its halves barrier_arrive and barrier_wait) for every thread of the cluster, and map_shared_rank takes an address in the caller's dynamic
 * shared memory to the same offset in another block's (any other address is a device error).
 * Static __shared__ variables are one per OS thread, so the blocks of a cluster would share
 * them: a cluster kernel keeps its shared state in dynamic shared memory. In a launch without
 * clusters a block is a cluster of one, as on sm_90. */
#ifndef CUDASIM_CLUSTER_H
#define CUDASIM_CLUSTER_H
#define _COOPERATIVE_GROUPS_H_ 1

namespace cudasim {
void cluster_arrive();
void cluster_wait();
unsigned cluster_rank();
unsigned cluster_size();
void *cluster_map(const void *p, unsigned rank);
} // namespace cudasim

namespace cooperative_groups {
struct arrival_token {};
struct cluster_group {
    /* sync = arrive then wait; a phase ends when every live thread of the cluster has arrived,
     * and a thread's wait returns once its phase has ended (arriving twice without a wait, or
     * waiting without an arrival, is a device error) */
    void sync() const {
        cudasim::cluster_arrive();
        cudasim::cluster_wait();
    }
    arrival_token barrier_arrive() const {
        cudasim::cluster_arrive();
        return arrival_token();
    }
    void barrier_wait() const { cudasim::cluster_wait(); }
    void barrier_wait(arrival_token &&) const { cudasim::cluster_wait(); }
    unsigned block_rank() const { return cudasim::cluster_rank(); }
    unsigned num_blocks() const { return cudasim::cluster_size(); }
    template <class T> T *map_shared_rank(T *p, int rank) const { return (T *)cudasim::cluster_map(p, (unsigned)rank); }
};
inline cluster_group this_cluster() { return cluster_group(); }
} // namespace cooperative_groups
#endif
