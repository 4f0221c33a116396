"""Observability coefficients of emission matrices (SCIENCE.md 2).

gamma(O) = min over row vectors x != 0 with sum(x) = 0 of ||x O||_1 / ||x||_1
(O is S x V, rows are distributions). Equivalently the minimum of TV(pO, qO) over
distributions p, q with disjoint supports. 0 <= gamma <= 1; it is exactly 0 when
S > V or two rows coincide; for O = g E + (1 - g) U with E injective it is g.
A single-state emission (no nonzero sum-zero x) gets the convention gamma = 1.

Computing gamma is a nonconvex problem (a convex function minimized on the l1
unit sphere of the sum-zero subspace). Tools used, in order:

- "rank": S > V or duplicate rows -> 0, exact, nothing solved.
- a certified lower bound from an LP: for any M (V x S) with O M = I + 1 c^T,
  every sum-zero x has x = x O M, so ||x||_1 <= ||x O||_1 max_a ||M_a||_1 and
  gamma >= 1 / min_M max_a ||M_a||_1 (certified a posteriori from the solver's M
  and its residual). Often tight but not always (the l1 extension problem).
  For S == V, M = O^{-1} is forced and the pairwise form
  gamma = 2 / max_{a,b} ||M_a - M_b||_1 is exact ("inverse").
- an upper bound from a witness: pairwise vertices e_i - e_j, the LP dual's
  direction, then one LP per sign pattern (p on A, q on A^c) and single flips.
- exact: enumeration of the 2^(S-1) - 1 sign patterns (one LP each) for
  S <= exact_max_states, else a MILP (scipy HiGHS) under time_limit; if the MILP
  stops early, its dual bound joins the certified lower bound ("milp-bounds").

Whenever lower and upper meet (relative 1e-6) the result is exact. Convention:
`.value` is the exact value when `.exact`; otherwise `.value == .lower`, the
certified lower bound (the conservative number for a theorem's hypothesis);
`.upper` comes from an explicit witness x (`.witness`, sum 0, ||x||_1 = 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

_RTOL = 1e-6  # lower and upper closer than this (relative) -> exact
_DUAL_LP_MAX_NNZ = 3_000_000  # the certified-bound LP has about 2 * S * S * V nonzeros


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


def _dual_lp_bound(O: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """Certified lower bound min_M max_a ||M_a||_1 s.t. O M = I + 1 c^T, and witness directions."""
    S, V = O.shape
    K = sparse.kron(sparse.csr_matrix(O), sparse.eye(S))  # row (s, i), column (a, i) -> O[s, a]
    C = sparse.kron(np.ones((S, 1)), sparse.eye(S))
    A_eq = sparse.hstack([K, -K, -C, sparse.csr_matrix((S * S, 1))]).tocsr()
    R = sparse.kron(sparse.eye(V), np.ones((1, S)))
    A_ub = sparse.hstack([R, R, sparse.csr_matrix((V, S)), -np.ones((V, 1))]).tocsr()
    n = 2 * V * S + S + 1
    cost = np.zeros(n)
    cost[-1] = 1.0
    bounds = [(0, None)] * (2 * V * S) + [(None, None)] * S + [(0, None)]
    res = linprog(cost, A_ub=A_ub, b_ub=np.zeros(V), A_eq=A_eq, b_eq=np.eye(S).ravel(), bounds=bounds, method="highs")
    if res.status != 0:
        return 0.0, []
    M = (res.x[:V * S] - res.x[V * S:2 * V * S]).reshape(V, S)
    resid = O @ M - np.eye(S) - res.x[2 * V * S:2 * V * S + S][None, :]
    slack = 1.0 - np.abs(resid).sum(1).max()  # x = x O M - x resid for sum-zero x
    lower = max(0.0, slack) / np.abs(M).sum(1).max()
    lam = res.eqlin.marginals.reshape(S, S)  # columns are sum-zero; rank one when the bound is tight
    U = np.linalg.svd(lam)[0]
    return lower, [U[:, k] for k in range(min(3, S))]


def _inverse_bound(O: np.ndarray) -> tuple[float, np.ndarray]:
    """S == V: gamma = 2 / max_ab ||M_a - M_b||_1 with M = O^{-1}; certified via the residual."""
    S = O.shape[0]
    try:
        M = np.linalg.inv(O)
    except np.linalg.LinAlgError:
        return 0.0, np.eye(S)[0] - np.eye(S)[1]
    diam = np.abs(M[:, None, :] - M[None, :, :]).sum(-1)
    a, b = np.unravel_index(np.argmax(diam), diam.shape)
    slack = 1.0 - np.abs(O @ M - np.eye(S)).sum(1).max()
    return max(0.0, slack) * 2.0 / diam[a, b], M[a] - M[b]


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


def _milp(O: np.ndarray, time_limit: float):
    """x = x+ - x-, z_i = [x_i >= 0], sum x+ = sum x- = 1/2, min sum t, t >= |x O| (z_0 = 1 by symmetry)."""
    S, V = O.shape
    I, Z = np.eye(S), np.zeros
    cons = [LinearConstraint(np.hstack([O.T, -O.T, Z((V, S)), -np.eye(V)]), -np.inf, 0),
            LinearConstraint(np.hstack([-O.T, O.T, Z((V, S)), -np.eye(V)]), -np.inf, 0),
            LinearConstraint(np.hstack([I, Z((S, S)), -0.5 * I, Z((S, V))]), -np.inf, 0),
            LinearConstraint(np.hstack([Z((S, S)), I, 0.5 * I, Z((S, V))]), -np.inf, 0.5),
            LinearConstraint(np.kron(np.eye(2), np.ones(S)) @ np.eye(2 * S, 3 * S + V), 0.5, 0.5)]
    lb = np.zeros(3 * S + V)
    lb[2 * S] = 1.0
    ub = np.r_[np.full(2 * S, 0.5), np.ones(S), np.full(V, np.inf)]
    res = milp(np.r_[np.zeros(3 * S), np.ones(V)], constraints=cons, bounds=Bounds(lb, ub),
               integrality=np.r_[np.zeros(2 * S), np.ones(S), np.zeros(V)],
               options={"time_limit": max(time_limit, 0.01), "mip_rel_gap": 1e-9})
    x = None if res.x is None else _normalize(res.x[:S] - res.x[S:2 * S])
    dual = res.mip_dual_bound if res.mip_dual_bound is not None and np.isfinite(res.mip_dual_bound) else 0.0
    return res.status == 0, x, max(0.0, float(dual) - 1e-9)


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

    # certified lower bound and witness directions
    pairs = min(combinations(range(S), 2), key=lambda ij: np.abs(O[ij[0]] - O[ij[1]]).sum())
    starts = [eye[pairs[0]] - eye[pairs[1]]]
    name = "dual-lp"
    if S == V:
        lower, direction = _inverse_bound(O)
        starts.append(direction)
        name = "inverse"
    elif 2 * S * S * V <= _DUAL_LP_MAX_NNZ:
        lower, dirs = _dual_lp_bound(O)
        starts += dirs
    else:
        lower = 0.0
    search_deadline = time.monotonic() + 0.3 * max(deadline - time.monotonic(), 0.0)
    upper, x = _local_search(O, starts, search_deadline)

    def done(lo, up, w, how, exact_ok=True):
        lo = min(lo, up)
        if exact_ok and up - lo <= _RTOL * up + 1e-12:
            return Observability(up, True, up, up, how, w)
        return Observability(lo, False, lo, up, how, w)

    if method == "bounds":
        return done(lower, upper, x, "bounds", exact_ok=False)
    if method == "auto" and upper - lower <= _RTOL * upper + 1e-12:
        return done(lower, upper, x, name)
    if method == "enumeration" or (method == "auto" and S <= exact_max_states):
        for k in range(1, 2 ** (S - 1)):  # state S-1 always on the negative side (x and -x are equivalent)
            r, w = _pattern_lp(O, np.array([(k >> i) & 1 for i in range(S - 1)] + [0], dtype=bool))
            if r < upper:
                upper, x = r, w
        return Observability(upper, True, upper, upper, "enumeration", x)
    optimal, xm, dual = _milp(O, deadline - time.monotonic())
    if xm is not None and _ratio(xm, O) < upper:
        upper, x = _ratio(xm, O), xm
    lower = max(lower, dual)
    if optimal:  # HiGHS reached its gap: the incumbent is optimal to the solver's tolerance
        return Observability(upper, True, upper, upper, "milp", x)
    return done(lower, upper, x, "milp-bounds", exact_ok=True)


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
