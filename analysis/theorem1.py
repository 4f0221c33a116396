"""Theorem 1 across a theory sweep: the fitted decay rate of eps(L) against gamma, one series per rank d,
with its 95% CI (t over the setting's HMM draws; one draw: its bootstrap CI), each draw's rate as a faint
dot (the theory/draw/* metric histories), the chain's mixing floor -log|lambda_2|, and the fitted exponent
k of rate ~ gamma^k (hmmscope.theory.theorem1.exponent_fits, the estimator `hmmscope report` uses: per-draw slopes
with one intercept per (S, d, rho) group, t over draws), per rank and pooled. Theorem 1's bound decays like
exp(-gamma^4 L): it is loose wherever k < 4 with the CI below 4.

    python analysis/theorem1.py --sweep theory-gamma

Settings whose rate has no fit (eps under 4 stderr too soon: rate nan) are drawn as crosses on the axis.
"""
from __future__ import annotations

import math
from collections import defaultdict

from sweepdata import fail, load_sweep, out_dir, parser, save, write_table


def main(argv=None) -> int:
    from hmmscope import tracking
    from hmmscope.theory.fit import exponent_fits

    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "theory":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; Theorem 1 needs a theory sweep")
    out = out_dir(args)
    pts = [s for t in sw.trials for s in t.settings]
    if not pts:
        fail(f"sweep {sw.name!r} has no theory-setting runs")
    client = tracking.client(sw.uri)
    rows, points, draw_rows = [], [], []
    for s in pts:
        r = {"gamma": float(s["hmm.gamma"]), "rank": int(s["hmm.rank"]), "n_states": int(s["hmm.n_states"]),
             "rate": s.get("theory/rate", math.nan), "rate_lo": s.get("theory/rate_lo", math.nan),
             "rate_hi": s.get("theory/rate_hi", math.nan), "rate_df": s.get("theory/rate_df", math.nan),
             "rate_mc_se": s.get("theory/rate_mc_se", math.nan),
             "rate_between_sd": s.get("theory/rate_between_sd", math.nan), "draws": s.get("theory/draws", 1),
             "mixing_rate": s.get("theory/mixing_rate", math.nan), "gamma_eff": s.get("theory/gamma_eff", math.nan),
             "fit_points": s.get("theory/fit_points", math.nan), "run_id": s["run_id"]}
        rows.append(r)
        group = f"S={r['n_states']} d={r['rank']} rho={s.get('hmm.rho', '')}"
        hist = {k: {m.step: m.value for m in client.get_metric_history(s["run_id"], f"theory/draw/{k}")}
                for k in ("rate", "rate_lo", "rate_hi", "gamma_eff", "mixing_rate", "seed")} \
            if r["draws"] > 1 else {}
        steps = sorted(set().union(*(set(h) for h in hist.values()))) if hist else []
        for j in steps:
            d = {k: hist[k].get(j, math.nan) for k in hist}
            draw_rows.append({"gamma": r["gamma"], "rank": r["rank"], "draw": j, **d, "run_id": s["run_id"]})
            points.append({**d, "gamma": r["gamma"], "draw": d["seed"], "group": group, "rank": r["rank"], "j": j})
        if not steps:  # one draw: the setting itself
            points.append({**{k: r[k] for k in ("rate", "rate_lo", "rate_hi", "gamma_eff", "mixing_rate")},
                           "gamma": r["gamma"], "draw": s.get("hmm.seed", 0), "group": group, "rank": r["rank"], "j": 2})
    rows.sort(key=lambda r: (r["rank"], r["gamma"]))
    write_table(rows, out, "theorem1_rates")
    if draw_rows:
        write_table(sorted(draw_rows, key=lambda r: (r["rank"], r["gamma"], r["draw"])), out, "theorem1_draws")
    by_rank = defaultdict(list)
    for r in rows:
        by_rank[r["rank"]].append(r)
    fits = []
    for scope, ps in [*((f"d={d}", [p for p in points if p["rank"] == d]) for d in sorted(by_rank)),
                      ("pooled", points)]:
        f = exponent_fits(ps, scope)[0]  # rate on gamma, as the report
        fits.append({"scope": scope, "k": f.k, "k_lo": f.k_ci[0], "k_hi": f.k_ci[1], "df": f.df, "k_mc_se": f.mc_se,
                     "k_between_sd": f.between_sd, "draws": f.n_draws, "n": f.n_used, "verdict_k<=4": f.verdict,
                     "reason": f.reason, "intercept": f.intercept, "_fit": f})
        print(f.summary)
    write_table([{k: v for k, v in f.items() if k != "_fit"} for f in fits], out, "theorem1_exponents")

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for d, rs in sorted(by_rank.items()):
        ok = [r for r in rs if math.isfinite(r["rate"]) and r["rate"] > 0]
        bad = [r for r in rs if r not in ok]
        line = ax.errorbar([r["gamma"] for r in ok], [r["rate"] for r in ok],
                           yerr=[[r["rate"] - r["rate_lo"] for r in ok], [r["rate_hi"] - r["rate"] for r in ok]],
                           fmt="o", capsize=3, label=f"d = {d}")
        col = line[0].get_color()
        dots = [(p["gamma"] * math.exp(0.03 * (p["j"] - 2)), p["rate"]) for p in points  # draws spread in x
                if p["rank"] == d and math.isfinite(p["rate"]) and p["rate"] > 0]
        if draw_rows and dots:
            ax.plot(*zip(*dots), ".", color=col, alpha=0.4, ms=4)
        f = next(x["_fit"] for x in fits if x["scope"] == f"d={d}")
        if math.isfinite(f.k):
            g = sorted(r["gamma"] for r in ok)
            ax.plot(g, [math.exp(f.intercept) * x ** f.k for x in g], color=col, lw=1,
                    label=f"fit d = {d}: k = {f.k:.2f} [{f.k_ci[0]:.2f}, {f.k_ci[1]:.2f}]")
        mix = [r["mixing_rate"] for r in rs if math.isfinite(r["mixing_rate"])]
        if mix:
            ax.axhline(min(mix), color=col, lw=0.7, ls="-.")
        if bad:
            ax.plot([r["gamma"] for r in bad], [ax.get_ylim()[0]] * len(bad) if ok else [1e-3] * len(bad), "x",
                    color=col, ms=8, label=f"d = {d}: no rate fit")
    ax.plot([], [], color="gray", lw=0.7, ls="-.", label="mixing floor -log|lambda_2| (same colour)")
    if draw_rows:
        ax.plot([], [], ".", color="gray", alpha=0.4, label="one HMM draw (big marker: mean over draws, 95% CI)")
    ax.set(xscale="log", yscale="log", xlabel="gamma (observability of the HMM family)",
           ylabel="decay rate of eps(L) (per token)", title=f"{sw.name}: Theorem 1, rate ~ gamma^k")
    ax.legend(fontsize=7)
    save(fig, out, "theorem1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
