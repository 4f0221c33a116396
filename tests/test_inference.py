"""Exact inference (SCIENCE.md 4) against brute-force enumeration, hmmlearn, and invariances."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data.episodes import layout, sample_episodes
from hmmscope.data.hmm import HMM, Mixture, make_hmm, make_mixture
from hmmscope.oracles import filtering, inference
from hmmscope.oracles.filtering import filter_factored
from hmmscope.oracles.inference import mixture_oracle, task_oracle
from hmmscope.oracles.memory import MemoryErrorResult, memory_error, memory_predictor

F64 = torch.float64


def predictive(h, tokens, dtype=F64):  # the known-answer tests below run in float64 (the default is float32)
    return filtering.predictive(h, tokens, dtype=dtype)


def _random_hmm(rng, S, V, d=None):
    mu = rng.dirichlet(np.ones(S))
    O = rng.dirichlet(np.ones(V), S)
    if d is None:
        return HMM(mu, rng.dirichlet(np.ones(S), S), O)
    W, Q = rng.dirichlet(np.ones(d), S), rng.dirichlet(np.ones(S), d)
    return HMM(mu, W @ Q, O, factors=(W, Q))


def _joint(start, T, O, tokens):
    """Brute force p(o_0..o_{k-1}) by summing over all S^k hidden paths (1 for k = 0)."""
    k, S = len(tokens), len(start)
    if k == 0:
        return 1.0
    paths = np.array(list(itertools.product(range(S), repeat=k)))  # (S^k, k)
    p = start[paths[:, 0]] * O[paths[:, 0], tokens[0]]
    for i in range(1, k):
        p = p * T[paths[:, i - 1], paths[:, i]] * O[paths[:, i], tokens[i]]
    return p.sum()


def _brute_predictive(start, T, O, tokens):
    """(len, V): p(o_t = v | o_<t) = joint(o_<t, v) / joint(o_<t)."""
    V = O.shape[1]
    return np.array([[_joint(start, T, O, list(tokens[:t]) + [v]) / _joint(start, T, O, list(tokens[:t]))
                      for v in range(V)] for t in range(len(tokens))])


# ---------------------------------------------------------------- single HMM


@pytest.mark.parametrize("S, V, d, T", [(2, 2, None, 6), (3, 2, None, 5), (2, 3, None, 6), (3, 3, 2, 5), (3, 2, 1, 6)])
def test_predictive_matches_brute_force(S, V, d, T):
    rng = np.random.default_rng(S * 100 + V * 10 + T)
    for _ in range(3):
        h = _random_hmm(rng, S, V, d)
        tok = rng.integers(0, V, (2, T))
        pred = predictive(h, tok)
        assert pred.shape == (2, T, V) and pred.dtype == np.float64
        for i in range(2):
            np.testing.assert_allclose(pred[i], _brute_predictive(h.initial, h.transition, h.emission, tok[i]),
                                       rtol=0, atol=1e-10)


@pytest.mark.parametrize("factored", [False, True])
def test_loglik_matches_hmmlearn(factored):
    from hmmlearn.hmm import CategoricalHMM

    rng = np.random.default_rng(1 + factored)
    if factored:
        h = make_hmm(HMMConfig(n_tasks=1, n_states=20, n_tokens=6, rank=4, gamma=0.6, seed=3))
    else:
        h = _random_hmm(rng, 20, 6)
    tok = h.sample(3, 200, seed=5)[0]
    m = CategoricalHMM(n_components=20, n_features=6, init_params="", params="")
    m.startprob_, m.transmat_, m.emissionprob_ = h.initial, h.transition, h.emission
    pred = predictive(h, tok)
    ours = np.log(np.take_along_axis(pred, tok[..., None], -1)[..., 0]).sum(1)
    ref = np.array([m.score(row[:, None]) for row in tok])
    np.testing.assert_allclose(ours, ref, rtol=1e-10)
    _, logp = filter_factored(h.initial, h.W, h.Q, h.emission, tok, dtype=F64)  # per-step log p(o_t | o_<t)
    np.testing.assert_allclose(logp.sum(1).numpy(), ref, rtol=1e-10)
    _, logp32 = filter_factored(h.initial, h.W, h.Q, h.emission, tok)  # float32 default
    assert logp32.dtype == torch.float32
    np.testing.assert_allclose(logp32.sum(1).numpy(), ref, rtol=1e-4)


def test_filtering_is_causal():
    h = make_hmm(HMMConfig(n_tasks=1, n_states=16, n_tokens=5, rank=3))
    rng = np.random.default_rng(0)
    tok = torch.as_tensor(rng.integers(0, 5, (4, 30)))
    base, base_lp = filter_factored(h.initial, h.W, h.Q, h.emission, tok)
    for t in (0, 7, 29):
        alt = tok.clone()
        alt[:, t:] = torch.as_tensor(rng.integers(0, 5, (4, 30 - t)))
        alt[:, t] = (tok[:, t] + 1) % 5  # surely changed
        pred, lp = filter_factored(h.initial, h.W, h.Q, h.emission, alt)
        assert torch.equal(pred[:, :t + 1], base[:, :t + 1])  # prediction of o_t uses tokens < t only
        assert torch.equal(lp[:, :t], base_lp[:, :t])
        if t < 29:
            assert not torch.equal(pred[:, t + 1], base[:, t + 1])


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_long_sequence_is_stable(dtype):
    h = make_hmm(HMMConfig(n_tasks=1, n_states=32, n_tokens=8, rank=4, gamma=0.5))
    tok = h.sample(2, 5000, seed=1)[0]
    pred, logp = filter_factored(h.initial, h.W, h.Q, h.emission, tok, dtype=dtype)
    assert torch.isfinite(pred).all() and torch.isfinite(logp).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert (pred.sum(-1) - 1).abs().max() < tol
    assert logp.sum(1).max() < -1000  # the joint probability itself would underflow
    _, lp64 = filter_factored(h.initial, h.W, h.Q, h.emission, tok, dtype=F64)
    np.testing.assert_allclose(logp.sum(1).numpy(), lp64.sum(1).numpy(), rtol=1e-4)


def test_shared_and_per_sequence_parameters_agree():
    h = make_hmm(HMMConfig(n_tasks=1, n_states=12, n_tokens=4, rank=3))
    rng = np.random.default_rng(2)
    N = 5
    tok = rng.integers(0, 4, (N, 25))
    start = rng.dirichlet(np.ones(12), N)
    reset = np.zeros(25, bool)
    reset[10] = True
    kw = dict(reset=reset, start=start, start_pos=18, dtype=F64)
    shared = filter_factored(h.initial, h.W, h.Q, h.emission, tok, **kw)
    rep = lambda a: np.repeat(a[None], N, 0)  # noqa: E731
    per = filter_factored(rep(h.initial), rep(h.W), rep(h.Q), rep(h.emission), tok, **kw)
    mixed = filter_factored(h.initial, rep(h.W), h.Q, rep(h.emission), tok, **kw)
    for other in (per, mixed):
        for a, b in zip(shared, other):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    # reset / start semantics against independent runs
    pred = shared[0].numpy()
    np.testing.assert_allclose(pred[:, 10:18], predictive(h, tok[:, 10:18]), atol=1e-13)
    h2 = lambda i: HMM(start[i], h.transition, h.emission, factors=(h.W, h.Q))  # noqa: E731
    for i in range(N):
        np.testing.assert_allclose(pred[i, 18:], predictive(h2(i), tok[i, 18:])[0], atol=1e-13)


def test_missing_tokens_are_skipped():
    h = make_hmm(HMMConfig(n_tasks=1, n_states=8, n_tokens=4, rank=2))
    tok = np.array([[0, 1, 4, 2, 3], [0, 1, -1, 2, 3]])
    pred, logp = filter_factored(h.initial, h.W, h.Q, h.emission, tok, dtype=F64)
    ref = predictive(h, np.array([[0, 1, 2, 3]]))[0]
    for i in range(2):
        assert torch.isnan(pred[i, 2]).all() and logp[i, 2] == 0
        np.testing.assert_allclose(pred[i, [0, 1, 3, 4]].numpy(), ref, atol=1e-14)


# ---------------------------------------------------------------- episodes


def _toy_mixture(seed=0, n_tasks=2, S=2, V=2):
    rng = np.random.default_rng(seed)
    hs = [_random_hmm(rng, S, V) for _ in range(n_tasks)]
    prior = rng.dirichlet(np.ones(n_tasks))
    return Mixture(np.stack([h.initial for h in hs]), np.stack([h.W for h in hs]), np.stack([h.Q for h in hs]),
                   np.stack([h.emission for h in hs]), prior), hs


def _toy_episodes(mix, task_ids, tokens, n_demos, l_demo, l_test, test_start="initial", burn_in=0):
    seg, pos = layout(n_demos, l_demo, l_test)
    return SimpleNamespace(tokens=tokens, task_ids=np.asarray(task_ids), segment=seg, position=pos,
                           test_mask=seg == n_demos, n_demos=n_demos, test_start=test_start, burn_in=burn_in,
                           meta={})


def _brute_episode(h, ep_tokens, seg, test_start_dist):
    """Per position: (p(o_<t | task), p(o_t = . | o_<t, task)); the segments are independent given the task."""
    done, out = 1.0, []
    n_demos = seg.max()
    for t, s in enumerate(seg):
        if s < 0:
            out.append((None, None))
            continue
        if t == 0 or seg[t - 1] != s:
            first = t
        start = test_start_dist if s == n_demos else h.initial
        prefix = list(ep_tokens[first:t])
        pre = done * _joint(start, h.transition, h.emission, prefix)
        out.append((pre, _brute_predictive(start, h.transition, h.emission, prefix + [0])[-1]))
        if t + 1 == len(seg) or seg[t + 1] != s:
            done *= _joint(start, h.transition, h.emission, list(ep_tokens[first:t + 1]))
    return out


@pytest.mark.parametrize("test_start, burn_in", [("initial", 0), ("midstream", 3)])
def test_oracles_match_brute_force(test_start, burn_in):
    mix, hs = _toy_mixture(seed=4)
    rng = np.random.default_rng(7)
    n_demos, l_demo, l_test = 2, 2, 3
    seg, _ = layout(n_demos, l_demo, l_test)
    tokens = np.where(seg >= 0, rng.integers(0, 2, (4, len(seg))), 2)
    task_ids = np.array([0, 1, 1, 0])
    ep = _toy_episodes(mix, task_ids, tokens, n_demos, l_demo, l_test, test_start, burn_in)
    starts = [h.initial @ np.linalg.matrix_power(h.transition, burn_in) for h in hs]
    brute = [[_brute_episode(hs[j], tokens[i], seg, starts[j]) for j in range(2)] for i in range(4)]
    to = task_oracle(mix, ep, dtype=F64).numpy()
    mo, post = mixture_oracle(mix, ep, chunk_tasks=1, posterior_at=[0, 4, len(seg)], dtype=F64)
    mo, post = mo.numpy(), post.numpy()
    assert to.shape == mo.shape == (4, len(seg), 2)
    for i in range(4):
        for t in range(len(seg)):
            if seg[t] < 0:
                assert np.isnan(to[i, t]).all() and np.isnan(mo[i, t]).all()
                continue
            np.testing.assert_allclose(to[i, t], brute[i][task_ids[i]][t][1], atol=1e-12)
            w = np.array([mix.prior[j] * brute[i][j][t][0] for j in range(2)])
            mixed = sum(w[j] / w.sum() * brute[i][j][t][1] for j in range(2))
            np.testing.assert_allclose(mo[i, t], mixed, atol=1e-12)
            if t == 4:
                np.testing.assert_allclose(post[i, 1], w / w.sum(), atol=1e-12)
        np.testing.assert_allclose(post[i, 0], mix.prior, atol=1e-12)
    assert not np.allclose(post[:, 2], post[:, 2].mean(0))  # evidence moves the posterior


def test_mixture_oracle_chunking_and_real_episodes():
    mix = make_mixture(HMMConfig(n_tasks=7, n_states=10, n_tokens=5, rank=3, gamma=0.7))
    ep = sample_episodes(mix, DataConfig(n_demos=3, l_demo=6, l_test=8, test_start="midstream", burn_in=4), 6)
    a, pa = mixture_oracle(mix, ep, chunk_tasks=7, posterior_at="test_start", dtype=F64)
    b, pb = mixture_oracle(mix, ep, chunk_tasks=2, posterior_at="test_start", dtype=F64)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(pa, pb, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="chunk_tasks must be positive"):
        mixture_oracle(mix, ep, chunk_tasks=0, dtype=F64)
    assert pa.shape == (6, 7) and torch.allclose(pa.sum(-1), torch.ones(6, dtype=F64))
    obs = torch.as_tensor(ep.is_obs)
    assert torch.isnan(a[:, ~obs]).all() and torch.isfinite(a[:, obs]).all()
    torch.testing.assert_close(a[:, obs].sum(-1), torch.ones(6, int(obs.sum()), dtype=F64))
    # one task in the mixture: the mixture oracle is the task oracle; float32 close to float64
    sub = mix.subset([2])
    one = sample_episodes(sub, DataConfig(n_demos=2, l_demo=5, l_test=6), 3)
    torch.testing.assert_close(mixture_oracle(sub, one, dtype=F64)[0], task_oracle(sub, one, dtype=F64),
                               rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(task_oracle(sub, one).double(), task_oracle(sub, one, dtype=F64),
                               rtol=0, atol=1e-5, equal_nan=True)


def test_task_oracle_resets_at_demos():
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=10, n_tokens=5, rank=3))
    ep = sample_episodes(mix, DataConfig(n_demos=3, l_demo=7, l_test=9), 5)
    pred = task_oracle(mix, ep, dtype=F64).numpy()
    for i in range(5):
        h = mix.task(ep.task_ids[i])
        for s in range(ep.n_demos + 1):
            cols = ep.segment == s
            np.testing.assert_allclose(pred[i, cols], predictive(h, ep.tokens[i, cols])[0], atol=1e-13)
    assert np.isnan(pred[:, ep.segment < 0]).all()


# ---------------------------------------------------------------- fixed memory


def _stationary_start(h):
    return HMM(h.stationary, h.transition, h.emission, factors=(h.W, h.Q))


def test_memory_predictor():
    h0 = make_hmm(HMMConfig(n_tasks=1, n_states=16, n_tokens=4, rank=3, gamma=0.6, rho=0.1))
    h = _stationary_start(h0)  # reference: the same chain started from its stationary distribution
    assert np.abs(h0.initial - h.initial).max() > 0.05
    tok = h.sample(3, 20, seed=3, start=h.stationary)[0]
    full = predictive(h, tok)
    np.testing.assert_allclose(memory_predictor(h0, tok, 20), full, atol=1e-13)
    m5 = memory_predictor(h0, tok, 5)
    np.testing.assert_allclose(m5[:, :6], full[:, :6], atol=1e-13)  # window covers the whole past
    for t in (6, 13, 19):  # the window tokens t-5..t-1 only, from stationary
        np.testing.assert_allclose(m5[:, t], predictive(h, tok[:, t - 5:t + 1])[:, -1], atol=1e-13)
    assert np.abs(m5[:, 6:] - full[:, 6:]).max() > 1e-4
    m0 = memory_predictor(h0, tok, 0)
    np.testing.assert_allclose(m0, np.broadcast_to(h.stationary @ h.emission, m0.shape), atol=1e-14)
    alt = tok.copy()
    alt[:, 10:] = (alt[:, 10:] + 1) % 4
    assert np.array_equal(memory_predictor(h0, alt, 5)[:, :11], m5[:, :11])  # causal


def test_memory_error_matches_direct_computation():
    h0 = make_hmm(HMMConfig(n_tasks=1, n_states=12, n_tokens=4, rank=3, gamma=0.6, rho=0.1, seed=2))
    h = _stationary_start(h0)
    r = memory_error(h0, [3, 1], n_histories=50, burn_in=10, seed=2)
    tok = h0.sample(50, 13, seed=2, start=h0.stationary)[0]  # histories o_1..o_t, t = burn_in + max L
    nxt = lambda x: predictive(h, np.c_[x, np.zeros(len(x), int)])[:, -1]  # noqa: E731  p(o_{t+1} | x)
    for L, eps in zip([3, 1], r.eps):
        tv = 0.5 * np.abs(nxt(tok) - nxt(tok[:, -L:])).sum(1)
        assert abs(eps - tv.mean()) < 1e-12
    np.testing.assert_array_equal(r.lengths, [3, 1])


def test_memory_error_decreases_in_L():
    h = make_hmm(HMMConfig(n_tasks=1, n_states=16, n_tokens=8, rank=4, gamma=0.5, rho=0.05, seed=1))
    r = memory_error(h, [1, 2, 4, 8, 16], n_histories=400, burn_in=50, seed=0)
    assert isinstance(r, MemoryErrorResult) and r.eps.shape == r.stderr.shape == (5,)
    assert np.all(np.diff(r.eps) < 0) and r.eps[0] > 0.01 and np.all(r.stderr > 0)
    assert r.eps[-1] < r.eps[0] / 3
    r2 = memory_error(h, [1, 2, 4, 8, 16], n_histories=400, burn_in=50, seed=0)
    assert np.array_equal(r.eps, r2.eps) and (r.n_histories, r.burn_in) == (400, 50)


def test_memory_error_vanishes_when_fully_observed():
    # gamma = 1 with an injective revealing map (S <= V): the last token reveals the state exactly
    h = make_hmm(HMMConfig(n_tasks=1, n_states=6, n_tokens=8, rank=3, gamma=1.0, rho=0.1))
    r = memory_error(h, [1, 2, 5], n_histories=200, burn_in=20, seed=1)
    assert np.all(r.eps < 1e-6)
    noisy = make_hmm(HMMConfig(n_tasks=1, n_states=6, n_tokens=8, rank=3, gamma=0.5, rho=0.1))
    assert memory_error(noisy, [1], n_histories=200, burn_in=20, seed=1).eps[0] > 1e-3


# ---------------------------------------------------------------- fast paths


def test_predictive_default_is_float32_within_1e6_of_float64():
    h = _random_hmm(np.random.default_rng(11), 128, 16)
    tok = h.sample(8, 300, seed=1)[0]
    p32 = filtering.predictive(h, tok)
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, predictive(h, tok), rtol=0, atol=1e-6)


def _per_seq(a, n):  # the same parameters with a leading N axis: forces the rank-d path
    return np.repeat(np.asarray(a)[None], n, 0)


@pytest.mark.parametrize("dtype, tol", [(F64, 1e-12), (torch.float32, 1e-6)])
def test_dense_path_matches_factor_path(dtype, tol):
    """Dense HMM (Q = I): the S x S forward against the factor path on the same input, with resets, a
    start belief, missing tokens and a probability-0 observation, in chunks smaller than the batch."""
    rng = np.random.default_rng(5)
    h = _random_hmm(rng, 6, 4)
    O = h.emission.copy()
    O[:, 3] = 0.0
    O[0, 3] = 1.0 - O[0, :3].sum()  # token 3 only from state 0
    O[1:, :3] /= O[1:, :3].sum(1, keepdims=True)
    T = h.transition.copy()
    T[:, 0] = 0.0
    T /= T.sum(1, keepdims=True)  # state 0 is never re-entered: a late token 3 has probability 0
    N, L = 7, 19
    tok = rng.integers(0, 3, (N, L))
    tok[:, 4] = 4  # delimiter: missing
    tok[2, 9] = -1
    tok[3, 12] = 3
    start = rng.dirichlet(np.ones(6), N)
    reset = np.zeros(L, bool)
    reset[5] = True
    kw = dict(reset=reset, start=start, start_pos=13, dtype=dtype)
    pd, ld, _ = filtering.dense_run(*(torch.as_tensor(a, dtype=dtype) for a in (h.initial, T, O)),
                                     torch.as_tensor(tok), reset=reset, start=torch.as_tensor(start, dtype=dtype),
                                     start_pos=13, chunk=3)
    pf, lf = filter_factored(h.initial, _per_seq(T, N), _per_seq(np.eye(6), N), O, tok, **kw)
    pp, lp = filter_factored(h.initial, T, np.eye(6), O, tok, **kw)  # public entry: routed to the dense path
    for p, lg in ((pd, ld), (pp, lp)):
        torch.testing.assert_close(p, pf, rtol=0, atol=tol, equal_nan=True)
        torch.testing.assert_close(lg, lf, rtol=0, atol=tol)
    assert torch.isneginf(lp[3, 12]) and (lp[3, 13:] == lp[3, 13:]).all()  # -inf, never NaN
    assert torch.isnan(pp[:, 4]).all() and (lp[:, 4] == 0).all()


def _kernel_and_torch(mix, ep, **kw):
    got = mixture_oracle(mix, ep, **kw)
    saved, inference.numba_kernel = inference.numba_kernel, lambda: None
    try:
        ref = mixture_oracle(mix, ep, **kw)
    finally:
        inference.numba_kernel = saved
    return got, ref


@pytest.mark.skipif(inference.numba_kernel() is None, reason="numba not installed: the torch path is the only one")
def test_mixture_kernel_keeps_torchs_thread_count():
    """numba's OpenMP layer resets the process's OpenMP thread count (torch's too): training after the oracle
    ran on every core, whatever HMMSCOPE_THREADS said, and a resumed run was not bitwise the uninterrupted one."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: numba's thread count cannot differ from torch's")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mix = make_mixture(HMMConfig(n_tasks=3, n_states=6, n_tokens=4, rank=2))
        mixture_oracle(mix, sample_episodes(mix, DataConfig(n_demos=2, l_demo=5, l_test=6), 2), dtype=F64)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(inference.numba_kernel() is None, reason="numba not installed: the torch path is the only one")
