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

Representation. With T = W Q every predicted belief after the first token is ``c @ Q``
with c a distribution over the d prototypes. Define, for one HMM,
``K[s, (v, e)] = O[s, v] W[s, e]`` (S, V*d) and ``M = Q @ K`` (d, V*d). For a predicted
belief b (S-space, e.g. mu) put ``Y = b @ K``, for a latent c put ``Y = c @ M``;
viewed as (V, d):

    Y[v, :].sum()     = p(o_t = v | o_<t)      (prediction)
    Y[o_t] / p(o_t)   = c_{t+1}                (update; renormalized every step)

so one (d x V*d) matmul per token gives both; the cost is O(V d^2) per token (the same
as O(S d) at the paper's S = 128, V = 16, d = 8) and everything stays nonnegative.

Fast paths (same outputs; the tests hold them to the paths above at 1e-12 in float64):
- A dense HMM (Q = I, as ``HMM`` stores one without factors) runs ``_dense_run``: per step
  ``b <- normalize(b * O[:, o_t]) @ [T | T O]``, one (n, S) x (S, S + V) GEMM that also yields the next
  prediction, over chunks of DENSE_CHUNK sequences, on preallocated buffers.
- ``mixture_oracle`` on the CPU runs the compiled kernel of ``mixture_kernel`` when numba is installed
  (one (episode, task) chain at a time, exact skipping of terms below exp(-theta) of the running max,
  total error <= MIX_TOL[dtype]); on CUDA, or without numba, the torch path (``_run``) runs, tasks in
  chunks (``chunks``: the chunk size on a GPU, the mixer within and the merge across chunks).

Imports torch, numpy and ``hmm`` (``chunks`` and ``mixture_kernel`` below it); must not import the
model, training, or anything above them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from ..data.hmm import HMM, Mixture
from .chunks import ChunkMerge, ChunkMixer, cuda_chunk

__all__ = ["Filtered", "MixturePrediction", "filter_factored", "predictive", "task_oracle", "mixture_oracle",
           "nested_mixture_oracles", "stationary_filter"]


class Filtered(NamedTuple):
    """The exact filter's output (conventions above)."""

    pred: torch.Tensor | None  # (N, T, V) p(o_t = v | o_<t); None when not stored
    logp: torch.Tensor  # (N, T) log p(o_t | o_<t), 0 at missing tokens


class MixturePrediction(NamedTuple):
    """The mixture oracle's output."""

    pred: torch.Tensor  # (N, T, V) Bayes-optimal p(o_t = v | o_<t), NaN rows at non-observation tokens
    posterior: torch.Tensor | None  # p(task | tokens < position): (N, n_tasks) or (N, P, n_tasks); None if not asked


class _Forward(NamedTuple):
    pred: torch.Tensor | None  # (..., T, V) or None when not stored
    logp: torch.Tensor  # (..., T)
    final: torch.Tensor  # (..., V) the prediction after the last token


class _Layout(NamedTuple):
    tokens: torch.Tensor  # (N, T) long
    reset: torch.Tensor  # (T,) bool: the first token of every demo and of the test
    test_pos: int
    test_start: str  # "initial" | "midstream"
    burn_in: int


def _t(x, dtype, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(device=device, dtype=dtype)


def _kernels(W: torch.Tensor, Q: torch.Tensor, O: torch.Tensor):
    """K (G, S, V*d + V) and M = Q @ K (G, d, V*d + V) from W (G, S, d), Q (G, d, S), O (G, S, V).

    The last V columns of K are O itself, so that Y = b @ K also carries the prediction b @ O
    (equal to Y[:V*d].view(V, d).sum(-1), but without a slow reduction over d per step).
    """
    G, S, V = O.shape
    K = torch.cat([(O[:, :, :, None] * W[:, :, None, :]).reshape(G, S, V * W.shape[-1]), O], -1)
    return K, torch.bmm(Q, K)


def _run(M, Y0, tokens, V, *, reset=None, Ystart=None, start_pos=0, store=True, on_step=None):
    """Scaled forward pass in the (V, d) representation.

    M (G, d, V*d + V); Y0 (G|1, B|1, V*d + V) used at t = 0 and at reset positions; tokens
    (G|1, B, T); reset (T,) bool or None; Ystart (G|1, B|1, V*d + V) used at t = start_pos
    (overrides a reset there). on_step(t, P (G, B, V), logz (G, B)) is called after each step
    (P is NaN at missing tokens). Returns pred (G, B, T, V) or None, logp (G, B, T), and the
    prediction after the last token (G, B, V).
    """
    G, D = M.shape[0], M.shape[2]
    Vd = D - V
    B, T = tokens.shape[1], tokens.shape[2]
    dtype, dev = M.dtype, M.device
    missing = (tokens < 0) | (tokens >= V)  # (G|1, B, T)
    any_missing = missing.any(dim=(0, 1)).tolist() if T else []
    idx = tokens.clamp(0, V - 1)  # (G|1, B, T)
    if idx.shape[0] == 1:  # tokens shared by the groups: pick row b * V + o_b along dim 1
        flat = (torch.arange(B, device=dev)[:, None] * V + idx[0]).T.contiguous()  # (T, B)
        pick = lambda X, t: X.reshape(G, B * V, -1).index_select(1, flat[t])  # noqa: E731  (G, B, k)
    else:  # row (g B + b) V + o_gb of the flattened table (index_select is much faster than gather)
        flat = (torch.arange(G * B, device=dev).view(G, B, 1) * V + idx).reshape(G * B, T).T.contiguous()
        pick = lambda X, t: X.reshape(G * B * V, -1).index_select(0, flat[t]).view(G, B, -1)  # noqa: E731
    reset = [False] * T if reset is None else torch.as_tensor(reset).bool().tolist()
    pred = torch.empty((G, B, T, V), dtype=dtype, device=dev) if store else None
    logp = torch.empty((G, B, T), dtype=dtype, device=dev)
    tiny = torch.finfo(dtype).tiny
    Mu, Mp = M[..., :Vd], M[..., Vd:]  # (G, d, V*d), (G, d, V)
    Ybuf = [torch.empty((G, B, Vd), dtype=dtype, device=dev) for _ in range(2)]
    Pbuf = [torch.empty((G, B, V), dtype=dtype, device=dev) for _ in range(2)]
    Y, P = Y0[..., :Vd].expand(G, B, Vd), Y0[..., Vd:].expand(G, B, V)
    for t in range(T):
        if t == 0 or reset[t]:
            Y, P = Y0[..., :Vd].expand(G, B, Vd), Y0[..., Vd:].expand(G, B, V)
        if Ystart is not None and t == start_pos:
            Y, P = Ystart[..., :Vd].expand(G, B, Vd), Ystart[..., Vd:].expand(G, B, V)
        # Y: (G, B, V*d) joint table for o_t; P: (G, B, V) = p(o_t = . | o_<t)
        u = pick(Y, t)  # (G, B, d) = Y[g, b, o_t, :]
        z = pick(P, t)  # (G, B, 1) = p(o_t | o_<t)
        c = u / z.clamp_min(tiny)  # (G, B, d) next latent
        if store:
            pred[:, :, t] = P
        Ynew = torch.bmm(c, Mu, out=Ybuf[t % 2])
        Pnew = torch.bmm(c, Mp, out=Pbuf[t % 2])
        z = z[..., 0]
        if any_missing[t]:
            m = missing[:, :, t].expand(G, B)
            Ynew = torch.where(m[..., None], Y, Ynew)
            Pnew = torch.where(m[..., None], P, Pnew)
            z = torch.where(m, torch.ones((), dtype=dtype, device=dev), z)
            P = P.masked_fill(m[..., None], float("nan"))
            if store:
                pred[:, :, t] = P
        logz = torch.log(z)
        logp[:, :, t] = logz
        if on_step is not None:
            on_step(t, P, logz)
        Y, P = Ynew, Pnew
    return _Forward(pred, logp, P)


DENSE_CHUNK = 1024  # sequences per chunk of the dense forward: the (chunk, S) state (512 KiB at S = 128) stays in L2


def _dense_run(mu, T, O, tokens, *, reset=None, start=None, start_pos=0, store=True, chunk: int = DENSE_CHUNK):
    """Batched scaled forward pass of one dense HMM: per step ``alpha <- normalize(alpha * O[:, o_t]) @ T``.

    mu (S,); T (S, S); O (S, V); tokens (n, L) long; start (n, S) or (S,) or None. Same conventions and
    outputs as ``_run`` (pred (n, L, V) or None, logp (n, L), prediction after the last token (n, V)).
    Sequences are processed in chunks of ``chunk`` rows (the (chunk, S) state stays in cache); each step
    is one (chunk, S) x (S, S + V) GEMM that yields the next predicted belief and its prediction ``b @ O``
    together, plus a few in-place elementwise ops on preallocated buffers (nothing is allocated per step).
    """
    n, L = tokens.shape
    S, V = O.shape
    dtype, dev = O.dtype, O.device
    TO = torch.cat([T, T @ O], 1)  # (S, S + V): b_{t+1} and b_{t+1} @ O in one product
    OT = torch.cat([O.T, torch.ones((1, S), dtype=dtype, device=dev)])  # (V + 1, S); row V: missing token
    missing = (tokens < 0) | (tokens >= V)  # (n, L)
    tok = torch.where(missing, V, tokens).T.contiguous()  # (L, n)
    miss_t = missing.T.contiguous()  # (L, n)
    reset = [False] * L if reset is None else torch.as_tensor(reset).bool().tolist()
    start = None if start is None else start.expand(n, S)
    init = torch.cat([mu, mu @ O])  # (S + V,) belief and prediction at a (re)start
    pred = torch.empty((L, n, V), dtype=dtype, device=dev) if store else None  # time-major: contiguous writes
    z = torch.empty((L, n), dtype=dtype, device=dev)  # p(o_t | o_<t)
    final = torch.empty((n, V), dtype=dtype, device=dev)
    tiny = torch.finfo(dtype).tiny
    c = min(chunk, max(n, 1))
    E, f = (torch.empty((c, S), dtype=dtype, device=dev) for _ in range(2))
    buf = [torch.empty((c, S + V), dtype=dtype, device=dev) for _ in range(2)]
    rz = torch.empty((c, 1), dtype=dtype, device=dev)
    zcol = S + torch.where(missing, 0, tokens).T  # (L, n): column of o_t's prediction in the (S + V) state
    zidx = (zcol + (S + V) * (torch.arange(n, device=dev) % c)).contiguous()  # flat index into a chunk's state
    for lo in range(0, n, c):
        hi = min(lo + c, n)
        m = hi - lo
        E_, f_, rz_ = E[:m], f[:m], rz[:m]
        cur = init.expand(m, S + V)  # (m, S + V): predicted belief b_t | its prediction b_t @ O
        zc = z[:, lo:hi]
        any_missing = miss_t[:, lo:hi].any(1).tolist()
        for t in range(L):
            if reset[t] or t == 0:
                cur = init.expand(m, S + V)
            if start is not None and t == start_pos:
                s = start[lo:hi]
                cur = torch.cat([s, s @ O], 1)
            if store:
                pred[t, lo:hi] = cur[:, S:]
            if cur.is_contiguous():
                torch.take(cur, zidx[t, lo:hi], out=zc[t])
            else:  # a (re)start: the shared initial prediction
                torch.index_select(init, 0, zcol[t, lo:hi], out=zc[t])
            torch.clamp(zc[t, :, None], min=tiny, out=rz_).reciprocal_()
            torch.index_select(OT, 0, tok[t, lo:hi], out=E_)
            torch.mul(cur[:, :S], E_, out=f_)
            f_.mul_(rz_)  # filtered belief; a probability-0 observation leaves the zero vector
            nxt = torch.mm(f_, TO, out=buf[t % 2][:m])  # (m, S + V)
            if any_missing[t]:  # no evidence: the chain does not advance
                nxt.copy_(torch.where(miss_t[t, lo:hi, None], cur, nxt))
            cur = nxt
        final[lo:hi] = cur[:, S:]
    logp = torch.log(z.T)
    if missing.any():
        logp.masked_fill_(missing, 0.0)
        if store:
            pred.masked_fill_(missing.T[..., None], float("nan"))
    return _Forward(None if pred is None else pred.permute(1, 0, 2), logp, final)  # (n, L, V) view


def _dense(W: torch.Tensor, Q: torch.Tensor) -> bool:
    """True when T = W @ Q is stored densely (Q is the S x S identity, as for a plain HMM)."""
    return Q.shape[0] == Q.shape[1] and bool(torch.equal(Q, torch.eye(Q.shape[0], dtype=Q.dtype, device=Q.device)))


def _propagate(b, W, Q, steps: int):
    """b T^steps for b (G, S), W (G, S, d), Q (G, d, S)."""
    for _ in range(steps):
        b = torch.bmm(torch.bmm(b[:, None], W), Q)[:, 0]
    return b


def filter_factored(initial, W, Q, emission, tokens, *, reset=None, start=None, start_pos: int = 0,
                    dtype=torch.float32, device=None) -> Filtered:
    """Batched exact filter: ``Filtered(pred (N, T, V), logp (N, T))`` (see module docstring).

    initial (N, S) or (S,); W (N, S, d) or (S, d); Q (N, d, S) or (d, S); emission (N, S, V)
    or (S, V); tokens (N, T) int. Shared parameters (no leading N) are never copied N times.
    reset (T,) bool: a new independent sequence starts at t (belief back to ``initial``).
    start (N, S) or (S,): the belief before the token at ``start_pos`` (default 0) instead.
    Shared dense parameters (Q the S x S identity) take the dense scaled forward (``_dense_run``).
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    tok = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens)
    tok = tok.to(device=device, dtype=torch.long)
    N = tok.shape[0]
    W, Q, O, mu = (_t(a, dtype, device) for a in (W, Q, emission, initial))
    per_seq = W.dim() == 3 or Q.dim() == 3 or O.dim() == 3
    if per_seq:  # G = N groups of one sequence
        W, Q, O = (a.expand(N, *a.shape[-2:]) if a.dim() == 2 else a for a in (W, Q, O))
        tok = tok[:, None, :]  # (N, 1, T)
        rows = lambda b: b.reshape(-1, 1, b.shape[-1])  # noqa: E731  (N|1, 1, S)
    else:  # one group of N sequences
        W, Q, O = W[None], Q[None], O[None]
        tok = tok[None]  # (1, N, T)
        rows = lambda b: b.reshape(1, -1, b.shape[-1])  # noqa: E731  (1, N|1, S)
    if not per_seq and _dense(W[0], Q[0]):  # one dense HMM (W = T, Q = I): the S x S scaled forward
        st = None if start is None else _t(start, dtype, device)
        run = _dense_run(mu, W[0], O[0], tok[0], reset=reset, start=st, start_pos=start_pos)
        return Filtered(run.pred, run.logp)
    K, M = _kernels(W, Q, O)
    Y0 = torch.matmul(rows(mu), K)
    Ys = None if start is None else torch.matmul(rows(_t(start, dtype, device)), K)
    run = _run(M, Y0, tok, O.shape[-1], reset=reset, Ystart=Ys, start_pos=start_pos)
    return Filtered(run.pred.reshape(N, *run.pred.shape[2:]), run.logp.reshape(N, -1))  # (N, T, V), (N, T)


def predictive(hmm: HMM, tokens, *, dtype=torch.float32) -> np.ndarray:
    """p(o_t | o_<t) for each row of tokens (n, length) from hmm.initial: array (n, length, V).

    A dense HMM runs the dense scaled forward, a factored one the rank-d filter. float32 by default (faster; the
    tests hold it within 1e-6 of float64, ``hmmscope bench filter`` prints the gap and the speed on the benchmark HMM);
    pass dtype=torch.float64 for more.
    """
    tok = np.atleast_2d(np.asarray(tokens))
    return filter_factored(hmm.initial, hmm.W, hmm.Q, hmm.emission, tok, dtype=dtype).pred.cpu().numpy()


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
    return tuple(_t(np.asarray(a)[ids], dtype, device) for a in (mix.initial, mix.W, mix.Q, mix.emission))


def task_oracle(mix: Mixture, ep, *, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """p(o_t | episode tokens < t, true task) (N, T, V); NaN rows at non-observation tokens.

    Each demo restarts from mu; the test starts from mu ("initial") or mu T^B ("midstream").
    """
    tok, reset, test_pos, test_start, burn_in = _layout(ep)
    mu, W, Q, O = task_params(mix, ep.task_ids, dtype, device)
    start = _propagate(mu, W, Q, burn_in) if test_start == "midstream" else None
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
    start = _propagate(mu, W, Q, burn_in) if test_start == "midstream" else mu
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
    logprior = torch.log(_t(mix.prior, torch.float64, device)).to(dtype)
    merged = ChunkMerge(N, T, V, dtype, device)
    for lo in range(0, mix.n_tasks, chunk_tasks):
        ids = np.arange(lo, min(lo + chunk_tasks, mix.n_tasks))
        mu, W, Q, O = task_params(mix, ids, dtype, device)
        K, M = _kernels(W, Q, O)
        Y0 = torch.bmm(mu[:, None], K)  # (C, 1, V*d + V)
        Ys = torch.bmm(_propagate(mu, W, Q, burn_in)[:, None], K) if test_start == "midstream" else None
        mixer = ChunkMixer(logprior[lo:lo + len(ids)], N, T, V, pos)
        _run(M, Y0, tok[None], V, reset=reset, Ystart=Ys, start_pos=test_pos, store=False, on_step=mixer)
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
    K, M = _kernels(W, Q, O)  # (C, S, V d + V), (C, d, V d + V)
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
        start = _propagate(mu, W, Q, burn_in) if test_start == "midstream" else None
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
    W, Q, O, pi = (_t(a, dtype, "cpu") for a in (hmm.W, hmm.Q, hmm.emission, hmm.stationary))
    if _dense(W, Q):
        return _dense_run(pi, W, O, tokens, store=False).final
    K, M = _kernels(W[None], Q[None], O[None])
    return _run(M, (pi @ K[0])[None, None], tokens[None], hmm.n_tokens, store=False).final[0]
