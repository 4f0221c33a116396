"""Layerwise linear probes: the paper's Figures 3a and 3b, and belief probes (SCIENCE.md 6). Library only.

Residuals. Layer 0 is the embedding (hook_embed), layer l the output of block l-1; the residual at
sequence position t has seen tokens <= t. Probed positions: the test segment, `positions_per_episode`
of them per episode (seeded, without replacement; None = all). `collect_residuals` streams layers in
chunks whose (N, P, D) float32 outputs fit `mem_budget` bytes (stop_early forwards). `model` is a
Transformer, or a callable fn(tokens (B, T) long, layer, episode_idx (B,)) -> (B, T, D) with n_layers=.

Targets at a probed position t of episode i:
- task: task_ids[i]; only episodes of the `max_tasks` most frequent tasks of ep (ties: lower id).
- state: the hidden-state index s_t. Indices are comparable only within a task (state 3 of task a and of
  task b are unrelated); like the paper we probe the raw index over all tasks.
- kback{k}: the token o_{t-k}, only where t-k lies in the test segment (test position >= k).
- belief: p(s_t | tokens <= t, true task) (inference.task_beliefs), S-dim, all episodes; the same caveat
  as for state applies (a coordinate means different states in different tasks). Ridge regression.

Split and fits. One seeded split of episodes (`test_frac` held out) for every target and layer: no
episode on both sides. Features standardized on the training rows. Classifiers: multinomial
LogisticRegression(C, lbfgs, max_iter, tol), each layer fitted from scratch (warm_start=True reuses the
previous layer's fit: ~20% faster on the tiny preset, accuracies within 0.01, but layer-order
dependent). Fits run with `blas_threads` BLAS threads (default 1: on a 2-core machine multi-threaded
OpenBLAS made each lbfgs fit 5-40x slower). Ridge: alpha from `alphas` chosen on an inner split of
the training episodes (a quarter of them held out), then refit on all training rows.
Controls: every probe is refitted on shuffled training labels and scored on the real test labels.
Per-position labels are permuted among training rows with the same test position (so the control gets
what position alone predicts); task labels are permuted among training episodes.

Statistics. 95% CIs are percentile bootstraps over test episodes (`n_boot` resamples, the same for every
target and layer, so differences are paired); the fitted probes are held fixed. Accuracy pools the
positions of the resampled episodes; chance = the majority-class rate on the test split. R^2 is
variance-weighted over outputs (1 - sum SSE / sum SST; a uniform average is dominated by rarely
occupied states with near-zero variance).

Claims (verdict supported / not supported / inconclusive):
- {target}_beats_control: acc - max(control acc, chance) at the best layer (R^2 - max(control R^2, 0)
  for belief); supported if the CI is above 0, not supported if its upper end is <= 0. Chance enters because
  a shuffled control can fall below chance when features cluster by the true label (each cluster is
  fitted to a random majority of shuffled labels); the table's beats_control is acc_lo > max(control_hi,
  chance).
- kback{k}_rises_then_falls: quadratic term q of OLS acc ~ 1 + layer + layer^2 (statsmodels; bootstrap
  CI). Supported if q's CI < 0 and the peak l* is interior with rise acc[l*] - acc[0] and fall
  acc[l*] - acc[last] both CI > 0 (a concave but monotone curve also has q < 0); not supported if q's
  CI > 0 or the bootstrap peak sits at an end layer in >= 95% of resamples; fewer than 3 layers or
  anything else: inconclusive.
- kback_peak_moves_up: OLS slope of the peak layer vs k (bootstrap CI); supported if CI > 0, not
  supported if its upper end is <= 0.
- kback_acc_falls_with_k: slope of the max-over-layers accuracy vs k; supported if CI < 0, not
  supported if its lower end is >= 0.
- state_before_task (Fig. 3a): reach(target) = first layer with (acc - chance) / (max acc - chance)
  >= frac; value = reach(task) - reach(state). Supported if reach(state) < reach(task) in >= 95% of
  bootstrap resamples, not supported if in <= 5%; inconclusive if either probe does not beat control.
"""

