"""The regime boundary of a task-diversity map (analysis/task_diversity.py, SCIENCE.md 8): where a gap measured per
seed on a grid of n_tasks falls through a threshold, with its 95% confidence set; and the gap pooled over the tail of
the grid.

n* = the n_tasks at which the mean retrieval gap over seeds falls through the threshold
(default 0.05 nats/token), interpolated linearly in log2(n_tasks) between the last grid value above it and the
first one below (the estimand: the crossing of the population mean curve so interpolated; a grid identifies no
more without a model of the curve's shape). Its 95% confidence set (hmmscope.stats.crossing_interval) inverts a
t test with the seed as the unit: every log2 n between grid cells where "the mean gap there = threshold" is not
rejected, the gap there being the same interpolation of each seed's own two cells (so a seed's effect shared by
its cells is carried through), on G - 1 df (G seeds). This is Fieller's interval for the crossing of two
neighbouring cells, extended over the grid; at the true crossing it is an exact t test, so the set covers n* with
probability >= 95% (tests/test_stats.py simulates the record's layout, 7 cells x 3 seeds: 95% where
one crossing is near the data, more where several cells hover near the threshold). The percentile bootstrap over
seeds it replaces covered 72-78% in the same simulations: with 3 seeds a resample of a cell has at most 3 distinct
values, so its spread understates the seed noise. Why not a t interval over seeds of each seed's own crossing: a
seed whose gap hovers near the threshold has no crossing, or several (in the record, seed 2's gap is 0.052 at
1024 tasks and 0.094 at 4096), and a per-seed crossing is a non-linear, biased function of noisy cells. Why not a
parametric fit (logistic in log2 n): its interval covers the fitted shape's crossing, and at 7 cells the shape is
not checkable. The limit of the choice: the estimand is the grid's interpolation; a smooth curve whose bend falls
between two cells crosses elsewhere (simulated logistic curve: its own crossing 8.37 against the interpolated
8.90 in log2 n, covered in 93% of simulations). The set also covers every grid cell whose t interval contains
the threshold (cells that cannot be told from it); where such cells reach an end of the grid (or the last cell is
not significantly below the threshold), the set is open, the boundary is "underpowered" (not located by this
grid and these seeds) and n*'s upper end is +inf. n* and its set are also given at thresholds 0.030, 0.035, ...,
0.060 (task_diversity_threshold.csv and the figure's third panel).

The tail table (`tail_table`): the gap pooled over the cells with n_tasks >= each grid value: trials with a positive
gap, and the mean over seeds of each seed's mean over those cells with a t interval on G - 1 df.

The package never imports this folder.
"""
from __future__ import annotations

import math

import numpy as np

from hmmscope.stats import crossing_interval, t_mean


def boundary(ns, per_seed: dict, threshold: float) -> dict:
    """n* and its 95% confidence set at one threshold (module docstring) from {seed: {n_tasks: gap}}."""
    seeds = sorted(per_seed, key=str)
    Y = np.array([[per_seed[s].get(int(n), math.nan) for n in ns] for s in seeds], float)
    c = crossing_interval(np.log2(ns), Y, threshold)

    def n_of(x: float) -> float:
        return 2.0 ** x if math.isfinite(x) else x

    if c.degenerate:
        power = f"no power: {c.degenerate}"
    elif c.open:
        und = ", ".join(str(int(round(2 ** u))) for u in c.undecided)
        power = ("underpowered: the 95% confidence set runs past the end of the grid, so the boundary is not located "
                 "by this grid and these seeds" + (f" (cells whose t interval contains {threshold:g}: {und})" if und
                                                  else ""))
    else:
        power = "ok"
    pieces = "; ".join(f"[{n_of(a):.4g}, {n_of(b):.4g}]" for a, b in c.pieces)
    return {"threshold": threshold, "log2_n_star": c.value, "log2_lo": c.lo, "log2_hi": c.hi, "n_star": n_of(c.value),
            "n_star_lo": n_of(c.lo), "n_star_hi": n_of(c.hi), "confidence_set_n": pieces,
            "undecided_cells": ";".join(str(int(round(2 ** u))) for u in c.undecided), "grid": f"{int(ns[0])}..{int(ns[-1])}",
            "n_seeds": c.n, "df": c.df, "method": "Fieller / t-test inversion on the log2-interpolated gap, seeds "
            "as the unit (stats.crossing_interval)", "power": power, "degenerate": c.degenerate}


def tail_table(ns, per_seed: dict) -> list[dict]:
    """The tail table (module docstring) from the grid `ns` and {seed: {n_tasks: gap}}."""
    tail = []
    for n0 in ns:
        cells = [int(n) for n in ns if n >= n0]
        gaps = [g for s in per_seed for n, g in per_seed[s].items() if n in cells]
        units = {s: float(np.mean([per_seed[s][n] for n in cells if n in per_seed[s]])) for s in per_seed
                 if any(n in per_seed[s] for n in cells)}
        e = t_mean(list(units.values()), list(units), unit="seed")
        tail.append({"n_tasks_from": int(n0), "cells": len(cells), "trials": len(gaps),
                     "positive": int(sum(g > 0 for g in gaps)), "mean": e.value, "lo": e.lo, "hi": e.hi, "df": e.df,
                     "method": f"mean over seeds of each seed's mean gap over these cells; {e.method}"})
    return tail
