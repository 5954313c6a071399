#!/bin/sh
# Two facts have one source each, and the other docs link to it instead of restating it:
#   - what has run on a real GPU: docs/GPU.md's status table (the table after the line
#     `<!-- gpu-status ... -->`); every raw log it cites must exist;
#   - CI's stages: .ci/run (the `make` targets its `stage` lines run).
# Checks, over README.md and docs/*.md (not CHANGES.md, whose entries are history):
#   1. the status table is there and the bench/results/ paths it cites exist;
#   2. no doc but GPU.md says that some CUDA code has not run on a GPU or was only compiled,
#      nor carries a table column of GPU status ("CUDA path", "GPU status");
#   3. no doc copies CI's stage list (a paragraph that names CI and 4 or more of its targets
#      as `make TARGET`), says a CI target is not run by CI ("run by hand", "not in CI",
#      "outside CI" in the sentence that names it), or says CI runs a target .ci/run does not.
# Ends with `one-source: N passed, N failed`.
cd "$(dirname "$0")/../.." || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
docs=$(ls README.md docs/*.md | grep -v '^docs/CHANGES\.md$')
# paragraphs joined into lines, fenced blocks left out: "FILE<TAB>paragraph"
paras() {
    for md in "$@"; do
        awk -v f="$md" '/^```/ { fence = !fence; next } fence { next }
                        NF { p = p " " $0; next } p != "" { print f "\t" p; p = "" }
                        END { if (p != "") print f "\t" p }' "$md"
    done
}

# 1. the one GPU status table
awk '/^<!-- gpu-status/ { on = 1; next } on && /^\|/ { print; t = 1; next } on && t && !/^\|/ { exit }' docs/GPU.md > "$tmp/table"
if [ "$(wc -l < "$tmp/table")" -lt 3 ]; then bad "docs/GPU.md: no status table after a line <!-- gpu-status ... -->"
else
    missing=""
    for p in $(grep -o 'bench/results/[A-Za-z0-9_./-]*' "$tmp/table" | sed 's/[.,]*$//' | sort -u); do
        [ -e "$p" ] || missing="$missing $p"
    done
    if [ -n "$missing" ]; then bad "docs/GPU.md's status table cites logs that do not exist:$missing"; else ok; fi
fi

# 2. GPU status stated elsewhere
paras $(echo "$docs" | grep -v '^docs/GPU\.md$') > "$tmp/paras"
grep -i -E "(not|never)( yet)?( been)? (run|ran)( yet)? on (a |an |the |real )*(GPU|H100|H200)|no GPU run|only been compiled|compiled only([^ a-z]|$)|not yet on a GPU" "$tmp/paras" |
    cut -f 1 | sort | uniq -c | sed 's/^ *//' > "$tmp/gpu"
grep -E '^\|.*(CUDA path|GPU status)' $(echo "$docs" | grep -v '^docs/GPU\.md$') | cut -d: -f1 | sort -u | sed 's/^/table column: /' >> "$tmp/gpu"
if [ -s "$tmp/gpu" ]; then
    bad "docs state the GPU status (docs/GPU.md's status table is its one source: link it): $(tr '\n' ';' < "$tmp/gpu")"
else ok; fi

# 3. CI's stages: the make targets of .ci/run's stage lines (a shell function's own make too)
ci=$(grep -v '^[ \t]*#' .ci/run | grep -o 'make\( -[^ ]*\)* [a-z][a-z-]*' | sed 's/.* //' | sort -u)
[ -n "$ci" ] || bad ".ci/run: no make target found"
paras $docs > "$tmp/paras"
: > "$tmp/ci"
while IFS="$(printf '\t')" read -r md p; do
    case "$p" in *"make "*) ;; *) continue ;; esac
    n=0
    for t in $ci; do case "$p" in *"make $t\`"*|*"make $t "*) n=$((n + 1)) ;; esac; done
    case "$p" in *CI*) [ "$n" -lt 4 ] || echo "$md: a paragraph lists $n of CI's stages (link .ci/run instead)" >> "$tmp/ci" ;; esac
    # sentence by sentence (a table row is one)
    echo "$p" | sed 's/\. /.\n/g' | grep 'make ' > "$tmp/sent" || continue
    while read -r s; do
        for t in $(echo "$s" | grep -o 'make [a-z][a-z-]*' | sed 's/make //' | sort -u); do
            if echo "$ci" | grep -qx "$t"; then
                echo "$s" | grep -q -i -E 'by hand|not in CI|outside CI|not (run )?by CI|CI does not' &&
                    echo "$md: says CI does not run make $t, which .ci/run runs: $s" >> "$tmp/ci"
            else
                echo "$s" | grep -q -E "CI (also )?runs? \`?make $t\b" &&
                    echo "$md: says CI runs make $t, which .ci/run does not: $s" >> "$tmp/ci"
            fi
        done
    done < "$tmp/sent"
done < "$tmp/paras"
if [ -s "$tmp/ci" ]; then bad "docs state CI's stages other than .ci/run:"; sed 's/^/    /' "$tmp/ci"; else ok; fi
echo "one-source: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
