/* multitf.h - the multi-timeframe model, defined once, in reading order: the model (its
 * parameters and workspaces, mtf_model_build; forward and backward), then its weights file
 * (--export, --init, predict), then its carried state in a checkpoint. Shared by
 * train_multitf.c (training, --export, --init), predict.c, the live predictor (mtf_live.h)
 * and a trading tool's own program (docs/TRADING.md).
 *
 * Include after megabatch.h (with MEGABATCH_IMPLEMENTATION in one file). All names are
 * mtf_* (static: each including file gets its own copy).
 */
#ifndef MTF_MULTITF_H
#define MTF_MULTITF_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define MTF_API static __attribute__((unused)) /* an includer need not use everything */
#else
#define MTF_API static
#endif
#define MTF_MAX_SEG MB_MAX_SEGMENTS
#define MTF_MAX_F 64 /* features per bar in a file's normalisation metadata */
#define MTF_STREAM(s) (2 + (s) % (MB_MAX_STREAMS - 2)) /* encoder s's device stream */

typedef struct mtf_spec {
    int nseg, layers, carry;                 /* carry: trained with --carry (metadata) */
    int64_t F, K, hidden_size, head, T;      /* T = sum of seg_len (0 when unknown); hidden_size: the
                                                LSTMs' (mb_lstm_config.hidden_size), H in shapes */
    int64_t seg_len[MTF_MAX_SEG];            /* 0 when the file does not say */
    char seg_names[256];                     /* "M1,M5,M15,H1,H4" or "" */
    int has_norm;                            /* feature_mean/std present */
    float mean[MTF_MAX_SEG * MTF_MAX_F], std[MTF_MAX_SEG * MTF_MAX_F];
    float target_scale;                      /* 0 when absent */
    char weights[160];                       /* which weights a file holds (metadata "weights"), "" unsaid */
} mtf_spec;

/* ---- the model ----
 * The one definition of train_multitf.c's model, for training and for inference: enc{s}
 * LSTMs over the segments of x (B, T, F), each reading its segment of every sample in place
 * (x_stride = T F: no copy) and keeping its last hidden state (B, H); the states
 * concatenated (B, S H) -> head.fc1 -> GELU -> head.fc2 -> pred (B, K). The encoders run at
 * once (mb_lstm_*_many): on a GPU each on its own stream 2 + s, on the CPU side by side on
 * the device's threads, so the critical path is the longest encoder, not the sum.
 * With train set, the buffers of the backward too (dpred: the loss gradient goes there).
 * Dropout p (docs/LSTM.md, "Dropout"), in training mode only (mtf_model_set_training): each
 * encoder's nn.LSTM dropout (on every layer's outputs but the last) and, before head.fc1, on
 * the concatenated states (B, S H). Inverted, deterministic: every mask is a pure function of
 * (dropout_seed, the model's step counter, the element), the counter a uint64_t on the device
 * that each training forward advances on the device first (so a captured step replays new
 * masks); mtf_model_save_dropout / _load_dropout carry it in a checkpoint. Keys: the head's
 * mask dropout_seed, encoder s's layer k dropout_seed + 1 + s layers + k. */

typedef struct mtf_config {
    int64_t maxB;      /* the largest batch */
    int carry;         /* each encoder carries its (h, c) from one batch to the next */
    int train;         /* gradient buffers for mtf_model_backward */
    int checkpoint_k;  /* the LSTMs' activation checkpointing (0: automatic) */
    mb_dtype precision; /* the encoders' gemm operands (MB_F32, MB_BF16, MB_F16) */
    float dropout;     /* dropout probability in [0, 1); 0 = none (the same bits as without it) */
    uint64_t dropout_seed; /* the masks' seed (use another than the parameters' init seed) */
} mtf_config;

typedef struct mtf_model {
    mb_device *dev;
    mb_params *params;
    mtf_spec spec;
    int64_t maxB;
    int64_t seg_off[MTF_MAX_SEG];
    mb_lstm *enc[MTF_MAX_SEG];
    mb_lstm_call call[MTF_MAX_SEG];                     /* the encoders' calls of the last forward */
    mb_linear fc1, fc2;
    float *hlast[MTF_MAX_SEG], *fused, *z1, *a1, *pred; /* device memory */
    float *dh[MTF_MAX_SEG], *dfused, *da1, *dpred;      /* train: the backward's */
    float *state_h, *state_c;                           /* train with carry: (layers, B, H), for checkpoints */
    float dropout;                                      /* the config's */
    uint64_t dropout_seed;
    int training;                                       /* mtf_model_set_training (the config's train at build) */
    int drop;                                           /* the last forward dropped (dropout > 0, training) */
    uint64_t *drop_step;                                /* dropout > 0: the masks' step counter (device) */
    float *fused_drop;                                  /* dropout > 0: (B, S H) the head's input, dropped */
} mtf_model;

