"""Results outside the MLflow UI: a small public API that returns runs and sweeps as pandas DataFrames.

    from hmmscope import api
    df = api.sweep_trials("smoke")                      # one row per trial of the sweep
    df.groupby(["params.model.pos_enc", "params.hmm.gamma"])["objective"].mean()
    api.runs("hmmscope-sweeps", filter_string="metrics.`eval/seen/excess_ce` < 0.3")  # one row per run
    api.run("3efd12")["metrics"]; api.compare([a, b], keys="eval/seen")  # one run (an id prefix will do); side by side

Columns follow `mlflow.search_runs` (MLFLOW_COLUMNS: run_id, experiment_id, status, artifact_uri, start_time and
end_time as UTC timestamps; `metrics.<key>` (last values), `params.<key>` (strings, as MLflow stores them) and
`tags.<key>`), so a frame from here and one from mlflow.search_runs line up. hmmscope adds its own columns beside
them (OWN_COLUMNS: run_name, experiment (the name), kind (tag hmmscope.kind), duration_s, parent_id);
`sweep_trials` adds the Optuna trial's number, state, seed, retries and objective. Every function takes `tracking_uri`
(default: --tracking-uri's, i.e. MLFLOW_TRACKING_URI or ./mlruns/mlflow.db) and, for sweeps, `storage` (default:
./mlruns/optuna.db); they only read (a sqlite store is opened read-only: nothing is created or migrated) and raise
ValueError (one line, naming the store as it was given, never its internal read-only URI) for a store, run or
sweep that is not there, a run id prefix that is ambiguous or shorter than 6 characters, or a filter MLflow cannot
parse. A run id may be a unique prefix of at least 6 characters (`tracking.resolve_run_id`). The `hmmscope runs
list/show/compare` commands print these same tables (`runs list`: LIST_COLUMNS).

Owns: the columns of those tables. Imports pandas and `tracking` at its top (the CLI imports this module only inside
the `runs` commands), `sweep` (optuna) only in `sweep_trials`; never torch; must not import the CLI or the jobs.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from typing import Any
from urllib.parse import unquote

import pandas as pd

from . import store_checks, tracking
from .config import ConfigError
from .tracking.tags import param_value

MLFLOW_COLUMNS = ("run_id", "experiment_id", "status", "artifact_uri", "start_time", "end_time")  # search_runs'
OWN_COLUMNS = ("run_name", "experiment", "kind", "duration_s", "parent_id")  # hmmscope's, beside them
RUN_COLUMNS = (*MLFLOW_COLUMNS, *OWN_COLUMNS)
LIST_COLUMNS = ("run_id", "run_name", "experiment", "status", "kind", "start_time", "duration_s", "parent_id")
HIDDEN_TAGS = ("hmmscope.lease", "mlflow.hmmscope.lease")  # a run's owner (pid, boot id): bookkeeping, out of sight


def shown_uri(uri: str) -> str:
    """The store as a person named it: a sqlite store opened read-only (`tracking.read_only_uri`,
    sqlite:///file:<path>?mode=ro&uri=true) back as sqlite:///<path>; any other URI as it is."""
    m = re.fullmatch(r"sqlite:///file:(.+)\?mode=ro&uri=true", uri)
    return f"sqlite:///{unquote(m.group(1))}" if m else uri


def _uri(tracking_uri: str | None) -> str:
    """The store, checked as `store_checks.tracking_store` checks a store to be read (a missing, empty, corrupt, locked,
    half-created or foreign file; a server that does not answer within its deadline: ValueError, one line), and
    opened read-only (`tracking.read_only_uri`: nothing is created, migrated or written)."""
    return tracking.read_only_uri(store_checks.tracking_store(tracking_uri, must_exist=True, write=False))


def _run_row(r, experiments: dict[str, str]) -> dict[str, Any]:
    i = r.info
    end = i.end_time or None
    return {"run_id": i.run_id, "experiment_id": i.experiment_id, "status": i.status, "artifact_uri": i.artifact_uri,
            "start_time": pd.to_datetime(i.start_time, unit="ms", utc=True) if i.start_time else pd.NaT,
            "end_time": pd.to_datetime(end, unit="ms", utc=True) if end else pd.NaT,
            "run_name": i.run_name or "", "experiment": experiments.get(i.experiment_id, ""),
            "kind": r.data.tags.get("hmmscope.kind", ""),
            "duration_s": (end - i.start_time) / 1000 if end and i.start_time else math.nan,
            "parent_id": r.data.tags.get("mlflow.parentRunId", "")}


def _one_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def runs(experiment: str | None = None, *, tracking_uri: str | None = None, limit: int | None = None,
         filter_string: str = "", order_by: list[str] | None = None, sweep: str | None = None):
    """One row per active run: `mlflow.search_runs`'s columns (MLFLOW_COLUMNS), hmmscope's own (OWN_COLUMNS), then
    `metrics.<key>` (last values), `params.<key>` and `tags.<key>` as `mlflow.search_runs` has them; newest first,
    or by `order_by` (MLflow's syntax, e.g. ["metrics.`eval/seen/excess_ce` ASC"]); `experiment` (a name),
    `sweep` (a sweep's name: its parent run and its trials' runs, tag hmmscope.study; ValueError, naming the closest
    sweep, for one the store has not) and `filter_string` (MLflow's search syntax, e.g. "metrics.`eval/seen/excess_ce`
    < 0.3 and params.`model.pos_enc` = 'rope'") narrow it; `limit` rows at most."""

    uri = _uri(tracking_uri)
    c = tracking.client(uri)
    if experiment is not None and c.get_experiment_by_name(experiment) is None:
        raise ValueError(f"no experiment {experiment!r} in {shown_uri(uri)}")
    if sweep is not None:
        _check_sweep(uri, sweep)
        mine = f"tags.`hmmscope.study` = '{sweep}'"
        filter_string = f"{mine} and {filter_string}" if filter_string else mine  # MLflow's syntax: and, no ()
    experiments = {e.experiment_id: e.name for e in c.search_experiments()}
    try:
        found = tracking.search_runs(uri, experiment, filter_string=filter_string or "", order_by=order_by)
    except Exception as e:  # MLflow's own message for a filter or order it cannot parse
        raise ValueError(f"search {filter_string!r}{f' ordered by {order_by}' if order_by else ''}: "
                         f"{_one_line(e)}") from None
    rows = []
    for r in found[:limit]:
        row = _run_row(r, experiments)
        row.update({f"metrics.{k}": v for k, v in sorted(r.data.metrics.items())})
        row.update({f"params.{k}": v for k, v in sorted(r.data.params.items())})
        row.update({f"tags.{k}": v for k, v in sorted(r.data.tags.items())})
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS)) if not rows else pd.DataFrame(rows)
    extra = sorted(c for c in df.columns if c not in RUN_COLUMNS)
    order = {"metrics": 0, "params": 1, "tags": 2}
    return df[[*RUN_COLUMNS, *sorted(extra, key=lambda c: (order.get(c.split(".", 1)[0], 3), c))]]


