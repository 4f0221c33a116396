"""The exact filter of one low-rank HMM or a batch of them (SCIENCE.md 4): the scaled forward pass in the (V, d)
representation, the dense fast path, `filter_factored` and `predictive`. Conventions: oracles.inference's docstring
(``pred[i, t, v] = p(o_t = v | o_<t)``, ``logp`` per step, missing tokens, zero beliefs).

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
- A dense HMM (Q = I, as ``HMM`` stores one without factors) runs ``dense_run``: per step
  ``b <- normalize(b * O[:, o_t]) @ [T | T O]``, one (n, S) x (S, S + V) GEMM that also yields the next
  prediction, over chunks of DENSE_CHUNK sequences, on preallocated buffers.

Imports torch, numpy and ``hmm``; must not import inference (which builds the oracles on it), the model, training, or
anything above them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..data.hmm import HMM

__all__ = ["Filtered", "Forward", "DENSE_CHUNK", "as_tensor", "kernels", "forward_run", "dense_run", "is_dense",
           "propagate", "filter_factored", "predictive"]


class Filtered(NamedTuple):
    """The exact filter's output (conventions: oracles.inference)."""

    pred: torch.Tensor | None  # (N, T, V) p(o_t = v | o_<t); None when not stored
    logp: torch.Tensor  # (N, T) log p(o_t | o_<t), 0 at missing tokens



class Forward(NamedTuple):
    pred: torch.Tensor | None  # (..., T, V) or None when not stored
    logp: torch.Tensor  # (..., T)
    final: torch.Tensor  # (..., V) the prediction after the last token



def as_tensor(x, dtype, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(device=device, dtype=dtype)


def kernels(W: torch.Tensor, Q: torch.Tensor, O: torch.Tensor):
    """K (G, S, V*d + V) and M = Q @ K (G, d, V*d + V) from W (G, S, d), Q (G, d, S), O (G, S, V).

    The last V columns of K are O itself, so that Y = b @ K also carries the prediction b @ O
    (equal to Y[:V*d].view(V, d).sum(-1), but without a slow reduction over d per step).
    """
    G, S, V = O.shape
    K = torch.cat([(O[:, :, :, None] * W[:, :, None, :]).reshape(G, S, V * W.shape[-1]), O], -1)
    return K, torch.bmm(Q, K)


def forward_run(M, Y0, tokens, V, *, reset=None, Ystart=None, start_pos=0, store=True, on_step=None):
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
    return Forward(pred, logp, P)


DENSE_CHUNK = 1024  # sequences per chunk of the dense forward: the (chunk, S) state (512 KiB at S = 128) stays in L2


def dense_run(mu, T, O, tokens, *, reset=None, start=None, start_pos=0, store=True, chunk: int = DENSE_CHUNK):
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
    return Forward(None if pred is None else pred.permute(1, 0, 2), logp, final)  # (n, L, V) view


def is_dense(W: torch.Tensor, Q: torch.Tensor) -> bool:
    """True when T = W @ Q is stored densely (Q is the S x S identity, as for a plain HMM)."""
    return Q.shape[0] == Q.shape[1] and bool(torch.equal(Q, torch.eye(Q.shape[0], dtype=Q.dtype, device=Q.device)))


def propagate(b, W, Q, steps: int):
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
    W, Q, O, mu = (as_tensor(a, dtype, device) for a in (W, Q, emission, initial))
    per_seq = W.dim() == 3 or Q.dim() == 3 or O.dim() == 3
    if per_seq:  # G = N groups of one sequence
        W, Q, O = (a.expand(N, *a.shape[-2:]) if a.dim() == 2 else a for a in (W, Q, O))
        tok = tok[:, None, :]  # (N, 1, T)
        rows = lambda b: b.reshape(-1, 1, b.shape[-1])  # noqa: E731  (N|1, 1, S)
    else:  # one group of N sequences
        W, Q, O = W[None], Q[None], O[None]
        tok = tok[None]  # (1, N, T)
        rows = lambda b: b.reshape(1, -1, b.shape[-1])  # noqa: E731  (1, N|1, S)
    if not per_seq and is_dense(W[0], Q[0]):  # one dense HMM (W = T, Q = I): the S x S scaled forward
        st = None if start is None else as_tensor(start, dtype, device)
        run = dense_run(mu, W[0], O[0], tok[0], reset=reset, start=st, start_pos=start_pos)
        return Filtered(run.pred, run.logp)
    K, M = kernels(W, Q, O)
    Y0 = torch.matmul(rows(mu), K)
    Ys = None if start is None else torch.matmul(rows(as_tensor(start, dtype, device)), K)
    run = forward_run(M, Y0, tok, O.shape[-1], reset=reset, Ystart=Ys, start_pos=start_pos)
    return Filtered(run.pred.reshape(N, *run.pred.shape[2:]), run.logp.reshape(N, -1))  # (N, T, V), (N, T)


def predictive(hmm: HMM, tokens, *, dtype=torch.float32) -> np.ndarray:
    """p(o_t | o_<t) for each row of tokens (n, length) from hmm.initial: array (n, length, V).

    A dense HMM runs the dense scaled forward, a factored one the rank-d filter. float32 by default (faster; the
    tests hold it within 1e-6 of float64, ``hmmscope bench filter`` prints the gap and the speed on the benchmark HMM);
    pass dtype=torch.float64 for more.
    """
    tok = np.atleast_2d(np.asarray(tokens))
    return filter_factored(hmm.initial, hmm.W, hmm.Q, hmm.emission, tok, dtype=dtype).pred.cpu().numpy()
