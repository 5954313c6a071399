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
    assert_int_equal(run_cmd("build/train_minimal --train /nonexistent.h5 2>&1", "error: cannot open '/nonexistent.h5'",
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
        {"--cpu-kernel sse", "expected auto, avx512, avx2 or c"},
        {"--train /nonexistent.h5", "/nonexistent.h5"},
        {"--train /etc/hostname", "/etc/hostname"},
        {"--resume", "need --ckpt FILE"},
        {"--ckpt /nonexistent/dir/x.ckpt --resume", "/nonexistent/dir/x.ckpt"},
        {"--plot x.svg", "needs --metrics FILE"},
        {"--metrics /dev/null --plot /nonexistent/dir/p.svg", "--plot '/nonexistent/dir/p.svg': its directory '/nonexistent' does not exist"},
        {"--metrics /nonexistent/dir/m.csv", "--metrics '/nonexistent/dir/m.csv': its directory '/nonexistent' does not exist"},
        {"--export /nonexistent/dir/m.safetensors", "--export '/nonexistent/dir/m.safetensors': its directory '/nonexistent' does not exist"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[1024], line[1024];
        char tr[256] = "", va[256] = ""; /* a flag is given once: the case's --train replaces the default */
        if (!strstr(cases[i].args, "--train ")) snprintf(tr, sizeof tr, "--train %s/train.h5", dir);
        if (!strstr(cases[i].args, "--val ")) snprintf(va, sizeof va, "--val %s/val.h5", dir);
        snprintf(cmd, sizeof cmd, "build/train_multitf %s %s --quiet %s 2>&1 >/dev/null", tr, va, cases[i].args);
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

/* a flag is given once (a repeated flag is refused): TINY_NE without --epochs, TINY_H8 --hidden 8 */
#define TINY_NE "--batch 32 --hidden 16 --head 32 --quiet --max-batches 12 --ckpt-every 3"
#define TINY TINY_NE " --epochs 2"
#define TINY_H8 "--batch 32 --hidden 8 --head 32 --quiet --epochs 2 --max-batches 12 --ckpt-every 3"

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
    /* other options: refused, naming the one that differs (full: trial 1's, with --carry) */
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY_H8 " --carry --ckpt %s "
             "--resume 2>&1", dir, dir, full);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    if (!strstr(line, "was written with other options: hidden is 16 in the checkpoint but 8 here\n")) fail_msg("got '%s'", line);
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
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 " TINY_NE " --precision %s "
                 "--schedule constant --warmup 0 --ckpt %s --epochs 1 2>&1 && build/train_multitf --train %s/train.h5 "
                 "--val %s/val.h5 " TINY " --precision %s --schedule constant --warmup 0 --ckpt %s --resume 2>&1",
                 dir, dir, precs[i], part, dir, dir, precs[i], part);
        assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
        assert_true(files_equal(full, part));
    }
}

/* Checkpoint `from` copied to `to`: its sections `names` (each must be there) as they are,
 * then, when extra is not NULL, section `extra` of n bytes. */
static void copy_checkpoint(const char *from, const char *to, const char *const *names, size_t count, const char *extra,
                            const void *bytes, size_t n) {
    mb_ckpt_reader *r;
    mb_ckpt_writer *w;
    tu_ok(mb_ckpt_open(&r, NULL, from));
    tu_ok(mb_ckpt_writer_create(&w, NULL));
    for (size_t i = 0; i < count; i++) {
        size_t k = 0;
        assert_true(mb_ckpt_has(r, names[i], &k));
        void *buf = malloc(k ? k : 1);
        assert_non_null(buf);
        tu_ok(mb_ckpt_get(r, names[i], buf, k));
        tu_ok(mb_ckpt_add(w, names[i], buf, k));
        free(buf);
    }
    mb_ckpt_close(r);
    if (extra) tu_ok(mb_ckpt_add(w, extra, bytes, n));
    tu_ok(mb_ckpt_write(w, to));
    mb_ckpt_writer_destroy(w);
}

/* A checkpoint inside an accumulation window (--accum 5 over epochs of 12 batches: epoch 1 ends
 * 2 micro-batches into its third window) keeps the gradients summed so far, so a run resumed
 * there ends bitwise equal to an uninterrupted one (f16 with --carry: the scaler and the carried
 * state too; --ckpt-every 3 is ignored inside windows). The same checkpoint without its
 * "grads" section (as an older build wrote it) is refused with a clear error. */
