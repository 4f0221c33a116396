"""In-context learners that know no training task (SCIENCE.md 8, 9): counting baselines, fair (fitted) counting
baselines and an EM-fitted HMM.

They tell in-context inference from retrieval: none of them has seen a training task, so whatever they reach
comes from the episode itself. All return the predictive convention of inference.py and evaluate.py:
``pred[i, t, v] = p(token_t = v | episode tokens < t)``, an (N, T, V) float64 torch tensor over the V
observation ids, NaN rows where the learner makes no prediction (delimiters and ids outside [0, V); for the
HMM learner, every token outside the test segment).

Contexts (all counting baselines). The context of the observation token at position t is every observation
token at positions < t of the same episode: the demonstrations and the test prefix. Delimiters (and any id
outside [0, V)) are never counted; ``ep.segment`` says what is a delimiter, never the id. All are defined at
every observation token, t = 0 included (an empty context gives 1/V, as the oracles predict from mu there).
Scored tokens: evaluate.figure1 scores every predictor on the same tokens as the model: the test-segment tokens
at positions t >= 1 of the episode truncated to its LAST k demonstrations (episodes.truncate_demos), i.e. all
l_test test tokens when k >= 1 and test tokens 1..l_test-1 when k = 0; the context of a token there is the k
kept demonstrations and the test prefix (never the dropped demos).

Add-one counting (exactly SCIENCE.md 8). With c_v the count of v in the context and n = sum_v c_v:

- ``incontext_unigram``: p(v) = (c_v + 1) / (n + V).
- ``incontext_bigram``: when token t - 1 lies in the same sequence (demo or test segment) as t, with
  u = o_{t-1}: p(v | u) = (c_uv + 1) / (c_u. + V), where c_uv counts the adjacent pairs (o_{s-1}, o_s) = (u, v)
  with s - 1 and s in one sequence and s < t (the pair ends before t; pairs never cross a delimiter), and
  c_u. = sum_v c_uv. For the first token of a sequence (t - 1 is a delimiter, or t = 0): the unigram above.

Fair counting baselines (exactly SCIENCE.md 9; names in FAIR_COUNTING). Let r(t) be the number of tokens of
t's own segment before t (its position in the segment; an id outside [0, V) breaks the run as a delimiter
would, which sampled episodes never have).

- ``incontext_ngram(ep, order, alpha)``: h = min(order - 1, r(t)), u = the h tokens before t;
  p(v | u) = (c(u v) + alpha) / (c(u .) + V alpha), c(u v) the occurrences of the (h+1)-gram u v that lie
  inside one segment and end before t. Order 1 is the add-alpha unigram; order 2, alpha 1 is incontext_bigram.
  Computed per gram length m: the m-grams of a chunk of episodes are grouped by (episode, u) in time order,
  and an exclusive cumulative one-hot count within each group gives every member its c(u .) vector; exact
  float64 integers, so it equals a per-token loop to rounding.
- ``incontext_ctw(ep, depth D, alpha=0.5)``: context-tree weighting. The context of token t is c_1..c_D, c_j
  the token j places before t when r(t) >= j, else the start symbol V. A node is a suffix c_1..c_j (j = 0..D,
  the root empty) over V + 1 symbols and keeps the counts a_s(v) of the tokens that followed it; P_e(s) is the
  sequential add-alpha estimate prod (a_s(v) + alpha) / (n_s + V alpha) over its tokens in order (alpha = 1/2:
  Krichevsky-Trofimov); P_w(s) = P_e(s) at depth D, else 1/2 P_e(s) + 1/2 prod over visited children P_w(s c)
  (an unvisited child counts 1); p(x_t = v | past) = P_w(root | past, v) / P_w(root | past). One tree per
  episode, accumulated over all its segments, in log space (logaddexp). One pass over time with every episode
  of a chunk at once: at step t the D + 1 nodes of t's path are updated bottom-up for all V candidates;
  per node the counts, log P_e, log P_w and log prod of the visited children's P_w (updated by new / old when a
  child changes). Nodes live in a compact table of the (episode, context) pairs the episode visits, never the
  (V + 1)^D dense tree. The predictive sums to 1 to rounding (not renormalized); it equals a recomputation of
  the whole tree per candidate to 1e-13 in log-probability (V = 8, depth 3, 132 tokens).

Fitted settings (SCIENCE.md 9, ``fit_counting`` -> ``CountingFit``). On episodes of FIT tasks (never the
evaluation episodes), for each k: every (order, alpha) n-gram and every (depth, alpha) CTW over ALPHAS x
ORDERS / DEPTHS is scored on Figure 1's tokens of the episodes truncated to their last k demos (CE = mean over
episodes of the per-episode mean of -log p); per k the n-gram and the CTW of lowest CE are kept, and
best_counting is the lower of the two. Ties go to the simpler setting: lower order / depth, then larger
alpha, and the n-gram over the CTW. CountingFit.params() gives the choices as flat MLflow params
(counting.k{k}.ngram_order ...), CountingFit.predict(ep, k) the three predictions on episodes truncated to k.
The n-gram's counts are computed once per order and reused over the alphas; CTW's estimates depend on alpha,
so each depth is one pass that carries all 8 alphas at once (its counts are shared).

Costs (measured on the shared 2-core CPU, OMP_NUM_THREADS=1): fit_counting at the main job's size (the `tiny`
preset: V = 8, 4 demos x 24 + 32 test tokens; 512 fit episodes; k = 0..4; 8 alphas x orders 1-3 x depths 1-3)
takes 2.0 s at load average 4.8 (0.5 s of it the n-grams plus depth 1 alone); in `hmmscope bench counting` it
took 1.6, 3.1 and 3.5 s (load 2.6-5.2), a median 10.4x the add-one bigram on the same 5 truncations. At the
paper's shape (V = 16, 6 x 48 + 64 = 358 positions, 1024 episodes), the same runs: incontext_ngram order 3
0.30x the bigram's time (median; bigram 1.1-3.4 s), incontext_ctw depth 3 0.75x; peak RSS 0.5 GiB
(analysis/results/bench/RUN.md).

EM-fitted HMM (``incontext_hmm``; ``HMMLearner`` holds its settings). A learner that knows the family's form
(a hidden Markov chain emitting tokens) but none of its tasks: per episode, a categorical HMM with
``n_states`` hidden states (default 8; ``HMMLearner.for_family(S)`` gives min(S, EM_STATES_CAP = 8)) is fit by
Baum-Welch (EM) to the episode's demonstrations alone, each demo a separate sequence started from the fitted
initial distribution; ``restarts`` random initializations (Dirichlet(1) rows for start, transition and
emission), ``iters`` EM iterations each (fixed, no early stop, so every episode and restart costs the same);
the restart with the highest final log-likelihood of the demonstrations is kept. The M-step is MAP with a
symmetric Dirichlet(1 + ``pseudocount``) prior on every row (hmmlearn's ``*_prior = 1 + pseudocount``):
expected counts + pseudocount, normalized. The pseudocount keeps every emission probability positive, so a
test token that never occurs in the demonstrations has finite CE. The test segment is then filtered with
hmmscope's own scaled forward filter (inference.filter_factored with T = A, Q = I), from the fitted initial
distribution, or from pi A^B for a "midstream" test after B burn-in steps (as the oracles do with the true
parameters). With k = 0 there is nothing to fit: it predicts the uniform distribution 1/V at every test token
(CE = log V; its accuracy is then argmax's tie-break, token 0).
Seeding: the restarts of the fit of (episode, k) come from SeedSequence([seed, _EM_TAG, k, l_demo, a 128-bit
sha256 of the k demonstrations it is fit to]): a fit depends on the learner and its own sequences only, so
fitting one k, a subset of the episodes, or episodes already truncated gives the same bits as Figure 1's
batch (the per-token reductions are also written so that their order does not depend on the batch).
All episodes, every k and every restart are fit together: one batched scaled forward-backward over the
demonstration sequences (rows) per iteration, tensors (rows, n_states), float64, no loop over episodes.
Cost at the `tiny` size (512 episodes, k = 0..4, 4 restarts x 30 iterations; load average 3.7): 7.5 s with
8 states, 28.3 s with 16.

Ties. Accuracy takes argmax over the V ids, ties going to the lowest id (torch.argmax), for every predictor.

This module imports torch, numpy and hmmscope's inference (the filter) and episodes (truncate_demos); never the model,
training or tracking.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

__all__ = ["incontext_unigram", "incontext_bigram", "incontext_ngram", "incontext_ctw", "fit_counting", "CountingFit",
           "HMMLearner", "DEFAULT_LEARNER", "EMFit", "fit_hmm_em", "incontext_hmm", "COUNTING", "FAIR_COUNTING", "ALPHAS",
           "ORDERS", "DEPTHS", "EM_STATES_CAP"]

COUNTING = ("incontext_unigram", "incontext_bigram")
_BIGRAM_CHUNK_BYTES = 64 << 20  # peak of the bigram's cumulative pair counts per chunk of episodes
_NGRAM_CHUNK_BYTES = 64 << 20  # the n-gram's per-gram-length count arrays per chunk of episodes
_CTW_CHUNK_BYTES = 96 << 20  # CTW node tables (+ its output) per chunk of episodes
_EM_TAG = 0x454D484D  # "EMHM": the EM learner's initializations
EM_CHUNK_BYTES = 256 << 20  # working set of one chunk of EM fits
EM_STATES_CAP = 8  # HMMLearner.for_family: at most this many hidden states (config.EM_STATES_CAP, which eval.em_states = 0 uses)


def _tokens(ep) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens (N, T) int64, segment (T,) int64, V) of an Episodes-like object."""
    tok = ep.tokens.numpy() if isinstance(ep.tokens, torch.Tensor) else np.asarray(ep.tokens)
    return tok.astype(np.int64), np.asarray(ep.segment, np.int64), int(ep.n_tokens)


