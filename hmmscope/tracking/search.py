"""Reading runs back (searches across pages, one run by id or a unique prefix of it) and pointing at them (MLflow UI
URLs, `mlflow ui`).

Run ids. Wherever a run id is taken, a unique prefix of at least 6 characters is too, as git takes a commit's
(`resolve_run_id`); an ambiguous prefix is a one-line ValueError naming the candidates, a shorter one a one-line
ValueError saying that a prefix needs 6 characters.

A sweep's landing URLs (`sweep_urls`). First the answer: the sweep parent run's page, on its artifact
`comparison/objective.png` (the objective against each swept key, per positional encoding; `sweep.compare`),
or its overview before any trial has finished. Then its trials: the experiment's runs table narrowed to the
parent's children, sorted by the objective, with the objective and the swept params as visible columns.
MLflow 3.17's runs table reads from its URL only the search facets (searchFilter, orderByKey, orderByAsc,
startTime, lifecycleFilter, modelVersionFilter, datasetsFilter: `useExperimentPageSearchFacets`); the visible
columns are UI state (`selectedColumns`), kept in the browser's local storage, or loaded from a *shared view*:
the URL parameter `viewStateShareKey=KEY` makes the page read the experiment tag `mlflow.sharedViewState.KEY`
(MLflow's own tag, the one its "Share" / "Saved views" menu writes: an envelope {name, createdAt, updatedAt,
state} whose `state` is the JSON of the facets and the UI state). `save_sweep_view` writes that tag for a
sweep (columns: the objective's metric, each swept param, the seed param, each as wide as its header); the view then
also appears by name ("sweep NAME: trials") in the runs page's saved-views menu. Without the tag (a read-only
store), the URL carries the facets alone and the columns stay MLflow's defaults.

Part of `tracking`, the one package that talks to MLflow. Imports mlflow only inside functions; imports the
store and tags modules only, and must not import anything of hmmscope outside tracking.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import time
from urllib.parse import quote

from .store import StoreMissing, artifact_root, client, default_tracking_uri
from .tags import safe_key

UI_PORT = 5000  # `hmmscope ui`'s port when it is free and none is given (else any free one)
ML_VIEW = "workflowType=machine_learning"  # MLflow 3's experiment pages open the GenAI view without it
SHARED_VIEW = "mlflow.sharedViewState."  # MLflow UI's shared / saved views of a runs table: experiment tags
ANSWER = "comparison/objective.png"  # the sweep parent's answer at a glance (sweep.compare)
MIN_PREFIX = 6  # the shortest run id prefix taken for a run id


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
    extra = f"&searchFilter={quote(search_filter, safe='')}" if search_filter else ""
    if order_by:
        extra += f"&orderByKey={quote(f'metrics.`{order_by}`', safe='')}&orderByAsc={str(ascending).lower()}"
    return f"{base}/#/experiments/{experiment_id}/runs?{ML_VIEW}{extra}"


def run_link(experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """A run's page (on `artifact`, if given) as a link relative to the UI's own address (`#/experiments/...`):
    what a run's description (mlflow.note.content, rendered as Markdown) links to, on any host and port."""
    return f"#/experiments/{experiment_id}/runs/{run_id}" + (f"/artifacts/{artifact}" if artifact else "") + f"?{ML_VIEW}"


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
    base = ui_base(uri)
    if base is not None:
        with contextlib.suppress(Exception):
            url = target_url(uri, base, run_id=run_id, sweep=sweep, experiment=experiment)
            return f"browse: {url}"
        return f"browse: {base}"
    opt = (f" --run {run_id}" if run_id else f" --sweep {sweep}" if sweep else
           f" --experiment {shlex.quote(experiment)}" if experiment else "")
    try:
        default = default_tracking_uri()
    except ValueError:  # the working folder's path is no sqlite URL's: this store is not its default
        default = None
    if uri != default:
        opt += f" --tracking-uri {shlex.quote(uri)}"
    return f"browse: hmmscope ui{opt}"


def sweep_parent(uri: str, sweep: str):
    """The parent run of the sweep named `sweep` in this store (tag hmmscope.kind = sweep), or None."""
    runs = search_runs(uri, filter_string=f"tags.`hmmscope.kind` = 'sweep' and tags.`hmmscope.study` = "
                                          f"'{sweep.replace(chr(39), '')}'")
    return runs[0] if runs else None


def sweep_view_key(sweep: str) -> str:
    """The share key of a sweep's trials view (`viewStateShareKey=`; the tag `mlflow.sharedViewState.<key>`)."""
    return safe_key(f"hmmscope-sweep-{sweep}").replace(" ", "_").replace("/", "_")


