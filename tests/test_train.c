/* The multi-timeframe example end to end (build/prepare + build/train_multitf, run from
 * the repo root as `make test` does): it trains to below the naive baseline on a tiny
 * synthetic dataset, writes the metrics CSV (a row per batch and per epoch) and the SVG
 * of the loss curves, resumes bit for bit, and bad flags or data exit 2 with one `error:`
 * line. */
#define _POSIX_C_SOURCE 200809L /* popen, mkdtemp */
#define MEGABATCH_IMPLEMENTATION /* the checkpoint API, for the mid-window case */
#include "megabatch.h"
#include "testutil.h"
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

static char dir[64];

static int make_data(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mb_train_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "build/prepare --synthetic --bars 60000 --features 8 --stride 30 --quiet "
             "--out-train %s/train.h5 --out-val %s/val.h5", dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int remove_data(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run a command; return its exit code and its last output line containing `key`. */
static int run_cmd(const char *cmd, const char *key, char *line, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char buf[1024];
    line[0] = 0;
    while (fgets(buf, sizeof buf, p))
        if (strstr(buf, key)) snprintf(line, cap, "%s", buf);
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Lines of a file that start with prefix. */
static int count_rows(const char *path, const char *prefix) {
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("no file %s", path);
    char buf[1024];
    int n = 0;
    while (fgets(buf, sizeof buf, f)) n += strncmp(buf, prefix, strlen(prefix)) == 0;
    fclose(f);
    return n;
}

/* The loss-curve SVG: one document, <svg ...> to </svg>, its batch-loss polyline has
 * `points` points, no NaN or Inf written anywhere; xmllint, when installed, finds it
 * well-formed. */
static void check_svg(const char *path, int points) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("no picture %s", path);
    static char svg[1 << 20];
    size_t n = fread(svg, 1, sizeof svg - 1, f);
    fclose(f);
    svg[n] = 0;
    assert_true(n > 0 && n < sizeof svg - 1);
    assert_int_equal(strncmp(svg, "<svg ", 5), 0);
    assert_true(n >= 7 && strcmp(svg + n - 7, "</svg>\n") == 0);
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    const char *poly = strstr(svg, "<polyline class=\"step\"");
    assert_non_null(poly);
    assert_null(strstr(poly + 1, "<polyline class=\"step\""));
    const char *pts = strstr(poly, "points=\"");
    assert_non_null(pts);
    int commas = 0; /* one per point: points="x,y x,y ..." */
    for (pts += 8; *pts && *pts != '"'; pts++) commas += *pts == ',';
    assert_int_equal(commas, points);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "xmllint --noout %s", path);
    if (system("command -v xmllint >/dev/null 2>&1") == 0) assert_int_equal(system(cmd), 0);
}

/* The picture answers "did it learn, and by how much": the last validation loss and the
 * baseline are at least a sixth of the main panel (330 px) apart, and the line under the
 * title gives the gap in percent, from the last epoch row of the metrics (the numbers the
 * picture is drawn from). */
static void check_gap(const char *path, const char *csv) {
    FILE *f = fopen(csv, "r");
    if (!f) fail_msg("no metrics %s", csv);
    char row[512];
    double val = NAN, base = NAN, loss;
    long long e, nb, st;
    while (fgets(row, sizeof row, f)) sscanf(row, "epoch,%lld,%lld,%lld,%lf,%lf,%lf", &e, &nb, &st, &loss, &val, &base);
    fclose(f);
    assert_true(isfinite(val) && base > 0);
    f = fopen(path, "rb");
    if (!f) fail_msg("no picture %s", path);
    static char svg[1 << 20];
    svg[fread(svg, 1, sizeof svg - 1, f)] = 0;
    fclose(f);
    const char *b = strstr(svg, "<line class=\"baseline\""), *v = NULL;
    for (const char *p = svg; (p = strstr(p, "<rect class=\"val\"")) != NULL; p++) v = p;
    double yb = 0, yv = 0;
    assert_true(b && v);
    assert_int_equal(sscanf(strstr(b, "y1=\""), "y1=\"%lf", &yb), 1);
    assert_int_equal(sscanf(strstr(v, " y=\""), " y=\"%lf", &yv), 1);
    yv += 4.5; /* the marker's centre */
    printf("picture: baseline at y=%.1f, last validation loss at y=%.1f\n", yb, yv);
    if (!(fabs(yv - yb) >= 55)) fail_msg("the validation loss is %.1f px from the baseline", fabs(yv - yb));
    char want[128];
    double pct = 100 * (val - base) / base;
    snprintf(want, sizeof want, "%.1f%% %s the baseline", fabs(pct), pct < 0 ? "below" : "above");
    if (!strstr(svg, want)) fail_msg("%s lacks '%s'", path, want);
}

static void test_trains_below_baseline(void **state) {
    (void)state;
    char cmd[512], line[1024];
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --epochs 2 --batch 32 "
             "--hidden 16 --head 32 --quiet --metrics %s/m.csv 2>&1", dir, dir, dir);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    int epochs;
    long long steps;
    double tl, vl, base, sps;
    if (sscanf(line, "summary: epochs=%d steps=%lld train_loss=%lf val_loss=%lf baseline_val_loss=%lf samples_per_s=%lf",
               &epochs, &steps, &tl, &vl, &base, &sps) != 6)
        fail_msg("no summary line: '%s'", line);
    printf("%s", line);
    assert_int_equal(epochs, 2);
    assert_true(steps > 10 && sps > 0 && isfinite(tl));
    assert_true(base > 0.5 && base < 2.0); /* targets are scaled to RMS 1 on the training period */
    if (!(vl < 0.97 * base)) fail_msg("val_loss %.4f is not clearly below the baseline %.4f", vl, base);
    char csv[128], svg[128];
    snprintf(csv, sizeof csv, "%s/m.csv", dir);
    snprintf(svg, sizeof svg, "%s/m.svg", dir); /* the default picture: next to the metrics */
    assert_int_equal(count_rows(csv, "kind,"), 1);
    assert_int_equal(count_rows(csv, "step,"), steps); /* one per batch; --accum 1: per step */
    assert_int_equal(count_rows(csv, "epoch,"), 2);
    check_svg(svg, (int)steps);
    check_gap(svg, csv);
}

