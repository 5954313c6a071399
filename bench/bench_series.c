/* bench_series: the window layout against the series layout (docs/SERIES.md) on the same
 * samples: file size, open time, loader epoch time, bytes read from the file and bytes
 * copied host -> device per epoch, device bytes held. The layouts alternate, rep by rep.
 *
 *   build/prepare --synthetic --features 128 --stride 1 ... --layout window --out-train W.h5 ...
 *   build/prepare ... --layout series --out-train S.h5 ...
 *   build/bench/bench_series      --window W.h5 --series S.h5 [flags]        (CPU backend)
 *   build/bench/bench_series_cuda --window W.h5 --series S.h5 --gpu [flags]  (CUDA, or the simulator)
 *
 * Flags [defaults]: --batch [32] --epochs per open [2] --reps [3] --chunk-mb loader budget
 * (chunk_bytes; 0: 75% of free memory) [0] --shuffle. Each epoch runs every batch and waits
 * for the device (a sync) at its end; no model runs, so the time is the data path's alone.
 * 1 MB = 1e6 bytes. Under the simulator the CUDA build prints its counters (bytes_h2d) at exit. */
#define _POSIX_C_SOURCE 200809L
#define MEGABATCH_IMPLEMENTATION
#ifdef __CUDACC__
#include "megabatch_cuda.cuh"
#else
#include "megabatch.h"
#endif
#include "examples/mb_args.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Under the simulator: its host -> device byte counter (MB); -1 elsewhere. */
#ifdef CUDASIM
static double sim_h2d_mb(void) { return (double)cudasim::get_stats().bytes_h2d / 1e6; }
#else
static double sim_h2d_mb(void) { return -1; }
#endif

static long long file_bytes(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long long)sb.st_size : -1;
}

typedef struct opts { const char *file[2]; int64_t batch; int epochs, reps, gpu, shuffle; double chunk_mb; } opts;

/* One open + `epochs` epochs of one layout; prints one line per epoch. */
static int run(mb_device *dev, const opts *o, int layout) {
    static const char *name[2] = {"window", "series"};
    double t0 = mba_now();
    mb_dataset *ds = NULL;
    mb_loader *ld = NULL;
    mb_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = o->batch;
    lc.shuffle = o->shuffle;
    lc.seed = 1;
    lc.chunk_bytes = (size_t)(o->chunk_mb * 1e6);
    mb_result r = mba_open_data(o->file[layout], 0, &ds); /* probed once in main: the open time is the layout's */
    if (r == MB_OK) r = mb_loader_open(&ld, dev, ds, &lc);
    if (r != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); mb_dataset_close(ds); return 1; }
    double t1 = mba_now();
    const mb_chunk_plan *p = mb_loader_get_plan(ld);
    printf("%-6s open %.3f s  N %lld  device bytes %.1f MB  chunks %lld\n", name[layout], t1 - t0,
           (long long)mb_dataset_info(ds)->n, (double)(p->buffers * p->chunk_bytes) / 1e6, (long long)p->chunks);
    mb_loader_stats prev = mb_loader_get_stats(ld);
    double h2d = sim_h2d_mb();
    for (int e = 0; e < o->epochs && r == MB_OK; e++) {
        double s = mba_now();
        int64_t samples = 0;
        mb_batch b;
        while ((r = mb_loader_next(ld, &b)) == MB_OK && !b.end_of_epoch) samples += b.count;
        if (r == MB_OK) r = mb_sync(dev, -1);
        double el = mba_now() - s;
        mb_loader_stats st = mb_loader_get_stats(ld);
        printf("%-6s epoch %d  %.3f s  %.0f samples/s  read %.1f MB  copied %.1f MB", name[layout], e, el,
               (double)samples / el, (double)(st.bytes_read - prev.bytes_read) / 1e6,
               (double)(st.bytes_copied - prev.bytes_copied) / 1e6);
        if (h2d >= 0) printf("  (simulator H2D %.1f MB)", sim_h2d_mb() - h2d);
        printf("\n");
        h2d = sim_h2d_mb();
        prev = st;
    }
    mb_loader_stats st = mb_loader_get_stats(ld);
    printf("%-6s total read %.1f MB  copied %.1f MB (open included)\n", name[layout], (double)st.bytes_read / 1e6,
           (double)st.bytes_copied / 1e6);
    if (r != MB_OK) fprintf(stderr, "error: %s\n", mb_last_error());
    mb_loader_close(ld);
    mb_dataset_close(ds);
    return r != MB_OK;
}

static const char usage[] =
    "usage: " MBA_TOOL("bench_series") " --window W.h5 --series S.h5 [--batch 32] [--epochs 2] [--reps 3] [--chunk-mb 0]\n"
    "       [--shuffle] [--gpu]\n"
    "The window layout against the series layout on the same samples (docs/SERIES.md): file\n"
    "size, open time, loader epoch time, bytes read and copied. The files are checked in a child\n"
    "process first. -h, --help: this text.\n";

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    opts o = {{NULL, NULL}, 32, 2, 3, 0, 0, 0};
    const mba_flag flags[] = {
        {"--window", MBA_STR, &o.file[0], 0, 0, NULL}, {"--series", MBA_STR, &o.file[1], 0, 0, NULL},
        {"--batch", MBA_I64, &o.batch, 1, 1e6, NULL}, {"--epochs", MBA_INT, &o.epochs, 1, 1e4, NULL},
        {"--reps", MBA_INT, &o.reps, 1, 1e4, NULL}, {"--chunk-mb", MBA_F64, &o.chunk_mb, 0, 1e9, NULL},
        {"--gpu", MBA_SET, &o.gpu, 0, 0, NULL}, {"--shuffle", MBA_SET, &o.shuffle, 0, 0, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 2;
    if (!o.file[0] || !o.file[1]) return mba_error("give --window FILE and --series FILE (see --help)");
    for (int l = 0; l < 2; l++) { /* each file through the probe once, before the timed opens */
        mb_dataset *ds = NULL;
        if (mba_open_data(o.file[l], 1, &ds) != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
        mb_dataset_close(ds);
    }
    long long w = file_bytes(o.file[0]), s = file_bytes(o.file[1]);
    printf("files: window %lld bytes, series %lld bytes: %.1fx smaller\n", w, s, (double)w / (double)s);
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = o.gpu ? MB_CUDA : MB_CPU;
    mb_device *dev = NULL;
    if (mb_device_open(&dev, &dc) != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
    printf("device: %s, batch %lld, %d epochs per open, %d reps, shuffle %d\n", mb_device_name(dev),
           (long long)o.batch, o.epochs, o.reps, o.shuffle);
    int bad = 0;
    for (int rep = 0; rep < o.reps && !bad; rep++)
        for (int l = 0; l < 2 && !bad; l++) bad = run(dev, &o, rep % 2 ? 1 - l : l); /* alternate the order */
    mb_device_close(dev);
    return bad ? 2 : 0;
}
