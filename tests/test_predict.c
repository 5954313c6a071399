/* build/predict and train_multitf's --export/--init end to end (run from the repository
 * root, as `make test` does): predict's CSV equals the model's forward in this process,
 * --init starts from the file's weights, predict --to-onnx writes the bytes of
 * train_multitf --export-onnx (and refuses a file without segment lengths), bad model files
 * and mismatched data exit 2 with one `error:` line, and (optional: skipped without python3
 * + torch + safetensors + h5py) the live PyTorch round trip of tests/export_roundtrip.sh.
 * (What the ONNX file computes: tests/onnx/run.sh, under onnxruntime.) */
#define _POSIX_C_SOURCE 200809L /* popen, mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/multitf.h"
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static const char *path_of(const char *name) { return tu_path(dir, name); }

/* Run a command; its exit code, and its last output line containing key (if line). */
static int run_cmd(const char *cmd, const char *key, char *line, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char buf[1024];
    if (line) line[0] = 0;
    while (fgets(buf, sizeof buf, p))
        if (line && strstr(buf, key)) snprintf(line, cap, "%s", buf);
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mb_predict_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "build/prepare --synthetic --bars 30000 --features 4 --stride 40 --quiet "
             "--out-train %s/train.h5 --out-val %s/val.h5 && build/train_multitf --train %s/train.h5 --val %s/val.h5 "
             "--epochs 1 --batch 16 --hidden 6 --head 8 --max-batches 4 --quiet --export %s/m.safetensors "
             "--export-onnx %s/m.onnx >/dev/null", dir, dir, dir, dir, dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The CSV's rows (after the header): n rows of k floats into *out (malloc'd). */
static int64_t read_csv(const char *path, int64_t k, float **out) {
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("no file %s", path);
    static char line[1 << 16];
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, "pred_1,", 7), 0);
    int64_t n = 0, cap = 1024;
    float *v = (float *)malloc((size_t)(cap * k) * sizeof(float));
    while (fgets(line, sizeof line, f)) {
        if (n == cap) v = (float *)realloc(v, (size_t)((cap *= 2) * k) * sizeof(float));
        char *p = line, *end;
        for (int64_t j = 0; j < k; j++, p = end + 1) {
            v[n * k + j] = strtof(p, &end);
            if (end == p || *end != (j + 1 < k ? ',' : '\n')) fail_msg("%s: bad row %lld", path, (long long)n);
        }
        n++;
    }
    fclose(f);
    *out = v;
    return n;
}

/* The model's predictions for every sample of an HDF5 file, in this process, batch B. */
static int64_t predict_here(const char *model, const char *data, int64_t B, float **out, int64_t *k) {
    mb_st_file *f = NULL;
    mtf_spec s;
    mb_device *dev = NULL;
    mb_dataset *ds = NULL;
    mtf_model m;
    assert_int_equal(mb_st_open(&f, model), MB_OK);
    assert_int_equal(mtf_spec_of(f, model, &s), MB_OK);
    assert_int_equal(mtf_device_open(&dev, MB_CPU, 0), MB_OK);
    assert_int_equal(mb_dataset_open_file(&ds, data, NULL), MB_OK);
    const mb_dataset_meta *dm = mb_dataset_info(ds);
    assert_int_equal(mtf_model_create(&m, dev, &s, B, 0), MB_OK);
    assert_int_equal(mtf_model_load(&m, f), MB_OK);
    float *x = tu_alloc_f32((size_t)(B * dm->t * dm->f)), *y = tu_alloc_f32((size_t)(B * dm->k));
    float *p = tu_alloc_f32((size_t)(dm->n * s.K));
    for (int64_t i = 0; i < dm->n; i += B) {
        int64_t b = dm->n - i < B ? dm->n - i : B;
        const float *pred = NULL;
        assert_int_equal(mb_dataset_read(ds, i, i + b, x, y, NULL), MB_OK);
        assert_int_equal(mtf_model_forward(&m, x, b, &pred), MB_OK);
        memcpy(p + i * s.K, pred, (size_t)(b * s.K) * sizeof(float));
    }
    *out = p;
    *k = s.K;
    int64_t n = dm->n;
    free(x); free(y);
    mtf_model_destroy(&m);
    mb_dataset_close(ds);
    mb_device_close(dev);
    mb_st_close(f);
    return n;
}

/* predict's CSV (the loader's batches of 32) is bitwise the forward of batches of 32 read
 * here; with --batch 1 it agrees within 1e-6 (another batch size may change BLAS's
 * blocking, hence the summation order, of the gemms). */
