/* mb_plot.h - the loss-curve picture of a training run: an SVG (plain text, deterministic)
 * drawn from the metrics CSV that examples/train_multitf.c writes (docs/EXAMPLE.md):
 *   kind,epoch,batch,step,loss,val_loss,baseline_val_loss,...
 * Made to answer "did it learn, and by how much" at a glance:
 * - a line under the title: the last validation loss against the baseline's, in percent
 *   (green when below the baseline, red when not);
 * - the main panel: the epochs' validation (squares) and training (circles) losses and the
 *   baseline (dashed), each labelled with its value at the right; its y range is set by
 *   the validation losses and the baseline (widened for the training losses by at most 1.5
 *   times their span), so neither batch spikes nor a high first epoch can squeeze them
 *   together; the gap between
 *   the last validation loss and the baseline is marked and labelled in percent;
 * - a small panel below: every batch's loss (class "step") and its running mean, y over
 *   the batch losses up to 3 interquartile ranges beyond the quartiles (spikes clipped);
 * - when the header has the validation metrics' columns (val_hit, val_ic, val_rank_ic: the
 *   means over horizons of examples/mb_metrics.h) and an epoch row has a value in one, a
 *   third panel at the bottom: each epoch's edge, the hit rate less 0.5, the IC and the rank
 *   IC on one axis around a zero line (no edge), labelled with their last values; a file
 *   without those columns draws as before (the picture is 600 px high, 772 with the panel).
 * x: batches trained, shared. Non-finite values are left out; columns are found by their
 * names in the header (any order, any further columns), lines of any length.
 *   mb_plot_svg("data/metrics.csv", "data/metrics.svg", "a title") -> 0, or -1 (errno) */
#ifndef MB_PLOT_H
#define MB_PLOT_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MBP_W = 760, MBP_H = 600, MBP_L = 64, MBP_R = 150, MBP_TOP = 64, MBP_TOP_H = 330, MBP_BOT = 440, MBP_BOT_H = 100 };
enum { MBP_MET = 612, MBP_MET_H = 110, MBP_MET_END = 772 }; /* the metrics panel, when drawn: the picture's height */
#define MBP_STEP "stroke=\"#b0b0b0\" stroke-width=\"0.8\""
#define MBP_MEAN "stroke=\"#1f77b4\" stroke-width=\"1.5\""
#define MBP_BASE "stroke=\"#444\" stroke-width=\"1.5\" stroke-dasharray=\"7 4\""
#define MBP_TRAIN "#1f77b4"
#define MBP_VAL "#d62728"
#define MBP_HIT "#2ca02c"
#define MBP_IC "#9467bd"
#define MBP_RIC "#ff7f0e"

typedef struct mbp_series { double *xy; int64_t n, cap; } mbp_series; /* x0 y0 x1 y1 ... */
typedef struct mbp_curves {
    mbp_series step, mean, train, val;
    mbp_series hit, ic, rank_ic; /* epochs' validation metrics (means over horizons); hit: the rate less 0.5 */
    double base;      /* the last epoch row's baseline validation loss */
    int epochs;       /* epoch rows */
    double x1;        /* x from 0 to x1 */
} mbp_curves;
typedef struct mbp_panel { int top, h; double y0, y1; const char *clip; } mbp_panel;

static inline int mbp_add(mbp_series *s, double x, double y) { /* 0: out of memory */
    if (!isfinite(x) || !isfinite(y)) return 1;
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 256;
        double *xy = (double *)realloc(s->xy, (size_t)(2 * cap) * sizeof(double));
        if (!xy) return 0;
        s->xy = xy;
        s->cap = cap;
    }
    s->xy[2 * s->n] = x; s->xy[2 * s->n + 1] = y; s->n++;
    return 1;
}

static inline void mbp_free(mbp_curves *c) {
    free(c->step.xy); free(c->mean.xy); free(c->train.xy); free(c->val.xy);
    free(c->hit.xy); free(c->ic.xy); free(c->rank_ic.xy);
}

