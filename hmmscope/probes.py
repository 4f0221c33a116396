"""Layerwise linear probes: the paper's Figures 3a and 3b, and belief probes (SCIENCE.md 6). Library only.

Episodes. Probe on episodes from a fixed, seeded subset of tasks with many episodes each
(`episodes.probe_episodes`: 32 tasks x >= 30 episodes at any n_tasks). Probes that need the task
(task id, the within-task state, the baseline) use the `max_tasks` most frequent tasks of `ep` (all of
them for probe episodes); with episodes drawn from the prior at large n_tasks most tasks would have
one or two episodes and no task probe could be trained for them.

Residuals. Layer 0 is the embedding (hook_embed), layer l the output of block l-1; the residual at
sequence position t has seen tokens <= t. Probed positions: the test segment, `positions_per_episode`
of them per episode (seeded, without replacement; None = all). `collect_residuals` streams layers in
chunks whose (N, P, D) float32 outputs fit `mem_budget` bytes (stop_early forwards). `model` is a
Transformer, or a callable fn(tokens (B, T) long, layer, episode_idx (B,)) -> (B, T, D) with n_layers=.

Targets at a probed position t of episode i:
- task: task_ids[i] (probed tasks only).
- state: the hidden state s_t *within its task* (Figure 3a; the paper probes the state of a known
  task): one probe per probed task, fitted on that task's training rows, accuracies pooled over tasks.
  State indices are comparable only within a task, so a single probe of the raw index over all tasks
  (`state_pooled`, kept as a secondary row) needs the task to decode the state.
- kback{k}: the token o_{t-k}, only where t-k lies in the test segment (test position >= k).
  Baseline (memory isolated): a lookup table from (task, current token o_t) to the most frequent
  o_{t-k} on the training rows (unseen pairs: the most frequent given o_t, then overall); it knows the
  true task, which the model must infer, so it is generous. o_{t-k} is partly predictable from
  (task, o_t) alone: beating a shuffled-label control is not evidence of memory, beating this is.
- belief: p(s_t | tokens <= t, true task) (inference.task_beliefs), S-dim, all episodes; ridge regression.
  A coordinate means different states in different tasks (as for state_pooled).

Split and fits. One seeded split of episodes (`test_frac` held out) for every target and layer: no
episode on both sides. Features standardized on the training rows. Classifiers: multinomial
LogisticRegression(C, lbfgs, max_iter, tol), each layer fitted from scratch (warm_start=True reuses the
previous layer's fit: ~20% faster on the tiny preset, accuracies within 0.01, but layer-order
dependent; never for the per-task state probes). Fits run with `blas_threads` BLAS threads (default 1:
on a 2-core machine multi-threaded OpenBLAS made each lbfgs fit 5-40x slower). The layers' fits are
independent, so with `n_jobs` > 1 they run in n_jobs worker processes (spawned: torch and fork do not
mix; a script that calls run_probes needs the `if __name__ == "__main__":` guard), each with blas_threads
BLAS threads, while the main process collects the next layers' residuals; the numbers are identical to
n_jobs = 1 (everything seeded is drawn in the main process, in layer order). warm_start needs the layers
in order: with n_jobs > 1 it is an error. Ridge: alpha from `alphas` chosen on an inner split of the
training episodes (a quarter held out, a seeded split per layer and probe), then refit.
Controls: every probe is refitted on shuffled training labels and scored on the real test labels
(each target's permutation from its own seeded stream, so adding a target changes no other control).
Per-position labels are permuted among training rows with the same test position (and task, for the
within-task state), so the control gets what position alone predicts; task labels are permuted among
training episodes.

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
- kback{k}_rises_then_falls: min(rise, fall), rise = best-layer acc - acc at the first layer, fall =
  best-layer acc - acc at the last layer (cross-fitted). A curve that only rises peaks at the last layer,
  so its fall, and the statistic, is <= 0 however concave it is. Rule "> 0"; < 3 layers: NaN.
- kback_peak_moves_up: OLS slope of the peak layer on k over the K values of k (k is the unit). CI: the
  hull of the t interval with K - 2 degrees of freedom and the bootstrap interval with peaks re-chosen
  in each resample (peak-location noise). Rule "> 0"; K < 3: NaN.
- kback_acc_falls_with_k: the largest adjacent difference best acc(k_{i+1}) - best acc(k_i) (the
  weakest fall). CI: [max of lower ends, max of upper ends] of the per-step percentile intervals at
  level 1 - 0.05 / (K - 1) (Bonferroni: simultaneous 95%), so "supported" means every step falls.
  Rule "< 0"; the reason lists Holm-adjusted bootstrap p-values per step.
- state_before_task (threshold-free): mean over layers of the normalized accuracy
  clip((acc - chance) / (max acc - chance), 0, 1), state minus task (a target that becomes decodable at
  lower layers has the larger mean). state_before_task_reach{50,90}: reach(task) - reach(state) in
  layers, reach(frac) = the first layer with normalized accuracy >= frac. Rule "> 0; requires
  task_beats_control, state_beats_control".
"""

from __future__ import annotations

import csv
import math
import os
import time
import warnings
import zlib
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats as st
from scipy.linalg import LinAlgWarning
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from threadpoolctl import threadpool_limits

from .stats import Claim, claim, holm, jsonable, percentile_ci, rule

if TYPE_CHECKING:
    import torch

