"""Compiled CPU kernel of the Bayes-optimal reference (numba): one (episode, hypothesis) chain at a time.

Imported by ``bayes`` (the reference, SCIENCE.md 10), which builds the hypotheses: a structure of the family (the
cluster permutation and the revealing map) with one draw of its continuous parameters, or one task of an explicit
list. Dense S x S transitions (the exact reference is computed for small S only).

Per episode i and hypothesis h the filter keeps the predicted belief ``alpha`` (S,), normalized, and its log scale:
``L_h(t) = log prior_h + log p(o_<t | h)``. The prediction of h at t is ``alpha @ O_h`` and the mixture over h is
accumulated as in the mixture kernel, with an online max per (i, t): ``acc[i, t] = sum_h exp(L_h(t) - mx[i, t])
P_h(t)``, ``wsum[i, t] = sum_h exp(L_h(t) - mx[i, t])``. A term below ``exp(-theta)`` of the running max is not added
(its relative weight is below exp(-theta); the caller's theta bounds the total skipped mass).

Starts. Each segment (demonstration, test) starts afresh (``kind[t] == 1``; ``kind[t] == 2``: the test starts
midstream, after ``burn_in`` hidden steps). Two kinds of start:
- fixed (``urn_w`` has no levels): every segment starts from the hypothesis' own ``start[h]`` (a task's mu): the
  mixture oracle's computation, on an explicit list of tasks;
- Dirichlet (the family's mu ~ Dir(a)): mu is integrated exactly. The start states a_1, a_2, ... of the segments are
  then a Polya urn: p(a_{m+1} = a | a_1..a_m) = (a + c_a) / (S a + m) with c the counts of the earlier starts, so a
  segment starts from the urn's predictive under the posterior of the earlier starts: ``pi = sum_c U(c) urn(. | c)``
  with U(c) the normalized weight of the count vector c of the earlier starts given their segments. After a segment,
  ``U'(c + e_a) += U(c) urn(a | c) f(a)`` with ``f(a) = p(segment | its start a)`` from a backward pass. The count
  vectors of each level m (the number of segments done) are the caller's tables: ``urn_next[m, c, a]`` (the index of
  c + e_a at level m + 1) and ``urn_w[m, c, a]`` (the urn's factor), ``n_cv[m]`` of them.

Tokens: >= 0 an observation; -1 missing (no evidence, the chain does not advance: delimiters, padding); -2 a hidden
step (the chain advances without evidence: the steps before a window, SCIENCE.md 10's windowed reference).
"""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import numba
import numpy as np

from . import mixture_kernel

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # no 'nnan'/'ninf': log(0) = -inf is meaningful here


