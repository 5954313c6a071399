/* The live predictor (examples/mtf_live.h) against prepare + predict, on an MT5-format CSV
 * of random-walk M1 bars with weekends, missing minutes, and five rows the live predictor
 * refuses (a duplicate, an out-of-order row, a bar off the minute, high < low, a date that
 * does not parse), which prepare --skip-bad skips alike (run from the repository root, as
 * `make test` does):
 *   - every sample prepare wrote (stride 1: a few thousand consecutive bars) has, at the
 *     same time, a live sample that is bitwise the same (features of every timeframe,
 *     normalised), and live predictions bitwise those of build/predict --batch 1 (batch 1
 *     both ways: the same gemm shapes; other batch sizes agree within 1e-6, test_predict);
 *   - the first live prediction comes at prepare's first sample;
 *   - refused bars (duplicate, out of order, bad values, off-minute) change nothing;
 *   - a gap closes the higher-timeframe bars it ended with the next bar;
 *   - build/predict --csv --live prints one line per row with the same predictions;
 *   - the stateful mode (a --carry model) predicts what the encoders give when run over
 *     the whole history in one call; a frozen LSTM (mb_lstm_freeze) gives an unfrozen one's
 *     bits and sees changed weights once unfrozen. */
#define _POSIX_C_SOURCE 200809L /* popen, mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mtf_live.h"
#include <sys/wait.h>
#include <unistd.h>

enum { NBARS = 16500, K = 2 };

static char dir[64];
static mbf_bar *bars;   /* the CSV's rows as parsed (the refused rows included) */
static int nbars;
static int dup_row, old_row, off_row, hilo_row, nodate_row; /* the rows that are refused */

static const char *path_of(const char *name) { return tu_path(dir, name); }

/* What mtf_live_push says of row i's bar ("" when it takes it): the refused rows. The row
 * without a date is kept in bars as a copy of the row before it (a duplicate), so that
 * pushing it is refused too. */
static const char *refusal(int i) {
    return i == dup_row || i == nodate_row ? "duplicate" : i == old_row ? "out of order"
           : i == off_row ? "not on a minute boundary" : i == hilo_row ? "bad bar" : "";
}

/* Random-walk M1 bars from Monday 2024-01-01 00:00 UTC: no bars from Friday 22:00 to Sunday
 * 22:00, about 1% of minutes missing, prices with 5 decimals; row dup_row repeats the row
 * before it, row old_row is an hour older than the row before it, off_row starts 30 s after
 * a minute, hilo_row has high < low, nodate_row has a date that does not parse. Written as
 * an MT5 export (tab-separated, <DATE> header) and parsed back as prepare parses (strtod of
 * the text). prepare --skip-bad skips the same five rows that the live predictor refuses. */