static void test_resume_mid_window(void **state) {
    (void)state;
    char cmd[1400], line[1024], full[128], part[128], old[128];
    const char *opts = TINY_NE " --accum 5 --precision f16 --carry --schedule constant --warmup 0";
    snprintf(full, sizeof full, "%s/mid-full.ckpt", dir);
    snprintf(part, sizeof part, "%s/mid-part.ckpt", dir);
    snprintf(old, sizeof old, "%s/mid-old.ckpt", dir);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --epochs 2 --ckpt %s "
             "--metrics %s.csv 2>&1", dir, dir, opts, full, full);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --ckpt %s --metrics %s.csv "
             "--epochs 1 2>&1", dir, dir, opts, part, part);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    /* the epoch-1 checkpoint, copied without "grads" (every other section as it is) */
    mb_ckpt_reader *r;
    tu_ok(mb_ckpt_open(&r, NULL, part));
    assert_true(mb_ckpt_has(r, "grads", NULL));
    mb_ckpt_close(r);
    static const char *const names[] = {"params.layout", "params", "adamw.m", "adamw.v", "adamw.steps", "scaler", "run",
                                        "options.key"};
    copy_checkpoint(part, old, names, sizeof names / sizeof *names, NULL, NULL, 0);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --epochs 2 --ckpt %s --resume 2>&1",
             dir, dir, opts, old);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    if (!strstr(line, "inside an accumulation window without its gradients")) fail_msg("got '%s'", line);
    /* the real one resumes bitwise */
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 %s --epochs 2 --ckpt %s "
             "--metrics %s.csv --resume 2>&1", dir, dir, opts, part, part);
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
    if (!strstr(line, "other options: no-ftz is 1 in the checkpoint but 0 here")) fail_msg("got '%s'", line);
}

/* The options of tests/golden/multitf_v1.ckpt (tests/golden/make_multitf_v1_ckpt.sh), each
 * with another value: what a resume with it must say. */
static const struct { const char *flag, *value, *other, *said; } v1_opts[] = {
    {"--layers", "1", "2", "layers is 1 in the checkpoint but 2 here"},
    {"--accum", "1", "2", "accum is 1 in the checkpoint but 2 here"},
    {"--checkpoint-k", "2", "3", "checkpoint-k is 2 in the checkpoint but 3 here"},
    {"--batch", "4", "5", "batch is 4 in the checkpoint but 5 here"},
    {"--hidden", "2", "3", "hidden is 2 in the checkpoint but 3 here"},
    {"--head", "3", "4", "head is 3 in the checkpoint but 4 here"},
    {"--max-batches", "2", "3", "max-batches is 2 in the checkpoint but 3 here"},
    {"--lr", "0.003", "0.004", "lr is 0.00300000003 in the checkpoint but 0.00400000019 here"},
    {"--clip", "0.5", "0.25", "clip is 0.5 in the checkpoint but 0.25 here"},
    {"--weight-decay", "0.02", "0.01", "weight-decay is 0.0199999996 in the checkpoint but 0.00999999978 here"},
    {"--chunk-fraction", "0.5", "0.25", "chunk-fraction is 0.5 in the checkpoint but 0.25 here"},
    {"--warmup", "3", "4", "warmup is 3 in the checkpoint but 4 here"},
    {"--schedule", "constant", "cosine", "schedule is 0 in the checkpoint but 1 here"},
    {"--loss", "mse", "huber", "loss is 0 in the checkpoint but 1 here"},
    {"--precision", "f32", "bf16", "precision is 0 in the checkpoint but 1 here"},
    {"--seed", "7", "8", "seed is 7 in the checkpoint but 8 here"},
    {"--carry", NULL, "", "carry is 0 in the checkpoint but 1 here"},
    {"--no-ftz", "", NULL, "no-ftz is 1 in the checkpoint but 0 here"}}; /* value NULL: flag absent */
enum { V1_OPTS = sizeof v1_opts / sizeof *v1_opts };
/* Its sections but the options (f32: no scaler; saved at an epoch's end: no gradients). */
static const char *const v1_sections[] = {"params.layout", "params", "adamw.m", "adamw.v", "adamw.steps", "run"};
enum { V1_SECTIONS = sizeof v1_sections / sizeof *v1_sections };

/* The command line of v1_opts, option `change` (-1: none) with its other value. */
static void v1_flags(int change, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < V1_OPTS; i++) {
        const char *v = i == change ? v1_opts[i].other : v1_opts[i].value;
        if (v) n += (size_t)snprintf(buf + n, cap - n, " %s %s", v1_opts[i].flag, v);
    }
}

/* Resume `ckpt` with every option of v1_opts changed in turn: each refused naming it and its
 * two values; the file is untouched. */
static void v1_each_refused(const char *ckpt) {
    char cmd[1400], flags[600], line[1024];
    size_t before = 0, after = 0;
    unsigned char *a = tu_slurp(ckpt, &before), *b;
    for (int i = 0; i < V1_OPTS; i++) {
        v1_flags(i, flags, sizeof flags);
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --quiet --epochs 2%s "
                 "--ckpt %s --resume 2>&1", dir, dir, flags, ckpt);
        assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
        if (!strstr(line, "was written with other options: ") || !strstr(line, v1_opts[i].said))
            fail_msg("%s %s: got '%s', want '%s'", v1_opts[i].flag, v1_opts[i].other, line, v1_opts[i].said);
    }
    b = tu_slurp(ckpt, &after);
    assert_true(before == after && memcmp(a, b, before) == 0);
    free(a);
    free(b);
}

