"""Sweeps: Optuna studies over config keys, one MLflow run per trial under one parent run (SCIENCE.md 7).

The spec format: see `sweep_spec.py`.

Design:

- Grid = enqueued trials. At study creation every grid point x seed is enqueued (WAITING) with its
  params; tpe/random studies get `n_trials` empty enqueued trials (the sampler fills them in when
  popped). Workers only ever pop WAITING trials (never create new ones), so the number of trials is
  fixed up front and "exhausted" means no WAITING and no RUNNING trial left. Re-running a finished
  sweep does nothing.
- Seeds: a replicate sets train.seed and data.seed (kind theory: theory.seed) to the seed; hmm.seed
  stays the base value, so replicates share the HMM mixture and differ in data sample and init.
  The seed is the trial's user attr "seed", fixed when the trial is enqueued (grid: every point x seed;
  tpe/random: slot i gets seeds[i % len(seeds)]) and inherited by a retry. It is not an Optuna param, so
  samplers never tune it and optuna-dashboard never ranks it among the hyperparameters. (Studies created
  before this kept it as the param "seed"; their trials still read it from there.)
- Claims: every change of a trial's state is one conditional UPDATE through the storage's SQLAlchemy
  engine that succeeds for exactly one process on SQLite and PostgreSQL alike (`_claim`: WAITING ->
  RUNNING, with the trial's first heartbeat in the same transaction; `_finish`: RUNNING -> COMPLETE /
  PRUNED / FAIL, value and reason in the same transaction). Never read-then-write: Optuna's
  `set_trial_state_values` reads the row with SELECT ... FOR UPDATE, which SQLite ignores, so two workers
  could both claim one trial, or both fail one stale trial and enqueue two retries. `optuna.Study.tell`
  is not used (its sampler hook is a no-op for the random and TPE samplers used here).
- Heartbeats: RDBStorage(heartbeat_interval, grace_period). A worker killed mid-trial leaves its trial
  RUNNING; once its heartbeat is older than grace_period the next worker poll fails it (one winner,
  `_fail_stale`, user attr fail_reason "stale: ...") and enqueues a WAITING copy with the same params
  (`_retry`: system attrs "failed_trial" = the original number and "retry_history", as Optuna's
  RetryHeartbeatStaleTrialCallback; at most max_retry retries). Workers keep polling while trials are
  RUNNING, so a sweep finishes only when every slot has a finished trial. A trial whose worker finished its
  MLflow run but died before `_finish` is retried the same way; its finished run is never counted, because
  the report reads one run per COMPLETE trial (user attr mlflow_run_id).
- The spec (text, canonical sha256, base config) is stored as study user attrs; creating a study that
  exists with a different spec hash raises ConfigError. A study another process is still creating (no
  hash yet) is waited for while its trials are being enqueued.
- MLflow: one parent run "sweep-<name>" per study; its id is the study user attr "mlflow_parent_run_id",
  set by a conditional insert (the attr key is unique per study): processes that start the same sweep at
  once each create a candidate (tag hmmscope.kind "sweep-candidate"), one wins the insert and tags its
  candidate "sweep", the others delete theirs. Each trial's training run (or theory run) is its child,
  named after what varies (`SweepSpec.trial_name`, e.g. "rope-g0.5-s0"), tagged hmmscope.trial (the trial
  number) / hmmscope.study, with its kind's params (training: hmm/data/model/train; theory: theory), a
  one-line mlflow.note.content, and the objective also as the metric `Objective/<objective>` (first in the
  MLflow UI's metric lists). The trial links back: user attrs mlflow_run_id, mlflow_experiment_id and
  mlflow_run_url (`tracking.run_url`). The study's metric name is the objective (`set_metric_names`). The parent is
  RUNNING while `run_sweep` waits for its workers and ends FINISHED when it returns (KILLED on Ctrl-C);
  bare `run_worker` calls never touch its status.
- Orphan runs: MLflow runs carry host, pid and a heartbeat (tracking.py). `run_sweep` (at its start and
  end), `run_worker` (when it stops) and `sweep status` mark the sweep experiment's stale RUNNING runs
  KILLED with the reason (`tracking.gc_runs`), e.g. the run of a SIGKILLed worker.
- Interrupts: Ctrl-C or SIGTERM to `run_sweep` sends SIGTERM to its workers (by pid; SIGKILL after 10 s);
  a worker so stopped marks its trial FAIL (user attr fail_reason="interrupted"), enqueues a WAITING
  copy with the same params and exits; its MLflow run ends KILLED, as does the parent. Running the sweep
  again resumes it. A worker killed with SIGKILL cannot clean up: its trial is retried after grace_period
  (above) and its run is marked KILLED as an orphan.
- GPUs: when the trials train on device "cuda" or "auto", `run_sweep` gives worker i the GPU
  visible[i % len(visible)] through CUDA_VISIBLE_DEVICES (visible: the CUDA_VISIBLE_DEVICES list if set,
  else torch's device count); `sweep worker --gpu I` pins a joining worker to visible GPU I. The worker's
  host, pid and GPU are recorded on each trial it runs (user attr "worker").
- Pruned trials: the MLflow run ends FAILED with hmmscope.failure_reason "TrialPruned: ..."; the Optuna
  trial is PRUNED. Diverged (or otherwise failing) trials are FAIL with user attr "fail_reason"; the
  sweep continues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import ConfigError, flatten, from_flat
from .sweep_spec import Param, SweepSpec, legacy_hash, parse_spec

ATTR_HASH, ATTR_TEXT, ATTR_PATH, ATTR_BASE, ATTR_PARENT = ("spec_hash", "spec_text", "spec_path",
                                                           "base_config", "mlflow_parent_run_id")


# ---------------------------------------------------------------- storage and study


def default_storage() -> str:
    """sqlite:///<cwd>/mlruns/optuna.db, its schema created once under a file lock."""
    db = (Path("mlruns") / "optuna.db").resolve()
    url = f"sqlite:///{db}"
    ensure_storage(url)
    return url


