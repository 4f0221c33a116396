"""Safe file output: every file hmmscope writes (reports, figures, CSV/JSON, evaluation tables, exports, datasets,
checkpoints' local temp files) goes through here.

Owns how a file is written:
- The data goes to a temp file with an unpredictable name in the destination folder, created with
  O_CREAT | O_EXCL | O_NOFOLLOW (a planted file or link at a guessed name is never opened), mode 0600 then the
  usual 0666 & ~umask; then it is flushed, fsynced and closed with every error checked (a short write, ENOSPC,
  EIO on fsync or close); then `os.replace`d onto its final name and the folder fsynced. A failure leaves no
  temp file and the final name untouched (its old content, or nothing).
- Where it may go: the destination must not be a symlink, nor a special file (FIFO, device, socket: /dev/full is
  never replaced), and no folder on the way from the output root to it may be a symlink that points outside
  that root (`out/<sweep>` planted as a link to another folder). The output root is `root` when given, else the
  current folder when the destination lies under it, else the destination's own folder (a path the user named
  outside the project is the user's choice). A path the user named explicitly (`trust(path)`, called by the CLI
  for `--out`, an export's file) is written even through links: the user chose it.

What hmmscope writes goes through three writers: `write_text`/`write_bytes`/`atomic_open` for any file,
`write_csv`/`write_tables` for tables (rows as dicts: columns in first-seen order, NaN as an empty cell, the way every
result becomes a file), `save_figure` for figures (a PNG and a PDF side by side, built on `matplotlib.figure.Figure`:
no pyplot state, safe in threads and workers).

Every failure is an `OutputError` (a ConfigError: the CLI prints one line and exits 2) naming the path and why.

Must not import torch, mlflow, optuna or anything of hmmscope but `config` (for ConfigError).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import errno
import io
import math
import os
import re
import secrets
import socket
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .config import ConfigError

PROBE = ".probe"  # a name inside a folder, to check the folder as a file's destination would be (never created)
# a temp file's name: `.<name>.<16 hex>.<writer>.tmp`, the writer `<host: 4 hex>-<pid>-<start time in ticks>` (`_writer`),
# so that one left by a killed writer is told from a live writer's (`dead_writer`); older ones carry no writer
TEMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{16}(?:\.(?P<host>[0-9a-f]{4})-(?P<pid>\d+)-(?P<start>\d+))?\.tmp$")
_TRUSTED: set[str] = set()  # absolute paths the user named explicitly (files or folders)


class OutputError(ConfigError):
    """A file could not be written safely (one line: the path and why)."""


def trust(path: str | Path) -> None:
    """The user named `path` explicitly: it (and the links on its way) may be written through."""
    _TRUSTED.add(os.path.abspath(path))


def untrust_all() -> None:
    """Forget every trusted path (tests; a long-lived process between commands)."""
    _TRUSTED.clear()


def _why(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


def _root_for(path: Path, root: str | Path | None) -> Path:
    if root is not None:
        return Path(os.path.abspath(root))
    cwd = Path(os.getcwd())
    return cwd if path == cwd or cwd in path.parents else path.parent


def check_dest(path: str | Path, root: str | Path | None = None) -> Path:
    """The absolute destination `path`, if a file may be written there (module docstring); else OutputError."""
    p = Path(os.path.abspath(path))
    trusted = str(p) in _TRUSTED
    r = _root_for(p, root)
    real_root = Path(os.path.realpath(r))
    chain = [] if trusted else [a for a in reversed(p.parents) if a == r or r in a.parents]
    for anc in chain:
        if str(anc) in _TRUSTED:
            continue
        if os.path.islink(anc) and real_root not in [Path(os.path.realpath(anc)), *Path(os.path.realpath(anc)).parents]:
            shown = p.parent if p.name == PROBE else p
            raise OutputError(f"refusing to write {shown}: {anc} is a symlink to {os.path.realpath(anc)}, outside "
                              f"{r}; remove the link or name the path yourself")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise OutputError(f"cannot write {p}: {_why(e)}") from None
    if stat.S_ISLNK(st.st_mode) and not trusted:  # a named link is replaced by the rename, its target kept
        raise OutputError(f"refusing to write {p}: it is a symlink (to {os.path.realpath(p)}); remove it or name "
                          "the path yourself")
    if stat.S_ISLNK(st.st_mode):
        return p
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {p}: it is a folder")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"refusing to write {p}: it is a special file (FIFO, device or socket), not a regular file")
    return p


def make_dir(path: str | Path, root: str | Path | None = None) -> Path:
    """Create folder `path` (and its parents) unless it exists; every existing part checked as `check_dest`
    checks a destination's folders, and `path` itself must be a folder (a link to one inside the root is).
    Returns `path` as given."""
    p = Path(os.path.abspath(path))
    check_dest(p / PROBE, root)  # its folders, `p` among them
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot create folder {p}: a file is in the way") from None
    except OSError as e:
        raise OutputError(f"cannot create folder {p}: {_why(e)}") from None
    return Path(path)  # as the caller named it (relative paths stay relative in what it prints)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a folder; the rename itself is done
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _host() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()) & 0xFFFF:04x}"


def _start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None (gone, or no /proc)."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = st[st.rindex(")") + 2:].split()
    return None if rest[0] in ("Z", "X") else rest[19]  # a zombie is gone


def _writer() -> str:
    """This process as its temp files' names carry it: host, pid, start time."""
    pid = os.getpid()
    return f"{_host()}-{pid}-{_start(pid) or 0}"


