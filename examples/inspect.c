/* inspect - validate an HDF5 training file and print its shape and the chunk plan.
 *
 *   build/inspect FILE.h5 [--gpu-mem GB] [--batch B] [--dtype f32|bf16] [--no-probe] [--help]
 *
 * The file is first validated in a child process (mb_dataset_probe), so a file that
 * crashes or hangs the HDF5 library ends in an error line, not in a crash of inspect;
 * --no-probe skips that (it saves a fork, a few ms) for trusted files.
 * Prints N, T, F, K, segments, bytes per sample, dataset size and the loader's chunk
 * plan for a GPU with GB gigabytes free (default 16; 1 GB = 1e9 bytes, as in the seeds).
 * Exit 0 for a valid file; exit 2 with one line "error: ..." on stderr otherwise. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "mb_args.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: inspect FILE.h5 [--gpu-mem GB] [--batch B] [--dtype f32|bf16] [--no-probe]\n"
    "Validates an HDF5 training file and prints N, T, F, K, the segments, bytes per sample,\n"
    "the dataset size and the loader's chunk plan for a GPU with GB free (docs/LOADER.md).\n"
    "  --gpu-mem GB         free GPU memory, 1 GB = 1e9 bytes [16]\n"
    "  --batch B            batch size of the plan [128]\n"
    "  --dtype f32|bf16     the loader's device dtype [f32]\n"
    "  --no-probe           skip the validation in a child process (trusted files only)\n"
    "  -h, --help           this text\n"
    "Exit 0 for a valid file, 2 with one line `error: ...` on stderr otherwise.\n";

int main(int argc, char **argv) {
    if (mba_wants_help(argc, argv)) return mba_help(usage);
    static const char *const dtypes[] = {"f32", "bf16", NULL};
    const char *path = NULL;
    double gb = 16;
    int64_t batch = 128;
    int dt = 0, no_probe = 0;
    const mba_flag flags[] = {
        {"", MBA_STR, &path, 0, 0, NULL}, {"--gpu-mem", MBA_F64, &gb, 1e-9, 1e6, NULL},
        {"--batch", MBA_I64, &batch, 1, 1e8, NULL}, {"--dtype", MBA_CHOICE, &dt, 0, 0, dtypes},
        {"--no-probe", MBA_SET, &no_probe, 0, 0, NULL}};
    if (!mba_parse(argc, argv, flags, (int)(sizeof flags / sizeof *flags))) return 2;
    if (!path) return mba_error("no file given (see --help)");
    mb_dtype dtype = dt ? MB_BF16 : MB_F32;
    mb_dataset *ds = NULL;
    if (mba_open_data(path, !no_probe, &ds) != MB_OK) return mba_fail(mb_last_error()); /* the user's words */
    const mb_dataset_meta *m = mb_dataset_info(ds);
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = batch;
    c.dtype = dtype;
    mb_chunk_plan p;
    if (mb_loader_plan(m->n, m->t, m->f, m->k, &c, (size_t)(gb * 1e9), &p) != MB_OK) {
        mba_fail(mb_last_error());
        mb_dataset_close(ds);
        return 2;
    }
    printf("file:             %s\n", m->source);
    printf("samples N:        %lld\n", (long long)m->n);
    printf("time steps T:     %lld\n", (long long)m->t);
    printf("features F:       %lld (%s on disk)\n", (long long)m->f, m->features_type);
    printf("targets K:        %lld (%s on disk)\n", (long long)m->k, m->targets_type);
    printf("segments:         ");
    if (!m->segments) printf("none");
    for (int i = 0; i < m->segments; i++)
        printf("%s%s%s%lld", i ? ", " : "", m->segment_name[i], m->segment_name[i][0] ? "=" : "",
               (long long)m->segment_len[i]);
    printf("\n");
    if (m->layout == MB_LAYOUT_SERIES) { /* docs/SERIES.md */
        printf("layout:           series, bars per timeframe:");
        for (int i = 0; i < m->segments; i++) printf(" %lld", (long long)m->bars[i]);
        printf(" (resident on the device when they fit; the plan below is the window fallback's)\n");
    }
    printf("bytes/sample:     %zu (%s on the device)\n", p.bytes_per_sample, mb_dtype_name(dtype));
    printf("dataset size:     %.3f GB (%zu bytes as float32%s)\n", (double)m->total_bytes / 1e9, m->total_bytes,
           m->layout == MB_LAYOUT_SERIES ? ": bars, ends, targets" : "");
    printf("plan for %.1f GB: budget %.3f GB (75%%), %s\n", gb, (double)p.budget_bytes / 1e9,
           p.buffers == 1 ? "resident (loaded once)" : "2 chunk buffers (double-buffered)");
    printf("chunks:           %lld of %lld samples (%.3f GB each)\n", (long long)p.chunks,
           (long long)p.samples_per_chunk, (double)p.chunk_bytes / 1e9);
    printf("batches/epoch:    %lld of %lld\n", (long long)p.batches, (long long)batch);
    mb_dataset_close(ds);
    return 0;
}