from __future__ import annotations

import csv
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import statsmodels.api as sm
import torch
from scipy.linalg import LinAlgWarning
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from threadpoolctl import threadpool_limits

from .model import resid_names, run_with_cache
from .stats import Claim, jsonable

__all__ = ["Claim", "ProbeResult", "Residuals", "collect_residuals", "sample_positions", "split_episodes",
           "run_probes"]

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


# ---------------------------------------------------------------- fits and statistics


def split_episodes(n: int, test_frac: float = 0.25, seed: int = 0) -> np.ndarray:
    """(n,) bool: True for held-out episodes (at least one on each side when n >= 2)."""
    n_test = min(max(1, round(test_frac * n)), n - 1)
    out = np.zeros(n, bool)
    out[np.random.default_rng(np.random.SeedSequence([seed, _TAG, 1])).permutation(n)[:n_test]] = True
    return out


def _control(y, ep_row, pos_row, episode_level: bool, rng) -> np.ndarray:
    """Shuffled labels: whole episodes' labels permuted (episode_level), else rows within equal positions."""
    if episode_level:
        _, first, inv = np.unique(ep_row, return_index=True, return_inverse=True)
        return y[first][rng.permutation(len(first))][inv]
    out = np.empty_like(y)
    out[np.argsort(pos_row, kind="stable")] = y[np.lexsort((rng.random(len(y)), pos_row))]
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


def _ci(b) -> tuple[float, float]:
    b = np.asarray(b, float)
    b = b[np.isfinite(b)]
    return (NAN, NAN) if len(b) == 0 else tuple(float(v) for v in np.percentile(b, [2.5, 97.5]))


def _verdict(lo: float, hi: float, positive: bool = True) -> str:
    """Claim value > 0 (positive) or < 0, judged by its 95% CI."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if positive:
        return "supported" if lo > 0 else "not supported" if hi <= 0 else "inconclusive"
    return "supported" if hi < 0 else "not supported" if lo >= 0 else "inconclusive"


def _slope(x, Y) -> np.ndarray:
    """OLS slopes of each row of Y (..., K) on x (K,)."""
    xc = np.asarray(x, float) - np.mean(x)
    return (np.asarray(Y, float) - np.mean(Y, -1, keepdims=True)) @ xc / (xc @ xc)


def _reach(acc, chance: float, frac: float) -> np.ndarray:
    """First layer index where (acc - chance) / (max - chance) >= frac, per row of acc (..., L); NaN if max <= chance."""
    acc = np.atleast_2d(acc)
    top = acc.max(-1, keepdims=True)
    first = np.argmax((acc - chance) >= frac * (top - chance), -1).astype(float)
    return np.where(top[..., 0] > chance, first, np.nan)


def _ridge(Xtr, Ytr, g, Xte, alphas, rng):
    """Ridge predictions for Xte with alpha chosen on a held-out quarter of the training episodes."""
    eps = np.unique(g)
    val = np.isin(g, eps[rng.permutation(len(eps))[:max(1, len(eps) // 4)]])
    sse = [((Ridge(alpha=a).fit(Xtr[~val], Ytr[~val]).predict(Xtr[val]) - Ytr[val]) ** 2).sum() for a in alphas]
    best = float(alphas[int(np.argmin(sse))])
    return Ridge(alpha=best).fit(Xtr, Ytr).predict(Xte), best


# ---------------------------------------------------------------- result


@dataclass
class ProbeResult:
    table: list[dict]  # one row per (target, layer): classification probes
    belief_table: list[dict]  # one row per layer: belief R^2
    summary: list[dict]  # per target: peak layer, max accuracy, reach layer, quadratic term
    claims: list[Claim]
    meta: dict = field(default_factory=dict)  # sizes, settings, timings (s)

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

    def plot(self, path) -> Path:
        """Figure 3a (task vs state), 3b (k-back curves) and belief R^2, by layer, with 95% CIs and controls."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=(14, 4), layout="constrained")
        axes = fig.subplots(1, 3)
        by: dict[str, list[dict]] = {}
        for r in self.table:
            by.setdefault(r["target"], []).append(r)
        panels = [(axes[0], [t for t in ("task", "state") if t in by], "Fig. 3a: task vs hidden state"),
                  (axes[1], [t for t in by if t.startswith("kback")], "Fig. 3b: token k steps back")]
        for ax, targets, title in panels:
            for j, t in enumerate(targets):
                rows = by[t]
                x, c = [r["layer"] for r in rows], f"C{j % 10}"
                ax.plot(x, [r["acc"] for r in rows], "o-", color=c, label=t)
                ax.fill_between(x, [r["acc_lo"] for r in rows], [r["acc_hi"] for r in rows], color=c, alpha=0.2)
                ax.plot(x, [r["control_acc"] for r in rows], ":", color=c, lw=1)
                ax.axhline(rows[0]["chance"], ls="--", color=c, lw=0.8)
            ax.set(xlabel="layer (0 = embedding)", ylabel="held-out accuracy", title=title + " (dotted: control)")
            if targets:
                ax.legend(fontsize=7)
        ax, rows = axes[2], self.belief_table
        if rows:
            x = [r["layer"] for r in rows]
            ax.plot(x, [r["r2"] for r in rows], "o-", label="belief")
            ax.fill_between(x, [r["r2_lo"] for r in rows], [r["r2_hi"] for r in rows], alpha=0.2)
            ax.plot(x, [r["control_r2"] for r in rows], ":", label="shuffled control")
            ax.legend(fontsize=7)
        ax.set(xlabel="layer (0 = embedding)", ylabel="held-out R^2 (variance-weighted)", title="belief probe")
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        path = Path(path)
        tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
        return path


