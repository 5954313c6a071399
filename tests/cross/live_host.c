/* live_host - a C host of the live predictor's DLL, as a Windows trading tool would load it:
 * LoadLibrary + GetProcAddress (dlopen + dlsym on Linux), nothing linked at build time.
 *
 *   live_host LIB MODEL CSV OUT [window|stateful]
 *
 * Replays the MT5 export CSV through the library one bar at a time and writes OUT in the
 * format of `predict --live --out` (rows parsed by prepare's own parser, mb_csv.h; the same
 * lines: time, ok + K predictions as %.9g, warmup, or refused + the reason), so that
 * `cmp` against Linux's predict shows bitwise equality (%.9g round-trips a float).
 * On the way it plants faults and checks that each gives its error code and changes
 * nothing (the replay's lines stay those of predict, which saw no faults):
 *   - a wrong-shaped array (pred_len K-1, and push_bars with too few elements);
 *   - a bar out of order (an hour before the last accepted one) and a duplicate;
 *   - a bad model file (OUT.bad: garbage) and a missing one, opened next to the handle;
 *   - NULL output, a handle never opened, a closed handle;
 * and replays the accepted bars again through mtfl_push_bars on a second handle (chunks of
 * 1000), whose rows must be the first handle's predictions bit for bit (NaN in warm-up).
 * Prints one summary line; exit 0 when every check held, 1 otherwise, 2 on bad usage. */
#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#else
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#endif
#include "megabatch.h"
#include "examples/mb_features.h"
#include "examples/mb_csv.h"
#include "examples/dll/mtf_live_dll.h"
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*open_fn)(const char *, int, int);
typedef int (*int_fn)(int);
typedef long long (*bars_fn)(int);
typedef int (*push_fn)(int, long long, double, double, double, double, double, double *, int);
typedef int (*pushf_fn)(int, long long, double, double, double, double, double, float *, int);
typedef int (*push_bars_fn)(int, const long long *, const double *, const double *, const double *, const double *,
                            const double *, int, double *, int);
typedef int (*err_fn)(char *, int);

static struct {
    int (*version)(void);
    open_fn open;
    int_fn close, outputs;
    bars_fn bars;
    push_fn push;
    pushf_fn push_f;
    push_bars_fn push_bars;
    err_fn last_error;
} L;

static int checks, failures;
static void check(int ok, const char *what, int got) {
    checks++;
    if (!ok) {
        char e[512];
        L.last_error(e, sizeof e);
        fprintf(stderr, "live_host: FAILED: %s (got %d; last error: %s)\n", what, got, e);
        failures++;
    }
}

/* The library's function `name` into *dst (a function pointer), bytes copied: ISO C has no
 * conversion between object and function pointers, and the loaders return one or the other. */
static void sym(void *lib, const char *name, void *dst) {
#ifdef _WIN32
    FARPROC p = GetProcAddress((HMODULE)lib, name);
#else
    void *p = dlsym(lib, name);
#endif
    if (!p) { fprintf(stderr, "error: %s not exported by the library\n", name); exit(2); }
    memcpy(dst, &p, sizeof p);
}

static int load(const char *path) {
#ifdef _WIN32
    void *lib = (void *)LoadLibraryA(path);
#else
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!lib) { fprintf(stderr, "error: cannot load %s\n", path); return -1; }
#define SYM(field, name) sym(lib, name, &L.field)
    SYM(version, "mtfl_version"); SYM(open, "mtfl_open"); SYM(close, "mtfl_close"); SYM(outputs, "mtfl_outputs");
    SYM(bars, "mtfl_bars"); SYM(push, "mtfl_push"); SYM(push_f, "mtfl_push_f"); SYM(push_bars, "mtfl_push_bars");
    SYM(last_error, "mtfl_last_error");
#undef SYM
    return 0;
}

