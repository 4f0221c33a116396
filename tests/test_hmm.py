"""HMM validation, the two transition families, emissions, hashing, chain properties, HMM.sample."""

import dataclasses

import numpy as np
import pytest

from hmmscope.config import HMMConfig, config_hash
from hmmscope.data.hmm import HMM, dobrushin, make_hmm, make_mixture, mixing_rate, stationary_distribution


def _random_hmm_arrays(S=4, V=3, seed=0):
    rng = np.random.default_rng(seed)
    mu = rng.dirichlet(np.ones(S))
    T = rng.dirichlet(np.ones(S), size=S)
    O = rng.dirichlet(np.ones(V), size=S)
    return mu, T, O


# ---------------------------------------------------------------- validation


def test_valid_hmm_accepted():
    mu, T, O = _random_hmm_arrays()
    h = HMM(mu, T, O)
    assert (h.n_states, h.n_tokens, h.rank) == (4, 3, 4)
    np.testing.assert_allclose(h.W @ h.Q, T)


@pytest.mark.parametrize("which, bad, match", [
    ("T", lambda T: T[:3], "transition must be"),
    ("O", lambda O: O[:3], "emission must have 4 rows"),
    ("mu", lambda mu: mu[:3] / mu[:3].sum(), "transition must be"),
    ("T", lambda T: T.ravel(), "2-dimensional"),
])
def test_shape_mismatch(which, bad, match):
    arrs = dict(zip(("mu", "T", "O"), _random_hmm_arrays()))
    arrs[which] = bad(arrs[which])
    with pytest.raises(ValueError, match=match):
        HMM(arrs["mu"], arrs["T"], arrs["O"])


def test_negative_entries():
    mu, T, O = _random_hmm_arrays()
    O = O.copy()
    O[0, 0], O[0, 1] = -0.1, O[0, 1] + O[0, 0] + 0.1  # row still sums to 1
    with pytest.raises(ValueError, match="emission has negative entries"):
        HMM(mu, T, O)


@pytest.mark.parametrize("which", ["initial", "transition", "emission"])
def test_rows_must_sum_to_one(which):
    arrs = dict(zip(("initial", "transition", "emission"), _random_hmm_arrays()))
    arrs[which] = arrs[which] * 1.1
    with pytest.raises(ValueError, match=f"{which} rows must sum to 1"):
        HMM(arrs["initial"], arrs["transition"], arrs["emission"])


