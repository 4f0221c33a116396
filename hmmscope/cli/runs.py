"""`hmmscope runs list / show / compare / gc`: MLflow runs as plain tables in the terminal, and housekeeping.

Owns: the `runs` command group (`app`) and its output: plain text tables (columns aligned by spaces, no box
characters: greppable, pasteable). The tables come from `hmmscope.api` (`runs`, `run`, `compare`: the same
DataFrames a notebook gets); finding and marking orphans is `tracking.gc_runs`.

Must not import, at module level, anything beyond typer, the standard library and `cli.common`: mlflow,
pandas, `hmmscope.api` and `hmmscope.tracking` are imported inside the command bodies.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from .. import store_checks, tracking
from ..config import ConfigError
from ..safe_output import stale_temps
from ..tracking import leftovers
from .common import UriOpt, fail, plain_table, print_table, user_errors

app = typer.Typer(no_args_is_help=True, help="MLflow runs as plain tables (list, show, compare); housekeeping (gc).")


def _api(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ValueError as e:
        fail(str(e).splitlines()[0] if str(e) else "bad input")


def _order_metrics(order_by: list[str]) -> list[str]:
    """The metric keys an --order-by names (`metrics.x DESC`, metrics.`a/b`): shown as columns."""
    out = []
    for o in order_by:
        m = re.match(r"\s*metrics\.(`[^`]+`|\S+)", o)
        if m:
            out.append(m.group(1).strip("`"))
    return out


@app.command("list")
@user_errors
def runs_list_cmd(
    experiment: Annotated[str | None, typer.Option(help="Only this experiment (by name).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Runs shown, at most.")] = 50,
    filter_: Annotated[str | None, typer.Option("--filter", help="MLflow's search syntax, passed through: "
                                                "--filter \"metrics.`eval/seen/excess_ce` < 0.3 and "
                                                "params.`model.pos_enc` = 'rope'\".")] = None,
    order_by: Annotated[list[str] | None, typer.Option("--order-by", help="MLflow's order syntax (repeatable): "
                                                       "--order-by \"metrics.`eval/seen/excess_ce` ASC\" "
                                                       "(default: newest first); a metric named here is shown "
                                                       "as a column.")] = None,
    metric: Annotated[list[str] | None, typer.Option("--metric", "-m", help="Show this metric as a column "
                                                     "(repeatable): -m eval/seen/excess_ce.")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="Show this param as a column "
                                                    "(repeatable): -p model.pos_enc.")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only this sweep's runs (its parent and its trials), with its "
                                                   "swept params as columns.")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """The runs, newest first: id, name, experiment, status, kind, start, duration, parent (and the params and metrics
    asked for, one column each; with --sweep, its swept params first)."""
    from .. import api  # lazy: pandas off the CLI's start-up

    df = _api(api.runs, experiment, tracking_uri=tracking_uri, filter_string=filter_ or "", order_by=order_by,
              sweep=sweep)
    swept = sorted(c[len("params.sweep.space."):] for c in df.columns if c.startswith("params.sweep.space.")) \
        if sweep else []  # the parent run's record of the spec's [space]
    params = list(dict.fromkeys([*swept, *(param or [])]))
    keys = list(dict.fromkeys([*(metric or []), *_order_metrics(order_by or [])]))
    cols = [*api.LIST_COLUMNS, *(f"params.{k}" for k in params), *(f"metrics.{k}" for k in keys)]
    shown = df.reindex(columns=cols).head(limit)
    typer.echo(plain_table(cols, shown.values.tolist()))
    typer.echo(f"{len(shown)} of {len(df)} run(s)")


SHOW_INFO = ("run_id", "run_name", "experiment", "status", "kind", "start_time", "end_time", "duration_s", "parent_id")


def _stat(keys, noun: str) -> str:
    """'256 metrics (eval 120, baseline 80, ...)': how many keys, by their first path part, most first (as git show
    --stat says which files changed before the diff)."""
    keys = list(keys)
    by = Counter(k.split("/", 1)[0] if "/" in k else k.split(".", 1)[0] for k in keys)
    parts = ", ".join(f"{g} {n}" for g, n in sorted(by.items(), key=lambda x: (-x[1], x[0])))
    return f"{len(keys)} {noun}" + (f" ({parts})" if parts else "")


@app.command("show")
@user_errors
def runs_show_cmd(
    run_id: Annotated[str, typer.Argument(help="MLflow run id, or a unique prefix of it (at least 6 characters).")],
    keys: Annotated[str | None, typer.Option("--keys", "-k", help="Only the params, metrics and tags whose key "
                                             "matches: a glob (eval/unseen/*, model.*) or, without * ? [, a substring "
                                             "(excess_ce).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """One run, summary first: what it is, how many params, metrics, tags and claims it has (by group), its claims
    (one line each), then its params, metrics (last values) and tags, those --keys matches. MLflow's bookkeeping tags
    (mlflow.*) and the run's lease (hmmscope.lease) are left out."""
    from .. import api  # lazy: pandas off the CLI's start-up

    r = _api(api.run, run_id, tracking_uri=tracking_uri)
    info = r["info"]
    typer.echo(plain_table(["field", "value"], [[k, info[k]] for k in SHOW_INFO]
                           + ([["note", r["tags"]["mlflow.note.content"]]] if "mlflow.note.content" in r["tags"] else [])))
    claims = r["claims"]
    verdicts = claims["verdict"].value_counts() if len(claims) else {}
    typer.echo(f"\nsummary: {_stat(r['params'], 'params')}, {_stat(r['metrics'], 'metrics')}, {len(r['tags'])} tags, "
               f"{len(claims)} claims" + (": " + ", ".join(f"{n} {v}" for v, n in verdicts.items()) if len(claims)
                                          else ""))
    if len(claims):
        typer.echo("claims:")
        for c in claims.itertuples(index=False):
            typer.echo(f"  [{c.verdict}] {c.claim} = {c.value:.4g} [95% CI {c.ci_lo:.4g}, {c.ci_hi:.4g}]; "
                       f"rule {c.rule or '-'}")
    match = api.key_matcher(keys)
    shown = 0
    for title, d in (("params", r["params"]), ("metrics", r["metrics"]), ("tags", r["tags"])):
        picked = sorted(k for k in d if match(f"{title}.{k}"))
        if picked:
            shown += len(picked)
            typer.echo(f"\n{title}:")
            typer.echo(plain_table(["key", "value"], [[k, d[k]] for k in picked]))
    if keys:
        typer.echo(f"\n{shown} key(s) matching {keys!r}")


