"""Measure: checks.memory_estimate against the peak RSS of real `hmmscope` processes on this machine (CPU).

Not a test (pytest does not collect it). Each row runs one command in a temporary folder under
GNU time (`/usr/bin/time -f %M`, the peak resident set size) and prints it beside the estimate:

    .venv/bin/python tests/measure_memory.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hmmscope.checks import GIB, memory_estimate
from hmmscope.config import Config, override

BIN = Path(sys.executable).parent / "hmmscope"

ROWS = [  # (label, command after `hmmscope`, job, extra --set keys applied to the estimate's config)
    ("generate 4096 tasks x 128 states, 65,536 paper-layout episodes",
     ["generate", "x.npz", "--n", "65536", "--set", "hmm.n_tasks=4096", "--set", "hmm.n_states=128",
      "--set", "hmm.n_tokens=16", "--set", "hmm.rank=8", "--set", "data.n_demos=6", "--set", "data.l_demo=48",
      "--set", "data.l_test=64", "--set", "model.max_len=512"], "generate", {"n_episodes": 65536}),
    ("train d_model 256 x 4 layers, batch 64 x 131 tokens, 2 steps",
     ["train", "--no-evaluate", "--device", "cpu", "--set", "model.d_model=256", "--set", "model.d_mlp=1024",
      "--set", "model.n_layers=4", "--set", "train.batch_size=64", "--set", "train.steps=2",
      "--set", "train.eval_every=2", "--set", "train.ckpt_every=2", "--set", "train.warmup=1",
      "--set", "data.n_eval=128"], "train", {}),
    ("train d_model 128 x 2 layers, window 16 (math attention), batch 128, 2 steps",
     ["train", "--no-evaluate", "--device", "cpu", "--set", "model.n_layers=2", "--set", "model.window=16",
      "--set", "train.batch_size=128", "--set", "train.steps=2", "--set", "train.eval_every=2",
      "--set", "train.ckpt_every=2", "--set", "train.warmup=1", "--set", "data.n_eval=128"], "train", {}),
    ("theory S = 1500, 2000 histories",
     ["theory", "--no-track", "--n-states", "1500", "--ranks", "8", "--gammas", "0.5", "--set", "theory.gamma_m=0"],
     "theory", {}),
]


def _config(args: list[str]) -> Config:
    """The config the command builds: defaults (tiny) with its --set keys and theory list options."""
    sets = {args[i + 1].split("=", 1)[0]: args[i + 1].split("=", 1)[1] for i, a in enumerate(args) if a == "--set"}
    for opt, key in (("--n-states", "theory.n_states"), ("--ranks", "theory.ranks"), ("--gammas", "theory.gammas")):
        if opt in args:
            sets[key] = f"[{args[args.index(opt) + 1]}]"
    return override(Config(), sets)


def main() -> int:
    print(f"{'command':78s} {'estimate':>10s} {'peak RSS':>10s} {'ratio':>6s}")
    for label, args, job, kw in ROWS:
        need = memory_estimate(_config(args), job, **kw)
        est = sum(b for b, _ in need.values())
        with tempfile.TemporaryDirectory() as tmp:
            env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
            env.update(HMMSCOPE_THREADS="1", OMP_NUM_THREADS="1")
            r = subprocess.run(["/usr/bin/time", "-f", "%M", str(BIN), *args], cwd=tmp, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{label}: exit {r.returncode}: {r.stderr.strip().splitlines()[-2:]}")
                continue
            rss = int(r.stderr.strip().splitlines()[-1]) * 1024
        top = max(need, key=lambda k: need[k][0])
        print(f"{label:78s} {est / GIB:8.2f} G {rss / GIB:8.2f} G {est / rss:6.2f}   (largest term: {top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
