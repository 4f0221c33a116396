"""Theorem 1 fits and verdicts (hmmscope.theory.theorem1): synthetic recovery, floors, verdict logic, end to end."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from hmmscope.config import TheoryConfig
from hmmscope.stats import check_claims
from hmmscope.theory.fit import RateFit, exponent_fits, fit_decay_rate, fit_exponent, fit_rank_intercept
from hmmscope.theory.theorem1 import bound_claims

L = np.array([1, 2, 4, 6, 8, 12, 16, 24, 32])


def _ok_fit(rate, lo, hi):
    return RateFit(rate, (lo, hi), 0.0, (0.0, 0.0), 5, 1.0, (1, 2, 3, 4, 5))


# ---------------------------------------------------------------- decay rate


def test_rate_noise_free_is_exact():
    f = fit_decay_rate(L, 3 * np.exp(-0.2 * L))
    assert f.ok and f.n_used == len(L)
    assert f.rate == pytest.approx(0.2, abs=1e-10)
    assert f.intercept == pytest.approx(math.log(3), abs=1e-9)
    assert f.rate_ci[0] == pytest.approx(0.2, abs=1e-8) and f.rate_ci[1] == pytest.approx(0.2, abs=1e-8)
    assert f.r2 == pytest.approx(1.0)


def test_rate_noisy_ci_covers_truth():
    covered, n = 0, 200
    rng = np.random.default_rng(1)
    for _ in range(n):
        eps = 3 * np.exp(-0.2 * L) * rng.lognormal(0, 0.3, L.size)
        f = fit_decay_rate(L, eps)
        covered += f.rate_ci[0] <= 0.2 <= f.rate_ci[1]
        assert f.rate_ci[0] < f.rate < f.rate_ci[1]
    assert 0.88 <= covered / n <= 0.995  # nominal 95%


def test_rate_floor_and_stderr_handling():
    eps = 3 * np.exp(-0.2 * L)
    eps[L >= 16] = 1e-12  # at the numerical floor
    f = fit_decay_rate(L, eps, floor=1e-10)
    assert f.used_lengths == (1, 2, 4, 6, 8, 12) and f.rate == pytest.approx(0.2, abs=1e-10)
    # a point back above the floor after a failing one is noise: the range stops at the first failure
    eps2 = eps.copy()
    eps2[-1] = 0.5
    assert fit_decay_rate(L, eps2).used_lengths == (1, 2, 4, 6, 8, 12)
    # unsorted input is sorted by L
    perm = np.random.default_rng(0).permutation(L.size)
    assert fit_decay_rate(L[perm], eps[perm]).rate == pytest.approx(0.2, abs=1e-10)
    # points whose Monte Carlo error is too large (eps <= 4 stderr, z_fit) end the range
    se = np.full(L.size, 1e-2)  # 3 exp(-0.2 L) <= 0.04 from L = 24 on, <= 0.02 from L = 32 on
    g = fit_decay_rate(L, 3 * np.exp(-0.2 * L), se)
    assert g.used_lengths == (1, 2, 4, 6, 8, 12, 16) and g.rate == pytest.approx(0.2, abs=1e-10)
    assert fit_decay_rate(L, 3 * np.exp(-0.2 * L), se, z_fit=2).used_lengths == (1, 2, 4, 6, 8, 12, 16, 24)


def test_rate_too_few_points():
    f = fit_decay_rate(L, 3 * np.exp(-30.0 * L))  # below 1e-10 from L = 1
    assert not f.ok and math.isnan(f.rate) and f.reason == "too few points above floor"
    f2 = fit_decay_rate([1, 2, 3], [0.5, 0.2, 1e-13])
    assert f2.n_used == 2 and math.isnan(f2.rate_ci[0])


# ---------------------------------------------------------------- exponent and rank


def test_exponent_recovers_k():
    g = np.array([0.2, 0.3, 0.5, 0.7, 0.9])
    exact = fit_exponent(g, 0.3 * g ** 1.5)
    assert exact.k == pytest.approx(1.5, abs=1e-9) and exact.intercept == pytest.approx(math.log(0.3), abs=1e-9)
    # noise-free points: zero residual variance, a zero-width CI, so no verdict (degenerate statistic)
    assert exact.verdict == "no power" and "zero residual variance" in exact.reason
    assert exact.claim().verdict == "no power" and exact.claim().degenerate
    jitter = np.exp(np.array([0.01, -0.01, 0.005, -0.004, 0.006]))
    f = fit_exponent(g, 0.3 * g ** 1.5 * jitter)
    assert f.k == pytest.approx(1.5, abs=0.05) and f.df == 3
    assert f.verdict == "supported" and f.consistent_with_4 is False and f.consistent_with(1.5)
    assert "exponent 4 rejected; the bound holds and is loose by gamma^(2.5" in f.reason
    assert "theory 4: supported" not in f.summary and f.claim().verdict == "supported"
    rng = np.random.default_rng(3)
    noisy = fit_exponent(g, 0.3 * g ** 4 * rng.lognormal(0, 0.05, g.size))
    assert noisy.k_ci[0] <= 4 <= noisy.k_ci[1] and noisy.verdict == "inconclusive" and noisy.consistent_with_4
    steep = fit_exponent(g, g ** 6 * jitter)
    assert steep.verdict == "not supported" and "faster" in steep.reason
    # non-positive or NaN rates are dropped; the rates' CIs give the Monte Carlo SE of k, not the estimate
    r = list(0.3 * g ** 2) + [0.0, float("nan")]
    gg = list(g) + [0.1, 0.4]
    assert fit_exponent(gg, r).n_used == 5 and fit_exponent(gg, r).k == pytest.approx(2, abs=1e-9)
    ci = [(x * 0.9, x * 1.1) for x in 0.3 * g ** 2]
    w = fit_exponent(g, 0.3 * g ** 2, ci)
    assert w.k == pytest.approx(2, abs=1e-9) and w.mc_se > 0
    few = fit_exponent([0.5, 0.9], [0.1, 0.4])
    assert math.isnan(few.k) and few.verdict == "inconclusive" and "too few" in few.reason


def test_exponent_two_stage_over_draws_known_answer():
    """Per-draw slopes planted exactly (each draw an exact power law with its own k_j): k = mean of the k_j with
    the t interval on draws - 1 df computed by hand; the Monte Carlo SE from the rates' CIs beside it."""
    from scipy import stats

    g = np.array([0.3, 0.5, 0.7, 0.9])
    ks = np.array([1.7, 1.9, 1.8, 2.1, 1.85])
    gam, rates, draws, ci = [], [], [], []
    for j, k in enumerate(ks):
        r = (0.2 + 0.01 * j) * g ** k
        gam += list(g)
        rates += list(r)
        draws += [j] * 4
        ci += [(x * 0.98, x * 1.02) for x in r]
    f = fit_exponent(gam, rates, ci, draws=draws)
    half = stats.t.ppf(0.975, 4) * ks.std(ddof=1) / math.sqrt(5)
    assert f.k == pytest.approx(ks.mean(), abs=1e-12) and f.df == 4 and f.n_draws == 5
    assert f.k_ci == pytest.approx((ks.mean() - half, ks.mean() + half), abs=1e-12)
    assert f.slopes == pytest.approx(tuple(ks), abs=1e-12)
    # Monte Carlo SE of k: se(log r) = 0.04 r / (3.92 r) at every point, propagated through each draw's slope
    xc = np.log(g) - np.log(g).mean()
    mc = math.sqrt(np.sum((xc / (xc @ xc)) ** 2 * (0.04 / 3.92) ** 2) / 5)
    assert f.mc_se == pytest.approx(mc, rel=1e-9)
    assert f.between_sd == pytest.approx(math.sqrt(ks.var(ddof=1) - 5 * mc ** 2), rel=1e-9)
    assert f.verdict == "supported" and "t over 5 HMM draws (4 df)" in f.method
    assert f.claim().df == 4 and check_claims([f.claim()]) == []


