"""Sweep specs: the TOML format, parsed and validated strictly before any study or run exists.

Spec format (TOML, validated strictly by `load_spec` before any study or run exists)::

    [sweep]
    name = "smoke"                 # the Optuna study name: 1-100 of [A-Za-z0-9._-] (it names folders)
    base = "tiny"                  # a preset, or: config = "path.toml" (relative to the spec file)
    kind = "train"                 # train | theory | headroom (the room above counting, hmm/data/eval keys only; trains nothing)
    objective = "eval/seen/excess_ce"   # a metric the trial logs (see OBJECTIVES below; checked here)
    direction = "minimize"         # minimize | maximize
    sampler = "grid"               # grid | tpe | random
    pruner = "none"                # none | median (train kind: reports objective at every evaluation)
    n_trials = 20                  # tpe / random only; grid = grid size x len(seeds)
    seeds = [0, 1]                 # replicates (see below), each in [0, 2**32 - 1]
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

    [report]                       # how the report reads the results (sweep.effects; not part of the identity)
    margin = 0.01                  # equivalence margin, objective's units (default: 0.01 for nats/token)
    reference = "other-sweep"      # a sweep holding this one's base cell; references = {key = level}; tuned = [keys]

Command-line overrides. `hmmscope sweep run SPEC --set key=value` (`with_sets`) fixes a config key for every
trial after [fixed], through `config.override` (unknown keys and wrong types refused); a key the spec sweeps
in [space] is refused. The values join the spec's text as a [set] table (a spec file may hold one too: it is
applied after [fixed]), so the study stores them and its workers use them, and they are part of the identity
below: a study created without them is not resumed with them (one line: rename the sweep, `--name NEW`), except the
run-time keys (config.RUNTIME_KEYS: train.device, train.compile, train.attention, train.figures, eval.bayes,
eval.bayes_tol), which do not.

Identity. A study remembers its spec; running a spec under an existing study's name needs the same
identity (`SweepSpec.hash`, sha256 of the canonical parsed spec), or one that grows it (more seeds, more numeric
grid levels: spec_diff.py): the keys that change what a trial computes or how trials are chosen and scored.
Run-time keys do not count: storage, heartbeat_interval, grace_period, max_retry (sweep table), and the config keys
train.device, train.compile, train.attention, train.figures, eval.bayes and eval.bayes_tol (config.RUNTIME_KEYS, in
[fixed] or in the base config; the trainer accepts the same keys changed on resume). So moving a sweep to a GPU,
giving it a longer heartbeat or turning its trials' own figures off keeps its name; the study then stores the new
text.
The experiment counts: a sweep's runs stay in one MLflow experiment. Defaults and explicit values are the
same identity (the canonical form is the parsed spec, not its text).

Trial names. A trial's MLflow run is named after what varies (`SweepSpec.trial_name`): each [space] key
as a short label and value (strings as they are: `rope`; numbers after an abbreviation: `g0.5` for
hmm.gamma, see ABBREV), then the replicate seed (`s0`), e.g. `rope-g0.5-s0`.

Pruning. The median pruner compares a trial's intermediate values at each evaluation of the training
loop, which logs the learning curve val/* (training/train.py), not the Figure 1 metrics eval/* (computed once, at
the end). A pruned spec's objective must be a val/* key or an eval/* key with a learning-curve proxy
(PRUNE_PROXY: eval/seen/excess_ce -> val/excess_ce, eval/seen/test_acc -> val/test_acc, eval/seen/test_ce ->
val/test_loss; the learning curve is measured on the seen tasks' eval episodes); the proxy is what the trial
reports at each evaluation (`SweepSpec.prune_metric`).

Renamed keys. Figure 1's metrics were eval/<name> before seen and unseen tasks were evaluated apart; they are
eval/seen/<name> now, and a training run's oracle/test_acc, oracle/test_loss (the same numbers as Figure 1's
eval/seen/oracle_mix_test_acc, _ce) are no longer logged (LEGACY_OBJECTIVES); a spec naming an old key is
refused with the new name in the message.
"""


