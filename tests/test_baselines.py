"""In-context learners that know no training task: counting baselines against a per-token loop and hand-made
answers; the EM-fitted HMM against hmmlearn, brute-force enumeration and its own definition."""

import itertools
import math

import numpy as np
import pytest
import torch

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data.episodes import Episodes, layout, sample_episodes, truncate_demos
from hmmscope.data.hmm import make_mixture
from hmmscope.oracles import baselines, em_learner
from hmmscope.oracles.baselines import incontext_bigram, incontext_ctw, incontext_ngram, incontext_unigram
from hmmscope.oracles.em_learner import EMFit, HMMLearner, fit_hmm_em, incontext_hmm

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


# ---------------------------------------------------------------- fair counting baselines (SCIENCE.md 9)


def _earlier(segment, t):
    """How many positions of t's own segment come before t."""
    return sum(1 for s in range(t) if segment[s] == segment[t])


def _ngram_loop(tokens, segment, V, order, alpha):
    """incontext_ngram read literally from SCIENCE.md 9, one token at a time."""
    N, T = tokens.shape
    out = np.full((N, T, V), np.nan)
    for i in range(N):
        x = [int(v) for v in tokens[i]]
        for t in range(T):
            if segment[t] < 0:
                continue
            h = min(order - 1, _earlier(segment, t))
            u = tuple(x[t - h:t])
            grams = [tuple(x[s - h:s + 1]) for s in range(h, t)
                     if segment[s] >= 0 and all(segment[s - j] == segment[s] for j in range(h + 1))]
            c = [grams.count(u + (v,)) for v in range(V)]
            out[i, t] = [(c[v] + alpha) / (sum(c) + V * alpha) for v in range(V)]
    return out


def _log_mean_exp2(a, b):
    """log(exp(a) / 2 + exp(b) / 2)."""
    m = max(a, b)
    return m + math.log(0.5 * math.exp(a - m) + 0.5 * math.exp(b - m))


def _ctw_log_pw(history, D, V, alpha):
    """log P_w(root) of a whole context tree, recomputed from scratch: history = [(context c_1..c_D, token)]."""

    def log_pe(seq):
        counts, total = [0] * V, 0.0
        for v in seq:
            total += math.log((counts[v] + alpha) / (sum(counts) + V * alpha))
            counts[v] += 1
        return total

    def log_pw(s):
        seq = [x for c, x in history if c[:len(s)] == s]
        if len(s) == D:
            return log_pe(seq)
        children = sorted({c[len(s)] for c, _ in history if c[:len(s)] == s})
        return _log_mean_exp2(log_pe(seq), sum(log_pw(s + (ch,)) for ch in children))

    return log_pw(())


def _ctw_loop(tokens, segment, V, D, alpha):
    """incontext_ctw read literally from SCIENCE.md 9: for each token and candidate, P_w(root | past, v) /
    P_w(root | past) with both trees recomputed from scratch."""
    N, T = tokens.shape
    out = np.full((N, T, V), np.nan)
    for i in range(N):
        x = [int(v) for v in tokens[i]]
        history = []
        for t in range(T):
            if segment[t] < 0:
                continue
            n_before = _earlier(segment, t)
            ctx = tuple(x[t - j] if n_before >= j else V for j in range(1, D + 1))
            base = _ctw_log_pw(history, D, V, alpha)
            out[i, t] = [math.exp(_ctw_log_pw(history + [(ctx, v)], D, V, alpha) - base) for v in range(V)]
            history.append((ctx, x[t]))
    return out


def _assert_log_close(got, want, tol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(np.log(got[ok]), np.log(want[ok]), rtol=0, atol=tol)


@pytest.mark.parametrize("data", [DataConfig(n_demos=3, l_demo=5, l_test=7, seed=1),
                                  DataConfig(n_demos=0, l_demo=4, l_test=9, seed=2),
                                  DataConfig(n_demos=2, l_demo=1, l_test=3, seed=3)])
def test_ngram_matches_a_per_token_loop(data):
    V = 3
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=5, n_tokens=V, rank=2, gamma=0.6, seed=7))
    ep = sample_episodes(mix, data, 6, "eval")
    for k in range(ep.n_demos + 1):
        e = truncate_demos(ep, k)
        for order, alpha in ((1, 0.25), (2, 1.0), (3, 1 / 64), (4, 2.0)):
            got = incontext_ngram(e, order, alpha)
            assert got.dtype == torch.float64 and got.shape == (len(e), e.seq_len, V)
            _assert_log_close(got.numpy(), _ngram_loop(e.tokens, e.segment, V, order, alpha))
            np.testing.assert_allclose(got[:, e.segment >= 0].sum(-1).numpy(), 1.0, atol=1e-12)
        # section 8's bigram is the order-2, add-one n-gram
        np.testing.assert_allclose(incontext_ngram(e, 2, 1.0).numpy(), incontext_bigram(e).numpy(), rtol=0, atol=1e-15)
        np.testing.assert_allclose(incontext_ngram(e, 1, 1.0).numpy(), incontext_unigram(e).numpy(), rtol=0, atol=1e-15)