def test_vacuous_exponent_claim_has_no_power():
    """A rate that ignores gamma (k ~ 0, e.g. forgetting by mixing alone): 'k <= 4' would pass for any such rate,
    so the claim is 'no power' with the reason, not 'supported' ('loose by gamma^4.05' does not follow)."""
    g = np.array([0.3, 0.5, 0.7, 0.9] * 3)
    r = 0.05 * np.exp(np.random.default_rng(0).normal(0, 0.05, g.size))
    f = fit_exponent(g, r, draws=np.repeat([0, 1, 2], 4))
    assert f.k_ci[0] < 0 < f.k_ci[1] and f.vacuous and "reaches 0" in f.reason and "loose" not in f.reason
    c = f.claim()
    assert f.verdict == c.verdict == "no power" and c.rule == "no power" and check_claims([c]) == []
    # a rate that grows with gamma keeps its verdict
    assert fit_exponent(g, 0.3 * g ** 2 * r / 0.05, draws=np.repeat([0, 1, 2], 4)).verdict == "supported"


def test_pooled_gamma_eff_is_the_gamma_regression_not_a_slope_of_zero():
    """gamma_eff = c_d gamma with a multiple c_d that differs between ranks (as on the sticky family): pooled with a
    common intercept, log gamma_eff mostly measures c_d and gave k ~ 0 ('supported' k <= 4, vacuous). With one
    intercept per (S, d, rho) group the gamma_eff slope is the gamma slope, kept as the same regression."""
    pts = []
    rng = np.random.default_rng(1)
    for d, c, a in ((2, 0.42, 0.3), (4, 0.36, 0.5), (8, 0.19, 0.9), (16, 3e-4, 1.2)):
        for j in range(3):
            for g in (0.3, 0.5, 0.7, 0.9):
                r = a * g ** 1.8 * math.exp(rng.normal(0, 0.03))
                pts.append({"gamma": g, "gamma_eff": c * g * (1 + 0.05 * j), "rate": r, "rate_lo": 0.95 * r,
                            "rate_hi": 1.05 * r, "mixing_rate": 0.0, "draw": j, "group": f"d={d}"})
    raw, eff, _ = exponent_fits(pts, "pooled")
    assert raw.k == pytest.approx(1.8, abs=0.1) and raw.verdict == "supported"
    assert eff.same_as == "gamma" and eff.k == pytest.approx(raw.k) and "within every (S, d, rho) group" in eff.reason
    # the old pooled regression (one intercept for all groups): a slope near 0
    old = fit_exponent([p["gamma_eff"] for p in pts if p["draw"] == 0], [p["rate"] for p in pts if p["draw"] == 0])
    assert abs(old.k) < 0.3 and old.verdict == "no power" and old.vacuous


