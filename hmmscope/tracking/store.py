"""The MLflow store: its URI, its database created once, its artifact root, and moving it.

Default store: a sqlite database `mlruns/mlflow.db` with artifacts under
`mlruns/artifacts/`, both relative to the working directory. `--tracking-uri` or
MLFLOW_TRACKING_URI override it; any MLflow URI works, an `http://127.0.0.1:PORT`
server included. The sqlite database is created once, under a file lock (the
`filelock` package: every platform), before any run is written (two processes
creating one new sqlite database at once can corrupt it), and atomically: created and
migrated under a temp name beside it, then renamed into place, so a failure (a full
disk) leaves no half-migrated store. A store that cannot be written (a read-only
mlruns/) is opened as it is, with no lock file: read-only commands work on it, and
`read_only_uri` opens any sqlite store so that nothing can be written or migrated
(`runs list/show/compare`, `api`). MLflow's HTTP client is bounded here (HTTP_RETRIES,
HTTP_TIMEOUT_S, through MLflow's environment settings).

Movable stores. MLflow records artifact locations as absolute file URIs (the
experiment's root `file:///A/mlruns/artifacts`, each run's `<root>/<run id>/artifacts`).
The layout is fixed relative to the database: an experiment hmmscope creates carries
the tag `hmmscope.artifact_root = "artifacts"` (relative to the database's folder).
When a process first opens a writable sqlite store (`ensure_store`) whose recorded roots
differ from `<folder of mlflow.db>/artifacts` (the folder was moved, copied or rsynced),
it rewrites the experiment's root and the prefix of its runs' artifact URIs, in one
transaction under the store's lock (`relocate`); untagged experiments (older stores)
are rewritten only when their root is an `.../artifacts` folder and the runs' artifact
folders are present beside the database. After that, `mlflow server` / `hmmscope ui`
serve the moved store as well. Reads and writes through `Run` also resolve a run's
artifact URI against the store's folder (`Run.artifact_uri`, in `runs`), so a store that could not
be rewritten (read-only) still reads its own artifacts, and a copy never writes into
the original.

Part of `tracking`, the one package that talks to MLflow. Imports mlflow and filelock only inside functions;
must not import the other tracking modules (they import this) or anything of hmmscope outside tracking.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlparse
from urllib.request import url2pathname

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no tqdm bars in our output
# MLflow's HTTP client, bounded (MLflow 3.17's defaults: 7 retries with backoff factor 2 and a 120 s timeout, i.e. over
# 200 s before a server answering 500 gives an error). Here: each request tried at most HTTP_RETRIES + 1 = 3 times,
# HTTP_TIMEOUT_S per try (connect, and each read), 0 s then 2 s (+ up to 0.5 s jitter) between tries: a server that
# answers 500 fails a call in about 3 s, one that accepts and never answers in about 65 s. The environment wins.
HTTP_RETRIES, HTTP_TIMEOUT_S = 2, 20
for _k, _v in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(HTTP_RETRIES), "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(HTTP_TIMEOUT_S)}.items():
    os.environ.setdefault(_k, _v)

STORE_DIR = Path("mlruns")
DB_NAME = "mlflow.db"
ARTIFACTS = "artifacts"  # the artifact root's folder, beside the database
ROOT_TAG = "hmmscope.artifact_root"
_READY: set[str] = set()  # sqlite stores opened (created, relocated) by this process
_EMPTY: list[bytes] = []  # the first new database this process migrated, as it was then (`_create`); memory only


def url_path_problem(path: str | Path) -> str | None:
    """Why `sqlite:///<path>` would not name `path` (SQLAlchemy cuts an sqlite URL's path at '?' and decodes its
    percent-escapes: in a folder `a%41b` that URL names `aAb`), or None when it names it exactly. Everything else
    (spaces, '#', '+', a '%' not followed by two hex digits, any letter) goes into the URL as it is."""
    s = str(path)
    if "?" in s:
        return "'?' (an sqlite URL ends its path there)"
    m = re.search(r"%[0-9A-Fa-f]{2}", s)
    if m:
        return f"{m.group()!r} (an sqlite URL decodes it to {unquote(m.group())!r})"
    return None


def sqlite_url(db: str | Path, what: str = "MLflow store") -> str:
    """`sqlite:///<absolute path of db>`; ValueError (one line, naming the path) when no sqlite URL names that path
    (`url_path_problem`): a store is never opened under a name that means another folder's."""
    path = Path(os.path.abspath(db))
    why = url_path_problem(path)
    if why is not None:
        raise ValueError(f"{what} {path}: its path holds {why}, so no sqlite URL names it (it would open another "
                         "folder's store); move the project to a folder whose path holds no '?' and no '%' followed "
                         "by two hex digits")
    return f"sqlite:///{path}"


