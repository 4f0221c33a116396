"""Exact inference for low-rank HMMs and their mixtures (SCIENCE.md 4). Filtering only.

Every prediction at position t uses tokens < t only (the forward algorithm, never
smoothing). Conventions used throughout:

- ``pred[i, t, v] = p(o_t = v | o_<t)``; row t = 0 is the prediction from the start
  distribution (``mu @ O``).
- ``logp[i, t] = log p(o_t | o_<t)``: the per-step log normalizer of the scaled forward
  pass (``logp.sum(-1)`` is the sequence log-likelihood). Not cumulative.
- A token outside ``[0, V)`` (the episode delimiter V, padding V+1, or -1) is *missing*:
  no evidence, the chain does not advance, ``pred`` is NaN there and ``logp`` is 0.
- After an observation of probability 0 under the model the belief becomes the zero
  vector: later predictions are 0 and ``logp`` is -inf (never NaN).

The forward pass itself (conventions above, the (V, d) representation, the dense fast path): oracles.filtering.

Fast paths (same outputs; the tests hold them to the torch path at 1e-12 in float64):
- ``mixture_oracle`` on the CPU runs the compiled kernel of ``mixture_kernel`` when numba is installed
  (one (episode, task) chain at a time, exact skipping of terms below exp(-theta) of the running max,
  total error <= MIX_TOL[dtype]); on CUDA, or without numba, the torch path (``filtering.forward_run``) runs, tasks in
  chunks (``chunks``: the chunk size on a GPU, the mixer within and the merge across chunks).

Imports torch, numpy, ``hmm`` and ``filtering`` (``chunks`` and ``mixture_kernel`` below it); must not import the
model, training, or anything above them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from ..data.hmm import HMM, Mixture
from .chunks import ChunkMerge, ChunkMixer, cuda_chunk
from .filtering import as_tensor, dense_run, filter_factored, forward_run, is_dense, kernels, propagate

__all__ = ["MixturePrediction", "task_oracle", "task_beliefs", "mixture_oracle", "nested_mixture_oracles",
           "stationary_filter", "MIX_TOL", "numba_kernel", "step_tables"]


class MixturePrediction(NamedTuple):
    """The mixture oracle's output."""

    pred: torch.Tensor  # (N, T, V) Bayes-optimal p(o_t = v | o_<t), NaN rows at non-observation tokens
    posterior: torch.Tensor | None  # p(task | tokens < position): (N, n_tasks) or (N, P, n_tasks); None if not asked


class _Layout(NamedTuple):
    tokens: torch.Tensor  # (N, T) long
    reset: torch.Tensor  # (T,) bool: the first token of every demo and of the test
    test_pos: int
    test_start: str  # "initial" | "midstream"
    burn_in: int



# ---------------------------------------------------------------- episodes


def _layout(ep) -> _Layout:
    """How an Episodes object's tokens run: its tokens, where the filter restarts, where the test starts."""
    seg = np.asarray(ep.segment)
    reset = (seg >= 0) & np.r_[True, seg[1:] != seg[:-1]]  # first token of every demo and of the test
    test_pos = int(np.flatnonzero(np.asarray(ep.test_mask))[0])
    meta = getattr(ep, "meta", None) or {}
    test_start = getattr(ep, "test_start", None) or meta.get("test_start", "initial")
    burn_in = getattr(ep, "burn_in", None)
    burn_in = int(meta.get("burn_in", 0) if burn_in is None else burn_in)
    if test_start not in ("initial", "midstream"):
        raise ValueError(f"unknown test_start {test_start!r}")
    tok = ep.tokens if isinstance(ep.tokens, torch.Tensor) else torch.as_tensor(np.asarray(ep.tokens))
    return _Layout(tok.long(), torch.as_tensor(reset), test_pos, test_start, burn_in)


def task_params(mix: Mixture, ids, dtype, device):
    """(mu, W, Q, O) of tasks ids in dtype on device (only those tasks are converted, not the whole mixture)."""
    ids = np.asarray(ids, dtype=np.int64)
    return tuple(as_tensor(np.asarray(a)[ids], dtype, device) for a in (mix.initial, mix.W, mix.Q, mix.emission))


