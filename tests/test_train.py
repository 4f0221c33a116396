import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from hmmscope import tracking
from hmmscope.config import Config, ConfigError, TrainConfig, flatten, override
from hmmscope.data.episodes import sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.interrupts import sigterm_interrupts
from hmmscope.pipeline.run import train
from hmmscope.training.checkpoints import checkpoint_config, load_checkpoint, load_model, model_from_checkpoint, read_checkpoint
from hmmscope.training.device import resolve_precision
from hmmscope.training.learning_curve import evaluate_loss
from hmmscope.training.schedule import epochs_done, lr_at
from hmmscope.training.train import DivergedError, batch_indices, resolve_device

torch.set_num_threads(1)

SMALL = {
    "hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2,
    "data.n_demos": 2, "data.l_demo": 8, "data.l_test": 8, "data.n_train": 96, "data.n_eval": 32,
    "model.n_layers": 1, "model.n_heads": 2, "model.d_model": 32, "model.d_mlp": 64, "model.max_len": 64,
    "train.steps": 12, "train.batch_size": 8, "train.warmup": 2, "train.eval_every": 6, "train.ckpt_every": 6,
    "train.device": "cpu", "eval.family_tasks": 16, "eval.fit_episodes": 16,
    "eval.bayes_tol": 0.01,  # the Bayes reference converges at K <= 128 here (at 0.002 it does not by K = 512: S = 8, d = 2)
}


def small(**kw) -> Config:
    return override(Config(), {**SMALL, **kw})


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"


@pytest.fixture(scope="module")
def finished(uri):
    return train(small(), tracking_uri=uri, experiment="t", run_name="base", progress=False, log_every=3)


def test_lr_schedule():
    t = TrainConfig(steps=110, warmup=10, lr=1.0, min_lr=0.1)
    assert lr_at(0, t) == pytest.approx(0.1) and lr_at(4, t) == pytest.approx(0.5)
    assert lr_at(9, t) == pytest.approx(1.0) and lr_at(10, t) == pytest.approx(1.0)
    assert lr_at(60, t) == pytest.approx(0.55)  # half-way through the cosine: (lr + min_lr) / 2
    assert lr_at(110, t) == pytest.approx(0.1) and lr_at(500, t) == pytest.approx(0.1)
    assert all(lr_at(s, t) >= lr_at(s + 1, t) for s in range(10, 120))
    assert lr_at(0, TrainConfig(warmup=0, lr=2.0)) == pytest.approx(2.0)


def test_lr_schedules_constant_and_wsd():
    base = dict(steps=110, warmup=10, lr=1.0, min_lr=0.1)
    c = TrainConfig(**base, schedule="constant")
    assert lr_at(4, c) == pytest.approx(0.5)  # the same warmup
    assert [lr_at(s, c) for s in (10, 60, 109, 110, 500)] == [1.0] * 5
    w = TrainConfig(**base, schedule="wsd", decay_frac=0.2)  # decay over the last 22 steps: 88 .. 110
    assert lr_at(4, w) == pytest.approx(0.5) and lr_at(10, w) == 1.0 and lr_at(87, w) == 1.0
    assert lr_at(88, w) == pytest.approx(1.0) and lr_at(99, w) == pytest.approx(1.0 - 0.9 * 11 / 22)
    assert lr_at(109, w) == pytest.approx(1.0 - 0.9 * 21 / 22) and lr_at(110, w) == pytest.approx(0.1)
    assert all(lr_at(s, w) >= lr_at(s + 1, w) for s in range(10, 120))
    # the decay never starts inside the warmup, and lasts at least one step
    assert lr_at(10, TrainConfig(**{**base, "warmup": 100}, schedule="wsd", decay_frac=0.5)) == 1.0 * 11 / 100
    assert lr_at(100, TrainConfig(**{**base, "warmup": 100}, schedule="wsd", decay_frac=0.5)) == 1.0
    assert lr_at(109, TrainConfig(**base, schedule="wsd", decay_frac=0.001)) == 1.0
    with pytest.raises(ConfigError, match="train.schedule must be one of"):
        small(**{"train.schedule": "linear"})
    with pytest.raises(ConfigError, match=r"train.decay_frac must be in \(0, 1\]"):
        small(**{"train.decay_frac": 0.0})


def test_batch_order_depends_on_seed_and_step_only():
    a = [batch_indices(s, 20, 8, 3) for s in range(5)]  # 40 items = two epochs of 20
    assert np.array_equal(np.sort(np.concatenate(a[:2] + [a[2][:4]])), np.arange(20))
    assert np.array_equal(a[3], batch_indices(3, 20, 8, 3))
    assert not np.array_equal(a[0], batch_indices(0, 20, 8, 4))
    assert epochs_done(5, 20, 8) == 2.0 and epochs_done(262144, 131072, 32) == 64.0


def test_paper_budget_readings():
    from hmmscope.config import preset

    lit, ep = preset("paper"), preset("paper-epochs")
    assert epochs_done(lit.train.steps, lit.data.n_train, lit.train.batch_size) == 1.0
    assert epochs_done(ep.train.steps, ep.data.n_train, ep.train.batch_size) == 64.0
    assert flatten(lit) == {**flatten(ep), "train.steps": 4096, "train.eval_every": 512, "train.ckpt_every": 1024}


