"""The figures a person reads (issue 38.7), drawn for real and checked as seen (tests/figure_checks.py): no text cut
at the edge, no legend over a panel's data, no tick labels running into each other, constrained layout applied;
and what each figure must say. Figure 1's check runs on a real evaluation in test_evaluate.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from figure_checks import layout_problems


def _history(steps=(0, 400, 800, 1200), n_k=5, degenerate=()):
    """Emergence curves at `steps`, k = 0..n_k-1, every reference; the references in `degenerate` ((tasks, name))
    flagged as such, as a run flags them (their labels grow by '(DEGENERATE: not a reference)')."""
    from hmmscope.measure.emergence import REF_STYLE, key

    out = []
    for i, s in enumerate(steps):
        h = {"step": s}
        for t in ("seen", "unseen"):
            for k in range(n_k):
                h[key(t, "ce", k)] = 2.0 - 0.1 * i - 0.02 * k
            h[key(t, "icl_gain")] = 0.01 * i
            for name in REF_STYLE:
                h[key(t, "ce", n_k - 1, name)] = 1.5
                h[key(t, "icl_gain", ref=name)] = 0.1
        out.append(h)
    for t, name in degenerate:
        out[-1][key(t, "degenerate", ref=name)] = 1.0
    return out


def test_emergence_legends_with_degenerate_references_stay_inside_the_figure():
    """The smoke sweep's trials (k = 0..2, the unigram and the unseen mixture oracle degenerate): before, the legends
    below the panels, two columns each, ran past the figure's left and right edges and into each other."""
    from hmmscope.measure.emergence import build_emergence

    bad = [("seen", "incontext_unigram"), ("unseen", "incontext_unigram"), ("unseen", "mixture_oracle")]
    fig = build_emergence(_history(steps=(0, 50, 100), n_k=3, degenerate=bad), title="rope-g0.5-s0: emergence")
    assert layout_problems(fig) == []
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert sum("DEGENERATE" in x for x in labels) == 6  # unigram in all four panels, the unseen mixture oracle in two
    assert "mixture oracle (DEGENERATE: not a reference), k = 2" in labels


def test_emergence_figure_draws_step_0_apart_and_keeps_titles_and_legends_off_the_curves():
    """Before: the gain panel's title was cut ('same toke'), its legend lay over the curves, and step 0 (drawn at
    1 on the log axis) was joined to step 400 by a solid line, as if measured in between."""
    from hmmscope.measure.emergence import build_emergence

    fig = build_emergence(_history(), title="run x")
    assert layout_problems(fig) == []
    ce = fig.axes[0]
    solid = [ln for ln in ce.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 1
             and list(ln.get_xdata()) != [0, 1]]  # the model's curves (a reference is a horizontal line, axes x 0..1)
    assert solid and all(min(ln.get_xdata()) >= 400 for ln in solid)  # the measured curves start at step 400
    dotted = [ln for ln in ce.get_lines() if ln.get_linestyle() == ":" and list(ln.get_xdata()) != [0, 1]]
    assert dotted and all(list(ln.get_xdata()) == [1, 400] for ln in dotted)  # step 0 (at 1) to 400: dotted
    assert [t.get_text() for t in ce.get_xticklabels()][0] == "0"
    assert "step 0 to 400: not evaluated between" in [t.get_text() for t in ce.get_legend().get_texts()]