MTF_API void mtf_model_destroy(mtf_model *m) {
    float *bufs[] = {m->fused, m->z1, m->a1, m->pred, m->dfused, m->da1, m->dpred, m->state_h, m->state_c,
                     m->fused_drop};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mb_free(m->dev, bufs[i]);
    mb_free(m->dev, m->drop_step);
    for (int s = 0; s < m->spec.nseg; s++) {
        mb_lstm_destroy(m->enc[s]);
        mb_free(m->dev, m->hlast[s]); mb_free(m->dev, m->dh[s]);
    }
    mb_params_destroy(m->params);
    memset(m, 0, sizeof *m);
}

MTF_API mb_result mtf_alloc(mtf_model *m, float **p, int64_t n) {
    return mb_alloc(m->dev, MB_MEM_DEVICE, (size_t)n * sizeof(float), (void **)p);
}

MTF_API mb_result mtf_model_buffers(mtf_model *m, const mtf_config *c) {
    const mtf_spec *s = &m->spec;
    int64_t B = c->maxB;
    for (int i = 0; i < s->nseg; i++) MB_TRY(mtf_alloc(m, &m->hlast[i], B * s->hidden_size));
    MB_TRY(mtf_alloc(m, &m->fused, B * s->nseg * s->hidden_size));
    MB_TRY(mtf_alloc(m, &m->z1, B * s->head));
    MB_TRY(mtf_alloc(m, &m->a1, B * s->head));
    MB_TRY(mtf_alloc(m, &m->pred, B * s->K));
    if (c->dropout > 0.0f) MB_TRY(mtf_alloc(m, &m->fused_drop, B * s->nseg * s->hidden_size));
    if (!c->train) return MB_OK;
    for (int i = 0; i < s->nseg; i++) MB_TRY(mtf_alloc(m, &m->dh[i], B * s->hidden_size));
    MB_TRY(mtf_alloc(m, &m->dfused, B * s->nseg * s->hidden_size));
    MB_TRY(mtf_alloc(m, &m->da1, B * s->head));
    MB_TRY(mtf_alloc(m, &m->dpred, B * s->K));
    if (!c->carry) return MB_OK;
    MB_TRY(mtf_alloc(m, &m->state_h, s->layers * B * s->hidden_size));
    return mtf_alloc(m, &m->state_c, s->layers * B * s->hidden_size);
}

/* Register the parameters (enc{s}. and head.fc{1,2}., in that order) and the workspaces.
 * The spec must know its segment lengths. */
MTF_API mb_result mtf_model_build(mtf_model *m, mb_device *dev, const mtf_spec *spec, const mtf_config *c) {
    memset(m, 0, sizeof *m);
    m->dev = dev; m->spec = *spec; m->maxB = c->maxB;
    m->dropout = c->dropout; m->dropout_seed = c->dropout_seed; m->training = c->train != 0;
    if (spec->nseg < 1 || !spec->T) return MB_FAIL(NULL, MB_ERR_FORMAT, "the model's segment lengths are unknown");
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "dropout %g must be in [0, 1)", (double)c->dropout);
    if (c->dropout > 0.0f) { /* before the encoders, which key their masks by it */
        MB_TRY(mb_alloc(dev, MB_MEM_DEVICE, sizeof *m->drop_step, (void **)&m->drop_step));
        MB_TRY(mb_zero(dev, MB_STREAM_COMPUTE, m->drop_step, sizeof *m->drop_step));
    }
    MB_TRY(mb_params_create(&m->params, dev));
    for (int s = 0; s < spec->nseg; s++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "enc%d.", s);
        mb_lstm_config lc;
        memset(&lc, 0, sizeof lc);
        lc.input_size = spec->F; lc.hidden_size = spec->hidden_size; lc.layers = spec->layers; lc.prefix = prefix;
        lc.max_steps = spec->seg_len[s]; lc.max_batch = c->maxB; lc.carry_state = c->carry;
        lc.checkpoint = c->checkpoint_k; lc.precision = c->precision; lc.stream = MTF_STREAM(s);
        lc.dropout = c->dropout; lc.dropout_seed = c->dropout_seed + 1 + (uint64_t)s * (uint64_t)spec->layers;
        lc.dropout_step = m->drop_step;
        MB_TRY(mb_lstm_create(&m->enc[s], m->params, &lc));
        mb_lstm_set_training(m->enc[s], m->training);
        m->seg_off[s] = s ? m->seg_off[s - 1] + spec->seg_len[s - 1] : 0;
    }
    MB_TRY(mb_linear_init(&m->fc1, m->params, "head.fc1", spec->nseg * spec->hidden_size, spec->head));
    MB_TRY(mb_linear_init(&m->fc2, m->params, "head.fc2", spec->head, spec->K));
    MB_TRY(mb_params_finalize(m->params));
    return mtf_model_buffers(m, c);
}

