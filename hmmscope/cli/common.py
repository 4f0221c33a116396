"""What every command shares: option types, the bad-input contract, config building, and output helpers.

Owns: the choice enums (Preset, Family, Split) and the `Annotated` option types several commands use; `fail` and
`user_errors` (bad input -> one line `error: ...`, exit 2; a diverged training or running out of memory -> exit 1);
`build_config` (defaults -> preset -> TOML -> options -> --set) and `config_toml`; and the output helpers (rich
tables and progress on a console, claims one per line, the spinner).

Must not import, at module level, anything beyond typer, the standard library and the light `hmmscope.config` /
`hmmscope.checks` (so `hmmscope --help` stays fast): rich is imported inside the helpers that draw, and torch,
mlflow, optuna, sklearn, scipy never here. Must not import the command modules or `cli.app`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import unicodedata
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import Config, ConfigError, load_toml, override, preset, to_dict


class Preset(StrEnum):
    tiny = "tiny"
    paper = "paper"
    paper_epochs = "paper-epochs"


class Family(StrEnum):
    sticky = "sticky"
    dirichlet = "dirichlet"


class Split(StrEnum):
    train = "train"
    eval = "eval"


def nonempty_path(value: str | Path) -> Path:
    """An option's path, refused when empty (`--out ''` would silently be the current folder)."""
    if str(value) == "":
        raise typer.BadParameter("must not be empty (give a path; '.' for the current folder)")
    return Path(value)


PresetOpt = Annotated[Preset, typer.Option(help="Base configuration.")]
# help text is rich markup: a literal [ is written \\[ (else `[hmm]` vanishes from --help)
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML file with \\[hmm], \\[data], ... tables.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set hmm.gamma=0.5 (repeatable).")]
UriOpt = Annotated[str | None, typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI (default: sqlite under ./mlruns).")]
ExpOpt = Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")]
PrintConfigOpt = Annotated[bool, typer.Option("--print-config", help="Print the resolved config as TOML and exit.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even if the memory estimate exceeds what this machine has.")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N (sets train.device).")]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL; "
                                                "default: ./mlruns/optuna.db).")]


# ---------------------------------------------------------------- bad input


MAX_LINE = 600  # characters of an error line: an echoed input is cut in its middle, its start and its reason kept


def one_line(msg: str, limit: int = MAX_LINE) -> str:
    """`msg` as one printable line: control characters escaped (a path holding a newline or an escape sequence prints
    as `\\n`, `\\x1b`), and at most `limit` characters: a long one keeps its start and its end (where the reason is),
    with how much was cut between."""
    text = "".join(ch if ch == " " or unicodedata.category(ch)[0] != "C" else
                   (repr(ch)[1:-1] if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}") for ch in str(msg))
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]} [... {len(text) - head - tail} characters ...] {text[-tail:]}"


def fail(msg: str, code: int = 2) -> None:
    """One line on stderr (`one_line`: escaped, bounded), then exit (2 = bad input)."""
    typer.echo(f"error: {one_line(msg)}", err=True)
    raise typer.Exit(code)


def _line(e: BaseException) -> str:
    """The error's message for one line: ours (ConfigError) whole, as a user's input in it may hold a newline
    (`one_line` escapes it); another library's first line."""
    if isinstance(e, ConfigError) and str(e).strip():
        return str(e).strip()
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def user_errors(fn):
    """Turn bad input (ConfigError / ValueError / OSError) into a one-line error and exit code 2.

    A diverged training exits 1 with one line naming its FAILED run; running out of memory anyway
    (past --force, or past the estimate) exits 1 with one line. A store that fails under a command (MLflow's
    client after its bounded retries, SQLAlchemy, sqlite3, requests, Optuna's storage) is one line, exit 2.
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
            train = sys.modules.get("hmmscope.training.train")
            if train is not None and isinstance(e, train.DivergedError):
                fail(f"training diverged: {e}; run {e.run_id} ended FAILED (try a smaller train.lr)", code=1)
            if type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e):
                fail(f"out of memory ({_line(e)[:200]}); make the job smaller", code=1)
            raise
        except Exception as e:  # the store failed under us (a server answering 500, a database gone): one line
            from ..tracking.faults import store_error, store_reason  # lazy: tracking.faults off the CLI's start-up

            if not store_error(e):
                raise
            fail(f"the store failed: {store_reason(e)}")

    return wrapper


# ---------------------------------------------------------------- parsing values and the config


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
    out = []
    for sec, values in to_dict(cfg).items():
        if sections is None or sec in sections:
            out += [f"[{sec}]", *(f"{k} = {json.dumps(v)}" for k, v in values.items()), ""]
    return "\n".join(out)


def echo_config(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    """`--print-config`: the config as TOML on stdout."""
    typer.echo(config_toml(cfg, sections), nl=False)  # plain text: rich markup would eat the [tables]


def parse_csv(value: str | None, key: str) -> list[Any] | None:
    """A comma-separated option (`--gammas 0.3,0.5`) as a list of JSON values; None stays None."""
    if value is None:
        return None
    try:
        return [json.loads(v) for v in value.split(",") if v.strip()]
    except json.JSONDecodeError:
        raise ConfigError(f"{key}: expected comma-separated numbers, got {value!r}") from None


def parse_jobs(value: str, key: str) -> int:
    """A worker count: an integer >= 1, or 'auto' = the CPUs this process may use."""
    if value.strip().lower() == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{key}: expected an integer >= 1 or 'auto', got {value!r}")
    return n


# ---------------------------------------------------------------- output


def console(stderr: bool = False):
    """A rich console: the terminal's width on a terminal, else 160 columns."""
    from rich.console import Console  # lazy: rich.console off `hmmscope runs list`

    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 160)


