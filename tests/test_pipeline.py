"""The main job (hmmscope.pipeline): Figure 1 and the analysis on the model in memory; a failed evaluation leaves its
training run FAILED; an interrupted main run resumed by the next `run` skips the phases whose runs finished (read back,
not recomputed) and continues an interrupted training from its checkpoint; what is kept, in words; the main run's
identity; `run --quick`'s sizes. Real tiny runs in a sqlite store; the training sweep is a stub (the CLI's test runs
the real one)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hmmscope import tracking
from hmmscope.cli.run import quick_sweep
from hmmscope.config import Config, override
from hmmscope.pipeline import job as pjob
from hmmscope.pipeline import kept as pkept
from hmmscope.pipeline import quick
from hmmscope.pipeline import run as prun
from hmmscope.pipeline.evaluation import evaluate_run
from hmmscope.pipeline.job import MAIN_SWEEP, Phases, main_job
from hmmscope.sweep.spec import parse_spec
from hmmscope.training import checkpoints

torch.set_num_threads(1)

SMALL = {
    "hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2,
    "data.n_demos": 2, "data.l_demo": 6, "data.l_test": 6, "data.n_train": 64, "data.n_eval": 16,
    "model.n_layers": 2, "model.n_heads": 2, "model.d_model": 16, "model.d_mlp": 32, "model.max_len": 64,
    "train.steps": 4, "train.batch_size": 8, "train.warmup": 1, "train.eval_every": 4, "train.ckpt_every": 4,
    "train.device": "cpu", "train.figures": False, "eval.family_tasks": 8, "eval.fit_episodes": 8,
    "train.emergence_episodes": 4,
}
THEORY = {"theory.gammas": (0.5, 0.9), "theory.ranks": (2,), "theory.n_states": (4,), "theory.n_tokens": 4,
          "theory.lengths": (1, 2, 3), "theory.n_histories": 20, "theory.burn_in": 5, "theory.gamma_m": 0,
          "theory.draws": 2}
CFG = override(Config(), {**SMALL, **THEORY})
SPEC = parse_spec(MAIN_SWEEP, "main")


def no_sweep(spec, report_dir):
    """The training sweep's stage as a stub: nothing run, nothing written."""
    return SimpleNamespace(parent_run_id="0" * 32, study_name=spec.name, complete=0, failed=0, pruned=0, n_trials=0,
                           already_complete=False), None


def interrupted_sweep(spec, report_dir):
    raise KeyboardInterrupt("Ctrl-C in the sweep")


class Told(Phases):
    """The phases' events, in order."""

    def __init__(self):
        self.events = []

    def start(self, index, title):
        self.events.append(("start", index))

    def done(self, text):
        self.events.append(("done", text))

    def skip(self, index, title, text):
        self.events.append(("skip", index))


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('pipeline')}/mlflow.db"


def test_main_job_evaluates_and_analyzes_the_model_in_memory(uri, tmp_path, monkeypatch):
    """The main job reads no checkpoint back (no load_checkpoint, no artifact download); its Figure 1 metrics equal
    those of the checkpoint reloaded from its training run, and its analysis sits under that run."""
    reads: list[str] = []
    load, download = checkpoints.load_checkpoint, tracking.Run.download

    def counted_load(*a, **k):
        reads.append("load_checkpoint")
        return load(*a, **k)

    def counted_download(self, path, dst):
        reads.append(path)
        return download(self, path, dst)

    monkeypatch.setattr(checkpoints, "load_checkpoint", counted_load)
    monkeypatch.setattr(tracking.Run, "download", counted_download)
    told = Told()
    res = main_job(CFG, uri, "m", tmp_path / "out", sweep_spec=SPEC, sweep=no_sweep, progress=False, phases=told)
    assert reads == []
    monkeypatch.undo()
    # each phase told as it began and as it ended, in order, nothing skipped
    assert [e if e[0] == "start" else ("done",) for e in told.events] == [
        x for i in range(5) for x in (("start", i), ("done",))]
    ev = evaluate_run(uri, res.train_id, device="cpu")  # the checkpoint, reloaded: the same numbers
    timed = "eval/figure1_s"  # a wall time: the one metric that differs
    assert {k: v for k, v in ev.items() if k != timed} == {k: v for k, v in res.eval_metrics.items() if k != timed}
    assert "eval/seen/test_acc" in ev and ev[timed] > 0 and res.eval_metrics[timed] > 0
    (an,) = tracking.search_runs(uri, "m", parent_id=res.train_id)
    assert an.info.run_id == res.analysis.run_id and an.info.status == "FINISHED"
    assert tracking.read_claims(uri, an)[0]["claim/task_beats_control/value"] == pytest.approx(  # its claims.json
        next(c.value for c in res.analysis.claims if c.name == "task_beats_control"))


