"""Status and housekeeping of a sweep: its trials counted and listed, its orphan MLflow runs marked KILLED.

Owns `counts` and `best_trial` (read by run_sweep and the report), `study_status` (`sweep status`), `resume_plan`
(what `sweep run` is about to do, said first), `interrupted_lines` (what an interrupted one kept) and orphan
collection. Reads studies only (never changes a trial's
state: that is protocol.py's); imports study.py, storage.py and tracking; never torch, the jobs or the worker.

Retried trials. A trial that failed and was put back (`retried_numbers`: a later trial's retry_history names it) is
"retried" wherever trials are counted or listed (counts, `sweep status`, `sweep list`, the report, `sweep run`'s
summary), never "failed": its cell is the retry's. Only a failure with no retry after it is a failure.

Orphan runs: MLflow runs carry host, pid and a heartbeat (tracking/). `run_sweep` (at its start and
end), `run_worker` (when it stops) and `sweep status` mark the sweep experiment's stale RUNNING runs KILLED
with the reason (`tracking.gc_runs`), e.g. the run of a SIGKILLed worker. A retry that resumes such a run
(trial.py) sets it RUNNING again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from .. import tracking
from ..config import ConfigError
from .storage import journal_path
from .study import check_change, load_study, spec_of_study, stored_spec


def retried_numbers(trials) -> set[int]:
    """The numbers of the trials that were retried: each failed and a later trial took its place (module docstring)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])}


def counts(study, finished: set[int] | None = None) -> dict[str, int]:
    """Trials by state: complete, pruned, failed (not retried), running, waiting, retried (failed, then retried).
    `finished`: count the finished states (complete, pruned, failed, retried) among these trial numbers only."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    c = {"complete": 0, "pruned": 0, "failed": 0, "running": 0, "waiting": 0, "retried": 0}
    for t in trials:
        if finished is not None and t.number not in finished and t.state not in (TrialState.RUNNING,
                                                                                  TrialState.WAITING):
            continue
        if t.state == TrialState.COMPLETE:
            c["complete"] += 1
        elif t.state == TrialState.PRUNED:
            c["pruned"] += 1
        elif t.state == TrialState.FAIL:
            c["retried" if t.number in retried else "failed"] += 1
        elif t.state == TrialState.RUNNING:
            c["running"] += 1
        elif t.state == TrialState.WAITING:
            c["waiting"] += 1
    return c


def finish_order(study) -> list[int]:
    """The numbers of the finished trials (complete, pruned, failed) in the order they finished (their completion
    time, then number): the k-th is the trial after which k trials had finished."""
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    return [t.number for t in sorted(done, key=lambda t: (t.datetime_complete or t.datetime_start, t.number))]


def best_trial(study, among: set[int] | None = None):
    """The COMPLETE trial with the best value (the study's direction), or None; `among`: of these numbers only."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and (among is None or t.number in among)]
    if not done:
        return None
    return (min if study.direction.name == "MINIMIZE" else max)(done, key=lambda t: t.value)


def study_status(study_name: str, storage_url: str) -> list[dict[str, Any]]:
    """One row per trial: number, state (Optuna's), params (with the replicate seed), seed, value, mlflow_run_id,
    retried_from, retried_as (the trial that took a retried one's place: module docstring; else None), reason, worker."""
    study = load_study(study_name, storage_url)
    rows = []
    trials = study.get_trials(deepcopy=False)
    retried_as = {t.system_attrs["retry_history"][-1]: t.number for t in trials if t.system_attrs.get("retry_history")}
    for t in trials:
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))  # WAITING: the enqueued point
        if "seed" in t.user_attrs:
            params["seed"] = t.user_attrs["seed"]
        rows.append({"number": t.number, "state": t.state.name, "params": params, "seed": params.get("seed"),
                     "value": t.value,
                     "mlflow_run_id": t.user_attrs.get("mlflow_run_id"),
                     "retried_from": t.system_attrs.get("failed_trial"),
                     "retried_as": retried_as.get(t.number) if t.state.name == "FAIL" else None,
                     "reason": None if t.state.name in ("COMPLETE", "RUNNING", "WAITING")
                     else t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned_reason"),
                     "worker": t.user_attrs.get("worker")})
    return rows


