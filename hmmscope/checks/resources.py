"""Checks of a job's memory and time before it starts: what this process can get (MemAvailable, the cgroup limit,
RLIMIT_AS; a GPU's memory), a job's terms against it (`fits`, `memory`: the dominant term named, unless --force),
its floor on the work at the best rate this machine could reach (`duration`), and a sweep's largest trial times its
workers at once (`sweep_memory`). The estimates themselves are `checks.estimates`'.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Mapping
from pathlib import Path

from ..config import ConfigError
from .estimates import GIB, RUNTIME_BYTES, memory_estimate
from .values import cores

PEAK_FLOPS_PER_CORE = 2e11  # float32 FLOP/s no CPU core exceeds (AVX-512: 2 FMA units x 16 lanes x 2 x 3+ GHz ~ 1.9e11)
PEAK_FLOPS_GPU = 4e15  # FLOP/s no single GPU reaches on this model's matmuls (H100/H200 dense bf16: ~1e15)
MAX_JOB_S = 365 * 86400.0  # a job whose floor is over a year is refused unless --force


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_memory() -> int:
    """Bytes this process can still get: MemAvailable, capped by the cgroup limit and RLIMIT_AS."""
    vals = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                vals.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    if not vals:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            vals.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for lim, cur in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                     ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        a, b = _read_int(lim), _read_int(cur)
        if a is not None and b is not None and a < 1 << 60:
            vals.append(max(0, a - b))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        vm = 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            vm = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/self/status").read_text().splitlines()
                      if ln.startswith("VmSize:"))
        vals.append(max(0, soft - vm))
    return min(vals) if vals else 1 << 62


def device_memory(device) -> int | None:
    """Free bytes on a CUDA device; None for the CPU (its terms count against host memory)."""
    import torch  # lazy: torch (~1 s) off the CLI's start-up

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev.index or 0)
    return int(free)


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.0f} MiB"


def fits(need: Mapping[str, tuple[int, str]], *, host: int, device: int | None = None, times: int = 1,
         what: str = "this job") -> None:
    """ConfigError unless every pool holds its terms: "device" terms go to `device` bytes (host when None).

    `times` multiplies every term (parallel worker processes). The message names the dominant term.
    """
    pools: dict[str, dict[str, int]] = {"host": {}, "device": {}}
    for term, (b, where) in need.items():
        pools["device" if where == "device" and device is not None else "host"][term] = b * times
    for pool, terms in pools.items():
        if not terms:
            continue
        total, have = sum(terms.values()), host if pool == "host" else device
        if total > have:
            top = max(terms, key=terms.get)
            where = "this machine has" if pool == "host" else "the GPU has"
            raise ConfigError(f"{what} needs about {fmt_bytes(total)} of {'memory' if pool == 'host' else 'GPU memory'}"
                              f" (mostly {top}: {fmt_bytes(terms[top])}), {where} {fmt_bytes(have)} available; "
                              "make it smaller, or pass --force to try anyway")


def memory(need: Mapping[str, tuple[int, str]], *, device: str = "cpu", force: bool = False, times: int = 1,
           what: str = "this job") -> None:
    """Refuse a job whose estimate (memory_estimate) cannot fit here, unless `force`."""
    if force:
        return
    dev = device_memory(device) if any(w == "device" for _, w in need.values()) and device != "cpu" else None
    fits(need, host=host_memory(), device=dev, times=times, what=what)


def _span(s: float) -> str:
    for unit, n in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= n:
            return f"{s / n:,.3g} {unit}" if s / n < 1e6 else f"{s / n:.1e} {unit}"
    return f"{s:.3g} s"


def duration(flops: float, *, device: str = "cpu", force: bool = False, what: str = "this job") -> float:
    """The floor in seconds of `flops` of work on `device` (every core, or the GPU, at its best possible rate);
    ConfigError naming it when it exceeds MAX_JOB_S, unless `force`."""
    gpu = not device.startswith("cpu")
    rate = PEAK_FLOPS_GPU if gpu else PEAK_FLOPS_PER_CORE * cores()
    floor = flops / rate
    if floor > MAX_JOB_S and not force:
        raise ConfigError(f"{what} would take at least {_span(floor)} on this machine ({flops:.2g} FLOP at no more "
                          f"than {rate:.2g} FLOP/s, {'one GPU' if gpu else f'{cores()} CPU cores'}); make it smaller, or "
                          f"pass --force to try anyway")
    return floor


def tokens_memory(n_seqs: int, length: int, bench: str) -> dict[str, tuple[int, str]]:
    """bench sample / filter on the benchmark HMM (V = 16): bytes per token of the arrays alive at the peak.

    sample: int32 tokens and states, their time-major chunk copies and the uniforms (about 40 B/token);
    filter: those, the int64 token tensor, float32 predictions (V = 16) and log-likelihoods, and the
    filter's int64 gather index and clamped tokens (about 120 B/token).
    """
    per = {"sample": 40, "filter": 120}[bench]
    return {"runtime": (RUNTIME_BYTES, "host"), f"{n_seqs} x {length} tokens": (per * n_seqs * length, "host")}


def sweep_memory(spec, *, workers: int, force: bool = False) -> None:
    """Refuse a sweep whose largest trial, times the worker processes running at once, cannot fit.

    The largest trial: over every grid point (sampler grid), or with each parameter at whichever of its
    choices or bounds needs most (tpe / random). Analysis trials count the larger of training and analysis.
    """
    if force:
        return

    def need(pt) -> dict[str, tuple[int, str]]:
        cfg = spec.trial_config({**pt, "seed": spec.seeds[0]})
        if spec.kind == "theory":
            return memory_estimate(cfg, "theory")
        jobs = [memory_estimate(cfg, "train")] + ([memory_estimate(cfg, "analyze")] if spec.analyze else [])
        return max(jobs, key=lambda n: sum(b for b, _ in n.values()))

    total = lambda n: sum(b for b, _ in n.values())  # noqa: E731
    if spec.sampler == "grid":
        pts = [{k: v for k, v in pt.items() if k != "seed"} for pt in spec.grid_points()[::len(spec.seeds)]]
        worst = max((need(pt) for pt in pts), key=total)
    else:
        pt = {p.key: p.grid[0] if p.grid is not None else p.low for p in spec.space}
        for p in spec.space:
            vals = list(p.grid) if p.grid is not None else [p.low, p.high]
            pt[p.key] = max(vals, key=lambda v, key=p.key: total(need({**pt, key: v})))
        worst = need(pt)
    device = "cpu"
    if spec.kind == "train" and any(w == "device" for _, w in worst.values()):
        from ..training.train import resolve_device  # lazy: torch (~1 s) off the CLI's start-up; an upward import

        device = str(resolve_device(spec.trial_config({"seed": spec.seeds[0]} | {
            p.key: p.grid[0] if p.grid is not None else p.low for p in spec.space}).train.device))
    memory(worst, device=device, times=max(1, min(workers, spec.n_trials)),
           what=f"sweep {spec.name!r} ({min(workers, spec.n_trials)} worker(s) at once)")