def test_run_logs_params_metrics_checkpoint(uri, finished):
    r = tracking.Run(uri, finished.run_id).get()
    assert r.info.status == "FINISHED"
    # a training run's params: its own config sections (never theory.*), the same names for every training run
    want = {k: tracking.param_value(v) for k, v in flatten(small()).items() if not k.startswith("theory.")}
    assert r.data.params == want and not any(k.startswith("theory.") for k in r.data.params)
    tags = r.data.tags
    assert tags["hmmscope.device"] == "cpu" and int(tags["hmmscope.n_params"]) > 0
    assert tags["hmmscope.precision"] == "fp32" and r.data.params["train.compile"] == "auto"  # CPU defaults
    assert tags["hmmscope.compiled"] == "false"  # auto: eager on the CPU
    assert tags["hmmscope.dataset_hash"] and tags["hmmscope.hmm_hash"] and "hmmscope.code_version" in tags
    c = tracking.client(uri)
    steps = lambda k: [m.step for m in c.get_metric_history(finished.run_id, k)]  # noqa: E731
    assert steps("train/loss") == [3, 6, 9, 12] and steps("train/lr") == [3, 6, 9, 12]
    assert steps("val/loss") == [0, 6, 12] and steps("val/test_acc") == [0, 6, 12]
    assert steps("oracle/acc") == [0] and steps("val/excess_ce") == [0, 6, 12]
    hist = lambda k: [(m.step, m.value) for m in sorted(c.get_metric_history(finished.run_id, k), key=lambda m: m.step)]  # noqa: E731
    assert hist("Loss/train") == hist("train/loss") and hist("Loss/val") == hist("val/loss")  # first on the run page
    for k in ("train/grad_norm", "train/tokens_per_s", "val/acc", "val/test_loss", "oracle/loss", "oracle/acc"):
        assert k in r.data.metrics
    # one key, one meaning: the oracle's test segment is Figure 1's eval/seen/oracle_mix_test_*, not logged here
    assert "oracle/test_acc" not in r.data.metrics and "oracle/test_loss" not in r.data.metrics
    m = finished.metrics
    assert m["val/excess_ce"] == pytest.approx(m["val/test_loss"] - m["oracle/test_loss"])
    assert 0 < m["oracle/test_loss"] < math.log(4) and finished.steps == 12
    first = c.get_metric_history(finished.run_id, "val/loss")[0].value
    assert m["val/loss"] < first  # it learns something in 12 steps


def test_epochs_and_emergence_curves(uri, finished, tmp_path):
    """train/epoch, the budget tags, the emergence curves (issue 29.6: a few headline series as metrics, the per-k
    curves as one table artifact and the figure; issue 26.1: the gain on the same tokens, 0 for the task oracle),
    and the curves at the last step equal to Figure 1 on the same episodes."""
    from hmmscope.data.episodes import unseen_episodes
    from hmmscope.measure.bayes_gap import bayes_spec
    from hmmscope.measure.emergence import key, subset
    from hmmscope.measure.evaluate import eval_set, figure1_tables, references

    c = tracking.client(uri)
    hist = lambda k: [(m.step, m.value) for m in c.get_metric_history(finished.run_id, k)]  # noqa: E731
    assert hist("train/epoch") == [(3, 0.25), (6, 0.5), (9, 0.75), (12, 1.0)]  # 96 episodes, batch 8
    tags = tracking.Run(uri, finished.run_id).get().data.tags
    assert tags["hmmscope.epochs"] == "1" and tags["hmmscope.episodes_per_task"] == "24"
    assert tags["hmmscope.tasks"] == "mixture"
    logged = set(tracking.Run(uri, finished.run_id).get().data.metrics)
    em_keys = {k for k in logged if k.startswith("emergence/")}
    assert em_keys == {"emergence/seen/icl_gain", "emergence/seen/ce_kmax", "emergence/unseen/icl_gain",
                       "emergence/unseen/ce_kmax", "emergence/unseen/vs_best_counting", "emergence/unseen/vs_bayes"}
    curves = finished.extra["emergence"]
    assert [h["step"] for h in curves] == [0, 6, 12]
    for tasks in ("seen", "unseen"):
        assert [s for s, _ in hist(f"emergence/{tasks}/icl_gain")] == [0, 6, 12]
        assert [v for _, v in hist(f"emergence/{tasks}/ce_kmax")] == [h[key(tasks, "ce", 2)] for h in curves]
        for ref in ("task_oracle", "incontext_unigram", "incontext_bigram", "best_counting"):
            assert len({h[key(tasks, "icl_gain", ref=ref)] for h in curves}) == 1  # a constant
        assert curves[-1][key(tasks, "icl_gain", ref="task_oracle")] == 0.0  # the same tokens at both k
        assert curves[0][key(tasks, "ce", 2)] != curves[-1][key(tasks, "ce", 2)]  # the model's curve moves
    assert key("unseen", "icl_gain", ref="family_bayes") in curves[-1]
    # the last point is Figure 1 on the first train.emergence_episodes episodes (here all 32 of data.n_eval)
    cfg = finished.config
    mix = make_mixture(cfg.hmm)
    n = cfg.train.emergence_episodes
    assert n == 64 and cfg.data.n_eval == 32  # the default asks for 64; a run has only data.n_eval
    ep = subset(sample_episodes(mix, cfg.data, cfg.data.n_eval, "eval"), n)
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, cfg.data.n_eval)
    family, counting = references(cfg.hmm, cfg.data, cfg.eval)
    sets = [eval_set(mix, ep, learner=None, counting=counting),
            eval_set(mix, subset(uep, n), tasks="unseen", task_mix=umix, learner=None, family=family, counting=counting,
                     bayes=bayes_spec(cfg))]
    fig1 = figure1_tables(finished.model, sets)
    gains = {(g["tasks"], g["predictor"]): g["icl_gain"] for g in fig1.gains}
    for tasks in ("seen", "unseen"):
        assert curves[-1][key(tasks, "icl_gain")] == pytest.approx(gains[(tasks, "model")], rel=1e-9)
        for k in (0, 1, 2):
            assert curves[-1][key(tasks, "ce", k)] == pytest.approx(fig1.row("model", k, tasks)["ce"], rel=1e-9)
            assert curves[-1][key(tasks, "acc", k)] == pytest.approx(fig1.row("model", k, tasks)["acc"])
            for ref in ("task_oracle", "incontext_bigram", "best_counting"):
                assert curves[-1][key(tasks, "ce", k, ref)] == pytest.approx(fig1.row(ref, k, tasks)["ce"], rel=1e-9)
    assert curves[-1][key("unseen", "vs_best_counting")] == pytest.approx(
        fig1.row("model", 2, "unseen")["ce"] - fig1.row("best_counting", 2, "unseen")["ce"], abs=1e-9)
    assert curves[-1][key("unseen", "vs_bayes")] == pytest.approx(fig1.bayes["gap"], abs=1e-9)  # the Bayes gap
    assert len({h[key("unseen", "ce", 2, "bayes")] for h in curves}) == 1  # a constant
    arts = {a.path for a in c.list_artifacts(finished.run_id, "figures")}
    assert arts == {"figures/emergence.png", "figures/emergence.pdf"}
    table = json.loads(tracking.Run(uri, finished.run_id).download("emergence/curves.json", tmp_path).read_text())
    cols = dict(zip(table["columns"], zip(*table["data"])))
    assert set(cols["step"]) == {0, 6, 12} and {"model", "task_oracle", "best_counting"} <= set(cols["predictor"])
    m = tracking.Run(uri, finished.run_id).get().data.metrics
    assert 0 < m["train/eval_fraction"] < 1 and m["train/eval_s"] > 0
    assert not any(k.startswith("emergence/") for k in finished.metrics)  # curves are histories, not final metrics


