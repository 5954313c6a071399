#!/bin/sh
# run.sh [BUNDLE [PARTS [RESULTS]]]: the GPU side in one call on a bare GPU machine (carry
# BUNDLE, default build/gpu, made here by `make gpu-bundle CUDA_ARCHS=90`). PARTS is a comma
# list, or `default` (the default) or `all`; every part writes its logs under RESULTS
# (default $MB_GPU_RESULTS, else /tmp/mb-gpu-results: give the caller's $OUT to bring them
# back). The last lines of output are the pass/fail table; the exit status is 1 when a row
# failed. Parts, with their time on an H100 estimated from the 2026-11-26 run's logs
# (../shared/gpu-runs/2026-11-26, bench/results/2026-11-26-h100):
#   ldd       every bundled binary's libraries resolve (no "not found")                   ~1 s
#   tests     every CUDA test; on a machine with a GPU a cmocka SKIPPED is a FAIL    ~60 s
#   sanitize  compute-sanitizer memcheck, racecheck, initcheck, synccheck over each test
#             (5 runs of 3 tests took 45 s there: 40 runs ~6 min; not in default)
#   example   the multi-timeframe example, f32/bf16/f16, 3 epochs on 400,000 bars       ~40 s
#   loader    the loader benchmark (a 1 GB file written, then read)                      ~25 s
#   lstm      one LSTM layer, B=128 T=480: H=256 F=128 and H=32 F=12, megabatch f32/bf16/f16;
#             F=128 bf16 at H=32..256 with the path the library chooses and forced ones
#             (MB_FUSED_BLOCKS); torch nn.LSTM (f32, fp16 autocast) at H=256, 32 (F=12, 128)
#             and 128 (29 s for 12 runs there)                                            ~70 s
#   compare   bench/compare_multitf.sh --gpu (both PyTorch pipelines; not in default)   ~90 s
#   latency   the example's ms/step at H=32, F=12 and 128, f32/bf16, and torch's          ~90 s
#   profile   ncu: kernel durations (gpu__time_duration.sum) over 4 training steps at F=128
#             B=128 H=32 bf16, and the WarpStateStats/SchedulerStats/Occupancy (and speed of
#             light, memory) sections of each fused kernel, -c 1 each (2 x ncu ~15 s and
#             2 x ~5 s there)                                                            ~45 s
#   sizes     the whole training step at H=32, 64, 128, 256 (F=128, B=128, head 64, bf16,
#             series layout: 5,776 training samples) against the PyTorch tuned pipeline,
#             alternating per size, 4 epochs each; steady state = epochs 2..4 (40 s for two
#             sizes' pairs there, plus torch's start-up; MB_GPU_SIZES="128 256" picks sizes) ~150 s
# default = ldd,tests,example,lstm,profile,sizes: about 6 minutes, inside a 10-minute call.
set -u
dir=${1:-build/gpu}
parts=${2:-default}
res=${3:-${MB_GPU_RESULTS:-/tmp/mb-gpu-results}}
case "$parts" in
    default) parts=ldd,tests,example,lstm,profile,sizes ;;
    all) parts=ldd,tests,sanitize,example,loader,lstm,compare,latency,profile,sizes ;;
esac
want() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
mkdir -p "$res" || exit 1
res=$(cd "$res" && pwd)
tmp=${TMPDIR:-/tmp}/mb-gpu-data
mkdir -p "$tmp"
logrun() { # FILE CMD...: run CMD with its output in FILE and on stdout; CMD's exit status
    log=$1; shift
    "$@" >"$log" 2>&1; rc=$?
    cat "$log"
    return $rc
}
stamp() { echo "== $1 $(date -u +%H:%M:%S)"; }
gpu=0
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=1; nvidia-smi -L; else echo "nvidia-smi: no GPU"; fi
echo "bundle built from: $(cat "$dir/COMMIT" 2>/dev/null || echo unknown)" # not the device copy's git
echo "parts: $parts; results: $res"
table=""
row() { table="$table$(printf '%-48s %s' "$1" "$2")\n"; }
torch_ok=0
python3 -c 'import torch, h5py; assert torch.cuda.is_available()' 2>/dev/null && torch_ok=1

