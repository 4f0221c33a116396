"""`hmmscope runs gc`: housekeeping of MLflow runs (orphan RUNNING runs marked KILLED, with the reason).

Owns: the `runs` command group (`app`) and its output. Finding and marking orphans is `tracking.gc_runs`.

Must not import, at module level, anything beyond typer, the standard library and `cli.common`: mlflow and
`hmmscope.tracking` are imported inside the command body.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .common import UriOpt, fail, print_table, user_errors

app = typer.Typer(no_args_is_help=True, help="Housekeeping of MLflow runs.")


@app.command("gc")
@user_errors
def runs_gc_cmd(
    experiment: Annotated[list[str] | None, typer.Option(help="Only this experiment (repeatable; default all).")] = None,
    dry_run: Annotated[bool, typer.Option(help="List the orphan runs without marking them.")] = False,
    tracking_uri: UriOpt = None,
) -> None:
    """Mark orphan RUNNING runs (their process is gone, or no heartbeat) KILLED, with the reason."""
    from .. import tracking

    uri = tracking.resolve_uri(tracking_uri)
    try:
        found = tracking.gc_runs(uri, experiments=experiment or None, dry_run=dry_run)
    except Exception as e:  # e.g. a read-only store: say so in one line
        fail(f"cannot mark orphan runs in {uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", 1)
    print_table("orphan runs" + (" (dry run: not marked)" if dry_run else " marked KILLED"),
                [{"run": r.info.run_id, "name": r.info.run_name, "reason": why} for r, why in found])
    typer.echo(f"{len(found)} orphan run(s) {'found' if dry_run else 'marked KILLED'}")
