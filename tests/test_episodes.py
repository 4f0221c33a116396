"""Sampler correctness (chi-square against the model), episode layout, seeding, save/load."""

import dataclasses
import os

import numpy as np
import pytest
from scipy import stats

from hmmscope.config import DataConfig, HMMConfig, config_hash
from hmmscope.data.episodes import Episodes, episode_arrays, layout, load_episodes, sample_episodes, save_episodes
from hmmscope.data.hmm import make_mixture, sample_sequences, state_distribution_after

P_MIN = 1e-3


def _chi2(obs, exp):
    """Pearson statistic and dof of counts `obs` vs expected `exp` (cells with exp < 5 merged)."""
    obs, exp = np.asarray(obs, float).ravel(), np.asarray(exp, float).ravel()
    assert obs[exp == 0].sum() == 0, "a zero-probability outcome was sampled"
    small = exp < 5
    if small.any():
        obs, exp = np.r_[obs[~small], obs[small].sum()], np.r_[exp[~small], exp[small].sum()]
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def _pvalue(pairs):
    """Combined p-value of independent chi-square statistics [(stat, dof), ...]."""
    stat, dof = map(sum, zip(*pairs))
    return stats.chi2.sf(stat, dof)


def _counts(a, b, na, nb):
    c = np.zeros((na, nb))
    np.add.at(c, (np.ravel(a), np.ravel(b)), 1)
    return c


@pytest.fixture(scope="module")
def mix3():
    return make_mixture(HMMConfig(family="dirichlet", n_tasks=3, n_states=6, n_tokens=4, rank=3, alpha=0.7, seed=5))


@pytest.fixture(scope="module")
def seqs3(mix3):
    rng = np.random.default_rng(123)
    task = rng.integers(3, size=3000)  # unsorted: exercises the internal sort by task and its inverse
    tok, st = sample_sequences(mix3, task, 12, rng)
    return task, tok, st


# ---------------------------------------------------------------- sample_sequences vs the model


def test_sequences_match_model(mix3, seqs3):
    task, tok, st = seqs3
    assert tok.shape == st.shape == (3000, 12) and tok.dtype == np.int32
    trans, emis, first = [], [], []
    for i in range(3):
        T, O, mu = mix3.transition(i), mix3.emission[i], mix3.initial[i]
        sel = task == i
        ct = _counts(st[sel, :-1], st[sel, 1:], 6, 6)
        ce = _counts(st[sel], tok[sel], 6, 4)
        trans += [_chi2(ct[s], ct[s].sum() * T[s]) for s in range(6)]
        emis += [_chi2(ce[s], ce[s].sum() * O[s]) for s in range(6)]
        first.append(_chi2(np.bincount(st[sel, 0], minlength=6), sel.sum() * mu))
    assert _pvalue(trans) > P_MIN
    assert _pvalue(emis) > P_MIN
    assert _pvalue(first) > P_MIN


def test_chi2_has_power(mix3, seqs3):
    """The same statistics reject the rows of the wrong task: the tests above can fail."""
    task, tok, st = seqs3
    sel = task == 0
    ct = _counts(st[sel, :-1], st[sel, 1:], 6, 6)
    T1 = mix3.transition(1)
    wrong = [_chi2(ct[s], ct[s].sum() * (0.999 * T1[s] + 0.001 / 6)) for s in range(6)]
    assert _pvalue(wrong) < P_MIN


def test_zero_probabilities_and_deterministic_emission():
    cfg = HMMConfig(family="sticky", n_tasks=4, n_states=12, n_tokens=16, rank=3, rho=0.0, gamma=1.0, seed=2)
    mix = make_mixture(cfg)
    rng = np.random.default_rng(0)
    task = rng.integers(4, size=2000)
    tok, st = sample_sequences(mix, task, 10, rng)
    for i in range(4):
        sel = task == i
        ct = _counts(st[sel, :-1], st[sel, 1:], 12, 12)
        assert ct[mix.transition(i) == 0].sum() == 0
        assert np.array_equal(tok[sel], mix.emission[i].argmax(1)[st[sel]])  # gamma = 1: o = reveal(s)


