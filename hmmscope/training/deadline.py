"""A wall-clock deadline for training: when to stop so that the checkpoint is written in time.

`train(cfg, ..., deadline=Deadline(at))` stops at a step boundary, writes its checkpoint and ends its MLflow run
before the `time.monotonic()` instant `at`; `train --resume RUN_ID` continues it bitwise on the same device.

Where it stops: only at a train/* logging boundary (`done % log_every == 0`, at most 50 steps apart). There the
running loss average is empty, so the resumed run logs the same train/loss values at the same steps as an
uninterrupted one, and on CUDA the loss has just been read back (the interval's wall time is the device's, not
only the host's enqueueing). At each boundary `Deadline.must_stop` asks whether the next interval still fits:

    now + log_every * step_s + evals * eval_s + (checkpoints + 1) * ckpt_s + margin_s > at

- step_s: seconds per step of this call, the larger of the last interval's and the mean over the call (a slow
  spell counts at once); evaluation and checkpoint time are measured apart (`timed`) and not counted in it.
- eval_s: the longest evaluation of this call; before one was measured (a resumed call evaluates nothing at
  first), `eval_steps` x step_s, which `train` sets to the evaluation's batches (a forward-only batch costs
  about a third of a training step: an over-estimate, unless an `eval_fn` adds much more). evals: evaluations
  due in the next interval.
- ckpt_s: the longest checkpoint write of this call, or at least the checkpoint's bytes twice (torch.save to a
  temporary file, then MLflow copies it into the artifact store) at `write_mb_per_s` (default 200 MB/s, a
  conservative disk rate; the paper model's 2.4 GB checkpoint: 24 s). The stop itself writes one more.
- margin_s (default 5 s): ending the MLflow run, and the caller's own exit.

A run always trains at least one interval (the first check is at the first boundary), also when the deadline
passed during the setup. Imports only the standard library (torch objects are duck-typed); must not import
train, which imports this.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0.0): `--deadline` counts from the command's
    start, imports included."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def state_bytes(*state_dicts: dict) -> int:
    """Bytes of the tensors in (nested) state dicts: a checkpoint's size before pickling."""
    def walk(v) -> Iterable[int]:
        if hasattr(v, "element_size") and hasattr(v, "numel"):
            yield v.element_size() * v.numel()
        elif isinstance(v, dict):
            for x in v.values():
                yield from walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                yield from walk(x)
    return sum(n for sd in state_dicts for n in walk(sd))


def due(lo: int, hi: int, every: int) -> int:
    """How many multiples of `every` lie in (lo, hi]."""
    return hi // every - lo // every if every > 0 else 0


@dataclass
class Deadline:
    """Stop training so that it has returned by `at` (a `time.monotonic()` instant); see the module docstring."""

    at: float
    margin_s: float = 5.0
    write_mb_per_s: float = 200.0
    clock: Callable[[], float] = time.monotonic
    eval_steps: float = 0.0  # an evaluation's cost in training steps, until one was measured
    _mark: float | None = field(default=None, repr=False)
    _mark_step: int = field(default=0, repr=False)
    _aside: float = field(default=0.0, repr=False)  # eval / checkpoint seconds since the mark
    _steps: int = field(default=0, repr=False)
    _step_total: float = field(default=0.0, repr=False)
    _step_last: float = field(default=0.0, repr=False)
    _eval_s: float = field(default=0.0, repr=False)
    _ckpt_s: float = field(default=0.0, repr=False)
    estimate: dict[str, float] = field(default_factory=dict)  # the last check's terms (for the stop's message)

    @classmethod
    def after(cls, seconds: float, **kw) -> Deadline:
        """A deadline `seconds` from now."""
        clock = kw.get("clock", time.monotonic)
        return cls(at=clock() + seconds, **kw)

    def left(self) -> float:
        return self.at - self.clock()

    def start(self, step: int) -> None:
        """Training (re)starts at `step`: the step clock starts now."""
        self._mark, self._mark_step, self._aside = self.clock(), step, 0.0

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Time an evaluation ('eval') or a checkpoint write ('ckpt'): kept out of the seconds per step."""
        t0 = self.clock()
        try:
            yield
        finally:
            dt = self.clock() - t0
            self._aside += dt
            if what == "eval":
                self._eval_s = max(self._eval_s, dt)
            else:
                self._ckpt_s = max(self._ckpt_s, dt)

    def must_stop(self, done: int, *, next_steps: int, evals: int, ckpts: int, ckpt_bytes: int) -> bool:
        """At boundary `done` (steps done in all): would the next `next_steps` steps, the `evals` evaluations and
        `ckpts` checkpoints due in them, the stop's checkpoint and the margin end after `at`?"""
        now = self.clock()
        if self._mark is None:
            self.start(done)
        n = done - self._mark_step
        if n > 0:
            per = max(0.0, now - self._mark - self._aside) / n
            self._steps, self._step_total, self._step_last = self._steps + n, self._step_total + per * n, per
        self._mark, self._mark_step, self._aside = now, done, 0.0
        step_s = max(self._step_last, self._step_total / self._steps) if self._steps else 0.0
        eval_s = self._eval_s or self.eval_steps * step_s
        ckpt_s = max(self._ckpt_s, 2 * ckpt_bytes / (self.write_mb_per_s * 1e6))
        need = next_steps * step_s + evals * eval_s + (ckpts + 1) * ckpt_s + self.margin_s
        self.estimate = {"step_s": step_s, "eval_s": eval_s, "ckpt_s": ckpt_s, "need_s": need,
                         "left_s": self.at - now}
        return now + need > self.at
