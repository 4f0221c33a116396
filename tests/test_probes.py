"""Linear probes (Figures 3a, 3b, belief probes): planted signals, controls, splits, verdicts, task_beliefs."""

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hmmscope.config import DataConfig, HMMConfig, ModelConfig
from hmmscope.data.episodes import layout, sample_episodes
from hmmscope.data.hmm import HMM, Mixture, make_mixture
from hmmscope.measure.probes import (
    ProbeResult,
    TargetScores,
    collect_residuals,
    probe_claims,
    run_probes,
    sample_positions,
    split_episodes,
)
from hmmscope.model.transformer import Transformer, resid_names, run_with_cache
from hmmscope.oracles.inference import task_beliefs
from hmmscope.stats import check_claims

F64 = torch.float64


# ---------------------------------------------------------------- task_beliefs


def _brute_filtered(start, T, O, tokens):
    """p(s_last | tokens) by summing over all S^k hidden paths."""
    S, k = len(start), len(tokens)
    num = np.zeros(S)
    for path in itertools.product(range(S), repeat=k):
        p = start[path[0]] * O[path[0], tokens[0]]
        for i in range(1, k):
            p *= T[path[i - 1], path[i]] * O[path[i], tokens[i]]
        num[path[-1]] += p
    return num / num.sum()


@pytest.mark.parametrize("test_start, burn_in", [("initial", 0), ("midstream", 3)])
def test_task_beliefs_matches_brute_force(test_start, burn_in):
    rng = np.random.default_rng(3)
    S, V, n_demos, l_demo, l_test = 3, 2, 2, 2, 4
    hs = []
    for _ in range(2):
        W, Q = rng.dirichlet(np.ones(2), S), rng.dirichlet(np.ones(S), 2)
        hs.append(HMM(rng.dirichlet(np.ones(S)), W @ Q, rng.dirichlet(np.ones(V), S), factors=(W, Q)))
    mix = Mixture(*(np.stack([getattr(h, a) for h in hs]) for a in ("initial", "W", "Q", "emission")), np.ones(2) / 2)
    seg, pos = layout(n_demos, l_demo, l_test)
    tokens = np.where(seg >= 0, rng.integers(0, V, (4, len(seg))), V)
    task_ids = np.array([0, 1, 1, 0])
    ep = SimpleNamespace(tokens=tokens, task_ids=task_ids, segment=seg, position=pos, test_mask=seg == n_demos,
                         n_demos=n_demos, test_start=test_start, burn_in=burn_in, meta={})
    got = task_beliefs(mix, ep, dtype=F64).numpy()
    assert got.shape == (4, len(seg), S)
    for i in range(4):
        h = hs[task_ids[i]]
        test_dist = h.initial @ np.linalg.matrix_power(h.transition, burn_in)
        for t in range(len(seg)):
            if seg[t] < 0:
                assert np.isnan(got[i, t]).all()
                continue
            first = t - pos[t]
            start = test_dist if seg[t] == n_demos else h.initial
            np.testing.assert_allclose(got[i, t], _brute_filtered(start, h.transition, h.emission, tokens[i, first:t + 1]),
                                       atol=1e-12)
    # the belief at t uses o_t: changing o_t changes it, changing o_{t+1} does not
    t = len(seg) - 2
    flip = tokens.copy()
    flip[:, t + 1] = 1 - flip[:, t + 1]
    np.testing.assert_allclose(task_beliefs(mix, SimpleNamespace(**{**vars(ep), "tokens": flip}), dtype=F64)[:, t],
                               got[:, t], atol=1e-14)


# ---------------------------------------------------------------- planted signals

V = 8
N_EP = 240


@pytest.fixture(scope="module")
def data():
    mix = make_mixture(HMMConfig(n_tasks=4, n_states=8, n_tokens=V, rank=4, gamma=0.6, seed=1))
    ep = sample_episodes(mix, DataConfig(n_demos=1, l_demo=6, l_test=16, seed=2), N_EP, split="eval")
    return mix, ep


class Planted:
    """Layer l = strength[l] * one-hot(o_{t-k}) + N(0, 1) noise (plus 4 pure-noise dims)."""

    def __init__(self, k=1, strength=(0.0, 1.2, 5.0, 1.2, 0.0)):
        self.k, self.strength = k, strength

    def __call__(self, tok, layer, idx):
        g = torch.Generator().manual_seed(1000 * layer + int(idx[0]))
        onehot = torch.nn.functional.one_hot(torch.roll(tok, self.k, 1).clamp(max=V - 1), V).float()
        x = torch.cat([self.strength[layer] * onehot, torch.zeros(*tok.shape, 4)], -1)
        return x + torch.randn(x.shape, generator=g)


