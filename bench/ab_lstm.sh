#!/bin/sh
# ab_lstm.sh - A/B of builds of bench_lstm: runs each binary in turn, ROUNDS times (the
# order reversed on even rounds), and prints every raw line, then per binary the median
# (min-max) of fwd and fwd+bwd us/step for full storage and for checkpointed, and the
# median (min-max) of the per-round ratios to the first binary. For changes too small to
# see in single runs on a shared machine (docs/BENCHMARKS.md says which used it).
#
#   bench/ab_lstm.sh ROUNDS "B T F H iters f32 threads" BIN1 BIN2 [BIN...]
#
# BINs: bench_lstm built from the trees compared (e.g. a git worktree of the old commit:
# make build/bench/bench_lstm there). Environment (MB_LSTM_KERNEL, OPENBLAS_CORETYPE) is
# passed through to every run alike.
set -eu
[ $# -ge 4 ] || { echo "usage: $0 ROUNDS \"B T F H iters f32 threads\" BIN1 BIN2 [BIN...]" >&2; exit 2; }
rounds=$1 args=$2
shift 2
echo "## command: $0 $rounds \"$args\" $*"
echo "## load before: $(cut -d' ' -f1-3 /proc/loadavg)"
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
r=1
while [ "$r" -le "$rounds" ]; do
    bins=$*
    [ $((r % 2)) -eq 0 ] && bins=$(for b in "$@"; do echo "$b"; done | tac | tr '\n' ' ')
    for b in $bins; do
        # shellcheck disable=SC2086
        "$b" $args | while read -r line; do echo "round $r $b $line"; done | tee -a "$raw"
    done
    r=$((r + 1))
done
echo "## load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# fields: round, bin, then bench_lstm's line (checkpoint=K, fwd X us/step, fwd+bwd Y us/step)
awk -v first="$1" -v bins="$*" '
function med(s, fmt,   n, a, i, j, t) { n = split(s, a, " ");
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return sprintf(fmt " (" fmt "-" fmt ")", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, a[1], a[n]) }
{ for (i = 1; i <= NF; i++) { if ($i ~ /^checkpoint=/) ck = ($i == "checkpoint=-1") ? "full" : "ckpt";
      if ($i == "fwd") f = $(i + 1); if ($i == "fwd+bwd") b = $(i + 1) }
  k = $3 SUBSEP ck; F[k] = F[k] " " f; FB[k] = FB[k] " " b; V[$3, ck, $2] = b }
END { nb = split(bins, order, " ");
    for (ck = 0; ck < 2; ck++) { m = ck ? "ckpt" : "full";
        for (o = 1; o <= nb; o++) { bin = order[o]; k = bin SUBSEP m; rs = "";
            for (r = 1; (bin, m, r) in V; r++) if ((first, m, r) in V) rs = rs " " sprintf("%.3f", V[bin, m, r] / V[first, m, r]);
            printf "%s %s: fwd %s  fwd+bwd %s us/step  fwd+bwd ratio to the first binary %s\n", m, bin, med(F[k], "%.1f"), med(FB[k], "%.1f"), med(rs, "%.3f") } } }' "$raw"
