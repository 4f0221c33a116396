"""Figure 1 drawn (SCIENCE.md 6, 8, 9): one row of four panels per task set from figure1_result.Figure1Result.

Owns the figure only; the numbers are evaluate.py's (figure1_tables).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

_STYLE = {"model": ("C0", "-", "model", 2.2), "task_oracle": ("C2", "--", "task oracle", 1.4),
          "mixture_oracle": ("C3", "-", "mixture oracle (training tasks)", 1.4),
          "family_bayes": ("C1", "-", "family Bayes (M tasks of the family)", 1.4),
          "bayes": ("C6", "-", "Bayes-optimal (fresh tasks)", 1.8),
          "incontext_unigram": ("C7", ":", "add-one unigram", 1.0),
          "incontext_bigram": ("C5", ":", "add-one bigram", 1.0),
          "incontext_ngram": ("C8", "-.", "fitted n-gram", 1.0),
          "incontext_ctw": ("C9", "-.", "fitted CTW", 1.0),
          "best_counting": ("k", "-.", "best counting (fitted)", 1.6),
          "incontext_hmm": ("C4", "--", "in-context HMM (EM)", 1.0)}
_POSITION = ("model", "task_oracle", "mixture_oracle", "bayes", "family_bayes", "best_counting")  # the position panel's lines
_PAIRED = ("bayes", "best_counting", "family_bayes", "incontext_bigram", "task_oracle")  # model minus these, by k


def _finite(vals) -> list[float]:
    return [v for v in vals if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


def _smooth(x: np.ndarray, w: int) -> np.ndarray:
    """Centered moving average of width w (shorter at the ends)."""
    if w <= 1 or len(x) < 3:
        return x
    k = np.ones(w)
    return np.convolve(x, k, "same") / np.convolve(np.ones_like(x), k, "same")


def build_figure1(result, title: str | None = None):
    """Figure 1 as a matplotlib Figure: one row per task set (seen, unseen), four panels each: accuracy vs k and CE
    vs k (every predictor; the model's 95% CI as a band), accuracy vs test position at k = k_max (the model with its
    band, the oracles and the best counting baseline, each smoothed over 5 positions so that sampling noise does not
    hide the trend), and the paired difference model minus reference CE vs k (best counting, family Bayes, add-one
    bigram, task oracle; 95% CIs; below 0 = the model is better). The accuracy panels draw chance (1 / V) and span 0
    to above the highest upper CI, so the oracles' ceiling is in view; the CE panel draws log V (a uniform guess).
    No legend sits on a panel: the predictors' (one style each, the same in the first three panels) is below the
    figure, the differences' below their panel. The title carries the run (`title`), the retrieval gap and the
    regime."""
    tasks = result.tasks
    degenerate: dict[str, list[str]] = {}  # label -> the task sets where that reference failed (SCIENCE.md 9)
    fig = Figure(figsize=(21, 4.6 * len(tasks) + 0.8), layout="constrained")
    axes = fig.subplots(len(tasks), 4, squeeze=False)
    V = result.meta.get("n_tokens")
    chance = 1.0 / V if V else None
    for row, t in zip(axes, tasks):
        top = 0.0
        for name, (c, ls, label, lw) in _STYLE.items():
            for a, xkey, key in ((row[0], "k", "acc"), (row[1], "k", "ce")):
                r = [q for q in result.by_k if q["predictor"] == name and q["tasks"] == t]
                if not r:
                    continue
                x = [q[xkey] for q in r]
                if any(q.get("degenerate") for q in r) and t not in degenerate.setdefault(label, []):
                    degenerate[label].append(t)
                a.plot(x, [q[key] for q in r], marker="o", ls=ls, color=c, lw=lw, ms=3, label=label,
                       zorder=3 if name == "model" else 2)  # the model on top
                if name == "model":
                    a.fill_between(x, [q[f"{key}_lo"] for q in r], [q[f"{key}_hi"] for q in r], color=c, alpha=0.15)
                if key == "acc":
                    top = max([top, *_finite(q["acc_hi"] for q in r)])
            if name in _POSITION:
                r = [q for q in result.by_position if q["predictor"] == name and q["tasks"] == t]
                if r:
                    top = max([top, *_finite(q["acc_hi"] for q in r)])
                    x = np.array([q["position"] for q in r])
                    y = _smooth(np.array([q["acc"] for q in r]), 5)
                    row[2].plot(x, y, ls=ls, color=c, lw=lw, label=label, zorder=3 if name == "model" else 2)
                    if name == "model":
                        row[2].fill_between(x, _smooth(np.array([q["acc_lo"] for q in r]), 5),
                                            _smooth(np.array([q["acc_hi"] for q in r]), 5), color=c, alpha=0.15)
        _paired_panel(row[3], result, t)
        for a in (row[0], row[2]):
            if chance is not None:
                a.axhline(chance, color="gray", ls=":", lw=1.2, label=f"chance (1/V = {chance:.3g})")
            a.set_ylim(0.0, min(1.02, max(top, chance or 0.0) * 1.06 + 0.02))
        if V:
            row[1].axhline(math.log(V), color="gray", ls=":", lw=1.2, label=f"uniform (log V = {math.log(V):.3g})")
        ceiling = "oracles = ceiling" if t == "seen" else "task oracle = ceiling"
        row[0].set(xlabel="demonstrations k", ylabel="test next-token accuracy", title=f"{t} tasks: accuracy vs k ({ceiling})")
        row[1].set(xlabel="demonstrations k", ylabel="test cross-entropy (nats / token)", title=f"{t} tasks: CE vs k")
        row[2].set(xlabel="test position", ylabel="next-token accuracy (5-position average)",
                   title=f"{t} tasks: accuracy vs position (k = {result.k_max})")
        row[3].set(xlabel="demonstrations k", ylabel="model minus reference CE (nats / token)",
                   title=f"{t} tasks: model minus reference (< 0: better)")
        for a in row:
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            a.grid(alpha=0.3)
        # legends outside the panels, where they hide no line: the differences' below their panel, every
        # predictor's (the same style in the first three panels) once below the figure
        row[3].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    keys: dict[str, object] = {}
    for a in [ax for r in axes for ax in r[:3]]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            keys.setdefault(lab, h)
    # one entry per predictor: a reference that failed on some task set says where, beside its one colour (before:
    # a line and its "(DEGENERATE)" twin in the same colour)
    names = [f"{lab} (DEGENERATE on {' and '.join(degenerate[lab])} tasks: not a reference)"
             if degenerate.get(lab) else lab for lab in keys]
    fig.legend(list(keys.values()), names, loc="outside lower center", ncol=min(5, len(keys)), fontsize=9,
               frameon=False)
    fig.suptitle(_heading(result, title))
    return fig


def _paired_panel(ax, result, t: str) -> None:
    """The paired differences model minus reference CE vs k on task set t, with 95% CIs; never against a degenerate
    reference (SCIENCE.md 9); against the task oracle: the model's excess over the ceiling (excess_ce_task by k)."""
    for name in _PAIRED:
        r = [q for q in result.paired if q["baseline"] == name and q["tasks"] == t and not q.get("degenerate")]
        if name == "task_oracle":
            r = [{"k": q["k"], "diff": q["excess_ce_task"], "diff_lo": q["excess_ce_task_lo"],
                  "diff_hi": q["excess_ce_task_hi"]} for q in result.by_k if q["predictor"] == "model"
                 and q["tasks"] == t]
        if not r:
            continue
        c, ls, label, lw = _STYLE[name]
        x = [q["k"] for q in r]
        ax.errorbar(x, [q["diff"] for q in r], yerr=[[q["diff"] - q["diff_lo"] for q in r],
                                                     [q["diff_hi"] - q["diff"] for q in r]],
                    marker="o", ms=3, ls=ls, color=c, lw=lw, capsize=2, label=f"model - {label}")
    ax.axhline(0, color="gray", lw=0.8)