/* "YYYY.MM.DD HH:MM" (":SS" when off the minute), as predict --live prints a row's time. */
static void when_of(int64_t t, char *out, size_t n) {
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400), s = t - days * 86400;
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097; /* civil from days (H. Hinnant) */
    int64_t doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    y += m <= 2;
    if (s % 60) snprintf(out, n, "%04lld.%02lld.%02lld %02lld:%02lld:%02lld", (long long)y, (long long)m, (long long)d,
                         (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
    else snprintf(out, n, "%04lld.%02lld.%02lld %02lld:%02lld", (long long)y, (long long)m, (long long)d,
                  (long long)(s / 3600), (long long)(s / 60 % 60));
}

typedef struct accepted { long long *t; double *v[5], *pred; int n, cap; } accepted;

static int keep(accepted *a, long long t, const double v[5], const double *pred, int ready, int K) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 4096;
        void *p = realloc(a->t, (size_t)cap * sizeof *a->t);
        if (!p) return -1;
        a->t = (long long *)p;
        for (int j = 0; j < 5; j++) {
            if (!(p = realloc(a->v[j], (size_t)cap * sizeof(double)))) return -1;
            a->v[j] = (double *)p;
        }
        if (!(p = realloc(a->pred, (size_t)cap * (size_t)K * sizeof(double)))) return -1;
        a->pred = (double *)p;
        a->cap = cap;
    }
    a->t[a->n] = t;
    for (int j = 0; j < 5; j++) a->v[j][a->n] = v[j];
    for (int k = 0; k < K; k++) a->pred[(size_t)a->n * K + k] = ready ? pred[k] : NAN;
    a->n++;
    return 0;
}

