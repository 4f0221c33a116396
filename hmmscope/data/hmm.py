"""HMMs and mixtures of low-rank HMMs (SCIENCE.md 1), and their sequence sampler.

An HMM is (mu, T, O). A mixture stores each task's transition as factors
T = W @ Q (W: S x d, Q: d x S, both row-stochastic), never the dense S x S matrix,
so 8192 tasks x 128 states fit in memory. A dense single HMM is the special case
W = T, Q = I. This is the bottom of the data layers: episodes.py (in-context
episodes) builds on it, and this module imports nothing from it.

Sampling. Every categorical draw is an inverse-CDF lookup: each stochastic row
is stored once per mixture as a float32 cumulative table padded to a
power-of-two width K2, and the draw for a uniform u is the number of entries
<= u, found by a branchless binary search (log2 K2 vectorized gathers). A
transition uses the factors T = W Q: z ~ W[task, s] (d-way), then
s' ~ Q[task, z] (S-way); no dense S x S matrix is formed. Sequences are
processed sorted by task (cache-friendly gathers) in fixed chunks; the only
Python loop is over time steps. Output is a deterministic function of the
numpy Generator state (single-threaded numpy).

Mixing. `mixing_rate(T)` = -log|lambda_2(T)|, the chain's own asymptotic forgetting
rate per step (lambda_2: the eigenvalue of second-largest modulus). With T = W Q the
nonzero eigenvalues of T are those of the d x d matrix Q W, so it costs O(d^3). The
one-step Dobrushin coefficient is also given; for sticky chains it is ~1 and says
little about forgetting over many steps.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..config import HMMConfig, config_hash
from . import seeds

_ATOL = 1e-6
_CHUNK = 1 << 15  # sequences per chunk (fixed: the random stream depends on it)


def _check_stochastic(name: str, a: np.ndarray, ndim: int) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite entries")
    if np.any(a < 0):
        raise ValueError(f"{name} has negative entries")
    sums = a.sum(-1)
    if not np.allclose(sums, 1.0, atol=_ATOL):
        bad = np.abs(sums - 1.0).max()
        raise ValueError(f"{name} rows must sum to 1 (max deviation {bad:.3g})")
    return a


class HMM:
    """One HMM: initial (S,), transition (S, S), emission (S, V); rows sum to 1.

    `factors=(W, Q)` optionally gives a low-rank factorization T = W @ Q that
    samplers and filters use for speed.
    """

    def __init__(self, initial, transition, emission, *, factors=None):
        self.initial = _check_stochastic("initial", initial, 1)
        self.transition = _check_stochastic("transition", transition, 2)
        self.emission = _check_stochastic("emission", emission, 2)
        S = self.initial.shape[0]
        if self.transition.shape != (S, S):
            raise ValueError(f"transition must be ({S}, {S}) to match initial, got {self.transition.shape}")
        if self.emission.shape[0] != S:
            raise ValueError(f"emission must have {S} rows to match initial, got {self.emission.shape}")
        if factors is None:
            W, Q = self.transition, np.eye(S)
        else:
            W = _check_stochastic("factor W", factors[0], 2)
            Q = _check_stochastic("factor Q", factors[1], 2)
            if W.shape[0] != S or Q.shape != (W.shape[1], S) or not np.allclose(W @ Q, self.transition, atol=1e-8):
                raise ValueError("factors (W, Q) must satisfy W @ Q == transition")
        self.W, self.Q = W, Q

    @property
    def n_states(self) -> int:
        return self.initial.shape[0]

    @property
    def n_tokens(self) -> int:
        return self.emission.shape[1]

    @property
    def rank(self) -> int:
        return self.W.shape[1]

    @cached_property
    def stationary(self) -> np.ndarray:
        """Stationary distribution of the transition (the left eigenvector for 1, averaged if periodic)."""
        return stationary_distribution(self.transition)

    def dobrushin(self) -> float:
        """Dobrushin coefficient: max over state pairs of TV between their transition rows."""
        return dobrushin(self.transition)

    def mixing_rate(self) -> float:
        """-log|lambda_2(T)|: the chain's own forgetting rate per step (inf when |lambda_2| = 0)."""
        return mixing_rate(self.W, self.Q)

    def as_mixture(self) -> Mixture:
        return Mixture(self.initial[None], self.W[None], self.Q[None], self.emission[None], np.ones(1))

    def sample(self, n: int, length: int, seed: int = 0, *, start: np.ndarray | None = None):
        """(tokens, states), int arrays (n, length); vectorized over the n sequences."""
        mix = self.as_mixture()
        rng = np.random.default_rng(seed)
        return sample_sequences(mix, np.zeros(n, dtype=np.int64), length, rng,
                                start=None if start is None else np.broadcast_to(start, (n, self.n_states)))


