"""Figure 1 across a sweep: ICL accuracy on the test segment vs the number of demonstrations k, and vs
the position in the test segment, for each cell of the sweep (mean over replicate seeds, 95% t interval
over seeds), beside the task oracle (the ceiling: it knows the task), the mixture oracle (the Bayes
predictor over the training tasks) and the references that know no training task (SCIENCE.md 8: the
family-Bayes reference over tasks of the family (older runs: the mixture of other tasks), the in-context unigram and
bigram counts, the best fitted counting baseline, the EM-fitted HMM), on seen and on unseen
tasks (one row of panels each), with chance = 1 / n_tokens.

    python analysis/figure1.py --sweep rope-vs-absolute-cpu

Reads each trial's evaluation/figure1_by_k.csv and figure1_by_position.csv artifacts (runs recorded before
unseen tasks existed have no `tasks` column: their rows are seen tasks, with the model and the two oracles).
"""
from __future__ import annotations

from collections import defaultdict

from sweepdata import fail, label, load_sweep, mean_ci, out_dir, parser, save, write_table

# predictor, line style, marker; the model carries the cell's CI band, references are thin lines
PREDICTORS = (("model", "-", "o"), ("task_oracle", ":", None), ("mixture_oracle", "--", None),
              ("family_bayes", "-", None), ("other_mixture_oracle", (0, (1, 3)), None),
              ("incontext_unigram", (0, (6, 2, 1, 2)), None), ("incontext_bigram", "-.", None),
              ("best_counting", (0, (3, 1, 1, 1)), "s"), ("incontext_hmm", (0, (3, 1, 1, 1, 1, 1)), "x"))
TASKS = ("seen", "unseen")


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "train":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; Figure 1 needs training trials")
    out = out_dir(args)
    by_k: dict = defaultdict(list)  # (tasks, cell, predictor, k) -> per-seed acc
    by_pos: dict = defaultdict(list)
    n_tokens = None
    for t in sw.trials:
        n_tokens = int(t.params.get("hmm.n_tokens", 0)) or n_tokens
        c = sw.cell(t)
        for r in sw.artifact_csv(t.run_id, "evaluation/figure1_by_k.csv"):
            by_k[r.get("tasks") or "seen", c, r["predictor"], int(r["k"])].append(float(r["acc"]))
        for r in sw.artifact_csv(t.run_id, "evaluation/figure1_by_position.csv"):
            by_pos[r.get("tasks") or "seen", c, r["predictor"], int(r["position"])].append(float(r["acc"]))
    if not by_k:
        fail(f"no trial of {sw.name!r} has evaluation/figure1_by_k.csv")
    cells = sorted({c for _, c, _, _ in by_k})
    tasks = [t for t in TASKS if any(tt == t for tt, _, _, _ in by_k)]
    rows = []
    for (tt, c, pred, k), v in sorted(by_k.items()):
        m, lo, hi, n = mean_ci(v)
        rows.append({"tasks": tt, **dict(zip(sw.varied, c)), "predictor": pred, "k": k, "acc": m, "acc_lo": lo,
                     "acc_hi": hi, "n_seeds": n})
    write_table(rows, out, "figure1_by_k")

    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(tasks), 2, figsize=(13, 4.8 * len(tasks)), layout="constrained", squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = set()
    for row, tt in zip(axes, tasks):
        for ax, data, xname in ((row[0], by_k, "demonstrations k"), (row[1], by_pos, "position in the test segment")):
            for i, c in enumerate(cells):
                col = colors[i % len(colors)]
                for pred, ls, mk in PREDICTORS:
                    xs = sorted(x for t2, cc, p, x in data if t2 == tt and cc == c and p == pred)
                    if not xs:
                        continue
                    drawn.add(pred)
                    stats = [mean_ci(data[tt, c, pred, x]) for x in xs]
                    ax.plot(xs, [s[0] for s in stats], ls=ls, marker=mk, color=col, ms=4,
                            lw=1.8 if pred == "model" else 1.0, label=label(sw, c) if pred == "model" else None)
                    if pred == "model":
                        ax.fill_between(xs, [s[1] for s in stats], [s[2] for s in stats], color=col, alpha=0.2)
            if n_tokens:
                ax.axhline(1 / n_tokens, color="gray", lw=0.8, label=f"chance 1/{n_tokens}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel(xname)
            ax.set_ylabel("next-token accuracy")
            ax.set_ylim(0, 1)
        ceiling = "task and mixture oracles = ceiling" if tt == "seen" else "task oracle = ceiling"
        row[0].set_title(f"{tt} tasks: accuracy vs demonstrations k ({ceiling})")
        row[1].set_title(f"{tt} tasks: accuracy along the test segment (all demonstrations)")
        row[1].legend(fontsize=7, loc="lower right", title="cell (model, 95% CI over seeds)", title_fontsize=7)
        row[0].legend(handles=[Line2D([], [], color="k", ls=ls, marker=mk, label=p.replace("_", " "))
                               for p, ls, mk in PREDICTORS if p in drawn], fontsize=7, loc="upper left",
                      title="predictor (line style)", title_fontsize=7)
    fig.suptitle(f"{sw.name}: Figure 1 on seen and unseen tasks; colour = cell, line style = predictor")
    save(fig, out, "figure1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
