/* bench_loader: HDF5 -> device loader throughput against the raw file read rate and the
 * raw pinned -> device copy rate, all measured in one run on one file it writes itself,
 * and how much of the next chunk's load hides behind a simulated compute load.
 *
 *   build/bench/bench_loader      [flags]          (CPU backend, cc)
 *   build/bench/bench_loader_cuda [flags] --gpu    (CUDA, nvcc: the same source)
 *
 * Flags (defaults in brackets): --bytes MiB of the file [256; 1024 with --gpu]
 * --batch [32] --chunk-mb loader budget (chunk_bytes; two buffers of half of it) [bytes/2,
 * i.e. about 4 chunks] --slab-mb staging slabs and the copy test [64] --compute-ms per
 * batch [20] --epochs [2] --t [1104] --f [128] --file [./bench_loader.h5] --keep --gpu.
 * Samples are (T, F) float32 rows plus K = 1 target: T = 1104 is the multi-timeframe
 * layout (480+288+192+96+48 bars), 565 KB per sample with F = 128.
 * Page cache: before each "cold" pass the file gets posix_fadvise(DONTNEED) (after an
 * fsync when written); the fraction of its pages resident just before a pass (mincore)
 * is printed, so a pass the kernel did not drop shows as warm. 1 MB = 1e6 bytes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#else
#include "megabatch.h"
#endif
#include "examples/mb_args.h"
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_opts {
    double mib, chunk_mb, slab_mb, compute_ms;
    int64_t batch, t, f;
    int epochs, keep, gpu;
    const char *file;
} bench_opts;

static int die(const char *what) {
    fprintf(stderr, "error: %s: %s\n", what, mb_last_error());
    return 1;
}

// ---- options ----

static const char usage[] =
    "usage: " MBA_TOOL("bench_loader") " [--bytes MiB] [--batch 32] [--chunk-mb MiB] [--slab-mb 64] [--compute-ms 20]\n"
    "       [--epochs 2] [--t 1104] [--f 128] [--file bench_loader.h5] [--keep] [--gpu]\n"
    "HDF5 -> device loader throughput against the file read rate and the pinned -> device copy\n"
    "rate, on a file it writes itself (--file, removed unless --keep), and how much of the next\n"
    "chunk's load hides behind a simulated compute load (docs/BENCHMARKS.md). --bytes [256;\n"
    "1024 with --gpu], --chunk-mb [bytes/2]. -h, --help: this text.\n";

static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->batch = 32; o->t = 1104; o->f = 128; o->epochs = 2; o->slab_mb = 64; o->compute_ms = 20;
    o->file = "bench_loader.h5";
    const mba_flag flags[] = {
        {"--keep", MBA_SET, &o->keep, 0, 0, NULL}, {"--gpu", MBA_SET, &o->gpu, 0, 0, NULL},
        {"--file", MBA_STR, &o->file, 0, 0, NULL}, {"--bytes", MBA_F64, &o->mib, 1, 1e6, NULL},
        {"--chunk-mb", MBA_F64, &o->chunk_mb, 1, 1e6, NULL}, {"--slab-mb", MBA_F64, &o->slab_mb, 1, 1e5, NULL},
        {"--compute-ms", MBA_F64, &o->compute_ms, 0, 1e4, NULL}, {"--batch", MBA_I64, &o->batch, 1, 1e6, NULL},
        {"--epochs", MBA_INT, &o->epochs, 1, 8, NULL}, {"--t", MBA_I64, &o->t, 1, 1e6, NULL},
        {"--f", MBA_I64, &o->f, 1, 1e6, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 0;
#ifndef __CUDACC__
    if (o->gpu) return mba_error("--gpu: this build has no CUDA (use build/bench/bench_loader_cuda)"), 0;
#endif
    if (!mba_writable("--file", o->file)) return 0;
    if (o->mib == 0) o->mib = o->gpu ? 1024 : 256;
    if (o->chunk_mb == 0) o->chunk_mb = o->mib / 2;
    return 1;
}

// ---- file ----

/* Write features (n, t, f) and targets (n, 1) as contiguous float32, then fsync. */
static int write_file(const bench_opts *o, int64_t n) {
    hid_t file = H5Fcreate(o->file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) { fprintf(stderr, "error: cannot create %s\n", o->file); return 1; }
    hsize_t fd[3] = {(hsize_t)n, (hsize_t)o->t, (hsize_t)o->f}, td[2] = {(hsize_t)n, 1};
    hid_t fs = H5Screate_simple(3, fd, NULL), ts = H5Screate_simple(2, td, NULL);
    hid_t df = H5Dcreate2(file, "features", H5T_IEEE_F32LE, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dt = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, ts, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    size_t row = (size_t)(o->t * o->f);
    float *buf = (float *)malloc(row * sizeof(float)), *targ = (float *)malloc((size_t)n * sizeof(float));
    int bad = df < 0 || dt < 0 || !buf || !targ;
    for (int64_t i = 0; i < n && !bad; i++) { /* one sample per write: small host memory */
        for (size_t j = 0; j < row; j++) buf[j] = mb_rng_symmetric(7, (uint64_t)i, j, 1.0f);
        targ[i] = buf[0];
        hsize_t start[3] = {(hsize_t)i, 0, 0}, count[3] = {1, (hsize_t)o->t, (hsize_t)o->f};
        hid_t ms = H5Screate_simple(3, count, NULL);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        bad = H5Dwrite(df, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0;
        H5Sclose(ms);
    }
    if (!bad) bad = H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, targ) < 0;
    free(buf); free(targ);
    H5Dclose(df); H5Dclose(dt); H5Sclose(fs); H5Sclose(ts);
    if (H5Fclose(file) < 0 || bad) { fprintf(stderr, "error: writing %s failed\n", o->file); return 1; }
    int fd_ = open(o->file, O_RDONLY);
    if (fd_ < 0 || fsync(fd_) != 0) { fprintf(stderr, "error: fsync %s: %s\n", o->file, strerror(errno)); return 1; }
    close(fd_);
    return 0;
}

/* Fraction of the file's pages in the page cache (mincore), -1 if unknown. */
static double resident(const char *path) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) { if (fd >= 0) close(fd); return -1; }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = ((size_t)st.st_size + pg - 1) / pg, in = 0;
    unsigned char *v = (unsigned char *)malloc(np);
    double r = -1;
    if (v && mincore(m, (size_t)st.st_size, v) == 0) {
        for (size_t i = 0; i < np; i++) in += v[i] & 1;
        r = (double)in / (double)np;
    }
    free(v);
    munmap(m, (size_t)st.st_size);
    return r;
}

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* One plain read() pass of the whole file into buf; returns MB/s, 0 on failure. */
static double read_pass(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    double t0 = mba_now();
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    double dt = mba_now() - t0;
    close(fd);
    return got == size ? (double)size / dt / 1e6 : 0;
}

