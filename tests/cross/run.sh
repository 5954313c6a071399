#!/bin/sh
# tests/cross/run.sh [DIR] - the cross builds' checks (make cross-test; CI's cross stage).
# DIR (default build/cross) holds make cross's win/, arm64/ and linux/ binaries.
#   1. lstm_bits: the LSTM's forward + backward fingerprint, every CPU kernel, on Linux x86-64,
#      Windows x64 under Wine and ARM64 under qemu-aarch64: one hash for all. live_bits: the
#      same for the feature engine (every feature of 20,000 bars), its own log/sin/cos and
#      the plain C gemm's A B^T and the activations (the model head), every CPU kernel.
#   2. the cmocka tests that fit (tests/cross/cmocka.h) under Wine and under qemu-aarch64;
#      quickstart (threads, and MEGABATCH_NO_THREADS on Windows).
#   3. mtf_live.dll: live_host.exe (LoadLibrary/GetProcAddress) replays an MT5 CSV with
#      planted faults, window and stateful mode, against Linux's predict --live on the same
#      bars: the Linux build of the same library and the DLL under Wine must both match
#      predict bit for bit (the feature engine has its own log/sin/cos, docs/PLATFORMS.md).
#   4. no aligned AVX/AVX-512 stack access in the Windows binaries (MinGW-w64 cannot align
#      the stack beyond 16 bytes: GCC bug 54412).
#   5. the LSTM rows vectorize with FMAs in the Windows build (tests/compile/vectorized.sh).
# Prints MB_TEST_SEED (random tests replay with it). Exit 1 when a check fails, and when
# wine64 or qemu-aarch64 is missing (no silent skip).
set -u
D=${1:-build/cross}
fail=0
WINE=$(command -v wine64 2>/dev/null || ls /usr/lib/wine/wine64 2>/dev/null)
QEMU=$(command -v qemu-aarch64 2>/dev/null || command -v qemu-aarch64-static 2>/dev/null)
[ -n "$WINE" ] || { echo "✗ cross: wine64 not found (make cross-deps)"; exit 1; }
[ -n "$QEMU" ] || { echo "✗ cross: qemu-aarch64 not found (make cross-deps)"; exit 1; }
case $D in /*) ;; *) D=$(pwd)/$D ;; esac
export WINEDEBUG=-all WINEPREFIX="${WINEPREFIX:-$D/wineprefix}"
MB_TEST_SEED=${MB_TEST_SEED:-$(date +%s)}
export MB_TEST_SEED
echo "MB_TEST_SEED=$MB_TEST_SEED"
tmp=$(mktemp -d /tmp/mb_cross_XXXXXX)
trap 'rm -rf "$tmp"; "$(dirname "$WINE")"/wineserver* -k >/dev/null 2>&1' EXIT
ok() { echo "✓ $*"; }
bad() { echo "✗ $*"; fail=1; }
t0=$(date +%s)
"$WINE" cmd /c exit >/dev/null 2>&1 # the Wine prefix, once (about 10 s the first time)
echo "wine prefix ready in $(( $(date +%s) - t0 )) s"

# 1. one fingerprint everywhere: PROG's hashes on Linux, Wine and ARM64 (at least MIN lines)
seed=$((MB_TEST_SEED % 1000000))
one_hash() { # PROG MIN WHAT
    "$D/linux/$1" $seed > "$tmp/bits" 2>&1 || bad "$1 linux"
    "$WINE" "$D/win/$1.exe" $seed 2>&1 | tr -d '\r' >> "$tmp/bits" || bad "$1 wine"
    "$QEMU" "$D/arm64/$1" $seed >> "$tmp/bits" 2>&1 || bad "$1 arm64"
    sed 's/^/  /' "$tmp/bits"
    n=$(grep -c 'hash' "$tmp/bits"); u=$(sed -n 's/.* hash //p' "$tmp/bits" | sort -u | wc -l)
    if [ "$n" -ge "$2" ] && [ "$u" -eq 1 ]; then ok "$1: $n runs (Linux, Wine, ARM64; $3), one hash"
    else bad "$1: $n runs, $u different hashes"; fi
}
one_hash lstm_bits 5 "every kernel"
one_hash live_bits 5 "features, log/sin/cos; gemm, activations on every kernel"

# 2. the cmocka tests and quickstart
"$D/linux/test_platform" > "$tmp/out" 2>&1 && ok "linux test_platform" || { bad "linux test_platform"; cat "$tmp/out"; }
for t in "$D"/win/test_*.exe "$D"/win/quickstart_nothreads.exe; do
    name=$(basename "$t")
    if "$WINE" "$t" > "$tmp/out" 2>&1; then ok "wine $name $(grep -E '^\[  (PASSED|SKIPPED) ' "$tmp/out" | tr -d '\r' | tr '\n' ' ')"
    else bad "wine $name"; tr -d '\r' < "$tmp/out" | grep -E 'ERROR|LINE|FAILED|rror' | head -20; fi
done
for t in "$D"/arm64/test_*; do
    name=$(basename "$t")
    if "$QEMU" "$t" > "$tmp/out" 2>&1; then ok "qemu-aarch64 $name $(grep -E '^\[  (PASSED|SKIPPED) ' "$tmp/out" | tr '\n' ' ')"
    else bad "qemu-aarch64 $name"; grep -E 'ERROR|LINE|FAILED|rror' "$tmp/out" | head -20; fi
done

# 3. the DLL against predict --live
"$D/linux/make_live_case" "$tmp" "$seed" > /dev/null || bad "make_live_case"
for m in window stateful; do
    st=; [ $m = stateful ] && st=--stateful
    "$D/linux/predict" --model "$tmp/model.safetensors" --csv "$tmp/bars.csv" --live $st --out "$tmp/pred_$m.csv" \
        --quiet || bad "predict --live $m"
    "$D/linux/live_host" "$D/linux/libmtf_live.so" "$tmp/model.safetensors" "$tmp/bars.csv" "$tmp/so_$m.csv" $m \
        > "$tmp/host" 2>&1 || { bad "live_host (Linux .so) $m"; cat "$tmp/host"; }
    if cmp -s "$tmp/pred_$m.csv" "$tmp/so_$m.csv"; then ok "$m: libmtf_live.so == predict --live, bit for bit"
    else bad "$m: libmtf_live.so differs from predict --live"; fi
    if "$WINE" "$D/win/live_host.exe" "$D/win/mtf_live.dll" "$tmp/model.safetensors" "$tmp/bars.csv" \
        "$tmp/dll_$m.csv" $m > "$tmp/host" 2>&1; then ok "wine $(tr -d '\r' < "$tmp/host" | tail -1)"
    else bad "wine live_host.exe $m"; tr -d '\r' < "$tmp/host" | tail -20; fi
    if "$D/linux/cmp_live" "$tmp/pred_$m.csv" "$tmp/dll_$m.csv" 0 0 > "$tmp/cmp" 2>&1; then
        ok "$m: mtf_live.dll vs predict --live: $(tail -1 "$tmp/cmp")"
    else bad "$m: mtf_live.dll vs predict --live"; cat "$tmp/cmp"; fi
done

# 4. MinGW-w64 and 32/64-byte stack alignment
if command -v x86_64-w64-mingw32-objdump >/dev/null; then
    n=0
    for f in "$D"/win/*.exe "$D"/win/*.dll; do
        [ -f "$f" ] || { bad "no Windows binaries in $D/win"; continue; }
        k=$(x86_64-w64-mingw32-objdump -d "$f" | grep -cE 'vmov(aps|apd|dqa|dqa32|dqa64)[[:space:]].*%[yz]mm.*\(%r[sb]p\)|vmov(aps|apd|dqa|dqa32|dqa64)[[:space:]].*\(%r[sb]p\).*%[yz]mm')
        [ "$k" -eq 0 ] || { bad "$(basename "$f"): $k aligned 32/64-byte stack moves"; n=$((n + k)); }
    done
    [ $n -eq 0 ] && [ -f "$D/win/mtf_live.dll" ] && ok "no aligned ymm/zmm stack moves in the Windows binaries"
else
    bad "x86_64-w64-mingw32-objdump not found"
fi
# 5. the LSTM rows vectorize (with FMA instructions) in the MinGW-w64 build as on Linux
if PATH=/usr/x86_64-w64-mingw32/bin:$PATH sh tests/compile/vectorized.sh "$D/win/vectorized.o" > "$tmp/vec" 2>&1; then
    ok "MinGW-w64 -O2: the LSTM rows vectorize ($(grep -c 'packed FMAs' "$tmp/vec") rows with packed FMAs)"
else bad "MinGW-w64: the LSTM rows do not vectorize"; cat "$tmp/vec"; fi
echo "cross: $(( $(date +%s) - t0 )) s"
exit $fail
