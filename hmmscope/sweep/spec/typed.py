"""The typed sweep spec: `Param` (one [space] entry), `SweepSpec` (a parsed, validated spec), what a trial's config
and name are (`trial_config`, `trial_name`, `short_labels`, `seed_keys`) and the spec's identity (`identity_hash`,
`legacy_hash`; the run-time keys that do not count). Built only by `spec.parse`; imports `spec.objectives` only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna.distributions as D

from ... import config
from ...config import Config, flatten, override, parse_toml
from .objectives import PRUNE_PROXY

# Identity (the spec package docstring): sweep keys that do not count, and config keys that do not.
RUNTIME_SWEEP_KEYS = frozenset({"storage", "heartbeat_interval", "grace_period", "max_retry"})
RUNTIME_CONFIG = frozenset(config.RUNTIME_KEYS)
# Trial names: short labels of common config keys (by their last part); others use that last part.
ABBREV = {"gamma": "g", "gammas": "g", "rank": "d", "ranks": "d", "rho": "rho", "rhos": "rho", "n_states": "S",
          "n_tasks": "T", "n_tokens": "V", "n_layers": "L", "n_heads": "H", "d_model": "dm", "d_mlp": "dmlp",
          "window": "w", "n_demos": "k", "l_demo": "ld", "l_test": "lt", "lr": "lr", "steps": "steps",
          "batch_size": "bs", "weight_decay": "wd", "pos_enc": "", "family": "", "precision": "", "test_start": ""}


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
    objective: str = "eval/seen/excess_ce"
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

    @property
    def prune_metric(self) -> str | None:
        """The learning-curve metric a pruned trial reports at each evaluation (the spec package docstring)."""
        if self.objective.startswith("val/"):
            return self.objective
        return PRUNE_PROXY.get(self.objective)

    def trial_name(self, params: Mapping[str, Any], seed: int | None = None) -> str:
        """The run name of a trial: what varies, then the seed (the spec package docstring), e.g. `rope-g0.5-s0`."""
        labels = short_labels([p.key for p in self.space])
        parts = [label_value(labels[p.key], params[p.key]) for p in self.space if p.key in params]
        if seed is None:
            seed = params.get("seed")
        return "-".join([*(parts or [self.name]), *([f"s{seed}"] if seed is not None else [])])

    def trial_config(self, params: Mapping[str, Any]) -> Config:
        """The config of a trial with Optuna params `params` (space keys and "seed")."""
        upd = {**self.fixed, **{k: v for k, v in params.items() if k != "seed"}}
        if "seed" in params:
            upd.update(seed_keys(self.kind, params["seed"]))
        return override(self.base, upd)


def short_labels(keys: list[str]) -> dict[str, str]:
    """key -> short label (ABBREV by the key's last part); a label two keys share falls back to the last part,
    then to the whole key."""
    def last(k: str) -> str:
        return k.rsplit(".", 1)[-1]

    short = {k: ABBREV.get(last(k), last(k)) for k in keys}
    return {k: (last(k) if sum(last(j) == last(k) for j in keys) == 1 else k)
            if short[k] and sum(short[j] == short[k] for j in keys) > 1 else short[k] for k in keys}


def label_value(label: str, v: Any) -> str:
    if isinstance(v, bool):
        return label if v else f"no{label}" if label else str(v).lower()
    if isinstance(v, float):
        text = f"{v:.4g}"
    elif isinstance(v, (list, tuple)):
        text = "_".join(label_value("", x) for x in v)
    else:
        text = str(v)
    if not label and isinstance(v, (int, float)) and not isinstance(v, bool):
        return text
    return f"{label}{text}"


def seed_keys(kind: str, seed: int) -> dict[str, int]:
    """Replicate seed -> config keys (the HMM mixture, hmm.seed, is shared by replicates; the unseen, fit, family and
    fresh task streams follow data.seed, so a headroom replicate draws new tasks)."""
    if kind == "theory":
        return {"theory.seed": seed}
    return {"data.seed": seed} if kind == "headroom" else {"train.seed": seed, "data.seed": seed}


def identity_hash(name: str, kw: Mapping[str, Any], n_trials: int, base: Config) -> str:
    """sha256 (16 hex) of what makes a sweep's results: the parsed spec less its run-time keys (the spec package docstring)."""
    sweep = {k: v for k, v in kw.items() if k not in ("fixed", "space") and k not in RUNTIME_SWEEP_KEYS}
    canon = {"sweep": {**sweep, "name": name, "n_trials": n_trials},
             "fixed": {k: v for k, v in kw["fixed"].items() if k not in RUNTIME_CONFIG},
             "space": [dataclasses.asdict(p) for p in kw["space"]],
             "base": {k: v for k, v in flatten(base).items() if k not in RUNTIME_CONFIG}}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()[:16]


def legacy_hash(spec: SweepSpec) -> str:
    """The identity hash of studies created before run-time keys were left out (the spec text's tables and the
    base config, all keys): a stored study with this hash is the same sweep."""
    data = parse_toml(spec.text, spec.path)
    canon = json.dumps({"sweep": dict(data.get("sweep", {})), "fixed": data.get("fixed", {}),
                        "space": data.get("space", {}), "base": flatten(spec.base)}, sort_keys=True, default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]

