/* snippets.c - every C example in README.md and docs/ (every .md), in the context that makes it
 * compile. A fenced ```c block in the docs is a verbatim copy of one region here, between
 * `// snippet: NAME` and `// end snippet` (dedented); tests/docs/check.sh verifies each copy
 * and the Makefile compiles this file as C11 -pedantic and as C++17, so the docs' code
 * compiles as written. Edit the code here, then paste it into the doc. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include <math.h>
#include <stdio.h>

/* A training step supplied by the reader's program (used by the loader example). */
static mb_result train_step(const float *features, const float *targets, int64_t count) {
    (void)features; (void)targets; (void)count;
    return MB_OK;
}

mb_result doc_readme_quickstart(const float *x, float *y, int64_t B, int64_t F, int64_t H);
mb_result doc_readme_quickstart(const float *x, float *y, int64_t B, int64_t F, int64_t H) {
    // snippet: readme-quickstart
    mb_device *dev;
    if (mb_device_open(&dev, NULL) != MB_OK) {            /* CPU; MB_CUDA needs megabatch_cuda.cuh */
        fprintf(stderr, "error: %s\n", mb_last_error());
        return MB_ERR_NO_DEVICE;
    }
    mb_params *p;                                          /* every weight in one flat buffer */
    int64_t w_shape[2] = {4 * H, F};
    int w;
    MB_TRY(mb_params_create(&p, dev));                     /* MB_TRY: return the error as is */
    MB_TRY(mb_params_add(p, "weight_ih_l0", 2, w_shape, 1 / sqrtf((float)H), &w));
    MB_TRY(mb_params_finalize(p));                         /* one allocation for data, one for grads */
    MB_TRY(mb_params_init(p, 42));                         /* the same bits on CPU and CUDA */

    mb_gemm_args g = {0};                                  /* the one matrix multiply, row-major */
    g.m = B; g.n = 4 * H; g.k = F; g.alpha = 1; g.trans_b = 1;
    g.a = x; g.lda = F; g.b = mb_params_tensor(p, w); g.ldb = F; g.c = y; g.ldc = 4 * H;
    mb_result r = mb_gemm(dev, &g);                        /* y (B, 4H) = x (B, F) @ W^T */

    mb_params_destroy(p);
    mb_device_close(dev);
    // end snippet
    return r;
}

mb_result doc_foundation_params(mb_device *dev, int64_t H, uint64_t seed);
mb_result doc_foundation_params(mb_device *dev, int64_t H, uint64_t seed) {
    mb_params *p;
    int64_t shape[2] = {4 * H, 8};
    int idx;
    // snippet: foundation-params
    MB_TRY(mb_params_create(&p, dev));
    MB_TRY(mb_params_add(p, "weight_ih_l0", 2, shape, 1 / sqrtf((float)H), &idx));  /* before finalize */
    MB_TRY(mb_params_finalize(p));      /* two device allocations, both zeroed */
    MB_TRY(mb_params_init(p, seed));    /* element j of tensor t = mb_rng_symmetric(seed, t, j, bound) */
    float *w = mb_params_tensor(p, idx), *gw = mb_params_tensor_grad(p, idx);
    MB_TRY(mb_params_zero_grad(p));
    // end snippet
    (void)w; (void)gw;
    mb_params_destroy(p);
    return MB_OK;
}

mb_result doc_series_memory(void);
mb_result doc_series_memory(void) {
    // snippet: series-memory
    /* two timeframes: 10 M1 bars and 4 M5 bars of F = 2 features; windows of 3 and 2 bars */
    static float m1[10 * 2], m5[4 * 2], targets[3 * 1];
    const float *bars[2] = {m1, m5};
    int64_t window[2] = {3, 2}, bars_n[2] = {10, 4};
    int64_t ends[3 * 2] = {4, 1,  5, 1,  9, 3}; /* sample i: last closed M1 bar, last closed M5 bar */
    mb_series s = {0};
    s.segments = 2; s.window = window; s.bars_n = bars_n; s.bars = bars;
    s.ends = ends; s.targets = targets; s.n = 3; s.f = 2; s.k = 1;
    mb_dataset *ds;
    MB_TRY(mb_dataset_open_series(&ds, &s, NULL)); /* T = 5: sample 2 is M1 bars 7..9, M5 bars 2..3 */
    // end snippet
    mb_dataset_close(ds);
    return MB_OK;
}

