"""The one module that talks to MLflow.

Default store: a sqlite database `mlruns/mlflow.db` with artifacts under
`mlruns/artifacts/`, both relative to the working directory. `--tracking-uri` or
MLFLOW_TRACKING_URI override it; any MLflow URI works, an `http://127.0.0.1:PORT`
server included. The sqlite database is created once, under a file lock (the
`filelock` package: every platform), before any run is written (two processes
creating one new sqlite database at once can corrupt it). A store that cannot be
written (a read-only mlruns/) is opened as it is, with no lock file: read-only
commands work on it.

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
artifact URI against the store's folder (`Run.artifact_uri`), so a store that could not
be rewritten (read-only) still reads its own artifacts, and a copy never writes into
the original. A missing artifact's error names the path that was looked for.

Orphan runs. Every run records where it runs (tags `hmmscope.host`, `hmmscope.pid`,
`hmmscope.pid_start`, the process start time where the OS tells it) and beats: a thread
updates the tag `hmmscope.heartbeat` (unix seconds) every `hmmscope.heartbeat_interval`
seconds (env HMMSCOPE_RUN_HEARTBEAT_S, default 30) while the run is open. A RUNNING run
is stale (`stale_reason`) when its host is this host and its process is gone (or the pid
now belongs to another process), or, on another host, when its last heartbeat is older
than HEARTBEAT_GRACE heartbeat intervals. `gc_runs` marks stale runs KILLED with the tag
`hmmscope.failure_reason = "orphaned: <why>"` and the last heartbeat as end time; runs
without these tags (older stores) are never judged.

Runs that compare side by side. Every new run carries MLflow's standard tags: `mlflow.user`,
`mlflow.source.name` (the entry point, e.g. `hmmscope train` or `hmmscope.sweep worker`),
`mlflow.source.type` LOCAL, `mlflow.source.git.commit` (when the code is a git checkout) and, given a
`note`, `mlflow.note.content` (the run's one-line description, shown as its Description). A run logs
as params only the config sections of its kind (`config_params`: a training run hmm/data/model/train,
a theory run theory). Claims go into a logged table `claims.json` (`log_claims`: MLflow's
`log_table` format, listed in the tag `mlflow.loggedArtifacts`), one row per claim with its value,
CI, rule, verdict and reason, beside the `verdict/<name>` / `rule/<name>` tags report.py reads.
The MLflow UI lists a run's metrics in key order (JavaScript's default sort, i.e. code-unit order:
upper case before lower case), so a sweep trial's objective is also logged as
`Objective/<objective key>` (`objective_key`), which sorts before every lower-case metric key.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import math
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no tqdm bars in our output

STORE_DIR = Path("mlruns")
DB_NAME = "mlflow.db"
ARTIFACTS = "artifacts"  # the artifact root's folder, beside the database
ROOT_TAG = "hmmscope.artifact_root"
PARAM_MAX = 6000  # MLflow's limit on a param value's length
HEARTBEAT_ENV = "HMMSCOPE_RUN_HEARTBEAT_S"
HEARTBEAT_GRACE = 5  # heartbeat intervals without a beat before a run on another host counts as stale
_READY: set[str] = set()  # sqlite stores opened (created, relocated) by this process


def default_tracking_uri() -> str:
    return f"sqlite:///{(STORE_DIR / DB_NAME).resolve()}"


def resolve_uri(uri: str | None = None) -> str:
    """The explicit URI, else MLFLOW_TRACKING_URI, else the sqlite store under ./mlruns."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


def _uri_path(file_uri: str) -> Path:
    """file:///a/b -> Path('/a/b') (percent-escapes decoded)."""
    return Path(url2pathname(unquote(urlparse(file_uri).path)))


def artifact_root(uri: str) -> str | None:
    """Artifacts sit beside a sqlite database (`<dir>/artifacts`); a server chooses its own."""
    db = _sqlite_path(uri)
    return (db.parent / ARTIFACTS).resolve().as_uri() if db is not None else None


def writable(path: Path) -> bool:
    """Can this process write `path` (a file, or the folder that would hold it)?"""
    target = path if path.exists() else path.parent
    return os.access(target, os.W_OK) and (path.is_dir() or os.access(path.parent, os.W_OK))


