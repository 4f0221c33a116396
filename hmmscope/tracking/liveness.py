"""Liveness of runs: where a run runs, its heartbeat, and finding (and ending) orphan runs.

Orphan runs. Every run records where it runs (tags `hmmscope.host`, `hmmscope.pid`,
`hmmscope.pid_start`, the process start time where the OS tells it) and beats: a thread
updates the tag `hmmscope.heartbeat` (unix seconds) every `hmmscope.heartbeat_interval`
seconds (env HMMSCOPE_RUN_HEARTBEAT_S, default 30) while the run is open. A RUNNING run
is stale (`stale_reason`) when its host is this host and its process is gone (or the pid
now belongs to another process), or, on another host, when its last heartbeat is older
than HEARTBEAT_GRACE heartbeat intervals. `gc_runs` marks stale runs KILLED with the tag
`hmmscope.failure_reason = "orphaned: <why>"` and the last heartbeat as end time; runs
without these tags (older stores) are never judged.

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store and search modules, and must not import runs (which imports this) or anything of hmmscope outside
tracking.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .search import search_runs
from .store import _sqlite_path, client

if TYPE_CHECKING:
    from .runs import Run

HEARTBEAT_ENV = "HMMSCOPE_RUN_HEARTBEAT_S"
HEARTBEAT_GRACE = 5  # heartbeat intervals without a beat before a run on another host counts as stale


def heartbeat_interval() -> float:
    """Seconds between a run's heartbeats (env HMMSCOPE_RUN_HEARTBEAT_S, default 30)."""
    try:
        v = float(os.environ.get(HEARTBEAT_ENV, "30"))
    except ValueError:
        v = 30.0
    return v if math.isfinite(v) and v > 0 else 30.0


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), to tell a reused pid; else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22 (starttime), counted after "(comm) "


def _alive(pid: int, start: str | None) -> bool:
    """Is the process `pid` (started at `start`, if known) still running on this host?"""
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there: leave it to the heartbeat
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # exists, owned by someone else
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] in ("Z", "X"):  # a zombie: dead, not yet reaped
            return False
        if start and rest[19] != start:  # the pid now belongs to another process
            return False
    return True


def _liveness_tags(interval: float) -> dict[str, str]:
    pid = os.getpid()
    return {"hmmscope.host": socket.gethostname(), "hmmscope.pid": str(pid), "hmmscope.pid_start": _proc_start(pid) or "",
            "hmmscope.heartbeat": f"{time.time():.0f}", "hmmscope.heartbeat_interval": f"{interval:g}"}


@contextlib.contextmanager
def _beating(run: Run, interval: float) -> Iterator[None]:
    """Update the run's heartbeat tag every `interval` seconds until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        c = client(run.uri)
        while not stop.wait(interval):
            with contextlib.suppress(Exception):
                c.set_tag(run.run_id, "hmmscope.heartbeat", f"{time.time():.0f}")

    th = threading.Thread(target=beat, daemon=True, name=f"mlflow-heartbeat-{run.run_id[:8]}")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def stale_reason(run, *, now: float | None = None, host: str | None = None) -> str | None:
    """Why the RUNNING run `run` (as MLflow returns it) is an orphan, or None if it is not (or cannot be told)."""
    if run.info.status != "RUNNING":
        return None
    t = run.data.tags
    pid, where = t.get("hmmscope.pid", ""), t.get("hmmscope.host", "")
    if pid.isdigit() and where == (host or socket.gethostname()):
        if not _alive(int(pid), t.get("hmmscope.pid_start") or None):
            return f"its process {pid} on {where} is gone"
        return None
    try:
        last, every = float(t["hmmscope.heartbeat"]), float(t["hmmscope.heartbeat_interval"])
    except (KeyError, ValueError):
        return None
    age = (time.time() if now is None else now) - last
    if age > HEARTBEAT_GRACE * every:
        return f"no heartbeat for {age:.0f} s (one every {every:g} s expected; process {pid or '?'} on {where or '?'})"
    return None


def gc_runs(uri: str, *, experiments: list[str] | None = None, dry_run: bool = False,
            now: float | None = None) -> list[tuple[Any, str]]:
    """Find orphan RUNNING runs (`stale_reason`) and, unless `dry_run`, mark them KILLED with the reason.

    `experiments`: names to search (default: every experiment). Returns (run, reason) per orphan.
    """
    from mlflow.entities import ViewType

    db = _sqlite_path(uri)
    if db is not None and not db.is_file():  # no store, no runs (and do not create one)
        return []
    c = client(uri)
    if experiments is None:
        ids = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    else:
        ids = [e.experiment_id for e in (c.get_experiment_by_name(n) for n in experiments) if e is not None]
    if not ids:
        return []
    found = []
    for r in search_runs(uri, experiment_ids=ids, filter_string="attributes.status = 'RUNNING'"):
        why = stale_reason(r, now=now)
        if why is not None:
            found.append((r, why))
    if not dry_run:
        for r, why in found:
            if c.get_run(r.info.run_id).info.status != "RUNNING":  # ended meanwhile
                continue
            end = None
            with contextlib.suppress(KeyError, ValueError):
                end = int(float(r.data.tags["hmmscope.heartbeat"]) * 1000)
            c.set_tag(r.info.run_id, "hmmscope.failure_reason", f"orphaned: {why}")
            c.set_terminated(r.info.run_id, "KILLED", end_time=end)
    return found
