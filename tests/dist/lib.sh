# Sourced by tests/dist/run.sh and tests/cudasim/mpi.sh. Uses $MPIRUN (default mpirun) and $dir (a scratch directory).
MPIRUN=${MPIRUN:-mpirun}
# need NAME FILE...: without mpirun or one of the FILEs, skip (a SKIPPED line for tests/run.sh) and exit
need() {
    name=$1 miss=""; shift
    command -v "$MPIRUN" >/dev/null 2>&1 || miss=" $MPIRUN"
    for f in "$@"; do [ -x "$f" ] || miss="$miss $f"; done
    [ -z "$miss" ] && return 0
    echo "$name: skipped: not found:$miss (apt-get install libopenmpi-dev openmpi-bin; make / make sim-build)"
    echo "[  SKIPPED ] 1 test(s)"
    echo "$name: 0 passed, 0 failed"
    exit 0
}
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
# mpi NP PROGRAM ARGS...: under mpirun with the flags CI needs as root, bounded
mpi() { timeout 600 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$@"; }
# the loss column of the step rows and the epoch rows of two metrics files: equal within 1e-4 (relative)
same_curve() {
    for kind in step epoch; do
        grep "^$kind," "$1" | cut -d, -f2-7 > "$dir/a"; grep "^$kind," "$2" | cut -d, -f2-7 > "$dir/b"
        [ -s "$dir/a" ] && [ "$(wc -l < "$dir/a")" = "$(wc -l < "$dir/b")" ] || return 1
        paste -d, "$dir/a" "$dir/b" | awk -F, -v n=6 '{
            for (i = 1; i <= n; i++) { a = $i; b = $(i + n); if (a == "" && b == "") continue;
                d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (d > 1e-4 * m + 1e-7) { print "row " NR ": " $0; bad = 1 } } }
            END { exit bad }' || return 1
    done
}