# ---------------------------------------------------------------- claims


def _claims(layers, acc, boot, ctrl, cboot, chance, ks, frac, belief):
    L, claims, summary = np.asarray(layers, float), [], []
    for t in acc:
        l = int(np.nanargmax(acc[t]))
        d, db = acc[t][l] - max(ctrl[t][l], chance[t]), boot[t][:, l] - np.maximum(cboot[t][:, l], chance[t])
        lo, hi = _ci(db)
        claims.append(Claim(f"{t}_beats_control", f"acc - max(control acc, chance) at best layer {layers[l]}", float(d), lo, hi,
                            _verdict(lo, hi), f"acc {acc[t][l]:.3f} vs control {ctrl[t][l]:.3f}, chance {chance[t]:.3f}"))
        peaks = np.asarray(layers)[np.argmax(np.nan_to_num(boot[t], nan=-1), 1)]
        summary.append({"target": t, "peak_layer": layers[l], "peak_lo": _ci(peaks)[0], "peak_hi": _ci(peaks)[1],
                        "max_acc": acc[t][l], "chance": chance[t], "reach_layer": float(_reach(acc[t], chance[t], frac)[0])})
    if belief is not None:
        r2, rb, c2, cb = belief
        l = int(np.nanargmax(r2))
        lo, hi = _ci(rb[:, l] - np.maximum(cb[:, l], 0.0))
        claims.append(Claim("belief_beats_control", f"R^2 - max(control R^2, 0) at best layer {layers[l]}",
                            float(r2[l] - max(c2[l], 0.0)), lo, hi,
                            _verdict(lo, hi), f"R^2 {r2[l]:.3f} vs control {c2[l]:.3f}"))
    kk = [k for k in ks if f"kback{k}" in acc]
    for k in kk:
        a, b, s = acc[f"kback{k}"], boot[f"kback{k}"], summary[list(acc).index(f"kback{k}")]
        if len(L) < 3:
            claims.append(Claim(f"kback{k}_rises_then_falls", "quadratic term of acc vs layer", NAN, NAN, NAN,
                                "inconclusive", "fewer than 3 layers"))
            continue
        X = np.c_[np.ones_like(L), L, L ** 2]
        ols = sm.OLS(a, X).fit()
        q, (qlo, qhi) = float(ols.params[2]), _ci(b @ np.linalg.pinv(X)[2])
        oci = np.asarray(ols.conf_int(0.05))[2] if len(L) > 3 else (NAN, NAN)
        l = int(np.argmax(a))
        rise, fall = _ci(b[:, l] - b[:, 0]), _ci(b[:, l] - b[:, -1])
        p_end = float(np.isin(np.argmax(np.nan_to_num(b, nan=-1), 1), [0, len(L) - 1]).mean())
        if qhi < 0 and rise[0] > 0 and fall[0] > 0:
            v = "supported"
        elif qlo > 0 or p_end >= 0.95:
            v = "not supported"
        else:
            v = "inconclusive"
        s.update(quad=q, quad_lo=qlo, quad_hi=qhi, quad_ols_lo=float(oci[0]), quad_ols_hi=float(oci[1]))
        claims.append(Claim(f"kback{k}_rises_then_falls", "quadratic term of acc vs layer (bootstrap CI)", q, qlo, qhi, v,
                            f"peak layer {layers[l]}; rise CI [{rise[0]:.3f}, {rise[1]:.3f}], fall CI [{fall[0]:.3f}, "
                            f"{fall[1]:.3f}]; peak at an end layer in {p_end:.0%} of resamples; OLS CI "
                            f"[{oci[0]:.3g}, {oci[1]:.3g}]"))
    if len(kk) >= 2:
        B = np.stack([boot[f"kback{k}"] for k in kk], 1)  # (n_boot, K, L)
        A = np.stack([acc[f"kback{k}"] for k in kk])  # (K, L)
        ok = np.isfinite(B).all((1, 2))
        peak, peak_b = L[A.argmax(1)], L[B[ok].argmax(2)]
        lo, hi = _ci(_slope(kk, peak_b))
        claims.append(Claim("kback_peak_moves_up", "OLS slope of peak layer vs k", float(_slope(kk, peak)), lo, hi,
                            _verdict(lo, hi), f"peak layers {dict(zip(kk, peak.astype(int).tolist()))}"))
        lo, hi = _ci(_slope(kk, B[ok].max(2)))
        claims.append(Claim("kback_acc_falls_with_k", "OLS slope of max-over-layers acc vs k", float(_slope(kk, A.max(1))),
                            lo, hi, _verdict(lo, hi, positive=False),
                            f"max acc {dict(zip(kk, np.round(A.max(1), 3).tolist()))}"))
    if "task" in acc and "state" in acc:
        rt, rs = _reach(boot["task"], chance["task"], frac), _reach(boot["state"], chance["state"], frac)
        ok = np.isfinite(rt) & np.isfinite(rs)
        lay = np.asarray(layers, float)
        at, as_ = _reach(acc["task"], chance["task"], frac)[0], _reach(acc["state"], chance["state"], frac)[0]
        value = float(lay[int(at)] - lay[int(as_)]) if math.isfinite(at) and math.isfinite(as_) else NAN
        lo, hi = _ci(lay[rt[ok].astype(int)] - lay[rs[ok].astype(int)]) if ok.any() else (NAN, NAN)
        p = float((rs[ok] < rt[ok]).mean()) if ok.any() else NAN
        weak = [c.name for c in claims if c.name in ("task_beats_control", "state_beats_control") and c.verdict != "supported"]
        v = "inconclusive" if weak or not ok.any() else "supported" if p >= 0.95 else "not supported" if p <= 0.05 \
            else "inconclusive"
        claims.append(Claim("state_before_task", f"reach layer (task) - reach layer (state), frac {frac:g}", value, lo, hi, v,
                            f"P(state reaches first) = {p:.3f} over bootstrap resamples"
                            + (f"; not decodable above control: {', '.join(weak)}" if weak else "")))
    return claims, summary


