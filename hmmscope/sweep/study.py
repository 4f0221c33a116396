"""The study of a sweep: created once with every trial enqueued, its spec stored with it, its MLflow parent run.

Owns study creation and loading, the spec as study user attrs, and the link to the sweep's parent run.
Imports storage.py and protocol.py (the parent link is recorded once through `TrialStore`), tracking/
(the parent run); never torch, the jobs or the worker.

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
- The spec (text, canonical sha256, base config) is stored as study user attrs: all four in one attr, "spec" (ATTR_SPEC,
  written in one call, so a reader sees the old spec or the new one whole: `stored_spec`), then each in its own
  (spec_text, spec_path, base_config, spec_hash: what studies from before read; the hash last marks a study whose
  creation is complete). A study another process is still creating (no hash yet) is waited for while its trials are
  being enqueued.
- Growth. Creating a study that exists with a different spec hash raises ConfigError naming each key that differs
  (spec_diff.py), unless the change grows the sweep: more seeds, more levels on grid axes. Then the new spec is stored
  and the new cells (grid point x seed) enqueued, under the storage's mutex as one step (`TrialStore.enqueue_missing`:
  the spec first, so that a worker that claims a new cell reads a spec that has it); its trials and runs are kept. A
  grid study missing cells of its stored spec (a growth cut short between the two writes) gets them on its next
  resume. The parent run's tags say so (hmmscope.grown, hmmscope.spec_hash), as do its description and sweep.toml;
  its params stay those it was created with (MLflow params are written once). `check_change` is the same decision,
  reading only (`status.resume_plan`: `sweep run` says it before it writes or prints anything else).
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
from collections.abc import Callable
from typing import Any

import optuna

from .. import tracking
from ..config import ConfigError, flatten, from_flat
from .protocol import TrialStore
from .spec import SweepSpec, legacy_hash, parse_spec
from .spec_diff import GRID_KINDS, Change, compare, grid_kinds, refusal, shown
from .storage import ensure_storage, open_storage, quiet_optuna, safe_url, storage_kind, storage_url

ATTR_HASH, ATTR_TEXT, ATTR_PATH, ATTR_BASE, ATTR_PARENT = ("spec_hash", "spec_text", "spec_path",
                                                           "base_config", "mlflow_parent_run_id")
ATTR_SPEC = "spec"  # text, path, base config and hash in one attr: written in one call (module docstring)


def stored_spec(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The spec a study's user attrs hold, {"text", "path", "base", "hash"}: the one attr "spec", else (a study from
    before it) the four of their own; None for a study whose creation is not complete. With "kinds": how its trials
    record each grid axis (spec_diff.GRID_KINDS; {}: all categorical, a study from before it)."""
    whole, kinds = attrs.get(ATTR_SPEC), {"kinds": attrs.get(GRID_KINDS) or {}}
    if isinstance(whole, dict) and {"text", "base", "hash"} <= set(whole):
        return {"path": "<stored spec>", **whole, **kinds}
    if ATTR_HASH not in attrs or ATTR_TEXT not in attrs:
        return None
    return {"text": attrs[ATTR_TEXT], "path": attrs.get(ATTR_PATH, "<stored spec>"), "base": attrs.get(ATTR_BASE, {}),
            "hash": attrs[ATTR_HASH], **kinds}


def sampler(spec: SweepSpec):
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=spec.sampler_seed)
    return optuna.samplers.RandomSampler(seed=spec.sampler_seed)  # grid: every trial is enqueued


def pruner(spec: SweepSpec):
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.prune_startup, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def load_study(study_name: str, url: str, spec: SweepSpec | None = None):
    """The study `study_name` in storage `url` (with the spec's sampler, pruner and heartbeat settings when
    given); ConfigError if there is none. Reading never creates a journal file."""
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
    stored = stored_spec(load_study(study_name, url).user_attrs)
    if stored is None:
        raise ConfigError(f"study {study_name!r} in {url} is not a complete hmmscope sweep (no spec stored)")
    return _parsed(stored)


def _parsed(stored: dict[str, Any]) -> SweepSpec:
    spec = parse_spec(stored["text"], stored["path"], base=from_flat(stored["base"]))
    return dataclasses.replace(spec, hash=stored["hash"])


