"""The probes' torch fits (hmmscope.measure.probes.torch_fits, issue 37: Figure 3 on the GPU) against scikit-learn's,
on the CPU: the GPU path's twin. Tolerances (stated in probes/torch_fits.py): ridge predictions to 1e-8 and the same alpha
(closed form in float64 against sklearn's cholesky); logistic-regression predictions on >= 98% of test rows the
same, accuracies within ACC_TOL = 0.02 per target and layer, R^2 within R2_TOL = 1e-5 (float32 residuals), and
every claim's verdict the same on planted signals (a claim on a near-tie of layers, e.g. the peak layer of an untrained
model's chance-level accuracies, can move with any perturbation of the fits)."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression, Ridge

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data.episodes import sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.measure.probes import run_probes
from hmmscope.measure.probes.torch_fits import fit_predict, ridge

ACC_TOL, R2_TOL = 0.02, 1e-5


def test_ridge_matches_sklearn_closed_form():
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((300, 12)), rng.standard_normal((12, 5))
    Y = X @ W + 0.5 * rng.standard_normal((300, 5)) + 3.0
    Xtr, Ytr, Xte = X[:200], Y[:200], X[200:]
    val = np.zeros(200, bool)
    val[rng.permutation(200)[:50]] = True
    alphas = (0.1, 1.0, 10.0, 100.0, 1000.0)
    pred, best = ridge(Xtr, Ytr, val, Xte, alphas, "cpu")
    sse = [((Ridge(alpha=a).fit(Xtr[~val], Ytr[~val]).predict(Xtr[val]) - Ytr[val]) ** 2).sum() for a in alphas]
    want = float(alphas[int(np.argmin(sse))])
    assert best == want
    np.testing.assert_allclose(pred, Ridge(alpha=want).fit(Xtr, Ytr).predict(Xte), atol=1e-8)


def _classes(rng, n, d=16, k=5, sep=1.5):
    mu = sep * rng.standard_normal((k, d))
    y = rng.integers(0, k, n)
    return (mu[y] + rng.standard_normal((n, d))).astype(np.float32), y


def test_logistic_matches_sklearn_with_and_without_groups():
    rng = np.random.default_rng(1)
    X, y = _classes(rng, 800)
    a = np.zeros(800, bool)
    a[:600] = True
    b = ~a
    sk = LogisticRegression(C=1.0, max_iter=100, tol=1e-3).fit(X[a], y[a]).predict(X[b])
    ours = fit_predict(torch.as_tensor(X), y, a, b, None, 1.0, 100, 1e-3, "cpu")
    assert (sk == ours).mean() >= 0.98 and abs((sk == y[b]).mean() - (ours == y[b]).mean()) <= ACC_TOL
    # per group: group 3 has one training class (predicted as is), group 4 no training rows (-1, never right)
    group = np.tile(np.arange(5), 160)
    y2 = y.copy()
    y2[(group == 3) & a] = 2
    a2 = a & (group != 4)
    ours = fit_predict(torch.as_tensor(X), y2, a2, b, group, 1.0, 100, 1e-3, "cpu")
    gb = group[b]
    assert (ours[gb == 3] == 2).all() and (ours[gb == 4] == -1).all()
    for g in range(3):
        tr = a2 & (group == g)
        want = LogisticRegression(C=1.0, max_iter=100, tol=1e-3).fit(X[tr], y2[tr]).predict(X[b][gb == g])
        assert (want == ours[gb == g]).mean() >= 0.98


class Planted:
    """Layer l: strength[l] * one-hot(o_(t-1)) + a noisy linear image of the position, + N(0, 1) noise."""

    def __init__(self, strength=(0.0, 1.0, 3.0)):
        self.strength = strength

    def __call__(self, tok, layer, idx):
        g = torch.Generator().manual_seed(1000 * layer + int(idx[0]))
        onehot = torch.nn.functional.one_hot(torch.roll(tok, 1, 1).clamp(max=7), 8).float()
        x = torch.cat([self.strength[layer] * onehot, torch.zeros(*tok.shape, 4)], -1)
        return x + torch.randn(x.shape, generator=g)


@pytest.mark.parametrize("belief", [True])
def test_run_probes_torch_fits_give_sklearns_verdicts(belief):
    """run_probes(fits="torch") on the CPU against fits="sklearn" on the same residuals: accuracies (probe and
    control) within ACC_TOL, belief R^2 within R2_TOL, the same claims and verdicts."""
    mix = make_mixture(HMMConfig(n_tasks=4, n_states=8, n_tokens=8, rank=4, gamma=0.6, seed=1))
    ep = sample_episodes(mix, DataConfig(n_demos=1, l_demo=6, l_test=16, seed=2), 160, split="eval")
    kw = dict(ks=(1, 2), n_layers=3, positions_per_episode=8, n_boot=200, belief=belief)
    sk = run_probes(Planted(), mix, ep, fits="sklearn", **kw)
    th = run_probes(Planted(), mix, ep, fits="torch", **kw)
    assert sk.meta["fits"] == "sklearn" and th.meta["fits"] == "torch on cpu"
    a = {(r["target"], r["layer"]): r for r in sk.table}
    b = {(r["target"], r["layer"]): r for r in th.table}
    assert a.keys() == b.keys()
    worst = max(max(abs(a[k]["acc"] - b[k]["acc"]), abs(a[k]["control_acc"] - b[k]["control_acc"])) for k in a)
    assert worst <= ACC_TOL, worst
    for x, y in zip(sk.belief_table, th.belief_table):
        assert x["alpha"] == y["alpha"] and abs(x["r2"] - y["r2"]) <= R2_TOL
    assert [(c.name, c.verdict) for c in sk.claims] == [(c.name, c.verdict) for c in th.claims]


def test_fits_must_be_known():
    mix = make_mixture(HMMConfig(n_tasks=4, n_states=8, n_tokens=8, rank=4, seed=1))
    ep = sample_episodes(mix, DataConfig(n_demos=1, l_demo=6, l_test=16, seed=2), 16, split="eval")
    with pytest.raises(ValueError, match="fits must be auto, sklearn or torch"):
        run_probes(Planted(), mix, ep, ks=(1,), n_layers=1, fits="gpu")
