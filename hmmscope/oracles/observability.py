"""Observability coefficients of emission matrices (SCIENCE.md 2).

gamma(O) = min over row vectors x != 0 with sum(x) = 0 of ||x O||_1 / ||x||_1
(O is S x V, rows are distributions). Equivalently the minimum of TV(pO, qO) over
distributions p, q with disjoint supports. 0 <= gamma <= 1; it is exactly 0 when
S > V or two rows coincide; for O = g E + (1 - g) U with E injective it is g.
A single-state emission (no nonzero sum-zero x) gets the convention gamma = 1.

Computing gamma is nonconvex (a convex function minimized on the l1 unit sphere
of the sum-zero subspace). Steps, in order (`.method` names the one that closed):

- "rank": S > V or two identical rows -> 0, exact, nothing solved.
- certified lower bound: for ANY M (V x S) with O M = I + 1 c^T, a sum-zero x has
  x = (x O) M with x O sum-zero, so gamma >= 2 / max_{a,b} ||M_a - M_b||_1
  (made rigorous a posteriori with the residual of O M - I - 1 c^T). M comes from
  an LP (min_M max_a ||M_a||_1; "dual-lp", when 2 S^2 V is small), from
  O^{-1} when S == V ("inverse": then M is forced and the bound is exact), or
  from pinv(O) ("pinv", cheap, for large problems). Often tight, not always.
- upper bound from a witness x: best pair e_i - e_j, smallest-l2-gain sum-zero
  directions, the LP's dual direction; each refined by one LP over its sign
  pattern (p on A, q on A^c), then single-state flips (30% of time_limit).
- exact: all 2^(S-1) - 1 sign patterns, one LP each, for S <= exact_max_states
  ("enumeration"); else a MILP (scipy HiGHS) under time_limit whose dual bound
  joins the lower bound ("milp", or "milp-bounds" if the gap stays open).

Exact means lower and upper met within relative 1e-6 (to the LP/MILP solvers'
tolerances; the upper end is always a true ratio of `.witness`). Convention:
`.value` is the exact value when `.exact`; otherwise `.value == .lower`, the
certified lower bound (the conservative number for a theorem's hypothesis).
`.witness` is a sum-zero x with ||x||_1 = 1 and ||x O||_1 == `.upper`.
method="bounds" skips the exact steps: certified lower and witness upper, exact=False.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

_RTOL = 1e-6  # lower and upper closer than this (relative) -> exact
_DUAL_LP_MAX_NNZ = 70_000  # the certified-bound LP has 2 S^2 V nonzeros; above this it is skipped (slow): pinv


@dataclass(frozen=True, eq=False)
class Observability:
    """value (exact if .exact, else == lower), lower <= gamma <= upper, method, witness x."""

    value: float
    exact: bool
    lower: float
    upper: float
    method: str
    witness: np.ndarray | None = field(default=None, repr=False)

    def __float__(self) -> float:
        return float(self.value)


def _stochastic(name: str, a, axis_len: int | None = None) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must have finite non-negative entries")
    if not np.allclose(a.sum(1), 1.0, atol=1e-5):
        raise ValueError(f"{name} rows must sum to 1")
    if axis_len is not None and a.shape[1] != axis_len:
        raise ValueError(f"{name} must have {axis_len} columns, got {a.shape[1]}")
    return a


def _ratio(x: np.ndarray, O: np.ndarray) -> float:
    return float(np.abs(x @ O).sum() / np.abs(x).sum())


def _normalize(x: np.ndarray) -> np.ndarray:
    x = x - x.mean()
    return x / np.abs(x).sum()


def _pattern_lp(O: np.ndarray, pos: np.ndarray) -> tuple[float, np.ndarray | None]:
    """min ||(p - q) O||_1 / 2 over p on `pos`, q on its complement: (ratio, witness)."""
    S, V = O.shape
    A, B = np.flatnonzero(pos), np.flatnonzero(~pos)
    if len(A) == 0 or len(B) == 0:
        return np.inf, None
    D = np.vstack([O[A], -O[B]]).T  # V x S: columns ordered A then B
    I = np.eye(V)
    A_eq = np.zeros((2, S + V))
    A_eq[0, :len(A)] = A_eq[1, len(A):S] = 1.0
    res = linprog(np.r_[np.zeros(S), np.ones(V)], A_ub=np.block([[D, -I], [-D, -I]]), b_ub=np.zeros(2 * V),
                  A_eq=A_eq, b_eq=[1.0, 1.0], bounds=(0, None), method="highs")
    if res.status != 0:
        return np.inf, None
    x = np.zeros(S)
    x[A], x[B] = res.x[:len(A)], -res.x[len(A):S]
    x = _normalize(x)
    return _ratio(x, O), x


def _certified_lower(O: np.ndarray, M: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    """For any M (V x S): a sum-zero x has x = (x O) M - x R with R = O M - I - 1 c^T and x O sum-zero,
    so gamma >= (1 - max_s ||R_s||_1) * 2 / max_ab ||M_a - M_b||_1. Returns it and the worst pair's M_a - M_b."""
    slack = 1.0 - np.abs(O @ M - np.eye(O.shape[0]) - c[None, :]).sum(1).max()
    best, pair = 0.0, (0, 1)
    for s in range(0, M.shape[0], 64):  # chunked: V x V x S at once can be large
        d = np.abs(M[s:s + 64, None, :] - M[None, :, :]).sum(-1)
        a, b = np.unravel_index(np.argmax(d), d.shape)
        if d[a, b] > best:
            best, pair = d[a, b], (s + a, b)
    lower = slack * 2.0 / best if best > 0 and slack > 0 else 0.0
    return lower, M[pair[0]] - M[pair[1]]


