"""Figure 1 evaluation: truncation layout, prediction alignment, oracle-as-model identities, outputs."""

import csv
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from hmmscope.config import DataConfig, HMMConfig
from hmmscope.data.episodes import Episodes, family_tasks, fit_episodes, layout, sample_episodes, truncate_demos, unseen_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.measure.bayes_gap import BayesSpec
from hmmscope.measure.evaluate import eval_set, figure1, figure1_tables, score_by_k
from hmmscope.measure.figure1_plot import build_figure1, plot_figure1
from hmmscope.measure.figure1_result import PREDICTORS
from hmmscope.measure.fixed_memory import memory_comparison, receptive_field
from hmmscope.measure.regimes import REGIMES, regime, retrieval_gap
from hmmscope.measure.scoring import model_predictive
from hmmscope.oracles.baselines import fit_counting, incontext_bigram, incontext_unigram
from hmmscope.oracles.inference import mixture_oracle, task_oracle
from hmmscope.oracles.memory import memory_error
from hmmscope.stats import claim, decide, rule
from hmmscope.training.learning_curve import oracle_metrics

V = 5
DATA = DataConfig(n_demos=3, l_demo=6, l_test=9, seed=3)


@pytest.fixture(scope="module")
def mix():
    return make_mixture(HMMConfig(n_tasks=4, n_states=6, n_tokens=V, rank=3, gamma=0.7, rho=0.05, seed=1))


@pytest.fixture(scope="module")
def ep(mix):
    return sample_episodes(mix, DATA, 48, "eval")


class OracleModel(nn.Module):
    """Logits at t = log p_mixture(token_{t+1} | tokens <= t), recomputed on whatever episode it is fed
    (so it is the Bayes-optimal predictor at every truncation k); a huge delimiter logit checks that
    model_predictive drops non-observation ids."""

    def __init__(self, mix, ep):
        super().__init__()
        self.mix, self.meta, self.vocab_size = mix, ep.meta, V + 1
        self.l_demo, self.l_test = ep.l_demo, ep.l_test

    def forward(self, idx, targets=None, loss_mask=None):
        B, Tin = idx.shape
        k = (Tin + 1 - self.l_test) // (self.l_demo + 1)
        tok = torch.cat([idx, torch.zeros(B, 1, dtype=idx.dtype)], 1).numpy()  # dummy last token: unused
        seg, pos = layout(k, self.l_demo, self.l_test)
        e = Episodes(tokens=tok, states=tok, task_ids=np.zeros(B, np.int64), segment=seg, position=pos, n_tokens=V,
                     n_demos=k, l_demo=self.l_demo, l_test=self.l_test, meta=dict(self.meta))
        pred, _ = mixture_oracle(self.mix, e, dtype=torch.float64)
        logits = torch.nan_to_num(torch.log(pred[:, 1:]), nan=0.0)
        return torch.cat([logits, torch.full((B, Tin, 1), 50.0, dtype=logits.dtype)], -1), None


