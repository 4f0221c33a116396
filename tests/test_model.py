"""Tests for hmmscope.model.transformer: causality, windows, RoPE, fused vs explicit attention, hooks and cache, loss,
optimizer."""

import math

import pytest
import torch
import torch.nn.functional as F

from hmmscope.config import ModelConfig
from hmmscope.model.transformer import HookPoint, Transformer, apply_rope, resid_names, rope_tables, run_with_cache

V, T = 11, 16
POS = ("rope", "absolute", "none", "sinusoidal")


def make(pos="rope", n_layers=2, window=0, dropout=0.0, seed=0, d_model=16, n_heads=2):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_mlp=32, dropout=dropout,
                      pos_enc=pos, window=window, max_len=32)
    return Transformer(cfg, V).eval()


def tokens(B=2, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def no_hooks(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def set_explicit(model, flag):
    for b in model.blocks:
        b.attn.explicit = flag


@pytest.mark.parametrize("pos,window", [(p, 0) for p in POS] + [("rope", 3), ("none", 4)])
@pytest.mark.parametrize("explicit", [False, True])
def test_causal(pos, window, explicit):
    m = make(pos, window=window)
    set_explicit(m, explicit)
    x = tokens()
    for p in (5, T - 1):
        y = x.clone()
        y[:, p] = (y[:, p] + 1) % V
        with torch.no_grad():
            a, b = m(x)[0], m(y)[0]
        assert torch.equal(a[:, :p], b[:, :p])
        assert not torch.allclose(a[:, p], b[:, p])


@pytest.mark.parametrize("pos", ["rope", "absolute"])
@pytest.mark.parametrize("explicit", [False, True])
def test_window_receptive_field(pos, explicit):
    w, t = 4, 12
    m = make(pos, n_layers=1, window=w)
    set_explicit(m, explicit)
    x = tokens()
    with torch.no_grad():
        base = m(x)[0][:, t]
        for p in range(T):
            y = x.clone()
            y[:, p] = (y[:, p] + 1) % V
            out = m(y)[0][:, t]
            if p < t - w + 1 or p > t:
                assert torch.equal(out, base), p  # outside the band: bit-identical
            else:
                assert not torch.allclose(out, base), p


def test_rope_relative_inner_products():
    Dh = 8
    cos, sin = rope_tables(64, Dh)
    q, k = torch.randn(Dh, dtype=torch.float64), torch.randn(Dh, dtype=torch.float64)

    def dot(i, j):
        return (apply_rope(q.float(), cos[i], sin[i]) * apply_rope(k.float(), cos[j], sin[j])).sum()

    for i, j, s in [(5, 2, 7), (9, 9, 30), (3, 0, 50)]:
        assert torch.allclose(dot(i, j), dot(i + s, j + s), atol=1e-5)
    assert not torch.allclose(dot(5, 2), dot(5, 4), atol=1e-3)
    # the rotation is norm-preserving and position 0 is the identity
    assert torch.allclose(apply_rope(q.float(), cos[13], sin[13]).norm(), q.float().norm(), atol=1e-5)
    assert torch.equal(apply_rope(q.float(), cos[0], sin[0]), q.float())


def test_rope_real_path_matches_complex(monkeypatch):
    cos, sin = rope_tables(T, 8)
    x = torch.randn(3, T, 2, 8)
    ref = apply_rope(x, cos[:, None], sin[:, None])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.allclose(apply_rope(x, cos[:, None], sin[:, None]), ref, atol=1e-6)
    # interleaved pairs: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
    c, s = cos[5, 1], sin[5, 1]
    assert torch.allclose(ref[0, 5, 0, 2:4], torch.stack([x[0, 5, 0, 2] * c - x[0, 5, 0, 3] * s,
                                                          x[0, 5, 0, 3] * c + x[0, 5, 0, 2] * s]), atol=1e-6)


def test_rope_scores_shift_invariant_in_model():
    m = make("rope", n_layers=1)
    x, s = tokens(), 5
    xs = torch.cat([tokens(seed=9)[:, :s], x[:, : T - s]], dim=1)  # same tokens, shifted right by s
    name = "blocks.0.attn.hook_attn_scores"
    a = run_with_cache(m, x, [name])[1][name]
    b = run_with_cache(m, xs, [name])[1][name]
    n = T - s
    assert torch.allclose(a[:, :, :n, :n], b[:, :, s:, s:], atol=1e-5)
    m_abs = make("absolute", n_layers=1)  # sanity: absolute positions break the invariance
    a = run_with_cache(m_abs, x, [name])[1][name]
    b = run_with_cache(m_abs, xs, [name])[1][name]
    assert not torch.allclose(a[:, :, :n, :n], b[:, :, s:, s:], atol=1e-3)


@pytest.mark.parametrize("pos,invariant", [("none", True), ("rope", False), ("absolute", False)])
def test_no_position_scores_depend_only_on_tokens(pos, invariant):
    m = make(pos)
    x = tokens()
    perm = torch.randperm(T - 1, generator=torch.Generator().manual_seed(3))
    y = x.clone()
    y[:, : T - 1] = x[:, perm]  # permute earlier tokens, keep the last query token
    name = "blocks.0.attn.hook_attn_scores"
    a = run_with_cache(m, x, [name])[1][name][:, :, -1, :-1]
    b = run_with_cache(m, y, [name])[1][name][:, :, -1, :-1]
    assert torch.allclose(b, a[:, :, perm], atol=1e-5) == invariant


@pytest.mark.parametrize("pos,window", [(p, 0) for p in POS] + [("rope", 5), ("absolute", 3)])
def test_fused_matches_explicit(pos, window):
    m = make(pos, window=window)
    x = tokens()
    with torch.no_grad():
        fused = m(x)[0]
        set_explicit(m, True)
        expl = m(x)[0]
    assert torch.allclose(fused, expl, atol=1e-5)
    assert not torch.equal(fused, make(pos, window=window, seed=1)(x)[0])


def test_run_with_cache_logits_and_cleanup():
    m = make("rope")
    x = tokens()
    with torch.no_grad():
        ref = m(x)[0]
    logits, cache = run_with_cache(m, x, resid_names(2))  # fused path: bit-identical
    assert torch.equal(logits, ref)
    assert torch.equal(m.head(m.ln_f(cache["blocks.1.hook_resid_post"])), logits)
    assert not any(b.attn.explicit for b in m.blocks) and no_hooks(m)
    logits, cache = run_with_cache(m, x)  # explicit path: to tolerance
    assert torch.allclose(logits, ref, atol=1e-5)
    assert not any(b.attn.explicit for b in m.blocks) and no_hooks(m)
    with torch.no_grad():
        assert torch.equal(m(x)[0], ref)
    assert cache["hook_embed"].shape == (2, T, 16) and cache["blocks.0.attn.hook_q"].shape == (2, 2, T, 8)


def test_run_with_cache_cleans_up_on_exception():
    m = make("rope")

    def boom(x):
        raise RuntimeError("boom")

    m.blocks[1].mlp.forward = boom
    with pytest.raises(RuntimeError, match="boom"):
        run_with_cache(m, tokens())
    assert no_hooks(m) and not any(b.attn.explicit for b in m.blocks)
    with pytest.raises(KeyError):
        run_with_cache(m, tokens(), ["blocks.7.hook_resid_post"])


def test_cache_names_pinned():
    m = make("rope", n_layers=2)
    _, cache = run_with_cache(m, tokens())
    per_layer = ["attn.hook_q", "attn.hook_k", "attn.hook_attn_scores", "attn.hook_pattern", "hook_resid_post"]
    expected = ["hook_embed"] + [f"blocks.{l}.{n}" for l in range(2) for n in per_layer]
    assert list(cache) == expected
    assert sorted(m.hook_names()) == sorted(expected)
    assert resid_names(2) == ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    _, c1 = run_with_cache(m, tokens(), lambda n: n.startswith("blocks.1.") and "resid" in n)
    assert list(c1) == ["blocks.1.hook_resid_post"]  # fused here, explicit above: equal to tolerance
    assert torch.allclose(c1["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_post"], atol=1e-6)


def test_stop_early_and_grad_modes():
    m = make("absolute")
    x = tokens()
    _, full = run_with_cache(m, x, resid_names(2))  # fused path, like the stopped run
    logits, c = run_with_cache(m, x, ["blocks.0.hook_resid_post"], stop_early=True, to_cpu=True)
    assert logits is None and list(c) == ["blocks.0.hook_resid_post"]
    assert torch.equal(c["blocks.0.hook_resid_post"], full["blocks.0.hook_resid_post"])
    assert no_hooks(m)
    _, c = run_with_cache(m, x, ["hook_embed"], detach=False)
    assert c["hook_embed"].requires_grad
    assert not full["hook_embed"].requires_grad


@pytest.mark.parametrize("window", [0, 4])
def test_pattern_is_softmax_of_scores(window):
    m = make("rope", window=window)
    _, cache = run_with_cache(m, tokens())
    i = torch.arange(T)
    allowed = (i[None, :] <= i[:, None]) & ((i[None, :] > i[:, None] - window) if window else True)
    for l in range(2):
        s, p = cache[f"blocks.{l}.attn.hook_attn_scores"], cache[f"blocks.{l}.attn.hook_pattern"]
        assert s.shape == p.shape == (2, 2, T, T)
        assert torch.equal(torch.isinf(s), ~allowed.expand_as(s)) and (s[torch.isinf(s)] < 0).all()
        assert torch.allclose(s.softmax(-1), p, atol=1e-6)
        assert torch.allclose(p.sum(-1), torch.ones(2, 2, T), atol=1e-6)
        assert (p[..., ~allowed] == 0).all()


def test_loss_respects_mask_and_matches_manual():
    m = make("rope")
    x, tgt = tokens(), tokens(seed=2)
    mask = torch.rand(2, T, generator=torch.Generator().manual_seed(4)) < 0.5
    mask[0, 0] = False
    logits, loss = m(x, tgt, mask)
    lp = F.log_softmax(logits, -1).gather(-1, tgt[..., None])[..., 0]
    assert torch.allclose(loss, -lp[mask].mean(), atol=1e-6)
    tgt2 = tgt.clone()
    tgt2[~mask] = (tgt2[~mask] + 3) % V
    assert torch.equal(m(x, tgt2, mask)[1], loss)
    tgt3 = tgt.clone()
    tgt3[mask] = (tgt3[mask] + 1) % V
    assert not torch.allclose(m(x, tgt3, mask)[1], loss)
    assert torch.allclose(m(x, tgt)[1], -lp.mean(), atol=1e-6)


def test_training_reduces_loss():
    m = make("rope").train()
    opt = m.configure_optimizers(0.1, 3e-3, (0.9, 0.95))
    x = torch.arange(T).remainder(4)[None].repeat(4, 1)  # repeated 0 1 2 3 ...
    inp, tgt = x, torch.roll(x, -1, 1)
    losses = []
    for _ in range(30):
        _, loss = m(inp, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_optimizer_groups_and_counts():
    m = make("absolute", n_layers=3)
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    decay, no_decay = ({id(p) for p in g["params"]} for g in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.LayerNorm):
            assert id(mod.weight) in no_decay and id(mod.bias) in no_decay, name
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            assert id(mod.weight) in decay, name
            assert getattr(mod, "bias", None) is None
    params = list(m.parameters())
    assert len(decay) + len(no_decay) == len(params) and not decay & no_decay
    D, L, M = 16, 3, 32
    assert m.head.weight is m.tok_emb.weight
    assert m.num_params() == V * D + L * (4 * D * D + 2 * D * M + 4 * D) + 2 * D
    assert m.num_params(exclude_pos_emb=False) == m.num_params() + 32 * D
    assert m.flops_per_token(T) == 6 * m.num_params() + 12 * L * T * D


def test_init_scales():
    m = make("rope", n_layers=4, d_model=64, n_heads=4)
    assert abs(m.blocks[0].attn.qkv.weight.std().item() - 0.02) < 0.002
    assert abs(m.blocks[0].mlp.proj.weight.std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert abs(m.blocks[0].attn.proj.weight.std().item() - 0.02 / math.sqrt(8)) < 0.001


def test_dropout_train_only():
    m = make("rope", dropout=0.2)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(m(x)[0], m(x)[0])
        m.train()
        assert not torch.equal(m(x)[0], m(x)[0])


def test_hookpoints_are_identity_and_max_len():
    assert isinstance(HookPoint(), torch.nn.Identity)
    m = make("rope")
    with pytest.raises(ValueError):
        m(torch.zeros(1, 33, dtype=torch.long))


def test_dropout_same_in_fused_and_explicit():
    m = make("rope", dropout=0.3).train()  # no attention-probability dropout: both paths draw the same masks
    x = tokens()
    with torch.no_grad():
        torch.manual_seed(5)
        a = m(x)[0]
        set_explicit(m, True)
        torch.manual_seed(5)
        b = m(x)[0]
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "sinusoidal"])
def test_bf16_autocast(pos):
    m = make(pos)
    x, tgt = tokens(), tokens(seed=2)
    ref = m(x)[0].detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = m(x, tgt)
        _, cache = run_with_cache(m, x, ["blocks.0.attn.hook_pattern"])
    loss.backward()
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert torch.allclose(logits.float(), ref, atol=0.05)
    assert m.blocks[0].attn.qkv.weight.grad is not None
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"].float().sum(-1), torch.ones(2, 2, T), atol=2e-2)


def test_compiled_explicit_path_matches_eager():
    """torch.compile (inductor, CPU) of the analysis path: run_with_cache with attention scores and patterns
    switches layers to the explicit attention and reads hooks inside the compiled forward. The CPU twin of
    the compiled CUDA path (the fused training path is compiled in tests/test_train.py)."""
    from torch._dynamo.utils import counters

    eager, comp = make("rope", n_layers=1), make("rope", n_layers=1)  # same seed: same weights
    comp.compile()  # in place: hook names unchanged
    names = ["blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern", "blocks.0.hook_resid_post"]
    x, graphs = tokens(), counters["stats"]["unique_graphs"]
    le, ce = run_with_cache(eager, x, names)
    lc, cc = run_with_cache(comp, x, names)
    assert counters["stats"]["unique_graphs"] > graphs  # the forward was compiled
    assert set(cc) == set(names) and torch.allclose(lc, le, atol=1e-5)
    for n in names:  # masked scores are -inf in both
        assert cc[n].shape == ce[n].shape and torch.allclose(cc[n], ce[n], atol=1e-5), n
    assert no_hooks(comp) and not comp.blocks[0].attn.explicit


def test_compile_blocks_one_graph_for_every_layer():
    """compile_forward("blocks"): each block compiled alone, and the blocks share one graph (dynamo traces the
    parameters as inputs), so compiling costs one layer's time; outputs, gradients and the module (its state dict,
    its own calls) as eager. backend aot_eager: dynamo and AOT autograd without inductor's C++ build (the inductor
    path is train.compile=blocks in tests/test_train.py and tests/test_gpu.py)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    eager, comp = make("rope", n_layers=4).train(), make("rope", n_layers=4).train()
    keys = list(comp.state_dict())
    fwd = comp.compile_forward("blocks", backend="aot_eager")
    x, y = tokens(), tokens(seed=2)
    graphs = counters["stats"]["unique_graphs"]
    (le, loss_e), (lc, loss_c) = eager(x, y), fwd(x, y)
    assert counters["stats"]["unique_graphs"] == graphs + 1  # one graph, run by all 4 blocks
    assert torch.allclose(lc, le, atol=1e-5) and torch.allclose(loss_c, loss_e, atol=1e-6)
    loss_e.backward()
    loss_c.backward()
    for (n, p), q in zip(eager.named_parameters(), comp.parameters()):
        assert torch.allclose(q.grad, p.grad, atol=1e-6), n
    assert list(comp.state_dict()) == keys and type(comp.blocks[0]).__name__ == "Block"  # the module unchanged
    comp(x)  # its own call stays eager: no new graph
    assert counters["stats"]["unique_graphs"] == graphs + 1
    with pytest.raises(ValueError, match="unknown compile scope 'layers'"):
        comp.compile_forward("layers")


def test_attention_kernels_pin_sdpa():
    """train.attention: flash is torch's own choice on the CPU (the same numbers); math the reference kernel (float
    rounding); efficient / cudnn exist on CUDA only (ValueError here, before any work); each call a fresh context."""
    from hmmscope.model.transformer import attention_kernels

    m, x = make("rope"), tokens()
    ref, _ = m(x)
    for name, tol in (("flash", 0.0), ("math", 1e-5)):
        ctx = attention_kernels(name, "cpu")
        for _ in range(2):
            with ctx():
                out, _ = m(x)
            assert torch.allclose(out, ref, atol=tol, rtol=0), name
    with attention_kernels("auto", "cpu")():
        assert torch.equal(m(x)[0], ref)
    for name in ("efficient", "cudnn"):
        with pytest.raises(ValueError, match=f"train.attention={name} needs a CUDA device"):
            attention_kernels(name, "cpu")
    with pytest.raises(ValueError, match="unknown attention kernel 'fast'"):
        attention_kernels("fast", "cpu")


def test_adamw_is_fused_on_cpu():
    """configure_optimizers: torch's fused AdamW (one kernel per step) on the CPU as on CUDA (tests/test_gpu.py)."""
    opt = make("rope").configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
