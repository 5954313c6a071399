/* test_lstm.c, part 2: torch.nn.LSTM golden file (tests/golden/lstm_golden.txt, made by
 * tests/golden/make_lstm_golden.py): outputs, final states and all gradients in fp32. */

/* Read the next array called `name` (fails if the next array has another name). */
static float *golden_read(FILE *f, const char *name, size_t want) {
    char got[64];
    size_t n = 0;
    if (fscanf(f, "%63s %zu", got, &n) != 2) fail_msg("golden: expected array %s", name);
    if (strcmp(got, name) != 0 || n != want) fail_msg("golden: got %s[%zu], want %s[%zu]", got, n, name, want);
    float *v = tu_alloc_f32(n);
    for (size_t i = 0; i < n; i++)
        if (fscanf(f, "%f", &v[i]) != 1) fail_msg("golden: %s ends at %zu of %zu", name, i, n);
    return v;
}

static FILE *golden_open(void) {
    const char *paths[] = {"tests/golden/lstm_golden.txt", "../tests/golden/lstm_golden.txt",
                           "../../tests/golden/lstm_golden.txt"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(paths[i], "r");
        if (f) return f;
    }
    fail_msg("tests/golden/lstm_golden.txt not found (run the test from the repository root)");
    return NULL;
}

static void golden_case(FILE *f, int ckpt, int B, int T, int F, int H, int L, int st) {
    shape s = {B, T, F, H, L};
    size_t nx = (size_t)B * T * F, no = (size_t)B * T * H, ns = (size_t)L * B * H, nb = (size_t)B * H;
    mb_device *dev;
    mb_params *p;
    mb_lstm *l;
    tu_ok(mb_device_open(&dev, NULL));
    if (ckpt == CK_AUTO_TIGHT) make_tight(dev);
    tu_ok(mb_params_create(&p, dev));
    mb_lstm_config cfg = make_cfg(&s, ckpt);
    if (ckpt == CK_AUTO_TIGHT) cfg.grad_block = 1; /* the rule's ceil(sqrt(T)) unrounded: 2 or 3 < T */
    tu_ok(mb_lstm_create(&l, p, &cfg));
    tu_ok(mb_params_finalize(p));
    int64_t k = mb_lstm_checkpoint_steps(l, T);
    if (ckpt == -1 ? k != -1 : (k < 2 || k >= T)) /* checkpointed: more than one segment, each recomputed */
        fail_msg("golden case B=%d T=%d L=%d, checkpoint %d: the LSTM takes interval %lld", B, T, L, ckpt, (long long)k);
    float *x = golden_read(f, "x", nx), *h0 = st ? golden_read(f, "h0", ns) : NULL;
    float *c0 = st ? golden_read(f, "c0", ns) : NULL;
    float *r1 = golden_read(f, "r1", no), *r2 = golden_read(f, "r2", nb);
    for (int i = 0; i < 4 * L; i++) {
        const mb_param_info *in = mb_params_info(p, i);
        float *v = golden_read(f, in->name, in->count);
        memcpy(mb_params_tensor(p, i), v, in->count * sizeof(float));
        free(v);
    }
    float *out = tu_alloc_f32(no), *hn = tu_alloc_f32(ns), *cn = tu_alloc_f32(ns), *dx = tu_alloc_f32(nx);
    float *dh0 = tu_alloc_f32(ns), *dc0 = tu_alloc_f32(ns), *hl = tu_alloc_f32(nb);
    tu_ok(mb_lstm_forward(l, x, B, T, h0, c0, out, hl));
    tu_ok(mb_lstm_final_state(l, hn, cn));
    tu_ok(mb_lstm_backward(l, r2, r1, dx, dh0, dc0));
    struct { const char *name; float *got; size_t n; } cmp[] = {{"out", out, no}, {"h_n", hn, ns}, {"c_n", cn, ns}};
    for (int i = 0; i < 3; i++) {
        float *want = golden_read(f, cmp[i].name, cmp[i].n);
        tu_assert_close(cmp[i].got, want, cmp[i].n, 1e-5, 1e-4, cmp[i].name);
        free(want);
    }
    tu_assert_close(hl, hn + (size_t)(L - 1) * nb, nb, 0, 0, "h_last == h_n[-1]");
    for (int i = 0; i < 4 * L; i++) {
        const mb_param_info *in = mb_params_info(p, i);
        char name[96] = "grad.";
        strncat(name, in->name, sizeof name - 6);
        float *want = golden_read(f, name, in->count);
        tu_assert_close(mb_params_tensor_grad(p, i), want, in->count, 1e-5, 1e-4, name);
        free(want);
    }
    float *want = golden_read(f, "dx", nx);
    tu_assert_close(dx, want, nx, 1e-5, 1e-4, "dx");
    free(want);
    if (st) {
        want = golden_read(f, "dh0", ns);
        tu_assert_close(dh0, want, ns, 1e-5, 1e-4, "dh0");
        free(want);
        want = golden_read(f, "dc0", ns);
        tu_assert_close(dc0, want, ns, 1e-5, 1e-4, "dc0");
        free(want);
    }
    free(x); free(h0); free(c0); free(r1); free(r2); free(out); free(hn); free(cn); free(dx); free(dh0);
    free(dc0); free(hl);
    mb_lstm_destroy(l); mb_params_destroy(p); mb_device_close(dev);
}

static void test_golden_torch(void **state) {
    (void)state;
    /* full storage, an explicit interval of 2 (segments of 2 steps, recomputed in the
     * backward), and the automatic rule forced to checkpoint by a device short of memory */
    const int ckpts[] = {-1, 2, CK_AUTO_TIGHT};
    for (int ci = 0; ci < 3; ci++) {
        int ckpt = ckpts[ci];
        FILE *f = golden_open();
        char line[256];
        int cases = 0, B, T, F, H, L, st;
        if (!fgets(line, sizeof line, f)) fail_msg("golden: empty file");
        while (fscanf(f, " case %d %d %d %d %d %d", &B, &T, &F, &H, &L, &st) == 6) {
            golden_case(f, ckpt, B, T, F, H, L, st);
            cases++;
        }
        assert_true(feof(f));
        assert_int_equal(cases, 3);
        fclose(f);
    }
}
