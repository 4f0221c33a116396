"""Housekeeping of sweep studies: list a storage's studies, export a study's trials, delete a study with its runs.

Owns `sweep list / export / delete`. Reads studies through study.py and storage.py (never changes a trial's
state); MLflow only through tracking/; never torch, the jobs or the worker.

Conventions. A study is an Optuna study in a storage (storage.py: SQLite, PostgreSQL or a journal file). An
hmmscope sweep records its MLflow parent run (study user attr "mlflow_parent_run_id", see study.py) and each
trial its runs (user attrs "mlflow_run_id", "mlflow_analysis_run_id"); runs below a run carry MLflow's tag
`mlflow.parentRunId`. The runs of a study are its parent run, the runs its trials name, and every run below
those (a trial's analysis run, a theory run's settings), found in the experiments those runs live in.

Deleting. `delete_study` finds every run first, then deletes the runs (MLflow's delete: the runs leave every
search and the UI; `mlflow gc` purges them for good), then the Optuna study. Runs go first, so a delete cut
short leaves the study, and running it again finds and deletes what is left. Nothing here asks: the CLI asks
before it calls `delete_study`, and a refusal calls nothing. A sweep that is still written is never deleted
(`live_writers`, checked before anything is deleted): a RUNNING trial whose worker still beats (its heartbeat within
the spec's grace period), a parent run a `sweep run` holds (its lease alive), a run another process holds (a `train
--resume`: `delete_study` takes each run's lease while it deletes it, so one taken meanwhile stops it too).

Export. One row per trial, in trial order: number, state, value, start and end (ISO 8601, as Optuna records
them), one column per param ("param.<key>": a WAITING trial shows its enqueued values), one per user attr
("attr.<key>", JSON for anything that is not a number or a string), and the MLflow run id. Only tracking/
talks to MLflow.
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import tracking
from ..config import ConfigError
from ..tracking.liveness import live_owner
from .protocol import TrialStore
from .status import retried_numbers
from .storage import open_storage, quiet_optuna
from .study import ATTR_PARENT, load_study, spec_of_study, stored_spec

RUN_ATTRS = ("mlflow_run_id", "mlflow_analysis_run_id")
# `sweep list`'s count columns: a failed trial that was put back is "retried" (status.py), not "failed"
LIST_STATES = {"COMPLETE": "complete", "FAIL": "failed", "RETRIED": "retried", "PRUNED": "pruned", "RUNNING": "running",
               "WAITING": "waiting"}


def _study(name: str, storage_url: str):
    return load_study(name, storage_url)


def _trial_params(t) -> dict[str, Any]:
    return dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))  # WAITING: the enqueued point


def list_studies(storage_url: str) -> list[dict[str, Any]]:
    """One row per study in the storage: name, kind, trial count, counts per state (LIST_STATES: a failed trial that was
    retried counts as retried, never failed), experiment, parent run."""
    quiet_optuna()
    storage = open_storage(storage_url, create=False)
    rows = []
    for s in sorted(optuna.get_all_study_summaries(storage, include_best_trial=False), key=lambda s: s.study_name):
        trials = storage.get_all_trials(s._study_id, deepcopy=False)
        retried = retried_numbers(trials)  # failed and put back: retried, not failed (status.py)
        states = Counter("RETRIED" if t.state.name == "FAIL" and t.number in retried else t.state.name for t in trials)
        kind = experiment = None
        text = (stored_spec(s.user_attrs) or {}).get("text")
        if text:
            try:
                sw = tomllib.loads(text).get("sweep", {})
                kind, experiment = sw.get("kind", "train"), sw.get("experiment", "hmmscope-sweeps")
            except tomllib.TOMLDecodeError:
                pass
        rows.append({"study": s.study_name, "kind": kind, "trials": s.n_trials,
                     **{LIST_STATES[st]: states.get(st, 0) for st in LIST_STATES},
                     "experiment": experiment, "parent_run": s.user_attrs.get(ATTR_PARENT)})
    return rows


def _cell(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str)) and not isinstance(v, bool):
        return "" if v is None else v
    return json.dumps(v)


def export_rows(name: str, storage_url: str) -> list[dict[str, Any]]:
    """One row per trial (see the module docstring); every row has the same columns."""
    trials = _study(name, storage_url).get_trials(deepcopy=False)
    pkeys = sorted({k for t in trials for k in _trial_params(t)} - {"seed"})
    akeys = sorted({k for t in trials for k in t.user_attrs} - {"mlflow_run_id", "seed"})
    rows = []
    for t in trials:
        params = _trial_params(t)
        seed = t.user_attrs.get("seed", params.get("seed"))  # the replicate seed (a param in older studies)
        row = {"number": t.number, "state": t.state.name, "value": _cell(t.value), "seed": _cell(seed),
               "datetime_start": t.datetime_start.isoformat() if t.datetime_start else "",
               "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else ""}
        row.update({f"param.{k}": _cell(params.get(k)) for k in pkeys})
        row.update({f"attr.{k}": _cell(t.user_attrs.get(k)) for k in akeys})
        row["mlflow_run_id"] = t.user_attrs.get("mlflow_run_id") or ""
        rows.append(row)
    return rows


@dataclass(frozen=True)
class StudyRuns:
    """What deleting a study removes: the study (its trial count) and its MLflow runs."""

    study: str
    n_trials: int
    n_running: int  # trials a worker is running now (or was, if it died)
    parent_run: str | None
    run_ids: tuple[str, ...]  # parent first, then the rest (trials and the runs below them)
    experiments: tuple[str, ...]
    live_trials: tuple[str, ...] = ()  # RUNNING trials whose worker still beats: 'trial N (host:pid)'
    grace_period: float | None = None  # the spec's: a RUNNING trial without a beat for this long is stale


def _live_trials(name: str, storage_url: str) -> tuple[tuple[str, ...], float | None]:
    """The study's RUNNING trials that are not stale (their worker beat within the spec's grace period), as
    'trial N (host:pid)', and the grace period; nothing for a study without a stored spec (it cannot be judged)."""
    try:
        spec = spec_of_study(name, storage_url)
    except ConfigError:
        return (), None
    study = load_study(name, storage_url, spec)
    stale = set(TrialStore.of(study, storage_url, spec.grace_period).stale_trial_ids())
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t._trial_id not in stale:
            w = t.user_attrs.get("worker") or {}
            out.append(f"trial {t.number}" + (f" ({w.get('host', '?')}:{w.get('pid', '?')})" if w else ""))
    return tuple(out), float(spec.grace_period)


def live_writers(found: StudyRuns, uri: str) -> str | None:
    """Why the study cannot be deleted now (one line), or None: workers alive, or its parent run held by a `sweep
    run` whose lease is alive. (A run another process holds is refused by `delete_study`, which takes each lease.)"""
    if found.live_trials:
        return (f"sweep {found.study!r} is still running: {len(found.live_trials)} trial(s) RUNNING whose workers are "
                f"alive ({', '.join(found.live_trials[:3])}{', ...' if len(found.live_trials) > 3 else ''}: a "
                f"heartbeat within the last {found.grace_period:g} s); stop its `sweep run` / workers first, or wait")
    if found.parent_run:
        run = tracking.get_run(uri, found.parent_run)
        owner = live_owner(run) if run is not None else None
        if owner is not None:
            return (f"sweep {found.study!r} is still running: its parent run {found.parent_run} is held by {owner} "
                    "(its `sweep run`); stop it first")
    return None


def study_runs(name: str, storage_url: str, uri: str) -> StudyRuns:
    """Find (without changing anything) the study's MLflow runs; ConfigError if its parent run is not in `uri`."""
    study = _study(name, storage_url)
    trials = study.get_trials(deepcopy=False)
    parent = study.user_attrs.get(ATTR_PARENT)
    roots = [parent] if parent else []
    roots += [t.user_attrs[k] for t in trials for k in RUN_ATTRS if t.user_attrs.get(k)]
    found: dict[str, Any] = {}
    for rid in dict.fromkeys(roots):
        run = tracking.get_run(uri, rid)
        if run is None:
            if rid == parent:
                raise ConfigError(f"study {name!r}: its MLflow parent run {rid} is not in {uri}; pass the "
                                  "--tracking-uri the sweep used")
            continue
        if run.info.lifecycle_stage == "active":
            found[rid] = run
    exps = sorted({r.info.experiment_id for r in found.values()})
    children: dict[str, list[str]] = {}
    if exps:
        for r in tracking.search_runs(uri, experiment_ids=exps):
            p = r.data.tags.get("mlflow.parentRunId")
            if p:
                children.setdefault(p, []).append(r.info.run_id)
    order, todo = [], list(found)
    while todo:
        rid = todo.pop(0)
        if rid in order:
            continue
        order.append(rid)
        todo += children.get(rid, [])
    names = [tracking.client(uri).get_experiment(e).name for e in exps]
    running = sum(t.state.name == "RUNNING" for t in trials)
    live, grace = _live_trials(name, storage_url)
    return StudyRuns(name, len(trials), running, parent, tuple(order), tuple(names), live, grace)


def delete_study(found: StudyRuns, storage_url: str, uri: str) -> None:
    """Delete the runs `study_runs` found, then the Optuna study (see the module docstring for the order); ConfigError
    (nothing deleted) when the sweep is still written (`live_writers`), RunHeld when another process holds one of its
    runs (each run's lease is taken first, and held while the runs are deleted)."""
    why = live_writers(found, uri)
    if why is not None:
        raise ConfigError(why)
    with contextlib.ExitStack() as held:
        for rid in found.run_ids:
            if rid != found.parent_run:  # the parent is shared by every `sweep run` of it: no lease (live_writers)
                try:
                    held.enter_context(tracking.hold_run(uri, rid))
                except tracking.RunHeld as e:
                    raise tracking.RunHeld(f"sweep {found.study!r} is not deleted: {e}") from None
        for rid in found.run_ids:
            tracking.delete_run(uri, rid)
        optuna.delete_study(study_name=found.study, storage=open_storage(storage_url, create=False))