from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from ..config import SEED_MAX, Config, ConfigError, check_name, flatten, load_toml, override, parse_toml, preset, read_text
from ..tracking.store import check_experiment_name
from .effects import check_options
from .space import check_grid_values, check_range, check_space_given, distinct_labels, range_probe

SWEEP_KEYS = {"name", "base", "config", "kind", "objective", "direction", "sampler", "pruner", "n_trials",
              "seeds", "storage", "analyze", "experiment", "heartbeat_interval", "grace_period", "max_retry",
              "sampler_seed", "prune_startup"}
TABLES = {"sweep", "fixed", "space", "set", "report"}  # [report]: how results are read (sweep.effects)
KINDS, SAMPLERS, PRUNERS, DIRECTIONS = ("train", "theory", "headroom"), ("grid", "tpe", "random"), ("none", "median"), \
    ("minimize", "maximize")
DIST_KEYS = {"grid", "choices", "low", "high", "log", "step"}
MAX_GRID = 100_000
# The metrics a trial returns (sweep.run_trial), hence the objectives a spec may name. Train trials:
# train.train's final val/* and oracle/*, then jobs.evaluate_run's Figure 1 headline (evaluate.Figure1Result
# .headline), memory/* when model.window > 0 (evaluate.memory_comparison), and with analyze = true the
# analysis metrics (jobs._analysis_metrics). Theory trials: sweep.trial.theory_metrics. tests/test_sweep_spec
# checks these sets against the metrics real trials return.
_FIGURE1 = ("test_acc", "test_ce", "oracle_mix_test_acc", "oracle_mix_test_ce", "oracle_task_test_acc",
            "oracle_task_test_ce", "kl_mix", "kl_task", "excess_ce", "excess_ce_task", "gap_to_mix", "gap_to_task")
TRAIN_OBJECTIVES = frozenset(
    [f"val/{k}" for k in ("loss", "acc", "test_loss", "test_acc")] + ["oracle/loss", "oracle/acc"]
    + ["val/excess_ce", "eval/seen/p_true_task", "eval/retrieval_gap", "eval/retrieval_gap_lo", "eval/retrieval_gap_hi"]
    + [f"eval/{t}/{k}" for t in ("seen", "unseen") for k in _FIGURE1]
    + [f"eval/{t}/icl_gain{s}" for t in ("seen", "unseen") for s in ("", "_lo", "_hi")]
    + [f"eval/unseen/vs_best_counting{s}" for s in ("", "_lo", "_hi")] + ["eval/figure1_s"])
_MIXTURE_ONLY = frozenset(k for k in TRAIN_OBJECTIVES if k.startswith("eval/seen/") or k.startswith("eval/retrieval_gap")
                          or "oracle_mix" in k or k.endswith("/gap_to_mix"))  # absent with fresh tasks
BASELINE_OBJECTIVE = re.compile(r"baseline/(seen|unseen)/(mixture_oracle|family_bayes|incontext_unigram|incontext_bigram"
                                r"|incontext_ngram|incontext_ctw|best_counting|incontext_hmm)/(ce|acc|icl_gain)(_k0)?")
VS_OBJECTIVE = re.compile(r"eval/unseen/vs/[a-z_]+/k\d+(_lo|_hi)?")
HEADROOM_OBJECTIVES = frozenset(["headroom/room", "headroom/room_lo", "headroom/room_hi", "headroom/seconds"])
HEADROOM_OBJECTIVE = re.compile(r"headroom/room/k\d+(_lo|_hi)?|headroom/[a-z_0-9]+/ce/k\d+")
HEADROOM_SECTIONS = ("hmm.", "data.", "eval.")  # what a headroom trial reads (it trains nothing)
LEGACY_OBJECTIVES = {**{f"eval/{k}": f"eval/seen/{k}" for k in (*_FIGURE1, "p_true_task")},
                     "oracle/test_acc": "eval/seen/oracle_mix_test_acc", "oracle/test_loss": "eval/seen/oracle_mix_test_ce"}
MEMORY_OBJECTIVE = re.compile(r"memory/[a-z0-9_]+")
ANALYSIS_OBJECTIVE = re.compile(r"shuffle/layer\d+/norm_change(_lo|_hi)?|probe/[a-z0-9_]+/layer\d+/[a-z0-9_]+"
                                r"|claim/[A-Za-z0-9_]+/(value|ci_lo|ci_hi)")
