#!/bin/sh
# tests/golden/multitf_v1.ckpt: a train_multitf checkpoint of the older format, whose options
# are the raw bytes of train_multitf.c's `options` struct (section "options", 176 bytes on
# x86-64 Linux), written by the last build before named keys (commit 57aff6f). test_train's
# test_old_format_checkpoint resumes it and checks what is refused. Options other than their
# defaults where a layout slip would show (no-ftz lay in the struct's former padding).
# Made on x86-64 Linux with gcc, from the repository root:
#   sh tests/golden/make_multitf_v1_ckpt.sh
# (the data as test_train makes it; the weights depend on the machine, the options do not).
set -e
rev=57aff6f
out=$(pwd)/tests/golden/multitf_v1.ckpt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$rev" | tar -x -C "$tmp"
(cd "$tmp" && make -s build/train_multitf build/prepare)
"$tmp/build/prepare" --synthetic --bars 60000 --features 8 --stride 30 --quiet \
    --out-train "$tmp/train.h5" --out-val "$tmp/val.h5"
rm -f "$out"
"$tmp/build/train_multitf" --train "$tmp/train.h5" --val "$tmp/val.h5" --quiet --epochs 1 \
    --batch 4 --hidden 2 --head 3 --layers 1 --max-batches 2 --lr 0.003 --clip 0.5 --weight-decay 0.02 \
    --chunk-fraction 0.5 --warmup 3 --schedule constant --seed 7 --checkpoint-k 2 --no-ftz --ckpt "$out"