/* One line of any length into *buf (grown; *cap its size): NULL at the end of the file or
 * when out of memory (*oom set). */
static inline char *mbp_getline(FILE *f, char **buf, size_t *cap, int *oom) {
    size_t n = 0;
    for (;;) {
        if (*cap - n < 2) {
            size_t want = *cap ? 2 * *cap : 1024;
            char *b = (char *)realloc(*buf, want);
            if (!b) { *oom = 1; return NULL; }
            *buf = b;
            *cap = want;
        }
        if (!fgets(*buf + n, (int)(*cap - n > INT32_MAX ? INT32_MAX : *cap - n), f)) return n ? *buf : NULL;
        n += strlen(*buf + n);
        if (n && (*buf)[n - 1] == '\n') return *buf;
    }
}

/* The index of the column named `name` in a header line (-1: none). */
static inline int mbp_column(const char *header, const char *name) {
    size_t len = strlen(name);
    int i = 0;
    for (const char *p = header;; i++) {
        const char *end = p + strcspn(p, ",\r\n");
        if ((size_t)(end - p) == len && !strncmp(p, name, len)) return i;
        if (*end != ',') return -1;
        p = end + 1;
    }
}

/* Field i of a row as a number: NAN when absent, empty or not one. */
static inline double mbp_field(const char *line, int i) {
    if (i < 0) return NAN;
    for (; i > 0; i--) {
        line = strchr(line, ',');
        if (!line) return NAN;
        line++;
    }
    char *end;
    double v = strtod(line, &end);
    return end != line && (*end == ',' || *end == '\n' || *end == '\r' || !*end) ? v : NAN;
}

/* The step and epoch rows and the running mean (trailing window of a 25th of the steps). */
static inline int mbp_read(FILE *f, mbp_curves *c) {
    char *line = NULL;
    size_t cap = 0;
    long long e, b, s;
    double loss, val, base;
    int ok = 1, oom = 0, col[3] = {-1, -1, -1};
    c->base = NAN;
    while (ok && mbp_getline(f, &line, &cap, &oom)) {
        if (sscanf(line, "step,%lld,%lld,%lld,%lf", &e, &b, &s, &loss) == 4) ok = mbp_add(&c->step, (double)b, loss);
        else if (sscanf(line, "epoch,%lld,%lld,%lld,%lf,%lf,%lf", &e, &b, &s, &loss, &val, &base) == 6) {
            ok = mbp_add(&c->train, (double)b, loss) && mbp_add(&c->val, (double)b, val) &&
                 mbp_add(&c->hit, (double)b, mbp_field(line, col[0]) - 0.5) &&
                 mbp_add(&c->ic, (double)b, mbp_field(line, col[1])) &&
                 mbp_add(&c->rank_ic, (double)b, mbp_field(line, col[2]));
            c->base = base;
            c->epochs++;
        } else if (!strncmp(line, "kind,", 5)) {
            col[0] = mbp_column(line, "val_hit");
            col[1] = mbp_column(line, "val_ic");
            col[2] = mbp_column(line, "val_rank_ic");
        }
    }
    free(line);
    ok = ok && !oom;
    int64_t w = c->step.n / 25 > 1 ? c->step.n / 25 : 1;
    double sum = 0;
    for (int64_t i = 0; ok && i < c->step.n; i++) {
        sum += c->step.xy[2 * i + 1] - (i >= w ? c->step.xy[2 * (i - w) + 1] : 0);
        ok = mbp_add(&c->mean, c->step.xy[2 * i], sum / (double)(i < w ? i + 1 : w));
    }
    mbp_series *all[] = {&c->step, &c->train, &c->val, &c->hit, &c->ic, &c->rank_ic};
    for (int k = 0; k < 6; k++)
        for (int64_t i = 0; i < all[k]->n; i++) c->x1 = fmax(c->x1, all[k]->xy[2 * i]);
    if (!(c->x1 > 0)) c->x1 = 1;
    return ok;
}

