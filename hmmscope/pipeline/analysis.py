"""The layerwise analysis of a trained model (Figures 2, 3a, 3b, belief probes), logged as a child run
"analysis" of its training run: the analysis step of the pipeline (`analyze_model`: the model in hand; `analyze_run`:
a run's last checkpoint or a checkpoint file, `hmmscope analyze`).

Library modules compute (measure/shuffle.py, measure/probes/); this module wires their results into MLflow through
`tracking` and files under an output folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import tracking
from ..config import Config
from ..data.episodes import probe_episodes, sample_episodes, unseen_episodes
from ..data.hmm import make_mixture
from ..measure.probes import run_probes
from ..measure.shuffle import shuffle_test
from ..safe_output import run_folder, write_with
from ..training.checkpoints import load_checkpoint, model_from_checkpoint, read_checkpoint
from ..training.train import resolve_device
from .evaluation import output_folder, require_checkpoint, run_title


@dataclass
class AnalysisResult:
    run_id: str  # the MLflow run holding the analysis
    claims: list  # stats.Claim, shuffle test first, then probes
    metrics: dict[str, float]
    seconds: dict[str, float]
    files: list = field(default_factory=list)  # what it wrote under `out` (figures PNG + PDF, tables, JSON)


def _analysis_metrics(shuffle, probes) -> dict[str, float]:
    """The shuffle test's and the probes' numbers as metrics (`probes` None: the shuffle test's only)."""
    m: dict[str, float] = {}
    for r in shuffle.by_layer:
        for key, col in (("norm_change", "mean"), ("norm_change_lo", "ci_lo"), ("norm_change_hi", "ci_hi")):
            if r[col] is not None:
                m[f"shuffle/layer{r['layer']}/{key}"] = r[col]
    if probes is None:
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for r in probes.table:
        for key in ("acc", "acc_lo", "acc_hi", "control_acc", "chance"):
            m[f"probe/{r['target']}/layer{r['layer']}/{key}"] = r[key]
    for r in probes.belief_table:
        for key in ("r2", "r2_lo", "r2_hi", "control_r2"):
            m[f"probe/belief/layer{r['layer']}/{key}"] = r[key]
    for r in probes.summary:
        for key in ("best_acc", "baseline_acc", "token_acc"):
            if key in r:
                m[f"probe/{r['target']}/{key}"] = r[key]
    return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def analyze_model(model, cfg: Config, step: int, parent_run: tracking.Run | None, *, uri: str, target: str | None = None,
                  device: str = "auto", n_episodes: int | None = None, ks: tuple[int, ...] = (1, 2, 3, 4, 5),
                  n_perms: int = 4, seed: int = 0, experiment: str = "hmmscope", probe_tasks: int = 32,
                  min_per_task: int = 30, out: Path | None = None, probe_jobs: int = 1, probe_fits: str = "auto",
                  progress: Callable[[str], Any] | None = None, origin: str = "model in memory",
                  t_start: float | None = None, figures: bool | None = None) -> AnalysisResult:
    """Shuffle test, probes and belief probes for `model` (trained with `cfg`, `step` optimizer steps), in memory.

    `parent_run`: the model's MLflow training run (the main job hands in the run and model it just trained), or
    None for a checkpoint file, whose path is `target` (`analyze_run` loads either). `origin` names where the model
    came from in the first progress line, and `t_start` (a time.perf_counter() value) is when the work began.
    The shuffle test runs on n_episodes (default data.n_eval) eval episodes; the probes on dedicated probe
    episodes (episodes.probe_episodes): min(probe_tasks, n_tasks) seeded tasks, max(min_per_task,
    ceil(n_episodes / tasks)) episodes each, so every probed task has training episodes at any n_tasks.
    The results go to a child run "analysis" of the training run (a standalone run in `experiment` for a checkpoint
    file): metrics, claims as the one table claims.json (with the headline counts claims/<verdict>), tables, JSON and
    figures (PNG + PDF; none when `figures`, default cfg.train.figures, is false) as artifacts. With `out`, the same
    files are kept in out/<training run name>-<id8>/analysis/ (a checkpoint file: out/<file stem>-<analysis id8>/...).
    Bad input (k out of range, too few episodes, bad probe_jobs) raises ValueError before any run is created.
    probe_jobs, probe_fits: run_probes' n_jobs (the same numbers at any value) and fits (auto: torch on CUDA). progress:
    one line per phase as it ends, "analyze: <phase>, <seconds since the start> s" (the probes: one per layer)."""
    t_start = time.perf_counter() if t_start is None else t_start

    def say(msg: str) -> None:
        if progress is not None:
            progress(f"analyze: {msg}, {time.perf_counter() - t_start:.0f} s")

    target, parent, parent_name, experiment = _target(parent_run, target, uri, experiment)
    _check(cfg, ks, n_episodes, probe_jobs)
    say(f"{origin} (step {step}, {cfg.model.n_layers} layers x d_model {cfg.model.d_model})")
    dev = resolve_device(device)
    model.to(dev)  # once: the shuffle test and the probes' residuals run there (a 0.8 GB copy each way at the paper)
    params = {"analysis.target": target, "analysis.ks": list(ks), "analysis.n_perms": n_perms, "analysis.seed": seed}
    what = "run " + target if parent else target
    # the run opens when the work starts: its duration is the work's, its metrics arrive phase by phase, and a
    # crash leaves it FAILED with what was logged so far
    with tracking.start_run(uri, experiment, "analysis", parent=parent, params=params,
                            tags={"hmmscope.kind": "analysis"}, note=f"Layerwise analysis of {what} (running)",
                            config=cfg, system_metrics=True) as run:
        say(f"analysis run {run.run_id} started; {tracking.browse_line(uri, run_id=run.run_id)}")
        mix, ep = _episodes(cfg, n_episodes)
        run.log_params({"analysis.n_episodes": len(ep)})
        say(f"mixture ({mix.n_tasks} tasks) and {len(ep)} eval episodes drawn")
        t0 = time.perf_counter()
        with torch.no_grad():
            sh = shuffle_test(model, ep, n_perms=n_perms, seed=seed, device=str(dev))
        t1 = time.perf_counter()
        run.log_metrics({**_analysis_metrics(sh, None), "analysis/shuffle_s": t1 - t0}, step=step)
        say(f"shuffle test done ({n_perms} permutations, {t1 - t0:.0f} s)")
        n_pt = min(probe_tasks, mix.n_tasks)
        pep = probe_episodes(mix, cfg.data, n_pt, max(min_per_task, -(-len(ep) // n_pt)))
        run.log_params({"analysis.probe_tasks": n_pt, "analysis.probe_episodes": len(pep)})
        say(f"probe episodes drawn ({n_pt} tasks, {len(pep)} episodes)")
        pr = run_probes(model, mix, pep, ks=tuple(ks), seed=seed, device=str(dev), max_tasks=n_pt, n_jobs=probe_jobs,
                        fits=probe_fits, progress=lambda m: say(f"probes: {m}"))
        t2 = time.perf_counter()
        tm = pr.meta["timings"]
        say(f"probes done ({t2 - t1:.0f} s: residuals {tm['residuals_s']:.0f} s, fits {tm['fits_s']:.0f} s summed over "
            f"layers in {pr.meta['n_jobs']} process{'es' if pr.meta['n_jobs'] > 1 else ''}, {pr.meta['fits']})")
        claims = [*sh.claims, *pr.claims]
        metrics = _analysis_metrics(sh, pr)
        seconds = {"shuffle_s": t1 - t0, "probes_s": t2 - t1}
        tally = ", ".join(f"{sum(c.verdict == v for c in claims)} {v}" for v in sorted({c.verdict for c in claims}))
        run.set_tags({"mlflow.note.content": tracking.note_line(
            f"Layerwise analysis of {what}: shuffle test on {len(ep)} episodes, "
            f"probes at k = {', '.join(map(str, ks))} on {len(pep)} episodes; {len(claims)} claims ({tally})")})
        run.log_metrics({**metrics, **{f"analysis/{k}": v for k, v in seconds.items()}}, step=step)
        run.log_claims(claims)
        files = _files(run, sh, pr, seconds, out and run_folder(out, parent_name, parent or run.run_id) / "analysis",
                       run_title(parent_name, parent or run.run_id), cfg.train.figures if figures is None else figures,
                       say)
        # the claims' numbers ride along for sweep objectives (claim/<name>/value...), logged only in claims.json
        result = AnalysisResult(run.run_id, claims, {**metrics, **tracking.claim_keys(claims)}, seconds,
                                files if out is not None else [])
    say(f"logged to MLflow (analysis run {result.run_id})")
    return result


def _target(parent_run: tracking.Run | None, target: str | None, uri: str, experiment: str):
    """(target, parent run id or None, parent's name, experiment) of an analysis: the training run's, or a
    checkpoint file's (`target`, its stem as the name, a standalone run in `experiment`)."""
    if parent_run is None:
        if target is None:
            raise ValueError("analyze_model needs the training run, or the checkpoint file as target")
        return target, None, Path(target).stem, experiment
    target = parent_run.run_id
    return target, target, parent_run.get().info.run_name, tracking.experiment_name(uri, target)


def _check(cfg: Config, ks: tuple[int, ...], n_episodes: int | None, probe_jobs: int) -> None:
    """Bad input: ValueError before any run is created."""
    k_max = cfg.data.l_test - 1
    bad = [k for k in ks if not 1 <= k <= k_max]
    if bad or not ks:
        raise ValueError(f"k must lie in [1, l_test - 1 = {k_max}], got {list(ks) or 'none'}")
    if n_episodes is not None and n_episodes < 8:
        raise ValueError(f"n_episodes must be >= 8 (probes split episodes), got {n_episodes}")
    if isinstance(probe_jobs, bool) or not isinstance(probe_jobs, int) or probe_jobs < 1:
        raise ValueError(f"probe_jobs must be an integer >= 1, got {probe_jobs!r}")


def _episodes(cfg: Config, n_episodes: int | None):
    """(mixture, eval episodes) the shuffle test runs on; with fresh training tasks (no task was seen twice) unseen
    tasks."""
    if cfg.hmm.n_tasks > 0:
        mix = make_mixture(cfg.hmm)
        return mix, sample_episodes(mix, cfg.data, n_episodes or cfg.data.n_eval, "eval")
    return unseen_episodes(cfg.hmm, cfg.data, n_episodes or cfg.data.n_eval)


def _files(run: tracking.Run, sh, pr, seconds: dict[str, float], out: Path | None, title: str, figures: bool,
           say: Callable[[str], Any]) -> list[Path]:
    """The analysis' tables, JSON and (if `figures`) figures, in `out` (kept) or a temporary folder, logged to `run`."""
    with output_folder(out) as d:
        figs = (("figure2_shuffle", sh), ("figure3_probes", pr)) if figures else ()
        files = [*sh.to_csv(d), *pr.to_csv(d), *(f for n, r in figs for f in r.plot(d / f"{n}.png", title=title))]
        write_with(d / "analysis.json", lambda p: p.write_text(json.dumps(
            {"shuffle": sh.to_dict(), "probes": pr.to_dict(), "seconds": seconds}, indent=2)))
        files.append(d / "analysis.json")
        say(f"tables and figures written ({len(files)} files)")
        for f in files:
            run.log_artifact(f, "analysis")
    return files


def analyze_run(uri: str, target: str, *, device: str = "auto", n_episodes: int | None = None,
                ks: tuple[int, ...] = (1, 2, 3, 4, 5), n_perms: int = 4, seed: int = 0,
                experiment: str = "hmmscope", probe_tasks: int = 32, min_per_task: int = 30,
                out: Path | None = None, probe_jobs: int = 1, probe_fits: str = "auto",
                progress: Callable[[str], Any] | None = None) -> AnalysisResult:
    """`analyze_model` on a run id's last checkpoint or on a checkpoint file (a run from elsewhere:
    `hmmscope analyze RUN_ID|FILE`); the arguments are analyze_model's. Its figures are drawn whatever train.figures.

    Bad input (unknown run, no checkpoint, k out of range) raises ValueError before any run is created."""
    t_start = time.perf_counter()
    if Path(target).suffix == ".pt" or Path(target).is_file():
        ck, run = read_checkpoint(target), None
    else:
        run = tracking.existing_run(uri, target)
        require_checkpoint(run)
        with tracking.run_temp_dir(target) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(uri, target, tmp)
    model, cfg = model_from_checkpoint(ck)
    return analyze_model(model, cfg, int(ck["step"]), run, uri=uri, target=target, device=device,
                         n_episodes=n_episodes, ks=ks, n_perms=n_perms, seed=seed, experiment=experiment,
                         probe_tasks=probe_tasks, min_per_task=min_per_task, out=out, probe_jobs=probe_jobs,
                         probe_fits=probe_fits, progress=progress, origin="checkpoint loaded", t_start=t_start,
                         figures=True)
