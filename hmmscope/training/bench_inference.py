"""Speed benchmarks of the data and the references against named peers, run in the same process, reported as a
ratio: sampling (hmmlearn), filtering and the mixture oracle (dense and low-rank GEMMs of the same shapes), the
paper-sized dataset, the counting baselines, headroom and the Bayes reference (the mixture oracle over family tasks).

Each function returns a dict of plain numbers; `cli/bench.py` prints them. Nothing here asserts a speed. Only imported
lazily (by `hmmscope bench`'s commands), so torch is imported at the top; the peers (hmmlearn) only where they run,
being optional (`.[test]`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from ..config import HMMConfig, preset
from ..data import episodes
from ..data.episodes import family_tasks, sample_episodes, truncate_demos, unseen_episodes
from ..data.hmm import HMM, make_hmm, make_mixture
from ..measure.evaluate import anonymous
from ..measure.headroom import headroom
from ..oracles import bayes, inference
from ..oracles.baselines import fit_counting, incontext_bigram, incontext_ctw, incontext_ngram
from ..oracles.bayes_structures import sticky_structures
from ..oracles.filtering import DENSE_CHUNK, predictive
from ..oracles.inference import mixture_oracle
from .bench import best_time, gemm_fn, interleaved_best


def bench_hmm(n_states: int = 128, n_tokens: int = 16, rank: int = 8, seed: int = 0) -> HMM:
    """The benchmark HMM: one sticky low-rank task at the paper's size."""
    return make_hmm(HMMConfig(n_tasks=1, n_states=n_states, n_tokens=n_tokens, rank=rank, seed=seed))


def _hmmlearn_model(hmm: HMM):
    try:
        from hmmlearn.hmm import CategoricalHMM  # lazy: hmmlearn (the peer, optional: .[test])
    except ImportError:
        raise ValueError("the peer hmmlearn is not installed: pip install -e '.[test]'") from None
    m = CategoricalHMM(n_components=hmm.n_states, n_features=hmm.n_tokens, init_params="", params="")
    m.startprob_, m.transmat_, m.emissionprob_ = hmm.initial, hmm.transition, hmm.emission
    return m


def bench_sample(n_seqs: int = 4096, length: int = 256, peer_length: int = 20000, repeats: int = 3,
                 **hmm_kw) -> dict[str, float]:
    """Tokens/s of `HMM.sample` (n_seqs x length) vs hmmlearn's CategoricalHMM.sample (one sequence)."""
    hmm = bench_hmm(**hmm_kw)
    peer = _hmmlearn_model(hmm)
    t_ours = best_time(lambda: hmm.sample(n_seqs, length, seed=1), repeats)
    t_peer = best_time(lambda: peer.sample(peer_length, random_state=1), repeats)
    ours, theirs = n_seqs * length / t_ours, peer_length / t_peer
    return {"ours_tokens_per_s": ours, "hmmlearn_tokens_per_s": theirs, "ratio": ours / theirs}