mb_result doc_loader_loop(mb_device *dev);
mb_result doc_loader_loop(mb_device *dev) {
    // snippet: loader-loop
    mb_dataset *ds;
    MB_TRY(mb_dataset_open_file(&ds, "train.h5", NULL));
    const mb_dataset_meta *m = mb_dataset_info(ds);      /* m->n, m->t, m->f, m->k */
    printf("%lld samples of (%lld, %lld) -> %lld\n", (long long)m->n, (long long)m->t,
           (long long)m->f, (long long)m->k);
    mb_loader_config lc = {0};
    lc.batch = 128;                      /* shuffle off, drop_last off, 75% of free memory */
    mb_loader *ld;
    mb_result r = mb_loader_open(&ld, dev, ds, &lc);
    for (int epoch = 0; r == MB_OK && epoch < 10; epoch++) {
        mb_batch b = {0};
        while ((r = mb_loader_next(ld, &b)) == MB_OK && !b.end_of_epoch)
            /* device memory in the loader's dtype (f32 by default); the cast is needed in C++ */
            train_step((const float *)b.features /* (count, T, F) */,
                       (const float *)b.targets /* (count, K) */, b.count);
    }
    mb_loader_close(ld);                 /* NULL is fine, as for every close/destroy */
    mb_dataset_close(ds);
    // end snippet
    return r;
}

mb_result doc_lstm_usage(mb_params *params, const float *x, float *h_last, const float *dh_last,
                         int64_t B, int64_t T, uint64_t seed);
mb_result doc_lstm_usage(mb_params *params, const float *x, float *h_last, const float *dh_last,
                         int64_t B, int64_t T, uint64_t seed) {
    // snippet: lstm-usage
    mb_lstm_config c = {0};            /* 0 means default everywhere */
    c.input_size = 128; c.hidden_size = 256; c.layers = 2;
    c.prefix = "m5.";                  /* names m5.weight_ih_l0 ... */
    c.checkpoint = 0;                  /* auto: full storage if memory allows, else ~sqrt(T); -1 = full */
    c.max_steps = 480; c.max_batch = 128;
    mb_lstm *l;
    MB_TRY(mb_lstm_create(&l, params, &c));                  /* before mb_params_finalize */
    MB_TRY(mb_params_finalize(params));
    MB_TRY(mb_params_init(params, seed));
    MB_TRY(mb_lstm_forward(l, x, B, T, NULL, NULL, NULL, h_last));    /* x (B,T,F), h_last (B,H) */
    /* ... head, loss, dh_last ... */
    MB_TRY(mb_lstm_backward(l, dh_last, NULL, NULL, NULL, NULL));     /* grads += ; dx not needed */
    mb_lstm_destroy(l);
    // end snippet
    return MB_OK;
}

mb_result doc_numerics_step(mb_device *dev, mb_params *params, mb_linear fc, const float *x,
                            const float *target, float *y, float *dy, float *loss_dev, int64_t B,
                            int64_t K, int micro_batches);
mb_result doc_numerics_step(mb_device *dev, mb_params *params, mb_linear fc, const float *x,
                            const float *target, float *y, float *dy, float *loss_dev, int64_t B,
                            int64_t K, int micro_batches) {
    mb_lr_schedule sched = {0};
    sched.lr = 1e-3f;
    // snippet: numerics-step
    mb_scaler *scaler;                                       /* fp16: dynamic loss scaling */
    mb_adamw *opt;                                           /* NULL configs: the defaults */
    MB_TRY(mb_scaler_create(&scaler, dev, NULL));
    MB_TRY(mb_adamw_create(&opt, params, NULL));
    mb_accum acc;
    MB_TRY(mb_accum_init(&acc, 4));                          /* step every 4 micro-batches */
    for (int i = 0; i < micro_batches; i++) {
        if (mb_accum_window_start(&acc)) MB_TRY(mb_params_zero_grad(params));
        MB_TRY(mb_linear_forward(&fc, 0, x, B, y));
        MB_TRY(mb_loss(dev, 0, NULL, y, target, B, K, mb_accum_loss_scale(&acc),
                       mb_scaler_scale_ptr(scaler), loss_dev, dy));
        MB_TRY(mb_linear_backward(&fc, 0, x, dy, B, NULL));
        if (mb_accum_tick(&acc)) {
            float lr;
            MB_TRY(mb_lr_at(&sched, acc.windows - 1, &lr));
            MB_TRY(mb_scaler_unscale(scaler, mb_params_grad(params), mb_params_total(params)));
            MB_TRY(mb_adamw_step(opt, lr, scaler));          /* skipped on the device on inf/NaN */
            MB_TRY(mb_scaler_update(scaler));
        }
    }
    mb_adamw_destroy(opt);
    mb_scaler_destroy(scaler);
    // end snippet
    return MB_OK;
}

