"""Sweeps: Optuna studies over config keys, one MLflow run per trial under one parent run (SCIENCE.md 7).

Spec format (TOML, validated strictly by `load_spec` before any study or run exists)::

    [sweep]
    name = "smoke"                 # the Optuna study name
    base = "tiny"                  # a preset, or: config = "path.toml" (relative to the spec file)
    kind = "train"                 # train | theory
    objective = "eval/excess_ce"   # a metric of the trial (train/eval/Figure 1/analysis, or theory/*)
    direction = "minimize"         # minimize | maximize
    sampler = "grid"               # grid | tpe | random
    pruner = "none"                # none | median (train kind: reports objective at every evaluation)
    n_trials = 20                  # tpe / random only; grid = grid size x len(seeds)
    seeds = [0, 1]                 # replicates (see below)
    storage = ""                   # any SQLAlchemy URL; "" = sqlite:///<cwd>/mlruns/optuna.db
    analyze = false                # also run the layerwise analysis (jobs.analyze_run) per trial
    experiment = "hmmscope-sweeps"
    heartbeat_interval = 60        # seconds; a trial whose worker died is retried after grace_period
    grace_period = 180
    max_retry = 2
    sampler_seed = 0
    prune_startup = 2              # MedianPruner: trials completed before pruning starts

    [fixed]                        # dotted config overrides applied to every trial
    "train.steps" = 100

    [space]                        # dotted config key -> one of
    "model.pos_enc" = {grid = ["rope", "absolute"]}
    "train.lr" = {low = 1e-4, high = 1e-2, log = true}     # float (int when both bounds are ints)
    "model.n_layers" = {choices = [2, 4]}                  # categorical (a grid under sampler="grid")
    "x.y" = {low = 1, high = 8, step = 1}

Design:

- Grid = enqueued trials. At study creation every grid point x seed is enqueued (WAITING) with its
  params; tpe/random studies get `n_trials` empty enqueued trials (the sampler fills them in when
  popped). Workers only ever pop WAITING trials (never create new ones), so the number of trials is
  fixed up front and "exhausted" means no WAITING and no RUNNING trial left. Re-running a finished
  sweep does nothing.
- Seeds: a replicate sets train.seed and data.seed (kind theory: theory.seed) to the seed; hmm.seed
  stays the base value, so replicates share the HMM mixture and differ in data sample and init.
  The seed is the Optuna param "seed" (so a retried trial keeps it).
- Heartbeats: RDBStorage(heartbeat_interval, grace_period, RetryHeartbeatStaleTrialCallback(max_retry)).
  A worker killed mid-trial leaves its trial RUNNING; once its heartbeat is older than grace_period the
  next worker poll marks it FAIL and enqueues a WAITING copy with the same params (system attr
  "failed_trial" = the original number). Workers keep polling while trials are RUNNING, so a sweep
  finishes only when every slot has a finished trial.
- The spec (text, canonical sha256, base config) is stored as study user attrs; creating a study that
  exists with a different spec hash raises ConfigError.
- MLflow: one parent run "sweep-<name>" per study (created with the study; its id is the study user attr
  "mlflow_parent_run_id"); each trial's training run (or theory run) is its child, named
  "trial-<number>", tagged hmmscope.trial / hmmscope.study, with `flatten(cfg)` params. The parent is
  RUNNING while `run_sweep` waits for its workers and ends FINISHED when it returns (KILLED on Ctrl-C);
  bare `run_worker` calls never touch its status.
- Interrupts: Ctrl-C or SIGTERM to `run_sweep` sends SIGTERM to its workers (by pid; SIGKILL after 10 s);
  a worker so stopped marks its trial FAIL (user attr fail_reason="interrupted"), enqueues a WAITING
  copy with the same params (the same retry callback) and exits; its MLflow run ends KILLED, as does the
  parent. Running the sweep again resumes it. A worker killed with SIGKILL cannot clean up: its trial
  is retried after grace_period (above) and its MLflow run stays RUNNING (an orphan; the trial's
  mlflow_run_id points at the run that completed). A trial killed before its first heartbeat is never
  seen as stale (an Optuna limitation; the window is the few milliseconds between claim and first beat).
- Pruned trials: the MLflow run ends FAILED with hmmscope.failure_reason "TrialPruned: ..."; the Optuna
  trial is PRUNED. Diverged (or otherwise failing) trials are FAIL with user attr "fail_reason"; the
  sweep continues.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from .config import Config, ConfigError, flatten, from_flat, load_toml, override, preset

SWEEP_KEYS = {"name", "base", "config", "kind", "objective", "direction", "sampler", "pruner", "n_trials",
              "seeds", "storage", "analyze", "experiment", "heartbeat_interval", "grace_period", "max_retry",
              "sampler_seed", "prune_startup"}
TABLES = {"sweep", "fixed", "space"}
KINDS, SAMPLERS, PRUNERS, DIRECTIONS = ("train", "theory"), ("grid", "tpe", "random"), ("none", "median"), \
    ("minimize", "maximize")
DIST_KEYS = {"grid", "choices", "low", "high", "log", "step"}
MAX_GRID = 100_000
ATTR_HASH, ATTR_TEXT, ATTR_PATH, ATTR_BASE, ATTR_PARENT = ("spec_hash", "spec_text", "spec_path",
                                                           "base_config", "mlflow_parent_run_id")


# ---------------------------------------------------------------- spec


@dataclass(frozen=True)
class Param:
    """One search-space entry: `grid`/`choices` (categorical) or low/high[/log/step] (int or float)."""

    key: str
    grid: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None

    @property
    def is_int(self) -> bool:
        return self.grid is None and all(isinstance(v, int) and not isinstance(v, bool)
                                         for v in (self.low, self.high) if v is not None) and \
            (self.step is None or isinstance(self.step, int))

    def distribution(self):
        import optuna.distributions as D

        if self.grid is not None:
            return D.CategoricalDistribution(list(self.grid))
        if self.is_int:
            return D.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return D.FloatDistribution(float(self.low), float(self.high), log=self.log,
                                   step=None if self.step is None else float(self.step))


@dataclass(frozen=True)
class SweepSpec:
    name: str
    path: str  # the spec file (absolute)
    text: str  # its TOML text
    hash: str  # sha256 (16 hex) of the canonical parsed spec and the base config
    base: Config  # preset/config file, before [fixed]
    kind: str = "train"
    objective: str = "eval/excess_ce"
    direction: str = "minimize"
    sampler: str = "grid"
    pruner: str = "none"
    n_trials: int = 0  # total trials (grid: grid size x seeds)
    seeds: tuple[int, ...] = (0,)
    storage: str = ""
    analyze: bool = False
    experiment: str = "hmmscope-sweeps"
    heartbeat_interval: int = 60
    grace_period: int = 180
    max_retry: int = 2
    sampler_seed: int = 0
    prune_startup: int = 2
    fixed: Mapping[str, Any] = field(default_factory=dict)
    space: tuple[Param, ...] = ()

    def grid_points(self) -> list[dict[str, Any]]:
        """Every grid point x seed (sampler grid), in a fixed order."""
        keys = [p.key for p in self.space]
        out = []
        for combo in itertools.product(*[p.grid for p in self.space]):
            for s in self.seeds:
                out.append({**dict(zip(keys, combo)), "seed": s})
        return out

    def trial_config(self, params: Mapping[str, Any]) -> Config:
        """The config of a trial with Optuna params `params` (space keys and "seed")."""
        upd = {**self.fixed, **{k: v for k, v in params.items() if k != "seed"}}
        if "seed" in params:
            upd.update(seed_keys(self.kind, params["seed"]))
        return override(self.base, upd)


def seed_keys(kind: str, seed: int) -> dict[str, int]:
    """Replicate seed -> config keys (the HMM mixture, hmm.seed, is shared by replicates)."""
    return {"theory.seed": seed} if kind == "theory" else {"train.seed": seed, "data.seed": seed}


def _err(path: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {msg}")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_spec(text: str, path: str | Path = "<spec>", *, base: Config | None = None) -> SweepSpec:
    """Parse and validate spec text; ConfigError '<file>: <key>: <why>' on the first problem."""
    path = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    for t in data:
        if t not in TABLES:
            raise _err(path, t, f"unknown table (known: {', '.join(sorted(TABLES))})")
        if not isinstance(data[t], dict):
            raise _err(path, t, "must be a table")
    sw, fixed, space = data.get("sweep", {}), data.get("fixed", {}), data.get("space", {})
    for k in sw:
        if k not in SWEEP_KEYS:
            raise _err(path, f"sweep.{k}", f"unknown key (known: {', '.join(sorted(SWEEP_KEYS))})")

    def get(k: str, typ: type | tuple, default: Any) -> Any:
        v = sw.get(k, default)
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise _err(path, f"sweep.{k}", f"expected {getattr(typ, '__name__', typ)}, got {v!r}")
        return v

    name = get("name", str, "")
    if not name:
        raise _err(path, "sweep.name", "required (the study name)")
    kind = get("kind", str, "train")
    sampler = get("sampler", str, "grid")
    pruner = get("pruner", str, "none")
    direction = get("direction", str, "minimize")
    for k, v, ok in (("kind", kind, KINDS), ("sampler", sampler, SAMPLERS), ("pruner", pruner, PRUNERS),
                     ("direction", direction, DIRECTIONS)):
        if v not in ok:
            raise _err(path, f"sweep.{k}", f"must be one of {ok}, got {v!r}")
    if pruner != "none" and kind != "train":
        raise _err(path, "sweep.pruner", "pruning needs kind='train' (intermediate evaluations)")
    objective = get("objective", str, "theory/rate" if kind == "theory" else "eval/excess_ce")
    seeds = get("seeds", list, [0])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise _err(path, "sweep.seeds", f"must be a non-empty list of distinct ints >= 0, got {seeds!r}")
    ints = {}
    for k, default, lo in (("heartbeat_interval", 60, 1), ("grace_period", None, 1), ("max_retry", 2, 0),
                           ("sampler_seed", 0, 0), ("prune_startup", 2, 0)):
        v = sw.get(k, default)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise _err(path, f"sweep.{k}", f"must be an int >= {lo}, got {v!r}")
        ints[k] = v
    ints.setdefault("grace_period", 3 * ints["heartbeat_interval"])
    if ints["grace_period"] <= ints["heartbeat_interval"]:
        raise _err(path, "sweep.grace_period", "must be > heartbeat_interval")
    # base config
    if base is not None:  # a stored study: its base config as stored
        pass
    elif "base" in sw and "config" in sw:
        raise _err(path, "sweep.config", "give either base (a preset) or config (a file), not both")
    elif "config" in sw:
        cfg_path = Path(get("config", str, ""))
        if not cfg_path.is_absolute():
            cfg_path = Path(path).resolve().parent / cfg_path
        try:
            base = load_toml(cfg_path)
        except ConfigError as e:
            raise _err(path, "sweep.config", str(e)) from None
    else:
        try:
            base = preset(get("base", str, "tiny"))
        except ConfigError as e:
            raise _err(path, "sweep.base", str(e)) from None

    def check_keys(table: str, keys) -> None:
        for k in keys:
            if kind == "theory" and not k.startswith("theory."):
                raise _err(path, f"{table}.{k}", "kind='theory' sweeps only theory.* keys")

    check_keys("fixed", fixed)
    try:
        base_fixed = override(base, fixed)
    except ConfigError as e:
        bad = next((k for k in fixed if _bad_key(base, {k: fixed[k]})), "fixed")
        raise _err(path, f"fixed.{bad}" if bad != "fixed" else "fixed", str(e)) from None
    check_keys("space", space)
    params = []
    for key, d in space.items():
        where = f"space.{key}"
        if key == "seed":
            raise _err(path, where, "use sweep.seeds for replicates")
        if not isinstance(d, dict):
            raise _err(path, where, "must be a table like {grid=[...]} or {low=..., high=...}")
        for dk in d:
            if dk not in DIST_KEYS:
                raise _err(path, f"{where}.{dk}", f"unknown key (known: {', '.join(sorted(DIST_KEYS))})")
        cat = [k for k in ("grid", "choices") if k in d]
        if len(cat) > 1 or (cat and any(k in d for k in ("low", "high", "log", "step"))):
            raise _err(path, where, "give one of grid, choices, or low/high[/log/step]")
        if cat:
            vals = d[cat[0]]
            if not isinstance(vals, list) or not vals:
                raise _err(path, where, f"{cat[0]} must be a non-empty list")
            if not all(isinstance(v, (int, float, str, bool)) for v in vals) or len(set(map(repr, vals))) != len(vals):
                raise _err(path, where, f"{cat[0]} values must be distinct scalars, got {vals!r}")
            p = Param(key, grid=tuple(vals))
            probe = list(vals)
        else:
            if sampler == "grid":
                raise _err(path, where, "sampler='grid' needs {grid=[...]} (a distribution cannot be enumerated)")
            lo, hi, log, step = d.get("low"), d.get("high"), d.get("log", False), d.get("step")
            if not (_num(lo) and _num(hi)):
                raise _err(path, where, f"low and high must be numbers, got {lo!r}, {hi!r}")
            if not lo < hi:
                raise _err(path, where, f"low must be < high, got low={lo} high={hi}")
            if not isinstance(log, bool):
                raise _err(path, f"{where}.log", "must be true or false")
            if log and lo <= 0:
                raise _err(path, where, f"log=true needs low > 0, got {lo}")
            if step is not None and (not _num(step) or step <= 0 or log):
                raise _err(path, f"{where}.step", "must be a number > 0 (and not with log=true)")
            p = Param(key, low=lo, high=hi, log=log, step=step)
            probe = [lo, hi]
        for v in probe:  # unknown keys and type/range errors of each value
            try:
                override(base_fixed, {key: v})
            except ConfigError as e:
                raise _err(path, where, str(e)) from None
        params.append(p)
    params_t = tuple(params)
    spec_kw = dict(kind=kind, objective=objective, direction=direction, sampler=sampler, pruner=pruner,
                   seeds=tuple(seeds), storage=get("storage", str, ""), analyze=get("analyze", bool, False),
                   experiment=get("experiment", str, "hmmscope-sweeps") or "hmmscope-sweeps",
                   fixed=dict(fixed), space=params_t, **ints)
    if sampler == "grid":
        if "n_trials" in sw:
            raise _err(path, "sweep.n_trials", "not used with sampler='grid' (grid size x seeds)")
        n = math.prod(len(p.grid) for p in params_t) * len(seeds)
        if n > MAX_GRID:
            raise _err(path, "space", f"grid has {n} points x seeds (max {MAX_GRID})")
    else:
        n = get("n_trials", int, 0)
        if n < 1:
            raise _err(path, "sweep.n_trials", f"must be an int >= 1 for sampler={sampler!r}, got {n!r}")
    canon = json.dumps({"sweep": {k: v for k, v in sw.items()}, "fixed": fixed, "space": space,
                        "base": flatten(base)}, sort_keys=True, default=str)
    spec = SweepSpec(name=name, path=path, text=text, hash=hashlib.sha256(canon.encode()).hexdigest()[:16],
                     base=base, n_trials=n, **spec_kw)
    if sampler == "grid":  # every combination must be a valid config (e.g. rank <= n_states)
        for pt in spec.grid_points():
            try:
                cfg = spec.trial_config(pt)
            except ConfigError as e:
                raise _err(path, "space", f"grid point {pt}: {e}") from None
            _check_theory_single(spec, cfg, path)
    else:  # one sample point (the first choice / lower bound of each parameter)
        pt = {p.key: p.grid[0] if p.grid is not None else p.low for p in params_t}
        try:
            cfg = spec.trial_config({**pt, "seed": seeds[0]})
        except ConfigError as e:
            raise _err(path, "space", f"point {pt}: {e}") from None
        _check_theory_single(spec, cfg, path)
    return spec


def _check_theory_single(spec: SweepSpec, cfg: Config, path: str) -> None:
    if spec.kind != "theory":
        return
    th = cfg.theory
    for k, v in (("theory.gammas", th.gammas), ("theory.ranks", th.ranks), ("theory.rhos", th.rhos),
                 ("theory.n_states", th.n_states)):
        if len(v) != 1:
            raise _err(path, k, "a theory trial runs one setting: give one value in [fixed] or sweep it in [space]")


def _bad_key(base: Config, upd: Mapping[str, Any]) -> bool:
    try:
        override(base, upd)
        return False
    except ConfigError:
        return True


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec file (see the module docstring); ConfigError names file and key."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"sweep spec not found: {p}") from None
    return parse_spec(text, p.resolve())


# ---------------------------------------------------------------- storage and study


def default_storage() -> str:
    """sqlite:///<cwd>/mlruns/optuna.db, its schema created once under a file lock."""
    db = (Path("mlruns") / "optuna.db").resolve()
    url = f"sqlite:///{db}"
    ensure_storage(url)
    return url


