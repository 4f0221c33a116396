"""The probes' fits: the split, shuffled-label controls, classifiers, ridge, and the worker processes.

Split and fits. One seeded split of episodes (`test_frac` held out) for every target and layer: no
episode on both sides. Features standardized on the training rows. Classifiers: multinomial
LogisticRegression(C, lbfgs, max_iter, tol), each layer fitted from scratch (warm_start=True reuses the
previous layer's fit: faster, with accuracies close to the fits from scratch, but layer-order
dependent; never for the per-task state probes). Fits run with `blas_threads` BLAS threads (default 1:
on a machine with few cores multi-threaded OpenBLAS makes each lbfgs fit several times slower). The layers' fits are
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

Stopping the workers (an error, Ctrl-C, SIGTERM, the consumer gone): they are terminated, and the pool's
own manager thread, which waits for (reaps) each worker that ends, is waited for in turn; this process never
joins a worker itself. Two threads joining one child race: the one that loses the waitpid gets ECHILD, and
its join returns as if the child still ran, so the child can stay in `multiprocessing.active_children()`
after run_probes has raised (the test `test_the_fit_workers_are_reaped_when_the_pool_reaps_them_late`).

Torch fits (`fit_device` set: `torch_fits`, e.g. on the GPU): the same split, standardization,
controls and outputs, the classifiers and ridge fitted in torch on that device, in this process (n_jobs and
warm_start do not apply); accuracies and R^2 within the tolerances of tests/test_probes_torch.py of scikit-learn's.

Worker processes import this module: it must not import torch (nor anything that does) at module level; it
imports sklearn and the residuals module's tag only (torch_fits only inside a torch fit).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
import warnings
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.linalg import LinAlgWarning
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from threadpoolctl import threadpool_limits

from ...data import seeds
from .residuals import PROBE_TAG

if TYPE_CHECKING:
    from .residuals import Residuals

STOP_TIMEOUT_S = 30.0  # how long stopping waits for the terminated workers to be reaped before it kills them


def split_episodes(n: int, test_frac: float = 0.25, seed: int = 0) -> np.ndarray:
    """(n,) bool: True for held-out episodes (at least one on each side when n >= 2)."""
    n_test = min(max(1, round(test_frac * n)), n - 1)
    out = np.zeros(n, bool)
    out[seeds.rng(seed, PROBE_TAG, 1).permutation(n)[:n_test]] = True
    return out


def shuffled_labels(y, ep_row, key, episode_level: bool, rng) -> np.ndarray:
    """Shuffled labels: whole episodes' labels permuted (episode_level), else rows within equal keys."""
    if episode_level:
        _, first, inv = np.unique(ep_row, return_index=True, return_inverse=True)
        return y[first][rng.permutation(len(first))][inv]
    out = np.empty_like(y)
    out[np.argsort(key, kind="stable")] = y[np.lexsort((rng.random(len(y)), key))]
    return out


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


def majority_rate(y, group=None) -> float:
    """Majority-class rate of y (per group, pooled, when group is given)."""
    if group is None:
        return float(np.bincount(y).max() / len(y))
    return float(sum(np.bincount(y[group == g]).max() for g in np.unique(group)) / len(y))


def lookup_baseline(key, y, a, b, fallback) -> np.ndarray:
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


