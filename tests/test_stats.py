"""Decision rules (hmmscope.stats) and, for every claim kind, that its verdict is the rule applied to its own row."""

import math

import numpy as np
import pandas as pd
import pytest

from hmmscope.probes import TargetScores, probe_claims
from hmmscope.report import _layerwise_section
from hmmscope.shuffle import layer_claims
from hmmscope.stats import VERDICTS, Claim, check_claims, claim, decide, holm, parse_rule, rule
from hmmscope.theory import RateFit, bound_claims, exponent_fits, fit_rank_intercept

NAN = float("nan")


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize("r, lo, hi, want", [
    ("> 0", 0.1, 0.3, "supported"), ("> 0", 0.0, 0.3, "inconclusive"), ("> 0", -0.2, 0.0, "not supported"),
    ("> 0", -0.2, -0.1, "not supported"), (">= 0.5", 0.5, 0.9, "supported"), (">= 0.5", 0.2, 0.49, "not supported"),
    ("< 0", -0.3, -0.1, "supported"), ("< 0", 0.0, 0.2, "not supported"), ("< 0", -0.1, 0.1, "inconclusive"),
    ("<= 4", 1.0, 4.0, "supported"), ("<= 4", 4.0, 5.0, "inconclusive"), ("<= 4", 4.1, 5.0, "not supported"),
    ("> 0", NAN, 1.0, "inconclusive"), ("> 0", -math.inf, math.inf, "inconclusive"),
    ("no power", 0.1, 0.3, "no power"), ("no power", NAN, NAN, "no power"),
])
def test_decide_known_answers(r, lo, hi, want):
    assert decide(r, lo, hi) == want


def test_requirements_and_parsing():
    r = rule(">", 0, ["a", "b c"])
    assert r == "> 0; requires a, b c" and parse_rule(r) == (">", 0.0, ("a", "b c"))
    assert decide(r, 0.1, 0.2, {"a": "supported", "b c": "supported"}) == "supported"
    assert decide(r, 0.1, 0.2, {"a": "supported", "b c": "inconclusive"}) == "inconclusive"
    assert decide(r, 0.1, 0.2) == "inconclusive"
    c = claim("x", "s", 0.15, 0.1, 0.2, r, "why", {"a": "supported"})
    assert c.verdict == "inconclusive" and "b c" in c.reason and c.rule == r
    assert parse_rule("no power") == ("no power", parse_rule("no power")[1], ()) and math.isnan(parse_rule("no power")[1])
    assert parse_rule(rule("<=", 4.0)) == ("<=", 4.0, ())
    for bad in ("=> 0", "> zero", "> 0; needs a", ""):
        with pytest.raises(ValueError):
            parse_rule(bad)
    with pytest.raises(ValueError):
        rule("==", 0)
    # check_claims catches a verdict that does not follow from its row
    ok = claim("y", "s", 1.0, 0.5, 1.5, "> 0", "")
    forged = Claim("z", "s", 1.0, -0.5, 1.5, "supported", "", "> 0")
    assert check_claims([ok]) == [] and len(check_claims([ok, forged])) == 1
    assert "no rule" in check_claims([Claim("w", "s", 1.0, 0.5, 1.5, "supported", "")])[0]


def test_holm_known_answer():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    from statsmodels.stats.multitest import multipletests

    p = np.random.default_rng(0).random(7) ** 3
    np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])


# ---------------------------------------------------------------- every claim kind, from planted data


def _scores(curves, n_test=120, P=16, seed=0, chance=0.1, ctrl=0.1):
    rng = np.random.default_rng(seed)
    return {t: TargetScores(rng.binomial(P, np.broadcast_to(np.asarray(a), (n_test, len(a)))).astype(float),
                            rng.binomial(P, np.full((n_test, len(a)), ctrl)).astype(float), np.full(n_test, float(P)),
                            chance) for t, a in curves.items()}


def _belief_sums(r2_by_layer, n_test=120, P=16, S=4, seed=0):
    """Per-layer (n, sy, syy, sse) per test episode for predictions with the given R^2 (approximately)."""
    rng = np.random.default_rng(seed)
    y = rng.random((n_test, P, S))
    out = []
    for r2 in r2_by_layer:
        pred = y + rng.normal(0, math.sqrt(max(1 - r2, 1e-6) * y.var()), y.shape)
        out.append([np.full((n_test, S), float(P)), y.sum(1), (y * y).sum(1), ((pred - y) ** 2).sum(1)])
    return out


