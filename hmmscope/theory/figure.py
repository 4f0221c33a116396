"""The Theorem 1 figure of a `theory.TheoryResult` (a matplotlib Figure; theory.plot_theory saves it).

One panel per (S, d, rho) group: eps(L) vs L per gamma. With several HMM draws per setting, each draw's
curve is drawn as small faint dots and the mean over draws as the main markers with its between-draw SE;
the setting's combined rate fit (mean rate and intercept over draws) is the dashed line in its points'
colour over the L range every draw used; points left out of the fit (below the floor or the 4-stderr
cut) are hollow. Then rate vs gamma and rate vs gamma_eff on separate panels (log-log): a colour per
(S, d, rho) group, each draw's rate as a small faint dot, the mean over draws as the main marker with
its 95% CI (t over draws; one draw: its bootstrap CI), each group's exponent fit in its points' colour
and the pooled fit in black; on the gamma panel also the excess over the mixing floor (triangles, hollow
where the rate CI does not clear the floor and the excess fit leaves the point out), with the reference
g^4 (c = 1) and the floor. Axes: eps(L) is the mean total-variation distance of the predictive distributions
(no unit, in [0, 1]); L is in tokens; the rate r of eps(L) ~ exp(-r L) is per token of memory; gamma and
gamma_eff are plain numbers, their ticks written as such (0.3, not 3x10^-1). The reference g^4 is drawn over
the data's x range only and never sets the y range (a gamma_eff of 0.05 puts it at 6e-6, which would squash
the data): where it leaves the panel its legend entry says so. Imports matplotlib lazily; never imports the
inference code.
"""

from __future__ import annotations

import math

import numpy as np

NAN = float("nan")


def _eps_panel(ax, ss, hollow):
    from matplotlib.lines import Line2D  # lazy: matplotlib (~0.5 s) only when the figure is drawn (theorem1 imports this module)

    for j, s in enumerate(ss):
        L, e, se = (np.asarray(x, float) for x in (s.lengths, s.eps, s.stderr))
        c = f"C{j % 10}"
        for dr in s.draws if len(s.draws) > 1 else ():
            de = np.asarray(dr.eps, float)
            ok = np.isfinite(de) & (de > 0)
            ax.plot(np.asarray(dr.lengths, float)[ok], de[ok], ".", ms=3, alpha=0.35, color=c)
        pos = np.isfinite(e) & (e > 0)
        used = np.isin(L, np.asarray(s.rate_fit.used_lengths, float)) if s.rate_fit.ok else np.zeros_like(pos)
        yerr = np.minimum(se, 0.999 * e)
        for sel, mfc, lab in ((pos & used, c, f"gamma={s.params['gamma']:g}"), (pos & ~used, "none", None)):
            if sel.any():
                ax.errorbar(L[sel], e[sel], yerr=yerr[sel], fmt="o", ms=4, capsize=2, color=c, mfc=mfc,
                            label=lab if lab and (pos & used).any() else None)
        if not (pos & used).any():
            ax.plot([], [], "o", color=c, label=f"gamma={s.params['gamma']:g} (no fit)")
        f = s.rate_fit
        if f.ok:
            x = np.array([min(f.used_lengths), max(f.used_lengths)], float)
            ax.plot(x, np.exp(f.intercept - f.rate * x), "--", color=c)
    h, _ = ax.get_legend_handles_labels()
    extra = [hollow, Line2D([], [], color="gray", ls="--", label="rate fit")]
    if any(len(s.draws) > 1 for s in ss):
        extra.append(Line2D([], [], color="gray", marker=".", ls="none", alpha=0.35,
                            label=f"one HMM draw ({len(ss[0].draws)} per setting)"))
    ax.legend(handles=[*h, *extra], fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              frameon=False)  # below the panel: on no point


