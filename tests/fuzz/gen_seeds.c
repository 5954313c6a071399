/* gen_seeds.c - writes the fuzzer's seed corpus: small HDF5 files, mostly valid training
 * files (features (N, T, F), targets (N, K)) in the layouts, types, filters and attributes
 * megabatch reads, plus some it refuses (soft link, compact layout, segment_names as an
 * array of strings or an integer, a filter off the allow list, an absurd chunk, float
 * segments), and series-layout files (valid, 16-bit + gzip, a NaN, a bad index, decreasing
 * indices). Deterministic data.
 *
 *   build/fuzz/gen_seeds tests/fuzz/seeds      (make fuzz-seeds; the files are committed) */
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

typedef struct seed {
    const char *name;
    int n, t, f, k;
    int latest;          /* libver bounds latest (superblock v3, new object headers) */
    int chunk;           /* chunk rows (0: contiguous) */
    int gzip, fletcher;  /* filters (with chunk) */
    hid_t ftype, ttype;  /* file types */
    int targ_rank1;
    const char *segments, *names; /* "1,3" and "a,b" attributes on features */
    int vlen_names;      /* segment_names as a variable-length string */
    int nan_at;          /* >= 0: a NaN in that sample's features */
    int soft_link;       /* features reached by a soft link */
    int compact_targets; /* targets in compact layout */
    int names_array;     /* > 0: segment_names as a 1-D array of that many strings (refused) */
} seed;

