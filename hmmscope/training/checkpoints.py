"""Checkpoints: what a training run saves, where it lives in MLflow, and how it is read back.

- Saving (`save_checkpoint`): the run's artifact checkpoints/last.pt (overwritten at every save):
  model/optimizer state dicts, step, flat config, vocab_size, RNG states (torch, CUDA, numpy, python),
  metrics {"last", "best"} and the training set's dataset hash. `train` saves every ckpt_every steps and at
  the end.
- Reading: `load_checkpoint` downloads a run's checkpoint (through `tracking`, the only module that talks
  to MLflow) and `read_checkpoint` loads a file. Checkpoints are device-neutral on load: every tensor is
  mapped to the CPU (resuming moves the model and optimizer state to the run's device).
- Checking: `checkpoint_config` checks a checkpoint against the model its config builds (keys and shapes,
  on the meta device) before any weight is loaded, its step (an integer >= 0) and its weights (finite): a misfit
  is a one-line ValueError.
  `model_from_checkpoint` / `load_model` give the Transformer (CPU, eval mode) and its Config.
- `_rng_state` / `set_rng_state`: the global RNG states a checkpoint carries, so a resumed run continues
  bitwise (on CPU) as an uninterrupted one.

Imports torch, the config, the model and `tracking`; must not import train (which imports this), jobs,
sweep or the CLI.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import tracking
from ..config import Config, flatten, from_flat
from ..model.transformer import Transformer

CKPT_DIR, CKPT_NAME = "checkpoints", "last.pt"


def _rng_state() -> dict[str, Any]:
    st = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [st[0], torch.from_numpy(st[1].astype(np.int64)), int(st[2]), int(st[3]), float(st[4])],
            "python": random.getstate()}


def set_rng_state(s: Mapping[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    if s.get("cuda") and torch.cuda.is_available() and len(s["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(s["cuda"])
    n = s["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    p = s["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def save_checkpoint(run: tracking.Run, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    cfg: Config, vocab_size: int, metrics: Mapping[str, Any], dataset_hash: str) -> None:
    """Write the run's checkpoint (module docstring) as its artifact checkpoints/last.pt, replacing the last one.

    metrics: {"last": the latest evaluation's metrics, "best": the best one's, with its step}.
    """
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "config": flatten(cfg), "vocab_size": vocab_size, "rng": _rng_state(),
             "metrics": dict(metrics), "dataset_hash": dataset_hash}
    # a temp file beside last.pt on a local store (written once, fsynced and renamed: a full disk is an error and
    # leaves the last complete checkpoint); a run-named TMPDIR folder for a server (tracking.Run.artifact_file)
    with run.artifact_file(f"{CKPT_DIR}/{CKPT_NAME}") as path, open(path, "wb") as f:
        torch.save(state, f)  # through a file object: a full disk is the OSError ENOSPC (by path: a bare RuntimeError)


def load_checkpoint(tracking_uri: str, run_id: str, dst_dir: str | Path) -> dict:
    """Download run_id's checkpoints/last.pt into dst_dir and load it on the CPU."""
    run = tracking.Run(tracking_uri, run_id)
    try:
        run.get()
    except Exception as e:
        raise ValueError(f"run {run_id} not found in {tracking_uri}: {_first_line(e)}") from None
    try:
        path = run.download(f"{CKPT_DIR}/{CKPT_NAME}", dst_dir)
    except Exception:
        path = None
    if path is None or not Path(path).is_file():
        raise ValueError(f"run {run_id} has no checkpoint")
    return read_checkpoint(path, what=f"run {run_id}'s checkpoint {CKPT_DIR}/{CKPT_NAME}")


def read_checkpoint(path: str | Path, mmap: bool = False, what: str | None = None) -> dict:
    """A checkpoint file (as saved by train) loaded on the CPU (memory-mapped if `mmap`); ValueError (one line, naming
    `what`, default the path) if it is not one: a folder, a special file, empty, truncated or damaged, another format."""
    named, what = what, what or f"checkpoint {path}"
    if Path(path).is_dir():
        raise ValueError(f"{what} is a folder, not a file")
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block, a device never ends
        raise ValueError(f"{what} is a special file (FIFO, device or socket), not a regular file")
    if Path(path).is_file() and Path(path).stat().st_size == 0:  # torch: EOFError with no message
        raise ValueError(f"{what} is empty (0 bytes: its write was cut off, or it was truncated); it cannot be read: "
                         "train the run again, or restore the file")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise ValueError(f"{named} not found" if named else f"checkpoint not found: {path}") from None
    except Exception as e:  # truncated, corrupt, not torch's format: one line, whatever the message
        raise ValueError(f"{what} is not an hmmscope checkpoint (damaged, truncated or another format): "
                         f"{_first_line(e)}") from None
    if not isinstance(ck, dict) or not {"model", "config", "vocab_size", "step"} <= set(ck):
        raise ValueError(f"{what} is not an hmmscope checkpoint")
    return ck


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none (torch's EOFError)."""
    lines = str(e).strip().splitlines()
    return lines[0][:160] if lines else type(e).__name__


def checkpoint_config(ck: Mapping) -> Config:
    """The Config stored in a checkpoint, checked against its weights (keys and shapes) without loading them.

    ValueError (one line) when the config is missing or invalid, or the weights do not fit the model it builds.
    """
    flat = ck.get("config") if isinstance(ck, Mapping) else None
    if not isinstance(flat, Mapping):
        raise ValueError("checkpoint has no config (a mapping of config keys)")
    try:
        cfg = from_flat(flat)
    except ValueError as e:
        raise ValueError(f"checkpoint config is invalid: {e}") from None
    step = ck.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step {step!r} is not a step count (an integer >= 0)")
    vocab, state = ck.get("vocab_size"), ck.get("model")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab != cfg.hmm.n_tokens + 1:
        raise ValueError(f"checkpoint vocab_size {vocab!r} does not fit its config (hmm.n_tokens + 1 = "
                         f"{cfg.hmm.n_tokens + 1})")
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError("checkpoint has no model weights (a state dict of tensors)")
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Transformer(cfg.model, vocab).state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or extra:
        what = f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(extra[:3])}"
        raise ValueError(f"checkpoint weights do not fit the model of its config ({what}"
                         f"{', ...' if len(missing or extra) > 3 else ''})")
    bad = next((k for k in want if want[k] != have[k]), None)
    if bad is not None:
        raise ValueError(f"checkpoint weights do not fit the model of its config ({bad}: shape {list(have[bad])}, "
                         f"model {list(want[bad])})")
    bad = next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
    if bad is not None:  # training never saves these (DivergedError first): a damaged or foreign file
        raise ValueError(f"checkpoint weights are not finite ({bad} holds NaN or inf)")
    return cfg


def model_from_checkpoint(ck: dict) -> tuple[Transformer, Config]:
    """The Transformer (CPU, eval mode) and Config stored in a loaded checkpoint (ValueError if they do not fit)."""
    cfg = checkpoint_config(ck)
    model = Transformer(cfg.model, int(ck["vocab_size"]))
    model.load_state_dict(ck["model"])
    return model.eval(), cfg


def load_model(tracking_uri: str, run_id: str) -> tuple[Transformer, Config]:
    """The trained Transformer (CPU, eval mode) and Config of run_id, from its last checkpoint."""
    with tracking.run_temp_dir(run_id) as tmp:  # named after its run: `runs gc` finds it after a SIGKILL
        return model_from_checkpoint(load_checkpoint(tracking_uri, run_id, tmp))
