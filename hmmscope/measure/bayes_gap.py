"""The Bayes reference in evaluation (SCIENCE.md 10): its settings for a run (`bayes_spec`), its predictions per k
of Figure 1 where the family allows it and its Monte Carlo part converged (`bayes_preds`), and a model's Bayes gap,
the room above counting and the share of it the model closes (`bayes_gap`). evaluate.py puts them in Figure 1;
the reference itself is oracles/bayes.py.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..config import HMMConfig
from ..data.episodes import Episodes, truncate_demos
from ..oracles.bayes import bayes_oracle
from ..oracles.bayes_structures import why_not
from .regimes import paired_ci

__all__ = ["BayesSpec", "BayesComputed", "bayes_spec", "bayes_preds", "bayes_gap"]


class BayesSpec(NamedTuple):
    """What the Bayes reference of unseen tasks needs (``bayes_spec``): the family, its tolerance, the draws' seed."""

    hmm: HMMConfig
    tol: float
    seed: int


class BayesComputed(NamedTuple):
    """The Bayes reference already computed on a superset of the episodes (the first len(ep) of them are ep): the
    emergence curves take Figure 1's first episodes, so the reference is computed once per run."""

    preds: dict  # {k: pred (N, T, V)}
    meta: dict
    tokens: np.ndarray | None = None  # the superset's tokens: a subset is checked against them (bayes_preds)


def bayes_spec(cfg) -> BayesSpec | None:
    """The Bayes reference's settings for a run of cfg (eval.bayes, eval.bayes_tol; the draws seeded by data.seed),
    None when eval.bayes is off."""
    return BayesSpec(cfg.hmm, float(cfg.eval.bayes_tol), int(cfg.data.seed)) if cfg.eval.bayes else None


def bayes_preds(spec: BayesSpec | BayesComputed | None, ep: Episodes, ks: list[int]
                ) -> tuple[dict[int, torch.Tensor], dict]:
    """The Bayes reference at each k ({k: pred (N, T, V)}) and what meta says of it: {"computed": bool, "reason",
    "by_k": {k: {ce, mc_se, n_draws, converged, last_move, method}}}; where it did not converge at some k it is left
    out at every k (the comparisons across k, the in-context gain, need it at all of them). A BayesComputed gives its
    first len(ep) episodes, which must be ep (their tokens are checked)."""
    if isinstance(spec, BayesComputed):
        if spec.tokens is not None and not np.array_equal(spec.tokens[:len(ep)], np.asarray(ep.tokens)):
            raise ValueError("the Bayes reference was computed on other episodes than these")
        return {k: p[:len(ep)] for k, p in spec.preds.items() if k in ks}, {**spec.meta, "subset": len(ep)}
    if spec is None:
        return {}, {"computed": False, "reason": "off (eval.bayes = false)"}
    reason = why_not(spec.hmm)
    if reason:
        return {}, {"computed": False, "reason": f"not computed: {reason}"}
    preds, by_k = {}, {}
    for k in ks:
        r = bayes_oracle(spec.hmm, truncate_demos(ep, k), tol=spec.tol, seed=spec.seed)
        move = abs(r.history[-1][1] - r.history[-2][1]) if len(r.history) > 1 else 0.0
        by_k[k] = {"ce": r.ce, "mc_se": r.mc_se, "n_draws": r.n_draws, "converged": r.converged, "last_move": move,
                   "method": r.method}
        preds[k] = r.pred
    missing = [k for k in ks if not by_k[k]["converged"]]
    if missing:
        return {}, {"computed": False, "by_k": by_k, "reason": (
            f"not computed: not converged to {spec.tol:g} nats/token at k = {', '.join(map(str, missing))} (K = "
            f"{max(by_k[k]['n_draws'] for k in missing)} draws)")}
    return preds, {"computed": True, "by_k": by_k, "reason": ""}


def computed_on(spec: BayesSpec | None, ep: Episodes, ks: list[int]) -> BayesComputed | None:
    """The reference on ep, to be read by the evaluation sets of ep's first episodes (the emergence curves)."""
    if spec is None:
        return None
    preds, meta = bayes_preds(spec, ep, ks)
    return BayesComputed(preds, meta, np.asarray(ep.tokens))


def bayes_gap(model: np.ndarray, bayes: np.ndarray, best_counting: np.ndarray | None, mc_se: float,
              last_move: float = 0.0) -> dict:
    """The Bayes gap from per-episode CEs on the same episodes (SCIENCE.md 10): gap = model - bayes (paired, 95%
    normal CI over episodes, which covers the reference's Monte Carlo noise too: its draws are per episode); the room
    best_counting - bayes and, where the room is above 0 on its CI, the share of it the model closes, (best_counting -
    model) / room, a ratio of means with its delta-method CI over episodes (NaN where the room's CI reaches 0: the
    ratio is then unbounded); fault: the model is below bayes beyond the reference's Monte Carlo error and its last
    move in K (gap_hi + 3 mc_se + last_move < 0), a fault of the reference or the scoring, never a finding."""
    g, lo, hi = paired_ci(model - bayes)
    out = {"gap": g, "gap_lo": lo, "gap_hi": hi, "mc_se": float(mc_se), "n_episodes": len(model),
           "fault": bool(math.isfinite(hi) and hi + 3 * float(mc_se) + abs(float(last_move)) < 0)}
    if best_counting is not None:
        a, b = best_counting - model, best_counting - bayes
        room, rlo, rhi = paired_ci(b)
        share = float(a.mean() / b.mean()) if rlo > 0 else math.nan
        n = len(a)
        var = (a.var(ddof=1) - 2 * share * np.cov(a, b)[0, 1] + share ** 2 * b.var(ddof=1)) / (n * b.mean() ** 2)
        h = 1.96 * math.sqrt(max(float(var), 0.0)) if n > 1 else math.nan
        out.update({"room": room, "room_lo": rlo, "room_hi": rhi, "share": share, "share_lo": share - h,
                    "share_hi": share + h})
    return out
