/* fuzz_entry.h - the one entry shared by the libFuzzer target (tests/fuzz/fuzz_dataset.c)
 * and its regression test (tests/test_fuzz_regress.c): a file goes through
 * mb_dataset_open_file (open + every validation), then reads of samples [0, 1), [n-1, n)
 * and [0, min(n, 4)), then mb_dataset_close.
 *
 * Include after megabatch.h (with MEGABATCH_IMPLEMENTATION in the same translation unit).
 * The entry abort()s when megabatch breaks one of its own promises, so that both the
 * fuzzer and the regression test see it as a crash:
 *   - a result outside the mb_result codes, or an error with an empty message;
 *   - an open dataset whose metadata disagree with its shape (sizes, segments, cap);
 *   - an HDF5 dataset, group, datatype or attribute still open after close (a file still
 *     open is counted instead: see fz_check_files);
 *   - the caller's HDF5 error handler or plugin loading state not restored;
 *   - a read that writes past the buffer of the rows asked for (a guard after it).
 * Success and any clean error are both fine: most fuzz inputs are refused. */
#ifndef MB_FUZZ_ENTRY_H
#define MB_FUZZ_ENTRY_H
#include <H5PLpublic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_MAX_BYTES ((size_t)16 << 20) /* mb_dataset_config.max_bytes: bounds the read buffers */
#define FZ_GUARD 16                     /* floats after each read buffer that must stay untouched */

static void fz_die(const char *what, const char *path) {
    fprintf(stderr, "fuzz_entry: %s (file %s; last error: %s)\n", what, path, mb_last_error());
    abort();
}

static herr_t fz_sentinel(hid_t stack, void *data) { (void)stack; (void)data; return 0; }
static int fz_sentinel_data;

static void fz_check_result(mb_result r, const char *path) {
    if (r > MB_OK || r < MB_ERR_CORRUPT) fz_die("result code outside mb_result", path);
    if (r != MB_OK && mb_last_error()[0] == 0) fz_die("error without a message", path);
}

static void fz_check_meta(const mb_dataset_meta *m, const char *path) {
    if (m->n < 1 || m->t < 1 || m->f < 1 || m->k < 1) fz_die("open dataset with a zero dimension", path);
    size_t bps = (size_t)m->t * (size_t)m->f * 4 + (size_t)m->k * 4;
    if (m->bytes_per_sample != bps) fz_die("bytes_per_sample disagrees with the shape", path);
    if (m->layout == MB_LAYOUT_SERIES) { /* total_bytes: the series (bars, ends, targets), not the windows */
        if (m->segments < 1 || m->total_bytes > FZ_MAX_BYTES) fz_die("series without segments, or over the cap", path);
        for (int i = 0; i < m->segments && i < MB_MAX_SEGMENTS; i++)
            if (m->bars[i] < m->segment_len[i]) fz_die("series timeframe with fewer bars than its window", path);
    } else if (m->total_bytes != bps * (size_t)m->n || m->total_bytes > FZ_MAX_BYTES) fz_die("total_bytes wrong", path);
    if (m->segments < 0 || m->segments > MB_MAX_SEGMENTS) fz_die("segment count out of range", path);
    int64_t sum = 0;
    for (int i = 0; i < m->segments; i++) {
        if (m->segment_len[i] < 1) fz_die("segment of length < 1", path);
        sum += m->segment_len[i];
    }
    if (m->segments && sum != m->t) fz_die("segments do not sum to T", path);
    for (int i = 0; i < MB_MAX_SEGMENTS; i++)
        if (memchr(m->segment_name[i], 0, MB_MAX_NAME) == NULL) fz_die("segment name not terminated", path);
    if (!memchr(m->features_type, 0, sizeof m->features_type) || !memchr(m->targets_type, 0, sizeof m->targets_type))
        fz_die("type name not terminated", path);
}

