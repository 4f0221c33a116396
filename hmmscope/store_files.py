"""A store's files, checked before any work, reading only: a path a store will be created at (`creatable`), every
store file regular where it exists (`regular_or_absent`: a FIFO would block the first read for ever), an SQLite
database read through a read-only connection with its pages checked and its lock holders named (`sqlite_file`), an
MLflow store's schema complete and current, a journal file that is one (`journal_file`). `store_checks` judges the two
stores with these; imports `config` only (safe_output, SQLAlchemy and mlflow inside the functions, `# lazy:`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sqlite3
import stat
from pathlib import Path

from .config import ConfigError

LOCK_WAIT_S = 5.0  # how long a read waits for a store another process holds locked
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")  # files SQLite opens beside a database


def creatable(p: Path, what: str) -> None:
    """A path that does not exist yet can be created: its nearest existing ancestor is a writable folder."""
    for anc in Path(os.path.abspath(p)).parents:
        if os.path.lexists(anc):
            if not anc.is_dir():
                raise ConfigError(f"{what} {p}: {anc} is a file, not a folder")
            if not os.access(anc, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {p}: cannot create it, {anc} is not writable")
            return


def new_file(p: Path, what: str) -> None:
    """A store file the user named, to be created: in a creatable folder, not through a planted special file."""
    from . import safe_output  # lazy: safe_output (~10 ms: secrets, random) off the CLI's start-up

    creatable(p, what)
    safe_output.trust(p)
    safe_output.check_dest(p)


def regular_or_absent(p: Path, what: str) -> None:
    """ConfigError if `p` exists (following links) and is not a regular file: a folder, FIFO, device or socket."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ConfigError(f"{what} {p} is a link to nothing ({os.readlink(p)})") from None
        return
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {p} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {p} is a special file (FIFO, device or socket), not a regular file: a store is "
                          "read and written as a file")


def lock_holders(path: Path) -> list[str]:
    """Processes holding a POSIX or flock lock on `path` (Linux /proc/locks): 'process PID (COMMAND)'; [] if unknown."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for ln in lines:
        parts = ln.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[5] == want and parts[4].isdigit():
            pid = parts[4]
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = ""
            who = f"process {pid}" + (f" ({cmd[:100]})" if cmd else "")
            if who not in out:
                out.append(who)
    return out


def _busy(e: Exception) -> bool:
    return "locked" in str(e) or "busy" in str(e)


def _locked(db: Path, what: str) -> ConfigError:
    who = lock_holders(db)
    return ConfigError(f"{what} {db} is locked by {', '.join(who) if who else 'another process'} (waited "
                       f"{LOCK_WAIT_S:g} s); wait for it to finish, or stop it")


def sqlite_tables(db: Path, what: str) -> set[str] | None:
    """Table names of an existing SQLite file, read through a read-only connection; None if not SQLite."""
    regular_or_absent(db, what)
    for side in SQLITE_SIDECARS:
        regular_or_absent(db.with_name(db.name + side), what)
    try:
        with open(db, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise ConfigError(f"{what} {db}: cannot read it ({e.strerror or e})") from None
    if not head:
        return set()  # an empty file is an empty database
    if head != b"SQLite format 3\x00":
        return None
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
    except sqlite3.Error:
        return None
    try:
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
        except sqlite3.Error as e:  # an SQLite header, then a schema that cannot be read: truncated, overwritten
            if _busy(e):
                raise _locked(db, what) from None
            why = (str(e).splitlines() or [type(e).__name__])[0][:120]
            raise ConfigError(f"{what} {db} is corrupt ({why}); restore it from a backup "
                              "or move it away") from None
        try:  # every page read once: a malformed page or a truncated file is found here, not mid-run
            bad = [r[0] for r in con.execute("pragma quick_check(3)") if r[0] != "ok"]
        except sqlite3.Error as e:
            if _busy(e):
                raise _locked(db, what) from None
            bad = [str(e)]
    finally:
        con.close()
    if bad:
        raise ConfigError(f"{what} {db} is corrupt ({(bad[0].splitlines() or ['?'])[0][:120]}); restore it from a backup "
                          "or move it away")
    return tables


@functools.lru_cache(maxsize=1)
def _mlflow_revisions() -> frozenset[str]:
    """Every schema revision the installed MLflow's migrations know (empty if they cannot be read)."""
    _mlflow_head()
    return frozenset(_REVISIONS)


_REVISIONS: set[str] = set()


