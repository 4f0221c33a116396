"""MLflow's usage telemetry, off in hmmscope's own processes unless their user chose otherwise.

MLflow 3 sends anonymized usage events by default and, on `import mlflow`, writes an installation id to
~/.config/mlflow/telemetry.json. A local research tool does not phone home behind its user's back: the `hmmscope`
command (`cli.app.main`) and a sweep worker started as `python -m hmmscope.sweep` call `telemetry_off()` before
anything imports mlflow, and their children (sweep workers, the MLflow server and optuna-dashboard behind `hmmscope
ui`) inherit the setting through the environment. A user who set MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK (to any
value) keeps their own choice: neither is touched then. `import hmmscope` in a notebook changes nothing (the
process is the user's).

Part of `tracking`; imports nothing of hmmscope and no mlflow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

TELEMETRY_ENV = "MLFLOW_DISABLE_TELEMETRY"
USER_CHOICES = (TELEMETRY_ENV, "DO_NOT_TRACK")  # either set: the user chose, and hmmscope leaves both alone


def telemetry_setting(environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to `environ` so MLflow's telemetry is off: {MLFLOW_DISABLE_TELEMETRY: "true"}, or {} when the
    user set MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK."""
    return {} if any(k in environ for k in USER_CHOICES) else {TELEMETRY_ENV: "true"}


def telemetry_off(environ: MutableMapping[str, str] | None = None) -> None:
    """Turn MLflow's telemetry off in this process's environment (`environ`, default os.environ), so in every child
    it starts, unless the user chose (`telemetry_setting`). Before mlflow is imported: it reads the setting then."""
    environ = os.environ if environ is None else environ
    environ.update(telemetry_setting(environ))
