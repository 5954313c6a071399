/* mb_args.h - what the programs (examples/ and bench/) share so that they answer alike:
 * the command line, the check of output paths, the one way to open a user's data file, the
 * clock (mba_now), and the benches' choice of CPU kernel (MB_LSTM_KERNEL).
 *   tool --help, tool -h       the usage text on stdout, exit 0
 *   a flag without its value   error: --epochs needs a value (see --help)      exit 2
 *   an unknown flag            error: unknown flag '--bogus' (see --help)      exit 2
 *   a number out of range      error: --epochs '0': expected an integer in [1, 1000000]   exit 2
 *   an output it cannot write  error: --out 'x/p.csv': cannot write: No such file or directory   exit 2
 *   any other bad input        error: ... (one line)                          exit 2
 * A value may not start with "--" (`--out --quiet` is a missing value, not a file named
 * "--quiet"); negative numbers ("-1") are values. Include after megabatch.h.
 * MBA_TOOL(name) is the program's name as built: name, name_cuda (nvcc, or the CUDA
 * simulator), name_mpi, name_cuda_mpi; usage lines use it. */
#ifndef MB_ARGS_H
#define MB_ARGS_H
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Seconds on the monotonic clock (POSIX clock_gettime): the programs' one timer, for rates,
 * latencies and the progress bar's throttle. */
static inline double mba_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Print "error: ..." and a newline on stderr; returns 2, the tools' exit status. */
static inline int mba_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static inline int mba_missing(const char *flag) { return mba_error("%s needs a value (see --help)", flag); }
static inline int mba_unknown(const char *flag) { return mba_error("unknown flag '%s' (see --help)", flag); }

/* 1 when --help or -h is among the arguments. */
static inline int mba_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

/* 1 when a looks like a flag ("--x", "-x"; "-1" is a number): programs that take numbers
 * only refuse such an argument as an unknown flag. */
static inline int mba_flag_like(const char *a) {
    return a[0] == '-' && (a[1] == '-' || (a[1] >= 'a' && a[1] <= 'z') || (a[1] >= 'A' && a[1] <= 'Z'));
}

/* The usage text on stdout; returns 0, the exit status. */
static inline int mba_help(const char *usage) {
    fputs(usage, stdout);
    return 0;
}

/* The value after argv[i], or NULL when there is none or it is the next flag. */
static inline const char *mba_value(int argc, char **argv, int i) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    return v && strncmp(v, "--", 2) != 0 ? v : NULL;
}

#if defined(__CUDACC__) && defined(MEGABATCH_MPI)
#define MBA_TOOL(name) name "_cuda_mpi"
#elif defined(__CUDACC__)
#define MBA_TOOL(name) name "_cuda"
#elif defined(MEGABATCH_MPI)
#define MBA_TOOL(name) name "_mpi"
#else
#define MBA_TOOL(name) name
#endif

/* s as a number in [lo, hi] (the whole string); 0 on success, -1 otherwise. */
static inline int mba_number(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno || !(x >= lo && x <= hi)) return -1;
    *out = x;
    return 0;
}

