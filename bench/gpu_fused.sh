#!/bin/sh
# gpu_fused.sh BUNDLE OUT: the fused LSTM recurrence on a GPU machine in about two minutes
# (issue 24): its test against the CPU reference, one layer's time per timestep (bench_lstm_cuda,
# B 128 T 480 F 128) at H 32/64/128 in bf16 and H 32/64 in f32, ncu's warp states of the forward
# and backward kernels at H 32 bf16, compute-sanitizer's memcheck, racecheck and synccheck over the
# test, and the multi-timeframe example's whole step (F 12, B 128,
# head 64, bf16) at H 32/64/128 next to the PyTorch tuned pipeline, steady state (epochs 2-3).
# MB_NCU_H: the hidden sizes ncu looks at (default 32); MB_NO_TORCH=1: no PyTorch runs.
# Logs go to OUT; a table ends the output. BUNDLE: binaries as make gpu-bundle lays them out.
set -u
dir=${1:-build/gpu}
out=${2:-/tmp/gpu_fused}
mkdir -p "$out"
table=""
row() { table="$table$(printf '%-46s %s' "$1" "$2")\n"; }
nvidia-smi -L || echo "nvidia-smi: no GPU"
echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
if "$dir/test_cuda_lstm_fused" >"$out/test_cuda_lstm_fused.log" 2>&1; then row test_cuda_lstm_fused PASS
else row test_cuda_lstm_fused FAIL; fi
grep -q SKIPPED "$out/test_cuda_lstm_fused.log" && row "test_cuda_lstm_fused skipped" FAIL
if command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck synccheck; do
        if timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 "$dir/test_cuda_lstm_fused" >"$out/cs-$tool.log" 2>&1
        then row "  compute-sanitizer $tool" PASS; else row "  compute-sanitizer $tool" "FAIL ($?)"; fi
    done
fi
for cfg in "32 bf16" "64 bf16" "128 bf16" "32 f32" "64 f32"; do
    set -- $cfg
    if "$dir/bench_lstm_cuda" 128 480 128 "$1" 5 "$2" >>"$out/bench_lstm.log" 2>&1; then
        row "one layer H=$1 $2 us/step (fwd, fwd+bwd)" "$(tail -n 2 "$out/bench_lstm.log" | head -n 1 |
            sed -n 's/.*fwd *\([0-9.]*\) us\/step *fwd+bwd *\([0-9.]*\).*/\1 \2/p')"
    else row "one layer H=$1 $2" FAIL; fi
done
if command -v ncu >/dev/null 2>&1; then
    for H in ${MB_NCU_H:-32}; do
        for k in fwd bwd; do
            timeout 120 ncu --kernel-name "regex:mb__k_lstm_fused_$k" -c 1 --section WarpStateStats --section SchedulerStats \
                --section Occupancy --section LaunchStats --section SpeedOfLight "$dir/bench_lstm_cuda" 128 480 128 $H 1 bf16 \
                >"$out/ncu-$k-H$H.txt" 2>&1
            row "ncu fused $k H=$H bf16 T=480" "$(grep -m1 'Duration' "$out/ncu-$k-H$H.txt" | awk '{print $NF, $(NF-1)}')"
        done
    done
fi
"$dir/prepare" --synthetic --bars 120000 --features 12 --stride 15 --quiet --out-train /tmp/gf_t.h5 --out-val /tmp/gf_v.h5
# steady state: cumulative samples/s over epochs 1..E -> the time of epochs 2..3 per step
steady() { awk -v B=128 '/^epoch/ { for (i = 1; i <= NF; i++) if ($i == "steps") s = $(i + 1);
    for (i = 1; i <= NF; i++) if ($(i + 1) == "samples/s") r = $i; n++; S[n] = s; R[n] = r }
    END { if (n < 3) { print "?"; exit } t1 = S[1] * B / R[1]; t3 = S[n] * B / R[n];
          printf "%.2f", 1000 * (t3 - t1) / (S[n] - S[1]) }' "$1"; }
for H in 32 64 128; do
    "$dir/train_multitf_cuda" --train /tmp/gf_t.h5 --val /tmp/gf_v.h5 --epochs 3 --batch 128 --hidden $H --head 64 \
        --precision bf16 --quiet >"$out/train-H$H.log" 2>&1 || row "train H=$H" FAIL
    ours=$(steady "$out/train-H$H.log")
    theirs="-"
    if [ -z "${MB_NO_TORCH:-}" ] && python3 -c 'import torch, h5py; assert torch.cuda.is_available()' 2>/dev/null; then
        python3 bench/pytorch/multitf.py --train /tmp/gf_t.h5 --val /tmp/gf_v.h5 --pipeline tuned --epochs 3 --batch 128 \
            --hidden $H --head 64 --device cuda --quiet >"$out/torch-H$H.log" 2>&1 && theirs=$(steady "$out/torch-H$H.log")
    fi
    row "step F=12 H=$H bf16 ms (ours, torch tuned)" "$ours $theirs"
done
printf '\n%-46s %s\n' "check" "result"
printf "$table" | tee "$out/table.txt"
