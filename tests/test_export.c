/* The weights file (megabatch.h section "export", examples/multitf.h): safetensors written
 * and read back bit for bit, a PyTorch-written golden model predicting what torch
 * predicted, the params helpers' strictness, and bad files (truncated, huge or lying
 * headers, wrong shapes or dtypes, missing or extra names, bad JSON, random damage) each
 * refused with a clear error and nothing changed. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/multitf.h"
#include <unistd.h>

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mb_export_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}
static int remove_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}
static const char *path_of(const char *name) { return tu_path(dir, name); }

/* A safetensors image from a header text and n data bytes (0x11 ...). */
static unsigned char *image(const char *header, size_t data, size_t *n) {
    size_t h = strlen(header);
    unsigned char *b = (unsigned char *)malloc(8 + h + data + 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0x11, data);
    *n = 8 + h + data;
    return b;
}

/* ---- write and read back ---- */

static void test_write_read_roundtrip(void **state) {
    (void)state;
    float a[6], b[5], c = 3.5f;
    tu_fill(a, 6, -2, 2);
    tu_fill(b, 5, -2, 2);
    mb_st_tensor t[3];
    memset(t, 0, sizeof t);
    t[0].name = "layer.0.weight"; t[0].rank = 2; t[0].shape[0] = 2; t[0].shape[1] = 3; t[0].data = a;
    t[1].name = "bias \"q\"\\"; t[1].rank = 1; t[1].shape[0] = 5; t[1].data = b;
    t[2].name = "scalar"; t[2].rank = 0; t[2].data = &c;
    mb_st_meta meta[] = {{"plain", "1,2,3"}, {"odd \"key\"", "tab\there\nnewline \\ \x01 caf\xc3\xa9"}};
    assert_int_equal(mb_st_write(path_of("rt.safetensors"), t, 3, meta, 2), MB_OK);
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_open(&f, path_of("rt.safetensors")), MB_OK);
    assert_int_equal(mb_st_count(f), 3);
    const size_t counts[3] = {6, 5, 1};
    for (int i = 0; i < 3; i++) {
        const mb_st_tensor *g = mb_st_find(f, t[i].name);
        assert_non_null(g);
        assert_string_equal(g->dtype, "F32");
        assert_int_equal(g->rank, t[i].rank);
        for (int d = 0; d < g->rank; d++) assert_int_equal(g->shape[d], t[i].shape[d]);
        assert_int_equal(g->count, counts[i]); /* the length compared below is the written one */
        assert_int_equal(memcmp(g->data, t[i].data, g->count * 4), 0);
        assert_int_equal((uintptr_t)g->data % 4, 0);
    }
    assert_string_equal(mb_st_meta_get(f, "plain"), "1,2,3");
    assert_string_equal(mb_st_meta_get(f, "odd \"key\""), meta[1].value);
    assert_null(mb_st_meta_get(f, "absent"));
    assert_null(mb_st_find(f, "absent"));
    mb_st_close(f);
    size_t n;
    unsigned char *img = tu_slurp(path_of("rt.safetensors"), &n);
    assert_int_equal((n - 8 - (6 + 5 + 1) * 4) % 8, 0); /* header padded to 8 bytes */
    free(img);
    /* writer refusals */
    mb_st_tensor dup[2] = {t[0], t[0]};
    assert_int_equal(mb_st_write(path_of("x.safetensors"), dup, 2, NULL, 0), MB_ERR_INVALID_ARG);
    assert_non_null(strstr(mb_last_error(), "twice"));
    assert_int_equal(mb_st_write("/nonexistent/dir/x.safetensors", t, 1, NULL, 0), MB_ERR_IO);
    assert_int_equal(access("/nonexistent/dir/x.safetensors.tmp", F_OK), -1);
}

