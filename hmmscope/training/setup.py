"""What training builds before its first step, each piece said as it begins (`train(..., setup=say)`).

At the `tiny` preset the setup is seconds; at the paper's, or on a busy machine, minutes: the episodes, what the
caller's `Monitor` prepares (the pipeline's: the evaluation references, the mixture oracle on the held-out episodes,
the emergence curves' references; `pipeline.measures`), then the model and its optimizer, fresh or from a resumed
run's checkpoint. `build` and `build_model` call `say(text)` as each piece begins, so a terminal's spinner or a log
file says where the setup is (before: minutes of silence between "training ..." and the first step).

Imports the data, the model and training's own modules (no MLflow: the run is `train`'s).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import Config
from ..data.episodes import Episodes, training_data
from ..model.transformer import Transformer
from .checkpoints import set_rng_state
from .device import resolve_compile
from .monitor import Monitor


@dataclass
class Setup:
    mix: Any  # the training mixture; None with fresh tasks (hmm.n_tasks = 0)
    ep_train: Episodes
    ep_eval: Episodes
    oracle: dict[str, float]  # oracle/*: the monitor's reference on the held-out episodes ({} when it has none)
    references_s: float  # the monitor's preparation (the references, the oracle, the curves'): evaluation's cost


def build(cfg: Config, device, monitor: Monitor, say: Callable[[str], Any] | None = None) -> Setup:
    """The data of a training run of `cfg` on `device` and what `monitor` prepares for it (module docstring);
    `say(text)` as each piece begins."""
    say = say or (lambda text: None)
    h, d = cfg.hmm, cfg.data
    tasks = "fresh tasks (one per episode)" if h.n_tasks == 0 else f"a mixture of {h.n_tasks} tasks"
    say(f"drawing the data: {d.n_train:,} training and {d.n_eval:,} held-out episodes of {tasks}")
    mix, ep_train, ep_eval, _ = training_data(h, d)  # mix None with fresh tasks (hmm.n_tasks = 0)
    t0 = time.perf_counter()
    oracle = monitor.prepare(cfg, mix, ep_eval, device, say)
    return Setup(mix, ep_train, ep_eval, oracle, time.perf_counter() - t0)


@dataclass
class Model:
    model: Transformer  # evaluation and state dicts use this one
    opt: torch.optim.Optimizer
    fwd: Any  # the training step's forward: `model`, or its compiled forward
    start: int  # the first step to take (a resume: the checkpoint's)
    best: dict[str, Any]  # the best evaluation so far (val/* at the lowest val/loss, with its step)
    compiled: bool
    scope: str  # the compile scope (Transformer.compile_forward), "model" for the whole model


def _val_keys(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics saved in a checkpoint, with the learning-curve keys of older checkpoints (eval/*) as val/*."""
    return {("val/" + k[len("eval/"):] if k.startswith("eval/") else k): v for k, v in metrics.items()}


def build_model(cfg: Config, vocab_size: int, device, ck: Mapping | None = None, resume: str | None = None,
                say: Callable[[str], Any] | None = None) -> Model:
    """The model and its optimizer on `device`, seeded by train.seed; with a checkpoint `ck` (of run `resume`) their
    states, the step and the RNG states from it. The training step's forward compiled as train.compile says."""
    t = cfg.train
    if say is not None:
        say(f"the model ({cfg.model.n_layers} layers x d_model {cfg.model.d_model})" if ck is None else
            f"the model and optimizer from run {resume}'s checkpoint (step {int(ck['step'])})")
    torch.manual_seed(t.seed)
    np.random.seed(t.seed)
    random.seed(t.seed)
    model = Transformer(cfg.model, vocab_size).to(device)
    opt = model.configure_optimizers(t.weight_decay, t.lr, (t.beta1, t.beta2))
    start, best = 0, {}
    if ck is not None:
        model.load_state_dict(ck["model"])
        try:
            opt.load_state_dict(ck["optimizer"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"run {resume}: its checkpoint's optimizer state does not fit the model ({e})") from None
        start, best = int(ck["step"]), _val_keys(ck["metrics"].get("best", {}))
        set_rng_state(ck["rng"])
    compiled = resolve_compile(t.compile, device)
    scope = "model" if t.compile in ("auto", "true") else t.compile  # a Transformer.compile_forward scope
    fwd = model.compile_forward(scope) if compiled else model  # the training step only; evaluation, state dicts: `model`
    return Model(model, opt, fwd, start, best, compiled, scope)
