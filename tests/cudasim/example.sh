#!/bin/sh
# The CUDA example under the simulator against the CPU build (make sim-test): the same validation
# loss within a tolerance (f32 1e-4 relative, bf16/f16 2e-2: cuBLAS-order sums vs OpenBLAS, and the
# 16-bit operands), f32 step by step in the metrics, and --resume --carry bitwise (the checkpoint
# of an uninterrupted run).
# Prints cmocka-style lines for tests/run.sh.
#   example.sh [BUILD] [VARIANT]   (VARIANT: sim, sim-asan or sim-tsan; default $SIM_VARIANT or sim)
b=${1:-build} v=${2:-${SIM_VARIANT:-sim}}
d=$(mktemp -d) pass=0 fail=0
trap 'rm -rf "$d"' EXIT
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
"$b/prepare" --synthetic --bars ${MB_EXAMPLE_BARS:-30000} --features 4 --stride 30 --quiet \
    --out-train "$d/train.h5" --out-val "$d/val.h5" || { echo "[  FAILED  ] 1 test(s)."; exit 1; }
args="--train $d/train.h5 --val $d/val.h5 --batch 16 --hidden 8 --head 16 --threads 1 --quiet"
# TSan: 3 batches an epoch (of 8), each run's steps the same code again; a checkpoint every 2
# steps still falls mid-epoch (resume)
[ "$v" = sim-tsan ] && args="$args --max-batches 3"
val() { sed -n 's/^summary:.* val_loss=\([0-9.e+-]*\) .*/\1/p' "$1"; }
# the step rows of two metrics files: the same epoch, batch and step, losses within 1e-4 relative
# (scratch files beside the second)
steps_match() {
    grep '^step,' "$1" | cut -d, -f2-5 >"$2.a"; grep '^step,' "$2" | cut -d, -f2-5 >"$2.b"
    [ -s "$2.a" ] && [ "$(wc -l <"$2.a")" = "$(wc -l <"$2.b")" ] &&
        paste -d, "$2.a" "$2.b" | awk -F, '{ e = $4 - $8; if (e < 0) e = -e; m = $4 < 0 ? -$4 : $4
            if ($1 != $5 || $2 != $6 || $3 != $7 || e > 1e-4 * m + 1e-7) { print "row " NR ": " $0; bad = 1 } }
            END { exit bad }'
}
# Under the simulator the fused recurrence takes ten times as long as the per-step path, and
# minutes per epoch under the sanitizers (its kernel runs under them in test_cuda_lstm_fused, on
# small shapes): the sanitizers run it in f32 only; the runs that test something else (the
# chunked loader, --resume --carry) take the per-step path (--checkpoint-k 4) everywhere.
ck="--checkpoint-k 4"
# One precision: the CPU run, then the simulator's (files NAME-PREC.*).
precision() {
    prec=$1 tol=$([ "$1" = f32 ] && echo 1e-4 || echo 2e-2)
    "$b/train_multitf" $args --epochs 1 --precision $prec --metrics "$d/cpu-$prec.csv" >"$d/cpu-$prec.log" 2>&1
    # sim: the GPU default, full storage, which runs the fused LSTM recurrence; simk: checkpoints
    # every 4 steps, the per-step cuBLAS path (the CPU's checkpointed and full-storage runs give
    # the same bits, so the CPU log serves both)
    runs="sim simk"; [ "$v" = sim ] || [ $prec = f32 ] || runs=simk
    for f in $runs; do
        k=""; [ $f = simk ] && k="--checkpoint-k 4"
        "$b/$v/train_multitf_cuda" $args --epochs 1 --precision $prec $k --metrics "$d/$f-$prec.csv" >"$d/$f-$prec.log" 2>&1
    done
    c=$(val "$d/cpu-$prec.log")
    for f in $runs; do
        s=$(val "$d/$f-$prec.log")
        if [ -n "$c" ] && [ -n "$s" ] && awk -v c="$c" -v s="$s" -v t="$tol" 'BEGIN { d = c - s; if (d < 0) d = -d; exit !(d <= t * c) }'
        then ok "$prec $f val_loss cpu $c sim $s (tolerance $tol relative)"
        else bad "$prec $f val_loss cpu '$c' sim '$s' (tolerance $tol)"; tail -20 "$d/$f-$prec.log"; fi
        # issue 15: the device runs ahead of the host, yet each step's metrics row has its own loss
        [ $prec = f32 ] || continue
        if steps_match "$d/cpu-$prec.csv" "$d/$f-$prec.csv"; then ok "f32 $f: each step's loss in the metrics is the CPU's (1e-4)"
        else bad "f32 $f: the metrics' step rows differ from the CPU's"; fi
    done
    # issue 25: the chunked, double-buffered loader (64 MB of device memory and a 5% budget keep
    # the data from being resident) under a step that never waits: the batches are the CPU's
    [ $prec = f32 ] && [ "$v" = sim ] || return 0
    CUDASIM_MEM=64M "$b/$v/train_multitf_cuda" $args $ck --epochs 1 --precision f32 --chunk-fraction 0.05 \
        --metrics "$d/chunked.csv" >"$d/chunked.log" 2>&1
    if steps_match "$d/cpu-f32.csv" "$d/chunked.csv"; then ok "f32 chunked (CUDASIM_MEM=64M --chunk-fraction 0.05): each step's loss is the CPU's"
    else bad "f32 chunked: the metrics' step rows differ from the CPU's"; tail "$d/chunked.log"; fi
}
# --resume --carry (f16: the scaler in the checkpoint; a constant schedule, whose length does not
# matter): a 1-epoch run resumed for a second epoch writes the checkpoint of a 2-epoch run, bitwise;
# checkpoints every 2 steps too, so the carried state is saved mid-epoch, while it is live
resume() {
    run() { "$b/$v/train_multitf_cuda" $args $ck --carry --precision f16 --schedule constant --warmup 0 --ckpt-every 2 \
            --ckpt "$@" >"$d/r.log" 2>&1 || { tail "$d/r.log"; return 1; }; }
    if run "$d/full.ckpt" --epochs 2 && run "$d/part.ckpt" --epochs 1 && run "$d/part.ckpt" --epochs 2 --resume &&
        cmp -s "$d/full.ckpt" "$d/part.ckpt"; then ok "--resume --carry f16: checkpoints bitwise equal"
    else bad "--resume --carry f16: the resumed run's checkpoint differs"; fi
}
# the CUDA benchmarks on tiny shapes (the plain build; their code is the library's, which the
# sanitizer builds run above): they run, and print the simulator's counters
benchmarks() {
    if "$b/$v/bench/bench_lstm_cuda" 4 16 8 16 1 f32 >"$d/b.log" 2>&1 && grep -q '^cudasim: [0-9]* kernel launches' "$d/b.log" &&
        "$b/$v/bench/bench_loader_cuda" --bytes 4 --batch 8 --slab-mb 1 --compute-ms 1 --epochs 1 --t 32 --f 8 \
            --file "$d/bl.h5" --gpu >"$d/b.log" 2>&1 && grep -q '^cudasim: ' "$d/b.log"; then ok "benchmarks run"
    else bad "benchmarks"; tail "$d/b.log"; fi
}
# The parts are independent (their own files): with MB_TEST_JOBS > 1 they run side by side, and
# their lines print in this order either way.
parts="f32 bf16 f16 resume"; [ "$v" = sim ] && parts="$parts benchmarks"
part() { # NAME: its lines, then its time, in $d/out-NAME
    t0=$(date +%s)
    case $1 in f32 | bf16 | f16) precision $1 ;; *) $1 ;; esac >"$d/out-$1" 2>&1
    echo "     (part $1: $(($(date +%s) - t0)) s)" >>"$d/out-$1"
}
for p in $parts; do
    if [ "${MB_TEST_JOBS:-1}" -gt 1 ]; then part $p & else part $p; fi
done
wait
for p in $parts; do cat "$d/out-$p"; done
pass=$(cat "$d"/out-* | grep -c '^ok ') fail=$(cat "$d"/out-* | grep -c '^FAIL ')
for p in $parts; do grep -q '^ok ' "$d/out-$p" || bad "part $p printed no result"; done
grep '^cudasim:' "$d"/sim*-f16.log
# issue 15: a step is one graph launch and no host sync (the summary's counters, f16: the GPU
# default, or the checkpointed run under the sanitizers)
last=sim; [ "$v" = sim ] || last=simk
steps=$(sed -n 's/^summary:.*\( launches_per_step=.*\)$/\1/p' "$d/$last-f16.log")
case "$steps" in
*" graphs_per_step=1.00 syncs_per_step=0.00") ok "one graph, no host sync per step:$steps" ;;
*) bad "per-step counters: '$steps'" ;;
esac
echo "[  PASSED  ] $pass test(s)."
[ $fail -eq 0 ] || echo "[  FAILED  ] $fail test(s)."
[ $fail -eq 0 ]