static void write_csv(void) {
    FILE *f = fopen(path_of("bars.csv"), "w");
    assert_non_null(f);
    fprintf(f, "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\n");
    bars = (mbf_bar *)calloc(NBARS + 2, sizeof *bars);
    assert_non_null(bars);
    dup_row = 9000 + tu_int(0, 500);
    off_row = 10000 + tu_int(0, 500);
    hilo_row = 11000 + tu_int(0, 500);
    old_row = 12000 + tu_int(0, 500);
    nodate_row = 13000 + tu_int(0, 500);
    double c = 1.1;
    int64_t t = 1704067200 - 60;
    for (nbars = 0; nbars < NBARS + 2;) {
        char row[256];
        int64_t bt;
        if (nbars == dup_row || nbars == nodate_row) bt = bars[nbars - 1].t;
        else if (nbars == old_row) bt = bars[nbars - 1].t - 3600;
        else if (nbars == off_row) bt = t + 30;
        else {
            do t += 60; while (((t / 86400 + 3) % 7 == 4 && t % 86400 >= 22 * 3600) || (t / 86400 + 3) % 7 == 5 ||
                               ((t / 86400 + 3) % 7 == 6 && t % 86400 < 22 * 3600) || tu_int(0, 99) == 0);
            bt = t;
        }
        double o = c;
        c = o * exp(3e-4 * (tu_uniform(-1, 1) + tu_uniform(-1, 1)));
        double h = fmax(o, c) * exp(1e-4 * tu_uniform(0, 1)), l = fmin(o, c) * exp(-1e-4 * tu_uniform(0, 1));
        h = fmax(h, fmax(o, c));
        l = fmin(l, fmin(o, c));
        if (nbars == hilo_row) { double x = h; h = l * 0.999; l = x; }
        time_t tt = (time_t)bt;
        struct tm tm;
        gmtime_r(&tt, &tm);
        char when[32];
        strftime(when, sizeof when, "%Y.%m.%d\t%H:%M:%S", &tm);
        if (nbars == nodate_row) memcpy(when, "2024.13.40", 10);
        snprintf(row, sizeof row, "%.5f\t%.5f\t%.5f\t%.5f\t%d", o, h, l, c, tu_int(1, 500));
        fprintf(f, "%s\t%s\t0\t10\n", when, row);
        mbf_bar *b = &bars[nbars++];
        b->t = bt;
        assert_int_equal(sscanf(row, "%lf\t%lf\t%lf\t%lf\t%lf", &b->o, &b->h, &b->l, &b->c, &b->v), 5);
        if (nbars - 1 == nodate_row) *b = bars[nbars - 2];
    }
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mb_live_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    write_csv();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/prepare --csv %s --skip-bad --stride 1 --features 3 --targets %d --quiet "
             "--out-train %s --out-val %s && build/train_multitf --train %s --val %s --epochs 1 --batch 32 --hidden 4 "
             "--head 6 --max-batches 3 --quiet --export %s >/dev/null", path_of("bars.csv"), K, path_of("train.h5"),
             path_of("val.h5"), path_of("train.h5"), path_of("val.h5"), path_of("m.safetensors"));
    if (system(cmd) != 0) return -1;
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s --val %s --epochs 1 --batch 32 --hidden 4 --head 6 "
             "--max-batches 3 --carry --quiet --export %s >/dev/null", path_of("train.h5"), path_of("val.h5"),
             path_of("c.safetensors"));
    if (system(cmd) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        const char *split = i ? "val" : "train";
        char h5[32], csv[32];
        snprintf(h5, sizeof h5, "%s.h5", split);
        snprintf(csv, sizeof csv, "%s.csv", split);
        snprintf(cmd, sizeof cmd, "build/predict --model %s --data %s --out %s --batch 1 --quiet",
                 path_of("m.safetensors"), path_of(h5), path_of(csv));
        if (system(cmd) != 0) return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(bars);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- prepare's samples ---- */

typedef struct split { mb_dataset *ds; int64_t n, *times; float *pred; } split;

static void split_open(split *s, const char *name) {
    char h5[32], csv[32];
    snprintf(h5, sizeof h5, "%s.h5", name);
    snprintf(csv, sizeof csv, "%s.csv", name);
    assert_int_equal(mb_dataset_open_file(&s->ds, path_of(h5), NULL), MB_OK);
    s->n = mb_dataset_info(s->ds)->n;
    s->times = (int64_t *)malloc((size_t)s->n * sizeof *s->times);
    s->pred = tu_alloc_f32((size_t)(s->n * K));
    hid_t f = H5Fopen(path_of(h5), H5F_ACC_RDONLY, H5P_DEFAULT), d = H5Dopen2(f, "times", H5P_DEFAULT);
    assert_true(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->times) >= 0);
    H5Dclose(d);
    H5Fclose(f);
    FILE *p = fopen(path_of(csv), "r");
    assert_non_null(p);
    char line[256];
    assert_non_null(fgets(line, sizeof line, p));
    for (int64_t i = 0; i < s->n; i++) assert_int_equal(fscanf(p, "%f,%f", &s->pred[i * K], &s->pred[i * K + 1]), 2);
    fclose(p);
}

static void split_close(split *s) {
    mb_dataset_close(s->ds);
    free(s->times);
    free(s->pred);
}

