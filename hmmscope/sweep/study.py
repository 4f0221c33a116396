"""The study of a sweep: created once with every trial enqueued, its spec stored with it, its MLflow parent run.

Owns study creation and loading, the spec as study user attrs, and the link to the sweep's parent run.
Imports storage.py and protocol.py (the parent link is recorded once through `TrialStore`), tracking/
lazily (the parent run); never torch, the jobs or the worker.

- Grid = enqueued trials. At creation every grid point x seed is enqueued (WAITING) with its params;
  tpe/random studies get `n_trials` empty enqueued trials (the sampler fills them in when popped).
  Workers only ever claim WAITING trials (never create new ones but retries), so the number of trials is
  fixed up front and "exhausted" means no WAITING and no RUNNING trial left. Re-running a finished sweep
  does nothing.
- Seeds: a replicate sets train.seed and data.seed (kind theory: theory.seed) to the seed; hmm.seed stays
  the base value, so replicates share the HMM mixture and differ in data sample and init. The seed is the
  trial's user attr "seed", fixed when the trial is enqueued (grid: every point x seed; tpe/random: slot i
  gets seeds[i % len(seeds)]) and inherited by a retry. It is not an Optuna param, so samplers never tune it
  and optuna-dashboard never ranks it among the hyperparameters. (Studies created before this kept it as
  the param "seed"; their trials still read it from there.)
- The spec (text, canonical sha256, base config) is stored as study user attrs; creating a study that
  exists with a different spec hash raises ConfigError. A study another process is still creating (no
  hash yet) is waited for while its trials are being enqueued.
- MLflow: one parent run "sweep-<name>" per study; its id is the study user attr "mlflow_parent_run_id",
  recorded once (`TrialStore.set_study_attr_once`): processes that start the same sweep at once each
  create a candidate (tag hmmscope.kind "sweep-candidate"), one records its own, tags it "sweep", and the
  others delete theirs. The study's metric name is the objective (`set_metric_names`). The trials' view in
  MLflow's runs table (the parent's children, best first, the objective and the swept params as columns) is
  saved as the experiment's shared view (`tracking.save_sweep_view`), which `hmmscope ui --sweep` opens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from ..config import ConfigError, flatten, from_flat
from .protocol import TrialStore
from .spec import SweepSpec, legacy_hash, parse_spec
from .storage import ensure_storage, open_storage, quiet_optuna, safe_url, storage_kind, storage_url

ATTR_HASH, ATTR_TEXT, ATTR_PATH, ATTR_BASE, ATTR_PARENT = ("spec_hash", "spec_text", "spec_path",
                                                           "base_config", "mlflow_parent_run_id")


def sampler(spec: SweepSpec):
    import optuna

    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=spec.sampler_seed)
    return optuna.samplers.RandomSampler(seed=spec.sampler_seed)  # grid: every trial is enqueued


def pruner(spec: SweepSpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.prune_startup, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def load_study(study_name: str, url: str, spec: SweepSpec | None = None):
    """The study `study_name` in storage `url` (with the spec's sampler, pruner and heartbeat settings when
    given); ConfigError if there is none. Reading never creates a journal file."""
    import optuna

    quiet_optuna()
    try:
        storage = open_storage(url, spec, create=False)
        return optuna.load_study(study_name=study_name, storage=storage,
                                 sampler=sampler(spec) if spec else None, pruner=pruner(spec) if spec else None)
    except KeyError:
        raise ConfigError(f"no sweep study {study_name!r} in {safe_url(url)}") from None
    except ConfigError as e:  # a journal file that is not there
        raise ConfigError(f"no sweep study {study_name!r} in {safe_url(url)} ({e})") from None


def spec_of_study(study_name: str, url: str) -> SweepSpec:
    """The spec stored with a study, with the base config as stored (a config file may have changed since)."""
    attrs = load_study(study_name, url).user_attrs
    if ATTR_HASH not in attrs:
        raise ConfigError(f"study {study_name!r} in {url} is not a complete hmmscope sweep (no spec stored)")
    spec = parse_spec(attrs[ATTR_TEXT], attrs.get(ATTR_PATH, "<stored spec>"), base=from_flat(attrs[ATTR_BASE]))
    return dataclasses.replace(spec, hash=attrs[ATTR_HASH])


def _wait_complete(study, quiet_s: float = 30.0) -> None:
    """Wait while another process is still enqueueing the study's trials (no spec hash yet)."""
    last, seen = time.time(), -1
    while ATTR_HASH not in study.user_attrs:
        n = len(study.get_trials(deepcopy=False))
        if n != seen:
            last, seen = time.time(), n
        elif time.time() - last > quiet_s:
            return
        time.sleep(0.2)


def create_study(spec: SweepSpec, url: str, uri: str):
    """Create (or load) the study with every trial enqueued and the MLflow parent run.

    Returns (study, parent_run_id, created). An existing study with a different spec hash -> ConfigError.
    Safe to call from several processes at once: one creates the study, one parent run is kept.
    """
    import optuna

    from .. import tracking

    url = storage_url(url)
    storage_kind(url)  # an unsupported storage fails here, before anything is written
    quiet_optuna()
    ensure_storage(url)
    tracking.ensure_store(uri)
    storage = open_storage(url, spec)
    created = False
    try:
        study = optuna.create_study(study_name=spec.name, storage=storage, sampler=sampler(spec),
                                    pruner=pruner(spec), direction=spec.direction)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler(spec), pruner=pruner(spec))
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
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {safe_url(url)} but is not "
                              "a complete hmmscope sweep; choose another name or delete it")
        if have != spec.hash and have != legacy_hash(spec):
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {safe_url(url)} with a "
                              f"different spec (hash {have} != {spec.hash}); rename the sweep")
        if have != spec.hash:
            study.set_user_attr(ATTR_HASH, spec.hash)  # a study stored with the legacy hash: the same sweep
        if _readable(study) and (study.user_attrs.get(ATTR_TEXT) != spec.text
                                 or study.user_attrs.get(ATTR_BASE) != flatten(spec.base)):
            _store_spec(study, spec)  # same sweep, new run-time keys (device, heartbeat, ...): workers use these
    parent = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        parent = _new_parent(spec, url, uri, TrialStore.of(study, url))
    with contextlib.suppress(Exception):  # the winner may have died between recording its run and this tag
        prun = tracking.existing_run(uri, parent)
        if prun.get().data.tags.get("hmmscope.kind") != "sweep":
            prun.set_tags({"hmmscope.kind": "sweep"})
        tracking.save_sweep_view(uri, prun.get())  # the trials' columns in MLflow's runs table
    return study, parent, created


def _new_parent(spec: SweepSpec, url: str, uri: str, store: TrialStore) -> str:
    """Create a candidate parent run and record it unless another process recorded one first (then delete
    ours); returns the recorded parent run id."""
    from .. import tracking

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
                                  "hmmscope.spec_hash": spec.hash, "hmmscope.storage": safe_url(url)}) as run:
        run.log_dict(spec.text, "sweep.toml")
    parent = store.set_study_attr_once(ATTR_PARENT, run.run_id)
    if parent != run.run_id:  # another process won: ours was never used
        tracking.delete_run(uri, run.run_id)
    return parent


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