def _onehot(tok: np.ndarray, obs: np.ndarray, V: int) -> np.ndarray:
    """(N, T, V) float64: one-hot of each observation token, zero rows elsewhere (delimiters, ids outside [0, V))."""
    N, T = tok.shape
    ok = obs[None, :] & (tok >= 0) & (tok < V)  # (N, T)
    X = np.zeros((N, T, V))
    n_idx, t_idx = np.nonzero(ok)
    X[n_idx, t_idx, tok[n_idx, t_idx]] = 1.0
    return X


def _unigram(X: np.ndarray) -> np.ndarray:
    """p(v) = (c_v + 1) / (n + V) from the counts of the tokens strictly before t: (N, T, V)."""
    V = X.shape[-1]
    C = np.cumsum(X, 1) - X  # exclusive: tokens at positions < t
    return (C + 1.0) / (C.sum(-1, keepdims=True) + V)


def incontext_unigram(ep) -> torch.Tensor:
    """Add-one unigram of the episode's observation tokens before t (module docstring): (N, T, V) float64."""
    tok, seg, V = _tokens(ep)
    obs = seg >= 0
    p = _unigram(_onehot(tok, obs, V))
    p[:, ~obs] = np.nan
    p[(tok < 0) | (tok >= V)] = np.nan
    return torch.from_numpy(p)


