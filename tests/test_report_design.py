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
    COMPLETE trials name their runs; with `with_spec`, the spec stored with the study (sweep.study._store_spec)."""
    import optuna

    from hmmscope.sweep.study import _store_spec
    from hmmscope.sweep_spec import parse_spec

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
        _store_spec(study, parse_spec(SPEC.replace("NAME", name), f"{name}.toml"))


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
