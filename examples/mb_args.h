/* mb_args.h - the command-line helpers the example tools share (prepare, train_multitf,
 * train_minimal, inspect, predict), so that they answer alike:
 *   tool --help, tool -h       the usage text on stdout, exit 0
 *   a flag without its value   error: --epochs needs a value (see --help)      exit 2
 *   an unknown flag            error: unknown flag '--bogus' (see --help)      exit 2
 * A value may not start with "--" (`--out --quiet` is a missing value, not a file named
 * "--quiet"); negative numbers ("-1") are values. */
#ifndef MB_ARGS_H
#define MB_ARGS_H
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The value v of flag f into its field; 1 when good, else the error printed and 0. */
static inline int mba_store(const mba_flag *f, const char *v) {
    double x = 0;
    if (f->kind == MBA_STR) { *(const char **)f->dst = v; return 1; }
    if (f->kind == MBA_CHOICE) return mba_choice(f, v);
    if (mba_number(v, f->lo, f->hi, &x)) {
        char want[96];
        snprintf(want, sizeof want, "expected a number in [%g, %g]", f->lo, f->hi);
        return mba_bad(f->name, v, want);
    }
    switch (f->kind) {
    case MBA_INT: *(int *)f->dst = (int)x; break;
    case MBA_I64: *(int64_t *)f->dst = (int64_t)x; break;
    case MBA_U64: *(uint64_t *)f->dst = (uint64_t)x; break;
    case MBA_F32: *(float *)f->dst = (float)x; break;
    default: *(double *)f->dst = x; break;
    }
    return 1;
}

/* Every argument of argv against the n flags; 1 when all are good, else the one error
 * line printed and 0 (the tool exits 2). */
static inline int mba_parse(int argc, char **argv, const mba_flag *flags, int n) {
    for (int i = 1; i < argc; i++) {
        const mba_flag *f = NULL;
        for (int k = 0; k < n && !f; k++) f = strcmp(argv[i], flags[k].name) ? NULL : &flags[k];
        if (!f) return mba_unknown(argv[i]), 0;
        if (f->kind == MBA_SET) { *(int *)f->dst = 1; continue; }
        const char *v = mba_value(argc, argv, i++);
        if (!v) return mba_missing(f->name), 0;
        if (!mba_store(f, v)) return 0;
    }
    return 1;
}

#endif /* MB_ARGS_H */