def test_planted_kback_signal(data, tmp_path):
    mix, ep = data
    r = run_probes(Planted(), mix, ep, ks=(1, 2), n_layers=5, positions_per_episode=8, n_boot=300, belief=False)
    rows = {(x["target"], x["layer"]): x for x in r.table}
    acc1 = [rows["kback1", l]["acc"] for l in range(5)]
    assert int(np.argmax(acc1)) == 2 and acc1[2] > 0.95
    assert acc1[1] > rows["kback1", 1]["chance"] + 0.1 and acc1[0] < rows["kback1", 0]["chance"] + 0.08
    for l in range(5):  # the shuffled control never beats chance; on pure noise it sits at chance, inside its CI
        x = rows["kback1", l]
        assert x["control_acc"] < x["chance"] + 0.04 and x["control_lo"] < x["chance"]
        if l in (0, 4):  # pure noise: near the majority rate (a probe that overfits noise spreads its guesses)
            assert abs(x["control_acc"] - x["chance"]) < 0.05
    assert rows["kback1", 2]["beats_control"] and not rows["kback1", 0]["beats_control"]
    claims = {c.name: c for c in r.claims}
    assert claims["kback1_rises_then_falls"].verdict == "supported"
    assert claims["kback1_rises_then_falls"].ci_lo > 0.2  # min(rise, fall) with the peak at layer 2
    assert claims["kback1_beats_control"].verdict == "supported"
    assert claims["kback1_beats_baseline"].verdict == "supported"  # the features carry o_(t-1) itself
    assert check_claims(r.claims) == []
    summary = {s["target"]: s for s in r.summary}
    assert summary["kback1"]["peak_layer"] == 2 and summary["kback1"]["peak_lo"] == summary["kback1"]["peak_hi"] == 2
    # split by episode: disjoint, covering, and the reported sizes agree with it
    test = np.asarray(r.meta["test_episodes"])
    train = np.setdiff1d(np.arange(N_EP), test)
    assert len(np.intersect1d(train, test)) == 0 and len(train) == r.meta["n_train_episodes"]
    assert rows["kback1", 2]["n_test"] + rows["kback1", 2]["n_train"] == N_EP * 8 - (
        sample_positions(ep, 8, 0) == np.flatnonzero(ep.test_mask)[0]).sum()  # k=1 drops test position 0
    # outputs
    blob = json.dumps(r.to_dict(), allow_nan=False)
    assert "kback1_rises_then_falls" in blob
    paths = r.to_csv(tmp_path / "csv")
    assert {p.name for p in paths} >= {"probes.csv", "probe_claims.csv"} and all(p.stat().st_size > 0 for p in paths)
    png, pdf = r.plot(tmp_path / "probes.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"


def test_figure3_legends_with_five_ks():
    """Chance and the shuffled control in the legends of 3a and 3b; 3b with k = 1..5 keeps one legend entry and one
    colour per k (a sequential map, so k's order shows), its CIs as dodged error bars, and a style key."""
    rows, summary = [], []
    targets = ["task", "state", *(f"kback{k}" for k in range(1, 6))]
    for t in targets:
        for l in range(4):
            acc = 0.3 + 0.1 * l
            rows.append({"target": t, "layer": l, "acc": acc, "acc_lo": acc - 0.05, "acc_hi": acc + 0.05,
                         "control_acc": 0.2, "chance": 0.25})
        summary.append({"target": t, **({"baseline_acc": 0.28} if t.startswith("kback") else {})})
    belief = [{"layer": l, "r2": 0.1 * l, "r2_lo": 0.1 * l - 0.02, "r2_hi": 0.1 * l + 0.02, "control_r2": 0.0}
              for l in range(4)]
    fig = ProbeResult(rows, belief, summary, [], {"n_episodes": 40}).figure(title="run q")
    a3, b3, belief_ax = fig.axes
    texts = {ax: [t.get_text() for t in ax.get_legend().get_texts()] for ax in (a3, b3, belief_ax)}
    for ax in (a3, b3):
        assert "chance (majority class)" in texts[ax] and "shuffled-label control" in texts[ax]
    assert "(task, o_t) baseline" in texts[b3] and "chance (R^2 = 0)" in texts[belief_ax]
    assert [x for x in texts[b3] if x.startswith("k = ")] == [f"k = {k}" for k in range(1, 6)]
    bars = [c for c in b3.containers if c.get_label().startswith("k = ")]
    colours = [tuple(c.lines[0].get_color()) for c in bars]
    assert len(bars) == 5 and len(set(colours)) == 5
    xs = [c.lines[0].get_xdata()[0] for c in bars]
    assert xs == sorted(xs) and len(set(xs)) == 5  # dodged: no two k's error bars on one x
    assert "run q" in fig._suptitle.get_text() and "0 = embedding" in a3.get_xlabel()


def test_split_episodes_is_disjoint_and_seeded():
    a, b = split_episodes(100, 0.25, seed=0), split_episodes(100, 0.25, seed=0)
    assert a.sum() == 25 and (a == b).all() and not (a == split_episodes(100, 0.25, seed=1)).all()
    assert split_episodes(2, 0.9).sum() == 1


def test_belief_probe_linear_map_vs_noise(data):
    mix, ep = data
    bel = np.nan_to_num(task_beliefs(mix, ep, dtype=F64).numpy())
    A = np.random.default_rng(0).normal(size=(mix.n_states, 12))

    def fn(tok, layer, idx):
        g = torch.Generator().manual_seed(layer * 7919 + int(idx[0]))
        noise = torch.randn(*tok.shape, 12, generator=g)
        return torch.as_tensor(bel[idx, :tok.shape[1]] @ A).float() + 1e-3 * noise if layer == 1 else noise

    r = run_probes(fn, mix, ep, ks=(1,), n_layers=2, positions_per_episode=8, n_boot=200)
    b = {x["layer"]: x for x in r.belief_table}
    assert b[1]["r2"] > 0.99 and b[1]["r2_lo"] > 0.98
    assert abs(b[0]["r2"]) < 0.05 and b[0]["r2_lo"] < 0 < b[0]["r2_hi"] + 0.02
    assert b[1]["control_r2"] < 0.2  # position-stratified control: what position alone predicts
    c = {c.name: c for c in r.claims}["belief_beats_control"]
    assert c.verdict == "supported" and c.value > 0.9
    assert {c.name: c for c in r.claims}["kback1_rises_then_falls"].verdict == "inconclusive"  # 2 layers


# ---------------------------------------------------------------- residual collection


def test_collect_residuals_matches_cache_and_streams(data):
    _, ep = data
    ep = ep.subset(slice(0, 10))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, max_len=64), V + 1).eval()
    pos = sample_positions(ep, 5, seed=3)
    test = np.flatnonzero(ep.test_mask)
    assert pos.shape == (10, 5) and np.isin(pos, test).all() and (np.diff(pos, axis=1) > 0).all()
    assert (pos == sample_positions(ep, 5, seed=3)).all() and not (pos == sample_positions(ep, 5, seed=4)).all()
    _, cache = run_with_cache(model, torch.as_tensor(ep.tokens.astype(np.int64)))
    names = resid_names(2)
    for budget in (1, 1 << 30):  # one layer per forward, or all at once
        res = collect_residuals(model, ep, positions_per_episode=5, seed=3, batch_size=4, mem_budget=budget)
        got = dict(iter(res))
        assert sorted(got) == [0, 1, 2]
        for l, X in got.items():
            assert X.dtype == np.float32 and X.shape == (10, 5, 16)
            want = cache[names[l]].numpy()[np.arange(10)[:, None], pos]
            np.testing.assert_allclose(X, want, atol=1e-5)
    # the residual at t sees tokens <= t only: changing a later token leaves it unchanged
    res = collect_residuals(model, ep, positions=[test[3]], layers=[2])
    tok2 = ep.tokens.copy()
    tok2[:, test[4]] = (tok2[:, test[4]] + 1) % V
    res2 = collect_residuals(model, SimpleNamespace(tokens=tok2, task_ids=ep.task_ids), positions=[test[3]], layers=[2])
    np.testing.assert_allclose(res.get(2), res2.get(2), atol=1e-6)


