/* mb_csv.h - M1 bars from a CSV file, as prepare reads them: one parser for prepare.c (the
 * dataset) and predict.c (--live replays the same rows through the live predictor, so a file
 * that prepares replays alike).
 *   mbc_read_csv_file(path, skip_bad, &bars, &skipped)   a whole file into mbc_bars
 *   mbc_read_text(path, &text, &len)                     a whole file, decoded (predict --live)
 *   mbc_parse_bar(line, &t, v)                           one data line (predict --live)
 *   mbc_blank(line), mbc_is_header(line)                 the header rule (section "rows")
 * Errors: -1 with the reason in mbc_error (prepare.c fails through mbc_fail too). Include
 * after megabatch.h and mb_features.h (mbf_check: what the live predictor refuses). All names
 * are mbc_* (static: each including file gets its own copy). */
#ifndef MB_CSV_H
#define MB_CSV_H
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBC_API static __attribute__((unused)) /* an includer need not use everything */
#else
#define MBC_API static
#endif

static char mbc_error[512]; /* the reason of the last failure */

/* Set mbc_error; returns -1. */
MBC_API int mbc_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mbc_error, sizeof mbc_error, fmt, ap);
    va_end(ap);
    return -1;
}

// ---- bars ----
// A bar series (M1 or aggregated): start time in seconds since 1970 (UTC), OHLC, volume.

typedef struct mbc_bars {
    int64_t *t;
    double *o, *h, *l, *c, *v;
    size_t n, cap;
} mbc_bars;

MBC_API void mbc_bars_free(mbc_bars *b) {
    free(b->t); free(b->o); free(b->h); free(b->l); free(b->c); free(b->v);
    memset(b, 0, sizeof *b);
}

MBC_API int mbc_bars_push(mbc_bars *b, int64_t t, double o, double h, double l, double c, double v) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        int64_t *nt = (int64_t *)realloc(b->t, cap * sizeof *nt);
        if (nt) b->t = nt;
        double **cols[5] = {&b->o, &b->h, &b->l, &b->c, &b->v};
        int ok = nt != NULL;
        for (int i = 0; i < 5 && ok; i++) {
            double *p = (double *)realloc(*cols[i], cap * sizeof(double));
            if (p) *cols[i] = p; else ok = 0;
        }
        if (!ok) return mbc_fail("out of memory for %zu bars", cap);
        b->cap = cap;
    }
    b->t[b->n] = t; b->o[b->n] = o; b->h[b->n] = h; b->l[b->n] = l; b->c[b->n] = c; b->v[b->n] = v;
    b->n++;
    return 0;
}

// ---- csv ----
// MetaTrader 5 export (tab-separated, `<DATE> <TIME> <OPEN> ...` header, UTF-8 or UTF-16
// with BOM), MetaTrader 4 / histdata (comma or semicolon, `2024.01.02,00:00,o,h,l,c,v`,
// or `20240102 000000;o;h;l;c;v`). Dates YYYY.MM.DD, YYYY-MM-DD or YYYYMMDD; times
// HH:MM:SS, HH:MM or HHMMSS.

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm). */
MBC_API int64_t mbc_days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

MBC_API int mbc_parse_date(const char *s, int64_t *days) {
    int y, m, d, n = 0;
    if (sscanf(s, "%4d.%2d.%2d%n", &y, &m, &d, &n) == 3 && n == 10) {}
    else if (sscanf(s, "%4d-%2d-%2d%n", &y, &m, &d, &n) == 3 && n == 10) {}
    else if (strlen(s) == 8 && sscanf(s, "%4d%2d%2d%n", &y, &m, &d, &n) == 3 && n == 8) {}
    else return -1;
    if (s[n] != 0 || m < 1 || m > 12 || d < 1 || d > 31 || y < 1900) return -1;
    *days = mbc_days_from_civil(y, m, d);
    return 0;
}

MBC_API int mbc_parse_time(const char *s, int64_t *secs) {
    int h, m, sec = 0, n = 0;
    size_t len = strlen(s);
    if (len == 8 && sscanf(s, "%2d:%2d:%2d%n", &h, &m, &sec, &n) == 3 && n == 8) {}
    else if (len == 5 && sscanf(s, "%2d:%2d%n", &h, &m, &n) == 2 && n == 5) {}
    else if (len == 6 && sscanf(s, "%2d%2d%2d%n", &h, &m, &sec, &n) == 3 && n == 6) {}
    else return -1;
    if (h > 23 || m > 59 || sec > 59 || h < 0 || m < 0 || sec < 0) return -1;
    *secs = h * 3600 + m * 60 + sec;
    return 0;
}

