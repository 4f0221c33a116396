"""The benchmarks run and report ratios against their named peers (speed itself is never asserted)."""

import dataclasses

from hmmscope.bench import bench_filter, bench_sample, bench_train
from hmmscope.config import preset


def _positive(d, keys):
    return all(d[k] > 0 for k in keys)


def test_bench_sample_and_filter_small():
    s = bench_sample(n_seqs=64, length=16, peer_length=200, repeats=1, n_states=8, n_tokens=4, rank=2)
    assert _positive(s, ["ours_tokens_per_s", "hmmlearn_tokens_per_s", "ratio"])
    assert abs(s["ratio"] - s["ours_tokens_per_s"] / s["hmmlearn_tokens_per_s"]) < 1e-9
    f = bench_filter(n_seqs=64, length=16, peer_length=200, repeats=1, n_states=8, n_tokens=4, rank=2)
    assert _positive(f, ["ours_tokens_per_s", "hmmlearn_tokens_per_s", "ratio", "ratio_scaling"])


def test_bench_train_against_hf_roformer():
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1, d_model=32, n_heads=2, d_mlp=64))
    r = bench_train(cfg, "cpu", batch_size=2, seq_len=16, steps=1)
    assert _positive(r, ["ours_tokens_per_s", "hf_roformer_tokens_per_s", "ratio", "mfu"])
    assert r["shape"] == "1 layers x 32 x 2 heads, batch 2 x 16"
