#!/usr/bin/env bash
# compare_multitf.sh - megabatch's multi-TF trainer vs the PyTorch peer (both pipelines),
# same HDF5 files, same shapes, same epochs; prints a table last.
#
#   bench/compare_multitf.sh [--gpu] [--train F --val F] [--bars N --features F --stride S]
#       [--epochs E --batch B --hidden H --head D --lr X --threads T --max-batches M]
#       [--precision f32|bf16|f16]   (megabatch's; default f32 on the CPU, f16 with --gpu,
#                                     like the peers' fp16 autocast)
#       [--rounds R] [--peers "seeds tuned"] [--no-ftz] [--coretypes "own Haswell Haswell:avx2"]
#       [--peer-isa avx2]
#
# CPU: both sides flush denormals (FTZ+DAZ: megabatch's default, torch.set_flush_denormal)
# and use --threads threads (default 1); --no-ftz turns flushing off on both sides
# (megabatch: train_multitf --no-ftz). R rounds (default
# 1) alternate megabatch and the peers (reversed order on even rounds); the table gives
# medians (min-max) of samples/s and of the per-round ratio megabatch / peer, and the
# load average before and after; the log starts with this script's command line. With
# --epochs 2 or more, samples/s is the steady state: the epochs after the first, on both sides
# (the first includes megabatch's wait for its loader's first chunk; the PyTorch tuned
# pipeline reads its data before its clock starts).
#
# CPU: megabatch runs once a round per OpenBLAS kernel of --coretypes (default "own
# Haswell"): "own" with OPENBLAS_CORETYPE unset (OpenBLAS's own pick for this CPU), any
# other word with OPENBLAS_CORETYPE set to it for that run alone; each gets its rows in
# the table, and its device line (OpenBLAS's core and megabatch's LSTM kernel: avx512,
# avx2 or c) is printed. The variable is never changed outside those runs. A word CORE:K
# also runs megabatch's own LSTM kernels K (train_multitf --cpu-kernel K: avx512, avx2, c;
# the same results): "Haswell:avx2" is what a CPU without AVX-512 runs, on this one.
# --peer-isa avx2 holds PyTorch to AVX2 as well (ATEN_CPU_CAPABILITY=avx2,
# MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2 for its runs): with --coretypes
# Haswell:avx2, both sides as on an AVX2 machine. Default: PyTorch's own pick.
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
epochs=2 batch=32 hidden=16 head=32 lr=2e-3 threads=1 maxb=0 prec= rounds=1 peers="seeds tuned" noftz=0 peerisa=
coretypes="own Haswell"
cmdline=$0
if [ $# -gt 0 ]; then cmdline+=$(printf ' %q' "$@"); fi
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
        --rounds) rounds=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --no-ftz) noftz=1; shift ;;
        --peer-isa) peerisa=$2; shift 2 ;;
        --coretypes) coretypes=$2; shift 2 ;;
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

echo "## command: $cmdline"
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
ftzflag=()
[ "$noftz" = 1 ] && ftzflag=(--no-ftz)
[ "$gpu" = 1 ] && ftzflag=()
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "## commit $(git rev-parse --short HEAD); $(uname -m), $(nproc) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "## ftz=$([ "$noftz" = 1 ] && echo off || echo on) threads=$threads (both sides); rounds=$rounds"
peerenv=()
case $peerisa in
    '') ;;
    avx2) peerenv=(env ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)
          echo "## PyTorch held to AVX2: ${peerenv[*]:1}" ;;
    *) echo "error: --peer-isa '$peerisa': only avx2" >&2; exit 2 ;;
