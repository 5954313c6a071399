/* mb_args.h - what the programs (examples/ and bench/) share so that they answer alike:
 * the command line, the check of output paths, the one way to open a user's data file, the
 * clock (mba_now), and the benches' choice of CPU kernel (MB_LSTM_KERNEL).
 *   tool --help, tool -h       the usage text on stdout, exit 0
 *   a flag without its value   error: --epochs needs a value (see --help)      exit 2
 *   an unknown flag            error: unknown flag '--bogus' (see --help)      exit 2
 *   a number out of range      error: --epochs '0': expected an integer in [1, 1000000]   exit 2
 *   an output it cannot write  error: --out 'x/p.csv': its directory 'x' does not exist   exit 2
 *   an output naming an input  error: --out 'val.h5' is the input --data 'val.h5': ...   exit 2
 *   a flag given twice         error: --bars given twice ('30000', then '20000'): give it once   exit 2
 *   any other bad input        error: ... (one line)                          exit 2
 * A value may not start with "--" (`--out --quiet` is a missing value, not a file named
 * "--quiet"); negative numbers ("-1") are values. Include after megabatch.h.
 * MBA_TOOL(name) is the program's name as built: name, name_cuda (nvcc, or the CUDA
 * simulator), name_mpi, name_cuda_mpi; usage lines use it. */