@dataclass(frozen=True, eq=False)
class Mixture:
    """n tasks stored as factors: initial (n,S), W (n,S,d), Q (n,d,S), emission (n,S,V), prior (n,)."""

    initial: np.ndarray
    W: np.ndarray
    Q: np.ndarray
    emission: np.ndarray
    prior: np.ndarray
    config_hash: str = ""

    @property
    def n_tasks(self) -> int:
        return self.initial.shape[0]

    @property
    def n_states(self) -> int:
        return self.initial.shape[1]

    @property
    def n_tokens(self) -> int:
        return self.emission.shape[2]

    @property
    def rank(self) -> int:
        return self.W.shape[2]

    def transition(self, i: int) -> np.ndarray:
        return self.W[i].astype(np.float64) @ self.Q[i].astype(np.float64)

    def task(self, i: int) -> HMM:
        W, Q = self.W[i].astype(np.float64), self.Q[i].astype(np.float64)
        return HMM(self.initial[i], W @ Q, self.emission[i], factors=(W, Q))

    def subset(self, idx) -> Mixture:
        idx = np.asarray(idx)
        p = self.prior[idx]
        return Mixture(self.initial[idx], self.W[idx], self.Q[idx], self.emission[idx], p / p.sum(), self.config_hash)


# ---------------------------------------------------------------- families


def _dirichlet(rng: np.random.Generator, alpha: float, shape: tuple[int, ...]) -> np.ndarray:
    """Dirichlet samples along the last axis, vectorized (normalized gammas)."""
    g = rng.standard_gamma(alpha, size=shape)
    s = g.sum(-1, keepdims=True)
    # alpha << 1 can underflow every gamma of a row; put its mass on one random coordinate
    zero = s[..., 0] == 0
    if np.any(zero):
        g[zero] = np.eye(shape[-1])[rng.integers(shape[-1], size=int(zero.sum()))]
        s = g.sum(-1, keepdims=True)
    return g / s


def _dirichlet_factors(rng, n, S, d, alpha):
    W = _dirichlet(rng, alpha, (n, S, d))
    Q = _dirichlet(rng, alpha, (n, d, S))
    return W, Q


def _sticky_factors(rng, n, S, d, alpha, rho):
    """States split into d clusters; Q row k lives on cluster k; cluster j moves to sigma(j) w.p. 1 - rho."""
    cluster = np.arange(S) * d // S  # (S,) balanced contiguous clusters
    mask = cluster[None, :] == np.arange(d)[:, None]  # (d, S)
    Q = _dirichlet(rng, alpha, (n, d, S)) * mask
    Q = np.where(mask.any(1, keepdims=True), Q, 1.0 / S)  # only when d > S, which validation forbids
    Q /= Q.sum(-1, keepdims=True)
    sigma = np.argsort(rng.random((n, d)), axis=1)  # (n, d) random permutation per task
    W = rho * _dirichlet(rng, 1.0, (n, S, d))
    target = np.take_along_axis(sigma, np.broadcast_to(cluster, (n, S)), axis=1)  # (n, S)
    np.put_along_axis(W, target[..., None], np.take_along_axis(W, target[..., None], 2) + (1 - rho), axis=2)
    return W, Q


def revealing_map(rng: np.random.Generator, n: int, S: int, V: int, half: int | None = None) -> np.ndarray:
    """Token index (n, S) each state reveals: injective if S <= V, else each token shared by ~S/V states. half (0 or
    1, S <= V only): every row from that half of the V! / (V - S)! injective maps (`structure_half`), rows of the
    other half redrawn from rng until none is left."""
    if S <= V:
        out = np.argsort(rng.random((n, V)), axis=1)[:, :S]
        while half is not None and (bad := structure_half(out, V) != half).any():
            out[bad] = np.argsort(rng.random((int(bad.sum()), V)), axis=1)[:, :S]
        return out
    base = np.arange(S) % V
    return np.take_along_axis(np.broadcast_to(base, (n, S)), np.argsort(rng.random((n, S)), axis=1), axis=1)