// ---- copy ----

/* Raw pinned slab -> device copies on MB_STREAM_COPY, synced: at least `total` bytes. */
static int copy_rate(mb_device *dev, size_t slab, size_t total, double *mbs) {
    void *src = NULL, *dst = NULL;
    if (mb_alloc(dev, MB_MEM_PINNED, slab, &src) || mb_alloc(dev, MB_MEM_DEVICE, slab, &dst)) {
        mb_free(dev, src);
        return die("copy test allocation");
    }
    memset(src, 1, slab);
    int reps = (int)((total + slab - 1) / slab);
    if (mb_copy(dev, MB_STREAM_COPY, dst, src, slab) || mb_sync(dev, MB_STREAM_COPY)) return die("warm-up copy");
    double t0 = mba_now();
    for (int i = 0; i < reps; i++)
        if (mb_copy(dev, MB_STREAM_COPY, dst, src, slab)) return die("mb_copy");
    if (mb_sync(dev, MB_STREAM_COPY)) return die("mb_sync");
    *mbs = (double)slab * reps / (mba_now() - t0) / 1e6;
    mb_free(dev, src);
    mb_free(dev, dst);
    return 0;
}

// ---- compute ----

#ifdef __CUDACC__
__global__ void bench_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
#endif

/* The simulated training step: ms of busy work on the compute "stream", host-synced. */
static int compute(mb_device *dev, double ms) {
    (void)dev;
    if (ms <= 0) return 0;
#ifdef __CUDACC__
    if (mb_device_backend(dev) == MB_CUDA) {
        int khz = 0;
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
        cudaStream_t s = (cudaStream_t)mb_device_stream(dev, MB_STREAM_COMPUTE);
        MB_LAUNCH(bench_spin, 1, 1, 0, s)((long long)(ms * khz));
        if (cudaGetLastError() != cudaSuccess) { fprintf(stderr, "error: spin kernel launch\n"); return 1; }
        return mb_sync(dev, MB_STREAM_COMPUTE) ? die("mb_sync compute") : 0;
    }
#endif
    double t0 = mba_now();
    while ((mba_now() - t0) * 1e3 < ms) { }
    return 0;
}