static inline int mbp_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile (nearest rank) of the y values of s; NAN when s is empty. */
static inline double mbp_quantile(const mbp_series *s, double q) {
    if (s->n == 0) return NAN;
    double *v = (double *)malloc((size_t)s->n * sizeof(double));
    if (!v) return NAN;
    for (int64_t i = 0; i < s->n; i++) v[i] = s->xy[2 * i + 1];
    qsort(v, (size_t)s->n, sizeof(double), mbp_cmp);
    double r = v[(int64_t)floor(q * (double)(s->n - 1) + 0.5)];
    free(v);
    return r;
}

/* y range [lo, hi] padded by `pad` of its span (a flat range gets a visible one). */
static inline void mbp_range(mbp_panel *p, double lo, double hi, double pad) {
    if (!(lo <= hi)) { lo = 0; hi = 1; }
    double span = hi - lo, least = 0.02 * fmax(fabs(lo), fabs(hi)) + 1e-6;
    if (span < least) { lo = (lo + hi - least) / 2; hi = lo + least; span = least; }
    p->y0 = lo - pad * span; p->y1 = hi + pad * span;
}

/* The main panel's range: the validation losses and the baseline, widened for the training
 * losses by at most 1.5 times that span each way (farther ones are clipped), so the gap
 * that matters keeps a quarter of the panel or more. Without epochs: the running mean's
 * 5th to 95th percentile. */
static inline void mbp_top_range(const mbp_curves *c, mbp_panel *p) {
    double lo = isfinite(c->base) ? c->base : INFINITY, hi = isfinite(c->base) ? c->base : -INFINITY;
    for (int64_t i = 0; i < c->val.n; i++) { lo = fmin(lo, c->val.xy[2 * i + 1]); hi = fmax(hi, c->val.xy[2 * i + 1]); }
    double core = fmax(hi - lo, 0.02 * fmax(fabs(lo), fabs(hi)) + 1e-6);
    double elo = lo <= hi ? lo - 1.5 * core : -INFINITY, ehi = lo <= hi ? hi + 1.5 * core : INFINITY;
    for (int64_t i = 0; i < c->train.n; i++) {
        lo = fmin(lo, fmax(c->train.xy[2 * i + 1], elo));
        hi = fmax(hi, fmin(c->train.xy[2 * i + 1], ehi));
    }
    if (!(lo <= hi)) { lo = mbp_quantile(&c->mean, 0.05); hi = mbp_quantile(&c->mean, 0.95); }
    mbp_range(p, lo, hi, 0.12);
}

static inline double mbp_sx(const mbp_curves *c, double x) { return MBP_L + x / c->x1 * (MBP_W - MBP_L - MBP_R); }
static inline double mbp_sy(const mbp_panel *p, double y) { return p->top + p->h - (y - p->y0) / (p->y1 - p->y0) * p->h; }

static inline double mbp_tick(double range, int n) { /* 1, 2 or 5 x 10^k: about n ticks */
    double s = pow(10, floor(log10(range / n))), r = range / n / s;
    return s * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
}

/* Frame, clip rectangle, y grid with labels, the y axis title; x ticks when xlabels. */
static inline void mbp_axes(FILE *f, const mbp_curves *c, const mbp_panel *p, const char *ytitle, int xlabels) {
    int w = MBP_W - MBP_L - MBP_R;
    fprintf(f, "<clipPath id=\"%s\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath>\n", p->clip, MBP_L,
            p->top, w, p->h);
    double st = mbp_tick(p->y1 - p->y0, p->h > 200 ? 6 : 3);
    for (double k = ceil(p->y0 / st); k * st <= p->y1; k++)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%d\" y=\"%.1f\" "
                   "text-anchor=\"end\">%g</text>\n", MBP_L, mbp_sy(p, k * st), MBP_L + w, mbp_sy(p, k * st), MBP_L - 6,
                mbp_sy(p, k * st) + 4, fabs(k * st) < st * 1e-9 ? 0.0 : k * st);
    st = fmax(1, mbp_tick(c->x1, 5));
    for (double k = 0; k * st <= c->x1; k++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999\"/>", mbp_sx(c, k * st), p->top + p->h,
                mbp_sx(c, k * st), p->top + p->h + 4);
        if (xlabels)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>", mbp_sx(c, k * st), p->top + p->h + 17,
                    k * st);
        fputc('\n', f);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", MBP_L, p->top, w, p->h);
    fprintf(f, "<text transform=\"translate(18 %d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", p->top + p->h / 2,
            ytitle);
}