static int64_t find_time(const split *s, int64_t t) {
    int64_t lo = 0, hi = s->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->times[mid] < t) lo = mid + 1; else hi = mid;
    }
    return lo < s->n && s->times[lo] == t ? lo : -1;
}

static void test_live_equals_prepare_predict(void **state) {
    (void)state;
    split sp[2];
    split_open(&sp[0], "train");
    split_open(&sp[1], "val");
    mtf_live *lv = NULL;
    assert_int_equal(mtf_live_open(&lv, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_WINDOW), MB_OK);
    const mtf_spec *s = &lv->m.spec;
    float *x = tu_alloc_f32((size_t)(s->T * s->F)), y[K], pred[K];
    int64_t compared = 0, after_gap = 0, first_ready = -1, refused = 0;
    for (int i = 0; i < nbars; i++) {
        int ready = 0;
        mb_result r = mtf_live_push(lv, &bars[i], pred, &ready);
        if (refusal(i)[0]) {
            assert_int_equal(r, MB_ERR_INVALID_ARG);
            if (!strstr(mb_last_error(), refusal(i))) fail_msg("row %d: '%s' lacks '%s'", i, mb_last_error(), refusal(i));
            refused++;
            continue;
        }
        assert_int_equal(r, MB_OK);
        if (!ready) continue;
        int64_t t = bars[i].t + 60;
        if (first_ready < 0) first_ready = t;
        for (int k = 0; k < 2; k++) {
            int64_t j = find_time(&sp[k], t);
            if (j < 0) continue;
            assert_int_equal(mb_dataset_read(sp[k].ds, j, j + 1, x, y, NULL), MB_OK);
            if (memcmp(x, mtf_live_sample(lv), (size_t)(s->T * s->F) * sizeof(float)))
                fail_msg("bar %d (time %lld): live sample differs from prepare's", i, (long long)t);
            if (memcmp(pred, sp[k].pred + j * K, sizeof pred))
                fail_msg("bar %d: live %.9g %.9g, predict %.9g %.9g", i, (double)pred[0], (double)pred[1],
                         (double)sp[k].pred[j * K], (double)sp[k].pred[j * K + 1]);
            compared++;
            int prev = i - 1;
            while (refusal(prev)[0]) prev--;
            after_gap += bars[prev].t != bars[i].t - 60;
        }
    }
    printf("%lld consecutive-bar samples bitwise equal (features and predictions), %lld right after a gap; "
           "%lld bars refused\n", (long long)compared, (long long)after_gap, (long long)refused);
    assert_int_equal(compared, sp[0].n + sp[1].n); /* every sample prepare wrote */
    assert_true(compared >= 2000);
    assert_true(after_gap >= 10);
    assert_int_equal(first_ready, sp[0].times[0]);
    mtf_live_close(lv);
    free(x);
    split_close(&sp[0]);
    split_close(&sp[1]);
}

/* Refused bars change nothing: a stream with extra bad bars pushed at random places ends
 * with the predictions of the stream without them. */
static void test_refused_bars_change_nothing(void **state) {
    (void)state;
    mtf_live *a = NULL, *b = NULL;
    assert_int_equal(mtf_live_open(&a, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_WINDOW), MB_OK);
    assert_int_equal(mtf_live_open(&b, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_WINDOW), MB_OK);
    float pa[K], pb[K];
    int ra = 0, rb = 0, checked = 0;
    for (int i = 0; i < nbars; i++) {
        mb_result r = mtf_live_push(a, &bars[i], pa, &ra);
        if (refusal(i)[0]) continue;
        assert_int_equal(r, MB_OK);
        if (i > 0 && tu_int(0, 19) == 0) { /* a bad bar before the good one */
            mbf_bar bad = bars[i];
            const char *want = NULL;
            switch (tu_int(0, 4)) {
            case 0: bad = bars[i - 1]; want = refusal(i - 1)[0] ? NULL : "duplicate"; break;
            case 1: bad.t -= 7 * 86400; want = "out of order"; break;
            case 2: bad.h = bad.l * 0.5; want = "bad bar"; break;
            case 3: bad.t += 30; want = "minute"; break;
            default: bad.c = NAN; want = "bad bar"; break;
            }
            if (want) {
                assert_int_equal(mtf_live_push(b, &bad, pb, &rb), MB_ERR_INVALID_ARG);
                if (!strstr(mb_last_error(), want)) fail_msg("got '%s', want '%s'", mb_last_error(), want);
            }
        }
        assert_int_equal(mtf_live_push(b, &bars[i], pb, &rb), MB_OK);
        assert_int_equal(ra, rb);
        if (ra) { assert_int_equal(memcmp(pa, pb, sizeof pa), 0); checked++; }
    }
    assert_true(checked > 2000);
    mtf_live_close(a);
    mtf_live_close(b);
}

