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

From a record's kept per-run tables (no store; issue 26), under the current claim definitions:

    python analysis/regime_layerwise.py --from-runs analysis/results/regime-layerwise-cpu/runs \
        --trials analysis/results/regime-layerwise-cpu/trials.csv --spec sweeps/task-diversity-cpu.toml \
        --n-episodes 256 --out analysis/results/regime-layerwise-cpu

reads runs/<trial>-<run id8>/ (the tables `hmmscope analyze --out` wrote), matches each to its trial in the sweep's
trials.csv, recomputes the claims whose definitions changed (analysis/layerwise_runs.py: the state-before-task area
over layers 1..L and the embedding's own row; the k-back excess over the token statistics, on probe episodes
rebuilt from --spec and checked against the logged baselines) and pools every claim per cell through the same
report code. --n-episodes, --probe-tasks, --min-per-task and --seed are the analyses' own settings (`hmmscope
analyze` defaults but --n-episodes). Writes, besides the files above, kback_token_stats.csv (per run and k: best
accuracy, the (task, o_t) baseline recomputed and as logged, the token statistics, the excess),
state_before_task_runs.csv (per run: the logged area over layers 0..L, the area over 1..L, the embedding's row)
and token_recurrence.csv (the family's exact P(o_(t+1) = o_(t-k)), k = 0..5: over 512 tasks of the family and
over each cell's probed tasks, in the test segment and at stationarity).

The package never imports this folder.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from claim_figures import claims_figure
from layerwise_runs import RunsError, read_trials, run_dirs, run_row, token_recurrence
from records_io import Outputs, RecordError, check_out
from sweepdata import table_csv

os.environ.setdefault("MPLBACKEND", "Agg")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep", help="sweep (study) name: read the analysis runs from its store")
    src.add_argument("--from-runs", type=Path, help="a record's runs/ folder of per-run analysis tables (no store)")
    p.add_argument("--cells", default=None, help="comma-separated hmm.n_tasks values, one regime each (required with "
                   "--sweep; with --from-runs, default: every cell found)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: hmmscope's, sqlite under ./mlruns)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: beside the MLflow store)")
    p.add_argument("--trials", type=Path, default=None, help="--from-runs: the sweep's trials.csv (run ids, seeds)")
    p.add_argument("--spec", type=Path, default=None, help="--from-runs: the sweep's spec (rebuilds the probe episodes)")
    p.add_argument("--n-episodes", type=int, default=None, help="--from-runs: the analyses' --n-episodes (default: "
                   "the spec's data.n_eval, as hmmscope analyze)")
    p.add_argument("--probe-tasks", type=int, default=32, help="--from-runs: the analyses' probe tasks (default 32)")
    p.add_argument("--min-per-task", type=int, default=30, help="--from-runs: episodes per probed task at least (30)")
    p.add_argument("--seed", type=int, default=0, help="--from-runs: the analyses' seed (default 0)")
    p.add_argument("--out", type=Path, required=True, help="folder for the tables and figures")
    p.add_argument("--no-figures", action="store_true", help="the tables only (the per-cell claim figures take most "
                   "of the time)")
    args = p.parse_args(argv)
    try:
        cells = [int(x) for x in (args.cells or "").split(",") if x.strip()]
    except ValueError:
        print(f"error: --cells: expected comma-separated integers, got {args.cells!r}", file=sys.stderr)
        return 2
    if args.from_runs is not None:
        return _from_runs(args, cells)
    if not cells:
        print("error: --cells is required with --sweep", file=sys.stderr)
        return 2

    from hmmscope import tracking
    from hmmscope.report.read import find_parent, is_theory, read_sweep_trials, training_frame

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        parent, study, _ = find_parent(uri, args.sweep, args.storage)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = read_sweep_trials(uri, parent, study)
    df = training_frame([r for r in t.complete if not is_theory(r)], t.children, t.analysis, uri)
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
    runs = {n: "Runs (training / analysis): " + ", ".join(f"{a[:8]} / {b[:8]}" for a, b in zip(sub["run_id"],
                                                                                          sub["analysis_id"]))
            for n, sub in subs.items()}
    outs = Outputs(args.out)
    plots = _pool(subs, runs, args.sweep, outs, "")
    return _write(outs, plots, not args.no_figures)


def _from_runs(args, cells: list[int]) -> int:
    """The --from-runs mode (module docstring): checks everything, computes every row, then writes."""
    import pandas as pd

    from hmmscope.config import ConfigError
    from hmmscope.data.episodes import probe_tasks
    from hmmscope.sweep.spec import load_spec

    try:
        check_out(args.out)
        if args.trials is None or args.spec is None:
            raise RunsError("--from-runs needs --trials (the sweep's trials.csv) and --spec (its spec)")
        try:
            spec = load_spec(args.spec)
        except (OSError, ConfigError) as e:
            raise RunsError(f"--spec {str(args.spec)!r}: {e}") from None
        n_ep = args.n_episodes or spec.trial_config({"seed": 0}).data.n_eval
        dirs = run_dirs(args.from_runs, read_trials(args.trials))
        if cells:
            dirs = [(d, t) for d, t in dirs if int(float(t["hmm.n_tasks"])) in cells]
            found = {int(float(t["hmm.n_tasks"])) for _, t in dirs}
            if set(cells) - found:
                raise RunsError(f"no run folder with hmm.n_tasks = {', '.join(map(str, sorted(set(cells) - found)))}")
        out = [run_row(d, t, spec, n_episodes=n_ep, probe_tasks=args.probe_tasks, min_per_task=args.min_per_task,
                       seed=args.seed) for d, t in dirs]
    except RecordError as e:  # RunsError too
        print(f"error: {e}", file=sys.stderr)
        return 2
    df = pd.DataFrame([r[0] for r in out])
    cells = cells or sorted({int(x) for x in df["param:hmm.n_tasks"]})
    subs = {n: df[df["param:hmm.n_tasks"] == n].sort_values("param:train.seed").reset_index(drop=True) for n in cells}
    runs = {n: "Runs (training run id8, from the record's run folders): " + ", ".join(sub["run_folder"])
            for n, sub in subs.items()}
    note = ("Pooled from the record's kept per-run tables (analysis/regime_layerwise.py --from-runs) under the current "
            "claim definitions (issue 26): state_before_task (the area over layers 1..L), state_before_task_layer0, "
            "kback*_beats_token_stats and kback_acc_falls_with_k (on the excess over the token statistics) are "
            "recomputed per run as values only (the per-episode hits a per-run CI needs are not kept: '-' in the "
            "per-run verdicts); every other claim is each run's logged row.")
    outs = Outputs(args.out)
    plots = _pool(subs, runs, spec.name, outs, note)
    outs.table([k for r in out for k in r[1]], "kback_token_stats")
    outs.table([r[2] for r in out], "state_before_task_runs")
    rec = []
    for label, kw in (("family: 512 tasks (hmm.seed's training stream), test segment", {"n_tasks": 512}),
                      ("family: 512 tasks, stationary", {"n_tasks": 512, "stationary": True})):
        rec.append({"tasks": label, **dict(zip((f"k{k}" for k in range(6)), token_recurrence(spec, **kw)))})
    for n in cells:
        for s in sorted({str(x) for x in subs[n]["param:train.seed"]}, key=int):
            cfg = spec.trial_config({"hmm.n_tasks": n, "seed": int(s)})
            tasks = probe_tasks(n, min(args.probe_tasks, n), cfg.data.seed)
            rec.append({"tasks": f"n_tasks = {n}: the {len(tasks)} probed tasks of seed {s}, test segment",
                        **dict(zip((f"k{k}" for k in range(6)), token_recurrence(spec, n, tasks=tasks)))})
    outs.table(rec, "token_recurrence")
    return _write(outs, plots, not args.no_figures)


def _write(outs: Outputs, plots: list, plot: bool) -> int:
    """Every table computed: write them together (records_io.Outputs, each atomically), then the figures."""
    try:
        outs.write()
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if plot:
        for claims, sub, stem in plots:
            claims_figure(claims, sub, outs.out / stem)
    return 0


def _pool(subs: dict, runs: dict, sweep: str, outs: Outputs, note: str) -> list:
    """Pool each cell's runs through the report's layerwise section: the md, csv and json into `outs` (written later,
    with the rest), lines printed; returns the figures to draw once written, (claims, runs, stem) per cell."""
    from hmmscope.report.layerwise import layerwise_section
    from hmmscope.report.render import render_md
    from hmmscope.stats import jsonable

    sections, rows, plots = [], [], []
    for n, sub in subs.items():
        figs: dict = {}
        sec, claims = layerwise_section(sub, None, figs)
        seeds = sorted(sub["param:train.seed"].astype(int))
        sec.title = f"n_tasks = {n}: layerwise claims pooled over {len(sub)} runs (seeds {seeds})"
        if "metric:eval/retrieval_gap" in sub:
            gap = sub["metric:eval/retrieval_gap"].astype(float)
            what = "Retrieval gap of these runs (eval/retrieval_gap): " + ", ".join(f"{g:.3f}" for g in gap)
        else:  # fresh tasks (n_tasks = 0): no seen tasks, no retrieval gap; the regime is read off best counting
            vs = sub["metric:eval/unseen/vs_best_counting"].astype(float)
            what = ("Fresh tasks (no seen tasks, no retrieval gap); model - best counting on unseen tasks "
                    "(eval/unseen/vs_best_counting): " + ", ".join(f"{g:.3f}" for g in vs))
        sec.blocks.insert(0, ("p", runs[n] + ". " + what + "." + (f" {note}" if note else "")))
        sections.append(sec)
        plots.append((claims, sub, f"layerwise_claims_n{n}"))
        for c in claims:
            name = c.name[len("pooled: "):]
            per_run = [str(v) for v in sub.get(f"verdict:{name}", [])]
            vals = sub[f"metric:claim/{name}/value"].astype(float)
            rows.append({"n_tasks": n, "claim": name, "value": c.value, "ci_lo": c.ci_lo, "ci_hi": c.ci_hi,
                         "df": c.df, "rule": c.rule, "verdict": c.verdict, "n_runs": int(vals.notna().sum()),
                         "per_run_values": ";".join(f"{v:.4g}" for v in vals),
                         "per_run_verdicts": ";".join(per_run), "statistic": c.statistic, "reason": c.reason})
    md = render_md(f"Layerwise claims per regime: sweep {sweep}, n_tasks {', '.join(map(str, subs))}", sections)
    outs.text("regime_layerwise.md", md)
    outs.text("regime_layerwise_claims.csv", table_csv(rows))
    outs.text("regime_layerwise_claims.json", json.dumps(jsonable(rows), indent=2))
    width = max(len(r["claim"]) for r in rows)
    for r in rows:
        print(f"n_tasks {r['n_tasks']:>5}  {r['claim']:<{width}}  {r['value']:+.4f} [{r['ci_lo']:+.4f}, {r['ci_hi']:+.4f}]"
              f"  {r['rule']:<20} {r['verdict']}  (runs: {r['per_run_verdicts']})")
    return plots


if __name__ == "__main__":
    raise SystemExit(main())
