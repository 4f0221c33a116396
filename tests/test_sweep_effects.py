"""Effects over seeds (hmmscope.sweep.effects, issues 45 and 46.1): the TOST and the seeds needed against statsmodels
and against brute-force simulation, slopes and their steps, every swept key's effect and its sentence, the spec's
[report] table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from hmmscope.config import ConfigError
from hmmscope.stats import paired_effect, t_mean
from hmmscope.sweep.effects import (
    check_options,
    effect,
    effect_row,
    factor_effects,
    seeds_needed,
    slope,
    tost,
)
from hmmscope.sweep.sentences import sentence
from hmmscope.units import value_ci


def test_tost_equals_statsmodels_paired_and_welch():
    """Known answers against statsmodels directly: ttost_paired on the seed-level differences (t_mean, and the paired
    effect over seeds), ttost_ind with unequal variances for the unpaired (Welch) estimate."""
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    rng = np.random.default_rng(5)
    x = rng.normal(0.002, 0.006, 5)
    for margin in (0.005, 0.01, 0.03):
        e = tost(t_mean(x, unit="seed"), margin)
        p, lower, upper = ttost_paired(x, np.zeros_like(x), -margin, margin)
        assert e.p_lower == pytest.approx(lower[1]) and e.p_upper == pytest.approx(upper[1]) and e.p == pytest.approx(p)
        assert (e.p < 0.05) == (e.verdict == f"equivalent within ±{margin:g}")  # the 90% CI inside exactly then
    # the paired effect of a 2 x 4 design: seeds are the unit, the differences' TOST
    y1, y0 = rng.normal(1.0, 0.01, 4), rng.normal(1.0, 0.01, 4)
    est = paired_effect(np.r_[y1, y0], np.r_[np.ones(4), np.zeros(4)], np.r_[np.arange(4), np.arange(4)])
    p, lower, upper = ttost_paired(y1, y0, -0.01, 0.01)
    assert tost(est, 0.01).p == pytest.approx(p) and tost(est, 0.01).p_lower == pytest.approx(lower[1])
    # unpaired (no seed holds both levels): Welch's t, as ttost_ind(usevar="unequal")
    a, b = rng.normal(0.0, 0.01, 4), rng.normal(0.003, 0.02, 5)
    est = paired_effect(np.r_[a, b], np.r_[np.ones(4), np.zeros(5)], np.r_[np.arange(4), 10 + np.arange(5)],
                        [0] * 9)
    assert "Welch" in est.method
    p, lower, upper = ttost_ind(a, b, -0.02, 0.02, usevar="unequal")
    got = tost(est, 0.02)
    assert got.p_lower == pytest.approx(lower[1]) and got.p_upper == pytest.approx(upper[1])
    assert tost(t_mean([0.1], unit="seed"), 0.01) is None  # one unit: no t interval, no TOST


def test_tost_says_equivalent_at_least_at_its_power_under_no_effect_and_at_most_5pc_at_the_margin():
    """The simulation check (issue 45): 3000 seeded, vectorized draws of n seeds. n is the standard TOST sample size
    for 80% power at a true effect of 0 (each one-sided test at 5% with 90% power, TTestPower); with a true effect of
    0 "equivalent" comes at least that often, with a true effect of +margin at most 5% of the time (the level)."""
    from statsmodels.stats.power import TTestPower

    sd, margin, draws = 1.0, 0.8, 3000
    n = math.ceil(TTestPower().solve_power(margin / sd, alpha=0.05, power=0.9, alternative="larger"))
    rng = np.random.default_rng(45)
    for true, check in ((0.0, lambda f: f >= 0.8), (margin, lambda f: f <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws))):
        x = rng.normal(true, sd, (draws, n))
        m, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        q = st.t.ppf(0.95, n - 1)
        equivalent = (m - q * se > -margin) & (m + q * se < margin)
        for i in range(5):  # the vectorized verdict is tost's own
            got = tost(t_mean(x[i], unit="seed"), margin)
            assert (got.verdict == f"equivalent within ±{margin:g}") == bool(equivalent[i])
        assert check(equivalent.mean()), (true, n, equivalent.mean())


def test_seeds_needed_against_a_brute_force_simulation():
    """The seeds-needed figure: with n seeds the 95% t interval lies above 0 in >= 80% of 4000 seeded draws when the
    true effect is `effect`; with n - 1 seeds it does not (within 3 Monte Carlo SE of 80%)."""
    rng = np.random.default_rng(46)
    draws, tol = 4000, 3 * math.sqrt(0.8 * 0.2 / 4000)

    def power(n, effect, sd):
        x = rng.normal(effect, sd, (draws, n))
        lo = x.mean(1) - st.t.ppf(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
        return (lo > 0).mean()

    for effect_, sd in ((0.01, 0.006), (0.01, 0.012), (0.5, 0.2)):
        n = seeds_needed(sd, effect_)
        assert power(n, effect_, sd) >= 0.8 - tol, (effect_, sd, n)
        if n > 2:
            assert power(n - 1, effect_, sd) < 0.8 + tol, (effect_, sd, n)
    assert seeds_needed(0.006, 0.01) == seeds_needed(0.006, -0.01)  # either side
    assert seeds_needed(0.0, 0.01) is None and seeds_needed(1.0, 0.0) is None


def test_a_slope_is_fitted_within_each_seed_then_t_over_seeds():
    x = np.tile([0.6, 0.8, 0.95], 3)
    seeds = np.repeat([0, 1, 2], 3)
    y = np.array([b * xi + s for xi, s, b in zip(x, seeds, np.repeat([0.1, 0.2, 0.3], 3))])
    e = slope(x, y, seeds)
    assert e.value == pytest.approx(0.2) and e.n == 3 and e.df == 2 and e.unit == "seed"
    assert slope([1, 1], [0, 1], [0, 1]).startswith("no seed holds two")
    one = slope(np.tile([1, 2], 2), [0.1, 0.3, 0.2, 0.5], [0] * 4, [("a",), ("a",), ("b",), ("b",)])
    assert one.unit == "block (one seed)" and one.value == pytest.approx(0.25)


def _frame(levels, f, seeds=(0, 1, 2), key="hmm.gamma", other=None):
    rows = []
    for lv in levels:
        for s in seeds:
            for o in (other or [None]):
                row = {f"param:{key}": lv, "param:train.seed": s, "metric:objective": f(lv, s, o)}
                if o is not None:
                    row["param:model.pos_enc"] = o
                rows.append(row)
    return pd.DataFrame(rows)


def test_every_swept_key_gets_its_effect_named_first_in_words():
    """Issue 46.1: two levels -> their paired contrast over seeds; the sentence names the key first, the signed
    difference, its unit, CI and replicates, and the verdict in words."""
    shift = {0: 0.01, 1: -0.02, 2: 0.004}
    df = _frame([0.5, 0.9], lambda g, s, o: 0.2 + 1.35 * g + shift[s] + 0.01 * s * g + (o == "rope") * -0.03,
                other=["rope", "absolute"])
    got = factor_effects(df, ["model.pos_enc", "hmm.gamma"], "metric:objective", "param:train.seed",
                         metric="eval/seen/excess_ce", unit="nats/token", margin=0.01, direction="minimize")
    pe, g = got
    assert pe.label == "rope - absolute" and pe.claim.value == pytest.approx(-0.03) and pe.verdict == "no power"
    want = [0.54 + 0.004 * s for s in (0, 1, 2)]  # 0.9 - 0.5 per seed (the same in both encodings)
    m, lo, hi = t_mean(want, unit="seed").value, t_mean(want, unit="seed").lo, t_mean(want, unit="seed").hi
    assert g.label == "0.9 - 0.5" and g.claim.value == pytest.approx(m) and g.claim.ci_lo == pytest.approx(lo)
    assert g.claim.rule == "!= 0" and g.verdict == "supported" and "blocks model.pos_enc" in g.claim.statistic
    assert sentence(g) == (f"hmm.gamma: 0.9 - 0.5 = {value_ci(m, lo, hi, 'nats/token', signed=True)}, 3 seeds: "
                           "excess CE (seen tasks) grows with gamma (supported)")
    assert value_ci(m, lo, hi, signed=True).startswith("+0.54")


def test_ordered_levels_get_adjacent_steps_and_a_slope_that_is_not_monotone_when_they_disagree():
    """The record's gamma: model - best counting -0.18, -0.25, -0.14 at gamma 0.6, 0.8, 0.95: a positive slope whose
    steps disagree in sign reads "not monotone" with the steps shown (before: "supported")."""
    level = {0.6: -0.180, 0.8: -0.248, 0.95: -0.144}
    noise = {(lv, s): 0.004 * math.sin(7 * lv + 3 * s) for lv in level for s in (0, 1, 2)}
    df = _frame(list(level), lambda g, s, o: level[g] + noise[(g, s)])
    (e,) = factor_effects(df, ["hmm.gamma"], "metric:objective", "param:train.seed", metric="eval/unseen/vs_best_counting",
                          unit="nats/token", margin=0.01)
    assert e.label == "slope" and [lab for lab, _ in e.steps] == ["0.8 - 0.6", "0.95 - 0.8"]
    assert e.steps[0][1].claim.value < 0 < e.steps[1][1].claim.value
    assert e.claim.ci_lo > 0 and e.verdict == "not monotone" and e.claim.steps == tuple(
        s.claim.value for _, s in e.steps)
    assert e.unit == "nats/token per unit of hmm.gamma" and e.margin == pytest.approx(0.01 / 0.35)
    text = sentence(e)
    assert text.startswith("hmm.gamma: slope = +") and "not one way: steps 0.8 - 0.6 -0.0" in text
    assert text.endswith("(not monotone)")
    row = effect_row(e)
    assert row["verdict"] == "not monotone" and row["steps"].startswith("0.8 - 0.6 -0.06")
    # a monotone relation keeps its verdict
    df = _frame([2, 4, 6], lambda L, s, o: -0.2 - 0.01 * L + 0.001 * s * L + 0.0005 * (s == 1) * L * L,
                key="model.n_layers")
    (e,) = factor_effects(df, ["model.n_layers"], "metric:objective", "param:train.seed",
                          metric="eval/unseen/vs_best_counting", unit="nats/token")
    assert e.verdict == "supported" and all(s.claim.value < 0 for _, s in e.steps)
    assert "falls with n_layers (supported)" in sentence(e)


def test_categorical_levels_against_a_stated_reference_and_an_inconclusive_effects_power():
    """A categorical key: each level against the reference (rope - absolute, as everywhere); an inconclusive effect
    says what the design excludes and how many seeds would decide +-margin."""
    shift = {0: 0.004, 1: -0.006, 2: 0.001, 3: 0.0}
    df = _frame(["rope", "absolute", "alibi"], lambda pe, s, o: 0.3 + {"rope": 0.001, "absolute": 0.0,
                                                                      "alibi": 0.002}[pe] + shift[s] * (pe == "alibi"),
                key="model.pos_enc")
    got = factor_effects(df, ["model.pos_enc"], "metric:objective", "param:train.seed", metric="eval/seen/excess_ce",
                         unit="nats/token", margin=0.01, references={"model.pos_enc": "absolute"})
    assert [e.label for e in got] == ["alibi - absolute", "rope - absolute"]
    alibi = got[0]
    assert alibi.verdict == "inconclusive" and alibi.equivalence is not None
    sd = float(np.std([0.002 + shift[s] for s in (0, 1, 2)], ddof=1))
    assert alibi.sd == pytest.approx(sd) and alibi.seeds_needed == seeds_needed(sd, 0.01)
    q = alibi.equivalence
    assert q.excluded_beyond == pytest.approx(max(abs(q.lo90), abs(q.hi90)))
    text = sentence(alibi)
    assert "no detectable difference (inconclusive); not shown equivalent within ±0.01" in text
    assert f"effects beyond ±{q.excluded_beyond:.2g} nats/token are excluded" in text
    assert f"{alibi.seeds_needed} seeds would detect ±0.01 with 80% power" in text
    row = effect_row(alibi)
    assert set(row) >= {"margin", "tost_p", "equivalence", "excluded_beyond", "seeds_needed"}
    assert row["tost_p"] == pytest.approx(q.p) and row["equivalence"] == "not shown equivalent"


def test_an_effect_without_an_estimate_says_why():
    e = effect("x", "confounded: no block holds both levels", "!= 0", "s", unit="nats/token", margin=0.01)
    assert e.verdict == "no power" and math.isnan(e.claim.value) and effect_row(e)["seeds_needed"] == ""


@pytest.mark.parametrize("table, msg", [
    ({"margin": -1}, "report.margin: must be a number > 0"), ({"margin": True}, "report.margin"),
    ({"reference": 3}, "report.reference: must be a sweep name"), ({"references": {"hmm.rank": "2"}}, "'hmm.rank'"),
    ({"tuned": ["train.lr"]}, "report.tuned"), ({"marginn": 0.1}, "report.marginn: unknown key"),
])
def test_the_report_table_of_a_spec_is_checked(table, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        check_options("s.toml", table, ["hmm.gamma"])
    opts = check_options("s.toml", {"margin": 0.02, "tuned": ["hmm.gamma"]}, ["hmm.gamma"])
    assert opts.margin_for("nats/token") == 0.02 and opts.tuned == ("hmm.gamma",)
    assert check_options("s.toml", {}, []).margin_for("nats/token") == 0.01
    assert math.isnan(check_options("s.toml", {}, []).margin_for("fraction of test tokens"))


def test_a_categorical_key_without_a_stated_reference_is_compared_with_the_base_configs_level():
    df = _frame(["dirichlet", "sticky"], lambda f, s, o: 0.3 + 0.01 * s + (0.02 + 0.001 * s) * (f == "dirichlet"),
                key="hmm.family")
    (e,) = factor_effects(df, ["hmm.family"], "metric:objective", "param:train.seed", metric="eval/seen/excess_ce",
                          unit="nats/token", direction="minimize", base={"hmm.family": "sticky"})
    assert e.label == "dirichlet - sticky" and e.claim.value == pytest.approx(0.021)
    assert sentence(e).endswith("higher with dirichlet than sticky, dirichlet worse (supported)")
    (e,) = factor_effects(df, ["hmm.family"], "metric:objective", "param:train.seed", metric="eval/seen/excess_ce",
                          unit="nats/token")  # no base: the first level
    assert e.label == "sticky - dirichlet"
