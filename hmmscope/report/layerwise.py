"""Layerwise claims pooled over analyzed runs (Figures 2, 3a, 3b) and the depth-vs-rank regression
(statistical choices: package docstring). Each pooled claim and the depth interaction say whether the
design is underpowered (common.underpowered): one run is no replicate, and an inconclusive CI wider than
the effect says more runs are needed rather than that there is no effect."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..stats import NO_POWER, VERDICTS, Claim, claim, parse_rule, rule
from .common import NAN, Section, _ci, _f, _p, underpowered
from .posenc import _ols


def _pooled_rule(r: str) -> str:
    """A run's rule for the pooled claim: the same test, its requirements renamed to the pooled claims."""
    op, t, req = parse_rule(r)
    return NO_POWER if op == NO_POWER else rule(op, t, [f"pooled: {x}" for x in req])


def _layerwise_section(df) -> tuple[Section | None, list[Claim]]:
    cols = sorted(c for c in df.columns if c.startswith("metric:claim/") and c.endswith("/value")) if not df.empty else []
    if not cols:
        return None, []
    from scipy import stats as st

    sec = Section("Layerwise claims (Figures 2, 3a, 3b), pooled over analyzed runs")
    sec.blocks.append(("p", "Pooled estimate = mean of the per-run values of the statistic that decides each claim, "
                            "with a t-based 95% CI across runs (between-run variance kept); one run: its own CI. "
                            "IVW = inverse-variance weighted mean with SE = (ci_hi - ci_lo) / 3.92, shown for "
                            "comparison. Pooled verdict: the claim's own decision rule (logged with each run, "
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
            m, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(n))
            q = st.t.ppf(0.975, n - 1)
            plo, phi = m - q * se, m + q * se
        else:
            m, plo, phi = float(v[0]), float(lo[0]), float(hi[0])
        se_i = (hi - lo) / 3.92
        ok = np.isfinite(se_i) & (se_i > 0)
        if ok.any():
            w = 1 / se_i[ok] ** 2
            ivw, ivw_se = float((w * v[ok]).sum() / w.sum()), float(1 / math.sqrt(w.sum()))
        else:
            ivw, ivw_se = NAN, NAN
        pooled.append((name, n, m, plo, phi, ivw, ivw_se, counts, rules))
        for i in range(n):
            per_run.append([name, str(sub["trial"].iloc[i]), _f(v[i]), _ci(lo[i], hi[i]), verd[i] or "-"])
    claims: dict[str, Claim] = {}
    pending = list(pooled)
    while pending:  # claims whose requirements are decided first
        done = {k: c.verdict for k, c in claims.items()}
        ready = [p for p in pending if len(p[8]) != 1 or all(r in done for r in parse_rule(
            _pooled_rule(next(iter(p[8]))))[2])] or pending
        for p in ready:
            name, n, m, plo, phi, ivw, ivw_se, counts, rules = p
            stat = f"mean over {n} runs, t-CI" if n >= 2 else "single run's CI"
            tally = "; ".join(f"{counts[k]} {k}" for k in VERDICTS if counts[k]) or "no per-run verdicts"
            if len(rules) == 1:
                c = claim(f"pooled: {name}", stat, m, plo, phi, _pooled_rule(next(iter(rules))),
                          f"per-run verdicts: {tally}", done)
            else:
                why = "no decision rule logged (older hmmscope)" if not rules else f"runs logged different rules {sorted(rules)}"
                c = Claim(f"pooled: {name}", stat, m, plo, phi, "inconclusive", f"{why}: not judged; per-run verdicts: {tally}")
            claims[f"pooled: {name}"] = c
            done[f"pooled: {name}"] = c.verdict
        pending = [p for p in pending if p not in ready]
    for name, n, m, plo, phi, ivw, ivw_se, counts, _ in pooled:
        c = claims[f"pooled: {name}"]
        try:
            op, t, _ = parse_rule(c.rule) if c.rule else ("", 0.0, ())
        except ValueError:
            t = 0.0
        power = underpowered(m, plo, phi, c.verdict, threshold=0.0 if not math.isfinite(t) else t, replicates=n)
        if power:
            claims[f"pooled: {name}"] = c = dataclasses.replace(c, reason=f"{c.reason}; {power}")
        rows.append([name, str(n), _f(m), _ci(plo, phi), f"{_f(ivw)} ± {_f(1.96 * ivw_se)}",
                     "/".join(str(counts[k]) for k in VERDICTS), c.rule or "-", power or "ok", c.verdict])
    sec.blocks += [("table", ["claim", "runs", "pooled mean", "95% CI", "IVW ± 1.96 SE",
                              "per-run supported/not/inconclusive/no power", "rule", "power", "pooled verdict"], rows),
                   ("h", 3, "Per-run values"),
                   ("table", ["claim", "trial", "value", "95% CI", "verdict"], per_run)]
    return sec, [claims[f"pooled: {p[0]}"] for p in pooled]


def _depth_rank_section(df) -> tuple[Section | None, list[Claim]]:
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
        rows.append([_f(nl), _f(rk), str(len(g)), _f(g["y"].mean()),
                     _f(g["y"].std(ddof=1) if len(g) > 1 else NAN)])
    reps = int(d.groupby(["param:model.n_layers", "param:hmm.rank"]).size().min())
    sec = Section("Depth vs rank", [("p", f"{key[len('metric:'):]} by (n_layers, rank): cell means over trials."),
                                    ("table", ["n_layers", "rank", "runs", "mean excess CE", "sd"], rows)])
    claims = []
    if len(d) - 4 < 1:
        sec.blocks.append(("p", f"{len(d)} trials: too few for excess_ce ~ n_layers * log(rank) "
                                "(underpowered: 4 coefficients need at least 5 trials)."))
        return sec, claims
    res, label = _ols("y ~ n_layers * log_rank", d)
    ci = res.conf_int(0.05)
    crow = []
    for term in res.params.index:
        lo, hi = float(ci.loc[term][0]), float(ci.loc[term][1])
        crow.append([term, _f(float(res.params[term])), _ci(lo, hi), _p(float(res.pvalues[term]))])
    sec.blocks += [("p", f"{label}: excess_ce ~ n_layers + log(rank) + n_layers:log(rank), {len(d)} trials, "
                         f"R^2 = {_f(float(res.rsquared), 3)}. A negative interaction means extra layers help more "
                         "at higher rank."),
                   ("table", ["term", "coef", "95% CI", "p"], crow)]
    t = "n_layers:log_rank"
    lo, hi = (float(x) for x in ci.loc[t])
    c = claim("depth helps more at higher rank", f"interaction n_layers:log(rank) ({label})", float(res.params[t]),
              lo, hi, rule("<", 0), "negative interaction = deeper models gain more as rank grows")
    power = underpowered(c.value, lo, hi, c.verdict, replicates=reps)
    if power:
        c = dataclasses.replace(c, reason=f"{c.reason}; {power}")
        sec.blocks.append(("p", f"Interaction n_layers:log(rank): {power}."))
    claims.append(c)
    return sec, claims