/* Training (1) or evaluation (0) mode: dropout applies in training mode only (a model built
 * with train starts in training mode, others in evaluation mode). Switch to 0 around a
 * validation pass and back to 1 after it: evaluation leaves the step counter alone. */
MTF_API void mtf_model_set_training(mtf_model *m, int training) {
    m->training = training != 0;
    for (int s = 0; s < m->spec.nseg; s++) mb_lstm_set_training(m->enc[s], m->training);
}

/* For inference: batches of up to maxB. carry: each encoder carries its (h, c) from one
 * forward to the next (a stateful stream of batch 1). */
MTF_API mb_result mtf_model_create(mtf_model *m, mb_device *dev, const mtf_spec *spec, int64_t maxB, int carry) {
    mtf_config c;
    memset(&c, 0, sizeof c);
    c.maxB = maxB; c.carry = carry;
    return mtf_model_build(m, dev, spec, &c);
}

/* The spec of a model for a data file: its segments (the whole window when it has none),
 * F and K; hidden_size, head and layers chosen by the trainer. */
MTF_API mtf_spec mtf_spec_of_data(const mb_dataset_meta *d, int64_t hidden_size, int64_t head, int layers, int carry) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = d->segments ? d->segments : 1;
    s.layers = layers; s.carry = carry; s.F = d->f; s.K = d->k; s.hidden_size = hidden_size; s.head = head; s.T = d->t;
    for (int i = 0; i < s.nseg && i < MTF_MAX_SEG; i++) {
        s.seg_len[i] = d->segments ? d->segment_len[i] : d->t;
        size_t n = strlen(s.seg_names);
        snprintf(s.seg_names + n, sizeof s.seg_names - n, "%s%s", i ? "," : "", d->segment_name[i]);
    }
    if (!d->segment_name[0][0]) s.seg_names[0] = 0;
    return s;
}

/* The head over the encoders' last hidden states (m->hlast): fusion, fc1, GELU, fc2. */
MTF_API mb_result mtf_model_head(mtf_model *m, int64_t B, const float **pred) {
    const mtf_spec *s = &m->spec;
    int64_t dims[MTF_MAX_SEG];
    const float *hs[MTF_MAX_SEG];
    for (int i = 0; i < s->nseg; i++) { dims[i] = s->hidden_size; hs[i] = m->hlast[i]; }
    MB_TRY(mb_concat_forward(m->dev, MB_STREAM_COMPUTE, s->nseg, hs, dims, B, m->fused));
    if (m->drop)
        MB_TRY(mb_dropout_forward_dev(m->dev, MB_STREAM_COMPUTE, m->dropout, m->dropout_seed, m->drop_step, m->fused,
                                      m->fused_drop, (size_t)(B * s->nseg * s->hidden_size)));
    MB_TRY(mb_linear_forward(&m->fc1, MB_STREAM_COMPUTE, m->drop ? m->fused_drop : m->fused, B, m->z1));
    MB_TRY(mb_act_forward(m->dev, MB_STREAM_COMPUTE, MB_ACT_GELU, m->z1, m->a1, (size_t)(B * s->head)));
    MB_TRY(mb_linear_forward(&m->fc2, MB_STREAM_COMPUTE, m->a1, B, m->pred));
    *pred = m->pred;
    return MB_OK;
}

