"""Wall time of the probes' fits at the paper's width, without a trained model (the planning figure in README.md).

Stand-in residuals (token embedding + noise seeded per layer and batch, D = 1024) for `n_layers` layers of the
paper preset's episodes; run_probes as the analysis runs it (single-threaded lbfgs, 32 positions per episode,
belief ridge), once per value of N_JOBS on the same input: the wall times, and a check that every n_jobs gives
the same numbers. EPISODES: N = N eval episodes, or TxM = the probe episodes of `hmmscope analyze --probe-tasks T
--min-per-task M` (T tasks, M each; at the default 32x30 the analysis probes 960 episodes).
Usage: python analysis/gpu/probe_cost.py [EPISODES=128] [KS=1,2,3] [N_LAYERS=2] [N_JOBS=1 (comma-separated)]
"""

import json
import os
import sys
import time


def main(episodes: str = "128", ks: tuple[int, ...] = (1, 2, 3), n_layers: int = 2, jobs: tuple[int, ...] = (1,)) -> None:
    import numpy as np  # here, not at the top: run_probes' spawned workers import this module, and need none of it
    import torch

    from hmmscope.config import preset
    from hmmscope.episodes import probe_episodes, sample_episodes
    from hmmscope.hmm import make_mixture
    from hmmscope.probes import run_probes

    torch.set_num_threads(1)
    cfg = preset("paper")
    t0 = time.perf_counter()
    mix = make_mixture(cfg.hmm)
    if "x" in episodes:
        n_tasks, per_task = (int(v) for v in episodes.split("x"))
        ep, max_tasks = probe_episodes(mix, cfg.data, n_tasks, per_task), n_tasks
    else:
        ep, max_tasks = sample_episodes(mix, cfg.data, int(episodes), "eval"), 32
    emb = np.random.default_rng(0).standard_normal((cfg.hmm.n_tokens + 1, cfg.model.d_model)).astype(np.float32)

    def residual(tok, layer, idx):  # (B, T) -> (B, T, D), the same at every call
        noise = np.random.default_rng([layer, int(idx[0])]).standard_normal((*tok.shape, emb.shape[1]))
        return torch.from_numpy(emb[tok.numpy()] + 0.5 * noise.astype(np.float32))

    t1 = time.perf_counter()
    print(f"mixture + {len(ep)} episodes: {t1 - t0:.1f} s; run_probes on {n_layers} layers, ks={ks}, "
          f"{max_tasks} tasks probed")
    walls, numbers = {}, {}
    for n_jobs in jobs:
        load = os.getloadavg()[0]
        t = time.perf_counter()
        r = run_probes(residual, mix, ep, ks=ks, n_layers=n_layers, max_tasks=max_tasks, n_jobs=n_jobs,
                       progress=lambda m, t=t: print(f"  {time.perf_counter() - t:5.1f} s  {m}", flush=True))
        walls[n_jobs] = time.perf_counter() - t
        d = r.to_dict()
        del d["meta"]["timings"], d["meta"]["n_jobs"]
        numbers[n_jobs] = json.dumps(d, sort_keys=True)
        fits, res_s = r.meta["timings"]["fits_s"], r.meta["timings"]["residuals_s"]
        print(f"n_jobs {n_jobs}: {walls[n_jobs]:.1f} s wall (load average {load:.1f} -> {os.getloadavg()[0]:.1f}), "
              f"residuals {res_s:.1f} s, fits {fits:.1f} s summed = {fits / n_layers:.1f} s per layer; "
              f"x {cfg.model.n_layers + 1} layers of the paper model = {fits / n_layers * (cfg.model.n_layers + 1):.0f} s")
    base = jobs[0]
    for n_jobs in jobs[1:]:
        print(f"n_jobs {n_jobs} vs {base}: wall ratio {walls[base] / walls[n_jobs]:.2f}x; the same numbers: "
              f"{numbers[n_jobs] == numbers[base]}")


if __name__ == "__main__":  # required: run_probes(n_jobs > 1) spawns workers that import this module
    a = sys.argv[1:]
    main(a[0] if a else "128", tuple(int(k) for k in a[1].split(",")) if len(a) > 1 else (1, 2, 3),
         int(a[2]) if len(a) > 2 else 2, tuple(int(j) for j in a[3].split(",")) if len(a) > 3 else (1,))
