"""The main job: theory sweep, training, Figure 1, the layerwise analysis, a small training sweep and its report.

Each phase tells a `Phases` display as it begins (`start`), what it does meanwhile (`step`: the theory's settings and
HMM draws, training's setup pieces, the analysis' phases; `step(None)` when the phase's own bar takes the terminal:
the training loop's, the sweep's) and its one-line result as it ends (`done`): counts, run ids and seconds, never a
number the summary prints again. The default display says nothing (a library call, a test).

Resume (`main_job(..., resume=MAIN_RUN_ID)`, `kept`): the main run is reopened and every phase whose run finished is
skipped (`Phases.skip`, its results read back from its run: Figure 1's metrics, claims and regime, the claims of the
theory and the analysis); an interrupted training run continues from its checkpoint; the sweep resumes itself. The
training model, when the analysis still has to run and training did not run now, is loaded from that checkpoint.

Files go to out/main-<id8>/ (`safe_output.run_folder`): theory/, the training run's folder (evaluation/, analysis/) and <sweep
name>/ (the report). Training, Figure 1 and the analysis are one run of the pipeline (`run.run`, the analysis after
the training run ends: a phase resumed on its own); the theory sweep is `hmmscope.jobs`'; the sweep is handed in
(`sweep(spec, report_dir) -> (summary, report)`: the CLI's, with its progress display).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tracking
from ..config import Config, flatten
from ..jobs import theory_job
from ..safe_output import run_folder
from ..stats import Claim
from ..tracking.claims import claim_rows
from ..training.train import TrainResult
from .analysis import AnalysisResult, analyze_run
from .evaluation import EvalMetrics
from .kept import IDENTITY_TAG, PHASE_TAGS, Kept, identity, read
from .run import run
from .steps import Steps

# The main job's training sweep; the same spec as sweeps/smoke.toml (a test keeps the two identical).
MAIN_SWEEP = """
[sweep]
name = "smoke"
base = "tiny"
kind = "train"
objective = "eval/seen/excess_ce"
direction = "minimize"
sampler = "grid"
seeds = [0]
experiment = "hmmscope-sweeps"

[fixed]
"hmm.n_tasks" = 8
"hmm.n_states" = 8
"hmm.rank" = 4
"data.n_demos" = 2
"data.l_demo" = 16
"data.l_test" = 16
"data.n_train" = 512
"data.n_eval" = 64
"model.n_layers" = 1
"model.n_heads" = 2
"model.d_model" = 32
"model.d_mlp" = 64
"model.max_len" = 64
"train.steps" = 100
"train.batch_size" = 16
"train.warmup" = 10
"train.eval_every" = 50
"train.ckpt_every" = 100
"train.device" = "cpu"

[space]
"model.pos_enc" = {grid = ["rope", "absolute"]}
"hmm.gamma" = {grid = [0.5, 0.9]}
"""

PHASES = ("theory sweep (Theorem 1)", "training", "Figure 1", "layerwise analysis (Figures 2, 3a, 3b)",
          "training sweep and its report")


class Phases:
    """What the main job tells as it goes (module docstring); this one says nothing."""

    def start(self, index: int, title: str) -> None:
        """Phase `index` (0-based, of len(PHASES)) begins."""

    def step(self, text: str | None) -> None:
        """What the phase does now; None: its own progress display takes over until `done`."""

    def done(self, text: str) -> None:
        """The phase's one-line result, as it ends."""

    def skip(self, index: int, title: str, text: str) -> None:
        """Phase `index` finished in an earlier attempt of this main run: `text` says which run holds it."""


@dataclass
class MainResult:
    parent_id: str
    train_id: str
    theory_id: str | None
    eval_metrics: EvalMetrics  # Figure 1 headline metrics, with .claims (the retrieval gap) and .files
    theory: Any  # theory.TheoryResult, or None when the theory phase was kept from an earlier attempt
    analysis: AnalysisResult
    sweep: Any  # sweep.SweepSummary
    report: Any  # report.Report
    folder: Path | None = None  # out/main-<id8>/: every file this job wrote
    theory_claims: list = field(default_factory=list)  # the sweep-level Theorem 1 claims (stats.Claim)
    skipped: list[str] = field(default_factory=list)  # the phases kept from an earlier attempt (Kept.done)


