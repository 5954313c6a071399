/* The example tools' command lines answer alike (examples/mb_args.h; run from the
 * repository root, after `make build`): --help and -h print the usage on stdout (every
 * flag the tool takes is in it) and exit 0; each flag given without its value, or followed
 * by the next flag, and an unknown flag exit 2 with exactly one line in one style. */
#define _POSIX_C_SOURCE 200809L /* popen */
#include "megabatch.h"
#include "testutil.h"
#include <sys/wait.h>
#include <unistd.h>

typedef struct tool {
    const char *bin;
    const char *value_flags[32]; /* flags that take a value */
    const char *plain_flags[8];  /* flags without one */
} tool;

static const tool tools[] = {
    {"build/prepare",
     {"--csv", "--out-train", "--out-val", "--bars", "--seed", "--features", "--targets", "--stride", "--max-samples",
      "--val-fraction"},
     {"--synthetic", "--skip-bad", "--quiet", "--list-features"}},
    {"build/train_multitf",
     {"--train", "--val", "--metrics", "--plot", "--ckpt", "--ckpt-every", "--epochs", "--batch", "--hidden", "--head",
      "--layers", "--accum", "--threads", "--checkpoint-k", "--max-batches", "--warmup", "--seed", "--lr", "--clip",
      "--weight-decay", "--chunk-fraction", "--schedule", "--precision", "--loss", "--export", "--init"},
     {"--carry", "--quiet", "--resume"}},
    {"build/inspect", {"--gpu-mem", "--batch", "--dtype"}, {"--no-probe"}},
    {"build/predict", {"--model", "--data", "--out", "--csv", "--batch", "--threads"}, {"--live", "--stateful", "--quiet"}},
    {"build/train_minimal", {"--train", "--val", "--epochs", "--hidden", "--batch", "--lr", "--seed"}, {NULL}},
};

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

static void test_help(void **state) {
    (void)state;
    int ran = 0;
    for (size_t t = 0; t < sizeof tools / sizeof *tools; t++) {
        if (access(tools[t].bin, X_OK) != 0) continue;
        static char out[1 << 16], err[4096], first[1 << 16];
        const char *forms[] = {"--help", "-h", "--quiet --help"};
        for (int f = 0; f < 3; f++) {
            assert_int_equal(run(tools[t].bin, forms[f], out, sizeof out, err, sizeof err), 0);
            assert_string_equal(err, "");
            assert_int_equal(strncmp(out, "usage: ", 7), 0);
            if (f == 0) strcpy(first, out);
            else assert_string_equal(out, first);
        }
        for (int i = 0; i < 32 && tools[t].value_flags[i]; i++)
            if (!strstr(out, tools[t].value_flags[i])) fail_msg("%s --help lacks %s", tools[t].bin, tools[t].value_flags[i]);
        for (int i = 0; i < 8 && tools[t].plain_flags[i]; i++)
            if (!strstr(out, tools[t].plain_flags[i])) fail_msg("%s --help lacks %s", tools[t].bin, tools[t].plain_flags[i]);
        ran++;
    }
    if (!ran) skip();
}

static void test_missing_value_and_unknown_flag(void **state) {
    (void)state;
    int ran = 0;
    for (size_t t = 0; t < sizeof tools / sizeof *tools; t++) {
        const char *bin = tools[t].bin;
        if (access(bin, X_OK) != 0) continue;
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
    if (!ran) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_missing_value_and_unknown_flag),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