# ---------------------------------------------------------------- driver


def run_probes(model, mix, ep, *, ks=(1, 2, 3, 4, 5), max_tasks: int = 32, positions_per_episode: int | None = 32,
               seed: int = 0, device="cpu", test_frac: float = 0.25, n_boot: int = 1000, C: float = 1.0,
               max_iter: int = 100, tol: float = 1e-3, frac: float = 0.9, belief: bool = True,
               alphas=(0.1, 1.0, 10.0, 100.0, 1000.0), layers=None, n_layers: int | None = None,
               batch_size: int = 64, mem_budget: int = 1 << 30, blas_threads: int | None = 1,
               warm_start: bool = False) -> ProbeResult:
    """All probes of the module docstring on every layer; mix is needed for the belief probe (None skips it)."""
    t0 = time.perf_counter()
    res = collect_residuals(model, ep, layers=layers, n_layers=n_layers, positions_per_episode=positions_per_episode,
                            seed=seed, device=device, batch_size=batch_size, mem_budget=mem_budget)
    pos, (N, P) = res.pos, res.pos.shape
    rows_ep, tpos = np.repeat(np.arange(N), P), np.asarray(ep.position)[pos].ravel()
    is_test = split_episodes(N, test_frac, seed)
    te_of = np.cumsum(is_test) - 1
    test_row, n_test = is_test[rows_ep], int(is_test.sum())
    tok, tid = np.asarray(ep.tokens).astype(np.int64), np.asarray(ep.task_ids).astype(np.int64)
    uniq, cnt = np.unique(tid, return_counts=True)
    keep = uniq[np.lexsort((uniq, -cnt))[:max_tasks]]
    targets = {"task": (np.where(np.isin(tid, keep), tid, -1)[rows_ep], True),
               "state": (np.asarray(ep.states).astype(np.int64)[rows_ep, pos.ravel()], False)}
    for k in ks:
        targets[f"kback{k}"] = (np.where(tpos >= k, tok[rows_ep, np.maximum(pos.ravel() - k, 0)], -1), False)
    rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG, 3]))

    def shuffled(y, use, episode_level):  # control labels: permuted among the used training rows only
        out, m = y.copy(), use & ~test_row
        out[m] = _control(y[m], rows_ep[m], tpos[m], episode_level, rng)
        return out
    ctrl_y = {t: shuffled(y, y >= 0, epl) for t, (y, epl) in targets.items()}
    W = _boot_weights(n_test, n_boot, seed)
    Y = None
    if belief and mix is not None:
        from .inference import task_beliefs
        Y = np.concatenate([task_beliefs(mix, ep.subset(slice(a, a + 256)), dtype=torch.float32).numpy()[
            np.arange(min(256, N - a))[:, None], pos[a:a + 256]] for a in range(0, N, 256)]).reshape(N * P, -1)
        Yc = Y[shuffled(np.arange(N * P), np.ones(N * P, bool), False)]

    def r2_stats(pred, y):  # per test episode sums -> point R^2 and bootstrap draws
        e, y, pred = te_of[rows_ep[test_row]], y.astype(np.float64), pred.astype(np.float64)
        s = [np.stack([np.bincount(e, v[:, j], n_test) for j in range(v.shape[1])], 1)
             for v in (np.ones_like(y[:, :1]), y, y * y, (pred - y) ** 2)]

        def r2(w):
            n, sy, syy, sse = (w @ a for a in s)
            return 1 - _ratio(sse.sum(-1), (syy - _ratio(sy ** 2, n)).sum(-1))
        return float(r2(np.ones(n_test))), r2(W)

    acc, boot, ctrl, cboot, chance, table, btab, clfs = {}, {}, {}, {}, {}, [], [], {}
    bel = [[], [], [], []]
    t_fit = 0.0
    for li, (layer, X) in enumerate(res):
        t1 = time.perf_counter()
        with threadpool_limits(blas_threads, user_api="blas"), warnings.catch_warnings():  # see module docstring
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", LinAlgWarning)  # ridge at small alpha on the low-rank embedding layer
            X = X.reshape(N * P, -1)
            tr = ~test_row
            mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-6
            X = (X - mu) / sd
            for t, (y, _) in targets.items():
                use = y >= 0
                a, b = use & tr, use & test_row
                if len(np.unique(y[a])) < 2 or not b.any():
                    continue
                e, yte = te_of[rows_ep[b]], y[b]
                if li == 0:
                    chance[t] = float(np.bincount(yte).max() / len(yte))
                    acc[t], boot[t], ctrl[t], cboot[t] = (np.full(len(res.layers), NAN) if i % 2 == 0 else
                                                          np.full((n_boot, len(res.layers)), NAN) for i in range(4))
                for kind, labels in (("real", y), ("control", ctrl_y[t])):
                    clf = clfs.setdefault((t, kind), LogisticRegression(C=C, max_iter=max_iter, tol=tol,
                                                                          warm_start=warm_start))
                    hit = (clf.fit(X[a], labels[a]).predict(X[b]) == yte).astype(float)
                    h, c = np.bincount(e, hit, n_test), np.bincount(e, None, n_test).astype(float)
                    (acc if kind == "real" else ctrl)[t][li] = h.sum() / c.sum()
                    (boot if kind == "real" else cboot)[t][:, li] = _ratio(W @ h, W @ c)
                lo, hi = _ci(boot[t][:, li])
                clo, chi = _ci(cboot[t][:, li])
                table.append({"target": t, "layer": layer, "acc": acc[t][li], "acc_lo": lo, "acc_hi": hi, "chance": chance[t],
                              "control_acc": ctrl[t][li], "control_lo": clo, "control_hi": chi,
                              "beats_control": lo > max(chi, chance[t]),
                              "n_train": int(a.sum()), "n_test": int(b.sum()), "n_classes": int(len(np.unique(y[a])))})
            if Y is not None:
                g = rows_ep[tr]
                p1, alpha = _ridge(X[tr], Y[tr], g, X[test_row], alphas, rng)
                p2, calpha = _ridge(X[tr], Yc[tr], g, X[test_row], alphas, rng)
                (r2, rb), (c2, cb) = r2_stats(p1, Y[test_row]), r2_stats(p2, Y[test_row])
                for lst, v in zip(bel, (r2, rb, c2, cb)):
                    lst.append(v)
                btab.append({"target": "belief", "layer": layer, "r2": r2, "r2_lo": _ci(rb)[0], "r2_hi": _ci(rb)[1],
                             "control_r2": c2, "control_lo": _ci(cb)[0], "control_hi": _ci(cb)[1], "alpha": alpha,
                             "control_alpha": calpha, "n_test": int(test_row.sum()), "n_outputs": Y.shape[1]})
        t_fit += time.perf_counter() - t1
    table.sort(key=lambda r: (list(targets).index(r["target"]), r["layer"]))
    belief_arrays = None if Y is None else (np.array(bel[0]), np.stack(bel[1], 1), np.array(bel[2]), np.stack(bel[3], 1))
    claims, summary = _claims(res.layers, acc, boot, ctrl, cboot, chance, ks, frac, belief_arrays)
    meta = {"n_episodes": N, "n_train_episodes": N - n_test, "n_test_episodes": n_test, "positions_per_episode": P,
            "layers": res.layers, "tasks_probed": keep.tolist(),
            "test_episodes": np.flatnonzero(is_test).tolist(), "ks": list(ks), "seed": seed, "C": C,
            "max_iter": max_iter, "tol": tol, "n_boot": n_boot, "frac": frac, "test_frac": test_frac,
            "timings": {"residuals_s": res.seconds, "fits_s": t_fit, "total_s": time.perf_counter() - t0}}
    return ProbeResult(table, btab, summary, claims, meta)