static void test_predict_csv_equals_forward(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "build/predict --model %s --data %s --out %s --batch 32 --quiet", path_of("m.safetensors"),
             path_of("val.h5"), path_of("p32.csv"));
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "build/predict --model %s --data %s --out %s --batch 1 --quiet", path_of("m.safetensors"),
             path_of("val.h5"), path_of("p1.csv"));
    assert_int_equal(system(cmd), 0);
    float *want, *got32, *got1;
    int64_t k, n = predict_here(path_of("m.safetensors"), path_of("val.h5"), 32, &want, &k);
    assert_true(n > 10);
    assert_int_equal(read_csv(path_of("p32.csv"), k, &got32), n);
    assert_int_equal(read_csv(path_of("p1.csv"), k, &got1), n);
    assert_int_equal(memcmp(got32, want, (size_t)(n * k) * sizeof(float)), 0);
    double e = tu_assert_close(got1, want, (size_t)(n * k), 1e-6, 0, "batch 1 vs 32");
    printf("%lld samples x %lld: batch 32 bitwise; batch 1 within %.3g\n", (long long)n, (long long)k, e);
    free(want); free(got32); free(got1);
}

static double max_tensor_diff(const char *a, const char *b) {
    mb_st_file *fa = NULL, *fb = NULL;
    assert_int_equal(mb_st_open(&fa, a), MB_OK);
    assert_int_equal(mb_st_open(&fb, b), MB_OK);
    assert_int_equal(mb_st_count(fa), mb_st_count(fb));
    double worst = 0;
    for (int i = 0; i < mb_st_count(fa); i++) {
        const mb_st_tensor *ta = mb_st_at(fa, i), *tb = mb_st_find(fb, ta->name);
        assert_non_null(tb);
        assert_int_equal(ta->count, tb->count);
        for (size_t j = 0; j < ta->count; j++)
            worst = fmax(worst, fabs((double)((const float *)ta->data)[j] - ((const float *)tb->data)[j]));
    }
    mb_st_close(fa);
    mb_st_close(fb);
    return worst;
}

/* --init starts from the file: one step at lr 1e-9 keeps the weights within 1e-6 of it;
 * without --init (another seed's init) they are far from it. */
static void test_init_starts_from_file(void **state) {
    (void)state;
    char cmd[512];
    const char *common = "--epochs 1 --batch 16 --hidden 6 --head 8 --max-batches 1 --lr 1e-9 --warmup 0 --quiet";
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s --val %s %s --init %s --export %s >/dev/null",
             path_of("train.h5"), path_of("val.h5"), common, path_of("m.safetensors"), path_of("i.safetensors"));
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "build/train_multitf --train %s --val %s %s --seed 5 --export %s >/dev/null",
             path_of("train.h5"), path_of("val.h5"), common, path_of("n.safetensors"));
    assert_int_equal(system(cmd), 0);
    double with = max_tensor_diff(path_of("m.safetensors"), path_of("i.safetensors"));
    double without = max_tensor_diff(path_of("m.safetensors"), path_of("n.safetensors"));
    printf("max |w - file|: with --init %.3g, without %.3g\n", with, without);
    assert_true(with < 1e-6);
    assert_true(without > 1e-2);
}

static int same_file(const char *a, const char *b) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

/* predict --to-onnx of the safetensors file = train_multitf --export-onnx, byte for byte
 * (and again over an existing file); a file without segment lengths (the ONNX input's
 * window) is refused with exit 2 and nothing written. */
static void test_to_onnx(void **state) {
    (void)state;
    char cmd[512], line[1024];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "build/predict --model %s --to-onnx %s", path_of("m.safetensors"), path_of("p.onnx"));
        assert_int_equal(run_cmd(cmd, "onnx: ", line, sizeof line), 0);
        assert_non_null(strstr(line, "p.onnx"));
        assert_true(same_file(path_of("m.onnx"), path_of("p.onnx")));
        assert_int_equal(access(path_of("p.onnx.tmp"), F_OK), -1);
    }
    mb_st_file *f = NULL; /* the golden model's weights without its metadata */
    mtf_spec s;
    mb_device *dev = NULL;
    mtf_model m;
    assert_int_equal(mb_st_open(&f, "tests/golden/multitf_torch.safetensors"), MB_OK);
    assert_int_equal(mtf_spec_of(f, "golden", &s), MB_OK);
    assert_int_equal(mtf_device_open(&dev, MB_CPU, 1), MB_OK);
    assert_int_equal(mtf_model_create(&m, dev, &s, 1, 0), MB_OK);
    assert_int_equal(mtf_model_load(&m, f), MB_OK);
    assert_int_equal(mb_st_save_params(path_of("bare.safetensors"), m.params, mtf_rename, NULL, 0), MB_OK);
    mtf_model_destroy(&m);
    mb_device_close(dev);
    mb_st_close(f);
    snprintf(cmd, sizeof cmd, "build/predict --model %s --to-onnx %s 2>&1", path_of("bare.safetensors"), path_of("b.onnx"));
    assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
    assert_non_null(strstr(line, "no segments metadata"));
    assert_int_equal(access(path_of("b.onnx"), F_OK), -1);
}

