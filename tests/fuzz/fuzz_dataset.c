/* fuzz_dataset.c - libFuzzer target: bytes -> an HDF5 file -> mb_dataset_open_file
 * (validation) -> reads of the first and last samples -> close (tests/fuzz/fuzz_entry.h).
 *
 *   make fuzz          builds build/fuzz/fuzz_dataset (clang, -fsanitize=fuzzer,address,undefined)
 *   build/fuzz/fuzz_dataset -max_total_time=2700 build/fuzz/corpus tests/fuzz/seeds ../shared/testdata/hdf5-cve
 *
 * HDF5 opens files by name, so each input is written to a file under $MB_FUZZ_DIR
 * (default /dev/shm, else /tmp), one per process. docs/RELIABILITY.md, "Fuzzing". */
#define _GNU_SOURCE
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "fuzz/fuzz_entry.h"
#include <unistd.h>

static char g_dir[200], g_path[256];
static int g_gen = -1;

/* HDF5 registers its library shutdown at exit on its first call; after a file it could not
 * close (fz_stuck), that shutdown crashes, so this handler, registered after it (hence run
 * before it), ends the process first. The input files are removed either way. */
static void at_exit(void) {
    for (int g = 0; g <= g_gen; g++) {
        snprintf(g_path, sizeof g_path, "%s/mb_fuzz_%ld_%d.h5", g_dir, (long)getpid(), g);
        unlink(g_path);
    }
    if (fz_stuck) _exit(0);
}

static void next_path(void) {
    if (g_gen == fz_stuck) return;
    /* a stuck file keeps its inode: a new name, so HDF5 does not take the next input for it */
    g_gen = fz_stuck;
    snprintf(g_path, sizeof g_path, "%s/mb_fuzz_%ld_%d.h5", g_dir, (long)getpid(), g_gen);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *dir = getenv("MB_FUZZ_DIR");
    if (!dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    next_path();
    H5open();
    atexit(at_exit);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_run_bytes(data, size, g_path);
    next_path();
    return 0;
}