def check_change(stored: dict[str, Any], spec: SweepSpec, url: str) -> Change:
    """How `spec` differs from the `stored` one (`stored_spec`) of its study: Change() when it is the same sweep (its
    identity, or the legacy one), its growth when it grows it (module docstring); ConfigError, one line naming each
    key that differs, for any other change."""
    have = stored["hash"]
    if have in (spec.hash, legacy_hash(spec)):
        return Change()
    where = f"{spec.path}: sweep.name: study {spec.name!r} exists in {safe_url(url)}"
    unnamed = ConfigError(f"{where} with a different spec (hash {have} != {spec.hash}); rename the sweep")
    try:
        old = _parsed(stored)
    except Exception:  # a stored spec this code cannot read: no key to name
        raise unnamed from None
    change = compare(old, spec, stored.get("kinds"))
    if change.same:  # another hash, no key to name (a study this code's identity does not cover): as before, refused
        raise unnamed
    if change.other:
        raise ConfigError(f"{where} with a different spec: {refusal(change)}; rename the sweep (more seeds and more "
                          "grid levels grow it; nothing else does)")
    return change


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


def create_study(spec: SweepSpec, url: str, uri: str, log: Callable[[str], object] | None = None):
    """Create (or load, or grow) the study with every trial enqueued and the MLflow parent run.

    Returns (study, parent_run_id, created). An existing study with a different spec hash -> ConfigError, unless the
    change grows it (module docstring; `log` gets one line saying how). Safe to call from several processes at once:
    one creates the study, one parent run is kept, one grows it.
    """
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
        study.set_user_attr(GRID_KINDS, grid_kinds(spec))  # how its trials record each grid axis (spec_diff.py)
        if spec.sampler == "grid":
            points = [({k: v for k, v in pt.items() if k != "seed"}, pt["seed"]) for pt in spec.grid_points()]
        else:
            points = [({}, spec.seeds[i % len(spec.seeds)]) for i in range(spec.n_trials)]
        for i, (pt, seed) in enumerate(points):
            study.enqueue_trial(pt, user_attrs={"slot": i, "seed": seed}, skip_if_exists=False)
        store_spec(study, spec)  # the hash last: marks the study complete
    grown = Change()
    if not created:
        _wait_complete(study)
        stored = stored_spec(study.user_attrs)
        if stored is None:
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {safe_url(url)} but is not "
                              "a complete hmmscope sweep; choose another name or delete it")
        before = _parsed_or_none(stored)
        grown = check_change(stored, spec, url)  # a change that does not grow it: refused here, nothing written
        if grown.grows or _missing(study, spec):
            grown = _grow(study, spec, url) or Change()  # None: another process grew it first
        elif stored["hash"] != spec.hash:
            store_spec(study, spec)  # a study stored with the legacy hash: the same sweep
        elif _readable(study) and (stored["text"] != spec.text or stored["base"] != flatten(spec.base)):
            store_spec(study, spec)  # same sweep, new run-time keys (device, heartbeat, ...): workers use these
        if grown.grows and log is not None:
            n0 = before.n_trials if before is not None else "?"
            log(f"sweep {spec.name!r} grows: {'; '.join(grown.grows)} ({n0} -> {spec.n_trials} trials; the trials it "
                "has are kept, only the new cells run)")
    parent = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        parent = _new_parent(spec, url, uri, TrialStore.of(study, url))
    with contextlib.suppress(Exception):  # the winner may have died between recording its run and this tag
        prun = tracking.existing_run(uri, parent)
        if prun.get().data.tags.get("hmmscope.kind") != "sweep":
            prun.set_tags({"hmmscope.kind": "sweep"})
        if grown.grows:  # its params stay as created (MLflow writes a param once): tags, description and spec say it
            had = prun.get().data.tags.get("hmmscope.grown")
            prun.set_tags({"hmmscope.spec_hash": spec.hash, "mlflow.note.content": parent_note(spec),
                           "hmmscope.grown": "; ".join([*([had] if had else []), *grown.grows])[:5000]})
            prun.log_dict(spec.text, "sweep.toml")
        tracking.save_sweep_view(uri, prun.get())  # the trials' columns in MLflow's runs table
    return study, parent, created


def _parsed_or_none(stored: dict[str, Any]) -> SweepSpec | None:
    try:
        return _parsed(stored)
    except Exception:
        return None


def _cells(spec: SweepSpec) -> list[tuple[dict[str, Any], int]]:
    """A grid spec's cells: (its point's params, its seed), in grid order."""
    return [({k: v for k, v in pt.items() if k != "seed"}, pt["seed"]) for pt in spec.grid_points()]