def test_emergence_off():
    from hmmscope.measure.emergence import prepare

    cfg = small(**{"train.emergence_episodes": 0})
    assert prepare(cfg, make_mixture(cfg.hmm), sample_episodes(make_mixture(cfg.hmm), cfg.data, 4, "eval")) is None


def test_training_measures_through_the_callers_monitor_and_imports_no_measurement(uri):
    """Issue 49: training/ imports nothing of measure/ (before: train and its setup built the references and the
    emergence curves themselves); what a run measures beside its learning curve is the monitor its caller hands in
    (the pipeline's: pipeline.measures). Without one, a run logs train/* and val/* only, the same val/* numbers."""
    import ast

    import hmmscope.training
    from hmmscope.training.train import train as train_only

    folder = Path(hmmscope.training.__file__).parent
    # bench_inference.py benchmarks every stage (sampling, filters, oracles, counting, headroom) beside training's
    # step (bench.py): not training's
    imports = [(p.name, (n.module or "").split(".")[0 if n.level else 1:]) for p in folder.glob("*.py")
               if p.name != "bench_inference.py" for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom)]
    named = {f"{f}: {'.'.join(m)}" for f, m in imports if m[:1] == ["measure"]}
    assert named == set()
    cfg = small(**{"train.steps": 2, "train.eval_every": 2, "train.ckpt_every": 2, "train.emergence_episodes": 0,
                   "eval.family_tasks": 0, "eval.fit_episodes": 0})
    plain = train_only(cfg, tracking_uri=uri, experiment="monitor", progress=False)
    measured = train(cfg, tracking_uri=uri, experiment="monitor", progress=False)
    logged = set(tracking.Run(uri, plain.run_id).get().data.metrics)
    assert {"val/loss", "val/test_loss", "train/loss"} <= logged and not {k for k in logged if k.startswith(
        ("oracle/", "emergence/", "val/excess_ce"))}
    assert {"oracle/test_loss", "val/excess_ce"} <= set(measured.metrics)
    assert plain.metrics["val/loss"] == measured.metrics["val/loss"] and plain.extra["emergence"] == []


def test_load_model_round_trip(uri, finished, tmp_path):
    ck = load_checkpoint(uri, finished.run_id, tmp_path)
    assert ck["step"] == 12 and set(ck["rng"]) >= {"torch", "numpy", "python"}
    model, cfg = load_model(uri, finished.run_id)
    assert cfg == small()
    ep = sample_episodes(make_mixture(cfg.hmm), cfg.data, cfg.data.n_eval, "eval")
    assert evaluate_loss(model, ep)["loss"] == finished.metrics["val/loss"]
    model2, _ = load_model(uri, finished.run_id)
    x = torch.as_tensor(ep.tokens[:4].astype(np.int64))
    assert torch.equal(model(x)[0], model2(x)[0])


@pytest.mark.parametrize("schedule", ["constant", "wsd"])
def test_resume_is_bitwise_for_every_schedule(uri, schedule):
    """Resuming mid-run equals the uninterrupted run on the CPU, for the constant and wsd schedules (the
    cosine one: test_resume_matches_uninterrupted_run). 16 steps of 8 over 96 episodes (an epoch is 12 steps)
    with the kill after step 8, so the epoch boundary and the wsd decay (steps 12-16) both come after the resume."""
    cfg = small(**{"train.schedule": schedule, "train.decay_frac": 0.25, "train.steps": 16, "train.eval_every": 8,
                   "train.ckpt_every": 8, "train.emergence_episodes": 8})
    full = train(cfg, tracking_uri=uri, experiment=f"s-{schedule}", progress=False, log_every=1)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tracking_uri=uri, experiment=f"s-{schedule}", progress=False, log_every=1, _stop_after=8)
    killed = _latest_run(uri, f"s-{schedule}")
    res = train(cfg, tracking_uri=uri, experiment=f"s-{schedule}", resume=killed.info.run_id, progress=False,
                log_every=1)
    c = tracking.client(uri)
    for key in ("train/loss", "train/lr", "emergence/unseen/ce_kmax", "emergence/unseen/icl_gain"):
        a = [(m.step, m.value) for m in c.get_metric_history(full.run_id, key)]
        b = sorted((m.step, m.value) for m in c.get_metric_history(res.run_id, key))
        assert a == b, key
    a, b = full.model.state_dict(), res.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert res.extra["emergence"] == full.extra["emergence"]  # the figure's history survives the resume


def _reference_losses(cfg: Config, steps: int) -> list[float]:
    """The training loop as it was before the loop kept losses on the device (loss.item() every step, eager,
    float32): the per-step losses a CPU run must reproduce bit for bit."""
    import random

    from hmmscope.model.transformer import Transformer
    mix = make_mixture(cfg.hmm)
    ep = sample_episodes(mix, cfg.data, cfg.data.n_train, "train")
    t = cfg.train
    tokens = torch.as_tensor(ep.tokens.astype(np.int64))
    mask = torch.as_tensor(ep.target_mask[:-1]).expand(t.batch_size, -1)
    torch.manual_seed(t.seed)
    np.random.seed(t.seed)
    random.seed(t.seed)
    model = Transformer(cfg.model, ep.vocab_size)
    opt = model.configure_optimizers(t.weight_decay, t.lr, (t.beta1, t.beta2))
    model.train()
    out = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        batch = tokens[torch.as_tensor(batch_indices(step, len(ep), t.batch_size, t.seed))]
        _, loss = model(batch[:, :-1], batch[:, 1:], mask)
        out.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip).item()
        opt.step()
    return out


