"""Next-token training on HMM-mixture episodes, tracked in MLflow (SCIENCE.md 3 and 5).

One `train(cfg, ...)` call is one MLflow run (opened through `tracking`, the only module
that talks to MLflow):

- Data: episodes.training_data: episodes from `make_mixture(cfg.hmm)`, splits "train" (data.n_train) and "eval"
  (data.n_eval); with fresh tasks (hmm.n_tasks = 0) each training episode on its own task of the family (stream
  "fresh") and the held-out episodes on unseen tasks, where oracle/* is the family-Bayes reference
  (eval.family_tasks tasks; none when it is 0) and only the unseen emergence curves exist. Inputs tokens[:, :-1],
  targets tokens[:, 1:], loss on the Episodes' `target_mask` (next token is an observation; the delimiter is never a target).
- Batches: step s takes items s*B .. s*B+B-1 of an endless stream whose epoch e is the
  permutation `default_rng([seed, e])` of the training set, so the batches depend on
  (train.seed, step) only and a resumed run sees what an uninterrupted one would. Several epochs over a
  fixed data.n_train are train.steps > n_train / batch_size; train/epoch logs the passes done
  (`epochs_done`), and the tags hmmscope.epochs / hmmscope.episodes_per_task say which budget a run used
  (presets "paper": 1 pass, 16 episodes per task; "paper-epochs": 64 passes; SCIENCE.md 8).
- Schedule `lr_at` (train.schedule): linear warmup, then cosine decay to min_lr at train.steps (cosine),
  lr throughout (constant), or lr until the last train.decay_frac of the steps and a linear decay to
  min_lr (wsd: warmup-stable-decay; a resumed run with more train.steps moves the decay, not the past).
- Params: the training sections of the config (hmm, data, model, train: `tracking.config_params`;
  never theory.*); tags: dataset hashes, hmm config hash, device, n_params, and a one-line
  `mlflow.note.content` (tracking adds the code version and MLflow's standard tags). Metrics by
  step: train/{loss,lr,grad_norm,tokens_per_s,epoch} every `log_every` steps (written to the store together, at
  most METRICS_WRITE_S after their step, before every checkpoint, and when training stops); val/{loss,acc,test_loss,
  test_acc,excess_ce} (the learning curve on the eval episodes: cross-entropy over the full
  vocabulary, pooled over tokens; excess_ce = val/test_loss - oracle/test_loss) at step 0, every
  eval_every steps and at the end; oracle/{loss,acc} (mixture oracle on the eval episodes, scored on
  the same targets) once at step 0 (its test-segment numbers are Figure 1's eval/seen/oracle_mix_test_*,
  logged once there; val/* is the learning curve, whose last point Figure 1 repeats as eval/seen/*);
  emergence/* (the in-context curves on seen and unseen tasks with the references as constants,
  measure/emergence.py) at every evaluation, and their figure figures/emergence.{png,pdf} at the end (the curves'
  history travels in the checkpoint, so a resumed run draws its whole history); train/eval_s (this call's
  evaluations, val/* and emergence/*, plus the emergence references' precompute) and train/eval_fraction
  (eval_s / this call's wall time) at the end. Loss/train and Loss/val (LOSS_TRAIN, LOSS_VAL) repeat
  train/loss and val/loss under names MLflow's run page shows first (its chart sections are ordered by name,
  capitals first: without them the loss curves would sit below about 30 baseline/ and eval/ sections). The eval/*
  keys belong to Figure 1 (evaluate.Figure1Result.headline, logged by jobs.evaluate_run at the final step): one
  key, one measurement.
- Checkpoints: every ckpt_every steps and at the end, the artifact checkpoints/last.pt
  (overwritten; `checkpoints.save_checkpoint`: model/optimizer state dicts, step, flat config, RNG
  states, metrics). Reading, checking and loading them is `checkpoints`' job.
- Resume: `train(cfg, resume=run_id)` continues that run from its checkpoint; only RESUME_KEYS may differ from
  the checkpoint's config. On CPU the result is bitwise that of an uninterrupted run. Each step is stored once: the
  checkpoint is the truth, so once the resume holds the run's lease, the metric rows a killed writer left past the
  checkpoint's step (train/* written in batches, an evaluation, its end) are removed (`Run.forget_metrics`, one
  transaction) and logged again; a finished run resumed replaces its final evaluation and FINAL_KEYS.
  train.precision is not a runtime key (bf16 vs fp32 changes the trajectory), but "auto"
  resolves on the device of each call: a CUDA run resumed on the CPU continues in float32.
  Checkpoints are device-neutral on load (checkpoints.read_checkpoint maps every tensor to the CPU),
  and resuming moves the model and optimizer state to the run's device.
- Deadline (`train(..., deadline=)`, `hmmscope train --deadline S`): stop at a logging boundary in time to write
  the checkpoint and return before a wall-clock instant (`hmmscope.training.deadline`); the run ends FINISHED, tagged
  hmmscope.stopped = "deadline", and a resume continues it bitwise (on CPU).
- Divergence: a non-finite loss or gradient norm raises DivergedError naming the first such step (its
  run_id says which run); the run ends FAILED with the reason in the tag hmmscope.failure_reason. The loss
  and gradient norm stay on the device during the steps (no host sync per step) and are read back and
  checked at the logging, evaluation and checkpoint cadences, before anything is logged or saved, so a
  checkpoint never holds a diverged model.
- Signals: while `train` runs in the main thread, SIGTERM (kill, timeout, a scheduler) raises
  KeyboardInterrupt, so the run ends KILLED with its reason instead of staying RUNNING.
- The result (`TrainResult`) carries the trained model (on the run's device, in eval mode) and the run's
  Config, so a caller evaluates it in memory: its weights are those of the last checkpoint.
- Precision (train.precision): "auto" is bf16 autocast on CUDA and float32 elsewhere; "bf16"
  autocasts on any device (the CPU twin of the CUDA path); "fp32" runs without autocast and, on
  CUDA, without TF32. bf16 on CUDA also enables TF32 for the matmuls autocast leaves in float32.
  train.compile ("auto": on for CUDA, off elsewhere; "true" / "false" on any device; "blocks": each block
  compiled alone, one graph shared by the layers; `resolve_compile` says why, the tag hmmscope.compiled what
  was done) torch.compiles the training step's forward (inductor; `Transformer.compile_forward`); evaluation
  runs eager (a few batches per eval: a second compiled graph would cost more than it saves). AdamW is fused
  on CPU and CUDA; attention is SDPA with is_causal=True (flash / efficient kernels on CUDA) unless a band
  mask is set; train.attention pins the training step's SDPA kernel (`model.attention_kernels`; the tag
  hmmscope.attention). Both are run-time keys: a resumed run may change them.
  Defaults on CPU: float32, eager, bitwise reproducible. HMMSCOPE_THREADS sets torch's CPU threads.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import env, tracking
from ..config import RUNTIME_KEYS, Config, TrainConfig, config_hash, flatten, override, training_tasks
from ..data.episodes import Episodes
from ..interrupts import raise_if_terminated, sigterm_interrupts
from ..measure.emergence import curves_table
from ..model.transformer import Transformer, attention_kernels
from .checkpoints import checkpoint_config, load_checkpoint, save_checkpoint, set_rng_state
from .deadline import Deadline, due, state_bytes
from .progress import training_progress
from .setup import build as build_setup

METRICS_WRITE_S = 5.0  # train/* metrics reach the store at most this long after their step (and at every checkpoint)
LOSS_TRAIN, LOSS_VAL = "Loss/train", "Loss/val"  # the loss curves again, first on MLflow's run page (docstring)
FINAL_KEYS = ("train/wall_time_s", "train/eval_s", "train/eval_fraction")  # this call's, at its last step

RESUME_KEYS = ("train.steps", *RUNTIME_KEYS)  # may differ on resume: the training's length, and config.RUNTIME_KEYS


class DivergedError(RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite; `run_id` is the run that ended FAILED."""

    def __init__(self, msg: str, run_id: str | None = None):
        super().__init__(msg)
        self.run_id = run_id


