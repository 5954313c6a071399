#!/bin/sh
# Data-parallel scaling of the example on CPU ranks (docs/BENCHMARKS.md, "Data parallel"):
# the same global batch (64) as 1 process (2 threads, and 1 thread) and as 2 ranks x 32
# (1 thread each), alternated, REPS times each; prints each run's summary line.
# usage: bench/dist_scaling.sh TRAIN.h5 VAL.h5 [REPS]   (after make build/train_multitf build/train_multitf_mpi)
set -eu
B=${BUILD:-build}
TRAIN=$1 VAL=$2 REPS=${3:-3}
ARGS="--train $TRAIN --val $VAL --epochs 2 --hidden 16 --head 32 --quiet"
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$REPS"); do
    printf '1 rank  x 64, 2 threads: '; "$B/train_multitf" $ARGS --batch 64 --threads 2 | grep '^summary'
    printf '2 ranks x 32, 1 thread:  '; mpirun --allow-run-as-root --oversubscribe -np 2 "$B/train_multitf_mpi" $ARGS --batch 32 --threads 1 | grep '^summary'
    printf '1 rank  x 64, 1 thread:  '; "$B/train_multitf" $ARGS --batch 64 --threads 1 | grep '^summary'
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
