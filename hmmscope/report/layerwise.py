"""Layerwise claims pooled over analyzed runs (Figures 2, 3a, 3b) and the depth-vs-rank regression
(statistical choices: package docstring). Seeds are the unit wherever they vary (stats.t_mean: a t
interval on G - 1 df over the seeds' values): a pooled claim is the mean over seeds of each seed's mean over
its runs; the depth-vs-rank coefficients are fitted per seed and averaged (two-stage), the OLS over all
trials shown beside them. With one seed, the runs (settings) are the units and the section says so. Each
pooled claim and the depth interaction say whether the design is underpowered (common.underpowered): one
run is no replicate, and an inconclusive CI wider than the effect says more runs are needed rather than
that there is no effect. The pooled claims are a family: one line says how many are supported and how many the rule
would give by chance, and a Holm-adjusted verdict stands beside each (stats.holm_verdicts). Every p is printed with
its df; each section writes a figure (embedded in the HTML)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..stats import NO_POWER, VERDICTS, Claim, claim, holm_verdicts, parse_rule, rule, t_mean
from ..units import axis_label, claim_words, fmt_ci, fmt_num, fmt_p
from .common import NAN, Section, underpowered
from .posenc import ols_fit


def _seed_col(df) -> str | None:
    return next((c for c in ("param:train.seed", "param:data.seed") if c in df.columns and df[c].nunique() > 1), None)


def _pooled_rule(r: str) -> str:
    """A run's rule for the pooled claim: the same test, its requirements renamed to the pooled claims."""
    op, t, req = parse_rule(r)
    return NO_POWER if op == NO_POWER else rule(op, t, [f"pooled: {x}" for x in req])


