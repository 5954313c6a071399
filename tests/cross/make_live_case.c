/* make_live_case - the inputs of the DLL check (tests/cross/run.sh): a live model and an
 * MT5 export to replay through it.
 *   make_live_case DIR [seed [example]]
 * writes DIR/model.safetensors: the multi-timeframe model (train_multitf --export's layout
 * and metadata: segments M1,M5,M15,H1,H4 of 60,24,16,12,6 rows, F=8, H=16, head 24, K=12,
 * carry=1 so it opens in both modes) with seeded random weights and a seeded feature
 * normalisation (mean in [-0.1, 0.1], std in [0.5, 2]); the predictions' bits depend on
 * every weight, which is all the check needs (no training: that is tests/test_live.c's);
 * and DIR/bars.csv: 6000 random-walk M1 bars with weekends and missing minutes, as MT5
 * exports them (tab-separated, <DATE> header), with a duplicate, an out-of-order, an
 * off-the-minute and a high < low row that the live predictor refuses. Same seed, same
 * files (the seed is printed). "example": the model has the example's shape instead (T = 1104
 * of 480,288,192,96,48 rows, F=12, H=32, head 64, K=36: bench_live's), for timing. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "examples/mtf_live.h"
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng;
static double uni(void) { /* [0, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static mb_result write_model(const char *path, uint64_t seed, int big) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    const int64_t small[5] = {60, 24, 16, 12, 6}, example[5] = {480, 288, 192, 96, 48};
    const int64_t *seg = big ? example : small;
    s.nseg = 5; s.layers = 1; s.carry = 1; s.has_norm = 1;
    s.F = big ? 12 : 8; s.K = big ? 36 : 12; s.hidden_size = big ? 32 : 16; s.head = big ? 64 : 24;
    for (int k = 0; k < 5; k++) { s.seg_len[k] = seg[k]; s.T += seg[k]; }
    snprintf(s.seg_names, sizeof s.seg_names, "M1,M5,M15,H1,H4");
    for (int i = 0; i < 5 * s.F; i++) { s.mean[i] = (float)(0.2 * uni() - 0.1); s.std[i] = (float)(0.5 + 1.5 * uni()); }
    mb_device *dev = NULL;
    mtf_model m;
    mtf_meta_text t;
    memset(&m, 0, sizeof m);
    mb_result r = mtf_device_open(&dev, MB_CPU, 1);
    if (r == MB_OK) r = mtf_model_create(&m, dev, &s, 1, 0);
    if (r == MB_OK) r = mb_params_init(m.params, seed);
    if (r == MB_OK) r = mtf_meta_of(&s, &t);
    if (r == MB_OK) r = mb_st_save_params(path, m.params, mtf_rename, t.kv, t.n);
    if (r == MB_OK) mtf_meta_free(&t);
    if (m.params) mtf_model_destroy(&m);
    mb_device_close(dev);
    return r;
}

static int write_csv(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\n");
    int64_t t = 1704067200 - 60, prev = t; /* Monday 2024-01-01 00:00 UTC */
    double c = 1.1;
    for (int i = 0; i < 6000; i++) {
        int64_t bt;
        if (i == 2000) bt = prev;                 /* duplicate */
        else if (i == 3000) bt = prev - 3600;     /* out of order */
        else if (i == 4000) bt = t + 30;          /* off the minute */
        else {
            do t += 60; while (((t / 86400 + 3) % 7 == 4 && t % 86400 >= 22 * 3600) || (t / 86400 + 3) % 7 == 5 ||
                               ((t / 86400 + 3) % 7 == 6 && t % 86400 < 22 * 3600) || uni() < 0.01);
            bt = t;
        }
        double o = c;
        c = o * exp(3e-4 * (2 * uni() - 1 + 2 * uni() - 1));
        double h = fmax(o, c) * exp(1e-4 * uni()), l = fmin(o, c) * exp(-1e-4 * uni());
        if (i == 5000) { double x = h; h = l * 0.999; l = x; } /* high < low */
        int64_t d = bt / 86400, s = bt % 86400;
        int64_t z = d + 719468, era = z / 146097, doe = z - era * 146097; /* civil from days, t > 0 */
        int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365, doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        int64_t mp = (5 * doy + 2) / 153, dd = doy - (153 * mp + 2) / 5 + 1, mm = mp < 10 ? mp + 3 : mp - 9;
        int64_t yy = yoe + era * 400 + (mm <= 2);
        fprintf(f, "%04d.%02d.%02d\t%02d:%02d:%02d\t%.5f\t%.5f\t%.5f\t%.5f\t%d\t0\t10\n", (int)yy, (int)mm, (int)dd,
                (int)(s / 3600), (int)(s / 60 % 60), (int)(s % 60), o, h, l, c, 1 + (int)(uni() * 500));
        if (i != 2000 && i != 3000 && i != 4000 && i != 5000) prev = bt;
    }
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4 || (argc == 4 && strcmp(argv[3], "example"))) {
        fprintf(stderr, "usage: make_live_case DIR [seed [example]]\n");
        return 2;
    }
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 44;
    rng = seed;
    printf("make_live_case: seed %llu\n", (unsigned long long)seed);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", argv[1]);
    if (write_model(p, seed, argc == 4) != MB_OK) { fprintf(stderr, "error: %s\n", mb_last_error()); return 2; }
    snprintf(p, sizeof p, "%s/bars.csv", argv[1]);
    if (write_csv(p)) { fprintf(stderr, "error: cannot write %s\n", p); return 2; }
    return 0;
}
