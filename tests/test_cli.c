/* Every program's command line answers alike (examples/mb_args.h; run from the repository
 * root, after `make build`): --help and -h print the usage on stdout (every flag the program
 * takes is in it, and the first line names the build: predict, predict_cuda, ...) and exit 0;
 * each flag given without its value, or followed by the next flag, and an unknown flag exit
 * 2 with exactly one line in one style. Every program under examples/ and bench/ must have
 * its row here (test_every_program_listed), so a new one cannot skip these checks. */
#define _POSIX_C_SOURCE 200809L /* popen */
#include "megabatch.h"
#include "testutil.h"
#include <ctype.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct tool {
    const char *bin;             /* build/NAME; its _cuda, _mpi and _cuda_mpi builds run too where built */
    const char *value_flags[40]; /* flags that take a value */
    const char *plain_flags[8];  /* flags without one */
} tool;

static const tool tools[] = {
    {"build/prepare",
     {"--csv", "--out-train", "--out-val", "--bars", "--seed", "--features", "--targets", "--stride", "--max-samples",
      "--val-fraction", "--layout", "--write-mt5"},
     {"--synthetic", "--skip-bad", "--quiet", "--list-features"}},
    {"build/train_multitf",
     {"--train", "--val", "--metrics", "--plot", "--ckpt", "--ckpt-every", "--epochs", "--batch", "--hidden", "--head",
      "--layers", "--accum", "--threads", "--checkpoint-k", "--max-batches", "--warmup", "--seed", "--lr", "--clip",
      "--weight-decay", "--chunk-fraction", "--schedule", "--precision", "--loss", "--export", "--init",
      "--export-onnx", "--cpu-kernel", "--ema", "--swa-start", "--patience", "--walk-forward", "--wf-window", "--dropout"},
     {"--carry", "--quiet", "--resume", "--no-ftz", "--keep-best"}},
    {"build/inspect", {"--gpu-mem", "--batch", "--dtype"}, {"--no-probe"}},
    {"build/predict", {"--model", "--data", "--out", "--csv", "--batch", "--threads", "--to-onnx", "--loss"},
     {"--live", "--stateful", "--quiet", "--metrics"}},
    {"build/train_minimal", {"--train", "--val", "--epochs", "--hidden", "--batch", "--lr", "--seed"}, {NULL}},
    {"build/quickstart", {NULL}, {NULL}},
    {"build/bench/bench_loader",
     {"--bytes", "--batch", "--chunk-mb", "--slab-mb", "--compute-ms", "--epochs", "--t", "--f", "--file"},
     {"--keep", "--gpu"}},
    {"build/bench/bench_series", {"--window", "--series", "--batch", "--epochs", "--reps", "--chunk-mb"},
     {"--shuffle", "--gpu"}},
    {"build/bench/bench_lstm", {NULL}, {"--no-ftz"}},
    {"build/bench/bench_live", {NULL}, {NULL}},
    {"build/bench/bench_dist", {NULL}, {NULL}},
    {"build/bench/bench_lstm_launches", {NULL}, {NULL}},
    {"build/bench/peak_fma", {NULL}, {NULL}},
    {"build/bench/bench_rk", {NULL}, {NULL}},
    {"build/bench/bench_avg", {NULL}, {NULL}},
};
enum { NTOOLS = sizeof tools / sizeof *tools };
static const char *const variants[] = {"", "_cuda", "_mpi", "_cuda_mpi"};

