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


# ---------------------------------------------------------------- every figure the package saves (issue 46.5)


def _claims_frame(n_claims=12, runs=3):
    from hmmscope.stats import Claim

    rng = np.random.default_rng(7)
    rows = []
    for i in range(runs):
        row = {"trial": i, "param:train.seed": str(i)}
        for j in range(n_claims):
            v = float(rng.normal(0.3 if j < 3 else 0.0, 0.05))
            c = Claim("upper layers change less _slope_" if j == 0 else f"kback{j}_beats_baseline", "s", v,
                      v - 0.1, v + 0.1, "inconclusive", "", "> 0")
            row.update({f"metric:claim/{c.name}/value": c.value, f"metric:claim/{c.name}/ci_lo": c.ci_lo,
                        f"metric:claim/{c.name}/ci_hi": c.ci_hi, f"verdict:{c.name}": c.verdict,
                        f"rule:{c.name}": c.rule})
        rows.append(row)
    return pd.DataFrame(rows)


def _layerwise(tmp):
    from hmmscope.report.layerwise import layerwise_section

    layerwise_section(_claims_frame(), tmp, {})


def _depth(tmp):
    from hmmscope.report.layerwise import depth_rank_section

    depth_rank_section(pd.DataFrame([{"param:model.n_layers": L, "param:hmm.rank": d, "param:train.seed": s,
                                      "metric:eval/seen/excess_ce": 0.3 - 0.02 * L + 0.05 * np.log(d) + 0.01 * s}
                                     for L in (1, 2, 4) for d in (2, 8) for s in (0, 1)]), tmp, {})


def _posenc(tmp):
    from hmmscope.report.posenc import posenc_section

    posenc_section(pd.DataFrame([{"param:model.pos_enc": pe, "param:hmm.gamma": g, "param:train.seed": s,
                                  "metric:eval/seen/excess_ce": 0.2 + g + 0.01 * s - 0.03 * (pe == "rope"),
                                  "metric:eval/seen/test_acc": 0.5 - 0.1 * g + 0.002 * s}
                                 for pe in ("rope", "absolute") for g in (0.5, 0.9) for s in (0, 1, 2)]), tmp, {})


def _theory(tmp):
    from hmmscope.report.theory import theory_section

    settings = []
    for d in (2, 4):
        for g in (0.3, 0.6, 0.9):
            draws = [{"seed": float(100 + j), "index": j, "rate": 0.5 * g ** 2 * (1 + 0.05 * j), "gamma_eff": 0.8 * g,
                      "rate_lo": 0.4 * g ** 2, "rate_hi": 0.6 * g ** 2, "mixing_rate": 0.01,
                      "log_intercept": -1.0 + 0.1 * d} for j in range(3)]
            rate = float(np.mean([x["rate"] for x in draws]))
            settings.append({"n_states": 8, "rank": d, "rho": 0.02, "gamma": g, "gamma_eff": 0.8 * g, "n_draws": 3,
                             "rate": rate, "rate_lo": 0.9 * rate, "rate_hi": 1.1 * rate, "rate_df": 2.0,
                             "rate_mc_se": 0.001, "rate_between_sd": 0.01, "draws": draws, "mixing_rate": 0.01,
                             "log_intercept": -1.0, "seed": 1.0})
    theory_section(settings, tmp, {})


def _practice(tmp):
    from hmmscope.report.theory import practice_section

    practice_section(pd.DataFrame([{"param:model.window": w, "param:hmm.gamma": g, "param:hmm.rank": 4,
                                    "metric:memory/model_tv": 0.3 * np.exp(-0.1 * w) + 0.01 * s,
                                    "metric:memory/eps": 0.02 * np.exp(-0.3 * w), "metric:memory/receptive_field": w}
                                   for w in (3, 5, 7) for g in (0.6, 0.8) for s in (0, 1)]), tmp, {})


LONG = "inference-ablations-depth-with-a-long-name"  # the kept records' titles were cut ("o inference-ablations-...")


def _sweep_spec():
    from hmmscope.sweep.spec import parse_spec

    return parse_spec(f'[sweep]\nname = "{LONG}"\nobjective = "eval/unseen/vs_best_counting"\nseeds = [0, 1, 2]\n'
                      '[fixed]\n"hmm.n_tasks" = 0\n"eval.family_tasks" = 16\n[space]\n"model.n_layers" = {grid = [2, 4, 6]}\n'
                      '"model.pos_enc" = {grid = ["rope", "absolute"]}\n')


