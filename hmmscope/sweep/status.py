"""Status and housekeeping of a sweep: its trials counted and listed, its orphan MLflow runs marked KILLED.

Owns `counts` and `best_trial` (read by run_sweep and the report), `study_status` (`sweep status`) and
orphan collection. Reads studies only (never changes a trial's state: that is protocol.py's); imports
study.py and tracking (lazily); never torch, the jobs or the worker.

Orphan runs: MLflow runs carry host, pid and a heartbeat (tracking/). `run_sweep` (at its start and
end), `run_worker` (when it stops) and `sweep status` mark the sweep experiment's stale RUNNING runs KILLED
with the reason (`tracking.gc_runs`), e.g. the run of a SIGKILLed worker. A retry that resumes such a run
(trial.py) sets it RUNNING again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .study import load_study, spec_of_study


def counts(study, finished: set[int] | None = None) -> dict[str, int]:
    """Trials by state: complete, pruned, failed (not retried), running, waiting, retried (failed, then retried).
    `finished`: count the finished states (complete, pruned, failed, retried) among these trial numbers only."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
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
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    return [t.number for t in sorted(done, key=lambda t: (t.datetime_complete or t.datetime_start, t.number))]


def best_trial(study, among: set[int] | None = None):
    """The COMPLETE trial with the best value (the study's direction), or None; `among`: of these numbers only."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and (among is None or t.number in among)]
    if not done:
        return None
    return (min if study.direction.name == "MINIMIZE" else max)(done, key=lambda t: t.value)


def study_status(study_name: str, storage_url: str) -> list[dict[str, Any]]:
    """One row per trial: number, state, params (with the replicate seed), seed, value, mlflow_run_id,
    retried_from, reason, worker."""
    study = load_study(study_name, storage_url)
    rows = []
    for t in study.get_trials(deepcopy=False):
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))  # WAITING: the enqueued point
        if "seed" in t.user_attrs:
            params["seed"] = t.user_attrs["seed"]
        rows.append({"number": t.number, "state": t.state.name, "params": params, "seed": params.get("seed"),
                     "value": t.value,
                     "mlflow_run_id": t.user_attrs.get("mlflow_run_id"),
                     "retried_from": t.system_attrs.get("failed_trial"),
                     "reason": None if t.state.name in ("COMPLETE", "RUNNING", "WAITING")
                     else t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned_reason"),
                     "worker": t.user_attrs.get("worker")})
    return rows


def collect_orphans(uri: str, experiment: str, log: Callable[[str], None]) -> list:
    """Mark the experiment's orphan RUNNING MLflow runs KILLED (tracking.gc_runs); log each one."""
    from .. import tracking

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
