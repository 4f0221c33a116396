"""The probes' statistics and claims: bootstrap CIs, the cross-fitted best layer, verdicts.

Statistics. 95% CIs are percentile bootstraps over test episodes (`n_boot` resamples, the same for every
target and layer, so differences are paired); the fitted probes are held fixed. Accuracy pools the
positions of the resampled episodes; chance = the majority-class rate on the test split (per task for
the within-task state). R^2 is variance-weighted over outputs (1 - sum SSE / sum SST).
Best layer, cross-fitted: the test episodes are split in two seeded halves; each half is scored at the
layer that is best on the *other* half, and the two are pooled. Choosing the best of L noisy layers on
the data that then measures it would bias the value upwards (and pooled over runs, into a false
verdict); cross-fitted, a flat curve gives a value centred on its level. Layers are re-chosen in
every resample.

Claims (stats.claim: the verdict is the rule applied to the CI on the row):
- {target}_beats_control: best-layer acc - max(control acc at those layers, chance) (R^2 - max(control
  R^2, 0) for belief); rule "> 0".
- kback{k}_beats_baseline: best-layer acc - (task, current token) baseline acc; rule "> 0".
- kback{k}_beats_token_stats: best-layer acc - the token statistics' acc (the current token o_t alone: the
  most frequent o_{t-k} given o_t on the probe's training rows, pooled over the probed tasks); rule "> 0".
  In a family whose tokens recur with a short period (the sticky family's clusters move along a fixed
  permutation), o_t alone predicts some o_{t-k} well above chance: this is what the probe gets for free.
- kback{k}_rises_then_falls: min(rise, fall), rise = best-layer acc - acc at the first layer, fall =
  best-layer acc - acc at the last layer (cross-fitted). A curve that only rises peaks at the last layer,
  so its fall, and the statistic, is <= 0 however concave it is. Rule "> 0"; < 3 layers: NaN.
- kback_peak_moves_up: OLS slope of the peak layer on k over the K values of k (k is the unit). CI: the
  hull of the t interval with K - 2 degrees of freedom and the bootstrap interval with peaks re-chosen
  in each resample (peak-location noise). Rule "> 0"; K < 3: NaN.
- kback_acc_falls_with_k: on the excess e(k) = best acc(k) - token-statistics acc(k) (what the probe
  knows of o_{t-k} beyond what o_t alone gives; the raw best acc when no token baseline is given, and the
  statistic says so): the largest adjacent difference e(k_{i+1}) - e(k_i) (the weakest fall). CI: [max of
  lower ends, max of upper ends] of the per-step percentile intervals at level 1 - 0.05 / (K - 1)
  (Bonferroni: simultaneous 95%), so "supported" means every step falls. Rule "< 0"; the reason lists
  Holm-adjusted bootstrap p-values per step.
- state_before_task (threshold-free): mean over the layers above the embedding (1..L; layer 0 left out) of
  the normalized accuracy clip((acc - chance) / (max acc - chance), 0, 1), max over those layers, state
  minus task (a target that becomes decodable at lower layers has the larger mean). The embedding is
  apart because there the current token alone decides: a state that the token reveals is "decodable" at
  layer 0 without any processing, and with layer 0 in the mean that alone could make the area positive.
  state_before_task_layer0: the same normalized accuracy at layer 0 (max over all layers), state minus
  task, its own row. state_before_task_reach{50,90}: reach(task) - reach(state) in layers, reach(frac) =
  the first layer (0 included) with normalized accuracy >= frac. Rule "> 0; requires task_beats_control,
  state_beats_control" for all four.

Works on per-episode hit counts and sums only: numpy, scipy and `stats`; must not import torch, sklearn or
the fits (a report can recompute claims without either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

from ...data import seeds
from ...stats import Claim, claim, holm, percentile_ci, rule
from .residuals import PROBE_TAG

NAN = float("nan")


def _halves(n: int, seed: int) -> np.ndarray:
    """(n,) bool: the first of the two seeded cross-fitting halves of the test episodes."""
    out = np.zeros(n, bool)
    out[seeds.rng(seed, PROBE_TAG, 4).permutation(n)[:(n + 1) // 2]] = True
    return out


def boot_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) multiplicities of the test episodes in each bootstrap resample."""
    idx = seeds.rng(seed, PROBE_TAG, 2).integers(0, n, (n_boot, n))
    w = np.zeros((n_boot, n))
    np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)
    return w


