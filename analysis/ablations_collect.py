"""The inference-ablations record's per-run tables collected from the sweeps' store (runs.csv, curves.csv,
layerwise_runs.csv, studies.csv), and read back from a kept record through records_io (`read_record`).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
from pathlib import Path

from ablations_tables import BASE, KEYS, METRICS, STUDIES, TEXT
from records_io import check_unique, read_csv
from sweepdata import default_storage, load_sweep

# ---------------------------------------------------------------- collect (from the store)


def collect(uri: str | None, storage: str | None, out: Path) -> None:
    """runs.csv, curves.csv, layerwise_runs.csv from the four sweeps (module docstring)."""
    import optuna
    from optuna.trial import TrialState

    from hmmscope import tracking

    runs, curves, claims, studies = [], [], [], []
    store = default_storage(storage)
    known = set(optuna.get_all_study_names(store))
    for study in STUDIES:  # a study not run (or with no COMPLETE trial yet) is listed in studies.csv, not fatal
        name = f"inference-ablations-{study}"
        st = optuna.load_study(study_name=name, storage=store) if name in known else None
        n_complete = 0 if st is None else sum(t.state == TrialState.COMPLETE for t in st.get_trials(deepcopy=False))
        studies.append({"study": name, "in_store": st is not None,
                        "n_trials": 0 if st is None else len({t.user_attrs.get("slot", t.number)  # the spec's slots
                                                              for t in st.get_trials(deepcopy=False)}),
                        "complete": n_complete})
        if not n_complete:
            print(f"{name}: not in the store or no COMPLETE trial (listed in studies.csv)", file=sys.stderr)
            continue
        sw = load_sweep(argparse.Namespace(sweep=name, tracking_uri=uri, storage=storage))
        client = tracking.client(sw.uri)
        for t in sw.trials:
            run = client.get_run(t.run_id)
            row = {"study": study, "trial": t.number, "run_id": t.run_id, "seed": int(t.seed),
                   **{k: _param(t.params, KEYS[k], BASE[k]) for k in KEYS},
                   **{c: t.metrics.get(m, math.nan) for c, m in METRICS.items()},
                   "regime": run.data.tags.get("hmmscope.regime", ""),
                   "start": run.info.start_time / 1000, "end": (run.info.end_time or 0) / 1000}
            nums, verdicts, rules = tracking.read_claims(sw.uri, run)
            for name in ("icl_gain", "inference_beyond_counting"):
                row[f"claim_{name}_verdict"] = verdicts.get(name, "")
            row["analysis_run_id"] = t.analysis_run_id or ""
            if t.analysis_run_id:
                arun = client.get_run(t.analysis_run_id)
                row["analysis_s"] = (arun.info.end_time - arun.info.start_time) / 1000 if arun.info.end_time else math.nan
                anums, averdicts, arules = tracking.read_claims(sw.uri, arun)
                for name, verdict in averdicts.items():
                    claims.append({"run_id": t.run_id, "seed": row["seed"], "n_layers": row["n_layers"],
                                   "pos_enc": row["pos_enc"], "claim": name,
                                   **{k: anums.get(f"claim/{name}/{k}", math.nan) for k in ("value", "ci_lo", "ci_hi")},
                                   "rule": arules.get(name, ""), "verdict": verdict})
            runs.append(row)
            for e in _emergence(sw.uri, t.run_id):
                if e.get("tasks") == "unseen" and e.get("predictor") == "model" and e.get("metric") in (
                        "vs_best_counting", "icl_gain"):
                    curves.append({"study": study, "run_id": t.run_id, "seed": row["seed"], "n_layers": row["n_layers"],
                                   "pos_enc": row["pos_enc"], "gamma": row["gamma"], "rank": row["rank"],
                                   "window": row["window"], "step": int(e["step"]), "metric": e["metric"],
                                   "value": float(e["value"])})
    _write(studies, out / "studies.csv")
    _write(runs, out / "runs.csv")
    _write(curves, out / "curves.csv")
    _write(claims, out / "layerwise_runs.csv")


def collect_push(uri: str | None, storage: str | None, out: Path) -> None:
    """push_runs.csv, push_curves.csv: the push's runs (sweeps/inference-ablations-push.toml: the best cell with a
    bigger budget, its own store), as runs.csv and curves.csv with the model's width and steps beside."""
    from hmmscope import tracking

    sw = load_sweep(argparse.Namespace(sweep="inference-ablations-push", tracking_uri=uri, storage=storage))
    client = tracking.client(sw.uri)
    runs, curves = [], []
    for t in sw.trials:
        run = client.get_run(t.run_id)
        p = run.data.params
        row = {"study": "push", "trial": t.number, "run_id": t.run_id, "seed": int(t.seed),
               **{k: _param(p, KEYS[k], BASE[k]) for k in KEYS}, "d_model": int(float(p["model.d_model"])),
               "steps": int(float(p["train.steps"])), **{c: t.metrics.get(m, math.nan) for c, m in METRICS.items()},
               "regime": run.data.tags.get("hmmscope.regime", ""),
               "start": run.info.start_time / 1000, "end": (run.info.end_time or 0) / 1000}
        runs.append(row)
        for e in _emergence(sw.uri, t.run_id):
            if e.get("tasks") == "unseen" and e.get("predictor") == "model" and e.get("metric") in (
                    "vs_best_counting", "icl_gain", "vs_bayes"):
                curves.append({"study": "push", "run_id": t.run_id, "seed": row["seed"], "n_layers": row["n_layers"],
                               "pos_enc": row["pos_enc"], "gamma": row["gamma"], "rank": row["rank"],
                               "window": row["window"], "step": int(e["step"]), "metric": e["metric"],
                               "value": float(e["value"])})
    _write(runs, out / "push_runs.csv")
    _write(curves, out / "push_curves.csv")


