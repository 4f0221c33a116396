"""A spec against the one its study stored: what differs, key by key, and whether the change grows the sweep.

A study keeps its spec (study.py), and a spec run under an existing study's name must have its identity (the spec package's
hash). When it does not, the two specs are compared key by key on what the identity covers (`identity_items`: the
sweep table less its run-time keys, [fixed] and [set] as one table, [space], and the base config), and:

- more seeds (sweep.seeds a superset of the stored ones) and more levels on numeric grid axes (a [space] grid list
  that is a superset of the stored one, on the same keys, its study recording that axis as numbers) of a grid sweep
  grow it (`Change.grows`): its trials are kept, and only the new cells (grid point x seed) are enqueued (study.py).
  The grid's trial count follows;
- anything else is a different sweep (`Change.other`): refused in one line naming each key that differs, as
  `sweep.seeds: [0, 1] -> [3]` or `fixed.train.steps: 100 -> 7` (`refusal`).

Numeric levels. Optuna fixes a categorical parameter's choices for its whole study (every storage refuses a trial whose
CategoricalDistribution differs from the first recorded: "does not support dynamic value space"), while an int or float
parameter's range may change. So a grid sweep's trials record each axis by its kind (`grid_kind`: all ints -> an int
range over the levels, all floats -> a float range, anything else -> categorical), written with the study (study user
attr GRID_KINDS, `grid_kinds`; trial.py suggests by it), and only an axis recorded as a range grows, by levels of its
kind. A string or boolean axis (`model.pos_enc`), or one of a study created before GRID_KINDS (all categorical), does
not: a new level there needs a new sweep name, and the refusal says why.

Imports the spec package and the config only; never Optuna, MLflow or the other sweep modules.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import flatten
from .spec import RUNTIME_CONFIG, RUNTIME_SWEEP_KEYS, SweepSpec

GRID_KINDS = "grid_kinds"  # study user attr: each grid axis's kind as its trials record it (module docstring)
_SWEEP = ("kind", "objective", "direction", "sampler", "pruner", "n_trials", "seeds", "analyze", "experiment",
          "sampler_seed", "prune_startup")
_ABSENT = object()
SHOWN = 3  # differences named in a refusal; the rest counted


def grid_kind(values) -> str:
    """How a grid axis with these levels is recorded in Optuna: "int" (all ints), "float" (all floats), else
    "categorical" (strings, booleans, lists, a mix)."""
    vals = list(values)
    if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return "int"
    if vals and all(isinstance(v, float) for v in vals):
        return "float"
    return "categorical"


def grid_kinds(spec: SweepSpec) -> dict[str, str]:
    """The kind of each grid axis of a grid sweep (GRID_KINDS); {} for a tpe or random one (their params are
    sampled from the spec's distributions)."""
    return {p.key: grid_kind(p.grid) for p in spec.space if p.grid is not None} if spec.sampler == "grid" else {}


def identity_items(spec: SweepSpec) -> dict[str, Any]:
    """The spec's identity (spec.identity_hash's content) as dotted keys: sweep.<key>, fixed.<config key> ([fixed]
    and [set]), space.<config key>, base.<config key>; run-time keys left out."""
    out: dict[str, Any] = {f"sweep.{k}": getattr(spec, k) for k in _SWEEP if k not in RUNTIME_SWEEP_KEYS}
    out.update({f"fixed.{k}": v for k, v in spec.fixed.items() if k not in RUNTIME_CONFIG})
    for p in spec.space:
        d = dataclasses.asdict(p)
        d.pop("key")
        out[f"space.{p.key}"] = {k: v for k, v in d.items() if v is not None and v is not False}
    out.update({f"base.{k}": v for k, v in flatten(spec.base).items() if k not in RUNTIME_CONFIG})
    return out


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def shown(v: Any) -> str:
    """A value as a difference shows it: lists as [0, 1], a grid as its list, strings quoted, absent as (none)."""
    if v is _ABSENT:
        return "(none)"
    if isinstance(v, Mapping) and set(v) == {"grid"}:
        return shown(list(v["grid"]))
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k} = {shown(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(shown(x) for x in v) + "]"
    return json.dumps(v) if isinstance(v, (str, bool)) or v is None else str(v)


@dataclass(frozen=True)
class Change:
    """How `new` differs from the stored `old` (module docstring): `grows` and `other`, one line per key."""

    grows: tuple[str, ...] = ()
    other: tuple[str, ...] = ()

    @property
    def same(self) -> bool:
        return not self.grows and not self.other


def _superset(old: Any, new: Any) -> bool:
    """Does the list `new` hold every value of the list `old` (by their JSON text: 1 and 1.0 stay apart)?"""
    return {_canon(x) for x in old} <= {_canon(x) for x in new}


CATEGORICAL = ("a new level of a string, boolean or mixed axis, or of one its study records as categories (created "
               "before numeric levels were recorded as numbers), needs a new sweep: Optuna fixes a categorical "
               "parameter's levels for its study")


def compare(old: SweepSpec, new: SweepSpec, kinds: Mapping[str, str] | None = None) -> Change:
    """How `new` differs from `old` (module docstring); `kinds`: how the study records each grid axis (GRID_KINDS;
    {}: all categorical, a study from before it)."""
    kinds = kinds or {}
    a, b = identity_items(old), identity_items(new)
    grid = old.sampler == new.sampler == "grid"
    grows, other = [], []
    for key in [*a, *(k for k in b if k not in a)]:
        va, vb = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if va is not _ABSENT and vb is not _ABSENT and _canon(va) == _canon(vb):
            continue
        line = f"{key}: {shown(va)} -> {shown(vb)}"
        if key == "sweep.n_trials" and grid:
            continue  # a grid's size follows its seeds and levels
        if key == "sweep.seeds" and grid and _superset(va, vb):
            grows.append(line)
        elif (key.startswith("space.") and grid and isinstance(va, Mapping) and isinstance(vb, Mapping)
              and set(va) == set(vb) == {"grid"} and _superset(va["grid"], vb["grid"])):
            kind = kinds.get(key[len("space."):], "categorical")
            if kind != "categorical" and grid_kind(vb["grid"]) == kind:
                grows.append(line)
            elif kind != "categorical":
                other.append(f"{line} (its levels are {kind}s: it grows by {kind}s)")
            else:
                other.append(f"{line} ({CATEGORICAL})")
        else:
            other.append(line)
    if not grid and old.sampler == new.sampler and any(x.startswith("sweep.seeds: ") for x in other):
        other = [x + " (a grid sweep grows by seeds; a tpe or random one does not)" if x.startswith("sweep.seeds: ")
                 else x for x in other]
    return Change(tuple(grows), tuple(other))


def refusal(change: Change) -> str:
    """The differences that do not grow the sweep, for a one-line refusal: the first SHOWN, then how many more."""
    lines = list(change.other)
    more = len(lines) - SHOWN
    return "; ".join(lines[:SHOWN]) + (f"; and {more} more" if more > 0 else "")
