"""Seed streams: every random stream hmmscope draws comes from `rng(*keys)` (SCIENCE.md 9, "Seed streams").

A stream is numpy's SeedSequence over a list of non-negative integer keys, usually (seed, TAG, ...) with a tag
that names the module's use. numpy pads a short entropy list with zeros, so [s, t, c, 0] and [s, t, c] are the
same stream: a key list ending in 0 would silently share its stream with the list without that 0. `entropy`
refuses such a list, so two key lists of one shape that differ anywhere give different streams. Callers that
append an optional key (a replicate) append a length marker after it (`with_replicate`), so that "no replicate"
and every replicate, 0 included, are distinct streams.
"""

from __future__ import annotations

import numpy as np


def entropy(*keys: int) -> list[int]:
    """The checked entropy list of a stream: non-negative ints whose last one is non-zero."""
    out = [int(k) for k in keys]
    if not out:
        raise ValueError("a seed stream needs at least one key")
    if any(k < 0 for k in out):
        raise ValueError(f"seed-stream keys must be >= 0, got {out}")
    if out[-1] == 0:
        raise ValueError(f"a seed-stream key list may not end in 0 (numpy's SeedSequence ignores trailing zeros, so "
                         f"it would be the stream of {out[:-1]}): got {out}")
    return out


def with_replicate(keys: list[int] | tuple[int, ...], replicate: int | None) -> list[int]:
    """keys, then (replicate, 1) when a replicate is given: the trailing 1 marks the length, so replicate 0 is not
    the stream without a replicate, and replicates r != r' never share a stream."""
    keys = [int(k) for k in keys]
    return keys if replicate is None else [*keys, int(replicate), 1]


def sequence(*keys: int) -> np.random.SeedSequence:
    """SeedSequence(entropy(*keys))."""
    return np.random.SeedSequence(entropy(*keys))


def rng(*keys: int) -> np.random.Generator:
    """A Generator on the stream of keys (entropy's rules)."""
    return np.random.default_rng(sequence(*keys))
