/* examples/mb_plot.h: the loss-curve picture from hand-made metrics files. Early batch
 * spikes do not squeeze the epochs' losses together (the validation loss stands clear of
 * the baseline), the gap is given in percent both ways (below / above), and edge cases
 * (no epoch yet, one epoch, all losses equal, NaN and Inf) give a well-formed picture
 * without NaN or Inf in it. The validation metrics' panel (val_hit, val_ic, val_rank_ic) is
 * drawn when those columns have values, its points where their values say, and not at all
 * for a file without them (or with them empty). Random noise: the seed is printed
 * (MB_TEST_SEED replays). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mb_plot.h"
#include <unistd.h>

static char dir[64], csv[128], svg[128];
static char pic[1 << 20];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mb_plot_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(csv, sizeof csv, "%s/m.csv", dir);
    snprintf(svg, sizeof svg, "%s/m.svg", dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(csv); remove(svg); rmdir(dir);
    return 0;
}

/* Write a metrics file: `steps` batch losses per epoch around `level` (first spike
 * `spike`), then an epoch row with train/val/base; returns nothing. */
static void write_metrics(int epochs, int steps, double spike, const double *train, const double *val, double base) {
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n", f);
    int b = 0;
    for (int e = 1; e <= epochs; e++) {
        for (int i = 0; i < steps; i++, b++) {
            double l = b < 3 ? spike : train[e - 1] * (1 + tu_uniform(-0.5f, 0.5f));
            fprintf(f, "step,%d,%d,%d,%.6g,,,0.001,100.0,\n", e, b + 1, b + 1, l);
        }
        fprintf(f, "epoch,%d,%d,%d,%.6g,%.6g,%.6g,,100.0,0\n", e, b, b, train[e - 1], val[e - 1], base);
    }
    fclose(f);
}

/* Draw, read back, check the document's frame and that no NaN/Inf was written. */
static void draw(void) {
    assert_int_equal(mb_plot_svg(csv, svg, "a title"), 0);
    FILE *f = fopen(svg, "rb");
    assert_non_null(f);
    size_t n = fread(pic, 1, sizeof pic - 1, f);
    fclose(f);
    pic[n] = 0;
    assert_int_equal(strncmp(pic, "<svg ", 5), 0);
    assert_true(n > 7 && strcmp(pic + n - 7, "</svg>\n") == 0);
    assert_null(strstr(pic, "nan"));
    assert_null(strstr(pic, "inf"));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "xmllint --noout %s", svg);
    if (system("command -v xmllint >/dev/null 2>&1") == 0) assert_int_equal(system(cmd), 0);
}

/* Pixels between the baseline and the last validation marker's centre. */
static double gap_px(void) {
    const char *b = strstr(pic, "<line class=\"baseline\""), *v = NULL;
    for (const char *p = pic; (p = strstr(p, "<rect class=\"val\"")) != NULL; p++) v = p;
    double yb, yv;
    assert_true(b && v);
    assert_int_equal(sscanf(strstr(b, "y1=\""), "y1=\"%lf", &yb), 1);
    assert_int_equal(sscanf(strstr(v, " y=\""), " y=\"%lf", &yv), 1);
    return fabs(yv + 4.5 - yb);
}

static void test_spikes_do_not_hide_the_gap(void **state) {
    (void)state;
    double train[4] = {0.97, 0.84, 0.82, 0.81}, val[4] = {0.79, 0.76, 0.754, 0.755};
    write_metrics(4, 100, 40.0, train, val, 0.8013); /* three batches at 40: 50x the rest */
    draw();
    double px = gap_px();
    printf("gap %.1f px of a %d px panel\n", px, MBP_TOP_H);
    assert_true(px >= MBP_TOP_H / 6.0);
    assert_non_null(strstr(pic, "validation loss 0.7550: 5.8% below the baseline 0.8013"));
    assert_non_null(strstr(pic, ">-5.8%</text>"));
    assert_non_null(strstr(pic, "baseline 0.8013"));
}

static void test_above_baseline(void **state) {
    (void)state;
    double train[2] = {1.2, 1.1}, val[2] = {1.05, 1.02};
    write_metrics(2, 30, 1.0, train, val, 1.0);
    draw();
    assert_non_null(strstr(pic, "2.0% above the baseline 1.0000"));
    assert_non_null(strstr(pic, ">+2.0%</text>"));
    assert_true(gap_px() >= MBP_TOP_H / 12.0);
}

static void test_edge_cases(void **state) {
    (void)state;
    FILE *f = fopen(csv, "w"); /* a run killed before its first epoch ended */
    fputs("kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n"
          "step,1,1,1,0.9,,,0.001,1.0,\nstep,1,2,2,0.8,,,0.001,1.0,\n", f);
    fclose(f);
    draw();
    assert_non_null(strstr(pic, "no epoch finished yet"));
    double one[1] = {0.5}; /* one epoch, every loss equal */
    write_metrics(1, 1, 0.5, one, one, 0.5);
    draw();
    assert_non_null(strstr(pic, "0.0% above the baseline"));
    f = fopen(csv, "w"); /* NaN and Inf losses are left out */
    fputs("kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n"
          "step,1,1,1,nan,,,0.001,1.0,\nstep,1,2,2,inf,,,0.001,1.0,\nstep,1,3,3,0.7,,,0.001,1.0,\n"
          "epoch,1,3,3,0.7,nan,0.8,,1.0,0\n", f);
    fclose(f);
    draw();
    f = fopen(csv, "w"); /* empty */
    fclose(f);
    draw();
    assert_int_equal(mb_plot_svg("/nonexistent/m.csv", svg, "t"), -1);
    assert_int_equal(mb_plot_svg(csv, "/nonexistent/dir/m.svg", "t"), -1);
}