def test_a_failed_evaluation_in_the_main_job_leaves_its_training_run_failed(uri, tmp_path, monkeypatch):
    """A full disk while the main job writes Figure 1 (the fault injected where the evaluation's files are written):
    the training run ends FAILED with the reason, as under `train` (it stayed FINISHED without its evaluation)."""
    import errno

    real = prun.evaluate_model

    def full_disk(*a, **k):
        real(*a, **k)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "figure1_by_k.csv"))

    monkeypatch.setattr(prun, "evaluate_model", full_disk)
    cfg = override(CFG, {"theory.gammas": (0.5,), "theory.lengths": (1, 2), "theory.n_histories": 10,
                         "theory.draws": 1})
    with pytest.raises(OSError, match="No space left on device"):
        main_job(cfg, uri, "full", tmp_path / "out", sweep_spec=SPEC, sweep=no_sweep, progress=False)
    runs = {r.info.run_name: r for r in tracking.search_runs(uri, "full")}
    (tr,) = [r for name, r in runs.items() if name.startswith("train-")]
    assert tr.info.status == "FAILED" and "No space left on device" in tr.data.tags["hmmscope.failure_reason"]
    assert runs["main"].info.status == "FAILED"


def test_an_interrupted_main_job_resumes_and_skips_the_phases_that_finished(uri, tmp_path, monkeypatch):
    """Ctrl-C in the sweep: the main run ends KILLED, its theory, training + Figure 1 and analysis runs FINISHED.
    Resumed (the same main run): those phases are skipped (nothing of theirs runs again) and their results read back
    from their runs; only the sweep runs. Before: `run` started everything over."""
    with pytest.raises(KeyboardInterrupt):
        main_job(CFG, uri, "resume", tmp_path / "out", sweep_spec=SPEC, sweep=interrupted_sweep, progress=False)
    main = pkept.latest(uri, "resume", pkept.identity(CFG, SPEC.hash))
    assert main.info.status == "KILLED"
    k = pkept.read(uri, main)
    assert k.done == ["theory", "train", "evaluate", "analysis"] and k.sweep_id is None
    lines = pkept.lines(k, SPEC.name)
    assert lines[0] == f"main run {main.info.run_id}: KILLED" and lines[1] == f"theory: finished (run {k.theory_id})"
    assert lines[2] == f"training and Figure 1: finished (run {k.train_id})"
    assert lines[-1].startswith("sweep smoke: not finished")

    def never(*a, **kw):
        raise AssertionError("a finished phase ran again")

    for name in ("theory_job", "analyze_run"):
        monkeypatch.setattr(pjob, name, never)
    for name in ("train", "evaluate_model", "analyze_model"):  # the pipeline's steps
        monkeypatch.setattr(prun, name, never)
    told = Told()
    res = main_job(CFG, uri, "resume", tmp_path / "out", sweep_spec=SPEC, sweep=no_sweep, progress=False,
                   phases=told, resume=main.info.run_id)
    assert res.parent_id == main.info.run_id and res.skipped == k.done
    assert told.events[:4] == [("skip", 0), ("skip", 1), ("skip", 2), ("skip", 3)] and told.events[4] == ("start", 4)
    assert res.theory is None and res.theory_id == k.theory_id and res.train_id == k.train_id
    train_run = tracking.get_run(uri, k.train_id)
    assert res.eval_metrics["eval/seen/test_acc"] == train_run.data.metrics["eval/seen/test_acc"]
    assert res.eval_metrics.regime == train_run.data.tags["hmmscope.regime"]
    assert {c.name: c.verdict for c in res.eval_metrics.claims} == tracking.read_claims(uri, train_run)[1]
    assert {c.name for c in res.analysis.claims} >= {"task_beats_control"} and res.analysis.run_id == k.analysis_id
    assert len(res.theory_claims) >= 1
    main = tracking.get_run(uri, main.info.run_id)
    assert main.info.status == "FINISHED" and main.data.tags[pkept.PHASE_TAGS["sweep"]] == "0" * 32
    # a resumed resume finds nothing to do but the sweep; a new main run of another configuration is not this one
    assert pkept.latest(uri, "resume", pkept.identity(override(CFG, {"train.steps": 5}), SPEC.hash)) is None


