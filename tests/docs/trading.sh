#!/bin/sh
# docs/TRADING.md's first block, run as written (make test) in a temporary directory with
# build/ linked in, then what it made checked: the sample MT5 export, the data, the weights,
# a prediction per validation sample, and a line per bar of the live replay with predictions
# after the warm-up and no bar refused, an ONNX file. Ends with `trading: N passed, N failed`.
set -eu
cd "$(dirname "$0")/../.." || exit 2
root=$(pwd) tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ln -s "$root/build" "$tmp/build" && cd "$tmp" || exit 2
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else echo "FAIL: $1"; fail=$((fail + 1)); fi; }
block() {
    # snippet: trading-start
    build/prepare --synthetic --bars 16000 --write-mt5 EURUSD_M1.csv   # a sample MT5 export (yours: from MetaTrader)
    build/prepare --csv EURUSD_M1.csv --features 12              # data/train.h5, data/val.h5 (docs/PREPARE.md)
    build/train_multitf --epochs 4 --export model.safetensors --export-onnx model.onnx  # train, then write the model
    build/predict --model model.safetensors --data data/val.h5 --out preds.csv
    build/predict --model model.safetensors --csv EURUSD_M1.csv --live > lines.csv
    # end snippet
}
rc=0
(set -e; block) > out.log 2>&1 || rc=$?
check "the block ran (exit $rc): $(tail -n 3 out.log)" '[ $rc -eq 0 ] && grep -q "^live: " out.log'
check "EURUSD_M1.csv is an MT5 export of 16000 bars" \
    '[ "$(head -n 1 EURUSD_M1.csv | cut -f 1-2)" = "$(printf "<DATE>\t<TIME>")" ] && [ "$(wc -l < EURUSD_M1.csv)" -eq 16001 ]'
val=$(sed -n 's/.* \([0-9]*\) val samples.*/\1/p' out.log)
check "preds.csv has a row per validation sample ($val)" '[ -n "$val" ] && [ "$(wc -l < preds.csv)" -eq $((val + 1)) ]'
check "lines.csv has a line per bar" '[ "$(wc -l < lines.csv)" -eq 16000 ]'
check "the live replay predicted after the warm-up and refused no bar" \
    'grep -q ",ok," lines.csv && ! grep -q ",refused" lines.csv && grep -q " 0 refused" out.log'
check "model.safetensors carries the normalisation" 'grep -q "\"feature_std\":\"[-0-9]" model.safetensors'
check "model.onnx is an ONNX file (ir_version 7 first, the input named features)" \
    '[ "$(head -c 2 model.onnx | od -An -tx1 | tr -d " ")" = 0807 ] && grep -q features model.onnx'
echo "trading: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