def incontext_bigram(ep) -> torch.Tensor:
    """Add-one bigram over the adjacent in-sequence pairs ending before t, unigram at a sequence's first token
    (module docstring): (N, T, V) float64."""
    tok, seg, V = _tokens(ep)
    N, T = tok.shape
    obs = seg >= 0
    valid = obs[None, :] & (tok >= 0) & (tok < V)  # (N, T) observation tokens
    X = _onehot(tok, obs, V)
    out = _unigram(X)
    # pair (t-1, t): both observations of one sequence (a delimiter separates sequences; so does t = 0)
    pair = np.zeros((N, T), bool)
    pair[:, 1:] = valid[:, 1:] & valid[:, :-1] & (seg[1:] == seg[:-1])[None, :]
    chunk = max(1, _BIGRAM_CHUNK_BYTES // (8 * max(T, 1) * V * V))
    for lo in range(0, N, chunk):
        hi = min(lo + chunk, N)
        n = hi - lo
        P = np.zeros((n, T, V * V))  # pair indicator at its end position, index u V + v
        ii, tt = np.nonzero(pair[lo:hi])
        P[ii, tt, tok[lo + ii, tt - 1] * V + tok[lo + ii, tt]] = 1.0
        Cp = np.cumsum(P, 1) - P  # pairs ending strictly before t
        del P
        ii, tt = np.nonzero(pair[lo:hi])  # tokens predicted from their predecessor u = o_{t-1}
        u = tok[lo + ii, tt - 1]
        rows = Cp.reshape(n, T, V, V)[ii, tt, u]  # (m, V): c_u. per v
        out[lo + ii, tt] = (rows + 1.0) / (rows.sum(-1, keepdims=True) + V)
    out[~valid] = np.nan
    return torch.from_numpy(out)


# ---------------------------------------------------------------- fair counting baselines (SCIENCE.md 9)


def _runs(tok: np.ndarray, seg: np.ndarray, V: int) -> tuple[np.ndarray, np.ndarray]:
    """valid (N, T) bool: observation tokens with an id in [0, V); run (N, T) int64: how many valid tokens of t's
    own segment come just before t without a break (its position in the segment, for sampled episodes; an id
    outside [0, V) breaks a run as a delimiter does)."""
    N, T = tok.shape
    valid = (seg >= 0)[None, :] & (tok >= 0) & (tok < V)
    brk = np.ones((N, T), bool)  # t starts a run: t - 1 is not a valid token of t's segment
    brk[:, 1:] = ~(valid[:, :-1] & (seg[1:] == seg[:-1])[None, :])
    t = np.arange(T)
    return valid, t - np.maximum.accumulate(np.where(brk, t, 0), axis=1)


def _chunks(N: int, per_episode: int, budget: int):
    """Slices of episodes whose working set stays under budget bytes (at least one episode each)."""
    step = max(1, budget // max(per_episode, 1))
    return [slice(lo, min(lo + step, N)) for lo in range(0, N, step)]


def _ngram_counts(tok: np.ndarray, valid: np.ndarray, run: np.ndarray, V: int, order: int) -> np.ndarray:
    """C (N, T, V) float64: C[i, t, v] = c(u v) of incontext_ngram (u: the h = min(order - 1, run) tokens before
    t), zero rows where t is not a valid token. For each gram length m = h + 1, the m-grams are grouped by
    (episode, context u) in time order; the exclusive cumulative one-hot count within a group is, at each
    member t, the counts of u v over the m-grams of that group ending before t."""
    N, T = tok.shape
    C = np.zeros((N, T, V))
    h = np.minimum(order - 1, run)
    for sl in _chunks(N, 3 * T * V * 8, _NGRAM_CHUNK_BYTES):
        n = sl.stop - sl.start
        if V ** (order - 1) * n >= 2 ** 62:
            raise ValueError(f"incontext_ngram: order {order} is too large for {V} tokens")
        tk, ok, rn, hh = tok[sl], valid[sl], run[sl], h[sl]
        for m in range(1, order + 1):
            ii, tt = np.nonzero(ok & (rn >= m - 1))  # every m-gram of the chunk, by its end position
            key = ii.copy()
            for j in range(m - 1, 0, -1):  # (episode, u_1 .. u_{m-1}) in base V
                key = key * V + tk[ii, tt - j]
            o = np.argsort(key, kind="stable")  # groups of one (episode, u), each in time order
            ii, tt, key = ii[o], tt[o], key[o]
            X = np.zeros((len(o), V))
            X[np.arange(len(o)), tk[ii, tt]] = 1.0
            cs = np.cumsum(X, 0) - X  # exclusive, over all groups
            del X
            start = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, bool)
            cs -= cs[np.flatnonzero(start)][np.cumsum(start) - 1]  # within its group only
            q = hh[ii, tt] == m - 1  # the tokens predicted with this gram length
            C[sl.start + ii[q], tt[q]] = cs[q]
    return C


def _check_size(name: str, size, what: str) -> None:
    """An n-gram order (>= 1) or a CTW depth (>= 0), as an integer."""
    low = 1 if what == "order" else 0
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < low:
        raise ValueError(f"{name}: {what} must be an integer >= {low}, got {size!r}")


def _check_alpha(name: str, alpha) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or not (
            np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"{name}: alpha must be a finite number > 0, got {alpha!r}")


def incontext_ngram(ep, order: int, alpha: float) -> torch.Tensor:
    """Add-alpha n-gram of the episode's observation tokens before t (SCIENCE.md 9; module docstring):
    (N, T, V) float64, NaN rows at delimiters and ids outside [0, V). Order 1 is a unigram; order 2 with
    alpha = 1 is incontext_bigram."""
    _check_size("incontext_ngram", order, "order")
    _check_alpha("incontext_ngram", alpha)
    tok, seg, V = _tokens(ep)
    valid, run = _runs(tok, seg, V)
    C = _ngram_counts(tok, valid, run, V, int(order))
    p = (C + alpha) / (C.sum(-1, keepdims=True) + V * alpha)
    p[~valid] = np.nan
    return torch.from_numpy(p)


def _ctw_logp(tok: np.ndarray, valid: np.ndarray, run: np.ndarray, V: int, depth: int, alphas, full: bool) -> np.ndarray:
    """CTW log predictives for several alphas at once (the counts are shared; the estimates are not).

    Returns (A, N, T, V) log p(x_t = v | past) when full, else (A, N, T) log p(x_t = o_t | past); NaN where t
    is not a valid token. One pass over time, every episode of a chunk at once: at step t the D + 1 nodes on
    t's context path are gathered, the candidate updates of log P_e and log P_w are computed bottom-up for all
    v (or the observed token only), and the observed token's are written back. Per node: the counts a_s(v)
    (shared by the alphas), and per alpha log P_e, log P_w and log prod over visited children of P_w (kept
    incrementally: when a child's P_w changes, the product changes by new / old). Nodes live in a compact table
    of the (episode, context) pairs the episode visits (np.unique), never the (V + 1)^D dense tree; an unvisited
    node has P_e = P_w = 1 (log 0), so "an unvisited child counts 1" is the table's initial value."""
    a = np.asarray(alphas, np.float64)
    A, D, (N, T) = len(a), int(depth), tok.shape
    out = np.full((A, N, T, V) if full else (A, N, T), np.nan)
    n_nodes = sum((V + 1) ** j for j in range(D + 1))  # suffixes c_1..c_j, j = 0..D, over V + 1 symbols
    off = np.cumsum([0] + [(V + 1) ** j for j in range(D)])  # first node of each depth
    ar, la = a[:, None, None], a[:, None, None, None]
    half = math.log(0.5)
    if n_nodes * max(N, 1) >= 2 ** 62:
        raise ValueError(f"incontext_ctw: depth {D} is too large for {V} tokens")
    steps = [t for t in range(T) if valid[:, t].any()]
    per_ep = T * (D + 1) * (V + 3 * A + 4) * 8 + (A * T * V * 8 if full else A * T * 8)
    for sl in _chunks(N, per_ep, _CTW_CHUNK_BYTES):
        n = sl.stop - sl.start
        tk, ok, rn = tok[sl], valid[sl], run[sl]
        node = np.zeros((n, T, D + 1), np.int64)  # node of depth j on t's context path
        code = np.zeros((n, T), np.int64)
        for j in range(1, D + 1):
            c = np.full((n, T), V, np.int64)  # c_j: the token j places back, or the start symbol V
            c[:, j:] = np.where(rn[:, j:] >= j, tk[:, :-j], V)
            code = code + c * (V + 1) ** (j - 1)
            node[:, :, j] = off[j] + code
        key = (np.arange(n)[:, None, None] * n_nodes + node)[ok]  # (m, D + 1) at the valid tokens
        slots, inv = np.unique(key, return_inverse=True)
        slot = np.zeros((n, T, D + 1), np.int64)
        slot[ok] = inv.reshape(key.shape)
        cnt = np.zeros((len(slots), V))  # a_s(v)
        lpe, lpw, lprod = (np.zeros((A, len(slots))) for _ in range(3))
        for t in steps:
            e = np.flatnonzero(ok[:, t])
            if not len(e):
                continue
            s, x = slot[e, t], tk[e, t]  # (m, D + 1), (m,)
            m = len(e)
            cs = cnt[s]  # (m, D + 1, V)
            den = np.log(cs.sum(-1) + V * ar)  # (A, m, D + 1)
            pe_old, pw_old, pr_old = lpe[:, s], lpw[:, s], lprod[:, s]  # (A, m, D + 1)
            rest = pr_old[:, :, :D] - pw_old[:, :, 1:]  # log prod over the other visited children
            if full:
                pe = pe_old[..., None] + np.log(cs + la) - den[..., None]  # (A, m, D + 1, V)
                pw = np.empty_like(pe)
                pw[:, :, D] = pe[:, :, D]
                for j in range(D - 1, -1, -1):
                    pw[:, :, j] = half + np.logaddexp(pe[:, :, j], rest[:, :, j, None] + pw[:, :, j + 1])
                out[:, sl.start + e, t] = pw[:, :, 0] - pw_old[:, :, 0, None]
                idx = np.broadcast_to(x[None, :, None, None], (A, m, D + 1, 1))
                pe, pw = np.take_along_axis(pe, idx, -1)[..., 0], np.take_along_axis(pw, idx, -1)[..., 0]
            else:
                pe = pe_old + np.log(cs[np.arange(m), :, x] + ar) - den  # (A, m, D + 1)
                pw = np.empty_like(pe)
                pw[:, :, D] = pe[:, :, D]
                for j in range(D - 1, -1, -1):
                    pw[:, :, j] = half + np.logaddexp(pe[:, :, j], rest[:, :, j] + pw[:, :, j + 1])
                out[:, sl.start + e, t] = pw[:, :, 0] - pw_old[:, :, 0]
            cnt[s, x[:, None]] += 1.0  # the D + 1 nodes of one episode are distinct: no repeated index
            lpe[:, s] = pe
            lpw[:, s] = pw
            lprod[:, s[:, :D]] = pr_old[:, :, :D] + (pw[:, :, 1:] - pw_old[:, :, 1:])
    return out


def incontext_ctw(ep, depth: int, alpha: float = 0.5) -> torch.Tensor:
    """Context-tree weighting of depth D over the episode's observation tokens before t, with the add-alpha
    sequential estimate at every node (alpha = 1/2: Krichevsky-Trofimov) (SCIENCE.md 9; module docstring):
    (N, T, V) float64, NaN rows at delimiters and ids outside [0, V)."""
    _check_size("incontext_ctw", depth, "depth")
    _check_alpha("incontext_ctw", alpha)
    tok, seg, V = _tokens(ep)
    valid, run = _runs(tok, seg, V)
    return torch.from_numpy(np.exp(_ctw_logp(tok, valid, run, V, int(depth), [float(alpha)], True)[0]))


# ---------------------------------------------------------------- fitted settings: best_counting


ALPHAS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0)  # SCIENCE.md 9's grid
ORDERS = (1, 2, 3)
DEPTHS = (1, 2, 3)
FAIR_COUNTING = ("incontext_ngram", "incontext_ctw", "best_counting")


