"""In-context learners that know no training task: counting baselines against a per-token loop and hand-made
answers; the EM-fitted HMM against hmmlearn, brute-force enumeration and its own definition."""

import itertools
import math

import numpy as np
import pytest
import torch

from hmmscope.baselines import (
    EMFit,
    HMMLearner,
    fit_hmm_em,
    incontext_bigram,
    incontext_hmm,
    incontext_unigram,
)
from hmmscope.config import DataConfig, HMMConfig
from hmmscope.episodes import Episodes, layout, sample_episodes
from hmmscope.evaluate import truncate_demos
from hmmscope.hmm import make_mixture

# ---------------------------------------------------------------- counting baselines


def _loop(tokens, segment, V, bigram: bool):
    """SCIENCE.md 8 read literally, one token at a time, in plain Python."""
    N, T = tokens.shape
    out = np.full((N, T, V), np.nan)
    for i in range(N):
        for t in range(T):
            if segment[t] < 0:
                continue
            ctx = [int(tokens[i, s]) for s in range(t) if segment[s] >= 0]
            uni = [(ctx.count(v) + 1) / (len(ctx) + V) for v in range(V)]
            if bigram and t >= 1 and segment[t - 1] >= 0 and segment[t - 1] == segment[t]:
                u = int(tokens[i, t - 1])
                pairs = [(int(tokens[i, s - 1]), int(tokens[i, s])) for s in range(1, t)
                         if segment[s] >= 0 and segment[s - 1] == segment[s]]
                c = [pairs.count((u, v)) for v in range(V)]
                cu = sum(1 for a, _ in pairs if a == u)
                out[i, t] = [(c[v] + 1) / (cu + V) for v in range(V)]
            else:
                out[i, t] = uni
    return out


def _episodes(tokens, n_demos, l_demo, l_test, V):
    seg, pos = layout(n_demos, l_demo, l_test)
    tokens = np.asarray(tokens, np.int64).reshape(-1, len(seg))
    return Episodes(tokens, np.zeros_like(tokens), np.zeros(len(tokens), np.int64), seg, pos, V, n_demos, l_demo,
                    l_test)


@pytest.mark.parametrize("data", [DataConfig(n_demos=3, l_demo=5, l_test=7, seed=1),
                                  DataConfig(n_demos=0, l_demo=4, l_test=9, seed=2),
                                  DataConfig(n_demos=2, l_demo=1, l_test=3, seed=3),
                                  DataConfig(n_demos=2, l_demo=6, l_test=5, test_start="midstream", burn_in=20, seed=4)])
def test_counting_baselines_match_a_per_token_loop(data):
    V = 4
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=5, n_tokens=V, rank=2, gamma=0.6, seed=7))
    ep = sample_episodes(mix, data, 12, "eval")
    for k in range(ep.n_demos + 1):  # every truncation Figure 1 scores
        e = truncate_demos(ep, k)
        for fn, bigram in ((incontext_unigram, False), (incontext_bigram, True)):
            got = fn(e)
            assert got.dtype == torch.float64 and got.shape == (len(e), e.seq_len, V)
            want = _loop(e.tokens, e.segment, V, bigram)
            np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want))
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12, equal_nan=True)
            obs = e.segment >= 0
            np.testing.assert_allclose(got[:, obs].sum(-1).numpy(), 1.0, atol=1e-12)


def test_counting_baselines_known_answers():
    V = 3
    # demo 0: 0 1 | demo 1: 0 1 | test: 0 2 1   (delimiter = 3)
    ep = _episodes([0, 1, 3, 0, 1, 3, 0, 2, 1], n_demos=2, l_demo=2, l_test=3, V=V)
    uni, bi = incontext_unigram(ep)[0].numpy(), incontext_bigram(ep)[0].numpy()
    # t = 0: nothing before it: uniform
    np.testing.assert_allclose(uni[0], [1 / 3] * 3)
    # t = 6 (test token 0): context 0 1 0 1: (2+1, 2+1, 0+1) / (4 + 3); first of its sequence: bigram = unigram
    np.testing.assert_allclose(uni[6], [3 / 7, 3 / 7, 1 / 7])
    np.testing.assert_allclose(bi[6], uni[6])
    # t = 7 (after u = 0): pairs ending before 7: (0,1) in demo 0, (0,1) in demo 1 -> c_0. = 2
    np.testing.assert_allclose(bi[7], [1 / 5, 3 / 5, 1 / 5])
    # t = 8 (after u = 2): no pair starts with 2 yet ((0,2) ends at 7 < 8 but starts with 0): uniform
    np.testing.assert_allclose(bi[8], [1 / 3] * 3)
    np.testing.assert_allclose(uni[8], [(3 + 1) / 9, (2 + 1) / 9, (1 + 1) / 9])  # context 0 1 0 1 0 2
    # delimiters are NaN rows
    assert np.isnan(uni[2]).all() and np.isnan(bi[5]).all()


