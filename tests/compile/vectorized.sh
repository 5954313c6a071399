#!/bin/sh
# Usage: tests/compile/vectorized.sh OBJECT
# The CPU LSTM's cell rows are written to be vectorized by the compiler (megabatch.h,
# "elementwise operations"), and nothing else says when they stop being: a float select
# that GCC keeps as a branch made the AVX2 rows scalar, 3.4x slower, and Clang's inliner
# left the cell out of line (25x), with every test green. This reads the disassembly of
# OBJECT (the implementation compiled at -O2 for x86-64, by GCC or Clang) and fails unless
# the AVX2 rows use packed 8-lane FMAs (ymm) and the AVX-512 rows packed 16-lane ones
# (zmm). On another CPU, or where the rows are not built (nvcc), it says so and passes.
set -eu
obj=$1
case "$(uname -m)" in x86_64) ;; *) echo "vectorized: skipped (not x86-64)"; exit 0 ;; esac
objdump -d --no-show-raw-insn "$obj" > "$obj.s"
fn() { awk -v f="<$1>:" '$2 == f { on = 1; next } on && /^$/ { exit } on' "$obj.s"; }
if [ -z "$(fn mb__lstm_fwd_row_avx2)" ]; then
    echo "vectorized: skipped (no mb__lstm_fwd_row_avx2 in $obj)"; exit 0
fi
fail=0
for v in avx2:ymm avx512:zmm; do
    name=${v%%:*} reg=${v#*:}
    for dir in fwd bwd; do
        f=mb__lstm_${dir}_row_$name
        n=$(fn "$f" | grep -c "vfmadd[0-9]*ps.*%$reg") || true
        if [ "$n" -gt 0 ]; then echo "vectorized: $f: $n packed FMAs on $reg"
        else echo "vectorized: FAIL: $f has no packed FMA on $reg (its loop is scalar)"; fail=1; fi
    done
done
exit $fail