def structure_half(reveal: np.ndarray, V: int) -> np.ndarray:
    """Which half (0 or 1) each revealing map (rows of (n, S) token indices) lies in: a bit of a multiplicative hash
    of the map's code sum_s reveal[s] V^s, so the halves split the maps about evenly and neither is a simple rule."""
    code = (np.asarray(reveal, np.uint64) * (np.uint64(V) ** np.arange(reveal.shape[-1], dtype=np.uint64))).sum(-1)
    return ((code * np.uint64(0x9E3779B1)) >> np.uint64(16)).astype(np.int64) & 1


def emission_matrix(reveal: np.ndarray, V: int, gamma: float) -> np.ndarray:
    """O = gamma * E + (1 - gamma) * U with E the one-hot revealing map; shape (..., S, V)."""
    E = np.eye(V)[reveal]
    return gamma * E + (1.0 - gamma) / V


STREAMS = ("train", "unseen", "other", "fit", "family", "fresh")  # the seed streams of make_mixture (SCIENCE.md 8, 9)


def _stream_code(stream: str) -> int:
    """A nonzero 32-bit tag of a non-training stream name (sha256), appended to the training SeedSequence."""
    return int(hashlib.sha256(f"hmm-stream:{stream}".encode()).hexdigest()[:8], 16) | 1


def make_mixture(cfg: HMMConfig, dtype=np.float64, *, stream: str = "train", replicate: int | None = None) -> Mixture:
    """Draw cfg.n_tasks HMMs from the family with cfg.seed; same config -> same bits.

    stream: "train" (the training mixture: SeedSequence([seed, TAG]), the same in every record) or
    another name: seeds.with_replicate([seed, TAG, tag(stream)], replicate), a stream no training task uses (with a
    replicate r the keys end in (r, 1), so replicate 0 is not the stream without one: seeds.py). The
    streams hmmscope draws (SCIENCE.md 8, 9), each disjoint from the others:
    - "unseen": fresh tasks for evaluation (episodes.unseen_episodes; replicate = data.seed, so each replicate
      seed scores its own unseen tasks and an interval over seeds covers the draw of unseen tasks);
    - "fit": the tasks whose episodes fit the counting baselines' settings (episodes.fit_episodes);
    - "family": the tasks of the family-Bayes reference (episodes.family_tasks);
    - "fresh": the training tasks when hmm.n_tasks = 0, one per training episode (episodes.fresh_training);
    - "other": a mixture of other tasks (no replicate); no job draws it, and it stays so that the records that
      used it can be redrawn.
    Same family, hyperparameters and code path; only the random stream differs. The config_hash of a non-training
    mixture names its stream (and replicate), so episodes drawn from it never share a dataset hash with training
    data. cfg.n_tasks must be >= 1 here (hmm.n_tasks = 0, "fresh tasks", is resolved by the callers).
    """
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty name, got {stream!r}")
    if stream == "train" and replicate is not None:
        raise ValueError("the training stream takes no replicate (it is keyed by hmm.seed alone)")
    if cfg.n_tasks < 1:
        raise ValueError(f"make_mixture needs n_tasks >= 1, got {cfg.n_tasks} (0 means fresh tasks: "
                         "episodes.fresh_training draws them)")
    keys = [cfg.seed, 0x484D4D] + ([] if stream == "train" else [_stream_code(stream)])
    rng = seeds.rng(*seeds.with_replicate(keys, replicate))
    n, S, V, d = cfg.n_tasks, cfg.n_states, cfg.n_tokens, cfg.rank
    if cfg.family == "dirichlet":
        W, Q = _dirichlet_factors(rng, n, S, d, cfg.alpha)
    elif cfg.family == "sticky":
        W, Q = _sticky_factors(rng, n, S, d, cfg.alpha, cfg.rho)
    else:
        raise ValueError(f"unknown family {cfg.family!r} (known: dirichlet, sticky)")
    # hmm.structures: "half" draws every task's revealing map from half 0; "half-heldout" the training streams from
    # half 0 and the evaluation streams (unseen, fit, family, other) from half 1, structures training never drew
    half = None if cfg.structures == "all" else 0 if cfg.structures == "half" or stream in ("train", "fresh") else 1
    O = emission_matrix(revealing_map(rng, n, S, V, half), V, cfg.gamma)
    mu = _dirichlet(rng, 1.0, (n, S))
    prior = np.full(n, 1.0 / n)
    h = config_hash(cfg) if stream == "train" else f"{config_hash(cfg)}-{stream}" + (
        "" if replicate is None else f"-rep{int(replicate)}")  # "-r<r>" was the stream before seeds.with_replicate
    return Mixture(mu.astype(dtype), W.astype(dtype), Q.astype(dtype), O.astype(dtype), prior, h)


