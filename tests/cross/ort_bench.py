"""ort_bench.py - onnxruntime at batch 1 on predict --to-onnx's file: the ONNX route's cost a
bar (the whole window recomputed), for docs/BENCHMARKS.md's Windows/Linux table.
tests/cross/bench.sh (make cross-bench) runs it between bench_live's runs when
build/onnx-venv exists (make onnx-venv).

    python3 tests/cross/ort_bench.py MODEL.onnx [runs]

One intra-op thread, sequential execution, denormals as zero (FTZ/DAZ, as bench_live's
device), random input of the file's shape; prints the median, p90, min of `runs` (default
2000) session.run calls after 50 warm-up calls."""
import sys, time
import numpy as np
import onnxruntime as ort

path = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.add_session_config_entry("session.set_denormal_as_zero", "1")  # FTZ/DAZ, as megabatch's device
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
inp = s.get_inputs()[0]
shape = [1 if not isinstance(d, int) else d for d in inp.shape]
x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
for _ in range(50):
    s.run(None, {inp.name: x})
t = []
for _ in range(runs):
    t0 = time.perf_counter()
    s.run(None, {inp.name: x})
    t.append(time.perf_counter() - t0)
t.sort()
print("onnxruntime %s, batch 1, 1 thread, FTZ/DAZ on, input %s %s: median %.1f us  p90 %.1f  min %.1f  (%d runs)"
      % (ort.__version__, inp.name, shape, 1e6 * t[len(t) // 2], 1e6 * t[len(t) * 9 // 10], 1e6 * t[0], runs))
