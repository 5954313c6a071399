#!/bin/sh
# bundle.sh OUTDIR BIN... : copy CUDA binaries into OUTDIR and the shared libraries they
# need that a bare GPU machine lacks (HDF5, cmocka, OpenBLAS, ...) into OUTDIR/lib, where
# the binaries' $ORIGIN/lib rpath finds them. CUDA's own libraries (cudart, cuBLAS) and
# the C library are taken from the GPU machine.
set -eu
out=$1; shift
mkdir -p "$out/lib"
for bin in "$@"; do
    cp "$bin" "$out/"
    ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
            libcuda.so*|libcudart.so*|libcublas*.so*|libnvidia*) ;;
            *) cp -L "$lib" "$out/lib/" ;;
        esac
    done
done
du -sh "$out" | awk '{print "bundle: " $1 " in " $2}'
