/* mtf_onnx.h - the multi-timeframe model as one ONNX graph, for MetaTrader 5 (OnnxCreate,
 * OnnxRun), onnxruntime and every stack built on it (docs/TRADING.md, "ONNX").
 *
 *   mtf_onnx_export(&model, "model.onnx");   (train_multitf --export-onnx, predict --to-onnx)
 *
 * The graph (opset 13, IR version 7: ONNX 1.8 and every later runtime), for S segments of
 * lengths seg_len[s] at offsets off[s] (T in all), F features, L layers, K targets:
 *
 *   features (batch, T, F) float32                       the raw feature rows, oldest first
 *   Transpose -> (T, batch, F)
 *   per segment s: Slice [off, off + len) on axis 0, then (x - feature_mean[s]) / feature_std[s]
 *                  (prepare's expression, so the rows are bitwise prepare's), then L standard
 *                  ONNX LSTM nodes (hidden_size H, zero initial state), Y_h of the last one
 *                  squeezed -> (batch, H)
 *   Concat (batch, S H) -> Gemm fc1 -> GELU (tanh form, as Mul/Add/Tanh in our order of
 *   operations) -> Gemm fc2 -> times target_scale -> prediction (batch, K) float32
 *
 * LSTM weights: our (PyTorch's) gate blocks i, f, g, o become ONNX's i, o, f, c (W from
 * weight_ih, R from weight_hh, each with a leading num_directions = 1), and B is
 * [bias_ih; bias_hh] in that order of gates: ONNX's [Wb; Rb]. Without feature_mean/std in
 * the model (data with no normalisation attributes) the input is taken as the training file
 * holds it; without target_scale the output is the network's. The metadata_props say which
 * (keys input, output) and carry the safetensors file's metadata (segments, features,
 * feature_mean, ...). A --carry model is exported in the window mode (zero initial state
 * for every prediction, as prepare + predict), not the stateful one.
 */
#ifndef MTF_ONNX_H
#define MTF_ONNX_H
#include "mb_onnx.h"
#include "multitf.h"

#define MTF_ONNX_OPSET 13
#define MTF_ONNX_IR 7

static const int mtf_onnx_gate[4] = {0, 3, 1, 2}; /* ONNX gate j (i, o, f, c) is our gate (i, f, g, o) */

/* rows (4H, cols) in our gate order -> ONNX's, into dst (H: hidden_size). */
MTF_API void mtf_onnx_gates(float *dst, const float *src, int64_t hidden_size, int64_t cols) {
    for (int j = 0; j < 4; j++)
        memcpy(dst + j * hidden_size * cols, src + mtf_onnx_gate[j] * hidden_size * cols,
               (size_t)(hidden_size * cols) * sizeof(float));
}

/* A parameter's values in the host copy of the flat buffer. */
MTF_API const float *mtf_onnx_param(const mtf_model *m, const float *host, const char *fmt, int a, int b) {
    char name[MB_MAX_NAME];
    snprintf(name, sizeof name, fmt, a, b);
    int i = mb_params_find(m->params, name);
    return i < 0 ? NULL : host + mb_params_info(m->params, i)->offset;
}

/* Every parameter the graph reads is in the model. */
MTF_API mb_result mtf_onnx_check(const mtf_model *m) {
    static const char *const enc[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    char name[MB_MAX_NAME];
    for (int j = 0; j < 4 * m->spec.nseg * m->spec.layers + 4; j++) {
        int e = j / 4 / m->spec.layers, k = j / 4 % m->spec.layers, h = j - 4 * m->spec.nseg * m->spec.layers;
        if (h < 0) snprintf(name, sizeof name, "enc%d.%s_l%d", e, enc[j % 4], k);
        else snprintf(name, sizeof name, "head.fc%d.%s", 1 + h / 2, h % 2 ? "bias" : "weight");
        if (mb_params_find(m->params, name) < 0)
            return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "onnx: the model has no parameter '%s'", name);
    }
    return MB_OK;
}

