"""Tests for hmmscope.measure.shuffle: demo permutation, key matching, the shuffle statistic and its verdicts."""

import json

import numpy as np
import pytest
import torch

from hmmscope.config import DataConfig, HMMConfig, ModelConfig
from hmmscope.data.episodes import layout, sample_episodes
from hmmscope.data.hmm import make_mixture
from hmmscope.measure.shuffle import ShuffleResult, layer_claims, permute_demos, shuffle_test
from hmmscope.model.transformer import Transformer, run_with_cache
from hmmscope.stats import Claim, check_claims

K, LD, LT = 4, 5, 6


def episodes(n=12, k=K, l_demo=LD, l_test=LT):
    mix = make_mixture(HMMConfig(n_tasks=4, n_states=6, n_tokens=8, rank=3))
    return sample_episodes(mix, DataConfig(n_demos=k, l_demo=l_demo, l_test=l_test), n, "eval")


def model(pos, n_layers=3, seed=0, window=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, n_heads=2, d_model=16, d_mlp=32, pos_enc=pos, window=window, max_len=64)
    return Transformer(cfg, 9).eval()


# ---------------------------------------------------------------- permute_demos


def test_identity_permutation_is_identity():
    ep = episodes()
    tok, km = permute_demos(ep.tokens, layout(K, LD, LT), np.arange(K))
    assert np.array_equal(tok, ep.tokens) and np.array_equal(km, np.arange(ep.seq_len))


def test_swap_moves_exactly_two_blocks():
    ep = episodes()
    seg, pos = layout(K, LD, LT)
    tok, km = permute_demos(ep.tokens, (seg, pos), [0, 3, 2, 1])
    blk = LD + 1
    for new, old in enumerate([0, 3, 2, 1]):
        assert np.array_equal(tok[:, new * blk:(new + 1) * blk], ep.tokens[:, old * blk:(old + 1) * blk])
    same = np.r_[0:blk, 2 * blk:3 * blk, K * blk:ep.seq_len]
    assert np.array_equal(tok[:, same], ep.tokens[:, same])  # block 0, block 2 and the test stay put
    assert (tok[:, seg == -1] == ep.delimiter).all()  # delimiters where they were
    assert not np.array_equal(tok[:, blk:2 * blk], ep.tokens[:, blk:2 * blk])  # the swap did something
    assert km[blk + 2] == 3 * blk + 2 and km[3 * blk] == blk and km[0] == 0


@pytest.mark.parametrize("per_episode", [False, True])
def test_key_map_matches_tokens_and_is_bijection(per_episode):
    ep = episodes()
    seg, pos = layout(K, LD, LT)
    rng = np.random.default_rng(0)
    perm = np.stack([rng.permutation(K) for _ in range(len(ep))]) if per_episode else np.array([2, 0, 3, 1])
    tok, km = permute_demos(ep.tokens, (seg, pos), perm)
    km = np.broadcast_to(km, ep.tokens.shape)
    demo = np.flatnonzero((seg >= 0) & (seg < K))
    rows = np.arange(len(ep))[:, None]
    assert np.array_equal(ep.tokens[:, demo], tok[rows, km[:, demo]])
    for r in km:
        assert sorted(r[demo]) == list(demo)  # a bijection on demo observation positions
        assert np.array_equal(np.sort(r), np.arange(ep.seq_len))
        assert np.array_equal(r[seg == K], np.flatnonzero(seg == K))
    # positions within a demo are preserved
    assert np.array_equal(np.broadcast_to(pos, km.shape)[rows, km][:, demo], np.broadcast_to(pos[demo], (len(ep), len(demo))))


def test_bad_permutation_rejected():
    ep = episodes()
    with pytest.raises(ValueError):
        permute_demos(ep.tokens, layout(K, LD, LT), [0, 0, 1, 2])
    with pytest.raises(ValueError):
        permute_demos(ep.tokens, layout(K, LD, LT), [0, 1, 2])


# ---------------------------------------------------------------- the statistic


def test_no_positions_first_layer_is_invariant():
    res = shuffle_test(model("none"), episodes(), n_perms=3)
    assert res.by_layer[0]["mean"] < 1e-5 and res.per_episode[:, 0].max() < 1e-5
    assert res.by_layer[1]["mean"] > 1e-3  # later layers' keys carry demo order through the causal prefix


@pytest.mark.parametrize("pos", ["rope", "absolute", "sinusoidal"])
def test_positions_make_first_layer_change(pos):
    res = shuffle_test(model(pos), episodes(), n_perms=2)
    assert res.by_layer[0]["mean"] > 1e-3


