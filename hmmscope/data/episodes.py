"""In-context episodes sampled from a mixture of low-rank HMMs (SCIENCE.md 3).

Layering: this module sits above hmm.py (HMMs, mixtures and their sequence sampler,
`sample_sequences`); hmm.py never imports it.

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

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..config import DataConfig, HMMConfig, config_hash, to_dict
from ..safe_output import atomic_open
from . import seeds
from .hmm import (
    InverseCDF,
    Mixture,
    distribution_after,
    make_mixture,
    sample_from_states,
    sampling_tables,
)

__all__ = ["Episodes", "layout", "sample_episodes", "unseen_episodes", "probe_tasks", "probe_episodes", "truncate_demos",
           "fit_episodes", "family_tasks", "fresh_training", "training_data", "save_episodes", "load_episodes"]

_TAG = 0x45504953  # "EPIS": separates episode streams from other users of data.seed
_SPLITS = {"train": 1, "eval": 2}
_FORMAT = 1


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



class EpisodeArrays(NamedTuple):
    """An Episodes-like object's tokens as the counting baselines and the EM learner read them."""

    tokens: np.ndarray  # (N, T) int64
    segment: np.ndarray  # (T,) int64: demo index, n_demos for the test, -1 at delimiters
    n_tokens: int  # V


def episode_arrays(ep) -> EpisodeArrays:
    """`EpisodeArrays` of an Episodes-like object (tokens a numpy array or a torch tensor)."""
    tok = ep.tokens.numpy() if hasattr(ep.tokens, "numpy") else np.asarray(ep.tokens)
    return EpisodeArrays(tok.astype(np.int64), np.asarray(ep.segment, np.int64), int(ep.n_tokens))


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
    rng = seeds.rng(data.seed, _TAG, _split_code(split))
    task = rng.choice(mix.n_tasks, size=n, p=np.asarray(mix.prior, np.float64)).astype(np.int64)  # (n,)
    return _episodes(mix, data, task, rng, split)


def unseen_episodes(hmm: HMMConfig, data: DataConfig, n: int) -> tuple[Mixture, Episodes]:
    """n episodes on n fresh tasks that no training episode uses (SCIENCE.md 8): (their mixture, episodes).

    The tasks are make_mixture(hmm with n_tasks = n, stream="unseen", replicate=data.seed): the family and
    hyperparameters of the training mixture, drawn from a seed stream of their own (training draws from stream
    "train", or "fresh" with hmm.n_tasks = 0) that depends on data.seed, so replicate seeds score different unseen
    tasks and an interval over seeds covers the draw of unseen tasks. Episode i uses task i (one
    fresh task per episode, so the episodes are independent draws over tasks as well as sequences); the episodes'
    own stream is (data.seed, split "unseen"). task_ids index the returned mixture, not the training one.
    """
    return _own_tasks(hmm, data, n, "unseen")


def fit_episodes(hmm: HMMConfig, data: DataConfig, n: int) -> tuple[Mixture, Episodes]:
    """n episodes on n tasks of the "fit" stream (SCIENCE.md 9): the episodes on which the fair counting baselines'
    settings (alpha, n-gram order, CTW depth) are chosen, never the evaluation episodes. Same layout as
    unseen_episodes; tasks make_mixture(n_tasks = n, stream="fit", replicate=data.seed), episodes split "fit"."""
    return _own_tasks(hmm, data, n, "fit")


def family_tasks(hmm: HMMConfig, data: DataConfig, m: int, draw: int = 0) -> Mixture:
    """The M tasks of the family-Bayes reference (SCIENCE.md 9): make_mixture(n_tasks = m, stream="family",
    replicate=data.seed) with a uniform prior; its mixture oracle approximates the Bayes predictor for a task drawn
    from the family. The first m' < m of them are the reference at M = m' (inference.nested_mixture_oracles), so
    its convergence in M is read off one draw. draw j >= 1: another independent draw of M tasks (stream
    "family-draw<j>"), so that an interval can cover the draw of the family tasks (headroom.py); draw 0 is the one
    Figure 1 uses."""
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if draw < 0:
        raise ValueError(f"draw must be >= 0, got {draw}")
    stream = "family" if draw == 0 else f"family-draw{int(draw)}"
    return make_mixture(dataclasses.replace(hmm, n_tasks=int(m)), stream=stream, replicate=data.seed)


def fresh_training(hmm: HMMConfig, data: DataConfig, n: int, split: str = "train") -> tuple[Mixture, Episodes]:
    """Training on fresh tasks (hmm.n_tasks = 0, SCIENCE.md 9): n episodes, episode i on its own task i of
    make_mixture(n_tasks = n, stream="fresh", replicate=data.seed), episodes from (data.seed, split). Nothing can
    be retrieved: no task occurs twice. (Training for more than n / batch_size steps repeats episodes, and their
    tasks, in later epochs; set data.n_train >= train.steps x train.batch_size for one pass.)"""
    return _own_tasks(hmm, data, n, "fresh", split)


