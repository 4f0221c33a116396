"""Decoder-only RoFormer-style transformer with TransformerLens-style hook points (SCIENCE.md 5).

Design (lean, nanoGPT-like):
- Pre-norm blocks: x + attn(ln1(x)), then x + mlp(ln2(x)); final LayerNorm; unembedding tied to the
  token embedding (as nanoGPT and HF RoFormer's default). Linear layers have no bias (nanoGPT's bias=False:
  one kernel fewer per matmul, fwd and bwd); LayerNorms keep weight and bias.
- Positions, one switch (cfg.pos_enc): "rope" rotates queries and keys in every layer (RoFormer's
  interleaved layout: dims 2i and 2i+1 form a pair, base 10000, float32 cos/sin tables of max_len rows);
  "absolute" adds a learned table; "sinusoidal" adds the fixed Vaswani table; "none" adds nothing
  (the causal mask is the only source of order).
- Attention: fused torch scaled_dot_product_attention (is_causal=True, or a cached boolean banded mask
  when cfg.window > 0: query t sees keys t-window+1..t); `attention_kernels` pins its kernel (train.attention:
  flash, efficient, cudnn or math; auto leaves torch's choice, flash on CUDA at bf16 and on the CPU where it
  fits). When `Attention.explicit` is set (run_with_cache
  does it when attention scores/patterns are requested) the scores q @ k^T / sqrt(Dh) are materialized,
  masked with -inf, exposed at hook_attn_scores, softmaxed (hook_pattern) and applied to v.
- Dropout (cfg.dropout > 0, training only) on the embedding, the attention-sublayer output and the MLP
  output; none on attention probabilities (that would push SDPA off its fused CPU kernel onto a slower path).
- Compiling (`Transformer.compile_forward`, train.compile): the whole model (one graph of every layer) or each
  block alone ("blocks": the blocks share one compiled graph, so compiling costs one layer's time; the
  regions between the blocks stay eager). The compiled callable is the training step's only: the module
  itself, its state dict, evaluation and hooks stay eager.
- Hook points (identity modules; forward hooks read them): hook_embed (layer-0 residual),
  blocks.{l}.attn.hook_q / hook_k (post-RoPE, (B, H, T, Dh)), blocks.{l}.attn.hook_attn_scores and
  hook_pattern ((B, H, T, T), explicit path only), blocks.{l}.hook_resid_post ((B, T, D)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..config import ModelConfig


class HookPoint(nn.Identity):
    """Named identity: register a forward hook on it to read (or replace) the activation."""


def resid_names(n_layers: int) -> list[str]:
    """Residual-stream hook names, index = layer: 0 is the embedding, l is the output of block l-1."""
    return ["hook_embed"] + [f"blocks.{l}.hook_resid_post" for l in range(n_layers)]


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos, sin of shape (max_len, head_dim // 2): angle[t, i] = t * base^(-2i / head_dim)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[..., 2i], x[..., 2i+1]) by angle[t, i]; cos/sin broadcast against x[..., ::2].

    Eager: one complex multiply (fastest on CPU, fwd and bwd); under torch.compile: the same in real arithmetic.
    Computed in float32 and cast back (bf16 autocast friendly).
    """
    xf = x.float().unflatten(-1, (-1, 2))  # (..., Dh/2, 2)
    if torch.compiler.is_compiling():
        x0, x1 = xf.unbind(-1)
        out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    else:
        out = torch.view_as_real(torch.view_as_complex(xf) * torch.complex(cos.float(), sin.float()))
    return out.flatten(-2).to(x.dtype)


