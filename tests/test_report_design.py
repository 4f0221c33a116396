"""What a run measures is never a design factor (SCIENCE.md 9, params and outputs; issue 38.1), and the report's first
sentence is the objective's answer (issue 38.2): `hmmscope report` on a real sqlite MLflow store and real Optuna
studies whose trial runs carry, as older stores do, the counting baselines' fitted settings as params counting.*."""

import csv

import numpy as np
import pytest

from hmmscope import tracking
from hmmscope.report import build_report

EXP = "design"
SPEC = """[sweep]
name = "NAME"
base = "tiny"
objective = "eval/seen/excess_ce"
seeds = [0, 1, 2]

[space]
"model.pos_enc" = {grid = ["rope", "absolute"]}
"hmm.gamma" = {grid = [0.5, 0.9]}
"""
SEED_SHIFT = {0: 0.004, 1: -0.003, 2: 0.001}
EFFECT = -0.03  # rope - absolute on eval/seen/excess_ce, planted


def _fitted(seed: int, gamma: float) -> dict:
    """An older store's counting.* params: what the fit chose on fit tasks, so they change with the seed (data.seed
    draws the fit tasks) and the family (gamma); the same for both encodings of one (seed, gamma)."""
    rng = np.random.default_rng([seed, int(gamma * 10)])
    out = {"counting.fit_episodes": 64}
    for k in range(3):
        out.update({f"counting.k{k}.ngram_order": int(rng.integers(1, 4)),
                    f"counting.k{k}.ngram_alpha": float(rng.choice([0.25, 0.5, 1.0])),
                    f"counting.k{k}.ngram_fit_ce": round(1.5 + rng.normal(0, 0.05), 4),
                    f"counting.k{k}.ctw_fit_ce": round(1.6 + rng.normal(0, 0.05), 4),
                    f"counting.k{k}.best": str(rng.choice(["incontext_ngram", "incontext_ctw"]))})
    return out


def _sweep(uri: str, storage: str, name: str, with_spec: bool) -> None:
    """A sweep as hmmscope lays it out: a parent run, one run per trial (pos_enc x gamma x 3 seeds), a study whose
    COMPLETE trials name their runs; with `with_spec`, the spec stored with the study (sweep.study.store_spec)."""
    import optuna

    from hmmscope.sweep.spec import parse_spec
    from hmmscope.sweep.study import store_spec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(1)
    study = optuna.create_study(study_name=name, storage=storage)
    with tracking.start_run(uri, EXP, f"sweep-{name}", tags={"hmmscope.kind": "sweep", "hmmscope.study": name}) as p:
        n = 0
        for pe in ("rope", "absolute"):
            for gamma in (0.5, 0.9):
                for seed in (0, 1, 2):
                    ce = 0.2 + 0.5 * gamma + EFFECT * (pe == "rope") + SEED_SHIFT[seed] + rng.normal(0, 0.003)
                    params = {"model.pos_enc": pe, "hmm.gamma": gamma, "train.seed": seed, "data.seed": seed,
                              **_fitted(seed, gamma)}
                    with tracking.start_run(uri, EXP, f"{pe}-g{gamma}-s{seed}", parent=p, params=params,
                                            tags={"hmmscope.kind": "sweep-train", "hmmscope.trial": n}) as r:
                        r.log_metrics({"eval/seen/excess_ce": ce, "eval/seen/test_acc": 0.6 - ce / 4,
                                       "eval/seen/kl_mix": ce})
                    study.add_trial(optuna.trial.create_trial(
                        state=optuna.trial.TrialState.COMPLETE, value=ce,
                        params={"model.pos_enc": pe, "hmm.gamma": gamma},
                        distributions={"model.pos_enc": optuna.distributions.CategoricalDistribution(["rope", "absolute"]),
                                       "hmm.gamma": optuna.distributions.CategoricalDistribution([0.5, 0.9])},
                        user_attrs={"mlflow_run_id": r.run_id, "seed": seed}))
                    n += 1
    study.set_user_attr("mlflow_parent_run_id", p.run_id)
    study.set_metric_names(["eval/seen/excess_ce"])
    if with_spec:
        store_spec(study, parse_spec(SPEC.replace("NAME", name), f"{name}.toml"))