def _scored(e) -> np.ndarray:
    """Figure 1's scored positions of a truncated episode set: the test segment at t >= 1."""
    return np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))


def _episode_ce(logp: np.ndarray) -> float:
    """Mean over episodes of the per-episode mean of -log p (logp (..., N, P)): (...) floats."""
    return -logp.mean(-1).mean(-1)


def _pick(scores: dict, size_key: str) -> dict:
    """The setting of lowest CE; ties to the smaller size (order / depth), then the larger alpha."""
    (size, alpha), ce = min(scores.items(), key=lambda kv: (kv[1], kv[0][0], -kv[0][1]))
    return {size_key: int(size), "alpha": float(alpha), "fit_ce": float(ce)}


@dataclass(frozen=True)
class CountingFit:
    """Fitted settings of the fair counting baselines (SCIENCE.md 9), per number of demonstrations k.

    by_k[k] = {"incontext_ngram": {"order", "alpha", "fit_ce"}, "incontext_ctw": {"depth", "alpha", "fit_ce"},
    "best_counting": "incontext_ngram" | "incontext_ctw"}; scores: every setting's fit CE, rows
    {"k", "baseline", "order" | "depth", "alpha", "fit_ce"}; grid: the alphas, orders and depths searched;
    n_episodes and dataset_hash: the fit episodes (never evaluation episodes: see fit_counting)."""

    by_k: dict
    scores: tuple
    grid: dict
    n_episodes: int
    dataset_hash: str | None = None

    @property
    def ks(self) -> list[int]:
        return sorted(self.by_k)

    def params(self) -> dict:
        """Flat {name: value} for MLflow params: counting.k{k}.ngram_order, .ngram_alpha, .ngram_fit_ce,
        .ctw_depth, .ctw_alpha, .ctw_fit_ce, .best (incontext_ngram | incontext_ctw), and counting.fit_episodes."""
        out = {"counting.fit_episodes": self.n_episodes}
        for k in self.ks:
            b, ng, ctw = f"counting.k{k}", self.by_k[k]["incontext_ngram"], self.by_k[k]["incontext_ctw"]
            out.update({f"{b}.ngram_order": ng["order"], f"{b}.ngram_alpha": ng["alpha"], f"{b}.ngram_fit_ce": ng["fit_ce"],
                        f"{b}.ctw_depth": ctw["depth"], f"{b}.ctw_alpha": ctw["alpha"], f"{b}.ctw_fit_ce": ctw["fit_ce"],
                        f"{b}.best": self.by_k[k]["best_counting"]})
        return out

    def describe(self) -> dict:
        """JSON-ready record (a Figure 1 meta entry): the chosen settings per k, the grid, the fit set."""
        return {"by_k": {str(k): self.by_k[k] for k in self.ks}, "grid": self.grid, "n_episodes": self.n_episodes,
                "dataset_hash": self.dataset_hash}

    def predict(self, ep, k: int) -> dict[str, torch.Tensor]:
        """{"incontext_ngram", "incontext_ctw", "best_counting": (N, T, V) float64} on episodes ep ALREADY
        truncated to k demonstrations (ep.n_demos == k), with the settings fitted at k; best_counting is the
        same tensor as the chosen baseline's."""
        k = int(k)
        if k not in self.by_k:
            raise ValueError(f"no counting fit at k = {k} (fitted: {self.ks})")
        if int(ep.n_demos) != k:
            raise ValueError(f"predict(ep, {k}) needs episodes truncated to {k} demonstrations, got {ep.n_demos}")
        ng, ctw = self.by_k[k]["incontext_ngram"], self.by_k[k]["incontext_ctw"]
        out = {"incontext_ngram": incontext_ngram(ep, ng["order"], ng["alpha"]),
               "incontext_ctw": incontext_ctw(ep, ctw["depth"], ctw["alpha"])}
        out["best_counting"] = out[self.by_k[k]["best_counting"]]
        return out