def layerwise_section(df, out_dir: Path | None = None, figs: dict | None = None) -> tuple[Section | None, list[Claim]]:
    cols = sorted(c for c in df.columns if c.startswith("metric:claim/") and c.endswith("/value")) if not df.empty else []
    if not cols:
        return None, []
    seed_col = _seed_col(df)
    sec = Section("Layerwise claims (Figures 2, 3a, 3b), pooled over analyzed runs")
    sec.blocks.append(("p", "Pooled estimate = "
                            + (f"mean over seeds ({seed_col[6:]}) of each seed's mean over its runs, with a t-based 95% "
                               "CI on G - 1 df (G seeds: the runs of one seed share its data and initialization, so "
                               "the seed is the unit)" if seed_col else
                               "mean of the per-run values, with a t-based 95% CI across runs (one seed: the runs "
                               "are the units)")
                            + "; one run: its own CI. A statistic that takes one value in every unit has no CI "
                            "(no power). IVW = inverse-variance weighted mean with SE = (ci_hi - ci_lo) / 3.92, shown "
                            "for comparison. Pooled verdict: the claim's own decision rule (logged with each run, "
                            "stats.decide) applied to the pooled CI, the same rule every run used. A claim whose "
                            "runs logged no rule (older hmmscope) or different rules is not judged (inconclusive)."))
    rows, per_run, pooled = [], [], []
    for c in cols:
        name = c[len("metric:claim/"):-len("/value")]
        sub = df[df[c].notna()]
        v = sub[c].astype(float).to_numpy()
        lo = sub.get(f"metric:claim/{name}/ci_lo", np.full(len(sub), NAN))
        hi = sub.get(f"metric:claim/{name}/ci_hi", np.full(len(sub), NAN))
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
        verd = list(sub.get(f"verdict:{name}", [""] * len(sub)))
        rules = {str(r) for r in sub.get(f"rule:{name}", [""] * len(sub)) if isinstance(r, str) and r}
        counts = {k: sum(x == k for x in verd) for k in VERDICTS}
        n = len(v)
        if n >= 2:
            if seed_col:
                seeds = sub[seed_col].astype(str).to_numpy()
                labs = sorted(set(seeds))
                est = t_mean([v[seeds == s].mean() for s in labs], labs, unit="seed")
            else:
                est = t_mean(v, list(sub["trial"]) if "trial" in sub else None, unit="run")
            m, plo, phi, df_, degen = est.value, est.lo, est.hi, est.df, est.degenerate
        else:
            m, plo, phi, df_, degen, est = float(v[0]), float(lo[0]), float(hi[0]), NAN, "", None
        se_i = (hi - lo) / 3.92
        ok = np.isfinite(se_i) & (se_i > 0)
        if ok.any():
            w = 1 / se_i[ok] ** 2
            ivw, ivw_se = float((w * v[ok]).sum() / w.sum()), float(1 / math.sqrt(w.sum()))
        else:
            ivw, ivw_se = NAN, NAN
        pooled.append((name, n, m, plo, phi, ivw, ivw_se, counts, rules, df_, degen, est))
        for i in range(n):
            per_run.append([name, str(sub["trial"].iloc[i]), fmt_num(v[i]), fmt_ci(lo[i], hi[i]), verd[i] or "-"])
    claims: dict[str, Claim] = {}
    pending = list(pooled)
    while pending:  # claims whose requirements are decided first
        done = {k: c.verdict for k, c in claims.items()}
        ready = [p for p in pending if len(p[8]) != 1 or all(r in done for r in parse_rule(
            _pooled_rule(next(iter(p[8]))))[2])] or pending
        for p in ready:
            name, n, m, plo, phi, ivw, ivw_se, counts, rules, df_, degen, est = p
            stat = (f"mean over {n} runs: {est.method}" if est is not None else "single run's CI")
            tally = "; ".join(f"{counts[k]} {k}" for k in VERDICTS if counts[k]) or "no per-run verdicts"
            if len(rules) == 1:
                c = claim(f"pooled: {name}", stat, m, plo, phi, _pooled_rule(next(iter(rules))),
                          f"per-run verdicts: {tally}", done, df=df_, degenerate=degen)
            else:
                why = "no decision rule logged (older hmmscope)" if not rules else f"runs logged different rules {sorted(rules)}"
                c = Claim(f"pooled: {name}", stat, m, plo, phi, "inconclusive", f"{why}: not judged; per-run verdicts: "
                          f"{tally}", "", df_, degen)
            claims[f"pooled: {name}"] = c
            done[f"pooled: {name}"] = c.verdict
        pending = [p for p in pending if p not in ready]
    for name, n, m, plo, phi, ivw, ivw_se, counts, _, df_, degen, est in pooled:
        c = claims[f"pooled: {name}"]
        try:
            op, t, _ = parse_rule(c.rule) if c.rule else ("", 0.0, ())
        except ValueError:
            t = 0.0
        reps = est.n if est is not None else n
        power = underpowered(m, plo, phi, c.verdict, threshold=0.0 if not math.isfinite(t) else t, replicates=reps,
                             unit=est.unit if est is not None else "replicate")
        if power:
            claims[f"pooled: {name}"] = c = dataclasses.replace(c, reason=f"{c.reason}; {power}")
        rows.append([name, str(n), f"{est.n} {est.unit}" if est is not None else "1 run", fmt_num(m), fmt_ci(plo, phi),
                     fmt_num(df_), f"{fmt_num(ivw)} ± {fmt_num(1.96 * ivw_se)}", "/".join(str(counts[k]) for k in VERDICTS),
                     c.rule or "-", power or degen or "ok", c.verdict])
    out = [claims[f"pooled: {p[0]}"] for p in pooled]
    holm, family = holm_verdicts(out)  # the family of pooled claims: Holm beside each verdict, never instead
    rows = [[*r, hv] for r, hv in zip(rows, holm)]
    sec.blocks += [("p", f"Family of {len(out)} pooled claims: {family}."),
                   ("table", ["claim", "runs", "units", "pooled mean", "95% CI", "df", "IVW ± 1.96 SE",
                              "per-run supported/not/inconclusive/no power", "rule", "power", "pooled verdict",
                              "Holm (family)"], rows),
                   ("h", 3, "Per-run values"),
                   ("table", ["claim", "trial", "value", "95% CI", "verdict"], per_run)]
    if out_dir is not None:
        saved = _plot_pooled(out, pooled, Path(out_dir) / "layerwise_claims.png")
        if figs is not None:
            figs["layerwise"], figs["layerwise_pdf"] = (str(p) for p in saved)
        sec.blocks.insert(3, ("img", saved[0].name, "pooled layerwise claims: unit values as dots, the pooled mean "
                                                    "with its 95% CI, coloured by verdict"))
    return sec, out


