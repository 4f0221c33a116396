"""Checks of the stores a command is given, before any work: the MLflow tracking URI and the Optuna storage.

Owns what `tracking_store` / `optuna_storage` judge (the CLI and the API call them), reading only: nothing here
creates, migrates or locks a store.

- Files. Every store path (an SQLite database, its -journal / -wal / -shm files beside it, a journal file and its
  lock files) must be a regular file where it exists: a FIFO would block the first read for ever, a device never
  ends (`journal:///dev/null`). A database is read through a read-only connection (`mode=ro`), its pages checked
  (`quick_check`); a database another process holds locked is reported as locked, with the holder's pid and
  command where /proc/locks tells it (Linux), never as "not an SQLite database" (which invites deleting a healthy
  store); the wait for the lock is bounded (LOCK_WAIT_S).
- MLflow's schema. A store whose creation or migration stopped half-way (a full disk while it was created: alembic's
  `_alembic_tmp_*` tables left behind, or a revision short of MLflow's head with tables missing) is refused with
  one line and the command that removes it (no runs in it) or repairs it; a complete store at an older revision
  gets the `mlflow db upgrade` line.
- Servers. An http(s) store gets one health check (GET /health, then one call of MLflow's REST API) with a TOTAL
  deadline (HEALTH_DEADLINE_S): a server that never answers, or answers and drips its body, fails here in seconds,
  as does one that answers /health but is not MLflow. Database URLs get one connection with CONNECT_TIMEOUT_S.

Must not import `checks` (which imports this), torch, or mlflow / optuna at module level.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import stat
import threading
import time
from pathlib import Path

from .config import ConfigError

HEALTH_TIMEOUT_S = 3.0  # one request of the health check (per socket operation)
HEALTH_DEADLINE_S = 10.0  # the whole health check of an http store (health + API), however the server answers
CONNECT_TIMEOUT_S = 5  # one connection attempt to a database server
LOCK_WAIT_S = 5.0  # how long a read waits for a store another process holds locked
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")  # files SQLite opens beside a database


# ---------------------------------------------------------------- paths


def creatable(p: Path, what: str) -> None:
    """A path that does not exist yet can be created: its nearest existing ancestor is a writable folder."""
    for anc in Path(os.path.abspath(p)).parents:
        if os.path.lexists(anc):
            if not anc.is_dir():
                raise ConfigError(f"{what} {p}: {anc} is a file, not a folder")
            if not os.access(anc, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {p}: cannot create it, {anc} is not writable")
            return


def _new_file(p: Path, what: str) -> None:
    """A store file the user named, to be created: in a creatable folder, not through a planted special file."""
    from . import safe_output

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


def hide_password(url: str) -> str:
    """The URL with its password (everything between `user:` and the last @ of the authority) as ***."""
    return re.sub(r"//([^:/@]+):[^/]*@", r"//\1:***@", url)


# ---------------------------------------------------------------- SQLite files


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


def _sqlite_tables(db: Path, what: str) -> set[str] | None:
    """Table names of an existing SQLite file, read through a read-only connection; None if not SQLite."""
    import sqlite3

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
    import importlib.util

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
    import sqlite3

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
        from mlflow.store.db.utils import _get_latest_schema_revision

        head = _get_latest_schema_revision()
        if rev == head and not tmp:
            return
    from mlflow.store.db.base_sql_model import Base
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
        import mlflow

        raise ConfigError(f"{what} {db} has a newer schema (revision {rev}, unknown to this MLflow {mlflow.__version__}, "
                          f"whose newest is {head}): it was written by a newer MLflow; use that one (pip install -U "
                          "mlflow), or another store")
    raise ConfigError(f"{what} {db} has an older schema (revision {rev}; this MLflow needs {head}): back it up, then "
                      f"`mlflow db upgrade sqlite:///{db}`")


def _sqlite_file(db: Path, what: str, table: str, *, must_exist: bool, write: bool) -> None:
    if os.path.lexists(db):
        if db.is_dir():
            raise ConfigError(f"{what} {db} is a folder, not a database file")
        tables = _sqlite_tables(db, what)
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
        _new_file(db, what)
    if write and table == "experiments":
        _artifacts_inside(db)


def _artifacts_inside(db: Path) -> None:
    """The artifact folder beside an MLflow store (`<folder>/artifacts`, where runs, checkpoints and models are
    written) and its `models/` (MLflow's logged models) resolve inside the store's folder: a link out of either is
    refused, as one out of out/ is, before any work (a linked `artifacts/models` was found only after training)."""
    from . import safe_output

    for folder in (db.parent / "artifacts", db.parent / "artifacts" / "models"):  # runs' artifacts; logged models
        safe_output.check_dest(folder / safe_output.PROBE, root=db.parent)


def _sqlite_path(url: str, what: str) -> Path | None:
    """The database file of a sqlite:/// URL; None for other schemes; ConfigError for an in-memory one."""
    if not url.lower().startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        path = make_url(url).database
    except ArgumentError:
        path = None
    if not path or path == ":memory:":
        raise ConfigError(f"{what} {url!r}: give a database file, sqlite:///path/to/file.db")
    return Path(path)


# ---------------------------------------------------------------- database servers


def _database(url: str, what: str) -> None:
    """A SQLAlchemy database URL that is not SQLite: known scheme, installed driver, a server that answers."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    shown = hide_password(url)
    try:
        u = make_url(url)
    except ArgumentError:
        raise ConfigError(f"{what} {shown!r} is not a URL (e.g. sqlite:///path/file.db, postgresql://user@host/db)") \
            from None
    try:
        dialect = u.get_dialect()
    except NoSuchModuleError:
        raise ConfigError(f"{what} {shown!r}: unknown scheme {u.drivername!r} (e.g. sqlite:///path/file.db, "
                          "postgresql://user@host/db)") from None
    backend = u.get_backend_name()
    try:
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()
    except ImportError as e:
        hint = " (pip install 'hmmscope[postgres]' gives postgresql+psycopg2://)" if backend == "postgresql" else ""
        raise ConfigError(f"{what} {shown!r}: the driver for {u.drivername!r} is not installed (no module "
                          f"{e.name or e}); install it or name an installed one in the URL{hint}") from None
    args = {"connect_timeout": CONNECT_TIMEOUT_S} if backend in ("postgresql", "mysql", "mariadb") else {}
    try:
        engine = create_engine(u, poolclass=NullPool, connect_args=args)
        with engine.connect():
            pass
    except SQLAlchemyError as e:
        why = str(getattr(e, "orig", None) or e).strip().splitlines()
        raise ConfigError(f"{what} {shown!r}: cannot connect ({why[0] if why else type(e).__name__})") from None
    except Exception as e:  # a driver's own error type
        raise ConfigError(f"{what} {shown!r}: cannot connect ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") \
            from None
    else:
        engine.dispose()


# ---------------------------------------------------------------- MLflow servers


def _get(url: str, limit: int = 1 << 20) -> tuple[int, bytes]:
    """(status, body) of one GET; HTTPError's status and body too. OSError / ValueError when it cannot be had."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as r:
            return r.status, r.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, b""


def _server_check(uri: str) -> str | None:
    """GET /health, then one call of MLflow's REST API; None if both answer as MLflow does, else why not."""
    import json

    base = uri.rstrip("/")
    try:
        status, _ = _get(f"{base}/health")
    except (OSError, ValueError) as e:
        return f"not reachable ({getattr(e, 'reason', None) or e or type(e).__name__})"
    if status != 200:
        return f"not reachable (HTTP {status})"
    try:
        status, raw = _get(f"{base}/api/2.0/mlflow/experiments/search?max_results=1")
        body = json.loads(raw or b"{}") if status == 200 else None
    except (OSError, ValueError) as e:
        return f"answers /health but is not an MLflow tracking server ({getattr(e, 'reason', None) or e})"
    if status != 200:
        return f"answers /health but is not an MLflow tracking server (HTTP {status} from its experiments API)"
    if not (isinstance(body, dict) and set(body) <= {"experiments", "next_page_token"}):
        return "answers /health but is not an MLflow tracking server (its experiments API answers something else)"
    return None


def health(uri: str, deadline_s: float | None = None) -> None:
    """The health check of an http(s) store, done within `deadline_s` (default HEALTH_DEADLINE_S) in total (a thread:
    a server that answers and then drips its body keeps a read alive for ever, which no per-request timeout stops)."""
    deadline_s = HEALTH_DEADLINE_S if deadline_s is None else deadline_s
    result: list[str | None] = []
    th = threading.Thread(target=lambda: result.append(_server_check(uri)), daemon=True, name="mlflow-health")
    t0 = time.monotonic()
    th.start()
    th.join(deadline_s)
    shown = hide_password(uri)
    if not result:
        raise ConfigError(f"MLflow server {shown} did not answer its health check within {deadline_s:g} s (it "
                          f"accepted the connection; waited {time.monotonic() - t0:.0f} s); check the server, or give "
                          "another --tracking-uri")
    why = result[0]
    if why is None:
        return
    if why.startswith("answers /health"):
        raise ConfigError(f"{shown} {why}; give an MLflow server's --tracking-uri")
    raise ConfigError(f"MLflow server {shown} is {why}; start it or give another --tracking-uri")


# ---------------------------------------------------------------- the two stores


def tracking_store(uri: str | None, *, must_exist: bool = False, write: bool = True) -> str:
    """The resolved MLflow tracking URI (option, else MLFLOW_TRACKING_URI, else ./mlruns), checked."""
    from . import tracking

    uri = tracking.resolve_uri(uri)  # ValueError where the working folder's path is no sqlite URL's (tracking.store)
    what = "MLflow store"
    tracking.store.check_sqlite_url(uri)
    db = _sqlite_path(uri, "tracking URI")
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if db is not None:
        bad = sorted(set("'\"\\\n\r\0") & set(str(db.resolve())))
        if bad:  # MLflow writes the artifact folder into an SQL string literal when it creates the store
            raise ConfigError(f"MLflow store {db}: its path holds {' '.join(map(repr, bad))}, which MLflow cannot "
                              "store; move the project to a folder without quotes or backslashes")
        _sqlite_file(db, what, "experiments", must_exist=must_exist, write=write)
    elif scheme in ("http", "https"):
        health(uri)
    elif scheme in ("", "file"):
        raise ConfigError(f"tracking URI {hide_password(uri)!r}: a plain folder is not an MLflow store here; use "
                          "sqlite:///path/mlflow.db or http://HOST:PORT")
    else:
        _database(uri, "tracking URI")
    return uri


def default_storage_url() -> str:
    """The default Optuna storage, sqlite:///<cwd>/mlruns/optuna.db (as sweep.default_storage, not created); ValueError
    where the working folder's path is no sqlite URL's (`tracking.store.sqlite_url`)."""
    from .tracking.store import sqlite_url

    return sqlite_url((Path("mlruns") / "optuna.db").resolve(), "Optuna storage")


def _journal_file(p: Path, *, must_exist: bool, write: bool) -> None:
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
        _new_file(p, what)


def optuna_storage(url: str | None, *, must_exist: bool = False, write: bool = True) -> str:
    """The Optuna storage URL (default: ./mlruns/optuna.db), checked; a study to be read needs must_exist.
    A journal file comes back as journal:///ABSOLUTE/PATH (sweep/storage.py)."""
    from .sweep.storage import journal_path
    from .tracking.store import check_sqlite_url

    url = url or default_storage_url()
    check_sqlite_url(url, "Optuna storage")
    journal = journal_path(url)
    if journal is not None:
        _journal_file(journal, must_exist=must_exist, write=write)
        return f"journal://{journal}"
    db = _sqlite_path(url, "Optuna storage")
    if db is not None:
        _sqlite_file(db, "Optuna storage", "studies", must_exist=must_exist, write=write)
    else:
        _database(url, "Optuna storage")
    return url
