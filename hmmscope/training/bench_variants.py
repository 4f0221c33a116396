"""Training-step variants: each compile scope x attention kernel timed from the same weights, and the pick.

Each variant's step time is measured with its one-off compile time; `choose_variant` picks the variant that fits
most steps in a budget (a GPU run uses it to choose train.compile and train.attention; `hmmscope bench train
--variants` prints the table). bench.py re-exports these; the step timing itself is bench.step_time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..config import ATTENTION
from .bench import mfu_denominator, step_batch, step_time

VARIANT_COMPILE = {"eager": "false", "model": "true", "model-autotune": "model-autotune", "model-graphs": "model-graphs",
                   "blocks": "blocks", "blocks-head": "blocks-head"}  # variant name -> train.compile


def parse_variant(name: str) -> tuple[str, str]:
    """A training-step variant "<compile>[+<attention>]" -> (train.compile, train.attention).

    compile: eager (none), model (torch.compile of the whole model), model-autotune (mode max-autotune-no-cudagraphs),
    model-graphs (mode reduce-overhead: CUDA graphs), blocks (each block compiled, one shared graph), blocks-head
    (those and the head: final norm, unembedding and cross-entropy fused in one graph);
    attention: auto (torch's kernel choice, the default) or a pinned SDPA kernel: flash, efficient, cudnn, math.
    E.g. "eager", "eager+cudnn", "blocks". ValueError (one line) for anything else."""
    comp, _, att = name.partition("+")
    att = att or "auto"
    if comp not in VARIANT_COMPILE or att not in ATTENTION or name.count("+") > 1:
        raise ValueError(f"unknown step variant {name!r}: <compile>[+<attention>] with compile in "
                         f"{', '.join(VARIANT_COMPILE)} and attention in {', '.join(ATTENTION)}")
    return VARIANT_COMPILE[comp], att


def bench_variants(cfg, device: str = "auto", batch_size: int = 32, seq_len: int = 256, steps: int = 5,
                   variants=("eager",), repeats: int = 2, on_start: Callable[[dict], None] | None = None,
                   on_row: Callable[[dict], None] | None = None, compile_kw: dict | None = None) -> dict[str, Any]:
    """Time each training-step variant (`parse_variant`) at one shape, as train.py runs the step, for the pick of
    `choose_variant`.

    Every variant starts from the same weights (seed 0) on the same batch, and runs the same steps: one first step
    (timed alone: for a compiled variant it holds the compile), then `step_time`'s warm-up and `repeats` x `steps`
    timed steps. Per variant (a row): step_s (best of the repeats), first_step_s, compile_s = first_step_s - step_s
    (the one-off cost, compile included; near 0 for eager), tokens_per_s, tflops, mfu (against the GEMM rate
    measured once here, as bench_train), loss_first (the first step's loss: the forward at the initial weights) and
    loss_last (after every step: backward and AdamW included), and their relative differences from the first
    variant's (the reference: list eager first). A variant that raises (e.g. a kernel the device lacks) gives a
    row with its one-line `error`; the others still run. on_start(head) is called once the GEMM rate is measured
    (the result less its rows), on_row(row) as each row is done (a caller writes them out, so a timeout keeps the
    finished rows). compile_kw go to torch.compile (tests: backend="aot_eager", the CPU twin)."""
    import torch  # lazy: torch (~1 s) off the CLI's checks of --variants (parse_variant, before any work)

    from .device import resolve_precision  # lazy: torch, as above
    from .train import resolve_device  # lazy: torch, as above

    dev = resolve_device(device)
    m, vocab, x, y = step_batch(cfg, dev, batch_size, seq_len)
    cuda = dev.type == "cuda"
    bf16 = resolve_precision(cfg.train.precision, dev) == "bf16"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = bf16
    tokens = batch_size * seq_len
    rows_, calls = batch_size * seq_len, max(4, 6 * m.n_layers)
    dtype = torch.bfloat16 if bf16 else torch.float32
    rate, gemm_shape, gemm_rates = mfu_denominator(rows_, m.d_model, m.d_mlp, dtype, dev, calls=calls)
    shape = f"{m.n_layers} layers x {m.d_model} x {m.n_heads} heads, batch {batch_size} x {seq_len}"
    out: dict[str, Any] = {"device": str(dev), "shape": shape, "precision": "bf16" if bf16 else "fp32",
                           "gemm_shape": gemm_shape, "gemm_rate": rate, "gemm_rates": gemm_rates,
                           "gemm_dtype": str(dtype).removeprefix("torch."), "steps": steps, "repeats": repeats,
                           "rows": []}
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(dev)
    if on_start is not None:
        on_start({k: v for k, v in out.items() if k != "rows"})
    ref = None
    for name in variants:
        comp, att = parse_variant(name)
        row: dict[str, Any] = {"variant": name, "compile": comp, "attention": att}
        try:
            row.update(_time_variant(m, vocab, comp, att, x, y, dev, bf16, steps, repeats, compile_kw), error=None)
            flops = row.pop("flops_per_token") * tokens / row["step_s"]
            row.update({"tokens_per_s": tokens / row["step_s"], "tflops": flops / 1e12, "mfu": flops / rate})
            ref = ref or row
            row["loss_first_rel"] = abs(row["loss_first"] - ref["loss_first"]) / abs(ref["loss_first"])
            row["loss_last_rel"] = abs(row["loss_last"] - ref["loss_last"]) / abs(ref["loss_last"])
        except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        if cuda:
            torch.cuda.empty_cache()
        out["rows"].append(row)
        if on_row is not None:
            on_row(row)
    return out


def _time_variant(m, vocab: int, comp: str, att: str, x, y, dev, bf16: bool, steps: int, repeats: int,
                  compile_kw: dict | None = None) -> dict:
    """One variant's step times and losses (bench_variants); the model and optimizer are freed on return."""
    import torch  # lazy: torch (~1 s) off the CLI's checks of --variants (parse_variant, before any work)

    from ..model.transformer import Transformer, attention_kernels  # lazy: torch, as above

    kernels = attention_kernels(att, dev)
    compile_kw = compile_kw or {}
    torch.manual_seed(0)
    model = Transformer(m, vocab).to(dev)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95))
    fwd = model.compile_forward("model" if comp == "true" else comp, **compile_kw) if comp != "false" else model
    last: list = []

    mask = torch.ones_like(y, dtype=torch.bool)  # train.py passes its loss mask: the same graph

    def loss_fn():
        with kernels():
            loss = fwd(x, y, mask)[1]
        last[:] = [loss]
        return loss

    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    first = step_time(loss_fn, model, opt, 1, dev, autocast, repeats=0)
    loss_first = float(last[0].detach())
    step = step_time(loss_fn, model, opt, steps, dev, autocast, repeats=repeats)
    return {"step_s": step, "first_step_s": first, "compile_s": max(first - step, 0.0), "loss_first": loss_first,
            "loss_last": float(last[0].detach()), "flops_per_token": model.flops_per_token(x.shape[1])}