def _cell_key(keys: list[str], params: dict[str, Any], seed: Any) -> tuple:
    def same(v: Any) -> str:  # a number as a float: an int level read back from a float range is the same cell
        return repr(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else shown(v)

    return tuple(same(params.get(k)) for k in keys), same(seed)


def _trial_cell(keys: list[str]):
    """A trial's cell key: its params (a WAITING trial's enqueued ones) and its replicate seed (user attr; a study from
    when it was a param: that param)."""
    def key(t) -> tuple:
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))
        return _cell_key(keys, params, t.user_attrs.get("seed", params.get("seed")))

    return key


def _missing(study, spec: SweepSpec) -> bool:
    """Does the grid study lack a trial for a cell of `spec` (a growth cut short)? Reads only."""
    if spec.sampler != "grid":
        return False
    keys = [p.key for p in spec.space]
    have = {_trial_cell(keys)(t) for t in study.get_trials(deepcopy=False)}
    return any(_cell_key(keys, pt, seed) not in have for pt, seed in _cells(spec))


def _grow(study, spec: SweepSpec, url: str) -> Change | None:
    """Store the grown spec and enqueue its new cells, as one step under the storage's mutex (module docstring);
    the change (checked again under the mutex: another process may have grown the study since), None if the spec
    was stored already."""
    keys = [p.key for p in spec.space]
    store = TrialStore.of(study, url)
    change: list[Change] = []

    def first() -> None:  # under the mutex, before the new cells are enqueued
        stored = stored_spec(store.storage.get_study_user_attrs(store.study_id))
        if stored is None or stored["hash"] == spec.hash:
            return
        change.append(check_change(stored, spec, url))
        store_spec(study, spec)

    slot0 = 1 + max((t.user_attrs.get("slot", t.number) for t in study.get_trials(deepcopy=False)), default=-1)
    points = [(pt, {"slot": slot0 + i, "seed": seed}) for i, (pt, seed) in enumerate(_cells(spec))]
    store.enqueue_missing(points, lambda params, attrs: _cell_key(keys, params, attrs["seed"]), _trial_cell(keys),
                          first=first)
    return change[0] if change else None


def _new_parent(spec: SweepSpec, url: str, uri: str, store: TrialStore) -> str:
    """Create a candidate parent run and record it unless another process recorded one first (then delete
    ours); returns the recorded parent run id."""
    params = {f"sweep.{k}": v for k, v in (("name", spec.name), ("kind", spec.kind),
                                           ("objective", spec.objective), ("direction", spec.direction),
                                           ("sampler", spec.sampler), ("pruner", spec.pruner),
                                           ("n_trials", spec.n_trials), ("seeds", list(spec.seeds)))}
    params.update({f"sweep.space.{p.key}": list(p.grid) if p.grid else [p.low, p.high, p.log, p.step]
                   for p in spec.space})
    with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", params=params, note=parent_note(spec),
                            tags={"hmmscope.kind": "sweep-candidate", "hmmscope.study": spec.name,
                                  "hmmscope.spec_hash": spec.hash, "hmmscope.storage": safe_url(url)}) as run:
        run.log_dict(spec.text, "sweep.toml")
    parent = store.set_study_attr_once(ATTR_PARENT, run.run_id)
    if parent != run.run_id:  # another process won: ours was never used
        tracking.delete_run(uri, run.run_id)
    return parent


def parent_note(spec: SweepSpec) -> str:
    """The parent run's description: what the sweep runs (its report puts the answer in front of it)."""
    varied = ", ".join(p.key for p in spec.space) or "nothing"
    return (f"Sweep {spec.name!r}: {spec.n_trials} {spec.kind} trials ({spec.sampler} over {varied}; seeds "
            f"{', '.join(map(str, spec.seeds))}); objective {spec.objective} ({spec.direction})")


def _readable(study) -> bool:
    """Does the study's stored spec parse? (One that does not is never overwritten: its workers fail loudly.)"""
    return _parsed_or_none(stored_spec(study.user_attrs) or {}) is not None


def store_spec(study, spec: SweepSpec) -> None:
    """Store the spec with the study: all of it in one attr (ATTR_SPEC: one write, so a reader never sees half of it),
    then its text, path, base config and, last, its identity hash, each in its own (module docstring)."""
    study.set_user_attr(ATTR_SPEC, {"text": spec.text, "path": spec.path, "base": flatten(spec.base),
                                    "hash": spec.hash})
    study.set_user_attr(ATTR_TEXT, spec.text)
    study.set_user_attr(ATTR_PATH, spec.path)
    study.set_user_attr(ATTR_BASE, flatten(spec.base))
    study.set_user_attr(ATTR_HASH, spec.hash)
