"""Practice vs theory across a context-length sweep: a banded-attention model's excess error (TV to the
task oracle that sees the full history) at its receptive field R = n_layers (window - 1) + 1, beside
eps(R), the smallest error any predictor with that fixed memory can have (SCIENCE.md 4), per gamma; mean
over replicate seeds with 95% t intervals. The model can only sit above eps(R): the gap is its task
uncertainty and approximation error.

    python analysis/practice_vs_theory.py --sweep context-length-cpu

Reads memory/receptive_field, memory/model_tv, memory/eps (evaluate.memory_comparison) of each trial;
trials whose receptive field leaves no test-only position (memory/model_tv absent) are listed, not drawn.
"""
from __future__ import annotations

from collections import defaultdict

from sweepdata import fail, load_sweep, mean_ci, out_dir, parser, save, write_table


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    out = out_dir(args)
    model, eps, skipped = defaultdict(list), defaultdict(list), []
    for t in sw.trials:
        m = t.metrics
        if "memory/receptive_field" not in m:
            continue
        key = (t.params.get("hmm.gamma", "?"), int(m["memory/receptive_field"]))
        if "memory/model_tv" not in m:
            skipped.append(f"trial {t.number} (R = {key[1]}): no test position sees test tokens only")
            continue
        model[key].append(m["memory/model_tv"])
        eps[key].append(m["memory/eps"])
    if not model:
        fail(f"sweep {sw.name!r} has no windowed trial with memory/model_tv "
                         "(set model.window > 0 and a test segment longer than the receptive field)")
    rows = []
    for key in sorted(model, key=lambda k: (k[0], k[1])):
        mm, mlo, mhi, n = mean_ci(model[key])
        e, elo, ehi, _ = mean_ci(eps[key])
        rows.append({"gamma": key[0], "receptive_field": key[1], "model_tv": mm, "model_tv_lo": mlo,
                     "model_tv_hi": mhi, "eps": e, "model_minus_eps": mm - e, "n_seeds": n})
    write_table(rows, out, "practice_vs_theory")
    for s in skipped:
        print("left out:", s)

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for g in sorted({k[0] for k in model}):
        rs = [r for r in rows if r["gamma"] == g]
        x = [r["receptive_field"] for r in rs]
        line, = ax.plot(x, [r["model_tv"] for r in rs], marker="o", label=f"model, gamma = {g}")
        ax.fill_between(x, [r["model_tv_lo"] for r in rs], [r["model_tv_hi"] for r in rs], color=line.get_color(),
                        alpha=0.2)
        ax.plot(x, [r["eps"] for r in rs], ls="--", marker="s", ms=3, color=line.get_color(),
                label=f"eps(R), gamma = {g}")
    ax.set(yscale="log", xlabel="receptive field R = n_layers (window - 1) + 1 (tokens)",
           ylabel="TV to the full-history task oracle", title=f"{sw.name}: practice vs eps(R)")
    ax.legend(fontsize=8)
    save(fig, out, "practice_vs_theory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