# ---------------------------------------------------------------- verdict logic


def _scores(acc, n_test=160, P=16, seed=0, chance=0.1, ctrl=0.1):
    """Planted per-episode hits: P scored positions per test episode, hit probability acc[layer]."""
    rng = np.random.default_rng(seed)
    return {t: TargetScores(rng.binomial(P, np.broadcast_to(np.asarray(a, float), (n_test, len(a)))).astype(float),
                            rng.binomial(P, np.full((n_test, len(a)), ctrl)).astype(float), np.full(n_test, float(P)),
                            chance) for t, a in acc.items()}


def _verdicts(acc, ks, **kw):
    claims, summary, _ = probe_claims(range(5), _scores(acc, **kw), ks=ks, n_boot=400)
    assert check_claims(claims) == []
    return {c.name: c for c in claims}, summary


def test_verdicts_on_constructed_curves():
    acc = {"task": [0.1, 0.2, 0.5, 0.95, 1.0], "state": [0.1, 0.9, 0.95, 0.95, 0.95],
           "kback1": [0.2, 0.9, 0.7, 0.5, 0.3], "kback2": [0.2, 0.5, 0.8, 0.6, 0.3], "kback3": [0.1, 0.3, 0.5, 0.6, 0.4]}
    v, summary = _verdicts(acc, (1, 2, 3))
    for k in (1, 2, 3):
        assert v[f"kback{k}_rises_then_falls"].verdict == "supported" and v[f"kback{k}_rises_then_falls"].value > 0.1
    # noise-free peaks 1, 2, 3: the slope is 1 in every resample, a zero-width CI, so no power (stats.decide)
    c = v["kback_peak_moves_up"]
    assert c.verdict == "no power" and c.value == pytest.approx(1.0) and "zero-width" in c.reason
    assert v["kback_acc_falls_with_k"].verdict == "supported" and v["kback_acc_falls_with_k"].value < 0
    assert v["state_before_task"].verdict == "supported" and v["state_before_task"].value > 0.2
    assert v["state_before_task_reach90"].value == 2 and v["state_before_task_reach50"].value == 2  # task 3, state 1
    assert all(v[f"{t}_beats_control"].verdict == "supported" for t in acc)
    assert {s["target"]: s["reach90"] for s in summary}["state"] == 1

    # state after task; a peak that moves down; accuracy that rises with k
    acc = {"task": [0.1, 0.9, 0.95, 0.95, 0.95], "state": [0.1, 0.2, 0.5, 0.9, 1.0],
           "kback1": [0.2, 0.6, 0.6, 0.5, 0.4], "kback2": [0.9, 0.99, 0.9, 0.7, 0.5], "kback3": [0.9, 1.0, 0.9, 0.8, 0.7]}
    v, _ = _verdicts(acc, (1, 2, 3))
    assert v["kback_acc_falls_with_k"].verdict == "not supported"
    assert v["state_before_task"].verdict == "not supported" and v["state_before_task_reach90"].verdict == "not supported"

    # convex curve -> not supported; flat noisy curve -> inconclusive; task never beats control -> inconclusive
    acc = {"task": [0.1] * 5, "state": [0.1, 0.9, 0.9, 0.9, 0.9], "kback1": [0.9, 0.5, 0.3, 0.5, 0.9],
           "kback2": [0.5] * 5}
    v, _ = _verdicts(acc, (1, 2), P=4)
    assert v["kback1_rises_then_falls"].verdict == "not supported"
    assert v["kback2_rises_then_falls"].verdict == "inconclusive"
    assert v["task_beats_control"].verdict != "supported"
    assert v["state_before_task"].verdict == "inconclusive" and "task_beats_control" in v["state_before_task"].reason
    json.dumps(ProbeResult([], [], [], list(v.values())).to_dict(), allow_nan=False)


