#!/bin/sh
# Every ```c / ```cuda block in README.md and docs/*.md must be a verbatim copy of a region of
# a compiled file (or, for a ```sh block with a marker, of a script that a test runs), named
# on the line just above the block:
#     <!-- snippet: tests/docs/snippets.c#loader-loop -->
# The region lies between `// snippet: NAME` and `// end snippet` (`#` in scripts) and is compared after
# removing the marker's indentation. Pseudo-code goes in ```text blocks.
# Every ```sh (```bash, ```shell, ```console) block shows commands, and each one is either
#   - run by a test: a snippet marker naming a region of a script that make test runs (a
#     tests/*.sh named in the Makefile), e.g. <!-- snippet: tests/docs/trading.sh#trading-start -->
#   - or marked as not runnable here, with the reason, on the line just above it:
#         <!-- not run: needs a GPU (tests/gpu/run.sh runs it on one) -->
#     (one line; the reason is not empty). Anything else fails.
# Prints each mismatch and ends with `N passed, N failed` (one check per block; a block
# marked not run is listed by count, not as a pass).
# usage: check.sh [FILE.md ...]   (default: README.md docs/*.md)
set -eu
cd "$(dirname "$0")/../.." || exit 2
[ $# -gt 0 ] || set -- README.md docs/*.md
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 notrun=0
for md in "$@"; do
    # split the markdown into one file per code block: tmp/N.ref holds the marker, tmp/N.doc the code
    awk -v dir="$tmp" -v md="$md" '
        !inblk && !skip && /^```(sh|bash|shell|console)[ \t]*$/ && prev ~ /^<!-- not run: *[^ ].*-->$/ {
                                       print prev > (dir "/notrun"); skip = 1; next }
        !inblk && !skip && (/^```(c|cpp|cuda|cu)[ \t]*$/ || /^```(sh|bash|shell|console)[ \t]*$/) {
                                       n++; inblk = 1; f = dir "/" n ".doc"; printf "" > f;
                                       print (prev ~ /^<!-- snippet: .*-->$/ ? prev : "NONE") > (dir "/" n ".ref");
                                       print ($0 ~ /^```(sh|bash|shell|console)/ ? "sh" : "c") > (dir "/" n ".lang");
                                       print md > (dir "/" n ".md"); next }
        !inblk && !skip && /^```[a-z]/ { skip = 1; next }
        skip && /^```/ { skip = 0; next }
        skip { next }
        inblk && /^```/ { inblk = 0; close(f); next }
        inblk { print >> f; next }
        NF { prev = $0 }' "$md"
    if [ -f "$tmp/notrun" ]; then notrun=$((notrun + $(wc -l < "$tmp/notrun"))); rm -f "$tmp/notrun"; fi
    for ref in "$tmp"/*.ref; do
        [ -e "$ref" ] || continue
        n=${ref%.ref}; marker=$(cat "$ref"); lang=$(cat "$n.lang")
        if [ "$marker" = NONE ]; then
            if [ "$lang" = sh ]; then
                echo "FAIL $md: a command block (starting: $(head -n 1 "$n.doc")) is neither run by a test" \
                     "(<!-- snippet: SCRIPT#NAME --> above it) nor marked <!-- not run: REASON -->"
            else
                echo "FAIL $md: a code block (starting: $(head -n 1 "$n.doc")) has no <!-- snippet: FILE#NAME --> line above it"
            fi
            fail=$((fail + 1)); rm -f "$n".*; continue
        fi
        spec=$(echo "$marker" | sed 's/^<!-- snippet: *//; s/ *-->$//')
        src=${spec%%#*}; name=${spec#*#}
        if [ ! -f "$src" ]; then echo "FAIL $md: snippet source $src not found"; fail=$((fail + 1)); rm -f "$n".*; continue; fi
        if [ "$lang" = sh ] && ! { case "$src" in tests/*.sh) grep -qF "$src" Makefile ;; *) false ;; esac; }; then
            echo "FAIL $md: the command block's source $src is not a test script that the Makefile runs"
            fail=$((fail + 1)); rm -f "$n".*; continue
        fi
        awk -v name="$name" '
            $0 ~ "^[ \t]*(//|#) snippet: " name "[ \t]*$" { on = 1; match($0, /^[ \t]*/); ind = RLENGTH; next }
            on && /^[ \t]*(\/\/|#) end snippet[ \t]*$/ { exit }
            on { print (length($0) >= ind ? substr($0, ind + 1) : "") }' "$src" > "$n.src"
        if [ ! -s "$n.src" ]; then
            echo "FAIL $md: no region '$name' in $src"; fail=$((fail + 1))
        elif diff -u "$n.src" "$n.doc" > "$n.diff"; then
            pass=$((pass + 1))
        else
            echo "FAIL $md: the block differs from $src#$name:"; cat "$n.diff"; fail=$((fail + 1))
        fi
        rm -f "$n".*
    done
done
echo "docs: $notrun command blocks marked not run (their reasons: grep -n '<!-- not run:' README.md docs/*.md)"
echo "docs: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
