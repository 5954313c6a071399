/* hostile: the isolated probe (mb_dataset_probe, mb_dataset_open_untrusted, the attributes
 * the probe reads first: mb_dataset_read_attr) and the tightened HDF5 validation.
 * Valid files probe fine; soft/external links, compact layout, external storage, filters
 * off the allow list and absurd chunks are refused; every file of the HDF5 CVE corpus
 * (MB_CVE_DIR, default ../shared/testdata/hdf5-cve) ends in a clear error through the
 * probe and, in a child of this test, through plain mb_dataset_open_file: no crash, no
 * byte on stderr, HDF5's error handler and plugin state restored. */
#define _GNU_SOURCE /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "h5fixture.h"
#include <dirent.h>
#include <sys/stat.h>

enum { N = 12, T = 4, F = 3, K = 2 };
static float g_feat[N * T * F], g_targ[N * K];

/* A sentinel HDF5 error handler: it must still be installed after every call. */
static herr_t sentinel_handler(hid_t stack, void *data) { (void)stack; (void)data; return 0; }
static int g_sentinel_data;

static H5E_auto2_t g_orig_fn;
static void *g_orig_data;

static void install_sentinel(void) { H5Eset_auto2(H5E_DEFAULT, sentinel_handler, &g_sentinel_data); }
static void assert_sentinel(void) {
    H5E_auto2_t fn = NULL;
    void *data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    assert_true(fn == sentinel_handler);
    assert_ptr_equal(data, &g_sentinel_data);
    unsigned plugins = 0;
    H5PLget_loading_state(&plugins);
    assert_int_equal(plugins, H5PL_ALL_PLUGIN);
}

