#!/usr/bin/env bash
# compare_multitf.sh - megabatch's multi-TF trainer vs the PyTorch peer (both pipelines),
# same HDF5 files, same shapes, same epochs; prints a table last.
#
#   bench/compare_multitf.sh [--gpu] [--train F --val F] [--bars N --features F --stride S]
#       [--epochs E --batch B --hidden H --head D --lr X --threads T --max-batches M]
#       [--precision f32|bf16|f16]   (megabatch's; default f32 on the CPU, f16 with --gpu,
#                                     like the peers' fp16 autocast)
#
# Without --train/--val it makes one synthetic dataset with build/prepare in $DATA_DIR
# (default /tmp/mb_compare_multitf). CPU: build/train_multitf, torch --device cpu.
# --gpu: build/train_multitf_cuda, torch --device cuda (autocast+GradScaler / fp16 tuned).
# Needs: build/prepare and build/train_multitf[_cuda] (make them first), python3 with
# torch and h5py. PYTHON overrides the interpreter, BIN_DIR the directory of prepare and
# train_multitf[_cuda] (default build; build/gpu for the GPU bundle). Ratio = megabatch
# samples/s / peer's.
set -euo pipefail
cd "$(dirname "$0")/.."

gpu=0 train= val= bars=60000 features=8 stride=30
epochs=2 batch=32 hidden=16 head=32 lr=2e-3 threads=2 maxb=0 prec=
while [ $# -gt 0 ]; do
    case "$1" in
        --gpu) gpu=1; shift ;;
        --train) train=$2; shift 2 ;;
        --val) val=$2; shift 2 ;;
        --bars) bars=$2; shift 2 ;;
        --features) features=$2; shift 2 ;;
        --stride) stride=$2; shift 2 ;;
        --epochs) epochs=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        --hidden) hidden=$2; shift 2 ;;
        --head) head=$2; shift 2 ;;
        --lr) lr=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --max-batches) maxb=$2; shift 2 ;;
        --precision) prec=$2; shift 2 ;;
        *) echo "error: unknown flag '$1' (see the header of $0)" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}

bin=${BIN_DIR:-build}
if [ "$gpu" = 1 ]; then mb=$bin/train_multitf_cuda; tdev=cuda; else mb=$bin/train_multitf; tdev=cpu; fi
[ -n "$prec" ] || { [ "$gpu" = 1 ] && prec=f16 || prec=f32; }
for b in "$bin/prepare" "$mb"; do
    [ -x "$b" ] || { echo "error: $b missing: run 'make $b' first" >&2; exit 2; }
done

if [ -z "$train" ]; then
    dir=${DATA_DIR:-/tmp/mb_compare_multitf}
    mkdir -p "$dir"
    train=$dir/train.h5 val=$dir/val.h5
    echo "## data: $bin/prepare --synthetic --bars $bars --features $features --stride $stride"
    "$bin/prepare" --synthetic --bars "$bars" --features "$features" --stride "$stride" \
        --out-train "$train" --out-val "$val"
fi
[ -n "$val" ] || { echo "error: --train needs --val" >&2; exit 2; }

common=(--train "$train" --val "$val" --epochs "$epochs" --batch "$batch" --hidden "$hidden"
        --head "$head" --lr "$lr" --threads "$threads" --max-batches "$maxb")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # name, command...: echo it, run it, keep its output
    local name=$1; shift
    echo "## $name: $*"
    "$@" --quiet 2>&1 | tee "$out/$name.txt"
}
run megabatch "$mb" "${common[@]}" --precision "$prec"
run torch_seeds "$py" bench/pytorch/multitf.py "${common[@]}" --pipeline seeds --device "$tdev"
run torch_tuned "$py" bench/pytorch/multitf.py "${common[@]}" --pipeline tuned --device "$tdev"

field() { grep '^summary:' "$out/$1.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
mbs=$(field megabatch samples_per_s)
echo
echo "## table ($tdev; epochs=$epochs batch=$batch hidden=$hidden head=$head threads=$threads; megabatch $prec)"
printf '%-12s %12s %12s %12s %18s\n' pipeline samples/s val_loss baseline megabatch/peer
for n in megabatch torch_seeds torch_tuned; do
    s=$(field $n samples_per_s)
    printf '%-12s %12s %12s %12s %18s\n' "$n" "$s" "$(field $n val_loss)" "$(field $n baseline_val_loss)" \
        "$(awk -v a="$mbs" -v b="$s" 'BEGIN { printf "%.2fx", (b > 0 ? a / b : 0) }')"
done
