"""The per-trial table: one row per COMPLETE trial (the one MLflow run the study recorded for it).

Columns: trial number, run id, run name, kind (train / theory), the objective as the study recorded it,
the design's params that vary across the trials that log them (the spec's [space] keys and the seeds: they tell
replicates apart; a param that only one kind of trial logs, at one value, is not "varying"), then metrics. What a
run fitted is never a param column (SCIENCE.md 9): an older store's counting.* params go after the metrics in
trials.csv.
The report shows the key metrics (KEY_METRICS, those present); trials.csv, written beside report.md,
holds every metric of each run (a training run's analysis claims as claim/<name>/value, ci_lo, ci_hi).
"""

from __future__ import annotations

from pathlib import Path

from .. import safe_output, tracking
from ..units import fmt_num
from .common import NAN, Section
from .read import SEED_KEYS, Trials, analysis_run, input_keys

KEY_METRICS = ("eval/seen/test_acc", "eval/seen/excess_ce", "eval/seen/kl_mix", "eval/retrieval_gap",
               "eval/test_acc", "eval/excess_ce", "eval/kl_mix", "memory/model_tv", "memory/eps",
               "theory/exponent/gamma/pooled")  # eval/<name>: runs recorded before eval/seen/<name>


def trial_rows(t: Trials, is_theory, uri: str | None = None,
               design: list[str] | None = None) -> tuple[list[dict], list[str], list[str]]:
    """(rows, varying param names, metric names) over the COMPLETE trials' runs, by trial number.

    The params shown are the design's keys (`design`: `read.design_keys`, the spec's [space] keys) and the seeds,
    those that vary; a param that is no config key (an older store's counting.* params: what a run fitted, not an
    input) goes with the outputs, after the metrics (`row["fitted"]`), never among the params."""
    inputs = input_keys()
    rows = []
    for r in sorted(t.complete, key=lambda r: t.trial_of.get(r.info.run_id, -1)):
        rid = r.info.run_id
        params = {k: v for k, v in r.data.params.items() if k in inputs}
        row = {"trial": t.trial_of.get(rid, ""), "run_id": rid, "run_name": r.info.run_name or "",
               "kind": "theory" if is_theory(r) else "train", "objective": t.value_of.get(rid, NAN),
               "params": params, "metrics": dict(r.data.metrics),
               "fitted": {k: v for k, v in r.data.params.items() if k not in inputs}}
        a = analysis_run(r, t.children, t.analysis) if row["kind"] == "train" else None
        if a is not None:
            row["metrics"].update(tracking.read_claims(uri, a)[0])
        if row["kind"] == "theory":  # the theory trial's pooled exponent sits on its parent run
            row["metrics"].update({k: v for k, v in r.data.metrics.items() if k.startswith("theory/exponent")})
        rows.append(row)
    keys = sorted({k for row in rows for k in row["params"]})
    if design is not None:
        keys = [k for k in keys if k in design or k in SEED_KEYS]
    varying = [k for k in keys if len({str(row["params"][k]) for row in rows if k in row["params"]}) > 1]
    metrics = sorted({k for row in rows for k in row["metrics"]})
    return rows, varying, metrics


def write_csv(path: Path, objective: str, rows: list[dict], varying: list[str], metrics: list[str]) -> Path:
    """trials.csv: trial, run_id, run_name, kind, <objective>, the varying params, every metric, then what an older
    store logged as params but a run fitted (counting.*: outputs, `trial_rows`) (atomic write)."""
    obj_col = f"objective ({objective})"
    fitted = sorted({k for row in rows for k in row.get("fitted", {})} - set(metrics))
    fields = ["trial", "run_id", "run_name", "kind", obj_col, *varying, *metrics, *fitted]
    return safe_output.write_csv(path, [{"trial": row["trial"], "run_id": row["run_id"], "run_name": row["run_name"],
                             "kind": row["kind"], obj_col: row["objective"],
                             **{k: row["params"].get(k, "") for k in varying},
                             **{k: row["metrics"].get(k, "") for k in metrics},
                             **{k: row.get("fitted", {}).get(k, "") for k in fitted}} for row in rows], fields)


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
