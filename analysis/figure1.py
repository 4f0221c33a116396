"""Figure 1 across a sweep: ICL accuracy on the test segment vs the number of demonstrations k, and vs
the position in the test segment, for each cell of the sweep (mean over replicate seeds, 95% t interval
over seeds), beside the task oracle (the ceiling: it knows the task) and the mixture oracle (the Bayes
predictor that does not), with chance = 1 / n_tokens.

    python analysis/figure1.py --sweep rope-vs-absolute-cpu

Reads each trial's evaluation/figure1_by_k.csv and figure1_by_position.csv artifacts.
"""
from __future__ import annotations

from collections import defaultdict

from sweepdata import fail, label, load_sweep, mean_ci, out_dir, parser, save, write_table

PREDICTORS = (("model", "-", "o"), ("task_oracle", ":", None), ("mixture_oracle", "--", None))


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "train":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; Figure 1 needs training trials")
    out = out_dir(args)
    by_k: dict = defaultdict(list)  # (cell, predictor, k) -> per-seed acc
    by_pos: dict = defaultdict(list)
    n_tokens = None
    for t in sw.trials:
        n_tokens = int(t.params.get("hmm.n_tokens", 0)) or n_tokens
        c = sw.cell(t)
        for r in sw.artifact_csv(t.run_id, "evaluation/figure1_by_k.csv"):
            by_k[c, r["predictor"], int(r["k"])].append(float(r["acc"]))
        for r in sw.artifact_csv(t.run_id, "evaluation/figure1_by_position.csv"):
            by_pos[c, r["predictor"], int(r["position"])].append(float(r["acc"]))
    if not by_k:
        fail(f"no trial of {sw.name!r} has evaluation/figure1_by_k.csv")
    cells = sorted({c for c, _, _ in by_k})
    rows = []
    for (c, pred, k), v in sorted(by_k.items()):
        m, lo, hi, n = mean_ci(v)
        rows.append({**dict(zip(sw.varied, c)), "predictor": pred, "k": k, "acc": m, "acc_lo": lo, "acc_hi": hi,
                     "n_seeds": n})
    write_table(rows, out, "figure1_by_k")

    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, data, xname in ((axes[0], by_k, "demonstrations k"), (axes[1], by_pos, "position in the test segment")):
        for i, c in enumerate(cells):
            col = colors[i % len(colors)]
            for pred, ls, mk in PREDICTORS:
                xs = sorted(x for cc, p, x in data if cc == c and p == pred)
                if not xs:
                    continue
                stats = [mean_ci(data[c, pred, x]) for x in xs]
                ys = [s[0] for s in stats]
                ax.plot(xs, ys, ls=ls, marker=mk, color=col, ms=4,
                        label=label(sw, c) if pred == "model" else None)
                if pred == "model":
                    ax.fill_between(xs, [s[1] for s in stats], [s[2] for s in stats], color=col, alpha=0.2)
        if n_tokens:
            ax.axhline(1 / n_tokens, color="gray", lw=0.8, label=f"chance 1/{n_tokens}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xname)
        ax.set_ylabel("next-token accuracy")
        ax.set_ylim(0, 1)
    fig.suptitle(f"{sw.name}: Figure 1, model (solid, 95% CI over seeds), task oracle (dotted), mixture oracle (dashed)")
    axes[0].set_title("accuracy vs demonstrations k")
    axes[1].set_title("accuracy along the test segment (all demonstrations)")
    axes[1].legend(fontsize=7, loc="lower right")
    save(fig, out, "figure1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
