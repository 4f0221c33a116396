"""The training deadline (hmmscope.training.deadline, train(deadline=), `hmmscope train --deadline`): a run stopped by a
wall-clock deadline and resumed equals an uninterrupted one bitwise on the CPU (weights and every logged
train/loss and val/* value); the stop's arithmetic on a fake clock; the CLI stops, says how to go on, and
leaves Figure 1 to the last segment."""

import shlex

import pytest
import torch
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.config import Config, override
from hmmscope.pipeline.run import train
from hmmscope.training.checkpoints import load_model
from hmmscope.training.deadline import Deadline, due, process_age_s, state_bytes

torch.set_num_threads(1)

SMALL = {
    "hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2,
    "data.n_demos": 2, "data.l_demo": 8, "data.l_test": 8, "data.n_train": 96, "data.n_eval": 32,
    "model.n_layers": 1, "model.n_heads": 2, "model.d_model": 32, "model.d_mlp": 64, "model.max_len": 64,
    "train.steps": 24, "train.batch_size": 8, "train.warmup": 2, "train.eval_every": 8, "train.ckpt_every": 24,
    "train.device": "cpu",
}
KEYS = ("train/loss", "train/lr", "train/grad_norm", "val/loss", "val/acc", "val/test_loss", "val/excess_ce")


def small(**kw) -> Config:
    return override(Config(), {**SMALL, **kw})


def history(uri, run_id):
    c = tracking.client(uri)
    return {k: [(m.step, m.value) for m in sorted(c.get_metric_history(run_id, k), key=lambda m: m.step)]
            for k in KEYS}


def test_due_and_state_bytes():
    assert due(0, 4, 8) == 0 and due(4, 8, 8) == 1 and due(7, 24, 8) == 3 and due(3, 9, 0) == 0
    sd = {"a": torch.zeros(3, 4), "b": {"c": [torch.zeros(5, dtype=torch.float64), 1]}}
    assert state_bytes(sd) == 3 * 4 * 4 + 5 * 8


def test_process_age():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6); from hmmscope.training.deadline import "
                          "process_age_s; print(process_age_s())"], capture_output=True, text=True, check=True)
    assert 0.55 <= float(out.stdout) < 30
    assert 0 <= process_age_s()


def test_must_stop_arithmetic_on_a_fake_clock():
    now = [100.0]
    d = Deadline(at=200.0, margin_s=5.0, write_mb_per_s=100.0, clock=lambda: now[0], eval_steps=10)
    d.start(0)
    now[0] = 108.0  # 10 steps in 10 s, of which a 2 s evaluation: 0.8 s per step
    with d.timed("eval"):
        now[0] += 2.0
    # next 10 steps 8 s + 1 evaluation 2 s + (0 + 1) checkpoints of max(0, 2 x 50 MB / 100 MB/s = 1 s) + 5 = 16 s
    assert not d.must_stop(10, next_steps=10, evals=1, ckpts=0, ckpt_bytes=50_000_000)
    assert d.estimate["step_s"] == pytest.approx(0.8) and d.estimate["need_s"] == pytest.approx(16.0)
    now[0] = 185.0  # 184 + 16 > 200: stop (and a slow interval raises the step estimate at once)
    assert d.must_stop(20, next_steps=10, evals=1, ckpts=0, ckpt_bytes=50_000_000)
    assert d.estimate["step_s"] == pytest.approx(7.5) and d.estimate["left_s"] == pytest.approx(15.0)
    # before any evaluation was measured, one costs eval_steps x step_s
    r = Deadline(at=1e9, margin_s=0, clock=lambda: now[0], eval_steps=10)
    r.start(0)
    now[0] += 4.0
    r.must_stop(4, next_steps=4, evals=1, ckpts=0, ckpt_bytes=0)
    assert r.estimate["eval_s"] == pytest.approx(10.0) and r.estimate["need_s"] == pytest.approx(14.0)


class StopAt(Deadline):
    """A deadline that says 'stop' at the first boundary at or past `step` (the clock's verdict made certain)."""

    def __init__(self, step: int):
        super().__init__(at=float("inf"))
        self.step = step

    def must_stop(self, done, **kw):
        super().must_stop(done, **kw)
        return done >= self.step


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('deadline')}/mlflow.db"
    return uri, train(small(), tracking_uri=uri, experiment="t", progress=False, log_every=4)


