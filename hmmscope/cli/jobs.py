"""`hmmscope train`, `evaluate` and `analyze`: the commands that launch the pipeline (`hmmscope.pipeline`: `run` for
training, Figure 1 and the logged model; `evaluation`, `analysis` on a run's checkpoint). The main job: cli/run.

Owns: these commands' options, their checks before work (names, paths, stores, memory), the spinners over their
silent stages, and what they print (metrics, claims, figure paths, the MLflow run). Training, evaluation, the
layerwise analysis and the main job themselves are the library's (`pipeline`, `sweep`, `report`).

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.config`,
`hmmscope.checks`, `hmmscope.store_checks`, the light `pipeline.steps` and `training.deadline`, and the `cli`
helpers (`common`, `theory`): torch, mlflow, optuna and the pipeline are imported inside the command bodies
(`# lazy:`).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, store_checks
from ..checks import memory_estimate, train_flops
from ..config import ConfigError
from ..pipeline.steps import Steps
from ..training.deadline import Deadline, process_age_s
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
    echo_config,
    nonempty_path,
    parse_csv,
    parse_jobs,
    print_claims,
    print_files,
    print_metrics,
    progress_echo,
    user_errors,
)

OutOpt = Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Root folder for figures and tables: they go to "
                                      "OUT/<run name>-<run id[:8]>/ (also logged to the run).")]
RunIdArg = "MLflow run id of a training run (or a unique prefix of it, at least 6 characters)."


def headline(metrics: dict, tags: dict | None = None) -> str | None:
    """Figure 1 in one line: the model's test CE beside the task oracle, the mixture oracle, the family's Bayes
    predictor and the best counting baseline (nats/token), every one on the same task set (on unseen tasks the
    mixture oracle over the training tasks is a reference only), the model minus the best counting baseline with its
    95% CI, and the regime the evaluation names (tag hmmscope.regime: retrieval, counting, inference beyond
    counting, undetermined). On unseen tasks (the model's generalization) when measured, else on seen tasks;
    a reference not measured is left out; None when there is no test CE at all."""
    tasks = "unseen" if "eval/unseen/test_ce" in metrics else "seen" if "eval/seen/test_ce" in metrics else None
    if tasks is None:
        return None
    mix = "mixture oracle" + (" (training tasks)" if tasks == "unseen" else "")  # scored on the same tasks
    refs = [("task oracle", f"eval/{tasks}/oracle_task_test_ce"), (mix, f"eval/{tasks}/oracle_mix_test_ce"),
            ("family Bayes", f"baseline/{tasks}/family_bayes/ce"), ("best counting", f"baseline/{tasks}/best_counting/ce")]
    got = [f"{name} {metrics[k]:.4f}{_flag(metrics, k)}" for name, k in refs if k in metrics]
    line = f"result ({tasks} tasks, test CE, nats/token): model {metrics[f'eval/{tasks}/test_ce']:.4f}"
    line += f"; {', '.join(got)}" if got else ""
    vs = f"eval/{tasks}/vs_best_counting"
    if vs in metrics:
        ci = (f" [95% CI {metrics[vs + '_lo']:+.4f}, {metrics[vs + '_hi']:+.4f}]"
              if vs + "_lo" in metrics and vs + "_hi" in metrics else "")
        line += f"; model - best counting {metrics[vs]:+.4f}{ci}"
    regime = (tags or {}).get("hmmscope.regime")
    return line + (f"; regime: {regime}" if regime else "")


@user_errors
def train_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    resume: Annotated[str | None, typer.Option(help="Continue this MLflow run from its last checkpoint (its id, or "
                                               "a unique prefix of at least 6 characters).")] = None,
    evaluate: Annotated[bool, typer.Option(help="Run Figure 1 evaluation at the end.")] = True,
    run_name: Annotated[str | None, typer.Option(help="MLflow run name.")] = None,
    out: OutOpt = Path("out"),
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope",
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
    deadline: Annotated[float | None, typer.Option(
        min=0, help="Seconds from the command's start by which training stops at a step boundary, with its checkpoint written "
                    "(the run ends FINISHED, tagged hmmscope.stopped=deadline; continue it with --resume; Figure 1 "
                    "waits for the last segment).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print every final metric as a table "
                                          "(else one headline line; the table is in the run: hmmscope runs show "
                                          "ID).")] = False,
) -> None:
    """Train a transformer on HMM-mixture episodes (one MLflow run; checkpoints as artifacts).

    Prints its run id and browse line as soon as the run opens (before the data and the references); then, on a
    terminal, a bar, else a plain progress line every HMMSCOPE_PROGRESS_S seconds (default 30) and one per phase; at
    the end one headline line (the model vs the oracles and the best counting baseline on one task set, and the
    regime) and Figure 1's claims, one short line each."""
    t_cmd = time.monotonic() - process_age_s()  # the deadline counts from the process's start (imports included)
    cfg = build_config(preset_, config, set_, {"train.device": device})
    if print_config:
        return echo_config(cfg, ("hmm", "data", "model", "train", "eval"))
    uri, resume = _train_checks(cfg, run_name, experiment, out, tracking_uri, resume, force)
    from .. import tracking  # lazy: mlflow, torch and the pipeline (seconds) off the CLI's start-up
    from ..interrupts import sigterm_interrupts  # lazy: with the pipeline's imports (torch, mlflow)
    from ..pipeline.run import run  # lazy: torch, mlflow, the measurements (seconds)

    # a spinner over the setup (data, oracles, model), its text each piece as it begins (off a terminal: a line
    # each), stopped when training's own bar takes over (train's setup(None))
    setup = Spinner("setting up: data, oracles, model", plain="train", deferred=True)

    def started(rid: str) -> None:  # the run opens before the setup: its id first, on a line of its own, then the spinner
        typer.echo(f"run {rid} {'resumed' if resume else 'started'}; {tracking.browse_line(uri, run_id=rid)}")
        setup.start()

    # one writer per run: a resume takes the run's lease before any work (of two started together, one runs, the
    # other stops with one line naming it), a new run as it opens, and both keep it to the end of the pipeline's run
    with sigterm_interrupts(), setup:
        done = run(cfg, uri=uri, experiment=experiment, run_name=run_name, resume=resume, progress=True,
                   on_eval=lambda step, m: setup.stop(), on_start=started, evaluate=evaluate, out=out, log_model=True,
                   setup=lambda piece: setup.stop() if piece is None else setup.update(f"setting up: {piece}"),
                   deadline=None if deadline is None else Deadline(at=t_cmd + deadline), steps=_TrainCmdSteps())
    _print_trained(done, uri, verbose)
    res = done.trained
    if res.stopped is not None:
        again = ["hmmscope", "train", "--preset", str(preset_.value)]
        again += ["--config", str(config)] if config is not None else []
        again += [a for kv in set_ or [] for a in ("--set", kv)]
        again += ["--device", device] if device is not None else []
        again += ["--tracking-uri", uri, "--experiment", experiment, "--resume", res.run_id]
        typer.echo(_stopped_line(res, again))
    typer.echo(tracking.browse_line(uri, run_id=res.run_id))


def _train_checks(cfg, run_name: str | None, experiment: str, out: Path, tracking_uri: str | None, resume: str | None,
                  force: bool) -> tuple[str, str | None]:
    """`train`'s checks before work (names, paths, the store, the run to resume, memory and time): (the store's URI,
    the full id of the run to resume or None)."""
    if run_name is not None:
        checks.safe_name(run_name, "--run-name")
    from ..tracking.store import check_experiment_name  # lazy: tracking imports mlflow (seconds)

    check_experiment_name(experiment)
    checks.output_dir(out, "--out", explicit=out != Path("out"))
    uri = store_checks.tracking_store(tracking_uri, must_exist=resume is not None)
    from .. import tracking  # lazy: mlflow and torch (seconds) off the CLI's start-up
    from ..training.train import resolve_device  # lazy: torch (~1 s)

    dev = resolve_device(cfg.train.device)  # an unavailable device fails before any run is created
    if resume is not None:
        resume = tracking.resolve_run_id(uri, resume)  # a unique prefix of the id will do
        checks.live_run(uri, resume, resume=True)
        tracking.existing_run(uri, resume)
    checks.memory(memory_estimate(cfg, "train"), device=str(dev), force=force)
    checks.duration(train_flops(cfg), device=str(dev), force=force, what=f"training {cfg.train.steps:,} steps")
    return uri, resume


class _TrainCmdSteps(Steps):
    """What `train` shows between the pipeline's steps: the stale files a resume removed, a spinner over Figure 1."""

    def cleaned(self, run_id: str, count: int, size: int) -> None:
        from ..tracking.leftovers import describe  # lazy: tracking imports mlflow (seconds)

        typer.echo(f"run {run_id}: removed {describe(count, size)} left by a killed writer", err=True)

    def evaluating(self):
        return Spinner("evaluating: Figure 1", plain="train")


def _print_trained(done, uri: str, verbose: bool) -> None:
    """The run's lines: steps and speed, the headline, Figure 1's claims, where the rest is, the files."""
    from .. import tracking  # lazy: mlflow (imported by the command by now) off the CLI's start-up

    res, ev = done.trained, done.evaluation
    metrics, files, claims = done.metrics, (ev.files if ev is not None else []), (ev.claims if ev is not None else [])
    typer.echo(f"run {res.run_id}: {res.steps} steps in {res.wall_time:.0f} s ({res.tokens_per_s:,.0f} tokens/s)")
    if verbose:
        print_metrics(f"run {res.run_id}: final metrics", metrics)
    line = headline(metrics, tracking.get_run(uri, res.run_id).data.tags)
    if line:
        typer.echo(line)
    if claims:  # one short line each: the headline has the numbers and the regime (the statistics: runs show)
        print_claims("Figure 1's claims (retrieval gap; unseen tasks: in-context gain, model vs best counting)", claims,
                     full=verbose)
    if not verbose:
        typer.echo(f"every metric, and each claim's statistic and reason: hmmscope runs show {res.run_id[:8]}  (or "
                   "train --verbose)")
    print_files(files)


def _stopped_line(res, again: list[str]) -> str:
    """Where the deadline stopped training, why, and the command that continues it."""
    est = res.extra.get("deadline", {})
    return (f"stopped by the deadline at step {res.steps} of {res.config.train.steps} ({est.get('left_s', 0):.1f} s "
            f"were left, {est.get('need_s', 0):.1f} s needed: {est.get('step_s', 0):.3f} s per step, checkpoint "
            f"{est.get('ckpt_s', 0):.1f} s, evaluation {est.get('eval_s', 0):.1f} s; checkpoint saved; "
            f"run {res.run_id} FINISHED, tag hmmscope.stopped=deadline); continue with:\n  "
            f"{shlex.join(again)} [--deadline SECONDS]")


def _flag(m, key: str) -> str:
    """' (DEGENERATE, not used)' after a reference flagged degenerate (SCIENCE.md 9: baseline/<tasks>/<name>/degenerate),
    else ''."""
    parts = key.split("/")
    flagged = len(parts) == 4 and parts[0] == "baseline" and m.get("/".join(parts[:3]) + "/degenerate")
    return " (DEGENERATE, not used)" if flagged else ""


def print_answer(study: str, report) -> None:
    """A sweep's last two lines: its answer in one sentence (the report's first, `sweep.compare.answer`) and the
    report's HTML (figures embedded)."""
    if report.answer:
        typer.echo(f"sweep {study}: {report.answer}")
    typer.echo(f"report: {report.files.get('html')}")


def regime_line(m, regime: str | None = None, *, claims_shown: bool = False) -> str:
    """One line: the model on unseen tasks against best counting and the family-Bayes reference, and the regime word
    (SCIENCE.md 9), from Figure 1's headline metrics (evaluate.Figure1Result.headline). `claims_shown`: the claims are
    printed beside it (`run`), so the line leaves out what they say (model - best counting, the inference claim's
    statistic) and Figure 1's seconds (its phase line said them): no number twice."""
    regime = regime or getattr(m, "regime", None) or "undetermined"
    parts = [f"regime: {regime}"]
    if "eval/unseen/test_ce" in m:
        parts.append(f"unseen tasks: model CE {m['eval/unseen/test_ce']:.3f}")
    if "baseline/unseen/best_counting/ce" in m:
        vs = ("eval/unseen/vs_best_counting", "eval/unseen/vs_best_counting_lo", "eval/unseen/vs_best_counting_hi")
        parts.append(f"best counting {m['baseline/unseen/best_counting/ce']:.3f}"
                     + _flag(m, "baseline/unseen/best_counting/ce") + (
                         f" (model - best counting {m[vs[0]]:+.3f} [{m[vs[1]]:+.3f}, {m[vs[2]]:+.3f}])"
                         if all(k in m for k in vs) and not claims_shown else ""))
    if "baseline/unseen/family_bayes/ce" in m:
        parts.append(f"family Bayes {m['baseline/unseen/family_bayes/ce']:.3f}"
                     + _flag(m, "baseline/unseen/family_bayes/ce"))
    if "eval/unseen/oracle_task_test_ce" in m:
        parts.append(f"task oracle {m['eval/unseen/oracle_task_test_ce']:.3f} nats/token")
    if "eval/figure1_s" in m and not claims_shown:
        parts.append(f"Figure 1 took {m['eval/figure1_s']:.0f} s")
    return "; ".join(parts)


@user_errors
def evaluate_cmd(
    run_id: Annotated[str, typer.Argument(help=RunIdArg)],
    device: DeviceOpt = None,
    n_episodes: Annotated[int | None, typer.Option(help="Held-out episodes (default data.n_eval).")] = None,
    out: OutOpt = Path("out"),
    tracking_uri: UriOpt = None,
    force: ForceOpt = False,
) -> None:
    """Figure 1: accuracy vs demonstrations and test position beside the oracles; KL and excess CE."""
    if n_episodes is not None and n_episodes < 1:
        raise ConfigError(f"--n-episodes must be >= 1, got {n_episodes}")
    checks.output_dir(out, "--out", explicit=out != Path("out"))
    uri = store_checks.tracking_store(tracking_uri, must_exist=True)
    from .. import tracking  # lazy: mlflow, torch and the pipeline (seconds) off the CLI's start-up
    from ..interrupts import sigterm_interrupts  # lazy: with the pipeline's imports (torch, mlflow)
    from ..pipeline.evaluation import evaluate_run  # lazy: torch, mlflow, the measurements (seconds)
    from ..training.train import resolve_device  # lazy: torch (~1 s)

    run_id = tracking.resolve_run_id(uri, run_id)  # a unique prefix of the id will do
    cfg = checks.run_config(uri, run_id)
    dev = resolve_device(device or "auto")
    if cfg is not None:
        checks.memory(memory_estimate(cfg, "evaluate", n_episodes=n_episodes), device=str(dev), force=force)
    with sigterm_interrupts():
        metrics = evaluate_run(uri, run_id, device=device or "auto", n_episodes=n_episodes, out=out)
    print_metrics(f"evaluation of run {run_id}", metrics)
    line = headline(metrics, tracking.get_run(uri, run_id).data.tags)
    if line:
        typer.echo(line)
    print_claims("Figure 1 (retrieval gap; unseen tasks: in-context gain, model vs best counting)", metrics.claims,
                 where=f"hmmscope runs show {run_id[:8]}")
    typer.echo(regime_line(metrics))
    print_files(metrics.files)


@user_errors
def analyze_cmd(
    target: Annotated[str, typer.Argument(help="MLflow run id of a training run (or a unique prefix of it, at least 6 "
                                          "characters), or a checkpoint (.pt) file.")],
    ks: Annotated[str, typer.Option("--ks", help="Comma-separated k for the k-back token probes.")] = "1,2,3,4,5",
    n_episodes: Annotated[int | None, typer.Option(help="Held-out episodes (default data.n_eval).")] = None,
    n_perms: Annotated[int, typer.Option(min=1, help="Demo permutations per episode (shuffle test).")] = 4,
    probe_tasks: Annotated[int | None, typer.Option(min=2, help="Tasks the probes draw their episodes from (default: 32, "
                                                    "or all of a smaller mixture's; at most the mixture's).")] = None,
    min_per_task: Annotated[int, typer.Option(min=4, help="Probe episodes per task, at least.")] = 30,
    probe_jobs: Annotated[str, typer.Option(
        help="Worker processes for the probes' layer fits: N >= 1, or 'auto' = the CPUs this process may use "
             "(the same numbers at any value).")] = "1",
    probe_fits: Annotated[str, typer.Option(
        help="The probes' fits: auto (torch on a CUDA device, else scikit-learn), sklearn (CPU, --probe-jobs "
             "processes) or torch (on --device; checked against scikit-learn's to a stated tolerance).")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for permutations, position subsampling and splits.")] = 0,
    device: DeviceOpt = None,
    tracking_uri: UriOpt = None,
    experiment: Annotated[str, typer.Option(help="Experiment for a checkpoint file's analysis run.")] = "hmmscope",
    out: OutOpt = Path("out"),
    force: ForceOpt = False,
) -> None:
    """Layerwise analysis: shuffle test (Fig. 2), task / state / k-back probes (Fig. 3a, 3b), belief probes.

    Progress: one line per phase on stderr as it ends, with the seconds since the start."""
    k_list = parse_csv(ks, "--ks") or []
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in k_list):
        raise ConfigError(f"--ks: expected comma-separated integers, got {ks!r}")
    if len(set(k_list)) != len(k_list):
        raise ConfigError(f"--ks: each k once, got {ks!r}")
    jobs = checks.probe_jobs(parse_jobs(probe_jobs, "--probe-jobs"))
    if probe_fits not in ("auto", "sklearn", "torch"):
        raise ConfigError(f"--probe-fits: auto, sklearn or torch, got {probe_fits!r}")
    checks.seed(seed, "--seed")
    from ..tracking.store import check_experiment_name  # lazy: tracking imports mlflow (seconds)

    check_experiment_name(experiment)
    checks.output_dir(out, "--out", explicit=out != Path("out"))
    is_file = Path(target).suffix == ".pt" or Path(target).exists()
    uri = store_checks.tracking_store(tracking_uri, must_exist=not is_file)
    if not is_file:
        from .. import tracking  # lazy: mlflow (seconds) off the CLI's start-up

        target = tracking.resolve_run_id(uri, target)  # a unique prefix of the id will do
    from ..interrupts import sigterm_interrupts  # lazy: torch, mlflow and the pipeline (seconds) off the start-up
    from ..pipeline.analysis import analyze_run  # lazy: torch, mlflow, statsmodels (seconds)
    from ..training.checkpoints import checkpoint_config, read_checkpoint  # lazy: torch (~1 s)
    from ..training.train import resolve_device  # lazy: torch (~1 s)

    cfg = checkpoint_config(read_checkpoint(target, mmap=True)) if is_file else checks.run_config(uri, target)
    dev = resolve_device(device or "auto")
    if probe_tasks is not None and cfg is not None and 0 < cfg.hmm.n_tasks < probe_tasks:
        raise ConfigError(f"--probe-tasks {probe_tasks}: the model was trained on a mixture of {cfg.hmm.n_tasks} tasks; "
                          f"give at most {cfg.hmm.n_tasks}")
    probe_tasks = 32 if probe_tasks is None else probe_tasks
    if cfg is not None:
        n_pt = min(probe_tasks, cfg.hmm.n_tasks or cfg.data.n_eval)  # analysis.analyze_run's probe episodes (fresh: unseen)
        n_probe = n_pt * max(min_per_task, -(-(n_episodes or cfg.data.n_eval) // n_pt))
        checks.memory(memory_estimate(cfg, "analyze", n_episodes=n_episodes, probe_episodes=n_probe, n_perms=n_perms),
                      device=str(dev), force=force)
    with sigterm_interrupts():
        res = analyze_run(uri, target, device=device or "auto", n_episodes=n_episodes, ks=tuple(k_list),
                          n_perms=n_perms, seed=seed, experiment=experiment, out=out,
                          probe_tasks=probe_tasks, min_per_task=min_per_task, probe_jobs=jobs, probe_fits=probe_fits,
                          progress=progress_echo)
    print_claims(f"claims (analysis run {res.run_id}; shuffle {res.seconds['shuffle_s']:.0f} s, "
                 f"probes {res.seconds['probes_s']:.0f} s)", res.claims, where=f"hmmscope runs show {res.run_id[:8]}")
    print_files(res.files)