/* One encoder: Slice, normalisation, L LSTM layers, its last hidden state as "enc.s.h". */
MTF_API void mtf_onnx_encoder(mbo_model *g, const mtf_model *m, const float *host, float *tmp, int s, int64_t off) {
    const mtf_spec *sp = &m->spec;
    int64_t hidden_size = sp->hidden_size, one = 1, start = off, end = off + sp->seg_len[s];
    char n[8][64], x[64];
    snprintf(n[0], 64, "enc.%d.start", s);
    snprintf(n[1], 64, "enc.%d.end", s);
    mbo_tensor_i64(g, n[0], 1, &one, &start);
    mbo_tensor_i64(g, n[1], 1, &one, &end);
    const char *slice_in[] = {"features_tbf", n[0], n[1], "axes_0"};
    snprintf(x, 64, "enc.%d.x", s);
    const char *slice_out[] = {x};
    mbo_node(g, "Slice", x, slice_in, 4, slice_out, 1, NULL, 0);
    if (sp->has_norm) { /* (x - mean) / std, per feature of this timeframe */
        int64_t F = sp->F;
        snprintf(n[2], 64, "enc.%d.feature_mean", s);
        snprintf(n[3], 64, "enc.%d.feature_std", s);
        mbo_tensor_f32(g, n[2], 1, &F, sp->mean + s * F);
        mbo_tensor_f32(g, n[3], 1, &F, sp->std + s * F);
        snprintf(n[4], 64, "enc.%d.centred", s);
        snprintf(n[5], 64, "enc.%d.normalised", s);
        const char *sub_in[] = {x, n[2]}, *sub_out[] = {n[4]}, *div_in[] = {n[4], n[3]}, *div_out[] = {n[5]};
        mbo_node(g, "Sub", n[4], sub_in, 2, sub_out, 1, NULL, 0);
        mbo_node(g, "Div", n[5], div_in, 2, div_out, 1, NULL, 0);
        snprintf(x, 64, "%s", n[5]);
    }
    for (int k = 0; k < sp->layers; k++) {
        int64_t in = k ? hidden_size : sp->F, wd[3] = {1, 4 * hidden_size, in};
        int64_t rd[3] = {1, 4 * hidden_size, hidden_size}, bd[2] = {1, 8 * hidden_size};
        snprintf(n[0], 64, "enc.%d.W_l%d", s, k);
        snprintf(n[1], 64, "enc.%d.R_l%d", s, k);
        snprintf(n[2], 64, "enc.%d.B_l%d", s, k);
        mtf_onnx_gates(tmp, mtf_onnx_param(m, host, "enc%d.weight_ih_l%d", s, k), hidden_size, in);
        mbo_tensor_f32(g, n[0], 3, wd, tmp);
        mtf_onnx_gates(tmp, mtf_onnx_param(m, host, "enc%d.weight_hh_l%d", s, k), hidden_size, hidden_size);
        mbo_tensor_f32(g, n[1], 3, rd, tmp);
        mtf_onnx_gates(tmp, mtf_onnx_param(m, host, "enc%d.bias_ih_l%d", s, k), hidden_size, 1);
        mtf_onnx_gates(tmp + 4 * hidden_size, mtf_onnx_param(m, host, "enc%d.bias_hh_l%d", s, k), hidden_size, 1);
        mbo_tensor_f32(g, n[2], 2, bd, tmp);
        int last = k == sp->layers - 1;
        snprintf(n[3], 64, "enc.%d.lstm_l%d", s, k);
        snprintf(n[4], 64, "enc.%d.%s_l%d", s, last ? "h_n" : "y", k);     /* Y_h (1, B, H) or Y (len, 1, B, H) */
        snprintf(n[5], 64, last ? "enc.%d.h" : "enc.%d.y_l%d.seq", s, k); /* (B, H) or (len, B, H) */
        const char *lstm_in[] = {x, n[0], n[1], n[2]}, *y_only[] = {n[4]}, *h_only[] = {"", n[4]};
        const char *sq_in[] = {n[4], last ? "axes_0" : "axes_1"}, *sq_out[] = {n[5]};
        mbo_attr hs = mbo_attr_int("hidden_size", hidden_size);
        mbo_node(g, "LSTM", n[3], lstm_in, 4, last ? h_only : y_only, last ? 2 : 1, &hs, 1);
        snprintf(n[6], 64, "enc.%d.squeeze_l%d", s, k);
        mbo_node(g, "Squeeze", n[6], sq_in, 2, sq_out, 1, NULL, 0);
        snprintf(x, 64, "%s", n[5]);
    }
}

