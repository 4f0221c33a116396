"""One typed configuration object: defaults -> preset -> TOML file -> overrides.

Every knob lives in a frozen dataclass below. `override` is the only way to change one: it walks dotted keys
(`hmm.gamma`), rejects unknown keys, wrong types and non-finite floats (inf, nan), and re-validates the result, so a
bad value fails before any work starts. Seeds lie in [0, 2**32 - 1] (numpy's legacy seed range, also what
torch.manual_seed and SeedSequence take without complaint). `memory_estimate(cfg, job)` is the peak memory of a job,
by term, computed from the config alone (no allocation): the CLI refuses a job that cannot fit before it starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value or key is invalid (one-line message)."""


SEED_MAX = 2**32 - 1
INT_MAX = 2**53  # every integer setting is bounded before arithmetic sees it (exact as a float; no OverflowError)
MAX_TEXT_BYTES = 1 << 20  # a config file or sweep spec is read up to this size
MAX_TOML_DEPTH = 16  # tables and arrays nested deeper are refused (a config has 2 levels, a spec 4)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
FAMILIES = ("dirichlet", "sticky")
STRUCTURES = ("all", "half", "half-heldout")  # hmm.structures (hmm.make_mixture)
TEST_STARTS = ("initial", "midstream")
POS_ENCODINGS = ("rope", "absolute", "none", "sinusoidal")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "constant", "wsd")
COMPILE = ("auto", "true", "false", "blocks", "blocks-head", "model-autotune", "model-graphs")  # model.COMPILE_SCOPES
ATTENTION = ("auto", "flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class HMMConfig:
    """A mixture of n_tasks low-rank HMMs (SCIENCE.md 1)."""

    family: str = "sticky"  # dirichlet | sticky
    n_tasks: int = 16  # 0 = fresh tasks: every training episode draws its own task from the family (SCIENCE.md 9)
    n_states: int = 16
    n_tokens: int = 8
    rank: int = 4  # d: T = W @ Q with W (S, d), Q (d, S)
    gamma: float = 0.8  # observability knob: O = gamma * E + (1 - gamma) * U
    alpha: float = 0.5  # Dirichlet concentration (dirichlet family, and Q rows of sticky)
    rho: float = 0.05  # sticky family: probability of jumping to a random prototype
    seed: int = 0
    structures: str = "all"  # revealing maps: all | half (one half) | half-heldout (evaluation tasks: the other half)


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
    schedule: str = "cosine"  # cosine (warmup, cosine to min_lr) | constant (warmup, then lr) | wsd (warmup, stable, decay)
    decay_frac: float = 0.1  # wsd: the last decay_frac of train.steps decays linearly from lr to min_lr
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    ckpt_every: int = 500
    emergence_episodes: int = 64  # seen and unseen episodes each for the emergence curves at every evaluation; 0 = off
    figures: bool = True  # Figure 1, emergence, analysis images; false: tables, metrics, claims only (run-time key)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    compile: str = "auto"  # auto (on for CUDA, off elsewhere) | true | false | blocks | blocks-head | model-autotune |
    # model-graphs: torch.compile the training step (inductor): true = the whole model, blocks = each block alone (one
    # compiled graph reused by every layer); the others: model.Transformer.compile_forward's scopes
    attention: str = "auto"  # auto | flash | efficient | cudnn | math: the SDPA kernel of the training step (auto: torch's)
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
    n_histories: int = 1000  # per HMM draw
    burn_in: int = 200
    draws: int = 5  # independent HMM draws per setting: the unit of the rate CIs and exponent fits (theory/theorem1.py)
    floor: float = 1e-10  # eps below this is numerical noise and left out of the fit
    gamma_m: int = 2  # m for the m-step observability (0 = skip)
    seed: int = 0


@dataclass(frozen=True)
class EvalConfig:
    """Figure 1's references beyond the oracles (SCIENCE.md 8, 9; measure/evaluate.py)."""

    family_tasks: int = 256  # M: tasks of the family-Bayes reference (stream "family"); 0 = off
    fit_episodes: int = 256  # episodes of fit tasks (stream "fit") choosing the fair counting baselines; 0 = off
    em_states: int = 0  # hidden states of the EM-fitted HMM learner; 0 = the family's S, capped at EM_STATES_CAP


# eval.em_states = 0 takes min(hmm.n_states, this). EM's cost grows as states^2 (`hmmscope bench headroom --em` times
# it), so the cap bounds the cost of the main job's Figure 1 at that of 8 states; fewer states (S = 4) keep their S.
EM_STATES_CAP = 8


@dataclass(frozen=True)
class Config:
    hmm: HMMConfig = field(default_factory=HMMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    theory: TheoryConfig = field(default_factory=TheoryConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# ---------------------------------------------------------------- validation


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config) -> Config:
    """Raise ConfigError with a one-line message if any value is out of range."""
    h, d, m, t, th = cfg.hmm, cfg.data, cfg.model, cfg.train, cfg.theory
    _check(h.family in FAMILIES, f"hmm.family must be one of {FAMILIES}, got {h.family!r}")
    _check(h.n_tasks >= 0, f"hmm.n_tasks must be >= 1 (or 0 for fresh tasks), got {h.n_tasks}")
    _check(h.n_states >= 1, f"hmm.n_states must be >= 1, got {h.n_states}")
    _check(h.n_tokens >= 2, f"hmm.n_tokens must be >= 2, got {h.n_tokens}")
    _check(1 <= h.rank <= h.n_states, f"hmm.rank must be in [1, n_states={h.n_states}], got {h.rank}")
    _check(0.0 < h.gamma <= 1.0, f"hmm.gamma must be in (0, 1], got {h.gamma}")
    _check(h.alpha > 0, f"hmm.alpha must be > 0, got {h.alpha}")
    _check(0.0 <= h.rho <= 1.0, f"hmm.rho must be in [0, 1], got {h.rho}")
    _check(h.structures in STRUCTURES and (h.structures == "all" or h.n_states <= h.n_tokens),
           f"hmm.structures must be one of {STRUCTURES} (a half needs n_states <= n_tokens), got {h.structures!r}")
    for key, v in (("hmm.seed", h.seed), ("data.seed", d.seed), ("train.seed", t.seed), ("theory.seed", th.seed)):
        _check(0 <= v <= SEED_MAX, f"{key} must be in [0, {SEED_MAX}] (numpy's seed range), got {v}")
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
    _check(m.window <= m.max_len, f"model.window must be <= model.max_len={m.max_len}, got {m.window}")
    _check(m.max_len >= seq_len(d), f"model.max_len={m.max_len} is shorter than an episode ({seq_len(d)} tokens)")
    _check(t.steps >= 1 and t.batch_size >= 1, "train.steps and train.batch_size must be >= 1")
    _check(t.lr > 0 and 0 <= t.min_lr <= t.lr, "train.lr must be > 0 and 0 <= train.min_lr <= train.lr")
    _check(t.warmup >= 0 and t.grad_clip > 0, "train.warmup must be >= 0 and train.grad_clip > 0")
    _check(t.weight_decay >= 0, f"train.weight_decay must be >= 0, got {t.weight_decay}")
    _check(0 <= t.beta1 < 1 and 0 <= t.beta2 < 1, f"train.beta1 and train.beta2 must be in [0, 1), got {t.beta1}, {t.beta2}")
    _check(t.eval_every >= 1 and t.ckpt_every >= 1, "train.eval_every and train.ckpt_every must be >= 1")
    _check(t.compile in COMPILE, f"train.compile must be one of {COMPILE}, got {t.compile!r}")
    _check(t.attention in ATTENTION, f"train.attention must be one of {ATTENTION}, got {t.attention!r}")
    _check(t.schedule in SCHEDULES, f"train.schedule must be one of {SCHEDULES}, got {t.schedule!r}")
    _check(0.0 < t.decay_frac <= 1.0, f"train.decay_frac must be in (0, 1], got {t.decay_frac}")
    _check(t.emergence_episodes >= 0, f"train.emergence_episodes must be >= 0, got {t.emergence_episodes}")
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
    _check(1 <= th.draws <= 1000, f"theory.draws must lie in [1, 1000], got {th.draws}")
    _check(0 < th.floor < 1 and th.gamma_m >= 0, "theory.floor must be in (0, 1) and theory.gamma_m >= 0")
    ev = cfg.eval
    _check(0 <= ev.family_tasks <= 1 << 20, f"eval.family_tasks must be in [0, {1 << 20}] (0 = off), got {ev.family_tasks}")
    _check(ev.fit_episodes == 0 or 8 <= ev.fit_episodes <= 1 << 20,
           f"eval.fit_episodes must be 0 (off) or in [8, {1 << 20}], got {ev.fit_episodes}")
    _check(0 <= ev.em_states <= 64, f"eval.em_states must be in [0, 64] (0 = the family's n_states, capped at "
           f"{EM_STATES_CAP}), got {ev.em_states}")
    return cfg


def em_states(cfg: Config) -> int:
    """The EM learner's hidden states: eval.em_states, or min(hmm.n_states, EM_STATES_CAP) when it is 0."""
    return cfg.eval.em_states or min(cfg.hmm.n_states, EM_STATES_CAP)


def training_tasks(h: HMMConfig, d: DataConfig) -> int:
    """Distinct training tasks: hmm.n_tasks, or data.n_train with fresh tasks (hmm.n_tasks = 0)."""
    return h.n_tasks if h.n_tasks > 0 else d.n_train


def check_name(name: str, what: str = "name") -> str:
    """A sweep (study) or run name: 1-100 characters of [A-Za-z0-9._-], starting with a letter or digit, no '..'.

    Names become folder names (out/NAME) and run names; this keeps them inside the output root.
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
        raise ConfigError(f"{what} {name!r} is not a safe name: use 1-100 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit (no '..')")
    return name


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
    data = parse_toml(read_text(path, "config file"), path)
    try:
        return override(base or Config(), _nested_to_flat(data))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file; ConfigError (one line) if it is missing, a folder, unreadable or binary, a
    special file (a FIFO, device or socket: refused before it is opened, so a FIFO never blocks), or larger than
    MAX_TEXT_BYTES (`--config /dev/zero` never reads on)."""
    import stat as stat_

    path = Path(path)
    try:
        st = os.stat(path)
        if stat_.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat_.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is a special file (FIFO, device or socket), not a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in meanwhile: no block
        with os.fdopen(fd, "rb") as f:
            if not stat_.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} {path} is a special file (FIFO, device or socket), not a regular file")
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise ConfigError(f"{what} {path} is larger than {MAX_TEXT_BYTES >> 20} MiB: not a config or spec")
        return data.decode("utf-8-sig")  # a leading UTF-8 BOM (some editors write one) is no text
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not a text (UTF-8) file") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read it ({e.strerror or e})") from None


