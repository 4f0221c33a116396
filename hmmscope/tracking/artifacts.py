"""A run's artifacts: where they are (the recorded URI resolved against a sqlite store's own folder, so a moved or
copied store reads and writes its own), written (files, JSON, tables, a logged model) and read back (`require`,
`download`); a missing artifact's error names the path that was looked for (`ArtifactNotFound`).

`RunArtifacts` is the artifact half of `runs.Run` (its base class): it reads the run's `uri`, `run_id`, `_client`,
and calls the run's `_guard` (no write once the lease is lost), `get` and `set_tags`. Local writes go through
`safe_output` (a temp file beside the destination, renamed onto it; nothing through a link out of the store).

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions (lazy: mlflow and
torch off the CLI's start-up); imports store, tags and leftovers, and must not import runs (which imports this).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..safe_output import PROBE, atomic_path, check_dest, write_with
from .leftovers import run_temp_dir
from .store import ARTIFACTS, sqlite_path, uri_path
from .tags import param_value, safe_key

__all__ = ["ArtifactNotFound", "RunArtifacts"]


class ArtifactNotFound(FileNotFoundError):
    """A run's artifact is not where the store says it is; the message names the path looked for."""


class RunArtifacts:
    """The artifact half of a run (`runs.Run`): its artifacts' location, writes and reads."""

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
        import mlflow.pytorch  # lazy: mlflow's pytorch flavour (and torch) off the CLI's start-up
        import numpy  # lazy: only its version, with torch's
        import torch  # lazy: torch (~1 s) off the CLI's start-up
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri  # lazy: mlflow off the CLI's start-up

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
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository  # lazy: mlflow off start-up

        return Path(LocalArtifactRepository(loc).download_artifacts(artifact_path, str(dst)))