def test_cpu_loop_losses_bitwise_as_before(uri):
    """The default model, optimizer and schedule (fewer steps and episodes): train/loss logged every step equals
    the old per-step-sync loop's losses exactly."""
    cfg = override(Config(), {"train.device": "cpu", "train.steps": 4, "train.warmup": 2, "data.n_train": 64,
                              "data.n_eval": 8, "train.emergence_episodes": 4})
    res = train(cfg, tracking_uri=uri, experiment="bitwise", progress=False, log_every=1)
    got = [m.value for m in sorted(tracking.client(uri).get_metric_history(res.run_id, "train/loss"),
                                   key=lambda m: m.step)]
    assert got == _reference_losses(cfg, 4)


def test_resume_matches_uninterrupted_run(uri, finished):
    with pytest.raises(KeyboardInterrupt):
        train(small(), tracking_uri=uri, experiment="t", progress=False, _stop_after=6)
    killed = tracking.client(uri).search_runs(
        [tracking.experiment_id(uri, "t")], order_by=["attributes.start_time DESC"], max_results=1)[0]
    assert killed.info.status == "KILLED"
    with pytest.raises(ValueError, match="model.d_model"):
        train(small(**{"model.d_model": 64}), tracking_uri=uri, experiment="t", resume=killed.info.run_id)
    res = train(small(), tracking_uri=uri, experiment="t", resume=killed.info.run_id, progress=False)
    assert res.run_id == killed.info.run_id and res.steps == 12
    assert res.metrics["val/loss"] == finished.metrics["val/loss"]
    assert res.metrics["val/test_acc"] == finished.metrics["val/test_acc"]
    a, _ = load_model(uri, finished.run_id)
    b, _ = load_model(uri, res.run_id)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    r = tracking.Run(uri, res.run_id).get()
    assert r.info.status == "FINISHED"
    assert [m.step for m in tracking.client(uri).get_metric_history(res.run_id, "val/loss")] == [0, 6, 12]


def test_divergence_fails_the_run(uri):
    cfg = small(**{"train.lr": 1e6, "train.min_lr": 1e6, "train.warmup": 0, "train.grad_clip": 1e30})
    with pytest.raises(DivergedError, match=r"non-finite .* at step \d+"):
        train(cfg, tracking_uri=uri, experiment="div", run_name="boom", progress=False)
    (r,) = tracking.client(uri).search_runs([tracking.experiment_id(uri, "div")])
    assert r.info.status == "FAILED"
    assert "DivergedError: non-finite" in r.data.tags["hmmscope.failure_reason"]


def test_resume_without_checkpoint_raises(uri):
    with tracking.start_run(uri, "t", "empty") as run:
        pass
    with pytest.raises(ValueError, match=f"run {run.run_id} has no checkpoint"):
        train(small(), tracking_uri=uri, experiment="t", resume=run.run_id, progress=False)
    assert run.get().info.status == "FINISHED"  # left as it was


def test_bad_device_raises():
    with pytest.raises(ValueError, match="device"):
        train(small(**{"train.device": "tpu"}), tracking_uri="sqlite:///unused.db")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    assert resolve_device("cpu").type == "cpu"


# ---------------------------------------------------------------- the CUDA path's choices, on the CPU


def test_compile_knob():
    from hmmscope.config import from_flat
    from hmmscope.training.device import resolve_compile

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert Config().train.compile == "auto"
    assert not resolve_compile("auto", cpu) and resolve_compile("auto", cuda)
    assert resolve_compile("true", cpu) and not resolve_compile("false", cuda) and resolve_compile("blocks", cpu)
    # booleans (TOML true / false, an older checkpoint's saved config) and the CLI's strings
    assert small(**{"train.compile": True}).train.compile == "true"
    assert small(**{"train.compile": "false"}).train.compile == "false"
    assert from_flat({**flatten(small()), "train.compile": False}).train.compile == "false"
    with pytest.raises(ConfigError, match=r"train.compile must be one of \('auto', 'true', 'false', 'blocks', 'blocks-head', "
                                          r"'model-autotune', 'model-graphs'\), got 'yes'"):
        small(**{"train.compile": "yes"})


def test_attention_knob_is_a_runtime_key(uri, finished):
    """train.attention pins the training step's SDPA kernel: math (the reference kernel) trains to the default's
    numbers up to float rounding, tagged; a run may be resumed with another kernel (a run-time key); a kernel the
    device lacks fails before any run is made."""
    assert Config().train.attention == "auto"
    with pytest.raises(ConfigError, match=r"train.attention must be one of \('auto', 'flash', 'efficient', 'cudnn', "
                                          r"'math'\), got 'fast'"):
        small(**{"train.attention": "fast"})
    n_runs = len(tracking.client(uri).search_runs([tracking.experiment_id(uri, "t")]))
    with pytest.raises(ValueError, match="train.attention=cudnn needs a CUDA device"):
        train(small(**{"train.attention": "cudnn"}), tracking_uri=uri, experiment="t", progress=False)
    assert len(tracking.client(uri).search_runs([tracking.experiment_id(uri, "t")])) == n_runs  # no run made
    with pytest.raises(KeyboardInterrupt):
        train(small(**{"train.attention": "math"}), tracking_uri=uri, experiment="att", progress=False, log_every=3,
              _stop_after=6)
    run_id = _latest_run(uri, "att").info.run_id
    assert tracking.Run(uri, run_id).get().data.tags["hmmscope.attention"] == "math"
    res = train(small(**{"train.attention": "flash"}), tracking_uri=uri, experiment="att", resume=run_id,
                progress=False, log_every=3)
    assert res.steps == 12 and tracking.Run(uri, run_id).get().data.tags["hmmscope.attention"] == "flash"
    assert res.metrics["val/loss"] == pytest.approx(finished.metrics["val/loss"], rel=1e-5)


def test_precision_knob():
    assert Config().train.precision == "auto" and small(**{"train.precision": "bf16"}).train.precision == "bf16"
    with pytest.raises(ConfigError, match=r"train.precision must be one of \('auto', 'bf16', 'fp32'\), got 'fp16'"):
        small(**{"train.precision": "fp16"})
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_precision("auto", cpu) == "fp32" and resolve_precision("auto", cuda) == "bf16"
    assert resolve_precision("bf16", cpu) == "bf16" and resolve_precision("fp32", cuda) == "fp32"