/* A checkpoint of the older format (tests/golden/multitf_v1.ckpt, written by 57aff6f: its
 * options the raw bytes of the options struct) resumes, its options read by name through the
 * frozen layout; with any option changed it is refused naming the option and both values
 * (no-ftz too, which lay in the struct's former padding); one whose bytes cannot be read
 * unambiguously (another size, a non-zero byte outside the options) is refused saying it is
 * of an older format and what to do. The resumed run's checkpoint holds the named key, which
 * refuses the same changes; a damaged key text is refused. */
static void test_old_format_checkpoint(void **state) {
    (void)state;
    char cmd[1400], flags[600], line[1024], v1[128], bad[128], resumed[128];
    snprintf(v1, sizeof v1, "%s/v1.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/v1-bad.ckpt", dir);
    snprintf(resumed, sizeof resumed, "%s/v1-resumed.ckpt", dir);
    size_t n = 0;
    unsigned char *file = tu_slurp("tests/golden/multitf_v1.ckpt", &n);
    FILE *f = fopen(v1, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(file, 1, n, f), n);
    fclose(f);
    free(file);
    mb_ckpt_reader *r;
    unsigned char opts[184];
    tu_ok(mb_ckpt_open(&r, NULL, v1));
    assert_false(mb_ckpt_has(r, "options.key", NULL));
    tu_ok(mb_ckpt_get(r, "options", opts, 176)); /* the old format */
    mb_ckpt_close(r);
    v1_each_refused(v1);
    /* bytes that cannot be read unambiguously */
    memset(opts + 176, 0, 8);
    for (int k = 0; k < 4; k++) {
        unsigned char o[184];
        memcpy(o, opts, sizeof o);
        size_t len = k == 0 ? 184 : k == 1 ? 168 : 176;
        if (k == 2) o[0] = 0x40; /* a path's pointer */
        if (k == 3) o[56] = 3;   /* --epochs, which the old key held as zero */
        copy_checkpoint(v1, bad, v1_sections, V1_SECTIONS, "options", o, len);
        v1_flags(-1, flags, sizeof flags);
        snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --quiet --epochs 2%s "
                 "--ckpt %s --resume 2>&1", dir, dir, flags, bad);
        assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
        if (!strstr(line, "is a checkpoint of an older format") || !strstr(line, "resume it with the build that wrote it, "
            "or start again without --resume") || !strstr(line, k < 2 ? "bytes, not the 176" : "non-zero byte at"))
            fail_msg("case %d: got '%s'", k, line);
    }
    copy_checkpoint(v1, bad, v1_sections, V1_SECTIONS, NULL, NULL, 0);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    if (!strstr(line, "holds no training options")) fail_msg("no options: got '%s'", line);
    /* the real one resumes: epoch 2 from its step 2, and the new file holds the named key */
    v1_flags(-1, flags, sizeof flags);
    snprintf(cmd, sizeof cmd, "cp %s %s && build/train_multitf --train %s/train.h5 --val %s/val.h5 --quiet --epochs 2%s "
             "--ckpt %s --resume 2>&1", v1, resumed, dir, dir, flags, resumed);
    assert_int_equal(run_cmd(cmd, "summary:", line, sizeof line), 0);
    if (!strstr(line, "epochs=2 steps=4 ")) fail_msg("resumed: '%s'", line);
    int64_t steps = 0;
    size_t kb = 0;
    char key[1024];
    tu_ok(mb_ckpt_open(&r, NULL, resumed));
    assert_false(mb_ckpt_has(r, "options", NULL));
    assert_true(mb_ckpt_has(r, "options.key", &kb) && kb < sizeof key);
    tu_ok(mb_ckpt_get(r, "options.key", key, kb));
    tu_ok(mb_ckpt_get(r, "adamw.steps", &steps, sizeof steps));
    mb_ckpt_close(r);
    key[kb] = 0;
    assert_int_equal(steps, 4);
    assert_string_equal(key, "layers=1\naccum=1\ncarry=0\ncheckpoint-k=2\nbatch=4\nhidden=2\nhead=3\nmax-batches=2\n"
                        "lr=0.00300000003\nclip=0.5\nweight-decay=0.0199999996\nchunk-fraction=0.5\nwarmup=3\n"
                        "schedule=0\nloss=0\nprecision=0\nseed=7\nworld=1\nno-ftz=1\nema=0\nswa-start=0\nkeep-best=0\n"
                        "patience=0\ndropout=0\n"); /* the entries added since: their values before */
    v1_each_refused(resumed);
    /* the key text cut inside a line: refused as damaged */
    size_t cut = kb / 2 + (key[kb / 2 - 1] == '\n');
    key[cut] = 0;
    copy_checkpoint(resumed, bad, v1_sections, V1_SECTIONS, "options.key", key, strlen(key));
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s/train.h5 --val %s/val.h5 --quiet --epochs 2%s "
             "--ckpt %s --resume 2>&1", dir, dir, flags, bad);
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    if (!strstr(line, "key section 'options.key' is cut short")) fail_msg("cut key: got '%s'", line);
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
        cmocka_unit_test(test_old_format_checkpoint),
        cmocka_unit_test(test_plot_edge_cases),
        cmocka_unit_test(test_hostile_files),
    };
    return cmocka_run_group_tests_name("train_multitf", tests, make_data, remove_data);
}
