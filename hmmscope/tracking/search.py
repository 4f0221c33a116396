"""Reading runs back (searches across pages, one run by id) and pointing at them (MLflow UI URLs, `mlflow ui`).

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store and tags modules only, and must not import anything of hmmscope outside tracking.
"""

from __future__ import annotations

import contextlib
import re
import shlex

from .store import artifact_root, client
from .tags import objective_key

UI_PORT = 5000  # `hmmscope ui`'s port when it is free and none is given (else any free one)
ML_VIEW = "workflowType=machine_learning"  # MLflow 3's experiment pages open the GenAI view without it


def ui_base(uri: str, port: int | None = None) -> str | None:
    """Where the MLflow UI of this store is: the server itself for an http(s) store (never a password), else
    `hmmscope ui` on 127.0.0.1:`port`; None for a local store when no port is known (no UI is running)."""
    if uri.startswith(("http://", "https://")):
        return re.sub(r"//[^/]*@", "//", uri.rstrip("/"))  # the credentials up to the authority's last @
    return f"http://127.0.0.1:{port}" if port else None


def experiment_url(base: str, experiment_id: str, search_filter: str | None = None,
                   order_by: str | None = None, ascending: bool = True) -> str:
    """The runs table of an experiment (the 'Model training' view, not the GenAI overview), optionally
    narrowed by an MLflow search filter (e.g. one sweep's trials) and sorted by a metric (`order_by`, a
    metric key: the UI shows that column)."""
    from urllib.parse import quote

    extra = f"&searchFilter={quote(search_filter, safe='')}" if search_filter else ""
    if order_by:
        extra += f"&orderByKey={quote(f'metrics.`{order_by}`', safe='')}&orderByAsc={str(ascending).lower()}"
    return f"{base}/#/experiments/{experiment_id}/runs?{ML_VIEW}{extra}"


def run_url(uri: str, experiment_id: str, run_id: str, port: int | None = None) -> str | None:
    """A run's page in the MLflow UI (see `ui_base`); None for a local store with no UI port known."""
    base = ui_base(uri, port)
    return None if base is None else f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"


def ui_command(uri: str, port: int = UI_PORT) -> str:
    """The shell command that serves the MLflow UI on this store (what `hmmscope ui` starts)."""
    extra = ""
    root = artifact_root(uri)
    if root:
        extra = f" --default-artifact-root {root}"
    return f"mlflow ui --backend-store-uri {uri}{extra} --host 127.0.0.1 --port {port}"


def browse_line(uri: str, *, run_id: str | None = None, sweep: str | None = None,
                experiment: str | None = None) -> str:
    """The one line a command prints to reach its results: the URL itself on a server store, else the
    `hmmscope ui` command that serves this store and prints the URL with the port it really listens on."""
    from .store import default_tracking_uri

    base = ui_base(uri)
    if base is not None:
        with contextlib.suppress(Exception):
            url = target_url(uri, base, run_id=run_id, sweep=sweep, experiment=experiment)
            return f"browse: {url}"
        return f"browse: {base}"
    opt = (f" --run {run_id}" if run_id else f" --sweep {sweep}" if sweep else
           f" --experiment {shlex.quote(experiment)}" if experiment else "")
    if uri != default_tracking_uri():
        opt += f" --tracking-uri {shlex.quote(uri)}"
    return f"browse: hmmscope ui{opt}"


def sweep_parent(uri: str, sweep: str):
    """The parent run of the sweep named `sweep` in this store (tag hmmscope.kind = sweep), or None."""
    runs = search_runs(uri, filter_string=f"tags.`hmmscope.kind` = 'sweep' and tags.`hmmscope.study` = "
                                          f"'{sweep.replace(chr(39), '')}'")
    return runs[0] if runs else None


def target_url(uri: str, base: str, *, run_id: str | None = None, sweep: str | None = None,
               experiment: str | None = None) -> str:
    """The URL of what a person asked to see: a run's page, a sweep's trials (its experiment's runs table
    narrowed to the parent's children, sorted by the objective), an experiment's runs table; the UI's front
    page if nothing is named. ValueError (one line) if the run, sweep or experiment is not in the store."""
    c = client(uri)
    if run_id:
        r = get_run(uri, run_id)
        if r is None:
            raise ValueError(f"no run {run_id!r} in {uri}")
        return f"{base}/#/experiments/{r.info.experiment_id}/runs/{run_id}?{ML_VIEW}"
    if sweep:
        p = sweep_parent(uri, sweep)
        if p is None:
            raise ValueError(f"no sweep {sweep!r} in {uri} (no run tagged hmmscope.study = {sweep!r})")
        objective, direction = p.data.params.get("sweep.objective"), p.data.params.get("sweep.direction")
        # the sweep's trials (the parent's direct children: listed flat, not folded under the parent), best first
        return experiment_url(base, p.info.experiment_id, f"tags.mlflow.parentRunId = '{p.info.run_id}'",
                              order_by=objective and objective_key(objective), ascending=direction != "maximize")
    if experiment:
        exp = c.get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no experiment {experiment!r} in {uri}")
        return experiment_url(base, exp.experiment_id)
    return base


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
