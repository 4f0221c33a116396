"""How much of the mixture oracle's work the exact skipping leaves, at the paper's shape (issue 9).

Counts, over (task, episode, observed token) triples: chain steps run (the chain not yet stopped) and full
predictions formed (the term passed the theta test), for the task order of a given revision of
``inference.py`` (default: the working tree; ``--rev f1ab2f0`` for the order before the kernel work).
The counters are added to an uncached copy of the generic kernel's source (same decisions as the kernel).

    .venv/bin/python analysis/results/bench/oracle_skip_counts.py [--rev REV] [--n-tasks 8192] [--episodes 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch

from hmmscope.config import preset
from hmmscope.data.episodes import sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.oracles import inference, mixture_kernel

ROOT = Path(__file__).resolve().parents[3]


def _counting_kernel():
    src = Path(mixture_kernel.__file__).read_text().split("\n# ------------------------------------------------"
                                                           "---------------- rank-specialized copy")[0]
    edits = [("cache=True", "cache=False"), ("parallel=True", "parallel=False"), ("numba.prange", "range"),
             ("           c, u, cum, R):  # pragma: no cover", "           c, u, cum, R, cnt):"),
             ("        if o < 0 or o >= V:\n            continue\n        m = mx[i, t]",
              "        if o < 0 or o >= V:\n            continue\n        cnt[0] += 1\n        m = mx[i, t]"),
             ("            w = math.exp(L - m)\n", "            w = math.exp(L - m)\n            cnt[1] += 1\n"),
             ("post, c, u, cum[i - i0, :, 0], R[i - i0, :, 0])", "post, c, u, cum[i - i0, :, 0], R[i - i0, :, 0], cnt)"),
             ("post, c, u, cum[i - i0, :, k], R[i - i0, :, k])", "post, c, u, cum[i - i0, :, k], R[i - i0, :, k], cnt)"),
             ("first, lq, theta, acc, wsum, mx, post):  # pragma: no cover",
              "first, lq, theta, acc, wsum, mx, post, cnt):")]
    for a, b in edits:
        if a not in src:
            raise SystemExit(f"the kernel source changed; update this script's edits ({a[:40]!r})")
        src = src.replace(a, b)
    mod = types.ModuleType("hmmscope._counting_kernel")
    sys.modules[mod.__name__] = mod
    exec(compile(src, "<counting kernel>", "exec"), mod.__dict__)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default=None, help="take inference.py (the task order) from this git revision")
    ap.add_argument("--n-tasks", type=int, default=8192)
    ap.add_argument("--episodes", type=int, default=16)
    args = ap.parse_args()
    inf = inference
    if args.rev:
        src = subprocess.run(["git", "show", f"{args.rev}:hmmscope/inference.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        inf = types.ModuleType("hmmscope._rev_inference")
        inf.__package__ = "hmmscope.data"  # its `from .hmm import ...` reads today's hmmscope/data/hmm.py
        sys.modules[inf.__name__] = inf
        exec(compile(src, f"<{args.rev}:inference.py>", "exec"), inf.__dict__)
    kern = _counting_kernel()
    cnt = np.zeros(2, np.int64)

    class Counting:  # stands in for the kernel module: every chunk through the counting copy
        @staticmethod
        def mix_chunk(*a):
            kern.mix_chunk(*a, cnt)

        for_rank = staticmethod(lambda d: Counting)
        slp_vectorize = staticmethod(mixture_kernel.slp_vectorize)

    inf._numba = lambda: Counting
    cfg = preset("paper")
    mix = make_mixture(dataclasses.replace(cfg.hmm, n_tasks=args.n_tasks), dtype=np.float32)
    ep = sample_episodes(mix, cfg.data, args.episodes, split="eval")
    inf.mixture_oracle(mix, ep, posterior_at="test_start", dtype=torch.float64)
    total = args.n_tasks * args.episodes * int(np.asarray(ep.is_obs).sum())
    print(f"mixture oracle skipping, {args.n_tasks} tasks x {args.episodes} episodes, task order of "
          f"{args.rev or 'the working tree'}: of {total:,} (task, episode, observed token) triples, "
          f"chain steps run {cnt[0] / total:.1%}, full predictions formed {cnt[1] / total:.1%}")


if __name__ == "__main__":
    main()