# ---- ldd: the bundle loads here (DT_RPATH $ORIGIN/lib, docs/GPU.md) ----
if want ldd; then
    stamp "ldd: every bundled binary's libraries resolve"
    mkdir -p "$res/ldd"
    miss=""
    for b in "$dir"/*; do
        [ -f "$b" ] && [ -x "$b" ] || continue
        n=$(basename "$b")
        if command -v ldd >/dev/null 2>&1; then ldd "$b" >"$res/ldd/$n.txt" 2>&1
        else LD_TRACE_LOADED_OBJECTS=1 "$b" >"$res/ldd/$n.txt" 2>&1; fi
        nf=$(awk '/not found/ {printf "%s%s", s, $1; s = ","}' "$res/ldd/$n.txt")
        [ -z "$nf" ] || { miss="$miss $n($nf)"; cat "$res/ldd/$n.txt"; }
    done
    if [ -z "$miss" ]; then row "ldd: every bundled binary's libraries" PASS
    else row "ldd: every bundled binary's libraries" "FAIL not found:$miss"; fi
fi

# ---- tests (+ sanitize) ----
for t in "$dir"/test_cuda_*; do
    [ -x "$t" ] && { want tests || want sanitize; } || continue
    name=$(basename "$t")
    if want tests; then
        stamp "$name"
        mkdir -p "$res/tests"
        if logrun "$res/tests/$name.log" "$t"; then
            if [ $gpu = 1 ] && grep -q 'SKIPPED' "$res/tests/$name.log"; then
                row "$name" "FAIL (a test skipped on a machine with a GPU)"
            else row "$name" PASS; fi
        else row "$name" FAIL; fi
    fi
    command -v compute-sanitizer >/dev/null 2>&1 && want sanitize || continue
    [ "$name" = test_cuda_poison ] && continue # its illegal access is the point: no sanitizer
    mkdir -p "$res/sanitize"
    for tool in memcheck racecheck initcheck synccheck; do
        if compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" >"$res/sanitize/$name-$tool.log" 2>&1; then
            row "  $name $tool" PASS
        else
            row "  $name $tool" "FAIL (sanitize/$name-$tool.log)"
            tail -n 40 "$res/sanitize/$name-$tool.log"
        fi
    done
done

# ---- example ----
if [ -x "$dir/prepare" ] && [ -x "$dir/train_multitf_cuda" ] && want example; then
    stamp "multi-timeframe example"
    mkdir -p "$tmp/ex" "$res/example"
    "$dir/prepare" --synthetic --bars 400000 --features 8 --stride 15 --quiet \
        --out-train "$tmp/ex/train.h5" --out-val "$tmp/ex/val.h5"
    for prec in f32 bf16 f16; do
        if logrun "$res/example/$prec.log" "$dir/train_multitf_cuda" --train "$tmp/ex/train.h5" --val "$tmp/ex/val.h5" \
            --epochs 3 --quiet --precision $prec; then
            row "train_multitf_cuda $prec" "$(grep '^summary:' "$res/example/$prec.log" | cut -c1-80)"
        else row "train_multitf_cuda $prec" FAIL; fi
    done
fi

# ---- loader ----
if [ -x "$dir/bench_loader_cuda" ] && want loader; then
    stamp "loader benchmark"
    if logrun "$res/loader.log" "$dir/bench_loader_cuda" --gpu --file "$tmp/bench_loader.h5"; then
        row bench_loader_cuda ran
    else row bench_loader_cuda FAIL; fi
    rm -f "$tmp/bench_loader.h5"
fi

# ---- lstm: one layer (the latency model's one-layer points: docs/BENCHMARKS.md) ----
if [ -x "$dir/bench_lstm_cuda" ] && want lstm; then
    stamp "LSTM layer benchmark"
    mkdir -p "$res/lstm"
    for shape in "128 256" "12 32"; do
        set -- $shape
        for prec in f32 bf16 f16; do
            [ "$2" = 32 ] && [ $prec = f16 ] && continue
            if logrun "$res/lstm/F$1-H$2-$prec.log" "$dir/bench_lstm_cuda" 128 480 $1 $2 5 $prec; then
                row "bench_lstm_cuda F=$1 H=$2 $prec (us/step full, ckpt)" \
                    "$(grep -o 'fwd+bwd *[0-9.]*' "$res/lstm/F$1-H$2-$prec.log" | awk '{print $2}' | paste -sd' ')"
            else row "bench_lstm_cuda F=$1 H=$2 $prec" FAIL; fi
        done
    done
    # the fused recurrence's sizes and paths (issue 24): bf16 F=128 at H=32..256 as the library
    # chooses, H=128 with 1 and 2 blocks a row tile and H=256 on the per-step gemms (MB_FUSED_BLOCKS,
    # bench/bench_lstm.c), f32 at H=64
    for run in "32 0 bf16" "64 0 bf16" "128 0 bf16" "128 1 bf16" "128 2 bf16" "256 -1 bf16" "64 0 f32"; do
        set -- $run
        log="$res/lstm/F128-H$1-fb$2-$3.log"
        if logrun "$log" env MB_FUSED_BLOCKS=$2 "$dir/bench_lstm_cuda" 128 480 128 $1 5 $3; then
            row "bench_lstm_cuda F=128 H=$1 $3 fused_blocks=$2 (full)" \
                "$(head -n 1 "$log" | sed -n 's/.*fused=\([-0-9]*\) *fwd *\([0-9.]*\).*fwd+bwd *\([0-9.]*\).*/fused=\1 fwd \2 fwd+bwd \3/p')"
        else row "bench_lstm_cuda F=128 H=$1 $3 fused_blocks=$2" FAIL; fi
    done
    [ $torch_ok = 1 ] && for shape in "128 256" "12 32" "128 32" "128 128"; do
        set -- $shape
        for amp in "" --amp; do
            log="$res/lstm/torch-F$1-H$2${amp:-f32}.log"
            if logrun "$log" python3 bench/pytorch/lstm.py 128 480 $1 $2 5 --device cuda $amp; then
                row "torch nn.LSTM F=$1 H=$2 ${amp:-f32} (us/step)" "$(grep -o 'fwd+bwd *[0-9.]*' "$log" | awk '{print $2}')"
            else row "torch nn.LSTM F=$1 H=$2 ${amp:-f32}" FAIL; fi
        done
    done
