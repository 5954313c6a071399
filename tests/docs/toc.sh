#!/bin/sh
# The table of contents at the top of megabatch.h matches the file: the API part (before the
# implementation block) has exactly the banners `// ---- name ----` of the modules listed
# there, in that order, except those marked "(implementation only)"; the implementation part
# has exactly the listed modules, in the same order, except those marked "(API only)".
# A second check: the backend comparisons in the implementation of both headers (at most the 4
# that pick and report the table, issue 27) and the CUDA #ifdefs of megabatch.h (at most 2). Ends with "toc: N passed, N failed".
set -eu
cd "$(dirname "$0")/../.." || exit 2
h=megabatch.h
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # name expected-file actual-file
    if diff -u "$2" "$3" > "$tmp/diff"; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL $1: the contents and the banners differ (-contents +file):"; cat "$tmp/diff"; fi
}
# the contents: lines " *   name   text" between " * Contents." and the first line that is not one
awk '/^ \* Contents\./ { on = 1; next }
     on && /^ \*   [a-z]/ { line = substr($0, 6); name = line; sub(/  .*/, "", name);
                          tag = (line ~ /\(implementation only\)/) ? "impl" : (line ~ /\(API only/) ? "api" : "both";
                          print name "\t" tag; next }
     on && /^ \*                / { next }
     on && /^ \* megabatch_cuda/ { exit }' "$h" > "$tmp/toc"
impl=$(grep -n '^#ifdef MEGABATCH_IMPLEMENTATION$' "$h" | head -n 1 | cut -d: -f1)
banners() { sed -n 's|^// ---- \(.*\) ----$|\1|p' | grep -v '^end '; }
head -n "$impl" "$h" | banners > "$tmp/api.file"
tail -n "+$impl" "$h" | banners > "$tmp/impl.file"
awk -F'\t' '$2 != "impl" { print $1 }' "$tmp/toc" > "$tmp/api.toc"
awk -F'\t' '$2 != "api" { print $1 }' "$tmp/toc" > "$tmp/impl.toc"
if [ ! -s "$tmp/toc" ]; then echo "FAIL no contents found at the top of $h"; fail=$((fail + 1))
else check "API part" "$tmp/api.toc" "$tmp/api.file"; check "implementation part" "$tmp/impl.toc" "$tmp/impl.file"; fi
# no backend comparison outside the table (issue 27): `backend ==/!= MB_...` and `cfg.backend` only
# in mb__backend_of (2), mb_device_open's check of the config (1) and mb_device_backend (1)
b=$(tail -n "+$impl" "$h" | cat - megabatch_cuda.cuh | grep -c 'backend [!=]= MB_\|cfg\.backend' || true)
d=$(grep -c '#ifdef MEGABATCH_CUDA' "$h" || true)
if [ "$b" -le 4 ] && [ "$d" -le 2 ]; then pass=$((pass + 1))
else fail=$((fail + 1)); echo "FAIL $h: $b backend comparisons (at most 4: dispatch goes through the backend table and its caps) and $d '#ifdef MEGABATCH_CUDA' (at most 2)"; fi
echo "toc: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