def _latest_run(uri, experiment):
    return tracking.client(uri).search_runs([tracking.experiment_id(uri, experiment)],
                                            order_by=["attributes.start_time DESC"], max_results=1)[0]


def test_compile_and_bf16_on_cpu(uri, finished):
    """The CUDA default path (torch.compile of the training step and of the evaluation forward, bf16 autocast,
    fused AdamW) taken on the CPU through train.compile / train.precision, so it runs in every test session."""
    from torch._dynamo.utils import counters

    bf16 = small(**{"train.precision": "bf16"})
    eager = train(bf16, tracking_uri=uri, experiment="t", run_name="bf16", progress=False)
    graphs = counters["stats"]["unique_graphs"]
    comp = train(override(bf16, {"train.compile": True}), tracking_uri=uri, experiment="t", run_name="bf16-compiled",
                 progress=False)
    assert counters["stats"]["unique_graphs"] > graphs  # inductor compiled graphs on the CPU
    r = tracking.Run(uri, comp.run_id).get()
    assert r.data.tags["hmmscope.precision"] == "bf16" and r.data.params["train.compile"] == "true"
    fp32, a, b = finished.metrics["val/loss"], eager.metrics["val/loss"], comp.metrics["val/loss"]
    assert a != fp32 and a == pytest.approx(fp32, rel=0.02)  # autocast engaged; bf16 rounding only
    assert b == pytest.approx(a, rel=0.01)  # compiled == eager, up to bf16 rounding in fused kernels
    first = tracking.client(uri).get_metric_history(comp.run_id, "val/loss")[0].value
    assert b < first  # the compiled bf16 run learns
    model, _ = load_model(uri, comp.run_id)  # the compiled run's checkpoint loads into a plain Transformer
    ep = sample_episodes(make_mixture(bf16.hmm), bf16.data, bf16.data.n_eval, "eval")
    assert evaluate_loss(model, ep, precision="bf16")["loss"] == pytest.approx(b, rel=0.01)


@pytest.mark.slow
def test_compile_blocks_on_cpu(uri, finished):
    """train.compile=blocks through inductor on the CPU: the CPU twin of the GPU session's "blocks" step variant
    (tests/test_gpu.py runs it on CUDA). Tagged; float32 numbers as eager's up to fused-kernel rounding; its
    checkpoint loads into a plain Transformer."""
    res = train(small(**{"train.compile": "blocks"}), tracking_uri=uri, experiment="t", run_name="blocks",
                progress=False, log_every=3)
    assert tracking.Run(uri, res.run_id).get().data.tags["hmmscope.compiled"] == "blocks"
    assert res.metrics["val/loss"] == pytest.approx(finished.metrics["val/loss"], rel=1e-4)
    model, _ = load_model(uri, res.run_id)
    assert all(torch.allclose(p, q, atol=1e-4) for p, q in zip(model.state_dict().values(), res.model.state_dict().values()))


@contextmanager
def storages_saved_as(location: str):
    """torch.save as on another device: every storage's location tag (the only device record a checkpoint
    file holds, e.g. "cuda:0" for a CUDA run's tensors) reads `location`."""
    import torch.serialization as ser

    entry = (1, lambda storage: location, lambda storage, loc: None)  # before the CPU tagger (priority 10)
    ser._package_registry.append(entry)
    ser._package_registry.sort(key=lambda e: e[0])
    try:
        yield
    finally:
        ser._package_registry.remove(entry)


def test_cuda_checkpoint_loads_and_resumes_on_cpu(uri, finished, tmp_path):
    """CPU twin of the cross-device round trip (the real one is tests/test_gpu.py): a run whose checkpoint
    tensors are tagged cuda:0 is read on the CPU and resumed there, bitwise as if never interrupted."""
    with storages_saved_as("cuda:0"), pytest.raises(KeyboardInterrupt):
        train(small(), tracking_uri=uri, experiment="xdev", progress=False, _stop_after=6)
    killed = _latest_run(uri, "xdev")
    path = tracking.Run(uri, killed.info.run_id).download("checkpoints/last.pt", tmp_path)
    if not torch.cuda.is_available():  # the file really is a "CUDA" checkpoint: plain torch.load refuses it here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    ck = read_checkpoint(path)
    tensors = [*ck["model"].values(), *(v for st in ck["optimizer"]["state"].values() for v in st.values())]
    assert ck["step"] == 6 and tensors and all(t.device.type == "cpu" for t in tensors)
    with pytest.raises(ValueError, match=r"train.precision \(only train.steps, train.device, train.compile, "
                                         r"train.attention, train.figures, eval.bayes, eval.bayes_tol may"):
        train(small(**{"train.precision": "bf16"}), tracking_uri=uri, experiment="xdev", resume=killed.info.run_id)
    res = train(small(), tracking_uri=uri, experiment="xdev", resume=killed.info.run_id, progress=False)
    assert res.steps == 12 and res.metrics["val/loss"] == finished.metrics["val/loss"]
    a, _ = load_model(uri, finished.run_id)
    b, _ = load_model(uri, res.run_id)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_checkpoint_config_refuses_checkpoints_that_do_not_fit(uri, finished, tmp_path):
    ck = load_checkpoint(uri, finished.run_id, tmp_path)
    assert checkpoint_config(ck) == small()
    flat = ck["config"]
    bad = [({**ck, "config": {**flat, "model.d_model": 64, "model.d_mlp": 128}},
            r"do not fit .*shape \[5, 32\], model \[5, 64\]"),
           ({**ck, "config": {**flat, "model.n_layers": 2}}, r"do not fit .*missing blocks\.1\."),
           ({**ck, "config": {**flat, "model.pos_enc": "absolute"}}, r"missing pos_emb\.weight"),
           ({**ck, "config": {**flat, "model.bogus": 1}}, "checkpoint config is invalid: unknown config key"),
           ({**ck, "config": {**flat, "hmm.gamma": 7.0}}, r"checkpoint config is invalid: hmm.gamma must be in"),
           ({**ck, "config": "not a mapping"}, "checkpoint has no config"),
           ({**ck, "vocab_size": 3}, "vocab_size 3 does not fit its config"),
           ({k: v for k, v in ck.items() if k != "model"}, "checkpoint has no model weights"),
           ({**ck, "model": {**ck["model"], "extra.weight": torch.zeros(2)}}, r"unexpected extra\.weight")]
    for c, match in bad:
        with pytest.raises(ValueError, match=match):
            model_from_checkpoint(c)
        msg = ""
        try:
            checkpoint_config(c)
        except ValueError as e:
            msg = str(e)
        assert msg and "\n" not in msg