def ensure_storage(url: str) -> None:
    """Create the Optuna schema once (sqlite: under a file lock beside the database; an existing database
    that cannot be written is left as it is, with no lock file)."""
    if not url.startswith("sqlite:///"):
        _storage(url)
        return
    import filelock

    from .tracking import writable

    db = Path(url[len("sqlite:///"):])
    if db.exists() and not writable(db):
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(db.parent / ".optuna.lock")):
        _storage(url)


def _storage(url: str, spec: SweepSpec | None = None):
    import optuna

    kw: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kw["engine_kwargs"] = {"connect_args": {"timeout": 120}}
    if spec is not None:
        kw.update(heartbeat_interval=spec.heartbeat_interval, grace_period=spec.grace_period,
                  heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                      max_retry=spec.max_retry))
    return optuna.storages.RDBStorage(url, **kw)


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", module="optuna")
    with contextlib.suppress(Exception):
        from optuna.exceptions import ExperimentalWarning

        warnings.filterwarnings("ignore", category=ExperimentalWarning)


def _sampler(spec: SweepSpec):
    import optuna

    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=spec.sampler_seed)
    return optuna.samplers.RandomSampler(seed=spec.sampler_seed)  # grid: every trial is enqueued


def _pruner(spec: SweepSpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.prune_startup, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def _load(study_name: str, storage_url: str, spec: SweepSpec | None = None):
    import optuna

    _quiet_optuna()
    try:
        return optuna.load_study(study_name=study_name, storage=_storage(storage_url, spec),
                                 sampler=_sampler(spec) if spec else None, pruner=_pruner(spec) if spec else None)
    except KeyError:
        raise ConfigError(f"no sweep study {study_name!r} in {_safe_url(storage_url)}") from None


def spec_of_study(study_name: str, storage_url: str) -> SweepSpec:
    """The spec stored with a study, with the base config as stored (a config file may have changed since)."""
    import dataclasses

    attrs = _load(study_name, storage_url).user_attrs
    if ATTR_HASH not in attrs:
        raise ConfigError(f"study {study_name!r} in {storage_url} is not a complete hmmscope sweep (no spec stored)")
    spec = parse_spec(attrs[ATTR_TEXT], attrs.get(ATTR_PATH, "<stored spec>"), base=from_flat(attrs[ATTR_BASE]))
    return dataclasses.replace(spec, hash=attrs[ATTR_HASH])


def _wait_complete(study, quiet_s: float = 30.0) -> None:
    """Wait while another process is still enqueueing the study's trials (no spec hash yet)."""
    last, seen = time.time(), -1
    while ATTR_HASH not in study.user_attrs:
        n = len(study._storage.get_all_trials(study._study_id, deepcopy=False))
        if n != seen:
            last, seen = time.time(), n
        elif time.time() - last > quiet_s:
            return
        time.sleep(0.2)


def create_study(spec: SweepSpec, storage_url: str, uri: str):
    """Create (or load) the study with every trial enqueued and the MLflow parent run.

    Returns (study, parent_run_id, created). An existing study with a different spec hash -> ConfigError.
    Safe to call from several processes at once: one creates the study, one parent run is kept.
    """
    import optuna

    from . import tracking

    _quiet_optuna()
    ensure_storage(storage_url)
    tracking.ensure_store(uri)
    storage = _storage(storage_url, spec)
    created = False
    try:
        study = optuna.create_study(study_name=spec.name, storage=storage, sampler=_sampler(spec),
                                    pruner=_pruner(spec), direction=spec.direction)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=_sampler(spec),
                                  pruner=_pruner(spec))
    if created:
        study.set_metric_names([spec.objective])
        if spec.sampler == "grid":
            points = [({k: v for k, v in pt.items() if k != "seed"}, pt["seed"]) for pt in spec.grid_points()]
        else:
            points = [({}, spec.seeds[i % len(spec.seeds)]) for i in range(spec.n_trials)]
        for i, (pt, seed) in enumerate(points):
            study.enqueue_trial(pt, user_attrs={"slot": i, "seed": seed}, skip_if_exists=False)
        _store_spec(study, spec)  # the hash last: marks the study complete
    else:
        _wait_complete(study)
        have = study.user_attrs.get(ATTR_HASH)
        if have is None:
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {storage_url} but is not "
                              "a complete hmmscope sweep; choose another name or delete it")
        if have != spec.hash and have != legacy_hash(spec):
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {storage_url} with a "
                              f"different spec (hash {have} != {spec.hash}); rename the sweep")
        if have != spec.hash:
            study.set_user_attr(ATTR_HASH, spec.hash)  # a study stored with the legacy hash: the same sweep
        if _readable(study) and (study.user_attrs.get(ATTR_TEXT) != spec.text
                                 or study.user_attrs.get(ATTR_BASE) != flatten(spec.base)):
            _store_spec(study, spec)  # same sweep, new run-time keys (device, heartbeat, ...): workers use these
    parent = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        params = {f"sweep.{k}": v for k, v in (("name", spec.name), ("kind", spec.kind),
                                               ("objective", spec.objective), ("direction", spec.direction),
                                               ("sampler", spec.sampler), ("pruner", spec.pruner),
                                               ("n_trials", spec.n_trials), ("seeds", list(spec.seeds)))}
        params.update({f"sweep.space.{p.key}": list(p.grid) if p.grid else [p.low, p.high, p.log, p.step]
                       for p in spec.space})
        varied = ", ".join(p.key for p in spec.space) or "nothing"
        note = (f"Sweep {spec.name!r}: {spec.n_trials} {spec.kind} trials ({spec.sampler} over {varied}; seeds "
                f"{', '.join(map(str, spec.seeds))}); objective {spec.objective} ({spec.direction})")
        with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", params=params, note=note,
                                tags={"hmmscope.kind": "sweep-candidate", "hmmscope.study": spec.name,
                                      "hmmscope.spec_hash": spec.hash, "hmmscope.storage": _safe_url(storage_url)}) as run:
            run.log_dict(spec.text, "sweep.toml")
        parent = _set_parent(study, run.run_id)
        if parent != run.run_id:  # another process won: ours was never used
            tracking.delete_run(uri, run.run_id)
    with contextlib.suppress(Exception):  # the winner may have died between its insert and this tag
        prun = tracking.existing_run(uri, parent)
        if prun.get().data.tags.get("hmmscope.kind") != "sweep":
            prun.set_tags({"hmmscope.kind": "sweep"})
    return study, parent, created


