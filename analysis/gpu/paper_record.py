"""The one command's record (analysis/gpu/paper_once.py's phase 6 and `collect`), and its report, answer first.

    python analysis/gpu/paper_once.py record --store S --rec R --name N --out D [--run ID] [--code-version C]
    python3 analysis/gpu/paper_once.py collect FILES_AT DEST [--code-version C]   # after the session, here

`record` (the venv's python: MLflow) gathers the phases' files, the training run (run.json: its params, tags and
last metrics; curves.csv: every metric's history), trials.csv, claims.csv (Figure 1's and the analysis's) and a
trimmed store (no checkpoint or weights), sets `hmmscope.code_version` on the runs where it reads "unknown" (the
device's copy has no .git: the commit is passed in), then writes report.md with `render_report`. `collect` lays
the archives of one command out in the repository's record folder and renders report.md again from the files
(so an older command's archives get the current report).

report.md (issue 37), from the files alone (no MLflow): the answer first (`answer`), then the phases (a failed or
cut-off phase's last error line in its note), the speed rows, the plan, the training run, Figure 1 at k = k_max
per predictor, the claims (value, 95% CI, verdict, rule; 4 significant digits), and every metric as one table of
name, value, 95% CI and unit (a key's `_lo` / `_hi` rows are its CI, not rows of their own). A reference whose CE
is above a uniform guess (ln V), or whose in-context gain is negative, is DEGENERATE (SCIENCE.md 9): it is marked
so in every row that names it and used for no answer, excess or verdict.

The orchestrator also uses the store helpers here (`store_db_copy`, `artifact_dir`, `copy_small_artifacts`) when
a phase packs its store, and `last_error` for a phase's note. The standard library only at import time.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import sqlite3
import sys
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


def last_error(log: Path) -> str:
    """A failed or cut-off phase's note: its log's last line that says error (or else its last line), and where a
    progress line came after the last phase line, that too ('' for no log)."""
    if not log.is_file():
        return ""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    errs = [x for x in lines if x.lower().startswith("error") or "Error:" in x]
    note = (errs or lines or [""])[-1][:300]
    steps = [x for x in lines if x not in errs and x.split(":")[0] in ("analyze", "train", "evaluate", "setup")]
    return note + (f" (last progress: {steps[-1][:200]})" if steps and errs else "")


TRIAL_METRICS = ("eval/seen/excess_ce", "eval/seen/test_acc", "eval/unseen/test_acc", "eval/unseen/excess_ce_task",
                 "eval/retrieval_gap", "eval/retrieval_gap_lo", "eval/retrieval_gap_hi", "val/loss", "eval/seen/kl_mix",
                 "oracle/test_loss", "oracle/test_acc", "train/wall_time_s", "train/tokens_per_s", "train/eval_s",
                 "eval/unseen/vs_best_counting", "eval/unseen/vs_best_counting_lo", "eval/unseen/vs_best_counting_hi",
                 "eval/figure1_s")
REFERENCES = ("task_oracle", "mixture_oracle", "family_bayes", "best_counting", "incontext_hmm", "incontext_ctw",
              "incontext_ngram", "incontext_bigram", "incontext_unigram")
WHAT = {"task_oracle": "task oracle", "mixture_oracle": "mixture oracle", "family_bayes": "family Bayes",
        "best_counting": "best counting", "incontext_hmm": "EM-fitted HMM", "incontext_ctw": "CTW",
        "incontext_ngram": "n-gram", "incontext_bigram": "add-one bigram", "incontext_unigram": "add-one unigram"}
PHASE_LOGS = {"setup": "setup.log", "bench": "bench.log", "train": "train.log", "figure1": "evaluate.log",
              "analyze": "analyze.log", "pack": "record.log"}


# ---------------------------------------------------------------- numbers as read


def sig(x, n: int = 4) -> str:
    """x with n significant digits ('' for None, 'nan' kept)."""
    if x is None or x == "":
        return ""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 10 ** n:
        return f"{v:,.0f}"
    return f"{v:.{n}g}"


def unit(key: str) -> str:
    """The unit of a metric, from its name."""
    k = key.lower()
    if k.endswith("tokens_per_s"):
        return "tokens/s"
    if k.endswith(("_s", "/wall_time_s")):
        return "s"
    if "acc" in k or k.endswith(("fraction", "p_true_task")):
        return "fraction"
    if re.search(r"(ce|loss|excess|gap|kl_|icl_gain|vs_|/vs/|slope|diff)", k):
        return "nats/token"
    return ""


def metric_rows(metrics: dict) -> list[dict]:
    """One row per metric: name, value, (lo, hi) from its `_lo` / `_hi` keys, unit; the `_lo` / `_hi` keys folded in."""
    rows = []
    for k in sorted(metrics):
        if k.endswith(("_lo", "_hi")) and k[:-3] in metrics:
            continue
        rows.append({"name": k, "value": metrics[k], "lo": metrics.get(k + "_lo"), "hi": metrics.get(k + "_hi"),
                     "unit": unit(k)})
    return rows


def _ref_ce(metrics: dict, split: str, ref: str):
    if ref in ("task_oracle", "mixture_oracle"):
        return metrics.get(f"eval/{split}/oracle_{'task' if ref == 'task_oracle' else 'mix'}_test_ce")
    return metrics.get(f"baseline/{split}/{ref}/ce")


def degenerate(metrics: dict, n_tokens: int | None) -> dict[tuple[str, str], str]:
    """(split, reference) -> why, for every reference that failed on that task set (SCIENCE.md 9: CE above ln V, or
    a negative in-context gain). The mixture oracle over the training tasks on unseen tasks is one such at the paper:
    it knows none of them."""
    out = {}
    for split in ("unseen", "seen"):
        for ref in REFERENCES:
            ce, gain = _ref_ce(metrics, split, ref), metrics.get(f"baseline/{split}/{ref}/icl_gain")
            why = []
            if ce is not None and n_tokens and ce > math.log(n_tokens):
                why.append(f"CE {sig(ce)} above a uniform guess ln {n_tokens} = {sig(math.log(n_tokens))}")
            if gain is not None and gain < 0:
                why.append(f"in-context gain {sig(gain)} < 0")
            if why:
                out[split, ref] = f"{'; '.join(why)} on {split} tasks"
    return out


def _bad_row(name: str, bad: dict) -> bool:
    """Whether a metric is read against a degenerate reference (its own rows, or the model's excess / KL / gap
    against that split's mixture oracle)."""
    for split, ref in bad:
        if f"/{split}/" in name and (f"/{ref}/" in name or name.endswith(f"/{ref}")):
            return True
        if ref == "mixture_oracle" and name.startswith(f"eval/{split}/") and re.search(
                r"/(excess_ce$|kl_mix|gap_to_mix|oracle_mix_)", name):
            return True
    return False


def f3(x) -> str:
    """nats/token in the answer: 3 decimals (the record's tables keep 4 significant digits)."""
    return f"{float(x):.3f}"


def _ci(lo, hi, n: int = 4) -> str:
    """[lo, hi]: n significant digits (n = 3: three decimals, as f3)."""
    fmt = f3 if n == 3 else (lambda x: sig(x, n))
    return f"[{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None and lo != "" and hi != "" else ""


def _claim(claims: list[dict], name: str) -> dict | None:
    return next((c for c in claims if c.get("claim") == name), None)


def _k_max(metrics: dict) -> int | None:
    ks = [int(m.group(1)) for k in metrics if (m := re.fullmatch(r"eval/unseen/vs/best_counting/k(\d+)", k))]
    return max(ks) if ks else None


def answer(metrics: dict, claims: list[dict], steps, n_tokens: int | None, phases: list[dict]) -> list[str]:
    """The answer first: Figure 1's finding in one sentence, then Figures 2-3 (or why they are missing), each number
    with its CI as the files hold it."""
    out = []
    kmax, bad = _k_max(metrics), degenerate(metrics, n_tokens)
    c = _claim(claims, "inference_beyond_counting")
    if c is not None:
        v, lo, hi = (float(c[x]) for x in ("value", "ci_lo", "ci_hi"))
        if c["verdict"] == "supported":
            what = f"the model infers beyond counting ({f3(v)} {_ci(lo, hi, 3)} nats/token against best counting)"
        elif hi < 0:
            what = (f"the model's CE is below best counting ({f3(v)} {_ci(lo, hi, 3)} nats/token) without an in-context "
                    f"gain: not inference beyond counting ({c['verdict']})")
        else:
            what = f"the model does not infer beyond counting ({f3(v)} {_ci(lo, hi, 3)} nats/token; {c['verdict']})"
        em = f"eval/unseen/vs/incontext_hmm/k{kmax}"
        if em in metrics and ("unseen", "incontext_hmm") not in bad:
            d, dlo, dhi = metrics[em], metrics.get(em + "_lo"), metrics.get(em + "_hi")
            if dlo is not None and dhi is not None and dlo <= 0 <= dhi:
                what += f", level with an EM-fitted HMM ({f3(d)} {_ci(dlo, dhi, 3)})"
            elif dhi is not None and dhi < 0:
                what += f", ahead of an EM-fitted HMM by {f3(-d)} {_ci(-dhi, -dlo, 3)} nats/token"
            elif dlo is not None:
                what += f", behind an EM-fitted HMM by {f3(d)} {_ci(dlo, dhi, 3)} nats/token"
        ex, rg = metrics.get("eval/seen/excess_ce"), _claim(claims, "retrieval_gap")
        if ex is not None:
            what += f"; {ex:.2f} nats/token above the mixture oracle on its own training tasks"
            if rg is not None:
                what += (f" (retrieval gap {f3(rg['value'])} {_ci(float(rg['ci_lo']), float(rg['ci_hi']), 3)}: "
                         f"{rg['verdict']})")
        out.append(f"**Figure 1 after {steps} steps** (unseen tasks, k = {kmax}): {what}.")
    for (split, ref), why in bad.items():
        out.append(f"**{WHAT.get(ref, ref)} is DEGENERATE on {split} tasks** ({why}; SCIENCE.md 9): shown below only "
                   "as such, never as a reference, an excess or a verdict.")
    ana = [c for c in claims if c.get("source") == "analysis"]
    if ana:
        tally = ", ".join(f"{sum(c['verdict'] == v for c in ana)} {v}" for v in sorted({c["verdict"] for c in ana}))
        out.append(f"**Figures 2-3**: {len(ana)} layerwise claims ({tally}): the claims table below.")
    else:
        p5 = next((p for p in phases if p["name"] == "analyze"), None)
        why = (f"phase 5 analyze {p5['status']} after {p5['seconds']} s" + (f": {p5['note']}" if p5.get("note") else "")
               if p5 else "phase 5 analyze did not run")
        out.append(f"**Figures 2-3: not measured** ({why}).")
    return out


# ---------------------------------------------------------------- report.md from the record's files


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fill_notes(phases: list[dict], root: Path) -> list[dict]:
    """A failed or cut-off phase with no note gets its log's last error line (root/<phase>/<log>)."""
    for p in phases:
        if p["status"] in ("failed", "cut off") and not p.get("note"):
            p["note"] = last_error(root / p["name"] / PHASE_LOGS.get(p["name"], f"{p['name']}.log"))
    return phases


def render_report(d: Path, name: str = "paper-once") -> Path:
    """d/report.md from the files in d (module docstring): env.txt, phases.csv (and the phases' logs), bench.json,
    plan.json, trials.csv, run.json, claims.csv."""
    run = json.loads((d / "run.json").read_text()) if (d / "run.json").exists() else {}
    metrics, params, tags = run.get("metrics", {}), run.get("params", {}), run.get("tags", {})
    n_tokens = int(params["hmm.n_tokens"]) if "hmm.n_tokens" in params else None
    claims, trials = _read_csv(d / "claims.csv"), _read_csv(d / "trials.csv")
    trial = trials[0] if trials else {}
    phases = fill_notes(_read_csv(d / "phases.csv"), d)
    bad = degenerate(metrics, n_tokens)
    L = [f"# {name}: the paper experiment in one device command", ""]
    L += [*(f"{x}\n" for x in answer(metrics, claims, trial.get("steps", "?"), n_tokens, phases))]
    code = tags.get("hmmscope.code_version", "unknown")
    L += [f"Code version: `{code}`" + (" (the device copy had no .git and none was passed in)" if code == "unknown"
                                       else ""), ""]
    if (d / "env.txt").exists():
        L += ["```", (d / "env.txt").read_text().strip(), "```", ""]
    L += ["## Phases", "", "| phase | start s | end s | seconds | rc | status | note |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in phases:
        if r["status"] in ("pending", "running"):
            r.update(status="running (this record)", end_s="", seconds="")
        L.append(f"| {r['phase']} {r['name']} | {r['start_s']} | {r['end_s']} | {r['seconds']} | {r['rc']} | {r['status']} | "
                 f"{r.get('note', '')} |")
    L.append("")
    if (d / "bench.json").exists():
        b = json.loads((d / "bench.json").read_text())
        L += [f"## Speed (phase 2: {b.get('device_name') or b.get('device')}, {b.get('shape')}, {b.get('precision')})", "",
              f"MFU denominator: {b.get('gemm_dtype')} GEMM {b.get('gemm_shape')} measured in the same run: "
              f"{b.get('gemm_rate', 0) / 1e12:.1f} TFLOP/s", "",
              "| variant | ms/step | tokens/s | MFU | one-off s | loss vs the first variant (first step, last) | error |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in b.get("rows", []):
            if r.get("error"):
                L.append(f"| {r['variant']} | | | | | | {r['error']} |")
            else:
                L.append(f"| {r['variant']} | {r['step_s'] * 1e3:.2f} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                         f"{r['compile_s']:.1f} | {r['loss_first_rel']:.1e}, {r['loss_last_rel']:.1e} | |")
        L.append("")
    if (d / "plan.json").exists():
        p = json.loads((d / "plan.json").read_text())
        L += [f"Plan: variant **{p['variant']}**, **{p['steps']} steps**: {p['formula']}"
              + ("" if p.get("meets_target") else f" (below the target {p.get('target_steps')})"), ""]
    if trial:
        L += [f"## Training run {trial['mlflow_run_id']} ({trial['status']}, stopped: {trial['stopped'] or 'no'}; regime: "
              f"{trial['regime'] or 'none'})", "",
              f"{trial['steps']} steps of train.steps {trial['train.steps']}; compiled {trial['compiled']}, attention "
              f"{trial['attention']}, {trial['precision']} on {trial['device']}; median "
              f"{sig(trial['train/tokens_per_s_median'])} "
              f"tokens/s over the logged intervals = {sig(trial['ms_per_step_median'])} ms per step", ""]
    kmax = _k_max(metrics)
    if kmax is not None:
        L += [f"## Figure 1 at k = {kmax} (test segment, CE in nats/token; model - reference paired over episodes)", "",
              "| predictor | unseen CE | seen CE | model - it, unseen [95% CI] | note |", "| --- | --- | --- | --- | --- |",
              f"| model | {sig(metrics.get('eval/unseen/test_ce'))} | {sig(metrics.get('eval/seen/test_ce'))} | | |"]
        for ref in REFERENCES:
            ce = {s: _ref_ce(metrics, s, ref) for s in ("unseen", "seen")}
            vs = f"eval/unseen/vs/{ref}/k{kmax}"
            diff = f"{sig(metrics[vs])} {_ci(metrics.get(vs + '_lo'), metrics.get(vs + '_hi'))}" if vs in metrics else ""
            note = "; ".join(f"DEGENERATE: {why}" for (s_, r_), why in bad.items() if r_ == ref)
            if ("unseen", ref) in bad:
                diff = ""
            if ce["unseen"] is None and ce["seen"] is None:
                continue
            L.append(f"| {WHAT[ref]} | {sig(ce['unseen'])} | {sig(ce['seen'])} | {diff} | {note} |")
        L.append("")
    if claims:
        L += ["## Claims", "", "| source | claim | value | 95% CI | verdict | rule |", "| --- | --- | --- | --- | --- | --- |"]
        for c in claims:
            L.append(f"| {c['source']} | {c.get('claim')} | {sig(c.get('value'))} | {_ci(c.get('ci_lo'), c.get('ci_hi'))} | "
                     f"{c.get('verdict')} | {c.get('rule', '')} |")
        L.append("")
    if metrics:
        L += [f"## Metrics of the training run ({len(metrics)} keys; a key's _lo / _hi are its CI)", "",
              "| name | value | 95% CI | unit | note |", "| --- | --- | --- | --- | --- |"]
        for r in metric_rows({k: v for k, v in metrics.items()
                              if k.startswith(("eval/", "baseline/", "oracle/", "val/", "train/wall", "train/eval"))}):
            L.append(f"| {r['name']} | {sig(r['value'])} | {_ci(r['lo'], r['hi'])} | {r['unit']} | "
                     f"{'DEGENERATE reference' if _bad_row(r['name'], bad) else ''} |")
        L.append("")
    (d / "report.md").write_text("\n".join(L) + "\n")
    return d / "report.md"


# ---------------------------------------------------------------- phase 6: the record (the venv's python: MLflow)


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
    for f in ("session.json", "bench/bench.json", "train/plan.json", "setup/env.txt"):
        if (rec / f).exists():
            shutil.copy(rec / f, out / Path(f).name)
    phases = fill_notes(_read_csv(rec / "phases.csv"), rec)
    if phases:
        with open(out / "phases.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(phases[0]))
            w.writeheader()
            w.writerows(phases)
    for png in sorted(rec.glob("*/**/*.png")):  # Figures 1-3 (the --out folders) and the emergence curves (artifacts)
        if out not in png.parents:
            shutil.copy(png, out / "figures" / png.name)
    claims, row = [], {}
    if args.run:
        c = tracking.client(uri)
        ana = c.search_runs([c.get_run(args.run).info.experiment_id], f"tags.mlflow.parentRunId = '{args.run}'",
                            order_by=["attributes.start_time DESC"])
        ana = [a for a in ana if a.data.tags.get("hmmscope.kind") == "analysis" and a.info.status == "FINISHED"]
        code = getattr(args, "code_version", None)
        for rid in [args.run, *(a.info.run_id for a in ana)]:  # the device copy has no .git: the commit passed in
            if code and code != "unknown" and c.get_run(rid).data.tags.get("hmmscope.code_version", "unknown") == "unknown":
                c.set_tag(rid, "hmmscope.code_version", code)
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
        row["analysis_run_id"] = ana[0].info.run_id if ana else None
        if ana:
            claims += _claims_rows(uri, ana[0].info.run_id, "analysis")
    if claims:
        cols = ["source", "run_id", *[k for k in claims[0] if k not in ("source", "run_id")]]
        with open(out / "claims.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(claims)
    if row:
        with open(out / "trials.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            w.writeheader()
            w.writerow(row)
    render_report(out, args.name)
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


def collect(src: Path, dest: Path, code_version: str | None = None, name: str = "paper-once") -> list[Path]:
    """The archives of one command (the device tool's files_at folder) into dest (e.g.
    analysis/results/paper-gpu-figures/): each phase's logs and small files under dest/<phase>/, the record's report,
    claims, curves, trials, phases, bench and plan files at the top, its figures under dest/figures/; console.txt
    beside them. Left out: the databases and the store (not kept in the repository; keep the archives beside the
    checkout). Works on any subset of archives (a command cut off). Then report.md is rendered again from the files
    (`render_report`), with `code_version` set in run.json where it reads "unknown" (the device copy had no .git)."""
    import tarfile
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
    last = sorted(src.glob("*.tar.gz"))
    if last:  # the phases as the last archive had them (the record's own copy was written while it ran)
        with tarfile.open(last[-1]) as t:
            m = next((m for m in t.getmembers() if m.name.endswith("/phases.csv") and m.name.count("/") == 2), None)
            if m is not None:
                (dest / "phases.csv").write_bytes(t.extractfile(m).read())
    if (dest / "run.json").exists() and code_version:
        run = json.loads((dest / "run.json").read_text())
        if run.get("tags", {}).get("hmmscope.code_version", "unknown") == "unknown":
            run.setdefault("tags", {})["hmmscope.code_version"] = code_version
            (dest / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True))
    if (dest / "phases.csv").exists():
        render_report(dest, name)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"collect: {len(written)} files into {dest} ({size / 2**20:.1f} MiB in all)")
    return written
