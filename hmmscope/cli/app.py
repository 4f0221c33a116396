"""The root `hmmscope` app: one-line errors, the --version flag, and every command in the order --help lists.

Owns: `OneLineErrors` (Click's usage errors as one line `error: ...`, exit 2), the root Typer `app` and its
callback, the registration of each command and command group (here, in one place, so the --help order does not
depend on the order of imports), and `main`, the console script's entry point.

Must not import, at module level, anything beyond typer, the standard library, light hmmscope modules (env,
interrupts, tracking.telemetry: tracking imports mlflow only inside functions) and the `cli` command modules (which
themselves import only typer, the standard library and light hmmscope modules): `hmmscope --help` imports no torch,
mlflow, optuna, sklearn or scipy. A command module's function-level imports say, after `# lazy:`, what they keep off
the start-up (CONTRIBUTING's "Start-up time").
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from .. import __version__, env
from ..interrupts import sigterm_interrupts
from ..tracking.telemetry import telemetry_off
from . import bench, headroom, jobs, report, run, runs, sweep, theory, ui
from .common import fail, one_line


class OneLineErrors(TyperGroup):
    """The root group: Click's usage errors become one line `error: ...` (exit 2), not a usage box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        except Exception as e:  # Click's ClickException family (vendored by Typer): format_message + exit_code
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                raise
            if type(e).__name__ == "NoArgsIsHelpError":  # `hmmscope sweep`: the help, as Click shows it
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None and e.exit_code == 2 else ""
            msg = one_line(" ".join(str(e.format_message()).split()))
            typer.echo(f"error: {msg}{hint}", err=True)
            sys.exit(e.exit_code)
        if rv == 130:
            typer.echo("error: interrupted", err=True)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Test what transformers learn from mixtures of low-rank hidden Markov models.")


def _quiet_third_party() -> None:
    """No third-party chatter on a normal run: MLflow's INFO lines when it creates a store's tables."""
    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"hmmscope {__version__}")
        raise typer.Exit()


def _check_environment() -> None:
    """The environment every command reads, checked before any (`env.check`: HMMSCOPE_THREADS and every numeric
    setting in its stated range; no warnings filter that makes every library's warning an error); its notes (a
    HMMSCOPE_THREADS capped at the usable cores) on stderr, one line each."""
    try:
        notes = env.check()
    except ValueError as e:
        fail(str(e))
    for line in notes:
        typer.echo(line, err=True)


@app.callback()
def _root(ctx: typer.Context,
          version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    _check_environment()
    _quiet_third_party()
    # every command: SIGTERM (`kill`, `timeout`, a scheduler) as Ctrl-C, so its clean-up runs (a temp file being
    # written is removed, a run ends KILLED) and it exits 130, never killed half-way with files left behind
    ctx.with_resource(sigterm_interrupts())


# --help lists the commands in this order, then the groups in theirs
app.command()(theory.generate)
app.command()(theory.theory)
app.command("train")(jobs.train_cmd)
app.command("evaluate")(jobs.evaluate_cmd)
app.command("analyze")(jobs.analyze_cmd)
app.command("run")(run.run_cmd)
app.command("headroom")(headroom.headroom_cmd)
app.command("report")(report.report_cmd)
app.command("ui")(ui.ui_cmd)
app.add_typer(bench.app, name="bench")
app.add_typer(sweep.app, name="sweep")
app.add_typer(runs.app, name="runs")


def main() -> None:  # console-script entry point
    telemetry_off()  # before anything imports mlflow; the sweep workers and ui servers inherit it
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