def choose_variant(rows: list[dict], budget_s: float, *, first_tol: float = 2e-2, last_tol: float = 0.1,
                   ratio: float = 1.0) -> tuple[dict | None, list[str]]:
    """The variant that fits the most training steps into budget_s seconds: (budget_s - compile_s) / (step_s x
    ratio), ratio = a training step's time over the bench's (data, logging). Its one-off compile_s counts against
    it, so compiling is chosen only where it pays within the budget. Rows with an error, or whose losses differ from
    the reference's (the first row) by more than first_tol (first step) or last_tol (last step) relatively, are
    left out. Returns (the row, or None when no row is usable; one line per row on why it was kept or not)."""
    best, why = None, []
    for r in rows:
        if r.get("error"):
            why.append(f"{r['variant']}: left out ({r['error']})")
            continue
        if r["loss_first_rel"] > first_tol or r["loss_last_rel"] > last_tol:
            why.append(f"{r['variant']}: left out (loss differs from {rows[0]['variant']}'s: first step "
                       f"{r['loss_first_rel']:.1e}, last {r['loss_last_rel']:.1e})")
            continue
        fit = max(0.0, budget_s - r["compile_s"]) / (r["step_s"] * ratio)
        why.append(f"{r['variant']}: {r['step_s'] * 1e3:.2f} ms/step, one-off {r['compile_s']:.1f} s: "
                   f"{fit:,.0f} steps in {budget_s:.0f} s")
        if best is None or fit > best[1]:
            best = (r, fit)
    return (best[0] if best else None), why




