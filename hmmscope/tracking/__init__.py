"""The one package that talks to MLflow: `from hmmscope import tracking; tracking.start_run(...)`.

The rooms (each module's docstring has the details):
- `store`: the store's URI (default: sqlite under ./mlruns), its database created once under a lock, the
  artifact root beside it, relocating a moved or copied store, the client (a read never creates a store:
  `StoreMissing`; `server_uri`: a server opens one, never creates it), experiments.
- `tags`: what a run carries besides metrics: MLflow's standard tags (user, entry point, git commit, note),
  the config params of its kind, MLflow-safe keys, the objective key, the claims table.
- `runs`: `start_run` (nested runs, resuming, FINISHED / FAILED / KILLED with the reason) and `Run`, the
  handle every write goes through (params, metrics, tags, claims, datasets; `Run.forget_metrics`: a resume's rows
  past its checkpoint, each step once).
- `artifacts`: `RunArtifacts`, the artifact half of `Run` (its base class): where a run's artifacts are (resolved
  against the store's own folder), files, JSON and tables written, the model as an MLflow logged model
  (`log_model`), read back (`require`, `download`; `ArtifactNotFound` names the path looked for).
- `liveness`: a run's lease (host, pid, heartbeat) read; orphan runs found (`stale_reason`) and ended (`gc_runs`);
  who holds a run (`live_owner`).
- `hold`: one writer per run (`hold_run`: the lease taken atomically, an OS lock beside a sqlite store; the
  heartbeat; `settle_run`, `own_runs`: runs this process opened, ended when their own end could not be written).
- `claims`: a run's claims as one table plus headline numbers, and read back (`read_claims`).
- `faults`: a store's failures told apart (`store_error`, `permanent_fault`: a full disk) and said in one line
  (`store_reason`).
- `search`: runs read back (`search_runs`, `get_run`, `resolve_run_id`: a unique id prefix) and pointed at (`run_url`,
  `experiment_url`, `target_url`, `sweep_urls`: a sweep's answer and its trials, `save_sweep_view`: the trials
  table's columns as MLflow's shared view, `browse_line`: the one `hmmscope ui` line commands print;
  `ui_command`: the server's own command line).

Dependencies run store <- tags <- search <- liveness <- hold <- runs (artifacts: store, tags, leftovers), none back.
No module of this package imports mlflow at import time (only inside functions), and none imports anything of hmmscope
outside it except `config` (`tags`), `env`, `interrupts` and `safe_output` (below every unit); every other module
reaches MLflow only through this package.
"""

from .artifacts import ArtifactNotFound
from .claims import CLAIMS_FILE, claim_keys, read_claims
from .hold import LeaseLost, LeaseUnavailable, RunHeld, own_runs
from .hold import hold as hold_run
from .hold import settle as settle_run
from .leftovers import run_temp_dir
from .liveness import HEARTBEAT_ENV, HEARTBEAT_GRACE, gc_runs, heartbeat_interval, stale_reason
from .runs import Run, config_toml, delete_run, existing_run, experiment_name, start_run
from .search import (
    ANSWER,
    ML_VIEW,
    SHARED_VIEW,
    UI_PORT,
    browse_line,
    experiment_url,
    get_run,
    resolve_run_id,
    run_link,
    run_url,
    save_sweep_view,
    search_runs,
    sweep_columns,
    sweep_parent,
    sweep_urls,
    sweep_view,
    sweep_view_key,
    target_url,
    ui_base,
    ui_command,
)
from .store import (
    ARTIFACTS,
    DB_NAME,
    ROOT_TAG,
    STORE_DIR,
    StoreMissing,
    artifact_root,
    client,
    default_tracking_uri,
    ensure_store,
    experiment_id,
    read_only_uri,
    relocate,
    resolve_uri,
    server_uri,
    writable,
)
from .tags import (
    CLAIM_COLUMNS,
    PARAM_MAX,
    THEORY_SECTIONS,
    TRAIN_SECTIONS,
    claim_headline,
    claims_table,
    config_params,
    git_commit,
    note_line,
    param_value,
    safe_key,
    source_name,
    standard_tags,
    train_run_name,
)

__all__ = [
    "ANSWER", "SHARED_VIEW", "resolve_run_id", "run_link", "save_sweep_view", "sweep_columns", "sweep_urls", "sweep_view",
    "sweep_view_key",
    "run_temp_dir",
    "ARTIFACTS", "ArtifactNotFound", "LeaseLost", "LeaseUnavailable", "RunHeld", "hold_run", "own_runs", "settle_run",
    "CLAIMS_FILE", "CLAIM_COLUMNS", "DB_NAME", "HEARTBEAT_ENV", "HEARTBEAT_GRACE",
    "ML_VIEW", "PARAM_MAX", "ROOT_TAG", "Run", "STORE_DIR", "StoreMissing", "THEORY_SECTIONS", "TRAIN_SECTIONS", "UI_PORT",
    "param_value", "artifact_root", "browse_line", "claim_headline", "claim_keys", "claims_table", "client", "config_toml",
    "config_params", "default_tracking_uri", "delete_run", "ensure_store", "existing_run", "experiment_id",
    "experiment_name", "experiment_url", "gc_runs", "get_run", "git_commit", "heartbeat_interval", "note_line",
    "read_claims", "read_only_uri", "relocate", "resolve_uri", "run_url", "safe_key", "search_runs", "server_uri",
    "source_name", "stale_reason", "standard_tags", "start_run", "sweep_parent", "target_url", "train_run_name", "ui_base",
    "ui_command", "writable",
]
