"""Interleaved old-vs-new timing of the CPU mixture oracle in one process (issue 9).

The old code is read from git (default: the commit before the kernel work, ``f1ab2f0``): its
``inference.py`` and ``_mixture_kernel.py`` are loaded as private modules next to the current ones and
run on the same mixture and episodes, alternately, ``--rounds`` times; the best (min) of each is compared.
Also checks that both give the same predictions (max |diff|) and posteriors.

    .venv/bin/python analysis/results/bench/oracle_old_vs_new.py [--n-tasks 8192] [--episodes 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import hmmscope
from hmmscope.config import preset
from hmmscope.data.episodes import sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.oracles import inference

ROOT = Path(__file__).resolve().parents[3]


def _load_old(rev: str):
    """main's inference module at `rev`, wired to main's kernel at `rev` (both compiled here, uncached)."""
    def module(name, path, patch=lambda s: s):
        src = patch(subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                                   text=True).stdout)
        spec = importlib.util.spec_from_loader(f"hmmscope.{name}", loader=None)
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = "hmmscope.data"  # the old `from .hmm import ...` reads today's hmmscope/data/hmm.py
        sys.modules[spec.name] = mod
        exec(compile(src, f"<{rev}:{path}>", "exec"), mod.__dict__)
        return mod

    kern = module("_old_mixture_kernel", "hmmscope/_mixture_kernel.py", lambda s: s.replace("cache=True", "cache=False"))
    old = module("_old_inference", "hmmscope/inference.py")
    old._numba = lambda: kern
    return old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="f1ab2f0")
    ap.add_argument("--n-tasks", type=int, default=8192)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    old = _load_old(args.rev)
    cfg = preset("paper")
    mix = make_mixture(dataclasses.replace(cfg.hmm, n_tasks=args.n_tasks), dtype=np.float32)
    ep = sample_episodes(mix, cfg.data, args.episodes, split="eval")
    runs = {"old": old.mixture_oracle, "new": inference.mixture_oracle}
    for fn in runs.values():  # compile / warm up
        fn(mix, ep.subset(slice(0, 1)), posterior_at="test_start", dtype=torch.float64)
    mods = {"old": old, "new": inference}

    def tables(mod):  # the per-task tables alone (paid once per call, whatever the number of episodes)
        for lo in range(0, args.n_tasks, 1024):
            mu, W, Q, O = mod._task_params(mix, np.arange(lo, min(lo + 1024, args.n_tasks)), torch.float64, "cpu")
            mod._step_tables(mu, W, Q, O, None)

    times: dict[str, list[float]] = {k: [] for k in runs}
    tab: dict[str, list[float]] = {k: [] for k in runs}
    out = {}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            out[name] = fn(mix, ep, posterior_at="test_start", dtype=torch.float64)
            times[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tables(mods[name])
            tab[name].append(time.perf_counter() - t0)
    (po, qo), (pn, qn) = out["old"], out["new"]
    dp = float(np.nanmax(np.abs(po.numpy() - pn.numpy())))
    dq = float((qo - qn).abs().max())
    print(f"mixture oracle, {args.n_tasks} tasks, {args.episodes} episodes x {ep.tokens.shape[1]} tokens, float64, "
          f"{torch.get_num_threads()} threads; old = {args.rev}, new = working tree (hmmscope {hmmscope.__version__})")
    for name in runs:
        print(f"  {name}: " + " ".join(f"{t:.2f}" for t in times[name]) + f" s; best {min(times[name]):.2f} s")
    print(f"  old / new (best of {args.rounds} each, interleaved): {min(times['old']) / min(times['new']):.2f}x")
    for name in runs:
        print(f"  {name} tables alone: " + " ".join(f"{t:.2f}" for t in tab[name]) + f" s; best {min(tab[name]):.2f} s")
    past = {k: min(times[k]) - min(tab[k]) for k in runs}
    print(f"  past the tables (best call - best tables): old {past['old']:.2f} s, new {past['new']:.2f} s, "
          f"old / new {past['old'] / past['new']:.2f}x")
    print(f"  max |pred old - new| {dp:.1e}, max |posterior old - new| {dq:.1e}")
    print(f"  load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
