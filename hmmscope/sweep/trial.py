"""One trial of a sweep: its config from the trial's params and seed, its MLflow run(s), its objective.

Owns what a claimed trial does (`run_trial`): one run of the pipeline (`pipeline.run`: train -> evaluate (->
analyze) -> its objective logged), one theory setting or one headroom (`jobs`), as a child run of the sweep's parent
run, and the resume of a retried trial from its predecessor's checkpoint. The only sweep module that calls
`trial.suggest_*`. Imports the pipeline and the jobs (lazily: torch and the measurements off the sweep package's
import) and tracking; never the protocol, the study or the worker modules (the worker hands it a claimed trial).

- Runs: each trial's training run (or theory run) is a child of the parent run, linked to the trial as soon as
  it is open (so `sweep status` shows a RUNNING trial's run), named after what varies
  (`SweepSpec.trial_name`, e.g. "rope-g0.5-s0"), tagged hmmscope.trial (the trial number) /
  hmmscope.study / hmmscope.sweep_parent / hmmscope.seed, with its kind's params (training: hmm/data/
  model/train; theory: theory), a one-line mlflow.note.content, and the objective as a metric under the key the
  spec names, once (`_objective`). The trial links back: user attrs
  mlflow_run_id, mlflow_experiment_id and mlflow_run_url (`tracking.run_url` on a server store; on a local
  store, where no UI port is known, the `hmmscope ui --run ID` command that prints it); with analyze, also
  mlflow_analysis_run_id/... for the analysis run. A training trial's run is reopened for its Figure 1 evaluation
  and the objective, so it ends (FINISHED, with its MLflow duration) after them, not when training stops.
- Pruning: the trial reports the prune metric at each evaluation (`make_prune_hook`); a pruned training
  run ends FAILED with hmmscope.failure_reason "TrialPruned: ...".
- Resume (a pre-empted trial). A retry (system attr "retry_history") of a training trial looks for the
  MLflow run of the trial it retries (the last of retry_history): that trial's user attr mlflow_run_id,
  else the child of the parent run tagged with the study and that trial's number (a worker killed
  mid-training never linked its run). If that run did not finish (KILLED, FAILED or still RUNNING as an
  orphan) and has a checkpoint, the retry calls `train(..., resume=<that run>)`: the same MLflow run
  continues in place from its last checkpoint (status RUNNING again, then FINISHED; tag
  hmmscope.resumed_from_step; its hmmscope.trial tag becomes the retry's number) and the retry links to
  it before training, so a second pre-emption resumes it again. On CPU the result is bitwise that of an
  uninterrupted trial (train's resume guarantee). A run that finished (its worker died while evaluating)
  is not resumed: the retry starts a new run, as does a run with no checkpoint or one whose writer is still
  alive (a worker cut off from the network: one writer per run, tracking.hold_run); the report reads only the
  run of each COMPLETE trial. Theory trials always start afresh (they keep no checkpoint).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import tracking
from ..pipeline.steps import Steps
from ..tracking.liveness import live_owner
from .spec import Param, SweepSpec
from .spec_diff import GRID_KINDS


def _suggest(trial, p: Param, kind: str = "categorical") -> Any:
    """The trial's value of `p`. A grid axis as its study records it (`kind`, spec_diff.GRID_KINDS): an int or float
    range over its levels (so the axis can grow), else categorical; a grid trial's value is the one enqueued."""
    if p.grid is not None and kind == "int":
        return trial.suggest_int(p.key, min(p.grid), max(p.grid))
    if p.grid is not None and kind == "float":
        return trial.suggest_float(p.key, min(p.grid), max(p.grid))
    if p.grid is not None:
        return trial.suggest_categorical(p.key, list(p.grid))
    if p.is_int:
        return trial.suggest_int(p.key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.key, float(p.low), float(p.high), step=p.step, log=p.log)


def make_prune_hook(trial, objective: str) -> Callable[[int, dict[str, float]], None]:
    """train(on_eval=...) hook: report the objective at each evaluation; raise TrialPruned when told to."""
    import optuna  # lazy: optuna (~1 s) off the sweep package's import (`sweep status`, `sweep list`)

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        v = metrics.get(objective)
        if v is None or not math.isfinite(v):
            return
        trial.report(float(v), step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"{objective}={v:.4g} at step {step} is worse than the median")

    return on_eval