def ensure_storage(url: str) -> None:
    """Create the Optuna schema once (sqlite: under an exclusive file lock beside the database)."""
    if not url.startswith("sqlite:///"):
        _storage(url)
        return
    db = Path(url[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / ".optuna.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _storage(url)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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


def create_study(spec: SweepSpec, storage_url: str, uri: str):
    """Create (or load) the study with every trial enqueued and the MLflow parent run.

    Returns (study, parent_run_id, created). An existing study with a different spec hash -> ConfigError.
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
        points = spec.grid_points() if spec.sampler == "grid" else [{} for _ in range(spec.n_trials)]
        for i, pt in enumerate(points):
            study.enqueue_trial(pt, user_attrs={"slot": i}, skip_if_exists=False)
        study.set_user_attr(ATTR_TEXT, spec.text)
        study.set_user_attr(ATTR_PATH, spec.path)
        study.set_user_attr(ATTR_BASE, flatten(spec.base))
        study.set_user_attr(ATTR_HASH, spec.hash)  # last: marks the study complete
    else:
        have = study.user_attrs.get(ATTR_HASH)
        if have is None:
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {storage_url} but is not "
                              "a complete hmmscope sweep; choose another name or delete it")
        if have != spec.hash:
            raise ConfigError(f"{spec.path}: sweep.name: study {spec.name!r} exists in {storage_url} with a "
                              f"different spec (hash {have} != {spec.hash}); rename the sweep")
    parent = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        params = {f"sweep.{k}": v for k, v in (("name", spec.name), ("kind", spec.kind),
                                               ("objective", spec.objective), ("direction", spec.direction),
                                               ("sampler", spec.sampler), ("pruner", spec.pruner),
                                               ("n_trials", spec.n_trials), ("seeds", list(spec.seeds)))}
        params.update({f"sweep.space.{p.key}": list(p.grid) if p.grid else [p.low, p.high, p.log, p.step]
                       for p in spec.space})
        with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", params=params,
                                tags={"hmmscope.kind": "sweep", "hmmscope.study": spec.name,
                                      "hmmscope.spec_hash": spec.hash, "hmmscope.storage": _safe_url(storage_url)}) as run:
            run.log_dict(spec.text, "sweep.toml")
            parent = run.run_id
        study.set_user_attr(ATTR_PARENT, parent)
    return study, parent, created


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


def run_trial(trial, spec: SweepSpec, uri: str, parent: str) -> float:
    """One trial: config -> train + evaluate (+ analyze), or one theory setting; returns the objective."""
    from . import jobs, tracking

    params = {p.key: _suggest(trial, p) for p in spec.space}
    params["seed"] = trial.suggest_categorical("seed", list(spec.seeds))
    cfg = spec.trial_config(params)
    name = f"trial-{trial.number}"
    tags = {"hmmscope.trial": trial.number, "hmmscope.study": spec.name, "hmmscope.kind": f"sweep-{spec.kind}",
            "hmmscope.sweep_parent": parent}
    if spec.kind == "theory":
        with tempfile.TemporaryDirectory() as tmp:
            result, run_id = jobs.theory_job(cfg.theory, Path(tmp), uri=uri, experiment=spec.experiment,
                                             parent=parent)
        trial.set_user_attr("mlflow_run_id", run_id)
        metrics = _theory_metrics(result)
        run = tracking.existing_run(uri, run_id)
        run.set_tags({**tags, "mlflow.runName": name})
        run.log_params({k: v for k, v in flatten(cfg).items() if not k.startswith("theory.")})
        run.log_metrics(metrics)  # the setting's numbers on the trial run itself, for side-by-side comparison
    else:
        from .train import train

        hook = make_prune_hook(trial, spec.objective) if spec.pruner != "none" else None
        res = train(cfg, tracking_uri=uri, experiment=spec.experiment, run_name=name, parent=parent,
                    progress=False, on_eval=hook)
        trial.set_user_attr("mlflow_run_id", res.run_id)
        run = tracking.existing_run(uri, res.run_id)
        run.set_tags(tags)
        metrics = {**res.metrics, **jobs.evaluate_run(uri, res.run_id, device=cfg.train.device)}
        if spec.analyze:
            an = jobs.analyze_run(uri, res.run_id, device=cfg.train.device, experiment=spec.experiment)
            metrics.update(an.metrics)
            trial.set_user_attr("mlflow_analysis_run_id", an.run_id)
    if spec.objective not in metrics:
        raise KeyError(f"objective {spec.objective!r} is not among the trial's metrics "
                       f"({', '.join(sorted(metrics)[:20])}, ...)")
    value = float(metrics[spec.objective])
    run.log_metrics({"sweep/objective": value})
    return value


# ---------------------------------------------------------------- workers


def _pop_waiting(study) -> int | None:
    """Claim one WAITING trial (atomically: WAITING -> RUNNING); never creates a trial."""
    import optuna
    from optuna.trial import TrialState

    storage = study._storage
    for t in storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                return t._trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


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
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
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
    done = 0
    while max_trials is None or done < max_trials:
        optuna.storages.fail_stale_trials(study)  # retries trials of dead workers (after grace_period)
        tid = _pop_waiting(study)
        if tid is None:
            if study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(min(2.0, spec.heartbeat_interval))
                continue
            break
        state, value, err = None, None, None
        with _heartbeat(study._storage, tid, spec.heartbeat_interval):  # first beat right after the claim
            trial = optuna.Trial(study, tid)
            try:
                value = run_trial(trial, spec, uri, parent)
                state = TrialState.COMPLETE
            except optuna.TrialPruned as e:
                state, err = TrialState.PRUNED, e
                with contextlib.suppress(Exception):
                    trial.set_user_attr("pruned_reason", str(e))
            except Exception as e:  # DivergedError and friends: FAIL this trial, carry on
                state, err = TrialState.FAIL, e
                with contextlib.suppress(Exception):
                    trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: give the slot back (a WAITING copy, same params)
                main = threading.current_thread() is threading.main_thread()
                old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None  # no second cut
                try:
                    with contextlib.suppress(Exception):
                        trial.set_user_attr("fail_reason", "interrupted")
                    study.tell(trial, state=TrialState.FAIL)
                    with contextlib.suppress(Exception):
                        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry)(
                            study, study._storage.get_trial(tid))
                finally:
                    if main:
                        signal.signal(signal.SIGTERM, old)
                raise
        if state == TrialState.COMPLETE and not math.isfinite(value):
            state, err = TrialState.FAIL, ValueError(f"objective {spec.objective} is {value}")
            with contextlib.suppress(Exception):
                trial.set_user_attr("fail_reason", str(err))
        if state == TrialState.COMPLETE:
            study.tell(trial, value)
            log(f"trial {trial.number} complete: {spec.objective}={value:.6g} params={trial.params}")
        else:
            study.tell(trial, state=state)
            log(f"trial {trial.number} {state.name.lower()}: {type(err).__name__}: {err}")
        done += 1
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


def worker_command(study_name: str, storage_url: str, uri: str, max_trials: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "hmmscope.sweep", "worker", "--study", study_name, "--storage", storage_url,
           "--uri", uri]
    return cmd + (["--max-trials", str(max_trials)] if max_trials else [])


def worker_env() -> dict[str, str]:
    return {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_sweep(spec: SweepSpec, *, workers: int = 1, storage: str | None = None, uri: str | None = None,
              progress: Callable[[dict[str, int], int], None] | None = None,
              log: Callable[[str], None] = print) -> SweepSummary:
    """Create/resume the study, run `workers` local worker processes until the sweep is exhausted."""
    from . import tracking

    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    uri = tracking.resolve_uri(uri)
    storage = storage or spec.storage or default_storage()
    study, parent, created = create_study(spec, storage, uri)
    c = _counts(study)
    if not created and c["waiting"] == 0 and c["running"] == 0:
        log(f"sweep {spec.name!r} is complete ({c['complete']} complete, {c['failed']} failed, "
            f"{c['pruned']} pruned); nothing to do")
        return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                            c["retried"], True)
    log(f"sweep {spec.name!r}: {spec.n_trials} trials, {workers} workers, storage {_safe_url(storage)}, "
        f"MLflow parent run {parent}")
    procs: list[subprocess.Popen] = []

    def on_term(signum, frame):  # a scheduler's SIGTERM ends the sweep like Ctrl-C
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", resume=parent) as prun:
        try:
            for _ in range(workers):
                # own session: a terminal's Ctrl-C reaches only us, and we stop the workers cleanly
                procs.append(subprocess.Popen(worker_command(spec.name, storage, uri), env=worker_env(),
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
    """One row per trial: number, state, params, value, mlflow_run_id, retried_from, reason."""
    study = _load(study_name, storage_url)
    rows = []
    for t in study.get_trials(deepcopy=False):
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))  # WAITING: the enqueued point
        rows.append({"number": t.number, "state": t.state.name, "params": params, "value": t.value,
                     "mlflow_run_id": t.user_attrs.get("mlflow_run_id"),
                     "retried_from": t.system_attrs.get("failed_trial"),
                     "reason": None if t.state.name in ("COMPLETE", "RUNNING", "WAITING")
                     else t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned_reason")})
    return rows


# ---------------------------------------------------------------- worker entry point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hmmscope.sweep")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run trials of an existing study until it is exhausted")
    w.add_argument("--study", required=True)
    w.add_argument("--storage", required=True)
    w.add_argument("--uri", required=True)
    w.add_argument("--max-trials", type=int, default=None)
    a = ap.parse_args(argv)

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
