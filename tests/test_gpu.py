"""The CUDA paths (`pytest -m gpu`): training (bf16 autocast, TF32, fused AdamW, torch.compile), the oracles,
the shuffle test, the probes, evaluation and analysis on CUDA against the CPU, and checkpoints across devices.

Every CUDA test here carries the `gpu` marker: the default run leaves them out, and without CUDA they are
skipped with the reason "CUDA not available" (tests/conftest.py; HMMSCOPE_REQUIRE_GPU=1 turns that skip into
a failure, so a GPU session cannot pass by skipping). The one unmarked test checks that rule itself. Their
CPU twins, which run everywhere, are in tests/test_train.py (compile + bf16 training, a cuda-tagged
checkpoint resumed on the CPU) and tests/test_model.py (compiled explicit attention path, bf16 autocast).

Tolerances: fp32 on CUDA (train.precision = "fp32": no autocast, no TF32) against fp32 on the CPU differs
by kernel rounding only (rel 1e-3 on a metric after 12 Adam steps); bf16 autocast by bf16 rounding (rel 2e-2,
as the CPU twin); float64 oracles to 1e-9.
"""

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from hmmscope import tracking
from hmmscope.config import Config, override
from hmmscope.data.episodes import sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.measure.probes import collect_residuals, run_probes
from hmmscope.measure.shuffle import shuffle_test
from hmmscope.model.transformer import Transformer, run_with_cache
from hmmscope.oracles.inference import mixture_oracle, task_oracle
from hmmscope.pipeline.analysis import analyze_run
from hmmscope.pipeline.evaluation import evaluate_run
from hmmscope.pipeline.run import train
from hmmscope.training.checkpoints import load_model, read_checkpoint
from hmmscope.training.learning_curve import evaluate_loss, oracle_metrics

gpu = pytest.mark.gpu

DEV = torch.device("cuda")
SMALL = {
    "hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2,
    "data.n_demos": 2, "data.l_demo": 8, "data.l_test": 8, "data.n_train": 96, "data.n_eval": 32,
    "model.n_layers": 2, "model.n_heads": 2, "model.d_model": 32, "model.d_mlp": 64, "model.max_len": 64,
    "train.steps": 12, "train.batch_size": 8, "train.warmup": 2, "train.eval_every": 6, "train.ckpt_every": 6,
    "train.device": "cpu", "train.precision": "fp32",
}


def small(**kw) -> Config:
    return override(Config(), {**SMALL, **kw})


@contextmanager
def tf32(flag: bool):
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = flag
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _latest_run(uri, experiment):
    return tracking.client(uri).search_runs([tracking.experiment_id(uri, experiment)],
                                            order_by=["attributes.start_time DESC"], max_results=1)[0]


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('gpu-store')}/mlflow.db"


@pytest.fixture(scope="module")
def cpu_ref(uri):
    """The reference: the same small run on the CPU in float32."""
    return train(small(), tracking_uri=uri, experiment="ref", run_name="cpu-fp32", progress=False)


@pytest.fixture(scope="module")
def data():
    cfg = small()
    mix = make_mixture(cfg.hmm)
    return mix, sample_episodes(mix, cfg.data, 32, "eval")


def _model(seed=0):
    cfg = small()
    torch.manual_seed(seed)
    return Transformer(cfg.model, cfg.hmm.n_tokens + 1).eval()


# ---------------------------------------------------------------- training


