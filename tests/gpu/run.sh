#!/bin/sh
# run.sh [BUNDLE]: everything GPU-side in one call on a GPU machine (carry build/gpu, made
# here by `make gpu-bundle`):
#   1. every CUDA test (CUDA vs the CPU reference), then compute-sanitizer memcheck,
#      racecheck, initcheck and synccheck over each;
#   2. the multi-timeframe example on synthetic data (prepare, then train_multitf_cuda);
#   3. the loader benchmark on the GPU;
#   4. one LSTM layer (B=128 T=480 F=128 H=256): megabatch f32/bf16/f16 vs PyTorch cuDNN
#      (f32 and fp16 autocast), and the whole multi-TF step vs both PyTorch pipelines
#      (bench/compare_multitf.sh --gpu), when python3 has torch;
#   5. the latency model measured (docs/BENCHMARKS.md "Latency model"): ms per training step of
#      the example at its default shape (B 128, H 32, head 64) with F 12 and the seeds' F 128,
#      f32 and bf16, next to the tuned PyTorch cuDNN pipeline at the same shapes;
# and a pass/fail table last. Its whole output goes to bench/results/ (see docs/GPU.md).
# run.sh BUNDLE PARTS: only some parts (a device call has 10 minutes), a comma list of
# tests,sanitize,example,loader,lstm,compare,latency (default: all).
set -u
dir=${1:-build/gpu}
parts=${2:-tests,sanitize,example,loader,lstm,compare,latency}
want() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
logrun() { # FILE CMD...: run CMD with its output in FILE and on stdout; CMD's exit status
    log=$1; shift
    "$@" >"$log" 2>&1; rc=$?
    cat "$log"
    return $rc
}
nvidia-smi -L || echo "nvidia-smi: no GPU"
echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
table=""
row() { table="$table$(printf '%-44s %s' "$1" "$2")\n"; }
for t in "$dir"/test_cuda_*; do
    [ -x "$t" ] && want tests || continue
    name=$(basename "$t")
    echo "== $name"
    if "$t"; then row "$name" PASS; else row "$name" FAIL; fi
    command -v compute-sanitizer >/dev/null 2>&1 && want sanitize || continue
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
if [ -x "$dir/prepare" ] && [ -x "$dir/train_multitf_cuda" ] && want example; then
    echo "== multi-timeframe example"
    mkdir -p /tmp/mbdata
    "$dir/prepare" --synthetic --bars 400000 --features 8 --stride 15 --quiet \
        --out-train /tmp/mbdata/train.h5 --out-val /tmp/mbdata/val.h5
    for prec in f32 bf16 f16; do
        if logrun /tmp/train.log "$dir/train_multitf_cuda" --train /tmp/mbdata/train.h5 --val /tmp/mbdata/val.h5 \
            --epochs 3 --quiet --precision $prec; then
            row "train_multitf_cuda $prec" "$(grep '^summary:' /tmp/train.log | cut -c1-80)"
        else row "train_multitf_cuda $prec" FAIL; fi
    done
fi
if [ -x "$dir/bench_loader_cuda" ] && want loader; then
    echo "== loader benchmark"
    if "$dir/bench_loader_cuda" --gpu --file /tmp/bench_loader.h5; then row bench_loader_cuda ran; else row bench_loader_cuda FAIL; fi
fi
if [ -x "$dir/bench_lstm_cuda" ] && want lstm; then
    echo "== LSTM layer benchmark"
    for prec in f32 bf16 f16; do
        if logrun /tmp/lstm.log "$dir/bench_lstm_cuda" 128 480 128 256 5 $prec; then
            row "bench_lstm_cuda $prec (us/step full, ckpt)" "$(grep -o 'fwd+bwd *[0-9.]*' /tmp/lstm.log | awk '{print $2}' | paste -sd' ')"
        else row "bench_lstm_cuda $prec" FAIL; fi
    done
fi
if python3 -c 'import torch, h5py; assert torch.cuda.is_available()' 2>/dev/null; then
    want lstm && for amp in "" --amp; do
        if logrun /tmp/tlstm.log python3 bench/pytorch/lstm.py 128 480 128 256 5 --device cuda $amp; then
            row "torch nn.LSTM ${amp:-f32} (us/step)" "$(grep -o 'fwd+bwd *[0-9.]*' /tmp/tlstm.log | awk '{print $2}')"
        else row "torch nn.LSTM ${amp:-f32}" FAIL; fi
    done
    if want compare && [ -x "$dir/train_multitf_cuda" ]; then
        if logrun /tmp/cmp.log env BIN_DIR="$dir" bash bench/compare_multitf.sh --gpu --bars 400000 --stride 15 \
            --epochs 3 --batch 128 --hidden 64 --head 64; then
            row "compare_multitf --gpu (megabatch/peers)" "$(awk '/^torch_/ {printf "%s %s  ", $1, $5}' /tmp/cmp.log)"
        else row "compare_multitf --gpu" FAIL; fi
    fi
fi
if [ -x "$dir/prepare" ] && [ -x "$dir/train_multitf_cuda" ] && want latency; then
    echo "== latency model, measured (ms per training step = 1000 * batch / samples_per_s)"
    ms() { sed -n 's/^summary:.* samples_per_s=\([0-9.]*\).*/\1/p' "$1" | awk '$1 > 0 { printf "%.2f", 128000 / $1 }'; }
    for F in 12 128; do
        mkdir -p /tmp/mblat
        "$dir/prepare" --synthetic --bars 120000 --features $F --stride 15 --quiet \
            --out-train /tmp/mblat/train.h5 --out-val /tmp/mblat/val.h5 || { row "latency F=$F data" FAIL; continue; }
        for prec in f32 bf16; do
            if logrun /tmp/lat.log "$dir/train_multitf_cuda" --train /tmp/mblat/train.h5 --val /tmp/mblat/val.h5 \
                --epochs 2 --batch 128 --hidden 32 --head 64 --precision $prec --quiet; then
                row "latency F=$F $prec (ms/step)" "$(ms /tmp/lat.log) $(grep -o 'launches_per_step=[0-9.]*' /tmp/lat.log)"
            else row "latency F=$F $prec" FAIL; fi
        done
        if python3 -c 'import torch, h5py; assert torch.cuda.is_available()' 2>/dev/null; then
            if logrun /tmp/latt.log python3 bench/pytorch/multitf.py --train /tmp/mblat/train.h5 --val /tmp/mblat/val.h5 \
                --pipeline tuned --epochs 2 --batch 128 --hidden 32 --head 64 --device cuda --quiet; then
                row "latency F=$F torch cuDNN tuned (ms/step)" "$(ms /tmp/latt.log)"
            else row "latency F=$F torch cuDNN tuned" FAIL; fi
        fi
    done
fi
printf '\n%-44s %s\n' "binary / check" result
printf "$table"
printf "$table" | grep -q FAIL && exit 1
exit 0
