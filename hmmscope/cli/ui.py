"""`hmmscope ui`: the MLflow UI (and optuna-dashboard) on 127.0.0.1 for as long as the command runs.

Owns: the command's options and checks (the stores, free and distinct ports) and what it prints (the URLs once
the servers answer; a failed server's message and the end of its log). Starting, watching and stopping the
servers (process groups, PR_SET_PDEATHSIG, signals, the log file) is `hmmscope.servers`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.checks`,
`hmmscope.config` and `cli.common`: `hmmscope.servers`, `tracking` and `sweep` are imported inside the body.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .. import checks
from ..config import ConfigError
from .common import Spinner, StorageOpt, UriOpt, user_errors


@user_errors
def ui_cmd(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the MLflow UI.")] = 5000,
    optuna: Annotated[bool, typer.Option("--optuna-dashboard", help="Also start optuna-dashboard.")] = False,
    storage: StorageOpt = None,
    dashboard_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of optuna-dashboard.")] = 8080,
    tracking_uri: UriOpt = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 on this project's store (and optuna-dashboard on the studies).

    The URLs are printed once the servers answer; the servers' own output goes to a log file (shown if one
    fails). The servers stop with this command: Ctrl-C, SIGTERM, SIGHUP, or its death (Linux).
    """
    from .. import servers as srv

    uri = checks.tracking_store(tracking_uri)
    if optuna:
        storage = checks.optuna_storage(storage)
    for p_, what in [(port, "--port")] + ([(dashboard_port, "--dashboard-port")] if optuna else []):
        if not srv.port_free(p_):
            raise ConfigError(f"{what} {p_}: the port is in use on 127.0.0.1")
    if optuna and port == dashboard_port:
        raise ConfigError("--port and --dashboard-port must differ")
    from .. import tracking

    tracking.ensure_store(uri)
    servers = [srv.mlflow_ui(uri, port)]
    if optuna:
        servers.append(srv.optuna_dashboard(storage, dashboard_port))
    failed = srv.supervise(
        servers, srv.server_env(),
        starting=Spinner("starting the MLflow UI" + (" and optuna-dashboard" if optuna else "")),
        ready=lambda: typer.echo("  ".join(f"{s.name}: {s.url}" for s in servers) + "  (Ctrl-C to stop)"))
    if failed is not None:
        typer.echo(f"error: {failed.message}; its log ({failed.log_path}) ends:", err=True)
        for line in failed.tail:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(1)
