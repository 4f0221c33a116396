"""Runs: opening and ending one (`start_run`), and the `Run` handle every write goes through.

A run ends FINISHED, or FAILED/KILLED with the reason in the tag `hmmscope.failure_reason`; while it is open it
carries this process's host and pid and a heartbeat (`liveness`). Params, metrics (finite values only), tags
(made MLflow-safe, `tags.safe_key`), artifacts, JSON and tables are written through `Run`; its artifact half
(where they are, written, read back) is `artifacts.RunArtifacts`.
A run that finishes (a resume that completes an interrupted one) drops any failure reason and its lease
(`liveness.clear_finished`).

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store, tags, artifacts, liveness and hold modules, and must not import search or anything
else of hmmscope outside tracking.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .artifacts import RunArtifacts
from .hold import LeaseLost, beating, hold, lost, nonce_of
from .liveness import clear_finished, end_run, heartbeat_interval, liveness_tags
from .store import client, ensure_store, experiment_id, sqlite_path
from .tags import claim_headline, claims_table, note_line, param_value, safe_key, standard_tags


class Run(RunArtifacts):
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
        from mlflow.entities import Param  # lazy: mlflow off the CLI's start-up

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
        from mlflow.entities import Metric  # lazy: mlflow off the CLI's start-up

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
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: mlflow off the CLI's start-up

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
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric  # lazy: mlflow off the CLI's start-up

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
        from mlflow.entities import RunTag  # lazy: mlflow off the CLI's start-up

        self._guard()
        self._client.log_batch(self.run_id, tags=[RunTag(safe_key(k), (param_value(v) if isinstance(v, float) else
                                                                        str(v))[:5000]) for k, v in tags.items()])

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
        from mlflow.entities import Dataset, DatasetInput, InputTag  # lazy: mlflow off the CLI's start-up

        ds = Dataset(name=name, digest=digest[:36], source_type="code", source=json.dumps({"generator": source}),
                     profile=json.dumps(dict(profile), default=str))
        self._client.log_inputs(self.run_id, [DatasetInput(ds, [InputTag("mlflow.data.context", context)])])

    def get(self):
        """The run as MLflow returns it (info, data.params, data.metrics, data.tags)."""
        return self._client.get_run(self.run_id)


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
    One writer per run: the run's lease is held while it is open (`hold.hold`; a resume of a run another
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
            # RUNNING again; its end time moves with its heartbeat (hold.beating), so the UI's duration is right
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
    try:
        # lazy: mlflow off the CLI's start-up; its system-metrics monitor (psutil) may be missing
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
