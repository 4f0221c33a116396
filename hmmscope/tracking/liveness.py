"""Liveness of runs: a run's owner (a lease), and finding (and ending) orphan runs.

The lease. Every open run has one owner, recorded in ONE tag, `hmmscope.lease` (LEASE_TAG): JSON with
the owner's host, pid, process start time (`pid_start`, to tell a reused pid), the kernel's boot id and the
owner's PID namespace (`/proc/self/ns/pid`), and the lease itself: `beat` (unix seconds, renewed by a thread
every `interval` seconds, env HMMSCOPE_RUN_HEARTBEAT_S, default 30); one tag, not five. (Runs recorded before
kept it as `mlflow.hmmscope.lease`, LEGACY_LEASE_TAG, read the same way: MLflow reserves the `mlflow.` prefix
for its own tags.) A resumed run (`touch`) also moves its end time to each beat while it runs, so the UI's
duration of a reopened run (a sweep's parent, a `--resume`) is its age, not its first session's length.

Orphans. A RUNNING run is stale (`stale_reason`) only when its owner is provably gone:
- this host, this boot and this PID namespace (so its pid means the same process here): the process is gone,
  or the pid now belongs to another process;
- anywhere else (another host, a container's PID namespace on this host, a reboot): its lease expired, i.e.
  no beat for HEARTBEAT_GRACE intervals. A pid missing from this namespace proves nothing.
`gc_runs` marks stale runs KILLED with the tag `hmmscope.failure_reason = "orphaned: <why>"` and the last beat
as end time; a run that finishes afterwards clears that reason, as any failure reason of an earlier session, and its
lease (`clear_finished`: nobody holds a finished run, and the UI would show the tag). `live_owner` says who
holds a run that is not stale (a `--resume` of such a run is refused: one writer per run). Runs with the older
per-field tags (`hmmscope.host`, `hmmscope.pid`, ...) are read the same way; runs with neither are never judged.

One writer per run (`hold`, the heartbeat `beating`, `settle`): tracking.hold.

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store and search modules, and must not import hold or runs (which import this) or anything of hmmscope outside
tracking but `env` (below every unit).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .. import env
from .search import search_runs
from .store import client, sqlite_path

HEARTBEAT_ENV = env.RUN_HEARTBEAT_S.name
HEARTBEAT_GRACE = env.HEARTBEAT_GRACE  # heartbeat intervals without a beat before a lease expires
LEASE_TAG = "hmmscope.lease"
LEGACY_LEASE_TAG = "mlflow.hmmscope.lease"  # runs recorded before the rename: read, never written


HEARTBEAT_RANGE = (env.RUN_HEARTBEAT_S.lo, env.RUN_HEARTBEAT_S.hi)  # seconds (env.RUN_HEARTBEAT_S says why)


def heartbeat_interval() -> float:
    """Seconds between a run's heartbeats (env HMMSCOPE_RUN_HEARTBEAT_S, default 30, in HEARTBEAT_RANGE; ValueError
    outside it)."""
    return env.RUN_HEARTBEAT_S.read()


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


def _read(path: str) -> str:
    try:
        return (os.readlink(path) if path.startswith("/proc/self/ns") else Path(path).read_text()).strip()
    except OSError:
        return ""


def identity() -> dict[str, str]:
    """This process as a lease names it: host, pid, start time, boot id, PID namespace."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": str(pid), "pid_start": _proc_start(pid) or "",
            "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": _read("/proc/self/ns/pid")}


def lease_value(interval: float, who: dict[str, str] | None = None, nonce: str | None = None) -> str:
    """The lease tag's value: this process (or `who`), the beat now, the interval and the holder's nonce."""
    return json.dumps({**(who or identity()), "beat": round(time.time()), "interval": interval,
                       **({"nonce": nonce} if nonce else {})})


def liveness_tags(interval: float, nonce: str | None = None) -> dict[str, str]:
    return {LEASE_TAG: lease_value(interval, nonce=nonce)}


def lease_of(run) -> dict[str, Any] | None:
    """The run's lease (as MLflow returns the run): the lease tag, else the older per-field tags; None if neither."""
    t = run.data.tags
    for tag in (LEASE_TAG, LEGACY_LEASE_TAG):
        with contextlib.suppress(KeyError, ValueError, TypeError):
            d = json.loads(t[tag])
            return {**d, "beat": float(d["beat"]), "interval": float(d["interval"])}
    if "hmmscope.pid" not in t and "hmmscope.heartbeat" not in t:
        return None
    d: dict[str, Any] = {"host": t.get("hmmscope.host", ""), "pid": t.get("hmmscope.pid", ""),
                         "pid_start": t.get("hmmscope.pid_start", ""), "boot": None, "pidns": None}
    with contextlib.suppress(KeyError, ValueError):
        d["beat"], d["interval"] = float(t["hmmscope.heartbeat"]), float(t["hmmscope.heartbeat_interval"])
    return d