def _own_tasks(hmm: HMMConfig, data: DataConfig, n: int, stream: str, split: str | None = None):
    """n episodes, episode i on task i of make_mixture(n_tasks = n, stream, replicate=data.seed)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    split = split or stream
    mix = make_mixture(dataclasses.replace(hmm, n_tasks=int(n)), stream=stream, replicate=data.seed)
    rng = seeds.rng(data.seed, _TAG, _split_code(split))
    ep = _episodes(mix, data, np.arange(n, dtype=np.int64), rng, split)
    ep.meta["tasks"] = stream
    return mix, ep


def training_data(hmm: HMMConfig, data: DataConfig) -> tuple[Mixture | None, Episodes, Episodes, Mixture]:
    """(training mixture or None, training episodes, held-out episodes, the mixture the held-out task ids index).

    hmm.n_tasks >= 1: the mixture make_mixture(hmm); data.n_train episodes (split "train") and data.n_eval held-out
    episodes (split "eval") of its tasks. hmm.n_tasks = 0 (fresh tasks): no training mixture (None); the training
    episodes are fresh_training's, each on its own task; the held-out episodes are data.n_eval episodes of unseen
    tasks (unseen_episodes), so the learning curve (val/*) is measured on tasks no training episode used."""
    if hmm.n_tasks == 0:
        _, ep_train = fresh_training(hmm, data, data.n_train)
        umix, ep_eval = unseen_episodes(hmm, data, data.n_eval)
        return None, ep_train, ep_eval, umix
    mix = make_mixture(hmm)
    return mix, sample_episodes(mix, data, data.n_train, "train"), sample_episodes(mix, data, data.n_eval, "eval"), mix


def probe_tasks(n_tasks: int, k: int = 32, seed: int = 0) -> np.ndarray:
    """A fixed, seeded subset of min(k, n_tasks) task ids (sorted); the same for every n_episodes."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k >= n_tasks:
        return np.arange(n_tasks, dtype=np.int64)
    rng = seeds.rng(seed, _TAG, _split_code("probe-tasks"))
    return np.sort(rng.choice(n_tasks, size=k, replace=False)).astype(np.int64)


def probe_episodes(mix: Mixture, data: DataConfig, n_tasks: int = 32, per_task: int = 30,
                   split: str = "probe") -> Episodes:
    """per_task episodes of each task of probe_tasks(mix.n_tasks, n_tasks, data.seed) (ordered by task),
    from their own stream (data.seed, split): the episodes for probes that need the task (probes.py),
    trainable at any n_tasks (with 8192 tasks, episodes drawn from the prior meet most tasks once)."""
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    rng = seeds.rng(data.seed, _TAG, _split_code(split))
    ep = _episodes(mix, data, np.repeat(probe_tasks(mix.n_tasks, n_tasks, data.seed), per_task), rng, split)
    ep.meta.update({"probe_tasks": int(min(n_tasks, mix.n_tasks)), "per_task": int(per_task)})
    return ep


def _episodes(mix: Mixture, data: DataConfig, task: np.ndarray, rng: np.random.Generator, split: str) -> Episodes:
    """Episodes of the given tasks (n,), every later draw from rng."""
    n, V, k, L = len(task), mix.n_tokens, data.n_demos, max(data.l_demo, data.l_test)
    seq_task = np.repeat(task, k + 1).astype(np.intp)  # (n (k+1),): sequence e (k+1) + j, j = k the test
    u0 = rng.random(len(seq_task), dtype=np.float32)
    s0 = sampling_tables(mix).init.draw(seq_task, u0)  # demos (and "initial" tests) start from mu
    if data.test_start == "midstream" and data.burn_in > 0:
        uniq, inv = np.unique(task, return_inverse=True)
        s0[k::k + 1] = InverseCDF(distribution_after(mix, uniq, data.burn_in)).draw(inv, u0[k::k + 1])  # mu T^B
    dt = np.int16 if max(V + 1, mix.n_states) < 2**15 else np.int32
    tok, st = sample_from_states(mix, seq_task, s0, L, rng, dt)  # (n (k+1), L)
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
    return Episodes(tokens, states, np.asarray(task, np.int64), seg, pos, V, k, data.l_demo, data.l_test, meta)


def truncate_demos(ep: Episodes, k: int) -> Episodes:
    """ep with only its LAST k demonstrations: the first n_demos - k demo blocks (each with its
    delimiter) are cut off the front; the test segment and all per-episode data are unchanged."""
    if not 0 <= k <= ep.n_demos:
        raise ValueError(f"k must be in [0, n_demos={ep.n_demos}], got {k}")
    start = (ep.n_demos - k) * (ep.l_demo + 1)
    seg, pos = layout(k, ep.l_demo, ep.l_test)
    meta = {**ep.meta, "n_demos_kept": k, "n_demos_original": ep.meta.get("n_demos_original", ep.n_demos)}
    return Episodes(tokens=ep.tokens[:, start:], states=ep.states[:, start:], task_ids=ep.task_ids, segment=seg,
                    position=pos, n_tokens=ep.n_tokens, n_demos=k, l_demo=ep.l_demo, l_test=ep.l_test, meta=meta)


_ARRAYS = ("tokens", "states", "task_ids", "segment", "position")


def save_episodes(ep: Episodes, path: str | Path, config: dict | None = None) -> Path:
    """Write ep to a compressed .npz (arrays + a JSON sidecar) atomically: temp file, then os.replace."""
    path = Path(path)
    side = {"format": _FORMAT, "n_tokens": ep.n_tokens, "n_demos": ep.n_demos, "l_demo": ep.l_demo,
            "l_test": ep.l_test, "meta": ep.meta, "config": config}
    blob = np.frombuffer(json.dumps(side, sort_keys=True).encode(), np.uint8)
    with atomic_open(path, "wb") as f:
        np.savez_compressed(f, sidecar=blob, **{a: getattr(ep, a) for a in _ARRAYS})
    return path


def load_episodes(path: str | Path) -> Episodes:
    """Read a file written by save_episodes (the sidecar's config is in meta['config'] when present)."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block, a device never ends
        raise ValueError(f"episodes file {path} is not a regular file (a folder, FIFO, device or socket)")
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