def _dual_lp(O: np.ndarray):
    """argmin_M max_a ||M_a||_1 s.t. O M = I + 1 c^T (an LP): (M, c, witness directions) or None."""
    S, V = O.shape
    K = sparse.kron(sparse.csr_matrix(O), sparse.eye(S))  # row (s, i), column (a, i) -> O[s, a]
    C = sparse.kron(np.ones((S, 1)), sparse.eye(S))
    A_eq = sparse.hstack([K, -K, -C, sparse.csr_matrix((S * S, 1))]).tocsr()
    R = sparse.kron(sparse.eye(V), np.ones((1, S)))
    A_ub = sparse.hstack([R, R, sparse.csr_matrix((V, S)), -np.ones((V, 1))]).tocsr()
    cost = np.zeros(2 * V * S + S + 1)
    cost[-1] = 1.0
    bounds = [(0, None)] * (2 * V * S) + [(None, None)] * S + [(0, None)]
    res = linprog(cost, A_ub=A_ub, b_ub=np.zeros(V), A_eq=A_eq, b_eq=np.eye(S).ravel(), bounds=bounds, method="highs")
    if res.status != 0:
        return None
    M = (res.x[:V * S] - res.x[V * S:2 * V * S]).reshape(V, S)
    U = np.linalg.svd(res.eqlin.marginals.reshape(S, S))[0]  # dual: sum-zero columns, rank one when tight
    return M, res.x[2 * V * S:2 * V * S + S], [U[:, k] for k in range(min(3, S))]


def _local_search(O, starts, deadline) -> tuple[float, np.ndarray]:
    """Best pattern LP from sign patterns of the start vectors, then single flips until no gain or deadline."""
    best, bx = np.inf, None
    for x in starts:
        for pos in (x > 0, x >= 0):
            r, w = _pattern_lp(O, pos)
            if r < best:
                best, bx = r, w
    improved = bx is not None
    while improved and time.monotonic() < deadline:
        improved, pos = False, bx > 0
        for i in range(O.shape[0]):
            if time.monotonic() >= deadline:
                break
            trial = pos.copy()
            trial[i] = ~trial[i]
            r, w = _pattern_lp(O, trial)
            if r < best * (1 - 1e-9):
                best, bx, improved = r, w, True
                break
    return best, bx


