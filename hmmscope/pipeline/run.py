"""One run of the pipeline, composed once: train (resumable) -> evaluate -> analyze -> log (`run`).

The CLI's `train`, a sweep's training trial and the main job each call `run`; a step added to every run is added here.

- train: `train`, training (`training.train`) with the pipeline's measurements (`measures.Measures`: the references,
  oracle/*, the emergence curves), as one MLflow run, new or resumed from its checkpoint. The run's lease is held from
  its start to the end of its last step (one writer throughout): a resumed run's before any work, a new run's as
  soon as it opens.
- evaluate: Figure 1 (`evaluation.evaluate_model`) on the model in hand (no checkpoint read back), in the training
  run reopened for it, so a failed evaluation (a full disk) leaves the run FAILED with the reason, not FINISHED
  without its Figure 1. Skipped when training stopped early (a deadline: `--resume` goes on).
- analyze: the layerwise analysis (`analysis.analyze_model`), a child run of the training run: "within" the reopened
  training run (a sweep trial: its run ends after its objective) or "after" it has ended (the main job: a phase
  resumed on its own).
- log: `Steps.logged(run, metrics)` last in the reopened run (a trial logs its objective there); with `log_model`,
  the trained model as an MLflow logged model (the checkpoint stays the resume point).

A caller hears each step through its `steps.Steps` (a spinner, the main job's phases, a trial's links).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import tracking
from ..config import Config, flatten
from ..training.train import TrainResult
from ..training.train import train as train_only
from .analysis import AnalysisResult, analyze_model
from .evaluation import EvalMetrics, evaluate_model
from .measures import Measures
from .steps import Steps

ANALYSIS = (None, "within", "after")  # run(analysis=): none, in the reopened training run, once it has ended


@dataclass
class Outcome:
    trained: TrainResult
    evaluation: EvalMetrics | None = None  # None when not evaluated (a deadline's stop, evaluate=False)
    analysis: AnalysisResult | None = None

    @property
    def metrics(self) -> dict[str, float]:
        """Training's final metrics, Figure 1's and the analysis' (with its claims' numbers), in that order."""
        return {**self.trained.metrics, **(self.evaluation or {}), **(self.analysis.metrics if self.analysis else {})}


def train(cfg: Config, **kw: Any) -> TrainResult:
    """`training.train.train` (its arguments) with the pipeline's measurements: every training run of the pipeline."""
    return train_only(cfg, monitor=Measures(), **kw)


def run(cfg: Config, *, uri: str, experiment: str, run_name: str | None = None, parent: str | None = None,
        resume: str | None = None, tags: dict[str, Any] | None = None, note: str | None = None, progress: bool = False,
        on_start=None, on_eval=None, setup=None, deadline=None, evaluate: bool = True, analysis: str | None = None,
        out: Path | None = None, log_model: bool = False, steps: Steps | None = None) -> Outcome:
    """Train -> evaluate -> analyze -> log, one run of `cfg` (module docstring). The training arguments are `train`'s
    (`on_start(run id)` as soon as the run is open); `out`: the folder Figure 1's and the analysis' files are also
    kept in (else only logged); `analysis`: one of ANALYSIS."""
    if analysis not in ANALYSIS:
        raise ValueError(f"analysis: one of {ANALYSIS}, got {analysis!r}")
    steps = steps or Steps()
    keep = contextlib.ExitStack()  # the run's lease from its start to its last step's end: one writer throughout

    def started(rid: str) -> None:
        if resume is None:
            keep.enter_context(tracking.hold_run(uri, rid))
        if on_start is not None:
            on_start(rid)

    with keep:
        if resume is not None:  # of two started together, one runs, the other stops here with one line naming it
            held = keep.enter_context(tracking.hold_run(uri, resume))
            if held.get("cleaned", (0, 0))[0]:  # the run's temp files its killed writers left (tracking.leftovers)
                steps.cleaned(resume, *held["cleaned"])
        res = train(cfg, tracking_uri=uri, experiment=experiment, run_name=run_name, parent=parent, resume=resume,
                    tags=tags, note=note, progress=progress, on_eval=on_eval, setup=setup, deadline=deadline,
                    on_start=started)
        steps.trained(res)
        done = Outcome(res)
        if evaluate and res.stopped is None:
            _evaluate(done, uri, experiment, cfg.train.device, out, analysis == "within", steps)
        if log_model and res.stopped is None:
            tracking.existing_run(uri, res.run_id).log_model(
                res.model, params={k: v for k, v in flatten(res.config).items() if k.startswith("model.")},
                step=res.steps)
    if analysis == "after" and done.evaluation is not None:
        done.analysis = _analyze(res, tracking.Run(uri, res.run_id), uri, experiment, cfg.train.device, out, steps)
    return done


def _evaluate(done: Outcome, uri: str, experiment: str, device: str, out: Path | None, analyze: bool,
              steps: Steps) -> None:
    """Figure 1 (and, if `analyze`, the analysis) in the reopened training run, then the log step there."""
    res = done.trained
    with steps.evaluating(), tracking.start_run(uri, experiment, "", resume=res.run_id) as run:
        done.evaluation = evaluate_model(res.model, res.config, res.steps, run, device=device, out=out)
        steps.evaluated(run, done.evaluation)
        if analyze:
            done.analysis = _analyze(res, run, uri, experiment, device, out, steps)
        steps.logged(run, done.metrics)


def _analyze(res: TrainResult, run: tracking.Run, uri: str, experiment: str, device: str, out: Path | None,
             steps: Steps) -> AnalysisResult:
    steps.analyzing()
    an = analyze_model(res.model, res.config, res.steps, run, uri=uri, device=device, experiment=experiment, out=out,
                       progress=steps.say)
    steps.analyzed(an)
    return an