def test_concave_rise_is_never_rises_then_falls():
    """A concave curve that only rises has a negative quadratic term but no fall: never 'supported'."""
    for seed in range(4):
        v, _ = _verdicts({"kback1": [0.2, 0.6, 0.8, 0.9, 0.95], "kback2": [0.3, 0.55, 0.7, 0.78, 0.8]}, (1, 2),
                         seed=seed)
        for k in (1, 2):
            c = v[f"kback{k}_rises_then_falls"]
            assert c.value <= 0 and c.ci_hi <= 0.01 and c.verdict != "supported"
        # peak at the last layer in every resample: the fall, and the statistic, is 0 in each: no power, not "supported"
        assert v["kback1_rises_then_falls"].verdict == "no power" and "zero-width" in v["kback1_rises_then_falls"].reason


def test_non_monotone_peaks_do_not_move_up():
    """Peaks (3, 4, 2, 4, 4) over k = 1..5: an OLS slope of 0.2 with a tight episode bootstrap, but not monotone."""
    peaks = (3, 4, 2, 4, 4)
    acc = {f"kback{k}": [0.9 - 0.1 * k if l == p else 0.2 for l in range(5)] for k, p in zip(range(1, 6), peaks)}
    v, _ = _verdicts(acc, (1, 2, 3, 4, 5), P=32)
    c = v["kback_peak_moves_up"]
    assert c.value == pytest.approx(0.2) and c.ci_lo < 0 < c.ci_hi and c.verdict == "inconclusive"
    # a monotone sequence with the same sharp curves: slope 1 in every resample, a zero-width CI: no power
    acc = {f"kback{k}": [0.9 - 0.1 * k if l == k - 1 else 0.2 for l in range(5)] for k in range(1, 6)}
    assert _verdicts(acc, (1, 2, 3, 4, 5), P=32)[0]["kback_peak_moves_up"].verdict == "no power"
    # peaks (0, 1, 3, 3, 4) rise with k off a line: the t interval on K - 2 df has width; supported
    acc = {f"kback{k}": [0.9 - 0.1 * k if l == p else 0.2 for l in range(5)] for k, p in zip(range(1, 6), (0, 1, 3, 3, 4))}
    c = _verdicts(acc, (1, 2, 3, 4, 5), P=32)[0]["kback_peak_moves_up"]
    assert c.ci_hi > c.ci_lo and c.verdict == "supported", c


