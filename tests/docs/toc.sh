#!/bin/sh
# The table of contents at the top of megabatch.h matches the file: the API part (before the
# implementation block) has exactly the banners `// ---- name ----` of the modules listed
# there, in that order, except those marked "(implementation only)"; the implementation part
# has exactly the listed modules, in the same order, except those marked "(API only)".
# A second check: the count of backend branches and CUDA #ifdefs in megabatch.h (issue 17:
# at most 2 each). Ends with "toc: N passed, N failed".
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
b=$(grep -c 'backend == MB_CUDA' "$h") d=$(grep -c '#ifdef MEGABATCH_CUDA' "$h")
if [ "$b" -le 2 ] && [ "$d" -le 2 ]; then pass=$((pass + 1))
else fail=$((fail + 1)); echo "FAIL $h: $b 'backend == MB_CUDA' and $d '#ifdef MEGABATCH_CUDA' (at most 2 each: dispatch goes through the backend table)"; fi
echo "toc: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