def test_ngram_known_answers():
    V = 3
    # demo 0: 0 1 2 | demo 1: 0 1 0 | test: 0 1 2   (delimiter = 3)
    ep = _episodes([0, 1, 2, 3, 0, 1, 0, 3, 0, 1, 2], n_demos=2, l_demo=3, l_test=3, V=V)
    p = incontext_ngram(ep, 3, 0.5)[0].numpy()
    # t = 10 (test "2" after "0 1"): trigrams 0 1 x ending before 10: (0,1,2) in demo 0, (0,1,0) in demo 1
    np.testing.assert_allclose(p[10], [1.5 / 3.5, 0.5 / 3.5, 1.5 / 3.5])
    # t = 9 (second test token): h = 1, u = 0: the bigrams ending before 9 are (0,1) (1,2) (0,1) (1,0): c(0 .) = 2
    np.testing.assert_allclose(p[9], [0.5 / 3.5, 2.5 / 3.5, 0.5 / 3.5])
    # t = 8 (first test token): h = 0: unigram over 0 1 2 0 1 0
    np.testing.assert_allclose(p[8], [3.5 / 7.5, 2.5 / 7.5, 1.5 / 7.5])
    assert np.isnan(p[3]).all() and np.isnan(p[7]).all()
    np.testing.assert_allclose(p[0], [1 / 3] * 3)  # empty context: alpha / (V alpha)


@pytest.mark.parametrize("depth,alpha", [(0, 0.5), (1, 0.5), (2, 1 / 16), (3, 2.0)])
def test_ctw_matches_recomputing_the_whole_tree(depth, alpha):
    V = 3
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=5, n_tokens=V, rank=2, gamma=0.6, seed=7))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=4, l_test=5, seed=5), 3, "eval")
    for k in (0, 2):
        e = truncate_demos(ep, k)
        got = incontext_ctw(e, depth, alpha)
        assert got.dtype == torch.float64 and got.shape == (len(e), e.seq_len, V)
        _assert_log_close(got.numpy(), _ctw_loop(e.tokens, e.segment, V, depth, alpha))
        np.testing.assert_allclose(got[:, e.segment >= 0].sum(-1).numpy(), 1.0, atol=1e-12)


def test_ctw_known_answers():
    V = 2
    # one sequence 0 0 1, depth 1, KT (alpha 1/2). Context symbols: start (2) for t = 0, then the previous token.
    ep = _episodes([0, 0, 1], n_demos=0, l_demo=1, l_test=3, V=V)
    p = incontext_ctw(ep, 1, 0.5)[0].numpy()
    np.testing.assert_allclose(p[0], [0.5, 0.5])  # empty tree: 1/V
    # t = 1: root saw "0"; child "start" saw "0"; the new token goes to child "0" (unvisited).
    # P_w(past) = 1/2 * 1/2 + 1/2 * 1/2 = 1/2. With v: P_e(root) = 1/2 * (1 + 1/2 [v = 0] ...) computed below.
    pe_root = {0: 0.5 * 0.75, 1: 0.5 * 0.25}
    pw = {v: 0.5 * pe_root[v] + 0.5 * (0.5 * 0.5) for v in (0, 1)}  # child start: 1/2, new child "0": 1/2
    np.testing.assert_allclose(p[1], [pw[0] / 0.5, pw[1] / 0.5])


