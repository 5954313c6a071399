/* bench_dist.c - the gradient all-reduce alone (mb_dist_allreduce_grads, CPU backend):
 * median, min and max microseconds per call over REPS calls for flat buffers of the
 * given sizes (floats), and the bytes each rank sends per call. MPI build only:
 *   make build/bench/bench_dist_mpi
 *   mpirun -np 2 build/bench/bench_dist_mpi [REPS] [N ...]   (default: 12160 39552 2313536)
 * 12160 and 39552: the example's parameters (make run's shape and its defaults);
 * 2313536: the seeds' shape (5 encoders F=128 H=256, head 256, K=36). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mb_args.h"
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static mb_result bench(mb_dist *d, mb_device *dev, int64_t n, int reps, double *t) {
    mb_params *p = NULL;
    int idx;
    MB_TRY(mb_params_create(&p, dev));
    mb_result r = mb_params_add(p, "w", 1, &n, 0.1f, &idx);
    if (r == MB_OK) r = mb_params_finalize(p);
    for (int i = 0; r == MB_OK && i <= reps; i++) {
        float loss = 1;
        if (r == MB_OK) r = mb_dist_barrier(d);
        double t0 = mb__seconds();
        if (r == MB_OK) r = mb_dist_allreduce_grads(d, p, 32, &loss, NULL);
        if (i) t[i - 1] = 1e6 * (mb__seconds() - t0); /* the first call allocates: not timed */
    }
    mb_params_destroy(p);
    return r;
}

static const char usage[] =
    "usage: [mpirun -np N] " MBA_TOOL("bench_dist") " [REPS [N ...]]   defaults 50 calls, 12160 39552 2313536 floats\n"
    "The gradient all-reduce alone: microseconds per call over REPS calls for buffers of N floats\n"
    "(docs/DIST.md). -h, --help: this text.\n";

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    for (int i = 1; i < argc; i++) if (mba_flag_like(argv[i])) return mba_unknown(argv[i]);
    int reps = 50;
    static int64_t sizes[64] = {12160, 39552, 2313536};
    if (argc > 1 && !mba_arg("REPS", argv[1], MBA_INT, &reps, 1, 1e6, NULL)) return 2;
    if (argc > 2 + 64) return mba_error("more than 64 sizes (see --help)");
    for (int i = 2; i < argc; i++)
        if (!mba_arg("N", argv[i], MBA_I64, &sizes[i - 2], 1, 1e9, NULL)) return 2;
    mb_device *dev;
    mb_dist *d;
    if (mb_device_open(&dev, NULL) != MB_OK || mb_dist_open(&d, dev) != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 2;
    }
    int lead = mb_dist_rank(d) == 0;
    if (mb_dist_size(d) < 2) {
        if (lead) printf("bench_dist: a world of one (build with mpicc -DMEGABATCH_MPI, run under mpirun -np N >= 2)\n");
        mb_dist_close(d);
        mb_device_close(dev);
        return 0;
    }
    int nsizes = argc > 2 ? argc - 2 : 3;
    double *t = (double *)malloc((size_t)reps * sizeof(double));
    if (!t) return 1;
    if (lead) printf("ranks %d, %d calls each: floats, bytes sent per rank per call, us median [min-max], MB/s (sent/median)\n",
                     mb_dist_size(d), reps);
    for (int s = 0; s < nsizes; s++) {
        int64_t n = sizes[s];
        uint64_t sent0 = mb_dist_get_stats(d).bytes_sent;
        if (bench(d, dev, n, reps, t) != MB_OK) {
            fprintf(stderr, "error: %s\n", mb_last_error());
            mb_dist_abort(d, 1);
            return 1;
        }
        double per = (double)(mb_dist_get_stats(d).bytes_sent - sent0) / (reps + 1);
        qsort(t, (size_t)reps, sizeof *t, cmp);
        if (lead) printf("%lld floats: %.0f bytes, %.1f us [%.1f-%.1f], %.0f MB/s\n", (long long)n, per, t[reps / 2], t[0],
                         t[reps - 1], per / t[reps / 2]);
    }
    free(t);
    mb_dist_close(d);
    mb_device_close(dev);
    return 0;
}