def test_falls_with_k_needs_every_step():
    """Best accuracy 0.8, 0.5, 0.6, 0.3, 0.2 over k: the OLS slope is clearly negative, but k = 3 beats k = 2."""
    acc = {f"kback{k}": [0.1, a, 0.1, 0.1, 0.1] for k, a in zip(range(1, 6), (0.8, 0.5, 0.6, 0.3, 0.2))}
    c = _verdicts(acc, (1, 2, 3, 4, 5), P=32)[0]["kback_acc_falls_with_k"]
    assert c.value == pytest.approx(0.1, abs=0.03) and c.ci_lo > 0 and c.verdict == "not supported"
    assert "2->3: +0.1" in c.reason
    acc = {f"kback{k}": [0.1, a, 0.1, 0.1, 0.1] for k, a in zip(range(1, 6), (0.8, 0.6, 0.45, 0.3, 0.2))}
    assert _verdicts(acc, (1, 2, 3, 4, 5), P=32)[0]["kback_acc_falls_with_k"].verdict == "supported"


def test_state_before_task_leaves_the_embedding_apart():
    """Known answer: all of the positive area at layer 0. The state is at its peak in the embedding (the token
    reveals it) and the task at chance; from layer 1 on both are at their peaks. The old area over layers 0..4
    was +0.2 (= 1/5); over layers 1..4 it is 0, not positive, and the embedding's +1 stands on its own row."""
    acc = {"task": [0.1, 0.9, 0.9, 0.9, 0.9], "state": [0.9, 0.9, 0.9, 0.9, 0.9]}
    exact = {t: TargetScores(np.tile(np.round(np.asarray(a) * 10), (40, 1)), np.ones((40, 5)), np.full(40, 10.0), 0.1)
             for t, a in acc.items()}  # noise-free hits: 10 positions per episode, acc x 10 of them right
    v = {c.name: c for c in probe_claims(range(5), exact, ks=(), n_boot=100)[0]}
    assert v["state_before_task"].value == pytest.approx(0.0, abs=1e-12) and v["state_before_task"].verdict != "supported"
    assert "1..4" in v["state_before_task"].statistic
    assert v["state_before_task_layer0"].value == pytest.approx(1.0)
    v, _ = _verdicts(acc, (), P=32)  # with sampling noise: the area straddles 0, the embedding's row is supported
    assert v["state_before_task"].verdict != "supported" and abs(v["state_before_task"].value) < 0.02
    assert v["state_before_task_layer0"].verdict == "supported"
    # the retrieval record's shape: state ahead at the embedding only, then the task ahead: the area is negative
    acc = {"task": [0.25, 0.99, 0.99, 0.99, 0.99], "state": [0.64, 0.70, 0.74, 0.77, 0.78]}
    v, _ = _verdicts(acc, (), P=32, chance=0.2)
    assert v["state_before_task"].value < 0 and v["state_before_task"].ci_hi < 0
    assert v["state_before_task_layer0"].value > 0.5
    # a layer set without the embedding: the area runs over all of them and there is no layer-0 row
    claims, _, _ = probe_claims([1, 2, 3], _scores({"task": [0.1, 0.9, 0.9], "state": [0.9, 0.9, 0.9]}), ks=(),
                                n_boot=100)
    names = {c.name: c for c in claims}
    assert "state_before_task_layer0" not in names and names["state_before_task"].value > 0.2