def test_mixture_kernel_matches_torch_path_with_skipping():
    """The compiled CPU kernel against the torch path (the one CUDA runs). gamma = 0.95 and long demos
    make the posterior collapse, so the kernel's bounded skipping and chain stopping do fire."""
    mix = make_mixture(HMMConfig(n_tasks=40, n_states=12, n_tokens=6, rank=3, gamma=0.95, rho=0.02, seed=4))
    ep = sample_episodes(mix, DataConfig(n_demos=3, l_demo=40, l_test=30, test_start="midstream", burn_in=3), 5)
    pos = [0, 41, int(np.flatnonzero(ep.test_mask)[0]), ep.seq_len]
    (a, pa), (b, pb) = _kernel_and_torch(mix, ep, posterior_at=pos, dtype=F64)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(pa, pb, rtol=0, atol=1e-12)
    assert (pb[:, -1].max(-1).values > 1 - 1e-9).all()  # collapsed posterior
    assert (pa[:, -1] == 0).float().mean() > 0.5  # the kernel stopped most chains (their weight < exp(-theta))
    import numba

    saved = torch.get_num_threads()
    try:  # the kernel uses as many threads as torch (one per sweep worker), never all cores
        torch.set_num_threads(1)
        (c, _), (d, _) = _kernel_and_torch(mix, ep, dtype=torch.float32)
        assert numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.double(), b, rtol=0, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(d.double(), b, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(inference.numba_kernel() is None, reason="numba not installed: the torch path is the only one")
@pytest.mark.parametrize("rank", [5, 17])  # the kernel unrolled over the rank; above MAX_UNROLL the generic one
def test_mixture_kernel_matches_torch_path_with_missing_tokens(rank):
    """Kernel against the torch path on episodes with restarts at every demo, a midstream test start,
    missing tokens inside the demos and the test (no evidence: the chain does not advance, NaN rows),
    unknown task ids (no task is run first) and posteriors at several positions, missing ones included."""
    kern = inference.numba_kernel()
    assert (kern.for_rank(rank) is kern) == (not kern.MIN_UNROLL <= rank <= kern.MAX_UNROLL)
    mix = make_mixture(HMMConfig(n_tasks=11, n_states=20, n_tokens=5, rank=rank, gamma=0.9, seed=3))
    ep = sample_episodes(mix, DataConfig(n_demos=3, l_demo=9, l_test=12, test_start="midstream", burn_in=2), 6)
    tok = np.asarray(ep.tokens).astype(np.int64)
    rng = np.random.default_rng(0)
    obs = np.flatnonzero(ep.is_obs)
    hole = rng.choice(obs[1:], 6, replace=False)
    tok[:, hole] = -1  # missing in every episode (one layout)
    tok[2, obs[5]] = -1  # and in one episode only
    test_pos = int(np.flatnonzero(ep.test_mask)[0])
    e = SimpleNamespace(tokens=tok, segment=ep.segment, test_mask=ep.test_mask, meta=ep.meta,
                        task_ids=np.where(np.arange(6) % 2, ep.task_ids, -1))
    pos = [0, int(hole[0]), test_pos, test_pos + 1, ep.seq_len]
    (a, pa), (b, pb) = _kernel_and_torch(mix, e, posterior_at=pos, dtype=F64)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(pa, pb, rtol=0, atol=1e-12)
    miss = (tok < 0) | (tok >= mix.n_tokens)
    assert torch.isnan(a[torch.as_tensor(miss)]).all() and torch.isfinite(a[torch.as_tensor(~miss)]).all()
    assert not torch.allclose(pa[:, -1], pa[:, 0])  # evidence moved the posterior


@pytest.mark.slow  # an uncached compile (~10-20 s)
@pytest.mark.skipif(inference.numba_kernel() is None, reason="numba not installed: the torch path is the only one")
def test_mixture_kernel_without_a_writable_cache_folder(tmp_path, monkeypatch):
    """No writable cache folder for the rank-specialized copy: it is compiled in memory (uncached), same outputs."""
    kern = inference.numba_kernel()
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # mkdir under a file fails
    monkeypatch.setattr(kern, "_SPECIAL", {})
    mod = kern.for_rank(4)
    assert getattr(mod, "__file__", None) is None and mod is not kern  # built in memory
    assert not (blocker.parent / "hmmscope").exists()
    mix = make_mixture(HMMConfig(n_tasks=5, n_states=6, n_tokens=4, rank=4, gamma=0.8, seed=2))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=6, l_test=7, test_start="midstream", burn_in=2), 3)
    (a, pa), (b, pb) = _kernel_and_torch(mix, ep, posterior_at="test_start", dtype=F64)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(pa, pb, rtol=0, atol=1e-12)