def _same_namespace(lease: dict[str, Any], host: str | None) -> bool:
    """Does the lease's pid name a process of this host, boot and PID namespace (so `_alive` can judge it)?"""
    me = identity()
    if lease.get("host") != (host or me["host"]):
        return False
    if lease.get("boot") is None and lease.get("pidns") is None:  # older tags: host only, as before
        return True
    return bool(me["boot"]) and lease.get("boot") == me["boot"] and bool(me["pidns"]) and lease.get("pidns") == me["pidns"]


def stale_reason(run, *, now: float | None = None, host: str | None = None) -> str | None:
    """Why the RUNNING run `run` (as MLflow returns it) is an orphan, or None if it is not (or cannot be told)."""
    if run.info.status != "RUNNING":
        return None
    lease = lease_of(run)
    if lease is None:
        return None
    pid, where = str(lease.get("pid", "")), lease.get("host") or "?"
    if pid.isdigit() and _same_namespace(lease, host):
        if not _alive(int(pid), lease.get("pid_start") or None):
            return f"its process {pid} on {where} is gone"
        return None
    if "beat" not in lease:
        return None
    age = (time.time() if now is None else now) - lease["beat"]
    if age > HEARTBEAT_GRACE * lease["interval"]:
        return (f"no heartbeat for {age:.0f} s, its lease expired (one every {lease['interval']:g} s expected; "
                f"process {pid or '?'} on {where})")
    return None


def live_owner(run, *, now: float | None = None) -> str | None:
    """Who holds the RUNNING run `run`, if its owner is not provably gone: 'process P on H (...)'; else None."""
    if run.info.status != "RUNNING" or lease_of(run) is None or stale_reason(run, now=now) is not None:
        return None
    lease = lease_of(run)
    age = (time.time() if now is None else now) - lease.get("beat", time.time())
    return f"process {lease.get('pid') or '?'} on {lease.get('host') or '?'} (last heartbeat {max(0, age):.0f} s ago)"


def clear_finished(c, run_id: str) -> None:
    """A run that finished (its end written) keeps no failure reason and no lease: the reason said why an earlier
    session of it ended (a Ctrl-C, a crash before a resume) or that `gc_runs` took it for an orphan (a lapsed lease),
    none of which holds for a run that finished; and no process holds a finished run (the UI shows every tag outside
    MLflow's `mlflow.` prefix, so a lease left there is bookkeeping on every finished run's page). `settle` reads a
    finished run without a lease as its last writer's."""
    with contextlib.suppress(Exception):
        tags = c.get_run(run_id).data.tags
        for key in ("hmmscope.failure_reason", LEASE_TAG, LEGACY_LEASE_TAG):
            if key in tags:
                c.delete_tag(run_id, key)


def end_run(c, run_id: str, status: str, reason: str | None = None, end_time: int | None = None) -> None:
    """End the run `run_id` with `status` (and the tag hmmscope.failure_reason = `reason`, written first), in the trash
    too: MLflow writes only to active runs, so a deleted one (its sweep deleted under its writer) is restored, ended
    and deleted again, and never stays RUNNING where nothing looks."""
    deleted = c.get_run(run_id).info.lifecycle_stage == "deleted"
    if deleted:
        c.restore_run(run_id)
    try:
        if reason is not None:
            c.set_tag(run_id, "hmmscope.failure_reason", reason[:5000])
        c.set_terminated(run_id, status, end_time=end_time)
    finally:
        if deleted:
            c.delete_run(run_id)


def gc_runs(uri: str, *, experiments: list[str] | None = None, dry_run: bool = False,
            now: float | None = None) -> list[tuple[Any, str]]:
    """Find orphan RUNNING runs (`stale_reason`), in the trash too, and, unless `dry_run`, mark them KILLED with the
    reason.

    `experiments`: names to search (default: every experiment). Returns (run, reason) per orphan.
    """
    from mlflow.entities import ViewType  # lazy: mlflow off the CLI's start-up

    db = sqlite_path(uri)
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
    for r in search_runs(uri, experiment_ids=ids, filter_string="attributes.status = 'RUNNING'", deleted=True):
        why = stale_reason(r, now=now)
        if why is not None:
            found.append((r, why))
    if not dry_run:
        for r, why in found:
            if c.get_run(r.info.run_id).info.status != "RUNNING":  # ended meanwhile
                continue
            end = None
            with contextlib.suppress(KeyError, ValueError, TypeError):
                end = int(float(lease_of(r)["beat"]) * 1000)
            end_run(c, r.info.run_id, "KILLED", f"orphaned: {why}", end_time=end)
    return found