// ---- loader ----

typedef struct loader_run {
    double mbs[8], res[8];     /* per epoch: MB/s of delivered batches, resident fraction before */
    double wait, first_wait;   /* stats.wait_seconds in all, and for the first chunk */
    double seconds;            /* wall time of all epochs */
    mb_chunk_plan plan;
} loader_run;

static int run_loader(mb_device *dev, const bench_opts *o, double ms, loader_run *r) {
    mb_dataset *ds;
    mb_loader *ld;
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    memset(r, 0, sizeof *r);
    lc.batch = o->batch;
    lc.chunk_bytes = (size_t)(o->chunk_mb * 1048576.0);
    lc.slab_bytes = (size_t)(o->slab_mb * 1048576.0);
    drop_cache(o->file);
    if (mba_open_data(o->file, 1, &ds)) return die("opening the file"); /* the one way (it wrote the file itself) */
    if (mb_loader_open(&ld, dev, ds, &lc)) { mb_dataset_close(ds); return die("mb_loader_open"); }
    r->plan = *mb_loader_get_plan(ld);
    size_t bps = mb_dataset_info(ds)->bytes_per_sample;
    double t_all = mba_now();
    for (int e = 0; e < o->epochs && e < 8; e++) {
        r->res[e] = resident(o->file);
        double t0 = mba_now(), bytes = 0;
        mb_batch b;
        for (;;) {
            if (mb_loader_next(ld, &b)) { mb_loader_close(ld); mb_dataset_close(ds); return die("mb_loader_next"); }
            if (b.end_of_epoch) break;
            if (e == 0 && b.index == 0) r->first_wait = mb_loader_get_stats(ld).wait_seconds;
            bytes += (double)b.count * (double)bps;
            if (compute(dev, ms)) { mb_loader_close(ld); mb_dataset_close(ds); return 1; }
        }
        r->mbs[e] = bytes / (mba_now() - t0) / 1e6;
    }
    r->seconds = mba_now() - t_all;
    r->wait = mb_loader_get_stats(ld).wait_seconds;
    mb_loader_close(ld);
    mb_dataset_close(ds);
    return 0;
}

// ---- main ----