def test_same_code_path_and_table_shapes():
    ep = episodes()
    for pos in ("absolute", "rope"):
        res = shuffle_test(model(pos, n_layers=3), ep, n_perms=2, batch_size=5)
        assert isinstance(res, ShuffleResult)
        assert [r["layer"] for r in res.by_layer] == [0, 1, 2]
        assert [(r["layer"], r["head"]) for r in res.by_head] == [(l, h) for l in range(3) for h in range(2)]
        assert res.per_episode.shape == (len(ep), 3) and res.per_episode_head.shape == (len(ep), 3, 2)
        assert np.isfinite(res.per_episode).all()
        assert all(r["ci_lo"] <= r["mean"] <= r["ci_hi"] for r in res.by_layer)
        assert res.meta["n_queries"] == LT - 1 and res.meta["n_keys"] == K * LD


def test_matches_brute_force_with_two_demos():
    """k = 2: the only non-identity order is the swap, so the statistic can be recomputed by hand."""
    ep, m = episodes(n=5, k=2), model("rope", n_layers=2)
    res = shuffle_test(m, ep, n_perms=1)
    seg = ep.segment[:-1]
    q, keys = np.flatnonzero(seg == 2), np.flatnonzero((seg >= 0) & (seg < 2))
    blk = LD + 1
    moved = np.where(keys < blk, keys + blk, keys - blk)
    names = [f"blocks.{l}.attn.hook_attn_scores" for l in range(2)]
    for e in range(5):
        sw = np.r_[ep.tokens[e, blk:2 * blk], ep.tokens[e, :blk], ep.tokens[e, 2 * blk:]]
        x = torch.as_tensor(np.stack([ep.tokens[e], sw])[:, :-1].astype(np.int64))
        _, c = run_with_cache(m, x, names)
        for l in range(2):
            s = c[names[l]].double().numpy()  # (2, H, T, T)
            a, b = s[0][:, q][:, :, keys], s[1][:, q][:, :, moved]
            d, g = np.abs(b - a).mean((1, 2)), np.abs(a).mean((1, 2))  # per head
            np.testing.assert_allclose(res.per_episode_head[e, l], d / g, rtol=1e-4)
            np.testing.assert_allclose(res.per_episode[e, l], d.mean() / g.mean(), rtol=1e-4)


def test_batching_and_layer_streaming_do_not_change_the_result():
    ep, m = episodes(n=7), model("absolute", n_layers=3)
    a = shuffle_test(m, ep, n_perms=2, batch_size=32)
    b = shuffle_test(m, ep, n_perms=2, batch_size=3, max_bytes=1)  # one layer per forward
    np.testing.assert_allclose(a.per_episode_head, b.per_episode_head, rtol=1e-5)
    c = shuffle_test(m, ep, n_perms=2, seed=1)
    assert not np.allclose(a.per_episode_head, c.per_episode_head)  # the seed picks the permutations
    assert not m.training and not any(b.attn.explicit for b in m.blocks)


def test_banded_window_leaves_out_masked_keys():
    ep = episodes()
    wide = shuffle_test(model("rope", window=64), ep, n_perms=2)  # a window longer than the episode
    np.testing.assert_allclose(wide.per_episode_head, shuffle_test(model("rope"), ep, n_perms=2).per_episode_head)
    # window 8: test queries see only the last demo block, so only episodes whose permutations keep
    # that block in place have matched pairs; the others are NaN and left out of the tables
    res = shuffle_test(model("rope", window=8), episodes(n=24), n_perms=1)
    ok = np.isfinite(res.per_episode[:, 0])
    assert 0 < ok.sum() < 24 and res.by_layer[0]["n_episodes"] == ok.sum()
    assert res.by_layer[0]["mean"] == pytest.approx(res.per_episode[ok, 0].mean())
    json.dumps(res.to_dict(), allow_nan=False)


def test_needs_two_demos():
    with pytest.raises(ValueError):
        shuffle_test(model("rope"), episodes(k=1), n_perms=1)


# ---------------------------------------------------------------- verdicts


def _data(trend, noise, E=40, L=6, seed=0):
    rng = np.random.default_rng(seed)
    return 0.5 + trend * np.arange(L) + noise * rng.standard_normal((E, L))


def test_verdicts():
    for trend, want in [(-0.05, "supported"), (0.05, "not supported")]:
        cl = layer_claims(_data(trend, 0.05))
        assert [c.verdict for c in cl] == [want, want]
        assert (cl[0].value < 0) == (trend < 0) and cl[0].ci_lo <= cl[0].value <= cl[0].ci_hi
        assert all(c.rule == "< 0" for c in cl) and check_claims(cl) == []
    cl = layer_claims(_data(0.0, 0.3, E=10))
    assert [c.verdict for c in cl] == ["inconclusive"] * 2 and all(c.ci_lo < 0 < c.ci_hi for c in cl)
    one = layer_claims(_data(-0.05, 0.05, L=1))
    assert all(c.verdict == "inconclusive" and "one layer" in c.reason for c in one)
    cl = layer_claims(np.array([[3.0, 2.0, 9.0, 1.0, 0.0]] * 2 + [[3.1, 2.0, 9.0, 1.0, 0.1]]))
    assert cl[1].value == pytest.approx(-2.0)  # the middle layer of 5 (value 9) is left out


