"""`hmmscope sweep run | plan | worker | status | list | export | delete`: Optuna sweeps from the command line.

Owns: the `sweep` command group (`app`), its commands' options, checks and printed output, and `SweepProgress`
(the bar on a terminal, plain lines elsewhere, with the ETA). Studies, workers, trials and their MLflow runs are
the library's: `sweep.spec`, `sweep`, `sweep.studies`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.checks`,
`hmmscope.store_checks` and the cli modules: safe_output, optuna, mlflow, torch, rich's progress bar, the
tracking layer, the report and the sweep layer are imported inside the command bodies (`# lazy:`), off the CLI's
start-up.
"""

from __future__ import annotations

import difflib
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, store_checks
from ..config import RUNTIME_KEYS, ConfigError
from .common import (
    ForceOpt,
    StorageOpt,
    UriOpt,
    console,
    echo_config,
    fail,
    nonempty_path,
    parse_sets,
    plain_table,
    progress_echo,
    user_errors,
)
from .jobs import print_answer
from .report import one_df_warning

app = typer.Typer(no_args_is_help=True, help="Optuna sweeps: every trial an MLflow run under one parent run.")

# the run-time keys come from the one list (config.RUNTIME_KEYS) the README's spec reference cites
SET_HELP = ("Fix a config key for every trial, after the spec's \\[fixed] (repeatable): --set train.steps=50. A swept "
            "key is refused. Part of the sweep's identity: a study created without it is not resumed with it (run a "
            f"copy: --name NEW), except the run-time keys {', '.join(RUNTIME_KEYS)}.")
SpecStorageOpt = Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL; "
                                                    "default: the spec's sweep.storage, else ./mlruns/optuna.db).")]