def test_falls_with_k_is_judged_on_the_excess_over_token_statistics():
    """Raw best accuracy that rises from k = 2 to k = 3 (0.5 -> 0.9) because o_t alone predicts o_(t-3) (token
    statistics 0.85): the excess over the token statistics falls at every step, so the claim is supported; without
    the token baseline the same probes read "not supported" (the raw accuracy rises)."""
    acc = {f"kback{k}": [0.1, a, 0.1, 0.1, 0.1] for k, a in zip((1, 2, 3), (0.8, 0.5, 0.9))}
    sc = _scores(acc, P=32)
    rng = np.random.default_rng(5)
    tok = {k: rng.binomial(32, p, 160).astype(float) for k, p in zip((1, 2, 3), (0.1, 0.1, 0.85))}
    claims, summary, _ = probe_claims(range(5), sc, ks=(1, 2, 3), n_boot=400, token_baseline=tok)
    assert check_claims(claims) == []
    v = {c.name: c for c in claims}
    c = v["kback_acc_falls_with_k"]
    assert c.verdict == "supported" and c.value < 0 and "token-statistics" in c.statistic, c
    assert v["kback3_beats_token_stats"].value == pytest.approx(0.05, abs=0.03)
    assert v["kback1_beats_token_stats"].verdict == "supported"
    row = next(r for r in summary if r["target"] == "kback3")
    assert row["token_acc"] == pytest.approx(tok[3].sum() / (32 * 160)) and row["excess_over_token_stats"] < 0.1
    raw = {c.name: c for c in probe_claims(range(5), sc, ks=(1, 2, 3), n_boot=400)[0]}
    assert raw["kback_acc_falls_with_k"].verdict == "not supported" and "kback3_beats_token_stats" not in raw


def test_best_layer_is_cross_fitted():
    """Flat curves at the control's level: the best of 5 layers chosen on the scoring data is biased up (the
    naive value below); cross-fitted (each half scored at the other half's best layer) it is centred on 0."""
    cf, naive = [], []
    for seed in range(20):
        sc = _scores({"kback1": [0.3] * 5}, seed=seed, P=4, ctrl=0.3, chance=0.05)
        cf.append(probe_claims(range(5), sc, ks=(1,), n_boot=100)[0][0].value)
        s = sc["kback1"]
        acc, ctrl = s.hits.sum(0) / s.counts.sum(), s.control.sum(0) / s.counts.sum()
        naive.append(acc.max() - ctrl[acc.argmax()])
    se = np.std(cf, ddof=1) / np.sqrt(len(cf))
    assert abs(np.mean(cf)) < 3 * se and np.mean(naive) > np.mean(cf) + 3 * se


# ---------------------------------------------------------------- within-task state, baseline, scale


def test_state_is_probed_within_task(data):
    """Features = one-hot of a task-specific relabelling of the state: each task's state is linearly decodable,
    but the raw index over tasks needs the task (the pooled probe cannot separate the relabellings)."""
    mix, ep = data
    perm = np.stack([np.random.default_rng(10 + i).permutation(mix.n_states) for i in range(mix.n_tasks)])

    def fn(tok, layer, idx):
        s = torch.as_tensor(perm[ep.task_ids[idx][:, None], np.maximum(ep.states[idx, :tok.shape[1]], 0)])
        return torch.nn.functional.one_hot(s, mix.n_states).float() + 0.1 * torch.randn(*s.shape, mix.n_states,
                                                                                      generator=torch.Generator().manual_seed(layer))

    r = run_probes(fn, mix, ep, ks=(1,), n_layers=1, positions_per_episode=8, n_boot=200, belief=False)
    rows = {x["target"]: x for x in r.table}
    assert rows["state"]["acc"] > 0.97 and rows["state_pooled"]["acc"] < rows["state"]["acc"] - 0.3
    assert rows["state"]["chance"] > rows["state_pooled"]["chance"]  # within-task majority rate
    c = {c.name: c for c in r.claims}
    assert c["state_beats_control"].verdict == "supported" and "state_pooled_beats_control" in c


def test_kback_baseline_isolates_memory(data):
    """Features = one-hot(task) x one-hot(o_t): no memory of o_(t-1), yet o_(t-1) is predictable from them.
    The k-back probe beats its shuffled control but not the (task, current token) baseline."""
    mix, ep = data

    def fn(tok, layer, idx):
        cur = tok.clamp(max=V - 1) + V * torch.as_tensor(ep.task_ids[idx])[:, None]
        return torch.nn.functional.one_hot(cur, V * mix.n_tasks).float()

    r = run_probes(fn, mix, ep, ks=(1,), n_layers=1, positions_per_episode=12, n_boot=300, belief=False)
    c = {c.name: c for c in r.claims}
    assert c["kback1_beats_control"].verdict == "supported"
    assert c["kback1_beats_baseline"].verdict != "supported" and abs(c["kback1_beats_baseline"].value) < 0.03
    s = next(x for x in r.summary if x["target"] == "kback1")
    assert s["baseline_acc"] > s["chance"] + 0.1