def test_non_finite_and_bad_factors():
    mu, T, O = _random_hmm_arrays()
    T2 = T.copy()
    T2[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        HMM(mu, T2, O)
    W = np.full((4, 2), 0.5)
    Q = np.random.default_rng(0).dirichlet(np.ones(4), size=2)
    with pytest.raises(ValueError, match="W @ Q == transition"):
        HMM(mu, T, O, factors=(W, Q))
    HMM(mu, W @ Q, O, factors=(W, Q))  # consistent factors are accepted


# ---------------------------------------------------------------- families


@pytest.mark.parametrize("family", ["dirichlet", "sticky"])
def test_factors_row_stochastic_and_low_rank(family):
    cfg = HMMConfig(family=family, n_tasks=5, n_states=24, n_tokens=6, rank=4, rho=0.1, seed=3)
    mix = make_mixture(cfg)
    assert mix.W.shape == (5, 24, 4) and mix.Q.shape == (5, 4, 24) and mix.emission.shape == (5, 24, 6)
    for a in (mix.W, mix.Q, mix.emission, mix.initial):
        assert np.all(a >= 0)
        np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(mix.prior, np.full(5, 0.2))
    for i in range(5):
        T = mix.transition(i)
        np.testing.assert_allclose(T.sum(1), 1.0, atol=1e-12)
        r = np.linalg.matrix_rank(T)
        assert r <= 4
        assert r == 4  # generic draws reach the full rank d


def test_sticky_structure():
    S, d = 12, 3
    mix = make_mixture(HMMConfig(family="sticky", n_tasks=4, n_states=S, rank=d, rho=0.1, seed=1))
    cluster = np.arange(S) * d // S
    off = cluster[None, :] != np.arange(d)[:, None]  # (d, S): Q row k must vanish off cluster k
    assert np.all(mix.Q[:, off] == 0)
    assert np.all(mix.Q[:, ~off] > 0)
    # with rho = 0 each W row is one-hot, constant on a cluster, and the clusters map by a permutation
    mix0 = make_mixture(HMMConfig(family="sticky", n_tasks=6, n_states=S, rank=d, rho=0.0, seed=1))
    assert np.all(np.sort(mix0.W, -1)[..., :-1] == 0) and np.all(mix0.W.max(-1) == 1)
    target = mix0.W.argmax(-1)  # (n, S)
    for i in range(6):
        sigma = [target[i, cluster == j][0] for j in range(d)]
        assert all(np.all(target[i, cluster == j] == sigma[j]) for j in range(d))
        assert sorted(sigma) == list(range(d))


def test_make_mixture_deterministic():
    cfg = HMMConfig(n_tasks=3, n_states=10, n_tokens=4, rank=3, seed=7)
    a, b = make_mixture(cfg), make_mixture(cfg)
    c = make_mixture(dataclasses.replace(cfg, seed=8))
    for f in ("initial", "W", "Q", "emission", "prior"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
    assert a.config_hash == b.config_hash != c.config_hash
    assert not np.array_equal(a.W, c.W) and not np.array_equal(a.initial, c.initial)
    np.testing.assert_array_equal(make_hmm(cfg, task=2).transition, a.transition(2))


def test_config_hash_stable_and_sensitive():
    cfg = HMMConfig()
    assert config_hash(cfg) == config_hash(HMMConfig()) and len(config_hash(cfg)) == 16
    seen = {config_hash(cfg)}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, str):
            new = "dirichlet" if v != "dirichlet" else "sticky"
        else:
            new = v + 1 if isinstance(v, int) else v / 2
        h = config_hash(dataclasses.replace(cfg, **{f.name: new}))
        assert h not in seen, f"hash did not change with {f.name}"
        seen.add(h)


def test_emission_revealing_map():
    g = 0.7
    mix = make_mixture(HMMConfig(n_tasks=4, n_states=5, n_tokens=8, rank=2, gamma=g, seed=2))
    for O in mix.emission:
        reveal = O.argmax(1)
        assert len(set(reveal)) == 5  # injective when S <= V
        E = np.eye(8)[reveal]
        np.testing.assert_allclose(O, g * E + (1 - g) / 8, atol=1e-15)
    big = make_mixture(HMMConfig(n_tasks=2, n_states=20, n_tokens=8, rank=2, gamma=g, seed=2))
    for O in big.emission:  # S > V: each token revealed by floor or ceil of S / V states
        counts = np.bincount(O.argmax(1), minlength=8)
        assert set(counts) <= {2, 3} and counts.sum() == 20


# ---------------------------------------------------------------- chain properties


def test_stationary_is_fixed_point():
    for seed in range(3):
        h = make_hmm(HMMConfig(family="dirichlet", n_tasks=1, n_states=9, n_tokens=3, rank=3, seed=seed))
        pi = h.stationary
        assert np.all(pi >= 0) and abs(pi.sum() - 1) < 1e-12
        np.testing.assert_allclose(pi @ h.transition, pi, atol=1e-10)
    P = np.array([[0.0, 1.0], [1.0, 0.0]])  # periodic chain: the unique stationary law is uniform
    np.testing.assert_allclose(stationary_distribution(P), [0.5, 0.5], atol=1e-12)


@pytest.mark.parametrize("S", [5, 70])  # 70 crosses the 64-row chunk boundary
def test_dobrushin_brute_force(S):
    T = np.random.default_rng(S).dirichlet(np.full(S, 0.3), size=S)
    brute = max(0.5 * np.abs(T[i] - T[j]).sum() for i in range(S) for j in range(S))
    assert dobrushin(T) == pytest.approx(brute, abs=1e-12)
    assert dobrushin(np.tile(T[:1], (S, 1))) == 0.0
    assert dobrushin(np.eye(S)) == 1.0


def test_hmm_sample_shapes_and_dtypes():
    h = make_hmm(HMMConfig(n_tasks=1, n_states=7, n_tokens=5, rank=3))
    tok, st = h.sample(11, 13, seed=4)
    assert tok.shape == st.shape == (11, 13)
    assert np.issubdtype(tok.dtype, np.integer) and np.issubdtype(st.dtype, np.integer)
    assert tok.min() >= 0 and tok.max() < 5 and st.min() >= 0 and st.max() < 7
    tok2, st2 = h.sample(11, 13, seed=4)
    assert np.array_equal(tok, tok2) and np.array_equal(st, st2)
    assert not np.array_equal(tok, h.sample(11, 13, seed=5)[0])
    start = np.eye(7)[3]
    _, st3 = h.sample(50, 4, seed=0, start=start)
    assert np.all(st3[:, 0] == 3)


def test_mixing_rate_known_answers():
    a, b = 0.1, 0.3
    T = np.array([[1 - a, a], [b, 1 - b]])  # eigenvalues 1 and 1 - a - b
    assert mixing_rate(T) == pytest.approx(-np.log(1 - a - b))
    assert mixing_rate(np.full((3, 3), 1 / 3)) == np.inf  # one step to stationarity
    assert mixing_rate(np.eye(3)) == 0.0  # never forgets
    for fam in ("sticky", "dirichlet"):  # the factored form (d x d matrix Q W) agrees with the dense T
        h = make_hmm(HMMConfig(family=fam, n_states=12, rank=3, rho=0.05, seed=2))
        lam = np.sort(np.abs(np.linalg.eigvals(h.transition)))[::-1]
        assert h.mixing_rate() == pytest.approx(-np.log(lam[1]), rel=1e-9)
    # sticky chains forget at about rho per step (the prototype permutation has |eigenvalues| 1 - rho)
    h = make_hmm(HMMConfig(family="sticky", n_states=64, rank=8, rho=0.02, seed=0))
    assert 0.005 < h.mixing_rate() < 0.06 and h.dobrushin() > 0.95


# ---------------------------------------------------------------- seed streams (SCIENCE.md 8)

# sha256 (first 32 hex) of make_mixture's arrays, computed before seed streams existed (commit b4f5d8b): the
# training stream must stay bit-identical, or old records stop being reproducible
TRAINING_BITS = {"sticky": "ca65f3574293a2dcc98982720df62a3a", "dirichlet": "b2698662d485a81b7746ce041ee953cb"}


def _bits(m) -> str:
    import hashlib

    h = hashlib.sha256()
    for a in (m.initial, m.W, m.Q, m.emission, m.prior):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("family", ["sticky", "dirichlet"])
def test_training_stream_is_bit_identical_to_before_and_other_streams_differ(family):
    cfg = HMMConfig(family=family, n_tasks=5, n_states=6, n_tokens=4, rank=3, seed=11)
    train = make_mixture(cfg)
    assert _bits(train) == _bits(make_mixture(cfg, stream="train")) == TRAINING_BITS[family]
    unseen, other = make_mixture(cfg, stream="unseen"), make_mixture(cfg, stream="other")
    assert _bits(unseen) == _bits(make_mixture(cfg, stream="unseen"))  # reproducible
    assert len({_bits(train), _bits(unseen), _bits(other)}) == 3
    assert len({train.config_hash, unseen.config_hash, other.config_hash}) == 3 and train.config_hash == config_hash(cfg)
    # the same family: shapes, row sums, the emission structure (gamma E + (1 - gamma) U)
    for m in (unseen, other):
        assert m.W.shape == train.W.shape and m.emission.shape == train.emission.shape
        np.testing.assert_allclose(m.transition(0).sum(1), 1.0)
        assert np.allclose(np.sort(np.unique(m.emission.round(12))), np.sort(np.unique(train.emission.round(12))))
    with pytest.raises(ValueError, match="stream"):
        make_mixture(cfg, stream="")


def test_structure_halves_split_the_revealing_maps_and_heldout_tasks_are_new():
    """hmm.structures (issue 34.2: fresh tasks are new only in their continuous parameters unless their discrete
    structure, the revealing map, is held out): the halves split the 8!/4! = 1680 maps of S = 4, V = 8 about evenly;
    "half" draws every task from half 0; "half-heldout" draws the training streams from half 0 and the evaluation
    streams from half 1, so no evaluated task's map occurs in training."""
    import itertools

    from hmmscope.config import Config, ConfigError, override
    from hmmscope.data.hmm import structure_half

    maps = np.array(list(itertools.permutations(range(8), 4)))
    share = structure_half(maps, 8).mean()
    assert len(maps) == 1680 and 0.4 < share < 0.6
    cfg = HMMConfig(n_tasks=300, n_states=4, n_tokens=8, rank=4, seed=3)

    def reveal(c, **kw):
        return make_mixture(c, **kw).emission.argmax(-1)  # (n, S): gamma > 1/V, so the revealed token is the argmax

    assert np.array_equal(reveal(cfg), reveal(dataclasses.replace(cfg, structures="all")))
    half = dataclasses.replace(cfg, structures="half")
    for kw in ({}, {"stream": "unseen", "replicate": 1}, {"stream": "family", "replicate": 0}):
        assert (structure_half(reveal(half, **kw), 8) == 0).all()
    held = dataclasses.replace(cfg, structures="half-heldout")
    train = reveal(held)
    assert (structure_half(train, 8) == 0).all() and np.array_equal(train, reveal(half))
    assert (structure_half(reveal(held, stream="fresh", replicate=0), 8) == 0).all()
    for stream in ("unseen", "fit", "family"):
        ev = reveal(held, stream=stream, replicate=2)
        assert (structure_half(ev, 8) == 1).all()
        assert not {tuple(r) for r in ev} & {tuple(r) for r in train}
    with pytest.raises(ConfigError, match="hmm.structures"):
        override(Config(), {"hmm.structures": "odd"})
    with pytest.raises(ConfigError, match="n_states <= n_tokens"):
        override(Config(), {"hmm.structures": "half", "hmm.n_states": 16, "hmm.n_tokens": 8})