@pytest.mark.parametrize(("deadline", "stop"), [(lambda: Deadline.after(0.0), 4), (lambda: StopAt(12), 12),
                                               (lambda: StopAt(10), 12)],
                         ids=["past-deadline", "stop-at-12", "stop-at-10-next-boundary-12"])
def test_deadline_stop_and_resume_equal_an_uninterrupted_run(store, deadline, stop):
    uri, full = store
    assert full.stopped is None and full.steps == 24
    part = train(small(), tracking_uri=uri, experiment="t", progress=False, log_every=4, deadline=deadline())
    assert part.stopped == "deadline" and part.steps == stop
    r = tracking.Run(uri, part.run_id).get()
    assert r.info.status == "FINISHED" and r.data.tags["hmmscope.stopped"] == "deadline"
    assert r.data.tags["hmmscope.stopped_at_step"] == str(part.steps)
    assert "val/loss" in part.metrics and part.metrics["val/loss"] != full.metrics["val/loss"]
    rest = train(small(), tracking_uri=uri, experiment="t", progress=False, log_every=4, resume=part.run_id)
    assert rest.stopped is None and rest.steps == 24 and rest.run_id == part.run_id
    assert tracking.Run(uri, part.run_id).get().data.tags["hmmscope.stopped"] == "done"
    a, _ = load_model(uri, full.run_id)
    b, _ = load_model(uri, rest.run_id)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    ha, hb = history(uri, full.run_id), history(uri, rest.run_id)
    assert ha == hb and [s for s, _ in ha["train/loss"]] == list(range(4, 25, 4))
    assert [s for s, _ in ha["val/loss"]] == [0, 8, 16, 24]
    assert rest.metrics["val/loss"] == full.metrics["val/loss"]


def test_a_real_deadline_is_kept(store):
    """A run far longer than its deadline stops by it, at a logging boundary (no wall-time assertion: on a
    loaded machine the setup before the first boundary alone can outlast 1.5 s; the chain rehearsal in
    analysis/gpu/chain-rehearsal.md measures the margins)."""
    uri, _ = store
    part = train(small(**{"train.steps": 5000}), tracking_uri=uri, experiment="t", progress=False, log_every=4,
                 deadline=Deadline.after(1.5, margin_s=0.1))
    assert part.stopped == "deadline" and 4 <= part.steps < 5000 and part.steps % 4 == 0


def test_cli_deadline_stops_prints_how_to_continue_and_resumes(store, tmp_path, monkeypatch):
    from hmmscope.cli import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    sets = [a for k, v in SMALL.items() if k != "train.device" for a in ("--set", f"{k}={v}")]
    r = runner.invoke(app, ["train", *sets, "--device", "cpu", "--deadline", "0", "--out", "figs",
                            "--tracking-uri", store[0], "--experiment", "cli"])
    assert r.exit_code == 0, r.output
    assert "stopped by the deadline at step" in r.output and not (tmp_path / "figs").exists()  # no Figure 1 yet
    again = shlex.split(r.output.split("continue with:")[1].strip().splitlines()[0].replace(" [--deadline SECONDS]", ""))
    assert again[:2] == ["hmmscope", "train"] and "--resume" in again
    r2 = runner.invoke(app, [*again[1:], "--no-evaluate"])
    assert r2.exit_code == 0, r2.output
    assert "24 steps" in r2.output and "stopped by the deadline" not in r2.output
    assert again[again.index("--tracking-uri") + 1] == store[0]
    (run,) = tracking.client(store[0]).search_runs([tracking.experiment_id(store[0], "cli")])
    assert run.info.status == "FINISHED" and run.data.tags["hmmscope.stopped"] == "done"


def test_chain_state_reads_a_stopped_then_finished_run(store, monkeypatch):
    """analysis/gpu/chain.py state: what session.sh chain decides on (train on / Figures / start over)."""
    import importlib.util
    from pathlib import Path

    uri, _ = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = importlib.util.spec_from_file_location(
        "chain", Path(__file__).resolve().parents[1] / "analysis" / "gpu" / "chain.py")
    chain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chain)
    assert chain.state("no-such-experiment") == "none"
    part = train(small(), tracking_uri=uri, experiment="chain", progress=False, log_every=4, deadline=StopAt(8))
    assert chain.state("chain") == f"{part.run_id} 8 24 deadline"
    train(small(), tracking_uri=uri, experiment="chain", progress=False, log_every=4, resume=part.run_id)
    assert chain.state("chain") == f"{part.run_id} 24 24 done"
