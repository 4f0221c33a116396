"""Statistics over seeds that the record scripts share (the seed is the unit: t intervals on G - 1 df, hmmscope.stats):

- `pool` / `t_interval` / `mean`: one quantity over a cell's seeds (stats.t_mean);
- `REGIME_CLAIMS` and `regime_claims`: Figure 1's regime claims (retrieval_gap > 0, icl_gain > 0,
  inference_beyond_counting = model - best counting < 0 requiring icl_gain; hmmscope/measure/regimes.py) pooled over
  a cell's seeds, each decided by stats.claim with the verdicts it requires, ready for regimes.regime;
- `regime_rows`: per cell, those claims and the regime word they give (regimes.regime);
- `dependency_order`: claims ordered so that each is decided after the claims its rule requires.

Used by task_diversity, ablations_tables, ablations_bayes and redecide; the package never imports this folder.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hmmscope.measure.regimes import regime
from hmmscope.stats import claim, rule, t_mean

# claim -> (its per-trial metric, the rule's op, the claims it requires): the claims of hmmscope.measure.regimes
REGIME_CLAIMS = {"retrieval_gap": ("eval/retrieval_gap", ">", ()),
                 "icl_gain": ("eval/unseen/icl_gain", ">", ()),
                 "inference_beyond_counting": ("eval/unseen/vs_best_counting", "<", ("icl_gain",))}


def regime_rule(name: str) -> str:
    """The rule of one of `REGIME_CLAIMS` (at 0)."""
    _, op, requires = REGIME_CLAIMS[name]
    return rule(op, 0, list(requires))


def pool(values, labels=None) -> dict:
    """The mean over seeds of `values` (one per seed, `labels` naming them) with its 95% t interval: value, lo, hi,
    df, n, degenerate (stats.t_mean, the seed as the unit)."""
    e = t_mean([float(v) for v in values], labels, unit="seed")
    return {"value": e.value, "lo": e.lo, "hi": e.hi, "df": e.df, "n": e.n, "degenerate": e.degenerate}


def t_interval(xs) -> tuple[float, float, float]:
    """(mean, lo, hi) of the finite values (95% t); NaNs where none is finite."""
    p = pool(xs)
    return float(p["value"]), float(p["lo"]), float(p["hi"])


def mean(xs) -> float:
    """The plain mean (NaN of nothing)."""
    xs = [float(x) for x in xs]
    return float(np.mean(xs)) if xs else math.nan


def regime_claims(values: dict[str, tuple[Sequence[float], Sequence]], statistic: Callable[[str], str] = str,
                  reason: str = "") -> list[tuple[object, dict]]:
    """Per claim of `values` ({name: (per-seed values, seed labels)}, taken in REGIME_CLAIMS's order): (stats.Claim,
    its pooled estimate as `pool` gives it), the claim decided on the pooled t interval by its rule, with the
    verdicts of the claims before it that it requires."""
    out, verdicts = [], {}
    for name in REGIME_CLAIMS:
        if name not in values:
            continue
        p = pool(*values[name])
        c = claim(name, statistic(name), p["value"], p["lo"], p["hi"], regime_rule(name), reason, dict(verdicts),
                  df=p["df"], degenerate=p["degenerate"])
        verdicts[name] = c.verdict
        out.append((c, p))
    return out


def regime_rows(regime_vals: dict, fresh=None) -> list[dict]:
    """Per cell of {cell: {claim: {seed: value}, "_trials": {seed: below best counting}}} (cells in order, `fresh`
    last, named "fresh"), Figure 1's regime claims pooled over seeds (t on G - 1 df, the seed as the unit, as the report's
    regime section; `regime_claims`: each claim's rule from hmmscope/measure/regimes.py), and the regime word
    they give (regimes.regime); beside them, how many trials are below best counting on their own paired CI over
    episodes (trials_below_best_counting)."""
    out = []
    for n in sorted(regime_vals, key=lambda n: (n == fresh, n)):
        row: dict = {"n_tasks": n, "cell": "fresh" if n == fresh else str(n)}
        by = {c: ([v[s] for s in sorted(v, key=str)], sorted(v, key=str)) for c, v in regime_vals[n].items()
              if c in REGIME_CLAIMS and v}
        pooled = regime_claims(by, reason="pooled over seeds")
        for cl, e in pooled:
            c = cl.name
            row.update({c: e["value"], f"{c}_lo": e["lo"], f"{c}_hi": e["hi"], f"{c}_verdict": cl.verdict,
                        "seeds": e["n"]})
        row["regime"] = regime([cl for cl, _ in pooled])
        below = regime_vals[n].get("_trials")
        if below:  # per trial, on its own paired CI over episodes (not a pooled statement)
            row["trials_below_best_counting"] = f"{sum(below.values())}/{len(below)}"
        out.append(row)
    return out


def dependency_order(items: Iterable, requires: Callable[[object], Iterable[str]], name: Callable[[object], str],
                     names: set[str] | None = None) -> list:
    """`items` ordered so that each comes after the items it `requires` (by `name`); a requirement that names no
    item of `names` (default: the items' own names) does not wait; an item waiting on a cycle is left out."""
    todo = list(items)
    names = {name(i) for i in todo} if names is None else names
    done: set[str] = set()
    out = []
    for _ in range(len(todo) + 1):
        for it in list(todo):
            if all(q in done or q not in names for q in requires(it)):
                out.append(it)
                done.add(name(it))
                todo.remove(it)
    return out