def _probe_kinds():
    """Probe claims in every situation: curves that rise and fall, only rise, are flat; peaks that move up
    or not; accuracy that falls or rises with k; state before task, after it, or with a task never decoded."""
    groups = []
    scenes = [
        {"task": [0.1, 0.2, 0.5, 0.95, 1.0], "state": [0.1, 0.9, 0.95, 0.95, 0.95],
         "kback1": [0.2, 0.9, 0.7, 0.5, 0.3], "kback2": [0.2, 0.5, 0.8, 0.6, 0.3], "kback3": [0.1, 0.3, 0.5, 0.6, 0.4]},
        {"task": [0.1, 0.9, 0.95, 0.95, 0.95], "state": [0.1, 0.2, 0.5, 0.9, 1.0],
         "kback1": [0.2, 0.6, 0.8, 0.9, 0.95], "kback2": [0.9, 0.99, 0.9, 0.7, 0.5], "kback3": [0.3, 0.3, 0.3, 0.3, 0.3]},
        {"task": [0.1] * 5, "state": [0.1, 0.9, 0.9, 0.9, 0.9],
         "kback1": [0.9, 0.5, 0.3, 0.5, 0.9], "kback2": [0.5] * 5, "kback3": [0.1, 0.5, 0.6, 0.55, 0.5]},
    ]
    for i, acc in enumerate(scenes):
        base = {k: np.random.default_rng(k).binomial(16, 0.3, 120).astype(float) for k in (1, 2, 3)}
        groups.append(probe_claims(range(5), _scores(acc, seed=i), ks=(1, 2, 3), n_boot=300, seed=i, baseline=base,
                                   belief=(_belief_sums([0.0, 0.5, 0.9, 0.6, 0.2], seed=i),
                                           _belief_sums([0.0] * 5, seed=i + 9)))[0])
    groups.append(probe_claims(range(2), _scores({"kback1": [0.3, 0.6], "kback2": [0.4, 0.5]}), ks=(1, 2),
                               n_boot=200)[0])
    return groups


def _shuffle_kinds():
    rng = np.random.default_rng(0)
    L = np.arange(4)
    return [layer_claims(1 + trend * L + rng.normal(0, sd, (12, 4))) for trend, sd in
            ((-0.05, 0.01), (0.05, 0.01), (0.0, 0.3))] + [layer_claims(np.ones((5, 1)))]


def _theory_kinds():
    L = np.array([1, 2, 4, 8, 16, 24, 32], float)
    out = []
    for g, d, eps, m in ((0.9, 2, np.exp(-0.1 * L), 0.02), (0.9, 2, 0.5 * np.exp(-1.0 * L), 0.02),
                         (0.05, 8, np.exp(-0.05 * L), 0.02), (0.0, 8, np.exp(-0.05 * L), 0.02),
                         ((0.6, 0.95), 2, 0.5 * np.exp(-1.0 * L), 0.02)):
        r = float(-np.polyfit(L, np.log(eps), 1)[0])
        fit = RateFit(r, (0.9 * r, 1.1 * r), 0.0, (0.0, 0.0), len(L), 1.0, tuple(L.astype(int)))
        out += bound_claims(L, eps, 0.01 * eps, fit, g, d, m, scope="planted")
    g = np.array([0.3, 0.5, 0.7, 0.9])
    for rates in (0.02 + 0.6 * g ** 4, 0.3 * g ** 6, 0.3 * g ** 4 * np.exp(np.random.default_rng(1).normal(0, 0.05, 4))):
        pts = [{"gamma": x, "gamma_eff": 0.25 * x, "rate": r, "rate_lo": 0.95 * r, "rate_hi": 1.05 * r,
                "mixing_rate": 0.02} for x, r in zip(g, rates)]
        out += [f.claim() for f in exponent_fits(pts, "planted") if f.same_as is None]
    d = np.array([2, 4, 8, 16])
    out += [fit_rank_intercept(d, a).claim() for a in (0.5 * np.log(d), 2 * np.log(d), [0.1, 0.3, 0.2, 0.4])]
    return [[c] for c in out]


def _pooled_kinds():
    """Report pooling: per-run claims of every probe and shuffle kind, logged as the analysis job logs them."""
    rows = []
    for run in range(3):
        cl = probe_claims(range(5), _scores({"task": [0.1, 0.3, 0.6, 0.9, 0.95], "state": [0.2, 0.8, 0.9, 0.9, 0.9],
                                             "kback1": [0.2, 0.5, 0.6, 0.7, 0.75], "kback2": [0.2, 0.97, 0.9, 0.8, 0.7]},
                                            seed=run), ks=(1, 2), n_boot=200, seed=run)[0]
        cl += layer_claims(1 - 0.05 * np.arange(4) + np.random.default_rng(run).normal(0, 0.01, (10, 4)))
        row = {"trial": run}
        for c in cl:
            row.update({f"metric:claim/{c.name}/value": c.value, f"metric:claim/{c.name}/ci_lo": c.ci_lo,
                        f"metric:claim/{c.name}/ci_hi": c.ci_hi, f"verdict:{c.name}": c.verdict,
                        f"rule:{c.name}": c.rule})
        rows.append(row)
    return [_layerwise_section(pd.DataFrame(rows))[1]]


@pytest.mark.parametrize("kind", ["probes", "shuffle", "theory", "report pooling"])
def test_every_claim_verdict_follows_from_its_row(kind):
    groups = {"probes": _probe_kinds, "shuffle": _shuffle_kinds, "theory": _theory_kinds,
              "report pooling": _pooled_kinds}[kind]()  # independent sets of claims (names repeat across sets)
    for claims in groups:
        assert claims and check_claims(claims) == []
        known = {c.name: c.verdict for c in claims}
        for c in claims:
            assert c.verdict in VERDICTS and c.rule and c.reason
            assert c.verdict == decide(c.rule, c.ci_lo, c.ci_hi, known, df=c.df, degenerate=c.degenerate), c
    seen = {c.verdict for claims in groups for c in claims}
    want = {"probes": {"supported", "not supported", "inconclusive"}, "shuffle": {"supported", "not supported",
            "inconclusive"}, "theory": set(VERDICTS), "report pooling": {"supported", "not supported", "no power"}}[kind]
    assert want <= seen, seen  # the planted situations reach every verdict the kind can give
