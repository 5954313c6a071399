#!/bin/sh
# README.md's module list is the contents of megabatch.h: the same modules, in the same order,
# with the same "(implementation only)" / "(API only)" marks. The README's list is the
# paragraph after the line `<!-- modules: ... -->`: names separated by commas, ending with a
# period, a mark in parentheses after a name; the header's is the contents comment that
# tests/docs/toc.sh checks against the banners. Ends with "modules: N passed, N failed".
set -eu
cd "$(dirname "$0")/../.." || exit 2
h=megabatch.h readme=README.md
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
# the header: lines " *   name   text" between " * Contents." and " * megabatch_cuda" (as toc.sh)
awk '/^ \* Contents\./ { on = 1; next }
     on && /^ \*   [a-z]/ { line = substr($0, 6); name = line; sub(/  .*/, "", name);
                          tag = (line ~ /\(implementation only\)/) ? "implementation only" : (line ~ /\(API only/) ? "API only" : "";
                          print name (tag == "" ? "" : " (" tag ")"); next }
     on && /^ \*                / { next }
     on && /^ \* megabatch_cuda/ { exit }' "$h" > "$tmp/header"
# the README: the paragraph after the marker, split at commas, the closing period dropped
awk '/^<!-- modules:.*-->$/ { on = 1; next }
     on && !NF { exit }
     on { text = text " " $0 }
     END { sub(/\.[ \t]*$/, "", text); n = split(text, item, ",");
           for (i = 1; i <= n; i++) { s = item[i]; gsub(/^[ \t]+|[ \t]+$/, "", s); gsub(/[ \t]+/, " ", s);
                                      if (s != "") print s } }' "$readme" > "$tmp/readme"
if [ ! -s "$tmp/header" ]; then
    echo "FAIL no contents found at the top of $h"; fail=$((fail + 1))
elif [ ! -s "$tmp/readme" ]; then
    echo "FAIL no module list in $readme (a paragraph after a line <!-- modules: ... -->)"; fail=$((fail + 1))
elif diff -u "$tmp/header" "$tmp/readme" > "$tmp/diff"; then
    pass=$((pass + 1))
else
    echo "FAIL $readme's module list differs from $h's contents (-$h +$readme):"; cat "$tmp/diff"
    fail=$((fail + 1))
fi
echo "modules: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
