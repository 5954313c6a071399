/* live.c - docs/TRADING.md's embedding example: a whole program (compiled, not run, by the
 * Makefile's compile checks; the doc's block is the region between the snippet markers). */
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
    mbf_bar b = {1700000000, 1.1000, 1.1004, 1.0998, 1.1002, 120};  /* start (UTC s), o, h, l, c, volume */
    if (on_bar(lv, &b, pred)) printf("first prediction: %g\n", (double)pred[0]);
    mtf_live_close(lv);
    return 0;
}
// end snippet
