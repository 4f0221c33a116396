"""The task-diversity record's figure (analysis/task_diversity.py), drawn from its tables: task_diversity.{png,pdf}.
The package never imports this folder.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from sweepdata import save

TASKS = ("seen", "unseen")
FRESH = 0  # hmm.n_tasks = 0: fresh tasks, "infinite" task diversity (drawn at the right end of the map)


def figure(rows, ns, bnd, sens, threshold, out, name, regimes=()) -> None:
    """task_diversity.{png,pdf}: excess CE over the task oracle per cell (seen and unseen tasks, the references, the
    regime word per cell), the retrieval gap with n* and its confidence set, and n*'s threshold sensitivity."""
    fresh = any(r["n_tasks"] == FRESH for r in rows)
    xs = np.array([ns[-1] * 4 if r["n_tasks"] == FRESH else r["n_tasks"] for r in rows], float)  # fresh: right end
    ticks = (xs, [r["cell"] for r in rows])
    fig, (ax, axg, axt) = plt.subplots(1, 3, figsize=(21, 5.2), layout="constrained", width_ratios=(1.4, 1, 1))
    style = {"model": ("-", "o", 2.0), "mixture_oracle": ("--", None, 1.0), "incontext_unigram": ((0, (6, 2, 1, 2)),
             None, 1.0), "incontext_bigram": ("-.", None, 1.0), "incontext_hmm": ((0, (1, 1)), None, 1.2),
             "best_counting": ((0, (3, 1, 1, 1)), "s", 1.4), "family_bayes": ("-", None, 1.0)}
    names = {"incontext_hmm": "in-context HMM (EM)", "best_counting": "best counting (fitted)",
             "family_bayes": "family Bayes"}
    for tasks, col in zip(TASKS, ("C0", "C1")):
        for pred, (ls, mk, lw) in style.items():
            q = f"{tasks}/{pred}"
            if not any(q in r for r in rows):
                continue
            y = [r.get(q, math.nan) for r in rows]
            ax.plot(xs, y, ls=ls, marker=mk, color=col, lw=lw, ms=4,
                    label=f"{tasks}: {names.get(pred, pred.replace('_', ' '))}")
            if pred == "model":
                ax.fill_between(xs, [r.get(q + "_lo", math.nan) for r in rows],
                                [r.get(q + "_hi", math.nan) for r in rows], color=col, alpha=0.2)
    ax.axhline(0, color="gray", lw=0.8, label="task oracle (ceiling)")
    for r, x in zip(regimes, [ns[-1] * 4 if r["n_tasks"] == FRESH else r["n_tasks"] for r in regimes]):
        ax.annotate(r["regime"].replace("inference beyond counting", "inference"), (x, 1.0), xycoords=("data", "axes fraction"),
                    rotation=90, ha="center", va="top", fontsize=7, color="C2")
    ax.set(xscale="log", xlabel="training tasks n_tasks" + (" (fresh: every episode its own task)" if fresh else ""),
           ylabel="CE - task-oracle CE (nats/token)", title="excess CE over the task oracle, test segment, k = k_max"
           + ("; regime per cell (top)" if regimes else ""))
    ax.set_xticks(*ticks)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    keep = [i for i, r in enumerate(rows) if r["n_tasks"] != FRESH]
    rows = [rows[i] for i in keep]
    g = [r["retrieval_gap"] for r in rows]
    axg.plot(ns, g, "-o", color="C3", label="retrieval gap (unseen - seen), 95% t CI over seeds")
    axg.fill_between(ns, [r["retrieval_gap_lo"] for r in rows], [r["retrieval_gap_hi"] for r in rows], color="C3",
                     alpha=0.2)
    axg.axhline(threshold, color="k", ls=":", lw=1, label=f"threshold {threshold:g}")
    axg.axhline(0, color="gray", lw=0.8)
    left, right = ns[0] / 2, ns[-1] * 2
    if math.isfinite(bnd["log2_n_star"]):
        axg.axvline(bnd["n_star"], color="C2", lw=1.5, label=f"n* = {bnd['n_star']:.3g}")
    if math.isfinite(bnd["log2_lo"]) or math.isfinite(bnd["log2_hi"]):
        axg.axvspan(max(left, bnd["n_star_lo"]), min(right, bnd["n_star_hi"]), color="C2", alpha=0.15,
                    label="n* 95% confidence set (hull)" + (": open" if not (math.isfinite(bnd["log2_lo"])
                                                                              and math.isfinite(bnd["log2_hi"])) else ""))
    axg.set(xscale="log", xlabel="training tasks n_tasks", ylabel="nats/token", xlim=(left, right),
            title="retrieval gap and the regime boundary" + ("" if bnd["power"] == "ok" else " (underpowered)"))
    axg.set_xticks(ns, [str(int(n)) for n in ns])
    axg.legend(fontsize=7)
    th = np.array([s["threshold"] for s in sens])
    est = np.array([s["n_star"] for s in sens], float)
    lo = np.array([max(left, s["n_star_lo"]) if not math.isnan(s["n_star_lo"]) else math.nan for s in sens])
    hi = np.array([min(right, s["n_star_hi"]) if not math.isnan(s["n_star_hi"]) else math.nan for s in sens])
    for t, a, b, s in zip(th, lo, hi, sens):
        axt.plot([t, t], [a, b], "-", color="C2", lw=6, alpha=0.35, solid_capstyle="butt")
        for end, val in ((b, s["n_star_hi"]), (a, s["n_star_lo"])):
            if not math.isfinite(val):
                axt.plot([t], [end], "^" if val > 0 else "v", color="C2", ms=7)
    ok = np.isfinite(est)
    axt.plot(th[ok], est[ok], "o-", color="C2", label="n* (log2-interpolated crossing of the seed mean)")
    axt.plot([], [], "-", color="C2", lw=6, alpha=0.35, label="95% confidence set (hull); triangle: open past the grid")
    axt.axvline(threshold, color="k", ls=":", lw=1)
    axt.set(yscale="log", ylim=(left, right), xlabel="threshold (nats/token)", ylabel="n* (training tasks)",
            title="threshold sensitivity of n*")
    axt.set_yticks(ns, [str(int(n)) for n in ns])
    axt.legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{name}: where retrieval ends across task diversity")
    save(fig, out, "task_diversity")