/* Run "bin args"; stdout and stderr into out/err; the exit status (-1: a signal). */
static int run(const char *bin, const char *args, char *out, size_t ocap, char *err, size_t ecap) {
    char cmd[512], path[64];
    snprintf(path, sizeof path, "/tmp/mb_cli_err_%d.txt", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", bin, args, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, ocap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    n = fread(err, 1, ecap - 1, f);
    err[n] = 0;
    fclose(f);
    remove(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_one_error(const char *bin, const char *args, const char *want) {
    static char out[1 << 16], err[4096];
    int rc = run(bin, args, out, sizeof out, err, sizeof err);
    char *nl = strchr(err, '\n');
    if (rc != 2 || out[0] || strcmp(err, want) != 0 || !nl || nl[1])
        fail_msg("%s %s: exit %d, stderr '%s', stdout '%.80s'; want exit 2 and '%s'", bin, args, rc, err, out, want);
}

/* 1 when the first line of out has name as a word (between spaces or brackets). */
static int names(const char *out, const char *name) {
    size_t len = strcspn(out, "\n"), n = strlen(name);
    for (const char *p = out; p + n <= out + len; p++)
        if (!strncmp(p, name, n) && (p == out || strchr(" [", p[-1])) && (p + n == out + len || strchr(" ]", p[n])))
            return 1;
    return 0;
}

/* 1 when flag is in out as a whole flag: not followed by another flag character, so "--f"
 * is not found in "--file" (nor "--batch" in "--batch-size"). */
static int has_flag(const char *out, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = strstr(out, flag); p; p = strstr(p + 1, flag)) {
        char before = p == out ? ' ' : p[-1], after = p[n];
        if (!(isalnum((unsigned char)before) || before == '-' || before == '_') &&
            !(isalnum((unsigned char)after) || after == '-' || after == '_'))
            return 1;
    }
    return 0;
}

/* Whether make builds variant v of tool t on this machine: the plain build always; _cuda
 * when there is nvcc and a NAME_cuda.cu source; _mpi and _cuda_mpi when there is mpicc (and
 * nvcc) and the Makefile names that build (MPI_TARGETS, CUDA_TARGETS). */
static int on_path(const char *prog) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/%s ]", prog, prog);
    return system(cmd) == 0;
}
static int env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && !strcmp(v, value);
}
static int source(const char *name, const char *suffix) { /* examples/NAME<suffix> or bench/NAME<suffix> */
    char path[160];
    for (int d = 0; d < 2; d++) {
        snprintf(path, sizeof path, "%s/%s%s", d ? "bench" : "examples", name, suffix);
        if (access(path, R_OK) == 0) return 1;
    }
    return 0;
}
static int expected(int t, int v) {
    static int nvcc = -1, mpicc = -1;
    if (nvcc < 0) { nvcc = on_path("nvcc") && !env_is("NO_CUDA", "1"); mpicc = on_path("mpicc") && !env_is("NO_MPI", "1"); }
    const char *name = strrchr(tools[t].bin, '/') + 1;
    int cuda = source(name, "_cuda.cu");
    if (v == 0) return source(name, ".c") || (nvcc && source(name, ".cu")); /* a .cu program needs nvcc */
    if (v == 1) return nvcc && cuda;
    if (!mpicc || (v == 3 && !(nvcc && cuda))) return 0;
    FILE *f = fopen("Makefile", "r"); /* the Makefile's own rule for NAME_mpi / NAME_cuda_mpi */
    if (!f) return 0;
    char line[1024], want[96];
    snprintf(want, sizeof want, "/%s%s", name, variants[v]);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *p = strstr(line, want);
        found = p && strchr(" \t\n:", p[strlen(want)]) && (strstr(line, "MPI_TARGETS") || strstr(line, "CUDA_TARGETS"));
    }
    fclose(f);
    return found;
}

/* A build of tool t that make builds here but that is not there: under CI=true a failure;
 * otherwise one line that says so, and the test ends skipped (after the builds that exist). */
static int missing;
static void note_missing(const char *bin) {
    if (env_is("CI", "true")) fail_msg("%s is not built (CI=true: a missing build fails; make build BENCH=1)", bin);
    printf("skipped: %s is not built (make build; benchmarks: make bench; CUDA programs: make cuda)\n", bin);
    missing++;
}

/* The builds of tool t that exist: path of variant v into buf; 0 when not built (a build
 * make makes here and that is missing: note_missing). */
static int built(int t, int v, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", tools[t].bin, variants[v]);
    if (access(buf, X_OK) == 0) return 1;
    if (expected(t, v)) note_missing(buf);
    return 0;
}

