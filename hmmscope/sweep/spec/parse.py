"""A sweep spec's text (TOML) to the typed spec: `parse_spec` reads the tables in order, each checked by
`spec.checks`, and builds the `SweepSpec`; `load_spec` reads a file; `with_sets` adds the command line's --set values
as a [set] table and parses again. The top of the spec package: imports `spec.checks`, `spec.typed`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...config import Config, ConfigError, flatten, load_toml, override, parse_toml, preset, read_text
from ..effects import check_options
from ..space import check_space_given, distinct_labels
from .checks import (
    HEADROOM_SECTIONS,
    check_points,
    check_tables,
    experiment_name,
    fixed_config,
    setting,
    space_params,
    spec_error,
    sweep_choices,
    sweep_ints,
    sweep_seeds,
    trial_count,
)
from .typed import SweepSpec, identity_hash, label_value, short_labels


def parse_spec(text: str, path: str | Path = "<spec>", *, base: Config | None = None) -> SweepSpec:
    """Parse and validate spec text; ConfigError '<file>: <key>: <why>' on the first problem."""
    path = str(path)
    data = parse_toml(text, path)
    check_tables(path, data)
    sw = data.get("sweep", {})
    choices = sweep_choices(path, sw)
    kind, sampler = choices["kind"], choices["sampler"]
    seeds = sweep_seeds(path, sw)
    ints = sweep_ints(path, sw)
    base = base_config(path, sw) if base is None else base  # a stored study: its base config as stored
    fixed, base_fixed = fixed_config(path, data, kind, base)
    params = space_params(path, data.get("space", {}), kind, sampler, base_fixed)
    experiment = experiment_name(path, sw)
    name = choices.pop("name")
    spec_kw = dict(**choices, seeds=tuple(seeds), storage=setting(path, sw, "storage", str, ""),
                   analyze=setting(path, sw, "analyze", bool, False), experiment=experiment,
                   fixed=dict(fixed), space=params, **ints)
    n = trial_count(path, sw, sampler, params, seeds)
    check_space_given(path, "space" in data, n)  # a spec cut before its [space] is no one-trial sweep
    labels = short_labels([p.key for p in params])
    for p in params:  # each grid value its own trial name
        if p.grid is not None:
            distinct_labels(path, f"space.{p.key}", [(v, label_value(labels[p.key], v)) for v in p.grid])
    check_options(path, data.get("report", {}), [p.key for p in params])  # not part of the identity
    spec = SweepSpec(name=name, path=path, text=text, hash=identity_hash(name, spec_kw, n, base),
                     base=base, n_trials=n, **spec_kw)
    check_points(spec, path)
    return spec


def base_config(path: str, sw: Mapping[str, Any]) -> Config:
    """The config every trial starts from: sweep.base (a preset, default tiny) or sweep.config (a TOML file,
    relative to the spec file), not both."""
    if "base" in sw and "config" in sw:
        raise spec_error(path, "sweep.config", "give either base (a preset) or config (a file), not both")
    if "config" in sw:
        cfg_path = Path(setting(path, sw, "config", str, ""))
        if not cfg_path.is_absolute():
            cfg_path = Path(path).resolve().parent / cfg_path
        try:
            return load_toml(cfg_path)
        except ConfigError as e:
            raise spec_error(path, "sweep.config", str(e)) from None
    try:
        return preset(setting(path, sw, "base", str, "tiny"))
    except ConfigError as e:
        raise spec_error(path, "sweep.base", str(e)) from None


def with_sets(spec: SweepSpec, sets: Mapping[str, Any]) -> SweepSpec:
    """`spec` with the command line's `--set key=value` overrides (the spec package docstring): each checked by
    `config.override` on the spec's base and [fixed] (ConfigError naming it), a swept key refused; appended to
    the spec's text as a [set] table and parsed again, so they are in its identity hash and its stored text."""
    if not sets:
        return spec
    if "set" in parse_toml(spec.text, spec.path):
        raise ConfigError(f"{spec.path}: set: the spec has a [set] table already; edit it instead of --set")
    swept, base_fixed, typed = {p.key for p in spec.space}, override(spec.base, spec.fixed), {}
    for k, v in sets.items():
        if k in swept:
            raise ConfigError(f"--set {k}: the spec sweeps {k} in [space]; --set fixes keys it does not sweep")
        if spec.kind == "theory" and not k.startswith("theory."):
            raise ConfigError(f"--set {k}: kind='theory' sweeps only theory.* keys")
        if spec.kind == "headroom" and not k.startswith(HEADROOM_SECTIONS):
            raise ConfigError(f"--set {k}: kind='headroom' sweeps only hmm.*, data.* and eval.* keys")
        try:
            typed[k] = flatten(override(base_fixed, {k: v}))[k]
        except ConfigError as e:
            raise ConfigError(f"--set {k}={v}: {e}") from None
    block = ["", "# hmmscope sweep run --set (applied after [fixed])", "[set]",
             *(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in typed.items())]
    return parse_spec(spec.text.rstrip("\n") + "\n" + "\n".join(block) + "\n", spec.path, base=spec.base)


def _toml_value(v: Any) -> str:
    """A config value (number, string, boolean, list of them) as TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec file (see the spec package docstring); ConfigError names file and key."""
    p = Path(path)
    return parse_spec(read_text(p, "sweep spec"), p.resolve())
