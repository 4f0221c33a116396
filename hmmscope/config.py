"""One typed configuration object: defaults -> preset -> TOML file -> overrides.

Every knob lives in a frozen dataclass below. `override` is the only way to change
one: it walks dotted keys (`hmm.gamma`), rejects unknown keys and wrong types, and
re-validates the result, so a bad value fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value or key is invalid (one-line message)."""


FAMILIES = ("dirichlet", "sticky")
TEST_STARTS = ("initial", "midstream")
POS_ENCODINGS = ("rope", "absolute", "none", "sinusoidal")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class HMMConfig:
    """A mixture of n_tasks low-rank HMMs (SCIENCE.md 1)."""

    family: str = "sticky"  # dirichlet | sticky
    n_tasks: int = 16
    n_states: int = 16
    n_tokens: int = 8
    rank: int = 4  # d: T = W @ Q with W (S, d), Q (d, S)
    gamma: float = 0.8  # observability knob: O = gamma * E + (1 - gamma) * U
    alpha: float = 0.5  # Dirichlet concentration (dirichlet family, and Q rows of sticky)
    rho: float = 0.05  # sticky family: probability of jumping to a random prototype
    seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    """In-context episodes (SCIENCE.md 3)."""

    n_demos: int = 4  # k demonstrations per episode
    l_demo: int = 24  # tokens per demonstration (a delimiter follows each)
    l_test: int = 32  # tokens in the test sequence
    test_start: str = "initial"  # initial: test starts from mu; midstream: after burn_in steps
    burn_in: int = 0  # B unseen steps before a midstream test sequence
    n_train: int = 8192  # training episodes
    n_eval: int = 512  # held-out episodes (drawn with a different stream of the same seed)
    seed: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only RoFormer-style transformer (SCIENCE.md 5)."""

    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    d_mlp: int = 512
    dropout: float = 0.0
    pos_enc: str = "rope"  # rope | absolute | none | sinusoidal
    window: int = 0  # banded causal attention of this width; 0 = full causal
    max_len: int = 512  # longest sequence (absolute / sinusoidal tables)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    ckpt_every: int = 500
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    compile: bool = False  # torch.compile the model (inductor) on any device
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 elsewhere) | bf16 (autocast) | fp32 (no autocast, no TF32)
    seed: int = 0


@dataclass(frozen=True)
class TheoryConfig:
    """Theorem 1 sweep (SCIENCE.md 4): eps(L) curves and decay-rate fits."""

    family: str = "sticky"
    gammas: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
    ranks: tuple[int, ...] = (8,)
    rhos: tuple[float, ...] = (0.02,)
    n_states: tuple[int, ...] = (128,)
    n_tokens: int = 16
    alpha: float = 0.5
    lengths: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16, 24, 32)
    n_histories: int = 2000
    burn_in: int = 200
    floor: float = 1e-10  # eps below this is numerical noise and left out of the fit
    gamma_m: int = 2  # m for the m-step observability (0 = skip)
    seed: int = 0


@dataclass(frozen=True)
class Config:
    hmm: HMMConfig = field(default_factory=HMMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    theory: TheoryConfig = field(default_factory=TheoryConfig)


# ---------------------------------------------------------------- validation


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config) -> Config:
    """Raise ConfigError with a one-line message if any value is out of range."""
    h, d, m, t, th = cfg.hmm, cfg.data, cfg.model, cfg.train, cfg.theory
    _check(h.family in FAMILIES, f"hmm.family must be one of {FAMILIES}, got {h.family!r}")
    _check(h.n_tasks >= 1, f"hmm.n_tasks must be >= 1, got {h.n_tasks}")
    _check(h.n_states >= 1, f"hmm.n_states must be >= 1, got {h.n_states}")
    _check(h.n_tokens >= 2, f"hmm.n_tokens must be >= 2, got {h.n_tokens}")
    _check(1 <= h.rank <= h.n_states, f"hmm.rank must be in [1, n_states={h.n_states}], got {h.rank}")
    _check(0.0 < h.gamma <= 1.0, f"hmm.gamma must be in (0, 1], got {h.gamma}")
    _check(h.alpha > 0, f"hmm.alpha must be > 0, got {h.alpha}")
    _check(0.0 <= h.rho <= 1.0, f"hmm.rho must be in [0, 1], got {h.rho}")
    _check(d.n_demos >= 0, f"data.n_demos must be >= 0, got {d.n_demos}")
    _check(d.l_demo >= 1, f"data.l_demo must be >= 1, got {d.l_demo}")
    _check(d.l_test >= 1, f"data.l_test must be >= 1, got {d.l_test}")
    _check(d.test_start in TEST_STARTS, f"data.test_start must be one of {TEST_STARTS}, got {d.test_start!r}")
    _check(d.burn_in >= 0, f"data.burn_in must be >= 0, got {d.burn_in}")
    _check(d.n_train >= 1 and d.n_eval >= 1, "data.n_train and data.n_eval must be >= 1")
    _check(m.n_layers >= 1, f"model.n_layers must be >= 1, got {m.n_layers}")
    _check(m.n_heads >= 1, f"model.n_heads must be >= 1, got {m.n_heads}")
    _check(m.d_model % m.n_heads == 0, f"model.n_heads={m.n_heads} must divide model.d_model={m.d_model}")
    _check((m.d_model // m.n_heads) % 2 == 0 or m.pos_enc != "rope", "model.d_model / n_heads must be even for rope")
    _check(m.d_mlp >= 1, f"model.d_mlp must be >= 1, got {m.d_mlp}")
    _check(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    _check(m.pos_enc in POS_ENCODINGS, f"model.pos_enc must be one of {POS_ENCODINGS}, got {m.pos_enc!r}")
    _check(m.window >= 0, f"model.window must be >= 1 (or 0 for full attention), got {m.window}")
    _check(m.max_len >= seq_len(d), f"model.max_len={m.max_len} is shorter than an episode ({seq_len(d)} tokens)")
    _check(t.steps >= 1 and t.batch_size >= 1, "train.steps and train.batch_size must be >= 1")
    _check(t.lr > 0 and 0 <= t.min_lr <= t.lr, "train.lr must be > 0 and 0 <= train.min_lr <= train.lr")
    _check(t.warmup >= 0 and t.grad_clip > 0, "train.warmup must be >= 0 and train.grad_clip > 0")
    _check(t.eval_every >= 1 and t.ckpt_every >= 1, "train.eval_every and train.ckpt_every must be >= 1")
    _check(t.precision in PRECISIONS, f"train.precision must be one of {PRECISIONS}, got {t.precision!r}")
    _check(th.family in FAMILIES, f"theory.family must be one of {FAMILIES}, got {th.family!r}")
    _check(len(th.gammas) > 0 and all(0.0 < g <= 1.0 for g in th.gammas), f"theory.gammas must lie in (0, 1], got {th.gammas}")
    _check(len(th.n_states) > 0 and all(s >= 1 for s in th.n_states), f"theory.n_states must be >= 1, got {th.n_states}")
    _check(len(th.ranks) > 0 and all(1 <= r <= min(th.n_states) for r in th.ranks),
           f"theory.ranks must lie in [1, n_states={min(th.n_states)}], got {th.ranks}")
    _check(len(th.rhos) > 0 and all(0.0 <= r <= 1.0 for r in th.rhos), f"theory.rhos must lie in [0, 1], got {th.rhos}")
    _check(th.n_tokens >= 2 and th.alpha > 0, "theory.n_tokens must be >= 2 and theory.alpha > 0")
    _check(len(th.lengths) >= 2 and all(x >= 1 for x in th.lengths),
           f"theory.lengths must be >= 1 (at least two), got {th.lengths}")
    _check(th.n_histories >= 2 and th.burn_in >= 0, "theory.n_histories must be >= 2 and theory.burn_in >= 0")
    _check(0 < th.floor < 1 and th.gamma_m >= 0, "theory.floor must be in (0, 1) and theory.gamma_m >= 0")
    return cfg


def seq_len(d: DataConfig) -> int:
    """Tokens in one episode: k demos each followed by a delimiter, then the test sequence."""
    return d.n_demos * (d.l_demo + 1) + d.l_test


# ---------------------------------------------------------------- overrides


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
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
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


def _nested_to_flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_nested_to_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_toml(path: str | Path, base: Config | None = None) -> Config:
    """Apply a TOML file (tables [hmm], [data], ...) on top of `base` (default: Config())."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    try:
        return override(base or Config(), _nested_to_flat(data))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


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


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return override(Config(), PRESETS[name])
