"""The benchmarks run and report ratios against their named peers (speed itself is never asserted)."""

import dataclasses

import pytest

from hmmscope.config import preset
from hmmscope.training.bench import bench_train
from hmmscope.training.bench_inference import bench_counting, bench_filter, bench_oracle, bench_sample
from hmmscope.training.bench_variants import bench_variants, choose_variant, parse_variant


def _positive(d, keys):
    return all(d[k] > 0 for k in keys)


def test_bench_sample_and_filter_small():
    s = bench_sample(n_seqs=64, length=16, peer_length=200, repeats=1, n_states=8, n_tokens=4, rank=2)
    assert _positive(s, ["ours_tokens_per_s", "hmmlearn_tokens_per_s", "ratio"])
    assert abs(s["ratio"] - s["ours_tokens_per_s"] / s["hmmlearn_tokens_per_s"]) < 1e-9
    f = bench_filter(n_seqs=64, length=16, peer_length=200, repeats=1, n_states=8, n_tokens=4, rank=2)
    assert _positive(f, ["dense_f32_tokens_per_s", "dense_f64_tokens_per_s", "lowrank_f32_tokens_per_s",
                         "hmmlearn_log_tokens_per_s", "hmmlearn_scaling_tokens_per_s", "gemm_dense_flops",
                         "gemm_lowrank_flops", "dense_frac_gemm", "lowrank_frac_gemm"])
    assert abs(f["ratio_log"] - f["dense_f32_tokens_per_s"] / f["hmmlearn_log_tokens_per_s"]) < 1e-9
    assert abs(f["dense_frac_gemm"] - f["dense_f32_tokens_per_s"] * 2 * 8 * 8 / f["gemm_dense_flops"]) < 1e-9
    assert f["f32_vs_f64_max_abs"] < 1e-6 and f["lowrank_vs_dense_max_abs"] < 1e-6  # the paths agree


def test_bench_oracle_small():
    r = bench_oracle((8,), n_episodes=2, full_episodes=4)
    (row,) = r["rows"]
    assert row["n_tasks"] == 8 and _positive(row, ["seconds", "torch_path_ratio"])
    assert abs(row["extrapolated_full_s"] - (row["tables_s"] + (row["seconds"] - row["tables_s"]) * 2)) < 1e-9


def test_bench_counting_small():
    r = bench_counting(n_episodes=4, rounds=1, fit_episodes=6)
    assert r["seq_len"] == 358 and r["n_tokens"] == 16
    assert _positive(r, ["bigram_s", "ngram_s", "ctw_s", "fit_s", "fit_bigram_s"])
    assert abs(r["ctw_ratio"] - r["ctw_s"] / r["bigram_s"]) < 1e-12
    assert abs(r["fit_ratio"] - r["fit_s"] / r["fit_bigram_s"]) < 1e-12


def test_bench_train_against_hf_roformer():
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1, d_model=32, n_heads=2, d_mlp=64))
    r = bench_train(cfg, "cpu", batch_size=2, seq_len=16, steps=1, profile=True)
    assert _positive(r, ["ours_tokens_per_s", "hf_roformer_tokens_per_s", "ratio", "mfu"])
    assert r["shape"] == "1 layers x 32 x 2 heads, batch 2 x 16"
    assert r["mfu_denominator"] == "fp32"
    assert r["mfu"] == pytest.approx(r["ours_tflops"] * 1e12 / r["measured_rates"]["fp32"], rel=1e-12)  # float rounding
    p = r["profile"]  # the sources add up to the step
    assert abs(p["ideal_s"] + p["attention_s"] + p["optimizer_s"] + p["other_s"] - p["step_s"]) < 1e-9
    assert p["optimizer_s"] > 0 and p["data_s"] > 0


@pytest.mark.slow
def test_bench_train_compile_reports_break_even():
    """--compile: eager and compiled step times, the compile time, and the steps it takes to pay (inductor on the CPU)."""
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1, d_model=32, n_heads=2, d_mlp=64))
    r = bench_train(cfg, "cpu", batch_size=2, seq_len=16, steps=1, peer=False, compile=True)
    assert r["compiled"] and _positive(r, ["eager_step_s", "compiled_step_s", "compile_s", "break_even_steps"])
    assert r["compile_s"] > r["compiled_step_s"]  # compiling costs more than a step
    if r["eager_step_s"] > r["compiled_step_s"]:
        assert r["break_even_steps"] == pytest.approx(r["compile_s"] / (r["eager_step_s"] - r["compiled_step_s"]))
    else:
        assert r["break_even_steps"] == float("inf")