@dataclass
class TrainResult:
    run_id: str
    metrics: dict[str, float]  # final val/* and oracle/* metrics
    steps: int  # optimizer steps done in total (including those before a resume)
    wall_time: float  # seconds spent in this call
    n_params: int = 0
    tokens_per_s: float = 0.0  # mean training throughput of this call
    extra: dict[str, Any] = field(default_factory=dict)
    model: Transformer | None = field(default=None, repr=False)  # the trained model, eval mode, weights = last checkpoint
    config: Config | None = None  # the run's config (a resumed run's: the checkpoint's, runtime keys as passed)
    stopped: str | None = None  # "deadline": stopped before train.steps by `deadline` (resume it to go on)


# ---------------------------------------------------------------- pure helpers


def lr_at(step: int, t: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based) under t.schedule: linear warmup lr*(step+1)/warmup, then
    cosine: cosine decay to min_lr at t.steps; constant: lr; wsd (warmup-stable-decay): lr until the last
    decay_frac of t.steps (at least one step, never inside the warmup), then linear to min_lr at t.steps.
    Past t.steps: min_lr (cosine, wsd) or lr (constant)."""
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    if t.schedule == "constant":
        return t.lr
    if step >= t.steps:
        return t.min_lr
    if t.schedule == "wsd":
        start = max(t.warmup, t.steps - max(1, round(t.decay_frac * t.steps)))
        if step < start:
            return t.lr
        return t.lr + (step - start) / max(1, t.steps - start) * (t.min_lr - t.lr)
    frac = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (t.lr - t.min_lr)


def epochs_done(steps: int, n: int, batch_size: int) -> float:
    """Passes over the n training episodes after `steps` optimizer steps of batch_size (batch_indices' stream)."""
    return steps * batch_size / n


@functools.lru_cache(maxsize=4)
def _epoch_perm(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> np.ndarray:
    """Training-set rows of step `step`: a slice of the stream perm(epoch 0) ++ perm(epoch 1) ++ ...

    Epoch e is the permutation default_rng([seed, e]) of the n rows: every row once per epoch, a batch may
    straddle two epochs; training for several epochs over a fixed data.n_train is just train.steps >
    n / batch_size (`epochs_done`)."""
    pos = step * batch_size + np.arange(batch_size)
    epoch, within = pos // n, pos % n
    out = np.empty(batch_size, np.int64)
    for e in np.unique(epoch):
        sel = epoch == e
        out[sel] = _epoch_perm(seed, int(e), n)[within[sel]]
    return out


def resolve_device(spec: str) -> torch.device:
    """'auto' -> cuda if available else cpu; an explicit device must exist (ValueError otherwise)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {spec!r} (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} requested but CUDA is not available")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA devices exist")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {spec!r} requested but MPS is not available")
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device {spec!r} (use auto, cpu, cuda, cuda:N or mps)")
    return dev


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision on `device`: 'auto' -> 'bf16' on CUDA, 'fp32' elsewhere; 'bf16' / 'fp32' as given."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def resolve_compile(spec: str | bool, device: torch.device) -> bool:
    """train.compile on `device`: 'auto' -> on for CUDA only; 'false' off, any other (a compile scope) on; a bool as given.

    Why auto is CUDA-only: compiling costs a fixed time per process (tens of seconds for the paper's model),
    paid back only when the steps of one call save more than that: (eager step - compiled step) x steps >
    compile time. On CUDA the paper-scale step is launch- and memory-bound where inductor fuses kernels; on the
    CPU the tiny models' runs are short and the fused SDPA / AdamW kernels leave little to fuse. `hmmscope
    bench train --compile` measures the compile time and both step times and prints the break-even step
    count; the CUDA figure has not been measured yet (no GPU in the session that wrote this)."""
    if isinstance(spec, bool):
        return spec
    return device.type == "cuda" if spec == "auto" else spec != "false"


def _indices(idx: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step's batch rows on `device`. On CUDA through pinned memory with non_blocking=True: a copy from pageable
    memory would wait for the GPU to drain its queue (a host sync every step); torch's pinned-memory allocator keeps
    the host block alive until the copy is done. Elsewhere a plain tensor (the CPU twin)."""
    t = torch.from_numpy(idx)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _autocast(device: torch.device, precision: str = "auto"):
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


# ---------------------------------------------------------------- data


def next_token_batch(ep: Episodes, idx, device: torch.device | str = "cpu"):
    """(inputs, targets, loss_mask) for episodes idx: tokens[:, :-1], tokens[:, 1:], target_mask[:-1]."""
    tok = torch.as_tensor(np.asarray(ep.tokens[idx]).astype(np.int64), device=device)
    mask = torch.as_tensor(ep.target_mask[:-1], device=device).expand(tok.shape[0], -1)
    return tok[:, :-1], tok[:, 1:], mask


def episode_batches(ep: Episodes, batch_size: int, device: torch.device | str = "cpu"):
    """Yield next_token_batch over ep in order (evaluation)."""
    for lo in range(0, len(ep), batch_size):
        yield next_token_batch(ep, np.arange(lo, min(lo + batch_size, len(ep))), device)


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, ep: Episodes, device: torch.device | str = "cpu",
                  batch_size: int = 64, precision: str = "auto") -> dict[str, float]:
    """Mean CE (nats, full vocabulary) and accuracy (argmax over the observation ids, as in measure/evaluate.py)
    over all observation targets and over test-segment targets; the forward runs in `precision`."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    test = torch.as_tensor(ep.test_target_mask[:-1], device=device)
    sums = torch.zeros(6, dtype=torch.float64, device=device)  # ce, correct, n, test ce, test correct, test n
    try:
        for x, y, m in episode_batches(ep, batch_size, device):
            with _autocast(device, precision):
                logits, _ = model(x)
            logits = logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T-1)
            hit = (logits[..., :ep.n_tokens].argmax(-1) == y).double()  # argmax over observations
            mt = m & test
            sums += torch.stack([ce[m].double().sum(), hit[m].sum(), m.sum().double(),
                                 ce[mt].double().sum(), hit[mt].sum(), mt.sum().double()])
    finally:
        model.train(was_training)
    s = sums.tolist()
    return {"loss": s[0] / s[2], "acc": s[1] / s[2], "test_loss": s[3] / s[5], "test_acc": s[4] / s[5]}


def oracle_metrics(mix, ep: Episodes, device: torch.device | str = "cpu") -> dict[str, float]:
    """The mixture oracle (Bayes-optimal predictor) scored on the same targets as evaluate_loss."""
    from ..oracles.inference import mixture_oracle

    device = torch.device(device)
    pred = mixture_oracle(mix, ep, dtype=torch.float64, device=device if device.type == "cuda" else "cpu").pred
    pred = pred.cpu()[:, 1:]  # row t predicts token t; targets are tokens 1..T-1
    y = torch.as_tensor(np.asarray(ep.tokens[:, 1:]).astype(np.int64))
    m = torch.as_tensor(ep.target_mask[:-1]).expand_as(y)
    mt = m & torch.as_tensor(ep.test_target_mask[:-1])
    p = pred.gather(-1, y.clamp(max=pred.shape[-1] - 1)[..., None])[..., 0]
    nll, hit = -torch.log(p), (pred.argmax(-1) == y).double()
    return {"loss": nll[m].mean().item(), "acc": hit[m].mean().item(),
            "test_loss": nll[mt].mean().item(), "test_acc": hit[mt].mean().item()}


def _resume_config(saved: Config, passed: Config) -> Config:
    a, b = flatten(saved), flatten(passed)
    diff = sorted(k for k in a.keys() | b.keys() if k not in RESUME_KEYS and a.get(k) != b.get(k))
    if diff:
        raise ValueError(f"config differs from the checkpoint's in {', '.join(diff)} "
                         f"(only {', '.join(RESUME_KEYS)} may change)")
    return override(saved, {k: b[k] for k in RESUME_KEYS})


# ---------------------------------------------------------------- training


def describe(cfg: Config) -> str:
    """A training run's one-line description (its MLflow note)."""
    h, d, m, t = cfg.hmm, cfg.data, cfg.model, cfg.train
    return (f"Training: {m.n_layers}-layer {m.pos_enc} transformer (d_model {m.d_model}, {m.n_heads} heads"
            f"{f', window {m.window}' if m.window else ''}) on a {h.family} HMM mixture ({h.n_tasks} tasks, "
            f"{h.n_states} states, rank {h.rank}, gamma {h.gamma:g}); {d.n_demos} demos of {d.l_demo} + test "
            f"{d.l_test} tokens; {t.steps} steps, lr {t.lr:g}, seed {t.seed}")


def _val_keys(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics saved in a checkpoint, with the learning-curve keys of older checkpoints (eval/*) as val/*."""
    return {("val/" + k[len("eval/"):] if k.startswith("eval/") else k): v for k, v in metrics.items()}


def train(cfg: Config, *, tracking_uri: str, experiment: str = "hmmscope", run_name: str | None = None,
          resume: str | None = None, parent: str | None = None, progress: bool = True,
          eval_fn: Callable[[torch.nn.Module, int], Mapping[str, float] | None] | None = None,
          log_every: int | None = None, _stop_after: int | None = None,
          on_eval: Callable[[int, dict[str, float]], None] | None = None,
          tags: Mapping[str, Any] | None = None, note: str | None = None,
          deadline: Deadline | None = None, on_start: Callable[[str], None] | None = None,
          setup: Callable[[str | None], Any] | None = None) -> TrainResult:
    """Train a Transformer on cfg's episodes in one MLflow run (new, or `resume`d); see the module docstring.

    eval_fn(model, step) -> {name: value} is called at every evaluation and its metrics logged at that step.
    on_eval(step, metrics) is called after each evaluation is logged (e.g. a sweep's pruning hook); an
    exception it raises ends the run like any failure (FAILED, reason tagged) and propagates.
    log_every: train/* metric cadence (default: steps // 100 clipped to [1, 50]).
    tags: extra tags of a new run (e.g. a sweep trial's; hmmscope.kind is "train" unless they say otherwise);
    note: its one-line description (default: `describe(cfg)`).
    progress: a bar on a terminal, else plain lines on stderr (`progress.PlainProgress`: every HMMSCOPE_PROGRESS_S
    seconds, default 30, with step, loss, tokens/s and ETA); False: nothing.
    _stop_after: test hook; raise KeyboardInterrupt after this step (the run ends KILLED), like a kill.
    deadline: stop at a train/* logging boundary in time to return by `deadline.at` (`hmmscope.training.deadline`): the
    checkpoint is written, the run ends FINISHED with the tags hmmscope.stopped = "deadline" and
    hmmscope.stopped_at_step, and the result's `stopped` is "deadline"; no final evaluation is made (the
    step's own, if due, is). Resuming it goes on bitwise (on CPU); reaching train.steps then sets
    hmmscope.stopped = "done".
    on_start(run_id) is called as soon as the run is open, before the data, the references and the model are built
    (the CLI prints where it is; at the paper's scale the setup takes minutes). setup(text): each piece of the setup as
    it begins (`training.setup`: data, references, model, the step-0 evaluation), then setup(None) just before the
    training loop's own progress starts (a caller's spinner stops there).
    """
    t_start = time.perf_counter()
    device = resolve_device(cfg.train.device)
    ck = None
    if resume is not None:
        with tracking.run_temp_dir(resume) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(tracking_uri, resume, tmp)
        cfg = _resume_config(checkpoint_config(ck), cfg)
        device = resolve_device(cfg.train.device)
    t = cfg.train
    precision = resolve_precision(t.precision, device)
    attention = attention_kernels(t.attention, device)  # a kernel this device lacks: ValueError before any work
    if device.type == "cpu" and (threads := env.threads()):
        torch.set_num_threads(threads)
    if device.type == "cuda":  # TF32 with bf16 autocast (the matmuls it leaves in float32); IEEE float32 for fp32
        torch.backends.cuda.matmul.allow_tf32 = precision == "bf16"
        torch.backends.cudnn.allow_tf32 = precision == "bf16"
    log_every = log_every or min(50, max(1, t.steps // 100))

    name = run_name or tracking.train_run_name(cfg)
    params = None if resume else tracking.config_params(cfg, tracking.TRAIN_SECTIONS)
    with sigterm_interrupts(), tracking.start_run(tracking_uri, experiment, name, parent=parent, resume=resume,
                                                  params=params,
                                                  tags=None if resume else {"hmmscope.kind": "train", **(tags or {})},
                                                  note=None if resume else (note or describe(cfg)),
                                                  config=cfg, system_metrics=True) as run:
        if ck is not None:  # the lease is ours: what a killed writer logged past the checkpoint goes (Resume)
            run.forget_metrics(int(ck["step"]))
        if on_start is not None:  # the run's id as soon as it exists: before the data, the references and the model
            on_start(run.run_id)
        built = build_setup(cfg, device, oracle_metrics, setup)  # the data and the references, each said as it begins
        mix, ep_train, ep_eval, oracle, emergence = built.mix, built.ep_train, built.ep_eval, built.oracle, built.emergence
        em_setup_s = built.references_s  # the references, once per run (and per resume)
        tokens = torch.as_tensor(ep_train.tokens.astype(np.int64), device=device)  # (N, T)
        loss_mask = torch.as_tensor(ep_train.target_mask[:-1], device=device).expand(t.batch_size, -1)
        if setup is not None:
            setup(f"the model ({cfg.model.n_layers} layers x d_model {cfg.model.d_model})" if ck is None else
                  f"the model and optimizer from run {resume}'s checkpoint (step {int(ck['step'])})")

        torch.manual_seed(t.seed)
        np.random.seed(t.seed)
        random.seed(t.seed)
        model = Transformer(cfg.model, ep_train.vocab_size).to(device)
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
        n_params = model.num_params()
        tok_per_step = t.batch_size * (ep_train.seq_len - 1)

        run_tags = {"hmmscope.dataset_hash": ep_train.meta.get("dataset_hash", ""),
                    "hmmscope.eval_dataset_hash": ep_eval.meta.get("dataset_hash", ""),
                    "hmmscope.hmm_hash": config_hash(cfg.hmm), "hmmscope.device": str(device), "hmmscope.precision": precision,
                    "hmmscope.compiled": scope if compiled and scope != "model" else str(compiled).lower(),
                    "hmmscope.attention": t.attention, "hmmscope.n_params": n_params,
                    # the budget as passes over data.n_train and episodes per training task (SCIENCE.md 8's two readings)
                    "hmmscope.epochs": f"{epochs_done(t.steps, len(ep_train), t.batch_size):g}",
                    "hmmscope.episodes_per_task": f"{t.steps * t.batch_size / training_tasks(cfg.hmm, cfg.data):g}",
                    "hmmscope.tasks": "fresh" if mix is None else "mixture"}
        run.set_tags({**run_tags, **({"hmmscope.resumed_from_step": start, "hmmscope.target_steps": t.steps}
                                     if resume else {})})
        if not resume:  # the episodes as MLflow dataset inputs: content hash as digest, the generator as source
            for split, e in (("train", ep_train), ("eval", ep_eval)):
                run.log_dataset(f"episodes-{split}", e.meta.get("dataset_hash", ""), split,
                                f"hmmscope sample_episodes: hmm {config_hash(cfg.hmm)[:8]}, split {split!r}",
                                {"episodes": len(e), "seq_len": e.seq_len, "vocab_size": e.vocab_size})
        last: dict[str, float] = {}
        curves: list[dict[str, float]] = list(ck["metrics"].get("emergence", [])) if ck is not None else []
        eval_s = em_setup_s  # evaluation's cost includes the emergence references' precompute

        def evaluate(step: int) -> None:
            with deadline.timed("eval") if deadline is not None else nullcontext():
                _evaluate(step)

        def _evaluate(step: int) -> None:
            nonlocal eval_s
            t0 = time.perf_counter()
            ev = {f"val/{k}": v for k, v in evaluate_loss(model, ep_eval, device, precision=precision).items()}
            if "oracle/test_loss" in oracle:
                ev["val/excess_ce"] = ev["val/test_loss"] - oracle["oracle/test_loss"]
            if eval_fn is not None:
                ev.update(eval_fn(model, step) or {})
            last.clear()
            last.update(ev)
            if ev["val/loss"] < best.get("val/loss", math.inf):
                best.clear()
                best.update(ev, step=step)
            em = {}
            if emergence is not None:  # the curves: kept for the figure and the table, a few headline series logged
                curve = emergence.curve(model, device=device)
                curves[:] = [c for c in curves if c["step"] < step] + [{"step": step, **curve, **emergence.references}]
                em = emergence.headline(curve)
            eval_s += time.perf_counter() - t0
            run.log_metrics({**ev, **em, LOSS_VAL: ev["val/loss"]}, step=step)
            if on_eval is not None:
                on_eval(step, dict(ev))

        def checkpoint(step: int) -> None:
            with deadline.timed("ckpt") if deadline is not None else nullcontext():
                _checkpoint(step)

        def _checkpoint(step: int) -> None:
            write_logged()  # every train/* metric up to the checkpoint is stored before it: a resume logs the rest
            save_checkpoint(run, model=model, optimizer=opt, step=step, cfg=cfg, vocab_size=ep_train.vocab_size,
                            metrics={"last": dict(last), "best": dict(best), "emergence": list(curves)},
                            dataset_hash=ep_train.meta.get("dataset_hash", ""))

        if start == 0:
            # oracle/test_* is Figure 1's eval/seen/oracle_mix_test_* (same episodes, same targets): one key each
            run.log_metrics({k: v for k, v in oracle.items() if not k.startswith("oracle/test_")}, step=0)
            if setup is not None:
                setup(f"the step-0 evaluation ({len(ep_eval):,} held-out episodes)")
            evaluate(0)
        if setup is not None:
            setup(None)  # training's own progress takes over
        model.train()
        # the step's loss and gradient norm stay on the device (no host sync per step); `flush` reads them back
        # and checks them at the logging, evaluation and checkpoint cadences, before anything is logged or saved
        pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        # train/* rows wait here and reach the store together (one write per METRICS_WRITE_S, and before every
        # checkpoint and at the end), not one store write per logged step
        logged: list[tuple[dict[str, float], int]] = []
        written = time.monotonic()

        def write_logged() -> None:
            nonlocal written
            if logged:
                run.log_metric_steps(logged)
                logged.clear()
            written = time.monotonic()

        losses: list[float] = []
        train_s = int_s = 0.0

        def flush() -> float:
            """Check the pending steps' loss and gradient norm; DivergedError at the first non-finite one.
            Returns the last gradient norm."""
            if not pending:
                return float("nan")
            vals = torch.stack([torch.stack([lv, gn]) for _, lv, gn in pending]).tolist()
            for (step_no, _, _), (lv, gn) in zip(pending, vals):
                if not math.isfinite(lv):
                    raise DivergedError(f"non-finite loss ({lv}) at step {step_no}", run.run_id)
                if not math.isfinite(gn):
                    raise DivergedError(f"non-finite gradient norm ({gn}) at step {step_no}", run.run_id)
            pending.clear()
            losses.extend(v[0] for v in vals)
            return vals[-1][1]

        done, stopped = start, None
        if deadline is not None:
            deadline.eval_steps = math.ceil(len(ep_eval) / 64)
            deadline.start(start)
        try:
            with training_progress(progress) as bar:
                task = bar.add_task("train", total=t.steps, completed=start, loss=float("nan"), tps=0.0)
                for step in range(start, t.steps):
                    raise_if_terminated()  # a SIGTERM whose interrupt a weakref callback swallowed (interrupts.py)
                    t0 = time.perf_counter()
                    lr = lr_at(step, t)
                    for g in opt.param_groups:
                        g["lr"] = lr
                    idx = _indices(batch_indices(step, len(ep_train), t.batch_size, t.seed), device)
                    batch = tokens[idx]
                    with _autocast(device, precision), attention():
                        _, loss = fwd(batch[:, :-1], batch[:, 1:], loss_mask)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                    opt.step()
                    done = step + 1
                    pending.append((done, loss.detach(), gn.detach()))
                    log_now = done % log_every == 0 or done == t.steps
                    eval_now = done % t.eval_every == 0 or done == t.steps
                    ckpt_now = done % t.ckpt_every == 0 or done == t.steps
                    stop_now = _stop_after is not None and done >= _stop_after
                    if log_now or eval_now or ckpt_now or stop_now:
                        last_gn = flush()
                    dt = time.perf_counter() - t0
                    train_s, int_s = train_s + dt, int_s + dt
                    bar.update(task, completed=done)
                    if log_now:
                        tps = len(losses) * tok_per_step / int_s
                        loss_avg = sum(losses) / len(losses)
                        logged.append(({"train/loss": loss_avg, LOSS_TRAIN: loss_avg, "train/lr": lr,
                                        "train/grad_norm": last_gn, "train/tokens_per_s": tps,
                                        "train/epoch": epochs_done(done, len(ep_train), t.batch_size)}, done))
                        if time.monotonic() - written >= METRICS_WRITE_S:
                            write_logged()
                        bar.update(task, completed=done, loss=loss_avg, tps=tps)
                        losses.clear()
                        int_s = 0.0
                    if eval_now:
                        evaluate(done)
                    if ckpt_now:
                        checkpoint(done)
                    if stop_now:  # the one place a step decides to end the loop early
                        raise KeyboardInterrupt(f"stopped after step {done} (_stop_after)")
                    if deadline is not None and done < t.steps and done % log_every == 0 and deadline.must_stop(
                            done, next_steps=min(log_every, t.steps - done), evals=due(done, done + log_every, t.eval_every),
                            ckpts=due(done, done + log_every, t.ckpt_every), ckpt_bytes=state_bytes(model.state_dict(),
                                                                                                     opt.state_dict())):
                        if done % t.ckpt_every:
                            checkpoint(done)
                        stopped = "deadline"
                        break
        except BaseException:  # an interrupt, a failure: what was logged before it is stored, as it came
            with contextlib.suppress(Exception):
                write_logged()
            raise
        write_logged()
        if start >= t.steps:  # resumed a finished run: nothing to train, the final metrics refreshed (replaced)
            run.forget_metrics(start - 1, ("val/", "emergence/", LOSS_VAL, *FINAL_KEYS))
            evaluate(start)
        done = max(done, start)
        if stopped or (resume and run.get().data.tags.get("hmmscope.stopped")):
            run.set_tags({"hmmscope.stopped": stopped or "done", "hmmscope.stopped_at_step": done})
        final = {**oracle, **last}
        wall = time.perf_counter() - t_start
        run.log_metrics(dict(zip(FINAL_KEYS, (wall, eval_s, eval_s / wall if wall > 0 else 0.0))), step=done)
        if curves and cfg.train.figures:
            _log_emergence_figure(run, curves, f"{name}: emergence of in-context learning")
        if curves:
            run.log_table(curves_table(curves), "emergence/curves.json")
    trained = max(0, done - start)
    return TrainResult(run.run_id, final, done, time.perf_counter() - t_start, n_params,
                       trained * tok_per_step / train_s if train_s else 0.0,
                       {"best": dict(best), "train_s": train_s, "eval_s": eval_s, "emergence": curves,
                        **({"deadline": deadline.estimate} if deadline else {})},
                       model.eval(), cfg, stopped)


def _log_emergence_figure(run, curves: list[dict], title: str) -> None:
    """The emergence curves (emergence.plot_emergence, PNG + PDF) as artifacts figures/emergence.*."""
    from ..measure.emergence import plot_emergence

    with tempfile.TemporaryDirectory() as tmp:
        for f in plot_emergence(curves, os.path.join(tmp, "emergence.png"), title):
            run.log_artifact(f, "figures")