@gpu
def test_cuda_default_path_bf16_tf32_fused_compile(uri, cpu_ref):
    """precision auto on CUDA = bf16 autocast + TF32; compile; fused AdamW: learns, and agrees with float32 CPU."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    with tf32(False):
        res = train(small(**{"train.device": "cuda", "train.precision": "auto", "train.compile": True}),
                    tracking_uri=uri, experiment="gpu", run_name="cuda-default", progress=False)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # set by train
    assert counters["stats"]["unique_graphs"] > graphs
    tags = tracking.Run(uri, res.run_id).get().data.tags
    assert tags["hmmscope.device"].startswith("cuda") and tags["hmmscope.precision"] == "bf16"
    first = tracking.client(uri).get_metric_history(res.run_id, "val/loss")[0].value
    assert res.metrics["val/loss"] < first
    assert res.metrics["val/loss"] == pytest.approx(cpu_ref.metrics["val/loss"], rel=2e-2)
    assert res.metrics["oracle/test_loss"] == pytest.approx(cpu_ref.metrics["oracle/test_loss"], rel=1e-9)
    opt = Transformer(small().model, 5).to(DEV).configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    assert opt.defaults["fused"] is True


@gpu
def test_cuda_fp32_matches_cpu(uri, cpu_ref):
    """precision fp32 on CUDA: no autocast and no TF32, so the run matches the CPU run up to kernel rounding."""
    with tf32(True):
        res = train(small(**{"train.device": "cuda"}), tracking_uri=uri, experiment="gpu", run_name="cuda-fp32",
                    progress=False)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    for k in ("val/loss", "val/test_loss", "val/acc"):
        assert res.metrics[k] == pytest.approx(cpu_ref.metrics[k], rel=1e-3), k


@gpu
def test_cuda_step_variants_train(uri, cpu_ref):
    """The GPU session's step variants in train (analysis/gpu/README.md): each block compiled alone (one graph for
    both layers) with the flash kernel pinned, and the cuDNN kernel eager: both learn, agree with float32 CPU up to
    bf16 rounding, and are tagged. CPU twins: tests/test_train.py (blocks through inductor, attention=math/flash)."""
    from torch._dynamo.utils import counters

    for sets, tag in (({"train.compile": "blocks", "train.attention": "flash"}, "blocks"),
                      ({"train.compile": "blocks-head", "train.attention": "auto"}, "blocks-head"),
                      ({"train.compile": "model-graphs", "train.attention": "auto"}, "model-graphs"),
                      ({"train.compile": "false", "train.attention": "cudnn"}, "false")):
        graphs = counters["stats"]["unique_graphs"]
        res = train(small(**{"train.device": "cuda", "train.precision": "bf16", **sets}), tracking_uri=uri,
                    experiment="gpu", run_name=f"variant-{tag}", progress=False)
        assert (counters["stats"]["unique_graphs"] > graphs) == (tag != "false")
        tags = tracking.Run(uri, res.run_id).get().data.tags
        assert tags["hmmscope.compiled"] == tag and tags["hmmscope.attention"] == sets["train.attention"]
        assert res.metrics["val/loss"] == pytest.approx(cpu_ref.metrics["val/loss"], rel=2e-2)


@gpu
def test_cuda_bench_variants_and_flash_at_the_paper_head_shape():
    """bench train --variants on CUDA (bf16, MFU against the bf16 GEMM rate measured there): every variant runs or
    names its error, and the ones that run agree on the losses; flash attention takes the model's strided q, k, v at
    the paper's head shape (357 tokens, 16 heads of 64) forward and backward, as math does up to bf16 rounding."""
    import dataclasses

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hmmscope.training.bench_variants import bench_variants, choose_variant

    cfg = small()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device="cuda", precision="auto"))
    r = bench_variants(cfg, "cuda", batch_size=4, seq_len=40, steps=2, variants=(
        "eager", "eager+flash", "eager+cudnn", "blocks", "blocks-head", "model-graphs", "model-autotune"))
    assert r["precision"] == "bf16" and r["gemm_dtype"] == "bfloat16" and r["device_name"]
    ok = [row for row in r["rows"] if row["error"] is None]
    assert ok[0]["variant"] == "eager" and {"eager", "eager+flash", "blocks", "blocks-head", "model-graphs",
                                            "model-autotune"} <= {row["variant"] for row in ok}
    assert r["gemm_rate"] == max(r["gemm_rates"].values()) and len(r["gemm_rates"]) == 2  # the model's and 2048^3
    assert all(row["loss_first_rel"] < 2e-2 and row["mfu"] > 0 for row in ok)
    assert choose_variant(r["rows"], 60.0)[0] is not None
    x = torch.randn(2, 357, 3, 16, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)  # (B, T, qkv, H, Dh)
    outs = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, Dh), strided as in Attention.forward
        with sdpa_kernel([backend]):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (g,) = torch.autograd.grad(y.float().square().sum(), x)
        outs.append((y.float(), g.float()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=2e-2) and torch.allclose(outs[0][1], outs[1][1], atol=1e-1)


# ---------------------------------------------------------------- checkpoints across devices


@gpu
def test_checkpoint_cuda_to_cpu(uri, cpu_ref, tmp_path):
    """A run stopped on CUDA: its checkpoint holds CUDA tensors, reads on the CPU, and resumes there."""
    with pytest.raises(KeyboardInterrupt):
        train(small(**{"train.device": "cuda"}), tracking_uri=uri, experiment="c2c", progress=False, _stop_after=6)
    run_id = _latest_run(uri, "c2c").info.run_id
    path = tracking.Run(uri, run_id).download("checkpoints/last.pt", tmp_path)
    raw = torch.load(path, weights_only=True)  # no map_location: tensors come back where they were saved
    assert all(t.device.type == "cuda" for t in raw["model"].values())
    ck = read_checkpoint(path)
    assert all(t.device.type == "cpu" for t in ck["model"].values()) and ck["step"] == 6
    res = train(small(), tracking_uri=uri, experiment="c2c", resume=run_id, progress=False)
    assert res.steps == 12 and tracking.Run(uri, run_id).get().data.tags["hmmscope.device"] == "cpu"
    assert res.metrics["val/loss"] == pytest.approx(cpu_ref.metrics["val/loss"], rel=1e-3)


@gpu
def test_checkpoint_cpu_to_cuda(uri, cpu_ref, tmp_path):
    """A run stopped on the CPU resumes on CUDA (model and optimizer state moved there) and ends as the CPU run."""
    with pytest.raises(KeyboardInterrupt):
        train(small(), tracking_uri=uri, experiment="c2g", progress=False, _stop_after=6)
    run_id = _latest_run(uri, "c2g").info.run_id
    res = train(small(**{"train.device": "cuda"}), tracking_uri=uri, experiment="c2g", resume=run_id, progress=False)
    assert res.steps == 12
    raw = torch.load(tracking.Run(uri, run_id).download("checkpoints/last.pt", tmp_path), weights_only=True)
    assert all(t.device.type == "cuda" for t in raw["model"].values())
    assert all(v.device.type == "cuda" for st in raw["optimizer"]["state"].values() for v in st.values())
    assert res.metrics["val/loss"] == pytest.approx(cpu_ref.metrics["val/loss"], rel=1e-3)
    model, _ = load_model(uri, run_id)  # CPU model from the CUDA-written checkpoint
    ep = sample_episodes(make_mixture(small().hmm), small().data, small().data.n_eval, "eval")
    assert evaluate_loss(model, ep)["loss"] == pytest.approx(res.metrics["val/loss"], rel=1e-4)


# ---------------------------------------------------------------- oracles, shuffle test, probes, evaluation


@gpu
def test_oracles_cuda_match_cpu(data):
    mix, ep = data
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-4)):
        a = task_oracle(mix, ep, dtype=dtype, device=DEV).cpu()
        b = task_oracle(mix, ep, dtype=dtype, device="cpu")
        assert a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
        (pa, qa), (pb, qb) = (mixture_oracle(mix, ep, posterior_at="test_start", dtype=dtype, device=d)
                              for d in (DEV, "cpu"))
        assert torch.allclose(pa.cpu(), pb, rtol=tol, atol=tol, equal_nan=True)
        assert torch.allclose(qa.cpu(), qb, rtol=tol, atol=tol)
    a, b = oracle_metrics(mix, ep, DEV), oracle_metrics(mix, ep, "cpu")
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-9) for k in a)