/* A gap inside an H1 bucket: the H1 bar it cut short closes with the first bar after the
 * gap (a row of timeframe 3 whose start is that bucket's), and M1's row is the new bar. */
static void test_gap_closes_bars(void **state) {
    (void)state;
    mtf_live *lv = NULL;
    assert_int_equal(mtf_live_open(&lv, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_WINDOW), MB_OK);
    float p[K];
    int ready;
    mbf_bar b = {1704067200 + 3600 * 5, 1.1, 1.1002, 1.0998, 1.1001, 10}; /* Monday 05:00 */
    for (int i = 0; i < 30; i++, b.t += 60) assert_int_equal(mtf_live_push(lv, &b, p, &ready), MB_OK);
    int64_t hour = b.t - 60 - (b.t - 60) % 3600;
    b.t += 3 * 3600; /* three hours missing */
    assert_int_equal(mtf_live_push(lv, &b, p, &ready), MB_OK);
    int h1 = -1, m1 = -1;
    for (int i = 0; i < lv->out.n; i++) {
        if (lv->out.row[i].tf == 3) h1 = i;
        if (lv->out.row[i].tf == 0) m1 = i;
    }
    assert_true(h1 >= 0 && m1 >= 0);
    assert_int_equal(lv->out.row[h1].bar.t, hour);
    assert_int_equal(lv->out.row[m1].bar.t, b.t);
    assert_int_equal(lv->rows[3], 1);
    assert_int_equal(lv->bars, 31);
    mtf_live_close(lv);
}

/* build/predict --csv --live: one line per data row, refused rows named, the same
 * predictions as the API. */
static void test_predict_live_replay(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "build/predict --model %s --csv %s --live --out %s --quiet", path_of("m.safetensors"),
             path_of("bars.csv"), path_of("lines.csv"));
    assert_int_equal(system(cmd), 0);
    mtf_live *lv = NULL;
    assert_int_equal(mtf_live_open(&lv, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_WINDOW), MB_OK);
    FILE *f = fopen(path_of("lines.csv"), "r");
    assert_non_null(f);
    char line[512];
    int n = 0, ok = 0, refused = 0;
    while (fgets(line, sizeof line, f)) {
        assert_true(n < nbars);
        float p[K], q[K];
        int ready = 0;
        mb_result r = mtf_live_push(lv, &bars[n], p, &ready);
        char *status = strchr(line, ',');
        assert_non_null(status);
        status++;
        if (r != MB_OK) { /* the row's time (with its seconds when off the minute), or its line without one */
            char want[96], lead[64];
            int lineno = n + 2; /* the header is line 1 */
            time_t tt = (time_t)bars[n].t;
            struct tm tm;
            gmtime_r(&tt, &tm);
            strftime(lead, sizeof lead, n == off_row ? "%Y.%m.%d %H:%M:%S" : "%Y.%m.%d %H:%M", &tm);
            if (n == nodate_row) snprintf(lead, sizeof lead, "line %d", lineno);
            snprintf(want, sizeof want, "%s,refused: line %d: ", lead, lineno);
            if (strncmp(line, want, strlen(want))) fail_msg("row %d: '%s' does not start with '%s'", n, line, want);
            refused++;
        } else if (!ready) {
            assert_string_equal(status, "warmup\n");
        } else {
            assert_int_equal(sscanf(status, "ok,%f,%f", &q[0], &q[1]), 2);
            assert_int_equal(memcmp(p, q, sizeof p), 0);
            ok++;
        }
        n++;
    }
    fclose(f);
    assert_int_equal(n, nbars);
    assert_int_equal(refused, 5);
    assert_true(ok > 2000);
    mtf_live_close(lv);
    snprintf(cmd, sizeof cmd, "build/predict --model tests/golden/multitf_torch.safetensors --csv %s --live "
             "2>&1 >/dev/null | grep -q 'needs the 5 timeframes\\|no feature normalisation'", path_of("bars.csv"));
    assert_int_equal(system(cmd), 0);
}

