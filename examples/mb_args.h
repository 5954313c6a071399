/* mb_args.h - the command-line helpers the example tools share (prepare, train_multitf,
 * inspect), so that they answer alike:
 *   tool --help, tool -h       the usage text on stdout, exit 0
 *   a flag without its value   error: --epochs needs a value (see --help)      exit 2
 *   an unknown flag            error: unknown flag '--bogus' (see --help)      exit 2
 * A value may not start with "--" (`--out --quiet` is a missing value, not a file named
 * "--quiet"); negative numbers ("-1") are values. */
#ifndef MB_ARGS_H
#define MB_ARGS_H
#include <errno.h>
#include <stdarg.h>
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

#endif /* MB_ARGS_H */
