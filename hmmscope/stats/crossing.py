"""Threshold crossings of a curve measured per unit (seed) on a grid, with a seed-level confidence set.

Threshold crossings (`crossing_interval`, task diversity's regime boundary n*): where a curve measured per
unit (seed) on a grid falls through a threshold, interpolated linearly between grid points, with the
confidence set that inverts the t test (G - 1 df) of "the mean curve there equals the threshold", each unit's
curve interpolated the same way (Fieller's interval, extended over the grid). It is open (inf) where grid
points that cannot be told from the threshold reach an end of the grid; tests/test_stats.py simulates its
coverage at the task-diversity record's layout (7 cells, 3 seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Crossing:
    """Where a curve measured on replicate units falls through a threshold, with its confidence set
    (`crossing_interval`). x is the grid's coordinate (e.g. log2 n_tasks)."""

    value: float  # first crossing of the unit-mean curve (interpolated); -inf: below from the first point; +inf: never
    lo: float  # hull of the confidence set; -inf / +inf: open past that end of the grid
    hi: float
    pieces: tuple  # the confidence set: ((a, b), ...) closed intervals of x, +-inf for the parts past the grid
    n: int  # units
    df: float  # n - 1
    level: float
    threshold: float
    undecided: tuple  # grid points whose t interval contains the threshold (cannot be told from it)
    degenerate: str = ""  # why nothing measures the noise ("" when something does)

    @property
    def open(self) -> bool:
        """The set runs past an end of the grid: the grid does not locate the crossing (underpowered)."""
        return not (math.isfinite(self.lo) and math.isfinite(self.hi))


