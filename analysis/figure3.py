"""Figures 3a/3b across a sweep: linear-probe accuracy per layer for the task (3a) and the k-back tokens
(3b), pooled over replicate seeds (mean, 95% t interval over seeds), beside each target's chance level.
Also the within-task state probe, so "state before task" can be read off the same axes.

    python analysis/figure3.py --sweep rope-vs-absolute-cpu

Needs a sweep run with `analyze = true` (reads probe/{target}/layer{l}/acc and /chance of each analysis run).
"""
from __future__ import annotations

import re
from collections import defaultdict

from sweepdata import fail, label, load_sweep, mean_ci, out_dir, parser, save, write_table

KEY = re.compile(r"probe/([a-z_0-9]+)/layer(\d+)/acc$")


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    out = out_dir(args)
    acc: dict = defaultdict(list)  # (cell, target, layer) -> per-seed acc
    chance: dict = defaultdict(list)  # (cell, target) -> chance levels (the task's depends on the cell's n_tasks)
    for t in sw.trials:
        a = t.analysis or {}
        for k, v in a.items():
            m = KEY.match(k)
            if m:
                acc[sw.cell(t), m.group(1), int(m.group(2))].append(v)
                ch = a.get(f"probe/{m.group(1)}/layer{m.group(2)}/chance")
                if ch is not None:
                    chance[sw.cell(t), m.group(1)].append(ch)
    if not acc:
        fail(f"sweep {sw.name!r} has no analysis runs (run it with analyze = true)")
    rows = []
    for (c, target, layer), v in sorted(acc.items()):
        m, lo, hi, n = mean_ci(v)
        rows.append({**dict(zip(sw.varied, c)), "target": target, "layer": layer, "acc": m, "ci_lo": lo,
                     "ci_hi": hi, "n_seeds": n})
    write_table(rows, out, "figure3_probes")

    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cells = sorted({c for c, _, _ in acc})
    targets = sorted({t for _, t, _ in acc})
    kbacks = sorted((t for t in targets if t.startswith("kback")), key=lambda t: int(t[5:]))
    panels = [("3a: task and state", [t for t in targets if not t.startswith("kback")]), ("3b: k-back tokens", kbacks)]
    fig, axes = plt.subplots(len(cells), 2, figsize=(12, 3.8 * len(cells)), squeeze=False, layout="constrained")
    for i, c in enumerate(cells):
        for ax, (title, ts) in zip(axes[i], panels):
            for t in ts:
                layers = sorted(l for cc, tt, l in acc if cc == c and tt == t)
                st = [mean_ci(acc[c, t, l]) for l in layers]
                line, = ax.plot(layers, [s[0] for s in st], marker="o", ms=3, label=t)
                ax.fill_between(layers, [s[1] for s in st], [s[2] for s in st], color=line.get_color(), alpha=0.15)
                if chance.get((c, t)):
                    ax.axhline(sum(chance[c, t]) / len(chance[c, t]), color=line.get_color(), lw=0.7, ls=":")
            ax.plot([], [], color="gray", ls=":", lw=0.7, label="chance (same colour)")
            ax.set(xlabel="layer (0 = embedding)", ylabel="probe accuracy", ylim=(0, 1),
                   title=f"{title} [{label(sw, c)}]")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{sw.name}: probes, mean over seeds with 95% CI")
    save(fig, out, "figure3")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
