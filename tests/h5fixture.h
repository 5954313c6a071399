/* h5fixture.h - small HDF5 files for the dataset and loader tests, written with the
 * HDF5 C API into a temporary directory (include after testutil.h). */
#ifndef MB_H5FIXTURE_H
#define MB_H5FIXTURE_H
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct fx_opts {
    int chunked;            /* 1: chunked layout (chunk of 3 samples), else contiguous */
    int gzip;               /* with chunked: gzip level 4 + shuffle filter */
    hid_t ftype, ttype;     /* file types (0: float32); data are converted from float */
    int targets_rank1;      /* write targets as (n) (k must be 1) */
    const char *fname, *tname; /* dataset names (NULL: features / targets) */
    const char *segments;   /* NULL, or e.g. "2,3" written as an int attribute */
    const char *names;      /* NULL, or "A,B" as the segment_names attribute */
} fx_opts;

static char fx_dir[64];

static const char *fx_path(const char *name) {
    static char buf[8][160];
    static int i;
    if (!fx_dir[0]) {
        strcpy(fx_dir, "/tmp/mb_h5_XXXXXX");
        assert_non_null(mkdtemp(fx_dir));
    }
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", fx_dir, name);
    return buf[i];
}

static hid_t fx_dataset(hid_t file, const char *name, hid_t type, int rank, const hsize_t *dims, const fx_opts *o) {
    hid_t sp = H5Screate_simple(rank, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    if (o->chunked && dims[0] > 0) {
        hsize_t cd[3] = {3, dims[1] ? dims[1] : 1, rank > 2 && dims[2] ? dims[2] : 1};
        H5Pset_chunk(pl, rank, cd);
        if (o->gzip) { H5Pset_shuffle(pl); H5Pset_deflate(pl, 4); }
    }
    hid_t d = H5Dcreate2(file, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    assert_true(d >= 0);
    H5Sclose(sp);
    H5Pclose(pl);
    return d;
}

/* Write features (n, t, f) and targets (n, k) from float arrays. */
static void fx_write(const char *path, const float *feat, const float *targ, hsize_t n, hsize_t t, hsize_t f,
                     hsize_t k, const fx_opts *opt) {
    fx_opts o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0);
    hsize_t fd[3] = {n, t, f}, td[2] = {n, k};
    hid_t df = fx_dataset(file, o.fname ? o.fname : "features", o.ftype ? o.ftype : H5T_IEEE_F32LE, 3, fd, &o);
    hid_t dt = fx_dataset(file, o.tname ? o.tname : "targets", o.ttype ? o.ttype : H5T_IEEE_F32LE,
                          o.targets_rank1 ? 1 : 2, td, &o);
    if (n && t && f) assert_true(H5Dwrite(df, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, feat) >= 0);
    if (n && k) assert_true(H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, targ) >= 0);
    if (o.segments) {
        int v[16], m = 0;
        for (const char *p = o.segments; p && m < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) v[m++] = atoi(p);
        hsize_t md = (hsize_t)m;
        hid_t sp = H5Screate_simple(1, &md, NULL), a = H5Acreate2(df, "segments", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT, v);
        H5Aclose(a); H5Sclose(sp);
    }
    if (o.names) {
        hid_t st = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
        H5Tset_size(st, strlen(o.names));
        hid_t a = H5Acreate2(df, "segment_names", st, sp, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, st, o.names);
        H5Aclose(a); H5Sclose(sp); H5Tclose(st);
    }
    H5Dclose(df); H5Dclose(dt); H5Fclose(file);
}

/* Random data: features (n, t, f) and targets (n, k), value = a unique function of the
 * sample index plus noise, so a misplaced row is caught. */
static void fx_data(float *feat, float *targ, size_t n, size_t t, size_t f, size_t k) {
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < t * f; j++) feat[i * t * f + j] = (float)i + tu_uniform(0.0f, 0.5f);
        for (size_t j = 0; j < k; j++) targ[i * k + j] = -(float)i - tu_uniform(0.0f, 0.5f);
    }
}

/* fx_data into feat/targ, then a file `name` in the test directory with the `segments` and
 * `segment_names` attributes given (either may be NULL); returns its path. */
static inline const char *fx_write_named(const char *name, float *feat, float *targ, size_t n, size_t t,
                                         size_t f, size_t k, const char *segments, const char *names) {
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.segments = segments;
    o.names = names;
    fx_data(feat, targ, n, t, f, k);
    const char *p = fx_path(name);
    fx_write(p, feat, targ, n, t, f, k, &o);
    return p;
}

static void fx_cleanup(void) {
    if (!fx_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", fx_dir);
}
#endif