/* pred (B, K) device memory of m (valid until the next call) for x (B, T, F) device memory.
 * With carry, an encoder whose carried state is of another batch size (an epoch's short
 * last batch) starts fresh. */
MTF_API mb_result mtf_model_forward(mtf_model *m, const float *x, int64_t B, const float **pred) {
    const mtf_spec *s = &m->spec;
    memset(m->call, 0, sizeof m->call);
    m->drop = m->dropout > 0.0f && m->training;
    if (m->drop) MB_TRY(mb_dropout_step_advance(m->dev, MB_STREAM_COMPUTE, m->drop_step)); /* this forward's masks */
    for (int i = 0; i < s->nseg; i++) {
        int64_t carried = mb_lstm_state_batch(m->enc[i]);
        if (carried && carried != B) mb_lstm_reset_state(m->enc[i]);
        mb_lstm_call *c = &m->call[i];
        c->lstm = m->enc[i]; c->B = B; c->T = s->seg_len[i];
        c->x = x + m->seg_off[i] * s->F; c->x_stride = s->T * s->F; /* segment i of each sample */
        c->h_last = m->hlast[i];
        c->dh_last = m->dh[i];                                      /* train: for the backward */
    }
    MB_TRY(mb_lstm_forward_many(m->call, s->nseg));
    return mtf_model_head(m, B, pred);
}

/* Backward of the last forward from the loss gradient in m->dpred: the gradients
 * accumulate into the flat gradient buffer (a model built with train). */
MTF_API mb_result mtf_model_backward(mtf_model *m, int64_t B) {
    const mtf_spec *s = &m->spec;
    int64_t dims[MTF_MAX_SEG];
    for (int i = 0; i < s->nseg; i++) dims[i] = s->hidden_size;
    MB_TRY(mb_linear_backward(&m->fc2, MB_STREAM_COMPUTE, m->a1, m->dpred, B, m->da1));
    MB_TRY(mb_act_backward(m->dev, MB_STREAM_COMPUTE, MB_ACT_GELU, m->z1, m->da1, m->da1, (size_t)(B * s->head)));
    MB_TRY(mb_linear_backward(&m->fc1, MB_STREAM_COMPUTE, m->drop ? m->fused_drop : m->fused, m->da1, B, m->dfused));
    if (m->drop) /* the same mask on the gradient */
        MB_TRY(mb_dropout_backward_dev(m->dev, MB_STREAM_COMPUTE, m->dropout, m->dropout_seed, m->drop_step, m->dfused,
                                       m->dfused, (size_t)(B * s->nseg * s->hidden_size)));
    MB_TRY(mb_concat_backward(m->dev, MB_STREAM_COMPUTE, s->nseg, m->dfused, dims, B, m->dh));
    return mb_lstm_backward_many(m->call, s->nseg); /* reads the batch again: it must still be valid */
}

/* The stateful mode (a model created with carry, batch 1): x[i] holds the n[i] new rows
 * (F each, device memory) of segment i, which its encoder reads from the state it carried
 * (zeros at first); n[i] = 0 keeps its last hidden state. Then the head, when pred is not
 * NULL. O(1) per bar: one LSTM step per new row. In evaluation mode (MB_ERR_STATE when a model
 * with dropout is in training mode). */
MTF_API mb_result mtf_model_step(mtf_model *m, const float *const *x, const int64_t *n, const float **pred) {
    mb_lstm_call call[MTF_MAX_SEG];
    int c = 0;
    if (m->dropout > 0.0f && m->training)
        return MB_FAIL(NULL, MB_ERR_STATE, "mtf_model_step: the stateful mode runs in evaluation mode "
                       "(mtf_model_set_training(m, 0))");
    m->drop = 0;
    memset(call, 0, sizeof call);
    for (int i = 0; i < m->spec.nseg; i++) {
        if (!n[i]) continue;
        call[c].lstm = m->enc[i]; call[c].B = 1; call[c].T = n[i]; call[c].x = x[i];
        call[c++].h_last = m->hlast[i];
    }
    if (c) MB_TRY(mb_lstm_forward_many(call, c));
    return pred ? mtf_model_head(m, 1, pred) : MB_OK;
}

/* The device for inference: the backend the program was built for, streams for the
 * encoders. threads 0 = the cores. */