@dataclass(frozen=True)
class Plan:
    """What `sweep run` is about to do with a spec (`resume_plan`): a new study of `total` trials, or one that exists
    with `done` of them complete or pruned (and `failed` failed for good), grown from `before` trials by `grows`."""

    total: int
    exists: bool = False
    done: int = 0
    failed: int = 0
    before: int = 0
    grows: tuple[str, ...] = ()

    def line(self) -> str:
        """'' for a new sweep; else e.g. '1 of 4 already done' or 'grows from 4 to 6 trials (sweep.seeds: [0, 1] ->
        [0, 1, 2]): 4 of 6 already done'."""
        if not self.exists:
            return ""
        grow = f"grows from {self.before} to {self.total} trials ({'; '.join(self.grows)}): " if self.grows else ""
        failed = f" ({self.failed} failed: --retry-failed runs {'it' if self.failed == 1 else 'them'} again)" \
            if self.failed else ""
        return f"{grow}{self.done} of {self.total} already done{failed}"


def resume_plan(spec, url: str) -> Plan:
    """What running `spec` on storage `url` does (`Plan`), reading only (no storage file is created): a change that
    neither keeps nor grows the sweep raises ConfigError naming the keys that differ, as `create_study` would, before
    anything is written or printed."""
    jp = journal_path(url)
    if (jp is not None and not jp.is_file()) or (url.startswith("sqlite:///") and not Path(url[10:]).is_file()):
        return Plan(spec.n_trials)
    try:
        study = load_study(spec.name, url)
    except ConfigError:  # no such study (yet)
        return Plan(spec.n_trials)
    stored = stored_spec(study.user_attrs)
    if stored is None:  # another process is creating it: `create_study` waits for it
        return Plan(spec.n_trials, exists=True)
    change = check_change(stored, spec, url)
    c = counts(study)
    before = spec.n_trials
    if change.grows:
        with_old = spec_of_study(spec.name, url)
        before = with_old.n_trials
    return Plan(spec.n_trials, True, c["complete"] + c["pruned"], c["failed"], before, change.grows)


def interrupted_lines(spec, storage: str, resume: str) -> list[str]:
    """What an interrupted `sweep run` says last: what is kept (its trials done, those put back) and how to resume."""
    try:
        rows = study_status(spec.name, storage)
    except Exception:  # the storage out of reach: how to resume still holds
        return [f"sweep {spec.name}: interrupted", f"resume: {resume}"]
    done = sum(r["state"] in ("COMPLETE", "PRUNED") for r in rows)
    waiting = [r for r in rows if r["state"] == "WAITING"]
    back = sum(r["retried_from"] is not None for r in waiting)
    how = "each resumes from its last checkpoint, if any" if spec.kind == "train" else "each starts again"
    return [f"sweep {spec.name}: interrupted; kept: {done} of {spec.n_trials} trials done (their runs stay); "
            f"{back} put back ({how}), {len(waiting) - back} not started",
            f"resume: {resume}"]


def collect_orphans(uri: str, experiment: str, log: Callable[[str], None]) -> list:
    """Mark the experiment's orphan RUNNING MLflow runs KILLED (tracking.gc_runs); log each one."""
    try:
        found = tracking.gc_runs(uri, experiments=[experiment])
    except Exception as e:  # a read-only or unreachable store must not stop the sweep or its status
        log(f"could not check {experiment!r} for orphan runs: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return []
    for r, why in found:
        log(f"marked orphan run {r.info.run_id} ({r.info.run_name}) KILLED: {why}")
    return found


def study_orphans(study_name: str, storage_url: str, uri: str, log: Callable[[str], None]) -> list:
    """Mark the orphan RUNNING MLflow runs of the study's experiment KILLED (see collect_orphans)."""
    return collect_orphans(uri, spec_of_study(study_name, storage_url).experiment, log)