def check_sqlite_url(url: str, what: str = "tracking URI") -> None:
    """ValueError (one line) for an sqlite URL whose path holds percent-escapes: SQLAlchemy decodes them, MLflow does
    not (it would create the folder the undecoded path names, and the two would disagree on the store); the message
    gives the URL with the path as it is. Other URLs, and SQLite's own `file:` URIs, pass."""
    if not url.lower().startswith("sqlite:///"):
        return
    raw = url[len("sqlite:///"):].split("?", 1)[0]
    if raw.startswith("file:") or unquote(raw) == raw:
        return
    esc = re.search(r"%[0-9A-Fa-f]{2}", raw)
    raise ValueError(f"{what} {url!r}: its path holds the escape {esc.group() if esc else '%'!r}, which SQLAlchemy "
                     f"decodes and MLflow does not; write the path as it is: sqlite:///{unquote(raw)}")


def default_tracking_uri() -> str:
    """The sqlite store under ./mlruns, as a URL (`sqlite_url`: ValueError where the working folder's path cannot
    be one)."""
    return sqlite_url((STORE_DIR / DB_NAME).resolve())


def resolve_uri(uri: str | None = None) -> str:
    """The explicit URI, else MLFLOW_TRACKING_URI, else the sqlite store under ./mlruns."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of sqlite:///PATH (its percent-escapes decoded, as SQLAlchemy does; `store_checks` refuses a
    URL whose path needs them), or of the read-only form `read_only_uri` writes."""
    if not uri.startswith("sqlite:///"):
        return None
    rest = uri[len("sqlite:///"):].split("?", 1)[0]
    if rest.startswith("file:"):  # SQLAlchemy decodes once, then SQLite decodes its own URI
        return Path(unquote(unquote(rest)[len("file:"):].split("?", 1)[0].split("#", 1)[0]))
    return Path(unquote(rest))


def read_only_uri(uri: str) -> str:
    """The URI that opens a sqlite store read-only (SQLite's `mode=ro`: MLflow can neither create nor migrate it,
    nor write a byte; `client` keeps MLflow from creating the folder such a URI would name if it were a path); any
    other URI as it is. Reads of runs and artifacts work on it as on `uri`. The path is quoted twice: SQLAlchemy
    decodes the URL once, SQLite its `file:` URI once more (so '#', '?', '%' and spaces in the path stay themselves)."""
    db = sqlite_path(uri)
    if db is None or uri[len("sqlite:///"):].startswith("file:"):
        return uri
    return f"sqlite:///file:{quote(quote(str(db.absolute()), safe='/'), safe='/')}?mode=ro&uri=true"


def server_uri(uri: str) -> str:
    """The URI a server process (`mlflow ui`) is given for a sqlite store: SQLite's `mode=rw` opens the database and
    never creates it (the server opens a new connection per request: with the plain URI, a store moved or deleted
    under a running `hmmscope ui` was created again, whole schema, at its old path), under the scheme
    `sqlite+pysqlite` (the same driver; MLflow's `_make_parent_dirs_if_sqlite` makes folders for `sqlite:///` only,
    and would take `file:/...` for a folder to create in the server's working folder). The path is quoted as
    `read_only_uri` quotes it. Any other URI as it is."""
    db = sqlite_path(uri)
    if db is None or uri[len("sqlite:///"):].startswith("file:"):
        return uri
    return f"sqlite+pysqlite:///file:{quote(quote(str(db.absolute()), safe='/'), safe='/')}?mode=rw&uri=true"


