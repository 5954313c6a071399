#!/bin/sh
# bundle.sh OUTDIR BIN... : copy CUDA binaries into OUTDIR and the shared libraries they
# need that a bare GPU machine lacks (HDF5 and its own dependencies, cmocka, ...) into
# OUTDIR/lib, all stripped. The binaries find OUTDIR/lib through DT_RPATH $ORIGIN/lib (make
# gpu-bundle links them with --disable-new-dtags): unlike RUNPATH, RPATH is also searched for
# the dependencies of dependencies (libhdf5 -> libsz, libaec, libcurl, ...), and it serves
# these binaries only, so the bundle's libz/libcrypto never shadow the GPU machine's own for
# python3/torch (no LD_LIBRARY_PATH). CUDA's own libraries (cudart, cuBLAS) and the C
# library's (libc, libm, libresolv, ...: they must match the machine's libc) are taken from
# the GPU machine.
set -eu
out=$1; shift
mkdir -p "$out/lib"
# the commit the binaries were built from (+ "dirty" when the tree had changes): run.sh prints it
echo "$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' dirty')" >"$out/COMMIT"
for bin in "$@"; do
    readelf -d "$bin" | grep -q '(RPATH).*\$ORIGIN/lib' || {
        echo "bundle.sh: $bin has no DT_RPATH \$ORIGIN/lib (build it with make gpu-bundle)" >&2; exit 1; }
    cp "$bin" "$out/"
    strip "$out/$(basename "$bin")"
    ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
            libcuda.so*|libcudart.so*|libcublas*.so*|libnvidia*) ;;
            *) [ -f "$out/lib/$(basename "$lib")" ] || { cp -L "$lib" "$out/lib/"; strip --strip-unneeded "$out/lib/$(basename "$lib")"; } ;;
        esac
    done
done
# every library a bundled binary needs, other than the C library's and CUDA's, resolves to lib/
bad=0
for b in "$out"/*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    ldd "$b" | awk -v lib="$(cd "$out/lib" && pwd)" '
        /not found/ { print; bad = 1 }
        /=> \// && $3 !~ "^" lib "/" && $1 !~ /^(libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnvidia)[.-]/ {
            print "  " $1 " from " $3 ", not lib/"; bad = 1 }
        END { exit bad }' || { echo "bundle.sh: $(basename "$b") resolves a library outside $out/lib" >&2; bad=1; }
done
[ $bad = 0 ] || exit 1
du -sh "$out" | awk '{print "bundle: " $1 " in " $2 " (every binary resolves its libraries from lib/)"}'