/* examples/train_minimal.c, the smallest loop: below the baseline in 3 epochs on the same
 * data; --help on stdout with exit 0; a bad flag exits 2 with one error line. */
static void test_minimal_example(void **state) {
    (void)state;
    char cmd[512], line[1024];
    snprintf(cmd, sizeof cmd, "build/train_minimal --train %s/train.h5 --val %s/val.h5 --epochs 3 --hidden 16 2>&1",
             dir, dir);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    double vl, base;
    if (sscanf(line, "summary: val_loss=%lf baseline_val_loss=%lf", &vl, &base) != 2) fail_msg("no summary: '%s'", line);
    printf("%s", line);
    assert_true(base > 0.5 && base < 2.0);
    if (!(vl < 0.98 * base)) fail_msg("train_minimal: val_loss %.4f is not below the baseline %.4f", vl, base);
    assert_int_equal(run_cmd("build/train_minimal --help 2>/dev/null", "usage: train_minimal", line, sizeof line), 0);
    assert_true(line[0] != 0);
    assert_int_equal(run_cmd("build/train_minimal --epochs 2>&1", "error: --epochs needs a value", line, sizeof line), 2);
    assert_true(line[0] != 0);
    assert_int_equal(run_cmd("build/train_minimal --bogus 1 2>&1", "error: unknown flag '--bogus'", line, sizeof line), 2);
    assert_true(line[0] != 0);
    assert_int_equal(run_cmd("build/train_minimal --train /nonexistent.h5 2>&1", "error: /nonexistent.h5: cannot open",
                             line, sizeof line), 2); /* bad input exits 2, as in every tool */
    assert_true(line[0] != 0);
}