def _readable(study) -> bool:
    """Does the study's stored spec parse? (One that does not is never overwritten: its workers fail loudly.)"""
    attrs = study.user_attrs
    try:
        parse_spec(attrs[ATTR_TEXT], attrs.get(ATTR_PATH, "<stored spec>"), base=from_flat(attrs[ATTR_BASE]))
    except Exception:
        return False
    return True


def _store_spec(study, spec: SweepSpec) -> None:
    """Store the spec with the study (its text, path, base config, then its identity hash)."""
    study.set_user_attr(ATTR_TEXT, spec.text)
    study.set_user_attr(ATTR_PATH, spec.path)
    study.set_user_attr(ATTR_BASE, flatten(spec.base))
    study.set_user_attr(ATTR_HASH, spec.hash)


def _set_parent(study, run_id: str) -> str:
    """Record `run_id` as the study's parent run unless one is recorded already; returns the recorded one."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    attrs = models.StudyUserAttributeModel.__table__
    try:
        with _rdb(study).engine.begin() as conn:
            conn.execute(sa.insert(attrs).values(study_id=study._study_id, key=ATTR_PARENT, value_json=json.dumps(run_id)))
        return run_id
    except sa.exc.IntegrityError:  # (study_id, key) is unique: another process recorded its run first
        return study.user_attrs[ATTR_PARENT]


def _safe_url(url: str) -> str:
    """A storage URL without its password."""
    import re

    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


# ---------------------------------------------------------------- trials


def _suggest(trial, p: Param) -> Any:
    if p.grid is not None:
        return trial.suggest_categorical(p.key, list(p.grid))
    if p.is_int:
        return trial.suggest_int(p.key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.key, float(p.low), float(p.high), step=p.step, log=p.log)


def make_prune_hook(trial, objective: str) -> Callable[[int, dict[str, float]], None]:
    """train(on_eval=...) hook: report the objective at each evaluation; raise TrialPruned when told to."""
    import optuna

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        v = metrics.get(objective)
        if v is None or not math.isfinite(v):
            return
        trial.report(float(v), step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"{objective}={v:.4g} at step {step} is worse than the median")

    return on_eval


def _theory_metrics(result) -> dict[str, float]:
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
    from . import tracking

    trial.set_user_attr(f"{prefix}_run_id", run_id)
    with contextlib.suppress(Exception):
        eid = tracking.client(uri).get_run(run_id).info.experiment_id
        trial.set_user_attr(f"{prefix}_experiment_id", eid)
        trial.set_user_attr(f"{prefix}_run_url", tracking.run_url(uri, eid, run_id))


def run_trial(trial, spec: SweepSpec, uri: str, parent: str) -> float:
    """One trial: config -> train + evaluate (+ analyze), or one theory setting; returns the objective."""
    from . import jobs, tracking

    params = {p.key: _suggest(trial, p) for p in spec.space}
    seed = trial_seed(trial, spec)
    cfg = spec.trial_config({**params, "seed": seed})
    name = spec.trial_name(params, seed)
    note = trial_note(spec, trial.number, params, seed)
    tags = {"hmmscope.trial": trial.number, "hmmscope.study": spec.name, "hmmscope.kind": f"sweep-{spec.kind}",
            "hmmscope.sweep_parent": parent, "hmmscope.seed": seed}
    if spec.kind == "theory":
        with tempfile.TemporaryDirectory() as tmp:
            result, run_id = jobs.theory_job(cfg.theory, Path(tmp), uri=uri, experiment=spec.experiment,
                                             parent=parent, run_name=name, tags=tags, note=note)
        _link(trial, uri, run_id)
        metrics = _theory_metrics(result)
        run = tracking.existing_run(uri, run_id)
        run.log_metrics(metrics)  # the setting's numbers on the trial run itself, for side-by-side comparison
    else:
        from .train import train

        hook = make_prune_hook(trial, spec.prune_metric) if spec.pruner != "none" else None
        res = train(cfg, tracking_uri=uri, experiment=spec.experiment, run_name=name, parent=parent,
                    progress=False, on_eval=hook, tags=tags, note=note)
        _link(trial, uri, res.run_id)
        run = tracking.existing_run(uri, res.run_id)
        metrics = {**res.metrics, **jobs.evaluate_run(uri, res.run_id, device=cfg.train.device)}
        if spec.analyze:
            an = jobs.analyze_run(uri, res.run_id, device=cfg.train.device, experiment=spec.experiment)
            metrics.update(an.metrics)
            _link(trial, uri, an.run_id, prefix="mlflow_analysis")
    if spec.objective not in metrics:
        raise KeyError(f"objective {spec.objective!r} is not among the trial's metrics "
                       f"({', '.join(sorted(metrics)[:20])}, ...)")
    value = float(metrics[spec.objective])
    run.log_metrics({tracking.objective_key(spec.objective): value})
    return value


# ---------------------------------------------------------------- trial states (one winner each)


def _rdb(study):
    """The study's RDBStorage (optuna wraps it in a cache that reads unfinished trials through)."""
    s = study._storage
    return getattr(s, "_backend", s)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # RDBStorage keeps naive UTC datetimes