/* Escapes and unicode the writer does not produce, as other writers may. */
static void test_json_escapes(void **state) {
    (void)state;
    size_t n;
    unsigned char *b = image("{\"__metadata__\":{\"k\\u00e9\\ud83d\\ude00\":\"a\\/b\\u0041\"} ,\n"
                             "\"t\":{\"data_offsets\":[0,4], \"shape\":[],\"dtype\":\"I32\"}}", 4, &n);
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_parse(&f, b, n, "mem"), MB_OK);
    assert_string_equal(mb_st_meta_get(f, "k\xc3\xa9\xf0\x9f\x98\x80"), "a/bA");
    assert_string_equal(mb_st_at(f, 0)->dtype, "I32");
    mb_st_close(f);
    free(b);
}

/* ---- the golden file PyTorch wrote ---- */

static void test_golden_torch_predicts(void **state) {
    (void)state;
    mb_st_file *f = NULL, *io = NULL;
    assert_int_equal(mb_st_open(&f, "tests/golden/multitf_torch.safetensors"), MB_OK);
    assert_int_equal(mb_st_open(&io, "tests/golden/multitf_torch_io.safetensors"), MB_OK);
    mtf_spec s;
    assert_int_equal(mtf_spec_of(f, "golden", &s), MB_OK);
    assert_int_equal(s.nseg, 5);
    assert_int_equal(s.F, 3); assert_int_equal(s.K, 2); assert_int_equal(s.hidden_size, 4); assert_int_equal(s.head, 5);
    assert_int_equal(s.layers, 1); assert_int_equal(s.T, 16);
    const mb_st_tensor *x = mb_st_find(io, "x"), *pred = mb_st_find(io, "pred");
    assert_non_null(x); assert_non_null(pred);
    int64_t N = x->shape[0];
    mb_device *dev = NULL;
    assert_int_equal(mtf_device_open(&dev, MB_CPU, 1), MB_OK);
    mtf_model m;
    assert_int_equal(mtf_model_create(&m, dev, &s, N, 0), MB_OK);
    assert_int_equal(mtf_model_load(&m, f), MB_OK);
    const float *p = NULL;
    assert_int_equal(mtf_model_forward(&m, (const float *)x->data, N, &p), MB_OK);
    double err = tu_assert_close(p, (const float *)pred->data, (size_t)(N * s.K), 1e-5, 0, "golden pred");
    printf("golden torch model: max |C - torch| = %.3g over %lld predictions\n", err, (long long)(N * s.K));
    /* the same weights written back by us: the same tensors, bit for bit */
    assert_int_equal(mb_st_save_params(path_of("again.safetensors"), m.params, mtf_rename, NULL, 0), MB_OK);
    mb_st_file *g = NULL;
    assert_int_equal(mb_st_open(&g, path_of("again.safetensors")), MB_OK);
    assert_int_equal(mb_st_count(g), mb_st_count(f));
    for (int i = 0; i < mb_st_count(f); i++) {
        const mb_st_tensor *a = mb_st_at(f, i), *b = mb_st_find(g, a->name);
        assert_non_null(b);
        assert_int_equal(memcmp(a->data, b->data, a->count * 4), 0);
    }
    mb_st_close(g);
    mtf_model_destroy(&m);
    mb_device_close(dev);
    mb_st_close(f);
    mb_st_close(io);
}

/* ---- params: strict load, nothing changed on failure ---- */

typedef struct small { mb_device *dev; mb_params *p; mb_lstm *l; mb_linear fc; } small;

static void small_make(small *s, int64_t hidden, uint64_t seed) {
    memset(s, 0, sizeof *s);
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MB_CPU; dc.threads = 1;
    assert_int_equal(mb_device_open(&s->dev, &dc), MB_OK);
    assert_int_equal(mb_params_create(&s->p, s->dev), MB_OK);
    mb_lstm_config lc;
    memset(&lc, 0, sizeof lc);
    lc.input_size = 3; lc.hidden_size = hidden; lc.prefix = "enc0."; lc.max_steps = 4; lc.max_batch = 2;
    assert_int_equal(mb_lstm_create(&s->l, s->p, &lc), MB_OK);
    assert_int_equal(mb_linear_init(&s->fc, s->p, "head.fc1", hidden, 2), MB_OK);
    assert_int_equal(mb_params_finalize(s->p), MB_OK);
    assert_int_equal(mb_params_init(s->p, seed), MB_OK);
}
static void small_free(small *s) {
    mb_lstm_destroy(s->l);
    mb_params_destroy(s->p);
    mb_device_close(s->dev);
}

