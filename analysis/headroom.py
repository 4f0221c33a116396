"""The headroom map (issue 27.1, SCIENCE.md 9): room above the best counting predictor on unseen tasks, per family
and episode layout, from a kind = "headroom" sweep (sweeps/headroom-map.toml), before any training.

    python analysis/headroom.py --sweep headroom-map [--out DIR]

Per cell (the swept keys but the replicate seed): the room at k = k_max, CE(best counting) - CE(family Bayes at M)
nats/token, as the mean over the replicate seeds (data.seed: each draws its own unseen, fit and family tasks) of
each trial's paired mean over its unseen episodes. Its 95% CI combines the trials' own normal CIs over episodes
(independent episodes and tasks: se = sqrt(sum se_i^2) / n), beside the t interval over seeds where there are
3 or more; the seeds are drawn as dots. Also per cell: best counting's and family Bayes' CE, the family Bayes CE at
M/2 (how far from converged it is: family Bayes at finite M is an upper bound on the ideal learner's CE, so the
room is an underestimate, more so where M/2 -> M still moves), the room at k = 0, and the task oracle's CE.

Writes headroom_map.csv (one row per cell) and headroom_map.{png,pdf}: one panel per (family, layout), the room
against gamma with one line per S, a zero line; cells with room >= 0.2 nats/token (the inference-regime issue's bar)
are marked.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from sweepdata import fail, load_sweep, mean_ci, out_dir, parser, save, write_table

BAR = 0.2  # nats/token: the room the inference-regime record asks of its family


def _k_max(metrics: dict) -> int:
    ks = [int(k.rsplit("/k", 1)[1]) for k in metrics if k.startswith("headroom/room/k") and k[-1].isdigit()]
    return max(ks)


def cells(sw) -> list[dict]:
    by = defaultdict(list)
    for t in sw.trials:
        by[sw.cell(t)].append(t)
    rows = []
    for cell, trials in sorted(by.items(), key=lambda kv: [_num(v) for v in kv[0]]):
        km = _k_max(trials[0].metrics)
        room = [t.metrics["headroom/room"] for t in trials]
        se = [(t.metrics["headroom/room_hi"] - t.metrics["headroom/room_lo"]) / (2 * 1.96) for t in trials]
        m = float(np.mean(room))
        h = 1.96 * math.sqrt(sum(s * s for s in se)) / len(se)
        tm, tlo, thi, n = mean_ci(room)
        M = max(int(k.split("_M")[1].split("/")[0]) for t in trials for k in t.metrics
                if k.startswith("headroom/family_bayes_M")) if any(
            k.startswith("headroom/family_bayes_M") for k in trials[0].metrics) else None

        def avg(key, trials=trials):
            v = [t.metrics[key] for t in trials if key in t.metrics]
            return float(np.mean(v)) if v else float("nan")

        row = {**dict(zip(sw.varied, cell)), "k_max": km, "seeds": n, "room": m, "room_lo": m - h, "room_hi": m + h,
               "room_t_lo": tlo, "room_t_hi": thi, "room_k0": avg("headroom/room/k0"),
               "best_counting_ce": avg(f"headroom/best_counting/ce/k{km}"),
               "family_bayes_ce": avg(f"headroom/family_bayes/ce/k{km}"),
               "family_bayes_half_M_ce": avg(f"headroom/family_bayes_M{M}/ce/k{km}") if M else float("nan"),
               "task_oracle_ce": avg(f"headroom/task_oracle/ce/k{km}"),
               "bigram_ce": avg(f"headroom/incontext_bigram/ce/k{km}"),
               "em_ce": avg(f"headroom/incontext_hmm/ce/k{km}"),
               "per_seed": " ".join(f"{v:.3f}" for v in room), "meets_bar": bool(m - h >= BAR)}
        rows.append(row)
    return rows


def _num(v):
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def plot(sw, rows, out):
    import matplotlib.pyplot as plt

    keys = sw.varied
    x_key = "hmm.gamma" if "hmm.gamma" in keys else keys[0]
    line_key = "hmm.n_states" if "hmm.n_states" in keys and x_key != "hmm.n_states" else None
    panel_keys = [k for k in keys if k not in (x_key, line_key)]
    panels = sorted({tuple(r[k] for k in panel_keys) for r in rows}, key=lambda p: [_num(v) for v in p])
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False, sharey=True)
    for ax, p in zip(axes.flat, panels):
        sub = [r for r in rows if tuple(r[k] for k in panel_keys) == p]
        lines = sorted({r[line_key] for r in sub}, key=_num) if line_key else [None]
        for i, lv in enumerate(lines):
            pts = sorted((r for r in sub if line_key is None or r[line_key] == lv), key=lambda r: _num(r[x_key]))
            x = [float(r[x_key]) for r in pts]
            y = [r["room"] for r in pts]
            err = [[r["room"] - r["room_lo"] for r in pts], [r["room_hi"] - r["room"] for r in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, color=f"C{i}",
                        label=f"{line_key.split('.')[-1]} = {lv}" if line_key else None)
            for r in pts:
                for v in r["per_seed"].split():
                    ax.plot(float(r[x_key]), float(v), ".", color=f"C{i}", alpha=0.4, ms=3)
                if r["meets_bar"]:
                    ax.plot(float(r[x_key]), r["room"], "s", mfc="none", mec="k", ms=9)
        ax.axhline(0, color="gray", lw=0.8)
        ax.axhline(BAR, color="gray", lw=0.8, ls=":")
        ax.set_title(", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(panel_keys, p)), fontsize=9)
        ax.set_xlabel(x_key.split(".")[-1])
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("room above counting at k_max\n(nats / token)")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if line_key:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Headroom map ({sw.name}): CE(best counting) - CE(family Bayes), unseen tasks, 95% CI; "
                 f"squares: lower CI >= {BAR}; dotted: {BAR}", fontsize=10)
    fig.tight_layout()
    return save(fig, out, "headroom_map")


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "headroom":
        fail(f"sweep {args.sweep!r} is a {sw.kind} sweep, not a headroom sweep")
    out = out_dir(args)
    rows = cells(sw)
    write_table(rows, out, "headroom_map")
    plot(sw, rows, out)
    best = max(rows, key=lambda r: r["room_lo"])
    print(f"largest room (by its lower CI): {best['room']:.3f} [{best['room_lo']:.3f}, {best['room_hi']:.3f}] at "
          + ", ".join(f"{k}={best[k]}" for k in sw.varied))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
