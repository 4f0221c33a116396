"""The paper experiment's record (analysis/gpu/paper_once.py: phase 6, and after the session).

`record`: from the store a phase left, report.md, claims.csv, curves.csv, run.json, trials.csv, phases.csv,
bench.json, plan.json, the figures and a trimmed store (mlflow.db and the artifacts, no checkpoint or model
weights: `copy_small_artifacts`); it needs MLflow (the venv's python). `collect`: the archives of one device command
into the repository's record folder. Both run as `paper_once.py record` / `paper_once.py collect`; the orchestrator
also uses the store helpers here (`store_db_copy`, `artifact_dir`, `copy_small_artifacts`) when a phase packs its
store. The standard library only at import time.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIG_FILE = 8 << 20  # a stored artifact this large (checkpoints, model weights) stays out of the trimmed store
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


# ---------------------------------------------------------------- the store, trimmed


def store_db_copy(store: Path, dst: Path) -> None:
    """A consistent copy of the store's sqlite database (its online backup)."""
    src = store / "mlflow.db"
    if src.exists():
        with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
            a.backup(b)


def artifact_dir(store: Path, run_id: str) -> Path | None:
    """The run's artifact folder in the store (its artifact_uri in mlflow.db; a file:// path beside the database)."""
    try:
        with sqlite3.connect(f"file:{store / 'mlflow.db'}?mode=ro", uri=True) as db:
            row = db.execute("SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    except sqlite3.Error:
        row = None
    if row and str(row[0]).startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(row[0]).path))
    found = sorted(store.glob(f"artifacts/{run_id}/artifacts")) + sorted(store.glob(f"artifacts/*/{run_id}/artifacts"))
    return found[0] if found else None


def copy_small_artifacts(store: Path, run_id: str, dst: Path) -> None:
    """The run's artifacts but checkpoints and model weights (files over BIG_FILE or with a weights suffix)."""
    src = artifact_dir(store, run_id)
    for f in src.rglob("*") if src and src.is_dir() else ():
        if f.is_file() and f.stat().st_size < BIG_FILE and f.suffix not in WEIGHT_SUFFIXES:
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst / f.relative_to(src))


# ---------------------------------------------------------------- phase 6: the record (the venv's python: MLflow)

TRIAL_METRICS = ("eval/seen/excess_ce", "eval/seen/test_acc", "eval/unseen/test_acc", "eval/unseen/excess_ce_task",
                 "eval/retrieval_gap", "eval/retrieval_gap_lo", "eval/retrieval_gap_hi", "val/loss", "eval/seen/kl_mix",
                 "oracle/test_loss", "oracle/test_acc", "train/wall_time_s", "train/tokens_per_s", "train/eval_s",
                 "eval/unseen/vs_best_counting", "eval/unseen/vs_best_counting_lo", "eval/unseen/vs_best_counting_hi",
                 "eval/figure1_s")


def _claims_rows(uri: str, run_id: str, label: str) -> list[dict]:
    from hmmscope import tracking

    with __import__("tempfile").TemporaryDirectory() as tmp:
        try:
            path = tracking.Run(uri, run_id).download("claims.json", tmp)
        except Exception:  # noqa: BLE001 - a run without claims
            return []
        d = json.loads(Path(path).read_text())
    return [{"source": label, "run_id": run_id, **dict(zip(d["columns"], row))} for row in d.get("data", [])]