def fit_counting(ep_fit, ks, *, alphas=ALPHAS, orders=ORDERS, depths=DEPTHS) -> CountingFit:
    """Choose the fair counting baselines' settings on fit episodes (SCIENCE.md 9 "Fitted settings").

    ep_fit must be episodes of FIT tasks (a family seed stream of their own), never the evaluation episodes:
    the chosen settings are then a property of the family and layout, and the evaluation is out of sample.
    For each k in ks the episodes are truncated to their last k demos (episodes.truncate_demos) and scored on
    Figure 1's tokens (the test segment at t >= 1); CE = mean over episodes of the per-episode mean of
    -log p. Per k: the (order, alpha) n-gram and the (depth, alpha) CTW of lowest CE; best_counting is the one
    of the two with the lower CE. Ties go to the simpler setting: the lower order / depth, then the larger
    alpha; between the two baselines, to the n-gram.

    Cost: the n-gram counts are computed once per order and reused for every alpha (only the log of
    (c + alpha) / (c. + V alpha) at the scored tokens changes); CTW's estimates depend on alpha, so each depth
    is one pass over the episode that carries all the alphas at once (the counts are shared). The module
    docstring gives a measurement.
    """
    from .episodes import truncate_demos

    alphas, orders, depths, ks = tuple(alphas), tuple(orders), tuple(depths), sorted({int(k) for k in ks})
    if not (alphas and orders and depths and ks):
        raise ValueError("fit_counting needs at least one k, alpha, order and depth")
    for a in alphas:
        _check_alpha("fit_counting", a)
    for o in orders:
        _check_size("fit_counting", o, "order")
    for d in depths:
        _check_size("fit_counting", d, "depth")
    alphas, orders, depths = tuple(float(a) for a in alphas), tuple(int(o) for o in orders), tuple(int(d) for d in depths)
    if len(ep_fit) < 1:
        raise ValueError("fit_counting needs at least one fit episode")
    by_k, rows = {}, []
    a = np.asarray(alphas)
    for k in ks:
        e = truncate_demos(ep_fit, k)
        cols = _scored(e)
        if not len(cols):
            raise ValueError(f"fit_counting: no scored test token at k = {k} (l_test = {e.l_test})")
        tok, seg, V = _tokens(e)
        valid, run = _runs(tok, seg, V)
        if not valid[:, cols].all():
            raise ValueError("fit_counting: the fit episodes have token ids outside [0, V) at scored positions")
        y = tok[:, cols]
        ng, ctw = {}, {}
        for order in orders:
            C = _ngram_counts(tok, valid, run, V, order)[:, cols]  # (N, P, V)
            c_y, c_all = np.take_along_axis(C, y[..., None], -1)[..., 0], C.sum(-1)
            ce = _episode_ce(np.log(c_y + a[:, None, None]) - np.log(c_all + V * a[:, None, None]))  # (A,)
            ng.update({(order, al): float(c) for al, c in zip(alphas, ce)})
        for depth in depths:
            ce = _episode_ce(_ctw_logp(tok, valid, run, V, depth, alphas, False)[:, :, cols])  # (A,)
            ctw.update({(depth, al): float(c) for al, c in zip(alphas, ce)})
        for name, scores, size in (("incontext_ngram", ng, "order"), ("incontext_ctw", ctw, "depth")):
            rows += [{"k": k, "baseline": name, size: s, "alpha": al, "fit_ce": c} for (s, al), c in scores.items()]
        pick = {"incontext_ngram": _pick(ng, "order"), "incontext_ctw": _pick(ctw, "depth")}
        best = "incontext_ctw" if pick["incontext_ctw"]["fit_ce"] < pick["incontext_ngram"]["fit_ce"] else "incontext_ngram"
        by_k[k] = {**pick, "best_counting": best}
    meta = getattr(ep_fit, "meta", None) or {}
    return CountingFit(by_k, tuple(rows), {"alphas": list(alphas), "orders": list(orders), "depths": list(depths)},
                       len(ep_fit), meta.get("dataset_hash"))