def test_counting_baselines_use_no_future_token_and_no_delimiter():
    V = 4
    mix = make_mixture(HMMConfig(n_tasks=2, n_states=5, n_tokens=V, rank=2, seed=3))
    ep = sample_episodes(mix, DataConfig(n_demos=3, l_demo=6, l_test=8, seed=2), 5, "eval")
    rng = np.random.default_rng(0)
    fns = [lambda e: incontext_ngram(e, 3, 0.25), lambda e: incontext_ctw(e, 2, 0.5), lambda e: incontext_ctw(e, 3, 1 / 8)]
    base = [fn(ep).numpy() for fn in fns]
    for t in (0, 5, 7, ep.seq_len - 3):  # change every observation token after t: rows <= t stay
        tok = ep.tokens.copy()
        after = (np.arange(ep.seq_len) > t) & ep.is_obs
        tok[:, after] = rng.integers(V, size=(len(ep), after.sum()))
        changed = Episodes(tok, ep.states, ep.task_ids, ep.segment, ep.position, V, ep.n_demos, ep.l_demo, ep.l_test)
        for fn, b in zip(fns, base):
            got = fn(changed).numpy()
            np.testing.assert_array_equal(got[:, :t + 1], b[:, :t + 1])
            assert not np.allclose(got[:, t + 1:][:, ep.is_obs[t + 1:]], b[:, t + 1:][:, ep.is_obs[t + 1:]])
    odd = ep.tokens.copy()
    odd[:, ~ep.is_obs] = 1  # an observation id where the delimiters are: the segment map says what counts
    odd_ep = Episodes(odd, ep.states, ep.task_ids, ep.segment, ep.position, V, ep.n_demos, ep.l_demo, ep.l_test)
    for fn, b in zip(fns, base):
        got = fn(odd_ep).numpy()
        np.testing.assert_array_equal(got, b)
        assert np.isnan(got[:, ~ep.is_obs]).all() and not np.isnan(got[:, ep.is_obs]).any()


