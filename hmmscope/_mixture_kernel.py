"""Compiled CPU kernel of the mixture oracle (numba): one (episode, task) chain at a time, in registers.

Imported lazily by ``inference.mixture_oracle`` when numba is installed and the device is the CPU; the
torch path (``inference._run``) does the same computation everywhere else and is the reference.

Per episode i and task j the filter state is the latent c (d,) of the low-rank representation and the
task's prediction P (V,); one observation o costs one (d) x (d, d + V) product with the precomputed
``MM[j, o] = [M_o | M_o Q O]`` (the next latent, unnormalized, and its prediction). The log joint
``L = log p(o_<t, task j)`` is kept in float64. The mixture prediction at t is accumulated over tasks
with an online max per (i, t): ``acc[i, t] = sum_j exp(L_j(t) - mx[i, t]) P_j(t)``, divided at the end by
``wsum[i, t] = sum_j exp(L_j(t) - mx[i, t])`` (the posterior weights, as in the torch path).

Exact skipping, bounded by theta (``err <= 2 n_tasks exp(-theta)`` in total variation of each predicted
row, and the same bound on each posterior row):
- a term with ``L_j(t) < mx[i, t] - theta`` is not added (its relative weight is below exp(-theta), and
  mx only grows as more tasks are seen, so against the final normalizer it is smaller still);
- a task's chain is stopped at t when no later term can pass that test: ``p(o_s | o_<s, j) <=
  max_state O_j[state, o_s] <= exp(lmax[o_s])`` (a prediction is a mixture of emission rows), so
  ``L_j(t') <= L_j(t) + cum[t'] - cum[t]`` with cum the prefix sums of lmax over the episode's
  observations, and the chain stops when ``L_j(t) - cum[t] < min_{t' >= t} (mx[t'] - theta - cum[t'])``.
  Its later posterior entries are reported as -inf (true relative weight < exp(-theta)).
"""

from __future__ import annotations

import math

import numba
import numpy as np

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # no 'nnan'/'ninf': log(0) = -inf is meaningful here


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True)
def mix_chunk(tok, kind, snap, MM, Y0, P0, Ys, Ps, logprior, first, lmax, theta, acc, wsum, mx, post):  # pragma: no cover
    """Accumulate one chunk of C tasks into acc (N, T, V), wsum and mx (N, T) (float64, in place).

    tok (N, T) int (outside [0, V): missing); kind (T,) int8: 1 restart from mu, 2 restart from the
    test start, 0 continue; snap (T + 1,) int: posterior slot of each position or -1; MM (C, V, d, d + V);
    Y0, Ys (C, V, d + V) first-step tables from mu / the test start; P0, Ps (C, V) their predictions;
    logprior (C,) float64; first (N,) chunk-local task to run first for each episode or -1; lmax (V,)
    float64 bound on log max_state O[state, v] over all tasks; post (N, n_snap, C) float64 (filled).
    """
    N, T = tok.shape
    C, V, d, D = MM.shape
    for i in numba.prange(N):
        c = np.zeros(d, MM.dtype)
        u = np.empty(D, MM.dtype)
        P = np.zeros(V, MM.dtype)
        cum = np.zeros(T + 1)
        for t in range(T):
            o = tok[i, t]
            cum[t + 1] = cum[t] + (lmax[o] if 0 <= o < V else 0.0)
        R = np.empty(T + 1)
        for jj in range(C):
            f0 = first[i]
            if f0 < 0:
                j = jj
            elif jj == 0:
                j = f0
            else:
                j = jj - 1 if jj - 1 < f0 else jj
            # R[t] = min over observed t' >= t of mx[t'] - theta - cum[t'] (a stale mx only lowers it)
            R[T] = np.inf
            for t in range(T - 1, -1, -1):
                o = tok[i, t]
                r = mx[i, t] - theta - cum[t] if 0 <= o < V else np.inf
                R[t] = r if r < R[t + 1] else R[t + 1]
            L = logprior[j]
            src = 1
            for t in range(T):
                k = kind[t]
                if k == 1:
                    src = 1
                    for v in range(V):
                        P[v] = P0[j, v]
                elif k == 2:
                    src = 2
                    for v in range(V):
                        P[v] = Ps[j, v]
                s = snap[t]
                if s >= 0:
                    post[i, s, j] = L
                if L - cum[t] < R[t]:  # no later term of this task can reach exp(-theta)
                    break
                o = tok[i, t]
                if o < 0 or o >= V:
                    continue
                m = mx[i, t]
                if L > m:
                    if m > -np.inf:
                        sc = math.exp(m - L)
                        for v in range(V):
                            acc[i, t, v] *= sc
                        wsum[i, t] *= sc
                    mx[i, t] = L
                    m = L
                if L >= m - theta and L > -np.inf:
                    w = math.exp(L - m)
                    for v in range(V):
                        acc[i, t, v] += w * P[v]
                    wsum[i, t] += w
                if src == 0:
                    for f in range(D):
                        u[f] = 0.0
                    for e in range(d):
                        ce = c[e]
                        for f in range(D):
                            u[f] += ce * MM[j, o, e, f]
                elif src == 1:
                    for f in range(D):
                        u[f] = Y0[j, o, f]
                else:
                    for f in range(D):
                        u[f] = Ys[j, o, f]
                src = 0
                z = P[o]
                L += math.log(z) if z > 0 else -np.inf
                if z > 0:
                    rz = 1.0 / z
                    for e in range(d):
                        c[e] = u[e] * rz
                    for v in range(V):
                        P[v] = u[d + v] * rz
                else:
                    for e in range(d):
                        c[e] = 0.0
                    for v in range(V):
                        P[v] = 0.0
            else:
                s = snap[T]
                if s >= 0:
                    post[i, s, j] = L
