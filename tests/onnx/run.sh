#!/bin/sh
# The ONNX export under onnxruntime (docs/TRADING.md, "ONNX"): make onnx-test, a manual check
# (not in make test, which needs no Python; .ci/run's stage onnx runs it):
#   - an MT5-format CSV of 13,000 synthetic M1 bars (seeded), prepared in the window and the
#     series layout (F = 12, stride 3: a few hundred samples);
#   - four models, covering both layouts, 1 and 2 LSTM layers, f32 and bf16 training (the
#     first at the benchmark's H = 32, head 64, for its time per sample; the others smaller):
#     train_multitf --export-onnx writes the file, and predict --to-onnx of its safetensors
#     export writes the same bytes;
#   - for each model, tests/onnx/check.py: onnx.checker.check_model (full check), the
#     declared input and output, then onnxruntime on the first 300 samples of the window
#     file and of the series file (raw windows from build/tests/onnx_inputs) equals
#     build/predict on that file, and on the raw windows of the CSV's last 16 bars equals the
#     live predictor (mtf_live.h), each at batch 1 and 64, within 1e-5 relative (each
#     sample's K predictions in the max norm);
#   - PyTorch's golden model (tests/golden) through predict --to-onnx: onnxruntime gives
#     PyTorch's predictions.
# Seeded by MB_TEST_SEED (else the clock; printed). Skips (a `skipped:` line, counted by
# tests/run.sh) when build/onnx-venv cannot import onnx and onnxruntime (make onnx-venv
# installs them); with CI=true that fails instead. Closes with "onnx: N passed, N failed".
set -eu
cd "$(dirname "$0")/../.." || exit 2
B=${BUILD:-build} V=${ONNX_VENV:-build/onnx-venv}
py=$V/bin/python
if ! "$py" -c 'import onnx, onnxruntime, numpy' >/dev/null 2>&1; then
    why="$V cannot import onnx, onnxruntime and numpy (make onnx-venv installs them from PyPI)"
    [ -f "$V.log" ] && why="$why; its last try ended: $(tail -n 1 "$V.log")"
    if [ "${CI:-}" = true ]; then
        echo "FAIL: $why (CI=true: the onnx stage ran nothing)"
        echo "onnx: 0 passed, 1 failed"
        exit 1
    fi
    echo "skipped: $why"
    echo "onnx: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
for f in prepare train_multitf predict tests/onnx_inputs; do
    [ -x "$B/$f" ] || { bad "$B/$f is not built (make onnx-test builds it)"; echo "onnx: $pass passed, $fail failed"; exit 1; }
done
seed=${MB_TEST_SEED:-$(date +%s)}
seed=$(printf '%s' "$seed" | tail -c 9 | sed 's/^0*//'); seed=${seed:-0} # prepare and train take < 4e9
echo "MB_TEST_SEED=$seed"
t0=$(date +%s)
dir=$(mktemp -d /tmp/mb_onnx_XXXXXX)
trap 'rm -rf "$dir"' EXIT
run() { # WHAT COMMAND...: run it, its output kept; a failure counted
    what=$1; shift
    "$@" >"$dir/out.log" 2>&1 || { cat "$dir/out.log"; bad "$what: $*"; return 1; }
}
run "the CSV" "$B/prepare" --synthetic --bars 13000 --seed "$seed" --write-mt5 "$dir/bars.csv" --quiet &&
for layout in window series; do
    run "prepare $layout" "$B/prepare" --csv "$dir/bars.csv" --features 12 --stride 3 --layout $layout \
        --out-train "$dir/$layout.h5" --out-val "$dir/$layout.val.h5" || break
done
check() { # MODEL.onnx ARGS...: tests/onnx/check.py, its ok/FAIL lines counted
    rc=0
    "$py" tests/onnx/check.py "$@" >"$dir/check.log" 2>&1 || rc=$?
    sed "s|$dir/||g" "$dir/check.log"
    pass=$((pass + $(grep -c '^ok ' "$dir/check.log" || true))); fail=$((fail + $(grep -c '^FAIL ' "$dir/check.log" || true)))
    [ $rc -eq 0 ] || grep -q '^FAIL ' "$dir/check.log" || bad "check.py $1 exited $rc"
}
[ -f "$dir/series.h5" ] || { echo "onnx: $pass passed, $fail failed"; exit 1; }
grep -h 'samples' "$dir/out.log" || true
n=300
for m in "window 1 f32 32 64" "window 2 bf16 8 16" "series 1 bf16 8 16" "series 2 f32 8 16"; do
    set -- $m
    name=$1-layers$2-$3-H$4 d=$dir/$1-layers$2-$3-H$4
    run "train $name" "$B/train_multitf" --train "$dir/$1.h5" --val "$dir/$1.val.h5" --layers "$2" --precision "$3" \
        --seed "$seed" --epochs 1 --max-batches 4 --batch 32 --hidden "$4" --head "$5" --quiet \
        --export "$d.safetensors" --export-onnx "$d.onnx" || continue
    run "predict --to-onnx $name" "$B/predict" --model "$d.safetensors" --to-onnx "$d.again.onnx" --quiet &&
    if cmp -s "$d.onnx" "$d.again.onnx"; then ok "$name: predict --to-onnx writes train_multitf --export-onnx's bytes"
    else bad "$name: predict --to-onnx and train_multitf --export-onnx differ"; fi
    args=""
    for layout in window series; do
        run "predict $name $layout" "$B/predict" --model "$d.safetensors" --data "$dir/$layout.h5" --out "$d.$layout.csv" --quiet &&
        run "inputs $name $layout" "$B/tests/onnx_inputs" data "$d.safetensors" "$dir/$layout.h5" $n "$d.$layout.f32" &&
        args="$args --data $d.$layout.f32 $d.$layout.csv $layout-layout"
    done
    run "live $name" "$B/tests/onnx_inputs" live "$d.safetensors" "$dir/bars.csv" 16 "$d.live.f32" "$d.live.pred" &&
    args="$args --live $d.live.f32 $d.live.pred"
    # shellcheck disable=SC2086
    check "$d.onnx" --layers "$2" $args
done
run "predict --to-onnx golden" "$B/predict" --model tests/golden/multitf_torch.safetensors --to-onnx "$dir/torch.onnx" --quiet &&
check "$dir/torch.onnx" --layers 1 --golden tests/golden/multitf_torch_io.safetensors
echo "onnx: took $(( $(date +%s) - t0 )) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
echo "onnx: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
