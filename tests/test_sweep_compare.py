"""The sweep parent run's comparison (hmmscope/sweep/compare.py): the objective figure and the pivot table are
logged to the parent run, and their numbers are the trials' own (checked against a direct computation)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from hmmscope import tracking
from hmmscope.sweep import create_study, run_sweep
from hmmscope.sweep.compare import log_comparison
from hmmscope.sweep.spec import load_spec

os.environ["HMMSCOPE_THREADS"] = "1"

POSENC_SPEC = """
[sweep]
name = "{name}"
objective = "eval/seen/excess_ce"
sampler = "grid"
seeds = {seeds}
experiment = "cmp"

[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"hmm.rank" = 2
"data.n_demos" = 2
"data.l_demo" = 8
"data.l_test" = 8
"data.n_train" = 48
"data.n_eval" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.d_model" = 32
"model.d_mlp" = 64
"model.max_len" = 64
"train.steps" = 10
"train.batch_size" = 8
"train.warmup" = 0
"train.eval_every" = 5
"train.ckpt_every" = 10
"train.device" = "cpu"
"train.figures" = false

[space]
"model.pos_enc" = {{grid = ["rope", "absolute"]}}
"hmm.gamma" = {{grid = [0.5, 0.9]}}
"""


def t_ci(values) -> tuple[float, float, float]:
    """mean and 95% t interval on n - 1 df, computed here from scratch."""
    x = np.asarray(values, float)
    m, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))
    q = st.t.ppf(0.975, len(x) - 1)
    return m, m - q * se, m + q * se


def pivot_of(uri: str, run_id: str) -> tuple[list[str], list[dict]]:
    run = tracking.existing_run(uri, run_id)
    p = run.download("comparison/pivot.json", Path(run.artifact_uri()[len("file://"):]).parent / "dl")
    table = json.loads(p.read_text())
    return table["columns"], [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]


def assert_logged(uri: str, run_id: str) -> None:
    """The parent run holds the figure, the pivot image and the pivot table (listed as an MLflow table)."""
    run = tracking.existing_run(uri, run_id)
    for name in ("comparison/objective.png", "comparison/objective.pdf", "comparison/pivot.png"):
        assert Path(run.require(name)).read_bytes()[:4] in (b"\x89PNG", b"%PDF"), name
    logged = json.loads(run.get().data.tags["mlflow.loggedArtifacts"])
    assert {"path": "comparison/pivot.json", "type": "table"} in logged


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, str, str]:
    """One Optuna and one MLflow store for this file's studies (creating an MLflow store costs seconds)."""
    tmp = tmp_path_factory.mktemp("compare")
    return tmp, f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"


def planted_study(stores, name: str, seeds: list[int]):
    """A real study of the pos_enc x gamma spec whose trials are finished with planted values (no training):
    value = 1 + 0.5 * [gamma 0.9] + 0.2 * [rope] * (1 + [gamma 0.9]) + seed noise + trial noise."""
    tmp, storage, uri = stores
    spec = load_spec(_write(tmp, POSENC_SPEC.format(name=name, seeds=seeds), name))
    study, parent, _ = create_study(spec, storage, uri)
    rng = np.random.default_rng(np.random.SeedSequence([7]))
    seed_shift = {s: rng.normal(0, 0.3) for s in seeds}
    for _ in range(spec.n_trials):
        t = study.ask({p.key: p.distribution() for p in spec.space})
        t.set_user_attr("mlflow_run_id", f"planted-{t.number}")  # a run id to read an oracle's value by
        hi, rope = t.params["hmm.gamma"] == 0.9, t.params["model.pos_enc"] == "rope"
        study.tell(t, 1 + 0.5 * hi + 0.2 * rope * (1 + hi) + seed_shift[t.user_attrs["seed"]] + rng.normal(0, 0.05))
    return spec, study, uri, parent


def _write(tmp: Path, text: str, name: str = "spec") -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(text)
    return p


def test_pivot_numbers_are_the_trials_own(stores):
    """rope / absolute means per gamma with t CIs over seeds, and rope - absolute per gamma (paired within seed)
    and pooled (each seed's mean over gammas of its paired differences), as computed here from the trials."""
    spec, study, uri, parent = planted_study(stores, "planted3", [0, 1, 2])
    cols = log_comparison(tracking.existing_run(uri, parent), spec, study)
    assert_logged(uri, parent)
    columns, rows = pivot_of(uri, parent)
    assert cols is not None and columns == list(cols)
    assert columns[:2] == ["factor", "level"] and [c for c in columns if c.endswith(" mean")] == ["rope mean",
                                                                                                  "absolute mean"]
    # the `all` row pools the paired difference within the gamma levels, never a mean over them (issue 46.1:
    # before, its rope and absolute means averaged gamma 0.5 and 0.9 together)
    assert [(r["factor"], r["level"]) for r in rows] == [("hmm.gamma", "0.5"), ("hmm.gamma", "0.9"),
                                                        ("all", "hmm.gamma")]
    val = {(t.params["model.pos_enc"], t.params["hmm.gamma"], t.user_attrs["seed"]): t.value for t in study.trials}
    seeds = [0, 1, 2]
    for r in rows:
        gammas = [0.5, 0.9] if r["factor"] == "all" else [float(r["level"])]
        for pe in ("rope", "absolute"):
            got = (r[f"{pe} mean"], r[f"{pe} ci_lo"], r[f"{pe} ci_hi"])
            if r["factor"] == "all":
                assert got == (None, None, None) and r[f"{pe} seeds"] == 0
                continue
            want = t_ci([np.mean([val[pe, g, s] for g in gammas]) for s in seeds])
            assert got == pytest.approx(want, rel=1e-9), (r["level"], pe)
            assert r[f"{pe} seeds"] == 3
        want = t_ci([np.mean([val["rope", g, s] - val["absolute", g, s] for g in gammas]) for s in seeds])
        assert (r["rope - absolute"], r["diff ci_lo"], r["diff ci_hi"]) == pytest.approx(want, rel=1e-9)
        assert r["diff df"] == 2 and r["diff units"] == "3 seed"
    # the planted effect: 0.2 at gamma 0.5, 0.4 at gamma 0.9, each CI excluding 0
    assert rows[0]["diff ci_lo"] > 0 and rows[1]["rope - absolute"] > rows[0]["rope - absolute"]
    # logged again (a resumed sweep): the same table, listed once
    log_comparison(tracking.existing_run(uri, parent), spec, study)
    assert pivot_of(uri, parent)[1] == rows
    logged = json.loads(tracking.existing_run(uri, parent).get().data.tags["mlflow.loggedArtifacts"])
    assert logged.count({"path": "comparison/pivot.json", "type": "table"}) == 1


def test_pivot_agrees_with_the_report_per_level_effects(stores):
    """The differences are the report's (its per-level rows and pooled verdict row): sweep.effects, which report.posenc
    uses too."""
    import pandas as pd

    from hmmscope.sweep.compare import OBJ, pivot, trial_frame
    from hmmscope.sweep.effects import choose_blocks, per_level_effects, pos_enc_effect

    spec, study, _, _ = planted_study(stores, "planted2", [0, 1])
    df = trial_frame(spec, study)
    cols = pivot(spec, df)
    blocks, _ = choose_blocks(df, OBJ, ["param:hmm.gamma"], "param:train.seed")
    assert blocks == ["param:hmm.gamma"]
    want = [e.value for _, _, e in per_level_effects(df, OBJ, blocks, "param:train.seed")]
    want.append(pos_enc_effect(df, OBJ, blocks, "param:train.seed").value)
    assert cols["rope - absolute"] == pytest.approx(want, rel=1e-12)
    assert isinstance(df, pd.DataFrame) and len(df) == 8


def test_objective_figure_names_its_units_and_draws_the_oracle(stores):
    """Before: objective.png had no units and no oracle. Now its y axis names the unit, an excess CE gets the
    mixture oracle's 0 as a dotted line, and a test accuracy the oracle's own accuracy per level, read from the
    trials' runs (`metrics_of`), also as the pivot's `oracle mean` column."""
    import dataclasses

    from hmmscope.sweep.compare import ORACLE, objective_figure, pivot, trial_frame

    spec, study, _, _ = planted_study(stores, "units", [0, 1])
    ax = objective_figure(spec, trial_frame(spec, study)).axes[0]
    assert ax.get_ylabel() == "eval/seen/excess_ce (nats/token)\nlower is better"  # the spec's direction
    assert [ln.get_label() for ln in ax.get_lines() if ln.get_linestyle() == ":"] == ["mixture oracle (excess_ce = 0)"]
    acc = dataclasses.replace(spec, objective="eval/seen/test_acc")
    df = trial_frame(acc, study, lambda rid: {"eval/seen/oracle_mix_test_acc": 0.5 + 0.01 * int(rid.split("-")[1])})
    assert ORACLE in df.columns and df[ORACLE].notna().all()
    ax = objective_figure(acc, df).axes[0]
    assert ax.get_ylabel() == "eval/seen/test_acc (fraction of test tokens)\nlower is better"  # minimized here
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("mixture oracle")]
    assert list(line.get_ydata()) == pytest.approx([df[df["param:hmm.gamma"] == g][ORACLE].mean() for g in (0.5, 0.9)])
    oracle = pivot(acc, df)["oracle mean"]
    assert oracle[:2] == pytest.approx([df[df["param:hmm.gamma"] == g][ORACLE].mean() for g in (0.5, 0.9)])
    assert oracle[-1] is None  # the `all` row: no mean over the gamma levels


