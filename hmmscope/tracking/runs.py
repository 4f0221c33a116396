"""Runs: opening and ending one (`start_run`), and the `Run` handle every write goes through.

A run ends FINISHED, or FAILED/KILLED with the reason in the tag `hmmscope.failure_reason`; while it is open it
carries this process's host and pid and a heartbeat (`liveness`). Params, metrics (finite values only), tags
(made MLflow-safe, `tags.safe_key`), artifacts, JSON and tables are written through `Run`, which resolves a
run's artifact URI against the store's own folder (`store`: a moved or copied store reads and writes its own
artifacts); a missing artifact's error names the path that was looked for.
A run that finishes (a resume that completes an interrupted one) drops any failure reason and its lease
(`liveness.clear_finished`).

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store, tags and liveness modules (and `safe_output` for local artifacts), and must not import search or anything
else of hmmscope outside tracking.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .leftovers import run_temp_dir
from .liveness import (
    LeaseLost,
    beating,
    clear_finished,
    end_run,
    heartbeat_interval,
    hold,
    liveness_tags,
    lost,
    nonce_of,
)
from .store import ARTIFACTS, client, ensure_store, experiment_id, sqlite_path, uri_path
from .tags import claim_headline, claims_table, note_line, param_value, safe_key, standard_tags


class ArtifactNotFound(FileNotFoundError):
    """A run's artifact is not where the store says it is; the message names the path looked for."""


