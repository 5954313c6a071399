#!/bin/sh
# Same output, same files: runs build/train_multitf on a small synthetic set in several
# configurations and records, per run, its stdout and stderr (timings masked) and the sha256 of
# every file it wrote (the metrics CSV with its samples_per_s column cut). Run it before and
# after a change that must not change behaviour, then compare the two directories:
#   sh bench/train_multitf_same.sh build /tmp/before   # on the unchanged tree
#   sh bench/train_multitf_same.sh build /tmp/after    # after the change
#   diff -r /tmp/before /tmp/after && echo same
# Not run by CI (a few minutes of CPU); bench/results/2026-12-03-train-multitf-split.txt is its
# record for the split of train_multitf.c.
set -eu
B=$(cd "${1:?usage: train_multitf_same.sh BUILD_DIR OUT_DIR}" && pwd)
OUT=${2:?usage: train_multitf_same.sh BUILD_DIR OUT_DIR}
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$B/prepare" --synthetic --bars 30000 --features 2 --targets 3 --stride 40 --quiet \
    --out-train "$tmp/t.h5" --out-val "$tmp/v.h5"
T="$B/train_multitf --train $tmp/t.h5 --val $tmp/v.h5"
mask() { sed -E "s/[0-9.]+ samples\\/s/N samples\\/s/g; s/samples_per_s=[0-9.]+/samples_per_s=N/g; s|$tmp|TMP|g"; }

# CASE ARGS...: one run in an empty directory $tmp/CASE (the files it writes go there)
run() {
    name=$1; shift
    d="$tmp/$name"; mkdir -p "$d"
    rc=0
    (cd "$d" && $T "$@") > "$OUT/$name.out" 2> "$tmp/err" || rc=$?
    echo "exit $rc" >> "$OUT/$name.out"
    mask < "$tmp/err" >> "$OUT/$name.out"
    mask < "$OUT/$name.out" > "$tmp/o" && cp "$tmp/o" "$OUT/$name.out"
    for f in $(cd "$d" && ls | sort); do
        case $f in
        *.csv) cut -d, -f9 --complement "$d/$f" | sha256sum | sed "s|-|$name/$f (no samples_per_s)|" ;;
        *) (cd "$d" && sha256sum "$f") | sed "s|  |  $name/|" ;;
        esac
    done >> "$OUT/sha256.txt"
}
: > "$OUT/sha256.txt"
small="--batch 32 --hidden 6 --head 8"
run default --epochs 2 --metrics m.csv --export m.safetensors --export-onnx m.onnx --ckpt m.ckpt
run ema-best --epochs 3 $small --ema 0.9 --keep-best --export m.safetensors --export-onnx m.onnx
run swa-patience --epochs 4 $small --swa-start 2 --patience 1 --export m.safetensors
run walk --walk-forward 3 $small --export m.safetensors --export-onnx m.onnx
run dropout --epochs 2 $small --dropout 0.2 --layers 2 --export m.safetensors --metrics m.csv --plot p.svg
run f16 --epochs 2 $small --precision f16 --accum 2 --schedule onecycle --loss huber --carry --export m.safetensors
mkdir -p "$tmp/resume-b"
run resume-a --epochs 1 $small --carry --dropout 0.1 --ckpt ../resume-b/m.ckpt --ckpt-every 7 --metrics ../resume-b/m.csv
run resume-b --epochs 3 $small --carry --dropout 0.1 --ckpt m.ckpt --resume --metrics m.csv --export m.safetensors
run init --epochs 1 $small --init ../ema-best/m.safetensors --schedule constant --max-batches 5 --export m.safetensors
run bad-schedule --schedule linear
run bad-resume --epochs 2 --batch 32 --hidden 7 --head 8 --carry --dropout 0.1 --ckpt ../resume-b/m.ckpt --resume
run help --help
echo "train_multitf_same: $(ls "$OUT"/*.out | wc -l) runs, $(wc -l < "$OUT/sha256.txt") files"
