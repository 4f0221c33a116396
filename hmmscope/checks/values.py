"""Checks of the names and numbers a command is given: a sweep, study or run name (the safe-name rule), worker and
probe counts against the usable cores, seeds in numpy's range.
"""

from __future__ import annotations

import os

from ..config import SEED_MAX, ConfigError, check_name


def safe_name(value: str, what: str) -> str:
    """`value` if it is a safe name (config.check_name), else ConfigError."""
    return check_name(value, what)


WORKERS_PER_CORE = 4  # `sweep run --workers` beyond this many per usable core needs --force


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers(n: int, what: str = "--workers", *, force: bool = False) -> int:
    """Worker processes: at most WORKERS_PER_CORE x the usable cores unless `force` (each is a process with
    its own interpreter and torch; thousands exhaust the pid limit before any work)."""
    cap = WORKERS_PER_CORE * cores()
    if n > cap and not force:
        raise ConfigError(f"{what} {n}: this machine has {cores()} usable core(s), at most {cap} worker "
                          "processes make sense; pass --force to start more")
    return n


def probe_jobs(n: int, what: str = "--probe-jobs") -> int:
    """Probe fitting processes: at most the usable cores (more only time-slice the same cores)."""
    if n > cores():
        raise ConfigError(f"{what} {n}: at most the {cores()} usable core(s) of this machine")
    return n


def seed(value: int, what: str) -> int:
    if not 0 <= value <= SEED_MAX:
        raise ConfigError(f"{what} must be in [0, {SEED_MAX}] (numpy's seed range), got {value}")
    return value
