"""`hmmscope report`: the statistical report of a sweep (Markdown + HTML, figures), logged to its parent run.

Owns: the command's options, checks and the summary lines it prints, and the closest sweep's name for an unknown
one ("did you mean ux6-gamma?"). The report itself is `hmmscope.report`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.checks`,
`hmmscope.store_checks` and `cli.common`: the report package (statsmodels, matplotlib, mlflow, optuna) is imported
inside the command body.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, store_checks
from .common import UriOpt, nonempty_path, user_errors


@user_errors
def report_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep (study) name or its MLflow parent run id.")],
    out: Annotated[Path | None, typer.Option(parser=nonempty_path,
                                             help="Folder for report.md / report.html (default out/NAME).")] = None,
    storage: Annotated[str | None, typer.Option("--storage", help="The study's Optuna storage URL (default: "
                                                "optuna.db beside the tracking store, the URL the sweep recorded, "
                                                "./mlruns/optuna.db).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Statistical report of a sweep (Markdown + HTML, figures), also logged to the sweep's parent run."""
    checks.safe_name(sweep, "sweep")
    out = checks.output_dir(out or Path("out") / sweep, "--out", explicit=out is not None)
    uri = store_checks.tracking_store(tracking_uri, must_exist=True)
    from ..report import build_report  # lazy: matplotlib, pandas, statsmodels, mlflow (seconds)

    if storage is not None:
        storage = store_checks.optuna_storage(storage, must_exist=True, write=False)
    try:
        rep = build_report(uri, sweep, out, storage=storage)
    except ValueError as e:  # an unknown name: the closest sweep this store has (`report ux6-gama`)
        close = _closest_sweep(uri, sweep) if str(e).startswith("unknown sweep") else None
        if close is None:
            raise
        raise ValueError(f"{e}; did you mean {close}?") from None
    for line in rep.summary_lines():
        typer.echo(line)
    if (warning := one_df_warning(rep.claims)) is not None:
        typer.echo(warning)


def _closest_sweep(uri: str, name: str) -> str | None:
    """The name of the store's sweep (its parent runs' studies) closest to `name` (difflib), or None."""
    from .. import tracking  # lazy: mlflow (~1 s) off the CLI's start-up

    try:
        names = {r.data.tags.get("hmmscope.study", "") for r in tracking.search_runs(
            uri, filter_string="tags.`hmmscope.kind` = 'sweep'")} - {""}
    except Exception:  # a store that cannot be searched: the error stands as it was
        return None
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return close[0] if close else None


def one_df_warning(claims) -> str | None:
    """One line when a claim's CI is a t interval with 1 degree of freedom (2 seeds, or 2 blocks as the units):
    t(0.975, 1) = 12.7 makes it 6.5 times as wide as a normal interval, so only a large effect gets a verdict."""
    n = sum(getattr(c, "df", None) == 1 for c in claims)
    if not n:
        return None
    return (f"warning: {n} CI{'s are' if n > 1 else ' is a'} t interval{'s' if n > 1 else ''} with 1 degree of freedom "
            "(2 seeds, or 2 blocks): t = 12.7, 6.5 times a normal interval's width; more seeds narrow it (add them to "
            "sweep.seeds and run the sweep again: it grows, keeping its trials)")