/* Every y of the circles of class cls, in order (returns how many). */
static int circles(const char *cls, double *y, int cap) {
    char key[64];
    snprintf(key, sizeof key, "<circle class=\"%s\"", cls);
    int n = 0;
    for (const char *p = pic; (p = strstr(p, key)) != NULL && n < cap; p++)
        assert_int_equal(sscanf(strstr(p, " cy=\""), " cy=\"%lf", &y[n++]), 1);
    return n;
}

/* A file with the metrics' columns among others (per-horizon ones, whose names start alike,
 * 60 horizons: a line of some 2,400 bytes), in another order than mb_metrics.h writes them. */
static void write_with_metrics(int epochs, const double *hit, const double *ic, const double *ric, int empty) {
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes,val_rank_ic,val_ic,val_hit", f);
    for (int k = 1; k <= 60; k++) fprintf(f, ",val_hit_%d,val_ic_%d,val_rank_ic_%d,val_n_%d", k, k, k, k);
    fputc('\n', f);
    for (int e = 1; e <= epochs; e++) {
        for (int i = 0; i < 10; i++) fprintf(f, "step,%d,%d,%d,%.6g,,,0.001,100.0,,,,\n", e, 10 * e - 9 + i, 10 * e - 9 + i, 1.0 - 0.01 * e);
        if (empty) fprintf(f, "epoch,%d,%d,%d,0.9,0.8,0.85,,100.0,0,,,", e, 10 * e, 10 * e);
        else fprintf(f, "epoch,%d,%d,%d,0.9,0.8,0.85,,100.0,0,%.6g,%.6g,%.6g", e, 10 * e, 10 * e, ric[e - 1], ic[e - 1], hit[e - 1]);
        for (int k = 1; k <= 60; k++) fprintf(f, ",%.6g,%.6g,%.6g,1000", 0.9, -0.9, 0.7); /* far from the means */
        fputc('\n', f);
    }
    fclose(f);
}

static void test_metrics_panel(void **state) {
    (void)state;
    double hit[4] = {0.50, 0.512, 0.524, 0.531}, ic[4] = {0.0, 0.021, 0.035, 0.042}, ric[4] = {-0.01, 0.015, 0.03, 0.038};
    write_with_metrics(4, hit, ic, ric, 0);
    draw();
    assert_non_null(strstr(pic, "height=\"772\""));
    double yh[8], yi[8], yr[8], zero;
    assert_int_equal(circles("val-hit", yh, 8), 4);
    assert_int_equal(circles("val-ic", yi, 8), 4);
    assert_int_equal(circles("val-rank-ic", yr, 8), 4);
    const char *z = strstr(pic, "<line class=\"zero\"");
    assert_non_null(z);
    assert_int_equal(sscanf(strstr(z, "y1=\""), "y1=\"%lf", &zero), 1);
    /* hit 0.5 and ic 0: on the zero line; rank ic -0.01 below it; the edges grow upwards, at
     * the end ic 0.042 above rank ic 0.038 above the hit's 0.031; all inside the panel */
    assert_true(fabs(yh[0] - zero) < 0.06 && fabs(yi[0] - zero) < 0.06);
    assert_true(yr[0] > zero && yi[3] < yr[3] && yr[3] < yh[3] && yh[3] < zero);
    for (int i = 0; i < 4; i++) assert_true(yh[i] >= MBP_MET && yh[i] <= MBP_MET + MBP_MET_H);
    for (int i = 1; i < 4; i++) assert_true(yh[i] < yh[i - 1] && yi[i] < yi[i - 1] && yr[i] < yr[i - 1]);
    assert_non_null(strstr(pic, ">hit 53.1%</text>"));
    assert_non_null(strstr(pic, ">IC 0.042</text>"));
    assert_non_null(strstr(pic, ">rank IC 0.038</text>"));
    assert_non_null(strstr(pic, "validation loss 0.8000"));  /* the losses still read from the same rows */
    /* the three labels (their values 0.011 apart at most) do not overlap */
    const char *lab[3] = {">hit 53.1%</text>", ">IC 0.042</text>", ">rank IC 0.038</text>"};
    double ly[3];
    for (int i = 0; i < 3; i++) {
        const char *e = strstr(pic, lab[i]), *t = e;
        while (t > pic && strncmp(t, "<text ", 6)) t--;
        assert_int_equal(sscanf(strstr(t, " y=\""), " y=\"%lf", &ly[i]), 1);
    }
    for (int i = 0; i < 3; i++) assert_true(fabs(ly[i] - ly[(i + 1) % 3]) >= 13 - 1e-9);
    /* the columns present but empty (metrics off): no panel */
    write_with_metrics(3, hit, ic, ric, 1);
    draw();
    assert_non_null(strstr(pic, "height=\"600\""));
    assert_null(strstr(pic, "val-hit"));
    assert_null(strstr(pic, "class=\"zero\""));
    /* an old file, without the columns: as before */
    double train[2] = {1.2, 1.1}, val[2] = {1.05, 1.02};
    write_metrics(2, 30, 1.0, train, val, 1.0);
    draw();
    assert_non_null(strstr(pic, "height=\"600\""));
    assert_null(strstr(pic, "val-ic"));
    /* one metric NaN in an epoch: that point left out, the others drawn */
    ic[2] = NAN;
    write_with_metrics(4, hit, ic, ric, 0);
    draw();
    assert_int_equal(circles("val-ic", yi, 8), 3);
    assert_int_equal(circles("val-hit", yh, 8), 4);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spikes_do_not_hide_the_gap),
        cmocka_unit_test(test_above_baseline),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_metrics_panel),
    };
    return cmocka_run_group_tests_name("plot", tests, setup, teardown);
}