@gpu
def test_mixture_oracle_cuda_chunks_agree(data):
    """Any chunking of the tasks on CUDA (the automatic one included) gives the same mixture, and the
    automatic chunk is a power of two between 256 and n_tasks (or n_tasks when smaller)."""
    from hmmscope.oracles.chunks import cuda_chunk

    mix, ep = data
    ref, qref = mixture_oracle(mix, ep, posterior_at="test_start", dtype=torch.float64, device="cpu")
    for c in (1, 3, None):
        p, q = mixture_oracle(mix, ep, posterior_at="test_start", dtype=torch.float64, device=DEV, chunk_tasks=c)
        assert torch.allclose(p.cpu(), ref, rtol=1e-9, atol=1e-12, equal_nan=True)
        assert torch.allclose(q.cpu(), qref, rtol=1e-9, atol=1e-12)
    assert cuda_chunk(4, 1024, 16, 8, torch.float64, DEV) == 4
    c = cuda_chunk(8192, 1024, 16, 8, torch.float64, DEV)
    assert 256 <= c <= 8192 and c & (c - 1) == 0


@gpu
def test_bench_oracle_cuda_rows():
    from hmmscope.training.bench_inference import bench_oracle

    r = bench_oracle((8,), n_episodes=4, full_episodes=8, device="cuda", chunks=(None, 2))
    assert [row["chunk_tasks"] for row in r["rows"]] == [8, 2] and r["device"].startswith("cuda")
    for row in r["rows"]:
        assert row["seconds"] > 0 and row["full_s"] == pytest.approx(2 * row["seconds"])
        assert row["max_abs_vs_cpu"] < 1e-9 and not row["measured_full"]


