"""Task diversity (issue 18.5, SCIENCE.md 8): where does a model stop retrieving memorized tasks? Seen-task and
unseen-task excess CE over the task oracle (test segment, k = k_max, nats per token) against hmm.n_tasks, mean over
replicate seeds with 95% t intervals, beside the counting baselines (in-context unigram / bigram), the EM-fitted
in-context HMM (where logged) and the mixture oracle over the training tasks; and the retrieval gap (unseen minus
seen excess CE) against n_tasks with the estimated regime boundary.

    python analysis/task_diversity.py --sweep task-diversity-cpu [--threshold 0.05]
    python analysis/task_diversity.py --trials analysis/results/task-diversity-cpu/trials.csv   # a kept record

With --trials the script reads a record's trials.csv (one row per COMPLETE trial: the params that vary, every final
metric; `hmmscope report` writes it) instead of the sweep's store, so a record can be regenerated without its
store; the figures then go to the folder beside trials.csv, `figures/` (or --out). The file is checked first
(analysis/records_io.py: one row per run id, trial, and n_tasks and seed), and the tables and claims are written
together once all are computed.

Regime boundary: n*, where the mean retrieval gap over seeds falls through the threshold (default 0.05 nats/token),
and its 95% confidence set (analysis/regime_boundary.py says how, and why so), also at thresholds 0.030, 0.035,
..., 0.060 (task_diversity_threshold.csv and the figure's third panel).

Claims (stats.decide):
- ``retrieval_at_fewest_tasks``: the retrieval gap at the smallest n_tasks (t interval over seeds), rule "> 0":
  a retrieval regime exists at all.
- ``regime_boundary_below_8192``: log2 n* (the confidence set's hull, t on G - 1 df), rule "< 13": at this model
  and budget the paper's 8192 tasks lie past the end of retrieval; "not supported" when n* is above 8192,
  inconclusive (and "underpowered") when the set is open. Past n* a model does not retrieve; whether it counts or
  infers beyond counting is a separate question (the regime words of SCIENCE.md 9), not this claim.

Reads each trial's final metrics (eval/<tasks>/excess_ce_task, eval/<tasks>/oracle_task_test_ce,
eval/<tasks>/oracle_mix_test_ce, eval/<tasks>/test_ce, baseline/<tasks>/incontext_{unigram,bigram,hmm}/ce,
eval/retrieval_gap, emergence/<tasks>/icl_gain where logged). Writes task_diversity.csv (per n_tasks; with the
EM learner logged, unseen/model_minus_incontext_hmm = model CE - EM-fitted HMM CE on the unseen episodes, paired
per trial), task_diversity_boundary.csv, task_diversity_threshold.csv, task_diversity_tail.csv (the gap pooled over
the cells with n_tasks >= each grid value: trials with a positive gap, and the mean over seeds of each seed's mean
over those cells with a t interval on G - 1 df), task_diversity_claims.json (the claims, then a summary: the boundary,
the threshold table, the tail table, the EM margin, and whether every cell of a seed scored the same unseen episodes,
i.e. one unseen task-oracle CE per seed) and the figure task_diversity.{png,pdf}.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from diversity_figures import FRESH, TASKS, figure
from pooled import REGIME_CLAIMS, regime_rows
from records_io import Outputs, RecordError, check_numbers, check_out, check_unique, read_trials
from regime_boundary import boundary, tail_table
from sweepdata import SEED_KEYS, fail, load_sweep, mean_ci

from hmmscope.stats import claim, jsonable, rule

BASE = ("incontext_unigram", "incontext_bigram", "incontext_hmm", "best_counting", "family_bayes")
THRESHOLDS = tuple(round(0.03 + 0.005 * i, 3) for i in range(7))  # 0.030 .. 0.060, the sensitivity table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep", help="sweep (study) name: read its trials from the Optuna study and MLflow store")
    src.add_argument("--trials", type=Path, help="a record's trials.csv (one row per COMPLETE trial; no store needed)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: hmmscope's, sqlite under ./mlruns)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///mlruns/optuna.db)")
    p.add_argument("--out", type=Path, default=None, help="folder for the figures and tables (default: "
                   "analysis/results/SWEEP/figures, or figures/ beside --trials)")
    p.add_argument("--threshold", type=float, default=0.05, help="retrieval gap (nats/token) below which a cell "
                   "counts as past retrieval (default 0.05)")
    args = p.parse_args(argv)
    if not math.isfinite(args.threshold):
        fail(f"--threshold must be a finite number, got {args.threshold}")
    if args.trials is not None:
        out = args.out or args.trials.resolve().parent / "figures"
        try:  # the record's trials.csv and --out checked before anything is computed (records_io)
            check_out(out, "--out" if args.out else "--trials", named=args.out is not None)
            points, name = read_trials_csv(args.trials), args.trials.resolve().parent.name
        except RecordError as e:
            fail(str(e))
    else:
        sw = load_sweep(args)
        if sw.kind != "train":
            fail(f"sweep {sw.name!r} is a {sw.kind} sweep; task diversity needs training trials")
        if "hmm.n_tasks" not in sw.varied:
            fail(f"sweep {sw.name!r} does not vary hmm.n_tasks (varies: {', '.join(sw.varied) or 'nothing'})")
        points = [(int(t.params["hmm.n_tasks"]), t.seed, t.metrics) for t in sw.trials
                  if "eval/retrieval_gap" in t.metrics or int(t.params["hmm.n_tasks"]) == 0]
        if not points:
            fail(f"no trial of {sw.name!r} has eval/retrieval_gap (evaluate on seen and unseen tasks)")
        name = sw.name
        out = args.out or Path(__file__).resolve().parent / "results" / sw.name / "figures"
    try:
        summarize(points, args.threshold, out, name)
    except RecordError as e:  # --out not writable: nothing was written
        fail(str(e))
    return 0


def read_trials_csv(path: Path) -> list[tuple[int, str, dict]]:
    """(n_tasks, seed, final metrics) per training trial of a record's trials.csv (metrics: the columns with a '/'),
    checked first (records_io: the file, its columns, numbers in every metric column, one row per run id and trial,
    and per n_tasks and seed among the training trials; RecordError naming the file and row)."""
    t = read_trials(path, what="--trials", required=("hmm.n_tasks", "eval/retrieval_gap"), numbers=("hmm.n_tasks",))
    seed_key = next((k for k in SEED_KEYS if k in t.columns), None)
    if seed_key:
        check_numbers(t, [seed_key])
        check_unique(t, ("hmm.n_tasks", seed_key), lambda r: r.get("kind", "train") == "train",
                     ": a repeated trial would count as another seed")
    rows = t.rows
    fresh = {i for i, r in enumerate(rows) if r.get("hmm.n_tasks") not in ("", None) and float(r["hmm.n_tasks"]) == 0}
    points = []
    for i, r in enumerate(rows):
        if r.get("kind", "train") != "train" or (r.get("eval/retrieval_gap") in ("", None) and i not in fresh):
            continue
        if r["hmm.n_tasks"].strip() == "":
            raise RecordError(f"{t.where(i)}: no hmm.n_tasks")
        n = int(float(r["hmm.n_tasks"]))
        m = {k: float(v) for k, v in r.items() if k and "/" in k and v not in ("", None)}
        points.append((n, r[seed_key] if seed_key else "0", m))
    if not points:
        raise RecordError(f"--trials {str(path)!r} has no training trial with eval/retrieval_gap")
    return points


def summarize(points: list[tuple[int, str, dict]], threshold: float, out, name: str, *, plot: bool = True) -> dict:
    """Tables, claims and (plot) the figure from (n_tasks, seed, final metrics) per trial (module docstring);
    returns the boundary at `threshold`."""
    out = Path(out)
    vals: dict = defaultdict(lambda: defaultdict(list))  # n_tasks -> quantity -> per-seed values
    per_seed: dict = defaultdict(dict)  # seed -> n_tasks -> retrieval gap
    margin: list = []  # (n_tasks, seed, unseen model CE - EM HMM CE)
    unseen_ref: dict = defaultdict(set)  # seed -> the unseen episodes' task-oracle CEs across cells
    regime_vals: dict = defaultdict(lambda: defaultdict(dict))  # n_tasks -> claim -> seed -> value
    for n_tasks, seed, m in points:
        if "eval/unseen/oracle_task_test_ce" in m:
            unseen_ref[seed].add(round(m["eval/unseen/oracle_task_test_ce"], 12))
        v = vals[n_tasks]
        if n_tasks != FRESH:  # fresh tasks have no seen tasks, hence no retrieval gap
            v["retrieval_gap"].append(m["eval/retrieval_gap"])
            per_seed[seed][n_tasks] = m["eval/retrieval_gap"]
        for q, key in (("unseen/vs_best_counting", "eval/unseen/vs_best_counting"),
                       ("unseen/icl_gain_same_tokens", "eval/unseen/icl_gain")):
            if key in m:
                v[q].append(m[key])
        for c, (key, _, _) in REGIME_CLAIMS.items():
            if key in m:
                regime_vals[n_tasks][c][seed] = m[key]
        if "eval/unseen/vs_best_counting_hi" in m:  # the trial's own paired CI over its episodes
            regime_vals[n_tasks]["_trials"][seed] = m["eval/unseen/vs_best_counting_hi"] < 0
        for tasks in TASKS:
            task_ce = m.get(f"eval/{tasks}/oracle_task_test_ce")
            v[f"{tasks}/model"].append(m.get(f"eval/{tasks}/excess_ce_task"))
            if task_ce is None:
                continue
            v[f"{tasks}/mixture_oracle"].append(m.get(f"eval/{tasks}/oracle_mix_test_ce", math.nan) - task_ce)
            for b in BASE:
                if f"baseline/{tasks}/{b}/ce" in m:
                    v[f"{tasks}/{b}"].append(m[f"baseline/{tasks}/{b}/ce"] - task_ce)
            if f"emergence/{tasks}/icl_gain" in m:
                v[f"{tasks}/icl_gain"].append(m[f"emergence/{tasks}/icl_gain"])
        if "eval/unseen/test_ce" in m and "baseline/unseen/incontext_hmm/ce" in m:
            d = m["eval/unseen/test_ce"] - m["baseline/unseen/incontext_hmm/ce"]
            vals[n_tasks]["unseen/model_minus_incontext_hmm"].append(d)
            margin.append((n_tasks, seed, d))
    ns = np.array(sorted(n for n in vals if n != FRESH), float)
    if len(ns) < 2:
        fail(f"{name}: the retrieval gap is measured at {len(ns)} n_tasks value; the boundary needs at least 2")
    outs = Outputs(out)  # every table and the claims computed, then written together (records_io)
    rows = []
    for n in sorted(vals, key=lambda n: (n == FRESH, n)):  # fresh tasks last: "infinite" diversity
        row: dict = {"n_tasks": n, "cell": "fresh" if n == FRESH else str(n)}
        for q, v in vals[n].items():
            mean, lo, hi, k = mean_ci([x for x in v if x is not None])
            row.update({q: mean, f"{q}_lo": lo, f"{q}_hi": hi})
            row["n_seeds"] = max(row.get("n_seeds", 0), k)
        rows.append(row)
    outs.table(rows, "task_diversity")
    regimes = regime_rows(regime_vals, FRESH)
    if regimes:
        outs.table(regimes, "task_diversity_regimes")

    bnd = boundary(ns, per_seed, threshold)
    outs.table([bnd], "task_diversity_boundary")
    sens = [boundary(ns, per_seed, t) for t in THRESHOLDS]
    outs.table(sens, "task_diversity_threshold")
    tail = tail_table(ns, per_seed)
    outs.table(tail, "task_diversity_tail")

    first = np.asarray(vals[int(ns[0])]["retrieval_gap"], float)
    m0, lo0, hi0, k0 = mean_ci(first)
    lo, hi = bnd["log2_lo"], bnd["log2_hi"]
    claims = [
        claim("retrieval_at_fewest_tasks", f"retrieval gap at n_tasks = {int(ns[0])} (nats/token; mean over {k0} "
              "seeds, 95% t interval)", m0, lo0, hi0, rule(">", 0),
              "positive: with the fewest tasks the model is closer to the ceiling on its training tasks than on "
              "fresh ones (retrieval)", df=k0 - 1),
        claim("regime_boundary_below_8192", f"log2 of the n_tasks where the mean retrieval gap over seeds falls "
              f"below {threshold:g} nats/token (log2-interpolated); 95% confidence set by t-test inversion "
              f"(Fieller) with the seed as the unit, {bnd['df']:g} df, its hull; inf: open past the grid",
              bnd["log2_n_star"] if math.isfinite(bnd["log2_n_star"]) else math.nan, lo, hi, rule("<", 13),
              "below 13: at this model and budget the paper's 8192 tasks lie past the end of retrieval (no retrieval "
              "there; whether the model then counts or infers beyond counting is not this claim: SCIENCE.md 9); "
              + bnd["power"], df=bnd["df"], degenerate=bnd["degenerate"]),
    ]
    summary = {"boundary": bnd, "threshold_sensitivity": sens, "tail": tail, "regimes": regimes}
    if unseen_ref:  # one task-oracle CE per seed in every cell: every cell of a seed scored the same unseen episodes
        summary["unseen_episodes_shared_across_cells"] = {
            "per_seed_distinct_task_oracle_ce": {str(k): len(v) for k, v in sorted(unseen_ref.items(), key=lambda x: str(x[0]))},
            "shared": all(len(v) == 1 for v in unseen_ref.values())}
    if margin:
        worst = min(margin, key=lambda r: r[2])
        summary["unseen_model_minus_incontext_hmm"] = {
            "min_over_trials": worst[2], "at": {"n_tasks": worst[0], "seed": worst[1]},
            "min_over_cells_of_seed_mean": min(r["unseen/model_minus_incontext_hmm"] for r in rows
                                               if "unseen/model_minus_incontext_hmm" in r)}
    outs.text("task_diversity_claims.json", json.dumps(jsonable([c.__dict__ for c in claims] + [summary]), indent=2))
    outs.write()
    for c in claims:
        print(f"claim {c.name}: {c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}] rule '{c.rule}' -> {c.verdict}")
    print(f"regime boundary: n* = {bnd['n_star']:.4g} [{bnd['n_star_lo']:.4g}, {bnd['n_star_hi']:.4g}] ({bnd['power']})")
    if unseen_ref and summary["unseen_episodes_shared_across_cells"]["shared"]:
        print(f"unseen tasks: within each seed every cell scored the same unseen episodes (one task-oracle CE per seed "
              f"over {len(vals)} cells): the unseen tasks do not vary with n_tasks")
    if margin:
        u = summary["unseen_model_minus_incontext_hmm"]
        print(f"unseen tasks: model CE - EM-fitted HMM CE >= {u['min_over_cells_of_seed_mean']:.4g} in every cell's seed "
              f"mean, >= {u['min_over_trials']:.4g} in every trial")
    for r in regimes:
        print(f"regime at n_tasks = {r['cell']}: {r['regime']} (model - best counting {r['inference_beyond_counting']:.3g} "
              f"[{r['inference_beyond_counting_lo']:.3g}, {r['inference_beyond_counting_hi']:.3g}])"
              if math.isfinite(r.get("inference_beyond_counting", math.nan)) else
              f"regime at n_tasks = {r['cell']}: {r['regime']}")
    if plot:
        figure(rows, ns, bnd, sens, threshold, out, name, regimes)
    return bnd


if __name__ == "__main__":
    raise SystemExit(main())
