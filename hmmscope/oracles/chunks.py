"""The torch path of the mixture oracle, tasks in chunks: the chunk size on a GPU, the mixer within a chunk,
and the merge across chunks.

`inference.mixture_oracle` on CUDA (or on the CPU without numba) filters the tasks of a mixture C at a time
(memory O(C N (V d + V))). Within a chunk, `ChunkMixer` (the filter's on_step callback) mixes the C tasks'
predictions by their posterior given the tokens so far, and keeps log p(o_<t, chunk) and the log weights at
the posterior positions; `ChunkMerge` folds the chunks into one prediction with a running logsumexp, which
gives exactly the mixture over all tasks. `cuda_chunk` picks C from the device's free memory.

Imports torch only; must not import inference (which imports this) or anything above it.
"""

from __future__ import annotations

import torch


class ChunkMixer:
    """on_step callback of one chunk of C tasks: mixes their predictions by their posterior within the chunk."""

    def __init__(self, logprior, N, T, V, pos):
        C, kw = logprior.shape[0], dict(dtype=logprior.dtype, device=logprior.device)
        self.pos = pos
        self.cum = logprior[:, None].expand(C, N).clone()  # log p(o_<t, task): (C, N)
        self.lse = torch.empty((N, T), **kw)  # log sum_(j in chunk) p(o_<t, j)
        self.pred = torch.empty((N, T, V), **kw)  # prediction within the chunk
        self.logw = torch.empty((len(pos), C, N), **kw)  # cum at the posterior positions

    def snapshot(self, t):
        for j in (j for j, p in enumerate(self.pos) if p == t):
            self.logw[j] = self.cum

    def __call__(self, t, P, logz):  # P (C, N, V), logz (C, N)
        m = torch.logsumexp(self.cum, 0)  # (N,)
        self.lse[:, t] = m
        w = torch.exp(self.cum - torch.where(torch.isfinite(m), m, 0))  # (C, N)
        self.pred[:, t] = (w[..., None] * P).sum(0)  # (N, V)
        self.snapshot(t)
        self.cum.add_(logz)


class ChunkMerge:
    """The chunks merged so far: pred (N, T, V) = sum_chunks exp(lse_chunk - lse) pred_chunk, with lse (N, T) =
    log sum_(tasks so far) p(o_<t, task), and each chunk's log weights at the posterior positions (N, P, C)."""

    def __init__(self, N: int, T: int, V: int, dtype, device):
        self.lse = torch.full((N, T), -float("inf"), dtype=dtype, device=device)
        self.pred = torch.zeros((N, T, V), dtype=dtype, device=device)
        self.post: list[torch.Tensor] = []

    def add(self, mixer: ChunkMixer) -> None:
        """Fold in one chunk's mixer, after its last step (and its snapshot at T)."""
        lse, chunk, logw = mixer.lse, mixer.pred, mixer.logw
        new = torch.logaddexp(self.lse, lse)
        safe = torch.where(torch.isfinite(new), new, 0)
        self.pred = self.pred * torch.exp(self.lse - safe)[..., None] + chunk * torch.exp(lse - safe)[..., None]
        self.lse = new
        if mixer.pos:
            self.post.append(logw.permute(2, 0, 1))  # (N, P, C)


def cuda_chunk(n_tasks: int, n_episodes: int, V: int, d: int, dtype, device, frac: float = 0.25) -> int:
    """Tasks per chunk of the torch path on a GPU: the largest power of two (at most n_tasks, at least 256)
    whose peak memory fits in `frac` of the device's free memory. The peak is counted as 7 (C, N, V d + V)
    arrays (the two table buffers, the update, the gathered rows, the mixer's temporaries), a bound on the peak
    that `hmmscope bench oracle --device cuda` reports (recorded: analysis/results/paper-gpu/RUN.md). Fewer,
    larger chunks mean fewer kernel launches per step (T steps x ~12 launches per chunk)."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    per_task = 7 * n_episodes * (V * d + V) * torch.finfo(dtype).bits // 8
    c = 256
    while c < n_tasks and 2 * c * per_task <= frac * free:
        c *= 2
    return min(c, n_tasks)
