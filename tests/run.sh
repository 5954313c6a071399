#!/bin/sh
# Run test binaries (cmocka) and script tests (*.sh, closing with "NAME: N passed, N failed"), print each one's result and time (s) and one closing line:
#   tests: N passed, N failed, N skipped
# A binary that crashes or exits non-zero without a cmocka summary counts as 1 failed.
passed=0 failed=0 skipped=0 bad=""
log=$(mktemp)
for bin in "$@"; do
    t0=$(date +%s)
    case "$bin" in *.sh) sh "$bin" >"$log" 2>&1 ;; *) "$bin" >"$log" 2>&1 ;; esac
    rc=$?
    t=$(( $(date +%s) - t0 ))
    p=$(grep -o '\[  PASSED  \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    f=$(grep -o '\[  FAILED  \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    # a script test closes with "NAME: N passed, N failed" (or prints cmocka's lines, read above)
    case "$bin" in *.sh)
        sp=$(sed -n 's/^[a-z-]*: \([0-9]*\) passed, [0-9]* failed.*/\1/p' "$log" | tail -n 1)
        sf=$(sed -n 's/^[a-z-]*: [0-9]* passed, \([0-9]*\) failed.*/\1/p' "$log" | tail -n 1)
        if [ -n "$sp" ]; then p=$sp; f=$sf; fi ;;
    esac
    s=$(grep -o '\[  SKIPPED \] [0-9]* test(s)' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        bad="$bad $bin"
        cat "$log"
        printf '%-40s FAIL (%s passed, %s failed, exit %s) %4d s\n' "$(basename "$bin")" "$p" "$f" "$rc" "$t"
    else
        grep -o '\[  SKIPPED \] [a-z_][a-z_0-9]*$' "$log" | sort -u | sed 's/^/    /'
        printf '%-40s ok   (%s passed, %s skipped) %4d s\n' "$(basename "$bin")" "$p" "$s" "$t"
    fi
done
rm -f "$log"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