static hid_t dset(hid_t file, const char *name, hid_t type, int rank, const hsize_t *dims, const seed *s,
                  int compact) {
    hid_t sp = H5Screate_simple(rank, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(pl, 0); /* no timestamps: the same bytes on every run */
    if (compact) H5Pset_layout(pl, H5D_COMPACT);
    else if (s->chunk) {
        hsize_t cd[3] = {(hsize_t)s->chunk, rank > 1 ? dims[1] : 1, rank > 2 ? dims[2] : 1};
        H5Pset_chunk(pl, rank, cd);
        if (s->gzip) { H5Pset_shuffle(pl); H5Pset_deflate(pl, 4); }
        if (s->fletcher) H5Pset_fletcher32(pl);
    }
    hid_t d = H5Dcreate2(file, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Sclose(sp); H5Pclose(pl);
    return d;
}

/* Create dir/name (its path into path) with no timestamps, the root group's included (the same
 * input gives the same bytes); latest: the newest file format. Negative on failure. */
static hid_t create_file(const char *dir, const char *name, int latest, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (latest) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_obj_track_times(fcpl, 0);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    H5Pclose(fapl);
    H5Pclose(fcpl);
    return file;
}

static int write_seed(const char *dir, const seed *s) {
    char path[512];
    hid_t file = create_file(dir, s->name, s->latest, path, sizeof path);
    if (file < 0) return 1;
    float feat[8 * 6 * 3], targ[8 * 3];
    for (int i = 0; i < s->n * s->t * s->f; i++) feat[i] = (float)(i / (s->t * s->f)) + 0.25f * (float)(i % 7);
    for (int i = 0; i < s->n * s->k; i++) targ[i] = -(float)(i / s->k) - 0.5f * (float)(i % 3);
    if (s->nan_at >= 0) feat[s->nan_at * s->t * s->f + 1] = 0.0f / 0.0f;
    hsize_t fd[3] = {(hsize_t)s->n, (hsize_t)s->t, (hsize_t)s->f}, td[2] = {(hsize_t)s->n, (hsize_t)s->k};
    const char *fname = s->soft_link ? "data/features" : "features";
    if (s->soft_link) {
        hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
        H5Pset_obj_track_times(gcpl, 0);
        H5Gclose(H5Gcreate2(file, "data", H5P_DEFAULT, gcpl, H5P_DEFAULT));
        H5Pclose(gcpl);
    }
    hid_t df = dset(file, fname, s->ftype ? s->ftype : H5T_IEEE_F32LE, 3, fd, s, 0);
    hid_t dt = dset(file, "targets", s->ttype ? s->ttype : H5T_IEEE_F32LE, s->targ_rank1 ? 1 : 2, td, s,
                    s->compact_targets);
    if (s->soft_link) H5Lcreate_soft("/data/features", file, "features", H5P_DEFAULT, H5P_DEFAULT);
    int bad = df < 0 || dt < 0 || H5Dwrite(df, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, feat) < 0 ||
              H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, targ) < 0;
    if (s->segments) {
        int v[16], m = 0;
        for (const char *p = s->segments; p && m < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
            v[m] = 0;
            sscanf(p, "%d", &v[m]);
            m++;
        }
        hsize_t md = (hsize_t)m;
        hid_t sp = H5Screate_simple(1, &md, NULL);
        hid_t a = H5Acreate2(df, "segments", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        bad |= H5Awrite(a, H5T_NATIVE_INT, v) < 0;
        H5Aclose(a); H5Sclose(sp);
    }
    if (s->names) {
        hsize_t na = (hsize_t)s->names_array;
        const char *v[4] = {s->names, s->names, s->names, s->names};
        hid_t st = H5Tcopy(H5T_C_S1), sp = na ? H5Screate_simple(1, &na, NULL) : H5Screate(H5S_SCALAR);
        H5Tset_size(st, s->vlen_names ? H5T_VARIABLE : strlen(s->names));
        hid_t a = H5Acreate2(df, "segment_names", st, sp, H5P_DEFAULT, H5P_DEFAULT);
        bad |= (s->vlen_names ? H5Awrite(a, st, v) : H5Awrite(a, st, s->names)) < 0;
        H5Aclose(a); H5Sclose(sp); H5Tclose(st);
    }
    H5Dclose(df); H5Dclose(dt); H5Fclose(file);
    if (bad) fprintf(stderr, "gen_seeds: %s failed\n", path);
    return bad;
}

/* Files that reach the refusals the table above does not: a filter off the allow list
 * (scaleoffset), an absurd chunk, `segments` as floats, `segment_names` as an integer. */
static int write_extra(const char *dir, const char *name, const char *kind) {
    char path[512];
    hid_t file = create_file(dir, name, 0, path, sizeof path);
    if (file < 0) return 1;
    enum { N = 4, T = 2, F = 2, K = 1 };
    float feat[N * T * F], targ[N * K];
    for (int i = 0; i < N * T * F; i++) feat[i] = (float)i;
    for (int i = 0; i < N * K; i++) targ[i] = -(float)i;
    hsize_t fd[3] = {N, T, F}, td[2] = {N, K}, one = 1;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE), tpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(pl, 0);
    H5Pset_obj_track_times(tpl, 0);
    hid_t ftype = H5T_IEEE_F32LE;
    if (!strcmp(kind, "scaleoffset")) {
        hsize_t cd[3] = {2, T, F};
        H5Pset_chunk(pl, 3, cd);
        H5Pset_scaleoffset(pl, H5Z_SO_INT, H5Z_SO_INT_MINBITS_DEFAULT);
        ftype = H5T_STD_I16LE;
    } else if (!strcmp(kind, "bigchunk")) {
        hsize_t cd[3] = {1, T, 2048}; /* 2048 > 16 * F + 1024 */
        H5Pset_chunk(pl, 3, cd);
    }
    hsize_t unl[3] = {H5S_UNLIMITED, H5S_UNLIMITED, H5S_UNLIMITED}; /* a chunk may exceed the dims only then */
    hid_t s3 = H5Screate_simple(3, fd, strcmp(kind, "bigchunk") ? NULL : unl), s2 = H5Screate_simple(2, td, NULL), s1 = H5Screate_simple(1, &one, NULL);
    hid_t df = H5Dcreate2(file, "features", ftype, s3, H5P_DEFAULT, pl, H5P_DEFAULT);
    hid_t dt = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, s2, H5P_DEFAULT, tpl, H5P_DEFAULT);
    int big = !strcmp(kind, "bigchunk"); /* no data written: no chunk stored, a small file */
    int bad = df < 0 || dt < 0 || (!big && H5Dwrite(df, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, feat) < 0) ||
              H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, targ) < 0;
    if (!strcmp(kind, "segments_float") || !strcmp(kind, "names_int")) {
        int isf = kind[0] == 's';
        float fv = (float)T;
        int iv = 7;
        hid_t a = H5Acreate2(df, isf ? "segments" : "segment_names", isf ? H5T_IEEE_F32LE : H5T_STD_I32LE, s1,
                             H5P_DEFAULT, H5P_DEFAULT);
        bad |= H5Awrite(a, isf ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT, isf ? (const void *)&fv : (const void *)&iv) < 0;
        H5Aclose(a);
    }
    H5Sclose(s1); H5Sclose(s2); H5Sclose(s3); H5Pclose(pl); H5Pclose(tpl);
    H5Dclose(df); H5Dclose(dt); H5Fclose(file);
    if (bad) fprintf(stderr, "gen_seeds: %s failed\n", path);
    return bad;
}