def test_combine_draws_known_answer():
    from scipy import stats

    from hmmscope.theory.fit import combine_draws

    rates = [0.10, 0.12, 0.11, 0.13, 0.09]
    fits = [_ok_fit(r, r - 0.004, r + 0.004) for r in rates]
    fit, sp = combine_draws(fits)
    half = stats.t.ppf(0.975, 4) * np.std(rates, ddof=1) / math.sqrt(5)
    assert fit.rate == pytest.approx(0.11) and fit.rate_ci == pytest.approx((0.11 - half, 0.11 + half))
    assert fit.df == 4 and "t over 5 HMM draws" in fit.ci_method
    assert sp.mc_se == pytest.approx(0.008 / 3.92 / math.sqrt(5)) and sp.n_draws == 5
    assert sp.between_sd == pytest.approx(math.sqrt(np.var(rates, ddof=1) - (0.008 / 3.92) ** 2))
    one, sp1 = combine_draws(fits[:1])
    assert one.rate_ci == fits[0].rate_ci and "one HMM draw" in one.ci_method and math.isnan(sp1.between_sd)
    bad = fit_decay_rate(L, 3 * np.exp(-30.0 * L))
    part, sp2 = combine_draws([bad, *fits[:3]])
    assert sp2.n_draws == 3 and "1 of 4 draws had no rate" in part.ci_method


