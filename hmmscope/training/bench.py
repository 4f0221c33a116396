"""Speed benchmarks: ours against a named peer, run in the same process, reported as a ratio; this module: the
training step (`bench_train`: tokens/s, model FLOPs utilization against a GEMM measured in the same run, the Hugging
Face RoFormer as the peer) and the timing helpers every benchmark shares (`best_time`, `interleaved_best`, GEMM
rates). The data and inference benchmarks (sampling, filtering, the oracles, counting, headroom, Bayes):
`bench_inference`.

Each function returns a dict of plain numbers; `cli/bench.py` prints them. Nothing here
asserts a speed: tests only check that the benchmarks run. Only imported lazily (by `hmmscope bench`'s commands), so
torch is imported at the top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..model.transformer import Transformer
from .train import batch_indices, resolve_device


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up call (the least noisy estimate)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_best(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best wall time of each callable over `rounds` rounds, the callables taking turns within a round
    (after one warm-up call each): a burst of load from other processes then hits every contender
    alike instead of one of them, so ratios between them hold on a shared machine."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def gemm_fn(m: int, k: int, n: int, dtype=None, device="cpu", calls: int = 20) -> Callable[[], None]:
    """`calls` back-to-back (m, k) x (k, n) matmuls into a preallocated buffer (2 m k n calls FLOPs)."""
    dtype = torch.float32 if dtype is None else dtype
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.rand(shape, generator=g).to(dev, dtype) for shape in ((m, k), (k, n)))
    out = torch.empty((m, n), dtype=dtype, device=dev)

    def run():
        for _ in range(calls):
            torch.mm(a, b, out=out)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return run


def gemm_rate(m: int, k: int, n: int, dtype=None, device="cpu", repeats: int = 3, calls: int = 20) -> float:
    """Measured FLOP/s of `calls` back-to-back (m, k) x (k, n) matmuls into a preallocated buffer, best of
    `repeats` (give `calls` the number of products the measured path runs, so both see the same load)."""
    return 2 * m * k * n * calls / best_time(gemm_fn(m, k, n, dtype, device, calls), repeats)


LARGE_GEMM = 2048  # the MFU denominator's large square GEMM (n, n) x (n, n): the machine's matmul limit


def mfu_denominator(m: int, k: int, n: int, dtype, device, calls: int = 20) -> tuple[float, str, dict[str, float]]:
    """The matmul rate MFU is measured against: the best of the model's own GEMM shape (m, k) x (k, n), timed as
    gemm_rate with `calls` products, and a large square GEMM of LARGE_GEMM (timed with 20 products on a GPU, 2 on a
    CPU: about a second there), both measured now. A small model's own GEMM runs far below the machine's limit
    (against it alone a small model's step can show an "MFU" above 100%); the large one is the limit. Returns (rate,
    the shape that set it, {shape: rate})."""
    dev = torch.device(device)
    rates = {f"({m}, {k}) x ({k}, {n})": gemm_rate(m, k, n, dtype, dev, calls=calls)}
    big = f"({LARGE_GEMM}, {LARGE_GEMM}) x ({LARGE_GEMM}, {LARGE_GEMM})"
    if big not in rates:
        rates[big] = gemm_rate(LARGE_GEMM, LARGE_GEMM, LARGE_GEMM, dtype, dev, repeats=2,
                               calls=20 if dev.type == "cuda" else 2)
    shape = max(rates, key=rates.get)
    return rates[shape], shape, rates


PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "V100": 125e12}


def _datasheet_bf16(device) -> tuple[float | None, str]:
    """The datasheet dense bf16 peak of a known GPU (printed beside the measured rate, never the MFU denominator)."""
    if device.type != "cuda":
        return None, ""
    name = torch.cuda.get_device_name(device)
    for key, val in PEAK_BF16_FLOPS.items():
        if key in name:
            return val, f"{name} bf16 datasheet"
    return None, f"{name}: no datasheet figure"


def cpu_bf16_native() -> bool:
    """True when this CPU has native bf16 matmul instructions (AVX512-BF16 or AMX)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return "BF16" in cap or "AMX" in cap


