"""The one module that talks to MLflow.

Default store: a sqlite database `mlruns/mlflow.db` with artifacts under
`mlruns/artifacts/`, both relative to the working directory. `--tracking-uri` or
MLFLOW_TRACKING_URI override it; any MLflow URI works, an `http://127.0.0.1:PORT`
server included. The sqlite database is created once, under a file lock, before
any run is written (two processes creating one new sqlite database at once can
corrupt it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no tqdm bars in our output

STORE_DIR = Path("mlruns")
DB_NAME = "mlflow.db"
PARAM_MAX = 6000  # MLflow's limit on a param value's length


def default_tracking_uri() -> str:
    return f"sqlite:///{(STORE_DIR / DB_NAME).resolve()}"


def resolve_uri(uri: str | None = None) -> str:
    """The explicit URI, else MLFLOW_TRACKING_URI, else the sqlite store under ./mlruns."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


def artifact_root(uri: str) -> str | None:
    """Artifacts sit beside a sqlite database (`<dir>/artifacts`); a server chooses its own."""
    db = _sqlite_path(uri)
    return (db.parent / "artifacts").resolve().as_uri() if db is not None else None


def ensure_store(uri: str) -> None:
    """Create the backing database once, under an exclusive file lock (no-op for servers)."""
    db = _sqlite_path(uri)
    if db is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # runs the schema migrations
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
        return c.create_experiment(name, artifact_location=artifact_root(uri))
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def git_commit() -> str | None:
    """The code version: the git commit of the working tree, if any."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def safe_key(key: str) -> str:
    """MLflow keys allow only alphanumerics and _ - . space : /; anything else becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)[:250]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, tuple, dict, bool)) or v is None else str(v)
    return s[:PARAM_MAX]


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
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(safe_key(k), float(v), ts, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for i in range(0, len(items), 500):
            self._client.log_batch(self.run_id, metrics=items[i:i + 500])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(safe_key(k), str(v)[:5000]) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dict(self, obj: Any, name: str) -> None:
        """Write `obj` as JSON (or text for .txt/.md/.csv names) to the artifact `name`."""
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(name).name
            p.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2, default=str))
            parent = str(Path(name).parent)
            self.log_artifact(p, None if parent == "." else parent)

    def get(self):
        """The run as MLflow returns it (info, data.params, data.metrics, data.tags)."""
        return self._client.get_run(self.run_id)

    def download(self, artifact_path: str, dst: str | Path) -> Path:
        return Path(self._client.download_artifacts(self.run_id, artifact_path, str(dst)))


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


@contextlib.contextmanager
def start_run(uri: str, experiment: str, name: str, *, parent: Run | str | None = None,
              params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
              resume: str | None = None) -> Iterator[Run]:
    """Open a run (nested under `parent` if given), or reopen run `resume` (its status goes back to RUNNING).

    The run ends FINISHED, or FAILED/KILLED with the reason in the tag `hmmscope.failure_reason`.
    """
    ensure_store(uri)
    c = client(uri)
    if resume is not None:
        run = existing_run(uri, resume)
        c.update_run(resume, status="RUNNING")
    else:
        all_tags = {"hmmscope.code_version": git_commit() or "unknown", **(tags or {})}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id if isinstance(parent, Run) else parent
        r = c.create_run(experiment_id(uri, experiment), run_name=name,
                         tags={k: str(v) for k, v in all_tags.items()})
        run = Run(uri, r.info.run_id)
    try:
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


def ui_command(uri: str, port: int = 5000) -> str:
    """The shell command that opens the MLflow UI on this store."""
    extra = ""
    root = artifact_root(uri)
    if root:
        extra = f" --default-artifact-root {root}"
    return f"mlflow ui --backend-store-uri {uri}{extra} --host 127.0.0.1 --port {port}"


# ---------------------------------------------------------------- read helpers (reports)


def search_runs(uri: str, experiment: str | None = None, *, filter_string: str = "",
                parent_id: str | None = None, experiment_ids: list[str] | None = None) -> list:
    """Runs as MLflow returns them (all pages), newest first.

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