static inline void mbp_polyline(FILE *f, const mbp_curves *c, const mbp_panel *p, const char *cls, const char *style,
                                const mbp_series *s) {
    fprintf(f, "<polyline class=\"%s\" clip-path=\"url(#%s)\" fill=\"none\" %s points=\"", cls, p->clip, style);
    for (int64_t i = 0; i < s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", mbp_sx(c, s->xy[2 * i]), mbp_sy(p, s->xy[2 * i + 1]));
    fprintf(f, "\"/>\n");
}

/* A label at the right of the main panel at value y, moved clear (14 px) of the labels
 * placed before it (used[0..*n)). */
static inline void mbp_label(FILE *f, const mbp_panel *p, double y, double *used, int *n, const char *color,
                             const char *text) {
    double py = fmin(fmax(mbp_sy(p, y), p->top), p->top + p->h) + 4; /* a clipped value: at the edge */
    for (int pass = 0; pass < 4; pass++)
        for (int i = 0; i < *n; i++)
            if (fabs(py - used[i]) < 14) py = used[i] + (py >= used[i] ? 14 : -14);
    used[(*n)++] = py;
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"%s\">%s</text>\n", MBP_W - MBP_R + 8, py, color, text);
}

/* The main panel: epochs, baseline, the gap in percent. */
static inline void mbp_top(FILE *f, const mbp_curves *c, const mbp_panel *p) {
    mbp_axes(f, c, p, "loss (epochs)", 0);
    char text[96];
    double used[3];
    int nused = 0;
    if (isfinite(c->base)) {
        fprintf(f, "<line class=\"baseline\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" %s/>\n", MBP_L, mbp_sy(p, c->base),
                MBP_W - MBP_R, mbp_sy(p, c->base), MBP_BASE);
        snprintf(text, sizeof text, "baseline %.4f", c->base);
        mbp_label(f, p, c->base, used, &nused, "#444", text);
    }
    mbp_polyline(f, c, p, "train-epochs", "stroke=\"" MBP_TRAIN "\" stroke-width=\"1.5\"", &c->train);
    mbp_polyline(f, c, p, "val-epochs", "stroke=\"" MBP_VAL "\" stroke-width=\"2\"", &c->val);
    for (int64_t i = 0; i < c->train.n; i++)
        fprintf(f, "<circle class=\"train\" clip-path=\"url(#top)\" cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"" MBP_TRAIN
                   "\"/>\n", mbp_sx(c, c->train.xy[2 * i]), mbp_sy(p, c->train.xy[2 * i + 1]));
    for (int64_t i = 0; i < c->val.n; i++)
        fprintf(f, "<rect class=\"val\" x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"" MBP_VAL "\"/>\n",
                mbp_sx(c, c->val.xy[2 * i]) - 4.5, mbp_sy(p, c->val.xy[2 * i + 1]) - 4.5);
    if (c->val.n) {
        snprintf(text, sizeof text, "validation %.4f", c->val.xy[2 * (c->val.n - 1) + 1]);
        mbp_label(f, p, c->val.xy[2 * (c->val.n - 1) + 1], used, &nused, MBP_VAL, text);
    }
    if (c->train.n) {
        snprintf(text, sizeof text, "train %.4f", c->train.xy[2 * (c->train.n - 1) + 1]);
        mbp_label(f, p, c->train.xy[2 * (c->train.n - 1) + 1], used, &nused, MBP_TRAIN, text);
    }
    if (c->val.n && isfinite(c->base) && c->base > 0) { /* the gap at the last epoch */
        double x = mbp_sx(c, c->val.xy[2 * (c->val.n - 1)]) - 14, v = c->val.xy[2 * (c->val.n - 1) + 1];
        double y0 = mbp_sy(p, c->base), y1 = mbp_sy(p, v), pct = 100 * (v - c->base) / c->base;
        const char *col = pct < 0 ? "#2a2" : "#c22";
        fprintf(f, "<path class=\"gap\" d=\"M%.1f %.1fH%.1fM%.1f %.1fV%.1fM%.1f %.1fH%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\" fill=\"none\"/>\n", x - 4, y0, x + 4, x, y0, y1, x - 4, y1, x + 4, col);
        fprintf(f, "<text class=\"gap\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"14\" font-weight=\"bold\" "
                   "fill=\"%s\">%+.1f%%</text>\n", x - 8, (y0 + y1) / 2 + 5, col, pct);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#777\">epoch ends: <tspan fill=\"" MBP_VAL "\">&#9632; validation</tspan>"
               "  <tspan fill=\"" MBP_TRAIN "\">&#9679; train</tspan> (mean loss of the epoch)   - - - baseline: validation loss "
               "of predicting 0</text>\n", MBP_L, p->top + p->h + 16);
}

