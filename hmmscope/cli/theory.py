"""`hmmscope generate` (a dataset of episodes to .npz) and `hmmscope theory` (Theorem 1 against practice).

Owns: these two commands' options, checks and printed output, and `print_theory` (the per-setting table, the fits
and the claims; `hmmscope run` prints the same). The work is the library's: `episodes`, `hmm`, `jobs.theory_job`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.config`,
`hmmscope.checks`, `hmmscope.store_checks` and `cli.common`: numpy, torch, mlflow and the jobs are imported inside
the command bodies.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, store_checks, tracking
from ..checks import memory_estimate
from ..config import ConfigError, flatten
from ..interrupts import sigterm_interrupts
from ..safe_output import new_folder, write_with
from ..tracking.store import check_experiment_name
from .common import (
    ConfigOpt,
    ExpOpt,
    Family,
    ForceOpt,
    Preset,
    PrintConfigOpt,
    SetOpt,
    Split,
    UriOpt,
    build_config,
    echo_config,
    nonempty_path,
    parse_csv,
    print_claims,
    print_table,
    progress,
    progress_echo,
    user_errors,
)


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
        return echo_config(cfg, ("hmm", "data"))
    n = n if n is not None else (cfg.data.n_train if split == Split.train else cfg.data.n_eval)
    if n < 1:
        raise ConfigError(f"--n must be >= 1, got {n}")
    checks.output_file(out, "output", suffix=".npz")
    checks.memory(memory_estimate(cfg, "generate", n_episodes=n), force=force)
    from ..data.episodes import sample_episodes, save_episodes  # lazy: numpy off the CLI's start-up
    from ..data.hmm import make_mixture  # lazy: numpy off the CLI's start-up

    mix = make_mixture(cfg.hmm)
    ep = sample_episodes(mix, cfg.data, n, split=split.value)
    save_episodes(ep, out, config=flatten(cfg))
    typer.echo(f"wrote {n} episodes x {ep.tokens.shape[1]} tokens to {out} (dataset hash {ep.meta['dataset_hash']})")


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
    out: Annotated[Path | None, typer.Option(parser=nonempty_path, help="Folder for the figure and the JSON (default: a new "
                                            "out/theory-<UTC time>/).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the full result as JSON here.")] = None,
    tracking_uri: UriOpt = None,
    experiment: ExpOpt = "hmmscope-theory",
    track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Theorem 1 against practice: eps(L) curves, decay rates, the exponent fit and verdicts per setting."""
    extra = {"theory.family": family.value if family else None, "theory.gammas": parse_csv(gammas, "--gammas"),
             "theory.ranks": parse_csv(ranks, "--ranks"), "theory.rhos": parse_csv(rhos, "--rhos"),
             "theory.n_states": parse_csv(n_states, "--n-states"), "theory.lengths": parse_csv(lengths, "--lengths"),
             "theory.n_histories": n_histories}
    cfg = build_config("tiny", config, set_, extra)
    if print_config:
        return echo_config(cfg, ("theory",))
    th = cfg.theory
    out = checks.output_dir(out or new_folder(Path("out"), "theory"), "--out", explicit=out is not None)
    if json_path is not None:
        checks.output_file(json_path, "--json", suffix=".json")
    check_experiment_name(experiment)
    uri = store_checks.tracking_store(tracking_uri) if track else None
    checks.memory(memory_estimate(cfg, "theory"), force=force)
    from ..jobs import theory_job  # lazy: jobs off the CLI's start-up
    n = len(th.gammas) * len(th.ranks) * len(th.rhos) * len(th.n_states)
    plain = not sys.stderr.isatty()  # off a terminal (a file, nohup, Slurm): one line per setting instead of a bar

    def step(i: int, total: int, label: str) -> None:
        bar.update(task, completed=i, description=label)
        if plain:
            progress_echo(f"theory: {i}/{total} settings, {label}")

    def detail(text: str) -> None:  # an HMM draw begins: a setting takes minutes at the default sizes when busy
        bar.update(task, description=text)
        if plain:
            progress_echo(f"theory: {text}")

    with sigterm_interrupts(), progress() as bar:
        task = bar.add_task("theory", total=n)
        result, run_id = theory_job(th, out, uri=uri, experiment=experiment, progress=step, detail=detail,
                                    on_start=lambda rid: typer.echo(f"theory run {rid} started; "
                                                                    f"{tracking.browse_line(uri, run_id=rid)}"))
    if json_path is not None:
        write_with(json_path, lambda p: p.write_text(json.dumps(result.to_dict(), indent=2)))
    print_theory(result, th, where=f"hmmscope runs show {run_id[:8]}" if run_id else str(out / "theory.json"))
    typer.echo(f"figures: {out / 'theory.png'}, {out / 'theory.pdf'}  result: {out / 'theory.json'}")
    if run_id is not None:
        typer.echo(f"MLflow run {run_id} in experiment {experiment!r}; {tracking.browse_line(uri, run_id=run_id)}")


def print_theory(result, th, detail: bool = True, where: str | None = None) -> None:
    """The per-setting table, the fits' summaries, then the claims (only the sweep-level ones unless `detail`); off a
    terminal the table as plain columns, the claims one short line each (`where`: their full text)."""
    print_table(f"Theorem 1 sweep ({th.family}, V={th.n_tokens}; {result.seconds:.1f} s)", result.table())
    for f in [*result.exponent_fits, *result.rank_fits]:
        typer.echo(f.summary)
    print_claims("Theorem 1 claims", result.claims(detail), where=where)