def test_resume_from_a_checkpoint_that_does_not_fit_changes_nothing(uri, finished, tmp_path):
    ck = load_checkpoint(uri, finished.run_id, tmp_path)
    ck["config"] = {**ck["config"], "model.d_model": 64, "model.d_mlp": 128}
    torch.save(ck, tmp_path / "last.pt")
    with tracking.start_run(uri, "t", "misfit") as run:
        run.log_artifact(tmp_path / "last.pt", "checkpoints")
    with pytest.raises(ValueError, match="do not fit"):
        train(small(), tracking_uri=uri, experiment="t", resume=run.run_id, progress=False)
    r = run.get()
    assert r.info.status == "FINISHED" and "hmmscope.failure_reason" not in r.data.tags


def _toml(flat: dict) -> str:
    sections: dict[str, list[str]] = {}
    for k, v in flat.items():
        sec, name = k.split(".")
        sections.setdefault(sec, []).append(f"{name} = {json.dumps(v)}")
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())


def test_sigterm_ends_a_cli_training_run_killed_not_running(tmp_path):
    """`timeout` / `kill` send SIGTERM: the real `hmmscope train` process ends its run KILLED and exits 130."""
    cfg = tmp_path / "long.toml"
    cfg.write_text(_toml({**SMALL, "train.steps": 10**6, "train.eval_every": 10**6, "train.ckpt_every": 10**6}))
    db = tmp_path / "mlflow.db"
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "hmmscope"), "train", "--config", str(cfg),
                             "--tracking-uri", f"sqlite:///{db}", "--no-evaluate"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def statuses() -> list[str]:
        try:
            with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as c:
                return [s for (s,) in c.execute("select status from runs")]
        except sqlite3.Error:  # not created yet, or being created
            return []

    try:
        deadline = time.time() + 120
        while "RUNNING" not in statuses() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert statuses() == ["RUNNING"], proc.poll()
        time.sleep(1.0)  # into the training loop
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted"
    (run,) = tracking.client(f"sqlite:///{db}").search_runs([tracking.experiment_id(f"sqlite:///{db}", "hmmscope")])
    assert run.info.status == "KILLED"
    assert run.data.tags["hmmscope.failure_reason"] == "KeyboardInterrupt: signal 15 (SIGTERM)"


def test_a_sigterm_swallowed_by_a_weakref_callback_still_stops_training(uri, monkeypatch):
    """SIGTERM's handler raises where Python is; inside a weakref callback (the garbage collector runs them between
    any two bytecodes) Python prints "Exception ignored" and goes on. In CI a `hmmscope train` kept training for
    over 60 s after its SIGTERM so. The handler also records the signal and the training loop raises it at the next
    step: the run ends KILLED there (before: it trained to the end, FINISHED)."""
    import gc
    import weakref

    from hmmscope.interrupts import SWALLOWED, on_sigterm

    class Box:
        pass

    def swallow(step: int, metrics) -> None:
        if step == 2:  # the signal arrives while a weakref callback runs: its KeyboardInterrupt is swallowed
            box = Box()
            ref = weakref.ref(box, lambda _: on_sigterm(signal.SIGTERM, None))
            del box
            gc.collect()
            assert ref() is None

    lost = []  # where Python reports what it swallowed ("Exception ignored in: ..." and a traceback on stderr)
    monkeypatch.setattr(sys, "unraisablehook", lost.append)
    n = len(SWALLOWED)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        train(small(**{"train.steps": 40, "train.eval_every": 2}), tracking_uri=uri, experiment="swallowed",
              run_name="swallowed", progress=False, on_eval=swallow)
    assert len(SWALLOWED) == n + 1  # the first interrupt was indeed lost ...
    assert lost == []  # ... and nothing was printed for it (before: "Exception ignored" with a traceback)
    assert sys.unraisablehook == lost.append  # the hook comes back
    (run,) = tracking.search_runs(uri, "swallowed")
    assert run.info.status == "KILLED" and run.data.metrics["train/epoch"] < 1 and run.data.tags[
        "hmmscope.failure_reason"] == "KeyboardInterrupt: signal 15 (SIGTERM)"
    steps = [m.step for m in tracking.client(uri).get_metric_history(run.info.run_id, "val/loss")]
    assert max(steps) == 2  # stopped at the step after the signal, not at 40


def test_sigterm_interrupts_restores_the_old_handler():
    old = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises long before this ends
    assert signal.getsignal(signal.SIGTERM) is old


