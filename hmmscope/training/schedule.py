"""What an optimizer step is told: its learning rate (`lr_at`, train.schedule) and the passes over the training set
done after it (`epochs_done`).

- Schedule (train.schedule): linear warmup, then cosine decay to min_lr at train.steps (cosine), lr throughout
  (constant), or lr until the last train.decay_frac of the steps and a linear decay to min_lr (wsd:
  warmup-stable-decay; a resumed run with more train.steps moves the decay, not the past).
- Epochs: several passes over a fixed data.n_train are train.steps > n_train / batch_size (the batches' stream:
  train.batch_indices); train/epoch logs the passes done.
"""

from __future__ import annotations

import math

from ..config import TrainConfig


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
