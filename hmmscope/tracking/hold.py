"""One writer per run: a run's lease taken atomically (`hold`), kept by the heartbeat while the run is open (`beating`),
and lost when another process takes an expired lease over (`lost`); the runs this process opened, found and ended
when their own end could not be written (`own_runs`, `settle`).

`hold` takes the lease with an OS lock beside a sqlite store (`<store folder>/.leases/<run id>.lock`, LEASE_DIR), or
by a claim of the lease tag read back after SETTLE_S on a server; it checks it while the run is open, and removes
the run's stale temp files (`leftovers`) when it takes it. A run that another process holds is refused (`RunHeld`,
one line naming it). The lease itself, who owns a run and when a run is stale: tracking.liveness.

Part of `tracking`, the one package that talks to MLflow; imports liveness, leftovers, search and store, and must not
import runs (which imports this).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..interrupts import every
from . import leftovers
from .liveness import LEASE_TAG, end_run, heartbeat_interval, identity, lease_of, lease_value, live_owner
from .search import search_runs
from .store import client, sqlite_path

__all__ = ["LEASE_DIR", "SETTLE_S", "LeaseLost", "LeaseUnavailable", "RunHeld", "beating", "hold", "lost",
           "nonce_of", "own_runs", "settle"]

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
        c.set_tag(run_id, LEASE_TAG, lease_value(interval, who, nonce))
        if touch:
            c.set_terminated(run_id, "RUNNING", end_time=int(time.time() * 1000))
        return True

    with every(interval, beat, f"mlflow-heartbeat-{run_id[:8]}"):
        yield



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
    try:
        import fcntl  # lazy: POSIX only; its absence (Windows) is the answer None
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
    c = client(uri)
    run = c.get_run(run_id)
    who = live_owner(run)
    if who is not None and not _is_me(lease_of(run)):
        raise RunHeld(_held_msg(run_id, who))
    nonce = secrets.token_hex(8)
    c.set_tag(run_id, LEASE_TAG, lease_value(heartbeat_interval(), nonce=nonce))
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