def seconds(s: float) -> str:
    """A duration as a person reads it: 42 s, 3 min 12 s, 1 h 05 min."""
    s = int(round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s // 60 % 60:02d} min"


def tally(claims) -> str:
    """'12 claims: 9 supported, 3 inconclusive'."""
    verdicts = sorted({c.verdict for c in claims})
    return f"{len(claims)} claim{'' if len(claims) == 1 else 's'}" + (
        ": " + ", ".join(f"{sum(c.verdict == v for c in claims)} {v}" for v in verdicts) if verdicts else "")


def _number(v: Any) -> float:
    return math.nan if v is None else float(v)


def run_claims(uri: str, run_id: str) -> list[Claim]:
    """A finished run's claims, read back from its claims.json."""
    return [Claim(name=str(r["claim"]), statistic=str(r.get("statistic") or ""), value=_number(r.get("value")),
                  ci_lo=_number(r.get("ci_lo")), ci_hi=_number(r.get("ci_hi")), verdict=str(r["verdict"]),
                  reason=str(r.get("reason") or ""), rule=str(r.get("rule") or ""))
            for r in claim_rows(uri, tracking.get_run(uri, run_id))]


def _evaluation(uri: str, run_id: str) -> EvalMetrics:
    """Figure 1 of a training run evaluated in an earlier attempt: its metrics, claims and regime, read back."""
    run = tracking.get_run(uri, run_id)
    ev = EvalMetrics(run.data.metrics)
    ev.files, ev.claims, ev.regime = [], run_claims(uri, run_id), run.data.tags.get("hmmscope.regime", "undetermined")
    return ev


class _TrainSteps(Steps):
    """Phases 2-4 as the pipeline's steps: training, Figure 1 and the analysis, each begun, said and done."""

    def __init__(self, phases: Phases, parent: tracking.Run, cfg: Config, again: str | None):
        self.phases, self.parent, self.cfg, self.again, self.t0 = phases, parent, cfg, again, 0.0

    def begin(self, i: int) -> float:
        self.phases.start(i, PHASES[i])
        return time.perf_counter()

    def trained(self, res: TrainResult) -> None:
        loss, again = res.metrics.get("val/loss"), self.again
        self.phases.done(f"{res.steps} steps in {seconds(time.perf_counter() - self.t0)}"
                         + (f" (resumed from run {again[:8]}'s checkpoint)" if again else "")
                         + (f"; val loss {loss:.4f}" if loss is not None else "") + f" (run {res.run_id[:8]})")
        self.t0 = self.begin(2)
        self.phases.step(f"Figure 1: the model, the oracles and the baselines on {self.cfg.data.n_eval:,} episodes "
                         f"{'each of seen and unseen' if self.cfg.hmm.n_tasks else 'of unseen'} tasks")

    def evaluated(self, run: tracking.Run, ev: EvalMetrics) -> None:
        self.parent.log_metrics(ev)
        self.phases.done(f"{tally(ev.claims)}; regime {ev.regime} ({seconds(time.perf_counter() - self.t0)})")

    def analyzing(self) -> None:
        self.t0 = self.begin(3)

    def say(self, text: str) -> None:
        self.phases.step(text)

    def analyzed(self, an: AnalysisResult) -> None:
        self.parent.set_tags({PHASE_TAGS["analysis"]: an.run_id})
        self.phases.done(f"{tally(an.claims)} in {seconds(time.perf_counter() - self.t0)} (run {an.run_id[:8]})")


def main_job(cfg: Config, uri: str, experiment: str, out: Path, *, sweep_spec: Any,
             sweep: Callable[[Any, Path], tuple[Any, Any]], progress: bool = True, phases: Phases | None = None,
             on_start: Callable[[str], None] = lambda run_id: None, resume: str | None = None) -> MainResult:
    """The main job (module docstring): theory sweep, training + Figure 1, layerwise analysis, a small training sweep.

    Figure 1 and the analysis take the model training hands back, in memory (no checkpoint is read back). Theory,
    training and analysis runs sit under one parent run "main" (tagged with its `kept.identity`, and with each phase's
    run id as it opens or ends: `kept.PHASE_TAGS`); the sweep has its own parent run (one child per trial), and its
    report is logged there. `sweep(sweep_spec, report_dir)` runs the training sweep and writes its report under
    `report_dir`, returning (sweep summary, report). `on_start(main run id)` as soon as the main run is open;
    `resume`: a main run of the same identity to continue (`kept.latest`). At the end the main run's description links
    the sweep's parent run and its answer (comparison/objective.png), as Markdown the UI renders."""
    phases = phases or Phases()
    ident = identity(cfg, sweep_spec.hash)
    k = Kept("", "")
    if resume is not None:
        main = tracking.get_run(uri, resume)
        if main is None or main.data.tags.get(IDENTITY_TAG) != ident:
            raise ValueError(f"run {resume} is not a main run of this configuration (its {IDENTITY_TAG} differs)")
        k = read(uri, main)
    note = (f"Main job: Theorem 1 theory sweep, training + Figure 1, layerwise analysis, and the training sweep "
            f"{sweep_spec.name!r} with its report")
    opened = tracking.start_run(uri, experiment, "main", resume=resume) if resume else tracking.start_run(
        uri, experiment, "main", params=flatten(cfg), tags={"hmmscope.kind": "main", IDENTITY_TAG: ident}, config=cfg,
        note=note)
    with opened as parent:
        on_start(parent.run_id)
        out = run_folder(out, "main", parent.run_id)  # this job's folder: nothing else writes there
        th, theory_id, theory_claims = _theory(cfg, uri, experiment, out, parent, phases, k)
        train_id, ev, an = _trained(cfg, uri, experiment, out, parent, phases, k, progress)
        # 5. the training sweep (it resumes itself) and its report
        phases.start(4, f"training sweep {sweep_spec.name!r} and its report")
        t0 = time.perf_counter()
        sw, rep = sweep(sweep_spec, out / sweep_spec.name)
        parent.set_tags({PHASE_TAGS["theory"]: theory_id or "", PHASE_TAGS["train"]: train_id,
                         PHASE_TAGS["analysis"]: an.run_id, PHASE_TAGS["sweep"]: sw.parent_run_id})
        phases.done(f"sweep {sw.study_name}: {sw.complete} complete, {sw.failed} failed, {sw.pruned} pruned of "
                    f"{sw.n_trials}{' (already complete)' if sw.already_complete else ''}, and its report, in "
                    f"{seconds(time.perf_counter() - t0)} (parent run {sw.parent_run_id[:8]})")
        with contextlib.suppress(Exception):  # the answer first, then the sweep's parent, one click away on the main
            seid = tracking.get_run(uri, sw.parent_run_id).info.experiment_id  # run's page; its own words last
            links = (f"sweep {sweep_spec.name!r}: its answer [{tracking.ANSWER}]("
                     f"{tracking.run_link(seid, sw.parent_run_id, tracking.ANSWER)}), its parent run "
                     f"[sweep-{sweep_spec.name}]({tracking.run_link(seid, sw.parent_run_id)})")
            room = 500 - len(links) - 3  # the description's cap (tracking.note_line): the links are never cut
            answer = rep.answer if len(rep.answer) <= room else rep.answer[:room - 1] + "…"
            parent.set_tags({"mlflow.note.content": tracking.note_line(
                f"{answer + ' — ' if answer else ''}{links}. {note}")})
        return MainResult(parent.run_id, train_id, theory_id, ev, th, an, sw, rep, out, theory_claims, k.done)


def _theory(cfg: Config, uri: str, experiment: str, out: Path, parent: tracking.Run, phases: Phases, k: Kept):
    """1. The Theorem 1 sweep, or the one an earlier attempt finished: (result or None, run id, claims)."""
    if k.theory_id:
        phases.skip(0, PHASES[0], f"finished before (run {k.theory_id})")
        return None, k.theory_id, run_claims(uri, k.theory_id)
    phases.start(0, PHASES[0])
    t0 = time.perf_counter()
    th, theory_id = theory_job(cfg.theory, out / "theory", uri=uri, experiment=experiment, parent=parent.run_id,
                               progress=lambda i, n, label: phases.step(f"theory: {i}/{n} settings, {label}"),
                               detail=lambda text: phases.step(f"theory: {text}"))
    parent.set_tags({PHASE_TAGS["theory"]: theory_id})
    claims = list(th.verdicts)
    phases.done(f"{len(th.settings)} setting{'s' if len(th.settings) > 1 else ''} x {cfg.theory.draws} HMM "
                f"draws in {seconds(time.perf_counter() - t0)}; {tally(claims)} (run {theory_id[:8]})")
    return th, theory_id, claims


def _trained(cfg: Config, uri: str, experiment: str, out: Path, parent: tracking.Run, phases: Phases, k: Kept,
             progress: bool) -> tuple[str, EvalMetrics, AnalysisResult]:
    """2-4. Training, Figure 1 on the model in hand and the analysis after the training run ends: one run of the
    pipeline (an interrupted training run resumed from its checkpoint); or what an earlier attempt finished, the
    analysis then run on the training run's checkpoint unless it finished too. (training run id, Figure 1, analysis)"""
    steps = _TrainSteps(phases, parent, cfg, k.train_id if k.checkpoint else None)
    if not k.evaluated:
        again = steps.again  # from its checkpoint; else a new training run
        steps.t0 = steps.begin(1)
        done = run(cfg, uri=uri, experiment=experiment, run_name=tracking.train_run_name(cfg), parent=parent.run_id,
                   progress=progress, resume=again, out=out, analysis="after",
                   setup=lambda piece: phases.step(None if piece is None else f"train: setting up: {piece}"),
                   on_start=None if again else lambda rid: parent.set_tags({PHASE_TAGS["train"]: rid}),
                   steps=steps)
        return done.trained.run_id, done.evaluation, done.analysis
    for i in (1, 2):
        phases.skip(i, PHASES[i], f"finished before (run {k.train_id})")
    ev = _evaluation(uri, k.train_id)
    if k.analysis_id:
        phases.skip(3, PHASES[3], f"finished before (run {k.analysis_id})")
        return k.train_id, ev, AnalysisResult(k.analysis_id, run_claims(uri, k.analysis_id), {}, {}, [])
    steps.analyzing()
    an = analyze_run(uri, k.train_id, device=cfg.train.device, out=out, progress=steps.say)  # its checkpoint's model
    steps.analyzed(an)
    return k.train_id, ev, an