THEORY_OBJECTIVES = frozenset(
    ["theory/dobrushin", "theory/rate", "theory/rate_lo", "theory/rate_hi", "theory/log_intercept"]
    + [f"theory/{k}{s}" for k in ("gamma_O", "gamma_eff") for s in ("", "_lower", "_upper")])
GAMMA_M_OBJECTIVES = frozenset(f"theory/gamma_m{s}" for s in ("", "_lower", "_upper"))
PRUNE_PROXY = {"eval/seen/excess_ce": "val/excess_ce", "eval/seen/test_acc": "val/test_acc",
               "eval/seen/test_ce": "val/test_loss"}
# Identity (module docstring): sweep keys that do not count, and config keys that do not.
RUNTIME_SWEEP_KEYS = frozenset({"storage", "heartbeat_interval", "grace_period", "max_retry"})
RUNTIME_CONFIG = frozenset(config.RUNTIME_KEYS)
# Trial names: short labels of common config keys (by their last part); others use that last part.
ABBREV = {"gamma": "g", "gammas": "g", "rank": "d", "ranks": "d", "rho": "rho", "rhos": "rho", "n_states": "S",
          "n_tasks": "T", "n_tokens": "V", "n_layers": "L", "n_heads": "H", "d_model": "dm", "d_mlp": "dmlp",
          "window": "w", "n_demos": "k", "l_demo": "ld", "l_test": "lt", "lr": "lr", "steps": "steps",
          "batch_size": "bs", "weight_decay": "wd", "pos_enc": "", "family": "", "precision": "", "test_start": ""}


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
        """The learning-curve metric a pruned trial reports at each evaluation (module docstring)."""
        if self.objective.startswith("val/"):
            return self.objective
        return PRUNE_PROXY.get(self.objective)

    def trial_name(self, params: Mapping[str, Any], seed: int | None = None) -> str:
        """The run name of a trial: what varies, then the seed (module docstring), e.g. `rope-g0.5-s0`."""
        labels = short_labels([p.key for p in self.space])
        parts = [_label_value(labels[p.key], params[p.key]) for p in self.space if p.key in params]
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


def _label_value(label: str, v: Any) -> str:
    if isinstance(v, bool):
        return label if v else f"no{label}" if label else str(v).lower()
    if isinstance(v, float):
        text = f"{v:.4g}"
    elif isinstance(v, (list, tuple)):
        text = "_".join(_label_value("", x) for x in v)
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