def test_start_argument_and_errors(mix3):
    rng = np.random.default_rng(0)
    start = np.zeros((5, 6))
    start[np.arange(5), [0, 1, 2, 3, 5]] = 1
    _, st = sample_sequences(mix3, np.arange(5) % 3, 3, rng, start=start)
    assert np.array_equal(st[:, 0], [0, 1, 2, 3, 5])
    with pytest.raises(ValueError, match="start must have shape"):
        sample_sequences(mix3, np.zeros(5, int), 3, rng, start=start[:4])
    with pytest.raises(ValueError, match="distributions"):
        sample_sequences(mix3, np.zeros(5, int), 3, rng, start=start * 2)
    with pytest.raises(ValueError, match="task ids"):
        sample_sequences(mix3, np.array([0, 3]), 3, rng)
    tok, st = sample_sequences(mix3, np.zeros(4, int), 0, rng)
    assert tok.shape == (4, 0)


# ---------------------------------------------------------------- episodes

DATA = DataConfig(n_demos=3, l_demo=5, l_test=7, seed=11)


def test_layout_and_masks(mix3):
    ep = sample_episodes(mix3, DATA, 50)
    T = 3 * 6 + 7
    assert ep.tokens.shape == ep.states.shape == (50, T) and len(ep) == 50 and ep.seq_len == T
    assert ep.delimiter == 4 and ep.vocab_size == 5
    delim = np.array([5, 11, 17])
    assert np.array_equal(np.flatnonzero(~ep.is_obs), delim)
    assert np.all(ep.tokens[:, delim] == 4) and np.all(ep.states[:, delim] == -1)
    obs = ep.is_obs
    assert ep.tokens[:, obs].max() < 4 and ep.states[:, obs].min() >= 0 and ep.states[:, obs].max() < 6
    assert np.array_equal(ep.segment, [0] * 5 + [-1] + [1] * 5 + [-1] + [2] * 5 + [-1] + [3] * 7)
    assert np.array_equal(ep.position, [0, 1, 2, 3, 4, -1] * 3 + list(range(7)))
    assert np.array_equal(np.flatnonzero(ep.test_mask), np.arange(18, 25))
    tm = ep.target_mask
    assert tm.shape == (T,) and not tm[-1]
    targets = ep.tokens[:, 1:][:, tm[:-1]]
    assert np.all(targets != ep.delimiter)  # the delimiter is never a target
    assert tm.sum() == obs[1:].sum()  # every observation but the first is one
    assert np.array_equal(np.flatnonzero(ep.test_target_mask), np.arange(17, 24))
    seg, pos = layout(0, 5, 4)
    assert np.array_equal(seg, [0] * 4) and np.array_equal(pos, np.arange(4))


def test_episode_emissions_and_restarts(mix3):
    """Episode tokens follow O given the states; every demo and the test restart from mu."""
    ep = sample_episodes(mix3, DATA, 400)
    for i in range(3):
        sel = ep.task_ids == i
        emis = _counts(ep.states[sel][:, ep.is_obs], ep.tokens[sel][:, ep.is_obs], 6, 4)
        assert _pvalue([_chi2(emis[s], emis[s].sum() * mix3.emission[i, s]) for s in range(6)]) > P_MIN
    first = ep.states[:, ep.position == 0]  # (N, k + 1): first state of every demo and of the test
    exp = mix3.initial[ep.task_ids].sum(0) * first.shape[1]
    assert _pvalue([_chi2(np.bincount(first.ravel(), minlength=6), exp)]) > P_MIN