static void test_bad_flags_and_data(void **state) {
    (void)state;
    struct { const char *args, *want; } cases[] = {
        {"--bogus", "unknown"},
        {"--epochs 0", "--epochs '0': expected an integer in [1, 1000000]"},
        {"--epochs 1.5", "--epochs '1.5': expected an integer in [1, 1000000]"},
        {"--lr -1", "--lr '-1'"},
        {"--schedule linear", "expected constant, cosine or onecycle"},
        {"--loss l1", "expected mse or huber"},
        {"--precision f8", "expected f32, bf16 or f16"},
        {"--train /nonexistent.h5", "/nonexistent.h5"},
        {"--train /etc/hostname", "/etc/hostname"},
        {"--resume", "need --ckpt FILE"},
        {"--ckpt /nonexistent/dir/x.ckpt --resume", "/nonexistent/dir/x.ckpt"},
        {"--plot x.svg", "needs --metrics FILE"},
        {"--metrics /dev/null --plot /nonexistent/dir/p.svg", "--plot '/nonexistent/dir/p.svg': cannot write: No such"},
        {"--metrics /nonexistent/dir/m.csv", "--metrics '/nonexistent/dir/m.csv': cannot write: No such"},
        {"--export /nonexistent/dir/m.safetensors", "--export '/nonexistent/dir/m.safetensors.tmp': cannot write"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[512], line[1024];
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --quiet %s 2>&1 >/dev/null",
                 dir, dir, cases[i].args);
        int rc = run_cmd(cmd, "error: ", line, sizeof line);
        assert_int_equal(rc, 2);
        if (!strstr(line, cases[i].want)) fail_msg("'%s': got '%s', want '%s'", cases[i].args, line, cases[i].want);
    }
    /* an output that cannot be written is refused before anything else: no device or data line first */
    char cmd[512], line[1024];
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --metrics /nonexistent/dir/m.csv "
             "2>/dev/null", dir, dir);
    assert_int_equal(run_cmd(cmd, "", line, sizeof line), 2);
    if (line[0]) fail_msg("stdout before the refusal: '%s'", line);
}

static int files_equal(const char *a, const char *b) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

#define TINY "--batch 32 --hidden 16 --head 32 --quiet --epochs 2 --max-batches 12 --ckpt-every 3"

/* The metrics of two runs agree but for the timings (samples_per_s, device_bytes). */
static int metrics_equal(const char *a, const char *b) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cut -d, -f1-8 %s > %s.cut && cut -d, -f1-8 %s > %s.cut && cmp -s %s.cut %s.cut",
             a, a, b, b, a, b);
    return system(cmd) == 0;
}

/* kill -9 at a random moment (also inside checkpoint writes), then --resume: the final
 * checkpoint (weights, moments, step, loader position) equals an uninterrupted run's, byte
 * for byte, and so do the metrics (timings aside). A corrupt checkpoint and other options
 * are refused. */
