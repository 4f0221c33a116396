"""The per-trial table: one row per COMPLETE trial (the one MLflow run the study recorded for it).

Columns: trial number, run id, run name, kind (train / theory), the objective as the study recorded it,
the params that vary across the trials that log them (seeds included: they tell replicates apart; a
param that only one kind of trial logs, at one value, is not "varying"), then metrics.
The report shows the key metrics (KEY_METRICS, those present); trials.csv, written beside report.md,
holds every metric of each run (a training run's analysis claims as claim/<name>/value, ci_lo, ci_hi).
"""

from __future__ import annotations

import csv
from pathlib import Path

from .. import tracking
from ..units import fmt_num
from .common import NAN, Section
from .read import Trials, analysis_run

KEY_METRICS = ("eval/seen/test_acc", "eval/seen/excess_ce", "eval/seen/kl_mix", "eval/retrieval_gap",
               "eval/test_acc", "eval/excess_ce", "eval/kl_mix", "memory/model_tv", "memory/eps",
               "theory/exponent/gamma/pooled")  # eval/<name>: runs recorded before eval/seen/<name>


def trial_rows(t: Trials, is_theory, uri: str | None = None) -> tuple[list[dict], list[str], list[str]]:
    """(rows, varying param names, metric names) over the COMPLETE trials' runs, by trial number."""
    rows = []
    for r in sorted(t.complete, key=lambda r: t.trial_of.get(r.info.run_id, -1)):
        rid = r.info.run_id
        row = {"trial": t.trial_of.get(rid, ""), "run_id": rid, "run_name": r.info.run_name or "",
               "kind": "theory" if is_theory(r) else "train", "objective": t.value_of.get(rid, NAN),
               "params": dict(r.data.params), "metrics": dict(r.data.metrics)}
        a = analysis_run(r, t.children, t.analysis) if row["kind"] == "train" else None
        if a is not None:
            row["metrics"].update(tracking.read_claims(uri, a)[0])
        if row["kind"] == "theory":  # the theory trial's pooled exponent sits on its parent run
            row["metrics"].update({k: v for k, v in r.data.metrics.items() if k.startswith("theory/exponent")})
        rows.append(row)
    keys = sorted({k for row in rows for k in row["params"]})
    varying = [k for k in keys if len({str(row["params"][k]) for row in rows if k in row["params"]}) > 1]
    metrics = sorted({k for row in rows for k in row["metrics"]})
    return rows, varying, metrics


def write_csv(path: Path, objective: str, rows: list[dict], varying: list[str], metrics: list[str]) -> Path:
    """trials.csv: trial, run_id, run_name, kind, <objective>, the varying params, every metric (atomic write)."""
    obj_col = f"objective ({objective})"
    fields = ["trial", "run_id", "run_name", "kind", obj_col, *varying, *metrics]
    from ..safe_output import atomic_open

    with atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({"trial": row["trial"], "run_id": row["run_id"], "run_name": row["run_name"],
                        "kind": row["kind"], obj_col: row["objective"],
                        **{k: row["params"].get(k, "") for k in varying},
                        **{k: row["metrics"].get(k, "") for k in metrics}})
    return path


def trials_section(objective: str, rows: list[dict], varying: list[str], metrics: list[str]) -> Section | None:
    """The table in the report: trial, run id, varying params, objective, key metrics."""
    if not rows:
        return None
    key = [m for m in KEY_METRICS if m in metrics and m != objective]
    head = ["trial", "run id", *varying, f"objective: {objective}", *key]
    table = [[str(row["trial"]), row["run_id"][:8], *(str(row["params"].get(k, "-")) for k in varying),
              fmt_num(row["objective"]), *(fmt_num(row["metrics"].get(m)) for m in key)] for row in rows]
    return Section("Trials", [("p", f"One row per COMPLETE trial ({len(rows)}): the params that vary across them, "
                                    f"the objective as the study recorded it, key metrics. Every metric of every "
                                    f"trial, with full run ids: trials.csv."),
                              ("table", head, table)])
