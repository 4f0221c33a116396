"""Positional encoding: the RoPE - absolute effect per metric and per layerwise claim, with seeds as the unit
(statistical choices: package docstring; the method: stats.paired_effect).

The verdict row of each metric is the few-cluster test: within every (seed, block) cell that holds both
encodings, the difference rope - absolute; a seed's value is the mean over its blocks; the effect is the
mean over seeds with a t interval on G - 1 df (one seed: the blocks are the units). Blocks are the levels
of the other design factors (the spec's [space] keys, `read.design_keys`; never a seed, never what a run fitted
from data, such as an older store's counting.* params: SCIENCE.md 9): a factor whose every level occurs with one
encoding only is confounded with pos_enc and left out (the effect then includes its difference, and the table
says so); the others are added while the design keeps >= 2 units; a factor with a different value in every trial
is left out.
Nothing is estimated for a blocking factor, so one gamma level or gamma levels that differ by seed cost
no degree of freedom. Per-level effects (rope - absolute at each level of each blocking factor, same
method) sit beside the pooled one for the eval metrics, and a figure shows both.

Second opinions, never the verdict: OLS `metric ~ rope + C(blocks)` with HC3 errors (trials as units, df =
residual df) and, when every cell has >= 2 seeds, a mixed model with a random intercept per seed (REML,
z-based: df "asymptotic"). With 3 seeds both treat 12 trials as the information, and a seed-to-seed
spread of the effect is then read as precision (tests/test_stats.py: coverage ~75% for a planted null).
Every p is printed with its degrees of freedom."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import statsmodels.formula.api as smf
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..stats import DEFAULT_MARGIN, Claim, Estimate, claim, rule, side_verdict
from ..sweep.effects import block_labels, choose_blocks, effect, level_order, per_level_effects, pos_enc_effect
from ..units import fmt_ci, fmt_num, fmt_p, metric_units
from .common import METRIC_DIRECTION, Notes, Section, claim_side, underpowered

VERDICT_ROW = "paired within-block differences, seeds as the unit (t, G - 1 df)"


def _other_factors(d, exclude: set[str], allowed=None) -> tuple[list[str], dict[str, str]]:
    """(swept factors that may block, {factor: why it cannot}); seeds are replicates, not factors. `allowed`: the
    design's keys (`read.design_keys`: the spec's [space] keys), when given the only params that may block: what a
    run fits (an older store's counting.* params) never does."""
    out, unusable = [], {}
    for c in d.columns:
        if not c.startswith("param:") or c in exclude or c.endswith("seed") or c.split(".")[-1].endswith("seed"):
            continue
        if allowed is not None and c[len("param:"):] not in allowed:
            continue
        vals = d[c].astype(str)
        if 2 <= vals.nunique() < len(d):
            out.append(c)
        elif vals.nunique() == len(d) >= 2:
            unusable[c] = "a different value in every trial: not estimable"
    return out, unusable


def ols_fit(formula: str, data):
    """OLS with HC3 errors, plain errors when HC3 is not finite; returns (result, cov label)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = smf.ols(formula, data).fit(cov_type="HC3", use_t=True)
        if not np.all(np.isfinite(np.asarray(res.bse))):
            return smf.ols(formula, data).fit(), "plain OLS (HC3 not finite: a leverage-1 point)"
    return res, "OLS, HC3"


def _second_opinions(data, y: str, blocks: list[str], seed_col: str | None) -> list[tuple]:
    """[(label, effect, lo, hi, p, df text)]: OLS HC3 and (>= 2 seeds per cell) the mixed model."""
    data = data[[y, "param:model.pos_enc", *blocks] + ([seed_col] if seed_col else [])].copy()
    data = data[data[y].notna()]
    data["y"] = data[y].astype(float)
    data["rope"] = (data["param:model.pos_enc"] == "rope").astype(float)
    names = {f: f"f{i}" for i, f in enumerate(blocks)}
    for f, n in names.items():
        data[n] = data[f].astype(str)
    formula = "y ~ rope" + "".join(f" + C({n})" for n in names.values())
    out = []
    try:
        ols, label = ols_fit(formula, data)
        if ols.df_resid >= 1:
            lo, hi = (float(v) for v in np.asarray(ols.conf_int(0.05).loc["rope"]))
            out.append((f"second opinion: {label} (trials as units)", float(ols.params["rope"]), lo, hi,
                        float(ols.pvalues["rope"]), fmt_num(float(ols.df_resid))))
    except Exception:  # a singular design: no second opinion
        pass
    if seed_col:
        cols = ["rope", *names.values()]
        if data.groupby(cols)[seed_col].nunique().min() >= 2:
            data["seed"] = data[seed_col].astype(str)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mm = smf.mixedlm(formula, data, groups=data["seed"]).fit(reml=True)
                if mm.converged and math.isfinite(float(mm.bse_fe["rope"])):
                    lo, hi = (float(v) for v in np.asarray(mm.conf_int(0.05).loc["rope"]))
                    out.append(("second opinion: mixed model, random intercept per seed", float(mm.fe_params["rope"]),
                                lo, hi, float(mm.pvalues["rope"]), "asymptotic (z)"))
            except Exception:  # singular fits, non-convergence
                pass
    return out


def _power(est: Estimate, verdict: str, n_seeds: int, metric: str = "") -> str:
    """The power note (common.underpowered); an inconclusive effect also says what the design excludes and the seeds
    it would need for the unit's default margin (sweep.effects, issue 45.2)."""
    why = underpowered(est.value, est.lo, est.hi, verdict, replicates=n_seeds, unit="seed")
    unit = metric_units(metric)
    more = effect(metric, est, rule("!=", 0), "", unit=unit, margin=DEFAULT_MARGIN.get(unit, math.nan)).power_text() \
        if verdict == "inconclusive" else ""
    return "; ".join(x for x in (why, more) if x)


def posenc_section(df, out_dir: Path | None = None, figs: dict | None = None,
                   factors=None) -> tuple[Section | None, list[Claim]]:
    """The section and its claims; `factors`: the design's keys that may block (`read.design_keys`), None: every
    param that varies."""
    if df.empty or "param:model.pos_enc" not in df.columns or df["param:model.pos_enc"].nunique() < 2:
        return None, []
    levels = sorted(df["param:model.pos_enc"].astype(str).unique())
    sec, claims = Section("Positional encoding: RoPE vs absolute"), []
    if not {"rope", "absolute"} <= set(levels):
        sec.blocks.append(("p", f"pos_enc levels {levels} do not include both rope and absolute: no comparison."))
        return sec, []
    d = df[df["param:model.pos_enc"].isin(["rope", "absolute"])]
    seed_col = next((c for c in ("param:train.seed", "param:data.seed") if c in d.columns and d[c].nunique() > 1),
                    None)
    n_seeds = int(d[seed_col].nunique()) if seed_col else 1
    factors, unusable = _other_factors(d, {"param:model.pos_enc"}, None if factors is None else set(factors))
    metrics = [m for m in METRIC_DIRECTION if f"metric:{m}" in d.columns]
    claim_cols = sorted(c for c in d.columns if c.startswith("metric:claim/") and c.endswith("/value"))
    sec.blocks.append(("p", f"Effect = RoPE - absolute; {len(d)} trials, {n_seeds} seed{'s' if n_seeds > 1 else ''} "
                            f"({seed_col[6:] if seed_col else 'no varying seed'}). Verdict: {VERDICT_ROW}: within each "
                            "(seed, block) the difference of the two encodings, averaged over a seed's blocks, then a "
                            "t interval over seeds (with G seeds an effect that varies by seed has G - 1 degrees of "
                            "freedom, however many trials there are; one seed: the blocks are the units). Blocks: "
                            f"{', '.join(f[6:] for f in factors) or 'none'} (the factor table says which entered). "
                            "Second opinions (OLS HC3, mixed model) are shown with their df but never make the "
                            "verdict. Claim tested: 'RoPE improves <metric>'."))
    rows, fate, level_rows, plot = [], {}, [], []
    notes = level_notes = Notes()  # the method and power texts: once, below the first table that names them
    for m in [f"metric:{m}" for m in metrics] + claim_cols:
        name = m[len("metric:"):]
        if m in claim_cols:
            cname = name[len("claim/"):-len("/value")]
            vals = [(v, vd) for v, vd in zip(d[m], d.get(f"verdict:{cname}", [""] * len(d))) if v == v]
            side, label = claim_side(cname, vals), f"claim {cname}"
        else:
            side, label = METRIC_DIRECTION[name], name
        left = [f"{f[6:]} ({why})" for f, why in unusable.items()]
        dm = d[d[m].notna()]
        blocks, fm = choose_blocks(dm, m, factors, seed_col) if not dm.empty else ([], {})
        for f, why in fm.items():
            fate.setdefault(f, set()).add(why)
        left = [f"{f[6:]} ({why[len('left out: '):]})" for f, why in fm.items() if why.startswith("left")] + left
        est = pos_enc_effect(dm, m, blocks, seed_col) if not dm.empty else "no trial has this metric"
        if isinstance(est, str):
            rows.append([label, "not estimated", "-", "-", "-", "-", "-", "-", ", ".join(left) or "-", "-",
                         f"not estimated: {est}"])
            continue
        bl = ", ".join(f[6:] for f in blocks) or "none"
        v = side_verdict(est.lo, est.hi, side, df=est.df, degenerate=est.degenerate)
        word = ("" if v == "no power" else "RoPE better" if v == "supported" else "RoPE worse" if v == "not supported"
                else "no detectable difference") if side else \
            ("" if v == "no power" else "differs" if v == "supported" else "no detectable difference")
        power = _power(est, v, n_seeds, name)
        note = (("underpowered " if power.startswith("underpowered") else "") + notes.ref(power) if power else
                notes.short(est.degenerate) or "ok")
        rows.append([label, f"verdict {notes.ref(est.method)}", fmt_num(est.value), fmt_ci(est.lo, est.hi), fmt_p(est.p),
                     fmt_num(est.df), f"{est.n} {est.unit}", bl, ", ".join(left) or "none", note,
                     v + (f" ({word})" if word else "")])
        for lab, b, lo, hi, p, dft in _second_opinions(dm, m, blocks, seed_col):
            rows.append([label, lab, fmt_num(b), fmt_ci(lo, hi), fmt_p(p), dft, "-", bl, ", ".join(left) or "none", "-",
                         "- (second opinion)"])
        better = {1: "higher", -1: "lower", 0: "different"}[side]
        why = [f"{est.method}; p = {fmt_p(est.p)} (df {fmt_num(est.df)})"]
        stat = f"rope - absolute ({VERDICT_ROW}); better = {better}; {est.n} {est.unit} units"
        if side:  # the verdict is stats.decide's on the CI beside it
            c = claim(f"RoPE improves {label}", stat, est.value, est.lo, est.hi, rule(">" if side > 0 else "<", 0), "",
                      df=est.df, degenerate=est.degenerate)
        else:  # an analysis claim whose side is unknown: two-sided, no rule
            c = Claim(f"RoPE improves {label}", stat, est.value, est.lo, est.hi, v, "", "", est.df, est.degenerate)
        power = _power(est, c.verdict, n_seeds, name)
        claims.append(dataclasses.replace(c, reason="; ".join([*why, *([c.reason] if c.reason else []),
                                                                 *([power] if power else [])])))
        if m in claim_cols:
            continue
        plot.append((name, dm, blocks, est))
        level_rows += _level_rows(name, dm, m, blocks, seed_col, est, level_notes)
    sec.blocks.append(("table", ["metric", "model", "effect (rope - abs)", "95% CI", "p", "df", "units",
                                 "blocks (paired within)", "left out (why)", "power", "verdict (RoPE improves)"], rows))
    sec.blocks += notes.blocks()
    if level_rows:
        sec.blocks += [("h", 3, "Per-level effects (RoPE - absolute at each level of each blocking factor)"),
                       ("table", ["metric", "level", "effect", "95% CI", "p", "df", "units", "method"], level_rows),
                       *level_notes.blocks()]
    frows = [[f[6:], str(d[f].astype(str).nunique()), " / ".join(sorted(fate.get(f, {"not reached"})))]
             for f in factors] + [[f[6:], str(d[f].astype(str).nunique()), f"left out: {why}"]
                                  for f, why in unusable.items()]
    sec.blocks += [("h", 3, "Blocking factors"), ("table", ["factor", "levels", "fate"], frows)] if frows else []
    if out_dir is not None and plot:
        saved = _plot_posenc(plot, seed_col, Path(out_dir) / "posenc_effects.png")
        if figs is not None:
            figs["posenc"], figs["posenc_pdf"] = (str(p) for p in saved)
        sec.blocks.append(("img", saved[0].name, "RoPE vs absolute: each metric per block (seeds as dots, means as "
                                                 "lines), and the effect rope - absolute per level and pooled with "
                                                 "its 95% CI"))
    return sec, claims


def _level_rows(name: str, dm, m: str, blocks, seed_col, est, level_notes: Notes) -> list[list]:
    """The per-level effects of one metric (RoPE - absolute at each level of each blocking factor), then the pooled
    one (the verdict row)."""
    rows = []
    for f, lv, e in per_level_effects(dm, m, blocks, seed_col):
        if isinstance(e, str):
            rows.append([name, f"{f[6:]} = {lv}", "not estimated", "-", "-", "-", "-", level_notes.short(e)])
        else:
            rows.append([name, f"{f[6:]} = {lv}", fmt_num(e.value), fmt_ci(e.lo, e.hi), fmt_p(e.p), fmt_num(e.df),
                         f"{e.n} {e.unit}", level_notes.ref(e.degenerate or e.method)])
    rows.append([name, "pooled (the verdict row)", fmt_num(est.value), fmt_ci(est.lo, est.hi), fmt_p(est.p),
                 fmt_num(est.df), f"{est.n} {est.unit}", level_notes.ref(est.method)])
    return rows


def _plot_posenc(plot: list, seed_col: str | None, path: Path) -> list[Path]:
    """`posenc_figure` as PNG + PDF at `path`."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(posenc_figure(plot, seed_col), path)


def posenc_figure(plot: list, seed_col: str | None):
    """[(metric, its trials, blocks, pooled Estimate)] -> the figure. Top row: each eval metric per block,
    absolute then rope side by side within the block (never joined across blocks: a line from one block to the
    next would draw the block's effect, not the encoding's); each trial a
    dot, a seed's two encodings joined by a thin grey line (the paired difference the verdict uses), the mean of
    each encoding a short bar. Bottom row: rope - absolute per block (the seeds' paired differences as dots, the
    mean with its 95% CI) and pooled (the verdict's estimate and CI), zero dotted, the side where RoPE is better
    shaded and labelled. Every axis names its unit (nats/token, fraction of test tokens)."""

    labels = {j: [", ".join(f"{b[6:].split('.')[-1]}={v}" for b, v in zip(blocks, k)) or "all"
                  for k in (block_labels(dm, blocks) or [()] * len(dm))] for j, (_, dm, blocks, _) in enumerate(plot)}
    n_blocks = max(len(set(v)) for v in labels.values())
    longest = max(len(x) for v in labels.values() for x in v)
    tilt = n_blocks * longest > 36  # block labels that would not fit side by side: tilted
    fig = Figure(figsize=(max(4.4, 0.9 + 0.55 * (n_blocks + 1)) * len(plot), 7.6 + (0.9 if tilt else 0.0)),
                 layout="constrained")
    axes = fig.subplots(2, len(plot), squeeze=False)
    for j, (name, dm, _, est) in enumerate(plot):
        lab = labels[j]
        dm = dm.assign(_block=lab)
        order = sorted(set(lab), key=lambda s: [level_order(x.split("=")[-1]) for x in s.split(", ")])
        ax = axes[0][j]
        seeds = dm[seed_col].astype(str) if seed_col else None
        for i, b in enumerate(order):
            sub = dm[dm["_block"] == b]
            if seeds is not None:  # a seed's two encodings in this block, joined: the paired difference
                for sd in sorted(seeds[sub.index].unique()):
                    pair = sub[seeds[sub.index] == sd]
                    ya = pair[pair["param:model.pos_enc"] == "absolute"][f"metric:{name}"].astype(float)
                    yr = pair[pair["param:model.pos_enc"] == "rope"][f"metric:{name}"].astype(float)
                    if len(ya) and len(yr):
                        ax.plot([i - 0.15, i + 0.15], [ya.mean(), yr.mean()], "-", color="gray", lw=0.7, alpha=0.6)
            for pe, c, dx in (("absolute", "C1", -0.15), ("rope", "C0", 0.15)):
                y = sub[sub["param:model.pos_enc"] == pe][f"metric:{name}"].astype(float)
                if not len(y):
                    continue
                ax.plot([i + dx] * len(y), y, "o", color=c, alpha=0.7, ms=5, label=pe if i == 0 else None)
                ax.plot([i + dx - 0.09, i + dx + 0.09], [y.mean()] * 2, "-", color=c, lw=2.5)
        if seeds is None:  # one trial per encoding and block: join the pair all the same
            for i, b in enumerate(order):
                sub = dm[dm["_block"] == b]
                ya = sub[sub["param:model.pos_enc"] == "absolute"][f"metric:{name}"].astype(float)
                yr = sub[sub["param:model.pos_enc"] == "rope"][f"metric:{name}"].astype(float)
                if len(ya) and len(yr):
                    ax.plot([i - 0.15, i + 0.15], [ya.mean(), yr.mean()], "-", color="gray", lw=0.7, alpha=0.6)
        unit = metric_units(name)
        ax.set(xticks=range(len(order)), xlim=(-0.6, len(order) - 0.4), title=name, ylabel=unit or name,
               xlabel="block (the other swept keys' levels)")
        ax.set_xticklabels(order, fontsize=8, **({"rotation": 30, "ha": "right"} if tilt else {}))
        ax.grid(axis="y", alpha=0.3)
        ax = axes[1][j]
        for i, b in enumerate(order):
            sub = dm[dm["_block"] == b]
            e = pos_enc_effect(sub, f"metric:{name}", [], seed_col)
            if isinstance(e, str):
                continue
            ax.plot([i] * len(e.units), [u[1] for u in e.units], ".", color="gray", alpha=0.7)
            if math.isfinite(e.lo):
                ax.errorbar([i], [e.value], yerr=[[e.value - e.lo], [e.hi - e.value]], fmt="o", color="C2", capsize=3)
            else:
                ax.plot([i], [e.value], "o", color="C2")
        k = len(order)
        if math.isfinite(est.lo):
            ax.errorbar([k], [est.value], yerr=[[est.value - est.lo], [est.hi - est.value]], fmt="D", color="k",
                        capsize=3)
        else:
            ax.plot([k], [est.value], "D", color="k")
        ax.axhline(0, color="gray", ls=":")
        side = METRIC_DIRECTION.get(name, 0)
        if side:  # the half where RoPE is better, shaded and labelled (lower CE / KL, higher accuracy)
            lo, hi = ax.get_ylim()
            span = max(abs(lo), abs(hi))
            ax.set_ylim(-span * 1.05, span * 1.05)
            ax.axhspan(0, side * span * 1.05, color="C2", alpha=0.07, lw=0)
            for y, txt in ((side * span * 0.95, "RoPE better"), (-side * span * 0.95, "RoPE worse")):
                ax.text(-0.55, y, txt, ha="left", va="center", fontsize=7, color="dimgray")
        ax.set(xticks=range(k + 1), xlim=(-0.6, k + 0.6), ylabel=f"rope - absolute{f' ({unit})' if unit else ''}",
               xlabel="block, then pooled",
               title=f"rope - absolute, 95% CI ({est.n} {est.unit} units)")
        ax.set_xticklabels([*order, "pooled"], fontsize=8, **({"rotation": 30, "ha": "right"} if tilt else {}))
    keys = [Line2D([], [], ls="", marker="o", color="C1", label="absolute (a trial)"),
            Line2D([], [], ls="", marker="o", color="C0", label="rope (a trial)"),
            Line2D([], [], color="k", lw=2.5, label="mean of an encoding"),
            Line2D([], [], color="gray", lw=0.7, label="a seed's two encodings"),
            Line2D([], [], ls="", marker="o", color="C2", label="rope - absolute per block, 95% CI"),
            Line2D([], [], ls="", marker="D", color="k", label="pooled (the verdict), 95% CI")]
    fig.legend(handles=keys, loc="outside lower center", ncol=3, fontsize=8, frameon=False)  # below: hides no data
    fig.suptitle("RoPE vs absolute: per block (top: each encoding; bottom: rope - absolute) and pooled, seeds as "
                 "the unit")
    return fig
