"""`run_probes`: every probe of the package docstring on every layer of a model.

Builds the targets (package docstring) and their shuffled-label controls, draws everything seeded in the
main process in layer order, streams the residuals (`residuals`) into the layers' fits (`fits`, in worker
processes with n_jobs > 1), and hands the per-episode scores to the statistics (`claims`); returns a
`ProbeResult`. Imports torch and inference only for the belief targets (`_belief_targets`); must not import
train, jobs, sweep or the CLI.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...data import seeds
from ...stats import percentile_ci
from .claims import TargetScores, boot_weights, nan_ratio, probe_claims, r2_curves
from .fits import LayerInputs, layer_fits, lookup_baseline, majority_rate, ridge_val, shuffled_labels, split_episodes
from .residuals import PROBE_TAG, collect_residuals
from .result import ProbeResult


def kback_baselines(ep, pos: np.ndarray, is_test: np.ndarray, ks) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The k-back probes' two lookup baselines, scored on the probes' own rows: positions pos (N, P) of ep, episodes
    split by is_test (N,) bool, the rows of kback{k} those whose test position is >= k.

    Per k: (hits of the (task, o_t) baseline, hits of the o_t-only baseline (token statistics), scored rows), each
    (n_test,) per held-out episode in order. Each is a lookup table fitted on the training episodes' rows: the most
    frequent o_(t-k) per key (unseen keys: per o_t, then overall). Needs no model: a record whose probe episodes can
    be rebuilt (episodes.probe_episodes, sample_positions, split_episodes with the analysis seed) gets the same hits.
    """
    (N, P) = pos.shape
    rows_ep, tpos = np.repeat(np.arange(N), P), np.asarray(ep.position)[pos].ravel()
    test_row, e_row, n_test = is_test[rows_ep], (np.cumsum(is_test) - 1)[rows_ep], int(is_test.sum())
    tok, tid = np.asarray(ep.tokens).astype(np.int64), np.asarray(ep.task_ids).astype(np.int64)
    task_row, cur = tid[rows_ep], tok[rows_ep, pos.ravel()]
    out = {}
    for k in ks:
        y = np.where(tpos >= k, tok[rows_ep, np.maximum(pos.ravel() - k, 0)], -1)
        a, b = (y >= 0) & ~test_row, (y >= 0) & test_row
        task = (lookup_baseline(task_row * (tok.max() + 1) + cur, y, a, b, cur) == y[b]).astype(float)
        alone = (lookup_baseline(cur, y, a, b, cur) == y[b]).astype(float)
        out[k] = (np.bincount(e_row[b], task, n_test), np.bincount(e_row[b], alone, n_test),
                  np.bincount(e_row[b], None, n_test).astype(float))
    return out


def run_probes(model, mix, ep, *, ks=(1, 2, 3, 4, 5), max_tasks: int = 32, positions_per_episode: int | None = 32,
               seed: int = 0, device="cpu", test_frac: float = 0.25, n_boot: int = 1000, C: float = 1.0,
               max_iter: int = 100, tol: float = 1e-3, fracs=(0.5, 0.9), belief: bool = True,
               alphas=(0.1, 1.0, 10.0, 100.0, 1000.0), layers=None, n_layers: int | None = None,
               batch_size: int = 64, mem_budget: int = 1 << 30, blas_threads: int | None = 1,
               warm_start: bool = False, n_jobs: int = 1, fits: str = "auto",
               progress: Callable[[str], Any] | None = None) -> ProbeResult:
    """All probes of the module docstring on every layer; mix is needed for the belief probe (None skips it).

    fits: "sklearn" (scikit-learn on the CPU, in n_jobs processes), "torch" (`torch_fits` on `device`, in this
    process) or "auto" (torch on a CUDA device, else sklearn).
    n_jobs: worker processes for the layers' fits (module docstring; the same numbers at any n_jobs). progress:
    called with a line of text after the belief targets, after each layer's fits and after the statistics.
    """
    _check(n_jobs, warm_start, fits)
    fit_device = str(device) if fits == "torch" or fits == "auto" and str(device).startswith("cuda") else None
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    res = collect_residuals(model, ep, layers=layers, n_layers=n_layers, positions_per_episode=positions_per_episode,
                            seed=seed, device=device, batch_size=batch_size, mem_budget=mem_budget)
    rows = _Rows.of(ep, res.pos, split_episodes(res.pos.shape[0], test_frac, seed), seed)
    nL = len(res.layers)
    targets, keep, (uniq, cnt) = _targets(ep, rows, ks, max_tasks)
    ctrl_y = {t: rows.shuffled(y, y >= 0, g, epl, t) for t, (y, g, epl) in targets.items()}
    fittable, scores, meta_fit = _fittable(targets, rows, nL)
    Y = Yc = None
    vals: list = [None] * nL
    if belief and mix is not None:
        Y, Yc, vals = _belief_targets(mix, ep, rows, nL)
        say(f"belief targets: {rows.N} episodes x {rows.P} positions x {Y.shape[1]} states")
    fit = LayerInputs(fittable, ctrl_y, rows.test_row, rows.e_row, rows.n_test, Y, Yc, C, max_iter, tol, tuple(alphas),
                      blas_threads, fit_device)
    jobs = 1 if fit_device else min(n_jobs, nL)
    bel, btab, t_fit = _fit_layers(res, fit, vals, jobs, warm_start, scores, rows, say)
    base = kback_baselines(ep, res.pos, rows.is_test, [k for k in ks if f"kback{k}" in scores])
    claims, summary, ci = probe_claims(res.layers, scores, ks=ks, fracs=fracs, n_boot=n_boot, seed=seed,
                                       baseline={k: v[0] for k, v in base.items()},
                                       token_baseline={k: v[1] for k, v in base.items()},
                                       belief=tuple(bel) if Y is not None else None)
    table = _layer_table(scores, ci, res.layers, meta_fit)
    if Y is not None:
        _belief_table(btab, bel, rows.n_test, n_boot, seed)
    say(f"statistics done ({n_boot} bootstrap resamples)")
    N, P, n_test = rows.N, rows.P, rows.n_test
    meta = {"n_episodes": N, "n_train_episodes": N - n_test, "n_test_episodes": n_test, "positions_per_episode": P,
            "layers": res.layers, "tasks_probed": keep.tolist(),
            "episodes_per_task": {"min": int(cnt[np.isin(uniq, keep)].min()), "max": int(cnt[np.isin(uniq, keep)].max())},
            "test_episodes": np.flatnonzero(rows.is_test).tolist(), "ks": list(ks), "seed": seed, "C": C,
            "max_iter": max_iter, "tol": tol, "n_boot": n_boot, "fracs": list(fracs), "test_frac": test_frac,
            "n_jobs": jobs, "fits": f"torch on {fit_device}" if fit_device else "sklearn",
            "timings": {"residuals_s": res.seconds, "fits_s": t_fit, "total_s": time.perf_counter() - t0}}
    return ProbeResult(table, btab, summary, claims, meta)


