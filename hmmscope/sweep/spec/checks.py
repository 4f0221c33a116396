"""A sweep spec's validation, table by table, before any study or run exists: the tables and the [sweep] keys, its
settings' types and ranges, the [fixed] and [set] keys (per kind), each [space] entry (tried on the config), the
trial count, every grid point a valid config, and the objective a metric every trial logs.

Each check raises ConfigError '<file>: <key>: <why>' (`spec_error`) on the first problem; `spec.parse` calls them in
the order the spec reads. Imports `spec.typed` and `spec.objectives` (never `spec.parse`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from ...config import SEED_MAX, Config, ConfigError, check_name, flatten, override
from ...tracking.store import check_experiment_name
from ..space import check_grid_values, check_range, range_probe
from .objectives import LEGACY_OBJECTIVES, PRUNE_PROXY, objectives
from .typed import Param, SweepSpec, seed_keys

SWEEP_KEYS = {"name", "base", "config", "kind", "objective", "direction", "sampler", "pruner", "n_trials",
              "seeds", "storage", "analyze", "experiment", "heartbeat_interval", "grace_period", "max_retry",
              "sampler_seed", "prune_startup"}
TABLES = {"sweep", "fixed", "space", "set", "report"}  # [report]: how results are read (sweep.effects)
KINDS, SAMPLERS, PRUNERS, DIRECTIONS = ("train", "theory", "headroom"), ("grid", "tpe", "random"), ("none", "median"), \
    ("minimize", "maximize")
DIST_KEYS = {"grid", "choices", "low", "high", "log", "step"}
MAX_GRID = 100_000
HEADROOM_SECTIONS = ("hmm.", "data.", "eval.")  # what a headroom trial reads (it trains nothing)


def spec_error(path: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {msg}")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_tables(path: str, data: Mapping[str, Any]) -> None:
    """Known tables only, each a table; known [sweep] keys only."""
    for t in data:
        if t not in TABLES:
            raise spec_error(path, t, f"unknown table (known: {', '.join(sorted(TABLES))})")
        if not isinstance(data[t], dict):
            raise spec_error(path, t, "must be a table")
    for k in data.get("sweep", {}):
        if k not in SWEEP_KEYS:
            raise spec_error(path, f"sweep.{k}", f"unknown key (known: {', '.join(sorted(SWEEP_KEYS))})")


def setting(path: str, sw: Mapping[str, Any], k: str, typ: type | tuple, default: Any) -> Any:
    """The [sweep] table's value of `k` (else `default`), of type `typ` (a bool is no int)."""
    v = sw.get(k, default)
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise spec_error(path, f"sweep.{k}", f"expected {getattr(typ, '__name__', typ)}, got {v!r}")
    return v


def sweep_choices(path: str, sw: Mapping[str, Any]) -> dict[str, Any]:
    """The [sweep] table's name, kind, sampler, pruner, direction and objective, each checked."""
    name = setting(path, sw, "name", str, "")
    if not name:
        raise spec_error(path, "sweep.name", "required (the study name)")
    try:
        check_name(name, "the name")
    except ConfigError as e:
        raise spec_error(path, "sweep.name", str(e)) from None
    kind = setting(path, sw, "kind", str, "train")
    sampler = setting(path, sw, "sampler", str, "grid")
    pruner = setting(path, sw, "pruner", str, "none")
    direction = setting(path, sw, "direction", str, "minimize")
    for k, v, ok in (("kind", kind, KINDS), ("sampler", sampler, SAMPLERS), ("pruner", pruner, PRUNERS),
                     ("direction", direction, DIRECTIONS)):
        if v not in ok:
            raise spec_error(path, f"sweep.{k}", f"must be one of {ok}, got {v!r}")
    if pruner != "none" and kind != "train":
        raise spec_error(path, "sweep.pruner", "pruning needs kind='train' (intermediate evaluations)")
    objective = setting(path, sw, "objective", str,
                        {"theory": "theory/rate", "headroom": "headroom/room"}.get(kind, "eval/seen/excess_ce"))
    if pruner != "none" and not objective.startswith("val/") and objective not in PRUNE_PROXY:
        raise spec_error(path, "sweep.pruner", f"pruning needs an objective the training loop reports at every evaluation "
                                               f"(a val/* key, or one of {', '.join(sorted(PRUNE_PROXY))}), got {objective!r}")
    return dict(name=name, kind=kind, sampler=sampler, pruner=pruner, direction=direction, objective=objective)