mb_result doc_checkpoint_calls(mb_device *dev, mb_params *params, mb_adamw *opt, mb_scaler *scaler,
                               const char *name, const void *data, size_t bytes, void *dst);
mb_result doc_checkpoint_calls(mb_device *dev, mb_params *params, mb_adamw *opt, mb_scaler *scaler,
                               const char *name, const void *data, size_t bytes, void *dst) {
    mb_ckpt_writer *w;
    mb_ckpt_reader *r;
    const char *path = "run/last.mbckpt";
    // snippet: checkpoint-calls
    mb_ckpt_writer_create(&w, dev);          // dev: where added data may live (NULL: host only)
    mb_ckpt_add(w, name, data, bytes);       // snapshot a host or device blob as a section
    mb_ckpt_add_params(w, params);           // "params" + "params.layout"
    mb_ckpt_add_adamw(w, opt);               // "adamw.m", "adamw.v", "adamw.steps"
    mb_ckpt_add_scaler(w, scaler);           // "scaler"
    mb_ckpt_write(w, path);                  // path.tmp, fsync, rename, fsync the directory
    mb_ckpt_writer_destroy(w);

    mb_ckpt_open(&r, dev, path);             // reads the whole file and verifies it first
    mb_ckpt_has(r, name, &bytes);            // 1 if present (and its size)
    mb_ckpt_get(r, name, dst, bytes);        // copy out (dst host or device memory)
    mb_ckpt_load_params(r, params);          // refuses another layout, naming the tensor
    mb_ckpt_load_adamw(r, opt);
    mb_ckpt_load_scaler(r, scaler);
    mb_ckpt_close(r);
    // end snippet
    return MB_OK;
}

mb_result doc_checkpoint_key(mb_ckpt_writer *w, mb_ckpt_reader *r, int64_t hidden, float lr, uint64_t seed, int no_ftz);
mb_result doc_checkpoint_key(mb_ckpt_writer *w, mb_ckpt_reader *r, int64_t hidden, float lr, uint64_t seed, int no_ftz) {
    // snippet: checkpoint-key
    mb_ckpt_key key[] = {
        MB_CKPT_INT("hidden", hidden), MB_CKPT_F32("lr", lr), MB_CKPT_UINT("seed", seed),
        {"no-ftz", MB_CKPT_KIND_INT, no_ftz, 0, 0, "0"},     // added later: older files hold 0
    };
    int n = (int)(sizeof key / sizeof *key);
    MB_TRY(mb_ckpt_add_key(w, "options.key", key, n));     // "hidden=32\nlr=0.00200000009\n..."
    /* ... on resume: MB_ERR_FORMAT "'run.ckpt' was written with other options:
     * hidden is 32 in the checkpoint but 16 here" when one differs */
    mb_result res = mb_ckpt_check_key(r, "options.key", key, n);
    // end snippet
    return res;
}

mb_result doc_checkpoint_loop(mb_device *dev, mb_params *params, mb_adamw *opt, mb_scaler *scaler,
                              int64_t step, int64_t k, mb_accum accum, int resume);
mb_result doc_checkpoint_loop(mb_device *dev, mb_params *params, mb_adamw *opt, mb_scaler *scaler,
                              int64_t step, int64_t k, mb_accum accum, int resume) {
    // snippet: checkpoint-loop
    if (step % k == 0) {
        mb_ckpt_writer *w;
        MB_TRY(mb_ckpt_writer_create(&w, dev));
        mb_result res = mb_ckpt_add_params(w, params);
        if (res == MB_OK) res = mb_ckpt_add_adamw(w, opt);
        if (res == MB_OK) res = mb_ckpt_add_scaler(w, scaler);
        if (res == MB_OK) res = mb_ckpt_add(w, "step", &step, sizeof step);
        if (res == MB_OK) res = mb_ckpt_add(w, "accum", &accum, sizeof accum);
        if (res == MB_OK) res = mb_ckpt_write(w, "run/last.mbckpt");
        mb_ckpt_writer_destroy(w);
        MB_TRY(res);
    }
    if (resume) {                                          /* --resume */
        mb_ckpt_reader *r;
        MB_TRY(mb_ckpt_open(&r, dev, "run/last.mbckpt"));  // MB_ERR_CORRUPT on any damage
        mb_result res = mb_ckpt_load_params(r, params);    // MB_ERR_FORMAT on another model
        if (res == MB_OK) res = mb_ckpt_load_adamw(r, opt);
        if (res == MB_OK) res = mb_ckpt_load_scaler(r, scaler);
        if (res == MB_OK) res = mb_ckpt_get(r, "step", &step, sizeof step);
        mb_ckpt_close(r);
        MB_TRY(res);
    }
    // end snippet
    return MB_OK;
}

