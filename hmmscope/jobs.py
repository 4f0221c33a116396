"""The jobs the CLI launches, composed from the library: evaluate a run, analyze it, the headroom, a theory sweep.

Library modules compute; this module wires their results into MLflow runs through `tracking` (the only module that
talks to MLflow) and files under an output folder. Dependencies run one way: the sweep layer (sweep/, report/) and
the main job (`pipeline`, which composes these jobs) call them; this module imports neither.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import tracking
from .config import Config
from .safe_output import make_dir, run_folder, write_npz, write_with


def _run_title(run_name: str | None, run_id: str) -> str:
    return f"run {run_name} ({run_id[:8]})" if run_name else f"run {run_id[:8]}"


@contextlib.contextmanager
def _folder(path: Path | None) -> Iterator[Path]:
    """`path` (created) if given, else a temporary folder removed afterwards."""
    if path is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    else:
        yield make_dir(path)

# ---------------------------------------------------------------- evaluation


def _require_checkpoint(run: tracking.Run) -> None:
    """ValueError naming the path looked for when the run has no checkpoint (before any work)."""
    from .training.checkpoints import CKPT_DIR, CKPT_NAME

    try:
        run.require(f"{CKPT_DIR}/{CKPT_NAME}")
    except FileNotFoundError as e:
        raise ValueError(f"run {run.run_id} has no checkpoint: {e}") from None


class EvalMetrics(dict):
    """evaluate_run's headline metrics (a dict, as before), with `files`: what it wrote under `out` ([] if none),
    `claims`: Figure 1's claims (stats.Claim, decided by stats.decide: the retrieval gap, icl_gain,
    inference_beyond_counting) and `regime`: the regime word (evaluate.regime)."""

    files: list[Path]
    claims: list
    regime: str = "undetermined"


def evaluate_model(model, cfg: Config, step: int, run: tracking.Run, *, device: str = "auto",
                   n_episodes: int | None = None, batch_size: int = 64, out: Path | None = None,
                   say: Callable[[str], Any] | None = None, figures: bool | None = None) -> EvalMetrics:
    """Figure 1 for `model` (trained with `cfg`, `step` optimizer steps, in MLflow run `run`): tables, figure
    (PNG + PDF, unless `figures`, default cfg.train.figures, is false) and headline metrics logged at `step`.

    The model is evaluated as it is, in memory (moved to `device`, eval mode): the main job hands in the model
    it just trained; `evaluate_run` the one it loads from a run's checkpoint.
    Seen tasks: n_episodes (default data.n_eval) held-out episodes of the training tasks (none with fresh tasks,
    hmm.n_tasks = 0); unseen tasks: as many episodes of fresh tasks (episodes.unseen_episodes); references: the
    family-Bayes reference over eval.family_tasks tasks (with its CE at M/4 and M/2), the counting baselines (add-one,
    and the n-gram / CTW fitted on eval.fit_episodes fit-task episodes, with best_counting; their chosen settings
    logged as metrics counting/* and tags hmmscope.counting.*, never params) and the EM learner with eval.em_states
    states (measure/evaluate.py). The claims (retrieval gap, icl_gain, inference_beyond_counting) go to the run's
    table claims.json (with the headline counts claims/<verdict>), the regime word to the tag hmmscope.regime, Figure
    1's wall time to eval/figure1_s (and to `say`, a line). With `out`, the same files are also kept in out/<run
    name>-<id8>/evaluation/ (`run_folder`) and their paths returned in `.files`; without, they live in a temporary
    folder only."""
    import time

    import torch

    from .config import em_states
    from .data.episodes import sample_episodes, unseen_episodes
    from .data.hmm import make_mixture
    from .measure.bayes_gap import bayes_spec
    from .measure.evaluate import figure1, references
    from .measure.figure1_plot import plot_figure1
    from .measure.fixed_memory import memory_comparison
    from .oracles.em_learner import HMMLearner
    from .training.train import resolve_device

    t0, run_id = time.perf_counter(), run.run_id
    dev = resolve_device(device)
    model = model.to(dev).eval()
    n = n_episodes or cfg.data.n_eval
    mix = make_mixture(cfg.hmm) if cfg.hmm.n_tasks > 0 else None
    ep = sample_episodes(mix, cfg.data, n, "eval") if mix is not None else None
    unseen = unseen_episodes(cfg.hmm, cfg.data, n)
    family, counting = references(cfg.hmm, cfg.data, cfg.eval)
    M = cfg.eval.family_tasks
    with torch.no_grad():
        res = figure1(model, mix, ep, device=str(dev), batch_size=batch_size, unseen=unseen, family=family,
                      counting=counting, family_sizes=(M // 4, M // 2), learner=HMMLearner(n_states=em_states(cfg)),
                      bayes=bayes_spec(cfg))
    metrics = res.headline()
    extra: dict[str, Any] = {}
    if cfg.model.window > 0 and mix is not None:
        extra = memory_comparison(model, mix, ep, cfg.model.window, n_layers=cfg.model.n_layers, device=str(dev),
                                  batch_size=batch_size)  # eps at the receptive field n_layers (window - 1) + 1
    elif cfg.model.window > 0:  # fresh tasks: on the unseen tasks, family Bayes as the mixture reference
        extra = memory_comparison(model, unseen[0], unseen[1], cfg.model.window, n_layers=cfg.model.n_layers,
                                  device=str(dev), batch_size=batch_size, reference=family, n_tasks_theory=16,
                                  bayes=bayes_spec(cfg))
    metrics.update({f"memory/{k}": float(v) for k, v in extra.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)})
    info = run.get().info
    with _folder(out and run_folder(out, info.run_name, run_id) / "evaluation") as d:
        files = res.to_csv(d) + (plot_figure1(res, d / "figure1.png", title=_run_title(info.run_name, run_id))
                                 if (cfg.train.figures if figures is None else figures) else [])
        write_with(d / "figure1.json", lambda p: p.write_text(
            json.dumps({**res.to_dict(), "memory": extra}, indent=2, default=str)))
        files.append(d / "figure1.json")
        write_npz(d / "per_episode.npz", res.episode_arrays())
        files.append(d / "per_episode.npz")
        for f in files:
            run.log_artifact(f, "evaluation")
    metrics["eval/figure1_s"] = time.perf_counter() - t0
    if counting is not None:  # what the fit chose is an output: metrics and tags, never params (SCIENCE.md 9)
        metrics.update(counting.fitted()["metrics"])
        run.set_tags(counting.fitted()["tags"])
    run.log_metrics(metrics, step=step)
    run.log_claims(res.claims)
    run.set_tags({"hmmscope.regime": res.regime})
    if say is not None:
        say(f"Figure 1: {metrics['eval/figure1_s']:.1f} s ({len(res.tasks)} task set{'s' if len(res.tasks) > 1 else ''} "
            f"x {n} episodes, k = 0..{res.k_max}); regime: {res.regime}; {_bayes_words(res)}")
    result = EvalMetrics(metrics)
    result.files = files if out is not None else []
    result.claims = list(res.claims)
    result.regime = res.regime
    return result


def _bayes_words(res) -> str:
    """The Bayes gap in words, or why there is none (SCIENCE.md 10)."""
    b, meta = res.bayes, res.meta.get("sets", {}).get("unseen", {}).get("bayes", {})
    if b is None:
        return f"Bayes-optimal reference {meta.get('reason') or 'not computed'}"
    if b["fault"]:
        return (f"FAULT: the model is {-b['gap']:.3f} below the Bayes-optimal reference beyond its Monte Carlo error "
                "(a fault of the reference or the scoring, not a finding)")
    share = f", {b['share']:.2f} of the room above best counting closed" if "share" in b else ""
    return f"Bayes gap {b['gap']:+.3f} [{b['gap_lo']:+.3f}, {b['gap_hi']:+.3f}] nats/token{share}"


def evaluate_run(uri: str, run_id: str, *, device: str = "auto", n_episodes: int | None = None,
                 batch_size: int = 64, out: Path | None = None, say: Callable[[str], Any] | None = None) -> EvalMetrics:
    """`evaluate_model` on a run's last checkpoint (`hmmscope evaluate RUN_ID`), Figure 1 drawn whatever train.figures.

    Bad input (unknown run, no checkpoint, unknown device) raises ValueError before the checkpoint is read.
    It writes into the run, so it holds the run's lease meanwhile (one writer per run): a run another process
    writes (a `train --resume` under way) raises RunHeld, naming it, before anything is read or written."""
    from .training.checkpoints import load_checkpoint, model_from_checkpoint
    from .training.train import resolve_device

    run = tracking.existing_run(uri, run_id)
    _require_checkpoint(run)
    resolve_device(device)
    with tracking.hold_run(uri, run_id):
        with tracking.run_temp_dir(run_id) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(uri, run_id, tmp)
        model, cfg = model_from_checkpoint(ck)
        return evaluate_model(model, cfg, int(ck["step"]), run, device=device, n_episodes=n_episodes,
                              batch_size=batch_size, out=out, say=say, figures=True)


# ---------------------------------------------------------------- analysis (Figures 2, 3a, 3b, belief probes)


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
    import time

    t_start = time.perf_counter() if t_start is None else t_start

    def say(msg: str) -> None:
        if progress is not None:
            progress(f"analyze: {msg}, {time.perf_counter() - t_start:.0f} s")

    import torch

    from .data.episodes import probe_episodes, sample_episodes, unseen_episodes
    from .data.hmm import make_mixture
    from .measure.probes import run_probes
    from .measure.shuffle import shuffle_test
    from .training.train import resolve_device

    if parent_run is None:
        if target is None:
            raise ValueError("analyze_model needs the training run, or the checkpoint file as target")
        parent, parent_name = None, Path(target).stem
    else:
        target = parent_run.run_id
        parent_name = parent_run.get().info.run_name
        parent, experiment = target, tracking.experiment_name(uri, target)
    k_max = cfg.data.l_test - 1
    bad = [k for k in ks if not 1 <= k <= k_max]
    if bad or not ks:
        raise ValueError(f"k must lie in [1, l_test - 1 = {k_max}], got {list(ks) or 'none'}")
    if n_episodes is not None and n_episodes < 8:
        raise ValueError(f"n_episodes must be >= 8 (probes split episodes), got {n_episodes}")
    if isinstance(probe_jobs, bool) or not isinstance(probe_jobs, int) or probe_jobs < 1:
        raise ValueError(f"probe_jobs must be an integer >= 1, got {probe_jobs!r}")
    say(f"{origin} (step {step}, {cfg.model.n_layers} layers x d_model {cfg.model.d_model})")
    dev = resolve_device(device)
    model.to(dev)  # once: the shuffle test and the probes' residuals run there (a 0.8 GB copy each way at the paper)
    params = {"analysis.target": target, "analysis.ks": list(ks), "analysis.n_perms": n_perms, "analysis.seed": seed}
    note = f"Layerwise analysis of {'run ' + target if parent else target} (running)"
    # the run opens when the work starts: its duration is the work's, its metrics arrive phase by phase, and a
    # crash leaves it FAILED with what was logged so far
    with tracking.start_run(uri, experiment, "analysis", parent=parent, params=params,
                            tags={"hmmscope.kind": "analysis"}, note=note, config=cfg, system_metrics=True) as run:
        say(f"analysis run {run.run_id} started; {tracking.browse_line(uri, run_id=run.run_id)}")
        if cfg.hmm.n_tasks > 0:
            mix = make_mixture(cfg.hmm)
            ep = sample_episodes(mix, cfg.data, n_episodes or cfg.data.n_eval, "eval")
        else:  # fresh training tasks: the shuffle test and the probes run on unseen tasks (no task was seen twice)
            mix, ep = unseen_episodes(cfg.hmm, cfg.data, n_episodes or cfg.data.n_eval)
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
            f"Layerwise analysis of {'run ' + target if parent else target}: shuffle test on {len(ep)} episodes, "
            f"probes at k = {', '.join(map(str, ks))} on {len(pep)} episodes; {len(claims)} claims ({tally})")})
        run.log_metrics({**metrics, **{f"analysis/{k}": v for k, v in seconds.items()}}, step=step)
        run.log_claims(claims)
        rid = parent or run.run_id
        title = _run_title(parent_name, rid)
        with _folder(out and run_folder(out, parent_name, rid) / "analysis") as d:
            figs = (("figure2_shuffle", sh), ("figure3_probes", pr)) if (
                cfg.train.figures if figures is None else figures) else ()
            files = [*sh.to_csv(d), *pr.to_csv(d), *(f for n, r in figs for f in r.plot(d / f"{n}.png", title=title))]
            write_with(d / "analysis.json", lambda p: p.write_text(json.dumps(
                {"shuffle": sh.to_dict(), "probes": pr.to_dict(), "seconds": seconds}, indent=2)))
            files.append(d / "analysis.json")
            say(f"tables and figures written ({len(files)} files)")
            for f in files:
                run.log_artifact(f, "analysis")
        # the claims' numbers ride along for sweep objectives (claim/<name>/value...), logged only in claims.json
        result = AnalysisResult(run.run_id, claims, {**metrics, **tracking.claim_keys(claims)}, seconds,
                                files if out is not None else [])
    say(f"logged to MLflow (analysis run {result.run_id})")
    return result


def analyze_run(uri: str, target: str, *, device: str = "auto", n_episodes: int | None = None,
                ks: tuple[int, ...] = (1, 2, 3, 4, 5), n_perms: int = 4, seed: int = 0,
                experiment: str = "hmmscope", probe_tasks: int = 32, min_per_task: int = 30,
                out: Path | None = None, probe_jobs: int = 1, probe_fits: str = "auto",
                progress: Callable[[str], Any] | None = None) -> AnalysisResult:
    """`analyze_model` on a run id's last checkpoint or on a checkpoint file (a run from elsewhere:
    `hmmscope analyze RUN_ID|FILE`); the arguments are analyze_model's. Its figures are drawn whatever train.figures.

    Bad input (unknown run, no checkpoint, k out of range) raises ValueError before any run is created."""
    import time

    from .training.checkpoints import load_checkpoint, model_from_checkpoint, read_checkpoint

    t_start = time.perf_counter()
    if Path(target).suffix == ".pt" or Path(target).is_file():
        ck, run = read_checkpoint(target), None
    else:
        run = tracking.existing_run(uri, target)
        _require_checkpoint(run)
        with tracking.run_temp_dir(target) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(uri, target, tmp)
    model, cfg = model_from_checkpoint(ck)
    return analyze_model(model, cfg, int(ck["step"]), run, uri=uri, target=target, device=device,
                         n_episodes=n_episodes, ks=ks, n_perms=n_perms, seed=seed, experiment=experiment,
                         probe_tasks=probe_tasks, min_per_task=min_per_task, out=out, probe_jobs=probe_jobs,
                         probe_fits=probe_fits, progress=progress, origin="checkpoint loaded", t_start=t_start,
                         figures=True)


# ---------------------------------------------------------------- headroom (SCIENCE.md 9)

HEADROOM_SECTIONS = ("hmm", "data", "eval")


def headroom_job(cfg: Config, uri: str, experiment: str, *, parent: str | None = None, run_name: str = "headroom",
                 tags: dict[str, Any] | None = None, note: str | None = None, device: str = "cpu",
                 n_episodes: int | None = None):
    """`headroom.headroom` (trains nothing) as one MLflow run: params hmm/data/eval, metrics headroom/*
    (HeadroomResult.metrics), the counting fit's choices as metrics counting/* and tags hmmscope.counting.* (outputs,
    never params), the result as headroom.json. n_episodes defaults to data.n_eval (a sweep trial's). Returns
    (result, run_id); the run opens when the work starts."""
    from .measure.headroom import headroom

    n = n_episodes or cfg.data.n_eval
    with tracking.start_run(uri, experiment, run_name, parent=parent,
                            params=tracking.config_params(cfg, HEADROOM_SECTIONS),
                            tags={"hmmscope.kind": "headroom", **(tags or {})},
                            note=note or f"Headroom above counting ({cfg.hmm.family}, S {cfg.hmm.n_states}, V "
                                         f"{cfg.hmm.n_tokens}, gamma {cfg.hmm.gamma:g}): running",
                            config=cfg) as run:
        res = headroom(cfg, n_episodes=n, device=device)
        run.log_metrics({**res.metrics(), **res.fitted["metrics"]})
        run.set_tags(res.fitted["tags"])
        run.log_dict(json.dumps(res.to_dict(), indent=2), "headroom.json")
        run.set_tags({"mlflow.note.content": tracking.note_line(note or res.line())})
    return res, run.run_id


# ---------------------------------------------------------------- theory


def theory_note(cfg: dict) -> str:
    """A theory run's one-line description."""
    def vals(k: str) -> str:
        return ", ".join(f"{v:g}" for v in cfg[k])

    return (f"Theory (Theorem 1): {cfg['family']} HMMs, gamma {vals('gammas')}, rank {vals('ranks')}, rho "
            f"{vals('rhos')}, {vals('n_states')} states, {cfg['n_tokens']} tokens; eps(L) over "
            f"{cfg['n_histories']} histories, seed {cfg['seed']}")


def log_theory(result, uri: str, experiment: str, out_files: list[Path], parent: str | None = None, *,
               run_name: str = "theory", tags: dict[str, Any] | None = None, note: str | None = None,
               run: tracking.Run | None = None) -> str:
    """One parent run for the sweep (params: the theory.* keys only), a child run per setting; returns the
    parent's run id. Claims go to each run as the table claims.json. `run`: the parent, already open (theory_job
    opens it when the work starts); else it is created here."""
    cfg = result.config
    params = {f"theory.{k}": v for k, v in cfg.items()}
    if run is not None:
        run.log_params(params)
        run.log_dict(tracking.config_toml({"theory": cfg}), "config.toml")
        run.set_tags({"mlflow.note.content": tracking.note_line(f"{result.answer()} — {note or theory_note(cfg)}")})
    opened = contextlib.nullcontext(run) if run is not None else tracking.start_run(
        uri, experiment, run_name, parent=parent, params=params, tags={"hmmscope.kind": "theory", **(tags or {})},
        note=f"{result.answer()} — {note or theory_note(cfg)}", config={"theory": cfg}, system_metrics=True)
    with opened as run:
        for s in result.settings:
            p, f = s.params, s.rate_fit
            params = {"hmm.family": p["family"], "hmm.n_states": p["n_states"], "hmm.n_tokens": cfg["n_tokens"],
                      "hmm.rank": p["rank"], "hmm.gamma": p["gamma"], "hmm.alpha": cfg["alpha"], "hmm.rho": p["rho"],
                      "hmm.seed": cfg["seed"], "theory.n_histories": cfg["n_histories"],
                      "theory.burn_in": cfg["burn_in"], "theory.floor": cfg["floor"], "theory.gamma_m": cfg["gamma_m"]}
            name = f"g{p['gamma']:g}-d{p['rank']}-rho{p['rho']:g}-S{p['n_states']}"  # what varies most first
            with tracking.start_run(uri, experiment, name, parent=run, params=params,
                                    tags={"hmmscope.kind": "theory-setting"},
                                    note=f"Theory setting {name}: eps(L) at L = {', '.join(map(str, s.lengths))}; "
                                         f"fitted decay rate {f.rate:.4g}") as child:
                m = {"theory/dobrushin": s.dobrushin, "theory/mixing_rate": s.mixing_rate, "theory/rate": f.rate,
                     "theory/rate_lo": f.rate_ci[0], "theory/rate_hi": f.rate_ci[1],
                     "theory/log_intercept": f.intercept, "theory/fit_points": f.n_used}
                for key, o in (("gamma_O", s.gamma_O), ("gamma_eff", s.gamma_eff), ("gamma_m", s.gamma_m)):
                    if o is not None:
                        m.update({f"theory/{key}": o["value"], f"theory/{key}_lower": o["lower"],
                                  f"theory/{key}_upper": o["upper"], f"theory/{key}_exact": float(o["exact"])})
                child.log_metrics(m)
                for step, dm in s.draw_metrics():  # per HMM draw at step = draw index; the rate CI's MC/between split
                    child.log_metrics(dm, step=step)
                for L, e, se in zip(s.lengths, s.eps, s.stderr):
                    child.log_metrics({"theory/eps": e, "theory/eps_stderr": se}, step=int(L))
                child.log_claims(s.verdicts)
        for fit in result.exponent_fits:
            scope = re.sub(r"\s+", "-", fit.scope.replace("=", ""))  # "S=128 rho=0.02" -> "S128-rho0.02"
            key = f"theory/exponent{'' if fit.y_name == 'rate' else '_excess'}/{fit.x_name}/{scope}"
            run.log_metrics({key: fit.k, f"{key}_lo": fit.k_ci[0], f"{key}_hi": fit.k_ci[1]})
        run.log_claims(result.verdicts)
        run.log_dict("\n".join(result.summary_lines()) + "\n", "theory_summary.txt")
        for f in out_files:
            run.log_artifact(f)
        return run.run_id


def theory_job(th, out: Path, *, uri: str | None, experiment: str, parent: str | None = None,
               progress: Callable[[int, int, str], Any] | None = None, run_name: str = "theory",
               tags: dict[str, Any] | None = None, note: str | None = None,
               on_start: Callable[[str], Any] | None = None, detail: Callable[[str], Any] | None = None):
    """Run the sweep, write theory.png / theory.pdf / theory.json under `out` (the folder itself: callers give
    each job its own, see `new_folder`), log to MLflow if `uri` (a run `run_name` with extra `tags` and the
    one-line `note`; see log_theory; `on_start(run id)` as soon as it is open). `progress` and `detail`: run_theory's
    (a setting done; an HMM draw begun). Returns (result, run_id)."""
    from .theory.theorem1 import plot_theory, run_theory

    def work():
        result = run_theory(th, progress=progress, detail=detail)
        res_json = out / "theory.json"
        figs = plot_theory(result, out / "theory.png")
        write_with(res_json, lambda p: p.write_text(json.dumps(result.to_dict(), indent=2)))
        return result, [*figs, res_json]

    if not uri:
        return work()[0], None
    # the parent run opens when the work starts (its duration is the work's; a crash leaves it FAILED)
    with tracking.start_run(uri, experiment, run_name, parent=parent, tags={"hmmscope.kind": "theory", **(tags or {})},
                            note="Theory (Theorem 1): running", system_metrics=True) as run:
        if on_start is not None:
            on_start(run.run_id)
        result, files = work()
        log_theory(result, uri, experiment, files, run=run, note=note)
    return result, run.run_id
