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


def seconds(name: str, default: float, lo: float, hi: float, what: str) -> float:
    """A number of seconds from the environment variable `name` (unset or empty: `default`); ValueError (one line:
    the variable, its value, its range and `what` it sets) for anything but a number in [lo, hi]."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not lo <= v <= hi:  # nan too
        raise ValueError(f"{name}={raw[:40]!r}: give seconds in [{lo:g}, {hi:g}] ({what}), or unset it "
                         f"(default {default:g})")
    return v


def threads() -> int | None:
    """torch's CPU threads from HMMSCOPE_THREADS (None: unset or empty, torch's own default); ValueError (one line)
    for anything but an integer in [1, MAX_THREADS]."""
    raw = os.environ.get(THREADS_ENV, "")
    if raw.strip() == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{THREADS_ENV}={raw[:40]!r}: give an integer in [1, {MAX_THREADS}] (torch's CPU threads), "
                         "or unset it")
    return n
