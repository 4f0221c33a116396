"""What every training run of the pipeline measures beside its learning curve: `Measures`, the `training.Monitor`
the pipeline hands `train` (SCIENCE.md 8, 9).

- Before the first step (once per call, a resume too; counted in train/eval_s): the evaluation references (the
  family-Bayes reference over eval.family_tasks tasks and the counting baselines fitted on eval.fit_episodes
  episodes; built when the emergence curves need them, or with fresh tasks for oracle/*), oracle/{loss,acc,
  test_loss,test_acc}: the mixture oracle on the held-out episodes, scored on the same targets as val/*
  (`learning_curve.oracle_metrics`; with fresh tasks, hmm.n_tasks = 0, the family-Bayes reference on the unseen
  episodes; none when eval.family_tasks is 0), and the emergence curves' episodes and references
  (measure/emergence.py; none when train.emergence_episodes is 0). Training logs oracle/loss and oracle/acc at
  step 0 (the test-segment numbers are Figure 1's eval/seen/oracle_mix_test_*) and val/excess_ce = val/test_loss
  - oracle/test_loss at every evaluation.
- At every evaluation: emergence/* (the in-context curves on seen and unseen tasks, a few headline series as
  metrics, the references as constants); the curve points travel in the checkpoint, so a resumed run draws its
  whole history.
- At the end: the curves as the table emergence/curves.json and, unless train.figures is false, their figure
  figures/emergence.{png,pdf}.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..measure.bayes_gap import bayes_spec
from ..measure.emergence import Emergence, curves_table, plot_emergence, prepare
from ..measure.evaluate import anonymous, references
from ..training.learning_curve import oracle_metrics
from ..training.monitor import Monitor


class Measures(Monitor):
    """The pipeline's monitor (module docstring): one per `train` call."""

    prefixes = ("emergence/",)

    def __init__(self) -> None:
        self.cfg: Config | None = None
        self.emergence: Emergence | None = None

    def prepare(self, cfg: Config, mix, ep_eval, device, say: Callable[[str], Any]) -> dict[str, float]:
        self.cfg = cfg
        e = cfg.eval
        family = counting = None
        if cfg.train.emergence_episodes > 0 or mix is None:
            refs = [f"family Bayes over {e.family_tasks:,} tasks" if e.family_tasks else "",
                    f"counting baselines fitted on {e.fit_episodes:,} episodes" if e.fit_episodes else ""]
            if any(refs):
                say(f"the references: {' and '.join(r for r in refs if r)}")
            family, counting = references(cfg.hmm, cfg.data, e)
        # oracle/*: the mixture oracle over the training tasks; with fresh tasks the family-Bayes reference (if on)
        oracle_mix = mix if mix is not None else family
        oracle = {}
        if oracle_mix is not None:
            say(f"the {'mixture oracle' if mix is not None else 'family-Bayes reference'} on {len(ep_eval):,} held-out "
                "episodes")
            oracle = {f"oracle/{k}": v for k, v in oracle_metrics(oracle_mix, ep_eval if mix is not None else anonymous(
                ep_eval), device).items()}
        if cfg.train.emergence_episodes > 0:
            say(f"the emergence curves' references ({cfg.train.emergence_episodes} episodes per task set"
                + (", with the Bayes-optimal reference where the family allows it)" if mix is None and e.bayes else ")"))
        self.emergence = prepare(cfg, mix, ep_eval, device=device, family=family, counting=counting,
                                 bayes=bayes_spec(cfg))
        return oracle

    def measure(self, model, step: int, device) -> tuple[dict[str, float] | None, dict[str, float]]:
        if self.emergence is None:
            return None, {}
        curve = self.emergence.curve(model, device=device)  # kept for the figure and the table; a few series logged
        return {**curve, **self.emergence.references}, self.emergence.headline(curve)

    def finish(self, run, curves: list[dict], title: str) -> None:
        if curves and self.cfg is not None and self.cfg.train.figures:
            with tempfile.TemporaryDirectory() as tmp:
                for f in plot_emergence(curves, os.path.join(tmp, "emergence.png"),
                                        f"{title}: emergence of in-context learning"):
                    run.log_artifact(f, "figures")
        if curves:
            run.log_table(curves_table(curves), "emergence/curves.json")
