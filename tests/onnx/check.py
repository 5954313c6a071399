"""An exported ONNX model (examples/mtf_onnx.h) under onnx's checker and onnxruntime; run by
tests/onnx/run.sh, one model per call. Prints one line per check, `ok   ...` or `FAIL ...`.

  check.py MODEL.onnx --layers L [--data X.f32 PREDS.csv LABEL]... [--live X.f32 PREDS.f32]
                      [--golden IO.safetensors] [--tol 1e-5]

--data: raw windows (N, T, F) from onnx_inputs and build/predict's CSV of the same file;
--live: windows the live path built and mtf_live's predictions (N, K), both from onnx_inputs
live. Both in the network's units (the file's, before target_scale): the model's output,
target_scale included, is compared with them times target_scale, in float32 as the graph
multiplies. The error of a sample is relative, in the max norm over its K horizons:
max_k |onnx_k - want_k| / max_k |want_k| (elementwise it would blow up where one horizon's
prediction is near zero: an untrained horizon can stay at 1e-6 while its neighbours are at
1e-4). Each is run at batch 1 and batch 64, on one thread; each line gives the time per
sample (wall clock, this process's calls to onnxruntime).
--golden: tests/golden/multitf_torch_io.safetensors (x, and PyTorch's pred for it) for the
PyTorch-written model converted by predict --to-onnx: no normalisation, no target_scale.
"""
import argparse
import json
import struct
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

failed = 0


def report(ok, what):
    global failed
    failed += not ok
    print(("ok   " if ok else "FAIL ") + what, flush=True)


def check_file(path, model, layers):
    try:
        onnx.checker.check_model(model, full_check=True)
        report(True, f"{path}: onnx.checker.check_model(full_check=True), onnx {onnx.__version__}")
    except Exception as e:  # the checker's own exceptions, and shape inference's
        report(False, f"{path}: onnx.checker: {e}")
    opset = {o.domain: o.version for o in model.opset_import}
    meta = {p.key: p.value for p in model.metadata_props}
    seg = [int(v) for v in meta["segments"].split(",")]
    t, f, k = sum(seg), int(meta["features"]), int(meta["targets"])
    g = model.graph
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    shapes = [(v.name, dims(v)) for v in list(g.input) + list(g.output)]
    want = [("features", ["batch", t, f]), ("prediction", ["batch", k])]
    lstms = [n for n in g.node if n.op_type == "LSTM"]
    report(list(opset) == [""] and opset[""] <= 17 and model.ir_version <= 8 and shapes == want
           and len(lstms) == len(seg) * layers and int(meta["layers"]) == layers,
           f"{path}: opset {opset}, IR {model.ir_version}, {shapes}, {len(lstms)} LSTM nodes")
    return meta, t, f, k


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run(sess, x, batch):
    return np.concatenate([sess.run(["prediction"], {"features": x[i:i + batch]})[0]
                           for i in range(0, len(x), batch)])


def compare(sess, x, want, tol, what):
    for batch in (1, 64):
        t0 = time.perf_counter()
        got = run(sess, x, batch)
        ms = 1e3 * (time.perf_counter() - t0) / len(x)
        scale = np.abs(want.astype(np.float64)).max(axis=1, keepdims=True)  # each sample's largest |prediction|
        err = float((np.abs(got.astype(np.float64) - want) / scale).max()) if got.shape == want.shape else np.inf
        same = float((got == want).mean()) if got.shape == want.shape else 0.0
        report(err <= tol and got.dtype == np.float32,
               f"{what}, batch {batch}: {len(x)} samples x {want.shape[1]}, max error {err:.2g} relative to the "
               f"sample's largest |prediction| (tolerance {tol:g}; {100 * same:.0f}% bitwise equal; "
               f"{ms:.3f} ms per sample)")


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for name, t in head.items():
        if name != "__metadata__":
            lo, hi = t["data_offsets"]
            out[name] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype="<f4").reshape(t["shape"])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--data", nargs=3, action="append", default=[], metavar=("X", "PREDS", "LABEL"))
    p.add_argument("--live", nargs=2, metavar=("X", "PREDS"))
    p.add_argument("--golden")
    p.add_argument("--tol", type=float, default=1e-5)
    a = p.parse_args()
    model = onnx.load(a.model)
    meta, t, f, k = check_file(a.model, model, a.layers)
    scale = np.float32(meta.get("target_scale", "1"))
    sess = session(a.model)
    for xpath, preds, label in a.data:
        x = np.fromfile(xpath, dtype=np.float32).reshape(-1, t, f)
        want = np.loadtxt(preds, delimiter=",", skiprows=1, dtype=np.float32, ndmin=2)[:len(x)] * scale
        compare(sess, x, want, a.tol, f"{a.model}: {label}: onnxruntime = build/predict")
    if a.live:
        x = np.fromfile(a.live[0], dtype=np.float32).reshape(-1, t, f)
        want = np.fromfile(a.live[1], dtype=np.float32).reshape(len(x), k) * scale
        compare(sess, x, want, a.tol, f"{a.model}: the last {len(x)} bars of the CSV: onnxruntime on the raw "
                "window = mtf_live")
    if a.golden:
        io = read_safetensors(a.golden)
        report("target_scale" not in meta and "feature_mean" not in meta, f"{a.model}: no normalisation, no scale")
        compare(sess, io["x"].astype(np.float32), io["pred"].astype(np.float32), a.tol,
                f"{a.model}: onnxruntime = PyTorch's predictions for its own model")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