/* fd 2 to a temporary file while a call runs; stderr_end returns the bytes written. */
static int g_saved_err = -1, g_cap = -1;
static void stderr_begin(void) {
    fflush(stderr);
    g_cap = open(fx_path("stderr.txt"), O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(g_cap >= 0);
    g_saved_err = dup(2);
    dup2(g_cap, 2);
}
static long stderr_end(void) {
    fflush(stderr);
    dup2(g_saved_err, 2);
    close(g_saved_err);
    struct stat sb;
    fstat(g_cap, &sb);
    close(g_cap);
    return (long)sb.st_size;
}

static const char *valid_file(void) {
    const char *p = fx_path("valid.h5");
    fx_data(g_feat, g_targ, N, T, F, K);
    fx_write(p, g_feat, g_targ, N, T, F, K, NULL);
    return p;
}

static void test_probe_valid(void **state) {
    (void)state;
    const char *p = valid_file();
    mb_dataset_meta m;
    memset(&m, 0, sizeof m);
    install_sentinel();
    stderr_begin();
    mb_result r = mb_dataset_probe(p, NULL, &m);
    assert_int_equal(stderr_end(), 0);
    tu_ok(r);
    assert_sentinel();
    assert_int_equal(m.n, N);
    assert_int_equal(m.t, T);
    assert_int_equal(m.f, F);
    assert_int_equal(m.k, K);
    assert_string_equal(m.source, p);
    tu_ok(mb_dataset_probe(p, NULL, NULL));
    /* isolate = 1: open_file probes first, then opens here; data read back exactly */
    mb_dataset_config c;
    memset(&c, 0, sizeof c);
    c.isolate = 1;
    mb_dataset *ds = NULL;
    tu_ok(mb_dataset_open_file(&ds, p, &c));
    static float f[N * T * F], t[N * K];
    tu_ok(mb_dataset_read(ds, 0, N, f, t, NULL));
    assert_memory_equal(f, g_feat, sizeof f);
    assert_memory_equal(t, g_targ, sizeof t);
    mb_dataset_close(ds);
    H5Eset_auto2(H5E_DEFAULT, g_orig_fn, g_orig_data);
}

static void test_probe_errors(void **state) {
    (void)state;
    tu_assert_error(mb_dataset_probe(NULL, NULL, NULL), MB_ERR_INVALID_ARG, "NULL path");
    tu_assert_error(mb_dataset_probe(fx_path("absent.h5"), NULL, NULL), MB_ERR_IO, "absent.h5: cannot open");
    const char *t = fx_path("text.h5");
    FILE *f = fopen(t, "w");
    fputs("not hdf5\n", f);
    fclose(f);
    tu_assert_error(mb_dataset_probe(t, NULL, NULL), MB_ERR_FORMAT, "not an HDF5 file");
    mb_dataset_config c;
    memset(&c, 0, sizeof c);
    c.isolate = 1;
    mb_dataset *ds = (mb_dataset *)&c;
    tu_assert_error(mb_dataset_open_file(&ds, t, &c), MB_ERR_FORMAT, "not an HDF5 file");
    assert_null(ds);
    /* the child's result comes back with its code: a bad shape is MB_ERR_FORMAT */
    const char *p = fx_path("badk.h5");
    fx_write(p, g_feat, g_targ, N, T, F, 0, NULL);
    tu_assert_error(mb_dataset_probe(p, NULL, NULL), MB_ERR_FORMAT, "zero dimension");
}

/* A series file (docs/SERIES.md): bars_0 (N + 2, F) created with dcpl (H5P_DEFAULT: plain),
 * bars_1 (N, F), ends (N, 2) with windows of 3 and 1 bars, targets (N, K). bad_index: one
 * index past the last bar. */
static void write_series(const char *path, hid_t dcpl, int bad_index) {
    static float b0[(N + 2) * F], b1[N * F];
    int64_t ends[N * 2];
    for (int i = 0; i < (N + 2) * F; i++) b0[i] = (float)i;
    for (int i = 0; i < N * F; i++) b1[i] = -(float)i;
    for (int i = 0; i < N; i++) { ends[2 * i] = i + 2; ends[2 * i + 1] = i; }
    if (bad_index) ends[2 * (N - 1)] = N + 2;
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d0[2] = {N + 2, F}, d1[2] = {N, F}, de[2] = {N, 2}, dt[2] = {N, K}, two = 2;
    hid_t s0 = H5Screate_simple(2, d0, NULL), s1 = H5Screate_simple(2, d1, NULL), se = H5Screate_simple(2, de, NULL),
          st = H5Screate_simple(2, dt, NULL), sa = H5Screate_simple(1, &two, NULL);
    hid_t x0 = H5Dcreate2(file, "bars_0", H5T_IEEE_F32LE, s0, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    hid_t x1 = H5Dcreate2(file, "bars_1", H5T_IEEE_F32LE, s1, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t xe = H5Dcreate2(file, "ends", H5T_STD_I64LE, se, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t xt = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(x0 >= 0 && x1 >= 0 && xe >= 0 && xt >= 0);
    int seg[2] = {3, 1};
    hid_t a = H5Acreate2(xe, "segments", H5T_STD_I32LE, sa, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(a, H5T_NATIVE_INT, seg) >= 0);
    assert_true(H5Dwrite(x0, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b0) >= 0);
    assert_true(H5Dwrite(x1, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b1) >= 0);
    assert_true(H5Dwrite(xe, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, ends) >= 0);
    assert_true(H5Dwrite(xt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_targ) >= 0);
    H5Aclose(a); H5Dclose(x0); H5Dclose(x1); H5Dclose(xe); H5Dclose(xt);
    H5Sclose(s0); H5Sclose(s1); H5Sclose(se); H5Sclose(st); H5Sclose(sa); H5Fclose(file);
}

/* The series layout goes through the same hostile-file checks: the probe (a valid file, a
 * bad index coming back as the child's MB_ERR_FORMAT), links, compact and external storage
 * and filters off the allow list on its bar datasets. */
static void test_series_hostile(void **state) {
    (void)state;
    fx_data(g_feat, g_targ, N, T, F, K);
    const char *p = fx_path("series.h5");
    write_series(p, H5P_DEFAULT, 0);
    mb_dataset_meta m;
    install_sentinel();
    stderr_begin();
    mb_result r = mb_dataset_probe(p, NULL, &m);
    assert_int_equal(stderr_end(), 0);
    tu_ok(r);
    assert_sentinel();
    H5Eset_auto2(H5E_DEFAULT, g_orig_fn, g_orig_data);
    assert_true(m.layout == MB_LAYOUT_SERIES && m.n == N && m.t == 4 && m.f == F && m.k == K && m.bars[0] == N + 2);
    write_series(p, H5P_DEFAULT, 1);
    tu_assert_error(mb_dataset_probe(p, NULL, NULL), MB_ERR_FORMAT, "past the last bar");
    hid_t file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Lmove(file, "bars_0", file, "real", H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_soft("/real", file, "bars_0", H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(file);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'bars_0' is a soft link");
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(pl, H5D_COMPACT);
    write_series(p, pl, 0);
    H5Pclose(pl);
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'bars_0' has compact layout");
    pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(pl, fx_path("raw_series.bin"), 0, (N + 2) * F * 4);
    write_series(p, pl, 0);
    H5Pclose(pl);
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "1 external file(s)");
    pl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t cd[2] = {3, F};
    H5Pset_chunk(pl, 2, cd);
    H5Pset_nbit(pl);
    write_series(p, pl, 0);
    H5Pclose(pl);
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'bars_0' uses filter 5");
    assert_null(ds);
}

/* Features written with a custom creation plist (and maxdims), targets contiguous. */
static void write_custom(const char *path, hid_t dcpl, const hsize_t *maxdims) {
    fx_data(g_feat, g_targ, N, T, F, K);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t fd[3] = {N, T, F}, td[2] = {N, K};
    hid_t sp = H5Screate_simple(3, fd, maxdims), st = H5Screate_simple(2, td, NULL);
    hid_t df = H5Dcreate2(file, "features", H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    hid_t dt = H5Dcreate2(file, "targets", H5T_IEEE_F32LE, st, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(df >= 0 && dt >= 0);
    assert_true(H5Dwrite(df, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_feat) >= 0);
    assert_true(H5Dwrite(dt, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, g_targ) >= 0);
    H5Dclose(df); H5Dclose(dt); H5Sclose(sp); H5Sclose(st); H5Fclose(file);
}

static void test_soft_and_external_links(void **state) {
    (void)state;
    const char *p = fx_path("soft.h5"), *e = fx_path("ext.h5");
    fx_opts o;
    memset(&o, 0, sizeof o);
    o.fname = "real";
    fx_write(p, g_feat, g_targ, N, T, F, K, &o);
    hid_t file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Lcreate_soft("/real", file, "features", H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(file);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'features' is a soft link");
    fx_write(e, g_feat, g_targ, N, T, F, K, &o);
    file = H5Fopen(e, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Lcreate_external(p, "/real", file, "features", H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(file);
    tu_assert_error(mb_dataset_open_file(&ds, e, NULL), MB_ERR_FORMAT, "'features' is a external link");
}

static void test_compact_layout(void **state) {
    (void)state;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(pl, H5D_COMPACT);
    const char *p = fx_path("compact.h5");
    write_custom(p, pl, NULL);
    H5Pclose(pl);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "'features' has compact layout");
}

static void test_external_storage(void **state) {
    (void)state;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(pl, fx_path("raw.bin"), 0, N * T * F * 4);
    const char *p = fx_path("external.h5");
    write_custom(p, pl, NULL);
    H5Pclose(pl);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "1 external file(s)");
}

static void test_filter_not_allowed(void **state) {
    (void)state;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t cd[3] = {3, T, F};
    H5Pset_chunk(pl, 3, cd);
    H5Pset_nbit(pl);
    const char *p = fx_path("nbit.h5");
    write_custom(p, pl, NULL);
    H5Pclose(pl);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "uses filter 5");
    /* the allowed ones still open: deflate + shuffle + fletcher32 */
    pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 3, cd);
    H5Pset_shuffle(pl);
    H5Pset_deflate(pl, 3);
    H5Pset_fletcher32(pl);
    write_custom(p, pl, NULL);
    H5Pclose(pl);
    tu_ok(mb_dataset_open_file(&ds, p, NULL));
    static float f[N * T * F], t[N * K];
    tu_ok(mb_dataset_read(ds, 0, N, f, t, NULL));
    assert_memory_equal(f, g_feat, sizeof f);
    mb_dataset_close(ds);
}

static void test_absurd_chunks(void **state) {
    (void)state;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t cd[3] = {100000, T, F}, maxd[3] = {H5S_UNLIMITED, T, F};
    H5Pset_chunk(pl, 3, cd);
    const char *p = fx_path("chunks.h5");
    write_custom(p, pl, maxd);
    H5Pclose(pl);
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "chunk dimension 0 is 100000 for a dimension of 12");
}

/* ---- the CVE corpus ---- */

static const char *cve_dir(void) {
    const char *e = getenv("MB_CVE_DIR");
    if (e && e[0]) return e;
    return "../shared/testdata/hdf5-cve";
}
static int is_h5(const struct dirent *d) {
    size_t n = strlen(d->d_name);
    return n > 3 && !strcmp(d->d_name + n - 3, ".h5");
}

/* In a child of this test: plain mb_dataset_open_file (+ first sample), reported as
 * code + message through a pipe; the parent waits at most 10 s. Returns the code, or
 * 1 when the child crashed or hung (detail in msg). */
static int open_in_child(const char *path, char *msg, size_t cap) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        signal(SIGSEGV, SIG_DFL); /* not cmocka's handler: a crash must kill this child */
        signal(SIGBUS, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        char out[1100] = "";
        mb_dataset *ds = NULL;
        int r = mb_dataset_open_file(&ds, path, NULL);
        if (r == MB_OK) {
            const mb_dataset_meta *m = mb_dataset_info(ds);
            float *buf = (float *)calloc(m->bytes_per_sample, 1);
            r = buf ? mb_dataset_read(ds, 0, 1, buf, buf + m->t * m->f, NULL) : MB_ERR_OUT_OF_MEMORY;
            free(buf);
            mb_dataset_close(ds);
        }
        H5E_auto2_t fn = NULL;
        void *data = NULL;
        H5Eget_auto2(H5E_DEFAULT, &fn, &data);
        snprintf(out, sizeof out, "%d %s%s", r, fn == sentinel_handler ? "" : "[handler not restored] ",
                 mb_last_error());
        ssize_t w = write(fds[1], out, strlen(out) + 1);
        _exit(w > 0 ? 0 : 3);
    }
    close(fds[1]);
    char buf[1100] = "";
    size_t got = 0;
    for (int waited = 0; waited < 1000 && got < sizeof buf - 1;) {
        struct pollfd pf = {fds[0], POLLIN, 0};
        if (poll(&pf, 1, 10) == 0) { waited++; continue; }
        ssize_t n = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    buf[got] = 0;
    int st = 0;
    if (!got) kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    if (!got || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(msg, cap, "child %s %d", WIFSIGNALED(st) ? "killed by signal" : "exit",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        return 1;
    }
    char *sp = strchr(buf, ' ');
    snprintf(msg, cap, "%s", sp ? sp + 1 : "");
    return atoi(buf);
}

static void test_cve_corpus(void **state) {
    (void)state;
    struct dirent **list = NULL;
    int n = scandir(cve_dir(), &list, is_h5, alphasort);
    if (n <= 0) { print_message("no CVE files in %s (set MB_CVE_DIR): skipped\n", cve_dir()); skip(); }
    mb_dataset_config c;
    memset(&c, 0, sizeof c);
    c.probe_timeout_s = 5;
    int failures = 0, crashed = 0;
    printf("%-28s | %-5s | %-7s | %-5s | %s\n", "file", "probe", "crashed", "open", "message (probe)");
    for (int i = 0; i < n; i++) {
        char path[1024], omsg[1024];
        snprintf(path, sizeof path, "%s/%s", cve_dir(), list[i]->d_name);
        install_sentinel();
        stderr_begin();
        mb_clear_error();
        mb_result r = mb_dataset_probe(path, &c, NULL);
        char pmsg[1024];
        snprintf(pmsg, sizeof pmsg, "%s", mb_last_error());
        int died = strstr(pmsg, "crashed while parsing") || strstr(pmsg, "timed out");
        int o = died ? 0 : open_in_child(path, omsg, sizeof omsg);
        long err = stderr_end();
        assert_sentinel();
        crashed += died;
        const char *why = NULL;
        if (r == MB_OK) why = "probe returned MB_OK";
        else if (!strstr(pmsg, list[i]->d_name)) why = "probe message does not name the file";
        else if (err) why = "bytes on stderr";
        else if (!died && o == 1) why = omsg; /* plain open crashed the child though the probe did not */
        else if (!died && (o == MB_OK || !strstr(omsg, list[i]->d_name))) why = "plain open: no clear error";
        else if (strstr(omsg, "[handler not restored]")) why = "HDF5 error handler not restored";
        printf("%-28s | %5d | %-7s | %5d | %s%s%s\n", list[i]->d_name, (int)r, died ? "yes" : "no", died ? 0 : o,
               pmsg, why ? "  <== FAIL: " : "", why ? why : "");
        if (why) failures++;
        free(list[i]);
    }
    free(list);
    printf("%d files, %d crashed or hung HDF5 in the probe's child, %d failures\n", n, crashed, failures);
    H5Eset_auto2(H5E_DEFAULT, g_orig_fn, g_orig_data);
    assert_int_equal(failures, 0);
}

/* mb_dataset_open_untrusted: the probe, then the in-process open. A valid file reads back
 * exactly; files that crash or hang HDF5 (committed reproducers) end in MB_ERR_FORMAT with
 * no HDF5 file ever opened in this process; nothing on stderr, the handler restored. */
static void test_open_untrusted(void **state) {
    (void)state;
    const char *p = valid_file();
    mb_dataset *ds = NULL;
    install_sentinel();
    stderr_begin();
    mb_result r = mb_dataset_open_untrusted(&ds, p, NULL);
    static float f[N * T * F], t[N * K];
    if (r == MB_OK) r = mb_dataset_read(ds, 0, N, f, t, NULL);
    mb_dataset_close(ds);
    mb_dataset_config c;
    memset(&c, 0, sizeof c);
    c.probe_timeout_s = 1;
    struct { const char *file, *want, *or_want; } bad[] = {
        {"tests/fuzz/regress/hdf5-segv-accum-read-36b8e1b3.h5", "HDF5 crashed while parsing", NULL},
        {"tests/fuzz/regress/hdf5-hang-global-heap-9d56041e.h5", "timed out after 1.0 s", NULL},
        /* refused in the child; under ASan the child dies on HDF5's own memory error there */
        {"tests/fuzz/regress/hdf5-stuck-close-bb338bcf.h5", "missing dataset 'features'", "HDF5 crashed while parsing"}};
    mb_result rb[3];
    char msg[3][MB_MAX_ERROR];
    for (int i = 0; i < 3; i++) {
        ds = (mb_dataset *)&c;
        rb[i] = mb_dataset_open_untrusted(&ds, bad[i].file, &c);
        snprintf(msg[i], sizeof msg[i], "%s", mb_last_error());
        assert_null(ds);
    }
    long err = stderr_end();
    tu_ok(r);
    assert_memory_equal(f, g_feat, sizeof f);
    assert_memory_equal(t, g_targ, sizeof t);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rb[i], MB_ERR_FORMAT);
        int said = strstr(msg[i], bad[i].want) || (bad[i].or_want && strstr(msg[i], bad[i].or_want));
        if (!said || !strstr(msg[i], bad[i].file))
            fail_msg("%s: '%s' lacks '%s' or the file's name", bad[i].file, msg[i], bad[i].want);
    }
    assert_int_equal(err, 0);
    assert_sentinel();
    assert_int_equal(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE), 0); /* no file of theirs opened here */
    H5Eset_auto2(H5E_DEFAULT, g_orig_fn, g_orig_data);
    /* the in-process open must find what the probe reported (a file changed in between) */
    mb_dataset_meta a, b;
    tu_ok(mb_dataset_probe(p, NULL, &a));
    b = a;
    assert_true(mb__meta_same(&a, &b));
    b.n++;
    assert_false(mb__meta_same(&a, &b));
    b = a;
    strcpy(b.features_type, "float64");
    assert_false(mb__meta_same(&a, &b));
}

/* An attribute written as doubles with file type ftype (rank 0: scalar) on dataset obj. */
static void add_attr(const char *path, const char *obj, const char *name, hid_t ftype, int rank, hsize_t n,
                     const double *v) {
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), d = H5Dopen2(file, obj, H5P_DEFAULT);
    hid_t sp = rank ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0 && d >= 0 && a >= 0);
    assert_true(H5Awrite(a, H5T_NATIVE_DOUBLE, v) >= 0);
    H5Aclose(a); H5Sclose(sp); H5Dclose(d); H5Fclose(file);
}

/* mb_dataset_read_attr: numeric attributes of features (or ends) and targets as float32;
 * absent: 0 values; a string, too many values or bad arguments refused with nothing written. */
static void test_read_attr(void **state) {
    (void)state;
    const char *p = fx_write_named("attrs.h5", g_feat, g_targ, N, T, F, K, "3,1", "A,B");
    double mean[6] = {0.5, -1.25, 3, 1e-3, 7, -8}, ints[4] = {1, -2, 3, 32767}, scale = 2.5e-3;
    add_attr(p, "features", "feature_mean", H5T_IEEE_F32LE, 1, 6, mean);
    add_attr(p, "features", "ints", H5T_STD_I16LE, 1, 4, ints);
    add_attr(p, "targets", "target_scale", H5T_IEEE_F64LE, 0, 1, &scale);
    mb_dataset *ds = NULL;
    install_sentinel();
    stderr_begin();
    mb_result r = mb_dataset_open_untrusted(&ds, p, NULL);
    long err = stderr_end();
    tu_ok(r);
    assert_int_equal(err, 0);
    float out[8];
    int64_t n = -1;
    tu_ok(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", out, 8, &n));
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++) assert_true(out[i] == (float)mean[i]);
    tu_ok(mb_dataset_read_attr(ds, MB_ON_FEATURES, "ints", out, 4, &n));
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) assert_true(out[i] == (float)ints[i]);
    tu_ok(mb_dataset_read_attr(ds, MB_ON_TARGETS, "target_scale", out, 1, &n));
    assert_true(n == 1 && out[0] == (float)scale);
    tu_ok(mb_dataset_read_attr(ds, MB_ON_TARGETS, "feature_mean", out, 8, &n)); /* on the other dataset: absent */
    assert_int_equal(n, 0);
    for (int i = 0; i < 8; i++) out[i] = 42;
    tu_assert_error(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", out, 5, &n), MB_ERR_FORMAT,
                    "has 6 values (1..5 fit)");
    tu_assert_error(mb_dataset_read_attr(ds, MB_ON_FEATURES, "segment_names", out, 8, &n), MB_ERR_FORMAT,
                    "is string, not a number");
    for (int i = 0; i < 8; i++) assert_true(out[i] == 42); /* nothing written */
    assert_int_equal(n, 0);
    tu_assert_error(mb_dataset_read_attr(ds, 2, "ints", out, 8, &n), MB_ERR_INVALID_ARG, "MB_ON_FEATURES");
    tu_assert_error(mb_dataset_read_attr(ds, MB_ON_FEATURES, "ints", out, -1, &n), MB_ERR_INVALID_ARG, "bad argument");
    tu_assert_error(mb_dataset_read_attr(ds, MB_ON_FEATURES, "ints", out, 8, NULL), MB_ERR_INVALID_ARG, "bad argument");
    char longname[MB_MAX_NAME + 1];
    memset(longname, 'a', MB_MAX_NAME);
    longname[MB_MAX_NAME] = 0;
    tu_assert_error(mb_dataset_read_attr(ds, MB_ON_FEATURES, longname, out, 8, &n), MB_ERR_INVALID_ARG, "bad argument");
    assert_sentinel();
    mb_dataset_close(ds);
    H5Eset_auto2(H5E_DEFAULT, g_orig_fn, g_orig_data);
    /* in memory: no attributes */
    tu_ok(mb_dataset_open_memory(&ds, g_feat, g_targ, N, T, F, K, NULL));
    n = -1;
    tu_ok(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", out, 8, &n));
    assert_int_equal(n, 0);
    mb_dataset_close(ds);
    /* the series layout: the attributes of `ends` */
    const char *sp = fx_path("series_attrs.h5");
    write_series(sp, H5P_DEFAULT, 0);
    add_attr(sp, "ends", "feature_mean", H5T_IEEE_F32LE, 1, 3, mean);
    tu_ok(mb_dataset_open_untrusted(&ds, sp, NULL));
    tu_ok(mb_dataset_read_attr(ds, MB_ON_FEATURES, "feature_mean", out, 8, &n));
    assert_true(n == 3 && out[2] == 3);
    mb_dataset_close(ds);
}

/* The probe reads every attribute of both datasets (what the host may read later): a
 * dataset with more than 256 of them fails the probe, though a plain open takes it. */
static void test_probe_reads_attributes(void **state) {
    (void)state;
    const char *p = valid_file();
    for (int i = 0; i < 257; i++) {
        char name[32];
        double v = i;
        snprintf(name, sizeof name, "a%03d", i);
        add_attr(p, i % 2 ? "features" : "targets", name, H5T_IEEE_F32LE, 0, 1, &v);
    }
    mb_dataset *ds = NULL;
    tu_ok(mb_dataset_open_untrusted(&ds, p, NULL)); /* 128 and 129: fine */
    mb_dataset_close(ds);
    double v = 1;
    for (int i = 0; i < 130; i++) {
        char name[32];
        snprintf(name, sizeof name, "b%03d", i);
        add_attr(p, "targets", name, H5T_IEEE_F32LE, 0, 1, &v);
    }
    tu_assert_error(mb_dataset_probe(p, NULL, NULL), MB_ERR_FORMAT, "'targets' has more than 256 attributes");
    tu_ok(mb_dataset_open_file(&ds, p, NULL));
    mb_dataset_close(ds);
}

/* `segment_names` without `segments`: the missing attribute is named, in both layouts. */
static void test_names_without_segments(void **state) {
    (void)state;
    const char *p = fx_write_named("names_only.h5", g_feat, g_targ, N, T, F, K, NULL, "M1,M5");
    mb_dataset *ds = NULL;
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT,
                    "the required attribute 'segments' of 'features' is missing (it has 'segment_names'");
    p = fx_path("series_names_only.h5");
    write_series(p, H5P_DEFAULT, 0);
    hid_t file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT), e = H5Dopen2(file, "ends", H5P_DEFAULT);
    hid_t st = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(st, 5);
    hid_t a = H5Acreate2(e, "segment_names", st, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Adelete(e, "segments") >= 0 && a >= 0 && H5Awrite(a, st, "M1,M5") >= 0);
    H5Aclose(a); H5Sclose(sp); H5Tclose(st); H5Dclose(e); H5Fclose(file);
    tu_assert_error(mb_dataset_open_file(&ds, p, NULL), MB_ERR_FORMAT, "the required attribute 'segments' of 'ends' is missing");
    assert_null(ds);
}