esac
echo "## load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # name, round, command...: echo it, run it, keep its output
    local name=$1 r=$2; shift 2
    echo "## round $r $name: $*"
    "$@" 2>&1 | tee "$out/$name.$r.txt"
}
# megabatch with OpenBLAS's kernel ct: own (the variable unset) or OPENBLAS_CORETYPE=ct
corenv() { if [ "$1" = own ]; then echo "env -u OPENBLAS_CORETYPE"; else echo "env OPENBLAS_CORETYPE=$1"; fi; }
# a --coretypes word CORE[:K]: --cpu-kernel K for K given
mbkernel() { case $1 in *:*) echo "--cpu-kernel ${1#*:}" ;; esac; }
[ "$gpu" = 1 ] && coretypes=own
mbnames=()
for ct in $coretypes; do mbnames+=("megabatch_$ct"); done
names=("${mbnames[@]}")
for p in $peers; do names+=("torch_$p"); done
run_one() { # name, round
    case $1 in
        megabatch_*) # not --quiet: its device line names the kernels
            local w=${1#megabatch_}
            run "$1" "$2" $(corenv "${w%%:*}") "$mb" "${common[@]}" --precision "$prec" "${ftzflag[@]}" $(mbkernel "$w") ;;
        torch_*) run "$1" "$2" "${peerenv[@]}" "$py" bench/pytorch/multitf.py "${common[@]}" --pipeline "${1#torch_}" \
                     --device "$tdev" "${ftzflag[@]}" --quiet ;;
    esac
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order=("${names[@]}"); else order=(); for n in "${names[@]}"; do order=("$n" "${order[@]}"); done; fi
    for n in "${order[@]}"; do run_one "$n" "$r"; done
done
echo "## load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

field() { grep '^summary:' "$out/$1.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# samples/s in the steady state: with 2 or more epochs, over the epochs after the first (the
# harmonic mean of their per-epoch lines: the same batches an epoch), as neither side then reads
# data (megabatch's first epoch waits for its loader's first chunk, the whole file here, which
# the PyTorch tuned pipeline reads before its clock starts); with 1 epoch, the summary's rate
rate() {
    if [ "$epochs" -ge 2 ]; then
        sed -n 's/^epoch \([0-9]*\):.* \([0-9.]*\) samples\/s.*/\1 \2/p' "$out/$1.txt" |
            awk '$1 >= 2 && $2 > 0 { n++; s += 1 / $2 } END { if (n) printf "%.1f\n", n / s; else print 0 }'
    else field "$1" samples_per_s; fi
}
stat() { sort -g | awk -v f="$1" '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                                                      printf f " (" f "-" f ")", m, v[1], v[NR] }'; }
echo
[ "$epochs" -ge 2 ] && echo "## samples/s: steady state, epochs 2-$epochs (the first reads the data)" ||
    echo "## samples/s: the whole run (1 epoch: megabatch's includes waiting for its loader's first chunk)"
echo "## table ($tdev; epochs=$epochs batch=$batch hidden=$hidden head=$head threads=$threads" \
     "ftz=$([ "$noftz" = 1 ] && echo off || echo on); megabatch $prec; $rounds round(s): median (min-max))"
for m in "${mbnames[@]}"; do echo "## $m: $(grep -m1 '^device:' "$out/$m.1.txt")"; done
[ "$gpu" = 1 ] || for p in $peers; do echo "## torch_$p: $(grep -m1 -o 'cpu_isa=[A-Za-z0-9_]*' "$out/torch_$p.1.txt")"; done
printf '%-24s %-28s %12s %12s\n' pipeline samples/s val_loss baseline
for n in "${names[@]}"; do
    sps=$(for r in $(seq 1 "$rounds"); do rate "$n.$r"; done | stat %.1f)
    printf '%-24s %-28s %12s %12s\n' "$n" "$sps" "$(field "$n.1" val_loss)" "$(field "$n.1" baseline_val_loss)"
done
echo
printf '%-44s %-24s\n' "ratio (samples/s, per round)" "median (min-max)"
for m in "${mbnames[@]}"; do
    for n in "${names[@]}"; do
        case $n in megabatch_*) continue ;; esac
        rat=$(for r in $(seq 1 "$rounds"); do
                  awk -v a="$(rate "$m.$r")" -v b="$(rate "$n.$r")" \
                      'BEGIN { printf "%.3f\n", (b > 0 ? a / b : 0) }'
              done | stat %.2f)
        printf '%-44s %-24s\n' "$m / $n" "${rat}x"
    done
done