def task_oracle(mix: Mixture, ep, *, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """p(o_t | episode tokens < t, true task) (N, T, V); NaN rows at non-observation tokens.

    Each demo restarts from mu; the test starts from mu ("initial") or mu T^B ("midstream").
    """
    tok, reset, test_pos, test_start, burn_in = _layout(ep)
    mu, W, Q, O = task_params(mix, ep.task_ids, dtype, device)
    start = propagate(mu, W, Q, burn_in) if test_start == "midstream" else None
    return filter_factored(mu, W, Q, O, tok.to(device), reset=reset, start=start, start_pos=test_pos,
                           dtype=dtype, device=device).pred


def task_beliefs(mix: Mixture, ep, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Filtered belief p(s_t | episode tokens <= t, true task) (N, T, S); NaN rows at non-observations.

    Same resets as task_oracle: each demo restarts from mu; the test starts from mu ("initial") or
    mu T^B ("midstream"). At an observation, belief = normalize(predicted belief * O[:, o_t]); the
    predicted belief for t+1 is belief @ W @ Q. A probability-0 observation gives the zero vector.
    Cost O(N T S d); memory N T S.
    """
    tok, reset, test_pos, test_start, burn_in = _layout(ep)
    mu, W, Q, O = task_params(mix, ep.task_ids, dtype, device)  # (N, S), (N, S, d), (N, d, S), (N, S, V)
    start = propagate(mu, W, Q, burn_in) if test_start == "midstream" else mu
    tok = tok.to(device)
    N, T = tok.shape
    V, tiny = O.shape[-1], torch.finfo(dtype).tiny
    out = torch.full((N, T, mu.shape[-1]), float("nan"), dtype=dtype, device=device)
    obs = (np.asarray(ep.segment) >= 0).tolist()  # observation positions (one layout for all episodes)
    reset = reset.tolist()
    b = mu
    for t in range(T):
        if t == test_pos:
            b = start
        elif t == 0 or reset[t]:
            b = mu
        if not obs[t]:
            continue
        f = b * O.gather(2, tok[:, t].clamp(0, V - 1).view(N, 1, 1).expand(N, O.shape[1], 1))[..., 0]
        f = f / f.sum(-1, keepdim=True).clamp_min(tiny)
        out[:, t] = f
        b = torch.bmm(torch.bmm(f[:, None], W), Q)[:, 0]
    return out


def mixture_oracle(mix: Mixture, ep, *, chunk_tasks: int | None = None, posterior_at=None,
                   dtype=torch.float32, device="cpu") -> MixturePrediction:
    """Bayes-optimal next-token predictor of the pretraining objective.

    pred[i, t] = sum_j p(task j | o_<t of episode i) p(o_t | o_<t, task j), the task prior being
    mix.prior and o_<t all earlier episode tokens (demos and test prefix). Tasks are processed in
    chunks of ``chunk_tasks`` (memory O(chunk * N * V * d)) merged with a running logsumexp.
    posterior_at: None, an int position, "test_start", or a sequence of positions; the posterior
    over tasks given tokens < that position (0..T) is returned as (N, n_tasks) (or (N, P, n_tasks)).
    Returns MixturePrediction(pred (N, T, V) with NaN rows at non-observation tokens, posterior or None).
    """
    tok, reset, test_pos, test_start, burn_in = _layout(ep)
    tok = tok.to(device)
    N, T = tok.shape
    V = mix.n_tokens
    if posterior_at is None:
        pos = []
    elif isinstance(posterior_at, str):
        if posterior_at != "test_start":
            raise ValueError(f"posterior_at must be a position, positions or 'test_start', got {posterior_at!r}")
        pos = [test_pos]
    else:
        pos = [int(posterior_at)] if np.isscalar(posterior_at) else [int(p) for p in posterior_at]
    if any(not 0 <= p <= T for p in pos):
        raise ValueError(f"posterior positions must lie in [0, {T}], got {pos}")
    if chunk_tasks is not None and chunk_tasks < 1:
        raise ValueError(f"chunk_tasks must be positive, got {chunk_tasks}")
    if torch.device(device).type == "cpu" and numba_kernel() is not None:
        threads = torch.get_num_threads()
        try:
            return _mixture_oracle_cpu(mix, ep, tok, reset, test_pos, test_start, burn_in, pos, posterior_at,
                                       chunk_tasks=max(chunk_tasks or 1024, 1024), dtype=dtype)[0]
        finally:  # numba's OpenMP layer resets the process's OpenMP thread count, which is torch's too
            torch.set_num_threads(threads)
    if chunk_tasks is None:
        chunk_tasks = (cuda_chunk(mix.n_tasks, N, V, mix.rank, dtype, device) if torch.device(device).type == "cuda"
                       else 256)
    logprior = torch.log(as_tensor(mix.prior, torch.float64, device)).to(dtype)
    merged = ChunkMerge(N, T, V, dtype, device)
    for lo in range(0, mix.n_tasks, chunk_tasks):
        ids = np.arange(lo, min(lo + chunk_tasks, mix.n_tasks))
        mu, W, Q, O = task_params(mix, ids, dtype, device)
        K, M = kernels(W, Q, O)
        Y0 = torch.bmm(mu[:, None], K)  # (C, 1, V*d + V)
        Ys = torch.bmm(propagate(mu, W, Q, burn_in)[:, None], K) if test_start == "midstream" else None
        mixer = ChunkMixer(logprior[lo:lo + len(ids)], N, T, V, pos)
        forward_run(M, Y0, tok[None], V, reset=reset, Ystart=Ys, start_pos=test_pos, store=False, on_step=mixer)
        mixer.snapshot(T)  # posterior after the whole episode
        merged.add(mixer)
    posterior = None
    if pos:
        posterior = torch.softmax(torch.cat(merged.post, -1), -1)
        if isinstance(posterior_at, str) or np.isscalar(posterior_at):
            posterior = posterior[:, 0]
    return MixturePrediction(merged.pred, posterior)


MIX_TOL = {torch.float32: 1e-7, torch.float64: 1e-13}  # bound on the skipped mass (see mixture_kernel)


def numba_kernel():
    """The compiled mixture kernel module, or None when numba is not installed."""
    try:
        from . import mixture_kernel  # lazy: numba (optional; ~0.5 s) only where the CPU kernel runs
    except ImportError:
        return None
    return mixture_kernel


def step_tables(mu, W, Q, O, start):
    """Per task: M_v (C, V, d, d), (Q O)^T (C, V, d), and the first-step latents (C, V, d) and predictions
    (C, V) from mu and from ``start`` (None: same as mu)."""
    C, S, V = O.shape
    d = W.shape[-1]
    K, M = kernels(W, Q, O)  # (C, S, V d + V), (C, d, V d + V)
    MM = M[..., :V * d].reshape(C, d, V, d).permute(0, 2, 1, 3).contiguous()  # (C, V, d, d)
    MpT = M[..., V * d:].transpose(1, 2).contiguous()  # (C, V, d)

    def first(b):  # b (C, S)
        Y = torch.bmm(b[:, None], K)[:, 0]  # (C, V d + V)
        return Y[:, :V * d].reshape(C, V, d).contiguous(), Y[:, V * d:].contiguous()

    Y0, P0 = first(mu)
    Ys, Ps = (Y0, P0) if start is None else first(start)
    return MM, MpT, Y0, P0, Ys, Ps


def _log_bounds(Q, O, P0, Ps) -> np.ndarray:
    """(3, C, V) float64 upper bounds on log p(o = v | past, task): after a transition (max over the
    prototypes of Q O), and the exact first predictions from mu and from the test start; with a margin
    for rounding in the kernel's dtype."""
    slack = 4 * torch.finfo(Q.dtype).eps
    QO = torch.bmm(Q.double(), O.double()).amax(1).numpy()  # (C, V)
    with np.errstate(divide="ignore"):
        return np.log(np.stack([QO, P0, Ps]).astype(np.float64) * (1 + slack) + 1e-300)


def _mixture_oracle_cpu(mix, ep, tok, reset, test_pos, test_start, burn_in, pos, posterior_at, *, chunk_tasks,
                        dtype, prefixes=()):
    """mixture_oracle on the CPU with the compiled kernel (same outputs; see mixture_kernel). prefixes: task counts
    m < n_tasks at which the running sums are read off as well (tasks in their own order, none of the episodes' own:
    anonymous episodes only). Returns (MixturePrediction, {m: pred over the first m tasks})."""
    base = numba_kernel()
    kern = base.for_rank(int(np.shape(mix.W)[-1]))  # the kernel unrolled over the rank (registers)
    import numba  # lazy: numba (optional; ~0.5 s) only where the CPU kernel runs

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))  # as torch: one per worker
    N, T = tok.shape
    V, n = mix.n_tokens, mix.n_tasks
    tok_np = tok.numpy().astype(np.int32)
    kind = np.zeros(T, np.int8)
    kind[np.asarray(reset.tolist(), bool)] = 1
    kind[0] = 1
    if test_start == "midstream":
        kind[test_pos] = 2
    snap = np.full(T + 1, -1, np.int64)
    for k, p in enumerate(pos):
        if snap[p] < 0:
            snap[p] = k
    slots = [int(snap[p]) for p in pos]
    n_snap = max(slots, default=-1) + 1
    with np.errstate(divide="ignore"):
        logprior = np.log(np.asarray(mix.prior, np.float64))
    theta = float(np.log(2 * n / MIX_TOL[dtype]))
    acc = np.zeros((N, T, V))
    wsum = np.zeros((N, T))
    mx = np.full((N, T), -np.inf)
    post = np.full((N, n_snap, n), -np.inf)  # in the processing order below
    # Order only (the result is the same within the bound): the episodes' own tasks first, in the first chunk,
    # each episode's own task first of all, so that mx reaches its final level early and the later chunks
    # skip more (a term below exp(-theta) of the running max is not added; a chain stops once none can pass).
    true = np.asarray(getattr(ep, "task_ids", np.full(N, -1)), np.int64)
    known = np.unique(true[(true >= 0) & (true < n)])
    order = np.concatenate([known, np.setdiff1d(np.arange(n), known)])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    pos_true = np.where((true >= 0) & (true < n), rank[np.clip(true, 0, n - 1)], -1)
    prefixes = sorted({int(m) for m in prefixes})
    if prefixes and (len(known) or not 1 <= prefixes[0] <= prefixes[-1] < n):
        raise ValueError(f"prefixes need anonymous episodes and 1 <= m < n_tasks = {n}, got {prefixes}")
    ends = sorted(set(range(chunk_tasks, n, chunk_tasks)) | set(prefixes) | {n})
    at_prefix = {}
    for lo, hi in zip([0, *ends[:-1]], ends):
        ids = order[lo:hi]
        mu, W, Q, Oc = task_params(mix, ids, dtype, "cpu")
        start = propagate(mu, W, Q, burn_in) if test_start == "midstream" else None
        MM, MpT, Y0, P0, Ys, Ps = (a.numpy() for a in step_tables(mu, W, Q, Oc, start))
        first = np.where((pos_true >= lo) & (pos_true < lo + len(ids)), pos_true - lo, -1)
        chunk_post = np.full((N, n_snap, len(ids)), -np.inf)  # contiguous: one kernel signature, one compile
        with base.slp_vectorize():  # read only if this call compiles
            kern.mix_chunk(tok_np, kind, snap, MM, MpT, Y0, P0, Ys, Ps, logprior[ids], first,
                           _log_bounds(Q, Oc, P0, Ps), theta, acc, wsum, mx, chunk_post)
        post[:, :, lo:lo + len(ids)] = chunk_post
        if hi in prefixes:  # the running sums over the first hi tasks: their own mixture's prediction
            at_prefix[hi] = _divide(acc, wsum, tok_np, V)
    post = post[:, :, rank]  # back to task order
    pred = _divide(acc, wsum, tok_np, V)
    posterior = None
    if pos:
        posterior = torch.softmax(torch.as_tensor(post[:, slots]), -1).to(dtype)
        if isinstance(posterior_at, str) or np.isscalar(posterior_at):
            posterior = posterior[:, 0]
    return (MixturePrediction(torch.as_tensor(pred).to(dtype), posterior),
            {m: torch.as_tensor(a).to(dtype) for m, a in at_prefix.items()})