/* The faults planted before the row at line `lineno` (once a bar has been accepted). */
static void plant(int h, const char *model_bad, long long t, const double v[5], long long last_t, int K) {
    double pred[512];
    long long before = L.bars(h);
    check(L.push(h, t, v[0], v[1], v[2], v[3], v[4], pred, K - 1) == MTFL_ERR_SHAPE, "pred_len K-1: MTFL_ERR_SHAPE", 0);
    check(L.push(h, t, v[0], v[1], v[2], v[3], v[4], NULL, K) == MTFL_ERR_ARG, "NULL pred: MTFL_ERR_ARG", 0);
    int r = L.push(h, last_t - 3600, v[0], v[1], v[2], v[3], v[4], pred, K);
    check(r == MTFL_ERR_BAR, "a bar an hour before the last: MTFL_ERR_BAR", r);
    r = L.push(h, last_t, v[0], v[1], v[2], v[3], v[4], pred, K);
    check(r == MTFL_ERR_BAR, "a duplicate of the last bar: MTFL_ERR_BAR", r);
    long long one = t;
    r = L.push_bars(h, &one, &v[0], &v[1], &v[2], &v[3], &v[4], 1, pred, K - 1);
    check(r == MTFL_ERR_SHAPE, "push_bars with K-1 elements for 1 bar: MTFL_ERR_SHAPE", r);
    r = L.open(model_bad, MTFL_WINDOW, 1);
    check(r == MTFL_ERR_MODEL, "a garbage model file: MTFL_ERR_MODEL", r);
    r = L.open("no/such/model.safetensors", MTFL_WINDOW, 1);
    check(r == MTFL_ERR_MODEL, "a missing model file: MTFL_ERR_MODEL", r);
    check(L.outputs(h + 1) == MTFL_ERR_HANDLE, "a handle never opened: MTFL_ERR_HANDLE", 0);
    check(L.bars(h) == before, "the faults changed nothing (bars accepted)", (int)L.bars(h));
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6 || (argc == 6 && strcmp(argv[5], "window") && strcmp(argv[5], "stateful"))) {
        fprintf(stderr, "usage: live_host LIB MODEL CSV OUT [window|stateful]\n");
        return 2;
    }
    int mode = argc == 6 && !strcmp(argv[5], "stateful") ? MTFL_STATEFUL : MTFL_WINDOW;
    if (load(argv[1])) return 2;
    char bad[1024];
    snprintf(bad, sizeof bad, "%s.bad", argv[4]);
    FILE *bf = fopen(bad, "wb");
    if (!bf || fputs("{\"not\": \"a safetensors file\"}", bf) < 0 || fclose(bf)) {
        fprintf(stderr, "error: cannot write %s\n", bad);
        return 2;
    }
    check(L.version() == MTFL_ABI_VERSION, "ABI version", L.version());
    int h = L.open(argv[2], mode, 1);
    if (h <= 0) {
        char e[512];
        L.last_error(e, sizeof e);
        fprintf(stderr, "error: %s: %s\n", argv[2], e);
        return 2;
    }
    int K = L.outputs(h);
    char *text = NULL;
    size_t len = 0;
    FILE *out = fopen(argv[4], "wb"); /* "\n" lines on Windows too, as predict writes them */
    if (K < 2 || K > 512 || mbc_read_text(argv[3], &text, &len) || !out) {
        fprintf(stderr, "error: K=%d, or cannot read %s or write %s\n", K, argv[3], argv[4]);
        return 2;
    }
    accepted acc;
    memset(&acc, 0, sizeof acc);
    double pred[512];
    float predf[512];
    size_t lineno = 0;
    long long rows = 0, ok = 0, planted = 0, last_t = 0;
    for (char *line = text, *next; line && *line; line = next) { /* as predict's replay_text */
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        line[strcspn(line, "\r")] = 0;
        if (line[strspn(line, " \t")] == 0 || line[0] == '<' || isalpha((unsigned char)line[0])) continue;
        int64_t t = INT64_MIN;
        double v[5] = {0, 0, 0, 0, 0};
        char when[128], err[512];
        int bad_row = mbc_parse_bar(line, &t, v);
        if (t != INT64_MIN) when_of(t, when, sizeof when);
        else snprintf(when, sizeof when, "line %zu", lineno);
        if (!bad_row && acc.n > 0 && rows % 997 == 500) { plant(h, bad, t, v, last_t, K); planted++; }
        int r = bad_row ? MTFL_ERR_BAR
              : rows % 2 ? L.push(h, t, v[0], v[1], v[2], v[3], v[4], pred, K)
                         : L.push_f(h, t, v[0], v[1], v[2], v[3], v[4], predf, K); /* both flavours */
        if (!bad_row && !(rows % 2) && r == MTFL_READY)
            for (int k = 0; k < K; k++) pred[k] = (double)predf[k];
        rows++;
        if (r == MTFL_ERR_BAR) {
            if (!bad_row) L.last_error(err, sizeof err);
            const char *why = bad_row ? mbc_error : strchr(err, ':') ? strchr(err, ':') + 2 : err;
            fprintf(out, "%s,refused: line %zu: %s\n", when, lineno, why);
            continue;
        }
        check(r == MTFL_READY || r == MTFL_WARMUP, "a good bar is accepted", r);
        if (r < 0) break;
        last_t = t;
        if (keep(&acc, t, v, pred, r == MTFL_READY, K)) { fprintf(stderr, "error: no memory\n"); return 2; }
        if (r == MTFL_WARMUP) { fprintf(out, "%s,warmup\n", when); continue; }
        ok++;
        fprintf(out, "%s,ok", when);
        for (int k = 0; k < K; k++) fprintf(out, ",%.9g", pred[k]);
        fputc('\n', out);
    }
    if (fclose(out)) { fprintf(stderr, "error: cannot write %s\n", argv[4]); return 2; }
    /* the accepted bars again, through push_bars on a second handle */
    int h2 = L.open(argv[2], mode, 1), same = 1;
    check(h2 > 0 && h2 != h, "a second handle on the same model", h2);
    double *rows2 = (double *)malloc((size_t)(acc.n ? acc.n : 1) * (size_t)K * sizeof(double));
    for (int i = 0; h2 > 0 && rows2 && i < acc.n; i += 1000) {
        int n = acc.n - i < 1000 ? acc.n - i : 1000;
        int r = L.push_bars(h2, acc.t + i, acc.v[0] + i, acc.v[1] + i, acc.v[2] + i, acc.v[3] + i, acc.v[4] + i, n,
                            rows2 + (size_t)i * K, n * K);
        check(r >= 0, "push_bars of accepted bars", r);
    }
    for (size_t j = 0; rows2 && j < (size_t)acc.n * K; j++)
        same &= isnan(acc.pred[j]) ? isnan(rows2[j]) : memcmp(&acc.pred[j], &rows2[j], sizeof(double)) == 0;
    check(rows2 && same, "push_bars' rows are the one-by-one predictions, bit for bit", 0);
    check(L.close(h2) == 0 && L.close(h) == 0, "close", 0);
    check(L.close(h) == MTFL_ERR_HANDLE, "closing twice: MTFL_ERR_HANDLE", 0);
    check(L.push(h, last_t + 60, 1, 1, 1, 1, 1, pred, K) == MTFL_ERR_HANDLE, "a closed handle: MTFL_ERR_HANDLE", 0);
    remove(bad);
    printf("live_host: %s mode, K=%d: %lld rows, %lld predictions, %lld fault sites planted; %d checks, %d failed\n",
           mode ? "stateful" : "window", K, rows, ok, planted, checks, failures);
    free(rows2); free(text); free(acc.t); free(acc.pred);
    for (int j = 0; j < 5; j++) free(acc.v[j]);
    return failures ? 1 : 0;
}
