"""The probes' inputs: which positions are probed, and the residual streams there, layer by layer.

Residuals. Layer 0 is the embedding (hook_embed), layer l the output of block l-1; the residual at
sequence position t has seen tokens <= t. Probed positions: the test segment, `positions_per_episode`
of them per episode (seeded, without replacement; None = all). `collect_residuals` streams layers in
chunks whose (N, P, D) float32 outputs fit `mem_budget` bytes (stop_early forwards). `model` is a
Transformer, or a callable fn(tokens (B, T) long, layer, episode_idx (B,)) -> (B, T, D) with n_layers=.

Owns `PROBE_TAG`, the tag that separates every probe stream from other users of the seed. Imports torch and
the model only inside functions (the fits' worker processes import this package without torch); must not
import sklearn or the other probe modules.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ...data import seeds

if TYPE_CHECKING:
    import torch

PROBE_TAG = 0x50524F42  # "PROB": separates the probe streams from other users of the seed


def sample_positions(ep, per_episode: int | None, seed: int = 0) -> np.ndarray:
    """(N, P) sorted sequence positions in the test segment, P = per_episode of them per episode (seeded)."""
    cand = np.flatnonzero(np.asarray(ep.test_mask))
    N = len(ep.task_ids)
    if per_episode is None or per_episode >= len(cand):
        return np.broadcast_to(cand, (N, len(cand))).copy()
    r = seeds.rng(seed, PROBE_TAG).random((N, len(cand)))
    return cand[np.sort(np.argsort(r, 1)[:, :per_episode], 1)]


class Residuals:
    """Residual streams at probed positions `pos` (N, P); iterate for (layer, X (N, P, D) float32)."""

    def __init__(self, fn, tokens: torch.Tensor, pos: np.ndarray, layers, batch_size: int, mem_budget: int):
        self.fn, self.tokens, self.pos, self.layers = fn, tokens, pos, list(layers)
        self.batch_size, self.mem_budget, self.seconds = batch_size, mem_budget, 0.0

    def _chunk(self, layers) -> dict[int, np.ndarray]:
        import torch  # lazy: torch off the fits' worker processes (they import this package without torch)

        t0, (N, P) = time.perf_counter(), self.pos.shape
        out: dict[int, np.ndarray] = {}
        tok, pos = self.tokens[:, :int(self.pos.max()) + 1], torch.as_tensor(self.pos)
        for lo in range(0, N, self.batch_size):
            idx = np.arange(lo, min(lo + self.batch_size, N))
            acts = self.fn(tok[idx], layers, idx)
            for l in layers:
                a = acts[l]
                sel = a[torch.arange(len(idx), device=a.device)[:, None], pos[torch.as_tensor(idx)].to(a.device)]
                if l not in out:
                    out[l] = np.empty((N, P, a.shape[-1]), np.float32)
                out[l][idx] = sel.detach().float().cpu().numpy()
        self.seconds += time.perf_counter() - t0
        return out

    def __iter__(self):
        done = 0
        while done < len(self.layers):
            per_layer = None if done == 0 else self._bytes
            n = 1 if per_layer is None else max(1, int(self.mem_budget // max(per_layer, 1)))
            chunk = self.layers[done:done + n]
            out = self._chunk(chunk)
            self._bytes = next(iter(out.values())).nbytes
            for l in chunk:
                yield l, out.pop(l)
            done += len(chunk)

    def get(self, layer: int) -> np.ndarray:
        return self._chunk([layer])[layer]


def collect_residuals(model, ep, *, positions: Any = "test", layers=None, n_layers: int | None = None,
                      positions_per_episode: int | None = None, seed: int = 0, device="cpu", batch_size: int = 64,
                      mem_budget: int = 1 << 30) -> Residuals:
    """Lazy per-layer residuals of `model` on ep at `positions` ("test": sample_positions; or (P,) / (N, P)).

    A Transformer is moved to `device` and put in eval mode; activations come back as CPU float32.
    """
    import torch  # lazy: here, not at the top: the fits' worker processes import this module without torch

    from ...model.transformer import resid_names, run_with_cache  # lazy: the model (and torch) off the fits' worker processes

    tokens = torch.as_tensor(np.asarray(ep.tokens).astype(np.int64))
    N = tokens.shape[0]
    if isinstance(positions, str):
        if positions != "test":
            raise ValueError(f"positions must be 'test' or an array of positions, got {positions!r}")
        pos = sample_positions(ep, positions_per_episode, seed)
    else:
        pos = np.broadcast_to(np.asarray(positions, dtype=np.int64), (N, np.shape(positions)[-1])).copy()
    if hasattr(model, "blocks"):  # a Transformer: one forward per batch and chunk, stopped early
        names, dev = resid_names(len(model.blocks)), torch.device(device)
        model.to(dev).eval()

        def fn(tok, ls, _idx):
            _, cache = run_with_cache(model, tok.to(dev), names=[names[l] for l in ls], stop_early=True)
            return {l: cache[names[l]] for l in ls}
        n_layers = len(names)
    else:
        if n_layers is None:
            raise ValueError("n_layers is required when model is a callable")
        call = model

        def fn(tok, ls, idx):
            return {l: torch.as_tensor(call(tok, l, idx)) for l in ls}
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    return Residuals(fn, tokens, pos, layers, batch_size, mem_budget)