def dead_writer(name: str) -> bool:
    """Is `name` a temp file's name whose writer, a process of this host, is gone (so nobody will finish or remove
    it)? False for an older name without its writer, another host's, or a live writer's."""
    m = TEMP.match(name)
    if m is None or m.group("pid") is None or m.group("host") != _host():
        return False
    return _start(int(m.group("pid"))) != m.group("start")


def stale_temps(folder: str | Path) -> list[Path]:
    """The temp files under `folder` (walked without following links) whose writers are dead (`dead_writer`)."""
    out = []
    for d, _dirs, files in os.walk(folder):
        out += [Path(d) / f for f in files if dead_writer(f) and not os.path.islink(Path(d) / f)]
    return out


def _clean_siblings(dst: Path) -> None:
    """Remove the temp files of `dst` that dead writers left beside it (a killed earlier write of the same file)."""
    with contextlib.suppress(OSError):
        for e in os.scandir(dst.parent):
            if e.name.startswith(f".{dst.name}.") and dead_writer(e.name) and e.is_file(follow_symlinks=False):
                m = TEMP.match(e.name)
                if m is not None and m.group("name") == dst.name:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)


def _new_temp(dst: Path) -> tuple[int, Path]:
    """An exclusive, never-followed temp file beside `dst`, with an unpredictable name that names its writer (TEMP);
    what dead writers of `dst` left beside it is removed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    _clean_siblings(dst)
    who = _writer()
    for _ in range(100):
        tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(8)}.{who}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError(f"cannot write {dst}: {_why(e)}") from None
        umask = os.umask(0)
        os.umask(umask)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666 & ~umask)
        return fd, tmp
    raise OutputError(f"cannot write {dst}: no free temp name in its folder")


def _commit(tmp: Path, dst: Path, root: str | Path | None) -> None:
    """fsync the temp file (opened again without following links), check it is ours, rename it onto `dst`."""
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "the temp file was replaced", str(tmp))
        os.fsync(fd)
    finally:
        os.close(fd)
    check_dest(dst, root)  # again, just before the rename: a link planted meanwhile is refused
    os.replace(tmp, dst)
    _fsync_dir(dst.parent)


@contextlib.contextmanager
def atomic_path(path: str | Path, root: str | Path | None = None) -> Iterator[Path]:
    """Yield a fresh temp path beside `path` for a writer that wants a path (savefig, torch.save, np.savez);
    on a clean exit it is fsynced and renamed onto `path`. Any failure: OutputError, no temp file left."""
    dst = check_dest(path, root)
    make_dir(dst.parent, root)
    fd, tmp = _new_temp(dst)
    os.close(fd)
    try:
        yield tmp
        _commit(tmp, dst, root)
    except OSError as e:
        raise OutputError(f"cannot write {dst}: {_why(e)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", root: str | Path | None = None, **kw: Any) -> Iterator[IO]:
    """Yield a file object on a fresh temp file beside `path` ("w" text or "wb"); on a clean exit it is flushed,
    fsynced, closed (each checked) and renamed onto `path`. Any failure: OutputError, no temp file left."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a new file: mode 'w' or 'wb', not {mode!r}")
    dst = check_dest(path, root)
    make_dir(dst.parent, root)
    fd, tmp = _new_temp(dst)
    try:
        f = os.fdopen(fd, mode, **kw)
    except Exception:
        os.close(fd)
        os.unlink(tmp)
        raise
    try:
        try:
            yield f
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()  # raises a deferred write error (ENOSPC on the last buffer) here, not silently
        _commit(tmp, dst, root)
    except OSError as e:
        raise OutputError(f"cannot write {dst}: {_why(e)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes(path: str | Path, data: bytes, root: str | Path | None = None) -> Path:
    """Write `data` to `path` safely; every byte checked written (a short write is retried, none is an error)."""
    with atomic_open(path, "wb", root) as f:
        view = memoryview(data)
        while view:
            n = os.write(f.fileno(), view)
            if not n:
                raise OSError(errno.EIO, "short write", str(path))
            view = view[n:]
    return Path(os.path.abspath(path))


def write_text(path: str | Path, text: str, root: str | Path | None = None) -> Path:
    return write_bytes(path, text.encode(), root)


def write_with(path: str | Path, write: Callable[[Path], Any], root: str | Path | None = None) -> Path:
    """`write(tmp_path)` then rename (a library that writes by path): see `atomic_path`."""
    with atomic_path(path, root) as tmp:
        write(tmp)
    return Path(os.path.abspath(path))


def write_npz(path: str | Path, arrays: Mapping[str, Any], root: str | Path | None = None) -> Path:
    """Arrays to a compressed .npz at exactly `path`, atomically (numpy appends .npz to a temp name; a file object
    keeps it); read back with np.load(path, allow_pickle=False)."""
    import numpy as np  # lazy: numpy (~0.1 s) off the CLI's start-up, which imports this module

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    return write_with(path, write, root)


# ---------------------------------------------------------------- output folders
#
# Every command keeps what it makes under one root (default ./out), one folder per run or sweep:
#   out/<run name>-<run id[:8]>/evaluation/   figure1.{png,pdf}, figure1_*.csv, figure1.json   (train, evaluate)
#   out/<run name>-<run id[:8]>/analysis/     figure2_shuffle.*, figure3_probes.*, tables        (analyze)
#   out/<sweep>/                              report.{md,html,json}, trials.csv, figures          (report)
#   out/theory-<UTC time>/                    theory.{png,pdf,json}                              (theory)
#   out/main-<run id[:8]>/                    the main job: theory/, the training run's folder, <sweep>/
# The run id in a run's folder name keeps two runs with one name apart; each command has its own
# subfolder, so no command overwrites another's files (re-running one command on one run re-makes its own).


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def run_folder(root: Path, run_name: str | None, run_id: str) -> Path:
    """root/<run name>-<first 8 of the run id> (the name made file-safe; the id alone without a name)."""
    return Path(root) / (f"{_safe(run_name)}-{run_id[:8]}" if run_name else run_id)


def new_folder(root: Path, prefix: str) -> Path:
    """root/<prefix>-<UTC time>, with -2, -3, ... if that exists; not created (the job creates it when it writes)."""
    base = Path(root) / f"{_safe(prefix)}-{_dt.datetime.now(_dt.UTC).strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


# ---------------------------------------------------------------- tables and figures

DPI = 120


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as CSV text: a header of `columns` (default: every key, in first-seen order), then one line per row; a
    missing key and a NaN float are empty cells; '\\n' line ends. No rows and no columns: ''."""
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    if not cols:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", restval="")
    w.writeheader()
    w.writerows({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
              root: str | Path | None = None) -> Path:
    """`csv_text(rows, columns)` written to `path` atomically; returns the path."""
    return write_text(path, csv_text(rows, columns), root)


def write_tables(directory: str | Path, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Path]:
    """`<directory>/<name>.csv` for each table with rows (`write_csv`; the folder made if need be); the paths written."""
    d = make_dir(directory)
    return [write_csv(d / f"{name}.csv", rows) for name, rows in tables.items() if rows]


def save_figure(fig, path: str | Path, dpi: int = DPI) -> list[Path]:
    """Write `fig` as <path>.png and <path>.pdf (any suffix given is replaced), each atomically; returns [png, pdf].
    The layout (constrained or tight) is computed once, for the PNG; the PDF reuses it."""
    path = Path(path)
    engine = fig.get_layout_engine()
    out = []
    try:
        for fmt in ("png", "pdf"):
            dst = path.with_suffix(f".{fmt}")
            with atomic_path(dst) as tmp:
                fig.savefig(tmp, dpi=dpi, format=fmt)
            if engine is not None:  # laid out by the first save: the axes keep their places
                fig.set_layout_engine("none")
            out.append(dst)
    finally:
        if engine is not None:
            fig.set_layout_engine(engine)
    return out