def interp_crossing(x, y, threshold: float) -> float:
    """x where y (ordered by x) first falls below threshold, linear between grid points; -inf if y[0] is already
    below, +inf if no point is."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    below = np.flatnonzero(y < threshold)
    if len(below) == 0:
        return math.inf
    i = int(below[0])
    if i == 0:
        return -math.inf
    return float(x[i - 1] + (y[i - 1] - threshold) / (y[i - 1] - y[i]) * (x[i] - x[i - 1]))


def _accepted(a, b, c) -> list[tuple[float, float]]:
    """Sub-intervals of w in [0, 1] where the units' z(w) = a + w b (a, b: (n,) per unit) has
    mean(z)^2 <= c var(z) (sample variance): the t test of mean z = 0 does not reject (Fieller's quadratic)."""
    A, B = float(a.mean()), float(b.mean())
    S = np.cov(np.vstack([a, b]), ddof=1)
    p2, p1, p0 = B * B - c * S[1, 1], 2 * (A * B - c * S[0, 1]), A * A - c * S[0, 0]

    def f(w: float) -> float:
        return (p2 * w + p1) * w + p0

    size = max(abs(p2), abs(p1), abs(p0), 1e-300)
    if abs(p2) <= 1e-12 * size:  # linear
        roots = [-p0 / p1] if abs(p1) > 1e-12 * size else []
    else:
        disc = p1 * p1 - 4 * p2 * p0
        if abs(disc) <= 1e-9 * (p1 * p1 + abs(4 * p2 * p0)):  # a double root (e.g. no spread between units)
            roots = [-p1 / (2 * p2)]
        elif disc < 0:
            roots = []
        else:
            s = math.sqrt(disc)
            roots = [(-p1 - s) / (2 * p2), (-p1 + s) / (2 * p2)]
    roots = [r for r in roots if 0.0 <= r <= 1.0]
    cuts = sorted({0.0, 1.0, *roots})
    tol = 1e-9 * size
    out = [(w0, w1) for w0, w1 in zip(cuts[:-1], cuts[1:]) if f(0.5 * (w0 + w1)) <= tol]
    for w in cuts:  # isolated points: a tangent root, or a curve without noise crossing exactly there
        if f(w) <= tol and not any(p <= w <= q for p, q in out):
            out.append((w, w))
    return sorted(out)


def crossing_interval(x, Y, threshold: float, *, level: float = 0.95) -> Crossing:
    """The first x where the mean curve falls through `threshold`, and a confidence set for it, with the
    units (rows of Y, e.g. seeds) as the unit of replication.

    x: (K,) increasing grid; Y: (n, K) one curve per unit (a unit with a missing value is dropped).
    Estimand: the crossing of the mean curve interpolated linearly in x between grid points (what a grid
    identifies without a model of the curve's shape). Confidence set (Fieller / test inversion): every x
    in the grid's range where the t test (n - 1 df) of "mean curve at x = threshold" does not reject, the
    curve at x being the same interpolation of each unit's values, so seed effects shared across cells are
    carried through; past the last grid point (+inf side) when the last point is not significantly below
    the threshold (its t interval reaches it), before the first one when the first point is not
    significantly above. At the true crossing the test is an exact t test (normal unit effects), so the
    set, and its hull [lo, hi], covers the crossing with probability >= level; where only one crossing is
    near the data the coverage is level (tests/test_stats.py simulates it). Grid points whose t intervals
    contain the threshold cannot be told from it: the set covers them, and when they reach an end of the
    grid the hull is open (inf): the grid and these units do not locate the crossing (`Crossing.open`).
    With no spread between units the set shrinks to the exact crossings (a zero-width hull: degenerate).
    """
    from scipy import stats as st  # lazy: scipy.stats (~0.3 s) off every process that imports stats (training, sweep workers)

    x = np.asarray(x, float)
    Y = np.atleast_2d(np.asarray(Y, float))
    if x.ndim != 1 or Y.shape[1] != len(x) or len(x) < 2 or np.any(np.diff(x) <= 0):
        raise ValueError("x must be an increasing grid of >= 2 points and Y (units, len(x))")
    Y = Y[np.isfinite(Y).all(1)]
    n = len(Y)
    nan = (math.nan, math.nan)
    if n == 0:
        return Crossing(math.nan, *nan, (), 0, math.nan, level, threshold, (), "no complete unit")
    value = interp_crossing(x, Y.mean(0), threshold)
    if n < 2:
        return Crossing(value, *nan, (), 1, 0.0, level, threshold, (), "one unit: nothing measures the noise")
    q = float(st.t.ppf(0.5 + level / 2, n - 1))
    c = q * q / n
    D = Y - threshold
    m, se = D.mean(0), D.std(0, ddof=1) / math.sqrt(n)
    undecided = tuple(float(v) for v, mi, si in zip(x, m, se) if abs(mi) <= q * si)
    pieces: list[tuple[float, float]] = []
    if m[0] - q * se[0] <= 0:  # the first point is not significantly above: the crossing may lie before the grid
        pieces.append((-math.inf, float(x[0])))
    for i in range(len(x) - 1):
        for w0, w1 in _accepted(D[:, i], D[:, i + 1] - D[:, i], c):
            pieces.append((float(x[i] + w0 * (x[i + 1] - x[i])), float(x[i] + w1 * (x[i + 1] - x[i]))))
    if m[-1] + q * se[-1] >= 0:  # the last point is not significantly below: the crossing may lie past the grid
        pieces.append((float(x[-1]), math.inf))
    merged: list[list[float]] = []
    for a, b in sorted(pieces):
        if merged and a <= merged[-1][1] + 1e-12:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    pieces_t = tuple((a, b) for a, b in merged)
    lo, hi = (pieces_t[0][0], pieces_t[-1][1]) if pieces_t else nan
    degen = ""
    if np.all(D.std(0, ddof=1) <= 1e-12 * np.maximum(1.0, np.abs(m))):
        degen = f"all {n} units have the same curve: nothing measures the noise"
    return Crossing(value, float(lo), float(hi), pieces_t, n, float(n - 1), level, threshold, undecided, degen)
