"""Checks of the MLflow run a command names: it exists and is not deleted, no other process still writes it (one
writer per run: tracking.liveness), and the Config it logged rebuilds (`run_config`). Reads only.
"""

from __future__ import annotations

from ..config import Config, ConfigError, flatten, from_flat


def live_run(uri: str, run_id: str, what: str = "MLflow run", *, resume: bool = False):
    """The run `run_id`, if it exists and is not deleted (a deleted run is never evaluated, analyzed or resumed:
    its artifacts would be overwritten and MLflow refuses to log to it half-way); else ConfigError.
    `resume`: also refuse a run whose owner still holds it (one writer per run: tracking.liveness)."""
    from .. import tracking  # lazy: the tracking layer (~1.2 s) off the CLI's start-up
    from ..tracking.liveness import live_owner  # lazy: the same

    run = tracking.get_run(uri, run_id)
    if run is None:
        raise ConfigError(f"unknown MLflow run id {run_id!r} in {uri}")
    if run.info.lifecycle_stage == "deleted":
        raise ConfigError(f"{what} {run_id} is deleted (restore it in the MLflow UI, or `mlflow runs restore "
                          f"--run-id {run_id}`, first)")
    owner = live_owner(run) if resume else None
    if owner is not None:
        raise ConfigError(f"{what} {run_id} is still running in {owner}: one writer per run; wait for it, stop it, "
                          "or run `hmmscope runs gc` once it is gone")
    return run


def run_config(uri: str, run_id: str):
    """The Config a training run logged as params (None if it logged none that rebuild a valid one).

    ValueError "unknown MLflow run id" when the run does not exist; reads only.
    """

    run = live_run(uri, run_id)
    known = flatten(Config()).keys()
    params = {k: v for k, v in run.data.params.items() if k in known}
    if not params:
        return None
    try:
        return from_flat(params)
    except ConfigError:
        return None