static void test_params_roundtrip_and_strict(void **state) {
    (void)state;
    small a, b, c;
    small_make(&a, 4, 1);
    small_make(&b, 4, 2);
    small_make(&c, 5, 3);
    size_t n = mb_params_total(a.p);
    float *ha = tu_alloc_f32(n), *hb = tu_alloc_f32(n);
    assert_int_equal(mb_st_save_params(path_of("p.safetensors"), a.p, mtf_rename, NULL, 0), MB_OK);
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_open(&f, path_of("p.safetensors")), MB_OK);
    assert_non_null(mb_st_find(f, "enc.0.weight_ih_l0")); /* PyTorch's names */
    assert_non_null(mb_st_find(f, "fc1.weight"));
    assert_int_equal(mb_st_load_params(f, b.p, mtf_rename), MB_OK);
    mb_params_get(a.p, ha);
    mb_params_get(b.p, hb);
    assert_int_equal(memcmp(ha, hb, n * 4), 0);
    /* another hidden size: refused naming the tensor and both shapes, c unchanged */
    size_t nc = mb_params_total(c.p);
    float *h0 = tu_alloc_f32(nc), *h1 = tu_alloc_f32(nc);
    mb_params_get(c.p, h0);
    assert_int_equal(mb_st_load_params(f, c.p, mtf_rename), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "[16,3]"));
    assert_non_null(strstr(mb_last_error(), "[20,3]"));
    mb_params_get(c.p, h1);
    assert_int_equal(memcmp(h0, h1, nc * 4), 0);
    /* without the renaming: our names are not the file's */
    assert_int_equal(mb_st_load_params(f, b.p, NULL), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "missing tensor 'enc0.weight_ih_l0'"));
    mb_st_close(f);
    free(ha); free(hb); free(h0); free(h1);
    small_free(&a); small_free(&b); small_free(&c);
}

/* A file from the params of `s` with one tensor changed by `edit`, then a strict load
 * into s must fail with `want` in the message and leave s as it was. */
static void expect_load_refused(small *s, void (*edit)(mb_st_tensor *t, int *n), const char *want) {
    size_t total = mb_params_total(s->p);
    float *h = tu_alloc_f32(total), *after = tu_alloc_f32(total);
    static float other[1024];
    mb_params_get(s->p, h);
    int n = mb_params_num_tensors(s->p);
    mb_st_tensor t[16];
    memset(t, 0, sizeof t);
    char names[16][MB_MAX_NAME];
    for (int i = 0; i < n; i++) {
        const mb_param_info *in = mb_params_info(s->p, i);
        memset(&t[i], 0, sizeof t[i]);
        int k = 0;
        while (mtf_rename[k] && strncmp(in->name, mtf_rename[k], strlen(mtf_rename[k]))) k += 2;
        snprintf(names[i], MB_MAX_NAME, "%s%s", mtf_rename[k + 1], in->name + strlen(mtf_rename[k]));
        t[i].name = names[i];
        t[i].rank = in->rank;
        for (int d = 0; d < in->rank; d++) t[i].shape[d] = in->shape[d];
        t[i].data = h + in->offset;
    }
    t[n].name = "extra"; t[n].rank = 1; t[n].shape[0] = 1; t[n].data = other;
    edit(t, &n);
    if (mb_st_write(path_of("bad.safetensors"), t, n, NULL, 0) != MB_OK) fail_msg("%s", mb_last_error());
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_open(&f, path_of("bad.safetensors")), MB_OK);
    assert_int_equal(mb_st_load_params(f, s->p, mtf_rename), MB_ERR_FORMAT);
    if (!strstr(mb_last_error(), want)) fail_msg("got '%s', want '%s'", mb_last_error(), want);
    mb_params_get(s->p, after);
    assert_int_equal(memcmp(h, after, total * 4), 0);
    mb_st_close(f);
    free(h); free(after);
}
static void edit_drop_first(mb_st_tensor *t, int *n) { t[0] = t[--*n]; }
static void edit_add_extra(mb_st_tensor *t, int *n) { (void)t; ++*n; }
static void edit_shape(mb_st_tensor *t, int *n) { (void)n; t[0].shape[0] /= 2; }
static void edit_rank(mb_st_tensor *t, int *n) { (void)n; t[0].shape[0] *= t[0].shape[1]; t[0].rank = 1; }

