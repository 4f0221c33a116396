"""Layerwise claims per regime (issue 18.6): do the paper's layerwise claims (Figure 2's shuffle test, Figure 3a's
state-before-task probes, Figure 3b's k-back probes; SCIENCE.md 6) hold in a retrieval-regime cell and in a
no-retrieval cell of the task-diversity map?

    python analysis/regime_layerwise.py --sweep task-diversity-cpu --cells 4,8192 \\
        --tracking-uri sqlite:///mlruns/td/mlflow.db --storage sqlite:///mlruns/td/optuna.db \\
        --out analysis/results/regime-layerwise-cpu

Reads the sweep's COMPLETE training trials and each one's analysis run (the one its trial recorded, else the
newest FINISHED `analysis` child, e.g. from `hmmscope analyze RUN_ID` after the sweep), keeps the trials whose
hmm.n_tasks is in --cells, and pools each logged claim per cell exactly as `hmmscope report` pools a sweep's
layerwise claims (hmmscope.report.layerwise): the mean over seeds of each seed's value, a t interval on G - 1 df
over the seeds (the seed is the unit), and the claim's own logged rule applied to that interval by stats.decide
(through stats.claim); the same code path as the report, only split by cell. Writes, under --out:
regime_layerwise.md (one section per cell: pooled claims, per-run values), regime_layerwise_claims.csv and
regime_layerwise_claims.json (one row per cell x claim) and layerwise_claims_n<N>.png/.pdf per cell.

The package never imports this folder.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="sweep (study) name")
    p.add_argument("--cells", required=True, help="comma-separated hmm.n_tasks values, one regime each")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: hmmscope's, sqlite under ./mlruns)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: beside the MLflow store)")
    p.add_argument("--out", type=Path, required=True, help="folder for the tables and figures")
    args = p.parse_args(argv)
    try:
        cells = [int(x) for x in args.cells.split(",") if x.strip()]
    except ValueError:
        print(f"error: --cells: expected comma-separated integers, got {args.cells!r}", file=sys.stderr)
        return 2

    from hmmscope import tracking
    from hmmscope.report.layerwise import _layerwise_section
    from hmmscope.report.read import _find_parent, _is_theory, _read_trials, _training_frame
    from hmmscope.report.render import render_md
    from hmmscope.stats import jsonable

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        parent, study, _ = _find_parent(uri, args.sweep, args.storage)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = _read_trials(uri, parent, study)
    df = _training_frame([r for r in t.complete if not _is_theory(r)], t.children, t.analysis, uri)
    if "analysis_id" not in df.columns:
        print(f"error: sweep {args.sweep!r} has no analysis runs (run `hmmscope analyze RUN_ID` on its trials)",
              file=sys.stderr)
        return 2
    ccols = [c for c in df.columns if c.startswith("metric:claim/") and c.endswith("/value")]
    done = df[ccols].notna().any(axis=1)  # an analysis run still running (or failed early) has no claims yet
    subs = {n: df[(df["param:hmm.n_tasks"] == n) & df["analysis_id"].notna() & done].reset_index(drop=True)
            for n in cells}
    missing = [n for n, sub in subs.items() if sub.empty]
    if missing:  # checked before anything is written
        print(f"error: no analyzed trial with hmm.n_tasks = {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    sections, rows = [], []
    for n, sub in subs.items():
        gap = sub["metric:eval/retrieval_gap"].astype(float)
        figs: dict = {}
        sec, claims = _layerwise_section(sub, None, figs)
        seeds = sorted(sub["param:train.seed"].astype(int))
        sec.title = f"n_tasks = {n}: layerwise claims pooled over {len(sub)} runs (seeds {seeds})"
        sec.blocks.insert(0, ("p", "Runs (training / analysis): "
                                   + ", ".join(f"{a[:8]} / {b[:8]}" for a, b in zip(sub["run_id"], sub["analysis_id"]))
                                   + ". Retrieval gap of these runs (eval/retrieval_gap): "
                                   + ", ".join(f"{g:.3f}" for g in gap) + "."))
        sections.append(sec)
        _plot(claims, sub, args.out / f"layerwise_claims_n{n}")
        for c in claims:
            name = c.name[len("pooled: "):]
            per_run = [str(v) for v in sub.get(f"verdict:{name}", [])]
            vals = sub[f"metric:claim/{name}/value"].astype(float)
            rows.append({"n_tasks": n, "claim": name, "value": c.value, "ci_lo": c.ci_lo, "ci_hi": c.ci_hi,
                         "df": c.df, "rule": c.rule, "verdict": c.verdict, "n_runs": int(vals.notna().sum()),
                         "per_run_values": ";".join(f"{v:.4g}" for v in vals),
                         "per_run_verdicts": ";".join(per_run), "statistic": c.statistic, "reason": c.reason})
    md = render_md(f"Layerwise claims per regime: sweep {args.sweep}, n_tasks {', '.join(map(str, cells))}", sections)
    (args.out / "regime_layerwise.md").write_text(md)
    with open(args.out / "regime_layerwise_claims.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (args.out / "regime_layerwise_claims.json").write_text(json.dumps(jsonable(rows), indent=2))
    width = max(len(r["claim"]) for r in rows)
    for r in rows:
        print(f"n_tasks {r['n_tasks']:>5}  {r['claim']:<{width}}  {r['value']:+.4f} [{r['ci_lo']:+.4f}, {r['ci_hi']:+.4f}]"
              f"  {r['rule']:<20} {r['verdict']}  (runs: {r['per_run_verdicts']})")
    print(f"tables: {args.out / 'regime_layerwise.md'}, {args.out / 'regime_layerwise_claims.csv'}")
    return 0


def _plot(claims, sub, stem: Path) -> None:
    """One row per claim: each seed's value (dots) and the pooled mean with its 95% CI, coloured by verdict,
    on the claim's own scale (a panel per claim, so no rescaling hides a sign)."""
    import math

    from matplotlib.figure import Figure

    colours = {"supported": "C2", "not supported": "C3", "inconclusive": "C7", "no power": "C4"}
    fig = Figure(figsize=(7.5, 0.55 * len(claims) + 1.2), layout="constrained")
    axes = fig.subplots(len(claims), 1, squeeze=False)[:, 0]
    for ax, c in zip(axes, claims):
        name = c.name[len("pooled: "):]
        vals = sub[f"metric:claim/{name}/value"].astype(float).dropna()
        ax.plot(vals, [0] * len(vals), ".", color="gray", alpha=0.7)
        col = colours.get(c.verdict, "k")
        if math.isfinite(c.ci_lo) and math.isfinite(c.ci_hi):
            ax.plot([c.ci_lo, c.ci_hi], [0, 0], "-", color=col, lw=2)
        ax.plot([c.value], [0], "o", color=col)
        ax.axvline(0, color="gray", ls=":", lw=0.8)
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(c.verdict, fontsize=7, loc="right", color=col, pad=1)
    fig.suptitle(f"{stem.name}: seeds (grey), pooled mean with 95% t CI over seeds (colour: verdict)", fontsize=8)
    for ext in ("png", "pdf"):
        fig.savefig(f"{stem}.{ext}", dpi=130)
        print(f"figure: {stem}.{ext}")


if __name__ == "__main__":
    raise SystemExit(main())
