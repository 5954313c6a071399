#!/bin/sh
# Every C snippet of the docs run (tests/docs/snippets.c, built with MB_SNIPPETS_MAIN as
# build/compile/snippets_run): in a temporary directory with train.h5 (build/prepare,
# synthetic), its copy untrusted.h5 and an empty run/, as the snippets expect. Ends with
# `snippets: N passed, N failed` (the program's own line).
set -eu
cd "$(dirname "$0")/../.."
B=${B:-build}
for f in "$B/prepare" "$B/compile/snippets_run"; do
    if [ ! -x "$f" ]; then echo "FAIL: $f is not built (make build)"; echo "snippets: 0 passed, 1 failed"; exit 1; fi
done
root=$(pwd) tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$B/prepare" --synthetic --bars 16000 --features 2 --targets 2 --stride 50 --quiet --out-train "$tmp/train.h5" \
    --out-val "$tmp/val.h5"
cp "$tmp/train.h5" "$tmp/untrusted.h5"
mkdir "$tmp/run"
cd "$tmp"
"$root/$B/compile/snippets_run"
