"""Wall time of the probes' fits at the paper's width, without a trained model (the planning figure in README.md).

Stand-in residuals (token embedding + noise seeded per layer and batch, D = 1024) for `n_layers` layers of the
paper preset's episodes; run_probes as the analysis runs it (single-threaded lbfgs, 32 positions per episode,
belief ridge), once per value of N_JOBS on the same input: the wall times, and a check that every n_jobs gives
the same numbers. EPISODES: N = N eval episodes, or TxM = the probe episodes of `hmmscope analyze --probe-tasks T
--min-per-task M` (T tasks, M each; at the default 32x30 the analysis probes 960 episodes).
Usage: python analysis/gpu/probe_cost.py [EPISODES=128] [KS=1,2,3] [N_LAYERS=2] [N_JOBS=1 (comma-separated)]

The device stand-in (issue 19: the layerwise analysis of one 16-layer x 1024 run in <= 120 s on 16 cores + an H100):
  python analysis/gpu/probe_cost.py predict [EPISODES=32x30] [KS=1,2,3] [MEASURED_LAYERS=1] [JOBS=16]
      [CORE_RATIO=1.0] [GPU_TFLOPS=50]
measures every phase of run_probes here, one process, one BLAS thread, in CPU seconds (time.process_time: not
inflated by other jobs on a shared machine): the mixture and probe episodes; the belief targets; per layer, the
stand-in residuals and the fits; the statistics. It predicts the device's wall time per phase with this model
(an ESTIMATE, not a measurement):
  data, belief, statistics: CPU s here / CORE_RATIO (the device core's speed relative to this one's; 1.0 unless
      measured: the device runs each on one core);
  residuals: the paper model's forward on the GPU, 2 x 201 M parameters x tokens / GPU_TFLOPS (fp32 forward,
      default 50 TFLOP/s, about 3/4 of an H100's fp32 peak; the probe episodes' full 357 tokens), plus the
      measured stand-in's copy-out cost here;
  fits: max(ceil(17 / JOBS), 17 / 16) rounds of the per-layer CPU s / CORE_RATIO (17 residual layers, each fitted on one core
      in one of JOBS worker processes; + 5 s to spawn the workers, which import sklearn), overlapping the
      residuals (the main process collects the next layers while the workers fit).
"""

import json
import os
import sys
import time

DEVICE_CORES = 16


def main(episodes: str = "128", ks: tuple[int, ...] = (1, 2, 3), n_layers: int = 2, jobs: tuple[int, ...] = (1,)) -> None:
    import numpy as np  # here, not at the top: run_probes' spawned workers import this module, and need none of it
    import torch

    from hmmscope.config import preset
    from hmmscope.data.episodes import probe_episodes, sample_episodes
    from hmmscope.data.hmm import make_mixture
    from hmmscope.measure.probes import run_probes

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


def predict(episodes: str = "32x30", ks: tuple[int, ...] = (1, 2, 3), measured: int = 1, jobs: int = 16,
            core_ratio: float = 1.0, gpu_tflops: float = 50.0) -> None:
    import math

    import numpy as np
    import torch

    from hmmscope.config import model_params, preset
    from hmmscope.data.episodes import probe_episodes
    from hmmscope.data.hmm import make_mixture
    from hmmscope.measure.probes import run_probes

    torch.set_num_threads(1)
    cfg = preset("paper")
    n_tasks, per_task = (int(v) for v in episodes.split("x"))
    c0, w0 = time.process_time(), time.perf_counter()
    mix = make_mixture(cfg.hmm)
    ep = probe_episodes(mix, cfg.data, n_tasks, per_task)
    emb = np.random.default_rng(0).standard_normal((cfg.hmm.n_tokens + 1, cfg.model.d_model)).astype(np.float32)
    data_cpu, data_wall = time.process_time() - c0, time.perf_counter() - w0

    def residual(tok, layer, idx):  # (B, T) -> (B, T, D): the same stand-in as main()
        noise = np.random.default_rng([layer, int(idx[0])]).standard_normal((*tok.shape, emb.shape[1]))
        return torch.from_numpy(emb[tok.numpy()] + 0.5 * noise.astype(np.float32))

    marks = [(time.process_time(), time.perf_counter(), "start")]
    run_probes(residual, mix, ep, ks=ks, n_layers=measured, max_tasks=n_tasks, n_jobs=1,
               progress=lambda m: (marks.append((time.process_time(), time.perf_counter(), m)),
                                   print(f"  {marks[-1][1] - marks[0][1]:6.1f} s wall, "
                                         f"{marks[-1][0] - marks[0][0]:6.1f} s CPU  {m}", flush=True)))
    cpu = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
    belief_cpu, layer_cpu, stats_cpu = cpu[0], cpu[1:1 + measured], cpu[1 + measured]
    per_layer = sum(layer_cpu) / measured
    n_layers = cfg.model.n_layers + 1
    N, T = len(ep), ep.tokens.shape[1]
    flops = 2 * model_params(cfg.model, cfg.hmm.n_tokens + 1) * N * T
    gpu_s = flops / (gpu_tflops * 1e12)
    rounds = max(math.ceil(n_layers / jobs), n_layers / DEVICE_CORES)  # JOBS > 16 share the 16 cores
    fits_s = rounds * per_layer / core_ratio + 5.0
    pred = {"data (mixture + probe episodes)": data_cpu / core_ratio, "belief targets": belief_cpu / core_ratio,
            "residuals (GPU forward, ESTIMATE)": gpu_s, f"fits ({rounds:.2f} rounds, {jobs} processes)": fits_s,
            "statistics": stats_cpu / core_ratio}
    print(f"measured here: {N} probe episodes ({episodes}) x 32 positions, ks={ks}, {measured} layer(s); "
          f"load average {os.getloadavg()[0]:.1f}; data {data_cpu:.1f} s CPU ({data_wall:.1f} s wall), belief "
          f"{belief_cpu:.1f} s, per layer {per_layer:.1f} s CPU (residual stand-in + fits), statistics {stats_cpu:.1f} s")
    print(f"predicted on the device (an ESTIMATE: CORE_RATIO {core_ratio:g}, GPU {gpu_tflops:g} TFLOP/s fp32, "
          f"{n_layers} layers, {jobs} fit processes):")
    for k, v in pred.items():
        print(f"  {k:42s} {v:7.1f} s")
    total = pred["data (mixture + probe episodes)"] + pred["belief targets"] + max(fits_s, gpu_s) + pred["statistics"]
    print(f"  {'total (residuals overlap the fits)':42s} {total:7.1f} s   (target <= 120 s: "
          f"{'fits' if total <= 120 else 'does NOT fit'})")


if __name__ == "__main__":  # required: run_probes(n_jobs > 1) spawns workers that import this module
    a = sys.argv[1:]
    if a[:1] == ["predict"]:
        p = a[1:]
        predict(p[0] if p else "32x30", tuple(int(k) for k in p[1].split(",")) if len(p) > 1 else (1, 2, 3),
                int(p[2]) if len(p) > 2 else 1, int(p[3]) if len(p) > 3 else 16,
                float(p[4]) if len(p) > 4 else 1.0, float(p[5]) if len(p) > 5 else 50.0)
        sys.exit(0)
    main(a[0] if a else "128", tuple(int(k) for k in a[1].split(",")) if len(a) > 1 else (1, 2, 3),
         int(a[2]) if len(a) > 2 else 2, tuple(int(j) for j in a[3].split(",")) if len(a) > 3 else (1,))