def sweep_columns(parent) -> list[str]:
    """The runs-table columns of a sweep's trials (canonical keys as MLflow's UI names them): the objective as
    the trials log it (once, under the key the spec names), each swept param, the replicate seed's param."""
    p = parent.data.params
    cols = [f"metrics.`{p['sweep.objective']}`"] if p.get("sweep.objective") else []
    cols += [f"params.`{k[len('sweep.space.'):]}`" for k in sorted(p) if k.startswith("sweep.space.")]
    seed = {"theory": "theory.seed", "headroom": "data.seed"}.get(p.get("sweep.kind", ""), "train.seed")
    return cols + [f"params.`{seed}`"]


# the runs table's columns before the sweep's own (MLflow 3.17's column ids: run name, created, duration)
LEADING_COLUMNS = ("attributes.`Run Name`", "runDateAndNestInfo", "duration")


def column_width(col: str) -> int:
    """Pixels that show a column's whole header (`metrics.`eval/seen/excess_ce`` -> eval/seen/excess_ce) in MLflow's
    runs table (13 px font: about 7.5 px a character, plus the sort icon and padding); never under its default 100."""
    name = col.split("`")[1] if "`" in col else col
    return max(100, round(7.5 * len(name)) + 44)


def sweep_view(parent) -> dict:
    """The state of a sweep's trials view: the parent's direct children (listed flat, not folded under the
    parent), best first by the objective, its objective and swept params as visible columns (module docstring),
    each wide enough for its whole header (`columnOrder` and `columnWidths`, which MLflow applies together; its
    default 100 px would cut a long header short)."""
    p = parent.data.params
    objective, direction = p.get("sweep.objective"), p.get("sweep.direction")
    cols = sweep_columns(parent)
    state = {"searchFilter": f"tags.mlflow.parentRunId = '{parent.info.run_id}'", "selectedColumns": cols,
             "columnOrder": [*LEADING_COLUMNS, *cols], "columnWidths": {c: column_width(c) for c in cols}}
    if objective:
        state.update(orderByKey=f"metrics.`{objective}`", orderByAsc=direction != "maximize")
    return state


def save_sweep_view(uri: str, parent) -> str | None:
    """Write (or refresh) the sweep's trials view as its experiment's tag `mlflow.sharedViewState.<key>`, the
    envelope MLflow's saved views use; returns the key, or None where the store cannot be written (then the
    trials URL carries the search facets alone)."""
    key = sweep_view_key(parent.data.tags.get("hmmscope.study") or parent.info.run_name or parent.info.run_id)
    state = json.dumps(sweep_view(parent), sort_keys=True)
    tag = SHARED_VIEW + key
    try:
        c = client(uri)
        have = c.get_experiment(parent.info.experiment_id).tags.get(tag)
        with contextlib.suppress(ValueError, TypeError, KeyError):
            if json.loads(have)["state"] == state:
                return key
        now = int(time.time() * 1000)
        c.set_experiment_tag(parent.info.experiment_id, tag, json.dumps(
            {"name": f"sweep {key[len('hmmscope-sweep-'):]}: trials", "createdAt": now, "updatedAt": now,
             "state": state}))
    except Exception:
        return None
    return key


def _shared_view_key(uri: str, parent) -> str | None:
    """The key of the sweep's trials view if its experiment holds it, with the state this code would write."""
    key = sweep_view_key(parent.data.tags.get("hmmscope.study") or parent.info.run_name or parent.info.run_id)
    with contextlib.suppress(Exception):
        have = client(uri).get_experiment(parent.info.experiment_id).tags.get(SHARED_VIEW + key)
        if json.loads(have)["state"] == json.dumps(sweep_view(parent), sort_keys=True):
            return key
    return None


def sweep_urls(uri: str, base: str, sweep: str) -> tuple[str, str]:
    """(the answer, the trials) of a sweep (module docstring); ValueError (one line) if there is no such sweep."""
    p = sweep_parent(uri, sweep)
    if p is None:
        raise ValueError(f"no sweep {sweep!r} in {uri} (no run tagged hmmscope.study = {sweep!r})")
    eid, pid = p.info.experiment_id, p.info.run_id
    logged = p.data.tags.get("mlflow.loggedArtifacts", "")
    has_answer = "comparison/" in logged
    answer = (f"{base}/#/experiments/{eid}/runs/{pid}/artifacts/{ANSWER}?{ML_VIEW}" if has_answer
              else f"{base}/#/experiments/{eid}/runs/{pid}?{ML_VIEW}")
    key = _shared_view_key(uri, p)
    if key is not None:
        trials = f"{base}/#/experiments/{eid}/runs?{ML_VIEW}&viewStateShareKey={key}"
    else:
        view = sweep_view(p)
        trials = experiment_url(base, eid, view["searchFilter"],
                                order_by=p.data.params.get("sweep.objective"),
                                ascending=view.get("orderByAsc", True))
    return answer, trials


