"""What an earlier attempt of the main job kept, and which main run a new `hmmscope run` resumes.

A main run carries its identity (IDENTITY_TAG: a hash of its configuration, less the run-time keys, and of its
training sweep's spec), and, as each phase's run opens or finishes, that run's id (PHASE_TAGS). `latest` finds the
newest main run of an identity in an experiment; `read` says, from those tags and the runs' own states, what is kept:
a finished theory run, the training run (finished and evaluated, or interrupted: resumed from its checkpoint if it has
one), a finished analysis run, and the sweep (which resumes itself). `lines` says it in words, for the lines an
interrupted `run` prints above its resume command.

Reads only (through `tracking`); imports config and tracking.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .. import tracking
from ..config import RUNTIME_KEYS, Config, flatten

IDENTITY_TAG = "hmmscope.main_identity"
PHASE_TAGS = {"theory": "hmmscope.theory_run", "train": "hmmscope.train_run", "analysis": "hmmscope.analysis_run",
              "sweep": "hmmscope.sweep_run"}
FIGURE1_KEY = "eval/figure1_s"  # logged by the evaluation's end: a training run carrying it was evaluated
CHECKPOINT = "checkpoints/last.pt"  # training.checkpoints' CKPT_DIR/CKPT_NAME (that module imports torch)


def identity(cfg: Config, sweep_hash: str) -> str:
    """sha256 (16 hex) of what the main job computes: its configuration less the run-time keys (a resume may move it
    to another device), and its training sweep's identity (`SweepSpec.hash`)."""
    canon = {"config": {k: v for k, v in flatten(cfg).items() if k not in RUNTIME_KEYS}, "sweep": sweep_hash}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latest(uri: str, experiment: str, ident: str):
    """The newest main run of identity `ident` in `experiment` (an MLflow run), or None."""
    runs = tracking.search_runs(uri, experiment, filter_string=f"tags.`hmmscope.kind` = 'main' and "
                                                              f"tags.`{IDENTITY_TAG}` = '{ident}'")
    return runs[0] if runs else None


@dataclass
class Kept:
    main_id: str
    status: str  # the main run's: RUNNING (its process is gone or still at it), KILLED, FAILED, FINISHED
    theory_id: str | None = None  # a FINISHED theory run
    train_id: str | None = None  # the training run, in any state
    train_status: str | None = None
    checkpoint: bool = False  # the training run has a checkpoint to resume from
    evaluated: bool = False  # the training run FINISHED with its Figure 1
    analysis_id: str | None = None  # a FINISHED analysis run
    sweep_id: str | None = None  # the training sweep's parent run, once the sweep finished

    @property
    def done(self) -> list[str]:
        """The phases a resume skips, in order (theory, train, evaluate, analysis)."""
        return [p for p, ok in (("theory", self.theory_id), ("train", self.evaluated), ("evaluate", self.evaluated),
                                ("analysis", self.analysis_id)) if ok]


def _run(uri: str, run_id: str | None) -> Any:
    return tracking.get_run(uri, run_id) if run_id else None


def read(uri: str, main) -> Kept:
    """What main run `main` (an MLflow run) kept (module docstring)."""
    tags = main.data.tags
    k = Kept(main.info.run_id, main.info.status)
    th = _run(uri, tags.get(PHASE_TAGS["theory"]))
    if th is not None and th.info.status == "FINISHED":
        k.theory_id = th.info.run_id
    tr = _run(uri, tags.get(PHASE_TAGS["train"]))
    if tr is not None:
        k.train_id, k.train_status = tr.info.run_id, tr.info.status
        k.evaluated = tr.info.status == "FINISHED" and FIGURE1_KEY in tr.data.metrics
        try:
            tracking.Run(uri, tr.info.run_id).require(CHECKPOINT)
            k.checkpoint = True
        except FileNotFoundError:  # tracking.ArtifactNotFound
            k.checkpoint = False
    an = _run(uri, tags.get(PHASE_TAGS["analysis"]))
    if an is not None and an.info.status == "FINISHED" and k.evaluated:
        k.analysis_id = an.info.run_id
    k.sweep_id = tags.get(PHASE_TAGS["sweep"]) or None
    return k


def lines(k: Kept, sweep_name: str) -> list[str]:
    """What is kept, one line per phase, as an interrupted `run` prints it."""
    out = [f"main run {k.main_id}: {k.status}"]
    out.append(f"theory: finished (run {k.theory_id})" if k.theory_id else "theory: not finished; runs again")
    if k.train_id is None:
        out.append("training: not started")
    elif k.evaluated:
        out.append(f"training and Figure 1: finished (run {k.train_id})")
    elif k.checkpoint:
        out.append(f"training: {k.train_status} (run {k.train_id}); resumes from its last checkpoint")
    else:
        out.append(f"training: {k.train_status} (run {k.train_id}) before its first checkpoint; starts again")
    out.append(f"layerwise analysis: finished (run {k.analysis_id})" if k.analysis_id else
               "layerwise analysis: not finished; runs again")
    out.append(f"sweep {sweep_name}: finished (parent run {k.sweep_id})" if k.sweep_id else
               f"sweep {sweep_name}: not finished (a sweep keeps its finished trials and runs the rest)")
    return out
