"""Few-cluster estimates: t intervals over seeds, paired within-block effects, percentile intervals.

Few-cluster inference (the one method hmmscope uses for effects across replicate seeds). With G
seeds, an effect that varies from seed to seed has at most G - 1 degrees of freedom, however many
trials each seed holds: the trials of one seed share its data and initialization. `t_mean` is the
t interval on G unit values (t with G - 1 df); `paired_effect` reduces a two-level comparison (e.g.
RoPE - absolute) to one value per seed, the mean over blocks (levels of the other swept factors,
e.g. gamma) of the within-(seed, block) difference, and applies `t_mean` to those seed values. A
blocking factor is thus never estimated (it cancels within each pair), so one gamma level, or a
gamma level per seed, costs no degree of freedom. With one seed the blocks are the replicates (the
effect's spread across blocks is its noise), and the estimate says so. Exact under normal seed
effects; tests/test_stats.py checks the coverage by simulation (planted null effects, 3 seeds).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A mean over replicate units with its 95% t interval (module docstring, few-cluster inference)."""

    value: float
    lo: float
    hi: float
    se: float
    df: float  # n - 1 for a t on n units; NaN when no interval
    p: float  # two-sided, against 0
    n: int  # units
    unit: str  # what a unit is, e.g. "seed", "block (one seed)"
    method: str
    degenerate: str = ""  # why the statistic cannot vary ("" when it can)
    units: tuple = ()  # (label, value) per unit, for figures and tables

    @property
    def ok(self) -> bool:
        return math.isfinite(self.value)


def t_mean(values, labels=None, *, unit: str = "replicate", level: float = 0.95) -> Estimate:
    """Mean of the finite `values` (one per unit) with a t interval on n - 1 df. One unit: no interval
    (df 0); n equal values: a zero-width interval, marked degenerate."""
    from scipy import stats as st  # lazy: scipy.stats (~0.3 s) off every process that imports stats (training, sweep workers)

    x = np.asarray(values, float)
    lab = list(labels) if labels is not None else list(range(len(x)))
    keep = np.isfinite(x)
    x, lab = x[keep], [v for v, k in zip(lab, keep) if k]
    n = len(x)
    units = tuple(zip(lab, (float(v) for v in x)))
    method = f"t on {n} {unit} values ({max(n - 1, 0)} df)"
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0, unit, method)
    m = float(x.mean())
    if n == 1:
        return Estimate(m, math.nan, math.nan, math.nan, 0.0, math.nan, 1, unit, method, "", units)
    sd = float(x.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(m)):
        return Estimate(m, m, m, 0.0, float(n - 1), math.nan, n, unit, method,
                        f"all {n} {unit} values equal {m:.4g}: the statistic does not vary", units)
    se = sd / math.sqrt(n)
    q = float(st.t.ppf(0.5 + level / 2, n - 1))
    p = float(2 * st.t.sf(abs(m) / se, n - 1))
    return Estimate(m, m - q * se, m + q * se, se, float(n - 1), p, n, unit, method, "", units)


def _welch(x1, x0, labels1, labels0, unit: str, level: float = 0.95) -> Estimate:
    """Difference of means of two independent sets of unit values, Welch t (Satterthwaite df)."""
    from scipy import stats as st  # lazy: scipy.stats (~0.3 s) off every process that imports stats (training, sweep workers)

    a, b = np.asarray(x1, float), np.asarray(x0, float)
    d = float(a.mean() - b.mean())
    units = tuple((f"{lab} (level 1)", float(v)) for lab, v in zip(labels1, a)) + \
        tuple((f"{lab} (level 0)", float(v)) for lab, v in zip(labels0, b))
    method = f"Welch t on {len(a)} + {len(b)} {unit} means (unpaired)"
    if len(a) < 2 or len(b) < 2:
        return Estimate(d, math.nan, math.nan, math.nan, 0.0, math.nan, len(a) + len(b), unit, method, "", units)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se <= 1e-12 * max(1.0, abs(d)):
        return Estimate(d, d, d, 0.0, float(len(a) + len(b) - 2), math.nan, len(a) + len(b), unit, method,
                        f"every {unit} value equal within each level: the statistic does not vary", units)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    q = float(st.t.ppf(0.5 + level / 2, df))
    p = float(2 * st.t.sf(abs(d) / se, df))
    return Estimate(d, d - q * se, d + q * se, se, float(df), p, len(a) + len(b), unit, method, "", units)


