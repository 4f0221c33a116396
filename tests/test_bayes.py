"""The Bayes-optimal reference for fresh tasks (SCIENCE.md 10) against the mixture oracle, brute-force enumeration of
every structure and hidden path (mu integrated by its Dirichlet moments), and the task oracle."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data.episodes import family_tasks, truncate_demos, unseen_episodes
from hmmscope.data.hmm import emission_matrix
from hmmscope.oracles import bayes
from hmmscope.oracles.bayes import bayes_oracle, discrete_bayes, windowed_bayes
from hmmscope.oracles.bayes_cache import disk_get
from hmmscope.oracles.bayes_structures import sticky_structures, why_not
from hmmscope.oracles.inference import mixture_oracle, task_oracle

F64 = torch.float64


def _anon(ep):
    return dataclasses.replace(ep, task_ids=np.full(len(ep), -1, np.int64))


# ---------------------------------------------------------------- a discrete prior is the mixture oracle


@pytest.mark.parametrize("test_start, burn_in", [("initial", 0), ("midstream", 3)])
def test_a_discrete_prior_is_the_mixture_oracle(test_start, burn_in):
    hmm = HMMConfig(n_tasks=0, n_states=4, n_tokens=5, rank=2, gamma=0.7, rho=0.1)
    data = DataConfig(n_demos=2, l_demo=5, l_test=6, test_start=test_start, burn_in=burn_in, seed=3)
    _, ep = unseen_episodes(hmm, data, 24)
    fam = family_tasks(hmm, data, 40)
    for k in (0, 2):
        e = _anon(truncate_demos(ep, k))
        a = discrete_bayes(fam, e).numpy()
        b = mixture_oracle(fam, e, dtype=F64).pred.numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nanmax(np.abs(a - b)) < 1e-12


# ---------------------------------------------------------------- brute force over every structure


def _dir_moment(starts, S):
    """E[prod_j mu_{a_j}] under mu ~ Dir(1, ..., 1): Gamma(S) / Gamma(S + m) prod_s Gamma(1 + n_s)."""
    n = np.bincount(np.asarray(starts, np.int64), minlength=S)
    return math.exp(math.lgamma(S) - math.lgamma(S + len(starts)) + sum(math.lgamma(1 + c) for c in n))


def _path_sum(a, T, O, toks):
    """p(toks | start state a) for every task (T (n, S, S), O (n, S, V)) by summing over every hidden path (-2: a
    hidden step, no token): (n,)."""
    S = T.shape[1]
    if not toks:
        return np.ones(T.shape[0])
    total = np.zeros(T.shape[0])
    for path in itertools.product(range(S), repeat=len(toks) - 1):
        states = (a, *path)
        p = np.ones(T.shape[0])
        for i, (s, o) in enumerate(zip(states, toks)):
            if i:
                p = p * T[:, states[i - 1], s]
            if o >= 0:
                p = p * O[:, s, o]
        total += p
    return total


def _brute(tasks, weights, tokens, seg):
    """Bayes by brute force: p(prefix) = sum over tasks (T, O) of weight * E_mu[prod over the segments started by
    then of p(segment prefix | start)], mu ~ Dir(1) by its moments over every tuple of start states."""
    T = np.stack([t for t, _ in tasks])
    O = np.stack([o for _, o in tasks])
    w = np.asarray(weights, np.float64)
    S, V = O.shape[1:]
    N, L = tokens.shape
    out = np.full((N, L, V), np.nan)
    starts = [t for t in range(L) if seg[t] >= 0 and (t == 0 or seg[t - 1] != seg[t])]

    def joint(toks_upto):  # the tokens at positions < len(toks_upto)
        segs = [s for s in starts if s < len(toks_upto)]
        tot = 0.0
        for a in itertools.product(range(S), repeat=len(segs)):
            p = w * _dir_moment(a, S)
            for j, s0 in enumerate(segs):
                s1 = starts[j + 1] if j + 1 < len(starts) else L
                p = p * _path_sum(a[j], T, O, [o for o in toks_upto[s0:min(s1, len(toks_upto))] if o != -1])
            tot += p.sum()
        return tot

    for i in range(N):
        row = [int(o) if 0 <= o < V else (-2 if o == -2 else -1) for o in tokens[i]]
        for t in range(L):
            if row[t] < 0:
                continue
            den = joint(row[:t] + [-1])
            for v in range(V):
                out[i, t, v] = joint(row[:t] + [v]) / den
    return out


def _all_structures(hmm):
    """Every (T, O) of the sticky family with rho = 0 and d = S: a permutation and an injective revealing map."""
    S, V = hmm.n_states, hmm.n_tokens
    out = []
    for sigma in itertools.permutations(range(S)):
        T = np.eye(S)[list(sigma)]
        for r in itertools.permutations(range(V), S):
            out.append((T, emission_matrix(np.array(r), V, hmm.gamma)))
    return out


def test_bayes_equals_brute_force_over_every_structure():
    """rho = 0, d = S: nothing continuous beside mu, so the reference is exact; brute force enumerates all
    S! x V! / (V - S)! structures (no symmetry), every start tuple (mu by its Dirichlet moments) and path."""
    hmm = HMMConfig(n_tasks=0, n_states=2, n_tokens=3, rank=2, gamma=0.6, rho=0.0)
    data = DataConfig(n_demos=2, l_demo=2, l_test=3, seed=1)
    _, ep = unseen_episodes(hmm, data, 5)
    st = sticky_structures(hmm)
    assert st.n_structures == 2 * 6 and st.n_orbits == 6  # orbits of size S! = 2 (injective maps: a free action)
    tasks = _all_structures(hmm)
    want = _brute(tasks, np.full(len(tasks), 1 / len(tasks)), np.asarray(ep.tokens), np.asarray(ep.segment))
    got = bayes_oracle(hmm, ep)
    assert got.n_draws == 0 and got.converged and got.mc_se == 0.0
    assert np.array_equal(np.isnan(got.pred.numpy()), np.isnan(want))
    assert np.nanmax(np.abs(got.pred.numpy() - want)) < 1e-12


def test_orbits_of_a_partition_with_clusters_of_two():
    """d < S: relabelings keep the cluster partition (states within a cluster, clusters of one size): at S = 4, d = 2
    the group has 2 x 2 x 2 = 8 elements, and every orbit of (sigma, injective map) has that size."""
    st = sticky_structures(HMMConfig(n_tasks=0, n_states=4, n_tokens=5, rank=2))
    assert st.n_structures == 2 * 120
    assert st.n_orbits == st.n_structures // 8
    assert np.allclose(np.exp(st.log_mult), 8)
    st3 = sticky_structures(HMMConfig(n_tasks=0, n_states=4, n_tokens=4, rank=3))  # clusters {0, 1}, {2}, {3}
    assert st3.n_orbits == 6 * 24 // 4


def test_monte_carlo_draws_equal_brute_force_on_the_same_draws():
    """rho > 0 and d < S: with K fixed, the reference is the mixture over orbit representatives x the K draws of
    each episode (the noise rows and Q rows bayes._draws gives), weighted by orbit size, mu integrated exactly."""
    hmm = HMMConfig(n_tasks=0, n_states=3, n_tokens=3, rank=2, gamma=0.7, rho=0.3, alpha=0.5)
    data = DataConfig(n_demos=1, l_demo=2, l_test=3, seed=2)
    _, ep = unseen_episodes(hmm, data, 3)
    K = bayes.BLOCK
    got = bayes_oracle(hmm, ep, k_start=K, k_max=K)
    assert got.n_draws == K
    st = sticky_structures(hmm)
    noise, Q = bayes._draws(hmm, len(ep), 0, 0)
    T = bayes._transitions(hmm, st, noise, Q).reshape(len(ep), K, len(st.sigma), 3, 3)
    O = emission_matrix(st.reveal, 3, hmm.gamma)
    for i in range(len(ep)):
        tasks, w = [], []
        for k in range(K):
            for p, r, lm in zip(st.pair_sigma, st.pair_reveal, st.log_mult):
                tasks.append((T[i, k, p], O[r]))
                w.append(math.exp(lm))
        want = _brute(tasks, np.array(w) / sum(w), np.asarray(ep.tokens)[i:i + 1], np.asarray(ep.segment))
        assert np.nanmax(np.abs(got.pred.numpy()[i:i + 1] - want)) < 1e-12


def test_the_reference_converges_to_brute_force_over_the_prior():
    """Against an independent estimate: the mixture over many prior draws of whole tasks (every structure, the
    noise, mu integrated by brute force), on the same episodes: equal within a few Monte Carlo errors."""
    hmm = HMMConfig(n_tasks=0, n_states=2, n_tokens=3, rank=2, gamma=0.7, rho=0.4)
    data = DataConfig(n_demos=1, l_demo=3, l_test=3, seed=4)
    _, ep = unseen_episodes(hmm, data, 6)
    got = bayes_oracle(hmm, ep, tol=1e-4, k_max=256)
    rng = np.random.default_rng(0)
    tasks = []
    for _ in range(400):
        for sigma in itertools.permutations(range(2)):
            for r in itertools.permutations(range(3), 2):
                W = 0.4 * rng.dirichlet(np.ones(2), 2) + 0.6 * np.eye(2)[list(sigma)]
                tasks.append((W, emission_matrix(np.array(r), 3, hmm.gamma)))
    want = _brute(tasks, np.full(len(tasks), 1 / len(tasks)), np.asarray(ep.tokens), np.asarray(ep.segment))
    cols = np.flatnonzero(np.asarray(ep.segment) == 1)
    y = np.asarray(ep.tokens)[:, cols]
    ce = lambda p: -np.log(np.take_along_axis(p[:, cols], y[..., None], -1)).mean()  # noqa: E731
    assert abs(ce(got.pred.numpy()) - ce(want)) < 0.01
    assert np.nanmax(np.abs(got.pred.numpy() - want)) < 0.02


# ---------------------------------------------------------------- what it promises


def test_never_below_the_task_oracle_and_reports_its_convergence():
    hmm = HMMConfig(n_tasks=0, n_states=3, n_tokens=6, rank=3, gamma=0.8, rho=0.05)
    data = DataConfig(n_demos=2, l_demo=8, l_test=8, seed=0)
    mix, ep = unseen_episodes(hmm, data, 200)
    got = bayes_oracle(hmm, ep)
    assert got.converged and got.n_draws >= 16 and math.isfinite(got.mc_se) and got.mc_se < 0.01
    assert abs(got.history[-1][1] - got.history[-2][1]) < bayes.TOL
    cols = np.flatnonzero((np.asarray(ep.segment) == 2) & (np.arange(ep.seq_len) >= 1))
    y = np.asarray(ep.tokens)[:, cols].astype(np.int64)
    pick = lambda p: -np.log(np.take_along_axis(p[:, cols], y[..., None], -1)[..., 0]).mean(1)  # noqa: E731
    d = pick(got.pred.numpy()) - pick(task_oracle(mix, ep, dtype=F64).numpy())
    assert abs(got.ce - pick(got.pred.numpy()).mean()) < 1e-12
    assert d.mean() - 3 * d.std() / math.sqrt(len(d)) > 0  # the task oracle knows the task: it is better


def test_results_are_reused_and_deterministic(tmp_path, monkeypatch):
    """Kept per process and on disk (signed: the trials of a sweep cell score the same episodes in other processes);
    computed afresh, the same numbers; a planted or corrupt cache entry is a miss, never a number."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(bayes, "_MEMO", {})
    hmm = HMMConfig(n_tasks=0, n_states=3, n_tokens=4, rank=3, gamma=0.8, rho=0.05)
    data = DataConfig(n_demos=1, l_demo=4, l_test=4, seed=0)
    _, ep = unseen_episodes(hmm, data, 10)
    a = bayes_oracle(hmm, ep, k_max=16)
    assert bayes_oracle(hmm, ep, k_max=16) is a
    key = next(k for k, v in bayes._MEMO.items() if v is a)
    entries = list((tmp_path / "hmmscope" / "bayes").glob("*.npz"))
    assert len(entries) == 1
    bayes._MEMO.clear()
    b = bayes_oracle(hmm, ep, k_max=16)  # from disk
    assert b is not a and np.array_equal(a.pred.numpy(), b.pred.numpy(), equal_nan=True) and a.history == b.history
    fresh = bayes_oracle(hmm, ep, k_max=16, cache=False)  # computed again
    assert np.array_equal(a.pred.numpy(), fresh.pred.numpy(), equal_nan=True) and a.mc_se == fresh.mc_se
    raw = entries[0].read_bytes()
    entries[0].write_bytes(raw[:-10] + bytes(10))  # tampered: its HMAC no longer verifies
    bayes._MEMO.clear()
    assert disk_get(key) is None
    c = bayes_oracle(hmm, ep, k_max=16)
    assert np.array_equal(a.pred.numpy(), c.pred.numpy(), equal_nan=True)