#ifndef MB_ARGS_H
#define MB_ARGS_H
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _WIN32 /* the live predictor's DLL includes this file (mtf_live.h): it builds there, no tool runs there */
#include <direct.h>
#include <io.h>
#define mba__mkdir(path) _mkdir(path)
#define mba__fsync(fd) _commit(fd)
#else
#define mba__mkdir(path) mkdir(path, 0777)
#define mba__fsync(fd) fsync(fd)
#endif

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
    const char *seen[256] = {0}; /* the value each flag was given (a set flag: its name) */
    for (int i = 1; i < argc; i++) {
        const mba_flag *f = NULL;
        for (int k = 0; k < n && !f; k++) f = !flags[k].name[0] || strcmp(argv[i], flags[k].name) ? NULL : &flags[k];
        int at = f ? (int)(f - flags) : 0;
        if (f && f->name[0] && at < 256 && seen[at]) { /* a repeated flag: which one was meant? */
            const char *v = f->kind == MBA_SET ? NULL : mba_value(argc, argv, i);
            if (!v) return mba_error("%s given twice (see --help)", f->name), 0;
            return mba_error("%s given twice ('%s', then '%s'): give it once", f->name, seen[at], v), 0;
        }
        if (f && at < 256) seen[at] = f->kind == MBA_SET ? f->name : mba_value(argc, argv, i);
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

// ---- the output-path rule ----
// Every tool, before any work (docs/RELIABILITY.md, "Outputs"): an output never names an
// existing input, nor another output of the same run, compared by identity (device and
// inode: links, "./x" and "x", "d/../x" count), not by spelling; an output that does not
// exist yet is known by its directory's identity and its name. A directory, a missing
// directory (unless the tool makes it: mkdirs), a place that cannot be written, and (for a
// file written to FILE.tmp and renamed over FILE) an existing FILE that is not a regular file,
// are refused. One line `error: FLAG 'PATH': ...`, and the tool exits 2.
//   mba_file in[] = {{"--data", o.data}}, out[] = {{"--out", o.out}};   (path NULL: not given)
//   if (!mba_outputs_ok(in, 1, out, 1)) return 2;
// The writers: mba_tmp_path, mba_commit (fsync, rename, fsync of the directory).

typedef struct mba_file {
    const char *flag, *path; /* path NULL: the flag was not given */
    int mkdirs;              /* an output whose missing directories the tool makes (mba_mkdirs) */
    int renamed;             /* an output written as PATH.tmp, then renamed over PATH */
} mba_file;

/* Who a path is: an existing file's device and inode; else the nearest existing directory's
 * and the rest of the path below it ("a/b/t.h5"). */
typedef struct mba_id {
    dev_t dev;
    ino_t ino;
    char rest[1024];
    int exists, is_dir;
    char missing[1024]; /* the topmost missing directory, "" when the parent exists */
} mba_id;

/* rest without "." and empty parts, and with "x/.." dropped (parts of a path that does
 * not exist yet: no link can make ".." mean anything else). */
static inline void mba_path_tidy(char *rest) {
    char out[1024] = "";
    size_t n = 0;
    for (char *part = strtok(rest, "/"); part; part = strtok(NULL, "/")) {
        if (!strcmp(part, ".")) continue;
        if (!strcmp(part, "..") && n && strcmp(out + (strrchr(out, '/') ? strrchr(out, '/') - out + 1 : 0), "..")) {
            char *cut = strrchr(out, '/');
            n = cut ? (size_t)(cut - out) : 0;
            out[n] = 0;
            continue;
        }
        n += (size_t)snprintf(out + n, sizeof out - n, "%s%s", n ? "/" : "", part);
        if (n >= sizeof out) n = sizeof out - 1;
    }
    memcpy(rest, out, n + 1);
}

/* 0 with *id, or an errno (ENAMETOOLONG, ENOTDIR, EACCES, ...). */
static inline int mba_path_id(const char *path, mba_id *id) {
    struct stat st;
    char buf[1024];
    memset(id, 0, sizeof *id);
    if (!path[0]) return ENOENT;
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return ENAMETOOLONG;
    for (int depth = 0; depth < 64; depth++) {
        if (stat(buf, &st) == 0) {
            id->dev = st.st_dev; id->ino = st.st_ino;
            id->exists = depth == 0;
            id->is_dir = S_ISDIR(st.st_mode);
            if (depth && !id->is_dir) return ENOTDIR;
            mba_path_tidy(id->rest);
            char full[2100];
            if (depth && snprintf(full, sizeof full, "%s/%s", buf, id->rest) < (int)sizeof full && stat(full, &st) == 0) {
                id->dev = st.st_dev; id->ino = st.st_ino; /* "n1/../x": x, once n1 is made */
                id->rest[0] = 0;
                id->exists = 1;
                id->is_dir = S_ISDIR(st.st_mode);
            }
            return 0;
        }
        if (errno != ENOENT) return errno;
        size_t n = strlen(buf);
        while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;     /* "d/" is d */
        char *slash = strrchr(buf, '/');
        const char *name = slash ? slash + 1 : buf;
        char rest[1024];
        if (snprintf(rest, sizeof rest, "%s%s%s", name, id->rest[0] ? "/" : "", id->rest) >= (int)sizeof rest)
            return ENAMETOOLONG;
        memcpy(id->rest, rest, sizeof rest);
        if (depth) snprintf(id->missing, sizeof id->missing, "%s", buf);
        if (!slash) snprintf(buf, sizeof buf, ".");
        else if (slash == buf) buf[1] = 0;                   /* "/x": the root */
        else *slash = 0;
    }
    return ELOOP;
}

static inline int mba_same(const mba_id *a, const mba_id *b) {
    return a->dev == b->dev && a->ino == b->ino && !strcmp(a->rest, b->rest);
}

/* "PATH.tmp" into buf (the writers' temporary name); 0, or -1 when it does not fit. */
static inline int mba_tmp_path(const char *path, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s.tmp", path);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* One output by itself: 1, or the error printed and 0. */
static inline int mba_output_ok(const mba_file *o, mba_id *id) {
    char why[1200];
    size_t n = strlen(o->path);
    int e = mba_path_id(o->path, id);
    if (!o->path[0]) return mba_bad(o->flag, o->path, "an empty name");
    if (!e && id->exists && id->is_dir) return mba_bad(o->flag, o->path, "is a directory");
    if (e == ENOTDIR) return mba_bad(o->flag, o->path, "a part of the path is not a directory");
    if (e) {
        snprintf(why, sizeof why, "cannot write: %s", strerror(e));
        return mba_bad(o->flag, o->path, why);
    }
    if (o->path[n - 1] == '/') return mba_bad(o->flag, o->path, "names a directory, not a file");
    if (id->missing[0] && !o->mkdirs) {
        snprintf(why, sizeof why, "its directory '%s' does not exist", id->missing);
        return mba_bad(o->flag, o->path, why);
    }
    struct stat st;
    if (id->exists && o->renamed && stat(o->path, &st) == 0 && !S_ISREG(st.st_mode))
        return mba_bad(o->flag, o->path, "is not a regular file (it is written to a temporary file, then renamed over)");
    /* the place it is written: the file itself when it exists, and the directory that
     * will hold it (a temporary file, or a new one) */
    char dir[1024];
    const char *slash = strrchr(o->path, '/');
    if (id->missing[0]) { /* the nearest existing directory, made into by mba_mkdirs */
        snprintf(dir, sizeof dir, "%s", id->missing);
        char *s2 = strrchr(dir, '/');
        if (!s2) snprintf(dir, sizeof dir, ".");
        else if (s2 == dir) dir[1] = 0;
        else *s2 = 0;
    } else if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == o->path ? 1 : (int)(slash - o->path), o->path);
    if ((id->exists && access(o->path, W_OK)) || ((!id->exists || o->renamed) && access(dir, W_OK))) {
        snprintf(why, sizeof why, "cannot write: %s", strerror(errno));
        return mba_bad(o->flag, o->path, why);
    }
    return 1;
}

/* The rule over a run's inputs (nin) and outputs (nout); entries with a NULL path are not
 * given. A flag that is both (--ckpt with --resume) is not compared with itself. 1, or the
 * error printed and 0. */
static inline int mba_outputs_ok(const mba_file *in, int nin, const mba_file *out, int nout) {
    enum { MAX = 32 };
    mba_id oid[MAX], tid[MAX], iid;
    if (nout > MAX) nout = MAX;
    for (int i = 0; i < nout; i++) {
        if (!out[i].path) continue;
        if (!mba_output_ok(&out[i], &oid[i])) return 0;
        char tmp[1100];
        memset(&tid[i], 0, sizeof tid[i]);
        if (out[i].renamed && (mba_tmp_path(out[i].path, tmp, sizeof tmp) || mba_path_id(tmp, &tid[i])))
            tid[i].rest[0] = '\a'; /* no temporary name to compare */
    }
    for (int i = 0; i < nout; i++) {
        if (!out[i].path) continue;
        for (int j = 0; j < nin; j++) {
            if (!in[j].path || !strcmp(in[j].flag, out[i].flag) || mba_path_id(in[j].path, &iid)) continue;
            if (mba_same(&iid, &oid[i]))
                return mba_error("%s '%s' is the input %s '%s': an output never replaces an input (choose another name)",
                                 out[i].flag, out[i].path, in[j].flag, in[j].path), 0;
            if (out[i].renamed && mba_same(&iid, &tid[i]))
                return mba_error("%s '%s': its temporary file '%s.tmp' is the input %s '%s' (choose another name)",
                                 out[i].flag, out[i].path, out[i].path, in[j].flag, in[j].path), 0;
        }
        for (int j = 0; j < i; j++) {
            if (!out[j].path) continue;
            if (mba_same(&oid[j], &oid[i]))
                return mba_error("%s '%s' is also %s '%s': each output needs a file of its own", out[i].flag,
                                 out[i].path, out[j].flag, out[j].path), 0;
            if ((out[i].renamed && mba_same(&oid[j], &tid[i])) || (out[j].renamed && mba_same(&oid[i], &tid[j])))
                return mba_error("%s '%s' and %s '%s': one is the other's temporary file (choose other names)",
                                 out[i].flag, out[i].path, out[j].flag, out[j].path), 0;
        }
    }
    return 1;
}

/* Make the missing directories of path's directory (mkdir -p of its dirname). 0, or -1
 * with the directory that could not be made in dir and errno set. */
static inline int mba_mkdirs(const char *path, char *dir, size_t cap) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
    char *last = strrchr(buf, '/');
    if (!last || last == buf) return 0;
    *last = 0;
    for (char *p = buf + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        struct stat st;
        if (stat(buf, &st) != 0 && mba__mkdir(buf) != 0 && errno != EEXIST) {
            snprintf(dir, cap, "%s", buf);
            return -1;
        }
        *p = c;
        if (!c) return 0;
    }
}