def test_figure3b_baselines_are_labelled_by_k_not_ten_lines_across_the_curves():
    """Before: 3b carried 10 unlabelled dash-dot lines (a (task, o_t) baseline and a token-statistics one per k)
    and 5 chance lines across its curves. Now they are drawn against k in a panel of their own, labelled."""
    from hmmscope.measure.probes import ProbeResult

    rows, summary = [], []
    for t in ["task", "state", *(f"kback{k}" for k in range(1, 6))]:
        for layer in range(5):
            acc = 0.3 + 0.1 * layer
            rows.append({"target": t, "layer": layer, "acc": acc, "acc_lo": acc - 0.05, "acc_hi": acc + 0.05,
                         "control_acc": 0.2, "chance": 0.17})
        summary.append({"target": t, "best_acc": 0.7, **({"baseline_acc": 0.35 + 0.01 * len(summary),
                                                         "token_acc": 0.2} if t.startswith("kback") else {})})
    belief = [{"layer": i, "r2": 0.1 * i, "r2_lo": 0.1 * i - 0.02, "r2_hi": 0.1 * i + 0.02, "control_r2": 0.0}
              for i in range(5)]
    fig = ProbeResult(rows, belief, summary, [], {"n_episodes": 40}).figure(title="run q")
    assert layout_problems(fig) == []
    a3, b3, byk, _ = fig.axes
    flat = [ln for ln in b3.get_lines() if list(ln.get_xdata()) == [0, 1] and len(set(ln.get_ydata())) == 1]
    assert flat == []  # no horizontal reference line across the k-back curves
    labels = [t.get_text() for t in byk.get_legend().get_texts()]
    assert labels == ["probe, best layer (cross-fitted)", "(task, o_t) baseline", "o_t alone (token statistics)",
                      "chance (majority class)"]
    assert [list(ln.get_xdata()) for ln in byk.get_lines()][1] == [1, 2, 3, 4, 5]


def test_posenc_effects_fit_with_three_blocking_factors():
    """Before: the blocks' labels smeared into one another along the x axis (18 'factors', counting.* among them),
    the y label was cut and constrained layout gave up (its warning on `run`'s stderr)."""
    from hmmscope.report.posenc import posenc_figure
    from hmmscope.sweep.effects import pos_enc_effect

    rows = [{"param:model.pos_enc": pe, "param:hmm.gamma": g, "param:model.n_layers": n, "param:train.seed": sd,
             "metric:eval/seen/excess_ce": 0.2 + 0.5 * g + 0.01 * n + 0.01 * (pe == "rope") + 0.003 * sd,
             "metric:eval/seen/test_acc": 0.5 - 0.1 * g}
            for pe in ("rope", "absolute") for g in (0.5, 0.7, 0.9) for n in (1, 2, 4) for sd in (0, 1)]
    dm = pd.DataFrame(rows)
    blocks = ["param:hmm.gamma", "param:model.n_layers"]
    plot = [(m, dm, blocks, pos_enc_effect(dm, f"metric:{m}", blocks, "param:train.seed"))
            for m in ("eval/seen/test_acc", "eval/seen/excess_ce")]
    fig = posenc_figure(plot, "param:train.seed")
    assert layout_problems(fig) == []
    assert fig.axes[0].get_ylabel() == "fraction of test tokens" and fig.axes[0].get_title() == "eval/seen/test_acc"


def test_objective_figure_tick_labels_are_readable():
    """Before: 8-point tick labels on a 4.5-inch figure."""
    from hmmscope.sweep.compare import OBJ, objective_figure
    from hmmscope.sweep.spec import parse_spec

    spec = parse_spec('[sweep]\nname = "o"\nobjective = "eval/seen/excess_ce"\nseeds = [0, 1]\n[space]\n'
                      '"model.pos_enc" = {grid = ["rope", "absolute"]}\n"hmm.gamma" = {grid = [0.5, 0.9]}\n')
    df = pd.DataFrame([{"param:model.pos_enc": pe, "param:hmm.gamma": g, "param:train.seed": s,
                        OBJ: 0.2 + g + 0.01 * s + 0.02 * (pe == "rope")}
                       for pe in ("rope", "absolute") for g in (0.5, 0.9) for s in (0, 1)])
    fig = objective_figure(spec, df)
    assert layout_problems(fig) == []
    ax = fig.axes[0]
    sizes = [t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert sizes and min(sizes) >= 10, sizes


@pytest.mark.parametrize("bad", ["legend", "cut"])
def test_the_checker_sees_a_legend_on_the_data_and_a_cut_title(bad):
    """The check itself: a figure with the faults it looks for is caught."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot(np.arange(10), np.arange(10), label="a line")
    if bad == "legend":
        ax.legend(loc="center")
    else:
        ax.set_title("a title far too long for a four-inch figure, so it runs off the edge of it")
    assert layout_problems(fig)
