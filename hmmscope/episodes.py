"""In-context episodes sampled from a mixture of low-rank HMMs (SCIENCE.md 3).

Sampling. Every categorical draw is an inverse-CDF lookup: each stochastic row
is stored once per mixture as a float32 cumulative table padded to a
power-of-two width K2, and the draw for a uniform u is the number of entries
<= u, found by a branchless binary search (log2 K2 vectorized gathers). A
transition uses the factors T = W Q: z ~ W[task, s] (d-way), then
s' ~ Q[task, z] (S-way); no dense S x S matrix is formed. Sequences are
processed sorted by task (cache-friendly gathers) in fixed chunks; the only
Python loop is over time steps. Output is a deterministic function of the
numpy Generator state (single-threaded numpy).

Episode layout (T = k (l_demo + 1) + l_test positions, the same for all):

    demo 0 (l_demo obs) | D | demo 1 | D | ... | demo k-1 | D | test (l_test obs)

with D = V the delimiter. ``segment[t]`` is the demo index (k for the test,
-1 for delimiters), ``position[t]`` the index inside the segment (-1 at D).
Next-token training feeds ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``;
``target_mask[t]`` is True iff token t+1 is an observation, so the loss is
taken over ``target_mask[:-1]`` (the last entry is always False). The
delimiter is never a target; every observation except position 0 is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import DataConfig, config_hash, to_dict
from .hmm import Mixture

_CHUNK = 1 << 15  # sequences per chunk (fixed: the random stream depends on it)
_TAG = 0x45504953  # "EPIS": separates episode streams from other users of data.seed
_SPLITS = {"train": 1, "eval": 2}
_FORMAT = 1


class _CDF:
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
    init: _CDF  # rows: task
    W: _CDF  # rows: task * S + s
    Q: _CDF  # rows: task * d + z
    O: _CDF  # rows: task * S + s


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tables(mix: Mixture) -> _Tables:
    """Tables built once per Mixture object (do not modify a mixture's arrays in place)."""
    tab = _CACHE.get(mix)
    if tab is None:
        tab = _CACHE[mix] = _Tables(_CDF(mix.initial), _CDF(mix.W), _CDF(mix.Q), _CDF(mix.emission))
    return tab


def _run(mix: Mixture, task: np.ndarray, s0: np.ndarray, length: int, rng: np.random.Generator, dtype):
    """Sequences from given first states: (tokens, states) (N, length) in the input order."""
    tabs, S, d, N = _tables(mix), mix.n_states, mix.rank, len(task)
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
        s0 = _tables(mix).init.draw(task, u0)
    else:
        start = np.asarray(start, dtype=np.float64)
        if start.shape != (N, S):
            raise ValueError(f"start must have shape ({N}, {S}), got {start.shape}")
        if np.any(start < 0) or not np.allclose(start.sum(1), 1.0, atol=1e-6):
            raise ValueError("start rows must be distributions (non-negative, summing to 1)")
        s0 = _CDF(start).draw(np.arange(N), u0)
    if length == 0:
        return np.empty((N, 0), np.int32), np.empty((N, 0), np.int32)
    return _run(mix, task, s0, length, rng, np.int32)


def _after_unique(mix: Mixture, tasks: np.ndarray, steps: int) -> np.ndarray:
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
    return _after_unique(mix, uniq, int(steps))[inv]


def layout(n_demos: int, l_demo: int, l_test: int) -> tuple[np.ndarray, np.ndarray]:
    """(segment, position), int64 arrays (T,): see the module docstring."""
    demo = np.r_[np.arange(l_demo), -1]  # one demo and its delimiter
    seg = np.r_[np.repeat(np.arange(n_demos), l_demo + 1), np.full(l_test, n_demos)].astype(np.int64)
    pos = np.r_[np.tile(demo, n_demos), np.arange(l_test)].astype(np.int64)
    seg[pos < 0] = -1
    return seg, pos


@dataclass
class Episodes:
    """A batch of episodes (N, T) sharing one layout; see the module docstring."""

    tokens: np.ndarray  # (N, T) int16: observations 0..V-1, delimiter V
    states: np.ndarray  # (N, T) int16: hidden state, -1 at delimiters
    task_ids: np.ndarray  # (N,) int64
    segment: np.ndarray  # (T,) demo index, n_demos for the test, -1 at delimiters
    position: np.ndarray  # (T,) index within the segment, -1 at delimiters
    n_tokens: int
    n_demos: int
    l_demo: int
    l_test: int
    meta: dict = field(default_factory=dict)  # hashes, split, seed, test_start, burn_in, data config

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def delimiter(self) -> int:
        return self.n_tokens

    @property
    def vocab_size(self) -> int:
        return self.n_tokens + 1

    @property
    def is_obs(self) -> np.ndarray:
        """(T,) bool: observation tokens (not delimiters)."""
        return self.segment >= 0

    @property
    def test_mask(self) -> np.ndarray:
        """(T,) bool: tokens of the test sequence."""
        return self.segment == self.n_demos

    @property
    def target_mask(self) -> np.ndarray:
        """(T,) bool: True at t iff token t+1 is an observation (a next-token target); last entry False."""
        return np.r_[self.is_obs[1:], False]

    @property
    def test_target_mask(self) -> np.ndarray:
        """(T,) bool: True at t iff token t+1 is a test token."""
        return np.r_[self.test_mask[1:], False]

    @property
    def test_start(self) -> str:
        return self.meta.get("test_start", "initial")

    @property
    def burn_in(self) -> int:
        return int(self.meta.get("burn_in", 0))

    def subset(self, idx) -> Episodes:
        """Episodes idx (slice, index array or boolean mask); an int keeps a batch of one."""
        if isinstance(idx, (int, np.integer)):
            idx = [int(idx)]
        return Episodes(self.tokens[idx], self.states[idx], self.task_ids[idx], self.segment, self.position,
                        self.n_tokens, self.n_demos, self.l_demo, self.l_test, dict(self.meta))

    __getitem__ = subset


def _split_code(split: str) -> int:
    return _SPLITS.get(split) or int(hashlib.sha256(split.encode()).hexdigest()[:8], 16)


def _mixture_hash(mix: Mixture) -> str:
    """mix.config_hash, or a content hash of the parameters for a hand-made mixture."""
    if mix.config_hash:
        return mix.config_hash
    h = hashlib.sha256()
    for a in (mix.initial, mix.W, mix.Q, mix.emission, mix.prior):
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def sample_episodes(mix: Mixture, data: DataConfig, n: int, split: str = "train") -> Episodes:
    """n episodes of the layout in `data`, seeded by (data.seed, split); same inputs -> same bits."""
    rng = np.random.default_rng(np.random.SeedSequence([data.seed, _TAG, _split_code(split)]))
    V, k, L = mix.n_tokens, data.n_demos, max(data.l_demo, data.l_test)
    task = rng.choice(mix.n_tasks, size=n, p=np.asarray(mix.prior, np.float64)).astype(np.int64)  # (n,)
    seq_task = np.repeat(task, k + 1).astype(np.intp)  # (n (k+1),): sequence e (k+1) + j, j = k the test
    u0 = rng.random(len(seq_task), dtype=np.float32)
    s0 = _tables(mix).init.draw(seq_task, u0)  # demos (and "initial" tests) start from mu
    if data.test_start == "midstream" and data.burn_in > 0:
        uniq, inv = np.unique(task, return_inverse=True)
        s0[k::k + 1] = _CDF(_after_unique(mix, uniq, data.burn_in)).draw(inv, u0[k::k + 1])  # mu T^B
    dt = np.int16 if max(V + 1, mix.n_states) < 2**15 else np.int32
    tok, st = _run(mix, seq_task, s0, L, rng, dt)  # (n (k+1), L)
    seg, pos = layout(k, data.l_demo, data.l_test)
    obs = seg >= 0
    tokens, states = np.full((n, len(seg)), V, dt), np.full((n, len(seg)), -1, dt)
    tokens[:, obs] = tok.reshape(n, k + 1, L)[:, seg[obs], pos[obs]]
    del tok
    states[:, obs] = st.reshape(n, k + 1, L)[:, seg[obs], pos[obs]]
    hh, dh = _mixture_hash(mix), config_hash(data)
    meta = {"hmm_hash": hh, "data_hash": dh, "split": split, "seed": data.seed, "n": n,
            "dataset_hash": hashlib.sha256(json.dumps([hh, dh, split, n]).encode()).hexdigest()[:16],
            "test_start": data.test_start, "burn_in": data.burn_in if data.test_start == "midstream" else 0,
            "data_config": to_dict(data)}
    return Episodes(tokens, states, task, seg, pos, V, k, data.l_demo, data.l_test, meta)


_ARRAYS = ("tokens", "states", "task_ids", "segment", "position")


def save_episodes(ep: Episodes, path: str | Path, config: dict | None = None) -> Path:
    """Write ep to a compressed .npz (arrays + a JSON sidecar) atomically: temp file, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    side = {"format": _FORMAT, "n_tokens": ep.n_tokens, "n_demos": ep.n_demos, "l_demo": ep.l_demo,
            "l_test": ep.l_test, "meta": ep.meta, "config": config}
    blob = np.frombuffer(json.dumps(side, sort_keys=True).encode(), np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, sidecar=blob, **{a: getattr(ep, a) for a in _ARRAYS})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def load_episodes(path: str | Path) -> Episodes:
    """Read a file written by save_episodes (the sidecar's config is in meta['config'] when present)."""
    with np.load(path, allow_pickle=False) as z:
        side = json.loads(z["sidecar"].tobytes().decode())
        if side.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown episodes format {side.get('format')!r}")
        arrays = {a: z[a] for a in _ARRAYS}
    meta = dict(side["meta"])
    if side.get("config") is not None:
        meta["config"] = side["config"]
    return Episodes(**arrays, n_tokens=side["n_tokens"], n_demos=side["n_demos"], l_demo=side["l_demo"],
                    l_test=side["l_test"], meta=meta)
