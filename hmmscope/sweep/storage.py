"""Optuna storages of sweeps: which URLs name one, opening one, creating its schema once.

Owns the storage URL forms and the storage objects behind them. Imports neither MLflow nor torch, nor the
other sweep modules (tracking only for `writable` and `sqlite_url`); Optuna and filelock. Only the sweep commands
import it (`store_checks` lazily, for `journal_path`), and they all open a storage.

Three kinds of storage (`storage_kind`), each run through the same trial protocol (protocol.py):

- "sqlite": `sqlite:///PATH` (default: sqlite:///<cwd>/mlruns/optuna.db). One machine: SQLite's file locks
  break on NFS, so processes on several machines must not share one.
- "postgresql": `postgresql[+driver]://USER@HOST/DB`, for several machines (GPU boxes) sharing one study.
- "journal": Optuna's JournalStorage with its file backend (`JournalStorage(JournalFileBackend(path))`,
  Optuna >= 4; Optuna 3 called the backend JournalFileStorage): an append-only log of operations, each
  appended under Optuna's NFS-safe symlink lock, for a shared filesystem with no database server. The
  URL is `journal:///ABSOLUTE/PATH` (the file-URI convention: three slashes, then the absolute path), or a
  bare filesystem path that ends in `.log` or `.journal` (relative to the working directory), which
  `storage_url` turns into the journal:/// form; studies and parent-run tags record that form. Give
  optuna-dashboard the file path itself (`dashboard_storage`): it takes a plain path to a journal file.

Any other SQLAlchemy URL (MySQL, ...) is refused by `storage_kind` with a ConfigError: the trial protocol
has a mutex for the three kinds above only (see protocol.py), and nothing else is tested here.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path
from typing import Any

import filelock
import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages.journal import JournalFileBackend

from .. import env
from ..config import ConfigError
from ..tracking import writable
from ..tracking.store import sqlite_url

# libpq's bounds on one PostgreSQL connection (psycopg2 passes them through): a connection attempt gives up after
# 10 s, and a connection whose server stops answering (its host cut off) is dropped after 30 s without an ACK
# (tcp_user_timeout), or, idle, after 3 unanswered keepalives (from 10 s, 5 s apart): never left waiting for TCP's
# own 15 minutes; the worker
# then retries with a new connection (worker.STORE_OUTAGE_S)
PG_CONNECT_ARGS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                   "keepalives_count": 3, "tcp_user_timeout": 30000}


STORE_OUTAGE_S = env.STORE_OUTAGE_S.default  # how long a worker waits for its storage to answer again (env.STORE_OUTAGE_S)
STORE_OUTAGE_RANGE = (env.STORE_OUTAGE_S.lo, env.STORE_OUTAGE_S.hi)  # 0: give up at the first transient error; a day at most


def outage_limit() -> float:
    """Seconds a sweep worker waits out a storage that does not answer (env HMMSCOPE_STORE_OUTAGE_S, default 900, in
    STORE_OUTAGE_RANGE; ValueError outside it: nan or inf made the wait unbounded)."""
    return env.STORE_OUTAGE_S.read()


def pg_connect_args(url: str) -> dict[str, Any]:
    """PG_CONNECT_ARGS for a libpq driver (psycopg2, the default, or psycopg); {} for any other (pg8000 takes none)."""
    scheme = url.split("://", 1)[0].lower()
    driver = scheme.split("+", 1)[1] if "+" in scheme else "psycopg2"
    return dict(PG_CONNECT_ARGS) if driver in ("psycopg2", "psycopg") else {}


JOURNAL_SCHEME = "journal:"
JOURNAL_SUFFIXES = (".log", ".journal")
KINDS = ("sqlite", "postgresql", "journal")


def journal_path(url: str) -> Path | None:
    """The journal file a storage URL names (module docstring), or None for a database URL.

    ConfigError for a journal: URL that is not journal:///ABSOLUTE/PATH."""
    if url.lower().startswith(JOURNAL_SCHEME):
        rest = url[len(JOURNAL_SCHEME):]
        if not rest.startswith("///") or len(rest) == 3:
            raise ConfigError(f"Optuna storage {url!r}: a journal storage is journal:///ABSOLUTE/PATH "
                              "(or a path ending in .log or .journal)")
        return Path(rest[2:])
    if "://" not in url and url.lower().endswith(JOURNAL_SUFFIXES):
        return Path(url).absolute()
    return None