def test_rank_fit_recovers_slope():
    d = np.array([2, 4, 8, 16])
    jitter = np.array([0.01, -0.012, 0.008, -0.005])
    f = fit_rank_intercept(d, -1.0 + 0.5 * np.log(d) + jitter)
    assert f.slope == pytest.approx(0.5, abs=0.02) and f.intercept == pytest.approx(-1.0, abs=0.05)
    assert f.verdict == "supported" and f.consistent_with_1 is False and f.df == 2
    assert fit_rank_intercept(d, 2 * np.log(d) + jitter).verdict == "not supported"
    assert fit_rank_intercept(d, -1.0 + 0.5 * np.log(d)).verdict == "no power"  # exact: zero-width CI
    assert fit_rank_intercept([2, 4], [0.1, 0.2]).verdict == "inconclusive"
    # two-stage over draws: per-draw slopes 0.4, 0.5, 0.6 -> 0.5 with t on 2 df
    two = fit_rank_intercept(np.tile(d, 3), np.concatenate([s * np.log(d) for s in (0.4, 0.5, 0.6)]),
                             draws=np.repeat([0, 1, 2], 4))
    assert two.slope == pytest.approx(0.5) and two.df == 2 and two.n_draws == 3 and two.verdict == "supported"


# ---------------------------------------------------------------- per-setting checks


def _checks(*a, **kw):
    out = bound_claims(*a, **kw)
    assert check_claims(out) == []
    return out


def test_bound_violated_and_satisfied():
    Ls = np.arange(1, 21)
    g, d = 0.9, 2  # g^4 = 0.656
    wobble = np.exp(0.01 * np.sin(Ls))  # so the rate fits have residuals (a noise-free fit has a zero-width CI)
    slow = 1.0 * np.exp(-0.1 * Ls) * wobble  # far above 2 exp(-0.656 L) at large L
    va, vb = _checks(Ls, slow, np.full(Ls.size, 1e-4), fit_decay_rate(Ls, slow), g, d, 0.02)
    assert va.verdict == "not supported" and va.ci_lo > 0 and va.rule == "<= 0"
    assert vb.verdict == "not supported" and vb.value == pytest.approx(0.1 - g ** 4, abs=1e-3) and vb.rule == ">= 0"
    fast = 0.5 * np.exp(-1.0 * Ls) * wobble
    va, vb = _checks(Ls, fast, 0.01 * fast, fit_decay_rate(Ls, fast), g, d, 0.02)
    assert va.verdict == "supported" and va.ci_hi <= 0 and vb.verdict == "supported"
    # a zero stderr gives the bound check a zero-width CI: no power, whatever the side
    assert _checks(Ls, fast, np.zeros(Ls.size), fit_decay_rate(Ls, fast), g, d, 0.02)[0].verdict == "no power"
    # a point above the bound but within 2 stderr: the CI straddles 0 -> inconclusive, not supported
    e = 2 * np.exp(-g ** 4 * Ls) * 1.01
    va, _ = _checks(Ls, e, 0.02 * e, fit_decay_rate(Ls, e), g, d, 0.02)
    assert va.verdict == "inconclusive" and va.ci_lo <= 0 < va.ci_hi
    # rate CI straddling g^4 -> inconclusive; failed fit -> inconclusive
    assert _checks(Ls, fast, None, _ok_fit(0.6, 0.5, 0.8), g, d, 0.02)[1].verdict == "inconclusive"
    assert _checks(Ls, fast, None, fit_decay_rate(Ls, 1e-20 * fast), g, d, 0.02)[1].verdict == "inconclusive"
    # an inexact gamma: the CI covers every g in the bracket
    va, vb = _checks(Ls, fast, None, _ok_fit(0.6, 0.55, 0.65), (0.8, 0.95), d, 0.02)
    assert vb.ci_lo == pytest.approx(0.55 - 0.95 ** 4) and vb.ci_hi == pytest.approx(0.65 - 0.8 ** 4)
    assert vb.verdict == "inconclusive"