_COLOURS = {"supported": "C2", "not supported": "C3", "inconclusive": "C7", "no power": "C4"}


def _plot_pooled(claims: list[Claim], pooled: list, path: Path) -> list[Path]:
    """One row per pooled claim: its units' values (dots), the pooled mean with its 95% CI (coloured by
    verdict); each row scaled by its own largest |value| so claims on different scales share the axis."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)

    fig = Figure(figsize=(7, 0.32 * len(claims) + 1.5), layout="constrained")
    ax = fig.subplots()
    for i, (c, p) in enumerate(zip(claims, pooled)):
        est = p[11]
        vals = [u[1] for u in est.units] if est is not None else [c.value]
        scale = max([abs(x) for x in [*vals, c.ci_lo, c.ci_hi, c.value] if math.isfinite(x)] or [1.0]) or 1.0
        ax.plot([x / scale for x in vals], [i] * len(vals), ".", color="gray", alpha=0.6)
        col = _COLOURS.get(c.verdict, "k")
        if math.isfinite(c.ci_lo) and math.isfinite(c.ci_hi):
            ax.plot([c.ci_lo / scale, c.ci_hi / scale], [i, i], "-", color=col, lw=2)
        ax.plot([c.value / scale], [i], "o", color=col)
    ax.axvline(0, color="gray", ls=":")
    ax.set(yticks=range(len(claims)), xlabel="value / max |value| of the row (0 is each claim's threshold side)",
           ylabel="claim", title="pooled layerwise claims (colour: verdict)")
    ax.set_yticklabels([claim_words(c.name[len("pooled: "):]) for c in claims], fontsize=7)
    ax.invert_yaxis()
    for k, col in _COLOURS.items():
        ax.plot([], [], "o", color=col, label=k)
    ax.plot([], [], ".", color="gray", alpha=0.6, label="a unit (seed or run)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)  # every colour, below the panel
    return save_figure(fig, path)


def depth_rank_section(df, out_dir: Path | None = None, figs: dict | None = None) -> tuple[Section | None, list[Claim]]:
    key = next((k for k in ("metric:eval/seen/excess_ce", "metric:eval/excess_ce") if k in df.columns),
               "metric:eval/seen/excess_ce")  # eval/excess_ce: runs recorded before eval/seen/excess_ce
    need = ["param:model.n_layers", "param:hmm.rank", key]
    if df.empty or not all(c in df.columns for c in need):
        return None, []
    d = df[df[key].notna()].copy()
    if d["param:model.n_layers"].nunique() < 2 or d["param:hmm.rank"].nunique() < 2:
        return None, []
    d["y"] = d[key].astype(float)
    d["n_layers"] = d["param:model.n_layers"].astype(float)
    d["log_rank"] = np.log(d["param:hmm.rank"].astype(float))
    rows = []
    for (nl, rk), g in d.groupby(["param:model.n_layers", "param:hmm.rank"], sort=True):
        rows.append([fmt_num(nl), fmt_num(rk), str(len(g)), fmt_num(g["y"].mean()),
                     fmt_num(g["y"].std(ddof=1) if len(g) > 1 else NAN)])
    reps = int(d.groupby(["param:model.n_layers", "param:hmm.rank"]).size().min())
    sec = Section("Depth vs rank", [("p", f"{key[len('metric:'):]} by (n_layers, rank): cell means over trials."),
                                    ("table", ["n_layers", "rank", "runs", "mean excess CE", "sd"], rows)])
    claims = []
    if len(d) - 4 < 1:
        sec.blocks.append(("p", f"{len(d)} trials: too few for excess_ce ~ n_layers * log(rank) "
                                "(underpowered: 4 coefficients need at least 5 trials)."))
        return sec, claims
    t = "n_layers:log_rank"
    res, label = ols_fit("y ~ n_layers * log_rank", d)
    ci = res.conf_int(0.05)
    seed_col = _seed_col(d)
    per_seed = {}
    if seed_col:
        for s_, g in d.groupby(seed_col):
            if len(g) >= 5 and g["n_layers"].nunique() >= 2 and g["log_rank"].nunique() >= 2:
                r_, _ = ols_fit("y ~ n_layers * log_rank", g)
                if r_.df_resid >= 1:
                    per_seed[str(s_)] = r_.params
    two_stage = len(per_seed) >= 2
    crow = []
    for term in res.params.index:
        lo, hi = float(ci.loc[term][0]), float(ci.loc[term][1])
        row = [term, fmt_num(float(res.params[term])), fmt_ci(lo, hi), fmt_p(float(res.pvalues[term])),
               fmt_num(float(res.df_resid))]
        if two_stage:
            e = t_mean([p[term] for p in per_seed.values()], list(per_seed), unit="seed")
            row += [fmt_num(e.value), fmt_ci(e.lo, e.hi), fmt_p(e.p), fmt_num(e.df)]
        crow.append(row)
    heads = ["term", f"coef ({label})", "95% CI", "p", "df"]
    if two_stage:
        heads += ["coef (per-seed fits, mean)", "95% CI (t over seeds)", "p", "df"]
        e = t_mean([p[t] for p in per_seed.values()], list(per_seed), unit="seed")
        c_val, lo, hi, df_, degen = e.value, e.lo, e.hi, e.df, e.degenerate
        stat = f"interaction n_layers:log(rank), two-stage: OLS per seed, {e.method}"
        how = (f"The verdict reads the two-stage fit: the regression fitted within each of {len(per_seed)} seeds "
               f"({seed_col[6:]}), its coefficients averaged with a t interval on {len(per_seed) - 1} df (trials "
               "that share a seed are not independent replicates). The OLS over all trials is shown beside it.")
    else:
        lo, hi = (float(x) for x in ci.loc[t])
        c_val, df_, degen = float(res.params[t]), float(res.df_resid), ""
        stat = f"interaction n_layers:log(rank) ({label}, df {fmt_num(df_)})"
        how = ("No seed holds enough trials for its own fit (or one seed): the trials are the units, OLS "
               f"with {fmt_num(df_)} residual df.")
    sec.blocks += [("p", f"{label}: excess_ce ~ n_layers + log(rank) + n_layers:log(rank), {len(d)} trials, "
                         f"R^2 = {fmt_num(float(res.rsquared), 3)}. A negative interaction means extra layers help more "
                         f"at higher rank. {how}"),
                   ("table", heads, crow)]
    c = claim("depth helps more at higher rank", stat, c_val, lo, hi, rule("<", 0),
              "negative interaction = deeper models gain more as rank grows", df=df_, degenerate=degen)
    power = underpowered(c.value, lo, hi, c.verdict, replicates=len(per_seed) if two_stage else reps,
                         unit="seed" if two_stage else "replicate")
    if power:
        c = dataclasses.replace(c, reason=f"{c.reason}; {power}")
        sec.blocks.append(("p", f"Interaction n_layers:log(rank): {power}."))
    claims.append(c)
    if out_dir is not None:
        saved = _plot_depth(d, Path(out_dir) / "depth_vs_rank.png", key[len("metric:"):])
        if figs is not None:
            figs["depth_rank"], figs["depth_rank_pdf"] = (str(p) for p in saved)
        sec.blocks.append(("img", saved[0].name, "excess CE vs n_layers per rank (trials as dots, cell means joined)"))
    return sec, claims


def _plot_depth(d, path: Path, ylabel: str) -> list[Path]:

    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, (rk, g) in enumerate(d.groupby("param:hmm.rank", sort=True)):
        c = f"C{i % 10}"
        ax.plot(g["n_layers"], g["y"], ".", color=c, alpha=0.6)
        m = g.groupby("n_layers")["y"].mean()
        ax.plot(m.index, m.values, "o-", color=c, label=f"rank {fmt_num(rk)}")
    ax.set(xlabel="n_layers", ylabel=f"{axis_label(ylabel)} (lower is better)", title="depth vs rank")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below the panel: on no point
    return save_figure(fig, path)