def _divide(acc: np.ndarray, wsum: np.ndarray, tok_np: np.ndarray, V: int) -> np.ndarray:
    """The kernel's running sums as predictions (N, T, V): acc / wsum, NaN rows at non-observation tokens."""
    s = wsum[..., None]
    pred = np.divide(acc, s, out=np.zeros_like(acc), where=s > 0)
    pred[(tok_np < 0) | (tok_np >= V)] = np.nan
    return pred


def nested_mixture_oracles(mix: Mixture, ep, sizes, *, dtype=torch.float32, device="cpu",
                           chunk_tasks: int | None = None) -> dict[int, torch.Tensor]:
    """{m: pred (N, T, V)} of the mixture oracle over the first m tasks of mix (mix.subset(arange(m)), prior
    renormalized), for every m in sizes and for mix.n_tasks, on episodes that are none of these tasks' own (their
    task ids are not looked at). On the CPU kernel one pass over the n tasks gives them all (the nested mixtures'
    predictions are its running sums after the first m tasks; a constant prior shift cancels in the ratio); else
    one mixture_oracle per size."""
    n = mix.n_tasks
    sizes = sorted({int(m) for m in sizes if 1 <= int(m) < n})
    anon = _anonymous_episodes(ep)
    if torch.device(device).type == "cpu" and numba_kernel() is not None and sizes:
        tok, reset, test_pos, test_start, burn_in = _layout(anon)
        threads = torch.get_num_threads()
        try:
            whole, at = _mixture_oracle_cpu(mix, anon, tok, reset, test_pos, test_start, burn_in, [], None,
                                            chunk_tasks=max(chunk_tasks or 1024, 1024), dtype=dtype, prefixes=sizes)
        finally:  # numba's OpenMP layer resets the process's OpenMP thread count, which is torch's too
            torch.set_num_threads(threads)
        return {**at, n: whole.pred}
    out = {m: mixture_oracle(mix.subset(np.arange(m)), anon, chunk_tasks=chunk_tasks, dtype=dtype,
                             device=device).pred for m in sizes}
    out[n] = mixture_oracle(mix, anon, chunk_tasks=chunk_tasks, dtype=dtype, device=device).pred
    return out


def _anonymous_episodes(e):
    """e with task ids -1 (an oracle over other tasks must not see the episodes' own ids)."""
    if not hasattr(e, "task_ids") or (np.asarray(e.task_ids) < 0).all():
        return e
    return dataclasses.replace(e, task_ids=np.full(len(e.task_ids), -1, np.int64))


# ---------------------------------------------------------------- the filter from the stationary distribution


def stationary_filter(hmm: HMM, tokens: torch.Tensor, dtype) -> torch.Tensor:
    """Prediction after the last token of each row (n, L), filter started from hmm.stationary: (n, V). The filter
    the L-memory predictor and eps(L) run (memory.py), without storing the per-step predictions."""
    W, Q, O, pi = (as_tensor(a, dtype, "cpu") for a in (hmm.W, hmm.Q, hmm.emission, hmm.stationary))
    if is_dense(W, Q):
        return dense_run(pi, W, O, tokens, store=False).final
    K, M = kernels(W[None], Q[None], O[None])
    return forward_run(M, (pi @ K[0])[None, None], tokens[None], hmm.n_tokens, store=False).final[0]
