"""Task diversity (issue 18.5, SCIENCE.md 8): where does a model stop retrieving memorized tasks and start
inferring them in context? Seen-task and unseen-task excess CE over the task oracle (test segment, k = k_max,
nats per token) against hmm.n_tasks, mean over replicate seeds with 95% t intervals, beside the counting
baselines (in-context unigram / bigram) and the mixture oracle over the training tasks; and the retrieval gap
(unseen minus seen excess CE) against n_tasks with the estimated regime boundary.

    python analysis/task_diversity.py --sweep task-diversity-cpu [--threshold 0.05]

Regime boundary. n* = the n_tasks at which the seed-mean retrieval gap first falls below the threshold
(default 0.05 nats/token), interpolated linearly in log2(n_tasks) between the last grid value above it and the
first one below. Its 95% CI is a percentile bootstrap over seeds (each cell's seeds resampled with replacement,
2000 resamples, seeded): a resample whose gap never falls below the threshold has n* above the grid (+inf), one
that starts below it has n* below the grid (-inf), so an interval reaching past the grid's ends is open and the
boundary is reported as "underpowered" (not located by this grid and these seeds).

Claims (stats.decide):
- ``retrieval_at_fewest_tasks``: the retrieval gap at the smallest n_tasks (t interval over seeds), rule "> 0":
  a retrieval regime exists at all.
- ``regime_boundary_below_8192``: log2 n* (bootstrap CI), rule "< 13": at this model and budget the paper's 8192
  tasks lie past the boundary (in the in-context inference regime); "not supported" when n* is above 8192.

Reads each trial's final metrics (eval/<tasks>/excess_ce_task, eval/<tasks>/oracle_task_test_ce,
eval/<tasks>/oracle_mix_test_ce, baseline/<tasks>/incontext_{unigram,bigram}/ce, eval/retrieval_gap,
emergence/<tasks>/icl_gain where logged). Writes task_diversity.csv (per n_tasks), task_diversity_boundary.csv,
task_diversity_claims.json and the figure task_diversity.{png,pdf}.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
from sweepdata import fail, load_sweep, mean_ci, out_dir, parser, save, write_table

TASKS = ("seen", "unseen")
BASE = ("incontext_unigram", "incontext_bigram")
N_BOOT = 2000


def crossing(ns: np.ndarray, gap: np.ndarray, threshold: float) -> float:
    """log2 n* where gap (ordered by ns) first falls below threshold, interpolated in log2(n); -inf if the first
    value is already below, +inf if none is."""
    x = np.log2(ns)
    below = np.flatnonzero(gap < threshold)
    if len(below) == 0:
        return math.inf
    i = int(below[0])
    if i == 0:
        return -math.inf
    g0, g1 = gap[i - 1], gap[i]
    return float(x[i - 1] + (g0 - threshold) / (g0 - g1) * (x[i] - x[i - 1]))


def bootstrap_crossing(per_cell: list[list[float]], ns: np.ndarray, threshold: float, n_boot: int = N_BOOT,
                       seed: int = 0) -> np.ndarray:
    """log2 n* of n_boot resamples: each cell's seed values resampled with replacement."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7D]))
    out = np.empty(n_boot)
    arrs = [np.asarray(v, float) for v in per_cell]
    for b in range(n_boot):
        gap = np.array([a[rng.integers(0, len(a), len(a))].mean() for a in arrs])
        out[b] = crossing(ns, gap, threshold)
    return out


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threshold", type=float, default=0.05, help="retrieval gap (nats/token) below which a cell "
                   "counts as in-context inference (default 0.05)")
    args = p.parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "train":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; task diversity needs training trials")
    if "hmm.n_tasks" not in sw.varied:
        fail(f"sweep {sw.name!r} does not vary hmm.n_tasks (varies: {', '.join(sw.varied) or 'nothing'})")
    if not math.isfinite(args.threshold):
        fail(f"--threshold must be a finite number, got {args.threshold}")
    points = [(int(t.params["hmm.n_tasks"]), t.metrics) for t in sw.trials if "eval/retrieval_gap" in t.metrics]
    if not points:
        fail(f"no trial of {sw.name!r} has eval/retrieval_gap (evaluate on seen and unseen tasks)")
    summarize(points, args.threshold, out_dir(args), sw.name)
    return 0


