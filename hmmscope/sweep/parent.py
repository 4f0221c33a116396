"""The sweep's parent run kept up to date as trials end (the worker module's docstring): its counts (sweep/<state>)
and the best trial so far at the step of each finished trial (`status.finish_order`), the best trial's tags, and the
comparison figure and pivot table (compare.py). A failure is one line, never the sweep's. Imports `status`,
`compare` and tracking.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .. import tracking
from .compare import FOLDER, log_comparison
from .spec import SweepSpec
from .status import best_trial, counts, finish_order


def refresh_parent(uri: str, spec: SweepSpec, study, parent: str, log: Callable[[str], object], *,
                   run=None, quiet: bool = False, trial: int | None = None, compare: bool = True) -> dict[str, int]:
    """Bring the parent run up to date (module docstring): the counts and the best trial at the step of `trial`
    (the trial that just ended: its place in the finish order), or, with no `trial`, at the last step unless it
    is there already; the comparison. Returns the counts now. A failure is one line (`log`), never the sweep's;
    `quiet`: no line for a comparison written (a worker calls this after every trial); `compare`: draw it."""

    c = counts(study)
    try:
        run = run or tracking.existing_run(uri, parent)
        order = finish_order(study)
        if trial is not None:
            step = order.index(trial) + 1 if trial in order else None
        else:  # run_sweep's own last word, unless a worker said it
            logged = {m.step for m in tracking.client(uri).get_metric_history(run.run_id, "sweep/complete")}
            step = len(order) if order and len(order) not in logged else None
        if step is not None:
            upto = set(order[:step])
            run.log_metrics({f"sweep/{k}": v for k, v in counts(study, finished=upto).items()}, step=step)
            then = best_trial(study, among=upto)
            if then is not None:
                run.log_metrics({"sweep/best_value": then.value, "sweep/best_trial": then.number}, step=step)
        best = best_trial(study)
        if best is not None:
            run.set_tags({"hmmscope.best_params": json.dumps(best.params),
                          "hmmscope.best_run": best.user_attrs.get("mlflow_run_id", "")})
    except Exception as e:  # e.g. a read-only store: the trials' results stand without the parent's summary
        log(f"sweep {spec.name!r}: parent run not updated: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return c
    if compare:
        draw_comparison(run, spec, study, log, quiet=quiet)
    return c


def draw_comparison(run, spec: SweepSpec, study, log: Callable[[str], object], quiet: bool = False) -> None:
    """The parent run's comparison figure and pivot table (compare.py); a failure is one line, never the sweep's
    (`quiet`: no line when it worked)."""
    def metrics_of(run_id: str) -> dict[str, float]:  # a trial's run's metrics: the oracle's reference line
        r = tracking.get_run(run.uri, run_id)
        return dict(r.data.metrics) if r is not None else {}

    try:
        if log_comparison(run, spec, study, metrics_of=metrics_of) is not None and not quiet:
            log(f"sweep {spec.name!r}: comparison figure and pivot table logged to the parent run ({FOLDER}/)")
    except Exception as e:  # e.g. a read-only store: the sweep's results stand without the figure
        log(f"sweep {spec.name!r}: comparison not logged: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

