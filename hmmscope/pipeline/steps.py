"""What a caller of the pipeline (`run.run`) does between its steps: `Steps`, each a no-op here.

Kept apart from `run` (which imports torch and MLflow) so that the command line can subclass it at import time.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tracking import Run
    from ..training.train import TrainResult
    from .analysis import AnalysisResult
    from .evaluation import EvalMetrics


class Steps:
    """What a caller does between the steps of `run` (each a no-op here)."""

    def cleaned(self, run_id: str, count: int, size: int) -> None:
        """Taking a resumed run's lease removed `count` stale temp files (`size` bytes) its killed writers left."""

    def trained(self, res: TrainResult) -> None:
        """Training ended (its run closed), before the evaluation."""

    def evaluating(self) -> contextlib.AbstractContextManager:
        """A context around the evaluation (a spinner)."""
        return contextlib.nullcontext()

    def evaluated(self, run: Run, ev: EvalMetrics) -> None:
        """Figure 1 is logged; `run`: the reopened training run."""

    def analyzing(self) -> None:
        """The analysis begins."""

    def say(self, text: str) -> None:
        """The analysis' progress, a line per phase as it ends."""

    def analyzed(self, an: AnalysisResult) -> None:
        """The analysis run ended."""

    def logged(self, run: Run, metrics: dict[str, float]) -> None:
        """The last step in the reopened training run: the run's metrics (training's final, Figure 1's, the
        analysis')."""