static void test_params_bad_files(void **state) {
    (void)state;
    small s;
    small_make(&s, 4, 7);
    expect_load_refused(&s, edit_drop_first, "missing tensor 'enc.0.weight_ih_l0'");
    expect_load_refused(&s, edit_add_extra, "unexpected tensor 'extra'");
    expect_load_refused(&s, edit_shape, "'enc.0.weight_ih_l0' is F32 [8,3], the model needs F32 [16,3]");
    expect_load_refused(&s, edit_rank, "[48]");
    /* a dtype other than F32 (a float64 state_dict) */
    size_t n;
    unsigned char *b = image("{\"enc.0.weight_ih_l0\":{\"dtype\":\"F64\",\"shape\":[16,3],\"data_offsets\":[0,384]}}",
                             384, &n);
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_parse(&f, b, n, "f64"), MB_OK);
    assert_int_equal(mb_st_load_params(f, s.p, mtf_rename), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "F64"));
    mb_st_close(f);
    free(b);
    small_free(&s);
}

/* ---- bad headers ---- */

static void expect_parse(const char *header, size_t data, mb_result want, const char *msg) {
    size_t n;
    unsigned char *b = image(header, data, &n);
    mb_st_file *f = (mb_st_file *)&n; /* must come back NULL */
    mb_result r = mb_st_parse(&f, b, n, "bad");
    if (r != want || (msg && !strstr(mb_last_error(), msg)))
        fail_msg("header %s: got %d '%s', want %d '%s'", header, (int)r, mb_last_error(), (int)want, msg ? msg : "");
    if (r != MB_OK) assert_null(f);
    mb_st_close(r == MB_OK ? f : NULL);
    free(b);
}

