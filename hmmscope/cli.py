"""The `hmmscope` command line (Typer). Only this module parses user input."""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from .config import Config, ConfigError, flatten, load_toml, override, preset

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Test what transformers learn from mixtures of low-rank hidden Markov models.")
bench_app = typer.Typer(no_args_is_help=True, help="Speed benchmarks against named peers, as ratios.")
app.add_typer(bench_app, name="bench")


class Preset(str, Enum):
    tiny = "tiny"
    paper = "paper"


class Family(str, Enum):
    sticky = "sticky"
    dirichlet = "dirichlet"


class Split(str, Enum):
    train = "train"
    eval = "eval"


PresetOpt = Annotated[Preset, typer.Option(help="Base configuration.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML file with [hmm], [data], ... tables.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set hmm.gamma=0.5 (repeatable).")]
UriOpt = Annotated[str | None, typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI (default: sqlite under ./mlruns).")]
ExpOpt = Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")]


def fail(msg: str, code: int = 2) -> None:
    """One line on stderr, then exit (2 = bad input)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def user_errors(fn):
    """Turn bad input (ConfigError / ValueError) into a one-line error and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, ValueError, FileNotFoundError) as e:
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)

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
) -> None:
    """Write a dataset of episodes (tokens, states, task ids, layout, config and hash) to an .npz file."""
    from .episodes import sample_episodes, save_episodes
    from .hmm import make_mixture

    cfg = build_config(preset_, config, set_)
    n = n if n is not None else (cfg.data.n_train if split == Split.train else cfg.data.n_eval)
    if n < 1:
        raise ConfigError(f"--n must be >= 1, got {n}")
    if out.suffix != ".npz":
        raise ConfigError(f"output must end in .npz, got {out}")
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


def _atomic_write(path: Path, write) -> None:
    """write(tmp_path) then rename: a failure leaves no half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def log_theory(result, uri: str, experiment: str, out_files: list[Path], parent=None) -> str:
    """One parent run for the sweep, a child run per setting; returns the parent's run id."""
    from . import tracking

    cfg = result.config
    with tracking.start_run(uri, experiment, "theory", parent=parent,
                            params={f"theory.{k}": v for k, v in cfg.items()},
                            tags={"hmmscope.kind": "theory"}) as run:
        for s in result.settings:
            p, f = s.params, s.rate_fit
            params = {"hmm.family": p["family"], "hmm.n_states": p["n_states"], "hmm.n_tokens": cfg["n_tokens"],
                      "hmm.rank": p["rank"], "hmm.gamma": p["gamma"], "hmm.alpha": cfg["alpha"], "hmm.rho": p["rho"],
                      "hmm.seed": cfg["seed"], "theory.n_histories": cfg["n_histories"],
                      "theory.burn_in": cfg["burn_in"], "theory.floor": cfg["floor"], "theory.gamma_m": cfg["gamma_m"]}
            name = f"S{p['n_states']}-d{p['rank']}-rho{p['rho']:g}-gamma{p['gamma']:g}"
            with tracking.start_run(uri, experiment, name, parent=run, params=params,
                                    tags={"hmmscope.kind": "theory-setting"}) as child:
                m = {"theory/dobrushin": s.dobrushin, "theory/rate": f.rate, "theory/rate_lo": f.rate_ci[0],
                     "theory/rate_hi": f.rate_ci[1], "theory/log_intercept": f.intercept, "theory/fit_points": f.n_used}
                for key, o in (("gamma_O", s.gamma_O), ("gamma_eff", s.gamma_eff), ("gamma_m", s.gamma_m)):
                    if o is not None:
                        m.update({f"theory/{key}": o["value"], f"theory/{key}_lower": o["lower"],
                                  f"theory/{key}_upper": o["upper"], f"theory/{key}_exact": float(o["exact"])})
                child.log_metrics(m)
                for L, e, se in zip(s.lengths, s.eps, s.stderr):
                    child.log_metrics({"theory/eps": e, "theory/eps_stderr": se}, step=int(L))
                child.set_tags({f"verdict/{v.claim}": f"{v.verdict}: {v.reason}" for v in s.verdicts})
        for fit in result.exponent_fits:
            key = f"theory/exponent/{fit.x_name}/{fit.scope}"
            run.log_metrics({key: fit.k, f"{key}_lo": fit.k_ci[0], f"{key}_hi": fit.k_ci[1]})
        run.set_tags({f"verdict/{v.claim} [{v.scope}]": f"{v.verdict}: {v.reason}" for v in result.verdicts})
        run.log_dict("\n".join(result.summary_lines()) + "\n", "theory_summary.txt")
        for f in out_files:
            run.log_artifact(f)
        return run.run_id


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
    out: Annotated[Path, typer.Option(help="Folder for the figure and the JSON.")] = Path("out/theory"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the full result as JSON here.")] = None,
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope-theory",
    track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
) -> None:
    """Theorem 1 against practice: eps(L) curves, decay rates, the exponent fit and verdicts per setting."""
    from . import tracking
    from .theory import plot_theory, run_theory

    extra = {"theory.family": family.value if family else None, "theory.gammas": _csv(gammas, "--gammas"),
             "theory.ranks": _csv(ranks, "--ranks"), "theory.rhos": _csv(rhos, "--rhos"),
             "theory.n_states": _csv(n_states, "--n-states"), "theory.lengths": _csv(lengths, "--lengths"),
             "theory.n_histories": n_histories}
    th = _theory_config(config, set_, extra)
    if json_path is not None and json_path.suffix != ".json":
        raise ConfigError(f"--json must end in .json, got {json_path}")
    uri = tracking.resolve_uri(tracking_uri) if track else None
    n = len(th.gammas) * len(th.ranks) * len(th.rhos) * len(th.n_states)
    with _progress() as bar:
        task = bar.add_task("theory", total=n)
        result = run_theory(th, progress=lambda i, total, label: bar.update(task, completed=i, description=label))
    fig_path, res_json = out / "theory.png", out / "theory.json"
    payload = json.dumps(result.to_dict(), indent=2)
    _atomic_write(fig_path, lambda p: plot_theory(result, p))
    _atomic_write(res_json, lambda p: p.write_text(payload))
    if json_path is not None:
        _atomic_write(json_path, lambda p: p.write_text(payload))
    _print_table(f"Theorem 1 sweep ({th.family}, V={th.n_tokens}; {result.seconds:.1f} s)", result.table())
    for line in result.summary_lines():
        typer.echo(line)
    typer.echo(f"figure: {fig_path}  result: {res_json}")
    if uri is not None:
        run_id = log_theory(result, uri, experiment, [fig_path, res_json])
        typer.echo(f"MLflow run {run_id} in experiment {experiment!r}; browse: {tracking.ui_command(uri)}")


def main() -> None:  # console-script entry point
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