def test_determinism_and_splits(mix3):
    a, b = sample_episodes(mix3, DATA, 64), sample_episodes(mix3, DATA, 64, "train")
    for f in ("tokens", "states", "task_ids"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
    assert a.meta == b.meta
    ev = sample_episodes(mix3, DATA, 64, "eval")
    assert not np.array_equal(a.tokens, ev.tokens)
    assert a.meta["dataset_hash"] != ev.meta["dataset_hash"] and ev.meta["split"] == "eval"
    other = sample_episodes(mix3, dataclasses.replace(DATA, seed=12), 64)
    assert not np.array_equal(a.tokens, other.tokens)
    assert a.meta["hmm_hash"] == mix3.config_hash and a.meta["data_hash"] == config_hash(DATA)
    sub = a.subset(np.arange(10, 20))
    assert np.array_equal(sub.tokens, a.tokens[10:20]) and np.array_equal(a[10:20].task_ids, a.task_ids[10:20])
    assert a[3].tokens.shape == (1, a.seq_len)


def test_task_frequencies_match_prior(mix3):
    prior = np.array([0.6, 0.3, 0.1])
    mix = dataclasses.replace(mix3, prior=prior)
    ep = sample_episodes(mix, DataConfig(n_demos=0, l_demo=1, l_test=1), 20000)
    counts = np.bincount(ep.task_ids, minlength=3)
    assert _pvalue([_chi2(counts, 20000 * prior)]) > P_MIN
    assert _pvalue([_chi2(counts, np.full(3, 20000 / 3))]) < P_MIN


def test_state_distribution_after_matches_dense(mix3):
    tasks = np.array([2, 0, 2, 1])
    np.testing.assert_array_equal(state_distribution_after(mix3, tasks, 0), mix3.initial[tasks])
    for B in (1, 2, 7):
        got = state_distribution_after(mix3, tasks, B)
        want = np.stack([mix3.initial[i] @ np.linalg.matrix_power(mix3.transition(i), B) for i in tasks])
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_midstream_first_test_state():
    mix = make_mixture(HMMConfig(family="sticky", n_tasks=1, n_states=8, n_tokens=4, rank=4, rho=0.3, seed=3))
    data = DataConfig(n_demos=1, l_demo=1, l_test=1, test_start="midstream", burn_in=3)
    ep = sample_episodes(mix, data, 20000)
    counts = np.bincount(ep.states[:, ep.test_mask][:, 0], minlength=8)
    target = state_distribution_after(mix, [0], 3)[0]
    assert _pvalue([_chi2(counts, 20000 * target)]) > P_MIN
    assert _pvalue([_chi2(counts, 20000 * mix.initial[0])]) < P_MIN  # mu T^3 != mu: the test has power
    assert ep.meta["test_start"] == "midstream" and ep.burn_in == 3
    demo = np.bincount(ep.states[:, 0], minlength=8)  # demos still start from mu
    assert _pvalue([_chi2(demo, 20000 * mix.initial[0])]) > P_MIN


def _naive_episode(mix, data, rng):
    """Independent reference: one episode by per-step draws from the dense T (rng.choice)."""
    i = rng.choice(mix.n_tasks, p=mix.prior)
    T, O, mu = mix.transition(i), mix.emission[i], mix.initial[i]

    def seq(n, burn):
        s = rng.choice(len(mu), p=mu)
        for _ in range(burn):
            s = rng.choice(len(mu), p=T[s])
        out = []
        for t in range(n):
            out.append((s, rng.choice(O.shape[1], p=O[s])))
            if t < n - 1:
                s = rng.choice(len(mu), p=T[s])
        return out

    segs = [seq(data.l_demo, 0) for _ in range(data.n_demos)] + [seq(data.l_test, data.burn_in)]
    return i, segs


def test_matches_naive_reference():
    mix = make_mixture(HMMConfig(family="sticky", n_tasks=2, n_states=4, n_tokens=3, rank=2, rho=0.2,
                                 gamma=0.6, seed=9))
    mix = dataclasses.replace(mix, prior=np.array([0.35, 0.65]))
    data = DataConfig(n_demos=1, l_demo=2, l_test=2, test_start="midstream", burn_in=2, seed=4)
    n = 3000
    ep = sample_episodes(mix, data, n)
    rng = np.random.default_rng(77)
    ref = [_naive_episode(mix, data, rng) for _ in range(n)]
    r_task = np.array([r[0] for r in ref])
    r_st = np.array([[s for seg in r[1] for s, _ in seg] for r in ref])  # (n, 4): demo s0 s1, test s0 s1
    r_tok = np.array([[o for seg in r[1] for _, o in seg] for r in ref])
    f_st, f_tok = ep.states[:, ep.is_obs], ep.tokens[:, ep.is_obs]
    for a, b, K in ((0, 1, 4), (2, 3, 4)):  # (task, state pair) in the demo and in the test
        fast = np.bincount(ep.task_ids * K * K + f_st[:, a] * K + f_st[:, b], minlength=2 * K * K)
        slow = np.bincount(r_task * K * K + r_st[:, a] * K + r_st[:, b], minlength=2 * K * K)
        table = np.stack([fast, slow])[:, (fast + slow) > 0]
        assert stats.chi2_contingency(table).pvalue > P_MIN
    for a, b, K in ((0, 1, 3), (2, 3, 3), (1, 2, 3)):  # (task, token pair); (1, 2) straddles the delimiter
        fast = np.bincount(ep.task_ids * K * K + f_tok[:, a] * K + f_tok[:, b], minlength=2 * K * K)
        slow = np.bincount(r_task * K * K + r_tok[:, a] * K + r_tok[:, b], minlength=2 * K * K)
        table = np.stack([fast, slow])[:, (fast + slow) > 0]
        assert stats.chi2_contingency(table).pvalue > P_MIN


# ---------------------------------------------------------------- save / load


def test_save_load_round_trip(mix3, tmp_path):
    ep = sample_episodes(mix3, DATA, 30, "eval")
    path = save_episodes(ep, tmp_path / "sub" / "eval.npz", config={"data.l_test": 7})
    assert os.listdir(tmp_path / "sub") == ["eval.npz"]  # no temp file left
    back = load_episodes(path)
    assert isinstance(back, Episodes)
    for f in ("tokens", "states", "task_ids", "segment", "position"):
        x, y = getattr(ep, f), getattr(back, f)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert (back.n_tokens, back.n_demos, back.l_demo, back.l_test) == (4, 3, 5, 7)
    assert back.meta["config"] == {"data.l_test": 7}
    assert {k: v for k, v in back.meta.items() if k != "config"} == ep.meta


def test_save_is_atomic(mix3, tmp_path, monkeypatch):
    ep = sample_episodes(mix3, DATA, 5)
    save_episodes(ep, tmp_path / "d.npz")
    before = (tmp_path / "d.npz").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(ValueError, match="disk full"):
        save_episodes(sample_episodes(mix3, DATA, 6), tmp_path / "d.npz")
    assert os.listdir(tmp_path) == ["d.npz"] and (tmp_path / "d.npz").read_bytes() == before


def test_probe_episodes_fixed_task_subset():
    """A seeded subset of min(k, n_tasks) tasks, per_task episodes each, its own stream; at 8192 tasks too."""
    from hmmscope.data.episodes import probe_episodes, probe_tasks

    big = make_mixture(HMMConfig(n_tasks=8192, n_states=3, n_tokens=4, rank=2, seed=0))
    data = DataConfig(n_demos=1, l_demo=3, l_test=4, seed=5)
    ep = probe_episodes(big, data, n_tasks=32, per_task=30)
    tasks, counts = np.unique(ep.task_ids, return_counts=True)
    assert len(tasks) == 32 and (counts == 30).all() and len(ep) == 960
    assert np.array_equal(tasks, probe_tasks(8192, 32, seed=5)) and tasks.max() >= 1000  # spread over all tasks
    assert np.array_equal(probe_tasks(8192, 32, seed=5), probe_tasks(8192, 32, seed=5))
    assert not np.array_equal(probe_tasks(8192, 32, seed=5), probe_tasks(8192, 32, seed=6))
    again = probe_episodes(big, data, n_tasks=32, per_task=30)
    assert again.tokens.tobytes() == ep.tokens.tobytes() and ep.meta["split"] == "probe"
    assert np.array_equal(np.unique(probe_episodes(big, data, 32, 5).task_ids), tasks)  # same subset at any size
    small = make_mixture(HMMConfig(n_tasks=3, n_states=3, n_tokens=4, rank=2, seed=0))
    assert np.array_equal(np.unique(probe_episodes(small, data, 32, 4).task_ids), [0, 1, 2])
    with pytest.raises(ValueError):
        probe_episodes(small, data, 32, 0)


def test_hmm_does_not_import_episodes():
    """The data layers run one way: hmm.py (HMMs and their sampler) below, episodes.py above."""
    import subprocess
    import sys

    code = ("import sys, hmmscope.data.hmm as h; h.make_hmm(h.HMMConfig()).sample(2, 3); "
            "print('hmmscope.data.episodes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unseen_tasks_never_appear_in_training_episodes():
    """By PARAMETERS, not ids: no unseen task (mu, W, Q, O) equals the task of any training episode (or any
    training task), for both families; the unseen episodes use task i in episode i and their own streams."""
    from hmmscope.data.episodes import unseen_episodes

    for family in ("sticky", "dirichlet"):
        hc = HMMConfig(family=family, n_tasks=6, n_states=5, n_tokens=4, rank=2, seed=3)
        data = DataConfig(n_demos=2, l_demo=5, l_test=6, n_train=200, seed=1)
        mix = make_mixture(hc)
        train = sample_episodes(mix, data, data.n_train, "train")
        umix, uep = unseen_episodes(hc, data, 40)
        assert umix.n_tasks == 40 and np.array_equal(uep.task_ids, np.arange(40))
        assert uep.meta["split"] == "unseen" and uep.meta["hmm_hash"] != train.meta["hmm_hash"]

        def params(m, ids):
            return [np.concatenate([m.initial[i].ravel(), m.W[i].ravel(), m.Q[i].ravel(), m.emission[i].ravel()])
                    for i in ids]

        trained = {p.tobytes() for p in params(mix, np.unique(train.task_ids))}
        assert len(trained) == len(np.unique(train.task_ids))
        for u in params(umix, range(40)):
            assert u.tobytes() not in trained
            for t in params(mix, range(mix.n_tasks)):  # nor any training task's continuous parts (mu, W, Q)
                assert not any(np.array_equal(a, b) for a, b in zip(np.split(u, [5, 15, 25])[:3], np.split(t, [5, 15, 25])[:3]))
        # the episodes follow their own tasks' emissions (task i drives episode i)
        again = unseen_episodes(hc, data, 40)[1]
        assert np.array_equal(again.tokens, uep.tokens) and not np.array_equal(uep.tokens[:, :10],
                                                                               train.tokens[:40, :10])
    with pytest.raises(ValueError, match="n must be"):
        unseen_episodes(hc, data, 0)


@pytest.mark.parametrize("family, bits", [("sticky", "6ce6a531ffe65f8220fcc64109f3657c"),
                                          ("dirichlet", "52bb6dd9f9e628080f5faa83cd9442ce")])
def test_training_episodes_are_bit_identical_to_before(family, bits):
    """sha256 of the training episodes as drawn before unseen tasks existed (commit b4f5d8b): old records stay
    reproducible."""
    import hashlib

    m = make_mixture(HMMConfig(family=family, n_tasks=5, n_states=6, n_tokens=4, rank=3, seed=11))
    ep = sample_episodes(m, DataConfig(n_demos=2, l_demo=5, l_test=6, seed=3), 20, "train")
    h = hashlib.sha256()
    for a in (ep.tokens, ep.states, ep.task_ids):
        h.update(a.tobytes())
    assert h.hexdigest()[:32] == bits


def test_training_fit_family_and_unseen_tasks_come_from_disjoint_streams():
    """SCIENCE.md 9 / issue 27: training tasks (a mixture, or fresh tasks with hmm.n_tasks = 0), fit tasks, family-Bayes
    tasks and unseen evaluation tasks are four disjoint seed streams. Checked by PARAMETERS (mu, W, Q: the continuous
    parts; O is discrete-valued and can repeat by chance), never by ids, for both families; each stream but the
    training mixture's follows data.seed (a replicate draws new unseen, fit, family and fresh tasks)."""
    from hmmscope.data.episodes import family_tasks, fit_episodes, fresh_training, training_data, unseen_episodes

    def continuous(m):
        return [np.concatenate([m.initial[i].ravel(), m.W[i].ravel(), m.Q[i].ravel()]).tobytes() for i in range(m.n_tasks)]

    for family in ("sticky", "dirichlet"):
        hc = HMMConfig(family=family, n_tasks=8, n_states=5, n_tokens=4, rank=2, seed=3)
        data = DataConfig(n_demos=2, l_demo=5, l_test=6, n_train=24, n_eval=12, seed=1)
        streams = {"train": make_mixture(hc), "fresh": fresh_training(hc, data, 24)[0],
                   "fit": fit_episodes(hc, data, 24)[0], "family": family_tasks(hc, data, 24),
                   "unseen": unseen_episodes(hc, data, 24)[0]}
        seen: dict[bytes, str] = {}
        for name, m in streams.items():
            rows = continuous(m)
            assert len(set(rows)) == len(rows), name  # distinct tasks within a stream
            for r in rows:
                assert r not in seen, f"a {name} task equals a {seen.get(r)} task"
                seen[r] = name
            for other in streams.values():  # no shared float at all between two streams' W
                if other is not m:
                    assert not np.intersect1d(m.W.ravel(), other.W.ravel()).size
        replicate = DataConfig(**{**data.__dict__, "seed": 2})
        for draw in (lambda h, d: unseen_episodes(h, d, 24)[0], lambda h, d: fit_episodes(h, d, 24)[0],
                     lambda h, d: family_tasks(h, d, 24), lambda h, d: fresh_training(h, d, 24)[0]):
            assert not set(continuous(draw(hc, data))) & set(continuous(draw(hc, replicate)))
        # fresh training: episode i on task i, nothing repeated; held-out episodes are unseen tasks
        mix, ep_train, ep_eval, eval_mix = training_data(dataclasses.replace(hc, n_tasks=0), data)
        assert mix is None and np.array_equal(ep_train.task_ids, np.arange(24)) and len(ep_eval) == 12
        assert set(continuous(eval_mix)) <= set(continuous(unseen_episodes(hc, data, 12)[0]))
        assert not set(continuous(eval_mix)) & set(continuous(fresh_training(hc, data, 24)[0]))
    with pytest.raises(ValueError, match="n_tasks >= 1"):
        make_mixture(dataclasses.replace(hc, n_tasks=0))


def test_episode_arrays_from_numpy_or_torch_tokens():
    import torch

    mix = make_mixture(HMMConfig(n_tasks=2, n_states=4, n_tokens=3, rank=2))
    ep = sample_episodes(mix, DataConfig(n_demos=2, l_demo=3, l_test=4), 5)
    a = episode_arrays(ep)
    assert a.tokens.dtype == np.int64 and a.segment.dtype == np.int64 and a.n_tokens == 3
    np.testing.assert_array_equal(a.tokens, np.asarray(ep.tokens))
    b = episode_arrays(dataclasses.replace(ep, tokens=torch.as_tensor(np.asarray(ep.tokens))))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.segment, b.segment)
