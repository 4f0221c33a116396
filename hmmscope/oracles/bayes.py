"""The Bayes-optimal predictor for fresh tasks of a family (SCIENCE.md 10): ``bayes``.

For a task drawn from the family's own prior, the ideal in-context learner predicts
``p(o_t | o_<t) = E[p(o_t | o_<t, task) | o_<t]``, the expectation over the posterior of the task given the episode
so far. family_bayes (the mixture oracle over M prior draws) is a Monte Carlo estimate of it that misses whole parts
of the discrete structure at the sizes used; this module computes it.

Method, for the ``sticky`` family (data/hmm.py ``_sticky_factors``). A task is
- a discrete part: the permutation sigma of the d clusters and the revealing map (each state's token); the clusters
  are contiguous, cluster(s) = s d // S;
- continuous parts: the transition noise (row s of W is rho Dir(1) plus 1 - rho on sigma(cluster(s))), the Q rows of
  clusters with 2 or more states (Dir(alpha) on the cluster), the initial mu ~ Dir(1).
Computed as follows.
- Relabeling the hidden states by a permutation that maps the cluster partition onto itself (states within a
  cluster, clusters of one size among themselves) leaves prior and likelihood unchanged (every Dirichlet above is
  exchangeable), so one structure per orbit is enumerated, weighted by the orbit's size (`sticky_structures`).
- mu is integrated exactly: each segment restarts from mu, and the segments' start states are a Polya urn under
  mu ~ Dir(1) (bayes_kernel: the urn's predictive is each segment's start vector).
- The noise rows and the Q rows by Monte Carlo: K draws per episode, shared by every structure (common random
  numbers), in blocks of BLOCK draws; the prediction is the posterior-weighted mixture over structures x draws
  (self-normalized importance sampling from the prior). Its expected CE over episodes from the prior is never below
  the exact reference's (the draws do not depend on the token predicted, so the Monte Carlo predictor is one more
  predictor the Bayes predictor beats in expectation), and the excess shrinks as K grows. K is doubled until the mean
  CE over the scored tokens moves less than `tol` (default TOL = 0.002 nats/token) and twice its Monte Carlo
  standard error (the jackknife over the draw blocks, at least 4 blocks; rough with few) is below `tol`. The last move
  estimates the remaining excess; `tol` bounds the move, not the error, which the standard error states.
- No structure is pruned in advance. A term whose posterior weight is below exp(-theta) of the running largest is
  not added, and a hypothesis' chain stops once no later term of it can pass that test (bayes_kernel: an emission-
  only bound on its future likelihood; the hypotheses of each episode run likely ones first): the skipped mass is at
  most H exp(-theta) <= 1e-13 relative (theta = log(H / 1e-13)), as in the mixture kernel.
Where it cannot be computed (`why_not`): the ``dirichlet`` family (no discrete part to enumerate; a resample-move SMC
over its continuous parameters is not implemented), more than MAX_STRUCTURES structures (S = 8, V = 16 already has
about 5e8), or structures x relabelings above MAX_WORK. Callers then say "not computed" in one line and keep the
lower bounds; no number that is not converged is reported as the reference (`BayesPrediction.converged`).

Explicit tasks (`discrete_bayes`): the same kernel with a discrete prior (each task its own fixed mu) is the mixture
oracle over those tasks; the tests hold the two equal to 1e-12.

Windowed (`windowed_bayes`, receptive field R): at position t, Bayes given only the R positions before t, the state
at the window's start drawn from its marginal under the prior there (each hypothesis' E[mu] T^p, p the window's
start in its segment, and the Polya urn across the segments a window spans). The best any predictor that sees R
tokens, and knows where the window starts in its episode, can do; a banded model does not see the absolute
position beyond what its window shows, so beside such a model the window-forced part is a lower side and the
model's own part an upper side. Under hmm.structures = half-heldout the reference is the Bayes predictor of the
evaluation distribution (the other half), which a model trained on half 0 cannot know.

Cost: `hmmscope bench bayes` times the base cell of the inference-ablations record (S = 4, V = 8, d = 4: 1680
orbits) to convergence on one core; its record is analysis/results/bench/RUN.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import NamedTuple

import numpy as np
import torch

from ..config import HMMConfig, config_hash
from ..data import seeds
from ..data.hmm import Mixture, emission_matrix
from .bayes_cache import code_hash, disk_get, disk_put
from .bayes_structures import Structures, clusters, sticky_structures, why_not

__all__ = ["BayesPrediction", "bayes_oracle", "discrete_bayes", "windowed_bayes", "TOL", "BLOCK"]

TOL = 0.002  # nats/token: K is doubled until the mean CE moves less than this
BLOCK = 4  # draws per block (the jackknife's unit)
K_START = 8  # draws before the first comparison
K_MAX = 512  # draws at most; not converged by then: BayesPrediction.converged is False
_TAG = 0x42415945  # "BAYE": the Monte Carlo draws' stream
_SKIP = 1e-13  # bound on the relative mass of the terms not added
_VERSION = 2  # part of every result's key, with the sources' hash (`bayes_cache.code_hash`): stale entries never read


class BayesPrediction(NamedTuple):
    """The Bayes reference on a batch of episodes."""

    pred: torch.Tensor  # (N, T, V) float64 p(o_t = v | o_<t), NaN rows at non-observation tokens
    ce: float  # mean over episodes of the mean CE over the scored tokens
    mc_se: float  # Monte Carlo standard error of ce (jackknife over the draw blocks; 0 when nothing is drawn)
    n_draws: int  # K, draws per episode (0: nothing continuous to draw)
    converged: bool  # the last doubling moved ce by less than tol (always True when nothing is drawn)
    history: tuple  # ((K, ce), ...) as K was doubled
    method: str  # one line: what was enumerated, integrated and drawn


# ---------------------------------------------------------------- episodes as the kernel reads them


class _Layout(NamedTuple):
    tok: np.ndarray  # (N, T) int32: observations, -1 missing, -2 hidden steps
    seg_lo: np.ndarray  # (J,)
    seg_hi: np.ndarray
    seg_kind: np.ndarray  # 1 from the start, 2 midstream test
    burn_in: int
    score: np.ndarray  # (T,) bool: the tokens whose CE decides convergence, or (N,) int: one position per episode
    V: int


def _layout(ep, score=None) -> _Layout:
    seg = np.asarray(ep.segment)
    tok = np.asarray(ep.tokens).astype(np.int32)
    V = int(ep.n_tokens)
    tok = np.where((tok >= 0) & (tok < V), tok, np.where(tok == -2, -2, -1)).astype(np.int32)  # -2: hidden steps
    starts = np.flatnonzero((seg >= 0) & np.r_[True, seg[1:] != seg[:-1]])
    lo = starts.astype(np.int64)
    hi = np.r_[starts[1:], len(seg)].astype(np.int64)
    meta = getattr(ep, "meta", None) or {}
    midstream = meta.get("test_start", "initial") == "midstream"
    burn = int(meta.get("burn_in", 0)) if midstream else 0
    kind = np.ones(len(lo), np.int64)
    if midstream and burn > 0:
        kind[-1] = 2  # the test is the last segment
    if score is None:
        score = (seg == ep.n_demos) & (np.arange(len(seg)) >= 1)  # Figure 1's scored test tokens
    score = np.asarray(score)
    if score.dtype != bool and score.shape != (tok.shape[0],):
        raise ValueError(f"score must be a (T,) mask or one position per episode, got shape {score.shape}")
    return _Layout(tok, lo, hi, kind, burn, score, V)


def _urn_tables(S: int, J: int, a: float = 1.0):
    """The Polya urn's count vectors by level m = 0..J-1 (segments done): n_cv (J,), next (J, C, S), w (J, C, S)."""
    levels = [[tuple([0] * S)]]
    for _ in range(1, J):
        levels.append(sorted({tuple(c[:s] + (c[s] + 1,) + c[s + 1:]) for c in levels[-1] for s in range(S)}))
    C = max(len(lv) for lv in levels)
    n_cv = np.array([len(lv) for lv in levels], np.int64)
    nxt = np.zeros((J, C, S), np.int64)
    w = np.zeros((J, C, S))
    for m, lv in enumerate(levels):
        index = {c: i for i, c in enumerate(levels[m + 1])} if m + 1 < J else {}
        for ci, c in enumerate(lv):
            for s in range(S):
                w[m, ci, s] = (a + c[s]) / (S * a + m)
                if index:
                    nxt[m, ci, s] = index[c[:s] + (c[s] + 1,) + c[s + 1:]]
    return n_cv, nxt, w