def ridge_val(g, rng) -> np.ndarray:
    """Rows of a seeded quarter of the training episodes g (at least one): ridge's inner validation split."""
    eps = np.unique(g)
    return np.isin(g, eps[rng.permutation(len(eps))[:max(1, len(eps) // 4)]])


def _ridge(Xtr, Ytr, val, Xte, alphas):
    """Ridge predictions for Xte with alpha chosen on the training rows `val` (ridge_val), then refitted on all."""
    sse = [((Ridge(alpha=a).fit(Xtr[~val], Ytr[~val]).predict(Xtr[val]) - Ytr[val]) ** 2).sum() for a in alphas]
    best = float(alphas[int(np.argmin(sse))])
    return Ridge(alpha=best).fit(Xtr, Ytr).predict(Xte), best


def _sums(pred, y, e, n_test: int) -> list[np.ndarray]:
    """Per test episode e of each row: sums (n, sy, syy, sse), each (n_test, S)."""
    y, pred = y.astype(np.float64), pred.astype(np.float64)
    return [np.stack([np.bincount(e, v[:, j], n_test) for j in range(v.shape[1])], 1)
            for v in (np.ones_like(y[:, :1]), y, y * y, (pred - y) ** 2)]


@dataclass
class LayerInputs:
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
    fit_device: str | None = None  # None: scikit-learn's fits (CPU, worker processes); a device: torch_fits there


def _fit_layer(f: LayerInputs, X: np.ndarray, vals, clfs: dict | None = None) -> dict:
    """One layer's probes on its residuals X (N, P, D); vals = ridge's inner validation rows (real, control),
    clfs = the classifiers carried from layer to layer (warm_start; None: fitted from scratch).

    Returns {"hits": name -> (probe, control) hits per test episode (n_test,) each, "belief": (probe sums,
    control sums, alpha, control alpha) or None, "seconds": the fits' wall time}.
    """
    t0, out = time.perf_counter(), {"hits": {}, "belief": None}
    if f.fit_device is not None:
        return _fit_layer_torch(f, X, vals, t0, out)
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


def _fit_layer_torch(f: LayerInputs, X: np.ndarray, vals, t0: float, out: dict) -> dict:
    """_fit_layer with torch_fits on f.fit_device (the same standardization, splits, controls and outputs)."""
    import torch  # lazy: torch off the fits' worker processes (they import this package without torch)

    from . import torch_fits  # lazy: torch_fits (torch) only inside a torch fit

    X = torch.as_tensor(X.reshape(len(f.test_row), -1), device=f.fit_device).float()
    tr = torch.as_tensor(~f.test_row, device=X.device)
    mu, sd = X[tr].mean(0), X[tr].std(0, correction=0) + 1e-6
    X = (X - mu) / sd
    tr_np = ~f.test_row
    for t, (y, group) in f.targets.items():
        use = y >= 0
        a, b = use & tr_np, use & f.test_row
        hits = []
        for labels in (y, f.ctrl_y[t]):
            pred = torch_fits.fit_predict(X, labels, a, b, group, f.C, f.max_iter, f.tol, f.fit_device)
            hits.append(np.bincount(f.e_row[b], (pred == y[b]).astype(float), f.n_test))
        out["hits"][t] = tuple(hits)
    if f.Y is not None:
        Xtr, Xte, Yte, e = X[tr], X[~tr], f.Y[f.test_row], f.e_row[f.test_row]
        p1, alpha = torch_fits.ridge(Xtr, f.Y[tr_np], vals[0], Xte, f.alphas, f.fit_device)
        p2, calpha = torch_fits.ridge(Xtr, f.Yc[tr_np], vals[1], Xte, f.alphas, f.fit_device)
        out["belief"] = (_sums(p1, Yte, e, f.n_test), _sums(p2, Yte, e, f.n_test), alpha, calpha)
    out["seconds"] = time.perf_counter() - t0
    return out


_WORKER_FITS: LayerInputs | None = None  # a worker process's copy (_init_worker)


def _init_worker(path: str) -> None:
    """Load the LayerInputs that `layer_fits` wrote to `path` (see there why a file)."""
    global _WORKER_FITS
    with open(path, "rb") as fh:
        _WORKER_FITS = pickle.load(fh)


def _fit_in_worker(X, vals) -> dict:
    return _fit_layer(_WORKER_FITS, X, vals)


def _stop_workers(pool) -> None:
    """Terminate the pool's workers now, and return once every one is reaped (module docstring).

    The pool's manager thread joins each worker that ends; this process only waits for that thread. A worker
    that outlives SIGTERM by STOP_TIMEOUT_S is killed, and the thread waited for again.
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before Python 3.14
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)  # (it forgets the processes and the thread)
    for p in procs:
        p.terminate()
    if manager is None:  # no thread to reap them (not started): join them here, the only joiner
        for p in procs:
            p.join(STOP_TIMEOUT_S)
        return
    manager.join(STOP_TIMEOUT_S)
    if manager.is_alive():
        for p in procs:
            p.kill()
        manager.join(STOP_TIMEOUT_S)


def layer_fits(res: Residuals, f: LayerInputs, vals, n_jobs: int, warm_start: bool):
    """(layer index, layer, _fit_layer's dict) for every layer, in layer order.

    n_jobs > 1: the fits run in n_jobs spawned worker processes (fork and torch do not mix) while this process
    collects the next layers' residuals, at most 2 * n_jobs layers in flight; an error or interrupt stops the
    workers (`_stop_workers`).
    """
    if n_jobs == 1 or f.fit_device is not None:  # torch fits run here, on their device
        clfs = {} if warm_start and f.fit_device is None else None
        for li, (layer, X) in enumerate(res):
            yield li, layer, _fit_layer(f, X, vals[li], clfs)
        return
    # The workers get `f` from a file: as an initializer argument it would travel in each worker's launch data,
    # which the spawning call writes to a pipe until the child has read it all, and the child reads it only as
    # it unpickles, after importing this module (sklearn, seconds): each start would block this process.
    tmp = tempfile.TemporaryDirectory(prefix="hmmscope-probe-fits-")
    try:
        path = os.path.join(tmp.name, "fits.pkl")
        with open(path, "wb") as fh:
            pickle.dump(f, fh, protocol=pickle.HIGHEST_PROTOCOL)
        pool = ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(path,))
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
            _stop_workers(pool)
            raise
        pool.shutdown()
    finally:
        tmp.cleanup()
