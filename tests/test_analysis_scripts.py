"""analysis/*.py: each script runs on a tiny real sweep (real Optuna study, real MLflow sqlite store, real
training and analysis trials) and writes its figures (PNG + PDF) and tables; bad input exits 2 in one line."""

from __future__ import annotations

import csv
import importlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from hmmscope.sweep import run_sweep
from hmmscope.sweep_spec import load_spec

torch.set_num_threads(1)
os.environ["HMMSCOPE_THREADS"] = "1"
ROOT = Path(__file__).resolve().parents[1]

TRAIN = """
[sweep]
name = "tiny-train"
base = "tiny"
kind = "train"
sampler = "grid"
seeds = [0, 1]
analyze = true
experiment = "an"

[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"data.n_demos" = 2
"data.l_demo" = 8
"data.l_test" = 12
"data.test_start" = "midstream"
"data.burn_in" = 100
"data.n_train" = 64
"data.n_eval" = 16
"model.n_heads" = 2
"model.d_model" = 16
"model.d_mlp" = 32
"model.max_len" = 64
"train.steps" = 6
"train.batch_size" = 8
"train.warmup" = 0
"train.eval_every" = 6
"train.ckpt_every" = 6
"train.device" = "cpu"

"hmm.rank" = 2

[space]
"model.n_layers" = {grid = [1, 2]}
"""

WINDOWED = TRAIN.replace('name = "tiny-train"', 'name = "tiny-window"').replace("analyze = true", "").replace(
    "seeds = [0, 1]", "seeds = [0]").replace(
    '"model.max_len" = 64', '"model.max_len" = 64\n"model.window" = 3')

THEORY = """
[sweep]
name = "tiny-theory"
kind = "theory"
sampler = "grid"
seeds = [0]
experiment = "an"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 3, 4]
"theory.n_histories" = 200
"theory.burn_in" = 10

[space]
"theory.gammas" = {grid = [0.4, 0.6, 0.8]}
"theory.ranks" = {grid = [2]}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analysis")
    storage, uri = f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db"
    for name, text in (("train", TRAIN), ("window", WINDOWED), ("theory", THEORY)):
        (tmp / f"{name}.toml").write_text(text)
        s = run_sweep(load_spec(tmp / f"{name}.toml"), workers=2, storage=storage, uri=uri, log=lambda m: None)
        assert s.complete == s.n_trials and s.failed == 0
    return tmp, storage, uri


def script(name: str):
    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "analysis"))


def run(store, name: str, sweep: str, capsys) -> tuple[Path, str]:
    tmp, storage, uri = store
    out = tmp / "out" / name
    assert script(name).main(["--sweep", sweep, "--storage", storage, "--tracking-uri", uri, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    stems = {p.stem for p in out.glob("*.png")}
    assert stems and stems == {p.stem for p in out.glob("*.pdf")}  # every figure as PNG and PDF
    for p in out.glob("*.png"):
        assert f"figure: {p}" in text and p.stat().st_size > 5000
    return out, text


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_figure1(store, capsys):
    out, _ = run(store, "figure1", "tiny-train", capsys)
    r = rows(out / "figure1_by_k.csv")
    preds = {x["predictor"] for x in r}
    assert preds == {"model", "task_oracle", "mixture_oracle", "other_mixture_oracle", "incontext_unigram",
                     "incontext_bigram", "incontext_hmm"}
    assert {(x["tasks"], x["k"]) for x in r if x["predictor"] == "incontext_bigram"} == \
        {(t, str(k)) for t in ("seen", "unseen") for k in range(3)}  # both task sets, every k (k = 0 too)
    assert {x["n_seeds"] for x in r} == {"2"}  # two replicate seeds per cell
    for x in r:
        assert float(x["acc_lo"]) <= float(x["acc"]) <= float(x["acc_hi"])


def test_figure2_and_figure3_pool_the_analysis_runs(store, capsys):
    out, _ = run(store, "figure2", "tiny-train", capsys)
    r = rows(out / "figure2_by_layer.csv")
    assert {x["model.n_layers"] for x in r} == {"1", "2"}
    for n in (1, 2):  # layers 1..n_layers: block b's attention is layer b + 1, as in Figure 3
        assert {int(x["layer"]) for x in r if x["model.n_layers"] == str(n)} == set(range(1, n + 1))
    out, _ = run(store, "figure3", "tiny-train", capsys)
    r = rows(out / "figure3_probes.csv")
    assert {"task", "kback1"} <= {x["target"] for x in r}
    assert all(0 <= float(x["acc"]) <= 1 and x["n_seeds"] == "2" for x in r)


def test_practice_vs_theory(store, capsys):
    out, _ = run(store, "practice_vs_theory", "tiny-window", capsys)
    r = rows(out / "practice_vs_theory.csv")
    assert {int(x["receptive_field"]) for x in r} == {3, 5}  # n_layers (3 - 1) + 1 for 1 and 2 layers
    assert all(float(x["eps"]) > 0 for x in r)


def test_depth_vs_rank(store, capsys):
    out, text = run(store, "depth_vs_rank", "tiny-train", capsys)
    r = rows(out / "depth_vs_rank.csv")
    assert {(x["rank"], x["n_layers"]) for x in r} == {("2", "1"), ("2", "2")}
    need = rows(out / "depth_vs_rank_layers_needed.csv")
    assert [x["rank"] for x in need] == ["2"] and need[0]["layers_needed"] in ("1", "2")
    assert all("underpowered" in x["power"] for x in need)  # 2 seeds per cell: said plainly


def test_theorem1(store, capsys):
    out, text = run(store, "theorem1", "tiny-theory", capsys)
    rates = rows(out / "theorem1_rates.csv")
    assert sorted(float(x["gamma"]) for x in rates) == [0.4, 0.6, 0.8]
    fits = rows(out / "theorem1_exponents.csv")
    pooled = next(x for x in fits if x["scope"] == "pooled")
    k, lo, hi = float(pooled["k"]), float(pooled["k_lo"]), float(pooled["k_hi"])
    assert math.isfinite(k) and lo <= k <= hi and f"k = {k:.2f}" in text


def test_bad_input_exits_2_in_one_line(store, capsys):
    tmp, storage, uri = store
    for name, sweep in (("figure1", "no-such-sweep"), ("theorem1", "tiny-train"), ("figure1", "tiny-theory"),
                        ("figure2", "tiny-window"), ("practice_vs_theory", "tiny-train")):
        with pytest.raises(SystemExit) as e:
            script(name).main(["--sweep", sweep, "--storage", storage, "--tracking-uri", uri,
                               "--out", str(tmp / "bad")])
        msg = capsys.readouterr().err.strip()
        assert e.value.code == 2 and msg.startswith("error:") and "\n" not in msg
