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


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("design")
    uri, storage = f"sqlite:///{tmp}/mlflow.db", f"sqlite:///{tmp}/optuna.db"
    _sweep(uri, storage, "with-spec", True)
    _sweep(uri, storage, "no-spec", False)
    return {name: (build_report(uri, name, tmp / name, storage=storage, log=False), tmp / name)
            for name in ("with-spec", "no-spec")}


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


def test_the_first_sentence_is_the_objectives_answer_with_its_sign_everywhere_the_same(reports):
    """Before: the answer began with test accuracy, and its sentence flipped the sign of the table ("RoPE lower ... by
    0.00607 [-0.221, 0.233]" beside -0.006065 [-0.2332, 0.2211]); pivot.png repeated the table above it. Now the first
    line is, in bold, the objective's RoPE - absolute with its unit, CI, seeds and verdict, the same signed numbers as
    the table, the claim and the figure's pooled point; the verdict lines are sentences with units and replicates,
    the objective's first; pivot.png is the parent run's alone."""
    from hmmscope.units import value_ci

    rep, out = reports["with-spec"]
    md = (out / "report.md").read_text()
    answer = _section(md, "## Answer")
    first = answer.split("\n\n")[1]
    c = next(c for c in rep.claims if c.name == "RoPE improves eval/seen/excess_ce")
    want = f"RoPE - absolute on eval/seen/excess_ce: {value_ci(c.value, c.ci_lo, c.ci_hi, 'nats/token')}, 3 seeds: RoPE better"
    assert first == f"**{want}**" and rep.answer == want and c.value < 0 and want.split(": ")[1].startswith("-0.0")
    pooled = next(ln for ln in answer.splitlines() if ln.startswith("| all (pooled)"))
    assert pooled.split("|")[-2].strip().startswith(f"{c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}]")  # same sign
    assert f"<p><strong>{want}</strong></p>" in (out / "report.html").read_text()
    items = [ln[2:] for ln in _section(answer, "### Verdicts in words").splitlines() if ln.startswith("- ")]
    assert items[0] == want and len(items) == len(rep.claims)
    assert all(("nats/token" in x or "fraction of test tokens" in x) and "3 seeds" in x for x in items), items
    assert "pivot.png" not in md and not (out / "pivot.png").exists() and "objective.png" in answer
    assert rep.summary_lines()[1] == f"answer: {want}"


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


def test_without_pos_enc_the_answer_is_the_best_setting():
    import pandas as pd

    from hmmscope.sweep.compare import OBJ, answer
    from hmmscope.sweep.spec import parse_spec

    spec = parse_spec(SPEC.replace("NAME", "g").replace('"model.pos_enc" = {grid = ["rope", "absolute"]}\n', ""))
    df = pd.DataFrame([{"param:hmm.gamma": g, "param:train.seed": s, OBJ: 0.2 + 0.5 * g + 0.01 * s}
                       for g in (0.5, 0.9) for s in (0, 1, 2)])
    assert answer(spec, df) == ("Best of 2 settings on eval/seen/excess_ce (minimize): hmm.gamma = 0.5: 0.4600 "
                                "[0.4352, 0.4848] nats/token, 3 seeds; next hmm.gamma = 0.9: 0.6600 [0.6352, 0.6848] "
                                "nats/token")
