"""The record of a sweep: trials.csv and runs.json (one row per trial: state, params, objective, MLflow run ids
of the training run and of its analysis, steps, headline metrics, training wall time and tokens/s), and each
run's figures and tables under figures/ and tables/, named by trial (e.g. rope-seed0-figure1.png).

Usage: python analysis/gpu/trials_csv.py STUDY OUT_DIR
(the study in the default Optuna storage and its runs in the default MLflow store, both under ./mlruns).
"""

import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hmmscope import tracking
from hmmscope.sweep import default_storage, study_status

METRICS = ("eval/seen/excess_ce", "eval/seen/test_acc", "eval/unseen/excess_ce_task", "eval/retrieval_gap",
           "eval/retrieval_gap_lo", "eval/retrieval_gap_hi", "val/loss", "eval/seen/kl_mix", "oracle/test_loss",
           "oracle/test_acc", "train/wall_time_s", "train/tokens_per_s")


def _label(params: dict) -> str:
    parts = [str(v) for k, v in sorted(params.items()) if k != "seed"]
    return "-".join(parts + [f"seed{params.get('seed', 0)}"]).replace("/", "_")


def _copy_artifacts(uri: str, run_id: str, path: str, label: str, out: Path) -> None:
    """run_id's artifact folder `path` -> out/figures/LABEL-file.png and out/tables/LABEL-file.{csv,json}."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            src = tracking.Run(uri, run_id).download(path, tmp)
        except Exception:
            return
        for f in sorted(Path(src).glob("*")):
            sub = "figures" if f.suffix in (".png", ".pdf") else "tables"
            (out / sub).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, out / sub / f"{label}-{f.name}")


def record(study: str, uri: str, out: Path) -> list[dict]:
    c = tracking.client(uri)
    rows = []
    for r in study_status(study, default_storage()):
        row = {"number": r["number"], "state": r["state"], **{f"param.{k}": v for k, v in r["params"].items()},
               "value": r["value"], "mlflow_run_id": r["mlflow_run_id"]}
        if r["mlflow_run_id"]:
            run = c.get_run(r["mlflow_run_id"])
            row.update({k: run.data.metrics.get(k) for k in METRICS})
            row.update({"train.steps": run.data.params.get("train.steps"), "device": run.data.tags.get("hmmscope.device"),
                        "precision": run.data.tags.get("hmmscope.precision")})
            tps = sorted(m.value for m in c.get_metric_history(r["mlflow_run_id"], "train/tokens_per_s"))
            row["train/tokens_per_s_median"] = tps[len(tps) // 2] if tps else None
            label = _label(r["params"])
            _copy_artifacts(uri, r["mlflow_run_id"], "evaluation", label, out)
            ana = c.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{r['mlflow_run_id']}'",
                                order_by=["attributes.start_time DESC"])
            ana = [a for a in ana if a.data.tags.get("hmmscope.kind") == "analysis" and a.info.status == "FINISHED"]
            row["analysis_run_id"] = ana[0].info.run_id if ana else None
            if ana:
                _copy_artifacts(uri, ana[0].info.run_id, "analysis", label, out)
        rows.append(row)
    return rows


def main(study: str, out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = record(study, tracking.resolve_uri(None), out)
    fields = sorted({k for r in rows for k in r}, key=lambda k: (not k.startswith(("number", "state", "param.")), k))
    with open(out / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    (out / "runs.json").write_text(json.dumps(rows, indent=2, default=str))
    n_ana = sum(bool(r.get("analysis_run_id")) for r in rows)
    print(f"trials.csv: {len(rows)} rows ({sum(r['state'] == 'COMPLETE' for r in rows)} complete, {n_ana} analyzed) "
          f"in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python analysis/gpu/trials_csv.py STUDY OUT_DIR")
    main(sys.argv[1], sys.argv[2])