MTF_API mb_result mtf_device_open(mb_device **dev, mb_backend backend, int threads) {
    mb_device_config dc;
    memset(&dc, 0, sizeof dc);
    dc.backend = backend; dc.streams = MB_MAX_STREAMS; /* encoder s on stream 2 + s % (streams - 2) */
    dc.threads = threads;
    return mb_device_open(dev, &dc);
}

/* ---- the weights file ----
 * safetensors (mb_st_*, megabatch.h section "export") with exactly the names and shapes of
 * bench/pytorch/multitf.py's MultiTF.state_dict():
 *   enc.{s}.weight_ih_l{k} (4H, F or H)   enc.{s}.weight_hh_l{k} (4H, H)
 *   enc.{s}.bias_ih_l{k} (4H)             enc.{s}.bias_hh_l{k} (4H)
 *   fc1.weight (head, S*H)  fc1.bias (head)  fc2.weight (K, head)  fc2.bias (K)
 * so torch's load_state_dict(load_file(f), strict=True) takes it. The model's sizes are
 * read from the shapes (the truth); __metadata__ adds what shapes cannot say: the segment
 * lengths and names, the feature normalisation of `prepare` (feature_mean, feature_std:
 * S*F values, timeframe-major), target_scale, and whether it was trained with --carry. */

/* Our parameter names (enc{s}. and head.fc{1,2}, as train_multitf.c registers them) ->
 * the file's (PyTorch's). */
static const char *const mtf_rename[] = {
    "enc0.", "enc.0.", "enc1.", "enc.1.", "enc2.", "enc.2.", "enc3.", "enc.3.", "enc4.", "enc.4.",
    "enc5.", "enc.5.", "enc6.", "enc.6.", "enc7.", "enc.7.", "enc8.", "enc.8.", "enc9.", "enc.9.",
    "enc10.", "enc.10.", "enc11.", "enc.11.", "enc12.", "enc.12.", "enc13.", "enc.13.", "enc14.", "enc.14.",
    "enc15.", "enc.15.", "head.", "", NULL};

/* Comma-separated numbers of a metadata value: exactly n of them. */
MTF_API int mtf_parse_list(const char *s, double *v, int n) {
    for (int i = 0; i < n; i++) {
        char *end;
        if (!s) return 0;
        v[i] = strtod(s, &end);
        if (end == s || (*end != ',' && *end != 0) || (*end == 0) != (i == n - 1)) return 0;
        s = *end ? end + 1 : end;
    }
    return 1;
}

MTF_API mb_result mtf_meta_int(const mb_st_file *f, const char *key, int64_t want, const char *path) {
    const char *v = mb_st_meta_get(f, key);
    double x;
    if (v && (!mtf_parse_list(v, &x, 1) || x != (double)want))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: metadata %s=%s but the tensors' shapes say %lld", path, key, v,
                       (long long)want);
    return MB_OK;
}

MTF_API mb_result mtf_meta_norm(const mb_st_file *f, mtf_spec *s, const char *path) {
    const char *m = mb_st_meta_get(f, "feature_mean"), *d = mb_st_meta_get(f, "feature_std");
    const char *ts = mb_st_meta_get(f, "target_scale");
    int n = s->nseg * (int)s->F;
    double tmp[MTF_MAX_SEG * MTF_MAX_F];
    if (ts && !mtf_parse_list(ts, tmp, 1)) return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: bad metadata target_scale", path);
    if (ts) s->target_scale = (float)tmp[0];
    if (!m && !d) return MB_OK;
    if (s->F > MTF_MAX_F || !m || !d || !mtf_parse_list(m, tmp, n))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: metadata feature_mean/feature_std must hold %d numbers each", path, n);
    for (int i = 0; i < n; i++) s->mean[i] = (float)tmp[i];
    if (!mtf_parse_list(d, tmp, n))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: metadata feature_std must hold %d numbers", path, n);
    for (int i = 0; i < n; i++) s->std[i] = (float)tmp[i];
    s->has_norm = 1;
    return MB_OK;
}

MTF_API const mb_st_tensor *mtf_tensor(const mb_st_file *f, int rank, const char *fmt, int a, int b) {
    char name[MB_MAX_NAME];
    snprintf(name, sizeof name, fmt, a, b);
    const mb_st_tensor *t = mb_st_find(f, name);
    return t && t->rank == rank ? t : NULL;
}

/* The model's sizes from a weights file: S, L, H, F from the encoders' tensors, head and K
 * from fc1/fc2; metadata that disagrees with them is an error. Every tensor's exact shape
 * is checked when the weights are loaded (mtf_model_load). */