def test_checks_that_cannot_fail_have_no_power():
    Ls = np.array([1, 2, 4, 8, 16, 32])
    e = np.full(6, 0.9)  # does not decay at all
    va, vb = _checks(Ls, e, None, fit_decay_rate(Ls, e), 0.0, 8, 0.02)
    assert va.verdict == vb.verdict == "no power" and "vacuous" in va.reason and "vacuous" in vb.reason
    va, _ = _checks(Ls, e, None, _ok_fit(0.0, -0.1, 0.1), 0.1, 8, 0.02)  # 8 exp(-1e-4 L) >= 1 everywhere
    assert va.verdict == "no power" and "cannot fail" in va.reason
    # rate >= gamma_eff^4 with gamma_eff^4 ~ 1e-5 below the chain's own mixing rate 0.02: no power, not supported
    _, vb = _checks(Ls, np.exp(-0.1 * Ls), None, _ok_fit(0.1, 0.09, 0.11), 0.056, 8, 0.02)
    assert vb.verdict == "no power" and "mixing" in vb.reason
    # the same check with g^4 above the floor has power
    _, vb = _checks(Ls, np.exp(-0.1 * Ls), None, _ok_fit(0.1, 0.09, 0.11), 0.5, 8, 0.02)
    assert vb.verdict == "supported"


def test_mixing_floor_plus_gamma4_law():
    """r = m + c gamma^4: fitted as a power of gamma the raw rate gives k ~ 1.7, 'exponent 4 rejected'; on the
    excess over the mixing floor k = 4. gamma_eff = 0.25 gamma is the same regression, not a second finding."""
    g = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    m = 0.02
    r = m + 0.6 * g ** 4 * np.exp(np.random.default_rng(0).normal(0, 0.02, g.size))
    pts = [{"gamma": x, "gamma_eff": 0.25 * x, "rate": y, "rate_lo": y - 0.002, "rate_hi": y + 0.002,
            "mixing_rate": m} for x, y in zip(g, r)]
    raw, eff, excess = exponent_fits(pts, "planted")
    assert raw.y_name == "rate" and 1.0 < raw.k < 2.5 and raw.k_ci[1] < 4 and raw.verdict == "supported"
    assert "exponent 4 rejected" in raw.reason
    assert excess.y_name == "rate - mixing floor" and excess.n_used == 4  # gamma 0.1: rate CI not above the floor
    assert excess.k == pytest.approx(4, abs=0.15) and excess.k_ci[0] < 4 < excess.k_ci[1]
    assert excess.verdict == "inconclusive" and "consistent with the bound's exponent" in excess.reason
    assert eff.same_as == "gamma" and eff.k == pytest.approx(raw.k) and "same regression" in eff.reason
    assert check_claims([f.claim() for f in (raw, excess)]) == []
    # a gamma_eff that is not a multiple of gamma is its own fit
    pts2 = [{**p, "gamma_eff": p["gamma_eff"] * (1 + 0.1 * i)} for i, p in enumerate(pts)]
    assert exponent_fits(pts2, "planted")[1].same_as is None


