"""Sweeps: spec validation, grid studies with worker processes, heartbeat retry, divergence, pruning, PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pg_server import postgres_server

from hmmscope import tracking
from hmmscope.config import ConfigError
from hmmscope.sweep import (
    create_study,
    default_storage,
    make_prune_hook,
    run_sweep,
    run_worker,
    study_status,
    worker_command,
    worker_env,
)
from hmmscope.sweep.spec import SweepSpec, load_spec

torch.set_num_threads(1)
os.environ["HMMSCOPE_THREADS"] = "1"
ROOT = Path(__file__).resolve().parents[1]

THEORY_SPEC = """
[sweep]
name = "{name}"
kind = "theory"
sampler = "grid"
seeds = {seeds}
heartbeat_interval = 1
grace_period = 3
experiment = "sw"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = {nh}
"theory.burn_in" = 10

[space]
"theory.gammas" = {{grid = [0.5, 0.8]}}
"theory.ranks" = {{grid = {ranks}}}
"""

TRAIN_FIXED = """
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
"train.min_lr" = 1e-9
"train.grad_clip" = 1e30
"train.emergence_episodes" = 0
"train.figures" = false
"eval.family_tasks" = 0
"""


def write(tmp: Path, text: str, name: str = "spec.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def theory_spec(tmp: Path, name: str = "th", seeds: str = "[0]", ranks: str = "[2, 4]", nh: int = 200) -> SweepSpec:
    return load_spec(write(tmp, THEORY_SPEC.format(name=name, seeds=seeds, ranks=ranks, nh=nh), f"{name}.toml"))


def stores(tmp: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"


def runs(uri: str, experiment: str = "sw"):
    c = tracking.client(uri)
    return c.search_runs([tracking.experiment_id(uri, experiment)], max_results=1000)


# ---------------------------------------------------------------- specs


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_specs_load(path):
    spec = load_spec(path)
    assert spec.name == path.stem and spec.sampler == "grid"
    pts = spec.grid_points()
    assert len(pts) == spec.n_trials == len({tuple(sorted(p.items())) for p in pts})
    for pt in pts:  # every trial config is valid; replicate seeds land in the config
        cfg = spec.trial_config(pt)
        if spec.kind == "train":
            assert cfg.train.seed == cfg.data.seed == pt["seed"]
        elif spec.kind == "headroom":  # its replicates draw new unseen, fit and family tasks (data.seed)
            assert cfg.data.seed == pt["seed"]
        else:
            assert cfg.theory.seed == pt["seed"]


def test_shipped_spec_contents():
    assert load_spec(ROOT / "sweeps/smoke.toml").n_trials == 4
    assert load_spec(ROOT / "sweeps/theory-gamma.toml").kind == "theory"
    assert load_spec(ROOT / "sweeps/rope-vs-absolute.toml").seeds == (0, 1, 2)
    ctx = load_spec(ROOT / "sweeps/context-length.toml")
    assert [p.grid for p in ctx.space if p.key == "model.window"] == [(4, 8, 16, 32)]
    assert ctx.base.data.test_start == "initial" and ctx.trial_config(ctx.grid_points()[0]).data.burn_in == 100
    assert load_spec(ROOT / "sweeps/paper.toml").base.model.d_model == 1024


GOOD = ('[sweep]\nname = "x"\nsampler = "{sampler}"\n{extra}\n[fixed]\n"train.steps" = 5\n"train.min_lr" = 1e-6\n'
        '[space]\n{space}\n')
BAD = [
    ('[sweep]\nname="x"\nbogus=1\n', "sweep.bogus"),
    ('[sweep]\nname="x"\n[extra]\na=1\n', "extra"),
    ('[sweep]\nname="x"\n[fixed]\n"train.nope"=1\n', "fixed.train.nope"),
    ('[sweep]\nname="x"\n[space]\n"model.nope"={grid=[1,2]}\n', "space.model.nope"),
    ('[sweep]\nname="x"\n[space]\n"model.pos_enc"={grid=[]}\n', "space.model.pos_enc"),
    ('[sweep]\nname="x"\n[space]\n"model.pos_enc"={grid=["rope","bogus"]}\n', "space.model.pos_enc"),
    ('[sweep]\nname="x"\n[space]\n"hmm.gamma"={grid=[0.5], typo=1}\n', "space.hmm.gamma.typo"),
    ('[sweep]\nname="x"\nsampler="tpe"\nn_trials=3\n[space]\n"train.lr"={low=1e-2, high=1e-4}\n', "space.train.lr"),
    ('[sweep]\nname="x"\nsampler="tpe"\nn_trials=3\n[space]\n"train.lr"={low=0.0, high=1e-2, log=true}\n',
     "space.train.lr"),
    ('[sweep]\nname="x"\n[space]\n"train.lr"={low=1e-4, high=1e-2}\n', "space.train.lr"),  # grid + distribution
    ('[sweep]\nname="x"\nsampler="bayes"\n', "sweep.sampler"),
    ('[sweep]\nname="x"\npruner="hyperband"\n', "sweep.pruner"),
    ('[sweep]\nname="x"\ndirection="down"\n', "sweep.direction"),
    ('[sweep]\nname="x"\nkind="eval"\n', "sweep.kind"),
    ('[sweep]\nname="x"\nsampler="tpe"\n', "sweep.n_trials"),
    ('[sweep]\nname="x"\nbase="huge"\n', "sweep.base"),
    ('[sweep]\nname="x"\nseeds=[]\n', "sweep.seeds"),
    ('[sweep]\nname="x"\nkind="theory"\n[space]\n"hmm.gamma"={grid=[0.5]}\n', "space.hmm.gamma"),
    ('[sweep]\nname="x"\n[space]\n"hmm.rank"={grid=[4, 64]}\n', "space"),  # rank > n_states at one grid point
    ('[sweep]\nname="x"\n[space]\n"train.steps"={grid=[1.5]}\n', "space.train.steps"),  # type error
]


@pytest.mark.parametrize("text,key", BAD, ids=[k for _, k in BAD])
def test_malformed_spec_names_file_and_key_and_creates_nothing(tmp_path, monkeypatch, text, key, project):
    p = write(tmp_path, text, "bad-spec.toml")
    with pytest.raises(ConfigError) as ei:
        run_sweep(load_spec(p), workers=1)
    msg = str(ei.value)
    assert "\n" not in msg and "bad-spec.toml" in msg and key in msg, msg
    assert not (tmp_path / "mlruns").exists()


def test_distributions_for_tpe(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.format(sampler="tpe", extra="n_trials = 5", space=(
        '"train.lr" = {low = 1e-4, high = 1e-2, log = true}\n"model.n_layers" = {choices = [1, 2]}\n'
        '"train.batch_size" = {low = 4, high = 16, step = 4}\n'))))
    d = {p.key: p.distribution() for p in spec.space}
    assert type(d["train.lr"]).__name__ == "FloatDistribution" and d["train.lr"].log
    assert type(d["train.batch_size"]).__name__ == "IntDistribution" and d["train.batch_size"].step == 4
    assert type(d["model.n_layers"]).__name__ == "CategoricalDistribution"
    assert spec.n_trials == 5


def test_prune_hook_reports_and_raises():
    import optuna

    class FakeTrial:
        def __init__(self, prune):
            self.reported, self.prune = [], prune

        def report(self, v, step):
            self.reported.append((step, v))

        def should_prune(self):
            return self.prune

    t = FakeTrial(False)
    hook = make_prune_hook(t, "eval/seen/excess_ce")
    hook(5, {"eval/seen/excess_ce": 0.3, "eval/loss": 1.0})
    hook(6, {"eval/loss": 1.0})  # objective absent: nothing reported
    assert t.reported == [(5, 0.3)]
    with pytest.raises(optuna.TrialPruned):
        make_prune_hook(FakeTrial(True), "eval/seen/excess_ce")(10, {"eval/seen/excess_ce": 9.0})


# ---------------------------------------------------------------- studies


def test_grid_sweep_two_workers_end_to_end(tmp_path):
    spec = theory_spec(tmp_path, seeds="[0, 1]")
    storage, uri = stores(tmp_path)
    s = run_sweep(spec, workers=2, storage=storage, uri=uri, log=lambda m: None, gpus=["3", "5"])
    assert (s.complete, s.failed, s.pruned, s.n_trials) == (8, 0, 0, 8) and s.worker_returncodes == [0, 0]
    rows = study_status("th", storage)
    gpu_of = {r["worker"]["pid"]: r["worker"]["gpu"] for r in rows}  # each worker got its own GPU (round-robin)
    assert set(gpu_of.values()) <= {"3", "5"} and len(set(gpu_of.values())) == len(gpu_of)
    assert sorted((r["params"]["theory.gammas"], r["params"]["theory.ranks"], r["params"]["seed"])
                  for r in rows if r["state"] == "COMPLETE") == sorted(
        (g, r, sd) for g in (0.5, 0.8) for r in (2, 4) for sd in (0, 1))
    assert len(rows) == 8
    all_runs = runs(uri)
    (parent,) = [r for r in all_runs if r.data.tags.get("hmmscope.kind") == "sweep"]
    assert parent.info.run_id == s.parent_run_id and parent.info.status == "FINISHED"
    assert parent.data.metrics["sweep/complete"] == 8
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == s.parent_run_id]
    assert len(children) == 8 and {r.info.run_id for r in children} == {r["mlflow_run_id"] for r in rows}
    assert len({frozenset(r.data.params) for r in children}) == 1  # same param names side by side
    assert {r.data.tags["hmmscope.trial"] for r in children} == {str(r["number"]) for r in rows}
    assert all(r.data.tags["hmmscope.study"] == "th" and "theory/rate" in r.data.metrics for r in children)
    assert {r.data.params["theory.seed"] for r in children} == {"0", "1"}
    # the parent run's comparison (test_sweep_compare.py): one line (no pos_enc), a pivot row per swept level, means
    # over seeds (each seed: the mean of its trials at that level) with t CIs, as computed here from the trials
    from test_sweep_compare import assert_logged, pivot_of, t_ci

    assert_logged(uri, s.parent_run_id)
    _, pivot = pivot_of(uri, s.parent_run_id)
    # no `all` row: it would average over the gamma and rank levels (issue 46.1)
    assert [(r["factor"], r["level"]) for r in pivot] == [("theory.gammas", "0.5"), ("theory.gammas", "0.8"),
                                                         ("theory.ranks", "2"), ("theory.ranks", "4")]
    val = {(r["params"]["theory.gammas"], r["params"]["theory.ranks"], r["seed"]): r["value"] for r in rows}
    for r, (gs, ks) in zip(pivot, [([0.5], [2, 4]), ([0.8], [2, 4]), ([0.5, 0.8], [2]), ([0.5, 0.8], [4])]):
        want = t_ci([sum(val[g, k, sd] for g in gs for k in ks) / (len(gs) * len(ks)) for sd in (0, 1)])
        assert (r["all trials mean"], r["all trials ci_lo"], r["all trials ci_hi"]) == pytest.approx(want, rel=1e-9)
    # the replicate seed is no hyperparameter: optuna-dashboard's importances rank the swept keys only
    import optuna

    study = optuna.load_study(study_name="th", storage=storage)
    assert study.metric_names == ["theory/rate"]
    assert set(optuna.importance.get_param_importances(study)) == {"theory.gammas", "theory.ranks"}
    # the parent was live: each trial's worker brought its counts, best trial and comparison up to date as the
    # trial ended (step k: once k trials had finished; one step per trial, never one key twice at a step), not
    # only at the sweep's end; the last step holds the final counts; its trials' view is MLflow's shared view
    c = tracking.client(uri)
    hist = c.get_metric_history(s.parent_run_id, "sweep/complete")
    assert sorted((m.step, m.value) for m in hist) == [(k, k) for k in range(1, 9)], [(m.step, m.value) for m in hist]
    best = c.get_metric_history(s.parent_run_id, "sweep/best_value")
    assert sorted(m.step for m in best) == list(range(1, 9))
    assert min(hist, key=lambda m: m.timestamp).timestamp < max(hist, key=lambda m: m.timestamp).timestamp
    view = c.get_experiment(parent.info.experiment_id).tags["mlflow.sharedViewState.hmmscope-sweep-th"]
    assert "metrics.`theory/rate`" in view and "params.`theory.gammas`" in view and "Objective/" not in view
    # re-running a finished sweep adds nothing
    msgs: list[str] = []
    s2 = run_sweep(spec, workers=2, storage=storage, uri=uri, log=msgs.append)
    assert s2.already_complete and s2.complete == 8 and "complete" in msgs[0]
    assert any("comparison figure and pivot table logged" in m for m in msgs)  # refreshed on the re-run
    assert len(study_status("th", storage)) == 8 and len(runs(uri)) == len(all_runs)
    # the same name with a different spec is refused
    other = theory_spec(tmp_path, ranks="[2]")
    with pytest.raises(ConfigError, match="different spec"):
        create_study(other, storage, uri)


@pytest.mark.parametrize("every, final, draws", [(30.0, True, 1), (0.0, True, 2), (30.0, False, 0)],
                         ids=["interval", "every-trial", "left-to-run-sweep"])
def test_a_worker_redraws_the_comparison_at_most_every_interval_and_when_it_stops(tmp_path, monkeypatch, every, final,
                                                                                   draws):
    """The comparison figure and table grow with the sweep: a worker redraws them once COMPARISON_EVERY_S has passed
    since its last draw, and when it stops (before: after each of its trials, 2 draws here), unless run_sweep started
    it (it draws them at its end). The counts and the best trial stay live: one step per trial."""
    from hmmscope.sweep import compare, worker
    from hmmscope.sweep import parent as parent_run

    spec = theory_spec(tmp_path, name="cmp", ranks="[2]", nh=50)
    storage, uri = stores(tmp_path)
    _, parent, _ = create_study(spec, storage, uri)
    calls: list[str] = []
    real = compare.log_comparison
    monkeypatch.setattr(parent_run, "log_comparison", lambda run, *a, **k: calls.append(run.run_id) or real(run, *a, **k))
    monkeypatch.setattr(worker, "COMPARISON_EVERY_S", every)
    assert run_worker("cmp", storage, uri, log=lambda m: None, final_comparison=final) == 2
    assert calls == [parent] * draws
    arts = {a.path for a in tracking.client(uri).list_artifacts(parent, "comparison")}
    assert ("comparison/objective.png" in arts) == (draws > 0)
    hist = tracking.client(uri).get_metric_history(parent, "sweep/complete")
    assert sorted((m.step, m.value) for m in hist) == [(1, 1), (2, 2)]


def test_killed_worker_trial_is_retried_with_same_params(tmp_path):
    spec = theory_spec(tmp_path, name="kill", nh=400)
    storage, uri = stores(tmp_path)
    study, parent, created = create_study(spec, storage, uri)
    assert created
    proc = subprocess.Popen(worker_command("kill", storage, uri), env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300  # generous: loaded CI machines
        while True:
            running = [r for r in study_status("kill", storage) if r["state"] == "RUNNING"]
            if running:
                break
            assert proc.poll() is None and time.time() < deadline, "worker never started a trial"
            time.sleep(0.1)
        assert proc.poll() is None  # a claimed trial has beaten once already (claim() beats before RUNNING)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    # the trial the kill hit: the one still RUNNING now (the one seen may have ended before the signal came)
    (killed,) = [r for r in study_status("kill", storage) if r["state"] == "RUNNING"]
    assert run_worker("kill", storage, uri, log=lambda m: None) >= 4
    rows = study_status("kill", storage)
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    assert len(complete) == 4 and len(rows) == 5
    assert sorted((r["params"]["theory.gammas"], r["params"]["theory.ranks"]) for r in complete) == [
        (0.5, 2), (0.5, 4), (0.8, 2), (0.8, 4)]
    (failed,) = [r for r in rows if r["state"] == "FAIL"]
    assert failed["number"] == killed["number"]
    (retry,) = [r for r in rows if r["retried_from"] is not None]
    assert retry["retried_from"] == killed["number"] and retry["state"] == "COMPLETE"
    assert retry["params"] == failed["params"]


def _train_study(tmp_path, name, space, extra=""):
    text = f'[sweep]\nname = "{name}"\nexperiment = "sw"\nsampler = "grid"\n{extra}\n{TRAIN_FIXED}\n[space]\n{space}\n'
    spec = load_spec(write(tmp_path, text, f"{name}.toml"))
    storage, uri = stores(tmp_path)
    create_study(spec, storage, uri)
    return spec, storage, uri


def test_divergence_fails_the_trial_and_the_sweep_continues(tmp_path):
    spec, storage, uri = _train_study(tmp_path, "div", '"train.lr" = {grid = [1e6, 3e-3]}')
    assert run_worker("div", storage, uri, log=lambda m: None) == 2
    rows = {r["params"]["train.lr"]: r for r in study_status("div", storage)}
    assert rows[1e6]["state"] == "FAIL" and "DivergedError" in rows[1e6]["reason"]
    assert rows[3e-3]["state"] == "COMPLETE" and rows[3e-3]["value"] is not None
    by_trial = {r.data.tags.get("hmmscope.trial"): r for r in runs(uri)}
    ok = by_trial[str(rows[3e-3]["number"])]
    assert ok.info.status == "FINISHED" and "eval/seen/kl_mix" in ok.data.metrics  # Figure 1 metrics logged
    assert ok.info.run_name == "lr0.003-s0" and ok.data.metrics["eval/seen/excess_ce"] == rows[3e-3]["value"]
    bad = by_trial[str(rows[1e6]["number"])]
    assert bad.info.run_name == "lr1e+06-s0"
    assert bad.info.status == "FAILED" and "DivergedError" in bad.data.tags["hmmscope.failure_reason"]


@pytest.mark.parametrize("where", ["log_params", "link"])
def test_a_run_cut_off_before_it_was_noted_is_settled_by_its_worker(tmp_path, monkeypatch, where):
    """CI (netns, a cut link): a trial's run stayed RUNNING after its worker came back. The store was cut off just
    after the run was created, before the worker had noted it (its first writes, or the trial's link to it,
    failed), and the run's own end could not be written either. Now the worker also finds the trial's runs that
    carry its own lease in the store, and ends them FAILED with the reason once the store answers."""
    from hmmscope.sweep import trial as trial_mod
    from hmmscope.tracking import runs as runs_mod

    spec, storage, uri = _train_study(tmp_path, f"cut{where}", '"hmm.gamma" = {grid = [0.7]}')
    out, dropped = [], []  # out: the store is out of reach; dropped: the run's own failure reasons not written
    from mlflow.tracking import MlflowClient

    real_tag, real_params, real_link = MlflowClient.set_tag, runs_mod.Run.log_params, trial_mod._link

    def set_tag(self, run_id, key, value, *args, **kwargs):  # the run's end writes its reason first (end_run)
        if out and key == "hmmscope.failure_reason":
            dropped.append(value)
            raise ConnectionError("store out of reach")
        return real_tag(self, run_id, key, value, *args, **kwargs)

    def log_params(self, params):
        if where == "log_params" and not out:
            out.append(1)
            raise ConnectionError("store out of reach")
        return real_params(self, params)

    def link(trial, uri_, run_id, **kw):
        if where == "link" and not out:
            out.append(1)
            raise ConnectionError("storage out of reach")
        return real_link(trial, uri_, run_id, **kw)

    from hmmscope.sweep import protocol
    real_finish = protocol.TrialStore.finish

    def finish(self, *a, **kw):  # the store answers again by the time the worker records the trial
        out.clear()
        return real_finish(self, *a, **kw)

    monkeypatch.setattr(protocol.TrialStore, "finish", finish)
    monkeypatch.setattr(MlflowClient, "set_tag", set_tag)
    monkeypatch.setattr(runs_mod.Run, "log_params", log_params)
    monkeypatch.setattr(trial_mod, "_link", link)
    log: list[str] = []
    assert run_worker(f"cut{where}", storage, uri, log=log.append) == 1
    (row,) = study_status(f"cut{where}", storage)
    assert row["state"] == "FAIL" and "out of reach" in row["reason"], row
    (run,) = [r for r in runs(uri) if r.data.tags.get("hmmscope.trial") == str(row["number"])]
    assert len(dropped) == 5  # its own end: 5 tries, each refused (the run left RUNNING by start_run)
    assert run.info.status == "FAILED", log
    assert "out of reach" in run.data.tags["hmmscope.failure_reason"]
    assert any(f"its run {run.info.run_id} ended FAILED" in m for m in log), log


def test_a_run_created_twice_leaves_no_second_run_open(tmp_path, monkeypatch):
    """MLflow's client retries a POST whose reply was lost (allowed_methods=None): the server may then hold two
    runs of one create, the first unknown to the worker, RUNNING under its lease. The worker ends it FAILED
    (naming the run that holds the trial's result) once its trial completes."""
    from mlflow.tracking import MlflowClient

    spec, storage, uri = _train_study(tmp_path, "twice", '"hmm.gamma" = {grid = [0.7]}')
    real, lost = MlflowClient.create_run, []

    def create_run(self, experiment_id, *a, **kw):
        if not lost and "hmmscope.trial" in (kw.get("tags") or {}):
            lost.append(real(self, experiment_id, *a, **kw).info.run_id)  # created, its reply never arrived
        return real(self, experiment_id, *a, **kw)

    monkeypatch.setattr(MlflowClient, "create_run", create_run)
    log: list[str] = []
    assert run_worker("twice", storage, uri, log=log.append) == 1
    (row,) = study_status("twice", storage)
    assert row["state"] == "COMPLETE"
    by_id = {r.info.run_id: r for r in runs(uri) if r.data.tags.get("hmmscope.trial") == str(row["number"])}
    assert len(by_id) == 2 and by_id[row["mlflow_run_id"]].info.status == "FINISHED"
    first = by_id[lost[0]]
    assert first.info.status == "FAILED", log
    assert first.data.tags["hmmscope.failure_reason"] == (
        f"a second run of trial {row['number']}, left open; its result is in run {row['mlflow_run_id']}")


def test_a_trials_run_ends_after_its_evaluation_and_its_objective(tmp_path):
    """Before: a trial's training run ended when training stopped, and its Figure 1 evaluation and objective were
    written afterwards (the UI showed 22 s for a trial that took 35 s). Now the run is reopened for them: its
    end time comes after every metric it holds; the trial is linked to the run from its start."""
    spec, storage, uri = _train_study(tmp_path, "dur", '"hmm.gamma" = {grid = [0.7]}')
    assert run_worker("dur", storage, uri, log=lambda m: None) == 1
    (row,) = study_status("dur", storage)
    (run,) = [r for r in runs(uri) if r.data.tags.get("hmmscope.trial") == str(row["number"])]
    assert run.info.run_id == row["mlflow_run_id"] and run.info.status == "FINISHED"
    c = tracking.client(uri)
    last = {k: max(m.timestamp for m in c.get_metric_history(run.info.run_id, k))
            for k in ("train/loss", "eval/seen/excess_ce")}
    assert last["train/loss"] <= last["eval/seen/excess_ce"] <= run.info.end_time
    assert run.data.tags["hmmscope.kind"] == "sweep-train"  # the trial's kind, not overwritten by train's default


def test_a_running_trial_shows_its_run_and_status_only_reads(tmp_path):
    """Before: a RUNNING trial showed run id None although its run existed, and `sweep status` marked orphan runs
    KILLED. Now the trial links its run as soon as the run is open; status prints one column per swept param,
    4 significant digits and whole run ids, lists an orphan RUNNING run on stderr and leaves it RUNNING (`runs gc`
    marks it)."""
    from typer.testing import CliRunner

    from hmmscope.cli import app

    fixed = TRAIN_FIXED.replace('"train.steps" = 10', '"train.steps" = 100000').replace(
        '"train.eval_every" = 5', '"train.eval_every" = 100000').replace('"train.ckpt_every" = 10', '"train.ckpt_every" = 100000')
    spec = load_spec(write(tmp_path, f'[sweep]\nname = "live"\nexperiment = "sw"\n{fixed}\n[space]\n'
                                     f'"hmm.gamma" = {{grid = [0.7]}}\n', "live.toml"))
    storage, uri = stores(tmp_path)
    create_study(spec, storage, uri)
    proc = subprocess.Popen(worker_command("live", storage, uri), env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[dict] = []

    def training():  # RUNNING, linked to its run, which is still training (no final train/wall_time_s yet)
        for r in study_status("live", storage):
            run = tracking.get_run(uri, r["mlflow_run_id"]) if r["mlflow_run_id"] else None
            if r["state"] == "RUNNING" and run is not None and run.info.status == "RUNNING" and \
                    "train/loss" in run.data.metrics and "train/wall_time_s" not in run.data.metrics:
                seen[:] = [r]
        return seen

    _kill_when(proc, training, "a training trial linked to its run")
    rid = seen[0]["mlflow_run_id"]
    runner = CliRunner()
    r = runner.invoke(app, ["sweep", "status", "live", "--storage", storage, "--tracking-uri", uri])
    assert r.exit_code == 0, r.output
    head, rule, row = r.stdout.splitlines()[:3]
    assert head.split() == ["number", "state", "hmm.gamma", "seed", "value", "run_id", "retried_from", "worker",
                            "reason"] and set(rule) <= {"-", " "}
    assert row.split()[:5] == ["0", "RUNNING", "0.7", "0", rid]  # whole id; no None, no JSON blob
    assert f"orphan run {rid} " in r.stderr and "hmmscope runs gc" in r.stderr
    assert tracking.get_run(uri, rid).info.status == "RUNNING"  # status only reads
    r = runner.invoke(app, ["runs", "gc", "--tracking-uri", uri])
    assert r.exit_code == 0 and tracking.get_run(uri, rid).info.status == "KILLED"


def test_median_pruner_prunes_a_bad_trial(tmp_path):
    spec, storage, uri = _train_study(tmp_path, "prune", '"train.lr" = {grid = [3e-3, 1e-8]}',
                                      extra='pruner = "median"\nprune_startup = 1')
    assert run_worker("prune", storage, uri, log=lambda m: None) == 2
    rows = {r["params"]["train.lr"]: r for r in study_status("prune", storage)}
    assert rows[3e-3]["state"] == "COMPLETE"
    assert rows[1e-8]["state"] == "PRUNED" and "median" in rows[1e-8]["reason"]
    assert rows[1e-8]["value"] is not None  # its last reported value, as Study.tell records it
    bad = {r.data.tags.get("hmmscope.trial"): r for r in runs(uri)}[str(rows[1e-8]["number"])]
    assert bad.info.status == "FAILED" and bad.data.tags["hmmscope.failure_reason"].startswith("TrialPruned")


def test_default_storage_is_under_mlruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = default_storage()
    assert url == f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}" and (tmp_path / "mlruns/optuna.db").exists()
    assert default_storage() == url
    with pytest.raises(ConfigError, match="no sweep study 'nope'"):
        study_status("nope", url)


# ---------------------------------------------------------------- PostgreSQL


@pytest.mark.slow  # a PostgreSQL server and a whole sweep; the default suite has test_sweep_protocol's PostgreSQL cases
def test_sweep_on_postgresql(tmp_path):
    with postgres_server() as url:
        spec = theory_spec(tmp_path, name="pg")
        _, uri = stores(tmp_path)
        s = run_sweep(spec, workers=2, storage=url, uri=uri, log=lambda m: None)
        assert (s.complete, s.failed, s.n_trials) == (4, 0, 4)
        rows = study_status("pg", url)
        assert len(rows) == 4 and all(r["state"] == "COMPLETE" and r["mlflow_run_id"] for r in rows)
        assert run_sweep(spec, workers=1, storage=url, uri=uri, log=lambda m: None).already_complete
        _assert_each_claimed_once(_claim_race(url, "pg-race", n_trials=24), url, "pg-race", n_trials=24)


def test_tpe_sweep_with_config_file_base(tmp_path):
    (tmp_path / "base.toml").write_text('[theory]\nrhos = [0.05]\nn_states = [8]\nranks = [2]\nn_tokens = 4\n'
                                        'lengths = [1, 2, 4]\nn_histories = 200\nburn_in = 10\n')
    text = ('[sweep]\nname = "tpe"\nconfig = "base.toml"\nkind = "theory"\nsampler = "tpe"\nn_trials = 3\n'
            'seeds = [0, 1]\nexperiment = "sw"\ndirection = "maximize"\n'
            '[space]\n"theory.gammas" = {low = 0.3, high = 0.9}\n')
    spec = load_spec(write(tmp_path, text, "tpe.toml"))
    assert spec.base.theory.n_states == (8,) and spec.n_trials == 3
    storage, uri = stores(tmp_path)
    create_study(spec, storage, uri)
    assert run_worker("tpe", storage, uri, log=lambda m: None) == 3
    rows = study_status("tpe", storage)
    assert len(rows) == 3 and all(r["state"] == "COMPLETE" for r in rows)
    assert all(0.3 <= r["params"]["theory.gammas"] <= 0.9 for r in rows)
    assert [r["seed"] for r in sorted(rows, key=lambda r: r["number"])] == [0, 1, 0]  # replicates round-robin
    assert run_worker("tpe", storage, uri, log=lambda m: None) == 0  # exhausted: no new trials


def _procs_mentioning(needle: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
    return pids


def test_sigterm_stops_workers_and_gives_trials_back(tmp_path):
    fixed = TRAIN_FIXED.replace('"train.steps" = 10', '"train.steps" = 5000').replace(
        '"train.eval_every" = 5', '"train.eval_every" = 5000').replace('"train.ckpt_every" = 10', '"train.ckpt_every" = 5000')
    text = f'[sweep]\nname = "term"\nexperiment = "sw"\n{fixed}\n[space]\n"hmm.gamma" = {{grid = [0.5, 0.9]}}\n'
    p = write(tmp_path, text, "term.toml")
    storage, uri = stores(tmp_path)
    code = (f"from hmmscope.sweep import run_sweep\nfrom hmmscope.sweep.spec import load_spec\n"
            f"run_sweep(load_spec({str(p)!r}), workers=2, storage={storage!r}, uri={uri!r})\n")
    err = (tmp_path / "sweep.err").open("w")  # the sweep's and its workers' lines, for a failure's message
    proc = subprocess.Popen([sys.executable, "-c", code], env=worker_env(), stdout=err, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300  # generous: loaded CI machines
        while True:
            with contextlib.suppress(Exception):  # both trials running and their MLflow runs open
                if sum(r["state"] == "RUNNING" for r in study_status("term", storage)) == 2 and \
                        sum("hmmscope.trial" in r.data.tags for r in runs(uri)) == 2:
                    break
            assert proc.poll() is None and time.time() < deadline, "the sweep never started its trials"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert _procs_mentioning(storage) == []  # no worker left behind
    rows = study_status("term", storage)
    failed = [r for r in rows if r["state"] == "FAIL"]
    waiting = [r for r in rows if r["state"] == "WAITING"]
    said = (tmp_path / "sweep.err").read_text()[-4000:]
    assert len(failed) == 2 and all(r["reason"] == "interrupted" for r in failed), (rows, said)
    assert sorted((r["retried_from"], r["params"]["hmm.gamma"]) for r in waiting) == sorted(
        (r["number"], r["params"]["hmm.gamma"]) for r in failed)
    statuses = {r.info.run_name: r.info.status for r in runs(uri)}
    assert statuses == {"sweep-term": "KILLED", **{f"g{r['params']['hmm.gamma']}-s0": "KILLED" for r in failed}}


def _hmmscope(cwd: Path, *args: str, out: str) -> subprocess.Popen:
    """`hmmscope ARGS` as a real process in `cwd`, off a terminal, its output (stdout and stderr merged) to `out`."""
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HMMSCOPE_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    with (cwd / out).open("w") as f:
        return subprocess.Popen([str(Path(sys.executable).parent / "hmmscope"), *args], cwd=cwd, env=env, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_a_put_back_trial_is_retried_everywhere_never_failed(tmp_path, monkeypatch):
    """The default suite's part of the next test, in this process: trial 1 handed back as a worker does on SIGTERM
    (FAIL 'interrupted', a WAITING retry), then resumed. Before: `sweep list` counted it "fail", `sweep status` listed
    a FAIL, api.sweep_trials gave it a row of its own."""
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from hmmscope import api
    from hmmscope.cli import app
    from hmmscope.sweep import TrialStore, list_studies, load_study
    from hmmscope.sweep.status import interrupted_lines, resume_plan

    spec = theory_spec(tmp_path, name="back", ranks="[2]", nh=50)
    storage, uri = stores(tmp_path)
    create_study(spec, storage, uri)
    assert run_worker("back", storage, uri, max_trials=1, log=lambda m: None) == 1
    store = TrialStore.of(load_study("back", storage), storage, spec.grace_period)
    tid = store.claim()  # trial 1 running, then interrupted: put back as run_worker does on SIGTERM
    assert store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "interrupted"})
    assert store.retry(tid, spec.max_retry, interrupted=True) == 2
    assert interrupted_lines(spec, storage, "hmmscope sweep run back.toml") == [
        "sweep back: interrupted; kept: 1 of 2 trials done (their runs stay); 1 put back (each starts again), 0 not "
        "started", "resume: hmmscope sweep run back.toml"]
    assert resume_plan(spec, storage).line() == "1 of 2 already done"
    assert run_worker("back", storage, uri, log=lambda m: None) == 1
    (row,) = [r for r in list_studies(storage) if r["study"] == "back"]
    assert (row["trials"], row["complete"], row["failed"], row["retried"]) == (3, 2, 0, 1), row
    r = CliRunner().invoke(app, ["sweep", "status", "back", "--storage", storage, "--tracking-uri", uri])
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "3 trial(s): 2 complete, 1 retried", r.stdout
    assert [ln.split()[1] for ln in r.stdout.splitlines()[2:5]] == ["COMPLETE", "RETRIED", "COMPLETE"], r.stdout
    assert "interrupted; retried as trial 2" in r.stdout
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    df = api.sweep_trials("back", storage=storage, tracking_uri=uri)
    assert list(df["number"]) == [0, 2] and list(df["retries"]) == [0, 1] and df["run_id"].is_unique


@pytest.mark.slow  # real processes: a `sweep run` interrupted with SIGINT, its workers, a resume, the report (~100 s CPU)
def test_an_interrupted_then_resumed_sweep_tells_one_story(tmp_path, monkeypatch):
    """Ctrl-C while trial 1 trains (trial 0 done), then the same command again. Before: `sweep list` said "fail 1",
    `sweep status` listed a FAIL, api.sweep_trials returned trial 1's run twice (FAIL and COMPLETE), the finished parent
    and the resumed run kept hmmscope.failure_reason "KeyboardInterrupt..." and Ctrl-C ended with "error: aborted".
    Now the put-back trial is "retried" everywhere, the last lines say what was kept and how to resume, and the resumed
    sweep's first line says how much was done."""
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from hmmscope import api
    from hmmscope.cli import app
    from hmmscope.training.checkpoints import CKPT_DIR

    fixed = TRAIN_FIXED.replace('"train.steps" = 10', '"train.steps" = 1500').replace(
        '"train.eval_every" = 5', '"train.eval_every" = 250').replace('"train.ckpt_every" = 10', '"train.ckpt_every" = 250')
    write(tmp_path, f'[sweep]\nname = "cut"\nexperiment = "sw"\nseeds = [0, 1]\n{fixed}\n[space]\n'
                    f'"hmm.gamma" = {{grid = [0.7]}}\n', "cut.toml")
    storage, uri = f"sqlite:///{tmp_path}/mlruns/optuna.db", f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    proc = _hmmscope(tmp_path, "sweep", "run", "cut.toml", "--no-report", out="first.log")
    ro = tracking.read_only_uri(uri)  # never creates the store under the command that creates it
    try:
        deadline = time.time() + 600  # generous: loaded CI machines
        while True:  # trial 0 done, trial 1 training in its run, past its first checkpoint (step 250 of 1500)
            with contextlib.suppress(Exception):  # the parent run is made after both stores: then the study is read
                rows = study_status("cut", storage) if tracking.sweep_parent(ro, "cut") is not None else []
                if [r["state"] for r in rows] == ["COMPLETE", "RUNNING"] and rows[1]["mlflow_run_id"] and \
                        tracking.client(ro).list_artifacts(rows[1]["mlflow_run_id"], CKPT_DIR):
                    break
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = (tmp_path / "first.log").read_text().splitlines()
    assert said[-2:] == ["sweep cut: interrupted; kept: 1 of 2 trials done (their runs stay); 1 put back (each resumes "
                         "from its last checkpoint, if any), 0 not started",
                         "resume: hmmscope sweep run cut.toml --no-report"], said
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runner = CliRunner()
    r = runner.invoke(app, ["sweep", "run", "cut.toml", "--no-report"])  # the command it said
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == "sweep cut: 1 of 2 already done; browse: hmmscope ui --sweep cut", r.stdout
    assert "sweep cut: 2 complete, 0 failed, 0 pruned of 2 (1 retried)" in r.stdout
    r = runner.invoke(app, ["sweep", "list"])
    head, _, row = r.stdout.splitlines()[1:4]
    listed = dict(zip(head.split(), row.split()))
    assert (listed["complete"], listed["failed"], listed["retried"]) == ("2", "0", "1"), r.stdout
    r = runner.invoke(app, ["sweep", "status", "cut"])
    assert "FAIL " not in r.stdout and r.stdout.count("RETRIED") == 1 and "retried as trial 2" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1] == "3 trial(s): 2 complete, 1 retried", r.stdout
    df = api.sweep_trials("cut")
    assert list(df["number"]) == [0, 2] and set(df["state"]) == {"COMPLETE"} and df["run_id"].is_unique
    assert list(df["retries"]) == [0, 1]
    rows = study_status("cut", storage)
    assert rows[1]["state"] == TrialState.FAIL.name and rows[2]["mlflow_run_id"] == rows[1]["mlflow_run_id"]  # resumed
    for rid in (rows[2]["mlflow_run_id"], tracking.sweep_parent(uri, "cut").info.run_id):  # finished: no stale reason
        run = tracking.get_run(uri, rid)
        assert run.info.status == "FINISHED" and "hmmscope.failure_reason" not in run.data.tags, run.data.tags
    r = runner.invoke(app, ["report", "cut"])
    assert r.exit_code == 0 and "2 complete, 0 failed, 0 pruned (1 retried)" in r.stdout, r.output
    # the parent's description (the UI's) opens with the report's answer (before: what the sweep runs, only)
    answer = next(ln for ln in r.stdout.splitlines() if ln.startswith("answer: "))[len("answer: "):]
    parent = tracking.sweep_parent(uri, "cut")
    assert parent.data.tags["mlflow.note.content"] == f"{answer} — Sweep 'cut': 2 train trials (grid over hmm.gamma; " \
        "seeds 0, 1); objective eval/seen/excess_ce (minimize)" and parent.data.tags["hmmscope.answer"] == answer


def test_analyze_adds_an_analysis_run_per_trial(tmp_path):
    spec, storage, uri = _train_study(tmp_path, "an", '"hmm.gamma" = {grid = [0.5]}', extra="analyze = true")
    assert spec.analyze and run_worker("an", storage, uri, log=lambda m: None) == 1
    (row,) = study_status("an", storage)
    assert row["state"] == "COMPLETE"
    (an,) = [r for r in runs(uri) if r.info.run_name == "analysis"]
    assert an.data.tags["mlflow.parentRunId"] == row["mlflow_run_id"]
    assert any(k.startswith("shuffle/") for k in an.data.metrics)


def test_sweep_runs_compare_side_by_side_over_http(tmp_path, mlflow_server):
    """Issue 10, must hold: a theory sweep and a training sweep log through a real `mlflow server`; read back
    with MLflow's REST API, the trial runs are named after what varies, each kind logs its own params under
    the same names, every run has MLflow's standard tags, no run logs a metric key twice at one step, the
    objective is the first metric key of every trial, and claims are a logged table."""
    import dataclasses
    import json
    import urllib.parse
    import urllib.request

    import optuna

    th = theory_spec(tmp_path, name="http-th", ranks="[2]")
    tr = load_spec(write(tmp_path, f'[sweep]\nname = "http-tr"\nexperiment = "sw"\n{TRAIN_FIXED}\n[space]\n'
                                   '"model.pos_enc" = {grid = ["rope", "absolute"]}\n', "http-tr.toml"))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    for spec in (th, tr):
        s = run_sweep(spec, workers=1, storage=storage, uri=mlflow_server, log=lambda m: None)
        assert s.finished and s.complete == s.n_trials == 2

    def rest(path, body=None):
        req = urllib.request.Request(f"{mlflow_server}/api/2.0/mlflow/{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

    exp = rest("experiments/get-by-name?experiment_name=sw")["experiment"]
    found = rest("runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in found}
    params = {r["info"]["run_id"]: {p["key"] for p in r["data"].get("params", [])} for r in found}
    trials = {kind: [r for r in found if tags[r["info"]["run_id"]].get("hmmscope.kind") == f"sweep-{kind}"]
              for kind in ("theory", "train")}
    # names say what differs; the trial number stays a tag
    assert sorted(r["info"]["run_name"] for r in trials["theory"]) == ["g0.5-d2-s0", "g0.8-d2-s0"]
    assert sorted(r["info"]["run_name"] for r in trials["train"]) == ["absolute-s0", "rope-s0"]
    assert all(tags[r["info"]["run_id"]]["hmmscope.trial"] in ("0", "1") for r in trials["theory"] + trials["train"])
    # each kind its own params, the same names across runs of that kind
    (theory_keys,) = {frozenset(params[r["info"]["run_id"]]) for r in trials["theory"]}
    (train_keys,) = {frozenset(params[r["info"]["run_id"]]) for r in trials["train"]}
    from hmmscope.config import TheoryConfig

    assert len(theory_keys) == len(dataclasses.fields(TheoryConfig))  # every theory.* key (draws included)
    assert all(k.startswith("theory.") for k in theory_keys)
    assert "model.pos_enc" in train_keys and all(k.split(".")[0] in ("hmm", "data", "model", "train", "eval", "counting")
                                                  for k in train_keys)  # counting.*: Figure 1's fitted settings
    # MLflow's standard tags on every run (sweep parents, trials, theory settings)
    commit = tracking.git_commit()
    assert len(found) == 8
    for t in tags.values():
        assert t["mlflow.user"] and t["mlflow.source.name"] and t["mlflow.source.type"] == "LOCAL", t
        note = t["mlflow.note.content"]
        assert note.strip() and "\n" not in note, note
        assert commit is None or t["mlflow.source.git.commit"] == commit
    # one key, one meaning: no metric key logged twice at one step
    for r in found:
        rid = r["info"]["run_id"]
        for key in {m["key"] for m in r["data"].get("metrics", [])}:
            q = urllib.parse.urlencode({"run_id": rid, "metric_key": key, "max_results": 25000})
            steps = [m.get("step", 0) for m in rest(f"metrics/get-history?{q}")["metrics"]]
            assert len(steps) == len(set(steps)), (r["info"]["run_name"], key, steps)
    # a training trial's loss curves sort first among its metric keys (Loss/train, Loss/val: the run page opens on
    # them); the objective is logged once, under its own key (before: also as Objective/<key>, shown twice by api)
    for kind, spec in (("theory", th), ("train", tr)):
        for r in trials[kind]:
            keys = sorted(m["key"] for m in r["data"]["metrics"])
            assert keys[:2] == ["Loss/train", "Loss/val"] if kind == "train" else True, keys[:3]
            assert spec.objective in keys and not [k for k in keys if k.startswith("Objective/")], keys
    assert all({"val/excess_ce", "eval/seen/excess_ce"} <= {m["key"] for m in r["data"]["metrics"]} for r in trials["train"])
    # claims as a logged table
    for r in trials["theory"]:
        rid = r["info"]["run_id"]
        assert {"path": "claims.json", "type": "table"} in json.loads(tags[rid]["mlflow.loggedArtifacts"])
        with urllib.request.urlopen(f"{mlflow_server}/get-artifact?path=claims.json&run_uuid={rid}", timeout=10) as f:
            table = json.load(f)
        assert table["columns"] == list(tracking.CLAIM_COLUMNS) and table["data"]
        assert not any(k.startswith(("verdict/", "rule/")) for k in tags[rid])  # the table, not a tag per claim
        assert tags[rid]["hmmscope.claims"].startswith(f"{len(table['data'])} claims: ")
    # Optuna: the objective's name, the seed outside the hyperparameters, each trial linked to its run
    for spec in (th, tr):
        study = optuna.load_study(study_name=spec.name, storage=storage)
        assert study.metric_names == [spec.objective]
        by_id = {r["info"]["run_id"]: r for r in found}
        for t in study.trials:
            assert "seed" not in t.params and t.user_attrs["seed"] == 0
            run = by_id[t.user_attrs["mlflow_run_id"]]
            assert tags[run["info"]["run_id"]]["hmmscope.trial"] == str(t.number)
            assert t.user_attrs["mlflow_run_url"] == (f"{mlflow_server}/#/experiments/{exp['experiment_id']}/runs/"
                                                      f"{run['info']['run_id']}?workflowType=machine_learning")


def test_main_job_sweep_is_the_shipped_smoke_spec():
    from hmmscope.pipeline.job import MAIN_SWEEP
    from hmmscope.sweep.spec import parse_spec

    shipped = load_spec(Path(__file__).resolve().parents[1] / "sweeps" / "smoke.toml")
    assert parse_spec(MAIN_SWEEP, "main").hash == shipped.hash


# ---------------------------------------------------------------- claims: exactly one winner


def _claim_race(url: str, name: str, n_trials: int = 30, n_claimers: int = 6) -> list[list[int]]:
    """`n_claimers` threads, each with its own storage (own engine and connections), claim WAITING trials
    of one study at once until none is left; returns the trial ids each one claimed."""
    import threading

    import optuna

    from hmmscope.sweep import TrialStore

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=url)
    for i in range(n_trials):
        study.enqueue_trial({"x": i}, skip_if_exists=False)
    barrier, got = threading.Barrier(n_claimers), [[] for _ in range(n_claimers)]

    def claimer(i: int) -> None:
        s = optuna.load_study(study_name=name, storage=optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}))
        store = TrialStore.of(s, url)
        barrier.wait()
        while (tid := store.claim()) is not None:
            got[i].append(tid)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(n_claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def _assert_each_claimed_once(got: list[list[int]], url: str, name: str, n_trials: int) -> None:
    import optuna

    flat = [t for g in got for t in g]
    assert len(flat) == len(set(flat)) == n_trials, f"claimed twice: {sorted(t for t in set(flat) if flat.count(t) > 1)}"
    states = [t.state.name for t in optuna.load_study(study_name=name, storage=url).get_trials()]
    assert states == ["RUNNING"] * n_trials


def test_claim_is_exclusive_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path}/race.db"
    for i in range(2):  # Optuna's own claim path claimed 45-60 times for 30 trials here
        _assert_each_claimed_once(_claim_race(url, f"race{i}", n_trials=24), url, f"race{i}", n_trials=24)