mb_result doc_reliability_probe(mb_dataset_meta *meta);
mb_result doc_reliability_probe(mb_dataset_meta *meta) {
    mb_dataset *ds;
    // snippet: reliability-probe
    /* the one call for a file you did not write: the probe in a child, then the open here */
    mb_dataset_config c = {0};
    c.probe_timeout_s = 5;    /* hung child is killed; 0 = 10 s */
    mb_result r = mb_dataset_open_untrusted(&ds, "untrusted.h5", &c);  /* cfg may be NULL */
    /* r == MB_ERR_FORMAT, mb_last_error():
       "HDF5 crashed while parsing 'untrusted.h5' (signal 11)"; this process never opened it */

    /* the probe alone: open + validate + read the first and last samples in a child process */
    mb_result pr = mb_dataset_probe("untrusted.h5", NULL, meta /* or NULL */);
    // end snippet
    if (r == MB_OK) mb_dataset_close(ds);
    return pr != MB_OK ? pr : r;
}

#ifdef MB_SNIPPETS_MAIN
/* ---- every snippet run (tests/docs/snippets.sh: build/compile/snippets_run in a directory
 * holding train.h5 from build/prepare and an empty run/) ----
 * Each function above is called as a program would call it, on the CPU; each check prints
 * `ok NAME` or `FAIL NAME: why`, and the last line is `snippets: N passed, N failed`. */
#include <string.h>

static int n_pass, n_fail;
static void check(const char *name, int ok, const char *why) {
    if (ok) { n_pass++; printf("ok   %s\n", name); }
    else { n_fail++; printf("FAIL %s: %s (%s)\n", name, why, mb_last_error()); }
}
static void fill(float *v, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) v[i] = scale * (float)((int)((i * 2654435761u) % 2001) - 1000) / 1000.0f;
}