def test_a_full_disk_at_a_checkpoint_keeps_the_last_complete_one(uri, finished):
    """Fast twin of test_faults' full-disk test: the run's checkpoint folder is a tmpfs holding exactly its first
    checkpoint; the second (larger: its metrics grew) hits ENOSPC. The run ends FAILED, the error and the tag
    name the path, no temp file is left, and the first checkpoint is whole. Before the fix MLflow's in-place
    copy truncated it and left half of the second under its name."""
    from hmmscope.config import ConfigError
    from hmmscope.training.checkpoints import CKPT_DIR, CKPT_NAME, save_checkpoint

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    model, cfg = finished.model, finished.config
    opt = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95))
    with pytest.raises(ConfigError, match="No space left on device") as e, \
            tracking.start_run(uri, "t", "full-disk") as run:
        folder = Path(tracking.Run(uri, run.run_id).artifact_uri().removeprefix("file://")) / CKPT_DIR
        folder.mkdir(parents=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        try:
            def save(step: int, metrics: dict) -> None:
                save_checkpoint(run, model=model, optimizer=opt, step=step, cfg=cfg, vocab_size=cfg.hmm.n_tokens + 1,
                                metrics=metrics, dataset_hash="h")

            save(1, {"last": {}})
            used = (folder / CKPT_NAME).stat().st_size
            subprocess.run(["mount", "-o", f"remount,size={-(-used // 4096) * 4096}", str(folder)], check=True)
            save(2, {"last": {f"k{i}": float(i) for i in range(2000)}})
        finally:
            left = sorted(p.name for p in folder.iterdir())
            try:
                ck = read_checkpoint(folder / CKPT_NAME)
            except ValueError:  # half a file
                ck = None
            subprocess.run(["umount", "-l", str(folder)], check=False)
    msg = str(e.value)
    assert str(folder / CKPT_NAME) in msg and "\n" not in msg
    assert left == [CKPT_NAME] and ck is not None and ck["step"] == 1
    r = tracking.get_run(uri, run.run_id)
    assert r.info.status == "FAILED" and str(folder / CKPT_NAME) in r.data.tags["hmmscope.failure_reason"]


def test_a_full_disk_in_the_cli_evaluation_leaves_the_run_failed(uri, tmp_path, monkeypatch):
    """`train --out` onto a full disk: training ends, Figure 1's files do not fit. One error line naming the file,
    exit 2, no file under the output folder, and the run FAILED with the reason (it stayed FINISHED without its
    evaluation before)."""
    from typer.testing import CliRunner

    from hmmscope.cli import app

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(tiny)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    monkeypatch.chdir(tmp_path)
    sets = [a for k, v in {**SMALL, "train.steps": 2, "data.n_eval": 16, "train.emergence_episodes": 0}.items()
            if k != "train.device" for a in ("--set", f"{k}={v}")]
    try:
        r = CliRunner().invoke(app, ["train", *sets, "--device", "cpu", "--out", str(tiny), "--tracking-uri", uri,
                                     "--experiment", "full-out"])
        files = [p for p in tiny.rglob("*") if p.is_file()]
    finally:
        subprocess.run(["umount", "-l", str(tiny)], check=False)
    lines = r.stderr.strip().splitlines()[-1:]  # the error, after the progress lines off a terminal
    assert r.exit_code == 2 and lines[0].startswith("error:") and "No space left on device" in lines[0], r.output
    assert sum("error" in ln.lower() for ln in r.stderr.splitlines()) == 1 and "Traceback" not in r.output
    assert str(tiny) in lines[0] and files == []
    (run,) = tracking.search_runs(uri, "full-out")
    assert run.info.status == "FAILED" and "No space left on device" in run.data.tags["hmmscope.failure_reason"]


def test_fresh_tasks_train_and_evaluate(uri, tmp_path):
    """hmm.n_tasks = 0 (SCIENCE.md 9): every training episode has its own task; oracle/* is family Bayes; the
    emergence curves and Figure 1 exist on unseen tasks only (seen-task metrics absent, not NaN); the regime claims
    and the tag hmmscope.regime are set; eval/figure1_s is logged."""
    from hmmscope.pipeline import evaluation

    cfg = small(**{"hmm.n_tasks": 0, "train.emergence_episodes": 8})
    res = train(cfg, tracking_uri=uri, experiment="fresh", progress=False, log_every=3)
    run = tracking.Run(uri, res.run_id)
    tags = run.get().data.tags
    assert tags["hmmscope.tasks"] == "fresh" and tags["hmmscope.episodes_per_task"] == "1"  # 12 x 8 / 96 tasks
    assert 0 < res.metrics["oracle/test_loss"] < math.log(4) and "val/excess_ce" in res.metrics
    em = {k for k in run.get().data.metrics if k.startswith("emergence/")}
    assert em == {"emergence/unseen/icl_gain", "emergence/unseen/ce_kmax", "emergence/unseen/vs_best_counting",
                  "emergence/unseen/vs_bayes"}
    lines = []
    ev = evaluation.evaluate_model(res.model, res.config, res.steps, run, out=tmp_path, say=lines.append)
    assert not any(k.startswith("eval/seen/") or "retrieval" in k or "oracle_mix" in k for k in ev)
    assert {"eval/unseen/test_ce", "baseline/unseen/family_bayes/ce", "eval/unseen/vs_best_counting", "eval/figure1_s",
            "baseline/unseen/family_bayes/ce_M4", "baseline/unseen/family_bayes/ce_M8"} <= set(ev)
    assert {c.name for c in ev.claims} == {"icl_gain", "inference_beyond_counting"}
    assert run.get().data.tags["hmmscope.regime"] == ev.regime and ev.regime in ("counting", "undetermined",
                                                                                "inference beyond counting")
    assert lines and lines[0].startswith("Figure 1: ") and f"regime: {ev.regime}" in lines[0]
    # the Bayes-optimal reference (SCIENCE.md 10) leads on fresh tasks: the mixture reference, the gap, the share
    assert "Bayes gap" in lines[0] and {"eval/unseen/vs_bayes", "eval/unseen/bayes_share", "eval/unseen/bayes_room",
                                        "eval/unseen/bayes_mc_se", "baseline/unseen/bayes/ce"} <= set(ev)
    assert ev["eval/unseen/excess_ce"] == pytest.approx(ev["eval/unseen/vs_bayes"], abs=1e-9)
    assert ev["eval/unseen/bayes_room"] == pytest.approx(ev["baseline/unseen/best_counting/ce"]
                                                         - ev["baseline/unseen/bayes/ce"], abs=1e-9)
    kept = np.load(tmp_path / f"{run.get().info.run_name}-{res.run_id[:8]}" / "evaluation" / "per_episode.npz")
    assert kept["unseen/k2/model"].shape == (32,) and float(kept["unseen/k2/model"].mean()) == pytest.approx(
        ev["eval/unseen/test_ce"], rel=1e-5)
    params = run.get().data.params
    assert params["hmm.n_tasks"] == "0" and params["eval.family_tasks"] == "16"
    # failed before: the fitted counting settings were params (counting.k2.best ...), so reports blocked on them
    assert not any(k.startswith("counting") for k in params), sorted(params)
    data = run.get().data
    assert data.tags["hmmscope.counting.k2.best"] in ("incontext_ngram", "incontext_ctw")
    assert "counting/k2/ngram_fit_ce" in data.metrics and "counting/fit_episodes" in data.metrics


def test_train_metrics_reach_the_store_in_batches_every_step_kept(uri, monkeypatch):
    """Before: one store write per logged step (24 steps logged every step: 24 writes of train/*). Now they reach the
    store together, before each checkpoint and at the end (METRICS_WRITE_S apart at most while training), and every
    logged step is there once."""
    from mlflow.tracking import MlflowClient

    from hmmscope.training import train as train_module

    writes = []
    real = MlflowClient.log_batch

    def counting(self, run_id, metrics=(), *a, **kw):
        if any(m.key == "train/loss" for m in metrics):
            writes.append(sorted({m.step for m in metrics if m.key == "train/loss"}))
        return real(self, run_id, metrics, *a, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", counting)
    monkeypatch.setattr(train_module, "METRICS_WRITE_S", 1e9)  # no write by the clock: only the checkpoints' and end's
    res = train(small(**{"train.steps": 24, "train.ckpt_every": 12, "train.eval_every": 12}), tracking_uri=uri,
                experiment="batched", progress=False, log_every=1)
    hist = sorted(m.step for m in tracking.client(uri).get_metric_history(res.run_id, "train/loss"))
    assert hist == list(range(1, 25))  # every step once
    assert writes == [list(range(1, 13)), list(range(13, 25))], writes  # before the checkpoints at 12 and 24


INTERRUPTED = {**SMALL, "train.steps": 100, "train.ckpt_every": 30, "train.eval_every": 20, "train.figures": False,
               "train.emergence_episodes": 0, "eval.family_tasks": 0, "eval.fit_episodes": 0}


def _rows_per_step(uri: str, run_id: str) -> dict[tuple[str, int], int]:
    """(key, step) -> rows stored, for every metric but MLflow's system/* (their step counts samples)."""
    db = tracking.store.sqlite_path(uri)
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as c:
        return {(k, s): n for k, s, n in c.execute(
            "select key, step, count(*) from metrics where run_uuid = ? and key not like 'system/%' "
            "group by key, step", (run_id,))}


def test_a_resume_after_each_interrupt_point_stores_every_step_once(tmp_path):
    """Issue 47, item 1: train/* rows reach the store in batches (when training stops, on the 5 s timer, before each
    checkpoint), and a resume restarts from the last checkpoint and logs those steps again: 100 steps, checkpoints
    every 30, gave steps 31-40 twice after a SIGTERM at step 40 (also after two SIGTERMs 0.05 s apart), 31-37 after a
    SIGKILL just after a timed write, 31-60 after a SIGKILL while the step-60 checkpoint was written. Real processes
    are interrupted at each point (tests/interrupted_train.py), then resumed to the end: every (key, step) is stored
    once, train/loss at steps 1..100, and the latest values are the resumed run's. The second of two SIGTERMs waits
    for the first one's clean-up (before: it cut it, and the run stayed RUNNING or lost its rows 31-40)."""
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    tracking.ensure_store(uri)  # created here: the driver's children only write
    folder = tmp_path / "points"
    folder.mkdir()
    scenarios = {"sigterm40": [signal.SIGTERM], "two_sigterms": [signal.SIGTERM, signal.SIGTERM],
                 "timed37": [signal.SIGKILL], "ckpt60": [signal.SIGKILL]}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HMMSCOPE_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("interrupted_train.py")), uri,
                               json.dumps(INTERRUPTED), str(folder), *scenarios], env=env, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    runs = {}
    try:
        for name, signals in scenarios.items():
            deadline = time.time() + 300
            while not (folder / f"{name}.paused").exists():
                assert driver.poll() is None, driver.stderr.read()
                assert time.time() < deadline, f"{name}: no pause within 300 s"
                time.sleep(0.1)
            paused = json.loads((folder / f"{name}.paused").read_text())
            runs[name] = paused["run_id"]
            for i, sig in enumerate(signals):
                if i:
                    time.sleep(0.05)
                os.kill(paused["pid"], sig)
            while not (folder / f"{name}.done").exists():
                assert driver.poll() is None, driver.stderr.read()
                assert time.time() < deadline, f"{name}: the child did not end within 300 s"
                time.sleep(0.1)
        assert driver.wait(timeout=60) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    cfg = small(**{k: v for k, v in INTERRUPTED.items() if k not in SMALL or SMALL[k] != v})
    twice = {}
    for name, rid in runs.items():
        before = _rows_per_step(uri, rid)  # the interrupted process stored the steps past its checkpoint at 30
        assert max(s for (k, s) in before if k == "train/loss") >= {"timed37": 37, "ckpt60": 60}.get(name, 40), name
        if scenarios[name][0] == signal.SIGTERM:  # ended KILLED with its reason (a second SIGTERM waits for that)
            r = tracking.client(uri).get_run(rid)
            assert (r.info.status, r.data.tags["hmmscope.failure_reason"]) == (
                "KILLED", "KeyboardInterrupt: signal 15 (SIGTERM)"), name
        res = train(cfg, tracking_uri=uri, experiment="interrupted", resume=rid, progress=False, log_every=1)
        assert res.steps == 100
        rows = _rows_per_step(uri, rid)
        twice[name] = sorted({s for (k, s), n in rows.items() if n != 1})  # every (key, step) once
        if twice[name]:
            continue
        assert sorted(s for (k, s) in rows if k == "train/loss") == list(range(1, 101)), name
        assert sorted(s for (k, s) in rows if k == "val/loss") == [0, 20, 40, 60, 80, 100], name
        hist = {m.step: m.value for m in tracking.client(uri).get_metric_history(rid, "val/loss")}
        assert tracking.client(uri).get_run(rid).data.metrics["val/loss"] == hist[100] == res.metrics["val/loss"], name
    assert twice == {name: [] for name in scenarios}, "steps stored more than once"


def test_a_finished_run_resumed_replaces_its_final_metrics(uri):
    """A finished run resumed with nothing left to train refreshes its final evaluation (val/*) and this call's
    train/wall_time_s, eval_s, eval_fraction at its last step: they replace the stored ones (before: a second row
    of each at that step)."""
    cfg = small(**{"eval.family_tasks": 0, "eval.fit_episodes": 0, "train.emergence_episodes": 0,
                   "train.figures": False})
    res = train(cfg, tracking_uri=uri, experiment="refresh", progress=False, log_every=3)
    train(cfg, tracking_uri=uri, experiment="refresh", resume=res.run_id, progress=False, log_every=3)
    rows = _rows_per_step(uri, res.run_id)
    assert {ks: n for ks, n in rows.items() if n != 1} == {}
    assert {("val/loss", 12), ("train/wall_time_s", 12), ("train/loss", 12)} <= set(rows)