def test_rate_ci_covers_under_correlated_histories():
    """Per-history TV with errors shared across L: tv[i, L] = exp(-0.3 L) (1 + u_i (L - Lbar) / span) x_iL, u_i ~
    U(-0.5, 0.5) (a history that forgets more slowly than average does so at every L) and x_iL lognormal noise.
    E tv = const exp(-0.3 L) exactly, so the rate on the fixed L range is 0.3. The sample curve is smooth and
    nearly straight, so OLS residuals are small while the slope moves with mean(u): the t interval under-covers;
    the bootstrap over histories covers at the nominal rate (binomial tests, fixed seeds)."""
    from scipy import stats

    L = np.array([1, 2, 4, 6, 8, 12, 16], float)
    shape = (L - L.mean()) / np.abs(L - L.mean()).max()
    rng = np.random.default_rng(12)
    boot = ols = 0
    n_rep = 150
    for rep in range(n_rep):
        u = rng.uniform(-0.5, 0.5, (400, 1))
        tv = np.exp(-0.3 * L) * (1 + u * shape) * rng.lognormal(0, 0.1, (400, L.size))
        e, se = tv.mean(0), tv.std(0, ddof=1) / np.sqrt(400)
        fb = fit_decay_rate(L, e, se, tv=tv, n_boot=300, seed=rep)
        fo = fit_decay_rate(L, e, se)
        assert fb.n_used == len(L) and fb.rate == fo.rate and "bootstrap" in fb.ci_method
        boot += fb.rate_ci[0] <= 0.3 <= fb.rate_ci[1]
        ols += fo.rate_ci[0] <= 0.3 <= fo.rate_ci[1]
    assert stats.binomtest(boot, n_rep, 0.95).pvalue > 0.01  # consistent with 95%
    assert stats.binomtest(ols, n_rep, 0.95, alternative="less").pvalue < 0.01  # the t interval under-covers


# ---------------------------------------------------------------- end to end

_HAVE = all(importlib.util.find_spec(f"hmmscope.{m}") is not None for m in ("inference", "observability"))