def test_bench_oracle_cli_rejects_bad_counts():
    from typer.testing import CliRunner

    from hmmscope.cli import app

    for bad in (["--n-tasks", "8,x"], ["--n-tasks", "0"], ["--dtype", "float16"], ["--chunk-tasks", "0"],
                ["--chunk-tasks", "auto,x"], ["--device", "tpu"], ["--device", "cuda:99"],
                ["--chunk-tasks", "256"]):
        r = CliRunner().invoke(app, ["bench", "oracle", *bad])
        assert r.exit_code == 2, r.output
        assert len(r.output.strip().splitlines()) == 1


def _tiny_model_cfg():
    cfg = preset("tiny")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1, d_model=32, n_heads=2, d_mlp=64))


def test_bench_variants_rows_from_the_same_weights():
    """--variants: every variant from the same weights on the same batch (math attention = the default's losses up
    to float rounding), MFU against the GEMM rate measured once; a kernel the device lacks gives an error row and
    the others still run; rows are handed out as they are done."""
    seen, heads = [], []
    r = bench_variants(_tiny_model_cfg(), "cpu", batch_size=2, seq_len=16, steps=1, repeats=1,
                       variants=("eager", "eager+cudnn", "eager+math"), on_start=heads.append, on_row=seen.append)
    eager, cudnn, math_ = r["rows"]
    assert seen == r["rows"] and heads[0]["gemm_rate"] == r["gemm_rate"] > 0 and "rows" not in heads[0]
    assert cudnn["error"] == "ValueError: train.attention=cudnn needs a CUDA device, got cpu"
    assert (eager["compile"], eager["attention"], math_["attention"]) == ("false", "auto", "math")
    for row in (eager, math_):
        assert row["error"] is None and _positive(row, ["step_s", "first_step_s", "tokens_per_s", "mfu"])
        assert row["mfu"] == pytest.approx(row["tflops"] * 1e12 / r["gemm_rate"], rel=1e-12)
        assert row["compile_s"] == pytest.approx(max(row["first_step_s"] - row["step_s"], 0.0))
    assert eager["loss_first_rel"] == 0 and math_["loss_first_rel"] < 1e-5 and math_["loss_last_rel"] < 1e-4
    assert r["precision"] == "fp32" and r["gemm_dtype"] == "float32"


def test_parse_variant():
    assert parse_variant("eager") == ("false", "auto") and parse_variant("blocks+cudnn") == ("blocks", "cudnn")
    assert parse_variant("model") == ("true", "auto")
    for bad in ("compiled", "eager+fast", "eager+flash+math", ""):
        with pytest.raises(ValueError, match="unknown step variant"):
            parse_variant(bad)


def _row(name, step_s, compile_s, first=0.0, last=0.0, error=None):
    return {"variant": name, "step_s": step_s, "compile_s": compile_s, "loss_first_rel": first, "loss_last_rel": last,
            "error": error}


def test_choose_variant_counts_the_compile_time():
    """The pick fits the most steps into the budget, each variant's one-off compile time counted against it: a
    compiled step 20% faster pays only when the budget is long enough; wrong losses and errors are left out."""
    rows = [_row("eager", 0.050, 0.5), _row("eager+cudnn", 0.049, 0.5, first=0.5), _row("blocks", 0.040, 30.0),
            _row("model", 0.001, 1.0, error="RuntimeError: boom")]
    best, why = choose_variant(rows, 100.0)
    assert best["variant"] == "eager"  # 100 s: eager 1990 steps, blocks (100 - 30) / 0.04 = 1750
    assert "eager+cudnn: left out (loss differs" in why[1] and why[3] == "model: left out (RuntimeError: boom)"
    best, _ = choose_variant(rows, 300.0)
    assert best["variant"] == "blocks"  # 300 s: eager 5990 steps, blocks 6750
    best, _ = choose_variant(rows, 300.0, ratio=2.0)  # the training step's time over the bench's: the same pick
    assert best["variant"] == "blocks"
    assert choose_variant([rows[3]], 100.0)[0] is None