def summarize(points: list[tuple[int, dict]], threshold: float, out, name: str) -> dict:
    """Tables, claims and figure from (n_tasks, final metrics) per trial (module docstring); returns the boundary."""
    from pathlib import Path

    from hmmscope.stats import claim, jsonable, rule

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vals: dict = defaultdict(lambda: defaultdict(list))  # n_tasks -> quantity -> per-seed values
    for n_tasks, m in points:
        v = vals[n_tasks]
        v["retrieval_gap"].append(m["eval/retrieval_gap"])
        for tasks in TASKS:
            task_ce = m.get(f"eval/{tasks}/oracle_task_test_ce")
            v[f"{tasks}/model"].append(m.get(f"eval/{tasks}/excess_ce_task"))
            if task_ce is None:
                continue
            v[f"{tasks}/mixture_oracle"].append(m.get(f"eval/{tasks}/oracle_mix_test_ce", math.nan) - task_ce)
            for b in BASE:
                v[f"{tasks}/{b}"].append(m.get(f"baseline/{tasks}/{b}/ce", math.nan) - task_ce)
            if f"emergence/{tasks}/icl_gain" in m:
                v[f"{tasks}/icl_gain"].append(m[f"emergence/{tasks}/icl_gain"])
    ns = np.array(sorted(vals), float)
    rows = []
    for n in sorted(vals):
        row: dict = {"n_tasks": n}
        for q, v in vals[n].items():
            mean, lo, hi, k = mean_ci([x for x in v if x is not None])
            row.update({q: mean, f"{q}_lo": lo, f"{q}_hi": hi})
            row["n_seeds"] = max(row.get("n_seeds", 0), k)
        rows.append(row)
    write_table(rows, out, "task_diversity")

    per_cell = [vals[int(n)]["retrieval_gap"] for n in ns]
    x_hat = crossing(ns, np.array([np.mean(v) for v in per_cell]), threshold)
    boot = bootstrap_crossing(per_cell, ns, threshold)
    # order statistics (no interpolation between resamples, which +-inf would turn into NaN)
    lo, hi = np.quantile(boot, [0.025, 0.975], method="inverted_cdf") if len(ns) >= 2 else (math.nan, math.nan)
    located = bool(math.isfinite(x_hat) and math.isfinite(lo) and math.isfinite(hi))
    power = ("ok" if located else "underpowered: the boundary is not located inside the grid by these seeds "
             f"({np.mean(~np.isfinite(boot)):.0%} of the bootstrap resamples cross outside it)")
    bnd = {"threshold": threshold, "log2_n_star": x_hat, "log2_lo": float(lo), "log2_hi": float(hi),
           "n_star": 2 ** x_hat if math.isfinite(x_hat) else x_hat, "n_star_lo": 2 ** float(lo),
           "n_star_hi": 2 ** float(hi), "grid": f"{int(ns[0])}..{int(ns[-1])}", "n_boot": N_BOOT, "power": power}
    write_table([bnd], out, "task_diversity_boundary")

    first = np.asarray(per_cell[0], float)
    m0, lo0, hi0, k0 = mean_ci(first)
    claims = [
        claim("retrieval_at_fewest_tasks", f"retrieval gap at n_tasks = {int(ns[0])} (nats/token; mean over {k0} "
              "seeds, 95% t interval)", m0, lo0, hi0, rule(">", 0),
              "positive: with the fewest tasks the model is closer to the ceiling on its training tasks than on "
              "fresh ones (retrieval)", df=k0 - 1),
        claim("regime_boundary_below_8192", f"log2 of the n_tasks where the retrieval gap falls below "
              f"{threshold:g} nats/token (log2-interpolated; 95% percentile bootstrap over seeds, {N_BOOT} "
              "resamples; +-inf: outside the grid)", x_hat if math.isfinite(x_hat) else math.nan,
              lo if math.isfinite(lo) else math.nan, hi if math.isfinite(hi) else math.nan, rule("<", 13),
              "below 13: at this model and budget the paper's 8192 tasks are past the regime change (in-context "
              "inference); " + power),
    ]
    (out / "task_diversity_claims.json").write_text(json.dumps(jsonable(
        [c.__dict__ for c in claims] + [{"boundary": bnd}]), indent=2))
    for c in claims:
        print(f"claim {c.name}: {c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}] rule '{c.rule}' -> {c.verdict}")
    print(f"regime boundary: n* = {bnd['n_star']:.4g} [{bnd['n_star_lo']:.4g}, {bnd['n_star_hi']:.4g}] ({power})")

    import matplotlib.pyplot as plt

    fig, (ax, axg) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    style = {"model": ("-", "o", 2.0), "mixture_oracle": ("--", None, 1.0), "incontext_unigram": ((0, (6, 2, 1, 2)),
             None, 1.0), "incontext_bigram": ("-.", None, 1.0)}
    for tasks, col in zip(TASKS, ("C0", "C1")):
        for pred, (ls, mk, lw) in style.items():
            q = f"{tasks}/{pred}"
            if not any(q in r for r in rows):
                continue
            y = [r.get(q, math.nan) for r in rows]
            ax.plot(ns, y, ls=ls, marker=mk, color=col, lw=lw, label=f"{tasks}: {pred.replace('_', ' ')}")
            if pred == "model":
                ax.fill_between(ns, [r.get(q + "_lo", math.nan) for r in rows],
                                [r.get(q + "_hi", math.nan) for r in rows], color=col, alpha=0.2)
    ax.axhline(0, color="gray", lw=0.8, label="task oracle (ceiling)")
    ax.set(xscale="log", xlabel="training tasks n_tasks", ylabel="CE - task-oracle CE (nats/token)",
           title="excess CE over the task oracle, test segment, k = k_max")
    ax.set_xticks(ns, [str(int(n)) for n in ns])
    ax.legend(fontsize=7)
    g = [r["retrieval_gap"] for r in rows]
    axg.plot(ns, g, "-o", color="C3", label="retrieval gap (unseen - seen), 95% CI over seeds")
    axg.fill_between(ns, [r["retrieval_gap_lo"] for r in rows], [r["retrieval_gap_hi"] for r in rows], color="C3",
                     alpha=0.2)
    axg.axhline(threshold, color="k", ls=":", lw=1, label=f"threshold {threshold:g}")
    axg.axhline(0, color="gray", lw=0.8)
    if math.isfinite(x_hat):
        axg.axvline(2 ** x_hat, color="C2", lw=1.5, label=f"n* = {2 ** x_hat:.3g}")
        axg.axvspan(max(ns[0] / 2, 2 ** float(lo)), min(ns[-1] * 2, 2 ** float(hi)), color="C2", alpha=0.15,
                    label="n* 95% bootstrap CI")
    axg.set(xscale="log", xlabel="training tasks n_tasks", ylabel="nats/token",
            title="retrieval gap and the regime boundary" + ("" if located else " (underpowered)"))
    axg.set_xticks(ns, [str(int(n)) for n in ns])
    axg.legend(fontsize=7)
    fig.suptitle(f"{name}: retrieval vs in-context inference across task diversity")
    save(fig, out, "task_diversity")
    return bnd


if __name__ == "__main__":
    raise SystemExit(main())