def test_families_it_cannot_compute_say_why():
    assert "dirichlet" in why_not(HMMConfig(family="dirichlet", n_states=8, n_tokens=16, rank=4))
    assert "structures" in why_not(HMMConfig(family="sticky", n_states=8, n_tokens=16, rank=8))
    assert why_not(HMMConfig(family="sticky", n_states=4, n_tokens=8, rank=4)) is None
    with pytest.raises(ValueError, match="no exact Bayes reference"):
        bayes_oracle(HMMConfig(family="dirichlet"), None)


# ---------------------------------------------------------------- windowed


def test_windowed_bayes_is_bayes_on_the_window_alone():
    """Exact family (rho = 0, d = S): the window at position t equals brute force on the episode with every token
    before t - R hidden (the chain runs, nothing is seen); a window that spans the delimiter couples the two
    segments through mu (the Polya urn). At R >= t it is the full Bayes reference."""
    hmm = HMMConfig(n_tasks=0, n_states=2, n_tokens=3, rank=2, gamma=0.6, rho=0.0)
    data = DataConfig(n_demos=1, l_demo=2, l_test=4, seed=5)
    _, ep = unseen_episodes(hmm, data, 4)
    R = 2
    cols = np.flatnonzero(np.asarray(ep.segment) == 1)  # positions 3..6; windows of 3, 4 span the delimiter
    pred, res = windowed_bayes(hmm, ep, R, cols)
    assert res.converged and pred.shape == (4, 4, 3)
    tasks = _all_structures(hmm)
    tok = np.asarray(ep.tokens).astype(np.int64)
    seg = np.asarray(ep.segment)
    for q, t in enumerate(cols):
        masked = tok.copy()[:, :t + 1]
        masked[:, (seg[:t + 1] >= 0) & (np.arange(t + 1) < t - R)] = -2
        want = _brute(tasks, np.full(len(tasks), 1 / len(tasks)), masked, seg[:t + 1])
        assert np.abs(pred[:, q] - want[:, t]).max() < 1e-12
    full = bayes_oracle(hmm, ep).pred.numpy()
    wide, _ = windowed_bayes(hmm, ep, 10, cols)
    assert np.abs(wide - full[:, cols]).max() < 1e-12