/* The small panel: every batch's loss and its running mean. */
static inline void mbp_bottom(FILE *f, const mbp_curves *c, const mbp_panel *p) {
    mbp_axes(f, c, p, "batch loss", 1);
    mbp_polyline(f, c, p, "step", MBP_STEP, &c->step);
    mbp_polyline(f, c, p, "mean", MBP_MEAN, &c->mean);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">batches trained (grey: each batch's loss, blue: running mean; "
               "spikes clipped)</text>\n", MBP_L + (MBP_W - MBP_L - MBP_R) / 2, MBP_H - 14);
}

/* The metrics panel: each epoch's edge (hit rate less 0.5, IC, rank IC) around zero. */
static inline int mbp_has_metrics(const mbp_curves *c) { return c->hit.n || c->ic.n || c->rank_ic.n; }

static inline void mbp_metrics(FILE *f, const mbp_curves *c, mbp_panel *p) {
    double lo = 0, hi = 0; /* zero, no edge, always in view */
    const mbp_series *all[3] = {&c->hit, &c->ic, &c->rank_ic};
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < all[k]->n; i++) { lo = fmin(lo, all[k]->xy[2 * i + 1]); hi = fmax(hi, all[k]->xy[2 * i + 1]); }
    mbp_range(p, lo, hi, 0.12);
    mbp_axes(f, c, p, "edge (epochs)", 1);
    fprintf(f, "<line class=\"zero\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" %s/>\n", MBP_L, mbp_sy(p, 0),
            MBP_W - MBP_R, mbp_sy(p, 0), MBP_BASE);
    const char *cls[3] = {"val-hit", "val-ic", "val-rank-ic"}, *color[3] = {MBP_HIT, MBP_IC, MBP_RIC};
    double ly[3];
    int order[3], nl = 0;
    for (int k = 0; k < 3; k++) {
        char style[64];
        snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"1.5\"", color[k]);
        mbp_polyline(f, c, p, cls[k], style, all[k]);
        for (int64_t i = 0; i < all[k]->n; i++)
            fprintf(f, "<circle class=\"%s\" clip-path=\"url(#%s)\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                    cls[k], p->clip, mbp_sx(c, all[k]->xy[2 * i]), mbp_sy(p, all[k]->xy[2 * i + 1]), color[k]);
        if (all[k]->n) ly[k] = mbp_sy(p, all[k]->xy[2 * (all[k]->n - 1) + 1]) + 4, order[nl++] = k;
    }
    /* the last values' labels at the right, top to bottom as their values, 13 px apart at least */
    for (int i = 1; i < nl; i++)
        for (int j = i; j > 0 && ly[order[j]] < ly[order[j - 1]]; j--) { int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t; }
    for (int i = 1; i < nl; i++) ly[order[i]] = fmax(ly[order[i]], ly[order[i - 1]] + 13);
    double over = nl ? ly[order[nl - 1]] - (p->top + p->h + 4) : 0;
    for (int i = 0; i < nl && over > 0; i++) ly[order[i]] -= over;
    for (int i = 0; i < nl; i++) {
        int k = order[i];
        double v = all[k]->xy[2 * (all[k]->n - 1) + 1];
        char text[96];
        if (k == 0) snprintf(text, sizeof text, "hit %.1f%%", 100 * (v + 0.5));
        else snprintf(text, sizeof text, "%s %.3f", k == 1 ? "IC" : "rank IC", v);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"%s\">%s</text>\n", MBP_W - MBP_R + 8, ly[k], color[k], text);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#777\">validation, mean over horizons: <tspan fill=\"" MBP_HIT
               "\">&#9679; hit rate - 0.5</tspan>  <tspan fill=\"" MBP_IC "\">&#9679; IC</tspan>  <tspan fill=\"" MBP_RIC
               "\">&#9679; rank IC</tspan>   - - - 0: no edge</text>\n", MBP_L, MBP_MET_END - 14);
}