/* fc (transB Gemm) from our "head.fcN." parameters. */
MTF_API void mtf_onnx_linear(mbo_model *g, const mtf_model *m, const float *host, int which, const char *in,
                             const char *out, int64_t rows, int64_t cols) {
    char w[32], b[32];
    int64_t wd[2] = {rows, cols};
    snprintf(w, sizeof w, "fc%d.weight", which);
    snprintf(b, sizeof b, "fc%d.bias", which);
    mbo_tensor_f32(g, w, 2, wd, mtf_onnx_param(m, host, "head.fc%d.weight", which, 0));
    mbo_tensor_f32(g, b, 1, &rows, mtf_onnx_param(m, host, "head.fc%d.bias", which, 0));
    const char *gin[] = {in, w, b}, *gout[] = {out};
    mbo_attr tb = mbo_attr_int("transB", 1);
    mbo_node(g, "Gemm", out, gin, 3, gout, 1, &tb, 1);
}

/* One binary node a op b -> out (named after its output). */
MTF_API void mtf_onnx_op(mbo_model *g, const char *op, const char *a, const char *b, const char *out) {
    const char *in[] = {a, b}, *o[] = {out};
    mbo_node(g, op, out, in, b ? 2 : 1, o, 1, NULL, 0);
}

/* The head: fusion, fc1, GELU as mb_act_forward computes it (0.5 x (1 + tanh(c (x + 0.044715 x x x))),
 * the same order of operations), fc2, target_scale. */
MTF_API void mtf_onnx_head(mbo_model *g, const mtf_model *m, const float *host) {
    const mtf_spec *s = &m->spec;
    const char *hs[MTF_MAX_SEG], *fused[] = {"fused"};
    char names[MTF_MAX_SEG][32];
    for (int i = 0; i < s->nseg; i++) { snprintf(names[i], 32, "enc.%d.h", i); hs[i] = names[i]; }
    mbo_attr axis = mbo_attr_int("axis", 1);
    mbo_node(g, "Concat", "fused", hs, s->nseg, fused, 1, &axis, 1);
    mtf_onnx_linear(g, m, host, 1, "fused", "fc1", s->head, s->nseg * s->hidden_size);
    const float k[4] = {0.044715f, 0.7978845608028654f, 1.0f, 0.5f};
    const char *kn[4] = {"gelu.k", "gelu.c", "gelu.one", "gelu.half"};
    for (int i = 0; i < 4; i++) mbo_tensor_f32(g, kn[i], 0, NULL, &k[i]);
    mtf_onnx_op(g, "Mul", "fc1", "gelu.k", "gelu.kx");
    mtf_onnx_op(g, "Mul", "gelu.kx", "fc1", "gelu.kxx");
    mtf_onnx_op(g, "Mul", "gelu.kxx", "fc1", "gelu.kxxx");
    mtf_onnx_op(g, "Add", "fc1", "gelu.kxxx", "gelu.inner");
    mtf_onnx_op(g, "Mul", "gelu.inner", "gelu.c", "gelu.arg");
    mtf_onnx_op(g, "Tanh", "gelu.arg", NULL, "gelu.tanh");
    mtf_onnx_op(g, "Add", "gelu.tanh", "gelu.one", "gelu.onep");
    mtf_onnx_op(g, "Mul", "fc1", "gelu.half", "gelu.halfx");
    mtf_onnx_op(g, "Mul", "gelu.halfx", "gelu.onep", "gelu");
    int scaled = s->target_scale > 0;
    mtf_onnx_linear(g, m, host, 2, "gelu", scaled ? "fc2" : "prediction", s->K, s->head);
    if (!scaled) return;
    mbo_tensor_f32(g, "target_scale", 0, NULL, &s->target_scale);
    mtf_onnx_op(g, "Mul", "fc2", "target_scale", "prediction");
}