def sweep_seeds(path: str, sw: Mapping[str, Any]) -> list[int]:
    """sweep.seeds: a non-empty list of distinct seeds."""
    seeds = setting(path, sw, "seeds", list, [0])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= SEED_MAX for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise spec_error(path, "sweep.seeds", f"must be a non-empty list of distinct ints in [0, {SEED_MAX}], got {seeds!r}")
    return seeds


def sweep_ints(path: str, sw: Mapping[str, Any]) -> dict[str, int]:
    """The [sweep] table's integer settings (heartbeat, grace period, retries, sampler seed, pruner start-up), each in
    its range; grace_period defaults to 3 heartbeats and must exceed one."""
    ints = {}
    for k, default, lo, hi in (("heartbeat_interval", 60, 1, 3600), ("grace_period", None, 1, 7 * 86400),
                               ("max_retry", 2, 0, 100), ("sampler_seed", 0, 0, SEED_MAX),
                               ("prune_startup", 2, 0, MAX_GRID)):
        v = sw.get(k, default)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise spec_error(path, f"sweep.{k}", f"must be an int >= {lo}, got {v!r}")
        if v > hi:  # seconds, counts: beyond these a sweep never notices a dead worker, or never stops retrying
            raise spec_error(path, f"sweep.{k}", f"must be at most {hi}, got {v!r}")
        if k == "sampler_seed" and v > SEED_MAX:
            raise spec_error(path, f"sweep.{k}", f"must be in [0, {SEED_MAX}], got {v!r}")
        ints[k] = v
    ints.setdefault("grace_period", 3 * ints["heartbeat_interval"])
    if ints["grace_period"] <= ints["heartbeat_interval"]:
        raise spec_error(path, "sweep.grace_period", "must be > heartbeat_interval")
    return ints


def check_kind_keys(path: str, kind: str, table: str, keys) -> None:
    """A theory sweep sets only theory.* keys; a headroom sweep only hmm.*, data.* and eval.* keys."""
    for k in keys:
        if kind == "theory" and not k.startswith("theory."):
            raise spec_error(path, f"{table}.{k}", "kind='theory' sweeps only theory.* keys")
        if kind == "headroom" and not k.startswith(HEADROOM_SECTIONS):
            raise spec_error(path, f"{table}.{k}", "kind='headroom' sweeps only hmm.*, data.* and eval.* keys (it trains "
                                                   "nothing)")


def fixed_config(path: str, data: Mapping[str, Any], kind: str, base: Config) -> tuple[dict[str, Any], Config]:
    """([fixed] then [set] as one table, the base config with them): no key given where another would silently
    replace it (a replicate seed key, a swept key), each [set] value valid alone, all of them valid together."""
    fixed, space = data.get("fixed", {}), data.get("space", {})
    check_kind_keys(path, kind, "fixed", fixed)
    sets = data.get("set", {})  # command-line overrides (`with_sets`), after [fixed]
    check_kind_keys(path, kind, "set", sets)
    seeded = seed_keys(kind, 0)  # no value given where another would silently replace it:
    for table, keys in (("fixed", fixed), ("set", sets), ("space", space)):
        for k in keys:
            if k in seeded:  # a replicate seed key, set per trial from sweep.seeds
                raise spec_error(path, f"{table}.{k}", "is set per trial from sweep.seeds (its replicate seed; here it "
                                                       "would be dropped); give the seeds as sweep.seeds")
            if table == "fixed" and k in space:
                raise spec_error(path, f"fixed.{k}", "is also swept in [space] (its [fixed] value would be dropped); "
                                                     "give it in one place")
    for k, v in sets.items():
        if k in space:
            raise spec_error(path, f"set.{k}", "is swept in [space]; --set fixes keys the spec does not sweep")
        try:
            override(base, {k: v})
        except ConfigError as e:
            raise spec_error(path, f"set.{k}", str(e)) from None
    fixed = {**fixed, **sets}
    try:
        return fixed, override(base, fixed)
    except ConfigError as e:
        keys = list(fixed)  # the first key whose value, on top of those before it, fails (alone: another key blamed)
        bad = next((k for i, k in enumerate(keys) if _bad_key(base, {j: fixed[j] for j in keys[:i + 1]})), None)
        table = "set" if bad in sets and bad not in data.get("fixed", {}) else "fixed"
        close = difflib.get_close_matches(bad or "", list(flatten(base)), n=1) if "unknown config key" in str(e) else []
        raise spec_error(path, f"{table}.{bad}" if bad is not None else "fixed",
                         f"{e}; did you mean {close[0]}?" if close else str(e)) from None


