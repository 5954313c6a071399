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

static char g_path[256];
static void remove_input(void) { unlink(g_path); }

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *dir = getenv("MB_FUZZ_DIR");
    if (!dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_path, sizeof g_path, "%s/mb_fuzz_%ld.h5", dir, (long)getpid());
    atexit(remove_input);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_run_bytes(data, size, g_path);
    return 0;
}