@gpu
def test_shuffle_test_cuda_matches_cpu(data):
    _, ep = data
    model = _model()
    with tf32(True):  # shuffle_test turns TF32 off for its own matmuls and restores the flag
        a = shuffle_test(model, ep, n_perms=2, device=DEV)
        assert torch.backends.cuda.matmul.allow_tf32
    assert next(model.parameters()).device.type == "cpu"  # the model is returned to its device
    b = shuffle_test(model, ep, n_perms=2, device="cpu")
    assert np.allclose(a.per_episode, b.per_episode, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert [c.verdict for c in a.claims] == [c.verdict for c in b.claims]


@gpu
def test_probes_cuda_match_cpu(data):
    mix, ep = data
    with tf32(False):
        ra = collect_residuals(_model(), ep, device=DEV, positions_per_episode=4)
        rb = collect_residuals(_model(), ep, device="cpu", positions_per_episode=4)
        for (la, xa), (lb, xb) in zip(ra, rb):
            assert la == lb and np.allclose(xa, xb, rtol=1e-4, atol=1e-5)
        pa = run_probes(_model(), mix, ep, ks=(1, 2), device=DEV, positions_per_episode=4, n_boot=50)
    pb = run_probes(_model(), mix, ep, ks=(1, 2), device="cpu", positions_per_episode=4, n_boot=50)
    assert pa.meta["fits"] == "torch on cuda" and pb.meta["fits"] == "sklearn"  # issue 37: the fits on the GPU
    assert [(r["target"], r["layer"]) for r in pa.table] == [(r["target"], r["layer"]) for r in pb.table]
    assert max(abs(x["acc"] - y["acc"]) for x, y in zip(pa.table, pb.table)) <= 0.05


@gpu
def test_evaluate_and_analyze_on_cuda(uri, cpu_ref):
    with tf32(False):
        a = evaluate_run(uri, cpu_ref.run_id, device="cuda")
    b = evaluate_run(uri, cpu_ref.run_id, device="cpu")
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-3, abs=1e-5) for k in a)
    with tf32(True):
        an = analyze_run(uri, cpu_ref.run_id, device="cuda", n_episodes=16, ks=(1, 2), n_perms=2)
    ac = analyze_run(uri, cpu_ref.run_id, device="cpu", n_episodes=16, ks=(1, 2), n_perms=2)
    assert [c.name for c in an.claims] == [c.name for c in ac.claims] and an.metrics.keys() == ac.metrics.keys()
    shuffle = [k for k in an.metrics if k.startswith("shuffle/")]  # TF32 off inside: fp32 rounding only
    assert shuffle and all(an.metrics[k] == pytest.approx(ac.metrics[k], rel=1e-3, abs=1e-6) for k in shuffle)


# ---------------------------------------------------------------- the model on CUDA


@gpu
def test_compiled_explicit_path_and_bf16_on_cuda():
    """run_with_cache (explicit attention, scores and patterns) through a compiled CUDA model, and bf16 autocast."""
    eager, comp = _model().to(DEV), _model().to(DEV)
    comp.compile()
    x = torch.randint(0, 5, (4, 30), device=DEV)
    names = ["blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_post"]
    with tf32(False):
        le, ce = run_with_cache(eager, x, names)
        lc, cc = run_with_cache(comp, x, names)
        assert torch.allclose(lc, le, atol=1e-4)
        assert all(torch.allclose(cc[n], ce[n], atol=1e-4) for n in names)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lb, _ = eager(x)
    assert lb.dtype == torch.bfloat16 and torch.allclose(lb.float(), le, atol=0.05)


# ---------------------------------------------------------------- the group's own rule (runs by default)


def test_gpu_tests_skip_with_reason_or_fail_when_required(pytester, monkeypatch):
    """Without CUDA a gpu test is skipped with "CUDA not available" (and a summary line), never passed;
    with HMMSCOPE_REQUIRE_GPU=1 it is an error. (Inline pytest run on a one-test file with our conftest.)"""
    if torch.cuda.is_available():
        pytest.skip("checks the no-CUDA behaviour; this machine has CUDA")
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    pytester.makepyfile(test_x="import pytest\n\n@pytest.mark.gpu\ndef test_cuda():\n    assert True\n")
    monkeypatch.delenv("HMMSCOPE_REQUIRE_GPU", raising=False)
    r = pytester.runpytest("-m", "gpu", "-rs", "-p", "no:cacheprovider")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["1 gpu test(s) skipped: CUDA not available", "SKIPPED*CUDA not available"])
    monkeypatch.setenv("HMMSCOPE_REQUIRE_GPU", "1")
    r = pytester.runpytest("-m", "gpu", "-p", "no:cacheprovider")
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*CUDA not available*HMMSCOPE_REQUIRE_GPU is set*"])