def _claim(study) -> int | None:
    """Claim one WAITING trial: WAITING -> RUNNING for exactly one worker, first heartbeat included."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    trials, beats = models.TrialModel.__table__, models.TrialHeartbeatModel.__table__
    engine = _rdb(study).engine
    for t in study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,)):
        with engine.begin() as conn:
            r = conn.execute(sa.update(trials)
                             .where(trials.c.trial_id == t._trial_id, trials.c.state == TrialState.WAITING)
                             .values(state=TrialState.RUNNING, datetime_start=_now()))
            if r.rowcount == 1:
                conn.execute(sa.delete(beats).where(beats.c.trial_id == t._trial_id))
                conn.execute(sa.insert(beats).values(trial_id=t._trial_id, heartbeat=sa.func.current_timestamp()))
                return t._trial_id
    return None


def _finish(study, trial_id: int, state, value: float | None = None, attrs: dict[str, Any] | None = None) -> bool:
    """RUNNING -> `state` (with its value and user attrs) if the trial is still RUNNING; False if another
    process finished it first (e.g. failed it as stale)."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    trials, values = models.TrialModel.__table__, models.TrialValueModel
    uattrs = models.TrialUserAttributeModel.__table__
    with _rdb(study).engine.begin() as conn:
        r = conn.execute(sa.update(trials)
                         .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.RUNNING)
                         .values(state=state, datetime_complete=_now()))
        if r.rowcount != 1:
            return False
        if value is not None:
            stored, kind = values.value_to_stored_repr(value)
            conn.execute(sa.insert(values.__table__).values(trial_id=trial_id, objective=0, value=stored,
                                                            value_type=kind))
        for k, v in (attrs or {}).items():
            conn.execute(sa.delete(uattrs).where(uattrs.c.trial_id == trial_id, uattrs.c.key == k))
            conn.execute(sa.insert(uattrs).values(trial_id=trial_id, key=k, value_json=json.dumps(v)))
    return True