def test_counting_baselines_are_the_same_in_chunks(monkeypatch):
    V = 4
    mix = make_mixture(HMMConfig(n_tasks=2, n_states=5, n_tokens=V, rank=2, seed=3))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=5, l_test=6, seed=4), 7, "eval")
    whole = [incontext_ngram(ep, 3, 0.5), incontext_ctw(ep, 2, 0.5)]
    monkeypatch.setattr(baselines, "_NGRAM_CHUNK_BYTES", 1)
    monkeypatch.setattr(baselines, "_CTW_CHUNK_BYTES", 1)  # one episode per chunk
    for a, b in zip(whole, [incontext_ngram(ep, 3, 0.5), incontext_ctw(ep, 2, 0.5)]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # NaN rows in the same places
    for i in (2, 5):  # and an episode alone gives its own row
        np.testing.assert_array_equal(incontext_ngram(ep.subset([i]), 3, 0.5)[0].numpy(), whole[0][i].numpy())
        np.testing.assert_array_equal(incontext_ctw(ep.subset([i]), 2, 0.5)[0].numpy(), whole[1][i].numpy())


def test_counting_baselines_reject_bad_settings():
    ep = _episodes([0, 1, 2], n_demos=0, l_demo=1, l_test=3, V=3)
    for bad in (0, 1.5, -1):
        with pytest.raises(ValueError, match="order must be"):
            incontext_ngram(ep, bad, 1.0)
    with pytest.raises(ValueError, match="depth must be"):
        incontext_ctw(ep, -1, 0.5)
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha must be"):
            incontext_ngram(ep, 2, alpha)
        with pytest.raises(ValueError, match="alpha must be"):
            incontext_ctw(ep, 2, alpha)


# ---------------------------------------------------------------- fitted settings (best_counting)


def _ce(pred, e):
    """Figure 1's CE of a prediction: the test segment at t >= 1, mean over episodes of per-episode means."""
    cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
    y = np.asarray(e.tokens[:, cols]).astype(np.int64)
    p = np.take_along_axis(pred.numpy()[:, cols], y[..., None], -1)[..., 0]
    return float(-np.log(p).mean(1).mean())


def test_fit_counting_scores_every_setting_as_figure1_would_and_keeps_the_best():
    V = 4
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=6, n_tokens=V, rank=3, gamma=0.8, seed=11))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=8, l_test=7, seed=5), 9, "fit")
    grid = {"alphas": (1 / 8, 1.0, 2.0), "orders": (1, 2, 3), "depths": (0, 1, 2)}
    fit = baselines.fit_counting(ep, [0, 2], **grid)
    assert fit.ks == [0, 2] and len(fit.scores) == 2 * 3 * 3 * 2 and fit.n_episodes == 9
    for k in (0, 2):
        e = truncate_demos(ep, k)
        want = {}  # every setting's CE from the public predictors, scored like Figure 1
        for a in grid["alphas"]:
            for o in grid["orders"]:
                want["incontext_ngram", o, a] = _ce(incontext_ngram(e, o, a), e)
            for d in grid["depths"]:
                want["incontext_ctw", d, a] = _ce(incontext_ctw(e, d, a), e)
        rows = [r for r in fit.scores if r["k"] == k]
        assert len(rows) == len(want)
        for r in rows:
            size = r.get("order", r.get("depth"))
            assert r["fit_ce"] == pytest.approx(want[r["baseline"], size, r["alpha"]], abs=1e-12)
        got = fit.by_k[k]
        for name, size in (("incontext_ngram", "order"), ("incontext_ctw", "depth")):
            best = min((v, s, -a) for (n, s, a), v in want.items() if n == name)
            assert (got[name][size], got[name]["alpha"]) == (best[1], -best[2])
            assert got[name]["fit_ce"] == pytest.approx(best[0], abs=1e-12)
        assert got["best_counting"] == min(("incontext_ngram", "incontext_ctw"), key=lambda n: got[n]["fit_ce"])
        pred = fit.predict(e, k)
        assert set(pred) == {"incontext_ngram", "incontext_ctw", "best_counting"}
        assert pred["best_counting"] is pred[got["best_counting"]]
        assert _ce(pred["incontext_ngram"], e) == pytest.approx(got["incontext_ngram"]["fit_ce"], abs=1e-12)
        assert _ce(pred["incontext_ctw"], e) == pytest.approx(got["incontext_ctw"]["fit_ce"], abs=1e-12)
    f = fit.fitted()  # outputs, never params (SCIENCE.md 9)
    p, tags = f["metrics"], f["tags"]
    assert p["counting/fit_episodes"] == 9
    assert {tags["hmmscope.counting.k2.best"], tags["hmmscope.counting.k0.best"]} <= {"incontext_ngram", "incontext_ctw"}
    assert p["counting/k2/ngram_order"] == fit.by_k[2]["incontext_ngram"]["order"]
    assert p["counting/k2/ctw_alpha"] == fit.by_k[2]["incontext_ctw"]["alpha"]
    assert set(p) == {"counting/fit_episodes"} | {f"counting/k{k}/{n}" for k in (0, 2) for n in (
        "ngram_order", "ngram_alpha", "ngram_fit_ce", "ctw_depth", "ctw_alpha", "ctw_fit_ce")}
    assert all(isinstance(v, float) for v in p.values()) and set(tags) == {f"hmmscope.counting.k{k}.best" for k in (0, 2)}
    import json
    json.dumps(fit.describe())
    with pytest.raises(ValueError, match="no counting fit at k = 1"):
        fit.predict(truncate_demos(ep, 1), 1)
    with pytest.raises(ValueError, match="truncated to 0"):
        fit.predict(ep, 0)


def test_fit_counting_ties_go_to_the_simpler_setting():
    pick = baselines._pick
    assert pick({(2, 0.5): 1.0, (1, 0.25): 1.0, (1, 1.0): 1.0, (3, 2.0): 1.5}, "order") == \
        {"order": 1, "alpha": 1.0, "fit_ce": 1.0}
    assert pick({(2, 0.5): 1.0, (3, 2.0): 0.9}, "depth")["depth"] == 3
    # a fit set where the n-gram settings tie: the one scored token (t = 1) follows a single token that no
    # earlier bigram starts with, so orders 2 and 3 (h = 1 for both) predict 1/V at every alpha
    ep = _episodes([0, 1, 2, 3, 1, 0], n_demos=0, l_demo=1, l_test=2, V=4)  # 3 episodes of 2 test tokens
    fit = baselines.fit_counting(ep, [0], alphas=(0.5, 2.0, 1.0), orders=(3, 2), depths=(1,))
    assert fit.by_k[0]["incontext_ngram"] == {"order": 2, "alpha": 2.0, "fit_ce": pytest.approx(math.log(4), abs=1e-15)}


