"""The L-memory predictor and eps(L) (SCIENCE.md 4): what a predictor that sees only the last L tokens can do.

`memory_predictor` gives p_L(o_t | o_{t-L..t-1}), the exact filter over the last L tokens started from the chain's
stationary distribution; `memory_error` estimates eps(L) = E[TV(p(.|o_{1:t}), p_L)] by Monte Carlo over stationary
histories (`MemoryErrorResult`: eps, its standard error and the per-history values the theory's bootstrap uses).
Both run inference's `stationary_filter`; never uses tokens >= t.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..data.hmm import HMM
from .inference import stationary_filter

__all__ = ["memory_predictor", "memory_error", "MemoryErrorResult"]


def memory_predictor(hmm: HMM, tokens, L: int, *, dtype=torch.float64, chunk: int = 65536) -> np.ndarray:
    """p_L(o_t | o_{t-L..t-1}) (n, length, V): the filter over the last L tokens only (fewer when
    t < L), started from hmm.stationary at the window's first token. Never uses tokens >= t."""
    if L < 0:
        raise ValueError(f"L must be >= 0, got {L}")
    tok = torch.as_tensor(np.atleast_2d(np.asarray(tokens)), dtype=torch.long)
    n, length = tok.shape
    if L == 0:
        p0 = np.asarray(hmm.stationary) @ np.asarray(hmm.emission)
        return np.broadcast_to(p0, (n, length, p0.shape[0])).copy()
    padded = torch.cat([torch.full((n, L), -1, dtype=torch.long), tok], 1)  # -1 = missing
    windows = padded.unfold(1, L, 1)[:, :length].reshape(n * length, L)  # window t = tokens[t-L:t]
    out = torch.cat([stationary_filter(hmm, windows[i:i + chunk], dtype)
                     for i in range(0, n * length, chunk)])
    return out.reshape(n, length, -1).numpy()


@dataclass(frozen=True, eq=False)
class MemoryErrorResult:
    """eps(L) = E[TV(p(.|o_{1:t}), p_L(.|o_{t-L+1:t}))] with its Monte Carlo standard error.

    tv (n_histories, len(lengths)): the per-history TV values (eps = tv.mean(0)); the histories are
    shared by all L, so a bootstrap over histories (theory.fit_decay_rate) keeps their correlation.
    """

    lengths: np.ndarray
    eps: np.ndarray
    stderr: np.ndarray
    n_histories: int
    burn_in: int
    tv: np.ndarray | None = None


def memory_error(hmm: HMM, lengths: Sequence[int], n_histories: int = 1000, burn_in: int = 200,
                 seed: int = 0, dtype=torch.float64) -> MemoryErrorResult:
    """Monte Carlo eps(L) over stationary histories of length burn_in + max(lengths).

    The hidden chain starts from hmm.stationary; the full-history predictive of the next token
    is the exact filter from hmm.stationary over the whole history, p_L the same filter over its
    last L tokens; TV = 0.5 * L1 over the V next-token probabilities. Reproducible from seed.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    H = burn_in + int(lengths.max())
    tokens, _ = hmm.sample(n_histories, H, seed=seed, start=hmm.stationary)
    tok = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    full = stationary_filter(hmm, tok, dtype)  # (n, V)
    eps, se, tvs = [], [], []
    for L in lengths:
        tv = 0.5 * (full - stationary_filter(hmm, tok[:, H - int(L):], dtype)).abs().sum(-1)
        eps.append(tv.mean().item())
        se.append(tv.std().item() / np.sqrt(n_histories))
        tvs.append(tv.double().numpy())
    return MemoryErrorResult(lengths, np.array(eps), np.array(se), n_histories, burn_in, np.stack(tvs, 1))