/* Stateful: after n pushes, the prediction equals, bit for bit, the encoders run over
 * every row of their timeframe since the first bar in one forward each. */
static void check_stateful_at(int upto) {
    mtf_live *lv = NULL;
    assert_int_equal(mtf_live_open(&lv, path_of("c.safetensors"), MB_CPU, 1, MTF_LIVE_STATEFUL), MB_OK);
    mtf_spec s = lv->m.spec;
    float *rows[MBF_TFS], pred[K];
    for (int k = 0; k < MBF_TFS; k++) rows[k] = tu_alloc_f32((size_t)(upto * s.F));
    int ready = 0, pushed = 0;
    for (int i = 0; i < nbars && pushed < upto; i++) {
        if (mtf_live_push(lv, &bars[i], pred, &ready) != MB_OK) continue;
        pushed++;
        for (int j = 0; j < lv->out.n; j++) { /* the same normalisation, kept for the reference */
            const mbf_row *r = &lv->out.row[j];
            for (int64_t f = 0; f < s.F; f++)
                rows[r->tf][(lv->rows[r->tf] - 1) * s.F + f] = (r->x[f] - s.mean[r->tf * s.F + f]) / s.std[r->tf * s.F + f];
        }
    }
    assert_true(ready);
    mtf_spec whole = s; /* one segment per timeframe holding all its rows */
    whole.T = 0;
    for (int k = 0; k < MBF_TFS; k++) { whole.seg_len[k] = lv->rows[k]; whole.T += lv->rows[k]; }
    float *x = tu_alloc_f32((size_t)(whole.T * s.F));
    for (int k = 0, off = 0; k < MBF_TFS; off += (int)lv->rows[k], k++)
        memcpy(x + off * s.F, rows[k], (size_t)(lv->rows[k] * s.F) * sizeof(float));
    mb_st_file *f = NULL;
    mtf_model m;
    const float *want = NULL;
    assert_int_equal(mb_st_open(&f, path_of("c.safetensors")), MB_OK);
    assert_int_equal(mtf_model_create(&m, lv->dev, &whole, 1, 0), MB_OK);
    assert_int_equal(mtf_model_load(&m, f), MB_OK);
    assert_int_equal(mtf_model_forward(&m, x, 1, &want), MB_OK);
    if (memcmp(pred, want, sizeof pred))
        fail_msg("stateful %.9g %.9g, whole history %.9g %.9g", (double)pred[0], (double)pred[1], (double)want[0],
                 (double)want[1]);
    printf("stateful after %d bars (M1 rows %lld): bitwise the whole-history forward\n", upto, (long long)lv->rows[0]);
    mtf_model_destroy(&m);
    mb_st_close(f);
    free(x);
    for (int k = 0; k < MBF_TFS; k++) free(rows[k]);
    mtf_live_close(lv);
}

/* docs/TRADING.md's embedding example (tests/docs/live.c, built by the compile checks) does
 * what the page says: no bar refused, the first prediction once the history is long enough
 * (11,520 continuous M1 bars: 48 closed H4 bars). */