static void test_kill_and_resume_bitwise(void **state) {
    (void)state;
    char cmd[1024], full[128], killed[128], line[1024];
    for (int trial = 0; trial < 2; trial++) {
        const char *carry = trial ? "--carry" : ""; /* trial 1: the carried hidden state too */
        snprintf(full, sizeof full, "%s/full%d.ckpt", dir, trial);
        snprintf(killed, sizeof killed, "%s/killed.ckpt", dir);
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " %s --ckpt %s "
                 "--metrics %s.csv", dir, dir, carry, full, full);
        assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
        snprintf(line, sizeof line, "%s.csv", full);
        assert_int_equal(count_rows(line, "step,"), 24); /* 2 epochs x --max-batches 12 */
        assert_int_equal(count_rows(line, "epoch,"), 2);
        remove(killed);
        snprintf(cmd, sizeof cmd, "exec build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " %s --ckpt %s "
                 "--metrics %s.csv >/dev/null", dir, dir, carry, killed, killed);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { execl("/bin/sh", "sh", "-c", cmd, (char *)NULL); _exit(127); }
        int ms = tu_int(150, 2500);
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        FILE *f = fopen(killed, "rb");
        const char *resume = f ? "--resume" : "";
        if (f) fclose(f);
        printf("trial %d: killed after %d ms, %s\n", trial, ms, f ? "resuming" : "no checkpoint yet: from scratch");
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " %s --ckpt %s "
                 "--metrics %s.csv %s 2>&1", dir, dir, carry, killed, killed, resume);
        int rc = run_cmd(cmd, "summary:", line, sizeof line);
        if (rc != 0) fail_msg("resume failed (exit %d): %s", rc, line);
        assert_true(files_equal(full, killed));
        char a[160], b[160];
        snprintf(a, sizeof a, "%s.csv", full);
        snprintf(b, sizeof b, "%s.csv", killed);
        if (!metrics_equal(a, b)) fail_msg("the resumed run's metrics %s differ from %s", b, a);
    }
    /* a flipped byte: refused with a clear error */
    snprintf(cmd, sizeof cmd, "cp %s %s && printf 'X' | dd of=%s bs=1 seek=200 conv=notrunc 2>/dev/null", full, killed, killed);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " --ckpt %s --resume 2>&1",
             dir, dir, killed);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    assert_non_null(strstr(line, "killed.ckpt"));
    /* other options: refused */
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " --hidden 8 --ckpt %s --resume 2>&1",
             dir, dir, full);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    assert_non_null(strstr(line, "other model or training options"));
}

/* Mixed precision: bf16 and f16 (with the loss scaler) train below the baseline, and an f16
 * run resumed from its epoch-1 checkpoint (scaler state included) ends bitwise equal to
 * an uninterrupted one. */
static void test_mixed_precision(void **state) {
    (void)state;
    const char *precs[] = {"bf16", "f16"};
    for (int i = 0; i < 2; i++) {
        char cmd[1024], line[1024], full[128], part[128];
        snprintf(full, sizeof full, "%s/%s-full.ckpt", dir, precs[i]);
        snprintf(part, sizeof part, "%s/%s-part.ckpt", dir, precs[i]);
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " --precision %s "
                 "--schedule constant --warmup 0 --ckpt %s 2>&1", dir, dir, precs[i], full);
        assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
        double vl, base;
        const char *v = strstr(line, "val_loss="), *b = strstr(line, "baseline_val_loss=");
        if (!v || !b || sscanf(v, "val_loss=%lf", &vl) != 1 || sscanf(b, "baseline_val_loss=%lf", &base) != 1)
            fail_msg("no summary line: '%s'", line);
        printf("%s: %s", precs[i], line);
        if (!(vl < base)) fail_msg("%s: val_loss %.4f not below the baseline %.4f", precs[i], vl, base);
        /* epoch 1 alone, then resumed for epoch 2 (a constant schedule: its length does not matter) */
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY " --precision %s "
                 "--schedule constant --warmup 0 --ckpt %s --epochs 1 2>&1 && build/train_multitf --train %s/train.h5 "
                 "--val %s/val.h5 " TINY " --precision %s --schedule constant --warmup 0 --ckpt %s --resume 2>&1",
                 dir, dir, precs[i], part, dir, dir, precs[i], part);
        assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
        assert_true(files_equal(full, part));
    }
}

/* A checkpoint inside an accumulation window (--accum 5 over epochs of 12 batches: epoch 1 ends
 * 2 micro-batches into its third window) keeps the gradients summed so far, so a run resumed
 * there ends bitwise equal to an uninterrupted one (f16 with --carry: the scaler and the carried
 * state too; --ckpt-every 3 is ignored inside windows). The same checkpoint without its
 * "grads" section (as an older build wrote it) is refused with a clear error. */