/* s as an integer in [lo, hi] (decimal, the whole string); 0 on success, -1 otherwise. */
static inline int mba_long(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* ---- a table of flags ----
 * A tool lists its flags once, each with where its value goes, and mba_parse reads argv:
 *   mba_flag flags[] = {{"--epochs", MBA_INT, &o.epochs, 1, 1e6}, {"--quiet", MBA_SET, &o.quiet},
 *                       {"--train", MBA_STR, &o.train}, {"--loss", MBA_CHOICE, &o.loss, 0, 0, losses}};
 * Numbers are read as doubles in [lo, hi] and stored truncated to the field's type; a
 * choice stores the index of its name (into an int or an enum field); MBA_SET stores 1.
 * Errors, one line each: `error: --epochs '0': expected a number in [1, 1e+06]`,
 * `error: --loss 'l1': expected mse or huber`, and those above. */
typedef enum mba_kind { MBA_SET, MBA_STR, MBA_INT, MBA_I64, MBA_U64, MBA_F32, MBA_F64, MBA_CHOICE } mba_kind;
typedef struct mba_flag {
    const char *name;
    mba_kind kind;
    void *dst;                  /* int (MBA_SET, MBA_INT, MBA_CHOICE or an enum), int64_t, uint64_t, float,
                                   double or const char * */
    double lo, hi;              /* numbers */
    const char *const *choices; /* MBA_CHOICE: the names, NULL-terminated */
} mba_flag;

/* "error: FLAG 'VALUE': WANT"; returns 0 (the flags are bad). */
static inline int mba_bad(const char *flag, const char *value, const char *want) {
    mba_error("%s '%s': %s", flag, value, want);
    return 0;
}

static inline int mba_choice(const mba_flag *f, const char *v) {
    char want[256] = "expected ";
    for (int i = 0; f->choices[i]; i++) {
        if (!strcmp(v, f->choices[i])) { memcpy(f->dst, &i, sizeof i); return 1; }
        size_t n = strlen(want);
        snprintf(want + n, sizeof want - n, "%s%s", !i ? "" : f->choices[i + 1] ? ", " : " or ", f->choices[i]);
    }
    return mba_bad(f->name, v, want);
}

/* "error: FLAG 'VALUE': expected an integer in [LO, HI]" (or "a number"); returns 0. */
static inline int mba_range(const mba_flag *f, const char *v) {
    char want[128];
    if (f->kind == MBA_INT || f->kind == MBA_I64 || f->kind == MBA_U64)
        snprintf(want, sizeof want, "expected an integer in [%.0f, %.0f]", f->lo, f->hi);
    else
        snprintf(want, sizeof want, "expected a number in [%.9g, %.9g]", f->lo, f->hi);
    return mba_bad(f->name, v, want);
}

/* The value v of flag f into its field; 1 when good, else the error printed and 0. */
static inline int mba_store(const mba_flag *f, const char *v) {
    double x = 0;
    if (f->kind == MBA_STR) { *(const char **)f->dst = v; return 1; }
    if (f->kind == MBA_CHOICE) return mba_choice(f, v);
    int integral = f->kind == MBA_INT || f->kind == MBA_I64 || f->kind == MBA_U64;
    if (mba_number(v, f->lo, f->hi, &x) || (integral && x != (double)(long long)x)) return mba_range(f, v);
    switch (f->kind) {
    case MBA_INT: *(int *)f->dst = (int)x; break;
    case MBA_I64: *(int64_t *)f->dst = (int64_t)x; break;
    case MBA_U64: *(uint64_t *)f->dst = (uint64_t)x; break;
    case MBA_F32: *(float *)f->dst = (float)x; break;
    default: *(double *)f->dst = x; break;
    }
    return 1;
}

/* One positional argument (a benchmark's B, T, ...) into dst, checked as a flag's value
 * is: 1, or `error: NAME 'V': expected ...` printed and 0 (choices: for MBA_CHOICE). */
static inline int mba_arg(const char *name, const char *v, mba_kind kind, void *dst, double lo, double hi,
                          const char *const *choices) {
    mba_flag f = {name, kind, dst, lo, hi, choices};
    return mba_store(&f, v);
}

/* Every argument of argv against the n flags; 1 when all are good, else the one error
 * line printed and 0 (the tool exits 2). A flag named "" (MBA_STR) takes the one argument
 * that is not a flag (inspect's FILE); without it such an argument is an error. */
static inline int mba_parse(int argc, char **argv, const mba_flag *flags, int n) {
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        const mba_flag *f = NULL;
        for (int k = 0; k < n && !f; k++) f = strcmp(argv[i], flags[k].name) ? NULL : &flags[k];
        if (!f && argv[i][0] != '-') {
            for (int k = 0; k < n && !f; k++) f = flags[k].name[0] ? NULL : &flags[k];
            if (!f) return mba_error("unexpected argument '%s' (see --help)", argv[i]), 0;
            if (positional++) return mba_error("more than one file: '%s' (see --help)", argv[i]), 0;
            *(const char **)f->dst = argv[i];
            continue;
        }
        if (!f) return mba_unknown(argv[i]), 0;
        if (f->kind == MBA_SET) { *(int *)f->dst = 1; continue; }
        const char *v = mba_value(argc, argv, i++);
        if (!v) return mba_missing(f->name), 0;
        if (!mba_store(f, v)) return 0;
    }
    return 1;
}

/* Can the program write path (a file it will create or replace)? Checked before any work,
 * without touching the file: it is writable, or it is absent and its directory writable.
 * 1, or `error: FLAG 'PATH': cannot write: REASON` printed and 0. */
static inline int mba_writable(const char *flag, const char *path) {
    char dir[1024], why[160];
    const char *slash = strrchr(path, '/');
    struct stat st;
    int n = slash ? (int)(slash - path) : 0, bad = 0;
    snprintf(dir, sizeof dir, "%.*s", n ? n : 1, slash ? path : ".");
    if (!path[0] || (slash && !slash[1])) bad = EISDIR;
    else if (stat(path, &st) == 0) bad = S_ISDIR(st.st_mode) ? EISDIR : access(path, W_OK) ? errno : 0;
    else bad = errno != ENOENT ? errno : access(dir, W_OK) ? errno : 0;
    if (!bad) return 1;
    snprintf(why, sizeof why, "cannot write: %s", strerror(bad));
    return mba_bad(flag, path, why);
}

/* The one way every program opens a data file it is handed (docs/RELIABILITY.md): probe = 1
 * (always, but for inspect --no-probe) is mb_dataset_open_untrusted: the file opened,
 * validated and read in a child process first, so a file that crashes or hangs HDF5 ends in
 * an error, then opened in this process. The probe gives up after 10 s, or MB_PROBE_TIMEOUT
 * seconds (0.1..3600) from the environment (slow disks; the hostile-file tests use 2).
 * Open every file before any loader starts (the probe forks). */
static inline mb_result mba_open_data(const char *path, int probe, mb_dataset **ds) {
    mb_dataset_config dc;
    double to = 0;
    memset(&dc, 0, sizeof dc);
    if (!mba_number(getenv("MB_PROBE_TIMEOUT"), 0.1, 3600, &to)) dc.probe_timeout_s = to;
    return probe ? mb_dataset_open_untrusted(ds, path, &dc) : mb_dataset_open_file(ds, path, &dc);
}

/* MB_LSTM_KERNEL=auto|avx512|avx2|c from the environment (the benches): the CPU LSTM's kernel
 * variant (mb_device_config.cpu_kernel) into *out; unset or empty: auto. Returns 0, or
 * prints an error and returns 1 for any other value. */
static inline int mba_cpu_kernel(mb_cpu_kernel *out) {
    static const char *const names[] = {"auto", "avx512", "avx2", "c"}; /* mb_cpu_kernel's order */
    const char *want = getenv("MB_LSTM_KERNEL");
    *out = MB_CPU_KERNEL_AUTO;
    if (!want || !*want) return 0;
    for (int v = 0; v < 4; v++)
        if (!strcmp(want, names[v])) { *out = (mb_cpu_kernel)v; return 0; }
    fprintf(stderr, "error: MB_LSTM_KERNEL=%s: expected auto, avx512, avx2 or c\n", want);
    return 1;
}

#endif /* MB_ARGS_H */
