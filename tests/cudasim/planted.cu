/* The library code that tests/cudasim/plant.sh plants faults in, run at tiny sizes so that TSan
 * goes through it in seconds (tests/cudasim/neg.sh). Built under TSan from the planted copy of
 * the sources (build/neg-src, CUDASIM_PLANT=name takes a site out); without a planted fault it
 * runs clean and prints "planted: ok". Three parts, each as the library's users run it:
 *   loader  a chunked, double-buffered loader (small chunks and slabs, shuffled) whose batches
 *           the compute stream copies with no host sync between them (loader_kick, slab_reuse)
 *   carry   the model of examples/multitf.h (two encoders, carried state, the per-step LSTM
 *           path) with plain launches: training steps (the last with AdamW), a poll of the loss
 *           meter and the carried state into a checkpoint after each (lstm_fork, meter_landed,
 *           carry_ckpt, host_mask)
 *   graph   the same model without carry, its step captured once and replayed (lstm_join)
 *   planted [loader|carry|graph]   (none: all three) */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"
#include "multitf.h"

#define CHECK(call)                                                                          \
    do {                                                                                     \
        mb_result r_ = (call);                                                               \
        if (r_ != MB_OK) {                                                                   \
            fprintf(stderr, "planted: %s failed: %s\n", #call, mb_last_error());             \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static void loader_part(mb_device *dev) {
    enum { N = 301, T = 7, F = 5, K = 3 };
    static float feat[N * T * F], targ[N * K];
    for (int i = 0; i < N * T * F; i++) feat[i] = (float)i;
    for (int i = 0; i < N * K; i++) targ[i] = (float)-i;
    const size_t row = (T * F + K) * sizeof(float);
    mb_dataset *ds;
    CHECK(mb_dataset_open_memory(&ds, feat, targ, N, T, F, K, NULL));
    mb_loader_config c;
    memset(&c, 0, sizeof c);
    c.batch = 8; c.chunk_bytes = 100 * row; c.slab_bytes = 11 * row; c.shuffle = 1; c.seed = 3; /* 4 chunks, 10 slabs each */
    mb_loader *ld;
    CHECK(mb_loader_open(&ld, dev, ds, &c));
    char *d = NULL;
    size_t used = 0;
    CHECK(mb_alloc(dev, MB_MEM_DEVICE, 2 * N * row, (void **)&d));
    mb_batch b;
    for (int e = 0; e < 2;) {
        CHECK(mb_loader_next(ld, &b));
        if (b.end_of_epoch) { e++; continue; }
        CHECK(mb_copy(dev, MB_STREAM_COMPUTE, d + used, b.features, (size_t)b.count * T * F * sizeof(float)));
        used += (size_t)b.count * T * F * sizeof(float);
        CHECK(mb_copy(dev, MB_STREAM_COMPUTE, d + used, b.targets, (size_t)b.count * K * sizeof(float)));
        used += (size_t)b.count * K * sizeof(float);
    }
    CHECK(mb_sync(dev, MB_STREAM_COMPUTE));
    mb_free(dev, d);
    mb_loader_close(ld);
    mb_dataset_close(ds);
}

typedef struct net {
    mtf_model m;
    mb_adamw *opt;
    mb_meter *meter;
    float *x, *y, *loss;
    int64_t B;
    int optimize; /* the step ends with AdamW (under TSan its norm pass alone takes seconds) */
} net;

static void net_open(net *n, mb_device *dev, int carry) {
    memset(n, 0, sizeof *n);
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = 2; s.layers = 1; s.carry = carry; s.F = 3; s.K = 2; s.hidden_size = 4; s.head = 4;
    s.seg_len[0] = 5; s.seg_len[1] = 3; s.T = 8;
    n->B = 4;
    mtf_config c = {n->B, carry, 1, 2, MB_F32, 0.0f, 0}; /* checkpoint_k 2: each encoder's per-step path on its stream */
    CHECK(mtf_model_build(&n->m, dev, &s, &c));
    CHECK(mb_params_init(n->m.params, 7));
    mb_adamw_config ac = mb_adamw_config_default();
    CHECK(mb_adamw_create(&n->opt, n->m.params, &ac));
    CHECK(mb_meter_create(&n->meter, dev, 1, 8));
    size_t nx = (size_t)(n->B * s.T * s.F), ny = (size_t)(n->B * s.K);
    float hx[4 * 8 * 3], hy[4 * 2];
    for (size_t i = 0; i < nx; i++) hx[i] = (float)(i % 7) * 0.1f - 0.3f;
    for (size_t i = 0; i < ny; i++) hy[i] = (float)i * 0.05f;
    CHECK(mb_alloc(dev, MB_MEM_DEVICE, nx * sizeof(float), (void **)&n->x));
    CHECK(mb_alloc(dev, MB_MEM_DEVICE, ny * sizeof(float), (void **)&n->y));
    CHECK(mb_alloc(dev, MB_MEM_DEVICE, sizeof(float), (void **)&n->loss));
    CHECK(mb_copy(dev, MB_STREAM_COMPUTE, n->x, hx, sizeof hx));
    CHECK(mb_copy(dev, MB_STREAM_COMPUTE, n->y, hy, sizeof hy));
    CHECK(mb_sync(dev, -1));
}

static void net_close(net *n) {
    mb_device *dev = n->m.dev;
    mb_meter_destroy(n->meter);
    mb_adamw_destroy(n->opt);
    mb_free(dev, n->x); mb_free(dev, n->y); mb_free(dev, n->loss);
    mtf_model_destroy(&n->m);
}

/* A training step, as train_multitf.c's: no host sync. */
static mb_result step(void *user) {
    net *n = (net *)user;
    const float *pred;
    MB_TRY(mb_params_zero_grad(n->m.params));
    MB_TRY(mtf_model_forward(&n->m, n->x, n->B, &pred));
    mb_loss_config lc;
    memset(&lc, 0, sizeof lc);
    lc.acc = mb_meter_slot(n->meter, 0);
    MB_TRY(mb_loss(n->m.dev, MB_STREAM_COMPUTE, &lc, pred, n->y, n->B, n->m.spec.K, 1.0f, NULL, n->loss, n->m.dpred));
    MB_TRY(mtf_model_backward(&n->m, n->B));
    return n->optimize ? mb_adamw_step(n->opt, 1e-3f, NULL) : MB_OK;
}

static void carry_part(mb_device *dev, const char *ckpt) {
    net n;
    net_open(&n, dev, 1);
    for (int i = 0; i < 3; i++) {
        n.optimize = i == 2;
        CHECK(step(&n));
        CHECK(mb_meter_read(n.meter, MB_STREAM_COMPUTE, 0));
        int landed;
        CHECK(mb_meter_next(n.meter, 0, &landed)); /* a poll: the read lands when its event says so */
        mb_ckpt_writer *w;
        CHECK(mb_ckpt_writer_create(&w, dev));
        CHECK(mtf_model_save_carry(w, &n.m));
        CHECK(mb_ckpt_write(w, ckpt));
        mb_ckpt_writer_destroy(w);
    }
    CHECK(mb_meter_wait(n.meter));
    net_close(&n);
}

static void graph_part(mb_device *dev) {
    net n;
    net_open(&n, dev, 0);
    CHECK(step(&n)); /* the warm-up a capture needs */
    mb_graph *g = NULL;
    for (int i = 0; i < 3; i++) CHECK(mb_graph_run(&g, dev, MB_STREAM_COMPUTE, step, &n));
    CHECK(mb_sync(dev, -1));
    if (!g) {
        fprintf(stderr, "planted: the step was not captured\n");
        exit(1);
    }
    mb_graph_destroy(g);
    net_close(&n);
}

int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : NULL; /* loader, carry or graph; none: all three */
    char ckpt[] = "/tmp/mb_planted_XXXXXX";
    int fd = mkstemp(ckpt);
    if (fd < 0) return 1;
    close(fd);
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = MB_CUDA; dc.streams = 4;
    dc.log.fn = mb_log_stderr; dc.log.max = MB_LOG_WARN; /* mb_graph_run's fallback, said */
    mb_device *dev;
    CHECK(mb_device_open(&dev, &dc));
    if (!part || !strcmp(part, "loader")) loader_part(dev);
    if (!part || !strcmp(part, "carry")) carry_part(dev, ckpt);
    if (!part || !strcmp(part, "graph")) graph_part(dev);
    mb_device_close(dev);
    remove(ckpt);
    printf("planted: ok\n");
    return 0;
}
