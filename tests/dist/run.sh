#!/bin/sh
# Data parallel on CPU ranks (docs/DIST.md): build/mpi/test_dist under mpirun -np 2 and -np 3,
# then the example (build/train_multitf_mpi) against one process:
#   - np 2 x batch 16 and np 3 x batch 11 (uneven shards, a dropped tail) give the same
#     per-batch losses, epoch losses and steps as 1 process x batch 32 / 33 (relative
#     difference <= 1e-4; the reduction is bitwise only across ranks, see DIST.md);
#   - one summary line (rank 0 prints), world=N in it; the ranks' in-sync check passes;
#   - np 2 x batch 1 == 1 x batch 2 over more than 256 steps (the ranks' losses summed
#     mid-epoch too);
#   - resume on the same world size (constant schedule: its length depends on --epochs):
#     1 epoch + --resume to 2 ends with the checkpoint
#     file of an uninterrupted 2-epoch run, byte for byte (written by rank 0 only);
#   - a checkpoint of 2 ranks is refused by 1 rank; --accum 2 with 2 ranks is refused.
# Skips (cmocka-style SKIPPED line for tests/run.sh) when mpirun or the MPI builds are absent.
# Closes with "dist: N passed, N failed".
B=${BUILD:-build}
pass=0 fail=0
. tests/dist/lib.sh # need, mpi, same_curve, ok, bad
need dist "$B/mpi/test_dist" "$B/train_multitf_mpi"
dir=$(mktemp -d /tmp/mb_dist_XXXXXX)
trap 'rm -rf "$dir"' EXIT

for np in 2 3; do
    # mpirun fails when any rank fails; the ranks' lines may interleave, so no counting
    if mpi $np "$B/mpi/test_dist" >"$dir/t$np.log" 2>&1 && grep -q '\[  PASSED  \] 6 test(s)' "$dir/t$np.log" &&
       ! grep -q 'FAILED' "$dir/t$np.log"; then
        ok "test_dist -np $np ($(grep 'world size' "$dir/t$np.log"))"
    else cat "$dir/t$np.log"; bad "test_dist -np $np"; fi
done

"$B/prepare" --synthetic --bars 40000 --features 4 --stride 30 --quiet --out-train "$dir/train.h5" --out-val "$dir/val.h5" || { bad prepare; echo "dist: $pass passed, $fail failed"; exit 1; }
TRAIN="--train $dir/train.h5 --val $dir/val.h5 --hidden 8 --head 16 --threads 1 --quiet --warmup 5"

for c in "2 16" "3 11"; do
    set -- $c; np=$1; b=$2; g=$((np * b))
    "$B/train_multitf" $TRAIN --epochs 2 --batch $g --metrics "$dir/one.csv" > "$dir/one.log" 2>&1
    mpi $np "$B/train_multitf_mpi" $TRAIN --epochs 2 --batch $b --metrics "$dir/dp.csv" > "$dir/dp.log" 2>&1
    rc=$?
    if [ $rc = 0 ] && [ "$(grep -c '^summary:' "$dir/dp.log")" = 1 ] && grep -Eq "world=$np( |\$)" "$dir/dp.log" &&
       same_curve "$dir/one.csv" "$dir/dp.csv"; then
        ok "np $np x batch $b == 1 x batch $g: $(grep -c '^step,' "$dir/dp.csv") batch losses, 2 epochs within 1e-4"
    else cat "$dir/one.log" "$dir/dp.log"; bad "np $np x batch $b vs 1 x batch $g (exit $rc)"; fi
done

# batch 1 a rank: more than 256 steps in the epoch, so the ranks also sum their losses mid-epoch
"$B/train_multitf" $TRAIN --epochs 1 --batch 2 --metrics "$dir/one.csv" > "$dir/one.log" 2>&1
mpi 2 "$B/train_multitf_mpi" $TRAIN --epochs 1 --batch 1 --metrics "$dir/dp.csv" > "$dir/dp.log" 2>&1
rc=$? steps=$(grep -c '^step,' "$dir/dp.csv")
if [ $rc = 0 ] && [ "$steps" -gt 256 ] && same_curve "$dir/one.csv" "$dir/dp.csv"; then
    ok "np 2 x batch 1 == 1 x batch 2: $steps batch losses (summed over the ranks at step 256 and at the end) within 1e-4"
else cat "$dir/one.log" "$dir/dp.log"; bad "np 2 x batch 1 vs 1 x batch 2 (exit $rc, $steps steps)"; fi

mpi 2 "$B/train_multitf_mpi" $TRAIN --schedule constant --epochs 2 --batch 16 --ckpt "$dir/full.ckpt" > "$dir/full.log" 2>&1 &&
mpi 2 "$B/train_multitf_mpi" $TRAIN --schedule constant --epochs 1 --batch 16 --ckpt "$dir/part.ckpt" > "$dir/p1.log" 2>&1 &&
mpi 2 "$B/train_multitf_mpi" $TRAIN --schedule constant --epochs 2 --batch 16 --ckpt "$dir/part.ckpt" --resume > "$dir/p2.log" 2>&1
rc=$?
if [ $rc = 0 ] && cmp -s "$dir/full.ckpt" "$dir/part.ckpt" && [ ! -e "$dir/part.ckpt.tmp" ] &&
   [ "$(grep '^summary' "$dir/full.log" | cut -d' ' -f2-5)" = "$(grep '^summary' "$dir/p2.log" | cut -d' ' -f2-5)" ]; then
    ok "np 2: 1 epoch + --resume == 2 epochs (checkpoint byte for byte)"
else cat "$dir/full.log" "$dir/p1.log" "$dir/p2.log"; bad "np 2 resume (exit $rc)"; fi

if "$B/train_multitf" $TRAIN --schedule constant --epochs 3 --batch 16 --ckpt "$dir/full.ckpt" --resume > "$dir/w1.log" 2>&1; then
    bad "a 2-rank checkpoint resumed by 1 rank"
elif grep -q 'other options: world is 2 in the checkpoint but 1 here' "$dir/w1.log"; then ok "a 2-rank checkpoint is refused by 1 rank, naming world"
else cat "$dir/w1.log"; bad "world mismatch message"; fi

if mpi 2 "$B/train_multitf_mpi" $TRAIN --epochs 1 --batch 16 --accum 2 > "$dir/acc.log" 2>&1; then bad "--accum 2 with 2 ranks ran"
elif grep -q 'not supported with 2 ranks' "$dir/acc.log"; then ok "--accum 2 with 2 ranks is refused"
else cat "$dir/acc.log"; bad "--accum 2 message"; fi

echo "dist: $pass passed, $fail failed"
[ "$fail" = 0 ]
