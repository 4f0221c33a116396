"""hmmscope.sweep.studies and `hmmscope sweep list / export / delete`: real Optuna storages and a real sqlite MLflow
store, filled by tiny theory sweeps run in this process (no worker processes)."""

import csv
import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.config import ConfigError
from hmmscope.sweep import create_study, run_worker
from hmmscope.sweep.spec import load_spec
from hmmscope.sweep.studies import delete_study, export_rows, list_studies, study_runs

runner = CliRunner()

SPEC = """
[sweep]
name = "{name}"
kind = "theory"
sampler = "grid"
seeds = [0]
experiment = "sw"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = 200
"theory.burn_in" = 10
"theory.gamma_m" = 0

[space]
"theory.gammas" = {{grid = {gammas}}}
"theory.ranks" = {{grid = [2]}}
"""


def make_study(tmp: Path, name: str, gammas: str = "[0.5, 0.8]", run: int | None = None) -> str:
    """Create the study (trials WAITING) and run `run` of its trials here (None: all); returns the parent run id."""
    path = tmp / f"{name}.toml"
    path.write_text(SPEC.format(name=name, gammas=gammas))
    storage, uri = stores(tmp)
    _, parent, _ = create_study(load_spec(path), storage, uri)
    if run != 0:
        run_worker(name, storage, uri, max_trials=run, log=lambda m: None)
    return parent


def stores(tmp: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"


def all_runs(uri: str):
    from mlflow.entities import ViewType

    c = tracking.client(uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()], run_view_type=ViewType.ALL,
                         max_results=1000)


def below(runs, root: str) -> set[str]:
    """`root` and every run below it, by MLflow's parentRunId tags."""
    out, todo = set(), [root]
    while todo:
        rid = todo.pop()
        out.add(rid)
        todo += [r.info.run_id for r in runs if r.data.tags.get("mlflow.parentRunId") == rid]
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """One storage and one MLflow store (made once: each costs seconds) with two studies in one experiment:
    a (2 trials, both run) and b (1 trial, waiting). Other tests add studies of their own names."""
    import shutil

    tmp = tmp_path_factory.mktemp("studies")
    tracking.ensure_store(stores(tmp)[1])
    shutil.copy(tmp / "mlflow.db", tmp / "empty.db")  # a store without this sweep's runs
    return tmp, make_study(tmp, "a"), make_study(tmp, "b", gammas="[0.6]", run=0)


def test_list_studies_counts_trials_per_state(two):
    tmp, pa, pb = two
    rows = [r for r in list_studies(stores(tmp)[0]) if r["study"] in ("a", "b")]
    assert [(r["study"], r["kind"], r["trials"], r["complete"], r["waiting"], r["experiment"], r["parent_run"])
            for r in rows] == [("a", "theory", 2, 2, 0, "sw", pa), ("b", "theory", 1, 0, 1, "sw", pb)]


