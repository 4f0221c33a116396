"""Figure 1 of a trained model, logged to its run: the evaluation step of the pipeline (`evaluate_model`: the model
in hand; `evaluate_run`: a run's last checkpoint, `hmmscope evaluate`).

Library modules compute (measure/evaluate.py, fixed_memory, bayes_gap, figure1_plot); this module wires their
results into the training run through `tracking` (the only module that talks to MLflow) and files under an output
folder. Also the helpers the analysis shares: `run_title`, `output_folder`, `require_checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .. import tracking
from ..config import Config, em_states
from ..data.episodes import sample_episodes, unseen_episodes
from ..data.hmm import make_mixture
from ..measure.bayes_gap import bayes_spec
from ..measure.evaluate import figure1, references
from ..measure.figure1_plot import plot_figure1
from ..measure.fixed_memory import memory_comparison
from ..oracles.em_learner import HMMLearner
from ..safe_output import make_dir, run_folder, write_npz, write_with
from ..training.checkpoints import CKPT_DIR, CKPT_NAME, load_checkpoint, model_from_checkpoint
from ..training.train import resolve_device


def run_title(run_name: str | None, run_id: str) -> str:
    """A figure's title: the run's name and short id."""
    return f"run {run_name} ({run_id[:8]})" if run_name else f"run {run_id[:8]}"


@contextlib.contextmanager
def output_folder(path: Path | None) -> Iterator[Path]:
    """`path` (created) if given, else a temporary folder removed afterwards (a job's files: kept, or only logged)."""
    if path is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    else:
        yield make_dir(path)

def require_checkpoint(run: tracking.Run) -> None:
    """ValueError naming the path looked for when the run has no checkpoint (before any work)."""
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
    with output_folder(out and run_folder(out, info.run_name, run_id) / "evaluation") as d:
        files = res.to_csv(d) + (plot_figure1(res, d / "figure1.png", title=run_title(info.run_name, run_id))
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
    run = tracking.existing_run(uri, run_id)
    require_checkpoint(run)
    resolve_device(device)
    with tracking.hold_run(uri, run_id):
        with tracking.run_temp_dir(run_id) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(uri, run_id, tmp)
        model, cfg = model_from_checkpoint(ck)
        return evaluate_model(model, cfg, int(ck["step"]), run, device=device, n_episodes=n_episodes,
                              batch_size=batch_size, out=out, say=say, figures=True)
