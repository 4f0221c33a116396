"""Leftovers of killed writers: a run's temp files, found and removed once no live process can be writing them.

Every file hmmscope writes into a run's artifacts goes through `safe_output` (a temp file `.<name>.<16 hex>.tmp`
beside its destination, renamed onto it), and a run's files bound for a server are staged in a TMPDIR folder
`hmmscope-<run id>-<random>` (`run_temp_dir`). A writer killed mid-write (SIGKILL while a checkpoint is saved)
leaves such a file behind: tens of MB each at the paper's scale. `find` lists them per run (a sqlite store's
artifact folders, walked without following links; this user's TMPDIR folders); `remove` deletes them and says how
many and how large. Who calls it decides that no live process writes them: `train --resume` (any run start that
resumes, under the run's lease) for its own run, `runs gc` for every run that is not RUNNING with a live owner.

Part of `tracking`; imports only `store` (no mlflow).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .store import ARTIFACTS, sqlite_path

TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{16}(\.[0-9a-f]{4}-\d+-\d+)?\.tmp$")  # safe_output's temp files (safe_output.TEMP)
CREATING = re.compile(r"^\..+\.[0-9a-f]{12}\.creating(-journal)?$")  # store.create's temp database and its journal
TMP_PREFIX = "hmmscope-"  # TMPDIR folders of a run's staged artifacts: hmmscope-<run id>-<random>
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def run_temp_dir(run_id: str) -> tempfile.TemporaryDirectory:
    """A TMPDIR folder for files bound for run `run_id`'s artifacts, named so that `find` can tell whose it is."""
    return tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{run_id}-")


def find(uri: str, run_ids: Iterable[str] | None = None) -> dict[str, list[Path]]:
    """The temp files (and staging folders) left in runs' artifacts, by run id; `run_ids` narrows it."""
    want = None if run_ids is None else set(run_ids)
    out: dict[str, list[Path]] = {}
    db = sqlite_path(uri)
    root = db.parent / ARTIFACTS if db is not None else None
    if root is not None and root.is_dir():
        for entry in os.scandir(root):
            if not (_RUN_ID.match(entry.name) and entry.is_dir(follow_symlinks=False)):
                continue
            if want is not None and entry.name not in want:
                continue
            for folder, _dirs, files in os.walk(Path(entry.path) / "artifacts"):  # never follows a link
                for f in files:
                    p = Path(folder) / f
                    if TEMP_NAME.match(f) and p.is_file() and not p.is_symlink():
                        out.setdefault(entry.name, []).append(p)
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            rid = entry.name[len(TMP_PREFIX):len(TMP_PREFIX) + 32]
            if not (entry.name.startswith(TMP_PREFIX) and _RUN_ID.match(rid) and entry.is_dir(follow_symlinks=False)):
                continue
            if (want is None or rid in want) and entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                out.setdefault(rid, []).append(Path(entry.path))
    return out


def _size(p: Path) -> int:
    if p.is_dir() and not p.is_symlink():
        return sum(_size(c) for c in p.iterdir())
    with contextlib.suppress(OSError):
        return p.lstat().st_size
    return 0


def remove(paths: Iterable[Path], *, dry_run: bool = False) -> tuple[int, int]:
    """Delete the leftovers (files, or staging folders whole); (how many, bytes). `dry_run`: count only."""
    n = size = 0
    for p in paths:
        b = _size(p)
        if not dry_run:
            try:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except FileNotFoundError:
                continue
            except OSError:
                continue  # not ours to remove (permissions): left, not counted
        n, size = n + 1, size + b
    return n, size


def describe(n: int, size: int) -> str:
    """'3 stale temp file(s), 21.4 MB'."""
    return f"{n} stale temp file(s), {size / 1e6:.1f} MB"


def free_locks(uri: str) -> int:
    """Remove the run lease lock files (`<store folder>/.leases/*.lock`, hold.hold) that no process holds (their
    holder was killed: the OS dropped the lock, the file stayed); how many. Each is locked before it is removed, so a
    held one is never touched."""
    try:
        import fcntl  # lazy: POSIX only
    except ImportError:
        return 0
    db = sqlite_path(uri)
    folder = db.parent / ".leases" if db is not None else None
    if folder is None:
        return 0
    try:  # the folder itself, never through a link (hold._lease_folder writes nothing through one either)
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return 0
    n = 0
    try:
        for name in os.listdir(dfd):
            if not name.endswith(".lock"):
                continue
            try:
                fd = os.open(name, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(name, dir_fd=dfd)
                    n += 1
            except OSError:
                pass  # held: its run is open; or another user's, in a shared store's sticky folder
            finally:
                os.close(fd)
    finally:
        os.close(dfd)
    return n


def lock_held(uri: str, run_id: str) -> bool:
    """Does a live process hold run `run_id`'s lease lock (`<store folder>/.leases/<run id>.lock`, hold.hold): an
    `evaluate` writing a run that is not RUNNING, whose staged files are not leftovers?"""
    try:
        import fcntl  # lazy: POSIX only
    except ImportError:
        return False
    db = sqlite_path(uri)
    if db is None:
        return False
    try:
        fd = os.open(db.parent / ".leases" / f"{run_id}.lock", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock this took
    return False


def remove_creations(uri: str, *, dry_run: bool = False) -> tuple[int, int]:
    """Remove what a killed first creation of a sqlite store left beside it (`.<db>.<hex>.creating` and its journal,
    store.create); (how many, bytes). Taken under the store's creation lock, without waiting: while another process
    creates the store, nothing is touched."""
    import filelock  # lazy: filelock off the CLI's start-up

    db = sqlite_path(uri)
    if db is None or not db.parent.is_dir():
        return 0, 0
    found = [p for p in db.parent.iterdir() if CREATING.match(p.name) and p.name.startswith(f".{db.name}.")]
    if not found:
        return 0, 0
    try:
        with filelock.FileLock(str(db.parent / ".init.lock"), timeout=0):
            found = [p for p in db.parent.iterdir() if CREATING.match(p.name) and p.name.startswith(f".{db.name}.")
                     and p.is_file() and not p.is_symlink()]
            return remove(found, dry_run=dry_run)
    except filelock.Timeout:  # a creation under way
        return 0, 0