static const char *warmth(double f) { return f < 0 ? "unknown" : f < 0.05 ? "cold" : f > 0.95 ? "warm" : "partly warm"; }

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    bench_opts o;
    if (!parse(argc, argv, &o)) return 2;
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = o.gpu ? MB_CUDA : MB_CPU;
    mb_device *dev;
    if (mb_device_open(&dev, &dc)) return die("mb_device_open");
    size_t bps = (size_t)(o.t * o.f + 1) * 4;
    int64_t n = (int64_t)(o.mib * 1048576.0 / (double)bps);
    if (n < o.batch) n = o.batch;
    printf("device: %s\nfile: %s, N=%lld T=%lld F=%lld K=1, %zu bytes/sample, %.1f MB of data\n",
           mb_device_name(dev), o.file, (long long)n, (long long)o.t, (long long)o.f, bps, n * (double)bps / 1e6);
    double t0 = mba_now();
    if (write_file(&o, n)) return 1;
    struct stat st;
    stat(o.file, &st);
    size_t fsize = (size_t)st.st_size;
    printf("wrote %zu bytes in %.1f s\n", fsize, mba_now() - t0);

    char *hbuf = (char *)malloc(fsize);
    if (!hbuf) { fprintf(stderr, "error: no host memory for %zu bytes\n", fsize); return 1; }
    memset(hbuf, 0, fsize); /* fault the pages in: the passes time the read, not the page faults */
    drop_cache(o.file);
    double res_cold = resident(o.file), read_cold = read_pass(o.file, hbuf, fsize);
    double res_warm = resident(o.file), read_warm = read_pass(o.file, hbuf, fsize);
    free(hbuf);
    if (read_cold == 0 || read_warm == 0) { fprintf(stderr, "error: reading %s failed\n", o.file); return 1; }

    double copy = 0;
    size_t slab = (size_t)(o.slab_mb * 1048576.0);
    if (copy_rate(dev, slab, fsize > slab ? fsize : slab, &copy)) return 1;

    loader_run plain, busy;
    if (run_loader(dev, &o, 0, &plain) || run_loader(dev, &o, o.compute_ms, &busy)) return 1;
    printf("loader plan: batch %lld, budget %zu bytes -> %d buffer(s), %lld chunks of %lld samples, %lld "
           "batches/epoch, slabs %zu bytes, %d epochs\n\n", (long long)o.batch, plain.plan.budget_bytes,
           plain.plan.buffers, (long long)plain.plan.chunks, (long long)plain.plan.samples_per_chunk,
           (long long)plain.plan.batches, slab, o.epochs);

    printf("%-44s %10s  %s\n", "measure", "MB/s", "notes");
    printf("%-44s %10.0f  page cache %s (%.0f%% resident) after DONTNEED\n", "read() whole file, pass 1", read_cold,
           warmth(res_cold), 100 * res_cold);
    printf("%-44s %10.0f  page cache %s (%.0f%% resident)\n", "read() whole file, pass 2", read_warm,
           warmth(res_warm), 100 * res_warm);
    printf("%-44s %10.0f  %zu-byte slab, MB_STREAM_COPY, synced\n", "copy pinned -> device", copy, slab);
    for (int e = 0; e < o.epochs && e < 8; e++) {
        double ref = plain.res[e] > 0.95 ? read_warm : read_cold;
        double lim = ref < copy ? ref : copy;
        char what[64];
        snprintf(what, sizeof what, "loader end to end, epoch %d", e + 1);
        printf("%-44s %10.0f  %.0f%% of min(read %s, copy); page cache %s (%.0f%%)\n", what, plain.mbs[e],
               100 * plain.mbs[e] / lim, plain.res[e] > 0.95 ? "warm" : "cold", warmth(plain.res[e]),
               100 * plain.res[e]);
    }
    double exp0 = plain.wait - plain.first_wait, exp1 = busy.wait - busy.first_wait;
    int64_t batches = plain.plan.batches * o.epochs;
    printf("\nhiding (%lld batches, compute %.1f ms/batch = %.2f s; file dropped from the cache before each run):\n",
           (long long)batches, o.compute_ms, batches * o.compute_ms / 1e3);
    printf("  no compute:   wall %.3f s, wait %.3f s (first chunk %.3f s, later chunks %.3f s)\n", plain.seconds,
           plain.wait, plain.first_wait, exp0);
    printf("  with compute: wall %.3f s, wait %.3f s (first chunk %.3f s, later chunks %.3f s)\n", busy.seconds,
           busy.wait, busy.first_wait, exp1);
    if (exp0 > 0)
        printf("  hidden fraction of the later chunks' load: %.1f%%  (1 - %.3f / %.3f)\n", 100 * (1 - exp1 / exp0),
               exp1, exp0);
    else
        printf("  hidden fraction: n/a (a single chunk: nothing loads behind compute)\n");
    if (!o.keep) remove(o.file);
    mb_device_close(dev);
    return 0;
}