@functools.lru_cache(maxsize=1)
def _mlflow_head() -> str | None:
    """The head revision of the installed MLflow's schema, read from its migration files' `revision` and
    `down_revision` lines (milliseconds; alembic's own ScriptDirectory takes seconds); None if that is not one head."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    revs, downs = set(), set()
    for f in (Path(next(iter(spec.submodule_search_locations))) / "store" / "db_migrations" / "versions").glob("*.py"):
        text = f.read_text(errors="replace")
        r = re.search(r"^revision\s*=\s*['\"]([0-9a-z_]+)['\"]", text, re.M)
        d = re.search(r"^down_revision\s*=\s*(.+)$", text, re.M)
        if r:
            revs.add(r.group(1))
        if d:
            downs |= set(re.findall(r"['\"]([0-9a-z_]+)['\"]", d.group(1)))
    heads = revs - downs
    _REVISIONS.update(revs)
    return next(iter(heads)) if len(heads) == 1 else None


def _mlflow_schema(db: Path, tables: set[str], what: str) -> None:
    """A half-created or out-of-date MLflow store: ConfigError with the command that removes or repairs it."""
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
    try:
        rev = None
        if "alembic_version" in tables:
            row = con.execute("select version_num from alembic_version").fetchone()
            rev = row[0] if row else None
        n_runs = con.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0
    except sqlite3.Error:
        rev, n_runs = None, 0
    finally:
        con.close()
    tmp = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    head = _mlflow_head()
    if rev == head and not tmp:
        return
    if head is None:  # the migrations could not be read cheaply: ask alembic (seconds)
        from mlflow.store.db.utils import _get_latest_schema_revision  # lazy: mlflow (~1 s) off the CLI's start-up

        head = _get_latest_schema_revision()
        if rev == head and not tmp:
            return
    from mlflow.store.db.base_sql_model import Base  # lazy: mlflow (~1 s) off the CLI's start-up
    importlib.import_module("mlflow.store.tracking.dbmodels")  # registers the tables MLflow expects

    missing = set(Base.metadata.tables) - tables
    if tmp or rev is None or missing:
        how = (f"it holds no runs: remove it (`rm {db}`) and run again" if not n_runs else
               f"it holds {n_runs} run(s): back it up, then `sqlite3 {db} "
               f"'{'; '.join(f'DROP TABLE {t}' for t in tmp) or 'SELECT 1'}' && mlflow db upgrade sqlite:///{db}`")
        raise ConfigError(f"{what} {db} was left half-created (its schema stopped at revision {rev or 'none'}"
                          f"{', with ' + tmp[0] + ' left over' if tmp else ''}; e.g. a full disk while it was "
                          f"created); {how}")
    known = _mlflow_revisions()
    if known and rev not in known:  # written by a newer MLflow: an upgrade here would not know it
        import mlflow  # lazy: mlflow (~1 s) off the CLI's start-up

        raise ConfigError(f"{what} {db} has a newer schema (revision {rev}, unknown to this MLflow {mlflow.__version__}, "
                          f"whose newest is {head}): it was written by a newer MLflow; use that one (pip install -U "
                          "mlflow), or another store")
    raise ConfigError(f"{what} {db} has an older schema (revision {rev}; this MLflow needs {head}): back it up, then "
                      f"`mlflow db upgrade sqlite:///{db}`")


def sqlite_file(db: Path, what: str, table: str, *, must_exist: bool, write: bool) -> None:
    if os.path.lexists(db):
        if db.is_dir():
            raise ConfigError(f"{what} {db} is a folder, not a database file")
        tables = sqlite_tables(db, what)
        if tables is None:
            raise ConfigError(f"{what} {db} is not an SQLite database")
        if table not in tables and (tables or must_exist):
            raise ConfigError(f"no {what} in {db} (an {'empty ' if not tables else ''}SQLite file without a "
                              f"{table!r} table)")
        if table == "experiments" and tables:
            _mlflow_schema(db, tables, what)
        if write:  # SQLite writes the file and a journal beside it
            if not os.access(db, os.W_OK):
                raise ConfigError(f"{what} {db} is not writable")
            creatable(db, what)
    elif must_exist:
        raise ConfigError(f"no {what} at {db} (nothing was recorded there yet)")
    else:
        new_file(db, what)
    if write and table == "experiments":
        _artifacts_inside(db)


def _artifacts_inside(db: Path) -> None:
    """The artifact folder beside an MLflow store (`<folder>/artifacts`, where runs, checkpoints and models are
    written) and its `models/` (MLflow's logged models) resolve inside the store's folder: a link out of either is
    refused, as one out of out/ is, before any work (a linked `artifacts/models` was found only after training)."""
    from . import safe_output  # lazy: safe_output (~10 ms: secrets, random) off the CLI's start-up

    for folder in (db.parent / "artifacts", db.parent / "artifacts" / "models"):  # runs' artifacts; logged models
        safe_output.check_dest(folder / safe_output.PROBE, root=db.parent)


def sqlite_path(url: str, what: str) -> Path | None:
    """The database file of a sqlite:/// URL; None for other schemes; ConfigError for an in-memory one."""
    if not url.lower().startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url  # lazy: SQLAlchemy off the CLI's start-up
    from sqlalchemy.exc import ArgumentError  # lazy: the same

    try:
        path = make_url(url).database
    except ArgumentError:
        path = None
    if not path or path == ":memory:":
        raise ConfigError(f"{what} {url!r}: give a database file, sqlite:///path/to/file.db")
    return Path(path)


def journal_file(p: Path, *, must_exist: bool, write: bool) -> None:
    what = "Optuna journal"
    for lock in (p.with_name(p.name + ".lock"), p.with_name(p.name + ".trials.lock")):
        if os.path.lexists(lock) and not os.path.islink(lock):  # Optuna's symlink lock is a link, on purpose
            regular_or_absent(lock, f"{what}'s lock file")
    if os.path.lexists(p):
        regular_or_absent(p, what)
        try:
            with open(p, "rb") as f:
                head = f.read(16)
        except OSError as e:
            raise ConfigError(f"{what} {p}: cannot read it ({e.strerror or e})") from None
        if head.startswith(b"SQLite format 3"):
            raise ConfigError(f"{what} {p} is an SQLite database: give sqlite:///{p}")
        if head and not head.startswith(b"{"):
            raise ConfigError(f"{what} {p} is not an Optuna journal (JSON lines)")
        if write:  # appends, and lock files beside it
            if not os.access(p, os.W_OK):
                raise ConfigError(f"{what} {p} is not writable")
            creatable(p.with_name(p.name + ".lock"), what)
    elif must_exist:
        raise ConfigError(f"no {what} at {p} (nothing was recorded there yet)")
    else:
        new_file(p, what)