def _mlflow_creates_no_folder_for_sqlite_uris() -> None:
    """MLflow (3.17's `_make_parent_dirs_if_sqlite`) creates the parent folder of whatever follows `sqlite:///`, taken
    as a path: for the read-only form `sqlite:///file:/abs/...?mode=ro` that is a tree `./file:/abs/...` in the working
    folder (an error where it cannot be written). Here such an SQLite URI is never a folder to create; every other URL
    goes to MLflow's own function. Installed once, before any client is made."""
    import mlflow.store.db.utils as utils  # lazy: mlflow off the CLI's start-up

    make = utils._make_parent_dirs_if_sqlite
    if getattr(make, "hmmscope", False):
        return
    # MLflow logs every database error with its traceback at ERROR before it raises it (a full disk: dozens of lines
    # per write); the error itself reaches the caller, which says it in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    def make_parent_dirs(db_uri: str) -> None:
        if not db_uri.startswith("sqlite:///file:"):
            make(db_uri)

    make_parent_dirs.hmmscope = True  # type: ignore[attr-defined]
    utils._make_parent_dirs_if_sqlite = make_parent_dirs


def uri_path(file_uri: str) -> Path:
    """file:///a/b -> Path('/a/b') (percent-escapes decoded)."""
    return Path(url2pathname(unquote(urlparse(file_uri).path)))


def artifact_root(uri: str) -> str | None:
    """Artifacts sit beside a sqlite database (`<dir>/artifacts`); a server chooses its own."""
    db = sqlite_path(uri)
    return (db.parent / ARTIFACTS).resolve().as_uri() if db is not None else None


def writable(path: Path) -> bool:
    """Can this process write `path` (a file, or the folder that would hold it)?"""
    target = path if path.exists() else path.parent
    return os.access(target, os.W_OK) and (path.is_dir() or os.access(path.parent, os.W_OK))


def ensure_store(uri: str) -> None:
    """Create the backing database once, under a file lock, and relocate a moved store (no-op for servers).

    A new database (none, or an empty file) is created and migrated beside its final name, then renamed into place
    (`_create`): a failure half-way (a full disk) leaves no store, never a half-migrated one. A store that exists
    but cannot be written is used as it is (no lock file, no relocation).
    """
    import filelock  # lazy: filelock off the CLI's start-up

    db = sqlite_path(uri)
    if db is None or (uri in _READY and db.exists()):
        return
    check_sqlite_url(uri)
    if db.exists() and not writable(db):
        _READY.add(uri)
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(db.parent / ".init.lock")):
        if not db.exists() or db.stat().st_size == 0:
            for p in db.parent.glob(f".{db.name}.*.creating*"):  # a killed creation's (under the lock: none is live)
                if p.is_file() and not p.is_symlink():
                    p.unlink(missing_ok=True)
            _create(db)
        client(uri).search_experiments(max_results=1)  # checks the schema
        relocate(uri)
    _READY.add(uri)


def _create(db: Path) -> None:
    """A new MLflow database at `db`: created and migrated at `.<name>.<random>.creating` beside it, fsynced, renamed
    onto `db`. Any failure removes the temp file (and SQLite's journal of it) and raises; `db` is untouched.
    Call under the store's lock (`ensure_store`).

    MLflow migrates a new database through every schema revision (alembic: about 3 s of CPU). A process does that
    once: its later new stores start from a copy of the first (read once from the temp file it just migrated, then
    kept in memory; never from a cache or another store), with the one row that names a place and a time, the
    Default experiment, set for this store (tests/test_tracking.py: equal to a migrated one, row for row)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: mlflow off the CLI's start-up

    tmp = db.with_name(f".{db.name}.{secrets.token_hex(6)}.creating")
    tmp_uri = f"sqlite:///{tmp}"
    root = (db.parent / ARTIFACTS).resolve().as_uri()
    try:
        if _EMPTY:
            _from_empty(tmp, root)
        else:
            SqlAlchemyStore(tmp_uri, root)  # the schema, every migration
            _dispose(tmp_uri)  # closed before it is read
            _EMPTY.append(tmp.read_bytes())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, db)
        fd = os.open(db.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    except BaseException:
        for p in (tmp, tmp.with_name(tmp.name + "-journal")):
            p.unlink(missing_ok=True)
        raise
    finally:
        _dispose(tmp_uri)  # no pooled connection to the temp name


def _dispose(uri: str) -> None:
    """Close and forget MLflow's pooled engine for `uri`, if it has one."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: mlflow off the CLI's start-up

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()


