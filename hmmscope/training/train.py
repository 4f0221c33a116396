"""Next-token training on HMM-mixture episodes, tracked in MLflow (SCIENCE.md 3 and 5): `train`.

One `train(cfg, ...)` call is one MLflow run (opened through `tracking`, the only module that talks to MLflow); a
step is read top to bottom in `_Loop.step`, the run's life in `train`. What it builds first is `setup`'s; what the
caller measures beside the learning curve (the pipeline's references, oracle/* and emergence curves) is the caller's
`monitor.Monitor`, handed in (`pipeline.measures`); training never imports the measurements.

- Data: episodes.training_data: episodes from `make_mixture(cfg.hmm)`, splits "train" (data.n_train) and "eval"
  (data.n_eval); with fresh tasks (hmm.n_tasks = 0) each training episode on its own task of the family (stream
  "fresh") and the held-out episodes on unseen tasks. Loss on the Episodes' `target_mask` (`learning_curve`).
- Batches: step s takes items s*B .. s*B+B-1 of an endless stream whose epoch e is the permutation
  `default_rng([seed, e])` of the training set (`batch_indices`), so the batches depend on (train.seed, step) only
  and a resumed run sees what an uninterrupted one would. Several epochs over a fixed data.n_train are train.steps >
  n_train / batch_size; train/epoch logs the passes done (`schedule.epochs_done`), and the tags hmmscope.epochs /
  hmmscope.episodes_per_task say which budget a run used (presets "paper": 1 pass, 16 episodes per task;
  "paper-epochs": 64 passes; SCIENCE.md 8). The learning rate: `schedule.lr_at` (train.schedule).
- Params: the training sections of the config (hmm, data, model, train: `tracking.config_params`; never theory.*);
  tags: dataset hashes, hmm config hash, device, n_params, and a one-line `mlflow.note.content` (tracking adds the
  code version and MLflow's standard tags). Metrics by step: train/{loss,lr,grad_norm,tokens_per_s,epoch} every
  `log_every` steps (written to the store together, at most METRICS_WRITE_S after their step, before every
  checkpoint, and when training stops); val/{loss,acc,test_loss,test_acc,excess_ce} (the learning curve on the eval
  episodes, `learning_curve.evaluate_loss`; excess_ce = val/test_loss - oracle/test_loss when the monitor gives an
  oracle) at step 0, every eval_every steps and at the end, with the monitor's metrics of each evaluation beside
  them; the monitor's oracle/loss and oracle/acc once at step 0; train/eval_s (this call's evaluations plus the
  monitor's preparation) and train/eval_fraction (eval_s / this call's wall time) at the end. Loss/train and
  Loss/val (LOSS_TRAIN, LOSS_VAL) repeat train/loss and val/loss under names MLflow's run page shows first (its
  chart sections are ordered by name, capitals first: without them the loss curves would sit below about 30
  baseline/ and eval/ sections). The eval/* keys belong to Figure 1 (logged by the pipeline's evaluation at the
  final step): one key, one measurement.
- Checkpoints: every ckpt_every steps and at the end, the artifact checkpoints/last.pt (overwritten;
  `checkpoints.save_checkpoint`: model/optimizer state dicts, step, flat config, RNG states, metrics with the
  monitor's curve points). Reading, checking and loading them is `checkpoints`' job.
- Resume: `train(cfg, resume=run_id)` continues that run from its checkpoint; only RESUME_KEYS may differ from
  the checkpoint's config. On CPU the result is bitwise that of an uninterrupted run. Each step is stored once: the
  checkpoint is the truth, so once the resume holds the run's lease, the metric rows a killed writer left past the
  checkpoint's step (train/* written in batches, an evaluation, its end) are removed (`Run.forget_metrics`, one
  transaction) and logged again; a finished run resumed replaces its final evaluation and FINAL_KEYS.
  train.precision is not a runtime key (bf16 vs fp32 changes the trajectory), but "auto" resolves on the device of
  each call: a CUDA run resumed on the CPU continues in float32. Checkpoints are device-neutral on load
  (checkpoints.read_checkpoint maps every tensor to the CPU), and resuming moves the model and optimizer state to
  the run's device.
- Deadline (`train(..., deadline=)`, `hmmscope train --deadline S`): stop at a logging boundary in time to write
  the checkpoint and return before a wall-clock instant (`hmmscope.training.deadline`); the run ends FINISHED, tagged
  hmmscope.stopped = "deadline", and a resume continues it bitwise (on CPU).
- Divergence: a non-finite loss or gradient norm raises DivergedError naming the first such step (its run_id says
  which run); the run ends FAILED with the reason in the tag hmmscope.failure_reason. The loss and gradient norm
  stay on the device during the steps (no host sync per step) and are read back and checked at the logging,
  evaluation and checkpoint cadences, before anything is logged or saved, so a checkpoint never holds a diverged
  model.
- Signals: while `train` runs in the main thread, SIGTERM (kill, timeout, a scheduler) raises KeyboardInterrupt, so
  the run ends KILLED with its reason instead of staying RUNNING.
- The result (`TrainResult`) carries the trained model (on the run's device, in eval mode) and the run's Config, so
  a caller evaluates it in memory: its weights are those of the last checkpoint.
- Precision and compilation: `device` (train.precision, train.compile, train.attention; the tags hmmscope.precision,
  hmmscope.compiled, hmmscope.attention). Defaults on CPU: float32, eager, bitwise reproducible. HMMSCOPE_THREADS
  sets torch's CPU threads.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import env, tracking
from ..config import RUNTIME_KEYS, Config, flatten, override
from ..interrupts import raise_if_terminated, sigterm_interrupts
from ..model.transformer import Transformer, attention_kernels
from .checkpoints import checkpoint_config, load_checkpoint, save_checkpoint
from .deadline import Deadline, due, state_bytes
from .device import autocast, batch_rows, resolve_precision
from .learning_curve import evaluate_loss
from .monitor import Monitor
from .progress import training_progress
from .record import describe, log_datasets, run_tags
from .schedule import epochs_done, lr_at
from .setup import Model, Setup, build, build_model

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


# ---------------------------------------------------------------- the run's settings


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


def _resume_config(saved: Config, passed: Config) -> Config:
    a, b = flatten(saved), flatten(passed)
    diff = sorted(k for k in a.keys() | b.keys() if k not in RESUME_KEYS and a.get(k) != b.get(k))
    if diff:
        raise ValueError(f"config differs from the checkpoint's in {', '.join(diff)} "
                         f"(only {', '.join(RESUME_KEYS)} may change)")
    return override(saved, {k: b[k] for k in RESUME_KEYS})


def _device_settings(t, device: torch.device) -> tuple[str, Any]:
    """(precision, the training step's attention-kernel context) on `device`, and torch's process-wide settings for
    it (CPU threads; TF32 with bf16 autocast on CUDA, IEEE float32 for fp32). A kernel the device lacks: ValueError
    before any work."""
    precision = resolve_precision(t.precision, device)
    attention = attention_kernels(t.attention, device)
    if device.type == "cpu" and (threads := env.threads()):
        torch.set_num_threads(threads)
    if device.type == "cuda":  # TF32 with bf16 autocast (the matmuls it leaves in float32); IEEE float32 for fp32
        torch.backends.cuda.matmul.allow_tf32 = precision == "bf16"
        torch.backends.cudnn.allow_tf32 = precision == "bf16"
    return precision, attention


# ---------------------------------------------------------------- the loop


class _Loop:
    """One call's steps in an open run: each step, and at their cadences the check of the loss, train/* logging,
    evaluations (val/* and the monitor's) and checkpoints; the deadline's stop."""

    def __init__(self, run, cfg: Config, s: Setup, m: Model, device: torch.device, precision: str, attention,
                 monitor: Monitor, curves: list[dict], *, log_every: int, eval_fn, on_eval, deadline: Deadline | None,
                 stop_after: int | None, eval_s: float):
        self.run, self.cfg, self.t, self.s, self.m, self.device = run, cfg, cfg.train, s, m, device
        self.precision, self.attention, self.monitor, self.curves = precision, attention, monitor, curves
        self.log_every, self.eval_fn, self.on_eval, self.deadline = log_every, eval_fn, on_eval, deadline
        self.stop_after, self.eval_s = stop_after, eval_s
        self.tokens = torch.as_tensor(s.ep_train.tokens.astype(np.int64), device=device)  # (N, T)
        self.loss_mask = torch.as_tensor(s.ep_train.target_mask[:-1], device=device).expand(self.t.batch_size, -1)
        self.tok_per_step = self.t.batch_size * (s.ep_train.seq_len - 1)
        self.last: dict[str, float] = {}
        # the step's loss and gradient norm stay on the device (no host sync per step); `flush` reads them back
        # and checks them at the logging, evaluation and checkpoint cadences, before anything is logged or saved
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        # train/* rows wait here and reach the store together (one write per METRICS_WRITE_S, and before every
        # checkpoint and at the end), not one store write per logged step
        self.logged: list[tuple[dict[str, float], int]] = []
        self.written = time.monotonic()
        self.losses: list[float] = []
        self.train_s = self.int_s = 0.0
        self.last_gn = float("nan")

    def evaluate(self, step: int) -> None:
        with self.deadline.timed("eval") if self.deadline is not None else nullcontext():
            t0 = time.perf_counter()
            model, oracle = self.m.model, self.s.oracle
            ev = {f"val/{k}": v for k, v in evaluate_loss(model, self.s.ep_eval, self.device,
                                                          precision=self.precision).items()}
            if "oracle/test_loss" in oracle:
                ev["val/excess_ce"] = ev["val/test_loss"] - oracle["oracle/test_loss"]
            if self.eval_fn is not None:
                ev.update(self.eval_fn(model, step) or {})
            self.last.clear()
            self.last.update(ev)
            if ev["val/loss"] < self.m.best.get("val/loss", math.inf):
                self.m.best.clear()
                self.m.best.update(ev, step=step)
            point, measured = self.monitor.measure(model, step, self.device)
            if point is not None:  # kept for the monitor's end (the figure, the table), in the checkpoint meanwhile
                self.curves[:] = [c for c in self.curves if c["step"] < step] + [{"step": step, **point}]
            self.eval_s += time.perf_counter() - t0
            self.run.log_metrics({**ev, **measured, LOSS_VAL: ev["val/loss"]}, step=step)
            if self.on_eval is not None:
                self.on_eval(step, dict(ev))

    def checkpoint(self, step: int) -> None:
        with self.deadline.timed("ckpt") if self.deadline is not None else nullcontext():
            self.write_logged()  # every train/* metric up to the checkpoint is stored before it: a resume logs the rest
            save_checkpoint(self.run, model=self.m.model, optimizer=self.m.opt, step=step, cfg=self.cfg,
                            vocab_size=self.s.ep_train.vocab_size,
                            metrics={"last": dict(self.last), "best": dict(self.m.best), "emergence": list(self.curves)},
                            dataset_hash=self.s.ep_train.meta.get("dataset_hash", ""))

    def write_logged(self) -> None:
        if self.logged:
            self.run.log_metric_steps(self.logged)
            self.logged.clear()
        self.written = time.monotonic()

    def flush(self) -> float:
        """Check the pending steps' loss and gradient norm; DivergedError at the first non-finite one.
        Returns the last gradient norm."""
        if not self.pending:
            return float("nan")
        vals = torch.stack([torch.stack([lv, gn]) for _, lv, gn in self.pending]).tolist()
        for (step_no, _, _), (lv, gn) in zip(self.pending, vals):
            if not math.isfinite(lv):
                raise DivergedError(f"non-finite loss ({lv}) at step {step_no}", self.run.run_id)
            if not math.isfinite(gn):
                raise DivergedError(f"non-finite gradient norm ({gn}) at step {step_no}", self.run.run_id)
        self.pending.clear()
        self.losses.extend(v[0] for v in vals)
        return vals[-1][1]

    def run_steps(self, start: int, progress: bool) -> tuple[int, str | None]:
        """Steps start .. train.steps - 1 (or up to the deadline's stop); (the steps done in all, "deadline" or None).
        What was logged before an interrupt or a failure is stored, as it came."""
        done, stopped, t = start, None, self.t
        if self.deadline is not None:
            self.deadline.eval_steps = math.ceil(len(self.s.ep_eval) / 64)
            self.deadline.start(start)
        try:
            with training_progress(progress) as bar:
                task = bar.add_task("train", total=t.steps, completed=start, loss=float("nan"), tps=0.0)
                for step in range(start, t.steps):
                    raise_if_terminated()  # a SIGTERM whose interrupt a weakref callback swallowed (interrupts.py)
                    done = step + 1
                    if self.step(step, bar, task):
                        stopped = "deadline"
                        break
        except BaseException:  # an interrupt, a failure: what was logged before it is stored, as it came
            with contextlib.suppress(Exception):
                self.write_logged()
            raise
        self.write_logged()
        return done, stopped

    def step(self, step: int, bar, task) -> bool:
        """Optimizer step `step`, then what its cadences ask for; True: the deadline stops the loop after it."""
        t, m, t0, done = self.t, self.m, time.perf_counter(), step + 1
        lr = lr_at(step, t)
        for g in m.opt.param_groups:
            g["lr"] = lr
        idx = batch_rows(batch_indices(step, len(self.s.ep_train), t.batch_size, t.seed), self.device)
        batch = self.tokens[idx]
        with autocast(self.device, self.precision), self.attention():
            _, loss = m.fwd(batch[:, :-1], batch[:, 1:], self.loss_mask)
        m.opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.model.parameters(), t.grad_clip)
        m.opt.step()
        self.pending.append((done, loss.detach(), gn.detach()))
        log_now = done % self.log_every == 0 or done == t.steps
        eval_now = done % t.eval_every == 0 or done == t.steps
        ckpt_now = done % t.ckpt_every == 0 or done == t.steps
        stop_now = self.stop_after is not None and done >= self.stop_after
        if log_now or eval_now or ckpt_now or stop_now:
            self.last_gn = self.flush()
        dt = time.perf_counter() - t0
        self.train_s, self.int_s = self.train_s + dt, self.int_s + dt
        bar.update(task, completed=done)
        if log_now:
            self.log(done, lr, bar, task)
        if eval_now:
            self.evaluate(done)
        if ckpt_now:
            self.checkpoint(done)
        if stop_now:  # the one place a step decides to end the loop early
            raise KeyboardInterrupt(f"stopped after step {done} (_stop_after)")
        return self.deadline_stop(done)

    def log(self, done: int, lr: float, bar, task) -> None:
        """train/* at step `done`: the mean loss and the throughput since the last logged step."""
        tps = len(self.losses) * self.tok_per_step / self.int_s
        loss_avg = sum(self.losses) / len(self.losses)
        self.logged.append(({"train/loss": loss_avg, LOSS_TRAIN: loss_avg, "train/lr": lr,
                             "train/grad_norm": self.last_gn, "train/tokens_per_s": tps,
                             "train/epoch": epochs_done(done, len(self.s.ep_train), self.t.batch_size)}, done))
        if time.monotonic() - self.written >= METRICS_WRITE_S:
            self.write_logged()
        bar.update(task, completed=done, loss=loss_avg, tps=tps)
        self.losses.clear()
        self.int_s = 0.0

    def deadline_stop(self, done: int) -> bool:
        """At a logging boundary: does the deadline stop here? Then the checkpoint is written (if not just done)."""
        t, every, m = self.t, self.log_every, self.m
        if self.deadline is None or done >= t.steps or done % every:
            return False
        if not self.deadline.must_stop(done, next_steps=min(every, t.steps - done), evals=due(done, done + every,
                                       t.eval_every), ckpts=due(done, done + every, t.ckpt_every),
                                       ckpt_bytes=state_bytes(m.model.state_dict(), m.opt.state_dict())):
            return False
        if done % t.ckpt_every:
            self.checkpoint(done)
        return True

    def end(self, start: int, done: int, stopped: str | None, resumed: bool, title: str, t_start: float) -> int:
        """After the last step: a finished run resumed evaluated again (its final metrics replaced), the stop's tags,
        FINAL_KEYS and the monitor's end; returns the steps done in all."""
        if start >= self.t.steps:  # resumed a finished run: nothing to train, the final metrics refreshed (replaced)
            self.run.forget_metrics(start - 1, ("val/", *self.monitor.prefixes, LOSS_VAL, *FINAL_KEYS))
            self.evaluate(start)
        done = max(done, start)
        if stopped or (resumed and self.run.get().data.tags.get("hmmscope.stopped")):
            self.run.set_tags({"hmmscope.stopped": stopped or "done", "hmmscope.stopped_at_step": done})
        wall = time.perf_counter() - t_start
        self.run.log_metrics(dict(zip(FINAL_KEYS, (wall, self.eval_s, self.eval_s / wall if wall > 0 else 0.0))),
                             step=done)
        self.monitor.finish(self.run, self.curves, title)
        return done


# ---------------------------------------------------------------- training


def train(cfg: Config, *, tracking_uri: str, experiment: str = "hmmscope", run_name: str | None = None,
          resume: str | None = None, parent: str | None = None, progress: bool = True,
          eval_fn: Callable[[torch.nn.Module, int], Mapping[str, float] | None] | None = None,
          log_every: int | None = None, _stop_after: int | None = None,
          on_eval: Callable[[int, dict[str, float]], None] | None = None,
          tags: Mapping[str, Any] | None = None, note: str | None = None,
          deadline: Deadline | None = None, on_start: Callable[[str], None] | None = None,
          setup: Callable[[str | None], Any] | None = None, monitor: Monitor | None = None) -> TrainResult:
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
    monitor: what is measured beside the learning curve (`monitor.Monitor`; the pipeline's `pipeline.measures`,
    which gives oracle/*, val/excess_ce and the emergence curves); default: nothing.
    """
    t_start = time.perf_counter()
    monitor = monitor or Monitor()
    device, ck = resolve_device(cfg.train.device), None
    if resume is not None:
        with tracking.run_temp_dir(resume) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
            ck = load_checkpoint(tracking_uri, resume, tmp)
        cfg = _resume_config(checkpoint_config(ck), cfg)
        device = resolve_device(cfg.train.device)
    precision, attention = _device_settings(cfg.train, device)
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
        s = build(cfg, device, monitor, setup)  # the data and the monitor's references, each said as it begins
        m = build_model(cfg, s.ep_train.vocab_size, device, ck, resume, setup)
        run.set_tags({**run_tags(cfg, s, m, device, precision),
                      **({"hmmscope.resumed_from_step": m.start, "hmmscope.target_steps": cfg.train.steps}
                         if resume else {})})
        if not resume:
            log_datasets(run, cfg, s)
        loop = _Loop(run, cfg, s, m, device, precision, attention, monitor,
                     list(ck["metrics"].get("emergence", [])) if ck is not None else [],
                     log_every=log_every or min(50, max(1, cfg.train.steps // 100)), eval_fn=eval_fn, on_eval=on_eval,
                     deadline=deadline, stop_after=_stop_after, eval_s=s.references_s)
        if m.start == 0:
            # oracle/test_* is Figure 1's eval/seen/oracle_mix_test_* (same episodes, same targets): one key each
            run.log_metrics({k: v for k, v in s.oracle.items() if not k.startswith("oracle/test_")}, step=0)
            if setup is not None:
                setup(f"the step-0 evaluation ({len(s.ep_eval):,} held-out episodes)")
            loop.evaluate(0)
        if setup is not None:
            setup(None)  # training's own progress takes over
        m.model.train()
        done, stopped = loop.run_steps(m.start, progress)
        done = loop.end(m.start, done, stopped, resume is not None, name, t_start)
    return TrainResult(run.run_id, {**s.oracle, **loop.last}, done, time.perf_counter() - t_start,
                       m.model.num_params(), max(0, done - m.start) * loop.tok_per_step / loop.train_s
                       if loop.train_s else 0.0,
                       {"best": dict(m.best), "train_s": loop.train_s, "eval_s": loop.eval_s, "emergence": loop.curves,
                        **({"deadline": deadline.estimate} if deadline else {})},
                       m.model.eval(), cfg, stopped)