@app.command("compare")
@user_errors
def runs_compare_cmd(
    run_ids: Annotated[list[str], typer.Argument(help="Two or more MLflow run ids (or unique prefixes of at least "
                                                  "6 characters).")],
    all_: Annotated[bool, typer.Option("--all", help="Every param and metric, not only those that differ.")] = False,
    keys: Annotated[str | None, typer.Option("--keys", "-k", help="Only the keys that match: a glob "
                                             "(eval/*/excess_ce, params.model.*) or, without * ? [, a substring "
                                             "(excess_ce).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Runs side by side: one row per param and metric (those that differ, unless --all; those --keys matches),
    one column per run."""
    from .. import api  # lazy: pandas off the CLI's start-up

    df = _api(api.compare, run_ids, tracking_uri=tracking_uri, differing_only=not all_, keys=keys)
    typer.echo(plain_table(["key", *df.columns], [[k, *row] for k, row in zip(df.index, df.values.tolist(),
                                                                              strict=True)]))
    typer.echo(f"{len(df)} {'row(s)' if all_ else 'row(s) that differ'}" + (f" matching {keys!r}" if keys else ""))


@app.command("gc")
@user_errors
def runs_gc_cmd(
    experiment: Annotated[list[str] | None, typer.Option(help="Only this experiment (repeatable; default all).")] = None,
    dry_run: Annotated[bool, typer.Option(help="List the orphan runs without marking them.")] = False,
    tracking_uri: UriOpt = None,
) -> None:
    """Mark orphan RUNNING runs (their process is gone, or no heartbeat), in the trash too, KILLED, with the reason;
    remove the temp files killed writers left (how many, how large): in runs no live process writes, their copies under
    TMPDIR, under ./out, and a store's interrupted first creation."""
    verb = "would remove" if dry_run else "removed"
    try:
        uri = store_checks.tracking_store(tracking_uri, must_exist=True, write=not dry_run)
    except ConfigError as e:  # no store yet: what a killed first creation of it left goes all the same
        n, size = leftovers.remove_creations(tracking.resolve_uri(tracking_uri), dry_run=dry_run)
        if not n or "nothing was recorded" not in str(e):
            raise
        typer.echo(f"{e}; {verb} {leftovers.describe(n, size)} left by its interrupted creation")
        return
    c = tracking.client(uri)
    unknown = [e for e in experiment or [] if c.get_experiment_by_name(e) is None]
    if unknown:
        fail(f"no experiment {unknown[0]!r} in {uri}")
    try:
        found = tracking.gc_runs(uri, experiments=experiment or None, dry_run=dry_run)
    except Exception as e:  # e.g. a read-only store: say so in one line
        fail(f"cannot mark orphan runs in {uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", 1)
    print_table("orphan runs" + (" (dry run: not marked)" if dry_run else " marked KILLED"),
                [{"run": r.info.run_id, "name": r.info.run_name, "reason": why} for r, why in found])
    typer.echo(f"{len(found)} orphan run(s) {'found' if dry_run else 'marked KILLED'}")
    # what killed writers left half-written (tracking.leftovers): every run but those a live process still writes
    orphans = {r.info.run_id for r, _ in found}
    live = {r.info.run_id for r in tracking.search_runs(uri, filter_string="attributes.status = 'RUNNING'",
                                                         deleted=True)} - orphans
    scope = None if not experiment else {r.info.run_id for e in experiment for r in tracking.search_runs(uri, e)}
    stale = {rid: ps for rid, ps in leftovers.find(uri, scope).items()
             if rid not in live and not leftovers.lock_held(uri, rid)}  # an evaluate under way holds its run's lease
    n, size = leftovers.remove([p for ps in stale.values() for p in ps], dry_run=dry_run)
    out_n, out_size = leftovers.remove(stale_temps("out"), dry_run=dry_run) if Path("out").is_dir() else (0, 0)
    c_n, c_size = leftovers.remove_creations(uri, dry_run=dry_run)
    if not dry_run:
        leftovers.free_locks(uri)
    typer.echo(f"{verb} {leftovers.describe(n + out_n + c_n, size + out_size + c_size)} left by killed writers "
               f"({len(stale)} run(s)" + (f", {out_n} under ./out" if out_n else "")
               + (f", {c_n} of an interrupted store creation" if c_n else "") + ")")
