"""Layerwise linear probes: the paper's Figures 3a and 3b, and belief probes (SCIENCE.md 6). Library only.

Episodes. Probe on episodes from a fixed, seeded subset of tasks with many episodes each
(`episodes.probe_episodes`: 32 tasks x >= 30 episodes at any n_tasks). Probes that need the task
(task id, the within-task state, the baseline) use the `max_tasks` most frequent tasks of `ep` (all of
them for probe episodes); with episodes drawn from the prior at large n_tasks most tasks would have
one or two episodes and no task probe could be trained for them.

Targets at a probed position t of episode i:
- task: task_ids[i] (probed tasks only).
- state: the hidden state s_t *within its task* (Figure 3a; the paper probes the state of a known
  task): one probe per probed task, fitted on that task's training rows, accuracies pooled over tasks.
  State indices are comparable only within a task, so a single probe of the raw index over all tasks
  (`state_pooled`, kept as a secondary row) needs the task to decode the state.
- kback{k}: the token o_{t-k}, only where t-k lies in the test segment (test position >= k).
  Baseline (memory isolated): a lookup table from (task, current token o_t) to the most frequent
  o_{t-k} on the training rows (unseen pairs: the most frequent given o_t, then overall); it knows the
  true task, which the model must infer, so it is generous. o_{t-k} is partly predictable from
  (task, o_t) alone: beating a shuffled-label control is not evidence of memory, beating this is.
  Token statistics: the same lookup from o_t alone (no task), what the current token gives for free;
  "accuracy falls with k" is judged on the probe's excess over it (`claims`). Both baselines need no
  model (`kback_baselines`), so a record whose probe episodes can be rebuilt can recompute them.
- belief: p(s_t | tokens <= t, true task) (inference.task_beliefs), S-dim, all episodes; ridge regression.
  A coordinate means different states in different tasks (as for state_pooled).

The rooms, in the order of a run (each module's docstring has its part of the method):
- `residuals`: which positions are probed, and the residual streams there, layer by layer (torch, lazily).
- `fits`: the split, the shuffled-label controls, the classifiers and ridge, one layer's fits, and the
  worker processes that fit layers in parallel (sklearn; never torch: the workers start without it).
- `claims`: bootstrap CIs, the cross-fitted best layer, and the claims with their verdicts (numpy, scipy).
- `result`: `ProbeResult`, its tables (CSV), JSON and Figure 3.
- `driver`: `run_probes`, which builds the targets and wires the four together.

Importing this package loads sklearn (the fits) but never torch: the spawned fit workers import it, and start
without torch. It must not import anything above it in the pipeline (train, jobs, sweep, cli).
"""

from __future__ import annotations

from ...stats import Claim
from .claims import TargetScores, probe_claims
from .driver import kback_baselines, run_probes
from .fits import split_episodes
from .residuals import Residuals, collect_residuals, sample_positions
from .result import ProbeResult

__all__ = ["Claim", "ProbeResult", "Residuals", "TargetScores", "collect_residuals", "kback_baselines", "probe_claims",
           "sample_positions", "split_episodes", "run_probes"]
