"""`hmmscope run`: the main job (`hmmscope.pipeline`), every phase visible, resumable, short on a terminal.

Owns: the command's options (`--quick`, `--resume`, `--fresh`, `--verbose`), its checks before work, `PhaseDisplay`
(what the job's phases say: on a terminal a spinner per phase, with what it does now, handing the terminal to
training's bar and the sweep's; off one a time-stamped line per phase and per step on stderr; each phase's one-line
result on stdout as it ends), which main run to resume, what an interrupt prints (the kept runs and the command that
resumes them), and the summary: one line per claim (name, estimate [CI], verdict; `--verbose`: with its statistic and
reason, and the Theorem 1 table), no number twice, then the browse lines and the sweep's answer.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.config`, `hmmscope.checks`,
`hmmscope.store_checks`, `pipeline.quick` (plain sizes) and the `cli` helpers (`common`, `jobs`, `sweep`): torch,
mlflow, optuna and the pipeline are imported inside the command (`# lazy:`).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, env, store_checks
from ..checks import memory_estimate, train_flops
from ..config import ConfigError
from ..pipeline.quick import QUICK, QUICK_SWEEP, QUICK_SWEEP_SETS
from .common import (
    ConfigOpt,
    DeviceOpt,
    ExpOpt,
    ForceOpt,
    Preset,
    PrintConfigOpt,
    SetOpt,
    Spinner,
    UriOpt,
    build_config,
    console,
    echo_config,
    nonempty_path,
    print_claims,
    print_table,
    progress_echo,
    user_errors,
)
from .jobs import print_answer, regime_line
from .sweep import SweepProgress

N_PHASES = 5  # pipeline.job.PHASES (that module imports torch)


class PhaseDisplay:
    """The main job's `pipeline.job.Phases` (module docstring). `tty`: stderr is a terminal (default: asked)."""

    def __init__(self, n: int = N_PHASES, *, tty: bool | None = None, echo=None, out=None):
        self.n, self.tty = n, sys.stderr.isatty() if tty is None else tty
        self.echo, self.out = echo or progress_echo, out or typer.echo
        self.index, self.title, self._status, self.t0 = 0, "", None, time.monotonic()

    def head(self) -> str:
        return f"[{self.index + 1}/{self.n}] {self.title}"

    def _show(self, text: str) -> None:
        if self._status is None:
            con = console(stderr=True)
            width = max(20, (con.width or 80) - 4)
            self._status = con.status(text[:width], spinner="dots")
            self._status.__enter__()
        else:
            self._status.update(text[:max(20, (self._status.console.width or 80) - 4)])

    def close(self) -> None:
        status, self._status = self._status, None
        if status is not None:
            status.__exit__(None, None, None)

    def start(self, index: int, title: str) -> None:
        self.close()
        self.index, self.title, self.t0 = index, title, time.monotonic()
        if self.tty:
            self._show(self.head())
        else:
            self.echo(f"{self.head()} ...")

    def step(self, text: str | None) -> None:
        if text is None:  # the phase's own bar takes the terminal
            self.close()
        elif self.tty:
            self._show(f"{self.head()}: {text}")
        else:
            self.echo(text)

    def done(self, text: str) -> None:
        self.close()
        self.out(f"{self.head()}: {text}")

    def skip(self, index: int, title: str, text: str) -> None:
        self.close()
        self.index, self.title = index, title
        self.out(f"{self.head()}: {text}")


def again_command(preset: str, config: Path | None, sets: list[str] | None, device: str | None, out: Path,
                  workers: int | None, tracking_uri: str | None, experiment: str, quick: bool) -> str:
    """The command that resumes this main job: the same options and --resume."""
    cmd = ["hmmscope", "run", *(["--quick"] if quick else []), *(["--preset", preset] if preset != "tiny" else [])]
    cmd += ["--config", str(config)] if config is not None else []
    cmd += [a for kv in sets or [] for a in ("--set", kv)]
    cmd += ["--device", device] if device is not None else []
    cmd += ["--out", str(out)] if out != Path("out") else []
    cmd += ["--workers", str(workers)] if workers is not None else []
    cmd += ["--tracking-uri", tracking_uri] if tracking_uri is not None else []
    cmd += ["--experiment", experiment] if experiment != "hmmscope" else []
    return shlex.join([*cmd, "--resume"])


def print_kept(uri: str, main_id: str, sweep_name: str, again: str) -> None:
    """After an interrupt: what the main run kept (pipeline.kept.lines) and the command that resumes it, on stderr."""
    from .. import tracking  # lazy: mlflow (seconds) off the CLI's start-up
    from ..pipeline.kept import lines, read  # lazy: mlflow (through tracking)

    try:
        kept = lines(read(uri, tracking.get_run(uri, main_id)), sweep_name)
    except Exception as e:  # the store unreadable now: the resume command still holds
        kept = [f"main run {main_id} (what it kept could not be read: {str(e).splitlines()[0] if str(e) else e!r})"]
    typer.echo("interrupted; kept:", err=True)
    for line in kept:
        typer.echo(f"  {line}", err=True)
    typer.echo(f"resume (the finished phases are skipped): {again}", err=True)