GAMMA_SPEC = """[sweep]
name = "NAME"
base = "tiny"
objective = "eval/seen/excess_ce"
seeds = SEEDS

[fixed]
"model.pos_enc" = "rope"

[space]
"hmm.gamma" = {grid = GAMMAS}
REPORT"""
BUMP = 0.15  # the gamma-ref sweep's own cell (gamma 0.7) lies above the line through its reference cells


def _gamma_sweep(uri: str, storage: str, name: str, gammas: list, seeds: list, report: str = "") -> None:
    """A one-axis gamma sweep (RoPE fixed) as hmmscope lays it out, its spec stored; the planted excess CE is the
    with-spec sweep's RoPE line, plus BUMP at gamma 0.7."""
    import optuna

    from hmmscope.sweep.spec import parse_spec
    from hmmscope.sweep.study import store_spec

    rng = np.random.default_rng(2)
    study = optuna.create_study(study_name=name, storage=storage)
    with tracking.start_run(uri, EXP, f"sweep-{name}", tags={"hmmscope.kind": "sweep", "hmmscope.study": name}) as p:
        for n, (gamma, seed) in enumerate((g, s) for g in gammas for s in seeds):
            ce = 0.2 + 0.5 * gamma + EFFECT + SEED_SHIFT[seed] + BUMP * (gamma == 0.7) + rng.normal(0, 0.003)
            with tracking.start_run(uri, EXP, f"g{gamma}-s{seed}", parent=p, params={
                    "model.pos_enc": "rope", "hmm.gamma": gamma, "train.seed": seed, "data.seed": seed},
                    tags={"hmmscope.kind": "sweep-train", "hmmscope.trial": n}) as r:
                r.log_metrics({"eval/seen/excess_ce": ce, "eval/seen/test_acc": 0.6 - ce / 4})
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=ce, params={"hmm.gamma": gamma},
                distributions={"hmm.gamma": optuna.distributions.CategoricalDistribution(gammas)},
                user_attrs={"mlflow_run_id": r.run_id, "seed": seed}))
    study.set_user_attr("mlflow_parent_run_id", p.run_id)
    text = GAMMA_SPEC.replace("NAME", name).replace("SEEDS", str(seeds)).replace("GAMMAS", str(gammas))
    store_spec(study, parse_spec(text.replace("REPORT", report), f"{name}.toml"))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("design")
    uri, storage = f"sqlite:///{tmp}/mlflow.db", f"sqlite:///{tmp}/optuna.db"
    _sweep(uri, storage, "with-spec", True)
    _sweep(uri, storage, "no-spec", False)
    _gamma_sweep(uri, storage, "gamma", [0.5, 0.9], [0, 1])
    _gamma_sweep(uri, storage, "gamma-ref", [0.7], [0, 1, 2], '[report]\nreference = "with-spec"\n')
    return {name: (build_report(uri, name, tmp / name, storage=storage, log=False), tmp / name)
            for name in ("with-spec", "no-spec", "gamma", "gamma-ref")}


def _section(md: str, title: str) -> str:
    start = md.index(title)
    end = md.find("\n## ", start + 1)
    return md[start:end if end > 0 else None]


