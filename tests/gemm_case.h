/* gemm_case.h - one random gemm case run through mb_gemm on any device and checked
 * against a naive double-precision triple loop (shared by the CPU and CUDA tests). */
#ifndef MB_GEMM_CASE_H
#define MB_GEMM_CASE_H
#include "testutil.h"

typedef struct tu_gemm_case {
    int ta, tb;
    int64_t m, n, k, batch, pad; /* pad: extra columns in every leading dimension */
    float alpha, beta;
    mb_dtype ab, c;
} tu_gemm_case;

static inline tu_gemm_case tu_gemm_random(void) {
    tu_gemm_case g;
    g.ta = tu_int(0, 1); g.tb = tu_int(0, 1);
    g.m = tu_int(1, 70); g.n = tu_int(1, 70); g.k = tu_int(1, 90);
    g.batch = tu_int(1, 3); g.pad = tu_int(0, 3);
    g.alpha = tu_uniform(-2, 2); g.beta = tu_int(0, 2) == 0 ? 0.0f : tu_uniform(-1, 1);
    g.ab = MB_F32; g.c = MB_F32;
    return g;
}

/* Host values rounded through dtype t, stored as t. */
static inline void *tu_host_typed(const float *x, size_t n, mb_dtype t, float *rounded) {
    void *p = malloc(n * mb_dtype_size(t) + 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        if (t == MB_F32) { ((float *)p)[i] = x[i]; rounded[i] = x[i]; }
        else {
            uint16_t h = t == MB_BF16 ? mb_f32_to_bf16(x[i]) : mb_f32_to_f16(x[i]);
            ((uint16_t *)p)[i] = h;
            rounded[i] = t == MB_BF16 ? mb_bf16_to_f32(h) : mb_f16_to_f32(h);
        }
    }
    return p;
}

static inline void *tu_to_device(mb_device *dev, const void *host, size_t bytes) {
    void *d = NULL;
    tu_ok(mb_alloc(dev, MB_MEM_DEVICE, bytes, &d));
    tu_ok(mb_copy(dev, 0, d, host, bytes));
    return d;
}

/* Run the case on dev; the result (as f32) goes to out if not NULL. Checks against the
 * naive reference with tolerance atol + rtol*|ref| scaled by k. */
static inline void tu_gemm_run(mb_device *dev, const tu_gemm_case *g, double atol, double rtol) {
    int64_t ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
    int64_t br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
    /* BLAS: a leading dimension is at least 1 even with no columns (k = 0) */
    int64_t lda = (ac > 0 ? ac : 1) + g->pad, ldb = (bc > 0 ? bc : 1) + g->pad, ldc = g->n + g->pad;
    size_t sa = (size_t)(ar * lda), sb = (size_t)(br * ldb), sc = (size_t)(g->m * ldc);
    size_t na = sa * g->batch, nb = sb * g->batch, nc = sc * g->batch;
    float *a = tu_alloc_f32(na), *b = tu_alloc_f32(nb), *c = tu_alloc_f32(nc);
    float *ra = tu_alloc_f32(na), *rb = tu_alloc_f32(nb), *rc = tu_alloc_f32(nc), *got = tu_alloc_f32(nc);
    tu_fill(a, na, -1, 1); tu_fill(b, nb, -1, 1); tu_fill(c, nc, -1, 1);
    void *ha = tu_host_typed(a, na, g->ab, ra), *hb = tu_host_typed(b, nb, g->ab, rb), *hc = tu_host_typed(c, nc, g->c, rc);
    void *da = tu_to_device(dev, ha, na * mb_dtype_size(g->ab)), *db = tu_to_device(dev, hb, nb * mb_dtype_size(g->ab));
    void *dc = tu_to_device(dev, hc, nc * mb_dtype_size(g->c));
    mb_gemm_args args;
    memset(&args, 0, sizeof args);
    args.trans_a = g->ta; args.trans_b = g->tb; args.m = g->m; args.n = g->n; args.k = g->k;
    args.alpha = g->alpha; args.beta = g->beta; args.ab_type = g->ab; args.c_type = g->c;
    args.a = da; args.lda = lda; args.stride_a = (int64_t)sa;
    args.b = db; args.ldb = ldb; args.stride_b = (int64_t)sb;
    args.c = dc; args.ldc = ldc; args.stride_c = (int64_t)sc; args.batch = g->batch;
    tu_ok(mb_gemm(dev, &args));
    tu_ok(mb_copy(dev, 0, hc, dc, nc * mb_dtype_size(g->c)));
    tu_ok(mb_sync(dev, 0));
    for (size_t i = 0; i < nc; i++)
        got[i] = g->c == MB_F32 ? ((float *)hc)[i] : g->c == MB_BF16 ? mb_bf16_to_f32(((uint16_t *)hc)[i]) : mb_f16_to_f32(((uint16_t *)hc)[i]);
    for (int64_t t = 0; t < g->batch; t++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double acc = 0, mag = 0;
                for (int64_t p = 0; p < g->k; p++) {
                    double x = g->ta ? ra[t * sa + p * lda + i] : ra[t * sa + i * lda + p];
                    double y = g->tb ? rb[t * sb + j * ldb + p] : rb[t * sb + p * ldb + j];
                    acc += x * y;
                    mag += fabs(x * y);
                }
                size_t ci = (size_t)(t * sc + i * ldc + j);
                double want = g->alpha * acc + (g->beta == 0.0f ? 0.0 : g->beta * rc[ci]);
                double tol = atol * (1 + fabs(g->alpha) * mag + fabs(g->beta * rc[ci])) + rtol * fabs(want);
                if (!(fabs(got[ci] - want) <= tol))
                    fail_msg("gemm ta=%d tb=%d m=%lld n=%lld k=%lld batch=%lld ab=%s c=%s: C[%lld][%lld][%lld] = %.8g, want %.8g",
                             g->ta, g->tb, (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch,
                             mb_dtype_name(g->ab), mb_dtype_name(g->c), (long long)t, (long long)i, (long long)j, got[ci], want);
            }
    /* padding columns of C are never written */
    for (int64_t t = 0; t < g->batch; t++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = g->n; j < ldc; j++) {
                size_t ci = (size_t)(t * sc + i * ldc + j);
                assert_true(memcmp(&got[ci], &rc[ci], sizeof(float)) == 0);
            }
    mb_free(dev, da); mb_free(dev, db); mb_free(dev, dc);
    free(ha); free(hb); free(hc); free(a); free(b); free(c); free(ra); free(rb); free(rc); free(got);
}
#endif