def ensure_store(uri: str) -> None:
    """Create the backing database once, under a file lock, and relocate a moved store (no-op for servers).

    A store that exists but cannot be written is used as it is (no lock file, no relocation).
    """
    import filelock

    db = _sqlite_path(uri)
    if db is None or (uri in _READY and db.exists()):
        return
    if db.exists() and not writable(db):
        _READY.add(uri)
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(db.parent / ".init.lock")):
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # runs the schema migrations
        relocate(uri)
    _READY.add(uri)


def relocate(uri: str) -> list[tuple[str, str, str]]:
    """Point a moved sqlite store's recorded artifact roots at `<its folder>/artifacts` (see the docstring).

    Returns (experiment id, old root, new root) per rewritten experiment. Call under the store's lock
    (`ensure_store` does).
    """
    db = _sqlite_path(uri)
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
                if not loc or loc == want or not loc.startswith("file:") or _uri_path(loc).name != ARTIFACTS:
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


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(uri: str, name: str) -> str:
    """Get or create the experiment `name`, with artifacts beside a sqlite store."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        root = artifact_root(uri)
        return c.create_experiment(name, artifact_location=root, tags={ROOT_TAG: ARTIFACTS} if root else None)
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The code version: the commit of the git checkout this package runs from, if it runs from one.

    None for an installed copy (even one inside some other repository's folder, e.g. a venv in a project):
    the package folder must sit at the top of the checkout, as it does in hmmscope's own repository.
    """
    pkg = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=pkg)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != pkg.parent:
        return None
    return lines[1]


def source_name(argv: list[str] | None = None) -> str:
    """The entry point, for `mlflow.source.name`: `hmmscope <command ...>` for the CLI, `hmmscope.<module>
    <command>` for `python -m hmmscope.<module>`, else the program's file name (e.g. `pytest`)."""
    argv = list(sys.argv if argv is None else argv) or [""]
    prog = Path(argv[0])
    words = []
    for a in argv[1:3]:  # the (sub)command words, not options or paths
        if a.startswith("-") or "/" in a or "." in a:
            break
        words.append(a)
    pkg = Path(__file__).resolve().parent
    with contextlib.suppress(OSError):
        if prog.suffix == ".py" and pkg in prog.resolve().parents:  # a module, or a package's __main__
            module = ".".join(prog.resolve().relative_to(pkg.parent).with_suffix("").parts)
            return " ".join([module.removesuffix(".__main__"), *words])
    if prog.name == "hmmscope":
        return " ".join([prog.name, *words])
    return "python" if not prog.name or prog.name.startswith("-") else prog.name


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name (some containers)
        return "unknown"