fi

# ---- compare: the whole step vs both PyTorch pipelines ----
if want compare && [ $torch_ok = 1 ] && [ -x "$dir/train_multitf_cuda" ]; then
    stamp "compare_multitf --gpu"
    if logrun "$res/compare.log" env BIN_DIR="$dir" DATA_DIR="$tmp/cmp" bash bench/compare_multitf.sh --gpu \
        --bars 400000 --stride 15 --epochs 3 --batch 128 --hidden 64 --head 64; then
        row "compare_multitf --gpu (megabatch/peers)" "$(awk '/^torch_/ {printf "%s %s  ", $1, $5}' "$res/compare.log")"
    else row "compare_multitf --gpu" FAIL; fi
fi

# ---- latency: the example's ms per step at its default shape (1000 * batch / samples_per_s) ----
if [ -x "$dir/prepare" ] && [ -x "$dir/train_multitf_cuda" ] && want latency; then
    stamp "latency: ms per training step, whole run"
    mkdir -p "$res/latency"
    ms() { sed -n 's/^summary:.* samples_per_s=\([0-9.]*\).*/\1/p' "$1" | awk '$1 > 0 { printf "%.2f", 128000 / $1 }'; }
    for F in 12 128; do
        mkdir -p "$tmp/lat"
        "$dir/prepare" --synthetic --bars 120000 --features $F --stride 15 --quiet \
            --out-train "$tmp/lat/train.h5" --out-val "$tmp/lat/val.h5" || { row "latency F=$F data" FAIL; continue; }
        for prec in f32 bf16; do
            if logrun "$res/latency/F$F-$prec.log" "$dir/train_multitf_cuda" --train "$tmp/lat/train.h5" \
                --val "$tmp/lat/val.h5" --epochs 2 --batch 128 --hidden 32 --head 64 --precision $prec --quiet; then
                row "latency F=$F $prec (ms/step)" "$(ms "$res/latency/F$F-$prec.log")"
            else row "latency F=$F $prec" FAIL; fi
        done
        [ $torch_ok = 1 ] || continue
        if logrun "$res/latency/F$F-torch.log" python3 bench/pytorch/multitf.py --train "$tmp/lat/train.h5" \
            --val "$tmp/lat/val.h5" --pipeline tuned --epochs 2 --batch 128 --hidden 32 --head 64 --device cuda --quiet; then
            row "latency F=$F torch cuDNN tuned (ms/step)" "$(ms "$res/latency/F$F-torch.log")"
        else row "latency F=$F torch cuDNN tuned" FAIL; fi
    done