def test_token_statistics_baseline_is_what_the_current_token_gives(data):
    """Features = one-hot(o_t) only: the probe can read o_(t-1) only through what o_t predicts of it, which is what
    the token-statistics lookup gets; the probe's excess over it is ~0 (never supported), and kback_baselines, which
    needs no model, gives the hits run_probes used."""
    from hmmscope.measure.probes import kback_baselines

    mix, ep = data

    def fn(tok, layer, idx):
        return torch.nn.functional.one_hot(tok.clamp(max=V - 1), V).float()

    r = run_probes(fn, mix, ep, ks=(1, 2), n_layers=1, positions_per_episode=12, n_boot=300, belief=False)
    c = {c.name: c for c in r.claims}
    for k in (1, 2):
        assert c[f"kback{k}_beats_token_stats"].verdict != "supported"
        assert abs(c[f"kback{k}_beats_token_stats"].value) < 0.03
    s = {x["target"]: x for x in r.summary}
    assert s["kback1"]["token_acc"] > s["kback1"]["chance"]  # the current token says something about the last one
    assert s["kback1"]["baseline_acc"] >= s["kback1"]["token_acc"] - 0.01  # knowing the task too helps, if anything
    pos = sample_positions(ep, 12, seed=0)
    base = kback_baselines(ep, pos, split_episodes(len(ep.task_ids), 0.25, 0), (1, 2))
    for k in (1, 2):
        task, alone, n = base[k]
        assert alone.sum() / n.sum() == pytest.approx(s[f"kback{k}"]["token_acc"])
        assert task.sum() / n.sum() == pytest.approx(s[f"kback{k}"]["baseline_acc"])


def test_task_probe_at_8192_tasks():
    """Paper-scale n_tasks: dedicated probe episodes from a fixed subset of 32 tasks, >= 30 episodes each, so the
    task probe is trained on every task it is tested on (with prior-drawn episodes most tasks appear once)."""
    from hmmscope.data.episodes import probe_episodes

    mix = make_mixture(HMMConfig(n_tasks=8192, n_states=3, n_tokens=4, rank=2, gamma=0.5, seed=0))
    data = DataConfig(n_demos=1, l_demo=4, l_test=6, seed=1)
    ep = probe_episodes(mix, data, n_tasks=32, per_task=30)
    tasks, counts = np.unique(ep.task_ids, return_counts=True)
    assert len(tasks) == 32 and counts.min() >= 30
    code = np.random.default_rng(0).normal(size=(mix.n_tasks, 16)).astype(np.float32)

    def fn(tok, layer, idx):  # the residual carries the task (a random code per task) plus noise
        x = torch.as_tensor(code[ep.task_ids[idx]])[:, None].expand(len(idx), tok.shape[1], 16)
        return x + NOISE * torch.randn(x.shape, generator=torch.Generator().manual_seed(int(idx[0])))

    NOISE = 1.0  # enough that some test positions are missed: a perfect probe's CI is zero-width (no power)
    r = run_probes(fn, mix, ep, ks=(1,), n_layers=1, positions_per_episode=2, n_boot=200, belief=False)
    task = next(x for x in r.table if x["target"] == "task")
    assert sorted(r.meta["tasks_probed"]) == tasks.tolist() and r.meta["episodes_per_task"]["min"] >= 30
    assert task["n_classes"] == 32 and task["acc"] > 0.8 and task["chance"] < 0.1
    assert {c.name: c for c in r.claims}["task_beats_control"].verdict == "supported"


# ---------------------------------------------------------------- parallel fits


def _numbers(r: ProbeResult) -> str:
    d = r.to_dict()
    del d["meta"]["timings"], d["meta"]["n_jobs"]
    return json.dumps(d, sort_keys=True)


def test_parallel_layer_fits_give_the_same_numbers():
    """n_jobs=2 (spawned workers) gives exactly the numbers of n_jobs=1: same split, controls, fits, ridge splits."""
    from hmmscope.data.episodes import probe_episodes

    torch.manual_seed(0)
    mix = make_mixture(HMMConfig(n_tasks=6, n_states=8, n_tokens=6, rank=4, gamma=0.6, seed=1))
    ep = probe_episodes(mix, DataConfig(n_demos=1, l_demo=6, l_test=10, seed=2), 4, 10)
    model = Transformer(ModelConfig(n_layers=4, n_heads=2, d_model=16, d_mlp=32, max_len=64), vocab_size=7)
    kw = dict(ks=(1, 2), positions_per_episode=6, n_boot=100, max_tasks=4)
    lines: list[str] = []
    one = run_probes(model, mix, ep, **kw)
    two = run_probes(model, mix, ep, n_jobs=2, progress=lines.append, **kw)  # 5 layers: 4 in flight, then waits
    assert two.meta["n_jobs"] == 2 and one.meta["n_jobs"] == 1
    assert len(two.belief_table) == 5 and {x["target"] for x in two.table} >= {"task", "state", "kback2"}
    assert _numbers(two) == _numbers(one)
    per_layer = [x for x in lines if x.startswith("layer ")]  # progress: one line per layer, in layer order
    assert [x.split(" (")[0] for x in per_layer] == [f"layer {i}/5 done" for i in range(1, 6)]
    assert all(x.endswith("s in one of 2 processes)") for x in per_layer)
    assert lines[0].startswith("belief targets: 40 episodes x 6 positions x 8 states")
    assert lines[-1] == "statistics done (100 bootstrap resamples)"