def test_export_rows_one_per_trial(two):
    tmp, pa, _ = two
    storage, uri = stores(tmp)
    rows = export_rows("a", storage)
    assert [r["number"] for r in rows] == [0, 1] and {r["state"] for r in rows} == {"COMPLETE"}
    assert sorted(r["param.theory.gammas"] for r in rows) == [0.5, 0.8] and {r["seed"] for r in rows} == {0}
    assert len({tuple(r) for r in rows}) == 1  # the same columns in every row
    for r in rows:  # the value is the objective its MLflow run logged; the run is a child of the sweep's parent
        run = tracking.get_run(uri, r["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == pa
        assert r["value"] == pytest.approx(run.data.metrics[tracking.objective_key("theory/rate")])
        assert r["attr.slot"] in (0, 1) and r["datetime_start"] < r["datetime_complete"]


def test_export_shows_a_waiting_trials_enqueued_params(two):
    rows = export_rows("b", stores(two[0])[0])
    assert [(r["state"], r["param.theory.gammas"], r["mlflow_run_id"], r["value"]) for r in rows] == [
        ("WAITING", 0.6, "", "")]


def test_delete_removes_the_study_and_exactly_its_runs(two):
    tmp, pa, pb = two
    pd = make_study(tmp, "d", gammas="[0.5]")  # same experiment and params as a's first trial
    storage, uri = stores(tmp)
    runs = all_runs(uri)
    mine, others = below(runs, pd), below(runs, pa) | below(runs, pb)
    assert len(mine) >= 2 and len(others) >= 4 and not mine & others  # parents, trial runs, runs below them
    names = [r["study"] for r in list_studies(storage)]
    found = study_runs("d", storage, uri)
    assert set(found.run_ids) == mine and found.run_ids[0] == pd and found.experiments == ("sw",)
    assert [r["study"] for r in list_studies(storage)] == names  # finding changed nothing
    assert all(r.info.lifecycle_stage == "active" for r in all_runs(uri))
    delete_study(found, storage, uri)
    assert [r["study"] for r in list_studies(storage)] == [n for n in names if n != "d"]
    stage = {r.info.run_id: r.info.lifecycle_stage for r in all_runs(uri)}
    assert {stage[r] for r in mine} == {"deleted"} and {stage[r] for r in others} == {"active"}


def test_study_runs_names_a_missing_parent_run(two):
    tmp = two[0]
    with pytest.raises(ConfigError, match="parent run .* is not in"):
        study_runs("a", stores(tmp)[0], f"sqlite:///{tmp}/empty.db")


# ---------------------------------------------------------------- the commands


def test_sweep_list_and_export_commands(two, tmp_path):
    tmp = two[0]
    storage, uri = stores(tmp)
    opts = ["--storage", storage]
    r = runner.invoke(app, ["sweep", "list", *opts], terminal_width=250)
    assert r.exit_code == 0, r.output
    assert "│ a " in r.output and "│ b " in r.output and " studies" in r.output
    r = runner.invoke(app, ["sweep", "export", "b", "--csv", *opts])  # no path: standard output
    assert r.exit_code == 0, r.output
    assert [(x["number"], x["state"], x["param.theory.gammas"]) for x in csv.DictReader(io.StringIO(r.stdout))] == [
        ("0", "WAITING", "0.6")]
    r = runner.invoke(app, ["sweep", "export", "a", "--csv", *opts])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["number"], x["state"]) for x in rows] == [("0", "COMPLETE"), ("1", "COMPLETE")]
    r = runner.invoke(app, ["sweep", "export", "a", "--csv", str(tmp_path / "out" / "t.csv"), *opts])
    assert r.exit_code == 0, r.output
    assert list(csv.DictReader((tmp_path / "out" / "t.csv").open())) == rows
    r = runner.invoke(app, ["sweep", "export", "nope", "--csv", str(tmp_path / "u.csv"), *opts])
    assert r.exit_code == 2 and "no sweep study 'nope'" in r.output and not (tmp_path / "u.csv").exists()


def test_sweep_delete_asks_and_a_refusal_changes_nothing(two):
    tmp = two[0]
    storage, uri = stores(tmp)
    opts = ["--storage", storage, "--tracking-uri", uri]
    pc = make_study(tmp, "c", gammas="[0.5]")
    before = {r.info.run_id: r.info.lifecycle_stage for r in all_runs(uri)}
    names = [x["study"] for x in list_studies(storage)]
    for answer in ("n\n", "\n", ""):  # no, the default, and no answer at all (end of input)
        r = runner.invoke(app, ["sweep", "delete", "c", *opts], input=answer)
        assert r.exit_code == 1, r.output
        assert "Delete study 'c' (1 trials)" in r.output and "MLflow run(s)" in r.output
        assert [x["study"] for x in list_studies(storage)] == names
        assert {r.info.run_id: r.info.lifecycle_stage for r in all_runs(uri)} == before
    mine = below(all_runs(uri), pc)
    r = runner.invoke(app, ["sweep", "delete", "c", *opts], input="y\n")
    assert r.exit_code == 0, r.output
    assert [x["study"] for x in list_studies(storage)] == [n for n in names if n != "c"]
    after = {r.info.run_id: r.info.lifecycle_stage for r in all_runs(uri)}
    assert {after[r] for r in mine} == {"deleted"} and {after[r] for r in before if r not in mine and before[r] == "active"} == {
        "active"}
    r = runner.invoke(app, ["sweep", "delete", "c", "--yes", *opts])
    assert r.exit_code == 2 and "no sweep study 'c'" in r.output


def test_sweep_delete_yes_does_not_ask(two):
    tmp = two[0]
    storage, uri = stores(tmp)
    make_study(tmp, "y", gammas="[0.5]", run=0)
    r = runner.invoke(app, ["sweep", "delete", "y", "--yes", "--storage", storage, "--tracking-uri", uri], input="")
    assert r.exit_code == 0 and "Delete" not in r.output and r.output.startswith("deleted study 'y'")
    assert "y" not in [x["study"] for x in list_studies(storage)]
