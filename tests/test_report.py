"""hmmscope.report against a temporary sqlite MLflow store with planted effects (the sweep layout of sweep.py)."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from hmmscope import tracking
from hmmscope.probes import TargetScores, probe_claims
from hmmscope.report import Section, _layerwise_section, build_report, claim_side, render_html, render_md, report_to_dict
from hmmscope.stats import Claim, check_claims

EXP = "rep"
GAMMAS = (0.2, 0.4, 0.6, 0.8)
SEED_SHIFT = {0: 0.003, 1: -0.002, 2: 0.001}


class TrialPruned(Exception):
    pass


def _sweep_parent(uri, study, **kw):
    return tracking.start_run(uri, EXP, study, params={"sweep.spec_hash": "abc123", "sweep.n_trials": 20},
                              tags={"hmmscope.kind": "sweep", "hmmscope.study": study, **kw})


def _trial_tags(study, n):
    return {"hmmscope.trial": n, "hmmscope.study": study}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{tmp}/mlflow.db"
    rng = np.random.default_rng(0)
    n = 0
    with _sweep_parent(uri, "study-a") as parent:
        # training trials: 2 pos_enc x 3 seeds x 2 gammas; absolute is worse by 0.05 excess CE
        for pe in ("rope", "absolute"):
            for seed in (0, 1, 2):
                for gamma in (0.5, 0.9):
                    params = {"hmm.gamma": gamma, "hmm.rank": 4, "model.pos_enc": pe, "model.window": 0,
                              "model.n_layers": 2, "train.seed": seed, "data.seed": 7}
                    with tracking.start_run(uri, EXP, f"trial-{n}", parent=parent, params=params,
                                            tags=_trial_tags("study-a", n)) as tr:
                        ce = 0.2 + 0.1 * gamma + 0.05 * (pe == "absolute") + SEED_SHIFT[seed] + rng.normal(0, 0.002)
                        tr.log_metrics({"eval/excess_ce": ce, "eval/test_acc": 0.6 - ce / 4, "eval/kl_mix": ce})
                        if gamma == 0.5:  # analyzed: shuffle slope clearly negative, kback claim inconclusive
                            slope = -0.1 + 0.01 * seed
                            with tracking.start_run(uri, EXP, "analysis", parent=tr,
                                                    tags={"hmmscope.kind": "analysis"}) as an:
                                an.log_metrics({"claim/upper layers change less _slope_/value": slope,
                                                "claim/upper layers change less _slope_/ci_lo": slope - 0.02,
                                                "claim/upper layers change less _slope_/ci_hi": slope + 0.02,
                                                "claim/kback1_rises_then_falls/value": 0.01 * (seed - 1),
                                                "claim/kback1_rises_then_falls/ci_lo": -0.05,
                                                "claim/kback1_rises_then_falls/ci_hi": 0.05})
                                an.set_tags({"verdict/upper layers change less _slope_": "supported: CI below 0",
                                             "verdict/kback1_rises_then_falls": "inconclusive: CI contains 0",
                                             "rule/upper layers change less _slope_": "< 0",
                                             "rule/kback1_rises_then_falls": "> 0"})
                    n += 1
        # one theory trial: rate = 0.3 gamma^2 exactly, S=4 d=2 rho=0
        with tracking.start_run(uri, EXP, "theory", parent=parent, tags={"hmmscope.kind": "sweep-theory",
                                                                        **_trial_tags("study-a", n)},
                                params={"theory.n_histories": 100}) as th:
            for g in GAMMAS:
                r = 0.3 * g ** 2
                with tracking.start_run(uri, EXP, f"S4-d2-gamma{g}", parent=th, tags={"hmmscope.kind": "theory-setting"},
                                        params={"hmm.n_states": 4, "hmm.rank": 2, "hmm.gamma": g, "hmm.rho": 0.0}) as s:
                    s.log_metrics({"theory/rate": r, "theory/rate_lo": 0.9 * r, "theory/rate_hi": 1.1 * r,
                                   "theory/log_intercept": math.log(2), "theory/gamma_eff": g,
                                   "theory/mixing_rate": 0.02})
            for d in (4, 8):  # at gamma 0.8: intercept = log 2 + 0.5 log(d / 2): rank slope 0.5 <= 1
                with tracking.start_run(uri, EXP, f"S4-d{d}-gamma0.8", parent=th,
                                        params={"hmm.n_states": 4, "hmm.rank": d, "hmm.gamma": 0.8, "hmm.rho": 0.0}) as s:
                    s.log_metrics({"theory/rate": 0.3 * 0.64, "theory/rate_lo": 0.17, "theory/rate_hi": 0.21,
                                   "theory/log_intercept": math.log(2) + 0.5 * math.log(d / 2), "theory/gamma_eff": 0.8})
        n += 1
        # a failed trial and two pruned ones
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                             tags=_trial_tags("study-a", n)):
            raise RuntimeError("diverged")
        n += 1
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                             tags={**_trial_tags("study-a", n), "hmmscope.pruned": "true"}):
            raise RuntimeError("pruned")
        n += 1
        with pytest.raises(TrialPruned), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                            tags=_trial_tags("study-a", n)):
            raise TrialPruned("step 10")  # sweep.py marks pruning by the failure reason only
    with _sweep_parent(uri, "study-b") as pb:  # windowed runs, depth x rank with a planted interaction
        for i, (nl, rank, win) in enumerate([(nl, r, w) for nl in (1, 2) for r in (2, 4, 8) for w in (4, 8)]):
            params = {"hmm.gamma": 0.5, "hmm.rank": rank, "model.pos_enc": "rope", "model.window": win,
                      "model.n_layers": nl, "train.seed": i, "data.seed": 7}
            with tracking.start_run(uri, EXP, f"b-{i}", parent=pb, params=params, tags=_trial_tags("study-b", i)) as tr:
                ce = 0.5 + 0.05 * math.log(rank) - 0.04 * nl * math.log(rank) + rng.normal(0, 0.003)
                rf = nl * (win - 1) + 1  # receptive field, as evaluate.memory_comparison logs it
                tr.log_metrics({"eval/excess_ce": ce, "memory/model_tv": 0.1 * math.exp(-0.2 * rf) + 0.01,
                                "memory/eps": 0.1 * math.exp(-0.2 * rf), "memory/receptive_field": rf})
    with _sweep_parent(uri, "study-empty") as empty:
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, "trial-0", parent=empty,
                                                             tags=_trial_tags("study-empty", 0)):
            raise RuntimeError("boom")
    rep = build_report(uri, "study-a", tmp / "out")
    return uri, parent.run_id, rep, tmp


def _claim(rep, name):
    return next(c for c in rep.claims if c.name == name)


def test_header_counts_and_files(store):
    uri, pid, rep, tmp = store
    h = rep.header
    assert (h["n_complete"], h["n_failed"], h["n_pruned"]) == (13, 1, 2)
    assert h["n_training_trials"] == 12 and h["n_theory_trials"] == 1
    assert h["config_hash"] == "abc123" and rep.parent_id == pid
    md, html = (tmp / "out" / "report.md").read_text(), (tmp / "out" / "report.html").read_text()
    for title in ("Sweep", "Theory", "Positional encoding", "Layerwise claims", "Verdicts"):
        assert f"## {title}" in md and f"<h2>{title}" in html
    assert "| 13 / 1 / 2 / 0 |" in md and "<table>" in html
    assert "Depth vs rank" not in md and "Practice vs theory" not in md  # n_layers, window do not vary
    assert (tmp / "out" / "theory_rate_vs_gamma.png").stat().st_size > 1000
    json.dumps(report_to_dict(rep))  # JSON-able


def test_posenc_effect_recovers_planted_difference(store):
    rep = store[2]
    c = _claim(rep, "RoPE improves eval/excess_ce")
    assert c.ci_lo <= -0.05 <= c.ci_hi and c.ci_hi < 0
    assert abs(c.value + 0.05) < 0.01
    assert c.verdict == "supported" and "mixed model" in c.statistic
    acc = _claim(rep, "RoPE improves eval/test_acc")  # acc = 0.6 - ce / 4: rope higher
    assert acc.verdict == "supported" and acc.value > 0
    sh = _claim(rep, "RoPE improves claim upper layers change less _slope_")  # no planted effect
    assert sh.ci_lo < 0 < sh.ci_hi and sh.verdict == "inconclusive"


def test_theory_exponent_and_verdict(store):
    rep = store[2]
    c = _claim(rep, "theory: rate ~ gamma^k: k <= 4 [S=4 d=2 rho=0]")
    assert c.value == pytest.approx(2.0, abs=1e-6)
    assert c.ci_lo <= 2.0 + 1e-6 and c.ci_hi >= 2.0 - 1e-6 and c.ci_hi < 4
    assert c.verdict == "supported" and "exponent 4 rejected" in c.reason and c.rule == "<= 4"
    # gamma_eff = gamma here: the same regression, named as such and not a second claim
    assert not any("gamma_eff^k" in x.name for x in rep.claims)
    md = (store[3] / "out" / "report.md").read_text()
    assert "same regression" in md and "mixing m" in md
    assert _claim(rep, "theory: rate ~ gamma^k: k <= 4 [pooled]").value == pytest.approx(2.0, abs=1e-6)
    # the excess over the mixing floor (0.02), over the settings whose rate CI lies above it
    x = _claim(rep, "theory: rate - mixing floor ~ gamma^k: k <= 4 [S=4 d=2 rho=0]")
    assert x.value > 2.0 and "3 of 4" in x.reason
    r = _claim(rep, "theory: intercept slope in log d <= 1 [S=4 rho=0 gamma=0.8]")
    assert r.value == pytest.approx(0.5, abs=1e-6) and r.verdict == "supported"
    assert check_claims([c for c in rep.claims if c.name.startswith("theory: ")]) == []


def test_layerwise_pooled(store):
    rep = store[2]
    c = _claim(rep, "pooled: upper layers change less _slope_")
    assert c.value == pytest.approx(-0.09) and c.ci_hi < 0 and c.verdict == "supported"
    assert c.rule == "< 0" and "6 supported" in c.reason  # the rule logged with the runs (rule/<name> tags)
    k = _claim(rep, "pooled: kback1_rises_then_falls")
    assert k.verdict == "inconclusive" and k.rule == "> 0" and "6 inconclusive" in k.reason
    assert check_claims([c for c in rep.claims if c.name.startswith("pooled: ")]) == []


def _frame(per_run_claims):
    """The training-frame columns report._training_frame reads from analysis runs, one row per run."""
    rows = []
    for i, claims in enumerate(per_run_claims):
        row = {"trial": i}
        for c in claims:
            row.update({f"metric:claim/{c.name}/value": c.value, f"metric:claim/{c.name}/ci_lo": c.ci_lo,
                        f"metric:claim/{c.name}/ci_hi": c.ci_hi, f"verdict:{c.name}": c.verdict})
            if c.rule:
                row[f"rule:{c.name}"] = c.rule
        rows.append(row)
    return pd.DataFrame(rows)


def test_pooled_concave_rise_is_not_supported():
    """A concave curve that only rises: 'not supported' or 'inconclusive' in every run, so not 'supported' pooled.
    Pooling now applies each run's rule to the statistic that decided it; it used to read only the sign of the
    value, and the quadratic term of a rising concave curve is negative too."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(6):
        hits = rng.binomial(16, np.broadcast_to([0.2, 0.6, 0.8, 0.9, 0.95], (120, 5))).astype(float)
        sc = {"kback1": TargetScores(hits, rng.binomial(16, np.full((120, 5), 0.1)).astype(float),
                                     np.full(120, 16.0), 0.1)}
        runs.append([c for c in probe_claims(range(5), sc, ks=(1,), n_boot=200, seed=seed)[0]
                     if c.name == "kback1_rises_then_falls"])
        assert runs[-1][0].verdict in ("not supported", "inconclusive")
    pooled = _layerwise_section(_frame(runs))[1]
    assert [c.verdict for c in pooled] == ["not supported"] and check_claims(pooled) == []
    # runs logged before decision rules (the quadratic term, q < 0 with CIs straddling 0): not judged
    old = [[Claim("kback1_rises_then_falls", "quadratic term", q, q - 0.02, q + 0.015, "inconclusive", "")]
           for q in (-0.012, -0.01, -0.011, -0.013)]
    (c,) = _layerwise_section(_frame(old))[1]
    assert c.ci_hi < 0 and c.verdict == "inconclusive" and "no decision rule" in c.reason


