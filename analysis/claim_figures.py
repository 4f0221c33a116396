"""The standard figures of pooled claims: a verdict's colour, and a claim's seeds beside its pooled mean and 95% CI
(regime_layerwise's per-cell figures; ablations_figures colours its layerwise panel the same way). The package never
imports this folder.
"""
from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from hmmscope.safe_output import atomic_path

VERDICT_COLOURS = {"supported": "C2", "not supported": "C3", "inconclusive": "C7", "no power": "C4"}


def claims_figure(claims, sub, stem: Path) -> None:
    """`stem`.png and .pdf (each written atomically), one row per claim of `claims` (pooled stats.Claims named
    "pooled: <claim>"; `sub`: the runs' frame, with metric:claim/<claim>/value): each seed's value (dots) and the
    pooled mean with its 95% CI, coloured by verdict, on the claim's own scale (a panel per claim, so no rescaling
    hides a sign)."""
    fig = Figure(figsize=(7.5, 0.55 * len(claims) + 1.2), layout="constrained")
    axes = fig.subplots(len(claims), 1, squeeze=False)[:, 0]
    for ax, c in zip(axes, claims):
        name = c.name[len("pooled: "):]
        vals = sub[f"metric:claim/{name}/value"].astype(float).dropna()
        ax.plot(vals, [0] * len(vals), ".", color="gray", alpha=0.7)
        col = VERDICT_COLOURS.get(c.verdict, "k")
        if math.isfinite(c.ci_lo) and math.isfinite(c.ci_hi):
            ax.plot([c.ci_lo, c.ci_hi], [0, 0], "-", color=col, lw=2)
        ax.plot([c.value], [0], "o", color=col)
        ax.axvline(0, color="gray", ls=":", lw=0.8)
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(c.verdict, fontsize=7, loc="right", color=col, pad=1)
    fig.suptitle(f"{stem.name}: seeds (grey), pooled mean with 95% t CI over seeds (colour: verdict)", fontsize=8)
    for ext in ("png", "pdf"):
        with atomic_path(f"{stem}.{ext}") as tmp:
            fig.savefig(tmp, dpi=130, format=ext)
        print(f"figure: {stem}.{ext}")
