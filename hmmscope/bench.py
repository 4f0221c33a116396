"""Speed benchmarks: ours against a named peer, run in the same process, reported as a ratio.

Each function returns a dict of plain numbers; `cli.py` prints them. Nothing here
asserts a speed: tests only check that the benchmarks run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .config import HMMConfig
from .hmm import HMM, make_hmm


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up call (the least noisy estimate)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_hmm(n_states: int = 128, n_tokens: int = 16, rank: int = 8, seed: int = 0) -> HMM:
    """The benchmark HMM: one sticky low-rank task at the paper's size."""
    return make_hmm(HMMConfig(n_tasks=1, n_states=n_states, n_tokens=n_tokens, rank=rank, seed=seed))


def _hmmlearn_model(hmm: HMM):
    try:
        from hmmlearn.hmm import CategoricalHMM
    except ImportError:
        raise ValueError("the peer hmmlearn is not installed: pip install hmmlearn (or pip install -e '.[test]')")
    m = CategoricalHMM(n_components=hmm.n_states, n_features=hmm.n_tokens, init_params="", params="")
    m.startprob_, m.transmat_, m.emissionprob_ = hmm.initial, hmm.transition, hmm.emission
    return m


def bench_sample(n_seqs: int = 4096, length: int = 256, peer_length: int = 20000, repeats: int = 3,
                 **hmm_kw) -> dict[str, float]:
    """Tokens/s of `HMM.sample` (n_seqs x length) vs hmmlearn's CategoricalHMM.sample (one sequence)."""
    hmm = bench_hmm(**hmm_kw)
    peer = _hmmlearn_model(hmm)
    t_ours = _best_time(lambda: hmm.sample(n_seqs, length, seed=1), repeats)
    t_peer = _best_time(lambda: peer.sample(peer_length, random_state=1), repeats)
    ours, theirs = n_seqs * length / t_ours, peer_length / t_peer
    return {"ours_tokens_per_s": ours, "hmmlearn_tokens_per_s": theirs, "ratio": ours / theirs}


def bench_filter(n_seqs: int = 4096, length: int = 256, peer_length: int = 100000, repeats: int = 3,
                 **hmm_kw) -> dict[str, float]:
    """Tokens/s of the task-oracle filter (float32, batched) vs hmmlearn's CategoricalHMM.score."""
    import torch

    from .inference import filter_factored

    hmm = bench_hmm(**hmm_kw)
    peer = _hmmlearn_model(hmm)
    tokens, _ = hmm.sample(n_seqs, length, seed=2)
    tok = torch.as_tensor(tokens, dtype=torch.long)
    mu, W, Q, O = (torch.as_tensor(a, dtype=torch.float32) for a in (hmm.initial, hmm.W, hmm.Q, hmm.emission))
    init = mu.expand(n_seqs, -1)
    t_ours = _best_time(lambda: filter_factored(init, W, Q, O, tok, dtype=torch.float32), repeats)
    x, _ = hmm.sample(1, peer_length, seed=3)
    X = x.reshape(-1, 1)
    t_peer = _best_time(lambda: peer.score(X), repeats)
    ours, theirs = n_seqs * length / t_ours, peer_length / t_peer
    return {"ours_tokens_per_s": ours, "hmmlearn_tokens_per_s": theirs, "ratio": ours / theirs}


def bench_paper_dataset() -> dict[str, float]:
    """Wall time to draw the paper-scale mixture and all 131,072 training episodes."""
    from .config import preset
    from .episodes import sample_episodes
    from .hmm import make_mixture

    cfg = preset("paper")
    t0 = time.perf_counter()
    mix = make_mixture(cfg.hmm, dtype=np.float32)
    t1 = time.perf_counter()
    ep = sample_episodes(mix, cfg.data, cfg.data.n_train, split="train")
    t2 = time.perf_counter()
    return {"mixture_s": t1 - t0, "episodes_s": t2 - t1, "total_s": t2 - t0,
            "episodes": float(len(ep)), "tokens": float(ep.tokens.size)}
