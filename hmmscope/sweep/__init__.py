"""Sweeps: Optuna studies over config keys, one MLflow run per trial under one parent run (SCIENCE.md 7).

The package, by idea (each module's docstring says what it owns and what it must not import):

- `spec` (a package): the sweep spec format (TOML): `typed` (the typed spec, a trial's config and name, the identity),
  `objectives` (what each kind of trial logs), `checks` (validation: keys, settings, grids, objectives), `parse`
  (TOML -> spec; `sweep run --set` overrides, `with_sets`).
- `space`: checks of a spec's [space] beyond each value's own validity (ranges, grid values, trial names).
- `storage`: the storage URLs (SQLite, PostgreSQL, a journal file) and the Optuna storages behind them.
- `study`: the study, created once with every trial enqueued; its spec as user attrs; its MLflow parent run.
- `protocol`: every change of a trial's state (claim, finish, heartbeat, stale failure, retry) through one
  interface, `TrialStore`, so that exactly one process wins each; the part a reviewer checks line by line.
- `trial`: what one trial does (train + evaluate, or a theory setting), and the resume of a retried
  training trial from its predecessor's checkpoint.
- `worker`: the worker loop (claim, run, record, end the trial's other runs), `run_sweep`; `python -m hmmscope.sweep
  worker` (`__main__`).
- `processes`: the local worker processes: started, their output forwarded, stopped; `SweepSummary`.
- `parent`: the parent run kept up to date as trials end (counts, best trial, the comparison).
- `outage`: a worker's storage calls that wait out an outage (`Patient`).
- `gpus`: which GPUs the workers get, a joining worker's pin.
- `spec_diff`: a spec against the one its study stored, key by key: a change that grows the sweep (more seeds, more
  grid levels), or one that is refused naming the keys.
- `status`: trial counts, `sweep status`, what `sweep run` is about to do and what an interrupted one kept, orphan
  MLflow runs.
- `studies`: `sweep list / export / delete`.
- `compare`: the parent run's comparison figure and pivot table (comparison/), logged when `run_sweep` ends.
- `effects`: effects over seeds with their verdicts, equivalence (TOST) and power: every swept key's contrast or
  slope, rope - absolute paired within blocks (the pivot table's, the report's answer and positional-encoding
  statistics, the analysis records' effects.csv); the spec's [report] options.
- `sentences`: an effect said in words (the comparison's and the report's answer lines).
- `rename`: `sweep run --name`: a spec under another name.

Imports run one way: storage <- protocol <- study <- status <- worker, spec <- spec_diff <- study, spec <- gpus <-
worker, spec <- trial <- worker, storage <- outage <- worker, status and compare <- parent <- worker, protocol and status
<- processes <- worker, status and study <- studies, spec <- rename; effects and space <- spec (its [report] and [space]
tables), effects <- sentences <- compare, spec <- compare. The jobs layer never imports this package (it is handed the
sweep and its spec by the CLI); the report imports it, never the reverse.
"""

from .gpus import pin_gpu, uses_gpu, visible_gpus, worker_gpus
from .processes import SweepSummary, worker_env
from .protocol import TrialStore
from .status import best_trial, collect_orphans, counts, study_orphans, study_status
from .storage import (
    dashboard_storage,
    default_storage,
    ensure_storage,
    journal_path,
    open_storage,
    quiet_optuna,
    safe_url,
    storage_kind,
    storage_url,
)
from .studies import StudyRuns, delete_study, export_rows, list_studies, study_runs
from .study import (
    ATTR_BASE,
    ATTR_HASH,
    ATTR_PARENT,
    ATTR_PATH,
    ATTR_SPEC,
    ATTR_TEXT,
    create_study,
    load_study,
    spec_of_study,
)
from .trial import make_prune_hook, resumable_run, run_trial, trial_note, trial_seed
from .worker import SweepDeleted, main, run_sweep, run_worker, worker_command

__all__ = [
    "ATTR_BASE", "ATTR_HASH", "ATTR_PARENT", "ATTR_PATH", "ATTR_SPEC", "ATTR_TEXT", "StudyRuns", "SweepSummary", "TrialStore",
    "best_trial", "collect_orphans", "counts", "create_study", "dashboard_storage", "default_storage",
    "delete_study", "ensure_storage", "export_rows", "journal_path", "list_studies", "load_study", "main",
    "make_prune_hook", "open_storage", "pin_gpu", "quiet_optuna", "resumable_run", "run_sweep", "run_trial",
    "run_worker", "SweepDeleted", "safe_url", "spec_of_study", "storage_kind", "storage_url", "study_orphans", "study_runs",
    "study_status", "trial_note", "trial_seed", "uses_gpu", "visible_gpus", "worker_command", "worker_env",
    "worker_gpus",
]