def _kernel():
    from . import bayes_kernel  # lazy: numba (and scipy, ~1 s) only when the Bayes reference is computed

    return bayes_kernel


def _order(lay: _Layout, hyp_r: np.ndarray, Om: np.ndarray, reveal, gamma: float) -> np.ndarray:
    """(N, H) the hypotheses of each episode, likely ones first (bayes_kernel's stopping rule cuts more): by the
    emission-only bound on the episode's likelihood of their emission matrix, sum_t log max_a O[a, o_t]."""
    V = lay.V
    counts = np.stack([(lay.tok == v).sum(1) for v in range(V)], 1).astype(np.float64)  # (N, V)
    if reveal is not None:
        O = emission_matrix(np.asarray(reveal), V, gamma)
    else:
        O = np.asarray(Om, np.float64)
    with np.errstate(divide="ignore"):
        logmax = np.log(O.max(1))  # (R, V); -inf for a token no state emits (gamma = 1)
    bound = counts @ np.where(np.isfinite(logmax), logmax, -1e6).T  # (N, R): per emission matrix
    return np.argsort(-bound[:, hyp_r], axis=1, kind="stable").astype(np.int64)


def _run_block(lay: _Layout, Tm, Om, hyp_g, hyp_r, logw, start, urn, reveal=None, gamma=0.0):
    """One kernel call: (acc, wsum, mx) over the given hypotheses. reveal (R, S) and gamma: the family's revealing
    emissions (Om is not read)."""
    N, Tn = lay.tok.shape
    acc, wsum, mx = np.zeros((N, Tn, lay.V)), np.zeros((N, Tn)), np.full((N, Tn), -np.inf)
    rev = np.zeros((0, 1), np.int64) if reveal is None else np.ascontiguousarray(reveal, np.int64)
    n_cv, nxt, w = urn
    theta = float(np.log(max(len(hyp_g), 1) / _SKIP))
    threads = torch.get_num_threads()
    try:
        _kernel().bayes_block(lay.tok, lay.seg_lo, lay.seg_hi, lay.seg_kind, np.ascontiguousarray(Tm),
                              np.ascontiguousarray(Om, np.float64), rev, float(gamma),
                              np.ascontiguousarray(hyp_g, np.int64),
                              np.ascontiguousarray(hyp_r, np.int64), np.ascontiguousarray(logw, np.float64),
                              np.ascontiguousarray(start, np.float64), n_cv, nxt, w, int(lay.burn_in), theta,
                              _order(lay, np.asarray(hyp_r), Om, reveal, gamma), acc, wsum, mx)
    finally:  # numba's threading layer may reset the process's thread count, which is torch's too
        torch.set_num_threads(threads)
    if reveal is not None:
        acc += (1.0 - gamma) / lay.V * wsum[..., None]  # the constant part of every term's prediction
    return acc, wsum, mx


