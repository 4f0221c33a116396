"""The Bayes reference's results kept on disk for other processes (oracles.bayes): signed entries in this user's
private cache folder `$XDG_CACHE_HOME/hmmscope/bayes` (oracles.private_cache), and the hash of the sources that
goes into every entry's key, so a stale entry is never read.

An entry holds a result's prediction array and its fields as JSON under a key (`disk_put`); it is loaded only when
its HMAC under this user's key verifies (mixture_kernel's key) and its stored key is the one asked for, so a planted
or corrupt entry is a miss, never a number (`disk_get`). Writing is best effort: a full disk or a missing folder
only costs the next process the computation.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import io
import json
from pathlib import Path

import numpy as np

from .private_cache import cache_dir, cache_key, read_private, write_private

__all__ = ["code_hash", "disk_get", "disk_put"]

_DISK_MAGIC = b"hmmscope-bayes-1\n"
_DISK_LIMIT = 1 << 30
_SOURCES = ("bayes.py", "bayes_structures.py", "bayes_kernel.py")  # what a result depends on


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 of the Bayes reference's sources (the module, its structures and its kernel): part of a result's key."""
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / name).read_bytes() for name in _SOURCES)).hexdigest()[:16]


def _disk_path(key: tuple):
    """The cache entry of a result (the user-private folder `$XDG_CACHE_HOME/hmmscope/bayes`, as the kernels'), or
    None without a usable folder."""
    base = cache_dir("bayes")
    if base is None:
        return None
    return base / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".npz")


def disk_get(key: tuple) -> tuple[np.ndarray, dict] | None:
    """A result another process computed with the same inputs, as (pred, fields): loaded only when its HMAC under this
    user's key verifies (mixture_kernel's key), so a planted or corrupt entry is a miss, never a number."""
    path = _disk_path(key)
    if path is None or not path.exists():
        return None
    raw, k = read_private(path, _DISK_LIMIT), cache_key(path.parent)
    if raw is None or k is None or not raw.startswith(_DISK_MAGIC):
        return None
    sig, data = raw[len(_DISK_MAGIC):len(_DISK_MAGIC) + 32], raw[len(_DISK_MAGIC) + 32:]
    if not hmac.compare_digest(sig, hmac.new(k, data, "sha256").digest()):
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta["key"] != repr(key):
                return None
            return z["pred"], meta
    except (OSError, ValueError, KeyError):
        return None


def disk_put(key: tuple, pred: np.ndarray, fields: dict) -> None:
    """Keep a result (its prediction array and its JSON-safe fields) for other processes (the trials of a sweep cell
    score the same episodes); best effort."""
    path = _disk_path(key)
    k = cache_key(path.parent) if path is not None else None
    if k is None:
        return
    meta = {"key": repr(key), **fields}
    buf = io.BytesIO()
    np.savez(buf, pred=pred, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    data = buf.getvalue()
    with contextlib.suppress(OSError):
        write_private(path, _DISK_MAGIC + hmac.new(k, data, "sha256").digest() + data)
