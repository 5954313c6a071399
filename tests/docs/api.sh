#!/bin/sh
# docs/API.md is generated from the headers: every public function (MBDEF) of megabatch.h and
# megabatch_cuda.cuh, module by module (the `// ---- name ----` banners, with their first
# comment lines), its declaration as written, and the comment that states its contract (the
# comment just above a run of declarations, or the one after a declaration on its line).
#   sh tests/docs/api.sh           check: docs/API.md is what the headers give, every public
#                                   function has a contract comment, and every mb_* name that
#                                   README.md and docs/*.md use exists in the headers
#   sh tests/docs/api.sh --write   rewrite docs/API.md
# Ends with `api: N passed, N failed` (make test runs it).
set -eu
cd "$(dirname "$0")/../.." || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

gen() {
cat <<'EOF'
# API reference

Every public function of `megabatch.h` and `megabatch_cuda.cuh`, module by module, with the
comment next to its declaration: its contract (arguments, results, errors, what it costs).
This page is generated from the headers (`sh tests/docs/api.sh --write`) and `make test` fails
when it and the headers disagree or a public function has no such comment. DESIGN.md is the
design (architecture, data flow, the backend interface, threads and streams); the guides say
how the pieces fit: FOUNDATION.md (core, device, gemm, params), LOADER.md (dataset, loader),
SERIES.md, LSTM.md, NUMERICS.md (layers, loss, amp, optim, accum, step), CHECKPOINT.md,
TRADING.md (export), DIST.md, GRAPH.md, RELIABILITY.md (the probe), GPU.md (CUDA).

Conventions for all of them: a fallible call returns `mb_result` (`MB_OK` is 0, errors are
negative) and leaves the detail in `mb_last_error()` on the calling thread; a `NULL` object
where one is required is `MB_ERR_INVALID_ARG`; destroy/close functions take `NULL`.
EOF
for h in megabatch.h megabatch_cuda.cuh; do
    awk -v hdr="$h" -v undoc="$tmp/undoc" '
    function strip(s) { sub(/^[ \t]*(\/\*+|\*+\/?|\/\/)[ \t]?/, "", s); sub(/[ \t]*\*+\/[ \t]*$/, "", s); return s }
    function flush_group(   i) {
        if (!ng) return
        if (!headed) { print ""; print "## " module; if (desc != "") { print ""; print desc } ; headed = 1 }
        print ""; print "```text"
        for (i = 1; i <= ng; i++) print decl[i]
        print "```"
        if (gc != "") { print ""; print gc }
        for (i = 1; i <= ng; i++) if (gc == "" && !trail[i]) print hdr ": " name[i] > undoc
        ng = 0; gc = ""
    }
    /^#ifdef MEGABATCH_IMPLEMENTATION/ { flush_group(); exit }
    /^\/\/ ---- / {
        flush_group(); cm = ""
        if ($0 ~ /^\/\/ ---- end /) next
        module = $0; sub(/^\/\/ ---- /, "", module); sub(/ ----.*$/, "", module)
        headed = 0; desc = ""; indesc = 1; next
    }
    indesc && /^\/\/ / { d = $0; sub(/^\/\/ /, "", d); desc = desc (desc == "" ? "" : "\n") d; next }
    { indesc = 0 }
    incomment {
        cm = cm "\n" strip($0)
        if ($0 ~ /\*\//) incomment = 0
        next
    }
    /^MBDEF / {
        if (!ng) { gc = cm }
        cm = ""
        d = $0
        while (d !~ /\);/ && (getline line) > 0) d = d "\n" line
        rest = d; sub(/^.*\);/, "", rest)
        while (rest ~ /\/\*/ && rest !~ /\*\// && (getline line) > 0) { d = d "\n" line; rest = rest line }
        sub(/^MBDEF /, "", d)
        n = d; sub(/\(.*/, "", n); sub(/^.*[ *]/, "", n)
        ng++; decl[ng] = d; name[ng] = n; trail[ng] = (rest ~ /\/\*|\/\//)
        next
    }
    /^[ \t]*\/\*/ {
        flush_group()
        c = strip($0); cm = (cm == "" ? c : cm "\n" c)
        if ($0 !~ /\*\//) incomment = 1
        next
    }
    /^[ \t]*\/\// { flush_group(); c = strip($0); cm = (cm == "" ? c : cm "\n" c); next }
    /^typedef .*\);[ \t]*$/ { next }   # a function-pointer type between a comment and its functions
    { flush_group(); cm = "" }
    END { flush_group() }
    ' "$h"
done
}

gen > "$tmp/API.md"
if [ "${1:-}" = --write ]; then
    cp "$tmp/API.md" docs/API.md
    echo "wrote docs/API.md ($(grep -c '^## ' docs/API.md) modules, $(grep -c '^```text' docs/API.md) blocks)"
fi

# 1. every public function has a contract comment
if [ -s "$tmp/undoc" ]; then
    echo "FAIL: public functions without a contract comment in the header:"; sed 's/^/    /' "$tmp/undoc"
    fail=$((fail + 1))
else pass=$((pass + 1)); fi

# 2. docs/API.md is what the headers give
if [ -f docs/API.md ] && cmp -s "$tmp/API.md" docs/API.md; then pass=$((pass + 1))
else
    echo "FAIL: docs/API.md differs from the headers' comments (run: sh tests/docs/api.sh --write):"
    diff -u docs/API.md "$tmp/API.md" 2>&1 | head -n 40
    fail=$((fail + 1))
fi

# 3. every public function is in docs/API.md (by construction) and every mb_* name the docs
#    use exists in a header or an example's header (no stale or misspelt names; CHANGES.md
#    names old ones on purpose; mb_args.h and the like are files)
grep -oh '\bmb_[a-z0-9_]*\(\.h\)\?' README.md $(ls docs/*.md | grep -v CHANGES.md) | grep -v '\.h$\|_$' |
    sort -u > "$tmp/used" # a name ending in _ is a prefix (mb_st_*, mb__cuda_NAME)
missing=""
while read -r id; do
    grep -q "\\b$id\\b" megabatch.h megabatch_cuda.cuh examples/*.h || missing="$missing $id"
done < "$tmp/used"
if [ -n "$missing" ]; then echo "FAIL: the docs use names no header has:$missing"; fail=$((fail + 1))
else pass=$((pass + 1)); fi

echo "api: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
