"""`python -m hmmscope.sweep worker ...`: the worker process run_sweep starts (worker.main), after the environment
check every entry point runs (`env.check`, as the CLI: a bad setting is one line and exit 2, before any work), with
MLflow's telemetry off unless the user chose (`tracking.telemetry`; run_sweep's workers inherit it from their parent,
this covers a direct start)."""

import sys

from .. import env
from ..tracking.telemetry import telemetry_off


def _run() -> int:
    try:
        notes = env.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    for line in notes:
        print(line, file=sys.stderr, flush=True)
    telemetry_off()  # before the worker imports mlflow (inside main)
    from .worker import main  # lazy: after the check (nothing is opened for a bad environment) and telemetry_off

    return main()


sys.exit(_run())