def _objects(v, n: int) -> np.ndarray:
    """A 1-D object array of the n labels in v (tuples stay tuples); zeros for None."""
    out = np.zeros(n, object)
    if v is not None:
        for i, x in enumerate(v):
            out[i] = x
    return out


def paired_effect(y, treat, cluster=None, blocks=None) -> Estimate | str:
    """Level 1 - level 0 of `treat` on `y` with seeds (`cluster`) as the unit (module docstring).

    y (n,) floats (NaN rows dropped), treat (n,) bools, cluster (n,) seed labels or None (one seed),
    blocks (n,) hashable block labels (e.g. tuples of the other swept factors' values) or None. Each
    (seed, block) cell that holds both levels gives d = mean(level 1) - mean(level 0); a seed's value is
    the mean of its cells' d; the estimate is `t_mean` over seeds (G - 1 df). With one seed, the cells
    (blocks) are the units. No cell with both levels: a string saying why when no block holds both
    levels (the effect is confounded with the blocks); else an unpaired Welch t on (seed, level) means
    of block-centred y. Returns an Estimate, or a string saying why nothing can be estimated.
    """
    y = np.asarray(y, float)
    n = len(y)
    t = np.asarray(treat, bool)
    c, b = _objects(cluster, n), _objects(blocks, n)
    keep = np.isfinite(y)
    y, t, c, b = y[keep], t[keep], c[keep], b[keep]
    if t.all() or not t.any():
        return "only one level has this metric"
    cells: dict = {}
    for yi, ti, ci, bi in zip(y, t, c, b):
        cells.setdefault((ci, bi), ([], []))[int(ti)].append(yi)
    d = {k: float(np.mean(v[1]) - np.mean(v[0])) for k, v in cells.items() if v[0] and v[1]}
    seeds = sorted({k[0] for k in d}, key=str)
    if d and len(set(c)) >= 2:
        vals = [float(np.mean([v for k, v in d.items() if k[0] == s])) for s in seeds]
        est = t_mean(vals, seeds, unit="seed")
        return dataclasses.replace(est, method=f"paired within-block differences, {est.method}")
    if d:
        keys = sorted(d, key=str)
        est = t_mean([d[k] for k in keys], [k[1] for k in keys], unit="block (one seed)")
        return dataclasses.replace(est, method=f"paired within-block differences, one seed: {est.method}; the "
                                               "effect's spread across blocks stands in for the seed noise")
    both = {bi for bi in set(b) if t[b == bi].any() and not t[b == bi].all()}
    if not both:
        return "confounded: no block holds both levels, so the effect cannot be told from the blocks"
    sel = np.isin(b, list(both))
    yc = y.copy()
    for bi in both:
        yc[b == bi] -= y[b == bi].mean()
    unit = "seed" if len(set(c)) >= 2 else "trial"
    labels = c if unit == "seed" else np.arange(len(y))
    out = {}
    for yi, ti, li in zip(yc[sel], t[sel], labels[sel]):
        out.setdefault((int(ti), li), []).append(yi)
    g1 = sorted((k[1] for k in out if k[0] == 1), key=str)
    g0 = sorted((k[1] for k in out if k[0] == 0), key=str)
    return _welch([np.mean(out[(1, k)]) for k in g1], [np.mean(out[(0, k)]) for k in g0], g1, g0, unit)


def percentile_ci(b, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite values of b (NaN, NaN when none)."""
    b = np.asarray(b, float)
    b = b[np.isfinite(b)]
    if len(b) == 0:
        return math.nan, math.nan
    a = 100 * (1 - level) / 2
    lo, hi = np.percentile(b, [a, 100 - a])
    return float(lo), float(hi)