def _param(params: dict, key: str, default):
    v = params.get(key)
    if v is None:
        return default
    return v if isinstance(default, str) else type(default)(float(v))


def _emergence(uri: str, run_id: str) -> list[dict]:
    from hmmscope import tracking

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = tracking.Run(uri, run_id).download("emergence/curves.json", tmp)
        except FileNotFoundError:
            return []
        t = json.loads(Path(path).read_text())
    return [dict(zip(t["columns"], row)) for row in t["data"]]


def _write(rows: list[dict], path: Path) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r)) or ["empty"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        w.writerows(rows)
    print(f"table: {path}")


RECORD = {  # the kept tables, checked before anything is computed (records_io.read_csv): columns, numbers, keys
    "runs.csv": dict(required=("study", "run_id", "seed", *KEYS.keys() - {"structures"}, "model_ce", "diff"),
                     numbers=("trial", "seed", *KEYS.keys() - set(TEXT), *METRICS), unique=[("run_id",)]),
    "curves.csv": dict(required=("run_id", "step", "metric", "value"), numbers=("step", "value"),
                       unique=[("run_id", "step", "metric")]),
    "layerwise_runs.csv": dict(required=("run_id", "seed", "n_layers", "pos_enc", "claim", "value", "ci_lo", "ci_hi",
                                         "rule"), numbers=("seed", "n_layers", "value", "ci_lo", "ci_hi"),
                               unique=[("run_id", "claim")], allow_empty=True),  # a depth sweep without analyses
}


PUSH = dict(RECORD["runs.csv"], required=(*RECORD["runs.csv"]["required"], "d_model", "steps"),
            numbers=(*RECORD["runs.csv"]["numbers"], "d_model", "steps"))  # push_runs.csv: runs.csv's, with the budget


def read_record(path: Path, kw: dict | None = None) -> list[dict]:
    """A kept table (RECORD, or kw: checked by records_io.read_csv, RecordError naming the file and row), numbers as
    floats."""
    t = read_csv(path, **(kw if kw is not None else RECORD.get(path.name, {})))
    if path.name == "runs.csv":  # one row per cell and seed: a repeated run is no further seed
        check_unique(t, [k for k in ("study", *KEYS, "seed") if k in t.columns])
    rows = t.rows
    for r in rows:
        for k, v in r.items():
            if k in ("pos_enc", "structures", "regime", "run_id", "study", "metric", "claim", "rule", "verdict",
                     "analysis_run_id") \
                    or k.endswith("_verdict"):
                continue
            try:
                r[k] = float(v) if v not in ("", None) else math.nan
            except ValueError:
                pass
    return rows
