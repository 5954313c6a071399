/* examples/inspect.c (build/inspect, run from the repository root): exit 0 and the
 * shape and plan for a valid file; exit 2 and exactly one "error: ..." line on stderr
 * for bad files and bad arguments, never a crash. */
#define _GNU_SOURCE /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"
#include <sys/wait.h>

static const char *INSPECT = "build/inspect";
static char g_out[8192], g_err[8192];

/* Run inspect with args; capture stdout and stderr; return the exit status. */
static int run(const char *args) {
    if (access(INSPECT, X_OK) != 0) skip(); /* built by `make build`/`make test` */
    char cmd[1024];
    const char *o = fx_path("out.txt"), *e = fx_path("err.txt");
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", INSPECT, args, o, e);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    FILE *f = fopen(o, "r");
    size_t n = fread(g_out, 1, sizeof g_out - 1, f);
    g_out[n] = 0;
    fclose(f);
    f = fopen(e, "r");
    n = fread(g_err, 1, sizeof g_err - 1, f);
    g_err[n] = 0;
    fclose(f);
    return WEXITSTATUS(st);
}

static void assert_one_error_line(const char *needle) {
    assert_int_equal(strncmp(g_err, "error: ", 7), 0);
    char *nl = strchr(g_err, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], 0); /* exactly one line */
    if (!strstr(g_err, needle)) fail_msg("stderr \"%s\" lacks \"%s\"", g_err, needle);
}

static void test_inspect_valid(void **state) {
    (void)state;
    enum { N = 40, T = 5, F = 2, K = 3 };
    static float feat[N * T * F], targ[N * K];
    const char *p = fx_write_named("ok.h5", feat, targ, N, T, F, K, "3,2", "M1,H1");
    char args[512];
    snprintf(args, sizeof args, "%s --gpu-mem 16 --batch 8", p);
    assert_int_equal(run(args), 0);
    assert_int_equal(g_err[0], 0);
    assert_non_null(strstr(g_out, "samples N:        40\n"));
    assert_non_null(strstr(g_out, "time steps T:     5\n"));
    assert_non_null(strstr(g_out, "features F:       2 (float32 on disk)"));
    assert_non_null(strstr(g_out, "targets K:        3"));
    assert_non_null(strstr(g_out, "segments:         M1=3, H1=2"));
    assert_non_null(strstr(g_out, "bytes/sample:     52 (f32"));
    assert_non_null(strstr(g_out, "budget 12.000 GB"));
    assert_non_null(strstr(g_out, "resident"));
    assert_non_null(strstr(g_out, "batches/epoch:    5 of 8"));
    snprintf(args, sizeof args, "%s --dtype bf16", p);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "bytes/sample:     26 (bf16"));
}

static void test_inspect_bad_files(void **state) {
    (void)state;
    char args[512];
    assert_int_equal(run(fx_path("absent.h5")), 2);
    assert_one_error_line("cannot open");
    const char *t = fx_path("text.txt");
    FILE *f = fopen(t, "w");
    fputs("hello\n", f);
    fclose(f);
    assert_int_equal(run(t), 2);
    assert_one_error_line("not an HDF5 file");
    static float feat[6 * 4], targ[6];
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.tname = "labels";
    const char *p = fx_path("nolabels.h5");
    fx_write(p, feat, targ, 6, 2, 2, 1, &o);
    assert_int_equal(run(p), 2);
    assert_one_error_line("missing dataset 'targets'");
    o.tname = NULL;
    o.segments = "1,2";
    p = fx_path("badseg.h5");
    fx_write(p, feat, targ, 6, 2, 2, 1, &o);
    assert_int_equal(run(p), 2);
    assert_one_error_line("sums to 3, but T = 2");
    snprintf(args, sizeof args, "%s --dtype f64", p);
    assert_int_equal(run(args), 2);
    assert_one_error_line("--dtype 'f64': expected f32 or bf16");
}

static void test_inspect_bad_arguments(void **state) {
    (void)state;
    assert_int_equal(run(""), 2);
    assert_one_error_line("no file given");
    assert_int_equal(run("a.h5 --batch -3"), 2);
    assert_one_error_line("--batch '-3': expected an integer in [1, 100000000]");
    assert_int_equal(run("a.h5 --gpu-mem"), 2);
    assert_one_error_line("--gpu-mem needs a value (see --help)");
    assert_int_equal(run("a.h5 --frobnicate"), 2);
    assert_one_error_line("unknown flag '--frobnicate' (see --help)");
    assert_int_equal(run("a.h5 b.h5"), 2);
    assert_one_error_line("more than one file");
}

/* Files of the CVE corpus that crash HDF5 itself (docs/RELIABILITY.md): inspect probes
 * them in a child by default and ends in one error line, exit 2, no crash. */
static void test_inspect_hdf5_crashers(void **state) {
    (void)state;
    const char *dir = getenv("MB_CVE_DIR") && getenv("MB_CVE_DIR")[0] ? getenv("MB_CVE_DIR")
                                                                       : "../shared/testdata/hdf5-cve";
    const char *files[] = {"cve-2018-13867.h5", "gh-4432-poc-05.h5", "gh-4434-poc-09.h5"};
    int ran = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512], args[600];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (access(path, R_OK) != 0) continue;
        snprintf(args, sizeof args, "%s", path);
        assert_int_equal(run(args), 2);
        assert_one_error_line("HDF5 crashed while parsing");
        if (!strstr(g_err, files[i])) fail_msg("stderr \"%s\" does not name %s", g_err, files[i]);
        assert_int_equal(g_out[0], 0);
        ran++;
    }
    if (!ran) { print_message("no CVE files in %s (set MB_CVE_DIR): skipped\n", dir); skip(); }
}

static void test_inspect_no_probe(void **state) {
    (void)state;
    enum { N = 10, T = 2, F = 2, K = 1 };
    static float feat[N * T * F], targ[N * K];
    fx_data(feat, targ, N, T, F, K);
    const char *p = fx_path("np.h5");
    fx_write(p, feat, targ, N, T, F, K, NULL);
    char args[512];
    snprintf(args, sizeof args, "%s --no-probe", p);
    assert_int_equal(run(args), 0);
    assert_int_equal(g_err[0], 0);
    assert_non_null(strstr(g_out, "samples N:        10\n"));
}

static int teardown_all(void **state) {
    (void)state;
    fx_cleanup();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_valid),
        cmocka_unit_test(test_inspect_bad_files),
        cmocka_unit_test(test_inspect_bad_arguments),
        cmocka_unit_test(test_inspect_hdf5_crashers),
        cmocka_unit_test(test_inspect_no_probe),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