class SweepProgress:
    """run_sweep's `progress` callback, called with the trial counts about once a second.

    On a terminal: a rich bar on stderr (finished of all trials; done, failed, running; ETA). Otherwise one
    plain line on stderr each time the counts change, with the date and time first (`progress_echo`). ETA: the
    trials left over the rate at which trials finished since the first count (a resumed sweep's earlier trials do
    not count toward the rate); "?" until one has finished. done = complete + pruned; failed = failed for good
    (retried ones are not).
    """

    def __init__(self, name: str, n_trials: int, *, tty: bool | None = None, echo=None, clock=None):
        self.name, self.n = name, n_trials
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.echo = echo or progress_echo
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
            self.bar.console.print(msg, markup=False, highlight=False, soft_wrap=True)  # above the bar, unwrapped
        else:
            self.echo(msg)

    def __enter__(self):
        if self.tty:
            from rich.progress import (  # lazy: rich.progress off the CLI's start-up (a terminal's bar only)
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(TextColumn(f"sweep {self.name}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                console=console(stderr=True), transient=False)  # the final n/n bar stays
            self.task = self.bar.add_task(self.name, total=self.n, detail="starting")
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            bar.__exit__(*exc)


def _bundled_folders() -> tuple[Path, Path]:
    return Path("sweeps"), Path(__file__).resolve().parents[2] / "sweeps"


def bundled_spec(spec: Path) -> Path:
    """A spec named without a path or suffix (`smoke`): sweeps/<name>.toml in the working folder, else in the
    project's own sweeps/ folder (beside the hmmscope package: a source checkout or an editable install). A bare name
    (`smok`, `smok.toml`) that is neither a file nor a bundled spec: ConfigError listing the bundled specs, and the
    closest name (`did you mean smoke`). Anything else is returned as given (load_spec reports it)."""
    if spec.exists() or len(spec.parts) != 1 or spec.suffix not in ("", ".toml"):
        return spec
    if not spec.suffix:
        for folder in _bundled_folders():
            if (folder / f"{spec.name}.toml").is_file():
                return folder / f"{spec.name}.toml"
    names = sorted({p.stem for folder in _bundled_folders() if folder.is_dir() for p in folder.glob("*.toml")})
    close = difflib.get_close_matches(spec.stem, names, n=1)
    raise ConfigError(f"sweep spec not found: {spec}" + (f"; did you mean {close[0]}?" if close else "")
                      + " (no such file here" + (f", nor a bundled spec: {', '.join(names)}" if names else "") + ")")


def resume_command(spec: Path, workers: int, storage: str | None, tracking_uri: str | None, sets: list[str] | None,
                   out: Path | None, report: bool = True) -> str:
    """The `sweep run` command line that resumes this one: its spec, --set values and stores as given (the sweep's
    identity and where it lives), its workers and its report's folder (or --no-report)."""
    argv = ["hmmscope", "sweep", "run", str(spec), *(["--workers", str(workers)] if workers != 1 else []),
            *(a for v in sets or [] for a in ("--set", v)), *(["--storage", storage] if storage else []),
            *(["--tracking-uri", tracking_uri] if tracking_uri else []), *(["--out", str(out)] if out else []),
            *([] if report else ["--no-report"])]
    return shlex.join(argv)


@app.command("run")
@user_errors
def sweep_run_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec (TOML), e.g. sweeps/smoke.toml, or a bundled spec by "
                                         "name, e.g. smoke (sweeps/<name>.toml here, else the project's own).")],
    workers: Annotated[int, typer.Option(min=1, help="Local worker processes (one torch thread each).")] = 1,
    storage: SpecStorageOpt = None,
    tracking_uri: UriOpt = None,
    force: ForceOpt = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="First re-queue the trials that ended "
                                               "FAILED (their retry budget starts again).")] = False,
    print_config: Annotated[bool, typer.Option("--print-config", help="Print the config every trial starts from "
                                               "(base and \\[fixed]) as TOML and exit.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    name: Annotated[str | None, typer.Option("--name", help="Run a copy of the spec under this name: its own study, "
                                             "runs and report (out/NAME); the spec's file is unchanged. Give it "
                                             "again to resume that copy.")] = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="When every trial is done, write the sweep's "
                                         "report (hmmscope report) and end with its answer and its HTML.")] = True,
    out: Annotated[Path | None, typer.Option(parser=nonempty_path, help="The report's folder (default "
                                             "out/NAME).")] = None,
) -> None:
    """Create or resume the study and run it to the end with local workers; then its report: the last two lines are
    the sweep's answer in one sentence and the report's HTML."""
    from ..sweep.rename import renamed  # lazy: the sweep layer (optuna) off the CLI's start-up
    from ..sweep.spec import load_spec, with_sets  # lazy: the same

    storage_opt, out_opt = storage, out  # as given: the resume command repeats them
    s = load_spec(bundled_spec(spec))
    s = with_sets(renamed(s, name) if name is not None else s, parse_sets(set_))
    if print_config:
        swept = ", ".join([p.key for p in s.space] + ["seed"])
        typer.echo(f"# sweep {s.name} ({s.kind}): the config before each trial's values of {swept}")
        return echo_config(s.trial_config({}), ("theory",) if s.kind == "theory" else
                           ("hmm", "data", "model", "train", "eval"))
    storage = store_checks.optuna_storage(storage or s.storage or None)
    uri = store_checks.tracking_store(tracking_uri)
    if report:
        out = checks.output_dir(out or Path("out") / s.name, "--out", explicit=out is not None)
    checks.workers(workers, force=force)
    checks.sweep_memory(s, workers=workers, force=force)
    from .. import tracking  # lazy: the tracking layer off the CLI's start-up
    from ..sweep import SweepDeleted, run_sweep  # lazy: the sweep layer (optuna) off the CLI's start-up
    from ..sweep.status import interrupted_lines, resume_plan  # lazy: the same

    said = resume_plan(s, storage).line()  # a change that does not grow the sweep: refused here, nothing printed
    typer.echo(f"sweep {s.name}: {said + '; ' if said else ''}{tracking.browse_line(uri, sweep=s.name)}")  # at once
    try:
        with SweepProgress(s.name, s.n_trials) as bar:
            res = run_sweep(s, workers=workers, storage=storage, uri=uri, log=bar.log, progress=bar,
                            retry_failed=retry_failed)
            bar({"complete": res.complete, "pruned": res.pruned, "failed": res.failed, "running": 0}, res.n_trials)
    except SweepDeleted as e:  # its workers stopped and its runs ended: one line
        fail(str(e), 1)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: its workers handed their trials back; say what is kept, how to resume
        again = resume_command(spec, workers, storage_opt, tracking_uri, set_, out_opt, report)
        for line in interrupted_lines(s, storage, again):
            typer.echo(line)
        sys.exit(130)
    say_run_result(res, uri, out if report else None)


