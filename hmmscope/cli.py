"""The `hmmscope` command line (Typer). Only this module parses user input.

Bad input: exit code 2 and one line `error: ...` on stderr, nothing written. Every command checks its
names, paths, stores and sizes (hmmscope.checks) before it creates a run, a study, a folder or a file;
option errors Click finds (a bad value, a missing argument) get the same one line. A training that
diverges exits 1 with one line naming its FAILED run; Ctrl-C or SIGTERM exits 130 (the run ends KILLED).

Output: results on stdout; errors, progress bars and spinners on stderr, the bars and spinners on a terminal
only (a sweep prints plain progress lines elsewhere). No third-party chatter: MLflow's table-creation INFO
lines are silenced here, `hmmscope ui` sends its servers' output to a log file (shown if a server fails).
`--print-config` prints the resolved config as TOML (what `--config` reads) and exits.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import checks
from .config import Config, ConfigError, flatten, load_toml, memory_estimate, override, preset


class OneLineErrors(TyperGroup):
    """The root group: Click's usage errors become one line `error: ...` (exit 2), not a usage box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        except Exception as e:  # Click's ClickException family (vendored by Typer): format_message + exit_code
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                raise
            if type(e).__name__ == "NoArgsIsHelpError":  # `hmmscope sweep`: the help, as Click shows it
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None and e.exit_code == 2 else ""
            msg = " ".join(str(e.format_message()).split())
            typer.echo(f"error: {msg}{hint}", err=True)
            sys.exit(e.exit_code)
        if rv == 130:
            typer.echo("error: interrupted", err=True)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Test what transformers learn from mixtures of low-rank hidden Markov models.")
bench_app = typer.Typer(no_args_is_help=True, help="Speed benchmarks against named peers, as ratios.")
app.add_typer(bench_app, name="bench")
sweep_app = typer.Typer(no_args_is_help=True, help="Optuna sweeps: every trial an MLflow run under one parent run.")
app.add_typer(sweep_app, name="sweep")
runs_app = typer.Typer(no_args_is_help=True, help="Housekeeping of MLflow runs.")
app.add_typer(runs_app, name="runs")


def _quiet_third_party() -> None:
    """No third-party chatter on a normal run: MLflow's INFO lines when it creates a store's tables."""
    import logging

    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _show_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"hmmscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    _quiet_third_party()


class Preset(StrEnum):
    tiny = "tiny"
    paper = "paper"


class Family(StrEnum):
    sticky = "sticky"
    dirichlet = "dirichlet"


class Split(StrEnum):
    train = "train"
    eval = "eval"


PresetOpt = Annotated[Preset, typer.Option(help="Base configuration.")]
# help text is rich markup: a literal [ is written \\[ (else `[hmm]` vanishes from --help)
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML file with \\[hmm], \\[data], ... tables.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set hmm.gamma=0.5 (repeatable).")]
UriOpt = Annotated[str | None, typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI (default: sqlite under ./mlruns).")]
ExpOpt = Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")]
PrintConfigOpt = Annotated[bool, typer.Option("--print-config", help="Print the resolved config as TOML and exit.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even if the memory estimate exceeds what this machine has.")]


def fail(msg: str, code: int = 2) -> None:
    """One line on stderr, then exit (2 = bad input)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def user_errors(fn):
    """Turn bad input (ConfigError / ValueError / OSError) into a one-line error and exit code 2.

    A diverged training exits 1 with one line naming its FAILED run; running out of memory anyway
    (past --force, or past the estimate) exits 1 with one line.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, ValueError) as e:
            fail(_line(e))
        except OSError as e:  # a path that passed the checks and still failed (a race, a full disk)
            fail(f"{e.strerror or _line(e)}: {e.filename}" if e.filename else _line(e))
        except MemoryError as e:
            fail(f"out of memory ({_line(e)}); make the job smaller", code=1)
        except RuntimeError as e:
            train = sys.modules.get("hmmscope.train")
            if train is not None and isinstance(e, train.DivergedError):
                fail(f"training diverged: {e}; run {e.run_id} ended FAILED (try a smaller train.lr)", code=1)
            if type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e):
                fail(f"out of memory ({_line(e)[:200]}); make the job smaller", code=1)
            raise

    return wrapper


