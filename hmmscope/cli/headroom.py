"""`hmmscope headroom`: the room a family and an episode layout leave above counting, before any training.

Owns: the command's options, checks and printed output. The work is hmmscope.measure.headroom's (SCIENCE.md 9).

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.config`,
`hmmscope.checks`, `interrupts`, `safe_output` and `cli.common`: numpy, torch and the library are imported inside the
command body.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated

import typer

from .. import checks
from ..checks import memory_estimate
from ..config import ConfigError, override
from ..interrupts import sigterm_interrupts
from ..safe_output import write_with
from .common import ConfigOpt, ForceOpt, Preset, PrintConfigOpt, SetOpt, build_config, echo_config, user_errors


@user_errors
def headroom_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Base configuration.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    n_episodes: Annotated[int, typer.Option(help="Unseen-task episodes scored (one task each; the same episodes "
                                                 "as a trained model's Figure 1 with as many).")] = 256,
    family_tasks: Annotated[int | None, typer.Option(
        "--family-tasks", help="M: tasks of the family-Bayes reference (default eval.family_tasks); its CE is also "
                               "shown at M/4 and M/2.")] = None,
    em: Annotated[bool, typer.Option(help="Include the EM-fitted HMM learner (eval.em_states states).")] = True,
    draws: Annotated[int, typer.Option(help="Independent draws of the M family tasks (the room's CI covers the "
                                            "draw when family Bayes sets it).")] = 2,
    tolerance: Annotated[float, typer.Option(help="Family Bayes counts as converged when its CE drops less than "
                                                  "this (nats/token) from M/2 to M.")] = 0.005,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the full result as JSON here.")] = None,
    device: Annotated[str, typer.Option(help="Device of the oracles: cpu, cuda, cuda:N.")] = "cpu",
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Room above counting on unseen tasks, per k, before any training: task oracle, every counting baseline fitted
    on fit-task episodes, the EM learner, family Bayes at M/4, M/2 and M (averaged over --draws draws, with its
    convergence), and the room: best counting minus the best legitimate learner (the EM learner; family Bayes where
    converged), a lower bound with a paired 95% CI (SCIENCE.md 9). Degenerate references are flagged and never
    used. Trains nothing and logs nothing to MLflow."""
    cfg = build_config(preset_, config, set_)
    if family_tasks is not None:
        cfg = override(cfg, {"eval.family_tasks": family_tasks})
    if print_config:
        return echo_config(cfg, ("hmm", "data", "eval"))
    if cfg.eval.family_tasks < 1:
        raise ConfigError("--family-tasks (eval.family_tasks) must be >= 1: the headroom needs family Bayes")
    if cfg.eval.fit_episodes < 8:
        raise ConfigError("eval.fit_episodes must be >= 8: the headroom needs the fitted counting baselines")
    if not 2 <= n_episodes <= 1 << 20:
        raise ConfigError(f"--n-episodes must be in [2, {1 << 20}], got {n_episodes}")
    if not 1 <= draws <= 16:
        raise ConfigError(f"--draws must be in [1, 16], got {draws}")
    if not (math.isfinite(tolerance) and 0 < tolerance <= 1):
        raise ConfigError(f"--tolerance must be in (0, 1] nats/token, got {tolerance}")
    if json_path is not None:
        checks.output_file(json_path, "--json", suffix=".json")
    from ..training.train import resolve_device  # lazy: torch (~1 s) off the CLI's start-up

    dev = resolve_device(device)
    est = memory_estimate(override(cfg, {"hmm.n_tasks": max(1, cfg.eval.family_tasks)}), "bench-oracle",
                          n_episodes=max(n_episodes, cfg.eval.fit_episodes))
    checks.memory(est, device=str(dev), force=force, what="the headroom's references")
    from ..measure.headroom import PLUS_MINUS, SIGN, headroom  # lazy: torch and the oracles (seconds)

    h, d = cfg.hmm, cfg.data
    t0 = time.monotonic()

    def progress(msg: str) -> None:  # at once, on a terminal and off it (stderr: stdout keeps the result)
        stamp = time.strftime("%H:%M:%S")
        typer.echo(f"{stamp} headroom: {msg} ({time.monotonic() - t0:.0f} s)", err=True)

    progress(f"{h.family} family, S = {h.n_states}, V = {h.n_tokens}, d = {h.rank}, gamma {h.gamma:g}; "
             f"{n_episodes} unseen episodes, M = {cfg.eval.family_tasks} family tasks x {draws} draw(s)")
    with sigterm_interrupts():
        res = headroom(cfg, n_episodes=n_episodes, em=em, device=str(dev), draws=draws, tolerance=tolerance,
                       progress=progress)
    typer.echo(f"headroom: {h.family} family, S = {h.n_states}, V = {h.n_tokens}, d = {h.rank}, gamma {h.gamma:g}, "
               f"rho {h.rho:g}; {d.n_demos} demos x {d.l_demo} + {d.l_test} test tokens ({d.test_start}); "
               f"{n_episodes} unseen episodes; {res.meta['seconds']:.1f} s")
    for line in res.table():
        typer.echo(line)
    typer.echo(f"{PLUS_MINUS}; {SIGN}. The room is exact where the Bayes-optimal predictor (bayes) is computed; "
               "elsewhere a lower bound from the legitimate learners: the EM learner, and family Bayes where converged; "
               "a DEGENERATE reference (CE above ln V, or a negative in-context gain) is never used.")
    fits = ", ".join(f"k={k}: {v['best_counting']}" for k, v in sorted(res.counting.get("by_k", {}).items(),
                                                                        key=lambda kv: int(kv[0])))
    if fits:
        typer.echo(f"best counting per k (fitted on {cfg.eval.fit_episodes} fit-task episodes): {fits}")
    if json_path is not None:
        write_with(json_path, lambda p: p.write_text(json.dumps(res.to_dict(), indent=2)))
        typer.echo(f"result: {json_path}")
    typer.echo(res.line())