def record(args) -> int:
    """report.md, claims.csv, curves.csv, run.json, trials.csv, the figures and a trimmed store in --out."""
    sys.path.insert(0, str(ROOT / "analysis" / "gpu"))
    from chain import record as chain_record

    from hmmscope import tracking

    uri = f"sqlite:///{Path(args.store).resolve()}/mlflow.db"
    rec, out = Path(args.rec), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(exist_ok=True)
    for f in ("phases.csv", "session.json", "bench/bench.json", "train/plan.json", "setup/env.txt"):
        if (rec / f).exists():
            shutil.copy(rec / f, out / Path(f).name)
    for png in sorted(rec.glob("*/**/*.png")):  # Figures 1-3 (the --out folders) and the emergence curves (artifacts)
        if out not in png.parents:
            shutil.copy(png, out / "figures" / png.name)
    lines, claims, row = [f"# {args.name}: the paper experiment in one device command", ""], [], {}
    if (rec / "setup" / "env.txt").exists():
        lines += ["```", (rec / "setup" / "env.txt").read_text().strip(), "```", ""]
    lines += ["## Phases", "", "| phase | start s | end s | seconds | rc | status | note |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    if (rec / "phases.csv").exists():
        with open(rec / "phases.csv") as f:
            for r in csv.DictReader(f):
                if r["status"] in ("pending", "running"):
                    r.update(status="running (this record)", end_s="", seconds="")
                lines.append(f"| {r['phase']} {r['name']} | {r['start_s']} | {r['end_s']} | {r['seconds']} | {r['rc']} | "
                             f"{r['status']} | {r['note']} |")
    lines.append("")
    if (rec / "bench" / "bench.json").exists():
        b = json.loads((rec / "bench" / "bench.json").read_text())
        lines += [f"## Speed (phase 2: {b.get('device_name') or b.get('device')}, {b.get('shape')}, {b.get('precision')})", "",
                  f"{b.get('gemm_dtype')} GEMM {b.get('gemm_shape')} measured in the same run: "
                  f"{b.get('gemm_rate', 0) / 1e12:.1f} TFLOP/s (the MFU denominator)", "",
                  "| variant | ms/step | tokens/s | MFU | one-off s | loss vs first (first step, last) | error |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in b.get("rows", []):
            if r.get("error"):
                lines.append(f"| {r['variant']} | | | | | | {r['error']} |")
            else:
                lines.append(f"| {r['variant']} | {r['step_s'] * 1e3:.2f} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                             f"{r['compile_s']:.1f} | {r['loss_first_rel']:.1e}, {r['loss_last_rel']:.1e} | |")
        lines.append("")
    if (rec / "train" / "plan.json").exists():
        p = json.loads((rec / "train" / "plan.json").read_text())
        lines += [f"Plan: variant **{p['variant']}**, **{p['steps']} steps**: {p['formula']}"
                  + ("" if p.get("meets_target") else f" (below the target {p.get('target_steps')})"), ""]
    if args.run:
        c = tracking.client(uri)
        r = c.get_run(args.run)
        chain_record(args.run, out)  # curves.csv (every metric's history) and run.json
        m = r.data.metrics
        tps = sorted(x.value for x in c.get_metric_history(args.run, "train/tokens_per_s"))
        steps = max((x.step for x in c.get_metric_history(args.run, "train/wall_time_s")), default=None)
        row = {"mlflow_run_id": args.run, "status": r.info.status, "steps": steps,
               "train.steps": r.data.params.get("train.steps"), "compiled": r.data.tags.get("hmmscope.compiled"),
               "attention": r.data.tags.get("hmmscope.attention"), "device": r.data.tags.get("hmmscope.device"),
               "precision": r.data.tags.get("hmmscope.precision"), "stopped": r.data.tags.get("hmmscope.stopped"),
               "regime": r.data.tags.get("hmmscope.regime"),
               **{k: m.get(k) for k in TRIAL_METRICS},
               "train/tokens_per_s_median": tps[len(tps) // 2] if tps else None}
        prm = r.data.params
        tok_step = int(prm["train.batch_size"]) * (int(prm["data.n_demos"]) * (int(prm["data.l_demo"]) + 1)
                                                   + int(prm["data.l_test"]) - 1)
        row["ms_per_step_median"] = 1e3 * tok_step / row["train/tokens_per_s_median"] if tps else None
        claims = _claims_rows(uri, args.run, "figure1")
        ana = c.search_runs([r.info.experiment_id], f"tags.mlflow.parentRunId = '{args.run}'",
                            order_by=["attributes.start_time DESC"])
        ana = [a for a in ana if a.data.tags.get("hmmscope.kind") == "analysis" and a.info.status == "FINISHED"]
        row["analysis_run_id"] = ana[0].info.run_id if ana else None
        if ana:
            claims += _claims_rows(uri, ana[0].info.run_id, "analysis")
        lines += [f"## Training run {args.run} ({r.info.status}, stopped: {row['stopped']}; regime: {row['regime']})", "",
                  f"{steps} steps of train.steps {row['train.steps']}; compiled {row['compiled']}, attention "
                  f"{row['attention']}, {row['precision']} on {row['device']}; median "
                  f"{row['train/tokens_per_s_median'] or 0:,.0f} tokens/s over the logged intervals = "
                  f"{row['ms_per_step_median'] or 0:.2f} ms per step ({tok_step} tokens)", ""]
        lines += ["| metric | value |", "| --- | --- |"]
        for k in sorted(m):
            if k.startswith(("eval/", "baseline/", "oracle/", "val/", "train/wall", "train/eval")):
                lines.append(f"| {k} | {m[k]:.6g} |")
        lines.append("")
    if claims:
        cols = ["source", "run_id", *[k for k in claims[0] if k not in ("source", "run_id")]]
        with open(out / "claims.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(claims)
        lines += ["## Claims", "", "| source | claim | value | 95% CI | verdict |", "| --- | --- | --- | --- | --- |"]
        for c_ in claims:
            lines.append(f"| {c_['source']} | {c_.get('claim')} | {c_.get('value')} | [{c_.get('ci_lo')}, {c_.get('ci_hi')}] | "
                         f"{c_.get('verdict')} |")
        lines.append("")
    if row:
        with open(out / "trials.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            w.writeheader()
            w.writerow(row)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    trimmed = out / "store"  # the store without checkpoints and model weights
    trimmed.mkdir(exist_ok=True)
    store_db_copy(Path(args.store), trimmed / "mlflow.db")
    art = Path(args.store) / "artifacts"
    for f in art.rglob("*") if art.exists() else ():
        if f.is_file() and f.stat().st_size < BIG_FILE and f.suffix not in WEIGHT_SUFFIXES:
            (trimmed / "artifacts" / f.relative_to(art)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, trimmed / "artifacts" / f.relative_to(art))
    print(f"record: {out} ({sum(1 for _ in out.rglob('*'))} files; {len(claims)} claims)")
    return 0


# ---------------------------------------------------------------- after the session: the record into the repository


def collect(src: Path, dest: Path) -> list[Path]:
    """The archives of one command (the device tool's files_at folder) into dest (e.g.
    analysis/results/paper-gpu-figures/): each phase's logs and small files under dest/<phase>/, the record's report,
    claims, curves, trials, phases, bench and plan files at the top, its figures under dest/figures/; console.txt
    beside them. Left out: the databases and the store (not kept in the repository; keep the archives beside the
    checkout). Works on any subset of archives (a command cut off)."""
    import tempfile

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for tar in sorted(src.glob("*.tar.gz")):
            with tarfile.open(tar) as t:
                t.extractall(tmp, filter="data")
        for top in Path(tmp).iterdir():
            files = [f for f in sorted(top.rglob("*")) if f.is_file() and f.suffix != ".db"]
            files = [f for f in files if not {"store", "artifacts", "out"} & set(f.relative_to(top).parts)]
            record_ = [f for f in files if f.relative_to(top).parts[:2] == ("pack", "record")]
            for f in record_:  # the record: report.md, claims.csv, ..., figures/
                to = dest / Path(*f.relative_to(top).parts[2:])
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, to)
                written.append(to)
            for f in files:  # each phase's logs under its name; its other files where the record has none
                rel = f.relative_to(top)
                if f in record_ or f.name == "phases.csv" and (dest / "phases.csv").exists():
                    continue
                to = dest / rel if f.suffix == ".log" else dest / f.name
                if to.exists() and f.suffix != ".log":
                    continue
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, to)
                written.append(to)
            for table in sorted(top.glob("*/out/*/*/*")):  # Figure 1 and analysis tables (CSV, JSON)
                if table.suffix in (".csv", ".json"):
                    to = dest / "tables" / f"{table.parent.name}-{table.name}"
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(table, to)
                    written.append(to)
            for png in sorted(top.glob("*/out/*/*/*.png")) + sorted(top.glob("*/artifacts/figures/*.png")):
                to = dest / "figures" / png.name  # the figures, also when the record was not made
                if not to.exists():
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(png, to)
                    written.append(to)
    if (src / "console.txt").exists():
        shutil.copy(src / "console.txt", dest / "console.txt")
        written.append(dest / "console.txt")
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"collect: {len(written)} files into {dest} ({size / 2**20:.1f} MiB in all)")
    return written