@pytest.mark.skipif(not _HAVE, reason="hmmscope.oracles.inference / hmmscope.oracles.observability not written yet")
def test_run_theory_end_to_end(tmp_path):
    from hmmscope.theory.theorem1 import draw_seed, plot_theory, run_theory

    cfg = TheoryConfig(gammas=(0.5, 0.9), ranks=(2,), n_states=(6,), n_tokens=8, lengths=(1, 2, 3, 4, 6),
                       n_histories=64, burn_in=20, gamma_m=2, draws=3)
    calls = []
    res = run_theory(cfg, progress=lambda i, n, label: calls.append((i, n)))
    assert calls == [(1, 2), (2, 2)]  # one call per setting, whatever the draws
    assert len(res.settings) == 2 and [s.params["gamma"] for s in res.settings] == [0.5, 0.9]
    seeds = [draw_seed(cfg.seed, j) for j in range(3)]
    assert seeds[0] == cfg.seed and len(set(seeds)) == 3  # draw 0 is the old single draw; each draw its own stream
    for s in res.settings:
        assert [dr.seed for dr in s.draws] == seeds and s.spread.n_total == 3
        assert s.gamma_O["exact"] and s.gamma_O["value"] == pytest.approx(s.params["gamma"], abs=1e-6)  # S <= V
        assert len(s.eps) == len(cfg.lengths) and len(s.stderr) == len(cfg.lengths)
        assert 0 <= s.dobrushin <= 1 and s.gamma_m is not None and s.mixing_rate > 0
        assert len(s.verdicts) == 4 and check_claims(s.verdicts) == []
        assert all(not dr.rate_fit.ok or "bootstrap over histories" in dr.rate_fit.ci_method for dr in s.draws)
        ok = [dr.rate_fit.rate for dr in s.draws if dr.rate_fit.ok]
        if len(ok) >= 2:
            assert "HMM draws" in s.rate_fit.ci_method and s.rate_fit.rate == pytest.approx(np.mean(ok))
            assert s.rate_fit.df == len(ok) - 1
        steps = {}
        for step, m in s.draw_metrics():
            steps.setdefault(step, {}).update(m)
        assert set(steps) == {0, 1, 2} and "theory/rate_mc_se" in steps[0] and "theory/draw/rate" in steps[2]
        assert steps[1]["theory/draw/seed"] == seeds[1]
    # the same chain at every gamma: draw j's transition does not depend on gamma
    assert res.settings[0].draws[1].dobrushin == res.settings[1].draws[1].dobrushin
    # gamma_eff is computed once per draw and scaled (gamma(Q O) = gamma * gamma(Q E)): equal to a direct computation
    from hmmscope.config import HMMConfig
    from hmmscope.data.hmm import make_hmm
    from hmmscope.oracles.observability import gamma_eff

    for j in (0, 2):
        h = make_hmm(HMMConfig(family="sticky", n_tasks=1, n_states=6, n_tokens=8, rank=2, gamma=0.9, alpha=0.5,
                               rho=0.02, seed=seeds[j]))
        dr = res.settings[1].draws[j]
        assert dr.gamma_eff["value"] == pytest.approx(gamma_eff(h.Q, h.emission).value, abs=1e-9)
        assert "scaled from gamma = 0.5" in dr.gamma_eff["method"]
    assert {f.x_name for f in res.exponent_fits} == {"gamma", "gamma_eff"}
    assert all(f.n_draws >= 2 or f.verdict == "inconclusive" for f in res.exponent_fits)
    assert check_claims(res.claims()) == [] and len(res.claims()) == len(res.verdicts) + 8
    assert res.rank_fits == []
    d = res.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert "NaN" not in text and d["settings"][0]["params"]["n_states"] == 6 and len(d["settings"][0]["draws"]) == 3
    rows = res.table()
    assert len(rows) == 2 and all(isinstance(v, str) for v in rows[0].values()) and rows[0]["draws"] == "3"
    assert any("gamma" in line for line in res.summary_lines())
    png, pdf = plot_theory(res, tmp_path / "theory.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    # one draw reproduces the single-draw sweep (draw 0 = theory.seed): its rate CI is the bootstrap's
    one = run_theory(TheoryConfig(**{**cfg.__dict__, "draws": 1, "gammas": (0.9,)}))
    assert one.settings[0].draws[0].rate_fit == res.settings[1].draws[0].rate_fit


def test_run_theory_rejects_rank_above_states():
    pytest.importorskip("hmmscope.oracles.inference", reason="hmmscope.oracles.inference not written yet")
    pytest.importorskip("hmmscope.oracles.observability", reason="hmmscope.oracles.observability not written yet")
    from hmmscope.theory.theorem1 import run_theory

    with pytest.raises(ValueError, match="ranks"):
        run_theory(TheoryConfig(ranks=(8,), n_states=(4,)))


def _synthetic_result():
    """Two (S, d, rho) groups x 3 gammas, eps(L) = 0.5 exp(-r L) with r = 0.5 gamma^2 and a floor at L = 24, so
    the last point of every setting is left out of its rate fit; gamma_eff = 0.8 gamma."""
    from hmmscope.theory.theorem1 import Setting, TheoryResult

    Ls = [1, 2, 4, 8, 24]
    settings, fits = [], []
    for S, d in ((6, 2), (8, 3)):
        group = []
        for g in (0.4, 0.6, 0.9):
            r = 0.5 * g ** 2 * (1 + 0.1 * (d == 3))
            eps = [0.5 * math.exp(-r * x) if x < 24 else 1e-12 for x in Ls]
            fit = fit_decay_rate(Ls, eps, [1e-4 * e for e in eps], floor=1e-10)
            obs = {"value": 0.8 * g, "exact": True, "lower": 0.8 * g, "upper": 0.8 * g, "method": "x"}
            group.append(Setting({"family": "sticky", "n_states": S, "rank": d, "rho": 0.02, "gamma": g, "m": 0},
                                 {**obs, "value": g}, obs, None, 0.99, Ls, eps, [1e-4 * e for e in eps], fit,
                                 mixing_rate=0.01))
        fits += exponent_fits([s.point() for s in group], f"S={S} d={d} rho=0.02")
        settings += group
    fits += exponent_fits([s.point() for s in settings], "pooled")
    return TheoryResult({}, settings, fits, [], [])


def test_theory_figure_artists(tmp_path):
    """Fit lines in their points' colour, gamma and gamma_eff on separate panels, points left out of a fit hollow."""
    from hmmscope.theory.theorem1 import plot_theory, theory_figure

    res = _synthetic_result()
    assert all(s.rate_fit.ok and 24 not in s.rate_fit.used_lengths for s in res.settings)
    fig = theory_figure(res, title="run t")
    eps_axes = [ax for ax in fig.axes if ax.get_xlabel() == "L (memory, tokens)"]
    by_x = {ax.get_xlabel().split()[0]: ax for ax in fig.axes if ax.get_ylabel() == "decay rate r (1/L, per token)"}
    assert len(eps_axes) == 2 and set(by_x) == {"gamma", "gamma_eff"}  # one x quantity per panel
    assert all(ax.get_ylabel() == "eps(L) (mean TV distance)" for ax in eps_axes)  # every axis names its unit
    for ax in eps_axes:  # the L = 24 point of each gamma: hollow; fitted points filled; dashed fit in their colour
        hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none" and ln.get_marker() == "o"
                  and len(ln.get_xdata())]
        assert sorted(float(ln.get_xdata()[0]) for ln in hollow) == [24.0] * 3
        fits = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        filled = [c.lines[0] for c in ax.containers if not c.get_label().startswith("_")]
        assert len(fits) == 3 and [f.get_color() for f in fits] == [p.get_color() for p in filled]
        assert "hollow: left out of the fit" in [t.get_text() for t in ax.get_legend().get_texts()]
    for ax in by_x.values():
        lines = ax.get_lines()
        colours = set()
        for S, d in ((6, 2), (8, 3)):
            (pts,) = [ln for ln in lines if ln.get_label() == f"rate, S={S} d={d} rho=0.02"]
            fit = [ln for ln in lines if ln.get_label().startswith("fit rate:") and ln.get_color() == pts.get_color()]
            assert len(fit) == 1 and fit[0].get_linestyle() == "-"
            colours.add(pts.get_color())
        assert len(colours) == 2
        assert any(ln.get_label().startswith("pooled fit rate") and ln.get_color() == "k" for ln in lines)
    assert "run t" in fig._suptitle.get_text()
    png, pdf = plot_theory(res, tmp_path / "t.png")
    assert png.exists() and pdf.exists()