MTF_API mb_result mtf_spec_of(const mb_st_file *f, const char *path, mtf_spec *s) {
    memset(s, 0, sizeof *s);
    const mb_st_tensor *w = mtf_tensor(f, 2, "enc.%d.weight_ih_l%d", 0, 0), *f1 = mb_st_find(f, "fc1.weight"),
                       *f2 = mb_st_find(f, "fc2.weight");
    if (!w || !f1 || !f2 || f1->rank != 2 || f2->rank != 2 || w->shape[0] % 4 || !w->shape[0])
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: not a multi-timeframe model: needs enc.0.weight_ih_l0 (4H, F), "
                       "fc1.weight and fc2.weight (bench/pytorch/multitf.py's names)", path);
    while (s->nseg < MTF_MAX_SEG && mtf_tensor(f, 2, "enc.%d.weight_ih_l%d", s->nseg, 0)) s->nseg++;
    while (s->layers < 64 && mtf_tensor(f, 2, "enc.%d.weight_ih_l%d", 0, s->layers)) s->layers++;
    s->hidden_size = w->shape[0] / 4; s->F = w->shape[1]; s->head = f1->shape[0]; s->K = f2->shape[0];
    const char *seg = mb_st_meta_get(f, "segments"), *names = mb_st_meta_get(f, "segment_names");
    double v[MTF_MAX_SEG];
    if (seg && !mtf_parse_list(seg, v, s->nseg))
        return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: metadata segments='%s' must list %d lengths", path, seg, s->nseg);
    for (int i = 0; seg && i < s->nseg; i++) {
        if (!(v[i] >= 1 && v[i] <= 1e7)) return MB_FAIL(NULL, MB_ERR_FORMAT, "%s: bad metadata segments='%s'", path, seg);
        s->seg_len[i] = (int64_t)v[i];
        s->T += s->seg_len[i];
    }
    if (names) snprintf(s->seg_names, sizeof s->seg_names, "%s", names);
    const char *carry = mb_st_meta_get(f, "carry"), *weights = mb_st_meta_get(f, "weights");
    if (weights) snprintf(s->weights, sizeof s->weights, "%s", weights); /* which weights: kept on re-export */
    s->carry = carry && !strcmp(carry, "1");
    MB_TRY(mtf_meta_int(f, "features", s->F, path));
    MB_TRY(mtf_meta_int(f, "targets", s->K, path));
    MB_TRY(mtf_meta_int(f, "hidden", s->hidden_size, path));
    MB_TRY(mtf_meta_int(f, "head", s->head, path));
    MB_TRY(mtf_meta_int(f, "layers", s->layers, path));
    return mtf_meta_norm(f, s, path);
}

/* ---- metadata on export ---- */

typedef struct mtf_meta_text { char buf[16][64]; char *mean, *std; mb_st_meta kv[16]; int n; } mtf_meta_text;

MTF_API void mtf_meta_add(mtf_meta_text *t, const char *key, const char *value) {
    t->kv[t->n].key = key;
    t->kv[t->n].value = value;
    t->n++;
}

MTF_API char *mtf_list_text(const float *v, int n) {
    char *s = (char *)malloc((size_t)n * 20 + 1), *p = s;
    if (!s) return NULL;
    *p = 0;
    for (int i = 0; i < n; i++) p += snprintf(p, 20, "%s%.9g", i ? "," : "", (double)v[i]);
    return s;
}

