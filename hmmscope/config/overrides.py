"""The one strict override and the flat form of a config: `override` walks dotted keys (`hmm.gamma`), rejects unknown
keys, wrong types, non-finite and subnormal floats and out-of-size ints, and re-validates the result; `flatten` /
`from_flat` (MLflow params, a checkpoint's saved config), `to_dict`, `config_hash`; the presets (`preset`). Imports
`config.schema`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from .schema import INT_MAX, Config, ConfigError, validate


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type `tp`; strings from the CLI are parsed as TOML literals."""
    if isinstance(value, str) and tp is not str:
        try:
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{key}: cannot parse {value!r} as {getattr(tp, '__name__', tp)}") from None
    origin = typing.get_origin(tp)
    if origin is tuple:
        (elem, *_rest) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(_coerce(key, v, elem) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT_MAX and not key.endswith(".seed"):  # seeds: validate names their own range
                raise ConfigError(f"{key}: must be at most {INT_MAX} in size, got {value}")
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an int too large for a float
                raise ConfigError(f"{key}: must be a finite number, got {value}") from None
            if not math.isfinite(value):
                raise ConfigError(f"{key}: must be a finite number, got {value}")
            if value != 0 and abs(value) < 2.2250738585072014e-308:  # subnormal (1e-320): no arithmetic survives it
                raise ConfigError(f"{key}: {value!r} is below the smallest normal float (2.23e-308); give 0 or a larger size")
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def override(cfg: Config, updates: Mapping[str, Any]) -> Config:
    """Return `cfg` with dotted-key `updates` applied; unknown keys and wrong types raise ConfigError."""
    sections: dict[str, dict[str, Any]] = {}
    hints = {f.name: f.type for f in dataclasses.fields(Config)}
    for key, value in updates.items():
        parts = key.split(".")
        if len(parts) != 2 or parts[0] not in hints:
            raise ConfigError(f"unknown config key {key!r} (sections: {', '.join(hints)})")
        sec, name = parts
        sec_obj = getattr(cfg, sec)
        types = typing.get_type_hints(type(sec_obj))
        if name not in types:
            raise ConfigError(f"unknown config key {key!r} (known in {sec}: {', '.join(types)})")
        if key == "train.compile" and isinstance(value, bool):  # true / false (TOML, older checkpoints' configs)
            value = "true" if value else "false"
        sections.setdefault(sec, {})[name] = _coerce(key, value, types[name])
    new = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **kv) for s, kv in sections.items()})
    return validate(new)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{'hmm.gamma': 0.8, ...}: the same names for every run, for MLflow params."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out.update(flatten(v, key + "."))
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def from_flat(flat: Mapping[str, Any]) -> Config:
    """Rebuild a Config from `flatten` output (e.g. a checkpoint's saved config)."""
    return override(Config(), flat)


def to_dict(cfg: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def config_hash(*parts: Any) -> str:
    """Content hash (sha256, 16 hex chars) of one or more config sections."""
    blob = json.dumps([to_dict(p) for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- presets

PRESETS: dict[str, dict[str, Any]] = {
    # CPU, a few minutes on 2 cores.
    "tiny": {},
    # The paper's scale (SCIENCE.md 3): a GPU job.
    "paper": {
        "hmm.n_tasks": 8192, "hmm.n_states": 128, "hmm.n_tokens": 16, "hmm.rank": 8,
        "data.n_demos": 6, "data.l_demo": 48, "data.l_test": 64,
        "data.n_train": 131072, "data.n_eval": 1024,
        "model.n_layers": 16, "model.n_heads": 16, "model.d_model": 1024, "model.d_mlp": 4096,
        "model.max_len": 512,
        "train.steps": 4096, "train.batch_size": 32, "train.lr": 3e-4, "train.min_lr": 3e-5,
        "train.warmup": 200, "train.eval_every": 512, "train.ckpt_every": 1024,
    },
}
# The second reading of the paper's budget (SCIENCE.md 8): "64 epochs" over the 131,072 episodes, 262,144 steps of
# batch 32 (64 passes, 1024 episodes per task); "paper" is the literal one (4096 steps, one pass, 16 per task).
PRESETS["paper-epochs"] = {**PRESETS["paper"], "train.steps": 262144, "train.eval_every": 4096,
                           "train.ckpt_every": 4096}


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return override(Config(), PRESETS[name])