static void test_bad_files_exit_2(void **state) {
    (void)state;
    char cmd[1024], line[1024];
    snprintf(cmd, sizeof cmd, "head -c 300 %s > %s; printf 'xxxxxxxx' > %s", path_of("m.safetensors"),
             path_of("cut.safetensors"), path_of("junk.safetensors"));
    assert_int_equal(system(cmd), 0);
    struct { const char *prog, *args, *want; } cases[] = { /* @: the test's directory */
        {"predict", "--model @/cut.safetensors --data @/val.h5 --out @/x.csv", "does not fit"},
        {"predict", "--model @/junk.safetensors --data @/val.h5 --out @/x.csv", "exceeds the cap"},
        {"predict", "--model @/none.safetensors --data @/val.h5 --out @/x.csv", "cannot open"},
        {"predict", "--model tests/golden/multitf_torch.safetensors --data @/val.h5 --out @/x.csv", "F=4 K=36, the model"},
        {"predict", "--model @/m.safetensors --data @/val.h5 --out /nonexistent/x.csv",
         "--out '/nonexistent/x.csv': its directory '/nonexistent' does not exist"},
        {"predict", "--model @/m.safetensors --data @/none.h5 --out @/x.csv", "none.h5"},
        {"predict", "--model @/m.safetensors --data @/val.h5 --out @/x.csv --batch 0", "--batch"},
        {"predict", "--model @/m.safetensors", "--data and --out (or --metrics) are needed"},
        {"predict", "--model @/m.safetensors --to-onnx /nonexistent/x.onnx",
         "--to-onnx '/nonexistent/x.onnx': its directory '/nonexistent' does not exist"},
        {"predict", "--model @/m.safetensors --to-onnx @/x.onnx --data @/val.h5", "--to-onnx takes only --model"},
        {"predict", "--model @/cut.safetensors --to-onnx @/x.onnx", "does not fit"},
        {"train_multitf", "--train @/train.h5 --val @/val.h5 --hidden 7 --init @/m.safetensors",
         "'enc.0.weight_ih_l0' is F32 [24,4], the model needs F32 [28,4]"},
        {"train_multitf", "--train @/train.h5 --val @/val.h5 --init @/cut.safetensors", "does not fit"},
        {"train_multitf", "--train @/train.h5 --val @/val.h5 --hidden 6 --head 8 --export /nonexistent/x.st "
         "--metrics @/refused.csv", "--export '/nonexistent/x.st': its directory '/nonexistent' does not exist"},
        {"train_multitf", "--train @/train.h5 --val @/val.h5 --hidden 6 --head 8 --export-onnx /nonexistent/x.onnx "
         "--metrics @/refused.csv", "--export-onnx '/nonexistent/x.onnx': its directory '/nonexistent' does not exist"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        size_t k = 0;
        for (const char *p = cases[i].args; *p && k + sizeof dir < sizeof args; p++)
            k += (size_t)snprintf(args + k, sizeof args - k, *p == '@' ? "%s" : "%.1s", *p == '@' ? dir : p);
        if (!strcmp(cases[i].prog, "predict")) snprintf(cmd, sizeof cmd, "build/predict %s --quiet 2>&1 >/dev/null", args);
        else snprintf(cmd, sizeof cmd, "build/train_multitf %s --quiet --epochs 1 --max-batches 1 2>&1 >/dev/null", args);
        assert_int_equal(run_cmd(cmd, "error: ", line, sizeof line), 2);
        if (!strstr(line, cases[i].want)) fail_msg("%s: got '%s', want '%s'", cmd, line, cases[i].want);
    }
    assert_int_equal(access(path_of("refused.csv"), F_OK), -1); /* refused before training began */
}

static void test_torch_roundtrip(void **state) {
    (void)state;
    char cmd[256], line[1024];
    snprintf(cmd, sizeof cmd, "sh tests/export_roundtrip.sh %s 2>&1", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int ok = 0, skipped = 0;
    while (fgets(line, sizeof line, p)) {
        printf("  %s", line);
        ok |= strstr(line, "round trip ok") != NULL;
        skipped |= strncmp(line, "skipped:", 8) == 0;
    }
    int rc = pclose(p);
    if (skipped) skip();
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predict_csv_equals_forward),
        cmocka_unit_test(test_init_starts_from_file),
        cmocka_unit_test(test_to_onnx),
        cmocka_unit_test(test_bad_files_exit_2),
        cmocka_unit_test(test_torch_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