def test_delimiters_are_never_counted():
    V = 3
    # if the delimiter (id 3) were counted, n would be 6 at the test start, not 4; if it were read as a token id
    # by its segment, the answer would change when the id at a delimiter position changes
    ep = _episodes([0, 0, 3, 1, 1, 3, 2, 2], n_demos=2, l_demo=2, l_test=2, V=V)
    np.testing.assert_allclose(incontext_unigram(ep)[0, 6].numpy(), [3 / 7, 3 / 7, 1 / 7])
    odd = _episodes([0, 0, 2, 1, 1, 0, 2, 2], n_demos=2, l_demo=2, l_test=2, V=V)  # observation ids at D positions
    for fn in (incontext_unigram, incontext_bigram):
        a, b = fn(ep).numpy(), fn(odd).numpy()
        np.testing.assert_array_equal(a, b)  # the segment map, not the id, says what is a delimiter


def test_pairs_never_cross_sequences():
    V = 3
    # demo 0 ends in 0, demo 1 starts with 2: (0, 2) straddles a delimiter and must not count
    ep = _episodes([1, 0, 3, 2, 1, 3, 0, 0], n_demos=2, l_demo=2, l_test=2, V=V)
    bi = incontext_bigram(ep)[0].numpy()
    # t = 7 (test token 1, after u = 0): pairs before it: (1,0), (2,1); none starts with 0 -> uniform
    np.testing.assert_allclose(bi[7], [1 / 3] * 3)
    # the same tokens as one sequence would count (0, 2) and give c_0. = 1
    one = _episodes([1, 0, 2, 1, 0, 0], n_demos=0, l_demo=1, l_test=6, V=V)
    np.testing.assert_allclose(incontext_bigram(one)[0, 5].numpy(), [1 / 4, 1 / 4, 2 / 4])
    # the first token of every sequence falls back to the unigram
    uni = incontext_unigram(ep)[0].numpy()
    for t in (0, 3, 6):
        np.testing.assert_array_equal(bi[t], uni[t])


# ---------------------------------------------------------------- the EM-fitted HMM


def _brute_loglik(seq, pi, A, B):
    """log p(seq) by summing over every hidden path."""
    H, L = len(pi), len(seq)
    total = 0.0
    for path in itertools.product(range(H), repeat=L):
        p = pi[path[0]] * B[path[0], seq[0]]
        for t in range(1, L):
            p *= A[path[t - 1], path[t]] * B[path[t], seq[t]]
        total += p
    return math.log(total)


def test_em_matches_hmmlearn_iterate_by_iterate():
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    rng = np.random.default_rng(0)
    H, V, L, n = 3, 4, 7, 5
    seqs = rng.integers(V, size=(n, L))
    pi, A, B = rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), H), rng.dirichlet(np.ones(V), H)
    for pc in (0.0, 0.3):
        for iters in (1, 4, 12):
            m = hmmlearn.CategoricalHMM(n_components=H, n_iter=iters, tol=-np.inf, init_params="", params="ste",
                                        implementation="scaling", startprob_prior=1 + pc, transmat_prior=1 + pc,
                                        emissionprob_prior=1 + pc)
            m.n_features = V
            m.startprob_, m.transmat_, m.emissionprob_ = pi.copy(), A.copy(), B.copy()
            m.fit(seqs.reshape(-1, 1), lengths=[L] * n)
            f = fit_hmm_em(seqs, np.zeros(n, int), 1, V, HMMLearner(n_states=H, restarts=1, iters=iters, pseudocount=pc),
                           init=(pi[None, None], A[None, None], B[None, None]))
            np.testing.assert_allclose(f.initial[0].numpy(), m.startprob_, atol=1e-12)
            np.testing.assert_allclose(f.transition[0].numpy(), m.transmat_, atol=1e-12)
            np.testing.assert_allclose(f.emission[0].numpy(), m.emissionprob_, atol=1e-12)
            np.testing.assert_allclose(f.history[:-1, 0, 0].numpy(), m.monitor_.history, rtol=1e-12)
            assert f.loglik[0].item() == pytest.approx(m.score(seqs.reshape(-1, 1), lengths=[L] * n), rel=1e-12)


def test_em_loglik_is_the_brute_force_sum_and_ml_em_never_decreases_it():
    rng = np.random.default_rng(1)
    H, V, L = 2, 3, 5
    seqs = rng.integers(V, size=(4, L))
    group = np.array([0, 0, 1, 1])
    f = fit_hmm_em(seqs, group, 2, V, HMMLearner(n_states=H, restarts=3, iters=8, pseudocount=0.0, seed=5))
    for g in range(2):
        want = sum(_brute_loglik(s, *(x[g].numpy() for x in (f.initial, f.transition, f.emission))) for s in seqs[group == g])
        assert f.loglik[g].item() == pytest.approx(want, rel=1e-12)
    h = f.history.numpy()  # (iters + 1, G, R): maximum-likelihood EM is monotone
    assert (np.diff(h, axis=0) >= -1e-9).all()
    assert (f.loglik.numpy() == h[-1].max(-1)).all() and (f.best.numpy() == h[-1].argmax(-1)).all()