def bench_filter(n_seqs: int = 4096, length: int = 256, peer_length: int = 20000, repeats: int = 5,
                 **hmm_kw) -> dict[str, float]:
    """Filter tokens/s, side by side, in one process, on one HMM (128 states, 16 tokens, rank 8 by default).

    - dense: the public ``predictive(HMM(mu, T, O), tokens)`` (batched scaled forward, S x S per step),
      float32 and float64, vs hmmlearn's CategoricalHMM.score on the same dense HMM, both of its
      implementations ("log", its default, and "scaling");
    - low-rank: ``predictive`` on the same HMM given as its rank-d factors T = W Q, vs the dense path;
    - limits: the fp32 GEMM rate of each path's per-step product, measured here: (chunk, S) x (S, S)
      for dense (2 S^2 FLOPs per token; the step also carries the V prediction
      columns, (S, S + V)), and (n, d) x (d, V d + V) for low-rank.
    Every contender, the GEMM limits included, is timed in `repeats` interleaved rounds and keeps its
    best time, so load from other processes does not fall on one side of a ratio only.
    """
    hmm = bench_hmm(**hmm_kw)
    dense = HMM(hmm.initial, hmm.transition, hmm.emission)
    S, V, d = hmm.n_states, hmm.n_tokens, hmm.rank
    peer = _hmmlearn_model(hmm)
    tokens, _ = hmm.sample(n_seqs, length, seed=2)
    n_tok = n_seqs * length
    out: dict[str, float] = {"n_states": S, "n_tokens": V, "rank": d, "threads": torch.get_num_threads()}
    preds = {"dense_f32": predictive(dense, tokens, dtype=torch.float32),
             "dense_f64": predictive(dense, tokens, dtype=torch.float64),
             "lowrank_f32": predictive(hmm, tokens, dtype=torch.float32)}
    out["f32_vs_f64_max_abs"] = float(np.abs(preds["dense_f32"] - preds["dense_f64"]).max())
    out["lowrank_vs_dense_max_abs"] = float(np.abs(preds["lowrank_f32"] - preds["dense_f64"]).max())
    x, _ = hmm.sample(1, peer_length, seed=3)
    X = x.reshape(-1, 1)

    def peer_score(impl: str):
        def run():
            peer.implementation = impl
            peer.score(X)
        return run

    chunk = min(DENSE_CHUNK, n_seqs)
    calls = -(-n_seqs // chunk) * length  # the dense path's GEMM count
    fns = {"dense_f32": lambda: predictive(dense, tokens, dtype=torch.float32),
           "dense_f64": lambda: predictive(dense, tokens, dtype=torch.float64),
           "lowrank_f32": lambda: predictive(hmm, tokens, dtype=torch.float32),
           "hmmlearn_log": peer_score("log"), "hmmlearn_scaling": peer_score("scaling"),
           "gemm_dense": gemm_fn(chunk, S, S, calls=calls), "gemm_dense_step": gemm_fn(chunk, S, S + V, calls=calls),
           "gemm_lowrank": gemm_fn(n_seqs, d, V * d + V, calls=length)}
    t = interleaved_best(fns, repeats)
    out["rounds"] = repeats
    for name in ("dense_f32", "dense_f64", "lowrank_f32"):
        out[f"{name}_tokens_per_s"] = n_tok / t[name]
    for impl in ("log", "scaling"):
        out[f"hmmlearn_{impl}_tokens_per_s"] = peer_length / t[f"hmmlearn_{impl}"]
    ours = out["dense_f32_tokens_per_s"]
    out["ratio_log"] = ours / out["hmmlearn_log_tokens_per_s"]
    out["ratio_scaling"] = ours / out["hmmlearn_scaling_tokens_per_s"]
    out["ratio_lowrank_dense"] = out["lowrank_f32_tokens_per_s"] / ours
    out["gemm_dense_flops"] = 2 * chunk * S * S * calls / t["gemm_dense"]
    out["gemm_dense_step_flops"] = 2 * chunk * S * (S + V) * calls / t["gemm_dense_step"]
    out["dense_flops"] = ours * 2 * S * S
    out["dense_frac_gemm"] = out["dense_flops"] / out["gemm_dense_flops"]
    out["dense_frac_gemm_step"] = ours * 2 * S * (S + V) / out["gemm_dense_step_flops"]
    out["gemm_lowrank_flops"] = 2 * n_seqs * d * (V * d + V) * length / t["gemm_lowrank"]
    out["lowrank_flops"] = out["lowrank_f32_tokens_per_s"] * 2 * d * (V * d + V)
    out["lowrank_frac_gemm"] = out["lowrank_flops"] / out["gemm_lowrank_flops"]
    return out


def bench_oracle(n_tasks=(512, 2048, 8192), n_episodes: int = 16, dtype: str = "float64", torch_peer: bool = True,
                 full_episodes: int = 1024, device: str = "cpu", chunks=(None,)) -> dict[str, Any]:
    """Mixture-oracle wall time at the paper's shape (128 states, 16 tokens, rank 8, 358-token episodes)
    for each n_tasks, on `n_episodes` held-out episodes.

    CPU: `full_episodes` scales the per-episode part linearly to the paper's evaluation set (the per-task
    tables, timed apart, are paid once): an extrapolation, labelled so. With torch_peer, the smallest
    n_tasks is also timed on the torch path (the one CUDA runs) on the first 4 of the same episodes.
    CUDA: the torch path on all `n_episodes` (set it to 1024 to time the evaluation set itself, not an
    extrapolation), once per chunk size in `chunks` (None: inference.cuda_chunk's choice), after a warm-up
    call; each timing ends with a device synchronize. Its rows also give the largest difference from the
    CPU kernel on the first 2 episodes (same mixture, same dtype)."""
    cfg = preset("paper")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    dev = torch.device(device)
    rows = []
    for n in n_tasks:
        mix = make_mixture(dataclasses.replace(cfg.hmm, n_tasks=n), dtype=np.float32)
        ep = sample_episodes(mix, cfg.data, n_episodes, split="eval")
        if dev.type == "cuda":
            rows += _oracle_cuda_rows(mix, ep, dt, dev, chunks, full_episodes)
            continue
        inference.mixture_oracle(mix, ep.subset(slice(0, 1)), posterior_at="test_start", dtype=dt)  # load / warm up
        t0, c0 = time.perf_counter(), time.process_time()
        inference.mixture_oracle(mix, ep, posterior_at="test_start", dtype=dt)
        s, cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()  # the per-task tables alone: paid once, not per episode
        for lo in range(0, n, 1024):
            mu, W, Q, O = inference.task_params(mix, np.arange(lo, min(lo + 1024, n)), dt, "cpu")
            inference.step_tables(mu, W, Q, O, None)
        tab, tab_cpu = time.perf_counter() - t0, time.process_time() - c0
        row = {"n_tasks": n, "seconds": s, "cpu_seconds": cpu, "tables_s": tab, "tables_cpu_s": tab_cpu,
               "ns_per_task_token": (s - tab) / (n * n_episodes * ep.tokens.shape[1]) * 1e9,
               "extrapolated_full_s": tab + (s - tab) * full_episodes / n_episodes,
               "extrapolated_full_cpu_s": tab_cpu + (cpu - tab_cpu) * full_episodes / n_episodes}
        if torch_peer and n == min(n_tasks):  # the torch path on the first few of the same episodes
            k = min(4, n_episodes)
            saved, inference.numba_kernel = inference.numba_kernel, lambda: None
            try:
                t0 = time.perf_counter()
                inference.mixture_oracle(mix, ep.subset(slice(0, k)), posterior_at="test_start", dtype=dt)
                row["torch_path_s_per_episode"] = (time.perf_counter() - t0) / k
            finally:
                inference.numba_kernel = saved
            row["torch_path_ratio"] = row["torch_path_s_per_episode"] / (s / n_episodes)
        rows.append(row)
    if dev.type == "cuda":
        kernel = f"torch path on {torch.cuda.get_device_name(dev)}"
    else:
        kernel = "numba kernel" if inference.numba_kernel() is not None else "torch path (numba not installed)"
    return {"rows": rows, "n_episodes": n_episodes, "dtype": dtype, "path": kernel, "device": str(dev),
            "threads": torch.get_num_threads()}


def _oracle_cuda_rows(mix, ep, dt, dev, chunks, full_episodes: int) -> list[dict[str, Any]]:


    n, N, T = mix.n_tasks, len(ep), ep.tokens.shape[1]
    ref, _ = inference.mixture_oracle(mix, ep.subset(slice(0, 2)), posterior_at="test_start", dtype=dt)  # CPU
    rows = []
    for c in chunks:
        chunk = c if c is not None else inference.cuda_chunk(n, N, mix.n_tokens, mix.rank, dt, dev)
        got, _ = inference.mixture_oracle(mix, ep.subset(slice(0, 2)), posterior_at="test_start", dtype=dt,
                                          device=dev, chunk_tasks=chunk)  # warm-up, and the check against the CPU
        diff = float(torch.nan_to_num(got.cpu() - ref, nan=0.0).abs().max())
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        inference.mixture_oracle(mix, ep, posterior_at="test_start", dtype=dt, device=dev, chunk_tasks=chunk)
        torch.cuda.synchronize(dev)
        s = time.perf_counter() - t0
        rows.append({"n_tasks": n, "chunk_tasks": chunk, "auto_chunk": c is None, "seconds": s,
                     "ns_per_task_token": s / (n * N * T) * 1e9, "peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30,
                     "full_s": s * full_episodes / N, "measured_full": N == full_episodes, "max_abs_vs_cpu": diff})
    return rows


def bench_paper_dataset() -> dict[str, float]:
    """Wall time to draw the paper-scale mixture and all 131,072 training episodes."""
    cfg = preset("paper")
    t0 = time.perf_counter()
    mix = make_mixture(cfg.hmm, dtype=np.float32)
    t1 = time.perf_counter()
    ep = sample_episodes(mix, cfg.data, cfg.data.n_train, split="train")
    t2 = time.perf_counter()
    return {"mixture_s": t1 - t0, "episodes_s": t2 - t1, "total_s": t2 - t0,
            "episodes": float(len(ep)), "tokens": float(ep.tokens.size)}


def bench_counting(n_episodes: int = 1024, rounds: int = 3, fit_episodes: int = 512) -> dict[str, Any]:
    """The fair counting baselines (oracles/baselines.py) against the add-one bigram, their named peer, on the same
    episodes in the same process (interleaved rounds, best of each).

    Predictors: incontext_ngram (order 3) and incontext_ctw (depth 3) on n_episodes episodes at the paper's
    shape (V = 16, 6 demos x 48 + 64 test tokens, 358 positions), each as a time and a ratio to
    incontext_bigram on the same episodes. The fit: fit_counting over its full grid (8 alphas x orders 1-3 x
    depths 1-3) at k = 0..4 on fit_episodes episodes of the `tiny` shape (V = 8, 4 x 24 + 32), against the
    bigram on the same 5 truncations."""
    paper = preset("paper")
    mix = make_mixture(dataclasses.replace(paper.hmm, n_tasks=64), dtype=np.float32)
    ep = sample_episodes(mix, paper.data, n_episodes, split="eval")
    t = interleaved_best({"bigram": lambda: incontext_bigram(ep), "ngram": lambda: incontext_ngram(ep, 3, 0.25),
                           "ctw": lambda: incontext_ctw(ep, 3, 0.5)}, rounds)
    tiny = preset("tiny")
    fit_ep = sample_episodes(make_mixture(dataclasses.replace(tiny.hmm, n_tasks=64)), tiny.data, fit_episodes, "fit")
    cuts = [truncate_demos(fit_ep, k) for k in range(tiny.data.n_demos + 1)]
    f = interleaved_best({"fit": lambda: fit_counting(fit_ep, range(tiny.data.n_demos + 1)),
                           "bigram": lambda: [incontext_bigram(e) for e in cuts]}, rounds)
    return {"n_episodes": n_episodes, "seq_len": ep.seq_len, "n_tokens": ep.n_tokens, "bigram_s": t["bigram"],
            "ngram_s": t["ngram"], "ctw_s": t["ctw"], "ngram_ratio": t["ngram"] / t["bigram"],
            "ctw_ratio": t["ctw"] / t["bigram"], "fit_episodes": fit_episodes, "fit_s": f["fit"],
            "fit_bigram_s": f["bigram"], "fit_ratio": f["fit"] / f["bigram"], "rounds": rounds}


def bench_headroom(cfg, n_episodes: int = 256, family_tasks: int | None = None, em: bool = False,
                   repeats: int = 2) -> dict[str, float]:
    """`headroom.headroom` (SCIENCE.md 9) against its own dominant piece of work, the peer: one mixture-oracle pass
    over the same M family tasks on the same unseen episodes at k = k_max (inference.mixture_oracle). The ratio says
    how many such passes a whole headroom costs (it runs (k_max + 1) x (1 + 1/2 + 1/4) of them, the counting grid on
    the fit episodes and, with em, the EM fits). Best of `repeats` after a warm-up, interleaved."""
    M = int(cfg.eval.family_tasks if family_tasks is None else family_tasks)
    fam = episodes.family_tasks(cfg.hmm, cfg.data, M)
    _, uep = unseen_episodes(cfg.hmm, cfg.data, n_episodes)
    anon = anonymous(uep)
    last = {}

    def ours():
        last["r"] = headroom(cfg, n_episodes=n_episodes, family_tasks=M, em=em)

    best = interleaved_best({"headroom": ours, "oracle": lambda: mixture_oracle(fam, anon, dtype=torch.float64)},
                             repeats)
    r = last["r"]
    return {"headroom_s": best["headroom"], "oracle_pass_s": best["oracle"], "ratio": best["headroom"] / best["oracle"],
            "references_s": r.meta["references_s"], "family_tasks": M, "n_episodes": n_episodes,
            "k_max": r.k_max, "room": r.at()["room"]}


def bench_bayes(cfg, n_episodes: int = 512, peer_tasks: int = 4096) -> dict[str, Any]:
    """The Bayes reference (oracles/bayes.py) on cfg's first `n_episodes` unseen episodes at k = n_demos, to
    convergence (eval.bayes_tol), computed afresh (no cache), timed in CPU seconds of this process (one thread) and
    wall seconds; beside it, in the same process on the same episodes, its peer: the mixture oracle over
    `peer_tasks` family tasks (family_bayes at M = peer_tasks, the reference it replaces). Rates per (hypothesis or
    task, episode, token) compare the two kernels' work."""
    _, ep = unseen_episodes(cfg.hmm, cfg.data, n_episodes)
    bayes.bayes_oracle(cfg.hmm, ep.subset(slice(0, 2)), cache=False, k_max=8)  # compile / load the kernel
    t0, c0 = time.perf_counter(), time.process_time()
    r = bayes.bayes_oracle(cfg.hmm, ep, tol=cfg.eval.bayes_tol, seed=cfg.data.seed, cache=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = sticky_structures(cfg.hmm)
    fam = family_tasks(cfg.hmm, cfg.data, peer_tasks)
    anon = dataclasses.replace(ep, task_ids=np.full(len(ep), -1, np.int64))
    inference.mixture_oracle(fam, anon.subset(slice(0, 1)), dtype=torch.float64)  # warm up
    t0, c0 = time.perf_counter(), time.process_time()
    inference.mixture_oracle(fam, anon, dtype=torch.float64)
    pwall, pcpu = time.perf_counter() - t0, time.process_time() - c0
    T = int((np.asarray(ep.segment) >= 0).sum())
    hyps = st.n_orbits * max(r.n_draws, 1)
    return {"n_episodes": n_episodes, "ce": r.ce, "mc_se": r.mc_se, "n_draws": r.n_draws, "converged": r.converged,
            "history": r.history, "orbits": st.n_orbits, "structures": st.n_structures, "cpu_s": cpu, "wall_s": wall,
            "peer_tasks": peer_tasks, "peer_cpu_s": pcpu, "peer_wall_s": pwall, "ratio_cpu": cpu / pcpu,
            "ns_per_hyp_token": cpu / (hyps * n_episodes * T) * 1e9,
            "peer_ns_per_task_token": pcpu / (peer_tasks * n_episodes * T) * 1e9,
            "threads": torch.get_num_threads(), "tol": cfg.eval.bayes_tol}
