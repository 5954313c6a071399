#!/usr/bin/env bash
# compare_lstm.sh - one LSTM layer, forward+backward, megabatch (build/bench/bench_lstm:
# full storage and checkpointed) vs PyTorch nn.LSTM (bench/pytorch/lstm.py), alternated
# round by round on the same cores with the same denormal setting; medians (min-max).
#
#   bench/compare_lstm.sh [--no-ftz] [--threads N] [--rounds R] [--iters I] [--coretypes "own Haswell"]
#                         [B,T,F,H ...]
#
# Defaults: flush-to-zero on both sides, 1 thread each, 5 rounds, 3 iterations (after a
# warm-up) per run, the shapes of docs/BENCHMARKS.md. Prints the commit, the command, the
# load average before and after, every run's line, then the table:
#   speedup = PyTorch time / megabatch full-storage time (median of the per-round ratios),
#   ckpt/full = checkpointed / full-storage time (median of the per-round ratios).
# megabatch runs once a round per OpenBLAS kernel of --coretypes (default "own Haswell"):
# "own" with OPENBLAS_CORETYPE unset (OpenBLAS's own pick), any other word with
# OPENBLAS_CORETYPE set to it for that run alone; each gets its rows, and the kernels that
# ran (OpenBLAS's core, megabatch's LSTM kernel avx512/avx2/c) are printed before the table.
# A word CORE:K also runs megabatch's own LSTM kernels K (MB_LSTM_KERNEL=K: avx512, avx2, c;
# the same results): "Haswell:avx2" is what a CPU without AVX-512 runs, on this one.
# Needs build/bench/bench_lstm (make it first) and python3 with torch; PYTHON overrides.
set -euo pipefail
cd "$(dirname "$0")/.."

ftz=() threads=1 rounds=5 iters=3 shapes=() coretypes="own Haswell"
while [ $# -gt 0 ]; do
    case "$1" in
        --no-ftz) ftz=(--no-ftz); shift ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --coretypes) coretypes=$2; shift 2 ;;
        -*) echo "error: unknown flag '$1' (see the header of $0)" >&2; exit 2 ;;
        *) shapes+=("$1"); shift ;;
    esac
done
[ ${#shapes[@]} -gt 0 ] || shapes=(128,480,32,64 128,480,32,256 128,480,128,64 128,480,128,256 32,480,8,16)
py=${PYTHON:-python3}
mb=build/bench/bench_lstm
[ -x $mb ] || { echo "error: $mb missing: run 'make $mb' first" >&2; exit 2; }

echo "## commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- megabatch.h bench || echo ' + uncommitted changes')"
echo "## command: $0 ${ftz[*]} --threads $threads --rounds $rounds --iters $iters --coretypes \"$coretypes\" ${shapes[*]}"
echo "## ftz=$([ ${#ftz[@]} -gt 0 ] && echo off || echo on) threads=$threads (both sides)"
echo "## $(uname -m) $(nproc) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp)
trap 'rm -f "$out" "$out.kernels"' EXIT
us() { sed -n 's/.*fwd+bwd *\([0-9.]*\) us\/step.*/\1/p'; }
for r in $(seq 1 "$rounds"); do
    for s in "${shapes[@]}"; do
        IFS=, read -r B T F H <<<"$s"
        run_mb() { # OpenBLAS's kernel: own (OPENBLAS_CORETYPE unset) or that core type[:our kernel]
            local o ct=$1 e=(env -u OPENBLAS_CORETYPE)
            [ "${ct%%:*}" = own ] || e=(env OPENBLAS_CORETYPE="${ct%%:*}")
            case $ct in *:*) e+=(MB_LSTM_KERNEL="${ct#*:}") ;; esac
            o=$("${e[@]}" $mb "${ftz[@]}" "$B" "$T" "$F" "$H" "$iters" f32 "$threads")
            echo "$o" | sed "s/^/  [$ct] /"
            echo "$s mb_full_$ct $(echo "$o" | sed -n 1p | us)" >>"$out"
            echo "$s mb_ckpt_$ct $(echo "$o" | sed -n 2p | us)" >>"$out"
            echo "$ct $(echo "$o" | sed -n '1s/^\(cpu ([^)]*)\).*/\1/p')" >>"$out.kernels"
        }
        run_pt() {
            local o; o=$($py bench/pytorch/lstm.py "$B" "$T" "$F" "$H" "$iters" --threads "$threads" "${ftz[@]}")
            echo "  $o"
            echo "$s torch $(echo "$o" | us)" >>"$out"
        }
        echo "# round $r, $s"
        if [ $((r % 2)) = 1 ]; then for ct in $coretypes; do run_mb "$ct"; done; run_pt
        else run_pt; for ct in $(echo "$coretypes" | tr ' ' '\n' | tac); do run_mb "$ct"; done; fi
    done
done
echo "## load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
# median (min-max) of a list of numbers
stat() { sort -g | awk -v f="${1:-%.1f}" '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                                                           printf f " (" f "-" f ")", m, v[1], v[NR] }'; }
ratio() { # shape, numerator key, denominator key: per-round ratios
    paste <(awk -v s="$1" -v k="$2" '$1 == s && $2 == k { print $3 }' "$out") \
          <(awk -v s="$1" -v k="$3" '$1 == s && $2 == k { print $3 }' "$out") | awk '{ printf "%.3f\n", $1 / $2 }'
}
sort -u "$out.kernels" | sed 's/^/## kernels: /'
printf '%-18s %-13s %-24s %-24s %-24s %-22s %-20s\n' "B,T,F,H" "OpenBLAS" "megabatch full us/step" \
    "checkpointed us/step" "PyTorch us/step" "speedup (PyTorch/mb)" "ckpt/full"
for s in "${shapes[@]}"; do
    for ct in $coretypes; do
        printf '%-18s %-13s %-24s %-24s %-24s %-22s %-20s\n' "$s" "$ct" \
            "$(awk -v s="$s" -v k="mb_full_$ct" '$1 == s && $2 == k { print $3 }' "$out" | stat)" \
            "$(awk -v s="$s" -v k="mb_ckpt_$ct" '$1 == s && $2 == k { print $3 }' "$out" | stat)" \
            "$(awk -v s="$s" '$1 == s && $2 == "torch" { print $3 }' "$out" | stat)" \
            "$(ratio "$s" torch "mb_full_$ct" | stat %.2f)x" \
            "$(ratio "$s" "mb_ckpt_$ct" "mb_full_$ct" | stat %.2f)x"
    done
done
