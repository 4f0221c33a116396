"""Reading runs back (searches across pages, one run by id) and pointing at them (MLflow UI URLs, `mlflow ui`).

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store module only, and must not import anything of hmmscope outside tracking.
"""

from __future__ import annotations

import re

from .store import artifact_root, client

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
