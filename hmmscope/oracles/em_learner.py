"""The EM-fitted HMM learner (SCIENCE.md 8): an in-context learner that knows the family's form but none of its
tasks; one of the baselines of Figure 1 (re-exported by baselines.py, which owns the module convention: predictions
``pred[i, t, v] = p(token_t = v | episode tokens < t)``, (N, T, V) float64, NaN rows where no prediction is made).

EM-fitted HMM (``incontext_hmm``; ``HMMLearner`` holds its settings). A learner that knows the family's form
(a hidden Markov chain emitting tokens) but none of its tasks: per episode, a categorical HMM with
``n_states`` hidden states (default 8; ``HMMLearner.for_family(S)`` gives min(S, EM_STATES_CAP = 8)) is fit by
Baum-Welch (EM) to the episode's demonstrations alone, each demo a separate sequence started from the fitted
initial distribution; ``restarts`` random initializations (Dirichlet(1) rows for start, transition and
emission), ``iters`` EM iterations each (fixed, no early stop, so every episode and restart costs the same);
the restart with the highest final log-likelihood of the demonstrations is kept. The M-step is MAP with a
symmetric Dirichlet(1 + ``pseudocount``) prior on every row (hmmlearn's ``*_prior = 1 + pseudocount``):
expected counts + pseudocount, normalized. The pseudocount keeps every emission probability positive, so a
test token that never occurs in the demonstrations has finite CE. The test segment is then filtered with
hmmscope's own scaled forward filter (filtering.filter_factored with T = A, Q = I), from the fitted initial
distribution, or from pi A^B for a "midstream" test after B burn-in steps (as the oracles do with the true
parameters). With k = 0 there is nothing to fit: it predicts the uniform distribution 1/V at every test token
(CE = log V; its accuracy is then argmax's tie-break, token 0).
Seeding: the restarts of the fit of (episode, k) come from SeedSequence([seed, _EM_TAG, k, l_demo, a 128-bit
sha256 of the k demonstrations it is fit to]): a fit depends on the learner and its own sequences only, so
fitting one k, a subset of the episodes, or episodes already truncated gives the same bits as Figure 1's
batch (the per-token reductions are also written so that their order does not depend on the batch).
All episodes, every k and every restart are fit together: one batched scaled forward-backward over the
demonstration sequences (rows) per iteration, tensors (rows, n_states), float64, no loop over episodes.
Cost: it grows as n_states^2 (config.EM_STATES_CAP bounds the default); `hmmscope bench headroom --em` times it
within a headroom.

This module imports torch, numpy and hmmscope's inference (the filter); never the model, training or tracking.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..config import EM_STATES_CAP
from ..data import seeds
from ..data.episodes import episode_arrays
from .filtering import filter_factored

__all__ = ["HMMLearner", "DEFAULT_LEARNER", "EMFit", "fit_hmm_em", "incontext_hmm", "EM_CHUNK_BYTES", "EM_STATES_CAP"]

_EM_TAG = 0x454D484D  # "EMHM": the EM learner's initializations
EM_CHUNK_BYTES = 256 << 20  # working set of one chunk of EM fits


# ---------------------------------------------------------------- the EM-fitted HMM


@dataclass(frozen=True)
class HMMLearner:
    """Settings of the in-context HMM learner (module docstring); recorded in Figure 1's meta."""

    n_states: int = 8
    restarts: int = 4
    iters: int = 30
    pseudocount: float = 0.3
    seed: int = 0

    def __post_init__(self):
        if self.n_states < 1 or self.restarts < 1 or self.iters < 0 or not self.pseudocount >= 0:
            raise ValueError(f"HMMLearner needs n_states >= 1, restarts >= 1, iters >= 0, pseudocount >= 0; got {self}")

    @classmethod
    def for_family(cls, n_states: int, cap: int = EM_STATES_CAP, **settings) -> HMMLearner:
        """The learner for a family of n_states hidden states: min(n_states, cap) states (cap 16 by default:
        the EM's cost grows as states^2 per token and restart, so the paper's S = 128 would cost 64x a
        16-state fit), the other settings as given (restarts, iters, pseudocount, seed) or the defaults."""
        if n_states < 1 or cap < 1:
            raise ValueError(f"HMMLearner.for_family needs n_states >= 1 and cap >= 1, got {n_states}, {cap}")
        return cls(n_states=min(int(n_states), int(cap)), **settings)

    def describe(self) -> dict:
        return asdict(self)