class PerfectModel(nn.Module):
    """Cheats: looks the episode up by its (suffix) prefix and puts its logit mass on the true next token."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens, self.vocab_size = torch.as_tensor(tokens.astype(np.int64)), V + 1

    def forward(self, idx, targets=None, loss_mask=None):
        Tin = idx.shape[1]
        suffix = self.tokens[:, -(Tin + 1):]
        rows = [int(np.flatnonzero((suffix[:, :-1] == r).all(1).numpy())[0]) for r in idx]
        return 30.0 * nn.functional.one_hot(suffix[rows, 1:], V + 1).double(), None


class FixedModel(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits, self.vocab_size = torch.as_tensor(logits, dtype=torch.float32), len(logits)

    def forward(self, idx, targets=None, loss_mask=None):
        return self.logits.expand(*idx.shape, -1).clone(), None


def test_truncate_demos_layout(ep):
    same = truncate_demos(ep, DATA.n_demos)
    for a in ("tokens", "states", "task_ids", "segment", "position"):
        np.testing.assert_array_equal(getattr(same, a), getattr(ep, a))
    test_tok = ep.tokens[:, ep.test_mask]
    for k in range(DATA.n_demos + 1):
        e = truncate_demos(ep, k)
        seg, pos = layout(k, DATA.l_demo, DATA.l_test)
        assert e.n_demos == k and e.seq_len == k * (DATA.l_demo + 1) + DATA.l_test
        np.testing.assert_array_equal(e.segment, seg)
        np.testing.assert_array_equal(e.position, pos)
        np.testing.assert_array_equal(e.tokens[:, e.test_mask], test_tok)
        np.testing.assert_array_equal(e.task_ids, ep.task_ids)
        assert (e.tokens[:, ~e.is_obs] == V).all() and (e.tokens[:, e.is_obs] < V).all()
        for j in range(k):  # kept demos are the LAST k of the original, in order
            orig = j + DATA.n_demos - k
            np.testing.assert_array_equal(e.tokens[:, e.segment == j], ep.tokens[:, ep.segment == orig])
            np.testing.assert_array_equal(e.states[:, e.segment == j], ep.states[:, ep.segment == orig])
    zero = truncate_demos(ep, 0)
    assert zero.test_mask.all() and zero.seq_len == DATA.l_test
    with pytest.raises(ValueError):
        truncate_demos(ep, DATA.n_demos + 1)


def test_model_predictive_alignment(ep):
    pred = model_predictive(PerfectModel(ep.tokens), ep.tokens, batch_size=7)  # odd batch: batching is seamless
    assert pred.shape == (len(ep), ep.seq_len, V)
    assert torch.isnan(pred[:, 0]).all() and torch.isnan(pred[:, ~ep.is_obs]).all()
    obs = np.flatnonzero(ep.is_obs & (np.arange(ep.seq_len) >= 1))
    assert torch.isfinite(pred[:, obs]).all()
    assert (pred[:, obs].argmax(-1).numpy() == ep.tokens[:, obs]).all()  # pred[:, t] predicts token t
    torch.testing.assert_close(pred[:, obs].sum(-1), torch.ones(len(ep), len(obs)))
    # fixed logits: softmax over the V observation ids only, whatever the delimiter logit
    logits = np.array([0.0, np.log(2), np.log(3), np.log(4), np.log(10), 100.0])
    fixed = model_predictive(FixedModel(logits), ep.tokens)
    torch.testing.assert_close(fixed[:, obs], torch.tensor([1, 2, 3, 4, 10.0]).div(20).expand(len(ep), len(obs), V))


def test_figure1_perfect_and_uniform(mix, ep):
    perfect = figure1(PerfectModel(ep.tokens), mix, ep, batch_size=16)
    for r in perfect.by_k:
        if r["predictor"] == "model":
            assert r["acc"] == 1.0 and r["ce"] < 1e-9
        assert r["n_tokens"] == DATA.l_test - (r["k"] == 0)  # no prediction for episode token 0
    uni = figure1(FixedModel(np.zeros(V + 1)), mix, ep)
    for k in range(DATA.n_demos + 1):
        m, o = uni.row("model", k), uni.row("mixture_oracle", k)
        assert o["acc"] > m["acc"] and o["ce"] < m["ce"] and m["kl_mix"] > 0.01
        # a uniform model's CE is log V, and its KL to any oracle is log V - H(oracle)
        assert m["ce"] == pytest.approx(np.log(V))
    # KL direction: KL(oracle || uniform) = log V - H(oracle) (the reverse would be -log V - E log p)
    for name, kl in (("mixture_oracle", "kl_mix"), ("task_oracle", "kl_task")):
        fn = mixture_oracle if name == "mixture_oracle" else task_oracle
        p = fn(mix, ep, dtype=torch.float64)
        p = (p[0] if isinstance(p, tuple) else p)[:, ep.test_mask]
        expect = (np.log(V) + torch.xlogy(p, p).sum(-1)).mean().item()
        assert uni.row("model")[kl] == pytest.approx(expect, rel=1e-9)
    # task oracle beats the mixture oracle when the task is unknown (k = 0), and the gap shrinks with k
    t0, x0 = uni.row("task_oracle", 0), uni.row("mixture_oracle", 0)
    assert t0["acc"] >= x0["acc"] and t0["ce"] < x0["ce"]
    assert uni.row("mixture_oracle", 0)["kl_task"] > uni.row("mixture_oracle", DATA.n_demos)["kl_task"]
    assert uni.row("model", 0)["p_true_task"] < uni.row("model", DATA.n_demos)["p_true_task"]
    for r in uni.by_k + uni.by_position:
        for key in ("acc", "ce", "kl_mix", "excess_ce"):
            assert r[f"{key}_lo"] <= r[key] <= r[f"{key}_hi"]


def test_figure1_oracle_as_model(mix, ep, tmp_path):
    res = figure1(OracleModel(mix, ep), mix, ep, batch_size=16)
    names = ["model", "task_oracle", "mixture_oracle", "incontext_unigram", "incontext_bigram", "incontext_hmm"]
    assert [(r["k"], r["predictor"]) for r in res.by_k] == [(k, n) for k in range(DATA.n_demos + 1) for n in names]
    assert {r["tasks"] for r in res.by_k + res.by_position} == {"seen"} and res.claims == []
    for k in range(DATA.n_demos + 1):
        m, x, t = res.row("model", k), res.row("mixture_oracle", k), res.row("task_oracle", k)
        assert abs(m["excess_ce"]) < 1e-5 and abs(m["kl_mix"]) < 1e-5 and x["kl_mix"] == 0.0
        assert m["acc"] == x["acc"] and m["kl_task"] == pytest.approx(x["kl_task"], abs=1e-6)
        assert t["kl_task"] == 0.0 and t["excess_ce_task"] == 0.0
    for r in res.by_position:
        if r["predictor"] == "model":
            assert abs(r["excess_ce"]) < 1e-5 and abs(r["kl_mix"]) < 1e-5
    assert sorted({r["position"] for r in res.by_position}) == list(range(DATA.l_test))
    # the same numbers as training's own oracle metric on the full episodes
    assert res.row("mixture_oracle")["acc"] == pytest.approx(oracle_metrics(mix, ep)["test_acc"], abs=1e-12)
    h = res.headline()
    assert h["eval/seen/test_acc"] == m["acc"] and abs(h["eval/seen/gap_to_mix"]) == 0.0
    assert set(h) >= {"eval/seen/test_acc", "eval/seen/oracle_mix_test_acc", "eval/seen/oracle_task_test_acc",
                      "eval/seen/kl_mix", "eval/seen/excess_ce", "eval/seen/gap_to_mix", "eval/seen/p_true_task",
                      "baseline/seen/incontext_unigram/ce", "baseline/seen/incontext_hmm/acc_k0",
                      "baseline/seen/mixture_oracle/ce_k0"}
    assert not any(k.startswith("eval/") and k.count("/") == 1 for k in h)  # no old un-namespaced key
    assert h["baseline/seen/mixture_oracle/ce_k0"] == res.row("mixture_oracle", 0)["ce"]
    json.dumps(res.to_dict(), allow_nan=False)
    paths = res.to_csv(tmp_path)
    with open(paths[0]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res.by_k) and list(rows[0])[:2] == ["tasks", "k"] and rows[0]["predictor"] == "model"
    png, pdf = plot_figure1(res, tmp_path / "fig" / "figure1.png", title="run abc (12345678)")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    assert not list((tmp_path / "fig").glob(".*tmp"))
    _check_figure1_artists(res)


def _check_figure1_artists(res):
    """One row of four panels per task set; chance at 1/V in both accuracy panels' legends (columns 0 and 2), the
    oracles' ceiling inside their y-range, log V in the CE panel, every predictor drawn, only the model's band and a
    few smoothed lines in the position panel (issue 29.7), the paired differences with a zero line, the run in the
    title."""
    from figure_checks import layout_problems

    fig = build_figure1(res, title="run abc (12345678)")
    assert "run abc (12345678)" in fig._suptitle.get_text()
    assert len(fig.axes) == 4 * len(res.tasks)
    # no title cut at the edge ("... model better" lost its ")"), no legend over a panel (the unseen accuracy-vs-k
    # legend hid the task oracle's line; the position panel's covered the model): the predictors' legend is below
    # the figure, once (issue 38.7)
    assert layout_problems(fig) == []
    (legend,) = fig.legends
    shown = [t.get_text() for t in legend.get_texts()]
    assert len(shown) == len(set(shown)) and f"chance (1/V = {1 / V:.3g})" in shown and "model" in shown
    for i, tasks in enumerate(res.tasks):
        acc_k, ce_k, acc_pos, diff = fig.axes[4 * i: 4 * i + 4]
        assert acc_k.get_title().startswith(f"{tasks} tasks")
        top = max(r["acc_hi"] for r in res.by_k if r["predictor"] != "model" and r["tasks"] == tasks)
        for ax in (acc_k, acc_pos):
            chance = [ln for ln in ax.get_lines() if ln.get_label().startswith("chance")]
            assert len(chance) == 1 and np.allclose(chance[0].get_ydata(), 1 / V)
            lo, hi = ax.get_ylim()
            assert lo <= 1 / V and hi >= top  # the mixture / task oracle ceiling is in view
        assert any(np.allclose(ln.get_ydata(), np.log(V)) for ln in ce_k.get_lines())
        drawn = {ln.get_label() for ln in acc_k.get_lines()}
        assert {"model", "task oracle", "add-one unigram", "add-one bigram", "in-context HMM (EM)"} <= drawn
        assert len(acc_pos.collections) == 1  # one band: the model's
        assert {ln.get_label() for ln in acc_pos.get_lines()} <= {"model", "task oracle", "mixture oracle (training tasks)",
                                                                  "family Bayes (M tasks of the family)",
                                                                  "Bayes-optimal (fresh tasks)",
                                                                  "best counting (fitted)", f"chance (1/V = {1 / V:.3g})"}
        assert "model minus" in diff.get_title() and any(np.allclose(ln.get_ydata(), 0) for ln in diff.get_lines())


class TaskOracleModel(nn.Module):
    """Logits = log of the TRUE task's filter on whatever (truncated) episode it is fed: looks each row up by its
    tokens among the episodes it was given (the task oracle as a model: no retrieval gap by construction)."""

    def __init__(self, sets):
        super().__init__()
        self.sets, self.vocab_size = sets, V + 1  # [(task mixture, episodes)]

    def forward(self, idx, targets=None, loss_mask=None):
        B, Tin = idx.shape
        out = torch.zeros(B, Tin, V + 1, dtype=torch.float64)
        for b, row in enumerate(idx.numpy()):
            for tmix, full in self.sets:
                k = (Tin + 1 - full.l_test) // (full.l_demo + 1)
                e = truncate_demos(full, k)
                hit = np.flatnonzero((e.tokens[:, :-1] == row).all(1))
                if len(hit):
                    p = task_oracle(tmix, e.subset(hit[:1]), dtype=torch.float64)[0, 1:]
                    out[b, :, :V] = torch.nan_to_num(torch.log(p), nan=0.0)
                    break
            else:
                raise AssertionError("row not found")
        return out, None


def test_unseen_tasks_and_the_retrieval_gap(mix, ep, tmp_path):
    hc = HMMConfig(n_tasks=4, n_states=6, n_tokens=V, rank=3, gamma=0.7, rho=0.05, seed=1)
    umix, uep = unseen_episodes(hc, DATA, 48)
    family = family_tasks(hc, DATA, 32)
    counting = fit_counting(fit_episodes(hc, DATA, 16)[1], range(DATA.n_demos + 1))
    res = figure1(OracleModel(mix, ep), mix, ep, unseen=(umix, uep), family=family, counting=counting, batch_size=16,
                  bayes=BayesSpec(hc, 0.05, 3))  # Q rows by Monte Carlo: a loose tolerance
    assert res.tasks == ["seen", "unseen"]
    assert {r["predictor"] for r in res.by_k if r["tasks"] == "unseen"} == set(PREDICTORS)
    assert {r["predictor"] for r in res.by_k if r["tasks"] == "seen"} == set(PREDICTORS) - {"family_bayes", "bayes"}
    # the Bayes reference (SCIENCE.md 10): between the task oracle and every learner that knows no task
    u_b = res.row("bayes", tasks="unseen")
    assert res.row("task_oracle", tasks="unseen")["ce"] < u_b["ce"] < res.row("best_counting", tasks="unseen")["ce"]
    b = res.bayes
    assert b["gap"] == pytest.approx(res.row("model", tasks="unseen")["ce"] - u_b["ce"], abs=1e-9) and not b["fault"]
    assert b["room"] == pytest.approx(res.row("best_counting", tasks="unseen")["ce"] - u_b["ce"], abs=1e-9)
    assert b["share"] == pytest.approx((res.row("best_counting", tasks="unseen")["ce"]
                                        - res.row("model", tasks="unseen")["ce"]) / b["room"], rel=1e-9)
    arrays = res.episode_arrays()
    assert arrays["unseen/k3/bayes"].shape == (48,) and arrays["seen/k0/model"].shape == (len(ep),)
    assert float(arrays["unseen/k3/bayes"].mean()) == pytest.approx(u_b["ce"], rel=1e-6)
    for tasks in ("seen", "unseen"):
        assert {r["k"] for r in res.by_k if r["tasks"] == tasks and r["predictor"] == "best_counting"} == \
            set(range(DATA.n_demos + 1))  # every predictor has a k = 0 row
    u_t, u_x = res.row("task_oracle", tasks="unseen"), res.row("mixture_oracle", tasks="unseen")
    assert u_t["ce"] < u_x["ce"] and math.isnan(u_t["p_true_task"])  # unseen: only the task oracle is the ceiling
    # the task oracle rows are the true filter of the unseen tasks
    p = task_oracle(umix, uep, dtype=torch.float64)[:, uep.test_mask]
    y = torch.as_tensor(uep.tokens[:, uep.test_mask].astype(np.int64))
    assert u_t["ce"] == pytest.approx(-torch.log(p.gather(-1, y[..., None])).mean().item(), rel=1e-12)
    # the mixture oracle as a model retrieves: close to the ceiling on seen tasks, far from it on unseen ones
    g, c = res.retrieval, res.claims[0]
    assert c.name == "retrieval_gap" and c.rule == "> 0" and c.verdict == decide(c.rule, c.ci_lo, c.ci_hi) == "supported"
    assert g["value"] == pytest.approx(res.row("model", tasks="unseen")["excess_ce_task"]
                                       - res.row("model")["excess_ce_task"], abs=1e-12)
    h = res.headline()
    assert h["eval/retrieval_gap"] == g["value"] and h["eval/retrieval_gap_lo"] < g["value"] < h["eval/retrieval_gap_hi"]
    assert "eval/unseen/excess_ce_task" in h and "eval/unseen/p_true_task" not in h
    assert {"baseline/unseen/family_bayes/ce", "baseline/unseen/incontext_bigram/acc", "baseline/unseen/best_counting/ce",
            "eval/unseen/vs_best_counting", "eval/unseen/vs/best_counting/k0_hi", "eval/unseen/icl_gain",
            "eval/unseen/vs_bayes", "eval/unseen/bayes_share_hi", "eval/unseen/bayes_mc_se"} <= set(h)
    assert {c.name for c in res.claims} == {"retrieval_gap", "icl_gain", "inference_beyond_counting"}
    assert res.regime == "retrieval"  # the mixture oracle as a model: it knows the training tasks
    # the task oracle as a model has no gap at all
    flat = figure1(TaskOracleModel([(mix, ep), (umix, uep)]), mix, ep, unseen=(umix, uep), learner=None, ks=[3],
                   batch_size=48, bayes=BayesSpec(hc, 0.05, 3))  # Q rows by Monte Carlo: a loose tolerance
    assert flat.bayes["fault"]  # a "model" below Bayes (it knows each task) is flagged, never a finding
    fg = flat.retrieval
    assert abs(fg["value"]) < 1e-12 and -1e-12 < fg["lo"] <= fg["hi"] < 1e-12  # 0 up to rounding
    assert flat.claims[0].verdict != "supported"
    paths = res.to_csv(tmp_path)
    with open(paths[1]) as f:
        assert {r["tasks"] for r in csv.DictReader(f)} == {"seen", "unseen"}
    _check_figure1_artists(res)
    assert "retrieval gap" in build_figure1(res)._suptitle.get_text()


def test_retrieval_gap_statistic():
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(0.1, 0.05, 200), rng.normal(0.4, 0.1, 300)
    c, g = retrieval_gap(seen, unseen)
    se = math.sqrt(unseen.var(ddof=1) / 300 + seen.var(ddof=1) / 200)
    assert g["value"] == pytest.approx(unseen.mean() - seen.mean()) and g["hi"] - g["value"] == pytest.approx(1.96 * se)
    assert c.verdict == "supported"
    assert retrieval_gap(seen, seen + 1e-3 * rng.normal(size=200))[0].verdict == "inconclusive"


def test_counting_rows_score_the_models_tokens(mix, ep):
    """Each counting row is the mean over episodes of the mean -log p over the test tokens at positions >= 1 of the
    episode truncated to its last k demos, with the context of that truncated episode."""
    es = eval_set(mix, ep, learner=None)
    res = figure1_tables(FixedModel(np.zeros(V + 1)), [es])
    for k in range(DATA.n_demos + 1):
        e = truncate_demos(ep, k)
        scored = e.test_mask & (np.arange(e.seq_len) >= 1)
        y = torch.as_tensor(e.tokens[:, scored].astype(np.int64))
        for name, fn in (("incontext_unigram", incontext_unigram), ("incontext_bigram", incontext_bigram)):
            p = fn(e)[:, scored]
            ce = -torch.log(p.gather(-1, y[..., None]))[..., 0]
            r = res.row(name, k)
            assert r["ce"] == pytest.approx(ce.mean(1).mean().item(), rel=1e-13)
            assert r["acc"] == pytest.approx((p.argmax(-1) == y).double().mean().item(), rel=1e-13)
            assert r["n_tokens"] == DATA.l_test - (k == 0)
    # score_by_k gives the model's rows without recomputing any reference
    sc = score_by_k(FixedModel(np.zeros(V + 1)), es)
    for k, v in sc.items():
        assert v["ce"] == pytest.approx(res.row("model", k)["ce"]) and v["acc"] == res.row("model", k)["acc"]
        assert v["excess_ce_task"] == pytest.approx(res.row("model", k)["excess_ce_task"])


def test_memory_comparison(mix):
    data = DataConfig(n_demos=1, l_demo=6, l_test=10, test_start="midstream", burn_in=150, seed=2)
    ep = sample_episodes(mix, data, 24, "eval")
    out = memory_comparison(OracleModel(mix, ep), mix, ep, 4, n_layers=1, n_tasks_theory=2,
                            theory_kw={"n_histories": 64, "burn_in": 50, "seed": 5})
    assert out["comparable"] and out["n_positions"] == data.l_test - 4 and out["receptive_field"] == 4
    assert out["model_tv"] == pytest.approx(out["mix_tv"], abs=1e-6) and out["model_tv_lo"] <= out["model_tv"]
    ref = [memory_error(mix.task(i), [4], n_histories=64, burn_in=50, seed=5).eps[0] for i in range(2)]
    assert out["eps"] == pytest.approx(np.mean(ref))
    assert not memory_comparison(FixedModel(np.zeros(V + 1)), mix, truncate_demos(sample_episodes(mix, DATA, 8), 2), 3,
                                 n_layers=1, n_tasks_theory=1, theory_kw={"n_histories": 16})["comparable"]
    # 3 layers of width 3 see 7 tokens: eps at L = 7, scored on test positions >= 7
    deep = memory_comparison(OracleModel(mix, ep), mix, ep, 3, n_layers=3, n_tasks_theory=1,
                             theory_kw={"n_histories": 64, "burn_in": 50, "seed": 5})
    assert deep["receptive_field"] == deep["eps_L"] == 7 and deep["n_positions"] == data.l_test - 7
    assert deep["eps"] == pytest.approx(memory_error(mix.task(0), [7], n_histories=64, burn_in=50, seed=5).eps[0])
    # a receptive field beyond the test segment: no comparison, said so, no eps
    far = memory_comparison(OracleModel(mix, ep), mix, ep, 4, n_layers=4, n_tasks_theory=1)
    assert far["n_positions"] == 0 and not far["comparable"] and "receptive field 13" in far["reason"]
    assert "eps" not in far


def test_memory_comparison_on_fresh_tasks_has_the_l_memory_predictor_on_the_same_tokens(mix):
    """Fresh tasks (no training mixture): the L-memory predictor of each episode's own task, on exactly the scored
    test tokens (lmem_tv: eps(R) measured there), and the family reference as the mixture term (its tasks are not
    the episodes'). Failed before: no lmem_tv, and the mixture term could only be the episodes' own mixture."""
    from hmmscope.oracles.memory import memory_predictor

    data = DataConfig(n_demos=1, l_demo=6, l_test=10, seed=2)
    ep = sample_episodes(mix, data, 12, "eval")
    fam = make_mixture(HMMConfig(n_tasks=8, n_states=6, n_tokens=V, rank=3, gamma=0.7, rho=0.05, seed=9))
    out = memory_comparison(OracleModel(mix, ep), mix, ep, 3, n_layers=2, n_tasks_theory=1, reference=fam,
                            theory_kw={"n_histories": 32, "burn_in": 20, "seed": 5})
    R = out["receptive_field"]
    cols = np.flatnonzero(ep.test_mask & (ep.position >= R) & (np.arange(ep.seq_len) >= 1))
    task = task_oracle(mix, ep, dtype=torch.float64)[:, cols]
    tv = []
    for i in range(len(ep)):
        p = torch.as_tensor(memory_predictor(mix.task(int(ep.task_ids[i])), ep.tokens[i][None].astype(np.int64), R)[0])
        tv.append(float((0.5 * (p[cols] - task[i]).abs().sum(-1)).mean()))
    assert out["lmem_tv"] == pytest.approx(np.mean(tv), rel=1e-9) and out["lmem_tv"] > 0
    anon = ep.subset(np.arange(len(ep)))
    anon.task_ids = np.full(len(ep), -1)
    fb = mixture_oracle(fam, anon, dtype=torch.float64)[0][:, cols]
    assert out["mix_tv"] == pytest.approx(float((0.5 * (fb - task).abs().sum(-1)).mean(1).mean()), rel=1e-9)


@pytest.mark.parametrize("n_layers, window", [(3, 4), (2, 5)])
def test_receptive_field_of_a_windowed_transformer(n_layers, window):
    """Perturb the token just outside / just inside R = n_layers (w - 1) + 1 of a real banded Transformer: the
    logits at t change for tokens t - R + 1 .. t and never for t - R (nor for any earlier token)."""
    from hmmscope.config import ModelConfig
    from hmmscope.model.transformer import Transformer

    R = receptive_field(n_layers, window)
    assert R == n_layers * (window - 1) + 1 and receptive_field(n_layers, 0) == 0
    torch.manual_seed(0)
    m = Transformer(ModelConfig(n_layers=n_layers, n_heads=2, d_model=16, d_mlp=32, window=window, max_len=32),
                    V + 1).eval()
    x = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    t = 20
    with torch.no_grad():
        base = m(x)[0][:, t]
        for p in range(t + 1):
            y = x.clone()
            y[:, p] = (y[:, p] + 1) % V
            changed = not torch.equal(m(y)[0][:, t], base)
            assert changed == (p >= t - R + 1), (p, t - R + 1)


# ---------------------------------------------------------------- issue 26.1 / 27: gains, fresh tasks, pairs, regimes

HC = HMMConfig(n_tasks=4, n_states=6, n_tokens=V, rank=3, gamma=0.7, rho=0.05, seed=1)


def test_in_context_gain_is_on_the_same_tokens(mix, ep):
    """The task oracle cannot gain from demonstrations: on the same test tokens at k = 0 and k = k_max its gain is
    exactly 0, as is that of a model that IS the task oracle. (On all scored tokens it is not: k = 0 drops test
    position 0, which the by-k rows keep at k >= 1, the bias of the records before issue 26.)"""
    umix, uep = unseen_episodes(HC, DATA, 24)
    es = eval_set(None, uep, tasks="unseen", task_mix=umix, learner=None)
    res = figure1_tables(TaskOracleModel([(umix, uep)]), [es], batch_size=24)
    gains = {g["predictor"]: g for g in res.gains}
    assert gains["task_oracle"]["icl_gain"] == 0.0 and gains["task_oracle"]["n_tokens"] == DATA.l_test - 1
    assert abs(gains["model"]["icl_gain"]) < 1e-12
    biased = res.row("task_oracle", 0, "unseen")["ce"] - res.row("task_oracle", DATA.n_demos, "unseen")["ce"]
    assert abs(biased) > 1e-6  # what the old definition reported for the same predictor
    # by hand: positions >= 1 of the test segment at both k
    e0, ek = truncate_demos(uep, 0), truncate_demos(uep, DATA.n_demos)
    m0 = score_by_k(FixedModel(np.linspace(0, 1, V + 1)), es)
    assert m0[0]["ce_same"] == pytest.approx(m0[0]["ce"], rel=1e-12)  # at k = 0 every scored token is a "same" token
    y = torch.as_tensor(ek.tokens[:, ek.test_mask & (ek.position >= 1)].astype(np.int64))
    p = torch.softmax(torch.as_tensor(np.linspace(0, 1, V + 1))[:V], 0)
    assert m0[DATA.n_demos]["ce_same"] == pytest.approx(float(-torch.log(p[y]).mean()), rel=1e-6)  # float32 logits
    assert e0.seq_len == DATA.l_test


def test_fresh_tasks_figure1_has_no_seen_rows():
    """With no training mixture (hmm.n_tasks = 0) only unseen tasks are scored; family Bayes is the mixture reference
    (excess_ce, kl_mix); seen-task and mixture-oracle metrics are absent, not NaN."""
    umix, uep = unseen_episodes(HC, DATA, 24)
    fam = family_tasks(HC, DATA, 16)
    res = figure1(FixedModel(np.zeros(V + 1)), None, None, unseen=(umix, uep), family=fam, learner=None,
                  family_sizes=(4, 8), batch_size=24)
    assert res.tasks == ["unseen"] and res.retrieval is None
    assert {r["predictor"] for r in res.by_k} == {"model", "task_oracle", "family_bayes", "incontext_unigram",
                                                  "incontext_bigram"}
    h = res.headline()
    assert not any(k.startswith("eval/seen/") or "oracle_mix" in k or "retrieval" in k for k in h)
    m, f = res.row("model", tasks="unseen"), res.row("family_bayes", tasks="unseen")
    # family Bayes over 16 tasks is degenerate here, so never an excess (SCIENCE.md 9;
    # failed before: excess_ce = model - family Bayes was reported)
    assert f["degenerate"], f  # its in-context gain or its CE at some k (regimes.degenerate)
    assert math.isnan(m["excess_ce"]) and math.isnan(m["kl_mix"]) and "eval/unseen/excess_ce" not in h
    assert h["baseline/unseen/family_bayes/degenerate"] == 1.0
    assert not any(k.startswith("eval/unseen/vs/family_bayes") for k in h)
    big = figure1(FixedModel(np.zeros(V + 1)), None, None, unseen=(umix, uep), family=family_tasks(HC, DATA, 512),
                  learner=None, batch_size=24)
    m2, f2 = big.row("model", tasks="unseen"), big.row("family_bayes", tasks="unseen")
    assert not f2["degenerate"] and m2["excess_ce"] == pytest.approx(m2["ce"] - f2["ce"], abs=1e-12)
    assert f2["excess_ce"] == 0.0 and "baseline/unseen/family_bayes/degenerate" not in big.headline()
    conv = {c["M"]: c["ce"] for c in res.meta["sets"]["unseen"]["family_bayes_convergence"]}
    assert set(conv) == {4, 8, 16} and conv[16] == pytest.approx(f["ce"], rel=1e-12)
    assert h["baseline/unseen/family_bayes/ce_M4"] == conv[4]
    with pytest.raises(ValueError, match="fresh tasks"):
        eval_set(None, uep, tasks="seen", learner=None)


def test_paired_comparisons_are_on_the_same_episodes(mix, ep):
    umix, uep = unseen_episodes(HC, DATA, 30)
    es = eval_set(mix, uep, tasks="unseen", task_mix=umix, learner=None)
    model = FixedModel(np.linspace(-1, 1, V + 1))
    res = figure1_tables(model, [es])
    per = {k: score_by_k(model, es)[k] for k in es.ks}
    for r in (r for r in res.paired if r["baseline"] == "incontext_bigram"):
        mod = model_predictive(model, es.by_k[r["k"]].episodes.tokens, n_obs=V, dtype=torch.float64)[:, es.by_k[r["k"]].cols]
        y = es.by_k[r["k"]].y
        d = (-torch.log(mod.gather(-1, y[..., None])[..., 0])).mean(1).numpy() - \
            es.by_k[r["k"]].references["incontext_bigram"]["ce"].mean(1)
        assert r["diff"] == pytest.approx(d.mean(), abs=1e-12)
        assert r["diff_hi"] - r["diff"] == pytest.approx(1.96 * d.std(ddof=1) / math.sqrt(len(d)), rel=1e-9)
        assert r["diff"] == pytest.approx(per[r["k"]]["ce"] - res.row("incontext_bigram", r["k"], "unseen")["ce"], abs=1e-12)
    h = res.headline()
    assert h[f"eval/unseen/vs/incontext_bigram/k{DATA.n_demos}"] == next(
        r["diff"] for r in res.paired if r["baseline"] == "incontext_bigram" and r["k"] == DATA.n_demos)


def _c(name, lo, hi, verdicts=None, requires=()):
    return claim(name, name, (lo + hi) / 2, lo, hi, rule("<" if name == "inference_beyond_counting" else ">", 0, requires),
                 "", verdicts, df=math.inf)


@pytest.mark.parametrize("gap,gain,vs,word", [
    ((0.2, 0.4), (0.1, 0.2), (-0.2, -0.1), "retrieval"),  # a supported retrieval gap decides first
    ((-0.01, 0.02), (0.1, 0.2), (-0.2, -0.1), "inference beyond counting"),
    (None, (0.1, 0.2), (-0.2, -0.1), "inference beyond counting"),  # fresh tasks: no retrieval gap at all
    # failed before: a model above best counting on its CI was called "counting" (SCIENCE.md 9)
    ((-0.01, 0.02), (0.1, 0.2), (0.05, 0.1), "worse than counting"),  # above best counting on its CI
    ((-0.01, 0.02), (0.1, 0.2), (0.2227, 0.3135), "worse than counting"),
    ((-0.01, 0.02), (0.1, 0.2), (-0.05, 0.02), "counting"),  # level with best counting: the CI straddles 0
    ((-0.01, 0.02), (0.1, 0.2), (0.0, 0.02), "counting"),  # the CI touches 0: level
    ((-0.01, 0.02), (-0.01, 0.01), (-0.2, -0.1), "undetermined"),  # below counting, but no gain shown
])
def test_regime_words(gap, gain, vs, word):
    g = _c("icl_gain", *gain)
    claims = [g, _c("inference_beyond_counting", *vs, {"icl_gain": g.verdict}, ["icl_gain"])]
    if gap is not None:
        claims.insert(0, _c("retrieval_gap", *gap))
    assert regime(claims) == word and word in REGIMES
    assert regime([{"name": c.name, "verdict": c.verdict, "ci_lo": c.ci_lo, "ci_hi": c.ci_hi} for c in claims]) == word
    assert regime([]) == "undetermined"
