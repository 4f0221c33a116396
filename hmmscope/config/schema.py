"""The config's dataclasses and their ranges: one frozen dataclass per section (hmm, data, model, train, theory,
eval) with its defaults, `Config` holding them, `validate` (every range, one line naming the key), the safe-name rule
(`check_name`) and what follows from a config alone (`seq_len`, `training_tasks`, `em_states`). Imports nothing of
hmmscope; changed only through `config.overrides.override`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration value or key is invalid (one-line message)."""


SEED_MAX = 2**32 - 1
INT_MAX = 2**53  # every integer setting is bounded before arithmetic sees it (exact as a float; no OverflowError)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
FAMILIES = ("dirichlet", "sticky")
STRUCTURES = ("all", "half", "half-heldout")  # hmm.structures (hmm.make_mixture)
TEST_STARTS = ("initial", "midstream")
POS_ENCODINGS = ("rope", "absolute", "none", "sinusoidal")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "constant", "wsd")
# the run-time keys: how a run runs, not what it trains on or what its model is (the evaluation's Bayes-optimal reference
# is recomputed from the config); a resumed run or sweep may change them (README: "Sweep specs")
RUNTIME_KEYS = ("train.device", "train.compile", "train.attention", "train.figures", "eval.bayes", "eval.bayes_tol")
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
    bayes: bool = True  # the Bayes-optimal reference for fresh tasks, where the family allows it (SCIENCE.md 10)
    bayes_tol: float = 0.002  # nats/token: its Monte Carlo draws are doubled until its CE moves less than this


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
    _check(math.isfinite(ev.bayes_tol) and 1e-5 <= ev.bayes_tol <= 0.5,
           f"eval.bayes_tol must be in [1e-5, 0.5] nats/token, got {ev.bayes_tol}")
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