DEFAULT_LEARNER = HMMLearner()


@dataclass
class EMFit:
    """Baum-Welch fits of G HMMs (the best restart of each): initial (G, H), transition (G, H, H), emission
    (G, H, V); loglik (G,) the log-likelihood of the group's sequences under the returned parameters; history
    (iters + 1, G, R) the log-likelihood of every restart before each M-step and after the last one; best (G,)
    the restart kept."""

    initial: torch.Tensor
    transition: torch.Tensor
    emission: torch.Tensor
    loglik: torch.Tensor
    history: torch.Tensor
    best: torch.Tensor


def _group_keys(tok: torch.Tensor, ends: list[int]) -> list[list[int]]:
    """Per group (rows sorted by group, group g = rows ends[g-1]:ends[g]): [rows, L, 128-bit sha256 of its
    tokens (int64, in row order)]: what identifies the data a fit sees, and nothing else."""
    a = np.ascontiguousarray(tok.numpy().astype(np.int64))
    out, lo = [], 0
    for hi in ends:
        out.append([hi - lo, a.shape[1], int.from_bytes(hashlib.sha256(a[lo:hi].tobytes()).digest()[:16], "little")])
        lo = hi
    return out


def _init_params(keys, R: int, H: int, V: int, seed: int, dtype) -> tuple[torch.Tensor, ...]:
    """Dirichlet(1) rows for R restarts of each group: start (G, R, H), transition (G, R, H, H), emission
    (G, R, H, V); group g's from its own stream SeedSequence([seed, _EM_TAG, *keys[g]])."""
    out = [np.empty((len(keys), R) + s) for s in ((H,), (H, H), (H, V))]
    for g, key in enumerate(keys):
        rng = seeds.rng(int(seed), _EM_TAG, *(int(x) for x in key))
        for o in out:
            o[g] = rng.standard_exponential(o.shape[1:])
    return tuple(torch.as_tensor(o / o.sum(-1, keepdims=True), dtype=dtype) for o in out)


def _forward(pi, A, E):
    """Scaled forward pass, state-major. pi (H, n), A (H, H, n) (A[i, j, r] = p(j | i) of row r's fit), E (L, H, n)
    emission probabilities of the observed tokens. Returns alpha (L, H, n) (column t: the filtered state
    distribution of each row) and the scales c (L, n) = p(o_t | o_<t). The (H x H) matrix-vector product per row
    is H fused multiply-adds over (H, n) blocks: much faster on the CPU than a batched matmul of tiny matrices."""
    L, H, n = E.shape
    alpha = torch.empty_like(E)
    c = torch.empty((L, n), dtype=E.dtype)
    tiny = torch.finfo(E.dtype).tiny
    for t in range(L):
        a = alpha[t]  # (H, n), filled in place
        if t == 0:
            torch.mul(pi, E[0], out=a)
        else:
            prev = alpha[t - 1]
            torch.mul(prev[0], A[0], out=a)  # sum_i alpha_{t-1}[i] A[i, :]
            for i in range(1, H):
                a.addcmul_(prev[i], A[i])
            a.mul_(E[t])
        # p(o_t | o_<t), state by state: the same bits whatever the number of rows n (torch.sum over dim 0 of a
        # narrow (H, n) block may change its summation order with n, and a fit must not depend on its batch)
        s = c[t]
        s.copy_(a[0])
        for i in range(1, H):
            s.add_(a[i])
        a.div_(s.clamp_min_(tiny))
    return alpha, c