def _depth(v: Any) -> int:
    """Nesting depth of parsed TOML (tables and arrays), without recursion."""
    best, todo = 0, [(v, 0)]
    while todo:
        x, d = todo.pop()
        best = max(best, d)
        if isinstance(x, dict):
            todo.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            todo.extend((y, d + 1) for y in x)
    return best


def parse_toml(text: str, path: str | Path) -> dict[str, Any]:
    """TOML text parsed; ConfigError (one line) if invalid or nested deeper than MAX_TOML_DEPTH levels."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested deeper than {MAX_TOML_DEPTH} levels") from None
    if _depth(data) > MAX_TOML_DEPTH:
        raise ConfigError(f"{path}: nested deeper than {MAX_TOML_DEPTH} levels")
    return data


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


# ---------------------------------------------------------------- memory


GIB = 1 << 30
# The interpreter with what a job imports, as peak RSS: with torch and MLflow (RUNTIME_BYTES), or numpy only for
# generate (RUNTIME_NUMPY_BYTES); tests/measure_memory.py prints real jobs' peaks beside the estimates.
RUNTIME_BYTES = 5 * GIB // 8
RUNTIME_NUMPY_BYTES = GIB // 8
ORACLE_CHUNK = 256  # tasks per chunk of the mixture oracle (inference.mixture_oracle's default)


def _p2(k: int) -> int:
    return 1 << (k - 1).bit_length()


def model_params(m: ModelConfig, vocab_size: int) -> int:
    """Parameters of model.Transformer (tied embedding counted once; LayerNorms; no linear biases)."""
    D, M = m.d_model, m.d_mlp
    n = vocab_size * D + m.n_layers * (4 * D * D + 2 * D * M + 4 * D) + 2 * D
    return n + (m.max_len * D if m.pos_enc == "absolute" else 0)


def train_flops(cfg: Config, steps: int | None = None) -> float:
    """A floor on the floating-point work of training: 6 per parameter per token (forward and backward through
    every weight, the tied embedding's logits included) x batch_size x (episode tokens - 1) x steps (default
    train.steps). Attention, the optimizer and evaluations are not counted: the true work is larger."""
    tokens = cfg.train.batch_size * (seq_len(cfg.data) - 1)
    return 6.0 * model_params(cfg.model, cfg.hmm.n_tokens + 1) * tokens * (cfg.train.steps if steps is None else steps)


def _mixture_bytes(h: HMMConfig) -> int:
    """The larger of make_mixture's peak (float64 factors W, Q and three live (n, S, V) emission
    temporaries) and what stays: the float64 parameters, episodes' float32 inverse-CDF tables (rows
    padded to powers of two) and the float64 cumulative sum of the largest one."""
    n, S, d, V = h.n_tasks, h.n_states, h.rank, h.n_tokens
    build = 8 * n * S * (1 + 2 * d + 3 * V)
    rows = [(n, S), (n * S, d), (n * d, S), (n * S, V)]
    tables = sum(4 * r * _p2(k) for r, k in rows) + max(8 * r * k for r, k in rows)
    return max(build, 8 * n * S * (1 + 2 * d + V) + tables)


def _episodes_bytes(h: HMMConfig, d: DataConfig, n: int) -> int:
    """sample_episodes: tokens + states (N, T) and the sampler's (N (k+1), L) pair, int16 (int32 past 2**15)
    plus its float32 uniforms and intp task/state vectors per sequence."""
    it = 2 if max(h.n_tokens + 1, h.n_states) < 2**15 else 4
    L = max(d.l_demo, d.l_test)
    return n * (2 * it * seq_len(d) + (d.n_demos + 1) * (2 * it * L + 32))


def _oracle_bytes(h: HMMConfig, d: DataConfig, n: int, predictors: int = 1) -> int:
    """mixture_oracle over n episodes in float64, a chunk of C tasks at a time: the scaled forward tables
    (C, N, V d + V) (two buffers, the update, the gathered rows), the kernels (C, S, V d + V) x 2, and
    `predictors` (N, T, V) predictions with the running mixture (x 4)."""
    C, S, V, dd, T = min(ORACLE_CHUNK, h.n_tasks), h.n_states, h.n_tokens, h.rank, seq_len(d)
    return 8 * (4 * C * n * (V * dd + V) + 2 * C * S * (V * dd + V) + (3 + predictors) * n * T * V)


def _train_bytes(cfg: Config, batch_size: int, T: int) -> dict[str, int]:
    m = cfg.model
    vocab = cfg.hmm.n_tokens + 1
    D, M, H, L = m.d_model, m.d_mlp, m.n_heads, m.n_layers
    act = 4 * batch_size * T * (L * (14 * D + 3 * M) + 4 * vocab)  # float32 tensors kept for backward
    if m.window > 0:  # a boolean band mask pushes SDPA onto the math path: (B, H, T, T) weights per layer
        act += 4 * batch_size * H * T * T * 2 * L
    return {"model + AdamW state": 16 * model_params(m, vocab),  # float32 weights, grads and two moments
            "causal mask (max_len^2)": m.max_len ** 2, "activations": act}


def _theory_bytes(th: TheoryConfig) -> dict[str, int]:
    """One setting at a time, at the largest S and d: the dense S x S chain (transition, its factor check,
    the complex eigen-decomposition for the stationary law, Dobrushin's 64-row chunks), and the
    n_histories x (burn_in + max L) histories with the filter's gathers and (B, V d) tables."""
    S, d, V = max(th.n_states), max(th.ranks), th.n_tokens
    n, Hn = th.n_histories, th.burn_in + max(th.lengths)
    return {"dense transition (S x S)": 8 * S * S * (12 + 2 * min(S, 64)),
            "histories": n * Hn * 41 + 8 * n * (V * d + V) * 6}


def memory_estimate(cfg: Config, job: str = "train", *, n_episodes: int | None = None,
                    batch_size: int | None = None, seq: int | None = None,
                    probe_episodes: int = 0, n_perms: int = 0) -> dict[str, tuple[int, str]]:
    """Peak memory of `job` from the config alone: {term: (bytes, "host" | "device")}.

    "device" terms live on the training device (host memory too when it is the CPU). Jobs:
    generate (n_episodes episodes), train (training set, held-out set, mixture oracle, model with AdamW,
    activations of one batch), evaluate and analyze (n_episodes held-out episodes, default data.n_eval; analyze's
    probe_episodes and the shuffle test's n_perms too), theory, bench-train (batch_size x seq tokens),
    bench-oracle (the mixture oracle on n_episodes). The numbers are upper-leaning estimates of what the code keeps
    alive at its peak, read off the code (see each helper's docstring); they are meant to come out somewhat above
    the peak RSS of real CPU runs (tests/measure_memory.py prints both), which is what refusing an impossible job
    needs.
    """
    d = cfg.data
    h = dataclasses.replace(cfg.hmm, n_tasks=training_tasks(cfg.hmm, d))  # fresh tasks: one per training episode
    out: dict[str, tuple[int, str]] = {"runtime": (RUNTIME_NUMPY_BYTES if job == "generate" else RUNTIME_BYTES, "host")}
    if job == "theory":
        out.update({k: (v, "host") for k, v in _theory_bytes(cfg.theory).items()})
        return out
    if job == "bench-train":
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, batch_size or 32, seq or 256).items()})
        return out
    out["mixture"] = (_mixture_bytes(h), "host")
    T = seq_len(d)
    if job == "generate":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_train), "host")
    elif job == "bench-oracle":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_eval), "host")
        out["mixture oracle"] = (_oracle_bytes(h, d, n_episodes or d.n_eval), "host")
    elif job == "train":
        out["episodes"] = (_episodes_bytes(h, d, d.n_train + d.n_eval), "host")
        out["training tokens (int64)"] = (8 * d.n_train * T, "device")
        out["mixture oracle"] = (_oracle_bytes(h, d, d.n_eval), "device")
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, cfg.train.batch_size, T - 1).items()})
        n_em = min(cfg.train.emergence_episodes, d.n_eval)
        if n_em > 0:  # emergence.prepare: data.n_eval unseen tasks and episodes, the oracles on n_em episodes per
            # set, and what stays: 2 sets x (n_demos + 1) k of two oracles' predictions and 4 references' 4 metrics
            kept = 2 * (d.n_demos + 1) * n_em * d.l_test * 8 * (2 * h.n_tokens + 16)
            out["emergence references"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=d.n_eval)) + _episodes_bytes(
                h, d, d.n_eval) + _oracle_bytes(h, d, n_em, predictors=2) + kept, "host")
    elif job in ("evaluate", "analyze"):
        n = n_episodes or d.n_eval
        out["episodes"] = (_episodes_bytes(h, d, n), "host")
        out["model"] = (4 * model_params(cfg.model, h.n_tokens + 1), "device")
        out["causal mask (max_len^2)"] = (cfg.model.max_len ** 2, "device")
        if job == "evaluate":  # figure1: the mixture oracle with model, task-oracle and mixture predictions
            out["oracles"] = (_oracle_bytes(h, d, n, predictors=3), "device")
            # seen and unseen tasks: each k keeps two oracles' predictions and 4 per-token metrics of 6 references
            # on the scored tokens; the EM learner (em_learner.fit_hmm_em, 8 states, 4 restarts) works in chunks of
            # at most em_learner.EM_CHUNK_BYTES (256 MiB)
            out["references (seen + unseen)"] = (2 * 8 * n * d.l_test * (d.n_demos + 1) * (2 * h.n_tokens + 24), "host")
            ev = cfg.eval  # the family-Bayes tasks (its oracle in chunks, as the mixture oracle's), unseen and fit tasks
            out["family, unseen and fit tasks"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=max(1, ev.family_tasks)))
                                                   + _mixture_bytes(dataclasses.replace(h, n_tasks=n + ev.fit_episodes))
                                                   + _oracle_bytes(h, d, n, predictors=1), "host")
            em_rows = n * d.n_demos * (d.n_demos + 1) // 2 * 4
            out["EM learner"] = (min(256 << 20, em_rows * 8 * d.l_demo * 8 * 8), "host")
        else:  # probes: layer chunks within a 1 GiB budget, task beliefs and the shuffle test's batches
            out["residual streams"] = (min(GIB, 4 * n * 32 * cfg.model.d_model * (cfg.model.n_layers + 1)), "host")
            out["beliefs and targets"] = (n * 32 * (4 * h.n_states + 64), "host")
            if n_perms:  # shuffle.shuffle_test: the (n_perms, n, k) int64 orders drawn at once, then one episode's
                # 1 + n_perms rows at a time at least (their tokens, one layer's scores, the residual stream)
                T, m = seq_len(d), cfg.model
                out["shuffle permutations"] = (8 * n_perms * n * d.n_demos + (1 + n_perms) * (
                    (T - 1) ** 2 * m.n_heads * 4 + 8 * T + 4 * T * m.d_model), "host")
            if probe_episodes:  # episodes.probe_episodes: probe_tasks x per_task episodes and their beliefs
                out["probe episodes"] = (_episodes_bytes(h, d, probe_episodes)
                                         + probe_episodes * 32 * (4 * h.n_states + 64), "host")
    else:
        raise ValueError(f"unknown job {job!r}")
    return out
