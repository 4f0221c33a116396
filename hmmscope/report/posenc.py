"""Positional encoding: the RoPE - absolute effect per metric and per layerwise claim (statistical choices:
package docstring). Every candidate blocking factor appears in the tables with its fate: in the model, or
left out with the reason (not estimable beside the others, or a different value in every trial), so a
factor never drops out of the summary silently. Each row says how many replicates the thinnest cell has
and whether the design is underpowered (common.underpowered)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from ..stats import Claim, claim, rule
from .common import METRIC_DIRECTION, NAN, Section, _ci, _f, _p, _side_verdict, claim_side, underpowered


def _other_factors(d, exclude: set[str]) -> tuple[list[str], dict[str, str]]:
    """(swept factors to block on, {factor: why it cannot be}); seeds are replicates, not factors."""
    out, unusable = [], {}
    for c in d.columns:
        if not c.startswith("param:") or c in exclude or c.endswith("seed") or c.split(".")[-1].endswith("seed"):
            continue
        vals = d[c].astype(str)
        if 2 <= vals.nunique() < len(d):
            out.append(c)
        elif vals.nunique() == len(d) >= 2:
            unusable[c] = "a different value in every trial: not estimable"
    return out, unusable


def _ols(formula: str, data):
    """OLS with HC3 errors, plain errors when HC3 is not finite; returns (result, cov label)."""
    import statsmodels.formula.api as smf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = smf.ols(formula, data).fit(cov_type="HC3", use_t=True)
        if not np.all(np.isfinite(np.asarray(res.bse))):
            return smf.ols(formula, data).fit(), "plain OLS (HC3 not finite: a leverage-1 point)"
    return res, "OLS, HC3"


def _effect(d, metric: str, factors: list[str], seed_col: str | None):
    """({"ols"|"mixed": (model label, effect, lo, hi, p, std effect)}, factors used, notes, replicates in the
    thinnest (pos_enc x factors) cell) for rope - absolute on `metric`; a string saying why when not estimated."""
    import statsmodels.formula.api as smf

    data = d[[metric, *factors] + ([seed_col] if seed_col else [])].copy()
    data = data[data[metric].notna()]
    data["y"] = data[metric].astype(float)
    data["rope"] = (d.loc[data.index, "param:model.pos_enc"] == "rope").astype(float)
    names = {f: f"f{i}" for i, f in enumerate(factors)}
    for f, n in names.items():
        data[n] = data[f].astype(str)
    used, note = [], []
    for f in factors:  # add factors while the fit stays estimable
        trial = [*used, names[f]]
        X = _design(data, trial)
        if np.linalg.matrix_rank(X) == X.shape[1] and len(data) - X.shape[1] >= 2:
            used = trial
        else:
            note.append(f"{f[6:]} left out (not estimable)")
    if data["rope"].nunique() < 2:
        return "only one pos_enc level has this metric"
    if len(data) - _design(data, used).shape[1] < 1:
        return "too few trials for the model"
    if np.ptp(data["y"].to_numpy()) == 0:
        return "constant across trials"
    cells = data.groupby(["rope", *used]).size() if used else data.groupby("rope").size()
    reps = int(cells.min())
    formula = "y ~ rope" + "".join(f" + C({n})" for n in used)
    ols, label = _ols(formula, data)
    b, (lo, hi) = float(ols.params["rope"]), (float(v) for v in np.asarray(ols.conf_int(0.05).loc["rope"]))
    sd = math.sqrt(ols.mse_resid) if ols.df_resid > 0 else NAN
    out = {"ols": (label, b, lo, hi, float(ols.pvalues["rope"]), b / sd if sd > 0 else NAN)}
    if seed_col:
        nseed = data.groupby(["rope", *used])[seed_col].nunique() if used else data.groupby("rope")[seed_col].nunique()
        if cells.min() >= 2 and nseed.min() >= 2:
            data["seed"] = data[seed_col].astype(str)
            try:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    mm = smf.mixedlm(formula, data, groups=data["seed"]).fit(reml=True)
                conv = [str(x.message) for x in w if "converge" in str(x.message).lower()]
                if not mm.converged or conv or not math.isfinite(float(mm.bse_fe["rope"])):
                    raise RuntimeError("did not converge" + (f" ({conv[0][:80]})" if conv else ""))
                if float(mm.scale) <= 1e-6 * float(data["y"].var()):
                    raise RuntimeError("singular fit: no residual variance within seeds")
                mb = float(mm.fe_params["rope"])
                mlo, mhi = (float(v) for v in np.asarray(mm.conf_int(0.05).loc["rope"]))
                tot = math.sqrt(float(mm.scale) + float(np.asarray(mm.cov_re).ravel()[0]))
                out["mixed"] = ("mixed model, random intercept per seed", mb, mlo, mhi, float(mm.pvalues["rope"]),
                                mb / tot if tot > 0 else NAN)
            except Exception as e:  # singular fits, non-convergence
                note.append(f"mixed model failed ({type(e).__name__}: {str(e)[:100]}); headline is OLS")
        else:
            note.append("fewer than 2 seeds in some cell: OLS only")
    return out, [f for f in factors if names[f] in used], note, reps


def _design(data, cols):
    import patsy

    return np.asarray(patsy.dmatrix("rope" + "".join(f" + C({c})" for c in cols), data))


def _posenc_section(df) -> tuple[Section | None, list[Claim]]:
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
    factors, unusable = _other_factors(d, {"param:model.pos_enc"})
    metrics = [m for m in METRIC_DIRECTION if f"metric:{m}" in d.columns]
    claim_cols = sorted(c for c in d.columns if c.startswith("metric:claim/") and c.endswith("/value"))
    sec.blocks.append(("p", f"Effect = RoPE - absolute; {len(d)} trials; seeds as replicates "
                            f"({seed_col[6:] if seed_col else 'no varying seed'}); candidate blocking factors: "
                            f"{', '.join(f[6:] for f in [*factors, *unusable]) or 'none'} (each added while the "
                            "model stays estimable; the table says which entered). Claim tested: "
                            "'RoPE improves <metric>'. 'underpowered' marks a row whose design cannot answer: "
                            "fewer than 2 replicates in some cell, or an inconclusive CI wider than the effect."))
    rows, fate = [], {}
    for m in [f"metric:{m}" for m in metrics] + claim_cols:
        name = m[len("metric:"):]
        if m in claim_cols:
            cname = name[len("claim/"):-len("/value")]
            vals = [(v, vd) for v, vd in zip(d[m], d.get(f"verdict:{cname}", [""] * len(d))) if v == v]
            side, label = claim_side(cname, vals), f"claim {cname}"
        else:
            side, label = METRIC_DIRECTION[name], name
        got = _effect(d, m, factors, seed_col)
        left = [f"{f[6:]} ({why})" for f, why in unusable.items()]
        if isinstance(got, str):
            rows.append([label, "not estimated", "-", "-", "-", "-", "-", ", ".join(left) or "-", "-", "-",
                         f"not estimated: {got}"])
            continue
        fits, used, note, reps = got
        left = [f"{f[6:]} (not estimable beside the others)" for f in factors if f not in used] + left
        for f in factors:
            fate.setdefault(f, set()).add("in the model" if f in used else "left out: not estimable")
        head = fits.get("mixed", fits["ols"])
        for key in ("ols", "mixed"):
            if key not in fits:
                continue
            lab, b, lo, hi, p, es = fits[key]
            v = _side_verdict(lo, hi, side)
            word = ("RoPE better" if v == "supported" else "RoPE worse" if v == "not supported"
                    else "no detectable difference") if side else ("differs" if v == "supported" else "no detectable difference")
            power = underpowered(b, lo, hi, v, replicates=reps)
            rows.append([label, lab, _f(b), _ci(lo, hi), _p(p), _f(es, 3), ", ".join(f[6:] for f in used) or "none",
                         ", ".join(left) or "none", str(reps), power or "ok", v + (f" ({word})" if word else "")])
        lab, b, lo, hi, p, es = head
        better = {1: "higher", -1: "lower", 0: "different"}[side]
        why = [f"p = {_p(p)}, standardized effect {_f(es, 3)}", *note]
        if side:  # the verdict is stats.decide's on the CI beside it
            c = claim(f"RoPE improves {label}", f"rope - absolute ({lab}); better = {better}", b, lo, hi,
                      rule(">" if side > 0 else "<", 0), "")
        else:  # an analysis claim whose side is unknown: two-sided, no rule
            c = Claim(f"RoPE improves {label}", f"rope - absolute ({lab}); better = {better}", b, lo, hi,
                      _side_verdict(lo, hi, 0), "")
        power = underpowered(b, lo, hi, c.verdict, replicates=reps)
        claims.append(dataclasses.replace(c, reason="; ".join([*why, *([power] if power else [])])))
    sec.blocks.append(("table", ["metric", "model", "effect (rope - abs)", "95% CI", "p", "effect / resid sd",
                                 "blocking factors in the model", "left out (why)", "replicates (thinnest cell)",
                                 "power", "verdict (RoPE improves)"], rows))
    frows = [[f[6:], str(d[f].astype(str).nunique()), " / ".join(sorted(fate.get(f, {"not reached"})))]
             for f in factors] + [[f[6:], str(d[f].astype(str).nunique()), f"left out: {why}"]
                                  for f, why in unusable.items()]
    if frows:
        sec.blocks += [("h", 3, "Blocking factors"), ("table", ["factor", "levels", "fate"], frows)]
    return sec, claims