def test_em_groups_are_independent_and_seeded():
    rng = np.random.default_rng(2)
    V, L = 4, 6
    seqs = rng.integers(V, size=(5, L))
    group = np.array([1, 0, 1, 1, 0])
    ln = HMMLearner(n_states=3, restarts=2, iters=6, pseudocount=0.1, seed=3)
    init = tuple(np.random.default_rng(9).dirichlet(np.ones(s[-1]), size=s[:-1]) for s in ((2, 2, 3), (2, 2, 3, 3), (2, 2, 3, V)))
    both = fit_hmm_em(seqs, group, 2, V, ln, init=init)
    for g in range(2):
        alone = fit_hmm_em(seqs[group == g], np.zeros((group == g).sum(), int), 1, V, ln,
                           init=tuple(x[g:g + 1] for x in init))
        for a, b in ((both.transition[g], alone.transition[0]), (both.emission[g], alone.emission[0]),
                     (both.loglik[g], alone.loglik[0])):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    again = fit_hmm_em(seqs, group, 2, V, ln)
    one_by_one = fit_hmm_em(seqs, group, 2, V, ln, max_bytes=1)  # each group its own chunk: the same bits
    for a, b in zip((again.initial, again.transition, again.emission, again.loglik, again.history, again.best),
                    (one_by_one.initial, one_by_one.transition, one_by_one.emission, one_by_one.loglik,
                     one_by_one.history, one_by_one.best)):
        assert torch.equal(a, b)
    assert torch.equal(fit_hmm_em(seqs, group, 2, V, ln).emission, again.emission)  # same seed, same bits
    assert not torch.equal(fit_hmm_em(seqs, group, 2, V, HMMLearner(n_states=3, restarts=2, iters=6, seed=4)).emission,
                           again.emission)
    with pytest.raises(ValueError, match="needs at least one sequence"):
        fit_hmm_em(seqs, np.zeros(5, int), 2, V, ln)
    with pytest.raises(ValueError, match="tokens must lie"):
        fit_hmm_em(seqs + V, group, 2, V, ln)


def _brute_predictive(test, pi, A, B, V):
    """p(o_t = v | o_<t) of one sequence by enumerating paths (joint probabilities of prefixes)."""
    out = []
    for t in range(len(test)):
        joint = [math.exp(_brute_loglik(list(test[:t]) + [v], pi, A, B)) for v in range(V)]
        out.append(np.array(joint) / sum(joint))
    return np.array(out)


@pytest.mark.parametrize("test_start", ["initial", "midstream"])
def test_incontext_hmm_filters_the_test_with_the_fit_of_the_last_k_demos(test_start):
    V = 3
    data = DataConfig(n_demos=3, l_demo=5, l_test=4, seed=1, test_start=test_start,
                      burn_in=3 if test_start == "midstream" else 0)
    ep = sample_episodes(make_mixture(HMMConfig(n_tasks=2, n_states=4, n_tokens=V, rank=2, seed=2)), data, 5, "eval")
    ln = HMMLearner(n_states=2, restarts=2, iters=5, pseudocount=0.2, seed=1)
    out, fit = incontext_hmm(ep, learner=ln, return_fit=True)
    assert isinstance(fit, EMFit) and sorted(out) == [0, 1, 2, 3]
    N, l_test = len(ep), data.l_test
    for k, p in out.items():
        e = truncate_demos(ep, k)
        assert p.shape == (N, e.seq_len, V) and torch.isnan(p[:, ~e.test_mask]).all()
        if k == 0:  # nothing to fit: uniform
            assert torch.equal(p[:, e.test_mask], torch.full((N, l_test, V), 1 / V, dtype=torch.float64))
            continue
        for i in (0, N - 1):
            g = (k - 1) * N + i  # fits are ordered by k (k >= 1), then episode
            pi, A, B = (x[g].numpy() for x in (fit.initial, fit.transition, fit.emission))
            demos = [ep.tokens[i, ep.segment == j] for j in range(3 - k, 3)]  # the LAST k demos, nothing else
            assert fit.loglik[g].item() == pytest.approx(sum(_brute_loglik(d, pi, A, B) for d in demos), rel=1e-12)
            if test_start == "midstream":
                pi = pi @ np.linalg.matrix_power(A, 3)
            want = _brute_predictive(ep.tokens[i, ep.test_mask], pi, A, B, V)
            np.testing.assert_allclose(p[i, e.test_mask].numpy(), want, atol=1e-12)
    assert incontext_hmm(ep, [2], ln)[2].shape == out[2].shape
    with pytest.raises(ValueError, match="k must be in"):
        incontext_hmm(ep, [4], ln)