def storage_url(url: str) -> str:
    """The canonical form of a storage URL: journal:///ABSOLUTE/PATH for a journal, else `url` unchanged."""
    jp = journal_path(url)
    return url if jp is None else f"journal://{jp}"


def dashboard_storage(url: str) -> str:
    """What optuna-dashboard takes for this storage: the file path of a journal, else the URL itself."""
    jp = journal_path(url)
    return url if jp is None else str(jp)


def storage_kind(url: str) -> str:
    """"sqlite", "postgresql" or "journal"; ConfigError for any other storage (module docstring)."""
    if journal_path(url) is not None:
        return "journal"
    if url.lower().startswith("sqlite:"):
        return "sqlite"
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    raise ConfigError(f"Optuna storage {safe_url(url)!r}: sweeps run on sqlite:///FILE, postgresql://USER@HOST/DB "
                      "or a journal file (journal:///ABSOLUTE/PATH or a path ending in .log or .journal)")


def safe_url(url: str) -> str:
    """A storage URL without its password."""
    return re.sub(r"//([^:/@]+):[^/]*@", r"//\1:***@", url)  # up to the authority's last @ (a password may hold @)


def default_storage() -> str:
    """sqlite:///<cwd>/mlruns/optuna.db, its schema created once under a file lock."""
    url = sqlite_url((Path("mlruns") / "optuna.db").resolve(), "Optuna storage")  # ValueError: no URL names it
    ensure_storage(url)
    return url


def ensure_storage(url: str) -> None:
    """Create the storage once: the Optuna schema of a database (sqlite: under a file lock beside the
    database; an existing database that cannot be written is left as it is, with no lock file), or an
    empty journal file (and its folder)."""
    jp = journal_path(url)
    if jp is not None:
        jp.parent.mkdir(parents=True, exist_ok=True)
        open_storage(url)
        return
    if not url.startswith("sqlite:///"):
        open_storage(url)
        return

    db = Path(url[len("sqlite:///"):])
    if db.exists() and not writable(db):
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(db.parent / ".optuna.lock")):
        open_storage(url)


def open_storage(url: str, spec: Any = None, *, create: bool = True):
    """The Optuna storage behind `url`: RDBStorage (with the spec's heartbeat settings when a spec is given),
    or JournalStorage on a journal file. A journal file that does not exist is created only if `create`;
    otherwise ConfigError (so that reading a study never writes a file)."""
    jp = journal_path(url)
    if jp is not None:
        if not create and not jp.is_file():
            raise ConfigError(f"no journal storage at {jp}")
        return optuna.storages.JournalStorage(JournalFileBackend(str(jp)))
    kw: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kw["engine_kwargs"] = {"connect_args": {"timeout": 120}}
    elif storage_kind(url) == "postgresql":
        kw["engine_kwargs"] = {"connect_args": pg_connect_args(url), "pool_pre_ping": True}
    if spec is not None:  # the heartbeat of RDB storages (protocol.py); journals beat through a trial attr
        kw.update(heartbeat_interval=spec.heartbeat_interval, grace_period=spec.grace_period)
    return optuna.storages.RDBStorage(url, **kw)


def quiet_optuna() -> None:
    """Optuna's INFO lines and experimental-feature warnings (heartbeats) off."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", module="optuna")
    with contextlib.suppress(Exception):
        warnings.filterwarnings("ignore", category=ExperimentalWarning)
