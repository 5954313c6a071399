"""Golden values for tests/test_metrics.c: examples/mb_metrics.h's trading metrics computed by
numpy and scipy (scipy.stats.pearsonr, scipy.stats.spearmanr) on the same float32 predictions
and targets.

Per horizon (column) j, the rules of mb_metrics.h (docs/TRADING.md, "Trading metrics"):
rows where the prediction or the target is NaN or Inf are left out (counted: nonfinite);
the hit rate is over the rows where both are nonzero (the others counted: zeros); ic is
pearsonr, rank_ic spearmanr (average ranks for ties), NaN with fewer than 2 rows or a
constant column (scipy's own answer there); the means over horizons are np.nanmean.

Cases: random Gaussian with a signal per horizon, ties (rounded values), exact zeros (and
-0) in predictions and targets, constant columns, N = 0, 1, 2, 3, K = 1 and K = 5, NaN and
Inf, integers with heavy ties. Each case has a split into uneven batches (some empty) that
the test feeds through the accumulator. Output (text, one number per token):
    cases
    per case: name n k batches
      the batch sizes (batches of them, summing to n)
      the predictions, n*k values, row-major (%.9g: float32 round-trips)
      the targets, likewise
      per horizon: n nonfinite zeros zero_pred zero_target hits hit ic rank_ic
      the means: hit ic rank_ic rows zeros nonfinite
Run (numpy and scipy from PyPI; make test needs no Python):
    python3 tests/golden/make_metrics_golden.py > tests/golden/metrics_golden.txt
"""
import warnings

import numpy as np
import scipy
import scipy.stats

warnings.simplefilter("ignore")  # scipy warns on constant input (and returns nan)
rng = np.random.default_rng(20261203)


def gaussian(n, k, betas):
    x = rng.standard_normal((n, k))
    y = x * np.asarray(betas) + rng.standard_normal((n, k))
    return x, y


def cases():
    x, y = gaussian(600, 5, [0.3, 0.1, 0.0, -0.2, 1.0])
    yield "gaussian", x, y
    x, y = gaussian(400, 5, [0.5, 0.2, 0.0, -0.5, 2.0])
    yield "ties", np.round(0.5 * x, 1), np.round(y, 1)
    x, y = gaussian(300, 5, [0.4, 0.0, -0.3, 0.8, 0.1])
    x[rng.random(x.shape) < 0.15] = 0.0
    y[rng.random(y.shape) < 0.20] = 0.0
    x[rng.random(x.shape) < 0.05] = -0.0
    y[rng.random(y.shape) < 0.05] = -0.0
    yield "zeros", x, y
    x, y = gaussian(50, 5, [0.5, 0.5, 0.5, 0.5, 0.5])
    x[:, 1] = 0.25    # a constant prediction
    y[:, 3] = -1.0    # a constant target
    x[:, 4] = 0.0     # every prediction 0: no hit rate either
    yield "constant", x, y
    yield "empty", np.zeros((0, 2)), np.zeros((0, 2))
    yield "one", np.array([[0.5]]), np.array([[-2.0]])
    yield "two", np.array([[0.1, 1.0, 0.0, 3.0, -1.0], [0.2, 1.0, 0.5, -3.0, -1.0]]), \
        np.array([[-1.0, 2.0, 1.0, 1.0, 0.0], [0.5, 3.0, 1.0, 2.0, 4.0]])
    yield "three", np.array([[0.3], [-0.1], [0.3]]), np.array([[1.0], [2.0], [-0.5]])
    x, y = gaussian(200, 5, [0.5, -0.5, 0.2, 0.0, 1.0])
    x[rng.random(x.shape) < 0.05] = np.nan
    y[rng.random(y.shape) < 0.05] = np.nan
    x[rng.random(x.shape) < 0.02] = np.inf
    y[rng.random(y.shape) < 0.02] = -np.inf
    x[:, 3] = np.nan  # a horizon with nothing finite
    yield "nonfinite", x, y
    x = rng.integers(-3, 4, (2000, 1)).astype(np.float64)
    yield "integers", x, np.clip(x + rng.integers(-2, 3, (2000, 1)), -3, 3)


def split(n):
    """Uneven batch sizes summing to n, some of them 0."""
    sizes, left = [], n
    while left > 0:
        b = int(rng.integers(0, max(2, left // 2) + 1))
        b = min(b, left)
        sizes.append(b)
        left -= b
    sizes.insert(int(rng.integers(0, len(sizes) + 1)), 0)
    return sizes


def horizon(p, t):
    fin = np.isfinite(p) & np.isfinite(t)
    nonfinite = int(p.size - fin.sum())
    p, t = p[fin], t[fin]
    n = p.size
    nz = (p != 0) & (t != 0)
    hits = int((np.sign(p[nz]) == np.sign(t[nz])).sum())
    hit = hits / nz.sum() if nz.sum() else np.nan
    ic = scipy.stats.pearsonr(p, t).statistic if n >= 2 else np.nan
    rank_ic = scipy.stats.spearmanr(p, t).statistic if n >= 2 else np.nan
    return [n, nonfinite, int(n - nz.sum()), int((p == 0).sum()), int((t == 0).sum()), hits, hit, ic, rank_ic]


def num(v):
    return "nan" if np.isnan(v) else f"{v:.17g}"


out = []
all_cases = list(cases())
out.append(str(len(all_cases)))
for name, x, y in all_cases:
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    n, k = x.shape
    sizes = split(n)
    out.append(f"{name} {n} {k} {len(sizes)}")
    out.append(" ".join(str(s) for s in sizes))
    out.append(" ".join(f"{v:.9g}" for v in x.flatten().tolist()))
    out.append(" ".join(f"{v:.9g}" for v in y.flatten().tolist()))
    per = [horizon(x[:, j].astype(np.float64), y[:, j].astype(np.float64)) for j in range(k)]
    for h in per:
        out.append(" ".join(str(v) for v in h[:6]) + " " + " ".join(num(v) for v in h[6:]))
    means = [np.nanmean([h[q] for h in per]) if any(not np.isnan(h[q]) for h in per) else np.nan for q in (6, 7, 8)]
    out.append(" ".join(num(v) for v in means) + f" {n} {sum(h[2] for h in per)} {sum(h[1] for h in per)}")
out.append(f"# numpy {np.__version__}, scipy {scipy.__version__}")
print("\n".join(out))
