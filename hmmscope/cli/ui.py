"""`hmmscope ui`: the MLflow UI (and optuna-dashboard) on 127.0.0.1 for as long as the command runs.

Owns: the command's options and checks (the stores, free and distinct ports, the run / sweep / experiment to
show) and what it prints (the URL of what was asked for, on the port the server really listens on, once the
servers answer; a sweep: first its answer, the comparison figure on its parent run, then a second line with
its trials table, whose view (objective and swept params as columns) it saves first as MLflow's shared view;
with --optuna-dashboard, the study's own page; a failed server's message and the end of its log). A folder
with no store is refused unless `--create` (always with --run, --sweep or --experiment: what they name lives in a
store that exists); a sqlite store that goes away while it is served (deleted, its folder moved) stops the command
with one line, and the server never creates it again at its old path (`tracking.server_uri`). Starting, watching
and stopping the servers (process groups, PR_SET_PDEATHSIG, signals, the log file) is `hmmscope.ui.servers`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.store_checks`,
`hmmscope.config`, `hmmscope.checks`, `tracking.store`, `ui.servers` (light: measured, no heavy library) and
`cli.common`: `tracking` (mlflow) and `sweep` (optuna) are imported inside the body.
"""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from .. import checks, store_checks
from ..config import ConfigError
from ..tracking.store import check_experiment_name
from ..ui import servers as srv
from .common import Spinner, StorageOpt, UriOpt, user_errors


def _free_port(preferred: int) -> int:
    """`preferred` if it is free on 127.0.0.1, else one the system hands out."""
    if srv.port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def study_url(base: str, storage: str | None, sweep: str | None) -> str:
    """optuna-dashboard's page of the sweep's study (`/dashboard/studies/<id>`), else its front page."""
    if not sweep:
        return base
    try:
        from ..sweep import load_study  # lazy: optuna (seconds) off the CLI's start-up

        return f"{base}/dashboard/studies/{load_study(sweep, storage)._study_id}"
    except Exception:  # not in this storage: the dashboard lists what it holds
        return base


@user_errors
def ui_cmd(
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port of the MLflow UI (default: 5000 if "
                                             "free, else any free port).")] = None,
    run: Annotated[str | None, typer.Option("--run", help="Print the URL of this run's page (its id, or a unique "
                                            "prefix of at least 6 characters).")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Print the URL of this sweep's answer (the "
                                              "comparison figure on its parent run), then its trials table "
                                              "(objective and swept params as columns).")] = None,
    experiment: Annotated[str | None, typer.Option(
        "--experiment", help="Print the URL of this experiment's runs table.")] = None,
    create: Annotated[bool, typer.Option("--create", help="Serve an empty new store where there is none "
                                         "(without it, a folder with no store is refused).")] = False,
    optuna: Annotated[bool, typer.Option("--optuna-dashboard", help="Also start optuna-dashboard.")] = False,
    storage: StorageOpt = None,
    dashboard_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of optuna-dashboard.")] = 8080,
    tracking_uri: UriOpt = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 on this project's store (and optuna-dashboard on the studies).

    The URL printed opens the run's page, the sweep's answer (then, on a second line, its trials table) or the
    experiment's runs table (MLflow's 'Model training' view), once the server answers; the servers' own output
    goes to a log file (shown if one fails). The servers stop with this command: Ctrl-C, SIGTERM, SIGHUP, or
    its death (Linux).
    """
    if sum(x is not None for x in (run, sweep, experiment)) > 1:
        raise ConfigError("give at most one of --run, --sweep, --experiment")
    if sweep is not None:  # a name as `sweep run` takes it: never rewritten into another sweep's, never empty
        checks.safe_name(sweep, "--sweep")
    if experiment is not None:
        check_experiment_name(experiment)
    target = run is not None or sweep is not None or experiment is not None  # lives in a store: never a new one
    try:
        uri = store_checks.tracking_store(tracking_uri, must_exist=not create or target)
    except ConfigError as e:
        raise ConfigError(f"{e}; run a command that records there first, or give --create to serve an empty "
                          "new store") if not (create or target) and "nothing was recorded" in str(e) else e from None
    if optuna:
        storage = store_checks.optuna_storage(storage)
    explicit = port is not None
    port = port if explicit else _free_port(5000)
    for p_, what in [(port, "--port")] + ([(dashboard_port, "--dashboard-port")] if optuna else []):
        if not srv.port_free(p_):
            raise ConfigError(f"{what} {p_}: the port is in use on 127.0.0.1")
    if optuna and port == dashboard_port:
        raise ConfigError("--port and --dashboard-port must differ")
    from .. import tracking  # lazy: mlflow (~1 s) off the CLI's start-up

    tracking.ensure_store(uri)
    base = f"http://127.0.0.1:{port}"
    extra: list[str] = []
    try:  # before any server starts: an unknown run, sweep or experiment is a one-line error
        if sweep:
            parent = tracking.sweep_parent(uri, sweep)
            if parent is not None:
                tracking.save_sweep_view(uri, parent)  # older sweeps: their trials view (None on a read-only store)
            url, trials = tracking.sweep_urls(uri, base, sweep)
            extra.append(f"trials: {trials}")
        else:
            url = tracking.target_url(uri, base, run_id=run, sweep=sweep, experiment=experiment)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    servers = [srv.mlflow_ui(uri, port)]
    if optuna:
        servers.append(srv.optuna_dashboard(storage, dashboard_port))
    shown = [url] + [study_url(s.url, storage, sweep) for s in servers[1:]]
    db = tracking.store.sqlite_path(uri)
    failed = srv.supervise(
        servers, srv.server_env(), watch=srv.store_watch(db) if db is not None else None,
        starting=Spinner("starting the MLflow UI" + (" and optuna-dashboard" if optuna else "")),
        ready=lambda: typer.echo("\n".join(["  ".join(f"{s.name}: {u}" for s, u in zip(servers, shown, strict=True))
                                            + "  (Ctrl-C to stop)", *extra])))
    if failed is not None and not failed.log_path:  # stopped by the store's watch: one line
        typer.echo(f"error: {failed.message}", err=True)
        raise typer.Exit(1)
    if failed is not None:
        typer.echo(f"error: {failed.message}; its log ({failed.log_path}) ends:", err=True)
        for line in failed.tail:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(1)