def test_results_are_named_tuples_on_every_path(monkeypatch):
    """The filter gives Filtered(pred, logp) on the dense and the factored path; the mixture oracle gives
    MixturePrediction(pred, posterior) on the compiled CPU kernel and on the torch path; fields by name or position."""
    hmm = make_hmm(HMMConfig(n_tasks=1, n_states=5, n_tokens=3, rank=2, gamma=0.7))
    tok = np.random.default_rng(0).integers(0, 3, (4, 7))
    for W, Q in ((hmm.W, hmm.Q), (hmm.W @ hmm.Q, np.eye(5))):  # factored, dense
        f = filter_factored(hmm.initial, W, Q, hmm.emission, tok, dtype=F64)
        assert isinstance(f, filtering.Filtered) and f.pred.shape == (4, 7, 3) and f.logp.shape == (4, 7)
        pred, logp = f
        assert pred is f.pred and logp is f.logp
    mix = make_mixture(HMMConfig(n_tasks=3, n_states=5, n_tokens=3, rank=2, gamma=0.7))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=4, l_test=5), 2)
    got = [mixture_oracle(mix, ep, posterior_at="test_start", dtype=F64)]
    monkeypatch.setattr(inference, "numba_kernel", lambda: None)  # the torch path
    got.append(mixture_oracle(mix, ep, posterior_at="test_start", dtype=F64))
    for m in got:
        assert isinstance(m, inference.MixturePrediction) and m.pred.shape == (2, ep.seq_len, 3)
        assert m.posterior.shape == (2, 3)
    torch.testing.assert_close(got[0].pred, got[1].pred, rtol=0, atol=1e-12, equal_nan=True)