class Run:
    """A live MLflow run; every write goes through these methods."""

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self._client = client(uri)
        self._stored: dict[str, int] = {}  # key -> last step already stored past a resume's checkpoint (a server)

    def _guard(self) -> None:
        """LeaseLost if another process took this run over (this process's lease had expired): it writes no more."""
        why = lost(self.uri, self.run_id)
        if why is not None:
            raise LeaseLost(f"run {self.run_id}: {why}; this process stops writing to it")

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        self._guard()
        items = [Param(safe_key(k), param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite values only (MLflow stores NaN, but comparisons in the UI break on it)."""
        self.log_metric_steps([(metrics, step)])

    def log_metric_steps(self, rows: Sequence[tuple[Mapping[str, float], int]]) -> None:
        """Several steps' metrics, (metrics, step) per row, in as few writes as MLflow's batch limit allows; finite
        values only."""
        from mlflow.entities import Metric

        self._guard()
        ts = int(time.time() * 1000)
        items = [Metric(safe_key(k), float(v), ts, int(step)) for metrics, step in rows for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v)) and int(step) > self._stored.get(safe_key(k), -1)]
        for i in range(0, len(items), 500):
            self._client.log_batch(self.run_id, metrics=items[i:i + 500])

    def forget_metrics(self, after: int, keys: Iterable[str] | None = None) -> int:
        """Each step stored once after a resume: the checkpoint it continues from is the truth, so what a killed
        writer logged past it (train/* rows written in batches, an evaluation, the final metrics) goes, and the
        resume logs those steps again. Call it holding the run's lease (a resume's `start_run`), before logging.

        Removes this run's metric rows at steps > `after`, of `keys` (names, or prefixes ending in '/'; None: every
        key but MLflow's system/* metrics, whose step counts samples, not training steps). On a database store
        (sqlite, PostgreSQL, ...) in one transaction, with MLflow's latest value of each key recomputed by its own
        rule (largest step, then timestamp, then value): sqlite's atomic commit leaves all or none of it. MLflow's
        REST API removes no metric row: on a server the rows stay, and this handle skips later writes of those keys
        at steps up to the last one stored (still one row per step; the first writer's values). Returns the rows
        removed (or found, on a server)."""
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        def wanted(k: str) -> bool:
            if keys is None:
                return not k.startswith("system/")
            return any(k == w or (w.endswith("/") and k.startswith(w)) for w in keys)

        self._guard()
        store = self._client._tracking_client.store
        if not isinstance(store, SqlAlchemyStore):
            n = 0
            for k in filter(wanted, self.get().data.metrics):
                steps = [m.step for m in self._client.get_metric_history(self.run_id, k) if m.step > after]
                if steps:
                    self._stored[k], n = max(steps), n + len(steps)
            return n
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

        with store.ManagedSessionMaker(read_only=False) as session:  # one transaction: committed at its end
            past = session.query(SqlMetric).filter(SqlMetric.run_uuid == self.run_id, SqlMetric.step > after)
            gone = sorted(k for (k,) in past.with_entities(SqlMetric.key).distinct() if wanted(k))
            n = 0
            for k in gone:
                n += past.filter(SqlMetric.key == k).delete(synchronize_session=False)
                session.query(SqlLatestMetric).filter(SqlLatestMetric.run_uuid == self.run_id,
                                                      SqlLatestMetric.key == k).delete(synchronize_session=False)
                m = (session.query(SqlMetric).filter(SqlMetric.run_uuid == self.run_id, SqlMetric.key == k)
                     .order_by(SqlMetric.step.desc(), SqlMetric.timestamp.desc(), SqlMetric.value.desc()).first())
                if m is not None:
                    session.add(SqlLatestMetric(run_uuid=self.run_id, key=k, value=m.value, timestamp=m.timestamp,
                                                step=m.step, is_nan=m.is_nan))
        return n

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._guard()
        self._client.log_batch(self.run_id, tags=[RunTag(safe_key(k), (param_value(v) if isinstance(v, float) else
                                                                        str(v))[:5000]) for k, v in tags.items()])

    def artifact_uri(self) -> str:
        """Where this run's artifacts are: the recorded URI, resolved against a sqlite store's own folder.

        A run recorded as `file://<old>/artifacts/<run id>/artifacts` in a store that now lives in another
        folder (moved, copied, read-only so not relocated) maps to `<store folder>/artifacts/<run id>/artifacts`.
        """
        recorded = self._client.get_run(self.run_id).info.artifact_uri
        db = sqlite_path(self.uri)
        if db is None or not recorded.startswith("file:"):
            return recorded
        p = uri_path(recorded)
        if p.name != "artifacts" or p.parent.name != self.run_id or p.parent.parent.name != ARTIFACTS:
            return recorded  # not the store's own layout: leave it alone
        # not resolved: a link on the way (mlruns/artifacts -> elsewhere) stays visible to the writes' checks
        here = Path(os.path.abspath(db.parent / ARTIFACTS)) / self.run_id / "artifacts"
        return recorded if p == here else here.as_uri()

    def _local_root(self) -> tuple[str, Path | None]:
        loc = self.artifact_uri()
        return loc, (uri_path(loc) if loc.startswith("file:") else None)

    def _write_root(self, local: Path) -> Path:
        """The folder a local artifact write must stay inside: a sqlite store's own folder when the artifacts lie
        under it (so `mlruns/artifacts`, or any folder on the way, linked out of it is refused, as out/ is), else the
        run's artifact folder itself."""
        db = sqlite_path(self.uri)
        if db is not None:
            folder = Path(os.path.abspath(db.parent))
            if folder == Path(os.path.abspath(local)) or folder in Path(os.path.abspath(local)).parents:
                return folder
        return local

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._guard()
        loc, local = self._local_root()
        if local is None:
            self._client.log_artifact(self.run_id, str(path), artifact_path)
            return
        # a local store: copied beside its final name, fsynced, renamed (safe_output; MLflow's own copy writes in
        # place): a full disk leaves the artifact's previous version (a complete checkpoint), never half a file
        from ..safe_output import write_with

        name = Path(path).name
        write_with(local / artifact_path / name if artifact_path else local / name,
                   lambda tmp: shutil.copyfile(path, tmp), root=self._write_root(local))

    @contextlib.contextmanager
    def artifact_file(self, name: str) -> Iterator[Path]:
        """A path to write the artifact `name` (e.g. "checkpoints/last.pt") to, by a library that writes by path
        (torch.save): on a local store a temp file beside its destination, renamed onto it at the end (one write, no
        copy; a writer killed mid-write leaves a `.<name>.<hex>.tmp` that `leftovers` finds); on a server a file in a
        TMPDIR folder named after the run (`leftovers.run_temp_dir`), logged at the end."""
        self._guard()
        loc, local = self._local_root()
        if local is not None:
            from ..safe_output import atomic_path

            with atomic_path(local / name, root=self._write_root(local)) as tmp:
                yield tmp
            return
        with run_temp_dir(self.run_id) as tmp:
            p = Path(tmp) / Path(name).name
            yield p
            parent = str(Path(name).parent)
            self.log_artifact(p, None if parent == "." else parent)

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
        """The claims as ONE logged table (`claims_table` columns) and their headline numbers (`claims`
        module: claims/n, claims/<verdict>, the tag hmmscope.claims); nothing for no claims."""
        claims = list(claims)
        if claims:
            self.log_table(claims_table(claims), name)
            metrics, tags = claim_headline(claims)
            self.log_metrics(metrics)
            self.set_tags(tags)

    def log_dataset(self, name: str, digest: str, context: str, source: str, profile: Mapping[str, Any]) -> None:
        """A dataset input of this run (MLflow's `log_input`: the run page's Datasets, the runs table's Dataset
        column): its name, content hash as the digest, what it was used for (`context`: train, eval, ...), where
        it comes from (`source`: e.g. the config that generates it) and a small profile (counts, shapes)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        ds = Dataset(name=name, digest=digest[:36], source_type="code", source=json.dumps({"generator": source}),
                     profile=json.dumps(dict(profile), default=str))
        self._client.log_inputs(self.run_id, [DatasetInput(ds, [InputTag("mlflow.data.context", context)])])

    def log_model(self, model: Any, name: str = "model", *, params: Mapping[str, Any] | None = None,
                  step: int = 0) -> str:
        """`model` (a torch module) as an MLflow logged model of this run's experiment, linked to this run as its
        output at `step` (MLflow 3's LoggedModel: the run page's Logged models, the experiment's Models tab;
        load it with `mlflow.pytorch.load_model("models:/<id>")` where hmmscope is installed); returns its id.

        The LoggedModel is created here, in the run's own experiment (MLflow's log_model alone would put it in
        the active, i.e. default, experiment), with `params` (e.g. the model.* config) on it. Serialized as a
        pickled module (serialization_format "pickle": MLflow 3.17's default "pt2" traces the graph and needs a
        TensorSpec signature, which token ids do not give); pip requirements are stated (this torch and numpy),
        not inferred (inference loads the model in a subprocess: seconds). A pickled module runs code when loaded:
        load only models of stores you trust (MLflow's own warning, silenced here). A failure marks the model
        FAILED and raises. The run's state-dict checkpoints stay what training resumes from.
        """
        import logging

        import mlflow.pytorch
        import numpy
        import torch
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        exp = self.get().info.experiment_id
        self._guard()
        lm = self._client.create_logged_model(exp, name=name, source_run_id=self.run_id, model_type="pytorch",
                                              params={safe_key(k): param_value(v) for k, v in (params or {}).items()})
        reqs = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={numpy.__version__}"]
        quiet = logging.getLogger("mlflow.pytorch")  # its warning about pickle: said in this docstring instead
        level, quiet.level = quiet.level, logging.ERROR
        try:
            loc = getattr(lm, "artifact_location", None) or ""
            if loc.startswith("file:"):  # MLflow writes the model's files there itself: no link out of the store
                from ..safe_output import PROBE, check_dest

                check_dest(uri_path(loc) / PROBE, root=self._write_root(uri_path(loc)))
            with _use_tracking_uri(self.uri):
                mlflow.pytorch.log_model(model, name=name, model_id=lm.model_id, run_id=self.run_id, step=step,
                                         pip_requirements=reqs, serialization_format="pickle")
        except BaseException:
            with contextlib.suppress(Exception):
                self._client.finalize_logged_model(lm.model_id, "FAILED")
            raise
        finally:
            quiet.setLevel(level)
        return lm.model_id

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


@contextlib.contextmanager
def start_run(uri: str, experiment: str, name: str, *, parent: Run | str | None = None,
              params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
              resume: str | None = None, note: str | None = None, config: Any = None,
              system_metrics: bool = False, exclusive: bool = True) -> Iterator[Run]:
    """Open a run (nested under `parent` if given), or reopen run `resume` (its status goes back to RUNNING).

    A new run gets MLflow's standard tags (`standard_tags`; `note` is its one-line description, and `tags`
    may override any of them). Reopening keeps the run's tags, except the note when one is given.

    The run ends FINISHED (without a failure reason of an earlier session, or its lease), or FAILED/KILLED with the
    reason in the tag `hmmscope.failure_reason`.
    While it is open it carries this process's host and pid and a heartbeat (module docstring).
    `config` (a Config, or any of its sections): logged at once as the artifact `config.toml` (`config_toml`),
    which `--config` reads back. `system_metrics`: MLflow's system metrics (system/cpu_utilization_percentage,
    system/system_memory_usage_megabytes, ...; GPU ones where pynvml finds a GPU) sampled every
    MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds (default 10) while the run is open (`_system_monitor`).
    One writer per run: the run's lease is held while it is open (`liveness.hold`; a resume of a run another
    process holds raises RunHeld before anything is written). `exclusive=False` reopens a run several processes
    share on purpose (a sweep's parent run, which every `sweep run` of its study reopens): no lease is taken.
    """
    ensure_store(uri)
    c = client(uri)
    interval = heartbeat_interval()
    lease = contextlib.ExitStack()
    held: dict[str, Any] = {"lost": None}
    if resume is not None:
        run = existing_run(uri, resume)
        if exclusive:  # one writer per run: RunHeld (nothing written) if another has it
            held = lease.enter_context(hold(uri, resume))
        try:
            # RUNNING again; its end time moves with its heartbeat (liveness.beating), so the UI's duration is right
            c.set_terminated(resume, "RUNNING", end_time=int(time.time() * 1000))
            run.set_tags({**liveness_tags(interval, nonce_of(uri, resume)),
                          **({"mlflow.note.content": note_line(note)} if note else {})})
        except BaseException:
            lease.close()
            raise
    else:
        std = standard_tags(note)
        all_tags = {"hmmscope.code_version": std.get("mlflow.source.git.commit", "unknown"), **std, **(tags or {}),
                    **liveness_tags(interval)}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id if isinstance(parent, Run) else parent
        r = c.create_run(experiment_id(uri, experiment), run_name=name,
                         tags={safe_key(k): str(v)[:5000] for k, v in all_tags.items()})
        run = Run(uri, r.info.run_id)
        held = lease.enter_context(hold(uri, run.run_id, fresh=True))
    monitor = _system_monitor(uri, run.run_id, resume is not None) if system_metrics else None
    with lease:  # held until the run's end is written: nobody reopens it in between
        try:
            with beating(run.uri, run.run_id, interval, touch=resume is not None):
                if params:
                    run.log_params(params)
                if config is not None:
                    run.log_dict(config_toml(config), "config.toml")
                yield run
        except BaseException as e:
            if held["lost"] is not None or isinstance(e, LeaseLost):
                raise  # the run belongs to the process that took it over: its status is not ours to set
            status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
            tries = 5 if sqlite_path(uri) is not None else 2  # a server's client retries by itself (HTTP_RETRIES)
            for attempt in range(tries):  # a busy sqlite store ("database is locked") must not leave the run RUNNING
                try:  # the reason first, the end only after it: never an ended run without its reason (a store
                    # out of reach leaves it RUNNING, for the sweep worker's settle or gc_runs to end with one); a
                    # run deleted under its writer is ended in the trash (end_run)
                    end_run(c, run.run_id, status, f"{type(e).__name__}: {e}")
                    break
                except Exception:
                    if attempt + 1 < tries:
                        time.sleep(0.2 * 2 ** attempt)
            raise
        else:
            if held["lost"] is not None:
                raise LeaseLost(f"run {run.run_id}: {held['lost']}; this process's results are not recorded")
            c.set_terminated(run.run_id, "FINISHED")  # the end first: a store lost in between leaves no ended run
            clear_finished(c, run.run_id)  # no failure reason of an earlier session, no lease: nobody holds it now
        finally:
            if monitor is not None:
                with contextlib.suppress(Exception):
                    monitor.finish()


def _system_monitor(uri: str, run_id: str, resumed: bool):
    """MLflow's SystemMetricsMonitor on this run (started), or None where it cannot run (no psutil)."""
    import logging

    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no "Started monitoring" lines
    try:
        m = SystemMetricsMonitor(run_id, resume_logging=resumed, tracking_uri=uri)
        m.start()
    except Exception:
        return None
    return m


def config_toml(cfg: Any) -> str:
    """A Config (or one section of it; or a mapping of section -> values) as TOML tables, as `--config` reads."""
    import dataclasses

    def toml(v: Any) -> str:
        return json.dumps(v)  # numbers, strings, booleans and lists of them: JSON is TOML here

    d = dict(cfg) if isinstance(cfg, Mapping) else dataclasses.asdict(cfg)
    if all(isinstance(v, dict) for v in d.values()):
        sections = d
    else:
        sections = {type(cfg).__name__.removesuffix("Config").lower(): d}
    out = []
    for sec, values in sections.items():
        out += [f"[{sec}]", *(f"{k} = {toml(v)}" for k, v in values.items() if v is not None), ""]
    return "\n".join(out)


def delete_run(uri: str, run_id: str) -> None:
    """Soft-delete a run (MLflow's deleted lifecycle stage: searches no longer return it)."""
    client(uri).delete_run(run_id)