def test_no_complete_trial_logs_nothing(stores):
    tmp, storage, uri = stores
    spec = load_spec(_write(tmp, POSENC_SPEC.format(name="empty", seeds=[0]), "empty"))
    study, parent, _ = create_study(spec, storage, uri)
    assert log_comparison(tracking.existing_run(uri, parent), spec, study) is None
    with pytest.raises(tracking.ArtifactNotFound):
        tracking.existing_run(uri, parent).require("comparison/pivot.json")


@pytest.mark.slow
def test_real_posenc_sweep_logs_its_comparison(tmp_path):
    """A real 8-trial training sweep (2 encodings x 2 gammas x 2 seeds; about 2 minutes on 2 busy cores): the
    parent run's pivot matches the trials' objective values. The fast twin: the theory sweep in test_sweep.py
    (test_grid_sweep_two_workers_end_to_end) and the planted studies above."""
    spec = load_spec(_write(tmp_path, POSENC_SPEC.format(name="real", seeds=[0, 1])))
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    s = run_sweep(spec, workers=2, storage=storage, uri=uri, log=lambda m: None)
    assert s.complete == 8
    assert_logged(uri, s.parent_run_id)
    _, rows = pivot_of(uri, s.parent_run_id)
    import optuna

    study = optuna.load_study(study_name="real", storage=storage)
    val = {(t.params["model.pos_enc"], t.params["hmm.gamma"], t.user_attrs["seed"]): t.value for t in study.trials}
    for r in rows:
        gammas = [0.5, 0.9] if r["factor"] == "all" else [float(r["level"])]
        want = t_ci([np.mean([val["rope", g, s] - val["absolute", g, s] for g in gammas]) for s in (0, 1)])
        assert (r["rope - absolute"], r["diff ci_lo"], r["diff ci_hi"]) == pytest.approx(want, rel=1e-9)
