#!/bin/sh
# The CUDA dist path (megabatch_cuda.cuh, "cuda dist": NCCL) under the simulator, over MPI
# (tests/cudasim/cudasim_nccl.h; docs/DIST.md, docs/GPU.md). Part of make sim-test:
#   - build/sim-mpi/nccl (tests/cudasim/nccl.cu) under -np 2 and -np 3: the simulator's NCCL;
#   - build/sim-mpi/test_cuda_dist under mpirun -np 2 and -np 3: the NCCL all-reduce against
#     the host-computed reference, broadcast, the ranks bitwise in sync after an AdamW step
#     (every rank passes; none skips); with 2 ranks and 1 GPU, both skip (none hangs);
#   - build/sim-mpi/train_multitf_cuda, np 2 x batch 16 and np 3 x batch 11 (uneven shards)
#     against the same build in 1 process x batch 32 / 33: per-batch and epoch losses within
#     1e-4 relative (DIST.md's CPU tolerance), one summary line with world=N and
#     syncs_per_step=0.00, and the ranks' in-sync check after every epoch (the run fails when
#     it fails).
# Each rank takes the simulated GPU of its local rank (CUDASIM_DEVICES=np). Skips, saying so,
# without mpirun or the sim-mpi builds. Closes with "sim-mpi: N passed, N failed".
B=${BUILD:-build}
pass=0 fail=0
. tests/dist/lib.sh # need, mpi, same_curve, ok, bad
need sim-mpi "$B/sim-mpi/nccl" "$B/sim-mpi/test_cuda_dist" "$B/sim-mpi/train_multitf_cuda"
dir=$(mktemp -d /tmp/mb_simmpi_XXXXXX)
trap 'rm -rf "$dir"' EXIT

for np in 2 3; do # the simulator's NCCL itself; jittered streams, so that a missing stream wait would show
    if CUDASIM_DEVICES=$np CUDASIM_DELAY_US=1000 mpi $np -x CUDASIM_DEVICES -x CUDASIM_DELAY_US "$B/sim-mpi/nccl" \
           >"$dir/n$np.log" 2>&1 && [ "$(grep -c 'nccl: rank [0-9]*: 0 checks failed' "$dir/n$np.log")" = $np ]; then
        ok "simulator NCCL -np $np: errors, id check, sum, max, stream order"
    else cat "$dir/n$np.log"; bad "simulator NCCL -np $np"; fi
    if CUDASIM_DEVICES=$np CUDASIM_STATS=1 mpi $np -x CUDASIM_DEVICES -x CUDASIM_STATS ${MB_TEST_SEED:+-x MB_TEST_SEED} \
           "$B/sim-mpi/test_cuda_dist" >"$dir/t$np.log" 2>&1 &&
       [ "$(grep -c '\[  PASSED  \] 1 test(s)' "$dir/t$np.log")" = $np ] && ! grep -q 'FAILED\|SKIPPED' "$dir/t$np.log" &&
       [ "$(grep -c '^cudasim: 1 NCCL all-reduces' "$dir/t$np.log")" = $np ]; then
        ok "test_cuda_dist -np $np (seeds printed, rank 0's is used: $(grep -o 'MB_TEST_SEED=[0-9]*' "$dir/t$np.log" | tr '\n' ' '))"
    else cat "$dir/t$np.log"; bad "test_cuda_dist -np $np"; fi
done

# one GPU for two ranks (rank 1 has none): both skip together, none waits for ever in the all-reduce
if CUDASIM_DEVICES=1 timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np 2 -x CUDASIM_DEVICES \
       "$B/sim-mpi/test_cuda_dist" >"$dir/t1.log" 2>&1 && [ "$(grep -c '^\[  SKIPPED \] 1 test(s)' "$dir/t1.log")" = 2 ]; then
    ok "test_cuda_dist -np 2 with 1 GPU: both ranks skip together"
else cat "$dir/t1.log"; bad "test_cuda_dist -np 2 with 1 GPU (a rank alone skipping hangs the other)"; fi

"$B/prepare" --synthetic --bars 30000 --features 4 --stride 30 --quiet --out-train "$dir/train.h5" --out-val "$dir/val.h5" ||
    { bad prepare; echo "sim-mpi: $pass passed, $fail failed"; exit 1; }
# the per-step path (--checkpoint-k 4): the all-reduce is what is tested here, and under the
# simulator the fused recurrence takes 10 times as long (example.sh and test_cuda_lstm_fused run it)
TRAIN="--train $dir/train.h5 --val $dir/val.h5 --hidden 8 --head 16 --threads 1 --quiet --warmup 5 --epochs 2 --checkpoint-k 4"
for c in "2 16" "3 11"; do
    set -- $c; np=$1; b=$2; g=$((np * b))
    mpi 1 "$B/sim-mpi/train_multitf_cuda" $TRAIN --batch $g --metrics "$dir/one.csv" > "$dir/one.log" 2>&1
    CUDASIM_DEVICES=$np mpi $np -x CUDASIM_DEVICES "$B/sim-mpi/train_multitf_cuda" $TRAIN --batch $b --metrics "$dir/dp.csv" \
        > "$dir/dp.log" 2>&1
    rc=$?
    if [ $rc = 0 ] && [ "$(grep -c '^summary:' "$dir/dp.log")" = 1 ] && grep -Eq "world=$np( |\$)" "$dir/dp.log" &&
       [ "$(grep -c '^cudasim: [0-9]* NCCL all-reduces' "$dir/dp.log")" = $np ] && same_curve "$dir/one.csv" "$dir/dp.csv" &&
       grep -q '^summary:.* syncs_per_step=0.00' "$dir/dp.log"; then
        ok "sim np $np x batch $b == 1 x batch $g: $(grep -c '^step,' "$dir/dp.csv") batch losses, 2 epochs within 1e-4, no host sync per step"
    else cat "$dir/one.log" "$dir/dp.log"; bad "sim np $np x batch $b vs 1 x batch $g (exit $rc)"; fi
done
echo "sim-mpi: $pass passed, $fail failed"
[ "$fail" = 0 ]
