"""The inference-ablations record's figures: ablations.png (every axis), depth_curves.png, theorem1.png,
layerwise.png (+ PDF), drawn from its tables.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from claim_figures import VERDICT_COLOURS
from sweepdata import save

# ---------------------------------------------------------------- figures


def figures(rows, runs, curves, th, lw, out: Path) -> None:
    import matplotlib.pyplot as plt

    axes_ = [a for a in ("depth", "pos_enc", "gamma", "rank", "context", "structure") if any(r["axis"] == a for r in rows)]
    ncol = min(3, len(axes_))  # a grid, each panel its own y axis: the depth and RoPE differences are ~0.02, the
    fig, axs = plt.subplots(-(-len(axes_) // ncol), ncol, figsize=(4.6 * ncol, 4.2 * -(-len(axes_) // ncol) + 0.6),
                            layout="constrained", squeeze=False)  # context's 0.35: a shared axis hid them
    for ax, a in zip(axs.flat, axes_):
        rs = [r for r in rows if r["axis"] == a]
        x = np.arange(len(rs))
        for i, r in enumerate(rs):
            col = "C7" if r["regime"] == "no room" else "C0"
            ax.errorbar([i], [r["diff"]], yerr=[[r["diff"] - r["ci_lo"]], [r["ci_hi"] - r["diff"]]], fmt="o", color=col,
                        capsize=3, zorder=2)
            seeds = [float(v) for v in r["per_seed_diff"].split(";")]
            ax.plot([i + 0.12] * len(seeds), seeds, ".", color="k", alpha=0.8, zorder=3)  # beside the mean, on top
            ax.plot([i - 0.3, i + 0.3], [-r["room"]] * 2, "-", color="C1", lw=1.5, zorder=1)
        ys = [v for r in rs for v in (r["ci_lo"], r["ci_hi"], -r["room"], *map(float, r["per_seed_diff"].split(";")))
              if math.isfinite(v)]
        pad = 0.08 * (max(ys) - min(ys) or 0.01)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)  # the panel's own data, not 0 far away from them
        if min(ys) < 0 < max(ys):
            ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(x, [_short(r["level"]) for r in rs], fontsize=8)
        ax.set(title=a.replace("_", " "), ylabel="model - best counting (nats/token)\nlower is better")
        ax.grid(alpha=0.3)
    for ax in axs.flat[len(axes_):]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    fig.legend(handles=[Line2D([], [], marker="o", color="C0", label="mean over seeds, 95% t CI"),
                        Line2D([], [], marker="o", color="C7", label="a cell with no room (enters no effect)"),
                        Line2D([], [], marker=".", ls="", color="k", label="a seed"),
                        Line2D([], [], color="C1", label="minus the room (best counting - family Bayes): the model "
                                                         "level with family Bayes")],
               loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Inference ablations: the model minus the best fitted counting predictor, unseen tasks, k_max (below 0: "
                 "the model beats counting)", fontsize=10)
    save(fig, out, "ablations")

    fig, axs = plt.subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    for ax, metric, ylab in ((axs[0], "vs_best_counting", "model - best counting at k_max"),
                             (axs[1], "icl_gain", "in-context gain (same tokens)")):
        for (L, pe), col in zip(sorted({(c["n_layers"], c["pos_enc"]) for c in curves if c["study"] == "depth"}),
                                ("C0", "C1", "C2", "C3", "C4", "C5")):
            cs = [c for c in curves if c["study"] == "depth" and c["n_layers"] == L and c["pos_enc"] == pe
                  and c["metric"] == metric]
            by = defaultdict(dict)
            for c in cs:
                by[c["seed"]][int(c["step"])] = c["value"]
            steps = sorted(set.intersection(*(set(v) for v in by.values()))) if by else []
            steps = [s for s in steps if s > 0]
            if steps:
                ax.plot(steps, [np.mean([v[s] for v in by.values()]) for s in steps], "-" if pe == "rope" else "--",
                        color=col, label=f"{int(L)} layers, {pe}")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set(xlabel="optimizer step", ylabel=f"{ylab} (nats/token)", title=f"{ylab}: mean over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out, "depth_curves")

    if th:
        fig, axs = plt.subplots(1, len({r["gamma"] for r in th}), figsize=(6.5 * len({r["gamma"] for r in th}), 4.4),
                                layout="constrained", squeeze=False)
        for ax, g in zip(axs[0], sorted({r["gamma"] for r in th})):
            rs = [r for r in th if r["gamma"] == g]
            R = [r["R"] for r in rs]
            for k, col, lab in (("model_tv", "C0", "model (TV to the task oracle)"),
                                ("mix_tv", "C1", "family Bayes, full history"),
                                ("lmem_tv", "C2", "L-memory predictor, same tokens (eps(R) there)"),
                                ("eps", "C3", "eps(R), stationary histories")):
                ax.errorbar(R, [r[k] for r in rs], yerr=[[r[k] - r[f"{k}_lo"] for r in rs], [r[f"{k}_hi"] - r[k] for r in rs]],
                            fmt="o-", color=col, capsize=3, label=lab)
            ax.set(yscale="log", xlabel="receptive field R (tokens)", ylabel="mean TV at test positions j >= R",
                   title=f"gamma {g:g} (gamma^4 = {g ** 4:.3f})", xticks=R)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Theorem 1 against a learner that infers: fixed memory R, unseen tasks (mean over seeds, 95% t CI)")
        save(fig, out, "theorem1")

    if lw:
        from hmmscope.units import claim_words

        claims = sorted({r["claim"] for r in lw})
        cells = sorted({(r["n_layers"], r["pos_enc"]) for r in lw})
        colours = VERDICT_COLOURS
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(claims) + 2.2), layout="constrained")
        for y, name in enumerate(claims):  # a row per claim, each scaled by its own largest |value| (units differ)
            rs = [r for r in lw if r["claim"] == name]
            scale = max([abs(v) for r in rs for v in (r["estimate"], r["ci_lo"], r["ci_hi"]) if math.isfinite(v)]
                        or [1.0]) or 1.0
            for i, cell in enumerate(cells):
                r = next((r for r in rs if (r["n_layers"], r["pos_enc"]) == cell), None)
                if r is None or not math.isfinite(r["estimate"]):
                    continue
                col = colours.get(r["verdict"], "k")
                if math.isfinite(r["ci_lo"]) and math.isfinite(r["ci_hi"]):
                    ax.plot([i + 0.4 * r["ci_lo"] / scale, i + 0.4 * r["ci_hi"] / scale], [y, y], "-", color=col, lw=2)
                ax.plot([i + 0.4 * r["estimate"] / scale], [y], "o", color=col, ms=4)
        for i in range(len(cells)):
            ax.axvline(i, color="gray", ls=":", lw=0.8)
        ax.set_xticks(range(len(cells)), [f"{int(L)} layers, {pe}" for L, pe in cells], fontsize=8)
        ax.set_yticks(range(len(claims)), [claim_words(c) for c in claims], fontsize=7)
        ax.set(xlim=(-0.5, len(cells) - 0.5), ylim=(len(claims) - 0.5, -0.5), xlabel="cell (dotted: each cell's 0; "
               "a row's values / its largest |value|: the claims' units differ)", ylabel="claim")
        from matplotlib.lines import Line2D

        ax.legend(handles=[Line2D([], [], marker="o", color=c, label=v) for v, c in colours.items()], title="verdict "
                  "(pooled over seeds, 95% t CI)", fontsize=8, title_fontsize=8, ncol=4, loc="upper center",
                  bbox_to_anchor=(0.5, -0.09), frameon=False)
        fig.suptitle("Layerwise claims per depth and encoding, pooled over seeds", fontsize=10)
        save(fig, out, "layerwise")


def _short(level: str) -> str:
    """A level's tick label: 'gamma 0.6, R = 5 (window 3)' -> 'g0.6\nR=5'."""
    t = level.replace("gamma ", "g").replace(" (window ", " w").replace(")", "").replace("R = ", "R=")
    t = t.replace("full context", "full").replace("structures ", "").replace(" of training", "").replace(" in training", "")
    return t.split(" w")[0].replace(", ", "\n")