@user_errors
def run_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    out: Annotated[Path, typer.Option(parser=nonempty_path, help="Folder for figures, JSON and the sweep report.")] = \
        Path("out"),
    workers: Annotated[int | None, typer.Option(min=1, help="Worker processes for the training sweep (default 2; "
                                                "with --quick 1).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Every phase at a size that runs in about a minute on one "
                                        "idle core (pipeline/quick.py: the same phases, files and links; its sweep "
                                        "is smoke-quick; one torch thread unless HMMSCOPE_THREADS says). After "
                                        "--config, before --set.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the newest main run of this configuration in the "
                                         "experiment, skipping its finished phases (re-running `run` does this by "
                                         "itself when that run did not finish); refused if there is none.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start a new main run even if one of this configuration was "
                                        "interrupted.")] = False,
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope",
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Each claim with its statistic and reason, and the "
                                          "Theorem 1 table (else one short line per claim).")] = False,
) -> None:
    """The main job: theory sweep, training + Figure 1, layerwise analysis, a small training sweep and its report.

    Prints its main run's id and browse line at once; then, per phase, a spinner on a terminal (training's and the
    sweep's own bars) or time-stamped lines off one, and each phase's one-line result as it ends; at the end one line
    per claim, the browse lines (the main run, the sweep), the sweep's answer and its report's HTML. Ctrl-C keeps what
    finished and prints the command that resumes it; re-running `run` resumes an interrupted main run by itself."""
    if quick and preset_ != Preset.tiny:
        raise ConfigError("--quick is a size of its own (the tiny preset, smaller): give it without --preset")
    if resume and fresh:
        raise ConfigError("--resume and --fresh: give one")
    cfg = build_config(preset_, config, set_, {**(QUICK if quick else {}), "train.device": device})
    if print_config:
        return echo_config(cfg)
    checks.output_dir(out, "--out", explicit=out != Path("out"))
    from ..tracking.store import check_experiment_name  # lazy: tracking imports mlflow (seconds)

    check_experiment_name(experiment)
    uri = store_checks.tracking_store(tracking_uri)
    store_checks.optuna_storage(None)  # the main job's sweep uses the default storage
    spec, prev = _start(cfg, uri, experiment, quick=quick, fresh=fresh, force=force)
    from .. import tracking  # lazy: mlflow, torch, the pipeline (loaded by _start by now) off the start-up
    from ..interrupts import sigterm_interrupts  # lazy: with the pipeline's imports (torch, mlflow)
    from ..pipeline.job import main_job  # lazy: torch, mlflow, the measurements (seconds)

    if resume and prev is None:
        raise ConfigError(f"--resume: no main run of this configuration in experiment {experiment!r} (give the options "
                          "the interrupted run had: --quick, --preset, --config, --set)")
    target = prev.info.run_id if prev is not None and (resume or prev.info.status != "FINISHED") else None
    workers = workers or (1 if quick else 2)
    display = PhaseDisplay()

    main_id: list[str] = []

    def started(rid: str) -> None:
        main_id.append(rid)
        word = "resumed" if target else "started"
        typer.echo(f"main run {rid} {word}; {tracking.browse_line(uri, run_id=rid)}")

    try:
        with sigterm_interrupts():
            res = main_job(cfg, uri, experiment, out, sweep_spec=spec, sweep=_sweep_and_report(uri, workers, display),
                           progress=True, phases=display, on_start=started, resume=target)
    except KeyboardInterrupt:
        display.close()
        if main_id:
            print_kept(uri, main_id[0], spec.name, again_command(
                str(preset_.value), config, set_, device, out, workers if workers != (1 if quick else 2) else None,
                tracking_uri, experiment, quick))
        raise
    finally:
        display.close()
    summary(res, cfg, uri, verbose=verbose)


def quick_sweep(spec):
    """The quick main job's training sweep: `spec` (the main job's, `MAIN_SWEEP` parsed) as pipeline.quick's
    QUICK_SWEEP, with QUICK_SWEEP_SETS in its [set] table."""
    from ..sweep.rename import renamed  # lazy: the sweep layer (optuna) off the CLI's start-up
    from ..sweep.spec import with_sets  # lazy: the sweep layer (mlflow)

    return with_sets(renamed(spec, QUICK_SWEEP), QUICK_SWEEP_SETS)