def say_run_result(res, uri: str, out: Path | None) -> None:
    """What `sweep run` says when its workers are done: the counts and the parent run; the report (written to `out`,
    None: --no-report) with its answer last, or how to write it; killed or crashed workers and FAILED trials
    (then exit 1, as for a sweep not finished)."""
    from .. import tracking  # lazy: the tracking layer off the CLI's start-up

    if res.already_complete:
        typer.echo(f"sweep {res.study_name} is already complete: nothing to do")
    typer.echo(f"sweep {res.study_name}: {res.complete} complete, {res.failed} failed, {res.pruned} pruned of "
               f"{res.n_trials} ({res.retried} retried); MLflow parent run {res.parent_run_id}")
    done = res.finished and not res.failed and not res.crashed_workers
    if out is not None and done:
        from ..report import build_report  # lazy: the report (statsmodels, matplotlib) off the CLI's start-up

        rep = build_report(uri, res.parent_run_id, out, storage=res.storage)
        if (warning := one_df_warning(rep.claims)) is not None:  # before the last three lines: where, answer, report
            typer.echo(warning)
        typer.echo(tracking.browse_line(uri, sweep=res.study_name))
        print_answer(res.study_name, rep)
    else:
        typer.echo(f"report: hmmscope report {res.study_name}    {tracking.browse_line(uri, sweep=res.study_name)}")
    if res.killed_workers:
        typer.echo(f"warning: {len(res.killed_workers)} worker(s) were killed (exit codes {res.killed_workers}: "
                   "minus the signal); their trials were retried", err=True)
    if res.crashed_workers:
        typer.echo(f"error: {len(res.crashed_workers)} worker(s) crashed (exit codes {res.crashed_workers}); "
                   "see their output above", err=True)
    if res.failed:  # cells with no result: the sweep is not done, whatever its workers did
        typer.echo(f"error: {res.failed} trial(s) of sweep {res.study_name} ended FAILED; see `hmmscope sweep status "
                   f"{res.study_name}`, then `hmmscope sweep run SPEC --retry-failed` to run them again", err=True)
    if not res.finished or res.crashed_workers or res.failed:
        raise typer.Exit(1)


@app.command("plan")
@user_errors
def sweep_plan_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec (TOML), or a bundled spec by name.")],
    effect: Annotated[float, typer.Option("--effect", help="The effect to decide, in the objective's units (e.g. "
                                          "0.01 nats/token).")],
    sd: Annotated[float | None, typer.Option("--sd", help="The seed-to-seed SD of the effect, if known.")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="A sweep of this design in the storage whose seeds give "
                                              "the SD (default: the spec's own study, when it has trials).")] = None,
    storage: SpecStorageOpt = None,
) -> None:
    """How many seeds this sweep needs to decide an effect of +-EFFECT with 80% power, before running it (or before
    adding seeds): from --sd, or from the seeds of a sweep of the same design already run (--from)."""
    plan_seeds(spec, effect, sd, from_, storage)