/* Series-layout files (docs/SERIES.md): bars_0 (8, 2), bars_1 (4, 2), ends (5, 2) with
 * windows of 3 and 2 bars, targets (5, 1). kind: "valid", "f16_gzip" (16-bit bars, chunked,
 * deflate), "nan" (a NaN in a bar), "bad_index" (past the last bar), "decreasing". */
static int write_series(const char *dir, const char *name, const char *kind) {
    char path[512];
    hid_t file = create_file(dir, name, 0, path, sizeof path);
    if (file < 0) return 1;
    float b0[16], b1[8], targ[5];
    long long ends[10] = {2, 1, 3, 1, 4, 2, 6, 2, 7, 3};
    for (int i = 0; i < 16; i++) b0[i] = (float)i * 0.25f;
    for (int i = 0; i < 8; i++) b1[i] = -(float)i;
    for (int i = 0; i < 5; i++) targ[i] = (float)i;
    if (!strcmp(kind, "nan")) b0[9] = 0.0f / 0.0f;
    if (!strcmp(kind, "bad_index")) ends[8] = 8;
    if (!strcmp(kind, "decreasing")) ends[7] = 1;
    int f16 = !strcmp(kind, "f16_gzip");
    hid_t bt = H5Tcopy(H5T_IEEE_F32LE);
    if (f16) { H5Tset_fields(bt, 15, 10, 5, 0, 10); H5Tset_size(bt, 2); H5Tset_ebias(bt, 15); }
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE), bp = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(pl, 0);
    H5Pset_obj_track_times(bp, 0);
    if (f16) { hsize_t cd[2] = {2, 2}; H5Pset_chunk(bp, 2, cd); H5Pset_deflate(bp, 4); }
    hsize_t d0[2] = {8, 2}, d1[2] = {4, 2}, de[2] = {5, 2}, dt[2] = {5, 1}, two = 2;
    hid_t s0 = H5Screate_simple(2, d0, NULL), s1 = H5Screate_simple(2, d1, NULL), se = H5Screate_simple(2, de, NULL),
          st = H5Screate_simple(2, dt, NULL), sa = H5Screate_simple(1, &two, NULL);
    hid_t x0 = H5Dcreate2(file, "bars_0", bt, s0, H5P_DEFAULT, bp, H5P_DEFAULT);
    hid_t x1 = H5Dcreate2(file, "bars_1", bt, s1, H5P_DEFAULT, bp, H5P_DEFAULT);
    hid_t xe = H5Dcreate2(file, "ends", H5T_STD_I64LE, se, H5P_DEFAULT, pl, H5P_DEFAULT);
    hid_t xt = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, pl, H5P_DEFAULT);
    int seg[2] = {3, 2};
    hid_t a = H5Acreate2(xe, "segments", H5T_STD_I32LE, sa, H5P_DEFAULT, H5P_DEFAULT);
    int bad = x0 < 0 || x1 < 0 || xe < 0 || xt < 0 || a < 0 || H5Awrite(a, H5T_NATIVE_INT, seg) < 0 ||
              H5Dwrite(x0, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b0) < 0 ||
              H5Dwrite(x1, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b1) < 0 ||
              H5Dwrite(xe, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, ends) < 0 ||
              H5Dwrite(xt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, targ) < 0;
    H5Aclose(a); H5Dclose(x0); H5Dclose(x1); H5Dclose(xe); H5Dclose(xt); H5Tclose(bt); H5Pclose(pl); H5Pclose(bp);
    H5Sclose(s0); H5Sclose(s1); H5Sclose(se); H5Sclose(st); H5Sclose(sa); H5Fclose(file);
    if (bad) fprintf(stderr, "gen_seeds: %s failed\n", path);
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: gen_seeds DIR\n"); return 2; }
    const seed seeds[] = {
        /* name                  n  t  f  k  lat chunk gz fl ftype            ttype            r1 segs   names  vl nan sl ct [arr] */
        {"contig_f32.h5",        5, 4, 3, 2, 0, 0,    0, 0, 0,               0,               0, NULL,  NULL,  0, -1, 0, 0, 0},
        {"contig_n1.h5",         1, 2, 2, 1, 0, 0,    0, 0, 0,               0,               0, NULL,  NULL,  0, -1, 0, 0, 0},
        {"chunk_gzip.h5",        6, 4, 3, 2, 0, 2,    1, 0, 0,               0,               0, NULL,  NULL,  0, -1, 0, 0, 0},
        {"latest_fletcher.h5",   5, 3, 2, 2, 1, 2,    0, 1, 0,               0,               0, NULL,  NULL,  0, -1, 0, 0, 0},
        {"latest_gzip_segs.h5",  4, 4, 2, 1, 1, 3,    1, 0, 0,               0,               1, "1,3", NULL,  0, -1, 0, 0, 0},
        {"types_i16_f64.h5",     5, 3, 3, 2, 0, 0,    0, 0, H5T_STD_I16LE,   H5T_IEEE_F64LE,  0, NULL,  NULL,  0, -1, 0, 0, 0},
        {"types_be.h5",          4, 2, 3, 1, 1, 0,    0, 0, H5T_IEEE_F32BE,  H5T_STD_U8LE,    1, NULL,  NULL,  0, -1, 0, 0, 0},
        {"segments_names.h5",    5, 6, 2, 2, 0, 0,    0, 0, 0,               0,               0, "2,4", "m1,m5", 0, -1, 0, 0, 0},
        {"segments_vlen.h5",     5, 6, 2, 2, 1, 2,    0, 0, 0,               0,               0, "1,2,3", "a,b,c", 1, -1, 0, 0, 0},
        {"nan_sample2.h5",       6, 4, 3, 2, 0, 0,    0, 0, 0,               0,               0, NULL,  NULL,  0, 2, 0, 0, 0},
        {"soft_link.h5",         4, 2, 2, 1, 0, 0,    0, 0, 0,               0,               0, NULL,  NULL,  0, -1, 1, 0, 0},
        {"compact_targets.h5",   4, 2, 2, 1, 0, 0,    0, 0, 0,               0,               0, NULL,  NULL,  0, -1, 0, 1, 0},
        {"names_array.h5",       4, 4, 2, 1, 0, 0,    0, 0, 0,               0,               0, "1,3", "a,b", 1, -1, 0, 0, 3},
    };
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int bad = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) bad |= write_seed(argv[1], &seeds[i]);
    bad |= write_extra(argv[1], "filter_scaleoffset.h5", "scaleoffset");
    bad |= write_extra(argv[1], "chunk_too_big.h5", "bigchunk");
    bad |= write_extra(argv[1], "segments_float.h5", "segments_float");
    bad |= write_extra(argv[1], "names_int.h5", "names_int");
    const char *series[] = {"valid", "f16_gzip", "nan", "bad_index", "decreasing"};
    for (size_t i = 0; i < sizeof series / sizeof *series; i++) {
        char name[64];
        snprintf(name, sizeof name, "series_%s.h5", series[i]);
        bad |= write_series(argv[1], name, series[i]);
    }
    return bad;
}
