#!/bin/sh
# run.sh [BUNDLE]: on a GPU machine, run every CUDA test of the bundle (make gpu-bundle),
# then compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over them, and print
# a pass/fail table last. Meant for one call of the device tool:
#   make gpu-bundle   (here)   then   sh tests/gpu/run.sh build/gpu   (there, carrying build/gpu)
set -u
dir=${1:-build/gpu}
nvidia-smi -L || echo "nvidia-smi: no GPU"
echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
table=""
row() { table="$table$(printf '%-44s %s' "$1" "$2")\n"; }
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if "$t"; then row "$name" PASS; else row "$name" FAIL; fi
    if command -v compute-sanitizer >/dev/null 2>&1; then
        for tool in memcheck racecheck initcheck synccheck; do
            if compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" >/tmp/cs.log 2>&1; then
                row "  $tool" PASS
            else
                row "  $tool" "FAIL ($(grep -c 'ERROR SUMMARY\|=========  ' /tmp/cs.log) lines, see log)"
                tail -n 40 /tmp/cs.log
            fi
        done
    fi
done
for b in "$dir"/bench_*; do
    [ -x "$b" ] || continue
    "$b" && row "$(basename "$b")" ran || row "$(basename "$b")" FAIL
done
printf '\n%-44s %s\n' "binary / sanitizer" result
printf "$table"
printf "$table" | grep -q FAIL && exit 1
exit 0