/* The line under the title: did it learn, and by how much. */
static inline void mbp_verdict(FILE *f, const mbp_curves *c) {
    if (!c->val.n || !isfinite(c->base) || !(c->base > 0)) {
        fprintf(f, "<text x=\"%d\" y=\"44\" text-anchor=\"middle\" font-size=\"14\">%s</text>\n", MBP_W / 2,
                c->epochs ? "no finite validation and baseline losses to compare" : "no epoch finished yet");
        return;
    }
    double v = c->val.xy[2 * (c->val.n - 1) + 1], pct = 100 * (v - c->base) / c->base;
    fprintf(f, "<text class=\"verdict\" x=\"%d\" y=\"44\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\" "
               "fill=\"%s\">validation loss %.4f: %.1f%% %s the baseline %.4f (predict 0)</text>\n", MBP_W / 2,
            pct < 0 ? "#1a8a1a" : "#c22", v, fabs(pct), pct < 0 ? "below" : "above", c->base);
}

static inline int mb_plot_svg(const char *metrics, const char *svg, const char *title) {
    mbp_curves c;
    memset(&c, 0, sizeof c);
    FILE *in = fopen(metrics, "r"), *f = NULL;
    int ok = in && mbp_read(in, &c);
    if (in) fclose(in);
    if (ok && !(f = fopen(svg, "w"))) ok = 0;
    if (f) {
        mbp_panel top = {MBP_TOP, MBP_TOP_H, 0, 1, "top"}, bot = {MBP_BOT, MBP_BOT_H, 0, 1, "bottom"};
        mbp_top_range(&c, &top);
        double q1 = mbp_quantile(&c.step, 0.25), q3 = mbp_quantile(&c.step, 0.75); /* spikes: beyond 3 IQR */
        mbp_range(&bot, fmax(mbp_quantile(&c.step, 0), q1 - 3 * (q3 - q1)), fmin(mbp_quantile(&c.step, 1), q3 + 3 * (q3 - q1)),
                  0.05);
        int h = mbp_has_metrics(&c) ? (int)MBP_MET_END : (int)MBP_H;
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
                MBP_W, h, MBP_W, h, MBP_W, h);
        fprintf(f, "<text x=\"%d\" y=\"20\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n", MBP_W / 2, title);
        mbp_verdict(f, &c);
        mbp_top(f, &c, &top);
        mbp_bottom(f, &c, &bot);
        if (mbp_has_metrics(&c)) {
            mbp_panel met = {MBP_MET, MBP_MET_H, 0, 1, "metrics"};
            mbp_metrics(f, &c, &met);
        }
        fputs("</svg>\n", f);
        ok = !ferror(f);
        ok = !fclose(f) && ok;
    }
    mbp_free(&c);
    return ok ? 0 : -1;
}

#endif /* MB_PLOT_H */
