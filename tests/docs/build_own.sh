#!/bin/sh
# The README's "Building your own program" commands, run as written against a fresh
# `make install` into a temporary prefix: the C program with cc + pkg-config (built and run),
# the CUDA program with nvcc + pkg-config (built, when nvcc exists). README.md's blocks are
# copies of the regions below (tests/docs/check.sh verifies them). Each check passes or fails
# (a failed command fails this script: set -eu); without nvcc the CUDA ones are skipped,
# with a line that says so, and counted as skipped. Ends "build-own: N passed, N failed, N skipped".
set -eu
cd "$(dirname "$0")/../.."
root=$(pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
make --no-print-directory install PREFIX="$tmp/prefix" >/dev/null
cp examples/quickstart.c "$tmp/my_program.c"
cp tests/docs/cuda_open.cu "$tmp/my_program.cu"
cd "$tmp"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pass=0 fail=0 skipped=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# snippet: build-c
cc -std=c11 -O3 my_program.c -o my_program $(pkg-config --cflags --libs megabatch)
# end snippet
./my_program >/dev/null
pass=$((pass + 1))
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$NVCC" ]; then
    PATH=$(dirname "$NVCC"):$PATH
    # snippet: build-cuda
    nvcc -std=c++17 -O3 my_program.cu -o my_program_cuda $(pkg-config --cflags --libs megabatch-cuda)
    # end snippet
    if [ -x my_program_cuda ]; then pass=$((pass + 1)); else bad "nvcc made no my_program_cuda"; fi
    # nvcc given a .c file compiles it as plain C with the host compiler: the header says so
    if nvcc -c -x c my_program.cu -o wrong.o $(pkg-config --cflags megabatch-cuda) 2>err.txt; then
        bad "a .c through nvcc compiled"
    elif grep -q 'must be compiled by nvcc' err.txt; then pass=$((pass + 1))
    else bad "nvcc refused the plain C file without 'must be compiled by nvcc': $(head -c 300 err.txt | tr '\n' '|')"; fi
else
    echo "skipped: no nvcc: the README's CUDA build (and nvcc's refusal of plain C) not run"
    skipped=2
fi
cd "$root"
echo "build-own: $pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