/* The file written at tmp (closed) made path: fsynced, renamed over path, the directory
 * fsynced. When tmp is path itself (mba_tmp_path's caller wrote a non-regular file in
 * place, e.g. /dev/null), nothing to rename. 0, or -1 with errno set (tmp removed). */
static inline int mba_commit(const char *tmp, const char *path) {
    if (!strcmp(tmp, path)) return 0;
    int fd = open(tmp, O_RDONLY), e = 0;
    if (fd < 0 || mba__fsync(fd) != 0) e = errno;
    if (fd >= 0) close(fd);
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) { unlink(tmp); errno = e; return -1; }
    char dir[1024];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == path ? 1 : (int)(slash - path)) : 1, slash ? path : ".");
    if ((fd = open(dir, O_RDONLY)) >= 0) { mba__fsync(fd); close(fd); } /* best effort: the rename is done */
    return 0;
}

/* Where a writer writes path: PATH.tmp (then mba_commit), or path itself when it exists and
 * is not a regular file (a device such as /dev/null: never renamed over). 0, or -1. */
static inline int mba_write_path(const char *path, char *buf, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return snprintf(buf, cap, "%s", path) < (int)cap ? 0 : -1;
    return mba_tmp_path(path, buf, cap);
}

/* A library error as the user reads it: without the internal function names that lead it
 * ("mb_st_open: mb_ckpt_open: 'x': ..." is "'x': ..."). MB_DEBUG=1 in the environment
 * prints the whole message first, as a `debug:` line. */
static inline const char *mba_user_text(const char *msg) {
    const char *s = msg;
    if (getenv("MB_DEBUG")) fprintf(stderr, "debug: %s\n", msg);
    for (;;) {
        const char *p = s;
        while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_') p++;
        int ident = p > s && memchr(s, '_', (size_t)(p - s)) && (!strncmp(s, "mb", 2) || !strncmp(s, "mtf", 3));
        if (!ident || p[0] != ':' || p[1] != ' ') return s;
        s = p + 2;
    }
}

/* The error line for a failed library call, in the user's words (mba_user_text); returns 2. */
static inline int mba_fail(const char *msg) { return mba_error("%s", mba_user_text(msg)); }

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
    struct stat st;
    *ds = NULL;
    if (stat(path, &st) != 0) return MB_FAIL(NULL, MB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return MB_FAIL(NULL, MB_ERR_IO, "'%s' is a directory, not an HDF5 data file", path);
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