def parse_sets(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def build_config(base: Preset | str = "tiny", config: Path | None = None, sets: list[str] | None = None,
                 extra: dict[str, Any] | None = None) -> Config:
    """defaults -> preset -> TOML file -> explicit options -> --set, validated at every step."""
    cfg = preset(base.value if isinstance(base, Enum) else base)
    if config is not None:
        cfg = load_toml(config, cfg)
    if extra:
        cfg = override(cfg, {k: v for k, v in extra.items() if v is not None})
    return override(cfg, parse_sets(sets))


def config_toml(cfg: Config, sections: tuple[str, ...] | None = None) -> str:
    """The config as TOML (tables [hmm], [data], ...), which `--config` reads back to the same config."""
    from .config import to_dict

    out = []
    for sec, values in to_dict(cfg).items():
        if sections is None or sec in sections:
            out += [f"[{sec}]", *(f"{k} = {json.dumps(v)}" for k, v in values.items()), ""]
    return "\n".join(out)


def _print_config(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    typer.echo(config_toml(cfg, sections), nl=False)  # plain text: rich markup would eat the [tables]


def _csv(value: str | None, key: str) -> list[Any] | None:
    if value is None:
        return None
    try:
        return [json.loads(v) for v in value.split(",") if v.strip()]
    except json.JSONDecodeError:
        raise ConfigError(f"{key}: expected comma-separated numbers, got {value!r}") from None


# ---------------------------------------------------------------- generate


@app.command()
@user_errors
def generate(
    out: Annotated[Path, typer.Argument(help="Output .npz file.")],
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    split: Annotated[Split, typer.Option(help="Which stream of episodes.")] = Split.train,
    n: Annotated[int | None, typer.Option(help="Episodes (default: data.n_train or data.n_eval).")] = None,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Write a dataset of episodes (tokens, states, task ids, layout, config and hash) to an .npz file."""
    cfg = build_config(preset_, config, set_)
    if print_config:
        return _print_config(cfg, ("hmm", "data"))
    n = n if n is not None else (cfg.data.n_train if split == Split.train else cfg.data.n_eval)
    if n < 1:
        raise ConfigError(f"--n must be >= 1, got {n}")
    checks.output_file(out, "output", suffix=".npz")
    checks.memory(memory_estimate(cfg, "generate", n_episodes=n), force=force)
    from .episodes import sample_episodes, save_episodes
    from .hmm import make_mixture

    mix = make_mixture(cfg.hmm)
    ep = sample_episodes(mix, cfg.data, n, split=split.value)
    save_episodes(ep, out, config=flatten(cfg))
    typer.echo(f"wrote {n} episodes x {ep.tokens.shape[1]} tokens to {out} (dataset hash {ep.meta['dataset_hash']})")


# ---------------------------------------------------------------- theory


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True, disable=not sys.stderr.isatty(), console=_console(stderr=True))


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 160)


def _print_table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    if not rows:
        return
    table = Table(title=title, title_justify="left")
    for col in rows[0]:
        table.add_column(str(col), overflow="fold")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    _console().print(table)


def _theory_config(config, set_, extra):
    cfg = build_config("tiny", config, set_, extra)
    return cfg.theory


@app.command()
@user_errors
def theory(
    family: Annotated[Family | None, typer.Option(help="Transition family.")] = None,
    gammas: Annotated[str | None, typer.Option(help="Comma-separated gammas, e.g. 0.3,0.5,0.9.")] = None,
    ranks: Annotated[str | None, typer.Option(help="Comma-separated ranks d.")] = None,
    rhos: Annotated[str | None, typer.Option(help="Comma-separated rho (sticky mixing).")] = None,
    n_states: Annotated[str | None, typer.Option(help="Comma-separated numbers of hidden states S.")] = None,
    lengths: Annotated[str | None, typer.Option(help="Comma-separated memory lengths L.")] = None,
    n_histories: Annotated[int | None, typer.Option(help="Monte Carlo histories per eps(L).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="Folder for the figure and the JSON (default: a new "
                                            "out/theory-<UTC time>/).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the full result as JSON here.")] = None,
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope-theory",
    track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Theorem 1 against practice: eps(L) curves, decay rates, the exponent fit and verdicts per setting."""
    extra = {"theory.family": family.value if family else None, "theory.gammas": _csv(gammas, "--gammas"),
             "theory.ranks": _csv(ranks, "--ranks"), "theory.rhos": _csv(rhos, "--rhos"),
             "theory.n_states": _csv(n_states, "--n-states"), "theory.lengths": _csv(lengths, "--lengths"),
             "theory.n_histories": n_histories}
    cfg = build_config("tiny", config, set_, extra)
    if print_config:
        return _print_config(cfg, ("theory",))
    th = cfg.theory
    from .jobs import new_folder

    out = checks.output_dir(out or new_folder(Path("out"), "theory"), "--out")
    if json_path is not None:
        checks.output_file(json_path, "--json", suffix=".json")
    checks.experiment_name(experiment)
    uri = checks.tracking_store(tracking_uri) if track else None
    checks.memory(memory_estimate(cfg, "theory"), force=force)
    from . import tracking
    from .jobs import atomic_write, theory_job
    from .train import sigterm_interrupts

    n = len(th.gammas) * len(th.ranks) * len(th.rhos) * len(th.n_states)
    with sigterm_interrupts(), _progress() as bar:
        task = bar.add_task("theory", total=n)
        result, run_id = theory_job(th, out, uri=uri, experiment=experiment,
                                    progress=lambda i, total, label: bar.update(task, completed=i, description=label))
    if json_path is not None:
        atomic_write(json_path, lambda p: p.write_text(json.dumps(result.to_dict(), indent=2)))
    _print_theory(result, th)
    typer.echo(f"figures: {out / 'theory.png'}, {out / 'theory.pdf'}  result: {out / 'theory.json'}")
    if run_id is not None:
        typer.echo(f"MLflow run {run_id} in experiment {experiment!r}; browse: {tracking.ui_command(uri)}")


def _print_theory(result, th, detail: bool = True) -> None:
    """The per-setting table, the fits' summaries, then the claims (only the sweep-level ones unless `detail`)."""
    _print_table(f"Theorem 1 sweep ({th.family}, V={th.n_tokens}; {result.seconds:.1f} s)", result.table())
    for f in [*result.exponent_fits, *result.rank_fits]:
        typer.echo(f.summary)
    _print_claims("Theorem 1 claims", result.claims(detail))


# ---------------------------------------------------------------- train / evaluate / run

DeviceOpt = Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N (sets train.device).")]
OutOpt = Annotated[Path, typer.Option("--out", help="Root folder for figures and tables: they go to "
                                      "OUT/<run name>-<run id[:8]>/ (also logged to the run).")]


def _print_files(files) -> None:
    figs = [str(p) for p in files if Path(p).suffix in (".png", ".pdf")]
    if figs:
        typer.echo(f"figures: {', '.join(figs)}")


@app.command("train")
@user_errors
def train_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    resume: Annotated[str | None, typer.Option(help="Continue this MLflow run from its last checkpoint.")] = None,
    evaluate: Annotated[bool, typer.Option(help="Run Figure 1 evaluation at the end.")] = True,
    run_name: Annotated[str | None, typer.Option(help="MLflow run name.")] = None,
    out: OutOpt = Path("out"),
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope",
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Train a transformer on HMM-mixture episodes (one MLflow run; checkpoints as artifacts)."""
    cfg = build_config(preset_, config, set_, {"train.device": device})
    if print_config:
        return _print_config(cfg, ("hmm", "data", "model", "train"))
    if run_name is not None:
        checks.safe_name(run_name, "--run-name")
    checks.experiment_name(experiment)
    checks.output_dir(out, "--out")
    uri = checks.tracking_store(tracking_uri, must_exist=resume is not None)
    from . import tracking
    from .jobs import evaluate_run
    from .train import resolve_device, sigterm_interrupts, train

    dev = resolve_device(cfg.train.device)  # an unavailable device fails before any run is created
    if resume is not None:
        tracking.existing_run(uri, resume)
    checks.memory(memory_estimate(cfg, "train"), device=str(dev), force=force)
    # a spinner over the silent setup (data, oracles, model, the run), stopped by the step-0 evaluation, which
    # comes just before training's own bar; a resumed run has no such evaluation, and no spinner
    setup = Spinner("setting up: data, oracles, model" if resume is None else None)
    with sigterm_interrupts(), setup:  # `kill` / `timeout`: the run ends KILLED, not RUNNING
        res = train(cfg, tracking_uri=uri, experiment=experiment, run_name=run_name, resume=resume,
                    progress=sys.stderr.isatty(), on_eval=lambda step, m: setup.stop())
        metrics, files = dict(res.metrics), []
        if evaluate:
            with Spinner("evaluating: Figure 1"):
                ev = evaluate_run(uri, res.run_id, device=cfg.train.device, out=out)
            metrics.update(ev)
            files = ev.files
    _print_metrics(f"run {res.run_id}: {res.steps} steps in {res.wall_time:.0f} s "
                   f"({res.tokens_per_s:,.0f} tokens/s)", metrics)
    _print_files(files)
    typer.echo(f"browse: {tracking.ui_command(uri)}")


@app.command("evaluate")
@user_errors
def evaluate_cmd(
    run_id: Annotated[str, typer.Argument(help="MLflow run id of a training run.")],
    device: DeviceOpt = None,
    n_episodes: Annotated[int | None, typer.Option(help="Held-out episodes (default data.n_eval).")] = None,
    out: OutOpt = Path("out"),
    tracking_uri: UriOpt = None,
    force: ForceOpt = False,
) -> None:
    """Figure 1: accuracy vs demonstrations and test position beside the oracles; KL and excess CE."""
    if n_episodes is not None and n_episodes < 1:
        raise ConfigError(f"--n-episodes must be >= 1, got {n_episodes}")
    checks.output_dir(out, "--out")
    uri = checks.tracking_store(tracking_uri, must_exist=True)
    from .jobs import evaluate_run
    from .train import resolve_device, sigterm_interrupts

    cfg = checks.run_config(uri, run_id)
    dev = resolve_device(device or "auto")
    if cfg is not None:
        checks.memory(memory_estimate(cfg, "evaluate", n_episodes=n_episodes), device=str(dev), force=force)
    with sigterm_interrupts():
        metrics = evaluate_run(uri, run_id, device=device or "auto", n_episodes=n_episodes, out=out)
    _print_metrics(f"evaluation of run {run_id}", metrics)
    _print_files(metrics.files)


@app.command("analyze")
@user_errors
def analyze_cmd(
    target: Annotated[str, typer.Argument(help="MLflow run id of a training run, or a checkpoint (.pt) file.")],
    ks: Annotated[str, typer.Option("--ks", help="Comma-separated k for the k-back token probes.")] = "1,2,3,4,5",
    n_episodes: Annotated[int | None, typer.Option(help="Held-out episodes (default data.n_eval).")] = None,
    n_perms: Annotated[int, typer.Option(min=1, help="Demo permutations per episode (shuffle test).")] = 4,
    probe_tasks: Annotated[int, typer.Option(min=2, help="Tasks the probes draw their episodes from.")] = 32,
    min_per_task: Annotated[int, typer.Option(min=4, help="Probe episodes per task, at least.")] = 30,
    probe_jobs: Annotated[str, typer.Option(
        help="Worker processes for the probes' layer fits: N >= 1, or 'auto' = the CPUs this process may use "
             "(the same numbers at any value).")] = "1",
    seed: Annotated[int, typer.Option(help="Seed for permutations, position subsampling and splits.")] = 0,
    device: DeviceOpt = None,
    tracking_uri: UriOpt = None,
    experiment: Annotated[str, typer.Option(help="Experiment for a checkpoint file's analysis run.")] = "hmmscope",
    out: OutOpt = Path("out"),
    force: ForceOpt = False,
) -> None:
    """Layerwise analysis: shuffle test (Fig. 2), task / state / k-back probes (Fig. 3a, 3b), belief probes.

    Progress: one line per phase on stderr as it ends, with the seconds since the start."""
    k_list = _csv(ks, "--ks") or []
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in k_list):
        raise ConfigError(f"--ks: expected comma-separated integers, got {ks!r}")
    jobs = _jobs(probe_jobs, "--probe-jobs")
    checks.seed(seed, "--seed")
    checks.experiment_name(experiment)
    checks.output_dir(out, "--out")
    is_file = Path(target).suffix == ".pt" or Path(target).exists()
    uri = checks.tracking_store(tracking_uri, must_exist=not is_file)
    from .jobs import analyze_run
    from .train import checkpoint_config, read_checkpoint, resolve_device, sigterm_interrupts

    cfg = checkpoint_config(read_checkpoint(target, mmap=True)) if is_file else checks.run_config(uri, target)
    dev = resolve_device(device or "auto")
    if cfg is not None:
        checks.memory(memory_estimate(cfg, "analyze", n_episodes=n_episodes), device=str(dev), force=force)
    with sigterm_interrupts():
        res = analyze_run(uri, target, device=device or "auto", n_episodes=n_episodes, ks=tuple(k_list),
                          n_perms=n_perms, seed=seed, experiment=experiment, out=out,
                          probe_tasks=probe_tasks, min_per_task=min_per_task, probe_jobs=jobs,
                          progress=lambda m: typer.echo(m, err=True))
    _print_claims(f"claims (analysis run {res.run_id}; shuffle {res.seconds['shuffle_s']:.0f} s, "
                  f"probes {res.seconds['probes_s']:.0f} s)", res.claims)
    _print_files(res.files)


def _jobs(value: str, key: str) -> int:
    """A worker count: an integer >= 1, or 'auto' = the CPUs this process may use."""
    import os

    if value.strip().lower() == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{key}: expected an integer >= 1 or 'auto', got {value!r}")
    return n


def _print_metrics(title: str, metrics: dict[str, float]) -> None:
    _print_table(title, [{"metric": k, "value": f"{v:.4g}"} for k, v in sorted(metrics.items())])


@app.command("run")
@user_errors
def run_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    out: Annotated[Path, typer.Option(help="Folder for figures, JSON and the sweep report.")] = Path("out"),
    workers: Annotated[int, typer.Option(min=1, help="Worker processes for the training sweep.")] = 2,
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope",
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """The main job: theory sweep, training + Figure 1, layerwise analysis, a small training sweep and its report."""
    cfg = build_config(preset_, config, set_, {"train.device": device})
    if print_config:
        return _print_config(cfg)
    checks.output_dir(out, "--out")
    checks.experiment_name(experiment)
    uri = checks.tracking_store(tracking_uri)
    checks.optuna_storage(None)  # the main job's sweep uses the default storage
    from . import tracking
    from .jobs import main_job
    from .report import build_report
    from .sweep import run_sweep
    from .train import resolve_device, sigterm_interrupts

    dev = resolve_device(cfg.train.device)
    for job in ("theory", "train", "analyze"):  # the stages run one after another
        checks.memory(memory_estimate(cfg, job), device=str(dev), force=force, what=f"the {job} stage")

    def sweep_and_report(spec, report_dir):  # the jobs layer reaches the sweep layer only through this
        sw = run_sweep(spec, workers=workers, uri=uri, log=lambda m: None)
        return sw, build_report(uri, sw.parent_run_id, report_dir, storage=sw.storage)

    with sigterm_interrupts():
        res = main_job(cfg, uri, experiment, out, sweep=sweep_and_report, progress=sys.stderr.isatty(),
                       on_stage=lambda s: typer.echo(f"[hmmscope run] {s} ...", err=True))
    m = res.eval_metrics
    typer.echo("")
    typer.echo(f"Figure 1 (test segment, {cfg.data.n_demos} demonstrations): model acc {m['eval/test_acc']:.3f}, "
               f"mixture oracle {m['eval/oracle_mix_test_acc']:.3f}, task oracle {m['eval/oracle_task_test_acc']:.3f}; "
               f"excess CE {m['eval/excess_ce']:.4f} nats, KL(mix||model) {m['eval/kl_mix']:.4f}")
    _print_theory(res.theory, cfg.theory, detail=False)
    _print_claims(f"layerwise analysis (run {res.analysis.run_id})", res.analysis.claims)
    sw = res.sweep
    typer.echo(f"sweep {sw.study_name}: {sw.complete} complete, {sw.failed} failed, {sw.pruned} pruned of "
               f"{sw.n_trials}; report: {res.report.files.get('md')}")
    typer.echo(f"MLflow: parent run {res.parent_id} (train {res.train_id}, theory {res.theory_id}) in experiment "
               f"{experiment!r}; sweep parent run {sw.parent_run_id}")
    typer.echo(f"files (figures, tables, report): {res.folder}")
    typer.echo(f"browse: {tracking.ui_command(uri)}")


def _print_claims(title: str, claims) -> None:
    """One line per claim (never folded, so names stay greppable): verdict, claim, value, 95% CI, the decision
    rule that gives the verdict from that CI (stats.decide), the statistic, and the reason."""
    typer.echo(title)
    for c in claims:
        typer.echo(f"  [{c.verdict}] {c.name} = {c.value:.4g} [95% CI {c.ci_lo:.4g}, {c.ci_hi:.4g}]; "
                   f"rule {c.rule or '-'}; statistic: {c.statistic}; reason: {c.reason}")


# ---------------------------------------------------------------- sweeps, report, ui

SpecStorageOpt = Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL; "
                                                    "default: the spec's sweep.storage, else ./mlruns/optuna.db).")]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL; "
                                                "default: ./mlruns/optuna.db).")]


class SweepProgress:
    """run_sweep's `progress` callback, called with the trial counts about once a second.

    On a terminal: a rich bar on stderr (finished of all trials; done, failed, running; ETA). Otherwise one
    plain line on stderr each time the counts change. ETA: the trials left over the rate at which trials
    finished since the first count (a resumed sweep's earlier trials do not count toward the rate);
    "?" until one has finished. done = complete + pruned; failed = failed for good (retried ones are not).
    """

    def __init__(self, name: str, n_trials: int, *, tty: bool | None = None, echo=None, clock=None):
        import time

        self.name, self.n = name, n_trials
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.echo = echo or (lambda m: typer.echo(m, err=True))
        self.clock = clock or time.monotonic
        self.t0, self.base, self.last, self.bar, self.task = 0.0, None, None, None, None

    def eta(self, finished: int) -> str:
        if self.base is None:  # the first count: the rate counts from here (not the study's creation)
            self.base, self.t0 = finished, self.clock()
        new, left, dt = finished - self.base, self.n - finished, self.clock() - self.t0
        if left <= 0:
            return "0:00:00"
        if new <= 0 or dt <= 0:
            return "?"
        secs = int(round(left * dt / new))
        return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"

    def line(self, c: dict[str, int], n: int) -> str:
        done, failed, running = c.get("complete", 0) + c.get("pruned", 0), c.get("failed", 0), c.get("running", 0)
        self.n = n
        return (f"{done + failed}/{n} finished: {done} done, {failed} failed, {running} running; "
                f"ETA {self.eta(done + failed)}")

    def __call__(self, counts: dict[str, int], n: int) -> None:
        text = self.line(counts, n)
        if self.bar is not None:
            done = counts.get("complete", 0) + counts.get("pruned", 0) + counts.get("failed", 0)
            self.bar.update(self.task, completed=done, total=n, detail=text.split(": ", 1)[1])
        elif text.split("; ETA")[0] != (self.last or "").split("; ETA")[0]:
            self.echo(f"sweep {self.name}: {text}")
        self.last = text

    def log(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.console.print(msg, markup=False, highlight=False)  # above the bar
        else:
            self.echo(msg)

    def __enter__(self):
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"sweep {self.name}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                console=_console(stderr=True), transient=True)
            self.task = self.bar.add_task(self.name, total=self.n, detail="starting")
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            bar.__exit__(*exc)


@sweep_app.command("run")
@user_errors
def sweep_run_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec (TOML), e.g. sweeps/smoke.toml.")],
    workers: Annotated[int, typer.Option(min=1, help="Local worker processes (one torch thread each).")] = 1,
    storage: SpecStorageOpt = None,
    tracking_uri: UriOpt = None,
    force: ForceOpt = False,
    print_config: Annotated[bool, typer.Option("--print-config", help="Print the config every trial starts from "
                                               "(base and \\[fixed]) as TOML and exit.")] = False,
) -> None:
    """Create or resume the study and run it to the end with local workers."""
    from .sweep_spec import load_spec

    s = load_spec(spec)
    if print_config:
        swept = ", ".join([p.key for p in s.space] + ["seed"])
        typer.echo(f"# sweep {s.name} ({s.kind}): the config before each trial's values of {swept}")
        return _print_config(s.trial_config({}), ("theory",) if s.kind == "theory" else
                             ("hmm", "data", "model", "train"))
    storage = checks.optuna_storage(storage or s.storage or None)
    uri = checks.tracking_store(tracking_uri)
    checks.sweep_memory(s, workers=workers, force=force)
    from . import tracking
    from .sweep import run_sweep

    with SweepProgress(s.name, s.n_trials) as bar:
        res = run_sweep(s, workers=workers, storage=storage, uri=uri, log=bar.log, progress=bar)
        bar({"complete": res.complete, "pruned": res.pruned, "failed": res.failed, "running": 0}, res.n_trials)
    if res.already_complete:
        typer.echo(f"sweep {res.study_name} is already complete: nothing to do")
    typer.echo(f"sweep {res.study_name}: {res.complete} complete, {res.failed} failed, {res.pruned} pruned of "
               f"{res.n_trials} ({res.retried} retried); MLflow parent run {res.parent_run_id}")
    typer.echo(f"report: hmmscope report {res.study_name}    browse: {tracking.ui_command(uri)}")
    if res.killed_workers:
        typer.echo(f"warning: {len(res.killed_workers)} worker(s) were killed (exit codes {res.killed_workers}: "
                   "minus the signal); their trials were retried", err=True)
    if res.crashed_workers:
        typer.echo(f"error: {len(res.crashed_workers)} worker(s) crashed (exit codes {res.crashed_workers}); "
                   "see their output above", err=True)
    if not res.finished or res.crashed_workers:
        raise typer.Exit(1)


@sweep_app.command("worker")
@user_errors
def sweep_worker_cmd(
    study: Annotated[str, typer.Argument(help="Study name (the spec's sweep.name).")],
    storage: Annotated[str, typer.Option("--storage", help="The study's Optuna storage URL.")],
    max_trials: Annotated[int | None, typer.Option(min=1, help="Stop after this many trials.")] = None,
    gpu: Annotated[int | None, typer.Option(min=0, help="Use only this GPU (index among the visible ones).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Join a study from this machine (e.g. a GPU box sharing a PostgreSQL storage)."""
    checks.safe_name(study, "study")
    storage = checks.optuna_storage(storage, must_exist=True)
    uri = checks.tracking_store(tracking_uri, must_exist=True)
    from .sweep import pin_gpu, run_worker, spec_of_study

    spec_of_study(study, storage)  # an unknown study fails here, before any trial
    if gpu is not None:
        pin_gpu(gpu)
    n = run_worker(study, storage, uri, max_trials=max_trials, log=lambda m: typer.echo(m, err=True))
    typer.echo(f"worker ran {n} trial(s) of {study}")


@sweep_app.command("status")
@user_errors
def sweep_status_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = None,
    tracking_uri: UriOpt = None,
) -> None:
    """The study's trials: state, params, objective value, MLflow run, retries; marks orphan runs KILLED."""
    checks.safe_name(study, "study")
    url = checks.optuna_storage(storage, must_exist=True, write=False)
    from . import tracking
    from .sweep import study_orphans, study_status

    rows = study_status(study, url)
    _print_table(f"study {study}", [{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()}
                                    for r in rows])
    study_orphans(study, url, tracking.resolve_uri(tracking_uri), log=lambda m: typer.echo(m, err=True))


@sweep_app.command("list")
@user_errors
def sweep_list_cmd(storage: StorageOpt = None) -> None:
    """The studies in the storage, with their trial counts per state."""
    url = checks.optuna_storage(storage, must_exist=True, write=False)
    from .studies import list_studies
    from .sweep import _safe_url

    rows = list_studies(url)
    _print_table(f"studies in {_safe_url(url)}", rows)
    typer.echo(f"{len(rows)} stud{'y' if len(rows) == 1 else 'ies'}")


@sweep_app.command("export")
@user_errors
def sweep_export_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    path: Annotated[Path | None, typer.Argument(help="Output file (default: standard output).")] = None,
    csv_: Annotated[bool, typer.Option("--csv", help="As CSV (the one format, so also without --csv).")] = True,
    storage: StorageOpt = None,
) -> None:
    """One CSV row per trial: number, state, value, times, params, user attrs, MLflow run id."""
    checks.safe_name(study, "study")
    url = checks.optuna_storage(storage, must_exist=True, write=False)
    out = None if path is None else checks.output_file(path, "output", suffix=".csv")
    from .studies import csv_text, export_rows, write_csv

    rows = export_rows(study, url)
    if out is None:
        typer.echo(csv_text(rows), nl=False)
    else:
        write_csv(rows, out)
        typer.echo(f"wrote {len(rows)} trial(s) of {study} to {out}", err=True)


@sweep_app.command("delete")
@user_errors
def sweep_delete_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    storage: StorageOpt = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Delete the study and its MLflow runs (the sweep's parent run and every trial run below it); asks first."""
    checks.safe_name(study, "study")
    url = checks.optuna_storage(storage, must_exist=True)
    uri = checks.tracking_store(tracking_uri, must_exist=True)
    from .studies import delete_study, study_runs
    from .sweep import _safe_url

    found = study_runs(study, url, uri)
    what = (f"study {study!r} ({found.n_trials} trials) in {_safe_url(url)} and {len(found.run_ids)} MLflow run(s)"
            + (f" in experiment(s) {', '.join(found.experiments)}" if found.experiments else "")
            + (f"; {found.n_running} trial(s) are RUNNING: their workers will fail" if found.n_running else ""))
    if not yes and not typer.confirm(f"Delete {what}?", default=False, err=True):
        typer.echo("nothing deleted", err=True)
        raise typer.Exit(1)
    delete_study(found, url, uri)
    typer.echo(f"deleted {what}")


@runs_app.command("gc")
@user_errors
def runs_gc_cmd(
    experiment: Annotated[list[str] | None, typer.Option(help="Only this experiment (repeatable; default all).")] = None,
    dry_run: Annotated[bool, typer.Option(help="List the orphan runs without marking them.")] = False,
    tracking_uri: UriOpt = None,
) -> None:
    """Mark orphan RUNNING runs (their process is gone, or no heartbeat) KILLED, with the reason."""
    from . import tracking

    uri = tracking.resolve_uri(tracking_uri)
    try:
        found = tracking.gc_runs(uri, experiments=experiment or None, dry_run=dry_run)
    except Exception as e:  # e.g. a read-only store: say so in one line
        fail(f"cannot mark orphan runs in {uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", 1)
    _print_table("orphan runs" + (" (dry run: not marked)" if dry_run else " marked KILLED"),
                 [{"run": r.info.run_id, "name": r.info.run_name, "reason": why} for r, why in found])
    typer.echo(f"{len(found)} orphan run(s) {'found' if dry_run else 'marked KILLED'}")


@app.command("report")
@user_errors
def report_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep (study) name or its MLflow parent run id.")],
    out: Annotated[Path | None, typer.Option(help="Folder for report.md / report.html (default out/NAME).")] = None,
    storage: Annotated[str | None, typer.Option("--storage", help="The study's Optuna storage URL (default: "
                                                "optuna.db beside the tracking store, the URL the sweep recorded, "
                                                "./mlruns/optuna.db).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Statistical report of a sweep (Markdown + HTML, figures), also logged to the sweep's parent run."""
    checks.safe_name(sweep, "sweep")
    out = checks.output_dir(out or Path("out") / sweep, "--out")
    uri = checks.tracking_store(tracking_uri, must_exist=True)
    from .report import build_report

    if storage is not None:
        storage = checks.optuna_storage(storage, must_exist=True, write=False)
    rep = build_report(uri, sweep, out, storage=storage)
    for line in rep.summary_lines():
        typer.echo(line)


def _die_with_parent():
    """preexec_fn (Linux): the child gets SIGTERM when this process dies, even by SIGKILL (PR_SET_PDEATHSIG);
    a child whose parent is already gone stops at once. None where prctl does not exist."""
    import os
    import signal

    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()  # loaded here: no imports after fork

    def preexec() -> None:
        libc.prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _answers(url: str, ok_only: bool = True) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200 or not ok_only
    except urllib.error.HTTPError:
        return not ok_only
    except OSError:
        return False


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_groups(procs) -> None:
    """SIGTERM each server's process group (by the group's id, its leader's pid), then SIGKILL what is left
    after 15 s. Returns once every member of every group is gone (the leader reaped)."""
    import os
    import signal
    import time

    def alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + 15
    for p in procs:
        while p.poll() is None or alive(p.pid):  # poll() reaps the leader: a zombie still counts as a member
            if time.time() > deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.1)


@app.command("ui")
@user_errors
def ui_cmd(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the MLflow UI.")] = 5000,
    optuna: Annotated[bool, typer.Option("--optuna-dashboard", help="Also start optuna-dashboard.")] = False,
    storage: StorageOpt = None,
    dashboard_port: Annotated[int, typer.Option(min=1, max=65535, help="Port of optuna-dashboard.")] = 8080,
    tracking_uri: UriOpt = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 on this project's store (and optuna-dashboard on the studies).

    The URLs are printed once the servers answer; the servers' own output goes to a log file (shown if one
    fails). The servers stop with this command: Ctrl-C, SIGTERM, SIGHUP, or its death (Linux).
    """
    import os
    import shlex
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    uri = checks.tracking_store(tracking_uri)
    if optuna:
        storage = checks.optuna_storage(storage)
    for p_, what in [(port, "--port")] + ([(dashboard_port, "--dashboard-port")] if optuna else []):
        if not _port_free(p_):
            raise ConfigError(f"{what} {p_}: the port is in use on 127.0.0.1")
    if optuna and port == dashboard_port:
        raise ConfigError("--port and --dashboard-port must differ")
    from . import tracking
    from .sweep import default_storage

    tracking.ensure_store(uri)
    mlflow = shlex.split(tracking.ui_command(uri, port))
    mlflow[0] = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
    mlflow += ["--registry-store-uri", uri, "--workers", "1",
               "--uvicorn-opts", "--log-level warning --no-access-log"]  # no per-request lines
    servers = [("MLflow UI", mlflow, f"http://127.0.0.1:{port}", "/health")]
    if optuna:
        exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
        if not Path(exe).exists():
            raise ConfigError("optuna-dashboard is not installed: pip install optuna-dashboard")
        servers.append(("optuna-dashboard", [exe, storage or default_storage(), "--host", "127.0.0.1",
                                             "--port", str(dashboard_port)], f"http://127.0.0.1:{dashboard_port}", "/"))
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "PYTHONWARNINGS": "ignore:starlette.middleware.wsgi is deprecated"}
    fd, log_path = tempfile.mkstemp(prefix="hmmscope-ui-", suffix=".log")

    def _stop(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):  # `kill PID`, a closed terminal: stop as Ctrl-C does
        signal.signal(sig, _stop)
    procs: list[subprocess.Popen] = []
    failed = None
    try:
        with os.fdopen(fd, "wb") as log:
            for _, cmd, _, _ in servers:  # own group: we stop it whole; dies with us even on SIGKILL
                procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True, preexec_fn=_die_with_parent()))
        with Spinner("starting the MLflow UI" + (" and optuna-dashboard" if optuna else "")):
            for (name, _, url, path), p in zip(servers, procs, strict=True):
                while not _answers(url + path, ok_only=path == "/health"):
                    if p.poll() is not None:
                        failed = f"{name} exited with code {p.returncode} before it answered"
                        break
                    time.sleep(0.25)
                if failed:
                    break
        if failed is None:
            typer.echo("  ".join(f"{name}: {url}" for name, _, url, _ in servers) + "  (Ctrl-C to stop)")
            while all(p.poll() is None for p in procs):
                time.sleep(0.5)
            failed = next(f"{name} exited with code {p.returncode}" for (name, _, _, _), p in
                          zip(servers, procs, strict=True) if p.poll() is not None)
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the cleanup
            signal.signal(sig, signal.SIG_IGN)
        _stop_groups(procs)
    if failed is not None:
        tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-15:]
        typer.echo(f"error: {failed}; its log ({log_path}) ends:", err=True)
        for line in tail:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(1)
    Path(log_path).unlink(missing_ok=True)


class Spinner:
    """A spinner on stderr while something silent runs: a terminal only (nothing otherwise, or with no text).
    A context manager; `stop()` ends it early (idempotent), e.g. when another display takes over."""

    def __init__(self, text: str | None, console=None):
        self.text, self._status = text, None
        self.console = console

    def __enter__(self):
        console = self.console or _console(stderr=True)
        if self.text and console.is_terminal:
            self._status = console.status(self.text, spinner="dots")
            self._status.__enter__()
        return self

    def stop(self) -> None:
        status, self._status = self._status, None
        if status is not None:
            status.__exit__(None, None, None)

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- bench


@bench_app.command("sample")
@user_errors
def bench_sample_cmd(
    n_seqs: Annotated[int, typer.Option(min=1, help="Sequences sampled at once.")] = 4096,
    length: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 256,
    paper: Annotated[bool, typer.Option(help="Also time the paper-scale dataset (131,072 episodes).")] = True,
    force: ForceOpt = False,
) -> None:
    """Sampler tokens/s vs hmmlearn's CategoricalHMM.sample on one 128-state, 16-token, rank-8 HMM."""
    checks.memory(checks.tokens_memory(n_seqs, length, "sample"), force=force)
    if paper:
        checks.memory(memory_estimate(preset("paper"), "generate"), force=force, what="the paper-scale dataset")
    from .bench import bench_paper_dataset, bench_sample

    r = bench_sample(n_seqs=n_seqs, length=length)
    typer.echo(f"sample: hmmscope {r['ours_tokens_per_s']:,.0f} tokens/s ({n_seqs} x {length}), "
               f"hmmlearn {r['hmmlearn_tokens_per_s']:,.0f} tokens/s; ratio {r['ratio']:.1f}x")
    if paper:
        p = bench_paper_dataset()
        typer.echo(f"paper dataset: {p['episodes']:,.0f} episodes ({p['tokens']:,.0f} tokens) in {p['total_s']:.1f} s "
                   f"(mixture {p['mixture_s']:.1f} s, episodes {p['episodes_s']:.1f} s)")


def _bench_threads(threads: int | None) -> None:
    """Set torch's (and numba's, when installed) thread count for a benchmark; None keeps the default."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    try:
        import numba
    except ImportError:
        return
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="Threads for torch (and numba); default: torch's.")]


@bench_app.command("filter")
@user_errors
def bench_filter_cmd(
    n_seqs: Annotated[int, typer.Option(min=1, help="Sequences filtered at once.")] = 4096,
    length: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 256,
    peer_length: Annotated[int, typer.Option(min=1, help="Tokens in hmmlearn's one sequence.")] = 20000,
    threads: ThreadsOpt = None,
    force: ForceOpt = False,
) -> None:
    """Filter tokens/s on one 128-state, 16-token HMM: dense vs hmmlearn, low-rank vs dense, each vs its GEMM limit."""
    checks.memory(checks.tokens_memory(n_seqs, length, "filter"), force=force)
    from .bench import bench_filter

    _bench_threads(threads)
    r = bench_filter(n_seqs=n_seqs, length=length, peer_length=peer_length)
    S, V, d = r["n_states"], r["n_tokens"], r["rank"]
    typer.echo(f"filter, {n_seqs} x {length} tokens, {S} states, {V} tokens, {r['threads']} torch threads "
               f"(hmmlearn: one sequence, single-threaded); best of {r['rounds']} interleaved rounds")
    typer.echo(f"  dense   hmmscope.predictive float32  {r['dense_f32_tokens_per_s']:>12,.0f} tokens/s   <- headline")
    typer.echo(f"  dense   hmmscope.predictive float64  {r['dense_f64_tokens_per_s']:>12,.0f} tokens/s   "
               f"(float32 - float64: max |diff| {r['f32_vs_f64_max_abs']:.1e})")
    typer.echo(f"  dense   hmmlearn score, log          {r['hmmlearn_log_tokens_per_s']:>12,.0f} tokens/s   "
               f"dense float32 / this = {r['ratio_log']:.1f}x")
    typer.echo(f"  dense   hmmlearn score, scaling      {r['hmmlearn_scaling_tokens_per_s']:>12,.0f} tokens/s   "
               f"dense float32 / this = {r['ratio_scaling']:.1f}x")
    typer.echo(f"  rank {d}  hmmscope.predictive float32  {r['lowrank_f32_tokens_per_s']:>12,.0f} tokens/s   "
               f"low-rank / dense = {r['ratio_lowrank_dense']:.2f}x (max |diff| vs dense float64 "
               f"{r['lowrank_vs_dense_max_abs']:.1e})")
    typer.echo(f"  limit   fp32 GEMM ({min(n_seqs, 1024)}, {S}) x ({S}, {S}), measured now: "
               f"{r['gemm_dense_flops'] / 1e9:.1f} GFLOP/s; dense at 2 S^2 FLOPs/token: "
               f"{r['dense_flops'] / 1e9:.1f} GFLOP/s = {100 * r['dense_frac_gemm']:.0f}% "
               f"(counting the (S, S + V) product it runs: {100 * r['dense_frac_gemm_step']:.0f}% of that GEMM)")
    typer.echo(f"  limit   fp32 GEMM ({n_seqs}, {d}) x ({d}, {V * d + V}), measured now: "
               f"{r['gemm_lowrank_flops'] / 1e9:.1f} GFLOP/s; low-rank at 2 d (V d + V) FLOPs/token: "
               f"{r['lowrank_flops'] / 1e9:.1f} GFLOP/s = {100 * r['lowrank_frac_gemm']:.0f}%")


@bench_app.command("oracle")
@user_errors
def bench_oracle_cmd(
    n_tasks: Annotated[str, typer.Option(help="Comma-separated task counts.")] = "512,2048,8192",
    n_episodes: Annotated[int, typer.Option(min=1, help="Held-out episodes timed per task count.")] = 16,
    dtype: Annotated[str, typer.Option(help="float32 or float64 (evaluate and train use float64).")] = "float64",
    threads: ThreadsOpt = None,
    device: Annotated[str, typer.Option(help="cpu (the numba kernel) or cuda / cuda:N (the torch path).")] = "cpu",
    chunk_tasks: Annotated[str, typer.Option(help="On CUDA: comma-separated tasks per chunk to time, "
                                                  "'auto' for the oracle's own choice.")] = "auto",
) -> None:
    """Mixture-oracle cost vs n_tasks at the paper's shape (128 states, 16 tokens, rank 8, 358 tokens)."""
    from .bench import bench_oracle
    from .train import resolve_device

    dev = resolve_device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    try:
        chunks = [None if x.strip() == "auto" else int(x) for x in chunk_tasks.split(",")]
    except ValueError:
        raise ValueError(f"--chunk-tasks must be 'auto' or comma-separated integers, got {chunk_tasks!r}") from None
    if any(c is not None and c < 1 for c in chunks):
        raise ValueError(f"--chunk-tasks must be positive, got {chunk_tasks!r}")
    if dev.type == "cpu" and chunks != [None]:
        raise ValueError("--chunk-tasks applies to --device cuda (the CPU kernel chooses its own chunks)")

    if dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype must be float32 or float64, got {dtype!r}")
    try:
        counts = [int(x) for x in n_tasks.split(",")]
    except ValueError:
        raise ValueError(f"--n-tasks must be comma-separated integers, got {n_tasks!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--n-tasks must be positive, got {n_tasks!r}")
    _bench_threads(threads)
    r = bench_oracle(tuple(counts), n_episodes=n_episodes, dtype=dtype, device=str(dev), chunks=tuple(chunks))
    if dev.type == "cuda":
        typer.echo(f"mixture oracle ({r['path']}, {r['dtype']}), {n_episodes} episodes x 358 tokens")
        for row in r["rows"]:
            full = ("measured on the 1024 episodes" if row["measured_full"]
                    else f"1024 episodes, extrapolated: {row['full_s']:.2f} s")
            typer.echo(f"  n_tasks {row['n_tasks']:>5}, chunk {row['chunk_tasks']:>5}"
                       f"{' (auto)' if row['auto_chunk'] else ''}: {row['seconds']:8.3f} s wall, "
                       f"{row['ns_per_task_token']:.3f} ns per (task, episode, token), peak {row['peak_gib']:.1f} GiB; "
                       f"{full}; max |cuda - cpu| {row['max_abs_vs_cpu']:.1e} on 2 episodes")
        return
    typer.echo(f"mixture oracle ({r['path']}, {r['dtype']}, {r['threads']} threads), {n_episodes} episodes x 358 tokens")
    for row in r["rows"]:
        peer = (f"; torch path (CUDA's) {row['torch_path_s_per_episode']:.2f} s/episode = "
                f"{row['torch_path_ratio']:.1f}x slower" if "torch_path_ratio" in row else "")
        typer.echo(f"  n_tasks {row['n_tasks']:>5}: {row['seconds']:8.2f} s wall ({row['cpu_seconds']:.2f} s CPU; "
                   f"tables {row['tables_s']:.2f} s), {row['ns_per_task_token']:6.1f} ns per (task, episode, token) "
                   f"past the tables; 1024 episodes, {'measured' if n_episodes == 1024 else 'extrapolated'}: "
                   f"{row['extrapolated_full_s']:6.0f} s wall, {row['extrapolated_full_cpu_s']:6.0f} s CPU{peer}")


@bench_app.command("train")
@user_errors
def bench_train_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Model shape to time.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    seq_len: Annotated[int, typer.Option(min=2)] = 256,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per repeat.")] = 5,
    peer: Annotated[bool, typer.Option(help="Also time HF transformers' RoFormerForCausalLM.")] = True,
    profile: Annotated[bool, typer.Option(help="One number per source of loss vs the measured GEMM rate.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="Time torch.compile(model) (compile time excluded).")]
    = False,
    threads: ThreadsOpt = None,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Training tokens/s and MFU (vs the matmul rate measured in the same run) for a preset's model, vs HF RoFormer."""
    cfg = build_config(preset_, config, set_, {"train.device": device})
    if print_config:
        return _print_config(cfg, ("hmm", "data", "model", "train"))
    from .bench import bench_train
    from .train import resolve_device

    dev = resolve_device(cfg.train.device)
    need = memory_estimate(cfg, "bench-train", batch_size=batch_size, seq=seq_len)
    checks.memory(need, device=str(dev), force=force, times=2 if peer else 1)
    _bench_threads(threads)
    r = bench_train(cfg, cfg.train.device, batch_size=batch_size, seq_len=seq_len, steps=steps, peer=peer,
                    profile=profile, compile=compile_)
    typer.echo(f"train ({r['device']}{', compiled' if r['compiled'] else ''}, {r['shape']}): "
               f"hmmscope {r['ours_tokens_per_s']:,.0f} tokens/s, {r['flops_per_token'] / 1e6:,.2f} MFLOP/token "
               f"counted (6 N + attention), {r['ours_tflops']:.3f} TFLOP/s")
    for k, rate in r["measured_rates"].items():
        tag = "  <- MFU" if k == r["mfu_denominator"] else ""
        typer.echo(f"  {k} GEMM {r['gemm_shape']} measured now: {rate / 1e12:.3f} TFLOP/s; "
                   f"MFU {100 * r['mfu_all'][k]:.1f}%{tag}")
    if r["cpu_bf16_native"] is False:
        typer.echo("  bf16: this CPU has no native bf16 matmul (no AVX512-BF16/AMX); not measured")
    if r["datasheet_bf16"]:
        typer.echo(f"  ({r['datasheet_what']}: {r['datasheet_bf16'] / 1e12:.0f} TFLOP/s, "
                   f"{100 * r['ours_tflops'] * 1e12 / r['datasheet_bf16']:.1f}% of it; not the MFU denominator)")
    if "profile" in r:
        p = r["profile"]
        typer.echo(f"  profile, seconds per step: step {p['step_s']:.4f} = ideal at the measured GEMM rate "
                   f"{p['ideal_s']:.4f} ({100 * p['ideal_s'] / p['step_s']:.0f}%)")
        for k in ("attention", "optimizer", "other"):
            typer.echo(f"    lost to {k:<9} {p[k + '_s']:.4f} ({100 * p[k + '_s'] / p['step_s']:.0f}% of the step)")
        typer.echo(f"    data (outside the step) {p['data_s']:.4f} ({100 * p['data_s'] / p['step_s']:.0f}% of the step)")
    if "ratio" in r:
        typer.echo(f"peer HF RoFormerForCausalLM: {r['hf_roformer_tokens_per_s']:,.0f} tokens/s; "
                   f"ratio {r['ratio']:.2f}x")


def main() -> None:  # console-script entry point
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
