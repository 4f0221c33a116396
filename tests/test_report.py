"""hmmscope.report against a temporary sqlite MLflow store with planted effects (the sweep layout of hmmscope.sweep),
and beside it the Optuna studies that record which trial is complete and which MLflow run it kept."""

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest

from hmmscope import tracking
from hmmscope.measure.probes import TargetScores, probe_claims
from hmmscope.report import build_report, report_to_dict
from hmmscope.report.common import Section, claim_side
from hmmscope.report.layerwise import layerwise_section
from hmmscope.report.render import render_html, render_md
from hmmscope.stats import Claim, check_claims

EXP = "rep"
GAMMAS = (0.2, 0.4, 0.6, 0.8)
SEED_SHIFT = {0: 0.003, 1: -0.002, 2: 0.001}
JITTER = {0.2: 1.01, 0.4: 0.99, 0.6: 1.005, 0.8: 0.996}


class TrialPruned(Exception):
    pass


def _sweep_parent(uri, study, **kw):
    return tracking.start_run(uri, EXP, study, params={"sweep.spec_hash": "abc123", "sweep.n_trials": 20},
                              tags={"hmmscope.kind": "sweep", "hmmscope.study": study, **kw})


def _trial_tags(study, n):
    return {"hmmscope.trial": n, "hmmscope.study": study}


