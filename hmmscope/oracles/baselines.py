"""In-context learners that know no training task (SCIENCE.md 8, 9): counting baselines, fair (fitted) counting
baselines and an EM-fitted HMM.

They tell in-context inference from retrieval: none of them has seen a training task, so whatever they reach
comes from the episode itself. All return the predictive convention of inference.py and measure/evaluate.py:
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
alpha, and the n-gram over the CTW. CountingFit.fitted() gives the choices as MLflow metrics and tags (outputs,
never params: counting/k{k}/ngram_order ..., hmmscope.counting.k{k}.best), CountingFit.predict(ep, k) the three
predictions on episodes truncated to k.
The n-gram's counts are computed once per order and reused over the alphas; CTW's estimates depend on alpha,
so each depth is one pass that carries all 8 alphas at once (its counts are shared).

Costs. `hmmscope bench counting` times them against the add-one bigram on the same episodes: incontext_ngram
(order 3) and incontext_ctw (depth 3) at the paper's shape (V = 16, 6 x 48 + 64 = 358 positions, 1024 episodes),
and fit_counting at the main job's size (the `tiny` preset: V = 8, 4 demos x 24 + 32 test tokens; 512 fit
episodes; k = 0..4; 8 alphas x orders 1-3 x depths 1-3). Recorded numbers: analysis/results/bench/RUN.md.

The EM-fitted HMM learner (``incontext_hmm``, ``HMMLearner``, ``fit_hmm_em``) lives in em_learner.py and is
re-exported here.

Ties. Accuracy takes argmax over the V ids, ties going to the lowest id (torch.argmax), for every predictor.

This module imports torch, numpy and hmmscope's episodes (truncate_demos) and em_learner (re-exported); never the model,
training or tracking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..data.episodes import episode_arrays, truncate_demos

__all__ = ["incontext_unigram", "incontext_bigram", "incontext_ngram", "incontext_ctw", "fit_counting", "CountingFit",
           "COUNTING", "FAIR_COUNTING", "ALPHAS", "ORDERS", "DEPTHS"]

COUNTING = ("incontext_unigram", "incontext_bigram")
_BIGRAM_CHUNK_BYTES = 64 << 20  # peak of the bigram's cumulative pair counts per chunk of episodes
_NGRAM_CHUNK_BYTES = 64 << 20  # the n-gram's per-gram-length count arrays per chunk of episodes
_CTW_CHUNK_BYTES = 96 << 20  # CTW node tables (+ its output) per chunk of episodes


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
    tok, seg, V = episode_arrays(ep)
    obs = seg >= 0
    p = _unigram(_onehot(tok, obs, V))
    p[:, ~obs] = np.nan
    p[(tok < 0) | (tok >= V)] = np.nan
    return torch.from_numpy(p)


def incontext_bigram(ep) -> torch.Tensor:
    """Add-one bigram over the adjacent in-sequence pairs ending before t, unigram at a sequence's first token
    (module docstring): (N, T, V) float64."""
    tok, seg, V = episode_arrays(ep)
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
    tok, seg, V = episode_arrays(ep)
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
    tok, seg, V = episode_arrays(ep)
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

    def fitted(self) -> dict[str, dict]:
        """What the fit chose, for MLflow as outputs, never params (SCIENCE.md 9, "Params and outputs"):
        {"metrics": counting/k{k}/ngram_order, /ngram_alpha, /ngram_fit_ce, /ctw_depth, /ctw_alpha, /ctw_fit_ce and
        counting/fit_episodes; "tags": hmmscope.counting.k{k}.best (incontext_ngram | incontext_ctw)}."""
        metrics: dict[str, float] = {"counting/fit_episodes": float(self.n_episodes)}
        tags: dict[str, str] = {}
        for k in self.ks:
            b, ng, ctw = f"counting/k{k}", self.by_k[k]["incontext_ngram"], self.by_k[k]["incontext_ctw"]
            metrics.update({f"{b}/ngram_order": ng["order"], f"{b}/ngram_alpha": ng["alpha"],
                            f"{b}/ngram_fit_ce": ng["fit_ce"], f"{b}/ctw_depth": ctw["depth"],
                            f"{b}/ctw_alpha": ctw["alpha"], f"{b}/ctw_fit_ce": ctw["fit_ce"]})
            tags[f"hmmscope.counting.k{k}.best"] = self.by_k[k]["best_counting"]
        return {"metrics": {k: float(v) for k, v in metrics.items()}, "tags": tags}

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
        tok, seg, V = episode_arrays(e)
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
