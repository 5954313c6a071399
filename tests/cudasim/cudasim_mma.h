/* cudasim_mma.h - the warp-level matrix instructions the kernels reach by inline PTX on a GPU
 * (ldmatrix.sync.aligned.m8n8.x{2,4}.shared.b16 and mma.sync.aligned.m16n8k16.row.col.f32 with
 * bf16 or f16 operands), for the CPU executor, included by cudasim.h. A kernel calls them where
 * it would issue the PTX (megabatch_cuda.cuh: #ifdef CUDASIM). Both are warp collectives (all 32
 * lanes, converged) and follow the PTX ISA's fragment layouts exactly, so a kernel's addressing
 * and its use of the registers are what the simulator checks:
 *   ldmatrix: lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned,
 *     in the launch's dynamic shared memory; with 2 matrices lanes 16-31 give addresses too,
 *     unused); register i of lane l gets, of matrix i, the 32-bit word l % 4 of row l / 4.
 *   mma: with g = lane / 4, t = lane % 4, a register holding two 16-bit elements, the lower
 *     index in the low half: A (16 x 16, row-major) a[0] = row g, columns 2t, 2t+1; a[1] row
 *     g+8; a[2] row g, columns 2t+8, 2t+9; a[3] row g+8, those columns. B (16 x 8) b[0] = rows
 *     2t, 2t+1 of column g; b[1] rows 2t+8, 2t+9. C and D (16 x 8, f32): d[0], d[1] = row g,
 *     columns 2t, 2t+1; d[2], d[3] row g+8. D = C + A B with each product and the sum over k (in
 *     order) in f32. */
#ifndef CUDASIM_MMA_H
#define CUDASIM_MMA_H
#include <cstdint>
#include <cstring>

namespace cudasim {
void ldmatrix(unsigned *r, int n, const void *p);
/* Element hi (0: the low half) of register w, as f32. */
inline float mma_elem(uint32_t w, int hi, int f16) {
    uint16_t h = (uint16_t)(hi ? w >> 16 : w & 0xffffu);
    if (f16) {
        __half_raw r;
        r.x = h;
        return __half2float(__half(r));
    }
    __nv_bfloat16_raw r;
    r.x = h;
    return __bfloat162float(__nv_bfloat16(r));
}
/* f16: 1 for f16 operands, 0 for bf16. */
inline void mma_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2], int f16) {
    uint32_t A[32][4], Bm[32][2];
    const uint64_t v[3] = {a[0] | (uint64_t)a[1] << 32, a[2] | (uint64_t)a[3] << 32, b[0] | (uint64_t)b[1] << 32};
    for (int j = 0; j < 3; j++) {
        const std::atomic<uint64_t> *all = warp_collective(0xffffffffu, v[j], "mma.sync");
        for (int l = 0; l < 32; l++) {
            uint64_t u = all[l].load(std::memory_order_relaxed);
            if (j < 2) A[l][2 * j] = (uint32_t)u, A[l][2 * j + 1] = (uint32_t)(u >> 32);
            else Bm[l][0] = (uint32_t)u, Bm[l][1] = (uint32_t)(u >> 32);
        }
    }
    const int g = (int)lane_id() / 4, t = (int)lane_id() % 4;
    for (int e = 0; e < 4; e++) {
        int m = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) {
            int src = 4 * (m % 8) + k % 8 / 2, reg = (m >= 8) + 2 * (k >= 8); /* A[m][k] */
            float x = mma_elem(A[src][reg], k & 1, f16);
            float y = mma_elem(Bm[4 * n + k % 8 / 2][k >= 8], k & 1, f16); /* B[k][n] */
            float p = x * y; /* the product rounded to f32, then added */
            s += p;
        }
        d[e] = s;
    }
}
} // namespace cudasim
#endif