# ---------------------------------------------------------------- the EM-fitted HMM


@dataclass(frozen=True)
class HMMLearner:
    """Settings of the in-context HMM learner (module docstring); recorded in Figure 1's meta."""

    n_states: int = 8
    restarts: int = 4
    iters: int = 30
    pseudocount: float = 0.3
    seed: int = 0

    def __post_init__(self):
        if self.n_states < 1 or self.restarts < 1 or self.iters < 0 or not self.pseudocount >= 0:
            raise ValueError(f"HMMLearner needs n_states >= 1, restarts >= 1, iters >= 0, pseudocount >= 0; got {self}")

    @classmethod
    def for_family(cls, n_states: int, cap: int = EM_STATES_CAP, **settings) -> HMMLearner:
        """The learner for a family of n_states hidden states: min(n_states, cap) states (cap 16 by default:
        the EM's cost grows as states^2 per token and restart, so the paper's S = 128 would cost 64x a
        16-state fit), the other settings as given (restarts, iters, pseudocount, seed) or the defaults."""
        if n_states < 1 or cap < 1:
            raise ValueError(f"HMMLearner.for_family needs n_states >= 1 and cap >= 1, got {n_states}, {cap}")
        return cls(n_states=min(int(n_states), int(cap)), **settings)

    def describe(self) -> dict:
        return asdict(self)


DEFAULT_LEARNER = HMMLearner()


@dataclass
class EMFit:
    """Baum-Welch fits of G HMMs (the best restart of each): initial (G, H), transition (G, H, H), emission
    (G, H, V); loglik (G,) the log-likelihood of the group's sequences under the returned parameters; history
    (iters + 1, G, R) the log-likelihood of every restart before each M-step and after the last one; best (G,)
    the restart kept."""

    initial: torch.Tensor
    transition: torch.Tensor
    emission: torch.Tensor
    loglik: torch.Tensor
    history: torch.Tensor
    best: torch.Tensor


def _group_keys(tok: torch.Tensor, ends: list[int]) -> list[list[int]]:
    """Per group (rows sorted by group, group g = rows ends[g-1]:ends[g]): [rows, L, 128-bit sha256 of its
    tokens (int64, in row order)]: what identifies the data a fit sees, and nothing else."""
    a = np.ascontiguousarray(tok.numpy().astype(np.int64))
    out, lo = [], 0
    for hi in ends:
        out.append([hi - lo, a.shape[1], int.from_bytes(hashlib.sha256(a[lo:hi].tobytes()).digest()[:16], "little")])
        lo = hi
    return out


def _init_params(keys, R: int, H: int, V: int, seed: int, dtype) -> tuple[torch.Tensor, ...]:
    """Dirichlet(1) rows for R restarts of each group: start (G, R, H), transition (G, R, H, H), emission
    (G, R, H, V); group g's from its own stream SeedSequence([seed, _EM_TAG, *keys[g]])."""
    out = [np.empty((len(keys), R) + s) for s in ((H,), (H, H), (H, V))]
    for g, key in enumerate(keys):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), _EM_TAG, *(int(x) for x in key)]))
        for o in out:
            o[g] = rng.standard_exponential(o.shape[1:])
    return tuple(torch.as_tensor(o / o.sum(-1, keepdims=True), dtype=dtype) for o in out)


def _forward(pi, A, E):
    """Scaled forward pass, state-major. pi (H, n), A (H, H, n) (A[i, j, r] = p(j | i) of row r's fit), E (L, H, n)
    emission probabilities of the observed tokens. Returns alpha (L, H, n) (column t: the filtered state
    distribution of each row) and the scales c (L, n) = p(o_t | o_<t). The (H x H) matrix-vector product per row
    is H fused multiply-adds over (H, n) blocks: much faster on the CPU than a batched matmul of tiny matrices."""
    L, H, n = E.shape
    alpha = torch.empty_like(E)
    c = torch.empty((L, n), dtype=E.dtype)
    tiny = torch.finfo(E.dtype).tiny
    for t in range(L):
        a = alpha[t]  # (H, n), filled in place
        if t == 0:
            torch.mul(pi, E[0], out=a)
        else:
            prev = alpha[t - 1]
            torch.mul(prev[0], A[0], out=a)  # sum_i alpha_{t-1}[i] A[i, :]
            for i in range(1, H):
                a.addcmul_(prev[i], A[i])
            a.mul_(E[t])
        # p(o_t | o_<t), state by state: the same bits whatever the number of rows n (torch.sum over dim 0 of a
        # narrow (H, n) block may change its summation order with n, and a fit must not depend on its batch)
        s = c[t]
        s.copy_(a[0])
        for i in range(1, H):
            s.add_(a[i])
        a.div_(s.clamp_min_(tiny))
    return alpha, c


