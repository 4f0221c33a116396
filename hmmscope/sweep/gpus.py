"""GPUs of a sweep's workers: which the trials use, which are visible, worker i's, a joining worker's pin.

When the trials train on device "cuda" or "auto", `run_sweep` gives worker i the GPU
visible[i % len(visible)] through CUDA_VISIBLE_DEVICES (visible: the CUDA_VISIBLE_DEVICES list if set,
else torch's device count); `sweep worker --gpu I` pins a joining worker to visible GPU I (`pin_gpu`).

Imports the spec package (its SweepSpec) and torch lazily (`# lazy:`); never Optuna, MLflow or the other sweep modules.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..config import ConfigError
from .spec import SweepSpec


def visible_gpus() -> list[str]:
    """GPU ids this process may hand out: the CUDA_VISIBLE_DEVICES list if set, else 0..count-1 (torch)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    try:
        import torch  # lazy: torch (~1 s) off the sweep commands that count no GPU

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def pin_gpu(index: int) -> str:
    """Restrict this process to visible GPU `index` (sets CUDA_VISIBLE_DEVICES; before CUDA starts); ConfigError (the
    environment as it was) when that shows no GPU (none on this machine, or an index past its GPUs)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [g.strip() for g in env.split(",") if g.strip()]
        if not 0 <= index < len(ids):
            raise ConfigError(f"--gpu {index}: CUDA_VISIBLE_DEVICES={env!r} makes {len(ids)} GPU(s) visible")
        gpu = ids[index]
    else:
        if index < 0:
            raise ConfigError(f"--gpu must be >= 0, got {index}")
        gpu = str(index)
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch  # lazy: after the pin (CUDA reads CUDA_VISIBLE_DEVICES when it starts); torch off the start-up

    if torch.cuda.device_count() < 1:  # counted with the pin in place (CUDA reads it when it starts)
        if env is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = env
        raise ConfigError(f"--gpu {index}: no CUDA GPU is visible here (CUDA_VISIBLE_DEVICES={gpu} shows none); leave "
                          "--gpu out to run on the CPU")
    return gpu


def uses_gpu(spec: SweepSpec) -> bool:
    """Do the spec's trials train on device cuda (or auto, which picks a GPU when there is one)?"""
    if spec.kind != "train":
        return False
    points = spec.grid_points() if spec.sampler == "grid" else [{}]
    return any(spec.trial_config(pt).train.device in ("cuda", "auto") for pt in points)


def worker_gpus(spec: SweepSpec, workers: int, gpus: Sequence[str] | None = None) -> list[str | None]:
    """The GPU of each local worker: round-robin over `gpus` (default: visible_gpus()) when the trials use
    cuda; None (environment untouched) otherwise or when no GPU is visible."""
    if gpus is None:
        gpus = visible_gpus() if uses_gpu(spec) else []
    gpus = list(gpus)
    return [gpus[i % len(gpus)] if gpus else None for i in range(workers)]