static void test_help(void **state) {
    (void)state;
    int ran = 0;
    for (int t = 0; t < NTOOLS; t++)
        for (int v = 0; v < 4; v++) {
            char bin[128];
            if (!built(t, v, bin, sizeof bin)) continue;
            static char out[1 << 16], err[4096], first[1 << 16];
            const char *forms[] = {"--help", "-h", "--quiet --help"};
            for (int f = 0; f < 3; f++) {
                int rc = run(bin, forms[f], out, sizeof out, err, sizeof err);
                if (rc != 0 || err[0] || strncmp(out, "usage: ", 7) != 0)
                    fail_msg("%s %s: exit %d, stderr '%s', stdout '%.60s'", bin, forms[f], rc, err, out);
                if (f == 0) strcpy(first, out);
                else assert_string_equal(out, first);
            }
            /* the first line names this build: "predict_cuda" in predict_cuda's, no "_cuda" in predict's */
            if (!names(out, strrchr(bin, '/') + 1))
                fail_msg("%s --help: the usage line '%.*s' does not name %s", bin, (int)strcspn(out, "\n"), out, bin);
            for (int i = 0; i < 32 && tools[t].value_flags[i]; i++)
                if (!has_flag(out, tools[t].value_flags[i])) fail_msg("%s --help lacks %s", bin, tools[t].value_flags[i]);
            for (int i = 0; i < 8 && tools[t].plain_flags[i]; i++)
                if (!has_flag(out, tools[t].plain_flags[i])) fail_msg("%s --help lacks %s", bin, tools[t].plain_flags[i]);
            ran++;
        }
    if (!ran || missing) { missing = 0; skip(); }
}

static void test_missing_value_and_unknown_flag(void **state) {
    (void)state;
    int ran = 0;
    for (int t = 0; t < NTOOLS; t++)
        for (int v = 0; v < 4; v++) {
            char bin[128];
            if (!built(t, v, bin, sizeof bin)) continue;
            char args[128], want[256];
            for (int i = 0; i < 32 && tools[t].value_flags[i]; i++) {
                const char *flag = tools[t].value_flags[i];
                snprintf(want, sizeof want, "error: %s needs a value (see --help)\n", flag);
                expect_one_error(bin, flag, want);               /* at the end */
                snprintf(args, sizeof args, "%s --quiet", flag); /* followed by a flag */
                expect_one_error(bin, args, want);
            }
            expect_one_error(bin, "--bogus", "error: unknown flag '--bogus' (see --help)\n");
            expect_one_error(bin, "-x", "error: unknown flag '-x' (see --help)\n");
            ran++;
        }
    if (!ran || missing) { missing = 0; skip(); }
}

/* Every program under examples/ and bench/ (a .c or .cu with a main) has its row in tools[]
 * (a .cu build of a .c is the same program: NAME_cuda.cu -> NAME). */
static void test_every_program_listed(void **state) {
    (void)state;
    const char *dirs[] = {"examples", "bench"};
    int seen = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) fail_msg("no %s/ here: run from the repository root", dirs[d]);
        for (struct dirent *e; (e = readdir(dir)) != NULL;) {
            char name[256];
            snprintf(name, sizeof name, "%s", e->d_name);
            char *dot = strrchr(name, '.');
            if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".cu"))) continue;
            *dot = 0;
            size_t n = strlen(name);
            if (n > 5 && !strcmp(name + n - 5, "_cuda")) name[n - 5] = 0;
            int found = 0;
            for (int t = 0; t < NTOOLS && !found; t++) found = !strcmp(strrchr(tools[t].bin, '/') + 1, name);
            if (!found) fail_msg("%s/%s has no row in tests/test_cli.c's tools[]", dirs[d], e->d_name);
            seen++;
        }
        closedir(dir);
    }
    assert_true(seen >= NTOOLS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_missing_value_and_unknown_flag),
        cmocka_unit_test(test_every_program_listed),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