MBC_API int mbc_parse_number(const char *s, double *out) {
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return (end == s || *end != 0 || errno != 0 || !isfinite(*out)) ? -1 : 0;
}

/* Decode UTF-16LE/BE (with BOM) to UTF-8 in place of `text`; strip a UTF-8 BOM. Only
 * ASCII is meaningful in these files: other characters become '?'. */
MBC_API int mbc_decode_text(unsigned char **text, size_t *len) {
    unsigned char *s = *text;
    if (*len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF) {
        memmove(s, s + 3, *len - 3);
        *len -= 3;
        return 0;
    }
    if (*len < 2 || !((s[0] == 0xFF && s[1] == 0xFE) || (s[0] == 0xFE && s[1] == 0xFF))) return 0;
    int le = s[0] == 0xFF;
    size_t n = 0;
    for (size_t i = 2; i + 1 < *len; i += 2) {
        unsigned u = le ? (unsigned)(s[i] | s[i + 1] << 8) : (unsigned)(s[i] << 8 | s[i + 1]);
        s[n++] = (unsigned char)(u < 128 ? u : '?');
    }
    *len = n;
    return 0;
}

/* Split a line into fields on tab, comma or semicolon; a first field "DATE TIME" (histdata)
 * is split in two. Returns the number of fields (at most max). */
MBC_API int mbc_split_fields(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        while (*p == ' ') p++;
        f[n++] = p;
        size_t k = strcspn(p, "\t,;");
        char *end = p + k;
        char *q = end;
        while (q > p && isspace((unsigned char)q[-1])) q--;
        int last = *end == 0;
        *q = 0;
        if (last) break;
        p = end + 1;
    }
    char *sp = strchr(f[0], ' ');
    if (n < max && sp) {
        *sp = 0;
        memmove(f + 2, f + 1, (size_t)(n - 1) * sizeof *f);
        f[1] = sp + 1;
        n++;
    }
    return n;
}

/* Parse one data line into a bar. Returns 0, or -1 with a reason in mbc_error. *t is set
 * as soon as the date and time parse: a row refused for its values still has its time. */
MBC_API int mbc_parse_bar(char *line, int64_t *t, double v[5]) {
    char *f[12];
    int n = mbc_split_fields(line, f, 12);
    if (n < 6) return mbc_fail("expected at least 6 fields (date, time, open, high, low, close), got %d", n);
    int64_t days, secs;
    if (mbc_parse_date(f[0], &days)) return mbc_fail("bad date '%s'", f[0]);
    if (mbc_parse_time(f[1], &secs)) return mbc_fail("bad time '%s'", f[1]);
    *t = days * 86400 + secs;
    for (int i = 0; i < 4; i++)
        if (mbc_parse_number(f[2 + i], &v[i])) return mbc_fail("bad number '%s'", f[2 + i]);
    v[4] = 0;
    if (n > 6 && mbc_parse_number(f[6], &v[4])) return mbc_fail("bad volume '%s'", f[6]);
    if (v[0] <= 0 || v[1] <= 0 || v[2] <= 0 || v[3] <= 0) return mbc_fail("non-positive price");
    if (v[1] < v[2]) return mbc_fail("high %g < low %g", v[1], v[2]);
    if (v[4] < 0) return mbc_fail("negative volume");
    return 0;
}

// ---- rows ----
// The header rule (docs/PREPARE.md): only the first non-blank line of a file may be a header,
// and it is one when it does not start with a digit (a date): `<DATE>\t<TIME>...`,
// `Date,Time,...`. Every other non-blank line is a bar, or a bad row: the run stops naming
// its line, or with --skip-bad the row is skipped and counted by its reason (mbc_skips).

/* 1 when line (the lineno-th of the file, trailing CR gone) is blank. */
MBC_API int mbc_blank(const char *line) { return line[strspn(line, " \t")] == 0; }

/* 1 when the first non-blank line `line` is a header (it does not start with a digit). */
MBC_API int mbc_is_header(const char *line) {
    const char *p = line + strspn(line, " \t\"'");
    return !isdigit((unsigned char)*p);
}

/* Why a row is bad, for the --skip-bad summary. */
enum { MBC_SKIP_UNPARSABLE, MBC_SKIP_VALUES, MBC_SKIP_ORDER, MBC_SKIP_DUPLICATE, MBC_SKIP_MINUTE, MBC_SKIP_REASONS };
static size_t mbc_skips[MBC_SKIP_REASONS]; /* the rows the last mbc_parse_csv skipped, by reason */
static const char *const mbc_skip_names[MBC_SKIP_REASONS] = {"unparsable", "bad values", "out of order", "duplicate",
                                                             "not on a minute"};