def _check(n_jobs, warm_start: bool, fits: str) -> None:
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1:
        raise ValueError(f"n_jobs must be an integer >= 1, got {n_jobs!r}")
    if warm_start and n_jobs > 1:
        raise ValueError("warm_start=True carries each layer's fit to the next, so the layers fit in order: "
                         f"use n_jobs=1, got {n_jobs}")
    if fits not in ("auto", "sklearn", "torch"):
        raise ValueError(f"fits must be auto, sklearn or torch, got {fits!r}")


@dataclass(frozen=True)
class _Rows:
    """The probes' rows (episode x sampled position, flattened) and the episodes' train / test split."""

    N: int
    P: int
    pos: np.ndarray  # (N, P) sampled positions
    rows_ep: np.ndarray  # (N * P,) each row's episode
    tpos: np.ndarray  # (N * P,) each row's test position
    is_test: np.ndarray  # (N,) held-out episodes
    test_row: np.ndarray  # (N * P,) rows of held-out episodes
    e_row: np.ndarray  # (N * P,) each row's index among the held-out episodes
    n_test: int
    seed: int

    @classmethod
    def of(cls, ep, pos: np.ndarray, is_test: np.ndarray, seed: int) -> _Rows:
        N, P = pos.shape
        rows_ep, tpos = np.repeat(np.arange(N), P), np.asarray(ep.position)[pos].ravel()
        te_of = np.cumsum(is_test) - 1
        return cls(N, P, pos, rows_ep, tpos, is_test, is_test[rows_ep], te_of[rows_ep], int(is_test.sum()), seed)

    def shuffled(self, y, use, group, episode_level, name):
        """Control labels: permuted among the used training rows only."""
        rng = seeds.rng(self.seed, PROBE_TAG, 3, zlib.crc32(name.encode()))
        out, m = y.copy(), use & ~self.test_row
        key = self.tpos if group is None else group * (int(self.tpos.max()) + 1) + self.tpos
        out[m] = shuffled_labels(y[m], self.rows_ep[m], key[m], episode_level, rng)
        return out


def _targets(ep, rows: _Rows, ks, max_tasks: int):
    """The probes' targets {name: (labels (-1: unused), group for per-group probes, episode-level control)}, the
    tasks probed (the max_tasks with the most episodes) and every task's episode count."""
    tok, tid = np.asarray(ep.tokens).astype(np.int64), np.asarray(ep.task_ids).astype(np.int64)
    uniq, cnt = np.unique(tid, return_counts=True)
    keep = uniq[np.lexsort((uniq, -cnt))[:max_tasks]]
    task_row = tid[rows.rows_ep]
    probed = np.isin(task_row, keep)
    flat = rows.pos.ravel()
    state = np.asarray(ep.states).astype(np.int64)[rows.rows_ep, flat]
    targets = {"task": (np.where(probed, task_row, -1), None, True),
               "state": (np.where(probed, state, -1), task_row, False),
               "state_pooled": (state, None, False)}
    for k in ks:
        targets[f"kback{k}"] = (np.where(rows.tpos >= k, tok[rows.rows_ep, np.maximum(flat - k, 0)], -1), None, False)
    return targets, keep, (uniq, cnt)


