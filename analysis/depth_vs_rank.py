"""Depth vs rank (the paper's open question): the sweep's objective (excess CE of the model over the
mixture oracle on the test segment, nats per token) against the rank d, one curve per depth n_layers,
mean over replicate seeds with 95% t intervals; and, per rank, the shallowest depth whose excess CE is
not significantly above the best depth's (Welch t test, one-sided, alpha 0.05). With two seeds per cell
that test has little power: "underpowered" is printed where a cell has fewer than 3 seeds.

    python analysis/depth_vs_rank.py --sweep depth-vs-rank-cpu
"""
from __future__ import annotations

import math
from collections import defaultdict

from sweepdata import fail, load_sweep, mean_ci, out_dir, parser, save, write_table


def main(argv=None) -> int:
    from scipy import stats

    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    out = out_dir(args)
    key = sw.objective
    vals = defaultdict(list)
    for t in sw.trials:
        if key in t.metrics and "model.n_layers" in t.params and "hmm.rank" in t.params:
            vals[int(t.params["hmm.rank"]), int(t.params["model.n_layers"])].append(t.metrics[key])
    if not vals:
        fail(f"sweep {sw.name!r} has no trial with {key}, model.n_layers and hmm.rank")
    rows = []
    for (d, n), v in sorted(vals.items()):
        m, lo, hi, k = mean_ci(v)
        rows.append({"rank": d, "n_layers": n, key: m, "ci_lo": lo, "ci_hi": hi, "n_seeds": k})
    write_table(rows, out, "depth_vs_rank")
    need = []
    for d in sorted({d for d, _ in vals}):
        depths = sorted(n for dd, n in vals if dd == d)
        best = min(depths, key=lambda n: sum(vals[d, n]) / len(vals[d, n]))
        enough = min(len(vals[d, n]) for n in depths) >= 3
        for n in depths:
            a, b = vals[d, n], vals[d, best]
            if n == best:
                p = 1.0
            elif len(a) < 2 or len(b) < 2:
                p = math.nan
            else:
                p = float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
            if n == best or (math.isfinite(p) and p >= 0.05):
                need.append({"rank": d, "layers_needed": n, "best_depth": best, "p_vs_best": p,
                             "power": "ok" if enough else "underpowered (< 3 seeds per cell)"})
                break
    write_table(need, out, "depth_vs_rank_layers_needed")

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for n in sorted({n for _, n in vals}):
        rs = [r for r in rows if r["n_layers"] == n]
        x = [r["rank"] for r in rs]
        line, = ax.plot(x, [r[key] for r in rs], marker="o", label=f"{n} layer{'s' if n > 1 else ''}")
        ax.fill_between(x, [r["ci_lo"] for r in rs], [r["ci_hi"] for r in rs], color=line.get_color(), alpha=0.2)
    ax.axhline(0, color="gray", lw=0.8, label="mixture oracle (0)")
    ax.set(xscale="log", xlabel="rank d", ylabel=f"{key} (nats/token)", title=f"{sw.name}: depth vs rank")
    ax.set_xticks(sorted({d for d, _ in vals}), [str(d) for d in sorted({d for d, _ in vals})])
    ax.legend(fontsize=8)
    save(fig, out, "depth_vs_rank")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
