#!/bin/sh
# Run test binaries (cmocka) and script tests (*.sh, closing with "NAME: N passed, N failed"
# or "NAME: N passed, N failed, N skipped"), print each one's result and time (s), the
# `skipped: WHY` lines of those that skipped something, and one closing line:
#   tests: N passed, N failed, N skipped
# A binary that crashes or exits non-zero without a cmocka summary counts as 1 failed.
# MB_TEST_JOBS=N runs up to N at a time (default 1; make passes its JOBS, a job per core); the
# results still print in the order given, each as soon as it and those before it are done.
# Tests write only to their own temporary directories (mkdtemp), so any order is safe.
# A skip is never silent: with CI=true the tests themselves fail instead (tests/onnx/run.sh,
# test_cli's missing builds, ...); here each one's reason is shown and counted.
set -eu
# one test: its output in DIR/N.log, then "exit-status seconds" in DIR/N.rc
one() { # DIR N BIN
    t0=$(date +%s)
    rc=0
    case "$3" in *.sh) sh "$3" >"$1/$2.log" 2>&1 || rc=$? ;; *) "$3" >"$1/$2.log" 2>&1 || rc=$? ;; esac
    echo "$rc $(( $(date +%s) - t0 ))" > "$1/$2.tmp" && mv "$1/$2.tmp" "$1/$2.rc"
}
if [ "${1-}" = --one ]; then shift; one "$@"; exit 0; fi
jobs=${MB_TEST_JOBS:-1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ "$jobs" -gt 1 ]; then # up to $jobs at a time, started in the order given
    i=0
    for bin in "$@"; do i=$((i + 1)); printf '%s\n%s\n' "$i" "$bin"; done |
        xargs -d '\n' -n 2 -P "$jobs" sh "$0" --one "$dir" &
fi
passed=0 failed=0 skipped=0 i=0
for bin in "$@"; do
    i=$((i + 1))
    if [ "$jobs" -le 1 ]; then one "$dir" "$i" "$bin"; fi
    while [ ! -f "$dir/$i.rc" ]; do sleep 1; done
    read -r rc t < "$dir/$i.rc"
    log=$dir/$i.log
    p=$(grep -o '\[  PASSED  \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    f=$(grep -o '\[  FAILED  \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    # a script test closes with "NAME: N passed, N failed" (or prints cmocka's lines, read above)
    s=$(grep -o '\[  SKIPPED \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    case "$bin" in *.sh)
        sp=$(sed -n 's/^[a-z-]*: \([0-9]*\) passed, [0-9]* failed.*/\1/p' "$log" | tail -n 1)
        sf=$(sed -n 's/^[a-z-]*: [0-9]* passed, \([0-9]*\) failed.*/\1/p' "$log" | tail -n 1)
        ss=$(sed -n 's/^[a-z-]*: [0-9]* passed, [0-9]* failed, \([0-9]*\) skipped.*/\1/p' "$log" | tail -n 1)
        if [ -n "$sp" ]; then p=$sp; f=$sf; fi
        if [ -n "$ss" ]; then s=$ss; fi ;;
    esac
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        cat "$log"
        printf '%-40s FAIL (%s passed, %s failed, exit %s) %4d s\n' "$(basename "$bin")" "$p" "$f" "$rc" "$t"
    else
        grep -o '\[  SKIPPED \] [a-z_][a-z_0-9]*$' "$log" | sort -u | sed 's/^/    /'
        grep '^skipped: ' "$log" | sort -u | sed 's/^/    /' || true
        printf '%-40s ok   (%s passed, %s skipped) %4d s\n' "$(basename "$bin")" "$p" "$s" "$t"
    fi
done
wait
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
