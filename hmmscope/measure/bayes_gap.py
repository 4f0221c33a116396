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
from ..oracles.bayes import bayes_oracle, why_not
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


def bayes_spec(cfg) -> BayesSpec | None:
    """The Bayes reference's settings for a run of cfg (eval.bayes, eval.bayes_tol; the draws seeded by data.seed),
    None when eval.bayes is off."""
    return BayesSpec(cfg.hmm, float(cfg.eval.bayes_tol), int(cfg.data.seed)) if cfg.eval.bayes else None


def bayes_preds(spec: BayesSpec | BayesComputed | None, ep: Episodes, ks: list[int]
                ) -> tuple[dict[int, torch.Tensor], dict]:
    """The Bayes reference at each k ({k: pred (N, T, V)}) and what meta says of it: {"computed": bool, "reason",
    "by_k": {k: {ce, mc_se, n_draws, converged, method}}}; a k where it did not converge is left out. A
    BayesComputed gives its first len(ep) episodes."""
    if isinstance(spec, BayesComputed):
        return {k: p[:len(ep)] for k, p in spec.preds.items() if k in ks}, {**spec.meta, "subset": len(ep)}
    if spec is None:
        return {}, {"computed": False, "reason": "off (eval.bayes = false)"}
    reason = why_not(spec.hmm)
    if reason:
        return {}, {"computed": False, "reason": f"not computed: {reason}"}
    preds, by_k = {}, {}
    for k in ks:
        r = bayes_oracle(spec.hmm, truncate_demos(ep, k), tol=spec.tol, seed=spec.seed)
        by_k[k] = {"ce": r.ce, "mc_se": r.mc_se, "n_draws": r.n_draws, "converged": r.converged, "method": r.method}
        if r.converged:
            preds[k] = r.pred
    missing = [k for k in ks if k not in preds]
    return preds, {"computed": not missing, "by_k": by_k, "reason": "" if not missing else (
        f"not converged to {spec.tol:g} nats/token at k = {', '.join(map(str, missing))} (K = "
        f"{max(by_k[k]['n_draws'] for k in missing)} draws): left out there")}


def bayes_gap(model: np.ndarray, bayes: np.ndarray, best_counting: np.ndarray | None, mc_se: float) -> dict:
    """The Bayes gap from per-episode CEs on the same episodes (SCIENCE.md 10): gap = model - bayes (paired, 95%
    normal CI over episodes); the room best_counting - bayes and the share of it the model closes, (best_counting -
    model) / room, a ratio of means with its delta-method CI over episodes; fault: the model is below bayes beyond the
    reference's Monte Carlo error (gap_hi + 3 mc_se < 0), a fault of the reference or the scoring, never a finding."""
    g, lo, hi = paired_ci(model - bayes)
    out = {"gap": g, "gap_lo": lo, "gap_hi": hi, "mc_se": float(mc_se), "n_episodes": len(model),
           "fault": bool(math.isfinite(hi) and hi + 3 * float(mc_se) < 0)}
    if best_counting is not None:
        a, b = best_counting - model, best_counting - bayes
        room, rlo, rhi = paired_ci(b)
        share = float(a.mean() / b.mean()) if b.mean() != 0 else math.nan
        n = len(a)
        var = (a.var(ddof=1) - 2 * share * np.cov(a, b)[0, 1] + share ** 2 * b.var(ddof=1)) / (n * b.mean() ** 2)
        h = 1.96 * math.sqrt(max(float(var), 0.0)) if n > 1 else math.nan
        out.update({"room": room, "room_lo": rlo, "room_hi": rhi, "share": share, "share_lo": share - h,
                    "share_hi": share + h})
    return out