static void test_resume_mid_window(void **state) {
    (void)state;
    char cmd[1400], line[1024], full[128], part[128], old[128];
    const char *opts = TINY " --accum 5 --precision f16 --carry --schedule constant --warmup 0";
    snprintf(full, sizeof full, "%s/mid-full.ckpt", dir);
    snprintf(part, sizeof part, "%s/mid-part.ckpt", dir);
    snprintf(old, sizeof old, "%s/mid-old.ckpt", dir);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --ckpt %s --metrics %s.csv 2>&1",
             dir, dir, opts, full, full);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --ckpt %s --metrics %s.csv "
             "--epochs 1 2>&1", dir, dir, opts, part, part);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    /* the epoch-1 checkpoint, copied without "grads" (every other section as it is) */
    mb_ckpt_reader *r;
    mb_ckpt_writer *w;
    tu_ok(mb_ckpt_open(&r, NULL, part));
    assert_true(mb_ckpt_has(r, "grads", NULL));
    tu_ok(mb_ckpt_writer_create(&w, NULL));
    const char *names[] = {"params.layout", "params", "adamw.m", "adamw.v", "adamw.steps", "scaler", "run", "options"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        size_t n = 0;
        assert_true(mb_ckpt_has(r, names[i], &n));
        void *buf = malloc(n ? n : 1);
        assert_non_null(buf);
        tu_ok(mb_ckpt_get(r, names[i], buf, n));
        tu_ok(mb_ckpt_add(w, names[i], buf, n));
        free(buf);
    }
    mb_ckpt_close(r);
    tu_ok(mb_ckpt_write(w, old));
    mb_ckpt_writer_destroy(w);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --ckpt %s --resume 2>&1",
             dir, dir, opts, old);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    if (!strstr(line, "inside an accumulation window without its gradients")) fail_msg("got '%s'", line);
    /* the real one resumes bitwise */
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --ckpt %s --metrics %s.csv "
             "--resume 2>&1", dir, dir, opts, part, part);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    assert_true(files_equal(full, part));
    char a[160], b[160];
    snprintf(a, sizeof a, "%s.csv", full);
    snprintf(b, sizeof b, "%s.csv", part);
    if (!metrics_equal(a, b)) fail_msg("the resumed run's metrics %s differ from %s", b, a);
}

/* --no-ftz: the device keeps denormals (its line says so), and the setting is part of a
 * checkpoint's options: a resume that changes it is refused. */
static void test_no_ftz(void **state) {
    (void)state;
    char cmd[1024], line[1024], ck[128];
    snprintf(ck, sizeof ck, "%s/ftz.ckpt", dir);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --batch 32 --hidden 8 --head 16 "
             "--epochs 1 --max-batches 2 --no-ftz --ckpt %s 2>&1", dir, dir, ck);
    assert_int_equal(run_cmd(cmd, "device:", line, sizeof line), 0);
    if (!strstr(line, "denormals kept")) fail_msg("--no-ftz: device line '%s'", line);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --batch 32 --hidden 8 --head 16 "
             "--epochs 2 --max-batches 2 --ckpt %s --resume 2>&1", dir, dir, ck);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    assert_non_null(strstr(line, "other model or training options"));
}

/* The picture's edge cases: one epoch of few batches; then a hand-made metrics file (NaN
 * and Inf losses, all values equal, rows after the checkpoint, a line cut short) kept by
 * --resume of a finished run as far as the checkpoint covers it, and drawn. */