def _plain_log_labels(axis) -> None:
    """A log axis's tick labels as plain numbers (0.3, 0.02): every decade, and 2, 3 and 5 times one when the
    axis spans at most two decades (else those ticks stay unlabelled)."""
    # lazy: matplotlib (~0.5 s) only when the figure is drawn (theorem1 imports this module)
    from matplotlib.ticker import FuncFormatter

    def plain(v, pos=None):
        if not (v > 0 and math.isfinite(v)):
            return ""
        lo, hi = axis.get_view_interval()
        mant = v / 10 ** math.floor(math.log10(v) + 1e-9)
        decade = abs(mant - 1) < 1e-6 or abs(mant - 10) < 1e-6
        few = lo > 0 and math.log10(hi / lo) <= 2.0 and any(abs(mant - m) < 1e-6 for m in (2, 3, 5))
        return f"{v:g}" if decade or few else ""

    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_formatter(FuncFormatter(plain))


def theory_figure(result, title: str | None = None):
    """The figure of the module docstring."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.5 s) only when the figure is drawn (theorem1 imports this module)
    from matplotlib.lines import Line2D  # lazy: matplotlib (~0.5 s) only when the figure is drawn (theorem1 imports this module)

    groups: dict[tuple, list] = {}
    for s in result.settings:
        groups.setdefault((s.params["n_states"], s.params["rank"], s.params["rho"]), []).append(s)
    n = len(groups) + 2
    fig = Figure(figsize=(4.6 * n, 6.5), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    hollow = Line2D([], [], color="gray", marker="o", mfc="none", ls="none", label="hollow: left out of the fit")
    for ax, ((S, d, rho), ss) in zip(axes, groups.items()):
        _eps_panel(ax, ss, hollow)
        ax.set(yscale="log", xlabel="L (memory, tokens)", ylabel="eps(L) (mean TV distance)",
               title=f"S={S} d={d} rho={rho:g}")
    r = np.array([s.rate_fit.rate for s in result.settings])
    rlo = np.array([s.rate_fit.rate_ci[0] for s in result.settings])
    rhi = np.array([s.rate_fit.rate_ci[1] for s in result.settings])
    m = np.array([s.mixing_rate for s in result.settings])
    gk = np.array([s.params["gamma"] for s in result.settings], float)
    ge = np.array([NAN if s.gamma_eff["value"] is None else s.gamma_eff["value"] for s in result.settings], float)
    gi = {id(s): i for i, s in enumerate(result.settings)}
    scope_of = {k: f"S={k[0]} d={k[1]} rho={k[2]:g}" for k in groups}
    pooled = len(groups) > 1
    for ax, xs, x_name in ((axes[-2], gk, "gamma"), (axes[-1], ge, "gamma_eff")):
        xmin = 1.0
        for j, (k, ss) in enumerate(groups.items()):
            c, idx = f"C{j % 10}", np.array([gi[id(s)] for s in ss])
            x, y = xs[idx], r[idx]
            ok = np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)
            for s in ss if any(len(s.draws) > 1 for s in ss) else ():
                dx = [s.params["gamma"] * math.exp(0.03 * (j - (len(s.draws) - 1) / 2)) if x_name == "gamma"
                      else dr.gamma_eff["value"] for j, dr in enumerate(s.draws)]  # draws spread in x on the gamma axis
                dy = [dr.rate_fit.rate for dr in s.draws]
                good = [(a, b) for a, b in zip(dx, dy) if a and b and a > 0 and b > 0 and math.isfinite(b)]
                if good:
                    ax.plot(*zip(*good), ".", ms=4, alpha=0.4, color=c)
            if ok.any():
                xmin = min(xmin, float(x[ok].min()))
                lo, hi = rlo[idx][ok], rhi[idx][ok]
                yerr = [np.where(np.isfinite(lo) & (lo > 0), y[ok] - lo, 0), np.where(np.isfinite(hi), hi - y[ok], 0)]
                ax.errorbar(x[ok], y[ok], yerr=yerr, fmt="none", capsize=2, color=c, lw=0.8)
                ax.plot(x[ok], y[ok], "o", color=c, label=f"rate, {scope_of[k]}")
            if x_name == "gamma":
                ex, above = (r - m)[idx], (np.isfinite(rlo) & np.isfinite(m) & (rlo > m))[idx]
                okx = np.isfinite(ex) & (ex > 0) & (x > 0)
                for sel, mfc in ((okx & above, c), (okx & ~above, "none")):
                    if sel.any():
                        ax.plot(x[sel], ex[sel], "^", color=c, mfc=mfc,
                                label=f"rate - mixing floor, {scope_of[k]}" if mfc == c else None)
            for f in result.exponent_fits:
                if f.x_name != x_name or f.scope != scope_of[k] or not math.isfinite(f.k) or not ok.any():
                    continue
                g = np.geomspace(x[ok].min(), x[ok].max(), 50)
                ls = "-" if f.y_name == "rate" else "--"
                ax.plot(g, np.exp(f.intercept) * g ** f.k, ls, color=c, lw=1.2,
                        label=f"fit {f.y_name}: k={f.k:.2f} [{f.k_ci[0]:.2f}, {f.k_ci[1]:.2f}]")
        for f in result.exponent_fits:
            ok = np.isfinite(xs) & (xs > 0)
            if pooled and f.scope == "pooled" and f.x_name == x_name and math.isfinite(f.k) and ok.any():
                g = np.geomspace(xs[ok].min(), xs[ok].max(), 50)
                ax.plot(g, np.exp(f.intercept) * g ** f.k, "-" if f.y_name == "rate" else "--", color="k", lw=1.2,
                        label=f"pooled fit {f.y_name}: k={f.k:.2f} [{f.k_ci[0]:.2f}, {f.k_ci[1]:.2f}]")
        if np.isfinite(m).any():
            ax.axhline(float(np.nanmin(m)), color="gray", lw=0.8, ls="-.", label="mixing floor -log|lambda_2|")
        ok = np.isfinite(xs) & (xs > 0)
        if ok.any():  # the reference over the data's x range; the data set the y range, not the reference
            g = np.geomspace(float(xs[ok].min()), float(xs[ok].max()), 50) if xs[ok].max() > xs[ok].min() else \
                np.asarray([float(xs[ok].min())] * 2)
            ax.set_xscale("log")
            ax.set_yscale("log")  # the data's own log-scale limits, before the reference is drawn
            ax.autoscale_view()
            y0, y1 = ax.get_ylim()
            out = "" if (g ** 4).max() >= y0 and (g ** 4).min() <= y1 else \
                f", below this panel ({(g ** 4).max():.1g} at most)" if (g ** 4).max() < y0 else ", above this panel"
            ax.plot(g, g ** 4, ":", color="gray", label=f"{x_name}^4 (c = 1){out}", scaley=False)
            ax.set_ylim(y0, y1)
        h, _ = ax.get_legend_handles_labels()
        if any(len(s.draws) > 1 for s in result.settings):
            h.append(Line2D([], [], color="gray", marker=".", ls="none", alpha=0.4, label="one HMM draw; big marker: "
                            "mean over draws with its 95% CI"))
        ax.set(xscale="log", yscale="log", xlabel=f"{x_name} (no unit)", ylabel="decay rate r (1/L, per token)",
               title=f"rate vs {x_name}")
        ticks = sorted({float(f"{v:.2g}") for v in xs[np.isfinite(xs) & (xs > 0)]})
        if 0 < len(ticks) <= 8:  # the levels themselves, as plain numbers on the log axis (after set_xscale)
            # lazy: matplotlib (~0.5 s) only when the figure is drawn (theorem1 imports this module)
            from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
        _plain_log_labels(ax.yaxis)
        ax.legend(handles=h + ([hollow] if x_name == "gamma" else []), fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.suptitle("Theorem 1: eps(L) and its decay rate" + (f", {title}" if title else ""))
    return fig