@pytest.mark.parametrize("name", ["with-spec", "no-spec"])
def test_fitted_params_of_an_older_store_are_never_blocks_levels_or_trial_columns(reports, name):
    """Before: the 16 counting.* params that change with the seed were blocks of the RoPE - absolute effect (its
    blocking factors, its per-level effects: `counting.k0.ngram_fit_ce = 1.5509`), and columns of the trials table
    before hmm.gamma. Now only the spec's [space] keys (without a stored spec: the params that are config keys) are
    design factors; the fitted values stay in trials.csv, after the metrics."""
    rep, out = reports[name]
    md = (out / "report.md").read_text()
    pe = _section(md, "## Positional encoding")
    assert "counting." not in pe, pe[:3000]
    factors = _section(pe, "### Blocking factors")
    assert [ln.split("|")[1].strip() for ln in factors.splitlines() if ln.startswith("| hmm.")] == ["hmm.gamma"]
    levels = _section(pe, "### Per-level effects")
    assert {ln.split("|")[2].strip() for ln in levels.splitlines() if ln.startswith("| eval/seen/excess_ce")} == {
        "hmm.gamma = 0.5", "hmm.gamma = 0.9", "pooled (the verdict row)"}
    trials = _section(md, "## Trials")
    head = next(ln for ln in trials.splitlines() if ln.startswith("| trial |"))
    assert "counting." not in head and [c.strip() for c in head.split("|")[3:7]] == [
        "data.seed", "hmm.gamma", "model.pos_enc", "train.seed"], head
    with open(out / "trials.csv", newline="") as fh:
        cols = next(csv.reader(fh))
    first_fitted = min(i for i, c in enumerate(cols) if c.startswith("counting."))
    assert first_fitted > max(i for i, c in enumerate(cols) if "/" in c)  # outputs, after every metric
    c = next(c for c in rep.claims if c.name == "RoPE improves eval/seen/excess_ce")
    assert c.df == 2 and c.ci_lo < EFFECT < c.ci_hi < 0 and c.verdict == "supported"
    assert not [n for n in rep.notes if "failed" in n]


def test_verdict_moves_reads_a_records_fitted_columns_as_outputs(reports, capsys):
    """analysis/verdict_moves.py rebuilds a record's training frame from its trials.csv: a column that is no config
    key (counting.k0.ngram_fit_ce ...: what a run fitted) is not a param there either (before: every column
    without a '/' was one, so the re-run positional-encoding section blocked on them); the verdicts it recomputes
    are the report's."""
    import importlib
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
    try:
        vm = importlib.import_module("verdict_moves")
    finally:
        sys.path.pop(0)
    _, out = reports["with-spec"]
    df, _ = vm._frame(out, json.loads((out / "report.json").read_text()))
    params = sorted(c for c in df.columns if c.startswith("param:"))
    assert params == ["param:data.seed", "param:hmm.gamma", "param:model.pos_enc", "param:train.seed"], params
    assert vm.main([str(out)]) == 0
    text = capsys.readouterr().out
    row = next(ln for ln in text.splitlines() if ln.startswith("| RoPE improves eval/seen/excess_ce |"))
    assert row.endswith("|  |") and "supported" in row  # not moved


def test_the_first_sentences_answer_every_swept_key_with_its_sign_everywhere_the_same(reports):
    """Before: the answer began with test accuracy, and its sentence flipped the sign of the table ("RoPE lower ... by
    0.00607 [-0.221, 0.233]" beside -0.006065 [-0.2332, 0.2211]); pivot.png repeated the table above it; then (issue
    46.1) only RoPE - absolute was answered, gamma not at all, and the `all (pooled)` row averaged the gamma levels.
    Now the first lines are, in bold, one per swept key: rope - absolute with its unit, CI, seeds and verdict, the
    same signed numbers as the table, the claim and the figure's pooled point, then gamma's 0.9 - 0.5; the effects
    table gives each with its rule, Holm-adjusted verdict, TOST and power; the verdict lines are sentences with units
    and replicates, the objective's first, with the family's line; pivot.png is the parent run's alone."""
    from hmmscope.units import value_ci

    rep, out = reports["with-spec"]
    md = (out / "report.md").read_text()
    answer = _section(md, "## Answer")
    first, second = answer.split("\n\n")[1:3]
    c = next(c for c in rep.claims if c.name == "RoPE improves eval/seen/excess_ce")
    want = (f"model.pos_enc: rope - absolute = {value_ci(c.value, c.ci_lo, c.ci_hi, 'nats/token', signed=True)}, "
            "3 seeds: excess CE (seen tasks) lower with rope than absolute, rope better (supported)")
    assert first == f"**{want}**" and c.value < 0 and want.split("= ")[1].startswith("-0.0")
    assert second.startswith("**hmm.gamma: 0.9 - 0.5 = +0.") and second.endswith("grows with gamma (supported)**")
    assert rep.answer == f"{want}; {second[2:-2]}" and rep.summary_lines()[1] == f"answer: {rep.answer}"
    pe, g = rep.effects
    assert (pe.claim.value, pe.claim.ci_lo, pe.claim.ci_hi) == pytest.approx((c.value, c.ci_lo, c.ci_hi))
    pooled = next(ln for ln in answer.splitlines() if ln.startswith("| all (paired within hmm.gamma)"))
    assert pooled.split("|")[-2].strip().startswith(f"{c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}]")  # same sign
    assert pooled.split("|")[2].strip() == "-"  # no rope mean over the gamma levels
    assert f"<p><strong>{want}</strong></p>" in (out / "report.html").read_text()
    table = _section(answer, "### Effect of each swept key")
    rows = [ln.split("|")[1:-1] for ln in table.splitlines() if ln.startswith(("| model.pos_enc |", "| hmm.gamma |"))]
    assert [r[7].strip() for r in rows] == ["supported", "supported"] and [r[6].strip() for r in rows] == ["!= 0"] * 2
    assert "Family of 2 effects: 2 of 2 claims supported" in table
    items = [ln[2:] for ln in _section(answer, "### Verdicts in words").splitlines() if ln.startswith("- ")]
    assert items[0] == (f"RoPE - absolute on eval/seen/excess_ce: {value_ci(c.value, c.ci_lo, c.ci_hi, 'nats/token')},"
                        " 3 seeds: RoPE better") and len(items) == len(rep.claims)
    assert all(("nats/token" in x or "fraction of test tokens" in x) and "3 seeds" in x for x in items), items
    assert f"Family of the report's {len(rep.claims)} claims: " in answer
    verdicts = _section(md, "\n## Verdicts\n")
    assert "| Holm (family) |" in verdicts and f"Family of {len(rep.claims)} claims: " in verdicts
    assert "pivot.png" not in md and not (out / "pivot.png").exists() and "objective.png" in answer
    assert "rope - absolute < 0 means RoPE is lower" in answer