@numba.njit(fastmath=_FASTMATH)
def bayes_block(tok, seg_lo, seg_hi, seg_kind, Tm, Om, reveal, gamma, hyp_g, hyp_r, logw, start, n_cv, urn_next, urn_w,
                burn_in, theta, order, acc, wsum, mx):  # pragma: no cover
    """Add every hypothesis' terms to acc (N, Tn, V), wsum (N, Tn) and mx (N, Tn) (module docstring).

    tok (N, Tn) int32; segments j: positions [seg_lo[j], seg_hi[j]), seg_kind[j] 1 (from the start) or 2 (midstream
    test: burn_in hidden steps first); Tm (NT, G, S, S) transitions (NT = 1: shared by the episodes, else per
    episode); Om (R, S, V) emissions; hypothesis h uses Tm[., hyp_g[h]], Om[hyp_r[h]], log prior logw[h]; start (H, S)
    fixed starts (used when n_cv is empty); n_cv (J,), urn_next / urn_w (J, C, S) the urn's tables.

    order (N, H): the hypotheses of episode i in the order processed (likely ones first: the running max then reaches
    its level early and the stopping rule below cuts more). A hypothesis' chain stops at t when no later term of it
    can pass the theta test: p(o_s | past, h) <= max_a O_h[a, o_s] at every step (the predicted belief, and every
    start vector, is a distribution), so L_h(t') <= L_h(t) + cum[t'] - cum[t] with cum the prefix sums of those
    bounds' logs, and the chain stops when L_h(t) - cum[t] < min_{t' >= t} (mx[i, t'] - theta - cum[t']) (the mixture
    kernel's rule; mx only grows, so the stopped terms stay below exp(-theta) of the final normalizer).

    Revealing emissions (reveal (R, S) not empty): O[a, v] = (1 - gamma) / V + gamma [reveal[a] == v] (the family's,
    data/hmm.py emission_matrix); Om is then not read, and acc holds only the gamma part: the caller adds
    (1 - gamma) / V wsum (each term's prediction is that constant plus gamma alpha[a] at token reveal[a]).
    """
    N, Tn = tok.shape
    NT = Tm.shape[0]
    S = Tm.shape[2]
    V = acc.shape[2]
    H = hyp_g.shape[0]
    J = seg_lo.shape[0]
    urn = n_cv.shape[0] > 0
    rev = reveal.shape[0] > 0
    lo_e = (1.0 - gamma) / V
    C = urn_w.shape[1] if urn else 1
    alpha = np.empty(S)
    nxt = np.empty(S)
    beta = np.empty(S)
    pi = np.empty(S)
    f = np.empty(S)
    U = np.empty(C)
    U2 = np.empty(C)
    cum = np.empty(Tn + 1)
    R = np.empty(Tn + 1)
    obs = np.empty(Tn, np.int64)
    seen = np.empty(J, np.bool_)
    log_hi = math.log(lo_e + gamma) if rev else 0.0
    log_lo = math.log(lo_e) if rev and lo_e > 0.0 else -math.inf
    for i in range(N):
        ti = 0 if NT == 1 else i
        n_obs = 0  # the observed positions of episode i, in order, and the segments with one
        for t in range(Tn):
            if tok[i, t] >= 0:
                obs[n_obs] = t
                n_obs += 1
        for j in range(J):
            seen[j] = False
            for t in range(seg_lo[j], seg_hi[j]):
                if tok[i, t] >= 0:
                    seen[j] = True
                    break
        for hh in range(H):
            h = order[i, hh]
            T = Tm[ti, hyp_g[h]]
            O = Om[0 if rev else hyp_r[h]]
            rv = reveal[hyp_r[h] if rev else 0]
            L = logw[h]
            # stopping bounds over the observations q = 0..n_obs-1: cum[q] = the sum of log max_a O[a, o] over the
            # observations before q, R[q] = min over q' >= q of mx - theta - cum (the suffix minimum)
            cs = 0.0
            for q in range(n_obs):
                cum[q] = cs
                o = tok[i, obs[q]]
                if rev:
                    hit = False
                    for a in range(S):
                        if rv[a] == o:
                            hit = True
                    cs += log_hi if hit else log_lo
                else:
                    top = 0.0
                    for a in range(S):
                        if O[a, o] > top:
                            top = O[a, o]
                    cs += math.log(top) if top > 0.0 else -math.inf
            r = math.inf
            for q in range(n_obs - 1, -1, -1):
                rq = mx[i, obs[q]] - theta - cum[q]
                if rq < r:
                    r = rq
                R[q] = r
            qi = 0
            dead = False
            U[0] = 1.0
            level = 0
            for j in range(J):
                lo = seg_lo[j]
                hi = seg_hi[j]
                if not seen[j]:  # nothing observed (a window's hidden past): f = 1, the urn's counts move unseen
                    if urn and j < J - 1:
                        nn = n_cv[level + 1]
                        for c in range(nn):
                            U2[c] = 0.0
                        for c in range(n_cv[level]):
                            uc = U[c]
                            if uc != 0.0:
                                for a in range(S):
                                    U2[urn_next[level, c, a]] += uc * urn_w[level, c, a]
                        for c in range(nn):
                            U[c] = U2[c]
                        level += 1
                    continue
                if urn:
                    for a in range(S):
                        pi[a] = 0.0
                    for c in range(n_cv[level]):
                        uc = U[c]
                        if uc != 0.0:
                            for a in range(S):
                                pi[a] += uc * urn_w[level, c, a]
                else:
                    for a in range(S):
                        pi[a] = start[h, a]
                for a in range(S):
                    alpha[a] = pi[a]
                if seg_kind[j] == 2:
                    for _ in range(burn_in):
                        for b in range(S):
                            nxt[b] = 0.0
                        for a in range(S):
                            x = alpha[a]
                            for b in range(S):
                                nxt[b] += x * T[a, b]
                        for b in range(S):
                            alpha[b] = nxt[b]
                la = 0.0  # log p(tokens of this segment before t | h, earlier segments); alpha sums to 1
                for t in range(lo, hi):
                    o = tok[i, t]
                    if o == -1:
                        continue
                    if o >= 0:
                        Lt = L + la
                        if Lt - cum[qi] < R[qi]:  # no later term of this hypothesis can reach exp(-theta)
                            dead = True
                            break
                        qi += 1
                        m = mx[i, t]
                        d = Lt - m
                        if d > 0.0:
                            sc = math.exp(-d) if m > -math.inf else 0.0
                            for v in range(V):
                                acc[i, t, v] *= sc
                            wsum[i, t] *= sc
                            mx[i, t] = Lt
                            w = 1.0
                        elif d < -theta:
                            w = 0.0
                        else:
                            w = math.exp(d)
                        if w > 0.0:
                            if rev:
                                wg = w * gamma
                                for a in range(S):
                                    acc[i, t, rv[a]] += wg * alpha[a]
                            else:
                                for v in range(V):
                                    p = 0.0
                                    for a in range(S):
                                        p += alpha[a] * O[a, v]
                                    acc[i, t, v] += w * p
                            wsum[i, t] += w
                        z = 0.0
                        for a in range(S):
                            alpha[a] *= (lo_e + gamma if rv[a] == o else lo_e) if rev else O[a, o]
                            z += alpha[a]
                        if z <= 0.0:
                            la = -math.inf
                            break
                        la += math.log(z)
                        for a in range(S):
                            alpha[a] /= z
                    for b in range(S):
                        nxt[b] = 0.0
                    for a in range(S):
                        x = alpha[a]
                        for b in range(S):
                            nxt[b] += x * T[a, b]
                    for b in range(S):
                        alpha[b] = nxt[b]
                L += la
                if dead or L == -math.inf:
                    break
                if urn and j < J - 1:
                    # f(a) = p(this segment | its start a), scaled by its max: beta(s) = p(o_t.. | s_t = s)
                    for a in range(S):
                        beta[a] = 1.0
                    for t in range(hi - 1, lo - 1, -1):
                        o = tok[i, t]
                        if o == -1:
                            continue
                        for a in range(S):
                            x = 0.0
                            for b in range(S):
                                x += T[a, b] * beta[b]
                            nxt[a] = x
                        bm = 0.0
                        for a in range(S):
                            e = 1.0 if o < 0 else (lo_e + gamma if rv[a] == o else lo_e) if rev else O[a, o]
                            beta[a] = nxt[a] * e
                            if beta[a] > bm:
                                bm = beta[a]
                        if bm > 0.0:
                            for a in range(S):
                                beta[a] /= bm
                    for a in range(S):
                        f[a] = beta[a]
                    if seg_kind[j] == 2:
                        for _ in range(burn_in):
                            for a in range(S):
                                x = 0.0
                                for b in range(S):
                                    x += T[a, b] * f[b]
                                nxt[a] = x
                            for a in range(S):
                                f[a] = nxt[a]
                    nn = n_cv[level + 1]
                    for c in range(nn):
                        U2[c] = 0.0
                    for c in range(n_cv[level]):
                        uc = U[c]
                        if uc != 0.0:
                            for a in range(S):
                                U2[urn_next[level, c, a]] += uc * urn_w[level, c, a] * f[a]
                    tot = 0.0
                    for c in range(nn):
                        tot += U2[c]
                    for c in range(nn):
                        U[c] = U2[c] / tot if tot > 0.0 else 0.0
                    level += 1


def _install_own_cache() -> None:
    """The same signed on-disk cache as the mixture kernel's (mixture_kernel.install_cache)."""
    src = Path(__file__).read_text()
    tag = hashlib.sha256(src.encode()).hexdigest()[:12]
    try:
        mixture_kernel.install_cache(sys.modules[__name__], src, f"hmmscope_bayeskernel_{tag}", kernels=("bayes_block",))
    except OSError:
        pass


_install_own_cache()