@pytest.mark.parametrize("kw, needle", [({"n_jobs": 0}, "n_jobs must be an integer >= 1"),
                                        ({"n_jobs": 1.5}, "n_jobs must be an integer >= 1"),
                                        ({"n_jobs": 2, "warm_start": True}, "layers fit in order: use n_jobs=1")])
def test_bad_n_jobs_and_warm_start_in_parallel_are_errors(data, kw, needle):
    mix, ep = data
    with pytest.raises(ValueError, match=needle):
        run_probes(lambda tok, layer, idx: torch.zeros(*tok.shape, 2), mix, ep, ks=(1,), n_layers=2, **kw)


def test_an_error_mid_run_stops_the_fit_workers(data):
    import multiprocessing

    mix, ep = data

    def fn(tok, layer, idx):  # layer 2 fails after layers 0 and 1 went to the workers
        if layer == 2:
            raise RuntimeError("residuals failed")
        return torch.randn(*tok.shape, 4, generator=torch.Generator().manual_seed(layer))

    with pytest.raises(RuntimeError, match="residuals failed"):
        run_probes(fn, mix, ep, ks=(1,), n_layers=3, n_jobs=2, belief=False, mem_budget=1)
    assert multiprocessing.active_children() == []


def test_the_fit_workers_are_reaped_when_the_pool_reaps_them_late(data, monkeypatch):
    """The race behind a flaky failure of the test above: the pool's manager thread waits for (reaps) each worker
    that ends while the clean-up joined the workers too. Two threads joining one child: the loser of the waitpid
    gets ECHILD and its join returns as if the child ran on, so a dead worker stayed among the children. The race
    is widened here, the real processes and threads unchanged: the manager thread holds a worker it reaped for a
    moment before recording it, and the main thread waits a little before each waitpid."""
    import multiprocessing
    import os
    import threading
    import time

    real = os.waitpid

    def waitpid(pid, flags):
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.3)  # the manager thread reaps first
            return real(pid, flags)
        out = real(pid, flags)
        if out[0] == pid:
            time.sleep(1.0)  # reaped, not yet recorded
        return out

    mix, ep = data

    def fn(tok, layer, idx):
        if layer == 2:
            raise RuntimeError("residuals failed")
        return torch.randn(*tok.shape, 4, generator=torch.Generator().manual_seed(layer))

    monkeypatch.setattr(os, "waitpid", waitpid)
    with pytest.raises(RuntimeError, match="residuals failed"):
        run_probes(fn, mix, ep, ks=(1,), n_layers=3, n_jobs=2, belief=False, mem_budget=1)
    assert multiprocessing.active_children() == []


def test_new_probe_intervals_cover_planted_nulls():
    """The per-run bootstrap CIs of issue 26's new statistics cover a planted null at their nominal 95% (300
    simulated runs, 60 held-out episodes x 8 positions, binomial test): the k-back excess over the token
    statistics (the probe's single peak 0.6 = the token statistics' 0.6) and the embedding's state - task row
    (identical task and state curves). The area over layers 1..L (clipped, normalized) covers at least nominally."""
    from scipy import stats

    rng, n, n_test, P = np.random.default_rng(1), 300, 60, 8
    acc = np.array([0.2, 0.3, 0.6, 0.3, 0.2])
    hits = {"kback1_beats_token_stats": 0, "state_before_task_layer0": 0, "state_before_task": 0}
    for i in range(n):
        sc = {t: TargetScores(rng.binomial(P, np.broadcast_to(acc, (n_test, 5))).astype(float),
                              rng.binomial(P, np.full((n_test, 5), 0.1)).astype(float), np.full(n_test, float(P)), 0.1)
              for t in ("task", "state", "kback1")}
        tok = {1: rng.binomial(P, 0.6, n_test).astype(float)}
        claims = {c.name: c for c in probe_claims(range(5), sc, ks=(1,), n_boot=200, seed=i, token_baseline=tok)[0]}
        for name in hits:
            hits[name] += claims[name].ci_lo <= 0 <= claims[name].ci_hi
    for name in ("kback1_beats_token_stats", "state_before_task_layer0"):
        assert stats.binomtest(hits[name], n, 0.95).pvalue > 0.01, (name, hits[name] / n)
    assert hits["state_before_task"] / n >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / n), hits