def test_an_interrupted_training_continues_from_its_checkpoint(uri, tmp_path, monkeypatch):
    """Killed after the checkpoint at step 2 of 4: the resumed main job skips the theory and continues the same
    training run from that checkpoint (tagged hmmscope.resumed_from_step = 2), then evaluates and analyzes it."""
    cfg = override(CFG, {"train.ckpt_every": 2, "train.eval_every": 2})
    real, calls = prun.train, []

    def cut(*a, **kw):  # the first training stops after step 2, as a kill would (the run ends KILLED)
        calls.append(kw.get("resume"))
        return real(*a, **kw, **({"_stop_after": 2} if len(calls) == 1 else {}))

    monkeypatch.setattr(prun, "train", cut)
    with pytest.raises(KeyboardInterrupt):
        main_job(cfg, uri, "cut", tmp_path / "out", sweep_spec=SPEC, sweep=no_sweep, progress=False)
    main = pkept.latest(uri, "cut", pkept.identity(cfg, SPEC.hash))
    k = pkept.read(uri, main)
    assert k.done == ["theory"] and k.train_status == "KILLED" and k.checkpoint
    assert "resumes from its last checkpoint" in pkept.lines(k, "smoke")[2]
    told = Told()
    res = main_job(cfg, uri, "cut", tmp_path / "out", sweep_spec=SPEC, sweep=no_sweep, progress=False, phases=told,
                   resume=main.info.run_id)
    assert calls == [None, k.train_id] and res.train_id == k.train_id and told.events[0] == ("skip", 0)
    tr = tracking.get_run(uri, k.train_id)
    assert tr.info.status == "FINISHED" and tr.data.tags["hmmscope.resumed_from_step"] == "2"
    assert "eval/seen/test_acc" in tr.data.metrics and res.analysis.claims


def test_the_identity_is_the_computation_not_how_it_runs():
    ident = pkept.identity(CFG, SPEC.hash)
    assert pkept.identity(override(CFG, {"train.device": "auto", "train.figures": True}), SPEC.hash) == ident
    assert pkept.identity(override(CFG, {"train.steps": 5}), SPEC.hash) != ident
    assert pkept.identity(CFG, quick_sweep(SPEC).hash) != ident


def test_quick_is_every_phase_smaller_and_its_own_sweep():
    cfg = override(Config(), quick.QUICK)
    full = Config()
    assert cfg.train.steps < full.train.steps and cfg.data.n_train < full.data.n_train
    assert len(cfg.theory.gammas) >= 3 and cfg.theory.draws >= 2 and cfg.theory.n_states[0] < full.theory.n_states[0]
    assert cfg.model.n_layers >= 2  # the analysis compares layers
    s = quick_sweep(SPEC)
    assert s.name == quick.QUICK_SWEEP != SPEC.name and s.hash != SPEC.hash and s.n_trials == SPEC.n_trials
    assert [p.key for p in s.space] == [p.key for p in SPEC.space]  # the same design, smaller
    trial = s.trial_config(s.grid_points()[0])
    assert trial.train.steps == quick.QUICK_SWEEP_SETS["train.steps"] < SPEC.trial_config(SPEC.grid_points()[0]).train.steps


def test_the_readmes_first_main_job_is_the_quick_one_then_the_full_one():
    block = (Path(__file__).resolve().parents[1] / "README.md").read_text().split("```bash\n", 1)[1].split("```")[0]
    runs = [ln.split("#")[0].split() for ln in block.splitlines() if "hmmscope run" in ln]
    assert [r[1:] for r in runs[:2]] == [["run", "--quick"], ["run"]], runs


def test_one_composition_of_the_run_pipeline():
    """Issue 49: train -> evaluate -> analyze -> log is composed once (pipeline.run.run). The CLI's `train`, the sweep's
    training trial and the main job call it; none of them calls training, Figure 1 or the analysis of a model in hand
    itself (before: each wrote the sequence out, three times)."""
    import ast

    import hmmscope

    root = Path(hmmscope.__file__).parent
    for rel in ("cli/jobs.py", "sweep/trial.py", "pipeline/job.py"):
        imported = {(n.module, a.name) for n in ast.walk(ast.parse((root / rel).read_text()))
                    if isinstance(n, ast.ImportFrom) for a in n.names}
        assert ("pipeline.run", "run") in imported or ("run", "run") in imported, rel  # ..pipeline.run / .run
        names = {name for _, name in imported}
        assert not names & {"train", "evaluate_model", "analyze_model"}, rel
