"""hmmscope's user-private on-disk caches (the compiled kernels, the Bayes reference's results): the folder
`$XDG_CACHE_HOME/hmmscope/<name>` checked before every use, files read only when they are this user's own and
nobody else can write them, written atomically (0600), and the folder's secret key (`.key`) under which every entry
carries an HMAC, so a planted or corrupt entry is a miss, never code run or a number used.

Clear a cache by removing its folder (`rm -r ~/.cache/hmmscope`): everything in it is computed again.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["owned_dir", "cache_dir", "read_private", "write_private", "cache_key"]


def owned_dir(d: Path) -> bool:
    """`d` is a real folder (not a link) of this user that nobody else can write (made 0700 when it is ours)."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():  # a link, a file, someone else's folder
        return False
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    return True


def cache_dir(name: str = "kernels") -> Path | None:
    """The user-private folder `$XDG_CACHE_HOME/hmmscope/<name>` (default ~/.cache; "kernels": the compiled kernels,
    "bayes": oracles/bayes.py's results): created 0700; used only when it and `hmmscope/` above it are real folders
    owned by this user that nobody else can write (made so when they are ours and too open). None otherwise: the
    caller runs uncached."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hmmscope" / name
    try:
        base.parent.parent.mkdir(parents=True, exist_ok=True)
        for d in (base.parent, base):
            with contextlib.suppress(FileExistsError):
                d.mkdir(mode=0o700)
            if not owned_dir(d):
                return None
    except OSError:
        return None
    return base


def read_private(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a regular file of this user, not a link, no other name (a hard link), nobody else
    can write it, at most `limit` bytes; else None. Opened without following links, checked on the open file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1 or st.st_mode & 0o022
                or st.st_size > limit):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """`data` to `path`, atomically: a new 0600 temp file beside it (O_EXCL, never following a link), then renamed."""
    tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cache_key(base: Path) -> bytes | None:
    """This user's secret key of the cache folder (`.key`, 32 random bytes, 0600), created once (the first of two
    processes to link it wins); every cache entry carries its HMAC. None when it cannot be read or made safely."""
    path = base / ".key"
    key = read_private(path, 32)
    if key is None and not os.path.lexists(path):
        tmp = path.with_name(f".key.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # atomic: never a half-written key under its name
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        key = read_private(path, 32)
    return key if key is not None and len(key) == 32 else None
