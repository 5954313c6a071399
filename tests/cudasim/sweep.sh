#!/bin/sh
# Every randomized CUDA test under the simulator over many seeds (not in CI: minutes).
#   tests/cudasim/sweep.sh [SEEDS=200] [BUILD=build]   prints each failing seed, then a count
n=${1:-200} b=${2:-build} fails=0
for t in "$b"/sim/test_cuda_*; do
    s=1
    while [ $s -le "$n" ]; do
        MB_TEST_SEED=$s timeout 300 "$t" >/dev/null 2>&1 || { echo "FAIL $(basename "$t") MB_TEST_SEED=$s"; fails=$((fails + 1)); }
        s=$((s + 1))
    done
    echo "$(basename "$t"): $n seeds"
done
echo "sweep: $fails failures"
[ $fails -eq 0 ]
