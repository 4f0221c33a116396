"""The regime claims of Figure 1 and the regime word (SCIENCE.md 8, 9): retrieval gap, in-context gain, inference
beyond counting; `regime` names a run's (or a pooled setting's) regime from them. evaluate.py computes the per-episode
arrays and re-exports these; report/regime.py pools them over seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..stats import claim, rule

REGIMES = ("retrieval", "inference beyond counting", "counting", "worse than counting", "undetermined")
_Z = 1.96


def paired_ci(d: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% normal CI over episodes of per-episode values."""
    d = np.asarray(d, float)
    m = float(d.mean())
    h = _Z * float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    return m, m - h, m + h


def retrieval_gap(seen: np.ndarray, unseen: np.ndarray):
    """The retrieval-gap claim from per-episode excess CE over the task oracle on seen and unseen episodes
    (module docstring): stats.Claim with rule '> 0', plus the numbers as a dict."""
    seen, unseen = np.asarray(seen, float), np.asarray(unseen, float)
    value = float(unseen.mean() - seen.mean())
    se = math.sqrt(unseen.var(ddof=1) / len(unseen) + seen.var(ddof=1) / len(seen)) \
        if min(len(seen), len(unseen)) > 1 else float("nan")
    lo, hi = value - _Z * se, value + _Z * se
    c = claim("retrieval_gap", "(model CE - task-oracle CE) on unseen tasks minus on seen tasks, test segment, "
              "k = k_max, nats/token (difference of means over independent episodes, 95% normal CI)",
              value, lo, hi, rule(">", 0),
              "positive: the model is closer to the ceiling on the tasks it trained on than on fresh tasks of the "
              "same family (retrieval of memorized tasks); near 0: no retrieval")
    return c, {"value": value, "lo": lo, "hi": hi, "n_seen": len(seen), "n_unseen": len(unseen),
               "seen_excess_ce_task": float(seen.mean()), "unseen_excess_ce_task": float(unseen.mean())}


def regime_claims(gain: np.ndarray, vs_best: np.ndarray, k_max: int) -> list:
    """icl_gain and inference_beyond_counting (module docstring) from per-episode unseen-task arrays: the model's
    gain on the same tokens and its CE minus best_counting's at k_max (paired, 95% normal CIs)."""
    g, glo, ghi = paired_ci(gain)
    c_gain = claim("icl_gain", f"model CE(k = 0) - CE(k = {k_max}) on the same test tokens (positions >= 1), unseen "
                   "tasks, nats/token (paired over episodes, 95% normal CI)", g, glo, ghi, rule(">", 0),
                   "positive: the model's predictions of the same tokens improve with the demonstrations",
                   df=math.inf)
    v, vlo, vhi = paired_ci(vs_best)
    c_inf = claim("inference_beyond_counting", f"model CE - best_counting CE at k = {k_max}, unseen tasks, nats/token "
                  "(paired over episodes, 95% normal CI)", v, vlo, vhi, rule("<", 0, ["icl_gain"]),
                  "negative, with an in-context gain: the model infers more from the context than the best fitted "
                  "counting predictor (SCIENCE.md 9); >= 0: counting at best", {"icl_gain": c_gain.verdict},
                  df=math.inf)
    return [c_gain, c_inf]


def regime(claims) -> str:
    """The regime word (SCIENCE.md 9) from claims named retrieval_gap, icl_gain and inference_beyond_counting
    (stats.Claim, or dicts with name / verdict / ci_lo / ci_hi), per run or pooled over seeds: retrieval if the
    retrieval gap is supported; else inference beyond counting if that claim is supported; else "worse than
    counting" where the model's CE is above best counting's on its CI (lower end > 0); "counting" where the model is
    level with best counting (the CI contains 0); else undetermined (below best counting without an in-context gain
    shown, or no finite CI)."""
    def get(c, a):
        return c.get(a) if isinstance(c, Mapping) else getattr(c, a, None)

    by = {get(c, "name"): c for c in claims}
    if "retrieval_gap" in by and get(by["retrieval_gap"], "verdict") == "supported":
        return "retrieval"
    inf = by.get("inference_beyond_counting")
    if inf is None:
        return "undetermined"
    if get(inf, "verdict") == "supported":
        return "inference beyond counting"
    lo, hi = (float(x) if x is not None else math.nan for x in (get(inf, "ci_lo"), get(inf, "ci_hi")))
    if math.isfinite(lo) and lo > 0:
        return "worse than counting"
    if math.isfinite(lo) and math.isfinite(hi) and lo <= 0 <= hi:
        return "counting"
    return "undetermined"


def degenerate(ce: Mapping[int, np.ndarray], same: Mapping[int, np.ndarray], n_tokens: int) -> dict[int, str]:
    """Why a reference is degenerate at each k (SCIENCE.md 9), "" where it is not: ce[k] its per-token CE (N, P) at
    k, same[k] the columns of the same test tokens at every k. Degenerate at k: its mean CE at k is above a uniform
    guess (ln V); at every k: its in-context gain on the same tokens (CE at k = 0 minus at k_max) is negative. A
    degenerate reference is shown as such and never used for a room, an excess or a verdict."""
    ks = sorted(ce)
    why: dict[int, str] = {}
    if ks[0] == 0 and ks[-1] > 0:
        gain = float((ce[0][:, same[0]].mean(1) - ce[ks[-1]][:, same[ks[-1]]].mean(1)).mean())
        if gain < 0:
            why = {k: f"negative in-context gain on the same tokens ({gain:+.3f} from k = 0 to {ks[-1]})" for k in ks}
    for k in ks:
        m = float(np.mean(ce[k]))
        if not why.get(k) and m > math.log(n_tokens) + 1e-9:
            why[k] = f"CE {m:.3f} above a uniform guess (ln {n_tokens} = {math.log(n_tokens):.3f})"
    return {k: why.get(k, "") for k in ks}
