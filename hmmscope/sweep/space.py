"""Checks of a sweep spec's [space] beyond each value's own validity, called by the spec package
(`spec.checks`, `spec.parse`).

`sweep.spec` owns the format; `range_probe` gives the values of a range checked up front.

- A spec without [space] that makes one trial (one seed) is refused: it is what a spec cut off before its [space]
  looks like, and it would run as a one-point sweep. An empty [space] says it is meant (the fixed config, once per
  seed); so do several seeds (replicates of the fixed config, e.g. sweeps/inference-regime-cpu.toml).
- A range's step must divide high - low and leave more than one value: Optuna ends the range at the last step that
  fits (a step of 5.0 over 0.1..0.5 would give every trial 0.1).
- A grid or choices value for a number key must be a number: a string "0.9" would be converted silently.
- Each grid value names its own trial: trial names show numbers to 4 significant digits, so 0.5 and 0.50000001 would
  both make `g0.5-s0`.

Imports only `config` (ConfigError).
"""

from __future__ import annotations

import math
from typing import Any

from ..config import ConfigError

RANGE_PROBES = 33  # values of a random/TPE range checked up front (both ends and evenly spaced interior points)


def _err(path: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {msg}")


def check_space_given(path: str, given: bool, n_trials: int) -> None:
    """No [space] table and one trial: refused (module docstring)."""
    if not given and n_trials == 1:
        raise _err(path, "space", "missing, and the spec makes one trial (one seed): was the file cut off before its "
                                  "[space]? Give [space] (an empty [space] runs the fixed config once per seed), more "
                                  "sweep.seeds, or train it with `hmmscope train`")


def check_range(path: str, where: str, lo: float, hi: float, step: float | None) -> None:
    """A range's step leaves more than one value and divides high - low (module docstring)."""
    if step is None:
        return
    span = hi - lo
    if step > span:
        raise _err(path, f"{where}.step", f"step {step:g} is larger than high - low = {span:g}: every trial would get "
                                          f"low = {lo:g}; give a step of at most {span:g}")
    k = span / step
    if abs(k - round(k)) > 1e-9 * max(1.0, k):
        last = lo + math.floor(k + 1e-9) * step
        raise _err(path, f"{where}.step", f"step {step:g} does not divide high - low = {span:g}: the range would end at "
                                          f"{last:.6g}, not at high = {hi:g}; give a step that divides it, or move high")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_grid_values(path: str, where: str, key: str, vals: list, current: Any, table: str) -> None:
    """No string among the grid values of a number key (`current`: its value in the base and [fixed])."""
    numeric = _number(current) or (isinstance(current, (list, tuple)) and bool(current) and all(map(_number, current)))
    bad = next((v for v in vals if isinstance(v, str)), None) if numeric else None
    if bad is not None:
        raise _err(path, where, f"{table} value {bad!r} is a string, and {key} is a number: write it without quotes")


def distinct_labels(path: str, where: str, labelled: list[tuple[Any, str]]) -> None:
    """Each (value, its trial-name label) with a label of its own (module docstring)."""
    seen: dict[str, Any] = {}
    for v, label in labelled:
        if label in seen:
            raise _err(path, where, f"values {seen[label]!r} and {v!r} name the same trial ({label!r}: trial names show "
                                    "4 significant digits); give values that differ there")
        seen[label] = v


def range_probe(lo, hi, log: bool, step) -> list:
    """Values a range can suggest, to validate before any trial: every value of a small discrete range, else
    RANGE_PROBES evenly spaced (geometrically under log) from low to high, ints where both bounds are ints."""
    ints = isinstance(lo, int) and isinstance(hi, int) and (step is None or isinstance(step, int))
    if step is not None:
        n = int((hi - lo) // step) + 1
        idx = range(n) if n <= 4 * RANGE_PROBES else sorted({round(i * (n - 1) / (RANGE_PROBES - 1))
                                                            for i in range(RANGE_PROBES)})
        return [lo + i * step for i in idx]
    if log:
        vals = [lo * (hi / lo) ** (i / (RANGE_PROBES - 1)) for i in range(RANGE_PROBES)]
    else:
        vals = [lo + (hi - lo) * i / (RANGE_PROBES - 1) for i in range(RANGE_PROBES)]
    if ints:
        return sorted({lo, hi, *(min(hi, max(lo, round(v))) for v in vals)}) if hi - lo > 4 * RANGE_PROBES \
            else list(range(lo, hi + 1))
    return [lo, *vals[1:-1], hi]
