#!/bin/sh
# tests/cross/bench.sh [DIR] - the live predictor's cost per closed M1 bar, batch 1, one
# thread, FTZ/DAZ on in all (make cross-bench; docs/BENCHMARKS.md has the table): bench_live
# (bench/bench_live.c, -O2, MEGABATCH_NO_CBLAS: the same code on both) on Linux and under
# Wine, window and stateful mode, and onnxruntime on the same model shape exported by
# predict --to-onnx (tests/cross/ort_bench.py; skipped, saying so, without build/onnx-venv).
# REPS (default 5) rounds, each running every configuration once in turn, so that a load
# change on a shared machine hits all of them; BARS (default 2000) timed bars a run.
set -u
D=${1:-build/cross}
BARS=${BARS:-2000} REPS=${REPS:-5}
WINE=$(command -v wine64 2>/dev/null || ls /usr/lib/wine/wine64 2>/dev/null)
[ -n "$WINE" ] || { echo "bench: wine64 not found"; exit 1; }
case $D in /*) ;; *) D=$(pwd)/$D ;; esac
export WINEDEBUG=-all WINEPREFIX="${WINEPREFIX:-$D/wineprefix}"
"$WINE" cmd /c exit >/dev/null 2>&1
tmp=$(mktemp -d /tmp/mb_bench_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
PY=build/onnx-venv/bin/python
ort=0
if [ -x "$PY" ] && "$D/linux/make_live_case" "$tmp" 1 example > /dev/null &&
   "$D/linux/predict" --model "$tmp/model.safetensors" --to-onnx "$tmp/model.onnx" > /dev/null; then ort=1
else echo "onnxruntime: not run (no build/onnx-venv: make onnx-venv)"; fi
echo "bench_live, $BARS bars, 1 thread, F=12 H=32 (the example's model);$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$REPS"); do
    for mode in window stateful; do
        printf 'linux %-8s run %d: ' $mode "$r"; "$D/linux/bench_live" "$BARS" 12 32 1 $mode | grep 'per bar'
        printf 'wine  %-8s run %d: ' $mode "$r"; "$WINE" "$D/win/bench_live.exe" "$BARS" 12 32 1 $mode | tr -d '\r' | grep 'per bar'
    done
    [ $ort = 1 ] && { printf 'onnx  window   run %d: ' "$r"; "$PY" tests/cross/ort_bench.py "$tmp/model.onnx" 1000; }
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
