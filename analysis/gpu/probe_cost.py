"""Wall time of the probes' fits at the paper's width, without a trained model (the planning figure in README.md).

Stand-in residuals (token embedding + noise, D = 1024) for `n_layers` layers of the paper preset's eval episodes;
run_probes as the analysis runs it (single-threaded lbfgs, 32 positions per episode, belief ridge).
Usage: python analysis/gpu/probe_cost.py [N_EPISODES=128] [KS=1,2,3] [N_LAYERS=2]
"""

import sys
import time

import numpy as np
import torch

from hmmscope.config import preset
from hmmscope.episodes import sample_episodes
from hmmscope.hmm import make_mixture
from hmmscope.probes import run_probes


def main(n_episodes: int = 128, ks: tuple[int, ...] = (1, 2, 3), n_layers: int = 2) -> None:
    torch.set_num_threads(1)
    cfg = preset("paper")
    t0 = time.perf_counter()
    mix = make_mixture(cfg.hmm)
    ep = sample_episodes(mix, cfg.data, n_episodes, "eval")
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((cfg.hmm.n_tokens + 1, cfg.model.d_model)).astype(np.float32)

    def residual(tok, layer, idx):  # (B, T) -> (B, T, D)
        x = emb[tok.numpy()] + 0.5 * rng.standard_normal((*tok.shape, emb.shape[1])).astype(np.float32)
        return torch.from_numpy(x)

    t1 = time.perf_counter()
    r = run_probes(residual, mix, ep, ks=ks, n_layers=n_layers)
    fits = r.meta["timings"]["fits_s"]
    print(f"mixture + {n_episodes} episodes: {t1 - t0:.1f} s; run_probes on {n_layers} layers, ks={ks}: "
          f"{time.perf_counter() - t1:.1f} s, of which fits {fits:.1f} s = {fits / n_layers:.1f} s per layer; "
          f"x {cfg.model.n_layers + 1} layers of the paper model = {fits / n_layers * (cfg.model.n_layers + 1):.0f} s")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]) if a else 128, tuple(int(k) for k in a[1].split(",")) if len(a) > 1 else (1, 2, 3),
         int(a[2]) if len(a) > 2 else 2)