def _study(storage, name, parent_id, trials):
    """A real Optuna study: one trial per (state, MLflow run id, retry_history), parent run recorded."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage)
    study.set_user_attr("mlflow_parent_run_id", parent_id)
    for state, rid, history in trials:
        study.add_trial(optuna.trial.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=0.0 if state == "COMPLETE" else None,
            user_attrs={"mlflow_run_id": rid} if rid else {},
            system_attrs={"failed_trial": history[0], "retry_history": history} if history else {}))
    return study


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store")
    uri, storage = f"sqlite:///{tmp}/mlflow.db", f"sqlite:///{tmp}/optuna.db"
    rng = np.random.default_rng(0)
    n = 0
    trials_a = []  # (Optuna state, MLflow run id, retry history) of study-a's trials
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
                    trials_a.append(["COMPLETE", tr.run_id, None])
                    n += 1
        # one theory trial: rate = 0.3 gamma^2 exactly, S=4 d=2 rho=0
        with tracking.start_run(uri, EXP, "theory", parent=parent, tags={"hmmscope.kind": "sweep-theory",
                                                                        **_trial_tags("study-a", n)},
                                params={"theory.n_histories": 100}) as th:
            for g in GAMMAS:
                r = 0.3 * g ** 2 * JITTER[g]  # not exact: a noise-free fit has a zero-width CI (no power)
                with tracking.start_run(uri, EXP, f"S4-d2-gamma{g}", parent=th, tags={"hmmscope.kind": "theory-setting"},
                                        params={"hmm.n_states": 4, "hmm.rank": 2, "hmm.gamma": g, "hmm.rho": 0.0}) as s:
                    s.log_metrics({"theory/rate": r, "theory/rate_lo": 0.9 * r, "theory/rate_hi": 1.1 * r,
                                   "theory/log_intercept": math.log(2), "theory/gamma_eff": g,
                                   "theory/mixing_rate": 0.02})
            for d in (4, 8):  # at gamma 0.8: intercept = log 2 + 0.5 log(d / 2): rank slope 0.5 <= 1
                with tracking.start_run(uri, EXP, f"S4-d{d}-gamma0.8", parent=th,
                                        params={"hmm.n_states": 4, "hmm.rank": d, "hmm.gamma": 0.8, "hmm.rho": 0.0}) as s:
                    s.log_metrics({"theory/rate": 0.3 * 0.64, "theory/rate_lo": 0.17, "theory/rate_hi": 0.21,
                                   "theory/log_intercept": math.log(2) + 0.5 * math.log(d / 2) + 0.01 * (6 - d),
                                   "theory/gamma_eff": 0.8})
        trials_a.append(["COMPLETE", th.run_id, None])
        n += 1
        # a failed trial and two pruned ones
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                             tags=_trial_tags("study-a", n)) as bad:
            raise RuntimeError("diverged")
        trials_a.append(["FAIL", bad.run_id, None])
        n += 1
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                             tags={**_trial_tags("study-a", n), "hmmscope.pruned": "true"}) as pr:
            raise RuntimeError("pruned")
        trials_a.append(["PRUNED", pr.run_id, None])
        n += 1
        with pytest.raises(TrialPruned), tracking.start_run(uri, EXP, f"trial-{n}", parent=parent,
                                                            tags=_trial_tags("study-a", n)) as pr2:
            raise TrialPruned("step 10")  # hmmscope.sweep marks pruning by the failure reason only
        trials_a.append(["PRUNED", pr2.run_id, None])
        n += 1
        # a worker finished this run, then died before telling the study: its trial went stale (FAIL) and was
        # run again as trial 6 (absolute, seed 0, gamma 0.5). The run is FINISHED, with a wild planted value
        # and a wild analysis claim; the report must not count it, nor use it as a replicate.
        with tracking.start_run(uri, EXP, f"trial-{n}", parent=parent, tags=_trial_tags("study-a", n),
                                params={"hmm.gamma": 0.5, "hmm.rank": 4, "model.pos_enc": "absolute", "model.window": 0,
                                        "model.n_layers": 2, "train.seed": 0, "data.seed": 7}) as dup:
            dup.log_metrics({"eval/excess_ce": 9.0, "eval/test_acc": 0.0, "eval/kl_mix": 9.0})
            with tracking.start_run(uri, EXP, "analysis", parent=dup, tags={"hmmscope.kind": "analysis"}) as an:
                an.log_metrics({"claim/upper layers change less _slope_/value": 5.0,
                                "claim/upper layers change less _slope_/ci_lo": 4.0,
                                "claim/upper layers change less _slope_/ci_hi": 6.0})
        trials_a.append(["FAIL", dup.run_id, None])
        trials_a[6][2] = [n]  # trial 6 is the retry of trial n
        n += 1
        # a worker killed mid-training: its run stays RUNNING, its trial FAIL and retried (by trial 7)
        orphan = tracking.client(uri).create_run(tracking.experiment_id(uri, EXP), run_name=f"trial-{n}",
                                                 tags={"mlflow.parentRunId": parent.run_id})
        trials_a.append(["FAIL", None, None])
        trials_a[7][2] = [n]
    _study(storage, "study-a", parent.run_id, trials_a)
    assert orphan.info.status == "RUNNING"
    trials_b = []
    with _sweep_parent(uri, "study-b") as pb:  # windowed runs, depth x rank with a planted interaction
        for i, (nl, rank, win) in enumerate([(nl, r, w) for nl in (1, 2) for r in (2, 4, 8) for w in (4, 8)]):
            params = {"hmm.gamma": 0.5, "hmm.rank": rank, "model.pos_enc": "rope", "model.window": win,
                      "model.n_layers": nl, "train.seed": i, "data.seed": 7}
            with tracking.start_run(uri, EXP, f"b-{i}", parent=pb, params=params, tags=_trial_tags("study-b", i)) as tr:
                ce = 0.5 + 0.05 * math.log(rank) - 0.04 * nl * math.log(rank) + rng.normal(0, 0.003)
                rf = nl * (win - 1) + 1  # receptive field, as evaluate.memory_comparison logs it
                tr.log_metrics({"eval/excess_ce": ce, "memory/model_tv": 0.1 * math.exp(-0.2 * rf) + 0.01,
                                "memory/eps": 0.1 * math.exp(-0.2 * rf), "memory/receptive_field": rf})
            trials_b.append(("COMPLETE", tr.run_id, None))
    _study(storage, "study-b", pb.run_id, trials_b)
    with _sweep_parent(uri, "study-empty") as empty:
        with pytest.raises(RuntimeError), tracking.start_run(uri, EXP, "trial-0", parent=empty,
                                                             tags=_trial_tags("study-empty", 0)) as bad:
            raise RuntimeError("boom")
    _study(storage, "study-empty", empty.run_id, [("FAIL", bad.run_id, None)])
    rep = build_report(uri, "study-a", tmp / "out")
    return uri, parent.run_id, rep, tmp


def _claim(rep, name):
    return next(c for c in rep.claims if c.name == name)


def test_header_counts_and_files(store):
    uri, pid, rep, tmp = store
    h = rep.header
    assert (h["n_complete"], h["n_failed"], h["n_pruned"]) == (13, 1, 2)
    assert (h["n_retried"], h["n_waiting"], h["n_running"]) == (2, 0, 0)  # the study's states, not run statuses
    assert h["n_training_trials"] == 12 and h["n_theory_trials"] == 1
    assert h["config_hash"] == "abc123" and rep.parent_id == pid
    md, html = (tmp / "out" / "report.md").read_text(), (tmp / "out" / "report.html").read_text()
    for title in ("Answer", "Sweep record", "Theory", "Positional encoding", "Layerwise claims", "Verdicts"):
        assert f"## {title}" in md and f"<h2>{title}" in html
    assert "| 13 / 1 / 2 / 0 |" in md and "<table>" in html
    assert "Depth vs rank" not in md and "Practice vs theory" not in md  # n_layers, window do not vary
    assert (tmp / "out" / "theory_rate_vs_gamma.png").stat().st_size > 1000
    json.dumps(report_to_dict(rep))  # JSON-able


def test_the_report_leads_with_the_answer_in_words(store):
    """Before: a metadata table and a paragraph of method first; "RoPE improves excess_ce: 0.0118" for a RoPE that
    did worse; 40-60 words of method and power repeated in every row. Now the first section is the answer, one
    sentence per verdict with the sign in words and units, and the long texts are listed once below each table."""
    uri, pid, rep, tmp = store
    md = (tmp / "out" / "report.md").read_text()
    assert md.index("## Answer") < md.index("## Sweep record") < md.index("## Positional encoding")
    answer = md[md.index("## Answer"):md.index("## Sweep record")]
    c = _claim(rep, "RoPE improves eval/excess_ce")  # planted: rope lower by 0.05
    from hmmscope.units import value_ci

    assert f"- RoPE - absolute on eval/excess_ce: {value_ci(c.value, c.ci_lo, c.ci_hi, 'nats/token')}, 3 seeds: RoPE " \
           "better" in answer and c.value < 0  # the signed difference, as the tables show it
    acc = _claim(rep, "RoPE improves eval/test_acc")
    assert f"- RoPE - absolute on eval/test_acc: {value_ci(acc.value, acc.ci_lo, acc.ci_hi)} fraction of test tokens" \
        in answer
    assert answer.count("\n- ") == len(rep.claims)  # one sentence per verdict
    sec = md[md.index("## Positional encoding"):md.index("## Layerwise")]
    table = [ln for ln in sec.split("\n") if ln.startswith("| eval/")]
    assert table and all(len(ln) < 400 for ln in table)  # no paragraph per row
    method = next(x for x in sec.split("\n") if x.startswith("- [1] "))[len("- [1] "):]
    assert sec.count(method) == 1 and sec.count("| verdict [1] |") >= 2  # the method: once, below the table
    assert f"RoPE - absolute on eval/excess_ce: {value_ci(c.value, c.ci_lo, c.ci_hi, 'nats/token')}" in "\n".join(
        rep.summary_lines())  # the CLI too


def test_verdict_sentences_say_the_sign_in_words():
    """The signed difference rope - absolute, as the tables and figures show it (before: 'RoPE lower ... by' with the
    CI of the magnitude, the table's sign flipped); test_report_design.py has the rest."""
    from hmmscope.report.common import verdict_sentence
    from hmmscope.stats import Claim

    def c(name, v, lo, hi, verdict):
        return Claim(name, "rope - absolute; 3 seed units", v, lo, hi, verdict, "", "< 0")

    assert verdict_sentence(c("RoPE improves eval/seen/excess_ce", -0.059, -0.108, -0.010, "supported")) == \
        "RoPE - absolute on eval/seen/excess_ce: -0.0590 [-0.1080, -0.0100] nats/token, 3 seeds: RoPE better"
    assert verdict_sentence(c("RoPE improves eval/seen/excess_ce", 0.0118, -0.11, 0.134, "inconclusive")) == \
        "RoPE - absolute on eval/seen/excess_ce: 0.012 [-0.110, 0.134] nats/token, 3 seeds: no detectable difference"
    assert verdict_sentence(c("RoPE improves eval/seen/kl_mix", 0.02, 0.01, 0.03, "not supported")).endswith(
        ": RoPE worse")
    assert verdict_sentence(Claim("k <= 4", "", 1.73, 1.23, 2.22, "supported", "", "<= 4")) == \
        "k <= 4: 1.730 [1.230, 2.220]: supported"


def test_posenc_figure_never_joins_blocks_and_says_units_and_the_better_side():
    """Before: each encoding's means were joined across gamma levels and dodged apart, so a 0.002 difference
    looked like 0.06, and the effect panels had no units or 'RoPE better' side. Now no line crosses from one
    block to the next (a seed's two encodings are joined within a block), every axis names its unit, and the
    half where RoPE is better is labelled."""
    import pandas as pd

    from hmmscope.report.posenc import posenc_figure
    from hmmscope.sweep.effects import pos_enc_effect

    rows = [{"param:model.pos_enc": pe, "param:hmm.gamma": g, "param:train.seed": sd,
             "metric:eval/excess_ce": 0.2 + 0.5 * g + 0.002 * (pe == "absolute") + 0.01 * sd}
            for pe in ("rope", "absolute") for g in (0.5, 0.9) for sd in (0, 1, 2)]
    dm = pd.DataFrame(rows)
    est = pos_enc_effect(dm, "metric:eval/excess_ce", ["param:hmm.gamma"], "param:train.seed")
    fig = posenc_figure([("eval/excess_ce", dm, ["param:hmm.gamma"], est)], "param:train.seed")
    top, bottom = fig.axes
    for ln in top.get_lines():  # within one block (x = 0 or 1, +- 0.25): never from gamma 0.5 to 0.9
        x = [float(v) for v in ln.get_xdata()]
        assert max(x) - min(x) < 0.5, x
    assert top.get_ylabel() == "nats/token" and top.get_title() == "eval/excess_ce"  # the unit; the metric above
    assert bottom.get_ylabel() == "rope - absolute (nats/token)"
    labels = {t.get_text(): t.get_position()[1] for t in bottom.texts}
    assert labels["RoPE better"] < 0 < labels["RoPE worse"]  # lower CE is better: below zero
    assert est.value == pytest.approx(-0.002)


def test_posenc_effect_recovers_planted_difference(store):
    rep = store[2]
    c = _claim(rep, "RoPE improves eval/excess_ce")
    assert c.ci_lo <= -0.05 <= c.ci_hi and c.ci_hi < 0
    assert abs(c.value + 0.05) < 0.01
    assert c.verdict == "supported" and "seeds as the unit" in c.statistic and c.df == 2  # 3 seeds: 2 df
    acc = _claim(rep, "RoPE improves eval/test_acc")  # acc = 0.6 - ce / 4: rope higher
    assert acc.verdict == "supported" and acc.value > 0
    sh = _claim(rep, "RoPE improves claim upper layers change less _slope_")  # no effect: rope = absolute exactly
    assert sh.value == 0 and sh.verdict == "no power" and "does not vary" in sh.reason  # degenerate, not "supported"


def test_theory_exponent_and_verdict(store):
    rep = store[2]
    c = _claim(rep, "theory: rate ~ gamma^k: k <= 4 [S=4 d=2 rho=0]")
    assert c.value == pytest.approx(2.0, abs=0.05) and c.df == 2  # one draw: OLS on 4 points, 2 df
    assert c.ci_lo <= 2.0 <= c.ci_hi and c.ci_hi < 4
    assert c.verdict == "supported" and "exponent 4 rejected" in c.reason and c.rule == "<= 4"
    # gamma_eff = gamma here: the same regression, named as such and not a second claim
    assert not any("gamma_eff^k" in x.name for x in rep.claims)
    md = (store[3] / "out" / "report.md").read_text()
    assert "same regression" in md and "mixing m" in md
    assert _claim(rep, "theory: rate ~ gamma^k: k <= 4 [pooled]").value == pytest.approx(2.0, abs=0.05)
    # the excess over the mixing floor (0.02), over the settings whose rate CI lies above it
    x = _claim(rep, "theory: rate - mixing floor ~ gamma^k: k <= 4 [S=4 d=2 rho=0]")
    assert x.value > 2.0 and "3 of 4" in x.reason
    r = _claim(rep, "theory: intercept slope in log d <= 1 [S=4 rho=0 gamma=0.8]")
    assert r.value == pytest.approx(0.5, abs=0.05) and r.verdict == "supported" and r.df == 1
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
    """The training-frame columns report.read.training_frame reads from analysis runs, one row per run."""
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
    """A concave curve that only rises: never 'supported' in a run ('not supported', 'inconclusive', or 'no power'
    when the statistic is 0 in every resample: the peak is the last layer, so there is no fall), nor pooled.
    Pooling applies each run's rule to the statistic that decided it; it used to read only the sign of the
    value, and the quadratic term of a rising concave curve is negative too."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(6):
        hits = rng.binomial(16, np.broadcast_to([0.2, 0.6, 0.8, 0.9, 0.95], (120, 5))).astype(float)
        sc = {"kback1": TargetScores(hits, rng.binomial(16, np.full((120, 5), 0.1)).astype(float),
                                     np.full(120, 16.0), 0.1)}
        runs.append([c for c in probe_claims(range(5), sc, ks=(1,), n_boot=200, seed=seed)[0]
                     if c.name == "kback1_rises_then_falls"])
        assert runs[-1][0].verdict in ("not supported", "inconclusive", "no power")  # no power: 0 [0, 0]
    pooled = layerwise_section(_frame(runs))[1]
    # the runs' statistic is 0 in every run (peak at the last layer, so no fall): degenerate, never "supported"
    assert [c.verdict for c in pooled] == ["no power"] and check_claims(pooled) == []
    # runs logged before decision rules (the quadratic term, q < 0 with CIs straddling 0): not judged
    old = [[Claim("kback1_rises_then_falls", "quadratic term", q, q - 0.02, q + 0.015, "inconclusive", "")]
           for q in (-0.012, -0.01, -0.011, -0.013)]
    (c,) = layerwise_section(_frame(old))[1]
    assert c.ci_hi < 0 and c.verdict == "inconclusive" and "no decision rule" in c.reason


def test_the_pooled_layerwise_claims_get_a_family_line_and_holm_beside_each_verdict():
    """Issue 45.4: 12 claims on 3 runs each (2 df): the section says how many are supported, how many the rule would
    give by chance, and the Holm-adjusted verdict beside each pooled verdict (before: per-claim verdicts alone, one
    lucky 'supported' read as a finding)."""
    from hmmscope.stats import holm_verdicts

    rng = np.random.default_rng(4)
    runs = [[Claim(f"claim{j}", "s", v, v - 0.1, v + 0.1, "inconclusive", "", "> 0")
             for j, v in enumerate(rng.normal([0.5] + [0.0] * 11, 0.05))] for _ in range(3)]
    sec, pooled = layerwise_section(_frame(runs))
    holm, line = holm_verdicts(pooled)
    (para,) = [b[1] for b in sec.blocks if b[0] == "p" and b[1].startswith("Family of 12 pooled claims: ")]
    assert para == f"Family of 12 pooled claims: {line}." and "would call about 0.3 of the 12 tested" in line
    table = next(b for b in sec.blocks if b[0] == "table")
    assert table[1][-2:] == ["pooled verdict", "Holm (family)"]
    assert [r[-2] for r in table[2]] == [c.verdict for c in pooled] and [r[-1] for r in table[2]] == holm
    assert holm[0] == "supported" == pooled[0].verdict  # a real effect survives the family


def test_an_inconclusive_encoding_effect_says_what_the_design_excludes_and_the_seeds_it_needs():
    """Issue 45.2: for every inconclusive effect, what the design excludes (TOST: the 90% CI's far end) and the seeds
    that would decide the default margin (0.01 nats/token) with 80% power, from the seeds' SD (before: only
    'underpowered' when the CI was wider than the effect)."""
    from hmmscope.report.posenc import posenc_section
    from hmmscope.stats import t_mean
    from hmmscope.sweep.effects import seeds_needed, tost

    d = {0: 0.006, 1: -0.004, 2: 0.001}  # rope - absolute per seed
    df = pd.DataFrame([{"param:model.pos_enc": pe, "param:train.seed": s, "metric:eval/seen/excess_ce":
                        0.3 + 0.01 * s + d[s] * (pe == "rope")} for pe in ("rope", "absolute") for s in d])
    (c,) = [c for c in posenc_section(df)[1] if c.name == "RoPE improves eval/seen/excess_ce"]
    est = t_mean(list(d.values()), unit="seed")
    q, n = tost(est, 0.01), seeds_needed(est.se * 3 ** 0.5, 0.01)
    assert c.verdict == "inconclusive"
    assert f"effects beyond ±{q.excluded_beyond:.2g} nats/token are excluded (TOST, each side at 95%)" in c.reason
    assert f"{n} seeds would detect ±0.01 with 80% power" in c.reason


def test_artifacts_logged_to_parent(store):
    uri, pid, _, _ = store
    names = {f.path for f in tracking.client(uri).list_artifacts(pid, "report")}
    assert {"report/report.md", "report/report.html", "report/report.json", "report/theory_rate_vs_gamma.png",
            "report/theory_rate_vs_gamma.pdf", "report/trials.csv"} <= names  # the same files as on disk


def test_one_run_per_complete_trial(store, tmp_path):
    """The FINISHED run of a trial whose worker died before telling the study (and its analysis), and the
    RUNNING run of a killed worker, are children of the parent but enter no count and no statistic."""
    uri, pid, rep, tmp = store
    kids = [r for r in tracking.search_runs(uri, EXP) if r.data.tags.get("mlflow.parentRunId") == pid]
    assert sum(r.info.status == "FINISHED" for r in kids) == 14 and sum(r.info.status == "RUNNING" for r in kids) == 1
    rows = json.loads((tmp / "out" / "report.json").read_text())
    assert rows["header"]["n_complete"] == 13
    effect = _claim(rep, "RoPE improves eval/excess_ce")  # with the planted 9.0 replicate it would be ~ -0.8
    assert -0.06 < effect.value < -0.04


def test_lookup_by_parent_id_storage_and_unknown(store, tmp_path, monkeypatch):
    uri, pid, _, tmp = store
    rep = build_report(uri, pid, tmp_path / "byid", log=False)
    assert rep.header["study"] == "study-a"
    monkeypatch.chdir(tmp_path)  # no ./mlruns here
    with pytest.raises(ValueError, match="unknown sweep 'no-such-study'.*optuna.db"):
        build_report(uri, "no-such-study", tmp_path / "x", log=False)
    with pytest.raises(ValueError, match="unknown sweep"):
        build_report(uri, "0" * 32, tmp_path / "x", log=False)
    assert not (tmp_path / "x").exists()  # nothing written for an unknown sweep
    # the study in another storage: not found beside the tracking store, found with an explicit storage
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp / "optuna.db").rename(other / "optuna.db")
    try:
        with pytest.raises(ValueError, match="unknown sweep 'study-b'"):
            build_report(uri, "study-b", tmp_path / "b", log=False)
        rep = build_report(uri, "study-b", tmp_path / "b", log=False, storage=f"sqlite:///{other}/optuna.db")
        assert rep.header["n_complete"] == 12
    finally:
        (other / "optuna.db").rename(tmp / "optuna.db")


def test_complete_trial_without_its_run_is_left_out_with_a_note(tmp_path):
    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    with _sweep_parent(uri, "gone") as parent:
        with tracking.start_run(uri, EXP, "trial-0", parent=parent, params={"model.pos_enc": "rope"}) as tr:
            tr.log_metrics({"eval/excess_ce": 0.1})
    _study(storage, "gone", parent.run_id, [("COMPLETE", tr.run_id, None), ("COMPLETE", "f" * 32, None)])
    rep = build_report(uri, "gone", tmp_path / "out", log=False)
    assert rep.header["n_complete"] == 2 and rep.header["n_training_trials"] == 1
    assert any(f"trial 1 is COMPLETE but its MLflow run {'f' * 32} is missing" in n for n in rep.notes)


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


# ---------------------------------------------------------------- per-trial table, embedded figures, power


def test_trials_table_and_csv(store):
    """One row per COMPLETE trial (the run its study recorded): trial, run id, the params that vary, objective,
    metrics; trials.csv beside report.md holds every metric, analysis claims included."""
    import csv

    uri, pid, rep, tmp = store
    assert rep.files["trials"] == str(tmp / "out" / "trials.csv")
    with open(tmp / "out" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["trial"]) for r in rows] == list(range(13))  # the 13 COMPLETE trials, not the failed/retried ones
    assert {r["run_id"] for r in rows} == {r.info.run_id for r in tracking.search_runs(uri, EXP)
                                          if r.data.tags.get("mlflow.parentRunId") == pid
                                          and r.info.run_name != "trial-17" and r.info.status == "FINISHED"
                                          and r.data.metrics.get("eval/excess_ce") != 9.0}
    cols = rows[0].keys()
    assert {"model.pos_enc", "hmm.gamma", "train.seed"} <= cols and "data.seed" not in cols  # data.seed never varies
    assert {"eval/excess_ce", "claim/upper layers change less _slope_/value"} <= cols
    assert sum(r["kind"] == "theory" for r in rows) == 1
    md, html = (tmp / "out" / "report.md").read_text(), (tmp / "out" / "report.html").read_text()
    table = md[md.index("## Trials"):].split("\n")
    assert sum(line.startswith("| ") for line in table) == 1 + 13  # header + one row per trial
    assert any(line.startswith(f"| 0 | {rows[0]['run_id'][:8]} |") for line in table)
    assert "<h2>Trials</h2>" in html


def test_html_embeds_its_figures(store):
    import base64
    import re

    tmp = store[3]
    html = (tmp / "out" / "report.html").read_text()
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert base64.b64decode(srcs[0].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp / "out" / "theory_rate_vs_gamma.pdf").read_bytes()[:5] == b"%PDF-"  # PDF beside every PNG


@pytest.fixture(scope="module")
def thin(tmp_path_factory):
    """A sweep like `smoke`: rope/absolute x gamma 0.5/0.7/0.9, one seed (one replicate per cell); n_layers is
    confounded with pos_enc (not estimable beside it), train.lr differs in every trial; one analyzed run."""
    import optuna

    tmp = tmp_path_factory.mktemp("thin")
    uri, storage = f"sqlite:///{tmp}/mlflow.db", f"sqlite:///{tmp}/optuna.db"
    trials = []
    with _sweep_parent(uri, "thin") as parent:
        for i, (pe, gamma) in enumerate([(pe, g) for pe in ("rope", "absolute") for g in (0.5, 0.7, 0.9)]):
            params = {"hmm.gamma": gamma, "model.pos_enc": pe, "model.n_layers": 2 if pe == "rope" else 3,
                      "train.lr": 1e-3 * (i + 1), "train.seed": 0}
            with tracking.start_run(uri, EXP, f"t-{i}", parent=parent, params=params, tags=_trial_tags("thin", i)) as tr:
                ce = 0.2 + 0.1 * gamma + 0.01 * (pe == "absolute") + 0.004 * (i == 1)
                tr.log_metrics({"eval/excess_ce": ce, "eval/test_acc": 0.6 - ce / 4})
                if i == 0:
                    with tracking.start_run(uri, EXP, "analysis", parent=tr, tags={"hmmscope.kind": "analysis"}) as an:
                        an.log_metrics({"claim/task_beats_control/value": 0.02, "claim/task_beats_control/ci_lo": -0.1,
                                        "claim/task_beats_control/ci_hi": 0.14})
                        an.set_tags({"verdict/task_beats_control": "inconclusive: CI contains 0",
                                     "rule/task_beats_control": "> 0"})
            trials.append((tr.run_id, ce))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="thin", storage=storage)
    study.set_user_attr("mlflow_parent_run_id", parent.run_id)
    with warnings.catch_warnings():  # experimental in Optuna: the sweep sets it the same way
        warnings.simplefilter("ignore")
        study.set_metric_names(["eval/excess_ce"])
    for rid, ce in trials:
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=ce,
                                                  user_attrs={"mlflow_run_id": rid}))
    rep = build_report(uri, "thin", tmp / "out", log=False)
    return rep, (tmp / "out" / "report.md").read_text(), trials


def test_not_estimable_factors_stay_in_the_table(thin):
    rep, md, trials = thin
    sec = md[md.index("## Positional encoding"):md.index("## Layerwise")]
    rows = [line for line in sec.split("\n") if line.startswith("| eval/excess_ce | verdict [")
            or line.startswith("| eval/excess_ce | second opinion")]
    assert len(rows) == 2 and all("model.n_layers (confounded with pos_enc" in r
                                  and "train.lr (a different value in every trial" in r for r in rows)
    assert all("| hmm.gamma |" in r for r in rows)  # the factor the pairs are formed within
    factors = sec[sec.index("### Blocking factors"):]
    assert "| model.n_layers | 2 | left out: confounded with pos_enc (every level occurs with one encoding only) |" \
        in factors
    assert "| train.lr | 6 | left out: a different value in every trial: not estimable |" in factors
    assert "| hmm.gamma | 3 | paired within (a block) |" in factors


def test_blocking_factor_paired_not_dropped(thin):
    """One seed, 3 gammas (the smoke design): gamma is not estimated beside pos_enc (the old model dropped it and
    gave a CI wider than the metric's range); the paired within-gamma differences estimate the effect, with a CI
    well inside the data's range, and each gamma's own difference is shown beside the pooled one."""
    rep, md, trials = thin
    c = _claim(rep, "RoPE improves eval/excess_ce")
    ce = [v for _, v in trials]
    d = np.array([-0.01, -0.006, -0.01])  # rope - absolute at gamma 0.5, 0.7, 0.9 as planted
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert c.value == pytest.approx(d.mean()) and (c.ci_lo, c.ci_hi) == pytest.approx((d.mean() - half, d.mean() + half))
    assert c.df == 2 and c.ci_hi - c.ci_lo < (max(ce) - min(ce)) / 2 and c.verdict == "supported"
    levels = md[md.index("### Per-level effects"):md.index("### Blocking factors")]
    for g, v in zip((0.5, 0.7, 0.9), d):
        assert f"| eval/excess_ce | hmm.gamma = {g} | {v:.4g} |" in levels
    assert "| eval/excess_ce | pooled (the verdict row) |" in levels


def test_underpowered_is_said_plainly_and_verdicts_follow_the_ci(thin):
    rep, md, trials = thin
    c = _claim(rep, "RoPE improves eval/excess_ce")
    assert "underpowered: 1 seed per cell" in c.reason and "the effect's spread across blocks" in c.reason
    assert c.rule == "< 0" and check_claims([c]) == []  # the verdict is decide(rule, CI printed beside it)
    pooled = _claim(rep, "pooled: task_beats_control")
    assert pooled.verdict == "inconclusive" and "underpowered: 1 replicate" in pooled.reason
    assert "95% CI width 0.24 > |effect| 0.02" in pooled.reason
    assert check_claims([x for x in rep.claims if x.rule]) == []
    rows = [line for line in md.split("\n") if line.startswith("| eval/") and "| verdict [" in line
            or line.startswith("| task_beats_control | 1 |")]
    assert len(rows) == 3 and all("underpowered" in r for r in rows)  # 2 metrics, the pooled claim
    # every p printed with its degrees of freedom: the posenc table has a df column beside p
    assert "| p | df |" in md
    # the per-trial table names the objective the study recorded and its values
    assert "objective: eval/excess_ce" in md and f"| {trials[1][1]:.4g} |" in md


def test_underpowered_note():
    from hmmscope.report.common import underpowered

    assert underpowered(0.5, 0.4, 0.6, "supported", replicates=3) == ""
    assert underpowered(0.01, -0.2, 0.22, "inconclusive", replicates=3).startswith("underpowered: 95% CI width 0.42")
    assert underpowered(0.5, 0.1, 0.9, "supported", replicates=3) == ""  # wide but it answered the question
    assert "1 replicate per cell" in underpowered(0.5, 0.4, 0.6, "supported", replicates=1)
    assert "no finite 95% CI" in underpowered(float("nan"), float("nan"), float("nan"), "inconclusive")


def _assert_embeds_every_figure(rep, html_path):
    """report.html has one <img> per PNG figure the report wrote, each embedded as a data URI of that PNG."""
    import base64
    import re
    from pathlib import Path

    from hmmscope.report import OUTPUTS

    html = Path(html_path).read_text()
    assert {Path(v).name for v in rep.files.values()} <= set(OUTPUTS)  # report checks each of them before writing
    pngs = [Path(v) for k, v in rep.files.items() if str(v).endswith(".png")]
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert html.count("<img") == len(pngs) == len(srcs)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert sorted(base64.b64decode(s.split(",", 1)[1]) for s in srcs) == sorted(p.read_bytes() for p in pngs)
    return len(pngs)


def test_every_report_embeds_every_figure(store, thin, tmp_path):
    """Counts the <img> tags of report.html against the figures each report wrote: the training sweeps too (the
    committed rope-vs-absolute report had none: no section wrote a figure)."""
    uri, _, rep, tmp = store
    assert _assert_embeds_every_figure(rep, tmp / "out" / "report.html") == 3  # theory, posenc, layerwise
    assert {"theory", "posenc", "layerwise"} <= set(rep.files)
    b = build_report(uri, "study-b", tmp_path / "b", log=False)
    assert _assert_embeds_every_figure(b, tmp_path / "b" / "report.html") == 2  # practice, depth vs rank
    t = thin[0]
    assert _assert_embeds_every_figure(t, t.files["html"]) == 2  # posenc (gamma blocks), layerwise
    empty = build_report(uri, "study-empty", tmp_path / "e", log=False)
    assert _assert_embeds_every_figure(empty, tmp_path / "e" / "report.html") == 0


def test_theory_draws_read_back_from_the_runs(tmp_path):
    """A real theory run with 3 HMM draws per setting, logged as the sweep logs it (jobs.log_theory: per-draw
    metric histories theory/draw/*), read back by the report: the same two-stage exponent as run_theory's own,
    the draws as the unit (df 2), and the Monte Carlo / between-draw split in the table."""
    import optuna

    from hmmscope.config import TheoryConfig
    from hmmscope.jobs import log_theory
    from hmmscope.theory.theorem1 import run_theory

    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    res = run_theory(TheoryConfig(gammas=(0.3, 0.45, 0.6), ranks=(2,), n_states=(6,), n_tokens=8,
                                  lengths=(1, 2, 3, 4, 6), n_histories=200, burn_in=20, gamma_m=0, draws=3))
    with _sweep_parent(uri, "th") as parent:
        rid = log_theory(res, uri, EXP, [], parent=parent.run_id, tags={"hmmscope.kind": "sweep-theory",
                                                                        **_trial_tags("th", 0)})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="th", storage=storage)
    study.set_user_attr("mlflow_parent_run_id", parent.run_id)
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=0.0,
                                              user_attrs={"mlflow_run_id": rid}))
    rep = build_report(uri, "th", tmp_path / "out", log=False)
    own = next(f for f in res.exponent_fits if f.x_name == "gamma" and f.y_name == "rate")
    c = _claim(rep, "theory: rate ~ gamma^k: k <= 4 [S=6 d=2 rho=0.02]")
    assert own.n_draws == 3 and c.df == 2 and "t over 3 HMM draws" in c.statistic
    assert c.value == pytest.approx(own.k, rel=1e-9) and (c.ci_lo, c.ci_hi) == pytest.approx(own.k_ci, rel=1e-9)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| MC SE | between-draw sd | per-draw rates |" in md
    s = res.settings[0]
    assert f"| {s.rate_fit.rate:.4g} | [{s.rate_fit.rate_ci[0]:.4g}, {s.rate_fit.rate_ci[1]:.4g}] | 2 |" in md
    _assert_embeds_every_figure(rep, tmp_path / "out" / "report.html")


def test_regime_pooled_over_seeds(tmp_path):
    """report.regime: Figure 1's claims of each run (claims.json) pooled per setting over seeds by t (the layerwise
    pooling), the run's own rules applied to the pooled CI, and the regime word per setting (evaluate.regime):
    fresh tasks whose model beats best counting in every seed -> inference beyond counting; a mixture whose seen
    tasks are retrieved -> retrieval; a model at best counting -> counting."""
    from scipy import stats as st

    from hmmscope.report.regime import regime_section
    from hmmscope.stats import claim, rule

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runs = []
    planted = {"0": {"icl_gain": 0.10, "inference_beyond_counting": -0.05},
               "4": {"retrieval_gap": 0.5, "icl_gain": 0.02, "inference_beyond_counting": 0.3},
               "64": {"retrieval_gap": 0.0, "icl_gain": 0.05, "inference_beyond_counting": 0.0},
               "256": {"retrieval_gap": 0.0, "icl_gain": 0.05, "inference_beyond_counting": 0.3}}
    shift = {0: 0.004, 1: -0.003, 2: 0.001}
    with tracking.start_run(uri, EXP, "parent") as parent:
        for n_tasks, cl in planted.items():
            for seed in (0, 1, 2):
                with tracking.start_run(uri, EXP, f"T{n_tasks}-s{seed}", parent=parent,
                                        params={"hmm.n_tasks": n_tasks, "train.seed": seed, "data.seed": seed}) as r:
                    gain = None
                    out = []
                    for name in ("retrieval_gap", "icl_gain", "inference_beyond_counting"):
                        if name not in cl:
                            continue
                        v = cl[name] + shift[seed]
                        req = ["icl_gain"] if name == "inference_beyond_counting" else []
                        c = claim(name, name, v, v - 0.01, v + 0.01, rule("<" if req else ">", 0, req), "",
                                  {"icl_gain": gain} if req else None, df=math.inf)
                        gain = c.verdict if name == "icl_gain" else gain
                        out.append(c)
                    r.log_claims(out)
                runs.append(tracking.client(uri).get_run(r.run_id))
    sec, claims = regime_section(runs, uri)
    words = {row[0]: row[2] for row in sec.blocks[1][2]}
    # a model above best counting on its CI is "worse than counting" (SCIENCE.md 9; failed before: "counting")
    assert words == {"n_tasks=fresh": "inference beyond counting", "n_tasks=4": "retrieval", "n_tasks=64": "counting",
                     "n_tasks=256": "worse than counting"}
    c = next(c for c in claims if c.name == "n_tasks=fresh: inference_beyond_counting")
    vals = [-0.05 + shift[s] for s in (0, 1, 2)]
    h = st.t.ppf(0.975, 2) * np.std(vals, ddof=1) / math.sqrt(3)
    assert c.value == pytest.approx(np.mean(vals)) and c.ci_hi == pytest.approx(np.mean(vals) + h) and c.df == 2
    assert c.verdict == "supported" and c.rule == "< 0; requires icl_gain"
    assert not check_claims(claims, {}) or all("requires" in c.rule for c in claims if c.name.endswith("counting"))
