"""Figure 2 across a sweep: the shuffle test's per-layer normalized logit change (test-token logits when
the demonstrations are shuffled), one curve per cell (e.g. RoPE vs absolute), mean over replicate seeds
with the 95% t interval over seeds. The paper's claim: upper layers change less.

    python analysis/figure2.py --sweep rope-vs-absolute-cpu

Needs a sweep run with `analyze = true` (reads shuffle/layer{b}/norm_change of each analysis run, b the block
counted from 0, drawn as layer b + 1 so that layers mean what they mean in Figure 3, where 0 is the embedding).
"""
from __future__ import annotations

import re
from collections import defaultdict

from sweepdata import fail, label, load_sweep, mean_ci, out_dir, parser, save, write_table

KEY = re.compile(r"shuffle/layer(\d+)/norm_change$")


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    out = out_dir(args)
    data: dict = defaultdict(list)  # (cell, layer) -> per-seed change
    for t in sw.trials:
        for k, v in (t.analysis or {}).items():
            m = KEY.match(k)
            if m:
                data[sw.cell(t), int(m.group(1)) + 1].append(v)  # block b's attention is layer b + 1, as in Figure 3
    if not data:
        fail(f"sweep {sw.name!r} has no shuffle-test layers: run it with analyze = true, on models without "
             "banded attention (model.window = 0: a windowed test token cannot see the demonstrations)")
    rows = []
    for (c, layer), v in sorted(data.items()):
        m, lo, hi, n = mean_ci(v)
        rows.append({**dict(zip(sw.varied, c)), "layer": layer, "norm_change": m, "ci_lo": lo, "ci_hi": hi,
                     "n_seeds": n})
    write_table(rows, out, "figure2_by_layer")

    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for c in sorted({c for c, _ in data}):
        layers = sorted(l for cc, l in data if cc == c)
        st = [mean_ci(data[c, l]) for l in layers]
        line, = ax.plot(layers, [s[0] for s in st], marker="o", label=label(sw, c))
        ax.fill_between(layers, [s[1] for s in st], [s[2] for s in st], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("layer (block b's attention = layer b + 1; 0 would be the embedding, as in Figure 3)")
    ax.set_ylabel("mean |delta logit| / mean |logit|")
    ax.set_title(f"{sw.name}: shuffle test per layer (mean over seeds, 95% CI)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    save(fig, out, "figure2")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
