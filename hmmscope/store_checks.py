"""Checks of the stores a command is given, before any work: the MLflow tracking URI and the Optuna storage.

Owns what `tracking_store` / `optuna_storage` judge (the CLI and the API call them), reading only: nothing here
creates, migrates or locks a store.

- Files. Every store path (an SQLite database, its -journal / -wal / -shm files beside it, a journal file and its
  lock files) must be a regular file where it exists: a FIFO would block the first read for ever, a device never
  ends (`journal:///dev/null`). A database is read through a read-only connection (`mode=ro`), its pages checked
  (`quick_check`); a database another process holds locked is reported as locked, with the holder's pid and
  command where /proc/locks tells it (Linux), never as "not an SQLite database" (which invites deleting a healthy
  store); the wait for the lock is bounded (LOCK_WAIT_S). These file checks are `store_files`'.
- MLflow's schema. A store whose creation or migration stopped half-way (a full disk while it was created: alembic's
  `_alembic_tmp_*` tables left behind, or a revision short of MLflow's head with tables missing) is refused with
  one line and the command that removes it (no runs in it) or repairs it; a complete store at an older revision
  gets the `mlflow db upgrade` line.
- Servers. An http(s) store gets one health check (GET /health, then one call of MLflow's REST API) with a TOTAL
  deadline (HEALTH_DEADLINE_S): a server that never answers, or answers and drips its body, fails here in seconds,
  as does one that answers /health but is not MLflow. Database URLs get one connection with CONNECT_TIMEOUT_S.

Must not import `checks` (above it), torch, or mlflow / optuna at module level; a store's files are `store_files`'.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

from .config import ConfigError
from .store_files import journal_file, sqlite_file, sqlite_path

HEALTH_TIMEOUT_S = 3.0  # one request of the health check (per socket operation)
HEALTH_DEADLINE_S = 10.0  # the whole health check of an http store (health + API), however the server answers
CONNECT_TIMEOUT_S = 5  # one connection attempt to a database server


# ---------------------------------------------------------------- URLs


def hide_password(url: str) -> str:
    """The URL with its password (everything between `user:` and the last @ of the authority) as ***."""
    return re.sub(r"//([^:/@]+):[^/]*@", r"//\1:***@", url)


# ---------------------------------------------------------------- database servers


def _database(url: str, what: str) -> None:
    """A SQLAlchemy database URL that is not SQLite: known scheme, installed driver, a server that answers."""
    from sqlalchemy import create_engine  # lazy: SQLAlchemy off the CLI's start-up
    from sqlalchemy.engine import make_url  # lazy: the same
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError  # lazy: the same
    from sqlalchemy.pool import NullPool  # lazy: the same

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
    import urllib.error  # lazy: urllib.request (~40 ms: http.client, email) off the CLI's start-up
    import urllib.request  # lazy: the same; only an http store's health check asks

    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as r:
            return r.status, r.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, b""


def _server_check(uri: str) -> str | None:
    """GET /health, then one call of MLflow's REST API; None if both answer as MLflow does, else why not."""
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
    from . import tracking  # lazy: the tracking layer (~1.2 s) off the CLI's start-up

    uri = tracking.resolve_uri(uri)  # ValueError where the working folder's path is no sqlite URL's (tracking.store)
    what = "MLflow store"
    tracking.store.check_sqlite_url(uri)
    db = sqlite_path(uri, "tracking URI")
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if db is not None:
        bad = sorted(set("'\"\\\n\r\0") & set(str(db.resolve())))
        if bad:  # MLflow writes the artifact folder into an SQL string literal when it creates the store
            raise ConfigError(f"MLflow store {db}: its path holds {' '.join(map(repr, bad))}, which MLflow cannot "
                              "store; move the project to a folder without quotes or backslashes")
        sqlite_file(db, what, "experiments", must_exist=must_exist, write=write)
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
    from .tracking.store import sqlite_url  # lazy: the tracking layer (~1.2 s) off the CLI's start-up

    return sqlite_url((Path("mlruns") / "optuna.db").resolve(), "Optuna storage")


def optuna_storage(url: str | None, *, must_exist: bool = False, write: bool = True) -> str:
    """The Optuna storage URL (default: ./mlruns/optuna.db), checked; a study to be read needs must_exist.
    A journal file comes back as journal:///ABSOLUTE/PATH (sweep/storage.py)."""
    from .sweep.storage import journal_path  # lazy: the sweep layer (optuna) off the CLI's start-up; upward
    from .tracking.store import check_sqlite_url  # lazy: the tracking layer (~1.2 s) off the CLI's start-up

    url = url or default_storage_url()
    check_sqlite_url(url, "Optuna storage")
    journal = journal_path(url)
    if journal is not None:
        journal_file(journal, must_exist=must_exist, write=write)
        return f"journal://{journal}"
    db = sqlite_path(url, "Optuna storage")
    if db is not None:
        sqlite_file(db, "Optuna storage", "studies", must_exist=must_exist, write=write)
    else:
        _database(url, "Optuna storage")
    return url