def _pred(blocks, lay: _Layout) -> np.ndarray:
    """The mixture over every block's terms: (N, T, V), NaN rows where no observation is."""
    mx = np.max(np.stack([b[2] for b in blocks]), 0)
    acc = np.zeros_like(blocks[0][0])
    ws = np.zeros_like(blocks[0][1])
    for a, w, m in blocks:
        with np.errstate(invalid="ignore"):
            f = np.where(np.isfinite(m), np.exp(m - mx), 0.0)
        acc += a * f[..., None]
        ws += w * f
    pred = np.divide(acc, ws[..., None], out=np.full_like(acc, np.nan), where=ws[..., None] > 0)
    pred[lay.tok < 0] = np.nan
    return pred


def _ce(pred: np.ndarray, lay: _Layout) -> np.ndarray:
    """Per-episode mean CE over the scored tokens (N,)."""
    if lay.score.dtype != bool:  # one scored position per episode
        y = lay.tok[np.arange(len(lay.score)), lay.score]
        with np.errstate(divide="ignore"):
            return -np.log(pred[np.arange(len(y)), lay.score, y])
    cols = np.flatnonzero(lay.score & (lay.tok >= 0).all(0))
    y = lay.tok[:, cols]
    p = np.take_along_axis(pred[:, cols], y[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        return (-np.log(p)).mean(1)


# ---------------------------------------------------------------- the family's hypotheses


def _draws(hmm: HMMConfig, N: int, block: int, seed: int):
    """BLOCK draws per episode of the continuous parts: noise rows (N, B, S, d) ~ Dir(1), Q (N, B, d, S)."""
    S, d = hmm.n_states, hmm.rank
    rng = seeds.rng(int(seed), _TAG, int(block) + 1)
    g = rng.standard_gamma(1.0, size=(N, BLOCK, S, d))
    noise = g / g.sum(-1, keepdims=True)
    cl = clusters(S, d)
    mask = cl[None, :] == np.arange(d)[:, None]  # (d, S)
    q = rng.standard_gamma(hmm.alpha, size=(N, BLOCK, d, S)) * mask
    zero = q.sum(-1) == 0  # alpha << 1 can underflow a row (as data/hmm.py's _dirichlet): one random state
    if zero.any():
        idx = np.argwhere(zero)
        for n_, b_, k_ in idx:
            q[n_, b_, k_, rng.choice(np.flatnonzero(mask[k_]))] = 1.0
    Q = q / q.sum(-1, keepdims=True)
    return noise, Q


def _transitions(hmm: HMMConfig, st: Structures, noise, Q) -> np.ndarray:
    """Tm (N, B * P, S, S): T = W Q for every episode, draw and cluster permutation (group b * P + p)."""
    S, d, rho = hmm.n_states, hmm.rank, hmm.rho
    cl = clusters(S, d)
    hard = np.eye(d)[st.sigma[:, cl]]  # (P, S, d): state s moves to sigma(cluster(s))
    W = rho * noise[:, :, None] + (1 - rho) * hard[None, None]  # (N, B, P, S, d)
    T = W @ Q[:, :, None]  # (N, B, P, S, S)
    N, B, P = T.shape[:3]
    return T.reshape(N, B * P, S, S)


def _has_draws(hmm: HMMConfig) -> bool:
    sizes = np.bincount(clusters(hmm.n_states, hmm.rank), minlength=hmm.rank)
    return hmm.rho > 0 or bool((sizes > 1).any())


@functools.lru_cache(maxsize=8)
def _family_tables(hmm: HMMConfig, stream: str):
    return sticky_structures(hmm, stream)


def _hypotheses(st: Structures, n_draw: int):
    """(hyp_g, hyp_r, logw) over draws b = 0..n_draw-1 and the orbits; groups b * P + sigma."""
    P = len(st.sigma)
    b = np.repeat(np.arange(n_draw), st.n_orbits)
    g = b * P + np.tile(st.pair_sigma, n_draw)
    r = np.tile(st.pair_reveal, n_draw)
    w = np.tile(st.log_mult - np.log(st.n_structures), n_draw)
    order = np.lexsort((r, g))  # one transition table at a time
    return g[order], r[order], w[order]


_MEMO: dict = {}


def bayes_oracle(hmm: HMMConfig, ep, *, tol: float = TOL, seed: int = 0, stream: str = "unseen", score=None,
                 k_start: int = K_START, k_max: int = K_MAX, cache: bool = True) -> BayesPrediction:
    """The Bayes-optimal predictor for tasks of hmm's family on episodes ep (module docstring).

    seed: the Monte Carlo draws' stream (with data.seed the reference is a function of the data's seed); stream: the
    task stream the episodes' tasks come from (only hmm.structures half / half-heldout reads it); score: (T,) bool,
    the tokens whose mean CE decides convergence (default Figure 1's: the test segment, positions >= 1). Raises
    ValueError where `why_not` gives a reason. Results are kept per process (the same episodes and settings are
    scored once: every k of Figure 1, headroom, the emergence references), and on disk in this user's private cache
    folder `$XDG_CACHE_HOME/hmmscope/bayes` (signed entries: the trials of a sweep cell score the same episodes in
    other processes); cache=False computes afresh and keeps nothing (`hmmscope bench bayes`).
    """
    reason = why_not(hmm)
    if reason:
        raise ValueError(f"no exact Bayes reference: {reason}")
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a positive number, got {tol}")
    if not 1 <= k_start <= k_max:
        raise ValueError(f"need 1 <= k_start <= k_max, got {k_start}, {k_max}")
    lay = _layout(ep, score)
    key = (_VERSION, code_hash(), BLOCK, _TAG, _SKIP, config_hash(dataclasses.replace(hmm, n_tasks=1, seed=0)),
           hashlib.sha256(lay.tok.tobytes()).hexdigest(), lay.tok.shape, tuple(lay.seg_lo.tolist()), tuple(lay.seg_kind.tolist()),
           lay.burn_in, hashlib.sha256(lay.score.tobytes()).hexdigest(), float(tol), int(seed), stream, int(k_start),
           int(k_max))
    if cache and key in _MEMO:
        return _MEMO[key]
    kept = _from_disk(key) if cache else None
    if kept is not None:
        _MEMO[key] = kept
        return kept
    st = _family_tables(dataclasses.replace(hmm, n_tasks=1, seed=0), stream)
    Om = np.zeros((1, 1, 1))  # revealing emissions: the kernel reads st.reveal and gamma
    fam = {"reveal": st.reveal, "gamma": float(hmm.gamma)}
    urn = _urn_tables(hmm.n_states, len(lay.seg_lo))
    N = lay.tok.shape[0]
    start = np.zeros((1, hmm.n_states))
    what = (f"exact over {st.n_orbits} orbits of {st.n_structures} structures (cluster permutation x revealing map), "
            f"mu ~ Dir(1) integrated exactly (Polya urn over the segments' starts)")
    if not _has_draws(hmm):  # nothing continuous beside mu: one pass, exact
        T = _transitions(hmm, st, np.zeros((N, 1, hmm.n_states, hmm.rank)), np.tile(
            np.eye(hmm.rank, hmm.n_states)[None, None], (N, 1, 1, 1)))  # d = S: Q = I
        g, r, w = _hypotheses(st, 1)
        block = _run_block(lay, T, Om, g, r, w, start, urn, **fam)
        pred = _pred([block], lay)
        ce = float(_ce(pred, lay).mean())
        out = BayesPrediction(torch.as_tensor(pred), ce, 0.0, 0, True, ((0, ce),), what)
        return _keep(key, out) if cache else out
    blocks, history = [], []
    target = max(BLOCK, (int(k_start) + BLOCK - 1) // BLOCK * BLOCK)
    g, r, w = _hypotheses(st, BLOCK)
    while True:
        while len(blocks) * BLOCK < target:
            noise, Q = _draws(hmm, N, len(blocks), seed)
            blocks.append(_run_block(lay, _transitions(hmm, st, noise, Q), Om, g, r, w, start, urn, **fam))
        pred = _pred(blocks, lay)
        ce = float(_ce(pred, lay).mean())
        history.append((len(blocks) * BLOCK, ce))
        se = _jackknife(blocks, lay)
        converged = len(history) >= 2 and abs(history[-1][1] - history[-2][1]) < tol and 2 * se < tol
        if converged or target >= k_max:
            break
        target = min(2 * target, int(k_max))
    nb = len(blocks)
    noise_what = "transition noise rho Dir(1)" + (", Q rows Dir(alpha)" if hmm.rank < hmm.n_states else "")
    method = (f"{what}; {noise_what} by Monte Carlo, K = {nb * BLOCK} draws per episode shared by the structures "
              f"(K doubled until the CE moved < {tol:g} nats/token and twice its Monte Carlo se was < {tol:g}: "
              + ", ".join(f"K={k}: {c:.4f}" for k, c in history)
              + ("" if converged else "; NOT converged") + ")")
    out = BayesPrediction(torch.as_tensor(pred), ce, se, nb * BLOCK, converged, tuple(history), method)
    return _keep(key, out) if cache else out


def _jackknife(blocks: list, lay: _Layout) -> float:
    """The Monte Carlo standard error of the mean CE: the jackknife over the draw blocks (NaN with one block)."""
    nb = len(blocks)
    if nb < 2:
        return float("nan")
    loo = np.array([_ce(_pred(blocks[:b] + blocks[b + 1:], lay), lay).mean() for b in range(nb)])
    return float(np.sqrt((nb - 1) / nb * ((loo - loo.mean()) ** 2).sum()))


def _from_disk(key: tuple) -> BayesPrediction | None:
    """A result another process kept on disk under the same key (bayes_cache), or None."""
    kept = disk_get(key)
    if kept is None:
        return None
    pred, m = kept
    return BayesPrediction(torch.as_tensor(pred), m["ce"], m["mc_se"], m["n_draws"], m["converged"],
                           tuple(tuple(h) for h in m["history"]), m["method"])


def _keep(key: tuple, out: BayesPrediction) -> BayesPrediction:
    _MEMO[key] = out
    disk_put(key, out.pred.numpy(), {"ce": out.ce, "mc_se": out.mc_se, "n_draws": out.n_draws,
                                     "converged": out.converged, "history": [list(h) for h in out.history],
                                     "method": out.method})
    return out


def discrete_bayes(mix: Mixture, ep, score=None) -> torch.Tensor:
    """The same kernel with a discrete prior: mix's tasks, each with its own mu (the mixture oracle over mix;
    float64, (N, T, V), NaN rows at non-observation tokens)."""
    lay = _layout(ep, score)
    Tm = (np.asarray(mix.W, np.float64) @ np.asarray(mix.Q, np.float64))[None]  # (1, n, S, S)
    Om = np.asarray(mix.emission, np.float64)
    n = mix.n_tasks
    with np.errstate(divide="ignore"):
        logw = np.log(np.asarray(mix.prior, np.float64))
    empty = (np.zeros(0, np.int64), np.zeros((0, 1, 1), np.int64), np.zeros((0, 1, 1)))
    block = _run_block(lay, Tm, Om, np.arange(n), np.arange(n), logw, np.asarray(mix.initial, np.float64), empty)
    return torch.as_tensor(_pred([block], lay))


def windowed_bayes(hmm: HMMConfig, ep, R: int, cols=None, *, tol: float = TOL, seed: int = 0, stream: str = "unseen",
                   k_start: int = K_START, k_max: int = K_MAX) -> tuple[np.ndarray, BayesPrediction]:
    """Bayes given only the R positions before each scored position (module docstring): the prediction at position
    t from the episode with every observation before t - R hidden (the chain runs through it, nothing is seen),
    so the state at the window's start is drawn from its marginal under the prior there, and the Polya urn couples
    the segments the window spans. cols: the scored positions (default Figure 1's, the test tokens at positions >=
    1). Returns (pred (N, P, V) float64 at cols, the BayesPrediction of the N x P windows, whose ce is the windowed
    CE over cols and whose convergence decides K)."""
    if R < 1:
        raise ValueError(f"R must be >= 1, got {R}")
    seg = np.asarray(ep.segment)
    T = len(seg)
    cols = np.flatnonzero((seg == ep.n_demos) & (np.arange(T) >= 1)) if cols is None else np.asarray(cols, np.int64)
    if not len(cols):
        raise ValueError("no scored positions")
    tok = np.asarray(ep.tokens).astype(np.int64)
    N, P = tok.shape[0], len(cols)
    obs = seg >= 0
    win = np.repeat(tok[:, None, :], P, 1)  # (N, P, T): window q scores position cols[q]
    pos = np.arange(T)
    for q, t in enumerate(cols):
        win[:, q, obs & (pos < t - R)] = -2  # before the window: hidden steps
        win[:, q, pos > t] = -1  # after the scored token: not read
    sub = _Windows(win.reshape(N * P, T), ep, np.tile(cols, N))
    res = bayes_oracle(hmm, sub, tol=tol, seed=seed, stream=stream, score=np.tile(cols, N), k_start=k_start,
                       k_max=k_max)
    pred = res.pred.numpy().reshape(N, P, T, -1)[:, np.arange(P), cols]
    return pred, res


class _Windows:
    """Windows of an episode batch in the shape `_layout` reads (tokens -2: hidden steps; -1: not read)."""

    def __init__(self, tokens: np.ndarray, ep, score_pos: np.ndarray):
        self.tokens = tokens
        self.n_tokens = int(ep.n_tokens)
        self.n_demos = int(ep.n_demos)
        self.segment = np.asarray(ep.segment)
        self.meta = dict(getattr(ep, "meta", None) or {})