/* What the input and output are (metadata "input", "output"; docs/TRADING.md). */
MTF_API void mtf_onnx_meta(mbo_model *g, const mtf_spec *s, const mtf_meta_text *t) {
    char in[512], out[256];
    const char *seg = "";
    for (int i = 0; i < t->n; i++) {
        mbo_meta(g, t->kv[i].key, t->kv[i].value);
        if (!strcmp(t->kv[i].key, "segments")) seg = t->kv[i].value;
    }
    snprintf(in, sizeof in, "features (batch, %lld, %lld) float32: per sample the segments %s (%s rows, oldest "
             "first) of %s; %s", (long long)s->T, (long long)s->F, seg,
             s->seg_names[0] ? s->seg_names : "unnamed",
             s->has_norm ? "raw feature rows (examples/mb_features.h, prepare before normalising)"
                         : "feature rows as the training file held them",
             s->has_norm ? "normalised in the graph: (x - feature_mean) / feature_std" : "no normalisation in the graph");
    snprintf(out, sizeof out, "prediction (batch, %lld) float32: %s", (long long)s->K,
             s->target_scale > 0 ? "the network's output times target_scale (in the graph): forward log returns"
                                 : "the network's output (no target_scale in the model)");
    mbo_meta(g, "input", in);
    mbo_meta(g, "output", out);
}

/* The model (its weights, spec, normalisation and target_scale) as an ONNX file, written
 * crash-safely (path.tmp, fsync, rename): a failed export leaves no file and a previous
 * one untouched. The spec must know its segment lengths. */
MTF_API mb_result mtf_onnx_export(mtf_model *m, const char *path) {
    const mtf_spec *s = &m->spec;
    if (!s->T || s->nseg < 1)
        return MB_FAIL(NULL, MB_ERR_FORMAT, "onnx: the model's segment lengths are unknown (its file has no "
                       "segments metadata): the graph needs its window length");
    int64_t wmax = s->F > s->hidden_size ? s->F : s->hidden_size;
    float *host = (float *)malloc(mb_params_total(m->params) * sizeof(float) + 1);
    float *tmp = (float *)malloc((size_t)(4 * s->hidden_size * (wmax > 2 ? wmax : 2)) * sizeof(float));
    mbo_model g;
    mtf_meta_text t;
    mbo_init(&g);
    memset(&t, 0, sizeof t);
    mb_result r = host && tmp ? MB_OK : MB_FAIL(NULL, MB_ERR_OUT_OF_MEMORY, "onnx: no memory for the weights");
    if (r == MB_OK) r = mb_params_get(m->params, host);
    if (r == MB_OK) r = mtf_meta_of(s, &t);
    if (r == MB_OK) r = mtf_onnx_check(m);
    if (r == MB_OK) {
        int64_t dims[3] = {-1, s->T, s->F}, odims[2] = {-1, s->K}, axes0 = 0, axes1 = 1, one = 1, perm[3] = {1, 0, 2};
        const char *params[3] = {"batch", NULL, NULL};
        mbo_value(&g, MBO_INPUT, "features", 3, dims, params);
        mbo_tensor_i64(&g, "axes_0", 1, &one, &axes0);
        if (s->layers > 1) mbo_tensor_i64(&g, "axes_1", 1, &one, &axes1); /* squeezes Y between layers */
        const char *tin[] = {"features"}, *tout[] = {"features_tbf"};
        mbo_attr p = mbo_attr_ints("perm", perm, 3);
        mbo_node(&g, "Transpose", "features_tbf", tin, 1, tout, 1, &p, 1); /* LSTM's (seq, batch, input) */
        for (int i = 0; i < s->nseg; i++) mtf_onnx_encoder(&g, m, host, tmp, i, m->seg_off[i]);
        mtf_onnx_head(&g, m, host);
        mbo_value(&g, MBO_OUTPUT, "prediction", 2, odims, params);
        mtf_onnx_meta(&g, s, &t);
        mbo_info info = {MTF_ONNX_IR, MTF_ONNX_OPSET, "megabatch", MEGABATCH_VERSION_STRING, "multitf",
                         "megabatch multi-timeframe model: per segment LSTM encoders, concat, fc1, GELU(tanh), fc2 "
                         "(examples/mtf_onnx.h, docs/TRADING.md)"};
        r = mbo_write(&g, path, &info);
    }
    mbo_free(&g);
    mtf_meta_free(&t);
    free(host);
    free(tmp);
    return r;
}

#endif /* MTF_ONNX_H */
