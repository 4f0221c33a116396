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

One writer per run: `hold` takes a run's lease atomically (an OS lock beside a sqlite store; a claim by the tag,
read back after SETTLE_S, on a server), checks it while the run is open, and removes the run's stale temp files
(`leftovers`) when it takes it.

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store, leftovers and search modules, and must not import runs (which imports this) or anything of hmmscope outside
tracking but `env` and `interrupts` (below every unit).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import env
from ..interrupts import every
from . import leftovers
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


def _lease(interval: float, who: dict[str, str] | None = None, nonce: str | None = None) -> str:
    import json

    return json.dumps({**(who or identity()), "beat": round(time.time()), "interval": interval,
                       **({"nonce": nonce} if nonce else {})})


def liveness_tags(interval: float, nonce: str | None = None) -> dict[str, str]:
    return {LEASE_TAG: _lease(interval, nonce=nonce)}


def lease_of(run) -> dict[str, Any] | None:
    """The run's lease (as MLflow returns the run): the lease tag, else the older per-field tags; None if neither."""
    import json

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


@contextlib.contextmanager
def beating(uri: str, run_id: str, interval: float, touch: bool = False) -> Iterator[None]:
    """Update the run's heartbeat tag every `interval` seconds until the block ends (`touch`: its end time too,
    status RUNNING kept: a resumed run's duration while it runs). Before each beat the lease is read back: one
    that names another writer (this process's lease expired and another took the run over) marks the lease lost
    (`lost`): this process stops beating, and its writes through `Run` raise LeaseLost."""
    who = identity()
    nonce = nonce_of(uri, run_id)
    store = functools.cache(lambda: client(uri))  # made in the thread, at its first beat

    def beat() -> bool:
        c = store()
        now = lease_of(c.get_run(run_id))
        if now is not None and not _is_me(now, nonce):
            _mark_lost(uri, run_id, now)
            return False
        c.set_tag(run_id, LEASE_TAG, _lease(interval, who, nonce))
        if touch:
            c.set_terminated(run_id, "RUNNING", end_time=int(time.time() * 1000))
        return True

    with every(interval, beat, f"mlflow-heartbeat-{run_id[:8]}"):
        yield


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
    from mlflow.entities import ViewType

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


# ---------------------------------------------------------------- one writer per run: the lease, taken atomically

LEASE_DIR = ".leases"  # beside a sqlite store: one lock file per held run, `<run id>.lock`
SETTLE_S = 2.0  # a store without a lock of ours (a server): how long a claim waits before it reads its lease back


class RunHeld(ValueError):
    """Another process holds the run (one writer per run); the message names it. A ValueError: the CLI prints
    it as one line and exits 2."""


class LeaseLost(RuntimeError):
    """This process's lease of a run was taken over by another process (it had expired): its writes stop here."""


_HELD: dict[tuple[str, str], dict[str, Any]] = {}  # (store, run id) -> this process's hold (count, lock fd, nonce)
_HELD_LOCK = threading.Lock()


def _key(uri: str, run_id: str) -> tuple[str, str]:
    db = sqlite_path(uri)
    return (str(db.resolve()) if db is not None else uri, run_id)


def _is_me(lease: dict[str, Any] | None, nonce: str | None = None) -> bool:
    """Does `lease` name this process (and, when this process claimed it with a nonce, carry that nonce)?"""
    if lease is None:
        return False
    me = identity()
    if any(str(lease.get(k) or "") != me[k] for k in ("host", "pid", "pid_start", "boot", "pidns")):
        return False
    return nonce is None or lease.get("nonce") in (None, nonce)


def _describe(lease: dict[str, Any] | None) -> str:
    if not lease:
        return "another process"
    return f"process {lease.get('pid') or '?'} on {lease.get('host') or '?'}"


def _held_msg(run_id: str, who: str) -> str:
    return (f"MLflow run {run_id} is still running in {who}: one writer per run; wait for it, stop it, or run "
            "`hmmscope runs gc` once it is gone")


def _lock_owner(path: Path) -> str:
    """Who holds the lock file `path`: the identity its holder wrote into it (read for up to 1 s: the holder writes
    it just after it locks), else 'another process'."""
    import json

    for _ in range(20):
        with contextlib.suppress(OSError, ValueError):
            d = json.loads(path.read_text() or "null")
            if isinstance(d, dict):
                return f"{_describe(d)} (it holds {path})"
        time.sleep(0.05)
    return f"another process (it holds {path})"


class LeaseUnavailable(ValueError):
    """No OS lock can be had for a run's lease in a store that takes them (its lease folder is a file, a link, someone
    else's private folder, or on a filesystem without locks): no writer runs without it. The message names the folder
    and why, in one line; a ValueError, so the CLI prints it and exits 2."""


def _unavailable(run_id: str, why: str) -> LeaseUnavailable:
    return LeaseUnavailable(f"cannot take the lease of MLflow run {run_id} (one writer per run needs its lock): {why}")


