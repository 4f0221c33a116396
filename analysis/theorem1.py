"""Theorem 1 across a theory sweep: the fitted decay rate of eps(L) against gamma, one series per rank d,
with its bootstrap 95% CI, the chain's mixing floor -log|lambda_2|, and the fitted exponent k of
rate ~ gamma^k (OLS on log-log, hmmscope.theory.fit_exponent, the estimator `hmmscope report` uses), per
rank and pooled. Theorem 1's bound decays like exp(-gamma^4 L): it is loose wherever k < 4 with the CI below 4.

    python analysis/theorem1.py --sweep theory-gamma

Settings whose rate has no fit (eps under 4 stderr too soon: rate nan) are drawn as crosses on the axis.
"""
from __future__ import annotations

import math
from collections import defaultdict

from sweepdata import fail, load_sweep, out_dir, parser, save, write_table


def main(argv=None) -> int:
    from hmmscope.theory import fit_exponent

    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "theory":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; Theorem 1 needs a theory sweep")
    out = out_dir(args)
    pts = [s for t in sw.trials for s in t.settings]
    if not pts:
        fail(f"sweep {sw.name!r} has no theory-setting runs")
    rows = [{"gamma": float(s["hmm.gamma"]), "rank": int(s["hmm.rank"]), "n_states": int(s["hmm.n_states"]),
             "rate": s.get("theory/rate", math.nan), "rate_lo": s.get("theory/rate_lo", math.nan),
             "rate_hi": s.get("theory/rate_hi", math.nan), "mixing_rate": s.get("theory/mixing_rate", math.nan),
             "gamma_eff": s.get("theory/gamma_eff", math.nan), "fit_points": s.get("theory/fit_points", math.nan),
             "run_id": s["run_id"]} for s in pts]
    rows.sort(key=lambda r: (r["rank"], r["gamma"]))
    write_table(rows, out, "theorem1_rates")
    by_rank = defaultdict(list)
    for r in rows:
        by_rank[r["rank"]].append(r)
    fits = []
    for scope, rs in [*((f"d={d}", v) for d, v in sorted(by_rank.items())), ("pooled", rows)]:
        f = fit_exponent([r["gamma"] for r in rs], [r["rate"] for r in rs], scope=scope)  # OLS, as the report
        fits.append({"scope": scope, "k": f.k, "k_lo": f.k_ci[0], "k_hi": f.k_ci[1], "n": f.n_used, "verdict_k<=4": f.verdict,
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
    ax.set(xscale="log", yscale="log", xlabel="gamma (observability of the HMM family)",
           ylabel="decay rate of eps(L) (per token)", title=f"{sw.name}: Theorem 1, rate ~ gamma^k")
    ax.legend(fontsize=7)
    save(fig, out, "theorem1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