_NOT_INHERITED = ("mlflow_run_id", "mlflow_experiment_id", "mlflow_run_url", "mlflow_analysis_run_id",
                  "mlflow_analysis_experiment_id", "mlflow_analysis_run_url", "fail_reason", "pruned_reason", "worker")


def _retry(study, trial_id: int, max_retry: int | None) -> int | None:
    """Enqueue a WAITING copy of a failed trial (same params), as RetryHeartbeatStaleTrialCallback does,
    without the failed run's MLflow ids and reasons. Returns the new trial's number (None: retries used up)."""
    import optuna
    from optuna.trial import TrialState

    t = study._storage.get_trial(trial_id)
    history = [*t.system_attrs.get("retry_history", []), t.number]
    if max_retry is not None and len(history) > max_retry:
        return None
    system = {**t.system_attrs, "failed_trial": t.system_attrs.get("failed_trial", t.number), "retry_history": history}
    copy = optuna.trial.create_trial(
        state=TrialState.WAITING, params=t.params, distributions=t.distributions,
        user_attrs={k: v for k, v in t.user_attrs.items() if k not in _NOT_INHERITED}, system_attrs=system)
    return study._storage.get_trial(study._storage.create_new_trial(study._study_id, template_trial=copy)).number


def _fail_stale(study, spec: SweepSpec, log: Callable[[str], None]) -> None:
    """Fail trials whose worker stopped beating (one process wins each) and retry them."""
    from optuna.trial import TrialState

    for tid in _rdb(study)._get_stale_trial_ids(study._study_id):
        reason = f"stale: no heartbeat for over {spec.grace_period} s (worker died)"
        if _finish(study, tid, TrialState.FAIL, attrs={"fail_reason": reason}):
            new = _retry(study, tid, spec.max_retry)
            log(f"trial {study._storage.get_trial(tid).number} failed ({reason}); "
                + (f"retried as trial {new}" if new is not None else "no retries left"))