def make_hmm(cfg: HMMConfig, task: int = 0) -> HMM:
    """One task of the mixture described by cfg (task 0 by default)."""
    return make_mixture(cfg).task(task)


# ---------------------------------------------------------------- sampling


class InverseCDF:
    """Inverse-CDF sampler for the rows of a stochastic array P (..., K), flattened to rows."""

    def __init__(self, P: np.ndarray):
        P = np.asarray(P, dtype=np.float64)
        K = P.shape[-1]
        self.K2 = 1 << (K - 1).bit_length()  # K=1 -> 1, K=8 -> 8, K=9 -> 16
        c = np.cumsum(P.reshape(-1, K), axis=1)
        c /= c[:, -1:]
        tab = np.full((c.shape[0], self.K2), 2.0, np.float32)  # padding is never <= u < 1
        tab[:, :K] = c
        tab[:, K - 1] = 1.0  # so the index is always < K
        self.tab = tab.reshape(-1)  # (R * K2,)

    def draw(self, row: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Index in [0, K) for each row (N,) intp, uniform u (N,) float32: #{j: cdf[row, j] <= u}."""
        pos = row * self.K2
        h = self.K2 >> 1
        while h:
            pos += (self.tab.take(pos + (h - 1)) <= u) * h
            h >>= 1
        return pos & (self.K2 - 1)


@dataclass
class _Tables:
    init: InverseCDF  # rows: task
    W: InverseCDF  # rows: task * S + s
    Q: InverseCDF  # rows: task * d + z
    O: InverseCDF  # rows: task * S + s


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sampling_tables(mix: Mixture) -> _Tables:
    """Tables built once per Mixture object (do not modify a mixture's arrays in place)."""
    tab = _CACHE.get(mix)
    if tab is None:
        tab = _CACHE[mix] = _Tables(InverseCDF(mix.initial), InverseCDF(mix.W), InverseCDF(mix.Q), InverseCDF(mix.emission))
    return tab


def sample_from_states(mix: Mixture, task: np.ndarray, s0: np.ndarray, length: int, rng: np.random.Generator, dtype):
    """Sequences from given first states: (tokens, states) (N, length) in the input order."""
    tabs, S, d, N = sampling_tables(mix), mix.n_states, mix.rank, len(task)
    order = np.argsort(task, kind="stable")  # same-task sequences together: local table gathers
    tok, st = np.empty((N, length), dtype), np.empty((N, length), dtype)
    for a in range(0, N, _CHUNK):
        idx = order[a:a + _CHUNK]
        tS, td, s = task[idx] * S, task[idx] * d, s0[idx]  # (n,) intp
        ctok, cst = np.empty((length, len(idx)), dtype), np.empty((length, len(idx)), dtype)  # time-major
        for t in range(length):
            last = t == length - 1
            u = rng.random((1 if last else 3, len(idx)), dtype=np.float32)
            r = tS + s
            cst[t] = s
            ctok[t] = tabs.O.draw(r, u[0])  # o_t ~ O[task, s_t]
            if not last:
                z = tabs.W.draw(r, u[1])  # z ~ W[task, s_t]
                s = tabs.Q.draw(td + z, u[2])  # s_{t+1} ~ Q[task, z]
        tok[idx], st[idx] = ctok.T, cst.T
    return tok, st


def _check_tasks(mix: Mixture, task_ids) -> np.ndarray:
    task = np.asarray(task_ids).astype(np.intp).reshape(-1)
    if task.size and (task.min() < 0 or task.max() >= mix.n_tasks):
        raise ValueError(f"task ids must lie in [0, {mix.n_tasks}), got range [{task.min()}, {task.max()}]")
    return task


def sample_sequences(mix: Mixture, task_ids: np.ndarray, length: int, rng: np.random.Generator,
                     start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sample N independent sequences; returns (tokens, states), int32 arrays (N, length).

    task_ids (N,): task of each sequence. start (N, S): first-state distribution of each
    sequence (default mix.initial[task_ids]).
    """
    task = _check_tasks(mix, task_ids)
    N, S = len(task), mix.n_states
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    u0 = rng.random(N, dtype=np.float32)
    if start is None:
        s0 = sampling_tables(mix).init.draw(task, u0)
    else:
        start = np.asarray(start, dtype=np.float64)
        if start.shape != (N, S):
            raise ValueError(f"start must have shape ({N}, {S}), got {start.shape}")
        if np.any(start < 0) or not np.allclose(start.sum(1), 1.0, atol=1e-6):
            raise ValueError("start rows must be distributions (non-negative, summing to 1)")
        s0 = InverseCDF(start).draw(np.arange(N), u0)
    if length == 0:
        return np.empty((N, 0), np.int32), np.empty((N, 0), np.int32)
    return sample_from_states(mix, task, s0, length, rng, np.int32)


def distribution_after(mix: Mixture, tasks: np.ndarray, steps: int) -> np.ndarray:
    """mu T^steps (m, S) for the given tasks via mu W (Q W)^(steps-1) Q: only d x d powers."""
    p = mix.initial[tasks].astype(np.float64)
    if steps <= 0:
        return p
    W, Q = mix.W[tasks].astype(np.float64), mix.Q[tasks].astype(np.float64)
    x = (p[:, None, :] @ W)[:, 0]  # (m, d)
    if steps > 1:
        x = (x[:, None, :] @ np.linalg.matrix_power(Q @ W, steps - 1))[:, 0]  # (Q W) is (m, d, d)
    p = np.clip((x[:, None, :] @ Q)[:, 0], 0.0, None)  # (m, S)
    return p / p.sum(1, keepdims=True)


def state_distribution_after(mix: Mixture, task_ids: np.ndarray, steps: int) -> np.ndarray:
    """Distribution mu T^steps of the hidden state after `steps` transitions from mu, per sequence (N, S)."""
    task = _check_tasks(mix, task_ids)
    uniq, inv = np.unique(task, return_inverse=True)
    return distribution_after(mix, uniq, int(steps))[inv]


# ---------------------------------------------------------------- chain properties


def stationary_distribution(T: np.ndarray) -> np.ndarray:
    T = np.asarray(T, dtype=np.float64)
    w, v = np.linalg.eig(T.T)
    ones = np.abs(w - 1.0) < 1e-8
    if not ones.any():  # numerical fallback
        ones = np.abs(w - 1.0) == np.abs(w - 1.0).min()
    pi = np.abs(np.real(v[:, ones])).sum(1)
    pi = pi / pi.sum()
    for _ in range(50):  # polish (also fixes any sign mixing across a multiple eigenvalue)
        pi = 0.5 * (pi + pi @ T)  # lazy chain: same fixed point, no periodic oscillation
    return pi / pi.sum()


def dobrushin(T: np.ndarray) -> float:
    """delta(T) = max_{i,j} TV(T_i, T_j) = 1/2 max ||T_i - T_j||_1."""
    T = np.asarray(T, dtype=np.float64)
    best = 0.0
    for start in range(0, T.shape[0], 64):  # chunked to bound memory at S = 128+
        diff = np.abs(T[start:start + 64, None, :] - T[None, :, :]).sum(-1)
        best = max(best, float(diff.max()))
    return 0.5 * best


def mixing_rate(W: np.ndarray, Q: np.ndarray | None = None) -> float:
    """-log|lambda_2(T)| for T = W @ Q (or T = W when Q is None): the second-largest eigenvalue modulus
    (the eigenvalue 1 of a stochastic matrix removed once). Uses the d x d matrix Q W. inf if |lambda_2| ~ 0."""
    M = np.asarray(W, np.float64) if Q is None else np.asarray(Q, np.float64) @ np.asarray(W, np.float64)
    if M.shape[0] < 2:
        return float("inf")
    lam = np.sort(np.abs(np.linalg.eigvals(M)))[::-1]
    l2 = float(lam[1])
    return float("inf") if l2 <= 1e-12 else float(-np.log(min(l2, 1.0)))  # 1e-12: round-off of a zero eigenvalue
