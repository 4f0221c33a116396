"""Wall time of the probes' fits at the paper's width, without a trained model (the planning figure in README.md).

Stand-in residuals (token embedding + noise seeded per layer and batch, D = 1024) for `n_layers` layers of the
paper preset's episodes; run_probes as the analysis runs it (single-threaded lbfgs, 32 positions per episode,
belief ridge), once per value of N_JOBS on the same input: the wall times, and a check that every n_jobs gives
the same numbers. EPISODES: N = N eval episodes, or TxM = the probe episodes of `hmmscope analyze --probe-tasks T
--min-per-task M` (T tasks, M each; at the default 32x30 the analysis probes 960 episodes).
Usage: python analysis/gpu/probe_cost.py [EPISODES=128] [KS=1,2,3] [N_LAYERS=2] [N_JOBS=1 (comma-separated)]
       python analysis/gpu/probe_cost.py predict-gpu [EPISODES=32x15] [KS=1,2,3] [LAYERS=1] [EVAL_MS=1] [SCALE=AxB]
           (issue 37's paths: `predict_gpu`, output in probe-cost-predict.txt)

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

    from hmmscope.checks import model_params
    from hmmscope.config import preset
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


# The second call of 2026-11-27 (analysis/results/paper-once-h100/RUN.md): measured on the H100, the basis of
# predict_gpu's fixed terms and of its fp32 rate.
H100_MEASURED = {"checkpoint_s": 16.0, "mixture_and_episodes_s": 2.0, "old_shuffle_s": 37.0}
PAPER_PARAMS = 201_411_584  # hmmscope.n_params of the paper model (run.json)


def predict_gpu(episodes: str = "32x15", ks: tuple[int, ...] = (1, 2, 3), measured: int = 1,
                eval_ms: float = 1.0, scale: str = "") -> float | None:
    """The analyze phase with issue 37's paths on the device, predicted from this CPU (an ESTIMATE, each term
    named): the shuffle test as one forward per batch and the probes' fits in torch on the GPU.

    fp32 rate: calibrated on the H100 from the second call's old shuffle test (37 s for 1 + 2 + ... + 16 = 136
    block passes per batch of 256 x 5 rows x 356 tokens, 2 x 201.4 M parameters per token: 42 TFLOP/s).
    shuffle: one forward per batch (16 block passes) at that rate. residuals: one forward of the probe episodes.
    fits: run_probes(fits="torch") on the stand-in residuals here for `measured` layers, counting its objective
    evaluations and their matmul FLOPs (torch_fits.STATS); on the device each evaluation costs eval_ms of kernel
    launches and host syncs (an ESTIMATE: an L-BFGS step with its strong-Wolfe line search is ~40 small kernels
    and a few syncs) plus its FLOPs at the fp32 rate; x 17 layers. scale "AxB": the probe set the FLOPs are
    scaled to when the measurement ran on a smaller one (the evaluation count kept: L-BFGS iterations are capped
    at max_iter = 100 and barely grow with rows)."""
    import math

    import numpy as np
    import torch

    from hmmscope.config import preset
    from hmmscope.data.episodes import probe_episodes
    from hmmscope.data.hmm import make_mixture
    from hmmscope.measure.probes import run_probes, torch_fits

    torch.set_num_threads(1)
    cfg = preset("paper")
    L, T = cfg.model.n_layers, cfg.data.n_demos * (cfg.data.l_demo + 1) + cfg.data.l_test - 1
    fwd_token = 2 * PAPER_PARAMS
    old_passes = sum(range(1, L + 1)) / L  # block passes of the old shuffle test, in full forwards
    rate = 256 * 5 * T * fwd_token * old_passes / H100_MEASURED["old_shuffle_s"]
    n_tasks, per_task = (int(v) for v in episodes.split("x"))
    mix = make_mixture(cfg.hmm)
    ep = probe_episodes(mix, cfg.data, n_tasks, per_task)
    emb = np.random.default_rng(0).standard_normal((cfg.hmm.n_tokens + 1, cfg.model.d_model)).astype(np.float32)

    def residual(tok, layer, idx):  # the same stand-in as main()
        noise = np.random.default_rng([layer, int(idx[0])]).standard_normal((*tok.shape, emb.shape[1]))
        return torch.from_numpy(emb[tok.numpy()] + 0.5 * noise.astype(np.float32))

    torch_fits.STATS.update(evals=0, flops=0.0)
    c0 = time.process_time()
    r = run_probes(residual, mix, ep, ks=ks, n_layers=measured, max_tasks=n_tasks, fits="torch", device="cpu",
                   progress=lambda m: print(f"  {time.process_time() - c0:7.1f} s CPU  {m}", flush=True))
    evals, flops = torch_fits.STATS["evals"] / measured, torch_fits.STATS["flops"] / measured
    if scale:
        a, b = (int(v) for v in scale.split("x"))
        flops *= a * b / (n_tasks * per_task)
    n_probe = (int(scale.split("x")[0]) * int(scale.split("x")[1])) if scale else len(ep)
    pred = {"checkpoint (M, 2nd call)": H100_MEASURED["checkpoint_s"],
            "mixture + eval episodes (M, 2nd call)": H100_MEASURED["mixture_and_episodes_s"],
            "shuffle: one forward per batch": 256 * 5 * T * fwd_token / rate,
            "probe residuals: one forward": n_probe * (T + 1) * fwd_token / rate,
            f"fits: {L + 1} layers x ({evals:.0f} evals x {eval_ms:g} ms + {flops / 1e9:.0f} GFLOP)":
                (L + 1) * (evals * eval_ms / 1e3 + flops / rate),
            "statistics, tables, figures (E)": 5.0}
    print(f"measured here: {len(ep)} probe episodes ({episodes}), ks={ks}, {measured} layer(s), torch fits on the CPU: "
          f"{r.meta['timings']['fits_s']:.1f} s of fits ({evals:.0f} objective evaluations, {flops / 1e9:.1f} GFLOP "
          f"per layer{' scaled to ' + scale if scale else ''}); fp32 rate {rate / 1e12:.0f} TFLOP/s (calibrated)")
    for k, v in pred.items():
        print(f"  {k:62s} {v:6.1f} s")
    total = sum(pred.values())
    print(f"  {'total':62s} {total:6.1f} s   (target <= 90 s: {'fits' if total <= 90 else 'does NOT fit'}; "
          f"shuffle target <= 10 s: {'fits' if pred['shuffle: one forward per batch'] <= 10 else 'does NOT fit'})")
    return None if math.isnan(total) else total


if __name__ == "__main__":  # required: run_probes(n_jobs > 1) spawns workers that import this module
    a = sys.argv[1:]
    if a[:1] == ["predict-gpu"]:
        p = a[1:]
        predict_gpu(p[0] if p else "32x15", tuple(int(k) for k in p[1].split(",")) if len(p) > 1 else (1, 2, 3),
                    int(p[2]) if len(p) > 2 else 1, float(p[3]) if len(p) > 3 else 1.0, p[4] if len(p) > 4 else "")
        sys.exit(0)
    if a[:1] == ["predict"]:
        p = a[1:]
        predict(p[0] if p else "32x30", tuple(int(k) for k in p[1].split(",")) if len(p) > 1 else (1, 2, 3),
                int(p[2]) if len(p) > 2 else 1, int(p[3]) if len(p) > 3 else 16,
                float(p[4]) if len(p) > 4 else 1.0, float(p[5]) if len(p) > 5 else 50.0)
        sys.exit(0)
    main(a[0] if a else "128", tuple(int(k) for k in a[1].split(",")) if len(a) > 1 else (1, 2, 3),
         int(a[2]) if len(a) > 2 else 2, tuple(int(j) for j in a[3].split(",")) if len(a) > 3 else (1,))
