/* fuzz_regress: replays the fuzzer's seed corpus (tests/fuzz/seeds) and the inputs it
 * found (tests/fuzz/regress) through the fuzz target's own entry (tests/fuzz/fuzz_entry.h:
 * open + validate + reads of the first and last samples + close, with its checks), built
 * with the normal compiler and no libFuzzer. Run from the repository root (make test).
 *
 * Each file goes first through mb_dataset_probe, then, unless the probe's child crashed,
 * through the entry in a forked child of this test, which must end with a result code
 * (success or a clean error), not a signal. Files named hdf5-* are inputs that crash or
 * corrupt HDF5 1.10.8 itself: only those may crash the probe's child, and then only the
 * probe's clean error is checked (docs/RELIABILITY.md, "Fuzzing"). */
#define _GNU_SOURCE /* mkdtemp, ssize_t */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "fuzz/fuzz_entry.h"
#include "h5fixture.h"
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SEED_DIR "tests/fuzz/seeds"
#define REGRESS_DIR "tests/fuzz/regress"
#define CHILD_EXIT_BASE 100 /* child exit status = CHILD_EXIT_BASE - result (ASan's own status is 1) */

static int not_dot(const struct dirent *d) { return d->d_name[0] != '.'; }

/* The entry on `path` with `policy` in a child (at most 20 s). Returns the mb_result, or 1
 * with the reason in why when the child died, hung or exited oddly. */
static int entry_in_child(const char *path, int policy, char *why, size_t cap) {
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL); /* not cmocka's */
        mb_result r = fz_run_file(path, policy);
        if (fz_stuck) printf("    %s: HDF5 could not close the file (H5Fclose failed; HDF5's bug)\n", path);
        fflush(stdout);
        _exit(CHILD_EXIT_BASE - (int)r); /* _exit: HDF5's shutdown would crash on a stuck file */
    }
    int st = 0;
    for (int waited = 0; waitpid(pid, &st, WNOHANG) == 0; waited++) {
        if (waited == 2000) { kill(pid, SIGKILL); waitpid(pid, &st, 0); snprintf(why, cap, "hung (20 s)"); return 1; }
        usleep(10000);
    }
    if (WIFSIGNALED(st)) { snprintf(why, cap, "killed by signal %d", WTERMSIG(st)); return 1; }
    int code = CHILD_EXIT_BASE - WEXITSTATUS(st);
    if (code > MB_OK || code < MB_ERR_CORRUPT) { snprintf(why, cap, "exit status %d", WEXITSTATUS(st)); return 1; }
    return code;
}

static int probe_died(const char *msg) {
    return strstr(msg, "crashed while parsing") || strstr(msg, "timed out");
}