static void test_bad_headers(void **state) {
    (void)state;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    expect_parse(ok, 12, MB_OK, NULL);
    expect_parse(ok, 11, MB_ERR_FORMAT, "truncated");
    expect_parse(ok, 16, MB_ERR_FORMAT, "trailing bytes");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 12, MB_ERR_FORMAT, "overlap");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, MB_ERR_FORMAT, "a hole");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, MB_ERR_FORMAT, "needs 12");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, MB_ERR_FORMAT, "data_offsets");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", 8,
                 MB_ERR_OVERFLOW, "overflows");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8,
                 MB_ERR_OVERFLOW, "overflows");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, MB_ERR_FORMAT, "integer");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, MB_ERR_FORMAT, "integer");
    expect_parse("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, MB_ERR_FORMAT, "unknown dtype");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, MB_ERR_FORMAT, "missing");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, MB_ERR_FORMAT, "unknown");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, MB_ERR_FORMAT,
                 "repeated");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, MB_ERR_FORMAT,
                 "more than 8");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, MB_ERR_FORMAT, "twice");
    expect_parse("{\"__metadata__\":{\"k\":1}}", 0, MB_ERR_FORMAT, "'\"' expected");
    expect_parse("{\"__metadata__\":{},\"__metadata__\":{}}", 0, MB_ERR_FORMAT, "twice");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, MB_ERR_FORMAT, "after");
    expect_parse("{\"a\":{\"dtype\":\"F32", 4, MB_ERR_FORMAT, "unterminated");
    expect_parse("{\"a\\q\":{}}", 0, MB_ERR_FORMAT, "escape");
    expect_parse("{\"a\\ud800\":{}}", 0, MB_ERR_FORMAT, "surrogate");
    expect_parse("{\"a\\u0000\":{}}", 0, MB_ERR_FORMAT, "NUL");
    expect_parse("{\"a\x01\":{}}", 0, MB_ERR_FORMAT, "control");
    expect_parse("[]", 0, MB_ERR_FORMAT, "'{' expected");
    expect_parse("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, MB_ERR_FORMAT, "1..63 bytes");
    expect_parse("{}", 0, MB_OK, NULL);
    /* header length fields that lie */
    unsigned char b[16] = {0};
    mb_st_file *f = NULL;
    assert_int_equal(mb_st_parse(&f, b, 5, "short"), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "truncated"));
    b[7] = 0x7f; /* 2^63-ish */
    assert_int_equal(mb_st_parse(&f, b, 16, "huge"), MB_ERR_OVERFLOW);
    assert_non_null(strstr(mb_last_error(), "exceeds the cap"));
    memset(b, 0, 8);
    b[0] = 200; /* more than the file */
    assert_int_equal(mb_st_parse(&f, b, 16, "long"), MB_ERR_FORMAT);
    assert_non_null(strstr(mb_last_error(), "does not fit"));
    assert_null(f);
    assert_int_equal(mb_st_open(&f, "/nonexistent.safetensors"), MB_ERR_IO);
    assert_non_null(strstr(mb_last_error(), "mb_st_open: cannot open '/nonexistent.safetensors'"));
}

/* Every prefix of a real file is refused (a truncated download), and random byte damage
 * is refused or gives a file whose tensors all lie inside its data (never a crash; ASan
 * checks the reads in `make asan`). */
static void test_truncated_and_damaged(void **state) {
    (void)state;
    size_t n;
    unsigned char *img = tu_slurp("tests/golden/multitf_torch.safetensors", &n);
    mb_st_file *f = NULL;
    for (size_t k = 0; k < n; k++) {
        if (mb_st_parse(&f, img, k, "cut") == MB_OK) fail_msg("a file cut to %zu of %zu bytes was accepted", k, n);
        assert_null(f);
    }
    unsigned char *bad = (unsigned char *)malloc(n);
    assert_non_null(bad);
    size_t hl = 8 + (size_t)img[0] + ((size_t)img[1] << 8);
    int accepted = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(bad, img, n);
        int flips = tu_int(1, 4);
        for (int k = 0; k < flips; k++) bad[tu_int(0, (int)hl - 1)] = (unsigned char)tu_next();
        if (mb_st_parse(&f, bad, n, "damaged") != MB_OK) { assert_null(f); continue; }
        accepted++;
        for (int i = 0; i < mb_st_count(f); i++) { /* every byte of every tensor readable */
            const mb_st_tensor *t = mb_st_at(f, i);
            volatile unsigned char sink = 0;
            for (size_t j = 0; j < t->count * 4 && !strcmp(t->dtype, "F32"); j++) sink ^= ((const unsigned char *)t->data)[j];
            (void)sink;
        }
        mb_st_close(f);
    }
    printf("damaged headers: %d of 2000 still valid files (e.g. a changed digit of metadata)\n", accepted);
    free(bad);
    free(img);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read_roundtrip),
        cmocka_unit_test(test_json_escapes),
        cmocka_unit_test(test_golden_torch_predicts),
        cmocka_unit_test(test_params_roundtrip_and_strict),
        cmocka_unit_test(test_params_bad_files),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_truncated_and_damaged),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
