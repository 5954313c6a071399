#!/bin/sh
# tests/cross/bench.sh [DIR] - bench_live (bench/bench_live.c) on Linux and under Wine, same
# machine, same flags (make cross-bench: -O2, MEGABATCH_NO_CBLAS in both, so the same code):
# the window and stateful modes, per closed M1 bar, batch 1, one thread. BARS (default 2000)
# timed bars per run, REPS (default 3) runs of each, alternated Linux/Wine so that a load
# change on a shared machine hits both. docs/BENCHMARKS.md has the table.
set -u
D=${1:-build/cross}
BARS=${BARS:-2000} REPS=${REPS:-3}
WINE=$(command -v wine64 2>/dev/null || ls /usr/lib/wine/wine64 2>/dev/null)
[ -n "$WINE" ] || { echo "bench: wine64 not found"; exit 1; }
case $D in /*) ;; *) D=$(pwd)/$D ;; esac
export WINEDEBUG=-all WINEPREFIX="${WINEPREFIX:-$D/wineprefix}"
"$WINE" cmd /c exit >/dev/null 2>&1
echo "bench_live, $BARS bars, 1 thread, F=12 H=32 (the example's model); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for mode in window stateful; do
    for r in $(seq "$REPS"); do
        printf 'linux %-8s run %d: ' $mode "$r"; "$D/linux/bench_live" "$BARS" 12 32 1 $mode | grep 'per bar'
        printf 'wine  %-8s run %d: ' $mode "$r"; "$WINE" "$D/win/bench_live.exe" "$BARS" 12 32 1 $mode | tr -d '\r' | grep 'per bar'
    done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