def plan_seeds(spec_path: Path, effect: float, sd: float | None, source: str | None, storage: str | None) -> None:
    """`sweep plan`'s body: checks first (a bad number, spec or sweep is one line, exit 2), then the plan."""
    from ..sweep.spec import load_spec  # lazy: the sweep layer (optuna) off the CLI's start-up

    for name, v in (("--effect", effect), ("--sd", sd)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a number > 0, got {v}")
    s = load_spec(bundled_spec(spec_path))
    if s.sampler != "grid":
        raise ConfigError(f"sweep {s.name} samples with {s.sampler}: it tunes its keys (its answer is a best setting); "
                          "`sweep plan` counts seeds for a grid")
    df = None
    if sd is None:
        from ..sweep import load_study  # lazy: the sweep layer (optuna) off the CLI's start-up
        from ..sweep.compare import trial_frame  # lazy: the same

        name = source or s.name
        checks.safe_name(name, "--from")
        try:  # reading only: a storage that is not there is not created
            url = store_checks.optuna_storage(storage or s.storage or None, must_exist=True, write=False)
            df = trial_frame(s, load_study(name, url))
        except ConfigError:
            if source is not None:  # the sweep asked for: its own one-line reason
                raise
            df = None
        if df is None or df.empty:
            raise ConfigError(f"no seed-to-seed SD to plan from: sweep {name} has no complete trial in this storage; give "
                              "--sd (the SD of the effect over seeds) or --from SWEEP (a sweep of this design)")
    from ..sweep.compare import plan  # lazy: the sweep layer (optuna) off the CLI's start-up

    for line in plan(s, effect, sd=sd, df=df, source=f"sweep {source or s.name}"):
        typer.echo(line)


@app.command("worker")
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
    storage = store_checks.optuna_storage(storage, must_exist=True)
    uri = store_checks.tracking_store(tracking_uri, must_exist=True)
    from ..sweep import SweepDeleted, pin_gpu, run_worker, spec_of_study  # lazy: the sweep layer (optuna) off the CLI's start-up

    spec_of_study(study, storage)  # an unknown study fails here, before any trial
    if gpu is not None:
        pin_gpu(gpu)

    try:
        n = run_worker(study, storage, uri, max_trials=max_trials, log=progress_echo)
    except SweepDeleted as e:
        fail(str(e), 1)
    typer.echo(f"worker ran {n} trial(s) of {study}")


@app.command("status")
@user_errors
def sweep_status_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: StorageOpt = None,
    tracking_uri: UriOpt = None,
) -> None:
    """The study's trials as a plain table: number, state, one column per swept param, seed, objective value (4
    significant digits), MLflow run id (whole, as soon as the run exists), retries, worker, reason. A trial that
    failed and was put back (an interrupt, a dead worker) is RETRIED, its reason naming the trial that took its place.

    It only reads: RUNNING runs whose owner is gone are listed on stderr, and marked KILLED by `hmmscope runs
    gc` or the next `hmmscope sweep run` (as before this command marked them itself)."""
    checks.safe_name(study, "study")
    url = store_checks.optuna_storage(storage, must_exist=True, write=False)
    from .. import tracking  # lazy: the tracking layer off the CLI's start-up
    from ..sweep import spec_of_study, study_status  # lazy: the sweep layer (optuna) off the CLI's start-up

    uri = tracking.resolve_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):  # a server gets its health check, with a total deadline
        store_checks.tracking_store(uri, must_exist=True, write=False)
    rows = study_status(study, url)
    try:
        spec = spec_of_study(study, url)
        keys, experiment = [p.key for p in spec.space], spec.experiment
    except Exception:  # a study hmmscope did not finish creating: its trials' own params
        keys, experiment = sorted({k for r in rows for k in r["params"] if k != "seed"}), None

    def worker(w) -> str:
        return "" if not w else f"{w.get('host', '?')}:{w.get('pid', '?')}" + (f" gpu {w['gpu']}" if w.get("gpu") else "")

    def state(r) -> str:  # a failed trial that was put back is RETRIED (its cell is the retry's), never FAIL
        return "RETRIED" if r["retried_as"] is not None else r["state"]

    def reason(r) -> str:
        why = " ".join(str(r["reason"] or "").split())
        return f"{why}; retried as trial {r['retried_as']}" if r["retried_as"] is not None else why

    cols = ["number", "state", *keys, "seed", "value", "run_id", "retried_from", "worker", "reason"]
    table = [[r["number"], state(r), *(r["params"].get(k) for k in keys), r["seed"], r["value"],
              r["mlflow_run_id"], r["retried_from"], worker(r["worker"]), reason(r)]
             for r in sorted(rows, key=lambda r: r["number"])]
    typer.echo(plain_table(cols, table, digits=4))
    n = {s_: sum(state(r) == s_ for r in rows) for s_ in ("COMPLETE", "RUNNING", "WAITING", "FAIL", "RETRIED", "PRUNED")}
    typer.echo(f"{len(rows)} trial(s): " + ", ".join(f"{v} {'failed' if k == 'FAIL' else k.lower()}"
                                                     for k, v in n.items() if v))
    if experiment is not None:
        try:
            orphans = tracking.gc_runs(tracking.resolve_uri(tracking_uri), experiments=[experiment], dry_run=True)
        except Exception:  # an unreachable store: the study's table stands
            orphans = []
        for r, why in orphans:
            typer.echo(f"orphan run {r.info.run_id} ({r.info.run_name}) is still RUNNING: {why}; "
                       "`hmmscope runs gc` marks it KILLED", err=True)