static void test_plot_edge_cases(void **state) {
    (void)state;
    char cmd[1024], csv[128], svg[128], line[1024];
    snprintf(csv, sizeof csv, "%s/edge.csv", dir);
    snprintf(svg, sizeof svg, "%s/edge.svg", dir);
    const char *base = "build/train_multitf --train %s/train.h5 --val %s/val.h5 --batch 32 --hidden 16 --head 32 "
                       "--quiet --epochs 1 --max-batches 3 --ckpt %s/edge.ckpt --metrics %s --plot %s %s 2>&1";
    snprintf(cmd, sizeof cmd, base, dir, dir, dir, csv, svg, "");
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    assert_int_equal(count_rows(csv, "step,"), 3);
    assert_int_equal(count_rows(csv, "epoch,"), 1);
    check_svg(svg, 3);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("kind,epoch,batch,step,loss,val_loss,baseline_val_loss,lr,samples_per_s,device_bytes\n"
          "step,1,1,1,0.5,,,0.002,10.0,\nstep,1,2,2,nan,,,0.002,10.0,\nstep,1,3,3,inf,,,0.002,10.0,\n"
          "epoch,1,3,3,0.5,0.5,0.5,,10.0,0\nstep,2,4,4,0.7,,,0.002,10.0,\nepoch,2,4,4,0.7,0.7,0.7,,10.0,0\n"
          "step,2,5,5,0.", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, base, dir, dir, dir, csv, svg, "--resume"); /* nothing left to train */
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    assert_int_equal(count_rows(csv, "step,"), 3); /* rows after the checkpoint: dropped */
    assert_int_equal(count_rows(csv, "epoch,"), 1);
    check_svg(svg, 1); /* NaN and Inf left out */
}

/* Hostile files (tests/fuzz/regress: each crashes, hangs or overflows inside HDF5): the
 * trainer probes every file it opens in a child, so each run as --train (and the crashers
 * as --val) ends in exit 2 and one `error:` line naming the file; none crashes or hangs
 * (each run is bounded by timeout -s KILL: a hang would show as a signal). */
static void test_hostile_files(void **state) {
    (void)state;
    DIR *d = opendir("tests/fuzz/regress");
    if (!d) skip();
    int ran = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strstr(e->d_name, ".h5")) continue;
        for (int as_val = 0; as_val < (strstr(e->d_name, "segv") ? 2 : 1); as_val++) {
            char cmd[1024], line[1024], file[512];
            snprintf(file, sizeof file, "tests/fuzz/regress/%s", e->d_name);
            snprintf(cmd, sizeof cmd, "timeout -s KILL 60 build/train_multitf --train %s/%s --val %s/%s --quiet --epochs 1 "
                     "2>&1 >/dev/null", as_val ? dir : "tests/fuzz/regress", as_val ? "train.h5" : e->d_name,
                     as_val ? "tests/fuzz/regress" : dir, as_val ? e->d_name : "val.h5");
            FILE *p = popen(cmd, "r");
            assert_non_null(p);
            int lines = 0;
            line[0] = 0;
            while (fgets(cmd, sizeof cmd, p)) if (lines++ == 0) snprintf(line, sizeof line, "%s", cmd);
            int st = pclose(p);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
                fail_msg("%s (%s): %s %d, output '%s'", file, as_val ? "--val" : "--train",
                         WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), line);
            if (lines != 1 || strncmp(line, "error: ", 7) || !strstr(line, e->d_name))
                fail_msg("%s: %d lines, first '%s'", file, lines, line);
            ran++;
        }
    }
    closedir(d);
    printf("%d runs on hostile files, each a clean error\n", ran);
    assert_true(ran >= 12);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trains_below_baseline),
        cmocka_unit_test(test_minimal_example),
        cmocka_unit_test(test_bad_flags_and_data),
        cmocka_unit_test(test_kill_and_resume_bitwise),
        cmocka_unit_test(test_mixed_precision),
        cmocka_unit_test(test_resume_mid_window),
        cmocka_unit_test(test_no_ftz),
        cmocka_unit_test(test_plot_edge_cases),
        cmocka_unit_test(test_hostile_files),
    };
    return cmocka_run_group_tests_name("train_multitf", tests, make_data, remove_data);
}