def test_claim_fields():
    import dataclasses
    assert [f.name for f in dataclasses.fields(Claim)] == ["name", "statistic", "value", "ci_lo", "ci_hi",
                                                          "verdict", "reason", "rule", "df", "degenerate", "steps"]


# ---------------------------------------------------------------- outputs


def test_to_dict_csv_plot(tmp_path):
    res = shuffle_test(model("rope", n_layers=1), episodes(n=4), n_perms=1)
    d = res.to_dict()
    s = json.dumps(d, allow_nan=False)
    assert d["claims"][0]["value"] is None and "inconclusive" in s  # one layer: NaN -> None
    paths = res.to_csv(tmp_path / "csv")
    assert {p.name for p in paths} == {"by_layer.csv", "by_head.csv", "claims.csv", "per_episode.csv"}
    assert (tmp_path / "csv" / "by_head.csv").read_text().count("\n") == 1 + 2
    png, pdf = res.plot(tmp_path / "fig" / "shuffle.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    assert not list((tmp_path / "fig").glob(".*tmp"))


def test_figure2_with_one_layer_says_why_and_draws_no_phantom_band():
    """One layer: the slope claim has no value. Before: the box read 'SE = nan [95% CI nan, nan]' and the legend
    named a band that one layer cannot draw. Now the box gives the verdict and why, the legend only what is drawn."""
    res = shuffle_test(model("rope", n_layers=1), episodes(n=6), n_perms=1)
    fig = res.figure()
    a = fig.axes[0]
    texts = [t.get_text() for t in a.texts] + [t.get_text() for t in a.get_legend().get_texts()]
    assert not any("nan" in t for t in texts), texts
    assert any("not estimated: one layer: no layer trend to test" in t for t in texts), texts
    labels = [t.get_text() for t in a.get_legend().get_texts()]
    from matplotlib.collections import PolyCollection

    assert labels == ["mean over episodes (bars: 95% CI)"]
    assert not [c for c in a.collections if isinstance(c, PolyCollection)]  # no band drawn


def test_figure2_artists():
    """Colourbar label; layers numbered as in Figure 3 (block b's attention is layer b + 1, layer 0 = embedding);
    the 95% CI drawn as error bars with caps besides the band, so a narrow CI stays visible."""
    res = shuffle_test(model("rope", n_layers=3), episodes(n=6), n_perms=1)
    fig = res.figure(title="run xyz")
    a, b, cbar = fig.axes
    assert cbar.get_ylabel() == "mean |delta logit| / mean |logit|"
    assert "0 = embedding" in a.get_xlabel() and [t for t in a.get_xticks()] == [1, 2, 3]
    (eb,) = [c for c in a.containers if c.get_label() == "mean over episodes"]
    line, caps, _ = eb.lines
    assert list(line.get_xdata()) == [1, 2, 3] and np.allclose(line.get_ydata(), [r["mean"] for r in res.by_layer])
    assert len(caps) == 2 and all(len(c.get_xdata()) == 3 for c in caps)  # error-bar caps at every layer
    assert "95% CI over episodes" in [t.get_text() for t in a.get_legend().get_texts()]
    assert "run xyz" in fig._suptitle.get_text() and list(b.get_xticks()) == [1, 2, 3]


def test_one_forward_per_batch_through_every_layer():
    """Issue 37: at the paper's scale the shuffle test took 37 s on an H100 (4 s planned): under a memory budget
    that held one layer's scores, it ran one forward per layer per batch (1 + 2 + ... + L block passes). Now
    each layer's scores are reduced as the forward makes them: one forward per batch, whatever the budget, with
    the same numbers; the model stays on the device it was given (no copy back and forth)."""
    ep, m = episodes(n=7), model("rope", n_layers=3)
    calls = []
    h = m.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        one_layer = 2 * (1 + 2) * m.cfg.n_heads * (ep.seq_len - 1) ** 2 * 4  # 2 episodes' scores of one layer
        a = shuffle_test(m, ep, n_perms=2, batch_size=32, max_bytes=one_layer)
    finally:
        h.remove()
    assert len(calls) == 4  # ceil(7 / 2) batches, one forward each (before: 3 per batch)
    b = shuffle_test(m, ep, n_perms=2, batch_size=32)
    np.testing.assert_allclose(a.per_episode_head, b.per_episode_head, rtol=1e-5)
    assert not any(blk.attn.explicit for blk in m.blocks) and not any(
        mod._forward_hooks for mod in m.modules())