def _heading(result, title: str | None) -> str:
    """The figure's title: the run, the episodes, the retrieval gap and the regime."""
    n = result.meta.get("n_episodes")
    head = "Figure 1: in-context next-token prediction" + (f", {title}" if title else "") \
        + (f" ({n} held-out episodes per task set, 95% CIs)" if n else "")
    if result.retrieval is not None:
        g = result.retrieval
        c = next(c for c in result.claims if c.name == "retrieval_gap")
        head += (f"\nretrieval gap (model - task oracle CE, unseen minus seen, k = {result.k_max}): {g['value']:.3g} "
                 f"[{g['lo']:.3g}, {g['hi']:.3g}] nats/token, rule {c.rule}: {c.verdict}")
    inf = next((c for c in result.claims if c.name == "inference_beyond_counting"), None)
    if inf is not None:
        head += (f"\nunseen tasks, k = {result.k_max}: model - best counting {inf.value:+.3g} [{inf.ci_lo:+.3g}, "
                 f"{inf.ci_hi:+.3g}] nats/token; regime: {result.regime}")
    return head


def plot_figure1(result, path, title: str | None = None) -> list[Path]:
    """Write Figure 1 (`build_figure1`) as <path>.png and <path>.pdf; returns [png, pdf]."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(build_figure1(result, title), path)