def nan_ratio(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


@dataclass
class TargetScores:
    """Per held-out episode: hits of the probe (n_test, L) and of its control, scored rows (n_test,)."""

    hits: np.ndarray
    control: np.ndarray
    counts: np.ndarray
    chance: float


def _first(x) -> np.ndarray:
    """Index of the first maximum along the last axis, NaN treated as -inf."""
    return np.argmax(np.where(np.isnan(x), -np.inf, x), -1)


def _take(x, idx):
    return np.take_along_axis(x, idx[..., None], -1)[..., 0]


def _crossfit(score_a, score_b, num_a, num_b, den):
    """Half A scored at the layer best on half B's score and vice versa; pooled: (sum of nums) / den."""
    la, lb = _first(score_b), _first(score_a)
    return (_take(num_a, la) + _take(num_b, lb)) / den, la, lb


def _norm_curve(acc, chance):
    """clip((acc - chance) / (max acc - chance), 0, 1) per row; NaN rows where max acc <= chance."""
    top = np.max(np.where(np.isnan(acc), -np.inf, acc), -1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.clip((acc - chance) / (top - chance), 0, 1)
    return np.where(top > chance, z, np.nan)


def _reach(norm, frac: float) -> np.ndarray:
    """First layer index with normalized accuracy >= frac (NaN for NaN rows)."""
    ok = np.isfinite(norm).all(-1)
    return np.where(ok, np.argmax(np.nan_to_num(norm, nan=-1.0) >= frac - 1e-12, -1), np.nan)


def _slope(x, Y) -> np.ndarray:
    """OLS slopes of each row of Y (..., K) on x (K,)."""
    xc = np.asarray(x, float) - np.mean(x)
    return (np.asarray(Y, float) - np.mean(Y, -1, keepdims=True)) @ xc / (xc @ xc)


def r2_curves(sums, w) -> np.ndarray:
    """Variance-weighted R^2 per layer for episode weights w (B, n_test): (B, L). sums: per layer (n, sy, syy, sse)."""
    out = []
    for s in sums:
        n, sy, syy, sse = (w @ a for a in s)
        out.append(1 - nan_ratio(sse.sum(-1), (syy - nan_ratio(sy ** 2, n)).sum(-1)))
    return np.stack(out, -1)


def state_before_task_values(layers, task_acc, state_acc, task_chance: float, state_chance: float) -> dict:
    """The threshold-free state-before-task statistics (module docstring) of accuracy curves (..., L) over `layers`:
    {"area", "area_state", "area_task"} over the layers above the embedding (each curve normalized by its own peak
    there) and {"layer0", "layer0_state", "layer0_task"} at layer 0 (normalized by the peak over all layers), each
    (...,); NaN where the layers have none. probe_claims uses it on every bootstrap row; a kept per-layer table
    (probes.csv) gives the point values."""
    lay = np.asarray(layers)
    ta, sa = np.asarray(task_acc, float), np.asarray(state_acc, float)
    up, nan = lay != 0, np.full(ta.shape[:-1], NAN)
    out = {k: nan for k in ("area", "area_state", "area_task", "layer0", "layer0_state", "layer0_task")}
    if up.any():
        et, es = np.mean(_norm_curve(ta[..., up], task_chance), -1), np.mean(_norm_curve(sa[..., up], state_chance), -1)
        out.update(area=es - et, area_state=es, area_task=et)
    if not up.all():
        i0 = int(np.flatnonzero(~up)[0])
        nt, ns = _norm_curve(ta, task_chance)[..., i0], _norm_curve(sa, state_chance)[..., i0]
        out.update(layer0=ns - nt, layer0_state=ns, layer0_task=nt)
    return out


class _Added:
    """Claims as they are decided, in order (a rule's "requires" reads the verdicts decided before it)."""

    def __init__(self):
        self.claims: list[Claim] = []
        self.verdicts: dict[str, str] = {}

    def __call__(self, name, stat, values, rule_, reason, lo_hi=None):
        v = np.asarray(values, float)
        lo, hi = lo_hi if lo_hi is not None else percentile_ci(v[1:])
        c = claim(name, stat, float(v[0]), lo, hi, rule_, reason, self.verdicts)
        self.claims.append(c)
        self.verdicts[name] = c.verdict


def probe_claims(layers, scores: dict[str, TargetScores], *, ks=(1, 2, 3, 4, 5), fracs=(0.5, 0.9),
                 n_boot: int = 1000, seed: int = 0, baseline: dict[int, np.ndarray] | None = None,
                 token_baseline: dict[int, np.ndarray] | None = None,
                 belief: tuple | None = None) -> tuple[list[Claim], list[dict], dict]:
    """Claims (module docstring), a summary row per target, and per-layer bootstrap CIs {target: (lo, hi)}.

    baseline: {k: (n_test,) hits of the (task, current token) baseline of kback{k}} (its counts are
    kback{k}'s); token_baseline: the same for the current token alone (token statistics).
    belief: (real, control) per-layer sums (n, sy, syy, sse), each (n_test, S).
    """
    lay = np.asarray(layers)
    n_test = len(next(iter(scores.values())).counts) if scores else len(belief[0][0][0])
    W = np.vstack([np.ones(n_test), boot_weights(n_test, n_boot, seed)])  # row 0: the point estimate
    A = _halves(n_test, seed)
    WA, WB = W * A, W * ~A
    add = _Added()
    summary, ci, cur, best = [], {}, {}, {}
    for t, s in scores.items():
        cur[t], best[t], ci[t], row = _target(t, s, lay, W, WA, WB, fracs, add)
        summary.append(row)
    if belief is not None:
        _belief(belief, lay, WA, WB, add)
    kk = [k for k in ks if f"kback{k}" in scores]
    on_excess = token_baseline is not None and all(k in token_baseline for k in kk)
    excess = {k: _kback(k, scores[f"kback{k}"], cur, best, lay, W, summary, baseline,
                        token_baseline if on_excess else None, add) for k in kk}
    if len(kk) >= 2:
        _kback_trends(kk, lay, cur, excess if on_excess else {k: best[f"kback{k}"] for k in kk}, on_excess, add)
    if "task" in scores and "state" in scores:
        _state_before_task(scores, cur, lay, fracs, add)
    return add.claims, summary, ci


def _target(t: str, s: TargetScores, lay, W, WA, WB, fracs, add):
    """One target's accuracy curve (1 + B, L), its cross-fitted best-layer accuracy, per-layer CIs (probe, control)
    and summary row; its claim that it beats its control."""
    L = len(lay)
    H, Hc, Cn = (np.asarray(x, float) for x in (s.hits, s.control, s.counts))
    n_all, nA, nB = W @ Cn, WA @ Cn, WB @ Cn
    acc = nan_ratio(W @ H, n_all[:, None])  # (1 + B, L)
    hA, hB, cA, cB = WA @ H, WB @ H, WA @ Hc, WB @ Hc
    b, la, lb = _crossfit(nan_ratio(hA, nA[:, None]), nan_ratio(hB, nB[:, None]), hA, hB, n_all)
    b[(nA == 0) | (nB == 0)] = NAN
    cb = (_take(cA, la) + _take(cB, lb)) / n_all
    ci = np.array([percentile_ci(acc[1:, l]) for l in range(L)]), \
        np.array([percentile_ci(nan_ratio(W[1:] @ Hc[:, l], n_all[1:])) for l in range(L)])
    peaks = lay[_first(acc)]
    norm = _norm_curve(acc[:1], s.chance)
    row = {"target": t, "peak_layer": int(peaks[0]), "peak_lo": percentile_ci(peaks[1:])[0],
           "peak_hi": percentile_ci(peaks[1:])[1], "max_acc": float(np.nanmax(acc[0])),
           "best_acc": float(b[0]), "best_layers": f"{lay[la[0]]}/{lay[lb[0]]}", "chance": s.chance,
           **{f"reach{round(100 * f)}": float(lay[int(r)]) if np.isfinite(r) else NAN
              for f in fracs for r in [_reach(norm, f)[0]]}}
    add(f"{t}_beats_control", "best-layer acc (cross-fitted) - max(control acc there, chance)",
        b - np.maximum(cb, s.chance), rule(">", 0),
        f"acc {b[0]:.3f} at layers {lay[la[0]]}/{lay[lb[0]]} (each half at the other half's best) vs control "
        f"{cb[0]:.3f}, chance {s.chance:.3f}")
    return acc, b, ci, row


def _belief(belief: tuple, lay, WA, WB, add) -> None:
    """The belief probe's claim: its cross-fitted best-layer R^2 above its control's."""
    real, ctrl = belief
    rA, rB, qA, qB = r2_curves(real, WA), r2_curves(real, WB), r2_curves(ctrl, WA), r2_curves(ctrl, WB)
    la, lb = _first(rB), _first(rA)
    d = 0.5 * (_take(rA, la) - np.maximum(_take(qA, la), 0) + _take(rB, lb) - np.maximum(_take(qB, lb), 0))
    add("belief_beats_control", "best-layer R^2 (cross-fitted, mean of halves) - max(control R^2 there, 0)",
        d, rule(">", 0), f"R^2 {0.5 * (rA[0, la[0]] + rB[0, lb[0]]):.3f} at layers {lay[la[0]]}/{lay[lb[0]]} vs "
                         f"control {0.5 * (qA[0, la[0]] + qB[0, lb[0]]):.3f}")


def _kback(k: int, s: TargetScores, cur, best, lay, W, summary, baseline, token_baseline, add):
    """The k-back probe's claims: beyond token statistics and the (task, token) baseline, rising then falling over
    layers. Returns its excess over token statistics (1 + B,), or None without a token baseline."""
    t = f"kback{k}"
    acc, b = cur[t], best[t]
    L = len(lay)
    excess = None
    if token_baseline is not None:
        tok = nan_ratio(W @ np.asarray(token_baseline[k], float), W @ np.asarray(s.counts, float))
        row = next(r for r in summary if r["target"] == t)
        row["token_acc"], row["excess_over_token_stats"] = float(tok[0]), float(b[0] - tok[0])
        excess = b - tok
        add(f"{t}_beats_token_stats", "best-layer acc (cross-fitted) - acc of o_t alone (token statistics)",
            b - tok, rule(">", 0), f"acc {b[0]:.3f} vs {tok[0]:.3f} from the current token alone (chance "
                                   f"{s.chance:.3f}): what the probe reads of o_(t-{k}) beyond what o_t gives")
    if baseline is not None and k in baseline:
        base = nan_ratio(W @ np.asarray(baseline[k], float), W @ np.asarray(s.counts, float))
        next(r for r in summary if r["target"] == t)["baseline_acc"] = float(base[0])
        add(f"{t}_beats_baseline", "best-layer acc (cross-fitted) - (task, current token) baseline acc",
            b - base, rule(">", 0), f"acc {b[0]:.3f} vs baseline {base[0]:.3f} (chance {s.chance:.3f}): "
                                    f"memory of o_(t-{k}) beyond what the task and o_t predict")
    if L < 3:
        add(f"{t}_rises_then_falls", "min(rise, fall) of acc over layers (cross-fitted peak)", [NAN], rule(">", 0),
            "fewer than 3 layers", (NAN, NAN))
        return excess
    rise, fall = b - acc[:, 0], b - acc[:, -1]
    ends = np.isin(_first(acc[1:]), [0, L - 1]).mean()
    add(f"{t}_rises_then_falls", "min(rise, fall) of acc over layers (cross-fitted peak)", np.minimum(rise, fall),
        rule(">", 0), f"rise {rise[0]:.3f} {_fci(rise)}, fall {fall[0]:.3f} {_fci(fall)}; peak layer "
                      f"{lay[_first(acc[:1])[0]]}, at an end layer in {ends:.0%} of resamples")
    return excess


def _kback_trends(kk: list[int], lay, cur, falls: dict, on_excess: bool, add) -> None:
    """Over two or more k: the peak layer moves up with k (OLS slope), and the accuracy (`falls`: the excess over
    token statistics, else the best-layer accuracy) falls with k at every step."""
    K, x = len(kk), np.asarray(kk, float)
    P = np.stack([lay[_first(cur[f"kback{k}"])] for k in kk], -1).astype(float)  # (1 + B, K)
    sl = _slope(x, P)
    if K >= 3:
        resid = P[0] - P[0].mean() - sl[0] * (x - x.mean())
        se = math.sqrt((resid @ resid) / (K - 2) / ((x - x.mean()) @ (x - x.mean())))
        q = float(st.t.ppf(0.975, K - 2))
        blo, bhi = percentile_ci(sl[1:])
        lo_hi = (min(sl[0] - q * se, blo), max(sl[0] + q * se, bhi))
    else:
        lo_hi = (NAN, NAN)
    add("kback_peak_moves_up", f"OLS slope of peak layer on k over {K} values of k", sl, rule(">", 0),
        f"peak layers {dict(zip(kk, P[0].astype(int).tolist()))}; CI: hull of the t interval ({K - 2} df)"
        " and the bootstrap with re-chosen peaks" + ("" if K >= 3 else "; fewer than 3 values of k"), lo_hi)
    Bk = np.stack([falls[k] for k in kk], -1)  # (1 + B, K)
    d = np.diff(Bk, axis=-1)
    step = np.array([percentile_ci(d[1:, i], 1 - 0.05 / (K - 1)) for i in range(K - 1)])
    nb = np.isfinite(d[1:]).sum(0)
    p = np.minimum(1, 2 * np.minimum(((d[1:] >= 0).sum(0) + 1) / (nb + 1), ((d[1:] <= 0).sum(0) + 1) / (nb + 1)))
    ph = holm(p)
    steps = ", ".join(f"{kk[i]}->{kk[i + 1]}: {d[0, i]:+.3f} (Holm p {ph[i]:.3g})" for i in range(K - 1))
    what = "best-layer acc - token-statistics acc" if on_excess else "best-layer acc (no token baseline)"
    add("kback_acc_falls_with_k", f"largest adjacent difference over k of {what} (weakest fall)",
        d.max(-1), rule("<", 0), f"{'excess over token statistics' if on_excess else 'best acc'} "
                                 f"{dict(zip(kk, np.round(Bk[0], 3).tolist()))}; steps {steps}; CI "
                                 f"from per-step {1 - 0.05 / (K - 1):.4g} intervals (Bonferroni)",
        (float(step[:, 0].max()), float(step[:, 1].max())))


def _state_before_task(scores, cur, lay, fracs, add) -> None:
    """The state is decodable before the task: over the layers (threshold-free), at the embedding, and by the layer
    each reaches a fraction of its peak; each requires both to beat their controls."""
    req = rule(">", 0, ("task_beats_control", "state_beats_control"))
    nt, ns = _norm_curve(cur["task"], scores["task"].chance), _norm_curve(cur["state"], scores["state"].chance)
    up = lay != 0
    sb = state_before_task_values(lay, cur["task"], cur["state"], scores["task"].chance, scores["state"].chance)
    if up.any():
        add("state_before_task", f"mean normalized acc over layers {_span(lay[up])} (the embedding apart), state "
                                 "- task (threshold-free)", sb["area"], req,
            f"state {sb['area_state'][0]:.3f}, task {sb['area_task'][0]:.3f} (1 = at its peak from layer "
            f"{lay[up][0]})")
    if not up.all():
        add("state_before_task_layer0", "normalized acc at layer 0 (the embedding: the current token alone), "
                                        "state - task", sb["layer0"], req,
            f"state {sb['layer0_state'][0]:.3f}, task {sb['layer0_task'][0]:.3f} of their peaks above chance at "
            "the embedding, where the current token alone decides")
    for f in fracs:
        rt, rs = _reach(nt, f), _reach(ns, f)
        d = np.where(np.isfinite(rt) & np.isfinite(rs),
                     lay[np.nan_to_num(rt).astype(int)] - lay[np.nan_to_num(rs).astype(int)], np.nan)
        add(f"state_before_task_reach{round(100 * f)}", f"reach layer (task) - reach layer (state), frac {f:g}",
            d, req, f"reach: task layer {_fl(rt[0], lay)}, state layer {_fl(rs[0], lay)}")


def _fci(x) -> str:
    lo, hi = percentile_ci(np.asarray(x)[1:])
    return f"[{lo:.3f}, {hi:.3f}]"


def _span(lay) -> str:
    return f"{lay[0]}..{lay[-1]}" if len(lay) > 1 else str(lay[0])


def _fl(r, lay) -> str:
    return "-" if not np.isfinite(r) else str(lay[int(r)])
