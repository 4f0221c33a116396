"""The environment variables hmmscope reads, parsed in one place, each against its stated range.

- HMMSCOPE_THREADS: torch's CPU threads, an integer in [1, MAX_THREADS] (a sweep's workers get 1), capped at the
  cores this process may run on (`usable_cores`: os.sched_getaffinity, which a container's or taskset's CPU set
  narrows): more threads than cores only contend (4096 on a 2-core machine started about 8,200 threads and a load
  of 1,900). A capped value is used, not refused (a script's setting keeps working on a smaller machine);
  `threads_note` says so in one line, which every entry point prints (`check`).
- Seconds (`Seconds`, read by `seconds`): HMMSCOPE_PROGRESS_S (training.progress), HMMSCOPE_RUN_HEARTBEAT_S
  (tracking.liveness), HMMSCOPE_STORE_OUTAGE_S (sweep.storage): their defaults and ranges are stated here
  (PROGRESS_S, RUN_HEARTBEAT_S, STORE_OUTAGE_S), so that `check` reads every one; each module's reader uses its own.

Numbers are ASCII only: an integer is ASCII digits (Python's int() would take `2_0` as 20 and Arabic-Indic digits),
seconds a plain decimal number (digits, one optional point, an optional exponent; no `_`, no `inf` or `nan`).
Surrounding spaces are ignored. A value outside its range (or not such a number) raises ValueError with one line:
the variable, its value (cut to 40 characters) and the range. Unset or empty means the default.

`check()` is what every entry point runs before any work (the CLI's root callback, `python -m hmmscope.sweep
worker`): every variable above, and no warnings filter that makes every library's warning an error. Standard
library only.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass

THREADS_ENV = "HMMSCOPE_THREADS"
MAX_THREADS = 4096

_INTEGER = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def _integer(raw: str) -> float:
    """ASCII digits as an int; ValueError for anything else (`2_0`, `٢`, `1.0`, `+1`)."""
    if not _INTEGER.fullmatch(raw.strip()):
        raise ValueError(raw)
    return int(raw.strip())


def _decimal(raw: str) -> float:
    """A plain ASCII decimal number as a float; ValueError for anything else (`1_0`, `inf`, `nan`, `0x10`)."""
    if not _DECIMAL.fullmatch(raw.strip()):
        raise ValueError(raw)
    return float(raw.strip())


def _number(name: str, cast, lo: float, hi: float, default, give: str, what: str):
    """`cast` of the variable `name` in [lo, hi]; `default` when unset or empty; else ValueError (one line)."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        v = cast(raw)
    except (ValueError, OverflowError):
        v = math.nan
    if not lo <= v <= hi:  # nan too
        dflt = "" if default is None else f" (default {default:g})"
        raise ValueError(f"{name}={raw[:40]!r}: give {give} in [{lo:g}, {hi:g}] ({what}), or unset it{dflt}")
    return v


def seconds(name: str, default: float, lo: float, hi: float, what: str) -> float:
    """A number of seconds from the environment variable `name` (unset or empty: `default`); ValueError (one line:
    the variable, its value, its range and `what` it sets) for anything but a plain decimal number in [lo, hi]."""
    return _number(name, _decimal, lo, hi, default, "seconds", what)


@dataclass(frozen=True)
class Seconds:
    """A seconds setting: its variable, default, range and what it sets (for the error line)."""

    name: str
    default: float
    lo: float
    hi: float
    what: str

    def read(self) -> float:
        return seconds(self.name, self.default, self.lo, self.hi, self.what)


HEARTBEAT_GRACE = 5  # heartbeat intervals without a beat before a run's lease expires (tracking.liveness)
PROGRESS_S = Seconds("HMMSCOPE_PROGRESS_S", 30.0, 0.1, 86400.0, "between train's progress lines off a terminal")
# faster is a store write storm per run, slower a lease that never expires
RUN_HEARTBEAT_S = Seconds("HMMSCOPE_RUN_HEARTBEAT_S", 30.0, 0.1, 3600.0,
                          f"the heartbeat of an open run; a lease expires after {HEARTBEAT_GRACE} of them")
# 0: give up at the first transient error; a day at most
STORE_OUTAGE_S = Seconds("HMMSCOPE_STORE_OUTAGE_S", 900.0, 0.0, 86400.0,
                         "how long a sweep worker waits for a storage that does not answer")
SECONDS = (RUN_HEARTBEAT_S, STORE_OUTAGE_S, PROGRESS_S)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity set; os.cpu_count() where the OS has none)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _threads_asked() -> int | None:
    return _number(THREADS_ENV, _integer, 1, MAX_THREADS, None, "an integer", "torch's CPU threads")


def threads() -> int | None:
    """torch's CPU threads from HMMSCOPE_THREADS (None: unset or empty, torch's own default), at most the usable
    cores; ValueError (one line) for anything but ASCII digits giving an integer in [1, MAX_THREADS]."""
    n = _threads_asked()
    return None if n is None else min(int(n), usable_cores())


def threads_note() -> str | None:
    """One line when HMMSCOPE_THREADS asks for more threads than there are usable cores (it is capped), else None."""
    n, cores = _threads_asked(), usable_cores()
    if n is None or n <= cores:
        return None
    return f"note: {THREADS_ENV}={int(n)} is more than the {cores} usable core(s); torch uses {cores} thread(s)"


def check() -> list[str]:
    """Every variable hmmscope reads, in its range (ValueError, one line, at the first that is not), and no warnings
    filter that turns every library's warning into an error (PYTHONWARNINGS=error, -W error: MLflow and SQLAlchemy
    emit deprecation warnings, which would stop a command half-way with a traceback). Returns the notes to print
    (a capped HMMSCOPE_THREADS)."""
    threads()
    for s in SECONDS:
        s.read()
    for action, _msg, category, module, _line in warnings.filters:
        if action == "error" and module is None and issubclass(DeprecationWarning, category):
            raise ValueError("PYTHONWARNINGS=error (or -W error) makes every library's warnings fatal; MLflow and "
                             "SQLAlchemy emit deprecation warnings, so commands would stop half-way: unset it, or "
                             "limit it to a category or module")
    return [n for n in (threads_note(),) if n]