def target_url(uri: str, base: str, *, run_id: str | None = None, sweep: str | None = None,
               experiment: str | None = None) -> str:
    """The URL of what a person asked to see: a run's page on its Model metrics tab (a unique prefix of its id will
    do; the loss curves are its first charts, tracking.runs' Loss/*; a run with no metrics: its overview), a sweep's
    answer (`sweep_urls`: its comparison figure on its parent run), an experiment's runs table; the UI's front
    page if nothing is named. ValueError (one line) if the run, sweep or experiment is not in the store."""
    c = client(uri)
    if run_id:
        r = get_run(uri, run_id)
        if r is None:
            raise ValueError(f"no run {run_id!r} in {uri}")
        tab = "/model-metrics" if r.data.metrics else ""  # its charts (the loss first); a run with none: its overview
        return f"{base}/#/experiments/{r.info.experiment_id}/runs/{r.info.run_id}{tab}?{ML_VIEW}"
    if sweep:
        return sweep_urls(uri, base, sweep)[0]
    if experiment:
        exp = c.get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no experiment {experiment!r} in {uri}")
        return experiment_url(base, exp.experiment_id)
    return base


def resolve_run_id(uri: str, run_id: str) -> str:
    """The whole id of the run `run_id` names: a whole id as it is; a prefix of at least MIN_PREFIX hex digits
    that one active run's id starts with, as git takes a commit's; anything else as it is (the caller's lookup
    then says there is no such run). An ambiguous prefix: ValueError naming the candidates; a shorter prefix (1 to
    MIN_PREFIX - 1 hex digits): ValueError saying that a prefix needs MIN_PREFIX characters."""
    rid = run_id.strip().lower()
    if re.fullmatch(rf"[0-9a-f]{{1,{MIN_PREFIX - 1}}}", rid):  # as git says of a prefix too short to name one
        raise ValueError(f"run id prefix {run_id!r} is too short: a prefix of a run id needs at least {MIN_PREFIX} "
                         f"characters ({len(rid)} given)")
    if not re.fullmatch(rf"[0-9a-f]{{{MIN_PREFIX},31}}", rid):
        return run_id
    try:
        found = search_runs(uri, filter_string=f"attributes.run_id LIKE '{rid}%'")
    except StoreMissing:
        raise
    except Exception:
        return run_id
    if len(found) == 1:
        return found[0].info.run_id
    if len(found) > 1:
        names = ", ".join(f"{r.info.run_id} ({r.info.run_name})" for r in found[:5])
        raise ValueError(f"run id prefix {run_id!r} is ambiguous: {len(found)} runs start with it ({names}"
                         f"{', ...' if len(found) > 5 else ''}); give more characters")
    return run_id


def search_runs(uri: str, experiment: str | None = None, *, filter_string: str = "",
                parent_id: str | None = None, experiment_ids: list[str] | None = None,
                order_by: list[str] | None = None, deleted: bool = False) -> list:
    """Runs as MLflow returns them (all pages), newest first unless `order_by` (MLflow's syntax, e.g.
    ["metrics.`eval/seen/excess_ce` ASC"]; ties newest first) (active runs only; `deleted`: those in the trash too).

    `experiment` (a name) or `experiment_ids` narrow the search (default: every experiment);
    `parent_id` keeps the direct children of that run; `filter_string` is MLflow's search syntax.
    """
    from mlflow.entities import ViewType  # lazy: mlflow off the CLI's start-up

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
        page = c.search_runs(experiment_ids, " and ".join(filters),
                             run_view_type=ViewType.ALL if deleted else ViewType.ACTIVE_ONLY,
                             max_results=1000, order_by=[*(order_by or []), "attributes.start_time DESC"],
                             page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def get_run(uri: str, run_id: str):
    """The run as MLflow returns it (`run_id`: its id or a unique prefix, `resolve_run_id`), or None if there is
    no such run; an ambiguous prefix raises ValueError."""
    run_id = resolve_run_id(uri, run_id)
    c = client(uri)  # no store: StoreMissing, not "no such run"
    try:
        return c.get_run(run_id)
    except Exception:
        return None