/* The metadata of a file for spec s (mtf_meta_free after mb_st_save_params). */
MTF_API mb_result mtf_meta_of(const mtf_spec *s, mtf_meta_text *t) {
    memset(t, 0, sizeof *t);
    int k = 0;
    mtf_meta_add(t, "format", "megabatch.multitf/1");
    mtf_meta_add(t, "model", "per segment nn.LSTM(batch_first) -> last h, concat -> fc1 -> GELU(tanh) -> fc2");
    for (int i = 0; i < s->nseg; i++)
        snprintf(t->buf[0] + strlen(t->buf[0]), sizeof t->buf[0] - strlen(t->buf[0]), "%s%lld", i ? "," : "",
                 (long long)s->seg_len[i]);
    mtf_meta_add(t, "segments", t->buf[k++]);
    if (s->seg_names[0]) mtf_meta_add(t, "segment_names", s->seg_names);
    const char *keys[] = {"features", "targets", "hidden", "head", "layers", "carry"};
    int64_t vals[] = {s->F, s->K, s->hidden_size, s->head, s->layers, s->carry};
    for (int i = 0; i < 6; i++, k++) {
        snprintf(t->buf[k], sizeof t->buf[k], "%lld", (long long)vals[i]);
        mtf_meta_add(t, keys[i], t->buf[k]);
    }
    if (s->target_scale > 0) {
        snprintf(t->buf[k], sizeof t->buf[k], "%.9g", (double)s->target_scale);
        mtf_meta_add(t, "target_scale", t->buf[k++]);
    }
    if (s->weights[0]) mtf_meta_add(t, "weights", s->weights); /* e.g. "EMA decay 0.999 over 464 steps" */
    if (s->has_norm) {
        t->mean = mtf_list_text(s->mean, s->nseg * (int)s->F);
        t->std = mtf_list_text(s->std, s->nseg * (int)s->F);
        if (!t->mean || !t->std) return MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "no memory for the metadata");
        mtf_meta_add(t, "feature_mean", t->mean);
        mtf_meta_add(t, "feature_std", t->std);
    }
    return MB_OK;
}

MTF_API void mtf_meta_free(mtf_meta_text *t) { free(t->mean); free(t->std); }

/* prepare's normalisation attributes of an open data file (feature_mean/feature_std [S, F]
 * on `features`, or `ends` in the series layout; target_scale on `targets`) into s; absent
 * or unfit attributes leave s without them. Through mb_dataset_read_attr: a file opened with
 * the probe (mba_open_data) had these attributes read in the probe's child first. Before a
 * loader on ds opens. */
MTF_API mb_result mtf_spec_read_norm(mtf_spec *s, mb_dataset *ds) {
    const char *names[2] = {"feature_mean", "feature_std"};
    float *dst[2] = {s->mean, s->std};
    int64_t want = (int64_t)s->nseg * s->F, got = 0;
    int ok = s->F <= MTF_MAX_F;
    for (int i = 0; ok && i < 2; i++) {
        mb_result r = mb_dataset_read_attr(ds, MB_ON_FEATURES, names[i], dst[i], want, &got);
        if (r == MB_ERR_INVALID_ARG || r == MB_ERR_OUT_OF_MEMORY) return r;
        ok = r == MB_OK && got == want; /* another shape: not this model's normalisation */
    }
    s->has_norm = ok;
    mb_result r = mb_dataset_read_attr(ds, MB_ON_TARGETS, "target_scale", &s->target_scale, 1, &got);
    if (r == MB_ERR_INVALID_ARG || r == MB_ERR_OUT_OF_MEMORY) return r;
    if (r != MB_OK || got != 1) s->target_scale = 0;
    mb_clear_error();
    return MB_OK;
}

/* Weights from a file, strictly (every tensor, every shape). */
MTF_API mb_result mtf_model_load(mtf_model *m, const mb_st_file *f) {
    return mb_st_load_params(f, m->params, mtf_rename);
}

/* Start from a weights file (of train_multitf or bench/pytorch/multitf.py): its segments
 * must be the model's, and every tensor must fit. */
MTF_API mb_result mtf_model_init_file(mtf_model *m, const char *path) {
    mb_st_file *f = NULL;
    mtf_spec s;
    MB_TRY(mb_st_open(&f, path));
    mb_result r = mtf_spec_of(f, path, &s);
    for (int i = 0; r == MB_OK && s.T && i < m->spec.nseg; i++)
        if (s.nseg != m->spec.nseg || s.seg_len[i] != m->spec.seg_len[i])
            r = MB_FAIL(NULL, MB_ERR_FORMAT, "%s: its segments differ from the data's", path);
    if (r == MB_OK) r = mtf_model_load(m, f);
    mb_st_close(f);
    return r;
}

/* The weights file of the model, with the normalisation in its spec (mtf_spec_read_norm of
 * the data file it trained on). */
MTF_API mb_result mtf_model_export(const mtf_model *m, const char *path) {
    mtf_meta_text t;
    mb_result r = mtf_meta_of(&m->spec, &t);
    if (r == MB_OK) r = mb_st_save_params(path, m->params, mtf_rename, t.kv, t.n);
    mtf_meta_free(&t);
    return r;
}