def test_theory_figure_reads_gamma_plainly_and_the_reference_never_squashes_the_data(tmp_path):
    """Before: gamma ticks read 3x10^-1, and the reference gamma^4 (drawn from the smallest gamma up to 1) set the
    rate panels' y range, squashing the data (worst on gamma_eff). Now the ticks are the levels as plain numbers,
    the reference spans the data's x range and is clipped to the y range the data set."""
    from hmmscope.theory.theorem1 import theory_figure

    res = _synthetic_result()
    fig = theory_figure(res)
    fig.canvas.draw()
    by_x = {ax.get_xlabel().split()[0]: ax for ax in fig.axes if ax.get_ylabel().startswith("decay rate")}
    rates = [s.rate_fit.rate for s in res.settings]
    floor = min(s.mixing_rate for s in res.settings)  # drawn too (the mixing floor)
    for name, ax in by_x.items():
        xs = sorted({round(s.params["gamma"] if name == "gamma" else s.gamma_eff["value"], 2) for s in res.settings})
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == [f"{x:g}" for x in xs], ticks  # 0.4, not 4x10^-1
        assert not any("10^" in t.get_text() or "times" in t.get_text() for t in ax.get_yticklabels())
        lo, hi = ax.get_ylim()
        assert lo > min(*rates, floor) / 3 and hi < max(rates) * 2  # the data set it, not gamma^4 (up to 1)
        assert ax.get_xlim()[1] < 1.0  # the reference is not drawn out to gamma = 1
        (ref,) = [ln for ln in ax.get_lines() if ln.get_label().startswith(f"{name}^4 (c = 1)")]
        assert min(ref.get_xdata()) == pytest.approx(min(xs), abs=0.01)