def theory_metrics(result) -> dict[str, float]:
    (s,) = result.settings
    f = s.rate_fit
    m = {"theory/dobrushin": s.dobrushin, "theory/rate": f.rate, "theory/rate_lo": f.rate_ci[0],
         "theory/rate_hi": f.rate_ci[1], "theory/log_intercept": f.intercept}
    for key, o in (("gamma_O", s.gamma_O), ("gamma_eff", s.gamma_eff), ("gamma_m", s.gamma_m)):
        if o is not None:
            m.update({f"theory/{key}": o["value"], f"theory/{key}_lower": o["lower"], f"theory/{key}_upper": o["upper"]})
    return {k: float(v) for k, v in m.items() if v is not None}


def trial_seed(trial, spec: SweepSpec) -> int:
    """The trial's replicate seed: its user attr "seed" (older studies: the Optuna param "seed")."""
    fixed = trial.study._storage.get_trial(trial._trial_id).system_attrs.get("fixed_params", {})
    if "seed" in fixed or "seed" not in trial.user_attrs:  # a study created when the seed was a param
        return trial.suggest_categorical("seed", list(spec.seeds))
    return int(trial.user_attrs["seed"])


def trial_note(spec: SweepSpec, number: int, params: dict[str, Any], seed: int) -> str:
    """A trial run's one-line description."""
    what = ", ".join(f"{k}={v}" for k, v in params.items())
    return (f"Sweep {spec.name!r} trial {number} ({spec.kind}): {what + ', ' if what else ''}seed {seed}; "
            f"objective {spec.objective} ({spec.direction})")


def _link(trial, uri: str, run_id: str, prefix: str = "mlflow") -> None:
    """User attrs that take a trial to its MLflow run: <prefix>_run_id, _experiment_id, _run_url."""
    trial.set_user_attr(f"{prefix}_run_id", run_id)
    with contextlib.suppress(Exception):
        eid = tracking.client(uri).get_run(run_id).info.experiment_id
        trial.set_user_attr(f"{prefix}_experiment_id", eid)
        url = tracking.run_url(uri, eid, run_id)  # a server store's own URL; a local store has no UI port yet
        trial.set_user_attr(f"{prefix}_run_url", url or tracking.browse_line(uri, run_id=run_id).split(": ", 1)[1])


def resumable_run(trial, spec: SweepSpec, uri: str, parent: str) -> str | None:
    """The unfinished training run, with a checkpoint, of the trial this one retries (module docstring)."""
    from ..training.checkpoints import CKPT_DIR, CKPT_NAME  # lazy: torch (~1 s) off the sweep package's import

    history = trial.study._storage.get_trial(trial._trial_id).system_attrs.get("retry_history")
    if spec.kind != "train" or not history:
        return None
    before = trial.study.trials[history[-1]]
    rid = before.user_attrs.get("mlflow_run_id")
    if rid is None:
        found = tracking.search_runs(uri, spec.experiment, parent_id=parent, filter_string=(
            f"tags.`hmmscope.study` = '{spec.name}' and tags.`hmmscope.trial` = '{before.number}'"))
        rid = found[0].info.run_id if found else None  # newest first
    run = tracking.get_run(uri, rid) if rid else None
    if run is None or run.info.status == "FINISHED" or run.info.lifecycle_stage != "active":
        return None
    if live_owner(run) is not None:  # its worker is alive (cut off, not dead): one writer per run, start afresh
        return None
    try:
        tracking.existing_run(uri, rid).require(f"{CKPT_DIR}/{CKPT_NAME}")
    except (FileNotFoundError, ValueError):
        return None
    return rid


class TrialLost(RuntimeError):
    """Another worker failed this trial as stale and retries it (this worker's heartbeats stopped reaching the
    storage): this worker's run of it stops, and its result is not recorded."""