def progress():
    """A transient rich progress bar on stderr (a terminal only)."""
    # lazy: rich.progress off the CLI's start-up
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True, disable=not sys.stderr.isatty(), console=console(stderr=True))


def print_table(title: str, rows: list[dict[str, Any]], *, plain: bool | None = None) -> None:
    """Rows (dicts with the same keys) as a rich table on a terminal; off one (a file, a pipe, Slurm) or with `plain`,
    the title and plain columns (`plain_table`: no box characters, no cell folded across lines); nothing for no
    rows."""
    from rich.table import Table  # lazy: rich.table off `hmmscope runs list`

    if not rows:
        return
    if plain if plain is not None else not sys.stdout.isatty():
        typer.echo(title)
        typer.echo(plain_table([str(c) for c in rows[0]], [list(r.values()) for r in rows]))
        return
    table = Table(title=title, title_justify="left")
    for col in rows[0]:
        table.add_column(str(col), overflow="fold")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    console().print(table)


def cell(v: Any, digits: int = 6) -> str:
    """A table cell as text: floats to `digits` significant digits, NaN / None / NaT as an empty cell."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return "" if v != v else f"{v:.{digits}g}"
    if hasattr(v, "strftime"):
        return "" if str(v) == "NaT" else v.strftime("%Y-%m-%d %H:%M:%S")
    return "" if v is None else str(v)


def plain_table(columns: list[str], rows: list[list[Any]], digits: int = 6) -> str:
    """Columns aligned by two spaces, a header and a rule of dashes; cells as text (`cell`: floats to `digits`
    significant digits), never folded: run ids stay whole, greppable and pasteable."""
    cells = [[cell(v, digits) for v in r] for r in rows]
    width = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, width, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in width]), *(line(r) for r in cells)])


def print_metrics(title: str, metrics: dict[str, float]) -> None:
    print_table(title, [{"metric": k, "value": f"{v:.4g}"} for k, v in sorted(metrics.items())])


def print_files(files) -> None:
    figs = [str(p) for p in files if Path(p).suffix in (".png", ".pdf")]
    if figs:
        typer.echo(f"figures: {', '.join(figs)}")


def print_claims(title: str, claims, *, full: bool | None = None, where: str | None = None) -> None:
    """One line per claim (never folded, so names stay greppable): verdict, claim, value, 95% CI and the decision
    rule that gives the verdict from that CI (stats.decide); with `full` (default: on a terminal) also the statistic
    and the reason. Off a terminal the short form, and once below, where the full text is (`where`, e.g. `hmmscope
    runs show ID`; the claims also sit in the run's claims.json and the output folder's JSON)."""
    full = sys.stdout.isatty() if full is None else full
    typer.echo(title)
    for c in claims:
        line = f"  [{c.verdict}] {c.name} = {c.value:.4g} [95% CI {c.ci_lo:.4g}, {c.ci_hi:.4g}]; rule {c.rule or '-'}"
        typer.echo(line + (f"; statistic: {c.statistic}; reason: {c.reason}" if full else ""))
    if not full and claims and where:
        typer.echo(f"  (each claim's statistic and reason: {where})")


def progress_echo(msg: str) -> None:
    """A progress line on stderr; off a terminal (a log file, nohup, Slurm) with the local date and time first
    (`progress.stamp`)."""
    from ..training.progress import stamp  # lazy: training.progress off the CLI's start-up

    typer.echo(msg if sys.stderr.isatty() else stamp(msg), err=True)


class Spinner:
    """A spinner on stderr while something silent runs, on a terminal (nothing with no text). Off a terminal,
    with `plain` (a prefix such as "train"), the text once as a plain line on stderr, `<plain>: <text> ...`, so
    a log file shows the phase; else nothing. A context manager; `stop()` ends it early (idempotent, and clears
    its line), e.g. before a line is printed or when another display takes over; with `deferred`, entering it shows
    nothing until `start()`."""

    def __init__(self, text: str | None, console=None, plain: str | None = None, deferred: bool = False):
        self.text, self._status, self.plain, self.deferred = text, None, plain, deferred
        self.console = console

    def __enter__(self):
        if not self.deferred:  # deferred: `start()` begins it (e.g. once a line it must follow is printed)
            self.start()
        return self

    def start(self) -> None:
        out = self.console or console(stderr=True)
        if self.text and out.is_terminal:
            self._status = out.status(self.text, spinner="dots")
            self._status.__enter__()
        elif self.text and self.plain:
            progress_echo(f"{self.plain}: {self.text} ...")

    def update(self, text: str) -> None:
        """Say `text` now: the spinner's text on a terminal (started if it was not), else, with `plain`, one more
        plain line `<plain>: <text> ...` (a long setup's pieces, each as it begins)."""
        self.text = text
        if self._status is not None:
            self._status.update(text)
        else:
            self.start()

    def stop(self) -> None:
        status, self._status = self._status, None
        if status is not None:
            status.__exit__(None, None, None)

    def __exit__(self, *exc) -> None:
        self.stop()
