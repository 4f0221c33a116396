"""Precision, compilation and host-to-device copies of a training run on its device.

train.precision "auto" is bf16 autocast on CUDA and float32 elsewhere; "bf16" autocasts on any device (the CPU twin
of the CUDA path); "fp32" runs without autocast and, on CUDA, without TF32. bf16 on CUDA also enables TF32 for the
matmuls autocast leaves in float32. train.compile ("auto": on for CUDA, off elsewhere; "true" / "false" on any
device; "blocks": each block compiled alone, one graph shared by the layers; `resolve_compile` says why, the tag
hmmscope.compiled what was done) torch.compiles the training step's forward (inductor;
`Transformer.compile_forward`); evaluation runs eager (a few batches per eval: a second compiled graph would cost
more than it saves). AdamW is fused on CPU and CUDA; attention is SDPA with is_causal=True (flash / efficient kernels
on CUDA) unless a band mask is set; train.attention pins the training step's SDPA kernel (`model.attention_kernels`;
the tag hmmscope.attention). Both are run-time keys: a resumed run may change them. Defaults on CPU: float32, eager,
bitwise reproducible. A step's batch rows reach the device without a host sync (`batch_rows`). The device itself is
`train.resolve_device`'s.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch


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


def batch_rows(idx: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step's batch rows on `device`. On CUDA through pinned memory with non_blocking=True: a copy from pageable
    memory would wait for the GPU to drain its queue (a host sync every step); torch's pinned-memory allocator keeps
    the host block alive until the copy is done. Elsewhere a plain tensor (the CPU twin)."""
    t = torch.from_numpy(idx)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def autocast(device: torch.device, precision: str = "auto"):
    """A forward in train.precision on `device`: bf16 autocast, or nothing (float32)."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