def standard_tags(note: str | None = None) -> dict[str, str]:
    """MLflow's standard run tags (module docstring); the note is cut to its first line."""
    tags = {"mlflow.user": _user(), "mlflow.source.name": source_name(), "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if note:
        tags["mlflow.note.content"] = note_line(note)
    return tags


def note_line(note: str) -> str:
    """One line (newlines folded), at most 500 characters."""
    return " ".join(str(note).split())[:500]


TRAIN_SECTIONS, THEORY_SECTIONS = ("hmm", "data", "model", "train"), ("theory",)


def config_params(cfg: Any, sections: Iterable[str]) -> dict[str, Any]:
    """The flat config keys of `sections` (e.g. TRAIN_SECTIONS): the params of one run kind."""
    from .config import flatten

    keep = set(sections)
    return {k: v for k, v in flatten(cfg).items() if k.split(".", 1)[0] in keep}


def objective_key(objective: str) -> str:
    """The metric key that carries a sweep objective's value; it sorts first in the MLflow UI."""
    return safe_key(f"Objective/{objective}")


CLAIM_COLUMNS = ("claim", "value", "ci_lo", "ci_hi", "rule", "verdict", "reason", "statistic")


def claims_table(claims: Iterable[Any]) -> dict[str, list]:
    """stats.Claim objects -> columns (CLAIM_COLUMNS); non-finite numbers become None."""
    def num(v: Any) -> float | None:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        return f if math.isfinite(f) else None

    cols: dict[str, list] = {c: [] for c in CLAIM_COLUMNS}
    for c in claims:
        for col, v in (("claim", c.name), ("value", num(c.value)), ("ci_lo", num(c.ci_lo)), ("ci_hi", num(c.ci_hi)),
                       ("rule", c.rule or ""), ("verdict", c.verdict), ("reason", c.reason),
                       ("statistic", c.statistic)):
            cols[col].append(v)
    return cols


def safe_key(key: str) -> str:
    """MLflow keys allow only alphanumerics and _ - . space : /; anything else becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)[:250]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, tuple, dict, bool)) or v is None else str(v)
    return s[:PARAM_MAX]


class ArtifactNotFound(FileNotFoundError):
    """A run's artifact is not where the store says it is; the message names the path looked for."""


class Run:
    """A live MLflow run; every write goes through these methods."""

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self._client = client(uri)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(safe_key(k), _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite values only (MLflow stores NaN, but comparisons in the UI break on it)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(safe_key(k), float(v), ts, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for i in range(0, len(items), 500):
            self._client.log_batch(self.run_id, metrics=items[i:i + 500])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(safe_key(k), str(v)[:5000]) for k, v in tags.items()])

    def artifact_uri(self) -> str:
        """Where this run's artifacts are: the recorded URI, resolved against a sqlite store's own folder.

        A run recorded as `file://<old>/artifacts/<run id>/artifacts` in a store that now lives in another
        folder (moved, copied, read-only so not relocated) maps to `<store folder>/artifacts/<run id>/artifacts`.
        """
        recorded = self._client.get_run(self.run_id).info.artifact_uri
        db = _sqlite_path(self.uri)
        if db is None or not recorded.startswith("file:"):
            return recorded
        p = _uri_path(recorded)
        if p.name != "artifacts" or p.parent.name != self.run_id or p.parent.parent.name != ARTIFACTS:
            return recorded  # not the store's own layout: leave it alone
        here = (db.parent / ARTIFACTS).resolve() / self.run_id / "artifacts"
        return recorded if p == here else here.as_uri()

    def _local_root(self) -> tuple[str, Path | None]:
        loc = self.artifact_uri()
        return loc, (_uri_path(loc) if loc.startswith("file:") else None)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        loc, local = self._local_root()
        if local is None:
            self._client.log_artifact(self.run_id, str(path), artifact_path)
            return
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

        LocalArtifactRepository(loc).log_artifact(str(path), artifact_path)

    def log_dict(self, obj: Any, name: str) -> None:
        """Write `obj` as JSON (or text for .txt/.md/.csv names) to the artifact `name`."""
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(name).name
            p.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2, default=str))
            parent = str(Path(name).parent)
            self.log_artifact(p, None if parent == "." else parent)

    def log_table(self, columns: Mapping[str, list], name: str) -> None:
        """A table (equal-length columns) as the JSON artifact `name`, in `MlflowClient.log_table`'s format
        (pandas orient="split"), listed in the tag `mlflow.loggedArtifacts`; written again, it is replaced."""
        if not name.endswith(".json"):
            raise ValueError(f"table name must end in .json, got {name!r}")
        cols = list(columns)
        n = {len(v) for v in columns.values()}
        if len(n) > 1:
            raise ValueError(f"table {name}: columns of different lengths {sorted(n)}")
        rows = [list(r) for r in zip(*(columns[c] for c in cols))]
        self.log_dict({"columns": cols, "data": rows}, name)
        have = self.get().data.tags.get("mlflow.loggedArtifacts", "[]")
        try:
            logged = json.loads(have)
        except ValueError:
            logged = []
        entry = {"path": name, "type": "table"}
        if entry not in logged:
            self.set_tags({"mlflow.loggedArtifacts": json.dumps([*logged, entry])})

    def log_claims(self, claims: Iterable[Any], name: str = "claims.json") -> None:
        """The claims as a logged table (`claims_table` columns); nothing for no claims."""
        claims = list(claims)
        if claims:
            self.log_table(claims_table(claims), name)

    def get(self):
        """The run as MLflow returns it (info, data.params, data.metrics, data.tags)."""
        return self._client.get_run(self.run_id)

    def require(self, artifact_path: str) -> str:
        """The artifact's location if it exists; ArtifactNotFound naming the path looked for if not."""
        loc, local = self._local_root()
        if local is not None:
            if not (local / artifact_path).exists():
                raise ArtifactNotFound(f"run {self.run_id}: artifact {artifact_path} not found "
                                       f"(looked for {local / artifact_path})")
            return str(local / artifact_path)
        parent, _, name = artifact_path.rpartition("/")
        try:
            names = {f.path for f in self._client.list_artifacts(self.run_id, parent or None)}
        except Exception as e:
            raise ArtifactNotFound(f"run {self.run_id}: artifact {artifact_path} not readable at "
                                   f"{loc}/{artifact_path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        if artifact_path not in names:
            raise ArtifactNotFound(f"run {self.run_id}: artifact {artifact_path} not found (looked for {loc}/{artifact_path})")
        return f"{loc}/{artifact_path}"

    def download(self, artifact_path: str, dst: str | Path) -> Path:
        """Copy the artifact into the folder `dst` (created if missing); returns the local copy's path."""
        Path(dst).mkdir(parents=True, exist_ok=True)
        loc, local = self._local_root()
        if local is None:
            return Path(self._client.download_artifacts(self.run_id, artifact_path, str(dst)))
        self.require(artifact_path)
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

        return Path(LocalArtifactRepository(loc).download_artifacts(artifact_path, str(dst)))


def existing_run(uri: str, run_id: str) -> Run:
    """A handle to log more into an existing run, its status untouched; ValueError if unknown."""
    ensure_store(uri)
    try:
        client(uri).get_run(run_id)
    except Exception:
        raise ValueError(f"unknown MLflow run id {run_id!r} in {uri}") from None
    return Run(uri, run_id)


def experiment_name(uri: str, run_id: str) -> str:
    """The name of the experiment holding run_id."""
    c = client(uri)
    return c.get_experiment(c.get_run(run_id).info.experiment_id).name


def heartbeat_interval() -> float:
    """Seconds between a run's heartbeats (env HMMSCOPE_RUN_HEARTBEAT_S, default 30)."""
    try:
        v = float(os.environ.get(HEARTBEAT_ENV, "30"))
    except ValueError:
        v = 30.0
    return v if math.isfinite(v) and v > 0 else 30.0


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


def _liveness_tags(interval: float) -> dict[str, str]:
    pid = os.getpid()
    return {"hmmscope.host": socket.gethostname(), "hmmscope.pid": str(pid), "hmmscope.pid_start": _proc_start(pid) or "",
            "hmmscope.heartbeat": f"{time.time():.0f}", "hmmscope.heartbeat_interval": f"{interval:g}"}


@contextlib.contextmanager
def _beating(run: Run, interval: float) -> Iterator[None]:
    """Update the run's heartbeat tag every `interval` seconds until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        c = client(run.uri)
        while not stop.wait(interval):
            with contextlib.suppress(Exception):
                c.set_tag(run.run_id, "hmmscope.heartbeat", f"{time.time():.0f}")

    th = threading.Thread(target=beat, daemon=True, name=f"mlflow-heartbeat-{run.run_id[:8]}")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


@contextlib.contextmanager
def start_run(uri: str, experiment: str, name: str, *, parent: Run | str | None = None,
              params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
              resume: str | None = None, note: str | None = None) -> Iterator[Run]:
    """Open a run (nested under `parent` if given), or reopen run `resume` (its status goes back to RUNNING).

    A new run gets MLflow's standard tags (`standard_tags`; `note` is its one-line description, and `tags`
    may override any of them). Reopening keeps the run's tags, except the note when one is given.

    The run ends FINISHED, or FAILED/KILLED with the reason in the tag `hmmscope.failure_reason`.
    While it is open it carries this process's host and pid and a heartbeat (module docstring).
    """
    ensure_store(uri)
    c = client(uri)
    interval = heartbeat_interval()
    if resume is not None:
        run = existing_run(uri, resume)
        c.update_run(resume, status="RUNNING")
        run.set_tags({**_liveness_tags(interval), **({"mlflow.note.content": note_line(note)} if note else {})})
    else:
        std = standard_tags(note)
        all_tags = {"hmmscope.code_version": std.get("mlflow.source.git.commit", "unknown"), **std, **(tags or {}),
                    **_liveness_tags(interval)}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id if isinstance(parent, Run) else parent
        r = c.create_run(experiment_id(uri, experiment), run_name=name,
                         tags={safe_key(k): str(v)[:5000] for k, v in all_tags.items()})
        run = Run(uri, r.info.run_id)
    try:
        with _beating(run, interval):
            if params:
                run.log_params(params)
            yield run
    except BaseException as e:
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
        with contextlib.suppress(Exception):
            run.set_tags({"hmmscope.failure_reason": f"{type(e).__name__}: {e}"})
        with contextlib.suppress(Exception):
            c.set_terminated(run.run_id, status)
        raise
    else:
        c.set_terminated(run.run_id, "FINISHED")


def delete_run(uri: str, run_id: str) -> None:
    """Soft-delete a run (MLflow's deleted lifecycle stage: searches no longer return it)."""
    client(uri).delete_run(run_id)


# ---------------------------------------------------------------- orphan runs


def stale_reason(run, *, now: float | None = None, host: str | None = None) -> str | None:
    """Why the RUNNING run `run` (as MLflow returns it) is an orphan, or None if it is not (or cannot be told)."""
    if run.info.status != "RUNNING":
        return None
    t = run.data.tags
    pid, where = t.get("hmmscope.pid", ""), t.get("hmmscope.host", "")
    if pid.isdigit() and where == (host or socket.gethostname()):
        if not _alive(int(pid), t.get("hmmscope.pid_start") or None):
            return f"its process {pid} on {where} is gone"
        return None
    try:
        last, every = float(t["hmmscope.heartbeat"]), float(t["hmmscope.heartbeat_interval"])
    except (KeyError, ValueError):
        return None
    age = (time.time() if now is None else now) - last
    if age > HEARTBEAT_GRACE * every:
        return f"no heartbeat for {age:.0f} s (one every {every:g} s expected; process {pid or '?'} on {where or '?'})"
    return None


def gc_runs(uri: str, *, experiments: list[str] | None = None, dry_run: bool = False,
            now: float | None = None) -> list[tuple[Any, str]]:
    """Find orphan RUNNING runs (`stale_reason`) and, unless `dry_run`, mark them KILLED with the reason.

    `experiments`: names to search (default: every experiment). Returns (run, reason) per orphan.
    """
    from mlflow.entities import ViewType

    db = _sqlite_path(uri)
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
    for r in search_runs(uri, experiment_ids=ids, filter_string="attributes.status = 'RUNNING'"):
        why = stale_reason(r, now=now)
        if why is not None:
            found.append((r, why))
    if not dry_run:
        for r, why in found:
            if c.get_run(r.info.run_id).info.status != "RUNNING":  # ended meanwhile
                continue
            end = None
            with contextlib.suppress(KeyError, ValueError):
                end = int(float(r.data.tags["hmmscope.heartbeat"]) * 1000)
            c.set_tag(r.info.run_id, "hmmscope.failure_reason", f"orphaned: {why}")
            c.set_terminated(r.info.run_id, "KILLED", end_time=end)
    return found


UI_PORT = 5000  # `hmmscope ui`'s default port


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI: on the server itself for an http(s) store, else on `hmmscope ui` at its
    default address (http://127.0.0.1:5000), which serves the local store."""
    base = f"http://127.0.0.1:{UI_PORT}"
    if uri.startswith(("http://", "https://")):
        base = re.sub(r"//[^/@]*@", "//", uri.rstrip("/"))  # never a password
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def ui_command(uri: str, port: int = UI_PORT) -> str:
    """The shell command that opens the MLflow UI on this store."""
    extra = ""
    root = artifact_root(uri)
    if root:
        extra = f" --default-artifact-root {root}"
    return f"mlflow ui --backend-store-uri {uri}{extra} --host 127.0.0.1 --port {port}"


# ---------------------------------------------------------------- read helpers (reports)


def search_runs(uri: str, experiment: str | None = None, *, filter_string: str = "",
                parent_id: str | None = None, experiment_ids: list[str] | None = None) -> list:
    """Runs as MLflow returns them (all pages), newest first (active runs only).

    `experiment` (a name) or `experiment_ids` narrow the search (default: every experiment);
    `parent_id` keeps the direct children of that run; `filter_string` is MLflow's search syntax.
    """
    from mlflow.entities import ViewType

    c = client(uri)
    if experiment_ids is None:
        if experiment is not None:
            exp = c.get_experiment_by_name(experiment)
            if exp is None:
                return []
            experiment_ids = [exp.experiment_id]
        else:
            experiment_ids = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ALL)]
    if not experiment_ids:
        return []
    filters = [f for f in (filter_string.strip(),
                           f"tags.mlflow.parentRunId = '{parent_id}'" if parent_id else "") if f]
    out, token = [], None
    while True:
        page = c.search_runs(experiment_ids, " and ".join(filters), run_view_type=ViewType.ACTIVE_ONLY,
                             max_results=1000, order_by=["attributes.start_time DESC"], page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def get_run(uri: str, run_id: str):
    """The run as MLflow returns it, or None if there is no such run."""
    try:
        return client(uri).get_run(run_id)
    except Exception:
        return None