def test_bench_train_cli_variants_json(tmp_path):
    """`bench train --variants ... --json F`: a line per variant, and F holds the head and the rows done (rewritten
    as each is done); bad input exits 2 in one line and writes nothing."""
    import json

    from typer.testing import CliRunner

    from hmmscope.cli import app

    small = ["--preset", "tiny", "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.d_mlp=64",
             "--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--steps", "1", "--no-peer"]
    out = tmp_path / "v.json"
    r = CliRunner().invoke(app, ["bench", "train", *small, "--variants", "eager,eager+cudnn", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "eager+cudnn    error: ValueError: train.attention=cudnn needs a CUDA device" in r.output
    d = json.loads(out.read_text())
    assert [row["variant"] for row in d["rows"]] == ["eager", "eager+cudnn"] and d["gemm_rate"] > 0
    for bad in (["--variants", "eager,fast"], ["--json", str(tmp_path / "w.json")],
                ["--variants", "eager", "--compile"], ["--variants", "eager", "--json", str(tmp_path / "w.txt")]):
        r = CliRunner().invoke(app, ["bench", "train", *small, *bad])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, (bad, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json"]


def test_mfu_denominator_is_the_machines_large_gemm_not_the_models_tiny_one():
    """Issue 33 item 5 / 37: bench train printed 86-121% MFU on a 2 x 64 model, against a GEMM of the model's own
    tiny shape (0.005 TFLOP/s under load). The denominator is now the best of the model's GEMM and a large square
    one (2048^3), both measured in the same run; bench train and bench train --variants alike."""
    from hmmscope.training.bench import LARGE_GEMM

    big = f"({LARGE_GEMM}, {LARGE_GEMM}) x ({LARGE_GEMM}, {LARGE_GEMM})"
    r = bench_train(_tiny_model_cfg(), "cpu", batch_size=2, seq_len=16, steps=1, peer=False)
    rates = r["gemm_rates"]["fp32"]
    assert set(rates) == {"(32, 32) x (32, 64)", big}
    assert r["measured_rates"]["fp32"] == max(rates.values()) and r["gemm_shapes"]["fp32"] == max(rates, key=rates.get)
    assert r["mfu"] == pytest.approx(r["ours_tflops"] * 1e12 / max(rates.values()), rel=1e-12)
    v = bench_variants(_tiny_model_cfg(), "cpu", batch_size=2, seq_len=16, steps=1, repeats=1, variants=("eager",))
    assert big in v["gemm_rates"] and v["gemm_rate"] == max(v["gemm_rates"].values())
    assert v["gemm_shape"] == max(v["gemm_rates"], key=v["gemm_rates"].get)


def test_bench_variants_compile_scopes_match_eager():
    """The candidates for 55% MFU (issue 37), each from the same weights with its loss against eager's: the whole
    model compiled with max-autotune-no-cudagraphs or reduce-overhead (CUDA graphs), compiled blocks, and compiled
    blocks with the fused head (norm, unembedding, cross-entropy). Here the CPU twin (backend aot_eager: the
    graphs, not inductor's kernels): every variant runs and its losses match eager's."""
    names = ("eager", "model", "model-autotune", "model-graphs", "blocks", "blocks-head", "blocks-head+math")
    assert [parse_variant(n)[0] for n in names] == ["false", "true", "model-autotune", "model-graphs", "blocks",
                                                    "blocks-head", "blocks-head"]
    from hmmscope.config import override

    for n in names:  # the plan trains what it picks: train.compile takes every variant's scope
        assert override(preset("tiny"), {"train.compile": parse_variant(n)[0]}).train.compile == parse_variant(n)[0]
    r = bench_variants(_tiny_model_cfg(), "cpu", batch_size=2, seq_len=16, steps=2, repeats=1, variants=names,
                       compile_kw={"backend": "aot_eager"})
    for row in r["rows"]:
        assert row["error"] is None, row
        assert row["loss_first_rel"] < 1e-5 and row["loss_last_rel"] < 1e-4, row