def step_time(loss_fn, model, opt, steps: int, device, autocast, repeats: int = 2) -> float:
    """Seconds per training step as train.py runs it (forward, backward, clip_grad_norm_, AdamW), best of
    `repeats` after a warm-up; repeats=0: the first call itself, no warm-up (e.g. one that compiles)."""
    def run():
        for _ in range(steps):
            with autocast:
                loss = loss_fn()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    if repeats == 0:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) / steps
    return best_time(run, repeats) / steps


def _sync_time(fn, device, repeats: int = 3) -> float:

    def run():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()

    return best_time(run, repeats)


def _profile(cfg, m, ours, opt, x, y, dev, autocast, t_step: float, rate: float) -> dict[str, float]:
    """Seconds per step lost to each source, against the ideal (counted FLOPs at the measured GEMM rate).

    attention: SDPA forward + backward at the step's shape, all layers, minus its counted FLOPs at the
    GEMM rate; optimizer: clip_grad_norm_ + AdamW step + zero_grad; data: train.py's batch_indices and
    the row gather from a (n_train, T) token table (done outside the step in training, shown beside it);
    other: the rest of the step (elementwise ops, norms, RoPE, loss, GEMMs below the measured rate).
    """
    B, T = x.shape
    H, Dh = m.n_heads, m.d_model // m.n_heads
    q, k, v = (torch.randn(B, H, T, Dh, device=dev, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, Dh, device=dev)

    def attn():
        for _ in range(m.n_layers):
            with autocast:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(g)

    t_attn = _sync_time(attn, dev)
    attn_flops = 12.0 * m.n_layers * T * m.d_model * B * T
    with autocast:
        loss = ours(x, y)[1]
    loss.backward()

    def optim():
        torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        opt.step()
        for p in ours.parameters():  # keep the gradients (zero_grad(set_to_none) would drop them)
            p.grad.zero_()

    t_opt = _sync_time(optim, dev)
    n_rows = min(cfg.data.n_train, 8192)
    table = torch.randint(0, cfg.hmm.n_tokens + 1, (n_rows, T + 1), device=dev)
    step = [0]

    def data():
        idx = torch.as_tensor(batch_indices(step[0], n_rows, B, 0), device=dev)
        step[0] += 1
        return table[idx]

    t_data = _sync_time(data, dev, repeats=20)
    ideal = ours.flops_per_token(T) * B * T / rate
    attn_loss = max(t_attn - attn_flops / rate, 0.0)
    return {"step_s": t_step, "ideal_s": ideal, "attention_s": attn_loss, "optimizer_s": t_opt, "data_s": t_data,
            "other_s": t_step - ideal - attn_loss - t_opt}


def step_batch(cfg, dev, batch_size: int, seq_len: int):
    """What a timed training step runs on: the model's config (max_len stretched to seq_len), the vocabulary size, and
    one batch of inputs and targets (batch_size, seq_len) drawn with seed 0 on `dev`."""
    vocab = cfg.hmm.n_tokens + 1
    m = dataclasses.replace(cfg.model, max_len=max(cfg.model.max_len, seq_len))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(dev)
    y = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(dev)
    return m, vocab, x, y


def bench_train(cfg, device: str = "auto", batch_size: int = 32, seq_len: int = 256, steps: int = 5,
                peer: bool = True, profile: bool = False, compile: bool = False) -> dict[str, Any]:
    """Tokens/s and MFU of one training step (forward, backward, clip, AdamW) for `cfg.model`, vs HF RoFormer.

    MFU = counted FLOPs (Transformer.flops_per_token: 6 N + attention) per second over the matmul rate
    measured in the same run on the same device (`mfu_denominator`: the better of a GEMM of the model's MLP shape
    (B T, d_model) x (d_model, d_mlp) and a large square one), fp32 on the CPU (which trains in fp32), bf16 on
    CUDA (which trains under bf16 autocast);
    the other precision is measured and printed too (bf16 on a CPU only where it has native bf16), and
    a GPU's datasheet figure beside it, labelled. The peer is transformers' RoFormerForCausalLM at the
    same shape with the same AdamW step. compile: time torch.compile(model) instead of the eager model, and
    also report eager_step_s, compiled_step_s, compile_s (the first compiled step minus a compiled step) and
    break_even_steps = compile_s / (eager - compiled step): the steps one call must run for compiling to pay.
    """
    dev = resolve_device(device)
    m, vocab, x, y = step_batch(cfg, dev, batch_size, seq_len)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    ours = Transformer(m, vocab).to(dev)
    opt = ours.configure_optimizers(0.1, 1e-4, (0.9, 0.95))
    fwd = torch.compile(ours) if compile else ours
    pays: dict[str, float] = {}
    if compile:  # does compiling pay? its one-off cost against the time it saves per step (train.resolve_compile)
        t_eager = step_time(lambda: ours(x, y)[1], ours, opt, steps, dev, autocast)
        t_first = step_time(lambda: fwd(x, y)[1], ours, opt, 1, dev, autocast, repeats=0)  # compiles
    t_ours = step_time(lambda: fwd(x, y)[1], ours, opt, steps, dev, autocast)
    if compile:
        compile_s = max(t_first - t_ours, 0.0)
        pays = {"eager_step_s": t_eager, "compiled_step_s": t_ours, "compile_s": compile_s,
                "break_even_steps": compile_s / (t_eager - t_ours) if t_eager > t_ours else float("inf")}
    tokens = batch_size * seq_len
    rows, calls = batch_size * seq_len, max(4, 6 * m.n_layers)
    dtypes = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if cuda or cpu_bf16_native() else {})}
    limits = {k: mfu_denominator(rows, m.d_model, m.d_mlp, dt, dev, calls=calls) for k, dt in dtypes.items()}
    rates = {k: v[0] for k, v in limits.items()}
    denom = "bf16" if cuda else "fp32"
    flops = ours.flops_per_token(seq_len) * tokens / t_ours
    sheet, sheet_what = _datasheet_bf16(dev)
    shape = f"{m.n_layers} layers x {m.d_model} x {m.n_heads} heads, batch {batch_size} x {seq_len}"
    out: dict[str, Any] = {
        "device": str(dev), "shape": shape, "compiled": compile,
        "ours_tokens_per_s": tokens / t_ours, "flops_per_token": ours.flops_per_token(seq_len),
        "ours_tflops": flops / 1e12, "gemm_shape": f"({rows}, {m.d_model}) x ({m.d_model}, {m.d_mlp})",
        "gemm_shapes": {k: v[1] for k, v in limits.items()}, "gemm_rates": {k: v[2] for k, v in limits.items()},
        "measured_rates": rates, "mfu_denominator": denom, "mfu": flops / rates[denom],
        "mfu_all": {k: flops / r for k, r in rates.items()},
        "datasheet_bf16": sheet, "datasheet_what": sheet_what,
        "cpu_bf16_native": None if cuda else cpu_bf16_native(), **pays}
    if profile:
        out["profile"] = _profile(cfg, m, ours, opt, x, y, dev, autocast, t_ours, rates[denom])
    if peer:
        try:
            # lazy: transformers (the peer, optional: .[test]) may be missing
            from transformers import RoFormerConfig, RoFormerForCausalLM
        except ImportError:
            raise ValueError("the peer needs transformers: pip install -e '.[test]'") from None
        hf_cfg = RoFormerConfig(vocab_size=vocab, embedding_size=m.d_model, hidden_size=m.d_model,
                                num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                                intermediate_size=m.d_mlp, max_position_embeddings=m.max_len, is_decoder=True,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        hf = RoFormerForCausalLM(hf_cfg).to(dev)
        hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.1)
        t_peer = step_time(lambda: hf(input_ids=x, labels=y).loss, hf, hf_opt, steps, dev, autocast)
        out.update({"hf_roformer_tokens_per_s": tokens / t_peer, "ratio": t_peer / t_ours})
    return out