def test_finish_has_one_winner(tmp_path):
    """A trial told COMPLETE by its worker and failed as stale by another: exactly one of them succeeds."""
    import optuna
    from optuna.trial import TrialState

    from hmmscope.sweep import TrialStore

    url = f"sqlite:///{tmp_path}/fin.db"
    study = optuna.create_study(study_name="fin", storage=url)
    study.enqueue_trial({"x": 1})
    store = TrialStore.of(study, url)
    tid = store.claim()
    assert store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "stale"})
    assert not store.finish(tid, TrialState.COMPLETE, 0.5)  # too late: no value, state unchanged
    (t,) = study.get_trials()
    assert t.state == TrialState.FAIL and t.value is None and t.user_attrs["fail_reason"] == "stale"
    assert store.claim() is None


# ---------------------------------------------------------------- GPUs (issue 12): checked through the environment


def test_workers_get_gpus_round_robin_when_trials_use_cuda(tmp_path, monkeypatch):
    from hmmscope.sweep import uses_gpu, worker_gpus

    cuda = load_spec(write(tmp_path, f'[sweep]\nname = "g"\n{TRAIN_FIXED.replace("cpu", "cuda")}\n'
                                     '[space]\n"hmm.gamma" = {grid = [0.5]}\n', "g.toml"))
    cpu = load_spec(write(tmp_path, f'[sweep]\nname = "c"\n{TRAIN_FIXED}\n[space]\n"hmm.gamma" = {{grid = [0.5]}}\n',
                          "c.toml"))
    assert uses_gpu(cuda) and not uses_gpu(cpu) and not uses_gpu(theory_spec(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert worker_gpus(cuda, 3) == ["4", "6", "4"]
    assert worker_gpus(cuda, 2, ["1", "2", "3"]) == ["1", "2"]
    assert worker_gpus(cpu, 2) == [None, None] and worker_gpus(theory_spec(tmp_path), 2) == [None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert worker_gpus(cuda, 2) == [None, None]  # no GPU visible: environment untouched
    assert worker_env("7")["CUDA_VISIBLE_DEVICES"] == "7" and worker_env(None)["CUDA_VISIBLE_DEVICES"] == ""


def test_sweep_worker_joins_with_one_gpu(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hmmscope.cli import app

    spec = theory_spec(tmp_path, name="gpu", ranks="[2]")
    storage, uri = stores(tmp_path)
    create_study(spec, storage, uri)
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    r = CliRunner().invoke(app, ["sweep", "worker", "gpu", "--storage", storage, "--gpu", "1", "--max-trials", "1",
                                 "--tracking-uri", uri])
    if torch.cuda.device_count() < 1:  # issue 30: a pin that shows no GPU is refused (it ran on the CPU before)
        assert r.exit_code == 2 and "no CUDA GPU is visible here (CUDA_VISIBLE_DEVICES=7" in r.output, r.output
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,7" and study_status("gpu", storage)[0]["state"] == "WAITING"
    else:
        assert r.exit_code == 0, r.output
        assert [row["worker"]["gpu"] for row in study_status("gpu", storage) if row["state"] == "COMPLETE"] == ["7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    r = CliRunner().invoke(app, ["sweep", "worker", "gpu", "--storage", storage, "--gpu", "2", "--tracking-uri", uri])
    assert r.exit_code == 2 and "2 GPU(s) visible" in r.output


def test_jobs_do_not_import_the_sweep_layer():
    """One-way dependency: the sweep package and the report call the jobs; jobs.py imports neither, nor the CLI (not
    even lazily; the main job's sweep spec is parsed by its caller)."""
    import ast

    import hmmscope.jobs

    tree = ast.parse(Path(hmmscope.jobs.__file__).read_text())
    imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1
                and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module is None
                 for a in n.names}
    assert not imported & {"sweep", "report", "cli"}, imported


def test_worker_runs_name_the_worker_entry_point():
    """`python -m hmmscope.sweep worker` runs hmmscope/sweep/__main__.py: its runs' mlflow.source.name stays
    "hmmscope.sweep worker", as when the sweep was one module."""
    import hmmscope.sweep

    main = str(Path(hmmscope.sweep.__file__).parent / "__main__.py")
    assert worker_command("s", "sqlite:///x.db", "u")[1:3] == ["-m", "hmmscope.sweep"]
    assert tracking.source_name([main, "worker", "--study", "s"]) == "hmmscope.sweep worker"


def test_worker_argv_keeps_each_value_whole():
    """Each value is joined to its option with '=': a URI that starts with '--' or holds spaces stays one value
    (argparse would take `--uri --x` for a missing value)."""
    from hmmscope.sweep.worker import main

    cmd = worker_command("s", "sqlite:///a b/x.db", "--uri=sqlite:///c d.db --max-trials 9", max_trials=2)
    assert cmd[3:] == ["worker", "--study=s", "--storage=sqlite:///a b/x.db",
                       "--uri=--uri=sqlite:///c d.db --max-trials 9", "--max-trials=2"]
    with pytest.raises(SystemExit):  # the parser takes it whole: --help exits, proving no option was eaten
        main([*cmd[3:], "--help"])


def test_sweep_modules_import_one_way():
    """The sweep package's modules import each other as their docstrings say (no cycle), and the trial protocol
    and the storages import neither MLflow nor torch, not even lazily."""
    import ast

    import hmmscope.sweep

    may = {"space": set(), "spec_diff": {"spec"}, "storage": set(),
           "protocol": {"storage"}, "study": {"protocol", "spec", "spec_diff", "storage"}, "trial": {"spec", "spec_diff"},
           "status": {"storage", "study"}, "studies": {"protocol", "status", "storage", "study"}, "effects": set(),
           "sentences": {"effects"}, "rename": {"spec"}, "compare": {"effects", "sentences", "spec"}, "gpus": {"spec"},
           "outage": {"storage"}, "parent": {"compare", "spec", "status"}, "processes": {"protocol", "spec", "status"},
           "worker": {"gpus", "outage", "parent", "processes", "protocol", "spec", "status", "storage", "study", "trial"}}
    root = Path(hmmscope.sweep.__file__).parent
    for name, allowed in may.items():
        tree = ast.parse((root / f"{name}.py").read_text())
        siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        assert siblings == allowed, (name, siblings)
        outside = {n.module or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 2
                   for a in n.names} | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                                        for a in n.names} | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                                                             if isinstance(n, ast.ImportFrom) and n.level == 0}
        if name in ("protocol", "storage"):
            assert not outside & {"torch", "mlflow", "jobs", "train", "trial", "worker"}, (name, outside)
        if name == "protocol":
            assert "tracking" not in outside
    inner = {"objectives": set(), "typed": {"objectives"}, "checks": {"objectives", "typed"},  # the spec package
             "parse": {"checks", "typed"}, "__init__": {"checks", "objectives", "parse", "typed"}}
    for name, allowed in inner.items():
        tree = ast.parse((root / "spec" / f"{name}.py").read_text())
        own = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 2}
        assert own == allowed and siblings <= {"effects", "space"}, (name, own, siblings)


def test_sweep_run_exits_nonzero_when_a_worker_crashes(tmp_path):
    """A worker that dies with a traceback (here: the stored spec is unreadable) makes `sweep run` fail loudly."""
    import optuna
    from typer.testing import CliRunner

    from hmmscope.cli import app

    spec = theory_spec(tmp_path, name="crash", ranks="[2]")
    storage, uri = stores(tmp_path)
    study, _, _ = create_study(spec, storage, uri)
    broken = optuna.load_study(study_name="crash", storage=storage)
    broken.set_user_attr("spec", {**broken.user_attrs["spec"], "text": "[sweep\n"})  # breaks workers only
    r = CliRunner().invoke(app, ["sweep", "run", str(tmp_path / "crash.toml"), "--storage", storage, "--tracking-uri", uri])
    assert r.exit_code == 1 and "1 worker(s) crashed (exit codes [1])" in r.output, r.output


# ---------------------------------------------------------------- journal storage (issue 21.8)


def _kill_when(proc: subprocess.Popen, cond, what: str) -> None:
    """SIGKILL `proc` as soon as `cond()` holds (polled every 10 ms)."""
    try:
        deadline = time.time() + 300  # generous: loaded CI machines
        while True:
            with contextlib.suppress(Exception):  # the stores may be busy or not created yet
                if cond():
                    break
            assert proc.poll() is None and time.time() < deadline, f"the worker never got to {what}"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sweep_on_a_journal_file_with_a_killed_worker(tmp_path, monkeypatch):
    """A grid sweep on a journal file (journal storage, no database): a worker process is SIGKILLed mid-trial,
    then `run_sweep` with 2 workers finishes every cell exactly once, the killed trial retried; `sweep status /
    list / export / delete` and `report` read the journal through the CLI with the bare path."""
    from typer.testing import CliRunner

    from hmmscope.cli import app

    spec = theory_spec(tmp_path, name="jr")
    path = tmp_path / "shared" / "optuna.log"
    storage, uri = f"journal://{path}", f"sqlite:///{tmp_path}/mlflow.db"
    create_study(spec, storage, uri)
    proc = subprocess.Popen(worker_command("jr", storage, uri), env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    beat: list[dict] = []

    def running():  # a claimed trial that names its worker: the worker is past its claim and mid-trial
        beat[:] = [r for r in study_status("jr", storage) if r["state"] == "RUNNING" and r["worker"]]
        return beat

    _kill_when(proc, running, "a trial")
    s = run_sweep(spec, workers=2, storage=str(path), uri=uri, log=lambda m: None)
    assert (s.complete, s.failed, s.n_trials, s.retried, s.worker_returncodes) == (4, 0, 4, 1, [0, 0])
    assert s.storage == storage
    rows = study_status("jr", storage)
    done = sorted((r["params"]["theory.gammas"], r["params"]["theory.ranks"]) for r in rows if r["state"] == "COMPLETE")
    assert done == [(0.5, 2), (0.5, 4), (0.8, 2), (0.8, 4)] and len(rows) == 5
    (failed,) = [r for r in rows if r["state"] == "FAIL"]
    assert failed["number"] == beat[0]["number"] and failed["reason"].startswith("stale")
    (retry,) = [r for r in rows if r["retried_from"] is not None]
    # the same grid cell: the killed trial may have died between two suggestions (under load), so it holds a
    # part of the cell's params, each equal to the retry's
    assert retry["retried_from"] == failed["number"] and failed["params"].items() <= retry["params"].items()
    assert sorted(p.name for p in path.parent.iterdir()) == ["optuna.log"]  # no lock left behind

    runner = CliRunner()
    monkeypatch.chdir(path.parent)
    for args, want in ((["sweep", "status", "jr"], "COMPLETE"), (["sweep", "list"], "jr"),
                       (["sweep", "export", "jr"], "param.theory.gammas")):
        r = runner.invoke(app, [*args, "--storage", "optuna.log"] + (["--tracking-uri", uri] if args[1] == "status" else []))
        assert r.exit_code == 0 and want in r.output, r.output
    r = runner.invoke(app, ["report", "jr", "--storage", "optuna.log", "--tracking-uri", uri, "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| trials complete / failed / pruned / running | 4 / 0 / 0 / 0 |" in md
    r = runner.invoke(app, ["sweep", "status", "nope", "--storage", "missing.log"])
    assert r.exit_code == 2 and "missing.log" in r.output and not (path.parent / "missing.log").exists()
    r = runner.invoke(app, ["sweep", "delete", "jr", "--yes", "--storage", "optuna.log", "--tracking-uri", uri])
    assert r.exit_code == 0, r.output
    with pytest.raises(ConfigError, match="no sweep study 'jr'"):
        study_status("jr", storage)


# ---------------------------------------------------------------- a pre-empted trial resumes (issue 21.8)


def test_preempted_trial_resumes_from_its_checkpoint(tmp_path):
    """A worker is SIGKILLed after its trial's first checkpoints; the retry resumes the same MLflow run from the
    last checkpoint (not from step 0) and ends with exactly the objective and weights of an uninterrupted trial."""
    import optuna

    from hmmscope.training.checkpoints import read_checkpoint

    fixed = TRAIN_FIXED.replace('"train.steps" = 10', '"train.steps" = 120').replace(
        '"train.eval_every" = 5', '"train.eval_every" = 60').replace('"train.ckpt_every" = 10', '"train.ckpt_every" = 4')
    specs = {name: load_spec(write(tmp_path, f'[sweep]\nname = "{name}"\nexperiment = "sw"\nheartbeat_interval = 1\n'
                                             f'grace_period = 2\n{fixed}\n[space]\n"hmm.gamma" = {{grid = [0.7]}}\n',
                                   f"{name}.toml")) for name in ("pre", "ref")}
    storage, uri = stores(tmp_path)
    create_study(specs["pre"], storage, uri)
    proc = subprocess.Popen(worker_command("pre", storage, uri), env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt: list[Path] = []

    def checkpointed():  # the trial's training run has written a checkpoint
        ckpt[:] = list(tmp_path.glob("artifacts/*/artifacts/checkpoints/last.pt"))
        return ckpt

    _kill_when(proc, checkpointed, "a checkpoint")
    killed_at = read_checkpoint(ckpt[0])["step"]
    assert 0 < killed_at < 120
    run_id = ckpt[0].parents[2].name
    assert run_worker("pre", storage, uri, log=lambda m: None) == 1
    failed, retry = sorted(study_status("pre", storage), key=lambda r: r["number"])
    assert failed["state"] == "FAIL" and failed["reason"].startswith("stale") and failed["mlflow_run_id"] == run_id
    assert retry["state"] == "COMPLETE" and retry["retried_from"] == failed["number"]
    assert retry["mlflow_run_id"] == run_id  # the same MLflow run, continued in place
    run = tracking.get_run(uri, run_id)
    assert run.info.status == "FINISHED" and run.data.tags["hmmscope.resumed_from_step"] == str(killed_at)
    assert run.data.tags["hmmscope.trial"] == str(retry["number"])
    assert [r.info.run_id for r in runs(uri) if r.data.tags.get("hmmscope.study") == "pre" and "hmmscope.trial" in r.data.tags] \
        == [run_id]

    create_study(specs["ref"], storage, uri)  # the same trial, never interrupted
    assert run_worker("ref", storage, uri, log=lambda m: None) == 1
    (ref,) = study_status("ref", storage)
    assert ref["value"] == retry["value"]
    resumed, fresh = (read_checkpoint(tmp_path / "artifacts" / r / "artifacts" / "checkpoints" / "last.pt")
                      for r in (run_id, ref["mlflow_run_id"]))
    assert resumed["step"] == fresh["step"] == 120
    assert all(torch.equal(resumed["model"][k], fresh["model"][k]) for k in fresh["model"])
    assert optuna.load_study(study_name="pre", storage=storage).trials[1].user_attrs["mlflow_run_id"] == run_id


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon", "1e308"])
def test_a_bad_store_outage_setting_never_makes_a_wait_unbounded(monkeypatch, value):
    """HMMSCOPE_STORE_OUTAGE_S bounds how long a worker waits for its storage. `nan` made the bound compare false,
    so a worker cut off for good retried forever (and said "for up to nan s"); inf the same; 1e308 was taken (issue
    36, item 8). Now anything outside its stated range [0, 86400] is refused, naming it; 0 gives up at the first
    transient error."""
    from hmmscope.sweep.outage import Patient
    from hmmscope.sweep.storage import STORE_OUTAGE_S

    monkeypatch.setenv("HMMSCOPE_STORE_OUTAGE_S", value)
    with pytest.raises(ValueError, match=r"HMMSCOPE_STORE_OUTAGE_S=.*\[0, 86400\]"):
        Patient(lambda m: None)
    monkeypatch.setenv("HMMSCOPE_STORE_OUTAGE_S", "")
    assert Patient(lambda m: None).limit == STORE_OUTAGE_S
    monkeypatch.setenv("HMMSCOPE_STORE_OUTAGE_S", "0")

    class OperationalError(Exception):  # the name a transient storage error has (SQLAlchemy's)
        pass

    calls = []

    def down():
        calls.append(1)
        raise OperationalError("could not connect to server")

    with pytest.raises(OperationalError):
        Patient(lambda m: None)(down)
    assert len(calls) <= 2