/* The reason of a bad row: from mbc_parse_bar's return (parse) and mbf_check's code (e). */
MBC_API int mbc_skip_reason(int parse_bad, int e) {
    if (parse_bad) /* mbc_parse_bar: the values' checks come after the fields' */
        return !strncmp(mbc_error, "non-positive", 12) || !strncmp(mbc_error, "high ", 5) ||
                       !strcmp(mbc_error, "negative volume") ? MBC_SKIP_VALUES : MBC_SKIP_UNPARSABLE;
    return e == MBF_ERR_ORDER ? MBC_SKIP_ORDER : e == MBF_ERR_DUPLICATE ? MBC_SKIP_DUPLICATE
           : e == MBF_ERR_ALIGN ? MBC_SKIP_MINUTE : MBC_SKIP_VALUES;
}

/* "3 unparsable, 1 duplicate" (the reasons with a count) into buf. */
MBC_API const char *mbc_skips_text(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < MBC_SKIP_REASONS && n < cap; i++)
        if (mbc_skips[i]) n += (size_t)snprintf(buf + n, cap - n, "%s%zu %s", n ? ", " : "", mbc_skips[i], mbc_skip_names[i]);
    return buf;
}

/* Parse CSV text into M1 bars. skip_bad: count bad rows (total in *skipped, by reason in
 * mbc_skips) instead of failing on the first. A row is bad when it does not parse or when
 * the live predictor would refuse its bar (mbf_check: out of order, duplicate, not on a
 * minute, bad values), so a file that prepares with --skip-bad replays alike through
 * `predict --live`. Errors name the line. */
MBC_API int mbc_parse_csv(char *text, int skip_bad, mbc_bars *out, size_t *skipped) {
    memset(out, 0, sizeof *out);
    memset(mbc_skips, 0, sizeof mbc_skips);
    *skipped = 0;
    size_t lineno = 0;
    int first = 1;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        line[strcspn(line, "\r")] = 0;
        if (mbc_blank(line)) continue;
        int head = first && mbc_is_header(line);
        first = 0;
        if (head) continue;
        int64_t t = 0;
        double v[5] = {0};
        int bad = mbc_parse_bar(line, &t, v);
        mbf_bar b = {t, v[0], v[1], v[2], v[3], v[4]};
        int e = bad ? MBF_OK : mbf_check(&b, out->n > 0, out->n ? out->t[out->n - 1] : 0);
        int reason = bad || e != MBF_OK ? mbc_skip_reason(bad, e) : 0;
        if (e != MBF_OK) bad = mbc_fail("%s", mbf_error_text(e));
        if (bad) {
            if (!skip_bad) {
                char why[sizeof mbc_error];
                memcpy(why, mbc_error, sizeof why);
                mbc_bars_free(out);
                return mbc_fail("line %zu: %.400s (--skip-bad skips such rows)", lineno, why);
            }
            (*skipped)++;
            mbc_skips[reason]++;
            continue;
        }
        if (mbc_bars_push(out, t, v[0], v[1], v[2], v[3], v[4])) return -1;
    }
    if (out->n == 0)
        return *skipped ? mbc_fail("no bars in the input: all %zu rows are bad", *skipped) : mbc_fail("no bars in the input");
    return 0;
}

/* The whole file at path, decoded (mbc_decode_text) and NUL-terminated, into *text (free it):
 * its length in *len. */
MBC_API int mbc_read_text(const char *path, char **text, size_t *len) {
    struct stat st;
    *text = NULL;
    *len = 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return mbc_fail("'%s' is a directory, not a CSV file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return mbc_fail("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    unsigned char *buf = (unsigned char *)malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *nb = (unsigned char *)realloc(buf, 2 * cap + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    int failed = ferror(f), e = errno;
    fclose(f);
    if (!buf) return mbc_fail("out of memory reading '%s'", path);
    if (failed) { free(buf); return mbc_fail("cannot read '%s': %s", path, strerror(e)); }
    mbc_decode_text(&buf, &n);
    buf[n] = 0;
    *text = (char *)buf;
    *len = n;
    return 0;
}

MBC_API int mbc_read_csv_file(const char *path, int skip_bad, mbc_bars *out, size_t *skipped) {
    char *text;
    size_t len;
    if (mbc_read_text(path, &text, &len)) return -1;
    int r = mbc_parse_csv(text, skip_bad, out, skipped);
    free(text);
    if (r && !strncmp(mbc_error, "no bars", 7)) { /* which file */
        char why[sizeof mbc_error];
        memcpy(why, mbc_error, sizeof why);
        mbc_fail("'%s': %.400s", path, why);
    }
    return r;
}

#endif /* MB_CSV_H */
