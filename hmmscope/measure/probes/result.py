"""The probes' result: `ProbeResult`, its tables (CSV, written atomically), JSON and Figure 3.

Imports matplotlib only inside `figure` (through `safe_output.save_figure` for `plot`); must not import torch, sklearn, or
the fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...safe_output import write_tables
from ...stats import Claim, jsonable

_TOKEN_LS = (0, (5, 1.5, 1, 1.5, 1, 1.5))  # dash-dot-dot: the token-statistics baseline


@dataclass
class ProbeResult:
    table: list[dict]  # one row per (target, layer): classification probes
    belief_table: list[dict]  # one row per layer: belief R^2
    summary: list[dict]  # per target: peak layer, best and max accuracy, reach layers, baseline
    claims: list[Claim]
    meta: dict = field(default_factory=dict)  # sizes, settings, n_jobs, timings (s; fits_s: summed over layers)

    def to_dict(self) -> dict:
        return jsonable({"table": self.table, "belief_table": self.belief_table, "summary": self.summary,
                          "claims": self.claims, "meta": self.meta})

    def to_csv(self, directory) -> list[Path]:
        """probes.csv, belief_probes.csv, probe_summary.csv, probe_claims.csv in `directory` (atomic writes)."""
        return write_tables(directory, {"probes": self.table, "belief_probes": self.belief_table,
                                        "probe_summary": self.summary, "probe_claims": jsonable(self.claims)})

    def figure(self, title: str | None = None):
        """Figures 3a (task vs state), 3b (k-back curves, and their best layer against the baselines by k) and the
        belief R^2, by layer (0 = embedding), with 95% CIs. A colour per target (3b: a sequential map, light k = 1 to
        dark k = K), a style per kind of line: solid = probe, dotted = shuffled-label control, dashed = chance
        (majority class, per target), dash-dot = the (task, o_t) baseline, dash-dot-dot = o_t alone (token
        statistics). 3b's baselines are one number per k: drawn against k in a panel of their own beside it, each
        labelled (before: 10 unlabelled horizontal lines across the curves); the style key is in each legend, which
        sits below its panel."""
        # lazy: matplotlib (~0.5 s) only when a figure is drawn (train.figures / no figures: never)
        from matplotlib import colormaps
        from matplotlib.figure import Figure  # lazy: matplotlib, as above

        # lazy: matplotlib (~0.5 s) only when a figure is drawn (train.figures / no figures: never)
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator  # lazy: matplotlib, as above

        fig = Figure(figsize=(22, 6.2), layout="constrained")
        axes = fig.subplots(1, 4, width_ratios=[1, 1, 0.7, 1])
        by: dict[str, list[dict]] = {}
        for r in self.table:
            by.setdefault(r["target"], []).append(r)
        summ = {s["target"]: s for s in self.summary}
        kb = sorted((t for t in by if t.startswith("kback")), key=lambda t: int(t[5:]))
        cmap = colormaps["viridis"]
        kcol = {t: cmap(0.85 - 0.75 * i / max(1, len(kb) - 1)) for i, t in enumerate(kb)}
        panels = [(axes[0], [t for t in ("task", "state", "state_pooled") if t in by], "Fig. 3a: task vs hidden state"),
                  (axes[1], kb, "Fig. 3b: token k steps back")]
        for ax, targets, ptitle in panels:
            for j, t in enumerate(targets):
                rows = by[t]
                x, c = [r["layer"] for r in rows], kcol.get(t, f"C{j % 10}")
                lab = (f"k = {t[5:]}" if t in kcol else t + (" (raw index over tasks)" if t == "state_pooled" else ""))
                acc, lo, hi = (np.array([r[key] for r in rows], float) for key in ("acc", "acc_lo", "acc_hi"))
                if t in kcol:  # 3b: error bars dodged sideways, so K overlapping bands do not hide each other
                    xd = np.asarray(x, float) + 0.08 * (kb.index(t) - (len(kb) - 1) / 2)
                    ax.errorbar(xd, acc, yerr=np.nan_to_num(np.abs([acc - lo, hi - acc])), fmt="o-", color=c, lw=1.8,
                                ms=4, capsize=2, elinewidth=1, label=lab)
                else:
                    ax.plot(x, acc, "o-" if t != "state_pooled" else "o--", color=c, lw=1.8, ms=4, label=lab)
                    ax.fill_between(x, lo, hi, color=c, alpha=0.18)
                ax.plot(x, [r["control_acc"] for r in rows], ":", color=c, lw=1)
                if t not in kcol:  # 3b's chance and baselines: by k, in the next panel
                    ax.axhline(rows[0]["chance"], ls="--", color=c, lw=0.8, alpha=0.8)
            ax.set(xlabel="layer (0 = embedding)", ylabel="held-out accuracy", title=ptitle)
            if targets:
                keys = [Line2D([], [], color="gray", ls=":", lw=1, label="shuffled-label control")]
                if ax is axes[0]:
                    keys.append(Line2D([], [], color="gray", ls="--", lw=0.8, label="chance (majority class)"))
                h, _ = ax.get_legend_handles_labels()
                ax.legend(handles=[*h, *keys], fontsize=8, ncol=2 if len(h) + len(keys) > 5 else 1,
                          loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        ax = axes[2]  # 3b by k: the probe at its best layer against what no memory of o_(t-k) gives
        if kb:
            ks = [int(t[5:]) for t in kb]

            def col(key):
                return [float(summ.get(t, {}).get(key, np.nan) if summ.get(t, {}).get(key) is not None else np.nan)
                        for t in kb]

            best = col("best_acc")
            if np.isfinite(best).any():
                ax.plot(ks, best, "-", color="k", lw=1.2, zorder=1)
                ax.scatter(ks, best, c=[kcol[t] for t in kb], s=40, zorder=2, label="probe, best layer (cross-fitted)")
            for key, ls, lab in (("baseline_acc", "-.", "(task, o_t) baseline"),
                                 ("token_acc", _TOKEN_LS, "o_t alone (token statistics)")):
                if np.isfinite(col(key)).any():
                    ax.plot(ks, col(key), ls=ls, marker="s", ms=3, color="dimgray", lw=1.2, label=lab)
            chance = [float(by[t][0]["chance"]) for t in kb]
            ax.plot(ks, chance, ls="--", color="gray", lw=0.8, label="chance (majority class)")
            ax.set_xticks(ks)
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        ax.set(xlabel="k (steps back)", ylabel="held-out accuracy", title="Fig. 3b by k: best layer vs baselines")
        ax, rows = axes[3], self.belief_table
        if rows:
            x = [r["layer"] for r in rows]
            ax.plot(x, [r["r2"] for r in rows], "o-", label="belief probe")
            ax.fill_between(x, [r["r2_lo"] for r in rows], [r["r2_hi"] for r in rows], alpha=0.2)
            ax.plot(x, [r["control_r2"] for r in rows], ":", label="shuffled-label control")
            ax.axhline(0.0, ls="--", color="gray", lw=0.8, label="chance (R^2 = 0)")
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        ax.set(xlabel="layer (0 = embedding)", ylabel="held-out R^2 (variance-weighted)", title="belief probe")
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        n = self.meta.get("n_episodes")
        fig.suptitle("Figure 3: layerwise probes" + (f", {title}" if title else "")
                     + (f" ({n} episodes, 95% bootstrap CIs)" if n else " (95% bootstrap CIs)"))
        return fig

    def plot(self, path, title: str | None = None) -> list[Path]:
        """Write `figure()` as <path>.png and <path>.pdf; returns [png, pdf]."""
        # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
        from ...safe_output import save_figure

        return save_figure(self.figure(title), path)
