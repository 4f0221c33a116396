"""The CLI end to end: --help everywhere, small real runs into a temporary MLflow store, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.episodes import load_episodes
from hmmscope.sweep_spec import TRAIN_OBJECTIVES

runner = CliRunner()

COMMANDS = [[], ["theory"], ["generate"], ["train"], ["evaluate"], ["run"], ["bench"], ["bench", "sample"],
            ["bench", "filter"], ["bench", "train"]]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _runs(uri):
    c = tracking.client(uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()])


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_help(cmd):
    r = runner.invoke(app, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output


SMALL_THEORY = ["theory", "--gammas", "0.5,0.9", "--n-states", "6", "--ranks", "2", "--lengths", "1,2,3,4",
                "--n-histories", "100", "--set", "theory.n_tokens=6", "--set", "theory.burn_in=20",
                "--set", "theory.gamma_m=0"]


def test_theory_end_to_end(store):
    r = runner.invoke(app, [*SMALL_THEORY, "--json", "res.json"])
    assert r.exit_code == 0, r.output
    res = json.loads((store / "res.json").read_text())
    assert [s["params"]["gamma"] for s in res["settings"]] == [0.5, 0.9]
    # S <= V with an injective revealing map: gamma(O) is exactly the knob
    assert all(s["gamma_O"]["exact"] and abs(s["gamma_O"]["value"] - s["params"]["gamma"]) < 1e-7
               for s in res["settings"])
    assert (store / "out/theory/theory.png").stat().st_size > 1000
    runs = {r.info.run_name: r for r in _runs(tracking.default_tracking_uri())}
    parent = runs["theory"]
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in runs.values())
    assert {c.data.params["hmm.gamma"] for c in children} == {"0.5", "0.9"}
    assert all({"theory/gamma_O", "theory/gamma_eff", "theory/dobrushin", "theory/eps"} <= set(c.data.metrics)
               for c in children)
    fits = {s["params"]["gamma"]: s["rate_fit"]["rate"] for s in res["settings"]}
    for c in children:  # a rate is logged exactly when the fit had enough points above the floor
        assert ("theory/rate" in c.data.metrics) == (fits[float(c.data.params["hmm.gamma"])] is not None)
    assert "decay rate >= g^4, g = gamma_eff" in r.output  # a verdict line per setting is printed


@pytest.mark.parametrize("args, needle", [
    (["--gammas", "0,0.5"], "theory.gammas must lie in (0, 1]"),
    (["--gammas", "1.5"], "theory.gammas must lie in (0, 1]"),
    (["--ranks", "9", "--n-states", "6"], "theory.ranks must lie in [1, n_states=6]"),
    (["--lengths", "-1,2"], "theory.lengths must be >= 1"),
    (["--set", "theory.family=gaussian"], "theory.family must be one of"),
    (["--set", "theory.bogus=1"], "unknown config key 'theory.bogus'"),
    (["--gammas", "a,b"], "expected comma-separated numbers"),
])
def test_theory_bad_input_exits_2_and_writes_nothing(store, args, needle):
    r = runner.invoke(app, ["theory", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1
    assert not (store / "mlruns").exists() and not (store / "out").exists()


def test_unknown_family_option_exits_2(store):
    r = runner.invoke(app, ["theory", "--family", "gaussian"])
    assert r.exit_code == 2 and not (store / "mlruns").exists()


def test_generate_writes_dataset(store):
    r = runner.invoke(app, ["generate", "eps.npz", "--n", "20", "--set", "hmm.n_tasks=3"])
    assert r.exit_code == 0, r.output
    ep = load_episodes(store / "eps.npz")
    assert ep.tokens.shape[0] == 20 and set(np.unique(ep.task_ids)) <= {0, 1, 2}
    assert ep.meta["dataset_hash"] in r.output
    r2 = runner.invoke(app, ["generate", "eps2.npz", "--n", "20", "--set", "hmm.n_tasks=3"])
    assert r2.exit_code == 0 and np.array_equal(load_episodes(store / "eps2.npz").tokens, ep.tokens)


@pytest.mark.parametrize("args", [["--set", "hmm.gamma=0"], ["--set", "hmm.rank=99"], ["--n", "-3"],
                                  ["--set", "data.l_test=-1"]])
def test_generate_bad_input(store, args):
    r = runner.invoke(app, ["generate", "bad.npz", *args])
    assert r.exit_code == 2, r.output
    assert not (store / "bad.npz").exists()


TINY_TRAIN = ["--set", "hmm.n_tasks=4", "--set", "model.n_layers=1", "--set", "model.d_model=32",
              "--set", "model.n_heads=2", "--set", "model.d_mlp=64", "--set", "train.steps=6",
              "--set", "train.eval_every=3", "--set", "train.ckpt_every=3", "--set", "train.warmup=2",
              "--set", "data.n_train=64", "--set", "data.n_eval=16", "--set", "data.n_demos=2",
              "--set", "data.l_demo=8", "--set", "data.l_test=8", "--device", "cpu"]


def test_train_then_evaluate(store):
    r = runner.invoke(app, ["train", *TINY_TRAIN])
    assert r.exit_code == 0, r.output
    uri = tracking.default_tracking_uri()
    (run,) = _runs(uri)
    assert run.info.status == "FINISHED"
    assert {"eval/test_acc", "eval/oracle_mix_test_acc", "eval/excess_ce", "eval/kl_mix"} <= set(run.data.metrics)
    assert run.data.params["model.d_model"] == "32"
    r2 = runner.invoke(app, ["evaluate", run.info.run_id])
    assert r2.exit_code == 0, r2.output
    assert "eval/test_acc" in r2.output


@pytest.mark.parametrize("sets, needle", [
    (["--set", "model.bogus=1"], "unknown config key 'model.bogus'"),
    (["--set", "train.steps=ten"], "train.steps"),
    (["--set", "model.n_heads=3"], "must divide"),
    (["--set", "model.window=-1"], "model.window"),
    (["--set", "model.pos_enc=alibi"], "model.pos_enc must be one of"),
    (["--device", "tpu"], "device"),
])
def test_train_bad_config_exits_2_without_a_run(store, sets, needle):
    r = runner.invoke(app, ["train", *sets])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert not (store / "mlruns").exists()


def test_evaluate_without_a_store_creates_none(store):
    r = runner.invoke(app, ["evaluate", "0123456789abcdef"])
    assert r.exit_code == 2 and "no MLflow store at" in r.output, r.output
    assert not (store / "mlruns").exists()


def test_analyze_end_to_end_and_bad_input(store):
    assert runner.invoke(app, ["train", *TINY_TRAIN, "--set", "data.n_eval=24", "--no-evaluate"]).exit_code == 0
    uri = tracking.default_tracking_uri()
    (train_run,) = _runs(uri)
    rid = train_run.info.run_id
    r = runner.invoke(app, ["analyze", rid, "--ks", "1,2", "--n-perms", "2"])
    assert r.exit_code == 0, r.output
    runs = {x.info.run_name: x for x in _runs(uri)}
    an = runs["analysis"]
    assert an.data.tags["mlflow.parentRunId"] == rid and an.info.status == "FINISHED"
    assert {"shuffle/layer0/norm_change", "probe/kback1/layer0/acc", "probe/task/layer1/acc"} <= set(an.data.metrics)
    assert any(k.startswith("verdict/") for k in an.data.tags)
    assert "upper layers change less" in r.output
    ckpt = next(store.rglob("last.pt"))
    r = runner.invoke(app, ["analyze", str(ckpt), "--ks", "1", "--n-perms", "1", "--n-episodes", "16"])
    assert r.exit_code == 0, r.output  # a checkpoint file works too (standalone analysis run)
    n_runs = len(_runs(uri))
    with tracking.start_run(uri, "hmmscope", "no-checkpoint") as bare:
        pass
    for args, needle in [(["0123456789abcdef"], "unknown MLflow run id"),
                         ([bare.run_id], "has no checkpoint"),
                         ([rid, "--ks", "0"], "k must lie in"),
                         ([rid, "--ks", "99"], "k must lie in"),
                         ([rid, "--ks", "x"], "comma-separated"),
                         ([str(store / "missing.pt")], "checkpoint not found")]:
        r = runner.invoke(app, ["analyze", *args])
        assert r.exit_code == 2 and needle in r.output, (args, r.output)
    assert len(_runs(uri)) == n_runs + 1  # only the bare run: bad input created no analysis run


SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def test_smoke_sweep_two_workers_then_report(store):
    r = runner.invoke(app, ["sweep", "run", str(SWEEPS / "smoke.toml"), "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "smoke: 4 complete, 0 failed, 0 pruned of 4" in r.output
    r = runner.invoke(app, ["sweep", "run", str(SWEEPS / "smoke.toml"), "--workers", "2"])
    assert r.exit_code == 0 and "already complete" in r.output
    r = runner.invoke(app, ["sweep", "status", "smoke"])
    assert r.exit_code == 0 and r.output.count("COMPLETE") == 4
    trials = [x for x in _runs(tracking.default_tracking_uri()) if x.data.tags.get("hmmscope.kind") == "sweep-train"]
    assert len(trials) == 4
    for t in trials:  # the objectives a spec may name (checked at spec validation) are what a trial logs
        assert {k for k in t.data.metrics if k.split("/")[0] in ("val", "eval", "oracle")} == TRAIN_OBJECTIVES
    r = runner.invoke(app, ["report", "smoke"])
    assert r.exit_code == 0, r.output
    md = (store / "out" / "report-smoke" / "report.md").read_text()
    assert "| trials complete / failed / pruned / running | 4 / 0 / 0 / 0 |" in md
    assert "Positional encoding" in md and (store / "out" / "report-smoke" / "report.html").exists()


def test_bad_sweep_spec_exits_2_without_study_or_run(store):
    spec = store / "bad.toml"
    spec.write_text('[sweep]\nname = "bad"\n[space]\n"hmm.gamma" = {grid = []}\n')
    r = runner.invoke(app, ["sweep", "run", str(spec)])
    assert r.exit_code == 2 and "bad.toml" in r.output and "hmm.gamma" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (store / "mlruns").exists()
    r = runner.invoke(app, ["report", "no-such-sweep"])
    assert r.exit_code == 2 and "no MLflow store" in r.output  # nothing tracked here: no store is created
    assert not (store / "mlruns").exists() and not (store / "out").exists()


def test_main_job_end_to_end_small(store):
    """`hmmscope run` with shrunken settings: theory, training + Figure 1, analysis, the smoke sweep, its report."""
    small = [*TINY_TRAIN, "--set", "data.n_eval=24", "--set", "theory.gammas=[0.5, 0.9]",
             "--set", "theory.n_states=[8]", "--set", "theory.ranks=[2]", "--set", "theory.n_tokens=8",
             "--set", "theory.n_histories=100", "--set", "theory.lengths=[1, 2, 4, 8]", "--set", "theory.gamma_m=0"]
    r = runner.invoke(app, ["run", *small])
    assert r.exit_code == 0, r.output
    assert "Figure 1" in r.output and "upper layers change less" in r.output
    assert "sweep smoke: 4 complete, 0 failed, 0 pruned of 4" in r.output
    runs = _runs(tracking.default_tracking_uri())
    (main,) = [x for x in runs if x.info.run_name == "main"]
    kids = {x.info.run_name for x in runs if x.data.tags.get("mlflow.parentRunId") == main.info.run_id}
    assert {"train", "theory"} <= kids and main.info.status == "FINISHED"
    assert main.data.tags["hmmscope.analysis_run"] and main.data.tags["hmmscope.sweep_run"]
    assert (store / "out" / "report-smoke" / "report.html").exists() and (store / "out" / "theory" / "theory.png").exists()


@pytest.mark.parametrize("args, needle", [
    (["sweep", "run", "x.toml", "--workers", "0"], "Invalid value for '--workers'"),
    (["train", "--no-such-option"], "No such option: --no-such-option"),
    (["generate"], "Missing argument 'out'"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
    (["theory", "--family", "gaussian"], "'--family'"),
    (["ui", "--port", "70000"], "'--port'"),
    (["generate", "x.npz", "--n", "abc"], "Invalid value for '--n'"),
])
def test_option_errors_are_one_line(store, args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and needle in line and "--help" in line, line
    assert r.stdout == "" and not (store / "mlruns").exists()


def test_no_arguments_shows_the_help(store):
    r = runner.invoke(app, ["sweep"])
    assert "Usage" in r.output and "run" in r.output


def test_diverged_training_is_one_line_naming_its_failed_run(store):
    r = runner.invoke(app, ["train", *TINY_TRAIN, "--set", "train.lr=1e6", "--set", "train.min_lr=1e6",
                            "--set", "train.warmup=0", "--set", "train.grad_clip=1e30", "--no-evaluate"])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    (run,) = _runs(tracking.default_tracking_uri())
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: training diverged: non-finite") and f"run {run.info.run_id} ended FAILED" in line
    assert run.info.status == "FAILED" and run.data.tags["hmmscope.failure_reason"].startswith("DivergedError")
