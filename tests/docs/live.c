/* live.c - docs/TRADING.md's embedding example: a whole program (compiled by the Makefile's
 * compile checks, run by tests/test_live.c with a model, which checks that it prints its first
 * prediction and refuses no bar; the doc's block is the region between the snippet markers). */
// snippet: trading-embed
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "mtf_live.h"      /* examples/: the live predictor (features engine + model) */
#include <stdio.h>

/* On every closed M1 bar from the broker: 1 when pred holds the model's K predictions for
 * this moment, 0 while the history is still too short or the bar was refused. */
static int on_bar(mtf_live *lv, const mbf_bar *b, float *pred) {
    int ready = 0;
    mb_result r = mtf_live_push(lv, b, pred, &ready);   /* a refused bar changes nothing */
    if (r != MB_OK) fprintf(stderr, "bar refused: %s\n", mb_last_error());
    return r == MB_OK && ready;
}

int main(void) {
    mtf_live *lv;
    if (mtf_live_open(&lv, "model.safetensors", MB_CPU, 1, MTF_LIVE_WINDOW) != MB_OK) {  /* train_multitf --export */
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 1;
    }
    float pred[256];                                     /* >= K of the model (lv->m.spec.K) */
    int64_t start = 1704067200;                          /* Monday 2024-01-01 00:00 UTC: bars start on a minute */
    for (int i = 0; i < 12000; i++) {                    /* history first: 48 closed H4 bars = 11,520 M1 bars */
        double p = 1.1 + 1e-4 * (i % 13);
        mbf_bar b = {start + 60 * (int64_t)i, p, p + 2e-4, p - 2e-4, p + 1e-4, 120};  /* start (UTC s), o, h, l, c, volume */
        if (on_bar(lv, &b, pred)) {
            printf("first prediction after %d bars: %g\n", i + 1, (double)pred[0]);
            break;
        }
    }
    mtf_live_close(lv);
    return 0;
}
// end snippet