def test_a_two_level_gamma_sweep_opens_with_the_gamma_effect_and_no_rope_boilerplate(reports):
    """Issue 46 (done when): an own 2-level gamma sweep's report opens with the gamma effect, its CI and verdict;
    nothing about RoPE where pos_enc is not swept; 2 seeds are "2 seeds" and seeds the unit everywhere."""
    from hmmscope.units import value_ci

    rep, out = reports["gamma"]
    answer = _section((out / "report.md").read_text(), "## Answer")
    (g,) = rep.effects
    assert g.label == "0.9 - 0.5" and g.claim.value == pytest.approx(0.2, abs=0.01) and g.n == 2 and g.claim.df == 1
    first = answer.split("\n\n")[1]
    want = f"hmm.gamma: 0.9 - 0.5 = {value_ci(g.claim.value, g.claim.ci_lo, g.claim.ci_hi, 'nats/token', signed=True)}"
    assert first.startswith(f"**{want}, 2 seeds: ") and first.endswith(f"({g.verdict})**"), first
    assert "RoPE" not in answer and "rope" not in answer and "Best of" not in answer
    assert "seeds as the unit" in answer and "block" not in answer


def test_a_reference_cell_from_another_sweep_joins_as_a_level_and_a_non_monotone_slope_says_so(reports):
    """A spec's [report] reference names the sweep that holds its base cell (issue 46.1: the record's gamma sweep ran
    0.6 and 0.95, its 0.8 lives in the depth sweep): the matching trials (RoPE, the same config but gamma) join as
    levels 0.5 and 0.9 beside the sweep's own 0.7; the slope over 0.5, 0.7, 0.9 is positive but its steps are not
    (issue 45.3): "not monotone", with the steps shown."""
    rep, out = reports["gamma-ref"]
    answer = _section((out / "report.md").read_text(), "## Answer")
    assert "Reference: hmm.gamma = 0.5; hmm.gamma = 0.9: the reference cell, 6 trials of sweep with-spec" in answer
    (g,) = rep.effects
    assert g.label == "slope" and [lab for lab, _ in g.steps] == ["0.7 - 0.5", "0.9 - 0.7"]
    up, down = (s.claim.value for _, s in g.steps)
    assert up == pytest.approx(0.1 + BUMP, abs=0.01) and down == pytest.approx(0.1 - BUMP, abs=0.01)
    assert g.claim.ci_lo > 0 and g.verdict == "not monotone"
    first = answer.split("\n\n")[1]
    assert first.startswith("**hmm.gamma: slope = +0.") and "not one way: steps 0.7 - 0.5 +0.2" in first
    assert first.endswith("(not monotone)**")
    assert "| hmm.gamma | slope |" in answer and "| step 0.9 - 0.7 |" in answer


