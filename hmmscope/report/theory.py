"""The theory sections: the decay of eps(L) per setting and its exponent on gamma (Theorem 1), and the
practice-vs-theory comparison of windowed transformers with eps(L) (statistical choices: package docstring)."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..stats import Claim
from ..units import fmt_ci, fmt_num
from .common import NAN, Section


def _points(s: dict) -> list[dict]:
    """The per-draw points of a setting (theory.Setting.points' layout); one point when it has no draws."""
    base = {"n_states": s["n_states"], "rho": s["rho"], "gamma": s["gamma"], "rank": s["rank"],
            "group": f"S={s['n_states']} d={s['rank']} rho={s['rho']:g}"}
    if not s["draws"]:
        return [{**base, "gamma_eff": s["gamma_eff"], "rate": s["rate"], "rate_lo": s["rate_lo"],
                 "rate_hi": s["rate_hi"], "mixing_rate": s["mixing_rate"], "log_intercept": s["log_intercept"],
                 "draw": fmt_num(s["seed"])}]
    return [{**base, **{k: d[k] for k in ("gamma_eff", "rate", "rate_lo", "rate_hi", "mixing_rate", "log_intercept")},
             "draw": fmt_num(d["seed"], 12) if math.isfinite(d["seed"]) else f"{fmt_num(s['seed'])}:{d['index']}"}
            for d in s["draws"]]


def _draw_range(s: dict) -> str:
    r = [d["rate"] for d in s["draws"] if math.isfinite(d["rate"])]
    return f"{fmt_num(min(r))} - {fmt_num(max(r))}" if len(r) > 1 else "-"


def theory_section(settings: list, out_dir: Path, figs: dict) -> tuple[Section, list[Claim]]:
    from ..theory.theorem1 import sweep_fits  # lazy: theorem1 (torch, ~1 s) only for a theory sweep's section

    sec, claims = Section("Theory: decay of eps(L) (Theorem 1)"), []
    settings = sorted(settings, key=lambda s: (s["n_states"], s["rank"], s["rho"], s["gamma"]))
    n_draws = sorted({s["n_draws"] for s in settings})
    rows = []
    for s in settings:
        rows.append([fmt_num(s["n_states"]), fmt_num(s["rank"]), fmt_num(s["rho"]), fmt_num(s["gamma"]), fmt_num(s["gamma_eff"]),
                     str(s["n_draws"]), fmt_num(s["rate"]), fmt_ci(s["rate_lo"], s["rate_hi"]), fmt_num(s["rate_df"]),
                     fmt_num(s["rate_mc_se"], 2), fmt_num(s["rate_between_sd"], 2), _draw_range(s), fmt_num(s["mixing_rate"]),
                     fmt_num(s["rate"] - s["mixing_rate"]), fmt_num(s["log_intercept"])])
    multi = n_draws != [1]
    sec.blocks += [("p", "Decay rate r of log eps(L) = a - r L per setting, beside the chain's own mixing rate "
                         "m = -log|lambda_2(T)| (theory/mixing_rate): with no information in the emissions eps(L) "
                         "still decays like exp(-m L). "
                    + ("Each setting is measured on several independent HMM draws (theory.draws): the rate is the "
                       "mean over draws and its 95% CI a t interval on draws - 1 df (df), so it covers the family's "
                       "draw-to-draw spread. Beside it, the Monte Carlo part (MC SE: the SE the mean would have if "
                       "every draw were the same HMM, from the per-draw bootstrap CIs over histories) and the "
                       "between-draw sd (Monte Carlo variance removed)." if multi else
                       "One HMM draw per setting (runs logged before theory.draws, or theory.draws = 1): the 95% CI "
                       "is the bootstrap over histories of that one HMM, Monte Carlo error only, not the family's "
                       "spread.")),
                   ("table", ["S", "d", "rho", "gamma", "gamma_eff", "draws", "rate", "95% CI", "df", "MC SE",
                              "between-draw sd", "per-draw rates", "mixing m", "rate - m", "intercept a"], rows)]
    pts = [p for s in settings for p in _points(s)]
    exps, ranks = sweep_fits(pts)
    erows = []
    for f in exps:
        erows.append([f.scope, f.y_name, f.x_name, fmt_num(f.k), fmt_ci(*f.k_ci), fmt_num(f.df), fmt_num(f.mc_se, 2),
                      fmt_num(f.between_sd, 2), str(f.n_draws), str(f.n_used),
                      "(same regression)" if f.same_as else f.verdict, f.reason])
        if f.same_as is None:
            c = f.claim()
            claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks += [("h", 3, "Exponent of the rate on gamma (the bound allows k <= 4)"),
                   ("p", "log y = a_group + k log x, one intercept per (S, d, rho) group. "
                    + ("Two-stage with the HMM draw as the unit: draw j is the same chain at every gamma of a group "
                       "(only the emissions' mixing changes), so each draw gives a slope; k is their mean with a t "
                       "interval on draws - 1 df. MC SE: the part of k's SE that is Monte Carlo error of the rates; "
                       "between-draw sd: the slopes' spread over draws beyond it. " if multi else
                       "One draw per setting: OLS across gammas, t on n - groups - 1 df; the CI is the points' "
                       "scatter about the line, not the family's spread. ")
                    + "y = rate, and y = rate - mixing floor over the points whose rate CI lies above the floor (a "
                      "gamma^4 law plus a floor looks like a small k). A CI below 4 means exponent 4 is rejected "
                      "and the bound holds, loose by gamma^(4 - k). A CI that reaches 0 means the rate is not "
                      "shown to grow with x: 'k <= 4' cannot fail then, and the claim reads 'no power'."),
                   ("table", ["scope", "y", "x", "k", "95% CI", "df", "MC SE", "between-draw sd", "draws", "points",
                              "verdict (k <= 4)", "reason"], erows)]
    same = [f for f in exps if f.same_as]
    if same:
        sec.blocks.append(("p", "gamma_eff is a constant multiple of gamma here: " + "; ".join(
            f"[{f.scope}] {f.reason}" for f in same) + ". (For the emission family O = gamma E + (1 - gamma) U, "
            "gamma_eff = gamma(Q O) = gamma * gamma(Q E) exactly.)"))
    rrows = []
    for f in ranks:
        rrows.append([f.scope, fmt_num(f.slope), fmt_ci(*f.slope_ci), fmt_num(f.df), str(f.n_used), f.method, f.verdict,
                      f.reason])
        c = f.claim()
        claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks.append(("h", 3, "Rank dependence of the intercept (bound: slope <= 1 in log d)"))
    sec.blocks.append(("table", ["scope", "slope", "95% CI", "df", "points", "method", "verdict (slope <= 1)",
                                 "reason"], rrows) if rrows
                      else ("p", "Fewer than 3 ranks per (S, rho, gamma): no rank fit."))
    groups = {p["group"] for p in pts}
    for f in exps:
        if f.x_name == "gamma" and (f.scope == "pooled" or len(groups) == 1):
            sec.blocks.append(("p", f"The bound's exponent on {f.y_name} ({f.scope}): k = {fmt_num(f.k, 3)} "
                                    f"{fmt_ci(*f.k_ci)}, df = {fmt_num(f.df)}; {f.reason} (claim k <= 4: {f.verdict})."))
    saved = _plot_theory(settings, exps, out_dir / "theory_rate_vs_gamma.png")
    if saved:
        figs["theory"], figs["theory_pdf"] = (str(p) for p in saved)
        sec.blocks.append(("img", saved[0].name, "decay rate vs gamma (log-log): each HMM draw a small dot, the "
                                                 "mean over draws with its 95% CI, the exponent fit per group"))
    return sec, claims


def _plot_theory(settings, fits, path: Path) -> list[Path]:
    """Rate vs gamma (log-log) per (S, d, rho) group: each draw's rate a small faint dot, the setting's mean
    with its 95% CI, each group's exponent fit in its points' colour, the pooled fit in black; written as
    PNG + PDF ([] when no setting has a positive rate)."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)

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
        scope = f"S={k[0]} d={k[1]} rho={k[2]:g}"
        dots = [(s["gamma"] * math.exp(0.03 * (j - (len(s["draws"]) - 1) / 2)), d["rate"]) for s in ss  # spread in x
                for j, d in enumerate(s["draws"]) if math.isfinite(d["rate"]) and d["rate"] > 0]
        if dots:
            ax.plot(*zip(*dots), ".", ms=4, alpha=0.4, color=c)
        g, r = np.array([s["gamma"] for s in ss]), np.array([s["rate"] for s in ss])
        lo = np.array([s["rate_lo"] if math.isfinite(s["rate_lo"]) and s["rate_lo"] > 0 else s["rate"] for s in ss])
        hi = np.array([s["rate_hi"] if math.isfinite(s["rate_hi"]) else s["rate"] for s in ss])
        ax.errorbar(g, r, yerr=[r - lo, hi - r], fmt="o", capsize=3, color=c, label=scope)
        for f in fits:
            if f.x_name == "gamma" and f.y_name == "rate" and math.isfinite(f.k) and f.scope == scope:
                gg = np.geomspace(g.min(), g.max(), 50)
                ax.plot(gg, np.exp(f.intercept) * gg ** f.k, "--", color=c, label=f"fit k={f.k:.2f} {fmt_ci(*f.k_ci)}")
    gg = np.geomspace(min(s["gamma"] for s in good), max(s["gamma"] for s in good), 50)
    for f in fits:
        if f.x_name == "gamma" and f.y_name == "rate" and math.isfinite(f.k) and f.scope == "pooled" and len(groups) > 1:
            ax.plot(gg, np.exp(f.intercept) * gg ** f.k, "k--", label=f"pooled fit k={f.k:.2f} {fmt_ci(*f.k_ci)}")
    if any(s["draws"] for s in good):
        ax.plot([], [], ".", color="gray", alpha=0.4, label="one HMM draw")
    ax.set(xscale="log", yscale="log", xlabel="gamma (no unit)", ylabel="decay rate r (1/L, per token; 95% CI)",
           title="rate vs gamma")
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below the panel: on no point
    return save_figure(fig, path)


def practice_section(df, out_dir: Path, figs: dict) -> Section | None:
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
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
        wins = ", ".join(fmt_num(w) for w in sorted(set(g["param:model.window"])))
        rows.append([fmt_num(gam), fmt_num(rank), wins, fmt_num(L), str(len(g)), fmt_num(tv.mean()),
                     fmt_num(tv.std(ddof=1) if len(g) > 1 else NAN), fmt_num(e),
                     fmt_num(tv.mean() / e if e and math.isfinite(e) else NAN, 3)])
        series[f"gamma={fmt_num(gam)} d={fmt_num(rank)}"].append((L, tv.mean(), e))
    sec = Section("Practice vs theory: windowed transformers", [
        ("p", "Excess error of a transformer with banded attention (memory/model_tv, mean over runs) beside the "
              "L-memory predictor's eps(L) (memory/eps) per (gamma, d). A stack of n_layers banded layers of width w "
              "sees L = n_layers (w - 1) + 1 tokens (its receptive field, memory/receptive_field), so eps is taken "
              "at that L and the model is scored on test positions whose receptive field holds test tokens only."
         + (" Some runs predate receptive fields: their rows use L = w, which understates what a deep model sees."
            if old else "")),
        ("table", ["gamma", "d", "window w", "L (receptive field)", "runs", "model TV", "sd", "eps(L)", "model / eps"],
         rows)])

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, (gam, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts)
        L = [p[0] for p in pts]
        c = f"C{i % 10}"
        ax.plot(L, [p[1] for p in pts], "o-", color=c, label=f"model, {gam}")
        if any(math.isfinite(p[2]) for p in pts):
            ax.plot(L, [p[2] for p in pts], "s--", color=c, label=f"eps(L), {gam}")
    ax.set(yscale="log", xlabel="receptive field L (tokens)", ylabel="TV to the full-history oracle (lower is better)",
           title="practice vs theory")
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below the panel: on no point
    png, pdf = save_figure(fig, out_dir / "practice_vs_theory.png")
    figs["practice"], figs["practice_pdf"] = str(png), str(pdf)
    sec.blocks.append(("img", png.name, "model excess error and eps(L) vs L"))
    return sec