@app.command("list")
@user_errors
def sweep_list_cmd(storage: StorageOpt = None) -> None:
    """The studies in the storage, with their trial counts per state."""
    url = store_checks.optuna_storage(storage, must_exist=True, write=False)
    from ..sweep.storage import safe_url  # lazy: the sweep layer (optuna) off the CLI's start-up
    from ..sweep.studies import list_studies  # lazy: the same

    rows = list_studies(url)
    typer.echo(f"studies in {safe_url(url)}")
    if rows:  # plain columns, as `runs list` and `sweep status` print them
        typer.echo(plain_table(list(rows[0]), [list(r.values()) for r in rows]))
    typer.echo(f"{len(rows)} stud{'y' if len(rows) == 1 else 'ies'}")


@app.command("export")
@user_errors
def sweep_export_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    path: Annotated[Path | None, typer.Argument(help="Output file (default: standard output).")] = None,
    csv_: Annotated[bool, typer.Option("--csv", help="As CSV (the one format, so also without --csv).")] = True,
    storage: StorageOpt = None,
) -> None:
    """One CSV row per trial: number, state, value, times, params, user attrs, MLflow run id."""
    checks.safe_name(study, "study")
    url = store_checks.optuna_storage(storage, must_exist=True, write=False)
    out = None if path is None else checks.output_file(path, "output", suffix=".csv")
    from ..safe_output import csv_text, write_csv  # lazy: safe_output (~10 ms: secrets, random) off the CLI's start-up
    from ..sweep.studies import export_rows  # lazy: the sweep layer (optuna) off the CLI's start-up

    rows = export_rows(study, url)
    if out is None:
        typer.echo(csv_text(rows), nl=False)
    else:
        write_csv(out, rows)
        typer.echo(f"wrote {len(rows)} trial(s) of {study} to {out}", err=True)


@app.command("delete")
@user_errors
def sweep_delete_cmd(
    study: Annotated[str, typer.Argument(help="Study name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    storage: StorageOpt = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Delete the study and its MLflow runs (the sweep's parent run and every trial run below it); asks first."""
    checks.safe_name(study, "study")
    url = store_checks.optuna_storage(storage, must_exist=True)
    uri = store_checks.tracking_store(tracking_uri, must_exist=True)
    from ..sweep.storage import safe_url  # lazy: the sweep layer (optuna) off the CLI's start-up
    from ..sweep.studies import delete_study, live_writers, study_runs  # lazy: the same

    found = study_runs(study, url, uri)
    why = live_writers(found, uri)  # a sweep still written is not deleted: before anything is asked or deleted
    if why is not None:
        raise ConfigError(why)
    what = (f"study {study!r} ({found.n_trials} trials) in {safe_url(url)} and {len(found.run_ids)} MLflow run(s)"
            + (f" in experiment(s) {', '.join(found.experiments)}" if found.experiments else "")
            + (f"; {found.n_running} trial(s) are RUNNING, their workers gone" if found.n_running else ""))
    if not yes and not typer.confirm(f"Delete {what}?", default=False, err=True):
        typer.echo("nothing deleted", err=True)
        raise typer.Exit(1)
    delete_study(found, url, uri)
    typer.echo(f"deleted {what}")