def sinusoidal_table(max_len: int, d: int) -> torch.Tensor:
    """Vaswani et al.: pe[t, 2i] = sin(t / 10000^(2i/d)), pe[t, 2i+1] = cos(...)."""
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = ang.sin(), ang.cos()[:, : d // 2]
    return pe.float()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.window = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.window
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.explicit = False  # materialize scores/pattern (set by run_with_cache)
        self.hook_q, self.hook_k = HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        qk, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).split([2, 1], dim=2)  # (B, T, 2|1, H, Dh)
        if rope is not None:  # rotate q and k in one pass; cos/sin: (T, 1, 1, Dh/2)
            qk = apply_rope(qk, rope[0][:T, None, None], rope[1][:T, None, None])
        q, k = qk.unbind(2)  # (B, T, H, Dh)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v[:, :, 0].transpose(1, 2)  # (B, H, T, Dh)
        q, k = self.hook_q(q), self.hook_k(k)
        if self.explicit:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, H, T, T)
            att = self.hook_attn_scores(att.masked_fill(~mask[:T, :T], float("-inf")))
            att = self.hook_pattern(F.softmax(att, dim=-1))
            y = att @ v  # (B, H, T, Dh)
        elif self.window > 0:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:T, :T])
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, D)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)
        self.hook_resid_post = HookPoint()

    def forward(self, x, rope, mask):
        x = x + self.attn(self.ln1(x), rope, mask)
        x = x + self.mlp(self.ln2(x))
        return self.hook_resid_post(x)  # (B, T, D)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        if cfg.pos_enc not in ("rope", "absolute", "none", "sinusoidal"):
            raise ValueError(f"unknown pos_enc {cfg.pos_enc!r}")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.pos_enc == "absolute" else None
        if cfg.pos_enc == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        if cfg.pos_enc == "rope":
            cos, sin = rope_tables(cfg.max_len, cfg.d_model // cfg.n_heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        i = torch.arange(cfg.max_len)
        keep = i[None, :] <= i[:, None]  # (T, T) causal: key j <= query t
        if cfg.window > 0:
            keep &= i[None, :] > i[:, None] - cfg.window  # banded: j >= t - window + 1
        self.register_buffer("mask", keep, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied unembedding
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual-stream writes by 1/sqrt(2 L)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None,
                *, blocks: Sequence[Callable] | None = None, head: Callable | None = None):
        """idx (B, T) long -> (logits (B, T, V), mean cross-entropy over loss_mask positions, or None).

        logits[:, t] predicts targets[:, t]; loss_mask (B, T) bool (None = every position). blocks: callables
        run in place of self.blocks, one per layer; head: in place of `_head` (final norm, unembedding, loss): the
        compiled ones of `compile_forward`.
        """
        B, T = idx.shape
        if T > self.cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len {self.cfg.max_len}")
        x = self.tok_emb(idx)  # (B, T, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:T]
        elif self.cfg.pos_enc == "sinusoidal":
            x = x + self.pos_table[:T].to(x.dtype)
        x = self.drop(self.hook_embed(x))
        rope = (self.rope_cos, self.rope_sin) if self.cfg.pos_enc == "rope" else None
        for block in self.blocks if blocks is None else blocks:
            x = block(x, rope, self.mask)
        return (self._head if head is None else head)(x, targets, loss_mask)

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None, loss_mask: torch.Tensor | None):
        """The last residual (B, T, D) -> (logits, loss): final LayerNorm, tied unembedding, cross-entropy."""
        B, T, _ = x.shape
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        if loss_mask is not None:
            targets = targets.masked_fill(~loss_mask, -1)
        loss = F.cross_entropy(logits.reshape(B * T, -1).float(), targets.reshape(B * T), ignore_index=-1)
        return logits, loss

    def num_params(self, exclude_pos_emb: bool = True) -> int:
        """Parameter count (tied embedding counted once); the learned position table left out by default."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_pos_emb and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token (forward + backward), PaLM appendix B / nanoGPT: 6 N + 12 L T d_model.

        N = num_params() (weights incl. the tied unembedding matmul); 12 L T d counts the two attention
        matmuls (QK^T, AV) over the full T x T (causality and windows not discounted, as is customary).
        """
        c = self.cfg
        return 6.0 * self.num_params() + 12.0 * c.n_layers * T * c.d_model

    def configure_optimizers(self, weight_decay: float, lr: float, betas: tuple[float, float]) -> torch.optim.AdamW:
        """AdamW: weight decay on >= 2-D tensors (matmul weights, embeddings), none on biases / LayerNorm.

        fused=True when every parameter is on CUDA or CPU (torch's fused AdamW: one kernel per step).
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = all(p.device.type in ("cuda", "cpu") for p in params)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)

    def compile_forward(self, scope: str = "model", **compile_kw) -> Callable:
        """A torch.compile'd callable with this module's forward signature, for the training step.

        scope (COMPILE_SCOPES) "model": torch.compile(self) (one graph over every layer); "model-autotune": the
        same with mode max-autotune-no-cudagraphs (inductor benchmarks GEMM and fusion choices: a longer compile);
        "model-graphs": mode reduce-overhead (CUDA graphs: the step's kernel launches replayed as one; on a CPU,
        plain compiling); "blocks": each block compiled alone and run by this (eager) forward through its `blocks`
        argument: identical blocks share one compiled graph (dynamo traces parameters as inputs), so the compile
        time is about one layer's; "blocks-head": those blocks and the head (final norm, unembedding and
        cross-entropy: one fused graph, the logits never upcast in memory) compiled too. compile_kw go to
        torch.compile (e.g. backend; a backend that takes no mode ignores it). The module is not changed: its own
        calls, its state dict, evaluation and hooks stay eager. (QKV is already one GEMM: Attention.qkv.)"""
        if scope not in COMPILE_SCOPES:
            raise ValueError(f"unknown compile scope {scope!r} ({', '.join(COMPILE_SCOPES)})")
        if scope.startswith("model"):
            mode = {"model-autotune": "max-autotune-no-cudagraphs", "model-graphs": "reduce-overhead"}.get(scope)
            return torch.compile(self, **({"mode": mode} if mode else {}), **compile_kw)
        blocks = [torch.compile(b, **compile_kw) for b in self.blocks]
        head = torch.compile(self._head, **compile_kw) if scope == "blocks-head" else None
        return functools.partial(self, blocks=blocks, head=head)

    def hook_names(self) -> list[str]:
        return [n for n, m in self.named_modules() if isinstance(m, HookPoint)]

    def run_with_cache(self, idx, names=None, **kw):
        return run_with_cache(self, idx, names, **kw)


SDPA_KERNELS = ("flash", "efficient", "cudnn", "math")
COMPILE_SCOPES = ("model", "model-autotune", "model-graphs", "blocks", "blocks-head")  # Transformer.compile_forward


def attention_kernels(name: str, device: torch.device | str) -> Callable[[], AbstractContextManager]:
    """train.attention on `device`: a factory of fresh contexts that pin scaled_dot_product_attention's kernel.

    "auto": no pin (torch's choice); "flash" / "math" on any device; "efficient" / "cudnn" on CUDA only
    (ValueError elsewhere, before any work). A kernel that does not fit the inputs raises at the first call."""
    device = torch.device(device)
    if name == "auto":
        return nullcontext
    if name not in SDPA_KERNELS:
        raise ValueError(f"unknown attention kernel {name!r} (auto, {', '.join(SDPA_KERNELS)})")
    if name in ("efficient", "cudnn") and device.type != "cuda":
        raise ValueError(f"train.attention={name} needs a CUDA device, got {device}")
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]
    return functools.partial(sdpa_kernel, [backend])


class _StopForward(Exception):
    pass


def run_with_cache(model: Transformer, idx: torch.Tensor,
                   names: None | Iterable[str] | Callable[[str], bool] = None, *,
                   detach: bool = True, to_cpu: bool = False, stop_early: bool = False):
    """Run `model(idx)` and return (logits, {hook name: activation}) in execution order.

    names: None (every hook point), a list of hook names (unknown names raise KeyError), or a filter
    name -> bool. Requesting any hook_attn_scores / hook_pattern switches that layer to the explicit
    attention path for this call only. detach=True runs under torch.no_grad (detach=False keeps the
    graph). to_cpu moves each activation to the CPU as it is produced (one layer at a time on GPU).
    stop_early=True aborts the forward once every requested activation is cached (logits is None).
    All hooks are removed and the explicit flags restored even if the forward raises.
    """
    points = {n: m for n, m in model.named_modules() if isinstance(m, HookPoint)}
    if isinstance(names, str):
        names = [names]
    if names is None:
        wanted = list(points)
    elif callable(names):
        wanted = [n for n in points if names(n)]
    else:
        wanted = list(names)
        unknown = [n for n in wanted if n not in points]
        if unknown:
            raise KeyError(f"unknown hook names {unknown}; known: {list(points)}")
    cache: dict[str, torch.Tensor] = {}
    attns = {n.rsplit(".", 1)[0]: model.get_submodule(n.rsplit(".", 1)[0]) for n in wanted
             if n.endswith(("hook_attn_scores", "hook_pattern"))}
    saved = {a: m.explicit for a, m in attns.items()}
    handles = []

    def make_hook(name):
        def hook(_mod, _inp, out):
            t = out.detach() if detach else out
            cache[name] = t.to("cpu") if to_cpu else t
            if stop_early and len(cache) == len(set(wanted)):
                raise _StopForward
        return hook

    logits = None
    try:
        for m in attns.values():
            m.explicit = True
        for n in set(wanted):
            handles.append(points[n].register_forward_hook(make_hook(n)))
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
            try:
                logits, _ = model(idx)
            except _StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
        for a, m in attns.items():
            m.explicit = saved[a]
    return (logits.detach() if detach and logits is not None else logits), cache