# ---------------------------------------------------------------- workers


@contextlib.contextmanager
def _heartbeat(storage, trial_id: int, interval: float):
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    th = threading.Thread(target=beat, daemon=True, name=f"heartbeat-{trial_id}")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def _counts(study) -> dict[str, int]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    c = {"complete": 0, "pruned": 0, "failed": 0, "running": 0, "waiting": 0, "retried": 0}
    for t in trials:
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


def collect_orphans(uri: str, experiment: str, log: Callable[[str], None]) -> list:
    """Mark the experiment's orphan RUNNING MLflow runs KILLED (tracking.gc_runs); log each one."""
    from . import tracking

    try:
        found = tracking.gc_runs(uri, experiments=[experiment])
    except Exception as e:  # a read-only or unreachable store must not stop the sweep or its status
        log(f"could not check {experiment!r} for orphan runs: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return []
    for r, why in found:
        log(f"marked orphan run {r.info.run_id} ({r.info.run_name}) KILLED: {why}")
    return found


def run_worker(study_name: str, storage_url: str, uri: str, *, max_trials: int | None = None,
               log: Callable[[str], None] | None = None) -> int:
    """Pull WAITING trials of the study and run them until none are left (or max_trials); returns trials run."""
    import optuna
    from optuna.trial import TrialState

    from . import tracking

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    uri = tracking.resolve_uri(uri)
    spec = spec_of_study(study_name, storage_url)
    study = _load(study_name, storage_url, spec)
    parent = study.user_attrs[ATTR_PARENT]
    worker = {"host": socket.gethostname(), "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
    done = 0
    while max_trials is None or done < max_trials:
        _fail_stale(study, spec, log)  # retries trials of dead workers (after grace_period)
        tid = _claim(study)
        if tid is None:
            if study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(min(2.0, spec.heartbeat_interval))
                continue
            break
        state, value, err, attrs = None, None, None, {}
        with _heartbeat(study._storage, tid, spec.heartbeat_interval):
            with contextlib.suppress(Exception):
                study._storage.set_trial_user_attr(tid, "worker", worker)
            trial = optuna.Trial(study, tid)
            try:
                value = run_trial(trial, spec, uri, parent)
                state = TrialState.COMPLETE
            except optuna.TrialPruned as e:
                state, err, attrs = TrialState.PRUNED, e, {"pruned_reason": str(e)}
            except Exception as e:  # DivergedError and friends: FAIL this trial, carry on
                state, err, attrs = TrialState.FAIL, e, {"fail_reason": f"{type(e).__name__}: {e}"[:2000]}
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: give the slot back (a WAITING copy, same params)
                main = threading.current_thread() is threading.main_thread()
                old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None  # no second cut
                try:
                    if _finish(study, tid, TrialState.FAIL, attrs={"fail_reason": "interrupted"}):
                        _retry(study, tid, spec.max_retry)
                finally:
                    if main:
                        signal.signal(signal.SIGTERM, old)
                raise
        if state == TrialState.COMPLETE and not math.isfinite(value):
            state, err = TrialState.FAIL, ValueError(f"objective {spec.objective} is {value}")
            attrs = {"fail_reason": str(err)}
        if state == TrialState.PRUNED:  # as Study.tell does: a pruned trial's value is its last reported one
            steps = study._storage.get_trial(tid).intermediate_values
            value = steps[max(steps)] if steps else None
        if not _finish(study, tid, state, value if state in (TrialState.COMPLETE, TrialState.PRUNED) else None, attrs):
            log(f"trial {trial.number} was finished by another process (failed as stale?) before this worker "
                f"could record it as {state.name}; this result is dropped")
        elif state == TrialState.COMPLETE:
            log(f"trial {trial.number} complete: {spec.objective}={value:.6g} params={trial.params}")
        else:
            log(f"trial {trial.number} {state.name.lower()}: {type(err).__name__}: {err}")
        done += 1
    collect_orphans(uri, spec.experiment, log)
    return done


@dataclass
class SweepSummary:
    study_name: str
    storage: str
    parent_run_id: str
    n_trials: int  # slots (grid points x seeds, or n_trials)
    complete: int
    failed: int
    pruned: int
    retried: int  # trials lost with their worker and run again
    already_complete: bool
    worker_returncodes: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.complete + self.failed + self.pruned >= self.n_trials

    @property
    def crashed_workers(self) -> list[int]:
        """Exit codes of workers that crashed: an error exit (a traceback) or a crash signal (e.g. SIGSEGV)."""
        return [rc for rc in self.worker_returncodes if rc > 0 or (rc < 0 and -rc not in _STOP_SIGNALS)]

    @property
    def killed_workers(self) -> list[int]:
        """Exit codes (-signal) of workers stopped from outside (SIGKILL, SIGTERM, SIGINT: OOM killer, a user);
        their trials are retried, so the sweep can still finish."""
        return [rc for rc in self.worker_returncodes if rc < 0 and -rc in _STOP_SIGNALS]


_STOP_SIGNALS = {int(getattr(signal, n)) for n in ("SIGKILL", "SIGTERM", "SIGINT") if hasattr(signal, n)}


def worker_command(study_name: str, storage_url: str, uri: str, max_trials: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "hmmscope.sweep", "worker", "--study", study_name, "--storage", storage_url,
           "--uri", uri]
    return cmd + (["--max-trials", str(max_trials)] if max_trials else [])


def worker_env(gpu: str | None = None) -> dict[str, str]:
    """A worker's environment: one torch thread; CUDA_VISIBLE_DEVICES=gpu when given."""
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def visible_gpus() -> list[str]:
    """GPU ids this process may hand out: the CUDA_VISIBLE_DEVICES list if set, else 0..count-1 (torch)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def pin_gpu(index: int) -> str:
    """Restrict this process to visible GPU `index` (sets CUDA_VISIBLE_DEVICES; before CUDA starts)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [g.strip() for g in env.split(",") if g.strip()]
        if not 0 <= index < len(ids):
            raise ConfigError(f"--gpu {index}: CUDA_VISIBLE_DEVICES={env!r} makes {len(ids)} GPU(s) visible")
        gpu = ids[index]
    else:
        if index < 0:
            raise ConfigError(f"--gpu must be >= 0, got {index}")
        gpu = str(index)
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return gpu


def uses_gpu(spec: SweepSpec) -> bool:
    """Do the spec's trials train on device cuda (or auto, which picks a GPU when there is one)?"""
    if spec.kind != "train":
        return False
    points = spec.grid_points() if spec.sampler == "grid" else [{}]
    return any(spec.trial_config(pt).train.device in ("cuda", "auto") for pt in points)


def worker_gpus(spec: SweepSpec, workers: int, gpus: Sequence[str] | None = None) -> list[str | None]:
    """The GPU of each local worker: round-robin over `gpus` (default: visible_gpus()) when the trials use
    cuda; None (environment untouched) otherwise or when no GPU is visible."""
    if gpus is None:
        gpus = visible_gpus() if uses_gpu(spec) else []
    gpus = list(gpus)
    return [gpus[i % len(gpus)] if gpus else None for i in range(workers)]


def run_sweep(spec: SweepSpec, *, workers: int = 1, storage: str | None = None, uri: str | None = None,
              progress: Callable[[dict[str, int], int], None] | None = None,
              log: Callable[[str], None] = print, gpus: Sequence[str] | None = None) -> SweepSummary:
    """Create/resume the study, run `workers` local worker processes until the sweep is exhausted.

    gpus: GPU ids to hand out round-robin (default: see `worker_gpus`).
    """
    from . import tracking

    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    uri = tracking.resolve_uri(uri)
    storage = storage or spec.storage or default_storage()
    study, parent, created = create_study(spec, storage, uri)
    collect_orphans(uri, spec.experiment, log)
    c = _counts(study)
    if not created and c["waiting"] == 0 and c["running"] == 0:
        log(f"sweep {spec.name!r} is complete ({c['complete']} complete, {c['failed']} failed, "
            f"{c['pruned']} pruned); nothing to do")
        return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                            c["retried"], True)
    assigned = worker_gpus(spec, workers, gpus)
    log(f"sweep {spec.name!r}: {spec.n_trials} trials, {workers} workers, storage {_safe_url(storage)}, "
        f"MLflow parent run {parent}" + (f", GPUs {assigned}" if any(g is not None for g in assigned) else ""))
    procs: list[subprocess.Popen] = []

    def on_term(signum, frame):  # a scheduler's SIGTERM ends the sweep like Ctrl-C
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", resume=parent) as prun:
        try:
            for gpu in assigned:
                # own session: a terminal's Ctrl-C reaches only us, and we stop the workers cleanly
                procs.append(subprocess.Popen(worker_command(spec.name, storage, uri), env=worker_env(gpu),
                                              start_new_session=True))
            while any(p.poll() is None for p in procs):
                time.sleep(1.0)
                if progress is not None:
                    progress(_counts(study), spec.n_trials)
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)
                    p.wait()
            raise
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        collect_orphans(uri, spec.experiment, log)  # e.g. the runs of workers that were SIGKILLed
        c = _counts(study)
        prun.log_metrics({f"sweep/{k}": v for k, v in c.items()})
        best = _best(study)
        if best is not None:
            prun.log_metrics({"sweep/best_value": best.value, "sweep/best_trial": best.number})
            prun.set_tags({"hmmscope.best_params": json.dumps(best.params),
                           "hmmscope.best_run": best.user_attrs.get("mlflow_run_id", "")})
    return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                        c["retried"], False, [p.returncode for p in procs])