def _bad_key(base: Config, upd: Mapping[str, Any]) -> bool:
    try:
        override(base, upd)
        return False
    except ConfigError:
        return True


def space_params(path: str, space: Mapping[str, Any], kind: str, sampler: str, base_fixed: Config) -> tuple[Param, ...]:
    """The [space] table as Params, in its order, each entry checked (`space_param`)."""
    check_kind_keys(path, kind, "space", space)
    return tuple(space_param(path, key, d, sampler, base_fixed) for key, d in space.items())


def space_param(path: str, key: str, d: Any, sampler: str, base_fixed: Config) -> Param:
    """One [space] entry: a grid (or choices) of distinct scalars, or a range (low/high[/log/step]; not with a grid
    sampler); each value (a range's ends and interior probes) tried on the config."""
    where = f"space.{key}"
    if key == "seed":
        raise spec_error(path, where, "use sweep.seeds for replicates")
    if not isinstance(d, dict):
        raise spec_error(path, where, "must be a table like {grid=[...]} or {low=..., high=...}")
    for dk in d:
        if dk not in DIST_KEYS:
            raise spec_error(path, f"{where}.{dk}", f"unknown key (known: {', '.join(sorted(DIST_KEYS))})")
    cat = [k for k in ("grid", "choices") if k in d]
    if len(cat) > 1 or (cat and any(k in d for k in ("low", "high", "log", "step"))):
        raise spec_error(path, where, "give one of grid, choices, or low/high[/log/step]")
    if cat:
        vals = d[cat[0]]
        if not isinstance(vals, list) or not vals:
            raise spec_error(path, where, f"{cat[0]} must be a non-empty list")
        if not all(isinstance(v, (int, float, str, bool)) for v in vals) or len(set(map(repr, vals))) != len(vals):
            raise spec_error(path, where, f"{cat[0]} values must be distinct scalars, got {vals!r}")
        p, probe = Param(key, grid=tuple(vals)), list(vals)
    else:
        p = _range_param(path, where, key, d, sampler)
        probe = range_probe(p.low, p.high, p.log, p.step)
    _try_values(path, where, key, probe, base_fixed, cat[0] if cat else None)
    if cat:
        check_grid_values(path, where, key, vals, flatten(base_fixed).get(key), cat[0])
    return p


def _range_param(path: str, where: str, key: str, d: Mapping[str, Any], sampler: str) -> Param:
    """A [space] range: numbers low < high, log a boolean (then low > 0), step > 0 (not with log)."""
    if sampler == "grid":
        raise spec_error(path, where, "sampler='grid' needs {grid=[...]} (a distribution cannot be enumerated)")
    lo, hi, log, step = d.get("low"), d.get("high"), d.get("log", False), d.get("step")
    if not (is_number(lo) and is_number(hi)):
        raise spec_error(path, where, f"low and high must be numbers, got {lo!r}, {hi!r}")
    if not lo < hi:
        raise spec_error(path, where, f"low must be < high, got low={lo} high={hi}")
    if not isinstance(log, bool):
        raise spec_error(path, f"{where}.log", "must be true or false")
    if log and lo <= 0:
        raise spec_error(path, where, f"log=true needs low > 0, got {lo}")
    if step is not None and (not is_number(step) or step <= 0 or log):
        raise spec_error(path, f"{where}.step", "must be a number > 0 (and not with log=true)")
    check_range(path, where, lo, hi, step)
    return Param(key, low=lo, high=hi, log=log, step=step)


