#!/bin/sh
# coverage.sh DIR... - line and function coverage of megabatch.h's dataset section (the
# implementation, between the second pair of "// ---- dataset ----" markers) by the
# inputs in DIR..., run one process per file through build/fuzz/fuzz_dataset_cov (make
# fuzz-cov builds it: clang source-based coverage, no sanitizer). An input that crashes
# HDF5 leaves no profile and counts for nothing.
BIN=${BIN:-build/fuzz/fuzz_dataset_cov}
OUT=${OUT:-build/fuzz/cov}
rm -rf "$OUT" && mkdir -p "$OUT"
n=0
for d in "$@"; do
    for f in "$d"/*; do
        [ -f "$f" ] || continue
        LLVM_PROFILE_FILE="$OUT/%p.profraw" timeout 20 "$BIN" "$f" >/dev/null 2>&1
        n=$((n + 1))
    done
done
llvm-profdata merge -sparse "$OUT"/*.profraw -o "$OUT/all.profdata" || exit 1
llvm-cov export -format=lcov -instr-profile="$OUT/all.profdata" "$BIN" > "$OUT/lcov.info" || exit 1
start=$(grep -n '^// ---- dataset ----' megabatch.h | sed -n 2p | cut -d: -f1)
end=$(grep -n '^// ---- end dataset ----' megabatch.h | sed -n 2p | cut -d: -f1)
awk -v s="$start" -v e="$end" -v n="$n" '
    /^SF:/ { inmb = ($0 ~ /megabatch\.h$/) }
    inmb && /^DA:/ { split(substr($0, 4), a, ","); if (a[1] >= s && a[1] <= e) { tot++; if (a[2] > 0) hit++ } }
    inmb && /^FN:/ { split(substr($0, 4), a, ","); if (a[1] >= s && a[1] <= e) { fl[a[2]] = a[1] } }
    inmb && /^FNDA:/ { split(substr($0, 6), a, ","); fc[a[2]] += a[1] }
    END {
        printf "%d inputs; dataset section (megabatch.h lines %d-%d): %d of %d lines run (%.1f%%)\n", n, s, e, hit, tot, 100.0 * hit / tot
        nf = 0; nh = 0; miss = ""
        for (f in fl) { nf++; if (fc[f] > 0) nh++; else miss = miss " " f }
        printf "functions: %d of %d run; not run:%s\n", nh, nf, miss
    }' "$OUT/lcov.info"