/* ---- carried state in a checkpoint ----
 * With carry, each encoder's carried (h, c) and its batch size (0: none): enc{s}.carry_batch,
 * enc{s}.h_n, enc{s}.c_n, so a resumed run continues the carried state exactly. */

typedef struct mtf_carry_names { char batch[32], h[32], c[32]; } mtf_carry_names;
MTF_API mtf_carry_names mtf_carry_names_of(int s) {
    mtf_carry_names n;
    snprintf(n.batch, sizeof n.batch, "enc%d.carry_batch", s);
    snprintf(n.h, sizeof n.h, "enc%d.h_n", s);
    snprintf(n.c, sizeof n.c, "enc%d.c_n", s);
    return n;
}

MTF_API mb_result mtf_model_save_carry(mb_ckpt_writer *w, mtf_model *m) {
    for (int s = 0; s < m->spec.nseg; s++) {
        mtf_carry_names name = mtf_carry_names_of(s);
        int64_t B = mb_lstm_state_batch(m->enc[s]);
        size_t bytes = (size_t)(m->spec.layers * B * m->spec.hidden_size) * sizeof(float);
        MB_TRY(mb_ckpt_add(w, name.batch, &B, sizeof B));
        if (!B) continue;
        MB_TRY(mb_lstm_final_state(m->enc[s], m->state_h, m->state_c));
        MB_TRY(mb_stream_wait(m->dev, MB_STREAM_COMPUTE, MTF_STREAM(s)));
        MB_TRY(mb_ckpt_add(w, name.h, m->state_h, bytes)); /* copied on the encoder's stream, read on compute */
        MB_TRY(mb_ckpt_add(w, name.c, m->state_c, bytes));
    }
    return MB_OK;
}

MTF_API mb_result mtf_model_load_carry(mb_ckpt_reader *rd, mtf_model *m) {
    for (int s = 0; s < m->spec.nseg; s++) {
        mtf_carry_names name = mtf_carry_names_of(s);
        int64_t B = 0;
        MB_TRY(mb_ckpt_get(rd, name.batch, &B, sizeof B));
        mb_lstm_reset_state(m->enc[s]);
        if (!B) continue;
        if (B < 0 || B > m->maxB) return MB_FAIL(NULL, MB_ERR_FORMAT, "checkpoint: %s = %lld", name.batch, (long long)B);
        size_t bytes = (size_t)(m->spec.layers * B * m->spec.hidden_size) * sizeof(float);
        MB_TRY(mb_ckpt_get(rd, name.h, m->state_h, bytes));
        MB_TRY(mb_ckpt_get(rd, name.c, m->state_c, bytes));
        MB_TRY(mb_lstm_set_state(m->enc[s], B, m->state_h, m->state_c));
        MB_TRY(mb_stream_wait(m->dev, MB_STREAM_COMPUTE, MTF_STREAM(s))); /* read on its stream first */
    }
    return MB_OK;
}

/* ---- the dropout step in a checkpoint ----
 * With dropout, the masks' step counter: section "dropout_step" (8 bytes), so a resumed run
 * draws the masks the uninterrupted run would have. No-ops without dropout. */
MTF_API mb_result mtf_model_save_dropout(mb_ckpt_writer *w, mtf_model *m) {
    return m->drop_step ? mb_ckpt_add(w, "dropout_step", m->drop_step, sizeof *m->drop_step) : MB_OK;
}

MTF_API mb_result mtf_model_load_dropout(mb_ckpt_reader *rd, mtf_model *m) {
    return m->drop_step ? mb_ckpt_get(rd, "dropout_step", m->drop_step, sizeof *m->drop_step) : MB_OK;
}

/* ---- the model's state in a checkpoint ----
 * What a checkpoint holds of a model besides its weights: the carried state (a model of a
 * spec with carry) and the dropout step. */
MTF_API mb_result mtf_model_save_state(mb_ckpt_writer *w, mtf_model *m) {
    if (m->spec.carry) MB_TRY(mtf_model_save_carry(w, m));
    return mtf_model_save_dropout(w, m);
}

MTF_API mb_result mtf_model_load_state(mb_ckpt_reader *rd, mtf_model *m) {
    if (m->spec.carry) MB_TRY(mtf_model_load_carry(rd, m));
    return mtf_model_load_dropout(rd, m);
}

#endif /* MTF_MULTITF_H */
