#!/bin/sh
# run.sh [BUNDLE]: everything GPU-side in one call on a GPU machine (carry build/gpu, made
# here by `make gpu-bundle`):
#   1. every CUDA test (CUDA vs the CPU reference), then compute-sanitizer memcheck,
#      racecheck, initcheck and synccheck over each;
#   2. the multi-timeframe example on synthetic data (prepare, then train_multitf_cuda);
#   3. the loader benchmark on the GPU;
# and a pass/fail table last. Its whole output goes to bench/results/ (see docs/GPU.md).
set -u
dir=${1:-build/gpu}
nvidia-smi -L || echo "nvidia-smi: no GPU"
echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
table=""
row() { table="$table$(printf '%-44s %s' "$1" "$2")\n"; }
for t in "$dir"/test_cuda_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== $name"
    if "$t"; then row "$name" PASS; else row "$name" FAIL; fi
    command -v compute-sanitizer >/dev/null 2>&1 || continue
    [ "$name" = test_cuda_poison ] && continue # its illegal access is the point: no sanitizer
    for tool in memcheck racecheck initcheck synccheck; do
        if compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" >/tmp/cs.log 2>&1; then
            row "  $tool" PASS
        else
            row "  $tool" "FAIL (see log)"
            tail -n 40 /tmp/cs.log
        fi
    done
done
if [ -x "$dir/prepare" ] && [ -x "$dir/train_multitf_cuda" ]; then
    echo "== multi-timeframe example"
    mkdir -p /tmp/mbdata
    "$dir/prepare" --synthetic --bars 400000 --features 8 --stride 15 --quiet \
        --out-train /tmp/mbdata/train.h5 --out-val /tmp/mbdata/val.h5
    for prec in f32 bf16 f16; do
        if "$dir/train_multitf_cuda" --train /tmp/mbdata/train.h5 --val /tmp/mbdata/val.h5 --epochs 3 --quiet \
            --precision $prec | tee /tmp/train.log; then
            row "train_multitf_cuda $prec" "$(grep '^summary:' /tmp/train.log | cut -c1-80)"
        else row "train_multitf_cuda $prec" FAIL; fi
    done
fi
if [ -x "$dir/bench_loader_cuda" ]; then
    echo "== loader benchmark"
    if "$dir/bench_loader_cuda" --gpu --file /tmp/bench_loader.h5; then row bench_loader_cuda ran; else row bench_loader_cuda FAIL; fi
fi
printf '\n%-44s %s\n' "binary / check" result
printf "$table"
printf "$table" | grep -q FAIL && exit 1
exit 0