def _sweep_frame():
    from hmmscope.sweep.compare import OBJ

    return pd.DataFrame([{"trial": i, "param:model.n_layers": L, "param:model.pos_enc": pe, "param:train.seed": s,
                          OBJ: -0.25 - 0.01 * L + 0.004 * s - 0.005 * (pe == "rope")}
                         for i, (L, pe, s) in enumerate((L, pe, s) for L in (2, 4, 6) for pe in ("rope", "absolute")
                                                        for s in (0, 1, 2))])


def _objective(tmp):
    from hmmscope.sweep.compare import figure

    figure(_sweep_spec(), _sweep_frame(), tmp / "objective")


def _pivot(tmp):
    from hmmscope.sweep.compare import pivot, pivot_figure

    spec = _sweep_spec()
    pivot_figure(spec, pivot(spec, _sweep_frame()), tmp / "pivot")


def _theorem1(tmp):
    from test_theory import _synthetic_result

    from hmmscope.theory.theorem1 import plot_theory

    plot_theory(_synthetic_result(), tmp / "theory", title="run t")


def _probes(tmp):
    from hmmscope.measure.probes import ProbeResult

    rows, summary = [], []
    for t in ["task", "state", *(f"kback{k}" for k in range(1, 6))]:
        for layer in range(5):
            acc = 0.3 + 0.1 * layer
            rows.append({"target": t, "layer": layer, "acc": acc, "acc_lo": acc - 0.05, "acc_hi": acc + 0.05,
                         "control_acc": 0.2, "chance": 0.17})
        summary.append({"target": t, "best_acc": 0.7, **({"baseline_acc": 0.35, "token_acc": 0.2}
                                                         if t.startswith("kback") else {})})
    belief = [{"layer": i, "r2": 0.1 * i, "r2_lo": 0.1 * i - 0.02, "r2_hi": 0.1 * i + 0.02, "control_r2": 0.0}
              for i in range(5)]
    ProbeResult(rows, belief, summary, [], {"n_episodes": 40}).plot(tmp / "figure3", title="run q")


def _shuffle(tmp):
    from hmmscope.measure.shuffle import ShuffleResult
    from hmmscope.stats import claim, rule

    L, H = 4, 4
    by_layer = [{"layer": i, "mean": 0.3 - 0.05 * i, "ci_lo": 0.25 - 0.05 * i, "ci_hi": 0.35 - 0.05 * i} for i in range(L)]
    by_head = [{"layer": i, "head": h, "mean": 0.3 - 0.05 * i + 0.01 * h} for i in range(L) for h in range(H)]
    c = claim("upper layers change less", "OLS slope of the change on layer", -0.05, -0.07, -0.03, rule("<", 0), "")
    ShuffleResult(np.zeros((8, L)), np.zeros((8, L, H)), by_layer, by_head, [c]).plot(tmp / "figure2", title="run s")


def _figure1(tmp):
    from hmmscope.measure.figure1_plot import plot_figure1

    plot_figure1(_figure1_result(), tmp / "figure1", title="run abc (12345678)")


PREDICTORS = ("model", "task_oracle", "mixture_oracle", "family_bayes", "incontext_unigram", "incontext_bigram",
              "incontext_ngram", "incontext_ctw", "best_counting", "incontext_hmm")


def _figure1_result():
    """Two task sets, every predictor; the add-one unigram degenerate on unseen tasks only (as in the smoke sweep's
    trials), so that Figure 1's shared legend once had a line and its "(DEGENERATE)" twin in one colour."""
    from hmmscope.measure.figure1_result import Figure1Result
    from hmmscope.stats import claim, rule

    by_k, by_pos, paired = [], [], []
    for t in ("seen", "unseen"):
        for j, name in enumerate(PREDICTORS):
            for k in range(3):
                acc, ce = 0.3 + 0.02 * j + 0.05 * k, 1.9 - 0.05 * j - 0.1 * k
                by_k.append({"tasks": t, "k": k, "predictor": name, "acc": acc, "acc_lo": acc - 0.02,
                             "acc_hi": acc + 0.02, "ce": ce, "ce_lo": ce - 0.03, "ce_hi": ce + 0.03,
                             "excess_ce_task": ce - 1.2, "excess_ce_task_lo": ce - 1.25, "excess_ce_task_hi": ce - 1.15,
                             "degenerate": t == "unseen" and name == "incontext_unigram"})
            for pos in range(16):
                acc = 0.3 + 0.02 * j + 0.005 * pos
                by_pos.append({"tasks": t, "position": pos, "predictor": name, "acc": acc, "acc_lo": acc - 0.03,
                               "acc_hi": acc + 0.03})
        for name in ("best_counting", "family_bayes", "incontext_bigram"):
            for k in range(3):
                paired.append({"tasks": t, "k": k, "baseline": name, "diff": -0.1 * k, "diff_lo": -0.1 * k - 0.02,
                               "diff_hi": -0.1 * k + 0.02})
    claims = [claim("retrieval_gap", "s", 0.2, 0.1, 0.3, rule(">", 0), ""),
              claim("inference_beyond_counting", "s", -0.2, -0.25, -0.15, rule("<", 0), "")]
    return Figure1Result(by_k, by_pos, 2, {"n_tokens": 8, "n_episodes": 64}, claims, {"value": 0.2, "lo": 0.1, "hi": 0.3},
                         paired, [], "inference beyond counting")