def _start(cfg, uri: str, experiment: str, *, quick: bool, fresh: bool, force: bool):
    """Under a spinner (the imports take seconds, a minute when busy): the device, memory and time checks, the main
    sweep's spec, the store, and the newest main run of this configuration (None with `fresh`). (spec, that run)
    Off a terminal the checks say nothing: a bad input is one error line; the store's part says its line."""
    with Spinner("starting: torch and the checks"):  # a terminal's spinner only (cleared): see the docstring
        from ..training.train import resolve_device  # lazy: torch (~1 s)

        dev = resolve_device(cfg.train.device)
        if quick and env.threads() is None:  # its models are tiny: one torch thread is as fast, and on a busy machine
            import torch  # lazy: imported by now; more threads only spin (measured: twice the CPU time beside others)

            torch.set_num_threads(1)
        for job in ("theory", "train", "analyze"):  # the stages run one after another
            checks.memory(memory_estimate(cfg, job), device=str(dev), force=force, what=f"the {job} stage")
        checks.duration(train_flops(cfg), device=str(dev), force=force,
                        what=f"the train stage's {cfg.train.steps:,} steps")
    with Spinner("starting: MLflow and the store", plain="run"):
        from .. import tracking  # lazy: mlflow, torch and the pipeline (seconds) off the CLI's start-up
        from ..pipeline.job import MAIN_SWEEP  # lazy: torch, mlflow, the measurements (seconds)
        from ..pipeline.kept import identity, latest  # lazy: mlflow (through tracking)
        from ..sweep.spec import parse_spec  # lazy: the sweep layer (mlflow)

        spec = parse_spec(MAIN_SWEEP, "hmmscope.pipeline.job.MAIN_SWEEP")
        spec = quick_sweep(spec) if quick else spec
        tracking.ensure_store(uri)
        return spec, None if fresh else latest(uri, experiment, identity(cfg, spec.hash))


def _sweep_and_report(uri: str, workers: int, display: PhaseDisplay):
    """The main job's `sweep`: the sweep, with its own bar, then its report."""
    from .. import tracking  # lazy: mlflow, optuna and the report (seconds) off the CLI's start-up
    from ..report import build_report  # lazy: the report (pandas, statsmodels, matplotlib)
    from ..sweep import run_sweep  # lazy: the sweep layer (optuna)

    def sweep_and_report(spec, report_dir):
        display.step(None)
        typer.echo(f"sweep {spec.name}: {tracking.browse_line(uri, sweep=spec.name)}")
        progress_echo(f"sweep {spec.name}: {spec.n_trials} trials, {workers} worker process{'es' if workers > 1 else ''}"
                      " starting")
        with SweepProgress(spec.name, spec.n_trials) as bar:
            sw = run_sweep(spec, workers=workers, uri=uri, log=bar.log, progress=bar)
            bar({"complete": sw.complete, "pruned": sw.pruned, "failed": sw.failed, "running": 0}, sw.n_trials)
        display.step(f"report: the sweep's statistics and figures into {report_dir}")
        return sw, build_report(uri, sw.parent_run_id, report_dir, storage=sw.storage)

    return sweep_and_report


def summary(res, cfg, uri: str, *, verbose: bool = False) -> None:
    """The main job's last lines (module docstring)."""
    from .. import tracking  # lazy: mlflow (seconds) off the CLI's start-up

    m = res.eval_metrics
    typer.echo("")
    if "eval/seen/test_acc" in m:
        typer.echo(f"Figure 1 (test segment, {cfg.data.n_demos} demonstrations, seen tasks): model acc "
                   f"{m['eval/seen/test_acc']:.3f}, mixture oracle {m['eval/seen/oracle_mix_test_acc']:.3f}, task "
                   f"oracle {m['eval/seen/oracle_task_test_acc']:.3f}; excess CE {m['eval/seen/excess_ce']:.4f} nats, "
                   f"KL(mix||model) {m['eval/seen/kl_mix']:.4f}")
    if "eval/unseen/test_acc" in m:
        typer.echo(f"unseen tasks: model acc {m['eval/unseen/test_acc']:.3f}, task oracle "
                   f"{m['eval/unseen/oracle_task_test_acc']:.3f}" + "".join(
                       f"; in-context {name} {m[k]:.3f}" for name, k in (
                           ("bigram", "baseline/unseen/incontext_bigram/acc"),
                           ("HMM", "baseline/unseen/incontext_hmm/acc")) if k in m))
    typer.echo(regime_line(m, claims_shown=True))
    more = "hmmscope runs show {}  (or run --verbose)"
    print_claims(f"Figure 1's claims (training run {res.train_id[:8]}; retrieval gap; unseen tasks: in-context gain, "
                 "model vs best counting)", m.claims, full=verbose, where=more.format(res.train_id[:8]))
    if verbose and res.theory is not None:  # the per-setting table first, plain (no cell folded mid-number); the
        # fits' numbers are the claims' below, so their summaries are not printed again
        print_table(f"Theorem 1 sweep ({cfg.theory.family}, V={cfg.theory.n_tokens}; {res.theory.seconds:.1f} s)",
                    res.theory.table(), plain=True)
    print_claims(f"Theorem 1 claims (theory run {(res.theory_id or '')[:8]})", res.theory_claims, full=verbose,
                 where=more.format((res.theory_id or "")[:8]))
    print_claims(f"layerwise analysis (run {res.analysis.run_id[:8]})", res.analysis.claims, full=verbose,
                 where=more.format(res.analysis.run_id[:8]))
    typer.echo(f"files (figures, tables, report): {res.folder}")
    typer.echo(tracking.browse_line(uri, run_id=res.parent_id))
    typer.echo(tracking.browse_line(uri, sweep=res.sweep.study_name))
    print_answer(res.sweep.study_name, res.report)