int main(void) {
    mb_device *dev;
    if (mb_device_open(&dev, NULL) != MB_OK) { printf("FAIL device: %s\nsnippets: 0 passed, 1 failed\n", mb_last_error()); return 1; }

    { /* readme-quickstart: y (3, 16) = x (3, 5) @ W^T */
        float x[3 * 5], y[3 * 16];
        fill(x, 15, 1);
        memset(y, 0, sizeof y);
        mb_result r = doc_readme_quickstart(x, y, 3, 5, 4);
        int nonzero = 0, finite = 1;
        for (int i = 0; i < 48; i++) { nonzero |= y[i] != 0; finite &= isfinite(y[i]) != 0; }
        check("readme-quickstart", r == MB_OK && nonzero && finite, "not MB_OK, or y all zero or not finite");
    }
    check("foundation-params", doc_foundation_params(dev, 8, 7) == MB_OK, "not MB_OK");
    check("series-memory", doc_series_memory() == MB_OK, "not MB_OK");
    { /* loader-loop: 10 epochs over train.h5; ends at MB_OK after the last end of epoch */
        mb_result r = doc_loader_loop(dev);
        check("loader-loop", r == MB_OK, "not MB_OK");
    }
    { /* lstm-usage: a 2-layer F=128 H=256 LSTM, forward and backward at B=2, T=6 */
        mb_params *p;
        int64_t B = 2, T = 6;
        static float x[2 * 6 * 128], h[2 * 256], dh[2 * 256];
        fill(x, sizeof x / sizeof *x, 1);
        fill(dh, sizeof dh / sizeof *dh, 0.5f);
        mb_result r = mb_params_create(&p, dev);
        if (r == MB_OK) r = doc_lstm_usage(p, x, h, dh, B, T, 3);
        int grads = 0;
        if (r == MB_OK)
            for (size_t i = 0; i < mb_params_total(p); i++) grads |= mb_params_grad(p)[i] != 0;
        check("lstm-usage", r == MB_OK && mb_params_num_tensors(p) == 8 && grads, "not MB_OK, or no gradient");
        mb_params_destroy(p);
    }
    { /* numerics-step: 8 micro-batches of a linear layer, two optimizer steps */
        mb_params *p;
        mb_linear fc;
        enum { B = 4, IN = 3, K = 2 };
        float x[B * IN], t[B * K], y[B * K], dy[B * K], loss, before[IN * K + K];
        fill(x, B * IN, 1); fill(t, B * K, 0.3f);
        mb_result r = mb_params_create(&p, dev);
        if (r == MB_OK) r = mb_linear_init(&fc, p, "fc", IN, K);
        if (r == MB_OK) r = mb_params_finalize(p);
        if (r == MB_OK) r = mb_params_init(p, 5);
        if (r == MB_OK) r = mb_params_get(p, before);
        if (r == MB_OK) r = doc_numerics_step(dev, p, fc, x, t, y, dy, &loss, B, K, 8);
        int moved = r == MB_OK && memcmp(before, mb_params_tensor(p, 0), sizeof before) != 0;
        check("numerics-step", r == MB_OK && moved, "not MB_OK, or the weights did not move");
        mb_params_destroy(p);
    }
    { /* checkpoint-calls, checkpoint-key, checkpoint-loop: run/last.mbckpt written and read back */
        mb_params *p;
        mb_linear fc;
        mb_adamw *opt = NULL;
        mb_scaler *sc = NULL;
        mb_result r = mb_params_create(&p, dev);
        if (r == MB_OK) r = mb_linear_init(&fc, p, "fc", 3, 2);
        if (r == MB_OK) r = mb_params_finalize(p);
        if (r == MB_OK) r = mb_params_init(p, 9);
        if (r == MB_OK) r = mb_adamw_create(&opt, p, NULL);
        if (r == MB_OK) r = mb_scaler_create(&sc, dev, NULL);
        const char blob[] = "a blob", *name = "blob";
        char back[sizeof blob] = "";
        if (r == MB_OK) r = doc_checkpoint_calls(dev, p, opt, sc, name, blob, sizeof blob, back);
        check("checkpoint-calls", r == MB_OK && !memcmp(back, blob, sizeof blob), "the blob did not come back");

        /* the key: written by one run (its check, against a file without the key, refused),
         * then checked by a resume with the same options (MB_OK) and with another hidden */
        mb_ckpt_writer *w = NULL;
        mb_ckpt_reader *rd = NULL;
        mb_result first = MB_ERR_STATE, same = MB_ERR_STATE, other = MB_OK;
        if (mb_ckpt_writer_create(&w, NULL) == MB_OK && mb_ckpt_open(&rd, NULL, "run/last.mbckpt") == MB_OK) {
            first = doc_checkpoint_key(w, rd, 32, 0.002f, 7, 0);
            mb_ckpt_close(rd); rd = NULL;
            if (mb_ckpt_write(w, "run/key.mbckpt") != MB_OK) first = MB_OK; /* counted as a failure below */
        }
        mb_ckpt_writer_destroy(w); w = NULL;
        if (mb_ckpt_writer_create(&w, NULL) == MB_OK && mb_ckpt_open(&rd, NULL, "run/key.mbckpt") == MB_OK) {
            same = doc_checkpoint_key(w, rd, 32, 0.002f, 7, 0);
            mb_ckpt_writer_destroy(w); w = NULL;
            if (mb_ckpt_writer_create(&w, NULL) == MB_OK) other = doc_checkpoint_key(w, rd, 16, 0.002f, 7, 0);
            mb_ckpt_close(rd);
        }
        mb_ckpt_writer_destroy(w);
        check("checkpoint-key", first == MB_ERR_FORMAT && same == MB_OK && other == MB_ERR_FORMAT &&
              strstr(mb_last_error(), "hidden is 32 in the checkpoint but 16 here"), "not refused/accepted as its comments say");

        mb_accum acc;
        mb_accum_init(&acc, 4);
        r = doc_checkpoint_loop(dev, p, opt, sc, 10, 5, acc, 1);
        check("checkpoint-loop", r == MB_OK, "not MB_OK");
        mb_adamw_destroy(opt); mb_scaler_destroy(sc); mb_params_destroy(p);
    }
    { /* reliability-probe: untrusted.h5 (a copy of train.h5) probed in a child, then opened */
        mb_dataset_meta meta;
        memset(&meta, 0, sizeof meta);
        mb_result r = doc_reliability_probe(&meta);
        check("reliability-probe", r == MB_OK && meta.n > 0, "not MB_OK, or no samples");
    }
    mb_device_close(dev);
    printf("snippets: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
#endif