static void test_docs_example_runs(void **state) {
    (void)state;
    if (access("build/compile/docs_live", X_OK) != 0) skip(); /* built by make build / make test */
    char cmd[512], line[256] = "", cwd[256];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "cp %s %s && cd %s && %s/build/compile/docs_live 2>&1", path_of("m.safetensors"),
             path_of("model.safetensors"), dir, cwd);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int lines = 0;
    while (fgets(line, sizeof line, p)) lines++;
    assert_int_equal(WEXITSTATUS(pclose(p)), 0);
    const char *want = "first prediction after 11520 bars: ";
    if (lines != 1 || strncmp(line, want, strlen(want)) != 0)
        fail_msg("the docs' example printed %d line(s), the last '%s'", lines, line);
}

static void test_stateful_mode(void **state) {
    (void)state;
    check_stateful_at(12000 + tu_int(0, 400));
    check_stateful_at(nbars - 2);
    mtf_live *lv = NULL; /* a model trained without --carry */
    assert_int_equal(mtf_live_open(&lv, path_of("m.safetensors"), MB_CPU, 1, MTF_LIVE_STATEFUL), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "--carry"));
    assert_null(lv);
}

/* mb_lstm_freeze (the stateful mode's encoders are frozen): T = 1 steps of a frozen LSTM
 * give the bits of an unfrozen one (1 and 2 layers); a one-layer LSTM really keeps its
 * packing (a weight changed behind the promise is not seen), and after mb_lstm_freeze(l, 0)
 * the change is seen. */
static void run_steps(mb_lstm *l, const float *x, int64_t F, int n, float *h) {
    mb_lstm_reset_state(l);
    for (int t = 0; t < n; t++) assert_int_equal(mb_lstm_forward(l, x + t * F, 1, 1, NULL, NULL, NULL, h), MB_OK);
}

static void test_frozen_lstm(void **state) {
    (void)state;
    mb_device *dev = tu_open_cpu();
    for (int layers = 1; layers <= 2; layers++) {
        enum { F = 7, H = 19, N = 30 };
        mb_params *p[2];
        mb_lstm *l[2];
        for (int i = 0; i < 2; i++) {
            mb_lstm_config c;
            memset(&c, 0, sizeof c);
            c.input_size = F; c.hidden_size = H; c.layers = layers; c.max_steps = 1; c.max_batch = 1;
            c.carry_state = 1;
            assert_int_equal(mb_params_create(&p[i], dev), MB_OK);
            assert_int_equal(mb_lstm_create(&l[i], p[i], &c), MB_OK);
            assert_int_equal(mb_params_finalize(p[i]), MB_OK);
            assert_int_equal(mb_params_init(p[i], 17), MB_OK);
        }
        mb_lstm_freeze(l[1], 1);
        float x[N * F], h0[H], h1[H];
        tu_fill(x, N * F, -1, 1);
        run_steps(l[0], x, F, N, h0);
        run_steps(l[1], x, F, N, h1);
        assert_memory_equal(h0, h1, sizeof h0);
        mb_params_data(p[0])[0] += 0.5f; /* W_ih's first weight: the same change to both */
        mb_params_data(p[1])[0] += 0.5f;
        float stale[H];
        run_steps(l[1], x, F, N, stale); /* the promise broken: one layer keeps its packing */
        run_steps(l[0], x, F, N, h0);
        if (layers == 1) assert_memory_equal(stale, h1, sizeof h1);
        else assert_memory_equal(stale, h0, sizeof h0); /* two layers share the buffer: packed each time */
        assert_true(memcmp(h0, h1, sizeof h0) != 0);
        mb_lstm_freeze(l[1], 0);
        run_steps(l[1], x, F, N, h1);
        assert_memory_equal(h0, h1, sizeof h0);
        for (int i = 0; i < 2; i++) { mb_lstm_destroy(l[i]); mb_params_destroy(p[i]); }
    }
    mb_device_close(dev);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_equals_prepare_predict),
        cmocka_unit_test(test_refused_bars_change_nothing),
        cmocka_unit_test(test_gap_closes_bars),
        cmocka_unit_test(test_predict_live_replay),
        cmocka_unit_test(test_docs_example_runs),
        cmocka_unit_test(test_stateful_mode),
        cmocka_unit_test(test_frozen_lstm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
