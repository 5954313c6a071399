/* The ONNX export without Python (examples/mb_onnx.h, examples/mtf_onnx.h):
 *   - the protobuf encoder byte for byte against encodings protobuf's documentation gives;
 *   - exported files of random shapes (segments, F, H, layers, head, K; with and without
 *     normalisation and target_scale; random weights) parsed back by a protobuf reader
 *     written here, which refuses any malformed field, any wire type or field number the
 *     writer should not use: the ONNX structure (IR and opset versions, the input and
 *     output with their dynamic batch, every node input defined before use, every
 *     initializer used), and every weight where the graph needs it: LSTM gates in ONNX's
 *     order i, o, f, c (found here by the gates' names), B = [bias_ih; bias_hh], Slice
 *     bounds, the normalisation, the head, target_scale, bit for bit;
 *   - crash safety: a failed write (no directory, a full file system simulated by
 *     RLIMIT_FSIZE, a blocked temporary name) leaves no file and a previous file untouched;
 *     the same model gives the same bytes; protobuf's 2 GiB limit is refused.
 * What the graph computes is checked by onnxruntime against build/predict and the live
 * predictor in tests/onnx/run.sh (make onnx-test; needs Python packages). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, fork */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"
#include "../examples/mtf_onnx.h"
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static const char *path_of(const char *name) { return tu_path(dir, name); }

