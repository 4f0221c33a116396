"""What a training run records about itself: its one-line description (`describe`, the MLflow note), its tags (the
data, device, precision, compilation, size and budget: `run_tags`) and its episodes as dataset inputs
(`log_datasets`). Pure words and dicts; the run is `train`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import Config, config_hash, training_tasks
from .schedule import epochs_done
from .setup import Model, Setup


def describe(cfg: Config) -> str:
    """A training run's one-line description (its MLflow note)."""
    h, d, m, t = cfg.hmm, cfg.data, cfg.model, cfg.train
    return (f"Training: {m.n_layers}-layer {m.pos_enc} transformer (d_model {m.d_model}, {m.n_heads} heads"
            f"{f', window {m.window}' if m.window else ''}) on a {h.family} HMM mixture ({h.n_tasks} tasks, "
            f"{h.n_states} states, rank {h.rank}, gamma {h.gamma:g}); {d.n_demos} demos of {d.l_demo} + test "
            f"{d.l_test} tokens; {t.steps} steps, lr {t.lr:g}, seed {t.seed}")


def run_tags(cfg: Config, s: Setup, m: Model, device: torch.device, precision: str) -> dict[str, Any]:
    """What a training run records about itself: its data, device, precision, compilation, size and budget."""
    t = cfg.train
    return {"hmmscope.dataset_hash": s.ep_train.meta.get("dataset_hash", ""),
            "hmmscope.eval_dataset_hash": s.ep_eval.meta.get("dataset_hash", ""),
            "hmmscope.hmm_hash": config_hash(cfg.hmm), "hmmscope.device": str(device), "hmmscope.precision": precision,
            "hmmscope.compiled": m.scope if m.compiled and m.scope != "model" else str(m.compiled).lower(),
            "hmmscope.attention": t.attention, "hmmscope.n_params": m.model.num_params(),
            # the budget as passes over data.n_train and episodes per training task (SCIENCE.md 8's two readings)
            "hmmscope.epochs": f"{epochs_done(t.steps, len(s.ep_train), t.batch_size):g}",
            "hmmscope.episodes_per_task": f"{t.steps * t.batch_size / training_tasks(cfg.hmm, cfg.data):g}",
            "hmmscope.tasks": "fresh" if s.mix is None else "mixture"}


def log_datasets(run, cfg: Config, s: Setup) -> None:
    """The episodes as MLflow dataset inputs: content hash as digest, the generator as source (a new run's)."""
    for split, e in (("train", s.ep_train), ("eval", s.ep_eval)):
        run.log_dataset(f"episodes-{split}", e.meta.get("dataset_hash", ""), split,
                        f"hmmscope sample_episodes: hmm {config_hash(cfg.hmm)[:8]}, split {split!r}",
                        {"episodes": len(e), "seq_len": e.seq_len, "vocab_size": e.vocab_size})