def _best(study):
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    if not done:
        return None
    return (min if study.direction.name == "MINIMIZE" else max)(done, key=lambda t: t.value)


def study_status(study_name: str, storage_url: str) -> list[dict[str, Any]]:
    """One row per trial: number, state, params (with the replicate seed), seed, value, mlflow_run_id,
    retried_from, reason, worker."""
    study = _load(study_name, storage_url)
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


def study_orphans(study_name: str, storage_url: str, uri: str, log: Callable[[str], None]) -> list:
    """Mark the orphan RUNNING MLflow runs of the study's experiment KILLED (see collect_orphans)."""
    return collect_orphans(uri, spec_of_study(study_name, storage_url).experiment, log)


# ---------------------------------------------------------------- worker entry point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hmmscope.sweep")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run trials of an existing study until it is exhausted")
    w.add_argument("--study", required=True)
    w.add_argument("--storage", required=True)
    w.add_argument("--uri", required=True)
    w.add_argument("--max-trials", type=int, default=None)
    w.add_argument("--gpu", type=int, default=None, help="join with this one visible GPU")
    a = ap.parse_args(argv)
    if a.gpu is not None:
        pin_gpu(a.gpu)

    def on_term(signum, frame):  # run_sweep stops its workers with SIGTERM: hand the trial back, then exit
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    if os.environ.get("HMMSCOPE_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["HMMSCOPE_THREADS"]))
    try:
        n = run_worker(a.study, a.storage, a.uri, max_trials=a.max_trials)
    except KeyboardInterrupt:
        print(f"worker {os.getpid()}: interrupted; its trial was put back", file=sys.stderr, flush=True)
        return 130
    print(f"worker {os.getpid()}: ran {n} trials", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