def _lease_folder(folder: Path, run_id: str) -> int:
    """A descriptor of the lease folder `<store folder>/.leases`, opened as a real folder (never through a link);
    created when missing with the store folder's access: private (0700) for a private store, and for a store others
    may write (its folder group- or world-writable) their read and write bits plus the sticky bit (each may add lock
    files; none may remove another's). LeaseUnavailable when it cannot be had."""
    import stat

    try:
        store_mode = os.stat(folder.parent).st_mode
    except OSError as e:
        raise _unavailable(run_id, f"cannot read the store folder {folder.parent} ({e.strerror or e})") from None
    shared = store_mode & 0o022
    mode = 0o700 | (store_mode & 0o077) | (stat.S_ISVTX if shared else 0)
    created = False
    try:
        os.mkdir(folder, 0o700)
        created = True
    except FileExistsError:
        pass
    except OSError as e:
        raise _unavailable(run_id, f"cannot create {folder} ({e.strerror or e})") from None
    try:
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                      | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if os.path.islink(folder):
            why = (f"{folder} is a symlink (to {os.path.realpath(folder)}); lock files are written only inside the "
                   "store: remove the link")
        elif os.path.lexists(folder) and not os.path.isdir(folder):
            why = f"{folder} is not a folder (a file is in its place): remove it"
        else:
            why = f"cannot open {folder} ({e.strerror or e})"
        raise _unavailable(run_id, why) from None
    if created:
        try:
            os.fchmod(dfd, mode)
        except OSError:
            pass
    return dfd


def _lock_file(path: Path, run_id: str) -> tuple[int, int] | None:
    """An exclusive, non-blocking OS lock (flock) on the lock file `path` (in the lease folder, `_lease_folder`),
    held through the returned descriptor until it is closed (so a killed holder releases it): (lock fd, folder fd).
    RunHeld naming the holder if another process has it; LeaseUnavailable (naming the folder) when no lock can be had
    (a file or a link in the folder's place, a folder this user may not write, a filesystem without locks): a writer
    never runs on the lease tag alone where the store takes locks. None only where the OS has no flock (Windows)."""
    import json
    import stat

    try:
        import fcntl
    except ImportError:
        return None
    dfd = _lease_folder(path.parent, run_id)
    try:
        mode = 0o600 | (stat.S_IMODE(os.fstat(dfd).st_mode) & 0o066)  # a shared store's users open each other's
        name = path.name
        base = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        for _ in range(20):
            try:
                fd = os.open(name, base | os.O_CREAT | os.O_EXCL, mode, dir_fd=dfd)
                with contextlib.suppress(OSError):
                    os.fchmod(fd, mode)  # past the umask
            except FileExistsError:
                try:
                    fd = os.open(name, base, dir_fd=dfd)
                except FileNotFoundError:
                    continue  # its holder removed it meanwhile
                except OSError as e:
                    raise _unavailable(run_id, f"cannot open {path} ({e.strerror or e})") from None
            except OSError as e:
                raise _unavailable(run_id, f"cannot create a lock file in {path.parent} ({e.strerror or e})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunHeld(_held_msg(run_id, _lock_owner(path))) from None
            except OSError as e:
                os.close(fd)
                raise _unavailable(run_id, f"the filesystem of {path.parent} takes no locks ({e.strerror or e})") \
                    from None
            try:
                same = os.fstat(fd).st_ino == os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps(identity()).encode())
                return fd, dfd
            os.close(fd)  # its last holder removed it meanwhile: lock the new file
        raise RunHeld(_held_msg(run_id, _lock_owner(path)))
    except BaseException:
        os.close(dfd)
        raise


def _claim_by_tag(uri: str, run_id: str) -> str:
    """A store with no lock of ours (a server): read the lease; refuse a live one; write ours with a random nonce;
    wait SETTLE_S; read it back: ours wins, anything else names the winner. Of two claims whose read and write are
    each less than SETTLE_S apart, exactly one wins (the later write is the one both read back). Returns the nonce."""
    import secrets

    c = client(uri)
    run = c.get_run(run_id)
    who = live_owner(run)
    if who is not None and not _is_me(lease_of(run)):
        raise RunHeld(_held_msg(run_id, who))
    nonce = secrets.token_hex(8)
    c.set_tag(run_id, LEASE_TAG, _lease(heartbeat_interval(), nonce=nonce))
    time.sleep(SETTLE_S)
    now = lease_of(c.get_run(run_id))
    if now is None or now.get("nonce") != nonce:
        raise RunHeld(_held_msg(run_id, _describe(now)))
    return nonce


