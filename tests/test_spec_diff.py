"""A sweep grows by seeds and grid levels (sweep.spec_diff, sweep.study): a finished sweep run with more seeds or more
levels keeps its trials and runs only the new cells; any other change is refused in one line naming the key that
differs, before anything is written or printed. Real Optuna storages and MLflow stores; trials run in this process
(theory trials of a few histories), except the CLI's."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.config import ConfigError
from hmmscope.sweep import create_study, run_worker, spec_of_study, study_status
from hmmscope.sweep.spec import load_spec, parse_spec
from hmmscope.sweep.spec_diff import compare, grid_kinds, refusal
from hmmscope.sweep.status import resume_plan

SPEC = """
[sweep]
name = "{name}"
kind = "theory"
sampler = "grid"
seeds = {seeds}
experiment = "sw"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = {nh}
"theory.burn_in" = 10
"theory.gamma_m" = 0
"theory.gammas" = [0.5]

[space]
"theory.ranks" = {{grid = {ranks}}}
"""


def spec_file(tmp: Path, name: str = "grow", seeds: str = "[0, 1]", ranks: str = "[2]", nh: int = 40) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(SPEC.format(name=name, seeds=seeds, ranks=ranks, nh=nh))
    return p


def spec(tmp: Path, **kw):
    return load_spec(spec_file(tmp, **kw))


def stores(tmp: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"


def cells(storage: str, name: str = "grow") -> Counter:
    """Trials per cell (rank, seed)."""
    return Counter((r["params"]["theory.ranks"], r["seed"]) for r in study_status(name, storage))


def trial_runs(uri: str, parent: str) -> list:
    return [r for r in tracking.search_runs(uri, "sw") if r.data.tags.get("mlflow.parentRunId") == parent]


# ---------------------------------------------------------------- the comparison itself


def test_more_seeds_and_more_grid_levels_grow_a_grid_sweep():
    base = SPEC.format(name="g", seeds="[0, 1]", ranks="[2]", nh=40)
    old = parse_spec(base, "g.toml")
    grown = parse_spec(base.replace("seeds = [0, 1]", "seeds = [0, 1, 2]").replace("grid = [2]", "grid = [2, 4]"),
                       "g.toml")
    assert grid_kinds(old) == {"theory.ranks": "int"}
    ch = compare(old, grown, grid_kinds(old))
    assert ch.grows == ("sweep.seeds: [0, 1] -> [0, 1, 2]", "space.theory.ranks: [2] -> [2, 4]") and not ch.other
    assert compare(old, old).same and not compare(old, grown).same


TRAIN = ('[sweep]\nname = "t"\n[fixed]\n"train.steps" = 5\n[space]\n"model.pos_enc" = {{grid = {pe}}}\n'
         '"hmm.gamma" = {{grid = {g}}}\n')


@pytest.mark.parametrize("pe, g, says", [
    ('["rope", "absolute"]', "[0.5]", "Optuna fixes a categorical parameter's levels"),  # a string axis
    ('["rope"]', "[0.5, 1]", "its levels are floats: it grows by floats"),  # 1 is an int: another kind
])
def test_a_level_optuna_cannot_record_in_the_study_is_refused_with_the_reason(pe, g, says):
    old = parse_spec(TRAIN.format(pe='["rope"]', g="[0.5]"), "t.toml")
    assert grid_kinds(old) == {"model.pos_enc": "categorical", "hmm.gamma": "float"}
    ch = compare(old, parse_spec(TRAIN.format(pe=pe, g=g), "t.toml"), grid_kinds(old))
    assert not ch.grows and len(ch.other) == 1 and says in ch.other[0], ch
    grown = compare(old, parse_spec(TRAIN.format(pe='["rope"]', g="[0.5, 0.9]"), "t.toml"), grid_kinds(old))
    assert grown.grows == ("space.hmm.gamma: [0.5] -> [0.5, 0.9]",) and not grown.other
    old_study = compare(old, parse_spec(TRAIN.format(pe='["rope"]', g="[0.5, 0.9]"), "t.toml"), {})
    assert not old_study.grows and "Optuna fixes" in old_study.other[0]  # a study from before GRID_KINDS


@pytest.mark.parametrize("edit, says", [
    (("seeds = [0, 1]", "seeds = [0, 2]"), "sweep.seeds: [0, 1] -> [0, 2]"),  # seed 1 dropped: not growth
    (("grid = [2]", "grid = [4]"), "space.theory.ranks: [2] -> [4]"),
    (('"theory.n_histories" = 40', '"theory.n_histories" = 60'), "fixed.theory.n_histories: 40 -> 60"),
    (('"theory.burn_in" = 10\n', ""), "fixed.theory.burn_in: 10 -> (none)"),
    (('sampler = "grid"', 'sampler = "random"\nn_trials = 2'), "sweep.sampler: \"grid\" -> \"random\""),
])
def test_any_other_change_is_named_key_by_key(edit, says):
    base = SPEC.format(name="g", seeds="[0, 1]", ranks="[2]", nh=40)
    ch = compare(parse_spec(base, "g.toml"), parse_spec(base.replace(*edit), "g.toml"))
    assert says in ch.other and says in refusal(ch), ch


def test_a_refusal_names_a_few_keys_and_counts_the_rest():
    base = SPEC.format(name="g", seeds="[0, 1]", ranks="[2]", nh=40).replace('kind = "theory"\n', "").split("[fixed]")[0]
    ch = compare(parse_spec(base, "g.toml"), parse_spec(base.replace('[sweep]\n', '[sweep]\nbase = "paper"\n'), "g.toml"))
    line = refusal(ch)
    assert line.count(" -> ") == 3 and line.startswith("base.") and f"and {len(ch.other) - 3} more" in line, line


# ---------------------------------------------------------------- studies that grow


def test_a_finished_two_seed_sweep_grows_to_three_seeds_without_rerunning_the_first_two(tmp_path):
    storage, uri = stores(tmp_path)
    _, parent, _ = create_study(spec(tmp_path), storage, uri)
    assert run_worker("grow", storage, uri, log=lambda m: None) == 2
    before = {r.info.run_id: (r.info.status, r.info.end_time) for r in trial_runs(uri, parent)}
    assert len(before) == 2
    three = spec(tmp_path, seeds="[0, 1, 2]")
    assert resume_plan(three, storage).line() == ("grows from 2 to 3 trials (sweep.seeds: [0, 1] -> [0, 1, 2]): 2 of 3 "
                                                  "already done")
    said: list[str] = []
    study, same_parent, created = create_study(three, storage, uri, log=said.append)
    assert not created and same_parent == parent
    assert said == ["sweep 'grow' grows: sweep.seeds: [0, 1] -> [0, 1, 2] (2 -> 3 trials; the trials it has are kept, "
                    "only the new cells run)"]
    assert cells(storage) == {(2, 0): 1, (2, 1): 1, (2, 2): 1}  # one new trial, for the new seed only
    stored = spec_of_study("grow", storage)
    assert stored.seeds == (0, 1, 2) and stored.hash == three.hash and stored.n_trials == 3
    assert run_worker("grow", storage, uri, log=lambda m: None) == 1  # only the new cell runs
    runs = trial_runs(uri, parent)
    per_seed = Counter(r.data.params["theory.seed"] for r in runs)
    assert per_seed == {"0": 1, "1": 1, "2": 1}, per_seed  # one MLflow run per cell: the first two never re-ran
    assert {r.info.run_id: (r.info.status, r.info.end_time) for r in runs if r.info.run_id in before} == before
    assert [r["state"] for r in study_status("grow", storage)] == ["COMPLETE"] * 3
    # the parent run says it grew (its params stay as created: MLflow writes a param once)
    p = tracking.get_run(uri, parent)
    assert p.data.tags["hmmscope.grown"] == "sweep.seeds: [0, 1] -> [0, 1, 2]"
    assert p.data.tags["hmmscope.spec_hash"] == three.hash and "seeds 0, 1, 2" in p.data.tags["mlflow.note.content"]
    # and a level more on the grid axis: its cells for every seed, nothing else (a worker runs them:
    # test_a_running_worker_reads_the_grown_spec_for_a_new_level)
    wider = spec(tmp_path, seeds="[0, 1, 2]", ranks="[2, 4]")
    assert resume_plan(wider, storage).line() == ("grows from 3 to 6 trials (space.theory.ranks: [2] -> [2, 4]): 3 of 6 "
                                                  "already done")
    create_study(wider, storage, uri)
    assert cells(storage) == {(2, 0): 1, (2, 1): 1, (2, 2): 1, (4, 0): 1, (4, 1): 1, (4, 2): 1}
    assert resume_plan(wider, storage).line() == "3 of 6 already done"
    create_study(wider, storage, uri)  # the same spec again: nothing more
    assert sum(cells(storage).values()) == 6
    assert tracking.get_run(uri, parent).data.tags["hmmscope.grown"] == ("sweep.seeds: [0, 1] -> [0, 1, 2]; "
                                                                         "space.theory.ranks: [2] -> [2, 4]")


def test_other_changes_are_refused_and_write_nothing(tmp_path):
    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path), storage, uri)
    other = spec(tmp_path, seeds="[0, 1, 2]", nh=60)  # growth together with a change that is not: refused whole
    for fn in (lambda: resume_plan(other, storage), lambda: create_study(other, storage, uri)):
        with pytest.raises(ConfigError) as e:
            fn()
        msg = str(e.value)
        assert "\n" not in msg and "fixed.theory.n_histories: 40 -> 60" in msg and "rename the sweep" in msg, msg
        assert "sweep.seeds" not in msg  # only what does not grow it is named
    assert sum(cells(storage).values()) == 2 and spec_of_study("grow", storage).seeds == (0, 1)


def test_a_growth_cut_short_gets_its_cells_on_resume(tmp_path):
    """The grown spec stored, the process gone before its cells were enqueued: the next run enqueues them."""
    from hmmscope.sweep.study import load_study, store_spec

    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path), storage, uri)
    three = spec(tmp_path, seeds="[0, 1, 2]")
    store_spec(load_study("grow", storage), three)  # the first write of a growth, and nothing after it
    assert sum(cells(storage).values()) == 2
    create_study(three, storage, uri)
    assert cells(storage) == {(2, 0): 1, (2, 1): 1, (2, 2): 1}


def test_two_processes_growing_a_study_at_once_enqueue_each_cell_once(tmp_path):
    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path), storage, uri)
    grown = spec(tmp_path, seeds="[0, 1, 2, 3]", ranks="[2, 4]")
    errors: list[BaseException] = []

    def grow() -> None:
        try:
            create_study(grown, storage, uri)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=grow) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert cells(storage) == {(r, s): 1 for r in (2, 4) for s in range(4)}


def test_a_running_worker_reads_the_grown_spec_for_a_new_level(tmp_path, monkeypatch):
    """A worker that started before the sweep grew claims a trial of the new level: it reads the spec again (before:
    its old grid had no such level, and suggest_categorical failed the trial)."""
    from hmmscope.sweep import worker

    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path, seeds="[0]"), storage, uri)
    wider = spec(tmp_path, seeds="[0]", ranks="[2, 4]")
    real = worker.run_trial

    def then_grow(trial, *a, **k):
        value = real(trial, *a, **k)
        if trial.number == 0:
            create_study(wider, storage, uri)  # the sweep grows while this worker runs
        return value

    monkeypatch.setattr(worker, "run_trial", then_grow)
    assert run_worker("grow", storage, uri, log=lambda m: None) == 2
    rows = study_status("grow", storage)
    assert [(r["params"]["theory.ranks"], r["state"]) for r in rows] == [(2, "COMPLETE"), (4, "COMPLETE")], \
        [r["reason"] for r in rows]


# ---------------------------------------------------------------- the command line


def test_sweep_run_refuses_a_change_in_one_line_before_it_prints_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path), storage, uri)
    spec_file(tmp_path, nh=60)
    r = CliRunner().invoke(app, ["sweep", "run", "grow.toml", "--storage", storage, "--tracking-uri", uri])
    assert r.exit_code == 2 and r.stdout == "", r.output  # before: a browse: line first
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: ") and "fixed.theory.n_histories: 40 -> 60" in line, line


def test_sweep_run_says_first_how_much_is_done(tmp_path, monkeypatch, capsys):
    """A resumed sweep's first line says how much of it is done (then where to look); a new one's, where to look."""
    import signal

    from optuna.trial import TrialState

    from hmmscope.sweep import TrialStore, load_study
    from hmmscope.sweep import main as worker_main

    monkeypatch.chdir(tmp_path)
    storage, uri = stores(tmp_path)
    create_study(spec(tmp_path, seeds="[0, 1]"), storage, uri)
    assert resume_plan(spec(tmp_path, name="new"), storage).line() == ""
    assert resume_plan(spec(tmp_path), storage).line() == "0 of 2 already done"
    store = TrialStore.of(load_study("grow", storage), storage)
    store.finish(store.claim(), TrialState.COMPLETE, 0.5)  # a trial done, as a worker records it
    assert resume_plan(spec(tmp_path), storage).line() == "1 of 2 already done"
    store.finish(store.claim(), TrialState.FAIL, attrs={"fail_reason": "boom"})
    assert resume_plan(spec(tmp_path), storage).line() == ("1 of 2 already done (1 failed: --retry-failed runs it "
                                                           "again)")
    spec_file(tmp_path, seeds="[0]")  # a sweep whose one trial is done: run again, it says so and runs nothing
    create_study(spec(tmp_path, name="one", seeds="[0]"), storage, uri)
    with monkeypatch.context() as m:
        m.setattr(signal, "signal", lambda *a: None)  # the worker's own SIGTERM handler: not in this process
        assert worker_main(["worker", "--study", "one", "--storage", storage, "--uri", uri]) == 0
    assert capsys.readouterr().err.endswith(": ran 1 trial\n")  # before: "ran 1 trials"
    spec_file(tmp_path, name="one", seeds="[0]")
    r = CliRunner().invoke(app, ["sweep", "run", "one.toml", "--storage", storage, "--tracking-uri", uri, "--no-report"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].startswith("sweep one: 1 of 1 already done; browse: hmmscope ui --sweep one"), r.stdout
    assert "already complete" in r.stdout
