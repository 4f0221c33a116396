"""The sticky family's discrete part, enumerated up to relabeling (SCIENCE.md 10): the orbits the Bayes reference
(oracles.bayes) sums over, and where the enumeration is too large (`why_not`).

A structure is the permutation sigma of the d clusters and the revealing map (each state's token); the clusters are
contiguous, cluster(s) = s d // S (`clusters`, as data/hmm.py's _sticky_factors). Relabeling the hidden states by a
permutation that maps the cluster partition onto itself (states within a cluster, clusters of one size among
themselves) leaves prior and likelihood unchanged (every Dirichlet of the family is exchangeable), so one structure
per orbit is enumerated, weighted by the orbit's size (`sticky_structures`). Under hmm.structures half /
half-heldout the halves are not closed under relabeling: every structure is its own orbit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np

from ..config import HMMConfig
from ..data.hmm import structure_half

__all__ = ["Structures", "clusters", "sticky_structures", "why_not", "MAX_STRUCTURES", "MAX_WORK"]

MAX_STRUCTURES = 2_000_000  # structures (before symmetry) an exact reference enumerates at most
MAX_WORK = 2e7  # structures x relabelings the orbit enumeration handles at most (its int64 tables: 160 MB)


@dataclasses.dataclass(frozen=True)
class Structures:
    """The orbits of the sticky family's discrete part (one representative each)."""

    sigma: np.ndarray  # (P, d) cluster permutations
    reveal: np.ndarray  # (Rv, S) revealing maps
    pair_sigma: np.ndarray  # (n,) representative i is (sigma[pair_sigma[i]], reveal[pair_reveal[i]])
    pair_reveal: np.ndarray  # (n,)
    log_mult: np.ndarray  # (n,) log of the orbit's size (its prior weight up to a constant)
    n_structures: int  # structures before the symmetry

    @property
    def n_orbits(self) -> int:
        return len(self.pair_sigma)


def clusters(S: int, d: int) -> np.ndarray:
    """Each state's cluster: contiguous, cluster(s) = s d // S (as data/hmm.py's _sticky_factors)."""
    return np.arange(S) * d // S


def _reveal_maps(S: int, V: int, structures: str, half: int | None) -> np.ndarray:
    """Every revealing map the family draws (data/hmm.py revealing_map): injective when S <= V, else the distinct
    arrangements of arange(S) % V; restricted to one half for hmm.structures half / half-heldout."""
    if S <= V:
        maps = np.array(list(itertools.permutations(range(V), S)), np.int64).reshape(-1, S)
        if half is not None:
            maps = maps[structure_half(maps, V) == half]
        return maps
    return np.array(sorted(set(itertools.permutations(list(np.arange(S) % V)))), np.int64).reshape(-1, S)


def _count_structures(hmm: HMMConfig) -> float:
    S, V, d = hmm.n_states, hmm.n_tokens, hmm.rank
    maps = math.perm(V, S) if S <= V else math.factorial(S) / math.prod(
        math.factorial(int(c)) for c in np.bincount(np.arange(S) % V))
    if S <= V and hmm.structures != "all":
        maps /= 2
    return float(math.factorial(d)) * maps


def why_not(hmm: HMMConfig) -> str | None:
    """None when the exact reference can be computed for this family, else the reason in a few words."""
    if hmm.family != "sticky":
        return (f"the {hmm.family} family has no discrete part to enumerate (a sequential Monte Carlo over its "
                "continuous parameters is not implemented)")
    n = _count_structures(hmm)
    if n > MAX_STRUCTURES:
        return (f"{n:.2g} structures (S = {hmm.n_states}, V = {hmm.n_tokens}, d = {hmm.rank}) are more than the "
                f"{MAX_STRUCTURES:,} an exact reference enumerates")
    sizes = np.bincount(clusters(hmm.n_states, hmm.rank), minlength=hmm.rank)
    group = math.prod(math.factorial(int(z)) for z in sizes) * math.prod(
        math.factorial(int(c)) for c in np.bincount(sizes))
    if hmm.structures == "all" and n * group > MAX_WORK:
        return (f"{n:.2g} structures x {group:,} relabelings are more than the {MAX_WORK:.0e} its orbit enumeration "
                "handles")
    return None


def _partition_group(S: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The state permutations that map the cluster partition onto itself, and the cluster permutations they
    induce: (G, S) with pi[s] the new label of s, (G, d)."""
    cl = clusters(S, d)
    sizes = np.bincount(cl, minlength=d)
    perms, cperms = [], []
    for cp in itertools.permutations(range(d)):  # clusters onto clusters of the same size
        cp = np.array(cp)
        if np.any(sizes[cp] != sizes):
            continue
        inner = [list(itertools.permutations(np.flatnonzero(cl == cp[c]))) for c in range(d)]
        for choice in itertools.product(*inner):
            pi = np.empty(S, np.int64)
            for c in range(d):
                pi[np.flatnonzero(cl == c)] = choice[c]
            perms.append(pi)
            cperms.append(cp)
    return np.array(perms), np.array(cperms)


@functools.lru_cache(maxsize=16)
def _structures(S: int, V: int, d: int, structures: str, stream_half: int | None) -> Structures:
    sig = np.array(list(itertools.permutations(range(d))), np.int64).reshape(-1, d)
    maps = _reveal_maps(S, V, structures, stream_half)
    n = len(sig) * len(maps)
    if structures != "all":  # the halves are not closed under relabeling: every structure is its own orbit
        ps, pr = np.divmod(np.arange(n), len(maps))
        return Structures(sig, maps, ps, pr, np.zeros(n), n)
    pis, cps = _partition_group(S, d)
    base = V ** np.arange(S, dtype=np.int64)
    sig_code = {tuple(s): i for i, s in enumerate(sig)}
    # the image of (sigma, r) under (pi, pi_c): r'[pi[s]] = r[s], sigma' = pi_c o sigma o pi_c^-1
    keys = np.empty((n, len(pis)), np.int64)
    r_codes = np.empty((len(maps), len(pis)), np.int64)
    s_codes = np.empty((len(sig), len(pis)), np.int64)
    for g, (pi, cp) in enumerate(zip(pis, cps)):
        r2 = np.empty_like(maps)
        r2[:, pi] = maps
        r_codes[:, g] = r2 @ base
        inv = np.argsort(cp)
        for i, s in enumerate(sig):
            s_codes[i, g] = sig_code[tuple(cp[s[inv]])]
    ps, pr = np.divmod(np.arange(n), len(maps))
    nmaps_code = int(V ** S)
    keys = s_codes[ps] * nmaps_code + r_codes[pr]  # (n, G)
    canon = keys.min(1)
    uniq, first, counts = np.unique(canon, return_index=True, return_counts=True)
    return Structures(sig, maps, ps[first], pr[first], np.log(counts.astype(np.float64)), n)


def sticky_structures(hmm: HMMConfig, stream: str = "unseen") -> Structures:
    """The orbits of the discrete part of hmm's sticky family, as drawn on `stream` (hmm.structures: the half a
    stream draws from, data/hmm.py)."""
    reason = why_not(hmm)
    if reason:
        raise ValueError(f"no exact Bayes reference: {reason}")
    half = None if hmm.structures == "all" else 0 if hmm.structures == "half" or stream in ("train", "fresh") else 1
    return _structures(hmm.n_states, hmm.n_tokens, hmm.rank, hmm.structures, half)