def _acquire(uri: str, run_id: str, fresh: bool) -> dict[str, Any]:
    st: dict[str, Any] = {"count": 1, "fd": None, "dfd": None, "path": None, "nonce": None, "lost": None,
                          "cleaned": (0, 0)}
    db = sqlite_path(uri)
    if db is None:
        if not fresh:
            st["nonce"] = _claim_by_tag(uri, run_id)
            st["cleaned"] = leftovers.remove(leftovers.find(uri, [run_id]).get(run_id, []))
        return st
    st["path"] = db.parent / LEASE_DIR / f"{run_id}.lock"
    st["fd"], st["dfd"] = _lock_file(st["path"], run_id) or (None, None)
    if fresh:
        return st
    try:  # under the lock: no other process of this version checks or sets the lease meanwhile
        c = client(uri)
        run = c.get_run(run_id)
        who = live_owner(run)  # a writer that holds no lock of ours: an older version, another host's process
        if who is not None and not _is_me(lease_of(run)):
            raise RunHeld(_held_msg(run_id, who))
        # the lease tag is set when the run is reopened (start_run): a resume refused later (bad input) writes none;
        # the run is ours now: what its killed writers left half-written goes (leftovers), said by the caller
        st["cleaned"] = leftovers.remove(leftovers.find(uri, [run_id]).get(run_id, []))
    except BaseException:
        _release(st)
        raise
    return st


def _release(st: dict[str, Any]) -> None:
    fd, dfd, path = st.get("fd"), st.get("dfd"), st.get("path")
    if fd is None:
        return
    with contextlib.suppress(OSError):  # removed while still locked: a later locker checks it locked the file in place
        if os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            os.unlink(path.name, dir_fd=dfd)  # in the folder it was locked in, never through a link
    os.close(fd)
    if dfd is not None:
        os.close(dfd)
    st["fd"] = st["dfd"] = None


@contextlib.contextmanager
def hold(uri: str, run_id: str, *, fresh: bool = False) -> Iterator[dict[str, Any]]:
    """Hold the run's lease for the block: one writer per run, taken atomically. Re-entrant within a process.

    - A sqlite store: an exclusive OS lock (flock) on `<store folder>/.leases/<run id>.lock`, then, under it, the
      lease tag checked (a live writer that holds no lock of ours, e.g. an older version, is refused; start_run sets
      it when it reopens the run). Of
      two processes started together exactly one gets the lock; the other gets RunHeld naming the holder. The OS
      drops the lock when its holder dies, even by SIGKILL.
    - Any other store (an MLflow server): `_claim_by_tag` (check, write with a nonce, wait SETTLE_S, read back):
      one winner whenever each claimant's read and write are less than SETTLE_S apart; MLflow's REST API offers no
      conditional write, so this is the guarantee there.
    While a run is open its heartbeat reads the lease back (`beating`): a lease taken over marks it lost, and
    `Run`'s writes raise LeaseLost. `fresh`: a run this process just created (its lease tag already set): the
    lock only. Yields the hold: its "lost" entry says why the lease was lost, if it was; "cleaned" (count, bytes)
    the run's stale temp files it removed when it took the lease (`leftovers`: the run is ours, so no live process
    writes them)."""
    key = _key(uri, run_id)
    with _HELD_LOCK:
        st = _HELD.get(key)
        if st is not None:
            st["count"] += 1
    if st is None:
        st = _acquire(uri, run_id, fresh)
        with _HELD_LOCK:
            _HELD[key] = st
    try:
        yield st
    finally:
        with _HELD_LOCK:
            st["count"] -= 1
            done = st["count"] <= 0
            if done:
                _HELD.pop(key, None)
        if done:
            _release(st)


def nonce_of(uri: str, run_id: str) -> str | None:
    st = _HELD.get(_key(uri, run_id))
    return None if st is None else st.get("nonce")


def _mark_lost(uri: str, run_id: str, now: dict[str, Any]) -> None:
    st = _HELD.get(_key(uri, run_id))
    if st is not None:
        st["lost"] = f"its lease was taken over by {_describe(now)}"


def lost(uri: str, run_id: str) -> str | None:
    """Why this process no longer holds the run (its lease was taken over), or None."""
    st = _HELD.get(_key(uri, run_id))
    return None if st is None else st.get("lost")


def own_runs(uri: str, experiment: str, tags: dict[str, Any]) -> list[str]:
    """Ids of the runs in `experiment` carrying all of `tags` whose lease names this process, whatever their status.

    Finds a run this process opened even where it never learned the run's id, or lost it before noting it (a
    store cut off while the run was being created or its first writes made): `settle` then ends those still open."""
    where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    return [r.info.run_id for r in search_runs(uri, experiment, filter_string=where, deleted=True)
            if _is_me(lease_of(r))]


def settle(uri: str, run_id: str, reason: str, status: str = "FAILED", *, finished_too: bool = False) -> bool:
    """End a run this process opened that is still RUNNING under this process's lease (its own end could not be
    written: the store was out of reach when it failed), with `reason` as its failure reason; True if it did.
    `finished_too`: a FINISHED one as well (its result is dropped: e.g. its sweep trial was retried elsewhere, so
    it must not stand beside the retry's run as a second result), its lease removed when it finished
    (`clear_finished`): the caller names only runs it opened. A run another process holds is left alone."""
    c = client(uri)
    r = c.get_run(run_id)
    lease = lease_of(r)
    if r.info.status not in (("RUNNING", "FINISHED") if finished_too else ("RUNNING",)) or not (
            _is_me(lease) or (r.info.status == "FINISHED" and lease is None)):  # finished: its lease gone with it
        return False
    end_run(c, run_id, status, reason)
    return True