def _backward(A, E, c, alpha):
    """Scaled backward pass (same scales as _forward), state-major: beta (L, H, n), with alpha * beta the state
    posteriors, and xi (H, H, n) = sum_t p(s_t = i, s_{t+1} = j | the row's tokens), accumulated on the way."""
    L, H, n = E.shape
    beta = torch.empty_like(E)
    beta[L - 1] = 1.0
    xi = torch.zeros((H, H, n), dtype=E.dtype)
    for t in range(L - 2, -1, -1):
        u = E[t + 1] * beta[t + 1] / c[t + 1]  # (H, n)
        xi.addcmul_(alpha[t][:, None, :], u[None, :, :])  # alpha_t[i] u[j]; times A[i, j] after the loop
        b = torch.mul(A[:, 0], u[0], out=beta[t])  # (H, n): sum_j A[:, j] u[j]
        for j in range(1, H):
            b.addcmul_(A[:, j], u[j])
    return beta, xi.mul_(A)


def _normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows of x (last axis) scaled to sum 1; an all-zero row stays zero (hmmlearn's normalize)."""
    s = x.sum(-1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def fit_hmm_em(seqs, group, n_groups: int, n_tokens: int, learner: HMMLearner = HMMLearner(), *,
               init: tuple | None = None, group_keys=None, dtype=torch.float64, max_bytes: int = EM_CHUNK_BYTES) -> EMFit:
    """Baum-Welch for n_groups categorical HMMs at once, each fit to its own set of sequences.

    seqs (rows, L) int in [0, n_tokens): independent sequences of one length, each started from the group's
    initial distribution; group (rows,) int in [0, n_groups): the HMM each row belongs to (every group needs
    at least one row). learner: n_states, restarts, iters, pseudocount, seed (module docstring). init: optional
    (start (G, R, H), transition (G, R, H, H), emission (G, R, H, V)) instead of the seeded random ones (tests
    compare with hmmlearn from one initialization). Each EM iteration is one batched scaled forward-backward
    over all rows x restarts and one M-step; rows of a group are pooled by index_add (deterministic on CPU).

    Seeding: each group's restarts are drawn from a stream of its own, SeedSequence([learner.seed, _EM_TAG,
    *key]), with key = group_keys[g] (a sequence of non-negative ints) or by default [its number of rows, L,
    a 128-bit sha256 of its tokens in row order]: a group's fit depends on the learner and its own sequences
    only, never on which other groups share the call, their order, or the chunking. Groups are fit in chunks
    whose working set stays under max_bytes.
    """
    H, R, V, G = learner.n_states, learner.restarts, int(n_tokens), int(n_groups)
    tok = torch.as_tensor(np.asarray(seqs) if not isinstance(seqs, torch.Tensor) else seqs).long()
    grp = torch.as_tensor(np.asarray(group) if not isinstance(group, torch.Tensor) else group).long()
    if tok.dim() != 2 or grp.shape != (tok.shape[0],):
        raise ValueError(f"seqs must be (rows, L) and group (rows,), got {tuple(tok.shape)} and {tuple(grp.shape)}")
    if tok.numel() and (tok.min() < 0 or tok.max() >= V):
        raise ValueError(f"tokens must lie in [0, {V})")
    if G < 1 or not grp.numel() or grp.min() < 0 or grp.max() >= G or torch.bincount(grp, minlength=G).min() < 1:
        raise ValueError(f"every group in [0, {G}) needs at least one sequence")
    if group_keys is not None and len(group_keys) != G:
        raise ValueError(f"group_keys needs one key per group ({G}), got {len(group_keys)}")
    order = torch.argsort(grp, stable=True)  # rows grouped, each group's rows in their given order
    tok, grp = tok[order], grp[order]
    ends = torch.cumsum(torch.bincount(grp, minlength=G), 0).tolist()  # rows of groups < g + 1
    if init is None:
        keys = _group_keys(tok, ends) if group_keys is None else [list(np.atleast_1d(k)) for k in group_keys]
        init = _init_params(keys, R, H, V, learner.seed, dtype)
    else:
        init = tuple(torch.as_tensor(np.asarray(x), dtype=dtype) for x in init)
    per_row = 8 * R * tok.shape[1] * H * 8  # ~8 (L, H) float64 arrays per row and restart at the peak
    parts, g0 = [], 0
    while g0 < G:
        first = ends[g0 - 1] if g0 else 0
        g1 = g0 + 1
        while g1 < G and (ends[g1] - first) * per_row <= max_bytes:
            g1 += 1
        rows = slice(first, ends[g1 - 1])
        parts.append(_fit_chunk(tok[rows], grp[rows] - g0, g1 - g0, V, learner, tuple(x[g0:g1] for x in init), dtype))
        g0 = g1
    return EMFit(*(torch.cat(t, dim=1 if i == 4 else 0) for i, t in enumerate(zip(*(
        (f.initial, f.transition, f.emission, f.loglik, f.history, f.best) for f in parts)))))


def _fit_chunk(tok, grp, G: int, V: int, learner: HMMLearner, init: tuple, dtype) -> EMFit:
    """fit_hmm_em on one chunk of groups (rows sorted by group, init (G, R, ...))."""
    H, R = learner.n_states, learner.restarts
    rows, L = tok.shape
    F = G * R  # fits: group g, restart r -> g R + r
    pi, A, B = (x.reshape(F, *x.shape[2:]).clone() for x in init)
    fit = (grp[:, None] * R + torch.arange(R)).reshape(-1)  # (n,) the fit of each (row, restart): n = row R + r
    x = tok.repeat_interleave(R, 0)  # (n, L)
    n = x.shape[0]
    key = (fit[None, :] * V + x.T).reshape(-1)  # (L n,): column (fit, o_t) of an (H, F V) emission table, time-major
    idx = x.T.reshape(L, 1, n).expand(L, H, n)  # o_t of each row, per state
    pc = float(learner.pseudocount)
    history = torch.empty((learner.iters + 1, F), dtype=dtype)

    def pool(a: torch.Tensor) -> torch.Tensor:
        """(..., n) per (row, restart) -> (F, ...) summed over each group's rows (rows are sorted by group)."""
        lead = a.shape[:-1]
        a = a.reshape(-1, rows, R).permute(1, 2, 0).reshape(rows, -1)  # (rows, R * prod(lead))
        out = torch.zeros((G, a.shape[1]), dtype=dtype).index_add_(0, grp, a)
        return out.view(F, *lead)

    def estep(pi, A, B, stats: bool):
        # state-major per-row parameters, rows last: every per-step operand is an (H, n) block
        Ar = A.permute(1, 2, 0).contiguous().index_select(2, fit)  # (H, H, n)
        E = B.permute(1, 0, 2).reshape(H, F * V).index_select(1, key).view(H, L, n).transpose(0, 1)  # (L, H, n)
        alpha, c = _forward(pi.T.index_select(1, fit), Ar, E)  # E[t, s, r] = O[s, o_t] of row r's fit
        lc = torch.log(c)
        ll = lc[0].clone()
        for t in range(1, L):  # in time order, as the scales above: the same bits whatever the batch
            ll += lc[t]
        ll = pool(ll)
        if not stats:
            return ll, None
        beta, xi = _backward(Ar, E, c, alpha)
        post = alpha.mul_(beta)  # (L, H, n): p(s_t | the row's tokens) (alpha is not needed any more)
        obs = torch.zeros((V, H, n), dtype=dtype).scatter_add_(0, idx, post)  # sum_t post 1[o_t = v]
        return ll, (pool(post[0]), pool(xi), pool(obs).transpose(1, 2))

    for it in range(learner.iters):
        ll, (s0, sA, sB) = estep(pi, A, B, True)
        history[it] = ll
        pi, A, B = _normalize(s0 + pc), _normalize(sA + pc), _normalize(sB + pc)
    history[-1], _ = estep(pi, A, B, False)
    final = history[-1].view(G, R)
    best = final.argmax(1)  # the first restart among equals
    pick = torch.arange(G) * R + best
    return EMFit(pi[pick], A[pick], B[pick], final[torch.arange(G), best], history.view(-1, G, R), best)


def _demo_rows(tok: np.ndarray, seg: np.ndarray, n_demos: int, l_demo: int, ks: list[int]):
    """Rows for the fits of every (k, episode), k >= 1: the LAST k demos of each episode (episodes.truncate_demos'
    convention). Returns seqs (rows, l_demo), group (rows,) with group = index of k in ks * N + episode."""
    N = tok.shape[0]
    demos = np.stack([tok[:, seg == j] for j in range(n_demos)], 1)  # (N, n_demos, l_demo)
    seqs, group = [], []
    for gi, k in enumerate(ks):
        seqs.append(demos[:, n_demos - k:].reshape(N * k, l_demo))
        group.append(np.repeat(gi * N + np.arange(N), k))
    return np.concatenate(seqs), np.concatenate(group)


def incontext_hmm(ep, ks=None, learner: HMMLearner = HMMLearner(), *, return_fit: bool = False):
    """The EM-fitted HMM learner's predictions for each k in ks (default 0..n_demos), from ep's last k demos.

    Returns {k: pred (N, T_k, V) float64} with T_k the length of episodes.truncate_demos(ep, k): the test
    segment (its last l_test positions) carries the learner's filter predictions, every other row is NaN
    (the learner predicts the test only). k = 0: uniform 1/V (nothing to fit). With return_fit, also the
    EMFit of the k >= 1 fits (group = position of k among the k >= 1 values * N + episode).
    """
    from .inference import filter_factored

    tok, seg, V = _tokens(ep)
    N, n_demos, l_demo, l_test = tok.shape[0], int(ep.n_demos), int(ep.l_demo), int(ep.l_test)
    ks = sorted(range(n_demos + 1) if ks is None else {int(k) for k in ks})
    if any(not 0 <= k <= n_demos for k in ks):
        raise ValueError(f"k must be in [0, n_demos={n_demos}], got {ks}")
    fit_ks = [k for k in ks if k >= 1]
    test = tok[:, seg == n_demos]  # (N, l_test): the same test tokens at every k
    out = {}
    fit = None
    if fit_ks:
        seqs, group = _demo_rows(tok, seg, n_demos, l_demo, fit_ks)
        fit = fit_hmm_em(seqs, group, len(fit_ks) * N, V, learner)
        H = learner.n_states
        start = None
        meta = getattr(ep, "meta", None) or {}
        burn_in = int(meta.get("burn_in", 0)) if meta.get("test_start", "initial") == "midstream" else 0
        if burn_in > 0:
            start = (fit.initial[:, None, :] @ torch.linalg.matrix_power(fit.transition, burn_in))[:, 0]
        eye = torch.eye(H, dtype=torch.float64)
        pred, _ = filter_factored(fit.initial, fit.transition, eye, fit.emission, np.tile(test, (len(fit_ks), 1)),
                                  start=start, dtype=torch.float64)  # (len(fit_ks) N, l_test, V)
        pred = pred.view(len(fit_ks), N, l_test, V)
    for k in ks:
        T_k = k * (l_demo + 1) + l_test
        p = torch.full((N, T_k, V), float("nan"), dtype=torch.float64)
        p[:, T_k - l_test:] = 1.0 / V if k == 0 else pred[fit_ks.index(k)]
        out[k] = p
    return (out, fit) if return_fit else out
