/* cudasim_pipeline.h - the CUDA pipeline primitives (cp.async: __pipeline_memcpy_async,
 * __pipeline_commit, __pipeline_wait_prior) for the CPU executor, included by cudasim.h.
 * NVIDIA's cuda_pipeline_primitives.h is device code; this replaces it (its include guard is set).
 *
 * A copy is recorded when it is issued and made only when a __pipeline_wait_prior of the issuing
 * thread covers its batch, in that thread. So a kernel that reads the destination before its own
 * wait sees the old bytes, and one that reads another thread's copies without a barrier (or
 * __syncwarp) after that thread's wait sees them or not depending on the order the threads ran
 * in, and TSan reports the unordered access. Copies never waited for are dropped when the block
 * ends. A copy of other than 4, 8 or 16 bytes, an address not aligned to its size, a destination
 * outside the launch's dynamic shared memory or a source inside it is a device error. */
#ifndef CUDASIM_PIPELINE_H
#define CUDASIM_PIPELINE_H
#define _CUDA_PIPELINE_PRIMITIVES_H_ 1
#include <cstddef>

namespace cudasim {
void pipeline_copy(void *dst, const void *src, size_t n, size_t zfill);
void pipeline_commit();
void pipeline_wait(size_t prior);
} // namespace cudasim

inline void __pipeline_memcpy_async(void *dst, const void *src, size_t size_and_align, size_t zfill = 0) {
    cudasim::pipeline_copy(dst, src, size_and_align, zfill);
}
inline void __pipeline_commit() { cudasim::pipeline_commit(); }
inline void __pipeline_wait_prior(size_t prior) { cudasim::pipeline_wait(prior); }
#endif

#if defined(CUDASIM_IMPLEMENTATION) && !defined(CUDASIM_PIPELINE_IMPL)
#define CUDASIM_PIPELINE_IMPL
#include <deque>
#include <vector>
namespace cudasim {
/* One thread's copies: those issued since its last commit, and its committed batches, oldest first. */
struct pipe_copy {
    char *dst;
    const char *src;
    size_t n, zfill;
};
struct pipe_state {
    std::vector<pipe_copy> open;
    std::deque<std::vector<pipe_copy>> batches;
    void commit() {
        batches.push_back(std::move(open));
        open.clear();
    }
    void wait(size_t prior) { /* every batch but the newest `prior`, oldest first */
        while (batches.size() > prior) {
            for (const pipe_copy &c : batches.front()) {
                memcpy(c.dst, c.src, c.n - c.zfill);
                memset(c.dst + (c.n - c.zfill), 0, c.zfill);
            }
            batches.pop_front();
        }
    }
};
} // namespace cudasim
#endif