/* Cost of the probe against a plain open on a small valid file (printed, not asserted). */
static void test_probe_cost(void **state) {
    (void)state;
    const char *p = valid_file();
    enum { REPS = 50 };
    double t0 = mb__probe_now();
    for (int i = 0; i < REPS; i++) {
        mb_dataset *ds = NULL;
        tu_ok(mb_dataset_open_file(&ds, p, NULL));
        mb_dataset_close(ds);
    }
    double t1 = mb__probe_now();
    for (int i = 0; i < REPS; i++) tu_ok(mb_dataset_probe(p, NULL, NULL));
    double t2 = mb__probe_now();
    printf("probe cost on %s (N=%d T=%d F=%d K=%d): plain open+close %.3f ms, probe %.3f ms (mean of %d)\n", p, N,
           T, F, K, (t1 - t0) * 1e3 / REPS, (t2 - t1) * 1e3 / REPS, REPS);
}

int main(void) {
    H5Eget_auto2(H5E_DEFAULT, &g_orig_fn, &g_orig_data);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_valid),
        cmocka_unit_test(test_probe_errors),
        cmocka_unit_test(test_soft_and_external_links),
        cmocka_unit_test(test_compact_layout),
        cmocka_unit_test(test_external_storage),
        cmocka_unit_test(test_filter_not_allowed),
        cmocka_unit_test(test_absurd_chunks),
        cmocka_unit_test(test_series_hostile),
        cmocka_unit_test(test_open_untrusted),
        cmocka_unit_test(test_read_attr),
        cmocka_unit_test(test_probe_reads_attributes),
        cmocka_unit_test(test_names_without_segments),
        cmocka_unit_test(test_probe_cost),
        cmocka_unit_test(test_cve_corpus),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fx_cleanup();
    return rc;
}
