"""The theory sections: the decay of eps(L) per setting and its exponent on gamma (Theorem 1), and the
practice-vs-theory comparison of windowed transformers with eps(L) (statistical choices: package docstring)."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..stats import Claim
from .common import NAN, Section, _ci, _f


def _theory_section(settings: list, out_dir: Path, figs: dict) -> tuple[Section, list[Claim]]:
    from ..theory import exponent_fits, fit_rank_intercept

    sec, claims = Section("Theory: decay of eps(L) (Theorem 1)"), []
    rows = []
    for s in sorted(settings, key=lambda s: (s["n_states"], s["rank"], s["rho"], s["gamma"])):
        rows.append([_f(s["n_states"]), _f(s["rank"]), _f(s["rho"]), _f(s["gamma"]), _f(s["gamma_eff"]),
                     _f(s["rate"]), _ci(s["rate_lo"], s["rate_hi"]), _f(s["mixing_rate"]),
                     _f(s["rate"] - s["mixing_rate"]), _f(s["log_intercept"])])
    sec.blocks += [("p", "Decay rate r of log eps(L) = a - r L per setting, with its 95% CI (as logged), beside "
                         "the chain's own mixing rate m = -log|lambda_2(T)| (theory/mixing_rate): with no "
                         "information in the emissions eps(L) still decays like exp(-m L)."),
                   ("table", ["S", "d", "rho", "gamma", "gamma_eff", "rate", "95% CI", "mixing m", "rate - m",
                              "intercept a"], rows)]
    groups: dict[tuple, list] = defaultdict(list)
    for s in settings:
        groups[(s["n_states"], s["rank"], s["rho"])].append(s)
    scopes = [(f"S={k[0]} d={k[1]} rho={_f(k[2])}", v) for k, v in groups.items()]
    if len(groups) > 1:
        scopes.append(("pooled", settings))
    fits, erows = [], []
    for scope, ss in scopes:
        for f in exponent_fits(ss, scope):
            fits.append(f)
            erows.append([scope, f.y_name, f.x_name, _f(f.k), _ci(*f.k_ci), str(f.n_used),
                          "(same regression)" if f.same_as else f.verdict, f.reason])
            if f.same_as is None:
                c = f.claim()
                claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks += [("h", 3, "Exponent of the rate on gamma (the bound allows k <= 4)"),
                   ("p", "OLS of log y on log x. y = rate, and y = rate - mixing floor over the settings whose "
                         "rate CI lies above the floor (a gamma^4 law plus a floor looks like a small k). A CI "
                         "below 4 means exponent 4 is rejected and the bound holds, loose by gamma^(4 - k)."),
                   ("table", ["scope", "y", "x", "k", "95% CI", "n", "verdict (k <= 4)", "reason"], erows)]
    by: dict[tuple, list] = defaultdict(list)
    for s in settings:
        by[(s["n_states"], s["rho"], s["gamma"])].append(s)
    rrows = []
    for k, ss in by.items():
        if len({s["rank"] for s in ss}) < 3:
            continue
        f = fit_rank_intercept([s["rank"] for s in ss], [s["log_intercept"] for s in ss],
                               scope=f"S={k[0]} rho={_f(k[1])} gamma={_f(k[2])}")
        rrows.append([f.scope, _f(f.slope), _ci(*f.slope_ci), str(f.n_used), f.verdict, f.reason])
        c = f.claim()
        claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks.append(("h", 3, "Rank dependence of the intercept (bound: slope <= 1 in log d)"))
    sec.blocks.append(("table", ["scope", "slope", "95% CI", "n", "verdict (slope <= 1)", "reason"], rrows) if rrows
                      else ("p", "Fewer than 3 ranks per (S, rho, gamma): no rank fit."))
    for f in fits:
        if f.x_name == "gamma" and (f.scope == "pooled" or len(scopes) == 1):
            sec.blocks.append(("p", f"The bound's exponent on {f.y_name} ({f.scope}): k = {_f(f.k, 3)} "
                                    f"{_ci(*f.k_ci)}; {f.reason} (claim k <= 4: {f.verdict})."))
    saved = _plot_theory(settings, fits, out_dir / "theory_rate_vs_gamma.png")
    if saved:
        figs["theory"], figs["theory_pdf"] = (str(p) for p in saved)
        sec.blocks.append(("img", saved[0].name, "decay rate vs gamma (log-log) with the exponent fit"))
    return sec, claims


def _plot_theory(settings, fits, path: Path) -> list[Path]:
    """Rate vs gamma (log-log) per (S, d, rho) group, each group's exponent fit in its points' colour, the
    pooled fit in black; written as PNG + PDF ([] when no setting has a positive rate)."""
    from matplotlib.figure import Figure

    from ..figures import save

    good = [s for s in settings if s["gamma"] > 0 and math.isfinite(s["rate"]) and s["rate"] > 0]
    if not good:
        return []
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    groups: dict[tuple, list] = defaultdict(list)
    for s in good:
        groups[(s["n_states"], s["rank"], s["rho"])].append(s)
    for j, (k, ss) in enumerate(sorted(groups.items())):
        ss, c = sorted(ss, key=lambda s: s["gamma"]), f"C{j % 10}"
        scope = f"S={k[0]} d={k[1]} rho={_f(k[2])}"
        g, r = np.array([s["gamma"] for s in ss]), np.array([s["rate"] for s in ss])
        lo = np.array([s["rate_lo"] if math.isfinite(s["rate_lo"]) and s["rate_lo"] > 0 else s["rate"] for s in ss])
        hi = np.array([s["rate_hi"] if math.isfinite(s["rate_hi"]) else s["rate"] for s in ss])
        ax.errorbar(g, r, yerr=[r - lo, hi - r], fmt="o", capsize=3, color=c, label=scope)
        for f in fits:
            if f.x_name == "gamma" and f.y_name == "rate" and math.isfinite(f.k) and f.scope == scope:
                gg = np.geomspace(g.min(), g.max(), 50)
                ax.plot(gg, np.exp(f.intercept) * gg ** f.k, "--", color=c, label=f"fit k={f.k:.2f} {_ci(*f.k_ci)}")
    gg = np.geomspace(min(s["gamma"] for s in good), max(s["gamma"] for s in good), 50)
    for f in fits:
        if f.x_name == "gamma" and f.y_name == "rate" and math.isfinite(f.k) and f.scope == "pooled" and len(groups) > 1:
            ax.plot(gg, np.exp(f.intercept) * gg ** f.k, "k--", label=f"pooled fit k={f.k:.2f} {_ci(*f.k_ci)}")
    ax.set(xscale="log", yscale="log", xlabel="gamma", ylabel="decay rate r (95% CI)", title="rate vs gamma")
    ax.legend(fontsize=7)
    return save(fig, path)


def _practice_section(df, out_dir: Path, figs: dict) -> Section | None:
    need = {"param:model.window", "metric:memory/model_tv"}
    if df.empty or not need <= set(df.columns):
        return None
    d = df[(df["param:model.window"].apply(lambda v: isinstance(v, (int, float)) and v > 0))
           & df["metric:memory/model_tv"].notna()]
    if d.empty:
        return None
    eps = "metric:memory/eps" if "metric:memory/eps" in d.columns else None
    groups = [c for c in ("param:hmm.gamma", "param:hmm.rank") if c in d.columns]
    d = d.copy()
    rf = "metric:memory/receptive_field"
    old = rf not in d.columns or d[rf].isna().any()
    d["L"] = d["param:model.window"] if old else d[rf]  # runs logged before receptive fields: eps at the window
    rows, series = [], defaultdict(list)
    for key, g in d.groupby([*groups, "L"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        setting, L = dict(zip(groups, key[:-1])), key[-1]
        gam, rank = setting.get("param:hmm.gamma", "-"), setting.get("param:hmm.rank", "-")
        tv = g["metric:memory/model_tv"]
        e = g[eps].mean() if eps else NAN
        wins = ", ".join(_f(w) for w in sorted(set(g["param:model.window"])))
        rows.append([_f(gam), _f(rank), wins, _f(L), str(len(g)), _f(tv.mean()),
                     _f(tv.std(ddof=1) if len(g) > 1 else NAN), _f(e),
                     _f(tv.mean() / e if e and math.isfinite(e) else NAN, 3)])
        series[f"gamma={_f(gam)} d={_f(rank)}"].append((L, tv.mean(), e))
    sec = Section("Practice vs theory: windowed transformers", [
        ("p", "Excess error of a transformer with banded attention (memory/model_tv, mean over runs) beside the "
              "L-memory predictor's eps(L) (memory/eps) per (gamma, d). A stack of n_layers banded layers of width w "
              "sees L = n_layers (w - 1) + 1 tokens (its receptive field, memory/receptive_field), so eps is taken "
              "at that L and the model is scored on test positions whose receptive field holds test tokens only."
         + (" Some runs predate receptive fields: their rows use L = w, which understates what a deep model sees."
            if old else "")),
        ("table", ["gamma", "d", "window w", "L (receptive field)", "runs", "model TV", "sd", "eps(L)", "model / eps"],
         rows)])
    from matplotlib.figure import Figure

    from ..figures import save

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, (gam, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts)
        L = [p[0] for p in pts]
        c = f"C{i % 10}"
        ax.plot(L, [p[1] for p in pts], "o-", color=c, label=f"model, {gam}")
        if any(math.isfinite(p[2]) for p in pts):
            ax.plot(L, [p[2] for p in pts], "s--", color=c, label=f"eps(L), {gam}")
    ax.set(yscale="log", xlabel="receptive field L", ylabel="TV to full-history oracle", title="practice vs theory")
    ax.legend(fontsize=7)
    png, pdf = save(fig, out_dir / "practice_vs_theory.png")
    figs["practice"], figs["practice_pdf"] = str(png), str(pdf)
    sec.blocks.append(("img", png.name, "model excess error and eps(L) vs L"))
    return sec