def run_trial(trial, spec: SweepSpec, uri: str, parent: str, *, lost: threading.Event | None = None,
              opened: list[str] | None = None) -> float:
    """One trial: config -> train + evaluate (+ analyze), one theory setting, or one headroom; returns the objective.

    `lost` (set by the trial's heartbeat, protocol.TrialStore.heartbeat): checked at every evaluation of a training
    trial, which then raises TrialLost (its run ends FAILED with that reason). `opened` gets the id of the training
    run as soon as it is open (the worker ends it if its own end could not be written)."""
    from .. import jobs  # lazy: the jobs import the theory and measurements (numpy, scipy) off the sweep package's

    kinds = trial.study.user_attrs.get(GRID_KINDS) or {}  # a study from before it: every axis categorical
    params = {p.key: _suggest(trial, p, kinds.get(p.key, "categorical")) for p in spec.space}
    seed = trial_seed(trial, spec)
    cfg = spec.trial_config({**params, "seed": seed})
    name = spec.trial_name(params, seed)
    note = trial_note(spec, trial.number, params, seed)
    tags = {"hmmscope.trial": trial.number, "hmmscope.study": spec.name, "hmmscope.kind": f"sweep-{spec.kind}",
            "hmmscope.sweep_parent": parent, "hmmscope.seed": seed}
    if spec.kind == "headroom":  # trains nothing: one run of the references (measure/headroom.py)
        result, run_id = jobs.headroom_job(cfg, uri, spec.experiment, parent=parent, run_name=name, tags=tags, note=note)
        _link(trial, uri, run_id)
        metrics = result.metrics()
        run = tracking.existing_run(uri, run_id)
    elif spec.kind == "theory":
        with tempfile.TemporaryDirectory() as tmp:
            result, run_id = jobs.theory_job(cfg.theory, Path(tmp), uri=uri, experiment=spec.experiment,
                                             parent=parent, run_name=name, tags=tags, note=note)
        _link(trial, uri, run_id)
        metrics = theory_metrics(result)
        run = tracking.existing_run(uri, run_id)
        run.log_metrics(metrics)  # the setting's numbers on the trial run itself, for side-by-side comparison
    else:
        return _trained(trial, spec, uri, parent, cfg, name, tags, note, lost, opened)
    return _objective(run, spec, metrics)


class _TrialSteps(Steps):
    """A training trial's side of the pipeline's steps: its analysis run linked, its objective logged last."""

    def __init__(self, trial, spec: SweepSpec, uri: str):
        self.trial, self.spec, self.uri, self.objective = trial, spec, uri, math.nan

    def analyzed(self, an) -> None:
        _link(self.trial, self.uri, an.run_id, prefix="mlflow_analysis")

    def logged(self, run, metrics: dict[str, float]) -> None:
        self.objective = _objective(run, self.spec, metrics)


def _trained(trial, spec: SweepSpec, uri: str, parent: str, cfg, name: str, tags: dict, note: str,
             lost: threading.Event | None, opened: list[str] | None) -> float:
    """A training trial: the pipeline's run (train -> evaluate -> analyze -> its objective logged) as a child run of
    the sweep's parent; a retry resumes its predecessor's run from its checkpoint. The run is reopened for its
    evaluation (and the objective): it ends after them, as its MLflow duration says; the model in hand: no checkpoint
    read back."""
    resume = resumable_run(trial, spec, uri, parent)
    if resume is not None:  # the run continues in place: it belongs to this trial from now on
        tracking.existing_run(uri, resume).set_tags({"hmmscope.trial": trial.number})
        _link(trial, uri, resume)
    prune = make_prune_hook(trial, spec.prune_metric) if spec.pruner != "none" else None

    def hook(step: int, metrics: dict[str, float]) -> None:
        if lost is not None and lost.is_set():
            raise TrialLost(f"trial {trial.number} is no longer this worker's: failed as stale by another worker, "
                            "which retries it (this worker's heartbeats stopped reaching the storage), or its sweep "
                            "was deleted; this run stops here")
        if prune is not None:
            prune(step, metrics)

    from ..pipeline.run import run  # lazy: torch, the measurements and statsmodels (seconds) off the sweep package's

    steps = _TrialSteps(trial, spec, uri)
    run(cfg, uri=uri, experiment=spec.experiment, run_name=name, parent=parent, resume=resume, tags=tags,
        note=note, on_eval=hook, on_start=lambda rid: _opened(trial, uri, rid, opened),
        analysis="within" if spec.analyze else None, steps=steps)
    return steps.objective


def _opened(trial, uri: str, run_id: str, opened: list[str] | None) -> None:
    """A trial's training run is open: link it (sweep status shows it) and note it (the worker settles it)."""
    if opened is not None:  # noted first: a link that fails (the storage cut off) must not hide the run
        opened.append(run_id)
    _link(trial, uri, run_id)


def _objective(run, spec: SweepSpec, metrics: dict[str, float]) -> float:
    """The trial's objective from its metrics. It is logged on the trial's run once, under the key the spec names:
    by the evaluation (eval/*, val/*, memory/*), the theory or headroom job; an analysis objective (a claim, a probe
    or shuffle metric of the analysis run) is logged on the trial's run here."""
    if spec.objective not in metrics:
        raise KeyError(f"objective {spec.objective!r} is not among the trial's metrics "
                       f"({', '.join(sorted(metrics)[:20])}, ...)")
    value = float(metrics[spec.objective])
    if spec.objective not in run.get().data.metrics:
        run.log_metrics({spec.objective: value})
    return value
