#!/bin/sh
# Run randomized tests over many seeds and report every failing seed (outside CI: a flaky
# test is a bug, and this is how one is found before it reaches CI).
#   sh tests/sweep_seeds.sh [-n SEEDS] [-s FIRST] [-j JOBS] [-t SECONDS] [BINARY ...]
# Default: 500 seeds for each build/tests/test_* binary that prints MB_TEST_SEED (that is,
# draws random inputs), 2 jobs, a 300 s limit per run. Seeds are FIRST..FIRST+SEEDS-1
# (FIRST 1 unless given; another FIRST sweeps seeds no earlier sweep tried), so a sweep is
# reproducible; each failure is listed as `MB_TEST_SEED=S BINARY` with its log in
# build/sweep/. Exits 1 if any seed failed.
seeds=500 first=1 jobs=2 limit=300
while [ $# -gt 0 ]; do
    case "$1" in
        -n) seeds=$2; shift 2 ;;
        -s) first=$2; shift 2 ;;
        -j) jobs=$2; shift 2 ;;
        -t) limit=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
cd "$(dirname "$0")/.." || exit 2
out=build/sweep; mkdir -p "$out"
if [ $# -eq 0 ]; then
    for b in build/tests/test_*; do
        [ -x "$b" ] || continue
        MB_TEST_SEED=1 timeout "$limit" "$b" 2>&1 | grep -q '^MB_TEST_SEED=' && set -- "$@" "$b"
    done
fi
total=0 failed=0
for bin in "$@"; do
    name=$(basename "$bin")
    start=$(date +%s)
    # one line per failing seed from the parallel runs
    seq "$first" $((first + seeds - 1)) | xargs -P "$jobs" -I{} sh -c '
        if ! MB_TEST_SEED={} timeout '"$limit"' "$1" >"$2/$3.{}.log" 2>&1; then echo "MB_TEST_SEED={} $1";
        else rm -f "$2/$3.{}.log"; fi' sh "$bin" "$out" "$name" > "$out/$name.failed"
    n=$(wc -l < "$out/$name.failed")
    printf '%-32s %5d seeds, %3d failed, %4ds\n' "$name" "$seeds" "$n" $(( $(date +%s) - start ))
    cat "$out/$name.failed"
    total=$((total + seeds)); failed=$((failed + n))
done
echo "sweep: $((total - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