def test_verdict_sentences_of_settings_and_effects_have_units_and_replicates():
    from hmmscope.report.common import verdict_sentence
    from hmmscope.stats import Claim

    def c(name, v, lo, hi, verdict, stat=""):
        return Claim(name, stat, v, lo, hi, verdict, "", "> 0")

    assert verdict_sentence(c("RoPE improves eval/seen/excess_ce", -0.006065, -0.2332, 0.2211, "inconclusive",
                              "rope - absolute (...); better = lower; 2 seed units")) == \
        "RoPE - absolute on eval/seen/excess_ce: -0.006 [-0.233, 0.221] nats/token, 2 seeds: no detectable difference"
    assert verdict_sentence(c("RoPE improves eval/seen/test_acc", 0.0088, 0.005, 0.0126, "supported",
                              "...; 2 block (one seed) units")) == ("RoPE - absolute on eval/seen/test_acc: 0.00880 "
                                                                    "[0.00500, 0.01260] fraction of test tokens, one "
                                                                    "seed (2 blocks as the units): RoPE better")
    assert verdict_sentence(c("gamma=0.9, pos_enc=rope: retrieval_gap", 0.408, 0.292, 0.524, "supported",
                              "retrieval_gap: mean over 2 seeds, t interval on 1 df")) == (
        "gamma = 0.9, pos_enc = rope: retrieval gap (unseen minus seen tasks, model - task oracle) 0.408 [0.292, "
        "0.524] nats/token, 2 seeds: supported")
    assert verdict_sentence(c("gamma=0.5, pos_enc=rope: icl_gain", 0.0082, -0.0031, 0.0195, "inconclusive",
                              "icl_gain of the one run (its own CI over episodes)")).endswith(
        "0.0082 [-0.0031, 0.0195] nats/token, one run (its CI over episodes): inconclusive")


def test_a_gamma_sweep_answers_with_the_gamma_effect_and_a_tuned_key_with_its_best_setting():
    """Issue 46.1: before, a gamma sweep answered "Best of 2 settings ... hmm.gamma = 0.5: 0.4600 ...; next hmm.gamma
    = 0.9", with no 0.9 - 0.5 difference, CI or verdict although both levels share seeds. Now it answers with the
    paired difference over seeds; a key a user tunes (train.lr) keeps its best setting, marked as tuned."""
    import pandas as pd

    from hmmscope.stats import t_mean
    from hmmscope.sweep.compare import OBJ, answer
    from hmmscope.sweep.spec import parse_spec
    from hmmscope.units import value_ci

    spec = parse_spec(SPEC.replace("NAME", "g").replace('"model.pos_enc" = {grid = ["rope", "absolute"]}\n', ""))
    df = pd.DataFrame([{"param:hmm.gamma": g, "param:train.seed": s, OBJ: 0.2 + 0.5 * g + 0.01 * s + 0.001 * s * g}
                       for g in (0.5, 0.9) for s in (0, 1, 2)])
    e = t_mean([0.2 + 0.0004 * s for s in (0, 1, 2)], unit="seed")
    assert answer(spec, df) == (f"hmm.gamma: 0.9 - 0.5 = {value_ci(e.value, e.lo, e.hi, 'nats/token', signed=True)}, "
                                "3 seeds: excess CE (seen tasks) grows with gamma (supported)")
    lr = parse_spec(SPEC.replace("NAME", "lr").replace('"model.pos_enc" = {grid = ["rope", "absolute"]}\n', "")
                    .replace('"hmm.gamma" = {grid = [0.5, 0.9]}', '"train.lr" = {grid = [0.001, 0.003]}'))
    df = df.rename(columns={"param:hmm.gamma": "param:train.lr"}).replace({"param:train.lr": {0.5: 0.001, 0.9: 0.003}})
    assert answer(lr, df).startswith("Best of 2 settings on eval/seen/excess_ce (minimize; tuned: train.lr): "
                                     "train.lr = 0.001: 0.4")
