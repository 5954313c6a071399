#!/usr/bin/env bash
# compare_lstm.sh - one LSTM layer, forward+backward, megabatch (build/bench/bench_lstm:
# full storage and checkpointed) vs PyTorch nn.LSTM (bench/pytorch/lstm.py), alternated
# round by round on the same cores with the same denormal setting; medians (min-max).
#
#   bench/compare_lstm.sh [--no-ftz] [--threads N] [--rounds R] [--iters I] [B,T,F,H ...]
#
# Defaults: flush-to-zero on both sides, 1 thread each, 5 rounds, 3 iterations (after a
# warm-up) per run, the shapes of docs/BENCHMARKS.md. Prints the commit, the command, the
# load average before and after, every run's line, then the table:
#   speedup = PyTorch time / megabatch full-storage time (median of the per-round ratios),
#   ckpt/full = checkpointed / full-storage time (median of the per-round ratios).
# Needs build/bench/bench_lstm (make it first) and python3 with torch; PYTHON overrides.
set -euo pipefail
cd "$(dirname "$0")/.."

ftz=() threads=1 rounds=5 iters=3 shapes=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-ftz) ftz=(--no-ftz); shift ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        -*) echo "error: unknown flag '$1' (see the header of $0)" >&2; exit 2 ;;
        *) shapes+=("$1"); shift ;;
    esac
done
[ ${#shapes[@]} -gt 0 ] || shapes=(128,480,32,64 128,480,32,256 128,480,128,64 128,480,128,256 32,480,8,16)
py=${PYTHON:-python3}
mb=build/bench/bench_lstm
[ -x $mb ] || { echo "error: $mb missing: run 'make $mb' first" >&2; exit 2; }

echo "## commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- megabatch.h bench || echo ' + uncommitted changes')"
echo "## command: $0 ${ftz[*]} --threads $threads --rounds $rounds --iters $iters ${shapes[*]}"
echo "## ftz=$([ ${#ftz[@]} -gt 0 ] && echo off || echo on) threads=$threads (both sides)"
echo "## $(uname -m) $(nproc) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
us() { sed -n 's/.*fwd+bwd *\([0-9.]*\) us\/step.*/\1/p'; }
for r in $(seq 1 "$rounds"); do
    for s in "${shapes[@]}"; do
        IFS=, read -r B T F H <<<"$s"
        run_mb() {
            local o; o=$($mb "${ftz[@]}" "$B" "$T" "$F" "$H" "$iters" f32 "$threads")
            echo "$o" | sed 's/^/  /'
            echo "$s mb_full $(echo "$o" | sed -n 1p | us)" >>"$out"
            echo "$s mb_ckpt $(echo "$o" | sed -n 2p | us)" >>"$out"
        }
        run_pt() {
            local o; o=$($py bench/pytorch/lstm.py "$B" "$T" "$F" "$H" "$iters" --threads "$threads" "${ftz[@]}")
            echo "  $o"
            echo "$s torch $(echo "$o" | us)" >>"$out"
        }
        echo "# round $r, $s"
        if [ $((r % 2)) = 1 ]; then run_mb; run_pt; else run_pt; run_mb; fi
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
printf '%-18s %-24s %-24s %-24s %-22s %-20s\n' "B,T,F,H" "megabatch full us/step" "checkpointed us/step" \
    "PyTorch us/step" "speedup (PyTorch/mb)" "ckpt/full"
for s in "${shapes[@]}"; do
    printf '%-18s %-24s %-24s %-24s %-22s %-20s\n' "$s" \
        "$(awk -v s="$s" '$1 == s && $2 == "mb_full" { print $3 }' "$out" | stat)" \
        "$(awk -v s="$s" '$1 == s && $2 == "mb_ckpt" { print $3 }' "$out" | stat)" \
        "$(awk -v s="$s" '$1 == s && $2 == "torch" { print $3 }' "$out" | stat)" \
        "$(ratio "$s" torch mb_full | stat %.2f)x" \
        "$(ratio "$s" mb_ckpt mb_full | stat %.2f)x"
done