/* Read [start, end) into fresh buffers with a guard after each; returns the result. */
static mb_result fz_read(mb_dataset *ds, int64_t start, int64_t end, const char *path) {
    const mb_dataset_meta *m = mb_dataset_info(ds);
    size_t rows = (size_t)(end - start), nf = rows * (size_t)(m->t * m->f), nk = rows * (size_t)m->k;
    float *feat = (float *)malloc((nf + FZ_GUARD) * sizeof(float));
    float *targ = (float *)malloc((nk + FZ_GUARD) * sizeof(float));
    if (!feat || !targ) fz_die("no memory for the read buffers", path);
    memset(feat, 0xA5, (nf + FZ_GUARD) * sizeof(float));
    memset(targ, 0xA5, (nk + FZ_GUARD) * sizeof(float));
    int64_t got = -1;
    mb_result r = mb_dataset_read(ds, start, end, feat, targ, &got);
    fz_check_result(r, path);
    if (r == MB_OK && (got < 0 || got > end - start)) fz_die("read returned a bad row count", path);
    for (size_t i = 0; i < FZ_GUARD * sizeof(float); i++)
        if (((unsigned char *)(feat + nf))[i] != 0xA5 || ((unsigned char *)(targ + nk))[i] != 0xA5)
            fz_die("read wrote past its buffer", path);
    free(feat);
    free(targ);
    return r;
}

/* Files HDF5 could not close: on some corrupt files H5Fclose fails (flushing or evicting
 * the metadata cache) and HDF5 keeps the file ID open; a second H5Fclose on it crashes, and
 * so does the process at exit, in HDF5's library shutdown (H5_term_library ->
 * H5F__close_cb). megabatch calls H5Fclose on every path after a successful H5Fopen
 * (mb__h5_close), so a file still open here is one of those; fz_stuck counts them (the
 * caller must then use a new file name: HDF5 would take the same inode for the open file). */
static int fz_stuck;

static void fz_check_files(void) {
    ssize_t n = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_FILE);
    if (n > 0) fz_stuck = (int)n;
}

/* Open + validate + reads + close on one file. nan_policy picks the policy (0..2).
 * Returns the first error (or MB_OK); aborts on a broken promise (see the top). */
static mb_result fz_run_file(const char *path, int nan_policy) {
    H5Eset_auto2(H5E_DEFAULT, fz_sentinel, &fz_sentinel_data);
    H5PLset_loading_state(H5PL_ALL_PLUGIN);
    mb_dataset_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.max_bytes = FZ_MAX_BYTES;
    cfg.nan_policy = (mb_nan_policy)nan_policy;
    mb_dataset *ds = NULL;
    mb_result r = mb_dataset_open_file(&ds, path, &cfg);
    fz_check_result(r, path);
    if (r != MB_OK && ds) fz_die("failed open left a dataset", path);
    if (r == MB_OK) {
        if (!ds) fz_die("MB_OK without a dataset", path);
        const mb_dataset_meta *m = mb_dataset_info(ds);
        fz_check_meta(m, path);
        r = fz_read(ds, 0, 1, path);
        mb_result r2 = fz_read(ds, m->n - 1, m->n, path);
        mb_result r3 = fz_read(ds, 0, m->n < 4 ? m->n : 4, path);
        if (r == MB_OK) r = r2;
        if (r == MB_OK) r = r3;
        mb_dataset_close(ds);
    }
    H5E_auto2_t fn = NULL;
    void *data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    if (fn != fz_sentinel || data != &fz_sentinel_data) fz_die("HDF5 error handler not restored", path);
    unsigned plugins = 0;
    H5PLget_loading_state(&plugins);
    if (plugins != H5PL_ALL_PLUGIN) fz_die("HDF5 plugin state not restored", path);
    unsigned inner = H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR;
    if (H5Fget_obj_count((hid_t)H5F_OBJ_ALL, inner) != 0) fz_die("HDF5 objects left open after the run", path);
    fz_check_files();
    return r;
}

/* Bytes from the fuzzer: written to `path` (truncated first), then fz_run_file. The
 * NaN policy comes from the input's length, so every policy gets inputs. */
static inline mb_result fz_run_bytes(const uint8_t *data, size_t size, const char *path) {
    FILE *fp = fopen(path, "wb");
    if (!fp) fz_die("cannot write the input file", path);
    if (size && fwrite(data, 1, size, fp) != size) fz_die("cannot write the input file", path);
    if (fclose(fp) != 0) fz_die("cannot write the input file", path);
    return fz_run_file(path, (int)(size % 3));
}
#endif