def _err(path: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {msg}")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_spec(text: str, path: str | Path = "<spec>", *, base: Config | None = None) -> SweepSpec:
    """Parse and validate spec text; ConfigError '<file>: <key>: <why>' on the first problem."""
    path = str(path)
    data = parse_toml(text, path)
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
    try:
        check_name(name, "the name")
    except ConfigError as e:
        raise _err(path, "sweep.name", str(e)) from None
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
    objective = get("objective", str, {"theory": "theory/rate", "headroom": "headroom/room"}.get(kind, "eval/seen/excess_ce"))
    if pruner != "none" and not objective.startswith("val/") and objective not in PRUNE_PROXY:
        raise _err(path, "sweep.pruner", f"pruning needs an objective the training loop reports at every evaluation "
                                         f"(a val/* key, or one of {', '.join(sorted(PRUNE_PROXY))}), got {objective!r}")
    seeds = get("seeds", list, [0])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= SEED_MAX for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise _err(path, "sweep.seeds", f"must be a non-empty list of distinct ints in [0, {SEED_MAX}], got {seeds!r}")
    ints = {}
    for k, default, lo, hi in (("heartbeat_interval", 60, 1, 3600), ("grace_period", None, 1, 7 * 86400),
                               ("max_retry", 2, 0, 100), ("sampler_seed", 0, 0, SEED_MAX),
                               ("prune_startup", 2, 0, MAX_GRID)):
        v = sw.get(k, default)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise _err(path, f"sweep.{k}", f"must be an int >= {lo}, got {v!r}")
        if v > hi:  # seconds, counts: beyond these a sweep never notices a dead worker, or never stops retrying
            raise _err(path, f"sweep.{k}", f"must be at most {hi}, got {v!r}")
        if k == "sampler_seed" and v > SEED_MAX:
            raise _err(path, f"sweep.{k}", f"must be in [0, {SEED_MAX}], got {v!r}")
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
            if kind == "headroom" and not k.startswith(HEADROOM_SECTIONS):
                raise _err(path, f"{table}.{k}", "kind='headroom' sweeps only hmm.*, data.* and eval.* keys (it trains "
                                                 "nothing)")

    check_keys("fixed", fixed)
    sets = data.get("set", {})  # command-line overrides (`with_sets`), after [fixed]
    check_keys("set", sets)
    seeded = seed_keys(kind, 0)  # no value given where another would silently replace it:
    for table, keys in (("fixed", fixed), ("set", sets), ("space", space)):
        for k in keys:
            if k in seeded:  # a replicate seed key, set per trial from sweep.seeds
                raise _err(path, f"{table}.{k}", "is set per trial from sweep.seeds (its replicate seed; here it would "
                                                 "be dropped); give the seeds as sweep.seeds")
            if table == "fixed" and k in space:
                raise _err(path, f"fixed.{k}", "is also swept in [space] (its [fixed] value would be dropped); give it "
                                               "in one place")
    for k, v in sets.items():
        if k in space:
            raise _err(path, f"set.{k}", "is swept in [space]; --set fixes keys the spec does not sweep")
        try:
            override(base, {k: v})
        except ConfigError as e:
            raise _err(path, f"set.{k}", str(e)) from None
    fixed = {**fixed, **sets}
    try:
        base_fixed = override(base, fixed)
    except ConfigError as e:
        keys = list(fixed)  # the first key whose value, on top of those before it, fails (alone: another key blamed)
        bad = next((k for i, k in enumerate(keys) if _bad_key(base, {j: fixed[j] for j in keys[:i + 1]})), None)
        table = "set" if bad in sets and bad not in data.get("fixed", {}) else "fixed"
        close = difflib.get_close_matches(bad or "", list(flatten(base)), n=1) if "unknown config key" in str(e) else []
        raise _err(path, f"{table}.{bad}" if bad is not None else "fixed",
                   f"{e}; did you mean {close[0]}?" if close else str(e)) from None
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
            check_range(path, where, lo, hi, step)
            probe = range_probe(lo, hi, log, step)
        seen: dict[str, Any] = {}
        for v in probe:  # unknown keys and type/range errors of each value; interior values of a range too
            try:
                got = flatten(override(base_fixed, {key: v}))[key]
            except ConfigError as e:
                inside = "" if v in (probe[0], probe[-1]) or cat else f"the value {v!r} inside the range: "
                raise _err(path, where, inside + str(e)) from None
            if cat and repr(got) in seen:  # 1 and 1.0 for a float key: one cell run twice under one name
                raise _err(path, where, f"{cat[0]} values {seen[repr(got)]!r} and {v!r} are the same value "
                                        f"({got!r}) for {key}")
            seen[repr(got)] = v
        if cat:
            check_grid_values(path, where, key, vals, flatten(base_fixed).get(key), cat[0])
        params.append(p)
    params_t = tuple(params)
    experiment = get("experiment", str, "hmmscope-sweeps") or "hmmscope-sweeps"
    try:
        check_experiment_name(experiment)  # the rule of --experiment
    except ValueError as e:
        raise _err(path, "sweep.experiment", str(e).replace("--experiment ", "", 1)) from None
    spec_kw = dict(kind=kind, objective=objective, direction=direction, sampler=sampler, pruner=pruner,
                   seeds=tuple(seeds), storage=get("storage", str, ""), analyze=get("analyze", bool, False),
                   experiment=experiment,
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
        if n > MAX_GRID:  # each trial is a row in the study and a run: the grid's bound holds here too
            raise _err(path, "sweep.n_trials", f"must be at most {MAX_GRID}, got {n}")
    check_space_given(path, "space" in data, n)  # a spec cut before its [space] is no one-trial sweep
    labels = short_labels([p.key for p in params_t])
    for p in params_t:  # each grid value its own trial name
        if p.grid is not None:
            distinct_labels(path, f"space.{p.key}", [(v, _label_value(labels[p.key], v)) for v in p.grid])
    check_options(path, data.get("report", {}), [p.key for p in params_t])  # not part of the identity
    spec = SweepSpec(name=name, path=path, text=text, hash=identity_hash(name, spec_kw, n, base),
                     base=base, n_trials=n, **spec_kw)
    if sampler == "grid":  # every combination must be a valid config (e.g. rank <= n_states)
        cfgs = []
        for pt in spec.grid_points():
            try:
                cfgs.append(spec.trial_config(pt))
            except ConfigError as e:
                raise _err(path, "space", f"grid point {pt}: {e}") from None
            _check_theory_single(spec, cfgs[-1], path)
    else:  # one sample point (the first choice / lower bound of each parameter)
        pt = {p.key: p.grid[0] if p.grid is not None else p.low for p in params_t}
        try:
            cfgs = [spec.trial_config({**pt, "seed": seeds[0]})]
        except ConfigError as e:
            raise _err(path, "space", f"point {pt}: {e}") from None
        _check_theory_single(spec, cfgs[0], path)
    _check_objective(spec, cfgs, path)
    return spec


def identity_hash(name: str, kw: Mapping[str, Any], n_trials: int, base: Config) -> str:
    """sha256 (16 hex) of what makes a sweep's results: the parsed spec less its run-time keys (module docstring)."""
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


def objectives(spec: SweepSpec, cfg: Config) -> tuple[frozenset[str], tuple[re.Pattern, ...]]:
    """(names, patterns) of the metrics a trial of `spec` with config `cfg` returns."""
    if spec.kind == "theory":
        return THEORY_OBJECTIVES | (GAMMA_M_OBJECTIVES if cfg.theory.gamma_m > 0 else frozenset()), ()
    if spec.kind == "headroom":
        return HEADROOM_OBJECTIVES, (HEADROOM_OBJECTIVE,)
    pats = ((BASELINE_OBJECTIVE, VS_OBJECTIVE) + ((MEMORY_OBJECTIVE,) if cfg.model.window > 0 else ())
            + ((ANALYSIS_OBJECTIVE,) if spec.analyze else ()))
    names = TRAIN_OBJECTIVES - _MIXTURE_ONLY if cfg.hmm.n_tasks == 0 else TRAIN_OBJECTIVES
    if cfg.hmm.n_tasks == 0 and cfg.eval.family_tasks == 0:  # no oracle/* without a mixture or family Bayes
        names = names - {"oracle/loss", "oracle/acc", "val/excess_ce"}
    if cfg.eval.fit_episodes == 0:
        names = names - {f"eval/unseen/vs_best_counting{s}" for s in ("", "_lo", "_hi")}
    return names, pats


def _check_objective(spec: SweepSpec, cfgs: list[Config], path: str) -> None:
    """The objective must be a metric every trial returns (else each trial would train fully, then fail)."""
    for cfg in cfgs:
        names, pats = objectives(spec, cfg)
        if spec.objective not in names and not any(p.fullmatch(spec.objective) for p in pats):
            hint = (f" ({spec.objective} was renamed {LEGACY_OBJECTIVES[spec.objective]}: Figure 1 is measured on seen "
                    "and unseen tasks apart, and logs the oracle's test segment once)"
                    if spec.objective in LEGACY_OBJECTIVES else "")
            raise _err(path, "sweep.objective", f"{spec.objective!r} is not a metric every {spec.kind} trial of this "
                                                f"spec logs{hint} (e.g. {', '.join(sorted(names)[:4])}, ...)")


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


def with_sets(spec: SweepSpec, sets: Mapping[str, Any]) -> SweepSpec:
    """`spec` with the command line's `--set key=value` overrides (module docstring): each checked by
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
    """Read and validate a sweep spec file (see the module docstring); ConfigError names file and key."""
    p = Path(path)
    return parse_spec(read_text(p, "sweep spec"), p.resolve())
