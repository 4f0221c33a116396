"""Regime line of a record (issue 18.7): which regime (retrieval of memorized tasks, or not) a sweep's cells are
in, from the retrieval gap (SCIENCE.md 8) of a re-run of the record's cells with the unseen-task evaluation.

    python analysis/regime_lines.py --sweep depth-vs-rank-cpu --tracking-uri sqlite:///mlruns/regime/mlflow.db \\
        --storage sqlite:///mlruns/regime/optuna.db --out analysis/results/depth-vs-rank-cpu/regime

Reads each COMPLETE trial's final metrics: eval/retrieval_gap with its per-run 95% CI over episodes
(eval/retrieval_gap_lo/_hi), the excess CE over the task oracle on seen and unseen tasks
(eval/{seen,unseen}/excess_ce_task), and the add-one bigram's excess on unseen tasks
(baseline/unseen/incontext_bigram/ce - eval/unseen/oracle_task_test_ce: the counting reference).

Claims (stats.claim, so stats.decide makes every verdict), all with the project's retrieval-gap rule "> 0"
(evaluate.retrieval_gap: positive = retrieval of memorized tasks; near 0 = no retrieval):
- ``retrieval_gap[<cell>]``: the cell's mean gap over its seeds, 95% t interval on G - 1 df (seeds are the unit).
- ``retrieval_gap[pooled]``: the mean over seeds of each seed's mean over all cells of the record, t interval on
  G - 1 df over the seeds (the cells of one seed share its data seed; the seed is the unit, as in the report's
  pooled layerwise claims).
Writes regime_cells.csv (one row per cell), regime_runs.csv (one row per trial), regime_claims.json and regime.md
(the per-cell table and the pooled line).

The package never imports this folder.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
from sweepdata import label, load_sweep, mean_ci, out_dir, parser, write_table

from hmmscope.sweep.spec import seed_keys


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    out = out_dir(args)
    from hmmscope.stats import claim, jsonable, rule

    runs, by_cell, by_seed = [], defaultdict(list), defaultdict(list)
    for t in sw.trials:
        m = t.metrics
        if "eval/retrieval_gap" not in m:
            continue
        bigram = m.get("baseline/unseen/incontext_bigram/ce", math.nan) - m.get("eval/unseen/oracle_task_test_ce", math.nan)
        c = sw.cell(t)
        runs.append({"trial": t.number, "run_id": t.run_id, **dict(zip(sw.varied, c)), "seed": t.seed,
                     "retrieval_gap": m["eval/retrieval_gap"], "ci_lo": m.get("eval/retrieval_gap_lo", math.nan),
                     "ci_hi": m.get("eval/retrieval_gap_hi", math.nan),
                     "seen_excess_ce_task": m.get("eval/seen/excess_ce_task", math.nan),
                     "unseen_excess_ce_task": m.get("eval/unseen/excess_ce_task", math.nan),
                     "unseen_bigram_excess_ce_task": bigram, "seen_test_acc": m.get("eval/seen/test_acc", math.nan),
                     "unseen_test_acc": m.get("eval/unseen/test_acc", math.nan)})
        by_cell[c].append(runs[-1])
        by_seed[t.seed].append(m["eval/retrieval_gap"])
    if not runs:
        print(f"error: sweep {sw.name!r} has no trial with eval/retrieval_gap (code before the unseen-task "
              "evaluation?)", file=__import__("sys").stderr)
        return 2
    write_table(runs, out, "regime_runs")
    rule_ = rule(">", 0)
    why = ("positive: closer to the task oracle on the training tasks than on fresh tasks of the same family "
           "(retrieval of memorized tasks); near 0: no retrieval")
    rows, claims = [], []
    def num(x: str):
        try:
            return (0, float(x), x)
        except ValueError:
            return (1, 0.0, x)

    for c in sorted(by_cell, key=lambda c: tuple(num(x) for x in c)):  # numbers in numeric order
        rs = by_cell[c]
        row = {**dict(zip(sw.varied, c))}
        for q in ("retrieval_gap", "seen_excess_ce_task", "unseen_excess_ce_task", "unseen_bigram_excess_ce_task"):
            mean, lo, hi, n = mean_ci([r[q] for r in rs])
            row.update({q: mean, f"{q}_lo": lo, f"{q}_hi": hi})
        row["n_seeds"] = n = len(rs)
        cl = claim(f"retrieval_gap[{label(sw, c)}]", f"retrieval gap (nats/token), mean over {n} seeds, 95% t "
                   f"interval on {n - 1} df", row["retrieval_gap"], row["retrieval_gap_lo"], row["retrieval_gap_hi"],
                   rule_, why, df=n - 1)
        row["verdict"] = cl.verdict
        rows.append(row)
        claims.append(cl)
    write_table(rows, out, "regime_cells")
    seeds = sorted(by_seed)
    seed_means = [float(np.mean(by_seed[s])) for s in seeds]
    mean, lo, hi, g = mean_ci(seed_means)
    n_cells = len(by_cell)
    claims.append(claim("retrieval_gap[pooled]", f"retrieval gap (nats/token): mean over {g} seeds of each seed's "
                        f"mean over the record's {n_cells} cells, 95% t interval on {g - 1} df", mean, lo, hi, rule_,
                        why + f"; seed means {', '.join(f'{s}: {v:.4f}' for s, v in zip(seeds, seed_means))}",
                        df=g - 1))
    (out / "regime_claims.json").write_text(json.dumps(jsonable([c.__dict__ for c in claims]), indent=2))
    (out / "regime.md").write_text(_markdown(sw, rows, claims))
    for c in claims:
        print(f"claim {c.name}: {c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}] rule '{c.rule}' -> {c.verdict}")
    print(f"claims: {out / 'regime_claims.json'}")
    return 0


# what the intervals cover: a sweep's replicate seed sets these keys; the mixture (hmm.seed) is shared by replicates
SCOPE = (f"Scope: the intervals are over the replicate seeds ({', '.join(seed_keys('train', 0))}); every seed's "
         "runs share one HMM mixture (hmm.seed), so they do not cover mixture draws.")


def _markdown(sw, rows: list[dict], claims: list) -> str:
    """The per-cell table and the pooled line, as markdown (regime.md)."""
    def ci(r, q):
        return f"{r[q]:.3f} [{r[q + '_lo']:.3f}, {r[q + '_hi']:.3f}]"

    head = [k.split(".")[-1] for k in sw.varied]
    lines = ["| " + " | ".join([*head, "seeds", "retrieval gap [95% t CI]", "verdict (> 0)", "seen: model - task oracle",
                                "unseen: model - task oracle", "unseen: add-one bigram - task oracle"]) + " |",
             "|" + "---|" * (len(head) + 6)]
    for r in rows:
        lines.append("| " + " | ".join([*(str(r[k]) for k in sw.varied), str(r["n_seeds"]), ci(r, "retrieval_gap"),
                                        r["verdict"], ci(r, "seen_excess_ce_task"), ci(r, "unseen_excess_ce_task"),
                                        ci(r, "unseen_bigram_excess_ce_task")]) + " |")
    p = claims[-1]
    lines += ["", f"Pooled ({p.statistic}): **{p.value:.3f} [{p.ci_lo:.3f}, {p.ci_hi:.3f}]**, rule {p.rule}: "
                  f"**{p.verdict}** ({p.reason.split('; ')[-1]}).", "", SCOPE]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