static int setup(void **state) {
    (void)state;
    tu_seed();
    snprintf(dir, sizeof dir, "/tmp/mb_onnx_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

// ---- the encoder ----

/* b holds exactly the bytes of hex ("08 96 01"); then b is emptied. */
static void expect_bytes(mbo_buf *b, const char *hex) {
    unsigned char want[64];
    size_t n = 0;
    for (const char *p = hex; *p; p++)
        if (*p != ' ') { unsigned v; sscanf(p, "%2x", &v); want[n++] = (unsigned char)v; p++; }
    if (b->n != n || memcmp(b->p, want, n)) {
        char got[200] = "";
        for (size_t i = 0; i < b->n && i < 60; i++) snprintf(got + strlen(got), 4, "%02x ", b->p[i]);
        fail_msg("encoded %s, want %s", got, hex);
    }
    assert_int_equal(b->err, 0);
    mbo_buf_free(b);
}

static void test_wire_format(void **state) {
    (void)state;
    mbo_buf b, c;
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    struct { uint64_t v; const char *hex; } varints[] = {
        {0, "00"}, {1, "01"}, {127, "7f"}, {128, "80 01"}, {150, "96 01"}, {300, "ac 02"}, {16383, "ff 7f"},
        {16384, "80 80 01"}, {UINT64_MAX, "ff ff ff ff ff ff ff ff ff 01"}};
    for (size_t i = 0; i < sizeof varints / sizeof *varints; i++) { mbo_varint(&b, varints[i].v); expect_bytes(&b, varints[i].hex); }
    mbo_int(&b, 1, 150); expect_bytes(&b, "08 96 01");                       /* protobuf's Test1 {a: 150} */
    mbo_str(&b, 2, "testing"); expect_bytes(&b, "12 07 74 65 73 74 69 6e 67"); /* Test2 {b: "testing"} */
    mbo_int(&c, 1, 150); mbo_msg(&b, 3, &c); expect_bytes(&b, "1a 03 08 96 01"); /* Test3 {c: {a: 150}} */
    mbo_int(&b, 1, -1); expect_bytes(&b, "08 ff ff ff ff ff ff ff ff ff 01"); /* int64 -1: ten bytes */
    mbo_int(&b, 16, 1); expect_bytes(&b, "80 01 01");                          /* a two-byte key */
    mbo_float(&b, 1, 1.0f); expect_bytes(&b, "0d 00 00 80 3f");                /* fixed32, little-endian */
    mbo_float(&b, 2, -2.5f); expect_bytes(&b, "15 00 00 20 c0");
    mbo_bytes(&b, 9, NULL, 0); expect_bytes(&b, "4a 00");
    mbo_msg(&b, 7, &c); expect_bytes(&b, "3a 00");                               /* an empty message */
    /* a tensor's raw_data is little-endian whatever the host */
    mbo_model m;
    mbo_init(&m);
    float v[2] = {1.0f, -2.0f};
    int64_t two = 2, iv[2] = {3, -2};
    mbo_tensor_f32(&m, "t", 1, &two, v); /* TensorProto {dims: 2, data_type: FLOAT, name: "t", raw_data} */
    expect_bytes(&m.init, "2a 11 08 02 10 01 42 01 74 4a 08 00 00 80 3f 00 00 00 c0");
    mbo_tensor_i64(&m, "i", 1, &two, iv);
    expect_bytes(&m.init, "2a 19 08 02 10 07 42 01 69 4a 10 03 00 00 00 00 00 00 00 fe ff ff ff ff ff ff ff");
    mbo_free(&m);
}

/* Sizes the format cannot hold: protobuf's 2 GiB, negative dimensions, an unnamed dynamic one. */
static void test_limits(void **state) {
    (void)state;
    mbo_buf b;
    memset(&b, 0, sizeof b);
    b.n = MBO_MAX_BYTES - 1; /* as if nearly full: the check comes before any copy */
    mbo_put(&b, "ab", 2);
    assert_int_equal(b.err, MB_ERR_OVERFLOW);
    mbo_info info = {7, 13, "t", NULL, "g", NULL};
    mbo_model m;
    int64_t huge = (int64_t)1 << 30, neg = -1;
    mbo_init(&m);
    mbo_tensor_f32(&m, "huge", 1, &huge, NULL); /* 4 GiB of raw data: refused before reading any */
    tu_assert_error(mbo_write(&m, path_of("huge.onnx"), &info), MB_ERR_OVERFLOW, "2 GiB");
    mbo_free(&m);
    assert_int_equal(access(path_of("huge.onnx"), F_OK), -1);
    assert_int_equal(access(path_of("huge.onnx.tmp"), F_OK), -1);
    mbo_init(&m);
    mbo_tensor_f32(&m, "neg", 1, &neg, NULL);
    tu_assert_error(mbo_write(&m, path_of("neg.onnx"), &info), MB_ERR_INVALID_ARG, "cannot hold");
    mbo_free(&m);
    mbo_init(&m);
    mbo_value(&m, MBO_INPUT, "x", 1, &neg, NULL);
    tu_assert_error(mbo_write(&m, path_of("neg.onnx"), &info), MB_ERR_INVALID_ARG, "cannot hold");
    mbo_free(&m);
    assert_int_equal(access(path_of("neg.onnx"), F_OK), -1);
}

// ---- a protobuf reader: the file back ----

typedef struct pb { const unsigned char *p, *end; } pb;

static int pb_varint(pb *c, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < 10; i++) {
        if (c->p >= c->end) return 0;
        unsigned b = *c->p++;
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

/* The next field: 1 (its number, wire type, a varint's value or the bytes of a LEN/I32 field
 * in sub), 0 at the message's end; anything malformed fails the test. */
static int pb_next(pb *c, int *field, int *wire, uint64_t *v, pb *sub) {
    uint64_t key;
    if (c->p == c->end) return 0;
    if (!pb_varint(c, &key) || (key >> 3) < 1 || (key >> 3) > 1000) fail_msg("bad field key");
    *field = (int)(key >> 3);
    *wire = (int)(key & 7);
    if (*wire == MBO_VARINT) {
        if (!pb_varint(c, v)) fail_msg("bad varint in field %d", *field);
        return 1;
    }
    size_t n = 4;
    if (*wire == MBO_LEN && (!pb_varint(c, v) || *v > (uint64_t)(c->end - c->p))) fail_msg("bad length in field %d", *field);
    if (*wire == MBO_LEN) n = (size_t)*v;
    else if (*wire != MBO_I32) fail_msg("wire type %d in field %d", *wire, *field);
    if ((size_t)(c->end - c->p) < n) fail_msg("field %d runs past its message", *field);
    sub->p = c->p;
    sub->end = c->p + n;
    c->p += n;
    return 1;
}

static void pb_text(const pb *s, char *out, size_t cap) {
    size_t n = (size_t)(s->end - s->p);
    if (n >= cap) fail_msg("string of %zu bytes", n);
    memcpy(out, s->p, n);
    out[n] = 0;
}

#define NAME 64
typedef struct onx_node {
    char op[32], name[NAME], in[8][NAME], out[4][NAME];
    int nin, nout, nperm;
    int64_t hidden_size, axis, trans_b, perm[4];
} onx_node;
typedef struct onx_tensor { char name[NAME]; int type, rank; int64_t dims[4]; const unsigned char *raw; size_t bytes; } onx_tensor;
typedef struct onx_value { char name[NAME], param[4][16]; int elem, rank; int64_t dims[4]; } onx_value;
typedef struct onx_file {
    int64_t ir, opset;
    char producer[32], domain[8], graph[32];
    int nnode, ninit, nin, nout, nmeta;
    onx_node node[256];
    onx_tensor init[256];
    onx_value in, out;
    char meta_key[32][32], meta_val[32][2048];
} onx_file;

static void parse_value(pb c, onx_value *v) {
    int f, w, f2, w2, f3, w3, f4, w4;
    uint64_t x;
    pb s, t, u, d;
    memset(v, 0, sizeof *v);
    while (pb_next(&c, &f, &w, &x, &s)) {
        if (f == 1 && w == MBO_LEN) { pb_text(&s, v->name, NAME); continue; }
        if (f != 2 || w != MBO_LEN) fail_msg("ValueInfoProto field %d", f);
        while (pb_next(&s, &f2, &w2, &x, &t)) { /* TypeProto */
            if (f2 != 1 || w2 != MBO_LEN) fail_msg("TypeProto field %d", f2);
            while (pb_next(&t, &f3, &w3, &x, &u)) { /* TypeProto.Tensor */
                if (f3 == 1 && w3 == MBO_VARINT) { v->elem = (int)x; continue; }
                if (f3 != 2 || w3 != MBO_LEN) fail_msg("TypeProto.Tensor field %d", f3);
                while (pb_next(&u, &f4, &w4, &x, &d)) { /* TensorShapeProto.dim */
                    if (f4 != 1 || w4 != MBO_LEN || v->rank == 4) fail_msg("TensorShapeProto field %d", f4);
                    int f5, w5;
                    pb e;
                    v->dims[v->rank] = -1;
                    while (pb_next(&d, &f5, &w5, &x, &e)) {
                        if (f5 == 1 && w5 == MBO_VARINT) v->dims[v->rank] = (int64_t)x;
                        else if (f5 == 2 && w5 == MBO_LEN) pb_text(&e, v->param[v->rank], 16);
                        else fail_msg("Dimension field %d", f5);
                    }
                    v->rank++;
                }
            }
        }
    }
}

static void parse_node(pb c, onx_node *n) {
    int f, w;
    uint64_t x;
    pb s;
    memset(n, 0, sizeof *n);
    while (pb_next(&c, &f, &w, &x, &s)) {
        if (w != MBO_LEN) fail_msg("NodeProto field %d wire %d", f, w);
        if (f == 1 && n->nin < 8) pb_text(&s, n->in[n->nin++], NAME);
        else if (f == 2 && n->nout < 4) pb_text(&s, n->out[n->nout++], NAME);
        else if (f == 3) pb_text(&s, n->name, NAME);
        else if (f == 4) pb_text(&s, n->op, 32);
        else if (f == 5) { /* AttributeProto */
            char name[32] = "";
            int64_t type = 0, i = 0, ints[4];
            int nints = 0, fa, wa;
            pb a;
            while (pb_next(&s, &fa, &wa, &x, &a)) {
                if (fa == 1 && wa == MBO_LEN) pb_text(&a, name, sizeof name);
                else if (fa == 3 && wa == MBO_VARINT) i = (int64_t)x;
                else if (fa == 8 && wa == MBO_VARINT && nints < 4) ints[nints++] = (int64_t)x;
                else if (fa == 20 && wa == MBO_VARINT) type = (int64_t)x;
                else fail_msg("AttributeProto field %d", fa);
            }
            if (!strcmp(name, "perm") && type == 7) { memcpy(n->perm, ints, sizeof ints); n->nperm = nints; }
            else if (!strcmp(name, "hidden_size") && type == 2) n->hidden_size = i;
            else if (!strcmp(name, "axis") && type == 2) n->axis = i;
            else if (!strcmp(name, "transB") && type == 2) n->trans_b = i;
            else fail_msg("attribute '%s' of type %lld", name, (long long)type);
        } else fail_msg("NodeProto field %d", f);
    }
}

static void parse_tensor(pb c, onx_tensor *t) {
    int f, w;
    uint64_t x;
    pb s;
    memset(t, 0, sizeof *t);
    while (pb_next(&c, &f, &w, &x, &s)) {
        if (f == 1 && w == MBO_VARINT && t->rank < 4) t->dims[t->rank++] = (int64_t)x;
        else if (f == 2 && w == MBO_VARINT) t->type = (int)x;
        else if (f == 8 && w == MBO_LEN) pb_text(&s, t->name, NAME);
        else if (f == 9 && w == MBO_LEN) { t->raw = s.p; t->bytes = (size_t)(s.end - s.p); }
        else fail_msg("TensorProto field %d", f);
    }
    size_t count = 1;
    for (int d = 0; d < t->rank; d++) count *= (size_t)t->dims[d];
    if (t->bytes != count * (t->type == MBO_INT64 ? 8 : 4)) fail_msg("tensor %s: %zu bytes of data", t->name, t->bytes);
}

static void parse_model(const unsigned char *bytes, size_t n, onx_file *o) {
    pb c = {bytes, bytes + n}, s, g;
    int f, w, fg, wg;
    uint64_t x;
    memset(o, 0, sizeof *o);
    while (pb_next(&c, &f, &w, &x, &s)) {
        if (f == 1 && w == MBO_VARINT) o->ir = (int64_t)x;
        else if ((f == 2 || f == 3 || f == 6) && w == MBO_LEN) { char tmp[512]; pb_text(&s, f == 2 ? o->producer : tmp, f == 2 ? 32 : 512); }
        else if (f == 8 && w == MBO_LEN) { /* OperatorSetIdProto */
            int fo, wo;
            pb d;
            while (pb_next(&s, &fo, &wo, &x, &d)) {
                if (fo == 1 && wo == MBO_LEN) pb_text(&d, o->domain, sizeof o->domain);
                else if (fo == 2 && wo == MBO_VARINT) o->opset = (int64_t)x;
                else fail_msg("OperatorSetIdProto field %d", fo);
            }
        } else if (f == 14 && w == MBO_LEN && o->nmeta < 32) {
            int fm, wm;
            pb d;
            while (pb_next(&s, &fm, &wm, &x, &d)) {
                if (wm != MBO_LEN || (fm != 1 && fm != 2)) fail_msg("metadata field %d", fm);
                pb_text(&d, fm == 1 ? o->meta_key[o->nmeta] : o->meta_val[o->nmeta], fm == 1 ? 32 : 2048);
            }
            o->nmeta++;
        } else if (f == 7 && w == MBO_LEN) {
            while (pb_next(&s, &fg, &wg, &x, &g)) {
                if (wg != MBO_LEN) fail_msg("GraphProto field %d wire %d", fg, wg);
                if (fg == 1 && o->nnode < 256) parse_node(g, &o->node[o->nnode++]);
                else if (fg == 2) pb_text(&g, o->graph, sizeof o->graph);
                else if (fg == 5 && o->ninit < 256) parse_tensor(g, &o->init[o->ninit++]);
                else if (fg == 11) { parse_value(g, &o->in); o->nin++; }
                else if (fg == 12) { parse_value(g, &o->out); o->nout++; }
                else fail_msg("GraphProto field %d", fg);
            }
        } else fail_msg("ModelProto field %d wire %d", f, w);
    }
}

static const onx_tensor *init_of(const onx_file *o, const char *name) {
    for (int i = 0; i < o->ninit; i++)
        if (!strcmp(o->init[i].name, name)) return &o->init[i];
    fail_msg("no initializer '%s'", name);
    return NULL;
}
static const char *meta_of(const onx_file *o, const char *key) {
    for (int i = 0; i < o->nmeta; i++)
        if (!strcmp(o->meta_key[i], key)) return o->meta_val[i];
    return NULL;
}
static int count_op(const onx_file *o, const char *op) {
    int n = 0;
    for (int i = 0; i < o->nnode; i++) n += !strcmp(o->node[i].op, op);
    return n;
}
/* The node whose output j is name (-1 if none); *j its index. */
static int producer_of(const onx_file *o, const char *name, int *j) {
    *j = 0;
    for (int i = 0; i < o->nnode; i++)
        for (*j = 0; *j < o->node[i].nout; (*j)++)
            if (name[0] && !strcmp(o->node[i].out[*j], name)) return i;
    return -1;
}
static int64_t i64_at(const onx_tensor *t, int i) { int64_t v; memcpy(&v, t->raw + 8 * i, 8); return v; }

/* Every node input is "", the graph input, an initializer or an earlier node's output;
 * every output is new; every initializer is read; the graph output is made. */
static void check_topology(const onx_file *o) {
    for (int i = 0; i < o->nnode; i++) {
        for (int k = 0; k < o->node[i].nin; k++) {
            const char *x = o->node[i].in[k];
            int j, p = producer_of(o, x, &j), ok = !x[0] || !strcmp(x, o->in.name) || (p >= 0 && p < i);
            for (int t = 0; !ok && t < o->ninit; t++) ok = !strcmp(o->init[t].name, x);
            if (!ok) fail_msg("node %s reads '%s' before it is made", o->node[i].name, x);
        }
        for (int k = 0; k < o->node[i].nout; k++) {
            int j;
            if (o->node[i].out[k][0] && producer_of(o, o->node[i].out[k], &j) != i)
                fail_msg("'%s' is made twice", o->node[i].out[k]);
        }
    }
    for (int t = 0; t < o->ninit; t++) {
        int used = 0;
        for (int i = 0; i < o->nnode; i++)
            for (int k = 0; k < o->node[i].nin; k++) used |= !strcmp(o->node[i].in[k], o->init[t].name);
        if (!used) fail_msg("initializer '%s' is not used", o->init[t].name);
    }
    int j;
    assert_true(producer_of(o, o->out.name, &j) >= 0);
}

// ---- exported models ----

static mtf_spec random_spec(void) {
    mtf_spec s;
    memset(&s, 0, sizeof s);
    s.nseg = tu_int(1, 5); s.F = tu_int(1, 7); s.hidden_size = tu_int(1, 6); s.layers = tu_int(1, 3);
    s.head = tu_int(1, 6); s.K = tu_int(1, 5);
    for (int i = 0; i < s.nseg; i++) { s.seg_len[i] = tu_int(1, 9); s.T += s.seg_len[i]; }
    s.has_norm = tu_int(0, 1);
    for (int i = 0; i < s.nseg * s.F; i++) { s.mean[i] = tu_uniform(-2, 2); s.std[i] = tu_uniform(0.01f, 3); }
    s.target_scale = tu_int(0, 1) ? tu_uniform(1e-4f, 1) : 0;
    if (s.nseg == 5 && tu_int(0, 1)) snprintf(s.seg_names, sizeof s.seg_names, "M1,M5,M15,H1,H4");
    return s;
}

/* A parameter of the model, on the host (the CPU device's memory). */
static const float *param(mtf_model *m, const char *fmt, int a, int b) {
    char name[MB_MAX_NAME];
    snprintf(name, sizeof name, fmt, a, b);
    int i = mb_params_find(m->params, name);
    assert_true(i >= 0);
    return mb_params_tensor(m->params, i);
}

static void expect_floats(const onx_tensor *t, const float *want, size_t n, size_t at, const char *what) {
    if (t->type != MBO_FLOAT || (at + n) * 4 > t->bytes || memcmp(t->raw + 4 * at, want, n * 4))
        fail_msg("%s: %s differs", t->name, what);
}

/* The LSTM of segment s, layer k: its W, R, B where ONNX wants each gate. */
static void check_lstm(const onx_file *o, const onx_node *n, mtf_model *m, int s, int k) {
    static const char onnx_gates[] = "iofc", our_gates[] = "ifco"; /* ours: i, f, g (ONNX's c), o */
    int64_t H = m->spec.hidden_size, in = k ? H : m->spec.F;
    assert_int_equal(n->nin, 4);
    assert_int_equal(n->hidden_size, H);
    const onx_tensor *W = init_of(o, n->in[1]), *R = init_of(o, n->in[2]), *B = init_of(o, n->in[3]);
    assert_int_equal(W->rank, 3); assert_int_equal(W->dims[0], 1); assert_int_equal(W->dims[1], 4 * H);
    assert_int_equal(W->dims[2], in);
    assert_int_equal(R->rank, 3); assert_int_equal(R->dims[2], H);
    assert_int_equal(B->rank, 2); assert_int_equal(B->dims[1], 8 * H);
    for (int j = 0; j < 4; j++) {
        int g = (int)(strchr(our_gates, onnx_gates[j]) - our_gates);
        expect_floats(W, param(m, "enc%d.weight_ih_l%d", s, k) + g * H * in, (size_t)(H * in), (size_t)(j * H * in), "W");
        expect_floats(R, param(m, "enc%d.weight_hh_l%d", s, k) + g * H * H, (size_t)(H * H), (size_t)(j * H * H), "R");
        expect_floats(B, param(m, "enc%d.bias_ih_l%d", s, k) + g * H, (size_t)H, (size_t)(j * H), "Wb");
        expect_floats(B, param(m, "enc%d.bias_hh_l%d", s, k) + g * H, (size_t)H, (size_t)(4 * H + j * H), "Rb");
    }
}

/* Segment s: its Slice, normalisation and layers, followed from the graph's input. */
static void check_encoder(const onx_file *o, mtf_model *m, int s) {
    const mtf_spec *sp = &m->spec;
    char want[NAME];
    int j = 0, p = -1;
    for (int i = 0; i < o->nnode && p < 0; i++) { /* the Slice of this segment: starts at its offset */
        if (strcmp(o->node[i].op, "Slice")) continue;
        const onx_tensor *st = init_of(o, o->node[i].in[1]);
        if (i64_at(st, 0) == m->seg_off[s]) p = i;
    }
    assert_true(p >= 0);
    const onx_node *sl = &o->node[p];
    assert_int_equal(i64_at(init_of(o, sl->in[2]), 0), m->seg_off[s] + sp->seg_len[s]);
    assert_int_equal(i64_at(init_of(o, sl->in[3]), 0), 0);
    int t = producer_of(o, sl->in[0], &j); /* the (T, B, F) transpose of the input */
    assert_true(t >= 0 && !strcmp(o->node[t].op, "Transpose") && !strcmp(o->node[t].in[0], o->in.name));
    assert_int_equal(o->node[t].nperm, 3);
    assert_true(o->node[t].perm[0] == 1 && o->node[t].perm[1] == 0 && o->node[t].perm[2] == 2);
    const char *x = sl->out[0], *prev = "Slice";
    for (int i = 0; i < o->nnode; i++) { /* the nodes reading x, in order: Sub, Div, then the layers */
        const onx_node *n = &o->node[i];
        int at = -1;
        for (int k = 0; k < n->nin; k++)
            if (!strcmp(n->in[k], x)) at = k;
        if (at < 0) continue;
        if (at > 0 && strcmp(n->op, "Concat")) fail_msg("segment %d: %s reads %s as input %d", s, n->op, x, at);
        /* the order: Slice -> Sub -> Div -> the first layer with normalisation, Slice -> the
         * first layer without; Sub only after the Slice, Div only after Sub */
        const char *next = !strcmp(prev, "Slice") ? (sp->has_norm ? "Sub" : "LSTM")
                         : !strcmp(prev, "Sub")   ? "Div"
                         : !strcmp(prev, "Div")   ? "LSTM" : NULL;
        if ((next && strcmp(n->op, next)) || (!next && (!strcmp(n->op, "Sub") || !strcmp(n->op, "Div"))))
            fail_msg("segment %d: %s reads the output of %s (normalisation %s)", s, n->op, prev, sp->has_norm ? "on" : "off");
        if (!strcmp(n->op, "Sub")) {
            expect_floats(init_of(o, n->in[1]), sp->mean + s * sp->F, (size_t)sp->F, 0, "feature_mean");
        } else if (!strcmp(n->op, "Div")) {
            expect_floats(init_of(o, n->in[1]), sp->std + s * sp->F, (size_t)sp->F, 0, "feature_std");
        } else if (!strcmp(n->op, "LSTM")) {
            int k = 0;
            while (k < sp->layers && (snprintf(want, sizeof want, "enc.%d.lstm_l%d", s, k), strcmp(n->name, want))) k++;
            assert_true(k < sp->layers);
            check_lstm(o, n, m, s, k);
        } else if (!strcmp(n->op, "Squeeze")) { /* Y (seq, 1, B, H) on axis 1, Y_h (1, B, H) on axis 0 */
            int q = producer_of(o, n->in[0], &j);
            assert_true(q >= 0 && !strcmp(o->node[q].op, "LSTM"));
            assert_int_equal(i64_at(init_of(o, n->in[1]), 0), j == 1 ? 0 : 1);
            assert_int_equal(j == 1, !strcmp(o->node[q].name, (snprintf(want, sizeof want, "enc.%d.lstm_l%d", s,
                                                                         sp->layers - 1), want)));
        } else if (strcmp(n->op, "Concat")) fail_msg("segment %d: %s reads %s", s, n->op, x);
        x = n->out[n->nout - 1]; /* the LSTM's last output (Y_h of the last layer) */
        prev = n->op;
        if (!strcmp(n->op, "Concat")) {
            assert_int_equal(at, s); /* its place in the fusion */
            return;
        }
    }
    fail_msg("segment %d does not reach the fusion", s);
}

static void check_model_file(const char *path, mtf_model *m) {
    const mtf_spec *sp = &m->spec;
    size_t n;
    unsigned char *bytes = tu_slurp(path, &n);
    onx_file *o = (onx_file *)calloc(1, sizeof *o);
    assert_non_null(o);
    parse_model(bytes, n, o);
    assert_int_equal(o->ir, MTF_ONNX_IR);
    assert_true(o->opset >= 13 && o->opset <= 17);
    assert_string_equal(o->domain, "");
    assert_string_equal(o->producer, "megabatch");
    assert_int_equal(o->nin, 1); assert_int_equal(o->nout, 1);
    assert_string_equal(o->in.name, "features"); assert_int_equal(o->in.elem, MBO_FLOAT);
    assert_int_equal(o->in.rank, 3); assert_int_equal(o->in.dims[0], -1); assert_string_equal(o->in.param[0], "batch");
    assert_int_equal(o->in.dims[1], sp->T); assert_int_equal(o->in.dims[2], sp->F);
    assert_string_equal(o->out.name, "prediction"); assert_int_equal(o->out.rank, 2);
    assert_string_equal(o->out.param[0], "batch"); assert_int_equal(o->out.dims[1], sp->K);
    check_topology(o);
    assert_int_equal(count_op(o, "LSTM"), sp->nseg * sp->layers);
    assert_int_equal(count_op(o, "Slice"), sp->nseg);
    assert_int_equal(count_op(o, "Sub"), sp->has_norm ? sp->nseg : 0);
    assert_int_equal(count_op(o, "Div"), sp->has_norm ? sp->nseg : 0);
    assert_int_equal(count_op(o, "Gemm"), 2);
    assert_int_equal(count_op(o, "Tanh"), 1);
    for (int s = 0; s < sp->nseg; s++) check_encoder(o, m, s);
    int fc_seen = 0;
    for (int i = 0; i < o->nnode; i++) { /* the head: fc1 (head, S H), fc2 (K, head), each once */
        const onx_node *g = &o->node[i];
        if (strcmp(g->op, "Gemm")) continue;
        int w = g->in[1][2] - '0'; /* fc1 / fc2 */
        assert_true((w == 1 || w == 2) && !(fc_seen & w));
        fc_seen |= w;
        assert_int_equal(g->trans_b, 1);
        const onx_tensor *W = init_of(o, g->in[1]), *b = init_of(o, g->in[2]);
        int64_t rows = w == 1 ? sp->head : sp->K, cols = w == 1 ? sp->nseg * sp->hidden_size : sp->head;
        if (W->rank != 2 || W->dims[0] != rows || W->dims[1] != cols || W->bytes != (size_t)(rows * cols) * 4)
            fail_msg("fc%d.weight: rank %d, (%lld, %lld), %zu bytes; want (%lld, %lld)", w, W->rank, (long long)W->dims[0],
                     (long long)W->dims[1], W->bytes, (long long)rows, (long long)cols);
        if (b->rank != 1 || b->dims[0] != rows || b->bytes != (size_t)rows * 4)
            fail_msg("fc%d.bias: rank %d, (%lld), %zu bytes; want (%lld)", w, b->rank, (long long)b->dims[0], b->bytes,
                     (long long)rows);
        expect_floats(W, param(m, "head.fc%d.weight", w, 0), (size_t)(rows * cols), 0, "fc weight");
        expect_floats(b, param(m, "head.fc%d.bias", w, 0), (size_t)rows, 0, "fc bias");
    }
    assert_int_equal(fc_seen, 3);
    int j, last = producer_of(o, "prediction", &j);
    assert_string_equal(o->node[last].op, sp->target_scale > 0 ? "Mul" : "Gemm");
    if (sp->target_scale > 0) expect_floats(init_of(o, o->node[last].in[1]), &sp->target_scale, 1, 0, "target_scale");
    char segs[128] = "";
    for (int s = 0; s < sp->nseg; s++) snprintf(segs + strlen(segs), 16, "%s%lld", s ? "," : "", (long long)sp->seg_len[s]);
    assert_string_equal(meta_of(o, "segments"), segs);
    assert_int_equal(meta_of(o, "feature_mean") != NULL, sp->has_norm);
    assert_int_equal(meta_of(o, "target_scale") != NULL, sp->target_scale > 0);
    assert_non_null(strstr(meta_of(o, "input"), sp->has_norm ? "normalised in the graph" : "no normalisation"));
    assert_non_null(strstr(meta_of(o, "output"), sp->target_scale > 0 ? "times target_scale" : "no target_scale"));
    printf("  S=%d T=%lld F=%lld H=%lld L=%d head=%lld K=%lld norm=%d scale=%d: %d nodes, %d initializers, %zu bytes\n",
           sp->nseg, (long long)sp->T, (long long)sp->F, (long long)sp->hidden_size, sp->layers, (long long)sp->head,
           (long long)sp->K, sp->has_norm, sp->target_scale > 0, o->nnode, o->ninit, n);
    free(o);
    free(bytes);
}

static void make_model(mtf_model *m, mb_device *dev, const mtf_spec *s) {
    tu_ok(mtf_model_create(m, dev, s, 1, 0));
    tu_ok(mb_params_init(m->params, tu_next()));
}

static void test_export_structure(void **state) {
    (void)state;
    mb_device *dev = NULL;
    tu_ok(mtf_device_open(&dev, MB_CPU, 1));
    for (int rep = 0; rep < 12; rep++) {
        mtf_spec s = random_spec();
        if (rep < 2) { s.has_norm = rep; s.target_scale = rep ? 0.5f : 0; s.layers = rep + 1; }
        mtf_model m;
        make_model(&m, dev, &s);
        tu_ok(mtf_onnx_export(&m, path_of("m.onnx")));
        check_model_file(path_of("m.onnx"), &m);
        assert_int_equal(access(path_of("m.onnx.tmp"), F_OK), -1);
        mtf_model_destroy(&m);
    }
    tu_close_checked(dev);
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = tu_slurp(a, &na), *y = tu_slurp(b, &nb);
    int same = na == nb && !memcmp(x, y, na);
    free(x); free(y);
    return same;
}

/* Export in a child whose file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) stops the write
 * halfway: the export fails with MB_ERR_IO and leaves no temporary file. */
static void export_with_size_limit(mtf_model *m, const char *path, rlim_t limit) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {limit, limit};
        signal(SIGXFSZ, SIG_IGN);
        mb_result r = setrlimit(RLIMIT_FSIZE, &rl) ? MB_ERR_INVALID_ARG : mtf_onnx_export(m, path);
        _exit(r == MB_ERR_IO && strstr(mb_last_error(), "untouched") ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_export_crash_safe(void **state) {
    (void)state;
    mb_device *dev = NULL;
    tu_ok(mtf_device_open(&dev, MB_CPU, 1));
    mtf_spec s = random_spec();
    s.hidden_size = 6; s.F = 7; /* a file of a few KB, so the size limit cuts it */
    mtf_model a, b;
    make_model(&a, dev, &s);
    make_model(&b, dev, &s); /* other weights */
    tu_assert_error(mtf_onnx_export(&a, "/nonexistent/dir/m.onnx"), MB_ERR_IO, "/nonexistent/dir/m.onnx");
    assert_int_equal(access("/nonexistent/dir/m.onnx.tmp", F_OK), -1);
    tu_ok(mtf_onnx_export(&a, path_of("a.onnx")));
    tu_ok(mtf_onnx_export(&a, path_of("a2.onnx")));
    assert_true(files_equal(path_of("a.onnx"), path_of("a2.onnx"))); /* the same model, the same bytes */
    tu_ok(mtf_onnx_export(&b, path_of("b.onnx")));
    assert_false(files_equal(path_of("a.onnx"), path_of("b.onnx")));
    size_t n;
    free(tu_slurp(path_of("a.onnx"), &n));
    export_with_size_limit(&b, path_of("a.onnx"), n / 2); /* a full disk, halfway through */
    assert_true(files_equal(path_of("a.onnx"), path_of("a2.onnx")));
    assert_int_equal(access(path_of("a.onnx.tmp"), F_OK), -1);
    assert_int_equal(mkdir(path_of("a.onnx.tmp"), 0755), 0); /* the temporary name taken */
    tu_assert_error(mtf_onnx_export(&b, path_of("a.onnx")), MB_ERR_IO, "a.onnx.tmp");
    assert_true(files_equal(path_of("a.onnx"), path_of("a2.onnx")));
    assert_int_equal(rmdir(path_of("a.onnx.tmp")), 0);
    tu_ok(mtf_onnx_export(&b, path_of("a.onnx"))); /* replaced whole */
    assert_true(files_equal(path_of("a.onnx"), path_of("b.onnx")));
    a.spec.T = 0; /* a model whose window length is unknown */
    tu_assert_error(mtf_onnx_export(&a, path_of("c.onnx")), MB_ERR_FORMAT, "segment lengths are unknown");
    assert_int_equal(access(path_of("c.onnx"), F_OK), -1);
    mtf_model_destroy(&a);
    mtf_model_destroy(&b);
    tu_close_checked(dev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_format),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_export_structure),
        cmocka_unit_test(test_export_crash_safe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
