/* cmp_live - compare two `predict --live` outputs (lines "time,ok,p1,...,pK", "time,warmup",
 * "time,refused: ..."): every line's time and status must be the same, and each prediction
 * within `ulps` units in the last place of a float or within `atol` absolute (the second
 * for values near zero, where an ulp is tiny next to the outputs' scale; 0 0: bitwise).
 *   cmp_live A B [ulps [atol]]        defaults 0 0
 * Prints the lines, the predictions compared, how many differ and the largest difference
 * (in ulps and absolute); exit 0 when within, 1 when not, 2 on bad usage or unreadable files. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distance in float ulps (the ordered integer line of floats). */
static int64_t ulps_apart(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    int64_t ox = x < 0 ? (int64_t)INT32_MIN - x : x, oy = y < 0 ? (int64_t)INT32_MIN - y : y;
    return ox > oy ? ox - oy : oy - ox;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) { fprintf(stderr, "usage: cmp_live A B [ulps [atol]]\n"); return 2; }
    long tol = argc > 3 ? strtol(argv[3], NULL, 10) : 0;
    double atol = argc > 4 ? strtod(argv[4], NULL) : 0;
    FILE *fa = fopen(argv[1], "rb"), *fb = fopen(argv[2], "rb");
    if (!fa || !fb) { fprintf(stderr, "error: cannot read %s or %s\n", argv[1], argv[2]); return 2; }
    static char la[65536], lb[65536];
    long lines = 0, values = 0, differ = 0, bad = 0;
    int64_t worst = 0;
    double worst_abs = 0;
    for (;;) {
        char *ra = fgets(la, sizeof la, fa), *rb = fgets(lb, sizeof lb, fb);
        if (!ra || !rb) {
            if (ra || rb) { fprintf(stderr, "cmp_live: %s ends first\n", ra ? argv[2] : argv[1]); bad++; }
            break;
        }
        lines++;
        char *pa = strstr(la, ",ok,"), *pb = strstr(lb, ",ok,");
        if (!pa || !pb || pa - la != pb - lb || memcmp(la, lb, (size_t)(pa - la))) {
            if (strcmp(la, lb)) { fprintf(stderr, "cmp_live: line %ld differs:\n  %s  %s", lines, la, lb); bad++; }
            continue;
        }
        pa += 4;
        pb += 4;
        for (;;) {
            char *ea, *eb;
            float a = strtof(pa, &ea), b = strtof(pb, &eb);
            if (ea == pa || eb == pb) {
                if (*pa != *pb) { fprintf(stderr, "cmp_live: line %ld: different numbers of values\n", lines); bad++; }
                break;
            }
            values++;
            int64_t u = ulps_apart(a, b);
            if (u) differ++;
            if (u > worst) worst = u;
            if (fabs((double)a - (double)b) > worst_abs) worst_abs = fabs((double)a - (double)b);
            if (u > tol && !(fabs((double)a - (double)b) <= atol) && bad++ < 5) fprintf(stderr, "cmp_live: line %ld: %.9g vs %.9g (%lld ulps)\n", lines, a, b, (long long)u);
            pa = *ea == ',' ? ea + 1 : ea;
            pb = *eb == ',' ? eb + 1 : eb;
        }
    }
    printf("cmp_live: %ld lines, %ld predictions, %ld differ (largest %lld ulps, %.3g absolute); tolerance %ld ulps or "
           "%.3g absolute: %s\n", lines, values, differ, (long long)worst, worst_abs, tol, atol, bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}
