"""What training builds before its first step, each piece said as it begins (`train(..., setup=say)`).

At the `tiny` preset the setup is seconds; at the paper's, or on a busy machine, minutes: the episodes, the evaluation
references (family Bayes over eval.family_tasks tasks, the counting baselines fitted on eval.fit_episodes episodes),
the mixture oracle on the held-out episodes, the emergence curves' references. `build` makes them in that order and
calls `say(text)` as each begins, so a terminal's spinner or a log file says where the setup is (before: minutes of
silence between "training ..." and the first step). The model itself is built by `train`, which says so too.

Imports data, measure and oracles only (no MLflow: the run is `train`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..data.episodes import Episodes, training_data
from ..measure.bayes_gap import bayes_spec
from ..measure.emergence import Emergence
from ..measure.emergence import prepare as prepare_emergence
from ..measure.evaluate import anonymous, references


@dataclass
class Setup:
    mix: Any  # the training mixture; None with fresh tasks (hmm.n_tasks = 0)
    ep_train: Episodes
    ep_eval: Episodes
    oracle: dict[str, float]  # oracle/*: the mixture oracle (fresh tasks: family Bayes) on the held-out episodes
    emergence: Emergence | None
    references_s: float  # the references' seconds (family Bayes, counting, oracle, emergence): evaluation's cost


def build(cfg: Config, device, oracle_metrics: Callable, say: Callable[[str], Any] | None = None) -> Setup:
    """The data and references of a training run of `cfg` on `device` (module docstring). `oracle_metrics(mix, ep,
    device)` scores a mixture on episodes (train.oracle_metrics); `say(text)` as each piece begins."""
    say = say or (lambda text: None)
    h, d, e = cfg.hmm, cfg.data, cfg.eval
    tasks = "fresh tasks (one per episode)" if h.n_tasks == 0 else f"a mixture of {h.n_tasks} tasks"
    say(f"drawing the data: {d.n_train:,} training and {d.n_eval:,} held-out episodes of {tasks}")
    mix, ep_train, ep_eval, _ = training_data(h, d)  # mix None with fresh tasks (hmm.n_tasks = 0)
    t0 = time.perf_counter()
    family = counting = None
    if cfg.train.emergence_episodes > 0 or mix is None:
        refs = [f"family Bayes over {e.family_tasks:,} tasks" if e.family_tasks else "",
                f"counting baselines fitted on {e.fit_episodes:,} episodes" if e.fit_episodes else ""]
        if any(refs):
            say(f"the references: {' and '.join(r for r in refs if r)}")
        family, counting = references(h, d, e)
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
            + (", with the Bayes-optimal reference where the family allows it)" if mix is None and cfg.eval.bayes else ")"))
    emergence = prepare_emergence(cfg, mix, ep_eval, device=device, family=family, counting=counting,
                                  bayes=bayes_spec(cfg))
    return Setup(mix, ep_train, ep_eval, oracle, emergence, time.perf_counter() - t0)