def _check_sweep(uri: str, sweep: str) -> None:
    """ValueError (one line, naming the closest) unless the store holds the parent run of a sweep named `sweep`."""

    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", sweep):  # a sweep's name (config.check_name): nothing to quote
        raise ValueError(f"no sweep {sweep!r}: a sweep's name is 1-100 of A-Z a-z 0-9 . _ -")
    names = {r.data.tags.get("hmmscope.study", "") for r in tracking.search_runs(
        uri, filter_string="tags.`hmmscope.kind` = 'sweep'")} - {""}
    if sweep not in names:
        close = difflib.get_close_matches(sweep, sorted(names), n=1)
        raise ValueError(f"no sweep {sweep!r} in {shown_uri(uri)}" + (f"; did you mean {close[0]}?" if close else ""))


def run(run_id: str, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """One run: {"info": its RUN_COLUMNS row, "params", "metrics" (last values), "tags" (without MLflow's own
    mlflow.* bookkeeping but the note, and without the lease, hmmscope.lease: HIDDEN_TAGS), "claims": DataFrame (its
    claims.json; empty if none)}."""

    uri = _uri(tracking_uri)
    r = tracking.get_run(uri, run_id)  # a unique prefix of the id will do; an ambiguous or short one: ValueError
    if r is None:
        raise ValueError(f"no run {run_id!r} in {shown_uri(uri)}")
    exp = tracking.client(uri).get_experiment(r.info.experiment_id)
    nums, verdicts, rules = tracking.read_claims(uri, r)
    claims = pd.DataFrame([{"claim": n, "value": nums.get(f"claim/{n}/value", math.nan),
                            "ci_lo": nums.get(f"claim/{n}/ci_lo", math.nan),
                            "ci_hi": nums.get(f"claim/{n}/ci_hi", math.nan), "rule": rules.get(n, ""),
                            "verdict": v} for n, v in verdicts.items()],
                          columns=["claim", "value", "ci_lo", "ci_hi", "rule", "verdict"])
    tags = {k: v for k, v in r.data.tags.items() if (not k.startswith("mlflow.") or k == "mlflow.note.content")
            and k not in HIDDEN_TAGS}
    return {"info": _run_row(r, {exp.experiment_id: exp.name}), "params": dict(r.data.params),
            "metrics": dict(r.data.metrics), "tags": tags, "claims": claims}


def key_matcher(pattern: str | None):
    """A predicate on keys for `pattern`: a glob (`eval/*/excess_ce`, `params.model.*`) if it holds *, ? or [,
    else a substring (`excess_ce`); matched against the key with and without its `params.` / `metrics.` prefix.
    None matches every key."""
    if not pattern:
        return lambda key: True
    glob = any(ch in pattern for ch in "*?[")

    def match(key: str) -> bool:
        bare = key.split(".", 1)[1] if key.startswith(("params.", "metrics.", "tags.")) else key
        return any(fnmatch.fnmatchcase(k, pattern) if glob else pattern in k for k in (key, bare))

    return match


def compare(run_ids: list[str], *, tracking_uri: str | None = None, differing_only: bool = True,
            keys: str | None = None):
    """Runs side by side: one row per param (`params.<key>`) and metric (`metrics.<key>`), one column per run
    (named `<run name> (<id[:8]>)`); with `differing_only`, only the rows whose values differ between them;
    `keys`: only the rows whose key matches that pattern (`key_matcher`: a glob, else a substring)."""
    if len(run_ids) < 2:
        raise ValueError("compare needs at least two run ids")
    got = [run(i, tracking_uri=tracking_uri) for i in run_ids]
    cols = [f"{g['info']['run_name']} ({g['info']['run_id'][:8]})" for g in got]
    match = key_matcher(keys)
    rows = [k for k in sorted({f"params.{k}" for g in got for k in g["params"]}) +
            sorted({f"metrics.{k}" for g in got for k in g["metrics"]}) if match(k)]
    data = {c: [g["params" if k.startswith("params.") else "metrics"].get(k.split(".", 1)[1]) for k in rows]
            for c, g in zip(cols, got, strict=True)}
    df = pd.DataFrame(data, index=pd.Index(rows, name="key"))
    if differing_only:
        df = df[df.map(lambda v: "\0" if v is None else str(v)).nunique(axis=1) > 1]  # missing counts as a value
    return df


def sweep_trials(name: str, *, storage: str | None = None, tracking_uri: str | None = None):
    """One row per trial of the sweep `name` that holds its cell: hmmscope's number, state, seed (the Optuna trial's),
    `retries` (how many tries of the cell came before it: an interrupt or a dead worker put it back), each swept param
    (`params.<config key>`, a string as MLflow stores it: the trial run's own param, else the value Optuna suggested
    as MLflow would store it), the objective (`objective`, the value Optuna recorded), run_id and run_name of its
    MLflow run, then the last value of every metric of that run (`metrics.<key>`) and of its analysis run's claims
    (`metrics.claim/...`), as `mlflow.search_runs` names them. A trial that was retried has no row (the retry holds its
    cell, and a training retry continues its run), so each run id is in one row: joins on run_id add no rows."""
    from .sweep import default_storage, load_study  # lazy: sweep (optuna) off `hmmscope runs list`
    from .sweep.status import retried_numbers  # lazy: sweep (optuna) off `hmmscope runs list`
    uri = _uri(tracking_uri)
    try:
        study = load_study(name, storage or default_storage())
    except ConfigError as e:
        raise ValueError(str(e)) from None
    c = tracking.client(uri)
    rows = []
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    for t in sorted(trials, key=lambda t: t.number):
        if t.number in retried:  # its cell is its retry's row
            continue
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))
        rid = t.user_attrs.get("mlflow_run_id", "")
        seed = t.user_attrs.get("seed", params.pop("seed", None))
        r = tracking.get_run(uri, rid) if rid else None
        logged = r.data.params if r is not None else {}
        row: dict[str, Any] = {"number": t.number, "state": t.state.name, "seed": seed,
                               "retries": len(t.system_attrs.get("retry_history", [])),
                               **{f"params.{k}": logged.get(k, param_value(v)) for k, v in params.items()},
                               "objective": t.value if t.value is not None else math.nan,
                               "run_id": rid, "run_name": ""}
        if r is not None:
            row["run_name"] = r.info.run_name or ""
            row.update({f"metrics.{k}": v for k, v in sorted(r.data.metrics.items())})
            aid = t.user_attrs.get("mlflow_analysis_run_id")
            a = c.get_run(aid) if aid else None
            if a is not None:
                row.update({f"metrics.{k}": v for k, v in tracking.read_claims(uri, a)[0].items()})
        rows.append(row)
    return pd.DataFrame(rows)