def _from_empty(tmp: Path, root: str) -> None:
    """`_EMPTY[0]` written to `tmp` (a new database) by sqlite, as MLflow's migration writes (a full disk fails as it
    does: 'database or disk is full'), its Default experiment (id 0) rooted at `root` and created now, as MLflow
    creates it (`<root>/0`)."""
    from mlflow.utils.uri import append_to_uri_path  # lazy: mlflow off the CLI's start-up

    now = int(time.time() * 1000)
    mem, dst = sqlite3.connect(":memory:"), None
    try:
        mem.deserialize(_EMPTY[0])
        with mem:
            n = mem.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                            "WHERE experiment_id = 0", (append_to_uri_path(root, "0"), now, now)).rowcount
        if n != 1:
            raise RuntimeError(f"a new MLflow database has {n} Default experiments")
        dst = sqlite3.connect(str(tmp))
        mem.backup(dst)
    finally:
        mem.close()
        if dst is not None:
            dst.close()


def relocate(uri: str) -> list[tuple[str, str, str]]:
    """Point a moved sqlite store's recorded artifact roots at `<its folder>/artifacts` (see the docstring).

    Returns (experiment id, old root, new root) per rewritten experiment. Call under the store's lock
    (`ensure_store` does).
    """
    db = sqlite_path(uri)
    if db is None or not db.exists():
        return []
    root = (db.parent / ARTIFACTS).resolve()
    want = root.as_uri()
    done = []
    con = sqlite3.connect(str(db), timeout=120)
    try:
        with con:
            exps = con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
            tagged = {str(e) for (e,) in con.execute("SELECT experiment_id FROM experiment_tags WHERE key = ?",
                                                     (ROOT_TAG,))}
            for eid, loc in exps:
                if not loc or loc == want or not loc.startswith("file:") or uri_path(loc).name != ARTIFACTS:
                    continue
                run_ids = [r for (r,) in con.execute("SELECT run_uuid FROM runs WHERE experiment_id = ?", (eid,))]
                if str(eid) not in tagged and not any((root / r).is_dir() for r in run_ids):
                    continue  # not ours, or its artifacts did not travel with the database
                con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (want, eid))
                con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                            "WHERE experiment_id = ? AND substr(artifact_uri, 1, ?) = ?",
                            (want, len(loc) + 1, eid, len(loc) + 1, loc + "/"))
                done.append((str(eid), loc, want))
    finally:
        con.close()
    return done


class StoreMissing(ValueError):
    """A sqlite store that is not there (no file, or an empty one) was to be read: nothing is created (one line)."""


def client(uri: str):
    """MLflow's client on `uri`. A sqlite store must exist first: MLflow creates the whole schema (954 KB) in a missing
    or empty database file on the first call, so a read (`report` on a 0-byte mlflow.db, `ui` after its folder moved)
    would create a store. Here only `ensure_store` creates one (a write's first step); a missing or empty database
    raises StoreMissing, and nothing is written."""
    from mlflow.tracking import MlflowClient  # lazy: mlflow off the CLI's start-up

    db = sqlite_path(uri)
    if db is not None:
        try:
            size = db.stat().st_size
        except FileNotFoundError:
            raise StoreMissing(f"no MLflow store at {db} (nothing was recorded there; a read creates none)") from None
        except OSError:
            size = 1  # a path we cannot stat: MLflow's own error says why
        if size == 0:
            raise StoreMissing(f"no MLflow store in {db} (an empty file; a read creates none)")
    _mlflow_creates_no_folder_for_sqlite_uris()
    return MlflowClient(tracking_uri=uri)


def check_experiment_name(name: str) -> str:
    """`name` if MLflow takes it as an experiment name (1-200 printable characters, no leading or trailing space),
    else ValueError naming the rule (the rule of --experiment and of a sweep spec's sweep.experiment)."""
    if not name or len(name) > 200 or not name.isprintable() or name != name.strip():
        raise ValueError(f"--experiment {name!r}: give 1-200 printable characters (no leading/trailing spaces)")
    return name


def experiment_id(uri: str, name: str) -> str:
    """Get or create the experiment `name`, with artifacts beside a sqlite store."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        root = artifact_root(uri)
        tags = {"mlflow.experimentKind": "custom_model_development", **({ROOT_TAG: ARTIFACTS} if root else {})}
        return c.create_experiment(name, artifact_location=root, tags=tags)  # the kind: a training UI, not GenAI
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
