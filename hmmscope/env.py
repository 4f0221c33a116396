"""The environment variables hmmscope reads, parsed in one place, each against its stated range.

- HMMSCOPE_THREADS: torch's CPU threads, an integer in [1, MAX_THREADS] (a sweep's workers get 1).
- Seconds (`seconds`): HMMSCOPE_PROGRESS_S (training.progress), HMMSCOPE_RUN_HEARTBEAT_S (tracking.liveness),
  HMMSCOPE_STORE_OUTAGE_S (sweep.storage); each module states its default and range beside its reader.

A value outside its range (nan and inf included) raises ValueError with one line: the variable, its value (cut to 40
characters) and the range. Unset or empty means the default. The CLI checks every one before any command runs.
Standard library only.
"""

from __future__ import annotations

import math
import os

THREADS_ENV = "HMMSCOPE_THREADS"
MAX_THREADS = 4096


def _number(name: str, cast, lo: float, hi: float, default, give: str, what: str):
    """`cast` of the variable `name` in [lo, hi]; `default` when unset or empty; else ValueError (one line)."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        v = cast(raw)
    except ValueError:
        v = math.nan
    if not lo <= v <= hi:  # nan too
        dflt = "" if default is None else f" (default {default:g})"
        raise ValueError(f"{name}={raw[:40]!r}: give {give} in [{lo:g}, {hi:g}] ({what}), or unset it{dflt}")
    return v


def seconds(name: str, default: float, lo: float, hi: float, what: str) -> float:
    """A number of seconds from the environment variable `name` (unset or empty: `default`); ValueError (one line:
    the variable, its value, its range and `what` it sets) for anything but a number in [lo, hi]."""
    return _number(name, float, lo, hi, default, "seconds", what)


def threads() -> int | None:
    """torch's CPU threads from HMMSCOPE_THREADS (None: unset or empty, torch's own default); ValueError (one line)
    for anything but an integer in [1, MAX_THREADS]."""
    return _number(THREADS_ENV, int, 1, MAX_THREADS, None, "an integer", "torch's CPU threads")
