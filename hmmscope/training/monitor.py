"""What a caller measures beside training: the `Monitor` that `train(..., monitor=)` calls.

Training measures its own learning curve (train/*, val/*). What else a run measures is its caller's: the references
built before the first step, the reference scored on the held-out episodes (oracle/*), and curves measured at every
evaluation and kept in the checkpoint (the pipeline's: `pipeline.measures`, the emergence curves). So training never
imports the measurements, and a step added to what every run measures is added in one place. This base class
measures nothing: a run with train/* and val/* only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Monitor:
    """The hook `train` calls: `prepare` once per call before the first step, `measure` at every evaluation,
    `finish` at the end (each a no-op here)."""

    prefixes: tuple[str, ...] = ()  # the metric keys `measure` logs start so: a finished run resumed replaces them

    def prepare(self, cfg, mix, ep_eval, device, say: Callable[[str], Any]) -> dict[str, float]:
        """The references of a run of `cfg` (`mix`: its training mixture, None with fresh tasks; `ep_eval`: its
        held-out episodes), `say(text)` as each piece begins; returns the oracle/* metrics on `ep_eval` (oracle/loss,
        oracle/acc, oracle/test_loss, oracle/test_acc: oracle/test_loss gives val/excess_ce). Counted as evaluation
        time (train/eval_s)."""
        return {}

    def measure(self, model, step: int, device) -> tuple[dict[str, float] | None, dict[str, float]]:
        """At the evaluation of `step`: (the curve point kept in the checkpoint and handed to `finish`, or None; the
        metrics logged at `step` beside val/*)."""
        return None, {}

    def finish(self, run, curves: list[dict], title: str) -> None:
        """At the end of a call: the run's kept curve points (a resumed run's whole history, each with its "step")
        as artifacts of `run` (a tracking.Run); `title`: the run's name."""