def test_artifacts_logged_to_parent(store):
    uri, pid, _, _ = store
    names = {f.path for f in tracking.client(uri).list_artifacts(pid, "report")}
    assert {"report/report.md", "report/report.html", "report/report.json", "report/theory_rate_vs_gamma.png"} <= names


def test_lookup_by_parent_id_and_unknown(store, tmp_path):
    uri, pid, _, _ = store
    rep = build_report(uri, pid, tmp_path / "byid", log=False)
    assert rep.header["study"] == "study-a"
    with pytest.raises(ValueError, match="unknown sweep"):
        build_report(uri, "no-such-study", tmp_path / "x", log=False)
    with pytest.raises(ValueError, match="unknown sweep"):
        build_report(uri, "0" * 32, tmp_path / "x", log=False)


def test_no_complete_trials_is_a_report(store, tmp_path):
    uri = store[0]
    rep = build_report(uri, "study-empty", tmp_path / "empty", log=False)
    assert rep.header["n_complete"] == 0 and rep.header["n_failed"] == 1 and rep.claims == []
    assert "no complete trials" in (tmp_path / "empty" / "report.md").read_text()


def test_renderers_escape_and_claim_sides():
    secs = [Section("A <b>", [("p", "x & y"), ("table", ["a|b", "c"], [["1", "<2>"]])])]
    html, md = render_html("T", secs), render_md("T", secs)
    assert "A &lt;b&gt;" in html and "x &amp; y" in html and "<td>&lt;2&gt;</td>" in html
    assert "| a\\|b | c |" in md
    assert claim_side("upper layers change less _slope_") == -1 and claim_side("task_beats_control") == 1
    assert claim_side("new_claim", [(0.3, "supported")]) == 1 and claim_side("new_claim") == 0


def test_practice_and_depth_vs_rank(store, tmp_path):
    uri = store[0]
    rep = build_report(uri, "study-b", tmp_path / "b", log=False)
    titles = [s.title for s in rep.sections]
    assert any(t.startswith("Practice vs theory") for t in titles) and "Depth vs rank" in titles
    assert not any(t.startswith("Positional encoding") for t in titles)  # one pos_enc level
    c = _claim(rep, "depth helps more at higher rank")
    assert c.ci_lo <= -0.04 <= c.ci_hi and c.ci_hi < 0 and c.verdict == "supported"
    assert (tmp_path / "b" / "practice_vs_theory.png").exists()
    md = (tmp_path / "b" / "report.md").read_text()
    # gamma, d, window, L = receptive field n_layers (w - 1) + 1, runs: 2 layers of width 4 see 7 tokens
    assert "| 0.5 | 4 | 4 | 7 | 1 |" in md and "| 0.5 | 4 | 8 | 15 | 1 |" in md and "receptive field" in md
