"""Speed benchmarks: ours against a named peer, run in the same process, reported as a ratio.

Each function returns a dict of plain numbers; `cli.py` prints them. Nothing here
asserts a speed: tests only check that the benchmarks run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .config import HMMConfig
from .hmm import HMM, make_hmm


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up call (the least noisy estimate)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_hmm(n_states: int = 128, n_tokens: int = 16, rank: int = 8, seed: int = 0) -> HMM:
    """The benchmark HMM: one sticky low-rank task at the paper's size."""
    return make_hmm(HMMConfig(n_tasks=1, n_states=n_states, n_tokens=n_tokens, rank=rank, seed=seed))


def _hmmlearn_model(hmm: HMM):
    try:
        from hmmlearn.hmm import CategoricalHMM
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
    t_ours = _best_time(lambda: hmm.sample(n_seqs, length, seed=1), repeats)
    t_peer = _best_time(lambda: peer.sample(peer_length, random_state=1), repeats)
    ours, theirs = n_seqs * length / t_ours, peer_length / t_peer
    return {"ours_tokens_per_s": ours, "hmmlearn_tokens_per_s": theirs, "ratio": ours / theirs}


def gemm_rate(m: int, k: int, n: int, dtype=None, device="cpu", repeats: int = 20) -> float:
    """Measured FLOP/s of one (m, k) x (k, n) matmul (out= a preallocated buffer), best of `repeats`."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.rand(shape, generator=g).to(dev, dtype) for shape in ((m, k), (k, n)))
    out = torch.empty((m, n), dtype=dtype, device=dev)

    def run():
        torch.mm(a, b, out=out)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return 2 * m * k * n / _best_time(run, repeats)


def bench_filter(n_seqs: int = 4096, length: int = 256, peer_length: int = 20000, repeats: int = 3,
                 **hmm_kw) -> dict[str, float]:
    """Filter tokens/s, side by side, in one process, on one HMM (128 states, 16 tokens, rank 8 by default).

    - dense: the public ``predictive(HMM(mu, T, O), tokens)`` (batched scaled forward, S x S per step),
      float32 and float64, vs hmmlearn's CategoricalHMM.score on the same dense HMM, both of its
      implementations ("log", its default, and "scaling");
    - low-rank: ``predictive`` on the same HMM given as its rank-d factors T = W Q, vs the dense path;
    - limits: the fp32 GEMM rate of each path's per-step product, measured here: (chunk, S) x (S, S)
      for dense (2 S^2 FLOPs per token, as counted in the issue; the step also carries the V prediction
      columns, (S, S + V)), and (n, d) x (d, V d + V) for low-rank.
    """
    import torch

    from .inference import DENSE_CHUNK, predictive

    hmm = bench_hmm(**hmm_kw)
    dense = HMM(hmm.initial, hmm.transition, hmm.emission)
    S, V, d = hmm.n_states, hmm.n_tokens, hmm.rank
    peer = _hmmlearn_model(hmm)
    tokens, _ = hmm.sample(n_seqs, length, seed=2)
    n_tok = n_seqs * length
    out: dict[str, float] = {"n_states": S, "n_tokens": V, "rank": d, "threads": torch.get_num_threads()}
    preds = {}
    for name, h, dt in (("dense_f32", dense, torch.float32), ("dense_f64", dense, torch.float64),
                        ("lowrank_f32", hmm, torch.float32)):
        preds[name] = predictive(h, tokens, dtype=dt)
        out[f"{name}_tokens_per_s"] = n_tok / _best_time(lambda h=h, dt=dt: predictive(h, tokens, dtype=dt), repeats)
    out["f32_vs_f64_max_abs"] = float(np.abs(preds["dense_f32"] - preds["dense_f64"]).max())
    out["lowrank_vs_dense_max_abs"] = float(np.abs(preds["lowrank_f32"] - preds["dense_f64"]).max())
    x, _ = hmm.sample(1, peer_length, seed=3)
    X = x.reshape(-1, 1)
    for impl in ("log", "scaling"):
        peer.implementation = impl
        out[f"hmmlearn_{impl}_tokens_per_s"] = peer_length / _best_time(lambda: peer.score(X), repeats)
    ours = out["dense_f32_tokens_per_s"]
    out["ratio_log"] = ours / out["hmmlearn_log_tokens_per_s"]
    out["ratio_scaling"] = ours / out["hmmlearn_scaling_tokens_per_s"]
    out["ratio_lowrank_dense"] = out["lowrank_f32_tokens_per_s"] / ours
    chunk = min(DENSE_CHUNK, n_seqs)
    out["gemm_dense_flops"] = gemm_rate(chunk, S, S)
    out["gemm_dense_step_flops"] = gemm_rate(chunk, S, S + V)
    out["dense_flops"] = ours * 2 * S * S
    out["dense_frac_gemm"] = out["dense_flops"] / out["gemm_dense_flops"]
    out["dense_frac_gemm_step"] = ours * 2 * S * (S + V) / out["gemm_dense_step_flops"]
    out["gemm_lowrank_flops"] = gemm_rate(n_seqs, d, V * d + V)
    out["lowrank_flops"] = out["lowrank_f32_tokens_per_s"] * 2 * d * (V * d + V)
    out["lowrank_frac_gemm"] = out["lowrank_flops"] / out["gemm_lowrank_flops"]
    return out


def bench_paper_dataset() -> dict[str, float]:
    """Wall time to draw the paper-scale mixture and all 131,072 training episodes."""
    from .config import preset
    from .episodes import sample_episodes
    from .hmm import make_mixture

    cfg = preset("paper")
    t0 = time.perf_counter()
    mix = make_mixture(cfg.hmm, dtype=np.float32)
    t1 = time.perf_counter()
    ep = sample_episodes(mix, cfg.data, cfg.data.n_train, split="train")
    t2 = time.perf_counter()
    return {"mixture_s": t1 - t0, "episodes_s": t2 - t1, "total_s": t2 - t0,
            "episodes": float(len(ep)), "tokens": float(ep.tokens.size)}


# ---------------------------------------------------------------- training throughput

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "V100": 125e12}


def _peak_flops(device) -> tuple[float | None, str]:
    """Dense peak FLOP/s for MFU: the datasheet bf16 figure on known GPUs, else a measured fp32 GEMM."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, val in PEAK_BF16_FLOPS.items():
            if key in name:
                return val, f"{name} bf16 datasheet peak"
        return None, f"{name}: unknown peak"
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = _best_time(lambda: a @ b, 5)
    return 2 * n ** 3 / t, "measured fp32 1024^3 GEMM on this CPU"