def _emergence(tmp):
    from hmmscope.measure.emergence import plot_emergence

    plot_emergence(_history(), tmp / "emergence", title="run x")


SAVED = {  # every package function that saves a figure (a caller of safe_output.save_figure), and how it is drawn here
    ("report/layerwise.py", "_plot_pooled"): _layerwise, ("report/layerwise.py", "_plot_depth"): _depth,
    ("report/posenc.py", "_plot_posenc"): _posenc, ("report/theory.py", "_plot_theory"): _theory,
    ("report/theory.py", "practice_section"): _practice, ("sweep/compare.py", "figure"): _objective,
    ("sweep/compare.py", "pivot_figure"): _pivot, ("theory/theorem1.py", "plot_theory"): _theorem1,
    ("measure/probes/result.py", "plot"): _probes, ("measure/shuffle.py", "plot"): _shuffle,
    ("measure/figure1_plot.py", "plot_figure1"): _figure1, ("measure/emergence.py", "plot_emergence"): _emergence,
}


def test_the_list_names_every_function_that_saves_a_figure():
    """The list below is every caller of safe_output.save_figure in the package, read from the source: a new figure
    fails here until it is drawn and checked by the test after this one."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "hmmscope"
    found = set()
    for path in pkg.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(n, ast.Call) and getattr(n.func, "id", None) == "save_figure" for n in ast.walk(fn)):
                found.add((str(path.relative_to(pkg)), fn.name))
    found.discard(("safe_output.py", "save_figure"))
    assert found == set(SAVED)


@pytest.mark.parametrize("site", list(SAVED), ids=lambda s: f"{s[0]}:{s[1]}")
def test_every_saved_figure_keeps_its_text_inside_the_canvas(site, tmp_path, monkeypatch):
    """Issue 46.5: each figure the package saves, drawn for real: every text artist (titles, labels, legends,
    annotations, table cells) inside the canvas, no legend on a panel's data, tick labels apart, the layout applied,
    and every panel with data says what its axes are (a label on each)."""
    from pathlib import Path

    import hmmscope.safe_output as so

    drawn = []

    def keep(fig, path, *a, **kw):  # the figure, drawn below once (writing PNG + PDF is save_figure's own test)
        drawn.append(fig)
        return [Path(path).with_suffix(".png"), Path(path).with_suffix(".pdf")]

    monkeypatch.setattr(so, "save_figure", keep)
    SAVED[site](tmp_path)
    assert drawn, site
    for fig in drawn:
        assert layout_problems(fig) == [], site
        for ax in fig.axes:
            if ax.axison and ax.has_data() and not ax.get_label() == "<colorbar>":
                assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), (site, ax.get_title())


def test_figure1_legend_names_each_predictor_once_with_where_it_failed():
    """Issue 46.5: Figure 1's shared legend listed "add-one unigram" and its "add-one unigram (DEGENERATE)" twin in
    the same colour (degenerate on unseen tasks only). Now each colour has one entry, which says where it failed."""
    from matplotlib.colors import to_hex

    from hmmscope.measure.figure1_plot import build_figure1

    fig = build_figure1(_figure1_result(), title="run abc")
    assert layout_problems(fig) == []
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    colours = [to_hex(h.get_color()) for h, x in zip(legend.legend_handles, labels)
               if not x.startswith(("chance", "uniform"))]  # the two gray reference levels, dotted
    assert len(colours) == len(set(colours)) == len(labels) - 2  # one entry per predictor's colour
    assert "add-one unigram (DEGENERATE on unseen tasks: not a reference)" in labels
    assert not any(x == "add-one unigram" or x.endswith("(DEGENERATE)") for x in labels)
