#!/bin/sh
# From main to a kernel (issue 45, item 2): the CPU training step of examples/train_multitf.c
# reaches its kernels in at most 8 calls. build/compile/call_depth is the example built with
# -finstrument-functions and tests/docs/call_depth.c, which records each function's deepest
# path from main. It trains 3 steps on one thread (every pool item on the caller's thread),
# plain and with 2 layers, checkpointing and dropout, on the portable kernel variant (so the
# names are the same on every CPU). Under train_step:
#   1. every kernel is at most 8 calls from main: the CPU backend's operations (mb__cpu_*, but
#      the accessors *_of), the pool items (mb__rec_fwd_part, mb__rec_bwd_part, mb__gemm_part),
#      the row functions and the product (mb__lstm_fwd_row_base, mb__lstm_bwd_row_base,
#      mb__rk_product, mb__rk_pack). What they call inside (the cell, the product's tiles,
#      dropout's blocks, BLAS) is theirs;
#   2. each chain a doc shows after a line `<!-- call_depth: KERNEL -->` (a ```text block, one
#      function a line from main's first call, a bracketed note after a name allowed) is the
#      measured deepest path to KERNEL.
# Ends with "call-depth: N passed, N failed".   call_depth.sh [TRACED] [PREPARE]
cd "$(dirname "$0")/../.." || exit 2
bin=${1:-build/compile/call_depth} prep=${2:-build/prepare}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
"$prep" --synthetic --bars 30000 --features 2 --targets 3 --stride 40 --quiet \
    --out-train "$tmp/t.h5" --out-val "$tmp/v.h5" || { echo "call-depth: 0 passed, 1 failed (prepare)"; exit 1; }
n=0
for cfg in "" "--layers 2 --checkpoint-k 8 --dropout 0.1"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    CALL_DEPTH_OUT="$tmp/raw$n" "$bin" --train "$tmp/t.h5" --val "$tmp/v.h5" --epochs 1 --batch 16 --hidden 8 \
        --head 8 --max-batches 3 --threads 1 --cpu-kernel c --quiet $cfg > "$tmp/out" 2>&1 \
        || { bad "$bin $cfg:"; cat "$tmp/out"; }
done
cat "$tmp"/raw* > "$tmp/raw" 2>/dev/null
# the paths by name ("DEPTH main train train_step ..."), each function's deepest under train_step
tr ' ' '\n' < "$tmp/raw" | grep '^0x' | sort -u > "$tmp/addrs"
[ -s "$tmp/addrs" ] || { echo "call-depth: 0 passed, 1 failed (no paths recorded)"; exit 1; }
addr2line -f -e "$bin" $(cat "$tmp/addrs") | paste - - | awk '{ print $1 }' | paste -d' ' "$tmp/addrs" - > "$tmp/map"
awk 'NR == FNR { name[$1] = $2; next }
     { s = $1; for (i = 2; i <= NF; i++) s = s " " name[$i]; print s }' "$tmp/map" "$tmp/raw" |
    awk '$2 == "main" && $3 == "train" && $4 == "train_step"' |
    awk '{ f = $NF; if (!(f in d) || $1 > d[f]) { d[f] = $1; p[f] = $0 } } END { for (f in d) print p[f] }' |
    sort -n > "$tmp/deepest"
# 1. the kernels
kernels='^(mb__cpu_[a-z0-9_]+|mb__rec_(fwd|bwd)_part|mb__gemm_part|mb__lstm_(fwd|bwd)_row_base|mb__rk_product|mb__rk_pack)$'
awk '{ print $NF }' "$tmp/deepest" | grep -E "$kernels" | grep -v '_of$' > "$tmp/kernels"
[ "$(wc -l < "$tmp/kernels")" -ge 10 ] || bad "only $(wc -l < "$tmp/kernels") kernels reached (the trace is broken)"
while read -r k; do
    line=$(awk -v k="$k" '$NF == k' "$tmp/deepest")
    calls=$(( ${line%% *} - 1 ))
    if [ "$calls" -le 8 ]; then ok; else bad "$k is $calls calls from main: ${line#* }"; fi
done < "$tmp/kernels"
echo "kernels: $(wc -l < "$tmp/kernels"); the deepest: $(awk '{ print $NF }' "$tmp/deepest" | grep -Fxf "$tmp/kernels" |
    while read -r k; do awk -v k="$k" '$NF == k { print $1 - 1, k }' "$tmp/deepest"; done | sort -rn | head -n 3 | tr '\n' ' ')"
# 2. the chains in the docs
for md in README.md docs/*.md; do
    awk '/^<!-- call_depth: [a-z0-9_]+ -->$/ { k = $3; want = 1; next }
         want && /^```text$/ { on = 1; chain = ""; next }
         on && /^```$/ { print k "\t" chain; on = 0; want = 0; next }
         on { name = $1; chain = chain (chain == "" ? "" : " ") name }' "$md" > "$tmp/chains"
    while IFS="$(printf '\t')" read -r k chain; do
        got=$(awk -v k="$k" '$NF == k { $1 = ""; $2 = ""; sub(/^  /, ""); print }' "$tmp/deepest")
        if [ "$got" = "$chain" ]; then ok
        else bad "$md: the chain to $k is not the measured one:"; echo "  doc:      $chain"; echo "  measured: ${got:-(not reached)}"; fi
    done < "$tmp/chains"
done
[ -z "${CALL_DEPTH_LIST:-}" ] || cut -d" " -f1,4- "$tmp/deepest" | awk '{ $1 = $1 - 1; print }' > "$CALL_DEPTH_LIST"
echo "call-depth: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