def _fittable(targets: dict, rows: _Rows, nL: int):
    """The targets fitted (at every layer or at none: two classes among the training rows and a held-out row), their
    empty score arrays and their fit sizes."""
    fittable, scores, meta_fit = {}, {}, {}
    for t, (y, group, _) in targets.items():
        a, b = (y >= 0) & ~rows.test_row, (y >= 0) & rows.test_row
        if len(np.unique(y[a])) < 2 or not b.any():
            continue
        fittable[t] = (y, group)
        scores[t] = TargetScores(np.zeros((rows.n_test, nL)), np.zeros((rows.n_test, nL)),
                                 np.bincount(rows.e_row[b], None, rows.n_test).astype(float),
                                 majority_rate(y[b], None if group is None else group[b]))
        meta_fit[t] = {"n_train": int(a.sum()), "n_test": int(b.sum()), "n_classes": int(len(np.unique(y[a])))}
    return fittable, scores, meta_fit


def _belief_targets(mix, ep, rows: _Rows, nL: int):
    """The belief probe's targets (the mixture's task beliefs at the rows), their shuffled control and each layer's
    ridge validation split, drawn here in layer order."""
    import torch  # lazy: torch and the oracles only for the belief targets

    from ...oracles.inference import task_beliefs  # lazy: with torch

    N, P, pos = rows.N, rows.P, rows.pos
    Y = np.concatenate([task_beliefs(mix, ep.subset(slice(a, a + 256)), dtype=torch.float32).numpy()[
        np.arange(min(256, N - a))[:, None], pos[a:a + 256]] for a in range(0, N, 256)]).reshape(N * P, -1)
    Yc = Y[rows.shuffled(np.arange(N * P), np.ones(N * P, bool), None, False, "belief")]
    rng, g = seeds.rng(rows.seed, PROBE_TAG, 5), rows.rows_ep[~rows.test_row]
    vals = [(ridge_val(g, rng), ridge_val(g, rng)) for _ in range(nL)]
    return Y, Yc, vals


def _fit_layers(res, fit: LayerInputs, vals, jobs: int, warm_start: bool, scores: dict, rows: _Rows, say):
    """Every layer's fits, their held-out hits into `scores`; the belief sums and table rows, the fits' seconds."""
    bel, btab, t_fit = ([], []), [], 0.0
    nL = len(res.layers)
    with closing(layer_fits(res, fit, vals, jobs, warm_start)) as fits:
        for li, layer, out in fits:
            for t, (real, control) in out["hits"].items():
                scores[t].hits[:, li], scores[t].control[:, li] = real, control
            if out["belief"] is not None:
                s1, s2, alpha, calpha = out["belief"]
                bel[0].append(s1)
                bel[1].append(s2)
                btab.append({"target": "belief", "layer": layer, "alpha": alpha, "control_alpha": calpha,
                             "n_test": int(rows.test_row.sum()), "n_outputs": fit.Y.shape[1]})
            t_fit += out["seconds"]
            say(f"layer {li + 1}/{nL} done (layer {layer}: fits {out['seconds']:.1f} s"
                + (f" in one of {jobs} processes)" if jobs > 1 else ")"))
    return bel, btab, t_fit


def _layer_table(scores: dict, ci: dict, layers, meta_fit: dict) -> list[dict]:
    """One row per (target, layer): accuracy and its control's with their bootstrap CIs, chance."""
    table = []
    for t, s in scores.items():
        acc, cacc = nan_ratio(s.hits.sum(0), s.counts.sum()), nan_ratio(s.control.sum(0), s.counts.sum())
        (alo, ahi), (clo, chi) = ci[t][0].T, ci[t][1].T
        for li, layer in enumerate(layers):
            table.append({"target": t, "layer": layer, "acc": acc[li], "acc_lo": alo[li], "acc_hi": ahi[li],
                          "chance": s.chance, "control_acc": cacc[li], "control_lo": clo[li], "control_hi": chi[li],
                          "beats_control": bool(alo[li] > max(chi[li], s.chance)), **meta_fit[t]})
    return table


def _belief_table(btab: list[dict], bel: tuple, n_test: int, n_boot: int, seed: int) -> None:
    """The belief rows' R^2 and their control's, with bootstrap CIs (in place)."""
    W = boot_weights(n_test, n_boot, seed)
    one = np.ones((1, n_test))
    r2, rb, c2, cb = (r2_curves(bel[0], one)[0], r2_curves(bel[0], W), r2_curves(bel[1], one)[0],
                      r2_curves(bel[1], W))
    for li, row in enumerate(btab):
        row.update({"r2": float(r2[li]), "r2_lo": percentile_ci(rb[:, li])[0], "r2_hi": percentile_ci(rb[:, li])[1],
                    "control_r2": float(c2[li]), "control_lo": percentile_ci(cb[:, li])[0],
                    "control_hi": percentile_ci(cb[:, li])[1]})