def _step_time(loss_fn, opt, steps: int, device, autocast) -> float:
    """Seconds per training step (forward, backward, optimizer) of `loss_fn`, best of two runs."""
    import torch

    def run():
        for _ in range(steps):
            with autocast:
                loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return _best_time(run, 2) / steps


def bench_train(cfg, device: str = "auto", batch_size: int = 32, seq_len: int = 256, steps: int = 5,
                peer: bool = True) -> dict[str, Any]:
    """Tokens/s and MFU of one training step (forward, backward, AdamW) for `cfg.model`, vs HF RoFormer.

    The peer is transformers' RoFormerForCausalLM at the same shape (layers, heads, width, MLP,
    vocabulary, batch, sequence), trained with the same AdamW step in the same process.
    """
    import contextlib

    import torch

    from .model import Transformer
    from .train import resolve_device

    dev = resolve_device(device)
    vocab = cfg.hmm.n_tokens + 1
    m = dataclasses.replace(cfg.model, max_len=max(cfg.model.max_len, seq_len))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(dev)
    y = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(dev)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    ours = Transformer(m, vocab).to(dev)
    opt = ours.configure_optimizers(0.1, 1e-4, (0.9, 0.95))
    t_ours = _step_time(lambda: ours(x, y)[1], opt, steps, dev, autocast)
    tokens = batch_size * seq_len
    peak, peak_what = _peak_flops(dev)
    flops = ours.flops_per_token(seq_len) * tokens / t_ours
    shape = f"{m.n_layers} layers x {m.d_model} x {m.n_heads} heads, batch {batch_size} x {seq_len}"
    out: dict[str, Any] = {"device": str(dev), "shape": shape,
                           "ours_tokens_per_s": tokens / t_ours, "ours_tflops": flops / 1e12,
                           "mfu": flops / peak if peak else None, "peak": peak_what}
    if peer:
        try:
            from transformers import RoFormerConfig, RoFormerForCausalLM
        except ImportError:
            raise ValueError("the peer needs transformers: pip install -e '.[test]'") from None
        hf_cfg = RoFormerConfig(vocab_size=vocab, embedding_size=m.d_model, hidden_size=m.d_model,
                                num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                                intermediate_size=m.d_mlp, max_position_embeddings=m.max_len, is_decoder=True,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        hf = RoFormerForCausalLM(hf_cfg).to(dev)
        hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.1)
        t_peer = _step_time(lambda: hf(input_ids=x, labels=y).loss, hf_opt, steps, dev, autocast)
        out.update({"hf_roformer_tokens_per_s": tokens / t_peer, "ratio": t_peer / t_ours})
    return out