fi

# ---- profile and sizes: F=128 series-layout data (quicker to prepare than the window layout) ----
series_data() {
    [ -f "$tmp/s128/train.h5" ] && return 0
    mkdir -p "$tmp/s128"
    "$dir/prepare" --synthetic --bars 120000 --features 128 --stride 15 --layout series --quiet \
        --out-train "$tmp/s128/train.h5" --out-val "$tmp/s128/val.h5"
}
TRAIN_ARGS="--batch 128 --head 64 --precision bf16"

if want profile && [ -x "$dir/train_multitf_cuda" ]; then
    stamp "profile: ncu over 4 training steps, F=128 B=128 H=32 bf16 (series layout)"
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    if [ -z "$ncu" ]; then row "profile (ncu)" "FAIL (no ncu)"
    elif ! series_data; then row "profile data" FAIL
    else
        mkdir -p "$res/profile"
        run="$dir/train_multitf_cuda --train $tmp/s128/train.h5 --val $tmp/s128/val.h5 --epochs 1 --max-batches 4 \
--hidden 32 $TRAIN_ARGS"
        if "$ncu" --metrics gpu__time_duration.sum --print-summary per-kernel --csv $run \
            >"$res/profile/ncu-F128.csv" 2>"$res/profile/ncu-F128.err"; then
            # per kernel: launches, ms in all, us per launch; the fused kernels also per timestep (T=480)
            awk -F'","' '$11 == "gpu__time_duration.sum" { split($4, nm, "("); k = nm[1]; sub(/^void /, "", k)
                    gsub(/,/, "", $15); gsub(/"/, "", $15); n[k] += $9; t[k] += $9 * $15 }
                END { for (k in n) printf "%10.3f ms %6d launches %10.1f us/launch  %s\n", t[k] / 1e6, n[k], t[k] / n[k] / 1e3, k }' \
                "$res/profile/ncu-F128.csv" | sort -rn >"$res/profile/kernels.txt"
            head -n 8 "$res/profile/kernels.txt"
            for k in fwd:6.4 bwd:3.8; do # T=480 the longest encoder; 2026-11-26: fwd 6.4, bwd 3.8 (75136a4)
                us=$(awk -v k="mb__k_lstm_fused_${k%:*}" 'index($0, k) { printf "%.2f", $5 / 480; exit }' "$res/profile/kernels.txt")
                row "profile fused ${k%:*}, us/timestep (ncu; was ${k#*:})" "${us:-FAIL (not found)}"
            done
        else row "profile ncu kernel durations" "FAIL (profile/ncu-F128.err)"; tail -n 20 "$res/profile/ncu-F128.err"; fi
        for k in fwd bwd; do
            if "$ncu" --kernel-name "regex:mb__k_lstm_fused_$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
                --section WarpStateStats --section SchedulerStats --section Occupancy $run \
                >"$res/profile/ncu-fused-$k.txt" 2>&1; then
                row "profile fused $k sections (cycles/issue, occ.)" "$(awk '/Warp Cycles Per Issued Instruction/ {c = $NF}
                    /Achieved Occupancy/ {o = $NF} END {printf "%s %s", c, o}' "$res/profile/ncu-fused-$k.txt")"
            else row "profile fused $k sections" "FAIL (profile/ncu-fused-$k.txt)"; fi
        done
    fi
fi

if want sizes && [ -x "$dir/train_multitf_cuda" ]; then
    stamp "sizes: whole step, F=128 B=128 head 64 bf16, series layout, 4 epochs, steady state = epochs 2..4"
    if ! series_data; then row "sizes data" FAIL
    else
        mkdir -p "$res/sizes"
        # steady ms/step from the epoch lines: cumulative samples/s S_e = e N / t_e (training
        # time since the first epoch), so t_e = e N / S_e and a step of epochs 2..E takes
        # (t_E - t_1) / ((E - 1) x steps per epoch); N from the data: line
        steady() {
            awk '/^data:/ { for (i = 1; i <= NF; i++) if ($i ~ /^N=/) n = substr($i, 3) }
                /^epoch [0-9]+:/ { e = $2 + 0; s[e] = $(NF - 1) + 0
                    for (i = 1; i < NF; i++) if ($i == "samples/s") s[e] = $(i - 1) + 0
                    if (e == 1) spe = $4; last = e }
                END { if (last < 2 || !n || !s[1] || !s[last]) exit 1
                      printf "%.2f", 1000 * n * (last / s[last] - 1 / s[1]) / ((last - 1) * spe) }' "$1"
        }
        sizes_table="$(printf '%-6s %16s %16s %22s' H "ours ms/step" "torch ms/step" "speed (torch/ours)")"
        for H in ${MB_GPU_SIZES:-32 64 128 256}; do
            o=- p=-
            if logrun "$res/sizes/H$H-ours.log" "$dir/train_multitf_cuda" --train "$tmp/s128/train.h5" \
                --val "$tmp/s128/val.h5" --epochs 4 --hidden $H $TRAIN_ARGS >/dev/null; then
                o=$(steady "$res/sizes/H$H-ours.log") || o=-
            fi
            if [ $torch_ok = 1 ] && logrun "$res/sizes/H$H-torch.log" python3 bench/pytorch/multitf.py --pipeline tuned \
                --train "$tmp/s128/train.h5" --val "$tmp/s128/val.h5" --epochs 4 --batch 128 --hidden $H --head 64 \
                --device cuda >/dev/null; then
                p=$(steady "$res/sizes/H$H-torch.log") || p=-
            fi
            ratio=$(awk -v o="$o" -v p="$p" 'BEGIN { if (o + 0 > 0 && p + 0 > 0) printf "%.2fx", p / o; else print "-" }')
            sizes_table="$sizes_table\n$(printf '%-6s %16s %16s %22s' $H "$o" "$p" "$ratio")"
            if [ "$o" = - ] || { [ $torch_ok = 1 ] && [ "$p" = - ]; }; then
                row "sizes H=$H (ms/step ours torch)" "FAIL (sizes/H$H-*.log)"
                tail -n 5 "$res/sizes/H$H-ours.log" "$res/sizes/H$H-torch.log" 2>/dev/null
            else
                row "sizes H=$H (ms/step ours torch)" "$o $p $ratio"
                echo "H=$H: ours $o ms/step, torch $p ms/step"
            fi
        done
        printf "\nwhole training step, steady state (F=128 B=128 head 64 bf16 vs PyTorch tuned fp16 autocast; series layout)\n%b\n" \
            "$sizes_table" | tee "$res/sizes/table.txt"
    fi
fi

printf '\n%-48s %s\n' "binary / check" result | tee "$res/table.txt"
printf '%b' "$table" | tee -a "$res/table.txt"
printf '%b' "$table" | grep -q FAIL && exit 1
exit 0
