/* cudasim_wmma.h - nvcuda::wmma (warp matrix multiply-accumulate) for the CPU executor, included
 * by cudasim.h. NVIDIA's <mma.h> is device code; this replaces it (its include guard is set).
 * A fragment's element layout is unspecified on a GPU, so here every lane holds the whole tile
 * (num_elements = rows x cols, row-major): element-wise code over x[0..num_elements) behaves as
 * on a GPU. Every operation is a warp collective (all 32 lanes, converged); loads and stores
 * check a GPU's pointer alignment and stride rules. A store writes each
 * element from one lane only (element i from lane i % 32): reading another lane's stored elements
 * needs a __syncwarp, as on a GPU (TSan reports the race otherwise). mma_sync multiplies in f32
 * (TF32-rounded inputs for precision::tf32), sums over k in order, and rounds to the
 * accumulator's type. */
#ifndef CUDASIM_WMMA_H
#define CUDASIM_WMMA_H
#define __CUDA_MMA_H__ 1
#include <type_traits>

inline float __float_to_tf32(float x) { /* round to 10 mantissa bits, nearest even */
    if (!(x - x == 0.0f)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
    memcpy(&x, &u, 4);
    return x;
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
} // namespace precision

template <class T> struct storage_of { using type = T; };
template <> struct storage_of<precision::tf32> { using type = float; };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    using element_type = typename storage_of<T>::type;
    element_type x[num_elements];
};

template <class T> inline float to_f32(T v) { return (float)v; }
template <> inline float to_f32(__half v) { return __half2float(v); }
template <> inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> inline T from_f32(float v) { return (T)v; }
template <> inline __half from_f32(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 from_f32(float v) { return __float2bfloat16_rn(v); }

inline void converged(const char *op) { cudasim::warp_collective(0xffffffffu, 0, op); }

/* The pointer and stride rules of a GPU's wmma loads and stores: the tile's first element
 * 256-bit aligned, the stride a multiple of 16 bytes. */
template <class P> inline void check_tile(const P *p, unsigned ldm) {
    if ((uintptr_t)p % 32) cudasim::device_error("wmma load/store: the pointer is not 256-bit aligned");
    if ((size_t)ldm * sizeof(P) % 16) cudasim::device_error("wmma load/store: ldm is not a multiple of 16 bytes");
}

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v) {
    using F = fragment<Use, M, N, K, T, L>;
    for (int i = 0; i < F::num_elements; i++) f.x[i] = (typename F::element_type)v;
}

template <class F, class P> inline void load_tile(F &f, const P *p, unsigned ldm, bool row) {
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = (typename F::element_type)(row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}
template <class Use, int M, int N, int K, class T, class L, class P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const P *p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load takes a layout_t");
    converged("wmma::load_matrix_sync");
    check_tile(p, ldm);
    load_tile(f, p, ldm, std::is_same<L, row_major>::value);
}
template <int M, int N, int K, class T, class P>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const P *p, unsigned ldm, layout_t l) {
    converged("wmma::load_matrix_sync");
    check_tile(p, ldm);
    load_tile(f, p, ldm, l == mem_row_major);
}
template <int M, int N, int K, class T, class P>
inline void store_matrix_sync(P *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t l) {
    using F = fragment<accumulator, M, N, K, T>;
    converged("wmma::store_matrix_sync");
    check_tile(p, ldm);
    for (int i = (int)cudasim::lane_id(); i < F::num_elements; i += 32) {
        int r = i / F::cols, c = i % F::cols;
        p[l == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r] = f.x[i];
    }
}
template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c) {
    converged("wmma::mma_sync");
    const bool t32 = std::is_same<TA, precision::tf32>::value;
    fragment<accumulator, M, N, K, TC> out;
    float af[M * K], bf[K * N]; /* the operands in f32 once, not once per product (f16 is slow to convert) */
    for (int i = 0; i < M * K; i++) af[i] = t32 ? __float_to_tf32(to_f32(a.x[i])) : to_f32(a.x[i]);
    for (int i = 0; i < K * N; i++) bf[i] = t32 ? __float_to_tf32(to_f32(b.x[i])) : to_f32(b.x[i]);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = to_f32(c.x[i * N + j]);
            for (int k = 0; k < K; k++) acc += af[i * K + k] * bf[k * N + j];
            out.x[i * N + j] = from_f32<typename fragment<accumulator, M, N, K, TC>::element_type>(acc);
        }
    d = out;
}
} // namespace wmma
} // namespace nvcuda
#endif
