"""Seed streams (hmmscope/data/seeds.py, SCIENCE.md 9): no two streams share their randomness through numpy's
trailing-zero padding, and every stream hmmscope draws goes through seeds.py."""

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data import seeds
from hmmscope.data.episodes import fit_episodes, unseen_episodes
from hmmscope.data.hmm import make_mixture

PKG = Path(__file__).resolve().parents[1] / "hmmscope"


def test_numpy_pads_with_zeros_so_a_trailing_zero_is_refused():
    # the premise: numpy's SeedSequence gives [a, b, 0] the stream of [a, b]
    a = np.random.SeedSequence([7, 11, 0]).generate_state(4)
    b = np.random.SeedSequence([7, 11]).generate_state(4)
    assert (a == b).all()
    with pytest.raises(ValueError, match="may not end in 0"):
        seeds.rng(7, 11, 0)
    with pytest.raises(ValueError, match=">= 0"):
        seeds.rng(7, -1)


def test_with_replicate_gives_none_and_every_replicate_its_own_stream():
    keys = [3, 0x484D4D, 99]
    states = {r: tuple(seeds.sequence(*seeds.with_replicate(keys, r)).generate_state(4)) for r in (None, 0, 1, 2)}
    assert len(set(states.values())) == 4


def _mix(rep, stream="unseen"):
    cfg = HMMConfig(n_tasks=3, n_states=4, rank=2, n_tokens=8, gamma=0.8, seed=5)
    return make_mixture(cfg, stream=stream, replicate=rep)


@pytest.mark.parametrize("stream", ["unseen", "fit", "family", "fresh"])
def test_replicate_zero_one_and_none_give_three_different_mixtures(stream):
    # failed before: [seed, TAG, code, 0] was the stream of [seed, TAG, code], so replicate 0 drew the unreplicated
    # tasks (the task-diversity re-run at data.seed = 0 scored the first run's unseen tasks)
    m = {r: _mix(r, stream) for r in (None, 0, 1)}
    for a, b in ((None, 0), (None, 1), (0, 1)):
        assert not np.allclose(m[a].emission, m[b].emission), (a, b)
        assert m[a].config_hash != m[b].config_hash
    assert np.array_equal(_mix(0, stream).emission, m[0].emission)  # same replicate, same bits


def test_data_seed_zero_scores_its_own_unseen_and_fit_tasks():
    hmm = HMMConfig(n_tasks=0, n_states=4, rank=2, n_tokens=8, gamma=0.8, seed=5)
    d0, d1 = DataConfig(seed=0, n_demos=2, l_demo=6, l_test=6), DataConfig(seed=1, n_demos=2, l_demo=6, l_test=6)
    unrep = make_mixture(dataclasses.replace(hmm, n_tasks=4), stream="unseen")
    for fn in (unseen_episodes, fit_episodes):
        m0, _ = fn(hmm, d0, 4)
        m1, _ = fn(hmm, d1, 4)
        assert not np.allclose(m0.emission, m1.emission)
    m0, _ = unseen_episodes(hmm, d0, 4)
    assert not np.allclose(m0.emission, unrep.emission)


def test_the_probe_positions_keep_their_stream():
    # [seed, TAG, 0] was the stream of [seed, TAG]: writing it without the 0 keeps every probe record's numbers
    from hmmscope.measure.probes.residuals import PROBE_TAG, sample_positions

    class Ep:
        test_mask = np.r_[np.zeros(10, bool), np.ones(20, bool)]
        task_ids = np.zeros(6, int)

    got = sample_positions(Ep(), 5, seed=3)
    r = np.random.default_rng(np.random.SeedSequence([3, PROBE_TAG, 0])).random((6, 20))
    want = np.flatnonzero(Ep.test_mask)[np.sort(np.argsort(r, 1)[:, :5], 1)]
    assert np.array_equal(got, want)


def test_every_stream_in_the_package_goes_through_seeds_py():
    # failed before: ten modules built SeedSequence([...]) themselves, one of them with a trailing 0
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        if f.name == "seeds.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name == "SeedSequence":
                    bad.append(f"{f.relative_to(PKG)}:{node.lineno}")
    assert not bad, f"SeedSequence built outside seeds.py: {bad}"
