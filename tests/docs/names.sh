#!/bin/sh
# README.md and docs/DESIGN.md name only things that exist: every identifier with an
# underscore inside `code` spans (a function, field, type or macro: mb_meter_step,
# mb__backend_of, fwd_gates, keep_denormals, mtf_model_forward) must occur as a word in the
# sources: the headers, examples/, tests/, bench/ or the Makefile. File names (x.c, x.h, ...),
# flags (--name) and prefixes or suffixes (mb__cpu_..., _config_default) are not names.
# tests/docs/api.sh checks the mb_* names of every doc; this covers the rest of the two
# documents a newcomer reads first. Ends with `names: N passed, N failed` (one check per
# document).
cd "$(dirname "$0")/../.." || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
find megabatch.h megabatch_cuda.cuh Makefile examples tests bench -type f \
     \( -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' -o -name '*.sh' -o -name 'Makefile' \) \
     -exec cat {} + > "$tmp/src"
grep -o '[A-Za-z_][A-Za-z0-9_]*' "$tmp/src" | sort -u > "$tmp/words"
for md in ${*:-README.md docs/DESIGN.md}; do
    # the code spans outside fenced blocks, then their identifiers that hold an underscore
    awk '/^```/ { fence = !fence; next } !fence' "$md" | grep -o '`[^`]*`' |
        sed 's/[A-Za-z0-9_./-]*\.\(c\|h\|cu\|cuh\|md\|sh\|csv\|h5\|py\|txt\|pc\|svg\|onnx\|safetensors\)\b//g; s/--[a-z0-9-]*//g' |
        grep -o '[A-Za-z_][A-Za-z0-9_]*' | grep '_' | grep -v '^_\|_$' | sort -u > "$tmp/used"
    missing=$(comm -23 "$tmp/used" "$tmp/words" | tr '\n' ' ')
    if [ -n "$missing" ]; then echo "FAIL $md names what no source has: $missing"; fail=$((fail + 1))
    else pass=$((pass + 1)); fi
done
echo "names: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