__all__ = ["Claim", "ProbeResult", "Residuals", "TargetScores", "collect_residuals", "probe_claims",
           "sample_positions", "split_episodes", "run_probes"]

_TAG = 0x50524F42  # "PROB": separates the probe streams from other users of the seed
NAN = float("nan")


# ---------------------------------------------------------------- residuals


def sample_positions(ep, per_episode: int | None, seed: int = 0) -> np.ndarray:
    """(N, P) sorted sequence positions in the test segment, P = per_episode of them per episode (seeded)."""
    cand = np.flatnonzero(np.asarray(ep.test_mask))
    N = len(ep.task_ids)
    if per_episode is None or per_episode >= len(cand):
        return np.broadcast_to(cand, (N, len(cand))).copy()
    r = np.random.default_rng(np.random.SeedSequence([seed, _TAG, 0])).random((N, len(cand)))
    return cand[np.sort(np.argsort(r, 1)[:, :per_episode], 1)]


class Residuals:
    """Residual streams at probed positions `pos` (N, P); iterate for (layer, X (N, P, D) float32)."""

    def __init__(self, fn, tokens: torch.Tensor, pos: np.ndarray, layers, batch_size: int, mem_budget: int):
        self.fn, self.tokens, self.pos, self.layers = fn, tokens, pos, list(layers)
        self.batch_size, self.mem_budget, self.seconds = batch_size, mem_budget, 0.0

    def _chunk(self, layers) -> dict[int, np.ndarray]:
        import torch

        t0, (N, P) = time.perf_counter(), self.pos.shape
        out: dict[int, np.ndarray] = {}
        tok, pos = self.tokens[:, :int(self.pos.max()) + 1], torch.as_tensor(self.pos)
        for lo in range(0, N, self.batch_size):
            idx = np.arange(lo, min(lo + self.batch_size, N))
            acts = self.fn(tok[idx], layers, idx)
            for l in layers:
                a = acts[l]
                sel = a[torch.arange(len(idx), device=a.device)[:, None], pos[torch.as_tensor(idx)].to(a.device)]
                if l not in out:
                    out[l] = np.empty((N, P, a.shape[-1]), np.float32)
                out[l][idx] = sel.detach().float().cpu().numpy()
        self.seconds += time.perf_counter() - t0
        return out

    def __iter__(self):
        done = 0
        while done < len(self.layers):
            per_layer = None if done == 0 else self._bytes
            n = 1 if per_layer is None else max(1, int(self.mem_budget // max(per_layer, 1)))
            chunk = self.layers[done:done + n]
            out = self._chunk(chunk)
            self._bytes = next(iter(out.values())).nbytes
            for l in chunk:
                yield l, out.pop(l)
            done += len(chunk)

    def get(self, layer: int) -> np.ndarray:
        return self._chunk([layer])[layer]


def collect_residuals(model, ep, *, positions: Any = "test", layers=None, n_layers: int | None = None,
                      positions_per_episode: int | None = None, seed: int = 0, device="cpu", batch_size: int = 64,
                      mem_budget: int = 1 << 30) -> Residuals:
    """Lazy per-layer residuals of `model` on ep at `positions` ("test": sample_positions; or (P,) / (N, P)).

    A Transformer is moved to `device` and put in eval mode; activations come back as CPU float32.
    """
    import torch  # here, not at the top: the fits' worker processes import this module without torch

    from .model import resid_names, run_with_cache

    tokens = torch.as_tensor(np.asarray(ep.tokens).astype(np.int64))
    N = tokens.shape[0]
    if isinstance(positions, str):
        if positions != "test":
            raise ValueError(f"positions must be 'test' or an array of positions, got {positions!r}")
        pos = sample_positions(ep, positions_per_episode, seed)
    else:
        pos = np.broadcast_to(np.asarray(positions, dtype=np.int64), (N, np.shape(positions)[-1])).copy()
    if hasattr(model, "blocks"):  # a Transformer: one forward per batch and chunk, stopped early
        names, dev = resid_names(len(model.blocks)), torch.device(device)
        model.to(dev).eval()

        def fn(tok, ls, _idx):
            _, cache = run_with_cache(model, tok.to(dev), names=[names[l] for l in ls], stop_early=True)
            return {l: cache[names[l]] for l in ls}
        n_layers = len(names)
    else:
        if n_layers is None:
            raise ValueError("n_layers is required when model is a callable")
        call = model

        def fn(tok, ls, idx):
            return {l: torch.as_tensor(call(tok, l, idx)) for l in ls}
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    return Residuals(fn, tokens, pos, layers, batch_size, mem_budget)


# ---------------------------------------------------------------- fits


def split_episodes(n: int, test_frac: float = 0.25, seed: int = 0) -> np.ndarray:
    """(n,) bool: True for held-out episodes (at least one on each side when n >= 2)."""
    n_test = min(max(1, round(test_frac * n)), n - 1)
    out = np.zeros(n, bool)
    out[np.random.default_rng(np.random.SeedSequence([seed, _TAG, 1])).permutation(n)[:n_test]] = True
    return out


def _halves(n: int, seed: int) -> np.ndarray:
    """(n,) bool: the first of the two seeded cross-fitting halves of the test episodes."""
    out = np.zeros(n, bool)
    out[np.random.default_rng(np.random.SeedSequence([seed, _TAG, 4])).permutation(n)[:(n + 1) // 2]] = True
    return out


def _control(y, ep_row, key, episode_level: bool, rng) -> np.ndarray:
    """Shuffled labels: whole episodes' labels permuted (episode_level), else rows within equal keys."""
    if episode_level:
        _, first, inv = np.unique(ep_row, return_index=True, return_inverse=True)
        return y[first][rng.permutation(len(first))][inv]
    out = np.empty_like(y)
    out[np.argsort(key, kind="stable")] = y[np.lexsort((rng.random(len(y)), key))]
    return out


def _boot_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) multiplicities of the test episodes in each bootstrap resample."""
    idx = np.random.default_rng(np.random.SeedSequence([seed, _TAG, 2])).integers(0, n, (n_boot, n))
    w = np.zeros((n_boot, n))
    np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)
    return w


def _ratio(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _fit_predict(make, X, y, a, b, group) -> np.ndarray:
    """Predicted labels of rows b by a classifier fitted on rows a (one per value of `group` if given).

    A group with one training class predicts it; a group with no training rows predicts -1 (never right).
    """
    Xb = X[b]
    if group is None:
        return make().fit(X[a], y[a]).predict(Xb)
    pred, gb = np.full(len(Xb), -1, y.dtype), group[b]
    for g in np.unique(gb):
        tr, sel = a & (group == g), gb == g
        cls = np.unique(y[tr])
        if len(cls) == 1:
            pred[sel] = cls[0]
        elif len(cls) > 1:
            pred[sel] = make(fresh=True).fit(X[tr], y[tr]).predict(Xb[sel])
    return pred


def _majority(y, group=None) -> float:
    """Majority-class rate of y (per group, pooled, when group is given)."""
    if group is None:
        return float(np.bincount(y).max() / len(y))
    return float(sum(np.bincount(y[group == g]).max() for g in np.unique(group)) / len(y))


def _lookup_baseline(key, y, a, b, fallback) -> np.ndarray:
    """Most frequent y per key on rows a, predicted for rows b; unseen keys: per fallback key, then overall."""
    n_cls = int(y[a].max()) + 1 if a.any() else 1

    def table(k):
        uk, inv = np.unique(k[a], return_inverse=True)
        cnt = np.zeros((len(uk), n_cls))
        np.add.at(cnt, (inv, y[a]), 1.0)
        return uk, cnt.argmax(1)

    pred = np.full(int(b.sum()), int(np.bincount(y[a]).argmax()) if a.any() else 0)
    for k in (fallback, key):  # the finer key overwrites where it has data
        uk, best = table(k)
        j = np.clip(np.searchsorted(uk, k[b]), 0, max(len(uk) - 1, 0))
        seen = uk[j] == k[b] if len(uk) else np.zeros(len(pred), bool)
        pred[seen] = best[j[seen]]
    return pred


def _ridge_val(g, rng) -> np.ndarray:
    """Rows of a seeded quarter of the training episodes g (at least one): ridge's inner validation split."""
    eps = np.unique(g)
    return np.isin(g, eps[rng.permutation(len(eps))[:max(1, len(eps) // 4)]])


def _ridge(Xtr, Ytr, val, Xte, alphas):
    """Ridge predictions for Xte with alpha chosen on the training rows `val` (_ridge_val), then refitted on all."""
    sse = [((Ridge(alpha=a).fit(Xtr[~val], Ytr[~val]).predict(Xtr[val]) - Ytr[val]) ** 2).sum() for a in alphas]
    best = float(alphas[int(np.argmin(sse))])
    return Ridge(alpha=best).fit(Xtr, Ytr).predict(Xte), best


# ---------------------------------------------------------------- statistics


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


def _r2_curves(sums, w) -> np.ndarray:
    """Variance-weighted R^2 per layer for episode weights w (B, n_test): (B, L). sums: per layer (n, sy, syy, sse)."""
    out = []
    for s in sums:
        n, sy, syy, sse = (w @ a for a in s)
        out.append(1 - _ratio(sse.sum(-1), (syy - _ratio(sy ** 2, n)).sum(-1)))
    return np.stack(out, -1)


def probe_claims(layers, scores: dict[str, TargetScores], *, ks=(1, 2, 3, 4, 5), fracs=(0.5, 0.9),
                 n_boot: int = 1000, seed: int = 0, baseline: dict[int, np.ndarray] | None = None,
                 belief: tuple | None = None) -> tuple[list[Claim], list[dict], dict]:
    """Claims (module docstring), a summary row per target, and per-layer bootstrap CIs {target: (lo, hi)}.

    baseline: {k: (n_test,) hits of the (task, current token) baseline of kback{k}} (its counts are
    kback{k}'s). belief: (real, control) per-layer sums (n, sy, syy, sse), each (n_test, S).
    """
    lay = np.asarray(layers)
    L = len(lay)
    n_test = len(next(iter(scores.values())).counts) if scores else len(belief[0][0][0])
    W = np.vstack([np.ones(n_test), _boot_weights(n_test, n_boot, seed)])  # row 0: the point estimate
    A = _halves(n_test, seed)
    WA, WB = W * A, W * ~A
    claims: list[Claim] = []
    verdicts: dict[str, str] = {}
    summary, ci, cur, best = [], {}, {}, {}

    def add(name, stat, values, rule_, reason, lo_hi=None):
        v = np.asarray(values, float)
        lo, hi = lo_hi if lo_hi is not None else percentile_ci(v[1:])
        c = claim(name, stat, float(v[0]), lo, hi, rule_, reason, verdicts)
        claims.append(c)
        verdicts[name] = c.verdict

    for t, s in scores.items():
        H, Hc, Cn = (np.asarray(x, float) for x in (s.hits, s.control, s.counts))
        n_all, nA, nB = W @ Cn, WA @ Cn, WB @ Cn
        acc = _ratio(W @ H, n_all[:, None])  # (1 + B, L)
        hA, hB, cA, cB = WA @ H, WB @ H, WA @ Hc, WB @ Hc
        b, la, lb = _crossfit(_ratio(hA, nA[:, None]), _ratio(hB, nB[:, None]), hA, hB, n_all)
        b[(nA == 0) | (nB == 0)] = NAN
        cb = (_take(cA, la) + _take(cB, lb)) / n_all
        cur[t], best[t] = acc, b
        ci[t] = np.array([percentile_ci(acc[1:, l]) for l in range(L)]), \
            np.array([percentile_ci(_ratio(W[1:] @ Hc[:, l], n_all[1:])) for l in range(L)])
        peaks = lay[_first(acc)]
        norm = _norm_curve(acc[:1], s.chance)
        summary.append({"target": t, "peak_layer": int(peaks[0]), "peak_lo": percentile_ci(peaks[1:])[0],
                        "peak_hi": percentile_ci(peaks[1:])[1], "max_acc": float(np.nanmax(acc[0])),
                        "best_acc": float(b[0]), "best_layers": f"{lay[la[0]]}/{lay[lb[0]]}", "chance": s.chance,
                        **{f"reach{round(100 * f)}": float(lay[int(r)]) if np.isfinite(r) else NAN
                           for f in fracs for r in [_reach(norm, f)[0]]}})
        add(f"{t}_beats_control", "best-layer acc (cross-fitted) - max(control acc there, chance)",
            b - np.maximum(cb, s.chance), rule(">", 0),
            f"acc {b[0]:.3f} at layers {lay[la[0]]}/{lay[lb[0]]} (each half at the other half's best) vs control "
            f"{cb[0]:.3f}, chance {s.chance:.3f}")
    if belief is not None:
        real, ctrl = belief
        rA, rB, qA, qB = _r2_curves(real, WA), _r2_curves(real, WB), _r2_curves(ctrl, WA), _r2_curves(ctrl, WB)
        la, lb = _first(rB), _first(rA)
        d = 0.5 * (_take(rA, la) - np.maximum(_take(qA, la), 0) + _take(rB, lb) - np.maximum(_take(qB, lb), 0))
        add("belief_beats_control", "best-layer R^2 (cross-fitted, mean of halves) - max(control R^2 there, 0)",
            d, rule(">", 0), f"R^2 {0.5 * (rA[0, la[0]] + rB[0, lb[0]]):.3f} at layers {lay[la[0]]}/{lay[lb[0]]} vs "
                             f"control {0.5 * (qA[0, la[0]] + qB[0, lb[0]]):.3f}")
    kk = [k for k in ks if f"kback{k}" in scores]
    for k in kk:
        t = f"kback{k}"
        acc, b, s = cur[t], best[t], scores[t]
        if baseline is not None and k in baseline:
            base = _ratio(W @ np.asarray(baseline[k], float), W @ np.asarray(s.counts, float))
            next(r for r in summary if r["target"] == t)["baseline_acc"] = float(base[0])
            add(f"{t}_beats_baseline", "best-layer acc (cross-fitted) - (task, current token) baseline acc",
                b - base, rule(">", 0), f"acc {b[0]:.3f} vs baseline {base[0]:.3f} (chance {s.chance:.3f}): "
                                        f"memory of o_(t-{k}) beyond what the task and o_t predict")
        if L < 3:
            add(f"{t}_rises_then_falls", "min(rise, fall) of acc over layers (cross-fitted peak)", [NAN], rule(">", 0),
                "fewer than 3 layers", (NAN, NAN))
            continue
        rise, fall = b - acc[:, 0], b - acc[:, -1]
        ends = np.isin(_first(acc[1:]), [0, L - 1]).mean()
        add(f"{t}_rises_then_falls", "min(rise, fall) of acc over layers (cross-fitted peak)", np.minimum(rise, fall),
            rule(">", 0), f"rise {rise[0]:.3f} {_fci(rise)}, fall {fall[0]:.3f} {_fci(fall)}; peak layer "
                          f"{lay[_first(acc[:1])[0]]}, at an end layer in {ends:.0%} of resamples")
    if len(kk) >= 2:
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
        Bk = np.stack([best[f"kback{k}"] for k in kk], -1)  # (1 + B, K)
        d = np.diff(Bk, axis=-1)
        step = np.array([percentile_ci(d[1:, i], 1 - 0.05 / (K - 1)) for i in range(K - 1)])
        nb = np.isfinite(d[1:]).sum(0)
        p = np.minimum(1, 2 * np.minimum(((d[1:] >= 0).sum(0) + 1) / (nb + 1), ((d[1:] <= 0).sum(0) + 1) / (nb + 1)))
        ph = holm(p)
        steps = ", ".join(f"{kk[i]}->{kk[i + 1]}: {d[0, i]:+.3f} (Holm p {ph[i]:.3g})" for i in range(K - 1))
        add("kback_acc_falls_with_k", "largest adjacent difference of best-layer acc over k (weakest fall)",
            d.max(-1), rule("<", 0), f"best acc {dict(zip(kk, np.round(Bk[0], 3).tolist()))}; steps {steps}; CI "
                                     f"from per-step {1 - 0.05 / (K - 1):.4g} intervals (Bonferroni)",
            (float(step[:, 0].max()), float(step[:, 1].max())))
    if "task" in scores and "state" in scores:
        req = rule(">", 0, ("task_beats_control", "state_beats_control"))
        nt, ns = _norm_curve(cur["task"], scores["task"].chance), _norm_curve(cur["state"], scores["state"].chance)
        et, es = np.mean(nt, -1), np.mean(ns, -1)
        add("state_before_task", "mean normalized acc over layers, state - task (threshold-free)", es - et, req,
            f"state {es[0]:.3f}, task {et[0]:.3f} (1 = decodable from the first layer)")
        for f in fracs:
            rt, rs = _reach(nt, f), _reach(ns, f)
            d = np.where(np.isfinite(rt) & np.isfinite(rs),
                         lay[np.nan_to_num(rt).astype(int)] - lay[np.nan_to_num(rs).astype(int)], np.nan)
            add(f"state_before_task_reach{round(100 * f)}", f"reach layer (task) - reach layer (state), frac {f:g}",
                d, req, f"reach: task layer {_fl(rt[0], lay)}, state layer {_fl(rs[0], lay)}")
    return claims, summary, ci


def _fci(x) -> str:
    lo, hi = percentile_ci(np.asarray(x)[1:])
    return f"[{lo:.3f}, {hi:.3f}]"


def _fl(r, lay) -> str:
    return "-" if not np.isfinite(r) else str(lay[int(r)])


# ---------------------------------------------------------------- result


@dataclass
class ProbeResult:
    table: list[dict]  # one row per (target, layer): classification probes
    belief_table: list[dict]  # one row per layer: belief R^2
    summary: list[dict]  # per target: peak layer, best and max accuracy, reach layers, baseline
    claims: list[Claim]
    meta: dict = field(default_factory=dict)  # sizes, settings, n_jobs, timings (s; fits_s: summed over layers)

    def to_dict(self) -> dict:
        return jsonable({"table": self.table, "belief_table": self.belief_table, "summary": self.summary,
                          "claims": self.claims, "meta": self.meta})

    def to_csv(self, directory) -> list[Path]:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        out = []
        for name, rows in (("probes", self.table), ("belief_probes", self.belief_table),
                           ("probe_summary", self.summary), ("probe_claims", jsonable(self.claims))):
            path, tmp = d / f"{name}.csv", d / f".{name}.csv.tmp"
            keys = list(dict.fromkeys(k for r in rows for k in r))
            if not keys:
                continue
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
            os.replace(tmp, path)
            out.append(path)
        return out

    def figure(self, title: str | None = None):
        """Figures 3a (task vs state), 3b (k-back curves) and the belief R^2, by layer (0 = embedding), with
        95% CIs. A colour per target (3b: a sequential map, light k = 1 to dark k = K), a style per kind of
        line: solid = probe, dotted = shuffled-label control, dashed = chance (majority class, per target),
        dash-dot = the (task, o_t) baseline; the style key is in each legend, which sits below its panel."""
        from matplotlib import colormaps
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=(17, 6), layout="constrained")
        axes = fig.subplots(1, 3)
        by: dict[str, list[dict]] = {}
        for r in self.table:
            by.setdefault(r["target"], []).append(r)
        base = {s["target"]: s.get("baseline_acc") for s in self.summary}
        kb = sorted((t for t in by if t.startswith("kback")), key=lambda t: int(t[5:]))
        cmap = colormaps["viridis"]
        kcol = {t: cmap(0.85 - 0.75 * i / max(1, len(kb) - 1)) for i, t in enumerate(kb)}
        panels = [(axes[0], [t for t in ("task", "state", "state_pooled") if t in by], "Fig. 3a: task vs hidden state"),
                  (axes[1], kb, "Fig. 3b: token k steps back")]
        for ax, targets, ptitle in panels:
            for j, t in enumerate(targets):
                rows = by[t]
                x, c = [r["layer"] for r in rows], kcol.get(t, f"C{j % 10}")
                lab = (f"k = {t[5:]}" if t in kcol else t + (" (raw index over tasks)" if t == "state_pooled" else ""))
                acc, lo, hi = (np.array([r[key] for r in rows], float) for key in ("acc", "acc_lo", "acc_hi"))
                if t in kcol:  # 3b: error bars dodged sideways, so K overlapping bands do not hide each other
                    xd = np.asarray(x, float) + 0.08 * (kb.index(t) - (len(kb) - 1) / 2)
                    ax.errorbar(xd, acc, yerr=np.nan_to_num(np.abs([acc - lo, hi - acc])), fmt="o-", color=c, lw=1.8,
                                ms=4, capsize=2, elinewidth=1, label=lab)
                else:
                    ax.plot(x, acc, "o-" if t != "state_pooled" else "o--", color=c, lw=1.8, ms=4, label=lab)
                    ax.fill_between(x, lo, hi, color=c, alpha=0.18)
                ax.plot(x, [r["control_acc"] for r in rows], ":", color=c, lw=1)
                ax.axhline(rows[0]["chance"], ls="--", color=c, lw=0.8, alpha=0.8)
                if base.get(t) is not None:
                    ax.axhline(base[t], ls="-.", color=c, lw=1, alpha=0.8)
            ax.set(xlabel="layer (0 = embedding)", ylabel="held-out accuracy", title=ptitle)
            if targets:
                keys = [Line2D([], [], color="gray", ls=":", lw=1, label="shuffled-label control"),
                        Line2D([], [], color="gray", ls="--", lw=0.8, label="chance (majority class)")]
                if ax is axes[1] and any(base.get(t) is not None for t in targets):
                    keys.append(Line2D([], [], color="gray", ls="-.", lw=1, label="(task, o_t) baseline"))
                h, _ = ax.get_legend_handles_labels()
                ax.legend(handles=[*h, *keys], fontsize=8, ncol=2 if len(h) + len(keys) > 5 else 1,
                          loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        ax, rows = axes[2], self.belief_table
        if rows:
            x = [r["layer"] for r in rows]
            ax.plot(x, [r["r2"] for r in rows], "o-", label="belief probe")
            ax.fill_between(x, [r["r2_lo"] for r in rows], [r["r2_hi"] for r in rows], alpha=0.2)
            ax.plot(x, [r["control_r2"] for r in rows], ":", label="shuffled-label control")
            ax.axhline(0.0, ls="--", color="gray", lw=0.8, label="chance (R^2 = 0)")
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        ax.set(xlabel="layer (0 = embedding)", ylabel="held-out R^2 (variance-weighted)", title="belief probe")
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        n = self.meta.get("n_episodes")
        fig.suptitle("Figure 3: layerwise probes" + (f", {title}" if title else "")
                     + (f" ({n} episodes, 95% bootstrap CIs)" if n else " (95% bootstrap CIs)"))
        return fig

    def plot(self, path, title: str | None = None) -> list[Path]:
        """Write `figure()` as <path>.png and <path>.pdf; returns [png, pdf]."""
        from .figures import save

        return save(self.figure(title), path)


# ---------------------------------------------------------------- driver


def _sums(pred, y, e, n_test: int) -> list[np.ndarray]:
    """Per test episode e of each row: sums (n, sy, syy, sse), each (n_test, S)."""
    y, pred = y.astype(np.float64), pred.astype(np.float64)
    return [np.stack([np.bincount(e, v[:, j], n_test) for j in range(v.shape[1])], 1)
            for v in (np.ones_like(y[:, :1]), y, y * y, (pred - y) ** 2)]


@dataclass
class _Fits:
    """What every layer's fits need besides its residuals; sent once to each worker process."""
    targets: dict  # name -> (labels (N * P,), -1 = unused; group for per-group probes or None): fittable targets
    ctrl_y: dict  # name -> shuffled-label control labels (N * P,)
    test_row: np.ndarray  # (N * P,) bool: the row's episode is held out
    e_row: np.ndarray  # (N * P,) the row's index among the test episodes (test rows only)
    n_test: int
    Y: np.ndarray | None  # (N * P, S) belief targets; None: no belief probe
    Yc: np.ndarray | None  # (N * P, S) their shuffled-label control
    C: float
    max_iter: int
    tol: float
    alphas: tuple
    blas_threads: int | None


def _fit_layer(f: _Fits, X: np.ndarray, vals, clfs: dict | None = None) -> dict:
    """One layer's probes on its residuals X (N, P, D); vals = ridge's inner validation rows (real, control),
    clfs = the classifiers carried from layer to layer (warm_start; None: fitted from scratch).

    Returns {"hits": name -> (probe, control) hits per test episode (n_test,) each, "belief": (probe sums,
    control sums, alpha, control alpha) or None, "seconds": the fits' wall time}.
    """
    t0, out = time.perf_counter(), {"hits": {}, "belief": None}
    with threadpool_limits(f.blas_threads, user_api="blas"), warnings.catch_warnings():  # see module docstring
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", LinAlgWarning)  # ridge at small alpha on the low-rank embedding layer
        X = X.reshape(len(f.test_row), -1)
        tr = ~f.test_row
        mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-6
        X = (X - mu) / sd
        for t, (y, group) in f.targets.items():
            use = y >= 0
            a, b = use & tr, use & f.test_row
            hits = []
            for kind, labels in (("real", y), ("control", f.ctrl_y[t])):
                def make(fresh=False, key=(t, kind)):
                    if clfs is not None and not fresh:
                        return clfs.setdefault(key, LogisticRegression(C=f.C, max_iter=f.max_iter, tol=f.tol,
                                                                       warm_start=True))
                    return LogisticRegression(C=f.C, max_iter=f.max_iter, tol=f.tol)
                hit = (_fit_predict(make, X, labels, a, b, group) == y[b]).astype(float)
                hits.append(np.bincount(f.e_row[b], hit, f.n_test))
            out["hits"][t] = tuple(hits)
        if f.Y is not None:
            Xtr, Xte, Yte, e = X[tr], X[f.test_row], f.Y[f.test_row], f.e_row[f.test_row]
            p1, alpha = _ridge(Xtr, f.Y[tr], vals[0], Xte, f.alphas)
            p2, calpha = _ridge(Xtr, f.Yc[tr], vals[1], Xte, f.alphas)
            out["belief"] = (_sums(p1, Yte, e, f.n_test), _sums(p2, Yte, e, f.n_test), alpha, calpha)
    out["seconds"] = time.perf_counter() - t0
    return out


_WORKER_FITS: _Fits | None = None  # a worker process's copy (_init_worker)


def _init_worker(f: _Fits) -> None:
    global _WORKER_FITS
    _WORKER_FITS = f


def _fit_in_worker(X, vals) -> dict:
    return _fit_layer(_WORKER_FITS, X, vals)


def _layer_fits(res: Residuals, f: _Fits, vals, n_jobs: int, warm_start: bool):
    """(layer index, layer, _fit_layer's dict) for every layer, in layer order.

    n_jobs > 1: the fits run in n_jobs spawned worker processes (fork and torch do not mix) while this process
    collects the next layers' residuals, at most 2 * n_jobs layers in flight; an error or interrupt stops the
    workers.
    """
    if n_jobs == 1:
        clfs = {} if warm_start else None
        for li, (layer, X) in enumerate(res):
            yield li, layer, _fit_layer(f, X, vals[li], clfs)
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                               initargs=(f,))
    pending: deque = deque()
    try:
        for _ in range(n_jobs):  # start every worker now: they import while this process collects residuals
            pool.submit(int)
        for li, (layer, X) in enumerate(res):
            pending.append((li, layer, pool.submit(_fit_in_worker, X, vals[li])))
            del X
            while pending and (pending[0][2].done() or len(pending) >= 2 * n_jobs):
                li0, layer0, fut = pending.popleft()
                yield li0, layer0, fut.result()
        while pending:
            li0, layer0, fut = pending.popleft()
            yield li0, layer0, fut.result()
    except BaseException:  # an error, Ctrl-C / SIGTERM, or the consumer gone: stop the running fits too
        procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before Python 3.14
        pool.shutdown(wait=False, cancel_futures=True)  # (it forgets the processes)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
        raise
    pool.shutdown()


def run_probes(model, mix, ep, *, ks=(1, 2, 3, 4, 5), max_tasks: int = 32, positions_per_episode: int | None = 32,
               seed: int = 0, device="cpu", test_frac: float = 0.25, n_boot: int = 1000, C: float = 1.0,
               max_iter: int = 100, tol: float = 1e-3, fracs=(0.5, 0.9), belief: bool = True,
               alphas=(0.1, 1.0, 10.0, 100.0, 1000.0), layers=None, n_layers: int | None = None,
               batch_size: int = 64, mem_budget: int = 1 << 30, blas_threads: int | None = 1,
               warm_start: bool = False, n_jobs: int = 1, progress: Callable[[str], Any] | None = None) -> ProbeResult:
    """All probes of the module docstring on every layer; mix is needed for the belief probe (None skips it).

    n_jobs: worker processes for the layers' fits (module docstring; the same numbers at any n_jobs). progress:
    called with a line of text after the belief targets, after each layer's fits and after the statistics.
    """
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1:
        raise ValueError(f"n_jobs must be an integer >= 1, got {n_jobs!r}")
    if warm_start and n_jobs > 1:
        raise ValueError("warm_start=True carries each layer's fit to the next, so the layers fit in order: "
                         f"use n_jobs=1, got {n_jobs}")
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    res = collect_residuals(model, ep, layers=layers, n_layers=n_layers, positions_per_episode=positions_per_episode,
                            seed=seed, device=device, batch_size=batch_size, mem_budget=mem_budget)
    pos, (N, P), nL = res.pos, res.pos.shape, len(res.layers)
    rows_ep, tpos = np.repeat(np.arange(N), P), np.asarray(ep.position)[pos].ravel()
    is_test = split_episodes(N, test_frac, seed)
    te_of = np.cumsum(is_test) - 1
    test_row, n_test = is_test[rows_ep], int(is_test.sum())
    e_row = te_of[rows_ep]
    tok, tid = np.asarray(ep.tokens).astype(np.int64), np.asarray(ep.task_ids).astype(np.int64)
    uniq, cnt = np.unique(tid, return_counts=True)
    keep = uniq[np.lexsort((uniq, -cnt))[:max_tasks]]
    task_row, cur = tid[rows_ep], tok[rows_ep, pos.ravel()]
    probed = np.isin(task_row, keep)
    state = np.asarray(ep.states).astype(np.int64)[rows_ep, pos.ravel()]
    # name -> (labels (-1: unused), group for per-group probes, episode-level control)
    targets = {"task": (np.where(probed, task_row, -1), None, True),
               "state": (np.where(probed, state, -1), task_row, False),
               "state_pooled": (state, None, False)}
    for k in ks:
        targets[f"kback{k}"] = (np.where(tpos >= k, tok[rows_ep, np.maximum(pos.ravel() - k, 0)], -1), None, False)
    def shuffled(y, use, group, episode_level, name):  # control labels: permuted among the used training rows only
        rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG, 3, zlib.crc32(name.encode())]))
        out, m = y.copy(), use & ~test_row
        key = tpos if group is None else group * (int(tpos.max()) + 1) + tpos
        out[m] = _control(y[m], rows_ep[m], key[m], episode_level, rng)
        return out
    ctrl_y = {t: shuffled(y, y >= 0, g, epl, t) for t, (y, g, epl) in targets.items()}
    scores: dict[str, TargetScores] = {}
    fittable, meta_fit = {}, {}
    for t, (y, group, _) in targets.items():  # a target is fitted at every layer or at none
        a, b = (y >= 0) & ~test_row, (y >= 0) & test_row
        if len(np.unique(y[a])) < 2 or not b.any():
            continue
        fittable[t] = (y, group)
        scores[t] = TargetScores(np.zeros((n_test, nL)), np.zeros((n_test, nL)),
                                 np.bincount(e_row[b], None, n_test).astype(float),
                                 _majority(y[b], None if group is None else group[b]))
        meta_fit[t] = {"n_train": int(a.sum()), "n_test": int(b.sum()), "n_classes": int(len(np.unique(y[a])))}
    Y = Yc = None
    vals: list = [None] * nL
    if belief and mix is not None:
        import torch

        from .inference import task_beliefs
        Y = np.concatenate([task_beliefs(mix, ep.subset(slice(a, a + 256)), dtype=torch.float32).numpy()[
            np.arange(min(256, N - a))[:, None], pos[a:a + 256]] for a in range(0, N, 256)]).reshape(N * P, -1)
        Yc = Y[shuffled(np.arange(N * P), np.ones(N * P, bool), None, False, "belief")]
        rng, g = np.random.default_rng(np.random.SeedSequence([seed, _TAG, 5])), rows_ep[~test_row]
        vals = [(_ridge_val(g, rng), _ridge_val(g, rng)) for _ in range(nL)]  # drawn here, in layer order
        say(f"belief targets: {N} episodes x {P} positions x {Y.shape[1]} states")
    fit = _Fits(fittable, ctrl_y, test_row, e_row, n_test, Y, Yc, C, max_iter, tol, tuple(alphas), blas_threads)
    bel, btab, t_fit, jobs = ([], []), [], 0.0, min(n_jobs, nL)
    with closing(_layer_fits(res, fit, vals, jobs, warm_start)) as fits:
        for li, layer, out in fits:
            for t, (real, control) in out["hits"].items():
                scores[t].hits[:, li], scores[t].control[:, li] = real, control
            if out["belief"] is not None:
                s1, s2, alpha, calpha = out["belief"]
                bel[0].append(s1)
                bel[1].append(s2)
                btab.append({"target": "belief", "layer": layer, "alpha": alpha, "control_alpha": calpha,
                             "n_test": int(test_row.sum()), "n_outputs": Y.shape[1]})
            t_fit += out["seconds"]
            say(f"layer {li + 1}/{nL} done (layer {layer}: fits {out['seconds']:.1f} s"
                + (f" in one of {jobs} processes)" if jobs > 1 else ")"))
    baseline = {}
    for k in ks:
        t = f"kback{k}"
        if t not in scores:
            continue
        y = targets[t][0]
        a, b = (y >= 0) & ~test_row, (y >= 0) & test_row
        hit = (_lookup_baseline(task_row * (tok.max() + 1) + cur, y, a, b, cur) == y[b]).astype(float)
        baseline[k] = np.bincount(e_row[b], hit, n_test)
    claims, summary, ci = probe_claims(res.layers, scores, ks=ks, fracs=fracs, n_boot=n_boot, seed=seed,
                                       baseline=baseline, belief=tuple(bel) if Y is not None else None)
    table = []
    for t, s in scores.items():
        acc, cacc = _ratio(s.hits.sum(0), s.counts.sum()), _ratio(s.control.sum(0), s.counts.sum())
        (alo, ahi), (clo, chi) = ci[t][0].T, ci[t][1].T
        for li, layer in enumerate(res.layers):
            table.append({"target": t, "layer": layer, "acc": acc[li], "acc_lo": alo[li], "acc_hi": ahi[li],
                          "chance": s.chance, "control_acc": cacc[li], "control_lo": clo[li], "control_hi": chi[li],
                          "beats_control": bool(alo[li] > max(chi[li], s.chance)), **meta_fit[t]})
    if Y is not None:
        W = _boot_weights(n_test, n_boot, seed)
        one = np.ones((1, n_test))
        r2, rb, c2, cb = (_r2_curves(bel[0], one)[0], _r2_curves(bel[0], W), _r2_curves(bel[1], one)[0],
                          _r2_curves(bel[1], W))
        for li, row in enumerate(btab):
            row.update({"r2": float(r2[li]), "r2_lo": percentile_ci(rb[:, li])[0], "r2_hi": percentile_ci(rb[:, li])[1],
                        "control_r2": float(c2[li]), "control_lo": percentile_ci(cb[:, li])[0],
                        "control_hi": percentile_ci(cb[:, li])[1]})
    say(f"statistics done ({n_boot} bootstrap resamples)")
    meta = {"n_episodes": N, "n_train_episodes": N - n_test, "n_test_episodes": n_test, "positions_per_episode": P,
            "layers": res.layers, "tasks_probed": keep.tolist(),
            "episodes_per_task": {"min": int(cnt[np.isin(uniq, keep)].min()), "max": int(cnt[np.isin(uniq, keep)].max())},
            "test_episodes": np.flatnonzero(is_test).tolist(), "ks": list(ks), "seed": seed, "C": C,
            "max_iter": max_iter, "tol": tol, "n_boot": n_boot, "fracs": list(fracs), "test_frac": test_frac,
            "n_jobs": jobs,
            "timings": {"residuals_s": res.seconds, "fits_s": t_fit, "total_s": time.perf_counter() - t0}}
    return ProbeResult(table, btab, summary, claims, meta)
