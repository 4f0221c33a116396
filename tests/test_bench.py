"""The benchmarks run and report ratios against their named peers (speed itself is never asserted)."""

import dataclasses

import pytest

from hmmscope.bench import bench_counting, bench_filter, bench_oracle, bench_sample, bench_train
from hmmscope.config import preset


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
