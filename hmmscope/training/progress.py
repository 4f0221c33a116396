"""Training's progress display: a bar on a terminal, plain lines elsewhere (a file, nohup, Slurm, CI).

`training_progress(enabled)` returns what `train` drives step by step (rich's Progress interface: `add_task`,
`update`, a context manager): on a terminal a transient rich bar on stderr (step, loss, tokens/s, elapsed, ETA);
off one `PlainProgress`, one plain line on stderr at the first logged step, then at most one every
HMMSCOPE_PROGRESS_S seconds (default 30) and one at the last step: '<date time> train: step S/N, loss L, T tokens/s,
ETA h:mm:ss' (the ETA from this call's own rate; `stamp`: the local date and time first, as every progress line off a
terminal has it); nothing when not `enabled` (a sweep's workers).

Imports rich only inside `training_progress`; of hmmscope only `env`.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from .. import env

PROGRESS_ENV = env.PROGRESS_S.name  # seconds between plain progress lines off a terminal (default 30)
PROGRESS_RANGE = (env.PROGRESS_S.lo, env.PROGRESS_S.hi)


def stamp(msg: str) -> str:
    """A progress line as a log file keeps it: the local date and time first, `2026-11-27 21:50:03 train: step ...`
    (Slurm and nohup logs carry no times of their own)."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"


def progress_every() -> float:
    """Seconds between `train`'s plain progress lines when stderr is no terminal (env HMMSCOPE_PROGRESS_S, default 30,
    in PROGRESS_RANGE; ValueError, one line, outside it)."""
    return env.PROGRESS_S.read()


class PlainProgress:
    """Training's progress off a terminal (module docstring); the calls of rich's Progress that `train` makes."""

    def __init__(self, every: float):
        self.every, self.t0, self.last, self.start, self.total = every, time.monotonic(), None, 0, 0
        self.fields: dict[str, Any] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: int, completed: int = 0, **fields) -> int:
        self.total, self.start, self.fields = total, completed, dict(fields)
        return 0

    def update(self, task: int, completed: int, **fields) -> None:
        self.fields.update(fields)
        if "loss" not in fields:  # a step without a logged loss: nothing new to say
            return
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every and completed < self.total:
            return
        self.last = now
        done = completed - self.start
        left = (self.total - completed) * (now - self.t0) / done if done > 0 else math.nan
        eta = "?" if not math.isfinite(left) else f"{int(left) // 3600}:{int(left) // 60 % 60:02d}:{int(left) % 60:02d}"
        print(stamp(f"train: step {completed}/{self.total}, loss {self.fields.get('loss', math.nan):.4f}, "
                    f"{self.fields.get('tps', 0.0):,.0f} tokens/s, ETA {eta}"), file=sys.stderr, flush=True)


def loss_text(fields: dict[str, Any]) -> str:
    """The bar's loss and speed: `loss 2.3456  12,345 tok/s`, or `loss -` before the first logged step (before:
    `loss nan  0 tok/s`)."""
    loss = fields.get("loss", math.nan)
    if not (isinstance(loss, (int, float)) and math.isfinite(loss)):
        return "loss -"
    return f"loss {loss:.4f}  {fields.get('tps', 0.0):,.0f} tok/s"


def loss_column():
    """A rich progress column showing `loss_text` of its task's fields."""
    from rich.progress import ProgressColumn  # lazy: rich.progress off `stamp`'s callers (the CLI's plain lines)
    from rich.text import Text  # lazy: with rich.progress

    class LossColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text(loss_text(task.fields))

    return LossColumn()


def training_progress(enabled: bool):
    """A transient rich bar on a terminal; `PlainProgress` lines otherwise; nothing if not `enabled`."""
    from rich.console import Console  # lazy: with rich.progress
    from rich.progress import (  # lazy: rich.progress off `stamp`'s callers (the CLI's plain lines)
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if enabled and not console.is_terminal:
        return PlainProgress(progress_every())
    return Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(), loss_column(),
                    TimeElapsedColumn(), TimeRemainingColumn(), transient=True,
                    console=console, disable=not (enabled and console.is_terminal))