def _try_values(path: str, where: str, key: str, probe: list, base_fixed: Config, cat: str | None) -> None:
    """Unknown keys and type/range errors of each value; interior values of a range too; two grid values that are the
    same value for the key (1 and 1.0 for a float key: one cell run twice under one name)."""
    seen: dict[str, Any] = {}
    for v in probe:
        try:
            got = flatten(override(base_fixed, {key: v}))[key]
        except ConfigError as e:
            inside = "" if v in (probe[0], probe[-1]) or cat else f"the value {v!r} inside the range: "
            raise spec_error(path, where, inside + str(e)) from None
        if cat and repr(got) in seen:
            raise spec_error(path, where, f"{cat} values {seen[repr(got)]!r} and {v!r} are the same value "
                                          f"({got!r}) for {key}")
        seen[repr(got)] = v


def experiment_name(path: str, sw: Mapping[str, Any]) -> str:
    """sweep.experiment (default hmmscope-sweeps), by the rule of --experiment."""
    experiment = setting(path, sw, "experiment", str, "hmmscope-sweeps") or "hmmscope-sweeps"
    try:
        check_experiment_name(experiment)  # the rule of --experiment
    except ValueError as e:
        raise spec_error(path, "sweep.experiment", str(e).replace("--experiment ", "", 1)) from None
    return experiment


def trial_count(path: str, sw: Mapping[str, Any], sampler: str, params: tuple[Param, ...], seeds: list[int]) -> int:
    """A grid's size x seeds (no n_trials given), else sweep.n_trials; at most MAX_GRID."""
    if sampler == "grid":
        if "n_trials" in sw:
            raise spec_error(path, "sweep.n_trials", "not used with sampler='grid' (grid size x seeds)")
        n = math.prod(len(p.grid) for p in params) * len(seeds)
        if n > MAX_GRID:
            raise spec_error(path, "space", f"grid has {n} points x seeds (max {MAX_GRID})")
        return n
    n = setting(path, sw, "n_trials", int, 0)
    if n < 1:
        raise spec_error(path, "sweep.n_trials", f"must be an int >= 1 for sampler={sampler!r}, got {n!r}")
    if n > MAX_GRID:  # each trial is a row in the study and a run: the grid's bound holds here too
        raise spec_error(path, "sweep.n_trials", f"must be at most {MAX_GRID}, got {n}")
    return n


def check_points(spec: SweepSpec, path: str) -> None:
    """A grid's every combination a valid config (e.g. rank <= n_states), else one sample point (the first choice /
    lower bound of each parameter); a theory trial one setting; the objective a metric every trial logs."""
    if spec.sampler == "grid":
        cfgs = []
        for pt in spec.grid_points():
            try:
                cfgs.append(spec.trial_config(pt))
            except ConfigError as e:
                raise spec_error(path, "space", f"grid point {pt}: {e}") from None
            _check_theory_single(spec, cfgs[-1], path)
    else:
        pt = {p.key: p.grid[0] if p.grid is not None else p.low for p in spec.space}
        try:
            cfgs = [spec.trial_config({**pt, "seed": spec.seeds[0]})]
        except ConfigError as e:
            raise spec_error(path, "space", f"point {pt}: {e}") from None
        _check_theory_single(spec, cfgs[0], path)
    _check_objective(spec, cfgs, path)


def _check_objective(spec: SweepSpec, cfgs: list[Config], path: str) -> None:
    """The objective must be a metric every trial returns (else each trial would train fully, then fail)."""
    for cfg in cfgs:
        names, pats = objectives(spec.kind, spec.analyze, cfg)
        if spec.objective not in names and not any(p.fullmatch(spec.objective) for p in pats):
            hint = (f" ({spec.objective} was renamed {LEGACY_OBJECTIVES[spec.objective]}: Figure 1 is measured on seen "
                    "and unseen tasks apart, and logs the oracle's test segment once)"
                    if spec.objective in LEGACY_OBJECTIVES else "")
            raise spec_error(path, "sweep.objective", f"{spec.objective!r} is not a metric every {spec.kind} trial of "
                                                      f"this spec logs{hint} (e.g. {', '.join(sorted(names)[:4])}, ...)")


def _check_theory_single(spec: SweepSpec, cfg: Config, path: str) -> None:
    if spec.kind != "theory":
        return
    th = cfg.theory
    for k, v in (("theory.gammas", th.gammas), ("theory.ranks", th.ranks), ("theory.rhos", th.rhos),
                 ("theory.n_states", th.n_states)):
        if len(v) != 1:
            raise spec_error(path, k, "a theory trial runs one setting: give one value in [fixed] or sweep it in [space]")
