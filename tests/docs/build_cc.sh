#!/bin/sh
# README.md's plain-cc builds, run as written: the header dropped next to a program (here
# examples/quickstart.c as my_program.c), built with explicit flags (Debian's paths for HDF5 and
# OpenBLAS) and with no dependency at all (MEGABATCH_NO_HDF5 + MEGABATCH_NO_CBLAS: the binary
# needs libc and libm alone), each run; then `make install` gives what the docs' recipes
# include (TRADING.md's embedded live predictor, tests/docs/live.c, compiles with pkg-config's
# flags alone, from a directory without examples/). README.md's blocks are copies of the regions
# below (tests/docs/check.sh). Ends with `build-cc: N passed, N failed`.
cd "$(dirname "$0")/../.." || exit 2
root=$(pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else echo "FAIL: $1"; fail=$((fail + 1)); fi; }
cp megabatch.h "$tmp/" && cp examples/quickstart.c "$tmp/my_program.c" && cp tests/docs/live.c "$tmp/my_tool.c" || exit 2
cd "$tmp" || exit 2
# the program's own output: its last line is the error value it shows on purpose
ran() { ./"$1" > "$1.out" 2>&1 && grep -q '^expected error: mb_gemm' "$1.out"; }

if [ -f /usr/include/hdf5/serial/hdf5.h ]; then
    build_flags() {
        # snippet: build-cc-flags
        cc -std=c11 -O2 -I/usr/include/hdf5/serial my_program.c -o my_program \
           -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -lopenblas -pthread -lm
        # end snippet
    }
    check "the explicit-flags build (Debian's paths) builds and runs" 'build_flags && ran my_program'
else
    echo "build-cc: no /usr/include/hdf5/serial (not Debian's HDF5): the explicit-flags build not run"
fi

build_nodeps() {
    # snippet: build-cc-nodeps
    cc -std=c11 -O2 -DMEGABATCH_NO_HDF5 -DMEGABATCH_NO_CBLAS my_program.c -o my_program -pthread -lm
    # end snippet
}
rm -f my_program
check "the dependency-free build builds and runs" 'build_nodeps && ran my_program'
needed=$(readelf -d my_program 2>/dev/null | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
check "the dependency-free build needs no library but libc and libm (it needs: $needed)" \
    '[ -n "$needed" ] && [ -z "$(echo "$needed" | tr " " "\n" | grep -v "^libc\.so\|^libm\.so\|^$")" ]'

# make install: the headers the recipes include, found through pkg-config alone
make --no-print-directory -C "$root" install PREFIX="$tmp/prefix" > install.log 2>&1
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
rm -f megabatch.h
for h in "$root"/examples/*.h; do
    check "make install put $(basename "$h") where megabatch.pc's flags find it" \
        "[ -f \"$tmp/prefix/include/megabatch/$(basename "$h")\" ]"
done
check "TRADING.md's live predictor (tests/docs/live.c) compiles against the install alone" \
    'cc -std=c11 -fsyntax-only my_tool.c $(pkg-config --cflags megabatch) 2> syntax.err || { cat syntax.err; false; }'
echo "build-cc: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