/* Expected result of a seed under a NaN policy (see tests/fuzz/gen_seeds.c). */
static mb_result seed_expect(const char *name, int policy) {
    static const char *refused[] = {"soft_link", "compact", "names_array", "names_int", "filter_", "chunk_too_big",
                                    "segments_float", "series_bad_index", "series_decreasing"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (strstr(name, refused[i])) return MB_ERR_FORMAT;
    if (strstr(name, "nan") && policy == MB_NAN_ERROR) return MB_ERR_NONFINITE;
    return MB_OK;
}

static void test_seeds(void **state) {
    (void)state;
    struct dirent **list = NULL;
    int n = scandir(SEED_DIR, &list, not_dot, alphasort);
    if (n <= 0) fail_msg("no files in %s (run from the repository root)", SEED_DIR);
    for (int i = 0; i < n; i++) {
        char path[512], why[128] = "";
        snprintf(path, sizeof path, "%s/%s", SEED_DIR, list[i]->d_name);
        mb_result want = seed_expect(list[i]->d_name, MB_NAN_ZERO);
        mb_result pr = mb_dataset_probe(path, NULL, NULL); /* the probe reads with nan_policy = zero */
        if (pr != want) fail_msg("%s: probe gave %d (%s), want %d", path, (int)pr, mb_last_error(), (int)want);
        for (int policy = 0; policy <= MB_NAN_ZERO; policy++) {
            int r = entry_in_child(path, policy, why, sizeof why);
            printf("%-40s policy %d: %d %s\n", path, policy, r, why);
            if (r == 1) fail_msg("%s (policy %d): %s", path, policy, why);
            assert_int_equal(r, seed_expect(list[i]->d_name, policy));
        }
        free(list[i]);
    }
    free(list);
}

/* MB_FUZZ_REGRESS=<dir> replays another folder (e.g. new fuzzer artifacts, for triage). */
static void test_reproducers(void **state) {
    (void)state;
    const char *dir = getenv("MB_FUZZ_REGRESS") ? getenv("MB_FUZZ_REGRESS") : REGRESS_DIR;
    struct dirent **list = NULL;
    int n = scandir(dir, &list, not_dot, alphasort);
    if (n <= 0) fail_msg("no files in %s (run from the repository root)", dir);
    mb_dataset_config c;
    memset(&c, 0, sizeof c);
    c.probe_timeout_s = 3; /* valid files take milliseconds; a hang costs this much */
    int failures = 0;
    for (int i = 0; i < n; i++) {
        char path[512], why[128] = "", pmsg[1024];
        const char *name = list[i]->d_name;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        mb_clear_error();
        mb_result pr = mb_dataset_probe(path, &c, NULL);
        snprintf(pmsg, sizeof pmsg, "%s", mb_last_error());
        int died = pr != MB_OK && probe_died(pmsg);
        int r = died ? 0 : entry_in_child(path, (int)(sb.st_size % 3), why, sizeof why);
        const char *bad = NULL;
        if (pr != MB_OK && !strstr(pmsg, path)) bad = "probe message does not name the file";
        else if (died && strncmp(name, "hdf5-", 5) != 0) bad = "the probe's child crashed (not an hdf5-* file)";
        else if (r == 1) bad = why;
        printf("%-58s probe %3d%s | entry %s%3d | %s%s%s\n", name, (int)pr, died ? " (HDF5 died)" : "",
               died ? "skipped " : "", r, pmsg, bad ? "  <== FAIL: " : "", bad ? bad : "");
        if (bad) failures++;
        free(list[i]);
    }
    free(list);
    assert_int_equal(failures, 0);
}

/* Found by the fuzzer (a CVE seed): on cve-2025-6269-1.h5 HDF5's H5Fclose fails after the
 * failed open, the file stays open inside HDF5 and the process crashes at exit in HDF5's
 * shutdown. megabatch cannot undo it; it must say so (a warning) and still fail cleanly. */
static char g_warning[1024];
static void capture_warning(mb_log_level level, const char *message, const char *file, int line, void *user) {
    (void)file; (void)line; (void)user;
    if (level == MB_LOG_WARN) snprintf(g_warning, sizeof g_warning, "%s", message);
}

static void test_close_failure_warns(void **state) {
    (void)state;
    const char *dir = getenv("MB_CVE_DIR") && getenv("MB_CVE_DIR")[0] ? getenv("MB_CVE_DIR") : "../shared/testdata/hdf5-cve";
    char path[1024];
    snprintf(path, sizeof path, "%s/cve-2025-6269-1.h5", dir);
    if (access(path, R_OK) != 0) { print_message("%s absent (set MB_CVE_DIR): skipped\n", path); skip(); }
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* a child: the stuck file would crash this test's exit */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        mb_dataset_config c;
        memset(&c, 0, sizeof c);
        c.log.fn = capture_warning;
        c.log.max = MB_LOG_WARN;
        mb_dataset *ds = NULL;
        mb_result r = mb_dataset_open_file(&ds, path, &c);
        printf("open: %d %s\nwarning: %s\n", (int)r, mb_last_error(), g_warning);
        fflush(stdout);
        _exit(r == MB_ERR_FORMAT && ds == NULL && strstr(mb_last_error(), "missing dataset 'features'") &&
              strstr(g_warning, "HDF5 could not close the file") && strstr(g_warning, path) ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Found while reviewing what the fuzzer reaches (not by the fuzzer itself): a
 * `segment_names` attribute holding an array of strings (h5py writes a list of str that
 * way) made H5Aread write every element into a buffer for one string, a stack overflow
 * in mb__h5_segments. It must be refused with a clear error, fixed and variable length. */
static void add_names_array(const char *path, int vlen, hsize_t count) {
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t df = H5Dopen2(file, "features", H5P_DEFAULT), st = H5Tcopy(H5T_C_S1), sp = H5Screate_simple(1, &count, NULL);
    static char fixed[200 * 20];
    const char *v[200];
    memset(fixed, 'x', sizeof fixed);
    for (int i = 0; i < 200; i++) v[i] = "M1";
    assert_true(count <= 200);
    H5Tset_size(st, vlen ? H5T_VARIABLE : 20);
    hid_t a = H5Acreate2(df, "segment_names", st, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(a, st, vlen ? (const void *)v : (const void *)fixed) >= 0);
    H5Aclose(a); H5Sclose(sp); H5Tclose(st); H5Dclose(df); H5Fclose(file);
}

static void test_segment_names_array(void **state) {
    (void)state;
    enum { N = 4, T = 2, F = 3, K = 1 };
    float feat[N * T * F], targ[N * K];
    fx_data(feat, targ, N, T, F, K);
    const struct { int vlen; hsize_t count; mb_result want; } cases[] = {
        {0, 200, MB_ERR_FORMAT}, {1, 4, MB_ERR_FORMAT}, {1, 2, MB_ERR_FORMAT}, {0, 1, MB_OK}, {1, 1, MB_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = fx_path("names_array.h5");
        fx_opts o;
        memset(&o, 0, sizeof o);
        o.segments = "2"; /* one segment: one name */
        fx_write(p, feat, targ, N, T, F, K, &o);
        add_names_array(p, cases[i].vlen, cases[i].count);
        mb_dataset *ds = NULL;
        mb_result r = mb_dataset_open_file(&ds, p, NULL);
        printf("segment_names: %s x %llu -> %d %s\n", cases[i].vlen ? "vlen" : "fixed 20",
               (unsigned long long)cases[i].count, (int)r, r ? mb_last_error() : "");
        if (cases[i].want == MB_OK) {
            tu_ok(r);
            assert_int_equal(mb_dataset_info(ds)->segments, 1);
        } else {
            assert_int_equal(r, cases[i].want);
            assert_non_null(strstr(mb_last_error(), "must be one string"));
        }
        mb_dataset_close(ds);
    }
}

/* Found while triaging the fuzzer's artifacts (one ends in "'segments' sums to 2656398160"):
 * segment lengths were summed in a long long with no bound, so lengths near INT64_MAX
 * overflowed (undefined behaviour) and could wrap to exactly T, and the file was accepted
 * with a segment longer than the sample. Each length must be 1..T. */
static void test_segments_overflow(void **state) {
    (void)state;
    enum { N = 3, T = 5, F = 2, K = 1 };
    float feat[N * T * F], targ[N * K];
    fx_data(feat, targ, N, T, F, K);
    const char *p = fx_path("segments_wrap.h5");
    fx_write(p, feat, targ, N, T, F, K, NULL);
    hid_t file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t df = H5Dopen2(file, "features", H5P_DEFAULT);
    hsize_t three = 3;
    long long v[3] = {INT64_MAX, INT64_MAX, T + 2}; /* 2 * (2^63 - 1) + T + 2 wraps to T */
    hid_t sp = H5Screate_simple(1, &three, NULL), a = H5Acreate2(df, "segments", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(a, H5T_NATIVE_LLONG, v) >= 0);
    H5Aclose(a); H5Sclose(sp); H5Dclose(df); H5Fclose(file);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "segment 0 of 'features' has length "
                    "9223372036854775807 (T = 5)");
    assert_null(ds);
}

/* Found by fuzzing (run 2, a mutant of seed types_i16_f64.h5): features stored as int16
 * with precision 0 at bit offset 4096 (and targets as a float64 whose exponent overlaps
 * its mantissa) passed validation, and HDF5's conversion on read crashed with SIGBUS in
 * H5T__bit_copy. Such a type must be refused at open. The seeds' types must still pass. */
static void test_malformed_type(void **state) {
    (void)state;
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, REGRESS_DIR "/type-bit-offset-07d11999.h5", NULL), MB_ERR_FORMAT,
                    "dataset 'features' has a malformed int16 type (precision 0, bit offset 4096)");
    assert_null(ds);
    static const char *ok[] = {"types_i16_f64.h5", "types_be.h5", "contig_f32.h5"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", SEED_DIR, ok[i]);
        tu_ok(mb_dataset_open_file(&ds, path, NULL));
        mb_dataset_close(ds);
    }
}

/* Found by review of the probe's trust boundary: the parent used the child's metadata as
 * sent. The child ran HDF5 on a hostile file, so a report with unterminated strings or an
 * out-of-range segment count must be refused, not copied to the caller. */
static void test_probe_report_checked(void **state) {
    (void)state;
    mb_dataset_meta m;
    memset(&m, 0, sizeof m);
    tu_ok(mb_dataset_probe(SEED_DIR "/segments_names.h5", NULL, &m));
    assert_true(mb__probe_meta_ok(&m));
    mb_dataset_meta b = m;
    b.segments = MB_MAX_SEGMENTS + 1;
    assert_false(mb__probe_meta_ok(&b));
    b = m; b.segments = -1;
    assert_false(mb__probe_meta_ok(&b));
    b = m; memset(b.source, 'x', sizeof b.source);
    assert_false(mb__probe_meta_ok(&b));
    b = m; memset(b.features_type, 'x', sizeof b.features_type);
    assert_false(mb__probe_meta_ok(&b));
    b = m; memset(b.segment_name[MB_MAX_SEGMENTS - 1], 'x', MB_MAX_NAME);
    assert_false(mb__probe_meta_ok(&b));
    b = m; b.k = 0;
    assert_false(mb__probe_meta_ok(&b));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_reproducers),
        cmocka_unit_test(test_close_failure_warns),
        cmocka_unit_test(test_segment_names_array),
        cmocka_unit_test(test_probe_report_checked),
        cmocka_unit_test(test_segments_overflow),
        cmocka_unit_test(test_malformed_type),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fx_cleanup();
    return rc;
}