def test_fit_counting_rejects_bad_input():
    ep = _episodes([0, 1, 2, 3, 1, 0], n_demos=0, l_demo=1, l_test=2, V=4)
    with pytest.raises(ValueError, match="alpha must be"):
        baselines.fit_counting(ep, [0], alphas=(0.0,))
    with pytest.raises(ValueError, match="order must be"):
        baselines.fit_counting(ep, [0], orders=(0,))
    with pytest.raises(ValueError, match="k must be in"):
        baselines.fit_counting(ep, [1])
    with pytest.raises(ValueError, match="no scored test token"):
        baselines.fit_counting(_episodes([0], n_demos=0, l_demo=1, l_test=1, V=4), [0])


# ---------------------------------------------------------------- EM: a fit depends on its own episode only


def test_incontext_hmm_fit_of_an_episode_does_not_depend_on_the_batch():
    V = 3
    ep = sample_episodes(make_mixture(HMMConfig(n_tasks=3, n_states=4, n_tokens=V, rank=2, seed=4)),
                         DataConfig(n_demos=3, l_demo=5, l_test=4, seed=2), 6, "eval")
    ln = HMMLearner(n_states=3, restarts=3, iters=4, pseudocount=0.2, seed=2)
    full, fit = incontext_hmm(ep, learner=ln, return_fit=True)
    # one k alone, on a subset of the episodes in another order: the same predictions for those episodes
    sub = incontext_hmm(ep.subset([4, 1]), [2], ln)
    np.testing.assert_array_equal(sub[2].numpy(), full[2][[4, 1]].numpy())
    sub = incontext_hmm(ep.subset([5]), [1, 3], ln)
    for k in (1, 3):
        np.testing.assert_array_equal(sub[k].numpy(), full[k][[5]].numpy())
    # the episodes already truncated to k demos: the same fit (it sees the same sequences)
    np.testing.assert_array_equal(incontext_hmm(truncate_demos(ep, 2), [2], ln)[2].numpy(), full[2].numpy())
    # and in chunks of one group each
    seqs, group = em_learner._demo_rows(ep.tokens.astype(np.int64), ep.segment, 3, 5, [1, 2, 3])
    chunked = fit_hmm_em(seqs, group, 3 * len(ep), V, ln, max_bytes=1)
    for a, b in ((fit.initial, chunked.initial), (fit.emission, chunked.emission), (fit.loglik, chunked.loglik)):
        assert torch.equal(a, b)
    # the restarts differ between groups (each has its own stream) and between seeds
    assert not torch.equal(fit.emission[0], fit.emission[1])
    other = incontext_hmm(ep, [2], HMMLearner(n_states=3, restarts=3, iters=4, pseudocount=0.2, seed=3))
    assert not torch.equal(other[2], full[2])


def test_em_group_keys_seed_the_initializations():
    rng = np.random.default_rng(3)
    V = 4
    seqs = rng.integers(V, size=(3, 6))
    ln = HMMLearner(n_states=3, restarts=1, iters=0, seed=1)  # iters = 0: the fit is the initialization
    same = fit_hmm_em(seqs, np.array([0, 1, 1]), 2, V, ln, group_keys=[[7, 1], [7, 1]])
    assert torch.equal(same.emission[0], same.emission[1]) and torch.equal(same.transition[0], same.transition[1])
    # by default the key is the group's own sequences: equal sequences, equal initializations
    twin = fit_hmm_em(np.stack([seqs[0], seqs[0]]), np.array([0, 1]), 2, V, ln)
    assert torch.equal(twin.emission[0], twin.emission[1])
    assert not torch.equal(fit_hmm_em(seqs[1:2], np.array([0]), 1, V, ln).emission[0], twin.emission[0])
    with pytest.raises(ValueError, match="one key per group"):
        fit_hmm_em(seqs, np.array([0, 1, 1]), 2, V, ln, group_keys=[[1]])


def test_learner_for_family_caps_the_states():
    assert HMMLearner.for_family(4).n_states == 4
    from hmmscope import config

    assert HMMLearner.for_family(128).n_states == em_learner.EM_STATES_CAP == config.EM_STATES_CAP == 8
    assert config.em_states(config.Config()) == 8 and config.em_states(config.override(
        config.Config(), {"hmm.n_states": 4})) == 4  # eval.em_states = 0: the family's S, capped
    ln = HMMLearner.for_family(128, cap=32, restarts=2, seed=5)
    assert (ln.n_states, ln.restarts, ln.seed, ln.iters) == (32, 2, 5, HMMLearner().iters)
    with pytest.raises(ValueError, match="n_states >= 1"):
        HMMLearner.for_family(0)