_FD1_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_highs_stdout():
    """HiGHS's MIP solver printf()s debug lines ("HighsMipSolverData::...") to the C-level stdout whatever its
    options say (disp=False included). Around the call, fd 1 goes to a temporary file; afterwards every other
    line written there (another thread's output) is passed on to the real stdout. One thread at a time."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # no C library to flush (e.g. Windows): leave stdout alone
        yield
        return
    fd = 1  # where printf writes, whatever sys.stdout is
    with _FD1_LOCK, tempfile.TemporaryFile() as tmp:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        libc.fflush(None)
        saved = os.dup(fd)
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            libc.fflush(None)
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            keep = b"".join(line for line in tmp.read().splitlines(keepends=True)
                            if not line.startswith(b"HighsMipSolverData::"))
            if keep:
                os.write(fd, keep)


def _milp(O: np.ndarray, time_limit: float, scale: float):
    """x = x+ - x-, z_i = [x_i >= 0], sum x+ = sum x- = 1/2, min sum t, t >= scale * |x O| (z_0 = 1 by symmetry).

    `scale` ~ 1 / gamma makes HiGHS's absolute tolerances (gap 1e-6, feasibility 1e-7) relative ones.
    Returns (incumbent x or None, dual bound on gamma)."""
    S, V = O.shape
    I, Z, OT = np.eye(S), np.zeros, scale * O.T
    cons = [LinearConstraint(np.hstack([OT, -OT, Z((V, S)), -np.eye(V)]), -np.inf, 0),
            LinearConstraint(np.hstack([-OT, OT, Z((V, S)), -np.eye(V)]), -np.inf, 0),
            LinearConstraint(np.hstack([I, Z((S, S)), -0.5 * I, Z((S, V))]), -np.inf, 0),
            LinearConstraint(np.hstack([Z((S, S)), I, 0.5 * I, Z((S, V))]), -np.inf, 0.5),
            LinearConstraint(np.kron(np.eye(2), np.ones(S)) @ np.eye(2 * S, 3 * S + V), 0.5, 0.5)]
    lb = np.zeros(3 * S + V)
    lb[2 * S] = 1.0
    ub = np.r_[np.full(2 * S, 0.5), np.ones(S), np.full(V, np.inf)]
    with _no_highs_stdout():
        res = milp(np.r_[np.zeros(3 * S), np.ones(V)], constraints=cons, bounds=Bounds(lb, ub),
                   integrality=np.r_[np.zeros(2 * S), np.ones(S), np.zeros(V)],
                   options={"time_limit": max(time_limit, 0.01), "mip_rel_gap": 1e-9, "disp": False})
    x = None if res.x is None else _normalize(res.x[:S] - res.x[S:2 * S])
    dual = res.mip_dual_bound if res.mip_dual_bound is not None and np.isfinite(res.mip_dual_bound) else 0.0
    return x, max(0.0, float(dual) / scale)


def observability(emission, *, time_limit: float = 10.0, exact_max_states: int = 8,
                  method: str = "auto") -> Observability:
    """gamma(O) for an S x V row-stochastic O; see the module docstring for methods and conventions.

    method: "auto", or force "enumeration", "milp", or "bounds" (certified bounds only, never exact).
    time_limit bounds the MILP and the local search (seconds, roughly the whole call).
    """
    if method not in ("auto", "enumeration", "milp", "bounds"):
        raise ValueError(f"unknown method {method!r}")
    O = _stochastic("emission", emission)
    S, V = O.shape
    deadline = time.monotonic() + time_limit
    if S == 1:
        return Observability(1.0, True, 1.0, 1.0, "trivial", None)
    eye = np.eye(S)
    if S > V:  # sum-zero subspace (dim S-1) cannot inject into the image's (dim <= V-1)
        x = _normalize(np.linalg.svd(np.vstack([O.T, np.ones(S)]))[2][-1])
        return Observability(0.0, True, 0.0, 0.0, "rank", x)
    _, first, counts = np.unique(O, axis=0, return_index=True, return_counts=True)
    if np.any(counts > 1):
        i = first[np.argmax(counts > 1)]
        j = next(k for k in range(S) if k != i and np.array_equal(O[k], O[i]))
        return Observability(0.0, True, 0.0, 0.0, "rank", (eye[i] - eye[j]) / 2)

    # certified lower bound (from some M with O M = I + 1 c^T) and witness directions
    pair = min(combinations(range(S), 2), key=lambda ij: np.abs(O[ij[0]] - O[ij[1]]).sum())
    B = np.linalg.svd(np.ones((1, S)))[2][1:]  # orthonormal basis of the sum-zero subspace
    U = np.linalg.svd(B @ O)[0]
    starts = [eye[pair[0]] - eye[pair[1]]] + [U[:, -k] @ B for k in range(1, min(3, S))]  # smallest l2 gains
    name, M, c = "pinv", None, np.zeros(S)
    if S < V and 2 * S * S * V <= _DUAL_LP_MAX_NNZ:
        sol = _dual_lp(O)
        if sol is not None:
            (M, c, dirs), name = sol, "dual-lp"
            starts += dirs
    if M is None:  # S == V: M = O^{-1} is forced up to c and the bound is exact; S < V: a cheap bound
        M, name = np.linalg.pinv(O), ("pinv" if S < V else "inverse")
    lower, direction = _certified_lower(O, M, c)
    starts.append(direction)
    search_deadline = time.monotonic() + 0.3 * max(deadline - time.monotonic(), 0.0)
    upper, x = _local_search(O, starts, search_deadline)

    def done(lo, up, w, how, exact_ok=True):
        lo, up = float(min(lo, up)), float(up)
        if exact_ok and up - lo <= _RTOL * up + 1e-12:
            return Observability(up, True, up, up, how, w)
        return Observability(lo, False, lo, up, how + ("" if how == "bounds" else "-bounds"), w)

    if method == "bounds":
        return done(lower, upper, x, "bounds", exact_ok=False)
    if method == "auto" and upper - lower <= _RTOL * upper + 1e-12:
        return done(lower, upper, x, name)
    if method == "enumeration" or (method == "auto" and S <= exact_max_states):
        for k in range(1, 2 ** (S - 1)):  # state S-1 always on the negative side (x and -x are equivalent)
            r, w = _pattern_lp(O, np.array([(k >> i) & 1 for i in range(S - 1)] + [0], dtype=bool))
            if r < upper:
                upper, x = r, w
        return Observability(float(upper), True, float(upper), float(upper), "enumeration", x)
    xm, dual = _milp(O, deadline - time.monotonic(), 1.0 / max(upper, 1e-12))
    if xm is not None and _ratio(xm, O) < upper:
        upper, x = _ratio(xm, O), xm
    # exact (to HiGHS's tolerances) when its dual bound meets the incumbent, else certified bounds
    return done(max(lower, dual), upper, x, "milp")


def gamma_eff(Q, emission, **kw) -> Observability:
    """Observability of Q @ O (d x V): the set where predicted beliefs live (rows of Q are its vertices)."""
    O = _stochastic("emission", emission)
    Q = _stochastic("Q", Q, O.shape[0])
    return observability(Q @ O, **kw)


def m_step_emission(transition, emission, m: int) -> np.ndarray:
    """(S, V**m): row s = P(o_1..o_m | current state s); o_1 from s, then the chain moves; o_1 most significant."""
    O = _stochastic("emission", emission)
    T = _stochastic("transition", transition, O.shape[0])
    if T.shape[0] != O.shape[0]:
        raise ValueError(f"transition must be ({O.shape[0]}, {O.shape[0]}), got {T.shape}")
    if int(m) != m or m < 1:
        raise ValueError(f"m must be a positive integer, got {m}")
    S, V = O.shape
    if S * V ** m > 2 ** 27:
        raise ValueError(f"S * V**m = {S * V ** m} entries is too large")
    P = O
    for _ in range(int(m) - 1):
        P = (O[:, :, None] * (T @ P)[:, None, :]).reshape(S, -1)
    return P


def gamma_m(hmm, m: int, **kw) -> Observability:
    """m-step observability (paper Assumption 4): observability(m_step_emission(T, O, m))."""
    return observability(m_step_emission(hmm.transition, hmm.emission, m), **kw)