def _backward(A, E, c, alpha):
    """Scaled backward pass (same scales as _forward), state-major: beta (L, H, n), with alpha * beta the state
    posteriors, and xi (H, H, n) = sum_t p(s_t = i, s_{t+1} = j | the row's tokens), accumulated on the way."""
    L, H, n = E.shape
    beta = torch.empty_like(E)
    beta[L - 1] = 1.0
    xi = torch.zeros((H, H, n), dtype=E.dtype)
    for t in range(L - 2, -1, -1):
        u = E[t + 1] * beta[t + 1] / c[t + 1]  # (H, n)
        xi.addcmul_(alpha[t][:, None, :], u[None, :, :])  # alpha_t[i] u[j]; times A[i, j] after the loop
        b = torch.mul(A[:, 0], u[0], out=beta[t])  # (H, n): sum_j A[:, j] u[j]
        for j in range(1, H):
            b.addcmul_(A[:, j], u[j])
    return beta, xi.mul_(A)


def _normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows of x (last axis) scaled to sum 1; an all-zero row stays zero (hmmlearn's normalize)."""
    s = x.sum(-1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def fit_hmm_em(seqs, group, n_groups: int, n_tokens: int, learner: HMMLearner = HMMLearner(), *,
               init: tuple | None = None, group_keys=None, dtype=torch.float64, max_bytes: int = EM_CHUNK_BYTES) -> EMFit:
    """Baum-Welch for n_groups categorical HMMs at once, each fit to its own set of sequences.

    seqs (rows, L) int in [0, n_tokens): independent sequences of one length, each started from the group's
    initial distribution; group (rows,) int in [0, n_groups): the HMM each row belongs to (every group needs
    at least one row). learner: n_states, restarts, iters, pseudocount, seed (module docstring). init: optional
    (start (G, R, H), transition (G, R, H, H), emission (G, R, H, V)) instead of the seeded random ones (tests
    compare with hmmlearn from one initialization). Each EM iteration is one batched scaled forward-backward
    over all rows x restarts and one M-step; rows of a group are pooled by index_add (deterministic on CPU).

    Seeding: each group's restarts are drawn from a stream of its own, SeedSequence([learner.seed, _EM_TAG,
    *key]), with key = group_keys[g] (a sequence of non-negative ints) or by default [its number of rows, L,
    a 128-bit sha256 of its tokens in row order]: a group's fit depends on the learner and its own sequences
    only, never on which other groups share the call, their order, or the chunking. Groups are fit in chunks
    whose working set stays under max_bytes.
    """
    H, R, V, G = learner.n_states, learner.restarts, int(n_tokens), int(n_groups)
    tok = torch.as_tensor(np.asarray(seqs) if not isinstance(seqs, torch.Tensor) else seqs).long()
    grp = torch.as_tensor(np.asarray(group) if not isinstance(group, torch.Tensor) else group).long()
    if tok.dim() != 2 or grp.shape != (tok.shape[0],):
        raise ValueError(f"seqs must be (rows, L) and group (rows,), got {tuple(tok.shape)} and {tuple(grp.shape)}")
    if tok.numel() and (tok.min() < 0 or tok.max() >= V):
        raise ValueError(f"tokens must lie in [0, {V})")
    if G < 1 or not grp.numel() or grp.min() < 0 or grp.max() >= G or torch.bincount(grp, minlength=G).min() < 1:
        raise ValueError(f"every group in [0, {G}) needs at least one sequence")
    if group_keys is not None and len(group_keys) != G:
        raise ValueError(f"group_keys needs one key per group ({G}), got {len(group_keys)}")
    order = torch.argsort(grp, stable=True)  # rows grouped, each group's rows in their given order
    tok, grp = tok[order], grp[order]
    ends = torch.cumsum(torch.bincount(grp, minlength=G), 0).tolist()  # rows of groups < g + 1
    if init is None:
        keys = _group_keys(tok, ends) if group_keys is None else [list(np.atleast_1d(k)) for k in group_keys]
        init = _init_params(keys, R, H, V, learner.seed, dtype)
    else:
        init = tuple(torch.as_tensor(np.asarray(x), dtype=dtype) for x in init)
    per_row = 8 * R * tok.shape[1] * H * 8  # ~8 (L, H) float64 arrays per row and restart at the peak
    parts, g0 = [], 0
    while g0 < G:
        first = ends[g0 - 1] if g0 else 0
        g1 = g0 + 1
        while g1 < G and (ends[g1] - first) * per_row <= max_bytes:
            g1 += 1
        rows = slice(first, ends[g1 - 1])
        parts.append(_fit_chunk(tok[rows], grp[rows] - g0, g1 - g0, V, learner, tuple(x[g0:g1] for x in init), dtype))
        g0 = g1
    return EMFit(*(torch.cat(t, dim=1 if i == 4 else 0) for i, t in enumerate(zip(*(
        (f.initial, f.transition, f.emission, f.loglik, f.history, f.best) for f in parts)))))


def _fit_chunk(tok, grp, G: int, V: int, learner: HMMLearner, init: tuple, dtype) -> EMFit:
    """fit_hmm_em on one chunk of groups (rows sorted by group, init (G, R, ...))."""
    H, R = learner.n_states, learner.restarts
    rows, L = tok.shape
    F = G * R  # fits: group g, restart r -> g R + r
    pi, A, B = (x.reshape(F, *x.shape[2:]).clone() for x in init)
    fit = (grp[:, None] * R + torch.arange(R)).reshape(-1)  # (n,) the fit of each (row, restart): n = row R + r
    x = tok.repeat_interleave(R, 0)  # (n, L)
    n = x.shape[0]
    key = (fit[None, :] * V + x.T).reshape(-1)  # (L n,): column (fit, o_t) of an (H, F V) emission table, time-major
    idx = x.T.reshape(L, 1, n).expand(L, H, n)  # o_t of each row, per state
    pc = float(learner.pseudocount)
    history = torch.empty((learner.iters + 1, F), dtype=dtype)

    def pool(a: torch.Tensor) -> torch.Tensor:
        """(..., n) per (row, restart) -> (F, ...) summed over each group's rows (rows are sorted by group)."""
        lead = a.shape[:-1]
        a = a.reshape(-1, rows, R).permute(1, 2, 0).reshape(rows, -1)  # (rows, R * prod(lead))
        out = torch.zeros((G, a.shape[1]), dtype=dtype).index_add_(0, grp, a)
        return out.view(F, *lead)

    def estep(pi, A, B, stats: bool):
        # state-major per-row parameters, rows last: every per-step operand is an (H, n) block
        Ar = A.permute(1, 2, 0).contiguous().index_select(2, fit)  # (H, H, n)
        E = B.permute(1, 0, 2).reshape(H, F * V).index_select(1, key).view(H, L, n).transpose(0, 1)  # (L, H, n)
        alpha, c = _forward(pi.T.index_select(1, fit), Ar, E)  # E[t, s, r] = O[s, o_t] of row r's fit
        lc = torch.log(c)
        ll = lc[0].clone()
        for t in range(1, L):  # in time order, as the scales above: the same bits whatever the batch
            ll += lc[t]
        ll = pool(ll)
        if not stats:
            return ll, None
        beta, xi = _backward(Ar, E, c, alpha)
        post = alpha.mul_(beta)  # (L, H, n): p(s_t | the row's tokens) (alpha is not needed any more)
        obs = torch.zeros((V, H, n), dtype=dtype).scatter_add_(0, idx, post)  # sum_t post 1[o_t = v]
        return ll, (pool(post[0]), pool(xi), pool(obs).transpose(1, 2))

    for it in range(learner.iters):
        ll, (s0, sA, sB) = estep(pi, A, B, True)
        history[it] = ll
        pi, A, B = _normalize(s0 + pc), _normalize(sA + pc), _normalize(sB + pc)
    history[-1], _ = estep(pi, A, B, False)
    final = history[-1].view(G, R)
    best = final.argmax(1)  # the first restart among equals
    pick = torch.arange(G) * R + best
    return EMFit(pi[pick], A[pick], B[pick], final[torch.arange(G), best], history.view(-1, G, R), best)


def _demo_rows(tok: np.ndarray, seg: np.ndarray, n_demos: int, l_demo: int, ks: list[int]):
    """Rows for the fits of every (k, episode), k >= 1: the LAST k demos of each episode (episodes.truncate_demos'
    convention). Returns seqs (rows, l_demo), group (rows,) with group = index of k in ks * N + episode."""
    N = tok.shape[0]
    demos = np.stack([tok[:, seg == j] for j in range(n_demos)], 1)  # (N, n_demos, l_demo)
    seqs, group = [], []
    for gi, k in enumerate(ks):
        seqs.append(demos[:, n_demos - k:].reshape(N * k, l_demo))
        group.append(np.repeat(gi * N + np.arange(N), k))
    return np.concatenate(seqs), np.concatenate(group)


def incontext_hmm(ep, ks=None, learner: HMMLearner = HMMLearner(), *, return_fit: bool = False):
    """The EM-fitted HMM learner's predictions for each k in ks (default 0..n_demos), from ep's last k demos.

    Returns {k: pred (N, T_k, V) float64} with T_k the length of episodes.truncate_demos(ep, k): the test
    segment (its last l_test positions) carries the learner's filter predictions, every other row is NaN
    (the learner predicts the test only). k = 0: uniform 1/V (nothing to fit). With return_fit, also the
    EMFit of the k >= 1 fits (group = position of k among the k >= 1 values * N + episode).
    """
    tok, seg, V = episode_arrays(ep)
    N, n_demos, l_demo, l_test = tok.shape[0], int(ep.n_demos), int(ep.l_demo), int(ep.l_test)
    ks = sorted(range(n_demos + 1) if ks is None else {int(k) for k in ks})
    if any(not 0 <= k <= n_demos for k in ks):
        raise ValueError(f"k must be in [0, n_demos={n_demos}], got {ks}")
    fit_ks = [k for k in ks if k >= 1]
    test = tok[:, seg == n_demos]  # (N, l_test): the same test tokens at every k
    out = {}
    fit = None
    if fit_ks:
        seqs, group = _demo_rows(tok, seg, n_demos, l_demo, fit_ks)
        fit = fit_hmm_em(seqs, group, len(fit_ks) * N, V, learner)
        H = learner.n_states
        start = None
        meta = getattr(ep, "meta", None) or {}
        burn_in = int(meta.get("burn_in", 0)) if meta.get("test_start", "initial") == "midstream" else 0
        if burn_in > 0:
            start = (fit.initial[:, None, :] @ torch.linalg.matrix_power(fit.transition, burn_in))[:, 0]
        eye = torch.eye(H, dtype=torch.float64)
        pred = filter_factored(fit.initial, fit.transition, eye, fit.emission, np.tile(test, (len(fit_ks), 1)),
                               start=start, dtype=torch.float64).pred  # (len(fit_ks) N, l_test, V)
        pred = pred.view(len(fit_ks), N, l_test, V)
    for k in ks:
        T_k = k * (l_demo + 1) + l_test
        p = torch.full((N, T_k, V), float("nan"), dtype=torch.float64)
        p[:, T_k - l_test:] = 1.0 / V if k == 0 else pred[fit_ks.index(k)]
        out[k] = p
    return (out, fit) if return_fit else out
